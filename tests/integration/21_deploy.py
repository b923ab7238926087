"""The deployable artefacts work: conf/kubernetes/ (a kustomize base, the
overlays central and node-local, the optional component servicemonitor),
conf/kwc.service, the Dockerfile and `make image`.

  1. Manifests: `kubectl kustomize` of each overlay (with and without the
     ServiceMonitor component) with every kubectl installed side by side
     (1.27-1.33), the same objects from each, and `kubectl apply -k
     --dry-run=client` of each overlay. Every version insists on a server
     even with --dry-run=client: it maps kinds to resources through
     discovery, and apply GETs the live object to decide between create and
     patch. So kubectl talks to a stub here that serves discovery for the
     kinds the manifests use (kube's real group/version/resource/kind
     table, below) and 404 for every object; it serves no OpenAPI document
     (none is on this machine), hence --validate=false. Then
     `kubectl apply --dry-run=server` of each rendered overlay against
     apisim (the namespaces and the operator's ServiceMonitor CRD created
     first, as kube's NamespaceLifecycle admission wants them), which must
     accept every object and store none. The field check kubectl would have
     made is done against python3-kubernetes's models (the API types,
     independent of kwc and of these files): no unknown field, the right
     JSON types, required fields present; the ServiceMonitor, which has no
     model there, is checked against what the operator reads of it.
  2. The manifests agree with kwc and with each other: every flag is one
     `kwc --help` knows, the probes are kwc's /livez and /readyz over HTTPS,
     every container runs as Pod Security "restricted" wants (non-root,
     RuntimeDefault seccomp, every capability dropped, no privilege
     escalation, read-only root; the node-local tier's chown init container
     the one documented exception), requests on every container, the
     memory request above the sizing formula's floor, availability (at
     least 2 replicas, a rolling update that never takes both down, a
     PodDisruptionBudget selecting the pods, topology spread over nodes and
     zones, terminationGracePeriodSeconds above kwc's shutdown delay +
     drain from the rendered args, no preStop hook), the NetworkPolicy
     (kwc's port in, the API server or the central tier and DNS out), the
     ServiceMonitor, --cache-map-size within the volume, the Service, PVC,
     Secret and ServiceAccount names line up, the client kubeconfig names
     the Service; kwc's ClusterRole lists and watches everything and never
     gets, and the narrowed alternative in its comment grants exactly the
     --resources list that comment gives.
  3. The RBAC is exactly what kwc calls: apisim --policy gets the
     ClusterRole's rules, one per group/resource/verb ("*" kept as a
     wildcard, as RBAC and apisim read it), for the bound ServiceAccount;
     kwc runs with the central StatefulSet's args as rendered (--resources
     auto, the default; ports and paths adapted) in a pod-like sandbox: a
     private mount namespace with the service account token and CA at
     /var/run/secrets/kubernetes.io/serviceaccount and
     KUBERNETES_SERVICE_HOST/PORT (in-cluster credentials), the root
     filesystem read-only, only the volumes writable, uid 10001 without
     capabilities and with no_new_privs. /readyz must answer 200 (probed
     like the kubelet: HTTPS, no credentials); the protobuf caches kwc
     starts once discovery answers must each list and watch upstream; a
     caller with a bearer token lists pods, a custom resource (widgets) and
     secrets at resourceVersion=0 (TokenReview + SubjectAccessReview): each
     list starts its cache, waits for its first sync and is answered from
     it, not passed upstream, and each new cache watches upstream; writes
     pass through impersonating the caller (a user with uid, groups and
     extras; a service account) and kubectl works with the example client
     kubeconfig; what kwc asked upstream as itself and as whom it
     impersonated must be exactly what the rules grant, and every rule is
     used. Then each single rule is removed in turn and something must
     fail; without the list (or watch) rule every cache must fail, those
     kwc starts itself and those the caller's lists start (apisim's
     request log shows each LIST or WATCH refused). What base/rbac.yaml's
     comment shows runs too: its --resources-exclude (secrets out) under the
     rules as they are, and its narrowed alternative (an explicit
     --resources and its rules only); in both kwc never lists secrets and
     the caller's list of them passes through as the caller. The node-local
     DaemonSet runs the same way (its init container's chown included) in
     front of a central kwc run as the StatefulSet runs it, through the
     kubeconfig of its ConfigMap: a caller reads and writes through it, and
     the API server never sees the node-local kwc's own identity.
  4. conf/kwc.service: `systemd-analyze verify` (on a copy whose ExecStart
     names the kwc under test), `systemd-analyze security --offline`, and
     the ExecStart command line run with its specifiers (%d credentials,
     %S state, %E configuration) pointing at temporary directories, as an
     unprivileged user on a read-only root, against apisim.
  5. The Dockerfile: every COPY source is in the build context
     (.dockerignore applied) and that context builds kwc (`make -n`), the
     runtime stage's packages provide every library `ldd kwc` lists and
     each provides one kwc links, USER is numeric and not root, ENTRYPOINT
     and CMD flags are ones `kwc --help` knows, the image is labelled
     Apache-2.0 (OCI) and carries the LICENSE file; `make image` runs the
     container tool with the Dockerfile and the manifests' image name.

     The image build itself is `make image-test` (tests/image/test_image.py,
     part of make test): it takes a minute or more, so not here. On this
     machine it needs three workarounds, which that test applies: no
     container registry is reachable (DNS resolves the Debian mirror only),
     so the bookworm base images are bootstrapped from Debian's packages;
     Debian's podman 4.3 with its default crun cannot start containers on
     this kernel's hybrid cgroup v1/v2 layout ("cgroups in hybrid mode not
     supported"), so it uses runc; and runc fails to raise RLIMIT_NOFILE/
     NPROC above the sandbox's hard limits, so --ulimit is lowered.

Needs root (mount namespaces, as 15_/16_ need tmpfs) and the packages of
tests/lib/deps.sh test (python3-yaml, python3-kubernetes, systemd,
util-linux, openssl).
"""
import concurrent.futures
import copy
import http.server
import json
import os
import re
import shlex
import shutil
import ssl
import stat
import subprocess
import tempfile
import threading
import unittest
import urllib.parse

import yaml

import certs
from cluster import APISIM, KWC_BIN, PYTHON, ROOT, Fatal, Proc, kubectl_dir, only_in_plaintext_run, wait_for

K8S = os.path.join(ROOT, "conf", "kubernetes")
RBAC = os.path.join(K8S, "base", "rbac.yaml")
TIERS = ("central", "node-local")  # conf/kubernetes/overlays/*
COMPONENT = os.path.join(K8S, "components", "servicemonitor")
CLIENT_KUBECONFIG = os.path.join(K8S, "clients", "client-kubeconfig.example.yaml")
UNIT = os.path.join(ROOT, "conf", "kwc.service")
DOCKERFILE = os.path.join(ROOT, "Dockerfile")
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
POD_UID = 10001  # the Dockerfile's USER, the manifests' runAsUser
P = certs.pki()


# ---- reading the artefacts ----------------------------------------------

def load_docs(*paths):
    docs = []
    for p in paths:
        with open(p) as f:
            docs += [d for d in yaml.safe_load_all(f) if d]
    return docs


def find(docs, kind, name=None, namespace=None):
    out = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name) and
           (namespace is None or d["metadata"].get("namespace") == namespace)]
    if not out:
        raise AssertionError("no %s %s in the manifests" % (kind, name or ""))
    return out[0]


def kustomization_with_component(tier, d):
    """A kustomization in d: the overlay's own, its paths made relative to
    d, the ServiceMonitor component switched on (what its commented
    components: line does)."""
    src = os.path.join(K8S, "overlays", tier)
    with open(os.path.join(src, "kustomization.yaml")) as f:
        text = f.read()
    assert "# - ../../components/servicemonitor" in text, "the overlay shows how to switch the component on"
    k = yaml.safe_load(text)
    k["resources"] = [os.path.relpath(os.path.join(src, r), d) for r in k["resources"]]
    k["components"] = [os.path.relpath(COMPONENT, d)]
    with open(os.path.join(d, "kustomization.yaml"), "w") as f:
        yaml.safe_dump(k, f)


_RENDERED = {}


def kustomize(tier, component=False, binary="kubectl"):
    """`kubectl kustomize` of an overlay (with the ServiceMonitor component):
    its YAML text."""
    key = (tier, component, binary)
    if key not in _RENDERED:
        with tempfile.TemporaryDirectory(prefix="kwc-kustomize-") as d:
            if component:
                kustomization_with_component(tier, d)
                cmd = [binary, "kustomize", "--load-restrictor", "LoadRestrictionsNone", d]
            else:
                cmd = [binary, "kustomize", os.path.join(K8S, "overlays", tier)]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ, HOME=d))
        assert r.returncode == 0, "%s: %s" % (" ".join(cmd), r.stderr)
        _RENDERED[key] = r.stdout
    return _RENDERED[key]


def render(*tiers, component=False):
    """The objects of the overlays, as kubectl kustomize renders them."""
    docs = []
    for t in tiers:
        docs += [d for d in yaml.safe_load_all(kustomize(t, component)) if d]
    return copy.deepcopy(docs)


