#!/usr/bin/python3
"""Malformed protobuf from the upstream (run by hand, like pbsmoke.py):

    KWC_BIN=$PWD/build/san/kwc /usr/bin/python3 tests/lib/pbfaults.py

A tiny fake upstream serves v1/pods: discovery and JSON as usual, a
protobuf list of one pod, and protobuf watches that send one good event and
then one bad frame of the kind under test (a frame cut short by the end of
the stream, a length past the frame's end inside it, a wrong envelope magic,
a non-empty contentType, a length over kwc's bound). For each, kwc must log
the resource and the reason, watch again, keep serving what it had (the bad
event stored nowhere), and exit cleanly (under ASan: no error). Finally a
JSON answer to a protobuf request: kwc says the upstream does not serve
v1/pods in protobuf and stays ready.
"""
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import KWC_BIN, http_request, wait_for  # noqa: E402

PB = b"application/vnd.kubernetes.protobuf"


def varint(v):
    out = b""
    while v >= 0x80:
        out += bytes([v & 0x7F | 0x80])
        v >>= 7
    return out + bytes([v])


def fld(num, data):
    if isinstance(data, str):
        data = data.encode()
    return varint(num << 3 | 2) + varint(len(data)) + data


def pod(name, rv):
    md = fld(1, name) + fld(3, "default") + fld(6, str(rv))
    return fld(1, md) + fld(2, fld(10, "node-1"))


def envelope(kind, raw, ctype=b"", magic=b"k8s\0"):
    return magic + fld(1, fld(1, "v1") + fld(2, kind)) + fld(2, raw) + fld(3, b"") + fld(4, ctype)


def frame(typ, obj, **kw):
    ev = fld(1, typ) + fld(2, fld(1, envelope("Pod", obj, **kw)))
    return len(ev).to_bytes(4, "big") + ev


BAD = {
    # the stream ends 10 bytes into a 200-byte frame
    "truncated": (200).to_bytes(4, "big") + b"\x0a\x05ADDED\x12\x40\x0a",
    # a field inside the frame claims more bytes than the frame has
    "length past the end": (lambda ev: len(ev).to_bytes(4, "big") + ev)(fld(1, "ADDED") + b"\x12\x7f\x0a\x02"),
    "wrong magic": frame("ADDED", pod("bad", 9), magic=b"k9s\0"),
    "content type": frame("ADDED", pod("bad", 9), ctype=b"application/json"),
    "over the bound": (0xFFFFFFF0).to_bytes(4, "big") + b"\x00" * 16,
}


class Upstream(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.mode = None
        self.json_for_pb = False
        self.pb_watches = 0
        self.open = []  # protobuf watch sockets still open
        self.start()

    def set_mode(self, mode):
        """Faults for the watches from now on; the open ones are cut."""
        self.mode = mode
        for c in self.open:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.open = []

    def run(self):
        while True:
            c, _ = self.sock.accept()
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    def serve(self, c):
        f = c.makefile("rb")
        try:
            while True:
                line = f.readline()
                if not line:
                    return
                target = line.split()[1].decode()
                hdrs = {}
                while True:
                    h = f.readline()
                    if h in (b"\r\n", b""):
                        break
                    k, _, v = h.decode().partition(":")
                    hdrs[k.strip().lower()] = v.strip()
                if not self.answer(c, target, hdrs.get("accept", "").encode()):
                    return
        except OSError:
            pass
        finally:
            c.close()

    def send(self, c, ctype, body):
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n" % (ctype, len(body)) + body)
        return True

    def answer(self, c, target, accept):
        pb = accept.startswith(PB) and not self.json_for_pb
        if target == "/api/v1":
            return self.send(c, b"application/json", b'{"kind":"APIResourceList","groupVersion":"v1","resources":'
                                                     b'[{"name":"pods","namespaced":true,"kind":"Pod"}]}')
        if "watch=" not in target:
            if pb:
                lst = fld(1, fld(2, "5") + fld(3, "")) + fld(2, pod("good", 5))
                return self.send(c, PB, envelope("PodList", lst))
            return self.send(c, b"application/json", b'{"kind":"PodList","apiVersion":"v1","metadata":'
                             b'{"resourceVersion":"5"},"items":[{"metadata":{"name":"good","namespace":'
                             b'"default","resourceVersion":"5"}}]}')
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n"
                  % (PB + b";stream=watch" if pb else b"application/json"))
        if not pb:
            time.sleep(3600)  # the JSON watch stays open, quiet
            return False
        self.pb_watches += 1
        data = frame("ADDED", pod("good-%d" % self.pb_watches, 5 + self.pb_watches))
        if self.mode:
            data += BAD[self.mode]
        c.sendall(b"%x\r\n%s\r\n" % (len(data), data))
        if self.mode == "truncated":
            c.sendall(b"0\r\n\r\n")
            return False
        self.open.append(c)
        time.sleep(60)  # quiet (no fault), or kwc gives up on the stream (a fault)
        return False


