#!/usr/bin/python3
"""The `controller-manager` bench scenario (issue 30): the informers of a
kube-controller-manager 1.24 replayed against kwc in auto mode (on-demand
caches, discovery answered by kwc) and against kwc with the fixed resource
list it had before (the baseline), each on its own apisim.

Two halves in one file:

  bench_controller_manager(args, R)   the scenario (run.py --only
                                      controller-manager; R is run.py's module)
  client mode                         `cm.py --client --port P --seconds S ...`:
                                      the replay, one process; prints JSON lines

What a kube-controller-manager 1.24 reads (its source, kubernetes v1.24):

  cmd/kube-controller-manager/app/{core,apps,batch,autoscaling,certificates,
  policy,rbac,discovery,bootstrap}.go start the controllers enabled by default
  (ControllersDisabledByDefault: bootstrapsigner, tokencleaner; the cloud
  ones -- service, route, cloud-node-lifecycle -- need --cloud-provider;
  nodeipam needs --allocate-node-cidrs) on one shared informer factory
  (controllerContext.InformerFactory, client "shared-informers"); CONTROLLERS
  below lists each one's informers. The garbage collector
  (pkg/controller/garbagecollector: GetDeletableResources every 30 s, one
  monitor per resource whose verbs include delete, list and watch, from
  ServerPreferredResources, ignoring core/v1 events: DefaultIgnoredResources)
  and the resource quota controller (pkg/controller/resourcequota: the
  namespaced ones with create, list, watch, delete, re-read every 30 s) take
  their informers from controllerContext.ObjectOrMetadataInformerFactory
  (k8s.io/controller-manager/pkg/informerfactory): ForResource is the typed
  shared informer when client-go's typed factory knows the resource, else a
  metadata informer (client "metadata-informers"). client-go's typed factory
  knows the built-in groups except apiextensions.k8s.io and
  apiregistration.k8s.io (their clientsets live elsewhere), so CRDs,
  APIServices and every custom resource are watched metadata-only. Every
  informer is one reflector: ListAndWatch = a list with resourceVersion=0
  (limit=500, the pager's page size, ignored for rv=0), then a watch from
  the list's resourceVersion with allowWatchBookmarks=true and
  timeoutSeconds in [300, 600) (minWatchTimeout 5 min x (1 + rand)); a watch
  that ends is opened again from the last resourceVersion seen; a 410 lists
  again. The set is the garbage collector's (every controller's informer is
  one of its resources): on a 1.24 cluster 47 or so, here what apisim's
  discovery lists (45 built-in plus the custom resources).

  Headers: KCM's clients have ContentType application/vnd.kubernetes.protobuf
  (--kube-api-content-type's default) and no AcceptContentTypes, so
  client-go's rest.NewRequest sends `Accept: application/vnd.kubernetes.
  protobuf, */*` for typed lists, watches and discovery (the discovery client
  keeps the config's content type), no Accept-Encoding (DisableCompression);
  the metadata client (client-go/metadata) sends its own Accept:
  PartialObjectMetadataList in protobuf then JSON then JSON for lists,
  PartialObjectMetadata likewise for watches. User-Agent
  kube-controller-manager/v1.24.17 (linux/amd64) kubernetes/22a9682/<client>
  (client-go's DefaultKubernetesUserAgent plus the client's name), which is
  also how the bench tells the replay's requests apart upstream.

  Discovery: the memory-cached discovery client, the RESTMapper's reset, the
  garbage collector's and the quota controller's 30 s syncs read the whole
  of it (/api, /apis, /api/v1 and every /apis/G/V) about 7 times a minute
  (bench: a round every 60/7 s, the first before the informers start). A
  resource that appears in a round gets its informer then (the garbage
  collector's resync), so the CRD made mid-run is watched after the next
  round.

Bounded: every loop has a deadline (--seconds), every socket a timeout; a
reflector retries a failed list or watch at most MAX_RETRIES times, 1 s
apart (client-go's backoff), waiting on the stop event, not a sleep.
HTTP/1.1 over plaintext, one connection per watch (client-go would speak
HTTP/2 over TLS: one connection for all of them).
"""
import argparse
import http.client
import json
import os
import random
import select
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))
import kpb  # noqa: E402
from cluster import PYTHON  # noqa: E402