def kwc_help():
    r = subprocess.run([KWC_BIN, "--help"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    return r.stdout


def kwc_flags():
    """{flag: default or None} from `kwc --help` (pflag's layout: a flag's
    line "      --name type   text", its text continued on indented lines,
    "(default X)" at its end; a string's default quoted, a list's in [])."""
    flags, cur, text = {}, None, []

    def done():
        if cur:
            m = re.search(r"\(default (.*)\)$", " ".join(text))
            flags[cur] = m.group(1).strip('"[]') if m else None

    for line in kwc_help().splitlines():
        m = re.match(r"^  (?:-h, |    )(--[a-z0-9-]+)(?: [a-z]+)?\s+(.*)$", line)
        if m:
            done()
            cur, text = m.group(1), [m.group(2)]
        elif cur and line.startswith(" "):
            text.append(line.strip())
        else:
            done()
            cur, text = None, []
    done()
    return flags


def split_args(args):
    """[(flag, value or None)] of a kwc argument list (--flag=value or --flag value)."""
    out, i = [], 0
    boolean = {"--insecure-allow-remote", "--anonymous-auth", "--access-log", "--serve-discovery", "--help",
               "--version"}
    while i < len(args):
        a = args[i]
        if "=" in a:
            f, v = a.split("=", 1)
            out.append((f, v))
        elif a in boolean:
            out.append((a, None))
        else:
            out.append((a, args[i + 1] if i + 1 < len(args) else None))
            i += 1
        i += 1
    return out


def kinds_define(name):
    """The string a #define of include/kwc/kinds.h spells (joined literals)."""
    with open(os.path.join(ROOT, "include", "kwc", "kinds.h")) as f:
        text = f.read()
    m = re.search(r"#define %s((?:.*\\\n)*.*)" % name, text)
    return "".join(re.findall(r'"([^"]*)"', m.group(1)))


def parse_gvrs(text):
    """[(group, version, resource)] of a --resources style list (v1/pods,
    apps/v1/deployments; a bare name: group and version None)."""
    out = []
    for item in text.split(","):
        parts = item.strip().split("/")
        if len(parts) == 1:
            out.append((None, None, parts[0]))
        elif len(parts) == 2:
            out.append(("", parts[0], parts[1]))
        else:
            out.append((parts[0], parts[1], parts[2]))
    return out


def protobuf_names(args):
    """The resource names whose protobuf caches start with kwc
    (--protobuf-resources; default KINDS_PB_DEFAULT)."""
    text = dict(args).get("--protobuf-resources") or kinds_define("KINDS_PB_DEFAULT")
    return set() if text == "none" else {r for _, _, r in parse_gvrs(text)}


def exclusions(args):
    """--resources-exclude (default KINDS_EXCLUDE_DEFAULT) as kwc reads it
    (catalog.c parse_pattern): [(group, version, resource)], "*" any."""
    a = dict(args)
    text = a["--resources-exclude"] if "--resources-exclude" in a else kinds_define("KINDS_EXCLUDE_DEFAULT")
    out = []
    for item in filter(None, text.split(",")):
        parts = item.split("/")
        if len(parts) == 3:
            out.append(tuple(parts))
        elif len(parts) == 2:
            out.append(("*" if parts[0] == "*" else "", parts[0], parts[1]))
        else:
            out.append(("*", "*", parts[0]))
    return out


def excluded(patterns, g, v, r):
    return any(all(p == "*" or p == x for p, x in zip(pat, (g, v, r))) for pat in patterns)


def builtin_group(g):
    """kinds_builtin_group: the groups kwc keeps protobuf caches of."""
    return g == "" or "." not in g or g.endswith(".k8s.io")


def narrowed_example():
    """base/rbac.yaml's commented alternative to the wildcard rule: ([(group,
    version, resource)] of its --resources, [its rules])."""
    with open(RBAC) as f:
        comment = [l[2:] if l.startswith("# ") else l[1:] for l in f.read().splitlines() if l.startswith("#")]
    (line,) = [l.strip() for l in comment if l.strip().startswith("- --resources=")]
    resources = parse_gvrs(line[len("- --resources="):])
    i = next(n for n, l in enumerate(comment) if l.startswith("- apiGroups:"))
    block = []
    for l in comment[i:]:
        if not l.startswith(("- ", "  ")):
            break
        block.append(l)
    return resources, yaml.safe_load("\n".join(block))


def exclude_example():
    """The --resources-exclude base/rbac.yaml's comment shows (secrets out)."""
    with open(RBAC) as f:
        (line,) = [l[1:].strip() for l in f.read().splitlines() if l.startswith("#") and "--resources-exclude=" in l]
    return line.split("=", 1)[1]


def quantity(q):
    """Bytes of a Kubernetes memory/storage quantity."""
    m = re.match(r"^([0-9.]+)([KMGTE]i?)?$", str(q))
    units = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
             "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    return int(float(m.group(1)) * units[m.group(2)])


def workload_volumes(w):
    """{volume name: volume} of a workload's pods, a StatefulSet's claim
    templates as {"claimTemplate": template}."""
    vols = {v["name"]: v for v in w["spec"]["template"]["spec"].get("volumes", [])}
    for t in w["spec"].get("volumeClaimTemplates", []):
        vols[t["metadata"]["name"]] = {"name": t["metadata"]["name"], "claimTemplate": t}
    return vols


def go_duration(text):
    """Seconds of a Go duration (10s, 1m30s, 500ms) or a bare number of seconds."""
    if re.match(r"^\d+(\.\d+)?$", text):
        return float(text)
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)", text)
    assert parts and "".join(a + b for a, b in parts) == text, "not a duration: %r" % text
    return sum(float(a) * units[b] for a, b in parts)


def shutdown_seconds(args):
    """(delay, drain, whether kwc has a shutdown delay) in seconds: the
    workload's --shutdown-delay-duration and drain flag (whatever name kwc
    gives it: --shutdown-drain-seconds, a -duration form), else their
    defaults from kwc --help."""
    flags = kwc_flags()
    a = dict(args)
    out = []
    for what in ("delay", "drain"):
        names = [f for f in flags if re.match(r"^--shutdown-%s(-duration|-seconds|-grace-period)?$" % what, f)]
        if not names:
            out.append(0.0)
            continue
        v = a.get(names[0], flags[names[0]])
        out.append(go_duration(v) if v else 0.0)
    return out[0], out[1], any(re.match(r"^--shutdown-delay", f) for f in flags)


def workload_container(w):
    c = [c for c in w["spec"]["template"]["spec"]["containers"] if c["name"] == "kwc"]
    assert c, "no container kwc in %s" % w["metadata"]["name"]
    return c[0]


# ---- 1. kubectl against a discovery stub --------------------------------

# kube's real mapping (group, version) -> [(resource, kind, namespaced)] for
# the kinds the manifests use (and their neighbours)
DISCOVERY = {
    ("", "v1"): [("namespaces", "Namespace", False), ("serviceaccounts", "ServiceAccount", True),
                 ("services", "Service", True), ("secrets", "Secret", True), ("configmaps", "ConfigMap", True),
                 ("persistentvolumeclaims", "PersistentVolumeClaim", True), ("pods", "Pod", True)],
    ("apps", "v1"): [("deployments", "Deployment", True), ("daemonsets", "DaemonSet", True),
                     ("statefulsets", "StatefulSet", True), ("replicasets", "ReplicaSet", True)],
    ("rbac.authorization.k8s.io", "v1"): [("clusterroles", "ClusterRole", False),
                                          ("clusterrolebindings", "ClusterRoleBinding", False),
                                          ("roles", "Role", True), ("rolebindings", "RoleBinding", True)],
    ("policy", "v1"): [("poddisruptionbudgets", "PodDisruptionBudget", True)],
    ("networking.k8s.io", "v1"): [("networkpolicies", "NetworkPolicy", True)],
    # the Prometheus operator's CRD (the component's ServiceMonitor)
    ("monitoring.coreos.com", "v1"): [("servicemonitors", "ServiceMonitor", True)],
}


class DiscoveryStub:
    """Discovery for DISCOVERY, 404 NotFound for everything else (every
    object: kubectl apply then prints "created (dry run)")."""

    def __init__(self):
        stub = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                path = urllib.parse.urlsplit(self.path).path.rstrip("/")
                doc = stub.answer(path)
                if doc is None:
                    code, doc = 404, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                      "message": "the server could not find the requested resource",
                                      "reason": "NotFound", "details": {}, "code": 404}
                else:
                    code = 200
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):  # a dry run must never write
                stub.writes.append(self.path)
                self.send_response(500)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_PUT = do_PATCH = do_DELETE = do_POST

        self.writes = []
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.port = self.srv.server_address[1]
        self.t = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.t.start()

    def answer(self, path):
        if path == "/version":
            return {"major": "1", "minor": "31", "gitVersion": "v1.31.0", "platform": "linux/amd64"}
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}
        if path == "/apis":
            groups = [{"name": g, "versions": [{"groupVersion": "%s/%s" % (g, v), "version": v}],
                       "preferredVersion": {"groupVersion": "%s/%s" % (g, v), "version": v}}
                      for (g, v) in DISCOVERY if g]
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        for (g, v), res in DISCOVERY.items():
            gv = "%s/%s" % (g, v) if g else v
            if path == ("/apis/" + gv if g else "/api/" + v):
                return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                        "resources": [{"name": r, "singularName": "", "namespaced": ns, "kind": k,
                                       "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}
                                      for r, k, ns in res]}
        return None

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def kubectl_versions():
    d = kubectl_dir()
    vs = sorted((f[len("kubectl."):] for f in os.listdir(d) if re.match(r"^kubectl\.1\.\d+$", f)),
                key=lambda v: tuple(map(int, v.split("."))))
    return [(v, os.path.join(d, "kubectl." + v)) for v in vs]


def model_check(obj, errors):
    """obj against python3-kubernetes's model of its kind: unknown fields,
    JSON types, then the models' own required-field checks."""
    import kubernetes.client as kc
    from kubernetes.client.api_client import ApiClient
    group_version = obj["apiVersion"].split("/")[-1]
    cls_name = group_version.capitalize() + obj["kind"]
    where = "%s %s" % (obj["kind"], obj["metadata"]["name"])
    if not hasattr(kc, cls_name):
        errors.append("%s: python3-kubernetes has no model %s" % (where, cls_name))
        return

    def value(v, t, path):
        if t == "object":
            return
        m = re.match(r"^list\[(.*)\]$", t)
        if m:
            if not isinstance(v, list):
                errors.append("%s: %s is not a list" % (where, path))
                return
            for i, x in enumerate(v):
                value(x, m.group(1), "%s[%d]" % (path, i))
            return
        m = re.match(r"^dict\(str, (.*)\)$", t)
        if m:
            if not isinstance(v, dict):
                errors.append("%s: %s is not a map" % (where, path))
                return
            for k, x in v.items():
                value(x, m.group(1), "%s.%s" % (path, k))
            return
        simple = {"str": str, "int": int, "bool": bool, "float": (int, float), "datetime": str, "date": str}
        if t in simple:
            if not isinstance(v, simple[t]) or (t == "int" and isinstance(v, bool)):
                errors.append("%s: %s is %r, not a %s" % (where, path, v, t))
            return
        cls = getattr(kc, t)
        if not isinstance(v, dict):
            errors.append("%s: %s is not an object (%s)" % (where, path, t))
            return
        by_json = {j: a for a, j in cls.attribute_map.items()}
        for k, x in v.items():
            if k not in by_json:
                errors.append("%s: unknown field %s.%s (%s)" % (where, path, k, t))
            else:
                value(x, cls.openapi_types[by_json[k]], "%s.%s" % (path, k))

    value(obj, cls_name, "")
    try:
        ApiClient()._ApiClient__deserialize(obj, cls_name)
    except (ValueError, TypeError) as e:
        errors.append("%s: %s" % (where, e))


