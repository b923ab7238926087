"""HTTP Upgrade through kwc: raw byte tunnel both ways, and kubectl exec
(WebSocket, kubectl >= 1.30) against apisim's fake exec."""
import os
import socket
import unittest

from cluster import EnvTestCase, Env, kubectl, kubectl_dir, http_request


class UpgradeTest(EnvTestCase):
    apisim_args = ["--pods", "3", "--nodes", "1"]

    def test_raw_tunnel_echo_5mb(self):
        payload = os.urandom(5 * 1024 * 1024)
        s = socket.create_connection(("127.0.0.1", self.env.kwc.port), timeout=20)
        s.sendall(b"GET /apisim/echo-upgrade HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: kwc-echo\r\n\r\n")
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += s.recv(4096)
        self.assertTrue(buf.startswith(b"HTTP/1.1 101"), buf)
        got = bytearray(buf.split(b"\r\n\r\n", 1)[1])
        import threading
        t = threading.Thread(target=s.sendall, args=(payload,))
        t.start()
        while len(got) < len(payload):
            d = s.recv(1 << 20)
            if not d:
                break
            got += d
        t.join()
        s.close()
        self.assertEqual(bytes(got), payload)

    def test_kubectl_exec(self):
        pod = self.env.sim("GET", "/apisim/state?resource=pods")["items"][0]
        ns, name = pod["key"].split("/")
        for ver in ("1.30", "1.33"):
            b = os.path.join(kubectl_dir(), "kubectl." + ver)
            with self.subTest(kubectl=ver):
                r = kubectl(b, self.env.kwc.port, "exec", "-n", ns, name, "--", "echo", "hello", "kwc")
                self.assertEqual(r.stdout, b"hello kwc\n")
                r = kubectl(b, self.env.kwc.port, "exec", "-i", "-n", ns, name, "--", "cat",
                            input=b"from stdin\n")
                self.assertEqual(r.stdout, b"from stdin\n")


if __name__ == "__main__":
    unittest.main()
