"""Upstream failures become quick Kubernetes Status answers, never hangs."""
import json
import os
import time
import unittest

from cluster import Env, http_request, wait_for


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

    def test_unknown_resource_named_in_readyz_and_data_dir_parents_made(self):
        with Env(apisim_args=["--nodes", "1"], start_kwc=False, wait_ready=False) as env:
            data = os.path.join(env.dir, "a", "b", "data")  # parents missing
            env.start_kwc(["--data-dir", data, "--resources", "v1/nodes,v1/foos"])
            self.assertTrue(os.path.exists(os.path.join(data, "data.mdb")), "--data-dir made with its parents")

            def reason():
                st, _, b = http_request(env.kwc.port, "GET", "/readyz?verbose")
                return st == 503 and b"the upstream does not serve v1/foos" in b and b
            text = wait_for(reason, 30, "/readyz to say why foos does not sync").decode()
            self.assertRegex(text, r"\[-\]cache [^\n]*: not synced, [^\n]* failed: not synced: "
                                   r"the upstream does not serve v1/foos")
            self.assertRegex(text, r"\[\+\]cache /api/v1/nodes: synced")

    def test_upstream_down(self):
        with Env(apisim_args=["--nodes", "1"]) as env:
            env.apisim.stop()
            t0 = time.monotonic()
            s = self.check_status(http_request(env.kwc.port, "GET", "/api/v1/nodes"), 503,
                                  "ServiceUnavailable")
            self.assertLess(time.monotonic() - t0, 3)
            self.assertIn("unavailable", s["message"])
            # kwc itself stays healthy
            self.assertEqual(http_request(env.kwc.port, "GET", "/healthz")[0], 200)

    def test_upstream_errors_and_hangs(self):
        with Env(apisim_args=["--nodes", "1"], kwc_args=["--upstream-timeout", "2"]) as env:
            try:
                # an upstream error status passes through untouched
                env.sim("POST", "/apisim/fail", {"count": 1, "mode": "status", "status": 429})
                st, h, b = http_request(env.kwc.port, "GET", "/api/v1/nodes")
                self.assertEqual(st, 429)
                # a reset before any answer -> 503 (every attempt: libcurl, like Go's
                # transport, retries an idempotent request once on a reused connection)
                env.sim("POST", "/apisim/fail", {"count": 5, "mode": "reset", "match": "/nodes/reset-me"})
                self.check_status(http_request(env.kwc.port, "GET", "/api/v1/nodes/reset-me"), 503,
                                  "ServiceUnavailable")
                # an upstream that never answers -> 504 after --upstream-timeout
                env.sim("POST", "/apisim/fail", {"count": 1, "mode": "hang"})
                t0 = time.monotonic()
                self.check_status(http_request(env.kwc.port, "GET", "/api/v1/nodes"), 504, "Timeout")
                self.assertLess(time.monotonic() - t0, 5)
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
