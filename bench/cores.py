"""bench/run.py --only cores (issue 32, part 5): where kwc's CPU goes, thread
by thread, under the loads that matter most, BEFORE (--before-bin, or a kwc
built from --baseline-commit, default the commit issue 32 started from) and
AFTER (--kwc) side by side in ABBA order. Each run is a fresh kwc serving TLS
(--auth none: TLS alone, as the transport scenarios) in front of one apisim
(tests/apisim), the load generators on the same machine:

  lists   gzip'd RV=0 lists of --cores-pods pods (apisim's own ~3 KiB pod)
          by 4 clients, each one list at a time (h2load -c 4 -m 1,
          Accept-Encoding: gzip, bodies never decoded), over HTTP/1.1 (--h1)
          and HTTP/2 (ALPN h2), 2 x --duration s after a 1 s warm-up:
          lists/s, GB/s of the uncompressed list, p99 per list.
  fan-out HTTP/2 watch streams over TLS (bench/fanout.c --tls
          --h2-streams-per-conn), CONNSxSTREAMS per --cores-fanout, 1 KiB pod
          updates at 50/s (apisim's churn in namespace fan), started once
          every stream has its head, --duration s measured after a 2 s
          warm-up: deliveries/s, p50/p99 event write to receipt. Then
          --cores-compare watchers (4,000 x 50/s = 200,000 deliveries/s) over
          HTTP/2 (100 connections) and over HTTP/1.1 (one TLS connection each)
          in the same run: the issue's "p99 H2 <= H1".
  storm   --cores-storm TLS clients opened as fast as fanout opens them
          (10 connections per 2 ms per loop, 2 loops), each: handshake (full,
          no resumption, ALPN h2), an RV=0 list of namespace storm (10 pods),
          then a watch from the list's rv (fanout --list): the time until
          every client had its watch head, and per client (connect() to watch
          head) p50/p99/max.

For each cell: kwc's CPU per thread from /proc/PID/task/*/stat (utime +
stime over the measured window, and the time it was runnable but waited for
a CPU from /proc/PID/task/*/schedstat: on a shared machine, what others took;
by the thread's comm: "kwc" is the main
loop, tid == pid; "kwc-watch/N" a watch worker, named since issue 32; an
older binary's workers show as "kwc" with another tid) and the busiest
thread's share of kwc's whole CPU (issue 32's target: no thread above 60 %).

--serving-threads N (issue 32) is passed where a binary's --help lists it,
each --cores-loops value a server of its own (before, 1 loop, 2 loops, then
back); --kwc-args adds arguments to every kwc. Each server's two runs are
averaged in the summary; every run is printed. bench/results/cores.md at
the full sizes. ~10 minutes (six servers: ~15); --small in ~2.
"""
import json
import os
import shlex
import threading
import time

FAN_NS, STORM_NS = "fan", "storm"
COMPARE_CONNS = 100  # HTTP/2 connections the --cores-compare watchers share
RATE = 50  # events/s
DRAIN = 5  # fanout --drain: seconds a fan-out may read on after its window