UA = "kube-controller-manager/v1.24.17 (linux/amd64) kubernetes/22a9682"
UA_MARK = "kube-controller-manager/"
ACCEPT_TYPED = "application/vnd.kubernetes.protobuf, */*"
ACCEPT_META_LIST = ("application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,"
                    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json")
ACCEPT_META_WATCH = ("application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,"
                     "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json")
DISCOVERY_PER_MINUTE = 7
MAX_RETRIES = 20
MAX_INFORMERS = 200
IO_TIMEOUT = 30.0

# client-go 1.24's typed informer factory: the groups it has informers for
TYPED_GROUPS = {"", "admissionregistration.k8s.io", "apiserverinternal.k8s.io", "apps", "autoscaling", "batch",
                "certificates.k8s.io", "coordination.k8s.io", "discovery.k8s.io", "events.k8s.io", "extensions",
                "flowcontrol.apiserver.k8s.io", "networking.k8s.io", "node.k8s.io", "policy",
                "rbac.authorization.k8s.io", "scheduling.k8s.io", "storage.k8s.io"}
GC_IGNORED = {("", "events")}  # garbagecollector DefaultIgnoredResources

# The controllers kube-controller-manager 1.24 starts by default and the
# shared informers each asks for (group/version/resource), from
# cmd/kube-controller-manager/app/*.go and the constructors in pkg/controller.
CONTROLLERS = {
    "endpoint": ["v1/pods", "v1/services", "v1/endpoints"],
    "endpointslice": ["v1/pods", "v1/services", "v1/nodes", "discovery.k8s.io/v1/endpointslices"],
    "endpointslicemirroring": ["v1/endpoints", "discovery.k8s.io/v1/endpointslices", "v1/services"],
    "replicationcontroller": ["v1/pods", "v1/replicationcontrollers"],
    "podgc": ["v1/pods", "v1/nodes"],
    "resourcequota": ["v1/resourcequotas", "(quota monitors: every namespaced create/list/watch/delete resource)"],
    "namespace": ["v1/namespaces"],
    "serviceaccount": ["v1/serviceaccounts", "v1/namespaces"],
    "serviceaccount-token": ["v1/serviceaccounts", "v1/secrets"],
    "garbagecollector": ["(monitors: every delete/list/watch resource but core events)"],
    "daemonset": ["apps/v1/daemonsets", "apps/v1/controllerrevisions", "v1/pods", "v1/nodes"],
    "job": ["batch/v1/jobs", "v1/pods"],
    "deployment": ["apps/v1/deployments", "apps/v1/replicasets", "v1/pods"],
    "replicaset": ["apps/v1/replicasets", "v1/pods"],
    "horizontalpodautoscaling": ["autoscaling/v2/horizontalpodautoscalers", "v1/pods"],
    "disruption": ["v1/pods", "policy/v1/poddisruptionbudgets", "v1/replicationcontrollers",
                   "apps/v1/replicasets", "apps/v1/deployments", "apps/v1/statefulsets"],
    "statefulset": ["v1/pods", "apps/v1/statefulsets", "v1/persistentvolumeclaims", "apps/v1/controllerrevisions"],
    "cronjob": ["batch/v1/jobs", "batch/v1/cronjobs"],
    "csrsigning": ["certificates.k8s.io/v1/certificatesigningrequests"],
    "csrapproving": ["certificates.k8s.io/v1/certificatesigningrequests"],
    "csrcleaner": ["certificates.k8s.io/v1/certificatesigningrequests"],
    "ttl": ["v1/nodes"],
    "nodelifecycle": ["coordination.k8s.io/v1/leases", "v1/pods", "v1/nodes", "apps/v1/daemonsets"],
    "persistentvolume-binder": ["v1/persistentvolumes", "v1/persistentvolumeclaims", "storage.k8s.io/v1/storageclasses",
                                "v1/pods", "v1/nodes"],
    "attachdetach": ["v1/pods", "v1/nodes", "v1/persistentvolumeclaims", "v1/persistentvolumes",
                     "storage.k8s.io/v1/csinodes", "storage.k8s.io/v1/csidrivers",
                     "storage.k8s.io/v1/volumeattachments"],
    "persistentvolume-expander": ["v1/persistentvolumeclaims", "v1/persistentvolumes"],
    "clusterrole-aggregation": ["rbac.authorization.k8s.io/v1/clusterroles"],
    "pvc-protection": ["v1/persistentvolumeclaims", "v1/pods"],
    "pv-protection": ["v1/persistentvolumes"],
    "ttl-after-finished": ["batch/v1/jobs"],
    "root-ca-cert-publisher": ["v1/configmaps", "v1/namespaces"],
    "ephemeral-volume": ["v1/pods", "v1/persistentvolumeclaims"],
}


def gvr_str(g, v, r):
    return "%s/%s/%s" % (g, v, r) if g else "%s/%s" % (v, r)


def base_path(g, v):
    return "/api/v1" if not g else "/apis/%s/%s" % (g, v)


# ---- the wire ----

class HttpError(Exception):
    pass


def read_head(sock, buf, deadline):
    """(status, {lower name: value}, rest of buf) of one response head."""
    while b"\r\n\r\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise HttpError("head timeout")
        r, _, _ = select.select([sock], [], [], min(left, 1.0))
        if r:
            b = sock.recv(65536)
            if not b:
                raise HttpError("closed before the head")
            buf += b
    head, rest = bytes(buf).split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    hdrs = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return status, hdrs, bytearray(rest)


class Dechunk:
    """An incremental chunked-body decoder: feed bytes, take data."""

    def __init__(self):
        self.buf = bytearray()
        self.left = 0      # data bytes left in the current chunk
        self.crlf = False  # the CRLF after a chunk's data is due
        self.done = False

    def feed(self, b):
        self.buf += b
        out = bytearray()
        while not self.done:
            if self.crlf:
                if len(self.buf) < 2:
                    break
                del self.buf[:2]
                self.crlf = False
            if self.left:
                n = min(self.left, len(self.buf))
                if not n:
                    break
                out += self.buf[:n]
                del self.buf[:n]
                self.left -= n
                if not self.left:
                    self.crlf = True
                continue
            i = self.buf.find(b"\r\n")
            if i < 0:
                break
            size = int(bytes(self.buf[:i]).split(b";")[0], 16)
            del self.buf[:i + 2]
            if size == 0:
                self.done = True
                break
            self.left = size
        return bytes(out)


def pb_rv(envelope):
    """The resourceVersion of a protobuf object or list (its envelope): field 1
    of every object and list is its ObjectMeta / ListMeta."""
    _, kind, raw = kpb.envelope(envelope)
    meta = kpb.fields(kpb.last(kpb.fields(raw), 1, b""))
    if kind.endswith("List"):
        return kpb.s(kpb.last(meta, 2, b"")), kind, raw   # ListMeta.resourceVersion
    return kpb.s(kpb.last(meta, 6, b"")), kind, raw       # ObjectMeta.resourceVersion


def pb_items(raw):
    return len(kpb.every(kpb.fields(raw), 2))


def status_code_pb(raw):
    return kpb.last(kpb.fields(raw), 6, 0)


# ---- the replay ----

class Informer:
    """One reflector: ListAndWatch until stopped."""

    def __init__(self, cl, g, v, r, namespaced, typed, why):
        self.cl, self.g, self.v, self.r, self.typed, self.why = cl, g, v, r, typed, why
        self.gvr = gvr_str(g, v, r)
        self.path = base_path(g, v) + "/" + r
        self.lists, self.watches, self.errors = [], [], []
        self.rv = None
        self.first_list = None  # seconds from the first list request to its whole answer
        self.synced_at = None
        self.sock = None
        self.th = threading.Thread(target=self.run, daemon=True)

    def ua(self):
        return UA + ("/shared-informers" if self.typed else "/metadata-informers")

    def do_list(self, conn):
        hdrs = {"Accept": ACCEPT_TYPED if self.typed else ACCEPT_META_LIST, "User-Agent": self.ua()}
        target = self.path + "?limit=500&resourceVersion=0"
        t0 = time.monotonic()
        conn.request("GET", target, headers=hdrs)
        resp = conn.getresponse()
        body = resp.read()
        dt = time.monotonic() - t0
        ct = resp.getheader("Content-Type", "")
        rec = {"t": round(t0 - self.cl.t0, 3), "dt": round(dt, 4), "status": resp.status, "ctype": ct,
               "bytes": len(body)}
        self.lists.append(rec)
        if resp.status != 200:
            raise HttpError("list %s: %d %r" % (target, resp.status, body[:200]))
        if body[:4] == kpb.MAGIC:
            rv, kind, raw = pb_rv(body)
            rec["items"] = pb_items(raw)
            rec["kind"] = kind
        else:
            d = json.loads(body)
            rv = d["metadata"]["resourceVersion"]
            rec["items"] = len(d.get("items") or [])
            rec["kind"] = d.get("kind")
            if d["metadata"].get("continue"):
                rec["continue"] = True  # rv=0 lists are never paged by a watch cache
        rec["rv"] = rv
        if self.first_list is None:
            self.first_list = dt
        return rv

    def do_watch(self, rv):
        """One watch from rv until it ends: (why it ended, the last rv seen)."""
        timeout = int(300 * (1 + self.cl.rng.random()))
        target = "%s?allowWatchBookmarks=true&resourceVersion=%s&timeoutSeconds=%d&watch=true" % (
            self.path, rv, timeout)
        hdrs = "Host: 127.0.0.1:%d\r\nUser-Agent: %s\r\nAccept: %s\r\n\r\n" % (
            self.cl.port, self.ua(), ACCEPT_TYPED if self.typed else ACCEPT_META_WATCH)
        rec = {"t": round(time.monotonic() - self.cl.t0, 3), "status": 0, "events": {}, "bytes": 0, "end": ""}
        self.watches.append(rec)
        s = socket.create_connection(("127.0.0.1", self.cl.port), timeout=IO_TIMEOUT)
        self.sock = s
        try:
            s.sendall(("GET %s HTTP/1.1\r\n" % target).encode() + hdrs.encode())
            status, h, rest = read_head(s, bytearray(), time.monotonic() + IO_TIMEOUT)
            rec["status"], rec["ctype"] = status, h.get("content-type", "")
            rec["dt_head"] = round(time.monotonic() - self.cl.t0 - rec["t"], 4)
            if status != 200:
                rec["end"] = "status %d" % status
                return rec["end"], rv
            pb = rec["ctype"].startswith("application/vnd.kubernetes.protobuf")
            chunked = "chunked" in h.get("transfer-encoding", "")
            dc = Dechunk() if chunked else None
            data = bytearray()
            pending = bytes(rest)
            while True:
                if pending:
                    rec["bytes"] += len(pending)
                    data += dc.feed(pending) if dc else pending
                    pending = b""
                    end, rv = self.events(data, pb, rec, rv)
                    if end:
                        rec["end"] = end
                        return end, rv
                    if dc and dc.done:
                        rec["end"] = "ended"
                        return "ended", rv
                if self.cl.stop.is_set():
                    rec["end"] = "stopped"
                    return "stopped", rv
                r, _, _ = select.select([s], [], [], 0.25)
                if r:
                    pending = s.recv(262144)
                    if not pending:
                        rec["end"] = "eof"
                        return "eof", rv
        finally:
            self.sock = None
            s.close()

    def events(self, data, pb, rec, rv):
        """Consume the complete events in data (in place): (end or None, rv)."""
        while True:
            if pb:
                if len(data) < 4:
                    return None, rv
                n = struct.unpack(">I", data[:4])[0]
                if len(data) < 4 + n:
                    return None, rv
                f = kpb.fields(bytes(data[4:4 + n]))
                del data[:4 + n]
                typ = kpb.s(kpb.last(f, 1, b""))
                env = kpb.last(kpb.fields(kpb.last(f, 2, b"")), 1, b"")
                if typ == "ERROR":
                    _, _, raw = kpb.envelope(env)
                    code = status_code_pb(raw)
                    rec["events"]["ERROR"] = rec["events"].get("ERROR", 0) + 1
                    return ("expired" if code == 410 else "error %s" % code), rv
                orv = pb_rv(env)[0]
            else:
                i = data.find(b"\n")
                if i < 0:
                    return None, rv
                line = bytes(data[:i])
                del data[:i + 1]
                if not line.strip():
                    continue
                ev = json.loads(line)
                typ = ev.get("type")
                if typ == "ERROR":
                    rec["events"]["ERROR"] = rec["events"].get("ERROR", 0) + 1
                    code = (ev.get("object") or {}).get("code")
                    return ("expired" if code == 410 else "error %s" % code), rv
                orv = ((ev.get("object") or {}).get("metadata") or {}).get("resourceVersion")
            rec["events"][typ] = rec["events"].get(typ, 0) + 1
            if orv:
                rv = orv

    def run(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.cl.port, timeout=IO_TIMEOUT)
        tries = 0
        rv = None
        try:
            while not self.cl.stop.is_set() and tries <= MAX_RETRIES:
                try:
                    if rv is None:
                        rv = self.do_list(conn)
                        if self.synced_at is None:
                            self.synced_at = time.monotonic() - self.cl.t0
                            self.cl.note_synced()
                    end, rv2 = self.do_watch(rv)
                    if end == "stopped":
                        return
                    tries += 1
                    if end == "expired":
                        rv = None          # 410: list again
                    elif rv2:
                        rv = rv2           # ended: watch again from the last rv
                    if end not in ("ended", "expired") and self.cl.stop.wait(1.0):
                        return
                except (OSError, HttpError, ValueError, http.client.HTTPException) as e:
                    self.errors.append("%.3f %s" % (time.monotonic() - self.cl.t0, str(e)[:200]))
                    tries += 1
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", self.cl.port, timeout=IO_TIMEOUT)
                    if self.cl.stop.wait(1.0):
                        return
        finally:
            conn.close()
            if self.synced_at is None:
                self.cl.note_synced()

    def report(self):
        return {"gvr": self.gvr, "group": self.g, "resource": self.r, "typed": self.typed, "why": self.why,
                "first_list_s": self.first_list, "synced_at": self.synced_at, "lists": self.lists,
                "watches": self.watches, "errors": self.errors[:5]}


class Client:
    def __init__(self, a):
        self.a, self.port = a, a.port
        self.t0 = time.monotonic()
        self.stop = threading.Event()
        self.rng = random.Random(a.seed)
        self.lock = threading.Lock()
        self.informers = {}
        self.discovery = []   # per request
        self.rounds = 0
        self.pending_sync = 0
        self.synced_ev = threading.Event()

    def note_synced(self):
        with self.lock:
            self.pending_sync -= 1
            if self.pending_sync <= 0:
                self.synced_ev.set()

    def get(self, conn, path, accept, ua):
        t0 = time.monotonic()
        conn.request("GET", path, headers={"Accept": accept, "User-Agent": ua})
        r = conn.getresponse()
        body = r.read()
        self.discovery.append({"path": path, "status": r.status, "dt": round(time.monotonic() - t0, 4),
                               "ctype": r.getheader("Content-Type", ""), "bytes": len(body)})
        if r.status != 200:
            raise HttpError("%s: %d" % (path, r.status))
        return body

    @staticmethod
    def decode(body):
        """A discovery answer, JSON or protobuf (APIVersions, APIGroupList,
        APIResourceList: read only for what the replay needs)."""
        if body[:4] != kpb.MAGIC:
            return json.loads(body)
        _, kind, raw = kpb.envelope(body)
        f = kpb.fields(raw)
        if kind == "APIGroupList":   # groups{1 name, 2 versions{1 groupVersion, 2 version}, 3 preferredVersion}
            out = []
            for gb in kpb.every(f, 1):
                gf = kpb.fields(gb)
                vers = [{"groupVersion": kpb.s(kpb.last(kpb.fields(x), 1, b"")),
                         "version": kpb.s(kpb.last(kpb.fields(x), 2, b""))} for x in kpb.every(gf, 2)]
                pv = kpb.fields(kpb.last(gf, 3, b""))
                out.append({"name": kpb.s(kpb.last(gf, 1, b"")), "versions": vers,
                            "preferredVersion": {"version": kpb.s(kpb.last(pv, 2, b""))}})
            return {"groups": out}
        if kind == "APIResourceList":  # 1 groupVersion, 2 resources{1 name, 2 namespaced, 3 kind, 4 verbs{1 items}}
            res = []
            for rb in kpb.every(f, 2):
                rf = kpb.fields(rb)
                verbs = [kpb.s(x) for x in kpb.every(kpb.fields(kpb.last(rf, 4, b"")), 1)]
                res.append({"name": kpb.s(kpb.last(rf, 1, b"")), "namespaced": bool(kpb.last(rf, 2, 0)),
                            "verbs": verbs})
            return {"resources": res}
        return {"kind": kind}

    def discover(self):
        """One round (ServerGroupsAndResources, then ServerPreferredResources'
        choice): [(group, version, resource, namespaced)] deletable, listable and
        watchable, in preferred versions."""
        ua = UA + "/controller-discovery"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=IO_TIMEOUT)
        try:
            self.get(conn, "/api", ACCEPT_TYPED, ua)
            groups = self.decode(self.get(conn, "/apis", ACCEPT_TYPED, ua)).get("groups") or []
            order = [("", "v1")]
            for g in groups:
                pref = (g.get("preferredVersion") or {}).get("version")
                vs = [x["version"] for x in g.get("versions") or []]
                vs.sort(key=lambda x: x != pref)
                order += [(g["name"], x) for x in vs]
            seen, out = set(), []
            for g, v in order:
                try:
                    rl = self.decode(self.get(conn, base_path(g, v), ACCEPT_TYPED, ua))
                except (HttpError, ValueError) as e:
                    self.discovery[-1]["error"] = str(e)[:100]
                    continue
                for r in rl.get("resources") or []:
                    name = r["name"]
                    if "/" in name or (g, name) in seen:
                        continue
                    seen.add((g, name))
                    verbs = set(r.get("verbs") or [])
                    if {"delete", "list", "watch"} <= verbs and (g, name) not in GC_IGNORED:
                        out.append((g, v, name, bool(r.get("namespaced"))))
            return out
        finally:
            conn.close()
            self.rounds += 1

    def start_informers(self, found):
        new = []
        wanted = set()
        for ctl, gvrs in CONTROLLERS.items():
            wanted.update(x for x in gvrs if not x.startswith("("))
        with self.lock:
            for g, v, r, ns in found:
                key = (g, r)
                if key in self.informers or len(self.informers) >= MAX_INFORMERS:
                    continue
                why = "controllers" if gvr_str(g, v, r) in wanted else "gc/quota"
                inf = Informer(self, g, v, r, ns, g in TYPED_GROUPS and not self.a.all_metadata, why)
                self.informers[key] = inf
                self.pending_sync += 1
                new.append(inf)
            if new:
                self.synced_ev.clear()
        for inf in new:
            inf.th.start()
        return new

    def out(self, d):
        sys.stdout.write(json.dumps(d) + "\n")
        sys.stdout.flush()

    def run(self):
        a = self.a
        deadline = self.t0 + a.seconds
        found = self.discover()
        controller_gvrs = set()
        for gvrs in CONTROLLERS.values():
            controller_gvrs.update(x for x in gvrs if not x.startswith("("))
        served = {gvr_str(g, v, r) for g, v, r, _ in found}
        self.out({"event": "discovered", "resources": len(found),
                  "controller_informers_not_served": sorted(controller_gvrs - served)})
        self.start_informers(found)
        announced = False
        interval = 60.0 / DISCOVERY_PER_MINUTE
        next_round = self.t0 + interval
        while True:
            now = time.monotonic()
            if now >= deadline:
                break
            if not announced and self.synced_ev.is_set():
                announced = True
                self.out({"event": "synced", "t": round(now - self.t0, 3), "informers": len(self.informers)})
            if now >= next_round:
                next_round += interval
                try:
                    new = self.start_informers(self.discover())
                    if new:
                        announced = False
                        self.out({"event": "new informers", "t": round(time.monotonic() - self.t0, 3),
                                  "gvrs": [i.gvr for i in new]})
                except (OSError, HttpError, ValueError, http.client.HTTPException) as e:
                    self.out({"event": "discovery error", "error": str(e)[:200]})
                continue
            # pacing until the next round (or the first sync), not a synchronisation
            (self.stop if announced else self.synced_ev).wait(max(0.0, min(deadline, next_round) - now))
        # the end: say so, let the parent look at kwc with everything open, then close
        self.out({"event": "closing", "t": round(time.monotonic() - self.t0, 3),
                  "watches_open": sum(1 for i in self.informers.values() if i.sock is not None)})
        if a.hold:
            sys.stdin.readline()
        self.stop.set()
        for inf in list(self.informers.values()):
            inf.th.join(IO_TIMEOUT + 5)
        self.out({"event": "done", "t": round(time.monotonic() - self.t0, 3), "rounds": self.rounds,
                  "informers": [i.report() for i in self.informers.values()], "discovery": self.discovery})

    def resume(self):
        """One list of each given resource (after the caches went idle): the
        time to the answer of a cache that resumes."""
        todo = json.loads(self.a.resume)
        res = []
        for gvr, typed in todo:
            parts = gvr.split("/")
            g, v, r = ("", parts[0], parts[1]) if len(parts) == 2 else parts
            inf = Informer(self, g, v, r, True, typed, "resume")
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=IO_TIMEOUT)
            try:
                inf.do_list(conn)
            except (OSError, HttpError, ValueError, http.client.HTTPException) as e:
                inf.errors.append(str(e)[:200])
            finally:
                conn.close()
            res.append(inf.report())
        self.out({"event": "done", "informers": res})


