"""kwc serving TLS, configured by each test itself (so this module is the same
in both runs and is left out of the TLS run):

- real clients through a kubeconfig whose server is https://, whose
  certificate-authority is the test CA and whose user is alice's client
  certificate (kubectl default, 1.27 and 1.33; Debian's python3-kubernetes
  list + watch with timeoutSeconds; npm @kubernetes/client-node list) answer
  what they answer against apisim over plain HTTP;
- ALPN: kwc's order (h2, http/1.1) wins, as in Go's server: a client offering
  both in either order gets h2; one offering http/1.1 alone (or no ALPN) gets
  HTTP/1.1 (26_http2.py speaks HTTP/2 over it);
- --tls-min-version VersionTLS13 refuses a TLS 1.2 client (the default, 1.2,
  takes it);
- --client-ca-file: a certificate from that CA or none is accepted, one from
  an unrelated CA fails the handshake;
- certificate reload: a new cert/key pair (renamed over the files) is taken
  up by new connections while a watch stream opened before it goes on; a pair
  whose key does not match is rejected (kwc logs it, naming the file), the old
  certificate stays, and a valid pair after it is taken up;
- start-up errors (missing file, mismatched key, bad --tls-min-version) exit 2
  with a message naming the file or flag.
"""
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import unittest

import certs
from cluster import KWC_BIN, KWC_EXTRA_ARGS, PYTHON, ClientTLS, Env, Fatal, Proc, Reader, dechunk, http_request, kubeconfig, kubectl_binaries, read_to_eof, wait_for
from watchstream import Stream, pump

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENTS = os.path.join(HERE, "clients")
P = certs.pki()


def serving(crt=None, key=None):
    # the transport under test; who may do what is 19_auth's (--auth delegated)
    return ["--tls-cert-file", crt or P.server.crt, "--tls-private-key-file", key or P.server.key,
            "--auth", "none"]


def context(cert=None, max_version=None, min_version=None, alpn=None):
    """A client context trusting the test CA; cert: a certs.Entity to present."""
    ctx = ssl.create_default_context(cafile=P.ca.crt)
    if cert:
        ctx.load_cert_chain(cert.crt, cert.key)
    if max_version:
        ctx.maximum_version = max_version
    if min_version:
        ctx.minimum_version = min_version
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


