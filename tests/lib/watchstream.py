"""Raw watch streams for kwc's tests: one non-blocking socket per stream, read
by a selectors loop, so hundreds of streams run in one thread and a test can
stop reading one of them (a slow client) while the others go on.

Each stream keeps the event lines exactly as they arrived (bytes) and their
parsed form; chunked (HTTP/1.1) and close-delimited (HTTP/1.0) bodies both work.
A protobuf watch (Content-Type application/vnd.kubernetes.protobuf;stream=watch)
keeps its frames (without the length prefix) in `lines` and their decoded form
(tests/lib/kpb.py, JSON-shaped) in `events`.
A stream to a TLS port (cluster's TLS mode) is a TLS connection.

In cluster's HTTP/2 mode (KWC_H2=1) a Stream to kwc is an HTTP/2 stream
(tests/lib/h2client.py) and the streams of a test share connections, as
client-go's watches do: a new connection only when the last one is full (the
server's SETTINGS_MAX_CONCURRENT_STREAMS), got GOAWAY or closed. `paused` then
stops acknowledging that stream's flow-control window while the connection
and its other streams go on being read; rcvbuf (a small socket buffer for a
slow HTTP/1.1 client) becomes the stream's receive window. proto is
"HTTP/1.0", "HTTP/1.1" or "HTTP/2.0"; http10=True always speaks HTTP/1.0.
"""
import json
import selectors
import ssl
import time

import kpb
from cluster import connect, speaks_h2

# HTTP/2 mode: a stream's window when the test gives no rcvbuf (client-go's
# is 4 MiB; 1 MiB keeps a paused stream's share small), and the window each
# stream starts with (SETTINGS_INITIAL_WINDOW_SIZE) before its own
# WINDOW_UPDATE widens it, so streams of every window share a connection
H2_WINDOW = 1 << 20
H2_MIN_WINDOW = 4096
_h2_conns = {}  # port -> [h2client.Connection]


def h2_connection(port):
    """A connection to port with room for one more stream."""
    import h2client
    conns = _h2_conns.setdefault(port, [])
    for c in conns:
        if c.usable():
            return c
    c = h2client.Connection(port, timeout=10, window=H2_WINDOW, initial_window=H2_MIN_WINDOW)
    conns[:] = [x for x in conns if not x.closed] + [c]
    return c


def h2_connections():
    """Every connection watch streams have used (for tests that look at them)."""
    return [c for cs in _h2_conns.values() for c in cs]


class Stream:
    def __init__(self, port, path, http10=False, rcvbuf=None, headers=()):
        self.path = path
        self.h2 = None  # the h2client.Stream in HTTP/2 mode
        self._paused = False
        if speaks_h2(port) and not http10:
            self.proto = "HTTP/2.0"
            self.s = None
            self.h2 = h2_connection(port).open("GET", path, list(headers),
                                               window=max(rcvbuf or H2_WINDOW, H2_MIN_WINDOW))
            self.h2.on_head = self._h2_head
            self.h2.sink = self._body
        else:
            self.proto = "HTTP/1.%d" % (0 if http10 else 1)
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
        self._ended = False  # terminal chunk (or close for HTTP/1.0) seen
        self._closed = False  # socket closed by the server
        self.bytes = 0

    # HTTP/2: the stream's state is the h2client.Stream's
    @property
    def ended(self):
        return self.h2.ended if self.h2 else self._ended

    @ended.setter
    def ended(self, v):
        self._ended = v

    @property
    def closed(self):
        return self.h2.closed if self.h2 else self._closed

    @closed.setter
    def closed(self, v):
        self._closed = v

    @property
    def paused(self):
        return self.h2.paused if self.h2 else self._paused

    @paused.setter
    def paused(self, v):
        if self.h2:
            self.h2.paused = v
        else:
            self._paused = v

    def reader(self):
        """What pump() reads: the socket, or the HTTP/2 connection."""
        return self.h2.conn if self.h2 else self

    def fileno(self):
        return self.s.fileno()

    def _h2_head(self, st):
        self.status = st.status
        self.headers = dict(st.headers)
        self.head = "HTTP/2.0 %d\r\n" % st.status + "\r\n".join(
            "%s: %s" % kv for kv in st.header_list if not kv[0].startswith(":"))

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
        self._parse()

    def _body(self, d):
        """HTTP/2: a piece of the body (DATA)."""
        self.bytes += len(d)
        self.body += d
        self._parse()

    def _parse(self):
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
        if self.h2:
            self.h2.reset()  # RST_STREAM (CANCEL), as client-go's cancelled watch
            return
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
                conns = {s.h2.conn for s in streams if s.h2}
                raise TimeoutError("timed out after %.0fs waiting for %s%s" % (
                    timeout, what, "".join("\n  HTTP/2 " + c.describe() for c in conns)))
            # an HTTP/2 connection is read while any of its streams wants
            # reading (a paused stream's DATA is held, its window not given back)
            want = {s.reader() for s in streams if not s.closed and not s.paused}
            for s in reg - want:
                sel.unregister(s)
            for s in want - reg:
                sel.register(s, selectors.EVENT_READ)
            reg = want
            if not reg:
                time.sleep(0.01)
                continue
            ready = [key.fileobj for key, _ in sel.select(0.05)]
            # TLS: records already decrypted are not readable on the fd
            ready += [r for r in reg if r not in ready and isinstance(getattr(r, "sock", None), ssl.SSLSocket)
                      and not r.closed and r.sock.pending()]
            for r in ready:
                r.read_some()
    finally:
        sel.close()


def read_until_end(streams, timeout):
    pump(streams, lambda: all(s.ended or s.closed for s in streams), timeout, "the streams to end")
