"""A small synchronous HTTP/2 client for kwc's tests, on Debian's python3-h2
(h2, hpack, hyperframe).

  Connection(port)         one HTTP/2 connection: plain TCP with prior
                           knowledge, or TLS with ALPN h2 on a TLS port
                           (cluster's TLS mode: the port's ClientTLS)
  c.request(m, path, ...)  one request -> (status, headers dict, body bytes)
  c.open(m, path, ...)     a Stream (many may be open at once on c)
  c.read_some(block)       read what the socket has, dispatch it to streams
  c.pump(until, timeout)   read until until() holds
  c.ping(), c.goaway       PINGs; the GOAWAY the server sent (or None)
  Stream.paused            True: the stream's flow-control window is no longer
                           acknowledged (its DATA is held, unread, as a
                           socket's unread bytes would be) while every other
                           stream of the connection goes on
  Stream.reset(code)       RST_STREAM
  Stream.sink              a callable fed each piece of body (watch parsing)
  RawConn(port)            frames by hand (hyperframe + hpack), for the
                           hostile cases a correct client cannot produce

python3-h2 drops a connection on the first frame after a GOAWAY; a server's
graceful GOAWAY lets open streams finish, so Connection records the GOAWAY and
goes on reading them (_H2Conn below).

Flow control: a connection opens its own window wide (1 GiB, as Go does) and
gives each stream the window it asks for: streams start at the connection's
SETTINGS_INITIAL_WINDOW_SIZE and one WINDOW_UPDATE right after the request's
HEADERS widens each to its own size, so small- and large-window streams share
one connection. A stream's consumed bytes are handed back once half its window
is used; a paused stream's are not (until it is unpaused).
"""
import select
import socket
import ssl
import time

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import h2.stream
import hpack
from hyperframe import frame as hf

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
CONN_WINDOW = 1 << 30
DEFAULT_WINDOW = 1 << 20
ERR = h2.errors.ErrorCodes  # NO_ERROR, PROTOCOL_ERROR, REFUSED_STREAM, CANCEL, ENHANCE_YOUR_CALM ...
S = h2.settings.SettingCodes


class H2Error(Exception):
    """The connection failed (socket closed, protocol error, GOAWAY before
    the stream was taken) or a stream was reset."""

    def __init__(self, msg, code=None):
        super().__init__(msg)
        self.code = code


def _tls_for(port):
    import cluster  # cluster imports this module lazily: no import cycle
    return cluster.tls_client(port)


def h2_context(tls):
    """An ssl.SSLContext offering ALPN h2 (only) for a cluster.ClientTLS."""
    if hasattr(tls, "h2_context"):
        return tls.h2_context()
    ctx = ssl.create_default_context(cafile=tls.ca)
    if tls.cert:
        ctx.load_cert_chain(tls.cert, tls.key)
    ctx.set_alpn_protocols(["h2"])
    return ctx


def _connect(port, host, timeout, tls):
    s = socket.create_connection((host, port), timeout)
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls == "auto":
            tls = _tls_for(port)
        if tls:
            s = h2_context(tls).wrap_socket(s, server_hostname=host)
            if s.selected_alpn_protocol() != "h2":
                raise H2Error("ALPN chose %r, not h2" % s.selected_alpn_protocol())
        return s
    except BaseException:
        s.close()
        raise


class _H2Conn(h2.connection.H2Connection):
    """python-h2 with two changes, to act as Go's and nghttp2's clients do:
    - a GOAWAY does not end the connection's reading (RFC 9113 6.8: streams
      up to the last stream id go on);
    - DATA still arriving for a stream this client reset (a cancelled watch
      has a window's worth in flight) is dropped quietly: python-h2 answers
      each such frame with another RST_STREAM, which a server counting
      resets against rapid reset rightly holds against the client. Its
      bytes go back to the connection window (discarded, read by
      Connection)."""

    discarded = 0

    def _handle_data_on_closed_stream(self, events, exc, frame):
        if self._stream_closed_by(frame.stream_id) != h2.stream.StreamClosedBy.SEND_RST_STREAM:
            return super()._handle_data_on_closed_stream(events, exc, frame)
        self.discarded += frame.flow_controlled_length
        return [], events + exc._events

    def _receive_goaway_frame(self, frame):
        ev = h2.events.ConnectionTerminated()
        ev.error_code = h2.errors._error_code_from_int(frame.error_code)
        ev.last_stream_id = frame.last_stream_id
        ev.additional_data = frame.additional_data or None
        return [], [ev]


