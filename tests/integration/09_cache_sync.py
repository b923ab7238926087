"""The reflector keeps kwc's LMDB cache equal to the upstream: initial sync,
watch under churn, 410 relists after forced compaction, kill -9 during heavy
ingest, and warm restarts (served at once, even with the upstream down).

The cache is read back independently of kwc with LMDB's own mdb_dump."""
import json
import os
import re
import signal
import struct
import subprocess
import unittest

import crc32c

from cluster import Env, Proc, KWC_BIN, http_request, wait_for

DB = "obj:v1/pods:json"


def dump_cache(data_dir, db=DB, raw=False):
    """{key: rv} (raw: {key: object bytes}) of one cached resource, via mdb_dump
    (hex mode: each key and value is one line of hex digits). A value is
    u32 crc32c | u32 index length | u64 rv | index | object, the CRC-32C over
    the key and then everything after the crc: checked here with Debian's
    python3-crc32c, an implementation independent of kwc's."""
    out = subprocess.run(["mdb_dump", "-s", db, data_dir], capture_output=True, check=True).stdout
    lines = out.decode().split("\n")
    i = lines.index("HEADER=END") + 1
    res = {}
    while lines[i] != "DATA=END":
        k, v = bytes.fromhex(lines[i].strip()), bytes.fromhex(lines[i + 1].strip())
        crc, il = struct.unpack("<II", v[:8])
        assert crc == crc32c.crc32c(k + v[4:]), "checksum of %r" % k
        res[k.decode()] = v[16 + il:] if raw else struct.unpack("<Q", v[8:16])[0]
        i += 2
    return res


def upstream_state(env):
    return {o["key"]: o["rv"] for o in env.sim("GET", "/apisim/state?resource=pods")["items"]}


def cache_rv(env, what="/api/v1/pods"):
    st, _, b = http_request(env.kwc.port, "GET", "/readyz?verbose", timeout=5)
    m = re.search((r"cache %s: [^\n]*? rv (\d+)" % re.escape(what)).encode(), b)
    return int(m.group(1)) if m else 0


class CacheSyncTest(unittest.TestCase):
    def converge(self, env):
        """Stop churn, write once more, wait until kwc has that write."""
        env.sim("POST", "/apisim/churn", {"rate": 0})
        rv = env.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "default",
                                               "name": "marker-%d" % os.getpid()})["rv"]
        wait_for(lambda: cache_rv(env) >= rv, 30, "kwc to reach rv %d" % rv)

    def check_equal(self, env):
        code = env.kwc.stop()
        self.assertEqual(code, 0, env.kwc.logs())
        got = dump_cache(os.path.join(env.dir, "data"))
        want = upstream_state(env)
        missing = set(want) - set(got)
        extra = set(got) - set(want)
        stale = [k for k in want if k in got and got[k] != want[k]]
        # objects are kept in kube's list-item form (no kind/apiVersion on built-in
        # kinds), whether they came from the list or from a watch event
        objs = dump_cache(os.path.join(env.dir, "data"), raw=True)
        items = json.loads(http_request(env.apisim.port, "GET", "/api/v1/pods")[2])["items"]
        by_key = {"%s/%s" % (i["metadata"]["namespace"], i["metadata"]["name"]): i for i in items}
        differ = [k for k in by_key if k in objs and json.loads(objs[k]) != by_key[k]]
        self.assertEqual(differ, [], "cached objects differ from the upstream's list items")
        self.assertFalse(any(o.startswith(b'{"kind"') for o in objs.values()))
        self.assertEqual((len(missing), len(extra), len(stale)), (0, 0, 0),
                         "missing %s extra %s stale %s" % (sorted(missing)[:5], sorted(extra)[:5],
                                                           [(k, got[k], want[k]) for k in stale[:5]]))
        return len(got)

    def test_sync_churn_relist_restart(self):
        env = Env(apisim_args=["--pods", "800", "--nodes", "10", "--namespaces", "4", "--history", "300"],
                  kwc_args=["--resources", "v1/pods,v1/nodes"])
        try:
            env.sim("POST", "/apisim/churn", {"rate": 400, "resources": ["pods"], "label_flip": 0.2})
            for _ in range(3):
                # let some events through, then force the 410 path: hold kwc's
                # pod requests off, move the upstream past kwc and compact.
                start = cache_rv(env)
                wait_for(lambda: cache_rv(env) > start + 200, 20, "events to flow")
                env.sim("POST", "/apisim/fail", {"count": 100000, "match": "/api/v1/pods", "mode": "status",
                                                 "status": 503})
                env.sim("POST", "/apisim/drop-watches", {"resource": "pods"})
                env.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods",
                                                  "namespace": "default", "name": "gap-%d" % start})
                env.sim("POST", "/apisim/compact", {})
                env.sim("POST", "/apisim/fail", {"clear": True})
            self.converge(env)
            n = self.check_equal(env)
            self.assertGreater(n, 700)
            self.assertIn("relisting", env.kwc.logs(400))
            # warm restart with the upstream down: ready at once, from the cache
            env.apisim.stop()
            env.start_kwc()
            st, _, b = http_request(env.kwc.port, "GET", "/readyz?verbose")
            self.assertEqual(st, 200, b)
        except Exception:
            env.dump_logs()
            raise
        finally:
            env.close()

    def test_kill9_during_ingest(self):
        env = Env(apisim_args=["--pods", "2000", "--nodes", "20", "--namespaces", "4", "--history", "100000"],
                  kwc_args=["--resources", "v1/pods"])
        try:
            env.sim("POST", "/apisim/churn", {"rate": 2000, "resources": ["pods"]})
            for i in range(4):
                start = cache_rv(env)
                wait_for(lambda: cache_rv(env) > start + 500, 20, "ingest under way")
                env.kwc.p.send_signal(signal.SIGKILL)  # at an arbitrary point of a batch
                env.kwc.p.wait(10)
                env.kwc.log.close()
                env.start_kwc()  # warm: resumes from the stored rv
            self.converge(env)
            self.check_equal(env)
        except Exception:
            env.dump_logs()
            raise
        finally:
            env.close()


if __name__ == "__main__":
    unittest.main()