def tls_connect(port, ctx, timeout=10):
    """A TLS connection to 127.0.0.1:port, handshake done (ssl.SSLError if it fails)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        return ctx.wrap_socket(s, server_hostname="127.0.0.1")
    except BaseException:
        s.close()
        raise


def get(s, path):
    """One GET with Connection: close on a connected socket: (status, body bytes)."""
    s.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" % path).encode())
    head, _, body = read_to_eof(s).partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        body = dechunk(body)
    return int(head.split()[1]), body


def presented(port):
    """The DER certificate kwc presents to a new connection. A failed handshake
    is Fatal for wait_for: a reload must never break new connections."""
    try:
        s = tls_connect(port, context())
    except (ssl.SSLError, ConnectionError) as e:
        raise Fatal("a new TLS connection failed: %r" % e)
    try:
        return s.getpeercert(binary_form=True)
    finally:
        s.close()


def install(crt, key, cert_of, key_of=None):
    """Replace the files crt and key with cert_of's certificate and key_of's
    (default cert_of's) key: each written to a temp file and renamed over."""
    for src, dst in ((cert_of.crt, crt), ((key_of or cert_of).key, key)):
        tmp = dst + ".tmp"
        shutil.copyfile(src, tmp)
        os.rename(tmp, dst)


class TlsCase(unittest.TestCase):
    """One apisim per class; kwc processes started by the tests, each with its
    own data dir, stopped (exit status 0 required) at the end of each test."""
    only_in_plaintext_run = "sets kwc's TLS up itself: a TLS run would repeat it"
    apisim_args = ["--pods", "20", "--nodes", "2", "--namespaces", "2"]

    @classmethod
    def setUpClass(cls):
        cls.env = Env(apisim_args=cls.apisim_args, start_kwc=False)

    @classmethod
    def tearDownClass(cls):
        cls.env.close()

    def setUp(self):
        self.procs = []

    def tearDown(self):
        # (one that failed to start has failed its test already)
        codes = [(p, p.stop()) for p in self.procs if p.port is not None]
        bad = [(p.name, c) for p, c in codes if c != 0]
        if bad:
            self.dump()
            self.fail("kwc exit status %r" % bad)

    def dump(self):
        self.env.dump_logs()
        for p in self.procs:
            print("---- %s log (%s) ----\n%s" % (p.name, p.log_path, p.logs()))

    def run(self, result=None):
        before = len(result.failures) + len(result.errors) if result else 0
        r = super().run(result)
        if result and len(result.failures) + len(result.errors) > before:
            self.dump()
        return r

    def start(self, *flags, client=None):
        """kwc serving TLS with flags; ready (its /readyz over TLS says 200)."""
        name = "kwc-%d" % len(os.listdir(self.env.dir))
        p = Proc(name, [KWC_BIN] + KWC_EXTRA_ARGS + ["--upstream", "http://127.0.0.1:%d" % self.env.apisim.port,
                        "--listen", "127.0.0.1:0", "--data-dir", os.path.join(self.env.dir, "data-" + name)]
                 + list(flags), self.env.dir, tls=client or ClientTLS(P.ca.crt))
        self.procs.append(p)
        p.start()
        wait_for(lambda: http_request(p.port, "GET", "/readyz", timeout=5)[0] == 200, 30, name + " /readyz")
        return p


class TlsClientsTest(TlsCase):
    """Real clients, configured by a kubeconfig, through kwc on https. Their
    kubeconfig has alice's client certificate (kwc verifies it): kubectl needs
    a credential for an https server, else it prompts for a username."""

    def setUp(self):
        super().setUp()
        self.kwc = self.start(*serving(), "--client-ca-file", P.client_ca.crt,
                              client=ClientTLS(P.ca.crt, P.client.crt, P.client.key))
        self.dir = tempfile.mkdtemp(prefix="kwc-tls-clients-", dir=self.env.dir)

    def test_kubectl_kubeconfig(self):
        kc_tls = kubeconfig(self.kwc.port, self.dir)
        kc_sim = kubeconfig(self.env.apisim.port, self.dir)
        with open(kc_tls) as f:
            kc = json.load(f)
        cl = kc["clusters"][0]["cluster"]
        self.assertEqual((cl["server"], cl["certificate-authority"]),
                         ("https://127.0.0.1:%d" % self.kwc.port, P.ca.crt))
        self.assertEqual(kc["users"][0]["user"]["client-certificate"], P.client.crt)
        bins = kubectl_binaries()
        for ver in ("default", "1.27", "1.33"):
            b = bins[ver]

            def run(kc, *args):
                env = dict(os.environ, KUBECONFIG=kc, HOME=self.dir)
                r = subprocess.run([b, "--cache-dir", os.path.join(self.dir, "cache-%s-%s" % (ver, os.path.basename(kc)))]
                                   + list(args), capture_output=True, timeout=60, env=env)
                self.assertEqual(r.returncode, 0, "kubectl %s %s: %s" % (ver, " ".join(args), r.stderr.decode()))
                return r.stdout
            with self.subTest(kubectl=ver):
                for args in (("get", "pods", "-A", "-o", "json"), ("get", "nodes", "-o", "name"),
                             ("get", "--raw", "/api/v1/namespaces/ns-1/pods?limit=3")):
                    got, want = run(kc_tls, *args), run(kc_sim, *args)
                    self.assertEqual(got, want, "kubectl %s %s differs through kwc on https" % (ver, args))
                self.assertEqual(len(json.loads(run(kc_tls, "get", "pods", "-A", "-o", "json"))["items"]), 20)

    def test_python_kubernetes_list_and_watch(self):
        py = os.path.join(CLIENTS, "py_list_watch.py")
        until = "ns-0/py-tls"
        runs = {n: Reader([PYTHON, py, "--kubeconfig", kubeconfig(port, self.dir), "--until", until])
                for n, port in (("via", self.kwc.port), ("direct", self.env.apisim.port))}
        try:
            # both have listed (their watches start from the list's rv) before the write
            wait_for(lambda: all(r.lines for r in runs.values()), 60, "both clients to list")
            self.env.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "ns-0",
                                                   "name": "py-tls"})
            for n, r in runs.items():
                self.assertEqual(r.wait(60), 0, "%s: %s" % (n, r.stderr()))
        finally:
            for r in runs.values():
                r.stop()
        via, direct = [[json.loads(l) for l in runs[n].lines] for n in ("via", "direct")]
        self.assertEqual(len(via[0]["items"]), 20)
        self.assertEqual(via[0], direct[0], "the lists differ")
        self.assertEqual(via[1:-1], direct[1:-1], "the watch events differ")
        self.assertIn(("ADDED", until), [(e["type"], e["key"]) for e in via[1:-1]])
        self.assertGreaterEqual(via[-1]["streams"], 1)

    def test_client_node_list(self):
        js = os.path.join(CLIENTS, "list.mjs")
        out = {}
        for name, port in (("via", self.kwc.port), ("direct", self.env.apisim.port)):
            r = subprocess.run(["node", js, kubeconfig(port, self.dir)], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, "%s: %s" % (name, r.stderr[-3000:]))
            out[name] = json.loads(r.stdout)
        self.assertEqual(len(out["via"]["items"]), 20)
        self.assertEqual(out["via"], out["direct"])


