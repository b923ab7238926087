#!/usr/bin/python3
"""Measure apisim: small list/get request rate, a 150k-pod list, seed time, churn rate,
concurrent watches.  Loopback only; every loop bounded in count and time.

  /usr/bin/python3 tests/apisim/bench_apisim.py [--pods 150000] [--watches 2000] [--quick]
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
APISIM = os.path.join(HERE, "apisim.py")


def start(args, tmp):
    pf = os.path.join(tmp, "port-%d" % time.monotonic_ns())
    p = subprocess.Popen(["/usr/bin/python3", APISIM, "--listen", "127.0.0.1:0", "--port-file", pf] + args,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if os.path.exists(pf):
            return p, int(open(pf).read())
        if p.poll() is not None:
            raise RuntimeError("apisim exited: %s" % p.stderr.read().decode())
        time.sleep(0.05)
    p.kill()
    raise RuntimeError("apisim did not start")


async def http(port, method, path, body=None):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode() if body is not None else b""
    w.write(b"%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
            % (method.encode(), path.encode(), len(data), data))
    raw = await r.read()
    w.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        out = []
        while rest:
            line, _, rest = rest.partition(b"\r\n")
            n = int(line, 16)
            if n == 0:
                break
            out.append(rest[:n])
            rest = rest[n + 2:]
        rest = b"".join(out)
    return head, rest


async def small_requests(port, conns, seconds, path):
    """conns keep-alive connections, each sending GETs back to back for `seconds`."""
    count = 0
    stop = time.monotonic() + seconds
    req = b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode()

    async def one():
        nonlocal count
        r, w = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.monotonic() < stop:
                w.write(req)
                head = await r.readuntil(b"\r\n\r\n")
                n = 0
                for ln in head.split(b"\r\n"):
                    if ln.lower().startswith(b"content-length:"):
                        n = int(ln.split(b":")[1])
                await r.readexactly(n)
                count += 1
        finally:
            w.close()
    t0 = time.monotonic()
    await asyncio.gather(*[one() for _ in range(conns)])
    return count / (time.monotonic() - t0)


async def big_list(port, path):
    t0 = time.monotonic()
    r, w = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
    w.write(b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode())
    total = 0
    first = None
    while True:
        chunk = await r.read(1 << 20)
        if not chunk:
            break
        if first is None:
            first = time.monotonic() - t0
        total += len(chunk)
    w.close()
    return time.monotonic() - t0, total, first


async def watches(port, n, seconds_cap=60):
    """Open n watches, then time how long one event takes to reach all of them."""
    conns = []
    t0 = time.monotonic()
    for i in range(n):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET /api/v1/namespaces/default/configmaps?watch=1&resourceVersion=1&timeoutSeconds=120 "
                b"HTTP/1.1\r\nHost: x\r\n\r\n")
        conns.append((r, w))
        if time.monotonic() - t0 > seconds_cap:
            break
    for r, w in conns:
        await r.readuntil(b"\r\n\r\n")
    opened = time.monotonic() - t0
    _, body = await http(port, "GET", "/apisim/stats")
    st = json.loads(body)
    await http(port, "POST", "/apisim/write", {"verb": "create", "resource": "configmaps", "name": "fanout"})
    t1 = time.monotonic()

    async def wait_one(r):
        await asyncio.wait_for(r.readuntil(b"fanout"), 60)
    await asyncio.gather(*[wait_one(r) for r, _ in conns])
    fan = time.monotonic() - t1
    for r, w in conns:
        w.close()
    return len(conns), opened, fan, st["open_watches"].get("configmaps", 0)


async def churn_rate(port, rate, seconds):
    _, b0 = await http(port, "GET", "/apisim/stats")
    e0 = json.loads(b0)["events"]
    await http(port, "POST", "/apisim/churn", {"rate": rate, "resources": ["pods"]})
    t0 = time.monotonic()
    await asyncio.sleep(seconds)
    _, b1 = await http(port, "GET", "/apisim/stats")
    dt = time.monotonic() - t0
    await http(port, "POST", "/apisim/churn", {"rate": 0})
    return (json.loads(b1)["events"] - e0) / dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=150000)
    ap.add_argument("--watches", type=int, default=2000)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.pods, a.watches = 20000, 500
    tmp = tempfile.mkdtemp(prefix="apisim-bench-")
    res = {}
    # 1. small requests on a small cluster
    p, port = start(["--pods", "100", "--nodes", "10"], tmp)
    try:
        for conns in (1, 4, 16):
            res["get pod req/s (%d conns)" % conns] = round(asyncio.run(
                small_requests(port, conns, 3, "/api/v1/namespaces/default/pods/pod-1")))
        res["list 10 pods req/s (4 conns)"] = round(asyncio.run(
            small_requests(port, 4, 3, "/api/v1/namespaces/default/pods?limit=10")))
        res["list nodes rv=0 req/s (4 conns)"] = round(asyncio.run(
            small_requests(port, 4, 3, "/api/v1/nodes?resourceVersion=0")))
        n, opened, fan, seen = asyncio.run(watches(port, a.watches))
        res["watches opened"] = n
        res["watches seen by apisim"] = seen
        res["seconds to open watches"] = round(opened, 2)
        res["seconds for one event to reach all watches"] = round(fan, 3)
        for rate in (2000, 5000, 10000):
            res["churn achieved at %d/s" % rate] = round(asyncio.run(churn_rate(port, rate, 3)))
    finally:
        p.terminate()
        p.wait(10)
    # 2. a big cluster
    t0 = time.monotonic()
    p, port = start(["--pods", str(a.pods), "--nodes", "500"], tmp)
    res["start with %d pods (seconds, incl. interpreter)" % a.pods] = round(time.monotonic() - t0, 2)
    try:
        dt, size, first = asyncio.run(big_list(port, "/api/v1/pods"))
        res["list all %d pods: seconds" % a.pods] = round(dt, 2)
        res["list all pods: MB"] = round(size / 1e6, 1)
        res["list all pods: first byte s"] = round(first, 3)
        dt, size, first = asyncio.run(big_list(port, "/api/v1/pods?resourceVersion=0"))
        res["list all pods rv=0: seconds"] = round(dt, 2)
        _, body = asyncio.run(http(port, "POST", "/apisim/seed",
                                   {"resource": "pods", "namespace": "seed2", "count": a.pods, "nodes": 500}))
        res["POST /apisim/seed %d pods: seconds (server side)" % a.pods] = json.loads(body)["seconds"]
    finally:
        p.terminate()
        p.wait(20)
    for k, v in res.items():
        print("%-55s %s" % (k, v))


if __name__ == "__main__":
    main()
