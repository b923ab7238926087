"""The front end facing hostile or unusual HTTP/1.1 input: every case answers
with the right status and a Kubernetes Status body (or closes the
connection), never a crash, a hang or a silently changed request.

What is checked (one class per set of kwc flags):
  - long request targets (4,093-8,192 bytes, 12 KB, 100 KB) reach kwc intact,
    for cached lists, passed-through lists, a deletecollection and kubectl;
  - --max-header-bytes: a target over it is a 414, a header over it a 431,
    each a Status, then the connection closes (default 1 MiB);
  - RFC 9112 framing: Transfer-Encoding with Content-Length, two
    Content-Lengths, NUL/CTL/space in the target, no Host: 400, closed, and
    nothing reaches the upstream;
  - pipelined requests answered in order; HTTP/1.0 with and without
    keep-alive; Expect: 100-continue;
  - --request-header-timeout (slowloris), --idle-timeout (watches exempt),
    --max-connections (a fast 429/503, never a hang);
  - --listen localhost binds loopback only; the Host check (DNS rebinding)
    and --accept-hosts; identity headers never reach the upstream.
  - HTTP/2 with prior knowledge, a client that opens 40 streams of large
    lists and never opens their windows: kwc_http2_queued_bytes stays at the
    connection's bound (4 x the larger of --max-list-buffer and
    --watch-budget), and a stream whose window opens completes.

Timeouts on sockets are upper bounds only: nothing here waits a fixed time.
"""
import json
import os
import re
import select
import socket
import struct
import unittest
import uuid
from urllib.parse import quote

from cluster import EnvTestCase, Env, http_request, kubectl, only_in_plaintext_run, wait_for
from scrape import scrape, value
from watchstream import Stream, pump

POD_PATH = "/api/v1/namespaces/default/pods"
CM_PATH = "/api/v1/namespaces/default/configmaps"
# Headers a caller could use to claim an identity upstream: kube's
# Authorization, impersonation (Impersonate-*) and the front-proxy
# request-header authenticator (X-Remote-User/-Group/-Extra-*).
IDENTITY_HEADERS = [("Authorization", "Bearer x"), ("Impersonate-User", "admin"),
                    ("Impersonate-Group", "system:masters"), ("Impersonate-Uid", "u-1"),
                    ("Impersonate-Extra-Scopes", "all"), ("X-Remote-User", "admin"),
                    ("X-Remote-Group", "g"), ("X-Remote-Extra-Scopes", "all")]


