"""HTTP/2 downstream (issue 21), with the clients that speak it.

kwc answers HTTP/2 with prior knowledge beside HTTP/1.1 on its plaintext port
and offers ALPN h2 over TLS. This module starts its own kwc processes (a
plaintext one and a TLS one per class; it is the same in every run, so the
TLS run leaves it out):

- Real clients: `curl --http2-prior-knowledge` and `curl --http2` over TLS,
  `nghttp` (many streams of one connection) and `h2load` (plaintext and TLS)
  get cached lists and gets served by the cache (apisim's list/get counters
  do not move) with the bodies HTTP/1.1 gets; kubectl over TLS negotiates h2,
  which kwc's metrics prove (connections and streams by protocol).
- One connection: 100 concurrent streams; a passthrough request body larger
  than the windows both ways; a large response whose stream the client stops
  reading (its window closes) while other streams of the connection complete,
  then it completes too.
- Watches multiplexed: 1,000 watches on one connection each get every event
  (creates, updates, deletes, in order, the same bytes);
  a stalled watch stream beside live ones (its window exhausted) lags alone
  and catches up, byte for byte; 50 watches cancelled while their events are
  in flight are 50 resets to kwc (not a rapid reset), the connection stays.
- Hostile clients: streams past --http2-max-streams-per-connection are
  refused (RST_STREAM REFUSED_STREAM) and the ones within go on; rapid reset
  (CVE-2023-44487) gets GOAWAY ENHANCE_YOUR_CALM; a header list over
  --max-header-bytes is answered 431, and so is an HPACK bomb (its decoded
  size counts), then the connection ends (GOAWAY ENHANCE_YOUR_CALM: nothing
  past the field that passed the limit is decoded; 30_h2_attack has the
  bombs that cost); a CONTINUATION flood (CVE-2024-27316) ends the connection; a
  PING/SETTINGS flood from a client that reads nothing neither grows kwc's
  queue without bound nor keeps the connection past the idle timeout, nor
  does a client that never opens its window; an upgrade attempt over HTTP/2
  (exec over SPDY, WebSocket) is a stream error (PROTOCOL_ERROR), as Go's
  server answers it, and the connection goes on.
- Shutdown: SIGTERM sends GOAWAY; an open stream finishes, then kwc exits 0.
"""
import json
import os
import re
import select
import signal
import socket
import subprocess
import tempfile
import unittest

import certs
import h2client
from cluster import (KWC_BIN, KWC_EXTRA_ARGS, KWC_WRAP, ClientTLS, Env, Proc, kubectl, only_in_plaintext_run,
                     wait_for)
from h2client import ERR, Connection, RawConn
from hyperframe import frame as hf
from scrape import has, scrape, total

P = certs.pki()
JSON = {"accept": "application/json"}


def h1_request(port, method, path, headers=None, tls=None, body=None):
    """One HTTP/1.1 request whatever the run's mode: (status, headers, body)."""
    import http.client
    if tls:
        c = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=tls.context())
    else:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def upstream_reads(env):
    """Lists and gets apisim has answered (the served-by-the-cache proof):
    {kind: count}."""
    return {k: v for k, v in env.stats()["requests"].items() if k.startswith(("list ", "get "))}


def h2_count(m, kind):
    """kwc's HTTP/2 counters (proxy/ops/collect.c): kind "connections"
    (kwc_http2_connections_total: connections that spoke HTTP/2), "streams"
    (kwc_http2_streams_total), "refused" / "client" (kwc_http2_stream_resets_total
    by reason), "goaways" (kwc_http2_goaways_total). A family kwc no longer
    writes fails loudly."""
    name, labels = {"connections": ("kwc_http2_connections_total", {}),
                    "streams": ("kwc_http2_streams_total", {}),
                    "refused": ("kwc_http2_stream_resets_total", {"reason": "refused"}),
                    "client": ("kwc_http2_stream_resets_total", {"reason": "client"}),
                    "goaways": ("kwc_http2_goaways_total", {})}[kind]
    if not has(m, name):
        raise AssertionError("kwc's /metrics has no %s" % name)
    return total(m, name, **labels)


def scrape_port(k):
    """kwc's /metrics (over HTTP/1.1: the HTTP/2 counts are the tests' own)."""
    return scrape(k.port)


def tls_client():
    return ClientTLS(P.ca.crt, P.client.crt, P.client.key)


