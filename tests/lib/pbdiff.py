"""Protobuf lists and gets through kwc's cache vs the same request to apisim.

  KWC_BIN=build/kwc /usr/bin/python3 tests/lib/pbdiff.py [--kwc-arg=ARG ...]

Starts apisim and kwc (Env, cluster.py) with protobuf caches, writes some
history, then sends every request of a matrix with
`Accept: application/vnd.kubernetes.protobuf, application/json` to both and
compares the answers byte for byte:
  - an exact list (Exact, limit with rv, continue) and every get: the whole
    body, the status and the Content-Type;
  - a list kwc may serve at a newer rv (rv=0, NotOlderThan): kwc's body must
    equal apisim's answer to the same request pinned to kwc's rv
    (resourceVersionMatch=Exact, no limit for rv=0);
  - errors: the same status and body (kwc passes the decision table's errors
    upstream for protobuf; a get's 404 is its own);
  - continue chains followed through kwc, through apisim and crossed.
apisim's request counters show which requests kwc served from its cache.
Prints one line per failure and a summary; exit status 1 on any failure.

It reads protobuf with the small decoder below (wire format only, no schema),
independent of kwc's C code.
"""
import argparse
import os
import sys
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import Env, http_request, wait_for  # noqa: E402

PB = "application/vnd.kubernetes.protobuf"
ACCEPT = {"Accept": PB + ", application/json"}
MAGIC = b"k8s\x00"


# ---- a schema-less protobuf reader ------------------------------------------
def varint(b, i):
    v = s = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return v, i


def fields(b):
    """[(number, value)]: bytes for length-delimited fields, int for varints."""
    out, i = [], 0
    while i < len(b):
        key, i = varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(b, i)
        elif wt == 2:
            n, i = varint(b, i)
            v = b[i:i + n]
            if len(v) != n:
                raise ValueError("truncated field %d" % num)
            i += n
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wt)
        out.append((num, v))
    return out


def first(fs, num, default=None):
    for n, v in fs:
        if n == num:
            return v
    return default


def envelope(body):
    """(apiVersion, kind, raw) of a k8s\\0 envelope."""
    if body[:4] != MAGIC:
        raise ValueError("no k8s magic: %r" % body[:40])
    u = fields(body[4:])
    tm = fields(first(u, 1, b""))
    return first(tm, 1, b"").decode(), first(tm, 2, b"").decode(), first(u, 2, b"")


def list_meta(body):
    """{rv, continue, remaining, items: [ns/name]} of a protobuf list."""
    _, kind, raw = envelope(body)
    fs = fields(raw)
    lm = fields(first(fs, 1, b""))
    items = []
    for n, v in fs:
        if n == 2:
            om = fields(first(fields(v), 1, b""))
            items.append("%s/%s" % (first(om, 3, b"").decode(), first(om, 1, b"").decode()))
    return {"kind": kind, "rv": int(first(lm, 2, b"0") or b"0"), "continue": first(lm, 3, b"").decode(),
            "remaining": first(lm, 4), "items": items}


def status(body):
    _, kind, raw = envelope(body)
    fs = fields(raw)
    return {"kind": kind, "status": first(fs, 2, b"").decode(), "message": first(fs, 3, b"").decode(),
            "reason": first(fs, 4, b"").decode(), "code": first(fs, 6)}


# ---- the comparison -----------------------------------------------------------
def q(**kw):
    return urllib.parse.urlencode({k: v for k, v in kw.items() if v is not None})


def with_query(path, **changes):
    base, _, qs = path.partition("?")
    d = dict(urllib.parse.parse_qsl(qs, keep_blank_values=True))
    for k, v in changes.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    return base + ("?" + urllib.parse.urlencode(d) if d else "")


