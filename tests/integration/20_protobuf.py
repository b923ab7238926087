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
from watchstream import Stream, pump

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
                 kwc_args=["--resources", "v1/pods", "--bookmark-interval", "1"] + pb_flags("v1/pods")) as e:
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
                 kwc_args=["--resources", "v1/pods", "--bookmark-interval", "1"] + pb_flags("v1/pods")) as e:
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
            e.kwc_args = ["--resources", "v1/pods", "--bookmark-interval", "1"] + pb_flags("v1/pods")
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
            # passed through, and the nodes protobuf cache started listing
            wait_for(lambda: lists_upstream(e, "nodes") >= n + 2, 30, "the protobuf cache of nodes to list")
            wait_for(lambda: served_rv(e, "/api/v1/nodes", PB_HDR) > 0, 30, "the nodes protobuf cache")
            st, _, b = http_request(e.kwc.port, "GET", "/readyz?verbose")
            self.assertEqual(st, 200, b)
            self.assertRegex(b.decode(), r"(?i)nodes.*protobuf")


if __name__ == "__main__":
    unittest.main()