def thread_cpu(pid):
    """{tid: (comm, CPU seconds, seconds runnable but waiting for a CPU)} of
    every thread of pid now (the wait from /proc/.../schedstat: on a shared
    machine it says how much of a thread's time others took)."""
    out = {}
    tck = os.sysconf("SC_CLK_TCK")
    d = "/proc/%d/task" % pid
    for tid in os.listdir(d):
        try:
            with open("%s/%s/stat" % (d, tid)) as f:
                s = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        comm = s[s.index("(") + 1:s.rindex(")")]
        fields = s.rsplit(")", 1)[1].split()
        try:
            with open("%s/%s/schedstat" % (d, tid)) as f:
                wait = int(f.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            wait = 0.0
        out[int(tid)] = (comm, (int(fields[11]) + int(fields[12])) / tck, wait)
    return out


class Window:
    """Per-thread CPU of pid between start() and stop()."""

    def __init__(self, pid):
        self.pid, self.a, self.b, self.t0, self.t1 = pid, None, None, None, None

    def start(self):
        self.a, self.t0 = thread_cpu(self.pid), time.monotonic()

    def stop(self):
        if self.b is None:
            self.b, self.t1 = thread_cpu(self.pid), time.monotonic()

    def result(self):
        """{"wall": s, "total": share of one core, "threads": [[name, share of one core, share of the window
        waiting for a CPU], ...] busiest first, "busiest": its share of kwc's total}"""
        if self.a is None or self.b is None:
            return None
        wall = max(self.t1 - self.t0, 1e-6)
        rows = []
        for tid, (comm, c1, w1) in self.b.items():
            _, c0, w0 = self.a.get(tid, (comm, 0.0, 0.0))
            name = comm + (" (main)" if tid == self.pid else " [%d]" % tid if comm == "kwc" else "")
            rows.append([name, (c1 - c0) / wall, (w1 - w0) / wall])
        rows.sort(key=lambda r: -r[1])
        total = sum(r[1] for r in rows)
        return {"wall": wall, "total": total, "threads": rows, "busiest": rows[0][1] / total if total else 0}


def cpu_text(w):
    if not w:
        return "-"
    shown = [r for r in w["threads"] if r[1] >= 0.005][:4]
    return ", ".join("%s %.0f%% (waited %.0f%%)" % (n, 100 * c, 100 * q) for n, c, q in shown) or "idle"


def busiest_text(w):
    return "%.0f%% (%s)" % (100 * w["busiest"], w["threads"][0][0]) if w and w["total"] else "-"


def lists(run, args, k, raw, proto):
    """One list cell: h2load -c 4 -m 1 over HTTP/1.1 or HTTP/2 (TLS)."""
    w = Window(k.pid)
    run.settle(k.pid)
    extra = ["-H", "accept-encoding: gzip"] + (["--h1"] if proto == "HTTP/1.1" else [])
    r = run.h2load(k.port, "/api/v1/pods?resourceVersion=0", 4, 1, 2 * args.duration, tls=True, warmup=1,
                   pid=k.pid, extra=extra, on_phase=lambda ph: w.start() if ph == "start" else w.stop())
    rps, p99, bad, proto_got = r[0], r[2], r[3] + r[4], r[6]
    return {"kind": "lists", "proto": proto, "got_proto": proto_got, "lists_s": rps, "gb_s": rps * raw / 1e9,
            "p99_ms": p99, "errors": bad, "cpu": w.result()}


def fan_out(run, args, env, k, conns, per, h1=False):
    """One fan-out cell: conns x per streams (HTTP/2), or conns HTTP/1.1
    streams when h1; RATE events/s of ~1 KiB pods in FAN_NS."""
    w = Window(k.pid)
    run.settle(k.pid)
    n = conns * per
    path = "/api/v1/namespaces/%s/pods?watch=1&resourceVersion=%d&timeoutSeconds=900" % (FAN_NS, env.stats()["rv"])
    p = run.fanout(args, k.port, n, tls=True, h2=0 if h1 else per, path=path, deadline=120, announce_heads=True,
                   drain=DRAIN, warmup=1 if args.small else 2)
    timer = threading.Timer(args.duration, w.stop)

    def window():
        w.start()
        timer.start()
    try:
        first = json.loads(run.read_line(p, 300))
        if "heads" in first:
            env.sim("POST", "/apisim/churn", {"rate": RATE, "resources": ["pods"], "mix": {"update": 1.0},
                                              "namespace": FAN_NS})
            r = run.fanout_measure(p, k.pid, timeout=args.duration + DRAIN + 120, on_measuring=window)
        else:  # the deadline passed before every stream had its head
            r = dict(first, per_s=0, p50_ms=0, p99_ms=0)
            p.wait()
    finally:
        timer.cancel()
        if timer.is_alive():
            timer.join()
        if w.a is not None:  # fanout ended first (this process read its lines late): the window ends here
            w.stop()
        env.sim("POST", "/apisim/churn", {"rate": 0})
        if p.poll() is None:
            p.kill()
            p.wait()
    return {"kind": "fanout", "proto": "HTTP/1.1" if h1 else "HTTP/2", "conns": conns if not h1 else n,
            "streams": r.get("streams", 0), "asked_s": n * RATE, "per_s": r.get("per_s", 0),
            "p50_ms": r.get("p50_ms", 0), "p99_ms": r.get("p99_ms", 0), "lost": r.get("lost", 0),
            "unanswered": r.get("unanswered", 0), "client_cpu": r.get("client_cpu", 0), "cpu": w.result()}


def storm(run, args, env, k):
    """--cores-storm TLS clients: handshake, list, watch head each."""
    w = Window(k.pid)
    run.settle(k.pid)
    rv = env.stats()["rv"]
    argv = [os.path.join(args.bin, "fanout"), "--port", str(k.port), "--watchers", str(args.cores_storm),
            "--tls", "--cacert", run.certs(args)["ca"], "--h2-streams-per-conn", "1", "--threads", "2",
            "--list", "/api/v1/namespaces/%s/pods?resourceVersion=0" % STORM_NS, "--idle", "--deadline", "120",
            "--path", "/api/v1/namespaces/%s/pods?watch=1&resourceVersion=%d&timeoutSeconds=900" % (STORM_NS, rv)]
    import subprocess
    w.start()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        r = json.loads(run.read_line(p, 300))
        w.stop()
    finally:
        p.kill()
        p.wait()
    return {"kind": "storm", "clients": r.get("clients", 0), "asked": args.cores_storm,
            "seconds": r.get("heads_ms", 0) / 1000, "p50_ms": r.get("client_p50_ms", 0),
            "p99_ms": r.get("client_p99_ms", 0), "max_ms": r.get("client_max_ms", 0),
            "errors": r.get("list_non2xx", 0) + r.get("tls_failures", 0) + r.get("non2xx", 0) +
            r.get("unanswered", 0), "cpu": w.result()}


def one_run(run, args, env, server, raw):
    """Every cell against a fresh kwc of server (label, binary, loops or None)."""
    label, binary, loops = server
    v = run.Variant(label, binary, True)
    flags = (("--serving-threads", loops),) if loops else ()
    base = ("--resources", "v1/pods", "--log-level", "warn") + tuple(shlex.split(args.kwc_args))
    n_max = max([c * p for c, p in fanouts(args)] + [args.cores_compare, args.cores_storm])
    k = run.Kwc(args, env, v, "cores-%s-%d" % (label.split()[0], int(time.time() * 1000) % 100000), flags=flags,
                base=base, optional=(("--max-connections", n_max + 1000),
                                     ("--http2-max-streams-per-connection", 100)))
    cells = []
    try:
        if "bytes" not in raw:  # the uncompressed list, once: its size turns lists/s into GB/s
            st, body = k.get("/api/v1/pods?resourceVersion=0", timeout=120)
            if st != 200:
                raise RuntimeError("the identity list answered %d" % st)
            raw["bytes"] = len(body)
            print("uncompressed list: %d bytes" % raw["bytes"], flush=True)
        for proto in ("HTTP/1.1", "HTTP/2"):
            cells.append(lists(run, args, k, raw["bytes"], proto))
            report(label, cells[-1])
        for conns, per in fanouts(args):
            cells.append(fan_out(run, args, env, k, conns, per))
            report(label, cells[-1])
        if args.cores_compare:
            per = -(-args.cores_compare // COMPARE_CONNS)
            cells.append(fan_out(run, args, env, k, COMPARE_CONNS, per))
            report(label, cells[-1])
            cells.append(fan_out(run, args, env, k, args.cores_compare, 1, h1=True))
            report(label, cells[-1])
        cells.append(storm(run, args, env, k))
        report(label, cells[-1])
    finally:
        k.stop()
    return cells


def fanouts(args):
    return [tuple(int(x) for x in f.split("x")) for f in args.cores_fanout.split(",") if f]


def report(label, c):
    c["load"] = os.getloadavg()[0]  # the machine is shared: how busy it was as the cell ended
    print(json.dumps({"server": label, **{x: (round(v, 3) if isinstance(v, float) else v)
                                          for x, v in c.items() if x != "cpu"},
                      "kwc_cpu": cpu_text(c["cpu"]), "busiest": busiest_text(c["cpu"])}), flush=True)


def cell_name(c):
    if c["kind"] == "lists":
        return "gzip lists, %s" % c["proto"]
    if c["kind"] == "fanout":
        if c["proto"] == "HTTP/1.1":
            return "fan-out HTTP/1.1 %d conns" % c["conns"]
        return "fan-out HTTP/2 %dx%d" % (c["conns"], c["streams"] // max(c["conns"], 1))
    return "storm %d clients" % c["asked"]


def result_text(c):
    if c["kind"] == "lists":
        return "%.2f lists/s, %.2f GB/s, p99 %.0f ms%s%s" % (
            c["lists_s"], c["gb_s"], c["p99_ms"], "" if c["errors"] == 0 else ", %d errors" % c["errors"],
            "" if c["got_proto"] in ("h2", "http/1.1") else " (%s)" % c["got_proto"])
    if c["kind"] == "fanout":
        return "%d streams, %.0f of %d deliveries/s, p50/p99 %.0f / %.0f ms, fanout CPU %.0f%%%s" % (
            c["streams"], c["per_s"], c["asked_s"], c["p50_ms"], c["p99_ms"], 100 * c["client_cpu"],
            ", %d unanswered" % c["unanswered"] if c["unanswered"] else "")
    return "%d of %d clients in %.1f s (%.0f/s), per client p50/p99/max %.0f / %.0f / %.0f ms%s" % (
        c["clients"], c["asked"], c["seconds"], c["clients"] / c["seconds"] if c["seconds"] else 0, c["p50_ms"],
        c["p99_ms"], c["max_ms"], ", %d errors" % c["errors"] if c["errors"] else "")


def mean(vals):
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else 0


def summary_rows(runs):
    """One row per (cell, server): each server's runs averaged."""
    by = {}
    for label, cells in runs:
        for c in cells:
            by.setdefault((cell_name(c), label), []).append(c)
    rows = []
    for (name, label), cs in by.items():
        if cs[0]["kind"] == "lists":
            res = "%.2f lists/s, %.2f GB/s, p99 %.0f ms" % (mean([c["lists_s"] for c in cs]),
                                                           mean([c["gb_s"] for c in cs]),
                                                           mean([c["p99_ms"] for c in cs]))
        elif cs[0]["kind"] == "fanout":
            res = "%.0f of %d deliveries/s, p99 %.0f ms" % (mean([c["per_s"] for c in cs]), cs[0]["asked_s"],
                                                            mean([c["p99_ms"] for c in cs]))
        else:
            res = "%.1f s, p99 %.0f ms per client" % (mean([c["seconds"] for c in cs]),
                                                      mean([c["p99_ms"] for c in cs]))
        ws = [c["cpu"] for c in cs if c["cpu"]]
        rows.append([name, label, len(cs), res, "%.0f%%" % (100 * mean([w["total"] for w in ws])),
                     "%.0f%%" % (100 * mean([w["busiest"] for w in ws])),
                     "%.0f%%" % (100 * mean([w["threads"][0][2] for w in ws if w["threads"]]))])
    rows.sort(key=lambda r: r[0])
    return rows


def version(binary):
    """A before binary's name in the tables: the commit it was built from
    (build/baseline/<sha>/, run.build_baseline), else its path."""
    import re
    m = re.search(r"/baseline/([0-9a-f]{40})/", binary)
    return m.group(1)[:7] if m else binary


def bench_cores(args, run):
    """See the module's docstring."""
    servers = [("before (%s)" % version(args.baseline_kwc), args.baseline_kwc, None)]
    loops = [int(x) for x in args.cores_loops.split(",") if x]
    if not run.missing_flags(args.kwc, ["--serving-threads"]) and loops:
        servers += [("after, %d loop%s" % (n, "s" if n > 1 else ""), args.kwc, n) for n in loops]
    else:
        servers.append(("after", args.kwc, None))
    order = servers + servers[::-1]
    env = run.seeded_env(args, args.cores_pods, 0)
    t_start = time.monotonic()
    try:
        env.sim("POST", "/apisim/seed", {"resource": "pods", "count": 1000, "namespace": FAN_NS, "size": 1000})
        env.sim("POST", "/apisim/seed", {"resource": "pods", "count": 10, "namespace": STORM_NS})
        runs, raw = [], {}
        for server in order:
            runs.append((server[0], one_run(run, args, env, server, raw)))
    finally:
        env.close()
    minutes = (time.monotonic() - t_start) / 60
    rows = []
    for i, (label, cells) in enumerate(runs):
        for c in cells:
            rows.append([i + 1, label, cell_name(c), result_text(c), "%.0f%%" % (100 * c["cpu"]["total"])
                         if c["cpu"] else "-", busiest_text(c["cpu"]), cpu_text(c["cpu"]), "%.1f" % c["load"]])
    what = ("kwc over TLS (--auth none) on apisim; %d pods (~3 KiB) in the lists, 1 KiB pod updates at %d/s "
            "in the fan-outs; load generators beside kwc on %d CPUs; %.0f minutes" % (
                args.cores_pods, RATE, os.cpu_count() or 0, minutes))
    text = run.table("Every core serves (issue 32): each server's runs averaged (ABBA); %s" % what,
                     ["cell", "server", "runs", "result", "kwc CPU (of one core)", "busiest thread's share",
                      "busiest thread waiting for a CPU"],
                     summary_rows(runs))
    text += "\n" + run.table("Every run, in order: kwc CPU per thread (share of one core over the measured window)",
                             ["run", "server", "cell", "result", "kwc CPU", "busiest thread's share",
                              "threads, busiest first: CPU (time waiting for a CPU)", "load avg"], rows)
    full = all(getattr(args, k) == run.FULL[k] for k in ("cores_pods", "cores_storm", "cores_fanout",
                                                         "cores_compare", "duration"))
    if full and not args.small:
        os.makedirs(run.RESULTS, exist_ok=True)
        with open(os.path.join(run.RESULTS, "cores.md"), "a") as f:
            f.write(text + "\n")
        print(text)
    else:
        print(text)
        print("(not saved to bench/results/cores.md: sizes below the full run)\n")
