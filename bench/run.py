#!/usr/bin/env python3
"""kwc benchmarks. Each scenario runs kwc and its baseline side by side in one
run, prints a table and appends it to bench/results/<scenario>.md (only at
the full run's sizes; --small and other sizes print without saving).

  bench/run.py [--kwc build/kwc] [--only passthrough,large] [--duration 5] [--small]

Scenarios:
  passthrough  small GETs (one pod) with wrk at 1/8/32 connections, directly
               against apisim and through kwc: requests/s, latency, kwc CPU.
  large        a >100 MB list read by a slow client through kwc vs directly:
               throughput and kwc peak RSS.
  cache        RV=0 lists of 150,000 pods at 1/8/32 listers (GB/s, p50/p99,
               kwc RSS, PNG plot), one node's pods by spec.nodeName, cold
               load, warm restart to the first list, ingest of watch events.
  watch        fan-out (bench/fanout.c streams): 1 KiB events at 100/s to
               1,000 and 10,000 watchers through kwc and straight from apisim,
               write-to-receipt latency p50/p99/max, deliveries/s, kwc CPU
               and RSS; the kubelet pattern (5,000 node-pinned watchers over
               150,000 pods at 500 events/s); idle watchers' memory.

Before vs after (kwc's HTTP front end: libevhtp, then its own layer with
TLS), all into bench/results/front.md. BEFORE is kwc built from
--baseline-commit (git archive into build/baseline/<sha>/, its own deps.sh
and Makefile), AFTER is --kwc, plaintext and over TLS (an EC P-256 test CA
and server certificate made with the openssl CLI). A row whose binary lacks
a flag it needs says "n/a (flag unsupported: ...)".
  front        GET one pod from the cache (wrk, keep-alive, 1/8/32
               connections) and RV=0 lists of --pods pods (curl, 1/8/32
               listers): throughput, latency, kwc CPU per request or per GB.
  watch-tls    the watch fan-out (100 ev/s x 1 KiB) to --watchers watchers
               through kwc: p50/p99, deliveries/s, CPU us per delivery.
  idle-tls     --idle-conns connections idle after a handshake and one GET:
               kwc RssAnon per connection, plaintext and TLS, against what
               OpenSSL alone keeps (bench/tlsprobe).
  integrity    per-value checksums on vs off in one run (RV=0 list GB/s end
               to end through two kwcs, store ingest and scan via
               bench/crcbench), and the seconds from a full disk or a damaged
               value to /readyz 503, and back to 200.
  slowloris    --slowloris connections that never finish their head, then
               a flood of --flood connections over --max-connections, while
               a normal client GETs one pod: its success and latency, how
               long kwc holds the attackers, how fast it refuses, its RSS and
               fds.

  auth         kwc over TLS with --auth none vs --auth delegated (TokenReview
               and SubjectAccessReview against apisim --policy: kwc's own
               token, and a token per caller): GET one pod from the cache
               (wrk, one bearer token, 1/8/32 connections; req/s, p50/p99,
               CPU per request); watch fan-out with a token per watcher
               (--auth-watchers at 100 ev/s x 1 KiB, and --auth-kubelet
               node-pinned watchers over --pods pods at 500 ev/s): p50/p99,
               kwc CPU, reviews sent and the SubjectAccessReview cache hit
               rate from kwc's shutdown line; a burst of --auth-burst
               distinct tokens (new TLS connection, one list each) at once:
               reviews that reached apisim and the time until all were
               answered, then the same burst again (cached). All in
               bench/results/auth.md.

  metrics      the cost of /metrics on the fan-out path: 1 KiB events at
               100/s to --watchers watchers (bench/fanout.c, as in watch)
               through kwc without metrics (BEFORE: pass the commit this
               branch started from, --baseline-commit) and with them (--kwc,
               scraped every second meanwhile, as a Prometheus would), in
               one run, ABBA order, each cell the mean of its two runs:
               deliveries/s, kwc CPU per delivery, p99, and the difference
               in % (target: within 2 %). bench/results/metrics.md.

  http2        HTTP/2 beside HTTP/1.1 (issue 21), bench/results/http2.md and
               http2.png. Servers side by side on one apisim: BEFORE
               (--baseline-commit; default for --only http2: main before the
               issue) plaintext and TLS, AFTER plaintext (HTTP/1.1 and HTTP/2
               with prior knowledge on one port) and TLS (ALPN h2 or
               http/1.1). Watch fan-out: --h2-watchers streams at --h2-rate
               events/s of 1 KiB, HTTP/2 spread over --h2-conns connections
               (fanout --h2-streams-per-conn) vs one HTTP/1.1 connection each,
               the events started once every stream has its head:
               deliveries/s, p50/p99, kwc CPU per delivery, and kwc RssAnon
               growth per idle watcher on a fresh kwc (fanout --idle). Cached
               GETs (one pod at rv=0; a NotOlderThan page of 500 pods) at
               --h2-get-conns connections: h2load -m 10 and -m 100 vs wrk:
               req/s, p50/p99, kwc CPU per request, peak RssAnon. HTTP/1.1 rows
               run against both builds (plaintext ABBA: the seam step within
               noise); HTTP/2 rows against AFTER only, and say n/a when a kwc
               answers no HTTP/2.

  tls-cost     TLS at the cost of plaintext (issue 22), bench/results/tls-cost.md
               and tls-cost.png. Four kwcs side by side: BEFORE
               (--baseline-commit; default for --only tls-cost: main before
               the issue) and AFTER (--kwc), each plaintext and TLS (--auth
               none), in the order before, before TLS, after, after TLS, then
               back (ABBA: each row the mean and each run). Watch fan-out
               (fanout.c, 1 KiB pod updates): 1,000 and 5,000 watchers at
               100 events/s and 10,000 at 50/s, the last also served by
               apisim directly (twice, in the middle); events start once
               every stream has its head, --duration s measured after a 2 s
               warm-up, then fanout reads until every stream is past the
               window (at most 15 s): kwc CPU per delivery, deliveries/s
               asked vs got, events written/s, p50/p99, deliveries lost (an
               event written in the window that an open stream never got).
               The latency target: 3,000 TLS watchers at 30 events/s of
               3 KB pods (after, before, before, after). Cached RV=0 lists of
               --pods pods (~4 KiB) at 1 and 8 curl listers: kwc CPU s/GB,
               GB/s. Idle memory: --idle-conns connections after one GET and
               as many idle watchers, kwc RssAnon growth per connection (a
               fresh kwc each). Then the targets with PASS/MISS: TLS/plain
               CPU per delivery <= 1.25x and per list GB <= 1.15x, plaintext
               CPU per delivery >= 25 % below before, p99 at 10,000 x 50/s
               below apisim's, no delivery lost, 3,000 TLS x 30/s x 3 KB p99
               <= 100 ms, idle TLS <= 16.5 KiB. --small: 100/200/300
               watchers, 200 at the latency target, 1,000 pods, 500 idle.

  tls-cipher   what TLS adds to kwc's CPU against AES-GCM's own cost for the
               same bytes, measured in the same run (issue 32, part 4;
               bench/tlscipher.py says how): BEFORE (--baseline-commit;
               default for --only tls-cipher: main before part 4) and AFTER,
               plaintext and TLS, ABBA; 1,000 watchers x 100/s of 1 KiB and
               4 KiB pods, cached lists of --pods 4 KiB pods (1 lister x 3);
               openssl speed -evp aes-256-gcm / aes-128-gcm at the bytes of
               one delivery and of 16 KiB; target TLS adds <= 1.5x the
               cipher. Appends to bench/results/tls-cost.md. ~10 minutes.

  serve-more   metadata-only and gzip answers (issue 23), bench/results/
               serve-more.md, serve-more.dat and serve-more.png. One kwc on an
               apisim of --pods pods (apisim's own ~3 KiB pod, ~0.5 KiB of it
               metadata), in one run: RV=0 lists (curl: 1 lister x 3 lists, 8
               listers x 1) in JSON, JSON metadata-only (Accept ...;as=
               PartialObjectMetadataList;g=meta.k8s.io;v=v1), protobuf and
               protobuf metadata-only (client-go's metadata client's Accept),
               through kwc and from apisim directly (one list each): body bytes
               per list, p50/p99, lists/s, server CPU per list; the JSON list
               with and without Accept-Encoding: gzip through kwc and from
               apisim at 1 and 8 listers (curl without --compressed: bytes as
               sent, nothing decoded): bytes, Content-Encoding, lists/s, GB/s
               of uncompressed JSON, server CPU s per uncompressed GB; the
               watch side: 1,000 watchers (fanout.c --accept) at 100 pod
               updates/s per variant: kwc CPU per delivery, bytes per event.
               Every row says who answered it: cache (kwc counted it in
               kwc_requests_total{source="cache"}, or a watch in
               kwc_requests_in_flight{source="cache"}, and apisim's counters
               saw no list or watch of pods) or upstream (kwc passed it
               through): a passthrough figure is never a cache figure. A
               variant whose lists pass through is measured at 1 lister only.
               The raw results go to a JSON file in the temporary directory
               (its path printed). 3-5 minutes at full size; --small
               (20,000 pods, 200 watchers) in under a minute.

  attack       what one unauthenticated attacker connection running flat out
               costs kwc (issue 29), bench/attack.py: kwc --auth delegated
               over apisim --policy, plaintext and TLS, HTTP/1.1 and HTTP/2;
               per path (401s, large heads, HPACK bombs, MadeYouReset, rapid
               reset, SETTINGS/PING/PRIORITY floods, bogus tokens, held
               bodies, unread answers, slow lists, idle connections, TLS
               handshakes) --duration s: attacker bytes, kwc CPU ns per byte
               and its ratio to the h1-401 reference, how kwc ended the
               connection, a legitimate cached GET's p50/p99 meanwhile, kwc
               RSS. bench/results/attack.md (--attack-label names the
               section). ~6 minutes (334 s on a loaded 2-core machine); --small ~3.

  controller-manager
               a kube-controller-manager 1.24's informers replayed against
               kwc (issue 30), bench/cm.py (its docstring: the informer set
               and its sources): one reflector (list rv=0, then watch with
               bookmarks) per resource the garbage collector monitors,
               typed in protobuf or metadata-only (CRDs, APIServices,
               custom resources), discovery 7 times a minute, --cm-duration
               s, on an apisim with the generic built-in kinds, CRDs (one
               made mid-run), objects of every kind and churn. kwc in auto
               mode vs kwc with the old fixed list of 11 and
               --serve-discovery=false, each on a fresh apisim: share of
               reads answered by kwc's cache (apisim's request log), time
               to first sync p50/p90/max, discovery by kwc vs passed
               through, kwc RSS; auto: memory with every cache running vs
               all stopped by --cache-idle-timeout, and the resumed lists.
               bench/results/controller-manager.md. ~4 minutes; --small
               (15 s replays) ~1.

  cores        where kwc's CPU goes, thread by thread (issue 32), bench/cores.py
               (its docstring): gzip'd RV=0 lists of --cores-pods pods by 4
               clients over HTTP/1.1 and HTTP/2, HTTP/2 TLS watch fan-outs
               (--cores-fanout) at 50 events/s and --cores-compare watchers
               over HTTP/2 vs HTTP/1.1, a reconnect storm of --cores-storm TLS
               clients (handshake, list, watch): throughput, p99, kwc CPU per
               thread from /proc and the busiest thread's share. BEFORE
               (--before-bin, or --baseline-commit: default the commit issue
               32 started from) and AFTER, ABBA; --serving-threads from
               --cores-loops where a binary has it; --kwc-args for every kwc.
               bench/results/cores.md. ~10 minutes; --small ~3.
  h2page       a cached page of 500 pods over HTTP/2 vs HTTP/1.1 (issue 32,
               part 3), bench/h2page.py: kwc CPU per page (/proc utime+stime
               over h2load -n --h2page-requests; --h1 for HTTP/1.1) at 1 and 8
               connections, HTTP/2 also with the client's max frame 1 MiB (as
               Go's) and 8 streams on one connection, plaintext and TLS, BEFORE
               (--baseline-commit, default main before the part) vs AFTER, runs
               ABBA; bench/results/http2.md. ~8 minutes; --small ~2.
"""
import argparse
import datetime
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))
from cluster import ROOT, Env, Proc, http_request, wait_for  # noqa: E402

RESULTS = os.path.join(HERE, "results")


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(port, path, conns, duration, scheme="http", headers=()):
    """(req/s, p50 ms, p99 ms, non-2xx responses, socket errors). Over https
    wrk does not verify the server's certificate. headers: "Name: value"
    sent with every request."""
    out = subprocess.run(["wrk", "-t", str(min(conns, 2)), "-c", str(conns), "-d", "%ds" % duration, "--latency"] +
                         [a for h in headers for a in ("-H", h)] + ["%s://127.0.0.1:%d%s" % (scheme, port, path)],
                         capture_output=True, text=True, timeout=duration + 30).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))

    def lat(p):
        m = re.search(r"\s%s%%\s+([\d.]+)(us|ms|s)" % p, out)
        v, u = float(m.group(1)), m.group(2)
        return v / 1000 if u == "us" else v * 1000 if u == "s" else v
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return (rps, lat("50"), lat("99"), int(errs.group(1)) if errs else 0,
            sum(int(x) for x in sock.groups()) if sock else 0)


def table(title, header, rows):
    lines = ["### %s (%s)" % (title, datetime.datetime.now().strftime("%Y-%m-%d %H:%M")), "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


SAVE = True  # main(): False unless every size is the full run's
NOTE = ""  # main(): what an unsaved table's reader must know


def save(name, text):
    if not SAVE:
        print(text)
        print("(not saved to bench/results/%s.md: %s)\n" % (name, NOTE))
        return
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
    s.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" % path).encode())
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


def rss_sampler(pid, stop, out):
    """Peak RssAnon (kwc's own memory) and VmRSS (plus LMDB pages mapped) until stop is set."""
    while not stop.is_set():
        try:
            with open("/proc/%d/status" % pid) as f:
                st = f.read()
            for k in ("RssAnon", "VmRSS"):
                v = int(re.search(r"%s:\s+(\d+)" % k, st).group(1))
                out[k] = max(out.get(k, 0), v)
        except (OSError, AttributeError):
            pass
        stop.wait(0.02)


def curl_lists(port, path, conc, per_client, cacert=None, accept="application/json", extra=()):
    """conc curl processes, each reading per_client lists in sequence. Returns
    (wall seconds, total bytes, [seconds per list]). cacert: over https,
    verifying the server against that CA (curl then picks HTTP/2 by ALPN unless
    extra says --http1.1)."""
    url = "%s://127.0.0.1:%d%s" % ("https" if cacert else "http", port, path)
    cmd = ["curl", "-s", "-A", "kwc-bench", "-H", "Accept: " + accept,
           "-w", "%{http_code} %{time_total} %{size_download}\n"] + (["--cacert", cacert] if cacert else []) + \
        list(extra)
    for _ in range(per_client):
        cmd += ["-o", "/dev/null", url]
    t0 = time.monotonic()
    ps = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(conc)]
    times, total = [], 0
    for p in ps:
        out, _ = p.communicate(timeout=900)
        for line in out.split("\n"):
            if line.strip():
                code, t, n = line.split()
                if code != "200":
                    raise RuntimeError("list answered %s" % code)
                times.append(float(t))
                total += int(float(n))
    return time.monotonic() - t0, total, sorted(times)


def pct(v, p):
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def bench_cache(args):
    """Issue 3: lists from the LMDB cache vs apisim directly, node lists, cold
    load, warm restart, ingest."""
    import threading
    pods = args.pods
    env = Env(apisim_args=["--nodes", "1000", "--history", "1000000"], kwc_args=["--resources", "v1/pods"],
              kwc_bin=args.kwc, start_kwc=False)
    try:
        r = env.sim("POST", "/apisim/seed", {"resource": "pods", "count": pods, "namespaces": 10,
                                             "nodes": 1000, "size": 4096})
        print("apisim seeded %d pods in %.1f s" % (r["created"], r["seconds"]))
        # -- cold load
        t0 = time.monotonic()
        env.start_kwc()
        cold = time.monotonic() - t0
        m = re.search(r"synced (\d+) objects \(([\d.]+) MB\) at rv \d+ in ([\d.]+) s \((\d+) objects/s\)",
                      env.kwc.logs(50))
        rows = [["cold load (LIST pages of 500 from apisim)", "%s objects, %s MB" % (m.group(1), m.group(2)),
                 "%s s, %s objects/s" % (m.group(3), m.group(4)), ">= 150,000 objects/s"]]
        # -- RV=0 lists at 1/8/32 listers
        path = "/api/v1/pods?resourceVersion=0"
        lrows = []
        plot = []
        for conc, per in ((1, 3), (8, 1), (32, 1)):
            dw, db, dt = curl_lists(env.apisim.port, path, conc, per)
            stop, peak = threading.Event(), {}
            th = threading.Thread(target=rss_sampler, args=(env.kwc.pid(), stop, peak))
            th.start()
            c0 = cpu_seconds(env.kwc.pid())
            kw, kb, kt = curl_lists(env.kwc.port, path, conc, per)
            cpu = (cpu_seconds(env.kwc.pid()) - c0) / kw
            stop.set()
            th.join()
            lrows.append([conc, "%.2f" % (db / dw / 1e9), "%.2f" % (kb / kw / 1e9),
                          "%.0f / %.0f" % (pct(dt, 50) * 1000, pct(dt, 99) * 1000),
                          "%.0f / %.0f" % (pct(kt, 50) * 1000, pct(kt, 99) * 1000),
                          "%.0f%%" % (cpu * 100), "%.1f / %.0f MB" % (peak.get("RssAnon", 0) / 1024,
                                                                    peak.get("VmRSS", 0) / 1024)])
            plot.append((conc, pct(dt, 50), pct(dt, 99), pct(kt, 50), pct(kt, 99)))
        # -- one node's pods
        npath = "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-7&resourceVersion=0"
        st, _, b = http_request(env.kwc.port, "GET", npath)
        nitems = b.count(b'"nodeName":"node-7"')
        d = wrk(env.apisim.port, npath, 1, args.duration)
        k = wrk(env.kwc.port, npath, 1, args.duration)
        rows.append(["one node's pods (%d of %d) by spec.nodeName, 1 conn" % (nitems, pods),
                     "direct p50/p99 %.2f / %.2f ms" % (d[1], d[2]),
                     "kwc p50/p99 %.2f / %.2f ms (%.0f req/s)" % (k[1], k[2], k[0]), "p99 <= 10 ms"])
        # -- warm restart
        port = env.kwc.port
        env.kwc.stop()
        probe = "/api/v1/namespaces/ns-3/pods?resourceVersion=0&fieldSelector=spec.nodeName%3Dnode-7"
        argv = [args.kwc, "--upstream", "http://127.0.0.1:%d" % env.apisim.port, "--listen",
                "127.0.0.1:%d" % port, "--data-dir", os.path.join(env.dir, "data"), "--resources", "v1/pods",
                "--shutdown-delay-duration", "0"]
        t0 = time.monotonic()
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        first = None
        while time.monotonic() - t0 < 30:
            try:
                st, _, _ = http_request(port, "GET", probe, timeout=2)
                if st == 200:
                    first = time.monotonic() - t0
                    break
            except OSError:
                time.sleep(0.001)
        t1 = time.monotonic()
        st, _, b = http_request(port, "GET", path, timeout=60)
        full = time.monotonic() - t1
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
        rows.append(["warm restart: exec to first RV=0 list answered", "%d pods on disk" % pods,
                     "%.0f ms (then a full %d MB list in %.2f s)" % (first * 1000, len(b) / 1e6, full),
                     "<= 100 ms"])
        env.start_kwc()
        # -- ingest through the whole path
        rv0 = env.sim("GET", "/apisim/stats")["rv"]
        c0 = cpu_seconds(env.kwc.pid())
        env.sim("POST", "/apisim/churn", {"rate": 20000})
        t0 = time.monotonic()
        time.sleep(args.duration)
        env.sim("POST", "/apisim/churn", {"rate": 0})
        rv1 = env.sim("GET", "/apisim/stats")["rv"]
        gen = time.monotonic() - t0
        # wait for kwc to catch up, then count
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if http_request(env.kwc.port, "GET", "/api/v1/namespaces/ns-0/pods?resourceVersion=%d&limit=1" % rv1,
                            timeout=30)[0] == 200:
                break
        caught = time.monotonic() - t0
        cpu = cpu_seconds(env.kwc.pid()) - c0
        nev = rv1 - rv0
        rows.append(["ingest of upstream watch events (apisim churn, as fast as it goes)",
                     "%d events in %.1f s from apisim (%.0f/s)" % (nev, gen, nev / gen),
                     "kwc caught up after %.1f s; %.0f events per kwc CPU-second" % (caught, nev / cpu),
                     ">= 20,000 events/s"])
        if args.bin:
            idir = os.path.join(env.dir, "ingest")
            os.makedirs(idir, exist_ok=True)
            out = subprocess.run([os.path.join(args.bin, "ingest"), idir, str(pods), "200000", "64"],
                                 capture_output=True, text=True, check=True).stdout
            for line in out.strip().split("\n"):
                rows.append(["bench/ingest (no network): " + line.split(":")[0], "", line.split(":", 1)[1].strip(),
                             ">= 150,000 objects/s" if line.startswith("load") else ">= 20,000 events/s"])
        text = table("RV=0 list of %d pods (~4 KiB each), curl readers, apisim direct vs kwc" % pods,
                     ["listers", "direct GB/s", "kwc GB/s", "direct p50/p99 ms", "kwc p50/p99 ms", "kwc CPU",
                      "kwc peak RssAnon / VmRSS"], lrows)
        text += "\n" + table("Cache scenarios (%d pods)" % pods, ["scenario", "size", "result", "target"], rows)
        save("cache", text)
        plot_latency(plot)
    finally:
        env.close()