def raw(port, data, timeout=10.0):
    """Send bytes on a fresh connection, read until the server closes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
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


def head(port, method, target, headers=(), version="HTTP/1.1", host=True):
    """A request head as bytes; target may be bytes (for bytes no client would
    send). Host is the one a client of 127.0.0.1:port sends."""
    if isinstance(target, str):
        target = target.encode()
    lines = [b"%s %s %s" % (method.encode(), target, version.encode())]
    if host:
        lines.append(b"Host: 127.0.0.1:%d" % port)
    for k, v in headers:
        lines.append(b"%s: %s" % (k.encode(), v if isinstance(v, bytes) else v.encode()))
    return b"\r\n".join(lines) + b"\r\n\r\n"


class Resp:
    def __init__(self, version, status, headers, body):
        self.version, self.status, self.headers, self.body = version, status, headers, body

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return "<%s %d %r %r>" % (self.version, self.status, self.headers, self.body[:300])


class Client:
    """One raw HTTP/1.x connection that reads responses itself (pipelining,
    interim 1xx, close-delimited bodies), so a test sees exactly what kwc
    sent and when it closed."""

    def __init__(self, port, timeout=10.0, addr="127.0.0.1"):
        self.port = port
        self.s = socket.create_connection((addr, port), timeout=timeout)
        self.buf = b""
        self.eof = False

    def send(self, data):
        self.s.sendall(data)

    def send_until_answered(self, data, piece=65536):
        """Send data unless the server answers or closes first (as a server
        refusing an oversized head does). Returns the bytes sent."""
        off = 0
        while off < len(data):
            r, _, _ = select.select([self.s], [], [], 0)
            if r:
                break
            try:
                off += self.s.send(data[off:off + piece])
            except (BrokenPipeError, ConnectionResetError):
                break
        return off

    def _more(self):
        if self.eof:
            raise EOFError("kwc closed the connection")
        try:
            d = self.s.recv(65536)
        except ConnectionResetError:
            d = b""
        if not d:
            self.eof = True
            raise EOFError("kwc closed the connection")
        self.buf += d

    def _line(self):
        while b"\r\n" not in self.buf:
            self._more()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _take(self, n):
        while len(self.buf) < n:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_response(self, method="GET"):
        """The next response (an interim 1xx one too) with its body de-framed."""
        first = self._line()
        m = re.match(rb"^(HTTP/1\.[01]) (\d{3})(?: .*)?$", first)
        if not m:
            raise AssertionError("not a status line: %r" % (first + self.buf)[:300])
        version, status = m.group(1).decode(), int(m.group(2))
        headers = {}
        while True:
            line = self._line()
            if not line:
                break
            k, _, v = line.partition(b":")
            k = k.strip().lower().decode("latin-1")
            v = v.strip().decode("latin-1")
            headers[k] = headers[k] + ", " + v if k in headers else v
        if status < 200 or status in (204, 304) or method == "HEAD":
            return Resp(version, status, headers, b"")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = b""
            while True:
                n = int(self._line().split(b";")[0], 16)
                if n == 0:
                    while self._line():  # trailers
                        pass
                    break
                body += self._take(n)
                if self._take(2) != b"\r\n":
                    raise AssertionError("bad chunk framing")
            return Resp(version, status, headers, body)
        if "content-length" in headers:
            return Resp(version, status, headers, self._take(int(headers["content-length"])))
        while not self.eof:  # close-delimited
            try:
                self._more()
            except EOFError:
                pass
        body, self.buf = self.buf, b""
        return Resp(version, status, headers, body)

    def request(self, method, target, headers=(), body=b"", version="HTTP/1.1"):
        h = list(headers)
        if body:
            h.append(("Content-Length", str(len(body))))
        self.send(head(self.port, method, target, h, version) + body)
        return self.read_response(method)

    def assert_closed_by_server(self, allow=None):
        """Read until kwc closes (EOF or reset); the socket timeout bounds the
        wait. Returns what came before the close; anything but b"" (or a
        response whose status line matches allow) is an error."""
        try:
            while True:
                self._more()
        except EOFError:
            pass
        except socket.timeout:
            raise AssertionError("kwc kept the connection open (%.0fs); unread: %r"
                                 % (self.s.gettimeout(), self.buf[:200]))
        left, self.buf = self.buf, b""
        if left and not (allow and re.match(allow, left)):
            raise AssertionError("unexpected bytes before the close: %r" % left[:300])
        return left

    def close(self):
        self.s.close()


def long_selector_target(prefix, size, keep="app-7"):
    """prefix + the URL-encoded label selector `app notin (x0,x1,...,keep),tier!=cache`,
    exactly size bytes long. The selecting part is at the end: a target cut
    short (or with a byte slipped into its tail) selects something else, or
    fails to parse."""
    start = quote("app notin (", safe="")
    end = quote(keep + "),tier!=cache", safe="")
    sep = quote(",", safe="")
    n = len(prefix) + len(start) + len(end)
    vals = []
    while n + len("x%d" % len(vals)) + len(sep) <= size:
        vals.append("x%d" % len(vals))
        n += len(vals[-1]) + len(sep)
    need, i = size - n, 0
    while need > 0:  # label values stay under 63 characters
        add = min(need, 50)
        vals[i] += "z" * add
        need -= add
        i += 1
    target = prefix + start + "".join(v + sep for v in vals) + end
    assert len(target) == size, (len(target), size)
    return target


def item_names(body):
    return [(i["metadata"].get("namespace"), i["metadata"]["name"]) for i in json.loads(body)["items"]]


def upstream_saw(env, m):
    """The requests apisim received carrying the X-Kwc-Test: marker header."""
    seen = env.sim("GET", "/apisim/requests")["requests"]
    return [r for r in seen if r["headers"].get("x-kwc-test") == m]


def marker():
    return uuid.uuid4().hex


def listening(pid):
    """(address, port) of every TCP socket pid listens on, from /proc/net/tcp{,6}."""
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out = []
    for path, fam in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        with open(path) as f:
            for line in f.read().splitlines()[1:]:
                p = line.split()
                if p[3] != "0A" or p[9] not in inodes:  # 0A: LISTEN
                    continue
                a, port = p[1].split(":")
                raw_addr = b"".join(bytes.fromhex(a[i:i + 8])[::-1] for i in range(0, len(a), 8))
                out.append((socket.inet_ntop(fam, raw_addr), int(port, 16)))
    return out


@only_in_plaintext_run("raw-socket HTTP/1.1 matrix (plaintext Host rule, 429 bytes before a "
                       "handshake); the same parser serves TLS, and 14_tls covers TLS itself")
class FrontCase(EnvTestCase):
    """Shared assertions."""

    def alive(self):
        st, _, body = http_request(self.env.kwc.port, "GET", "/healthz", timeout=10)
        self.assertEqual((st, body), (200, b"ok"))

    def assertStatusBody(self, resp, code):
        self.assertEqual(resp.status, code, resp)
        try:
            s = json.loads(resp.body)
        except ValueError:
            self.fail("not a Status: %r" % resp)
        self.assertEqual((s.get("kind"), s.get("apiVersion"), s.get("status"), s.get("code")),
                         ("Status", "v1", "Failure", code), s)
        self.assertTrue(resp.headers.get("content-type", "").startswith("application/json"), resp)
        return s


class HostileInputTest(FrontCase):
    apisim_args = ["--pods", "20", "--nodes", "2"]

    def test_request_line_without_version(self):
        out = raw(self.env.kwc.port, b"GET /\r\n\r\n")
        self.assertRegex(out[:12], rb"^HTTP/1\.[01] 400", out[:200])
        self.alive()

    # -- RFC 9112 framing ----------------------------------------------------

    def test_rfc9112_violations_are_400_and_never_forwarded(self):
        port = self.env.kwc.port
        before = self.env.stats()["requests"]
        for case, build in [
            ("te+cl", lambda t, b, h: head(port, "POST", t, h + [
                ("Transfer-Encoding", "chunked"), ("Content-Length", str(len(b) + 10))])
                + b"%x\r\n%s\r\n0\r\n\r\n" % (len(b), b)),
            ("cl+cl", lambda t, b, h: head(port, "POST", t, h + [
                ("Content-Length", str(len(b))), ("Content-Length", str(len(b) + 5))]) + b + b" " * 5),
            ("nul", lambda t, b, h: head(port, "POST", t + b"?a=\x00", h + [("Content-Length", str(len(b)))]) + b),
            ("ctl-01", lambda t, b, h: head(port, "POST", t + b"?a=\x01", h + [("Content-Length", str(len(b)))]) + b),
            ("del-7f", lambda t, b, h: head(port, "POST", t + b"?a=\x7f", h + [("Content-Length", str(len(b)))]) + b),
            ("space", lambda t, b, h: head(port, "POST", t + b"?a=b c", h + [("Content-Length", str(len(b)))]) + b),
            ("no-host", lambda t, b, h: head(port, "POST", t, h + [("Content-Length", str(len(b)))], host=False) + b),
        ]:
            with self.subTest(case=case):
                m = marker()
                name = "smuggle-" + case.replace("+", "-")
                body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}).encode()
                c = Client(port)
                try:
                    c.send(build(CM_PATH.encode(), body, [("Content-Type", "application/json"),
                                                          ("X-Kwc-Test", m)]))
                    r = c.read_response()
                    self.assertEqual((r.version, r.status), ("HTTP/1.1", 400), r)
                    c.assert_closed_by_server()
                finally:
                    c.close()
                self.assertEqual(upstream_saw(self.env, m), [])
                st, _, _ = http_request(self.env.apisim.port, "GET", CM_PATH + "/" + name)
                self.assertEqual(st, 404, "%s was created upstream" % name)
                self.alive()
        after = self.env.stats()["requests"]
        for k in set(before) | set(after):
            if k.startswith("http ") or k == "create configmaps":
                self.assertEqual(before.get(k), after.get(k), "apisim got a request: %s" % k)

    # -- the default --max-header-bytes (1 MiB) --------------------------------

    def test_default_header_limit_is_one_mebibyte(self):
        port = self.env.kwc.port
        c = Client(port)
        try:
            r = c.request("GET", "/healthz", [("X-Pad", "a" * 900000)])
            self.assertEqual((r.status, r.body), (200, b"ok"), r)
        finally:
            c.close()
        c = Client(port, timeout=30)
        try:
            c.send_until_answered(head(port, "GET", "/healthz", [("X-Pad", "a" * 1100000)]))
            self.assertStatusBody(c.read_response(), 431)
            c.assert_closed_by_server()
        finally:
            c.close()
        self.alive()

    # -- the Host check (DNS rebinding) ------------------------------------------

    def test_foreign_host_is_refused(self):
        port = self.env.kwc.port
        for target in [POD_PATH + "/pod-1", "/api/v1/secrets?resourceVersion=0", POD_PATH + "?resourceVersion=0"]:
            for host in ["evil.example.com", "evil.example.com:%d" % port, "localhost.evil.example.com:%d" % port]:
                with self.subTest(target=target, host=host):
                    m = marker()
                    c = Client(port)
                    try:
                        c.send(head(port, "GET", target, [("Host", host), ("X-Kwc-Test", m)], host=False))
                        self.assertStatusBody(c.read_response(), 403)
                    finally:
                        c.close()
                    self.assertEqual(upstream_saw(self.env, m), [])
        self.alive()

    def test_loopback_hosts_are_served(self):
        port = self.env.kwc.port
        st, _, direct = http_request(self.env.apisim.port, "GET", POD_PATH + "/pod-1")
        self.assertEqual(st, 200)
        for host in ["localhost:%d" % port, "127.0.0.1:%d" % port, "[::1]:%d" % port]:
            with self.subTest(host=host):
                c = Client(port)
                try:
                    c.send(head(port, "GET", POD_PATH + "/pod-1", [("Host", host)], host=False))
                    r = c.read_response()
                    self.assertEqual((r.status, r.body), (200, direct), r)
                finally:
                    c.close()

    # -- identity headers ------------------------------------------------------

    def assertNoIdentity(self, m):
        seen = upstream_saw(self.env, m)
        self.assertEqual(len(seen), 1, seen)
        got = {k for k in seen[0]["headers"]}
        for k, _ in IDENTITY_HEADERS:
            self.assertNotIn(k.lower(), got, "%s reached the upstream" % k)

    def test_identity_headers_do_not_reach_the_upstream(self):
        m = marker()
        st, _, b = http_request(self.env.kwc.port, "GET", POD_PATH + "/pod-1",
                                headers=dict(IDENTITY_HEADERS + [("X-Kwc-Test", m)]))
        self.assertEqual(st, 200, b)
        self.assertNoIdentity(m)
        m = marker()
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "identity-post"}}
        st, _, b = http_request(self.env.kwc.port, "POST", CM_PATH, body=cm,
                                headers=dict(IDENTITY_HEADERS + [("X-Kwc-Test", m)]))
        self.assertEqual(st, 201, b)
        self.assertNoIdentity(m)

    def test_identity_headers_do_not_reach_the_upstream_on_upgrade(self):
        port, m = self.env.kwc.port, marker()
        c = Client(port)
        try:
            c.send(head(port, "POST", POD_PATH + "/pod-0/exec?command=true&stdout=true", [
                ("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1"),
                ("X-Stream-Protocol-Version", "v4.channel.k8s.io"), ("X-Kwc-Test", m)] + IDENTITY_HEADERS))
            r = c.read_response()
            self.assertEqual(r.status, 101, r)
        finally:
            c.close()
        self.assertNoIdentity(m)


class LongTargetTest(FrontCase):
    """libevhtp cut targets of 4,093-8,192 bytes at 4,092 (or slipped a byte in)
    and reset longer ones: every length must arrive whole."""
    apisim_args = ["--pods", "60", "--nodes", "2"]
    SIZES = [2048, 4092, 4093, 4096, 4097, 6000, 8191, 8192, 8193, 12 * 1024, 100 * 1024]

    def test_long_selector_lists_equal_direct(self):
        for size in self.SIZES:
            for rv in ("0", None):
                with self.subTest(size=size, rv=rv):
                    prefix = POD_PATH + "?" + ("resourceVersion=0&" if rv else "") + "labelSelector="
                    target = long_selector_target(prefix, size)
                    ds, _, db = http_request(self.env.apisim.port, "GET", target)
                    self.assertEqual(ds, 200, db[:300])
                    want = item_names(db)
                    self.assertTrue(0 < len(want) < 60, len(want))  # the selector selects
                    ks, _, kb = http_request(self.env.kwc.port, "GET", target)
                    self.assertEqual(ks, 200, kb[:300])
                    if rv is None:  # passed through: the upstream's own bytes
                        self.assertEqual(kb, db)
                    else:  # from kwc's cache
                        self.assertEqual(item_names(kb), want)

    def test_long_selector_deletecollection_deletes_exactly_the_selection(self):
        ns = "dc"
        for i in range(10):
            self.env.sim("POST", "/apisim/write", {"verb": "create", "resource": "configmaps", "namespace": ns,
                                                   "name": "dc-%d" % i, "labels": {"suite": "dc", "idx": str(i)}})
        for i in range(3):  # bystanders: only the last term keeps them
            self.env.sim("POST", "/apisim/write", {"verb": "create", "resource": "configmaps", "namespace": ns,
                                                   "name": "other-%d" % i, "labels": {"idx": str(i)}})
        terms = ["idx!=f%d" % i for i in range(298)] + ["idx!=7", "suite=dc"]
        target = "/api/v1/namespaces/%s/configmaps?labelSelector=%s" % (ns, quote(",".join(terms), safe=""))
        self.assertTrue(4093 <= len(target) <= 8192, len(target))
        st, _, b = http_request(self.env.apisim.port, "GET", target)
        self.assertEqual(st, 200, b[:300])
        selected = {n for _, n in item_names(b)}
        self.assertEqual(selected, {"dc-%d" % i for i in range(10) if i != 7})
        st, _, b = http_request(self.env.kwc.port, "DELETE", target)
        self.assertEqual(st, 200, b[:300])
        self.assertEqual({n for _, n in item_names(b)}, selected)
        left = {it["key"] for it in self.env.sim("GET", "/apisim/state?resource=configmaps&namespace=" + ns)["items"]}
        self.assertEqual(left, {ns + "/dc-7", ns + "/other-0", ns + "/other-1", ns + "/other-2"})

    def test_kubectl_long_selector(self):
        sel = "app notin (%s,app-7),tier!=cache" % ",".join("x%d" % i for i in range(2200))
        self.assertTrue(11500 <= len(sel) <= 13000, len(sel))
        args = ("get", "pods", "-n", "default", "-l", sel, "-o", "name")
        d = kubectl("kubectl", self.env.apisim.port, *args).stdout
        r = kubectl("kubectl", self.env.kwc.port, *args, check=False)  # (its command line is 12 KB)
        self.assertEqual(r.returncode, 0, r.stderr[-400:])
        k = r.stdout
        names = d.decode().split()
        self.assertTrue(0 < len(names) < 60 and "pod/pod-7" not in names, names)
        self.assertEqual(k, d)


class HeaderLimitTest(FrontCase):
    apisim_args = ["--pods", "5"]
    kwc_args = ["--max-header-bytes", "65536"]

    def refused(self, data, code):
        c = Client(self.env.kwc.port, timeout=30)
        try:
            c.send_until_answered(data)
            s = self.assertStatusBody(c.read_response(), code)
            c.assert_closed_by_server()
        finally:
            c.close()
        self.alive()
        return s

    def test_target_over_the_limit_is_a_414(self):
        port, m = self.env.kwc.port, marker()
        target = long_selector_target(POD_PATH + "?labelSelector=", 70000)
        self.refused(head(port, "GET", target, [("X-Kwc-Test", m)]), 414)
        self.assertEqual(upstream_saw(self.env, m), [])

    def test_header_over_the_limit_is_a_431(self):
        port = self.env.kwc.port
        self.refused(head(port, "GET", "/healthz", [("X-Pad", "a" * 70000)]), 431)
        self.refused(head(port, "GET", "/healthz", [("X-Pad-%d" % i, "a" * 30) for i in range(2000)]), 431)
        m = marker()
        self.refused(head(port, "GET", POD_PATH + "/pod-1", [("X-Kwc-Test", m), ("X-Pad", "a" * 70000)]), 431)
        self.assertEqual(upstream_saw(self.env, m), [])

    def test_head_under_the_limit_is_served(self):
        port = self.env.kwc.port
        c = Client(port)
        try:
            r = c.request("GET", "/healthz", [("X-Pad", "a" * 60000)])
            self.assertEqual((r.status, r.body), (200, b"ok"), r)
            target = long_selector_target(POD_PATH + "?labelSelector=", 60000)
            r = c.request("GET", target)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.body, http_request(self.env.apisim.port, "GET", target)[2])
        finally:
            c.close()


class ProtocolTest(FrontCase):
    apisim_args = ["--pods", "20", "--nodes", "2"]

    def mix(self):
        """(request bytes, check(resp)) for: /healthz, an rv=0 list from the
        cache, a GET passed through, a 404 passed through."""
        port = self.env.kwc.port
        cached = POD_PATH + "?resourceVersion=0&labelSelector=app%3Dapp-3"
        _, _, cached_body = http_request(port, "GET", cached)
        _, _, pod1 = http_request(self.env.apisim.port, "GET", POD_PATH + "/pod-1")
        self.assertEqual(len(item_names(cached_body)), 1)

        def ok(body):
            return lambda r: self.assertEqual((r.status, r.body), (200, body), r)

        def not_found(r):
            self.assertEqual(self.assertStatusBody(r, 404)["reason"], "NotFound")
        return [(head(port, "GET", "/healthz"), ok(b"ok")),
                (head(port, "GET", cached), ok(cached_body)),
                (head(port, "GET", POD_PATH + "/pod-1"), ok(pod1)),
                (head(port, "GET", POD_PATH + "/no-such-pod"), not_found)]

    def pipeline(self, reqs):
        c = Client(self.env.kwc.port, timeout=20)
        try:
            c.send(b"".join(r for r, _ in reqs))
            for i, (req, check) in enumerate(reqs):
                try:
                    r = c.read_response(req.split(b" ", 1)[0].decode())
                except (EOFError, socket.timeout) as e:
                    self.fail("response %d of %d (%r): %r" % (i + 1, len(reqs), req[:60], e))
                check(r)
            # still usable
            r = c.request("GET", "/healthz")
            self.assertEqual((r.status, r.body), (200, b"ok"))
        finally:
            c.close()

    def test_pipelined_3(self):
        m = self.mix()
        self.pipeline([m[1], m[3], m[2]])

    def test_pipelined_20(self):
        m = self.mix()
        self.pipeline([m[i % 4] for i in range(20)])

    def test_pipelined_requests_with_bodies(self):
        port = self.env.kwc.port
        cm = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "pipe-1"},
                         "data": {"k": "v"}}).encode()
        patch = b'{"data":{"k":"w"}}'
        path = CM_PATH + "/pipe-1"

        def status(code):
            return lambda r: self.assertEqual(r.status, code, r)
        self.pipeline([
            (head(port, "POST", CM_PATH, [("Content-Type", "application/json"),
                                          ("Content-Length", str(len(cm)))]) + cm, status(201)),
            (head(port, "PATCH", path, [("Content-Type", "application/merge-patch+json"),
                                        ("Content-Length", str(len(patch)))]) + patch,
             lambda r: self.assertEqual((r.status, json.loads(r.body)["data"]), (200, {"k": "w"}), r)),
            (head(port, "GET", path), lambda r: self.assertEqual(json.loads(r.body)["data"], {"k": "w"}, r)),
            (head(port, "DELETE", path), status(200)),
            (head(port, "GET", path), status(404)),
        ])

    def test_http10_without_keepalive_closes(self):
        port = self.env.kwc.port
        for (req, check) in self.mix():
            with self.subTest(request=req.split(b"\r\n")[0]):
                c = Client(port)
                try:
                    c.send(req.replace(b" HTTP/1.1\r\n", b" HTTP/1.0\r\n", 1))
                    r = c.read_response()
                    check(r)
                    self.assertNotIn("chunked", r.headers.get("transfer-encoding", ""))
                    c.assert_closed_by_server()
                finally:
                    c.close()

    def test_http10_keepalive(self):
        port = self.env.kwc.port
        _, _, pod1 = http_request(self.env.apisim.port, "GET", POD_PATH + "/pod-1")
        c = Client(port)
        try:
            for path, body in [("/healthz", b"ok"), (POD_PATH + "/pod-1", pod1), ("/healthz", b"ok")]:
                r = c.request("GET", path, [("Connection", "keep-alive")], version="HTTP/1.0")
                self.assertEqual((r.status, r.body), (200, body), r)
                # an HTTP/1.0 client keeps the connection only when told so
                self.assertIn("content-length", r.headers, r)
                self.assertEqual(r.headers.get("connection", "").lower(), "keep-alive", r)
        finally:
            c.close()

    def test_expect_100_continue(self):
        port = self.env.kwc.port
        body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "expect-1"},
                           "data": {"a": "1"}}).encode()
        c = Client(port)
        try:
            c.send(head(port, "POST", CM_PATH, [("Content-Type", "application/json"), ("Expect", "100-continue"),
                                                ("Content-Length", str(len(body)))]))
            r = c.read_response()  # the body is not sent before this arrives
            self.assertEqual((r.version, r.status), ("HTTP/1.1", 100), r)
            c.send(body)
            r = c.read_response("POST")
            self.assertEqual(r.status, 201, r)
        finally:
            c.close()
        st, _, b = http_request(self.env.apisim.port, "GET", CM_PATH + "/expect-1")
        self.assertEqual((st, json.loads(b)["data"]), (200, {"a": "1"}))


class TimeoutTest(FrontCase):
    apisim_args = ["--pods", "5"]
    kwc_args = ["--request-header-timeout", "1s", "--idle-timeout", "1s"]

    def test_slowloris_heads_are_closed(self):
        port = self.env.kwc.port
        slow = []
        try:
            for i in range(50):  # a partial request line, or a line and a header and no end
                c = Client(port, timeout=30)
                slow.append(c)
                try:
                    c.send(b"GET /api/v1/po" if i % 2 else b"GET / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % port)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # already closed (a very slow machine): what is asserted below
            st, _, b = http_request(port, "GET", POD_PATH + "/pod-1")  # meanwhile, served
            self.assertEqual(st, 200, b)
            for c in slow:  # a 408 before the close is fine too
                c.assert_closed_by_server(allow=rb"^HTTP/1\.1 408 ")
        finally:
            for c in slow:
                c.close()
        self.alive()

    def test_silent_connection_is_closed(self):
        c = Client(self.env.kwc.port, timeout=30)
        try:
            c.assert_closed_by_server(allow=rb"^HTTP/1\.1 408 ")
        finally:
            c.close()

    def test_idle_keepalive_closed_but_watch_kept(self):
        port = self.env.kwc.port
        w = Stream(port, "/api/v1/pods?watch=1&timeoutSeconds=30")
        try:
            pump([w], lambda: len(w.events) >= 5, 20, "the initial events")
            self.assertEqual(w.status, 200)
            for _ in range(2):  # two idle periods in a row, each after the watch went quiet
                c = Client(port, timeout=30)
                try:
                    r = c.request("GET", "/healthz")
                    self.assertEqual((r.status, r.body), (200, b"ok"))
                    c.assert_closed_by_server()
                finally:
                    c.close()
            self.env.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "name": "after-idle"})
            pump([w], lambda: w.closed or any(e["object"]["metadata"]["name"] == "after-idle" for e in w.events),
                 20, "the ADDED event")
            self.assertFalse(w.closed, "the watch was closed")
            ev = [e for e in w.events if e["object"]["metadata"]["name"] == "after-idle"]
            self.assertEqual(ev[0]["type"], "ADDED")
        finally:
            w.close()

    def test_request_in_progress_is_not_idle(self):
        m = marker()
        self.env.sim("POST", "/apisim/fail", {"count": 1, "match": m, "mode": "delay", "delay": 2.5})
        c = Client(self.env.kwc.port, timeout=30)
        try:
            r = c.request("GET", POD_PATH + "?labelSelector=x%3D" + m)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(json.loads(r.body)["items"], [])
        finally:
            c.close()
        self.assertEqual(self.env.stats()["requests"].get("injected delay"), 1)


class ConnectionCapTest(FrontCase):
    apisim_args = ["--pods", "5"]
    # every connection here comes from 127.0.0.1: the global cap alone
    # (the per-source one is 25_budgets' FairnessTest's)
    kwc_args = ["--max-connections", "20", "--max-connections-per-source", "0"]

    def open_served(self):
        """A connection kwc accepted and served (a connection it has not yet
        seen closing may still count against the cap: try again)."""
        def attempt():
            c = Client(self.env.kwc.port)
            try:
                r = c.request("GET", "/healthz")
                if r.status == 200:
                    return c
            except (EOFError, OSError):
                pass
            c.close()
            return None
        return wait_for(attempt, 20, "a connection under the cap")

    def test_cap(self):
        port = self.env.kwc.port
        held = []
        try:
            for _ in range(20):
                held.append(self.open_served())
            c = Client(port, timeout=10)
            try:
                try:
                    c.send(head(port, "GET", "/healthz"))
                except (BrokenPipeError, ConnectionResetError):
                    pass  # refused before reading: the answer is still there to read
                r = c.read_response()
                self.assertIn(r.status, (429, 503), r)
                self.assertStatusBody(r, r.status)
                c.assert_closed_by_server()
            finally:
                c.close()
            for c in held[:5]:
                c.close()
            held = held[5:]
            self.open_served().close()
            for c in held:  # the held ones were never disturbed
                r = c.request("GET", "/healthz")
                self.assertEqual((r.status, r.body), (200, b"ok"))
        finally:
            for c in held:
                c.close()


    def refused(self):
        port = self.env.kwc.port
        c = Client(port, timeout=10)
        try:
            try:
                c.send(head(port, "GET", "/healthz"))
            except (BrokenPipeError, ConnectionResetError):
                pass
            return c.read_response().status in (429, 503)
        except EOFError:
            return False
        finally:
            c.close()

    def test_watch_streams_count(self):
        # Watch streams leave the HTTP server for worker loops; their sockets
        # still count: 20 open watches fill the cap of 20.
        port = self.env.kwc.port
        watches = []
        try:
            for _ in range(20):
                c = Client(port, timeout=10)
                watches.append(c)
                c.send(head(port, "GET", "/api/v1/pods?watch=1&timeoutSeconds=120"))
                self.assertEqual(c._line().split(b" ")[1], b"200")
            self.assertTrue(self.refused(), "a 21st connection was served while 20 watches were open")
            watches.pop().close()
            self.open_served().close()  # a closed watch frees its place
        finally:
            for c in watches:
                c.close()


class LoopbackListenTest(FrontCase):
    apisim_args = ["--pods", "5"]

    @classmethod
    def setUpClass(cls):
        cls.env = Env(apisim_args=cls.apisim_args, start_kwc=False)
        try:
            cls.env.start_kwc(extra=["--listen", "localhost:0"])
        except Exception as e:
            where = listening(cls.env.kwc.pid()) if cls.env.kwc.p.poll() is None else "(exited)"
            cls.env.dump_logs()
            cls.env.close()
            raise AssertionError("kwc --listen localhost:0 is not served on 127.0.0.1 (listening on %s): %s"
                                 % (where, e))

    def test_binds_loopback_only(self):
        port = self.env.kwc.port
        socks = listening(self.env.kwc.pid())
        self.assertTrue(socks)
        for addr, p in socks:
            self.assertIn(addr, ("127.0.0.1", "::1"), socks)
            self.assertEqual(p, port, socks)
        for addr, _ in socks:  # each answers
            c = Client(port, addr=addr)
            try:
                r = c.request("GET", "/healthz")
                self.assertEqual((r.status, r.body), (200, b"ok"), (addr, r))
            finally:
                c.close()

    def test_log_says_where(self):
        port = self.env.kwc.port
        lines = [ln for ln in self.env.kwc.logs(tail=400).splitlines() if "serving on" in ln]
        self.assertTrue(lines, "no 'serving on' line")
        self.assertRegex(lines[0], r"(127\.0\.0\.1|\[::1\]):%d\b" % port)
        self.assertNotRegex(lines[0], r"0\.0\.0\.0|255\.255\.255\.255|\[::\]")


class AcceptHostsTest(FrontCase):
    apisim_args = ["--pods", "5"]
    kwc_args = ["--accept-hosts", r"^kwc\.example$"]

    def get(self, host, m=None):
        port = self.env.kwc.port
        c = Client(port)
        try:
            c.send(head(port, "GET", POD_PATH + "/pod-1", [("Host", host)] + ([("X-Kwc-Test", m)] if m else []),
                        host=False))
            return c.read_response()
        finally:
            c.close()

    def test_accept_hosts(self):
        port = self.env.kwc.port
        _, _, pod1 = http_request(self.env.apisim.port, "GET", POD_PATH + "/pod-1")
        for host in ["kwc.example:%d" % port, "kwc.example", "127.0.0.1:%d" % port]:
            with self.subTest(host=host):
                r = self.get(host)
                self.assertEqual((r.status, r.body), (200, pod1), r)
        for host in ["evil.example.com", "evil.example.com:%d" % port, "kwc.example.evil.com:%d" % port,
                     "xkwc.example:%d" % port]:
            with self.subTest(host=host):
                m = marker()
                self.assertStatusBody(self.get(host, m), 403)
                self.assertEqual(upstream_saw(self.env, m), [])


def h2_frame(ftype, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", sid) + payload


class H2Raw:
    """A raw HTTP/2 client (prior knowledge) that never opens a window
    unless told: enough to hold kwc's queues full."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.s.setblocking(False)
        self.buf = b""
        self.data = {}    # stream id -> DATA payload received
        self.ended = set()
        self.headers = set()
        self.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" +
                  h2_frame(4, 0, 0, struct.pack(">HI", 4, 0)))  # INITIAL_WINDOW_SIZE 0

    def send(self, b):
        self.s.setblocking(True)
        self.s.sendall(b)
        self.s.setblocking(False)

    @staticmethod
    def get(sid, path, authority):
        """A GET's HEADERS frame."""
        def lit(idx, v):  # a literal without indexing, the name indexed, no Huffman
            assert len(v) < 127
            return bytes([idx, len(v)]) + v.encode()
        block = b"\x82\x86" + lit(4, path) + lit(1, authority)  # GET, http
        return h2_frame(1, 0x5, sid, block)  # END_STREAM | END_HEADERS

    def window(self, sid, n):
        self.send(h2_frame(8, 0, sid, struct.pack(">I", n)))

    def pump(self):
        """Read what has arrived; True when the server closed."""
        while True:
            try:
                b = self.s.recv(1 << 16)
            except BlockingIOError:
                return False
            if not b:
                return True
            self.buf += b
            while len(self.buf) >= 9:
                n = int.from_bytes(self.buf[:3], "big")
                if len(self.buf) < 9 + n:
                    break
                t, fl, sid = self.buf[3], self.buf[4], int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
                payload, self.buf = self.buf[9:9 + n], self.buf[9 + n:]
                if t == 0:
                    self.data[sid] = self.data.get(sid, b"") + payload
                if t == 1:
                    self.headers.add(sid)
                if t in (0, 1) and fl & 1:
                    self.ended.add(sid)
                if t == 4 and not fl & 1:
                    self.send(h2_frame(4, 1, 0))  # SETTINGS ACK

    def close(self):
        self.s.close()