class Stream:
    """One request/response on a Connection."""

    def __init__(self, conn, sid, method, path, window):
        self.conn, self.id, self.method, self.path = conn, sid, method, path
        self.window = window
        self.status = None
        self.headers = {}       # lower-case name -> value (the last one of a repeated name)
        self.header_list = []   # [(name, value)] as they came
        self.trailers = None
        self.body = bytearray()  # when no sink is set
        self.bytes = 0           # DATA bytes delivered
        self.ended = False       # END_STREAM seen (and delivered)
        self.closed = False      # no more will come: ended, reset, or the connection gone
        self.reset_code = None   # RST_STREAM's code (ours or the server's)
        self.remote_reset = False
        self.refused_by_goaway = False  # past a GOAWAY's last stream id: never processed
        self.sink = None         # callable(bytes)
        self.on_head = None      # callable(stream) once the response head is in
        self._paused = False
        self._held = []          # [(data, flow-controlled length)] while paused
        self._held_end = None    # ("end" | "reset" | "gone", arg) seen while paused
        self._unacked = 0

    # -- flow control ------------------------------------------------------------
    @property
    def paused(self):
        return self._paused

    @paused.setter
    def paused(self, v):
        v = bool(v)
        if v == self._paused:
            return
        self._paused = v
        if not v:
            held, self._held = self._held, []
            for data, n in held:
                self._deliver(data, n)
            end, self._held_end = self._held_end, None
            if end:
                self._finish(*end)
            self.conn.flush()

    def _data(self, data, n):
        if self._paused:
            self._held.append((data, n))
        else:
            self._deliver(data, n)

    def _deliver(self, data, n):
        self.bytes += len(data)
        if data:
            if self.sink:
                self.sink(data)
            else:
                self.body += data
        self._unacked += n
        if self._unacked >= self.window // 2 and not self.closed:
            self.conn._window_update(self.id, self._unacked)
            self._unacked = 0

    def _end(self, kind, arg=None):
        if self._paused and (self._held or kind == "end"):
            self._held_end = (kind, arg)
        else:
            self._finish(kind, arg)

    def _finish(self, kind, arg):
        if self.closed:
            return
        if kind == "end":
            self.ended = True
        elif kind == "reset":
            self.reset_code, self.remote_reset = arg, True
        self.closed = True

    def reset(self, code=ERR.CANCEL):
        """RST_STREAM with code; the stream is closed at once."""
        if not self.closed:
            self.reset_code = code
            self.closed = True
            self.conn._reset(self.id, code)

    close = reset

    def send_data(self, data, end_stream=False):
        self.conn._send_body(self.id, data, end_stream)

    def end(self):
        self.conn._send_body(self.id, b"", True)

    def wait(self, timeout=30.0):
        """Read until the stream is over (ended, reset or its connection gone)."""
        self.conn.pump(lambda: self.closed, timeout, "stream %d (%s)" % (self.id, self.path))
        return self

    def result(self, timeout=30.0):
        """(status, headers, body) of a complete response; H2Error if the
        stream was reset or the connection ended first."""
        self.wait(timeout)
        if not self.ended:
            why = "reset by the server (%s)" % _code(self.reset_code) if self.remote_reset else \
                "refused by GOAWAY" if self.refused_by_goaway else "connection closed (%s)" % self.conn.why
            raise H2Error("%s %s: %s" % (self.method, self.path, why), self.reset_code)
        return self.status, dict(self.headers), bytes(self.body)


def _code(c):
    try:
        return ERR(c).name
    except ValueError:
        return str(c)


