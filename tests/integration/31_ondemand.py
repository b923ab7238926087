"""On-demand caches (issue 30): with --resources unset (auto), the first list,
get or watch of any resource discovery lists as listable and watchable starts
its cache; the request waits for the first sync and is answered from the
cache, as is every later one. Excluded resources, aggregated APIs and
resources past --max-caches pass through. A cache nobody uses stops, keeps
its data, and resumes from its resourceVersion without a relist.

Whether an answer came from the cache is read from two sides: kwc's
kwc_requests_total{source} and the upstream's own request log
(/apisim/requests), in which the client's request must not appear.

Under --auth delegated (WhoStartsCaches) only a caller kwc authorized
itself starts a cache: a denied caller gets 403, one without valid
credentials 401, and neither makes kwc list or watch anything."""
import json
import time
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))

from cluster import Env, EnvTestCase, connect, http_request, kwc_proc, only_in_plaintext_run, wait_for  # noqa: E402
from scrape import scrape, total, value  # noqa: E402


def served_from(port, verb, resource, source):
    return total(scrape(port), "kwc_requests_total", verb=verb, resource=resource, source=source)


def upstream_targets(env, since):
    """The targets the upstream received after seq `since`."""
    r = env.sim("GET", "/apisim/requests?since=%d" % since)
    return [q["target"] for q in r["requests"]]


def upstream_seq(env):
    return env.sim("GET", "/apisim/requests")["seq"]


