"""Protobuf from the cache (issue 13).

kwc keeps a second cache per built-in resource holding the upstream's
protobuf bytes, and answers `Accept: application/vnd.kubernetes.protobuf`
lists, gets and watches from it. apisim encodes protobuf with its own
encoder; the tests read kwc's answers with tests/lib/kpb.py, a decoder
independent of both.

- The list/get differential matrix (10_differential) and the watch tests
  (11_watch: every mode, errors, bookmarks, the 504 ERROR event, and the
  seeded model test: no gap, duplicate or reordering, final state per
  watcher) run again with protobuf clients: byte for byte against apisim.
- The protobuf and the JSON answers hold the same objects (decoded
  independently): lists at one rv, gets, and the events of a scripted churn.
- JSON and protobuf watchers on one resource under churn: one upstream watch
  per encoding, every watcher ends in the upstream's state.
- A forced 410 relist keeps protobuf watchers open, rvs never go back.
- Malformed protobuf from the upstream (a truncated frame, a length past the
  end of its message, a wrong magic, a broken list page) is logged, refetched,
  never served and never crashes kwc.
- A protobuf cache outside --protobuf-resources starts on its first request
  (passed through meanwhile) and does not hold /readyz back before that.
"""
import http.client
import http.server
import importlib.util
import json
import os
import random
import socketserver
import struct
import threading
import time
import unittest
import urllib.parse

import kpb
from cluster import Env, http_request, wait_for
from watchstream import Stream, pump, read_until_end

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# the JSON test modules, parameterised by encoding (their classes are not bound
# to names here, so the loader does not run the JSON versions a second time)
_m10 = _load("10_differential")
_m11 = _load("11_watch")

PB = kpb.ACCEPT
PB_HDR = {"Accept": PB}
JSON_HDR = {"Accept": "application/json"}


def pb_flags(resources):
    return ["--protobuf-resources", resources]


class DifferentialProtobuf(_m10.Differential):
    ACCEPT = PB_HDR
    CT = kpb.CT
    KWC_ARGS = pb_flags("v1/pods,v1/nodes,v1/namespaces,apps/v1/deployments")


META_PB_LIST = {"Accept": "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"}
META_PB_GET = {"Accept": "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"}
META_JSON_LIST = {"Accept": "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"}
META_JSON_GET = {"Accept": "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"}


class DifferentialProtobufMeta(_m10.Differential):
    """Metadata only in protobuf (issue 23): PartialObjectMetadataList for the
    list matrix (every rv mode, limit/continue chains, selectors) and
    PartialObjectMetadata for the gets, derived from the protobuf cache's
    stored objects, byte for byte against apisim. A custom resource has no
    protobuf cache: its metadata in protobuf is derived from its JSON cache
    (kube converts the unstructured object to a typed PartialObjectMetadata),
    byte for byte against apisim all the same."""
    ACCEPT = META_PB_LIST
    CT = kpb.CT
    KWC_ARGS = pb_flags("v1/pods,v1/nodes,v1/namespaces,apps/v1/deployments")

    def ct_for(self, path):
        return self.CT

    @classmethod
    def quiesce(cls):
        """As the JSON one, each cache caught up in both encodings (a custom
        resource's protobuf metadata: its JSON cache, derived)."""
        e = cls.env
        e.sim("POST", "/apisim/churn", {"rate": 0})
        rv = e.sim("GET", "/apisim/stats")["rv"]
        for path in ("/api/v1/pods", "/api/v1/nodes", "/api/v1/namespaces", "/apis/apps/v1/deployments",
                     "/apis/example.com/v1/widgets"):
            for accept in (cls.ACCEPT, JSON_HDR):
                def reached(path=path, accept=accept):
                    lists = cls.lists_upstream_of(e)
                    st, _, b = http_request(e.kwc.port, "GET", path + "?resourceVersion=0", headers=accept)
                    return st == 200 and _m10.body_rv(b) >= rv and cls.lists_upstream_of(e) == lists
                wait_for(reached, 30, "kwc to reach rv %d on %s (%s)" % (rv, path, accept["Accept"]))
        return rv

    def check(self, path, exact=False, served=None, variant=None):
        if _m10.is_get(path) and ("/missing" in path or "/nope" in path):
            served = False  # a metadata get's 404 in protobuf: the upstream's
        return super().check(path, exact=exact, served=served, variant=variant)

    def variant_req(self, path, variant):
        """A get asks for PartialObjectMetadata, a list for the List kind
        (a variant whose raw headers name an Accept says itself)."""
        p, h = super().variant_req(path, variant)
        own = isinstance(variant, tuple) and any(k == "Accept" for k, _ in variant[1])
        if _m10.is_get(path) and not own:
            h["Accept"] = h["Accept"].replace(META_PB_LIST["Accept"], META_PB_GET["Accept"])
        return p, h

    def test_0_metadata_is_derived(self):
        """The answer is PartialObjectMetadata (kind in the envelope, each item
        only its ObjectMeta), JSON and protobuf, served from the cache, an
        empty list's items as kube writes them, and the wrong pairing (as=...List
        on a get) passed on."""
        e = self.env
        cur = self.quiesce()
        st, hdr, b = http_request(e.kwc.port, "GET", "/api/v1/pods?resourceVersion=0", headers=META_PB_LIST)
        self.assertEqual(st, 200)
        d = kpb.decode_body(b)
        self.assertEqual((d["kind"], d["apiVersion"]), ("PartialObjectMetadataList", "meta.k8s.io/v1"))
        self.assertTrue(d["raw_items"])
        for raw in d["raw_items"]:
            self.assertEqual([n for n, _, _ in kpb.fields(raw)], [1], "an item is {1: ObjectMeta} only")
        for path, hdrs in (("/api/v1/pods?resourceVersion=0", META_JSON_LIST),
                           ("/apis/example.com/v1/widgets?resourceVersion=0", META_JSON_LIST),
                           ("/api/v1/pods?resourceVersion=0&labelSelector=nothing%3Dhere", META_JSON_LIST),
                           ("/apis/example.com/v1/widgets?resourceVersion=0&labelSelector=nothing%3Dhere",
                            META_JSON_LIST),
                           ("/api/v1/namespaces/ns-1/pods/pod-4?resourceVersion=0", META_JSON_GET),
                           ("/apis/example.com/v1/namespaces/ns-1/widgets/widget-1?resourceVersion=0",
                            META_JSON_GET),
                           ("/api/v1/pods?resourceVersion=0&labelSelector=nothing%3Dhere", META_PB_LIST),
                           ("/apis/example.com/v1/widgets?resourceVersion=0", META_PB_LIST),
                           ("/apis/example.com/v1/namespaces/ns-1/widgets?resourceVersion=0&limit=2",
                            META_PB_LIST),
                           ("/apis/example.com/v1/widgets?resourceVersion=0&labelSelector=nothing%3Dhere",
                            META_PB_LIST),
                           ("/apis/example.com/v1/namespaces/ns-1/widgets/widget-1?resourceVersion=0",
                            META_PB_GET)):
            before = self.lists_upstream()
            k = http_request(e.kwc.port, "GET", path, headers=hdrs)
            self.assertEqual(self.lists_upstream(), before, "%s (%s) went upstream" % (path, hdrs["Accept"]))
            s = http_request(e.apisim.port, "GET", path, headers=hdrs)
            self.assertEqual(k[0], 200, path)
            self.assertEqual(k[2], s[2], "%s (%s)" % (path, hdrs["Accept"]))
            self.assertEqual(k[1].get("content-type"), s[1].get("content-type"), path)
        self.assertIn(b'"items":null', http_request(
            e.kwc.port, "GET", "/api/v1/pods?resourceVersion=0&labelSelector=nothing%3Dhere",
            headers=META_JSON_LIST)[2])
        # as=PartialObjectMetadataList on a get: kube's 406, the upstream's to say
        self.check("/api/v1/namespaces/ns-1/pods/pod-4?resourceVersion=%d" % cur, served=False,
                   variant=("", (("Accept", META_PB_LIST["Accept"]),)))