class Diff:
    def __init__(self, env):
        self.env = env
        self.failures = []
        self.checked = 0
        self.served = 0  # answered by kwc without an upstream request

    def fail(self, path, why):
        self.failures.append("%s: %s" % (path, why))
        print("FAIL %s: %s" % (path, why), flush=True)

    def upstream_reads(self):
        return sum(v for k, v in self.env.stats()["requests"].items()
                   if k.startswith("list ") or k.startswith("get "))

    def get(self, port, path):
        return http_request(port, "GET", path, headers=ACCEPT)

    def check(self, path, exact, expect_served=None):
        self.checked += 1
        before = self.upstream_reads()
        k = self.get(self.env.kwc.port, path)
        by_kwc = self.upstream_reads() == before
        self.served += by_kwc
        if expect_served is not None and by_kwc != expect_served:
            self.fail(path, "expected %s, but %s" % ("kwc to serve it" if expect_served else "it passed on",
                                                     "kwc served it" if by_kwc else "it went upstream"))
        s = self.get(self.env.apisim.port, path)
        if k[0] != s[0]:
            return self.fail(path, "status kwc %d apisim %d (%r / %r)" % (k[0], s[0], k[2][:200], s[2][:200]))
        if k[1].get("content-type") != s[1].get("content-type"):
            return self.fail(path, "content-type kwc %r apisim %r" % (k[1].get("content-type"),
                                                                     s[1].get("content-type")))
        if k[0] != 200 or exact or k[2] == s[2]:
            if k[2] != s[2]:
                self.fail(path, "bodies differ (%d vs %d bytes)%s" % (
                    len(k[2]), len(s[2]), "" if k[0] == 200 else ": %r vs %r" % (k[2][:300], s[2][:300])))
            return
        krv = list_meta(k[2])["rv"]
        asked = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(path).query)).get("resourceVersion")
        if asked and asked.isdigit() and krv < int(asked):
            return self.fail(path, "kwc served rv %d < %s" % (krv, asked))
        pinned = with_query(path, resourceVersion=str(krv), resourceVersionMatch="Exact")
        if asked == "0":
            pinned = with_query(pinned, limit=None)
        p = self.get(self.env.apisim.port, pinned)
        if p[0] != 200 or p[2] != k[2]:
            self.fail(path, "kwc's list at rv %d differs from apisim's %s (%d: %d vs %d bytes)" % (
                krv, pinned, p[0], len(k[2]), len(p[2])))

    def chain(self, first_path, port_for_page):
        names, path, pages = [], first_path, 0
        while True:
            st, _, b = self.get(port_for_page(pages), path)
            if st != 200:
                self.fail(first_path, "page %d: %d %r" % (pages, st, b[:200]))
                return None
            m = list_meta(b)
            names += m["items"]
            pages += 1
            if not m["continue"] or pages > 200:
                return names, pages
            path = with_query(first_path, **{"continue": m["continue"], "resourceVersion": None,
                                             "resourceVersionMatch": None})


def quiesce(env, paths):
    env.sim("POST", "/apisim/churn", {"rate": 0})
    rv = env.sim("GET", "/apisim/stats")["rv"]
    for path in paths:
        def reached(path=path):
            st, _, b = http_request(env.kwc.port, "GET", path + "?resourceVersion=0", headers=ACCEPT)
            return st == 200 and b[:4] == MAGIC and list_meta(b)["rv"] >= rv
        wait_for(reached, 30, "kwc to serve %s in protobuf at rv %d" % (path, rv))
    return rv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kwc-arg", action="append", default=[],
                    help="extra kwc flag (repeat), e.g. --kwc-arg=--protobuf-resources=v1/pods")
    ap.add_argument("--resources", default="v1/pods,v1/nodes,v1/namespaces,apps/v1/deployments")
    ap.add_argument("--pods", type=int, default=90, help="more make lists of many chunks")
    ap.add_argument("--churn", type=float, default=2.0, help="seconds of the matrix under churn")
    a = ap.parse_args()
    env = Env(apisim_args=["--pods", str(a.pods), "--namespaces", "3", "--nodes", "4", "--history", "200000",
                           "--bookmark-interval", "0.5"],
              kwc_args=["--resources", a.resources, "--rv-wait-timeout", "300ms"] + a.kwc_arg)
    rc = 1
    try:
        rc = run(env, a)
    finally:
        with open(os.path.join(env.dir, "logs.txt"), "w") as f:
            env.dump_logs(f)
        print("logs in %s" % env.dir)
        codes = env.close()
    if codes.get("kwc") != 0:  # a sanitizer's report makes it non-zero
        print("FAIL kwc exited with %r" % codes.get("kwc"))
        rc = 1
    return rc


