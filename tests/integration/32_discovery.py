"""Discovery answered by kwc from its copy of the upstream's answers (issue 30;
include/kwc/disco.h, discovery.h).

  1. Identical: /api, /apis, /api/v1, /apis/G, /apis/G/V and /version, for
     the Accept headers clients send (none, JSON, JSON with fallbacks, the
     aggregated form, protobuf) and with a curl User-Agent (kube indents
     for it): kwc's answer has apisim's status, body, Content-Type and ETag
     once kwc has recorded the key, and apisim did not see the request.
  2. Passed through: HEAD, a query other than timeout=/pretty=, a key kwc
     has not recorded yet (its first request), a path outside discovery.
  3. Clients: kubectl api-resources through kwc lists what apisim lists,
     and its discovery requests are answered by kwc the second time.
  4. Metrics: kwc_discovery_requests_total by source, refreshes, ready.
  5. --auth delegated: a discovery request kwc answers itself is authorized
     (a SubjectAccessReview, nonResourceAttributes {path, get}); an
     anonymous caller (not in system:authenticated, so not granted by
     system:discovery) gets kube's 403 — the one apisim gives it directly.
  6. ETag and 304 (aggregated discovery): a request with If-None-Match of
     the ETag gets 304 from kwc, as from the upstream, with its ETag, Vary
     and Cache-Control; another ETag gets the document.
  7. A CRD created through kwc appears in kwc's discovery answers within
     the refresh bound, and leaves them when deleted; an APIService with a
     service is counted as an extension server's group version, and its
     discovery document (503: no such service) passes through.
  8. Past 128 KiB (700 CRDs) kwc gzips for a client that accepts it, as
     kube does: the same document, Content-Encoding and Vary.
"""
import http.client
import json
import os
import re
import tempfile
import time
import unittest
import uuid
import zlib

from cluster import (APISIM, KWC_BIN, KWC_EXTRA_ARGS, KWC_WRAP, PYTHON, EnvTestCase, Proc, http_request,
                     kubectl, only_in_plaintext_run, speaks_h2, tls_client, wait_for)

AGG_ACCEPT = ("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
              "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json")
PB = "application/vnd.kubernetes.protobuf"
ACCEPTS = [None, "application/json", "application/json, */*", AGG_ACCEPT, PB + ", application/json", PB]
PATHS = ["/api", "/apis", "/api/v1", "/apis/apps", "/apis/apps/v1", "/apis/example.com/v1", "/version"]
INTERVAL = 1  # --discovery-interval (seconds): the refresh bound the tests wait on


def metric(port, name, headers=None, **labels):
    st, _, b = http_request(port, "GET", "/metrics", headers=headers)
    assert st == 200, (st, b[:200])
    want = ",".join('%s="%s"' % kv for kv in sorted(labels.items()))
    for line in b.decode().splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$", line)
        if m and m.group(1) == name and (m.group(2) or "") == want:
            return float(m.group(3))
    return 0.0


def sim_requests(port, since=0):
    st, _, b = http_request(port, "GET", "/apisim/requests?since=%d" % since)
    assert st == 200, b
    return json.loads(b)


class Marked:
    """Requests that carry a marker header, so apisim's request log tells
    which of them reached it (kwc forwards the header; its own refreshes
    never carry it)."""

    def __init__(self, tc):
        self.tc = tc
        self.mark = "m-" + uuid.uuid4().hex[:12]

    def headers(self, accept=None, extra=None):
        h = {"X-Kwc-Test": self.mark}
        if accept is not None:
            h["Accept"] = accept
        h.update(extra or {})
        return h

    def seen(self, sim_port):
        return [r for r in sim_requests(sim_port)["requests"]
                if r["headers"].get("x-kwc-test") == self.mark]


def get(port, path, accept=None, extra=None, method="GET"):
    h = {}
    if accept is not None:
        h["Accept"] = accept
    h.update(extra or {})
    return http_request(port, method, path, headers=h)


def same_answer(tc, a, b, what):
    tc.assertEqual(a[0], b[0], what + ": status")
    tc.assertEqual(a[2], b[2], what + ": body")
    for h in ("content-type", "etag", "vary", "cache-control", "content-encoding"):
        tc.assertEqual(a[1].get(h), b[1].get(h), "%s: %s" % (what, h))


