#!/usr/bin/env python3
"""Runs kwc's integration tests: tests/integration/NN_*.py in order (simple to
complex). Each module holds unittest TestCases that start their own apisim and
kwc on ephemeral loopback ports. Ends with the line "N passed, N failed".

  run.py [PATTERN...]   only modules whose name contains a pattern

With KWC_IT_JOBS=N (N > 1; make test sets 2) the modules run N at a time,
each in a process of its own, the longest first; a module's output is
printed whole when it ends, then the totals. The tests hold under load
(both cores busy): a module beside another is that.

With KWC_TLS=1 (make integration-tls) kwc serves TLS and every client reaches
it over https (tests/lib/cluster.py); the tests marked
@only_in_plaintext_run(reason) are left out of that run, and listed.
With KWC_H2=1 (make integration-h2) the tests speak HTTP/2 to kwc; the tests
marked @only_over_http1(reason) are left out of that run, and listed.
"""
import importlib.util
import os
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))


class Result(unittest.TextTestResult):
    pass


def flatten(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from flatten(t)
        else:
            yield t


def plaintext_only(test):
    """The reason a test is marked only_in_plaintext_run (class or method), or None."""
    method = getattr(test, getattr(test, "_testMethodName", ""), None)
    return getattr(method, "only_in_plaintext_run", None) or getattr(test, "only_in_plaintext_run", None)


def http1_only(test):
    """The reason a test is marked only_over_http1 (class or method), or None."""
    method = getattr(test, getattr(test, "_testMethodName", ""), None)
    return getattr(method, "only_over_http1", None) or getattr(test, "only_over_http1", None)


# The modules that take longest (seconds, plain run on a quiet 2-core
# machine): started first, so that the short ones fill in beside them.
LONG = {"11_": 136, "20_": 98, "19_": 81, "21_": 82, "18_": 47, "10_": 31, "24_": 28, "35_": 22,
        "25_": 21, "12_": 17, "33_": 16}


def parallel(mods, jobs):
    """Each module in a process of its own, jobs at a time; their outputs,
    whole, as each ends; the totals. Returns the exit status."""
    import re
    import subprocess
    import tempfile
    t0 = time.monotonic()
    order = sorted(mods, key=lambda m: -LONG.get(m[:3], 0))
    running, totals, failed_mods = [], [0, 0, 0], []

    def reap(block):
        for r in list(running):
            m, p, out, start = r
            if p.poll() is None and not block:
                continue
            p.wait()
            running.remove(r)
            out.seek(0)
            text = out.read().decode("utf-8", "replace")
            out.close()
            sys.stdout.write("==== %s (%.0fs)\n%s" % (m, time.monotonic() - start, text))
            sys.stdout.flush()
            last = re.search(r"(\d+) passed, (\d+) failed(?:, (\d+) skipped)?\s*$", text)
            if last:
                for i in range(3):
                    totals[i] += int(last.group(i + 1) or 0)
            # a module whose every test this run leaves out (TLS, HTTP/2)
            # ran none: not a failure here, as in the run of all together
            if not last or int(last.group(2)) or (p.returncode != 0 and int(last.group(1))):
                failed_mods.append(m)
                if not last:
                    totals[1] += 1
            return True
        return False

    for m in order:
        while len(running) >= jobs:
            if not reap(False):
                time.sleep(0.05)
        out = tempfile.TemporaryFile()
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), m], stdout=out, stderr=subprocess.STDOUT,
                             env=dict(os.environ, KWC_IT_JOBS="1"))
        running.append((m, p, out, time.monotonic()))
    while running:
        if not reap(False):
            time.sleep(0.05)
    tls = os.environ.get("KWC_TLS", "") == "1"
    h2 = os.environ.get("KWC_H2", "") == "1"
    mode = [x for x, on in (("TLS", tls), ("HTTP/2", h2)) if on]
    if failed_mods:
        print("failed modules: %s" % " ".join(failed_mods))
    print("integration%s (%.0fs, %d at a time): %d passed, %d failed%s" % (
        " (%s)" % ", ".join(mode) if mode else "", time.monotonic() - t0, jobs, totals[0], totals[1],
        ", %d skipped" % totals[2] if totals[2] else ""))
    return 1 if failed_mods or totals[1] or totals[2] or not totals[0] else 0


def main():
    pats = sys.argv[1:]
    mods = sorted(f for f in os.listdir(HERE) if f[:2].isdigit() and f.endswith(".py"))
    if pats:
        mods = [m for m in mods if any(p in m for p in pats)]
    jobs = int(os.environ.get("KWC_IT_JOBS", "1") or 1)
    if jobs > 1 and len(mods) > 1:
        sys.exit(parallel(mods, jobs))
    suite = unittest.TestSuite()
    loader = unittest.TestLoader()
    for m in mods:
        spec = importlib.util.spec_from_file_location(m[:-3], os.path.join(HERE, m))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        suite.addTests(loader.loadTestsFromModule(mod))
    tls = os.environ.get("KWC_TLS", "") == "1"
    h2 = os.environ.get("KWC_H2", "") == "1"
    if tls or h2:
        kept = []
        for t in flatten(suite):
            why = plaintext_only(t) if tls else None
            why2 = http1_only(t) if h2 else None
            if why:
                print("TLS run leaves out %s: %s" % (t.id(), why))
            elif why2:
                print("HTTP/2 run leaves out %s: %s" % (t.id(), why2))
            else:
                kept.append(t)
        suite = unittest.TestSuite(kept)
    t0 = time.monotonic()
    runner = unittest.TextTestRunner(verbosity=2, resultclass=Result, stream=sys.stdout)
    res = runner.run(suite)
    failed = len(res.failures) + len(res.errors) + len(res.unexpectedSuccesses)
    skipped = len(res.skipped)
    passed = max(0, res.testsRun - failed - skipped)
    mode = [m for m, on in (("TLS", tls), ("HTTP/2", h2)) if on]
    print("integration%s (%.0fs): %d passed, %d failed%s" % (
        " (%s)" % ", ".join(mode) if mode else "", time.monotonic() - t0, passed, failed,
        ", %d skipped" % skipped if skipped else ""))
    # A skipped test is not a pass: it fails the run too.
    sys.exit(1 if failed or skipped or res.testsRun == 0 else 0)


if __name__ == "__main__":
    main()
