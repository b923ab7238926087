#!/usr/bin/env python3
"""The ThreadSanitizer reports of a make tsan run, deduplicated.

  tsan-summary.py DIR

DIR holds the files TSan wrote (TSAN_OPTIONS log_path=DIR/tsan: one
tsan.PID per process that reported). Each distinct report (its SUMMARY line)
is printed once, in full, with how many times and in how many processes it
was seen. Exit status 1 when there was any report, 0 when none."""
import collections
import os
import re
import sys


def reports(text):
    """The report blocks of one log: from a WARNING: ThreadSanitizer line to
    its SUMMARY line."""
    for m in re.finditer(r"WARNING: ThreadSanitizer: .*?\nSUMMARY: ThreadSanitizer: [^\n]*", text, re.S):
        yield m.group(0)


def main():
    d = sys.argv[1]
    seen = collections.OrderedDict()  # summary line -> [first report, count, pids]
    names = sorted(os.listdir(d)) if os.path.isdir(d) else []
    for name in names:
        with open(os.path.join(d, name), errors="replace") as f:
            text = f.read()
        for r in reports(text):
            key = r.rsplit("\n", 1)[1]
            e = seen.setdefault(key, [r, 0, set()])
            e[1] += 1
            e[2].add(name)
    for key, (r, n, pids) in seen.items():
        print("==== %d report(s) in %d process(es): %s\n%s\n" % (n, len(pids), key, r))
    print("ThreadSanitizer: %d distinct report(s) in %d log file(s) under %s" % (len(seen), len(names), d))
    return 1 if seen else 0


if __name__ == "__main__":
    sys.exit(main())