class WatchLines:
    """A JSON watch over HTTP/1.1 (chunked), read event by event."""

    def __init__(self, port, path):
        self.s = connect(port, timeout=30)  # TLS in the TLS run
        self.s.sendall(("GET %s HTTP/1.1\r\nHost: localhost\r\n\r\n" % path).encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self.buf += self._recv(30)
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        self.status = int(head.split()[1])
        self.raw = b""
        self.eof = False

    def _recv(self, timeout):
        self.s.settimeout(timeout)
        d = self.s.recv(65536)
        if not d:
            raise EOFError("connection closed")
        return d

    def _dechunk(self):
        while True:
            i = self.buf.find(b"\r\n")
            if i < 0:
                return
            n = int(self.buf[:i].split(b";")[0], 16)
            if len(self.buf) < i + 2 + n + 2:
                return
            self.raw += self.buf[i + 2:i + 2 + n]
            self.buf = self.buf[i + 2 + n + 2:]
            if n == 0:
                self.eof = True
                return

    def next_event(self, timeout=30):
        while True:
            self._dechunk()
            j = self.raw.find(b"\n")
            if j >= 0:
                line, self.raw = self.raw[:j], self.raw[j + 1:]
                ev = json.loads(line)
                if ev["type"] != "BOOKMARK":
                    return ev
                continue
            if self.eof:
                raise EOFError("end of stream")
            self.buf += self._recv(timeout)

    def ended(self, timeout=30):
        """Whether the stream ends (its last chunk, or the connection) within timeout s."""
        try:
            while not self.eof:
                self._dechunk()
                if self.eof:
                    break
                self.buf += self._recv(timeout)
            return True
        except EOFError:
            return True
        except OSError:
            return False


def names(doc):
    return sorted((i["metadata"].get("namespace", ""), i["metadata"]["name"]) for i in doc["items"])


class OnDemand(EnvTestCase):
    auto = True
    apisim_args = ["--pods", "30", "--namespaces", "3", "--nodes", "2"]

    def test_first_list_starts_the_cache_and_is_answered_from_it(self):
        port = self.env.kwc.port
        before = served_from(port, "LIST", "configmaps", "cache")
        seq = upstream_seq(self.env)
        st, _, b = http_request(port, "GET", "/api/v1/configmaps?resourceVersion=0")
        self.assertEqual(st, 200, b[:300])
        direct = self.env.sim("GET", "/api/v1/configmaps")
        self.assertEqual(names(json.loads(b)), names(direct))
        self.assertEqual(served_from(port, "LIST", "configmaps", "cache"), before + 1,
                         "the first list waited for the new cache's sync and was answered by it")
        client = [t for t in upstream_targets(self.env, seq) if t == "/api/v1/configmaps?resourceVersion=0"]
        self.assertEqual(client, [], "the client's list never reached the upstream")
        # later reads too, and a get
        st, _, b = http_request(port, "GET", "/api/v1/namespaces/ns-0/configmaps?resourceVersion=0")
        self.assertEqual(st, 200)
        self.assertEqual(served_from(port, "LIST", "configmaps", "cache"), before + 2)
        m = scrape(port)
        self.assertEqual(value(m, "kwc_cache_synced", group="", version="v1", resource="configmaps",
                               encoding="json"), 1)
        self.assertGreaterEqual(total(m, "kwc_cache_lifecycle_total", event="started"), 1)

    def test_custom_resource_on_demand(self):
        port = self.env.kwc.port
        before = served_from(port, "LIST", "widgets", "cache")
        st, _, b = http_request(port, "GET", "/apis/example.com/v1/widgets?resourceVersion=0")
        self.assertEqual(st, 200, b[:300])
        self.assertEqual(names(json.loads(b)), names(self.env.sim("GET", "/apis/example.com/v1/widgets")))
        self.assertEqual(served_from(port, "LIST", "widgets", "cache"), before + 1)

    def test_watch_that_starts_a_cache_is_served_from_it(self):
        """A watch arriving while its cache syncs is served from the cache,
        not left upstream for its life."""
        port = self.env.kwc.port
        seq = upstream_seq(self.env)
        before = served_from(port, "WATCH", "services", "cache")
        st, _, b = http_request(port, "GET", "/api/v1/services?watch=1&timeoutSeconds=1")
        self.assertEqual(st, 200, b[:300])
        # the stream's record is finished when its last bytes left (a worker's)
        wait_for(lambda: served_from(port, "WATCH", "services", "cache") == before + 1, 10,
                 "the watch counted as the cache's")
        client = [t for t in upstream_targets(self.env, seq) if "timeoutSeconds=1" in t]
        self.assertEqual(client, [], "the client's watch never reached the upstream")

    def test_protobuf_defaults_start_with_kwc(self):
        """The kinds node agents read in protobuf are cached before anyone asks."""
        port = self.env.kwc.port
        wait_for(lambda: value(scrape(port), "kwc_cache_synced", group="", version="v1", resource="pods",
                               encoding="protobuf") == 1, 30, "the protobuf pods cache synced")
        wait_for(lambda: value(scrape(port), "kwc_cache_synced", group="", version="v1", resource="nodes",
                               encoding="protobuf") == 1, 30, "the protobuf nodes cache synced")

    def test_readyz_lists_on_demand_caches_without_requiring_them(self):
        port = self.env.kwc.port
        http_request(port, "GET", "/api/v1/secrets?resourceVersion=0")
        st, _, b = http_request(port, "GET", "/readyz?verbose")
        self.assertEqual(st, 200)
        text = b.decode()
        self.assertIn("/api/v1/secrets", text)
        self.assertIn("started on demand", text)
        self.assertNotIn("[-]", text)

    def test_aggregated_api_is_never_cached(self):
        """An APIService with a service (metrics-server's): its reads are the
        upstream's (here its 503, the service being away), never a cache."""
        port = self.env.kwc.port
        svc = {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
               "metadata": {"name": "v1beta1.metrics.k8s.io"},
               "spec": {"group": "metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                        "versionPriority": 100, "insecureSkipTLSVerify": True,
                        "service": {"namespace": "kube-system", "name": "metrics-server", "port": 443}}}
        self.env.sim("POST", "/apis/apiregistration.k8s.io/v1/apiservices", svc)
        # /readyz does not wait for discovery: the caches kwc makes once it is
        # read (the protobuf defaults) are made in the same loop turn
        wait_for(lambda: total(scrape(port), "kwc_discovery_ready") == 1, 10, "discovery read")
        caches = total(scrape(port), "kwc_caches")
        for _ in range(3):
            st, _, _ = http_request(port, "GET", "/apis/metrics.k8s.io/v1beta1/pods?resourceVersion=0")
            self.assertEqual(st, 503, "the aggregated API's own answer")
        m = scrape(port)
        self.assertEqual(total(m, "kwc_caches"), caches, "no cache for an aggregated API")
        self.assertEqual(served_from(port, "LIST", "pods", "upstream") >= 3, True)

    def test_unknown_resource_passes_through(self):
        port = self.env.kwc.port
        st, _, _ = http_request(port, "GET", "/apis/nope.example.com/v1/things?resourceVersion=0")
        self.assertEqual(st, 404)
        self.assertEqual(served_from(port, "LIST", "things", "cache"), 0)


class Limits(unittest.TestCase):
    """--resources-exclude and --max-caches: what kwc does not cache passes through."""

    def test_excluded_and_over_max_pass_through(self):
        with Env(apisim_args=["--pods", "5"], auto=True,
                 kwc_args=["--resources-exclude", "v1/secrets,apps/*/*", "--max-caches", "1",
                           "--protobuf-resources", "none"]) as env:
            port = env.kwc.port
            for path, res in (("/api/v1/secrets?resourceVersion=0", "secrets"),
                              ("/apis/apps/v1/deployments?resourceVersion=0", "deployments")):
                st, _, _ = http_request(port, "GET", path)
                self.assertEqual(st, 200)
                self.assertEqual(served_from(port, "LIST", res, "cache"), 0, path + " is excluded")
                self.assertEqual(served_from(port, "LIST", res, "upstream"), 1)
            # the first cache fits, the second is over --max-caches
            st, _, _ = http_request(port, "GET", "/api/v1/configmaps?resourceVersion=0")
            self.assertEqual(st, 200)
            self.assertEqual(served_from(port, "LIST", "configmaps", "cache"), 1)
            st, _, _ = http_request(port, "GET", "/api/v1/services?resourceVersion=0")
            self.assertEqual(st, 200)
            self.assertEqual(served_from(port, "LIST", "services", "upstream"), 1)
            self.assertEqual(total(scrape(port), "kwc_cache_lifecycle_total", event="refused_max_caches"), 1)


class Idle(unittest.TestCase):
    """A cache nobody reads or watches stops; the next request resumes it
    from its stored resourceVersion (a WATCH upstream, no LIST)."""

    def test_idle_cache_stops_and_resumes_without_relist(self):
        with Env(apisim_args=["--pods", "5"], auto=True,
                 kwc_args=["--cache-idle-timeout", "1s", "--protobuf-resources", "none"]) as env:
            port = env.kwc.port
            st, _, _ = http_request(port, "GET", "/api/v1/configmaps?resourceVersion=0")
            self.assertEqual(st, 200)
            self.assertEqual(served_from(port, "LIST", "configmaps", "cache"), 1,
                             "answered by the cache it started (a request kwc gets before its "
                             "discovery has answered waits for it)")
            wait_for(lambda: total(scrape(port), "kwc_cache_lifecycle_total", event="idle_stopped") >= 1, 30,
                     "the idle cache stopped")
            m = scrape(port)
            lists = value(m, "kwc_reflector_lists_total", group="", version="v1", resource="configmaps",
                          encoding="json")
            self.assertEqual(lists, 1)
            rv = int(value(m, "kwc_cache_resource_version", group="", version="v1", resource="configmaps",
                           encoding="json"))
            env.sim("POST", "/apisim/write", {"verb": "create", "resource": "configmaps", "namespace": "default",
                                              "name": "while-stopped"})
            seq = upstream_seq(env)
            st, _, b = http_request(port, "GET", "/api/v1/configmaps?resourceVersion=0")
            self.assertEqual(st, 200)
            self.assertEqual(served_from(port, "LIST", "configmaps", "cache"), 2)
            # resumed from its rv: the upstream sees a watch from it (the
            # warm cache answered first), and no list
            wait_for(lambda: any(t.startswith("/api/v1/configmaps?") and "watch=" in t and
                                 "resourceVersion=%d" % rv in t for t in upstream_targets(env, seq)), 30,
                     "the resumed cache's watch from its rv")
            # and it catches up: the object written while it was stopped
            wait_for(lambda: any(i["metadata"]["name"] == "while-stopped" for i in json.loads(
                http_request(port, "GET", "/api/v1/namespaces/default/configmaps?resourceVersion=0")[2])["items"]),
                30, "the resumed cache caught up")
            m = scrape(port)
            self.assertEqual(value(m, "kwc_reflector_lists_total", group="", version="v1",
                                   resource="configmaps", encoding="json"), lists, "no relist")

    def test_max_caches_counts_running_caches(self):
        """--max-caches bounds the caches running at once: once an idle one
        stops, a new resource gets a cache again."""
        with Env(apisim_args=["--pods", "5"], auto=True,
                 kwc_args=["--cache-idle-timeout", "1s", "--max-caches", "1", "--protobuf-resources", "none"]) as env:
            port = env.kwc.port
            st, _, _ = http_request(port, "GET", "/api/v1/configmaps?resourceVersion=0")
            self.assertEqual(st, 200)
            self.assertEqual(served_from(port, "LIST", "configmaps", "cache"), 1)
            wait_for(lambda: total(scrape(port), "kwc_cache_lifecycle_total", event="idle_stopped") >= 1, 30,
                     "the idle cache stopped")
            st, _, _ = http_request(port, "GET", "/api/v1/services?resourceVersion=0")
            self.assertEqual(st, 200)
            self.assertEqual(served_from(port, "LIST", "services", "cache"), 1, "a slot was free again")
            m = scrape(port)
            self.assertEqual(total(m, "kwc_cache_lifecycle_total", event="refused_max_caches"), 0)
            # kwc's own caches (CRDs, APIServices: discovery's sources) besides
            own = total(m, "kwc_cache_synced", resource="customresourcedefinitions") + \
                total(m, "kwc_cache_synced", resource="apiservices")
            self.assertEqual(total(m, "kwc_caches_running"), 1 + own)
            self.assertEqual(total(m, "kwc_caches"), 2 + own, "the stopped cache keeps its slot")

    def test_disk_budget_drops_stopped_caches_data(self):
        """--cache-disk-budget bounds the data stopped caches keep: past it
        the oldest stopped cache's data goes, and it lists again when used."""
        with Env(apisim_args=["--pods", "5"], auto=True,
                 kwc_args=["--cache-idle-timeout", "1s", "--cache-disk-budget", "1",
                           "--protobuf-resources", "none"]) as env:
            port = env.kwc.port
            key = dict(group="", version="v1", resource="configmaps", encoding="json")
            for i in range(3):
                env.sim("POST", "/apisim/write", {"verb": "create", "resource": "configmaps",
                                                  "namespace": "default", "name": "cm-%d" % i})
            st, _, _ = http_request(port, "GET", "/api/v1/configmaps?resourceVersion=0")
            self.assertEqual(st, 200)
            wait_for(lambda: total(scrape(port), "kwc_cache_lifecycle_total", event="data_dropped") >= 1, 30,
                     "the stopped cache's data dropped (over a 1-byte budget)")
            m = scrape(port)
            self.assertEqual(value(m, "kwc_cache_objects", **key), 0, "its objects are gone from disk")
            lists = value(m, "kwc_reflector_lists_total", **key)
            st, _, b = http_request(port, "GET", "/api/v1/configmaps?resourceVersion=0")
            self.assertEqual(st, 200)
            self.assertEqual(names(json.loads(b)), names(env.sim("GET", "/api/v1/configmaps")))
            self.assertEqual(served_from(port, "LIST", "configmaps", "cache"), 2,
                             "the request waited for the new list and was answered by it")
            self.assertEqual(value(scrape(port), "kwc_reflector_lists_total", **key), lists + 1,
                             "no data left to resume from: a list")


CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def crd_body(group, plural, kind):
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "%s.%s" % (plural, group)},
            "spec": {"group": group, "scope": "Namespaced",
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": {"type": "object",
                                                                  "x-kubernetes-preserve-unknown-fields": True}}}],
                     "names": {"plural": plural, "singular": kind.lower(), "kind": kind,
                               "listKind": kind + "List"}}}


