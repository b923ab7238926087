"""Upstream failures become quick Kubernetes Status answers, never hangs."""
import json
import os
import sys
import unittest

from cluster import Env, http_request, wait_for
from scrape import scrape, value


def answered(m, resource, code):
    """Lists of the core group's resource kwc answered with code, passing them through."""
    return value(m, "kwc_requests_total", verb="LIST", group="", resource=resource, code=str(code),
                 source="upstream")


def failed_upstream(m):
    """kwc's GETs to the upstream that got no response."""
    return value(m, "kwc_upstream_requests_total", method="GET", code="<error>")


class FailureTest(unittest.TestCase):
    def check_status(self, resp, code, reason):
        st, h, b = resp
        self.assertEqual(st, code, b[:300])
        self.assertTrue(h.get("content-type", "").startswith("application/json"))
        s = json.loads(b)
        self.assertEqual((s["kind"], s["status"], s["code"]), ("Status", "Failure", code))
        if reason is not None:
            self.assertEqual(s.get("reason", ""), reason)
        return s

    def test_unknown_resource_exits_2_naming_what_the_upstream_serves(self):
        import subprocess
        from cluster import KWC_BIN
        with Env(apisim_args=["--nodes", "1"], start_kwc=False) as env:
            for res, want in (("v1/nodes,v1/foos", r'^kwc: --resources: v1/foos: the upstream has no resource "foos" '
                                                   r'in v1 \(it serves: (?=[^)]*\bpods\b)(?=[^)]*\bnodes\b)[^)]*\)'),
                              ("apps/v2/deployments", r"^kwc: --resources: apps/v2/deployments: the upstream serves "
                                                      r"no API group version apps/v2")):
                with self.subTest(resources=res):
                    r = subprocess.run([KWC_BIN, "--upstream", "http://127.0.0.1:%d" % env.apisim.port,
                                        "--listen", "127.0.0.1:0", "--resources", res,
                                        "--data-dir", os.path.join(env.dir, "d-" + res.replace("/", "_"))],
                                       capture_output=True, text=True, timeout=60)
                    self.assertEqual(r.returncode, 2, r.stderr)
                    errs = [l for l in r.stderr.splitlines() if l.startswith("kwc: ")]
                    self.assertEqual(len(errs), 1, r.stderr)
                    self.assertRegex(errs[0], want)

    def test_unknown_resource_after_an_unreachable_start_named_in_readyz(self):
        # the upstream is away at start: kwc serves, and says why once it knows
        import socket
        from cluster import APISIM, PYTHON, Proc
        with socket.socket() as so:
            so.bind(("127.0.0.1", 0))
            port = so.getsockname()[1]
        with Env(apisim_args=["--nodes", "1"], start_kwc=False, wait_ready=False) as env:
            env.apisim.stop()
            env.apisim = Proc("apisim2", [PYTHON, APISIM, "--listen", "127.0.0.1:%d" % port, "--nodes", "1"],
                              env.dir)
            data = os.path.join(env.dir, "a", "b", "data")  # parents missing
            from cluster import kwc_proc
            env.kwc = kwc_proc("kwc", ["--upstream", "http://127.0.0.1:%d" % port, "--listen", "127.0.0.1:0",
                                       "--data-dir", data, "--resources", "v1/nodes,v1/foos"], env.dir)
            env.kwc.start()
            self.assertTrue(os.path.exists(os.path.join(data, "data.mdb")), "--data-dir made with its parents")
            wait_for(lambda: b"Couldn't connect" in http_request(env.kwc.port, "GET", "/readyz?verbose")[2], 30,
                     "/readyz to say the upstream is away")
            env.apisim.start()

            def reason():
                st, _, b = http_request(env.kwc.port, "GET", "/readyz?verbose")
                return st == 503 and b'the upstream has no resource "foos" in v1' in b and \
                    b"[+]cache /api/v1/nodes: synced" in b and b
            text = wait_for(reason, 30, "/readyz to say why foos does not sync").decode()
            self.assertRegex(text, r'\[-\]cache [^\n]*: not synced, [^\n]* failed: not synced: '
                                   r'the upstream has no resource "foos" in v1 \(it serves: ')
            self.assertRegex(text, r"\[\+\]cache /api/v1/nodes: synced")
            self.assertIsNone(env.kwc.p.poll(), "kwc exited")

    def test_rejected_credentials_named(self):
        with Env(apisim_args=["--nodes", "1", "--token", "right"], start_kwc=False, wait_ready=False) as env:
            kc = os.path.join(env.dir, "kubeconfig")
            with open(kc, "w") as f:
                json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "c",
                           "clusters": [{"name": "s", "cluster": {"server": "http://127.0.0.1:%d" % env.apisim.port}}],
                           "users": [{"name": "u", "user": {"token": "wrong"}}],
                           "contexts": [{"name": "c", "context": {"cluster": "s", "user": "u"}}]}, f)
            from cluster import kwc_proc
            env.kwc = kwc_proc("kwc", ["--kubeconfig", kc, "--listen", "127.0.0.1:0", "--resources", "v1/nodes",
                                       "--data-dir", os.path.join(env.dir, "data")], env.dir)
            env.kwc.start()
            want = b"the upstream rejected kwc's credentials (401) for read discovery: check the token or " \
                   b"certificate in KUBECONFIG"
            wait_for(lambda: want in http_request(env.kwc.port, "GET", "/readyz?verbose")[2], 30,
                     "/readyz to name the rejected credentials")
            self.assertIn(want.decode(), env.kwc.logs())
            self.assertNotIn("unexpected status", env.kwc.logs())

    def test_upstream_down(self):
        # A refused connection is answered at once with a 503 naming it: not
        # retried until a timer (kwc's --upstream-timeout, 60 s, is three times
        # what this client waits), nor kept going after the answer.
        with Env(apisim_args=["--nodes", "1"]) as env:
            env.apisim.stop()
            m0 = scrape(env.kwc.port)
            s = self.check_status(http_request(env.kwc.port, "GET", "/api/v1/nodes", timeout=20), 503,
                                  "ServiceUnavailable")
            self.assertIn("unavailable", s["message"])
            self.assertNotIn("in time", s["message"], "answered by a timer, not the refused connection")
            m1 = scrape(env.kwc.port)
            self.assertEqual(answered(m1, "nodes", 503) - answered(m0, "nodes", 503), 1)
            self.assertGreaterEqual(failed_upstream(m1) - failed_upstream(m0), 1, "no upstream attempt")
            self.assertEqual(value(m1, "kwc_upstream_pool_requests_in_flight", pool="passthrough"), 0,
                             "an attempt went on after the answer")
            # kwc itself stays healthy and live (kube's verbose format)
            self.assertEqual(http_request(env.kwc.port, "GET", "/healthz")[0], 200)
            self.assertEqual(http_request(env.kwc.port, "GET", "/livez?verbose")[0::2],
                             (200, b"[+]ping ok\nlivez check passed\n"))

    def test_outage_logs_one_line_per_cause_and_interval(self):
        # 18 caches and a client's passthroughs through an upstream killed for
        # a few seconds, then back on its port: each cause is written at its
        # first occurrence, then once per --log-summary-interval with counts,
        # then "recovered" (issue 31: 96 warning lines in 10 s before).
        # The counts add up to kwc_reflector_errors_total and the requests.
        import time
        from cluster import APISIM, PYTHON, Proc
        res = ("v1/pods,v1/nodes,v1/services,v1/configmaps,v1/secrets,v1/namespaces,v1/endpoints,"
               "v1/serviceaccounts,v1/persistentvolumes,v1/persistentvolumeclaims,v1/replicationcontrollers,"
               "v1/limitranges,v1/resourcequotas,v1/podtemplates,apps/v1/deployments,apps/v1/replicasets,"
               "apps/v1/daemonsets,apps/v1/statefulsets")
        n_caches = len(res.split(","))
        with Env(apisim_args=["--nodes", "1"],
                 kwc_args=["--resources", res, "--protobuf-resources", "none", "--log-format", "json",
                           "--log-summary-interval", "1s"]) as env:
            try:
                self.outage(env, n_caches)
            except Exception:
                env.dump_logs()
                raise

    def outage(self, env, n_caches):
        import time
        from cluster import APISIM, PYTHON, Proc

        def errors(m):
            return sum(v for (n, _), v in m.items() if n == "kwc_reflector_errors_total")

        def states(m, state):
            return sum(v for (n, l), v in m.items() if n == "kwc_cache_state" and ("state", state) in l)

        def lines():
            with open(env.kwc.log_path, "rb") as f:
                f.seek(offset)
                return [json.loads(l) for l in f.read().decode().splitlines() if l.startswith("{")]
        m0 = scrape(env.kwc.port)
        self.assertEqual(states(m0, "watching"), n_caches, "every cache watching before the outage")
        self.assertEqual(sum(1 for (n, _) in m0 if n == "kwc_cache_last_event_age_seconds"), n_caches,
                         "an age for each cache that heard from the upstream")
        offset = os.path.getsize(env.kwc.log_path)
        port = env.apisim.port
        env.apisim.stop()
        down = time.monotonic()
        n_pass = 20
        for i in range(n_pass):
            st, _, _ = http_request(env.kwc.port, "GET", "/api/v1/namespaces/default/events/e%d" % i, timeout=20)
            self.assertEqual(st, 503)
        # several retries of every cache, and each cache says it backs off
        wait_for(lambda: errors(scrape(env.kwc.port)) - errors(m0) >= 3 * n_caches, 60,
                 "three failed attempts per cache")
        wait_for(lambda: states(scrape(env.kwc.port), "backing_off") == n_caches, 30, "every cache backing off")
        text = http_request(env.kwc.port, "GET", "/readyz?verbose")[2].decode()
        self.assertEqual(text.count("backing off for"), n_caches, text)
        env.apisim = Proc("apisim", [PYTHON, APISIM, "--listen", "127.0.0.1:%d" % port, "--nodes", "1"], env.dir)
        env.apisim.start()
        wait_for(lambda: states(scrape(env.kwc.port), "watching") == n_caches, 60, "every cache watching again")
        outage_s = time.monotonic() - down

        def causes():
            return {l["cause"] for l in lines() if "cause" in l}

        def recovered():
            return {l["cause"] for l in lines() if l.get("state") == "recovered"}
        wait_for(lambda: causes() and causes() <= recovered(), 30, "every cause to recover")
        m1 = scrape(env.kwc.port)
        got = lines()
        by = {}
        for l in got:
            if "cause" in l:
                by.setdefault(l["cause"], []).append(l)
        retries = errors(m1) - errors(m0)
        counted = 0
        for cause, ls in by.items():
            first = [l for l in ls if "count" not in l and "state" not in l]
            summ = [l for l in ls if "count" in l]
            rec = [l for l in ls if l.get("state") == "recovered"]
            self.assertEqual(len(first), 1, "one line at the cause's first occurrence: %s" % cause)
            self.assertEqual(len(rec), 1, cause)
            total = 1 + sum(l["count"] for l in summ)
            self.assertEqual(rec[0]["total"], total, "the recovered line's total: %s" % cause)
            self.assertEqual(rec[0]["level"], "info")
            # one summary per interval (1 s) at most, over the outage and the retries' backoff
            self.assertLessEqual(len(summ), outage_s + 2, "%s: %d summaries in %.1f s" % (cause, len(summ), outage_s))
            for l in summ:
                self.assertEqual(l["level"], "warn")
                self.assertGreaterEqual(l["interval_s"], 1.0)
                self.assertLessEqual(l["subjects"], n_caches if cause.startswith("cache ") else n_pass)
            if cause.startswith("cache "):
                counted += total
        self.assertEqual(counted, retries, "every failed attempt counted once: %r" % sorted(by))
        pt = [c for c in by if c.startswith("passthrough failed: ")]
        self.assertEqual(len(pt), 1, sorted(by))
        self.assertIn("(answered 503)", pt[0])
        self.assertEqual(1 + sum(l["count"] for l in by[pt[0]] if "count" in l), n_pass,
                         "the passthroughs counted")
        warn = [l for l in got if l["level"] == "warn"]
        self.assertLess(len(warn), retries / 2, "far fewer lines than retries: %d lines, %d retries" %
                        (len(warn), retries))
        sys.stderr.write("outage: %d failed attempts of %d caches and %d passthroughs in %.1f s: %d warning "
                         "lines (%d causes)\n" % (retries, n_caches, n_pass, outage_s, len(warn), len(by)))

    def test_upstream_errors_and_hangs(self):
        with Env(apisim_args=["--nodes", "1"], kwc_args=["--upstream-timeout", "2s"]) as env:
            try:
                # an upstream error status passes through untouched (the
                # fault matches this request alone: kwc's own reflector of
                # nodes may ask the upstream at any moment too)
                env.sim("POST", "/apisim/fail", {"count": 1, "mode": "status", "status": 429,
                                                 "match": "fail-429"})
                st, h, b = http_request(env.kwc.port, "GET", "/api/v1/nodes?labelSelector=fail-429")
                self.assertEqual(st, 429)
                # a reset before any answer -> 503 (every attempt: libcurl, like Go's
                # transport, retries an idempotent request once on a reused connection)
                env.sim("POST", "/apisim/fail", {"count": 5, "mode": "reset", "match": "/nodes/reset-me"})
                self.check_status(http_request(env.kwc.port, "GET", "/api/v1/nodes/reset-me"), 503,
                                  "ServiceUnavailable")
                # an upstream that never answers -> 504 from kwc's --upstream-timeout
                # (2 s, as the Status says: not its 60-s default, which the
                # client's 30 s would not wait for), after one attempt
                env.sim("POST", "/apisim/fail", {"count": 1, "mode": "hang", "match": "hang-me"})
                hung = lambda: env.stats()["requests"].get("injected hang", 0)
                self.assertEqual(hung(), 0)
                m0 = scrape(env.kwc.port)
                s = self.check_status(http_request(env.kwc.port, "GET", "/api/v1/nodes?labelSelector=hang-me",
                                                   timeout=30), 504, "Timeout")
                self.assertTrue(s["message"].endswith("the upstream sent no response within 2 s"), s["message"])
                m1 = scrape(env.kwc.port)
                self.assertEqual(hung(), 1, "the hanging upstream saw one request")
                self.assertEqual(failed_upstream(m1) - failed_upstream(m0), 1, "one attempt, given up")
                self.assertEqual(answered(m1, "nodes", 504) - answered(m0, "nodes", 504), 1)
                # and the next request is fine again
                self.assertEqual(http_request(env.kwc.port, "GET", "/api/v1/nodes")[0], 200)
            except Exception:
                env.dump_logs()
                raise

    def test_bad_flags_exit_2_with_a_message(self):
        import subprocess
        from cluster import KWC_BIN
        cases = [
            (["--upstream", "http://x"], b"--data-dir"),
            (["--upstream", "ftp://x", "--data-dir", "/tmp/x"], b"http://"),
            (["--kubeconfig", "/nonexistent/kubeconfig", "--data-dir", "/tmp/x"], b"/nonexistent/kubeconfig"),
            (["--upstream", "http://x", "--data-dir", "/tmp/x", "--listen", "0.0.0.0:1"], b"--insecure-allow-remote"),
            (["--upstream", "http://x", "--data-dir", "/tmp/x", "--log-level", "loud"], b"--log-level"),
            (["--frobnicate"], b"--frobnicate"),
        ]
        for argv, needle in cases:
            with self.subTest(argv=argv):
                r = subprocess.run([KWC_BIN] + argv, capture_output=True, timeout=10)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(needle, r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)


if __name__ == "__main__":
    unittest.main()