@only_in_plaintext_run("static checks of the deployment files; nothing about the test transport")
class ManifestTest(unittest.TestCase):
    def test_kubectl_kustomize_and_apply_dry_run_every_version(self):
        versions = kubectl_versions()
        self.assertGreaterEqual(len(versions), 2, "kubectl 1.27-1.33 side by side: %s" % versions)
        stub = DiscoveryStub()
        home = tempfile.mkdtemp(prefix="kwc-kubectl-")

        def run(v, binary, tier):
            problems = []
            # every version's kustomize renders the same objects
            for comp in (False, True):
                if kustomize(tier, comp, binary) != kustomize(tier, comp, versions[-1][1]):
                    problems.append("kubectl %s kustomize %s%s renders differently from %s" % (
                        v, tier, " + servicemonitor" if comp else "", versions[-1][0]))
            env = dict(os.environ, KUBECONFIG="/dev/null", HOME=home)
            cmd = [binary, "--server", "http://127.0.0.1:%d" % stub.port, "--cache-dir",
                   os.path.join(home, "cache-" + v), "apply", "--dry-run=client", "--validate=false", "-k",
                   os.path.join(K8S, "overlays", tier)]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
            if r.returncode != 0:
                problems.append("kubectl %s apply -k %s: exit %d: %s" % (v, tier, r.returncode, r.stderr[-1500:]))
            done = [l for l in r.stdout.splitlines() if l.endswith("(dry run)")]
            docs = render(tier)
            if len(done) != len(docs):
                problems.append("kubectl %s apply -k %s: %d objects rendered, %d applied:\n%s" % (
                    v, tier, len(docs), len(done), r.stdout))
            for d in docs:
                if not any(l.split(" ")[0].split("/", 1)[-1] == d["metadata"]["name"] and
                           l.split("/")[0].split(".")[0] == d["kind"].lower() for l in done):
                    problems.append("kubectl %s apply -k %s: %s %s missing from:\n%s" % (
                        v, tier, d["kind"], d["metadata"]["name"], r.stdout))
            return problems

        try:
            with concurrent.futures.ThreadPoolExecutor(4) as ex:
                futs = [ex.submit(run, v, b, t) for v, b in versions for t in TIERS]
                problems = [p for f in futs for p in f.result()]
        finally:
            stub.close()
            shutil.rmtree(home, ignore_errors=True)
        self.assertEqual(problems, [])
        self.assertEqual(stub.writes, [], "a client-side dry run wrote to the server")

    def test_fields_match_the_api_types(self):
        errors = []
        for d in render(*TIERS, component=True):
            if d["kind"] != "ServiceMonitor":  # no model: test_servicemonitor
                model_check(d, errors)
        self.assertEqual(errors, [])

    def test_cluster_role_rules(self):
        """kwc's ClusterRole: list and watch of everything (caches start on
        demand for any resource), never get; and the narrowed alternative its
        comment shows grants exactly its own --resources list (and the
        APIService list discovery reads), secrets not among them."""
        role = find(load_docs(RBAC), "ClusterRole", "kwc")
        self.assertIn({"apiGroups": ["*"], "resources": ["*"], "verbs": ["list", "watch"]}, role["rules"])
        self.assertEqual([r for r in role["rules"] if "get" in r["verbs"] or "*" in r["verbs"]], [])
        resources, rules = narrowed_example()
        flags = kwc_flags()
        self.assertIn("--resources", flags)
        self.assertTrue(resources)
        for g, v, r in resources:
            self.assertIsNotNone(g, "an explicit --resources entry names its group and version: %s" % r)
            for verb in ("list", "watch"):
                self.assertTrue(granted(rules, g, r, verb), "%s %s/%s/%s not granted" % (verb, g, v, r))
        listed = {(g, r) for g, _, r in resources}
        for rule in rules:
            self.assertNotIn("*", rule["apiGroups"] + rule["resources"] + rule["verbs"], rule)
            self.assertNotIn("get", rule["verbs"], rule)
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    if (g, r) == ("apiregistration.k8s.io", "apiservices"):
                        self.assertEqual(rule["verbs"], ["list"])
                    else:
                        self.assertIn((g, r), listed, "a narrowed rule grants what --resources does not name")
        self.assertTrue(granted(rules, "apiregistration.k8s.io", "apiservices", "list"))
        self.assertFalse(granted(rules, "", "secrets", "list"))
        self.assertNotIn("secrets", [r for _, _, r in resources])

    def test_client_kubeconfig_names_the_service(self):
        docs = render("central")
        svc = find(docs, "Service", "kwc")
        with open(CLIENT_KUBECONFIG) as f:
            kc = yaml.safe_load(f)
        self.assertEqual(kc["kind"], "Config")
        port = svc["spec"]["ports"][0]["port"]
        names = {"%s.%s.svc" % (svc["metadata"]["name"], svc["metadata"]["namespace"]),
                 "%s.%s.svc.cluster.local" % (svc["metadata"]["name"], svc["metadata"]["namespace"])}
        servers = [c["cluster"] for c in kc["clusters"]]
        in_cluster = [c for c in servers if urllib.parse.urlsplit(c["server"]).hostname in names]
        self.assertTrue(in_cluster, "no cluster entry names the Service (%s): %s" % (names, servers))
        for c in in_cluster:
            u = urllib.parse.urlsplit(c["server"])
            self.assertEqual((u.scheme, u.port or 443), ("https", port))
        for c in servers:
            if "tls-server-name" in c:
                self.assertIn(c["tls-server-name"], names)
        # every kubectl reads it
        for v, b in kubectl_versions():
            r = subprocess.run([b, "config", "view", "--kubeconfig", CLIENT_KUBECONFIG, "-o", "json"],
                               capture_output=True, text=True, timeout=30, env=dict(os.environ, HOME="/tmp"))
            self.assertEqual(r.returncode, 0, "kubectl %s: %s" % (v, r.stderr))
            self.assertEqual(len(json.loads(r.stdout)["contexts"]), len(kc["contexts"]))

    def check_workload(self, docs, w, pod_uid_from):
        flags = kwc_flags()
        c = workload_container(w)
        spec = w["spec"]["template"]["spec"]
        args = split_args(c.get("command", [])[1:] + c.get("args", []))
        unknown = [f for f, _ in args if f not in flags]
        self.assertEqual(unknown, [], "flags kwc --help does not know")
        a = dict(args)
        # TLS + delegated auth on every address; data dir on the cache volume
        self.assertRegex(a["--listen"], r"^(0\.0\.0\.0)?:\d+$")
        self.assertIn(a.get("--auth", "delegated"), ("delegated",))
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        vols = workload_volumes(w)
        self.assertIn(a["--data-dir"], mounts)
        tls_dir = os.path.dirname(a["--tls-cert-file"])
        self.assertEqual(tls_dir, os.path.dirname(a["--tls-private-key-file"]))
        self.assertIn(tls_dir, mounts)
        self.assertEqual(vols[mounts[tls_dir]]["secret"]["secretName"], "kwc-tls")
        # probes: kwc's own endpoints, HTTPS, on the container's port
        port = int(a["--listen"].rsplit(":", 1)[1])
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz"), ("startupProbe", "/livez")):
            g = c[probe]["httpGet"]
            self.assertEqual((g["path"], g["scheme"]), (path, "HTTPS"), probe)
            self.assertEqual(ports.get(g["port"], g["port"]), port, probe)
        # a failing /readyz leaves the endpoints within the shutdown delay
        rp = c["readinessProbe"]
        delay, _, has_delay = shutdown_seconds(args)
        if has_delay:
            self.assertLessEqual(rp.get("periodSeconds", 10) * rp.get("failureThreshold", 3), delay,
                                 "a failing /readyz noticed within --shutdown-delay-duration")
        self.assertEqual(c["securityContext"].get("runAsUser", spec.get("securityContext", {}).get("runAsUser")),
                         pod_uid_from)
        # memory: the sizing formula's floor (docs/deploy.md): 12 MiB,
        # 0.5 MiB per cache, a full --watch-window per cache kwc starts
        # itself, 32 MiB of catch-up per watch worker
        window = quantity(a.get("--watch-window", flags["--watch-window"]))
        # (--resources auto, the default: the protobuf caches kwc starts
        # itself; an explicit list: its caches, and the protobuf ones of it)
        if a.get("--resources", "auto") == "auto":
            nres = len(protobuf_names(args))
        else:
            listed = parse_gvrs(a["--resources"])
            pb = protobuf_names(args)
            nres = len(listed) + len([1 for g, _, r in listed if builtin_group(g) and r in pb])
        req = quantity(c["resources"]["requests"]["memory"])
        floor = (12 << 20) + nres * ((1 << 19) + window) + int(a["--serving-threads"]) * (32 << 20)
        self.assertGreater(req, floor, "memory request vs the sizing formula with %d caches" % nres)
        self.assertGreaterEqual(quantity(c["resources"]["limits"]["memory"]), req)
        # watch workers: set, and not above the CPUs asked for
        cpu = c["resources"]["requests"]["cpu"]
        cpus = float(cpu[:-1]) / 1000 if str(cpu).endswith("m") else float(cpu)
        self.assertGreaterEqual(int(a["--serving-threads"]), 1)
        self.assertLessEqual(int(a["--serving-threads"]), max(1, round(cpus)) + 1)
        # the service account is the one the ClusterRole is bound to
        sa = spec["serviceAccountName"]
        ns = w["metadata"]["namespace"]
        bound = [s for b in docs if b["kind"] == "ClusterRoleBinding" and b["roleRef"]["name"] == "kwc"
                 for s in b["subjects"]]
        self.assertIn({"kind": "ServiceAccount", "name": sa, "namespace": ns}, bound)
        find(docs, "ServiceAccount", sa, ns)
        self.assertNotEqual(spec.get("automountServiceAccountToken"), False)
        # a Service selecting the pods, on the named port
        labels = w["spec"]["template"]["metadata"]["labels"]
        svcs = [s for s in docs if s["kind"] == "Service" and s["metadata"]["namespace"] == ns]
        self.assertTrue(svcs)
        for s in svcs:
            self.assertTrue(all(labels.get(k) == v for k, v in s["spec"]["selector"].items()))
            for p in s["spec"]["ports"]:
                self.assertEqual(ports.get(p["targetPort"], p["targetPort"]), port)
        # the image `make image` tags by default
        r = subprocess.run(["make", "-s", "-n", "image", "CONTAINER=true"], cwd=ROOT, capture_output=True,
                           text=True, timeout=30)
        tag = re.search(r" -t (\S+) ", r.stdout)
        self.assertTrue(tag, r.stdout + r.stderr)
        for x in [c] + spec.get("initContainers", []):
            self.assertEqual(x["image"], tag.group(1), "%s: the image make image builds" % x["name"])
        self.check_availability(docs, w, args)
        self.check_network_policy(docs, w, port)
        return a, mounts, vols

    def check_availability(self, docs, w, args):
        """Pod security, requests, shutdown and disruption settings every
        tier shares."""
        spec = w["spec"]["template"]["spec"]
        psc = spec.get("securityContext", {})
        ns = find(docs, "Namespace", w["metadata"]["namespace"])["metadata"]["labels"]
        for x in spec["containers"] + spec.get("initContainers", []):
            csc = x.get("securityContext", {})
            where = "%s %s, container %s" % (w["kind"], w["metadata"]["name"], x["name"])
            # Pod Security "restricted" (kube's pod-security-admission policy checks)
            self.assertEqual(csc.get("seccompProfile", psc.get("seccompProfile", {})).get("type"),
                             "RuntimeDefault", where)
            self.assertIs(csc.get("allowPrivilegeEscalation"), False, where)
            self.assertIs(csc.get("readOnlyRootFilesystem"), True, where)
            self.assertEqual(csc.get("capabilities", {}).get("drop"), ["ALL"], where)
            self.assertNotIn("privileged", [k for k, v in csc.items() if v is True])
            if x in spec.get("initContainers", []) and x["name"] == "chown-cache":
                # the documented exception: root with CAP_CHOWN alone, in a
                # namespace enforcing "privileged" and warning at "restricted"
                self.assertEqual(csc["capabilities"].get("add"), ["CHOWN"], where)
                self.assertEqual(ns["pod-security.kubernetes.io/enforce"], "privileged")
                self.assertEqual(ns["pod-security.kubernetes.io/warn"], "restricted")
            else:
                self.assertIs(csc.get("runAsNonRoot", psc.get("runAsNonRoot")), True, where)
                self.assertNotEqual(csc.get("runAsUser", psc.get("runAsUser")), 0, where)
                self.assertNotIn("add", csc.get("capabilities", {}), where)
            # requests on every container; no preStop: kwc keeps serving with
            # /readyz failing for --shutdown-delay-duration itself
            self.assertTrue({"cpu", "memory"} <= set(x.get("resources", {}).get("requests", {})), where)
            self.assertNotIn("preStop", x.get("lifecycle", {}), where)
        if "hostPath" not in json.dumps(spec.get("volumes", [])):
            self.assertEqual(ns["pod-security.kubernetes.io/enforce"], "restricted")
        # the grace period covers the shutdown delay and the drain, with a margin
        delay, drain, _ = shutdown_seconds(args)
        self.assertGreaterEqual(spec["terminationGracePeriodSeconds"], delay + drain + 5,
                                "terminationGracePeriodSeconds vs delay %g s + drain %g s" % (delay, drain))

    def check_network_policy(self, docs, w, port):
        ns = w["metadata"]["namespace"]
        labels = w["spec"]["template"]["metadata"]["labels"]
        pols = [p for p in docs if p["kind"] == "NetworkPolicy" and p["metadata"]["namespace"] == ns and
                all(labels.get(k) == v for k, v in p["spec"]["podSelector"]["matchLabels"].items())]
        self.assertEqual(len(pols), 1, "one NetworkPolicy selects the %s's pods" % w["kind"])
        spec = pols[0]["spec"]
        self.assertEqual(sorted(spec["policyTypes"]), ["Egress", "Ingress"])
        ports = {p["name"]: p["containerPort"] for p in workload_container(w)["ports"]}
        ingress = [p for r in spec["ingress"] for p in r["ports"]]
        self.assertIn(port, [ports.get(p["port"], p["port"]) for p in ingress], "kwc's port let in")
        out = [(r.get("to"), p.get("port"), p.get("protocol", "TCP")) for r in spec["egress"] for p in r["ports"]]
        dns = [to for to, pt, proto in out if pt == 53]
        self.assertEqual({proto for _, pt, proto in out if pt == 53}, {"UDP", "TCP"}, "DNS out")
        self.assertTrue(dns and all(to for to in dns), "DNS to the cluster's DNS pods only")
        a = dict(split_args(workload_container(w)["args"]))
        if "--kubeconfig" in a:
            # a tier in front of the central one: the central pods' port
            central = find(render("central"), "StatefulSet", "kwc")
            cport = int(dict(split_args(workload_container(central)["args"]))["--listen"].rsplit(":", 1)[1])
            sel = central["spec"]["template"]["metadata"]["labels"]
            self.assertTrue([to for to, pt, _ in out if pt == cport and to and any(
                t.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name") ==
                central["metadata"]["namespace"] and
                all(sel.get(k) == v for k, v in t.get("podSelector", {}).get("matchLabels", {}).items())
                for t in to)], "egress to the central tier's pods")
            self.assertNotIn(6443, [pt for _, pt, _ in out], "the API server is the central tier's business")
        else:
            self.assertTrue({443, 6443} <= {pt for _, pt, _ in out}, "egress to the API server")

    def test_central_statefulset(self):
        docs = render("central")
        w = find(docs, "StatefulSet", "kwc")
        a, mounts, vols = self.check_workload(docs, w, POD_UID)
        spec = w["spec"]
        # availability: two replicas at least, one replaced at a time and
        # only once the new one is ready (a StatefulSet has no surge; a
        # Deployment would need maxUnavailable 0), a PDB, spread
        self.assertGreaterEqual(spec["replicas"], 2)
        self.assertEqual(spec["updateStrategy"]["type"], "RollingUpdate")
        self.assertEqual(spec["updateStrategy"].get("rollingUpdate", {}).get("partition", 0), 0)
        self.assertNotIn("maxUnavailable", spec["updateStrategy"].get("rollingUpdate", {}))
        self.assertGreaterEqual(spec.get("minReadySeconds", 0), 5)
        self.assertEqual(spec["podManagementPolicy"], "Parallel")
        labels = spec["template"]["metadata"]["labels"]
        pdbs = [p for p in docs if p["kind"] == "PodDisruptionBudget" and
                all(labels.get(k) == v for k, v in p["spec"]["selector"]["matchLabels"].items())]
        self.assertEqual(len(pdbs), 1, "a PodDisruptionBudget selecting the pods")
        pdb = pdbs[0]["spec"]
        self.assertTrue(pdb.get("maxUnavailable") == 1 or 1 <= pdb.get("minAvailable", 0) < spec["replicas"], pdb)
        spread = {c["topologyKey"]: c for c in spec["template"]["spec"]["topologySpreadConstraints"]}
        self.assertEqual(spread["kubernetes.io/hostname"]["whenUnsatisfiable"], "DoNotSchedule")
        self.assertEqual(spread["topology.kubernetes.io/zone"]["whenUnsatisfiable"], "ScheduleAnyway")
        for c in spread.values():
            self.assertEqual(c["maxSkew"], 1)
            self.assertEqual(c["labelSelector"]["matchLabels"], spec["selector"]["matchLabels"])
        # the data dir: a volume per replica, RWO, larger than the map
        claim = vols[mounts[a["--data-dir"]]]["claimTemplate"]
        self.assertEqual(claim["spec"]["accessModes"], ["ReadWriteOnce"])
        size = quantity(claim["spec"]["resources"]["requests"]["storage"])
        self.assertLess(quantity(a["--cache-map-size"]), size, "--cache-map-size must fill before the volume does")
        self.assertEqual(spec["serviceName"], find(docs, "Service", "kwc")["metadata"]["name"])
        # apply order: kubectl kustomize puts the Namespace first
        self.assertEqual(docs[0]["kind"], "Namespace")

    def test_node_local_daemonset(self):
        docs = render("node-local")
        ds = find(docs, "DaemonSet", "kwc")
        a, mounts, vols = self.check_workload(docs, ds, POD_UID)
        host = vols[mounts[a["--data-dir"]]]["hostPath"]
        self.assertEqual(host["type"], "DirectoryOrCreate")
        init = ds["spec"]["template"]["spec"]["initContainers"][0]
        self.assertEqual(init["securityContext"]["capabilities"], {"drop": ["ALL"], "add": ["CHOWN"]})
        self.assertIn("%d:%d" % (POD_UID, POD_UID), init["command"])
        self.assertLess(quantity(a["--cache-map-size"]), 64 << 30)
        svc = find(docs, "Service", "kwc")
        self.assertEqual(svc["spec"]["internalTrafficPolicy"], "Local")
        # no surge: the new pod could not lock the node's data dir
        ru = ds["spec"]["updateStrategy"]["rollingUpdate"]
        self.assertEqual((ds["spec"]["updateStrategy"]["type"], ru["maxSurge"], ru["maxUnavailable"]),
                         ("RollingUpdate", 0, 1))
        # in front of the central tier: the kubeconfig of its ConfigMap
        cm = vols[mounts[os.path.dirname(a["--kubeconfig"])]]["configMap"]["name"]
        kc = yaml.safe_load(find(docs, "ConfigMap", cm)["data"][os.path.basename(a["--kubeconfig"])])
        central = render("central")
        svc = find(central, "Service", "kwc")
        (cluster,) = [c["cluster"] for c in kc["clusters"]]
        self.assertEqual(cluster["server"], "https://%s.%s.svc:%d" % (
            svc["metadata"]["name"], svc["metadata"]["namespace"], svc["spec"]["ports"][0]["port"]))
        self.assertIn(os.path.dirname(cluster["certificate-authority"]), mounts)
        (user,) = [u["user"] for u in kc["users"]]
        self.assertEqual(user, {"tokenFile": SA_DIR + "/token"})
        # bound to the central tier's ClusterRole, which it does not carry
        self.assertEqual([d for d in docs if d["kind"] == "ClusterRole"], [])
        b = find(docs, "ClusterRoleBinding", "kwc-node")
        self.assertEqual(b["roleRef"]["name"], find(central, "ClusterRole", "kwc")["metadata"]["name"])
        self.assertNotIn("kwc", [d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRoleBinding"])

    def test_servicemonitor(self):
        """The optional component: the Service's pods' /metrics over HTTPS on
        the Service's named port, verifying the tier's own certificate name,
        as a Prometheus operator reads a ServiceMonitor."""
        for tier in TIERS:
            docs = render(tier, component=True)
            self.assertEqual(len(docs), len(render(tier)) + 1, "the component adds the ServiceMonitor alone")
            sm = find(docs, "ServiceMonitor", "kwc")
            self.assertEqual(sm["apiVersion"], "monitoring.coreos.com/v1")
            svc = find(docs, "Service", "kwc")
            ns = svc["metadata"]["namespace"]
            self.assertEqual(sm["metadata"]["namespace"], ns)
            self.assertEqual(set(sm["spec"]), {"selector", "endpoints"})
            self.assertTrue(all(svc["metadata"]["labels"].get(k) == v
                                for k, v in sm["spec"]["selector"]["matchLabels"].items()))
            (ep,) = sm["spec"]["endpoints"]
            self.assertIn(ep["port"], [p["name"] for p in svc["spec"]["ports"]])
            self.assertEqual((ep["scheme"], ep["path"]), ("https", "/metrics"))
            self.assertRegex(ep["interval"], r"^\d+s$")
            self.assertEqual(ep["bearerTokenFile"], SA_DIR + "/token")
            self.assertEqual(ep["tlsConfig"]["serverName"], "kwc.%s.svc" % ns)
            self.assertEqual(ep["tlsConfig"]["ca"]["configMap"]["key"], "ca.crt")
            self.assertFalse(ep["tlsConfig"].get("insecureSkipVerify", False))
            known = {"port", "scheme", "path", "interval", "bearerTokenFile", "tlsConfig"}
            self.assertEqual(set(ep) - known, set())
            # who may scrape: the metrics reader ClusterRole (central owns it)
            role = find(render("central"), "ClusterRole", "kwc-metrics-reader")
            self.assertEqual(role["rules"], [{"nonResourceURLs": [ep["path"]], "verbs": ["get"]}])


@only_in_plaintext_run("kubectl against the emulator; nothing about kwc's transport")
class ServerDryRunTest(unittest.TestCase):
    """`kubectl apply --dry-run=server` of each overlay (the component on)
    against apisim, with the oldest and the newest kubectl: every object
    accepted, none stored."""

    def test_apply_dry_run_server(self):
        d = tempfile.mkdtemp(prefix="kwc-dryrun-")
        sim = Proc("apisim", [PYTHON, APISIM, "--listen", "127.0.0.1:0", "--pods", "1"], d)
        sim.start()
        try:
            versions = kubectl_versions()
            env = dict(os.environ, KUBECONFIG="/dev/null", HOME=d)

            def kubectl(binary, *argv, stdin=None):
                r = subprocess.run([binary, "--server", "http://127.0.0.1:%d" % sim.port] + list(argv),
                                   input=stdin, capture_output=True, text=True, timeout=60, env=env)
                return r

            docs = render(*TIERS, component=True)
            # what exists before kwc is applied: its namespaces (kube's
            # NamespaceLifecycle refuses objects in a missing one, dry run
            # or not) and the Prometheus operator's CRD
            crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                   "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
                   "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                            "names": {"plural": "servicemonitors", "singular": "servicemonitor",
                                      "kind": "ServiceMonitor", "listKind": "ServiceMonitorList"},
                            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                                "openAPIV3Schema": {"type": "object",
                                                    "x-kubernetes-preserve-unknown-fields": True}}}]}}
            pre = [x for x in docs if x["kind"] == "Namespace"] + [crd]
            r = kubectl(versions[-1][1], "create", "-f", "-", stdin=yaml.safe_dump_all(pre))
            self.assertEqual(r.returncode, 0, r.stderr)
            wait_for(lambda: kubectl(versions[-1][1], "get", "servicemonitors", "-A").returncode == 0, 10,
                     "the ServiceMonitor CRD served")
            for v, b in (versions[0], versions[-1]):
                for tier in TIERS:
                    r = kubectl(b, "apply", "--dry-run=server", "-f", "-", stdin=kustomize(tier, True))
                    self.assertEqual(r.returncode, 0, "kubectl %s apply --dry-run=server %s: %s" % (
                        v, tier, r.stderr))
                    done = [l for l in r.stdout.splitlines() if l.endswith("(server dry run)")]
                    self.assertEqual(len(done), len(render(tier, component=True)), r.stdout)
            # nothing stored
            for kind in ("statefulsets", "daemonsets", "servicemonitors", "networkpolicies",
                         "poddisruptionbudgets", "clusterroles", "configmaps"):
                r = kubectl(versions[-1][1], "get", kind, "-A", "-l", "app.kubernetes.io/name=kwc", "-o", "name")
                self.assertEqual((r.returncode, r.stdout), (0, ""), kind + ": " + r.stderr)
        finally:
            sim.stop()
            shutil.rmtree(d, ignore_errors=True)


