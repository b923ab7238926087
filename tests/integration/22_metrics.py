"""/metrics and the access log (docs/operations.md, "Metrics").

  1. Scenario: a fresh kwc in front of apisim, then a script whose every
     step implies exact counter values — N cached lists, passthroughs, M live
     watchers and one paused watcher over a small --watch-budget while E
     events go by, the watchers closing, one forced upstream 410 — checked
     number for number (requests by verb/resource/code/source, the watchers
     and lagging gauges, events sent = E x watchers, relists = 1, 410s = 1,
     ...); the access log (--logging-format json) has a line for a cached list, a
     passthrough and each watch stream's end, every line a JSON object with
     the documented keys, and a ?token= value never appears in it.
  2. The exposition: `promtool check metrics` accepts it, and a real
     Prometheus (Debian's) scraping kwc every second returns its series.
  3. --auth delegated: /metrics is authorized as kube's nonResourceURLs
     /metrics: 401 without credentials, 403 for a user without the rule, 200
     for one with it; /healthz needs no identity.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import unittest
import urllib.parse

from cluster import (APISIM, KWC_BIN, KWC_EXTRA_ARGS, KWC_WRAP, PYTHON, Env, Proc, connect, http_request,
                     only_in_plaintext_run, read_to_eof, tls_client, url, wait_for)
from watchstream import Stream, pump

SECRET = "s3cr3t-9f1e27"

LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """{(name, frozenset of (label, value)): float} of an exposition."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        assert m, "not a sample line: %r" % line
        labels = frozenset((k, v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\"))
                           for k, v in LABEL.findall(m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def scrape_text(port, headers=None):
    st, h, b = http_request(port, "GET", "/metrics", headers=headers)
    assert st == 200, (st, b[:300])
    assert h["content-type"] == "text/plain; version=0.0.4; charset=utf-8", h
    return b.decode()


def val(m, name, **labels):
    return m.get((name, frozenset(labels.items())), 0.0)


def pods(**kw):
    return dict(dict(group="", version="v1", resource="pods", encoding="json"), **kw)


def raw_get(port, path):
    """One GET on a connection kwc closes after it: every byte kwc queued for
    it (head, body, chunk framing)."""
    s = connect(port)
    s.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" % path).encode())
    data = read_to_eof(s)
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    return data


class Scenario(unittest.TestCase):
    """One kwc, one script, exact counters."""
    N_LISTS = 5
    M_LIVE = 3

    def test_scenario(self):
        with Env(apisim_args=["--pods", "10", "--pod-size", "16000"],
                 kwc_args=["--resources", "v1/pods", "--watch-budget", "16384", "--serving-threads", "2",
                           "--access-log", "--logging-format", "json",
                           # exact counters of one reflector: the forced 410
                           # must reach the JSON cache's watch, not a protobuf one
                           "--protobuf-resources", "none"]) as e:
            self.run_scenario(e)

    def run_scenario(self, e):
        port = e.kwc.port
        m = parse(scrape_text(port))
        # a fresh kwc: one list, one watch, nothing else
        self.assertEqual(val(m, "kwc_reflector_lists_total", **pods()), 1)
        self.assertEqual(val(m, "kwc_reflector_relists_total", **pods()), 0)
        self.assertEqual(val(m, "kwc_reflector_watches_total", **pods()), 1)
        self.assertEqual(val(m, "kwc_cache_synced", **pods()), 1)
        self.assertEqual(val(m, "kwc_cache_in_service", **pods()), 1)
        self.assertEqual(val(m, "kwc_cache_objects", **pods()), 10)
        self.assertEqual(val(m, "kwc_cache_resource_version", **pods()), e.stats()["rv"])
        # each cache's state as an enum (a series per state, one of them 1):
        # the JSON cache watches; the protobuf one never started
        # (--protobuf-resources none) is stopped, with no age of an event
        states = ("stopped", "unserved", "out_of_service", "stale", "backing_off", "syncing", "watching")
        for enc, want in (("json", "watching"), ("protobuf", "stopped")):
            got = {st: m.get(("kwc_cache_state", frozenset(dict(pods(), encoding=enc, state=st).items())))
                   for st in states}
            self.assertEqual(got, {st: float(st == want) for st in states}, enc)
        age = m.get(("kwc_cache_last_event_age_seconds", frozenset(pods().items())))
        self.assertIsNotNone(age, "the JSON cache heard from the upstream (its list)")
        self.assertGreaterEqual(age, 0)
        self.assertNotIn(("kwc_cache_last_event_age_seconds", frozenset(pods(encoding="protobuf").items())), m)

        # N cached lists, one quorum read and one passthrough carrying a secret
        list_bytes = 0
        for _ in range(self.N_LISTS):
            list_bytes += len(raw_get(port, "/api/v1/pods?resourceVersion=0"))
        up0 = parse(scrape_text(port))
        upstream_get0 = val(up0, "kwc_upstream_requests_total", method="GET", code="200")
        st, _, _ = http_request(port, "GET", "/api/v1/pods")
        self.assertEqual(st, 200)
        st, _, _ = http_request(port, "GET", "/api/v1/namespaces?token=%s&limit=5" % SECRET)
        self.assertEqual(st, 200)
        st, _, _ = http_request(port, "GET", "/api/v1/namespaces/default/pods/nope?resourceVersion=0")
        self.assertEqual(st, 404)
        m = parse(scrape_text(port))
        req = lambda verb, res, code, src: val(m, "kwc_requests_total", verb=verb, group="", resource=res,
                                               code=str(code), source=src)
        self.assertEqual(req("LIST", "pods", 200, "cache"), self.N_LISTS)
        self.assertEqual(req("LIST", "pods", 200, "upstream"), 1)
        self.assertEqual(req("LIST", "namespaces", 200, "upstream"), 1)
        self.assertEqual(req("GET", "pods", 404, "cache"), 1)
        self.assertEqual(val(m, "kwc_request_duration_seconds_count", verb="LIST", group="", resource="pods",
                             source="cache"), self.N_LISTS)
        self.assertEqual(val(m, "kwc_request_duration_seconds_bucket", verb="LIST", group="", resource="pods",
                             source="cache", le="+Inf"), self.N_LISTS)
        self.assertEqual(val(m, "kwc_response_bytes_total", verb="LIST", group="", resource="pods",
                             source="cache"), list_bytes)
        self.assertEqual(val(m, "kwc_upstream_requests_total", method="GET", code="200") - upstream_get0, 2,
                         "the two passthroughs, and nothing else, went upstream")
        self.assertEqual(val(m, "kwc_requests_in_flight", source="upstream"), 0)
        self.assertEqual(val(m, "kwc_requests_in_flight", source="cache"), 0)

        # M live watchers and one that never reads (over its 16 KiB budget once
        # the kernel's socket buffers are full), from the current rv
        rv0 = e.stats()["rv"]
        path = "/api/v1/pods?watch=1&resourceVersion=%d" % rv0
        live = [Stream(port, path) for _ in range(self.M_LIVE)]
        slow = Stream(port, path, rcvbuf=4096)
        slow.paused = True
        streams = live + [slow]
        wait_for(lambda: val(parse(scrape_text(port)), "kwc_watchers", **pods()) == self.M_LIVE + 1, 10,
                 "the watchers gauge")
        writes = 0

        def lagging():
            return val(parse(scrape_text(port)), "kwc_watchers_lagging", **pods())
        # bursts of 100 updates (~1.6 MB) until the paused watcher lags
        while lagging() != 1:
            self.assertLess(writes, 3000, "the paused watcher never went over its budget")
            rv = e.sim("POST", "/apisim/churn", {"count": 100, "resources": ["pods"], "mix": {"update": 1.0}})["rv"]
            writes += 100
            pump(live, lambda: all(s.last_rv() == rv for s in live), 30, "the live watchers to reach %d" % rv)
        for _ in range(2):  # and a few more while it lags
            rv = e.sim("POST", "/apisim/churn", {"count": 100, "resources": ["pods"], "mix": {"update": 1.0}})["rv"]
            writes += 100
        final = rv
        slow.paused = False
        pump(streams, lambda: all(s.last_rv() == final for s in streams), 60, "every watcher to reach %d" % final)
        for s in streams:
            self.assertEqual(len(s.non_bookmarks()), writes)
        wait_for(lambda: lagging() == 0, 10, "the lagging gauge back to 0")
        m = parse(scrape_text(port))
        sent = {f: val(m, "kwc_watch_events_sent_total", **pods(**{"from": f}))
                for f in ("live", "window", "store", "initial")}
        self.assertEqual(sum(sent.values()), writes * (self.M_LIVE + 1), "events x matching watchers: %r" % sent)
        self.assertEqual(sent["initial"], 0)
        # (how they split between live and catch-up depends on timing: with a
        # 16 KiB budget and 16 KB events, a burst makes every watcher lag for
        # a moment; the paused one surely did)
        self.assertGreater(sent["window"] + sent["store"], 0, "the paused watcher caught up")
        wire = {f: val(m, "kwc_watch_sent_bytes_total", **pods(**{"from": f})) for f in sent}
        self.assertEqual(sum(wire.values()), sum(len(l) + 1 for s in streams for l in s.lines),
                         "the events' bytes, newline included")
        self.assertEqual(val(m, "kwc_reflector_events_total", **pods()), writes)
        self.assertEqual(val(m, "kwc_requests_in_flight", source="cache"), self.M_LIVE + 1)
        self.assertEqual(val(m, "kwc_watch_bookmarks_sent_total", **pods()), 0)

        # the watchers leave: each stream is one WATCH request, counted at its end
        for s in streams:
            s.close()
        # (the request is counted where it ends, the watcher where its
        # worker drops it: two threads, so both are waited for)
        def ended():
            m = parse(scrape_text(port))
            return (val(m, "kwc_requests_total", verb="WATCH", group="", resource="pods", code="200",
                        source="cache") == self.M_LIVE + 1 and val(m, "kwc_watchers", **pods()) == 0)
        wait_for(ended, 10, "the watch streams to be counted and their watchers gone")
        m = parse(scrape_text(port))
        self.assertEqual(val(m, "kwc_watchers", **pods()), 0)
        self.assertEqual(val(m, "kwc_requests_in_flight", source="cache"), 0)
        self.assertEqual(val(m, "kwc_request_duration_seconds_count", verb="WATCH", group="", resource="pods",
                             source="cache"), self.M_LIVE + 1)
        self.assertGreater(val(m, "kwc_response_bytes_total", verb="WATCH", group="", resource="pods",
                               source="cache"), sum(wire.values()))

        # one forced 410: the next upstream watch is answered 410 Gone, the
        # current one dropped; kwc relists (no change: no event) and watches again
        e.sim("POST", "/apisim/fail", {"count": 1, "match": "watch=true", "mode": "status", "status": 410})
        e.sim("POST", "/apisim/drop-watches", {})
        wait_for(lambda: val(parse(scrape_text(port)), "kwc_reflector_watches_total", **pods()) == 3, 20,
                 "kwc to watch again after the relist")
        m = parse(scrape_text(port))
        self.assertEqual(val(m, "kwc_reflector_expired_total", **pods()), 1)
        self.assertEqual(val(m, "kwc_reflector_relists_total", **pods()), 1)
        self.assertEqual(val(m, "kwc_reflector_lists_total", **pods()), 2)
        self.assertEqual(val(m, "kwc_reflector_watch_restarts_total", **pods()), 2)
        # the dropped watch (a connection aborted mid-stream) was a failed
        # attempt; the 410 is no error, it asks for the relist
        for ph, n in (("discovery", 0), ("list", 0), ("watch", 1)):
            self.assertEqual(val(m, "kwc_reflector_errors_total", **pods(phase=ph)), n, ph)
        self.assertEqual(val(m, "kwc_reflector_events_total", **pods()), writes, "a relist with no change")
        self.assertEqual(val(m, "kwc_cache_objects", **pods()), 10)
        self.assertEqual(val(m, "kwc_cache_history_events", **pods()), writes)
        self.assertGreater(val(m, "kwc_lmdb_map_used_bytes"), 0)
        self.assertLessEqual(val(m, "kwc_lmdb_map_used_bytes"), val(m, "kwc_lmdb_map_size_bytes"))

        # the exposition is valid for promtool
        text = scrape_text(port)
        r = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True)
        self.assertEqual(r.returncode, 0, r.stdout.decode() + r.stderr.decode())

        self.check_access_log(e, list_bytes)

    def check_access_log(self, e, list_bytes):
        with open(e.kwc.log_path, "rb") as f:
            raw = f.read().decode()
        self.assertNotIn(SECRET, raw, "a ?token= value reached the log")
        lines = [json.loads(l) for l in raw.splitlines() if l.startswith("{")]
        reqs = [l for l in lines if l.get("msg") == "request"]
        keys = {"time", "level", "msg", "method", "path", "proto", "user", "code", "bytes", "duration_ms", "source"}
        for l in reqs:
            self.assertEqual(set(l), keys, l)
            self.assertEqual(l["level"], "info")
        lists = [l for l in reqs if l["path"] == "/api/v1/pods?resourceVersion=0"]
        self.assertEqual(len(lists), self.N_LISTS)
        self.assertEqual(sum(l["bytes"] for l in lists), list_bytes)
        self.assertTrue(all(l["source"] == "cache" and l["code"] == 200 and l["user"] == "-" for l in lists))
        self.assertTrue(all(l["proto"] == "HTTP/1.1" for l in reqs), "the protocol of each request")
        pt = [l for l in reqs if l["path"].startswith("/api/v1/namespaces?")]
        self.assertEqual(len(pt), 1)
        self.assertEqual(pt[0]["path"], "/api/v1/namespaces?token=REDACTED&limit=5")
        self.assertEqual(pt[0]["source"], "upstream")
        watches = [l for l in reqs if "watch=1" in l["path"]]
        self.assertEqual(len(watches), self.M_LIVE + 1, "one line per watch stream, at its end")
        for w in watches:
            self.assertEqual((w["code"], w["source"], w["method"]), (200, "cache", "GET"))
            self.assertGreater(w["bytes"], 0)
            self.assertGreater(w["duration_ms"], 0)


class Exposition(unittest.TestCase):
    """A real Prometheus scrapes kwc and answers queries about its series."""

    def test_prometheus_scrapes_kwc(self):
        if not shutil.which("prometheus"):
            self.fail("prometheus is not installed (tests/lib/deps.sh test installs it)")
        with Env(apisim_args=["--pods", "3"], kwc_args=["--resources", "v1/pods"]) as e:
            http_request(e.kwc.port, "GET", "/api/v1/pods?resourceVersion=0")
            d = tempfile.mkdtemp(prefix="kwc-prom-")
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            prom_port = s.getsockname()[1]
            s.close()
            target = {"targets": ["127.0.0.1:%d" % e.kwc.port]}
            job = {"job_name": "kwc", "scrape_interval": "1s", "scrape_timeout": "1s",
                   "static_configs": [target]}
            t = tls_client(e.kwc.port)
            if t:
                job["scheme"] = "https"
                job["tls_config"] = {"ca_file": t.ca, "cert_file": t.cert, "key_file": t.key}
            cfg = os.path.join(d, "prometheus.yml")
            with open(cfg, "w") as f:
                json.dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [job]}, f)  # JSON is YAML
            log = open(os.path.join(d, "prometheus.log"), "wb")
            p = subprocess.Popen(["prometheus", "--config.file", cfg, "--storage.tsdb.path", os.path.join(d, "data"),
                                  "--web.listen-address", "127.0.0.1:%d" % prom_port, "--log.level", "warn"],
                                 stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            try:
                def query(q):
                    st, _, b = http_request(prom_port, "GET", "/api/v1/query?" + urllib.parse.urlencode({"query": q}),
                                            timeout=5)
                    if st != 200:
                        return None
                    return json.loads(b)["data"]["result"]

                def found():
                    if p.poll() is not None:
                        raise AssertionError("prometheus exited: %s" % open(log.name).read()[-2000:])
                    return query('kwc_requests_total{resource="pods",verb="LIST",source="cache"}')
                res = wait_for(found, 40, "Prometheus to have kwc's series", interval=0.2)
                self.assertEqual(res[0]["metric"]["code"], "200")
                self.assertEqual(float(res[0]["value"][1]), 1)
                up = wait_for(lambda: query('up{job="kwc"}'), 10, "up")
                self.assertEqual(up[0]["value"][1], "1")
                h = wait_for(lambda: query("kwc_request_duration_seconds_count"), 10, "a histogram")
                self.assertTrue(h)
                objs = wait_for(lambda: query('kwc_cache_objects{resource="pods"}'), 10, "a gauge")
                self.assertEqual(objs[0]["value"][1], "3")
            finally:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
                log.close()
                shutil.rmtree(d, ignore_errors=True)


@only_in_plaintext_run("sets up its own kwc with --auth delegated")
class Authorized(unittest.TestCase):
    """--auth delegated: /metrics is a non-resource URL kwc authorizes like
    kube-apiserver (a SubjectAccessReview with nonResourceAttributes)."""

    def test_metrics_needs_the_rule(self):
        toks = {"kwc": "tok-kwc-22", "prom": "tok-prom-22", "nobody": "tok-nobody-22"}
        policy = {"tokens": {toks[n]: {"user": n} for n in toks},
                  "rules": [{"users": ["kwc"], "verbs": ["get", "list", "watch"], "apiGroups": [""],
                             "resources": ["pods"]},
                            {"users": ["kwc"], "verbs": ["create"],
                             "apiGroups": ["authentication.k8s.io", "authorization.k8s.io"],
                             "resources": ["tokenreviews", "subjectaccessreviews"]},
                            {"users": ["prom"], "verbs": ["get"], "nonResourceURLs": ["/metrics"]}]}
        d = tempfile.mkdtemp(prefix="kwc-metrics-auth-")
        pf = os.path.join(d, "policy.json")
        with open(pf, "w") as f:
            json.dump(policy, f)
        procs = []
        try:
            sim = Proc("apisim", [PYTHON, APISIM, "--listen", "127.0.0.1:0", "--pods", "2", "--policy", pf], d)
            sim.start()
            procs.append(sim)
            kc = os.path.join(d, "kubeconfig")
            with open(kc, "w") as f:
                json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "c",
                           "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:%d" % sim.port}}],
                           "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                           "users": [{"name": "u", "user": {"token": toks["kwc"]}}]}, f)
            k = Proc("kwc", KWC_WRAP + [KWC_BIN] + KWC_EXTRA_ARGS +
                     ["--kubeconfig", kc, "--listen", "127.0.0.1:0", "--data-dir", os.path.join(d, "data"),
                      "--resources", "v1/pods", "--auth", "delegated", "--access-log"], d)
            k.start()
            procs.append(k)
            wait_for(lambda: http_request(k.port, "GET", "/readyz", timeout=2)[0] == 200, 30, "kwc /readyz")
            bearer = lambda n: {"Authorization": "Bearer " + toks[n]}
            st, _, b = http_request(k.port, "GET", "/metrics")
            self.assertEqual(st, 401, b)
            st, _, b = http_request(k.port, "GET", "/metrics", headers=bearer("nobody"))
            self.assertEqual(st, 403, b)
            status = json.loads(b)
            self.assertEqual(status["reason"], "Forbidden")
            self.assertEqual(status["message"], 'forbidden: User "nobody" cannot get path "/metrics"')
            m = parse(scrape_text(k.port, headers=bearer("prom")))
            self.assertEqual(val(m, "kwc_authorization_decisions_total", decision="denied"), 1)
            self.assertEqual(val(m, "kwc_authorization_decisions_total", decision="allowed"), 1)
            self.assertEqual(val(m, "kwc_authentication_failures_total"), 1)
            self.assertEqual(val(m, "kwc_requests_total", verb="GET", group="", resource="", code="403",
                                 source="kwc"), 1)
            self.assertEqual(val(m, "kwc_requests_total", verb="GET", group="", resource="", code="401",
                                 source="kwc"), 1)
            st, _, _ = http_request(k.port, "GET", "/healthz")
            self.assertEqual(st, 200, "/healthz needs no identity")
            # a request's line is written once its response has left (kube's
            # httplog too): the client may have read it first, and another
            # loop may log a later request sooner
            def logged():
                with open(k.log_path) as f:
                    log = f.read()
                return "user=prom" in log and "user=nobody" in log
            wait_for(logged, 30, "access-log lines of the scrapes")
            self.assertEqual(k.stop(), 0, k.logs())
        except BaseException:
            for p in procs:
                print("---- %s ----\n%s" % (p.name, p.logs()))
            raise
        finally:
            for p in reversed(procs):
                try:
                    p.stop()
                except RuntimeError:
                    pass
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