class Http2BoundTest(FrontCase):
    """The response bytes queued for one HTTP/2 connection are bounded
    across its streams: 4 x the larger of --max-list-buffer and
    --watch-budget (here 4 x 64 KiB), read from kwc_http2_queued_bytes."""
    apisim_args = ["--pods", "300"]
    kwc_args = ["--max-list-buffer", "65536", "--watch-budget", "65536"]
    BOUND = 4 * 65536
    NSTREAMS = 40

    def queued(self):
        return value(scrape(self.env.kwc.port), "kwc_http2_queued_bytes")

    def full(self):
        m = scrape(self.env.kwc.port)
        return (value(m, "kwc_http2_streams_open") == self.NSTREAMS and
                value(m, "kwc_http2_queued_bytes") >= self.BOUND - 65536)

    def test_streams_that_never_read_hold_the_bound_and_an_opened_one_completes(self):
        port = self.env.kwc.port
        st, _, whole = http_request(port, "GET", "/api/v1/pods?resourceVersion=0", timeout=30)
        self.assertEqual(st, 200)
        self.assertGreater(len(whole), 2 * self.BOUND)  # each list alone is over the bound
        c = H2Raw(port)
        try:
            c.send(b"".join(c.get(2 * i + 1, "/api/v1/pods?resourceVersion=0",
                                  "127.0.0.1:%d" % port) for i in range(self.NSTREAMS)))
            # every window is closed: kwc fills the connection to its bound
            wait_for(lambda: c.pump() or self.full(), 30,
                     "every stream open and kwc's queue for the connection full")
            self.assertFalse(c.pump(), "the connection stays open")
            for _ in range(5):
                c.pump()
                q = self.queued()
                # the bound, one list chunk (64 KiB) and an object past it
                self.assertLessEqual(q, self.BOUND + 2 * 65536)
            # one stream's window opens (and the connection's): it completes
            c.window(0, (1 << 31) - 1 - 65535)
            c.window(1, (1 << 31) - 1)
            wait_for(lambda: c.pump() or 1 in c.ended, 60, "the opened stream to complete")
            self.assertNotIn(3, c.ended)
            self.assertEqual(len(json.loads(c.data[1])["items"]), 300)
            self.assertLessEqual(self.queued(), self.BOUND + 2 * 65536)
        finally:
            c.close()
        wait_for(lambda: self.queued() == 0, 30, "the closed connection's queues to go")
        self.alive()


if __name__ == "__main__":
    unittest.main()