# ---- 3. RBAC against what kwc calls, in a pod-like sandbox ---------------

SANDBOX = r"""
set -eu
if [ -n "${SB_SA:-}" ]; then
  # the service account volume, where the kubelet mounts it (/var/run -> /run)
  mount -t tmpfs -o mode=0755,size=1m kwc-sa /run
  install -d -m 0755 /run/secrets/kubernetes.io/serviceaccount
  install -m 0644 "$SB_SA"/token "$SB_SA"/ca.crt "$SB_SA"/namespace /run/secrets/kubernetes.io/serviceaccount/
fi
for d in $SB_RW; do mount --bind "$d" "$d"; done          # the writable volumes
if [ -n "${SB_CHOWN:-}" ]; then                          # an init container: root with CAP_CHOWN alone
  setpriv --bounding-set=-all,+chown --inh-caps=-all -- $SB_CHOWN
fi
mount -o remount,bind,ro /                               # readOnlyRootFilesystem
exec setpriv --reuid "$SB_UID" --regid "$SB_UID" --clear-groups --bounding-set=-all --inh-caps=-all \
  --no-new-privs -- "$@"
"""


def sandbox_proc(name, workdir, argv, env, rw_dirs, sa_dir=None, chown=None, uid=POD_UID):
    """A Proc running argv (kwc) like a pod's container: see the module doc.
    workdir (port file) and rw_dirs stay writable; everything else is
    read-only. The Proc appends --port-file to argv."""
    for d in [workdir] + list(rw_dirs):
        if chown is None or d != chown.split()[-1]:
            os.chown(d, uid, uid)
    e = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SB_UID": str(uid),
         "SB_RW": " ".join([workdir] + list(rw_dirs)), "SB_SA": sa_dir or "", "SB_CHOWN": chown or ""}
    e.update(env)
    wrapped = ["unshare", "--mount", "--propagation", "private", "sh", "-c", SANDBOX, "kwc-sandbox"] + argv
    return Proc(name, wrapped, workdir, env=e, tls=None)