class Copy(EnvTestCase):
    apisim_args = ("--recent-requests", "2000")
    kwc_args = ("--discovery-interval", "%ds" % INTERVAL)

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        k = cls.env.kwc.port
        wait_for(lambda: metric(k, "kwc_discovery_ready") == 1, 20, "discovery read")

    def warm(self, path, accept=None, extra=None):
        """Ask until kwc answers from its copy (the first request of a key
        passes through and records it)."""
        k = self.env.kwc.port
        before = metric(k, "kwc_discovery_requests_total", source="cache")

        def answered():
            get(k, path, accept, extra)
            return metric(k, "kwc_discovery_requests_total", source="cache") > before
        wait_for(answered, 10, "kwc answers %s (Accept %r) from its copy" % (path, accept), interval=0.05)

    def test_identical(self):
        k, s = self.env.kwc.port, self.env.apisim.port
        for path in PATHS:
            for accept in ACCEPTS:
                for ua in (None, "curl/8.5.0"):
                    extra = {"User-Agent": ua} if ua else {}
                    what = "%s Accept %r UA %r" % (path, accept, ua)
                    self.warm(path, accept, extra)
                    m = Marked(self)
                    got = get(k, path, extra=m.headers(accept, extra))
                    want = get(s, path, accept, extra)
                    same_answer(self, got, want, what)
                    self.assertEqual(m.seen(s), [], what + ": answered without the upstream")
                    self.assertIn("audit-id", got[1], what)

    def test_timeout_query_and_pretty(self):
        """client-go adds ?timeout=32s to discovery requests; ?pretty=true
        indents (JSON)."""
        k, s = self.env.kwc.port, self.env.apisim.port
        for q in ("?timeout=32s", "?pretty=true", "?pretty=false&timeout=5s", "?pretty=1"):
            self.warm("/apis/apps/v1", "application/json")
            m = Marked(self)
            got = get(k, "/apis/apps/v1" + q, extra=m.headers("application/json"))
            want = get(s, "/apis/apps/v1" + q, "application/json")
            same_answer(self, got, want, q)
            self.assertEqual(m.seen(s), [], q)

    def test_passed_through(self):
        k, s = self.env.kwc.port, self.env.apisim.port
        self.warm("/apis", "application/json")
        cases = [("HEAD", "/apis", "application/json"),
                 ("GET", "/apis?labelSelector=a", "application/json"),
                 ("GET", "/apis/", "application/json"),
                 ("GET", "/apis/nosuch.example.com", "application/json"),
                 ("GET", "/apis/apps/v1", "application/json;pretty=1"),
                 ("GET", "/openapi/v2", "application/json"),
                 ("GET", "/apis", "text/x-new-%s" % uuid.uuid4().hex)]  # a key not recorded yet
        for method, path, accept in cases:
            m = Marked(self)
            got = get(k, path, extra=m.headers(accept), method=method)
            want = get(s, path, accept, method=method)
            self.assertEqual(got[0], want[0], "%s %s" % (method, path))
            self.assertEqual(got[2], want[2], "%s %s" % (method, path))
            self.assertEqual(len(m.seen(s)), 1, "%s %s (Accept %s) reached the upstream" % (method, path, accept))

    def test_kubectl_api_resources(self):
        k, s = self.env.kwc.port, self.env.apisim.port

        def api_resources(port):
            cache = tempfile.mkdtemp(prefix="kwc-kubectl-cache-")  # kubectl asks again
            return kubectl("kubectl", port, "api-resources", "--no-headers",
                           "--cache-dir", cache).stdout.decode()
        direct = api_resources(s)
        self.assertIn("widgets", direct)
        self.assertEqual(api_resources(k), direct)
        before = metric(k, "kwc_discovery_requests_total", source="cache")

        def all_from_kwc():
            seq = sim_requests(s)["seq"]
            self.assertEqual(api_resources(k), direct)
            return not [r for r in sim_requests(s, seq)["requests"]
                        if r["target"].split("?")[0] in PATHS
                        and "kubectl" in r["headers"].get("user-agent", "")]
        wait_for(all_from_kwc, 20, "every discovery request of kubectl answered by kwc", interval=0.2)
        self.assertGreater(metric(k, "kwc_discovery_requests_total", source="cache"), before)

    def test_metrics(self):
        k = self.env.kwc.port
        self.assertEqual(metric(k, "kwc_discovery_ready"), 1)
        self.assertGreater(metric(k, "kwc_discovery_resources"), 10)
        n = metric(k, "kwc_discovery_refreshes_total", result="ok")
        wait_for(lambda: metric(k, "kwc_discovery_refreshes_total", result="ok") > n, 10 * INTERVAL,
                 "a refresh every --discovery-interval")
        self.assertEqual(metric(k, "kwc_discovery_refreshes_total", result="failed"), 0)
        self.assertGreater(metric(k, "kwc_discovery_copy_documents"), 0)


