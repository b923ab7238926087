#!/usr/bin/python3
"""Smoke check of kwc's protobuf caches against apisim (not part of the
integration suite; run by hand):

    KWC_BIN=$PWD/build/kwc /usr/bin/python3 tests/lib/pbsmoke.py

It starts apisim and kwc (--protobuf-resources pods,nodes), then compares
what kwc answers in protobuf with apisim's own answer, byte for byte:
  - /readyz?verbose lists the pods protobuf cache synced, and not the
    configmaps one (not started: nobody asked);
  - a protobuf watch from an rv (served from kwc's cache: Content-Type
    ...;stream=watch, frames equal to apisim's for the same writes),
    with a label selector too (transitions: an object leaving it is DELETED);
  - a protobuf watch from rv 0 (synthetic ADDED of the state: each object
    message is the item apisim's protobuf list has);
  - a protobuf list through kwc equals apisim's;
  - the first protobuf watch of configmaps passes through and starts its
    cache, which then syncs and serves the next one.
The frames are split and read with a decoder of this file's own.
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import Env, http_connection, http_request, wait_for  # noqa: E402

PB = "application/vnd.kubernetes.protobuf"


def varint(b, i):
    v = s = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << s
        s += 7
        if not c & 0x80:
            return v, i


def fields(b):
    """{num: [values]} of one message: bytes for LEN, int for VARINT."""
    out, i = {}, 0
    while i < len(b):
        t, i = varint(b, i)
        num, wt = t >> 3, t & 7
        if wt == 0:
            v, i = varint(b, i)
        elif wt == 2:
            n, i = varint(b, i)
            v = b[i:i + n]
            i += n
        else:
            raise ValueError("wire type %d" % wt)
        out.setdefault(num, []).append(v)
    return out


def frames(body):
    """A protobuf watch stream: [(type, object message bytes, whole frame)]."""
    out, i = [], 0
    while i < len(body):
        n = int.from_bytes(body[i:i + 4], "big")
        f = body[i + 4:i + 4 + n]
        assert len(f) == n, "a frame cut short"
        i += 4 + n
        ev = fields(f)
        env = fields(ev[2][0])[1][0]
        assert env[:4] == b"k8s\0", "envelope magic"
        u = fields(env[4:])
        out.append((ev[1][0].decode(), u[2][0], f))
    return out


def meta(obj):
    m = fields(fields(obj)[1][0])
    return m.get(1, [b""])[0].decode(), m.get(6, [b""])[0].decode()


def get(port, path, accept=PB):
    return http_request(port, "GET", path, headers={"Accept": accept})


class Watch(threading.Thread):
    """One streaming GET; .status, .ctype, .body when it ends."""

    def __init__(self, port, path, accept=PB):
        super().__init__(daemon=True)
        self.port, self.path, self.accept = port, path, accept
        self.status = self.ctype = None
        self.body = b""
        self.started = threading.Event()
        self.start()
        self.started.wait(10)

    def run(self):
        c = http_connection(self.port, timeout=60)
        c.request("GET", self.path, headers={"Accept": self.accept})
        r = c.getresponse()
        self.status, self.ctype = r.status, r.getheader("Content-Type")
        self.started.set()
        self.body = r.read()
        c.close()


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        check.failed += 1


check.failed = 0


def main():
    with Env(apisim_args=["--pods", "40", "--nodes", "3"],
             kwc_args=["--resources", "v1/pods,v1/nodes,v1/configmaps",
                       "--protobuf-resources", "pods,nodes"]) as env:
        kp, ap = env.kwc.port, env.apisim.port
        text = wait_for(lambda: (lambda b: b"/api/v1/pods (protobuf): synced" in b and b)(
            http_request(kp, "GET", "/readyz?verbose")[2]), 30, "the pods protobuf cache").decode()
        check("/api/v1/nodes (protobuf): synced" in text, "readyz lists the nodes protobuf cache synced")
        check("configmaps (protobuf)" not in text, "readyz leaves out the configmaps one (not started)")

        rv = env.stats()["rv"]
        q = "/api/v1/pods?watch=1&resourceVersion=%d&timeoutSeconds=3" % rv
        sel = "/api/v1/namespaces/ns-0/pods?watch=1&resourceVersion=%d&timeoutSeconds=3&labelSelector=smoke%%3Dyes" % rv
        wk, wa = Watch(kp, q), Watch(ap, q)
        sk, sa = Watch(kp, sel), Watch(ap, sel)
        wj = Watch(kp, q, accept="application/json")
        for i in range(4):
            env.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "ns-0",
                                              "name": "smoke-%d" % i, "labels": {"smoke": "yes"}})
        env.sim("POST", "/apisim/write", {"verb": "update", "resource": "pods", "namespace": "ns-0",
                                          "name": "smoke-1", "labels": {"smoke": "no"}})
        env.sim("POST", "/apisim/write", {"verb": "delete", "resource": "pods", "namespace": "ns-0",
                                          "name": "smoke-2"})
        for w in (wk, wa, sk, sa, wj):
            w.join(30)
        check(wk.status == 200 and wk.ctype == PB + ";stream=watch",
              "kwc's protobuf watch: 200, %s (got %s %s)" % (PB + ";stream=watch", wk.status, wk.ctype))
        fk, fa = frames(wk.body), frames(wa.body)
        check(len(fk) == 6, "six events (%d)" % len(fk))
        check([f[2] for f in fk] == [f[2] for f in fa], "the frames are apisim's, byte for byte")
        check([f[0] for f in frames(sk.body)] == [f[0] for f in frames(sa.body)],
              "with a label selector: the same event types as apisim (%s)" % [f[0] for f in frames(sk.body)])
        check(sk.body == sa.body, "with a label selector: the same bytes")
        check(wj.ctype == "application/json" and wj.body.count(b"\n") == 6,
              "a JSON watcher of the same resource: its six lines")

        ws = Watch(kp, "/api/v1/pods?watch=1&resourceVersion=0&timeoutSeconds=1")
        ws.join(30)
        st, h, lst = get(ap, "/api/v1/pods")
        items = fields(fields(lst[4:])[2][0]).get(2, [])
        adds = frames(ws.body)
        check(all(t == "ADDED" for t, _, _ in adds) and len(adds) == len(items),
              "watch from 0: an ADDED per object (%d, %d listed)" % (len(adds), len(items)))
        check(sorted(o for _, o, _ in adds) == sorted(items),
              "each one the object message apisim's list has")

        st, h, kl = get(kp, "/api/v1/pods")
        check(st == 200 and h.get("content-type") == PB and kl == lst,
              "a protobuf list through kwc is apisim's (%s, %d bytes)" % (h.get("content-type"), len(kl)))

        cm = "/api/v1/configmaps?watch=1&resourceVersion=0&timeoutSeconds=1"
        w1 = Watch(kp, cm)
        w1.join(30)
        check(w1.status == 200, "the first configmaps protobuf watch is answered (by the upstream)")
        wait_for(lambda: b"/api/v1/configmaps (protobuf): synced" in http_request(kp, "GET", "/readyz?verbose")[2],
                 30, "the configmaps protobuf cache to start and sync")
        check(True, "it started the configmaps protobuf cache, which synced")
        before = env.stats()["open_watches_by_encoding"]
        w2 = Watch(kp, cm)
        mid = env.stats()["open_watches_by_encoding"]
        w2.join(30)
        check(w2.status == 200 and w2.ctype == PB + ";stream=watch" and mid == before,
              "the next one is kwc's own (no new upstream watch: %s)" % mid)
        check(env.kwc.stop() == 0, "kwc exits cleanly")
    print("%d failed" % check.failed)
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
