"""Budgets under a flood (issue 19): no denial of service for legitimate users.

  1. descriptors: kwc --auth delegated (TLS, client certificates) in front of
     apisim --policy --hang-token-prefix, run under `prlimit --nofile=1400`.
     700 clients present tokens whose TokenReviews never answer. kwc keeps
     them to its TokenReview pool (apisim sees at most
     --max-review-connections of them at once; the rest wait in kwc without
     a descriptor), its open descriptors stay within the budget, and while
     the flood holds, a client-certificate user and a token user (whose
     answers kwc has cached) get their answers. When the flood's clients
     leave, every review is cancelled (apisim sees each connection closed,
     nothing stays open) and a new token is reviewed at once.
     An explicit --max-connections the limit cannot hold is refused at start.
  2. memory: 300 clients that never read a large passthrough answer hold no
     more than --max-passthrough-buffer (with a margin per connection), not
     300 x --max-response-buffer; the accounting returns to zero when they go.
  3. a tunnel (Upgrade) counts twice against --max-connections: the
     client's socket and its own upstream socket.
  4. fairness under one address's flood (issue 29), plaintext and TLS, the
     flood from 127.0.0.2 and the legitimate callers from other loopback
     addresses: TokenReviews that hang upstream fill no more than the
     flood's share of the review pool (--max-reviews-per-source), the rest
     of its new tokens get 429 TooManyRequests at once, and a caller with a
     token kwc has never seen is reviewed and served long before
     --upstream-timeout; a review that hangs ends after --review-timeout
     (401 for a TokenReview, 500 for a SubjectAccessReview) and nothing is
     cached from it; a connection flood past --max-connections holds no
     more than --max-connections-per-source and another address connects
     and is served.

Every wait polls a condition with a deadline; every load loop is bounded in
count and time. The bounds compare with the configured caps, never with
timing.
"""
import http.client
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import unittest

import certs
from cluster import (ProcGroup, APISIM, KWC_BIN, KWC_EXTRA_ARGS, KWC_WRAP, PYTHON, TLS, ClientTLS, Env, Proc,
                     http_request, kwc_proc, wait_for)

P = certs.pki()
FD_LIMIT = 1400
FLOOD = 700          # more than the ~690 that exhausted 1400 descriptors before
HANG = "hang-"       # apisim --hang-token-prefix
TOK = {n: "tok-%s-25b" % n for n in ("kwc", "admin", "alice", "bob")}
PODS = "/api/v1/namespaces/default/pods?resourceVersion=0"


def policy_doc():
    return {"tokens": {TOK["kwc"]: {"user": "kwc"},
                       TOK["admin"]: {"user": "admin", "groups": ["system:masters"]},
                       TOK["alice"]: {"user": "alice"},
                       TOK["bob"]: {"user": "bob"}},
            "rules": [{"name": "kwc", "users": ["kwc"], "verbs": ["*"]},
                      {"name": "readers", "users": ["alice", "bob", "dave"], "verbs": ["get", "list", "watch"],
                       "apiGroups": [""], "resources": ["pods"], "namespaces": ["default"]}]}


def metrics_text(port, ctx, token):
    st, body = https(port, ctx, "GET", "/metrics", token=token, timeout=20)
    if st != 200:
        raise AssertionError("/metrics: %d %s" % (st, body[:200]))
    return body.decode()


def metric(text, name, **labels):
    """The value of one sample (labels matched exactly as given), or None."""
    want = ",".join('%s="%s"' % kv for kv in sorted(labels.items()))
    for line in text.splitlines():
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})? (\S+)$', line)
        if not m or m.group(1) != name:
            continue
        got = ",".join(sorted(x for x in (m.group(2) or "").split(",") if x))
        if got == want:
            return float(m.group(3))
    return None


