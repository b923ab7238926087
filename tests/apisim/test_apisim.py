#!/usr/bin/python3
"""Tests for apisim (the Kubernetes API server emulator).

  /usr/bin/python3 tests/apisim/test_apisim.py [-v] [TestClass[.test_name] ...]

Starts apisim processes on ephemeral loopback ports (port learnt from --port-file,
polled with a deadline).  No test synchronises with sleeps: every wait polls an
observable condition or reads a stream with a deadline.
"""

import base64
import hashlib
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
APISIM = os.path.join(HERE, "apisim.py")
PY = "/usr/bin/python3"
TMP = tempfile.mkdtemp(prefix="apisim-test-")


def read_file(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def wait_for(pred, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.01)
    raise AssertionError("timed out waiting for %s" % what)


class Sim:
    """One apisim process."""

    count = 0

    def __init__(self, *args, tls=False):
        Sim.count += 1
        self.pf = os.path.join(TMP, "port-%d-%d" % (os.getpid(), Sim.count))
        self.log = open(self.pf + ".log", "w+")
        self.proc = subprocess.Popen([PY, APISIM, "--listen", "127.0.0.1:0", "--port-file", self.pf] + list(args),
                                     stdout=subprocess.PIPE, stderr=self.log)
        self.port = int(wait_for(lambda: read_file(self.pf), 60, "apisim port file"))
        self.banner = self.proc.stdout.readline().decode().strip()
        self.tls = tls
        self.ctx = None

    def conn(self, timeout=10, ctx=None):
        if self.tls:
            return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=ctx or self.ctx)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def req(self, method, path, body=None, headers=None, timeout=10, ctx=None):
        """headers: a dict, or a list of (name, value) to send a header more than once."""
        c = self.conn(timeout, ctx)
        h = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            if not any(k.lower() == "content-type" for k, _ in h):
                h.append(("Content-Type", "application/json"))
        try:
            if isinstance(body, str):
                body = body.encode("iso-8859-1")   # as http.client's request() does
            c.putrequest(method, path)
            for k, v in h:
                c.putheader(k, v)
            if body is not None or method in ("POST", "PUT", "PATCH"):
                c.putheader("Content-Length", str(len(body or b"")))
            c.endheaders(body)
            r = c.getresponse()
            data = r.read()
        finally:
            c.close()
        return r.status, r, data

    def json(self, method, path, body=None, headers=None, **kw):
        st, r, data = self.req(method, path, body, headers, **kw)
        try:
            return st, json.loads(data) if data else None
        except ValueError:
            raise AssertionError("not JSON (%d): %r" % (st, data[:300]))

    def get(self, path, **kw):
        return self.json("GET", path, **kw)

    def write(self, **kw):
        st, out = self.json("POST", "/apisim/write", kw)
        assert st == 200, out
        return out["rv"]

    def rv(self):
        return self.get("/apisim/stats")[1]["rv"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc.stdout.close()
        self.log.close()


class Stream:
    """A raw HTTP/1.1 GET whose chunked body is read as watch events, with deadlines."""

    def __init__(self, sim, path, headers=None, timeout=10):
        self.sock = socket.create_connection(("127.0.0.1", sim.port), timeout=timeout)
        h = "".join("%s: %s\r\n" % kv for kv in (headers or {}).items())
        self.sock.sendall(("GET %s HTTP/1.1\r\nHost: x\r\n%s\r\n" % (path, h)).encode())
        self.buf = b""
        self.lines = b""
        self.ended = False
        self.reset = False
        head = self._until(b"\r\n\r\n", time.monotonic() + timeout)
        lines = head.decode().split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        self.chunked = "chunked" in self.headers.get("transfer-encoding", "")
        self.raw_body = b""

    def _fill(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("deadline")
        self.sock.settimeout(left)
        try:
            d = self.sock.recv(1 << 20)
        except ConnectionResetError:
            d = b""
            self.reset = True
        if not d:
            raise EOFError("connection closed")
        self.buf += d

    def _until(self, sep, deadline):
        while sep not in self.buf:
            self._fill(deadline)
        i = self.buf.index(sep)
        out, self.buf = self.buf[:i], self.buf[i + len(sep):]
        return out

    def _chunk(self, deadline):
        size = int(self._until(b"\r\n", deadline).split(b";")[0], 16)
        if size == 0:
            self._until(b"\r\n", deadline)
            self.ended = True
            return None
        while len(self.buf) < size + 2:
            self._fill(deadline)
        data, self.buf = self.buf[:size], self.buf[size + 2:]
        return data

    def next(self, timeout=5):
        """The next event, or None at a clean end (terminal chunk).  Raises EOFError
        when the connection closes without a terminal chunk, socket.timeout on deadline."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.lines:
            if self.ended:
                return None
            c = self._chunk(deadline)
            if c is None:
                return None
            self.lines += c
        ln, self.lines = self.lines.split(b"\n", 1)
        return json.loads(ln)

    def collect(self, n, timeout=5):
        return [self.next(timeout) for _ in range(n)]

    def until(self, pred, timeout=5, limit=100000):
        """Events up to and including the first one satisfying pred."""
        out = []
        deadline = time.monotonic() + timeout
        for _ in range(limit):
            ev = self.next(max(0.01, deadline - time.monotonic()))
            if ev is None:
                raise AssertionError("stream ended before the expected event; got %s" % [e["type"] for e in out])
            out.append(ev)
            if pred(ev):
                return out
        raise AssertionError("event limit reached")

    def expect_quiet(self, timeout=0.3):
        """No event arrives within timeout (a bounded negative check)."""
        try:
            ev = self.next(timeout)
        except socket.timeout:
            return
        raise AssertionError("unexpected event %s" % (ev and ev.get("type")))

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def names(items):
    return [i["metadata"]["name"] for i in items]


def decode_token(tok):
    return json.loads(base64.urlsafe_b64decode(tok + "=" * (-len(tok) % 4)))


def ev_name(ev):
    return ev["object"]["metadata"].get("name")


SIM = None


def setUpModule():
    global SIM
    SIM = Sim("--pods", "30", "--nodes", "3", "--namespaces", "1", "--bookmark-interval", "0.3", "--seed", "7")


def tearDownModule():
    if SIM:
        SIM.stop()


# ---------------------------------------------------------------------------

class TestBasics(unittest.TestCase):
    def test_banner_and_version(self):
        self.assertEqual(SIM.banner, "apisim listening on http://127.0.0.1:%d" % SIM.port)
        st, v = SIM.get("/version")
        self.assertEqual(st, 200)
        self.assertEqual((v["major"], v["minor"], v["gitVersion"]), ("1", "31", "v1.31.0"))

    def test_discovery(self):
        st, api = SIM.get("/api")
        self.assertEqual(api["kind"], "APIVersions")
        self.assertEqual(api["versions"], ["v1"])
        st, core = SIM.get("/api/v1")
        res = {r["name"]: r for r in core["resources"]}
        self.assertEqual(res["pods"]["shortNames"], ["po"])
        self.assertTrue(res["pods"]["namespaced"])
        self.assertEqual(res["pods"]["kind"], "Pod")
        self.assertIn("watch", res["pods"]["verbs"])
        for sub in ("pods/status", "pods/exec", "pods/log"):
            self.assertIn(sub, res)
        self.assertFalse(res["nodes"]["namespaced"])
        self.assertEqual(res["namespaces"]["shortNames"], ["ns"])
        self.assertEqual(res["services"]["shortNames"], ["svc"])
        self.assertEqual(res["endpoints"]["shortNames"], ["ep"])
        self.assertEqual(res["configmaps"]["shortNames"], ["cm"])
        st, groups = SIM.get("/apis")
        self.assertEqual(groups["kind"], "APIGroupList")
        gn = [g["name"] for g in groups["groups"]]
        self.assertIn("apps", gn)
        self.assertIn("example.com", gn)
        st, apps = SIM.get("/apis/apps/v1")
        self.assertEqual(apps["groupVersion"], "apps/v1")
        self.assertEqual({r["name"]: r for r in apps["resources"]}["deployments"]["shortNames"], ["deploy"])
        st, ex = SIM.get("/apis/example.com/v1")
        self.assertEqual({r["name"]: r for r in ex["resources"]}["widgets"]["kind"], "Widget")
        # aggregated discovery when asked for (TestDiscovery), the plain form otherwise
        st, r, data = SIM.req("GET", "/apis", headers={
            "Accept": "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"})
        self.assertEqual(json.loads(data)["kind"], "APIGroupDiscoveryList")
        st, r, data = SIM.req("GET", "/apis", headers={"Accept": "application/json"})
        self.assertEqual(json.loads(data)["kind"], "APIGroupList")

    def test_http10_watch_is_close_delimited(self):
        sock = socket.create_connection(("127.0.0.1", SIM.port), timeout=10)
        sock.sendall(b"GET /api/v1/namespaces/default/pods?watch=1&timeoutSeconds=1&resourceVersion=%d HTTP/1.0\r\n"
                     b"\r\n" % SIM.rv())
        data = b""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            d = sock.recv(65536)
            if not d:
                break
            data += d
        sock.close()
        head = data.split(b"\r\n\r\n")[0].lower()
        self.assertIn(b" 200 ", head.split(b"\r\n")[0])
        self.assertNotIn(b"transfer-encoding", head)

    def test_unknown_paths(self):
        st, body = SIM.get("/api/v1/nosuchthings")
        self.assertEqual(st, 404)
        self.assertEqual(body["message"], "the server could not find the requested resource")
        st, body = SIM.get("/api/v1/namespaces/default/nodes")
        self.assertEqual(st, 404)
        st, body = SIM.json("POST", "/api/v1/namespaces/default/pods/pod-1", {})
        self.assertEqual(st, 405)
        self.assertEqual(body["reason"], "MethodNotAllowed")

    def test_object_shape(self):
        st, pod = SIM.get("/api/v1/namespaces/default/pods/pod-1")
        self.assertEqual(st, 200)
        self.assertEqual(list(pod)[:5], ["kind", "apiVersion", "metadata", "spec", "status"])
        md = pod["metadata"]
        for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "labels", "generation"):
            self.assertIn(k, md)
        self.assertIn("nodeName", pod["spec"])
        self.assertEqual(pod["status"]["phase"], "Running")
        self.assertIn("containerStatuses", pod["status"])
        st, r, data = SIM.req("GET", "/api/v1/namespaces/default/pods/pod-1")
        self.assertTrue(2000 <= len(data) <= 4096, len(data))
        self.assertNotIn(b" ", data[:200])   # compact encoding
        st, ns = SIM.get("/api/v1/namespaces/default")
        self.assertEqual(ns["status"]["phase"], "Active")
        st, node = SIM.get("/api/v1/nodes/node-0")
        self.assertEqual(node["kind"], "Node")
        self.assertNotIn("namespace", node["metadata"])

    def test_rv_is_global_and_increasing(self):
        a = SIM.write(verb="create", resource="configmaps", name="rv-a")
        b = SIM.write(verb="create", resource="secrets", name="rv-b")
        c = SIM.write(verb="update", resource="configmaps", name="rv-a", labels={"x": "1"})
        self.assertEqual((b, c), (a + 1, a + 2))
        st, cm = SIM.get("/api/v1/namespaces/default/configmaps/rv-a")
        self.assertEqual(cm["metadata"]["resourceVersion"], str(c))

    def test_http_details(self):
        # HEAD, keep-alive with several requests, chunked request body, Expect: 100-continue
        c = SIM.conn()
        c.request("HEAD", "/api/v1/namespaces/default/pods/pod-1")
        r = c.getresponse()
        self.assertEqual(r.status, 200)
        self.assertGreater(int(r.getheader("Content-Length")), 1000)
        self.assertEqual(r.read(), b"")
        for _ in range(3):
            c.request("GET", "/api/v1/namespaces/default/pods/pod-2")
            r = c.getresponse()
            self.assertEqual(json.loads(r.read())["metadata"]["name"], "pod-2")
        c.close()
        body = json.dumps({"metadata": {"name": "chunked-cm"}, "data": {"k": "v" * 5000}}).encode()
        s = socket.create_connection(("127.0.0.1", SIM.port), timeout=10)
        parts = [body[i:i + 1000] for i in range(0, len(body), 1000)]
        payload = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
        s.sendall(b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n")
        got = b""
        deadline = time.monotonic() + 10
        while b"100 Continue" not in got and time.monotonic() < deadline:
            got += s.recv(4096)
        self.assertIn(b"HTTP/1.1 100 Continue", got)
        s.sendall(payload)
        while b"201 Created" not in got and time.monotonic() < deadline:
            got += s.recv(65536)
        self.assertIn(b"HTTP/1.1 201 Created", got)
        s.close()
        # a 16 MB body
        big = {"metadata": {"name": "big-cm"}, "data": {"k": "x" * (16 << 20)}}
        st, out = SIM.json("POST", "/api/v1/namespaces/default/configmaps", big, timeout=60)
        self.assertEqual(st, 201)
        self.assertEqual(len(out["data"]["k"]), 16 << 20)
        st, out = SIM.json("DELETE", "/api/v1/namespaces/default/configmaps/big-cm")
        self.assertEqual(st, 200)


class TestWrites(unittest.TestCase):
    def test_create_get_update_patch_delete(self):
        base = "/api/v1/namespaces/default/configmaps"
        st, cm = SIM.json("POST", base, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w1"},
                                         "data": {"a": "1"}})
        self.assertEqual(st, 201)
        self.assertEqual(cm["metadata"]["generation"], 1)
        self.assertTrue(cm["metadata"]["uid"])
        st, err = SIM.json("POST", base, {"metadata": {"name": "w1"}})
        self.assertEqual(st, 409)
        self.assertEqual(err["reason"], "AlreadyExists")
        self.assertEqual(err["message"], 'configmaps "w1" already exists')
        self.assertEqual(err["details"], {"name": "w1", "kind": "configmaps"})
        st, err = SIM.json("POST", base, {"metadata": {}})
        self.assertEqual(st, 422)
        self.assertEqual(err["reason"], "Invalid")
        self.assertEqual(err["message"],
                         'ConfigMap "" is invalid: metadata.name: Required value: name or generateName is required')
        self.assertEqual(err["details"]["causes"][0]["field"], "metadata.name")
        st, err = SIM.json("POST", base, {"metadata": {"name": "Bad_Name"}})
        self.assertEqual(st, 422)
        self.assertTrue(err["message"].startswith('ConfigMap "Bad_Name" is invalid: metadata.name: Invalid value: '
                                                  '"Bad_Name": a lowercase RFC 1123 subdomain'))
        st, gen = SIM.json("POST", base, {"metadata": {"generateName": "gen-"}})
        self.assertEqual(st, 201)
        self.assertRegex(gen["metadata"]["name"], r"^gen-[a-z0-9]{5}$")
        st, err = SIM.json("POST", "/api/v1/namespaces/nosuchns/configmaps", {"metadata": {"name": "x"}})
        self.assertEqual((st, err["message"]), (404, 'namespaces "nosuchns" not found'))
        # update with a stale rv -> 409 Conflict
        stale = dict(cm)
        cm["data"] = {"a": "2"}
        st, cm2 = SIM.json("PUT", base + "/w1", cm)
        self.assertEqual(st, 200)
        self.assertGreater(int(cm2["metadata"]["resourceVersion"]), int(cm["metadata"]["resourceVersion"]))
        st, err = SIM.json("PUT", base + "/w1", stale)
        self.assertEqual(st, 409)
        self.assertEqual(err["reason"], "Conflict")
        self.assertEqual(err["message"], 'Operation cannot be fulfilled on configmaps "w1": the object has been '
                                         'modified; please apply your changes to the latest version and try again')
        # a no-op update does not take a new rv
        st, cm3 = SIM.json("PUT", base + "/w1", cm2)
        self.assertEqual(cm3["metadata"]["resourceVersion"], cm2["metadata"]["resourceVersion"])
        # merge patch and strategic merge patch
        st, p = SIM.json("PATCH", base + "/w1", {"metadata": {"labels": {"l": "v"}}, "data": {"b": "3"}},
                         headers={"Content-Type": "application/merge-patch+json"})
        self.assertEqual(st, 200)
        self.assertEqual(p["data"], {"a": "2", "b": "3"})
        self.assertEqual(p["metadata"]["labels"], {"l": "v"})
        st, p = SIM.json("PATCH", base + "/w1", {"data": {"a": None}},
                         headers={"Content-Type": "application/strategic-merge-patch+json"})
        self.assertEqual(p["data"], {"b": "3"})
        st, p = SIM.json("PATCH", base + "/w1", [{"op": "replace", "path": "/data/b", "value": "4"}],
                         headers={"Content-Type": "application/json-patch+json"})
        self.assertEqual(p["data"], {"b": "4"})
        st, err = SIM.json("PATCH", base + "/w1", {}, headers={"Content-Type": "text/plain"})
        self.assertEqual(st, 415)
        # delete: configmaps answer a Status, pods the object
        st, out = SIM.json("DELETE", base + "/w1")
        self.assertEqual(st, 200)
        self.assertEqual((out["kind"], out["status"], out["details"]["name"], out["details"]["kind"]),
                         ("Status", "Success", "w1", "configmaps"))
        st, err = SIM.json("DELETE", base + "/w1")
        self.assertEqual(st, 404)
        self.assertEqual(err, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                               "message": 'configmaps "w1" not found', "reason": "NotFound",
                               "details": {"name": "w1", "kind": "configmaps"}, "code": 404})
        st, err = SIM.get("/apis/apps/v1/namespaces/default/deployments/nope")
        self.assertEqual(err["message"], 'deployments.apps "nope" not found')
        self.assertEqual(err["details"], {"name": "nope", "group": "apps", "kind": "deployments"})

    def test_pod_delete_returns_object_and_status_subresource(self):
        SIM.write(verb="create", resource="pods", name="del-me")
        st, pod = SIM.get("/api/v1/namespaces/default/pods/del-me/status")
        self.assertEqual(st, 200)
        pod["status"]["phase"] = "Succeeded"
        pod["spec"]["nodeName"] = "changed-by-status-update"   # ignored by /status
        st, upd = SIM.json("PUT", "/api/v1/namespaces/default/pods/del-me/status", pod)
        self.assertEqual(st, 200)
        self.assertEqual(upd["status"]["phase"], "Succeeded")
        self.assertNotEqual(upd["spec"]["nodeName"], "changed-by-status-update")
        st, out = SIM.json("DELETE", "/api/v1/namespaces/default/pods/del-me",
                           {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "wrong"}})
        self.assertEqual(st, 409)
        self.assertIn("Precondition failed: UID in precondition: wrong", out["message"])
        st, out = SIM.json("DELETE", "/api/v1/namespaces/default/pods/del-me")
        self.assertEqual((st, out["kind"], out["metadata"]["name"]), (200, "Pod", "del-me"))
        self.assertGreater(int(out["metadata"]["resourceVersion"]), int(upd["metadata"]["resourceVersion"]))

    def test_deletecollection_and_namespace_cascade(self):
        SIM.json("POST", "/api/v1/namespaces", {"metadata": {"name": "gone"}})
        for i in range(4):
            SIM.write(verb="create", resource="configmaps", namespace="gone", name="g%d" % i,
                      labels={"odd": str(i % 2)})
        st, out = SIM.json("DELETE", "/api/v1/namespaces/gone/configmaps?labelSelector=odd%3D1")
        self.assertEqual((st, out["kind"], sorted(names(out["items"]))), (200, "ConfigMapList", ["g1", "g3"]))
        st, ns = SIM.json("DELETE", "/api/v1/namespaces/gone")
        self.assertEqual((st, ns["kind"]), (200, "Namespace"))
        st, l = SIM.get("/api/v1/namespaces/gone/configmaps")
        self.assertEqual(l["items"], [])

    def test_widgets_and_deployments(self):
        st, w = SIM.json("POST", "/apis/example.com/v1/namespaces/default/widgets",
                         {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "wid"},
                          "spec": {"size": 1}})
        self.assertEqual(st, 201)
        st, lst = SIM.get("/apis/example.com/v1/widgets")
        self.assertEqual(lst["kind"], "WidgetList")
        self.assertEqual(lst["apiVersion"], "example.com/v1")
        st, d = SIM.json("POST", "/apis/apps/v1/namespaces/default/deployments",
                         {"metadata": {"name": "dep"}, "spec": {"replicas": 2}})
        self.assertEqual(st, 201)
        self.assertEqual(d["apiVersion"], "apps/v1")
        st, sc = SIM.get("/apis/apps/v1/namespaces/default/deployments/dep/scale")
        self.assertEqual((sc["kind"], sc["spec"]["replicas"]), ("Scale", 2))
        st, sc = SIM.json("PATCH", "/apis/apps/v1/namespaces/default/deployments/dep/scale",
                          {"spec": {"replicas": 4}}, headers={"Content-Type": "application/merge-patch+json"})
        self.assertEqual((st, sc["spec"]["replicas"]), (200, 4))
        st, d = SIM.get("/apis/apps/v1/namespaces/default/deployments/dep")
        self.assertEqual((d["spec"]["replicas"], d["metadata"]["generation"]), (4, 2))


class TestListRV(unittest.TestCase):
    """The resourceVersion x resourceVersionMatch x limit/continue table."""

    ns = "rvtab"

    @classmethod
    def setUpClass(cls):
        st, _ = SIM.json("POST", "/api/v1/namespaces", {"metadata": {"name": cls.ns}})
        for i in range(10):
            SIM.write(verb="create", resource="configmaps", namespace=cls.ns, name="c%02d" % i)
        cls.rv_before = SIM.rv()
        SIM.write(verb="create", resource="configmaps", namespace=cls.ns, name="c99")   # after rv_before
        SIM.write(verb="delete", resource="configmaps", namespace=cls.ns, name="c00")
        cls.base = "/api/v1/namespaces/%s/configmaps" % cls.ns

    def lst(self, q):
        return SIM.get(self.base + "?" + q if q else self.base)

    def assert_422(self, q, message, causes):
        st, err = self.lst(q)
        self.assertEqual(st, 422, err)
        self.assertEqual(err["reason"], "Invalid")
        self.assertEqual(err["message"], message)
        self.assertEqual(err["details"]["group"], "meta.k8s.io")
        self.assertEqual(err["details"]["kind"], "ListOptions")
        self.assertEqual([(c["reason"], c["field"]) for c in err["details"]["causes"]], causes)

    def test_unset_most_recent(self):
        cur = SIM.rv()
        st, l = self.lst("")
        self.assertEqual(st, 200)
        self.assertEqual(l["kind"], "ConfigMapList")
        self.assertGreaterEqual(int(l["metadata"]["resourceVersion"]), cur)
        self.assertIn("c99", names(l["items"]))
        self.assertNotIn("c00", names(l["items"]))
        self.assertNotIn("continue", l["metadata"])
        self.assertNotIn("remainingItemCount", l["metadata"])
        self.assertEqual(names(l["items"]), sorted(names(l["items"])))

    def test_unset_limit_and_continue(self):
        st, full = self.lst("")
        st, p1 = self.lst("limit=4")
        self.assertEqual(names(p1["items"]), ["c01", "c02", "c03", "c04"])
        self.assertEqual(p1["metadata"]["remainingItemCount"], len(full["items"]) - 4)
        tok = p1["metadata"]["continue"]
        self.assertNotIn("=", tok)
        d = decode_token(tok)
        self.assertEqual(d, {"v": "meta.k8s.io/v1", "rv": int(p1["metadata"]["resourceVersion"]), "start": "c04\u0000"})
        # the raw token is exactly kube-apiserver's json.Marshal form
        raw = base64.urlsafe_b64decode(tok + "=" * (-len(tok) % 4)).decode()
        self.assertEqual(raw, '{"v":"meta.k8s.io/v1","rv":%s,"start":"c04\\u0000"}' % p1["metadata"]["resourceVersion"])
        # write between pages: the next page is still at the first page's rv
        SIM.write(verb="create", resource="configmaps", namespace=self.ns, name="c05a")
        SIM.write(verb="delete", resource="configmaps", namespace=self.ns, name="c06")
        st, p2 = self.lst("limit=4&continue=" + tok)
        self.assertEqual(p2["metadata"]["resourceVersion"], p1["metadata"]["resourceVersion"])
        self.assertEqual(names(p2["items"]), ["c05", "c06", "c07", "c08"])
        rest = names(full["items"])[8:]
        st, p3 = self.lst("limit=%d&continue=%s" % (len(rest), p2["metadata"]["continue"]))
        self.assertEqual(names(p3["items"]), rest)
        self.assertNotIn("continue", p3["metadata"])
        self.assertNotIn("remainingItemCount", p3["metadata"])
        # rv=0 with continue: "treated as continue token, exact"
        st, p2b = self.lst("limit=4&resourceVersion=0&continue=" + tok)
        self.assertEqual(names(p2b["items"]), ["c05", "c06", "c07", "c08"])
        SIM.write(verb="delete", resource="configmaps", namespace=self.ns, name="c05a")
        SIM.write(verb="create", resource="configmaps", namespace=self.ns, name="c06")

    def test_cluster_wide_token_key(self):
        st, l = SIM.get("/api/v1/configmaps?limit=1")
        d = decode_token(l["metadata"]["continue"])
        first = l["items"][0]["metadata"]
        self.assertEqual(d["start"], "%s/%s\u0000" % (first["namespace"], first["name"]))
        st, nodes = SIM.get("/api/v1/nodes?limit=1")
        self.assertEqual(decode_token(nodes["metadata"]["continue"])["start"], "node-0\u0000")

    def test_rv0_any_ignores_limit(self):
        st, l = self.lst("resourceVersion=0&limit=2")
        self.assertEqual(st, 200)
        self.assertGreater(len(l["items"]), 2)
        self.assertNotIn("continue", l["metadata"])
        st, l = self.lst("resourceVersion=0&resourceVersionMatch=NotOlderThan&limit=2")
        self.assertGreater(len(l["items"]), 2)

    def test_rvN_not_older_than(self):
        st, l = self.lst("resourceVersion=%d" % self.rv_before)
        self.assertEqual(st, 200)
        self.assertGreaterEqual(int(l["metadata"]["resourceVersion"]), self.rv_before)
        self.assertIn("c99", names(l["items"]))    # newest data, not the state at rv_before
        st, l = self.lst("resourceVersion=%d&resourceVersionMatch=NotOlderThan" % self.rv_before)
        self.assertIn("c99", names(l["items"]))
        st, l = self.lst("resourceVersion=%d&resourceVersionMatch=NotOlderThan&limit=3" % self.rv_before)
        self.assertEqual(len(l["items"]), 3)
        self.assertGreaterEqual(int(l["metadata"]["resourceVersion"]), SIM.rv() - 1)

    def test_rvN_limit_is_exact(self):
        st, l = self.lst("resourceVersion=%d&limit=100" % self.rv_before)
        self.assertEqual(st, 200)
        self.assertEqual(l["metadata"]["resourceVersion"], str(self.rv_before))
        self.assertEqual(names(l["items"]), ["c%02d" % i for i in range(10)])   # c00 back, c99 not yet

    def test_exact(self):
        for q in ("resourceVersion=%d&resourceVersionMatch=Exact",
                  "resourceVersion=%d&resourceVersionMatch=Exact&limit=100"):
            st, l = self.lst(q % self.rv_before)
            self.assertEqual(st, 200)
            self.assertEqual(l["metadata"]["resourceVersion"], str(self.rv_before))
            self.assertEqual(names(l["items"]), ["c%02d" % i for i in range(10)])
        st, l = self.lst("resourceVersion=%d&resourceVersionMatch=Exact&limit=3" % self.rv_before)
        self.assertEqual(names(l["items"]), ["c00", "c01", "c02"])
        self.assertEqual(decode_token(l["metadata"]["continue"])["rv"], self.rv_before)
        st, l2 = self.lst("limit=3&continue=" + l["metadata"]["continue"])
        self.assertEqual(names(l2["items"]), ["c03", "c04", "c05"])

    def test_invalid_combinations(self):
        f = "resourceVersionMatch: Forbidden: "
        self.assert_422("resourceVersionMatch=Exact",
                        'ListOptions.meta.k8s.io "" is invalid: ' + f +
                        "resourceVersionMatch is forbidden unless resourceVersion is provided",
                        [("FieldValueForbidden", "resourceVersionMatch")])
        self.assert_422("resourceVersionMatch=NotOlderThan",
                        'ListOptions.meta.k8s.io "" is invalid: ' + f +
                        "resourceVersionMatch is forbidden unless resourceVersion is provided",
                        [("FieldValueForbidden", "resourceVersionMatch")])
        self.assert_422("resourceVersion=0&resourceVersionMatch=Exact",
                        'ListOptions.meta.k8s.io "" is invalid: ' + f +
                        'resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                        [("FieldValueForbidden", "resourceVersionMatch")])
        self.assert_422("resourceVersion=5&resourceVersionMatch=Bogus",
                        'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Unsupported value: "Bogus": '
                        'supported values: "Exact", "NotOlderThan", ""',
                        [("FieldValueNotSupported", "resourceVersionMatch")])
        st, p = self.lst("limit=2")
        tok = p["metadata"]["continue"]
        self.assert_422("resourceVersion=5&resourceVersionMatch=Exact&continue=" + tok,
                        'ListOptions.meta.k8s.io "" is invalid: ' + f +
                        "resourceVersionMatch is forbidden when continue is provided",
                        [("FieldValueForbidden", "resourceVersionMatch")])
        self.assert_422("resourceVersionMatch=Exact&continue=" + tok,
                        'ListOptions.meta.k8s.io "" is invalid: [' + f +
                        "resourceVersionMatch is forbidden unless resourceVersion is provided, " + f +
                        "resourceVersionMatch is forbidden when continue is provided]",
                        [("FieldValueForbidden", "resourceVersionMatch")] * 2)
        self.assert_422("sendInitialEvents=true",
                        'ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is '
                        'forbidden for list', [("FieldValueForbidden", "sendInitialEvents")])
        st, err = self.lst("resourceVersion=%d&limit=2&continue=%s" % (self.rv_before, tok))
        self.assertEqual((st, err["reason"], err["message"]),
                         (400, "BadRequest", "specifying resource version is not allowed when using continue"))
        for bad, why in (("!!!", "illegal base64 data at input byte 0"), ("e30", ""),
                         (base64.urlsafe_b64encode(b'{"v":"meta.k8s.io/v1","rv":0,"start":"a"}').decode().rstrip("="),
                          "incorrect encoded start resourceVersion (version meta.k8s.io/v1)"),
                         (base64.urlsafe_b64encode(b'{"v":"meta.k8s.io/v1","rv":3,"start":""}').decode().rstrip("="),
                          "encoded start key empty (version meta.k8s.io/v1)"),
                         (base64.urlsafe_b64encode(b'{"v":"meta.k8s.io/v1","rv":3,"start":"../x"}').decode().rstrip("="),
                          "../x")):
            st, err = self.lst("limit=2&continue=" + bad)
            self.assertEqual(st, 400, bad)
            self.assertTrue(err["message"].startswith("invalid continue token: continue key is not valid"), err)
            self.assertIn(why, err["message"])
        st, err = self.lst("limit=abc")
        self.assertEqual((st, err["message"]), (400, 'strconv.ParseInt: parsing "abc": invalid syntax'))
        st, err = self.lst("resourceVersion=abc&limit=1")
        self.assertEqual(st, 400)
        self.assertEqual(err["message"], 'invalid resource version: resourceVersion: Invalid value: "abc": '
                                         'strconv.ParseUint: parsing "abc": invalid syntax')

    def test_too_large_rv(self):
        cur = SIM.rv()
        # etcd path (NotOlderThan with limit): at once, no Retry-After
        st, r, data = SIM.req("GET", self.base + "?resourceVersion=%d&resourceVersionMatch=NotOlderThan&limit=1"
                              % (cur + 1000))
        err = json.loads(data)
        self.assertEqual((st, err["reason"]), (504, "Timeout"))
        self.assertIsNone(r.getheader("Retry-After"))
        # watch-cache path: waits ~3 s, then 504 with Retry-After: 1
        t0 = time.monotonic()
        st, r, data = SIM.req("GET", self.base + "?resourceVersion=%d" % (cur + 1000))
        self.assertGreaterEqual(time.monotonic() - t0, 2.5)
        err = json.loads(data)
        self.assertEqual(st, 504)
        self.assertEqual(r.getheader("Retry-After"), "1")
        self.assertEqual(err["reason"], "Timeout")
        self.assertTrue(err["message"].startswith("Timeout: Too large resource version: %d, current: " % (cur + 1000)))
        self.assertEqual(err["details"]["causes"], [{"reason": "ResourceVersionTooLarge",
                                                     "message": "Too large resource version"}])
        self.assertEqual(err["details"]["retryAfterSeconds"], 1)
        # ... but answers as soon as the rv is reached
        holder = {}

        def bg():
            holder["r"] = SIM.get(self.base + "?resourceVersion=%d" % (cur + 2))
        th = threading.Thread(target=bg)
        th.start()
        SIM.write(verb="create", resource="configmaps", namespace=self.ns, name="late1")
        SIM.write(verb="create", resource="configmaps", namespace=self.ns, name="late2")
        th.join(10)
        st, l = holder["r"]
        self.assertEqual(st, 200)
        self.assertIn("late2", names(l["items"]))
        st, pod = SIM.get("/api/v1/namespaces/%s/configmaps/late2?resourceVersion=%d" % (self.ns, cur + 2))
        self.assertEqual(st, 200)


class TestCompaction(unittest.TestCase):
    def setUp(self):
        self.sim = Sim("--pods", "5", "--history", "50")

    def tearDown(self):
        self.sim.stop()

    def test_410s(self):
        s = self.sim
        st, p1 = s.get("/api/v1/pods?limit=2")
        tok = p1["metadata"]["continue"]
        old = s.rv()
        for i in range(3):
            s.write(verb="create", resource="pods", name="x%d" % i)
        st, out = s.json("POST", "/apisim/compact", {})
        self.assertEqual(out["floor"], s.rv())
        st, err = s.get("/api/v1/pods?resourceVersion=%d&resourceVersionMatch=Exact" % old)
        self.assertEqual((st, err["reason"], err["message"]),
                         (410, "Expired", "The resourceVersion for the provided list is too old."))
        st, err = s.get("/api/v1/pods?resourceVersion=%d&limit=3" % old)
        self.assertEqual(st, 410)
        st, err = s.get("/api/v1/pods?limit=2&continue=" + tok)
        self.assertEqual(st, 410)
        self.assertTrue(err["message"].startswith("The provided continue parameter is too old"))
        newtok = err["metadata"]["continue"]
        self.assertEqual(decode_token(newtok)["rv"], -1)
        st, p2 = s.get("/api/v1/pods?limit=2&continue=" + newtok)
        self.assertEqual(st, 200)
        self.assertEqual(p2["metadata"]["resourceVersion"], str(s.rv()))
        w = Stream(s, "/api/v1/pods?watch=1&resourceVersion=%d" % old)
        self.assertEqual(w.status, 200)
        ev = w.next()
        self.assertEqual(ev["type"], "ERROR")
        self.assertEqual(ev["object"], {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                        "message": "too old resource version: %d (%d)" % (old, s.rv()),
                                        "reason": "Expired", "code": 410})
        self.assertIsNone(w.next())
        w.close()
        # the history window (--history 50) also moves the floor
        for i in range(80):
            s.write(verb="update", resource="pods", name="x0", labels={"i": str(i)})
        st, stats = s.get("/apisim/stats")
        self.assertGreater(stats["floors"]["pods"], stats["floor"])
        w = Stream(s, "/api/v1/pods?watch=1&resourceVersion=%d" % (stats["floors"]["pods"] - 1))
        self.assertEqual(w.next()["type"], "ERROR")
        w.close()
        w = Stream(s, "/api/v1/pods?watch=1&resourceVersion=%d" % stats["floors"]["pods"])
        evs = w.collect(5)
        self.assertTrue(all(e["type"] == "MODIFIED" for e in evs))
        w.close()


class TestContinueChain(unittest.TestCase):
    def test_chain_consistent_under_churn(self):
        s = Sim("--pods", "300", "--nodes", "4", "--namespaces", "3")
        try:
            st, _ = s.json("POST", "/apisim/churn", {"rate": 1500, "resources": ["pods"],
                                                     "mix": {"update": 0.5, "create": 0.25, "delete": 0.25}})
            wait_for(lambda: s.get("/apisim/stats")[1]["events"] > 500, 10, "churn to start")
            got = []
            st, page = s.get("/api/v1/pods?limit=37")
            rv0 = page["metadata"]["resourceVersion"]
            total = len(page["items"]) + page["metadata"]["remainingItemCount"]
            for _ in range(100):
                got += page["items"]
                self.assertEqual(page["metadata"]["resourceVersion"], rv0)
                if not page["metadata"].get("continue"):
                    break
                st, page = s.get("/api/v1/pods?limit=37&continue=" + page["metadata"]["continue"])
                self.assertEqual(st, 200, page)
            s.json("POST", "/apisim/churn", {"rate": 0})
            st, exact = s.get("/api/v1/pods?resourceVersion=%s&resourceVersionMatch=Exact" % rv0)
            keys = ["%s/%s" % (i["metadata"]["namespace"], i["metadata"]["name"]) for i in got]
            self.assertEqual(keys, sorted(keys))
            self.assertEqual(len(got), total)
            self.assertEqual([(i["metadata"]["name"], i["metadata"]["resourceVersion"]) for i in got],
                             [(i["metadata"]["name"], i["metadata"]["resourceVersion"]) for i in exact["items"]])
            for i in got:
                self.assertLessEqual(int(i["metadata"]["resourceVersion"]), int(rv0))
        finally:
            s.stop()


class TestSelectors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        SIM.json("POST", "/api/v1/namespaces", {"metadata": {"name": "sel"}})
        for name, labels in (("a", {"env": "prod", "tier": "web"}), ("b", {"env": "dev", "tier": "web"}),
                             ("c", {"env": "prod"}), ("d", {})):
            SIM.write(verb="create", resource="pods", namespace="sel", name=name, labels=labels)

    def sel(self, q):
        st, l = SIM.get("/api/v1/namespaces/sel/pods?" + q)
        self.assertEqual(st, 200, l)
        return names(l["items"])

    def test_label_operators(self):
        self.assertEqual(self.sel("labelSelector=env%3Dprod"), ["a", "c"])
        self.assertEqual(self.sel("labelSelector=env%3D%3Dprod"), ["a", "c"])
        self.assertEqual(self.sel("labelSelector=env%21%3Dprod"), ["b", "d"])
        self.assertEqual(self.sel("labelSelector=env+in+(dev,prod),tier"), ["a", "b"])
        self.assertEqual(self.sel("labelSelector=env+notin+(prod)"), ["b", "d"])
        self.assertEqual(self.sel("labelSelector=tier"), ["a", "b"])
        self.assertEqual(self.sel("labelSelector=%21tier"), ["c", "d"])
        self.assertEqual(self.sel("labelSelector=env%3Dprod,%21tier"), ["c"])
        st, err = SIM.get("/api/v1/namespaces/sel/pods?labelSelector=env%20in%20prod")
        self.assertEqual((st, err["reason"]), (400, "BadRequest"))
        st, err = SIM.get("/api/v1/namespaces/sel/pods?labelSelector=a%3Db%3Dc")
        self.assertEqual(st, 400)

    def test_field_selectors(self):
        self.assertEqual(self.sel("fieldSelector=metadata.name%3Db"), ["b"])
        self.assertEqual(self.sel("fieldSelector=metadata.name%21%3Db"), ["a", "c", "d"])
        self.assertEqual(self.sel("fieldSelector=metadata.namespace%3Dsel,metadata.name%3Dc"), ["c"])
        st, pod = SIM.get("/api/v1/namespaces/default/pods/pod-1")
        node = pod["spec"]["nodeName"]
        st, l = SIM.get("/api/v1/pods?fieldSelector=spec.nodeName%3D" + node)
        self.assertTrue(l["items"] and all(i["spec"]["nodeName"] == node for i in l["items"]))
        st, l2 = SIM.get("/api/v1/pods?fieldSelector=spec.host%3D" + node)
        self.assertEqual(names(l2["items"]), names(l["items"]))
        st, l = SIM.get("/api/v1/pods?fieldSelector=status.phase%3DRunning,spec.restartPolicy%3DAlways")
        self.assertGreaterEqual(len(l["items"]), 30)
        st, l = SIM.get("/api/v1/pods?limit=5&fieldSelector=status.phase%3DRunning")
        self.assertEqual(len(l["items"]), 5)
        self.assertIn("continue", l["metadata"])
        self.assertNotIn("remainingItemCount", l["metadata"])     # selectors: unknown count
        st, l = SIM.get("/api/v1/secrets?fieldSelector=type%3DOpaque")
        self.assertEqual(st, 200)
        st, err = SIM.get("/api/v1/pods?fieldSelector=spec.bogus%3Dx")
        self.assertEqual((st, err["reason"], err["message"]), (400, "BadRequest", "field label not supported: spec.bogus"))
        st, err = SIM.get("/api/v1/nodes?fieldSelector=metadata.namespace%3Dx")
        self.assertEqual((st, err["message"]), (400, "field label not supported: metadata.namespace"))
        st, err = SIM.get("/api/v1/configmaps?fieldSelector=data.x%3Dy")
        self.assertEqual((st, err["message"]),
                         (400, '"data.x" is not a known field selector: only "metadata.name", "metadata.namespace"'))
        st, err = SIM.get("/api/v1/pods?fieldSelector=nonsense")
        self.assertEqual((st, err["message"]), (400, "invalid selector: 'nonsense'; can't understand 'nonsense'"))


class TestBooleans(unittest.TestCase):
    """Query booleans decode like kube-apiserver (runtime/conversion.go
    Convert_Slice_string_To_bool): only "0"/"false" (any case) are false."""

    def test_watch_param(self):
        for v in ("false", "False", "FALSE", "0"):
            st, l = SIM.get("/api/v1/namespaces/default/pods?limit=1&watch=" + v)
            self.assertEqual(l["kind"], "PodList", v)
        for v in ("true", "True", "1", "t", "yes", ""):
            w = Stream(SIM, "/api/v1/namespaces/default/pods?timeoutSeconds=5&watch=" + v)
            self.assertEqual(w.next()["type"], "ADDED", v)
            w.close()

    def test_bookmarks_param(self):
        w = Stream(SIM, "/api/v1/namespaces/default/pods?watch=1&allowWatchBookmarks=T&resourceVersion=%d"
                   % SIM.rv())
        ev = w.next(5)
        self.assertEqual(ev["type"], "BOOKMARK")
        w.close()


class TestWatch(unittest.TestCase):
    def test_rv_unset_and_zero_initial_state_then_live(self):
        for rvq in ("", "&resourceVersion=0"):
            w = Stream(SIM, "/api/v1/namespaces/default/pods?watch=true" + rvq)
            st, l = SIM.get("/api/v1/namespaces/default/pods")
            init = w.collect(len(l["items"]))
            self.assertTrue(all(e["type"] == "ADDED" for e in init))
            self.assertEqual(sorted(map(ev_name, init)), sorted(names(l["items"])))
            rv = SIM.write(verb="update", resource="pods", name="pod-3", labels={"w": rvq or "unset"})
            ev = w.next()
            self.assertEqual((ev["type"], ev_name(ev), ev["object"]["metadata"]["resourceVersion"]),
                             ("MODIFIED", "pod-3", str(rv)))
            w.close()

    def test_rvN_replays_history_without_gap_or_duplicate(self):
        start = SIM.rv()
        rvs = [SIM.write(verb="update", resource="pods", name="pod-4", labels={"n": str(i)}) for i in range(5)]
        w = Stream(SIM, "/api/v1/namespaces/default/pods?watch=1&resourceVersion=%d" % rvs[1])
        live = SIM.write(verb="update", resource="pods", name="pod-4", labels={"n": "live"})
        evs = w.collect(4)
        self.assertEqual([int(e["object"]["metadata"]["resourceVersion"]) for e in evs], rvs[2:] + [live])
        self.assertGreater(rvs[0], start)
        w.expect_quiet(0.2)
        w.close()

    def test_bookmarks(self):
        # --bookmark-interval 0.3 on this server
        w = Stream(SIM, "/api/v1/namespaces/default/pods?watch=1&allowWatchBookmarks=true&resourceVersion=%d"
                   % SIM.rv())
        t0 = time.monotonic()
        b1, b2 = w.collect(2, timeout=3)
        for ev in (b1, b2):
            self.assertEqual(ev["type"], "BOOKMARK")
            self.assertEqual(ev["object"], {"kind": "Pod", "apiVersion": "v1",
                                            "metadata": {"resourceVersion": str(SIM.rv())}})
        self.assertGreater(time.monotonic() - t0, 0.4)
        rv = SIM.write(verb="update", resource="pods", name="pod-9", labels={"bm": "1"})
        ev = w.until(lambda e: e["type"] == "BOOKMARK")[-1]
        self.assertEqual(ev["object"]["metadata"]["resourceVersion"], str(SIM.rv()))
        self.assertGreaterEqual(SIM.rv(), rv)
        w.close()
        # none within 2 s of the deadline (cache_watcher.go nextBookmarkTime): timeoutSeconds=2 gets none
        w = Stream(SIM, "/apis/apps/v1/deployments?watch=1&allowWatchBookmarks=true&timeoutSeconds=2"
                        "&resourceVersion=%d" % SIM.rv())
        self.assertIsNone(w.next(4))
        w.close()

    def test_timeout_seconds(self):
        t0 = time.monotonic()
        w = Stream(SIM, "/api/v1/namespaces/default/pods?watch=1&timeoutSeconds=1&resourceVersion=%d" % SIM.rv())
        self.assertIsNone(w.next(3))      # clean end: terminal chunk
        self.assertTrue(w.ended)
        self.assertTrue(0.9 < time.monotonic() - t0 < 2.5)
        w.close()

    def test_send_initial_events(self):
        w = Stream(SIM, "/api/v1/namespaces/default/pods?watch=1&sendInitialEvents=true&allowWatchBookmarks=true"
                        "&resourceVersionMatch=NotOlderThan")
        evs = w.until(lambda e: e["type"] == "BOOKMARK")
        bm = evs[-1]
        self.assertTrue(all(e["type"] == "ADDED" for e in evs[:-1]))
        self.assertGreaterEqual(len(evs) - 1, 30)
        self.assertEqual(bm["object"]["metadata"]["annotations"], {"k8s.io/initial-events-end": "true"})
        self.assertEqual(bm["object"]["kind"], "Pod")
        rv = SIM.write(verb="update", resource="pods", name="pod-5", labels={"sie": "1"})
        ev = w.until(lambda e: e["type"] == "MODIFIED")[-1]
        self.assertEqual(ev["object"]["metadata"]["resourceVersion"], str(rv))
        w.close()
        # validation (validateWatchOptions)
        st, err = SIM.get("/api/v1/pods?watch=1&sendInitialEvents=true")
        self.assertEqual(st, 422)
        self.assertEqual(err["message"], 'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
                                         'sendInitialEvents requires setting resourceVersionMatch to NotOlderThan')
        st, err = SIM.get("/api/v1/pods?watch=1&resourceVersionMatch=NotOlderThan")
        self.assertEqual(err["message"], 'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
                                         'resourceVersionMatch is forbidden for watch unless sendInitialEvents is '
                                         'provided')
        st, err = SIM.get("/api/v1/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=Exact")
        self.assertEqual(len(err["details"]["causes"]), 2)
        self.assertIn('resourceVersionMatch: Unsupported value: "Exact": supported values: "NotOlderThan"',
                      err["message"])

    def test_selector_transitions(self):
        SIM.write(verb="create", resource="pods", name="flip", labels={"color": "red"})
        w = Stream(SIM, "/api/v1/namespaces/default/pods?watch=1&labelSelector=color%%3Dblue&resourceVersion=%d"
                   % SIM.rv())
        r1 = SIM.write(verb="update", resource="pods", name="flip", labels={"color": "blue"})
        ev = w.next()
        self.assertEqual((ev["type"], ev_name(ev)), ("ADDED", "flip"))
        r2 = SIM.write(verb="update", resource="pods", name="flip", labels={"color": "blue", "x": "y"})
        self.assertEqual(w.next()["type"], "MODIFIED")
        r3 = SIM.write(verb="update", resource="pods", name="flip", labels={"color": "green"})
        ev = w.next()
        self.assertEqual(ev["type"], "DELETED")
        self.assertEqual(ev["object"]["metadata"]["labels"], {"color": "blue", "x": "y"})   # previous object
        self.assertEqual(ev["object"]["metadata"]["resourceVersion"], str(r3))              # the event's rv
        SIM.write(verb="update", resource="pods", name="flip", labels={"color": "red"})
        w.expect_quiet(0.2)
        w.close()
        self.assertLess(r1, r2)

    def test_single_object_and_legacy_paths(self):
        rv = SIM.rv()
        paths = ["/api/v1/namespaces/default/pods?watch=1&fieldSelector=metadata.name%%3Dpod-6&resourceVersion=%d",
                 "/api/v1/watch/namespaces/default/pods/pod-6?resourceVersion=%d",
                 "/api/v1/watch/namespaces/default/pods?resourceVersion=%d&fieldSelector=metadata.name%%3Dpod-6",
                 "/api/v1/watch/pods?resourceVersion=%d&fieldSelector=metadata.name%%3Dpod-6"]
        ws = [Stream(SIM, p % rv) for p in paths]
        SIM.write(verb="update", resource="pods", name="pod-7", labels={"other": "1"})
        r = SIM.write(verb="update", resource="pods", name="pod-6", labels={"me": "1"})
        for w in ws:
            ev = w.next()
            self.assertEqual((ev["type"], ev_name(ev), ev["object"]["metadata"]["resourceVersion"]),
                             ("MODIFIED", "pod-6", str(r)))
            w.close()
        w = Stream(SIM, "/apis/apps/v1/watch/deployments?resourceVersion=%d" % SIM.rv())
        self.assertEqual(w.status, 200)
        w.close()
        st, err = SIM.get("/api/v1/watch/namespaces/default/pods/pod-6?fieldSelector=metadata.name%3Dother")
        self.assertEqual((st, err["message"]), (400, "fieldSelector metadata.name doesn't match requested name"))

    def test_table_watch(self):
        w = Stream(SIM, "/api/v1/namespaces/default/pods?watch=1&resourceVersion=%d" % SIM.rv(),
                   headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"})
        SIM.write(verb="update", resource="pods", name="pod-8", labels={"t": "1"})
        SIM.write(verb="update", resource="pods", name="pod-8", labels={"t": "2"})
        e1, e2 = w.collect(2)
        self.assertEqual(e1["object"]["kind"], "Table")
        self.assertEqual(e1["object"]["columnDefinitions"][0]["name"], "Name")
        self.assertIsNone(e2["object"]["columnDefinitions"])
        self.assertEqual(e2["object"]["rows"][0]["cells"][0], "pod-8")
        self.assertEqual(e2["object"]["rows"][0]["object"]["kind"], "PartialObjectMetadata")
        w.close()


class TestTable(unittest.TestCase):
    TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io," \
            "application/json"

    def test_list_and_get(self):
        st, r, data = SIM.req("GET", "/api/v1/namespaces/default/pods?limit=3", headers={"Accept": self.TABLE})
        t = json.loads(data)
        self.assertEqual((t["kind"], t["apiVersion"]), ("Table", "meta.k8s.io/v1"))
        self.assertEqual([c["name"] for c in t["columnDefinitions"]][:5], ["Name", "Ready", "Status", "Restarts", "Age"])
        self.assertEqual([c["priority"] for c in t["columnDefinitions"]][5:], [1, 1, 1, 1])
        self.assertEqual(len(t["rows"]), 3)
        self.assertIn("continue", t["metadata"])
        row = t["rows"][0]
        self.assertEqual(row["cells"][1:3], ["1/1", "Running"])
        self.assertEqual(row["object"]["kind"], "PartialObjectMetadata")
        self.assertEqual(row["object"]["metadata"]["namespace"], "default")
        st, r, data = SIM.req("GET", "/api/v1/namespaces/default/pods/pod-1?includeObject=Object",
                              headers={"Accept": self.TABLE})
        t = json.loads(data)
        self.assertEqual(t["rows"][0]["object"]["kind"], "Pod")
        st, r, data = SIM.req("GET", "/api/v1/nodes", headers={"Accept": self.TABLE})
        self.assertEqual([c["name"] for c in json.loads(data)["columnDefinitions"]][:5],
                         ["Name", "Status", "Roles", "Age", "Version"])
        st, r, data = SIM.req("GET", "/api/v1/pods", headers={
            "Accept": "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io"})
        self.assertEqual(st, 406)   # Table has no protobuf form (TestProtobuf has the rest)
        st, r, data = SIM.req("GET", "/api/v1/namespaces/default/pods?limit=2", headers={
            "Accept": "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"})
        self.assertEqual(json.loads(data)["kind"], "PartialObjectMetadataList")


class TestControls(unittest.TestCase):
    def test_seed_state_stats(self):
        SIM.json("POST", "/apisim/reset-stats", {})
        st, out = SIM.json("POST", "/apisim/seed", {"resource": "configmaps", "namespace": "seeded", "count": 50,
                                                    "size": 1500})
        self.assertEqual((st, out["created"]), (200, 50))
        st, l = SIM.get("/api/v1/namespaces/seeded/configmaps")
        self.assertEqual(len(l["items"]), 50)
        st, r, data = SIM.req("GET", "/api/v1/namespaces/seeded/configmaps/%s" % l["items"][0]["metadata"]["name"])
        self.assertTrue(1400 <= len(data) <= 1600, len(data))
        st, state = SIM.get("/apisim/state?resource=configmaps&namespace=seeded")
        self.assertEqual(len(state["items"]), 50)
        self.assertEqual(set(state["items"][0]), {"key", "rv", "labels"})
        st, stats = SIM.get("/apisim/stats")
        self.assertEqual(stats["requests"].get("list configmaps"), 1)
        self.assertIn("pods", stats["objects"])
        for k in ("rv", "floor", "requests", "open_watches", "objects", "events"):
            self.assertIn(k, stats)

    def test_churn_written_at(self):
        s = Sim("--pods", "50")
        try:
            w = Stream(s, "/api/v1/pods?watch=1&resourceVersion=%d" % s.rv())
            st, out = s.json("POST", "/apisim/churn", {"rate": 2000, "resources": ["pods"], "label_flip": 0.5})
            self.assertEqual(out["rate"], 2000)
            evs = w.collect(200, timeout=5)
            s.json("POST", "/apisim/churn", {"rate": 0})
            now = time.time_ns()
            kinds = {e["type"] for e in evs}
            self.assertTrue({"ADDED", "MODIFIED", "DELETED"} <= kinds, kinds)
            for e in evs:
                wa = int(e["object"]["metadata"]["annotations"]["apisim.kwc.dev/written-at"])
                self.assertLess(now - wa, 10 * 10**9)
            self.assertTrue(any("flip" in (e["object"]["metadata"].get("labels") or {}) for e in evs))
            rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in evs]
            self.assertEqual(rvs, sorted(rvs))
            w.close()
        finally:
            s.stop()

    def test_churn_burst(self):
        s = Sim("--pods", "20")
        try:
            r0 = s.rv()
            w = Stream(s, "/api/v1/pods?watch=1&resourceVersion=%d" % r0)
            st, out = s.json("POST", "/apisim/churn", {"count": 300, "resources": ["pods"], "mix": {"update": 1.0}})
            self.assertEqual(st, 200, out)
            self.assertEqual(out, {"done": 300, "rv": r0 + 300})
            self.assertEqual(s.rv(), r0 + 300)
            self.assertEqual(s.get("/apisim/stats")[1]["churn"], {"rate": 0}, "a burst starts no churn")
            evs = w.collect(300, timeout=5)
            self.assertEqual([e["type"] for e in evs], ["MODIFIED"] * 300)
            self.assertEqual([int(e["object"]["metadata"]["resourceVersion"]) for e in evs],
                             list(range(r0 + 1, r0 + 301)))
            self.assertEqual(s.json("POST", "/apisim/churn", {"count": -1})[0], 400)
            w.close()
        finally:
            s.stop()

    def test_fail_modes(self):
        s = Sim("--pods", "3")
        try:
            s.json("POST", "/apisim/fail", {"count": 1, "match": "/pods/pod-1", "mode": "status", "status": 503})
            st, err = s.get("/api/v1/namespaces/default/pods/pod-1")
            self.assertEqual((st, err["code"], err["reason"]), (503, 503, "ServiceUnavailable"))
            self.assertEqual(s.get("/api/v1/namespaces/default/pods/pod-1")[0], 200)
            s.json("POST", "/apisim/fail", {"count": 1, "mode": "reset"})
            with self.assertRaises((http.client.RemoteDisconnected, ConnectionResetError, http.client.BadStatusLine)):
                s.get("/api/v1/pods")
            s.json("POST", "/apisim/fail", {"count": 1, "mode": "delay", "delay": 0.5})
            t0 = time.monotonic()
            self.assertEqual(s.get("/api/v1/pods")[0], 200)
            self.assertGreaterEqual(time.monotonic() - t0, 0.45)
            s.json("POST", "/apisim/fail", {"count": 1, "mode": "hang"})
            with self.assertRaises(socket.timeout):
                s.get("/api/v1/pods", timeout=0.5)
            self.assertEqual(s.get("/api/v1/pods")[0], 200)
            st, out = s.json("POST", "/apisim/fail", {"clear": True})
            self.assertEqual(out["pending"], [])
            # drop-watches: closed without a terminal chunk
            w = Stream(s, "/api/v1/pods?watch=1&resourceVersion=%d" % s.rv())
            wait_for(lambda: s.get("/apisim/stats")[1]["open_watches"].get("pods") == 1, 5, "watch open")
            st, out = s.json("POST", "/apisim/drop-watches", {"resource": "pods"})
            self.assertEqual(out["dropped"], 1)
            with self.assertRaises(EOFError):
                w.next(5)
            self.assertFalse(w.ended)
            w.close()
            wait_for(lambda: not s.get("/apisim/stats")[1]["open_watches"].get("pods"), 5, "watch gone")
        finally:
            s.stop()

    def test_recent_request_heads(self):
        s = Sim("--pods", "2")
        try:
            st, out = s.get("/apisim/requests")
            self.assertEqual((st, out), (200, {"seq": 0, "requests": []}))
            st, _, _ = s.req("GET", "/api/v1/namespaces/default/pods/pod-1?x=%41",
                             headers={"X-Remote-User": "admin", "Authorization": "Bearer t"})
            self.assertEqual(st, 200)
            s.req("GET", "/apisim/stats")  # /apisim/* is not recorded
            # an Upgrade request is recorded with its head, like any other
            sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
            sock.sendall(b"POST /api/v1/namespaces/default/pods/pod-0/exec?command=true&stdout=1 HTTP/1.1\r\n"
                         b"Host: h\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
                         b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\nImpersonate-User: u\r\n\r\n")
            self.assertTrue(sock.recv(4096).startswith(b"HTTP/1.1 101 "))
            sock.close()
            st, out = s.get("/apisim/requests")
            self.assertEqual(out["seq"], 2)
            a, b = out["requests"]
            self.assertEqual((a["seq"], a["method"], a["target"], a["version"]),
                             (1, "GET", "/api/v1/namespaces/default/pods/pod-1?x=%41", "HTTP/1.1"))
            self.assertEqual(a["headers"]["x-remote-user"], "admin")
            # whether Authorization was there, and its scheme, never the credential
            self.assertEqual((a["authorization"], a["headers"]["authorization"]), (True, "Bearer <redacted>"))
            self.assertNotIn("Bearer t\"", json.dumps(out))
            self.assertEqual((b["seq"], b["method"], b["authorization"]), (2, "POST", False))
            self.assertEqual((b["headers"]["upgrade"], b["headers"]["impersonate-user"]), ("SPDY/3.1", "u"))
            self.assertEqual(b["impersonate"], [["impersonate-user", "u"]])
            # a head apisim cannot parse is never dispatched, but it is counted
            sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
            sock.sendall(b"GET /a b HTTP/1.1\r\nHost: h\r\n\r\n")
            self.assertTrue(sock.recv(4096).startswith(b"HTTP/1.1 400 "))
            sock.close()
            st, stats = s.get("/apisim/stats")
            self.assertEqual(stats["requests"].get("http 400"), 1)
            self.assertEqual(s.get("/apisim/requests")[1]["seq"], 2)
            for i in range(205):  # only the latest 200 are kept
                s.req("GET", "/version")
            out = s.get("/apisim/requests")[1]
            self.assertEqual((out["seq"], len(out["requests"])), (207, 200))
            self.assertEqual((out["requests"][0]["seq"], out["requests"][-1]["seq"]), (8, 207))
        finally:
            s.stop()

    def test_echo_upgrade(self):
        sock = socket.create_connection(("127.0.0.1", SIM.port), timeout=5)
        sock.sendall(b"GET /apisim/echo-upgrade HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: kwc-echo\r\n\r\n")
        got = b""
        while b"\r\n\r\n" not in got:
            got += sock.recv(4096)
        head, _, rest = got.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 101 "))
        sock.sendall(b"ping-123")
        while len(rest) < 8:
            rest += sock.recv(4096)
        self.assertEqual(rest, b"ping-123")
        sock.close()


def ws_exec(sim, path, protocol="v5.channel.k8s.io", stdin=None):
    sock = socket.create_connection(("127.0.0.1", sim.port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(("GET %s HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                  "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Protocol: %s\r\n\r\n"
                  % (path, key, protocol)).encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = sock.recv(4096)
        if not d:
            break
        buf += d
    head, _, buf = buf.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    hdrs = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    if not lines[0].startswith("HTTP/1.1 101"):
        sock.close()
        return lines[0], hdrs, {}

    def send(payload):
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        sock.sendall(bytes([0x82, 0x80 | len(payload)]) + mask + masked)
    if stdin is not None:
        send(b"\x00" + stdin)
        send(b"\xff\x00")
    chans = {}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        while len(buf) < 2 or len(buf) < 2 + (buf[1] & 0x7F if buf[1] & 0x7F < 126 else 2):
            d = sock.recv(65536)
            if not d:
                return lines[0], hdrs, chans
            buf += d
        n = buf[1] & 0x7F
        pos = 2
        if n == 126:
            n = int.from_bytes(buf[2:4], "big")
            pos = 4
        while len(buf) < pos + n:
            buf += sock.recv(65536)
        op, payload, buf = buf[0] & 0x0F, buf[pos:pos + n], buf[pos + n:]
        if op == 0x8:
            break
        chans[payload[0]] = chans.get(payload[0], b"") + payload[1:]
    sock.close()
    return lines[0], hdrs, chans


class TestExec(unittest.TestCase):
    def test_websocket_exec(self):
        status, hdrs, ch = ws_exec(SIM, "/api/v1/namespaces/default/pods/pod-1/exec?command=echo&command=hello"
                                        "&command=world&stdout=true&stderr=true")
        self.assertTrue(status.startswith("HTTP/1.1 101"), status)
        self.assertEqual(hdrs["sec-websocket-protocol"], "v5.channel.k8s.io")
        self.assertEqual(ch[1], b"hello world\n")
        self.assertEqual(json.loads(ch[3]), {"metadata": {}, "status": "Success"})
        status, hdrs, ch = ws_exec(SIM, "/api/v1/namespaces/default/pods/pod-1/exec?command=sh&command=-c"
                                        "&command=exit%203&stdout=true", protocol="v4.channel.k8s.io")
        st = json.loads(ch[3])
        self.assertEqual((st["status"], st["reason"]), ("Failure", "NonZeroExitCode"))
        self.assertEqual(st["details"]["causes"], [{"reason": "ExitCode", "message": "3"}])
        status, hdrs, ch = ws_exec(SIM, "/api/v1/namespaces/default/pods/pod-1/exec?command=cat&stdin=true"
                                        "&stdout=true", stdin=b"from stdin")
        self.assertEqual(ch[1], b"from stdin")
        status, hdrs, ch = ws_exec(SIM, "/api/v1/namespaces/default/pods/nope/exec?command=ls&stdout=true")
        self.assertIn("404", status)


    def test_logs(self):
        st, r, data = SIM.req("GET", "/api/v1/namespaces/default/pods/pod-1/log?tailLines=3")
        self.assertEqual(st, 200)
        self.assertTrue(r.getheader("Content-Type").startswith("text/plain"))
        self.assertEqual(len(data.decode().splitlines()), 3)
        w = Stream(SIM, "/api/v1/namespaces/default/pods/pod-1/log?follow=true&tailLines=1")
        self.assertTrue(w.chunked)
        deadline = time.monotonic() + 5
        got = b""
        while got.count(b"\n") < 2:
            got += w._chunk(deadline)
        w.close()
        st, err = SIM.get("/api/v1/namespaces/default/pods/nope/log")
        self.assertEqual((st, err["message"]), (404, 'pods "nope" not found'))


class TestCLI(unittest.TestCase):
    def test_version_namespaces_sigterm(self):
        s = Sim("--pods", "9", "--namespaces", "3", "--nodes", "2", "--version", "1.33")
        try:
            st, v = s.get("/version")
            self.assertEqual((v["minor"], v["gitVersion"]), ("33", "v1.33.0"))
            st, l = s.get("/api/v1/pods")
            by_ns = {}
            for i in l["items"]:
                by_ns.setdefault(i["metadata"]["namespace"], []).append(i["spec"]["nodeName"])
            self.assertEqual(sorted(by_ns), ["ns-0", "ns-1", "ns-2"])
            self.assertEqual([len(v) for v in by_ns.values()], [3, 3, 3])
            self.assertEqual({n for v in by_ns.values() for n in v}, {"node-0", "node-1"})
            st, nodes = s.get("/api/v1/nodes")
            self.assertEqual(names(nodes["items"]), ["node-0", "node-1"])
            w = Stream(s, "/api/v1/pods?watch=1")
            w.collect(9)
            t0 = time.monotonic()
            s.proc.terminate()
            s.proc.wait(10)
            self.assertLess(time.monotonic() - t0, 2.0)
            self.assertEqual(s.proc.returncode, 0)
            w.close()
        finally:
            s.stop()


    def test_watch_list_modes(self):
        s = Sim("--watch-list", "on", "--pods", "2")
        try:
            # 1.32 semantics: rv unset/0 watches are defaulted to sendInitialEvents=true
            w = Stream(s, "/api/v1/pods?watch=1&allowWatchBookmarks=true")
            evs = w.until(lambda e: e["type"] == "BOOKMARK")
            self.assertEqual(len(evs), 3)
            self.assertEqual(evs[-1]["object"]["metadata"]["annotations"], {"k8s.io/initial-events-end": "true"})
            w.close()
        finally:
            s.stop()
        s = Sim("--watch-list", "off")
        try:
            st, err = s.get("/api/v1/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan")
            self.assertEqual(st, 422)
            self.assertEqual(err["message"], 'ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: '
                                             'sendInitialEvents is forbidden for watch unless the WatchList feature '
                                             'gate is enabled')
        finally:
            s.stop()

    def test_start_rv_and_cluster_uid(self):
        # --start-rv: the cluster's rv jumps after seeding, older ones compacted;
        # --cluster-uid: the kube-system namespace's uid; with --seed the same
        # objects again (a restart that looks like the same cluster)
        args = ("--pods", "2", "--start-rv", "500", "--cluster-uid", "uid-a", "--seed", "7")
        s = Sim(*args)
        try:
            st, ns = s.get("/api/v1/namespaces/kube-system")
            self.assertEqual((st, ns["metadata"]["uid"]), (200, "uid-a"))
            st, l = s.get("/api/v1/pods?limit=1")
            self.assertEqual(l["metadata"]["resourceVersion"], "500")
            reqs = s.get("/apisim/stats")[1]["requests"]
            self.assertEqual((reqs.get("probe pods"), reqs.get("list pods")), (1, None), "a probe, not a list")
            st, w = s.get("/api/v1/pods?watch=1&resourceVersion=10")
            self.assertEqual((w["type"], w["object"]["code"]), ("ERROR", 410), "compacted below it")
            self.assertEqual(s.write(verb="create", resource="pods", namespace="default", name="p"), 501)
            st, l = s.get("/api/v1/pods")
            uids = sorted(i["metadata"]["uid"] for i in l["items"] if i["metadata"]["name"] != "p")
        finally:
            s.stop()
        s = Sim(*args)
        try:
            st, l = s.get("/api/v1/pods")
            self.assertEqual(l["metadata"]["resourceVersion"], "500")
            self.assertEqual(sorted(i["metadata"]["uid"] for i in l["items"]), uids, "the same objects")
        finally:
            s.stop()
        # --fail: a fault rule in place before the first request
        s = Sim("--pods", "1", "--fail", json.dumps({"count": 1, "match": "/api/v1/pods?", "status": 503}))
        try:
            st, ns = s.get("/api/v1/namespaces/kube-system")
            self.assertNotEqual(ns["metadata"]["uid"], "uid-a", "another cluster by default")
            self.assertEqual(s.get("/api/v1/pods?limit=1")[0], 503, "the rule from the command line")
            self.assertLess(int(s.get("/api/v1/pods?limit=1")[1]["metadata"]["resourceVersion"]), 500)
        finally:
            s.stop()


class TestTokenFile(unittest.TestCase):
    def test_token_file_reread_expiry_revocation(self):
        # --token-file: tokens are read again when the file changes, one past its
        # expiry is refused, a removed one is refused; 401s are counted
        d = tempfile.mkdtemp(prefix="apisim-tf-")
        path = os.path.join(d, "tokens")

        def write(lines):
            with open(path + ".tmp", "w") as f:
                f.write("".join(l + "\n" for l in lines))
            os.rename(path + ".tmp", path)

        write(["alpha", "old %f" % (time.time() - 1)])
        s = Sim("--token-file", path)
        try:
            auth = lambda t: {"Authorization": "Bearer " + t}
            self.assertEqual(s.get("/api/v1/namespaces", headers=auth("alpha"))[0], 200)
            self.assertEqual(s.get("/api/v1/namespaces", headers=auth("old"))[0], 401)  # expired
            self.assertEqual(s.get("/api/v1/namespaces", headers=auth("beta"))[0], 401)
            self.assertEqual(s.get("/api/v1/namespaces")[0], 401)
            write(["beta %f" % (time.time() + 3600)])  # alpha revoked, beta added
            self.assertEqual(s.get("/api/v1/namespaces", headers=auth("beta"))[0], 200)
            self.assertEqual(s.get("/api/v1/namespaces", headers=auth("alpha"))[0], 401)
            self.assertEqual(s.get("/apisim/stats")[1]["requests"]["unauthorized"], 4)
        finally:
            s.stop()
            shutil.rmtree(d, ignore_errors=True)


class TestAuthTLS(unittest.TestCase):
    def test_tls_token_client_cert(self):
        if not shutil.which("openssl"):
            self.skipTest("openssl CLI not found")
        d = tempfile.mkdtemp(dir=TMP)

        def ossl(*a):
            subprocess.run(["openssl"] + list(a), cwd=d, check=True, capture_output=True)
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        ossl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=apisim-test-ca", "-days", "1")
        for n, cn in (("srv", "127.0.0.1"), ("cli", "tester")):
            ossl("req", *ec, "-keyout", n + ".key", "-out", n + ".csr", "-subj", "/CN=" + cn)
            with open(os.path.join(d, n + ".ext"), "w") as f:
                f.write("subjectAltName=IP:127.0.0.1\n" if n == "srv" else "extendedKeyUsage=clientAuth\n")
            ossl("x509", "-req", "-in", n + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", n + ".crt", "-days", "1", "-extfile", n + ".ext")
        p = lambda n: os.path.join(d, n)  # noqa: E731
        s = Sim("--tls-cert", p("srv.crt"), "--tls-key", p("srv.key"), "--client-ca", p("ca.crt"),
                "--token", "s3cret", tls=True)
        try:
            self.assertTrue(s.banner.startswith("apisim listening on https://127.0.0.1:"))
            s.ctx = ssl.create_default_context(cafile=p("ca.crt"))
            st, err = s.get("/api/v1/pods")
            self.assertEqual(st, 401)
            self.assertEqual(err, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                   "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
            st, err = s.get("/api/v1/pods", headers={"Authorization": "Bearer wrong"})
            self.assertEqual(st, 401)
            st, l = s.get("/api/v1/pods", headers={"Authorization": "Bearer s3cret"})
            self.assertEqual((st, l["kind"]), (200, "PodList"))
            cctx = ssl.create_default_context(cafile=p("ca.crt"))
            cctx.load_cert_chain(p("cli.crt"), p("cli.key"))
            st, l = s.get("/api/v1/namespaces", ctx=cctx)
            self.assertEqual(st, 200)
        finally:
            s.stop()


def sorted_everywhere(v):
    """True when every JSON object in v (parsed keeping key order) has its keys sorted."""
    if isinstance(v, list) and v and isinstance(v[0], tuple):   # an object as pairs
        keys = [k for k, _ in v]
        return keys == sorted(keys) and all(sorted_everywhere(x) for _, x in v)
    if isinstance(v, list):
        return all(sorted_everywhere(x) for x in v)
    return True


def pairs(data):
    return json.loads(data, object_pairs_hook=lambda kv: kv)


def raw_chunks(sim, path, n, timeout=5):
    """The first n chunks of a chunked response (status, headers, [chunk bytes])."""
    w = Stream(sim, path)
    try:
        deadline = time.monotonic() + timeout
        return w.status, w.headers, [w._chunk(deadline) for _ in range(n)]
    finally:
        w.close()


POD_TM = b'{"kind":"Pod","apiVersion":"v1",'


class TestWire(unittest.TestCase):
    """Byte-level fidelity to kube-apiserver's JSON (what kwc's differential tests compare)."""

    def test_builtin_list_items_have_no_typemeta(self):
        # kubernetes/kubernetes#3030, #63676: the list's kind/apiVersion are set, the items' are not
        for q in ("", "?resourceVersion=0", "?limit=4"):
            st, r, data = SIM.req("GET", "/api/v1/namespaces/default/pods" + q)
            self.assertEqual(st, 200)
            self.assertTrue(data.startswith(b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"'),
                            data[:80])
            self.assertIn(b'"items":[{"metadata":{"name":"', data)
            self.assertNotIn(b'"kind":"Pod"', data)
            self.assertTrue(data.endswith(b"]}\n"), data[-20:])
            l = json.loads(data)
            for item in l["items"]:
                self.assertEqual(list(item)[:3], ["metadata", "spec", "status"])
                # the GET of the same object: TypeMeta first, then exactly the list item's bytes
                st, r, one = SIM.req("GET", "/api/v1/namespaces/default/pods/" + item["metadata"]["name"])
                self.assertTrue(one.startswith(POD_TM + b'"metadata":'), one[:60])
                self.assertTrue(one.endswith(b"}\n") and not one.endswith(b"\n\n"))
                self.assertIn(b"{" + one[len(POD_TM):-1], data)
        # other built-ins, deletecollection and nodes alike
        for path, kind in (("/api/v1/nodes", b"Node"), ("/api/v1/namespaces", b"Namespace"),
                           ("/apis/apps/v1/deployments", b"Deployment")):
            st, r, data = SIM.req("GET", path)
            self.assertNotIn(b'"kind":"%s"' % kind, data)
        for i in range(3):
            SIM.write(verb="create", resource="configmaps", namespace="dc-wire", name="c%d" % i)
        st, r, data = SIM.req("DELETE", "/api/v1/namespaces/dc-wire/configmaps")
        self.assertTrue(data.startswith(b'{"kind":"ConfigMapList","apiVersion":"v1"'))
        self.assertEqual(data.count(b'{"metadata":{"name":"c'), 3)
        self.assertNotIn(b'"kind":"ConfigMap"', data)
        # watch event objects DO carry them, first
        st, h, chunks = raw_chunks(SIM, "/api/v1/namespaces/default/pods?watch=1&limit=1", 3)
        for c in chunks:
            self.assertTrue(c.startswith(b'{"type":"ADDED","object":' + POD_TM + b'"metadata":'), c[:80])

    def test_churned_objects_and_streamed_lists(self):
        s = Sim("--pods", "400", "--seed", "3")
        try:
            start = s.rv()
            s.json("POST", "/apisim/churn", {"rate": 3000, "resources": ["pods"], "label_flip": 0.3})
            wait_for(lambda: s.rv() > start + 300, 10, "churn")
            s.json("POST", "/apisim/churn", {"rate": 0})
            st, r, data = s.req("GET", "/api/v1/pods")
            self.assertGreater(len(data), 1 << 20)                     # the streamed (chunked) path
            self.assertEqual(r.getheader("Transfer-Encoding"), "chunked")
            l = json.loads(data)
            self.assertTrue(data.endswith(b"]}\n"))
            self.assertNotIn(b'"kind":"Pod"', data)
            self.assertEqual(data.count(b'{"metadata":{"name":"'), len(l["items"]))
            churned = [i["metadata"]["name"] for i in l["items"] if i["metadata"]["name"].startswith("churn-")]
            self.assertTrue(churned)
            for name in churned[:5] + [i["metadata"]["name"] for i in l["items"][:5]]:
                st, r, one = s.req("GET", "/api/v1/namespaces/default/pods/" + name)
                self.assertTrue(one.startswith(POD_TM + b'"metadata":'), one[:60])
                self.assertIn(b"{" + one[len(POD_TM):-1], data)
            # the history replayed to a watch: every object with its TypeMeta
            st, h, chunks = raw_chunks(s, "/api/v1/pods?watch=1&resourceVersion=%d" % (start + 1), 100)
            for c in chunks:
                self.assertRegex(c, rb'^\{"type":"(ADDED|MODIFIED|DELETED)","object":\{"kind":"Pod",'
                                    rb'"apiVersion":"v1","metadata":')
        finally:
            s.stop()

    def test_custom_resources_are_unstructured(self):
        base = "/apis/example.com/v1/namespaces/wire/widgets"
        SIM.json("POST", "/api/v1/namespaces", {"metadata": {"name": "wire"}})
        st, r, data = SIM.req("POST", base, {"kind": "Widget", "apiVersion": "example.com/v1",
                                             "metadata": {"name": "w1", "labels": {"z": "1", "a": "2"}},
                                             "spec": {"size": 3.0, "color": "red", "nested": {"y": [{"b": 1, "a": 2}],
                                                                                               "x": True}}})
        self.assertEqual(st, 201, data)
        self.assertTrue(data.startswith(b'{"apiVersion":"example.com/v1","kind":"Widget","metadata":{'), data[:80])
        self.assertTrue(data.endswith(b"}\n"))
        self.assertTrue(sorted_everywhere(pairs(data)), data)
        self.assertIn(b'"spec":{"color":"red","nested":{"x":true,"y":[{"a":2,"b":1}]},"size":3}', data)
        SIM.write(verb="create", resource="widgets", namespace="wire", name="w2")
        st, r, one = SIM.req("GET", base + "/w2")
        self.assertTrue(sorted_everywhere(pairs(one)), one)
        # the WidgetList: an UnstructuredList map, keys sorted; items keep apiVersion and kind
        st, r, data = SIM.req("GET", base)
        rv = json.loads(data)["metadata"]["resourceVersion"]
        self.assertTrue(data.startswith(b'{"apiVersion":"example.com/v1","items":[{"apiVersion":"example.com/v1",'
                                        b'"kind":"Widget","metadata":{'), data[:120])
        self.assertTrue(data.endswith(b'],"kind":"WidgetList","metadata":{"continue":"","resourceVersion":"%s"}}\n'
                                      % rv.encode()), data[-90:])
        self.assertIn(one[:-1], data)
        self.assertTrue(sorted_everywhere(pairs(data)))
        st, r, data = SIM.req("GET", base + "?limit=1")
        self.assertRegex(data, rb'\],"kind":"WidgetList","metadata":\{"continue":"[A-Za-z0-9_-]+",'
                               rb'"remainingItemCount":1,"resourceVersion":"\d+"\}\}\n$')
        st, r, data = SIM.req("GET", base + "?resourceVersion=0")
        self.assertTrue(data.endswith(b'"metadata":{"continue":"","resourceVersion":"%d"}}\n' % SIM.rv()))
        # watch events and bookmarks: sorted maps too
        rv = SIM.rv()
        w = Stream(SIM, "/apis/example.com/v1/widgets?watch=1&allowWatchBookmarks=true&resourceVersion=%d" % rv)
        SIM.write(verb="update", resource="widgets", namespace="wire", name="w2", labels={"k": "v"})
        deadline = time.monotonic() + 5
        c = w._chunk(deadline)
        self.assertTrue(c.startswith(b'{"type":"MODIFIED","object":{"apiVersion":"example.com/v1","kind":"Widget",'),
                        c[:100])
        self.assertTrue(sorted_everywhere(pairs(c)[1][1]))      # the WatchEvent itself is a struct: type, object
        c = w._chunk(deadline + 2)
        self.assertEqual(c, b'{"type":"BOOKMARK","object":{"apiVersion":"example.com/v1","kind":"Widget",'
                            b'"metadata":{"resourceVersion":"%d"}}}\n' % SIM.rv())
        w.close()
        # PartialObjectMetadata of a custom resource is typed: ObjectMeta order, not sorted
        st, r, data = SIM.req("GET", base + "/w1", headers={
            "Accept": "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"})
        self.assertEqual(list(json.loads(data)["metadata"])[:3], ["name", "namespace", "uid"])

    def test_newlines_content_types_headers(self):
        cases = [("/api/v1/namespaces/default/pods/pod-1", 200), ("/api/v1/namespaces/default/pods", 200),
                 ("/api/v1/namespaces/default/pods/nope", 404), ("/api/v1/nosuch", 404),
                 ("/api/v1/pods?labelSelector=%3D", 400), ("/api", 200), ("/apis", 200), ("/api/v1", 200),
                 ("/apis/apps/v1", 200)]
        ids = set()
        for path, code in cases:
            st, r, data = SIM.req("GET", path)
            self.assertEqual(st, code, path)
            # json.Encoder.Encode: one object, one newline
            self.assertTrue(data.endswith(b"}\n") and data.count(b"\n") == 1, (path, data[-30:]))
            self.assertEqual(r.getheader("Content-Type"), "application/json", path)
            self.assertEqual(r.getheader("Cache-Control"), "no-cache, private", path)
            self.assertRegex(r.getheader("X-Kubernetes-Pf-Flowschema-Uid"), r"^[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$")
            self.assertRegex(r.getheader("X-Kubernetes-Pf-Prioritylevel-Uid"), r"^[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$")
            ids.add(r.getheader("Audit-Id"))
        self.assertEqual(len(ids), len(cases))                    # a new Audit-Id per request
        st, r, data = SIM.req("GET", "/api/v1/namespaces/default/pods/pod-1", headers={"Audit-ID": "trace-42"})
        self.assertEqual(r.getheader("Audit-Id"), "trace-42")     # echoed (audit_init.go)
        # WriteRawJSON: MarshalIndent, no trailing newline
        st, r, data = SIM.req("GET", "/version")
        self.assertTrue(data.startswith(b'{\n  "major": "1",\n  "minor": "31",\n') and data.endswith(b'"\n}'), data)
        st, r, data = SIM.req("GET", "/")
        self.assertTrue(data.startswith(b'{\n  "paths": [\n    "/api",\n') and data.endswith(b"  ]\n}"), data)
        paths = json.loads(data)["paths"]
        self.assertEqual(paths, sorted(paths))
        # HEAD counts the newline
        c = SIM.conn()
        c.request("HEAD", "/api/v1/namespaces/default/pods/pod-1")
        r = c.getresponse()
        r.read()
        c.close()
        self.assertEqual(int(r.getheader("Content-Length")), len(SIM.req("GET", "/api/v1/namespaces/default/pods/pod-1")[2]))
        # a JSON watch: application/json (not ;stream=watch), one event + "\n" per chunk
        st, h, chunks = raw_chunks(SIM, "/api/v1/namespaces/default/pods?watch=1", 5)
        self.assertEqual((st, h["content-type"], h["transfer-encoding"]), (200, "application/json", "chunked"))
        self.assertIn("x-kubernetes-pf-flowschema-uid", h)
        for c in chunks:
            self.assertTrue(c.endswith(b"}\n") and c.count(b"\n") == 1, c[-40:])
            json.loads(c)
        # long-running non-watch requests skip APF: no flow-control headers on logs
        st, r, data = SIM.req("GET", "/api/v1/namespaces/default/pods/pod-1/log")
        self.assertIsNone(r.getheader("X-Kubernetes-Pf-Flowschema-Uid"))
        self.assertTrue(r.getheader("Audit-Id"))
        s = Sim("--token", "t0k")
        try:
            st, r, data = s.req("GET", "/api/v1/pods")
            self.assertEqual(st, 401)
            self.assertTrue(data.endswith(b'"code":401}\n'))
            self.assertIsNone(r.getheader("X-Kubernetes-Pf-Flowschema-Uid"))   # authn runs before APF
            self.assertTrue(r.getheader("Audit-Id"))
            st, r, data = s.req("GET", "/api/v1/pods", headers={"Authorization": "Bearer t0k"})
            self.assertTrue(r.getheader("X-Kubernetes-Pf-Flowschema-Uid"))
        finally:
            s.stop()

    def test_html_escaping_and_sorted_maps(self):
        val = "<a href='x'>&amp;</a>\u2028\u2029 é"
        st, r, data = SIM.req("POST", "/api/v1/namespaces/default/configmaps",
                              {"metadata": {"name": "esc", "annotations": {"note": "a<b"}},
                               "data": {"b": val, "a": "1"}})
        self.assertEqual(st, 201, data)
        want = ("\\u003ca href='x'\\u003e\\u0026amp;\\u003c/a\\u003e\\u2028\\u2029 é").encode()
        self.assertIn(b'"data":{"a":"1","b":"' + want + b'"}', data)     # map[string]string: sorted
        self.assertIn(b'"annotations":{"note":"a\\u003cb"}', data)
        for path in ("/api/v1/namespaces/default/configmaps/esc", "/api/v1/namespaces/default/configmaps"):
            st, r, got = SIM.req("GET", path)
            self.assertIn(want, got)
            for ch in (b"<", b">", b"&", "\u2028".encode()):
                self.assertNotIn(ch, got)
        self.assertEqual(json.loads(SIM.req("GET", "/api/v1/namespaces/default/configmaps/esc")[2])["data"]["b"], val)
        st, h, chunks = raw_chunks(SIM, "/api/v1/namespaces/default/configmaps?watch=1&fieldSelector="
                                        "metadata.name%3Desc", 1)
        self.assertIn(want, chunks[0])
        # Status messages too
        st, r, data = SIM.req("GET", "/api/v1/namespaces/default/configmaps/a&b")
        self.assertIn(b'"message":"configmaps \\"a\\u0026b\\" not found"', data)
        # a custom resource: same escaping
        st, r, data = SIM.req("POST", "/apis/example.com/v1/namespaces/default/widgets",
                              {"metadata": {"name": "esc"}, "spec": {"html": "<b>&"}})
        self.assertIn(b'"spec":{"html":"\\u003cb\\u003e\\u0026"}', data)


# ---------------------------------------------------------------------------
# --policy: authentication, impersonation, authorization, TokenReview, SAR
# ---------------------------------------------------------------------------

POLICY = {
    "tokens": {"tok-alice": {"user": "alice", "uid": "u-1", "groups": ["devs"], "extra": {"scopes": ["b", "a"]}},
               "tok-bob": {"user": "bob"}, "tok-rev": {"user": "reviewer", "groups": ["reviewers"]}},
    "rules": [
        {"users": ["alice"], "verbs": ["get", "list", "watch"], "resources": ["pods", "pods/log"],
         "namespaces": ["default"]},
        {"groups": ["reviewers"], "verbs": ["create"], "apiGroups": ["authentication.k8s.io", "authorization.k8s.io"],
         "resources": ["tokenreviews", "subjectaccessreviews"]},
        {"name": "bob-pod-1", "users": ["bob"], "verbs": ["get", "list", "watch"], "resources": ["pods"],
         "resourceNames": ["pod-1"]},
        {"users": ["alice"], "verbs": ["impersonate"], "resources": ["users"], "resourceNames": ["carol"]},
        {"users": ["alice"], "verbs": ["impersonate"], "resources": ["serviceaccounts"], "namespaces": ["ns1"]},
        {"groups": ["system:serviceaccounts:ns1"], "verbs": ["list"], "resources": ["configmaps"]},
        {"users": ["carol"], "verbs": ["list"], "resources": ["nodes"]},
        {"users": ["bob"], "verbs": ["get"], "nonResourceURLs": ["/metrics", "/debug/*"]},
    ]}


def status_bytes(message, reason, code, details=None):
    """A Status as kube-apiserver writes it (json.Encoder: compact, HTML-escaped, "\\n")."""
    st = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
          "reason": reason}
    if details is not None:
        st["details"] = details
    st["code"] = code
    out = json.dumps(st, separators=(",", ":"), ensure_ascii=False)
    return (out.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026") + "\n").encode()


# apimachinery/pkg/api/errors/errors.go NewUnauthorized("Unauthorized"), written by
# endpoints/filters/authentication.go Unauthorized (Details nil: no "details")
UNAUTHORIZED = (b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized",'
                b'"reason":"Unauthorized","code":401}\n')


def policy_sim(*args, policy=None, tls=False):
    d = tempfile.mkdtemp(dir=TMP)
    f = os.path.join(d, "policy.json")
    with open(f, "w") as fh:
        json.dump(POLICY if policy is None else policy, fh)
    return Sim("--pods", "3", "--policy", f, "--token", "admintok", *args, tls=tls)


def bearer(tok, **more):
    h = {"Authorization": "Bearer " + tok}
    h.update(more)
    return h


class TestPolicy(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = policy_sim()

    @classmethod
    def tearDownClass(cls):
        cls.s.stop()

    def forbidden(self, method, path, headers, message, details, pf=True):
        st, r, data = self.s.req(method, path, headers=headers)
        self.assertEqual(st, 403, data)
        # responsewriters/errors.go Forbidden: forbiddenMessage, sanitized, through
        # fmt.Errorf into apierrors.NewForbidden(GroupResource, Name, err): details
        # {name, group, kind} in StatusDetails field order, empty ones left out
        self.assertEqual(data, status_bytes(message, "Forbidden", 403, details))
        self.assertEqual(r.getheader("Content-Type"), "application/json")
        self.assertEqual(r.getheader("X-Content-Type-Options"), "nosniff")
        self.assertTrue(r.getheader("Audit-Id"))
        self.assertEqual(bool(r.getheader("X-Kubernetes-Pf-Flowschema-Uid")), pf)
        return r

    def test_unauthorized(self):
        for h in ({"Authorization": "Bearer nope"}, {"Authorization": "bearer nope"}):
            st, r, data = self.s.req("GET", "/api/v1/pods", headers=h)
            self.assertEqual((st, data), (401, UNAUTHORIZED))   # a bad token is never anonymous
            self.assertIsNone(r.getheader("X-Kubernetes-Pf-Flowschema-Uid"))
            self.assertEqual(self.s.req("GET", "/version", headers=h)[0], 401)
        # not a bearer token, or an empty one: no credentials -> anonymous
        self.forbidden("GET", "/api/v1/pods", {"Authorization": "Basic YTpi"},
                       'pods is forbidden: User "system:anonymous" cannot list resource "pods" in API group "" at '
                       'the cluster scope', {"kind": "pods"})
        self.assertEqual(self.s.req("GET", "/version", headers={"Authorization": "Bearer "})[0], 200)

    def test_forbidden_messages(self):
        ns = "/api/v1/namespaces/default"
        self.forbidden("GET", ns + "/pods", bearer("tok-bob"),
                       'pods is forbidden: User "bob" cannot list resource "pods" in API group "" in the namespace '
                       '"default"', {"kind": "pods"})
        self.forbidden("GET", ns + "/pods/pod-2", bearer("tok-bob"),
                       'pods "pod-2" is forbidden: User "bob" cannot get resource "pods" in API group "" in the '
                       'namespace "default"', {"name": "pod-2", "kind": "pods"})
        self.forbidden("GET", "/api/v1/nodes", bearer("tok-alice"),
                       'nodes is forbidden: User "alice" cannot list resource "nodes" in API group "" at the cluster '
                       'scope', {"kind": "nodes"})
        self.forbidden("GET", "/apis/apps/v1/namespaces/default/deployments/d1", bearer("tok-alice"),
                       'deployments.apps "d1" is forbidden: User "alice" cannot get resource "deployments" in API '
                       'group "apps" in the namespace "default"', {"name": "d1", "group": "apps", "kind": "deployments"})
        self.forbidden("PATCH", "/apis/apps/v1/namespaces/default/deployments/d1/scale", bearer("tok-alice"),
                       'deployments.apps "d1" is forbidden: User "alice" cannot patch resource "deployments/scale" '
                       'in API group "apps" in the namespace "default"',
                       {"name": "d1", "group": "apps", "kind": "deployments"})
        self.forbidden("DELETE", ns + "/pods", bearer("tok-alice"),
                       'pods is forbidden: User "alice" cannot deletecollection resource "pods" in API group "" in '
                       'the namespace "default"', {"kind": "pods"})
        self.forbidden("POST", ns + "/configmaps", bearer("tok-alice"),
                       'configmaps is forbidden: User "alice" cannot create resource "configmaps" in API group "" '
                       'in the namespace "default"', {"kind": "configmaps"})
        # subresources; log/exec are long-running non-watch requests: no APF headers
        self.forbidden("GET", ns + "/pods/pod-1/log", bearer("tok-bob"),
                       'pods "pod-1" is forbidden: User "bob" cannot get resource "pods/log" in API group "" in the '
                       'namespace "default"', {"name": "pod-1", "kind": "pods"}, pf=False)
        # exec: POST (SPDY) is create; a websocket GET is get in 1.31 (the create check of
        # AuthorizePodWebsocketUpgradeCreatePermission came later)
        self.forbidden("POST", ns + "/pods/pod-1/exec?command=true", bearer("tok-alice"),
                       'pods "pod-1" is forbidden: User "alice" cannot create resource "pods/exec" in API group "" '
                       'in the namespace "default"', {"name": "pod-1", "kind": "pods"}, pf=False)
        self.forbidden("GET", ns + "/pods/pod-1/exec?command=true", bearer("tok-alice", Upgrade="websocket",
                                                                           Connection="Upgrade"),
                       'pods "pod-1" is forbidden: User "alice" cannot get resource "pods/exec" in API group "" in '
                       'the namespace "default"', {"name": "pod-1", "kind": "pods"}, pf=False)
        # non-resource paths: verb = the lower-cased method, details {}
        self.forbidden("GET", "/metrics", bearer("tok-alice"),
                       'forbidden: User "alice" cannot get path "/metrics"', {})
        self.forbidden("POST", "/version", bearer("tok-alice"),
                       'forbidden: User "alice" cannot post path "/version"', {})
        # sanitizer (& < > as entities) and fmt.Errorf on the message (a % verb)
        self.forbidden("GET", "/a%3Cb%3E%26", bearer("tok-alice"),
                       'forbidden: User "alice" cannot get path "/a&lt;b&gt;&amp;"', {})
        self.forbidden("GET", "/a%25d", bearer("tok-alice"),
                       'forbidden: User "alice" cannot get path "/a%!d(MISSING)"', {})

    def test_allowed(self):
        ns = "/api/v1/namespaces/default"
        self.assertEqual(self.s.get(ns + "/pods", headers=bearer("tok-alice"))[0], 200)
        self.assertEqual(self.s.req("GET", ns + "/pods/pod-1/log", headers=bearer("tok-alice"))[0], 200)
        self.assertEqual(self.s.get("/api/v1/nodes", headers=bearer("admintok"))[0], 200)   # --token: system:masters
        self.assertEqual(self.s.json("POST", ns + "/configmaps", {"metadata": {"name": "m"}},
                                     headers=bearer("admintok"))[0], 201)
        # a nonResourceURLs rule (a trailing * is a prefix) matches paths only
        self.assertEqual(self.s.req("GET", "/metrics", headers=bearer("tok-bob"))[0], 404)   # allowed, not served
        self.assertEqual(self.s.req("GET", "/debug/x/y", headers=bearer("tok-bob"))[0], 404)
        self.assertEqual(self.s.req("GET", "/debug", headers=bearer("tok-bob"))[0], 403)

    def test_builtin_discovery_rules(self):
        # system:public-info-viewer (everyone) and system:discovery (authenticated only)
        for p in ("/version", "/healthz", "/livez", "/readyz"):
            self.assertEqual(self.s.req("GET", p)[0], 200, p)
        for p in ("/api", "/apis", "/api/v1", "/apis/apps/v1", "/openapi/v3"):
            self.assertEqual(self.s.req("GET", p, headers=bearer("tok-bob"))[0], 200, p)
        self.forbidden("GET", "/apis", {}, 'forbidden: User "system:anonymous" cannot get path "/apis"', {})
        self.forbidden("GET", "/api/v1", {}, 'forbidden: User "system:anonymous" cannot get path "/api/v1"', {})

    def test_field_selector_name(self):
        # requestinfo.go: a list/watch without a name takes metadata.name=X as its name
        pods = "/api/v1/namespaces/default/pods"
        st, l = self.s.get(pods + "?fieldSelector=metadata.name%3Dpod-1", headers=bearer("tok-bob"))
        self.assertEqual((st, [i["metadata"]["name"] for i in l["items"]]), (200, ["pod-1"]))
        self.assertEqual(self.s.get(pods + "?fieldSelector=metadata.name%3D%3Dpod-1%2Cstatus.phase%3DRunning",
                                    headers=bearer("tok-bob"))[0], 200)
        self.forbidden("GET", pods + "?fieldSelector=metadata.name%3Dpod-2", bearer("tok-bob"),
                       'pods "pod-2" is forbidden: User "bob" cannot list resource "pods" in API group "" in the '
                       'namespace "default"', {"name": "pod-2", "kind": "pods"})
        self.forbidden("GET", pods + "?fieldSelector=metadata.name!%3Dpod-1", bearer("tok-bob"),
                       'pods is forbidden: User "bob" cannot list resource "pods" in API group "" in the namespace '
                       '"default"', {"kind": "pods"})
        st, r, _ = self.s.req("GET", pods + "?watch=1&timeoutSeconds=1&fieldSelector=metadata.name%3Dpod-1",
                              headers=bearer("tok-bob"))
        self.assertEqual(st, 200)
        self.forbidden("GET", pods + "?watch=true&fieldSelector=metadata.name%3Dpod-2", bearer("tok-bob"),
                       'pods "pod-2" is forbidden: User "bob" cannot watch resource "pods" in API group "" in the '
                       'namespace "default"', {"name": "pod-2", "kind": "pods"})
        # a bad parameter: kube's fallback (list/watch by the watch parameter, no name)
        self.forbidden("GET", pods + "?watch=1&limit=x&fieldSelector=metadata.name%3Dpod-1", bearer("tok-bob"),
                       'pods is forbidden: User "bob" cannot watch resource "pods" in API group "" in the namespace '
                       '"default"', {"kind": "pods"})
        # /watch/ paths: verb watch from the path; the field selector gives no name there
        self.forbidden("GET", "/api/v1/watch/namespaces/default/pods?fieldSelector=metadata.name%3Dpod-1",
                       bearer("tok-bob"), 'pods is forbidden: User "bob" cannot watch resource "pods" in API group '
                       '"" in the namespace "default"', {"kind": "pods"})
        st, _, _ = self.s.req("GET", "/api/v1/watch/namespaces/default/pods/pod-1?timeoutSeconds=1",
                              headers=bearer("tok-bob"))
        self.assertEqual(st, 200)

    def test_impersonation(self):
        h = bearer("tok-alice")
        # allowed to be carol; then authorized as carol (who may list nodes only)
        self.assertEqual(self.s.get("/api/v1/nodes", headers=dict(h, **{"Impersonate-User": "carol"}))[0], 200)
        self.forbidden("GET", "/api/v1/namespaces/default/pods", dict(h, **{"Impersonate-User": "carol"}),
                       'pods is forbidden: User "carol" cannot list resource "pods" in API group "" in the '
                       'namespace "default"', {"kind": "pods"})
        # impersonation.go: each impersonated item is authorized with verb impersonate;
        # denied -> responsewriters.Forbidden before APF (no APF headers)
        self.forbidden("GET", "/api/v1/nodes", dict(h, **{"Impersonate-User": "dave"}),
                       'users "dave" is forbidden: User "alice" cannot impersonate resource "users" in API group "" '
                       'at the cluster scope', {"name": "dave", "kind": "users"}, pf=False)
        self.forbidden("GET", "/api/v1/nodes", dict(h, **{"Impersonate-User": "carol", "Impersonate-Group": "g1"}),
                       'groups "g1" is forbidden: User "alice" cannot impersonate resource "groups" in API group "" '
                       'at the cluster scope', {"name": "g1", "kind": "groups"}, pf=False)
        self.forbidden("GET", "/api/v1/nodes", dict(h, **{"Impersonate-User": "carol",
                                                          "Impersonate-Extra-Acme.io%2fScope": "v1"}),
                       'userextras.authentication.k8s.io "v1" is forbidden: User "alice" cannot impersonate resource '
                       '"userextras/acme.io/scope" in API group "authentication.k8s.io" at the cluster scope',
                       {"name": "v1", "group": "authentication.k8s.io", "kind": "userextras"}, pf=False)
        self.forbidden("GET", "/api/v1/nodes", dict(h, **{"Impersonate-User": "carol", "Impersonate-Uid": "u-9"}),
                       'uids.authentication.k8s.io "u-9" is forbidden: User "alice" cannot impersonate resource '
                       '"uids" in API group "authentication.k8s.io" at the cluster scope',
                       {"name": "u-9", "group": "authentication.k8s.io", "kind": "uids"}, pf=False)
        self.forbidden("GET", "/api/v1/nodes", dict(h, **{"Impersonate-User": "system:serviceaccount:ns2:sa1"}),
                       'serviceaccounts "sa1" is forbidden: User "alice" cannot impersonate resource '
                       '"serviceaccounts" in API group "" in the namespace "ns2"',
                       {"name": "sa1", "kind": "serviceaccounts"}, pf=False)
        # a service account gets system:serviceaccounts and system:serviceaccounts:NS
        sa = dict(h, **{"Impersonate-User": "system:serviceaccount:ns1:sa1"})
        self.assertEqual(self.s.get("/api/v1/namespaces/default/configmaps", headers=sa)[0], 200)
        self.forbidden("GET", "/api/v1/nodes", sa, 'nodes is forbidden: User "system:serviceaccount:ns1:sa1" cannot '
                       'list resource "nodes" in API group "" at the cluster scope', {"kind": "nodes"})
        # system:masters may impersonate anyone, groups too (repeated headers kept apart)
        st, r, data = self.s.req("GET", "/api/v1/namespaces/default/configmaps", headers=[
            ("Authorization", "Bearer admintok"), ("Impersonate-User", "zed"), ("Impersonate-Group", "x"),
            ("Impersonate-Group", "system:serviceaccounts:ns1")])
        self.assertEqual(st, 200, data)
        # groups without a user: buildImpersonationRequests' error -> responsewriters.InternalError
        # (http.Error: text/plain, nosniff, `Internal Server Error: %q: requested %v without
        # impersonating a user` with %v of []v1.ObjectReference)
        st, r, data = self.s.req("GET", "/api/v1/nodes?x=1", headers=[
            ("Authorization", "Bearer admintok"), ("Impersonate-Group", "g1"), ("Impersonate-Group", "g2"),
            ("Impersonate-Uid", "u")])
        self.assertEqual(st, 500)
        self.assertEqual(data, b'Internal Server Error: "/api/v1/nodes?x=1": requested [{Group  g1    } '
                               b'{Group  g2    } {UID  u  authentication.k8s.io/v1  }] without impersonating a user\n')
        self.assertEqual((r.getheader("Content-Type"), r.getheader("X-Content-Type-Options")),
                         ("text/plain; charset=utf-8", "nosniff"))
        # /apisim/requests keeps the Impersonate-* headers one by one
        reqs = self.s.get("/apisim/requests")[1]["requests"]
        self.assertEqual(reqs[-1]["impersonate"], [["impersonate-group", "g1"], ["impersonate-group", "g2"],
                                                    ["impersonate-uid", "u"]])
        self.assertEqual((reqs[-1]["authorization"], reqs[-1]["headers"]["authorization"]),
                         (True, "Bearer <redacted>"))

    def raw_head(self, lines):
        """One request written byte for byte (header lines as given, obs-fold and
        all): (status, the /apisim/requests record of it or None)."""
        seq = self.s.get("/apisim/requests")[1]["seq"]
        with socket.create_connection(("127.0.0.1", self.s.port), timeout=10) as c:
            c.sendall(b"GET /api/v1/namespaces/default/configmaps HTTP/1.1\r\n" +
                      b"".join(ln + b"\r\n" for ln in lines) + b"Host: x\r\nConnection: close\r\n\r\n")
            data = b""
            while True:
                d = c.recv(65536)
                if not d:
                    break
                data += d
        recs = self.s.get("/apisim/requests?since=%d" % seq)[1]["requests"]
        self.assertLessEqual(len(recs), 1)
        return int(data.split(b" ", 2)[1]), (recs[0] if recs else None)

    def test_identity_record(self):
        """/apisim/requests records who asked (requestor) and as whom the request
        ran (user), from kube's impersonation.go and Go's header parsing."""
        def ident(user, groups, uid="", extra=None):
            return {"user": user, "uid": uid, "groups": groups, "extra": extra or {}}
        alice = ident("alice", ["devs", "system:authenticated"], "u-1", {"scopes": ["b", "a"]})
        admin = ident("admin", ["system:masters", "system:authenticated"])
        seq = self.s.get("/apisim/requests")[1]["seq"]
        self.s.get("/api/v1/nodes", headers=dict(bearer("tok-alice"), **{"Impersonate-User": "carol"}))
        self.s.get("/api/v1/nodes", headers=dict(bearer("tok-alice"), **{"Impersonate-User": "dave"}))
        self.s.get("/api/v1/nodes", headers=bearer("nope"))
        self.s.get("/api/v1/nodes", headers=bearer("tok-alice"))
        recs = self.s.get("/apisim/requests?since=%d" % seq)[1]["requests"]
        self.assertEqual([r["seq"] for r in recs], list(range(seq + 1, seq + 5)))   # ?since=
        self.assertEqual([(r["requestor"], r["user"], r["authorized"]) for r in recs], [
            (alice, ident("carol", ["system:authenticated"]), True),
            (alice, None, None),            # impersonation refused (403)
            (None, None, None),             # 401
            (alice, alice, False)])         # no Impersonate-*: the requestor; then 403
        adm = b"Authorization: Bearer admintok"

        def ran_as(*lines):
            st, rec = self.raw_head([adm] + list(lines))
            self.assertIn(st, (200, 403), lines)   # 403: zed may not list configmaps
            self.assertEqual(rec["requestor"], admin)
            return rec["user"]
        # textproto: values trimmed of SP/HTAB only; obs-fold joined with one space
        self.assertEqual(ran_as(b"Impersonate-User:\t zed \t", b"Impersonate-Group: a ", b" \t b\t", b"impersonate-group:"),
                         ident("zed", ["a b", "", "system:authenticated"]))
        # headers.Get: the first Impersonate-User / -Uid, an empty one is none
        self.assertEqual(ran_as(b"Impersonate-User: zed", b"Impersonate-User: root", b"Impersonate-Uid: u1",
                                b"Impersonate-Uid: u2"), ident("zed", ["system:authenticated"], "u1"))
        self.assertEqual(ran_as(b"Impersonate-User:", b"Impersonate-User: root"), admin)
        self.assertEqual(ran_as(b"Impersonate-User: zed", b"Impersonate-Uid:", b"Impersonate-Uid: u2"),
                         ident("zed", ["system:authenticated"]))
        # a space before the colon: a name never canonicalized (go.dev/issue/34540), so no header kube knows
        self.assertEqual(ran_as(b"Impersonate-User : root"), admin)
        # unescapeExtraKey: lower-cased, then url.PathUnescape (raw when malformed); grouped by header name
        self.assertEqual(ran_as(b"Impersonate-User: zed", b"Impersonate-Extra-A%2Fb: 1", b"impersonate-extra-x%00y: 2",
                                b"Impersonate-Extra-%zz: 3", b"Impersonate-Extra-%C3%A9: 4", b"Impersonate-Extra-B: 5",
                                b"IMPERSONATE-EXTRA-a%2fB: 6", b"Impersonate-Extra-%41: 7", b"Impersonate-Extra-: 8"),
                         ident("zed", ["system:authenticated"], extra={"a/b": ["1", "6"], "x\x00y": ["2"], "%zz": ["3"],
                                                                       "\u00e9": ["4"], "b": ["5"], "A": ["7"], "": ["8"]}))
        # values are UTF-8 Go strings
        self.assertEqual(ran_as("Impersonate-User: zo\u00eb".encode()), ident("zo\u00eb", ["system:authenticated"]))
        # serviceaccount.SplitUsername: exactly NS:NAME, a DNS-1123 label and subdomain
        sa_groups = ["system:serviceaccounts", "system:serviceaccounts:ns1", "system:authenticated"]
        self.assertEqual(ran_as(b"Impersonate-User: system:serviceaccount:ns1:sa.x"),
                         ident("system:serviceaccount:ns1:sa.x", sa_groups))
        for bad in (b"ns1", b"ns1:", b":sa", b"ns1:a:b", b"NS1:sa", b"ns1:Sa", b"ns.1:sa"):
            self.assertEqual(ran_as(b"Impersonate-User: system:serviceaccount:" + bad),
                             ident("system:serviceaccount:" + bad.decode(), ["system:authenticated"]), bad)
        # what net/http refuses: a control byte in a value, a non-token byte in a name,
        # a continuation line first; never dispatched, so not recorded
        for lines in ([b"Impersonate-User: a\x0b"], [b"Impersonate-\xc3\xa9: x"], [b" Impersonate-User: a"],
                      [b"Impersonate-User\t: a"], [b": a"]):
            self.assertEqual(self.raw_head(lines), (400, None), lines)

    def review(self, kind, spec, tok="tok-rev", ua="kwc-test/1.0", **kw):
        group = "authentication.k8s.io" if kind == "TokenReview" else "authorization.k8s.io"
        body = {"apiVersion": group + "/v1", "kind": kind, "spec": spec}
        body.update(kw)
        st, r, data = self.s.req("POST", "/apis/%s/v1/%ss" % (group, kind.lower()), body=body,
                                 headers=bearer(tok, **{"User-Agent": ua}))
        return st, r, data

    def strip_time(self, data):
        d = json.loads(data)
        for mf in d["metadata"].get("managedFields", []):
            self.assertRegex(mf.pop("time"), r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        return d

    def test_token_review(self):
        st, r, data = self.review("TokenReview", {"token": "tok-alice"})
        self.assertEqual(st, 201, data)
        self.assertTrue(data.endswith(b"}\n"))
        # pkg/registry/authentication/tokenreview/storage.go: status.authenticated, user
        # (username, uid, groups incl. system:authenticated from the group adder, extra),
        # audiences (the API audiences the token authenticator is agnostic to)
        self.assertEqual(self.strip_time(data), {
            "kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None, "managedFields": [{
                "manager": "kwc-test", "operation": "Update", "apiVersion": "authentication.k8s.io/v1",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:token": {}}}}]},
            "spec": {"token": "tok-alice"},
            "status": {"authenticated": True, "user": {"username": "alice", "uid": "u-1",
                                                       "groups": ["devs", "system:authenticated"],
                                                       "extra": {"scopes": ["b", "a"]}},
                       "audiences": ["https://kubernetes.default.svc.cluster.local"]}})
        self.assertIn(b'"status":{"authenticated":true,"user":{"username":"alice","uid":"u-1",', data)
        st, r, data = self.review("TokenReview", {"token": "nope"})
        self.assertEqual(st, 201)
        self.assertIn(b'"spec":{"token":"nope"},"status":{"user":{},"error":"invalid bearer token"}}\n', data)
        st, r, data = self.review("TokenReview", {"token": "admintok", "audiences": ["x", "https://kubernetes."
                                                                                      "default.svc.cluster.local"]})
        self.assertIn(b'"fieldsV1":{"f:spec":{"f:audiences":{},"f:token":{}}}', data)
        self.assertIn(b'"status":{"authenticated":true,"user":{"username":"admin","groups":["system:masters",'
                      b'"system:authenticated"]},"audiences":["https://kubernetes.default.svc.cluster.local"]}}', data)
        st, r, data = self.review("TokenReview", {"token": "tok-alice", "audiences": ["other"]})
        self.assertIn(b'"status":{"user":{},"error":"invalid bearer token"}', data)
        st, r, data = self.review("TokenReview", {})
        self.assertEqual((st, data), (400, status_bytes("token is required for TokenReview in authentication",
                                                        "BadRequest", 400)))
        # the caller needs create on tokenreviews
        st, r, data = self.review("TokenReview", {"token": "tok-alice"}, tok="tok-bob")
        self.assertEqual((st, data), (403, status_bytes(
            'tokenreviews.authentication.k8s.io is forbidden: User "bob" cannot create resource "tokenreviews" in '
            'API group "authentication.k8s.io" at the cluster scope', "Forbidden", 403,
            {"group": "authentication.k8s.io", "kind": "tokenreviews"})))

    def test_subject_access_review(self):
        spec = {"resourceAttributes": {"namespace": "default", "verb": "get", "resource": "pods", "name": "p"},
                "user": "alice", "groups": ["devs"], "extra": {"k": ["v"]}, "uid": "u-1"}
        st, r, data = self.review("SubjectAccessReview", spec)
        self.assertEqual(st, 201, data)
        self.assertEqual(self.strip_time(data), {
            "kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": None, "managedFields": [{
                "manager": "kwc-test", "operation": "Update", "apiVersion": "authorization.k8s.io/v1",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {
                    "f:extra": {".": {}, "f:k": {}}, "f:groups": {},
                    "f:resourceAttributes": {".": {}, "f:name": {}, "f:namespace": {}, "f:resource": {}, "f:verb": {}},
                    "f:uid": {}, "f:user": {}}}}]},
            "spec": spec,
            "status": {"allowed": True, "reason": 'RBAC: allowed by RoleBinding "apisim-rule-0/default" of Role '
                                                  '"apisim-rule-0" to User "alice"'}})
        self.assertIn(b'"spec":{"resourceAttributes":{"namespace":"default","verb":"get","resource":"pods",'
                      b'"name":"p"},"user":"alice","groups":["devs"],"extra":{"k":["v"]},"uid":"u-1"}', data)
        # denied: RBAC has no opinion -> {"allowed":false} only
        st, r, data = self.review("SubjectAccessReview", {"resourceAttributes": {"verb": "list", "resource": "nodes"},
                                                          "user": "alice"})
        self.assertTrue(data.endswith(b'"status":{"allowed":false}}\n'), data)
        st, r, data = self.review("SubjectAccessReview", {"resourceAttributes": {"verb": "get", "resource": "pods",
                                                                                 "name": "pod-1"}, "user": "bob"})
        self.assertIn(b'"status":{"allowed":true,"reason":"RBAC: allowed by ClusterRoleBinding \\"bob-pod-1\\" of '
                      b'ClusterRole \\"bob-pod-1\\" to User \\"bob\\""}', data)
        # groups as given (nothing added); system:masters has no reason (privileged groups)
        st, r, data = self.review("SubjectAccessReview", {"nonResourceAttributes": {"path": "/version", "verb": "get"},
                                                          "groups": ["system:unauthenticated"]})
        self.assertIn(b'"spec":{"nonResourceAttributes":{"path":"/version","verb":"get"},"groups":["system:'
                      b'unauthenticated"]},"status":{"allowed":true,"reason":"RBAC: allowed by ClusterRoleBinding '
                      b'\\"system:public-info-viewer\\" of ClusterRole \\"system:public-info-viewer\\" to Group '
                      b'\\"system:unauthenticated\\""}}', data)
        st, r, data = self.review("SubjectAccessReview", {"nonResourceAttributes": {"path": "/api", "verb": "get"},
                                                          "user": "x"})
        self.assertTrue(data.endswith(b'"status":{"allowed":false}}\n'), data)
        st, r, data = self.review("SubjectAccessReview", {"resourceAttributes": {"verb": "delete", "resource": "x"},
                                                          "groups": ["system:masters"]})
        self.assertTrue(data.endswith(b'"status":{"allowed":true}}\n'), data)
        # validation.go ValidateSubjectAccessReviewSpec; NewInvalid of the internal object
        # (empty Kind: ".authorization.k8s.io")
        st, r, data = self.review("SubjectAccessReview", {})
        self.assertEqual(st, 422)
        self.assertEqual(data, status_bytes(
            '.authorization.k8s.io "" is invalid: [spec.resourceAttributes: Invalid value: "null": exactly one of '
            'nonResourceAttributes or resourceAttributes must be specified, spec.user: Invalid value: "": at least '
            'one of user or group must be specified]', "Invalid", 422, {"group": "authorization.k8s.io", "causes": [
                {"reason": "FieldValueInvalid", "message": 'Invalid value: "null": exactly one of '
                 'nonResourceAttributes or resourceAttributes must be specified', "field": "spec.resourceAttributes"},
                {"reason": "FieldValueInvalid", "message": 'Invalid value: "": at least one of user or group must be '
                 'specified', "field": "spec.user"}]}))
        st, r, data = self.review("SubjectAccessReview", {"resourceAttributes": {"verb": "get"}, "user": "u",
                                                          "nonResourceAttributes": {"path": "/x", "verb": "get"}})
        self.assertIn(b'"message":".authorization.k8s.io \\"\\" is invalid: spec.nonResourceAttributes: Invalid '
                      b'value: authorization.NonResourceAttributes{Path:\\"/x\\", Verb:\\"get\\"}: cannot be '
                      b'specified in combination with resourceAttributes"', data)
        st, r, data = self.review("SubjectAccessReview", {"user": "alice"}, tok="tok-alice")
        self.assertEqual(st, 403)
        self.assertIn(b'subjectaccessreviews.authorization.k8s.io is forbidden: User \\"alice\\" cannot create', data)

    def test_policy_replaced_at_run_time(self):
        s = policy_sim()
        try:
            pods = "/api/v1/namespaces/default/pods"
            self.assertEqual(s.get(pods, headers=bearer("tok-alice"))[0], 200)
            pol = json.loads(json.dumps(POLICY))
            pol["rules"] = pol["rules"][1:]   # alice's pod rule revoked
            st, out = s.json("POST", "/apisim/policy", pol)
            self.assertEqual((st, out), (200, {"ok": True, "tokens": 3, "rules": 7}))
            self.assertEqual(s.get(pods, headers=bearer("tok-alice"))[0], 403)
            self.assertEqual(s.get("/apisim/policy")[1]["policy"], pol)
            del pol["tokens"]["tok-alice"]    # and her token
            s.json("POST", "/apisim/policy", pol)
            self.assertEqual(s.get(pods, headers=bearer("tok-alice"))[0], 401)
            st, out = s.json("POST", "/apisim/policy", {"rules": 5})
            self.assertEqual(st, 400)
        finally:
            s.stop()

    def test_anonymous_auth_false(self):
        s = policy_sim("--anonymous-auth=false")
        try:
            for p in ("/version", "/healthz", "/api/v1/pods"):
                st, r, data = s.req("GET", p)
                self.assertEqual((st, data), (401, UNAUTHORIZED), p)
            self.assertEqual(s.req("GET", "/version", headers=bearer("tok-bob"))[0], 200)
            self.assertEqual(s.req("GET", "/api/v1/nodes", headers=bearer("admintok"))[0], 200)
        finally:
            s.stop()


def _pki():
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lib"))
    import certs
    return certs.pki()


@unittest.skipUnless(shutil.which("openssl"), "openssl CLI not found")
class TestPolicyClientCert(unittest.TestCase):
    def test_client_certificate_user(self):
        p = _pki()
        pol = {"rules": [{"groups": ["devs"], "verbs": ["list"], "resources": ["namespaces"]}]}
        s = policy_sim("--tls-cert", p.server.crt, "--tls-key", p.server.key, "--client-ca", p.client_ca.crt,
                       policy=pol, tls=True)
        try:
            s.ctx = ssl.create_default_context(cafile=p.ca.crt)
            cctx = ssl.create_default_context(cafile=p.ca.crt)
            cctx.load_cert_chain(p.client.crt, p.client.key)   # CN=alice, O=devs
            self.assertEqual(s.get("/api/v1/namespaces", ctx=cctx)[0], 200)
            st, r, data = s.req("GET", "/api/v1/nodes", ctx=cctx)
            self.assertEqual((st, data), (403, status_bytes(
                'nodes is forbidden: User "alice" cannot list resource "nodes" in API group "" at the cluster scope',
                "Forbidden", 403, {"kind": "nodes"})))
            # the certificate wins over a bearer token (x509 comes first), even a bad one
            self.assertEqual(s.get("/api/v1/namespaces", ctx=cctx, headers=bearer("nope"))[0], 200)
            st, r, data = s.req("GET", "/api/v1/namespaces")   # no certificate: anonymous
            self.assertIn(b'User \\"system:anonymous\\" cannot list', data)
            self.assertEqual(s.get("/api/v1/namespaces", headers=bearer("admintok"))[0], 200)
        finally:
            s.stop()


KUBECTL_DIR = None
if shutil.which("kubectl"):
    KUBECTL_DIR = os.path.dirname(os.path.realpath(shutil.which("kubectl")))


@unittest.skipUnless(KUBECTL_DIR, "kubectl not installed")
class TestKubectl(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.home = tempfile.mkdtemp(dir=TMP)
        cls.kc = os.path.join(cls.home, "kubeconfig")
        with open(cls.kc, "w") as f:
            f.write("apiVersion: v1\nkind: Config\nclusters:\n- cluster: {server: 'http://127.0.0.1:%d'}\n  name: sim\n"
                    "contexts:\n- context: {cluster: sim, user: u, namespace: default}\n  name: sim\n"
                    "current-context: sim\nusers:\n- name: u\n  user: {}\n" % SIM.port)

    def kubectl(self, binary, *args, stdin=None, check=True):
        env = dict(os.environ, HOME=self.home, KUBECONFIG=self.kc)
        exe = os.path.join(KUBECTL_DIR, binary) if binary != "kubectl" else shutil.which("kubectl")
        r = subprocess.run([exe] + list(args), env=env, input=stdin, capture_output=True, timeout=60)
        if check and r.returncode != 0:
            raise AssertionError("%s %s failed: %s" % (binary, " ".join(args), r.stderr.decode()))
        return r

    def versions(self):
        return [b for b in ("kubectl", "kubectl.1.27", "kubectl.1.33")
                if b == "kubectl" or os.path.exists(os.path.join(KUBECTL_DIR, b))]

    def test_get_create_delete(self):
        for b in self.versions():
            with self.subTest(kubectl=b):
                out = self.kubectl(b, "get", "pods", "-A", "-o", "name").stdout.decode().split()
                self.assertIn("pod/pod-1", out)
                table = self.kubectl(b, "get", "pods").stdout.decode().splitlines()
                self.assertEqual(table[0].split()[:5], ["NAME", "READY", "STATUS", "RESTARTS", "AGE"])
                self.assertTrue(any(ln.split()[:3] == ["pod-1", "1/1", "Running"] for ln in table[1:]))
                wide = self.kubectl(b, "get", "pods", "-o", "wide").stdout.decode().splitlines()
                self.assertIn("NODE", wide[0].split())
                lst = json.loads(self.kubectl(b, "get", "pods", "-o", "json").stdout)
                self.assertEqual(lst["kind"], "List")
                self.assertGreaterEqual(len(lst["items"]), 30)
                SIM.json("POST", "/apisim/reset-stats", {})
                chunked = self.kubectl(b, "get", "pods", "--chunk-size=7", "-o", "name").stdout.decode().split()
                self.assertEqual(sorted(chunked), sorted("pod/" + i["metadata"]["name"] for i in lst["items"]))
                self.assertGreaterEqual(SIM.get("/apisim/stats")[1]["requests"]["list pods"], 5)
                name = "kc-" + b.replace(".", "-")
                manifest = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                                       "data": {"k": "v"}}).encode()
                self.assertIn(b"created", self.kubectl(b, "create", "-f", "-", stdin=manifest).stdout)
                self.assertEqual(SIM.get("/api/v1/namespaces/default/configmaps/" + name)[0], 200)
                self.assertIn(b"deleted", self.kubectl(b, "delete", "configmap", name).stdout)
                self.assertEqual(SIM.get("/api/v1/namespaces/default/configmaps/" + name)[0], 404)
                r = self.kubectl(b, "get", "configmap", name, check=False)
                self.assertNotEqual(r.returncode, 0)
                self.assertIn(('configmaps "%s" not found' % name).encode(), r.stderr)
                raw = json.loads(self.kubectl(b, "get", "--raw", "/api/v1/pods?limit=1").stdout)
                self.assertEqual(len(raw["items"]), 1)
                self.assertIn("continue", raw["metadata"])

    def test_exec_websocket(self):
        # the default kubectl dispatches to the kubectl matching the server (1.31), which
        # uses websockets for exec
        r = self.kubectl("kubectl", "exec", "pod-1", "--", "echo", "hello")
        self.assertEqual(r.stdout, b"hello\n")
        r = self.kubectl("kubectl", "exec", "pod-1", "--", "sh", "-c", "exit 3", check=False)
        self.assertEqual(r.returncode, 3)
        r = self.kubectl("kubectl", "exec", "-i", "pod-1", "--", "cat", stdin=b"piped")
        self.assertEqual(r.stdout, b"piped")

    def test_exec_spdy(self):
        # kubectl <= 1.29 uses SPDY/3.1 for exec
        if not os.path.exists(os.path.join(KUBECTL_DIR, "kubectl.1.27")):
            self.skipTest("kubectl.1.27 not installed")
        r = self.kubectl("kubectl.1.27", "exec", "pod-1", "--", "echo", "over", "spdy")
        self.assertEqual(r.stdout, b"over spdy\n")
        r = self.kubectl("kubectl.1.27", "exec", "pod-1", "--", "sh", "-c", "exit 4", check=False)
        self.assertEqual(r.returncode, 4)
        r = self.kubectl("kubectl.1.27", "exec", "-i", "pod-1", "--", "cat", stdin=b"spdy stdin")
        self.assertEqual(r.stdout, b"spdy stdin")

    def test_watch(self):
        env = dict(os.environ, HOME=self.home, KUBECONFIG=self.kc)
        p = subprocess.Popen([shutil.which("kubectl"), "get", "pods", "-w", "--request-timeout=20s"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            first = p.stdout.readline()
            self.assertTrue(first.startswith(b"NAME"), first)
            wait_for(lambda: SIM.get("/apisim/stats")[1]["open_watches"].get("pods"), 20, "kubectl watch")
            SIM.write(verb="create", resource="pods", name="kubectl-watched")
            for _ in range(200):
                ln = p.stdout.readline()
                if not ln or ln.startswith(b"kubectl-watched"):
                    break
            self.assertTrue(ln.startswith(b"kubectl-watched"), ln)
        finally:
            p.kill()
            p.wait(10)
            p.stdout.close()
            p.stderr.close()


# ---------------------------------------------------------------------------
# protobuf (application/vnd.kubernetes.protobuf), decoded independently of apisim
# with Debian's python3-protobuf and message classes built here from this test's own
# transcription of kube's generated.proto field numbers (descriptor_pb2, no protoc).
# ---------------------------------------------------------------------------

PB = "application/vnd.kubernetes.protobuf"

# "Message": "field=number:type ...": type is string/int64/int32/bool/bytes or a
# message; "*T" repeated; "{T}" map<string, T>.
PB_TEST_MESSAGES = {
    "TypeMeta": "apiVersion=1:string kind=2:string",
    "Unknown": "typeMeta=1:TypeMeta raw=2:bytes contentEncoding=3:string contentType=4:string",
    "RawExtension": "raw=1:bytes",
    "WatchEvent": "type=1:string object=2:RawExtension",
    "Time": "seconds=1:int64 nanos=2:int32",
    "Quantity": "string=1:string",
    "IntOrString": "type=1:int64 intVal=2:int32 strVal=3:string",
    "ListMeta": "selfLink=1:string resourceVersion=2:string continue=3:string remainingItemCount=4:int64",
    "ObjectMeta": "name=1:string generateName=2:string namespace=3:string selfLink=4:string uid=5:string "
                  "resourceVersion=6:string generation=7:int64 creationTimestamp=8:Time deletionTimestamp=9:Time "
                  "deletionGracePeriodSeconds=10:int64 labels=11:{string} annotations=12:{string} "
                  "ownerReferences=13:*OwnerReference finalizers=14:*string managedFields=17:*ManagedFieldsEntry",
    "ManagedFieldsEntry": "manager=1:string operation=2:string apiVersion=3:string time=4:Time fieldsType=6:string "
                          "fieldsV1=7:FieldsV1 subresource=8:string",
    "FieldsV1": "raw=1:bytes",
    "OwnerReference": "kind=1:string name=3:string uid=4:string apiVersion=5:string controller=6:bool "
                      "blockOwnerDeletion=7:bool",
    "LabelSelector": "matchLabels=1:{string} matchExpressions=2:*LabelSelectorRequirement",
    "LabelSelectorRequirement": "key=1:string operator=2:string values=3:*string",
    "Status": "metadata=1:ListMeta status=2:string message=3:string reason=4:string details=5:StatusDetails "
              "code=6:int32",
    "StatusDetails": "name=1:string group=2:string kind=3:string causes=4:*StatusCause retryAfterSeconds=5:int32 "
                     "uid=6:string",
    "StatusCause": "reason=1:string message=2:string field=3:string",
    "PartialObjectMetadata": "metadata=1:ObjectMeta",
    "PartialObjectMetadataList": "metadata=1:ListMeta items=2:*PartialObjectMetadata",
    "Pod": "metadata=1:ObjectMeta spec=2:PodSpec status=3:PodStatus",
    "PodSpec": "volumes=1:*Volume containers=2:*Container restartPolicy=3:string "
               "terminationGracePeriodSeconds=4:int64 activeDeadlineSeconds=5:int64 dnsPolicy=6:string "
               "nodeSelector=7:{string} serviceAccountName=8:string serviceAccount=9:string nodeName=10:string "
               "hostNetwork=11:bool hostPID=12:bool hostIPC=13:bool securityContext=14:PodSecurityContext "
               "hostname=16:string subdomain=17:string schedulerName=19:string tolerations=22:*Toleration "
               "priorityClassName=24:string priority=25:int32 enableServiceLinks=30:bool preemptionPolicy=31:string",
    "PodSecurityContext": "runAsUser=2:int64 runAsNonRoot=3:bool fsGroup=5:int64",
    "Volume": "name=1:string volumeSource=2:VolumeSource",
    "VolumeSource": "emptyDir=2:EmptyDirVolumeSource configMap=19:ConfigMapVolumeSource "
                    "projected=26:ProjectedVolumeSource",
    "EmptyDirVolumeSource": "medium=1:string",
    "ConfigMapVolumeSource": "localObjectReference=1:LocalObjectReference items=2:*KeyToPath defaultMode=3:int32",
    "ProjectedVolumeSource": "sources=1:*VolumeProjection defaultMode=2:int32",
    "VolumeProjection": "downwardAPI=2:DownwardAPIProjection configMap=3:ConfigMapProjection "
                        "serviceAccountToken=4:ServiceAccountTokenProjection",
    "ConfigMapProjection": "localObjectReference=1:LocalObjectReference items=2:*KeyToPath optional=4:bool",
    "DownwardAPIProjection": "items=1:*DownwardAPIVolumeFile",
    "DownwardAPIVolumeFile": "path=1:string fieldRef=2:ObjectFieldSelector mode=4:int32",
    "ServiceAccountTokenProjection": "audience=1:string expirationSeconds=2:int64 path=3:string",
    "KeyToPath": "key=1:string path=2:string mode=3:int32",
    "LocalObjectReference": "name=1:string",
    "ObjectFieldSelector": "apiVersion=1:string fieldPath=2:string",
    "Container": "name=1:string image=2:string command=3:*string args=4:*string workingDir=5:string "
                 "ports=6:*ContainerPort env=7:*EnvVar resources=8:ResourceRequirements volumeMounts=9:*VolumeMount "
                 "terminationMessagePath=13:string imagePullPolicy=14:string stdin=16:bool stdinOnce=17:bool "
                 "tty=18:bool terminationMessagePolicy=20:string",
    "ContainerPort": "name=1:string hostPort=2:int32 containerPort=3:int32 protocol=4:string hostIP=5:string",
    "EnvVar": "name=1:string value=2:string valueFrom=3:EnvVarSource",
    "EnvVarSource": "fieldRef=1:ObjectFieldSelector",
    "ResourceRequirements": "limits=1:{Quantity} requests=2:{Quantity}",
    "VolumeMount": "name=1:string readOnly=2:bool mountPath=3:string subPath=4:string subPathExpr=6:string",
    "Toleration": "key=1:string operator=2:string value=3:string effect=4:string tolerationSeconds=5:int64",
    "PodStatus": "phase=1:string conditions=2:*PodCondition message=3:string reason=4:string hostIP=5:string "
                 "podIP=6:string startTime=7:Time containerStatuses=8:*ContainerStatus qosClass=9:string "
                 "nominatedNodeName=11:string podIPs=12:*PodIP resize=14:string hostIPs=16:*HostIP",
    "PodCondition": "type=1:string status=2:string lastProbeTime=3:Time lastTransitionTime=4:Time reason=5:string "
                    "message=6:string",
    "PodIP": "ip=1:string",
    "HostIP": "ip=1:string",
    "ContainerStatus": "name=1:string state=2:ContainerState lastState=3:ContainerState ready=4:bool "
                       "restartCount=5:int32 image=6:string imageID=7:string containerID=8:string started=9:bool",
    "ContainerState": "waiting=1:ContainerStateWaiting running=2:ContainerStateRunning",
    "ContainerStateWaiting": "reason=1:string message=2:string",
    "ContainerStateRunning": "startedAt=1:Time",
    "PodList": "metadata=1:ListMeta items=2:*Pod",
    "ConfigMap": "metadata=1:ObjectMeta data=2:{string} binaryData=3:{bytes} immutable=4:bool",
    "ConfigMapList": "metadata=1:ListMeta items=2:*ConfigMap",
    "Secret": "metadata=1:ObjectMeta data=2:{bytes} type=3:string immutable=5:bool",
    "SecretList": "metadata=1:ListMeta items=2:*Secret",
    "Namespace": "metadata=1:ObjectMeta spec=2:NamespaceSpec status=3:NamespaceStatus",
    "NamespaceSpec": "finalizers=1:*string",
    "NamespaceStatus": "phase=1:string",
    "NamespaceList": "metadata=1:ListMeta items=2:*Namespace",
    "Node": "metadata=1:ObjectMeta spec=2:NodeSpec status=3:NodeStatus",
    "NodeSpec": "podCIDR=1:string externalID=2:string providerID=3:string unschedulable=4:bool podCIDRs=7:*string",
    "NodeStatus": "capacity=1:{Quantity} allocatable=2:{Quantity} phase=3:string conditions=4:*NodeCondition "
                  "addresses=5:*NodeAddress daemonEndpoints=6:NodeDaemonEndpoints nodeInfo=7:NodeSystemInfo",
    "NodeCondition": "type=1:string status=2:string lastHeartbeatTime=3:Time lastTransitionTime=4:Time "
                     "reason=5:string message=6:string",
    "NodeAddress": "type=1:string address=2:string",
    "NodeDaemonEndpoints": "kubeletEndpoint=1:DaemonEndpoint",
    "DaemonEndpoint": "Port=1:int32",
    "NodeSystemInfo": "machineID=1:string systemUUID=2:string bootID=3:string kernelVersion=4:string "
                      "osImage=5:string containerRuntimeVersion=6:string kubeletVersion=7:string "
                      "kubeProxyVersion=8:string operatingSystem=9:string architecture=10:string",
    "NodeList": "metadata=1:ListMeta items=2:*Node",
    "Service": "metadata=1:ObjectMeta spec=2:ServiceSpec status=3:ServiceStatus",
    "ServiceSpec": "ports=1:*ServicePort selector=2:{string} clusterIP=3:string type=4:string "
                   "sessionAffinity=7:string loadBalancerIP=8:string externalName=10:string "
                   "externalTrafficPolicy=11:string healthCheckNodePort=12:int32 publishNotReadyAddresses=13:bool "
                   "ipFamilyPolicy=17:string clusterIPs=18:*string ipFamilies=19:*string "
                   "internalTrafficPolicy=22:string",
    "ServicePort": "name=1:string protocol=2:string port=3:int32 targetPort=4:IntOrString nodePort=5:int32",
    "ServiceStatus": "loadBalancer=1:LoadBalancerStatus",
    "LoadBalancerStatus": "ingress=1:*LoadBalancerIngress",
    "LoadBalancerIngress": "ip=1:string hostname=2:string",
    "ServiceList": "metadata=1:ListMeta items=2:*Service",
    "Endpoints": "metadata=1:ObjectMeta subsets=2:*EndpointSubset",
    "EndpointSubset": "addresses=1:*EndpointAddress notReadyAddresses=2:*EndpointAddress ports=3:*EndpointPort",
    "EndpointAddress": "ip=1:string hostname=3:string nodeName=4:string",
    "EndpointPort": "name=1:string port=2:int32 protocol=3:string",
    "EndpointsList": "metadata=1:ListMeta items=2:*Endpoints",
    "Deployment": "metadata=1:ObjectMeta spec=2:DeploymentSpec status=3:DeploymentStatus",
    "DeploymentSpec": "replicas=1:int32 selector=2:LabelSelector template=3:PodTemplateSpec "
                      "strategy=4:DeploymentStrategy minReadySeconds=5:int32 revisionHistoryLimit=6:int32 "
                      "paused=7:bool progressDeadlineSeconds=9:int32",
    "PodTemplateSpec": "metadata=1:ObjectMeta spec=2:PodSpec",
    "DeploymentStrategy": "type=1:string rollingUpdate=2:RollingUpdateDeployment",
    "RollingUpdateDeployment": "maxUnavailable=1:IntOrString maxSurge=2:IntOrString",
    "DeploymentStatus": "observedGeneration=1:int64 replicas=2:int32 updatedReplicas=3:int32 "
                        "availableReplicas=4:int32 unavailableReplicas=5:int32 conditions=6:*DeploymentCondition "
                        "readyReplicas=7:int32",
    "DeploymentCondition": "type=1:string status=2:string reason=4:string message=5:string lastUpdateTime=6:Time "
                           "lastTransitionTime=7:Time",
    "DeploymentList": "metadata=1:ListMeta items=2:*Deployment",
}


class PbTypes:
    """Message classes for PB_TEST_MESSAGES (proto2, so presence of zero values shows)."""

    def __init__(self):
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
        F = descriptor_pb2.FieldDescriptorProto
        scalars = {"string": F.TYPE_STRING, "int64": F.TYPE_INT64, "int32": F.TYPE_INT32, "bool": F.TYPE_BOOL,
                   "bytes": F.TYPE_BYTES}
        fdp = descriptor_pb2.FileDescriptorProto(name="apisimtest.proto", package="t", syntax="proto2")

        def field(msg, name, num, typ, label):
            f = msg.field.add(name=name, number=num, label=label)
            if typ in scalars:
                f.type = scalars[typ]
            else:
                f.type = F.TYPE_MESSAGE
                f.type_name = ".t." + typ
            return f

        for mname, spec in PB_TEST_MESSAGES.items():
            m = fdp.message_type.add(name=mname)
            for item in spec.split():
                fname, _, rest = item.partition("=")
                num, _, typ = rest.partition(":")
                if typ.startswith("{"):
                    entry = m.nested_type.add(name=fname[0].upper() + fname[1:] + "Entry")
                    entry.options.map_entry = True
                    field(entry, "key", 1, "string", F.LABEL_OPTIONAL)
                    field(entry, "value", 2, typ[1:-1], F.LABEL_OPTIONAL)
                    m.field.add(name=fname, number=int(num), label=F.LABEL_REPEATED, type=F.TYPE_MESSAGE,
                                type_name=".t.%s.%s" % (mname, entry.name))
                elif typ.startswith("*"):
                    field(m, fname, int(num), typ[1:], F.LABEL_REPEATED)
                else:
                    field(m, fname, int(num), typ, F.LABEL_OPTIONAL)
        pool = descriptor_pool.DescriptorPool()
        pool.Add(fdp)
        factory = message_factory.MessageFactory(pool)
        for mname in PB_TEST_MESSAGES:
            setattr(self, mname, factory.GetPrototype(pool.FindMessageTypeByName("t." + mname)))

    def parse(self, mname, data):
        m = getattr(self, mname)()
        m.ParseFromString(data)
        return m

    def envelope(self, data):
        """(Unknown, body) of an envelope; the magic checked."""
        assert data[:4] == b"k8s\x00", data[:8]
        return self.parse("Unknown", data[4:])

    def obj(self, data, mname=None):
        u = self.envelope(data)
        return u, self.parse(mname or u.typeMeta.kind, u.raw)


PBT = None


def pbt():
    global PBT
    if PBT is None:
        PBT = PbTypes()
    return PBT


def rfc3339_seconds(s):
    import calendar
    return calendar.timegm(time.strptime(s, "%Y-%m-%dT%H:%M:%SZ"))


def pb_frames(w, n, timeout=5):
    """n protobuf watch frames (4-byte big-endian length + WatchEvent) from a Stream."""
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        while len(w.lines) < 4 or len(w.lines) < 4 + int.from_bytes(w.lines[:4], "big"):
            c = w._chunk(deadline)
            if c is None:
                raise AssertionError("stream ended after %d frames" % len(out))
            w.lines += c
        size = int.from_bytes(w.lines[:4], "big")
        out.append(pbt().parse("WatchEvent", w.lines[4:4 + size]))
        w.lines = w.lines[4 + size:]
    return out


def pb_event(ev):
    """(type, Unknown envelope, the object message) of a decoded WatchEvent."""
    u, o = pbt().obj(ev.object.raw)
    return ev.type, u, o


@unittest.skipUnless(subprocess.run([PY, "-c", "import google.protobuf"], capture_output=True).returncode == 0,
                     "python3-protobuf is not installed (make deps-test)")
class TestProtobuf(unittest.TestCase):
    """apisim's protobuf answers, decoded with python3-protobuf."""

    @classmethod
    def setUpClass(cls):
        cls.sim = Sim("--pods", "12", "--nodes", "2", "--namespaces", "2", "--bookmark-interval", "0.3",
                      "--seed", "11")

    @classmethod
    def tearDownClass(cls):
        cls.sim.stop()

    def get_pb(self, path, accept=PB, code=200):
        st, r, data = self.sim.req("GET", path, headers={"Accept": accept})
        self.assertEqual(st, code, data[:300])
        return r, data

    def assert_roundtrip(self, msg, raw):
        """Re-encoding the decoded message gives apisim's bytes: fields in ascending
        order, map keys sorted, nothing this test's schema does not know."""
        self.assertEqual(msg.SerializeToString(deterministic=True), raw)

    # -- negotiation ------------------------------------------------------
    def test_content_negotiation(self):
        p = "/api/v1/namespaces/ns-0/pods?limit=2"
        for accept, ct in [(None, "application/json"), ("", "application/json"),
                           ("application/json", "application/json"), ("*/*", "application/json"),
                           ("application/*", "application/json"), (PB, PB),
                           ("application/vnd.kubernetes.protobuf, application/json", PB),
                           ("application/json, application/vnd.kubernetes.protobuf", "application/json"),
                           ("*/*, application/vnd.kubernetes.protobuf", PB),      # specific before wildcards
                           ("application/*, application/vnd.kubernetes.protobuf", PB),
                           ("text/html, application/vnd.kubernetes.protobuf", PB),
                           ("application/vnd.kubernetes.protobuf;q=0.5, application/json", "application/json"),
                           ("application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io, application/json",
                            "application/json")]:
            st, r, data = self.sim.req("GET", p, headers={} if accept is None else {"Accept": accept})
            self.assertEqual((st, r.getheader("Content-Type")), (200, ct), accept)
            if ct == PB:
                self.assertEqual(data[:4], b"k8s\x00")
                self.assertEqual(pbt().envelope(data).typeMeta.kind, "PodList")
            else:
                self.assertEqual(json.loads(data)["kind"], "PodList")
        # Table has no protobuf form: nothing fits -> 406, and the Status cannot be
        # negotiated either: WriteRawJSON (indented, kind/apiVersion, no newline)
        st, r, data = self.sim.req("GET", p, headers={
            "Accept": "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io"})
        self.assertEqual((st, r.getheader("Content-Type")), (406, "application/json"))
        self.assertTrue(data.startswith(b'{\n  "kind": "Status",\n  "apiVersion": "v1",\n  "metadata": {},\n'), data)
        self.assertFalse(data.endswith(b"\n"))
        self.assertEqual(json.loads(data)["reason"], "NotAcceptable")

    def test_custom_resources_have_no_protobuf(self):
        self.sim.write(verb="create", resource="widgets", namespace="ns-0", name="w1")
        p = "/apis/example.com/v1/namespaces/ns-0/widgets"
        st, r, data = self.sim.req("GET", p, headers={"Accept": PB + ", application/json"})
        self.assertEqual((st, r.getheader("Content-Type")), (200, "application/json"))
        self.assertEqual(json.loads(data)["kind"], "WidgetList")
        st, r, data = self.sim.req("GET", p + "/w1", headers={"Accept": PB + ", application/json"})
        self.assertEqual(json.loads(data)["kind"], "Widget")
        # protobuf only: 406; the error itself negotiates protobuf (a custom resource's
        # serializer has it, for PartialObjectMetadata and Status)
        st, r, data = self.sim.req("GET", p, headers={"Accept": PB})
        self.assertEqual((st, r.getheader("Content-Type")), (406, PB))
        u, s = pbt().obj(data)
        self.assertEqual((u.typeMeta.apiVersion, u.typeMeta.kind), ("v1", "Status"))
        self.assertEqual((s.code, s.reason, s.status), (406, "NotAcceptable", "Failure"))
        self.assertIn("only the following media types are accepted", s.message)
        self.assertFalse(s.HasField("details"))
        w = Stream(self.sim, p + "?watch=1", headers={"Accept": PB})
        self.assertEqual(w.status, 406)
        w.close()
        # PartialObjectMetadata is served in protobuf for custom resources too
        r, data = self.get_pb(p, PB + ";as=PartialObjectMetadataList;g=meta.k8s.io;v=v1")
        u, lst = pbt().obj(data)
        self.assertEqual((u.typeMeta.apiVersion, u.typeMeta.kind), ("meta.k8s.io/v1", "PartialObjectMetadataList"))
        self.assertEqual([i.metadata.name for i in lst.items], ["w1"])

    # -- get / list -------------------------------------------------------
    def test_get_matches_json(self):
        path = "/api/v1/namespaces/ns-0/pods/pod-0"
        j = self.sim.get(path)[1]
        r, data = self.get_pb(path)
        self.assertEqual(r.getheader("Content-Type"), PB)
        u, pod = pbt().obj(data)
        self.assertEqual((u.typeMeta.apiVersion, u.typeMeta.kind), ("v1", "Pod"))
        self.assertEqual((u.contentEncoding, u.contentType), ("", ""))
        self.assertTrue(u.HasField("contentEncoding") and u.HasField("contentType"))
        self.assert_roundtrip(pod, u.raw)
        self.check_pod(pod, j)

    def check_pod(self, pod, j):
        md, sp, st = j["metadata"], j["spec"], j["status"]
        m = pod.metadata
        self.assertEqual((m.name, m.namespace, m.uid, m.resourceVersion, m.generation),
                         (md["name"], md["namespace"], md["uid"], md["resourceVersion"], md.get("generation", 0)))
        self.assertEqual(m.creationTimestamp.seconds, rfc3339_seconds(md["creationTimestamp"]))
        self.assertEqual(dict(m.labels), md.get("labels", {}))
        self.assertEqual(dict(m.annotations), md.get("annotations", {}))
        self.assertEqual([(o.kind, o.name, o.uid, o.apiVersion, o.controller, o.blockOwnerDeletion)
                          for o in m.ownerReferences],
                         [(o["kind"], o["name"], o["uid"], o["apiVersion"], o.get("controller", False),
                           o.get("blockOwnerDeletion", False)) for o in md.get("ownerReferences", [])])
        # non-pointer fields are written even when empty; pointers only when set
        self.assertTrue(m.HasField("generateName") and m.HasField("selfLink"))
        self.assertFalse(m.HasField("deletionTimestamp") or m.HasField("deletionGracePeriodSeconds"))
        self.assertEqual([(c.name, c.image) for c in pod.spec.containers],
                         [(c["name"], c["image"]) for c in sp["containers"]])
        c0, jc0 = pod.spec.containers[0], sp["containers"][0]
        self.assertEqual([(p.name, p.containerPort, p.protocol) for p in c0.ports],
                         [(p.get("name", ""), p["containerPort"], p.get("protocol", "")) for p in jc0.get("ports", [])])
        self.assertEqual([(e.name, e.value, e.valueFrom.fieldRef.fieldPath) for e in c0.env],
                         [(e["name"], e.get("value", ""), e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", ""))
                          for e in jc0.get("env", [])])
        self.assertEqual({k: q.string for k, q in c0.resources.limits.items()},
                         jc0.get("resources", {}).get("limits", {}))
        self.assertTrue(c0.HasField("workingDir") and c0.HasField("stdin") and c0.HasField("resources"))
        self.assertEqual((pod.spec.nodeName, pod.spec.restartPolicy, pod.spec.schedulerName,
                          pod.spec.serviceAccountName, pod.spec.terminationGracePeriodSeconds),
                         (sp["nodeName"], sp["restartPolicy"], sp["schedulerName"], sp["serviceAccountName"],
                          sp["terminationGracePeriodSeconds"]))
        self.assertEqual([(t.key, t.operator, t.effect, t.tolerationSeconds) for t in pod.spec.tolerations],
                         [(t["key"], t["operator"], t["effect"], t["tolerationSeconds"]) for t in sp["tolerations"]])
        self.assertTrue(pod.spec.HasField("securityContext"))   # {} in JSON: a set pointer
        self.assertFalse(pod.spec.HasField("activeDeadlineSeconds"))
        self.assertEqual(pod.spec.volumes[0].volumeSource.projected.sources[0].serviceAccountToken.expirationSeconds,
                         sp["volumes"][0]["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"])
        self.assertEqual((pod.status.phase, pod.status.podIP, pod.status.hostIP, pod.status.qosClass),
                         (st["phase"], st["podIP"], st["hostIP"], st["qosClass"]))
        self.assertEqual([(c.type, c.status, c.lastTransitionTime.seconds) for c in pod.status.conditions],
                         [(c["type"], c["status"], rfc3339_seconds(c["lastTransitionTime"]))
                          for c in st["conditions"]])
        # a null Time in a non-pointer field is the zero Time: an empty message, written
        self.assertTrue(pod.status.conditions[0].HasField("lastProbeTime"))
        self.assertEqual(pod.status.conditions[0].lastProbeTime.ByteSize(), 0)
        cs = pod.status.containerStatuses[0]
        self.assertEqual((cs.name, cs.ready, cs.started, cs.containerID, cs.state.running.startedAt.seconds),
                         (st["containerStatuses"][0]["name"], True, True, st["containerStatuses"][0]["containerID"],
                          rfc3339_seconds(st["containerStatuses"][0]["state"]["running"]["startedAt"])))
        self.assertTrue(cs.HasField("lastState") and not cs.lastState.HasField("running"))
        self.assertTrue(pod.status.HasField("resize"))   # 1.27+: a non-pointer string

    def test_list_matches_json(self):
        for path, kind in [("/api/v1/pods", "PodList"), ("/api/v1/nodes", "NodeList"),
                           ("/api/v1/namespaces", "NamespaceList"), ("/api/v1/configmaps", "ConfigMapList"),
                           ("/api/v1/secrets", "SecretList"), ("/api/v1/services", "ServiceList"),
                           ("/api/v1/endpoints", "EndpointsList"), ("/apis/apps/v1/deployments", "DeploymentList")]:
            plural = path.rsplit("/", 1)[1]
            if plural not in ("pods", "nodes", "namespaces"):
                self.sim.json("POST", "/apisim/seed", {"resource": plural, "namespace": "ns-1", "count": 3})
            j = self.sim.get(path)[1]
            r, data = self.get_pb(path)
            self.assertEqual(r.getheader("Content-Type"), PB)
            u, lst = pbt().obj(data)
            self.assertEqual((u.typeMeta.apiVersion, u.typeMeta.kind), (j["apiVersion"], kind))
            self.assert_roundtrip(lst, u.raw)
            self.assertEqual(lst.metadata.resourceVersion, j["metadata"]["resourceVersion"])
            self.assertTrue(lst.metadata.HasField("selfLink") and lst.metadata.HasField("continue"))
            self.assertFalse(lst.metadata.HasField("remainingItemCount"))
            self.assertEqual([(i.metadata.namespace, i.metadata.name, i.metadata.resourceVersion) for i in lst.items],
                             [(i["metadata"].get("namespace", ""), i["metadata"]["name"],
                               i["metadata"]["resourceVersion"]) for i in j["items"]], path)
            for pi, ji in zip(lst.items, j["items"]):
                self.assertEqual(dict(pi.metadata.labels), ji["metadata"].get("labels", {}))
                if kind == "PodList":
                    self.check_pod(pi, ji)
                elif kind == "NodeList":
                    self.assertEqual((pi.spec.podCIDR, list(pi.spec.podCIDRs), pi.spec.providerID),
                                     (ji["spec"]["podCIDR"], ji["spec"]["podCIDRs"], ji["spec"]["providerID"]))
                    self.assertEqual({k: q.string for k, q in pi.status.capacity.items()}, ji["status"]["capacity"])
                    self.assertEqual(pi.status.nodeInfo.kubeletVersion, ji["status"]["nodeInfo"]["kubeletVersion"])
                    self.assertEqual(pi.status.daemonEndpoints.kubeletEndpoint.Port, 10250)
                elif kind == "NamespaceList":
                    self.assertEqual((list(pi.spec.finalizers), pi.status.phase),
                                     (ji["spec"]["finalizers"], ji["status"]["phase"]))
                elif kind == "ConfigMapList":
                    self.assertEqual(dict(pi.data), ji["data"])
                    self.assertFalse(pi.HasField("immutable"))
                elif kind == "SecretList":
                    self.assertEqual({k: base64.b64encode(v).decode() for k, v in pi.data.items()}, ji["data"])
                    self.assertEqual(pi.type, ji["type"])
                elif kind == "ServiceList":
                    sp = ji["spec"]
                    self.assertEqual([(p.name, p.port, p.targetPort.type, p.targetPort.intVal) for p in pi.spec.ports],
                                     [(p["name"], p["port"], 0, p["targetPort"]) for p in sp["ports"]])
                    self.assertEqual((pi.spec.clusterIP, dict(pi.spec.selector), pi.spec.ipFamilyPolicy),
                                     (sp.get("clusterIP", ""), sp.get("selector", {}), sp.get("ipFamilyPolicy", "")))
                    self.assertEqual(pi.spec.HasField("ipFamilyPolicy"), "ipFamilyPolicy" in sp)   # a pointer
                elif kind == "EndpointsList":
                    self.assertEqual([(a.ip, a.nodeName) for a in pi.subsets[0].addresses],
                                     [(a["ip"], a["nodeName"]) for a in ji["subsets"][0]["addresses"]])
                elif kind == "DeploymentList":
                    sp = ji["spec"]
                    self.assertEqual((pi.spec.replicas, dict(pi.spec.selector.matchLabels),
                                      pi.spec.strategy.rollingUpdate.maxSurge.strVal),
                                     (sp["replicas"], sp["selector"]["matchLabels"],
                                      sp["strategy"]["rollingUpdate"]["maxSurge"]))
                    self.assertEqual(pi.spec.template.spec.containers[0].image, sp["template"]["spec"]["containers"][0]["image"])

    def test_large_list_is_streamed(self):
        # more than 2000 objects not encoded yet (encoded in batches) and over 1 MiB (chunked)
        self.sim.json("POST", "/apisim/seed", {"resource": "configmaps", "namespace": "big", "count": 2100,
                                               "size": 700})
        path = "/api/v1/namespaces/big/configmaps"
        st, r, data = self.sim.req("GET", path, headers={"Accept": PB})
        self.assertEqual((st, r.getheader("Content-Type"), r.getheader("Transfer-Encoding")), (200, PB, "chunked"))
        self.assertGreater(len(data), 1 << 20)
        u, lst = pbt().obj(data)
        self.assert_roundtrip(lst, u.raw)
        self.assertEqual([i.metadata.name for i in lst.items], names(self.sim.get(path)[1]["items"]))
        self.assertEqual(self.get_pb(path)[1], data)   # the second time from the kept encodings

    def test_selectors_limit_continue(self):
        base = "/api/v1/namespaces/ns-0/pods"
        for q in ["?labelSelector=tier%3Dfrontend", "?fieldSelector=metadata.name%3Dpod-2",
                  "?labelSelector=tier!%3Dfrontend&fieldSelector=status.phase%3DRunning"]:
            j = self.sim.get(base + q)[1]
            _, data = self.get_pb(base + q)
            lst = pbt().obj(data)[1]
            self.assertEqual([p.metadata.name for p in lst.items], names(j["items"]), q)
        # paging: the same pages, tokens, remainingItemCount as JSON
        jnames, pnames = [], []
        jcont = pcont = ""
        first = True
        while first or jcont:
            first = False
            q = "?limit=2" + ("&continue=" + jcont if jcont else "")
            j = self.sim.get(base + q)[1]
            lst = pbt().obj(self.get_pb(base + "?limit=2" + ("&continue=" + pcont if pcont else ""))[1])[1]
            jnames += names(j["items"])
            pnames += [p.metadata.name for p in lst.items]
            jcont = j["metadata"].get("continue", "")
            pcont = lst.metadata.__getattribute__("continue")
            self.assertEqual(pcont, jcont)
            self.assertEqual(lst.metadata.resourceVersion, j["metadata"]["resourceVersion"])
            if "remainingItemCount" in j["metadata"]:
                self.assertEqual(lst.metadata.remainingItemCount, j["metadata"]["remainingItemCount"])
            else:
                self.assertFalse(lst.metadata.HasField("remainingItemCount"))
        self.assertEqual(pnames, jnames)
        self.assertGreater(len(pnames), 2)
        # with a selector there is no remainingItemCount
        lst = pbt().obj(self.get_pb(base + "?limit=1&labelSelector=app")[1])[1]
        self.assertTrue(lst.metadata.__getattribute__("continue"))
        self.assertFalse(lst.metadata.HasField("remainingItemCount"))

    def test_partial_object_metadata(self):
        a = PB + ";as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
        r, data = self.get_pb("/api/v1/namespaces/ns-0/pods?limit=3", a)
        self.assertEqual(r.getheader("Content-Type"), PB)
        u, lst = pbt().obj(data)
        self.assertEqual(u.typeMeta.kind, "PartialObjectMetadataList")
        self.assert_roundtrip(lst, u.raw)
        j = self.sim.get("/api/v1/namespaces/ns-0/pods?limit=3")[1]
        self.assertEqual([(i.metadata.name, i.metadata.uid) for i in lst.items],
                         [(i["metadata"]["name"], i["metadata"]["uid"]) for i in j["items"]])
        u, one = pbt().obj(self.get_pb("/api/v1/namespaces/ns-0/pods/pod-0", a)[1])
        self.assertEqual((u.typeMeta.apiVersion, u.typeMeta.kind, one.metadata.name),
                         ("meta.k8s.io/v1", "PartialObjectMetadata", "pod-0"))

    # -- watch ------------------------------------------------------------
    def test_watch_events_and_bookmarks(self):
        base = "/api/v1/namespaces/ns-1/configmaps"
        self.sim.write(verb="create", resource="configmaps", namespace="ns-1", name="cm-w0")
        rv0 = self.sim.rv()
        w = Stream(self.sim, base + "?watch=1&allowWatchBookmarks=true&resourceVersion=%d" % rv0,
                   headers={"Accept": PB})
        wj = Stream(self.sim, base + "?watch=1&resourceVersion=%d" % rv0, headers={"Accept": "application/json"})
        try:
            self.assertEqual((w.status, w.headers["content-type"]), (200, PB + ";stream=watch"))
            self.assertEqual(wj.headers["content-type"], "application/json")
            stats = self.sim.get("/apisim/stats")[1]
            self.assertEqual(stats["open_watches_by_encoding"]["configmaps"], {"json": 1, "protobuf": 1})
            self.assertEqual(stats["watches_open"], stats["open_watches_by_encoding"])
            self.assertEqual(stats["open_watches"]["configmaps"], 2)
            self.sim.write(verb="create", resource="configmaps", namespace="ns-1", name="cm-w1")
            self.sim.write(verb="update", resource="configmaps", namespace="ns-1", name="cm-w1", labels={"x": "y"})
            self.sim.write(verb="delete", resource="configmaps", namespace="ns-1", name="cm-w1")
            evs = [e for e in pb_frames(w, 4, timeout=5) if e.type != "BOOKMARK"]
            while len(evs) < 3:
                evs += [e for e in pb_frames(w, 1) if e.type != "BOOKMARK"]
            jevs = [e for e in wj.collect(3)]
            got = [pb_event(e) for e in evs[:3]]
            self.assertEqual([(t, u.typeMeta.kind, o.metadata.name, o.metadata.resourceVersion) for t, u, o in got],
                             [(e["type"], "ConfigMap", e["object"]["metadata"]["name"],
                               e["object"]["metadata"]["resourceVersion"]) for e in jevs])
            self.assertEqual(dict(got[1][2].metadata.labels), {"x": "y"})
            for e in evs[:3]:
                self.assert_roundtrip(e, e.SerializeToString())
            # a bookmark: the kind's message, only resourceVersion set
            ev = next(e for e in iter(lambda: pb_frames(w, 1, timeout=5)[0], None) if e.type == "BOOKMARK")
            t, u, o = pb_event(ev)
            self.assertEqual(u.typeMeta.kind, "ConfigMap")
            self.assertEqual(o.metadata.resourceVersion, str(self.sim.rv()))
            self.assertEqual(o.metadata.name, "")
            self.assertTrue(o.metadata.HasField("name"))
            self.assertEqual(len(o.data), 0)
        finally:
            w.close()
            wj.close()
        wait_for(lambda: "configmaps" not in self.sim.get("/apisim/stats")[1]["open_watches_by_encoding"],
                 what="watches closed")

    def test_watch_selector_transitions_and_initial_events(self):
        base = "/api/v1/namespaces/ns-1/secrets"
        self.sim.write(verb="create", resource="secrets", namespace="ns-1", name="s-a", labels={"k": "1"})
        self.sim.write(verb="create", resource="secrets", namespace="ns-1", name="s-b", labels={"k": "2"})
        w = Stream(self.sim, base + "?watch=1&labelSelector=k%3D1&sendInitialEvents=true&allowWatchBookmarks=true"
                   "&resourceVersionMatch=NotOlderThan", headers={"Accept": PB})
        try:
            evs = pb_frames(w, 2)
            t, u, o = pb_event(evs[0])
            self.assertEqual((t, o.metadata.name), ("ADDED", "s-a"))
            t, u, o = pb_event(evs[1])
            self.assertEqual(t, "BOOKMARK")
            self.assertEqual(dict(o.metadata.annotations), {"k8s.io/initial-events-end": "true"})
            self.assertTrue(o.HasField("type"))   # Secret.type: non-pointer, written empty
            self.sim.write(verb="update", resource="secrets", namespace="ns-1", name="s-b", labels={"k": "1"})
            self.sim.write(verb="update", resource="secrets", namespace="ns-1", name="s-a", labels={"k": "3"})
            evs = [e for e in pb_frames(w, 2) if e.type != "BOOKMARK"]
            while len(evs) < 2:
                evs += [e for e in pb_frames(w, 1) if e.type != "BOOKMARK"]
            self.assertEqual([(pb_event(e)[0], pb_event(e)[2].metadata.name) for e in evs],
                             [("ADDED", "s-b"), ("DELETED", "s-a")])
        finally:
            w.close()

    def test_watch_too_old_is_an_error_event(self):
        self.sim.write(verb="create", resource="configmaps", namespace="ns-1", name="cm-old")
        rv = self.sim.rv()
        self.sim.json("POST", "/apisim/compact", {})
        self.sim.write(verb="update", resource="configmaps", namespace="ns-1", name="cm-old", labels={"a": "b"})
        w = Stream(self.sim, "/api/v1/namespaces/ns-1/configmaps?watch=1&resourceVersion=%d" % (rv - 1),
                   headers={"Accept": PB})
        try:
            self.assertEqual(w.status, 200)
            (ev,) = pb_frames(w, 1)
            t, u, s = pb_event(ev)
            self.assertEqual((t, u.typeMeta.kind, s.code, s.reason), ("ERROR", "Status", 410, "Expired"))
            self.assertIn("too old resource version", s.message)
            self.assertIsNone(w._chunk(time.monotonic() + 5))   # then the stream ends
        finally:
            w.close()

    # -- errors -----------------------------------------------------------
    def status_of(self, st, r, data, code):
        self.assertEqual((st, r.getheader("Content-Type")), (code, PB), data[:200])
        u, s = pbt().obj(data)
        self.assertEqual((u.typeMeta.apiVersion, u.typeMeta.kind), ("v1", "Status"))
        self.assert_roundtrip(s, u.raw)
        self.assertEqual((s.code, s.status), (code, "Failure"))
        return s

    def test_errors_in_protobuf(self):
        h = {"Accept": PB}
        s = self.status_of(*self.sim.req("GET", "/api/v1/namespaces/ns-0/pods/nope", headers=h), 404)
        self.assertEqual((s.reason, s.details.name, s.details.kind), ("NotFound", "nope", "pods"))
        s = self.status_of(*self.sim.req("GET", "/api/v1/pods?labelSelector=a%3D%3D%3D", headers=h), 400)
        self.assertEqual(s.reason, "BadRequest")
        self.assertFalse(s.HasField("details"))
        s = self.status_of(*self.sim.req("GET", "/api/v1/pods?resourceVersionMatch=Exact", headers=h), 422)
        self.assertEqual(s.reason, "Invalid")
        self.assertTrue(s.details.causes and s.details.causes[0].field)
        far = self.sim.rv() + 1000
        st, r, data = self.sim.req("GET", "/api/v1/pods?resourceVersion=%d&resourceVersionMatch=NotOlderThan&limit=1"
                                   % far, headers=h)
        s = self.status_of(st, r, data, 504)
        self.assertEqual((s.reason, s.details.causes[0].reason), ("Timeout", "ResourceVersionTooLarge"))
        self.assertFalse(s.details.HasField("uid") and s.details.uid)
        # an expired list: 410
        rv = self.sim.rv()
        self.sim.write(verb="create", resource="configmaps", namespace="ns-1", name="cm-exp")
        self.sim.json("POST", "/apisim/compact", {})
        s = self.status_of(*self.sim.req("GET", "/api/v1/configmaps?resourceVersion=%d&resourceVersionMatch=Exact"
                                         % rv, headers=h), 410)
        self.assertEqual(s.reason, "Expired")
        # an injected failure: 500 (and 503 with Retry-After)
        self.sim.json("POST", "/apisim/fail", {"count": 1, "match": "/api/v1/nodes", "status": 500})
        s = self.status_of(*self.sim.req("GET", "/api/v1/nodes", headers=h), 500)
        self.assertEqual(s.reason, "InternalError")
        # JSON clients still get JSON errors
        st, r, data = self.sim.req("GET", "/api/v1/namespaces/ns-0/pods/nope",
                                   headers={"Accept": PB + ";as=Table;g=meta.k8s.io;v=v1, application/json"})
        self.assertEqual(r.getheader("Content-Type"), "application/json")
        self.assertTrue(data.endswith(b"}\n"))

    def test_auth_errors_in_protobuf(self):
        sim = Sim("--token", "tok", "--nodes", "1")
        try:
            s = self.status_of(*sim.req("GET", "/api/v1/nodes", headers={"Accept": PB}), 401)
            self.assertEqual((s.reason, s.message), ("Unauthorized", "Unauthorized"))
            st, r, data = sim.req("GET", "/api/v1/nodes", headers={"Accept": PB, "Authorization": "Bearer tok"})
            self.assertEqual((st, pbt().envelope(data).typeMeta.kind), (200, "NodeList"))
        finally:
            sim.stop()
        sim = policy_sim(policy={"tokens": {"t1": {"user": "alice"}}, "rules": []})
        try:
            s = self.status_of(*sim.req("GET", "/api/v1/namespaces/default/pods",
                                        headers={"Accept": PB, "Authorization": "Bearer t1"}), 403)
            self.assertEqual((s.reason, s.details.kind), ("Forbidden", "pods"))
            self.assertIn('User "alice" cannot list resource "pods"', s.message)
        finally:
            sim.stop()

    def test_writes_answer_in_protobuf(self):
        h = {"Accept": PB + ", application/json", "Content-Type": "application/json"}
        st, r, data = self.sim.req("POST", "/api/v1/namespaces/ns-0/configmaps",
                                   body=json.dumps({"metadata": {"name": "cm-pbw"}, "data": {"a": "1"}}), headers=h)
        self.assertEqual((st, r.getheader("Content-Type")), (201, PB))
        u, cm = pbt().obj(data)
        self.assertEqual((u.typeMeta.kind, cm.metadata.name, dict(cm.data)), ("ConfigMap", "cm-pbw", {"a": "1"}))
        st, r, data = self.sim.req("DELETE", "/api/v1/namespaces/ns-0/configmaps/cm-pbw", headers=h)
        u, s = pbt().obj(data)
        self.assertEqual((st, u.typeMeta.kind, s.status, s.details.name, s.details.uid),
                         (200, "Status", "Success", "cm-pbw", cm.metadata.uid))
        self.sim.write(verb="create", resource="deployments", namespace="ns-0", name="d-pbw")
        r, data = self.get_pb("/apis/apps/v1/namespaces/ns-0/deployments/d-pbw/scale")
        u = pbt().envelope(data)
        self.assertEqual((u.typeMeta.apiVersion, u.typeMeta.kind), ("autoscaling/v1", "Scale"))
        # Scale {1 metadata, 2 spec {1 replicas 3}, 3 status {1 replicas 3, 2 selector}}
        self.assertIn(b"\x12\x02\x08\x03\x1a", u.raw)

    # -- bytes ------------------------------------------------------------
    def test_byte_vectors(self):
        # a ConfigMap with known metadata: every ObjectMeta field up to creationTimestamp
        # written (generation 0 too), annotations, data; immutable (a pointer) absent
        self.sim.write(verb="create", resource="configmaps", namespace="ns-1", name="cm-vec",
                       object={"metadata": {"uid": "u-1", "creationTimestamp": "2024-01-02T03:04:05Z"},
                               "data": {"k": "v"}})
        j = self.sim.get("/api/v1/namespaces/ns-1/configmaps/cm-vec")[1]
        rv = j["metadata"]["resourceVersion"].encode()
        stamp = j["metadata"]["annotations"]["apisim.kwc.dev/written-at"].encode()
        key = b"apisim.kwc.dev/written-at"
        ann = b"\x0a" + bytes([len(key)]) + key + b"\x12" + bytes([len(stamp)]) + stamp
        om = (b"\x0a\x06cm-vec" b"\x12\x00" b"\x1a\x04ns-1" b"\x22\x00" b"\x2a\x03u-1" +
              b"\x32" + bytes([len(rv)]) + rv + b"\x38\x00" + b"\x42\x08\x08\xa5\xfa\xcd\xac\x06\x10\x00" +
              b"\x62" + bytes([len(ann)]) + ann)
        cm = b"\x0a" + bytes([len(om)]) + om + b"\x12\x06\x0a\x01k\x12\x01v"
        want = b"k8s\x00" + b"\x0a\x0f\x0a\x02v1\x12\x09ConfigMap" + b"\x12" + bytes([len(cm)]) + cm + b"\x1a\x00\x22\x00"
        self.assertEqual(self.get_pb("/api/v1/namespaces/ns-1/configmaps/cm-vec")[1], want)
        # a NotFound Status
        details = b"\x0a\x04nope\x12\x00\x1a\x0aconfigmaps\x28\x00\x32\x00"
        status = (b"\x0a\x06\x0a\x00\x12\x00\x1a\x00" b"\x12\x07Failure" b'\x1a\x1bconfigmaps "nope" not found'
                  b"\x22\x08NotFound" b"\x2a" + bytes([len(details)]) + details + b"\x30\x94\x03")
        self.assertEqual(len(status), 0x55)
        want = b"k8s\x00\x0a\x0c\x0a\x02v1\x12\x06Status\x12\x55" + status + b"\x1a\x00\x22\x00"
        self.assertEqual(self.get_pb("/api/v1/namespaces/ns-1/configmaps/nope", code=404)[1], want)
        # the initial-events-end bookmark of a configmaps watch, framed
        w = Stream(self.sim, "/api/v1/namespaces/empty/configmaps?watch=1&sendInitialEvents=true"
                   "&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan", headers={"Accept": PB})
        try:
            body = b""
            deadline = time.monotonic() + 5
            while len(body) < 4 or len(body) < 4 + int.from_bytes(body[:4], "big"):
                body += w._chunk(deadline)
        finally:
            w.close()
        size = int.from_bytes(body[:4], "big")
        ev = body[4:4 + size]
        rv = str(pbt().parse("ObjectMeta", pbt().parse("ConfigMap", pbt().envelope(
            pbt().parse("WatchEvent", ev).object.raw).raw).metadata.SerializeToString()).resourceVersion).encode()
        a = b"\x0a\x19k8s.io/initial-events-end\x12\x04true"
        om = (b"\x0a\x00\x12\x00\x1a\x00\x22\x00\x2a\x00\x32" + bytes([len(rv)]) + rv + b"\x38\x00\x42\x00" +
              b"\x62" + bytes([len(a)]) + a)
        cm = b"\x0a" + bytes([len(om)]) + om
        env = b"k8s\x00\x0a\x0f\x0a\x02v1\x12\x09ConfigMap\x12" + bytes([len(cm)]) + cm + b"\x1a\x00\x22\x00"
        want = b"\x0a\x08BOOKMARK\x12" + bytes([len(env) + 2]) + b"\x0a" + bytes([len(env)]) + env
        self.assertEqual(body[:4 + size], len(want).to_bytes(4, "big") + want)


# ---------------------------------------------------------------------------
# gzip and pretty, with kube-apiserver's rules (responsewriters/writers.go
# SerializeObject + deferredResponseWriter, negotiation NegotiateOutputMediaType)

sys.path.insert(0, HERE)
import apisim as _apisim  # noqa: E402  (the module's pure helpers)


def raw_get(sim, path, lines=(), method="GET", version="HTTP/1.1"):
    """One request with exactly the header lines given (http.client adds its own
    Accept-Encoding: identity).  Returns (status, [(name lower, value)], raw body,
    body): raw as sent (chunked framing kept), body de-chunked, still encoded."""
    sock = socket.create_connection(("127.0.0.1", sim.port), timeout=10)
    try:
        head = "%s %s %s\r\nHost: x\r\nConnection: close\r\n%s\r\n" % (
            method, path, version, "".join("%s: %s\r\n" % kv for kv in lines))
        sock.sendall(head.encode("latin-1"))
        buf = b""
        while True:
            d = sock.recv(1 << 20)
            if not d:
                break
            buf += d
    finally:
        sock.close()
    h, _, raw = buf.partition(b"\r\n\r\n")
    hl = h.decode("latin-1").split("\r\n")
    status = int(hl[0].split()[1])
    hdrs = [(k.strip().lower(), v.strip()) for k, _, v in (ln.partition(":") for ln in hl[1:])]
    body = raw
    if ("transfer-encoding", "chunked") in hdrs:
        body, rest = b"", raw
        while True:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size, 16)
            if n == 0:
                break
            body, rest = body + rest[:n], rest[n + 2:]
    return status, hdrs, raw, body


def hget(hdrs, name):
    v = [x for k, x in hdrs if k == name]
    return v[0] if v else None


CURL = ("User-Agent", "curl/8.5.0")


class TestPrettyIndent(unittest.TestCase):
    """apisim's re-indenter is Go's json.Indent (what json.MarshalIndent applies to
    Marshal's compact bytes), byte for byte."""

    def test_known_outputs(self):
        ind = _apisim.go_indent
        cases = [
            (b'{}\n', b'{}'), (b'[]', b'[]'), (b'"x"', b'"x"'), (b'12', b'12'), (b'null\n', b'null'),
            (b'{"a":1}', b'{\n  "a": 1\n}'),
            (b'{"a":{},"b":[],"c":[{}],"d":[[]]}',
             b'{\n  "a": {},\n  "b": [],\n  "c": [\n    {}\n  ],\n  "d": [\n    []\n  ]\n}'),
            (b'[1,"a",true,null,-1.5e-7]', b'[\n  1,\n  "a",\n  true,\n  null,\n  -1.5e-7\n]'),
            # strings are not touched: punctuation, escapes, HTML escapes, raw UTF-8
            (b'{"k:,{[":"v\\":,{}[]\\\\","\\u003c\\u0026":"\xc3\xa9\xe2\x80\xa8 \\u2028"}',
             b'{\n  "k:,{[": "v\\":,{}[]\\\\",\n  "\\u003c\\u0026": "\xc3\xa9\xe2\x80\xa8 \\u2028"\n}'),
            # whitespace outside strings is dropped (Indent scans it as scanSkipSpace)
            (b' { "a" : [ 1 , 2 ] } \n', b'{\n  "a": [\n    1,\n    2\n  ]\n}'),
        ]
        for src, want in cases:
            self.assertEqual(ind(src), want, src)

    def test_matches_dumpb_indent(self):
        # dumpb_indent (Python's indent=2 + Go's escaping: WriteRawJSON's form) and
        # go_indent(dumpb(x)) (a pretty API answer) agree on any value
        import random
        rng = random.Random(5)
        atoms = ["", "a", "<b>&amp;", "\u2028\u2029", "é\u00ff\U0001f600", "\\\"", "\n\t\x01\x7f", ":", ",{}[]",
                 0, -7, 2 ** 62, 1.5, True, False, None]

        def gen(d):
            r = rng.random()
            if d > 4 or r < 0.4:
                return rng.choice(atoms)
            if r < 0.7:
                return [gen(d + 1) for _ in range(rng.randrange(0, 4))]
            return {str(rng.choice(atoms)) + str(i): gen(d + 1) for i in range(rng.randrange(0, 4))}
        for _ in range(400):
            v = gen(0)
            compact = _apisim.dumpb(v)
            self.assertEqual(_apisim.go_indent(compact + b"\n"), _apisim.dumpb_indent(v), compact)
            # streamed in pieces split between tokens: the same bytes
            toks = [m.group() for m in _apisim._INDENT_TOKEN.finditer(compact)]
            g = _apisim.GoIndenter()
            cut = rng.randrange(0, len(toks) + 1)
            self.assertEqual(g.feed(b"".join(toks[:cut])) + g.feed(b"".join(toks[cut:])), _apisim.dumpb_indent(v))

    def test_query_and_bool(self):
        get = _apisim.go_query_get
        self.assertEqual(get("a=1&pretty=true", "pretty"), "true")
        self.assertEqual(get("pretty=%74rue&pretty=0", "pretty"), "true")     # unescaped, first value
        self.assertEqual(get("pretty=%zz&pretty=1", "pretty"), "1")           # a bad escape: pair skipped
        self.assertEqual(get("pretty=1;x=2&pretty=0", "pretty"), "0")          # ";": pair skipped (Go 1.17+)
        self.assertEqual(get("pre%74ty=+1", "pretty"), " 1")
        self.assertEqual(get("pretty", "pretty"), "")
        for v, want in (("1", (True, True)), ("T", (True, True)), ("True", (True, True)), ("tRUE", (False, False)),
                        ("yes", (False, False)), ("0", (False, True)), ("F", (False, True)), ("", (False, False))):
            self.assertEqual(_apisim.go_parse_bool(v), want, v)


class TestPretty(unittest.TestCase):
    POD = "/api/v1/namespaces/default/pods/pod-1"

    def compact(self, path, accept=None):
        st, r, data = SIM.req("GET", path, headers={"Accept": accept} if accept else {})
        self.assertTrue(data.endswith(b"\n"), data[-20:])
        return st, data

    def test_query_and_user_agent(self):
        st, compact = self.compact(self.POD)
        pretty = _apisim.go_indent(compact)
        self.assertTrue(pretty.startswith(b'{\n  "kind": "Pod",\n  "apiVersion": "v1",\n  "metadata": {\n    "name"'))
        self.assertTrue(pretty.endswith(b"\n}"), pretty[-10:])
        cases = [
            ("", [], False), ("?pretty=true", [], True), ("?pretty=1", [], True), ("?pretty=T", [], True),
            ("?pretty=false", [CURL], False), ("?pretty=0", [CURL], False),
            ("?pretty=yes", [CURL], False),            # unparsable: false, the UA not asked
            ("?pretty=", [CURL], True),                # empty: the UA decides
            ("?pretty", [CURL], True), ("?pretty", [], False),
            ("?pretty=%74rue", [], True), ("?pretty=1;x", [], False), ("?x=pretty", [CURL], True),
            ("", [CURL], True), ("", [("User-Agent", "curl")], True), ("", [("User-Agent", "Wget/1.21")], True),
            ("", [("User-Agent", "Mozilla/5.0 (X11)")], True), ("", [("User-Agent", "Curl/8")], False),
            ("", [("User-Agent", "mozilla/5.0")], False), ("", [("User-Agent", "Mozilla/4.0")], False),
            ("", [("User-Agent", "kubectl/v1.33"), CURL], False),   # Header.Get: the first line
            ("", [("Accept", "application/json;pretty=1")], True),
            ("", [("Accept", "application/json;pretty=true")], False),   # only "1"
            ("", [("Accept", "application/json; pretty=1 ")], True),
            ("", [("Accept", "application/yaml;pretty=1, application/json")], False),  # not the winner's
            ("", [("Accept", "application/json;q=0.5;pretty=1, application/json")], False),
            ("", [("Accept", "application/json;q=0.5, application/json;pretty=1")], True),
            ("", [("Accept", "*/*;pretty=1")], True),
        ]
        for q, lines, want in cases:
            st, hdrs, raw, body = raw_get(SIM, self.POD + q, lines)
            self.assertEqual(st, 200, (q, lines))
            self.assertEqual(body, pretty if want else compact, (q, lines))
            self.assertEqual(hget(hdrs, "content-length"), str(len(body)), (q, lines))

    def test_lists_errors_variants(self):
        for path, accept in (("/api/v1/namespaces/default/pods?limit=3", None), ("/api/v1/pods", None),
                             ("/api/v1/nodes?resourceVersion=0", None),
                             ("/apis/example.com/v1/widgets", None),
                             ("/api/v1/pods?limit=2",
                              "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"),
                             (self.POD, "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"),
                             ("/api/v1/pods?limit=2", "application/json;as=Table;g=meta.k8s.io;v=v1"),
                             ("/api/v1/namespaces/default/pods/nope", None),              # 404 Status
                             ("/api/v1/pods?resourceVersion=abc&limit=1", None),          # 400 Status
                             ("/api/v1/pods?limit=1", "application/json;as=Foo;g=x;v=1, application/json")):  # 406
            st, compact = self.compact(path, accept)
            lines = [("Accept", accept)] if accept else []
            for q in ("pretty=1", "pretty=true"):
                p = path + ("&" if "?" in path else "?") + q
                st2, hdrs, raw, body = raw_get(SIM, p, lines)
                self.assertEqual(st2, st, p)
                if "as=Table" in (accept or ""):   # the Table's row cells carry an age: compare forms
                    self.assertEqual(json.loads(body)["kind"], "Table")
                    self.assertEqual(body, _apisim.go_indent(_apisim.dumpb(json.loads(body))), p)
                    continue
                self.assertEqual(body, _apisim.go_indent(compact), (p, accept))
        # an error negotiates on its own (no conversion): the Table clause's pretty=1 is not its
        tbl = [("Accept", "application/json;as=Table;g=meta.k8s.io;v=v1;pretty=1, application/json")]
        st, hdrs, raw, body = raw_get(SIM, "/api/v1/namespaces/default/pods/nope", tbl)
        self.assertEqual((st, body), (404, self.compact("/api/v1/namespaces/default/pods/nope")[1]))
        st, hdrs, raw, body = raw_get(SIM, "/api/v1/namespaces/default/pods/pod-1", tbl)
        self.assertTrue(body.startswith(b'{\n  "kind": "Table"'), body[:40])
        # an error no Accept clause fits: WriteRawJSON, indented either way
        st, hdrs, raw, body = raw_get(SIM, "/api/v1/pods?limit=1", [("Accept", "application/json;as=Foo;g=x;v=1")])
        self.assertEqual(st, 406)
        self.assertTrue(body.startswith(b'{\n  "kind": "Status"') and body.endswith(b"}"), body)

    def test_protobuf_and_watch_never_pretty(self):
        pb = "application/vnd.kubernetes.protobuf"
        for path in (self.POD, "/api/v1/pods?limit=3", "/api/v1/namespaces/default/pods/nope"):
            st, r, want = SIM.req("GET", path, headers={"Accept": pb})
            for lines in ([("Accept", pb), CURL], [("Accept", pb + ";pretty=1")],
                          [("Accept", pb + ", application/json;pretty=1")]):
                st2, hdrs, raw, body = raw_get(SIM, path + ("&" if "?" in path else "?") + "pretty=1", lines)
                self.assertEqual((st2, body), (st, want), (path, lines))
        # a pretty watch request is served; its events are compact lines
        for hdrs in ({"User-Agent": "curl/8"}, {"Accept": "application/json;pretty=1"}):
            w = Stream(SIM, "/api/v1/namespaces/default/pods?watch=1&pretty=1&limit=1", headers=hdrs)
            try:
                self.assertEqual(w.status, 200)
                c = w._chunk(time.monotonic() + 5)
                self.assertTrue(c.startswith(b'{"type":"ADDED","object":{"kind":"Pod"') and c.endswith(b"}\n"), c[:60])
            finally:
                w.close()

    def test_writes_and_discovery(self):
        st, hdrs, raw, body = raw_get(SIM, "/api/v1?pretty=1")
        self.assertEqual(body, _apisim.go_indent(SIM.req("GET", "/api/v1")[2]))
        c = json.dumps({"metadata": {"name": "pretty-cm"}, "data": {"a": "<b>"}}).encode()
        sock = socket.create_connection(("127.0.0.1", SIM.port), timeout=10)
        try:
            sock.sendall(b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                         b"User-Agent: curl/8\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(c), c))
            buf = b""
            while True:
                d = sock.recv(65536)
                if not d:
                    break
                buf += d
        finally:
            sock.close()
        body = buf.partition(b"\r\n\r\n")[2]
        self.assertIn(b'"data": {\n    "a": "\\u003cb\\u003e"\n  }', body)
        self.assertEqual(body, _apisim.go_indent(SIM.req("GET", "/api/v1/namespaces/default/configmaps/pretty-cm")[2]))


class TestGzip(unittest.TestCase):
    """Answers over 128 KiB are gzip'ed when asked; the rest never."""

    @classmethod
    def setUpClass(cls):
        cls.sim = Sim("--pods", "700", "--namespaces", "2", "--seed", "11")
        # a ConfigMap sized so that its GET is exactly at the threshold, and one byte over
        cls.ns = "/api/v1/namespaces/ns-0/configmaps"
        cls.sim.json("POST", cls.ns, {"metadata": {"name": "at"}, "data": {"k": ""}})
        n = len(cls.sim.req("GET", cls.ns + "/at")[2])
        for name, size in (("at", 131072), ("over", 131073)):
            body = {"metadata": {"name": name}, "data": {"k": "x" * (size - n - len(name) + 2)}}
            if name == "at":
                st, r, d = cls.sim.req("PUT", cls.ns + "/at", body)
            else:
                st, r, d = cls.sim.req("POST", cls.ns, body)
            assert st in (200, 201), d[:200]
        # many short keys: compact under the threshold, pretty over it
        cls.sim.json("POST", cls.ns, {"metadata": {"name": "keys"}, "data": {"k%05d" % i: "v" for i in range(9000)}})

    @classmethod
    def tearDownClass(cls):
        cls.sim.stop()

    def plain(self, path, accept=None):
        st, r, data = self.sim.req("GET", path, headers={"Accept": accept} if accept else {})
        return st, data

    def assert_gzip(self, hdrs, raw, body, want, what):
        import gzip
        self.assertEqual(hget(hdrs, "content-encoding"), "gzip", what)
        self.assertEqual(hget(hdrs, "vary"), "Accept-Encoding", what)
        self.assertIsNone(hget(hdrs, "content-length"), what)
        self.assertEqual(hget(hdrs, "transfer-encoding"), "chunked", what)
        self.assertEqual(body[:10], b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x04\xff", what)   # Go's gzip.BestSpeed header
        self.assertEqual(gzip.decompress(body), want, what)

    def assert_plain(self, hdrs, body, want, what):
        self.assertIsNone(hget(hdrs, "content-encoding"), what)
        self.assertIsNone(hget(hdrs, "vary"), what)
        self.assertEqual(body, want, what)

    def test_threshold(self):
        for name, size, gz in (("at", 131072, False), ("over", 131073, True)):
            st, want = self.plain(self.ns + "/" + name)
            self.assertEqual(len(want), size)
            st, hdrs, raw, body = raw_get(self.sim, self.ns + "/" + name, [("Accept-Encoding", "gzip")])
            if gz:
                self.assert_gzip(hdrs, raw, body, want, name)
            else:
                self.assert_plain(hdrs, body, want, name)
                self.assertEqual(hget(hdrs, "content-length"), str(size))
        # pretty: the threshold is on the bytes written (the indented ones)
        st, compact = self.plain(self.ns + "/keys")
        self.assertLess(len(compact), 131072)
        st, hdrs, raw, body = raw_get(self.sim, self.ns + "/keys", [("Accept-Encoding", "gzip")])
        self.assert_plain(hdrs, body, compact, "keys")
        st, hdrs, raw, body = raw_get(self.sim, self.ns + "/keys?pretty=1", [("Accept-Encoding", "gzip")])
        self.assert_gzip(hdrs, raw, body, _apisim.go_indent(compact), "keys pretty")

    def test_accept_encoding_rules(self):
        path = self.ns + "/over"
        st, want = self.plain(path)
        for lines, gz in (([("Accept-Encoding", "gzip")], True), ([("Accept-Encoding", "gzip, deflate, br")], True),
                          ([("Accept-Encoding", "deflate,gzip")], True), ([("Accept-Encoding", " br ,\tgzip\t")], True),
                          ([("Accept-Encoding", "gzip;q=1.0")], False), ([("Accept-Encoding", "gzip;q=0")], False),
                          ([("Accept-Encoding", "GZIP")], False), ([("Accept-Encoding", "x-gzip")], False),
                          ([("Accept-Encoding", "*")], False), ([("Accept-Encoding", "identity")], False),
                          ([("Accept-Encoding", "")], False), ([], False),
                          ([("Accept-Encoding", "gzip"), ("Accept-Encoding", "identity")], True),
                          ([("Accept-Encoding", "identity"), ("Accept-Encoding", "gzip")], False)):  # first line
            st, hdrs, raw, body = raw_get(self.sim, path, lines)
            self.assertEqual(st, 200)
            if gz:
                self.assert_gzip(hdrs, raw, body, want, lines)
            else:
                self.assert_plain(hdrs, body, want, lines)

    def test_lists_protobuf_streamed_http10_head(self):
        pb = "application/vnd.kubernetes.protobuf"
        ge = ("Accept-Encoding", "gzip")
        cases = [("/api/v1/namespaces/ns-0/pods?limit=60", None),     # ~180 KB: one piece
                 ("/api/v1/pods", None),                              # > 1 MiB: streamed, compressed as it goes
                 ("/api/v1/pods?resourceVersion=0", pb),
                 ("/api/v1/pods?limit=300", pb),
                 ("/api/v1/pods", "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"),
                 ("/api/v1/pods", "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;"
                                            "g=meta.k8s.io;v=v1")]
        for path, accept in cases:
            st, want = self.plain(path, accept)
            self.assertGreater(len(want), 131072, path)
            lines = [ge] + ([("Accept", accept)] if accept else [])
            st, hdrs, raw, body = raw_get(self.sim, path, lines)
            self.assert_gzip(hdrs, raw, body, want, (path, accept))
            if accept is None:   # pretty too: compressed after the indent
                st, hdrs, raw, body = raw_get(self.sim, path + ("&" if "?" in path else "?") + "pretty=1", lines)
                self.assert_gzip(hdrs, raw, body, _apisim.go_indent(want), (path, "pretty"))
        # small answers, errors: never
        for path in ("/api/v1/namespaces/ns-0/pods?limit=2", "/api/v1/namespaces/ns-0/pods/nope",
                     "/api/v1/pods?resourceVersion=abc&limit=1"):
            st, want = self.plain(path)
            st, hdrs, raw, body = raw_get(self.sim, path, [ge])
            self.assert_plain(hdrs, body, want, path)
        # HTTP/1.0: a close-delimited gzip body
        import gzip
        st, want = self.plain("/api/v1/pods?limit=300")
        st, hdrs, raw, body = raw_get(self.sim, "/api/v1/pods?limit=300", [ge], version="HTTP/1.0")
        self.assertEqual((hget(hdrs, "content-encoding"), hget(hdrs, "transfer-encoding")), ("gzip", None))
        self.assertEqual(gzip.decompress(body), want)
        # HEAD: the headers a GET would have, no body
        st, hdrs, raw, body = raw_get(self.sim, "/api/v1/pods?limit=300", [ge], method="HEAD")
        self.assertEqual((st, hget(hdrs, "content-encoding"), hget(hdrs, "vary"), raw),
                         (200, "gzip", "Accept-Encoding", b""))

    def test_large_error_and_watch(self):
        import gzip
        # a Status over 128 KiB (a label selector error quoting the selector) is compressed too
        sel = "a" * 140000 + "=="
        path = "/api/v1/pods?labelSelector=" + sel
        st, want = self.plain(path)
        self.assertEqual(st, 400)
        self.assertGreater(len(want), 131072)
        st, hdrs, raw, body = raw_get(self.sim, path, [("Accept-Encoding", "gzip")])
        self.assertEqual(st, 400)
        self.assert_gzip(hdrs, raw, body, want, "a large Status")
        # watches never, whatever their size
        w = Stream(self.sim, "/api/v1/pods?watch=1", headers={"Accept-Encoding": "gzip"})
        try:
            self.assertEqual(w.status, 200)
            self.assertNotIn("content-encoding", w.headers)
            self.assertNotIn("vary", w.headers)
            evs = w.collect(700)
            self.assertEqual({e["type"] for e in evs}, {"ADDED"})
        finally:
            w.close()
        del gzip


# ---------------------------------------------------------------------------
# issue 30: generic built-in kinds, CRDs at run time, aggregated discovery, APIServices

AGG_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
AGG_V2B1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
META_PB = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
META_PB_LIST = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
META_JSON_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"

# (group/version, plural, kind, namespaced, shortNames) that kube-controller-manager's
# informers use and apisim serves since issue 30
NEW_KINDS = [
    ("v1", "serviceaccounts", "ServiceAccount", True, ["sa"]),
    ("v1", "persistentvolumes", "PersistentVolume", False, ["pv"]),
    ("v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, ["pvc"]),
    ("v1", "podtemplates", "PodTemplate", True, None),
    ("v1", "replicationcontrollers", "ReplicationController", True, ["rc"]),
    ("v1", "limitranges", "LimitRange", True, ["limits"]),
    ("v1", "resourcequotas", "ResourceQuota", True, ["quota"]),
    ("v1", "events", "Event", True, ["ev"]),
    ("discovery.k8s.io/v1", "endpointslices", "EndpointSlice", True, None),
    ("coordination.k8s.io/v1", "leases", "Lease", True, None),
    ("events.k8s.io/v1", "events", "Event", True, ["ev"]),
    ("apps/v1", "controllerrevisions", "ControllerRevision", True, None),
    ("batch/v1", "jobs", "Job", True, None),
    ("batch/v1", "cronjobs", "CronJob", True, ["cj"]),
    ("autoscaling/v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", True, ["hpa"]),
    ("autoscaling/v1", "horizontalpodautoscalers", "HorizontalPodAutoscaler", True, ["hpa"]),
    ("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ["pdb"]),
    ("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy", True, ["netpol"]),
    ("networking.k8s.io/v1", "ingresses", "Ingress", True, ["ing"]),
    ("networking.k8s.io/v1", "ingressclasses", "IngressClass", False, None),
    ("storage.k8s.io/v1", "storageclasses", "StorageClass", False, ["sc"]),
    ("storage.k8s.io/v1", "csidrivers", "CSIDriver", False, None),
    ("storage.k8s.io/v1", "csinodes", "CSINode", False, None),
    ("storage.k8s.io/v1", "volumeattachments", "VolumeAttachment", False, None),
    ("storage.k8s.io/v1", "csistoragecapacities", "CSIStorageCapacity", True, None),
    ("node.k8s.io/v1", "runtimeclasses", "RuntimeClass", False, None),
    ("scheduling.k8s.io/v1", "priorityclasses", "PriorityClass", False, ["pc"]),
    ("rbac.authorization.k8s.io/v1", "roles", "Role", True, None),
    ("rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding", True, None),
    ("rbac.authorization.k8s.io/v1", "clusterroles", "ClusterRole", False, None),
    ("rbac.authorization.k8s.io/v1", "clusterrolebindings", "ClusterRoleBinding", False, None),
    ("admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", False,
     None),
    ("admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration", False,
     None),
    ("certificates.k8s.io/v1", "certificatesigningrequests", "CertificateSigningRequest", False, ["csr"]),
    ("apiextensions.k8s.io/v1", "customresourcedefinitions", "CustomResourceDefinition", False, ["crd", "crds"]),
    ("apiregistration.k8s.io/v1", "apiservices", "APIService", False, None),
]


def gv_prefix(gv):
    return "/api/v1" if gv == "v1" else "/apis/" + gv


def crd_body(group="stable.example.io", plural="gadgets", kind="Gadget", scope="Namespaced", versions=("v1",),
             short=("gd",), status=True):
    vs = [{"name": v, "served": True, "storage": i == 0,
           "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}
          for i, v in enumerate(versions)]
    if status:
        for v in vs:
            v["subresources"] = {"status": {}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "%s.%s" % (plural, group)},
            "spec": {"group": group, "scope": scope, "versions": vs,
                     "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": kind + "List",
                               "shortNames": list(short)}}}


CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


class TestIssue30Kinds(unittest.TestCase):
    """The built-in kinds added for issue 30: discovery, CRUD, list, watch, selectors,
    protobuf and metadata-only answers."""

    @classmethod
    def setUpClass(cls):
        cls.sim = Sim("--seed", "30", "--bookmark-interval", "0.3")

    @classmethod
    def tearDownClass(cls):
        cls.sim.stop()

    def test_discovery_lists_them(self):
        for gv, plural, kind, namespaced, short in NEW_KINDS:
            st, lst = self.sim.get(gv_prefix(gv))
            self.assertEqual(st, 200, gv)
            res = {r["name"]: r for r in lst["resources"]}
            self.assertIn(plural, res, gv)
            r = res[plural]
            self.assertEqual((r["kind"], r["namespaced"], r.get("shortNames")), (kind, namespaced, short), plural)
            self.assertEqual(r["singularName"], kind.lower())
            self.assertIn("watch", r["verbs"])
            names = [x["name"] for x in lst["resources"]]
            self.assertEqual(names, sorted(names), gv)   # installer.go sorts the paths
        st, core = self.sim.get("/api/v1")
        res = {r["name"]: r for r in core["resources"]}
        self.assertEqual(res["serviceaccounts/token"]["group"], "authentication.k8s.io")
        self.assertEqual(res["replicationcontrollers/scale"]["group"], "autoscaling")
        self.assertEqual(res["pods"]["storageVersionHash"], "xPOwRZ+Yhw8=")   # sha256("/v1/Pod")
        self.assertEqual(res["configmaps"]["storageVersionHash"], "qFsyl6wFWjQ=")
        st, groups = self.sim.get("/apis")
        order = [g["name"] for g in groups["groups"]]
        self.assertEqual(order[:7], ["apiregistration.k8s.io", "apps", "events.k8s.io", "autoscaling", "batch",
                                     "certificates.k8s.io", "networking.k8s.io"])
        self.assertLess(order.index("admissionregistration.k8s.io"), order.index("apiextensions.k8s.io"))
        self.assertEqual(order[-1], "example.com")   # CRD groups (priority 1000) last
        auto = [g for g in groups["groups"] if g["name"] == "autoscaling"][0]
        self.assertEqual([v["version"] for v in auto["versions"]], ["v2", "v1"])
        self.assertEqual(auto["preferredVersion"]["version"], "v2")

    def test_crud_list_watch_each_kind(self):
        for gv, plural, kind, namespaced, _short in NEW_KINDS:
            if plural in ("customresourcedefinitions", "apiservices"):
                continue
            base = gv_prefix(gv) + ("/namespaces/default/" if namespaced else "/") + plural
            w = Stream(self.sim, base + "?watch=1&resourceVersion=%d" % self.sim.rv())
            try:
                obj = {"apiVersion": gv, "kind": kind, "metadata": {"name": "x-1", "labels": {"k": "v"}}}
                st, out = self.sim.json("POST", base, obj)
                self.assertEqual(st, 201, (plural, out))
                self.assertEqual(list(out)[:3], ["kind", "apiVersion", "metadata"])
                self.assertEqual((out["kind"], out["apiVersion"]), (kind, gv))
                ev = w.next()
                self.assertEqual((ev["type"], ev_name(ev)), ("ADDED", "x-1"), plural)
                st, got = self.sim.get(base + "/x-1")
                self.assertEqual((st, got["metadata"]["uid"]), (200, out["metadata"]["uid"]))
                st, lst = self.sim.get(base + "?labelSelector=k%3Dv&fieldSelector=metadata.name%3Dx-1")
                self.assertEqual((lst["kind"], names(lst["items"])), (kind + "List", ["x-1"]))
                # protobuf: an envelope of the kind, ObjectMeta exact
                st, r, data = self.sim.req("GET", base + "/x-1", headers={"Accept": PB})
                self.assertEqual((st, r.getheader("Content-Type")), (200, PB), plural)
                u = pbt().envelope(data)
                self.assertEqual((u.typeMeta.apiVersion, u.typeMeta.kind), (gv, kind))
                md = pbt().parse("PartialObjectMetadata", u.raw).metadata
                self.assertEqual((md.name, md.uid, dict(md.labels)), ("x-1", out["metadata"]["uid"], {"k": "v"}))
                st, r, data = self.sim.req("GET", base, headers={"Accept": META_PB_LIST})
                u, lst = pbt().obj(data, "PartialObjectMetadataList")
                self.assertEqual(u.typeMeta.kind, "PartialObjectMetadataList")
                self.assertIn("x-1", [i.metadata.name for i in lst.items])
                st, r, data = self.sim.req("GET", base, headers={"Accept": META_JSON_LIST})
                self.assertIn("x-1", names(json.loads(data)["items"]))
                st, _ = self.sim.json("DELETE", base + "/x-1")
                self.assertEqual(st, 200)
                ev = w.next()
                self.assertEqual((ev["type"], ev_name(ev)), ("DELETED", "x-1"), plural)
            finally:
                w.close()

    def test_protobuf_watch_and_field_selectors(self):
        base = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
        w = Stream(self.sim, base + "?watch=1&resourceVersion=%d" % self.sim.rv(), headers={"Accept": PB})
        try:
            self.sim.json("POST", base, {"metadata": {"name": "l1"}, "spec": {"holderIdentity": "me"}})
            ev = pb_frames(w, 1)[0]
            u, o = pbt().obj(ev.object.raw, "PartialObjectMetadata")
            self.assertEqual((ev.type, u.typeMeta.kind, o.metadata.name), ("ADDED", "Lease", "l1"))
        finally:
            w.close()
        # core events: kube's field labels (pkg/apis/core/v1/conversion.go)
        ev = {"metadata": {"name": "e1"}, "involvedObject": {"kind": "Pod", "name": "p1", "namespace": "default"},
              "reason": "Started", "type": "Normal", "source": {"component": "kubelet"}}
        self.assertEqual(self.sim.json("POST", "/api/v1/namespaces/default/events", ev)[0], 201)
        st, lst = self.sim.get("/api/v1/events?fieldSelector=involvedObject.name%3Dp1,reason%3DStarted,"
                               "source%3Dkubelet")
        self.assertEqual(names(lst["items"]), ["e1"])
        # the same events in events.k8s.io/v1 (conversion.go: regarding, note, ...)
        st, v1 = self.sim.get("/apis/events.k8s.io/v1/namespaces/default/events/e1")
        self.assertEqual((st, v1["apiVersion"], v1["regarding"]["name"], v1["deprecatedSource"]),
                         (200, "events.k8s.io/v1", "p1", {"component": "kubelet"}))
        st, lst = self.sim.get("/apis/events.k8s.io/v1/events?fieldSelector=regarding.name%3Dp1")
        self.assertEqual(names(lst["items"]), ["e1"])
        self.sim.json("POST", "/apis/events.k8s.io/v1/namespaces/default/events",
                      {"metadata": {"name": "e2"}, "regarding": {"kind": "Pod", "name": "p2"}, "note": "hi",
                       "reason": "R", "reportingController": "c", "action": "A", "eventTime": None})
        st, core = self.sim.get("/api/v1/namespaces/default/events/e2")
        self.assertEqual((core["involvedObject"]["name"], core["message"], core["reportingComponent"]),
                         ("p2", "hi", "c"))
        st, err = self.sim.get("/api/v1/events?fieldSelector=spec.x%3D1")
        self.assertEqual((st, err["message"]), (400, "field label not supported: spec.x"))
        st, err = self.sim.get("/apis/batch/v1/jobs?fieldSelector=status.x%3D1")
        self.assertEqual(err["message"], '"status.x" is not a known field selector: only "metadata.name", '
                                         '"metadata.namespace"')
        # autoscaling/v1 and v2 are one resource: an HPA made in v2 is listed in v1
        self.sim.json("POST", "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers",
                      {"metadata": {"name": "h1"}, "spec": {"maxReplicas": 3}})
        st, one = self.sim.get("/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers/h1")
        self.assertEqual((st, one["apiVersion"]), (200, "autoscaling/v1"))

    def test_seed_and_apiservices(self):
        st, out = self.sim.json("POST", "/apisim/seed", {"resource": "leases", "count": 3, "namespace": "kube-system"})
        self.assertEqual((st, out["created"]), (200, 3))
        st, lst = self.sim.get("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases")
        self.assertEqual(len(lst["items"]), 3)
        st, out = self.sim.json("POST", "/apisim/seed", {"resource": "events.events.k8s.io", "count": 2})
        self.assertEqual(out["created"], 2)
        # kube-aggregator's local APIServices, one per built-in group version
        st, svcs = self.sim.get("/apis/apiregistration.k8s.io/v1/apiservices")
        by = {a["metadata"]["name"]: a for a in svcs["items"]}
        for name in ("v1.", "v1.apps", "v2.autoscaling", "v1.autoscaling", "v1.batch", "v1.example.com",
                     "v1.coordination.k8s.io", "v1.apiextensions.k8s.io"):
            self.assertIn(name, by)
        apps = by["v1.apps"]
        self.assertEqual(apps["spec"], {"group": "apps", "version": "v1", "groupPriorityMinimum": 17800,
                                        "versionPriority": 15})
        self.assertEqual(apps["metadata"]["labels"], {"kube-aggregator.kubernetes.io/automanaged": "onstart"})
        c = apps["status"]["conditions"][0]
        self.assertEqual((c["type"], c["status"], c["reason"], c["message"]),
                         ("Available", "True", "Local", "Local APIServices are always available"))
        self.assertEqual(by["v1.example.com"]["metadata"]["labels"]["kube-aggregator.kubernetes.io/automanaged"],
                         "true")
        self.assertNotIn("v1.apiregistration.k8s.io", by)


class TestCRDs(unittest.TestCase):
    """CustomResourceDefinitions created, served and deleted at run time."""

    @classmethod
    def setUpClass(cls):
        cls.sim = Sim("--seed", "31", "--bookmark-interval", "0.3")

    @classmethod
    def tearDownClass(cls):
        cls.sim.stop()

    def make(self, **kw):
        st, out = self.sim.json("POST", CRDS, crd_body(**kw))
        self.assertEqual(st, 201, out)
        return out

    def agg(self):
        st, r, data = self.sim.req("GET", "/apis", headers={"Accept": AGG_V2})
        return r.getheader("ETag"), json.loads(data)

    def test_lifecycle(self):
        sim = self.sim
        etag0, _ = self.agg()
        cw = Stream(sim, CRDS + "?watch=1&resourceVersion=%d" % sim.rv())
        created = self.make()
        # the create answer: status reset, as strategy.go PrepareForCreate leaves it
        self.assertEqual(created["status"], {"acceptedNames": {"plural": "", "kind": ""}, "storedVersions": ["v1"]})
        self.assertEqual(created["spec"]["conversion"], {"strategy": "None"})
        evs = cw.collect(3)
        self.assertEqual([e["type"] for e in evs], ["ADDED", "MODIFIED", "MODIFIED"])
        final = evs[-1]["object"]
        conds = {c["type"]: c for c in final["status"]["conditions"]}
        self.assertEqual((conds["NamesAccepted"]["status"], conds["NamesAccepted"]["reason"]), ("True", "NoConflicts"))
        self.assertEqual((conds["Established"]["status"], conds["Established"]["reason"]),
                         ("True", "InitialNamesAccepted"))
        self.assertEqual(final["status"]["acceptedNames"]["plural"], "gadgets")
        # discovery: plain and aggregated, with a new ETag
        st, grp = sim.get("/apis/stable.example.io")
        self.assertEqual((st, grp["preferredVersion"]["groupVersion"]), (200, "stable.example.io/v1"))
        st, rl = sim.get("/apis/stable.example.io/v1")
        res = {r["name"]: r for r in rl["resources"]}
        self.assertEqual(res["gadgets"]["verbs"], ["delete", "deletecollection", "get", "list", "patch", "create",
                                                   "update", "watch"])
        self.assertEqual((res["gadgets"]["kind"], res["gadgets"]["shortNames"]), ("Gadget", ["gd"]))
        self.assertEqual(res["gadgets/status"]["verbs"], ["get", "patch", "update"])
        etag1, doc = self.agg()
        self.assertNotEqual(etag0, etag1)
        g = [i for i in doc["items"] if i["metadata"]["name"] == "stable.example.io"][0]
        r = g["versions"][0]["resources"][0]
        self.assertEqual(r["responseKind"], {"group": "stable.example.io", "version": "v1", "kind": "Gadget"})
        self.assertEqual(r["subresources"][0]["subresource"], "status")
        st, svc = sim.get("/apis/apiregistration.k8s.io/v1/apiservices/v1.stable.example.io")
        self.assertEqual((st, svc["spec"]["groupPriorityMinimum"], svc["spec"]["versionPriority"]), (200, 1000, 100))
        # objects: create, get, list, watch, patch, status
        base = "/apis/stable.example.io/v1/namespaces/default/gadgets"
        ww = Stream(sim, "/apis/stable.example.io/v1/gadgets?watch=1&resourceVersion=%d" % sim.rv())
        st, g1 = sim.json("POST", base, {"apiVersion": "stable.example.io/v1", "kind": "Gadget",
                                         "metadata": {"name": "g1"}, "spec": {"size": 1}})
        self.assertEqual((st, list(g1)), (201, sorted(g1)))   # unstructured: keys sorted
        self.assertEqual(ww.next()["type"], "ADDED")
        st, _ = sim.json("PATCH", base + "/g1", {"spec": {"size": 2}},
                         headers={"Content-Type": "application/merge-patch+json"})
        self.assertEqual(st, 200)
        self.assertEqual(ww.next()["object"]["spec"]["size"], 2)
        st, lst = sim.get(base)
        self.assertEqual((lst["kind"], names(lst["items"])), ("GadgetList", ["g1"]))
        # protobuf: a custom resource has none; JSON when JSON is also acceptable
        st, r, data = sim.req("GET", base + "/g1", headers={"Accept": PB})
        self.assertEqual(st, 406)
        st, r, data = sim.req("GET", base + "/g1", headers={"Accept": PB + ", application/json"})
        self.assertEqual((st, r.getheader("Content-Type")), (200, "application/json"))
        st, r, data = sim.req("GET", base + "/g1", headers={"Accept": META_PB})
        self.assertEqual(pbt().obj(data, "PartialObjectMetadata")[1].metadata.name, "g1")
        # DELETE: deletionTimestamp + finalizer first, then the objects, then the CRD
        cw2 = Stream(sim, CRDS + "?watch=1&resourceVersion=%d" % sim.rv())
        st, gone = sim.json("DELETE", CRDS + "/gadgets.stable.example.io")
        self.assertEqual(st, 200)
        self.assertIn("deletionTimestamp", gone["metadata"])
        self.assertEqual(gone["metadata"]["finalizers"], ["customresourcecleanup.apiextensions.k8s.io"])
        term = {c["type"]: c for c in gone["status"]["conditions"]}["Terminating"]
        self.assertEqual((term["status"], term["reason"]), ("True", "InstanceDeletionPending"))
        ev = ww.next()
        self.assertEqual((ev["type"], ev_name(ev)), ("DELETED", "g1"))
        self.assertIsNone(ww.next())          # the watch ends cleanly (terminal chunk)
        self.assertTrue(ww.ended)
        evs = cw2.collect(3)
        self.assertEqual([e["type"] for e in evs], ["MODIFIED", "MODIFIED", "DELETED"])
        self.assertEqual(ev_name(evs[-1]), "gadgets.stable.example.io")
        # gone: kube's NotFound handler text, discovery and APIService without it
        st, r, data = sim.req("GET", base + "/g1")
        self.assertEqual((st, data, r.getheader("Content-Type")),
                         (404, b"404 page not found\n", "text/plain; charset=utf-8"))
        self.assertEqual(sim.req("GET", "/apis/stable.example.io/v1")[0], 404)
        self.assertEqual(sim.req("GET", "/apis/stable.example.io")[2], b"404 page not found\n")
        self.assertEqual(sim.get("/apis/apiregistration.k8s.io/v1/apiservices/v1.stable.example.io")[0], 404)
        etag2, doc = self.agg()
        self.assertEqual(etag2, etag0)
        self.assertNotIn("stable.example.io", [i["metadata"]["name"] for i in doc["items"]])
        for s_ in (cw, cw2, ww):
            s_.close()

    def test_versions_and_unserving(self):
        sim = self.sim
        self.make(group="multi.example.io", plural="things", kind="Thing", scope="Cluster",
                  versions=("v1", "v2beta1"), short=(), status=False)
        st, grp = sim.get("/apis/multi.example.io")
        self.assertEqual([v["version"] for v in grp["versions"]], ["v1", "v2beta1"])   # kube-aware order
        st, t1 = sim.json("POST", "/apis/multi.example.io/v1/things", {"metadata": {"name": "t1"}, "a": 1})
        self.assertEqual(st, 201)
        st, t2 = sim.get("/apis/multi.example.io/v2beta1/things/t1")
        self.assertEqual((st, t2["apiVersion"], t2["metadata"]["resourceVersion"]),
                         (200, "multi.example.io/v2beta1", t1["metadata"]["resourceVersion"]))
        w2 = Stream(sim, "/apis/multi.example.io/v2beta1/things?watch=1&resourceVersion=%d" % sim.rv())
        # a namespaced path for a cluster-scoped CRD: crdHandler delegates (404 text)
        self.assertEqual(sim.req("GET", "/apis/multi.example.io/v1/namespaces/default/things")[2],
                         b"404 page not found\n")
        st, crd = sim.get(CRDS + "/things.multi.example.io")
        crd["spec"]["versions"][1]["served"] = False
        st, _ = sim.json("PUT", CRDS + "/things.multi.example.io", crd)
        self.assertEqual(st, 200)
        self.assertIsNone(w2.next())          # that version's watches end
        self.assertEqual(sim.req("GET", "/apis/multi.example.io/v2beta1/things/t1")[0], 404)
        st, grp = sim.get("/apis/multi.example.io")
        self.assertEqual([v["version"] for v in grp["versions"]], ["v1"])
        self.assertEqual(sim.get("/apis/multi.example.io/v1/things/t1")[0], 200)
        w2.close()
        # validation
        bad = crd_body(group="nodot", plural="xs", kind="X")
        st, err = sim.json("POST", CRDS, bad)
        self.assertEqual((st, err["reason"]), (422, "Invalid"))

    def test_widgets_is_a_crd(self):
        st, crd = self.sim.get(CRDS + "/widgets.example.com")
        self.assertEqual(st, 200)
        self.assertEqual(crd["spec"]["names"]["kind"], "Widget")
        self.assertEqual(self.sim.json("POST", "/apisim/seed", {"resource": "widgets", "count": 2})[1]["created"], 2)

    def test_unknown_group_and_aggregated_apiservice(self):
        sim = self.sim
        st, r, data = sim.req("GET", "/apis/nosuch.example.io/v1/things")
        self.assertEqual((st, data, r.getheader("X-Content-Type-Options")), (404, b"404 page not found\n", "nosniff"))
        # a built-in group keeps go-restful's 404 Status
        self.assertEqual(sim.get("/apis/apps/v1/nosuchthings")[1]["reason"], "NotFound")
        svc = {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
               "metadata": {"name": "v1beta1.metrics.k8s.io"},
               "spec": {"group": "metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                        "versionPriority": 100, "insecureSkipTLSVerify": True,
                        "service": {"namespace": "kube-system", "name": "metrics-server", "port": 443}}}
        st, out = sim.json("POST", "/apis/apiregistration.k8s.io/v1/apiservices", svc)
        self.assertEqual(st, 201)
        st, a = sim.get("/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.metrics.k8s.io")
        c = a["status"]["conditions"][0]
        self.assertEqual((c["status"], c["reason"]), ("False", "ServiceNotFound"))
        st, groups = sim.get("/apis")
        self.assertIn("metrics.k8s.io", [g["name"] for g in groups["groups"]])
        st, r, data = sim.req("GET", "/apis/metrics.k8s.io/v1beta1/pods")
        self.assertEqual((st, data, r.getheader("Content-Type")),
                         (503, b"service unavailable\n", "text/plain; charset=utf-8"))
        st, r, data = sim.req("GET", "/apis", headers={"Accept": AGG_V2})
        g = [i for i in json.loads(data)["items"] if i["metadata"]["name"] == "metrics.k8s.io"][0]
        self.assertEqual(g["versions"], [{"version": "v1beta1", "freshness": "Stale"}])
        self.assertEqual(sim.json("DELETE", "/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.metrics.k8s.io")[0],
                         200)
        self.assertEqual(sim.req("GET", "/apis/metrics.k8s.io/v1beta1/pods")[0], 404)
        # deleting a built-in group's APIService unlists it; go-restful still serves it
        self.assertEqual(sim.json("DELETE", "/apis/apiregistration.k8s.io/v1/apiservices/v1.policy")[0], 200)
        self.assertNotIn("policy", [g["name"] for g in sim.get("/apis")[1]["groups"]])
        self.assertEqual(sim.get("/apis/policy/v1/poddisruptionbudgets")[0], 200)
        self.assertEqual(sim.get("/apis/policy")[1]["preferredVersion"]["version"], "v1")


class TestAggregatedDiscovery(unittest.TestCase):
    """/api and /apis as APIGroupDiscoveryList (discovery/aggregated)."""

    def test_document_etag_304(self):
        sim = SIM
        st, hdrs, raw, body = raw_get(sim, "/apis", [("Accept", AGG_V2 + ",application/json")])
        self.assertEqual(st, 200)
        self.assertEqual(hget(hdrs, "content-type"), AGG_V2)
        self.assertEqual(hget(hdrs, "vary"), "Accept")
        self.assertEqual(hget(hdrs, "cache-control"), "public")
        etag = hget(hdrs, "etag")
        self.assertRegex(etag, r'^"[0-9A-F]{128}"$')
        doc = json.loads(body)
        self.assertEqual(list(doc), ["kind", "apiVersion", "metadata", "items"])
        self.assertEqual((doc["kind"], doc["apiVersion"]), ("APIGroupDiscoveryList", "apidiscovery.k8s.io/v2"))
        # the ETag: SHA-512 of json.Marshal of the list without TypeMeta (etag.go)
        plain = json.dumps({"metadata": {}, "items": doc["items"]}, separators=(",", ":"), ensure_ascii=False)
        self.assertEqual(etag, '"%s"' % hashlib.sha512(plain.encode()).hexdigest().upper())
        self.assertEqual(doc["items"][0]["metadata"], {"name": "apiregistration.k8s.io", "creationTimestamp": None})
        apps = [i for i in doc["items"] if i["metadata"]["name"] == "apps"][0]
        dep = [r for r in apps["versions"][0]["resources"] if r["resource"] == "deployments"][0]
        self.assertEqual(list(dep), ["resource", "responseKind", "scope", "singularResource", "verbs", "shortNames",
                                     "categories", "subresources"])
        self.assertEqual(dep["responseKind"], {"group": "", "version": "", "kind": "Deployment"})
        self.assertEqual([x["subresource"] for x in dep["subresources"]], ["scale", "status"])
        self.assertEqual(dep["subresources"][0]["responseKind"], {"group": "autoscaling", "version": "v1",
                                                                 "kind": "Scale"})
        self.assertEqual(apps["versions"][0]["freshness"], "Current")
        auto = [i for i in doc["items"] if i["metadata"]["name"] == "autoscaling"][0]
        self.assertEqual([v["version"] for v in auto["versions"]], ["v2", "v1"])
        # If-None-Match with the ETag: 304, no body, no Content-Type
        st, hdrs, raw, body = raw_get(sim, "/apis", [("Accept", AGG_V2), ("If-None-Match", etag)])
        self.assertEqual((st, raw), (304, b""))
        self.assertIsNone(hget(hdrs, "content-type"))
        self.assertEqual(hget(hdrs, "etag"), etag)
        st, hdrs, raw, body = raw_get(sim, "/apis", [("Accept", AGG_V2), ("If-None-Match", "W/" + etag)])
        self.assertEqual(st, 200)
        # /api: the core group, no name
        st, hdrs, raw, body = raw_get(sim, "/api", [("Accept", AGG_V2)])
        core = json.loads(body)["items"]
        self.assertEqual(core[0]["metadata"], {"creationTimestamp": None})
        pods = [r for r in core[0]["versions"][0]["resources"] if r["resource"] == "pods"][0]
        self.assertEqual((pods["scope"], pods["singularResource"]), ("Namespaced", "pod"))
        self.assertNotEqual(hget(hdrs, "etag"), etag)
        # the plain forms carry no ETag
        st, hdrs, raw, body = raw_get(sim, "/apis", [("Accept", "application/json")])
        self.assertIsNone(hget(hdrs, "etag"))
        self.assertEqual(hget(hdrs, "cache-control"), "no-cache, private")
        # a clause without as= is not acceptable to the aggregated handler: a later
        # aggregated clause still wins; none at all: the plain form
        st, hdrs, raw, body = raw_get(sim, "/apis", [("Accept", "application/json, " + AGG_V2)])
        self.assertEqual(json.loads(body)["kind"], "APIGroupDiscoveryList")
        st, hdrs, raw, body = raw_get(sim, "/apis", [("Accept", AGG_V2 + ";stream=foo")])
        self.assertEqual(json.loads(body)["kind"], "APIGroupList")

    def test_versions(self):
        for ver, v2, v2b1 in (("1.27", False, True), ("1.30", True, True), ("1.33", True, False)):
            sim = Sim("--version", ver, "--nodes", "0")
            try:
                for accept, want in ((AGG_V2, v2), (AGG_V2B1, v2b1)):
                    st, hdrs, raw, body = raw_get(sim, "/apis", [("Accept", accept + ",application/json")])
                    doc = json.loads(body)
                    self.assertEqual(doc["kind"] == "APIGroupDiscoveryList", want, (ver, accept))
                    if want:
                        self.assertEqual(hget(hdrs, "content-type"), accept)
                        self.assertEqual(doc["apiVersion"], "apidiscovery.k8s.io/" + accept.split("v=")[1][:7]
                                         .split(";")[0])
            finally:
                sim.stop()


def _pb_str(tag, s):
    b = s.encode()
    return bytes([tag, len(b)]) + b


class TestCustomResourceMetaProtobuf(unittest.TestCase):
    """PartialObjectMetadata of custom resources in protobuf, byte for byte as kube's
    typed ObjectMeta marshaller writes it."""

    MD = {"name": "w-meta", "generateName": "w-", "labels": {"b": "2", "a": "1"},
          "annotations": {"z": "", "note": "x"},
          "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "u-1",
                               "controller": True, "blockOwnerDeletion": False},
                              {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u-2"}],
          "finalizers": ["f1", "example.com/f2"],
          "managedFields": [{"manager": "kubectl", "operation": "Apply", "apiVersion": "example.com/v1",
                             "time": "2024-05-06T07:08:09Z", "fieldsType": "FieldsV1",
                             "fieldsV1": {"f:spec": {"f:size": {}}, "f:metadata": {"f:labels": {".": {}}}}},
                            {"manager": "m2", "operation": "Update", "apiVersion": "example.com/v1",
                             "fieldsType": "FieldsV1", "subresource": "status"}]}

    def setUp(self):
        md = dict(self.MD)
        st, self.obj = SIM.json("POST", "/apis/example.com/v1/namespaces/default/widgets",
                                {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": md, "spec": {"a": 1}})
        if st == 409:
            st, self.obj = SIM.get("/apis/example.com/v1/namespaces/default/widgets/w-meta")
        self.assertEqual(st in (200, 201), True, self.obj)

    def check_meta(self, m):
        o = self.obj["metadata"]
        self.assertEqual((m.name, m.generateName, m.namespace, m.selfLink, m.uid, m.resourceVersion, m.generation),
                         ("w-meta", "w-", "default", "", o["uid"], o["resourceVersion"], 1))
        for f in ("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
                  "creationTimestamp"):
            self.assertTrue(m.HasField(f), f)   # non-pointer fields: always written
        self.assertEqual(m.creationTimestamp.seconds, rfc3339_seconds(o["creationTimestamp"]))
        self.assertTrue(m.creationTimestamp.HasField("nanos"))
        self.assertFalse(m.HasField("deletionTimestamp"))
        self.assertFalse(m.HasField("deletionGracePeriodSeconds"))
        self.assertEqual(dict(m.labels), {"a": "1", "b": "2"})
        self.assertEqual(dict(m.annotations), {"z": "", "note": "x"})
        r0, r1 = m.ownerReferences
        self.assertEqual((r0.kind, r0.name, r0.uid, r0.apiVersion, r0.controller, r0.blockOwnerDeletion),
                         ("Deployment", "d", "u-1", "apps/v1", True, False))
        self.assertTrue(r0.HasField("blockOwnerDeletion"))
        self.assertFalse(r1.HasField("controller"))
        self.assertFalse(r1.HasField("blockOwnerDeletion"))
        self.assertEqual(list(m.finalizers), ["f1", "example.com/f2"])
        f0, f1 = m.managedFields
        self.assertEqual((f0.manager, f0.operation, f0.apiVersion, f0.fieldsType, f0.subresource),
                         ("kubectl", "Apply", "example.com/v1", "FieldsV1", ""))
        self.assertEqual(f0.time.seconds, rfc3339_seconds("2024-05-06T07:08:09Z"))
        self.assertEqual(f0.fieldsV1.raw, b'{"f:metadata":{"f:labels":{".":{}}},"f:spec":{"f:size":{}}}')
        self.assertFalse(f1.HasField("time"))
        self.assertFalse(f1.HasField("fieldsV1"))
        self.assertEqual(f1.subresource, "status")
        # byte order: ascending field numbers, map entries by key
        raw = m.SerializeToString(deterministic=True)
        self.assertEqual(raw, self.expected_bytes())

    def expected_bytes(self):
        """ObjectMeta written by hand from generated.pb.go's rules."""
        o = self.obj["metadata"]

        def ln(tag, b):
            return bytes([tag, len(b)]) + b

        def varint(n):
            out = b""
            while n > 0x7f:
                out += bytes([(n & 0x7f) | 0x80])
                n >>= 7
            return out + bytes([n])
        secs = rfc3339_seconds(o["creationTimestamp"])
        out = (_pb_str(0x0a, "w-meta") + _pb_str(0x12, "w-") + _pb_str(0x1a, "default") + b"\x22\x00" +
               _pb_str(0x2a, o["uid"]) + _pb_str(0x32, o["resourceVersion"]) + b"\x38\x01" +
               ln(0x42, b"\x08" + varint(secs) + b"\x10\x00"))
        out += ln(0x5a, _pb_str(0x0a, "a") + _pb_str(0x12, "1")) + ln(0x5a, _pb_str(0x0a, "b") + _pb_str(0x12, "2"))
        out += ln(0x62, _pb_str(0x0a, "note") + _pb_str(0x12, "x")) + ln(0x62, _pb_str(0x0a, "z") + b"\x12\x00")
        out += ln(0x6a, _pb_str(0x0a, "Deployment") + _pb_str(0x1a, "d") + _pb_str(0x22, "u-1") +
                  _pb_str(0x2a, "apps/v1") + b"\x30\x01\x38\x00")
        out += ln(0x6a, _pb_str(0x0a, "Pod") + _pb_str(0x1a, "p") + _pb_str(0x22, "u-2") + _pb_str(0x2a, "v1"))
        out += _pb_str(0x72, "f1") + _pb_str(0x72, "example.com/f2")
        fv = b'{"f:metadata":{"f:labels":{".":{}}},"f:spec":{"f:size":{}}}'
        e0 = (_pb_str(0x0a, "kubectl") + _pb_str(0x12, "Apply") + _pb_str(0x1a, "example.com/v1") +
              ln(0x22, b"\x08" + varint(rfc3339_seconds("2024-05-06T07:08:09Z")) + b"\x10\x00") +
              _pb_str(0x32, "FieldsV1") + ln(0x3a, ln(0x0a, fv)) + b"\x42\x00")
        e1 = (_pb_str(0x0a, "m2") + _pb_str(0x12, "Update") + _pb_str(0x1a, "example.com/v1") +
              _pb_str(0x32, "FieldsV1") + _pb_str(0x42, "status"))
        out += b"\x8a\x01" + bytes([len(e0)]) + e0 + b"\x8a\x01" + bytes([len(e1)]) + e1
        return out

    def test_get_list_watch(self):
        base = "/apis/example.com/v1/namespaces/default/widgets"
        st, r, data = SIM.req("GET", base + "/w-meta", headers={"Accept": META_PB})
        self.assertEqual((st, r.getheader("Content-Type")), (200, PB))
        u, pom = pbt().obj(data, "PartialObjectMetadata")
        self.assertEqual((u.typeMeta.apiVersion, u.typeMeta.kind), ("meta.k8s.io/v1", "PartialObjectMetadata"))
        self.assertEqual(u.raw, b"\x0a" + bytes(_varint_bytes(len(self.expected_bytes()))) + self.expected_bytes())
        self.check_meta(pom.metadata)
        st, r, data = SIM.req("GET", base + "?fieldSelector=metadata.name%3Dw-meta", headers={"Accept": META_PB_LIST})
        u, lst = pbt().obj(data, "PartialObjectMetadataList")
        self.assertEqual(u.typeMeta.kind, "PartialObjectMetadataList")
        self.check_meta(lst.items[0].metadata)
        w = Stream(SIM, base + "?watch=1&fieldSelector=metadata.name%3Dw-meta", headers={
            "Accept": META_PB + ";stream=watch"})
        try:
            self.assertEqual(w.headers["content-type"], PB + ";stream=watch")
            etype, u, o = pb_event(pb_frames(w, 1)[0])
            self.assertEqual((etype, u.typeMeta.kind), ("ADDED", "PartialObjectMetadata"))
            self.check_meta(o.metadata)
        finally:
            w.close()
        # the JSON form of the same metadata agrees
        st, r, data = SIM.req("GET", base + "/w-meta", headers={
            "Accept": "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"})
        md = json.loads(data)["metadata"]
        self.assertEqual(md["managedFields"][0]["fieldsV1"], self.MD["managedFields"][0]["fieldsV1"])
        self.assertEqual(md["ownerReferences"][0]["blockOwnerDeletion"], False)

    def test_odd_metadata(self):
        """Values the Unstructured accessors read as zero, a deletion timestamp and grace
        period, a zero managedFields time (a present, empty Time message)."""
        base = "/apis/example.com/v1/namespaces/default/widgets"
        SIM.json("POST", base, {"metadata": {"name": "w-odd", "generation": "7", "labels": {"a": 1}}})
        SIM.write(verb="update", resource="widgets", namespace="default", name="w-odd")
        # make the stored metadata what a client could have stored
        st, r, data = SIM.req("GET", base + "/w-odd", headers={"Accept": META_PB})
        m = pbt().obj(data, "PartialObjectMetadata")[1].metadata
        self.assertEqual(m.generation, 1)          # set by the create
        self.assertEqual(dict(m.labels), {})       # a non-string value: the accessor gives nil
        st, out = SIM.json("POST", "/apisim/write", {
            "verb": "create", "resource": "widgets", "namespace": "default", "name": "w-odd2",
            "object": {"metadata": {"deletionTimestamp": "2024-01-02T03:04:05.678Z", "deletionGracePeriodSeconds": -1,
                                    "managedFields": [{"manager": "z", "time": "0001-01-01T00:00:00Z"}]}}})
        st, r, data = SIM.req("GET", base + "/w-odd2", headers={"Accept": META_PB})
        u, pom = pbt().obj(data, "PartialObjectMetadata")
        m = pom.metadata
        self.assertEqual(m.deletionTimestamp.seconds, rfc3339_seconds("2024-01-02T03:04:05Z"))
        self.assertEqual(m.deletionGracePeriodSeconds, -1)
        self.assertIn(b"\x50" + b"\xff" * 9 + b"\x01", u.raw)    # int64 -1: a 10-byte varint
        self.assertTrue(m.managedFields[0].HasField("time"))
        self.assertEqual(m.managedFields[0].time.ByteSize(), 0)  # the zero Time: an empty message


def _varint_bytes(n):
    out = []
    while n > 0x7f:
        out.append((n & 0x7f) | 0x80)
        n >>= 7
    out.append(n)
    return out


def main():
    try:
        prog = unittest.main(exit=False, verbosity=2 if "-v" in sys.argv else 1)
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    r = prog.result
    bad = len(r.failures) + len(r.errors) + len(r.unexpectedSuccesses)
    skipped = len(r.skipped)
    print("apisim: %d passed, %d failed, %d skipped" % (r.testsRun - bad - skipped, bad, skipped))
    sys.exit(0 if r.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