def main():
    up = Upstream()
    d = tempfile.mkdtemp(prefix="kwc-pbfaults-")
    log = open(os.path.join(d, "kwc.log"), "w+")
    kwc = subprocess.Popen([KWC_BIN, "--upstream", "http://127.0.0.1:%d" % up.port, "--listen", "127.0.0.1:0",
                            "--port-file", os.path.join(d, "port"), "--data-dir", os.path.join(d, "data"),
                            "--resources", "v1/pods", "--protobuf-resources", "pods", "--shutdown-delay-duration", "0",
                            "--log-summary-interval", "0"], stdout=log, stderr=log)
    failed = 0

    def text():
        log.flush()
        with open(log.name) as f:
            return f.read()
    try:
        port = int(wait_for(lambda: os.path.exists(os.path.join(d, "port")) and open(os.path.join(d, "port")).read().strip(),
                            10, "kwc's port"))
        wait_for(lambda: http_request(port, "GET", "/readyz")[0] == 200, 30, "kwc ready")
        for mode in BAD:
            n = up.pb_watches
            seen = text().count("pods (protobuf)")
            up.set_mode(mode)
            # the next watch kwc opens gets the bad frame
            try:
                wait_for(lambda: up.pb_watches >= n + 2, 60, "kwc to watch again after %r" % mode, interval=0.1)
                logs = text()
                ok = "pods (protobuf): bad watch event" in logs or "pods (protobuf): a watch event" in logs \
                    or "pods (protobuf): the upstream's watch stopped inside an event" in logs
                ok = ok and logs.count("pods (protobuf)") > seen and kwc.poll() is None
            except TimeoutError as e:
                ok = False
                print("   ", e)
            print(("ok   " if ok else "FAIL ") + "%s: logged with the resource, watched again" % mode)
            failed += not ok
        up.set_mode(None)
        st, h, b = http_request(port, "GET", "/api/v1/pods?watch=1&resourceVersion=0&timeoutSeconds=1",
                                headers={"Accept": PB.decode()})
        names = b.count(b"good")
        ok = st == 200 and b"bad" not in b and names >= 2
        print(("ok   " if ok else "FAIL ") + "kwc serves the good objects and none of the bad (%d)" % names)
        failed += not ok
        up.json_for_pb = True
        up.set_mode(None)  # ends the open watch: the next request gets JSON
        wait_for(lambda: b"the upstream does not serve v1/pods in protobuf" in
                 http_request(port, "GET", "/readyz?verbose")[2], 60, "the refusal in /readyz")
        ok = http_request(port, "GET", "/readyz")[0] == 200
        print(("ok   " if ok else "FAIL ") + "JSON for protobuf: named in /readyz?verbose, still ready")
        failed += not ok
    finally:
        kwc.terminate()
        rc = kwc.wait(30)
        print(("ok   " if rc == 0 else "FAIL ") + "kwc exits cleanly (%d)" % rc)
        failed += rc != 0
        if failed:
            print(text())
    print("%d failed" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
