"""Requests smuggled through a refused Upgrade (issue 19 item 2).

kwc tunnels an Upgrade request (Connection: upgrade + Upgrade) to the
upstream. If the upstream refuses it (any answer but 101) and kwc kept
copying raw bytes, the next request the client pipelined on that connection
would reach the upstream without kwc's authentication, authorization,
identity headers, header stripping or access log: on kwc's client
certificate it runs as kwc (which may impersonate anyone), on a token as
system:anonymous. apisim's /apisim/upgrade-answer lets the test choose the
upstream's answer (status, framing, body), and /apisim/requests shows what
reached the upstream.

Every case asserts what the client got, that the connection was closed after
a refused upgrade, and what the upstream saw: the request pipelined behind an
upgrade never reaches it, nor does anything sent behind an upgrade before the
upstream's 101 (except the upgrade request's own body).

  SmugglingTest      kwc in front of apisim (--auth none; TLS in the TLS run):
                     refused upgrades 200/403/404/500 x Content-Length /
                     chunked / close-delimited bodies, 101 with bytes on both
                     sides, a body on the upgrade request (Content-Length and
                     chunked), Upgrade: h2c, CONNECT, absolute-form targets
  UnreachableTest    the tunnel's own 503 when the upstream is gone: a Status
                     through kwc's response writer, connection closed
  DelegatedTest      kwc --auth=delegated (client-certificate upstream
                     identity) in front of apisim --policy: a caller refused
                     exec (403) pipelines a request with no credentials, or
                     with Impersonate-User: admin

Reads are "until the connection closes" under a generous deadline: no sleeps.
"""
import json
import os
import socket
import ssl
import tempfile
import time
import unittest
import uuid

import certs
from cluster import (ProcGroup, APISIM, KWC_BIN, KWC_EXTRA_ARGS, KWC_WRAP, PYTHON, ClientTLS, EnvTestCase, Proc, connect,
                     only_in_plaintext_run, wait_for)

DEADLINE = 30.0   # seconds for one exchange to end with the connection closed (loaded machine)


def read_until_closed(s, deadline=DEADLINE):
    """Every byte until the peer closes: (bytes, closed). closed False: the
    deadline passed with the connection still open."""
    end = time.monotonic() + deadline
    data = b""
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return data, False
        s.settimeout(left)
        try:
            d = s.recv(65536)
        except socket.timeout:
            return data, False
        except (ConnectionResetError, ssl.SSLError):
            return data, True
        if not d:
            return data, True
        data += d


def parse_responses(data):
    """The HTTP/1.1 responses in data, in order: [(status, headers, body)]
    (headers lower-cased; repeated ones joined with ", "). After a 101 the
    rest is the tunnel's: its body. An incomplete response is returned with
    what arrived and status as read."""
    out = []
    while data:
        i = data.find(b"\r\n\r\n")
        if i < 0:
            out.append((None, {}, data))
            break
        lines = data[:i].split(b"\r\n")
        data = data[i + 4:]
        status = int(lines[0].split(b" ")[1])
        h = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(b":")
            k = k.strip().lower().decode()
            v = v.strip().decode("latin-1")
            h[k] = h[k] + ", " + v if k in h else v
        if status == 101:
            out.append((status, h, data))
            break
        if "content-length" in h:
            n = int(h["content-length"])
            out.append((status, h, data[:n]))
            data = data[n:]
        elif "chunked" in h.get("transfer-encoding", ""):
            body = b""
            while True:
                j = data.find(b"\r\n")
                if j < 0:
                    out.append((status, h, None))   # cut short
                    return out
                n = int(data[:j].split(b";")[0], 16)
                if n == 0:
                    k = data.find(b"\r\n\r\n", j)
                    data = data[k + 4:] if k >= 0 else b""
                    break
                body += data[j + 2:j + 2 + n]
                data = data[j + 2 + n + 2:]
            out.append((status, h, body))
        elif status in (204, 304) or 100 <= status < 200:
            out.append((status, h, b""))
        else:
            out.append((status, h, data))   # close-delimited
            break
    return out


def marker():
    return uuid.uuid4().hex[:12]


def smuggled(m, extra=b""):
    """The request a client pipelines behind an upgrade request: no
    credentials, a target the test can find in apisim's log."""
    return (b"GET /api/v1/secrets?smuggled=%s HTTP/1.1\r\nHost: localhost\r\n%s\r\n" % (m.encode(), extra))


