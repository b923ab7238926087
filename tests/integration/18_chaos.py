"""Never serve what the cache cannot vouch for: a misbehaving upstream and a
kwc killed at any point.

Backoff: during an upstream outage the reflector's log shows growing
"retrying in X s" delays (every retry written: --log-summary-interval 0),
never above 30 s (x1.5 jitter), and the cache's state is backing_off
(kwc_cache_state, /readyz?verbose); once the upstream has been healthy
(watch open) for 10 s, kwc says so (the pods cache's
kwc_reflector_backoff_seconds in /metrics falls back to 0, its state is
watching) and a dropped watch is retried within about a second (the next
"retrying in" is under 1.5 s), not at the delay the outage grew.

Staleness: /readyz?verbose shows for each cached resource "last upstream event
or bookmark Ns ago", and /metrics kwc_cache_last_event_age_seconds; with
--max-staleness 5s a resource whose upstream watch stays open but sends
nothing leaves service after about 5 s with a reason containing "stale", its
/readyz line says "stale (past --max-staleness 5s)" and its
kwc_cache_state is stale.

Chaos: 20 kill -9 of kwc under ~300 events/s of churn (restarted on the same
data dir each time, killed at varying points after it is ready) and one
upstream outage of ~5 s (apisim cannot restart with its state, so the outage
is every request failing with 503 and the watches dropped): then, with the
churn stopped, kwc's rv=0 list has the upstream's items byte for byte at the
same rv, and a watch resumed from an early rv replays to the upstream's state.

Backoff and staleness run kwc with --protobuf-resources none: they time one
reflector per resource (the JSON one), and a protobuf cache is a second.
"""
import json
import random
import re
import time
import unittest

from cluster import Env, http_request, only_in_plaintext_run, wait_for
from faults import (apply_events, assert_cache_equals_upstream, get_list, kill9, log_text, readyz,
                    upstream_state, wait_readyz, watch_until)

RETRY = re.compile(r"retrying in ([0-9]+(?:\.[0-9]+)?) ?s")
AGE = re.compile(r"last upstream event or bookmark ([0-9]+(?:\.[0-9]+)?) ?s ago")
BACKOFF = re.compile(r"^kwc_reflector_backoff_seconds\{([^}]*)\} (\S+)$", re.M)
SAMPLE = re.compile(r"^(kwc_cache_state|kwc_cache_last_event_age_seconds)\{([^}]*)\} (\S+)$", re.M)


def delays(env):
    return [float(m.group(1)) for m in RETRY.finditer(log_text(env.kwc))]


def backoff_s(env):
    """The pods (JSON) cache's kwc_reflector_backoff_seconds from /metrics."""
    st, _, body = http_request(env.kwc.port, "GET", "/metrics")
    assert st == 200, st
    for labels, v in BACKOFF.findall(body.decode()):
        if 'resource="pods"' in labels and 'encoding="json"' in labels:
            return float(v)
    raise AssertionError("no kwc_reflector_backoff_seconds for pods in /metrics")


def json_cache(env, resource):
    """{"state": the state whose kwc_cache_state is 1, "age": the
    kwc_cache_last_event_age_seconds sample or None} of a resource's JSON
    cache, from /metrics."""
    st, _, body = http_request(env.kwc.port, "GET", "/metrics")
    assert st == 200, st
    out = {"state": None, "age": None, "states": 0}
    for name, labels, v in SAMPLE.findall(body.decode()):
        if 'resource="%s"' % resource not in labels or 'encoding="json"' not in labels:
            continue
        if name == "kwc_cache_state":
            out["states"] += 1
            if float(v) == 1:
                assert out["state"] is None, body
                out["state"] = re.search(r'state="([^"]*)"', labels).group(1)
        else:
            out["age"] = float(v)
    assert out["states"] >= 5, "a series per state: %r" % out
    return out


def cache_lines(text):
    return [l for l in text.splitlines() if "cache /" in l]