class Connection:
    """One client connection. window: each stream's receive window (bytes);
    settings: extra SETTINGS for the preface's SETTINGS frame."""

    def __init__(self, port, host="127.0.0.1", tls="auto", timeout=30.0, window=DEFAULT_WINDOW,
                 settings=None, initial_window=None, handshake=True, validate=True):
        self.port, self.host, self.timeout = port, host, timeout
        self.sock = _connect(port, host, timeout, tls)
        self.tls = isinstance(self.sock, ssl.SSLSocket)
        self.scheme = "https" if self.tls else "http"
        self.window = window
        cfg = h2.config.H2Configuration(client_side=True, header_encoding=None,
                                        validate_inbound_headers=validate, normalize_inbound_headers=False)
        self.h2 = _H2Conn(cfg)
        init = {S.MAX_CONCURRENT_STREAMS: 100, S.MAX_HEADER_LIST_SIZE: 1 << 20, S.ENABLE_PUSH: 0,
                S.INITIAL_WINDOW_SIZE: initial_window or min(window, 65535)}
        init.update(settings or {})
        self.h2.local_settings = h2.settings.Settings(client=True, initial_values=init)
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(CONN_WINDOW - 65535)
        self.streams = {}
        self.goaway = None          # the last ConnectionTerminated event (GOAWAY)
        self.goaways = []           # every one, in order
        self.closed = False         # the socket is done (EOF, error)
        self.why = None
        self.ping_acks = []         # opaque data of PING ACKs
        self.server_settings = {}   # what the server's SETTINGS said
        self.settings_seen = False
        self.events = []            # every h2 event, for tests that look at them
        self.discarded = 0          # DATA bytes that came for streams this client had reset
        self._conn_unacked = 0
        self.flush()
        if handshake:
            self.pump(lambda: self.settings_seen, timeout, "the server's SETTINGS")

    # -- socket ----------------------------------------------------------------------
    def fileno(self):
        return self.sock.fileno()

    def flush(self):
        d = self.h2.data_to_send()
        if d and not self.closed:
            try:
                self.sock.sendall(d)
            except OSError as e:
                self._gone("send: %r" % e)

    def _gone(self, why):
        if self.closed:
            return
        self.closed, self.why = True, why
        for s in list(self.streams.values()):
            if not s.closed:
                s._end("gone")
        try:
            self.sock.close()
        except OSError:
            pass

    def close(self):
        """Close the socket (no GOAWAY: a client going away)."""
        self._gone("closed by the client")

    def goaway_and_close(self, code=ERR.NO_ERROR):
        if not self.closed:
            try:
                self.h2.close_connection(code)
            except h2.exceptions.ProtocolError:
                pass
            self.flush()
        self.close()

    def read_some(self, block=False, timeout=None):
        """Read what the socket has (block: wait up to timeout for some) and
        dispatch it. Returns False once the connection is closed."""
        if self.closed:
            return False
        try:
            if not block:
                self.sock.setblocking(False)
            else:
                self.sock.settimeout(self.timeout if timeout is None else timeout)
            while True:
                try:
                    d = self.sock.recv(1 << 20)
                except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError,
                        socket.timeout):
                    return True
                except OSError as e:
                    self._gone("recv: %r" % e)
                    return False
                if not d:
                    self._gone("EOF from the server")
                    return False
                self.receive(d)
                if not (self.tls and self.sock.pending()):
                    return True
        finally:
            if not self.closed:
                self.sock.settimeout(self.timeout)

    def receive(self, d):
        try:
            events = self.h2.receive_data(d)
        except h2.exceptions.ProtocolError as e:
            self.flush()
            self._gone("protocol error: %r" % e)
            raise H2Error("the server broke HTTP/2: %r" % e)
        for ev in events:
            self._event(ev)
        if self.h2.discarded:
            self.discarded += self.h2.discarded
            self._conn_unacked += self.h2.discarded
            self.h2.discarded = 0
            if self._conn_unacked >= (1 << 20):
                self.h2.increment_flow_control_window(self._conn_unacked)
                self._conn_unacked = 0
        self.flush()

    def pump(self, until, timeout=30.0, what="the connection"):
        deadline = time.monotonic() + timeout
        while not until():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out after %.0fs waiting for %s" % (timeout, what))
            if self.closed:
                if until():
                    return
                raise H2Error("connection closed (%s) while waiting for %s" % (self.why, what))
            r, _, _ = select.select([self.sock], [], [], min(left, 0.5)) if not (
                self.tls and self.sock.pending()) else ([self.sock], [], [])
            if r:
                self.read_some()

    # -- events ------------------------------------------------------------------------
    def _event(self, ev):
        self.events.append(ev)
        E = h2.events
        s = self.streams.get(getattr(ev, "stream_id", None) or 0)
        if isinstance(ev, E.ResponseReceived):
            if s:
                s.header_list = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in ev.headers]
                for k, v in s.header_list:
                    if k == ":status":
                        s.status = int(v)
                    else:
                        s.headers[k] = v
                if s.on_head:
                    s.on_head(s)
        elif isinstance(ev, E.TrailersReceived):
            if s:
                s.trailers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in ev.headers]
        elif isinstance(ev, E.DataReceived):
            n = ev.flow_controlled_length
            self._conn_unacked += n
            if self._conn_unacked >= (1 << 20):
                self.h2.increment_flow_control_window(self._conn_unacked)
                self._conn_unacked = 0
            if s:
                s._data(ev.data, n)
        elif isinstance(ev, E.StreamEnded):
            if s:
                s._end("end")
        elif isinstance(ev, E.StreamReset):
            if s and ev.remote_reset:
                s._end("reset", ev.error_code)
        elif isinstance(ev, E.ConnectionTerminated):
            self.goaway = ev
            self.goaways.append(ev)
            for sid, st in self.streams.items():
                if sid > ev.last_stream_id and not st.closed:
                    st.refused_by_goaway = True
                    st._end("gone")
        elif isinstance(ev, E.PingAckReceived):
            self.ping_acks.append(ev.ping_data)
        elif isinstance(ev, E.RemoteSettingsChanged):
            for k, v in ev.changed_settings.items():
                self.server_settings[k] = v.new_value
            self.settings_seen = True

    # -- requests ------------------------------------------------------------------------
    def usable(self):
        """Open, no GOAWAY, room for another stream under the server's limit."""
        if self.closed or self.goaway is not None:
            return False
        # a connection idle in a pool: take what the server said meanwhile
        if not (self.tls and self.sock.pending()):
            r, _, _ = select.select([self.sock], [], [], 0)
        else:
            r = True
        if r:
            self.read_some()
        return not self.closed and self.goaway is None and \
            self.h2.open_outbound_streams < self.h2.remote_settings.max_concurrent_streams

    def open(self, method, path, headers=None, body=None, end_stream=True, window=None, authority=None,
             paused=False):
        """Send a request; returns its Stream. body (bytes) is sent with flow
        control; end_stream=False leaves the request body open (send_data/end)."""
        if self.closed:
            raise H2Error("connection closed (%s)" % self.why)
        if self.goaway is not None:
            raise H2Error("the server sent GOAWAY")
        sid = self.h2.get_next_available_stream_id()
        hdrs = [(":method", method), (":scheme", self.scheme),
                (":authority", authority or "%s:%d" % (self.host, self.port)), (":path", path)]
        for k, v in (headers.items() if isinstance(headers, dict) else headers or ()):
            k = k.lower()
            if k in ("host", "connection", "keep-alive", "transfer-encoding", "proxy-connection"):
                continue
            hdrs.append((k, str(v)))
        w = window or self.window
        st = Stream(self, sid, method, path, w)
        st._paused = paused
        self.streams[sid] = st
        has_body = body is not None and len(body) > 0
        self.h2.send_headers(sid, [(k.encode(), v.encode("latin-1")) for k, v in hdrs],
                             end_stream=end_stream and not has_body)
        initial = self.h2.local_settings.initial_window_size
        if w > initial:
            self.h2.increment_flow_control_window(w - initial, sid)
        self.flush()
        if has_body:
            self._send_body(sid, body, end_stream)
        return st

    def request(self, method, path, headers=None, body=None, timeout=None):
        """(status, headers, body) of one request."""
        return self.open(method, path, headers, body).result(timeout or self.timeout)

    def _send_body(self, sid, data, end_stream):
        data = memoryview(bytes(data))
        while True:
            n = min(len(data), self.h2.local_flow_control_window(sid), self.h2.max_outbound_frame_size)
            if n > 0 or not data:
                self.h2.send_data(sid, bytes(data[:n]), end_stream=end_stream and n == len(data))
                self.flush()
                data = data[n:]
                if not data:
                    return
            st = self.streams.get(sid)
            self.pump(lambda: self.h2.local_flow_control_window(sid) > 0 or (st and st.closed), self.timeout,
                      "window to send the body of stream %d" % sid)
            if st and st.closed:
                return

    def _window_update(self, sid, n):
        try:
            self.h2.increment_flow_control_window(n, sid)
        except (h2.exceptions.StreamClosedError, KeyError, h2.exceptions.ProtocolError):
            pass

    def _reset(self, sid, code):
        try:
            self.h2.reset_stream(sid, code)
        except (h2.exceptions.StreamClosedError, KeyError, h2.exceptions.ProtocolError):
            pass
        self.flush()

    def describe(self, limit=60):
        """Each open stream's flow-control state, for a failure message:
        id:window-left/unacked/held[P(aused)]."""
        out = []
        for sid, st in self.streams.items():
            if st.closed:
                continue
            try:
                left = self.h2._get_stream_by_id(sid)._inbound_window_manager.current_window_size
            except Exception:  # noqa: BLE001 (gone from h2's table)
                left = "?"
            out.append("%d:%s/%d/%d%s" % (sid, left, st._unacked, sum(n for _, n in st._held),
                                          "P" if st.paused else ""))
        more = " ..." if len(out) > limit else ""
        ga = self.goaway
        return "conn %s (%s%s): %s%s" % (
            self.sock.getsockname()[1] if not self.closed else "closed: %s" % self.why,
            "GOAWAY %s last stream %d %r" % (_code(ga.error_code), ga.last_stream_id, ga.additional_data)
            if ga else "no GOAWAY", ", %d streams" % len(self.streams), " ".join(out[:limit]), more)

    def ping(self, data=b"kwc-ping"):
        self.h2.ping(data)
        self.flush()