def fanout(args, port, n, seconds=None, path=None, etcd_prefix=None, nodes=0, idle=False, tls=False,
           token_file=None, warmup=2, deadline=0, protobuf=False, h2=0, announce_heads=False, drain=0, accept=None):
    argv = [os.path.join(args.bin, "fanout"), "--port", str(port), "--watchers", str(n),
            "--seconds", str(seconds or args.duration), "--warmup", str(warmup)]
    argv += ["--etcd-prefix", etcd_prefix] if etcd_prefix else ["--path", path]
    if nodes:
        argv += ["--nodes", str(nodes)]
    if idle:
        argv.append("--idle")
    if tls:
        argv += ["--tls", "--cacert", certs(args)["ca"]]
    if token_file:
        argv += ["--token-file", token_file]
    if deadline:
        argv += ["--deadline", str(deadline)]
    if protobuf:
        argv.append("--protobuf")
    if accept:  # the streams' Accept header (a metadata-only watch)
        argv += ["--accept", accept]
    if h2:  # HTTP/2: h2 streams per connection (prior knowledge, or ALPN h2 with tls)
        argv += ["--h2-streams-per-conn", str(h2)]
    if announce_heads:
        argv.append("--announce-heads")
    if drain:  # read on after the window until every stream is past it (lost vs late), at most drain s
        argv += ["--drain", str(drain)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def read_line(p, timeout):
    """The next line fanout prints, within timeout seconds."""
    import select
    if timeout <= 0 or not select.select([p.stdout], [], [], timeout)[0]:
        p.kill()
        raise RuntimeError("fanout printed nothing in time")
    line = p.stdout.readline()
    if not line:
        raise RuntimeError("fanout ended without a result (exit %s)" % p.wait())
    return line


def fanout_measure(p, server_pid, timeout=600, on_measuring=None):
    """Reads fanout's lines: the server's CPU (share of one core) and RSS over
    the measuring window, and the result; the client's CPU too. on_measuring:
    called when the window starts."""
    import json
    deadline = time.monotonic() + timeout
    c0 = t0 = None
    while True:
        r = json.loads(read_line(p, deadline - time.monotonic()))
        if "measuring" in r:
            c0, t0, cc0 = cpu_seconds(server_pid), time.monotonic(), cpu_seconds(p.pid)
            if on_measuring:
                on_measuring()
            continue
        cpu = (cpu_seconds(server_pid) - c0) / (time.monotonic() - t0) if c0 is not None else 0
        r["client_cpu"] = (cpu_seconds(p.pid) - cc0) / (time.monotonic() - t0) if c0 is not None else 0
        # anonymous memory: kwc's VmRSS also counts the LMDB pages it mapped (page cache)
        r["cpu"], r["rss_mb"] = cpu, rss_kib(server_pid, "RssAnon") / 1024
        p.wait()
        return r


def rss_kib(pid, field="VmRSS"):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """etcd (data on tmpfs: the comparison is fan-out, not fsync) and an etcd
    grpc-proxy in front of it; a writer thread puts ~1 KiB values carrying
    the same written-at stamp apisim puts on its objects, evenly paced."""

    def __init__(self, workdir):
        import threading
        self.dir = tempfile.mkdtemp(prefix="kwc-etcd-", dir="/dev/shm")
        self.port, peer, self.proxy_port = free_port(), free_port(), free_port()
        log = open(os.path.join(workdir, "etcd.log"), "w")
        self.etcd = subprocess.Popen(["etcd", "--data-dir", self.dir, "--listen-client-urls",
                                      "http://127.0.0.1:%d" % self.port, "--advertise-client-urls",
                                      "http://127.0.0.1:%d" % self.port, "--listen-peer-urls",
                                      "http://127.0.0.1:%d" % peer, "--initial-advertise-peer-urls",
                                      "http://127.0.0.1:%d" % peer, "--initial-cluster",
                                      "default=http://127.0.0.1:%d" % peer], stdout=log, stderr=log)
        self.proxy = subprocess.Popen(["etcd", "grpc-proxy", "start", "--endpoints", "127.0.0.1:%d" % self.port,
                                       "--listen-addr", "127.0.0.1:%d" % self.proxy_port], stdout=log, stderr=log)
        wait_for(lambda: http_request(self.port, "GET", "/health", timeout=2)[0] == 200, 30, "etcd /health")
        wait_for(lambda: socket.create_connection(("127.0.0.1", self.proxy_port), 1).close() is None, 30,
                 "etcd grpc-proxy listening")
        self.stop_writer = threading.Event()
        self.writer = None
        self.written = 0

    def start_writer(self, rate):
        import threading
        self.stop_writer.clear()
        self.writer = threading.Thread(target=self._write, args=(rate,), daemon=True)
        self.writer.start()

    def _write(self, rate):
        import base64
        import http.client
        import json
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        t0, i = time.monotonic(), 0
        while not self.stop_writer.is_set():
            d = t0 + i / rate - time.monotonic()
            if d > 0:
                self.stop_writer.wait(d)
            v = '{"metadata":{"annotations":{"apisim.kwc.dev/written-at":"%d"}},"pad":"' % time.time_ns()
            v = (v + "x" * (1000 - len(v) - 2) + '"}').encode()
            body = json.dumps({"key": base64.b64encode(b"/bench/k%d" % (i % 2000)).decode(),
                               "value": base64.b64encode(v).decode()})
            c.request("POST", "/v3/kv/put", body)
            c.getresponse().read()
            i += 1
        self.written += i

    def end_writer(self):
        self.stop_writer.set()
        if self.writer:
            self.writer.join(10)

    def close(self):
        self.end_writer()
        for p in (self.proxy, self.etcd):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        subprocess.run(["rm", "-rf", self.dir])


def bench_watch(args):
    """Issue 4: one event stream fanned out by kwc, by apisim directly, by etcd
    grpc-proxy and by etcd directly; same watchers, same event size."""
    rows, plot = [], []
    hdr = ["scenario", "server", "watchers", "streams", "deliveries/s", "p50 ms", "p99 ms", "max ms",
           "server CPU", "CPU us/delivery", "server RssAnon MB", "target"]

    def row(scenario, server, n, r, target):
        streams = r["streams"] if not r.get("ended") else "%d (%d ended by the server)" % (r["streams"], r["ended"])
        rows.append([scenario, server, n, streams, r["per_s"], r["p50_ms"], r["p99_ms"], r["max_ms"],
                     "%.0f%%" % (r["cpu"] * 100), "%.2f" % (r["cpu"] / max(r["per_s"], 1) * 1e6),
                     "%.0f" % r["rss_mb"], target])
        print(rows[-1], flush=True)

    env = Env(apisim_args=["--pods", "2000", "--nodes", "100", "--pod-size", "1000", "--history", "1000000"],
              kwc_args=["--resources", "v1/pods", "--log-level", "warn"], kwc_bin=args.kwc)
    etcd = Etcd(env.dir)
    try:
        # idle watchers first, on fresh processes: memory per watcher (anonymous RSS)
        n_idle = args.idle
        for server, port, pid, field, kw in (
                ("kwc", env.kwc.port, env.kwc.pid(), "RssAnon",
                 {"path": "/api/v1/pods?watch=1&resourceVersion=%d&timeoutSeconds=3600" % env.stats()["rv"]}),
                ("etcd grpc-proxy", etcd.proxy_port, etcd.proxy.pid, "RssAnon", {"etcd_prefix": "/bench/"})):
            a0 = rss_kib(pid, field)
            p = fanout(args, port, n_idle, idle=True, **kw)
            line = read_line(p, 300)
            a1 = rss_kib(pid, field)
            p.kill()
            p.wait()
            import json
            got = json.loads(line)["streams"] if line else 0
            rows.append(["idle watchers", server, n_idle, got, "-", "-", "-", "-", "-", "-",
                         "+%.1f" % ((a1 - a0) / 1024),
                         "%.2f KiB per watcher%s" % ((a1 - a0) / max(got, 1),
                                                     " (target <= 2 KiB)" if server == "kwc" else "")])
            print(rows[-1], flush=True)
        # the issue's two points with every server, then 10,000 at half the
        # rate (below what this machine can carry) for kwc and apisim
        runs = [(int(n), 100, ("kwc", "apisim", "etcd grpc-proxy", "etcd")) for n in args.watchers.split(",")]
        runs.append((10000, 50, ("kwc", "apisim")))
        for n, rate, servers in runs:
            target = "p99 <= %d ms" % (5 if n <= 1000 else 20) if rate == 100 else "-"
            for server in servers:
                if server in ("kwc", "apisim"):
                    port, pid = (env.kwc.port, env.kwc.pid()) if server == "kwc" else \
                        (env.apisim.port, env.apisim.pid())
                    rv = env.stats()["rv"]
                    env.sim("POST", "/apisim/churn", {"rate": rate, "resources": [resource], "mix": {"update": 1.0}})
                    p = fanout(args, port, n, path="/api/v1/pods?watch=1&resourceVersion=%d&timeoutSeconds=600" % rv)
                    try:
                        r = fanout_measure(p, pid)
                    finally:
                        env.sim("POST", "/apisim/churn", {"rate": 0})
                else:
                    port, pid = (etcd.proxy_port, etcd.proxy.pid) if server != "etcd" else (etcd.port, etcd.etcd.pid)
                    etcd.start_writer(rate)
                    p = fanout(args, port, n, etcd_prefix="/bench/")
                    try:
                        r = fanout_measure(p, pid)
                    finally:
                        etcd.end_writer()
                row("full fan-out, %d ev/s x 1 KiB" % rate, server, n, r, target)
                if rate == 100:
                    plot.append((server, n, r["p50_ms"], r["p99_ms"]))
        # saturation: more asked than this machine can carry (2,000,000 deliveries/s)
        for n, rate in ((10000, 200), (1000, 2000)):
            rv = env.stats()["rv"]
            env.sim("POST", "/apisim/churn", {"rate": rate, "resources": [resource], "mix": {"update": 1.0}})
            p = fanout(args, env.kwc.port, n, path="/api/v1/pods?watch=1&resourceVersion=%d&timeoutSeconds=600" % rv)
            try:
                r = fanout_measure(p, env.kwc.pid())
            finally:
                env.sim("POST", "/apisim/churn", {"rate": 0})
            row("saturation: %d ev/s x 1 KiB asked" % rate, "kwc", n, r, ">= 1,000,000 deliveries/s")
    finally:
        etcd.close()
        env.close()
    # kubelet pattern
    env = Env(apisim_args=["--nodes", "5000", "--history", "2000000"],
              kwc_args=["--resources", "v1/pods", "--log-level", "warn"], kwc_bin=args.kwc, start_kwc=False)
    try:
        env.sim("POST", "/apisim/seed", {"resource": "pods", "count": args.pods, "namespaces": 10,
                                         "nodes": 5000, "size": 1000})
        env.start_kwc()
        rv = env.stats()["rv"]
        env.sim("POST", "/apisim/churn", {"rate": 500, "resources": ["pods"], "mix": {"update": 1.0}})
        p = fanout(args, env.kwc.port, 5000, nodes=5000,
                   path="/api/v1/pods?watch=1&resourceVersion=%d&timeoutSeconds=600" % rv)
        try:
            r = fanout_measure(p, env.kwc.pid())
        finally:
            env.sim("POST", "/apisim/churn", {"rate": 0})
        row("kubelet: fieldSelector=spec.nodeName, %d pods, 500 ev/s" % args.pods, "kwc", 5000, r, "p99, CPU")
    finally:
        env.close()
    save("watch", table("Watch fan-out (write-to-receipt latency; server CPU as % of one core)", hdr, rows))
    plot_fanout(plot)


def plot_fanout(points, name="watch-latency", title="Watch fan-out: 1 KiB events at 100/s, write-to-receipt latency"):
    """PNG: p50/p99 write-to-receipt latency vs watchers, per server (gnuplot)."""
    if not SAVE:
        return
    servers = []
    for s, *_ in points:
        if s not in servers:
            servers.append(s)
    data = os.path.join(RESULTS, name + ".dat")
    with open(data, "w") as f:
        for s in servers:
            f.write("# %s\n" % s)
            for srv, n, p50, p99 in points:
                if srv == s:
                    f.write("%d %.3f %.3f\n" % (n, max(p50, 0.01), max(p99, 0.01)))
            f.write("\n\n")
    plots = []
    for i, s in enumerate(servers):
        plots.append("'%s' index %d using 1:3 with linespoints title '%s p99'" % (data, i, s))
        plots.append("'%s' index %d using 1:2 with linespoints dashtype 2 title '%s p50'" % (data, i, s))
    script = """set terminal png size 900,560
set output '%s'
set title '%s'
set xlabel 'watchers'
set ylabel 'ms (log)'
set logscale xy
set key left top
plot %s
""" % (os.path.join(RESULTS, name + ".png"), title, ", ".join(plots))
    subprocess.run(["gnuplot"], input=script, text=True, check=False)


def plot_latency(points):
    """PNG: list latency vs listers, direct vs kwc (gnuplot)."""
    if not SAVE:
        return
    data = os.path.join(RESULTS, "cache-latency.dat")
    with open(data, "w") as f:
        for c, d50, d99, k50, k99 in points:
            f.write("%d %.4f %.4f %.4f %.4f\n" % (c, d50, d99, k50, k99))
    script = """set terminal png size 800,500
set output '%s'
set title 'RV=0 list of all pods: latency vs concurrent listers'
set xlabel 'concurrent listers'
set ylabel 'seconds per list'
set logscale x 2
set key left top
plot '%s' using 1:2 with linespoints title 'apisim p50', '' using 1:3 with linespoints title 'apisim p99', \
     '' using 1:4 with linespoints title 'kwc p50', '' using 1:5 with linespoints title 'kwc p99'
""" % (os.path.join(RESULTS, "cache-latency.png"), data)
    subprocess.run(["gnuplot"], input=script, text=True, check=False)


# ---- before vs after: kwc's HTTP front end (libevhtp -> its own layer + TLS) ----
#
# Three servers in every scenario, in one run: BEFORE is kwc built from
# --baseline-commit (the last libevhtp build), AFTER is --kwc, plaintext and
# over TLS (--tls-cert-file/--tls-private-key-file, an EC P-256 certificate
# from a CA made with the openssl CLI for this run). A server whose binary
# lacks a flag the row needs is reported as n/a, not run.

BEFORE, AFTER, AFTER_TLS = "before (libevhtp), plain", "after, plain", "after, TLS"
TLS_FLAGS = ("--tls-cert-file", "--tls-private-key-file")


class Unavailable(Exception):
    """This server cannot run the row: str() is what the row says instead."""


class Unsupported(Unavailable):
    """The binary does not know a flag the row needs."""

    def __str__(self):
        return "n/a (flag unsupported: %s)" % ", ".join(self.args[0])



def shown_kwc(path):
    """How a results header names the kwc binary: relative to the repository,
    else "a kwc built outside this tree"; never a path of this machine (the
    docs refer to nothing outside the repository: make check-docs)."""
    root = os.path.dirname(HERE)
    full = os.path.abspath(path)
    if full.startswith(root + os.sep):
        return os.path.relpath(full, root)
    return "a kwc built outside this tree"

def git(*argv):
    return subprocess.run(["git", "-C", ROOT] + list(argv), capture_output=True, text=True,
                          check=True).stdout.strip()


def build_baseline(commit):
    """kwc as of commit: its tree (git archive) in build/baseline/<sha>/, its
    Debian packages (its own tests/lib/deps.sh build: libevhtp-dev for the
    libevhtp builds) and its own Makefile. Reused while the binary is there."""
    sha = git("rev-parse", "--verify", commit + "^{commit}")
    top = os.path.join(ROOT, "build", "baseline", sha)
    kwc = os.path.join(top, "build", "kwc")
    if os.path.exists(os.path.join(top, ".built")) and os.path.exists(kwc):
        return kwc
    print("baseline: building kwc %s (%s) in %s" % (commit, git("log", "-1", "--format=%h %s", sha)[:70], top),
          file=sys.stderr, flush=True)
    subprocess.run(["rm", "-rf", top], check=True)
    os.makedirs(top)
    archive = subprocess.Popen(["git", "-C", ROOT, "archive", sha], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", top], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError("git archive %s failed" % sha)
    subprocess.run(["bash", os.path.join(top, "tests", "lib", "deps.sh"), "build"], check=True)
    subprocess.run(["make", "-C", top, "-j%d" % (os.cpu_count() or 2), "WERROR=0", "all"], check=True,
                   stdout=subprocess.DEVNULL)
    open(os.path.join(top, ".built"), "w").close()
    return kwc


_help = {}


def missing_flags(binary, flags):
    """The flags binary's --help does not list."""
    if binary not in _help:
        r = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
        _help[binary] = r.stdout + r.stderr
    return [f for f in flags if not re.search(re.escape(f) + r"(?![\w-])", _help[binary])]


def certs(args):
    """A CA and a server certificate for 127.0.0.1 (EC P-256), made once per
    run with the openssl CLI in a temporary directory."""
    if getattr(args, "tls", None):
        return args.tls
    d = tempfile.mkdtemp(prefix="kwc-bench-tls-")
    f = {k: os.path.join(d, k + ext) for k, ext in
         (("ca", ".crt"), ("ca_key", ".key"), ("cert", ".crt"), ("key", ".key"), ("csr", ".csr"), ("ext", ".cnf"))}
    with open(f["ext"], "w") as o:
        o.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:false\n")
    for cmd in (
            ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f["ca_key"]],
            ["req", "-x509", "-new", "-key", f["ca_key"], "-subj", "/CN=kwc-bench-ca", "-days", "7", "-out", f["ca"],
             "-addext", "basicConstraints=critical,CA:true", "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
            ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f["key"]],
            ["req", "-new", "-key", f["key"], "-subj", "/CN=127.0.0.1", "-out", f["csr"]],
            ["x509", "-req", "-in", f["csr"], "-CA", f["ca"], "-CAkey", f["ca_key"], "-CAcreateserial",
             "-days", "7", "-out", f["cert"], "-extfile", f["ext"]]):
        subprocess.run(["openssl"] + cmd, check=True, capture_output=True)
    args.tls = f
    return f


class Variant:
    def __init__(self, label, binary, tls):
        self.label, self.binary, self.tls = label, binary, tls


def variants(args):
    return [Variant(BEFORE, args.baseline_kwc, False), Variant(AFTER, args.kwc, False),
            Variant(AFTER_TLS, args.kwc, True)]


class Kwc:
    """One kwc against env's apisim, its own data directory and log. TLS: the
    variant's certificate flags, readiness probed over https (verifying the
    test CA). flags: what the row needs ((flag, value)...; Unsupported if the
    binary lacks one); optional: passed only where the binary knows them.
    kubeconfig: the upstream and kwc's credentials from it instead of
    --upstream (an apisim with --policy)."""

    def __init__(self, args, env, v, tag, flags=(), optional=(), base=("--resources", "v1/pods", "--log-level", "warn"),
                 ready_timeout=900, kubeconfig=None):
        self.v, self.args, self.shim = v, args, None
        need = [f for f, _ in flags] + (list(TLS_FLAGS) if v.tls and not args.tls_shim else [])
        miss = missing_flags(v.binary, need)
        if miss:
            raise Unsupported(miss)
        up = ["--kubeconfig", kubeconfig] if kubeconfig else ["--upstream", "http://127.0.0.1:%d" % env.apisim.port]
        argv = [v.binary] + up + ["--listen", "127.0.0.1:0",
                                  "--data-dir", os.path.join(env.dir, "data-" + tag)] + list(base)
        for f, val in list(flags) + [o for o in optional if not missing_flags(v.binary, [o[0]])]:
            argv += [f, str(val)]
        # every load generator here is one address (127.0.0.1): the per-source
        # limits (issue 29) would measure themselves; a row about them sets its own
        given = {f for f, _ in list(flags) + list(optional)}
        for f in ("--max-connections-per-source", "--max-reviews-per-source"):
            if f not in given and not missing_flags(v.binary, [f]):
                argv += [f, "0"]
        if v.tls and not args.tls_shim:
            argv += ["--tls-cert-file", certs(args)["cert"], "--tls-private-key-file", certs(args)["key"]]
            if not any(f == "--auth" for f, _ in flags) and not missing_flags(v.binary, ["--auth"]):
                # TLS turns on --auth delegated by default; the transport
                # scenarios measure TLS alone (the auth scenario sets --auth)
                argv += ["--auth", "none"]
        self.proc = Proc("kwc-" + tag, argv, env.dir)
        try:
            self.proc.start()
            self.port = self.proc.port
            if v.tls and args.tls_shim:
                self.shim = Proc("tlsshim-" + tag, [sys.executable, os.path.join(HERE, "tlsshim.py"), "--cert",
                                                    certs(args)["cert"], "--key", certs(args)["key"],
                                                    "--upstream-port", str(self.proc.port)], env.dir).start()
                self.port = self.shim.port
            wait_for(lambda: self.get("/readyz", timeout=5)[0] == 200, ready_timeout, "%s /readyz" % tag)
        except Exception as e:  # the row reports it; the other servers and scenarios still run
            print("%s did not start: %s\n%s" % (tag, e, self.proc.logs(20)), file=sys.stderr, flush=True)
            self.stop()
            raise Unavailable("failed to start: %s" % str(e).split("\n")[0][:120])

    @property
    def pid(self):
        return self.proc.pid()

    def ssl_context(self):
        import ssl
        return ssl.create_default_context(cafile=certs(self.args)["ca"]) if self.v.tls else None

    def connection(self, timeout):
        import http.client
        if self.v.tls:
            return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=self.ssl_context())
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def get(self, path, timeout=30):
        c = self.connection(timeout)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def stop(self):
        for p in (self.shim, self.proc):
            if p and p.p:
                try:
                    p.stop(timeout=30)
                except RuntimeError as e:
                    print("warning: %s" % e, file=sys.stderr)


def proc_fds(pid):
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return 0


class Sampler:
    """Peak RssAnon, VmRSS (KiB) and open fds of a process until stopped."""

    def __init__(self, pid, every=0.05):
        import threading
        self.pid, self.every, self.peak = pid, every, {"RssAnon": 0, "VmRSS": 0, "fds": 0}
        self.stop_ev = threading.Event()
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()

    def _run(self):
        while not self.stop_ev.is_set():
            for k in ("RssAnon", "VmRSS"):
                self.peak[k] = max(self.peak[k], rss_kib(self.pid, k))
            self.peak["fds"] = max(self.peak["fds"], proc_fds(self.pid))
            self.stop_ev.wait(self.every)

    def stop(self):
        self.stop_ev.set()
        self.th.join()
        return self.peak


def seeded_env(args, pods, size, extra=()):
    env = Env(apisim_args=["--nodes", "1000", "--history", "1000000"] + list(extra), start_kwc=False)
    if pods:
        r = env.sim("POST", "/apisim/seed", {"resource": "pods", "count": pods, "namespaces": 10, "nodes": 1000,
                                             "size": size})
        print("apisim seeded %d pods in %.1f s" % (r["created"], r["seconds"]), flush=True)
    return env


def one_pod_path(env):
    """GET one pod, answered from kwc's cache (resourceVersion=0, as the
    watch cache would)."""
    it = env.sim("GET", "/api/v1/pods?limit=1")["items"][0]["metadata"]
    return "/api/v1/namespaces/%s/pods/%s?resourceVersion=0" % (it["namespace"], it["name"])


def start_all(args, env, tag, **kw):
    """{label: Kwc or Unsupported} for the three variants."""
    out = {}
    for v in variants(args):
        try:
            out[v.label] = Kwc(args, env, v, tag + "-" + v.label.split()[0] + ("-tls" if v.tls else ""), **kw)
        except Unavailable as e:
            out[v.label] = e
            print("%s: %s" % (v.label, e), flush=True)
    return out


def stop_all(servers):
    for k in servers.values():
        if isinstance(k, Kwc):
            k.stop()


def ratio(label, value, base):
    """The row's share of what it is compared with: after vs before, TLS vs
    after plain."""
    ref = base.get(AFTER if label == AFTER_TLS else BEFORE) if label != BEFORE else None
    if ref is None or not value or not ref:
        return "-"
    return "%.0f%% of %s" % (100 * value / ref, "after plain" if label == AFTER_TLS else "before")