class WatchDifferentialProtobuf(_m11.WatchDifferential):
    ACCEPT = PB
    CT = kpb.CT_WATCH
    KWC_ARGS = pb_flags("v1/pods,apps/v1/deployments")


class WatchModelProtobuf(_m11.WatchModel):
    ACCEPT = PB
    KWC_ARGS = pb_flags("v1/pods")


def lists_upstream(env, resource=None):
    return sum(v for k, v in env.stats()["requests"].items()
               if k.startswith("list ") and (resource is None or k == "list " + resource))


def served_rv(env, path, hdr):
    """The rv of kwc's own answer to path?resourceVersion=0 (0 when kwc passed
    it upstream: that cache is not serving)."""
    n = lists_upstream(env)
    st, h, b = http_request(env.kwc.port, "GET", path + "?resourceVersion=0", headers=hdr)
    if st != 200 or lists_upstream(env) != n:
        return 0
    d = kpb.decode_body(b) if b[:4] == kpb.MAGIC else json.loads(b)
    return int(d["metadata"]["resourceVersion"])


def quiesce(env, paths=("/api/v1/pods",)):
    env.sim("POST", "/apisim/churn", {"rate": 0})
    rv = env.stats()["rv"]
    for p in paths:
        for hdr in (JSON_HDR, PB_HDR):
            wait_for(lambda p=p, hdr=hdr: served_rv(env, p, hdr) >= rv, 30,
                     "kwc's %s cache of %s at rv %d" % (hdr["Accept"], p, rv))
    return rv


def comparable(o):
    """The fields both encodings carry, from a JSON object or a kpb one."""
    md = o["metadata"]
    spec = o.get("spec") or {}
    return {
        "name": md["name"], "namespace": md.get("namespace", ""), "uid": md.get("uid", ""),
        "resourceVersion": md["resourceVersion"], "labels": md.get("labels") or {},
        "annotations": md.get("annotations") or {},
        "nodeName": spec.get("nodeName", ""),
        "containers": [(c["name"], c.get("image", "")) for c in spec.get("containers") or []],
        "phase": (o.get("status") or {}).get("phase", ""),
    }


