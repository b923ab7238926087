#!/usr/bin/env python3
"""`make run`: a demo cluster in apisim (the API-server emulator: 50 nodes,
2,000 pods, ~20 events/s of churn) with kwc in front, and a short tour that
shows which requests kwc answers from its cache and which it passes to the
API server, each with the line kwc's access log wrote for it.

  demo.py --kwc build/kwc                  the tour, then kwc stays up until Ctrl-C
  demo.py --kwc build/kwc --scenario-only  the tour alone; exit status 1 if any
                                           request was answered by another source
                                           than the one expected (the test of
                                           tests/integration/37_demo.py)

kwc listens on 127.0.0.1:$KWC_PORT (default 8001; 0 picks a free port). The
temporary directory (kwc's data dir, both logs, kubectl's cache) is removed
when the demo ends, however it ends; KWC_KEEP_TMP=1 keeps it.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import Proc, PYTHON, APISIM, http_connection, http_request, wait_for  # noqa: E402

UA = "kwc-demo/1 (an informer-like client)"
TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io," \
    "application/json"  # what kubectl get asks for
WATCH_SECONDS = 2  # each watch of the tour ends by itself after this long


class Stop(BaseException):  # not an Exception: wait_for and the steps must not catch it
    """SIGINT, SIGTERM or SIGHUP: end the demo (the finally clauses clean up)."""


def on_signal(signum, frame):
    raise Stop(signal.Signals(signum).name)


# ---- kwc's access log ------------------------------------------------------

FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)')


def unquote(v):
    if v.startswith('"'):
        try:
            return json.loads(v)  # kwc quotes as Go's strconv.Quote
        except ValueError:
            return v[1:-1]
    return v


class AccessLog:
    """The access-log lines kwc appends to its log (`--access-log`, text
    format: `TIME info  request method=GET path="..." ... source=cache`),
    read from a mark onwards."""

    def __init__(self, path):
        self.path = path
        self.offset = 0

    def mark(self):
        self.offset = os.path.getsize(self.path)

    def lines(self):
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            text = f.read().decode("utf-8", "replace")
        out = []
        for raw in text.splitlines():
            i = raw.find(" request method=")
            if i < 0:
                continue
            rec = {k: unquote(v) for k, v in FIELD.findall(raw[i + len(" request "):])}
            rec["line"] = raw[i + 1:]  # without the time and level
            p = urllib.parse.urlsplit(rec.get("path", ""))
            rec["rpath"], rec["query"] = p.path, dict(urllib.parse.parse_qsl(p.query, keep_blank_values=True))
            out.append(rec)
        return out


class Want:
    """Requests the access log must show after a step: path and query
    (value None: the parameter is absent; True: present with any value),
    the source expected and why."""

    def __init__(self, path, source, why, optional=False, **query):
        self.path, self.source, self.why, self.query = path, source, why, query
        self.optional = optional  # a request the client may not make (a second page)

    def matches(self, rec):
        if rec["rpath"] != self.path:
            return False
        for k, v in self.query.items():
            k = k.rstrip("_")
            have = rec["query"].get(k)
            if (v is None and have is not None) or (v is True and have is None) or \
                    (isinstance(v, str) and have != v):
                return False
        return True


class Tour:
    def __init__(self, kwc_port, sim_port, log_path, workdir, kubectl):
        self.port, self.sim_port = kwc_port, sim_port
        self.log = AccessLog(log_path)
        self.workdir = workdir
        self.kubectl_bin = kubectl
        self.wrong = []  # lines whose source was not the expected one
        self.counts = {"cache": 0, "upstream": 0}
        self.n = 0

    def step(self, title):
        self.n += 1
        print("\n%d. %s" % (self.n, title), flush=True)
        self.log.mark()

    def expect(self, *wants):
        """Wait for each want's line(s) (a watch is logged when it ends), show
        them with the source and the reason, and note a wrong source."""
        def all_seen():
            recs = self.log.lines()
            return recs if all(w.optional or any(w.matches(r) for r in recs) for w in wants) else None
        try:
            recs = wait_for(all_seen, 15, "kwc's access-log lines", interval=0.05)
        except TimeoutError:
            recs = self.log.lines()
        for w in wants:
            got = [r for r in recs if w.matches(r)]
            if not got and not w.optional:
                print("   (no access-log line for %s: expected source=%s)" % (w.path, w.source))
                self.wrong.append("%d. no line for %s" % (self.n, w.path))
            for r in got:
                ok = r.get("source") == w.source
                self.counts[r.get("source")] = self.counts.get(r.get("source"), 0) + 1
                print("   kwc.log: %s" % r["line"])
                print("     %s %s" % ("->" if ok else "!! expected source=%s, got:" % w.source, w.why))
                if not ok:
                    self.wrong.append("%d. %s: source=%s, expected %s" % (self.n, r["line"], r.get("source"),
                                                                           w.source))

    def kubectl(self, *args):
        env = dict(os.environ, KUBECONFIG="/dev/null")  # not the user's clusters or credentials
        cmd = [self.kubectl_bin, "--server", "http://127.0.0.1:%d" % self.port,
               "--cache-dir", os.path.join(self.workdir, "kubectl-cache")] + list(args)
        print("   $ kubectl --server http://127.0.0.1:%d %s" % (self.port, " ".join(
            "'%s'" % a if any(c in a for c in "?&= ") else a for a in args)), flush=True)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
        if r.returncode != 0:
            raise RuntimeError("kubectl %s failed (%d): %s" % (" ".join(args), r.returncode, r.stderr[-1000:]))
        return r.stdout

    def get(self, path):
        st, _, body = http_request(self.port, "GET", path, headers={"User-Agent": UA, "Accept": "application/json"})
        if st != 200:
            raise RuntimeError("GET %s: %d %s" % (path, st, body[:300]))
        return json.loads(body)

    def watch(self, path):
        """A watch's event types, read until kwc ends the stream (timeoutSeconds)."""
        c = http_connection(self.port, timeout=WATCH_SECONDS + 30)
        try:
            c.request("GET", path, headers={"User-Agent": UA, "Accept": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                raise RuntimeError("GET %s: %d %s" % (path, r.status, r.read()[:300]))
            types = {}
            for line in r.read().splitlines():
                if line.strip():
                    t = json.loads(line)["type"]
                    types[t] = types.get(t, 0) + 1
            return types
        finally:
            c.close()

    def sim_watches(self):
        st, _, body = http_request(self.sim_port, "GET", "/apisim/stats")
        return json.loads(body)["requests"].get("watch pods", 0)

    def run(self):
        watches_before = self.sim_watches()
        print("\nA tour: five clients, and the line kwc's access log writes for each of their requests"
              "\n(source=cache: answered from kwc's LMDB cache; source=upstream: passed to the API server).")

        self.step("An informer (client-go's ListAndWatch: kube-proxy, kubelets, controllers), "
                  "here Python's http.client")
        lst = self.get("/api/v1/pods?resourceVersion=0")
        rv, n = lst["metadata"]["resourceVersion"], len(lst["items"])
        print("   LIST  /api/v1/pods?resourceVersion=0: %d pods at resourceVersion %s" % (n, rv))
        wpath = "/api/v1/pods?watch=true&resourceVersion=%s&allowWatchBookmarks=true&timeoutSeconds=%d" % (
            rv, WATCH_SECONDS)
        types = self.watch(wpath)
        print("   WATCH from resourceVersion %s for %d s: %s" % (rv, WATCH_SECONDS, ", ".join(
            "%d %s" % (v, k) for k, v in sorted(types.items())) or "no events"))
        self.expect(
            Want("/api/v1/pods", "cache", "resourceVersion=0 asks for any recent state: kwc answers from its "
                 "cache at once, as kube-apiserver does from its watch cache (this first JSON list of pods also "
                 "started that cache: one upstream LIST and WATCH)", resourceVersion="0", watch=None),
            Want("/api/v1/pods", "cache", "a watch from a resourceVersion the cache holds: the events after it "
                 "from kwc's history, then live ones; kwc's one upstream watch feeds every watcher",
                 watch="true", resourceVersion=rv))

        self.step("A controller's paged read, not older than what it has seen (resourceVersionMatch=NotOlderThan)")
        limit = max(1, min(500, (n + 1) // 2))
        p1 = self.get("/api/v1/pods?resourceVersion=%s&resourceVersionMatch=NotOlderThan&limit=%d" % (rv, limit))
        cont = p1["metadata"].get("continue")
        print("   page 1: %d pods, resourceVersion %s" % (len(p1["items"]), p1["metadata"]["resourceVersion"]))
        wants = [Want("/api/v1/pods", "cache", "NotOlderThan: any state at least as new as %s; kwc's cache is, so "
                      "it pages its own state" % rv, resourceVersionMatch="NotOlderThan", continue_=None)]
        if cont:
            p2 = self.get("/api/v1/pods?limit=%d&continue=%s" % (limit, urllib.parse.quote(cont, safe="")))
            print("   page 2: %d pods, from the same snapshot (a continue token in kube's format)"
                  % len(p2["items"]))
            wants.append(Want("/api/v1/pods", "cache", "the next page of that snapshot, from kwc's history",
                              continue_=True))
        self.expect(*wants)

        node_pods = "/api/v1/pods?resourceVersion=0&fieldSelector=spec.nodeName%3Dnode-1"
        if self.kubectl_bin:
            self.step("A kubelet's view of its node (the pods bound to node-1), with kubectl get --raw")
            items = json.loads(self.kubectl("get", "--raw", node_pods))["items"]
        else:
            self.step("A kubelet's view of its node (the pods bound to node-1): GET " + node_pods)
            items = self.get(node_pods)["items"]
        print("   %d pods on node-1" % len(items))
        self.expect(Want("/api/v1/pods", "cache", "resourceVersion=0 with a field selector on spec.nodeName, "
                         "which kwc indexes", fieldSelector="spec.nodeName=node-1", resourceVersion="0"))

        self.step("kubectl get pods -A -w -o json: a list, then a watch from its resourceVersion")
        if self.kubectl_bin:
            self.kubectl_watch()
        else:
            print("   skipped: kubectl is not on PATH")

        self.step("kubectl get pods -n ns-0: the table you see (kubectl asks for a Table)")
        if self.kubectl_bin:
            rows = self.kubectl("get", "pods", "-n", "ns-0").splitlines()
        else:  # the request kubectl makes
            print("   (kubectl is not on PATH: kubectl's request, with http.client)")
            st, _, body = http_request(self.port, "GET", "/api/v1/namespaces/ns-0/pods?limit=500", headers={
                "User-Agent": UA, "Accept": TABLE_ACCEPT})
            if st != 200:
                raise RuntimeError("GET a Table of ns-0's pods: %d %s" % (st, body[:300]))
            t = json.loads(body)
            rows = ["   ".join(c["name"].upper() for c in t["columnDefinitions"][:3])] + [
                "   ".join(str(c) for c in row["cells"][:3]) for row in t["rows"]]
        for line in rows[:3]:
            print("   | " + line)
        if len(rows) > 3:
            print("   | ... (%d rows)" % (len(rows) - 1))
        self.expect(Want("/api/v1/namespaces/ns-0/pods", "upstream", "Accept: ...;as=Table: the API server renders "
                         "tables with each kind's columns, which kwc does not build; and no resourceVersion: a "
                         "consistent read. Both always go upstream", watch=None))

        extra = self.sim_watches() - watches_before
        print("\nIn all: %d answers from kwc's cache, %d from the API server. %d WATCH request(s) for pods reached "
              "the API server\nmeanwhile, each from one of kwc's own caches of pods (JSON, protobuf) as it started; "
              "the clients' %d watch(es)\ndid not reach it." % (self.counts.get("cache", 0),
                                                                  self.counts.get("upstream", 0), extra,
                                                                  2 if self.kubectl_bin else 1))
        if self.wrong:
            print("\nUNEXPECTED (the demo's check failed):\n  " + "\n  ".join(self.wrong), file=sys.stderr)
        return not self.wrong

    def kubectl_watch(self):
        out = self.kubectl("get", "pods", "-A", "-w", "-o", "json", "--request-timeout=%ds" % WATCH_SECONDS)
        listed, changed = json_objects(out)
        print("   kubectl printed the list (%d pods), then %d pods its watch delivered as they changed, and "
              "ended after %d s (--request-timeout)" % (listed, changed, WATCH_SECONDS))
        self.expect(
            Want("/api/v1/pods", "upstream", "no resourceVersion: a consistent read, which only the API server "
                 "(etcd) can vouch for, so kwc passes it through", watch=None, resourceVersion=None,
                 continue_=None),
            Want("/api/v1/pods", "cache", "a next page: its continue token carries the first page's "
                 "resourceVersion, which kwc's history holds, so the rest of the list is kwc's",
                 optional=True, continue_=True),
            Want("/api/v1/pods", "cache", "the watch from the list's resourceVersion: from the cache",
                 watch="true"))


def json_objects(text):
    """kubectl -w -o json's output: (items of its List objects, other objects)."""
    dec, i, listed, other = json.JSONDecoder(), 0, 0, 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return listed, other
        o, i = dec.raw_decode(text, i)
        if o.get("kind", "").endswith("List"):
            listed += len(o.get("items") or [])
        else:
            other += 1


BANNER = """
kwc demo is up.
  apisim, the emulated API server:  http://127.0.0.1:{sim}  ({pods} pods, {nodes} nodes, {churn:g} events/s)
  kwc in front of it:               {url}
  kwc's log, one line per request:  tail -f {work}/kwc.log   (source=cache or source=upstream)

Try (answered from kwc's cache):
  kubectl --server {url} get --raw '/api/v1/pods?resourceVersion=0&fieldSelector=spec.nodeName%3Dnode-1'
  kubectl --server {url} get pods -A -w -o json     # its first page goes upstream; its next pages and watch are kwc's
  curl -s '{url}/api/v1/namespaces/ns-0/pods?resourceVersion=0&limit=1' | head -c 600
      (pretty-printed for curl's User-Agent, as kube-apiserver does, from the cache)
  curl -s '{url}/api/v1/nodes?watch=1&resourceVersion=0'
Passed to the API server (see why in README.md, "What goes upstream"):
  kubectl --server {url} get pods -A       # a Table, and a consistent read (no resourceVersion)
  kubectl --server {url} exec -n ns-0 POD -- echo hi   # kubectl >= 1.30 (WebSocket)
kwc's own endpoints:
  curl -s {url}/readyz?verbose
  curl -s {url}/metrics | grep '^kwc_requests_total'

Ctrl-C stops both and removes {work}.
"""


def run(a, work):
    """Start apisim and kwc, run the tour; in interactive mode wait for
    Ctrl-C. Returns the exit status; the caller stops the processes."""
    procs = a.procs
    sim = Proc("apisim", [PYTHON, APISIM, "--listen", "127.0.0.1:0", "--pods", str(a.pods), "--nodes",
                          str(a.nodes), "--namespaces", "5", "--churn", str(a.churn)], work,
               new_session=True)
    procs.append(sim)
    sim.start(60)
    kwc = Proc("kwc", [a.kwc, "--upstream", "http://127.0.0.1:%d" % sim.port, "--listen",
                       "127.0.0.1:%d" % a.port, "--data-dir", os.path.join(work, "data"), "--access-log",
                       "--shutdown-delay-duration", "0"], work, new_session=True)
    procs.append(kwc)
    try:
        kwc.start()
    except Exception as e:
        print("kwc did not start (is port %d busy? set KWC_PORT=...): %s" % (a.port, e), file=sys.stderr)
        return 1
    wait_for(lambda: http_request(kwc.port, "GET", "/readyz", timeout=2)[0] == 200, 30, "kwc ready")
    url = "http://127.0.0.1:%d" % kwc.port
    print("kwc (pid %d) serves on %s, in front of apisim (pid %d) on port %d (%d pods, %d nodes, %g events/s)"
          % (kwc.pid(), url, sim.pid(), sim.port, a.pods, a.nodes, a.churn), flush=True)
    kubectl = shutil.which("kubectl")
    if not kubectl:
        print("kubectl is not on PATH: the tour sends kubectl's requests itself, and skips kubectl's watch",
              flush=True)
    ok = Tour(kwc.port, sim.port, kwc.log_path, work, kubectl).run()
    if a.scenario_only:
        return 0 if ok else 1
    print(BANNER.format(sim=sim.port, pods=a.pods, nodes=a.nodes, churn=a.churn, url=url, work=work), flush=True)
    while True:
        for p in (kwc, sim):
            if p.p.poll() is not None:
                print("%s exited unexpectedly (%s):\n%s" % (p.name, p.p.returncode, p.logs(20)), file=sys.stderr)
                return 1
        time.sleep(0.5)  # a UI loop waiting for Ctrl-C, not test synchronisation


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kwc", required=True, help="the kwc binary")
    ap.add_argument("--port", type=int, default=int(os.environ.get("KWC_PORT", "8001")),
                    help="kwc's port on 127.0.0.1 (default: $KWC_PORT, else 8001; 0 picks one)")
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--churn", type=float, default=20, help="events per second in apisim")
    ap.add_argument("--scenario-only", action="store_true",
                    help="run the tour and exit: 1 if any request's source was not the expected one")
    a = ap.parse_args()
    a.procs = []
    work = tempfile.mkdtemp(prefix="kwc-demo-")
    print("kwc demo: working in %s" % work, flush=True)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    rc = 1
    try:
        rc = run(a, work)
    except Stop as e:
        rc = 0 if not a.scenario_only else 1
        print("\n%s: stopping" % e, flush=True)
    except Exception as e:
        print("the demo failed: %s" % e, file=sys.stderr)
        for p in a.procs:
            if p.p is not None:
                print("---- %s log, last lines ----\n%s" % (p.name, p.logs(20)), file=sys.stderr)
    finally:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)  # clean up whatever comes next
        codes = []
        for p in reversed(a.procs):
            try:
                codes.append("%s exited %s" % (p.name, p.stop()))
            except Exception as e:  # one that does not stop is killed; go on with the others
                p.kill()
                codes.append("%s: %s" % (p.name, e))
        if codes:
            print(", ".join(codes), flush=True)
        if os.environ.get("KWC_KEEP_TMP"):
            print("kept %s (KWC_KEEP_TMP)" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)
            print("removed %s" % work, flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
