"""Never serve what the cache cannot vouch for: a cache that cannot be written.

A full filesystem under --data-dir (a small tmpfs) or an exhausted LMDB map
(--cache-map-size) takes the resource out of service at the failed write:
/readyz answers 503, /readyz?verbose gives the cause ("no space left on
device" and the data dir; "--cache-map-size"), the log says "no
space left on device in DIR" (not just "Input/output error"), and
resourceVersion=0 lists pass through to the upstream, so they are current.
Once space is freed the resource relists and returns to service by itself.

A second kwc on a data dir in use exits 2 with "data dir DIR is in use by pid
N" and the first goes on serving."""
import json
import os
import subprocess
import unittest

from cluster import Env, KWC_BIN, connect, only_in_plaintext_run, http_request, read_to_eof, wait_for
from faults import (Tmpfs, assert_cache_equals_upstream, get_list, log_text, readyz, wait_exit, wait_readyz)


def created_after(env, name):
    """Create a pod upstream; check kwc's rv=0 list (passed through while the
    cache is out of service) has it."""
    env.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "default", "name": name})
    _, items = get_list(env.kwc.port, "/api/v1/pods?resourceVersion=0")
    return "default/" + name in items


@only_in_plaintext_run("storage failures; the front end's transport plays no part")
class DiskFullTest(unittest.TestCase):
    def test_full_filesystem_out_of_service_then_back(self):
        env = Env(apisim_args=["--pods", "2000", "--namespaces", "3", "--history", "100000"],
                  kwc_args=["--resources", "v1/pods"], start_kwc=False)
        data = os.path.join(env.dir, "data")
        fs = None
        try:
            fs = Tmpfs(data, "24m")
            env.start_kwc()
            # a watcher served by the cache: it must end (cleanly) when the
            # cache leaves service, to resume from the upstream
            w = connect(env.kwc.port, timeout=60)
            w.sendall(b"GET /api/v1/pods?watch=1&labelSelector=kwc-test%3Dnothing HTTP/1.1\r\n"
                      b"Host: localhost\r\n\r\n")
            head = w.recv(65536)
            self.assertTrue(head.startswith(b"HTTP/1.1 200"), head)
            self.assertNotIn("kwc-test", json.dumps(env.sim("GET", "/apisim/requests")), "served by kwc")
            # updates carry the object and its previous version into the
            # history: the cache outgrows 24 MiB within seconds
            env.sim("POST", "/apisim/churn", {"rate": 600, "resources": ["pods"],
                                              "mix": {"update": 0.9, "create": 0.1}})
            # watch the log and /readyz together, the log read first in each
            # poll: out of service from the failed write on
            seen = {}
            polls = [0]

            def full():
                polls[0] += 1
                if "no space left on device" in log_text(env.kwc).lower():
                    seen.setdefault("log", polls[0])
                st, text = readyz(env.kwc.port)
                if st == 503 and "no space left on device" in text:
                    seen.setdefault("503", polls[0])
                    seen["text"] = text
                return "log" in seen and "503" in seen
            try:
                wait_for(full, 60, "/readyz 503 naming \"no space left on device\"", interval=0.05)
            except TimeoutError as e:
                raise AssertionError("%s; seen %r; last /readyz?verbose %r" % (e, seen, readyz(env.kwc.port)))
            # kwc logs the failed commit and takes the cache out of service in
            # one step of its loop, before it answers anything else: the
            # /readyz asked after the poll that first read the line says so
            self.assertLessEqual(seen["503"], seen["log"], "still in service after the failed write was logged "
                                 "(%r)" % seen)
            text = seen["text"]
            self.assertIn(data, text, "/readyz?verbose names the data dir")
            self.assertIn("no space left on device in %s" % data, log_text(env.kwc))
            rest = head.split(b"\r\n\r\n", 1)[1] + read_to_eof(w)
            self.assertTrue(rest.endswith(b"0\r\n\r\n"), "the cache's watch stream ended with its terminal "
                            "chunk when the cache left service: %r" % rest[-200:])
            # out of service (churn goes on, the disk stays full): rv=0 lists
            # are the upstream's current state
            self.assertTrue(created_after(env, "after-full-1"), "a pod created after the disk filled is listed")
            env.sim("POST", "/apisim/churn", {"rate": 0})
            fs.resize("256m")
            wait_readyz(env.kwc.port, 200, 60)
            assert_cache_equals_upstream(self, env)
            self.assertEqual(env.kwc.stop(), 0)
        except BaseException:
            env.dump_logs()
            raise
        finally:
            env.close()
            if fs:
                fs.umount()

    def test_map_full_out_of_service(self):
        # 2000 pods of ~3.1 KB fit in 16 MiB; their updates' history does not
        with Env(apisim_args=["--pods", "2000", "--namespaces", "3", "--history", "100000"],
                 kwc_args=["--resources", "v1/pods", "--cache-map-size", str(16 << 20)]) as env:
            env.sim("POST", "/apisim/churn", {"rate": 600, "resources": ["pods"],
                                              "mix": {"update": 0.9, "create": 0.1}})
            wait_readyz(env.kwc.port, 503, 60, contains=("--cache-map-size",))
            self.assertTrue(created_after(env, "after-map-full-1"), "a pod created after the map filled is listed")
            env.sim("POST", "/apisim/churn", {"rate": 0})
            self.assertIn("--cache-map-size", log_text(env.kwc))
            self.assertEqual(env.kwc.stop(), 0)


@only_in_plaintext_run("data dir locking; the front end's transport plays no part")
class DataDirInUseTest(unittest.TestCase):
    def test_second_process_exits_2(self):
        with Env(apisim_args=["--pods", "100"], kwc_args=["--resources", "v1/pods"]) as env:
            data = os.path.join(env.dir, "data")
            p = subprocess.Popen([KWC_BIN, "--upstream", "http://127.0.0.1:%d" % env.apisim.port,
                                  "--listen", "127.0.0.1:0", "--data-dir", data, "--resources", "v1/pods"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
            try:
                rc = wait_exit(p, 20)
            finally:
                out, err = p.communicate(timeout=10)
            self.assertEqual(rc, 2, err[-2000:])
            self.assertIn(("data dir %s is in use by pid %d" % (data, env.kwc.pid())).encode(), err)
            # the first goes on serving, from a cache that still follows the upstream
            self.assertEqual(http_request(env.kwc.port, "GET", "/readyz")[0], 200)
            env.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "default",
                                              "name": "after-second"})
            wait_for(lambda: "default/after-second" in get_list(env.kwc.port, "/api/v1/pods?resourceVersion=0")[1],
                     30, "the first kwc to follow the upstream")
            assert_cache_equals_upstream(self, env)
            self.assertEqual(env.kwc.stop(), 0)


if __name__ == "__main__":
    unittest.main()