class SameObjects(unittest.TestCase):
    """Decoded independently of kwc, the protobuf answers hold the objects
    the JSON answers hold."""

    def test_lists_gets_and_events(self):
        with Env(apisim_args=["--pods", "60", "--namespaces", "3", "--nodes", "3", "--history", "100000"],
                 kwc_args=["--resources", "v1/pods,v1/nodes"] + pb_flags("v1/pods,v1/nodes")) as e:
            r0 = quiesce(e, ("/api/v1/pods", "/api/v1/nodes"))
            for path in ("/api/v1/pods", "/api/v1/namespaces/ns-1/pods", "/api/v1/nodes",
                         "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1",
                         "/api/v1/pods?labelSelector=app%3Dapp-1"):
                sep = "&" if "?" in path else "?"
                st, h, b = http_request(e.kwc.port, "GET", path + sep + "resourceVersion=%d" % r0, headers=PB_HDR)
                self.assertEqual(st, 200, b[:300])
                self.assertEqual(h.get("content-type"), kpb.CT)
                pbl = kpb.decode_body(b)
                st, h, b = http_request(e.kwc.port, "GET", path + sep + "resourceVersion=%d" % r0, headers=JSON_HDR)
                js = json.loads(b)
                self.assertEqual(pbl["metadata"]["resourceVersion"], js["metadata"]["resourceVersion"])
                self.assertEqual(pbl["kind"], js["kind"])
                self.assertGreater(len(js["items"]), 0, path)
                self.assertEqual([comparable(i) for i in pbl["items"]], [comparable(i) for i in js["items"]], path)
            for path in ("/api/v1/namespaces/ns-1/pods/pod-4", "/api/v1/nodes/node-2"):
                st, h, b = http_request(e.kwc.port, "GET", path + "?resourceVersion=0", headers=PB_HDR)
                self.assertEqual((st, h.get("content-type")), (200, kpb.CT), b[:200])
                o = kpb.decode_body(b)
                st, _, jb = http_request(e.kwc.port, "GET", path + "?resourceVersion=0", headers=JSON_HDR)
                j = json.loads(jb)
                self.assertEqual((o["kind"], o["apiVersion"]), (j["kind"], j["apiVersion"]))
                self.assertEqual(comparable(o), comparable(j))
            st, h, b = http_request(e.kwc.port, "GET", "/api/v1/namespaces/ns-1/pods/nope?resourceVersion=0",
                                    headers=PB_HDR)
            self.assertEqual((st, h.get("content-type")), (404, kpb.CT))
            s404 = kpb.decode_body(b)
            self.assertEqual((s404["kind"], s404["code"], s404["reason"]), ("Status", 404, "NotFound"))
            self.assertEqual(s404["message"], 'pods "nope" not found')
            # the same events in both encodings
            q = "/api/v1/pods?watch=1&resourceVersion=%d" % r0
            pw = Stream(e.kwc.port, q, headers=[("Accept", PB)])
            jw = Stream(e.kwc.port, q, headers=[("Accept", "application/json")])
            pump([pw, jw], lambda: pw.head is not None and jw.head is not None, 10, "stream heads")
            self.assertEqual(pw.headers.get("content-type"), kpb.CT_WATCH)
            # 150 writes at once (the streams are read afterwards), then both
            # streams up to the last one's rv
            rv = e.sim("POST", "/apisim/churn", {"count": 150, "resources": ["pods"], "label_flip": 0.3,
                                                 "mix": {"update": 0.6, "create": 0.2, "delete": 0.2}})["rv"]
            pump([pw, jw], lambda: pw.last_rv() == rv and jw.last_rv() == rv, 60,
                 "both streams to reach rv %d" % rv)
            pw.close()
            jw.close()
            evs = lambda s: [(ev["type"], comparable(ev["object"])) for ev in s.events if ev["type"] != "BOOKMARK"]
            self.assertGreater(len(evs(jw)), 20)
            self.assertEqual(evs(pw), evs(jw))


class MixedWatchers(unittest.TestCase):
    """JSON and protobuf watchers of one resource under churn: one upstream
    watch per encoding; each watcher ends in the upstream's state."""

    def test_mixed_encodings_under_churn(self):
        with Env(apisim_args=["--pods", "150", "--namespaces", "3", "--nodes", "6", "--history", "200000"],
                 kwc_args=["--resources", "v1/pods", "--bookmark-interval", "1s"] + pb_flags("v1/pods")) as e:
            r0 = quiesce(e)
            e.sim("POST", "/apisim/reset-stats")
            streams = []
            for i in range(60):
                hdr = [("Accept", PB if i % 2 else "application/json")]
                sel = {0: "", 1: "&fieldSelector=spec.nodeName%%3Dnode-%d" % (i % 6),
                       2: "&labelSelector=app%%3Dapp-%d" % (i % 4)}[i % 3]
                rv = "0" if i % 4 == 0 else str(r0)
                s = Stream(e.kwc.port, "/api/v1/pods?watch=1&allowWatchBookmarks=true&resourceVersion=%s%s" % (rv, sel),
                           headers=hdr)
                s.sel, s.rv0 = sel, rv
                streams.append(s)
            pump(streams, lambda: all(s.head is not None for s in streams), 20, "stream heads")
            e.sim("POST", "/apisim/churn", {"rate": 200, "resources": ["pods"], "label_flip": 0.3,
                                            "mix": {"update": 0.7, "create": 0.15, "delete": 0.15}})
            t_end = time.monotonic() + 5
            pump(streams, lambda: time.monotonic() > t_end, 30)
            final = quiesce(e)
            pump(streams, lambda: all(any(ev["type"] == "BOOKMARK" and int(ev["object"]["metadata"]["resourceVersion"]) >= final
                                          for ev in s.events) for s in streams), 60,
                 "every watcher to see a bookmark at rv %d" % final)
            # the only upstream watches are none: kwc's reflectors' were opened before reset-stats
            self.assertEqual(sum(v for k, v in e.stats()["requests"].items() if k.startswith("watch ")), 0,
                             "a downstream watch reached the upstream")
            st, _, b = http_request(e.apisim.port, "GET", "/api/v1/pods?resourceVersion=%d" % final, headers=JSON_HDR)
            upstream = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in json.loads(b)["items"]}
            for s in streams:
                with self.subTest(path=s.path, ct=s.headers.get("content-type")):
                    want_ct = kpb.CT_WATCH if s.lines and s.lines[0][:1] != b"{" else "application/json"
                    self.assertEqual(s.headers.get("content-type"), want_ct)
                    state = {}
                    if s.rv0 != "0":
                        st, _, b = http_request(e.apisim.port, "GET", "/api/v1/pods?resourceVersion=%s&%s" % (
                            s.rv0, s.sel.lstrip("&")), headers=JSON_HDR)
                        state = {(o["metadata"]["namespace"], o["metadata"]["name"]): o["metadata"]["resourceVersion"]
                                 for o in json.loads(b)["items"]}
                    prev = 0
                    for ev in s.events:
                        if ev["type"] == "BOOKMARK":
                            continue
                        md = ev["object"]["metadata"]
                        rv = int(md["resourceVersion"])
                        if s.rv0 != "0":  # (rv=0 streams start with the state in key order)
                            self.assertGreater(rv, prev, "no gap, duplicate or reordering")
                            prev = rv
                        k = (md["namespace"], md["name"])
                        if ev["type"] == "DELETED":
                            state.pop(k, None)
                        else:
                            state[k] = md["resourceVersion"]
                    want = {k: o["metadata"]["resourceVersion"] for k, o in upstream.items()
                            if _m11.sel_match(self.sel_of(s.sel), o)}
                    self.assertEqual(state, want)
            for s in streams:
                s.close()
            # one upstream watch per encoding: apisim's open watches by encoding
            watches = e.stats().get("watches_open") or e.stats().get("open_watches")
            if watches is not None:
                self.assertEqual(watches, {"pods": {"json": 1, "protobuf": 1}}, watches)

    @staticmethod
    def sel_of(q):
        if not q:
            return None
        k, _, v = urllib.parse.unquote(q.lstrip("&")).partition("=")
        key, _, val = v.partition("=")
        if k == "fieldSelector":
            return (None, [], [(key, val)])
        return (None, [(key, "=", val)], [])


