#!/usr/bin/python3
"""A rolling restart of two kwc replicas behind a load balancer, with the
shutdown delay kwc had before issue 31 (none: the listeners closed at
SIGTERM) and with --shutdown-delay-duration; and a single instance
replaced by a restart against a takeover (--takeover). What the clients
saw, side by side, in the same run.

  bench/rollout.py [--kwc build/kwc] [--pods 500] [--churn 40] [--informers 8] [--save]

The clients and the balancer are the integration test's
(tests/lib/rollout.py): informer-like watchers (LIST once, then WATCH and
resume from their rv, a new connection per request) and a tight request
loop, through Debian's haproxy (TCP, retries 0, /readyz checked every
300 ms, down after 2 failures). Per scenario: requests made, requests
failed (refused, reset, cut, non-200), relists, ERROR events, and whether
every informer ended with the upstream's exact state.

  - rolling, delay 0: each replica in turn gets SIGTERM and starts again
    (the behaviour before issue 31: the baseline);
  - rolling, delay 3s: the same with --shutdown-delay-duration 3s;
  - single, restart: one kwc on a fixed port, SIGTERM, started again;
  - single, takeover: one kwc replaced by `kwc --takeover` twice.

--save appends the table to bench/results/rollout.md. ~1 minute.
"""
import argparse
import datetime
import os
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))

import cluster  # noqa: E402
from cluster import Env, http_request, wait_for  # noqa: E402
from rollout import Counters, Haproxy, Informer, TightLoop, free_port, upstream_state  # noqa: E402


class Check:
    """upstream_state's assertions, outside unittest."""

    def assertEqual(self, a, b):
        if a != b:
            raise AssertionError("%r != %r" % (a, b))


def kwc(env, name, port, data, kwc_bin, extra=()):
    p = cluster.Proc(name, [kwc_bin, "--upstream", "http://127.0.0.1:%d" % env.apisim.port,
                            "--listen", "127.0.0.1:%d" % port, "--data-dir", data,
                            "--resources", "v1/pods", "--shutdown-drain-grace-period", "20s"] + list(extra),
                     env.dir)
    p.start()
    wait_for(lambda: http_request(port, "GET", "/readyz", timeout=5)[0] == 200, 30, name + " /readyz")
    return p


def clients(port, n):
    c = Counters()
    deadline = time.monotonic() + 300
    inf = [Informer(port, c, deadline) for _ in range(n)]
    loop = TightLoop(port, c, deadline)
    for t in inf + [loop]:
        t.start()
    wait_for(lambda: all(i.established >= 1 for i in inf), 30, "informers watching")
    return c, inf, loop


def finish(env, c, inf, loop):
    env.sim("POST", "/apisim/churn", {"rate": 0})
    want = upstream_state(Check(), env)
    exact = True
    try:
        for i in inf:
            wait_for(lambda: i.snapshot() == want, 30, "the upstream's state")
    except TimeoutError:
        exact = False
    for t in inf + [loop]:
        t.stop_flag.set()
    return [c.requests, len(c.failures), sum(i.lists - 1 for i in inf), sum(len(i.errors) for i in inf),
            "yes" if exact else "NO"]


def rolling(a, delay):
    with Env(apisim_args=["--pods", str(a.pods)], start_kwc=False) as env:
        reps = []
        for n in ("a", "b"):
            port = free_port()
            reps.append([n, port, os.path.join(env.dir, "data-" + n), None])
        extra = ["--shutdown-delay-duration", delay]
        for r in reps:
            r[3] = kwc(env, r[0] + "-1", r[1], r[2], a.kwc, extra)
        lb = Haproxy(env.dir, [(r[0], r[1]) for r in reps])
        try:
            for r in reps:
                lb.wait_state(r[0], "UP")
            env.sim("POST", "/apisim/churn", {"rate": a.churn, "resources": ["pods"]})
            c, inf, loop = clients(lb.port, a.informers)
            for r in reps:
                r[3].stop(timeout=60)
                r[3] = kwc(env, r[0] + "-2", r[1], r[2], a.kwc, extra)
                lb.wait_state(r[0], "UP")
            return finish(env, c, inf, loop)
        finally:
            lb.close()
            for r in reps:
                r[3].stop(timeout=60)


def single(a, takeover):
    with Env(apisim_args=["--pods", str(a.pods)], start_kwc=False) as env:
        port, data = free_port(), os.path.join(env.dir, "data")
        extra = ["--shutdown-delay-duration", "0"]
        p = kwc(env, "k-0", port, data, a.kwc, extra)
        env.sim("POST", "/apisim/churn", {"rate": a.churn, "resources": ["pods"]})
        c, inf, loop = clients(port, a.informers)
        try:
            for k in (1, 2):
                if takeover:
                    new = kwc(env, "k-%d" % k, port, data, a.kwc, extra + ["--takeover"])
                    p.p.wait(60)
                else:
                    p.stop(timeout=60)
                    new = kwc(env, "k-%d" % k, port, data, a.kwc, extra)
                p = new
            return finish(env, c, inf, loop)
        finally:
            p.stop(timeout=60)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kwc", default=os.path.join(HERE, "..", "build", "kwc"))
    ap.add_argument("--pods", type=int, default=500)
    ap.add_argument("--churn", type=float, default=40)
    ap.add_argument("--informers", type=int, default=8)
    ap.add_argument("--save", action="store_true")
    a = ap.parse_args()
    a.kwc = os.path.abspath(a.kwc)
    cluster.KWC_BIN = a.kwc
    tempfile.tempdir = None
    rows = [["rolling, 2 replicas", "no delay (before issue 31)"] + rolling(a, "0"),
            ["rolling, 2 replicas", "--shutdown-delay-duration 3s"] + rolling(a, "3s"),
            ["single instance", "SIGTERM, start again"] + single(a, False),
            ["single instance", "--takeover, twice"] + single(a, True)]
    head = ["scenario", "how", "requests", "failed", "relists", "ERROR events", "exact state"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    title = "### %d pods, churn %g/s, %d informers + a tight request loop; %s" % (
        a.pods, a.churn, a.informers, datetime.datetime.now().strftime("%Y-%m-%d %H:%M"))
    text = "\n".join([title, ""] + out) + "\n"
    print(text)
    if a.save:
        path = os.path.join(HERE, "results", "rollout.md")
        new = not os.path.exists(path)
        with open(path, "a") as f:
            if new:
                f.write("## rollout: rolling restarts and takeovers as clients see them (issue 31)\n\n"
                        "`bench/rollout.py --save` (its docstring says what runs and what is counted).\n\n")
            f.write(text + "\n")


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    main()