def request(port, method, path, headers=None, body=None, timeout=30.0, host="127.0.0.1"):
    """One request on a fresh connection, closed after it."""
    c = Connection(port, host=host, timeout=timeout)
    try:
        return c.request(method, path, headers, body)
    finally:
        c.goaway_and_close()


class HTTPResponse:
    """The parts of http.client.HTTPResponse the tests use."""

    def __init__(self, st):
        self.status = st.status
        self.reason = ""
        self.version = 20
        self._headers = [(k, v) for k, v in st.header_list if not k.startswith(":")]
        self._body = bytes(st.body)

    def getheaders(self):
        return list(self._headers)

    def getheader(self, name, default=None):
        vs = [v for k, v in self._headers if k == name.lower()]
        return ", ".join(vs) if vs else default

    def read(self, n=None):
        if n is None:
            b, self._body = self._body, b""
        else:
            b, self._body = self._body[:n], self._body[n:]
        return b


class HTTPConnection:
    """http.client.HTTPConnection's request/getresponse/close over HTTP/2
    (one stream at a time, as http.client)."""

    def __init__(self, port, host="127.0.0.1", timeout=30.0):
        self.port, self.host, self.timeout = port, host, timeout
        self.c = None
        self.st = None

    def request(self, method, path, body=None, headers=None):
        if self.c is None:
            self.c = Connection(self.port, host=self.host, timeout=self.timeout)
        if isinstance(body, str):
            body = body.encode()
        self.st = self.c.open(method, path, headers or {}, body)

    def getresponse(self):
        st, self.st = self.st, None
        st.result(self.timeout)
        return HTTPResponse(st)

    def close(self):
        if self.c:
            self.c.goaway_and_close()
            self.c = None