def sa_user(ns, name):
    return "system:serviceaccount:%s:%s" % (ns, name)


def atoms_of(docs, binding_name):
    """The ClusterRole bound by binding_name, one apisim rule per
    (apiGroup, resource, verb) (or nonResourceURL, verb), for the binding's
    subjects."""
    b = find(docs, "ClusterRoleBinding", binding_name)
    role = find(docs, "ClusterRole", b["roleRef"]["name"])
    users, groups = [], []
    for s in b["subjects"]:
        if s["kind"] == "ServiceAccount":
            users.append(sa_user(s["namespace"], s["name"]))
        elif s["kind"] == "User":
            users.append(s["name"])
        else:
            groups.append(s["name"])
    atoms = []
    for r in role["rules"]:
        subj = {"users": users} if users else {}
        if groups:
            subj["groups"] = groups
        for v in r["verbs"]:
            if "nonResourceURLs" in r:
                for u in r["nonResourceURLs"]:
                    atoms.append(dict(subj, name="%s get %s" % (v, u), verbs=[v], nonResourceURLs=[u]))
                continue
            for g in r["apiGroups"]:
                for res in r["resources"]:
                    a = dict(subj, name="%s %s/%s" % (v, g or "core", res), verbs=[v], apiGroups=[g],
                             resources=[res])
                    if r.get("resourceNames"):
                        a["resourceNames"] = r["resourceNames"]
                    atoms.append(a)
    return atoms


TOKENS = {"kwc": "tok-kwc-sa-3c1f", "kwc-node": "tok-kwc-node-sa-77ab", "kwc-systemd": "tok-kwc-systemd-51e0",
          "alice": "tok-alice-8d2e", "app": "tok-app-sa-90b4"}
APP = sa_user("ns-0", "app")
CALLERS = {
    # a user with a uid, groups and an extra: every Impersonate-* header
    TOKENS["alice"]: {"user": "alice", "uid": "uid-alice", "groups": ["devs"], "extra": {"scopes": ["deploy"]}},
    # a bound service account token, as the API server's TokenReview tells it
    TOKENS["app"]: {"user": APP, "uid": "uid-app",
                    "groups": ["system:serviceaccounts", "system:serviceaccounts:ns-0"],
                    "extra": {"authentication.kubernetes.io/pod-name": ["app-6d4f9-xk2lp"]}},
}
ADMIN = "tok-admin-4e7a"  # apisim --token: system:masters (the test's own set-up requests)
CALLER_RULES = [
    {"name": "alice-read", "users": ["alice"], "verbs": ["get", "list", "watch"], "apiGroups": ["", "example.com"],
     "resources": ["pods", "widgets", "secrets"], "namespaces": ["ns-0"]},
    {"name": "writers", "users": ["alice", APP], "verbs": ["create"], "apiGroups": [""],
     "resources": ["configmaps"], "namespaces": ["ns-0"]},
]


def policy(atoms):
    tokens = dict(CALLERS)
    tokens[TOKENS["kwc"]] = {"user": sa_user("kwc", "kwc"),
                             "groups": ["system:serviceaccounts", "system:serviceaccounts:kwc"]}
    tokens[TOKENS["kwc-node"]] = {"user": sa_user("kwc-node", "kwc"),
                                  "groups": ["system:serviceaccounts", "system:serviceaccounts:kwc-node"]}
    tokens[TOKENS["kwc-systemd"]] = {"user": "kwc-systemd"}
    return {"tokens": tokens, "rules": list(atoms) + CALLER_RULES}


def target_attrs(method, target):
    """(apiGroup, resource, verb) of one of kwc's own upstream requests, or
    ("nonresource", path, verb)."""
    u = urllib.parse.urlsplit(target)
    q = urllib.parse.parse_qs(u.query)
    parts = u.path.strip("/").split("/")
    if parts[0] == "api" and len(parts) >= 3:
        g, rest = "", parts[2:]
    elif parts[0] == "apis" and len(parts) >= 4:
        g, rest = parts[1], parts[3:]
    else:
        return ("nonresource", u.path, method.lower())
    if rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    if method == "POST":
        return (g, rest[0], "create")
    if len(rest) >= 2:
        return (g, rest[0], "get")
    return (g, rest[0], "watch" if q.get("watch", ["false"])[0] not in ("0", "false") else "list")


def granted(atoms, g, res, verb):
    """The atoms that allow verb on group g's resource res ("*" in any list
    matches everything, as in RBAC and apisim)."""
    return [a for a in atoms if "resources" in a and (verb in a["verbs"] or "*" in a["verbs"]) and
            (g in a["apiGroups"] or "*" in a["apiGroups"]) and (res in a["resources"] or "*" in a["resources"])]


def mentions(texts, resource):
    """Whether a failure text names resource as a word (endpoints is not
    endpointslices)."""
    return any(re.search(r"(?<![\w.-])%s(?![\w-])" % re.escape(resource), t) for t in texts)


