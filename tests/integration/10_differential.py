"""Lists and gets through kwc's cache answer what the upstream answers.

For a matrix of requests (every resourceVersion x resourceVersionMatch x
limit/continue cell, label and field selectors, one namespace, all
namespaces, a cluster-scoped kind, an apps/v1 kind and a custom resource) the
same request goes to apisim directly and through kwc, and the answers are
compared byte for byte:
  - errors: status and Status body (the "current: N" of a too-large rv aside);
  - lists at an exact rv (Exact, limit with rv, continue): the whole body;
  - lists kwc may serve at a newer rv (rv=0, NotOlderThan): kwc's rv must be
    at least the one asked for, and kwc's body must equal apisim's answer to
    the same request pinned to kwc's rv (resourceVersionMatch=Exact), so
    ListMeta, item order, item bytes, continue and remainingItemCount all
    agree at the state kwc claims to have served.
Continue chains are followed to the end through kwc, through apisim, and
crossed (a token from one used with the other).

Variants of the same requests (a smaller matrix, the gets, the chains): gzip
asked (Accept-Encoding: gzip: the same Content-Encoding/Vary decision as
apisim's, the decompressed bytes compared, and equal to the uncompressed
answer), pretty output (?pretty=true, ?pretty=false with a curl User-Agent, a
curl User-Agent alone, an Accept clause with pretty=1) and the JSON
metadata-only form (Accept ...;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1),
each proven served by the cache where the plain request is; with the upstream
stopped kwc still answers them.

apisim's request counters prove which cells kwc answered itself (rv=0, rv=N,
Exact inside the window, kwc's own continue tokens) and which it passed on
(rv unset). The matrix runs quiet, under churn, after a kwc restart, after a
forced upstream 410, and (rv=0 only) with the upstream stopped.
"""
import gzip
import json
import re
import unittest
import urllib.parse

import kpb
from cluster import Env, http_connection, http_request, wait_for
from scrape import scrape

RESOURCES = "v1/pods,v1/nodes,v1/namespaces,apps/v1/deployments,example.com/v1/widgets"
JSON = {"Accept": "application/json"}
CURL_UA = "curl/8.5.0"
META_G = ";g=meta.k8s.io;v=v1"


def q(**kw):
    return urllib.parse.urlencode({k: v for k, v in kw.items() if v is not None})


def decode(b):
    """A JSON or protobuf body (kpb decodes protobuf independently of kwc)."""
    return kpb.decode_body(b) if b[:4] == kpb.MAGIC else json.loads(b)


def is_get(path):
    """A get (a name after the resource) rather than a list."""
    segs = [x for x in path.partition("?")[0].split("/") if x]
    segs = segs[2:] if segs[0] == "api" else segs[3:]
    if segs and segs[0] == "namespaces" and len(segs) >= 3:
        segs = segs[2:]
    return len(segs) == 2


def add_query(path, kv):
    """path with kv appended to its raw query (the rest of it kept as it is)."""
    if "?" not in path:
        return path + "?" + kv
    return path + kv if path.endswith("?") else path + "&" + kv


def body_rv(b):
    return int(decode(b)["metadata"]["resourceVersion"])


def with_query(path, **changes):
    base, _, qs = path.partition("?")
    params = urllib.parse.parse_qsl(qs, keep_blank_values=True)
    d = dict(params)
    for k, v in changes.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    return base + ("?" + urllib.parse.urlencode(d) if d else "")


def repeated_headers(port, path):
    """Header names that occur more than once in the answer to path."""
    c = http_connection(port)
    try:
        c.request("GET", path, headers=JSON)
        r = c.getresponse()
        r.read()
        names = [k.lower() for k, _ in r.getheaders()]
        return sorted({n for n in names if names.count(n) > 1})
    finally:
        c.close()


def norm_status(b):
    """A Status body with the part that legitimately differs (the current rv
    in 'Too large resource version: N, current: M') blanked."""
    if b[:4] == kpb.MAGIC:
        d = kpb.decode_body(b)
        d["message"] = re.sub(r"current: \d+", "current: M", d["message"])
        return json.dumps(d, sort_keys=True).encode()
    return re.sub(rb"current: \d+", b"current: M", b)



