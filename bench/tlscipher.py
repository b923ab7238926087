#!/usr/bin/python3
"""The `tls-cipher` bench scenario (issue 32, part 4): what TLS adds to
kwc's CPU, measured against what AES-GCM itself costs for the same bytes on
this machine in the same run.

    bench/run.py --only tls-cipher [--baseline-commit C] [--small]

Four kwcs side by side on one apisim: BEFORE (--baseline-commit; default for
--only tls-cipher: the commit this branch started from) and AFTER (--kwc),
each plaintext and TLS (--auth none, HTTP/1.1: fanout.c offers no ALPN),
in the order before, before TLS, after, after TLS, then back (ABBA). Each
point:

  - watch fan-out of 1 KiB and 4 KiB objects: 1,000 watchers of
    configmaps at 100 updates/s (fanout.c, the events started once every
    stream has its head, the window after a warm-up), kwc CPU per delivery.
    ConfigMaps, not pods: apisim's smallest pod is ~3 KiB, a configmap is
    padded to the size asked. Every kwc runs with
    --watch-coalesce-max-delay 0: a busy worker holding events so that one
    record carries several (include/kwc/pace.h) depends on how busy the
    machine is, and TLS, which costs more per round, would hold more than
    plaintext; without the hold each delivery is one record of its own
    bytes while kwc keeps up, the cost the cipher's figure is for;
  - cached RV=0 lists of --pods pods of ~4 KiB, 1 curl lister x 3 lists
    over HTTP/1.1 (TLS also over HTTP/2, for reference): kwc CPU per GB.

"TLS adds" is a TLS row's CPU minus its plaintext row's (same build, same
point). The cipher: `openssl speed -evp aes-256-gcm` (the issue's yardstick)
and aes-128-gcm (the suite kwc and these clients negotiate: Go's order puts
it first) at the bytes one delivery carries (the event as fanout receives
it, chunk framing included: one record per delivery when nothing is
coalesced) and at 16 KiB (a list's records), measured three times in the
run (before, between and after the parts; the median). Target: TLS adds at
most 1.5x the aes-256-gcm cost of the same bytes.

R is run.py's module (its helpers: Kwc, Variant, certs, curl_lists...).
"""
import json
import os
import re
import statistics
import subprocess
import sys
import time

BASELINE = None  # the commit this branch started from (run.py's default: main's merge-base)
FULL = {"watchers": 1000, "rate": 100, "sizes": (1000, 4000), "pods": 20000, "lists": 3}
SMALL = {"watchers": 200, "rate": 100, "sizes": (1000, 4000), "pods": 5000, "lists": 2}
TARGET = 1.5
CIPHERS = ("aes-256-gcm", "aes-128-gcm")


def speed_us(cipher, nbytes, seconds=1):
    """µs per seal of nbytes with openssl speed -evp (its own loop: one
    EVP_EncryptUpdate per block on an initialised context)."""
    for _ in range(3):  # a loaded machine now and then gives "infk" (a zero-length timing): again
        out = subprocess.run(["openssl", "speed", "-seconds", str(seconds), "-bytes", str(nbytes), "-evp", cipher],
                             capture_output=True, text=True, timeout=120).stdout
        m = re.search(r"^%s\s+([\d.]+)k\s*$" % re.escape(cipher.upper()), out, re.M)
        if m and float(m.group(1)) > 0:
            return nbytes / (float(m.group(1)) * 1000) * 1e6
    raise RuntimeError("openssl speed %s %d: no figure in %r" % (cipher, nbytes, out[-300:]))


def event_bytes(R, env):
    """Bytes one watch delivery carries on the wire before TLS: the event
    JSON of one of env's configmaps, its newline and the chunk framing."""
    obj = env.sim("GET", "/api/v1/configmaps?limit=1")["items"][0]
    ev = len(json.dumps({"type": "MODIFIED", "object": obj}, separators=(",", ":"))) + 1
    return ev + len("%x\r\n" % ev) + 2


