"""Watches of cached resources served by kwc from its store (issue 4).

- Differential: every watch mode (rv unset/0/N, sendInitialEvents, selectors
  with transitions, namespaces, the legacy /watch/ path, a built-in of another
  group, a custom resource, HTTP/1.0), opened on kwc and on apisim at the same
  moment over a quiet cluster, then the same scripted writes: the event lines
  must be byte-identical, and apisim must see no watch from kwc's clients.
- Errors as kube-apiserver gives them (422/400/500 before the stream; 410 as
  an ERROR event on a 200 stream below the history floor).
- Randomised model test (seeded): churn with label flips, creates, deletes and
  node bindings; watchers in random modes and selectors, some paused, some
  resuming from their last rv; each watcher's events equal the sequence the
  upstream's own unfiltered event stream implies for it, with no gap,
  duplicate or decreasing rv, and its final state equals apisim's.
- Multiplexing: 500 watchers, one upstream watch.
- Bookmarks on the wire, a paused watcher over its budget (memory stays bounded,
  then it catches up), stuck watchers relisting the whole state (kwc's cap on
  store-encoded bytes bounds them and a reading watcher is not starved),
  SIGTERM ends every stream with a terminal chunk.
"""
import json
import os
import random
import signal
import time
import unittest
import urllib.parse

import kpb
from cluster import Env, http_request, speaks_h2, wait_for
from scrape import scrape, total, value
from watchstream import Stream, pump, read_until_end

RESOURCES = "v1/pods,apps/v1/deployments,example.com/v1/widgets"
SEED = int(os.environ.get("KWC_WATCH_SEED", "4242"))


def q(**kw):
    return urllib.parse.urlencode({k: v for k, v in kw.items() if v is not None})


def obj_rv(e):
    return int(e["object"]["metadata"]["resourceVersion"])


def key_of(o):
    md = o["metadata"]
    return "%s/%s" % (md.get("namespace", ""), md["name"]) if md.get("namespace") else md["name"]


def lists_upstream(env):
    return sum(v for k, v in env.stats()["requests"].items() if k.startswith("list "))


def kwc_rv(env, path, accept="application/json"):
    """The rv of kwc's cache (in the encoding accept selects) for path; 0 while
    kwc passes the list upstream (that cache is not serving yet)."""
    n = lists_upstream(env)
    st, _, b = http_request(env.kwc.port, "GET", path + "?resourceVersion=0", headers={"Accept": accept})
    if st != 200 or lists_upstream(env) != n:
        return 0
    import json
    d = kpb.decode_body(b) if b[:4] == kpb.MAGIC else json.loads(b)
    return int(d["metadata"]["resourceVersion"])


def quiesce(env, paths=("/api/v1/pods",), accept="application/json"):
    env.sim("POST", "/apisim/churn", {"rate": 0})
    rv = env.stats()["rv"]
    for p in paths:
        wait_for(lambda p=p: kwc_rv(env, p, accept) >= rv, 30, "kwc to reach rv %d on %s" % (rv, p))
    return rv


def watches_upstream(env):
    return sum(v for k, v in env.stats()["requests"].items() if k.startswith("watch "))


# --------------------------------------------------------------------------
# label/field selector semantics for the model (the subset the test uses)

def sel_match(sel, obj):
    if sel is None:
        return True
    ns, labels, fields = sel
    md = obj["metadata"]
    if ns is not None and md.get("namespace") != ns:
        return False
    lab = md.get("labels") or {}
    for k, op, v in labels:
        if op == "=" and lab.get(k) != v:
            return False
        if op == "!=" and lab.get(k) == v:
            return False
        if op == "in" and lab.get(k) not in v:
            return False
    for k, v in fields:
        if k == "spec.nodeName" and (obj.get("spec") or {}).get("nodeName", "") != v:
            return False
    return True


def expected_events(ref, start_rv, state0, sel):
    """What kube sends a watcher with selector sel starting after start_rv:
    kube's cacheWatcher.convertToWatchEvent over the upstream's events.
    Returns [(type, rv, key)]. state0: the objects at the reference start."""
    state = dict(state0)
    out = []
    for t, rv, obj in ref:
        k = key_of(obj)
        prev = state.get(k)
        if t == "DELETED":
            state.pop(k, None)
        else:
            state[k] = obj
        if rv <= start_rv:
            continue
        cur = t != "DELETED" and sel_match(sel, obj)
        if t == "DELETED":
            old = sel_match(sel, prev if prev is not None else obj)
        else:
            old = prev is not None and sel_match(sel, prev)
        if t == "ADDED":
            if cur:
                out.append(("ADDED", rv, k))
        elif t == "DELETED":
            if old:
                out.append(("DELETED", rv, k))
        elif cur and old:
            out.append(("MODIFIED", rv, k))
        elif cur:
            out.append(("ADDED", rv, k))
        elif old:
            out.append(("DELETED", rv, k))
    return out


def state_at(ref, state0, rv):
    state = dict(state0)
    for t, erv, obj in ref:
        if erv > rv:
            break
        if t == "DELETED":
            state.pop(key_of(obj), None)
        else:
            state[key_of(obj)] = obj
    return state


