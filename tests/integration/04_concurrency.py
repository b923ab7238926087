"""200 concurrent requests through kwc, all answered like the upstream answers them."""
import concurrent.futures
import json
import unittest

from cluster import Env, http_request


class ConcurrencyTest(unittest.TestCase):
    def test_200_concurrent(self):
        with Env(apisim_args=["--pods", "200", "--nodes", "10"]) as env:
            try:
                keys = [o["key"] for o in env.sim("GET", "/apisim/state?resource=pods")["items"]]
                paths = ["/api/v1/namespaces/%s/pods/%s" % tuple(k.split("/")) for k in keys]
                self.assertEqual(len(paths), 200)
                direct = {p: http_request(env.apisim.port, "GET", p) for p in paths}

                def fetch(p):
                    return p, http_request(env.kwc.port, "GET", p, timeout=60)

                with concurrent.futures.ThreadPoolExecutor(200) as ex:
                    got = dict(ex.map(fetch, paths))
                for p in paths:
                    self.assertEqual(got[p][0], 200, p)
                    self.assertEqual(got[p][2], direct[p][2], p)
                # ...and the upstream saw them over a bounded number of connections
                st = env.stats()
                self.assertGreaterEqual(st["requests"].get("get pods", 0), 400)
            except Exception:
                env.dump_logs()
                raise


if __name__ == "__main__":
    unittest.main()