# ---- frames by hand -----------------------------------------------------------------

class RawConn:
    """An HTTP/2 connection driven frame by frame (hyperframe, hpack): for
    what a correct client library refuses to send. send() takes frames;
    frames() reads and parses what the server sent."""

    def __init__(self, port, host="127.0.0.1", tls="auto", timeout=10.0, settings=None, preface=True):
        self.port, self.host = port, host
        self.sock = _connect(port, host, timeout, tls)
        self.sock.settimeout(timeout)
        self.enc = hpack.Encoder()
        self.dec = hpack.Decoder()
        self.dec.max_allowed_table_size = 65536
        self.buf = b""
        self.eof = False
        self.received = []
        if preface:
            f = hf.SettingsFrame(0)
            for k, v in (settings or {}).items():
                f.settings[k] = v
            self.send_bytes(PREFACE + f.serialize())

    def send_bytes(self, b):
        self.sock.sendall(b)

    def send(self, *frames):
        self.send_bytes(b"".join(f.serialize() for f in frames))

    def block(self, method, path, extra=(), authority=None):
        """An HPACK block for a request."""
        hdrs = [(":method", method), (":scheme", "https" if isinstance(self.sock, ssl.SSLSocket) else "http"),
                (":authority", authority or "%s:%d" % (self.host, self.port)), (":path", path)] + list(extra)
        return self.enc.encode(hdrs)

    def headers(self, sid, method, path, extra=(), end_stream=True):
        f = hf.HeadersFrame(sid)
        f.data = self.block(method, path, extra)
        f.flags.add("END_HEADERS")
        if end_stream:
            f.flags.add("END_STREAM")
        return f

    def _fill(self, timeout):
        if self.eof:
            return False
        self.sock.settimeout(timeout)
        try:
            d = self.sock.recv(1 << 20)
        except socket.timeout:
            return None
        except (ConnectionError, ssl.SSLError, OSError):
            d = b""
        if not d:
            self.eof = True
            return False
        self.buf += d
        return True

    def next_frame(self, timeout=10.0):
        """The next frame (settings ACKed and PINGs answered as a client
        would unless told otherwise), None at EOF; TimeoutError past timeout."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 9:
                f, n = hf.Frame.parse_frame_header(memoryview(self.buf[:9]), strict=False)
                if len(self.buf) >= 9 + n:
                    f.parse_body(memoryview(self.buf[9:9 + n]))
                    self.buf = self.buf[9 + n:]
                    self.received.append(f)
                    if isinstance(f, (hf.HeadersFrame, hf.ContinuationFrame)) and f.data:
                        try:
                            f.decoded = self.dec.decode(f.data)
                        except Exception as e:  # noqa: BLE001 (CONTINUATION pieces do not decode alone)
                            f.decoded = e
                    return f
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame from the server within %.0fs" % timeout)
            r = self._fill(left)
            if r is False:
                return None

    def until(self, pred, timeout=10.0, what="a frame"):
        """Read frames until pred(frame) (returns it), ACKing SETTINGS on the way.
        None at EOF."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out after %.0fs waiting for %s" % (timeout, what))
            f = self.next_frame(left)
            if f is None:
                return None
            if isinstance(f, hf.SettingsFrame) and "ACK" not in f.flags:
                self.send(hf.SettingsFrame(0, flags=["ACK"]))
            if pred(f):
                return f

    def goaway(self, timeout=10.0):
        """The server's GOAWAY frame (None if it closed without one)."""
        return self.until(lambda f: isinstance(f, hf.GoAwayFrame), timeout, "GOAWAY")

    def drain_to_eof(self, timeout=10.0):
        """Every frame until the server closes; TimeoutError if it does not."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the server kept the connection open past %.0fs" % timeout)
            f = self.next_frame(left)
            if f is None:
                return out
            out.append(f)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def status_of(frame):
    """The :status of a decoded HEADERS frame, or None."""
    d = getattr(frame, "decoded", None)
    if isinstance(d, list):
        for k, v in d:
            if k in (":status", b":status"):
                return int(v)
    return None
