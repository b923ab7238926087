#!/usr/bin/env python3
"""make check-layering: the rooms of the source tree and what each may include.

A room is a folder (cache/, proxy/http/, proxy/identity/, proxy/upstream/,
proxy/serve/, proxy/ops/) or proxy/'s top (main, config, app: the wiring). A header
include/kwc/X.h belongs to the room that holds X.c (ROOM_OF_HEADER names the
headers without a .c). Each room may include the headers of the rooms listed
in MAY_INCLUDE, and nothing else; a few files that read across rooms by
design are named in FILE_EXCEPTIONS with the reason. cache/ is pure: no event
loop, sockets, curl or clock (STYLE.md), and no proxy header.

No file under proxy/ passes MAX_LINES lines, and proxy/'s top holds at
most MAX_TOP_SOURCES .c files (main, config, app: the wiring).

Exit status 1 with one line per violation: file:line, what it includes, and
the rule it breaks.
"""
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

# Which rooms each room may include (its own always). The direction of the
# data path: ops and cache are leaves; http knows nothing of Kubernetes;
# identity and upstream sit on http's seam; serve uses them all; the top wires.
MAY_INCLUDE = {
    "cache": {"cache"},
    "ops": {"cache"},
    "http": {"cache", "ops"},
    "identity": {"cache", "ops", "http", "upstream"},
    "upstream": {"cache", "ops", "http"},
    "serve": {"cache", "ops", "http", "identity", "upstream"},
    "top": {"cache", "ops", "http", "identity", "upstream", "serve"},
}

# Files that read across rooms on purpose.
FILE_EXCEPTIONS = {
    # /metrics: the one collector that reads every room's counters
    "proxy/ops/collect.c": {"http", "identity", "upstream", "serve"},
    # the access log records what the front end and the router saw
    "proxy/ops/access.c": {"http", "serve"},
}

# Headers with no .c of the same name.
ROOM_OF_HEADER = {
    "enc": "cache",
    "version": "cache",
}

# Includes cache/ may never use (I/O, the clock).
CACHE_FORBIDDEN = re.compile(
    r'#include *<(event2/|sys/socket|netinet/|arpa/|curl/|sys/time|openssl/)'
    r'|[^_a-z](clock_gettime|gettimeofday|time)\(')
INCLUDE = re.compile(r'^\s*#\s*include\s+"kwc/([a-z0-9_]+)\.h"')


def room_of_source(rel):
    parts = rel.split("/")
    if parts[0] == "cache":
        return "cache"
    if parts[0] == "proxy":
        return "top" if len(parts) == 2 else parts[1]
    return None


def header_rooms():
    rooms = dict(ROOM_OF_HEADER)
    for d, _, files in os.walk(ROOT):
        rel = os.path.relpath(d, ROOT)
        if not (rel == "cache" or rel == "proxy" or rel.startswith("proxy/")):
            continue
        for f in files:
            if f.endswith(".c"):
                rooms[f[:-2]] = room_of_source(os.path.join(rel, f))
    return rooms


def sources():
    out = []
    for top in ("cache", "proxy"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in sorted(files):
                if f.endswith(".c"):
                    out.append(os.path.relpath(os.path.join(d, f), ROOT))
    hdr = os.path.join(ROOT, "include", "kwc")
    out += [os.path.join("include", "kwc", f) for f in sorted(os.listdir(hdr)) if f.endswith(".h")]
    return sorted(out)


# A room's files stay small enough to read, and proxy/'s top holds only the
# wiring.
MAX_LINES = 1200
MAX_TOP_SOURCES = 4


def size_rules():
    bad = []
    top = sorted(f for f in os.listdir(os.path.join(ROOT, "proxy")) if f.endswith(".c"))
    if len(top) > MAX_TOP_SOURCES:
        bad.append(f"proxy/ holds {len(top)} .c files at its top ({', '.join(top)}); at most "
                   f"{MAX_TOP_SOURCES}: the rest belongs in a room")
    for d, _, files in os.walk(os.path.join(ROOT, "proxy")):
        for f in sorted(files):
            if f.endswith((".c", ".h")):
                path = os.path.join(d, f)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    n = sum(1 for _ in fh)
                if n > MAX_LINES:
                    bad.append(f"{os.path.relpath(path, ROOT)}: {n} lines, over {MAX_LINES}: split it by "
                               f"responsibility")
    return bad


def main():
    rooms = header_rooms()
    bad = size_rules()
    for rel in sources():
        if rel.startswith("include/"):
            name = os.path.basename(rel)[:-2]
            room = rooms.get(name)
            if room is None:
                bad.append(f"{rel}: belongs to no room (no {name}.c; name it in ROOM_OF_HEADER)")
                continue
        else:
            room = room_of_source(rel)
        allowed = MAY_INCLUDE[room] | {room} | FILE_EXCEPTIONS.get(rel, set())
        with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as fh:
            for no, line in enumerate(fh, 1):
                if room == "cache" and CACHE_FORBIDDEN.search(line):
                    bad.append(f"{rel}:{no}: cache/ does no I/O and reads no clock: {line.strip()}")
                m = INCLUDE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                ir = rooms.get(inc)
                if ir is None:
                    bad.append(f"{rel}:{no}: kwc/{inc}.h belongs to no room")
                elif ir not in allowed:
                    bad.append(f"{rel}:{no}: the {room} room includes kwc/{inc}.h from the {ir} room "
                               f"({room} may include: {', '.join(sorted(allowed))})")
    for b in bad:
        print("check-layering: " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
