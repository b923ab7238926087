"""kubectl through kwc answers exactly as kubectl direct against apisim, for
the default kubectl (a dispatcher that picks the binary matching /version) and
side-by-side versions 1.27, 1.30 and 1.33."""
import json
import re
import os
import select
import subprocess
import tempfile
import time
import unittest

from cluster import EnvTestCase, Env, kubectl, kubectl_binaries, kubectl_server_args, wait_for


class KubectlTest(EnvTestCase):
    apisim_args = ["--pods", "30", "--nodes", "3", "--namespaces", "3"]

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.bins = kubectl_binaries()

    def same(self, binary, *args, age_column=False):
        d = kubectl(binary, self.env.apisim.port, *args).stdout
        k = kubectl(binary, self.env.kwc.port, *args).stdout
        if age_column:  # "4s" vs "5s": the clock moved between the two runs
            d, k = (re.sub(rb"\s\d+[smhd](\d+[smh])?\s*$", b" AGE", x, flags=re.M) for x in (d, k))
        self.assertEqual(d, k, "kubectl %s differs through kwc" % " ".join(args))
        return k

    def test_get_forms(self):
        for ver, b in self.bins.items():
            with self.subTest(kubectl=ver):
                names = self.same(b, "get", "pods", "-A", "-o", "name").decode().split()
                self.assertEqual(len(names), 30)
                table = self.same(b, "get", "pods", "-n", "ns-1", age_column=True).decode()
                self.assertIn("NAME", table.splitlines()[0])
                j = json.loads(self.same(b, "get", "pods", "-A", "-o", "json"))
                self.assertEqual(len(j["items"]), 30)
                chunked = kubectl(b, self.env.kwc.port, "get", "pods", "-A", "-o", "name",
                                  "--chunk-size=7").stdout.decode().split()
                self.assertEqual(sorted(chunked), sorted(names))
                raw = json.loads(self.same(b, "get", "--raw", "/api/v1/nodes?limit=1"))
                self.assertEqual(len(raw["items"]), 1)
                self.assertTrue(raw["metadata"].get("continue"))

    def test_create_delete(self):
        for i, (ver, b) in enumerate(self.bins.items()):
            with self.subTest(kubectl=ver):
                name = "kc-%d" % i
                manifest = json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                                       "metadata": {"name": name, "namespace": "ns-0"},
                                       "data": {"k": "v"}}).encode()
                out = kubectl(b, self.env.kwc.port, "create", "-f", "-", input=manifest).stdout
                self.assertIn(name.encode(), out)
                got = kubectl(b, self.env.apisim.port, "get", "configmap", name, "-n", "ns-0",
                              "-o", "json").stdout
                self.assertEqual(json.loads(got)["data"], {"k": "v"})
                kubectl(b, self.env.kwc.port, "delete", "configmap", name, "-n", "ns-0")
                r = kubectl(b, self.env.apisim.port, "get", "configmap", name, "-n", "ns-0",
                            check=False)
                self.assertNotEqual(r.returncode, 0)
                self.assertIn(b"NotFound", r.stderr)

    def test_watch_events(self):
        b = self.bins["default"]
        env = dict(os.environ, KUBECONFIG="/dev/null", HOME=tempfile.gettempdir())
        p = subprocess.Popen([b] + kubectl_server_args(self.env.kwc.port) +
                             ["get", "configmaps", "-n", "ns-2", "-w", "--output-watch-events"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        out = bytearray()
        lines = []
        try:
            def read_until(pred, timeout=20):
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    if pred():
                        return True
                    r, _, _ = select.select([p.stdout], [], [], 0.5)
                    if r:
                        chunk = os.read(p.stdout.fileno(), 65536)
                        if not chunk:
                            break
                        out.extend(chunk)
                        lines[:] = out.decode().splitlines()
                raise AssertionError("kubectl -w output so far: %r" % lines)

            # kubectl's initial list is empty for ns-2 configmaps; then each write shows up.
            for n in ("w1", "w2", "w3"):
                self.env.sim("POST", "/apisim/write", {"verb": "create", "resource": "configmaps",
                                                       "namespace": "ns-2", "name": n})
                read_until(lambda: any("ADDED" in l and (" %s " % n) in l for l in lines))
            self.env.sim("POST", "/apisim/write", {"verb": "delete", "resource": "configmaps",
                                                   "namespace": "ns-2", "name": "w2"})
            read_until(lambda: any("DELETED" in l and "w2" in l for l in lines))
        finally:
            p.kill()
            p.wait(5)


if __name__ == "__main__":
    unittest.main()