def https(port, ctx, method, path, token=None, timeout=30):
    """One request on a fresh TLS connection: (status, body)."""
    import http.client
    c = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=ctx)
    try:
        h = {"Authorization": "Bearer " + token} if token else {}
        c.request(method, path, headers=h)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def open_fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def hanging_flood(port, ctx, n, deadline_s=120):
    """n TLS connections, each asking for pods with its own hanging token
    (never read). Returns the sockets."""
    socks = []
    end = time.monotonic() + deadline_s
    try:
        for i in range(n):
            if time.monotonic() > end:
                raise AssertionError("the flood took longer than %ds (%d of %d connected)" % (deadline_s, i, n))
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            t = ctx.wrap_socket(s, server_hostname="127.0.0.1")
            t.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s%d\r\n\r\n"
                       % (PODS, HANG, i)).encode())
            socks.append(t)
    except BaseException:
        close_all(socks)
        raise
    return socks


def unread_flood(port, n, path, deadline_s=120):
    """n plain connections asking for path, with a small receive buffer and
    never reading. Returns the sockets."""
    socks = []
    end = time.monotonic() + deadline_s
    try:
        for i in range(n):
            if time.monotonic() > end:
                raise AssertionError("the flood took longer than %ds (%d of %d connected)" % (deadline_s, i, n))
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(30)
            s.connect(("127.0.0.1", port))
            s.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % path).encode())
            socks.append(s)
    except BaseException:
        close_all(socks)
        raise
    return socks


def close_all(socks):
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


