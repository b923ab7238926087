"""Never serve what the cache cannot vouch for: a damaged data.mdb.

At start kwc checks DIR/data.mdb (meta pages, the file covering the pages in
use, B-tree pages, every value's CRC32C and its meta records). With
--on-corrupt-cache=rebuild (the default) a damaged dir is logged (a line with
"damaged" and the reason), wiped, and relisted from the upstream; move-aside
renames data.mdb to DIR/data.mdb.corrupt-* and starts empty; fail exits 2 with
a message containing "damaged". Never a crash, never a 200 list whose items
are not the upstream's.

During service, a value whose checksum does not match when read (bytes
overwritten in data.mdb while kwc runs: LMDB's map is shared, so a pwrite by
the test is what kwc reads) takes its resource out of service: the request in
hand passes through to the upstream, /readyz answers 503 and /readyz?verbose
says "out of service" and names the damaged key, a log line names resource
and key, and the resource relists by itself and returns to service with the
cache equal to the upstream.

Damage is placed by searching data.mdb for a unique marker put in a pod's
annotation."""
import os
import random
import shutil
import subprocess
import unittest

from cluster import Env, KWC_BIN, only_in_plaintext_run, http_request, wait_for
from faults import (assert_cache_equals_upstream, assert_not_signalled, find_all, get_list, log_since, log_size,
                    log_text, overwrite, wait_readyz)

PODS = "1500"
PAGE = 4096


def make_env(kwc_args=()):
    return Env(apisim_args=["--pods", PODS, "--namespaces", "3"],
               kwc_args=["--resources", "v1/pods"] + list(kwc_args))


def add_marker_pod(env, tag):
    """Create a pod carrying a unique marker; wait until kwc's list has it.
    Returns (pod name, marker bytes)."""
    marker = ("MARKER-%s-%016x" % (tag, random.getrandbits(64))).encode()
    name = "marked-%s" % tag
    env.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "default", "name": name,
                                      "annotations": {"kwc.test/marker": marker.decode()}})
    wait_for(lambda: marker in http_request(env.kwc.port, "GET", "/api/v1/namespaces/default/pods?resourceVersion=0")[2],
             30, "kwc's cache to hold the marked pod")
    return name, marker


def damage_marker(path, marker):
    """Overwrite the random tail of every copy of marker in path with 'Z's
    (still valid JSON: only a checksum can tell). Returns the offsets."""
    offs = find_all(path, marker)
    if not offs:
        raise AssertionError("marker %r not found in %s" % (marker, path))
    for o in offs:
        overwrite(path, o + len(marker) - 8, b"ZZZZZZZZ")
    return offs