class TlsHandshakeTest(TlsCase):
    """ALPN and protocol versions."""

    def test_alpn_prefers_h2(self):
        k = self.start(*serving())
        for offer in (["h2", "http/1.1"], ["http/1.1", "h2"]):
            s = tls_connect(k.port, context(alpn=offer))
            self.assertEqual(s.selected_alpn_protocol(), "h2", offer)
            s.close()
        s = tls_connect(k.port, context(alpn=["http/1.1"]))
        self.assertEqual(s.selected_alpn_protocol(), "http/1.1")
        self.assertEqual(get(s, "/healthz"), (200, b"ok"))
        s = tls_connect(k.port, context())
        self.assertIsNone(s.selected_alpn_protocol())
        self.assertEqual(get(s, "/healthz"), (200, b"ok"))

    def test_default_min_version_takes_tls12(self):
        k = self.start(*serving())
        s = tls_connect(k.port, context(max_version=ssl.TLSVersion.TLSv1_2))
        self.assertEqual(s.version(), "TLSv1.2")
        self.assertEqual(get(s, "/healthz"), (200, b"ok"))
        s = tls_connect(k.port, context())
        self.assertEqual(s.version(), "TLSv1.3")
        self.assertEqual(get(s, "/healthz"), (200, b"ok"))

    def test_min_version_tls13(self):
        k = self.start(*serving(), "--tls-min-version", "VersionTLS13")
        with self.assertRaises((ssl.SSLError, ConnectionResetError)):
            tls_connect(k.port, context(max_version=ssl.TLSVersion.TLSv1_2)).close()
        s = tls_connect(k.port, context(min_version=ssl.TLSVersion.TLSv1_3))
        self.assertEqual(s.version(), "TLSv1.3")
        st, body = get(s, "/api/v1/nodes")
        self.assertEqual(st, 200, body[:300])
        self.assertEqual(len(json.loads(body)["items"]), 2)


class TlsClientCertTest(TlsCase):
    """--client-ca-file: client certificates verified when presented."""

    def test_client_certificates(self):
        k = self.start(*serving(), "--client-ca-file", P.client_ca.crt)
        for who, cert in (("alice (client CA)", P.client), ("no certificate", None)):
            with self.subTest(client=who):
                st, body = get(tls_connect(k.port, context(cert=cert)), "/api/v1/nodes")
                self.assertEqual(st, 200, body[:300])
        with self.subTest(client="unrelated CA, TLS 1.2"):
            # TLS 1.2: the server's verdict comes inside the handshake
            with self.assertRaises((ssl.SSLError, ConnectionResetError)):
                tls_connect(k.port, context(cert=P.other_client, max_version=ssl.TLSVersion.TLSv1_2)).close()
        with self.subTest(client="unrelated CA, TLS 1.3"):
            # TLS 1.3: the client's side of the handshake ends before the server has
            # checked its certificate; the server's alert (or its close, or a reset
            # for the unread request) comes instead of an answer
            s = tls_connect(k.port, context(cert=P.other_client))
            try:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                got = s.recv(65536)
            except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
                got = b""
            finally:
                s.close()
            self.assertEqual(got, b"", "kwc answered a client whose certificate does not verify")
        self.assertEqual(http_request(k.port, "GET", "/healthz")[0], 200)