class CustomResourceDefinitions(unittest.TestCase):
    """A CRD created at run time is cached at its first read; deleted, its
    objects' DELETED events reach kwc's watchers, then their streams end as
    kube ends them, the cache's data goes and its reads pass through (404)."""

    def test_crd_added_and_removed_under_watchers(self):
        with Env(apisim_args=["--pods", "2"], auto=True,
                 kwc_args=["--protobuf-resources", "none"]) as env:
            port = env.kwc.port
            group, plural = "stable.example.io", "gadgets"
            path = "/apis/%s/v1/namespaces/default/%s" % (group, plural)
            # kwc learns the new resource (its cache of CRDs sees it and
            # discovery is read again at once); from then on its reads are
            # the cache's
            wait_for(lambda: total(scrape(port), "kwc_cache_synced", resource="customresourcedefinitions") == 1,
                     30, "kwc's cache of CRDs")
            # kwc's copy of /apis, recorded before the CRD exists
            for _ in range(2):
                st, _, b = http_request(port, "GET", "/apis")
                self.assertEqual(st, 200)
                self.assertNotIn(group, b.decode())
            t0 = time.monotonic()
            env.sim("POST", CRDS, crd_body(group, plural, "Gadget"))
            # kwc's discovery is read again when its CRD cache sees the new
            # one, well before --discovery-interval (30 s): a client polling
            # kwc's discovery finds the group within a few seconds
            wait_for(lambda: group in http_request(port, "GET", "/apis")[2].decode(), 10,
                     "the new group in kwc's discovery answer")
            self.assertLess(time.monotonic() - t0, 10)
            env.sim("POST", path, {"apiVersion": group + "/v1", "kind": "Gadget",
                                   "metadata": {"name": "g1", "namespace": "default"}, "spec": {"n": 1}})
            wait_for(lambda: http_request(port, "GET", path + "?resourceVersion=0")[0] == 200 and
                     served_from(port, "LIST", plural, "cache") >= 1, 30, "the new CRD's list from kwc's cache")
            st, _, b = http_request(port, "GET", path + "?resourceVersion=0")
            doc = json.loads(b)
            self.assertEqual([i["metadata"]["name"] for i in doc["items"]], ["g1"])
            rv = doc["metadata"]["resourceVersion"]
            seq = upstream_seq(env)
            w = WatchLines(port, path + "?watch=1&resourceVersion=%s" % rv)
            self.assertEqual(w.status, 200)
            env.sim("DELETE", CRDS + "/%s.%s" % (plural, group))
            ev = w.next_event(timeout=30)
            self.assertEqual((ev["type"], ev["object"]["metadata"]["name"]), ("DELETED", "g1"))
            # then the stream ends (kube's watchers of a removed resource end)
            self.assertTrue(w.ended(timeout=60), "the watch stream ended after the CRD went")
            self.assertEqual([t for t in upstream_targets(env, seq) if t.startswith(path + "?watch=1")], [],
                             "the client's watch was the cache's, never the upstream's")
            wait_for(lambda: served_from(port, "WATCH", plural, "cache") == 1, 10, "the watch counted as the cache's")
            wait_for(lambda: total(scrape(port), "kwc_cache_lifecycle_total", event="vanished") >= 1, 60,
                     "kwc saw the resource leave discovery")
            st, _, _ = http_request(port, "GET", path + "?resourceVersion=0")
            self.assertEqual(st, 404, "the resource is gone: kube's 404, through kwc")
            m = scrape(port)
            self.assertEqual(value(m, "kwc_cache_objects", group=group, version="v1", resource=plural,
                                   encoding="json"), 0, "its data dropped")