@only_in_plaintext_run("storage integrity; the front end's transport plays no part")
class CorruptAtStartTest(unittest.TestCase):
    def setUp(self):
        self.env = make_env()
        self.mdb = os.path.join(self.env.dir, "data", "data.mdb")

    def tearDown(self):
        self.env.close()

    def run(self, result=None):
        before = len(result.failures) + len(result.errors) if result else 0
        r = super().run(result)
        if result and len(result.failures) + len(result.errors) > before and getattr(self, "env", None):
            self.env.dump_logs()
        return r

    def stop_kwc(self):
        self.assertEqual(self.env.kwc.stop(), 0, "kwc's exit status on SIGTERM")

    def ensure_running(self):
        """After a failed case: a fresh data dir and kwc, so the next case
        tests what it says."""
        k = self.env.kwc
        if k.p.poll() is None and http_request(k.port, "GET", "/readyz", timeout=5)[0] == 200:
            return
        if k.p.poll() is None:
            k.kill()
        shutil.rmtree(os.path.dirname(self.mdb), ignore_errors=True)
        self.env.start_kwc()

    def damaged_at_rest(self, tag):
        name, marker = add_marker_pod(self.env, tag)
        self.stop_kwc()
        damage_marker(self.mdb, marker)
        return name, marker

    def test_value_checksum_default_rebuild(self):
        """A value whose bytes changed at rest: the default mode logs
        "damaged", wipes, relists, and serves the upstream's pods."""
        name, marker = self.damaged_at_rest("rebuild")
        at = log_size(self.env.kwc)
        self.env.start_kwc()
        # the served list is the upstream's, never the damaged bytes
        assert_cache_equals_upstream(self, self.env)
        self.assertNotIn(b"ZZZZZZZZ", http_request(self.env.kwc.port, "GET",
                                                   "/api/v1/namespaces/default/pods/%s?resourceVersion=0" % name)[2])
        self.assertIn("damaged", log_since(self.env.kwc, at), "kwc's log names the damage")

    def test_move_aside(self):
        """--on-corrupt-cache=move-aside keeps the damaged file as
        DIR/data.mdb.corrupt-* and starts from an empty cache."""
        _, marker = self.damaged_at_rest("aside")
        self.env.start_kwc(["--on-corrupt-cache=move-aside"])
        d = os.path.dirname(self.mdb)
        moved = [f for f in os.listdir(d) if f.startswith("data.mdb.corrupt-")]
        self.assertEqual(len(moved), 1, os.listdir(d))
        self.assertTrue(find_all(os.path.join(d, moved[0]), marker[:-8] + b"ZZZZZZZZ"),
                        "the moved-aside file is the damaged one")
        self.assertFalse(find_all(self.mdb, marker[:-8] + b"ZZZZZZZZ"), "the new data.mdb is not the damaged one")
        assert_cache_equals_upstream(self, self.env)
        self.assertIn("damaged", log_text(self.env.kwc))

    def test_fail_mode_exits_2(self):
        """--on-corrupt-cache=fail: exit status 2 and a message containing
        "damaged"; the data dir is left as it was."""
        _, marker = self.damaged_at_rest("fail")
        before = os.path.getsize(self.mdb)
        r = subprocess.run([KWC_BIN, "--upstream", "http://127.0.0.1:%d" % self.env.apisim.port,
                            "--listen", "127.0.0.1:0", "--data-dir", os.path.dirname(self.mdb),
                            "--resources", "v1/pods", "--on-corrupt-cache=fail"],
                           capture_output=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr[-2000:])
        self.assertIn(b"damaged", r.stderr)
        self.assertEqual(os.path.getsize(self.mdb), before)
        self.assertTrue(find_all(self.mdb, marker[:-8] + b"ZZZZZZZZ"), "fail mode leaves the file alone")

    def test_truncated_file(self):
        """data.mdb cut to half its size (kwc stopped): no SIGBUS, "damaged"
        in the log, ready again after the rebuild, the upstream's items."""
        add_marker_pod(self.env, "trunc")
        self.stop_kwc()
        size = os.path.getsize(self.mdb)
        self.assertGreater(size, 4 * 1024 * 1024)
        os.truncate(self.mdb, size // 2 // PAGE * PAGE)
        at = log_size(self.env.kwc)
        self.env.start_kwc()
        assert_not_signalled(self, self.env.kwc)
        self.assertIn("damaged", log_since(self.env.kwc, at))
        n = assert_cache_equals_upstream(self, self.env)
        self.assertGreater(n, int(PODS))
        self.assertIsNone(self.env.kwc.p.poll(), "kwc is still running")

    def test_random_4k_overwrites(self):
        """4 KiB of random bytes (seeded) over a page holding an object, meta
        page 0, meta page 1 and the middle of the file, one at a time with
        kwc stopped: kwc starts, serves valid JSON equal to the upstream's
        list; the damage to pages in use is detected ("damaged")."""
        rng = random.Random(1515)
        cases = ["object page", "meta page 0", "meta page 1", "middle of the file"]
        for i, case in enumerate(cases):
            with self.subTest(case=case):
                self.ensure_running()
                _, marker = add_marker_pod(self.env, "rnd%d" % i)
                self.stop_kwc()
                size = os.path.getsize(self.mdb)
                if case == "object page":
                    offs = sorted({o // PAGE * PAGE for o in find_all(self.mdb, marker)})
                    self.assertTrue(offs)
                elif case == "meta page 0":
                    offs = [0]
                elif case == "meta page 1":
                    offs = [PAGE]
                else:
                    offs = [size // 2 // PAGE * PAGE]
                for o in offs:
                    overwrite(self.mdb, o, bytes(rng.getrandbits(8) for _ in range(PAGE)))
                at = log_size(self.env.kwc)
                self.env.start_kwc()
                assert_not_signalled(self, self.env.kwc)
                if case != "middle of the file":  # that page may be a free one
                    self.assertIn("damaged", log_since(self.env.kwc, at))
                # every list kwc answers is valid JSON (get_list parses it) and the upstream's
                get_list(self.env.kwc.port, "/api/v1/pods?resourceVersion=0")
                assert_cache_equals_upstream(self, self.env)


@only_in_plaintext_run("storage integrity; the front end's transport plays no part")
class DamagedWhileServingTest(unittest.TestCase):
    def test_checksum_mismatch_takes_resource_out_of_service(self):
        env = make_env()
        try:
            self.check(env)
        except BaseException:
            env.dump_logs()
            raise
        finally:
            codes = env.close()
        self.assertEqual(codes.get("kwc"), 0)

    def check(self, env):
        mdb = os.path.join(env.dir, "data", "data.mdb")
        name, marker = add_marker_pod(env, "live")
        key = "default/" + name
        # hold the relist off (the reflector's requests use the cluster-wide
        # path; the test's own requests below are namespaced) so the
        # out-of-service state can be observed, not just raced
        env.sim("POST", "/apisim/fail", {"count": 10 ** 9, "match": "/api/v1/pods", "mode": "status",
                                         "status": 503})
        damage_marker(mdb, marker)
        get = "/api/v1/namespaces/default/pods/%s?resourceVersion=0" % name
        st, _, body = http_request(env.kwc.port, "GET", get)
        ust, _, ubody = http_request(env.apisim.port, "GET", "/api/v1/namespaces/default/pods/%s" % name)
        self.assertEqual((st, body), (ust, ubody), "the request that met the damage is answered by the upstream")
        text = wait_readyz(env.kwc.port, 503, 30, contains=("out of service",))
        line = [l for l in text.splitlines() if "out of service" in l]
        self.assertTrue(any("pods" in l and key in l for l in line),
                        "/readyz?verbose names the resource and the damaged key %s: %r" % (key, text))
        self.assertTrue(any("pods" in l and key in l for l in log_text(env.kwc).splitlines()),
                        "a log line names the resource and the damaged key")
        # while out of service, rv=0 lists pass through to the upstream
        seq = env.sim("GET", "/apisim/requests")["seq"]
        lst = "/api/v1/namespaces/default/pods?resourceVersion=0"
        got = get_list(env.kwc.port, lst)
        reqs = env.sim("GET", "/apisim/requests")["requests"]
        self.assertTrue(any(r["seq"] > seq and r["target"] == lst for r in reqs), "the list reached the upstream")
        self.assertEqual(got, get_list(env.apisim.port, "/api/v1/namespaces/default/pods"))
        # the upstream lets the relist through: back in service by itself
        env.sim("POST", "/apisim/fail", {"clear": True})
        wait_readyz(env.kwc.port, 200, 60)
        assert_cache_equals_upstream(self, env)
        # and served from the cache again, not passed through
        seq = env.sim("GET", "/apisim/requests")["seq"]
        get_list(env.kwc.port, lst)
        reqs = env.sim("GET", "/apisim/requests")["requests"]
        self.assertFalse(any(r["seq"] > seq and r["target"] == lst for r in reqs), "served from the cache")


if __name__ == "__main__":
    unittest.main()