def relisted(kwc):
    """Each started cache's relists done: its "relisted at rv" log lines (the
    cache named as the log names it; a cache that never listed, such as a
    protobuf one no client asked for, has none to lose)."""
    text = kwc.logs(1 << 30)
    caches = [dict(ls) for (n, ls), v in scrape(kwc.port).items() if n == "kwc_reflector_lists_total" and v > 0]
    names = [c["resource"] + (" (protobuf)" if c.get("encoding") == "protobuf" else "") for c in caches]
    return {name: text.count("cache %s: relisted at rv" % name) for name in names}

class Differential(unittest.TestCase):
    memo = {}  # exact request -> apisim's 200 body (an exact state never changes)
    ACCEPT = JSON  # what every request of the matrix asks for
    CT = "application/json"  # what kwc must answer built-in kinds with
    KWC_ARGS = []

    @classmethod
    def setUpClass(cls):
        cls.memo = {}
        cls.env = Env(apisim_args=["--pods", "90", "--namespaces", "3", "--nodes", "4", "--history", "200000",
                                   "--bookmark-interval", "0.5"],
                      kwc_args=["--resources", RESOURCES, "--rv-wait-timeout", "300ms"] + cls.KWC_ARGS)
        e = cls.env
        e.sim("POST", "/apisim/seed", {"resource": "deployments", "count": 8, "namespaces": 2})
        e.sim("POST", "/apisim/seed", {"resource": "widgets", "count": 9, "namespaces": 2})
        cls.rv_seeded = e.sim("GET", "/apisim/stats")["rv"]
        # history: updates, label changes, deletes, creates
        def pod(j):  # apisim seeds pod-j into ns-(j % 3)
            return {"resource": "pods", "namespace": "ns-%d" % (j % 3), "name": "pod-%d" % j}
        for i in range(12):
            e.sim("POST", "/apisim/write", dict(pod(i * 7 % 90), verb="update", labels={"app": "moved", "n": str(i)}))
        for i in range(4):
            e.sim("POST", "/apisim/write", dict(pod(i * 11 % 90 + 1), verb="delete"))
        cls.rv_mid = e.sim("GET", "/apisim/stats")["rv"]
        for i in range(5):
            e.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "ns-1",
                                            "name": "late-%d" % i, "labels": {"app": "late"}})
        cls.quiesce()

    @classmethod
    def tearDownClass(cls):
        codes = cls.env.close()
        if codes.get("kwc") not in (0, None):
            raise AssertionError("kwc exited with %r" % codes.get("kwc"))

    def run(self, result=None):
        r = super().run(result)
        if result is not None and (result.failures or result.errors):
            self.env.dump_logs()
        return r

    # -- helpers ---------------------------------------------------------------
    @classmethod
    def quiesce(cls):
        """Stop churn; wait until kwc serves every resource at apisim's rv,
        from each of its caches: a protobuf run has a JSON cache of the same
        resource beside it, and that one's relist would otherwise show up as
        an upstream list in the middle of a served check."""
        e = cls.env
        e.sim("POST", "/apisim/churn", {"rate": 0})
        rv = e.sim("GET", "/apisim/stats")["rv"]
        accepts = [cls.ACCEPT] + ([JSON] if cls.ACCEPT != JSON else [])
        for path in ("/api/v1/pods", "/api/v1/nodes", "/api/v1/namespaces", "/apis/apps/v1/deployments",
                     "/apis/example.com/v1/widgets"):
            for accept in accepts:
                # rv=0 is always the cache's own answer (an rv=N the cache has not
                # reached would be passed upstream and prove nothing)
                def reached(path=path, accept=accept):
                    lists = cls.lists_upstream_of(e)
                    st, _, b = http_request(e.kwc.port, "GET", path + "?resourceVersion=0", headers=accept)
                    return st == 200 and body_rv(b) >= rv and cls.lists_upstream_of(e) == lists
                wait_for(reached, 30, "kwc to reach rv %d on %s (%s)" % (rv, path, accept["Accept"]))
        return rv

    @staticmethod
    def lists_upstream_of(env):
        """Lists and gets the upstream has answered."""
        return sum(v for k, v in env.stats()["requests"].items() if k.startswith(("list ", "get ")))

    def lists_upstream(self):
        return self.lists_upstream_of(self.env)

    def ct_for(self, path):
        return "application/json" if "/apis/example.com/" in path else self.CT

    # -- variants: the same requests asked another way ------------------------------
    # gzip: Accept-Encoding: gzip; pretty: ?pretty=true; pretty-false-curl:
    # ?pretty=false with a curl User-Agent (not pretty); curl: a curl User-Agent
    # (pretty); accept-pretty: the Accept clause with pretty=1; meta: the JSON
    # PartialObjectMetadata[List]; "+" combines them.
    VARIANTS = ("gzip", "pretty", "pretty-false-curl", "curl", "accept-pretty", "meta", "meta+pretty+gzip")

    def variants(self, *only):
        """The class's variants (the metadata one is JSON's: 20_protobuf has its own)."""
        vs = [v for v in self.VARIANTS if self.ACCEPT == JSON or "meta" not in v]
        return [v for v in vs if not only or v in only]

    def variant_req(self, path, variant):
        """(path, headers) of path asked as variant (None: as the class asks)."""
        h = dict(self.ACCEPT)
        if isinstance(variant, tuple):   # (raw query to add, ((header, value), ...) to add)
            return (add_query(path, variant[0]) if variant[0] else path), dict(h, **dict(variant[1]))
        for v in (variant or "").split("+"):
            if v == "gzip":
                h["Accept-Encoding"] = "gzip"
            elif v == "pretty":
                path = add_query(path, "pretty=true")
            elif v == "pretty-false-curl":
                path = add_query(path, "pretty=false")
                h["User-Agent"] = CURL_UA
            elif v == "curl":
                h["User-Agent"] = CURL_UA
            elif v == "accept-pretty":
                h["Accept"] += ";pretty=1"
            elif v == "meta":
                h["Accept"] = "application/json;as=PartialObjectMetadata%s%s" % ("" if is_get(path) else "List", META_G)
            elif v:
                raise AssertionError("unknown variant " + v)
        return path, h

    def fetch(self, port, path, variant=None):
        """(status, headers, body) of path asked as variant; a gzip body is
        decompressed (the headers still say it was)."""
        p, h = self.variant_req(path, variant)
        st, hd, b = http_request(port, "GET", p, headers=h)
        if hd.get("content-encoding") == "gzip":
            self.assertNotIn("content-length", hd, "%s %s: a gzip answer has no Content-Length" % (p, variant))
            b = gzip.decompress(b)
        return st, hd, b

    def same_encoding(self, k, s, what):
        """kwc made apisim's gzip decision (kube's: asked for, and over 128 KiB)."""
        self.assertEqual((k[1].get("content-encoding"), k[1].get("vary")),
                         (s[1].get("content-encoding"), s[1].get("vary")),
                         "%s: Content-Encoding/Vary of kwc vs apisim (bodies %d / %d bytes)" % (
                             what, len(k[2]), len(s[2])))

    def check(self, path, exact=False, served=None, variant=None):
        """Compare one request (asked as variant); returns kwc's response.
        served: True/False asserts whether kwc answered it from its cache
        (apisim saw no list)."""
        before = self.lists_upstream() if served is not None else 0
        e = self.env
        what = path if not variant else "%s [%s]" % (path, variant)
        k = self.fetch(e.kwc.port, path, variant)
        if served is not None:
            n = self.lists_upstream() - before
            self.assertEqual(n == 0, served, "%s: %s by kwc (upstream saw %d lists)" % (
                what, "expected to be served" if served else "expected to be passed on", n))
        s = self.fetch(e.apisim.port, path, variant)
        if exact and s[0] == 200:
            self.memo[(path, variant)] = s[2]
        if exact and k[0] == 200 and s[0] == 410 and (path, variant) in self.memo:
            # kwc's history reaches further back than the upstream's: it still
            # answers an exact list the upstream has compacted away, with the
            # answer the upstream gave before
            self.assertEqual(k[2], self.memo[(path, variant)], what + " (compacted upstream)")
            return k
        self.assertEqual(k[0], s[0], "%s: status kwc %d vs apisim %d\nkwc: %s\nsim: %s" % (
            what, k[0], s[0], k[2][:400], s[2][:400]))
        if k[0] != 200:
            self.same_encoding(k, s, what)
            self.assertEqual(norm_status(k[2]), norm_status(s[2]), what)
            self.assertEqual(k[1].get("retry-after"), s[1].get("retry-after"), what)
            return k
        meta = isinstance(variant, str) and "meta" in variant
        want_ct = s[1].get("content-type") if meta else self.ct_for(path)
        self.assertEqual(k[1].get("content-type"), want_ct, what)
        if exact or k[2] == s[2]:
            self.same_encoding(k, s, what)
            self.assertEqual(k[2], s[2], what)
            if isinstance(variant, str) and "gzip" in variant and exact:
                # and the same as the answer not compressed
                self.assertEqual(self.fetch(e.apisim.port, path, variant.replace("gzip", ""))[2], s[2], what)
            return k
        # served at a newer rv than apisim's (or an older one it may return):
        # pin apisim to kwc's rv
        krv = body_rv(k[2])
        asked = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(path).query,
                                            keep_blank_values=True)).get("resourceVersion")
        if asked and asked.isdigit():
            self.assertGreaterEqual(krv, int(asked), "%s: kwc served an older rv" % path)
        pinned = with_query(path, resourceVersion=str(krv), resourceVersionMatch="Exact")
        if asked == "0":
            pinned = with_query(pinned, limit=None)
        p = self.fetch(e.apisim.port, pinned, variant)
        self.assertEqual(p[0], 200, "%s: apisim %d for %s: %s" % (what, p[0], pinned, p[2][:300]))
        self.same_encoding(k, p, what + " pinned")
        self.assertEqual(k[2], p[2], "%s: kwc's list at rv %d differs from apisim's at that rv" % (what, krv))
        return k

    def chain(self, first, port_for_page, variant=None):
        """Follow continue tokens; port_for_page(i) picks who answers page i.
        Returns the concatenated item names and the number of pages (with a
        variant: the pages' bytes too)."""
        names, path, pages = [], first, 0
        while True:
            port = port_for_page(pages)
            st, _, b = self.fetch(port, path, variant)
            self.assertEqual(st, 200, "%s page %d: %s" % (first, pages, b[:300]))
            d = decode(b)
            names += ["%s/%s" % (i["metadata"].get("namespace", ""), i["metadata"]["name"]) for i in d["items"]]
            if variant:
                # the pages themselves (tokens aside: kwc's and apisim's name the same key)
                names.append(re.sub(rb'"continue": ?"[^"]*"', b'"continue":"C"', b) if b[:4] != kpb.MAGIC else
                             repr(dict(d, metadata=dict(d["metadata"], **{"continue": "C"}))))
            pages += 1
            c = d["metadata"].get("continue")
            if not c:
                return names, pages
            self.assertLess(pages, 200, "runaway chain")
            path = with_query(first, **{"continue": c, "resourceVersion": None, "resourceVersionMatch": None})

    # -- the matrix ----------------------------------------------------------------
    SCOPES = ["/api/v1/pods", "/api/v1/namespaces/ns-1/pods", "/api/v1/nodes", "/api/v1/namespaces",
              "/apis/apps/v1/deployments", "/apis/apps/v1/namespaces/ns-0/deployments",
              "/apis/example.com/v1/widgets", "/apis/example.com/v1/namespaces/ns-1/widgets"]

    def cells(self, cur, served_checks, rvs, matches, limits):
        """(path, exact, served) of each cell of the matrix over these values."""
        old = self.rv_mid
        for scope in self.SCOPES:
            for rv in rvs:
                for m in matches:
                    for lim in limits:
                        path = scope + "?" + q(resourceVersion=rv, resourceVersionMatch=m, limit=lim)
                        served = None
                        if served_checks and m is None and lim is None:
                            if rv == "0" or rv == str(cur):
                                served = True
                            elif rv is None:
                                served = False
                        if served_checks and m == "Exact" and rv == str(old):
                            served = True
                        exact = m == "Exact" or (m is None and lim not in (None, "0") and rv not in (None, "", "0"))
                        yield path, exact, served

    def matrix(self, served_checks=True):
        e = self.env
        cur = self.quiesce() if served_checks else e.sim("GET", "/apisim/stats")["rv"]
        n = 0
        rvs = [None, "", "0", str(self.rv_mid), str(cur), "abc", "-1"]
        for path, exact, served in self.cells(cur, served_checks, rvs, [None, "NotOlderThan", "Exact", "Bogus"],
                                              [None, "4", "0", "x"]):
            self.check(path, exact=exact, served=served)
            n += 1
        return n

    def variant_matrix(self):
        """Every variant over the cells that matter to it: each rv kind, no match
        or Exact, no limit or a page (a quarter of the matrix: the errors, the
        served and the passed-on answers), then the gets and the chains."""
        cur = self.quiesce()
        n = 0
        for variant in self.variants():
            for path, exact, served in self.cells(cur, True, [None, "0", str(self.rv_mid), str(cur), "abc"],
                                                  [None, "Exact"], [None, "4"]):
                self.check(path, exact=exact, served=served, variant=variant)
                n += 1
        self.gets(self.variants())
        self.chains(self.variants("gzip", "pretty", "meta"))
        return n

    def selectors(self, served_checks=True):
        e = self.env
        cur = self.quiesce() if served_checks else e.sim("GET", "/apisim/stats")["rv"]
        cases = [
            ("/api/v1/pods", "labelSelector", "app=app-3"),
            ("/api/v1/pods", "labelSelector", "app in (app-1,app-2,moved)"),
            ("/api/v1/pods", "labelSelector", "!n"),
            ("/api/v1/pods", "labelSelector", "app,tier notin (backend)"),
            ("/api/v1/pods", "labelSelector", "app=="),           # 400 from the parser
            ("/api/v1/pods", "labelSelector", "n>3"),
            ("/api/v1/pods", "fieldSelector", "spec.nodeName=node-2"),
            ("/api/v1/pods", "fieldSelector", "status.phase=Running,spec.nodeName!=node-0"),
            ("/api/v1/pods", "fieldSelector", "metadata.namespace=ns-2"),
            ("/api/v1/pods", "fieldSelector", "metadata.name=pod-5"),
            ("/api/v1/pods", "fieldSelector", "spec.host=node-1"),  # kube converts: passed on
            ("/api/v1/pods", "fieldSelector", "spec.bogus=1"),      # kube's 400: passed on
            ("/api/v1/namespaces/ns-1/pods", "fieldSelector", "spec.nodeName=node-1"),
            ("/api/v1/nodes", "fieldSelector", "metadata.name=node-1"),
            ("/api/v1/nodes", "fieldSelector", "metadata.namespace="),
            ("/apis/example.com/v1/widgets", "labelSelector", "app"),
        ]
        # the node index: every page size, so some page ends on the node's last
        # pod while other nodes' pods follow it in key order (kube still says
        # there is more: its etcd range saw further keys)
        for node in range(4):
            for lim in range(1, 30):
                for scope in ("/api/v1/pods", "/api/v1/namespaces/ns-0/pods"):
                    self.check(scope + "?" + q(fieldSelector="spec.nodeName=node-%d" % node, limit=str(lim),
                                               resourceVersion=str(self.rv_mid)), exact=True)
        for scope, key, sel in cases:
            for extra in ({"resourceVersion": "0"}, {"resourceVersion": str(cur)},
                          {"resourceVersion": str(self.rv_mid), "limit": "5"},
                          {"resourceVersion": str(cur), "resourceVersionMatch": "NotOlderThan", "limit": "3"}):
                path = scope + "?" + q(**{key: sel}, **extra)
                self.check(path, exact="limit" in extra and "resourceVersionMatch" not in extra)

    def gets(self, variants=(None,)):
        cur = self.quiesce()
        for path in ("/api/v1/namespaces/ns-1/pods/pod-4", "/api/v1/namespaces/ns-1/pods/late-2",
                     "/api/v1/namespaces/ns-1/pods/missing", "/api/v1/nodes/node-1", "/api/v1/nodes/nope",
                     "/api/v1/namespaces/ns-2", "/apis/apps/v1/namespaces/ns-0/deployments/deploy-0",
                     "/apis/apps/v1/namespaces/ns-0/deployments/missing",
                     "/apis/example.com/v1/namespaces/ns-1/widgets/widget-1",
                     "/apis/example.com/v1/namespaces/ns-0/widgets/nope"):
            for rv in ("0", str(cur), None, "abc"):
                # a Namespace's get too, whose path has the form of a namespaced one
                served = True if rv in ("0", str(cur)) else False if rv is None else None
                if served and self.ACCEPT is not JSON and "widgets/nope" in path:
                    served = False  # a custom resource's 404 with protobuf asked for: the upstream's
                for variant in variants:
                    self.check(path + ("?" + q(resourceVersion=rv) if rv is not None else ""), exact=True,
                               served=served, variant=variant)
            # kwc's own answers (200 and 404) carry each header once, as kube's do
            self.assertEqual(repeated_headers(self.env.kwc.port, path + "?resourceVersion=0"), [], path)

    def chains(self, variants=(None,)):
        # the label chain below needs more than one page of app=moved pods;
        # churn (label flips, deletes) may have left fewer: label more
        self.quiesce()
        e = self.env
        pods = e.sim("GET", "/api/v1/pods")["items"]
        moved = [p for p in pods if p["metadata"].get("labels", {}).get("app") == "moved"]
        for p in [p for p in pods if p not in moved][:max(0, 12 - len(moved))]:
            e.sim("POST", "/apisim/write", {"verb": "update", "resource": "pods",
                                            "namespace": p["metadata"]["namespace"],
                                            "name": p["metadata"]["name"], "labels": {"app": "moved"}})
        cur = self.quiesce()
        for first in ("/api/v1/pods?limit=7", "/api/v1/pods?limit=7&resourceVersion=%d" % self.rv_mid,
                      "/api/v1/namespaces/ns-2/pods?limit=4&resourceVersion=%d&resourceVersionMatch=NotOlderThan" % cur,
                      "/api/v1/pods?limit=5&labelSelector=app%%3Dmoved&resourceVersion=%d" % cur,
                      "/apis/example.com/v1/widgets?limit=2&resourceVersion=%d" % cur):
            for variant in variants:
                what = first if not variant else "%s [%s]" % (first, variant)
                via_kwc = self.chain(first, lambda i: self.env.kwc.port, variant)
                if self.fetch(self.env.apisim.port, first, variant)[0] == 410:
                    # compacted upstream: kwc's longer history still has the chain
                    self.assertEqual(via_kwc, self.memo[(first, variant)], what + " (compacted upstream)")
                    continue
                via_sim = self.chain(first, lambda i: self.env.apisim.port, variant)
                self.memo[(first, variant)] = via_sim
                cross1 = self.chain(first, lambda i: self.env.kwc.port if i % 2 else self.env.apisim.port, variant)
                cross2 = self.chain(first, lambda i: self.env.apisim.port if i % 2 else self.env.kwc.port, variant)
                self.assertEqual(via_kwc, via_sim, what)
                self.assertEqual(cross1, via_sim, what + " (apisim, kwc, apisim, ...)")
                self.assertEqual(cross2, via_sim, what + " (kwc, apisim, kwc, ...)")
                self.assertGreater(via_kwc[1], 1, what + " is more than one page")
        # a chain through kwc never touches the upstream once it has a token
        for variant in variants:
            st, _, b = self.fetch(self.env.kwc.port, "/api/v1/pods?limit=10&resourceVersion=%d" % cur, variant)
            before = self.lists_upstream()
            c = decode(b)["metadata"]["continue"]
            while c:
                st, _, b = self.fetch(self.env.kwc.port, "/api/v1/pods?limit=10&continue=" + c, variant)
                self.assertEqual(st, 200)
                c = decode(b)["metadata"].get("continue")
            self.assertEqual(self.lists_upstream(), before,
                             "kwc passed a page of its own chain upstream [%s]" % variant)

    # -- the tests (in name order) ------------------------------------------------
    def test_1_quiet(self):
        n = self.matrix()
        self.assertGreater(n, 800)
        self.selectors()
        self.gets()
        self.chains()

    def test_1_variants(self):
        # gzip, pretty, metadata-only: the same answers as apisim's, served where
        # the plain request is
        self.assertGreater(self.variant_matrix(), 100)

    # the edges of kube's rules: ?pretty parsed as Go's url.ParseQuery and
    # strconv.ParseBool, the User-Agent prefixes, Accept-Encoding's exact tokens
    EDGES = [("pretty=1;x", ()), ("pretty=%74rue", ()), ("pretty=yes", (("User-Agent", CURL_UA),)),
             ("pretty=", (("User-Agent", CURL_UA),)), ("pretty", (("User-Agent", CURL_UA),)), ("pretty=T", ()),
             ("pretty=tRuE", ()), ("pretty=0&pretty=1", ()), ("x=pretty", (("User-Agent", CURL_UA),)),
             ("", (("User-Agent", "Wget/1.21"),)), ("", (("User-Agent", "Mozilla/5.0 (X11)"),)),
             ("", (("User-Agent", "curlish"),)), ("", (("User-Agent", "Curl/8"),)),
             ("", (("User-Agent", "mozilla/5.0"),)),
             ("", (("Accept-Encoding", "gzip;q=0"),)), ("", (("Accept-Encoding", "GZIP"),)),
             ("", (("Accept-Encoding", " br , gzip "),)), ("", (("Accept-Encoding", "x-gzip, *"),)),
             ("pretty=1", (("Accept-Encoding", "deflate,gzip"),))]

    def test_1_variant_edges(self):
        cur = self.quiesce()
        for path, exact in (("/api/v1/pods?resourceVersion=0", False),
                            ("/api/v1/namespaces/ns-1/pods?resourceVersion=0", False),
                            ("/api/v1/pods?resourceVersion=%d&resourceVersionMatch=Exact" % cur, True),
                            ("/api/v1/namespaces/ns-1/pods/pod-4?resourceVersion=0", True),
                            ("/api/v1/namespaces/ns-1/pods/missing?resourceVersion=0", True)):
            for edge in self.EDGES:
                self.check(path, exact=exact, served=True, variant=edge)

    def test_2_under_churn(self):
        e = self.env
        e.sim("POST", "/apisim/churn", {"rate": 150, "label_flip": 0.3})
        try:
            # only exact or pinned comparisons hold while the state moves
            self.matrix(served_checks=False)
            self.selectors(served_checks=False)
        finally:
            e.sim("POST", "/apisim/churn", {"rate": 0})

    def test_3_after_restart(self):
        e = self.env
        self.assertEqual(e.kwc.stop(), 0, e.kwc.logs())
        e.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "ns-0",
                                        "name": "while-down", "labels": {"app": "while-down"}})
        e.start_kwc()
        self.matrix()
        self.selectors()

    def test_4_after_upstream_410(self):
        e = self.env
        # writes kwc cannot see, then a compaction past them and a dropped watch:
        # kwc's re-watch gets 410 and relists
        before = relisted(e.kwc)
        e.sim("POST", "/apisim/fail", {"count": 1000, "match": "watch=", "mode": "status", "status": 503})
        self.addCleanup(e.sim, "POST", "/apisim/fail", {"clear": True})
        e.sim("POST", "/apisim/drop-watches", {})
        for i in range(6):
            e.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "ns-2",
                                            "name": "unseen-%d" % i, "labels": {"app": "unseen"}})
        e.sim("POST", "/apisim/write", {"verb": "delete", "resource": "pods", "namespace": "ns-2",
                                        "name": "unseen-0"})
        e.sim("POST", "/apisim/compact", {})
        e.sim("POST", "/apisim/fail", {"clear": True})
        # every cache (each in its own time: its re-watch waits out its
        # backoff), so that no reflector's list lands in a served check's count
        wait_for(lambda: all(n > before.get(c, 0) for c, n in relisted(e.kwc).items()), 30,
                 "every cache to relist after the upstream's 410")
        self.matrix()
        self.selectors()
        self.chains()

    # the lists test_5 reads with the upstream down
    DOWN_PATHS = ("/api/v1/pods", "/api/v1/namespaces/ns-1/pods", "/api/v1/nodes",
                  "/apis/example.com/v1/widgets", "/api/v1/pods?labelSelector=app%3Dmoved")

    def test_5_upstream_down(self):
        e = self.env
        cur = self.quiesce()
        want = {}
        # the plain lists, and some asked as variants (gzip, pretty, metadata-only)
        cases = [(p, None) for p in self.DOWN_PATHS]
        cases += [(p, v) for v in self.variants("meta", "pretty", "gzip", "curl", "meta+pretty+gzip")
                  for p in ("/api/v1/pods", "/api/v1/namespaces/ns-1/pods", "/apis/example.com/v1/widgets")
                  if p in self.DOWN_PATHS]
        for path, variant in cases:
            full = add_query(path, "resourceVersion=%d&resourceVersionMatch=Exact" % cur)
            s = self.fetch(e.apisim.port, full, variant)
            self.assertEqual(s[0], 200)
            want[(path, variant)] = s
        # the variants are the cache's answers: apisim's list and get counters stay
        before = self.lists_upstream()
        for (path, variant), s in want.items():
            if variant:
                k = self.fetch(e.kwc.port, add_query(path, "resourceVersion=0"), variant)
                self.assertEqual(self.lists_upstream(), before, "%s [%s]: kwc asked the upstream" % (path, variant))
                self.same_encoding(k, s, "%s [%s]" % (path, variant))
                self.assertEqual(k[2], s[2], "%s [%s]" % (path, variant))
        e.apisim.stop()
        try:
            def served_down(when):
                for (path, variant), s in want.items():
                    full = add_query(path, "resourceVersion=0")
                    what = "%s [%s] %s" % (full, variant, when)
                    k = self.fetch(e.kwc.port, full, variant)
                    self.assertEqual(k[0], 200, "%s: %s" % (what, k[2][:300]))
                    self.same_encoding(k, s, what)
                    self.assertEqual(k[2], s[2], what)
            served_down("with the upstream down")
            st, _, got = http_request(e.kwc.port, "GET", "/api/v1/pods", headers=self.ACCEPT)
            self.assertEqual(st, 503, "a quorum read cannot be served with the upstream down")
            # a warm restart while the upstream is down serves the same at once
            self.assertEqual(e.kwc.stop(), 0, e.kwc.logs())
            e.start_kwc()
            served_down("after a restart, upstream down")
        finally:
            e.apisim.start()


