"""kwc reaches an HTTPS upstream with the kubeconfig's CA, client certificate
and bearer token (apisim requires all three), for plain requests and for
upgrade tunnels; a wrong CA is refused with a clear Status. (In the TLS run
the client side is TLS too.)"""
import base64
import json
import os
import subprocess
import tempfile
import unittest

from cluster import KWC_BIN, Env, connect, http_request, kwc_proc, wait_for


def openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, capture_output=True)


def make_pki(d):
    """CA, a server cert for DNS apisim.test + IP 127.0.0.1, a client cert; and a second, unrelated CA."""
    for ca in ("ca", "otherca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca + ".key", "-out",
                ca + ".crt", "-days", "2", "-subj", "/CN=" + ca, cwd=d)
    with open(os.path.join(d, "san.cnf"), "w") as f:
        f.write("subjectAltName=DNS:apisim.test,IP:127.0.0.1\n")
    with open(os.path.join(d, "dnsonly.cnf"), "w") as f:
        f.write("subjectAltName=DNS:apisim.test\n")
    for name, cn, ext in (("server", "apisim", "san.cnf"), ("dnsonly", "apisim", "dnsonly.cnf"),
                          ("client", "kwc", None)):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key", "-out", name + ".csr",
                "-subj", "/CN=" + cn + ("/O=system:masters" if name == "client" else ""), cwd=d)
        args = ["x509", "-req", "-in", name + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", name + ".crt", "-days", "2"]
        if ext:
            args += ["-extfile", ext]
        openssl(*args, cwd=d)


def b64(path):
    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode()


def kubeconfig(d, server, ca="ca.crt", tls_server_name=None, token="sekret", cert=True):
    cluster = {"server": server, "certificate-authority-data": b64(os.path.join(d, ca))}
    if tls_server_name:
        cluster["tls-server-name"] = tls_server_name
    cfg = {
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "sim", "cluster": cluster}],
        "users": [{"name": "kwc", "user": dict(
            ({"client-certificate-data": b64(os.path.join(d, "client.crt")),
              "client-key-data": b64(os.path.join(d, "client.key"))} if cert else {}),
            **({"token": token} if token else {}))}],
        "contexts": [{"name": "test", "context": {"cluster": "sim", "user": "kwc"}}],
    }
    path = os.path.join(d, "kubeconfig-%d" % len(os.listdir(d)))
    with open(path, "w") as f:
        json.dump(cfg, f)  # JSON is YAML
    return path


