#!/usr/bin/env python3
"""`make run`: a demo cluster in apisim (50 nodes, 2,000 pods, ~20 events/s of
churn) with kwc in front. Prints how to use it; Ctrl-C stops both cleanly."""
import argparse
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import Proc, PYTHON, APISIM, http_request, wait_for  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kwc", required=True)
    ap.add_argument("--port", type=int, default=int(os.environ.get("KWC_PORT", "8001")))
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--churn", type=float, default=20)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="kwc-demo-")
    sim = Proc("apisim", [PYTHON, APISIM, "--listen", "127.0.0.1:0", "--pods", str(a.pods), "--nodes",
                          str(a.nodes), "--namespaces", "5", "--churn", str(a.churn)], work).start(60)
    kwc = Proc("kwc", [a.kwc, "--upstream", "http://127.0.0.1:%d" % sim.port, "--listen",
                       "127.0.0.1:%d" % a.port, "--data-dir", os.path.join(work, "data"),
                       "--shutdown-delay-duration", "0"], work)
    try:
        kwc.start()
    except Exception as e:
        print("kwc did not start (port %d busy? set KWC_PORT=...): %s" % (a.port, e), file=sys.stderr)
        sim.stop()
        return 1
    wait_for(lambda: http_request(kwc.port, "GET", "/readyz", timeout=2)[0] == 200, 30, "kwc ready")
    url = "http://127.0.0.1:%d" % kwc.port
    print("""
kwc demo is up.
  apisim (the emulated API server): http://127.0.0.1:%d  (%d pods, %d nodes, %g events/s)
  kwc in front of it:               %s

Try:
  kubectl --server %s get pods -A
  kubectl --server %s get pods -A -w
  kubectl --server %s get nodes -o wide
  curl -s -A demo '%s/api/v1/pods?resourceVersion=0&fieldSelector=spec.nodeName%%3Dnode-1' | head -c 600
      (from kwc's LMDB cache; -A: kube pretty-prints for curl's own User-Agent,
       so kwc passes those requests to the upstream)
  curl -s %s/readyz?verbose

Logs: %s/kwc.log and %s/apisim.log
Ctrl-C stops both.
""" % (sim.port, a.pods, a.nodes, a.churn, url, url, url, url, url, url, work, work), flush=True)
    stop = []
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while not stop:
        if kwc.p.poll() is not None or sim.p.poll() is not None:
            print("a process exited unexpectedly; logs in %s" % work, file=sys.stderr)
            break
        time.sleep(0.5)  # a UI loop waiting for Ctrl-C, not test synchronisation
    print("\nstopping kwc and apisim...", flush=True)
    k, s = kwc.stop(), sim.stop()
    print("kwc exited %s, apisim exited %s" % (k, s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