# ---- the scenario (run.py's side) ----

FIXED = ("v1/pods,v1/nodes,v1/namespaces,v1/services,v1/endpoints,v1/configmaps,v1/secrets,apps/v1/deployments,"
         "apps/v1/replicasets,apps/v1/daemonsets,apps/v1/statefulsets")
# (plural, group, kind, scope): made through apisim's API before the replay
CRDS = [("crontabs", "stable.example.com", "CronTab", "Namespaced"),
        ("backups", "velero.example.io", "Backup", "Namespaced"),
        ("clusterissuers", "cert.example.io", "ClusterIssuer", "Cluster")]
LATE_CRD = ("snapshots", "snapshot.example.io", "Snapshot", "Namespaced")  # made a third into the replay
# kwc's default --resources-exclude (kwc --help): their reads pass through in auto mode
DEFAULT_EXCLUDE = {"v1/events", "events.k8s.io/v1/events", "coordination.k8s.io/v1/leases"}
NOT_SEEDED = {"nodes", "namespaces", "pods", "customresourcedefinitions", "apiservices"}

METHOD = """## controller-manager: a kube-controller-manager 1.24's informers through kwc (issue 30)

`bench/run.py --only controller-manager` (bench/cm.py; `--small` for a smoke
run, nothing saved). Per variant, a fresh apisim (the generic built-in
kinds, 3 CRDs made through its API before the replay and one a third of the
way in, objects of every kind, churn over pods, leases, events,
endpointslices, configmaps and a custom resource) and a fresh kwc:

- **auto**: kwc's defaults (`--resources auto`, discovery answered by kwc),
  `--cache-idle-timeout` short so the idle phase fits in the run;
- **fixed** (the baseline, kwc before issue 30): `--resources` the old
  default list of 11 and `--serve-discovery=false`.

The replay (bench/cm.py's docstring has the sources): one reflector per
resource the garbage collector monitors (every resource whose verbs include
delete, list and watch, preferred versions, core events ignored; every
controller informer is one of them), typed in protobuf (`Accept:
application/vnd.kubernetes.protobuf, */*`) for what client-go's typed
factory knows, metadata-only (PartialObjectMetadata, protobuf first) for
CRDs, APIServices and custom resources; ListAndWatch each (list rv=0
limit=500, then a watch from its rv with bookmarks); discovery (/api, /apis,
/api/v1, every /apis/G/V) 7 times a minute. All started at once, as the
informer factory does.

Who answered a read: apisim's request log (`/apisim/requests`) holds every
request that reached it, the replay's recognised by its User-Agent; a read
the client made that apisim never saw was answered by kwc. kwc's own
`kwc_requests_total{source}` (scraped after the watches ended: watches count
when they end) is shown beside it as a check. Time to first sync: from
sending a resource's first list to the end of its answer (kwc waits for a
new cache's first sync, up to `--cache-start-timeout`). Memory: kwc's VmRSS
and RssAnon after start (auto: the default protobuf caches of
`--protobuf-resources` run from the start), at the end of the replay with
every informer watching, and after the replay's connections closed and
every cache but the pinned ones (`--protobuf-resources`, never stopped)
stopped for `--cache-idle-timeout`; then one list per resource again (the
caches resume from their resourceVersion).
"""