class FdBudgetTest(ProcGroup, unittest.TestCase):
    only_in_plaintext_run = "sets up TLS on both sides itself"

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="kwc-budget-")
        cls.procs = []
        cls.policy = os.path.join(cls.dir, "policy.json")
        with open(cls.policy, "w") as f:
            json.dump(policy_doc(), f)
        cls.dave = P.issue("dave", "/O=readers/CN=dave", P.client_ca)
        try:
            cls.apisim = Proc("apisim", [PYTHON, APISIM, "--listen", "127.0.0.1:0", "--nodes", "1", "--pods", "20",
                                         "--policy", cls.policy, "--anonymous-auth=false",
                                         "--hang-token-prefix", HANG], cls.dir)
            cls.apisim.start()
            cls.procs.append(cls.apisim)
            cls.kc = os.path.join(cls.dir, "kubeconfig")
            with open(cls.kc, "w") as f:
                json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "sim",
                           "clusters": [{"name": "sim", "cluster": {"server": "http://127.0.0.1:%d"
                                                                    % cls.apisim.port}}],
                           "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "kwc"}}],
                           "users": [{"name": "kwc", "user": {"token": TOK["kwc"]}}]}, f)
            cls.kwc = cls.start_kwc("kwc")
        except BaseException:
            cls.dump()
            cls.stop_all()
            raise
        cls.plain = ClientTLS(P.ca.crt).context()                               # tokens
        cls.cert = ClientTLS(P.ca.crt, cls.dave.crt, cls.dave.key).context()   # dave's certificate

    @classmethod
    def kwc_argv(cls, name, *flags):
        return (["prlimit", "--nofile=%d:%d" % (FD_LIMIT, FD_LIMIT), "--"] + KWC_WRAP + [KWC_BIN] + KWC_EXTRA_ARGS +
                ["--kubeconfig", cls.kc, "--listen", "127.0.0.1:0",
                 "--data-dir", os.path.join(cls.dir, "data-" + name), "--resources", "v1/pods",
                 "--serving-threads", "2", "--auth=delegated", "--anonymous-auth=false",
                 "--upstream-timeout", "10m",  # queued reviews wait for the flood to end
                 # the descriptor budget under one address's flood: the per-source
                 # shares and the review deadline (FairnessTest's) would keep the
                 # flood from reaching it
                 "--review-timeout", "0", "--max-reviews-per-source", "0",
                 "--max-connections-per-source", "0",
                 "--tls-cert-file", P.server.crt, "--tls-private-key-file", P.server.key,
                 "--client-ca-file", P.client_ca.crt] + list(flags))

    @classmethod
    def start_kwc(cls, name):
        p = Proc(name, cls.kwc_argv(name), cls.dir, tls=ClientTLS(P.ca.crt))
        cls.procs.append(p)
        p.start()
        ctx = ClientTLS(P.ca.crt).context()
        wait_for(lambda: https(p.port, ctx, "GET", "/readyz", token=TOK["admin"], timeout=5)[0] == 200, 60,
                 name + " /readyz")
        return p

    @classmethod
    def tearDownClass(cls):
        codes = cls.stop_all()
        shutil.rmtree(cls.dir, ignore_errors=True)
        bad = {n: c for n, c in codes.items() if c != 0}
        if bad:
            raise AssertionError("exit status %r" % bad)

    def sim_stats(self):
        st, h, b = http_request(self.apisim.port, "GET", "/apisim/stats")
        return json.loads(b)

    def metrics(self):
        return metrics_text(self.kwc.port, self.plain, TOK["admin"])

    def legit(self, what):
        """A client-certificate user and a token user read pods."""
        st, b = https(self.kwc.port, self.cert, "GET", PODS, timeout=30)
        self.assertEqual(st, 200, "%s: dave (client certificate): %s" % (what, b[:300]))
        st, b = https(self.kwc.port, self.plain, "GET", PODS, token=TOK["alice"], timeout=30)
        self.assertEqual(st, 200, "%s: alice (token): %s" % (what, b[:300]))

    def test_1_explicit_max_connections_that_cannot_fit(self):
        r = subprocess.run(self.kwc_argv("toobig", "--max-connections", "5000"), capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--max-connections 5000", r.stderr)
        self.assertIn("ulimit -n", r.stderr)

    def test_2_hanging_reviews_flood(self):
        # before: both users' answers cached (token, SubjectAccessReviews)
        self.legit("before the flood")
        m = self.metrics()
        conn_limit = metric(m, "kwc_http_connections_limit")
        review_cap = metric(m, "kwc_upstream_connections_limit", pool="tokenreview")
        self.assertGreaterEqual(conn_limit, FLOOD + 10, "the budget leaves room for the flood and users")
        self.assertLess(conn_limit, FD_LIMIT, "client connections are budgeted below the limit")
        self.assertLess(review_cap, FLOOD)
        limits = sum(metric(m, "kwc_upstream_connections_limit", pool=p)
                     for p in ("passthrough", "cache", "discovery", "tokenreview", "subjectaccessreview"))

        socks = hanging_flood(self.kwc.port, self.plain, FLOOD)
        try:
            # every review started: review_cap of them upstream, the rest waiting in kwc
            wait_for(lambda: metric(self.metrics(), "kwc_upstream_pool_requests_in_flight",
                                    pool="tokenreview") == FLOOD, 120, "all %d reviews in flight" % FLOOD)
            wait_for(lambda: self.sim_stats()["hanging_reviews"]["open"] == review_cap, 60,
                     "the review pool full upstream")
            pid = self.kwc.pid()
            for i in range(3):  # with the flood held: users served, the budget kept
                self.legit("during the flood (%d)" % i)
                m = self.metrics()
                fds = open_fds(pid)
                up = sum(metric(m, "kwc_upstream_connections", pool=p)
                         for p in ("passthrough", "cache", "discovery", "tokenreview", "subjectaccessreview"))
                conns = metric(m, "kwc_http_connections_open")
                hanging = self.sim_stats()["hanging_reviews"]
                sys.stderr.write("flood: %d fds open (limit %d), %d client connections, %d upstream, "
                                 "%d reviews held upstream\n" % (fds, FD_LIMIT, conns, up, hanging["open"]))
                self.assertLessEqual(hanging["open"], review_cap, "apisim sees at most the pool's cap")
                self.assertLessEqual(up, limits, "upstream connections within the pools' caps")
                self.assertGreaterEqual(conns, FLOOD)
                # the budget's reserve (listeners, loops, LMDB, ...) is far below 200
                self.assertLessEqual(fds, conns + up + 200, "descriptors: connections + upstream + reserve")
                self.assertLess(fds, FD_LIMIT - 200, "far from the limit")
                self.assertEqual(metric(m, "kwc_http_connections_refused_total", reason="out_of_descriptors"), 0)
            started = self.sim_stats()["hanging_reviews"]["started"]
        finally:
            close_all(socks)
        # the clients left: every review cancelled, in kwc and upstream
        wait_for(lambda: metric(self.metrics(), "kwc_reviews_cancelled_total") == FLOOD, 120,
                 "every review cancelled")
        wait_for(lambda: self.sim_stats()["hanging_reviews"]["open"] == 0, 60,
                 "apisim's hanging reviews closed by kwc")
        h = self.sim_stats()["hanging_reviews"]
        self.assertEqual(h["closed_by_client"], h["started"])
        self.assertGreaterEqual(h["started"], started)
        m = self.metrics()
        self.assertEqual(metric(m, "kwc_upstream_pool_requests_in_flight", pool="tokenreview"), 0)
        self.assertEqual(metric(m, "kwc_token_reviews_total", result="error"), 0,
                         "cancelled reviews are no failures")
        # a token kwc has never seen is reviewed at once again
        st, b = https(self.kwc.port, self.plain, "GET", PODS, token=TOK["bob"], timeout=60)
        self.assertEqual(st, 200, b[:300])


class MemoryBudgetTest(unittest.TestCase):
    only_in_plaintext_run = "counts plain connections"
    CAP = 16 << 20
    CLIENTS = 300
    # per passthrough beyond its queued bytes: its upstream read, curl's
    # buffer, connection state; generous (the machine is loaded)
    PER_CONN = 320 << 10
    # ASan's shadow memory and quarantine make RSS meaningless: the metric
    # alone is checked there
    CHECK_RSS = not os.environ.get("KWC_SANITIZED")

    def test_unread_passthrough_answers(self):
        with Env(apisim_args=["--pods", "1500", "--pod-size", "4096"],
                 kwc_args=["--resources", "v1/configmaps", "--max-passthrough-buffer", str(self.CAP),
                           "--max-upstream-connections", "400"]) as env:
            port = env.kwc.port

            def metrics():
                st, h, b = http_request(port, "GET", "/metrics", timeout=20)
                self.assertEqual(st, 200)
                return b.decode()
            self.assertEqual(metric(metrics(), "kwc_passthrough_buffer_limit_bytes"), self.CAP)
            rss0 = env.kwc.rss_kib() * 1024
            # a quorum list of pods (not cached here): ~6 MB, passed through
            socks = unread_flood(port, self.CLIENTS, "/api/v1/pods")
            try:
                # at rest every client holds its answer's start and its passthrough is
                # paused: by the budget, or (at most CAP/2 / 1 MiB of them, those that came
                # first) by its own --max-response-buffer
                settled = self.CLIENTS - self.CAP // 2 // (1 << 20) - 20
                wait_for(lambda: metric(metrics(), "kwc_passthrough_paused") >= settled, 120,
                         "passthroughs paused by the budget")
                # one upstream read (curl's 64 KiB buffer) per client past the cap, and
                # its response head and chunk framing
                bound = self.CAP + self.CLIENTS * (68 << 10)
                rss_bound = self.CAP + self.CLIENTS * self.PER_CONN
                for i in range(10):
                    m = metrics()
                    queued = metric(m, "kwc_passthrough_buffered_bytes")
                    grew = env.kwc.rss_kib() * 1024 - rss0
                    sys.stderr.write("unread flood: %.1f MiB queued (cap %.0f MiB), RSS +%.1f MiB, %d paused\n"
                                     % (queued / 2**20, self.CAP / 2**20, grew / 2**20,
                                        metric(m, "kwc_passthrough_paused")))
                    self.assertLessEqual(queued, bound, "queued: the cap, one read per client over at most")
                    if self.CHECK_RSS:
                        self.assertLessEqual(grew, rss_bound, "RSS: the cap and per-connection state")
            finally:
                close_all(socks)
            wait_for(lambda: metric(metrics(), "kwc_passthrough_buffered_bytes") == 0, 60, "the budget drained")
            self.assertEqual(metric(metrics(), "kwc_passthrough_paused"), 0)
            self.assertEqual(env.close().get("kwc"), 0, "kwc's exit status (LeakSanitizer's verdict)")



class PoolQueueTest(unittest.TestCase):
    """Passthrough requests past --max-upstream-connections wait for a
    connection and are answered; the pool never opens more."""
    only_in_plaintext_run = "counts plain connections"
    N = 20

    def test_requests_past_the_cap_wait(self):
        import concurrent.futures
        with Env(kwc_args=["--resources", "v1/configmaps", "--max-upstream-connections", "2"]) as env:
            port = env.kwc.port
            env.sim("POST", "/apisim/fail", {"count": self.N, "match": "/api/v1/namespaces/default/pods",
                                             "mode": "delay", "delay": 0.5})

            def pool():
                st, h, b = http_request(port, "GET", "/metrics", timeout=20)
                t = b.decode()
                return (metric(t, "kwc_upstream_pool_requests_in_flight", pool="passthrough"),
                        metric(t, "kwc_upstream_connections", pool="passthrough"))
            with concurrent.futures.ThreadPoolExecutor(self.N) as ex:
                futs = [ex.submit(http_request, port, "GET", "/api/v1/namespaces/default/pods", timeout=120)
                        for _ in range(self.N)]
                seen = wait_for(lambda: (lambda p: p if p[0] >= self.N / 2 else None)(pool()), 60,
                                "requests queued in the pool")
                most = 0
                while not all(f.done() for f in futs):  # bounded: each request has a 120 s timeout
                    inflight, conns = pool()
                    most = max(most, conns)
                    self.assertLessEqual(conns, 2, "the pool's cap")
                codes = [f.result()[0] for f in futs]
            self.assertEqual(codes, [200] * self.N)
            self.assertGreaterEqual(seen[0], self.N / 2)
            self.assertLessEqual(most, 2)
            self.assertEqual(env.close().get("kwc"), 0)


class TunnelCountTest(unittest.TestCase):
    """A tunnel holds two descriptors (the client's and its own upstream
    socket): --max-connections counts both."""
    only_in_plaintext_run = "counts plain connections"

    def test_tunnel_counts_twice(self):
        with Env(kwc_args=["--resources", "v1/configmaps"]) as env:
            port = env.kwc.port

            def open_conns():
                st, h, b = http_request(port, "GET", "/metrics", timeout=20)
                return metric(b.decode(), "kwc_http_connections_open")
            base = wait_for(lambda: open_conns() == 1 and 1, 30, "only the scrape open")
            s = socket.create_connection(("127.0.0.1", port), timeout=20)
            try:
                s.sendall(b"GET /apisim/echo-upgrade HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\n"
                          b"Upgrade: kwc-echo\r\n\r\n")
                buf = b""
                while b"\r\n\r\n" not in buf:
                    chunk = s.recv(4096)
                    self.assertTrue(chunk, "closed before the 101")
                    buf += chunk
                self.assertTrue(buf.startswith(b"HTTP/1.1 101"), buf)
                # the scrape's own connection, the tunnel's and its upstream socket
                self.assertEqual(open_conns(), base + 2)
            finally:
                s.close()
            wait_for(lambda: open_conns() == base, 30, "the tunnel released both")
            self.assertEqual(env.close().get("kwc"), 0)


# ---- fairness (issue 29) ----

FLOODER = "127.0.0.2"   # one source address (Linux routes all of 127/8 to lo)


def from_source(port, src, ctx, method, path, token=None, timeout=30):
    """One request on a fresh connection from source address src (TLS when
    ctx): (status, headers, body)."""
    if ctx:
        c = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=ctx, source_address=(src, 0))
    else:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(src, 0))
    try:
        c.request(method, path, headers={"Authorization": "Bearer " + token} if token else {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def socket_from(port, src, ctx=None, timeout=30):
    """A connected socket from source address src (TLS handshake done when ctx)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        s.bind((src, 0))
        s.connect(("127.0.0.1", port))
        return ctx.wrap_socket(s, server_hostname="127.0.0.1") if ctx else s
    except BaseException:
        s.close()
        raise


class ReviewFairnessTest(ProcGroup, unittest.TestCase):
    """Reviews under one address's flood of tokens that hang (apisim
    --hang-token-prefix): kwc 'share' (a pool of 4 review connections, so a
    share of 2; --upstream-timeout and --review-timeout 120 s, longer than
    any client here waits) and kwc 'deadline' (--review-timeout 2)."""
    POOL = 4
    FLOOD = 12          # three times the pool
    LONG = 120          # --upstream-timeout: no client here waits that long
    PODS = "/api/v1/namespaces/default/pods?resourceVersion=0"

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="kwc-fair-")
        cls.procs = []
        cls.policy = os.path.join(cls.dir, "policy.json")
        with open(cls.policy, "w") as f:
            json.dump(policy_doc(), f)
        # clients present tokens, never a certificate (which would authenticate without a review)
        cls.ctx = ClientTLS(P.ca.crt).context() if TLS else None
        try:
            cls.apisim = Proc("apisim", [PYTHON, APISIM, "--listen", "127.0.0.1:0", "--nodes", "1", "--pods", "5",
                                         "--policy", cls.policy, "--anonymous-auth=false",
                                         "--hang-token-prefix", HANG], cls.dir)
            cls.apisim.start()
            cls.procs.append(cls.apisim)
            cls.kc = os.path.join(cls.dir, "kubeconfig")
            with open(cls.kc, "w") as f:
                json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "sim",
                           "clusters": [{"name": "sim", "cluster": {"server": "http://127.0.0.1:%d"
                                                                    % cls.apisim.port}}],
                           "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "kwc"}}],
                           "users": [{"name": "kwc", "user": {"token": TOK["kwc"]}}]}, f)
            cls.share = cls.start_kwc("share", "--review-timeout", "%ds" % cls.LONG)
            cls.deadline = cls.start_kwc("deadline", "--review-timeout", "2s")
        except BaseException:
            cls.dump()
            cls.stop_all()
            raise

    @classmethod
    def start_kwc(cls, name, *flags):
        p = kwc_proc(name, ["--kubeconfig", cls.kc, "--listen", "127.0.0.1:0",
                            "--data-dir", os.path.join(cls.dir, "data-" + name), "--resources", "v1/pods",
                            "--serving-threads", "1", "--auth", "delegated", "--anonymous-auth=false",
                            "--upstream-timeout", "%ds" % cls.LONG, "--max-review-connections", str(cls.POOL)]
                     + list(flags), cls.dir)
        cls.procs.append(p)
        p.start()
        wait_for(lambda: cls.get(p, "/readyz", TOK["admin"], timeout=5)[0] == 200, 60, name + " /readyz")
        return p

    @classmethod
    def get(cls, p, path, token, src="127.0.0.1", timeout=30):
        return from_source(p.port, src, cls.ctx, "GET", path, token=token, timeout=timeout)

    @classmethod
    def tearDownClass(cls):
        codes = cls.stop_all()
        shutil.rmtree(cls.dir, ignore_errors=True)
        bad = {n: c for n, c in codes.items() if c != 0}
        if bad:
            raise AssertionError("exit status %r" % bad)

    def sim_stats(self):
        st, h, b = http_request(self.apisim.port, "GET", "/apisim/stats")
        return json.loads(b)

    def metrics(self, p):
        st, h, b = self.get(p, "/metrics", TOK["admin"], timeout=20)
        self.assertEqual(st, 200, b[:300])
        return b.decode()

    def test_1_flood_of_hanging_reviews_from_one_address(self):
        p = self.share
        m = self.metrics(p)
        share = self.POOL // 2   # --max-reviews-per-source's default: half the pool
        self.assertEqual(metric(m, "kwc_upstream_connections_limit", pool="tokenreview"), self.POOL)
        self.assertEqual(metric(m, "kwc_reviews_refused_total", review="tokenreview"), 0)
        hung0 = self.sim_stats()["hanging_reviews"]["started"]
        socks = []
        try:
            for i in range(self.FLOOD):
                s = socket_from(p.port, FLOODER, self.ctx)
                socks.append(s)
                s.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %sfair-%d\r\n\r\n"
                           % (self.PODS, HANG, i)).encode())
            # every request decided: its share of reviews started, the rest refused
            wait_for(lambda: metric(self.metrics(p), "kwc_reviews_refused_total", review="tokenreview") == self.FLOOD - share, 60,
                     "%d of the flood's requests refused" % (self.FLOOD - share))
            wait_for(lambda: self.sim_stats()["hanging_reviews"]["started"] - hung0 == share, 60,
                     "the flood's share of reviews hanging upstream")
            m = self.metrics(p)
            self.assertEqual(metric(m, "kwc_upstream_pool_requests_in_flight", pool="tokenreview"), share,
                             "the flood holds its share of the pool, no more")
            self.assertEqual(metric(m, "kwc_review_sources"), 1)
            # a caller from another address with a token kwc has never seen:
            # reviewed at once (a client timeout far below --upstream-timeout)
            for src, who in (("127.0.0.3", "alice"), ("127.0.0.4", "bob")):
                t0 = time.monotonic()
                st, h, b = self.get(p, self.PODS, TOK[who], src=src, timeout=30)
                took = time.monotonic() - t0
                self.assertEqual(st, 200, "%s from %s during the flood: %s" % (who, src, b[:300]))
                sys.stderr.write("review flood: %s's new token served in %.2f s (--upstream-timeout %d s)\n"
                                 % (who, took, self.LONG))
            # the flooding address's next new token: 429 at once, as kube's max-in-flight answers
            st, h, b = self.get(p, self.PODS, HANG + "fair-more", src=FLOODER, timeout=30)
            self.assertEqual(st, 429, b[:300])
            self.assertEqual(h.get("retry-after"), "1")
            body = json.loads(b)
            self.assertEqual((body["kind"], body["reason"], body["code"]), ("Status", "TooManyRequests", 429))
            self.assertEqual(body["details"]["retryAfterSeconds"], 1)
            # what the flood's sockets got: 429s, and nothing yet for the hanging share
            got, end = {}, time.monotonic() + 60
            while len(got) < self.FLOOD - share and time.monotonic() < end:
                for i, s in enumerate(socks):
                    if i in got:
                        continue
                    s.settimeout(0.05)
                    try:
                        d = s.recv(4096)
                    except (socket.timeout, ssl.SSLWantReadError):
                        continue
                    got[i] = d
            codes = sorted(d[:12].decode("latin-1") for d in got.values())
            self.assertEqual(codes, ["HTTP/1.1 429"] * (self.FLOOD - share), codes)
        finally:
            close_all(socks)
        # the flood gone: its reviews cancelled, its address forgotten
        wait_for(lambda: self.sim_stats()["hanging_reviews"]["open"] == 0, 60, "the hanging reviews closed")
        wait_for(lambda: metric(self.metrics(p), "kwc_review_sources") == 0, 30, "no source counted")

    def test_2_a_hanging_review_ends_at_its_deadline(self):
        p = self.deadline
        m = self.metrics(p)
        t0_out = metric(m, "kwc_reviews_timed_out_total")
        h0 = self.sim_stats()["hanging_reviews"]
        # a TokenReview that never answers: 401 after --review-timeout (2 s),
        # long before --upstream-timeout
        t0 = time.monotonic()
        st, h, b = self.get(p, self.PODS, HANG + "deadline", src="127.0.0.5", timeout=30)
        took = time.monotonic() - t0
        self.assertEqual(st, 401, b[:300])
        self.assertEqual(json.loads(b)["reason"], "Unauthorized")
        sys.stderr.write("review deadline: a hanging TokenReview answered 401 in %.2f s (--review-timeout 2, "
                         "--upstream-timeout %d)\n" % (took, self.LONG))
        self.assertEqual(metric(self.metrics(p), "kwc_reviews_timed_out_total"), t0_out + 1)
        wait_for(lambda: self.sim_stats()["hanging_reviews"]["closed_by_client"] == h0["closed_by_client"] + 1,
                 30, "kwc ended the review upstream")
        # nothing cached: the same token is reviewed again
        st, h, b = self.get(p, self.PODS, HANG + "deadline", src="127.0.0.5", timeout=30)
        self.assertEqual(st, 401, b[:300])
        self.assertEqual(self.sim_stats()["hanging_reviews"]["started"], h0["started"] + 2,
                         "asked upstream again: a timed-out review is not cached")
        # a SubjectAccessReview that hangs: 500, as kube answers an authorizer error
        self.metrics(p)  # (admin's own answers cached before the upstream hangs)
        http_request(self.apisim.port, "POST", "/apisim/fail",
                     body={"count": 1, "match": "subjectaccessreviews", "mode": "hang"})
        st, h, b = self.get(p, self.PODS, TOK["bob"], src="127.0.0.6", timeout=30)
        self.assertEqual(st, 500, b[:300])
        self.assertTrue(b.startswith(b"Internal Server Error: "), b[:300])
        self.assertIn(b"--review-timeout", b)
        self.assertEqual(metric(self.metrics(p), "kwc_reviews_timed_out_total"), t0_out + 3)
        # and the next ask is answered (the upstream answers again)
        st, h, b = self.get(p, self.PODS, TOK["bob"], src="127.0.0.6", timeout=30)
        self.assertEqual(st, 200, b[:300])


class ConnectionFairnessTest(unittest.TestCase):
    """A connection flood from one address past --max-connections: it holds
    --max-connections-per-source of them (a quarter by default) and another
    address still connects and is served."""
    CAP = 40
    FLOOD = 60

    def test_connection_flood_from_one_address(self):
        with Env(kwc_args=["--resources", "v1/pods", "--max-connections", str(self.CAP),
                           "--request-header-timeout", "300s"]) as env:
            port = env.kwc.port
            ctx = ClientTLS(P.ca.crt).context() if TLS else None
            per_source = self.CAP // 4

            def metrics():
                st, h, b = http_request(port, "GET", "/metrics", timeout=20)
                self.assertEqual(st, 200)
                return b.decode()
            socks = []
            try:
                for i in range(self.FLOOD):  # TCP connections that never send (nor start TLS)
                    socks.append(socket_from(port, FLOODER))
                wait_for(lambda: metric(metrics(), "kwc_http_connections_refused_total",
                                        reason="max_connections_per_source") == self.FLOOD - per_source, 60,
                         "the flood past its share refused")
                m = metrics()
                self.assertEqual(metric(m, "kwc_http_connections_refused_total", reason="max_connections"), 0,
                                 "nobody refused for the global cap")
                # another address: connects, is served
                for src in ("127.0.0.3", "127.0.0.4"):
                    st, h, b = from_source(port, src, ctx, "GET", "/api/v1/namespaces/default/pods?resourceVersion=0")
                    self.assertEqual(st, 200, "%s during the flood: %s" % (src, b[:300]))
                # the flood's address: refused, with kube's 429 in plaintext (TLS: closed before the handshake)
                if not TLS:
                    s = socket_from(port, FLOODER)
                    try:
                        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                        data = b""
                        while True:
                            d = s.recv(4096)
                            if not d:
                                break
                            data += d
                    finally:
                        s.close()
                    self.assertTrue(data.startswith(b"HTTP/1.1 429 "), data[:200])
                    self.assertIn(b'"reason":"TooManyRequests"', data)
            finally:
                close_all(socks)
            wait_for(lambda: metric(metrics(), "kwc_http_connection_sources") <= 1, 60,
                     "the flood's address forgotten")
            self.assertEqual(env.close().get("kwc"), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
