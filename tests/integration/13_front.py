"""The front end facing hostile or unusual HTTP/1.1 input: every case answers
with the right status and a Kubernetes Status body (or closes the
connection), never a crash, a hang or a silently changed request."""
import json
import unittest

from cluster import EnvTestCase, connect, http_request


def raw(port, data, timeout=10.0):
    """Send bytes on a fresh connection, read until the server closes."""
    s = connect(port, timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        while True:
            try:
                d = s.recv(65536)
            except ConnectionResetError:
                break
            if not d:
                break
            out += d
        return out
    finally:
        s.close()


class HostileInputTest(EnvTestCase):
    apisim_args = ["--pods", "20", "--nodes", "2"]

    def alive(self):
        st, _, body = http_request(self.env.kwc.port, "GET", "/healthz", timeout=5)
        self.assertEqual((st, body), (200, b"ok"))

    def test_request_line_without_version(self):
        out = raw(self.env.kwc.port, b"GET /\r\n\r\n")
        self.assertRegex(out[:12], rb"^HTTP/1\.[01] 400", out[:200])
        self.alive()


if __name__ == "__main__":
    unittest.main()
