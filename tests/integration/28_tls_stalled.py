"""A watcher that stops reading over TLS lags and catches up exactly as over
plaintext (issue 22's correctness requirement).

Two kwc processes front one apisim: one serving TLS, one plaintext. On each,
from the same resourceVersion, two watchers of the pods: a live one that
reads all along, and a stalled one (a small SO_RCVBUF; over TLS a raw ssl
socket) that stops reading while the pods churn (bursts of 500 updates of
4 KB pods: 2 MB a burst, 10 bursts, far past the socket buffers and kwc's
64 KiB per-watcher budget). Each burst waits until both live watchers have
read it: the stalled one never holds the live one up. Both stalled watchers
must turn lagging (kwc_watchers_lagging), then read again. kwc keeps its
whole history here (the defaults), so a lagging watcher is never expired:
it catches up from the window (4 MiB, smaller than what it missed) and the
store. Then each stalled watcher has every event, in order, no gap, no
duplicate, byte for byte what its live neighbour got, and the TLS one got
exactly the plaintext one's lines.

Everything waits on a condition (pump/wait_for with a timeout), never on a
sleep; the timeouts only bound a failure.
"""
import os
import unittest

import certs
from cluster import KWC_BIN, KWC_EXTRA_ARGS, ClientTLS, Env, Proc, http_request, only_in_plaintext_run, only_over_http1, wait_for
from scrape import scrape, total
from watchstream import Stream, pump

P = certs.pki()
BURST = 500
BURSTS = 10


def obj_rv(e):
    return int(e["object"]["metadata"]["resourceVersion"])


def lagging(port):
    return total(scrape(port), "kwc_watchers_lagging", group="", version="v1", resource="pods", encoding="json")


def kwc_rv(port):
    """The rv of kwc's pods cache; 0 while it is not serving from the cache."""
    import json
    st, _, b = http_request(port, "GET", "/api/v1/pods?resourceVersion=0&limit=1")
    return int(json.loads(b)["metadata"]["resourceVersion"]) if st == 200 else 0


@only_in_plaintext_run("sets kwc's TLS up itself and runs plaintext beside it")
@only_over_http1("HTTP/1.1 streams; 26_http2 has the paused HTTP/2 stream")
class StalledTlsReader(unittest.TestCase):
    def setUp(self):
        self.env = Env(apisim_args=["--pods", "30", "--pod-size", "4000"], start_kwc=False)
        self.procs = []

    def tearDown(self):
        codes = [(p.name, p.stop()) for p in self.procs if p.port is not None]
        self.env.close()
        self.assertEqual([c for c in codes if c[1] != 0], [], "kwc exit status")

    def run(self, result=None):
        before = len(result.failures) + len(result.errors) if result else 0
        r = super().run(result)
        if result and len(result.failures) + len(result.errors) > before:
            self.env.dump_logs()
            for p in self.procs:
                print("---- %s log (%s) ----\n%s" % (p.name, p.log_path, p.logs()))
        return r

    def start(self, name, tls):
        flags = ["--upstream", "http://127.0.0.1:%d" % self.env.apisim.port, "--listen", "127.0.0.1:0",
                 "--data-dir", os.path.join(self.env.dir, "data-" + name), "--auth", "none",
                 "--resources", "v1/pods", "--watch-budget", "65536", "--watch-window", "4194304"]
        if tls:
            flags += ["--tls-cert-file", P.server.crt, "--tls-private-key-file", P.server.key]
        p = Proc(name, [KWC_BIN] + KWC_EXTRA_ARGS + flags, self.env.dir, tls=ClientTLS(P.ca.crt) if tls else None)
        self.procs.append(p)
        p.start()
        wait_for(lambda: http_request(p.port, "GET", "/readyz", timeout=5)[0] == 200, 30, name + " /readyz")
        return p

    def test_stalled_reader_catches_up_as_over_plaintext(self):
        tls = self.start("kwc-tls", True)
        plain = self.start("kwc-plain", False)
        self.env.sim("POST", "/apisim/churn", {"rate": 0})
        r0 = self.env.stats()["rv"]
        for p in (tls, plain):
            wait_for(lambda p=p: kwc_rv(p.port) >= r0, 30, "%s to reach rv %d" % (p.name, r0))
        path = "/api/v1/pods?watch=1&resourceVersion=%d" % r0
        w = {}
        for p in (tls, plain):
            w[p.name] = (Stream(p.port, path, rcvbuf=4096), Stream(p.port, path))
        stalled = [s for s, _ in w.values()]
        live = [l for _, l in w.values()]
        self.assertTrue(any(s.s.__class__.__name__ == "SSLSocket" for s in stalled), "a TLS stream")
        pump(stalled + live, lambda: all(s.status == 200 for s in stalled + live), 30, "the streams' heads")
        for s in stalled:
            s.paused = True
        final = r0
        for i in range(BURSTS):
            final = self.env.sim("POST", "/apisim/churn", {"count": BURST, "resources": ["pods"],
                                                          "mix": {"update": 1.0}})["rv"]
            # the live watchers get every event of the burst while the stalled
            # ones read nothing (the timeout only bounds a failure)
            pump(live, lambda: all(l.last_rv() == final for l in live), 120,
                 "the live watchers to read burst %d (rv %d)" % (i, final))
        for l in live:
            self.assertEqual(len(l.events), BURSTS * BURST)
        for p in (tls, plain):
            wait_for(lambda p=p: lagging(p.port) == 1, 60, "%s's stalled watcher, and it alone, to lag" % p.name)
        for name, (s, _) in w.items():
            print("\n    %s: the stalled watcher had read %d of %d events"
                  % (name, len(s.events), BURSTS * BURST))
            self.assertLess(len(s.events), BURSTS * BURST, "the stalled watcher got everything while stalled")
            s.paused = False
        pump(stalled + live, lambda: all(s.last_rv() == final for s in stalled), 120, "the stalled watchers to catch up")
        for p in (tls, plain):
            wait_for(lambda p=p: lagging(p.port) == 0, 60, "%s's stalled watcher to be live again" % p.name)
        for name, (s, l) in w.items():
            rvs = [obj_rv(e) for e in s.events]
            self.assertEqual([e["type"] for e in s.events], ["MODIFIED"] * len(s.events), name)
            self.assertEqual(rvs, sorted(set(rvs)), name + ": events out of order or repeated")
            self.assertEqual(len(s.events), BURSTS * BURST, name + ": events lost")
            self.assertTrue(s.lines == l.lines, name + ": the stalled watcher's lines differ from the live one's")
            self.assertFalse(s.ended or s.closed, name + ": the stream ended")
        self.assertTrue(w["kwc-tls"][0].lines == w["kwc-plain"][0].lines,
                        "the stalled TLS watcher's lines differ from the stalled plaintext watcher's")
        for s in stalled + live:
            s.close()


if __name__ == "__main__":
    unittest.main()