def upgrade_head(target, extra=b"", method=b"GET", upgrade=b"kwc-echo", connection=b"Upgrade"):
    return (b"%s %s HTTP/1.1\r\nHost: localhost\r\nConnection: %s\r\nUpgrade: %s\r\n%s\r\n"
            % (method, target, connection, upgrade, extra))


class SeenMixin:
    def seen(self, sim_port=None):
        return self.env.sim("GET", "/apisim/requests")["requests"]

    def assert_never_seen(self, m, seen=None):
        seen = self.seen() if seen is None else seen
        hits = [e for e in seen if m in e["target"]]
        self.assertEqual(hits, [], "the upstream saw requests carrying marker %s" % m)

    def seen_once(self, m, seen=None):
        seen = self.seen() if seen is None else seen
        hits = [e for e in seen if m in e["target"]]
        self.assertEqual(len(hits), 1, "the upstream saw %d requests carrying marker %s: %r" % (len(hits), m, hits))
        return hits[0]


class SmugglingTest(SeenMixin, EnvTestCase):
    apisim_args = ["--pods", "2"]

    def exchange(self, data):
        s = connect(self.env.kwc.port, timeout=DEADLINE)
        try:
            s.sendall(data)
            got, closed = read_until_closed(s)
        finally:
            s.close()
        return parse_responses(got), closed, got

    def check_refused(self, status, framing, body_text, resp, closed, raw, m):
        self.assertTrue(closed, "kwc left the connection open after a refused upgrade: %r" % raw[:600])
        self.assertEqual(len(resp), 1, "one answer, then the connection closes: %r" % raw[:800])
        st, h, body = resp[0]
        self.assertEqual(st, status, raw[:600])
        self.assertEqual(h.get("x-apisim-upgrade-answer"), str(status), h)
        self.assertEqual(body, body_text)
        self.assertIn("close", h.get("connection", "").lower(), h)
        self.assertNotIn("upgrade", h, h)
        seen = self.seen()
        up = self.seen_once("m=" + m, seen)
        self.assertEqual(up["headers"].get("upgrade"), "kwc-echo", up)
        self.assert_never_seen("smuggled=" + m, seen)

    def test_refused_upgrade_matrix(self):
        for status in (200, 403, 404, 500):
            for framing in ("length", "chunked", "close"):
                for behind in ("plain", "impersonate"):
                    with self.subTest(status=status, framing=framing, behind=behind):
                        m = marker()
                        text = "refused-%d-%s" % (status, framing)
                        target = ("/apisim/upgrade-answer?status=%d&framing=%s&body=%s&m=%s"
                                  % (status, framing, text, m)).encode()
                        extra = b"Impersonate-User: admin\r\nImpersonate-Group: system:masters\r\n" \
                            if behind == "impersonate" else b""
                        resp, closed, raw = self.exchange(upgrade_head(target) + smuggled(m, extra))
                        self.check_refused(status, framing, text.encode(), resp, closed, raw, m)

    def test_large_refusal_is_streamed(self):
        # a refusal body larger than kwc's queue bound (1 MiB) arrives whole
        for framing in ("length", "chunked", "close"):
            with self.subTest(framing=framing):
                m = marker()
                target = ("/apisim/upgrade-answer?status=500&framing=%s&body=0123456789abcdef&repeat=393216&m=%s"
                          % (framing, m)).encode()
                resp, closed, raw = self.exchange(upgrade_head(target) + smuggled(m))
                self.assertTrue(closed)
                self.assertEqual(len(resp), 1, raw[:800])
                self.assertEqual(resp[0][0], 500)
                self.assertEqual(resp[0][2], b"0123456789abcdef" * 393216)
                self.assert_never_seen("smuggled=" + m)

    def test_refused_upgrade_without_pipelined_request(self):
        m = marker()
        target = ("/apisim/upgrade-answer?status=403&body=no&m=%s" % m).encode()
        resp, closed, raw = self.exchange(upgrade_head(target))
        self.check_refused(403, "length", b"no", resp, closed, raw, m)

    def test_101_bytes_both_ways(self):
        # bytes behind the head reach the upstream after its 101, and bytes
        # the upstream sent right behind its 101 reach the client
        m = marker()
        target = ("/apisim/upgrade-answer?status=101&after=HELLO&m=%s" % m).encode()
        s = connect(self.env.kwc.port, timeout=DEADLINE)
        try:
            s.sendall(upgrade_head(target) + b"early bytes")
            got = b""
            end = time.monotonic() + DEADLINE
            while not got.endswith(b"early bytes") and time.monotonic() < end:
                d = s.recv(4096)
                if not d:
                    break
                got += d
            s.sendall(b" and more")
            while not got.endswith(b" and more") and time.monotonic() < end:
                d = s.recv(4096)
                if not d:
                    break
                got += d
        finally:
            s.close()
        self.assertTrue(got.startswith(b"HTTP/1.1 101 Switching Protocols\r\n"), got[:300])
        head, _, rest = got.partition(b"\r\n\r\n")
        self.assertIn(b"Upgrade: kwc-echo", head)
        self.assertEqual(rest, b"HELLOearly bytes and more")
        self.seen_once("m=" + m)

    def test_body_on_refused_upgrade(self):
        for te in ("length", "chunked"):
            with self.subTest(body=te):
                m = marker()
                target = ("/apisim/upgrade-answer?status=403&body=no&m=%s" % m).encode()
                if te == "length":
                    head = upgrade_head(target, b"Content-Length: 5\r\n", method=b"POST") + b"hello"
                else:
                    head = upgrade_head(target, b"Transfer-Encoding: chunked\r\n", method=b"POST") + \
                        b"2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n"
                resp, closed, raw = self.exchange(head + smuggled(m))
                self.check_refused(403, "length", b"no", resp, closed, raw, m)
                self.assertEqual(self.seen_once("m=" + m)["body"], "hello")

    def test_body_on_accepted_upgrade(self):
        # exactly the request's body goes before the 101; what follows it only after
        m = marker()
        target = ("/apisim/upgrade-answer?status=101&m=%s" % m).encode()
        s = connect(self.env.kwc.port, timeout=DEADLINE)
        try:
            s.sendall(upgrade_head(target, b"Content-Length: 5\r\n", method=b"POST") + b"hellotail")
            got = b""
            end = time.monotonic() + DEADLINE
            while not got.endswith(b"tail") and time.monotonic() < end:
                d = s.recv(4096)
                if not d:
                    break
                got += d
        finally:
            s.close()
        self.assertTrue(got.startswith(b"HTTP/1.1 101 "), got[:300])
        self.assertEqual(got.partition(b"\r\n\r\n")[2], b"tail")
        self.assertEqual(self.seen_once("m=" + m)["body"], "hello")

    def test_h2c_is_not_tunnelled(self):
        # kube-apiserver (Go's net/http without an h2c handler) serves an
        # h2c upgrade request as an ordinary request; kwc never tunnels it
        m = marker()
        target = ("/apisim/upgrade-answer?status=101&m=%s" % m).encode()
        preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        resp, closed, raw = self.exchange(
            upgrade_head(target, b"HTTP2-Settings: AAMAAABkAAQAAP__\r\n", upgrade=b"h2c",
                         connection=b"Upgrade, HTTP2-Settings") + preface)
        self.assertTrue(closed, raw[:600])
        self.assertNotIn(101, [r[0] for r in resp], raw[:600])
        self.assertTrue(resp and resp[0][0] == 400, raw[:600])   # apisim: "not an upgrade request"
        seen = self.seen()
        up = self.seen_once("m=" + m, seen)
        self.assertNotIn("upgrade", up["headers"], up)
        self.assertNotIn("http2-settings", up["headers"], up)
        self.assertEqual([e for e in seen if e["method"] == "PRI"], [])

    def test_connect_is_not_tunnelled(self):
        m = marker()
        cases = {
            "origin-form upgrade": upgrade_head(("/apisim/upgrade-answer?status=101&m=%s" % m).encode(),
                                                method=b"CONNECT") + b"early bytes",
            "origin-form": b"CONNECT /apisim/upgrade-answer?status=200&m=%s HTTP/1.1\r\nHost: localhost\r\n\r\n"
                           % m.encode() + smuggled(m),
            "authority-form": b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n"
                              % (self.env.apisim.port, self.env.apisim.port) + smuggled(m),
        }
        for name, data in cases.items():
            with self.subTest(case=name):
                resp, closed, raw = self.exchange(data)
                self.assertTrue(closed, raw[:600])
                self.assertEqual(len(resp), 1, raw[:800])
                self.assertIn(resp[0][0], (400, 405), raw[:600])
                self.assertEqual(json.loads(resp[0][2])["kind"], "Status")
        seen = self.seen()
        self.assert_never_seen(m, seen)
        self.assertEqual([e for e in seen if e["method"] == "CONNECT"], [])

    def test_absolute_form_is_not_tunnelled(self):
        m = marker()
        for status in (101, 403):
            with self.subTest(status=status):
                target = ("http://127.0.0.1:%d/apisim/upgrade-answer?status=%d&m=%s"
                          % (self.env.apisim.port, status, m)).encode()
                resp, closed, raw = self.exchange(upgrade_head(target) + smuggled(m))
                self.assertTrue(closed, raw[:600])
                self.assertEqual(len(resp), 1, raw[:800])
                self.assertEqual(resp[0][0], 400, raw[:600])
                self.assertEqual(json.loads(resp[0][2])["kind"], "Status")
        self.assert_never_seen(m)