@only_in_plaintext_run("the reflector's timing; the front end's transport plays no part")
class BackoffTest(unittest.TestCase):
    def test_backoff_grows_then_resets_after_healthy_watch(self):
        with Env(apisim_args=["--pods", "50"], kwc_args=["--protobuf-resources", "none", "--resources", "v1/pods",
                                                         "--log-summary-interval", "0"]) as env:
            # outage of the pods watch (and lists): every attempt fails
            env.sim("POST", "/apisim/fail", {"count": 10 ** 9, "match": "/api/v1/pods?", "mode": "status",
                                             "status": 503})
            env.sim("POST", "/apisim/drop-watches", {"resource": "pods"})
            # base delays double from ~0.5 s: wait for one of at least 3 s (base >= 4 s)
            wait_for(lambda: any(d >= 3.0 for d in delays(env)), 60, "the retry delay to grow past 3 s")
            grown = delays(env)
            self.assertGreaterEqual(len(grown), 3, "several growing retries: %r" % grown)
            self.assertLess(grown[0], 1.5, "the first retry is quick: %r" % grown)
            self.assertTrue(all(d <= 45.0 for d in grown), "never above 30 s x 1.5: %r" % grown)
            self.assertEqual(wait_for(lambda: json_cache(env, "pods")["state"] == "backing_off" and
                                      json_cache(env, "pods"), 30, "kwc_cache_state backing_off")["state"],
                             "backing_off")
            self.assertIn("backing off for", [l for l in cache_lines(readyz(env.kwc.port)[1]) if "/pods" in l][0])
            env.sim("POST", "/apisim/fail", {"clear": True})
            wait_for(lambda: env.stats()["open_watches"].get("pods", 0) >= 1, 60, "kwc's watch to reopen")
            n = len(delays(env))
            self.assertGreater(backoff_s(env), 0.0, "the grown backoff stands while the watch is young")
            # kwc starts its backoff over once the watch has stayed open (10 s)
            wait_for(lambda: backoff_s(env) == 0.0, 60, "kwc's backoff to start over", interval=0.25)
            self.assertEqual(json_cache(env, "pods")["state"], "watching")
            self.assertEqual(env.stats()["open_watches"].get("pods", 0), 1, "the watch stayed open")
            self.assertEqual(len(delays(env)), n, "no retries while healthy")
            env.sim("POST", "/apisim/drop-watches", {"resource": "pods"})
            wait_for(lambda: len(delays(env)) > n, 30, "kwc to retry the dropped watch")
            d = delays(env)[n]
            self.assertLess(d, 1.5, "after a healthy watch the retry is quick again, not the grown %r" % grown[-1])
            wait_for(lambda: env.stats()["open_watches"].get("pods", 0) >= 1, 30, "the watch to reopen")
            self.assertEqual(env.kwc.stop(), 0)


@only_in_plaintext_run("the reflector's timing; the front end's transport plays no part")
class StalenessTest(unittest.TestCase):
    def test_verbose_reports_last_upstream_event_age(self):
        with Env(apisim_args=["--pods", "10", "--bookmark-interval", "600"],
                 kwc_args=["--protobuf-resources", "none", "--resources", "v1/pods,v1/nodes"]) as env:
            st, text = readyz(env.kwc.port)
            self.assertEqual(st, 200, text)
            lines = cache_lines(text)
            self.assertEqual(len(lines), 2, text)
            for l in lines:
                self.assertRegex(l, AGE, "each resource says when the upstream last spoke")

            def ages():
                return {("pods" if "/pods" in l else "nodes"): float(AGE.search(l).group(1))
                        for l in cache_lines(readyz(env.kwc.port)[1])}
            # nodes: nothing happens, the age grows; pods: an event makes it fresh
            wait_for(lambda: ages()["nodes"] >= 2, 30, "the nodes' age to grow")
            rv = env.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "default",
                                                   "name": "fresh"})["rv"]
            wait_for(lambda: get_list(env.kwc.port, "/api/v1/pods?resourceVersion=0")[0] >= rv, 30, "the event")
            a = ages()
            self.assertLess(a["pods"], a["nodes"], a)
            # /metrics has the same ages, and the caches watch
            p, n = json_cache(env, "pods"), json_cache(env, "nodes")
            self.assertEqual((p["state"], n["state"]), ("watching", "watching"))
            self.assertLess(p["age"], n["age"], (p, n))
            self.assertGreaterEqual(n["age"], a["nodes"] - 0.5, "read after /readyz's (whole seconds): %r" % n)
            self.assertEqual(env.kwc.stop(), 0)

    def test_silent_upstream_leaves_service(self):
        with Env(apisim_args=["--pods", "10", "--bookmark-interval", "600"],
                 kwc_args=["--protobuf-resources", "none", "--resources", "v1/pods", "--max-staleness", "5s"]) as env:
            text = wait_readyz(env.kwc.port, 503, 60, contains=("stale",))
            line = [l for l in cache_lines(text) if "/api/v1/pods" in l]
            self.assertEqual(len(line), 1, text)
            self.assertIn("stale", line[0])
            # not stale before --max-staleness, by kwc's own clock: the age it
            # gives (whole seconds since the upstream last spoke) has passed it
            m = AGE.search(line[0])
            self.assertTrue(m, line[0])
            self.assertGreaterEqual(float(m.group(1)), 5.0, "stale before --max-staleness")
            self.assertIn("synced, stale (past --max-staleness 5s), watching, ", line[0])
            c = json_cache(env, "pods")
            self.assertEqual(c["state"], "stale", c)
            self.assertGreaterEqual(c["age"], 5.0, c)
            self.assertEqual(env.kwc.stop(), 0)


