#!/usr/bin/python3
"""The `h2page` bench scenario (issue 32, part 3): kwc's CPU per cached list
page of 500 pods (JSON, ~0.5 MB, answered from kwc's cache) over HTTP/2
against HTTP/1.1, before vs after, plaintext and TLS.

  bench/run.py --only h2page [--baseline-commit C] [--h2page-requests N]

Four kwcs on one apisim (2,000 pods of ~1 KiB): BEFORE (--baseline-commit,
default the commit main was at) and AFTER (--kwc), each plaintext and TLS.
Each cell is a bounded loop of requests (h2load -n N: --h1 for HTTP/1.1,
HTTP/2 with prior knowledge in plaintext, ALPN h2 over TLS) and kwc's CPU is
utime + stime from /proc/PID/stat across it: CPU us per page. Cells: c
connections x m streams each (HTTP/1.1: m = 1); HTTP/2 also with the client
advertising SETTINGS_MAX_FRAME_SIZE 1 MiB (h2load -f), as Go's client does
since x/net's http2Config (defaultMaxReadFrameSize 1 << 20; older Go sent
none: 16 KiB). The runs go before, after, after, before (ABBA); each cell
is the mean of its two runs, and H2/H1 is the ratio of HTTP/2's CPU per
page to HTTP/1.1's on the same server and transport (target: <= 1.10).
"""
import json
import re
import subprocess
import time

# kwc's cached page (docs/caching.md: NotOlderThan with limit; a bare ?limit=500 is a
# quorum read, passed to the upstream)
PATH = "/api/v1/pods?resourceVersion=1&resourceVersionMatch=NotOlderThan&limit=500"
# (connections, streams per connection, client's max frame size or None)
CELLS = ((1, 1, None), (1, 1, 1 << 20), (8, 1, None), (8, 1, 1 << 20), (1, 8, None))


def h2load_cpu(R, k, n, conns, streams, h1, frame):
    """kwc's CPU seconds over h2load -n n, the requests that succeeded and
    the protocol h2load negotiated."""
    argv = ["h2load", "-n", str(n), "-c", str(conns), "-t", str(min(conns, 2)), "-m", str(streams)]
    if h1:
        argv.append("--h1")
    if frame:
        argv += ["-f", str(frame)]
    argv.append("%s://127.0.0.1:%d%s" % ("https" if k.v.tls else "http", k.port, PATH))
    R.settle(k.pid)
    c0 = R.cpu_seconds(k.pid)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600).stdout
    cpu = R.cpu_seconds(k.pid) - c0
    ok = re.search(r" (\d+) succeeded", out)
    codes = re.search(r"status codes: (\d+) 2xx", out)
    proto = re.search(r"Application protocol: (\S+)", out)
    if not ok or not codes or int(codes.group(1)) != n:
        raise RuntimeError("h2load: not every request succeeded:\n" + out[-1500:])
    return cpu, int(ok.group(1)), proto.group(1) if proto else "?"


def served_from_cache(R, k):
    """The page is kwc's (kwc_requests_total{source="cache"} grows)."""
    def count():
        st, body = k.get("/metrics")
        return sum(float(m.group(1)) for m in re.finditer(
            r'^kwc_requests_total\{[^}]*source="cache"[^}]*\} (\S+)$', body.decode(), re.M))
    c0 = count()
    st, body = k.get(PATH)
    if st != 200 or len(json.loads(body)["items"]) != 500:
        raise RuntimeError("GET %s: %d" % (PATH, st))
    return count() > c0, len(body)


def bench_h2page(args, R):
    n = args.h2page_requests
    env = R.Env(apisim_args=["--pods", "2000", "--nodes", "100", "--pod-size", "1000"], start_kwc=False)
    short = R.git("rev-parse", "--short", args.baseline_commit)
    vs = {("before", False): R.Variant("before (%s)" % short, args.baseline_kwc, False),
          ("before", True): R.Variant("before (%s), TLS" % short, args.baseline_kwc, True),
          ("after", False): R.Variant("after", args.kwc, False),
          ("after", True): R.Variant("after, TLS", args.kwc, True)}
    servers, runs = {}, {}
    try:
        for key, v in vs.items():
            servers[key] = R.Kwc(args, env, v, "h2page-%s%s" % (key[0], "-tls" if key[1] else ""),
                                 optional=(("--protobuf-resources", "none"),))
        cached, size = served_from_cache(R, servers[("after", False)])
        print(json.dumps({"page_bytes": size, "from_cache": cached}), flush=True)
        for side in ("before", "after", "after", "before"):
            for tls in (False, True):
                k = servers[(side, tls)]
                for conns, streams, frame in CELLS:
                    for h1 in (True, False):
                        if h1 and (streams > 1 or frame):
                            continue
                        cpu, done, proto = h2load_cpu(R, k, n, conns, streams, h1, frame)
                        key = (side, tls, conns, streams, frame, h1)
                        runs.setdefault(key, []).append(cpu / done * 1e6)
                        print(json.dumps({"server": k.v.label, "proto": proto, "c": conns, "m": streams,
                                          "frame": frame, "us_per_page": round(cpu / done * 1e6, 1)}), flush=True)
    finally:
        R.stop_all(servers)
        env.close()

    def mean(key):
        rs = runs.get(key)
        return sum(rs) / len(rs) if rs else None

    rows = []
    for tls in (False, True):
        for conns, streams, frame in CELLS:
            for side in ("before", "after"):
                h1 = mean((side, tls, conns, 1, None, True))
                h2 = mean((side, tls, conns, streams, frame, False))
                what = "HTTP/2 -c %d -m %d%s" % (conns, streams, ", client max frame 1 MiB" if frame else "")
                b = mean(("before", tls, conns, streams, frame, False))
                rows.append([vs[(side, tls)].label, what, "%.0f" % h1, "%.0f" % h2, "%.2f" % (h2 / h1),
                             "-" if side == "before" else "%+.1f%%" % (100 * (h2 - b) / b),
                             " / ".join("%.0f" % x for x in runs[(side, tls, conns, streams, frame, False)])])
    text = R.table("A cached page of 500 pods (GET %s, JSON, %d bytes, from kwc's cache: %s) over HTTP/2 vs "
                   "HTTP/1.1 at the same connections (h2load -n %d per run, --h1 for HTTP/1.1), kwc CPU us per "
                   "page from /proc (utime+stime), runs ABBA (before, after, after, before), each cell the mean "
                   "of its two runs; target H2/H1 <= 1.10" % (PATH, size, "yes" if cached else "NO", n),
                   ["server", "HTTP/2 cell", "HTTP/1.1 us/page (same -c)", "HTTP/2 us/page", "H2/H1",
                    "HTTP/2 vs before", "HTTP/2 runs us/page"], rows)
    R.save("http2", text)