class Http2Case(unittest.TestCase):
    """One apisim per class; kwc processes started by start() (plaintext or
    TLS, this module's own flags), stopped with exit status 0 required."""
    only_in_plaintext_run = "starts its own plaintext and TLS kwc: a TLS run would repeat it"
    apisim_args = ["--pods", "30", "--nodes", "2", "--namespaces", "2"]
    resources = "v1/pods,v1/nodes,v1/configmaps"

    @classmethod
    def setUpClass(cls):
        cls.env = Env(apisim_args=cls.apisim_args, start_kwc=False)
        cls.procs = []

    @classmethod
    def tearDownClass(cls):
        bad = {}
        for p in cls.procs:
            if p.exit_code is None:
                try:
                    c = p.stop()
                except RuntimeError as e:
                    c = str(e)
                if c != 0:
                    bad[p.name] = c
        cls.env.close()
        if bad:
            for p in cls.procs:
                print("---- %s log (%s) ----\n%s" % (p.name, p.log_path, p.logs()))
            raise AssertionError("kwc exit status %r" % bad)

    def run(self, result=None):
        before = len(result.failures) + len(result.errors) if result else 0
        r = super().run(result)
        if result and len(result.failures) + len(result.errors) > before:
            self.env.dump_logs()
            for p in self.procs:
                print("---- %s log (%s) ----\n%s" % (p.name, p.log_path, p.logs()))
        return r

    @classmethod
    def start(cls, *args, tls=False, name=None):
        """A kwc in front of the class's apisim, ready; tls: serving the test
        certificates (client certificates verified when presented)."""
        n = len(cls.procs)
        d = os.path.join(cls.env.dir, "kwc%d" % n)
        os.makedirs(d, exist_ok=True)
        argv = KWC_WRAP + [KWC_BIN] + KWC_EXTRA_ARGS + [
            "--upstream", "http://127.0.0.1:%d" % cls.env.apisim.port, "--listen", "127.0.0.1:0",
            "--data-dir", os.path.join(d, "data"), "--resources", cls.resources]
        if tls:
            argv += ["--tls-cert-file", P.server.crt, "--tls-private-key-file", P.server.key,
                     "--client-ca-file", P.client_ca.crt, "--auth", "none"]
        # h2=False: cluster's helpers (http_request, scrape) speak HTTP/1.1 to
        # it in every run; the tests here choose their protocol themselves
        p = Proc(name or "kwc%d" % n, argv + list(args), d, tls=tls_client() if tls else None, h2=False)
        cls.procs.append(p)
        p.start()
        wait_for(lambda: h1_request(p.port, "GET", "/readyz", tls=p.tls)[0] == 200, 30, p.name + " /readyz")
        # every cache serves (/readyz says they listed; a cache's first
        # answers may still be the upstream's while its watch starts)
        for res in cls.resources.split(","):
            path = ("/api/%s" if res.count("/") == 1 else "/apis/%s") % res.rsplit("/", 1)[0] + \
                "/" + res.rsplit("/", 1)[1] + "?resourceVersion=0"

            def served(path=path):
                n = upstream_reads(cls.env)
                return h1_request(p.port, "GET", path, JSON, tls=p.tls)[0] == 200 and upstream_reads(cls.env) == n
            wait_for(served, 30, "%s to serve %s from its cache" % (p.name, path))
        return p

    def served(self, fn):
        """fn() with apisim's list/get counters checked unchanged."""
        before = upstream_reads(self.env)
        r = fn()
        after = upstream_reads(self.env)
        self.assertEqual(after, before, "served by the upstream, not by kwc's cache: %s" % {
            k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)})
        return r