class ProtobufRelist(unittest.TestCase):
    """A forced 410: the protobuf cache relists and records the difference as
    events; its watchers stay open and never see an rv go back."""

    def test_relist_keeps_protobuf_watchers(self):
        with Env(apisim_args=["--pods", "80", "--namespaces", "2", "--history", "100000"],
                 kwc_args=["--resources", "v1/pods", "--bookmark-interval", "1s"] + pb_flags("v1/pods")) as e:
            r0 = quiesce(e)
            ws = [Stream(e.kwc.port, "/api/v1/pods?watch=1&timeoutSeconds=900&allowWatchBookmarks=true&resourceVersion=%d%s"
                         % (r0, sel), headers=[("Accept", PB)]) for sel in ("", "&labelSelector=app%3Dapp-1")]
            pump(ws, lambda: all(s.head is not None for s in ws), 10, "stream heads")
            e.sim("POST", "/apisim/fail", {"count": 1000, "match": "watch=", "mode": "status", "status": 503})
            e.sim("POST", "/apisim/drop-watches", {})
            for i in range(6):
                e.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "ns-1",
                                                "name": "unseen-%d" % i, "labels": {"app": "app-1"}})
            e.sim("POST", "/apisim/write", {"verb": "delete", "resource": "pods", "namespace": "ns-1",
                                            "name": "unseen-0"})
            e.sim("POST", "/apisim/write", {"verb": "delete", "resource": "pods", "namespace": "ns-0",
                                            "name": "pod-0"})
            e.sim("POST", "/apisim/compact", {})
            e.sim("POST", "/apisim/fail", {"clear": True})
            final = quiesce(e)
            pump(ws, lambda: all(any(ev["type"] == "BOOKMARK" and int(ev["object"]["metadata"]["resourceVersion"]) >= final
                                     for ev in s.events) for s in ws), 60, "bookmarks at the final rv")
            self.assertIn("relisted at rv", e.kwc.logs())
            for s, sel in zip(ws, (None, (None, [("app", "=", "app-1")], []))):
                self.assertFalse(s.ended or s.closed, "a protobuf watch ended at the relist")
                rvs = [int(ev["object"]["metadata"]["resourceVersion"]) for ev in s.events if ev["type"] != "BOOKMARK"]
                self.assertEqual(rvs, sorted(rvs), "an rv went back")
                self.assertNotIn("ERROR", [ev["type"] for ev in s.events])
                st, _, b = http_request(e.apisim.port, "GET", "/api/v1/pods?resourceVersion=%d" % r0, headers=JSON_HDR)
                state = {(o["metadata"]["namespace"], o["metadata"]["name"]): o["metadata"]["resourceVersion"]
                         for o in json.loads(b)["items"] if _m11.sel_match(sel, o)}
                for ev in s.events:
                    if ev["type"] == "BOOKMARK":
                        continue
                    md = ev["object"]["metadata"]
                    if ev["type"] == "DELETED":
                        state.pop((md["namespace"], md["name"]), None)
                    else:
                        state[(md["namespace"], md["name"])] = md["resourceVersion"]
                st, _, b = http_request(e.apisim.port, "GET", "/api/v1/pods", headers=JSON_HDR)
                want = {(o["metadata"]["namespace"], o["metadata"]["name"]): o["metadata"]["resourceVersion"]
                        for o in json.loads(b)["items"] if _m11.sel_match(sel, o)}
                self.assertEqual(state, want)
                s.close()