@only_in_plaintext_run("sets up its own kwc with --auth delegated")
class Delegated(unittest.TestCase):
    """--auth delegated: kwc authorizes the discovery requests it answers."""

    def test_authorized_as_nonresource(self):
        toks = {"kwc": "tok-kwc-31", "alice": "tok-alice-31", "admin": "tok-admin-31"}
        policy = {"tokens": {toks[n]: {"user": n, "groups": ["system:masters"] if n == "admin" else []}
                             for n in toks},
                  "rules": [{"users": ["kwc"], "verbs": ["get", "list", "watch"], "apiGroups": [""],
                             "resources": ["pods", "namespaces"]},
                            {"users": ["kwc"], "verbs": ["get", "list", "watch"],
                             "apiGroups": ["apiregistration.k8s.io"], "resources": ["apiservices"]},
                            {"users": ["kwc"], "verbs": ["create"],
                             "apiGroups": ["authentication.k8s.io", "authorization.k8s.io"],
                             "resources": ["tokenreviews", "subjectaccessreviews"]},
                            {"users": ["kwc"], "verbs": ["impersonate"], "apiGroups": [""],
                             "resources": ["users", "groups"]}]}
        d = tempfile.mkdtemp(prefix="kwc-disco-auth-")
        pf = os.path.join(d, "policy.json")
        with open(pf, "w") as f:
            json.dump(policy, f)
        procs = []
        try:
            sim = Proc("apisim", [PYTHON, APISIM, "--listen", "127.0.0.1:0", "--policy", pf,
                                  "--recent-requests", "2000"], d)
            sim.start()
            procs.append(sim)
            kc = os.path.join(d, "kubeconfig")
            with open(kc, "w") as f:
                json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "c",
                           "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:%d" % sim.port}}],
                           "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                           "users": [{"name": "u", "user": {"token": toks["kwc"]}}]}, f)
            k = Proc("kwc", KWC_WRAP + [KWC_BIN] + KWC_EXTRA_ARGS +
                     ["--kubeconfig", kc, "--listen", "127.0.0.1:0", "--data-dir", os.path.join(d, "data"),
                      "--resources", "v1/pods", "--auth", "delegated", "--anonymous-auth",
                      "--discovery-interval", "%ds" % INTERVAL], d)
            k.start()
            procs.append(k)
            wait_for(lambda: http_request(k.port, "GET", "/readyz", timeout=2)[0] == 200, 30, "kwc /readyz")
            alice = {"Authorization": "Bearer " + toks["alice"]}
            admin = {"Authorization": "Bearer " + toks["admin"]}  # system:masters: may read /metrics
            cache = lambda: metric(k.port, "kwc_discovery_requests_total", headers=admin, source="cache")
            for path in ("/apis", "/api/v1", "/version"):
                n = cache()
                wait_for(lambda: get(k.port, path, "application/json", alice)[0] == 200 and cache() > n, 10,
                         "kwc answers %s for alice from its copy" % path)
                got = get(k.port, path, "application/json", alice)
                want = get(sim.port, path, "application/json", alice)
                same_answer(self, got, want, path)
            allowed = metric(k.port, "kwc_authorization_decisions_total", headers=admin, decision="allowed")
            self.assertGreater(allowed, 0, "kwc asked SubjectAccessReviews")
            # the anonymous caller: kube's 403 for a path, as apisim gives it
            n = cache()
            got = get(k.port, "/apis", "application/json")
            want = get(sim.port, "/apis", "application/json")
            self.assertEqual(got[0], 403, got)
            self.assertEqual(json.loads(got[2]), json.loads(want[2]))
            self.assertEqual(json.loads(got[2])["message"],
                             'forbidden: User "system:anonymous" cannot get path "/apis"')
            self.assertEqual(cache(), n, "nothing answered from the copy for a denied caller")
            # /version is public-info-viewer's: anonymous may read it
            got = get(k.port, "/version", "application/json")
            self.assertEqual(got[0], 200, got)
            self.assertEqual(k.stop(), 0, k.logs())
        except BaseException:
            for p in procs:
                print("---- %s ----\n%s" % (p.name, p.logs()))
            raise
        finally:
            for p in reversed(procs):
                try:
                    p.stop()
                except Exception:
                    pass