@only_in_plaintext_run("the deployment test serves TLS itself, as the manifests configure kwc")
class RbacSandboxTest(unittest.TestCase):
    """kwc with the manifests' args, identity and RBAC (see the module doc)."""

    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise AssertionError("21_deploy runs kwc in mount namespaces: run it as root, as CI does")
        cls.docs = render(*TIERS)
        cls.dir = tempfile.mkdtemp(prefix="kwc-deploy-")
        os.chmod(cls.dir, 0o755)
        cls.apisim = Proc("apisim", [PYTHON, APISIM, "--listen", "127.0.0.1:0", "--tls-cert", P.server.crt,
                                     "--tls-key", P.server.key, "--pods", "30", "--nodes", "3",
                                     "--namespaces", "2", "--token", ADMIN, "--recent-requests", "100000",
                                     "--policy", cls.write_json("policy.json", policy([]))],
                          cls.dir)
        cls.apisim.start()
        cls.ctx = ssl.create_default_context(cafile=P.ca.crt)
        cls.runs = 0
        try:
            cls.discovered = cls.read_discovery()
            cls.sim_as_admin("POST", "/apis/example.com/v1/namespaces/ns-0/widgets",
                             {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w-1"},
                              "spec": {}})
        except BaseException:
            cls.apisim.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.apisim.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def write_json(cls, name, doc):
        p = os.path.join(cls.dir, name)
        with open(p, "w") as f:
            json.dump(doc, f)
        return p

    # -- talking to apisim and kwc --

    @classmethod
    def sim_as_admin(cls, method, path, body=None):
        return cls.sim(cls, method, path, body, token=ADMIN)

    @classmethod
    def read_discovery(cls):
        """{(group, version, resource)} apisim's discovery lists with list
        and watch (no subresources): what kwc may cache in auto mode."""
        out = set()
        gvs = [("", v) for v in cls.sim_as_admin("GET", "/api")["versions"]]
        for grp in cls.sim_as_admin("GET", "/apis")["groups"]:
            gvs += [(grp["name"], v["version"]) for v in grp["versions"]]
        for g, v in gvs:
            doc = cls.sim_as_admin("GET", "/apis/%s/%s" % (g, v) if g else "/api/" + v)
            for r in doc["resources"]:
                if "/" not in r["name"] and {"list", "watch"} <= set(r.get("verbs", [])):
                    out.add((g, v, r["name"]))
        return out

    def sim(self, method, path, body=None, token=None):
        import http.client
        c = http.client.HTTPSConnection("127.0.0.1", self.apisim.port, context=self.ctx, timeout=10)
        try:
            h = {"Content-Type": "application/json", "Accept": "application/json"}
            if token:
                h["Authorization"] = "Bearer " + token
            c.request(method, path, body=json.dumps(body) if body is not None else None, headers=h)
            r = c.getresponse()
            data = r.read()
            assert r.status < 300, "apisim %s %s: %d %s" % (method, path, r.status, data[:300])
            return json.loads(data)
        finally:
            c.close()

    def kwc_req(self, port, method, path, token=None, body=None, timeout=10):
        import http.client
        c = http.client.HTTPSConnection("127.0.0.1", port, context=self.ctx, timeout=timeout)
        try:
            h = {"Accept": "application/json", "User-Agent": "kwc-deploytest"}
            if token:
                h["Authorization"] = "Bearer " + token
            if body is not None:
                h["Content-Type"] = "application/json"
            c.request(method, path, body=json.dumps(body) if body is not None else None, headers=h)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def requests_since(self, seq0):
        r = self.sim("GET", "/apisim/requests")
        reqs = [x for x in r["requests"] if x["seq"] > seq0]
        assert not reqs or reqs[0]["seq"] == seq0 + 1 or seq0 == 0, "apisim's request log overflowed"
        return reqs

    # -- kwc as the workload runs it --

    def start_kwc(self, workload, sa_token, atoms, extra=(), upstream_port=None):
        """kwc with workload's args (ports and paths adapted; extra flags
        appended), in-cluster as the service account whose token is
        sa_token, apisim holding atoms. A ConfigMap volume holds the
        ConfigMap of the manifests (paths adapted, a kubeconfig's server
        made https://127.0.0.1:upstream_port) or, for one they do not carry
        (kwc-ca, the operator's), the test CA. Returns (Proc, apisim's
        request seq before, run dir, [(flag, value)] as given)."""
        self.sim("POST", "/apisim/policy", policy(atoms))
        seq0 = self.sim("GET", "/apisim/requests")["seq"]
        self.__class__.runs += 1
        run = os.path.join(self.dir, "run-%d" % self.runs)
        os.makedirs(run)
        c = workload_container(workload)
        spec = workload["spec"]["template"]["spec"]
        vols = workload_volumes(workload)
        host_of, rw, chown, files = {}, [], None, {}
        for m in c["volumeMounts"]:
            d = os.path.join(run, "vol-" + m["name"])
            os.makedirs(d)
            os.chmod(d, 0o755)
            host_of[m["mountPath"]] = d
            v = vols[m["name"]]
            if "configMap" in v:
                name, ns = v["configMap"]["name"], workload["metadata"]["namespace"]
                cms = [x for x in self.docs if x["kind"] == "ConfigMap" and x["metadata"]["name"] == name and
                       x["metadata"]["namespace"] == ns]
                with open(P.ca.crt) as fh:
                    data = cms[0]["data"] if cms else {"ca.crt": fh.read()}
                for k, text in data.items():
                    files[os.path.join(d, k)] = text
                continue
            if "secret" in v:
                assert v["secret"]["secretName"] == "kwc-tls"
                mode = v["secret"].get("defaultMode", 0o644)
                group = spec.get("securityContext", {}).get("fsGroup", 0)
                for src, dst in ((P.server.crt, "tls.crt"), (P.server.key, "tls.key")):
                    shutil.copy(src, os.path.join(d, dst))
                    os.chown(os.path.join(d, dst), 0, group)
                    os.chmod(os.path.join(d, dst), mode)
            elif "hostPath" in v:
                rw.append(d)  # root-owned: the init container hands it over
                init = spec["initContainers"][0]
                assert [x["mountPath"] for x in init["volumeMounts"]] == [m["mountPath"]]
                chown = " ".join(init["command"][:-1] + [d])
            else:
                rw.append(d)
        args = []
        given = split_args(list(c.get("args", [])) + list(extra))
        for f, v in given:
            if f == "--listen":
                v = v.rsplit(":", 1)[0] + ":0"
            elif v is not None:
                for mp, d in host_of.items():
                    if v == mp or v.startswith(mp + "/"):
                        v = d + v[len(mp):]
            args += [f] + ([v] if v is not None else [])
        for path, text in files.items():
            for mp, d in host_of.items():
                text = text.replace(mp + "/", d + "/")
            if upstream_port:
                text = re.sub(r"server: https://\S+", "server: https://127.0.0.1:%d" % upstream_port, text)
            with open(path, "w") as fh:
                fh.write(text)
        sa = os.path.join(run, "sa")
        os.makedirs(sa)
        with open(os.path.join(sa, "token"), "w") as fh:
            fh.write(sa_token)
        shutil.copy(P.ca.crt, os.path.join(sa, "ca.crt"))
        with open(os.path.join(sa, "namespace"), "w") as fh:
            fh.write(workload["metadata"]["namespace"])
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.apisim.port)}
        for e in c.get("env", []):
            env[e["name"]] = e["value"]
        # the manifest's --shutdown-delay-duration waits for a Service's
        # endpoints: none here, and the tests stop kwc many times
        p = sandbox_proc("kwc", run, [KWC_BIN] + args + ["--shutdown-delay-duration=0"], env, rw, sa_dir=sa,
                         chown=chown)
        p.start()
        return p, seq0, run, given

    def outcome_ready(self, port):
        """'ok' once /readyz is 200 (asked like the kubelet: HTTPS, no
        credentials); a failure text once a cache it waits for (an explicit
        --resources list's) reports an error. In auto mode no cache holds it
        back: 200 at once."""
        def probe():
            st, body = self.kwc_req(port, "GET", "/readyz?verbose", timeout=3)
            if st == 200:
                return "ok"
            bad = [l for l in body.decode().splitlines()
                   if l.startswith("[-]") and ("not synced:" in l or "out of service" in l)]
            return "not ready: " + "; ".join(bad) if bad else None
        try:
            return wait_for(probe, 20, "kwc /readyz, or a cache's error")
        except TimeoutError as e:
            return "not ready: %s" % e

    def plan(self, args):
        """The caches kwc with args starts by itself: [(group, resource,
        encoding)], and whether the mode is auto. Auto: the protobuf caches
        of --protobuf-resources that discovery lists (built-in groups, not
        excluded). An explicit --resources: its JSON caches, and the
        protobuf ones of its built-in entries --protobuf-resources names."""
        a = dict(args)
        pb = protobuf_names(args)
        if a.get("--resources", "auto") == "auto":
            ex = exclusions(args)
            return sorted({(g, r, "protobuf") for g, v, r in self.discovered
                           if r in pb and builtin_group(g) and not excluded(ex, g, v, r)}), True
        out = []
        for g, v, r in parse_gvrs(a["--resources"]):
            out.append((g, r, "json"))
            if builtin_group(g) and r in pb:
                out.append((g, r, "protobuf"))
        return out, False

    def kwc_own(self, reqs):
        """kwc's requests as itself (no Impersonate-*), resource ones only:
        [(group, resource, verb, encoding, authorized)]."""
        out = []
        for r in reqs:
            if r["impersonate"] or not r["authorization"]:
                continue
            g, res, verb = target_attrs(r["method"], r["target"])
            if g == "nonresource":
                continue
            enc = "protobuf" if "protobuf" in r["headers"].get("accept", "") else "json"
            out.append((g, res, verb, enc, r.get("authorized")))
        return out

    def outcome_caches(self, seq0, caches):
        """Each cache (group, resource, encoding) lists and then watches
        upstream: [] once apisim has a watch of kwc's open on every one
        (in its encoding; a watch comes after a LIST that succeeded), else a
        failure text per cache whose LIST or WATCH the upstream refused
        (apisim's authorization decision in its request log)."""
        state = {}

        def probe():
            opened = self.sim("GET", "/apisim/stats").get("open_watches_by_encoding", {})
            denied, watched = {}, set()
            for g, res, verb, enc, ok in self.kwc_own(self.requests_since(seq0)):
                if ok is False:
                    denied.setdefault((g, res, enc), set()).add(verb)
                elif ok and verb == "watch":
                    watched.add((g, res, enc))
            fails, pending = [], []
            for g, res, enc in caches:
                # open now, and asked by this kwc (not a watch of the last one
                # apisim has not seen closed yet)
                if opened.get(res, {}).get(enc, 0) > 0 and (g, res, enc) in watched:
                    continue
                if (g, res, enc) in denied:
                    fails.append("cache %s%s (%s): kwc's %s refused upstream (403)" % (
                        res, "." + g if g else "", enc, " and ".join(sorted(denied[(g, res, enc)]))))
                else:
                    pending.append("%s (%s)" % (res, enc))
            state["pending"] = pending
            return None if pending else (fails,)  # a tuple: [] is an outcome too
        try:
            return wait_for(probe, 20, "kwc's upstream watches, or their refusals")[0]
        except TimeoutError:
            return ["cache %s: neither watching upstream nor refused" % c for c in state.get("pending", ["?"])]

    def scenario(self, kwc, seq0, name, args):
        """What a deployed kwc must do; ([failure texts], apisim's records of
        the run, [(group, resource, encoding)] of the caches it should run)."""
        fails = []
        port = kwc.port
        caches, auto = self.plan(args)
        cached = {(g, r) for g, r, _ in caches}
        ready = self.outcome_ready(port)
        if ready != "ok":
            fails.append(ready)
        # the caches that start with kwc: each syncs and watches upstream
        fails += self.outcome_caches(seq0, caches)
        # alice's reads at resourceVersion=0, each from a cache: pods (in
        # auto mode the JSON cache starts with this list, and the list waits
        # for its first sync) and widgets (a custom resource: only auto mode
        # caches it); secrets pass through as alice when kwc does not cache
        # them (excluded, or not in an explicit list)
        reads = [("", "pods", "/api/v1/namespaces/ns-0/pods?resourceVersion=0"),
                 ("example.com", "widgets", "/apis/example.com/v1/namespaces/ns-0/widgets?resourceVersion=0"),
                 ("", "secrets", "/api/v1/namespaces/ns-0/secrets?resourceVersion=0")]
        ex = exclusions(args)
        from_cache = {}
        for g, res, path in reads:
            from_cache[res] = (g, res) in cached or \
                (auto and any(x[:1] + x[2:] == (g, res) and not excluded(ex, *x) for x in self.discovered))
            st, body = self.kwc_req(port, "GET", path, TOKENS["alice"])
            if st != 200:
                fails.append("alice's list of %s: %d %s" % (res, st, body[:200]))
            elif res != "secrets" and not json.loads(body)["items"]:
                fails.append("alice's list of %s is empty" % res)
        on_demand = [(g, res, "json") for g, res, _ in reads if from_cache[res] and (g, res, "json") not in caches]
        fails += self.outcome_caches(seq0, on_demand)
        # writes pass through as the caller
        for who in ("alice", "app"):
            st, body = self.kwc_req(port, "POST", "/api/v1/namespaces/ns-0/configmaps", TOKENS[who],
                                    {"apiVersion": "v1", "kind": "ConfigMap",
                                     "metadata": {"name": "cm-%s-%s" % (name, who)}, "data": {"k": "v"}})
            if st != 201:
                fails.append("%s's write through kwc: %d %s" % (who, st, body[:300]))
        reqs = self.requests_since(seq0)
        for g, res, path in reads:
            upstream = [r for r in reqs if r["target"] == path and ["impersonate-user", "alice"] in r["impersonate"]]
            if from_cache[res] and upstream:
                fails.append("alice's list of %s went upstream: kwc's cache did not answer it" % res)
            if not from_cache[res] and not upstream:
                fails.append("alice's list of %s (not cached) did not reach apisim as alice" % res)
        for who, user in (("alice", "alice"), ("app", APP)):
            posts = [r for r in reqs if r["method"] == "POST" and "/configmaps" in r["target"]
                     and ["impersonate-user", user] in r["impersonate"]]
            if not posts and not any(f.startswith(who + "'s write") for f in fails):
                fails.append("%s's write did not reach apisim as %s" % (who, user))
        return fails, reqs, caches + on_demand

    def check_calls_match_rules(self, reqs, atoms, all_used=True):
        """What kwc asked upstream as itself, and whom it impersonated, is
        what the rules grant, and (all_used) every rule was used."""
        used, ungranted = set(), []
        for r in reqs:
            if r["impersonate"]:
                for h, v in r["impersonate"]:
                    if h == "impersonate-user":
                        want = ("", "serviceaccounts", "impersonate") if v.startswith("system:serviceaccount:") \
                            else ("", "users", "impersonate")
                    elif h == "impersonate-group":
                        want = ("", "groups", "impersonate")
                    elif h == "impersonate-uid":
                        want = ("authentication.k8s.io", "uids", "impersonate")
                    else:
                        want = ("authentication.k8s.io", "userextras", "impersonate")
                    hit = granted(atoms, *want)
                    used.update(a["name"] for a in hit)
                    if not hit:
                        ungranted.append("%s: %s" % (h, want))
                continue
            if not r["authorization"] or (r.get("requestor") or {}).get("user") == "admin":
                continue  # the test's own set-up requests
            g, res, verb = target_attrs(r["method"], r["target"])
            if g == "nonresource":
                # discovery: the built-in system:discovery and
                # system:public-info-viewer roles (every authenticated user)
                if not re.match(r"^/(apis?(/|$)|version/?$)", res):
                    ungranted.append("%s %s" % (verb, res))
                continue
            hit = granted(atoms, g, res, verb)
            used.update(a["name"] for a in hit)
            if not hit:
                ungranted.append("%s %s %s (%s)" % (verb, g or "core", res, r["target"]))
        self.assertEqual(ungranted, [], "kwc called what the ClusterRole does not grant")
        if all_used:
            self.assertEqual(sorted(a["name"] for a in atoms if a["name"] not in used), [],
                             "ClusterRole rules kwc never used")

    def stop_kwc(self, p):
        code = p.stop()
        if code != 0:
            raise AssertionError("kwc exited %r:\n%s" % (code, p.logs()))

    def full_run(self, workload, sa_token, binding):
        atoms = atoms_of(self.docs, binding)
        p, seq0, run, args = self.start_kwc(workload, sa_token, atoms)
        try:
            fails, reqs, caches = self.scenario(p, seq0, "full-%d" % self.runs, args)
            self.assertEqual(fails, [], "kwc under the manifests' RBAC")
            self.check_calls_match_rules(reqs, atoms)
            # auto mode: the wildcard rule is what lets caches start on
            # demand, a custom resource's among them
            self.assertIn(("example.com", "widgets", "json"), caches)
            # and what kwc's discovery reads to tell aggregated APIs apart
            self.assertIn(("apiregistration.k8s.io", "apiservices", "list", True),
                          [(g, r, v, ok) for g, r, v, _, ok in self.kwc_own(reqs)])
            return p, run, atoms, caches
        except BaseException:
            print(p.logs())
            p.kill()
            raise

    def test_central_rbac_is_exactly_what_kwc_calls(self):
        d = find(self.docs, "StatefulSet", "kwc")
        p, run, atoms, caches = self.full_run(d, TOKENS["kwc"], "kwc")
        try:
            # kwc did its writing on the volumes alone (the root is read-only)
            data = [v for v in os.listdir(run) if v.startswith("vol-cache")]
            self.assertTrue(os.path.exists(os.path.join(run, data[0], "data.mdb")))
            # a client with the example kubeconfig (server and CA adapted to here)
            self.kubectl_with_example_kubeconfig(p.port, run)
        finally:
            self.stop_kwc(p)
        # each rule left out: something fails; a list or watch rule left
        # out fails every cache it covers (the wildcard: all of them, those
        # kwc starts itself and those alice's lists start)
        silent = []
        for atom in atoms:
            rest = [a for a in atoms if a is not atom]
            p, seq0, _, args = self.start_kwc(d, TOKENS["kwc"], rest)
            try:
                fails, _, _ = self.scenario(p, seq0, "no-%d" % self.runs, args)
            finally:
                self.stop_kwc(p)
            if not fails:
                silent.append(atom["name"])
            elif atom["verbs"][0] in ("list", "watch"):
                covered = sorted({r for g, r, _ in caches if granted([atom], g, r, atom["verbs"][0])})
                self.assertTrue(covered, atom["name"])
                missed = [r for r in covered if not mentions(fails, r)]
                self.assertEqual(missed, [], "%s left out, yet these caches did not fail: %s" % (
                    atom["name"], fails))
        self.assertEqual(silent, [], "rules whose absence nothing noticed (unused)")

    def test_narrowed_rbac_from_the_comment(self):
        """base/rbac.yaml's narrowed alternative (an explicit --resources and
        rules for exactly it): kwc runs under those rules alone, never
        lists or watches secrets, and alice's read of secrets passes through
        as alice. Entries the emulator does not serve are left out of the
        list (kwc would wait for them)."""
        d = find(self.docs, "StatefulSet", "kwc")
        resources, rules = narrowed_example()
        served = {(g, v, r) for g, v, r in self.discovered}
        kept = [(g, v, r) for g, v, r in resources if (g, v, r) in served]
        self.assertIn(("", "v1", "pods"), kept)
        arg = ",".join("%s/%s/%s" % x if x[0] else "%s/%s" % x[1:] for x in kept)
        docs = [dict(x) for x in self.docs]
        docs = [x for x in docs if x["kind"] != "ClusterRole" or x["metadata"]["name"] != "kwc"]
        docs.append({"kind": "ClusterRole", "metadata": {"name": "kwc"}, "rules": rules + [
            r for r in find(self.docs, "ClusterRole", "kwc")["rules"] if "list" not in r["verbs"]]})
        atoms = atoms_of(docs, "kwc")
        p, seq0, run, args = self.start_kwc(d, TOKENS["kwc"], atoms, ["--resources", arg])
        try:
            fails, reqs, caches = self.scenario(p, seq0, "narrowed-%d" % self.runs, args)
            self.assertEqual(fails, [], "kwc under the narrowed rules")
            self.check_calls_match_rules(reqs, atoms, all_used=False)
            self.assertNotIn("secrets", [res for _, res, _, _, _ in self.kwc_own(reqs)])
        except BaseException:
            print(p.logs())
            raise
        finally:
            self.stop_kwc(p)

    def test_secrets_excluded_as_the_comment_shows(self):
        """base/rbac.yaml's --resources-exclude (the defaults and v1/secrets),
        the rules as they are: no cache of secrets (kwc never lists or
        watches them), alice's list of them passes through as alice, and
        everything else is cached on demand as before."""
        d = find(self.docs, "StatefulSet", "kwc")
        ex = exclude_example()
        self.assertIn("v1/secrets", ex.split(","))
        self.assertLessEqual(set(kinds_define("KINDS_EXCLUDE_DEFAULT").split(",")), set(ex.split(",")),
                             "the example keeps the default exclusions")
        atoms = atoms_of(self.docs, "kwc")
        p, seq0, run, args = self.start_kwc(d, TOKENS["kwc"], atoms, ["--resources-exclude=" + ex])
        try:
            fails, reqs, caches = self.scenario(p, seq0, "exclude-%d" % self.runs, args)
            self.assertEqual(fails, [], "kwc with secrets excluded")
            self.check_calls_match_rules(reqs, atoms)
            self.assertNotIn("secrets", [r for _, r, _ in caches])
            self.assertIn(("", "pods", "protobuf"), caches)
            self.assertNotIn("secrets", [res for _, res, _, _, _ in self.kwc_own(reqs)])
        except BaseException:
            print(p.logs())
            raise
        finally:
            self.stop_kwc(p)

    def test_node_local_daemonset_runs(self):
        """The node-local DaemonSet's kwc in front of a central kwc (the
        StatefulSet's), through its ConfigMap's kubeconfig: it syncs, a
        caller reads and writes through it, its init container hands it the
        host directory, and the API server sees it only through the
        central tier (impersonated by the central kwc, never as itself)."""
        central = find(self.docs, "StatefulSet", "kwc")
        ds = find(self.docs, "DaemonSet", "kwc")
        atoms = atoms_of(self.docs, "kwc") + atoms_of(self.docs, "kwc-node")
        c, _, _, _ = self.start_kwc(central, TOKENS["kwc"], atoms)
        n = None
        try:
            self.assertEqual(self.outcome_ready(c.port), "ok")
            n, seq0, run, _ = self.start_kwc(ds, TOKENS["kwc-node"], atoms, upstream_port=c.port)
            self.assertEqual(self.outcome_ready(n.port), "ok")
            st, body = self.kwc_req(n.port, "GET", "/api/v1/namespaces/ns-0/pods?resourceVersion=0",
                                    TOKENS["alice"])
            self.assertEqual(st, 200, body[:300])
            self.assertTrue(json.loads(body)["items"])
            st, body = self.kwc_req(n.port, "POST", "/api/v1/namespaces/ns-0/configmaps", TOKENS["alice"],
                                    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm-tiered"},
                                     "data": {"k": "v"}})
            self.assertEqual(st, 201, body[:300])
            cache = os.path.join(run, "vol-cache")
            self.assertEqual(os.stat(cache).st_uid, POD_UID, "the init container's chown")
            self.assertTrue(os.path.exists(os.path.join(cache, "data.mdb")))
            node = sa_user("kwc-node", "kwc")
            reqs = self.requests_since(seq0)
            self.assertEqual([r["target"] for r in reqs if (r.get("requestor") or {}).get("user") == node], [],
                             "the node-local kwc reached the API server directly")
            self.assertTrue([r for r in reqs if (r.get("requestor") or {}).get("user") == sa_user("kwc", "kwc")
                             and (r.get("user") or {}).get("user") == node],
                            "the node-local kwc's requests passed through the central one")
            posts = [r for r in reqs if r["method"] == "POST" and "/configmaps" in r["target"]]
            self.assertEqual([(r.get("user") or {}).get("user") for r in posts], ["alice"])
        except BaseException:
            for p in (c, n):
                if p:
                    print(p.logs())
            raise
        finally:
            if n:
                self.stop_kwc(n)
            self.stop_kwc(c)

    def kubectl_with_example_kubeconfig(self, port, run):
        with open(CLIENT_KUBECONFIG) as f:
            kc = yaml.safe_load(f)
        for c in kc["clusters"]:
            c["cluster"]["server"] = "https://127.0.0.1:%d" % port
            c["cluster"]["certificate-authority"] = P.ca.crt
            c["cluster"].pop("tls-server-name", None)  # the test certificate names 127.0.0.1
        tok = os.path.join(run, "alice.token")
        with open(tok, "w") as f:
            f.write(TOKENS["alice"])
        for u in kc["users"]:
            if "tokenFile" in u["user"]:
                u["user"]["tokenFile"] = tok
        path = os.path.join(run, "client-kubeconfig.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(kc, f)
        v, b = kubectl_versions()[-1]
        r = subprocess.run([b, "--kubeconfig", path, "--context", kc["current-context"], "-n", "ns-0",
                            "get", "pods", "-o", "name"], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, HOME=run))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("pod/", r.stdout)