class WatchDifferential(unittest.TestCase):
    ACCEPT = "application/json"  # what every watch asks for
    LIST_ACCEPT = None  # the lists that read the cache's rv (None: ACCEPT)
    CT = "application/json"  # kwc's answer for built-in kinds
    KIND, API_VERSION = "Pod", "v1"  # a pods watch's objects (and bookmarks)
    CUSTOM = True  # kwc serves this encoding for the custom resource too
    KWC_ARGS = []

    @property
    def list_accept(self):
        return self.LIST_ACCEPT or self.ACCEPT

    @classmethod
    def setUpClass(cls):
        cls.env = Env(apisim_args=["--pods", "40", "--namespaces", "3", "--nodes", "3", "--history", "100000",
                                   "--bookmark-interval", "0.5"],
                      kwc_args=["--resources", RESOURCES, "--bookmark-interval", "1s", "--rv-wait-timeout", "500ms"]
                      + cls.KWC_ARGS)
        e = cls.env
        e.sim("POST", "/apisim/seed", {"resource": "deployments", "count": 6, "namespaces": 2})
        e.sim("POST", "/apisim/seed", {"resource": "widgets", "count": 7, "namespaces": 2})

    def stream(self, port, path, **kw):
        return Stream(port, path, headers=[("Accept", self.ACCEPT)], **kw)

    def ct_for(self, path):
        return "application/json" if "/apis/example.com/" in path else self.CT

    @staticmethod
    def bookmark_key(line, ev):
        """What must be identical in an initial-events-end bookmark: its bytes
        in JSON; in protobuf its decoded rv and annotations (kwc's object
        carries only metadata, kube's also the zero-valued spec and status)."""
        if line[:1] == b"{":
            return line
        md = ev["object"]["metadata"]
        return (ev["object"]["kind"], md.get("resourceVersion"), md.get("annotations"))

    @classmethod
    def tearDownClass(cls):
        cls.env.close()

    def script(self):
        """Writes that exercise every event type and selector transition."""
        w = lambda **b: self.env.sim("POST", "/apisim/write", b)
        w(verb="update", namespace="ns-1", name="pod-1", labels={"app": "app-1", "flip": "a"})
        w(verb="update", namespace="ns-1", name="pod-1", labels={"app": "app-1", "flip": "b"})
        w(verb="create", namespace="ns-2", name="new-0", labels={"flip": "a"},
          object={"metadata": {"labels": {"flip": "a"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
        w(verb="update", namespace="ns-2", name="new-0", spec={"nodeName": "node-1"})
        w(verb="update", namespace="ns-2", name="new-0", labels={"flip": "b"})
        w(verb="update", namespace="ns-0", name="pod-3", status={"phase": "Succeeded"})
        w(verb="delete", namespace="ns-2", name="new-0")
        w(verb="delete", namespace="ns-0", name="pod-6")
        w(verb="update", resource="deployments", namespace="ns-0", name="deploy-0", labels={"flip": "a"})
        w(verb="update", resource="widgets", namespace="ns-1", name="widget-1", labels={"flip": "a"})
        w(verb="create", resource="widgets", namespace="ns-1", name="w-new", labels={"flip": "b"})

    def test_modes_match_apisim(self):
        e = self.env
        paths = ("/api/v1/pods", "/apis/apps/v1/deployments", "/apis/example.com/v1/widgets")
        r0 = quiesce(e, paths, self.list_accept)
        # some history behind r0 for the rv=N cases
        e.sim("POST", "/apisim/write", {"verb": "update", "namespace": "ns-0", "name": "pod-0",
                                        "labels": {"app": "app-0", "flip": "b"}})
        r1 = quiesce(e, paths, self.list_accept)
        T = dict(timeoutSeconds=4)
        sie = dict(sendInitialEvents="true", resourceVersionMatch="NotOlderThan", allowWatchBookmarks="true")
        cases = [
            "/api/v1/pods?" + q(watch=1, **T),
            "/api/v1/pods?" + q(watch=1, resourceVersion=0, **T),
            "/api/v1/pods?" + q(watch=1, resourceVersion=r0, **T),
            "/api/v1/pods?" + q(watch=1, resourceVersion=r1, **T),
            "/api/v1/pods?" + q(watch=1, resourceVersion=r0, **sie, **T),
            "/api/v1/pods?" + q(watch=1, **sie, **T),
            "/api/v1/pods?" + q(watch=1, resourceVersion=r0, sendInitialEvents="false",
                                resourceVersionMatch="NotOlderThan", **T),
            "/api/v1/pods?" + q(watch=1, sendInitialEvents="false", resourceVersionMatch="NotOlderThan", **T),
            "/api/v1/namespaces/ns-1/pods?" + q(watch=1, **T),
            "/api/v1/namespaces/ns-2/pods?" + q(watch="true", resourceVersion=r1, **T),
            "/api/v1/pods?" + q(watch=1, labelSelector="flip=a", **T),
            "/api/v1/pods?" + q(watch=1, labelSelector="flip!=a", resourceVersion=r0, **T),
            "/api/v1/pods?" + q(watch=1, labelSelector="app in (app-1,app-3),flip", **T),
            "/api/v1/pods?" + q(watch=1, fieldSelector="spec.nodeName=node-1", **T),
            "/api/v1/pods?" + q(watch=1, fieldSelector="spec.nodeName=node-1", labelSelector="flip=a",
                                resourceVersion=r1, **T),
            "/api/v1/pods?" + q(watch=1, fieldSelector="metadata.namespace=ns-2", **T),
            "/api/v1/namespaces/ns-2/pods?" + q(watch=1, fieldSelector="metadata.name=new-0", **T),
            "/api/v1/watch/namespaces/ns-1/pods?" + q(**T),
            "/api/v1/watch/pods?" + q(resourceVersion=r1, **T),
            "/apis/apps/v1/deployments?" + q(watch=1, resourceVersion=0, **T),
            "/apis/apps/v1/namespaces/ns-0/deployments?" + q(watch=1, **sie, **T),
            "/apis/example.com/v1/widgets?" + q(watch=1, **T),
            "/apis/example.com/v1/namespaces/ns-1/widgets?" + q(watch=1, **sie, **T),
            "/apis/example.com/v1/widgets?" + q(watch=1, resourceVersion=r0, labelSelector="flip=a", **T),
        ]
        if not self.CUSTOM:
            cases = [p for p in cases if "/apis/example.com/" not in p]
        before = watches_upstream(e)
        pairs = []
        for p in cases:
            pairs.append((p, False, self.stream(e.kwc.port, p), self.stream(e.apisim.port, p)))
        for p in cases[:4]:
            pairs.append((p, True, self.stream(e.kwc.port, p, http10=True),
                          self.stream(e.apisim.port, p, http10=True)))
        # every stream has its head (and its initial events) before the writes
        streams = [s for _, _, a, b in pairs for s in (a, b)]
        pump(streams, lambda: all(s.head is not None for s in streams), 10, "stream heads")
        self.script()
        read_until_end(streams, 20)
        # the only upstream watches are the ones this test opened on apisim itself
        self.assertEqual(watches_upstream(e), before + len(pairs), "kwc passed a watch upstream")
        for p, http10, k, a in pairs:
            with self.subTest(path=p, http10=http10):
                self.assertEqual(k.status, 200)
                self.assertEqual(a.status, 200)
                self.assertTrue(k.ended, "kwc's stream did not end cleanly")
                self.assertEqual(k.headers.get("content-type"), self.ct_for(p))
                self.assertEqual(a.headers.get("content-type"), self.ct_for(p))
                # chunked over HTTP/1.1; HTTP/1.0 ends with the close, HTTP/2
                # with END_STREAM (and has no Transfer-Encoding at all)
                self.assertEqual("transfer-encoding" in k.headers, k.proto == "HTTP/1.1")
                self.assertEqual(k.proto, "HTTP/1.0" if http10 else "HTTP/2.0" if speaks_h2(e.kwc.port)
                                 else "HTTP/1.1")
                got, want = k.non_bookmarks(), a.non_bookmarks()
                self.assertGreater(len(want), 0)
                self.assertEqual(got, want)
                if "/api/v1/" in p:
                    self.assertEqual({ev["object"]["kind"] for ev in k.events}, {self.KIND})
                # initial-events-end bookmarks are part of the contract: identical too
                ie = lambda s: [self.bookmark_key(l, ev) for l, ev in zip(s.lines, s.events)
                                if ev["type"] == "BOOKMARK" and (ev["object"]["metadata"].get("annotations") or {})]
                self.assertEqual(ie(k), ie(a))
                if "sendInitialEvents=true" in p:
                    self.assertEqual(len(ie(k)), 1)

    def test_pretty_is_served_from_the_cache(self):
        # kube's watch encoder never indents: a pretty watch (?pretty=true, or
        # a curl User-Agent) gets the events' usual bytes, and kwc serves it
        # from its cache
        e = self.env
        quiesce(e, accept=self.list_accept)
        T = dict(timeoutSeconds=3)
        curl = [("User-Agent", "curl/8.5.0")]
        cases = [
            ("/api/v1/pods?" + q(watch=1, resourceVersion=0, pretty="true", **T), []),
            ("/api/v1/namespaces/ns-1/pods?" + q(watch=1, resourceVersion=0, **T), curl),
            ("/api/v1/pods?" + q(watch=1, sendInitialEvents="true", resourceVersionMatch="NotOlderThan",
                                 allowWatchBookmarks="true", pretty="1", **T), curl),
        ]
        before = watches_upstream(e)
        pairs = [(p, Stream(e.kwc.port, p, headers=[("Accept", self.ACCEPT)] + h),
                  Stream(e.apisim.port, p, headers=[("Accept", self.ACCEPT)] + h)) for p, h in cases]
        streams = [s for _, k, a in pairs for s in (k, a)]
        pump(streams, lambda: all(s.head is not None for s in streams), 10, "stream heads")
        e.sim("POST", "/apisim/write", {"verb": "update", "namespace": "ns-1", "name": "pod-1",
                                        "labels": {"app": "app-1", "pretty": "x"}})
        read_until_end(streams, 15)
        self.assertEqual(watches_upstream(e), before + len(pairs), "kwc passed a pretty watch upstream")
        for p, k, a in pairs:
            with self.subTest(path=p):
                self.assertEqual((k.status, a.status), (200, 200))
                self.assertEqual(k.headers.get("content-type"), self.ct_for(p))
                self.assertGreater(len(a.non_bookmarks()), 1)
                self.assertEqual(k.non_bookmarks(), a.non_bookmarks())
                if self.CT == "application/json":  # compact lines, as every watch's
                    self.assertTrue(all(l.startswith(b'{"type":"') for l in k.lines), k.lines[:2])
                self.assertEqual({ev["object"]["kind"] for ev in k.events}, {self.KIND})

    def test_zz_served_with_the_upstream_down(self):
        # the class's watches (metadata-only, pretty, gzip asked) are the
        # cache's: with the upstream stopped they still start, with every
        # object as an initial ADDED, and end at their timeout uncompressed
        e = self.env
        quiesce(e, accept=self.list_accept)
        st, _, b = http_request(e.kwc.port, "GET", "/api/v1/namespaces/ns-1/pods?resourceVersion=0",
                                headers={"Accept": "application/json"})
        self.assertEqual(st, 200)
        names = sorted(o["metadata"]["name"] for o in json.loads(b)["items"])
        self.assertGreater(len(names), 3)
        T = dict(timeoutSeconds=2)
        cases = [([("Accept-Encoding", "gzip")], q(watch=1, resourceVersion=0, **T)),
                 ([("User-Agent", "curl/8.5.0")], q(watch=1, resourceVersion=0, pretty="true", **T))]
        e.apisim.stop()  # what passes upstream now gets a 503
        try:
            for h, query in cases:
                with self.subTest(query=query, headers=h):
                    s = Stream(e.kwc.port, "/api/v1/namespaces/ns-1/pods?" + query,
                               headers=[("Accept", self.ACCEPT)] + h)
                    read_until_end([s], 15)
                    self.assertEqual(s.status, 200)
                    self.assertNotIn("content-encoding", s.headers)
                    self.assertEqual(s.headers.get("content-type"), self.CT)
                    got = sorted(ev["object"]["metadata"]["name"] for ev in s.events if ev["type"] == "ADDED")
                    self.assertEqual(got, names)
                    self.assertEqual({ev["object"]["kind"] for ev in s.events}, {self.KIND})
        finally:
            e.apisim.start()

    def test_errors_match_apisim(self):
        e = self.env
        cases = [
            "/api/v1/pods?" + q(watch=1, resourceVersionMatch="NotOlderThan"),
            "/api/v1/pods?" + q(watch=1, sendInitialEvents="true"),
            "/api/v1/pods?" + q(watch=1, sendInitialEvents="true", resourceVersionMatch="Exact"),
            "/api/v1/pods?" + q(watch=1, resourceVersionMatch="Bogus", continue_="x"),
            "/api/v1/pods?" + q(watch=1, timeoutSeconds="x"),
            "/api/v1/pods?" + q(watch=1, limit="-"),
            "/api/v1/pods?" + q(watch=1, labelSelector="a b"),
            "/api/v1/pods?" + q(watch=1, resourceVersion="abc"),
            "/api/v1/pods?" + q(watch=1, resourceVersion="-1"),
        ]
        for p in cases:
            with self.subTest(path=p):
                k = http_request(e.kwc.port, "GET", p, headers={"Accept": self.ACCEPT})
                a = http_request(e.apisim.port, "GET", p, headers={"Accept": self.ACCEPT})
                self.assertEqual(k[0], a[0])
                self.assertGreaterEqual(k[0], 400)
                self.assertEqual(k[2], a[2])

    def test_too_old_is_an_error_event(self):
        # Below kwc's floor the upstream answers (it may still have the rv);
        # with the upstream compacted past it too, the answer is kube's 410.
        e = self.env
        e.sim("POST", "/apisim/compact", {})
        s = self.stream(e.kwc.port, "/api/v1/pods?watch=1&resourceVersion=1")
        read_until_end([s], 10)
        self.assertEqual(s.headers.get("content-type"), self.ct_for("/api/v1/pods"))
        self.assertEqual(s.status, 200)
        self.assertTrue(s.ended)
        self.assertEqual(len(s.events), 1)
        ev = s.events[0]
        self.assertEqual(ev["type"], "ERROR")
        st = ev["object"]
        self.assertEqual((st["kind"], st["code"], st["reason"], st["status"]), ("Status", 410, "Expired", "Failure"))
        self.assertRegex(st["message"], r"^too old resource version: 1 \(\d+\)$")

    def test_negative_timeout_ends_at_once(self):
        s = self.stream(self.env.kwc.port, "/api/v1/pods?watch=1&resourceVersion=0&timeoutSeconds=-1")
        read_until_end([s], 5)
        self.assertEqual(s.status, 200)
        self.assertTrue(s.ended)

    def test_bookmarks_on_the_wire(self):
        e = self.env
        r = quiesce(e, accept=self.list_accept)
        s = self.stream(e.kwc.port, "/api/v1/pods?watch=1&allowWatchBookmarks=true&resourceVersion=%d&timeoutSeconds=5" % r)
        n = self.stream(e.kwc.port, "/api/v1/pods?watch=1&resourceVersion=%d&timeoutSeconds=5" % r)
        read_until_end([s, n], 15)
        bms = [ev for ev in s.events if ev["type"] == "BOOKMARK"]
        # every ~1 s (jittered) and one 2 s before the 5 s deadline
        self.assertGreaterEqual(len(bms), 2, s.lines)
        for line, b in zip(s.lines, s.events):
            if b["type"] != "BOOKMARK":
                continue
            self.assertEqual(set(b["object"]) - {"raw"}, {"kind", "apiVersion", "metadata"})
            self.assertEqual((b["object"]["kind"], b["object"]["apiVersion"]), (self.KIND, self.API_VERSION))
            rv = int(b["object"]["metadata"]["resourceVersion"])
            self.assertGreaterEqual(rv, r)
            if line[:1] == b"{":  # kube's bookmark line, byte for byte
                self.assertEqual(line, b'{"type":"BOOKMARK","object":{"kind":"%s","apiVersion":"%s",'
                                       b'"metadata":{"resourceVersion":"%d"}}}'
                                 % (self.KIND.encode(), self.API_VERSION.encode(), rv))
        self.assertEqual([ev for ev in n.events if ev["type"] == "BOOKMARK"], [], "bookmarks not asked for")

    def test_sie_waits_then_504_error_event(self):
        with Env(apisim_args=["--pods", "3"], kwc_args=["--resources", "v1/pods", "--too-large-rv", "504", "--rv-wait-timeout", "300ms"]
                 + self.KWC_ARGS) as env:
            quiesce(env, accept=self.list_accept)
            cur = env.stats()["rv"]
            p = "/api/v1/pods?" + q(watch=1, sendInitialEvents="true", resourceVersionMatch="NotOlderThan",
                                    allowWatchBookmarks=1, resourceVersion=cur + 1000)
            s = self.stream(env.kwc.port, p)
            read_until_end([s], 10)
            self.assertEqual(s.headers.get("content-type"), self.CT)
            self.assertEqual([ev["type"] for ev in s.events], ["ERROR"])
            st = s.events[0]["object"]
            self.assertEqual((st["code"], st["reason"]), (504, "Timeout"))
            self.assertRegex(st["message"], r"^Timeout: Too large resource version: %d, current: \d+$" % (cur + 1000))

    def test_resume_ahead_waits(self):
        """A watch resuming from an rv the cache has not reached (its client
        came from a replica that was ahead, issue 31): it waits for it, then
        gets only the events after it; too far ahead, kube's 504 ERROR event
        after the wait, whatever --too-large-rv says, never a 410."""
        with Env(apisim_args=["--pods", "3"], kwc_args=["--resources", "v1/pods", "--rv-wait-timeout", "1500ms"]
                 + self.KWC_ARGS) as env:
            quiesce(env, accept=self.list_accept)
            cur = env.stats()["rv"]
            s = self.stream(env.kwc.port, "/api/v1/pods?" + q(watch=1, resourceVersion=cur + 2))
            for name in ("ahead-1", "ahead-2", "ahead-3"):
                env.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "default",
                                                  "name": name})
            pump([s], lambda: len(s.events) >= 1, 10)
            self.assertEqual([(ev["type"], int(ev["object"].get("metadata", {}).get("resourceVersion", -1)))
                              for ev in s.events], [("ADDED", cur + 3)],
                             "only what follows the rv it resumed from: %r" % s.events)
            far = self.stream(env.kwc.port, "/api/v1/pods?" + q(watch=1, resourceVersion=cur + 1000))
            read_until_end([far], 15)
            self.assertEqual([ev["type"] for ev in far.events], ["ERROR"])
            st = far.events[0]["object"]
            self.assertEqual((st["code"], st["reason"]), (504, "Timeout"))
            self.assertRegex(st["message"], r"^Timeout: Too large resource version: %d, current: \d+$" % (cur + 1000))


class WatchModel(unittest.TestCase):
    """Seeded random watchers against apisim's own event stream."""
    ACCEPT = "application/json"  # kwc's watchers; the reference stream is JSON
    LIST_ACCEPT = None  # the lists that read the cache's rv (None: ACCEPT)
    KWC_ARGS = []

    @property
    def list_accept(self):
        return self.LIST_ACCEPT or self.ACCEPT

    def test_random_watchers_under_churn(self):
        rnd = random.Random(SEED)
        with Env(apisim_args=["--pods", "120", "--namespaces", "3", "--nodes", "4", "--history", "200000",
                              "--bookmark-interval", "0.5", "--seed", str(SEED)],
                 kwc_args=["--resources", "v1/pods", "--bookmark-interval", "1s", "--watch-budget", "16Ki"]
                 + self.KWC_ARGS) as e:
            failures = len(self._outcome.result.failures) if self._outcome.result else 0
            try:
                self.run_model(e, rnd)
            finally:
                if not self._outcome.result or len(self._outcome.result.failures) != failures or \
                        self._outcome.result.errors:
                    e.dump_logs()

    def run_model(self, e, rnd):
        import json
        r0 = quiesce(e, accept=self.list_accept)
        st, _, b = http_request(e.apisim.port, "GET", "/api/v1/pods?resourceVersion=%d" % r0)
        lst = json.loads(b)
        self.assertEqual(int(lst["metadata"]["resourceVersion"]), r0)
        state0 = {key_of(o): o for o in lst["items"]}
        ref = Stream(e.apisim.port, "/api/v1/pods?watch=1&resourceVersion=%d" % r0)
        sels = [None, ("ns-1", [], []), (None, [("flip", "=", "a")], []), (None, [("flip", "!=", "a")], []),
                (None, [("app", "in", ("app-1", "app-2"))], []), (None, [], [("spec.nodeName", "node-2")]),
                ("ns-0", [("flip", "=", "b")], []), (None, [("flip", "=", "a")], [("spec.nodeName", "node-1")])]

        def sel_query(sel):
            if sel is None:
                return "/api/v1/pods", {}
            ns, labels, fields = sel
            lq = ",".join("%s in (%s)" % (k, ",".join(v)) if op == "in" else "%s%s%s" % (k, op, v)
                          for k, op, v in labels)
            fq = ",".join("%s=%s" % kv for kv in fields)
            d = {}
            if lq:
                d["labelSelector"] = lq
            if fq:
                d["fieldSelector"] = fq
            return ("/api/v1/namespaces/%s/pods" % ns if ns else "/api/v1/pods"), d

        class W:
            pass

        watchers = []
        streams = [ref]

        def open_stream(w, rv_mode, rv):
            base, d = sel_query(w.sel)
            d = dict(d, watch="1", allowWatchBookmarks="true")
            if rv_mode == "rv":
                d["resourceVersion"] = str(rv)
            elif rv_mode == "zero":
                d["resourceVersion"] = "0"
            elif rv_mode == "sie":
                d.update(sendInitialEvents="true", resourceVersionMatch="NotOlderThan")
            s = Stream(e.kwc.port, base + "?" + urllib.parse.urlencode(d), rcvbuf=4096 if w.slow else None,
                       headers=[("Accept", self.ACCEPT)])
            s.mode, s.start = rv_mode, rv
            w.segments.append(s)
            streams.append(s)
            return s

        e.sim("POST", "/apisim/churn", {"rate": 250, "resources": ["pods"], "label_flip": 0.4,
                                        "mix": {"update": 0.7, "create": 0.15, "delete": 0.15}})
        t_end = time.monotonic() + 8
        next_open = time.monotonic()
        n_open = 0
        while time.monotonic() < t_end:
            now = time.monotonic()
            if n_open < 40 and now >= next_open:
                w = W()
                w.sel = rnd.choice(sels)
                w.slow = rnd.random() < 0.2
                w.resume = rnd.random() < 0.3
                w.segments = []
                mode = rnd.choice(["rv", "rv", "zero", "unset", "sie"])
                cur = e.stats()["rv"]
                open_stream(w, mode, rnd.randint(r0, cur))
                w.pause_at = now + rnd.uniform(0.2, 2) if w.slow else None
                w.next_resume = now + rnd.uniform(0.5, 3) if w.resume else None
                watchers.append(w)
                n_open += 1
                next_open = now + 0.15
            for w in watchers:
                s = w.segments[-1]
                if w.pause_at and now >= w.pause_at and not s.paused:
                    s.paused = True
                    w.unpause_at = now + rnd.uniform(1, 3)
                elif w.pause_at and s.paused and now >= w.unpause_at:
                    s.paused = False
                    w.pause_at = now + rnd.uniform(1, 3)
                if w.next_resume and now >= w.next_resume and s.head is not None and not s.paused:
                    last = s.last_rv()
                    # a client resumes once it is past the initial events (a bookmark says so)
                    if last is not None and any(ev["type"] == "BOOKMARK" for ev in s.events):
                        s.close()
                        open_stream(w, "rv", last)
                    w.next_resume = now + rnd.uniform(0.5, 3)
            pump(streams, lambda: True, 1)  # one pass
            sel_wait = time.monotonic() + 0.02
            pump(streams, lambda: time.monotonic() > sel_wait, 1)
        final = quiesce(e, accept=self.list_accept)
        for w in watchers:
            w.segments[-1].paused = False
        # every watcher has everything up to final once it shows a bookmark at >= final
        def caught_up():
            for w in watchers:
                s = w.segments[-1]
                if not any(ev["type"] == "BOOKMARK" and obj_rv(ev) >= final for ev in s.events):
                    return False
            return ref.last_rv() is not None and ref.last_rv() >= final
        pump(streams, caught_up, 60, "every watcher to see a bookmark at rv %d" % final)

        ref_events = [(ev["type"], obj_rv(ev), ev["object"]) for ev in ref.events if ev["type"] != "BOOKMARK"]
        ref_states = []
        cur_state = dict(state0)
        for t, rv, obj in ref_events:
            cur_state = dict(cur_state)
            if t == "DELETED":
                cur_state.pop(key_of(obj), None)
            else:
                cur_state[key_of(obj)] = obj
            ref_states.append(cur_state)
        lagged = 0
        for i, w in enumerate(watchers):
            with self.subTest(watcher=i, sel=w.sel, modes=[s.mode for s in w.segments]):
                seen = []
                state = {}
                prev_rv = 0
                for s in w.segments:
                    self.assertEqual(s.status, 200)
                    evs = [ev for ev in s.events if ev["type"] != "BOOKMARK"]
                    if s.mode in ("rv",):
                        start = s.start
                        initial = []
                        live = evs
                        if s is w.segments[0]:  # the client listed at start first
                            state = {k: o for k, o in state_at(ref_events, state0, start).items()
                                     if sel_match(w.sel, o)}
                    else:
                        n_init, start = self.split_initial(s, evs, w.sel, ref_events, ref_states, state0, r0, final)
                        initial = evs[:n_init]
                        live = evs[n_init:]
                        snap = {k: o for k, o in state_at(ref_events, state0, start).items() if sel_match(w.sel, o)}
                        got_init = {key_of(ev["object"]): obj_rv(ev) for ev in initial}
                        self.assertEqual(got_init, {k: int(o["metadata"]["resourceVersion"]) for k, o in snap.items()},
                                         "initial state at rv %d" % start)
                        self.assertTrue(all(ev["type"] == "ADDED" for ev in initial))
                        state = dict(snap)
                    want = expected_events(ref_events, start, state0, w.sel)
                    # a segment that was closed early has a prefix of what it was owed
                    got = [(ev["type"], obj_rv(ev), key_of(ev["object"])) for ev in live]
                    self.assertEqual(got, want[:len(got)], "events after rv %d" % start)
                    if s is w.segments[-1]:
                        self.assertEqual(got, [x for x in want if x[1] <= final])
                    for ev in live:
                        rv = obj_rv(ev)
                        self.assertGreater(rv, prev_rv, "rv did not increase")
                        prev_rv = rv
                        k = key_of(ev["object"])
                        if ev["type"] == "DELETED":
                            state.pop(k, None)
                        else:
                            state[k] = ev["object"]
                    if s.mode != "rv" and live:
                        prev_rv = obj_rv(live[-1])
                final_state = {k for k, o in state_at(ref_events, state0, final).items() if sel_match(w.sel, o)}
                self.assertEqual(set(state), final_state)
                lagged += any(s.paused for s in w.segments) or w.slow
        self.assertGreater(lagged, 0, "no watcher was slow: raise the odds")
        for s in streams:
            s.close()
        e.sim("POST", "/apisim/churn", {"rate": 0})


    def split_initial(self, s, evs, sel, ref_events, ref_states, state0, r0, final):
        """(number of initial events, snapshot rv) of a stream that began with
        the state at some rv: the initial-events-end bookmark says it; else the
        snapshot is the rv whose filtered state the leading ADDEDs are and after
        which the rest of the stream is exactly what kube would send."""
        ie = [ev for ev in s.events if ev["type"] == "BOOKMARK" and ev["object"]["metadata"].get("annotations")]
        if ie:
            idx = s.events.index(ie[0])
            return len([ev for ev in s.events[:idx] if ev["type"] != "BOOKMARK"]), obj_rv(ie[0])
        lead = 0
        while lead < len(evs) and evs[lead]["type"] == "ADDED" and (
                lead == 0 or key_of(evs[lead]["object"]) > key_of(evs[lead - 1]["object"])):
            lead += 1
        rvs = [r0] + [rv for _, rv, _ in ref_events]
        states = [state0] + ref_states
        for n in range(lead, -1, -1):
            init = {key_of(ev["object"]): obj_rv(ev) for ev in evs[:n]}
            m = max(init.values(), default=0)
            bound = obj_rv(evs[n]) if n < len(evs) else final + 1
            live = [(ev["type"], obj_rv(ev), key_of(ev["object"])) for ev in evs[n:]]
            for i, rv in enumerate(rvs):
                if rv < m or rv >= bound:
                    continue
                fs = {k: int(o["metadata"]["resourceVersion"]) for k, o in states[i].items() if sel_match(sel, o)}
                if fs != init:
                    continue
                want = expected_events(ref_events, rv, state0, sel)
                if live == want[:len(live)]:
                    return n, rv
        self.fail("no snapshot rv explains the stream %s" % s.path)


class WatchFanout(unittest.TestCase):
    def test_500_watchers_one_upstream_watch(self):
        with Env(apisim_args=["--pods", "50", "--nodes", "5"], kwc_args=["--resources", "v1/pods"]) as e:
            # /readyz says the caches listed; their watches may start a moment
            # later (a slow, sanitized kwc): count from when both are open
            wait_for(lambda: e.stats()["open_watches_by_encoding"].get("pods") == {"json": 1, "protobuf": 1},
                     60, "kwc's two upstream pods watches")
            e.sim("POST", "/apisim/reset-stats")
            base = watches_upstream(e)
            streams = []
            for i in range(500):
                p = "/api/v1/pods?watch=1&resourceVersion=0&timeoutSeconds=30"
                if i % 5 == 1:
                    p += "&fieldSelector=spec.nodeName%3Dnode-" + str(i % 5)
                streams.append(Stream(e.kwc.port, p))
            pump(streams, lambda: all(len(s.events) > 0 for s in streams), 30, "initial events")
            r = e.sim("POST", "/apisim/write", {"verb": "update", "namespace": "default", "name": "pod-1",
                                                "labels": {"x": "y"}})["rv"]
            pump(streams, lambda: all(s.last_rv() == r for s in streams if "nodeName" not in s.path), 30,
                 "the update to reach 500 watchers")
            # one upstream watch per cache: the JSON one these watchers share, and
            # the protobuf cache's (started with kwc, --protobuf-resources)
            self.assertEqual(e.stats()["open_watches_by_encoding"].get("pods"), {"json": 1, "protobuf": 1})
            self.assertEqual(watches_upstream(e), base)
            # the serving loops. threads carry their names (top -H, per-thread
            # CPU in /proc/PID/task: bench/cores.py), the main thread kwc's
            names = {}
            for tid in os.listdir("/proc/%d/task" % e.kwc.pid()):
                with open("/proc/%d/task/%s/comm" % (e.kwc.pid(), tid)) as f:
                    names[int(tid)] = f.read().strip()
            self.assertIn("kwc-serve/0", names.values())
            self.assertEqual(names[e.kwc.pid()], "kwc")
            for s in streams:
                s.close()

    def test_paused_watcher_over_budget_catches_up(self):
        # ~40 MB of events go by while one watcher reads nothing: kwc holds its
        # budget (64 KiB) for it, not the 40 MB. It turns lagging
        # (kwc_watchers_lagging) and is handed nothing more until it reads:
        # what kwc handed it while paused (kwc_watch_sent_bytes_total, less
        # what the fast watcher read) is what its socket buffers took and
        # the budget. The events come in bursts of 500 (2 MB) and the next
        # burst waits until the fast watcher has read the last one. When it
        # reads again it catches up from the window or the store.
        with Env(apisim_args=["--pods", "30", "--pod-size", "4000"],
                 kwc_args=["--resources", "v1/pods", "--watch-budget", "65536",
                           "--watch-window", "4194304"]) as e:
            r0 = quiesce(e)
            slow = Stream(e.kwc.port, "/api/v1/pods?watch=1&resourceVersion=%d" % r0, rcvbuf=4096)
            fast = Stream(e.kwc.port, "/api/v1/pods?watch=1&resourceVersion=%d" % r0)

            def burst(readers):
                rv = e.sim("POST", "/apisim/churn", {"count": 500, "resources": ["pods"],
                                                     "mix": {"update": 1.0}})["rv"]
                pump(readers, lambda: all(s.last_rv() == rv for s in readers), 60,
                     "the watchers to read up to rv %d" % rv)
                return rv

            def counts():
                m = scrape(e.kwc.port)
                return m, {k: total(m, k, group="", version="v1", resource="pods", encoding="json")
                           for k in ("kwc_watch_events_sent_total", "kwc_watch_sent_bytes_total",
                                     "kwc_watchers_lagging")}

            for _ in range(3):  # both read 6 MB: the window is full
                burst([slow, fast])
            slow.paused = True
            _, c0 = counts()
            for _ in range(20):
                final = burst([fast])
            self.assertEqual(len(fast.events), 23 * 500)
            _, c1 = counts()  # the fast watcher has been handed its 10000 events
            events = c1["kwc_watch_events_sent_total"] - c0["kwc_watch_events_sent_total"]
            nbytes = c1["kwc_watch_sent_bytes_total"] - c0["kwc_watch_sent_bytes_total"]
            to_slow = events - 20 * 500  # events kwc handed the paused watcher
            self.assertGreaterEqual(to_slow, 0)
            slow_bytes = to_slow * nbytes / events
            with open("/proc/sys/net/ipv4/tcp_wmem") as f:
                wmem = int(f.read().split()[2])
            # kwc's socket buffer (at most tcp_wmem's largest), the client's
            # (4 KiB asked), the budget, and one delivery past it (at most a
            # burst's 2 MB: the hub hands a batch over in one write)
            bound = wmem + (1 << 20) + 65536 + (3 << 20)
            print("\n    paused watcher: kwc handed it %d of the 10000 events (%d KiB; bound %d KiB)"
                  % (to_slow, slow_bytes // 1024, bound // 1024))
            self.assertLess(slow_bytes, bound, "kwc kept handing a paused watcher its events")
            # (the fast one, if it lagged on a slow machine, has caught up)
            wait_for(lambda: counts()[1]["kwc_watchers_lagging"] == 1, 30,
                     "the paused watcher, and it alone, to lag")
            slow.paused = False
            pump([slow, fast], lambda: slow.last_rv() == final and fast.last_rv() == final, 60, "catch-up")
            _, c2 = wait_for(lambda: (lambda mc: mc[1]["kwc_watchers_lagging"] == 0 and mc)(counts()), 30,
                             "the paused watcher to be live again")
            self.assertEqual(c2["kwc_watch_events_sent_total"] - c0["kwc_watch_events_sent_total"], 2 * 20 * 500,
                             "each watcher handed each event once")
            got = [(ev["type"], obj_rv(ev)) for ev in slow.events]
            self.assertEqual(got, [(ev["type"], obj_rv(ev)) for ev in fast.events])
            self.assertEqual(slow.lines, fast.lines)
            slow.close()
            fast.close()

    def test_stuck_relisting_watchers_bounded_and_not_starving(self):
        # 25 watchers ask for the whole state (resourceVersion=0: 10 MB encoded
        # for each from LMDB) and read nothing. Past what the kernel's socket
        # buffers take, kwc holds at most its cap of such bytes (32 MiB per
        # worker, kwc_watch_store_queued_bytes: the cap, give or take a chunk
        # of at most 64 KiB and an object per stream), not 25 x budget / 2 =
        # 100 MB; a watcher that reads still gets its state at once; the
        # stuck ones get theirs when they read.
        cap = 32 << 20
        slack = 26 * (64 << 10) * 2
        bound = cap + slack
        with Env(apisim_args=["--pods", "200", "--pod-size", "50000"],
                 kwc_args=["--resources", "v1/pods", "--watch-budget", "8388608", "--serving-threads", "1"]) as e:
            quiesce(e)
            queued = lambda: value(scrape(e.kwc.port), "kwc_watch_store_queued_bytes")
            self.assertEqual(queued(), 0)
            stuck = []
            for _ in range(25):
                st = Stream(e.kwc.port, "/api/v1/pods?watch=1&resourceVersion=0", rcvbuf=4096)
                st.paused = True
                stuck.append(st)
            reader = Stream(e.kwc.port, "/api/v1/pods?watch=1&resourceVersion=0")
            pump([reader], lambda: len(reader.events) >= 200, 60, "the reading watcher's 200 pods")
            # the worker serves its streams in turn: the stuck ones have had as
            # many chunks as the reader's 10 MB took, enough to reach the cap
            q = queued()
            self.assertLessEqual(q, bound, "kwc queued the whole state for each stuck watcher (no cap)")
            # (a TLS stream's entries move to its TLS buffer, up to 16 KiB, and
            # leave the count: there it stays just under the cap)
            q = wait_for(lambda: (lambda q: q >= cap - slack and q)(queued()), 60,
                         "the stuck watchers to hold the cap's worth of their state")
            print("\n    25 stuck watchers: kwc holds %d KiB of their state (cap %d KiB)"
                  % (q // 1024, cap // 1024))
            self.assertLessEqual(queued(), bound, "kwc queued past its cap for stuck watchers")
            for st in stuck:
                st.paused = False
            pump(stuck, lambda: all(len(st.events) >= 200 for st in stuck), 120, "the stuck watchers' pods")
            want = sorted(key_of(ev["object"]) for ev in reader.events)
            self.assertEqual(len(set(want)), 200)
            for st in stuck:
                self.assertEqual(sorted(key_of(ev["object"]) for ev in st.events), want)
                self.assertTrue(all(ev["type"] == "ADDED" for ev in st.events))
                st.close()
            reader.close()
            wait_for(lambda: queued() == 0, 30, "every stored byte sent")

    def test_sigterm_ends_streams(self):
        with Env(apisim_args=["--pods", "10"], kwc_args=["--resources", "v1/pods"]) as e:
            streams = [Stream(e.kwc.port, "/api/v1/pods?watch=1"),
                       Stream(e.kwc.port, "/api/v1/pods?watch=1&resourceVersion=0", http10=True)]
            pump(streams, lambda: all(len(s.events) == 10 for s in streams), 10)
            os.kill(e.kwc.pid(), signal.SIGTERM)
            read_until_end(streams, 15)
            self.assertTrue(streams[0].ended, "no terminal chunk")
            self.assertEqual(e.kwc.p.wait(15), 0)


# --------------------------------------------------------------------------
# metadata-only watches (Accept ...;as=PartialObjectMetadata;g=meta.k8s.io;v=v1):
# the same tests, every object (bookmarks too) a PartialObjectMetadata

META_PARAMS = ";as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
# client-go's metadata client asks so: protobuf, then JSON, then plain JSON
META_PB_ACCEPT = "application/vnd.kubernetes.protobuf%s,application/json%s,application/json" % (
    META_PARAMS, META_PARAMS)


class WatchDifferentialMeta(WatchDifferential):
    ACCEPT = "application/json" + META_PARAMS
    LIST_ACCEPT = "application/json"  # the same cache
    KIND, API_VERSION = "PartialObjectMetadata", "meta.k8s.io/v1"


class WatchDifferentialMetaProtobuf(WatchDifferential):
    ACCEPT = META_PB_ACCEPT
    LIST_ACCEPT = kpb.ACCEPT
    CT = kpb.CT_WATCH
    KIND, API_VERSION = "PartialObjectMetadata", "meta.k8s.io/v1"
    KWC_ARGS = ["--protobuf-resources", "v1/pods,apps/v1/deployments"]

    def ct_for(self, path):
        # a custom resource's metadata in protobuf too: kube converts it to a
        # typed PartialObjectMetadata; kwc derives it from the JSON cache
        return self.CT


class WatchModelMeta(WatchModel):
    ACCEPT = "application/json" + META_PARAMS
    LIST_ACCEPT = "application/json"


class WatchModelMetaProtobuf(WatchModel):
    ACCEPT = META_PB_ACCEPT
    LIST_ACCEPT = kpb.ACCEPT
    KWC_ARGS = ["--protobuf-resources", "v1/pods"]


if __name__ == "__main__":
    unittest.main()