def bench_front(args):
    """GET one pod (cached, keep-alive, wrk) and RV=0 lists of all pods
    (curl): before vs after plaintext, after over TLS."""
    env = seeded_env(args, args.pods, 4096)
    servers = {}
    try:
        servers = start_all(args, env, "front")
        path = one_pod_path(env)
        target = {BEFORE: "-", AFTER: ">= 100% of before", AFTER_TLS: ">= 75% of after plain"}
        rows = []
        for conns in (1, 8, 32):
            rps = {}
            for label, k in servers.items():
                if not isinstance(k, Kwc):
                    rows.append([conns, label, str(k)] + ["-"] * 5 + [target[label]])
                    continue
                c0, t0 = cpu_seconds(k.pid), time.monotonic()
                r = wrk(k.port, path, conns, args.duration, "https" if k.v.tls else "http")
                cpu = cpu_seconds(k.pid) - c0
                el = time.monotonic() - t0
                rps[label] = r[0]
                rows.append([conns, label, "%.0f" % r[0], ratio(label, r[0], rps), "%.2f / %.2f" % (r[1], r[2]),
                             "%.0f%%" % (100 * cpu / el), "%.1f" % (cpu / max(r[0] * el, 1) * 1e6),
                             "%d / %d" % (r[3], r[4]), target[label]])
                print(rows[-1], flush=True)
        text = table("GET one pod from the cache (~4 KiB, resourceVersion=0), wrk %ds per cell, keep-alive: "
                     "before vs after, plaintext and TLS" % args.duration,
                     ["conns", "server", "req/s", "vs", "p50 / p99 ms", "kwc CPU", "kwc CPU us/req",
                      "non-2xx / socket errors", "target"], rows)
        lpath = "/api/v1/pods?resourceVersion=0"
        rows = []
        for conc, per in ((1, 3), (8, 1), (32, 1)):
            gbs = {}
            for label, k in servers.items():
                if not isinstance(k, Kwc):
                    rows.append([conc, label, str(k)] + ["-"] * 5 + [target[label]])
                    continue
                smp = Sampler(k.pid)
                c0 = cpu_seconds(k.pid)
                wall, nbytes, times = curl_lists(k.port, lpath, conc, per, certs(args)["ca"] if k.v.tls else None)
                cpu = cpu_seconds(k.pid) - c0
                peak = smp.stop()
                gbs[label] = nbytes / wall / 1e9
                rows.append([conc, label, "%.2f" % gbs[label], ratio(label, gbs[label], gbs),
                             "%.0f / %.0f" % (pct(times, 50) * 1000, pct(times, 99) * 1000),
                             "%.0f%%" % (100 * cpu / wall), "%.2f" % (cpu / (nbytes / 1e9)),
                             "%.1f / %.0f MB" % (peak["RssAnon"] / 1024, peak["VmRSS"] / 1024), target[label]])
                print(rows[-1], flush=True)
        text += "\n" + table("RV=0 list of %d pods (~4 KiB each) from the cache, curl listers: before vs after, "
                             "plaintext and TLS" % args.pods,
                             ["listers", "server", "GB/s", "vs", "p50 / p99 ms per list", "kwc CPU",
                              "kwc CPU s/GB", "kwc peak RssAnon / VmRSS", "target"], rows)
        save("front", text)
    finally:
        stop_all(servers)
        env.close()


def bench_watch_tls(args):
    """The watch scenario's full fan-out (1 KiB events at 100/s) through kwc
    only: before vs after plaintext, after over TLS (fanout --tls)."""
    env = Env(apisim_args=["--pods", "2000", "--nodes", "100", "--pod-size", "1000", "--history", "1000000"],
              start_kwc=False)
    rows, plot = [], []
    try:
        for v in variants(args):
            try:
                k = Kwc(args, env, v, "watch-" + v.label.split()[0] + ("-tls" if v.tls else ""),
                        optional=(("--max-connections", max(int(x) for x in args.watchers.split(",")) + 1000),))
            except Unavailable as e:
                for n in (int(x) for x in args.watchers.split(",")):
                    rows.append([n, v.label, str(e)] + ["-"] * 9)
                continue
            try:
                for n in (int(x) for x in args.watchers.split(",")):
                    rv = env.stats()["rv"]
                    env.sim("POST", "/apisim/churn", {"rate": 100, "resources": ["pods"], "mix": {"update": 1.0}})
                    p = fanout(args, k.port, n, tls=v.tls,
                               path="/api/v1/pods?watch=1&resourceVersion=%d&timeoutSeconds=600" % rv)
                    try:
                        r = fanout_measure(p, k.pid)
                    finally:
                        env.sim("POST", "/apisim/churn", {"rate": 0})
                    streams = "%d" % r["streams"] + (" (%d ended by kwc)" % r["ended"] if r.get("ended") else "") + \
                        (" (%d TLS handshakes failed)" % r["tls_failures"] if r.get("tls_failures") else "")
                    rows.append([n, v.label, streams, r["per_s"], r["p50_ms"], r["p99_ms"], r["max_ms"],
                                 "%.0f%%" % (r["cpu"] * 100), "%.2f" % (r["cpu"] / max(r["per_s"], 1) * 1e6),
                                 "%.0f%%" % (r["client_cpu"] * 100), "%.0f" % r["rss_mb"],
                                 "p99 <= %d ms" % (5 if n <= 1000 else 20)])
                    print(rows[-1], flush=True)
                    plot.append((v.label, n, r["p50_ms"], r["p99_ms"]))
            finally:
                k.stop()
    finally:
        env.close()
    save("front", table("Watch fan-out through kwc, 1 KiB events at 100/s: before vs after, plaintext and TLS "
                        "(write-to-receipt latency; CPU as % of one core; fanout --tls verifies the test CA)",
                        ["watchers", "server", "streams", "deliveries/s", "p50 ms", "p99 ms", "max ms", "kwc CPU",
                         "kwc CPU us/delivery", "client CPU", "kwc RssAnon MB", "target"], rows))
    plot_fanout(plot, "front-watch-latency", "Watch fan-out through kwc before/after, plaintext and TLS: 1 KiB "
                "events at 100/s")


def bench_metrics(args):
    """Fan-out with and without the metrics counters (BEFORE = the commit
    before them): deliveries/s and kwc CPU per delivery, ABBA, same run."""
    import json
    import threading
    env = Env(apisim_args=["--pods", "2000", "--nodes", "100", "--pod-size", "1000", "--history", "1000000"],
              start_kwc=False)
    counts = [int(x) for x in args.watchers.split(",")]
    base, after = Variant("before (no metrics)", args.baseline_kwc, False), Variant("after (metrics)", args.kwc, False)
    servers = {}
    rows = []
    try:
        for v, tag in ((base, "metrics-before"), (after, "metrics-after")):
            # the protobuf cache of pods (on by default since issue 13) ingests
            # the churn a second time: off here, so that the two differ by the
            # counters and the scrapes alone (bench_protobuf measures that cache)
            servers[v.label] = Kwc(args, env, v, tag, optional=(("--max-connections", max(counts) + 1000),
                                                                ("--protobuf-resources", "none")))
        stop_scrape = threading.Event()
        scrapes = [0, 0]
        series = []  # (seconds, events sent, CPU seconds, watchers, resident bytes) from each scrape
        t_start = time.monotonic()

        def scraper():
            k = servers[after.label]
            while not stop_scrape.wait(1.0):
                try:
                    st, body = k.get("/metrics", timeout=10)
                    scrapes[0] += st == 200
                    scrapes[1] = len(body)
                    if st == 200:
                        text = body.decode() if isinstance(body, bytes) else body
                        series.append((time.monotonic() - t_start,
                                       metric_sum(text, "kwc_watch_events_sent_total"),
                                       metric_sum(text, "process_cpu_seconds_total"),
                                       metric_sum(text, "kwc_watchers"),
                                       metric_sum(text, "process_resident_memory_bytes")))
                except OSError:
                    pass
        th = threading.Thread(target=scraper, daemon=True)
        th.start()
        try:
            for n in counts:
                got = {base.label: [], after.label: []}
                for v in (base, after, after, base):  # ABBA: drift over the run hits both alike
                    k = servers[v.label]
                    rv = env.stats()["rv"]
                    env.sim("POST", "/apisim/churn", {"rate": 100, "resources": ["pods"], "mix": {"update": 1.0}})
                    p = fanout(args, k.port, n, path="/api/v1/pods?watch=1&resourceVersion=%d&timeoutSeconds=600" % rv)
                    try:
                        r = fanout_measure(p, k.pid)
                    finally:
                        env.sim("POST", "/apisim/churn", {"rate": 0})
                    got[v.label].append(r)
                    print(json.dumps({"watchers": n, "server": v.label, "per_s": r["per_s"], "cpu": r["cpu"],
                                      "p99_ms": r["p99_ms"]}), flush=True)
                mean = {}
                for label, rs in got.items():
                    per_s = sum(r["per_s"] for r in rs) / len(rs)
                    us = sum(r["cpu"] / max(r["per_s"], 1) * 1e6 for r in rs) / len(rs)
                    p99 = sum(r["p99_ms"] for r in rs) / len(rs)
                    mean[label] = (per_s, us, p99)
                b, a = mean[base.label], mean[after.label]
                for label, (per_s, us, p99) in mean.items():
                    diff = "-" if label == base.label else "%+.1f%% / %+.1f%%" % (
                        100 * (per_s - b[0]) / max(b[0], 1), 100 * (us - b[1]) / max(b[1], 1e-9))
                    rows.append([n, label, "%.0f" % per_s, "%.2f" % us, "%.1f" % p99, diff,
                                 "within 2 %" if label == after.label else "-"])
                    print(rows[-1], flush=True)
        finally:
            stop_scrape.set()
            th.join(15)
        note = "after scraped every second (%d scrapes of ~%d KB)" % (scrapes[0], scrapes[1] // 1024)
    finally:
        for k in servers.values():
            k.stop()
        env.close()
    plot_metrics(series)
    save("metrics", table("Fan-out with and without metrics, 1 KiB events at 100/s (fanout.c), ABBA, mean of two "
                          "runs per cell; %s" % note,
                          ["watchers", "server", "deliveries/s", "kwc CPU us/delivery", "p99 ms",
                           "vs before: deliveries/s / CPU per delivery", "target"], rows))


def bench_rooms(args):
    """Issue 20: proxy/ renovated into rooms changes no behaviour and costs
    nothing. BEFORE = --baseline-commit (the tree before the renovation),
    AFTER = --kwc; both against one apisim, ABBA in one run (drift over the
    run hits both alike), each cell the mean of its two runs:
    watch fan-out (fanout.c: watchers at 100 events/s of ~1 KiB pods:
    deliveries/s, kwc CPU per delivery, p99), cached answers (wrk: a
    resourceVersion=0 get, a 500-item NotOlderThan page of the pod list, the
    whole list at resourceVersion=0)
    and passthrough (wrk: a get with no resourceVersion, which kwc forwards).
    Each wrk cell: requests/s, p99 and kwc CPU per request."""
    import json
    env = Env(apisim_args=["--pods", "2000", "--nodes", "100", "--pod-size", "1000", "--history", "1000000"],
              start_kwc=False)
    n = int(args.watchers.split(",")[0])
    before_label = "before (%s)" % git("rev-parse", "--short", args.baseline_commit)
    base, after = Variant(before_label, args.baseline_kwc, False), Variant("after (rooms)", args.kwc, False)
    servers, got = {}, {base.label: [], after.label: []}
    try:
        for v, tag in ((base, "rooms-before"), (after, "rooms-after")):
            servers[v.label] = Kwc(args, env, v, tag, optional=(("--max-connections", n + 1000),
                                                                ("--protobuf-resources", "none")))
        key = env.sim("GET", "/apisim/state?resource=pods")["items"][0]["key"]
        ns, name = key.split("/")
        cells = (("cached get (rv=0), 8 conns", "/api/v1/namespaces/%s/pods/%s?resourceVersion=0" % (ns, name), 8),
                 # a paged list is the cache's with NotOlderThan (rv=0 ignores limit, as kube does)
                 ("cached page of 500 (NotOlderThan), 2 conns",
                  "/api/v1/pods?resourceVersion=1&resourceVersionMatch=NotOlderThan&limit=500", 2),
                 ("cached list of 2,000 (rv=0), 2 conns", "/api/v1/pods?resourceVersion=0", 2),
                 ("passthrough get, 8 conns", "/api/v1/namespaces/%s/pods/%s" % (ns, name), 8))
        for v in (base, after, after, base):
            k = servers[v.label]
            m = {}
            rv = env.stats()["rv"]
            env.sim("POST", "/apisim/churn", {"rate": 100, "resources": ["pods"], "mix": {"update": 1.0}})
            p = fanout(args, k.port, n, path="/api/v1/pods?watch=1&resourceVersion=%d&timeoutSeconds=600" % rv)
            try:
                r = fanout_measure(p, k.pid)
            finally:
                env.sim("POST", "/apisim/churn", {"rate": 0})
            m["watch"] = (r["per_s"], r["cpu"] / max(r["per_s"], 1) * 1e6, r["p99_ms"])
            for label, path, conns in cells:
                c0, t0 = cpu_seconds(k.pid), time.monotonic()
                w = wrk(k.port, path, conns, args.duration)
                cpu = (cpu_seconds(k.pid) - c0) / (time.monotonic() - t0)
                if w[3] or w[4]:
                    raise RuntimeError("%s: %s answered %d non-2xx, %d socket errors" % (label, v.label, w[3], w[4]))
                m[label] = (w[0], w[2], cpu / max(w[0], 1) * 1e6)
            got[v.label].append(m)
            print(json.dumps({"server": v.label, **{c: [round(x, 2) for x in t] for c, t in m.items()}}), flush=True)
    finally:
        for k in servers.values():
            k.stop()
        env.close()

    def mean(label, cell, i):
        return sum(m[cell][i] for m in got[label]) / len(got[label])

    def delta(cell, i):
        b, a = mean(base.label, cell, i), mean(after.label, cell, i)
        return "%+.1f%%" % (100 * (a - b) / b) if b else "-"

    rows = []
    for i, (what, fmt) in enumerate((("deliveries/s", "%.0f"), ("kwc CPU us/delivery", "%.2f"), ("p99 ms", "%.1f"))):
        rows.append(["watch, %d watchers, 100 ev/s" % n, what, fmt % mean(base.label, "watch", i),
                     fmt % mean(after.label, "watch", i), delta("watch", i)])
    for label, _, _ in cells:
        for i, (what, fmt) in enumerate((("requests/s", "%.0f"), ("p99 ms", "%.2f"), ("kwc CPU us/request", "%.1f"))):
            rows.append([label, what, fmt % mean(base.label, label, i), fmt % mean(after.label, label, i),
                         delta(label, i)])
    save("rooms", table("proxy/ in rooms: %s and after, ABBA in one run, each cell the mean of two runs "
                        "(wrk %ds per cell)" % (before_label, args.duration),
                        ["scenario", "measure", base.label, after.label, "after vs before"], rows))


def metric_sum(text, name):
    """The sum of every sample of one metric in a Prometheus text body."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def plot_metrics(series, name="metrics-scrape"):
    """PNG: what kwc's own /metrics said during the metrics scenario, one
    scrape a second: deliveries/s and CPU (rates), watchers, resident memory."""
    if not SAVE or len(series) < 3:
        return
    data = os.path.join(RESULTS, name + ".dat")
    with open(data, "w") as f:
        f.write("# seconds deliveries/s cpu-cores watchers resident-MB\n")
        for (t0, e0, c0, _, _), (t1, e1, c1, w1, r1) in zip(series, series[1:]):
            dt = max(t1 - t0, 1e-3)
            f.write("%.1f %.0f %.3f %.0f %.1f\n" % (t1, max(e1 - e0, 0) / dt, max(c1 - c0, 0) / dt, w1, r1 / 1e6))
    script = """set terminal png size 900,900 noenhanced
set output '%s'
set multiplot layout 3,1 title "kwc's /metrics during the metrics scenario (the 'after' kwc, scraped every second)"
set xlabel 'seconds'
set ylabel 'deliveries/s'
set y2label 'CPU (cores)'
set y2tics
set ytics nomirror
plot '%s' using 1:2 with lines title 'rate(kwc_watch_events_sent_total)', '' using 1:3 axes x1y2 with lines title 'rate(process_cpu_seconds_total)'
unset y2tics
unset y2label
set ylabel 'watchers'
plot '%s' using 1:4 with lines title 'kwc_watchers'
set ylabel 'MB'
plot '%s' using 1:5 with lines title 'process_resident_memory_bytes'
unset multiplot
""" % (os.path.join(RESULTS, name + ".png"), data, data, data)
    subprocess.run(["gnuplot"], input=script, text=True, check=False)


def tlsprobe(args, n):
    """bench/tlsprobe: OpenSSL's own heap per idle server connection."""
    import json
    exe = os.path.join(args.bin, "tlsprobe")
    if not os.path.exists(exe):
        return None
    out = subprocess.run([exe, "--cert", certs(args)["cert"], "--key", certs(args)["key"], "--conns", str(n)],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    return json.loads(out)


def idle_growth(args, env, v, n, path, tag):
    """A fresh kwc of variant v, n connections held by fanout --idle on path
    (a GET: idle connections after one request; a watch: idle watchers).
    (fanout's result, kwc RssAnon growth in KiB, fds added). Unavailable if
    that kwc does not start."""
    import json
    # bare seconds: what older binaries (the "before" side) take too; kwc
    # still reads them as seconds, with a deprecation note
    k = Kwc(args, env, v, tag, optional=(("--idle-timeout", 3600), ("--request-header-timeout", 600),
                                         ("--max-connections", n + 1000)))
    try:
        warm = one_pod_path(env)
        for _ in range(20):  # one-time costs (the first handshake, lazily built tables) before a0
            k.get(warm)
        time.sleep(0.5)
        a0, f0 = rss_kib(k.pid, "RssAnon"), proc_fds(k.pid)
        p = fanout(args, k.port, n, path=path, idle=True, tls=v.tls, deadline=240)
        try:
            r = json.loads(read_line(p, 300))
            time.sleep(1)
            a1, f1 = rss_kib(k.pid, "RssAnon"), proc_fds(k.pid)
        finally:
            p.kill()
            p.wait()
    finally:
        k.stop()
    return r, a1 - a0, f1 - f0


def bench_idle_tls(args):
    """Memory per idle connection (one handshake, one GET, then nothing):
    kwc's RssAnon growth over N connections held by fanout --idle."""
    n = args.idle_conns
    probe = tlsprobe(args, n)
    rows, per = [], {}
    env = Env(apisim_args=["--pods", "100", "--nodes", "4"], start_kwc=False)
    try:
        path = one_pod_path(env)
        for v in variants(args):
            try:
                r, grow, fds = idle_growth(args, env, v, n, path,
                                           "idle-" + v.label.split()[0] + ("-tls" if v.tls else ""))
            except Unavailable as e:
                rows.append([v.label, str(e)] + ["-"] * 6)
                continue
            a0, a1, f0, f1 = 0, grow, 0, fds
            got = max(r["streams"], 1)
            per[v.label] = (a1 - a0) / got
            share = beyond = delta = "-"
            if v.tls:
                if probe:
                    floor = probe["release_buffers"]["idle_heap"] / 1024
                    share = "%.2f (%.2f with OpenSSL's default buffers)" % (
                        floor, probe["default"]["idle_heap"] / 1024)
                    beyond = "%.2f" % (per[v.label] - floor)
                if AFTER in per:
                    delta = "%+.2f" % (per[v.label] - per[AFTER])
            else:
                beyond = "%.2f" % per[v.label]
            rows.append([v.label, "%d%s" % (r["streams"], " (%d ended)" % r["ended"] if r.get("ended") else ""),
                         "+%.1f" % ((a1 - a0) / 1024), "%.2f" % per[v.label], share, delta, beyond,
                         "+%d" % (f1 - f0)])
            print(rows[-1], flush=True)
    finally:
        env.close()
    for r in rows:
        r.append("<= 4 KiB beyond OpenSSL's minimum" if r[0] == AFTER_TLS else "<= 4 KiB")
    text = table("Idle connections: %d held after one handshake and one GET (fanout --idle), kwc RssAnon growth "
                 "per connection (KiB)" % n,
                 ["server", "connections", "kwc RssAnon MB", "KiB per conn", "OpenSSL's own KiB per conn "
                  "(bench/tlsprobe)", "TLS - plain KiB", "kwc KiB beyond OpenSSL", "kwc fds", "target"], rows)
    if probe:
        d, rb = probe["default"], probe["release_buffers"]
        text += ("\nbench/tlsprobe (%s, %s %s, %d server/client pairs on socketpairs, OpenSSL's allocations counted "
                 "through CRYPTO_set_mem_functions, glibc chunk rounding): a server SSL object after SSL_new %.2f KiB; "
                 "idle after the handshake and one request/response %.2f KiB in %.0f blocks with OpenSSL's default "
                 "buffers, %.2f KiB in %.0f blocks with SSL_MODE_RELEASE_BUFFERS (the minimum, subtracted above). "
                 "The kernel's socket memory is not in RssAnon.\n" % (
                     probe["openssl"], d["protocol"], d["cipher"], probe["conns"], d["ssl_new_heap"] / 1024,
                     d["idle_heap"] / 1024, d["idle_blocks"], rb["idle_heap"] / 1024, rb["idle_blocks"]))
    save("front", text)


class Prober:
    """A normal client: GET one pod every `every` seconds, on one keep-alive
    connection (reconnecting after a failure) or on a new connection each
    time. Records latency of successes and the kind of each failure."""

    def __init__(self, k, path, keepalive, every):
        import threading
        self.k, self.path, self.keepalive, self.every = k, path, keepalive, every
        self.lat, self.fail = [], {}
        self.stop_ev = threading.Event()
        self.conn = k.connection(5) if keepalive else None
        if self.conn:
            try:
                self.conn.connect()
            except OSError as e:
                self.fail["connect: " + type(e).__name__] = 1
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()

    def _once(self):
        c = self.conn or self.k.connection(5)
        try:
            c.request("GET", self.path, headers={} if self.keepalive else {"Connection": "close"})
            r = c.getresponse()
            r.read()
            return None if r.status == 200 else "HTTP %d" % r.status
        except Exception as e:  # every failure is a result here
            if self.keepalive:
                c.close()
                self.conn = self.k.connection(5)
            return type(e).__name__
        finally:
            if not self.keepalive:
                c.close()

    def _run(self):
        while not self.stop_ev.is_set():
            t0 = time.monotonic()
            err = self._once()
            if err:
                self.fail[err] = self.fail.get(err, 0) + 1
            else:
                self.lat.append((time.monotonic() - t0) * 1000)
            self.stop_ev.wait(max(0, self.every - (time.monotonic() - t0)))

    def stop(self):
        self.stop_ev.set()
        self.th.join(30)
        if self.conn:
            self.conn.close()
        lat = sorted(self.lat)
        ok = "%d ok" % len(lat) + "".join(", %d %s" % (n, e) for e, n in sorted(self.fail.items()))
        if not lat:
            return ok, "-"
        return ok, "%.1f / %.1f / %.1f" % (pct(lat, 50), pct(lat, 99), lat[-1])


def attack(args, k, mode, n, seconds):
    import json
    argv = [sys.executable, os.path.join(HERE, "slowloris.py"), "--port", str(k.port), "--mode", mode,
            "--conns", str(n), "--seconds", str(seconds)]
    if k.v.tls:
        argv += ["--tls", "--cacert", certs(args)["ca"]]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    ready = json.loads(read_line(p, 180))
    res = json.loads(read_line(p, seconds + 60))
    p.wait()
    res["ready"] = ready
    return res


def kinds(answers):
    c = {}
    for _, k in answers:
        c[k] = c.get(k, 0) + 1
    return ", ".join("%d %s" % (n, k) for k, n in sorted(c.items(), key=lambda x: -x[1])) or "-"


def bench_slowloris(args):
    """Slowloris (N connections trickling a head that never ends) and a flood
    of M connections over --max-connections, while a normal client GETs one
    pod on a keep-alive connection and on new connections."""
    t = args.header_timeout
    hold = 2 * t + 2
    srows, frows = [], []
    env = Env(apisim_args=["--pods", "1000", "--nodes", "10"], start_kwc=False)
    try:
        path = one_pod_path(env)
        for v in variants(args):
            for mode in ("slowloris", "flood"):
                n = args.slowloris if mode == "slowloris" else args.flood
                limit = args.slowloris + 1024 if mode == "slowloris" else args.max_connections
                flags = () if v.label == BEFORE else (("--request-header-timeout", t), ("--max-connections", limit))
                rows = srows if mode == "slowloris" else frows
                try:
                    k = Kwc(args, env, v, "%s-%s%s" % (mode, v.label.split()[0], "-tls" if v.tls else ""),
                            flags=flags)
                except Unavailable as e:
                    rows.append([v.label, str(e)] + ["-"] * 10)
                    continue
                try:
                    smp = Sampler(k.pid)
                    ka = Prober(k, path, True, 0.01)
                    fresh = Prober(k, path, False, 0.05)
                    res = attack(args, k, mode, n, hold)
                    ka_ok, ka_lat = ka.stop()
                    fr_ok, fr_lat = fresh.stop()
                    peak = smp.stop()
                finally:
                    k.stop()
                ans = res["answers"]
                cf = sum(res["connect_failed"].values())
                opened = "%d%s" % (res["established"], " (%d failed to connect: %s)" % (cf, res["connect_failed"])
                                   if cf else "")
                mem = "%.1f / %d" % (peak["RssAnon"] / 1024, peak["fds"])
                tcol = "%d s" % t if flags else "none (no flag)"
                if mode == "slowloris":
                    hs = sorted(h for h, _ in ans)
                    rows.append([v.label, opened, tcol, "%d closed, %d open at the end (%.0f s)" % (
                        len(ans), res["open_at_end"], res["held_to_end_s"]),
                        "%.1f / %.1f" % (pct(hs, 50), hs[-1]) if hs else "-", kinds(ans), ka_ok, ka_lat,
                        fr_ok, fr_lat, mem, "closed by ~%d s; normal GETs all ok" % (t + 1) if flags else "-"])
                else:
                    fast = sorted(h * 1000 for h, _ in ans if h < t / 2)
                    slow = sorted(h for h, _ in ans if h >= t / 2)
                    rows.append([v.label, "%d" % limit if flags else "none (no flag)", opened,
                                 "%d: %.1f / %.1f / %.1f ms" % (len(fast), pct(fast, 50), pct(fast, 99), fast[-1])
                                 if fast else "0", kinds([a for a in ans if a[0] < t / 2]),
                                 "%d, after %.1f / %.1f s" % (len(slow), pct(slow, 50), slow[-1]) if slow else "0",
                                 "%d" % (res["open_at_end"] + res["connecting_at_end"]), ka_ok, ka_lat,
                                 fr_ok + (" " + fr_lat if fr_lat != "-" else ""), mem,
                                 "over the limit refused in ms; keep-alive GETs all ok" if flags else "-"])
                print(rows[-1], flush=True)
    finally:
        env.close()
    text = table("Slowloris: N connections send a request line and a header, then a header line a second, never "
                 "the end of the head; held %d s; meanwhile GET one pod every 10 ms on a keep-alive connection and "
                 "every 50 ms on a new one (p50 / p99 / max ms)" % hold,
                 ["server", "slowloris conns", "--request-header-timeout", "slowloris conns after", "held p50 / max s",
                  "kwc's answer", "keep-alive GETs", "keep-alive ms", "new-conn GETs", "new-conn ms",
                  "kwc peak RssAnon MB / fds", "target"], srows)
    text += "\n" + table("Connection flood: M connections opened at once, sending nothing (over TLS no ClientHello "
                         "either), header timeout %d s; 'refused' = answered within %.1f s; the same normal client "
                         "(its keep-alive connection opened before the flood)" % (t, t / 2),
                         ["server", "--max-connections", "flood conns", "refused: n, p50 / p99 / max",
                          "kwc's answer to refused", "held then closed", "unanswered at the end", "keep-alive GETs",
                          "keep-alive ms", "new-conn GETs (ms)", "kwc peak RssAnon MB / fds", "target"], frows)
    save("front", text)


def kwc_log_ms(line):
    """The wall-clock time of one kwc log line, in seconds since the epoch."""
    ts = line.split(" ", 1)[0]
    return datetime.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def poll_until(pred, timeout, every=0.005):
    """Poll pred until true; the time.time() it first was (None: timed out)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return time.time()
        time.sleep(every)
    return None


def readyz(port):
    try:
        return http_request(port, "GET", "/readyz", timeout=2)[0]
    except OSError:
        return 0


def disk_full_once(args, mnt):
    """kwc on a small tmpfs under churn: seconds from the first failed commit
    (kwc's log) to /readyz 503, and from space coming back to 200."""
    subprocess.run(["umount", mnt], stderr=subprocess.DEVNULL)
    subprocess.check_call(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", mnt])
    env = Env(apisim_args=["--pods", "2000"], start_kwc=False, kwc_bin=args.kwc)
    try:
        env.start_kwc(["--data-dir", os.path.join(mnt, "data"), "--resources", "v1/pods"])
        env.sim("POST", "/apisim/churn", {"rate": 3000, "resources": ["pods"]})
        t_out = poll_until(lambda: readyz(env.kwc.port) == 503, 120)
        env.sim("POST", "/apisim/churn", {"rate": 0})
        fail = [l for l in env.kwc.logs(2000).split("\n") if "committing" in l and "failed" in l]
        t_fail = kwc_log_ms(fail[0])
        subprocess.check_call(["mount", "-o", "remount,size=512m", mnt])
        t_space = time.time()
        t_back = poll_until(lambda: readyz(env.kwc.port) == 200, 120)
        return t_out - t_fail, t_back - t_space
    finally:
        env.close()
        subprocess.run(["umount", mnt])


def damage_once(args):
    """A stored object's bytes overwritten in data.mdb while kwc runs: the
    first read of it passes through (the upstream's bytes) and the resource
    leaves service; seconds from that read to /readyz 503, and to 200 again
    (rebuilt from a fresh list)."""
    env = Env(apisim_args=["--pods", "2000"], start_kwc=False, kwc_bin=args.kwc)
    try:
        env.start_kwc(["--resources", "v1/pods"])
        marker = "MARKER-%d-%d" % (os.getpid(), time.monotonic_ns())
        obj = {"metadata": {"name": "damaged", "namespace": "default", "annotations": {"m": marker}},
               "spec": {"containers": [{"name": "c", "image": "x"}]}}
        env.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "default",
                                          "name": "damaged", "object": obj})
        path = "/api/v1/namespaces/default/pods/damaged?resourceVersion=0"
        wait_for(lambda: marker.encode() in http_request(env.kwc.port, "GET", path)[2], 30, "kwc has the pod")
        data = os.path.join(env.dir, "data", "data.mdb")
        fd = os.open(data, os.O_RDWR)
        try:
            blob = os.pread(fd, os.fstat(fd).st_size, 0)
            at = blob.find(marker.encode())
            while at >= 0:
                os.pwrite(fd, b"#", at + 2)
                at = blob.find(marker.encode(), at + 1)
        finally:
            os.close(fd)
        t_read = time.time()
        st, _, body = http_request(env.kwc.port, "GET", path)
        if st != 200 or marker.encode() not in body:
            raise RuntimeError("the damaged pod's answer: %d %r" % (st, body[:200]))
        t_out = poll_until(lambda: readyz(env.kwc.port) == 503, 30)
        t_back = poll_until(lambda: readyz(env.kwc.port) == 200, 60)
        return t_out - t_read, t_back - t_read
    finally:
        env.close()


def bench_integrity(args):
    """Issue 11: what per-value checksums cost (RV=0 list GB/s end to end and
    store ingest, on vs off in one run), and how fast a damaged value or a full
    disk takes a cache out of service and back."""
    pods = min(args.pods, 50000)  # ~150 MB lists: the cost shows, the run stays short
    env = seeded_env(args, pods, 3000)
    servers = {}
    rows = []
    try:
        for label, extra_env in (("on", {}), ("off", {"KWC_BENCH_NO_CHECKSUMS": "1"})):
            p = Proc("kwc-" + label, [args.kwc, "--upstream", "http://127.0.0.1:%d" % env.apisim.port,
                                      "--listen", "127.0.0.1:0", "--resources", "v1/pods",
                                      "--data-dir", os.path.join(env.dir, "data-" + label)],
                     env.dir, env=dict(os.environ, **extra_env))
            p.start()
            servers[label] = p
        for p in servers.values():
            wait_for(lambda: readyz(p.port) == 200, 600, "kwc ready")
        path = "/api/v1/pods?resourceVersion=0"
        gbs = {"on": {1: [], 2: []}, "off": {1: [], 2: []}}
        for _ in range(3):
            for label, p in servers.items():
                for conc in (1, 2):
                    wall, total, _ = curl_lists(p.port, path, conc, 3)
                    gbs[label][conc].append(total / wall / 1e9)
        for conc in (1, 2):
            on = sorted(gbs["on"][conc])[1]
            off = sorted(gbs["off"][conc])[1]
            rows.append(["RV=0 list of %d pods, %d lister%s (GB/s, median of 3)" % (pods, conc, "s" if conc > 1 else ""),
                         "%.2f" % on, "%.2f" % off, "%.1f %%" % (100 * (off - on) / off), "within 5 %"])
    finally:
        for p in servers.values():
            p.stop()
        env.close()
    scratch = tempfile.mkdtemp(prefix="kwc-crcbench-")
    try:
        out = subprocess.run([os.path.join(args.bin, "crcbench"), scratch, "3000", "100000"],
                             capture_output=True, text=True, check=True, timeout=1800).stdout
    finally:
        subprocess.run(["rm", "-rf", scratch])
    text = table("Checksums on vs off, same run (kwc with KWC_BENCH_NO_CHECKSUMS=1 as 'off')",
                 ["measure", "on", "off", "cost", "target"], rows)
    text += "\nStore ingest and scan (bench/crcbench, store only, no JSON or network):\n\n" + out
    mnt = tempfile.mkdtemp(prefix="kwc-tmpfs-")
    trows = []
    try:
        full = [disk_full_once(args, mnt) for _ in range(3)]
        dmg = [damage_once(args) for _ in range(3)]
    finally:
        os.rmdir(mnt)
    trows.append(["full disk (24 MiB tmpfs, 3,000 events/s)", "first failed commit -> /readyz 503",
                  " / ".join("%.3f" % a for a, _ in full), "<= 1 s"])
    trows.append(["", "space back (remount 512 MiB) -> /readyz 200", " / ".join("%.3f" % b for _, b in full), "-"])
    trows.append(["damaged object (bytes overwritten in data.mdb)", "first read of it -> /readyz 503",
                  " / ".join("%.3f" % a for a, _ in dmg), "<= 1 s"])
    trows.append(["", "first read -> rebuilt, /readyz 200 (2,000 pods)", " / ".join("%.3f" % b for _, b in dmg), "-"])
    text += "\n" + table("Out of service and back (seconds, 3 runs; /readyz polled every 5 ms)",
                          ["fault", "interval", "seconds", "target"], trows)
    save("integrity", text)


class AuthSetup:
    """An apisim policy (POST /apisim/policy or --policy) for the auth
    scenario: kwc's own token (get/list/watch pods, create tokenreviews and
    subjectaccessreviews, impersonate) and n caller tokens, user-i in group
    bench-callers, which may get/list/watch pods (one rule on the group, as
    kubelets' rights come through system:nodes: apisim then does not scan a
    list of n users per SubjectAccessReview). Files in d: the policy, kwc's
    kubeconfig and the callers' tokens (one a line, fanout --token-file)."""

    def __init__(self, d, n):
        import json
        import secrets
        self.kwc_token = "kwc-" + secrets.token_hex(16)
        self.tokens = ["user%d-%s" % (i, secrets.token_hex(12)) for i in range(n)]
        pods = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
        doc = {"tokens": dict([(self.kwc_token, {"user": "kwc-bench", "uid": "kwc"})] +
                              [(t, {"user": "user-%d" % i, "uid": "u-%d" % i, "groups": ["bench-callers"]})
                               for i, t in enumerate(self.tokens)]),
               "rules": [dict(pods, name="kwc-pods", users=["kwc-bench"]),
                         {"name": "kwc-reviews", "users": ["kwc-bench"], "verbs": ["create"],
                          "apiGroups": ["authentication.k8s.io", "authorization.k8s.io"],
                          "resources": ["tokenreviews", "subjectaccessreviews"]},
                         {"name": "kwc-impersonate", "users": ["kwc-bench"], "verbs": ["impersonate"]},
                         dict(pods, name="bench-callers", groups=["bench-callers"])]}
        self.policy = os.path.join(d, "policy.json")
        with open(self.policy, "w") as f:
            json.dump(doc, f)
        self.token_file = os.path.join(d, "tokens")
        with open(self.token_file, "w") as f:
            f.write("\n".join(self.tokens) + "\n")
        self.d = d

    def kubeconfig(self, port):
        import json
        path = os.path.join(self.d, "kubeconfig-%d" % port)
        with open(path, "w") as f:
            json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "bench",
                       "clusters": [{"name": "sim", "cluster": {"server": "http://127.0.0.1:%d" % port}}],
                       "users": [{"name": "kwc", "user": {"token": self.kwc_token}}],
                       "contexts": [{"name": "bench", "context": {"cluster": "sim", "user": "kwc"}}]}, f)
        return path


