"""Graceful shutdown (issue 21): SIGTERM drains before kwc exits.

On SIGTERM kwc closes its listeners, sends HTTP/2 clients a GOAWAY with the
last stream id, closes idle HTTP/1.1 connections, ends every watch stream
cleanly and gives the requests in progress --shutdown-drain-grace-period to
finish (proxy/main.c), then frees everything as before and exits 0.

- HTTP/2 (prior knowledge in plaintext, ALPN h2 over TLS), one connection:
  a watch and a large list whose stream window the client keeps shut (the
  list is in progress and cannot finish while it stays shut: no timing).
  After SIGTERM: a GOAWAY (NO_ERROR, last stream id = the list's), the watch
  ends with END_STREAM, a new stream opened after the GOAWAY is never
  answered, a new connection is refused; then the client opens the list's
  window and the list completes with its whole body, the connection closes
  and kwc exits 0, logging "drained" (not the deadline).
- HTTP/1.1: a large list on a client that stopped reading completes after
  SIGTERM; an idle keep-alive connection is closed at once (EOF while the
  list is still in progress).
- A second SIGTERM during the drain stops at once (the list is cut short).
- --shutdown-delay-duration (issue 31): after SIGTERM /readyz fails with
  kube's "[-]shutdown failed" while everything else is served as before: a
  watch open before goes on getting events, new connections are accepted
  and answered (a list, a new watch); a second SIGTERM then stops at once.
  A short delay ends by itself: the drain follows (the watches end cleanly)
  and kwc exits 0 no sooner than the delay. SIGINT skips it.

The HTTP/2 client is Debian's python3-h2 driven by hand, except that GOAWAY
frames are taken out of the byte stream before h2 sees them: h2 closes its
whole state machine on a GOAWAY and then refuses the DATA of the streams
the server is still finishing, which is exactly what this test reads.
(tests/lib/h2client.py, merged since, does the same for 26_http2.py.)
"""
import json
import os
import select
import signal
import socket
import ssl
import time
import unittest

import h2.config
import h2.connection
import h2.events

from cluster import Env, connect, http_request, tls_client, wait_for
from watchstream import Stream, pump, read_until_end

PODS = 1500
POD_SIZE = 8000  # a ~12 MB list: more than the kernel buffers hold
DRAIN_S = 60     # the bound; kwc must be done long before it (it logs which)
GOAWAY = 7


