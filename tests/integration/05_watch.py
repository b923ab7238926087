"""A watch through kwc delivers each event as the upstream sends it (no
batching or added latency), and a client that disconnects mid-watch releases
the upstream stream."""
import http.client
import json
import socket
import time
import unittest

from cluster import EnvTestCase, Env, connect, http_request, wait_for


class WatchStream:
    """Reads newline-delimited watch events from a raw HTTP/1.1 chunked response."""

    def __init__(self, port, path):
        self.s = connect(port, timeout=20)
        self.s.sendall(("GET %s HTTP/1.1\r\nHost: localhost\r\n\r\n" % path).encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self.buf += self._recv()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        self.status = int(head.split()[1])
        self.raw = b""

    def _recv(self):
        d = self.s.recv(65536)
        if not d:
            raise EOFError("stream closed")
        return d

    def next_event(self):
        while True:
            # de-chunk whatever is buffered
            while True:
                i = self.buf.find(b"\r\n")
                if i < 0:
                    break
                n = int(self.buf[:i], 16)
                if len(self.buf) < i + 2 + n + 2:
                    break
                self.raw += self.buf[i + 2:i + 2 + n]
                self.buf = self.buf[i + 2 + n + 2:]
                if n == 0:
                    raise EOFError("end of stream")
            j = self.raw.find(b"\n")
            if j >= 0:
                line, self.raw = self.raw[:j], self.raw[j + 1:]
                return json.loads(line)
            self.buf += self._recv()

    def close(self):
        self.s.close()


class WatchTest(EnvTestCase):
    apisim_args = ["--nodes", "2"]
    # kwc's own reflector watches stay off configmaps, which these tests count
    kwc_args = ["--resources", "v1/nodes"]

    def write(self, verb, name, labels=None):
        return self.env.sim("POST", "/apisim/write", {"verb": verb, "resource": "configmaps",
                                                      "namespace": "w", "name": name,
                                                      "labels": labels or {}})["rv"]

    def test_each_event_delivered_as_sent(self):
        rv0 = self.write("create", "seed")
        w = WatchStream(self.env.kwc.port,
                        "/api/v1/namespaces/w/configmaps?watch=1&resourceVersion=%s" % rv0)
        self.assertEqual(w.status, 200)
        lat = []
        try:
            for i in range(20):
                t0 = time.monotonic()
                rv = self.write("create" if i % 2 == 0 else "update", "cm-%d" % (i // 2))
                ev = w.next_event()  # must arrive before the next write is made
                lat.append(time.monotonic() - t0)
                self.assertEqual(ev["object"]["metadata"]["resourceVersion"], str(rv))
                self.assertEqual(ev["type"], "ADDED" if i % 2 == 0 else "MODIFIED")
        finally:
            w.close()
        lat.sort()
        print("\n    write->event through kwc: p50 %.1f ms, max %.1f ms" % (lat[10] * 1e3, lat[-1] * 1e3))

    def test_disconnect_releases_upstream_watch(self):
        def open_watches():
            return self.env.stats()["open_watches"].get("configmaps", 0)
        base = open_watches()
        streams = [WatchStream(self.env.kwc.port, "/api/v1/namespaces/w/configmaps?watch=true")
                   for _ in range(10)]
        wait_for(lambda: open_watches() == base + 10, 30, "10 upstream watches")
        for s in streams:
            s.s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()  # RST mid-stream
        wait_for(lambda: open_watches() == base, 30, "kwc to close its upstream watches")
        # kwc is still healthy
        self.assertEqual(http_request(self.env.kwc.port, "GET", "/healthz")[0], 200)

    def test_timeout_seconds_ends_cleanly(self):
        w = WatchStream(self.env.kwc.port, "/api/v1/nodes?watch=true&timeoutSeconds=1")
        n = 0
        with self.assertRaisesRegex(EOFError, "end of stream"):
            while True:
                w.next_event()
                n += 1
        self.assertEqual(n, 2)  # the two nodes, then a clean terminal chunk
        w.close()


if __name__ == "__main__":
    unittest.main()
