#!/usr/bin/python3
"""A replica's start-up, cold (empty data dir, as a Deployment's emptyDir
gives it) against warm (the data dir of the last run, as a StatefulSet's
volume or a node's hostPath gives it), and what each costs the upstream
(issue 31, part 8: the deploy decision in docs/deploy.md).

  bench/restart.py [--kwc build/kwc] [--pods 5000] [--nodes 100] [--per-kind 200]
                   [--churn 20] [--gap 5] [--save]

One apisim (--pods pods over --nodes nodes in 20 namespaces, --per-kind
objects of each other kind the informers read, pods churning at --churn
updates/s) and kwc in auto mode (its defaults: the protobuf caches of
--protobuf-resources start with it, every other cache at its first read),
upstream through a byte-counting TCP relay. The clients are informers: a
list at resourceVersion=0 of each of INFORMERS (JSON) through kwc, then a
watch from the list's resourceVersion (held open, drained). Per start:

  - exec to /readyz 200 (the kubelet's readiness probe) and to every
    informer's list answered (in auto mode a new cache's first list waits
    for its first sync);
  - kwc's LISTs upstream (apisim's request log: kwc's own GETs of a
    collection without watch=) and the bytes the upstream sent kwc through
    the relay from exec until every informer is watching and the caches
    have settled (--settle s);
  - kwc's RSS (VmRSS, RssAnon, RssFile) after start and with every informer
    watching.

Cold first; then SIGTERM, --gap s of churn with kwc down (a pod being
replaced), the warm start on the same data dir; then SIGTERM and a second
cold start on a fresh data dir, so each kind runs on the same apisim.
--save appends the table to bench/results/restart.md. ~1 minute at the
defaults on 2 cores.
"""
import argparse
import datetime
import json
import os
import shutil
import socket
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))
from cluster import ROOT, Env, Proc, http_connection, http_request, wait_for  # noqa: E402

# what a controller manager and node agents read (JSON here; kwc also runs
# the protobuf caches of --protobuf-resources from the start)
INFORMERS = ["/api/v1/pods", "/api/v1/nodes", "/api/v1/namespaces", "/api/v1/services", "/api/v1/configmaps",
             "/api/v1/secrets", "/api/v1/serviceaccounts", "/apis/discovery.k8s.io/v1/endpointslices",
             "/apis/apps/v1/deployments", "/apis/apps/v1/replicasets", "/apis/apps/v1/daemonsets",
             "/apis/apps/v1/statefulsets"]
SEEDED = ["configmaps", "secrets", "serviceaccounts", "services", "endpointslices.discovery.k8s.io/v1",
          "deployments", "replicasets", "daemonsets", "statefulsets"]
UA = "kwc-restart-bench"


class Relay:
    """127.0.0.1:port -> apisim, counting the bytes each way."""

    def __init__(self, target):
        self.target = target
        self.down = self.up = self.conns = 0
        self.lock = threading.Lock()
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(128)
        self.port = self.ls.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            s = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.conns += 1
            threading.Thread(target=self.pump, args=(c, s, "up"), daemon=True).start()
            threading.Thread(target=self.pump, args=(s, c, "down"), daemon=True).start()

    def pump(self, a, b, way):
        try:
            while True:
                d = a.recv(1 << 16)
                if not d:
                    break
                b.sendall(d)
                with self.lock:
                    setattr(self, way, getattr(self, way) + len(d))
        except OSError:
            pass
        finally:
            for x in (a, b):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def snapshot(self):
        with self.lock:
            return self.down, self.up, self.conns


def status_kib(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0])
    return out


def watch(port, path, rv, stop, last):
    """An informer's watch from rv, drained until stop is set; last[path]
    follows the resourceVersion of its events and bookmarks."""
    last[path] = rv
    c = http_connection(port, timeout=1)
    try:
        c.request("GET", "%s?watch=1&allowWatchBookmarks=true&resourceVersion=%s" % (path, rv),
                  headers={"User-Agent": UA, "Accept": "application/json"})
        r = c.getresponse()
        while not stop.is_set():
            try:
                line = r.readline()
            except socket.timeout:
                continue
            if not line:
                return
            ev = json.loads(line)
            if ev["type"] != "ERROR":
                last[path] = ev["object"]["metadata"]["resourceVersion"]
    except OSError:
        pass
    finally:
        c.close()


