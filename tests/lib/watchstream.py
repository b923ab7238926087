"""Raw watch streams for kwc's tests: one non-blocking socket per stream, read
by a selectors loop, so hundreds of streams run in one thread and a test can
stop reading one of them (a slow client) while the others go on.

Each stream keeps the event lines exactly as they arrived (bytes) and their
parsed form; chunked (HTTP/1.1) and close-delimited (HTTP/1.0) bodies both work.
A protobuf watch (Content-Type application/vnd.kubernetes.protobuf;stream=watch)
keeps its frames (without the length prefix) in `lines` and their decoded form
(tests/lib/kpb.py, JSON-shaped) in `events`.
A stream to a TLS port (cluster's TLS mode) is a TLS connection.
"""
import json
import selectors
import ssl
import time

import kpb
from cluster import connect


class Stream:
    def __init__(self, port, path, http10=False, rcvbuf=None, headers=()):
        self.path = path
        self.s = connect(port, timeout=10, rcvbuf=rcvbuf)
        hdrs = "".join("%s: %s\r\n" % h for h in headers)
        self.s.sendall(("GET %s HTTP/1.%d\r\nHost: 127.0.0.1:%d\r\n%s\r\n"
                        % (path, 0 if http10 else 1, port, hdrs)).encode())
        self.s.setblocking(False)
        self.buf = b""
        self.body = b""
        self.head = None
        self.status = None
        self.headers = {}
        self.chunked = False
        self.lines = []    # raw event lines (no trailing newline)
        self.events = []   # parsed
        self.ended = False  # terminal chunk (or close for HTTP/1.0) seen
        self.closed = False  # socket closed by the server
        self.paused = False
        self.bytes = 0

    def fileno(self):
        return self.s.fileno()

    def feed(self, d):
        self.bytes += len(d)
        self.buf += d
        if self.head is None:
            i = self.buf.find(b"\r\n\r\n")
            if i < 0:
                return
            self.head, self.buf = self.buf[:i].decode("latin-1"), self.buf[i + 4:]
            first, *rest = self.head.split("\r\n")
            self.status = int(first.split()[1])
            for h in rest:
                k, _, v = h.partition(":")
                self.headers[k.strip().lower()] = v.strip()
            self.chunked = self.headers.get("transfer-encoding", "") == "chunked"
        if self.chunked:
            while True:
                i = self.buf.find(b"\r\n")
                if i < 0:
                    break
                n = int(self.buf[:i], 16)
                if len(self.buf) < i + 2 + n + 2:
                    break
                self.body += self.buf[i + 2:i + 2 + n]
                self.buf = self.buf[i + 2 + n + 2:]
                if n == 0:
                    self.ended = True
                    break
        else:
            self.body += self.buf
            self.buf = b""
        if self.headers.get("content-type") == kpb.CT_WATCH:
            fr, self.body = kpb.frames(self.body)
            for f in fr:
                self.lines.append(f)
                self.events.append(kpb.watch_event(f))
            return
        while True:
            j = self.body.find(b"\n")
            if j < 0:
                break
            line, self.body = self.body[:j], self.body[j + 1:]
            self.lines.append(line)
            self.events.append(json.loads(line))

    def read_some(self):
        while True:
            try:
                d = self.s.recv(1 << 20)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except ConnectionError:
                d = b""
            if not d:
                self.closed = True
                if self.head is not None and not self.chunked:
                    self.ended = True
                return
            self.feed(d)
            # TLS: bytes already decrypted are not readable on the fd: take them now
            if not isinstance(self.s, ssl.SSLSocket) or not self.s.pending():
                return

    def close(self):
        try:
            self.s.close()
        except OSError:
            pass
        self.closed = True

    # event helpers
    def last_rv(self):
        for e in reversed(self.events):
            rv = e["object"].get("metadata", {}).get("resourceVersion")
            if rv and e["type"] != "ERROR":
                return int(rv)
        return None

    def non_bookmarks(self):
        return [l for l, e in zip(self.lines, self.events) if e["type"] != "BOOKMARK"]


def pump(streams, until, timeout, what="streams"):
    """Read every open, unpaused stream until until() is true or timeout passes."""
    sel = selectors.DefaultSelector()
    reg = set()
    deadline = time.monotonic() + timeout
    try:
        while True:
            if until():
                return
            if time.monotonic() > deadline:
                raise TimeoutError("timed out after %.0fs waiting for %s" % (timeout, what))
            want = {s for s in streams if not s.closed and not s.paused}
            for s in reg - want:
                sel.unregister(s)
            for s in want - reg:
                sel.register(s, selectors.EVENT_READ)
            reg = want
            if not reg:
                time.sleep(0.01)
                continue
            for key, _ in sel.select(0.05):
                key.fileobj.read_some()
    finally:
        sel.close()


def read_until_end(streams, timeout):
    pump(streams, lambda: all(s.ended or s.closed for s in streams), timeout, "the streams to end")