class Aggregated(EnvTestCase):
    """An upstream with aggregated discovery and ETags (apisim from issue 30's
    emulator work on)."""
    apisim_args = ("--recent-requests", "2000")
    kwc_args = ("--discovery-interval", "%ds" % INTERVAL)

    def setUp(self):
        st, h, _ = get(self.env.apisim.port, "/apis", AGG_ACCEPT)
        if st != 200 or "etag" not in h:
            self.skipTest("apisim serves no aggregated discovery with an ETag")

    def test_304(self):
        k, s = self.env.kwc.port, self.env.apisim.port
        for path in ("/api", "/apis"):
            wait_for(lambda: (get(k, path, AGG_ACCEPT), metric(k, "kwc_discovery_requests_total",
                                                                 source="cache") > 0)[1], 10, "warm")
            st, h, b = get(s, path, AGG_ACCEPT)
            m = Marked(self)
            got = get(k, path, extra=m.headers(AGG_ACCEPT, {"If-None-Match": h["etag"]}))
            want = get(s, path, AGG_ACCEPT, {"If-None-Match": h["etag"]})
            self.assertEqual(want[0], 304)
            self.assertEqual(got[0], 304, got)
            self.assertEqual(got[2], b"")
            for name in ("etag", "vary", "cache-control"):
                self.assertEqual(got[1].get(name), want[1].get(name), name)
            self.assertEqual(m.seen(s), [], "304 from kwc's copy")
            # a stale ETag gets the body
            got = get(k, path, AGG_ACCEPT, {"If-None-Match": '"0"'})
            same_answer(self, got, get(s, path, AGG_ACCEPT, {"If-None-Match": '"0"'}), path)


