"""`make run`'s demo (tests/lib/demo.py) shows the cache at work (issue 33,
part 4): its tour, run with --scenario-only on a small cluster, must find in
kwc's access log source=cache for an informer's rv=0 list and watch, a
NotOlderThan page, a kubelet-like list by spec.nodeName and kubectl's watch,
and source=upstream for kubectl's consistent list and its Table; the demo
exits 1 when a source is not the expected one. Its temporary directory is
removed and its processes are stopped on every exit: after the tour, on
SIGINT in the middle of it (a Ctrl-C), and when kwc cannot start (the port
taken); and on a machine without kubectl. About 8 s in all (a tour of
~4 s at 60 pods with two 2-second watches, one of ~3 s without kubectl, one
stopped early).
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import unittest

from cluster import KWC_BIN, PYTHON, ROOT, Reader, only_in_plaintext_run, wait_for

DEMO = os.path.join(ROOT, "tests", "lib", "demo.py")
SMALL = ["--pods", "60", "--nodes", "3", "--churn", "5"]


class Demo(Reader):
    """demo.py as a child, its stdout and stderr collected line by line."""

    def __init__(self, *args, port="0", path=None):
        env = dict(os.environ, KWC_PORT=port)
        if path is not None:
            env["PATH"] = path
        env.pop("KWC_KEEP_TMP", None)
        super().__init__([PYTHON, DEMO, "--kwc", KWC_BIN] + list(args), env, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL)

    def text(self):
        return "\n".join(self.lines)

    def wait(self, timeout=120):
        try:
            rc = self.p.wait(timeout)
        finally:
            if self.p.poll() is None:  # the demo stops its processes on SIGTERM
                self.p.terminate()
                try:
                    self.p.wait(30)
                except subprocess.TimeoutExpired:
                    self.p.kill()
                    self.p.wait(5)
        self.t.join(5)
        return rc

    def workdir(self):
        m = re.search(r"^kwc demo: working in (\S+)$", self.text(), re.M)
        return m.group(1) if m else None

    def pids(self):
        m = re.search(r"^kwc \(pid (\d+)\) serves on .* apisim \(pid (\d+)\)", self.text(), re.M)
        return [int(m.group(1)), int(m.group(2))] if m else []


def gone(pid):
    """Whether pid is no longer kwc or apisim (exited; a reused pid runs something else)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            cmd = f.read()
    except OSError:
        return True
    return b"kwc" not in cmd and b"apisim" not in cmd


def log_lines(text, source):
    """The access-log lines the demo printed with that source."""
    return [l for l in text.splitlines() if "kwc.log: request " in l and l.endswith(" source=" + source)]


@only_in_plaintext_run("the demo runs its own plaintext kwc on loopback, whatever the run's transport")
class DemoTest(unittest.TestCase):
    def assert_cleaned_up(self, d, out):
        work = d.workdir()
        self.assertTrue(work and work.startswith("/"), out)
        self.assertFalse(os.path.exists(work), "the demo's directory is left behind:\n" + out)
        self.assertIn("removed " + work, out)
        for pid in d.pids():
            self.assertTrue(wait_for(lambda: gone(pid), 10, "pid %d to exit" % pid))

    def test_tour_shows_cache_and_upstream(self):
        d = Demo("--scenario-only", *SMALL)
        rc = d.wait()
        out = d.text()
        self.assertEqual(rc, 0, out)
        cache, upstream = "\n".join(log_lines(out, "cache")), "\n".join(log_lines(out, "upstream"))
        # 1. the informer: rv=0 list and a watch from its rv (Python's http.client)
        self.assertIn('path="/api/v1/pods?resourceVersion=0"', cache, out)
        self.assertRegex(cache, r'path="/api/v1/pods\?watch=true&resourceVersion=\d+&allowWatchBookmarks=true'
                                r'&timeoutSeconds=2"', out)
        # 2. a NotOlderThan page (and its next page)
        self.assertRegex(cache, r"resourceVersionMatch=NotOlderThan&limit=\d+", out)
        self.assertRegex(cache, r'path="/api/v1/pods\?limit=\d+&continue=', out)
        # 3. kubectl get --raw, a node's pods
        self.assertRegex(cache, r"fieldSelector=spec.nodeName%3Dnode-1&resourceVersion=0", out)
        # 4. kubectl get -w: the list is a consistent read (upstream), the watch the cache's
        self.assertRegex(upstream, r'path="/api/v1/pods\?limit=500&timeout=2s"', out)
        self.assertRegex(cache, r'path="/api/v1/pods\?resourceVersion=\d+&timeout=2s&watch=true"', out)
        # 5. kubectl get pods (a Table)
        self.assertRegex(upstream, r'path="/api/v1/namespaces/ns-0/pods\?limit=500"', out)
        self.assertEqual(len(log_lines(out, "upstream")), 2, out)
        self.assertNotIn("!! expected", out)
        self.assertIn("kwc exited 0", out)
        self.assert_cleaned_up(d, out)

    def test_tour_without_kubectl(self):
        """On a machine without kubectl the tour makes kubectl's requests
        itself (a Table: upstream) and skips kubectl's watch."""
        empty = tempfile.mkdtemp(prefix="kwc-nopath-")
        try:
            d = Demo("--scenario-only", *SMALL, path=empty)
            rc = d.wait()
        finally:
            shutil.rmtree(empty, ignore_errors=True)
        out = d.text()
        self.assertEqual(rc, 0, out)
        self.assertIn("kubectl is not on PATH", out)
        cache, upstream = log_lines(out, "cache"), log_lines(out, "upstream")
        self.assertTrue([l for l in cache if "fieldSelector=spec.nodeName%3Dnode-1" in l], out)
        self.assertEqual(len(upstream), 1, out)
        self.assertIn('path="/api/v1/namespaces/ns-0/pods?limit=500"', upstream[0])
        self.assertIn("| NAME", out)  # the Table's first column
        self.assert_cleaned_up(d, out)

    def test_ctrl_c_in_the_tour_stops_and_cleans_up(self):
        d = Demo(*SMALL)
        try:
            wait_for(lambda: any(l.startswith("1. An informer") for l in d.lines), 60, "the tour to begin")
        except BaseException:
            d.p.terminate()
            d.wait()
            raise
        d.p.send_signal(signal.SIGINT)
        rc = d.wait(60)
        out = d.text()
        self.assertEqual(rc, 0, out)  # the user's Ctrl-C is how the demo ends
        self.assertIn("SIGINT: stopping", out)
        self.assertIn("kwc exited 0", out)
        self.assert_cleaned_up(d, out)

    def test_port_taken(self):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", 0))
            s.listen(1)
            d = Demo("--scenario-only", *SMALL, port=str(s.getsockname()[1]))
            rc = d.wait()
        finally:
            s.close()
        out = d.text()
        self.assertEqual(rc, 1, out)
        self.assertIn("set KWC_PORT=", out)
        work = d.workdir()
        self.assertTrue(work, out)
        self.assertFalse(os.path.exists(work), out)


if __name__ == "__main__":
    unittest.main()