class H2:
    """One HTTP/2 client connection to kwc on a blocking socket read with
    select. Streams in `shut` get no WINDOW_UPDATE (their window stays
    closed); the connection window is opened wide at the start."""

    def __init__(self, port):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        t = tls_client(port)
        if t:
            ctx = ssl.create_default_context(cafile=t.ca)
            if t.cert:
                ctx.load_cert_chain(t.cert, t.key)
            ctx.set_alpn_protocols(["h2"])
            s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
            assert s.selected_alpn_protocol() == "h2", s.selected_alpn_protocol()
        self.s = s
        self.port = port
        self.c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.c.initiate_connection()
        self.c.increment_flow_control_window(256 << 20)
        self.eof = False
        self.send()
        self.buf = b""
        self.goaway = None  # (last_stream_id, error_code)
        self.shut = set()
        self.st = {}  # stream id -> {"status", "body", "ended", "reset"}

    def send(self):
        """Write what h2 has queued. A peer that has closed (a reset, or over
        TLS an EOF without close_notify) is the connection's end, as a read
        of EOF is: pump() and its callers judge whether that was expected."""
        d = self.c.data_to_send()
        if d and not self.eof:
            try:
                self.s.sendall(d)
            except (ConnectionError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
                self.eof = True

    def request(self, path):
        sid = self.c.get_next_available_stream_id()
        self.c.send_headers(sid, [(":method", "GET"), (":scheme", "https" if tls_client(self.port) else "http"),
                                  (":authority", "127.0.0.1:%d" % self.port), (":path", path)],
                            end_stream=True)
        self.st[sid] = {"status": None, "body": b"", "ended": False, "reset": None}
        self.send()
        return sid

    def open_window(self, sid):
        """Give the stream its window back: what it received, and plenty more."""
        self.shut.discard(sid)
        self.c.increment_flow_control_window(64 << 20, stream_id=sid)
        self.send()

    def feed(self, d):
        """Frames to h2, GOAWAY frames aside (recorded here)."""
        self.buf += d
        keep = b""
        while len(self.buf) >= 9:
            n = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + n:
                break
            frame, self.buf = self.buf[:9 + n], self.buf[9 + n:]
            if frame[3] == GOAWAY:
                p = frame[9:]
                self.goaway = (int.from_bytes(p[:4], "big") & 0x7fffffff, int.from_bytes(p[4:8], "big"))
            else:
                keep += frame
        for e in self.c.receive_data(keep) if keep else []:
            st = self.st.get(getattr(e, "stream_id", None))
            if isinstance(e, h2.events.ResponseReceived):
                st["status"] = int(dict(e.headers)[b":status"])
            elif isinstance(e, h2.events.DataReceived):
                st["body"] += e.data
                if e.stream_id not in self.shut:
                    self.c.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                else:
                    # the connection's share only: the stream's window stays shut
                    self.c.increment_flow_control_window(e.flow_controlled_length)
            elif isinstance(e, h2.events.StreamEnded):
                st["ended"] = True
            elif isinstance(e, h2.events.StreamReset):
                st["reset"] = e.error_code
        self.send()

    def pump(self, cond, timeout, what):
        """Read until cond() holds; the timeout is a bound (kwc never answered)."""
        end = time.monotonic() + timeout
        while not cond():
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError("HTTP/2: no %s within %.0f s" % (what, timeout))
            if self.eof:
                raise AssertionError("HTTP/2: the connection closed before %s" % what)
            if not (isinstance(self.s, ssl.SSLSocket) and self.s.pending()):
                select.select([self.s], [], [], left)
            try:
                d = self.s.recv(1 << 20)
            except (BlockingIOError, ssl.SSLWantReadError):
                continue
            except ConnectionError:
                d = b""
            if not d:
                self.eof = True
                continue
            self.feed(d)

    def close(self):
        self.s.close()


def pods_of(body):
    return len(json.loads(body)["items"])


def refused(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        return False
    except ConnectionRefusedError:
        return True


class ShutdownDrain(unittest.TestCase):
    def env(self, drain=DRAIN_S):
        return Env(apisim_args=["--pods", str(PODS), "--pod-size", str(POD_SIZE)],
                   kwc_args=["--resources", "v1/pods", "--shutdown-drain-grace-period", "%ds" % drain])

    def test_http2_goaway_lets_the_list_finish(self):
        with self.env() as e:
            port = e.kwc.port
            c = H2(port)
            w = c.request("/api/v1/pods?watch=1")
            c.pump(lambda: c.st[w]["body"].count(b"\n") >= PODS, 60, "the watch's initial events")
            big = c.request("/api/v1/pods")
            c.shut.add(big)
            # its head and the first window's worth of body: in progress, and
            # stuck there while the client keeps the window shut
            c.pump(lambda: c.st[big]["status"] == 200 and len(c.st[big]["body"]) >= 65535, 60,
                   "the list's head and first window")
            self.assertFalse(c.st[big]["ended"])
            os.kill(e.kwc.pid(), signal.SIGTERM)
            c.pump(lambda: c.goaway is not None and c.st[w]["ended"], 30, "GOAWAY and the watch's end")
            self.assertEqual(c.goaway, (big, 0), "GOAWAY NO_ERROR with the last stream id (the list's)")
            self.assertIsNone(c.st[w]["reset"], "the watch was reset, not ended")
            self.assertTrue(c.st[w]["body"].endswith(b"\n"), "the watch ended inside an event")
            self.assertTrue(refused(port), "a new connection is accepted while draining")
            late = c.request("/api/v1/pods?limit=1")  # after the GOAWAY: past its last stream id
            self.assertGreater(late, c.goaway[0])
            self.assertFalse(c.st[big]["ended"], "the list ended while its window was shut")
            self.assertIsNone(e.kwc.p.poll(), "kwc exited while a list was in progress")
            c.open_window(big)
            c.pump(lambda: c.eof, 60, "the connection's close after the list")
            self.assertTrue(c.st[big]["ended"] and c.st[big]["reset"] is None, "the list did not finish")
            self.assertEqual(pods_of(c.st[big]["body"]), PODS, "the list's body is not whole")
            self.assertEqual(c.st[late]["status"], None, "a stream opened after GOAWAY was answered")
            c.close()
            self.assertEqual(e.kwc.p.wait(DRAIN_S), 0)
            self.assertIn("drained in", e.kwc.logs())
            self.assertNotIn("drain deadline", e.kwc.logs())

    def test_http11_list_finishes_idle_connection_closes(self):
        with self.env() as e:
            port = e.kwc.port
            idle = connect(port)
            idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            head = b""
            while b"ok" not in head:
                head += idle.recv(4096)
            s = connect(port, rcvbuf=4096)
            s.sendall(b"GET /api/v1/pods HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            first = s.recv(4096)
            self.assertTrue(first.startswith(b"HTTP/1.1 200 "), first[:100])
            # s reads no more: the list stays in progress (~12 MB, more than the buffers)
            watch = Stream(port, "/api/v1/pods?watch=1")
            pump([watch], lambda: len(watch.events) == PODS, 60)
            os.kill(e.kwc.pid(), signal.SIGTERM)
            self.assertEqual(idle.recv(4096), b"", "the idle keep-alive connection stays open")
            idle.close()
            read_until_end([watch], 30)
            self.assertTrue(watch.ended, "no terminal chunk on the watch")
            self.assertIsNone(e.kwc.p.poll(), "kwc exited while a list was in progress")
            s.settimeout(60)
            data = first
            while True:
                d = s.recv(1 << 20)
                if not d:
                    break
                data += d
            s.close()
            head, _, body = data.partition(b"\r\n\r\n")
            self.assertIn(b"Transfer-Encoding: chunked", head)
            from cluster import dechunk
            self.assertEqual(pods_of(dechunk(body)), PODS, "the list's body is not whole")
            self.assertEqual(e.kwc.p.wait(DRAIN_S), 0)
            self.assertIn("drained in", e.kwc.logs())

    def test_second_signal_stops_at_once(self):
        with self.env() as e:
            c = H2(e.kwc.port)
            big = c.request("/api/v1/pods")
            c.shut.add(big)
            c.pump(lambda: c.st[big]["status"] == 200, 60, "the list's head")
            os.kill(e.kwc.pid(), signal.SIGTERM)
            c.pump(lambda: c.goaway is not None, 30, "GOAWAY")
            wait_for(lambda: "draining 1 requests" in e.kwc.logs(), 10, "the drain's log line")
            os.kill(e.kwc.pid(), signal.SIGTERM)
            self.assertEqual(e.kwc.p.wait(DRAIN_S), 0)
            self.assertIn("received while draining: closing 1 requests", e.kwc.logs())
            c.pump(lambda: c.eof, 30, "the close")
            self.assertFalse(c.st[big]["ended"], "the list finished with its window shut")
            c.close()


class ShutdownDelay(unittest.TestCase):
    """A few pods: the delay's semantics, not the drain's."""

    def env(self, delay):
        return Env(apisim_args=["--pods", "20"],
                   kwc_args=["--resources", "v1/pods", "--shutdown-delay-duration", delay])

    def write(self, e, name):
        e.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "default",
                                          "name": name})

    def test_readyz_fails_and_serving_goes_on(self):
        with self.env("10m") as e:  # ended by the second signal, never by itself
            port = e.kwc.port
            before = Stream(port, "/api/v1/pods?watch=1")
            pump([before], lambda: len(before.events) == 20, 30)
            os.kill(e.kwc.pid(), signal.SIGTERM)
            wait_for(lambda: http_request(port, "GET", "/readyz")[0] == 503, 30, "/readyz failing")
            st, _, body = http_request(port, "GET", "/readyz?verbose")
            self.assertEqual(st, 503)
            self.assertIn(b"[-]shutdown failed: reason withheld\n", body)
            self.assertIn(b"readyz check failed", body)
            self.assertEqual(http_request(port, "GET", "/livez")[0], 200, "/livez fails while serving")
            # new connections: accepted and answered from the cache
            st, _, body = http_request(port, "GET", "/api/v1/pods?resourceVersion=0")
            self.assertEqual(st, 200)
            self.assertEqual(pods_of(body), 20)
            after = Stream(port, "/api/v1/pods?watch=1&resourceVersion=0")
            pump([after], lambda: len(after.events) == 20, 30)
            self.write(e, "during-delay")
            pump([before, after], lambda: all(any(ev["object"]["metadata"]["name"] == "during-delay"
                                                  for ev in s.events) for s in (before, after)), 30)
            self.assertFalse(before.ended or after.ended, "a watch ended during the delay")
            self.assertIsNone(e.kwc.p.poll(), "kwc exited during the delay")
            os.kill(e.kwc.pid(), signal.SIGTERM)
            self.assertEqual(e.kwc.p.wait(30), 0)
            self.assertIn("received while waiting for --shutdown-delay-duration", e.kwc.logs())

    def test_delay_ends_then_drain(self):
        with self.env("1s") as e:
            w = Stream(e.kwc.port, "/api/v1/pods?watch=1")
            pump([w], lambda: len(w.events) == 20, 30)
            t0 = time.monotonic()
            os.kill(e.kwc.pid(), signal.SIGTERM)
            read_until_end([w], 30)
            self.assertTrue(w.ended, "the watch did not end cleanly after the delay")
            self.assertEqual(e.kwc.p.wait(30), 0)
            self.assertGreaterEqual(time.monotonic() - t0, 1.0, "kwc stopped before the delay passed")
            logs = e.kwc.logs()
            self.assertIn("--shutdown-delay-duration (1.0 s) passed", logs)
            self.assertLess(logs.index("/readyz fails from now on"), logs.index("drained in"))

    def test_sigint_skips_the_delay(self):
        with self.env("10m") as e:
            os.kill(e.kwc.pid(), signal.SIGINT)
            self.assertEqual(e.kwc.p.wait(30), 0)
            self.assertNotIn("/readyz fails from now on", e.kwc.logs())


if __name__ == "__main__":
    unittest.main()