class TlsTest(unittest.TestCase):
    def start_kwc(self, env, kc):
        # one data dir each: a data dir has one kwc at a time
        n = len(os.listdir(env.dir))
        p = kwc_proc("kwc-%d" % n, ["--kubeconfig", kc, "--listen", "127.0.0.1:0",
                                    "--data-dir", os.path.join(env.dir, "data-%d" % n)], env.dir)
        p.start()
        self.procs.append(p)
        return p

    def setUp(self):
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            self.assertEqual(p.stop(), 0, p.logs())

    def test_forward_token_refuses_a_certificate_identity(self):
        # kube authenticates a client certificate before a token: with kwc's
        # certificate on every request, a forwarded caller token would not count
        d = tempfile.mkdtemp(prefix="kwc-pki-")
        make_pki(d)
        kc = kubeconfig(d, "https://127.0.0.1:1", token=None)
        r = subprocess.run([KWC_BIN, "--kubeconfig", kc, "--data-dir", os.path.join(d, "data"), "--listen",
                            "127.0.0.1:0", "--auth", "delegated", "--passthrough-identity", "forward-token"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--passthrough-identity=forward-token needs kwc's upstream credentials to be a token",
                      r.stderr)

    def test_broken_client_credentials_refused_at_start(self):
        # a key that is not the certificate's, a certificate that is not PEM,
        # a CA that is not PEM: one clear error and exit 2 before any request
        d = tempfile.mkdtemp(prefix="kwc-pki-")
        make_pki(d)
        good = json.load(open(kubeconfig(d, "https://127.0.0.1:1")))

        def variant(**user):
            cfg = json.loads(json.dumps(good))
            for k, v in user.items():
                if k == "ca":
                    cfg["clusters"][0]["cluster"]["certificate-authority-data"] = v
                else:
                    cfg["users"][0]["user"][k] = v
            path = os.path.join(d, "kc-%d" % len(os.listdir(d)))
            with open(path, "w") as f:
                json.dump(cfg, f)
            return path

        junk = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n").decode()
        cases = [
            (variant(**{"client-key-data": b64(os.path.join(d, "server.key"))}),
             "the client key in KUBECONFIG does not match its client certificate (/CN=kwc/O=system:masters)"),
            (variant(**{"client-certificate-data": junk}), "the client certificate in KUBECONFIG is not a PEM certificate"),
            (variant(**{"client-key-data": junk}), "the client key in KUBECONFIG is not a PEM private key"),
            (variant(ca=junk), "the certificate-authority data in KUBECONFIG is not a PEM certificate"),
        ]
        for kc, want in cases:
            with self.subTest(want=want):
                r = subprocess.run([KWC_BIN, "--kubeconfig", kc, "--data-dir", os.path.join(d, "data"),
                                    "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=30)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(want, r.stderr)
                self.assertEqual(len(r.stderr.strip().split("\n")), 1, r.stderr)

    def test_tls_client_cert_and_token(self):
        d = tempfile.mkdtemp(prefix="kwc-pki-")
        make_pki(d)
        for server_cert, name in (("server", None), ("dnsonly", "apisim.test")):
            with self.subTest(cert=server_cert, tls_server_name=name):
                env = Env(apisim_args=["--nodes", "2", "--tls-cert", os.path.join(d, server_cert + ".crt"),
                                       "--tls-key", os.path.join(d, server_cert + ".key"),
                                       "--client-ca", os.path.join(d, "ca.crt"), "--token", "sekret"],
                          start_kwc=False)
                try:
                    server = "https://127.0.0.1:%d" % env.apisim.port
                    k = self.start_kwc(env, kubeconfig(d, server, tls_server_name=name))
                    st, _, b = http_request(k.port, "GET", "/api/v1/nodes")
                    self.assertEqual(st, 200, b[:300])
                    self.assertEqual(len(json.loads(b)["items"]), 2)
                    # upgrade tunnel over TLS
                    s = connect(k.port, timeout=10)
                    s.sendall(b"GET /apisim/echo-upgrade HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\n"
                              b"Upgrade: kwc-echo\r\n\r\n")
                    buf = b""
                    while b"\r\n\r\n" not in buf:
                        buf += s.recv(4096)
                    self.assertTrue(buf.startswith(b"HTTP/1.1 101"), buf)
                    rest = buf.split(b"\r\n\r\n", 1)[1]
                    s.sendall(b"ping over tls")
                    while len(rest) < 13:
                        rest += s.recv(4096)
                    self.assertEqual(rest, b"ping over tls")
                    s.close()
                    # apisim, like kube-apiserver, accepts a valid client certificate OR
                    # the token: each credential alone must work, so kwc sends each.
                    k2 = self.start_kwc(env, kubeconfig(d, server, tls_server_name=name, cert=False))
                    self.assertEqual(http_request(k2.port, "GET", "/api/v1/nodes")[0], 200)
                    k2 = self.start_kwc(env, kubeconfig(d, server, tls_server_name=name, token=None))
                    self.assertEqual(http_request(k2.port, "GET", "/api/v1/nodes")[0], 200)
                    # wrong token and no certificate: apisim says 401, kwc relays it
                    k2 = self.start_kwc(env, kubeconfig(d, server, tls_server_name=name, token="wrong",
                                                        cert=False))
                    self.assertEqual(http_request(k2.port, "GET", "/api/v1/nodes")[0], 401)
                    # wrong CA: kwc refuses the server and says so
                    k3 = self.start_kwc(env, kubeconfig(d, server, ca="otherca.crt", tls_server_name=name))
                    st, _, b = http_request(k3.port, "GET", "/api/v1/nodes")
                    self.assertEqual(st, 502, b)
                    self.assertIn("certificate", json.loads(b)["message"].lower())
                except Exception:
                    env.dump_logs()
                    for p in self.procs:
                        print(p.logs())
                    raise
                finally:
                    for p in self.procs:
                        p.stop()
                    self.procs = []
                    env.close()


if __name__ == "__main__":
    unittest.main()