@only_in_plaintext_run("crash and outage recovery; the front end's transport plays no part")
class ChaosTest(unittest.TestCase):
    def test_kill9_and_outage_under_churn(self):
        with Env(apisim_args=["--pods", "1500", "--namespaces", "3", "--history", "500000"],
                 kwc_args=["--resources", "v1/pods"]) as env:
            self.chaos(env)

    def chaos(self, env):
        rng = random.Random(1818)
        env.sim("POST", "/apisim/churn", {"rate": 300, "resources": ["pods"], "label_flip": 0.1})
        # an early rv to resume from at the end, and the upstream's state there
        r0, items0 = get_list(env.apisim.port, "/api/v1/pods")
        state0 = {k: int(json.loads(v)["metadata"]["resourceVersion"]) for k, v in items0.items()}
        wait_for(lambda: get_list(env.kwc.port, "/api/v1/pods?resourceVersion=0")[0] >= r0, 30, "kwc past r0")
        lists0 = env.stats()["requests"].get("list pods", 0)
        for i in range(20):
            if i == 10:
                # the upstream goes away for ~5 s; kwc is killed and restarts meanwhile (warm: ready at once)
                env.sim("POST", "/apisim/fail", {"count": 10 ** 9, "match": "", "mode": "status", "status": 503})
                env.sim("POST", "/apisim/drop-watches", {})
                down = time.monotonic()
                self.assertEqual(kill9(env.kwc), -9, "kwc was still running when killed")
                env.start_kwc()
                time.sleep(max(0.0, 5.0 - (time.monotonic() - down)))  # the outage's length
                env.sim("POST", "/apisim/fail", {"clear": True})
            # where the kill lands: at once (catching up), or later in the watch
            time.sleep(rng.choice([0.0, 0.0, 0.05, 0.2, 0.5, 1.0, 1.5]))
            self.assertEqual(kill9(env.kwc), -9, "kwc was still running when killed (kill %d)" % i)
            env.start_kwc()
        # a data dir left by kill -9 is consistent: no start calls it damaged,
        # every restart resumes the watch from the stored rv (no relist)
        self.assertNotIn("damaged", log_text(env.kwc))
        self.assertEqual(env.stats()["requests"].get("list pods", 0), lists0, "warm restarts, no relist")
        assert_cache_equals_upstream(self, env)
        final = env.stats()["rv"]
        s = watch_until(env.kwc.port, "/api/v1/pods?watch=1&timeoutSeconds=120&resourceVersion=%d" % r0, final,
                        timeout=120)
        self.assertEqual(s.status, 200)
        self.assertEqual([e for e in s.events if e["type"] == "ERROR"], [], "resumed from rv %d" % r0)
        rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in s.events if e["type"] != "DELETED"]
        self.assertEqual(rvs, sorted(rvs), "replayed in rv order")
        self.assertEqual(apply_events(dict(state0), s.events), upstream_state(env), "the replay ends in the "
                         "upstream's state")
        self.assertEqual(env.kwc.stop(), 0)


if __name__ == "__main__":
    unittest.main()
