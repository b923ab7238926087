"""Never serve what the cache cannot vouch for: watches across relists and
below the history floor.

Relists: when the upstream answers 410, kwc relists and records the difference
as events. A watcher connected through kwc (rv=0, from an rv, with a label
selector) never sees an event whose object's metadata.resourceVersion is
lower than one it already saw (after its initial ADDED events), stays
connected (no 410 ERROR event, no end of stream), gets objects deleted during
the gap as DELETED, and ends in the upstream's state; a watch resumed from any
rv a watcher saw gets no 410 and its replay leads to the same final state.

Below the floor: after kwc started with a fresh list (its history floor is the
list's rv), a watch at an older rv that the upstream still has is passed
through to the upstream (a 200 stream with the events) instead of kwc's
immediate 410 ERROR event; an rv the upstream no longer has still gets a 410.
"""
import random
import unittest

from cluster import Env, http_request, wait_for
from faults import apply_events, ev_rv, get_list, item_key, upstream_state, watch_until
from watchstream import Stream, pump

SEL = {"grp": "x"}
WATCH = "/api/v1/pods?watch=1&timeoutSeconds=900"


def write(env, verb, name, **kw):
    body = {"verb": verb, "resource": "pods", "namespace": "default", "name": name}
    body.update(kw)
    return env.sim("POST", "/apisim/write", body)["rv"]


class Watcher:
    """A watch through kwc and what it must end with."""

    def __init__(self, env, name, query, initial_state, n_initial, selector=None):
        self.name, self.query, self.selector = name, query, selector
        self.s = Stream(env.kwc.port, WATCH + query)
        self.initial_state = dict(initial_state)  # state before the stream's first event
        self.n_initial = n_initial                 # synthetic ADDED events first (rv=0 watches)

    def live(self):
        return self.s.events[self.n_initial:]


