"""A binary upgrade of a single kwc (issue 31, part 2; proxy/handover.c).

`kwc --takeover` with the running one's flags takes its listening sockets
(SCM_RIGHTS over DIR/kwc.sock) and its data dir; the old one drains and
exits. Under churn, with informer-like clients (LIST once, then WATCH and
resume from their rv) and a tight connect loop (a new connection per
request) on kwc's port, two takeovers in a row, each by a copy of the
binary at another path (a new build):

- no connection refused, no request failed (tests/lib/rollout.py counts),
- no informer lists again and none gets an ERROR event, and each ends
  with the upstream's exact state: the new kwc resumed from the data dir;
- the old kwc exits 0 after handing its sockets over.

And the takeovers that must not happen: a new kwc that fails after the old
released the data dir (a bad --resources entry) exits 2 and the old one
takes the data dir back and follows the upstream again; `--takeover`
without a running kwc exits 2 saying so; the control socket is 0600 and
anything but a takeover request on it changes nothing.
"""
import os
import shutil
import socket
import stat
import subprocess
import time
import unittest

from cluster import KWC_BIN, Env, http_request, kwc_proc, only_in_plaintext_run, only_over_http1, wait_for
from rollout import Counters, Informer, TightLoop, free_port, upstream_state

PODS = 200
INFORMERS = 4


@only_in_plaintext_run("the sockets handed over carry whatever they carry")
@only_over_http1("the informers speak HTTP/1.1")
class Takeover(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.env = Env(apisim_args=["--pods", str(PODS)], start_kwc=False)
        cls.port = free_port()
        cls.data = os.path.join(cls.env.dir, "data")
        cls.n = 0

    @classmethod
    def tearDownClass(cls):
        cls.env.close()

    def kwc(self, *extra, binary=KWC_BIN, wait=True):
        Takeover.n += 1
        p = kwc_proc("kwc-%d" % self.n, ["--upstream", "http://127.0.0.1:%d" % self.env.apisim.port,
                                          "--listen", "127.0.0.1:%d" % self.port, "--data-dir", self.data,
                                          "--resources", "v1/pods"] + list(extra), self.env.dir, kwc_bin=binary)
        if wait:
            p.start()
            wait_for(lambda: http_request(self.port, "GET", "/readyz", timeout=5)[0] == 200, 30, "kwc /readyz")
        return p

    def test_1_two_takeovers_under_churn(self):
        old = self.kwc()
        counters = Counters()
        deadline = time.monotonic() + 300
        informers = [Informer(self.port, counters, deadline) for _ in range(INFORMERS)]
        loop = TightLoop(self.port, counters, deadline)
        clients = informers + [loop]
        try:
            for c in clients:
                c.start()
            wait_for(lambda: all(i.established >= 1 for i in informers), 30, "informers watching")
            self.env.sim("POST", "/apisim/churn", {"rate": 40, "resources": ["pods"]})
            for k in range(2):
                newer = os.path.join(self.env.dir, "kwc-build-%d" % k)
                shutil.copy(KWC_BIN, newer)  # the new build, another file
                watches, done = sum(i.established for i in informers), loop.done
                new = self.kwc("--takeover", binary=newer)
                self.assertEqual(old.p.wait(60), 0, old.logs())
                logs = old.logs(400)
                self.assertIn("listening sockets handed over to the new kwc", logs)
                self.assertRegex(logs, r"[1-9][0-9]* watch streams ending", "no watch was moved")
                self.assertIn("taking over from pid %d" % old.pid(), new.logs())
                wait_for(lambda: "warm start with" in new.logs(), 30, "the new kwc's caches to resume")
                wait_for(lambda: sum(i.established for i in informers) >= watches + INFORMERS, 30,
                         "every informer's watch resumed on the new kwc")
                wait_for(lambda: loop.done > done + 10, 30, "requests served by the new kwc")
                old = new
            self.env.sim("POST", "/apisim/churn", {"rate": 0})
            want = upstream_state(self, self.env)
            for i, inf in enumerate(informers):
                wait_for(lambda: inf.snapshot() == want, 60, "informer %d to reach the upstream's state" % i)
        finally:
            for c in clients:
                c.stop_flag.set()
        self.assertEqual(counters.failures, [], "refused or failed requests across the takeovers")
        self.assertEqual([i.lists for i in informers], [1] * INFORMERS, "informers relisted")
        self.assertEqual([i.errors for i in informers], [[]] * INFORMERS, "ERROR events")
        self.__class__.running = old

    def test_2_failed_takeover_resumes_the_old(self):
        old = getattr(self, "running", None) or self.kwc()
        self.__class__.running = old
        bad = self.kwc("--takeover", "--resources", "a/b/c/d", wait=False)
        r = subprocess.run(bad.argv, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("is not group/version/resource", r.stderr)
        wait_for(lambda: "the takeover did not happen: 2 caches resume" in old.logs(), 30, "the old kwc to resume")
        self.assertIsNone(old.p.poll(), "the old kwc exited")
        # it follows the upstream again: a new pod reaches its cache
        self.env.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "default",
                                               "name": "after-failed-takeover"})
        wait_for(lambda: "after-failed-takeover" in http_request(self.port, "GET",
                                                                  "/api/v1/pods?resourceVersion=0")[2].decode(),
                 30, "the old kwc's cache to follow the upstream")

    def test_3_control_socket(self):
        old = getattr(self, "running", None) or self.kwc()
        self.__class__.running = old
        path = os.path.join(self.data, "kwc.sock")
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        freezes = old.logs(1000).count("caches stopped for a takeover")
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(10)
        s.connect(path)
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertEqual(s.recv(1024), b"ERR not a takeover request\n")
        s.close()
        self.assertEqual(http_request(self.port, "GET", "/readyz")[0], 200)
        self.assertEqual(old.logs(1000).count("caches stopped for a takeover"), freezes)
        nodir = os.path.join(self.env.dir, "elsewhere")
        r = subprocess.run([KWC_BIN, "--upstream", "http://127.0.0.1:%d" % self.env.apisim.port, "--listen",
                            "127.0.0.1:0", "--data-dir", nodir, "--takeover"], capture_output=True, text=True,
                           timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("no running kwc to take over on data dir", r.stderr)
        self.assertEqual(old.stop(), 0)


if __name__ == "__main__":
    unittest.main()
