#!/usr/bin/env python3
"""The container image really builds and runs (make image-test, part of
make test): `make image` with podman, then the image started as the
central tier's StatefulSet (conf/kubernetes/overlays/central) starts it — its args (the port
adapted), a read-only root filesystem, every capability dropped,
no-new-privileges, the image's own non-root user, the cache and TLS volumes,
the service account at its in-cluster path and KUBERNETES_SERVICE_HOST/PORT
pointing at apisim (TLS, --policy with the ClusterRole of base/rbac.yaml) — and
kwc must sync every cache (/readyz 200 over HTTPS), write its cache on the
volume, and exit 0 on SIGTERM.

What this machine needs, and the test does by itself (harmless elsewhere):
  - the bookworm base images: when docker.io cannot be reached (here DNS
    resolves only the Debian mirror), they are bootstrapped from Debian's
    packages with debootstrap (--variant=minbase, what the slim image holds)
    and imported as localhost/kwc-debootstrap/debian:bookworm and
    :bookworm-slim, kept for the next run; the build gets
    --build-arg DEBIAN_IMAGE=localhost/kwc-debootstrap/debian;
  - `podman --runtime runc`: Debian's default, crun, refuses a host with
    cgroup v1 controllers and a cgroup v2 hierarchy side by side ("cgroups
    in hybrid mode not supported");
  - --ulimit nofile/nproc below the hard limits: podman asks for higher
    limits than the sandbox allows a container to raise to (EPERM).
"""
import base64
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import unittest
import http.client

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

import yaml  # noqa: E402

import certs  # noqa: E402
from cluster import APISIM, PYTHON, Proc, free_port, wait_for  # noqa: E402

IMAGE = "localhost/kwc-image-test:latest"
BASE = "localhost/kwc-debootstrap/debian"
PODMAN = ["podman", "--runtime", "runc"]
ULIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
P = certs.pki()