class TooLargeRV(unittest.TestCase):
    """--too-large-rv=504: kube-apiserver's own answer for an rv the cache has
    not reached after the wait, without asking the upstream; by default the
    request goes upstream instead."""

    def test_504_and_pass(self):
        with Env(apisim_args=["--pods", "5"],
                 kwc_args=["--resources", "v1/pods", "--too-large-rv", "504"]) as e:
            cur = e.sim("GET", "/apisim/stats")["rv"]
            for path in ("/api/v1/pods?resourceVersion=%d" % (cur + 1000),
                         "/api/v1/namespaces/default/pods/pod-0?resourceVersion=%d" % (cur + 1000)):
                before = e.stats()["requests"]
                st, h, b = http_request(e.kwc.port, "GET", path, headers=JSON)
                self.assertEqual(e.stats()["requests"], before, "kwc asked the upstream")
                self.assertEqual(st, 504, b)
                self.assertEqual(h.get("retry-after"), "1")
                s = http_request(e.apisim.port, "GET", path, headers=JSON)
                self.assertEqual(s[0], 504)
                self.assertEqual(norm_status(b), norm_status(s[2]))
                d = json.loads(b)
                self.assertEqual(d["reason"], "Timeout")
                self.assertEqual(d["details"]["causes"][0]["reason"], "ResourceVersionTooLarge")
            # a write reaching the cache within the wait is served
            st = {}

            def later():
                st["rv"] = e.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods",
                                                           "namespace": "default", "name": "soon"})["rv"]
            import threading
            t = threading.Timer(0.05, later)
            t.start()
            code, _, b = http_request(e.kwc.port, "GET", "/api/v1/pods?resourceVersion=%d" % (cur + 1), headers=JSON)
            t.join()
            self.assertEqual(code, 200, b)
            self.assertGreaterEqual(body_rv(b), cur + 1)
            self.assertIn(b'"name":"soon"', b)
        with Env(apisim_args=["--pods", "5"], kwc_args=["--resources", "v1/pods", "--rv-wait-timeout", "200ms"]) as e:
            cur = e.sim("GET", "/apisim/stats")["rv"]
            n = e.stats()["requests"].get("list pods", 0)
            st, h, b = http_request(e.kwc.port, "GET", "/api/v1/pods?resourceVersion=%d" % (cur + 5), headers=JSON)
            self.assertEqual(st, 504, b)  # apisim's own answer, after its 3 s
            self.assertEqual(e.stats()["requests"].get("list pods", 0), n + 1, "default: passed upstream")


if __name__ == "__main__":
    unittest.main()