class RelistOrderTest(unittest.TestCase):
    def test_watchers_across_three_relists(self):
        env = Env(apisim_args=["--pods", "200", "--namespaces", "2", "--history", "100000"],
                  kwc_args=["--resources", "v1/pods"])
        watchers = []
        try:
            self.run_relists(env, watchers)
            self.assertEqual(env.kwc.stop(), 0)
        except BaseException:
            env.dump_logs()
            raise
        finally:
            for w in watchers:
                w.s.close()
            env.close()

    def run_relists(self, env, watchers):
        rng = random.Random(1717)
        last = 0
        for i in range(12):
            last = write(env, "create", "rl-%02d" % i, labels={"grp": "x" if i % 2 == 0 else "y"})
        wait_for(lambda: get_list(env.kwc.port, "/api/v1/pods?resourceVersion=0")[0] >= last, 30, "kwc at rv")
        # the upstream is quiet now: initial events are exactly the current state
        rv1, items = get_list(env.kwc.port, "/api/v1/pods?resourceVersion=0")
        every = upstream_state(env)
        sel = upstream_state(env, selector=SEL)
        self.assertEqual(set(items), set(every))
        w0 = Watcher(env, "rv=0", "&resourceVersion=0", {}, len(every))
        w1 = Watcher(env, "rv=%d" % rv1, "&resourceVersion=%d&allowWatchBookmarks=true" % rv1, every, 0)
        w2 = Watcher(env, "grp=x", "&resourceVersion=0&labelSelector=grp%3Dx", {}, len(sel), selector=SEL)
        watchers += [w0, w1, w2]
        pump([w.s for w in watchers], lambda: len(w0.s.events) >= len(every) and len(w2.s.events) >= len(sel),
             30, "the initial events")
        lists0 = env.stats()["requests"].get("list pods", 0)
        # churn only in ns-0 (a seed namespace): the test's own rl-* pods live in
        # "default" and are updated and deleted below by name; churn that picked
        # them (its creates follow a random existing pod's namespace, its
        # updates and deletes any pod) raced those writes into a 400 not found
        env.sim("POST", "/apisim/churn", {"rate": 100, "resources": ["pods"], "label_flip": 0.3,
                                          "namespace": "ns-0"})
        deleted, left_sel = [], []
        for rnd in range(3):
            cur = env.stats()["rv"]
            pump([w.s for w in watchers], lambda: (w0.s.last_rv() or 0) >= cur, 60, "events to flow")
            # hold kwc's reconnect off, move the upstream on, compact: kwc's
            # next watch gets a 410 and it relists
            env.sim("POST", "/apisim/fail", {"count": 10 ** 9, "match": "/api/v1/pods?", "mode": "status",
                                             "status": 503})
            env.sim("POST", "/apisim/drop-watches", {"resource": "pods"})
            # creations and updates in the reverse of key order, so key order is not rv order
            for n in "dcba":
                write(env, "create", "rl-r%d-%s" % (rnd, n), labels={"grp": "x"})
            mine = sorted((k for k in upstream_state(env) if k.startswith("default/rl-") and
                           "-r" not in k.split("/")[1]), reverse=True)
            for k in mine[:6]:
                write(env, "update", k.split("/")[1], annotations={"kwc.test/round": str(rnd)})
            x = sorted(k for k, _ in upstream_state(env, selector=SEL).items() if k.startswith("default/rl-"))
            y = sorted(k for k, _ in upstream_state(env, selector={"grp": "y"}).items() if k.startswith("default/rl-"))
            if x:  # leaves w2's selector: a DELETED for w2
                k = x[rng.randrange(len(x))]
                write(env, "update", k.split("/")[1], labels={"grp": "y"})
                left_sel.append(k)
                x.remove(k)
            if y:  # enters it: an ADDED for w2
                write(env, "update", y[rng.randrange(len(y))].split("/")[1], labels={"grp": "x"})
            for k in x[:2]:
                write(env, "delete", k.split("/")[1])
                deleted.append(k)
            gap_end = env.sim("POST", "/apisim/compact", {})["floor"]
            env.sim("POST", "/apisim/fail", {"clear": True})
            pump([w.s for w in watchers], lambda: (w0.s.last_rv() or 0) >= gap_end, 60,
                 "round %d's relist to reach the watchers" % rnd)
        env.sim("POST", "/apisim/churn", {"rate": 0})
        final = write(env, "create", "rl-final", labels={"grp": "x"})
        pump([w.s for w in watchers], lambda: all((w.s.last_rv() or 0) >= final for w in watchers), 60,
             "every watcher to reach rv %d" % final)
        self.assertGreaterEqual(env.stats()["requests"].get("list pods", 0) - lists0, 3, "three relists")
        want = {None: upstream_state(env), "x": upstream_state(env, selector=SEL)}

        for w in watchers:
            with self.subTest(watcher=w.name):
                self.assertEqual(w.s.status, 200)
                self.assertFalse(w.s.ended or w.s.closed, "the watch stayed open across the relists")
                errs = [e for e in w.s.events if e["type"] == "ERROR"]
                self.assertEqual(errs, [], "no ERROR event")
                self.assertTrue(all(e["type"] == "ADDED" for e in w.s.events[:w.n_initial]))
                seen = 0
                for j, e in enumerate(w.live()):
                    rv = ev_rv(e)
                    self.assertGreaterEqual(rv, seen, "%s: event %d (%s %s) has rv %d after rv %d" % (
                        w.name, j, e["type"], e["object"]["metadata"].get("name"), rv, seen))
                    seen = rv
                state = apply_events(dict(w.initial_state), w.s.events)
                self.assertEqual(state, want["x" if w.selector else None], "%s ends in the upstream's state"
                                 % w.name)
        dels = {item_key(e["object"]) for e in w0.s.events if e["type"] == "DELETED"}
        self.assertTrue(set(deleted) <= dels, "objects deleted in the gaps come as DELETED: %s"
                        % sorted(set(deleted) - dels))
        dels2 = {item_key(e["object"]) for e in w2.s.events if e["type"] == "DELETED"}
        self.assertTrue(set(left_sel) <= dels2, "objects that left the selector are DELETED for it")

        # resume from rvs the watchers saw: no 410, the same final state
        samples = []
        for w, n in ((w0, 6), (w1, 2), (w2, 3)):
            rvs = sorted({ev_rv(e) for e in w.live() if ev_rv(e) < final})
            samples += [(w, r) for r in rng.sample(rvs, min(n, len(rvs)))]
        for w, r in samples:
            with self.subTest(resume=w.name, rv=r):
                prefix = w.s.events[:w.n_initial] + [e for e in w.live() if ev_rv(e) <= r]
                state = apply_events(dict(w.initial_state), prefix)
                q = "&resourceVersion=%d" % r + ("&labelSelector=grp%3Dx" if w.selector else "")
                s = watch_until(env.kwc.port, "/api/v1/pods?watch=1&timeoutSeconds=60" + q, final)
                self.assertEqual(s.status, 200)
                self.assertEqual([e for e in s.events if e["type"] == "ERROR"], [], "no 410 from rv %d" % r)
                self.assertTrue(all(ev_rv(e) > r for e in s.events), "a resume replays only what follows")
                self.assertEqual(apply_events(state, s.events), want["x" if w.selector else None])