def resume(port, path, rv, out):
    """An informer's watch resumed on the new kwc from the last rv it saw:
    'ok' (events or nothing for 2 s: watching), 'expired' (kube's 410, as a
    status or an ERROR event: the informer must relist)."""
    c = http_connection(port, timeout=2)
    try:
        c.request("GET", "%s?watch=1&allowWatchBookmarks=true&resourceVersion=%s" % (path, rv),
                  headers={"User-Agent": UA, "Accept": "application/json"})
        r = c.getresponse()
        if r.status == 410:
            out[path] = "expired"
            return
        line = r.readline()
        ev = json.loads(line) if line else {}
        out[path] = "expired" if ev.get("type") == "ERROR" and ev["object"].get("code") == 410 else "ok"
    except socket.timeout:
        out[path] = "ok"
    except OSError as e:
        out[path] = "error %s" % e
    finally:
        c.close()


def kwc_lists(env, seq0):
    """kwc's own LIST requests upstream since seq0 (collection GETs without
    watch=, discovery excluded), and the informers' watches kwc passed
    upstream (their User-Agent)."""
    reqs = env.sim("GET", "/apisim/requests?since=%d" % seq0)["requests"]
    out, passed = [], []
    for r in reqs:
        if r["method"] == "GET" and r["headers"].get("user-agent", "").startswith(UA):
            passed.append(r["target"])
        if r["method"] != "GET" or r["headers"].get("user-agent", "").startswith(UA):
            continue
        t = r["target"]
        path = t.split("?", 1)[0].rstrip("/").split("/")
        if "watch=" in t or len(path) < (5 if path[1:2] == ["apis"] else 4):
            continue
        out.append(t)
    return out, passed


def start(env, args, data, relay, kind, last):
    """One start of kwc on data; returns its figures and the running Proc.
    last: {informer path: rv} of the watches of the kwc before (resumed
    here, as clients resume on the new replica)."""
    seq0 = env.sim("GET", "/apisim/requests")["seq"]
    d0 = relay.snapshot()
    # no --shutdown-delay-duration: there is no load balancer to wait for
    k = Proc("kwc-" + kind, [args.kwc, "--upstream", "http://127.0.0.1:%d" % relay.port, "--listen",
                             "127.0.0.1:0", "--data-dir", data, "--serving-threads", "1",
                             "--shutdown-delay-duration=0"], env.dir)
    t0 = time.monotonic()
    k.start(timeout=60)
    wait_for(lambda: http_request(k.port, "GET", "/readyz", timeout=5)[0] == 200, 60, "kwc /readyz", 0.005)
    t_ready = time.monotonic() - t0
    rss_start = status_kib(k.pid())
    resumed = {}
    rs = [threading.Thread(target=resume, args=(k.port, p, rv, resumed)) for p, rv in last.items()]
    for t in rs:
        t.start()
    rvs, objects = {}, 0
    for p in INFORMERS:  # informers start together, as a factory starts them
        st, _, b = http_request(k.port, "GET", p + "?resourceVersion=0", headers={"User-Agent": UA}, timeout=60)
        if st != 200:
            raise RuntimeError("%s: %d %s" % (p, st, b[:200]))
        doc = json.loads(b)
        rvs[p] = doc["metadata"]["resourceVersion"]
        objects += len(doc["items"])
    t_synced = time.monotonic() - t0
    for t in rs:
        t.join(30)
    stop = threading.Event()
    last.clear()
    ws = [threading.Thread(target=watch, args=(k.port, p, rvs[p], stop, last), daemon=True) for p in INFORMERS]
    for w in ws:
        w.start()
    time.sleep(args.settle)  # the caches' watches settle; the relay's count is then the start's
    d1 = relay.snapshot()
    lists, passed = kwc_lists(env, seq0)
    st, _, m = http_request(k.port, "GET", "/metrics", timeout=10)
    relists = sum(float(line.rsplit(" ", 1)[1]) for line in m.decode().splitlines()
                  if line.startswith("kwc_reflector_lists_total"))
    running = [line for line in m.decode().splitlines() if line.startswith("kwc_caches_running")]
    fig = {"kind": kind, "ready_s": t_ready, "synced_s": t_synced, "lists": len(lists),
           "list_pages": len(lists), "caches_listed": len({t.split("?")[0] for t in lists}),
           "reflector_lists": relists, "down_bytes": d1[0] - d0[0], "up_bytes": d1[1] - d0[1],
           "upstream_conns": d1[2] - d0[2], "list_targets": lists,
           "resumed": resumed, "passed_upstream": passed, "objects": objects, "rss_start": rss_start,
           "rss_watching": status_kib(k.pid()), "caches_running": running}
    return fig, k, stop, ws