class LineReader:
    """Lines of a child's stdout (binary pipe) within a deadline."""

    def __init__(self, p):
        self.p, self.buf = p, b""

    def line(self, timeout):
        end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.p.stdout], [], [], left)[0]:
                raise RuntimeError("the replay printed nothing in %.0f s" % timeout)
            b = os.read(self.p.stdout.fileno(), 1 << 20)
            if not b:
                raise RuntimeError("the replay ended without a result (exit %s)" % self.p.wait())
            self.buf += b
        ln, self.buf = self.buf.split(b"\n", 1)
        return json.loads(ln)


def sizes(args):
    small = args.small
    pods = args.cm_pods
    return {"seconds": args.cm_duration, "pods": pods, "nodes": max(10, pods // 30), "namespaces": 5 if small else 20,
            "per_kind": 10 if small else 100, "crs": 20 if small else 200, "churn": 20 if small else 100,
            "idle": 5 if small else 15}


def crd_doc(plural, group, kind, scope):
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "%s.%s" % (plural, group)},
            "spec": {"group": group, "scope": scope,
                     "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": kind + "List"},
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": {"type": "object",
                                                                  "x-kubernetes-preserve-unknown-fields": True}}}]}}


def make_crd(R, env, c):
    st, _, b = R.http_request(env.apisim.port, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                              body=json.dumps(crd_doc(*c)).encode(), headers={"Content-Type": "application/json"})
    if st != 201:
        raise RuntimeError("CRD %s: %d %s" % (c[0], st, b[:200]))
    R.wait_for(lambda: R.http_request(env.apisim.port, "GET", "/apis/%s/v1" % c[1])[0] == 200, 10,
               "CRD %s served" % c[0])


