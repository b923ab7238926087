"""On-demand caches (issue 30): with --resources unset (auto), the first list,
get or watch of any resource discovery lists as listable and watchable starts
its cache; the request waits for the first sync and is answered from the
cache, as is every later one. Excluded resources, aggregated APIs and
resources past --max-caches pass through. A cache nobody uses stops, keeps
its data, and resumes from its resourceVersion without a relist.

Whether an answer came from the cache is read from two sides: kwc's
kwc_requests_total{source} and the upstream's own request log
(/apisim/requests), in which the client's request must not appear."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))

from cluster import Env, EnvTestCase, http_request, wait_for  # noqa: E402
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
        import socket
        self.s = socket.create_connection(("127.0.0.1", port), timeout=30)
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
            # resumed from its rv: the upstream saw a watch from it, no list
            targets = upstream_targets(env, seq)
            self.assertTrue(any(t.startswith("/api/v1/configmaps?") and "watch=" in t and
                                "resourceVersion=%d" % rv in t for t in targets), targets)
            m = scrape(port)
            self.assertEqual(value(m, "kwc_reflector_lists_total", group="", version="v1",
                                   resource="configmaps", encoding="json"), lists, "no relist")
            # and it catches up: the object written while it was stopped
            wait_for(lambda: any(i["metadata"]["name"] == "while-stopped" for i in json.loads(
                http_request(port, "GET", "/api/v1/namespaces/default/configmaps?resourceVersion=0")[2])["items"]),
                30, "the resumed cache caught up")

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
                 kwc_args=["--protobuf-resources", "none", "--discovery-interval", "1"]) as env:
            port = env.kwc.port
            group, plural = "stable.example.io", "gadgets"
            path = "/apis/%s/v1/namespaces/default/%s" % (group, plural)
            env.sim("POST", CRDS, crd_body(group, plural, "Gadget"))
            env.sim("POST", path, {"apiVersion": group + "/v1", "kind": "Gadget",
                                   "metadata": {"name": "g1", "namespace": "default"}, "spec": {"n": 1}})
            # kwc learns the new resource (its discovery refreshes soon after
            # a miss); from then on its reads are the cache's
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


if __name__ == "__main__":
    unittest.main()