def stop_kwc(k, stop, ws):
    stop.set()
    code = k.stop(timeout=30)
    for w in ws:
        w.join(10)
    if code != 0:
        raise RuntimeError("kwc exited %s:\n%s" % (code, k.logs()))


def mib(kib):
    return "%.1f" % (kib / 1024.0)


def table(args, runs, meta):
    lines = ["### %s (%s)" % (meta, datetime.datetime.now().strftime("%Y-%m-%d %H:%M")), "",
             "| start | data dir | exec to /readyz 200 | exec to every informer's list answered | "
             "kwc's LIST requests upstream (resources) | bytes from the upstream, exec + %g s | "
             "the last run's watchers resumed here: ok / 410 (relist); of them passed upstream | "
             "kwc RSS after start / every informer watching (anon) |" % args.settle,
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        res = list(r["resumed"].values())
        lines.append("| %s | %s | %.0f ms | %.0f ms | %d (%d) | %.1f MB | %s | %s / %s MiB (%s) |" % (
            r["kind"], "empty" if r["kind"].startswith("cold") else "the last run's, %g s of churn behind" % args.gap,
            r["ready_s"] * 1000, r["synced_s"] * 1000, r["lists"], r["caches_listed"], r["down_bytes"] / 1e6,
            "%d / %d; %d" % (res.count("ok"), res.count("expired"), len(r["passed_upstream"])) if res else "-",
            mib(r["rss_start"]["VmRSS"]), mib(r["rss_watching"]["VmRSS"]), mib(r["rss_watching"]["RssAnon"])))
    lines.append("")
    lines.append("- informers: %d JSON lists at resourceVersion=0 then watches (%s), %d objects listed; "
                 "kwc also runs its 14 protobuf caches. %s" % (
                     len(INFORMERS), ", ".join(p.rsplit("/", 1)[1] for p in INFORMERS), runs[0]["objects"],
                     "; ".join("%s: %s" % (r["kind"], ", ".join(r["caches_running"])) for r in runs)))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kwc", default=os.path.join(ROOT, "build", "kwc"))
    ap.add_argument("--pods", type=int, default=5000)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--per-kind", type=int, default=200)
    ap.add_argument("--churn", type=float, default=20)
    ap.add_argument("--gap", type=float, default=5)
    ap.add_argument("--settle", type=float, default=2)
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    env = Env(["--pods", str(args.pods), "--nodes", str(args.nodes), "--namespaces", "20",
               "--recent-requests", "100000"], start_kwc=False, auto=True)
    relay = Relay(env.apisim.port)
    runs = []
    try:
        for key in SEEDED:
            env.sim("POST", "/apisim/seed", {"resource": key, "count": args.per_kind, "namespaces": 20})
        env.sim("POST", "/apisim/churn", {"rate": args.churn, "resources": ["pods"]})
        data = os.path.join(env.dir, "data-1")
        last = {}
        fig, k, stop, ws = start(env, args, data, relay, "cold", last)
        runs.append(fig)
        stop_kwc(k, stop, ws)
        time.sleep(args.gap)  # the pod being replaced: the upstream moves on
        fig, k, stop, ws = start(env, args, data, relay, "warm", last)
        runs.append(fig)
        stop_kwc(k, stop, ws)
        fig, k, stop, ws = start(env, args, os.path.join(env.dir, "data-2"), relay, "cold again", last)
        runs.append(fig)
        stop_kwc(k, stop, ws)
        db = os.path.getsize(os.path.join(data, "data.mdb"))
    except BaseException:
        env.dump_logs()
        raise
    finally:
        env.close()
        shutil.rmtree(env.dir, ignore_errors=True)
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    meta = "%d pods, %d nodes, %d of each other kind, churn %g/s, data.mdb %.0f MB; %s x %s" % (
        args.pods, args.nodes, args.per_kind, args.churn, db / 1e6, os.cpu_count(), cpu)
    text = table(args, runs, meta)
    print(text)
    print(json.dumps(runs, indent=1), file=sys.stderr)
    if args.save:
        path = os.path.join(HERE, "results", "restart.md")
        new = not os.path.exists(path)
        with open(path, "a") as f:
            if new:
                f.write("## restart: a replica's cold start vs warm restart (issue 31, part 8)\n\n"
                        "`bench/restart.py --save` (its docstring says what runs and what is counted).\n\n")
            f.write(text + "\n")


if __name__ == "__main__":
    main()
