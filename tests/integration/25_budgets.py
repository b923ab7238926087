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

Every wait polls a condition with a deadline; every load loop is bounded in
count and time. The bounds compare with the configured caps, never with
timing.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import certs
from cluster import (ProcGroup, APISIM, KWC_BIN, KWC_EXTRA_ARGS, KWC_WRAP, PYTHON, ClientTLS, Env, Proc,
                     http_request, wait_for)

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
                 "--watch-workers", "2", "--auth=delegated", "--anonymous-auth=false",
                 "--upstream-timeout", "600",  # queued reviews wait for the flood to end
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
                     for p in ("passthrough", "cache", "tokenreview", "subjectaccessreview"))

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
                         for p in ("passthrough", "cache", "tokenreview", "subjectaccessreview"))
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


if __name__ == "__main__":
    unittest.main(verbosity=2)
