#!/usr/bin/env python3
"""Runs kwc's integration tests: tests/integration/NN_*.py in order (simple to
complex). Each module holds unittest TestCases that start their own apisim and
kwc on ephemeral loopback ports. Ends with the line "N passed, N failed".

  run.py [PATTERN...]   only modules whose name contains a pattern

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


def main():
    pats = sys.argv[1:]
    mods = sorted(f for f in os.listdir(HERE) if f[:2].isdigit() and f.endswith(".py"))
    if pats:
        mods = [m for m in mods if any(p in m for p in pats)]
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
