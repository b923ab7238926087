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
        self.assertEqual(served_from(port, "WATCH", "services", "cache"), before + 1)
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


if __name__ == "__main__":
    unittest.main()