class BelowFloorTest(unittest.TestCase):
    def test_watch_below_kwc_floor_passes_through(self):
        with Env(apisim_args=["--nodes", "1"], kwc_args=["--resources", "v1/pods"], start_kwc=False) as env:
            rvs = [write(env, "create", "old-%d" % i) for i in range(6)]
            floor = env.sim("POST", "/apisim/compact", {"rv": rvs[1]})["floor"]
            self.assertEqual(floor, rvs[1])
            env.start_kwc()  # a fresh list: kwc's history starts at the list's rv
            list_rv = get_list(env.kwc.port, "/api/v1/pods?resourceVersion=0")[0]
            self.assertGreaterEqual(list_rv, rvs[-1])

            # rvs[2]: older than kwc's floor, inside the upstream's history
            seq = env.sim("GET", "/apisim/requests")["seq"]
            s = watch_until(env.kwc.port, "/api/v1/pods?watch=1&timeoutSeconds=30&resourceVersion=%d" % rvs[2],
                            rvs[-1])
            self.assertEqual(s.status, 200)
            self.assertEqual([e for e in s.events if e["type"] == "ERROR"], [], "answered, not 410")
            got = [(e["type"], e["object"]["metadata"]["name"], ev_rv(e)) for e in s.events if e["type"] != "BOOKMARK"]
            self.assertEqual(got, [("ADDED", "old-%d" % i, rvs[i]) for i in range(3, 6)])
            reqs = env.sim("GET", "/apisim/requests")["requests"]
            self.assertTrue(any(r["seq"] > seq and "watch" in r["target"] and "resourceVersion=%d" % rvs[2]
                                in r["target"] for r in reqs), "the watch reached the upstream")

            # rvs[0]: compacted upstream too: a 410 Expired from whoever answers
            s = watch_until(env.kwc.port, "/api/v1/pods?watch=1&timeoutSeconds=30&resourceVersion=%d" % rvs[0],
                            rvs[-1])
            st = s.status
            if st == 200:
                errs = [e for e in s.events if e["type"] == "ERROR"]
                self.assertTrue(errs, "a 410 ERROR event")
                self.assertEqual((errs[0]["object"]["code"], errs[0]["object"]["reason"]), (410, "Expired"))
            else:
                self.assertEqual(st, 410)
            self.assertEqual(http_request(env.kwc.port, "GET", "/readyz")[0], 200)
            self.assertEqual(env.kwc.stop(), 0)


if __name__ == "__main__":
    unittest.main()