def bench_tls_cipher(args, R):
    cfg = SMALL if args.small else FULL
    short = R.git("rev-parse", "--short", args.baseline_commit)
    BL, BTL, AL, ATL = "before (%s)" % short, "before (%s), TLS" % short, "after", "after, TLS"
    B, BT = R.Variant(BL, args.baseline_kwc, False), R.Variant(BTL, args.baseline_kwc, True)
    A, AT = R.Variant(AL, args.kwc, False), R.Variant(ATL, args.kwc, True)
    order = [B, BT, A, AT, AT, A, BT, B]
    tag = {BL: "b", BTL: "bt", AL: "a", ATL: "at"}
    data = {"short": short, "cfg": cfg, "started": time.strftime("%Y-%m-%d %H:%M"), "runs": [], "lists": [],
            "speed": [], "event_bytes": {}}
    t0 = time.monotonic()
    args.duration = getattr(args, "duration", 5)

    def speeds(sizes):
        for c in CIPHERS:
            for n in sorted(set(sizes) | {16384}):
                data["speed"].append({"cipher": c, "bytes": n, "us": speed_us(c, n)})

    def start(env, part, resource="v1/pods"):
        servers = {}
        for v in (B, BT, A, AT):
            try:
                servers[v.label] = R.Kwc(args, env, v, "tlscipher-%s-%s" % (part, tag[v.label]),
                                         base=("--resources", resource, "--log-level", "warn"),
                                         optional=(("--max-connections", cfg["watchers"] + 1000),
                                                   ("--protobuf-resources", "none"),
                                                   ("--watch-coalesce-max-delay", "0")))
            except R.Unavailable as e:
                print("%s %s: %s" % (part, v.label, e), file=sys.stderr, flush=True)
        return servers

    sizes = []
    try:
        for size in cfg["sizes"]:
            env = R.Env(apisim_args=["--pods", "0", "--nodes", "10", "--history", "1000000"], start_kwc=False)
            servers = {}
            try:
                env.sim("POST", "/apisim/seed", {"resource": "configmaps", "count": 2000, "namespaces": 10,
                                                 "size": size})
                nb = event_bytes(R, env)
                data["event_bytes"][str(size)] = nb
                sizes.append(nb)
                if len(sizes) == 1:
                    speeds([nb])
                servers = start(env, "w%d" % size, "v1/configmaps")
                for v in order:
                    k = servers.get(v.label)
                    if not k:
                        continue
                    try:
                        r = R.tls_cost_watch(args, env, k, cfg["watchers"], cfg["rate"], v.tls,
                                             resource="configmaps")
                    except RuntimeError as e:
                        print("watch %d %s: %s" % (size, v.label, e), file=sys.stderr, flush=True)
                        continue
                    rec = {"size": size, "server": v.label, "us": r["us"], "per_s": r["per_s"],
                           "p99_ms": r["p99_ms"], "lost": r.get("lost", 0), "cpu": r["cpu"]}
                    data["runs"].append(rec)
                    print(json.dumps(rec), flush=True)
            finally:
                R.stop_all(servers)
                env.close()
        speeds(sizes)
        env = R.seeded_env(args, cfg["pods"], 4096)
        servers = {}
        try:
            servers = start(env, "list")
            for v in order:
                k = servers.get(v.label)
                if not k:
                    continue
                for proto in (("--http1.1", "--http2") if v.tls else ("--http1.1",)):
                    R.settle(k.pid)
                    c0 = R.cpu_seconds(k.pid)
                    try:
                        wall, nbytes, _ = R.curl_lists(k.port, "/api/v1/pods?resourceVersion=0", 1, cfg["lists"],
                                                       R.certs(args)["ca"] if v.tls else None, extra=(proto,))
                    except (RuntimeError, subprocess.TimeoutExpired) as e:
                        print("list %s: %s" % (v.label, e), file=sys.stderr, flush=True)
                        continue
                    cpu = R.cpu_seconds(k.pid) - c0
                    rec = {"server": v.label + (" (HTTP/2)" if proto == "--http2" else ""),
                           "s_gb": cpu / (nbytes / 1e9), "gbs": nbytes / wall / 1e9}
                    data["lists"].append(rec)
                    print(json.dumps(rec), flush=True)
        finally:
            R.stop_all(servers)
            env.close()
        speeds(sizes)
    finally:
        data["minutes"] = (time.monotonic() - t0) / 60
        dump = os.path.join(R.tempfile.gettempdir(), "kwc-tls-cipher-%d.json" % os.getpid())
        with open(dump, "w") as f:
            json.dump(data, f, indent=1)
        print("results: %s" % dump, flush=True)
    report(R, data, (BL, BTL, AL, ATL))