# --auth delegated: who may make kwc start a cache. kwc's identity has the
# rules of conf/kubernetes/base/rbac.yaml (list and watch of everything);
# alice may read configmaps in ns-0; mallory may only get pods in ns-0;
# prom may scrape /metrics.
AUTH_TOK = {n: "tok-%s-31d7" % n for n in ("kwc", "alice", "mallory", "prom")}


def auth_policy():
    return {"tokens": {AUTH_TOK[n]: {"user": n} for n in AUTH_TOK},
            "rules": [
                {"name": "kwc-cache", "users": ["kwc"], "verbs": ["list", "watch"], "apiGroups": ["*"],
                 "resources": ["*"]},
                {"name": "kwc-reviews", "users": ["kwc"], "verbs": ["create"],
                 "apiGroups": ["authentication.k8s.io", "authorization.k8s.io"],
                 "resources": ["tokenreviews", "subjectaccessreviews"]},
                {"name": "kwc-impersonate", "users": ["kwc"], "verbs": ["impersonate"]},
                {"name": "alice", "users": ["alice"], "verbs": ["get", "list", "watch"], "apiGroups": [""],
                 "resources": ["configmaps"], "namespaces": ["ns-0"]},
                {"name": "mallory", "users": ["mallory"], "verbs": ["get"], "apiGroups": [""],
                 "resources": ["pods"], "namespaces": ["ns-0"]},
                {"name": "prom", "users": ["prom"], "verbs": ["get"], "nonResourceURLs": ["/metrics"]}]}