def populate(R, env, sz):
    """CRDs, objects of every deletable kind, churn."""
    for c in CRDS:
        make_crd(R, env, c)
    groups = env.sim("GET", "/apis")["groups"]
    gvs = [("", "v1")] + [(g["name"], g["preferredVersion"]["version"]) for g in groups]
    seeded = {}
    for g, v in gvs:
        for r in env.sim("GET", base_path(g, v))["resources"]:
            name = r["name"]
            if "/" in name or name in NOT_SEEDED or not {"create", "list", "delete"} <= set(r["verbs"]):
                continue
            key = name if not g else "%s.%s/%s" % (name, g, v)
            n = sz["crs"] if g.endswith(".example.com") or g.endswith(".example.io") else sz["per_kind"]
            env.sim("POST", "/apisim/seed", {"resource": key, "count": n, "namespaces": sz["namespaces"]})
            seeded[gvr_str(g, v, name)] = n
    churn = ["pods", "leases.coordination.k8s.io/v1", "events", "endpointslices.discovery.k8s.io/v1", "configmaps",
             "crontabs.stable.example.com/v1"]
    env.sim("POST", "/apisim/churn", {"rate": sz["churn"], "resources": churn})
    return seeded, churn


def metrics(R, k):
    st, _, b = R.http_request(k.port, "GET", "/metrics", timeout=30)
    if st != 200:
        raise RuntimeError("/metrics: %d" % st)
    return b.decode()


