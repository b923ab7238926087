#!/usr/bin/env python3
"""kwc benchmarks. Each scenario runs kwc and its baseline side by side in one
run, prints a table and appends it to bench/results/<scenario>.md.

  bench/run.py --kwc build/kwc [--only passthrough,large] [--duration 5]

Scenarios:
  passthrough  small GETs (one pod) with wrk at 1/8/32 connections, directly
               against apisim and through kwc: requests/s, latency, kwc CPU.
  large        a >100 MB list read by a slow client through kwc vs directly:
               throughput and kwc peak RSS.
"""
import argparse
import datetime
import os
import re
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))
from cluster import Env, http_request  # noqa: E402

RESULTS = os.path.join(HERE, "results")


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(port, path, conns, duration):
    out = subprocess.run(["wrk", "-t", str(min(conns, 2)), "-c", str(conns), "-d", "%ds" % duration,
                          "--latency", "http://127.0.0.1:%d%s" % (port, path)],
                         capture_output=True, text=True, timeout=duration + 30).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))

    def lat(p):
        m = re.search(r"\s%s%%\s+([\d.]+)(us|ms|s)" % p, out)
        v, u = float(m.group(1)), m.group(2)
        return v / 1000 if u == "us" else v * 1000 if u == "s" else v
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rps, lat("50"), lat("99"), int(errs.group(1)) if errs else 0


def table(title, header, rows):
    lines = ["### %s (%s)" % (title, datetime.datetime.now().strftime("%Y-%m-%d %H:%M")), "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def save(name, text):
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, name + ".md"), "a") as f:
        f.write(text + "\n")
    print(text)


def bench_passthrough(args):
    with Env(apisim_args=["--pods", "100", "--nodes", "4"], kwc_bin=args.kwc) as env:
        key = env.sim("GET", "/apisim/state?resource=pods")["items"][0]["key"]
        ns, name = key.split("/")
        path = "/api/v1/namespaces/%s/pods/%s" % (ns, name)
        rows = []
        for conns in (1, 8, 32):
            d = wrk(env.apisim.port, path, conns, args.duration)
            c0 = cpu_seconds(env.kwc.pid())
            t0 = time.monotonic()
            k = wrk(env.kwc.port, path, conns, args.duration)
            cpu = (cpu_seconds(env.kwc.pid()) - c0) / (time.monotonic() - t0)
            rows.append([conns, "%.0f" % d[0], "%.0f" % k[0], "%.0f%%" % (100 * k[0] / d[0]),
                         "%.2f / %.2f" % (d[1], d[2]), "%.2f / %.2f" % (k[1], k[2]),
                         "%.0f%%" % (cpu * 100), d[3] + k[3]])
        save("passthrough", table(
            "Passthrough: GET one pod (~3 KiB), wrk %ds per cell, apisim direct vs through kwc" % args.duration,
            ["conns", "direct req/s", "kwc req/s", "kwc/direct", "direct p50/p99 ms", "kwc p50/p99 ms",
             "kwc CPU", "non-2xx"], rows))


def slow_read(port, path):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    s.connect(("127.0.0.1", port))
    s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path).encode())
    n, t0 = 0, time.monotonic()
    while True:
        d = s.recv(16384)
        if not d:
            break
        n += len(d)
    return n, time.monotonic() - t0


def bench_large(args):
    with Env(apisim_args=["--pods", "30000", "--nodes", "50", "--pod-size", "3600"], kwc_bin=args.kwc) as env:
        rss0 = env.kwc.rss_kib()
        dn, dt = slow_read(env.apisim.port, "/api/v1/pods")
        kn, kt = slow_read(env.kwc.port, "/api/v1/pods")
        peak = env.kwc.rss_kib("VmHWM")
        save("large", table("Large response: >100 MB pod list, 64 KiB receive buffer, 16 KiB reads",
                            ["path", "bytes", "seconds", "MB/s", "kwc RSS start / peak"],
                            [["direct", dn, "%.2f" % dt, "%.0f" % (dn / dt / 1e6), "-"],
                             ["kwc", kn, "%.2f" % kt, "%.0f" % (kn / kt / 1e6),
                              "%.1f / %.1f MB" % (rss0 / 1024, peak / 1024)]]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kwc", required=True)
    ap.add_argument("--bin", default=None)
    ap.add_argument("--only", default="passthrough,large")
    ap.add_argument("--duration", type=int, default=5)
    args = ap.parse_args()
    args.kwc = os.path.abspath(args.kwc)
    for name in args.only.split(","):
        globals()["bench_" + name](args)


if __name__ == "__main__":
    main()