class TlsReloadTest(TlsCase):
    """Certificate files changing under a running kwc."""

    def files(self):
        d = tempfile.mkdtemp(prefix="tls-", dir=self.env.dir)
        crt, key = os.path.join(d, "tls.crt"), os.path.join(d, "tls.key")
        install(crt, key, P.server)
        return crt, key

    def test_reload_keeps_open_streams(self):
        crt, key = self.files()
        k = self.start(*serving(crt, key))
        s = Stream(k.port, "/api/v1/pods?watch=1&timeoutSeconds=60")
        try:
            pump([s], lambda: len(s.events) >= 20, 20, "the watch's initial events")
            self.assertEqual(s.status, 200)
            self.assertEqual(s.s.getpeercert(binary_form=True), P.server.der())
            install(crt, key, P.server2)
            new = P.server2.der()

            def taken_up():
                got = presented(k.port)
                if got not in (new, P.server.der()):
                    raise Fatal("kwc presents a certificate that is neither the old nor the new one")
                return got == new
            wait_for(taken_up, 30, "new connections to get the new certificate")
            # the stream opened with the old certificate goes on
            self.env.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "ns-1",
                                                   "name": "after-reload"})
            seen = lambda: any(ev["type"] == "ADDED" and ev["object"]["metadata"]["name"] == "after-reload"
                               for ev in s.events)
            pump([s], lambda: seen() or s.closed, 30, "the ADDED event on the old stream")
            self.assertTrue(seen(), "the watch opened before the reload was closed: %r" % s.lines[-3:])
            self.assertFalse(s.ended)
            self.assertEqual(http_request(k.port, "GET", "/healthz")[0], 200)
        finally:
            s.close()

    def test_mismatched_pair_keeps_old_certificate(self):
        crt, key = self.files()
        k = self.start(*serving(crt, key))
        old = P.server.der()
        self.assertEqual(presented(k.port), old)
        with open(k.log_path, "rb") as f:
            mark = len(f.read())
        install(crt, key, P.server2, key_of=P.server)  # server2's certificate, the old key

        def rejected():
            if presented(k.port) != old:
                raise Fatal("kwc stopped presenting the old certificate for a mismatched pair")
            if k.p.poll() is not None:
                raise Fatal("kwc exited with %s" % k.p.returncode)
            with open(k.log_path, "rb") as f:
                logged = f.read()[mark:]
            return crt.encode() in logged or key.encode() in logged
        wait_for(rejected, 30, "kwc to log that it rejected the mismatched pair (naming the file)")
        self.assertEqual(presented(k.port), old)
        self.assertEqual(http_request(k.port, "GET", "/healthz")[0], 200)
        # a valid pair after it is taken up
        install(crt, key, P.server2)
        new = P.server2.der()

        def taken_up():
            got = presented(k.port)
            if got not in (new, old):
                raise Fatal("kwc presents a certificate that is neither the old nor the new one")
            return got == new
        wait_for(taken_up, 30, "the valid pair to be taken up")
        self.assertEqual(http_request(k.port, "GET", "/healthz")[0], 200)


class TlsStartupErrorTest(unittest.TestCase):
    """Bad TLS configuration: kwc exits 2 at start with a message naming the
    file or flag."""
    only_in_plaintext_run = TlsCase.only_in_plaintext_run

    def test_bad_tls_config_exits_2(self):
        d = tempfile.mkdtemp(prefix="kwc-tls-bad-")
        base = ["--upstream", "http://127.0.0.1:1", "--data-dir", os.path.join(d, "data"), "--listen", "127.0.0.1:0"]
        missing = os.path.join(d, "missing.crt")
        cases = [
            (serving(crt=missing), missing),
            (serving(key=os.path.join(d, "missing.key")), os.path.join(d, "missing.key")),
            (serving(key=P.server2.key), (P.server2.key, P.server.crt)),   # the key is not the cert's
            (serving() + ["--tls-min-version", "VersionTLS9"], "--tls-min-version"),
        ]
        for flags, needles in cases:
            with self.subTest(flags=flags):
                r = subprocess.run([KWC_BIN] + base + flags, capture_output=True, timeout=20)
                self.assertEqual(r.returncode, 2, r.stderr)
                needles = needles if isinstance(needles, tuple) else (needles,)
                self.assertTrue(any(n.encode() in r.stderr for n in needles),
                                "stderr names none of %s: %r" % (needles, r.stderr))
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
