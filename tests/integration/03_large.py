"""Large bodies stream through kwc with bounded memory: a 10 MB request body,
and a >100 MB response whose client stops reading (kwc's own counters show
what it holds for it)."""
import hashlib
import json
import unittest

from cluster import EnvTestCase, connect, dechunk, http_request, wait_for
from scrape import has, scrape, total, value

MAX_RESPONSE_BUFFER = 1 << 20  # kwc's --max-response-buffer, set below
UPSTREAM_READ = 64 << 10       # the most one upstream read (curl's buffer) hands over


class LargeTest(EnvTestCase):
    # ~3.6 KiB pods: 30,000 of them list to > 100 MB.
    apisim_args = ["--pods", "30000", "--nodes", "50", "--pod-size", "3600"]
    kwc_args = ["--max-response-buffer", str(MAX_RESPONSE_BUFFER)]

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

    def test_100mb_response_bounded_buffer(self):
        # A quorum list (no resourceVersion) passes through to the upstream:
        # > 100 MB. Its client reads the head, then nothing: kwc queues at most
        # --max-response-buffer (+ the one upstream read that crossed it) for
        # it and stops reading the upstream (kwc_passthrough_client_paused),
        # instead of buffering the response; when the client reads, the rest
        # streams through unchanged.
        port = self.env.kwc.port
        m0 = scrape(port)
        self.assertTrue(has(m0, "kwc_passthrough_client_paused"), "kwc exports kwc_passthrough_client_paused")
        self.assertEqual(value(m0, "kwc_passthrough_client_paused"), 0)
        s = connect(port, timeout=120, rcvbuf=64 * 1024)
        s.sendall(b"GET /api/v1/pods HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            d = s.recv(4096)
            self.assertTrue(d, "closed before the head: %r" % head)
            head += d
        head, rest = head.split(b"\r\n\r\n", 1)
        self.assertIn(b" 200 ", head.split(b"\r\n")[0])

        def paused():
            m = scrape(port)
            return value(m, "kwc_passthrough_client_paused") == 1 and m
        # (the kernel's socket buffers take a few MB first; the client reads nothing)
        bound = MAX_RESPONSE_BUFFER + UPSTREAM_READ + 4096  # + chunk framing
        for what in ("paused", "still paused"):
            m = wait_for(paused, 120, "kwc to stop reading the upstream for a client that reads nothing")
            queued = value(m, "kwc_passthrough_buffered_bytes")
            print("\n    %s: kwc holds %d KiB for a client that reads nothing" % (what, queued // 1024))
            self.assertGreater(queued, MAX_RESPONSE_BUFFER, "paused before --max-response-buffer was queued")
            self.assertLessEqual(queued, bound, "kwc buffered the response")
            self.assertEqual(value(m, "kwc_passthrough_paused"), 0, "paused by the client, not the budget")
        raw = bytearray(rest)
        while True:
            chunk = s.recv(16 * 1024)
            if not chunk:
                break
            raw += chunk
        s.close()
        body = bytes(raw)
        if b"chunked" in head.lower():
            body = dechunk(body)
        self.assertGreater(len(body), 100 * 1024 * 1024)
        direct = http_request(self.env.apisim.port, "GET", "/api/v1/pods", timeout=120)[2]
        self.assertEqual(hashlib.sha256(body).hexdigest(), hashlib.sha256(direct).hexdigest())
        listed = lambda m: total(m, "kwc_requests_total", verb="LIST", resource="pods", code="200",
                                 source="upstream")

        def done():
            m = scrape(port)
            return listed(m) > listed(m0) and value(m, "kwc_passthrough_buffered_bytes") == 0 and m
        m = wait_for(done, 30, "the passthrough to be counted and to leave the budget")
        self.assertEqual(listed(m) - listed(m0), 1, "the list was passed through, once")
        self.assertEqual(value(m, "kwc_passthrough_client_paused"), 0)

if __name__ == "__main__":
    unittest.main()