AUTH_LOG = re.compile(r"auth: (\d+) TokenReviews \((\d+) answered from the cache\), (\d+) SubjectAccessReviews "
                      r"\((\d+) from the cache, (\d+) coalesced\)")


def auth_counts(k):
    """Stops kwc k and reads its shutdown line: {tr, tr_hits, sar, sar_hits,
    sar_coalesced}, or None (no line: --auth none)."""
    k.stop()
    m = None
    for m in AUTH_LOG.finditer(k.proc.logs(200)):
        pass
    if not m:
        return None
    return dict(zip(("tr", "tr_hits", "sar", "sar_hits", "sar_coalesced"), (int(x) for x in m.groups())))


def reviews_text(c):
    """TokenReviews and SubjectAccessReviews from a kwc's shutdown line."""
    if not c:
        return "-", "-"
    asked = c["sar"] + c["sar_hits"] + c["sar_coalesced"]
    return ("%d sent, %d from cache" % (c["tr"], c["tr_hits"]),
            "%d sent, %d from cache, %d coalesced (hit rate %.1f%%)" % (
                c["sar"], c["sar_hits"], c["sar_coalesced"], 100 * c["sar_hits"] / max(asked, 1)))


def sim_reviews(env):
    """(TokenReviews, SubjectAccessReviews) apisim answered since its stats
    were last reset."""
    r = env.stats()["requests"]
    return r.get("create tokenreviews", 0), r.get("create subjectaccessreviews", 0)


def auth_kwcs(args, env, setup, tag, watchers=0):
    """kwc over TLS, --auth none and --auth delegated, both with kwc's token
    from setup's kubeconfig; --log-level info for the shutdown line."""
    out = {}
    kc = setup.kubeconfig(env.apisim.port)
    for mode in ("none", "delegated"):
        v = Variant("TLS, --auth " + mode, args.kwc, True)
        try:
            out[mode] = Kwc(args, env, v, "%s-%s" % (tag, mode), flags=(("--auth", mode),), kubeconfig=kc,
                            base=("--resources", "v1/pods", "--log-level", "info"),
                            optional=(("--max-connections", watchers + 1000),) if watchers else ())
        except Unavailable as e:
            out[mode] = e
            print("--auth %s: %s" % (mode, e), flush=True)
    return out


BURST_DEADLINE = 60  # seconds fanout waits for the burst's answers


def prime(k, path, token, timeout=5):
    """One GET with token on a new TLS connection: "answered STATUS in S s"
    or "unanswered after S s"."""
    import http.client
    c = k.connection(timeout)
    t0 = time.monotonic()
    try:
        c.request("GET", path, headers={"Authorization": "Bearer " + token})
        r = c.getresponse()
        r.read()
        return "answered %d in %.3f s" % (r.status, time.monotonic() - t0)
    except (OSError, http.client.HTTPException) as e:
        return "unanswered after %.1f s (%s)" % (time.monotonic() - t0, type(e).__name__)
    finally:
        c.close()


def bench_auth(args):
    """kwc over TLS with --auth none vs --auth delegated (TokenReview and
    SubjectAccessReview against apisim --policy, with kwc's caches): cached
    GETs (wrk), watch fan-out with a token per watcher (fanout --token-file),
    and a cold burst of distinct identities."""
    import json
    d = tempfile.mkdtemp(prefix="kwc-bench-auth-")
    n_tokens = max(args.auth_watchers, args.auth_kubelet, args.auth_burst)
    setup = AuthSetup(d, n_tokens)
    pol = ["--policy", setup.policy, "--anonymous-auth", "false"]
    text = ""
    # 1. GET one pod from the cache, wrk, one bearer token; both kwcs up, ABBA order
    env = Env(apisim_args=["--pods", "100", "--nodes", "4"] + pol, start_kwc=False)
    servers = {}
    try:
        servers = auth_kwcs(args, env, setup, "get")
        key = env.sim("GET", "/apisim/state?resource=pods")["items"][0]["key"].split("/")
        path = "/api/v1/namespaces/%s/pods/%s?resourceVersion=0" % tuple(key)
        hdr = ("Authorization: Bearer " + setup.tokens[0],)
        # one GET per kwc first (the delegated one reviews the token then): wrk measures the cached state
        primed = {m: prime(k, path, setup.tokens[0]) for m, k in servers.items() if isinstance(k, Kwc)}
        rows = []
        for conns in (1, 8, 32):
            acc = {m: [] for m in servers}
            for m in ("none", "delegated", "delegated", "none"):
                k = servers[m]
                if not isinstance(k, Kwc):
                    continue
                c0, t0 = cpu_seconds(k.pid), time.monotonic()
                r = wrk(k.port, path, conns, args.duration, "https", hdr)
                acc[m].append((r, cpu_seconds(k.pid) - c0, time.monotonic() - t0))
            rps = {}
            for m in ("none", "delegated"):
                if not acc[m]:
                    rows.append([conns, "--auth " + m, str(servers[m])] + ["-"] * 5 + ["-"])
                    continue
                runs = acc[m]
                rps[m] = sum(r[0] for r, _, _ in runs) / len(runs)
                cpu, el = sum(c for _, c, _ in runs), sum(e for _, _, e in runs)
                reqs = sum(r[0] * e for (r, _, e) in runs)
                rows.append([conns, "--auth " + m, "%.0f" % rps[m],
                             "%.0f%% of none" % (100 * rps[m] / rps["none"]) if m != "none" and rps.get("none") else "-",
                             "%.2f / %.2f" % (sum(r[1] for r, _, _ in runs) / len(runs),
                                              sum(r[2] for r, _, _ in runs) / len(runs)),
                             "%.0f%%" % (100 * cpu / el), "%.1f" % (cpu / max(reqs, 1) * 1e6),
                             "%d / %d" % (sum(r[3] for r, _, _ in runs), sum(r[4] for r, _, _ in runs)),
                             ">= 90% of none" if m == "delegated" else "-"])
                print(rows[-1], flush=True)
        counts = auth_counts(servers["delegated"]) if isinstance(servers.get("delegated"), Kwc) else None
        tr, sar = reviews_text(counts)
        text += table("GET one pod from the cache (resourceVersion=0) over TLS, wrk %ds per cell, keep-alive, one "
                      "bearer token: kwc --auth none vs --auth delegated (mean of 2 runs each, order none, delegated, "
                      "delegated, none)" % args.duration,
                      ["conns", "kwc", "req/s", "vs", "p50 / p99 ms", "kwc CPU", "kwc CPU us/req",
                       "non-2xx / socket errors", "target"], rows)
        text += "\nFirst GET (cold token) before the cells: %s. --auth delegated over all GET cells: TokenReviews " \
            "%s; SubjectAccessReviews %s.\n" % ("; ".join("--auth %s %s" % kv for kv in primed.items()), tr, sar)
    finally:
        stop_all(servers)
        env.close()

    # 2. watch fan-out, a token (identity) per watcher; the kubelet pattern
    rows = []
    hdr = ["pattern", "watchers", "kwc", "streams", "deliveries/s", "p50 ms", "p99 ms", "max ms", "kwc CPU",
           "kwc CPU us/delivery", "TokenReviews", "SubjectAccessReviews", "apisim saw TR / SAR", "target"]

    def fan(env, label, n, rate, nodes, target):
        for mode in ("none", "delegated"):
            v = Variant("TLS, --auth " + mode, args.kwc, True)
            try:
                k = Kwc(args, env, v, "watch-%d-%s" % (n, mode), flags=(("--auth", mode),),
                        kubeconfig=setup.kubeconfig(env.apisim.port),
                        base=("--resources", "v1/pods", "--log-level", "info"),
                        optional=(("--max-connections", n + 1000),))
            except Unavailable as e:
                rows.append([label, n, "--auth " + mode, str(e)] + ["-"] * 9 + [target])
                continue
            counts = None
            try:
                env.sim("POST", "/apisim/reset-stats")
                rv = env.stats()["rv"]
                env.sim("POST", "/apisim/churn", {"rate": rate, "resources": [resource], "mix": {"update": 1.0}})
                p = fanout(args, k.port, n, tls=True, nodes=nodes, token_file=setup.token_file,
                           path="/api/v1/pods?watch=1&resourceVersion=%d&timeoutSeconds=600" % rv)
                try:
                    r = fanout_measure(p, k.pid)
                finally:
                    env.sim("POST", "/apisim/churn", {"rate": 0})
                sim = sim_reviews(env)
            finally:
                counts = auth_counts(k)
            tr, sar = reviews_text(counts)
            streams = "%d" % r["streams"] + (" (%d ended by kwc)" % r["ended"] if r.get("ended") else "") + \
                (" (%d not 2xx)" % r["non2xx"] if r.get("non2xx") else "") + \
                (" (%d TLS handshakes failed)" % r["tls_failures"] if r.get("tls_failures") else "")
            rows.append([label, n, "--auth " + mode, streams, r["per_s"], r["p50_ms"], r["p99_ms"], r["max_ms"],
                         "%.0f%%" % (r["cpu"] * 100), "%.2f" % (r["cpu"] / max(r["per_s"], 1) * 1e6), tr, sar,
                         "%d / %d" % sim, target])
            print(rows[-1], flush=True)

    env = Env(apisim_args=["--pods", "2000", "--nodes", "100", "--pod-size", "1000", "--history", "1000000"] + pol,
              start_kwc=False)
    try:
        fan(env, "full fan-out, 100 ev/s x 1 KiB", args.auth_watchers, 100, 0, "p99 <= 5 ms")
    finally:
        env.close()
    if args.auth_kubelet:
        env = Env(apisim_args=["--nodes", "5000", "--history", "2000000"] + pol, start_kwc=False)
        try:
            r = env.sim("POST", "/apisim/seed", {"resource": "pods", "count": args.pods, "namespaces": 10,
                                                 "nodes": 5000, "size": 1000})
            print("apisim seeded %d pods in %.1f s" % (r["created"], r["seconds"]), flush=True)
            fan(env, "kubelet: fieldSelector=spec.nodeName, %d pods, 500 ev/s" % args.pods, args.auth_kubelet,
                500, 5000, "p99, CPU")
        finally:
            env.close()
    text += "\n" + table("Watch fan-out through kwc over TLS, each watcher its own bearer token (fanout "
                         "--token-file; --auth none drops it): --auth none vs --auth delegated (write-to-receipt "
                         "latency; CPU as % of one core; reviews from kwc's shutdown line and apisim's counters)",
                         hdr, rows)

    # 3. cold burst: n distinct identities at once, then the same again (cached)
    n = args.auth_burst
    env = Env(apisim_args=["--pods", "5", "--nodes", "1", "--pod-size", "1000"] + pol, start_kwc=False)
    servers, rows, unanswered = {}, [], 0
    try:
        servers = auth_kwcs(args, env, setup, "burst", watchers=n)
        for mode, what in (("none", "reference"), ("delegated", "cold (no identity cached)"),
                           ("delegated", "again (all cached)")):
            k = servers[mode]
            if not isinstance(k, Kwc):
                rows.append([what, "--auth " + mode, str(k)] + ["-"] * 5)
                continue
            env.sim("POST", "/apisim/reset-stats")
            c0 = cpu_seconds(k.pid)
            p = fanout(args, k.port, n, seconds=1, warmup=0, tls=True, token_file=setup.token_file,
                       path="/api/v1/pods?resourceVersion=0", deadline=BURST_DEADLINE)
            r = None
            deadline = time.monotonic() + 300
            while r is None or "measuring" in r:
                r = json.loads(read_line(p, deadline - time.monotonic()))
            p.wait()
            cpu = cpu_seconds(k.pid) - c0
            sim = sim_reviews(env)
            unanswered += r.get("unanswered", 0)
            answered = "%d of %d" % (r["streams"], n) + (" (%d not 2xx)" % r["non2xx"] if r.get("non2xx") else "") + \
                (" (%d unanswered after %d s)" % (r["unanswered"], BURST_DEADLINE) if r.get("unanswered") else "") + \
                (" (%d TLS handshakes failed)" % r["tls_failures"] if r.get("tls_failures") else "")
            target = "-" if mode == "none" else "%d TR / %d SAR" % ((n, n) if "cold" in what else (0, 0))
            rows.append([what, "--auth " + mode, answered, "%.0f" % r["heads_ms"] if r["streams"] else "-", "%.2f" % cpu,
                         sim[0], sim[1],
                         target])
            print(rows[-1], flush=True)
        counts = auth_counts(servers["delegated"]) if isinstance(servers.get("delegated"), Kwc) else None
        tr, sar = reviews_text(counts)
        text += "\n" + table("Burst: %d distinct bearer tokens, each a new TLS connection and one RV=0 list of 5 "
                             "pods, all at once (fanout --watchers %d: connects 100 per 2 ms, one client thread)"
                             % (n, n),
                             ["burst", "kwc", "answered", "first connect to last answer ms", "kwc CPU s",
                              "TokenReviews at apisim", "SubjectAccessReviews at apisim", "target"], rows)
        text += "\n--auth delegated over both bursts (shutdown line): TokenReviews %s; SubjectAccessReviews %s.\n" % (
            tr, sar)
        if unanswered:
            text += ("\nkwc never answered %d of these requests although apisim answered their reviews (a cached read "
                     "that waited for a TokenReview or SubjectAccessReview).\n" % unanswered)
    finally:
        stop_all(servers)
        env.close()
        subprocess.run(["rm", "-rf", d])
    save("auth", text)


