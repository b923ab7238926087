"""A restored or replaced upstream is detected (issue 31, part 4; docs/architecture.md,
"Trust in the upstream's timeline").

apisim is restarted on the same port, as the upstream kwc follows:
  - at a lower rv with other objects (an etcd restored from an older backup,
    the same cluster uid): every cache stops serving at once (its requests
    pass through), its watchers get a 410 Expired ERROR event, its data goes,
    it lists afresh; /readyz says so while it rebuilds (the new upstream's
    list is held back by a fault rule so that the rebuild can be seen);
  - as another cluster (another kube-system uid), with rvs ahead of kwc's
    (the rv checks alone would not see it): across a kwc restart on the same
    data dir, and while kwc runs (after the reconnect);
  - as the same cluster (same uid, same objects, same rv): nothing is reset,
    no cache relists, a watcher through kwc stays open and sees what follows.
Each scenario in fixed (--resources) and auto mode where it differs. Each
test takes a few seconds: two apisim starts and one or two kwc starts.
"""
import json
import os
import unittest

from cluster import APISIM, PYTHON, Env, Proc, http_request, kwc_proc, wait_for
from faults import assert_cache_equals_upstream, get_list, log_text, readyz, wait_readyz
from scrape import scrape, total, value
from watchstream import Stream, pump

RESOURCES = "v1/pods,v1/namespaces"
HOLD_LIST = json.dumps({"count": 10 ** 9, "match": "/api/v1/pods?limit=500", "status": 503})


def sim_args(uid, start_rv=0, pods=3, seed=1, extra=()):
    return ["--pods", str(pods), "--cluster-uid", uid, "--start-rv", str(start_rv), "--seed", str(seed)] + \
        list(extra)


def restart_sim(env, args):
    """Stop apisim and start another on the same port (kwc's upstream)."""
    port = env.apisim.port
    env.apisim.stop()
    env.apisim = Proc("apisim", [PYTHON, APISIM, "--listen", "127.0.0.1:%d" % port] + list(args), env.dir)
    env.apisim.start()


def resets(port, reason):
    return value(scrape(port), "kwc_upstream_reset_total", reason=reason)


def pods_by_uid(port, path="/api/v1/pods"):
    st, _, b = http_request(port, "GET", path)
    if st != 200:
        raise AssertionError("GET %s -> %d %s" % (path, st, b[:300]))
    doc = json.loads(b)
    return {i["metadata"]["name"]: i["metadata"]["uid"] for i in doc["items"]}, int(doc["metadata"]["resourceVersion"])


def watch_from_kwc(env):
    """A watch of pods through kwc from its cache's rv, once it is open."""
    _, rv = pods_by_uid(env.kwc.port, "/api/v1/pods?resourceVersion=0")
    s = Stream(env.kwc.port, "/api/v1/pods?watch=1&resourceVersion=%d&allowWatchBookmarks=true" % rv)
    pump([s], lambda: s.status is not None, 10, "the watch's head")
    return s


class RestoredUpstream(unittest.TestCase):
    """The upstream comes back at a lower rv, with other objects."""
    auto = False

    def test_lower_rv_resets_the_cache(self):
        kwc_args = [] if self.auto else ["--resources", RESOURCES]
        with Env(apisim_args=sim_args("uid-1", start_rv=1000, pods=4), kwc_args=kwc_args, auto=self.auto) as env:
            held = env.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "default",
                                                     "name": "only-in-the-old-one"})["rv"]
            wait_for(lambda: "only-in-the-old-one" in pods_by_uid(env.kwc.port, "/api/v1/pods?resourceVersion=0")[0],
                     10, "kwc to cache the old upstream's pod")
            w = watch_from_kwc(env)
            self.assertEqual(w.status, 200)
            wait_readyz(env.kwc.port, 200, 10)

            # restored: the same cluster uid, its rvs far below kwc's; its
            # list held back so that the rebuild can be watched
            restart_sim(env, sim_args("uid-1", pods=2, seed=2, extra=["--fail", HOLD_LIST]))
            pump([w], lambda: w.closed or w.ended, 20, "kwc to end its watcher")
            errs = [e for e in w.events if e["type"] == "ERROR"]
            self.assertEqual(len(errs), 1, w.lines[-3:])
            self.assertEqual((errs[0]["object"]["code"], errs[0]["object"]["reason"]), (410, "Expired"))
            self.assertEqual([e["type"] for e in w.events if e["type"] != "BOOKMARK"], ["ERROR"],
                             "the 410, and nothing of the new upstream's on the old timeline")

            # rebuilding: /readyz says so, and the cache's requests pass through
            new_rv = int(env.sim("GET", "/apisim/stats")["rv"])
            # auto mode: caches started on demand do not hold /readyz back,
            # its verbose form says what each does
            text = wait_readyz(env.kwc.port, 200 if self.auto else 503, 20, contains=(
                "cache /api/v1/pods: not synced, rebuilding after an upstream reset (the upstream's resourceVersion "
                "went back: %d seen, %d held)" % (new_rv, held),))
            if not self.auto:
                self.assertIn("[-]cache /api/v1/pods", text)
            want, _ = pods_by_uid(env.apisim.port)
            got, got_rv = pods_by_uid(env.kwc.port, "/api/v1/pods?resourceVersion=0")
            self.assertEqual(got, want, "what kwc answers while rebuilding is the new upstream's")
            self.assertLess(got_rv, 1000)
            self.assertEqual(resets(env.kwc.port, "identity"), 0, "the same cluster, restored")
            self.assertGreaterEqual(resets(env.kwc.port, "rv_backwards"), 1)
            lines = [l for l in log_text(env.kwc).splitlines()
                     if "cache pods: the upstream's resourceVersion went back" in l]
            self.assertEqual(len(lines), 1, lines)
            self.assertIn("%d seen, the cache holds %d" % (new_rv, held), lines[0])

            env.sim("POST", "/apisim/fail", {"clear": True})
            wait_readyz(env.kwc.port, 200, 20)
            self.assertEqual(assert_cache_equals_upstream(self, env), 3, "the new upstream's pods, and none else")
            got, _ = pods_by_uid(env.kwc.port, "/api/v1/pods?resourceVersion=0")
            want, _ = pods_by_uid(env.apisim.port)
            self.assertEqual(got, want, "the new upstream's objects (their uids), never the old ones")
            self.assertNotIn("only-in-the-old-one", got)

            # a client relisting through kwc follows the new upstream
            w2 = watch_from_kwc(env)
            rv = env.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "default",
                                                   "name": "made-after"})["rv"]
            pump([w2], lambda: any(e["object"]["metadata"].get("name") == "made-after" for e in w2.events), 10,
                 "the new pod on a watch through kwc")
            self.assertEqual(int(w2.events[-1]["object"]["metadata"]["resourceVersion"]), rv)
            w2.close()
            if not self.auto:  # pods and namespaces, in JSON and protobuf (--protobuf-resources)
                # each cache learns of the restore when its own watch comes
                # back (after its reconnect backoff: on a loaded machine,
                # later than pods' rebuild above), then resets once
                def counts():
                    m = scrape(env.kwc.port)
                    return (value(m, "kwc_upstream_reset_total", reason="rv_backwards"),
                            value(m, "kwc_caches_running"))
                wait_for(lambda: counts()[0] >= counts()[1], 20, "every cache to reset")
                r, n = counts()
                self.assertEqual(r, n, "each cache, once")