def bearer(who):
    return {"Authorization": "Bearer " + AUTH_TOK[who]}


PB = "application/vnd.kubernetes.protobuf"
# reads of resources kwc would cache (none of them cached yet): each would
# start a cache for a caller allowed to make it
UNCACHED_READS = [
    ("secrets", "/api/v1/secrets?resourceVersion=0", None),
    ("secrets", "/api/v1/namespaces/ns-0/secrets?resourceVersion=0", None),
    ("secrets", "/api/v1/namespaces/ns-0/secrets/s-1", None),
    ("secrets", "/api/v1/namespaces/ns-0/secrets?watch=1&timeoutSeconds=1", None),
    ("secrets", "/api/v1/namespaces/ns-0/secrets?resourceVersion=0", PB),
    ("widgets", "/apis/example.com/v1/namespaces/ns-0/widgets?resourceVersion=0", None),
    ("deployments", "/apis/apps/v1/deployments?resourceVersion=0", None),
    ("pods", "/api/v1/namespaces/ns-0/pods?resourceVersion=0", None),  # mallory may get pods, not list them
    ("nodes", "/api/v1/nodes?watch=1&timeoutSeconds=1", PB),
]


@only_in_plaintext_run("sets up delegated authentication itself (a TLS run would repeat it)")
class WhoStartsCaches(unittest.TestCase):
    """A cache starts only for a caller kwc authenticated and authorized
    itself (a SubjectAccessReview for the caller, before catalog_want):
    a caller denied the read gets kwc's 403 and no cache starts (no LIST or
    WATCH of the resource reaches the upstream, kwc_cache_lifecycle_total
    {event="started"} and kwc_caches stay put); a caller without valid
    credentials gets 401 and starts nothing either. An allowed caller's
    read does start one (the control)."""

    @classmethod
    def setUpClass(cls):
        cls.env = Env(apisim_args=["--pods", "5", "--namespaces", "2"], start_kwc=False, auto=True)
        try:
            env = cls.env
            env.sim("POST", "/apisim/policy", auth_policy())
            kc = os.path.join(env.dir, "kwc-kubeconfig")
            with open(kc, "w") as f:
                json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "sim",
                           "clusters": [{"name": "sim", "cluster": {"server": "http://127.0.0.1:%d" % env.apisim.port}}],
                           "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "kwc"}}],
                           "users": [{"name": "kwc", "user": {"token": AUTH_TOK["kwc"]}}]}, f)
            env.kwc = kwc_proc("kwc", ["--kubeconfig", kc, "--listen", "127.0.0.1:0",
                                       "--data-dir", os.path.join(env.dir, "data"), "--auth", "delegated",
                                       "--protobuf-resources", "none"], env.dir, auto=True)
            env.kwc.start()
            wait_for(lambda: http_request(env.kwc.port, "GET", "/readyz", timeout=2)[0] == 200, 30, "kwc /readyz")
            # discovery has answered: whether a read may start a cache is known
            wait_for(lambda: value(scrape(env.kwc.port, headers=bearer("prom")), "kwc_discovery_ready") == 1, 30,
                     "kwc's discovery")
        except BaseException:
            cls.env.dump_logs()
            cls.env.close()
            raise

    @classmethod
    def tearDownClass(cls):
        codes = cls.env.close()
        if codes.get("kwc") != 0:
            cls.env.dump_logs()
            raise AssertionError("kwc exit status %r" % codes.get("kwc"))

    def run(self, result=None):
        before = len(result.failures) + len(result.errors) if result else 0
        r = super().run(result)
        if result and len(result.failures) + len(result.errors) > before:
            self.env.dump_logs()
        return r

    def caches(self):
        m = scrape(self.env.kwc.port, headers=bearer("prom"))
        return total(m, "kwc_cache_lifecycle_total", event="started"), total(m, "kwc_caches")

    def touched(self, seq, resource):
        """apisim's records since seq whose path names resource."""
        recs = self.env.sim("GET", "/apisim/requests?since=%d" % seq)["requests"]
        return ["%s %s" % (r["method"], r["target"]) for r in recs
                if resource in r["target"].split("?")[0].split("/")]

    def read(self, path, accept, headers):
        h = dict(headers)
        if accept:
            h["Accept"] = accept
        return http_request(self.env.kwc.port, "GET", path, headers=h)

    def assert_nothing_started(self, seq, before, who, expect):
        for res, path, accept in UNCACHED_READS:
            st, _, b = self.read(path, accept, who)
            self.assertEqual(st, expect, "%s: %s" % (path, b[:300]))
            if st == 403 and accept != PB:
                self.assertEqual(json.loads(b)["reason"], "Forbidden")
        self.assertEqual(self.caches(), before, "kwc_cache_lifecycle_total{event=started}, kwc_caches")
        for res in sorted({r for r, _, _ in UNCACHED_READS}):
            self.assertEqual(self.touched(seq, res), [], "the upstream was asked about %s" % res)

    def test_denied_caller_gets_403_and_starts_no_cache(self):
        seq, before = upstream_seq(self.env), self.caches()
        self.assert_nothing_started(seq, before, bearer("mallory"), 403)

    def test_unauthenticated_caller_gets_401_and_starts_no_cache(self):
        seq, before = upstream_seq(self.env), self.caches()
        self.assert_nothing_started(seq, before, {}, 401)
        self.assert_nothing_started(seq, before, {"Authorization": "Bearer not-a-token"}, 401)

    def test_allowed_caller_starts_the_cache(self):
        """The control: what the two above hold back does happen for a
        caller allowed the read."""
        seq, (started, n) = upstream_seq(self.env), self.caches()
        st, _, b = http_request(self.env.kwc.port, "GET", "/api/v1/namespaces/ns-0/configmaps?resourceVersion=0",
                                headers=bearer("alice"))
        self.assertEqual(st, 200, b[:300])
        self.assertEqual(self.caches(), (started + 1, n + 1))
        touched = self.touched(seq, "configmaps")
        self.assertTrue([t for t in touched if t.startswith("GET /api/v1/configmaps?")], touched)
        self.assertNotIn("GET /api/v1/namespaces/ns-0/configmaps?resourceVersion=0", touched,
                         "alice's list was answered from the cache it started")