@only_in_plaintext_run(Http2Case.only_in_plaintext_run)
class Clients(Http2Case):
    """curl, nghttp, h2load and kubectl against a plaintext and a TLS kwc."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        try:
            cls.plain = cls.start("--access-log", "--logging-format", "json")
            cls.tls = cls.start(tls=True)
        except BaseException:
            cls.tearDownClass()
            raise
        cls.tmp = tempfile.mkdtemp(dir=cls.env.dir)

    def curl(self, *args):
        out = os.path.join(self.tmp, "body")
        # (kube answers a curl/* User-Agent pretty-printed JSON, which kwc
        # leaves to the upstream: another agent name)
        r = subprocess.run(["curl", "-sS", "-o", out, "-w", "%{http_version} %{http_code}", "-A", "kwc-it",
                            "-H", "Accept: application/json"] + list(args), capture_output=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        with open(out, "rb") as f:
            return r.stdout.decode(), f.read()

    def tls_args(self):
        return ["--cacert", P.ca.crt, "--cert", P.client.crt, "--key", P.client.key]

    def test_curl_version_has_http2(self):
        r = subprocess.run(["curl", "-V"], capture_output=True, text=True, check=True)
        self.assertRegex(r.stdout, r"(?m)^Features:.*\bHTTP2\b", "this curl has no HTTP/2")

    def test_curl_prior_knowledge(self):
        k = self.plain
        for path in ("/api/v1/pods?resourceVersion=0", "/api/v1/namespaces/ns-1/pods/pod-1?resourceVersion=0",
                     "/api/v1/nodes?resourceVersion=0", "/api/v1/namespaces/ns-1/pods/nope?resourceVersion=0"):
            want = h1_request(k.port, "GET", path, JSON)
            code = 404 if "nope" in path else 200
            self.assertEqual(want[0], code)
            got = self.served(lambda: self.curl("--http2-prior-knowledge", "http://127.0.0.1:%d%s" % (k.port, path)))
            self.assertEqual(got[0], "2 %d" % code, path)
            self.assertEqual(got[1], want[2], path)
            # and HTTP/1.1 on the same port, from the same curl
            self.assertEqual(self.curl("--http1.1", "http://127.0.0.1:%d%s" % (k.port, path))[0], "1.1 %d" % code)
        self.assertEqual(json.loads(got[1])["reason"], "NotFound")

    def test_curl_http2_over_tls(self):
        k = self.tls
        path = "/api/v1/pods?resourceVersion=0"
        want = h1_request(k.port, "GET", path, JSON, tls=k.tls)
        got = self.served(lambda: self.curl("--http2", *self.tls_args(), "https://127.0.0.1:%d%s" % (k.port, path)))
        self.assertEqual(got[0], "2 200")
        self.assertEqual(got[1], want[2])
        # a client that offers only http/1.1 still gets it
        self.assertEqual(self.curl("--http1.1", *self.tls_args(), "https://127.0.0.1:%d%s" % (k.port, path))[0],
                         "1.1 200")

    def nghttp(self, *args):
        r = subprocess.run(["nghttp", "-ns", "-H", "accept: application/json"] + list(args),
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-2000:])
        # the statistics table: id responseEnd requestStart process code size path
        rows = re.findall(r"(?m)^\s*(\d+)\s+\S+\s+\S+\s+\S+\s+(\d{3})\s+\S+\s+(\S+)$", r.stdout)
        return rows, r.stdout

    def test_nghttp_many_streams(self):
        for k, scheme, extra in ((self.plain, "http", []),
                                 (self.tls, "https", ["--cert", P.client.crt, "--key", P.client.key])):
            with self.subTest(scheme=scheme):
                base = "%s://127.0.0.1:%d" % (scheme, k.port)
                paths = ["/api/v1/pods?resourceVersion=0", "/api/v1/namespaces/ns-0/pods/pod-0?resourceVersion=0",
                         "/api/v1/nodes/node-1?resourceVersion=0", "/api/v1/namespaces/ns-0/pods/nope?resourceVersion=0"]
                rows, out = self.served(lambda: self.nghttp("-m", "25", *extra, *[base + p for p in paths]))
                self.assertEqual(len(rows), 100, out[-3000:])
                codes = {}
                for _, code, path in rows:
                    codes.setdefault(path, set()).add(int(code))
                self.assertEqual(codes, {paths[0]: {200}, paths[1]: {200}, paths[2]: {200}, paths[3]: {404}})
                # one connection: every stream id distinct, odd
                ids = [int(i) for i, _, _ in rows]
                self.assertEqual(len(set(ids)), 100)
                self.assertTrue(all(i % 2 for i in ids))

    def h2load(self, *args):
        r = subprocess.run(["h2load", "-H", "accept: application/json"] + list(args), capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-2000:])
        m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                      r"(\d+) errored", r.stdout)
        self.assertIsNotNone(m, r.stdout)
        c = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", r.stdout)
        return [int(x) for x in m.groups()], [int(x) for x in c.groups()], r.stdout

    def test_h2load_cached_gets(self):
        for k, url in ((self.plain, "http://127.0.0.1:%d" % self.plain.port),
                       (self.tls, "https://127.0.0.1:%d" % self.tls.port)):
            with self.subTest(url=url):
                m0 = scrape_port(k)
                reqs, codes, out = self.served(lambda: self.h2load(
                    "-n", "2000", "-c", "4", "-m", "10", url + "/api/v1/namespaces/ns-1/pods/pod-1?resourceVersion=0",
                    url + "/api/v1/nodes?resourceVersion=0"))
                self.assertEqual(reqs, [2000, 2000, 2000, 2000, 0, 0], out)
                self.assertEqual(codes, [2000, 0, 0, 0], out)
                if k.tls:
                    self.assertIn("Application protocol: h2", out)
                m1 = scrape_port(k)
                self.assertEqual(h2_count(m1, "connections") - h2_count(m0, "connections"), 4)
                self.assertGreaterEqual(h2_count(m1, "streams") - h2_count(m0, "streams"), 2000)

    def test_access_log_records_the_protocol(self):
        k = self.plain
        c = Connection(k.port)
        self.addCleanup(c.close)
        self.assertEqual(c.request("GET", "/api/v1/pods?resourceVersion=0&labelSelector=log%3Dh2", JSON)[0], 200)
        self.assertEqual(h1_request(k.port, "GET", "/api/v1/pods?resourceVersion=0&labelSelector=log%3Dh1",
                                    JSON)[0], 200)

        def lines():
            with open(k.log_path, "rb") as f:
                ls = [json.loads(l) for l in f.read().decode().splitlines() if l.startswith("{")]
            got = {l["path"]: l for l in ls if l.get("msg") == "request" and "log%3D" in l.get("path", "")}
            return len(got) == 2 and got
        got = wait_for(lines, 10, "the two access log lines")
        self.assertEqual(got["/api/v1/pods?resourceVersion=0&labelSelector=log%3Dh2"]["proto"], "HTTP/2.0")
        self.assertEqual(got["/api/v1/pods?resourceVersion=0&labelSelector=log%3Dh1"]["proto"], "HTTP/1.1")
        self.assertEqual({l["source"] for l in got.values()}, {"cache"})

    def test_kubectl_over_tls_negotiates_h2(self):
        k = self.tls
        m0 = scrape_port(k)
        r = kubectl("kubectl", k.port, "get", "pods", "-A", "-o", "name", "--request-timeout", "30s")
        names = r.stdout.decode().split()
        self.assertEqual(len(names), 30, r.stdout)
        m1 = scrape_port(k)
        # kubectl's connection (discovery, then the list on the same
        # connection) was HTTP/2: nothing else spoke HTTP/2 to this kwc
        self.assertGreaterEqual(h2_count(m1, "connections") - h2_count(m0, "connections"), 1,
                                "kubectl did not negotiate h2 (no HTTP/2 connection counted)")
        self.assertGreaterEqual(h2_count(m1, "streams") - h2_count(m0, "streams"), 2)

    def test_many_streams_one_connection(self):
        k = self.plain
        c = Connection(k.port)
        self.addCleanup(c.close)
        self.assertEqual(c.server_settings.get(h2client.S.MAX_CONCURRENT_STREAMS), 100)
        paths = ["/api/v1/namespaces/ns-%d/pods/pod-%d?resourceVersion=0" % (i % 2, i) for i in range(30)]
        paths += ["/api/v1/pods?resourceVersion=0&labelSelector=app%%3Dapp-%d" % (i % 8) for i in range(40)]
        paths += ["/api/v1/nodes/node-%d?resourceVersion=0" % (i % 3) for i in range(30)]  # node-2: 404
        want = {p: h1_request(k.port, "GET", p, JSON) for p in set(paths)}

        def all_at_once():
            streams = [c.open("GET", p, JSON) for p in paths]
            self.assertEqual(c.h2.open_outbound_streams, 100)
            return [s.result() for s in streams]
        got = self.served(all_at_once)
        for p, (st, h, b) in zip(paths, got):
            self.assertEqual((st, b), (want[p][0], want[p][2]), p)
            self.assertEqual(h.get("content-type"), "application/json", p)
            self.assertNotIn("connection", h)
            self.assertNotIn("transfer-encoding", h)

    def test_passthrough_bodies_both_ways(self):
        # a request body larger than kwc's windows (its connection window is
        # 1 MiB, a stream's 64 KiB) and an answer larger than ours (64 KiB)
        k = self.plain
        c = Connection(k.port, window=65535, initial_window=65535)
        self.addCleanup(c.close)
        big = "x" * (900 << 10)  # under kube's 1 MiB for a ConfigMap
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big-h2", "namespace": "ns-0"},
              "data": {"v": big}}
        st, h, b = c.request("POST", "/api/v1/namespaces/ns-0/configmaps", dict(JSON, **{
            "content-type": "application/json"}), json.dumps(cm).encode())
        self.assertEqual(st, 201, b[:300])
        st, h, b = c.request("GET", "/api/v1/namespaces/ns-0/configmaps/big-h2", JSON)
        self.assertEqual(st, 200)
        self.assertEqual(json.loads(b)["data"]["v"], big)
        self.assertEqual(b, h1_request(k.port, "GET", "/api/v1/namespaces/ns-0/configmaps/big-h2", JSON)[2])
        st, _, b = c.request("DELETE", "/api/v1/namespaces/ns-0/configmaps/big-h2", JSON)
        self.assertEqual(st, 200, b[:300])

    def test_stalled_response_beside_live_streams(self):
        # the whole pods list (kwc's own answer, larger than the stream's
        # window): the client stops reading that stream; 50 gets on the same
        # connection complete meanwhile; then it reads on and gets it all
        k = self.plain
        path = "/api/v1/pods?resourceVersion=0"
        want = h1_request(k.port, "GET", path, JSON)[2]
        window = 4096
        self.assertGreater(len(want), 2 * window)
        c = Connection(k.port, window=1 << 20, initial_window=window)
        self.addCleanup(c.close)
        big = c.open("GET", path, JSON, window=window, paused=True)
        c.pump(lambda: big._held and sum(n for _, n in big._held) >= window, 30, "the stalled stream's window")
        self.assertEqual(sum(n for _, n in big._held), window, "kwc sent past the stream's window")
        gets = [c.open("GET", "/api/v1/namespaces/ns-%d/pods/pod-%d?resourceVersion=0" % (i % 2, i % 30), JSON)
                for i in range(50)]
        for g in gets:
            self.assertEqual(g.result()[0], 200)
        self.assertFalse(big.closed)
        self.assertEqual(sum(n for _, n in big._held), window)
        big.paused = False
        st, h, b = big.result()
        self.assertEqual((st, b), (200, want))


@only_in_plaintext_run(Http2Case.only_in_plaintext_run)
class Watches(Http2Case):
    """Watch streams multiplexed on one connection."""
    apisim_args = ["--pods", "20", "--namespaces", "2", "--bookmark-interval", "0.5"]

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        try:
            cls.kwc = cls.start("--http2-max-streams-per-connection", "1100")
        except BaseException:
            cls.tearDownClass()
            raise

    def watch_lines(self, st):
        """The complete event lines a stream has delivered."""
        return bytes(st.body).split(b"\n")[:-1]

    def test_1000_watches_one_connection(self):
        # needs watches over HTTP/2 (response streams on h2 connections)
        e = self.env
        c = Connection(self.kwc.port, window=65536, initial_window=65536)
        self.addCleanup(c.close)
        self.assertEqual(c.server_settings.get(h2client.S.MAX_CONCURRENT_STREAMS), 1100)
        r0 = e.stats()["rv"]
        ws = [c.open("GET", "/api/v1/pods?watch=1&resourceVersion=%d" % r0, JSON) for _ in range(1000)]
        c.pump(lambda: all(w.status is not None or w.closed for w in ws), 60, "1000 watch heads")
        self.assertEqual({w.status for w in ws}, {200})
        self.assertEqual(c.h2.open_outbound_streams, 1000)
        # creates, updates and deletes: every watch gets all of them, in order
        want = []
        for i in range(4):
            want.append(("ADDED", e.sim("POST", "/apisim/write", {
                "verb": "create", "resource": "pods", "namespace": "ns-%d" % (i % 2), "name": "h2-%d" % i})["rv"]))
        for i in range(4):
            want.append(("MODIFIED", e.sim("POST", "/apisim/write", {
                "verb": "update", "resource": "pods", "namespace": "ns-%d" % (i % 2), "name": "h2-%d" % i,
                "labels": {"n": str(i)}})["rv"]))
        for i in range(2):
            want.append(("DELETED", e.sim("POST", "/apisim/write", {
                "verb": "delete", "resource": "pods", "namespace": "ns-%d" % (i % 2), "name": "h2-%d" % i})["rv"]))
        c.pump(lambda: all(len(self.watch_lines(w)) >= len(want) for w in ws), 120,
               "every watch to get the %d events" % len(want))
        for i, w in enumerate(ws):
            evs = [json.loads(l) for l in self.watch_lines(w)]
            self.assertEqual([(ev["type"], int(ev["object"]["metadata"]["resourceVersion"])) for ev in evs], want,
                             "watch %d (stream %d)" % (i, w.id))
            self.assertFalse(w.closed)
        self.assertEqual(len({bytes(w.body) for w in ws}), 1, "the watches got different bytes")
        for w in ws:
            w.reset()
        # the connection is still good (1000 cancels at the end of a client's
        # watches are its right, not a rapid reset)
        self.assertEqual(c.request("GET", "/api/v1/pods?resourceVersion=0&limit=1", JSON)[0], 200)

    def test_cancelled_watches_are_one_reset_each(self):
        # watches cancelled while kwc is sending them (events in flight, as
        # client-go's cancelled informers): one RST_STREAM each, counted once
        # each; the DATA still in flight is dropped, and the connection stays
        e = self.env
        c = Connection(self.kwc.port)
        self.addCleanup(c.close)
        m0 = scrape_port(self.kwc)
        e.sim("POST", "/apisim/churn", {"rate": 300, "resources": ["pods"], "mix": {"update": 1.0}})
        self.addCleanup(e.sim, "POST", "/apisim/churn", {"rate": 0})
        for _ in range(50):
            w = c.open("GET", "/api/v1/pods?watch=1&resourceVersion=0", JSON)
            c.pump(lambda: len(w.body) > 0, 30, "the watch's first events")
            # more of its events have arrived, unread, when it is cancelled
            r, _, _ = select.select([c.sock], [], [], 10)
            self.assertTrue(r, "no more events within 10 s at 300 writes/s")
            w.reset()
        e.sim("POST", "/apisim/churn", {"rate": 0})
        self.assertEqual(c.request("GET", "/api/v1/pods?resourceVersion=0&limit=1", JSON)[0], 200)
        self.assertIsNone(c.goaway)
        m1 = scrape_port(self.kwc)
        self.assertEqual(h2_count(m1, "client") - h2_count(m0, "client"), 50)
        self.assertGreater(c.discarded, 0, "no DATA came after a reset: the case was not made")

    def test_stalled_watch_beside_live_ones(self):
        e = self.env
        c = Connection(self.kwc.port, window=1 << 20, initial_window=4096)
        self.addCleanup(c.close)
        r0 = e.stats()["rv"]
        path = "/api/v1/pods?watch=1&resourceVersion=%d" % r0
        stalled = c.open("GET", path, JSON, window=4096)
        live = [c.open("GET", path, JSON) for _ in range(5)]
        c.pump(lambda: all(w.status for w in live + [stalled]), 30, "watch heads")
        stalled.paused = True
        # ~600 KB of events: the stalled stream's 4 KiB window is exhausted
        # early, the live ones read on
        final = e.sim("POST", "/apisim/churn", {"count": 300, "resources": ["pods"], "mix": {"update": 1.0}})["rv"]

        def at(w, rv):
            ls = self.watch_lines(w)
            return ls and int(json.loads(ls[-1])["object"]["metadata"]["resourceVersion"]) >= rv
        c.pump(lambda: all(at(w, final) for w in live), 60, "the live watches to reach rv %d" % final)
        held = sum(n for _, n in stalled._held)
        self.assertLessEqual(held, 4096, "kwc sent past the stalled stream's window")
        self.assertEqual(stalled.bytes, 0)
        self.assertFalse(stalled.closed)
        stalled.paused = False
        c.pump(lambda: at(stalled, final), 60, "the stalled watch to catch up")
        self.assertEqual(self.watch_lines(stalled), self.watch_lines(live[0]))
        for w in live[1:]:
            self.assertEqual(self.watch_lines(w), self.watch_lines(live[0]))


@only_in_plaintext_run(Http2Case.only_in_plaintext_run)
@only_in_plaintext_run(Http2Case.only_in_plaintext_run)
class Loops(Http2Case):
    """How the acceptor spreads connections over the serving loops."""
    apisim_args = ["--pods", "4"]
    resources = "v1/pods"

    def test_connections_first(self):
        # A holds 40 watch streams; then 10 clients connect one at a time,
        # each with one watch. Counting a stream like a connection sent all
        # 10 to the other loop (A's 40 streams outweigh them): a burst of
        # clients whose streams arrive unevenly was split unevenly. With
        # connections first (a stream 1/64 of one) they alternate after the
        # other loop's first two: 5 and 6 connections
        k = self.start("--serving-threads", "2")
        path = "/api/v1/pods?watch=1&resourceVersion=0"
        a = Connection(k.port)
        self.addCleanup(a.close)
        ws = [a.open("GET", path, JSON) for _ in range(40)]
        a.pump(lambda: all(w.status is not None or w.closed for w in ws), 30, "A's 40 watch heads")
        self.assertEqual({w.status for w in ws}, {200})
        for i in range(10):
            c = Connection(k.port)
            self.addCleanup(c.close)
            w = c.open("GET", path, JSON)
            c.pump(lambda: w.status is not None or w.closed, 30, "client %d's watch head" % i)
            self.assertEqual(w.status, 200)
        m = scrape_port(k)
        per_loop = {}
        for (n, ls), v in m.items():
            if n in ("kwc_serving_loop_connections", "kwc_serving_loop_http2_streams"):
                per_loop.setdefault(dict(ls)["loop"], {})[n.rsplit("_", 1)[1]] = v
        self.assertEqual(set(per_loop), {"0", "1"}, per_loop)
        a_loop = max(per_loop, key=lambda l: per_loop[l]["streams"])
        other = "1" if a_loop == "0" else "0"
        self.assertEqual((per_loop[a_loop]["streams"], per_loop[other]["streams"]), (44, 6), per_loop)
        # (the scrape's own HTTP/1.1 connection is held by one of them)
        got = (per_loop[a_loop]["connections"], per_loop[other]["connections"])
        self.assertIn(got, [(5, 6), (6, 6), (5, 7)], "connections per loop, A's first: %s" % (per_loop,))


class Hostile(Http2Case):
    """What a hostile client gets; kwc goes on serving everyone else."""
    MAX_STREAMS = 10
    HEADER_BYTES = 16384

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        try:
            # a list at an rv far ahead waits in kwc (--rv-wait-timeout) without
            # asking the upstream: streams that stay open as long as a test needs
            cls.kwc = cls.start("--http2-max-streams-per-connection", str(cls.MAX_STREAMS),
                                "--max-header-bytes", str(cls.HEADER_BYTES), "--too-large-rv", "504",
                                "--rv-wait-timeout", "60s", "--request-header-timeout", "300s",
                                "--idle-timeout", "300s")
        except BaseException:
            cls.tearDownClass()
            raise

    def still_serving(self):
        self.assertEqual(h1_request(self.kwc.port, "GET", "/api/v1/pods?resourceVersion=0&limit=1", JSON)[0], 200)
        c = Connection(self.kwc.port)
        try:
            self.assertEqual(c.request("GET", "/api/v1/pods?resourceVersion=0&limit=1", JSON)[0], 200)
        finally:
            c.close()

    def waiting_path(self):
        return "/api/v1/pods?resourceVersion=%d" % (self.env.stats()["rv"] + 10 ** 9)

    def test_streams_past_the_limit_are_refused(self):
        m0 = scrape_port(self.kwc)
        rc = RawConn(self.kwc.port)
        self.addCleanup(rc.close)
        n = self.MAX_STREAMS + 5
        path = self.waiting_path()
        # all at once, before the server's SETTINGS are even read (a client
        # that has not seen the limit yet: the streams past it are refused)
        rc.send(*[rc.headers(2 * i + 1, "GET", path, [("accept", "application/json")]) for i in range(n)])
        refused = set()
        while len(refused) < 5:
            f = rc.until(lambda f: isinstance(f, (hf.RstStreamFrame, hf.GoAwayFrame, hf.HeadersFrame)), 30,
                         "RST_STREAM REFUSED_STREAM")
            self.assertIsNotNone(f, "kwc closed the connection")
            self.assertNotIsInstance(f, hf.GoAwayFrame, "GOAWAY %r" % getattr(f, "error_code", None))
            self.assertNotIsInstance(f, hf.HeadersFrame, "a stream past the limit was answered")
            self.assertEqual(f.error_code, ERR.REFUSED_STREAM)
            refused.add(f.stream_id)
        self.assertEqual(refused, {2 * i + 1 for i in range(self.MAX_STREAMS, n)})
        # the ones within the limit are open (waiting); cancel them, and the
        # connection takes new streams
        rc.send(*[hf.RstStreamFrame(2 * i + 1, error_code=ERR.CANCEL) for i in range(self.MAX_STREAMS)])
        sid = 2 * n + 1
        rc.send(rc.headers(sid, "GET", "/api/v1/pods?resourceVersion=0&limit=1", [("accept", "application/json")]))
        f = rc.until(lambda f: isinstance(f, (hf.HeadersFrame, hf.GoAwayFrame)) and f.stream_id in (0, sid), 30,
                     "the answer to a stream within the limit")
        self.assertIsInstance(f, hf.HeadersFrame)
        self.assertEqual(h2client.status_of(f), 200)
        m1 = scrape_port(self.kwc)
        self.assertEqual(h2_count(m1, "refused") - h2_count(m0, "refused"), 5)
        self.still_serving()

    def test_rapid_reset_gets_goaway(self):
        m0 = scrape_port(self.kwc)
        rc = RawConn(self.kwc.port)
        self.addCleanup(rc.close)
        path = self.waiting_path()
        sid, sent, goaway = 1, 0, None
        # HEADERS + RST_STREAM pairs in batches, each batch followed by a PING:
        # its ACK says kwc has processed the batch (no bytes left unread when
        # it closes, which would turn its GOAWAY into a TCP reset)
        for batch in range(100):
            fr = []
            for _ in range(20):
                fr += [rc.headers(sid, "GET", path), hf.RstStreamFrame(sid, error_code=ERR.CANCEL)]
                sid += 2
                sent += 1
            fr.append(hf.PingFrame(0, opaque_data=b"batch%03d" % batch))
            rc.send(*fr)
            f = rc.until(lambda f: isinstance(f, hf.GoAwayFrame) or (
                isinstance(f, hf.PingFrame) and "ACK" in f.flags), 30, "PING ACK or GOAWAY")
            if f is None or isinstance(f, hf.GoAwayFrame):
                goaway = f
                break
        self.assertIsNotNone(goaway, "kwc took %d stream resets without a GOAWAY" % sent)
        self.assertEqual(goaway.error_code, ERR.ENHANCE_YOUR_CALM)
        # kube's own client cancels its watches: a burst of a connection's
        # worth of streams is allowed
        self.assertGreaterEqual(sent, 2 * self.MAX_STREAMS, "GOAWAY too early")
        self.assertLessEqual(sent, 2000)
        rc.drain_to_eof(30)
        m1 = scrape_port(self.kwc)
        self.assertEqual(h2_count(m1, "goaways") - h2_count(m0, "goaways"), 1)
        self.assertGreaterEqual(h2_count(m1, "client") - h2_count(m0, "client"), 2 * self.MAX_STREAMS)
        self.still_serving()

    def test_header_list_over_max_header_bytes(self):
        c = Connection(self.kwc.port)
        self.addCleanup(c.close)
        self.assertEqual(c.server_settings.get(h2client.S.MAX_HEADER_LIST_SIZE), self.HEADER_BYTES)
        # within the limit (fields count name + value + 32, RFC 9113 6.5.2)
        ok = {"x-pad": "a" * (self.HEADER_BYTES - 1024)}
        self.assertEqual(c.request("GET", "/api/v1/pods?resourceVersion=0&limit=1", dict(JSON, **ok))[0], 200)
        # over it, in several CONTINUATION frames: 431, and kwc decodes
        # nothing past the field that passed the limit, so the connection
        # ends (GOAWAY ENHANCE_YOUR_CALM naming the 431's stream as the last)
        big = {"x-pad-%d" % i: "b" * 8000 for i in range(4)}
        st, h, b = c.request("GET", "/api/v1/pods?resourceVersion=0&limit=1", dict(JSON, **big))
        self.assertEqual(st, 431, b[:300])
        d = json.loads(b)
        self.assertEqual((d["kind"], d["code"]), ("Status", 431))
        c.pump(lambda: c.goaway is not None, 30)
        self.assertEqual(c.goaway.error_code, ERR.ENHANCE_YOUR_CALM)
        # a new connection is served
        c2 = Connection(self.kwc.port)
        self.addCleanup(c2.close)
        self.assertEqual(c2.request("GET", "/api/v1/pods?resourceVersion=0&limit=1", JSON)[0], 200)
        self.still_serving()

    def test_hpack_bomb(self):
        # one 4000-byte field in the HPACK table, then 100 one-byte references
        # to it: a 4 KB block that decodes to 400 KB. The decoded size is what
        # counts: 431 once the list passes the limit, then GOAWAY (the rest
        # of the block is never decoded)
        rc = RawConn(self.kwc.port)
        self.addCleanup(rc.close)
        f = rc.headers(1, "GET", "/api/v1/pods?resourceVersion=0&limit=1",
                       [("accept", "application/json")] + [("x-bomb", "a" * 4000)] * 100)
        self.assertLess(len(f.data), 8192)
        rc.send(f)
        r = rc.until(lambda f: f.stream_id in (0, 1) and isinstance(f, (hf.HeadersFrame, hf.RstStreamFrame,
                                                                        hf.GoAwayFrame)), 30, "the answer")
        self.assertIsInstance(r, hf.HeadersFrame, r)
        self.assertEqual(h2client.status_of(r), 431)
        g = rc.goaway(30)
        self.assertIsNotNone(g)
        self.assertEqual((g.error_code, g.last_stream_id), (ERR.ENHANCE_YOUR_CALM, 1))
        rc.drain_to_eof(30)
        # one reference within the limit, on a new connection, is served
        rc2 = RawConn(self.kwc.port)
        self.addCleanup(rc2.close)
        rc2.send(rc2.headers(1, "GET", "/api/v1/pods?resourceVersion=0&limit=1", [("accept", "application/json"),
                                                                                  ("x-bomb", "a" * 4000)]))
        r = rc2.until(lambda f: f.stream_id in (0, 1) and isinstance(f, (hf.HeadersFrame, hf.GoAwayFrame)), 30,
                      "the answer to a request within the limit")
        self.assertEqual(h2client.status_of(r), 200)

    def test_continuation_flood_ends_the_connection(self):
        rc = RawConn(self.kwc.port)
        self.addCleanup(rc.close)
        h = rc.headers(1, "GET", "/api/v1/pods?resourceVersion=0", end_stream=True)
        h.flags.discard("END_HEADERS")
        flood = b"".join(hf.ContinuationFrame(1, data=b"").serialize() for _ in range(1000))
        pad = hf.ContinuationFrame(1, data=rc.enc.encode([("x-a", "b")])).serialize()
        sent = 0
        try:
            rc.send(h)
            # empty frames, and frames of small fields: neither may go on
            # without end (nor without bound in memory); 100,000 frames at most
            for i in range(100):
                rc.send_bytes(flood if i % 2 == 0 else pad * 1000)
                sent += 1000
        except (BrokenPipeError, ConnectionResetError):
            pass  # kwc closed while the flood went on: that is the answer
        # kwc ends the connection (GOAWAY, then close) after a bounded number
        # of frames; its header and idle timeouts are 300 s here, so no timer
        # ends it within this bound
        frames = rc.drain_to_eof(60)
        self.assertFalse(any(isinstance(f, hf.HeadersFrame) for f in frames), "a flooded request was answered")
        gos = [f for f in frames if isinstance(f, hf.GoAwayFrame)]
        if gos:
            self.assertNotEqual(gos[-1].error_code, ERR.NO_ERROR)
        self.still_serving()

    def test_ping_and_settings_flood(self):
        # a client that floods PINGs and SETTINGS and reads nothing: kwc's
        # ACKs pile up in no queue of its own beyond a bound; it stops
        # reading or closes, and the connection does not outlive the idle
        # timeout (here 2 s) once its output stalls
        k = self.start("--idle-timeout", "2s", name="kwc-flood")
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", k.port))
        self.addCleanup(s.close)
        s.sendall(h2client.PREFACE + hf.SettingsFrame(0).serialize())
        one = hf.PingFrame(0, opaque_data=b"flood!!!").serialize() + hf.SettingsFrame(
            0, settings={hf.SettingsFrame.INITIAL_WINDOW_SIZE: 65535}).serialize()
        batch = one * 1000
        s.setblocking(False)
        sent, limit = 0, 200000
        blocked = closed = False
        while sent < limit:
            try:
                n = s.send(batch)
            except BlockingIOError:
                blocked = True  # kwc reads no more from us
                break
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            sent += n // len(one)
            if n < len(batch):
                blocked = True
                break
        self.assertTrue(blocked or closed, "kwc took %d PINGs and SETTINGS without reading less" % sent)
        # then kwc closes the connection: everything it sent, then EOF
        s.setblocking(True)
        s.settimeout(60)
        while True:
            try:
                d = s.recv(1 << 16)
            except (ConnectionResetError, BrokenPipeError):
                break
            if not d:
                break
        self.assertEqual(k.stop(), 0, k.logs())
        self.still_serving()

    def test_zero_window_stall_is_bounded_by_the_idle_timeout(self):
        # a client that asks for a list and never opens its window (initial
        # window 0): kwc's answer cannot leave; the connection is closed once
        # its output has made no progress for --idle-timeout (2 s here; the
        # test's own bound is 60 s), and kwc goes on
        k = self.start("--idle-timeout", "2s", name="kwc-stall")
        rc = RawConn(k.port, settings={hf.SettingsFrame.INITIAL_WINDOW_SIZE: 0})
        self.addCleanup(rc.close)
        rc.send(rc.headers(1, "GET", "/api/v1/pods?resourceVersion=0", [("accept", "application/json")]))
        frames = rc.drain_to_eof(60)
        self.assertTrue(any(isinstance(f, hf.HeadersFrame) and f.stream_id == 1 for f in frames), frames)
        self.assertFalse(any(isinstance(f, hf.DataFrame) and f.data for f in frames), "DATA past a zero window")
        self.assertEqual(k.stop(), 0, k.logs())
        self.still_serving()

    def test_upgrade_over_h2_is_a_stream_error(self):
        rc = RawConn(self.kwc.port)
        self.addCleanup(rc.close)
        exec_path = "/api/v1/namespaces/ns-0/pods/pod-0/exec?command=ls&stdout=true"
        tries = [
            (1, [("connection", "Upgrade"), ("upgrade", "SPDY/3.1"), ("x-stream-protocol-version", "v4.channel.k8s.io")]),
            (3, [("upgrade", "websocket"), ("sec-websocket-version", "13"), ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")]),
            (5, [("connection", "keep-alive")]),
        ]
        for sid, extra in tries:
            rc.send(rc.headers(sid, "GET", exec_path, extra))
            f = rc.until(lambda f: f.stream_id in (0, sid) and isinstance(
                f, (hf.RstStreamFrame, hf.HeadersFrame, hf.GoAwayFrame)), 30, "the answer to stream %d" % sid)
            self.assertIsInstance(f, hf.RstStreamFrame, "stream %d: %r (%s)" % (sid, f, extra))
            self.assertEqual(f.error_code, ERR.PROTOCOL_ERROR)
        rc.send(rc.headers(7, "GET", "/api/v1/pods?resourceVersion=0&limit=1", [("accept", "application/json")]))
        f = rc.until(lambda f: f.stream_id in (0, 7) and isinstance(f, (hf.HeadersFrame, hf.GoAwayFrame)), 30,
                     "a GET after the upgrade attempts")
        self.assertEqual(h2client.status_of(f), 200)


@only_in_plaintext_run(Http2Case.only_in_plaintext_run)
class Shutdown(Http2Case):
    apisim_args = ["--pods", "200", "--pod-size", "4000"]

    def test_sigterm_goaway_open_stream_finishes(self):
        k = self.start()
        path = "/api/v1/pods?resourceVersion=0"
        want = h1_request(k.port, "GET", path, JSON)[2]
        self.assertGreater(len(want), 1 << 19)
        c = Connection(k.port, window=1 << 20, initial_window=16384)
        self.addCleanup(c.close)
        # an open stream the client reads slowly: its window is exhausted
        st = c.open("GET", path, JSON, window=16384, paused=True)
        c.pump(lambda: sum(n for _, n in st._held) >= 16384, 30, "the stream's window")
        os.kill(k.pid(), signal.SIGTERM)
        # (whatever happens below, kwc gets no second signal: its exit status
        # is the one SIGTERM's shutdown gives)
        self.addCleanup(lambda: k.p.poll() is not None or k.p.wait(60))
        c.pump(lambda: c.goaway is not None, 30, "GOAWAY")
        self.assertEqual(c.goaway.error_code, ERR.NO_ERROR)
        self.assertGreaterEqual(c.goaway.last_stream_id, st.id)
        self.assertFalse(st.closed)
        st.paused = False
        status, h, body = st.result(60)
        self.assertEqual((status, body), (200, want))
        # then the connection closes and kwc exits 0
        c.pump(lambda: c.closed, 30, "kwc to close the connection")
        self.assertEqual(k.p.wait(30), 0, k.logs())


if __name__ == "__main__":
    unittest.main()
