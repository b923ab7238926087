"""Large bodies stream through kwc with bounded memory: a 10 MB request body
and a >100 MB response, read slowly."""
import hashlib
import json
import unittest

from cluster import EnvTestCase, Env, connect, dechunk, http_request


class LargeTest(EnvTestCase):
    # ~3.6 KiB pods: 30,000 of them list to > 100 MB.
    apisim_args = ["--pods", "30000", "--nodes", "50", "--pod-size", "3600"]

    def test_10mb_request_body(self):
        blob = "x" * (10 * 1024 * 1024)
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"}, "data": {"blob": blob}}
        st, _, b = http_request(self.env.kwc.port, "POST", "/api/v1/namespaces/default/configmaps",
                                body=cm, timeout=120)
        self.assertEqual(st, 201, b[:300])
        st, _, b = http_request(self.env.apisim.port, "GET", "/api/v1/namespaces/default/configmaps/big",
                                timeout=120)
        self.assertEqual(len(json.loads(b)["data"]["blob"]), len(blob))
        http_request(self.env.kwc.port, "DELETE", "/api/v1/namespaces/default/configmaps/big")

    def read_slowly(self, port, path):
        """Read a response with a small receive buffer in small pieces."""
        s = connect(port, timeout=120, rcvbuf=64 * 1024)
        s.sendall(("GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n" % path).encode())
        h = hashlib.sha256()
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(4096)
        head, rest = head.split(b"\r\n\r\n", 1)
        raw = bytearray(rest)
        n = 0
        while True:
            chunk = s.recv(16 * 1024)
            if not chunk:
                break
            raw += chunk
            n += 1
        s.close()
        return head, bytes(raw)

    def test_100mb_response_bounded_rss(self):
        kwc = self.env.kwc
        rss_before = kwc.rss_kib()
        head, body = self.read_slowly(kwc.port, "/api/v1/pods")
        self.assertIn(b" 200 ", head.split(b"\r\n")[0])
        if b"chunked" in head.lower():
            body = dechunk(body)
        self.assertGreater(len(body), 100 * 1024 * 1024)
        direct = http_request(self.env.apisim.port, "GET", "/api/v1/pods", timeout=120)[2]
        self.assertEqual(hashlib.sha256(body).hexdigest(), hashlib.sha256(direct).hexdigest())
        peak = kwc.rss_kib("VmHWM")
        print("\n    kwc RSS before %d KiB, peak %d KiB for a %d MB response"
              % (rss_before, peak, len(body) >> 20))
        self.assertLess(peak - rss_before, 32 * 1024, "kwc buffered the response")


if __name__ == "__main__":
    unittest.main()
