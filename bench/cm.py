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
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))
import kpb  # noqa: E402

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