# ---- an upstream that breaks protobuf on request ----

class Mangler:
    """A proxy between kwc and apisim. Armed with a mode, it breaks the next
    protobuf answer of that kind, then passes everything through again."""

    def __init__(self, upstream_port):
        self.up = upstream_port
        self.mode = None
        self.fired = []
        mangler = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                mangler.handle(self)

            do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

        class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.srv = S(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()

    def handle(self, h):
        n = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(n) if n else None
        c = http.client.HTTPConnection("127.0.0.1", self.up, timeout=900)
        hdrs = {k: v for k, v in h.headers.items() if k.lower() not in ("connection", "keep-alive")}
        c.request(h.command, h.path, body=body, headers=hdrs)
        r = c.getresponse()
        ct = r.getheader("Content-Type", "")
        watch = ct == kpb.CT_WATCH
        mode = self.mode
        h.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                h.send_header(k, v)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

        def chunk(b):
            if b:
                h.wfile.write(b"%x\r\n%s\r\n" % (len(b), b))
                h.wfile.flush()

        try:
            if ct == kpb.CT and mode == "list" and "watch" not in h.path:
                self.mode = None
                data = r.read()
                self.fired.append(("list", h.path))
                # cut short: the envelope's raw length claims more bytes than follow
                chunk(data[:-5])
            elif watch:  # armed at any time while the stream runs
                buf = b""
                while True:
                    d = r.read1(65536)
                    if not d:
                        break
                    buf += d
                    frames, buf = kpb.frames(buf)
                    for f in frames:
                        ev = kpb.watch_event(f)
                        mode = self.mode
                        if mode in ("truncate", "overlen", "magic") and \
                                ev["type"] in ("ADDED", "MODIFIED", "DELETED"):
                            self.mode = None
                            self.fired.append((mode, h.path))
                            chunk(self.break_frame(mode, f))
                            if mode == "truncate":
                                h.wfile.write(b"0\r\n\r\n")
                                return
                            continue
                        chunk(struct.pack(">I", len(f)) + f)
                chunk(buf)
            else:
                while True:
                    d = r.read1(65536)
                    if not d:
                        break
                    chunk(d)
            h.wfile.write(b"0\r\n\r\n")
        except (OSError, http.client.HTTPException):
            pass  # either side went away (apisim drops watches, kwc cancels)
        finally:
            c.close()

    @staticmethod
    def break_frame(mode, f):
        if mode == "truncate":  # the stream ends inside a frame
            return struct.pack(">I", len(f)) + f[:len(f) // 2]
        if mode == "magic":  # the embedded object's envelope is not k8s\0
            i = f.find(kpb.MAGIC)
            return struct.pack(">I", len(f)) + f[:i] + b"k8s\x01" + f[i + 4:]
        # overlen: the WatchEvent's object field claims more than the frame holds
        fs = kpb.fields(f)
        typ = [v for n, _, v in fs if n == 1][0]
        obj = [v for n, _, v in fs if n == 2][0]
        body = b"\x0a" + bytes([len(typ)]) + typ + b"\x12" + _varint(len(obj) + 40) + obj
        return struct.pack(">I", len(body)) + body


def _varint(v):
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


class MalformedUpstream(unittest.TestCase):
    def test_broken_protobuf_is_refetched_never_served(self):
        with Env(apisim_args=["--pods", "40", "--namespaces", "2", "--history", "100000"],
                 start_kwc=False) as e:
            m = Mangler(e.apisim.port)
            self.addCleanup(m.close)
            e.kwc_args = ["--resources", "v1/pods", "--bookmark-interval", "1s"] + pb_flags("v1/pods")
            m.mode = "list"  # the first protobuf list page is broken
            e.start_kwc(extra=["--upstream", "http://127.0.0.1:%d" % m.port])
            quiesce(e)
            self.assertEqual([x[0] for x in m.fired], ["list"])
            watcher = Stream(e.kwc.port, "/api/v1/pods?watch=1&resourceVersion=0&allowWatchBookmarks=true",
                             headers=[("Accept", PB)])
            for mode in ("truncate", "overlen", "magic"):
                with self.subTest(mode=mode):
                    m.mode = mode
                    n = len(m.fired)
                    for i in range(3):
                        e.sim("POST", "/apisim/write", {"verb": "update", "resource": "pods", "namespace": "ns-0",
                                                        "name": "pod-%d" % (2 * i), "labels": {"m": mode}})
                    wait_for(lambda: len(m.fired) > n, 20, "the mangler to break a frame (%s)" % mode)
                    quiesce(e)
                    logs = e.kwc.logs(200)
                    self.assertRegex(logs, r"(?i)pods.*protobuf|protobuf.*pods", "no log line names the cache")
            final = quiesce(e)
            pump([watcher], lambda: any(ev["type"] == "BOOKMARK" and int(ev["object"]["metadata"]["resourceVersion"]) >= final
                                        for ev in watcher.events), 60, "the watcher at the final rv")
            # every frame kwc sent decoded (Stream decodes each) and the cache
            # ends equal to the upstream, byte for byte
            self.assertFalse(watcher.ended)
            st, h, kb = http_request(e.kwc.port, "GET", "/api/v1/pods?resourceVersion=%d&resourceVersionMatch=Exact"
                                     % final, headers=PB_HDR)
            st2, _, ab = http_request(e.apisim.port, "GET", "/api/v1/pods?resourceVersion=%d&resourceVersionMatch=Exact"
                                      % final, headers=PB_HDR)
            self.assertEqual((st, st2), (200, 200))
            self.assertEqual(kb, ab)
            self.assertIsNone(e.kwc.p.poll(), "kwc exited")
            watcher.close()


class LazyStart(unittest.TestCase):
    def test_cache_starts_on_first_protobuf_request(self):
        with Env(apisim_args=["--pods", "10", "--nodes", "3"],
                 kwc_args=["--resources", "v1/pods,v1/nodes"] + pb_flags("v1/pods")) as e:
            # ready although nobody asked for nodes in protobuf yet
            st, _, b = http_request(e.kwc.port, "GET", "/readyz?verbose")
            self.assertEqual(st, 200, b)
            n = lists_upstream(e, "nodes")
            st, h, b = http_request(e.kwc.port, "GET", "/api/v1/nodes?resourceVersion=0", headers=PB_HDR)
            self.assertEqual((st, h.get("content-type")), (200, kpb.CT))
            # the request started the nodes protobuf cache, waited for its
            # first sync (--cache-start-timeout) and was answered by it: the
            # cache's own LIST is the only one upstream
            self.assertEqual(lists_upstream(e, "nodes"), n + 1, "only the new cache's LIST went upstream")
            self.assertGreater(served_rv(e, "/api/v1/nodes", PB_HDR), 0, "the nodes protobuf cache serves")
            st, _, b = http_request(e.kwc.port, "GET", "/readyz?verbose")
            self.assertEqual(st, 200, b)
            self.assertRegex(b.decode(), r"(?i)nodes.*protobuf")


def pom_meta(raw):
    """A PartialObjectMetadata message {1: ObjectMeta} read in full, field by
    field (kpb's primitives; every repeated field in order, maps as entry
    lists), so a test can say what kube writes for each field."""
    f = kpb.fields(raw)
    assert [n for n, _, _ in f] == [1], "PartialObjectMetadata is {1: ObjectMeta} only"
    md = kpb.fields(f[0][2])

    def time_of(b):
        t = kpb.fields(b)  # int64 varints, read back signed
        return None if not t else tuple(v - (1 << 64) if v >= 1 << 63 else v for _, _, v in t)

    def entries(num):
        return [tuple(kpb.s(v) for _, _, v in kpb.fields(e)) for e in kpb.every(md, num)]

    def owner(b):
        return [(n, kpb.s(v) if wt == 2 else v) for n, wt, v in kpb.fields(b)]

    def managed(b):
        out = []
        for n, _, v in kpb.fields(b):
            out.append((n, time_of(v) if n == 4 else kpb.fields(v)[0][2] if n == 7 else kpb.s(v)))
        return out

    return {
        "order": [n for n, _, _ in md],
        "strings": [kpb.s(kpb.last(md, n, b"")) for n in range(1, 7)],
        "generation": kpb.last(md, 7),
        "created": time_of(kpb.last(md, 8, b"")),
        "deleted": time_of(kpb.last(md, 9)) if kpb.last(md, 9) is not None else "unset",
        "grace": kpb.last(md, 10),
        "labels": entries(11), "annotations": entries(12),
        "owners": [owner(b) for b in kpb.every(md, 13)],
        "finalizers": [kpb.s(b) for b in kpb.every(md, 14)],
        "managed": [managed(b) for b in kpb.every(md, 17)],
    }


def unix(iso):
    """Unix seconds of an RFC 3339 time, for the expectations."""
    import datetime
    return int(datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() // 1)


class CustomResourceMetaProtobuf(unittest.TestCase):
    """A custom resource's metadata in protobuf (client-go's metadata client:
    the garbage collector's and quota controller's informers): kwc keeps only
    a JSON cache of custom resources and derives the typed
    PartialObjectMetadata kube writes (issue 30). Widgets with every
    ObjectMeta field set are listed, got and watched through kwc and on
    apisim directly: the answers byte for byte the same, served from the
    cache (no list or watch upstream), and read back field by field to what
    kube's gogo marshaller writes."""

    WATCH_ACCEPT = META_PB_GET["Accept"] + ", application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"

    @classmethod
    def setUpClass(cls):
        cls.env = Env(apisim_args=["--namespaces", "2", "--history", "100000", "--bookmark-interval", "0.5"],
                      kwc_args=["--resources", "example.com/v1/widgets", "--bookmark-interval", "1s"])
        w = lambda name, md, **kw: cls.env.sim("POST", "/apisim/write", dict(
            verb="create", resource="widgets", namespace="ns-1", name=name,
            object={"metadata": md, "spec": {"size": 1}}, **kw))
        w("w-full", {
            "generateName": "w-", "generation": 3,
            "creationTimestamp": "2024-05-06T07:08:09Z",
            "deletionTimestamp": "2030-01-02T03:04:05Z", "deletionGracePeriodSeconds": 30,
            "labels": {"tier": "front", "app": "web", "app.kubernetes.io/name": "w"},
            "annotations": {"note": "<b>&amp;</b>", "empty": ""},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs-1", "uid": "u-rs",
                 "controller": True, "blockOwnerDeletion": False},
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u-cm"}],
            "finalizers": ["example.com/cleanup", "b"],
            "managedFields": [
                {"manager": "kubectl", "operation": "Apply", "apiVersion": "example.com/v1",
                 "time": "2024-05-06T07:08:09Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {"f:size": {}}, "f:metadata": {"f:labels": {".": {}, "f:app": {}}}},
                 "subresource": "status"},
                {"manager": "other", "operation": "Update", "apiVersion": "example.com/v1",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}}],
        }, labels={"flip": "a", "app": "web"})
        w("w-bare", {}, labels={"flip": "b"})
        w("w-old", {"creationTimestamp": "1969-12-31T23:59:59Z"}, labels={"flip": "a"})

    @classmethod
    def tearDownClass(cls):
        cls.env.close()

    def quiesce(self):
        e = self.env
        rv = e.stats()["rv"]
        wait_for(lambda: served_rv(e, "/apis/example.com/v1/widgets", META_PB_LIST) >= rv, 30,
                 "kwc's widgets cache at rv %d" % rv)
        return rv

    def same(self, path, hdr):
        """kwc's answer and apisim's to path: the same bytes, kwc's from its cache."""
        e = self.env
        n = lists_upstream(e)
        k = http_request(e.kwc.port, "GET", path, headers=hdr)
        self.assertEqual(lists_upstream(e), n, "%s went upstream" % path)
        a = http_request(e.apisim.port, "GET", path, headers=hdr)
        self.assertEqual((k[0], k[1].get("content-type")), (200, kpb.CT), k[2][:300])
        self.assertEqual((a[0], a[1].get("content-type")), (200, kpb.CT), a[2][:300])
        self.assertEqual(k[2], a[2], "%s: kwc's bytes are not apisim's" % path)
        return k[2]

    def check_full(self, m):
        """w-full's ObjectMeta as kube's gogo marshaller writes it."""
        self.assertEqual(m["order"][:8], [1, 2, 3, 4, 5, 6, 7, 8], "by-value fields, in order, always")
        self.assertEqual(m["order"], sorted(m["order"]), "ascending field numbers")
        self.assertEqual(m["strings"][:4], ["w-full", "w-", "ns-1", ""])
        self.assertEqual(m["generation"], 3)
        self.assertEqual(m["created"], (unix("2024-05-06T07:08:09Z"), 0), "Time {seconds, nanos 0}")
        self.assertEqual(m["deleted"], (unix("2030-01-02T03:04:05Z"), 0))
        self.assertEqual(m["grace"], 30)
        self.assertEqual(m["labels"], [("app", "web"), ("flip", "a")], "labels: entries in key order")
        self.assertEqual([k for k, _ in m["annotations"]],
                         sorted(["note", "empty", "apisim.kwc.dev/written-at"]))
        self.assertIn(("empty", ""), m["annotations"])
        self.assertIn(("note", "<b>&amp;</b>"), m["annotations"], "no HTML escaping in protobuf")
        self.assertEqual(m["owners"], [
            [(1, "ReplicaSet"), (3, "rs-1"), (4, "u-rs"), (5, "apps/v1"), (6, 1), (7, 0)],
            [(1, "ConfigMap"), (3, "cm"), (4, "u-cm"), (5, "v1")]],
            "owner references: controller/blockOwnerDeletion only when set, false written")
        self.assertEqual(m["finalizers"], ["example.com/cleanup", "b"])
        self.assertEqual(m["managed"], [
            [(1, "kubectl"), (2, "Apply"), (3, "example.com/v1"), (4, (unix("2024-05-06T07:08:09Z"), 0)),
             (6, "FieldsV1"), (7, b'{"f:metadata":{"f:labels":{".":{},"f:app":{}}},"f:spec":{"f:size":{}}}'),
             (8, "status")],
            [(1, "other"), (2, "Update"), (3, "example.com/v1"), (6, "FieldsV1"),
             (7, b'{"f:metadata":{}}'), (8, "")]],
            "managedFields: strings always, time only when set, fieldsV1 the compact sorted JSON")

    def test_lists_and_gets(self):
        self.quiesce()
        body = self.same("/apis/example.com/v1/widgets?resourceVersion=0", META_PB_LIST)
        d = kpb.decode_body(body)
        self.assertEqual((d["kind"], d["apiVersion"]), ("PartialObjectMetadataList", "meta.k8s.io/v1"))
        metas = {pom_meta(r)["strings"][0]: pom_meta(r) for r in d["raw_items"]}
        self.assertEqual(sorted(metas), ["w-bare", "w-full", "w-old"])
        self.check_full(metas["w-full"])
        bare = metas["w-bare"]
        self.assertEqual(bare["order"][:8], [1, 2, 3, 4, 5, 6, 7, 8])
        self.assertEqual((bare["generation"], bare["deleted"], bare["grace"], bare["owners"]), (0, "unset", None, []))
        self.assertEqual(metas["w-old"]["created"], (-1, 0), "a time before the epoch: negative seconds")
        for path in ("/apis/example.com/v1/namespaces/ns-1/widgets?resourceVersion=0",
                     "/apis/example.com/v1/widgets?resourceVersion=0&labelSelector=flip%3Da",
                     "/apis/example.com/v1/widgets?resourceVersion=0&labelSelector=nothing%3Dhere"):
            self.same(path, META_PB_LIST)
        # a limited chain: pages and their continue tokens the same
        path = "/apis/example.com/v1/widgets?limit=1&resourceVersion=%d" % self.env.stats()["rv"]
        pages = 0
        while True:
            b = self.same(path, META_PB_LIST)
            pages += 1
            cont = kpb.decode_body(b)["metadata"].get("continue")
            if not cont:
                break
            path = "/apis/example.com/v1/widgets?limit=1&continue=" + urllib.parse.quote(cont)
        self.assertEqual(pages, 3)
        b = self.same("/apis/example.com/v1/namespaces/ns-1/widgets/w-full?resourceVersion=0", META_PB_GET)
        api, kind, raw = kpb.envelope(b)
        self.assertEqual((api, kind), ("meta.k8s.io/v1", "PartialObjectMetadata"))
        self.check_full(pom_meta(raw))
        self.same("/apis/example.com/v1/namespaces/ns-1/widgets/w-bare?resourceVersion=0", META_PB_GET)

    def test_watches(self):
        e = self.env
        r0 = self.quiesce()
        T = dict(timeoutSeconds=4)
        q = lambda **kw: urllib.parse.urlencode(dict(kw, **T))
        sie = dict(sendInitialEvents="true", resourceVersionMatch="NotOlderThan", allowWatchBookmarks="true")
        cases = ["/apis/example.com/v1/widgets?" + q(watch=1, resourceVersion=r0),
                 "/apis/example.com/v1/widgets?" + q(watch=1, resourceVersion=0),
                 "/apis/example.com/v1/namespaces/ns-1/widgets?" + q(watch=1, **sie),
                 "/apis/example.com/v1/widgets?" + q(watch=1, resourceVersion=r0, labelSelector="flip=a")]
        n = sum(v for k, v in e.stats()["requests"].items() if k.startswith("watch "))
        hdr = [("Accept", self.WATCH_ACCEPT)]
        pairs = [(p, Stream(e.kwc.port, p, headers=hdr), Stream(e.apisim.port, p, headers=hdr)) for p in cases]
        streams = [x for _, k, a in pairs for x in (k, a)]
        pump(streams, lambda: all(x.head is not None for x in streams), 10, "stream heads")
        w = lambda **b: e.sim("POST", "/apisim/write", dict(resource="widgets", namespace="ns-1", **b))
        w(verb="update", name="w-bare", labels={"flip": "a"})   # enters flip=a
        w(verb="update", name="w-full", labels={"flip": "b"})   # leaves flip=a
        w(verb="create", name="w-new", labels={"flip": "a"},
          object={"metadata": {"finalizers": ["f"], "ownerReferences": [{"kind": "K", "name": "n", "uid": "u"}]}})
        w(verb="delete", name="w-old")
        read_until_end(streams, 20)
        self.assertEqual(sum(v for k, v in e.stats()["requests"].items() if k.startswith("watch ")),
                         n + len(pairs), "kwc passed a watch upstream")
        for p, k, a in pairs:
            with self.subTest(path=p):
                self.assertEqual((k.status, a.status), (200, 200))
                self.assertTrue(k.ended)
                self.assertEqual(k.headers.get("content-type"), kpb.CT_WATCH)
                self.assertEqual(a.headers.get("content-type"), kpb.CT_WATCH)
                self.assertGreater(len(a.non_bookmarks()), 0)
                self.assertEqual(k.non_bookmarks(), a.non_bookmarks(), "frames byte for byte")
                for ev in k.events:
                    self.assertEqual((ev["object"]["kind"], ev["object"]["apiVersion"]),
                                     ("PartialObjectMetadata", "meta.k8s.io/v1"))
                # the initial-events-end bookmark: kube's bytes (a typed
                # PartialObjectMetadata of the bookmark object) byte for byte
                ie = lambda x: [l for l, ev in zip(x.lines, x.events) if ev["type"] == "BOOKMARK"
                                and (ev["object"]["metadata"].get("annotations") or {})]
                self.assertEqual(ie(k), ie(a))
                if "sendInitialEvents" in p:
                    self.assertEqual(len(ie(k)), 1)
                    m = pom_meta(kpb.envelope(kpb.fields(kpb.last(kpb.fields(ie(k)[0]), 2))[0][2])[2])
                    self.assertEqual(m["order"], [1, 2, 3, 4, 5, 6, 7, 8, 12], "every by-value field")
                    self.assertEqual(m["annotations"], [("k8s.io/initial-events-end", "true")])
        flip = pairs[3][1]
        self.assertEqual([(ev["type"], ev["object"]["metadata"]["name"]) for ev in flip.events
                          if ev["type"] != "BOOKMARK"],
                         [("ADDED", "w-bare"), ("DELETED", "w-full"), ("ADDED", "w-new"), ("DELETED", "w-old")],
                         "selector transitions")

    def test_on_demand_starts_the_json_cache(self):
        # --resources auto: the first metadata request in protobuf starts the
        # custom resource's JSON cache (the one it is derived from), waits
        # for its first sync and is answered from it
        with Env(apisim_args=["--namespaces", "2"], auto=True) as e:
            e.sim("POST", "/apisim/seed", {"resource": "widgets", "count": 5, "namespaces": 2})
            from scrape import scrape, total
            cached = lambda: total(scrape(e.kwc.port), "kwc_requests_total", verb="LIST", resource="widgets",
                                   source="cache")
            n, c = lists_upstream(e, "widgets"), cached()
            path = "/apis/example.com/v1/widgets?resourceVersion=0"
            st, h, b = http_request(e.kwc.port, "GET", path, headers=META_PB_LIST)
            self.assertEqual((st, h.get("content-type")), (200, kpb.CT), b[:300])
            self.assertEqual(lists_upstream(e, "widgets"), n + 1, "only the new JSON cache's LIST went upstream")
            self.assertEqual(cached(), c + 1, "answered from the cache")
            self.assertEqual(len(kpb.decode_body(b)["raw_items"]), 5)
            self.assertEqual(b, http_request(e.apisim.port, "GET", path, headers=META_PB_LIST)[2])



if __name__ == "__main__":
    unittest.main()