def R_prom(text, name, **labels):
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line[len(name):len(name) + 1] not in ("{", " "):
            continue
        if all('%s="%s"' % kv in line for kv in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def mem(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k = line.split(":", 1)[0]
            if k in ("VmRSS", "RssAnon", "RssFile"):
                out[k] = int(line.split()[1])
    return out


def upstream_log(env, since):
    return [q for q in env.sim("GET", "/apisim/requests?since=%d" % since)["requests"]]


def classify(target):
    path, _, q = target.partition("?")
    segs = [x for x in path.split("/") if x]
    if path in ("/api", "/apis") or (segs[:1] == ["api"] and len(segs) == 2) or \
            (segs[:1] == ["apis"] and len(segs) in (2, 3)):
        return path, "discovery"
    return path, "watch" if "watch=true" in q.split("&") else "list"


def run_replay(args, R, env, k, sz, late_crd=True, all_metadata=False):
    """The replay against kwc k: the client's report plus what kwc and apisim saw."""
    seq0 = env.sim("GET", "/apisim/requests?since=999999999")["seq"]
    argv = [PYTHON, os.path.abspath(__file__), "--client", "--port", str(k.port), "--seconds",
            str(sz["seconds"]), "--hold"] + (["--all-metadata"] if all_metadata else [])
    res = {"mem_start": mem(k.pid), "metrics_start": metrics(R, k)}
    sampler = R.Sampler(k.pid, every=0.2)
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    t_spawn = time.monotonic()
    timer = None
    late = {}
    if late_crd:
        def make_late():
            try:
                make_crd(R, env, LATE_CRD)
                env.sim("POST", "/apisim/seed", {"resource": "%s.%s/v1" % (LATE_CRD[0], LATE_CRD[1]),
                                                 "count": sz["crs"], "namespaces": sz["namespaces"]})
                late["t"] = time.monotonic() - t_spawn
            except Exception as e:  # noqa: BLE001 (reported, the replay goes on)
                late["error"] = str(e)[:200]
        timer = threading.Timer(sz["seconds"] / 3.0, make_late)
        timer.start()
    lr = LineReader(p)
    events = []
    try:
        while True:
            ev = lr.line(sz["seconds"] + 120)
            events.append({k2: v for k2, v in ev.items() if k2 not in ("informers", "discovery")})
            if ev["event"] == "closing":
                res["mem_end"] = mem(k.pid)
                res["metrics_end"] = metrics(R, k)
                p.stdin.write(b"go\n")
                p.stdin.flush()
                res["t_close"] = time.monotonic()  # the replay closes its connections now
            elif ev["event"] == "done":
                res["client"] = ev
                break
        p.wait(30)
    finally:
        if timer:
            timer.cancel()
        if p.poll() is None:
            p.kill()
            p.wait()
        res["peak"] = sampler.stop()
    res["events"], res["late"] = events, late
    # watches count in kwc_requests_total when they end: wait until kwc has
    # counted every one the client opened (bounded)
    nwatch = sum(len(i["watches"]) for i in res["client"]["informers"])

    def counted():
        t = metrics(R, k)
        res["metrics_after"] = t
        return R_prom(t, "kwc_requests_total", verb="WATCH") >= nwatch
    try:
        R.wait_for(counted, 20, "kwc to count the replay's watches")
    except Exception as e:  # noqa: BLE001
        res["watch_count_note"] = str(e)[:200]
    res["upstream"] = upstream_log(env, seq0)
    return res


def idle_and_resume(args, R, env, k, sz, rep):
    """auto: every cache stops after --cache-idle-timeout with nobody reading;
    then one list of each resource again."""
    t0 = rep.get("t_close") or time.monotonic()
    out = {}
    # the caches kwc started with (--protobuf-resources) are pinned: never
    # stopped for idleness; every other one stops
    pinned = R_prom(rep["metrics_start"], "kwc_caches_running")

    def stopped():
        return R_prom(metrics(R, k), "kwc_caches_running") <= pinned
    try:
        R.wait_for(stopped, sz["idle"] + 90, "every cache but the pinned ones stopped", interval=0.25)
        out["stop_s"] = time.monotonic() - t0
    except Exception as e:  # noqa: BLE001
        out["stop_error"] = str(e)[:200]
    out["mem_idle"] = mem(k.pid)
    out["metrics_idle"] = metrics(R, k)
    todo = [[i["gvr"], i["typed"]] for i in rep["client"]["informers"]]
    seq0 = env.sim("GET", "/apisim/requests?since=999999999")["seq"]
    p = subprocess.Popen([PYTHON, os.path.abspath(__file__), "--client", "--port", str(k.port), "--resume",
                          json.dumps(todo)], stdout=subprocess.PIPE)
    try:
        out["resume"] = LineReader(p).line(len(todo) * 15 + 30)["informers"]
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    out["resume_upstream"] = upstream_log(env, seq0)
    out["mem_resumed"] = mem(k.pid)
    out["metrics_resumed"] = metrics(R, k)
    return out


def pctl(v, p):
    if not v:
        return None
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


def analyse(rep):
    """Numbers of one variant from its raw report."""
    infs = rep["client"]["informers"]
    by_path = {}
    for i in infs:
        g, r = i["group"], i["resource"]
        v = i["gvr"].split("/")[-2]
        by_path[base_path(g, v) + "/" + r] = i
    up = {"list": {}, "watch": {}, "discovery": 0}
    own = {"list": 0, "watch": 0, "discovery": 0, "other": 0}
    for q in rep["upstream"]:
        path, kind = classify(q["target"])
        if UA_MARK in (q["headers"].get("user-agent") or ""):
            if kind == "discovery":
                up["discovery"] += 1
            else:
                up[kind][path] = up[kind].get(path, 0) + 1
        else:
            own[kind if kind in own else "other"] += 1
    rows = []
    for path, i in by_path.items():
        lu, wu = up["list"].get(path, 0), up["watch"].get(path, 0)
        ev = {}
        for w in i["watches"]:
            for t, n in w["events"].items():
                ev[t] = ev.get(t, 0) + n
        rows.append({"gvr": i["gvr"], "group": i["group"], "typed": i["typed"], "why": i["why"],
                     "ttfs": i["first_list_s"],
                     "lists": len(i["lists"]), "lists_up": lu, "watches": len(i["watches"]), "watches_up": wu,
                     "events": ev, "statuses": sorted({x["status"] for x in i["lists"] + i["watches"]}),
                     "ctype": (i["lists"][0]["ctype"] if i["lists"] else ""), "errors": i["errors"],
                     "items": (i["lists"][0].get("items") if i["lists"] else None)})
    L = sum(r["lists"] for r in rows)
    W = sum(r["watches"] for r in rows)
    Lu = sum(r["lists_up"] for r in rows)
    Wu = sum(r["watches_up"] for r in rows)
    disc = rep["client"]["discovery"]
    m = rep.get("metrics_after") or rep["metrics_end"]
    m0 = rep["metrics_start"]

    def md(name, **lb):
        return R_prom(m, name, **lb) - R_prom(m0, name, **lb)
    ttfs = [r["ttfs"] for r in rows if r["ttfs"] is not None]
    slow = max(rows, key=lambda r: r["ttfs"] or 0) if rows else None
    a = {"rows": sorted(rows, key=lambda r: r["gvr"]), "informers": len(rows),
         "typed": sum(1 for r in rows if r["typed"]), "reads": L + W, "lists": L, "watches": W,
         "reads_up": Lu + Wu, "lists_up": Lu, "watches_up": Wu,
         "first_from_cache": sum(1 for r in rows if r["lists"] and r["lists_up"] == 0),
         "kwc_cache_reads": md("kwc_requests_total", verb="LIST", source="cache") +
         md("kwc_requests_total", verb="WATCH", source="cache"),
         "kwc_upstream_reads": md("kwc_requests_total", verb="LIST", source="upstream") +
         md("kwc_requests_total", verb="WATCH", source="upstream"),
         "ttfs_p50": pctl(ttfs, 50), "ttfs_p90": pctl(ttfs, 90), "ttfs_max": pctl(ttfs, 100),
         "ttfs_slowest": slow["gvr"] if slow else "",
         "disc": len(disc), "disc_up": up["discovery"], "disc_bad": sum(1 for d in disc if d["status"] != 200),
         "disc_kwc_cache": md("kwc_discovery_requests_total", source="cache"),
         "disc_kwc_upstream": md("kwc_discovery_requests_total", source="upstream"),
         "own": own, "events": sum(sum(r["events"].values()) for r in rows),
         "bad": sum(1 for r in rows if any(s != 200 for s in r["statuses"]) or r["errors"]),
         "caches_end": R_prom(rep["metrics_end"], "kwc_caches"),
         "running_end": R_prom(rep["metrics_end"], "kwc_caches_running"),
         "caches_start": R_prom(m0, "kwc_caches_running")}
    a["share"] = 100.0 * (a["reads"] - a["reads_up"]) / a["reads"] if a["reads"] else 0.0
    new_inf = [e for e in rep["events"] if e["event"] == "new informers"]
    a["late"] = {"created": rep["late"].get("t"), "error": rep["late"].get("error"),
                 "watched": new_inf[0]["t"] if new_inf else None,
                 "gvrs": new_inf[0]["gvrs"] if new_inf else []}
    synced = [e for e in rep["events"] if e["event"] == "synced"]
    a["all_synced"] = synced[0]["t"] if synced else None
    return a


def kib(v):
    return "%.1f MiB" % (v / 1024.0)


def fmt_s(v):
    return "-" if v is None else ("%.0f ms" % (v * 1000) if v < 1 else "%.2f s" % v)


def report(args, R, res, sz, t_total):
    ver = subprocess.run([args.kwc, "--version"], capture_output=True, text=True).stdout.strip()
    try:
        commit = R.git("rev-parse", "--short", "HEAD") + (
            " (dirty)" if R.git("status", "--porcelain", "--", "proxy", "cache", "include") else "")
    except Exception:  # noqa: BLE001
        commit = "?"
    if not os.path.abspath(args.kwc).startswith(os.path.abspath(os.path.join(HERE, "..")) + os.sep):
        commit = "of the bench; kwc built elsewhere"
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    title = "%s (%s, tree %s), %d x %s, %s: %d s replay, %d pods, %d nodes, %d objects per kind, %d per custom " \
        "resource, churn %d/s" % (R.shown_kwc(args.kwc), ver, commit, os.cpu_count() or 0, cpu,
                                  "small" if args.small else "full", sz["seconds"], sz["pods"], sz["nodes"],
                                  sz["per_kind"], sz["crs"], sz["churn"])
    if args.cm_label:
        title = args.cm_label + ": " + title
    head = ["kwc", "informers (typed / metadata)", "reads (lists + watches)", "answered by kwc's cache",
            "share", "resources whose lists came from the cache", "kwc_requests_total cache / upstream",
            "time to first sync p50 / p90 / max (slowest)", "discovery requests: by kwc / passed through",
            "kwc RSS end (anon) / peak", "caches running at the end", "non-200 or errors"]
    rows = []
    for label, r in res.items():
        if "error" in r:
            rows.append([label, "failed: %s" % r["error"]] + [""] * (len(head) - 2))
            continue
        a = r["a"]
        rows.append([
            label, "%d (%d / %d)" % (a["informers"], a["typed"], a["informers"] - a["typed"]),
            "%d (%d + %d)" % (a["reads"], a["lists"], a["watches"]),
            "%d (lists %d, watches %d)" % (a["reads"] - a["reads_up"], a["lists"] - a["lists_up"],
                                           a["watches"] - a["watches_up"]),
            "**%.1f %%**" % a["share"], "%d of %d" % (a["first_from_cache"], a["informers"]),
            "%d / %d" % (a["kwc_cache_reads"], a["kwc_upstream_reads"]),
            "%s / %s / %s (%s)" % (fmt_s(a["ttfs_p50"]), fmt_s(a["ttfs_p90"]), fmt_s(a["ttfs_max"]),
                                   a["ttfs_slowest"]),
            "%d: %d / %d" % (a["disc"], a["disc"] - a["disc_up"], a["disc_up"]),
            "%s (%s) / %s" % (kib(r["mem_end"]["VmRSS"]), kib(r["mem_end"]["RssAnon"]), kib(r["peak"]["VmRSS"])),
            "%d" % a["running_end"], "%d" % a["bad"]])
    text = R.table(title, head, rows)
    notes = []
    for label, r in res.items():
        if "error" in r:
            continue
        a = r["a"]
        up_rows = [x for x in a["rows"] if x["lists_up"] or x["watches_up"]]
        def why(x):
            if label != "auto":
                return ""
            if x["gvr"] in DEFAULT_EXCLUDE:
                return ", --resources-exclude"
            if not x["typed"] and x["group"] not in TYPED_GROUPS | {"apiextensions.k8s.io", "apiregistration.k8s.io"}:
                return ", custom resource metadata-only"
            return ""
        notes.append("%s: %d reads passed through: %s." % (
            label, a["reads_up"], ", ".join("%s (%d lists, %d watches%s)" % (
                x["gvr"], x["lists_up"], x["watches_up"], why(x)) for x in up_rows) or "none"))
        notes.append("%s: kwc's own upstream requests meanwhile: %d lists, %d watches, %d discovery, %d other; "
                     "kwc_discovery_requests_total cache %d / upstream %d (the client sent %d discovery "
                     "requests, %d reached apisim); %d watch events delivered to the replay; all informers "
                     "synced %s after start." % (
                         label, a["own"]["list"], a["own"]["watch"], a["own"]["discovery"], a["own"]["other"],
                         a["disc_kwc_cache"], a["disc_kwc_upstream"], a["disc"], a["disc_up"], a["events"],
                         fmt_s(a["all_synced"])))
        lt = a["late"]
        if lt["created"] is not None or lt["error"]:
            notes.append("%s: the CRD made mid-run (%s) was created %s after the replay started; its informer "
                         "started at %s (%s)." % (
                             label, "%s.%s" % LATE_CRD[:2], fmt_s(lt["created"]) if lt["created"] else lt["error"],
                             fmt_s(lt["watched"]) if lt["watched"] else "never (not in discovery before the end)",
                             ", ".join(lt["gvrs"]) or "-"))
        bad = [x for x in a["rows"] if any(s != 200 for s in x["statuses"]) or x["errors"]]
        for x in bad:
            notes.append("%s: %s answered %s %s" % (label, x["gvr"], x["statuses"], "; ".join(x["errors"])[:300]))
    text += "\n" + "\n".join("- " + n for n in notes) + "\n"
    auto = res.get("auto")
    if auto and "error" not in auto and "idle" in auto:
        a, idle = auto["a"], auto["idle"]
        m_end, m_idle, m_start, m_res = auto["mem_end"], idle["mem_idle"], auto["mem_start"], idle["mem_resumed"]
        running = a["running_end"]
        stopped_n = R_prom(idle["metrics_idle"], "kwc_cache_lifecycle_total", event="idle_stopped")
        res_rows = idle.get("resume") or []
        res_t = [x["first_list_s"] for x in res_rows if x["first_list_s"] is not None]
        up_paths = {classify(q["target"])[0] for q in idle["resume_upstream"]
                    if UA_MARK in (q["headers"].get("user-agent") or "")}
        relists = sum(1 for q in idle["resume_upstream"] if UA_MARK not in (q["headers"].get("user-agent") or "")
                      and classify(q["target"])[1] == "list")
        from_cache = sum(1 for x in res_rows if base_path(x["group"], x["gvr"].split("/")[-2]) + "/" + x["resource"]
                         not in up_paths)
        grow = running - a["caches_start"]

        def per(m1, m0, f):
            return (m1[f] - m0[f]) / grow if grow > 0 else 0
        head2 = ["auto: memory and idle caches", "VmRSS", "RssAnon", "RssFile", "caches running"]
        rows2 = [["after start (%d caches of --protobuf-resources)" % a["caches_start"], kib(m_start["VmRSS"]),
                  kib(m_start["RssAnon"]), kib(m_start["RssFile"]), "%d" % a["caches_start"]],
                 ["end of the replay, every informer watching", kib(m_end["VmRSS"]), kib(m_end["RssAnon"]),
                  kib(m_end["RssFile"]), "%d" % running],
                 ["all but those stopped (%s after the replay closed; %d idle stops)" % (
                     fmt_s(idle.get("stop_s")) if "stop_s" in idle else idle.get("stop_error"), stopped_n),
                  kib(m_idle["VmRSS"]), kib(m_idle["RssAnon"]), kib(m_idle["RssFile"]),
                  "%d" % R_prom(idle["metrics_idle"], "kwc_caches_running")],
                 ["after one list of each resource again (resumed)", kib(m_res["VmRSS"]), kib(m_res["RssAnon"]),
                  kib(m_res["RssFile"]), "%d" % R_prom(idle["metrics_resumed"], "kwc_caches_running")]]
        text += "\n" + R.table("auto: kwc's memory by phase", head2, rows2)
        text += "\n- per cache the replay started (%d): running %.0f KiB VmRSS, %.0f KiB anon (end - start); " \
            "stopped %.0f KiB VmRSS, %.0f KiB anon (all stopped - start); freed by stopping %.0f KiB VmRSS, " \
            "%.0f KiB anon (end - all stopped).\n" % (
                grow, per(m_end, m_start, "VmRSS"), per(m_end, m_start, "RssAnon"), per(m_idle, m_start, "VmRSS"),
                per(m_idle, m_start, "RssAnon"), per(m_end, m_idle, "VmRSS"), per(m_end, m_idle, "RssAnon"))
        text += "- resumed: %d lists after the caches stopped, %d answered by kwc's cache (the rest passed " \
            "through), p50 %s, max %s (the first sync of the replay: p50 %s, max %s); kwc relisted %d " \
            "resources upstream to resume.\n" % (
                len(res_rows), from_cache, fmt_s(pctl(res_t, 50)), fmt_s(pctl(res_t, 100)),
                fmt_s(a["ttfs_p50"]), fmt_s(a["ttfs_max"]), relists)
    # per resource
    if auto and "error" not in auto:
        base = res.get("fixed", {}).get("a", {"rows": []})
        brow = {x["gvr"]: x for x in base["rows"]}
        head3 = ["resource", "informer", "objects", "auto: first sync", "auto: list / watch by", "auto: events",
                 "fixed: list / watch by", "fixed: first list"]
        rows3 = []

        def by(x):
            if not x:
                return "-"
            return "%s / %s" % ("upstream" if x["lists_up"] else "cache", "upstream" if x["watches_up"] else "cache")
        for x in auto["a"]["rows"]:
            b = brow.get(x["gvr"])
            rows3.append([x["gvr"], ("typed" if x["typed"] else "metadata") + (" (%s)" % x["why"]),
                          x["items"] if x["items"] is not None else "-", fmt_s(x["ttfs"]), by(x),
                          sum(x["events"].values()), by(b), fmt_s(b["ttfs"]) if b else "-"])
        text += "\n" + R.table("per resource", head3, rows3)
    text += "\nScenario time %.0f s.\n" % t_total
    return text


def start_env(R, sz):
    env = R.Env(apisim_args=["--nodes", str(sz["nodes"]), "--pods", str(sz["pods"]), "--namespaces",
                             str(sz["namespaces"]), "--recent-requests", "1000000", "--seed", "1",
                             "--history", "100000"], start_kwc=False)
    return env, populate(R, env, sz)


def bench_controller_manager(args, R):
    sz = sizes(args)
    t0 = time.monotonic()
    variants = [("fixed", ["--resources", FIXED, "--serve-discovery=false", "--log-level", "warn"]),
                ("auto", ["--cache-idle-timeout", "%ds" % sz["idle"], "--log-level", "warn"])]
    res = {}
    for label, flags in variants:
        env = k = None
        try:
            env, _ = start_env(R, sz)
            k = R.Kwc(args, env, R.Variant(label, args.kwc, False), "cm-" + label, base=flags, ready_timeout=60)
            if label == "auto":
                R.wait_for(lambda: R_prom(metrics(R, k), "kwc_discovery_ready") == 1, 30, "kwc's discovery")
            rep = run_replay(args, R, env, k, sz, all_metadata=args.cm_all_metadata)
            rep["a"] = analyse(rep)
            if label == "auto":
                rep["idle"] = idle_and_resume(args, R, env, k, sz, rep)
            res[label] = rep
            print("%s: %d reads, %.1f %% from kwc's cache" % (label, rep["a"]["reads"], rep["a"]["share"]),
                  flush=True)
        except Exception as e:  # noqa: BLE001 (the other variant still runs; the table says why)
            import traceback
            traceback.print_exc()
            res[label] = {"error": str(e)[:200]}
            if env is not None:
                env.dump_logs()
        finally:
            if k is not None:
                k.stop()
            if env is not None:
                env.close()
    raw = os.path.join(tempfile.gettempdir(), "kwc-bench-controller-manager-%d.json" % os.getpid())
    with open(raw, "w") as f:
        json.dump({"sizes": sz, "results": res}, f)
    print("raw results: %s" % raw, flush=True)
    text = report(args, R, res, sz, time.monotonic() - t0)
    print(text, flush=True)
    if not R.SAVE:
        print("(not saved to bench/results/controller-manager.md: %s)\n" % R.NOTE)
        return
    os.makedirs(R.RESULTS, exist_ok=True)
    out = os.path.join(R.RESULTS, "controller-manager.md")
    fresh = not os.path.exists(out)
    with open(out, "a") as f:
        if fresh:
            f.write(METHOD + "\n")
        f.write(text + "\n")
    print("saved to %s" % out, flush=True)


def client_main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--client", action="store_true")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hold", action="store_true", help="wait for a line on stdin before closing the watches")
    ap.add_argument("--all-metadata", action="store_true",
                    help="every informer metadata-only (not KCM 1.24: exercises kwc's metadata answers)")
    ap.add_argument("--resume", default=None, help="JSON [[gvr, typed]...]: one list each, then exit")
    a = ap.parse_args()
    c = Client(a)
    if a.resume:
        c.resume()
    else:
        c.run()


if __name__ == "__main__" and "--client" in sys.argv:
    client_main()
