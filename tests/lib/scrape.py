"""kwc's /metrics as numbers, for tests that assert on kwc's own counters
(queued bytes, paused transfers, lagging watchers, requests by code) rather
than on wall-clock or RSS margins, which a loaded machine breaks."""
import re

from cluster import http_request

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(port, headers=None):
    """{(name, frozenset of (label, value)): float} of one /metrics answer
    (headers: e.g. the scraper's Authorization under --auth delegated)."""
    st, _, b = http_request(port, "GET", "/metrics", headers=headers, timeout=30)
    if st != 200:
        raise AssertionError("/metrics: %d %r" % (st, b[:300]))
    out = {}
    for line in b.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise AssertionError("not a sample line: %r" % line)
        labels = frozenset((k, v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\"))
                           for k, v in _LABEL.findall(m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def has(m, name):
    """Whether the family has any sample (a metric kwc no longer writes fails loudly)."""
    return any(n == name for n, _ in m)


def value(m, name, **labels):
    """The sample with exactly these labels; 0 when absent (counters start unwritten)."""
    return m.get((name, frozenset(labels.items())), 0.0)


def total(m, name, **labels):
    """The sum of the family's samples whose labels include these."""
    want = set(labels.items())
    return sum(v for (n, ls), v in m.items() if n == name and want <= ls)