# ---- 4. the systemd unit --------------------------------------------------

def unit_lines(path):
    """[(section, key, value)] of a unit file, continuation lines joined."""
    out, section, buf = [], None, ""
    with open(path) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if buf:
                line = buf + " " + line.lstrip()
                buf = ""
            if line.endswith("\\"):
                buf = line[:-1].rstrip()
                continue
            s = line.strip()
            if not s or s[0] in "#;":
                continue
            if s.startswith("["):
                section = s.strip("[]")
                continue
            k, v = s.split("=", 1)
            out.append((section, k.strip(), v.strip()))
    return out


@only_in_plaintext_run("the unit's own TLS flags; nothing about the test transport")
class SystemdUnitTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kwc-unit-")
        os.chmod(self.dir, 0o755)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def local_unit(self):
        """A copy of the unit whose ExecStart names the kwc under test."""
        with open(UNIT) as f:
            text = f.read()
        self.assertIn("ExecStart=/usr/local/bin/kwc ", text)
        p = os.path.join(self.dir, "kwc.service")
        with open(p, "w") as f:
            f.write(text.replace("ExecStart=/usr/local/bin/kwc ", "ExecStart=%s " % KWC_BIN))
        return p

    def test_systemd_analyze_verify(self):
        r = subprocess.run(["systemd-analyze", "verify", self.local_unit()], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual((r.returncode, r.stdout + r.stderr), (0, ""))

    def test_hardening(self):
        keys = {(k, v) for _, k, v in unit_lines(UNIT)}
        for kv in (("Restart", "on-failure"), ("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"),
                   ("DynamicUser", "yes"), ("StateDirectory", "kwc"), ("CapabilityBoundingSet", "")):
            self.assertIn(kv, keys)
        creds = {v.split(":", 1)[0] for k, v in keys if k == "LoadCredential"}
        self.assertEqual(creds, {"kubeconfig", "tls.crt", "tls.key"})
        nofile = [int(v) for k, v in keys if k == "LimitNOFILE"]
        self.assertTrue(nofile and nofile[0] >= 65536, "LimitNOFILE sized for watchers")
        r = subprocess.run(["systemd-analyze", "security", "--offline=yes", self.local_unit()],
                           capture_output=True, text=True, timeout=60)
        m = re.search(r"Overall exposure level for kwc.service: ([0-9.]+)", r.stdout)
        self.assertTrue(m, r.stdout[-2000:] + r.stderr)
        self.assertLessEqual(float(m.group(1)), 2.0, r.stdout)

    def test_execstart_runs(self):
        """ExecStart with %d (credentials), %S (state) and %E (configuration)
        in temporary directories, kwc unprivileged on a read-only root."""
        flags = kwc_flags()
        (execstart,) = [v for s, k, v in unit_lines(UNIT) if k == "ExecStart"]
        argv = shlex.split(execstart)
        self.assertEqual(argv[0], "/usr/local/bin/kwc")
        unknown = [f for f, _ in split_args(argv[1:]) if f not in flags]
        self.assertEqual(unknown, [])
        creds, state, etc, run = (os.path.join(self.dir, n) for n in ("creds", "state", "etc", "run"))
        for d in (creds, state, etc, run, os.path.join(state, "kwc"), os.path.join(etc, "kwc")):
            os.makedirs(d, exist_ok=True)
            os.chmod(d, 0o755)
        # the policy: the ClusterRole, bound to the unit's user (kwc-systemd)
        docs = load_docs(RBAC)
        b = find(docs, "ClusterRoleBinding", "kwc")
        b["subjects"] = [{"kind": "User", "name": "kwc-systemd"}]
        pol = os.path.join(run, "policy.json")
        with open(pol, "w") as f:
            json.dump(policy(atoms_of(docs, "kwc")), f)
        apisim = Proc("apisim", [PYTHON, APISIM, "--listen", "127.0.0.1:0", "--tls-cert", P.server.crt,
                                 "--tls-key", P.server.key, "--pods", "10", "--policy", pol], run)
        apisim.start()
        kwc = None
        try:
            with open(P.ca.crt, "rb") as f:
                import base64
                ca = base64.b64encode(f.read()).decode()
            kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "up",
                          "clusters": [{"name": "up", "cluster": {"server": "https://127.0.0.1:%d" % apisim.port,
                                                                  "certificate-authority-data": ca}}],
                          "contexts": [{"name": "up", "context": {"cluster": "up", "user": "kwc"}}],
                          "users": [{"name": "kwc", "user": {"token": TOKENS["kwc-systemd"]}}]}
            with open(os.path.join(creds, "kubeconfig"), "w") as f:
                yaml.safe_dump(kubeconfig, f)
            shutil.copy(P.server.crt, os.path.join(creds, "tls.crt"))
            shutil.copy(P.server.key, os.path.join(creds, "tls.key"))
            uid = 61184  # DynamicUser's range starts here
            for n in os.listdir(creds):  # systemd: owned by the service's user, 0400
                os.chown(os.path.join(creds, n), uid, uid)
                os.chmod(os.path.join(creds, n), 0o400)
            with open(os.path.join(ROOT, "conf", "kwc.yaml")) as f:
                conf = f.read()
            adapted = re.sub(r"^listen: (.*):\d+$", r"listen: \1:0", conf, flags=re.M)
            self.assertNotEqual(adapted, conf, "conf/kwc.yaml has a listen: line")
            with open(os.path.join(etc, "kwc", "kwc.yaml"), "w") as f:
                f.write(adapted)
            spec = {"%d": creds, "%S": state, "%E": etc, "%%": "%"}
            args = [re.sub(r"%[dSE%]", lambda m: spec[m.group(0)], a) for a in argv[1:]]
            self.assertFalse([a for a in args if "%" in a], "specifiers the test does not provide")
            kwc = sandbox_proc("kwc", run, [KWC_BIN] + args + ["--shutdown-delay-duration=0"], {},
                               [os.path.join(state, "kwc")], uid=uid)
            kwc.start()
            ctx = ssl.create_default_context(cafile=P.ca.crt)
            import http.client

            def ready():
                c = http.client.HTTPSConnection("127.0.0.1", kwc.port, context=ctx, timeout=3)
                try:
                    c.request("GET", "/readyz")
                    return c.getresponse().status == 200
                finally:
                    c.close()
            wait_for(ready, 20, "kwc /readyz from the unit's command line")
            self.assertTrue(os.path.exists(os.path.join(state, "kwc", "data.mdb")))
            self.assertEqual(kwc.stop(), 0, kwc.logs())
        except BaseException:
            if kwc:
                print(kwc.logs())
                kwc.kill()
            print(apisim.logs())
            raise
        finally:
            apisim.stop()