class UnreachableTest(SeenMixin, EnvTestCase):
    apisim_args = ["--pods", "1"]

    def test_503_when_the_upstream_is_gone(self):
        self.env.apisim.stop()
        s = connect(self.env.kwc.port, timeout=DEADLINE)
        try:
            s.sendall(upgrade_head(b"/apisim/echo-upgrade") + smuggled(marker()))
            got, closed = read_until_closed(s)
        finally:
            s.close()
        resp = parse_responses(got)
        self.assertTrue(closed, got[:600])
        self.assertEqual(len(resp), 1, got[:800])
        st, h, body = resp[0]
        self.assertEqual(st, 503, got[:600])
        self.assertEqual(h.get("content-type"), "application/json")
        self.assertIn("close", h.get("connection", "").lower())
        self.assertIn("date", h)   # kwc's response writer, not a hand-written head
        d = json.loads(body)
        self.assertEqual((d["kind"], d["code"], d["reason"]), ("Status", 503, "ServiceUnavailable"))
        self.assertTrue(d["message"].startswith("the upstream API server is unavailable"), d)


P = certs.pki()
TOK = {n: "tok-%s-23smuggle" % n for n in ("admin", "carol")}


@only_in_plaintext_run("sets up TLS on both sides itself: a TLS run would repeat it")
class DelegatedTest(ProcGroup, unittest.TestCase):
    """apisim --policy over TLS, kwc --auth=delegated serving TLS and
    reaching apisim with a client certificate (CN=kwc): the identity that
    may impersonate anyone."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="kwc-smuggle-")
        cls.procs = []
        kwc_cert = P.issue("kwc-upstream", "/CN=kwc", P.client_ca)
        policy = {"tokens": {TOK["admin"]: {"user": "admin", "groups": ["system:masters"]},
                             TOK["carol"]: {"user": "carol"}},
                  "rules": [{"name": "kwc-cache", "users": ["kwc"], "verbs": ["get", "list", "watch"],
                             "apiGroups": [""], "resources": ["pods", "secrets"]},
                            {"name": "kwc-reviews", "users": ["kwc"], "verbs": ["create"],
                             "apiGroups": ["authentication.k8s.io", "authorization.k8s.io"],
                             "resources": ["tokenreviews", "subjectaccessreviews"]},
                            {"name": "kwc-impersonate", "users": ["kwc"], "verbs": ["impersonate"]}]}
        pf = os.path.join(cls.dir, "policy.json")
        with open(pf, "w") as f:
            json.dump(policy, f)
        kc = os.path.join(cls.dir, "kubeconfig")
        try:
            cls.apisim = Proc("apisim", [PYTHON, APISIM, "--listen", "127.0.0.1:0", "--pods", "1",
                                         "--tls-cert", P.server.crt, "--tls-key", P.server.key,
                                         "--client-ca", P.client_ca.crt, "--policy", pf],
                              cls.dir, tls=ClientTLS(P.ca.crt))
            cls.apisim.start()
            cls.procs.append(cls.apisim)
            with open(kc, "w") as f:
                json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "sim",
                           "clusters": [{"name": "sim", "cluster": {
                               "server": "https://127.0.0.1:%d" % cls.apisim.port,
                               "certificate-authority": P.ca.crt}}],
                           "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "kwc"}}],
                           "users": [{"name": "kwc", "user": {"client-certificate": kwc_cert.crt,
                                                              "client-key": kwc_cert.key}}]}, f)
            args = ["--kubeconfig", kc, "--listen", "127.0.0.1:0", "--data-dir", os.path.join(cls.dir, "data"),
                    "--resources", "v1/pods,v1/secrets", "--auth=delegated", "--anonymous-auth=false",
                    "--tls-cert-file", P.server.crt, "--tls-private-key-file", P.server.key,
                    "--client-ca-file", P.client_ca.crt]
            cls.kwc = Proc("kwc", KWC_WRAP + [KWC_BIN] + KWC_EXTRA_ARGS + args, cls.dir, tls=ClientTLS(P.ca.crt))
            cls.procs.append(cls.kwc)
            cls.kwc.start()
            wait_for(lambda: cls.request(cls.kwc.port, b"GET /readyz HTTP/1.1\r\nHost: localhost\r\n"
                                         b"Authorization: Bearer %s\r\nConnection: close\r\n\r\n"
                                         % TOK["admin"].encode())[0][0][0] == 200, 30, "kwc /readyz")
        except BaseException:
            cls.dump()
            cls.stop_all()
            raise

    @classmethod
    def request(cls, port, data, ctx_tls=True):
        ctx = ssl.create_default_context(cafile=P.ca.crt)
        s = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
        s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
        try:
            s.sendall(data)
            got, closed = read_until_closed(s)
        finally:
            s.close()
        return parse_responses(got), closed, got

    def seen(self):
        ctx = ssl.create_default_context(cafile=P.ca.crt)
        s = socket.create_connection(("127.0.0.1", self.apisim.port), timeout=DEADLINE)
        s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
        try:
            s.sendall(b"GET /apisim/requests HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            got, _ = read_until_closed(s)
        finally:
            s.close()
        return json.loads(parse_responses(got)[0][2])["requests"]

    def test_refused_exec_then_smuggled_request(self):
        exec_target = b"/api/v1/namespaces/default/pods/pod-0/exec?command=id&stdout=true"
        ws = (b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
              b"Sec-WebSocket-Protocol: v5.channel.k8s.io\r\n")
        behind = {"no credentials": b"",
                  "impersonating admin": b"Impersonate-User: admin\r\nImpersonate-Group: system:masters\r\n"}
        for name, extra in behind.items():
            with self.subTest(behind=name):
                m = marker()
                # POST (as kubectl's SPDY exec): kwc leaves it to the upstream to
                # authorize (a GET of pods/... is one kwc authorizes itself)
                head = upgrade_head(exec_target + b"&m=" + m.encode(),
                                    ws + b"Authorization: Bearer %s\r\n" % TOK["carol"].encode(),
                                    upgrade=b"websocket", method=b"POST")
                resp, closed, raw = self.request(self.kwc.port, head + smuggled(m, extra))
                self.assertTrue(closed, "kwc left the connection open after a refused upgrade: %r" % raw[:600])
                self.assertEqual(len(resp), 1, raw[:800])
                st, h, body = resp[0]
                self.assertEqual(st, 403, raw[:600])
                d = json.loads(body)
                self.assertEqual((d["kind"], d["reason"]), ("Status", "Forbidden"))
                self.assertIn('User "carol"', d["message"])
                seen = self.seen()
                up = [e for e in seen if "m=" + m in e["target"] and "exec" in e["target"]]
                self.assertEqual(len(up), 1, up)
                self.assertIn(["impersonate-user", "carol"], up[0]["impersonate"])
                self.assertFalse(up[0]["authorization"], up[0])   # carol's token stays with kwc
                self.assertEqual([e for e in seen if "smuggled=" + m in e["target"]], [],
                                 "the pipelined request reached the upstream")

    def test_unauthenticated_upgrade_never_reaches_the_upstream(self):
        m = marker()
        resp, closed, raw = self.request(
            self.kwc.port, upgrade_head(("/apisim/upgrade-answer?status=101&m=%s" % m).encode()) + smuggled(m))
        self.assertTrue(closed, raw[:600])
        self.assertEqual([r[0] for r in resp], [401], raw[:800])
        self.assertEqual([e for e in self.seen() if m in e["target"]], [])


sys_stderr = __import__("sys").stderr

if __name__ == "__main__":
    unittest.main()