# ---- issue 21: HTTP/2 beside HTTP/1.1 ----
#
# One apisim, the kwcs side by side: BEFORE (--baseline-commit, HTTP/1.1 only)
# plaintext and TLS, AFTER plaintext (HTTP/1.1 and HTTP/2 with prior knowledge
# on the same port) and TLS (ALPN h2 or http/1.1). HTTP/1.1 rows run against
# both builds (the seam step: plaintext in ABBA order, each cell the mean of
# its runs); HTTP/2 rows against AFTER only.

H2_BASELINE = "74d43bb"  # main before issue 21 (the response-stream seam and HTTP/2)
H2PAGE_BASELINE = "4584f7e"  # main before issue 32, part 3 (HTTP/2 without the copies)


def settle(pid, timeout=20):
    """Waits until pid is idle (under 2 % of a core over 0.2 s): what one cell
    left behind (responses to clients that have gone, a watch's backlog) is
    not billed to the next."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        c0 = cpu_seconds(pid)
        time.sleep(0.2)
        if cpu_seconds(pid) - c0 < 0.004:
            return


def h2load(port, path, conns, streams, duration, tls=False, warmup=1, pid=None, extra=(), on_phase=None):
    """h2load: warmup seconds (connections and the first responses, not
    counted), then duration seconds measured. (req/s, p50 ms, p99 ms, non-2xx,
    failed or errored or timed out, requests done, the protocol it negotiated,
    pid's CPU seconds and the seconds of the measured phase). p50/p99 from its
    per-request log. http:// is HTTP/2 with prior knowledge. extra: more
    h2load arguments (--h1, -H ...); on_phase("start"|"over"): called as the
    measured phase starts and ends."""
    fd, log = tempfile.mkstemp(prefix="kwc-h2load-", suffix=".log", dir="/dev/shm")
    os.close(fd)
    try:
        p = subprocess.Popen(["h2load", "-c", str(conns), "-t", str(min(conns, 2)), "-m", str(streams),
                              "-D", str(duration), "--warm-up-time", str(warmup), "--log-file", log] +
                             list(extra) + ["%s://127.0.0.1:%d%s" % ("https" if tls else "http", port, path)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        out, c0, t0, c1, t1 = [], None, None, None, None
        try:
            for line in p.stdout:  # the first thread's phase lines bound the CPU reading
                out.append(line)
                if c0 is None and line.startswith("Main benchmark duration is started"):
                    c0, t0 = cpu_seconds(pid) if pid else 0, time.monotonic()
                    if on_phase:
                        on_phase("start")
                elif c1 is None and line.startswith("Main benchmark duration is over"):
                    c1, t1 = cpu_seconds(pid) if pid else 0, time.monotonic()
                    if on_phase:
                        on_phase("over")
            p.wait(duration + warmup + 60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        out = "".join(out)
        m = re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", out)
        req = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                        r"(\d+) errored, (\d+) timeout", out)
        codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
        proto = re.search(r"Application protocol: (\S+)", out)
        if not (m and req and codes and t1):
            raise RuntimeError("h2load: no result:\n" + out[-2000:])
        with open(log) as f:
            t = sorted(int(line.split("\t")[2]) for line in f if line.count("\t") >= 2)
        done, ok = int(req.group(1)), int(req.group(2))
        return (float(m.group(1)), pct(t, 50) / 1000 if t else 0, pct(t, 99) / 1000 if t else 0,
                sum(int(x) for x in codes.groups()[1:]), done - ok, done, proto.group(1) if proto else "none",
                c1 - c0, t1 - t0)
    finally:
        os.unlink(log)


def speaks_h2(k):
    """Why k cannot serve HTTP/2 (None when it does: one h2load request,
    prior knowledge or ALPN h2)."""
    try:
        out = subprocess.run(["h2load", "-n", "1", "-c", "1", "%s://127.0.0.1:%d/healthz" % (
            "https" if k.v.tls else "http", k.port)], capture_output=True, text=True, timeout=30).stdout
    except subprocess.TimeoutExpired:
        return "h2load timed out"
    if re.search(r"Application protocol: h2c?\b", out) and re.search(r" 1 succeeded", out):
        return None
    return "n/a (no HTTP/2%s)" % (" by ALPN" if k.v.tls else " with prior knowledge")


def watches_h2(args, k, path):
    """Why k cannot serve a watch over HTTP/2 (None when one stream gets its
    response head within 10 s)."""
    import json
    p = fanout(args, k.port, 1, idle=True, tls=k.v.tls, h2=1, path=path, deadline=10)
    try:
        r = json.loads(read_line(p, 30))
    finally:
        p.kill()
        p.wait()
    return None if r["streams"] == 1 and not r["non2xx"] else "n/a (no watch over HTTP/2)"


def bench_http2(args):
    """Issue 21: watch streams over HTTP/2 (--h2-watchers streams over
    --h2-conns connections) vs one HTTP/1.1 connection per watch, and cached
    GETs with h2load (1/8/32 connections x 10/100 streams) vs wrk, plaintext
    and TLS, before/after for the HTTP/1.1 rows."""
    import json
    n, nconn, rate = args.h2_watchers, args.h2_conns, args.h2_rate
    per = -(-n // nconn)
    env = Env(apisim_args=["--pods", "2000", "--nodes", "100", "--pod-size", "1000", "--history", "1000000"],
              start_kwc=False)
    short = git("rev-parse", "--short", args.baseline_commit)
    B, BT = Variant("before (%s)" % short, args.baseline_kwc, False), Variant("before (%s), TLS" % short,
                                                                               args.baseline_kwc, True)
    A, AT = Variant("after", args.kwc, False), Variant("after, TLS", args.kwc, True)
    opt = (("--max-connections", n + 1000), ("--protobuf-resources", "none"),
           ("--http2-max-streams-per-connection", max(per, 100)))
    wpath = "/api/v1/pods?watch=1&resourceVersion=%d&timeoutSeconds=600"
    why_no_h2, why_no_h2w = {}, {}  # AFTER labels: no HTTP/2 at all; no watch over HTTP/2
    mem, runs, plot_w = {}, {}, []

    def key(v, proto):
        return (v.label, proto)

    # -- memory per idle watcher, each cell on a fresh kwc (a process that
    #    served watchers before keeps their freed memory)
    for v in (B, A, BT, AT):
        for proto in ("HTTP/1.1", "HTTP/2") if v in (A, AT) else ("HTTP/1.1",):
            try:
                k = Kwc(args, env, v, "h2mem-%s-%s" % (v.label.split()[0] + ("-tls" if v.tls else ""),
                                                       proto[-1]), optional=opt)
            except Unavailable as e:
                mem[key(v, proto)] = str(e)
                continue
            try:
                if proto == "HTTP/2":
                    why = speaks_h2(k) or watches_h2(args, k, wpath % env.stats()["rv"])
                    if why:
                        mem[key(v, proto)] = why
                        continue
                # the first part primes: what kwc freed after its sync (pages
                # still resident) serves the first allocations; a loop's heap
                # has more of it than a worker's. The second part is measured.
                h2 = per if proto == "HTTP/2" else 0
                first = max(n // 2 // per, 1) * per if h2 else n // 2
                ps, f0 = [], proc_fds(k.pid)
                try:
                    for part in (first, n - first):
                        a0 = rss_kib(k.pid, "RssAnon")
                        ps.append(fanout(args, k.port, part, idle=True, tls=v.tls, h2=h2,
                                         path=wpath % env.stats()["rv"], deadline=120))
                        r = json.loads(read_line(ps[-1], 300))
                        time.sleep(1)
                        a1, f1 = rss_kib(k.pid, "RssAnon"), proc_fds(k.pid)
                finally:
                    for p in ps:
                        p.kill()
                        p.wait()
                mem[key(v, proto)] = (r["streams"], (a1 - a0) / max(r["streams"], 1), f1 - f0)  # fds: all
                print(json.dumps({"idle": v.label, "proto": proto, "streams": r["streams"],
                                  "KiB/watcher": round((a1 - a0) / max(r["streams"], 1), 2), "fds": f1 - f0}),
                      flush=True)
            finally:
                k.stop()
    servers = {}
    try:
        for v in (B, A, BT, AT):
            try:
                servers[v.label] = Kwc(args, env, v, "h2-" + v.label.split()[0] + ("-tls" if v.tls else ""),
                                       optional=opt)
            except Unavailable as e:
                servers[v.label] = e
        for v in (A, AT):
            k = servers[v.label]
            if isinstance(k, Kwc) and v.label not in why_no_h2:
                why = speaks_h2(k)
                if why:
                    why_no_h2[v.label] = why_no_h2w[v.label] = why
                else:
                    why = watches_h2(args, k, wpath % env.stats()["rv"])
                    if why:
                        why_no_h2w[v.label] = why

        # -- watch fan-out: 1 KiB events at --h2-rate; the seam ABBA around HTTP/2
        order = [(B, "HTTP/1.1"), (A, "HTTP/1.1"), (A, "HTTP/2"), (A, "HTTP/2"), (A, "HTTP/1.1"), (B, "HTTP/1.1"),
                 (BT, "HTTP/1.1"), (AT, "HTTP/1.1"), (AT, "HTTP/2")]
        for v, proto in order:
            k = servers[v.label]
            if not isinstance(k, Kwc) or (proto == "HTTP/2" and v.label in why_no_h2w):
                continue
            settle(k.pid)
            # the events start once every stream has its head: 10,000 HTTP/1.1
            # connects racing the first events snowball on a busy machine (each
            # late watcher replays more from the window, which slows the rest)
            p = fanout(args, k.port, n, tls=v.tls, h2=per if proto == "HTTP/2" else 0,
                       path=wpath % env.stats()["rv"], deadline=120, announce_heads=True)
            try:
                first = json.loads(read_line(p, 300))
                if "heads" in first:
                    env.sim("POST", "/apisim/churn", {"rate": rate, "resources": [resource], "mix": {"update": 1.0}})
                    r = fanout_measure(p, k.pid)
                else:  # the deadline passed first: what arrived
                    r = dict(first, cpu=0, client_cpu=0, rss_mb=rss_kib(k.pid, "RssAnon") / 1024)
                    p.wait()
            finally:
                env.sim("POST", "/apisim/churn", {"rate": 0})
            runs.setdefault(key(v, proto), []).append(r)
            print(json.dumps({"watch": v.label, "proto": proto, **{x: r.get(x) for x in (
                "streams", "conns", "per_s", "p50_ms", "p99_ms", "cpu", "client_cpu", "rss_mb", "unanswered")}}),
                  flush=True)

        # -- cached GETs: wrk (HTTP/1.1, keep-alive) vs h2load (HTTP/2, -m streams per connection)
        pkey = env.sim("GET", "/apisim/state?resource=pods")["items"][0]["key"]
        ns, name = pkey.split("/")
        paths = (("GET one pod (rv=0)", "/api/v1/namespaces/%s/pods/%s?resourceVersion=0" % (ns, name), 1),
                 # the cache's page with NotOlderThan (rv=0 ignores limit, as kube does), as bench_rooms;
                 # h2load warms up as long as it measures (3,200 pages of ~500 KiB in flight at 32 x 100)
                 ("page of 500 pods (NotOlderThan)",
                  "/api/v1/pods?resourceVersion=1&resourceVersionMatch=NotOlderThan&limit=500", args.h2_get_seconds))
        gets = {}
        d = args.h2_get_seconds
        for plabel, path, warm in paths:
            for conns in (int(c) for c in args.h2_get_conns.split(",")):
                order = [(B, "wrk", 0), (A, "wrk", 0)] + [(A, "h2load", m) for m in (10, 100)] + \
                    [(A, "wrk", 0), (B, "wrk", 0), (BT, "wrk", 0), (AT, "wrk", 0)] + \
                    [(AT, "h2load", m) for m in (10, 100)]
                for v, tool, m in order:
                    k = servers[v.label]
                    if not isinstance(k, Kwc) or (tool == "h2load" and v.label in why_no_h2):
                        continue
                    settle(k.pid)
                    rss0 = rss_kib(k.pid, "RssAnon") / 1024
                    smp = Sampler(k.pid)
                    if tool == "wrk":
                        c0, t0 = cpu_seconds(k.pid), time.monotonic()
                        w = wrk(k.port, path, conns, d, "https" if v.tls else "http")
                        el = time.monotonic() - t0
                        cpu = cpu_seconds(k.pid) - c0
                        res = (w[0], w[1], w[2], w[3], w[4], w[0] * el, "http/1.1")
                    else:  # measured after a warm-up: a long page's first answers come late with 100s in flight
                        res = h2load(k.port, path, conns, m, d, v.tls, warmup=warm, pid=k.pid)
                        cpu, el = res[7], res[8]
                    peak = smp.stop()["RssAnon"] / 1024
                    gets.setdefault((plabel, conns, v.label, tool, m), []).append(
                        (res[0], res[1], res[2], cpu / el, cpu / res[5] * 1e6 if res[5] else None, (rss0, peak),
                         res[3], res[4], res[6], res[5]))
                    print(json.dumps({"get": plabel, "conns": conns, "server": v.label, "tool": tool, "m": m,
                                      "rps": round(res[0]), "p99": res[2], "cpu_us": round(cpu / max(res[5], 1) * 1e6,
                                                                                          2), "proto": res[6],
                                      "rss_mb": [round(rss0), round(peak)]}),
                          flush=True)
    finally:
        stop_all(servers)
        env.close()

    def mean(rs, f):
        return sum(f(r) for r in rs) / len(rs)

    # -- the watch table: one row per server and protocol, its runs' mean
    hdr = ["server", "protocol", "connections", "streams", "runs", "deliveries/s", "p50 ms", "p99 ms", "kwc CPU",
           "kwc CPU us/delivery", "vs before HTTP/1.1", "fanout CPU", "kwc RssAnon MB (end)",
           "idle: KiB per watcher (fresh kwc, over the second half of the watchers), kwc fds"]
    rows = []
    ref = {}
    for v in (B, A, BT, AT):
        for proto in ("HTTP/1.1", "HTTP/2") if v in (A, AT) else ("HTTP/1.1",):
            rs = runs.get(key(v, proto))
            mm = mem.get(key(v, proto))
            idle = mm or "-"
            if isinstance(mm, tuple):  # under 64 KiB in all: the freed heap served them, nothing measured
                idle = ("%.2f KiB" % mm[1] if mm[0] * mm[1] >= 64 else "n/a (too few watchers: the heap kwc freed "
                        "after its sync served them)") + ", +%d fds" % mm[2]
            conns = (-(-n // per) if proto == "HTTP/2" else n)
            if not rs:
                k = servers.get(v.label)
                why = why_no_h2w.get(v.label) if proto == "HTTP/2" else None
                rows.append([v.label, proto, conns, why or (str(k) if not isinstance(k, Kwc) else "-")] +
                            ["-"] * 9 + [idle])
                continue
            us = mean(rs, lambda r: r["cpu"] / max(r["per_s"], 1) * 1e6)
            base = v.tls and BT.label or B.label
            if proto == "HTTP/1.1" and v.label == base:
                ref[v.tls] = us
            vs = "%+.1f%%" % (100 * (us - ref[v.tls]) / ref[v.tls]) if v.tls in ref and v.label != base else "-"
            streams = "%d" % min(r["streams"] for r in rs) + (
                " (%d ended)" % max(r["ended"] for r in rs) if any(r.get("ended") for r in rs) else "") + (
                " (%d unanswered)" % max(r["unanswered"] for r in rs) if any(r.get("unanswered") for r in rs) else "")
            rows.append([v.label, proto, conns, streams, len(rs), "%.0f" % mean(rs, lambda r: r["per_s"]),
                         "%.1f" % mean(rs, lambda r: r["p50_ms"]), "%.1f" % mean(rs, lambda r: r["p99_ms"]),
                         "%.0f%%" % (100 * mean(rs, lambda r: r["cpu"])), "%.2f" % us, vs,
                         "%.0f%%" % (100 * mean(rs, lambda r: r["client_cpu"])),
                         "%.0f" % mean(rs, lambda r: r["rss_mb"]), idle])
            plot_w.append(("%s %s" % (v.label.replace(" (%s)" % short, ""), proto), us))
    text = table("Watch fan-out over HTTP/2 vs HTTP/1.1: %d watchers at %d events/s x 1 KiB (fanout.c, %d s), "
                 "HTTP/2: %d streams per connection; the HTTP/1.1 plaintext rows ABBA (mean of their runs); "
                 "CPU as %% of one core" % (n, rate, args.duration, per), hdr, rows)
    # -- the GET table
    rows = []
    plot_g = []
    for plabel, _, _ in paths:
        for conns in (int(c) for c in args.h2_get_conns.split(",")):
            base = {}
            for v, tool, m in [(B, "wrk", 0), (A, "wrk", 0), (A, "h2load", 10), (A, "h2load", 100),
                               (BT, "wrk", 0), (AT, "wrk", 0), (AT, "h2load", 10), (AT, "h2load", 100)]:
                what = "HTTP/1.1 (wrk)" if tool == "wrk" else "HTTP/2 (h2load -m %d)" % m
                rs = gets.get((plabel, conns, v.label, tool, m))
                if not rs:
                    k = servers.get(v.label)
                    why = why_no_h2.get(v.label) if tool == "h2load" else None
                    rows.append([plabel, conns, v.label, what, why or (str(k) if not isinstance(k, Kwc) else "-")] +
                                ["-"] * 6)
                    continue
                rps = mean(rs, lambda r: r[0])
                if tool == "wrk" and v.label in (B.label, BT.label):
                    base[v.tls] = rps
                vs = "%.0f%%" % (100 * rps / base[v.tls]) if v.tls in base and v.label not in (B.label, BT.label) \
                    else "-"
                us = [r[4] for r in rs if r[4] is not None]
                none = not any(r[9] for r in rs)
                rows.append([plabel, conns, v.label, what + ("" if tool == "wrk" else ", " + rs[0][8]),
                             "0 (none finished in %d s)" % d if none else "%.0f" % rps, vs,
                             "-" if none else "%.2f / %.2f" % (mean(rs, lambda r: r[1]), mean(rs, lambda r: r[2])),
                             "%.0f%%" % (100 * mean(rs, lambda r: r[3])), "%.1f" % (sum(us) / len(us)) if us else "-",
                             " / ".join("%.0f -> %.0f" % r[5] for r in rs),
                             "%d / %d" % (sum(r[6] for r in rs), sum(r[7] for r in rs))])
                if plabel == paths[0][0] and v.label not in (B.label, BT.label):
                    plot_g.append(("%s %s" % (v.label, what), conns, rps))
    text += "\n" + table("Cached GETs, HTTP/2 (h2load, -m streams per connection) vs HTTP/1.1 (wrk, keep-alive), "
                         "%d s per cell (h2load measures after a warm-up: 1 s, the page %d s; kwc CPU over what it measures); "
                         "the HTTP/1.1 plaintext cells ABBA (mean of two runs); vs: share of before's HTTP/1.1 "
                         "req/s (same transport)" % (d, d),
                         ["request", "connections", "server", "protocol", "req/s", "vs before", "p50 / p99 ms",
                          "kwc CPU", "kwc CPU us/request", "kwc RssAnon MB: start -> peak (each run)",
                          "non-2xx / errors"], rows)
    save("http2", text)
    plot_http2(plot_w, plot_g, n, per, rate)


def plot_http2(watch, gets, n, per, rate, name="http2"):
    """PNG: kwc CPU per delivery by server and protocol (bars), and GET one
    pod requests/s vs connections, HTTP/1.1 vs HTTP/2 (gnuplot)."""
    if not SAVE or not watch:
        return
    wd, gd = os.path.join(RESULTS, name + "-watch.dat"), os.path.join(RESULTS, name + "-get.dat")
    with open(wd, "w") as f:
        for label, us in watch:
            f.write('"%s" %.3f\n' % (label, us))
    series = []
    for label, _, _ in gets:
        if label not in series:
            series.append(label)
    with open(gd, "w") as f:
        for s in series:
            f.write("# %s\n" % s)
            for label, conns, rps in gets:
                if label == s:
                    f.write("%d %.0f\n" % (conns, rps))
            f.write("\n\n")
    lines = ", ".join("'%s' index %d using 1:2 with linespoints%s title '%s'" % (
        gd, i, " dashtype 2" if "TLS" in s else "", s) for i, s in enumerate(series))
    script = """set terminal png size 1400,560
set output '%s'
set multiplot layout 1,2
set title 'kwc CPU per delivery: %d watchers, %d ev/s x 1 KiB, HTTP/2 %d streams/conn'
set ylabel 'kwc CPU us per delivery'
set style fill solid 0.6
set boxwidth 0.6
set yrange [0:*]
set xtics rotate by -25
unset key
plot '%s' using 0:2:xtic(1) with boxes
set title 'GET one pod from the cache: requests/s'
set xlabel 'connections'
set ylabel 'requests/s'
set logscale x 2
set xtics norotate
set key left top
plot %s
unset multiplot
""" % (os.path.join(RESULTS, name + ".png"), n, rate, per, wd, lines)
    subprocess.run(["gnuplot"], input=script, text=True, check=False)


# ---- issue 22: TLS at the cost of plaintext ----

TLS_COST_BASELINE = "8cbd4d1"  # main before issue 22
TLS_CIPHER_BASELINE = "4584f7e"  # main before issue 32, part 4 (bench/tlscipher.py)
# (watchers, events/s) of 1 KiB; the last also served by apisim directly.
# The latency target: watchers, events/s, object bytes, p99 ms (TLS).
TLS_COST_FULL = {"watch": ((1000, 100), (5000, 100), (10000, 50)), "target": (3000, 30, 3000, 100)}
TLS_COST_SMALL = {"watch": ((100, 100), (200, 100), (300, 50)), "target": (200, 30, 3000, 100)}
TLS_COST_DRAIN = 15  # fanout --drain: seconds a point may read on after its window (lost vs late)


def tls_cost_watch(args, env, k, n, rate, tls, pid=None, resource="pods"):
    """One fan-out point: n watchers (fanout.c, over TLS when tls), the
    events (rate/s, updates of env's pods) started once every stream has
    its head, measured for --duration seconds after a 2 s warm-up (1 s with
    --small), then
    read until every stream is past the window (at most TLS_COST_DRAIN s):
    fanout's result with the server's CPU (share of a core) over the window.
    k: a Kwc, or the apisim port (pid: apisim's). resource: what is
    watched and updated (a plural of the core group)."""
    import json
    import threading
    port, pid = (k.port, k.pid) if isinstance(k, Kwc) else (k, pid)
    rvs = []  # apisim's resourceVersion as the window starts and --duration s later: the events written

    def sample():
        try:
            rvs.append(env.stats()["rv"])
        except OSError:
            pass
    timer = threading.Timer(args.duration, sample)

    def window():
        sample()
        timer.start()
    settle(pid)
    p = fanout(args, port, n, tls=tls, path="/api/v1/%s?watch=1&resourceVersion=%d&timeoutSeconds=900" %
               (resource, env.stats()["rv"]), deadline=120, announce_heads=True, drain=TLS_COST_DRAIN,
               warmup=1 if args.small else 2)
    try:
        first = json.loads(read_line(p, 300))
        if "heads" in first:
            env.sim("POST", "/apisim/churn", {"rate": rate, "resources": [resource], "mix": {"update": 1.0}})
            r = fanout_measure(p, pid, timeout=args.duration + TLS_COST_DRAIN + 120, on_measuring=window)
        else:  # the deadline passed before every stream had its head: what arrived
            r = dict(first, cpu=0, client_cpu=0, rss_mb=rss_kib(pid, "RssAnon") / 1024, per_s=0, p50_ms=0,
                     p99_ms=0)
            p.wait()
    finally:
        if timer.is_alive():
            timer.join()
        env.sim("POST", "/apisim/churn", {"rate": 0})
        if p.poll() is None:
            p.kill()
            p.wait()
    r["us"] = r["cpu"] / r["per_s"] * 1e6 if r.get("per_s") else 0
    # apisim's count (it skips what it falls behind on); fanout's written: the stamps any stream got
    r["written_s"] = (rvs[1] - rvs[0]) / args.duration if len(rvs) == 2 else r.get("written", 0) / args.duration
    return r


def tls_cost_cell(rs, key, fmt):
    """The mean of a row's runs, then each run: '12.3 (12.1 / 12.5)'."""
    vals = [r[key] for r in rs]
    return (fmt % (sum(vals) / len(vals))) + (" (%s)" % " / ".join(fmt % x for x in vals) if len(vals) > 1 else "")


def tls_cost_lost(rs):
    """Deliveries lost over a row's runs, and what else fanout saw."""
    lost = sum(r.get("lost", 0) for r in rs)
    why = []
    behind, late = sum(r.get("behind", 0) for r in rs), sum(r.get("late", 0) for r in rs)
    if behind:  # late counts from the stamps that reached some stream: at least that many
        why.append("%d streams still behind after the drain, >= %d deliveries late" % (behind, late))
    for f, what in (("ended", "streams ended by the server"), ("unanswered", "streams without a head"),
                    ("extra", "duplicates"), ("reordered", "out of order")):
        v = sum(r.get(f, 0) for r in rs)
        if v:
            why.append("%d %s" % (v, what))
    return "%d" % lost + (" (%s)" % ", ".join(why) if why else "")


def tls_cost_labels(short):
    return ("before (%s)" % short, "before (%s), TLS" % short, "after", "after, TLS", "apisim (direct, plaintext)")


H1, H2 = "http/1.1", "h2"
LIST_H2 = " (HTTP/2)"  # list rows over TLS with HTTP/2 (ALPN h2)


def bench_tls_cost(args):
    """Issue 22: kwc over TLS vs plaintext, before (--baseline-commit) vs
    after (--kwc), in one run. Watch fan-out (ABBA over the four servers,
    apisim beside them at the last point), the latency target over TLS,
    cached RV=0 lists (ABBA), idle connection and watcher memory, a PNG of CPU
    per delivery, and the targets' table with PASS/MISS. Every result goes to
    a JSON file first (--tls-cost-from rebuilds the tables from it)."""
    import json
    cfg = TLS_COST_SMALL if args.small else TLS_COST_FULL
    short = git("rev-parse", "--short", args.baseline_commit)
    data = {"short": short, "kwc": args.kwc, "baseline_kwc": args.baseline_kwc, "save": SAVE, "cfg": cfg,
            "duration": args.duration, "warmup": 1 if args.small else 2, "pods": args.pods,
            "idle_conns": args.idle_conns, "runs": [], "lists": [],
            "idle": [], "why": {}, "started": datetime.datetime.now().strftime("%Y-%m-%d %H:%M")}
    t_start = time.monotonic()
    try:
        tls_cost_measure(args, cfg, data)
    finally:
        data["minutes"] = (time.monotonic() - t_start) / 60
        fd, dump = tempfile.mkstemp(prefix="kwc-tls-cost-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        print("results: %s (bench/run.py --only tls-cost --tls-cost-from %s rebuilds the tables)" % (dump, dump),
              flush=True)
    tls_cost_report(data)


def tls_cost_measure(args, cfg, data):
    import json
    BL, BTL, AL, ATL, S = tls_cost_labels(data["short"])
    B, BT = Variant(BL, args.baseline_kwc, False), Variant(BTL, args.baseline_kwc, True)
    A, AT = Variant(AL, args.kwc, False), Variant(ATL, args.kwc, True)
    order = [B, BT, A, AT, AT, A, BT, B]  # ABBA over all four: drift over the run hits each alike
    tag = {BL: "b", BTL: "b-tls", AL: "a", ATL: "a-tls"}
    nmax = max(n for n, _ in cfg["watch"])
    opt = (("--max-connections", max(nmax, cfg["target"][0]) + 1000), ("--protobuf-resources", "none"))
    keep = ("streams", "ended", "deliveries", "per_s", "p50_ms", "p99_ms", "max_ms", "tls_failures", "non2xx",
            "unanswered", "written", "lost", "behind", "late", "extra", "reordered", "drain_ms", "cpu", "client_cpu",
            "rss_mb", "us", "written_s")

    def start(env, vs, part):
        servers = {}
        for v in vs:
            try:
                servers[v.label] = Kwc(args, env, v, "tlscost-%s-%s" % (part, tag[v.label]), optional=opt)
            except Unavailable as e:
                servers[v.label] = e
                data["why"]["%s|%s" % (part, v.label)] = str(e)
        return servers

    def watch(part, env, servers, n, rate, v):
        label = v if v == S else v.label
        k = servers.get(label)
        try:
            if v == S:
                r = tls_cost_watch(args, env, env.apisim.port, n, rate, False, pid=env.apisim.pid())
            elif isinstance(k, Kwc):
                r = tls_cost_watch(args, env, k, n, rate, v.tls)
            else:
                return
        except RuntimeError as e:  # fanout gave no result: the row says how many runs it has
            print("%s %d x %d, %s: %s" % (part, n, rate, label, e), file=sys.stderr, flush=True)
            data["why"]["%s|%d|%d|%s" % (part, n, rate, label)] = str(e)
            return
        rec = dict({x: r.get(x, 0) for x in keep}, part=part, n=n, rate=rate, server=label)
        data["runs"].append(rec)
        print(json.dumps({x: rec[x] for x in ("part", "n", "rate", "server", "streams", "per_s", "written_s",
                                              "p50_ms", "p99_ms", "us", "lost", "behind", "ended", "drain_ms")}),
              flush=True)

    # -- watch fan-out, 1 KiB events
    env = Env(apisim_args=["--pods", "2000", "--nodes", "100", "--pod-size", "1000", "--history", "1000000"],
              start_kwc=False)
    servers = {}
    try:
        servers = start(env, (B, BT, A, AT), "watch")
        for n, rate in cfg["watch"]:
            seq = list(order)
            if [n, rate] == list(cfg["watch"][-1]):
                seq[4:4] = [S, S]
            for v in seq:
                watch("watch", env, servers, n, rate, v)
    finally:
        stop_all(servers)
        env.close()

    # -- the latency target: TLS watchers at a low rate of larger objects
    tn, trate, tsize, _ = cfg["target"]
    env = Env(apisim_args=["--pods", "2000", "--nodes", "100", "--pod-size", str(tsize), "--history", "1000000"],
              start_kwc=False)
    servers = {}
    try:
        servers = start(env, (BT, AT), "target")
        for v in (AT, BT, BT, AT):
            watch("target", env, servers, tn, trate, v)
    finally:
        stop_all(servers)
        env.close()

    # -- cached RV=0 lists (curl), ABBA
    env = seeded_env(args, args.pods, 4096)
    servers = {}
    try:
        servers = start(env, (B, BT, A, AT), "list")
        for conc, per in ((1, 3), (8, 1)):
            # over TLS both protocols a client may pick: HTTP/1.1 (as the
            # watch rows) and HTTP/2 (what client-go and curl pick by ALPN)
            for v, proto in [(v, p) for v in order for p in ((H1, H2) if v.tls else (H1,))]:
                k = servers[v.label]
                if not isinstance(k, Kwc):
                    continue
                label = v.label + (LIST_H2 if proto == H2 else "")
                settle(k.pid)
                smp = Sampler(k.pid)
                c0 = cpu_seconds(k.pid)
                try:
                    wall, nbytes, times = curl_lists(k.port, "/api/v1/pods?resourceVersion=0", conc, per,
                                                     certs(args)["ca"] if v.tls else None,
                                                     extra=(("--http2",) if proto == H2 else ("--http1.1",)))
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    print("lists %d, %s: %s" % (conc, label, e), file=sys.stderr, flush=True)
                    continue
                finally:
                    peak = smp.stop()
                cpu = cpu_seconds(k.pid) - c0
                rec = {"conc": conc, "server": label, "s_gb": cpu / (nbytes / 1e9), "gbs": nbytes / wall / 1e9,
                       "p50": pct(times, 50) * 1000, "p99": pct(times, 99) * 1000, "rss": peak["RssAnon"] / 1024}
                data["lists"].append(rec)
                print(json.dumps({x: round(y, 3) if isinstance(y, float) else y for x, y in rec.items()}), flush=True)
    finally:
        stop_all(servers)
        env.close()

    # -- idle memory: connections after one GET, and watchers, each on a fresh kwc
    n = args.idle_conns
    env = Env(apisim_args=["--pods", "100", "--nodes", "4"], start_kwc=False)
    try:
        gpath = one_pod_path(env)
        for kind in ("connection", "watcher"):
            for v in (B, BT, A, AT):
                path = gpath if kind == "connection" else \
                    "/api/v1/pods?watch=1&resourceVersion=%d&timeoutSeconds=3600" % env.stats()["rv"]
                try:
                    r, grow, fds = idle_growth(args, env, v, n, path, "tlscost-idle-%s-%s" % (kind[0], tag[v.label]))
                except (Unavailable, RuntimeError) as e:
                    data["idle"].append({"kind": kind, "server": v.label, "why": str(e)})
                    continue
                rec = {"kind": kind, "server": v.label, "streams": r["streams"], "ended": r.get("ended", 0),
                       "unanswered": r.get("unanswered", 0), "kib": grow / max(r["streams"], 1), "fds": fds}
                data["idle"].append(rec)
                print(json.dumps(rec), flush=True)
    finally:
        env.close()


def tls_cost_report(data):
    """The tables (targets first), saved to bench/results/tls-cost.md, and
    the PNG, from what tls_cost_measure gathered."""
    cfg, short, dur = data["cfg"], data["short"], data["duration"]
    BL, BTL, AL, ATL, S = tls_cost_labels(short)
    order = [BL, BTL, AL, ATL, ATL, AL, BTL, BL]
    watch = [tuple(x) for x in cfg["watch"]]

    def runs(part, n, rate, label):
        return [r for r in data["runs"] if (r["part"], r["n"], r["rate"], r["server"]) == (part, n, rate, label)]

    def why(part, label, n=None, rate=None):
        w = data["why"].get("%s|%s" % (part, label))
        return w or data["why"].get("%s|%s|%s|%s" % (part, n, rate, label)) or "no result (see the log)"

    def mean(rs, key):
        return mean_of(rs, key) if rs else None

    out = []
    hdr = ["watchers x events/s", "server", "runs", "server CPU us/delivery", "deliveries/s asked",
           "deliveries/s got", "events written/s (apisim)", "p50 ms", "p99 ms", "server CPU", "fanout CPU",
           "deliveries lost", "TLS / plain CPU"]
    rows, plot = [], []
    for n, rate in watch:
        for label in (BL, BTL, AL, ATL, S):
            rs = runs("watch", n, rate, label)
            if not rs:
                if label != S or (n, rate) == watch[-1]:
                    rows.append(["%d x %d" % (n, rate), label, 0, why("watch", label, n, rate)] + ["-"] * 9)
                continue
            for r in rs:
                r["cpu_pct"], r["client_pct"] = 100 * r["cpu"], 100 * r["client_cpu"]
            plain = runs("watch", n, rate, label.replace(", TLS", ""))
            ratio_ = "%.2fx" % (mean_of(rs, "us") / mean_of(plain, "us")) if label.endswith("TLS") and plain and \
                mean_of(plain, "us") else "-"
            rows.append(["%d x %d" % (n, rate), label, len(rs), tls_cost_cell(rs, "us", "%.2f"), n * rate,
                         tls_cost_cell(rs, "per_s", "%.0f"), tls_cost_cell(rs, "written_s", "%.0f"),
                         tls_cost_cell(rs, "p50_ms", "%.1f"), tls_cost_cell(rs, "p99_ms", "%.1f"),
                         tls_cost_cell(rs, "cpu_pct", "%.0f%%"), tls_cost_cell(rs, "client_pct", "%.0f%%"),
                         tls_cost_lost(rs), ratio_])
            if label != S:
                plot.append((label, n, rate, mean_of(rs, "us")))
    out.append(table("Watch fan-out (fanout.c, 1 KiB pod updates, %d s window after a %d s warm-up, events started "
                     "once every stream has its head, then read until every stream is past the window, at most "
                     "%d s): before vs after, plaintext vs TLS, in the order %s; at %d x %d apisim twice in the "
                     "middle (mean, then each run); CPU as %% of one core; lost: events written in the window that "
                     "an open stream never received" % (
                         (dur, data.get("warmup", 2), TLS_COST_DRAIN, " -> ".join(order)) + watch[-1]),
                     hdr, rows))

    tn, trate, tsize, tp99 = cfg["target"]
    rows = []
    for label in (BTL, ATL):
        rs = runs("target", tn, trate, label)
        if not rs:
            rows.append([label, why("target", label, tn, trate)] + ["-"] * 5)
            continue
        rows.append([label, len(rs), tls_cost_cell(rs, "p50_ms", "%.1f"), tls_cost_cell(rs, "p99_ms", "%.1f"),
                     tls_cost_cell(rs, "per_s", "%.0f") + " of %d" % (tn * trate), tls_cost_cell(rs, "us", "%.2f"),
                     tls_cost_lost(rs)])
    out.append(table("The latency target: %d TLS watchers at %d events/s of ~%d-byte pods (fanout --tls), order "
                     "after, before, before, after" % (tn, trate, tsize),
                     ["server", "runs", "p50 ms", "p99 ms", "deliveries/s", "kwc CPU us/delivery",
                      "deliveries lost"], rows))

    def lists(conc, label):
        return [r for r in data["lists"] if (r["conc"], r["server"]) == (conc, label)]
    rows = []
    for conc in (1, 8):
        for label in (BL, BTL, BTL + LIST_H2, AL, ATL, ATL + LIST_H2):
            rs = lists(conc, label)
            if not rs:
                rows.append([conc, label, why("list", label)] + ["-"] * 4)
                continue
            plain = lists(conc, label.replace(LIST_H2, "").replace(", TLS", ""))
            ratio_ = "%.2fx" % (mean_of(rs, "s_gb") / mean_of(plain, "s_gb")) if ", TLS" in label and plain \
                and mean_of(plain, "s_gb") else "-"
            rows.append([conc, label, tls_cost_cell(rs, "s_gb", "%.2f"), tls_cost_cell(rs, "gbs", "%.2f"),
                         tls_cost_cell(rs, "p50", "%.0f") + " / " + tls_cost_cell(rs, "p99", "%.0f"),
                         tls_cost_cell(rs, "rss", "%.0f"), ratio_])
    out.append(table("Cached RV=0 list of %d pods (~4 KiB each), curl listers (1 lister: 3 lists in a row; 8: one "
                     "each), order %s (mean, then each run)" % (data["pods"], " -> ".join(order)),
                     ["listers", "server", "kwc CPU s/GB", "GB/s", "p50 / p99 ms per list", "kwc peak RssAnon MB",
                      "TLS / plain CPU per GB"], rows))

    idle = {(r["kind"], r["server"]): r for r in data["idle"]}
    rows = []
    for kind in ("connection", "watcher"):
        for label in (BL, BTL, AL, ATL):
            r = idle.get((kind, label))
            if not r or "why" in r:
                rows.append([kind, label, r["why"] if r else "-", "-", "-"])
                continue
            rows.append([kind, label, "%d%s" % (r["streams"], " (%d ended, %d unanswered)" % (
                r["ended"], r["unanswered"]) if r["ended"] or r["unanswered"] else ""), "%.2f" % r["kib"],
                "+%d" % r["fds"]])
    out.append(table("Idle memory: %d connections held by fanout --idle (after one GET; or a watch with its head "
                     "and no events), kwc RssAnon growth per connection (KiB, OpenSSL's allocations included), "
                     "each cell a fresh kwc" % data["idle_conns"],
                     ["idle", "server", "connections", "KiB per connection", "kwc fds"], rows))

    # -- the targets
    trows = []

    def target(what, measured, limit, ok):
        trows.append([what, measured, limit, "-" if ok is None else "PASS" if ok else "MISS"])

    def x(v):
        return "%.2fx" % v if v else "n/a"

    def div(a, b):
        return a / b if a and b else None

    for n, rate in watch:
        us = {label: mean(runs("watch", n, rate, label), "us") for label in (BL, BTL, AL, ATL)}
        ra, rb = div(us[ATL], us[AL]), div(us[BTL], us[BL])
        target("TLS / plaintext kwc CPU per delivery, %d x %d/s" % (n, rate), "%s (before: %s)" % (x(ra), x(rb)),
               "<= 1.25x", ra <= 1.25 if ra else None)
    for n, rate in watch:
        a, b = mean(runs("watch", n, rate, AL), "us"), mean(runs("watch", n, rate, BL), "us")
        d = 1 - div(a, b) if div(a, b) else None
        target("plaintext kwc CPU per delivery after vs before, %d x %d/s" % (n, rate),
               "%.2f vs %.2f us: %s" % (a or 0, b or 0, "%+.0f%%" % (-100 * d) if d is not None else "n/a"),
               ">= 25% lower", d >= 0.25 if d is not None else None)
    for conc in (1, 8):
        for sfx, pname in (("", "HTTP/1.1"), (LIST_H2, "HTTP/2")):
            sg = {label: mean(lists(conc, label), "s_gb") for label in (BL, BTL + sfx, AL, ATL + sfx)}
            ra, rb = div(sg[ATL + sfx], sg[AL]), div(sg[BTL + sfx], sg[BL])
            target("TLS (%s) / plaintext kwc CPU per list GB, %d lister%s" % (pname, conc, "s" if conc > 1 else ""),
                   "%s (%.2f vs %.2f s/GB; before: %s)" % (x(ra), sg[ATL + sfx] or 0, sg[AL] or 0, x(rb)),
                   "<= 1.15x", ra <= 1.15 if ra else None)
    n, rate = watch[-1]
    ka, sa = mean(runs("watch", n, rate, AL), "p99_ms"), mean(runs("watch", n, rate, S), "p99_ms")
    target("p99 at %d x %d/s: kwc (after, plaintext) vs apisim direct" % (n, rate),
           "%.0f vs %.0f ms" % (ka, sa) if ka is not None and sa is not None else "n/a", "below apisim's",
           ka < sa if ka is not None and sa is not None else None)
    ta, tb = mean(runs("target", tn, trate, ATL), "p99_ms"), mean(runs("target", tn, trate, BTL), "p99_ms")
    target("p99 of %d TLS watchers x %d/s x %d B (after)" % (tn, trate, tsize),
           "%.0f ms (before: %s)" % (ta, "%.0f ms" % tb if tb is not None else "n/a") if ta is not None else "n/a",
           "<= %d ms" % tp99, ta <= tp99 if ta is not None else None)
    after = [r for r in data["runs"] if r["server"] in (AL, ATL)]
    before = [r for r in data["runs"] if r["server"] in (BL, BTL)]
    target("deliveries lost, every after run (fan-out and the latency target)",
           "%s (before: %s)" % (tls_cost_lost(after), tls_cost_lost(before)) if after else "n/a", "0",
           # late (behind after the drain) is not lost; a stream the server ended lost what followed
           all(not r["lost"] and not r["ended"] and not r["unanswered"] for r in after) if after else None)
    for kind in ("connection", "watcher"):
        got = idle.get((kind, ATL))
        ok = got and "why" not in got
        other = ["%.2f" % idle[(kind, lb)]["kib"] if "kib" in idle.get((kind, lb), {}) else "n/a" for lb in (AL, BTL)]
        target("idle TLS %s memory (after), OpenSSL's included" % kind,
               "%.2f KiB (plaintext %s, before TLS %s)" % (got["kib"], other[0], other[1]) if ok else "n/a",
               "<= 16.5 KiB", got["kib"] <= 16.5 if ok else None)
    kwc = data["kwc"]
    out.insert(0, table("Issue 22 targets: before = %s, after = %s, one run started %s (%.0f min)%s" % (
        short, os.path.relpath(kwc, ROOT) if kwc.startswith(ROOT) else kwc, data["started"], data["minutes"],
        "" if data["save"] else "; --small or other sizes: not the issue's figures"),
        ["target", "measured", "limit", "result"], trows))
    for r in trows:
        print("%s  %s: %s (%s)" % (r[3], r[0], r[1], r[2]), flush=True)
    save("tls-cost", "\n".join(out))
    plot_tls_cost(plot, short)


def mean_of(rs, key):
    return sum(r[key] for r in rs) / len(rs)


def plot_tls_cost(points, short, name="tls-cost"):
    """PNG: kwc CPU per delivery by watchers, one line per server (before and
    after, plaintext and TLS). Unsaved runs draw into the temporary directory."""
    if not points:
        return
    where = RESULTS if SAVE else tempfile.gettempdir()
    data, png = os.path.join(where, name + ".dat"), os.path.join(where, name + ".png")
    labels = []
    for label, *_ in points:
        if label not in labels:
            labels.append(label)
    with open(data, "w") as f:
        for s in labels:
            f.write("# %s\n" % s)
            for label, n, rate, us in points:
                if label == s:
                    f.write('%d %.3f "%d x %d/s"\n' % (n, us, n, rate))
            f.write("\n\n")
    lines = ", ".join("'%s' index %d using 1:2%s with linespoints lw 2 pt %d dashtype %d title '%s'" % (
        data, i, ":xtic(3)" if i == 0 else "", 7 if "TLS" in s else 5, 2 if "before" in s else 1, s)
        for i, s in enumerate(labels))
    script = """set terminal pngcairo size 900,560 noenhanced
set output '%s'
set title "kwc CPU per watch delivery, 1 KiB events (fanout.c)\\nbefore (%s) vs after, plaintext vs TLS"
set xlabel 'watchers x events/s'
set ylabel 'kwc CPU us per delivery'
set offsets graph 0.06, graph 0.06, 0, 0
set yrange [0:*]
set key below
plot %s
""" % (png, short, lines)
    subprocess.run(["gnuplot"], input=script, text=True, check=False)
    print("plot: %s" % png, flush=True)


# The full run's sizes: results are saved (and plots drawn) only at these.
# h2_rate 20: 10,000 watches x 20 events/s = 200,000 deliveries/s, inside
# what this 2-core machine carries over either protocol with the load
# generator beside kwc, so CPU per delivery and latency compare; at 100/s
# (1,000,000/s) both protocols saturate and the rows only say so.
FULL = {"pods": 150000, "watchers": "1000,10000", "idle": 15000, "duration": 5, "idle_conns": 5000,
        "slowloris": 2000, "flood": 4000, "max_connections": 1000, "header_timeout": 10,
        "auth_watchers": 1000, "auth_kubelet": 5000, "auth_burst": 5000, "pb_kubelet": 5000,
        "h2_watchers": 10000, "h2_conns": 100, "h2_rate": 20, "h2_get_seconds": 3, "h2_get_conns": "1,8,32",
        "cm_duration": 60, "cm_pods": 3000, "h2page_requests": 2000,
        "cores_pods": 20000, "cores_storm": 5000, "cores_fanout": "1000x10,100x100", "cores_compare": 4000}
# --small: every scenario in well under a minute, to check the script itself.
PB_ACCEPT = "application/vnd.kubernetes.protobuf, application/json"


def pb_served(env, hdr):
    """kwc answers ?resourceVersion=0 of pods itself in the encoding hdr asks
    for (apisim saw no list for it)."""
    def lists():
        return sum(v for k, v in env.stats()["requests"].items() if k == "list pods")
    n = lists()
    st, _, b = http_request(env.kwc.port, "GET", "/api/v1/pods?resourceVersion=0&limit=1",
                            headers={"Accept": hdr}, timeout=120)
    return st == 200 and lists() == n


def data_mb(env):
    """Disk blocks the LMDB file holds (it is sparse up to the map size; pages
    freed by earlier transactions count until LMDB reuses them)."""
    st = os.stat(os.path.join(env.dir, "data", "data.mdb"))
    return st.st_blocks * 512 / 1e6


def db_mb(env, suffix):
    """MB of LMDB pages (branch, leaf, overflow) in the databases of one
    encoding (objects, history, field index: names ending in :json or :pb),
    from mdb_stat -a (lmdb-utils)."""
    out = subprocess.run(["mdb_stat", "-a", os.path.join(env.dir, "data")], capture_output=True,
                         text=True, check=True).stdout
    total, cur = 0, None
    for line in out.splitlines():
        if line.startswith("Status of "):
            cur = line[len("Status of "):].strip()
        elif cur and cur.endswith(suffix) and re.match(r"\s+(Branch|Leaf|Overflow) pages:", line):
            total += int(line.split(":")[1])
    return total * 4096 / 1e6


def upstream_watches(env):
    """Watches open on apisim, by encoding (apisim's own count)."""
    st = env.stats()
    w = st.get("watches_open") or {}
    return ", ".join("%s %s" % (enc, n) for enc, n in sorted((w.get("pods") or {}).items())) or "?"


def bench_protobuf(args):
    """Issue 13: the protobuf cache next to the JSON one, same run: the kubelet
    pattern, RV=0 lists, and what the second encoding costs."""
    import threading
    pods = args.pods
    env = Env(apisim_args=["--nodes", "5000", "--history", "2000000"],
              kwc_args=["--resources", "v1/pods", "--log-level", "warn", "--protobuf-resources", "none"],
              kwc_bin=args.kwc, start_kwc=False)
    rows, lrows, krows = [], [], []
    try:
        env.sim("POST", "/apisim/seed", {"resource": "pods", "count": pods, "namespaces": 10,
                                         "nodes": 5000, "size": 1000})
        # -- what the second encoding costs: JSON only, then both
        env.start_kwc()
        wait_for(lambda: pb_served(env, "application/json"), 600, "the JSON cache")
        time.sleep(1)  # quiet: let the last commit and the page cache settle
        disk_json, anon_json = data_mb(env), rss_kib(env.kwc.pid(), "RssAnon") / 1024
        file_json = rss_kib(env.kwc.pid(), "RssFile") / 1024
        env.kwc.stop()
        env.kwc_args = ["--resources", "v1/pods", "--log-level", "info", "--protobuf-resources", "v1/pods"]
        t0 = time.monotonic()
        env.start_kwc()
        wait_for(lambda: pb_served(env, PB_ACCEPT), 600, "the protobuf cache")
        t_pb = time.monotonic() - t0
        time.sleep(1)
        disk_both, anon_both = data_mb(env), rss_kib(env.kwc.pid(), "RssAnon") / 1024
        file_both = rss_kib(env.kwc.pid(), "RssFile") / 1024
        env.kwc.stop()  # mdb_stat reads a quiet file
        pages_json, pages_pb = db_mb(env, ":json"), db_mb(env, ":pb")
        env.start_kwc()
        wait_for(lambda: pb_served(env, PB_ACCEPT), 600, "the protobuf cache after a warm restart")
        m = re.search(r"synced (\d+) objects \(([\d.]+) MB\)[^\n]*protobuf|protobuf[^\n]*synced (\d+) objects \(([\d.]+) MB\)",
                      env.kwc.logs(200))
        pb_mb = (m.group(2) or m.group(4)) if m else "?"
        rows.append(["LMDB pages of each encoding's databases (mdb_stat)", "%.0f MB" % pages_json,
                     "%.0f MB + %.0f MB" % (pages_json, pages_pb),
                     "+%.0f MB (%.0f B per pod)" % (pages_pb, pages_pb * 1e6 / pods)])
        rows.append(["disk blocks of data.mdb (free pages included)", "%.0f MB" % disk_json, "%.0f MB" % disk_both,
                     "%+.0f MB" % (disk_both - disk_json)])
        rows.append(["kwc RssAnon (own memory), idle after sync", "%.0f MB" % anon_json, "%.0f MB" % anon_both,
                     "%+.0f MB" % (anon_both - anon_json)])
        rows.append(["kwc RssFile (LMDB pages mapped), idle after sync", "%.0f MB" % file_json,
                     "%.0f MB" % file_both, "%+.0f MB" % (file_both - file_json)])
        rows.append(["upstream bytes per full list", "-", "%s MB protobuf" % pb_mb,
                     "protobuf cache synced %.1f s after exec (warm JSON cache)" % t_pb])
        # -- RV=0 lists, one lister, three in a row, each encoding
        path = "/api/v1/pods?resourceVersion=0"
        for name, accept in (("JSON", "application/json"), ("protobuf", PB_ACCEPT)):
            for conc, per in ((1, 3), (4, 1)):
                stop, peak = threading.Event(), {}
                base = rss_kib(env.kwc.pid(), "RssAnon")
                th = threading.Thread(target=rss_sampler, args=(env.kwc.pid(), stop, peak))
                th.start()
                c0 = cpu_seconds(env.kwc.pid())
                w, b, t = curl_lists(env.kwc.port, path, conc, per, accept=accept)
                cpu = (cpu_seconds(env.kwc.pid()) - c0) / w
                stop.set()
                th.join()
                lrows.append([name, conc, "%.1f MB" % (b / (conc * per) / 1e6), "%.2f" % (b / w / 1e9),
                              "%.0f" % (pods * conc * per / w / 1e3),
                              "%.0f / %.0f" % (pct(t, 50) * 1000, pct(t, 99) * 1000), "%.0f%%" % (cpu * 100),
                              "%.1f MB" % ((peak.get("RssAnon", base) - base) / 1024 / conc)])
                print(lrows[-1], flush=True)
        # -- the kubelet pattern, each encoding
        for name, pb in (("JSON", False), ("protobuf", True)):
            rv = env.stats()["rv"]
            env.sim("POST", "/apisim/churn", {"rate": 500, "resources": ["pods"], "mix": {"update": 1.0}})
            p = fanout(args, env.kwc.port, args.pb_kubelet, nodes=5000, protobuf=pb,
                       path="/api/v1/pods?watch=1&resourceVersion=%d&timeoutSeconds=600" % rv)
            try:
                r = fanout_measure(p, env.kwc.pid())
            finally:
                env.sim("POST", "/apisim/churn", {"rate": 0})
            krows.append([name, args.pb_kubelet, r["streams"], r["per_s"], r["p50_ms"], r["p99_ms"], r["max_ms"],
                          "%.0f%%" % (r["cpu"] * 100), "%.0f" % r["rss_mb"], upstream_watches(env)])
            print(krows[-1], flush=True)
    finally:
        env.close()
    text = table("The kubelet pattern: node-pinned watchers (fieldSelector=spec.nodeName) over %d pods, 500 ev/s" % pods,
                 ["encoding", "watchers", "streams", "deliveries/s", "p50 ms", "p99 ms", "max ms", "kwc CPU",
                  "kwc RssAnon MB", "upstream watches open (pods)"], krows)
    text += "\n" + table("RV=0 list of %d pods from kwc's cache, curl readers" % pods,
                         ["encoding", "listers", "bytes per list", "GB/s", "k objects/s", "p50 / p99 ms", "kwc CPU",
                          "kwc peak RssAnon growth per list"], lrows)
    text += "\n" + table("The second encoding's cost (%d pods)" % pods,
                         ["measure", "JSON cache only", "JSON + protobuf", "difference"], rows)
    save("protobuf", text)


# -- serve-more (issue 23): metadata-only and gzip answers from the cache

POM = ";as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
POML = ";as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
JSON_T, PB_T = "application/json", "application/vnd.kubernetes.protobuf"
# (label, Accept of a list, Accept of a watch): as client-go's typed clients
# and its metadata client (k8s.io/client-go/metadata) send them
SM_VARIANTS = (("JSON", JSON_T, JSON_T),
               ("JSON metadata", JSON_T + POML, JSON_T + POM),
               ("protobuf", PB_ACCEPT, PB_ACCEPT),
               ("protobuf metadata", PB_T + POML + "," + JSON_T + POML, PB_T + POM + "," + JSON_T + POM))
# pods: the full run's is --pods; lists: (listers, lists each); watch: (watchers, events/s)
SERVE_MORE_FULL = {"pods": None, "lists": ((1, 3), (8, 1)), "watch": (1000, 100)}
SERVE_MORE_SMALL = {"pods": 20000, "lists": ((1, 2), (8, 1)), "watch": (200, 100)}
SM_FMT = "%{http_code}|%{time_total}|%{size_download}|%header{content-encoding}|%header{content-type}\n"


def prom(text, name, **labels):
    """The sum of the samples of one metric whose labels include labels."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line[len(name):len(name) + 1] not in ("{", " "):
            continue
        if all('%s="%s"' % kv in line for kv in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def sm_counts(env, k):
    """What tells who answered: apisim's request counters (lists and watches
    of pods it served) and kwc's kwc_requests_total by source (LIST of pods).
    k: a Kwc, or None (apisim direct)."""
    req = env.stats()["requests"]
    out = {"apisim_lists": req.get("list pods", 0), "apisim_watches": req.get("watch pods", 0)}
    if k is not None:
        st, body = k.get("/metrics", timeout=30)
        text = body.decode() if isinstance(body, bytes) else body
        for src in ("cache", "upstream"):
            out["kwc_" + src] = prom(text, "kwc_requests_total", verb="LIST", resource="pods", source=src)
            out["inflight_" + src] = prom(text, "kwc_requests_in_flight", source=src)
        out["events"] = prom(text, "kwc_watch_events_sent_total", resource="pods")
        out["event_bytes"] = prom(text, "kwc_watch_sent_bytes_total", resource="pods")
    return out


def sm_served(n, c0, c1):
    """Who answered n lists: cache (kwc counted them as source cache and
    apisim served no list), upstream (kwc passed them through), or what the
    counters say when they disagree."""
    cache, up = c1["kwc_cache"] - c0["kwc_cache"], c1["kwc_upstream"] - c0["kwc_upstream"]
    sim = c1["apisim_lists"] - c0["apisim_lists"]
    if cache == n and up == 0 and sim == 0:
        return "cache"
    if up == n and cache == 0 and sim >= n:
        return "upstream"
    return "mixed (kwc cache %d, upstream %d; apisim lists %d)" % (cache, up, sim)


def sm_curl(port, path, conc, per, headers):
    """conc curl processes reading per lists each in sequence (keep-alive),
    bodies to /dev/null and never decompressed (no --compressed: a gzip body
    is counted as it came, and its decoding costs nobody measured).
    (wall seconds, [{code, s, bytes, enc, type}])."""
    url = "http://127.0.0.1:%d%s" % (port, path)
    cmd = ["curl", "-s", "-A", "kwc-bench", "-w", SM_FMT] + [a for h in headers for a in ("-H", h)]
    for _ in range(per):
        cmd += ["-o", "/dev/null", url]
    t0 = time.monotonic()
    ps = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(conc)]
    recs = []
    for p in ps:
        out, _ = p.communicate(timeout=900)
        for line in out.split("\n"):
            if line.strip():
                code, t, n, enc, ctype = line.split("|")
                if code != "200":
                    raise RuntimeError("list answered %s" % code)
                recs.append({"s": float(t), "bytes": int(float(n)), "enc": enc.strip() or "identity",
                             "type": ctype.strip().split(";")[0]})
    return time.monotonic() - t0, recs


def sm_gunzip(port, headers, path="/api/v1/pods?resourceVersion=0"):
    """One list read and, where it came gzip'd, decoded as it arrives (not
    kept): (Content-Encoding, bytes as sent, bytes decoded). Outside every
    measured cell: it checks that a gzip body is whole and what it holds."""
    import http.client
    import zlib
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        c.request("GET", path, headers=dict(h.split(": ", 1) for h in headers))
        r = c.getresponse()
        enc = r.getheader("Content-Encoding") or "identity"
        d = zlib.decompressobj(16 + zlib.MAX_WBITS) if enc == "gzip" else None
        sent = raw = 0
        while True:
            b = r.read(1 << 20)
            if not b:
                break
            sent += len(b)
            raw += len(d.decompress(b)) if d else len(b)
        if d:
            raw += len(d.flush())
            if not d.eof:
                raise RuntimeError("the gzip stream ended early (%d bytes)" % sent)
        return enc, sent, raw
    finally:
        c.close()


def sm_list_cell(env, k, part, variant, conc, per, headers, raw=None, path="/api/v1/pods?resourceVersion=0"):
    """One cell: conc listers x per lists of RV=0 pods from k (a Kwc) or
    apisim directly (k None): the server's CPU over the cell, bytes as
    sent, who answered. raw: the uncompressed bytes of one list (gzip rows)."""
    import json
    pid, port = (k.pid, k.port) if k is not None else (env.apisim.pid(), env.apisim.port)
    settle(pid)
    c0 = sm_counts(env, k)
    cpu0 = cpu_seconds(pid)
    wall, recs = sm_curl(port, path, conc, per, headers)
    cpu = cpu_seconds(pid) - cpu0
    n = len(recs)
    if k is not None:  # a request counts once its response is done: kwc may count it a moment after curl ends
        poll_until(lambda: sum(sm_counts(env, k)[x] - c0[x] for x in ("kwc_cache", "kwc_upstream")) >= n, 5, 0.05)
        served = sm_served(n, c0, sm_counts(env, k))
    else:
        served = "apisim"
    nbytes = sum(r["bytes"] for r in recs)
    times = sorted(r["s"] for r in recs)
    raw_total = (raw or nbytes / n) * n
    rec = {"part": part, "server": "kwc" if k is not None else "apisim", "variant": variant, "conc": conc,
           "lists": n, "served": served, "bytes": nbytes / n, "raw": raw_total / n,
           "enc": ",".join(sorted(set(r["enc"] for r in recs))), "type": ",".join(sorted(set(r["type"] for r in recs))),
           "p50": pct(times, 50) * 1000, "p99": pct(times, 99) * 1000, "wall": wall, "cpu": cpu,
           "cpu_ms": cpu / n * 1000, "s_gb": cpu / (raw_total / 1e9), "lists_s": n / wall,
           "gbs": raw_total / wall / 1e9, "wire_gbs": nbytes / wall / 1e9}
    print(json.dumps({x: round(y, 3) if isinstance(y, float) else y for x, y in rec.items()}), flush=True)
    return rec


def sm_watch(args, env, k, variant, accept, pb, n, rate):
    """n watchers (fanout --accept) from k at rate pod updates/s: kwc CPU
    per delivery, and who serves the streams (kwc's requests in flight by
    source while they are open, apisim's watches of pods)."""
    import json
    settle(k.pid)
    c0 = sm_counts(env, k)
    p = fanout(args, k.port, n, path="/api/v1/pods?watch=1&resourceVersion=%d&timeoutSeconds=900" % env.stats()["rv"],
               protobuf=pb, accept=accept, deadline=120, announce_heads=True, drain=TLS_COST_DRAIN,
               warmup=1 if args.small else 2)
    mid = {}
    try:
        first = json.loads(read_line(p, 300))
        if "heads" not in first:
            raise RuntimeError("not every stream got its head: %s" % first)
        mid = sm_counts(env, k)
        env.sim("POST", "/apisim/churn", {"rate": rate, "resources": ["pods"], "mix": {"update": 1.0}})
        r = fanout_measure(p, k.pid, timeout=args.duration + TLS_COST_DRAIN + 120)
    finally:
        env.sim("POST", "/apisim/churn", {"rate": 0})
        if p.poll() is None:
            p.kill()
            p.wait()
    c1 = sm_counts(env, k)
    ups = mid.get("inflight_upstream", 0) - c0.get("inflight_upstream", 0)
    cache = mid.get("inflight_cache", 0) - c0.get("inflight_cache", 0)
    sim = mid.get("apisim_watches", 0) - c0["apisim_watches"]
    served = "cache" if cache >= n and ups == 0 and sim == 0 else "upstream" if ups >= n and sim >= n else \
        "mixed (kwc in flight: cache %d, upstream %d; apisim watches %d)" % (cache, ups, sim)
    ev = c1["events"] - c0["events"]
    rec = {"part": "watch", "variant": variant, "n": n, "rate": rate, "served": served, "streams": r["streams"],
           "per_s": r["per_s"], "p50": r["p50_ms"], "p99": r["p99_ms"], "lost": r.get("lost", 0),
           "us": r["cpu"] / r["per_s"] * 1e6 if r.get("per_s") else 0, "cpu": r["cpu"], "client_cpu": r["client_cpu"],
           "event_bytes": (c1["event_bytes"] - c0["event_bytes"]) / ev if ev else 0}
    print(json.dumps({x: round(y, 3) if isinstance(y, float) else y for x, y in rec.items()}), flush=True)
    return rec


def bench_serve_more(args):
    """Issue 23: metadata-only lists and watches and gzip'd lists, served by
    kwc (from its cache, or passed through where it does not serve them yet:
    each row says which) and by apisim directly, one run."""
    import json
    cfg = SERVE_MORE_SMALL if args.small else SERVE_MORE_FULL
    pods = cfg["pods"] or args.pods
    data = {"pods": pods, "cfg": cfg, "kwc": args.kwc, "duration": args.duration, "lists": [], "watch": [],
            "why": [], "started": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "rev": git("describe", "--always",
                                                                                                   "--dirty")}
    t_start = time.monotonic()
    env = seeded_env(args, pods, 0)  # apisim's own pod (~3 KiB JSON, ~0.5 KiB of it metadata)
    k = None
    try:
        # passthrough watches (where kwc does not serve a variant) each hold an upstream connection
        k = Kwc(args, env, Variant("kwc", args.kwc, False), "servemore",
                optional=(("--max-connections", cfg["watch"][0] + 1000),
                          ("--max-upstream-connections", cfg["watch"][0] + 100)))
        # both caches synced: a one-item list in each encoding answered without apisim
        for acc in (JSON_T, PB_ACCEPT):
            wait_for(lambda: sm_list_cell(env, k, "sync", acc, 1, 1, ["Accept: " + acc],
                                          path="/api/v1/pods?resourceVersion=0&limit=1")["served"] == "cache", 600,
                     "kwc's %s cache" % acc, interval=1)
        data["ready_s"] = time.monotonic() - t_start
        # -- (a) metadata-only lists, each variant: kwc, then apisim directly
        for label, acc, _ in SM_VARIANTS:
            hdr = ["Accept: " + acc]
            for conc, per in cfg["lists"]:
                r = sm_list_cell(env, k, "meta", label, conc, per, hdr)
                data["lists"].append(r)
                if r["served"] != "cache":  # a passthrough: one cell says it (apisim renders each list anew)
                    data["why"].append("%s lists: %s, measured at %d lister(s) only" % (label, r["served"], conc))
                    break
            data["lists"].append(sm_list_cell(env, None, "meta", label, 1, 1, hdr))
        # -- (b) gzip: JSON lists with and without Accept-Encoding: gzip, kwc and apisim
        raw = {}
        for server in ("kwc", "apisim"):
            kk = k if server == "kwc" else None
            for conc, per in cfg["lists"]:
                for label, hdr in (("identity", []), ("gzip", ["Accept-Encoding: gzip"])):
                    r = sm_list_cell(env, kk, "gzip", label, conc, per, ["Accept: " + JSON_T] + hdr,
                                     raw=raw.get(server))
                    if label == "identity":
                        raw[server] = r["bytes"]
                    data["lists"].append(r)
            try:  # a gzip answer decoded once: whole, and as long as the identity list
                port = k.port if kk else env.apisim.port
                enc, sent, dec = sm_gunzip(port, ["Accept: " + JSON_T, "Accept-Encoding: gzip"])
                data["why"].append("%s, one gzip-asked list decoded outside the cells: Content-Encoding %s, %d bytes "
                                   "sent, %d decoded (identity list: %d)" % (server, enc, sent, dec, raw[server]))
            except Exception as e:  # zlib.error, http.client's, OSError: the note says it
                data["why"].append("%s, the gzip-asked list did not decode: %s" % (server, e))
            print(data["why"][-1], flush=True)
        # -- the watch side: n watchers, each variant
        n, rate = cfg["watch"]
        for label, _, acc in SM_VARIANTS:
            try:
                data["watch"].append(sm_watch(args, env, k, label, acc, label.startswith("protobuf"), n, rate))
            except RuntimeError as e:
                print("watch %s: %s" % (label, e), file=sys.stderr, flush=True)
                data["why"].append("watch %s: %s" % (label, e))
    finally:
        if k is not None:
            k.stop()
        env.close()
        data["minutes"] = (time.monotonic() - t_start) / 60
        out = os.path.join(tempfile.gettempdir(), "kwc-serve-more-%s.json" % time.strftime("%Y%m%d-%H%M%S"))
        with open(out, "w") as f:
            json.dump(data, f, indent=1)
        print("results: %s" % out, flush=True)
    serve_more_report(data)


def serve_more_report(data):
    pods, cfg = data["pods"], data["cfg"]
    out = []
    L = data["lists"]

    def find(part, server, variant, conc):
        return next((r for r in L if (r["part"], r["server"], r["variant"], r["conc"]) == (part, server, variant,
                                                                                          conc)), None)

    def pct_of(a, b):
        return "%.0f%%" % (100 * a / b) if a and b else "-"

    # the headline: metadata vs full, gzip vs identity (kwc, 1 lister)
    rows = []
    for full, meta in (("JSON", "JSON metadata"), ("protobuf", "protobuf metadata")):
        f, m = find("meta", "kwc", full, 1), find("meta", "kwc", meta, 1)
        if f and m:
            rows.append(["%s vs %s list, kwc, 1 lister" % (meta, full), "%s -> %s" % (m["served"], f["served"]),
                         pct_of(m["bytes"], f["bytes"]), pct_of(m["cpu_ms"], f["cpu_ms"]), pct_of(m["p50"], f["p50"])])
    wd = {r["variant"]: r for r in data["watch"]}
    for full, meta in (("JSON", "JSON metadata"), ("protobuf", "protobuf metadata")):
        if full in wd and meta in wd:
            rows.append(["%s vs %s watch, %d x %d/s" % (meta, full, wd[meta]["n"], wd[meta]["rate"]),
                         "%s -> %s" % (wd[meta]["served"], wd[full]["served"]),
                         pct_of(wd[meta]["event_bytes"], wd[full]["event_bytes"]),
                         pct_of(wd[meta]["us"], wd[full]["us"]), pct_of(wd[meta]["p50"], wd[full]["p50"])])
    for server in ("kwc", "apisim"):
        for conc, _ in cfg["lists"]:
            g, i = find("gzip", server, "gzip", conc), find("gzip", server, "identity", conc)
            if g and i:
                rows.append(["gzip vs identity JSON list, %s, %d lister%s" % (server, conc, "s" if conc > 1 else ""),
                             "%s, %s -> %s" % (g["served"], g["enc"], i["served"]), pct_of(g["bytes"], i["bytes"]),
                             pct_of(g["cpu_ms"], i["cpu_ms"]), pct_of(g["p50"], i["p50"])])
    out.append(table("Issue 23, serve-more: %d pods, kwc %s, one run started %s (%.1f min)%s" % (
        pods, data["rev"], data["started"], data["minutes"], "" if SAVE else "; --small: not the issue's figures"),
        ["comparison (kwc's measures)", "served by (variant -> base)", "bytes", "server CPU per list / delivery",
         "p50"], rows))

    hdr = ["server", "variant (Accept)", "served by", "listers x lists", "body bytes per list", "vs full", "Content-Type",
           "p50 / p99 ms", "lists/s", "server CPU ms per list", "server CPU s per GB sent"]
    rows = []
    for server in ("kwc", "apisim"):
        for label, _, _ in SM_VARIANTS:
            for r in [r for r in L if (r["part"], r["server"], r["variant"]) == ("meta", server, label)]:
                full = find("meta", server, label.replace(" metadata", ""), r["conc"]) or \
                    find("meta", server, label.replace(" metadata", ""), 1)
                rows.append([server, label, r["served"], "%d x %d" % (r["conc"], r["lists"] // r["conc"]),
                             "%.1f MB" % (r["bytes"] / 1e6), pct_of(r["bytes"], full["bytes"]) if full else "-",
                             r["type"], "%.0f / %.0f" % (r["p50"], r["p99"]), "%.2f" % r["lists_s"],
                             "%.0f" % r["cpu_ms"], "%.2f" % r["s_gb"]])
    out.append(table("Metadata-only RV=0 list of %d pods vs the full objects (curl; apisim directly: one list each, "
                     "rendered anew for every metadata list); served by: kwc's kwc_requests_total{verb=LIST,source} "
                     "and apisim's list count over the cell (cache: kwc counted every list as cache and apisim served "
                     "none)" % pods, hdr, rows))

    hdr = ["variant (Accept)", "served by", "watchers x events/s", "deliveries/s got of asked", "kwc CPU us per delivery",
           "bytes per event (kwc's count)", "p50 / p99 ms", "kwc CPU", "fanout CPU", "lost"]
    rows = [[r["variant"], r["served"], "%d x %d" % (r["n"], r["rate"]), "%.0f of %d" % (r["per_s"], r["n"] * r["rate"]),
             "%.2f" % r["us"],
             "%.0f" % r["event_bytes"] if r["event_bytes"] else "- (passthrough)",
             "%.1f / %.1f" % (r["p50"], r["p99"]), "%.0f%%" % (100 * r["cpu"]), "%.0f%%" % (100 * r["client_cpu"]),
             r["lost"]] for r in data["watch"]]
    out.append(table("Metadata-only watch vs the full objects: %d watchers (fanout.c --accept, HTTP/1.1) at %d pod "
                     "updates/s, %d s window; served by: kwc's kwc_requests_in_flight{source} and apisim's watch count "
                     "once every stream had its head" % (cfg["watch"][0], cfg["watch"][1], data["duration"]),
                     hdr, rows))

    hdr = ["server", "Accept-Encoding", "served by", "Content-Encoding", "listers x lists", "body bytes per list",
           "vs identity", "p50 / p99 ms", "lists/s", "GB/s uncompressed", "GB/s sent", "server CPU ms per list",
           "server CPU s per GB uncompressed"]
    rows = []
    for server in ("kwc", "apisim"):
        for conc, _ in cfg["lists"]:
            for label in ("identity", "gzip"):
                r = find("gzip", server, label, conc)
                if not r:
                    continue
                i = find("gzip", server, "identity", conc)
                rows.append([server, label if label == "gzip" else "-", r["served"], r["enc"],
                             "%d x %d" % (r["conc"], r["lists"] // r["conc"]), "%.1f MB" % (r["bytes"] / 1e6),
                             pct_of(r["bytes"], i["bytes"]) if i else "-", "%.0f / %.0f" % (r["p50"], r["p99"]),
                             "%.2f" % r["lists_s"], "%.2f" % r["gbs"], "%.2f" % r["wire_gbs"], "%.0f" % r["cpu_ms"],
                             "%.2f" % r["s_gb"]])
    out.append(table("gzip: RV=0 JSON list of %d pods with and without Accept-Encoding: gzip (curl without "
                     "--compressed: bytes as sent, never decoded); uncompressed = the identity list's size" % pods,
                     hdr, rows))
    if data["why"]:
        out.append("Notes:\n\n" + "\n".join("- " + w for w in data["why"]) + "\n")
    save("serve-more", "\n".join(out))
    plot_serve_more(data)


def plot_serve_more(data, name="serve-more"):
    """PNG: body bytes per list (MB) and kwc CPU per list (ms) by variant,
    kwc at 1 lister; a passthrough variant's label says so."""
    rows = [r for r in data["lists"] if r["server"] == "kwc" and r["conc"] == 1 and r["part"] in ("meta", "gzip")]
    if not rows:
        return
    where = RESULTS if SAVE else tempfile.gettempdir()
    dat, png = os.path.join(where, name + ".dat"), os.path.join(where, name + ".png")
    with open(dat, "w") as f:
        f.write("# variant  MB-per-list  kwc-CPU-ms-per-list  colour (passthrough grey)  (kwc, 1 lister, RV=0 list "
                "of %d pods)\n" % data["pods"])
        for r in rows:
            if r["part"] == "gzip" and r["variant"] == "identity":
                continue  # the same list as the meta part's JSON row
            served = r["served"] if r["served"] in ("cache", "upstream") else "mixed"
            label = r["variant"] if r["part"] == "meta" else "JSON, gzip asked"
            label += "\\n(%s%s)" % (served, ", " + r["enc"] if r["part"] == "gzip" else "")
            f.write('"%s" %.2f %.1f %s\n' % (label, r["bytes"] / 1e6, r["cpu_ms"],
                                           "0x4477aa" if served == "cache" else "0xaaaaaa"))
    script = """set terminal pngcairo size 1000,540 noenhanced
set output '%s'
set multiplot layout 1,2 title "kwc, RV=0 list of %d pods, 1 lister: metadata-only and gzip vs the full objects\\n(grey: kwc passed the request to apisim; blue: kwc answered from its cache)"
set style fill solid 0.8 border -1
set boxwidth 0.7
set xtics rotate by -30 font ',8'
set yrange [0:*]
set key off
set title 'body bytes per list (MB, as sent)'
plot '%s' using 0:2:4:xtic(1) with boxes lc rgb variable
set title 'kwc CPU per list (ms)'
plot '%s' using 0:3:4:xtic(1) with boxes lc rgb variable
unset multiplot
""" % (png, data["pods"], dat, dat)
    subprocess.run(["gnuplot"], input=script, text=True, check=False)
    print("plot: %s" % png, flush=True)


SMALL = {"pods": 1000, "watchers": "200", "idle": 500, "duration": 2, "idle_conns": 500,
         "slowloris": 200, "flood": 300, "max_connections": 100, "header_timeout": 2,
         "auth_watchers": 200, "auth_kubelet": 200, "auth_burst": 500, "pb_kubelet": 200,
         "h2_watchers": 500, "h2_conns": 5, "h2_rate": 100, "h2_get_seconds": 1, "h2_get_conns": "1,8,32",
         "cm_duration": 15, "cm_pods": 300, "h2page_requests": 300,
         "cores_pods": 2000, "cores_storm": 300, "cores_fanout": "20x10,5x40", "cores_compare": 200}
SCENARIOS = "passthrough,large,cache,watch,front,watch-tls,idle-tls,slowloris,integrity,auth,protobuf,metrics,rooms," \
    "http2,tls-cost,serve-more,attack,controller-manager,cores,tls-cipher,h2page"
NEEDS_BASELINE = {"front", "watch-tls", "idle-tls", "slowloris", "metrics", "rooms", "http2", "tls-cost", "cores",
                  "tls-cipher", "h2page"}
CORES_BASELINE = "4584f7e"  # main as issue 32 (every core serves) began


def bench_attack(args):
    import attack
    attack.bench_attack(args, sys.modules[__name__])


def bench_controller_manager(args):
    import cm
    cm.bench_controller_manager(args, sys.modules[__name__])


def bench_cores(args):
    import cores
    cores.bench_cores(args, sys.modules[__name__])


def bench_tls_cipher(args):
    import tlscipher
    tlscipher.bench_tls_cipher(args, sys.modules[__name__])


def bench_h2page(args):
    import h2page
    h2page.bench_h2page(args, sys.modules[__name__])


def main():
    global SAVE, NOTE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kwc", default=os.path.join(ROOT, "build", "kwc"),
                    help="the kwc under test (AFTER in the before/after scenarios; default build/kwc)")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bench"), help="bench/*.c built (fanout, ...)")
    ap.add_argument("--baseline-commit", default=None,
                    help="BEFORE: kwc built from this commit (default: the last with libevhtp; for --only http2 "
                         "alone: %s, main before issue 21; for --only tls-cost alone: %s, main before issue 22)" % (
                             H2_BASELINE, TLS_COST_BASELINE))
    ap.add_argument("--baseline-kwc", "--before-bin", default=None,
                    help="BEFORE: this binary instead of building one")
    ap.add_argument("--only", default=SCENARIOS, help="comma-separated scenarios (default: all, %s)" % SCENARIOS)
    ap.add_argument("--small", action="store_true", help="small sizes (%s); nothing saved. The watch scenario's "
                    "fixed 10,000-watcher runs stay full size" % ", ".join("%s=%s" % kv for kv in SMALL.items()))
    ap.add_argument("--duration", type=int, default=FULL["duration"])
    ap.add_argument("--pods", type=int, default=FULL["pods"])
    ap.add_argument("--watchers", default=FULL["watchers"], help="watch fan-out: watcher counts")
    ap.add_argument("--idle", type=int, default=FULL["idle"], help="watch fan-out: idle watchers")
    ap.add_argument("--idle-conns", type=int, default=FULL["idle_conns"], help="idle-tls: connections held")
    ap.add_argument("--slowloris", type=int, default=FULL["slowloris"], help="slowloris: connections")
    ap.add_argument("--flood", type=int, default=FULL["flood"], help="slowloris: flood connections")
    ap.add_argument("--max-connections", type=int, default=FULL["max_connections"],
                    help="slowloris: kwc --max-connections during the flood")
    ap.add_argument("--header-timeout", type=int, default=FULL["header_timeout"],
                    help="slowloris: kwc --request-header-timeout (seconds)")
    ap.add_argument("--auth-watchers", type=int, default=FULL["auth_watchers"],
                    help="auth: watchers (each its own token) in the 100 ev/s fan-out")
    ap.add_argument("--auth-kubelet", type=int, default=FULL["auth_kubelet"],
                    help="auth: node-pinned watchers (each its own token) over --pods pods at 500 ev/s (0: skip)")
    ap.add_argument("--auth-burst", type=int, default=FULL["auth_burst"],
                    help="auth: distinct identities in the cold burst")
    ap.add_argument("--pb-kubelet", type=int, default=FULL["pb_kubelet"],
                    help="protobuf: node-pinned watchers in the kubelet pattern, each encoding")
    ap.add_argument("--h2-watchers", type=int, default=FULL["h2_watchers"],
                    help="http2: watch streams, over --h2-conns HTTP/2 connections vs one HTTP/1.1 connection each")
    ap.add_argument("--h2-conns", type=int, default=FULL["h2_conns"],
                    help="http2: HTTP/2 connections the watch streams are spread over")
    ap.add_argument("--h2-rate", type=int, default=FULL["h2_rate"], help="http2: events/s (1 KiB) in the fan-out")
    ap.add_argument("--h2-get-seconds", type=int, default=FULL["h2_get_seconds"],
                    help="http2: seconds per GET cell (wrk or h2load)")
    ap.add_argument("--h2-get-conns", default=FULL["h2_get_conns"], help="http2: GET connection counts")
    ap.add_argument("--tls-cost-from", metavar="JSON", default=None,
                    help="tls-cost: no measuring; the tables, the PNG and the targets again from the results file "
                         "a run printed (saved to bench/results/ when that run was the full one)")
    ap.add_argument("--tls-shim", action="store_true",
                    help="validation only: 'after, TLS' is the plaintext kwc behind bench/tlsshim.py (a Python TLS "
                         "relay), to exercise the TLS clients before kwc has TLS; nothing saved")
    ap.add_argument("--attack-label", default="run",
                    help="attack: the name of this run's section in bench/results/attack.md (e.g. before, after)")
    ap.add_argument("--attack-save", action="store_true",
                    help="attack: save to bench/results/attack.md even at --small or other sizes")
    ap.add_argument("--cm-duration", type=int, default=FULL["cm_duration"],
                    help="controller-manager: seconds of the replay per variant")
    ap.add_argument("--cm-pods", type=int, default=FULL["cm_pods"], help="controller-manager: pods in apisim")
    ap.add_argument("--cm-label", default="",
                    help="controller-manager: the name of this run's section in bench/results/controller-manager.md")
    ap.add_argument("--cm-all-metadata", action="store_true",
                    help="controller-manager: every informer metadata-only (not what KCM 1.24 does; nothing saved)")
    ap.add_argument("--kwc-args", default="",
                    help="cores: more kwc arguments for every kwc started (one string, split like a shell's)")
    ap.add_argument("--cores-loops", default="1,2",
                    help="cores: --serving-threads values, run where a binary's --help lists the flag")
    ap.add_argument("--cores-pods", type=int, default=FULL["cores_pods"], help="cores: pods in the gzip'd lists")
    ap.add_argument("--cores-storm", type=int, default=FULL["cores_storm"],
                    help="cores: TLS clients in the reconnect storm")
    ap.add_argument("--cores-fanout", default=FULL["cores_fanout"],
                    help="cores: HTTP/2 TLS fan-outs at 50 events/s, CONNSxSTREAMS each")
    ap.add_argument("--cores-compare", type=int, default=FULL["cores_compare"],
                    help="cores: watchers at 50 events/s over HTTP/2 (100 connections) and HTTP/1.1, TLS "
                         "(4,000: 200,000 deliveries/s; 0: skip)")
    ap.add_argument("--h2page-requests", type=int, default=FULL["h2page_requests"],
                    help="h2page: requests per run (h2load -n)")
    args = ap.parse_args()
    if args.baseline_commit is None:
        args.baseline_commit = {"http2": H2_BASELINE, "tls-cost": TLS_COST_BASELINE,
                                "cores": CORES_BASELINE,
                                "tls-cipher": TLS_CIPHER_BASELINE,
                                "h2page": H2PAGE_BASELINE}.get(args.only, "8af2294")
    if args.small:
        for k, v in SMALL.items():
            setattr(args, k, v)
    SAVE = all(getattr(args, k) == v for k, v in FULL.items()) and not args.tls_shim and not args.cm_all_metadata
    NOTE = "'after, TLS' is the plaintext kwc behind bench/tlsshim.py: validation only" if args.tls_shim else \
        "sizes below the full run"
    args.kwc = os.path.abspath(args.kwc)
    args.bin = os.path.abspath(args.bin)
    if args.tls_cost_from:
        import json
        with open(args.tls_cost_from) as f:
            data = json.load(f)
        SAVE, NOTE = data["save"], "the run's sizes were below the full run's"
        tls_cost_report(data)
        return
    names = args.only.split(",")
    for name in names:
        if "bench_" + name.replace("-", "_") not in globals():
            ap.error("unknown scenario %s (known: %s)" % (name, SCENARIOS))
    tools = {"fanout"} if {"watch", "watch-tls", "idle-tls", "auth", "protobuf", "metrics", "rooms",
                           "http2", "tls-cost", "serve-more", "cores", "tls-cipher"} & set(names) else set()
    tools |= {"ingest"} if "cache" in names else set()
    tools |= {"crcbench"} if "integrity" in names else set()
    missing = [t for t in sorted(tools) if not os.path.exists(os.path.join(args.bin, t))]
    absent = [t for t in ("h2load", "wrk") if "http2" in names and not shutil.which(t)]
    absent += [t for t in ("h2load",) if {"cores", "h2page"} & set(names) and not shutil.which(t) and t not in absent]
    if absent:
        ap.error("%s not installed (tests/lib/deps.sh bench installs them)" % ", ".join(absent))
    if missing:
        ap.error("%s not built in %s (make bench builds them, or make %s)" % (
            ", ".join(missing), args.bin, " ".join("build/bench/" + t for t in missing)))
    if NEEDS_BASELINE & set(names):
        args.baseline_kwc = os.path.abspath(args.baseline_kwc or build_baseline(args.baseline_commit))
        print("before: %s\nafter:  %s" % (args.baseline_kwc, args.kwc), flush=True)
    try:
        for name in names:
            globals()["bench_" + name.replace("-", "_")](args)
    finally:
        if getattr(args, "tls", None):
            subprocess.run(["rm", "-rf", os.path.dirname(args.tls["ca"])])


if __name__ == "__main__":
    main()