class CRDs(EnvTestCase):
    """CustomResourceDefinitions created and deleted at run time (apisim from
    issue 30's emulator work on)."""
    apisim_args = ("--recent-requests", "2000")
    kwc_args = ("--discovery-interval", "%ds" % INTERVAL)

    def setUp(self):
        st, _, _ = get(self.env.apisim.port, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
        if st != 200:
            self.skipTest("apisim has no CustomResourceDefinitions")

    def test_crd_appears_and_leaves(self):
        k, s = self.env.kwc.port, self.env.apisim.port
        crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
               "metadata": {"name": "gadgets.test31.example.com"},
               "spec": {"group": "test31.example.com", "scope": "Namespaced",
                        "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget",
                                  "listKind": "GadgetList"},
                        "versions": [{"name": "v1", "served": True, "storage": True,
                                      "schema": {"openAPIV3Schema": {"type": "object",
                                                                     "x-kubernetes-preserve-unknown-fields": True}}}]}}
        for accept in ("application/json", AGG_ACCEPT):
            wait_for(lambda: (get(k, "/apis", accept), metric(k, "kwc_discovery_requests_total",
                                                              source="cache") > 0)[1], 10, "warm")

        def listed(accept):
            st, _, b = get(k, "/apis", accept)
            return st == 200 and b"test31.example.com" in b
        st, _, b = http_request(k, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd)
        self.assertIn(st, (200, 201), b)
        t0 = time.monotonic()
        for accept in ("application/json", AGG_ACCEPT):
            wait_for(lambda: listed(accept), 5 * INTERVAL + 5, "the CRD's group in kwc's /apis")
        self.assertLess(time.monotonic() - t0, 5 * INTERVAL + 5)
        st, _, b = get(k, "/apis/test31.example.com/v1", "application/json")
        self.assertEqual(st, 200, b)
        self.assertIn(b'"gadgets"', b)
        for accept in ("application/json", AGG_ACCEPT):
            same_answer(self, get(k, "/apis", accept), get(s, "/apis", accept), "/apis " + accept)
        st, _, b = http_request(k, "DELETE",
                                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gadgets.test31.example.com")
        self.assertIn(st, (200, 202), b)
        for accept in ("application/json", AGG_ACCEPT):
            wait_for(lambda: not listed(accept), 5 * INTERVAL + 5, "the CRD's group gone from kwc's /apis")
        wait_for(lambda: get(k, "/apis/test31.example.com/v1", "application/json")[0] == 404, 10,
                 "its group version gone")

    def test_apiservice_with_a_service(self):
        """An APIService with spec.service: its group version is an extension
        server's (kwc reads the APIService list when discovery changes); its
        discovery document, 503 while the service is away, passes through."""
        k, s = self.env.kwc.port, self.env.apisim.port
        n = metric(k, "kwc_discovery_extension_group_versions")
        svc = {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
               "metadata": {"name": "v1beta1.metrics.test31.io"},
               "spec": {"group": "metrics.test31.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                        "versionPriority": 100, "insecureSkipTLSVerify": True,
                        "service": {"namespace": "kube-system", "name": "metrics-server", "port": 443}}}
        st, _, b = http_request(k, "POST", "/apis/apiregistration.k8s.io/v1/apiservices", body=svc)
        self.assertEqual(st, 201, b)
        wait_for(lambda: metric(k, "kwc_discovery_extension_group_versions") == n + 1, 5 * INTERVAL + 5,
                 "kwc sees the APIService's service")
        for _ in range(3):
            got = get(k, "/apis/metrics.test31.io/v1beta1", "application/json")
            want = get(s, "/apis/metrics.test31.io/v1beta1", "application/json")
            self.assertEqual((got[0], got[2]), (want[0], want[2]))
            self.assertEqual(got[0], 503)
        st, _, b = http_request(k, "DELETE", "/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.metrics.test31.io")
        self.assertEqual(st, 200, b)
        wait_for(lambda: metric(k, "kwc_discovery_extension_group_versions") == n, 5 * INTERVAL + 5,
                 "the APIService gone")


class Large(EnvTestCase):
    """A discovery document past kube's gzip threshold (128 KiB): 700 CRDs."""
    apisim_args = ("--recent-requests", "2000")
    kwc_args = ("--discovery-interval", "%ds" % INTERVAL)
    N = 700

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        s = cls.env.apisim.port
        for i in range(cls.N):
            g = "big%03d.test31.example.com" % i
            crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                   "metadata": {"name": "things." + g},
                   "spec": {"group": g, "scope": "Namespaced",
                            "names": {"plural": "things", "singular": "thing", "kind": "Thing",
                                      "listKind": "ThingList"},
                            "versions": [{"name": "v1", "served": True, "storage": True,
                                          "schema": {"openAPIV3Schema": {
                                              "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}
            st, _, b = http_request(s, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd)
            assert st == 201, (st, b[:300])

    def raw(self, port, accept, gzip, mark=None):
        """(status, [(header, value)] in order, body as sent)"""
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        h = {"Accept": accept}
        if mark:
            h["X-Kwc-Test"] = mark.mark
        if gzip:
            h["Accept-Encoding"] = "gzip"
        c.request("GET", "/apis", headers=h)
        r = c.getresponse()
        out = (r.status, [(k.lower(), v) for k, v in r.getheaders()], r.read())
        c.close()
        return out

    def test_gzip(self):
        k, s = self.env.kwc.port, self.env.apisim.port
        if speaks_h2(k) or tls_client(k):
            k_raw = None  # the raw HTTP/1.1 client below speaks plaintext only
        else:
            k_raw = k
        for accept in ("application/json", AGG_ACCEPT):
            want = self.raw(s, accept, True)
            self.assertEqual(want[0], 200)
            self.assertIn(("content-encoding", "gzip"), want[1], "apisim gzips past 128 KiB")
            body = zlib.decompress(want[2], 16 + zlib.MAX_WBITS)
            self.assertGreater(len(body), 128 * 1024)
            wait_for(lambda: (get(k, "/apis", accept), metric(k, "kwc_discovery_requests_total",
                                                              source="cache") > 0)[1], 10, "warm")
            m = Marked(self)
            wait_for(lambda: get(k, "/apis", extra=m.headers(accept))[2] == body, 5 * INTERVAL + 10,
                     "kwc's copy has the %d CRDs" % self.N)
            if k_raw is None:
                continue
            m = Marked(self)
            got = self.raw(k_raw, accept, True, m)
            self.assertEqual(got[0], 200)
            self.assertEqual(zlib.decompress(got[2], 16 + zlib.MAX_WBITS), body, accept)
            for name in ("content-type", "content-encoding", "etag", "cache-control"):
                self.assertEqual([v for h, v in got[1] if h == name], [v for h, v in want[1] if h == name], name)
            self.assertEqual(sorted(v for h, v in got[1] if h == "vary"), sorted(v for h, v in want[1] if h == "vary"))
            self.assertNotIn("content-length", [h for h, _ in got[1]])
            self.assertEqual(m.seen(s), [], "answered by kwc")


if __name__ == "__main__":
    unittest.main()