def report(R, data, labels):
    BL, BTL, AL, ATL = labels
    cfg = data["cfg"]

    def mean(rs, key):
        return statistics.mean(r[key] for r in rs) if rs else None

    def cell(rs, key, fmt):
        if not rs:
            return "-"
        return fmt % mean(rs, key) + (" (%s)" % " / ".join(fmt % r[key] for r in rs) if len(rs) > 1 else "")

    def seal(cipher, n):
        v = [s["us"] for s in data["speed"] if s["cipher"] == cipher and s["bytes"] == n]
        return statistics.median(v) if v else None

    out, targets = [], []
    rows = []
    for c in CIPHERS:
        for n in sorted({s["bytes"] for s in data["speed"]}):
            v = [s["us"] for s in data["speed"] if s["cipher"] == c and s["bytes"] == n]
            rows.append([c, n, "%.3f" % statistics.median(v), " / ".join("%.3f" % x for x in v),
                         "%.3f" % (statistics.median(v) / n * 1e9 / 1e6)])
    out.append(R.table("The cipher on this machine in this run: openssl speed -evp, µs per seal of the bytes one "
                       "delivery carries and of a full 16 KiB record (median of the runs before, between and after "
                       "the parts)", ["cipher", "bytes", "µs per seal", "runs", "s per GB"], rows))

    rows = []
    for size in cfg["sizes"]:
        nb = data["event_bytes"].get(str(size))
        rs = {lab: [r for r in data["runs"] if r["size"] == size and r["server"] == lab] for lab in labels}
        for lab in labels:
            rows.append(["%d x %d/s, %d B configmaps (%s B per delivery)" % (cfg["watchers"], cfg["rate"], size, nb), lab,
                         cell(rs[lab], "us", "%.2f"), cell(rs[lab], "per_s", "%.0f"), cell(rs[lab], "p99_ms", "%.0f"),
                         sum(r["lost"] for r in rs[lab])])
        for plain, tls, who in ((BL, BTL, "before"), (AL, ATL, "after")):
            p, t = mean(rs[plain], "us"), mean(rs[tls], "us")
            s256, s128 = seal("aes-256-gcm", nb), seal("aes-128-gcm", nb)
            if p is None or t is None or not s256:
                continue
            add = t - p
            targets.append(["TLS adds per %d B delivery (%s)" % (size, who),
                            "%.2f µs (%.2f - %.2f)" % (add, t, p), "%.2f µs (aes-128-gcm %.2f)" % (s256, s128),
                            "%.2fx" % (add / s256), "<= %.1fx" % TARGET, "PASS" if add / s256 <= TARGET else "MISS"])
    out.append(R.table("Watch fan-out over HTTP/1.1 (fanout.c), order %s; kwc CPU per delivery (mean, then each "
                       "run)" % " -> ".join([BL, BTL, AL, ATL, ATL, AL, BTL, BL]),
                       ["point", "server", "kwc µs/delivery", "deliveries/s", "p99 ms", "lost"], rows))

    rows = []
    for lab in (BL, BTL, BTL + " (HTTP/2)", AL, ATL, ATL + " (HTTP/2)"):
        rs = [r for r in data["lists"] if r["server"] == lab]
        rows.append([lab, cell(rs, "s_gb", "%.3f"), cell(rs, "gbs", "%.2f")])
    s256, s128 = seal("aes-256-gcm", 16384), seal("aes-128-gcm", 16384)
    for plain, tls, who in ((BL, BTL, "before"), (AL, ATL, "after"), (BL, BTL + " (HTTP/2)", "before, HTTP/2"),
                            (AL, ATL + " (HTTP/2)", "after, HTTP/2")):
        p = mean([r for r in data["lists"] if r["server"] == plain], "s_gb")
        t = mean([r for r in data["lists"] if r["server"] == tls], "s_gb")
        if p is None or t is None or not s256:
            continue
        gb256, gb128 = s256 / 16384 * 1e9 / 1e6, s128 / 16384 * 1e9 / 1e6
        add = t - p
        targets.append(["TLS adds per GB of cached list (%s)" % who, "%.3f s (%.3f - %.3f)" % (add, t, p),
                        "%.3f s (aes-128-gcm %.3f)" % (gb256, gb128), "%.2fx" % (add / gb256),
                        "<= %.1fx" % TARGET if "HTTP/2" not in who else "(HTTP/2: reference)",
                        ("PASS" if add / gb256 <= TARGET else "MISS") if "HTTP/2" not in who else "-"])
    out.append(R.table("Cached RV=0 list of %d pods (~4 KiB), 1 curl lister x %d lists, same order; kwc CPU s per "
                       "GB and GB/s (mean, then each run)" % (cfg["pods"], cfg["lists"]),
                       ["server", "kwc s/GB", "GB/s"], rows))
    out.insert(0, R.table("Issue 32 part 4 targets: what TLS adds to kwc's CPU against AES-256-GCM sealing the same "
                          "bytes (openssl speed, same run); before = %s, after = build/kwc, one run started %s "
                          "(%.0f min)" % (data["short"], data["started"], data.get("minutes", 0)),
                          ["what", "TLS adds (TLS - plaintext)", "aes-256-gcm seal of the same bytes", "ratio",
                           "target", "result"], targets))
    R.save("tls-cost", "\n".join(out))