class RestoredUpstreamAuto(RestoredUpstream):
    auto = True


class SameUpstreamRestart(unittest.TestCase):
    """The same cluster restarts (same uid, objects and rv): nothing resets."""

    def test_no_reset(self):
        args = sim_args("uid-1", start_rv=500, pods=3, seed=3)
        with Env(apisim_args=args, kwc_args=["--resources", RESOURCES]) as env:
            m0 = scrape(env.kwc.port)
            w = watch_from_kwc(env)
            restart_sim(env, args)
            wait_for(lambda: env.sim("GET", "/apisim/stats")["open_watches"].get("pods", 0) >= 1, 20,
                     "kwc to watch the restarted upstream")
            env.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "default",
                                              "name": "after-restart"})
            pump([w], lambda: any(e["object"]["metadata"].get("name") == "after-restart" for e in w.events), 10,
                 "the watcher through kwc to see what follows the restart")
            self.assertFalse(any(e["type"] == "ERROR" for e in w.events), w.lines[-3:])
            self.assertFalse(w.closed)
            w.close()
            m1 = scrape(env.kwc.port)
            self.assertEqual(value(m1, "kwc_upstream_reset_total", reason="rv_backwards"), 0)
            self.assertEqual(value(m1, "kwc_upstream_reset_total", reason="identity"), 0)
            self.assertEqual(total(m1, "kwc_reflector_relists_total"), total(m0, "kwc_reflector_relists_total"),
                             "no cache relisted")
            self.assertEqual(total(m1, "kwc_reflector_lists_total"), total(m0, "kwc_reflector_lists_total"))
            self.assertNotIn("went back", log_text(env.kwc))


class AnotherCluster(unittest.TestCase):
    """The upstream is another cluster (another kube-system uid), its rvs ahead."""

    def test_identity_change_across_a_restart_and_while_running(self):
        with Env(apisim_args=sim_args("uid-a", pods=3), auto=True) as env:
            pods_by_uid(env.kwc.port, "/api/v1/pods?resourceVersion=0")  # starts its cache (auto mode)
            wait_for(lambda: "uid-a recorded" in log_text(env.kwc), 10, "the identity recorded")
            self.assertEqual(env.kwc.stop(), 0)
            # kwc restarts on its data dir, its upstream now another cluster
            restart_sim(env, sim_args("uid-b", start_rv=5000, pods=2, seed=2))
            env.start_kwc()
            wait_for(lambda: resets(env.kwc.port, "identity") == 1, 10, "the identity change counted")
            wait_readyz(env.kwc.port, 200, 20)
            self.assertEqual(assert_cache_equals_upstream(self, env), 3)
            log = log_text(env.kwc)
            self.assertIn("the cluster's identity changed: kube-system namespace uid uid-b, the data dir holds uid-a",
                          log)
            self.assertEqual(resets(env.kwc.port, "rv_backwards"), 0, "its rvs went ahead")

            # while kwc runs: it comes back as a third cluster
            w = watch_from_kwc(env)
            restart_sim(env, sim_args("uid-c", start_rv=9000, pods=1, seed=4))
            pump([w], lambda: w.closed or w.ended, 20, "kwc to end its watcher")
            self.assertEqual([(e["object"]["code"], e["object"]["reason"]) for e in w.events if e["type"] == "ERROR"],
                             [(410, "Expired")])
            wait_for(lambda: resets(env.kwc.port, "identity") == 2, 10, "the second identity change counted")
            self.assertEqual(assert_cache_equals_upstream(self, env), 2)
            got, _ = pods_by_uid(env.kwc.port, "/api/v1/pods?resourceVersion=0")
            want, _ = pods_by_uid(env.apisim.port)
            self.assertEqual(got, want)
            self.assertEqual(readyz(env.kwc.port)[0], 200)


if __name__ == "__main__":
    unittest.main()