def run(env, a):
    e = env
    e.sim("POST", "/apisim/seed", {"resource": "deployments", "count": 8, "namespaces": 2})
    for i in range(12):
        e.sim("POST", "/apisim/write", {"verb": "update", "resource": "pods", "namespace": "ns-%d" % (i * 7 % 90 % 3),
                                        "name": "pod-%d" % (i * 7 % 90), "labels": {"app": "moved", "n": str(i)}})
    for i in range(4):
        j = i * 11 % 90 + 1
        e.sim("POST", "/apisim/write", {"verb": "delete", "resource": "pods", "namespace": "ns-%d" % (j % 3),
                                        "name": "pod-%d" % j})
    old = e.sim("GET", "/apisim/stats")["rv"]
    for i in range(5):
        e.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "ns-1",
                                        "name": "late-%d" % i, "labels": {"app": "late"}})
    lists = ["/api/v1/pods", "/api/v1/nodes", "/api/v1/namespaces", "/apis/apps/v1/deployments"]
    cur = quiesce(e, lists)
    d = Diff(e)

    # every rv x match x limit cell
    scopes = ["/api/v1/pods", "/api/v1/namespaces/ns-1/pods", "/api/v1/nodes", "/api/v1/namespaces",
              "/apis/apps/v1/deployments", "/apis/apps/v1/namespaces/ns-0/deployments"]
    for scope in scopes:
        for rv in [None, "", "0", str(old), str(cur), "abc", "-1"]:
            for m in [None, "NotOlderThan", "Exact", "Bogus"]:
                for lim in [None, "4", "0", "x"]:
                    path = scope + "?" + q(resourceVersion=rv, resourceVersionMatch=m, limit=lim)
                    served = None
                    if m is None and lim is None:
                        served = True if rv in ("0", str(cur)) else False if rv is None else None
                    if m == "Exact" and rv == str(old) and "deployments" not in scope:
                        served = True  # deployments' protobuf cache starts later (lazily): below its floor
                    exact = m == "Exact" or (m is None and lim not in (None, "0") and rv not in (None, "", "0"))
                    d.check(path, exact, served)

    # selectors, the node index
    for node in range(4):
        for lim in range(1, 30, 3):
            for scope in ("/api/v1/pods", "/api/v1/namespaces/ns-0/pods"):
                d.check(scope + "?" + q(fieldSelector="spec.nodeName=node-%d" % node, limit=str(lim),
                                        resourceVersion=str(old)), True, True)
    for scope, key, sel in [
            ("/api/v1/pods", "labelSelector", "app=app-3"),
            ("/api/v1/pods", "labelSelector", "app in (app-1,app-2,moved)"),
            ("/api/v1/pods", "labelSelector", "!n"),
            ("/api/v1/pods", "labelSelector", "app=="),
            ("/api/v1/pods", "fieldSelector", "spec.nodeName=node-2"),
            ("/api/v1/pods", "fieldSelector", "status.phase=Running,spec.nodeName!=node-0"),
            ("/api/v1/pods", "fieldSelector", "metadata.namespace=ns-2"),
            ("/api/v1/pods", "fieldSelector", "metadata.name=pod-5"),
            ("/api/v1/pods", "fieldSelector", "spec.host=node-1"),
            ("/api/v1/pods", "fieldSelector", "spec.bogus=1"),
            ("/api/v1/nodes", "fieldSelector", "metadata.name=node-1")]:
        for extra in ({"resourceVersion": "0"}, {"resourceVersion": str(cur)},
                      {"resourceVersion": str(old), "limit": "5"},
                      {"resourceVersion": str(cur), "resourceVersionMatch": "NotOlderThan", "limit": "3"}):
            d.check(scope + "?" + q(**{key: sel}, **extra), "limit" in extra and "resourceVersionMatch" not in extra)

    # gets, 404s included
    for path in ("/api/v1/namespaces/ns-1/pods/pod-4", "/api/v1/namespaces/ns-1/pods/late-2",
                 "/api/v1/namespaces/ns-1/pods/missing", "/api/v1/nodes/node-1", "/api/v1/nodes/nope",
                 "/api/v1/namespaces/ns-2", "/apis/apps/v1/namespaces/ns-0/deployments/deploy-0",
                 "/apis/apps/v1/namespaces/ns-0/deployments/missing"):
        for rv in ("0", str(cur), None, "abc"):
            d.check(path + ("?" + q(resourceVersion=rv) if rv is not None else ""), True,
                    True if rv in ("0", str(cur)) else None)

    # continue chains: kwc, apisim, crossed
    for first_path in ("/api/v1/pods?limit=7", "/api/v1/pods?limit=7&resourceVersion=%d" % old,
                       "/api/v1/namespaces/ns-2/pods?limit=4&resourceVersion=%d&resourceVersionMatch=NotOlderThan" % cur,
                       "/api/v1/pods?limit=5&labelSelector=app%%3Dmoved&resourceVersion=%d" % cur,
                       "/api/v1/pods?limit=6&fieldSelector=spec.nodeName%%3Dnode-1&resourceVersion=%d" % cur):
        kp, sp = e.kwc.port, e.apisim.port
        via_kwc = d.chain(first_path, lambda i: kp)
        via_sim = d.chain(first_path, lambda i: sp)
        cross1 = d.chain(first_path, lambda i: kp if i % 2 else sp)
        cross2 = d.chain(first_path, lambda i: sp if i % 2 else kp)
        d.checked += 4
        if not (via_kwc == via_sim == cross1 == cross2):
            d.fail(first_path, "chains differ: kwc %r sim %r cross %r %r" % (via_kwc, via_sim, cross1, cross2))
        elif via_kwc[1] < 2:
            d.fail(first_path, "a single page")

    # under churn (label flips move pods in and out of selectors): only exact
    # and pinned comparisons hold; the plan and the chunks must still agree
    if a.churn > 0:
        import time
        e.sim("POST", "/apisim/churn", {"rate": 150, "label_flip": 0.3})
        deadline = time.monotonic() + a.churn
        n = 0
        try:
            while time.monotonic() < deadline:
                for path in ("/api/v1/pods?resourceVersion=0", "/api/v1/pods?labelSelector=app%3Dmoved&resourceVersion=0",
                             "/api/v1/pods?fieldSelector=spec.nodeName%%3Dnode-2&resourceVersion=%d" % old,
                             "/api/v1/pods?limit=9&resourceVersion=%d" % old,
                             "/api/v1/namespaces/ns-1/pods?resourceVersion=%d&resourceVersionMatch=Exact" % old):
                    d.check(path, "limit" in path or "Exact" in path)
                    n += 1
        finally:
            e.sim("POST", "/apisim/churn", {"rate": 0})
        print("%d requests under churn" % n)

    print("%d requests compared, %d answered by kwc's cache, %d failures" % (d.checked, d.served, len(d.failures)))
    return 1 if d.failures else 0


if __name__ == "__main__":
    sys.exit(main())
