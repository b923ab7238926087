#!/usr/bin/env python3
"""kwc benchmarks. Each scenario runs kwc and its baseline side by side in one
run, prints a table and appends it to bench/results/<scenario>.md.

  bench/run.py --kwc build/kwc [--only passthrough,large] [--duration 5]

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
"""
import argparse
import datetime
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))
from cluster import Env, http_request, wait_for  # noqa: E402

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


def curl_lists(port, path, conc, per_client):
    """conc curl processes, each reading per_client lists in sequence. Returns
    (wall seconds, total bytes, [seconds per list])."""
    url = "http://127.0.0.1:%d%s" % (port, path)
    cmd = ["curl", "-s", "-A", "kwc-bench", "-H", "Accept: application/json",
           "-w", "%{http_code} %{time_total} %{size_download}\n"]
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
                "127.0.0.1:%d" % port, "--data-dir", os.path.join(env.dir, "data"), "--resources", "v1/pods"]
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


def fanout(args, port, n, seconds=None, path=None, etcd_prefix=None, nodes=0, idle=False):
    argv = [os.path.join(args.bin, "fanout"), "--port", str(port), "--watchers", str(n),
            "--seconds", str(seconds or args.duration), "--warmup", "2"]
    argv += ["--etcd-prefix", etcd_prefix] if etcd_prefix else ["--path", path]
    if nodes:
        argv += ["--nodes", str(nodes)]
    if idle:
        argv.append("--idle")
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


def fanout_measure(p, server_pid, timeout=600):
    """Reads fanout's lines: the server's CPU (share of one core) and RSS over
    the measuring window, and the result."""
    import json
    deadline = time.monotonic() + timeout
    c0 = t0 = None
    while True:
        r = json.loads(read_line(p, deadline - time.monotonic()))
        if "measuring" in r:
            c0, t0 = cpu_seconds(server_pid), time.monotonic()
            continue
        cpu = (cpu_seconds(server_pid) - c0) / (time.monotonic() - t0) if c0 is not None else 0
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
        # the two points with every server, then 10,000 at half the
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
                    env.sim("POST", "/apisim/churn", {"rate": rate, "resources": ["pods"], "mix": {"update": 1.0}})
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
            env.sim("POST", "/apisim/churn", {"rate": rate, "resources": ["pods"], "mix": {"update": 1.0}})
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


def plot_fanout(points):
    """PNG: p50/p99 write-to-receipt latency vs watchers, per server (gnuplot)."""
    servers = []
    for s, *_ in points:
        if s not in servers:
            servers.append(s)
    data = os.path.join(RESULTS, "watch-latency.dat")
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
set title 'Watch fan-out: 1 KiB events at 100/s, write-to-receipt latency'
set xlabel 'watchers'
set ylabel 'ms (log)'
set logscale xy
set key left top
plot %s
""" % (os.path.join(RESULTS, "watch-latency.png"), ", ".join(plots))
    subprocess.run(["gnuplot"], input=script, text=True, check=False)


def plot_latency(points):
    """PNG: list latency vs listers, direct vs kwc (gnuplot)."""
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kwc", required=True)
    ap.add_argument("--bin", default=None)
    ap.add_argument("--only", default="passthrough,large,cache,watch")
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--pods", type=int, default=150000)
    ap.add_argument("--watchers", default="1000,10000", help="watch fan-out: watcher counts")
    ap.add_argument("--idle", type=int, default=15000, help="watch fan-out: idle watchers")
    args = ap.parse_args()
    args.kwc = os.path.abspath(args.kwc)
    for name in args.only.split(","):
        globals()["bench_" + name](args)


if __name__ == "__main__":
    main()