# ---- 5. the Dockerfile and make image -------------------------------------

def dockerfile():
    """[(instruction, args text)] with continuations joined, comments dropped."""
    out, buf = [], ""
    with open(DOCKERFILE) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not buf and line.lstrip().startswith("#"):
                continue
            if buf and line.lstrip().startswith("#"):
                continue
            buf += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
            if line.endswith("\\"):
                continue
            if buf.strip():
                ins, _, rest = buf.strip().partition(" ")
                out.append((ins.upper(), rest.strip()))
            buf = ""
    return out


def stages():
    """[{name, from, ins: [(instruction, args)]}] with ARG defaults substituted."""
    args, out = {}, []
    for ins, rest in dockerfile():
        if ins == "ARG" and not out:
            k, _, v = rest.partition("=")
            args[k] = v
            continue
        rest = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), rest)
        if ins == "FROM":
            parts = rest.split()
            out.append({"from": parts[0], "name": parts[2] if len(parts) > 2 else None, "ins": []})
        else:
            out[-1]["ins"].append((ins, rest))
    return out


def exec_form(rest):
    return json.loads(rest) if rest.startswith("[") else shlex.split(rest)


def dockerignore_context(dst):
    """Copy the files the build context holds (.dockerignore applied: later
    patterns win, ! re-includes) into dst."""
    import fnmatch
    rules = []
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        for line in f:
            s = line.strip()
            if s and not s.startswith("#"):
                rules.append((s.startswith("!"), s.lstrip("!").strip("/")))

    def ignored(rel):
        out = False
        for neg, pat in rules:
            pat_re = pat.replace("**/", "")
            parts = rel.split("/")
            hit = any(fnmatch.fnmatch("/".join(parts[:i]), pat) for i in range(1, len(parts) + 1)) or \
                (pat != pat_re and any(fnmatch.fnmatch(p, pat_re) for p in parts))
            if hit:
                out = not neg
        return out

    tracked = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    kept = []
    for rel in tracked:
        if os.path.isfile(os.path.join(ROOT, rel)) and not ignored(rel):
            os.makedirs(os.path.join(dst, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, rel), os.path.join(dst, rel))
            kept.append(rel)
    return kept


def owner_packages(lib):
    """Installed (non -dev) packages shipping a file named lib."""
    r = subprocess.run(["dpkg", "-S", "*/" + os.path.basename(lib)], capture_output=True, text=True)
    pk = set()
    for line in r.stdout.splitlines():
        names, path = line.split(": ", 1)
        if os.path.basename(path) == os.path.basename(lib):
            pk.update(n.strip().split(":")[0] for n in names.split(","))
    return {p for p in pk if not p.endswith("-dev")}


def dependency_closure(roots):
    """roots and everything they depend on, among installed packages."""
    r = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${Pre-Depends}, ${Depends}\n"],
                       capture_output=True, text=True, check=True)
    deps = {}
    for line in r.stdout.splitlines():
        name, _, d = line.partition("\t")
        alts = []
        for item in d.split(","):
            names = [re.sub(r"\(.*?\)|:\w+", "", a).strip() for a in item.split("|")]
            names = [n for n in names if n]
            if names:
                alts.append(names)
        deps[name] = alts
    seen, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        for alts in deps.get(p, []):
            got = [a for a in alts if a in deps]
            todo.extend(got[:1])
    return seen


@only_in_plaintext_run("static checks of the image build; nothing about the test transport")
class DockerfileTest(unittest.TestCase):
    def test_stages(self):
        st = stages()
        self.assertEqual(len(st), 2, "a build stage and a runtime stage")
        self.assertRegex(st[0]["from"], r"debian:bookworm$")
        self.assertRegex(st[1]["from"], r"debian:bookworm-slim$")
        runs = " ".join(r for i, r in st[0]["ins"] if i == "RUN")
        self.assertIn("make", runs)
        self.assertIn("build/kwc", runs)
        self.assertIn("tests/lib/deps.sh build", runs)

    def test_copy_sources_are_in_the_context_and_it_builds(self):
        ctx = tempfile.mkdtemp(prefix="kwc-ctx-")
        try:
            kept = dockerignore_context(ctx)
            self.assertFalse([k for k in kept if k.startswith(("build/", ".git/"))])
            for s in stages():
                for ins, rest in s["ins"]:
                    if ins not in ("COPY", "ADD"):
                        continue
                    words = exec_form(rest)
                    if any(w.startswith("--from") for w in words):
                        continue
                    srcs = [w for w in words if not w.startswith("--")][:-1]
                    for src in srcs:
                        self.assertTrue(os.path.exists(os.path.join(ctx, src)),
                                        "COPY %s: not in the build context (.dockerignore)" % src)
            r = subprocess.run(["make", "-n", "WERROR=0", "build/kwc"], cwd=ctx, capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(r.returncode, 0, "make build/kwc in the build context:\n" + r.stderr[-2000:])
            self.assertIn("-o build/kwc", r.stdout)
        finally:
            shutil.rmtree(ctx, ignore_errors=True)

    def runtime_packages(self):
        final = stages()[-1]
        pkgs = []
        for ins, rest in final["ins"]:
            if ins != "RUN" or "apt-get install" not in rest:
                continue
            for part in rest.split("&&"):
                if "apt-get install" in part:
                    words = shlex.split(part)
                    pkgs += [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
        self.assertTrue(pkgs, "the runtime stage installs its libraries with apt-get install")
        return pkgs

    def test_runtime_packages_provide_what_kwc_links(self):
        pkgs = self.runtime_packages()
        r = subprocess.run(["ldd", KWC_BIN], capture_output=True, text=True, check=True)
        libs = re.findall(r"=> (/\S+)", r.stdout)
        self.assertTrue(libs)
        # what a bookworm-slim image has before any install: the required set
        q = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${Priority}\t${Essential}\n"],
                           capture_output=True, text=True, check=True).stdout
        base = {l.split("\t")[0] for l in q.splitlines() if "\trequired\t" in l or l.endswith("\tyes")}
        have = dependency_closure(set(pkgs) | base)
        missing = []
        for lib in libs:
            owners = owner_packages(lib)
            if not owners & have:
                missing.append("%s (%s)" % (lib, ", ".join(sorted(owners)) or "no package"))
        self.assertEqual(missing, [], "libraries ldd lists that the runtime stage does not install")
        # and only those: each package ships a library kwc links directly
        needed = re.findall(r"NEEDED\s+(\S+)", subprocess.run(["objdump", "-p", KWC_BIN], capture_output=True,
                                                               text=True, check=True).stdout)
        direct = set()
        for n in needed:
            direct |= owner_packages(n)
        extra = [p for p in pkgs if p not in direct and p != "ca-certificates"]
        self.assertEqual(extra, [], "runtime packages that ship no library kwc links")

    def test_user_and_entrypoint(self):
        final = stages()[-1]["ins"]
        users = [r for i, r in final if i == "USER"]
        self.assertTrue(users)
        uid = users[-1].split(":")[0]
        self.assertTrue(uid.isdigit() and int(uid) != 0, "USER must be a numeric non-root uid: %s" % uid)
        self.assertEqual(int(uid), POD_UID, "the uid the manifests run as")
        last_user = max(n for n, (i, _) in enumerate(final) if i == "USER")
        self.assertFalse([r for i, r in final[last_user:] if i == "RUN"], "RUN after USER")
        (entry,) = [exec_form(r) for i, r in final if i == "ENTRYPOINT"]
        (cmd,) = [exec_form(r) for i, r in final if i == "CMD"]
        self.assertEqual(entry[0], "/usr/local/bin/kwc")
        copies = [exec_form(r)[-1] for i, r in final if i == "COPY"]
        self.assertIn(entry[0], copies)
        flags = kwc_flags()
        unknown = [f for f, _ in split_args(entry[1:] + cmd) if f not in flags]
        self.assertEqual(unknown, [], "ENTRYPOINT/CMD flags kwc --help does not know")
        # the image's defaults are the Deployment's paths
        d = dict(split_args(entry[1:] + cmd))
        dep = dict(split_args(workload_container(find(render("central"), "StatefulSet", "kwc"))["args"]))
        for f in ("--data-dir", "--tls-cert-file", "--tls-private-key-file", "--listen"):
            self.assertEqual(d[f], dep[f], f)

    def test_license_label_and_file(self):
        final = stages()[-1]["ins"]
        labels = {}
        for ins, rest in final:
            if ins == "LABEL":
                for word in shlex.split(rest):
                    k, _, v = word.partition("=")
                    labels[k] = v
        self.assertEqual(labels.get("org.opencontainers.image.licenses"), "Apache-2.0")
        self.assertEqual(labels.get("org.opencontainers.image.title"), "kwc")
        self.assertTrue(labels.get("org.opencontainers.image.description"))
        with open(os.path.join(ROOT, "LICENSE")) as f:
            text = f.read()
        self.assertIn("Apache License\n                           Version 2.0, January 2004", text)
        self.assertIn("END OF TERMS AND CONDITIONS", text)  # the full text, not a stub
        # and the image carries it (COPY from the build context, which holds it)
        copies = [exec_form(r) for i, r in final if i == "COPY"]
        self.assertIn(["LICENSE", "/usr/share/doc/kwc/LICENSE"], copies)

    def test_make_image_runs_the_container_tool(self):
        d = tempfile.mkdtemp(prefix="kwc-image-")
        try:
            # a stand-in for the tool (not named podman: make image would
            # install Debian's podman first, deps.sh image)
            tool = os.path.join(d, "container-tool")
            log = os.path.join(d, "argv")
            with open(tool, "w") as f:
                f.write('#!/bin/sh\n{ pwd; for a in "$@"; do echo "$a"; done; } > %s\n' % log)
            os.chmod(tool, 0o755)
            r = subprocess.run(["make", "-s", "image", "CONTAINER=" + tool, "IMAGE=test.local/kwc:t1"],
                               cwd=ROOT, capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(log) as f:
                lines = f.read().splitlines()
            self.assertEqual(lines[0], ROOT, "run from the repository root (the build context)")
            argv = lines[1:]
            self.assertEqual(argv[0], "build")
            self.assertEqual(argv[argv.index("-f") + 1], "Dockerfile")
            self.assertEqual(argv[argv.index("-t") + 1], "test.local/kwc:t1")
            self.assertEqual(argv[-1], ".")
        finally:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
