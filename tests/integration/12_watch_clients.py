"""Real clients watching pods through kwc, each run side by side with the same
client pointed straight at apisim under the same churn: what the client saw
must be the same, and apisim must see no pods watch from the clients that go
through kwc (kwc's own reflector watch is the only one).

- Debian's python3-kubernetes: watch.Watch().stream with bookmarks, a 3 s
  server timeout and resume from the last rv, over and over.
- npm @kubernetes/client-node 1.4: the informer (list, then watch); counts
  of add/update/delete callbacks and its final cache.
- kubectl get pods -A -w --output-watch-events -o json (kubectl asks for plain
  JSON with -o json; its default table output asks for Table, which kwc passes
  to the upstream).
"""
import json
import time
import os
import tempfile
import unittest

from scrape import scrape, total, value
from cluster import PYTHON, Env, Reader, kubeconfig, kubectl_binaries, kubectl_server_args, tls_client, url, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENTS = os.path.join(HERE, "clients")



class WatchClients(unittest.TestCase):
    def setUp(self):
        self.env = Env(apisim_args=["--pods", "60", "--namespaces", "3", "--nodes", "3", "--history", "100000",
                                    "--bookmark-interval", "0.5"],
                       kwc_args=["--resources", "v1/pods", "--bookmark-interval", "1s"])
        self.readers = []

    def tearDown(self):
        for r in self.readers:
            r.stop()
        self.env.close()

    def pods_watches(self):
        return self.env.stats()["requests"].get("watch pods", 0)

    def churn_then_sentinel(self, name, at_least_s=0.0, before_sentinel=None):
        e = self.env
        e.sim("POST", "/apisim/churn", {"rate": 150, "resources": ["pods"], "label_flip": 0.3,
                                        "mix": {"update": 0.7, "create": 0.15, "delete": 0.15}})
        start, t0 = e.stats()["events"], time.monotonic()
        wait_for(lambda: e.stats()["events"] >= start + 600, 30, "600 churn events")
        # (a floor, not a synchronisation: the churn outlasts a watch's
        # timeoutSeconds however fast apisim writes, so a client resumes
        # in the middle of it)
        wait_for(lambda: time.monotonic() - t0 >= at_least_s, at_least_s + 5, "the churn's length")
        e.sim("POST", "/apisim/churn", {"rate": 0})
        if before_sentinel:
            before_sentinel()
        e.sim("POST", "/apisim/write", {"verb": "create", "namespace": "ns-0", "name": name})
        return "ns-0/" + name

    def start(self, argv, env=None):
        r = Reader(argv, env)
        self.readers.append(r)
        return r

    def test_python_kubernetes_watch_resume(self):
        e = self.env
        rv = e.stats()["rv"]
        before = self.pods_watches()
        up_before = total(scrape(e.kwc.port), "kwc_requests_total", verb="WATCH", resource="pods",
                          source="upstream")
        py = os.path.join(CLIENTS, "py_watch.py")
        args = ["--rv", str(rv), "--until", "ns-0/sentinel-py", "--timeout", "3"]

        def server(port):
            t = tls_client(port)
            return ["--server", url(port)] + (["--ca", t.ca, "--cert", t.cert, "--key", t.key] if t else [])
        via = self.start([PYTHON, py] + server(e.kwc.port) + args)
        direct = self.start([PYTHON, py] + server(e.apisim.port) + args)
        # quiet after the churn: a bookmark reaches the client through kwc
        # (under churn every event already carries the newest rv)
        bookmarked = lambda: wait_for(lambda: any('"BOOKMARK"' in l for l in list(via.lines)), 20,
                                      "a bookmark through kwc")
        self.churn_then_sentinel("sentinel-py", at_least_s=4.5, before_sentinel=bookmarked)
        self.assertEqual(via.wait(60), 0, via.stderr())
        self.assertEqual(direct.wait(60), 0, direct.stderr())

        def events(lines):
            return [e for e in (json.loads(l) for l in lines) if e.get("type") != "BOOKMARK"]
        ev_via, tail_via = events(via.lines[:-1]), json.loads(via.lines[-1])
        ev_dir = events(direct.lines[:-1])
        self.assertGreater(len(ev_dir), 250)
        self.assertEqual(ev_via, ev_dir)
        self.assertGreater(tail_via["segments"], 1, "the client never resumed")
        self.assertGreater(tail_via["bookmarks"], 0, "no bookmarks through kwc")
        # every pods watch apisim saw from a client is one of the direct
        # client's segments: kwc passed none of the via client's through
        # (kwc's own upstream watches are its reflectors', not counted here)
        port = e.kwc.port
        wait_for(lambda: value(scrape(port), "kwc_requests_in_flight", source="upstream") == 0, 10,
                 "no passthrough in flight")
        self.assertEqual(total(scrape(port), "kwc_requests_total", verb="WATCH", resource="pods",
                               source="upstream") - up_before, 0, "a via watch passed through")
        self.assertGreaterEqual(self.pods_watches() - before, json.loads(direct.lines[-1])["segments"])

    def test_client_node_informer(self):
        e = self.env
        d = tempfile.mkdtemp(prefix="kwc-informer-")
        js = os.path.join(CLIENTS, "informer.mjs")
        before = self.pods_watches()
        via = self.start(["node", js, kubeconfig(e.kwc.port, d), "ns-0/sentinel-js"])
        direct = self.start(["node", js, kubeconfig(e.apisim.port, d), "ns-0/sentinel-js"])
        wait_for(lambda: any(l.startswith("synced") for l in via.lines) and
                 any(l.startswith("synced") for l in direct.lines), 120, "both informers to sync")
        self.churn_then_sentinel("sentinel-js")
        self.assertEqual(via.wait(60), 0, via.stderr())
        self.assertEqual(direct.wait(60), 0, direct.stderr())
        out_via, out_dir = json.loads(via.lines[-1]), json.loads(direct.lines[-1])
        self.assertEqual(out_via["counts"], out_dir["counts"])
        self.assertGreater(out_dir["counts"]["update"], 100)
        self.assertGreater(out_dir["counts"]["delete"], 10)
        self.assertEqual(out_via["cache"], out_dir["cache"])
        st = e.sim("GET", "/apisim/state?resource=pods")
        self.assertEqual(out_via["cache"], {i["key"]: str(i["rv"]) for i in st["items"]})
        self.assertEqual(self.pods_watches() - before, 1, "only the direct informer watched apisim")

    def test_kubectl_watch_events(self):
        e = self.env
        bins = kubectl_binaries()
        kubectl = bins.get("1.33", bins["default"])
        before = self.pods_watches()
        argv = lambda port: [kubectl] + kubectl_server_args(port) + ["get", "pods", "-A", "-w",
                                                                     "--output-watch-events", "-o", "json"]
        via = self.start(argv(e.kwc.port), env=dict(os.environ, KUBECONFIG="/dev/null"))
        direct = self.start(argv(e.apisim.port), env=dict(os.environ, KUBECONFIG="/dev/null"))

        def events(r):
            # with --output-watch-events -o json kubectl prints one compact event per line
            return [json.loads(line) for line in list(r.lines) if line.startswith("{")]

        wait_for(lambda: len(events(via)) >= 60 and len(events(direct)) >= 60, 120, "the initial lists")
        key = self.churn_then_sentinel("sentinel-kubectl")
        done = lambda r: any(ev["type"] == "ADDED" and
                             "%s/%s" % (ev["object"]["metadata"]["namespace"], ev["object"]["metadata"]["name"]) == key
                             for ev in events(r))
        wait_for(lambda: done(via) and done(direct), 60, "kubectl to print the sentinel")
        via.stop()
        direct.stop()
        strip = lambda r: [(ev["type"], ev["object"]["metadata"]["namespace"], ev["object"]["metadata"]["name"],
                            ev["object"]["metadata"]["resourceVersion"]) for ev in events(r)]
        a, b = strip(via), strip(direct)
        n = min(len(a), len(b))
        self.assertGreater(n, 300)
        self.assertEqual(a[:n], b[:n])
        self.assertEqual(events(via)[:n], events(direct)[:n])
        self.assertEqual(self.pods_watches() - before, 1, "only the direct kubectl watched apisim")


if __name__ == "__main__":
    unittest.main()