def run(cmd, timeout=900, check=True, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise AssertionError("%s: exit %d\n%s\n%s" % (" ".join(cmd), r.returncode, r.stdout[-3000:],
                                                       r.stderr[-3000:]))
    return r


def debian_mirror():
    for p in ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"):
        try:
            with open(p) as f:
                text = f.read()
        except OSError:
            continue
        m = re.search(r"^URIs:\s*(\S+/debian)\s*$", text, re.M) or \
            re.search(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+/debian)\s+bookworm\b", text, re.M)
        if m:
            return m.group(1)
    return "http://deb.debian.org/debian"


def base_images():
    """--build-arg for the base images: the registry's if it answers, else
    bootstrapped ones (made once)."""
    r = run(PODMAN + ["pull", "-q", "docker.io/library/debian:bookworm-slim"], timeout=120, check=False)
    if r.returncode == 0:
        run(PODMAN + ["pull", "-q", "docker.io/library/debian:bookworm"], timeout=600)
        return []
    print("image-test: docker.io unreachable (%s); bootstrapping the bookworm base from %s" % (
        r.stderr.strip().splitlines()[-1][:160] if r.stderr.strip() else "no answer", debian_mirror()))
    have = run(PODMAN + ["image", "exists", BASE + ":bookworm-slim"], check=False).returncode == 0
    if not have:
        d = tempfile.mkdtemp(prefix="kwc-debootstrap-")
        try:
            rootfs = os.path.join(d, "rootfs")
            run(["debootstrap", "--variant=minbase", "bookworm", rootfs, debian_mirror()], timeout=900)
            shutil.rmtree(os.path.join(rootfs, "var", "cache", "apt", "archives"), ignore_errors=True)
            os.makedirs(os.path.join(rootfs, "var", "cache", "apt", "archives", "partial"))
            tar = os.path.join(d, "rootfs.tar")
            run(["tar", "-C", rootfs, "-cf", tar, "."])
            run(PODMAN + ["import", "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                          "--change", 'CMD ["bash"]', tar, BASE + ":bookworm"])
            run(PODMAN + ["tag", BASE + ":bookworm", BASE + ":bookworm-slim"])
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return ["--build-arg", "DEBIAN_IMAGE=" + BASE]


class ImageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        args = base_images() + ULIMITS + ["--pull=never"]
        t0 = time.monotonic()
        run(["make", "-s", "image", "CONTAINER=" + " ".join(PODMAN), "IMAGE=" + IMAGE,
             "IMAGE_BUILD_ARGS=" + " ".join(args)], cwd=ROOT, timeout=1800)
        print("image-test: make image took %.0f s" % (time.monotonic() - t0))

    def test_image_config(self):
        cfg = json.loads(run(PODMAN + ["image", "inspect", IMAGE]).stdout)[0]["Config"]
        self.assertEqual(cfg["User"], "10001:10001")
        self.assertEqual(cfg["Entrypoint"], ["/usr/local/bin/kwc"])
        r = run(PODMAN + ["run", "--rm", "--network", "none"] + ULIMITS + [IMAGE, "--version"])
        self.assertRegex(r.stdout, r"^kwc \d")

    def test_runs_as_the_deployment_runs_it(self):
        with open(os.path.join(ROOT, "conf", "kubernetes", "overlays", "central", "statefulset.yaml")) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        (dep,) = [d for d in docs if d["kind"] == "StatefulSet"]
        c = dep["spec"]["template"]["spec"]["containers"][0]
        with open(os.path.join(ROOT, "conf", "kubernetes", "base", "rbac.yaml")) as f:
            rbac = [d for d in yaml.safe_load_all(f) if d]
        (role,) = [d for d in rbac if d["kind"] == "ClusterRole"]
        d = tempfile.mkdtemp(prefix="kwc-image-")
        name = "kwc-image-test-%d" % os.getpid()
        apisim = None
        try:
            os.chmod(d, 0o755)
            user = "system:serviceaccount:kwc:kwc"
            pol = {"tokens": {"tok-kwc-image": {"user": user, "groups": ["system:serviceaccounts"]}},
                   "rules": [dict(r, users=[user]) for r in role["rules"]]}
            with open(os.path.join(d, "policy.json"), "w") as f:
                json.dump(pol, f)
            apisim = Proc("apisim", [PYTHON, APISIM, "--listen", "127.0.0.1:0", "--tls-cert", P.server.crt,
                                     "--tls-key", P.server.key, "--pods", "20", "--policy",
                                     os.path.join(d, "policy.json")], d)
            apisim.start()
            vols = {}
            for m in c["volumeMounts"]:
                host = os.path.join(d, "vol-" + m["name"])
                os.makedirs(host)
                vols[m["mountPath"]] = host
            tls = vols["/etc/kwc/tls"]
            shutil.copy(P.server.crt, os.path.join(tls, "tls.crt"))
            shutil.copy(P.server.key, os.path.join(tls, "tls.key"))
            for n in ("tls.crt", "tls.key"):  # defaultMode 0440, fsGroup 10001
                os.chown(os.path.join(tls, n), 0, 10001)
                os.chmod(os.path.join(tls, n), 0o440)
            cache = vols["/var/lib/kwc"]
            os.chown(cache, 10001, 10001)  # fsGroup on a fresh volume
            sa = os.path.join(d, "sa")
            os.makedirs(sa)
            for n, v in (("token", "tok-kwc-image"), ("namespace", "kwc")):
                with open(os.path.join(sa, n), "w") as f:
                    f.write(v)
            shutil.copy(P.ca.crt, os.path.join(sa, "ca.crt"))
            port = free_port()
            args = [("--listen=0.0.0.0:%d" % port) if a.startswith("--listen") else a for a in c["args"]]
            # the manifest's delay is for a Service's endpoints; a second here
            # shows the SIGTERM path without the wait
            args += ["--shutdown-delay-duration=1s"]
            cmd = PODMAN + ["run", "-d", "--name", name, "--network", "host", "--read-only", "--cap-drop", "ALL",
                            "--security-opt", "no-new-privileges", "--group-add", "10001"] + ULIMITS
            for mp, host in vols.items():
                cmd += ["-v", "%s:%s%s" % (host, mp, ":ro" if mp == "/etc/kwc/tls" else "")]
            cmd += ["-v", sa + ":/var/run/secrets/kubernetes.io/serviceaccount:ro",
                    "-e", "KUBERNETES_SERVICE_HOST=127.0.0.1", "-e", "KUBERNETES_SERVICE_PORT=%d" % apisim.port,
                    IMAGE] + args
            run(cmd)
            ctx = ssl.create_default_context(cafile=P.ca.crt)

            def ready():
                st = run(PODMAN + ["inspect", name, "--format", "{{.State.Status}}"]).stdout.strip()
                if st != "running":
                    raise AssertionError("kwc's container is %s:\n%s" % (
                        st, run(PODMAN + ["logs", name], check=False).stderr[-3000:]))
                h = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=3)
                try:
                    h.request("GET", "/readyz")
                    return h.getresponse().status == 200
                finally:
                    h.close()
            wait_for(ready, 60, "kwc in its container: /readyz")
            self.assertEqual(run(PODMAN + ["exec", name, "id", "-u"]).stdout.strip(), "10001")
            self.assertTrue(os.path.exists(os.path.join(cache, "data.mdb")))
            run(PODMAN + ["stop", "-t", "20", name])
            code = run(PODMAN + ["inspect", name, "--format", "{{.State.ExitCode}}"]).stdout.strip()
            logs = run(PODMAN + ["logs", name], check=False)
            self.assertEqual(code, "0", logs.stdout[-2000:] + logs.stderr[-2000:])
            self.assertIn("/readyz fails from now on", logs.stdout + logs.stderr)
        finally:
            run(PODMAN + ["rm", "-f", name], check=False)
            if apisim:
                apisim.stop()
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    res = unittest.main(exit=False, verbosity=2).result
    failed = len(res.failures) + len(res.errors)
    print("image-test: %d passed, %d failed" % (res.testsRun - failed - len(res.skipped), failed))
    sys.exit(1 if failed or res.skipped else 0)