class RealClients(unittest.TestCase):
    """Real clients in auto mode: the npm @kubernetes/client-node informer
    (its list has no resourceVersion: a quorum read, the upstream's; it
    starts the cache its watch then gets) and Debian's python3-kubernetes
    watch with resumes: every watch is the cache's."""

    def test_informer_and_python_watch(self):
        import tempfile
        from cluster import PYTHON, Reader, kubeconfig, tls_client, url
        clients = os.path.join(os.path.dirname(os.path.abspath(__file__)), "clients")
        with Env(apisim_args=["--pods", "40", "--namespaces", "2", "--history", "100000",
                              "--bookmark-interval", "0.5"], auto=True,
                 kwc_args=["--protobuf-resources", "none", "--bookmark-interval", "1s"]) as env:
            port = env.kwc.port
            watches = lambda: env.stats()["requests"].get("watch pods", 0)
            before = watches()
            readers = []
            try:
                d = tempfile.mkdtemp(prefix="kwc-ondemand-")
                inf = Reader(["node", os.path.join(clients, "informer.mjs"), kubeconfig(port, d),
                              "ns-0/sentinel"])
                readers.append(inf)
                wait_for(lambda: any(line.startswith("synced") for line in inf.lines), 120, "the informer synced")
                t = tls_client(port)
                py = Reader([PYTHON, os.path.join(clients, "py_watch.py"), "--server", url(port)] +
                            (["--ca", t.ca, "--cert", t.cert, "--key", t.key] if t else []) +
                            ["--rv", str(env.stats()["rv"]), "--until", "ns-0/sentinel"])
                readers.append(py)
                env.sim("POST", "/apisim/churn", {"rate": 100, "resources": ["pods"],
                                                  "mix": {"update": 0.8, "create": 0.1, "delete": 0.1}})
                start = env.stats()["events"]
                wait_for(lambda: env.stats()["events"] >= start + 200, 30, "200 churn events")
                env.sim("POST", "/apisim/churn", {"rate": 0})
                env.sim("POST", "/apisim/write", {"verb": "create", "namespace": "ns-0", "name": "sentinel"})
                self.assertEqual(inf.wait(60), 0, inf.stderr())
                self.assertEqual(py.wait(60), 0, py.stderr())
                out = json.loads(inf.lines[-1])
                st = env.sim("GET", "/apisim/state?resource=pods")
                self.assertEqual(out["cache"], {i["key"]: str(i["rv"]) for i in st["items"]},
                                 "the informer ends with the upstream's state")
                self.assertGreater(len(py.lines), 200, "the python watch saw the churn, then the sentinel")
            finally:
                for r in readers:
                    r.stop()
            self.assertEqual(watches() - before, 1, "the only pods watch upstream is kwc's own cache's")
            self.assertGreaterEqual(served_from(port, "WATCH", "pods", "cache"), 2)
            self.assertEqual(served_from(port, "WATCH", "pods", "upstream"), 0)


if __name__ == "__main__":
    unittest.main()
