#!/usr/bin/env python3
"""The attacker for bench/run.py slowloris: many connections that never finish
a request head. Its own process, so the normal client bench/run.py times
meanwhile does not share an interpreter lock with it.

  slowloris.py --port P --mode slowloris --conns N --seconds S [--tls --cacert F]
  slowloris.py --port P --mode flood --conns M --seconds S

slowloris: N connections, at most 200 connecting at a time (over TLS each
completes its handshake), send a request line and one header, then one more
header line every --trickle seconds, never the blank line that ends the
head. flood: M connections opened as fast as the kernel takes them, sending
nothing (over TLS, not even a ClientHello: the server's timer must cover the
handshake too).

Every connection is watched until the server answers it: bytes (the first
line is kept: a 408, a 503, a TLS alert...), a close or a reset. Its hold
time runs from the TCP connection's establishment to that answer. Prints
{"ready": ...} once every connection is set up, then, --seconds later, one
JSON line: counts, the answers as [hold seconds, kind] and what never got one.
"""
import argparse
import errno
import json
import resource
import selectors
import socket
import ssl
import sys
import time

HEAD = b"GET /api/v1/namespaces/ns-0/pods/slow?resourceVersion=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n"


class Conn:
    __slots__ = ("sock", "state", "t_start", "t_est", "kind", "t_ans")

    def __init__(self, sock, now):
        self.sock, self.state, self.t_start = sock, "connecting", now
        self.t_est = self.kind = self.t_ans = None


def kind_of(data):
    if data.startswith(b"HTTP/"):
        return data.split(b"\r\n", 1)[0].decode("latin-1")[:40]
    if data[:1] == b"\x15":
        return "TLS alert"
    return "%d other bytes" % len(data)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", choices=("slowloris", "flood"), required=True)
    ap.add_argument("--conns", type=int, required=True)
    ap.add_argument("--seconds", type=float, required=True, help="held this long once all are set up")
    ap.add_argument("--trickle", type=float, default=1.0)
    ap.add_argument("--tls", action="store_true")
    ap.add_argument("--cacert")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    ctx = None
    if a.tls and a.mode == "slowloris":
        ctx = ssl.create_default_context(cafile=a.cacert) if a.cacert else ssl._create_unverified_context()
    sel = selectors.DefaultSelector()
    conns, t0 = [], time.monotonic()
    inflight = 200 if a.mode == "slowloris" else a.conns
    opened = pending = 0
    failed = {}

    def answer(c, kind, now):
        if c.state == "done":
            return
        c.kind, c.t_ans, c.state = kind, now, "done"
        try:
            sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()

    def open_more(now):
        nonlocal opened, pending
        while opened < a.conns and pending < inflight:
            s = socket.socket()
            s.setblocking(False)
            c = Conn(s, now)
            conns.append(c)
            opened += 1
            pending += 1
            rc = s.connect_ex(("127.0.0.1", a.port))
            if rc not in (0, errno.EINPROGRESS):
                pending -= 1
                failed[errno.errorcode.get(rc, str(rc))] = failed.get(errno.errorcode.get(rc, str(rc)), 0) + 1
                c.state = "failed"
                s.close()
                continue
            sel.register(s, selectors.EVENT_WRITE, c)

    def established(c, now):
        nonlocal pending
        pending -= 1
        c.t_est = now
        if a.mode == "flood":
            c.state = "open"
            sel.modify(c.sock, selectors.EVENT_READ, c)
            return
        if ctx:
            c.sock = ctx.wrap_socket(c.sock, server_hostname="127.0.0.1", do_handshake_on_connect=False)
            c.state = "handshake"
            handshake(c, now)
            return
        send_head(c, now)

    def handshake(c, now):
        try:
            c.sock.do_handshake()
        except ssl.SSLWantReadError:
            sel.modify(c.sock, selectors.EVENT_READ, c)
            return
        except ssl.SSLWantWriteError:
            sel.modify(c.sock, selectors.EVENT_WRITE, c)
            return
        except (ssl.SSLError, OSError) as e:
            answer(c, "handshake failed: %s" % type(e).__name__, now)
            return
        send_head(c, now)

    def send_head(c, now):
        try:
            c.sock.send(HEAD)
        except (ssl.SSLError, OSError) as e:
            answer(c, "send failed: %s" % type(e).__name__, now)
            return
        c.state = "open"
        sel.modify(c.sock, selectors.EVENT_READ, c)

    def readable(c, now):
        try:
            data = c.sock.recv(4096)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            return
        except ConnectionResetError:
            answer(c, "reset", now)
            return
        except (ssl.SSLError, OSError) as e:
            answer(c, "error: %s" % type(e).__name__, now)
            return
        answer(c, kind_of(data) if data else "close", now)

    ready_at = deadline = None
    next_trickle = None
    while True:
        now = time.monotonic()
        if ready_at is None:
            open_more(now)
            if opened == a.conns and pending == 0 and all(c.state != "handshake" for c in conns):
                ready_at, deadline = now, now + a.seconds
                next_trickle = now + a.trickle
                print(json.dumps({"ready": round(now - t0, 3)}), flush=True)
            elif now - t0 > 120:
                ready_at, deadline = now, now + a.seconds
                next_trickle = now + a.trickle
                print(json.dumps({"ready": round(now - t0, 3), "incomplete": True}), flush=True)
        if deadline and now >= deadline:
            break
        if next_trickle and now >= next_trickle and a.mode == "slowloris":
            for c in conns:
                if c.state == "open":
                    try:
                        c.sock.send(b"X-Slow: 1\r\n")
                    except (ssl.SSLWantWriteError, BlockingIOError):
                        pass
                    except (ssl.SSLError, OSError) as e:
                        answer(c, "reset" if isinstance(e, ConnectionResetError) else "send failed", now)
            next_trickle = now + a.trickle
        for key, _ in sel.select(0.05):
            c = key.data
            now = time.monotonic()
            if c.state == "connecting":
                err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    pending -= 1
                    name = errno.errorcode.get(err, str(err))
                    failed[name] = failed.get(name, 0) + 1
                    c.state = "failed"
                    sel.unregister(c.sock)
                    c.sock.close()
                else:
                    established(c, now)
            elif c.state == "handshake":
                handshake(c, now)
            elif c.state == "open":
                readable(c, now)
    end = time.monotonic()
    answers = [[round(c.t_ans - c.t_est, 4), c.kind] for c in conns if c.state == "done" and c.t_est]
    out = {
        "mode": a.mode, "conns": a.conns, "setup_s": round(ready_at - t0, 3),
        "established": sum(1 for c in conns if c.t_est is not None),
        "connect_failed": failed,
        "connecting_at_end": sum(1 for c in conns if c.state == "connecting"),
        "open_at_end": sum(1 for c in conns if c.state in ("open", "handshake")),
        "held_to_end_s": round(end - min((c.t_est for c in conns if c.t_est), default=end), 3),
        "answers": answers,
    }
    print(json.dumps(out), flush=True)
    for c in conns:
        if c.state != "done":
            c.sock.close()


if __name__ == "__main__":
    sys.exit(main())
