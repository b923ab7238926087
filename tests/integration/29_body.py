"""Pretty output and gzip for what kwc answers from its cache (issue 23).

kube-apiserver's rules (responsewriters.SerializeObject), kwc's side of them
(the differential matrix in 10_ compares with apisim's): a list, a get and a
Status error that ask for pretty output (?pretty=true, a curl, Wget or
Mozilla/5.0 User-Agent) are the compact answer re-indented by
json.MarshalIndent's rules with no final newline; gzip when the first
Accept-Encoding line has a token equal to "gzip" and the body as sent is
over 131072 bytes: Content-Encoding: gzip, Vary: Accept-Encoding, no
Content-Length, and the decompressed bytes are the identity answer's. At
131072 bytes exactly the answer is identity; "gzip;q=1", "GZIP", "*",
"x-gzip" and gzip on a second header line are not gzip. HTTP/1.0 gets a
close-delimited gzip body, HTTP/2 (curl --http2-prior-knowledge) a gzip
stream. Every one of these reads is the cache's: apisim's list and get
counters do not move. HEAD is passed to the upstream.
"""
import gzip
import json
import os
import socket
import subprocess
import tempfile
import unittest
import zlib

from cluster import EnvTestCase, http_connection, http_request, only_in_plaintext_run, only_over_http1, wait_for

GZIP_MIN = 131072
JSON = {"Accept": "application/json", "User-Agent": "kwc-it"}
LIST = "/api/v1/pods?resourceVersion=0"


def go_indent(b):
    """encoding/json's Indent(dst, src, "", "  ") over a compact body, the
    trailing newline dropped (json.MarshalIndent writes none)."""
    out = bytearray()
    depth, need, in_str, esc = 0, False, False, False
    for c in b.rstrip(b"\n"):
        ch = bytes([c])
        if in_str:
            out += ch
            if esc:
                esc = False
            elif ch == b"\\":
                esc = True
            elif ch == b'"':
                in_str = False
            continue
        if ch in b" \t\r\n":
            continue
        if need and ch not in b"}]":
            need = False
            depth += 1
            out += b"\n" + b"  " * depth
        if ch in b"{[":
            need = True
            out += ch
        elif ch == b",":
            out += ch + b"\n" + b"  " * depth
        elif ch == b":":
            out += b": "
        elif ch in b"}]":
            if need:
                need = False
            else:
                depth -= 1
                out += b"\n" + b"  " * depth
            out += ch
        else:
            if ch == b'"':
                in_str = True
            out += ch
    return bytes(out)


def reads(env):
    return {k: v for k, v in env.stats()["requests"].items() if k.startswith(("list ", "get "))}


class Body(EnvTestCase):
    apisim_args = ["--pods", "120", "--namespaces", "3"]
    kwc_args = ["--resources", "v1/pods,v1/nodes"]

    def setUp(self):
        self.port = self.env.kwc.port
        wait_for(lambda: http_request(self.port, "GET", LIST, headers=JSON)[0] == 200, 30, "the cache serves")

    def get(self, path, **headers):
        h = dict(JSON)
        h.update(headers)
        return http_request(self.port, "GET", path, headers=h)

    def served(self, fn):
        """fn's answer, and that the cache gave it (apisim's reads unchanged)."""
        before = reads(self.env)
        r = fn()
        self.assertEqual(reads(self.env), before, "apisim answered a read the cache should have")
        return r

    # ---- pretty ----

    def test_pretty_list_get_error(self):
        for path in (LIST, "/api/v1/namespaces/ns-1/pods?resourceVersion=0&limit=3",
                     "/api/v1/nodes?resourceVersion=0", "/api/v1/namespaces/ns-1/pods/pod-1?resourceVersion=0",
                     "/api/v1/namespaces/ns-1/pods/nope?resourceVersion=0",
                     "/api/v1/pods?resourceVersionMatch=NotOlderThan"):
            st, h, compact = self.get(path)
            self.assertTrue(compact.endswith(b"}\n"), path)
            want = go_indent(compact)
            sep = "&" if "?" in path else "?"
            for how, p, hdr in (("?pretty=true", path + sep + "pretty=true", {}),
                                ("?pretty=1", path + sep + "pretty=1", {}),
                                ("curl", path, {"User-Agent": "curl/8.5.0"}),
                                ("Wget", path, {"User-Agent": "Wget/1.21.3"}),
                                ("Mozilla", path, {"User-Agent": "Mozilla/5.0 (X11; Linux x86_64)"})):
                pst, ph, pretty = self.served(lambda: self.get(p, **hdr))
                self.assertEqual(pst, st, "%s %s" % (how, path))
                self.assertEqual(pretty, want, "%s %s: MarshalIndent's bytes" % (how, path))
                self.assertEqual(ph.get("content-type"), "application/json")
        # not pretty: ?pretty=false beats the agent; an agent kube does not name
        for p, hdr in ((LIST + "&pretty=false", {"User-Agent": "curl/8.5.0"}), (LIST, {"User-Agent": "xcurl"}),
                       (LIST + "&pretty=yes", {})):
            st, h, b = self.served(lambda: self.get(p, **hdr))
            self.assertTrue(b.endswith(b"}\n") and b[:2] == b'{"', p)

    def test_pretty_protobuf_is_not_pretty(self):
        st, h, b = self.get(LIST + "&pretty=true", Accept="application/vnd.kubernetes.protobuf")
        self.assertEqual(st, 200)
        self.assertEqual(b[:4], b"k8s\x00")

    # ---- gzip ----

    def test_gzip_list(self):
        st, h, ident = self.get(LIST)
        self.assertGreater(len(ident), GZIP_MIN)
        self.assertNotIn("content-encoding", h)
        for ae in ("gzip", "gzip, deflate, br", "deflate,gzip", " gzip "):
            st, h, b = self.served(lambda: self.get(LIST, **{"Accept-Encoding": ae}))
            self.assertEqual(st, 200)
            self.assertEqual(h.get("content-encoding"), "gzip", ae)
            self.assertEqual(h.get("vary"), "Accept-Encoding", ae)
            self.assertNotIn("content-length", h, ae)
            self.assertLess(len(b), len(ident) // 3)
            self.assertEqual(gzip.decompress(b), ident, ae)
        for ae in ("gzip;q=1", "GZIP", "*", "x-gzip", "identity", "deflate"):
            st, h, b = self.served(lambda: self.get(LIST, **{"Accept-Encoding": ae}))
            self.assertNotIn("content-encoding", h, ae)
            self.assertEqual(b, ident, ae)

    def test_gzip_pretty(self):
        st, h, ident = self.get(LIST)
        st, h, b = self.served(lambda: self.get(LIST + "&pretty=true", **{"Accept-Encoding": "gzip"}))
        self.assertEqual(h.get("content-encoding"), "gzip")
        self.assertEqual(gzip.decompress(b), go_indent(ident))

    def test_small_list_not_compressed(self):
        st, h, ident = self.get("/api/v1/nodes?resourceVersion=0")
        self.assertLess(len(ident), GZIP_MIN)
        st, h, b = self.served(lambda: self.get("/api/v1/nodes?resourceVersion=0", **{"Accept-Encoding": "gzip"}))
        self.assertNotIn("content-encoding", h)
        self.assertNotIn("vary", h)
        self.assertEqual(h.get("content-length"), str(len(ident)))
        self.assertEqual(b, ident)

    def sized_pod(self, want):
        """A pod whose get from the cache is exactly want bytes (identity)."""
        path = "/api/v1/namespaces/ns-0/pods/sized"
        pad = want - 1000
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sized", "namespace": "ns-0",
                                                                  "annotations": {"pad": "x" * pad}},
               "spec": {"containers": [{"name": "c", "image": "i"}]}}
        st, h, b = http_request(self.env.apisim.port, "GET", path)
        method, url = ("PUT", path) if st == 200 else ("POST", "/api/v1/namespaces/ns-0/pods")
        for _ in range(6):
            st, h, b = http_request(self.env.apisim.port, method, url, body=pod)
            self.assertIn(st, (200, 201), b[:300])
            rv = json.loads(b)["metadata"]["resourceVersion"]
            method, url = "PUT", path
            pod = json.loads(b)

            def cached():
                st, h, b = self.get(path + "?resourceVersion=0")
                return b if st == 200 and json.loads(b)["metadata"]["resourceVersion"] == rv else None
            wait_for(cached, 30, "the cache has the pod's update")
            n = len(cached())
            if n == want:
                return path + "?resourceVersion=0"
            pod["metadata"]["annotations"]["pad"] = "x" * (len(pod["metadata"]["annotations"]["pad"]) + want - n)
        self.fail("no pod of %d bytes" % want)

    def test_threshold_edges(self):
        path = self.sized_pod(GZIP_MIN)
        st, h, ident = self.get(path)
        st, h, b = self.served(lambda: self.get(path, **{"Accept-Encoding": "gzip"}))
        self.assertNotIn("content-encoding", h, "131072 bytes stay identity")
        self.assertEqual(h.get("content-length"), str(GZIP_MIN))
        self.assertEqual(b, ident)
        path = self.sized_pod(GZIP_MIN + 1)
        st, h, ident = self.get(path)
        st, h, b = self.served(lambda: self.get(path, **{"Accept-Encoding": "gzip"}))
        self.assertEqual(h.get("content-encoding"), "gzip", "131073 bytes are compressed")
        self.assertEqual(h.get("vary"), "Accept-Encoding")
        self.assertEqual(gzip.decompress(b), ident)

    @only_over_http1("HTTP/2 header lists: test_curl_http2 sends one line")
    def test_second_header_line(self):
        st, h, ident = self.get(LIST)
        for lines, compressed in ((["identity", "gzip"], False), (["gzip", "identity"], True)):
            c = http_connection(self.port)
            try:
                c.putrequest("GET", LIST, skip_accept_encoding=True)
                for k, v in JSON.items():
                    c.putheader(k, v)
                for v in lines:
                    c.putheader("Accept-Encoding", v)
                c.endheaders()
                r = c.getresponse()
                b = r.read()
                self.assertEqual(r.getheader("Content-Encoding") == "gzip", compressed, lines)
                self.assertEqual(gzip.decompress(b) if compressed else b, ident, lines)
            finally:
                c.close()

    @only_over_http1("HTTP/1.0 framing")
    def test_http10(self):
        st, h, ident = self.get(LIST)
        c = http_connection(self.port)  # its socket: TLS in the TLS run
        c.connect()
        s = c.sock
        try:
            s.sendall(("GET %s HTTP/1.0\r\nAccept: application/json\r\nUser-Agent: kwc-it\r\n"
                       "Accept-Encoding: gzip\r\n\r\n" % LIST).encode())
            data = b""
            while True:
                d = s.recv(65536)
                if not d:
                    break
                data += d
        finally:
            c.close()
        head, _, body = data.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.0 200"), head[:100])
        self.assertIn(b"\r\nContent-Encoding: gzip", head)
        self.assertNotIn(b"Transfer-Encoding", head)
        self.assertEqual(gzip.decompress(body), ident)

    @only_in_plaintext_run("curl over plaintext HTTP/2 with prior knowledge")
    def test_curl_http2(self):
        st, h, ident = self.get(LIST)
        tmp = tempfile.mkdtemp(dir=self.env.dir)
        out, hdr = os.path.join(tmp, "body"), os.path.join(tmp, "head")
        r = self.served(lambda: subprocess.run(
            ["curl", "-sS", "--http2-prior-knowledge", "-o", out, "-D", hdr, "-A", "kwc-it",
             "-H", "Accept: application/json", "-H", "Accept-Encoding: gzip",
             "http://127.0.0.1:%d%s" % (self.port, LIST)], capture_output=True, timeout=60))
        self.assertEqual(r.returncode, 0, r.stderr)
        head = open(hdr).read().lower()
        self.assertTrue(head.startswith("http/2 200"), head)
        self.assertIn("content-encoding: gzip", head)
        self.assertIn("vary: accept-encoding", head)
        self.assertEqual(gzip.decompress(open(out, "rb").read()), ident)
        # curl's own agent: pretty (and --compressed decodes it)
        r = self.served(lambda: subprocess.run(
            ["curl", "-sS", "--http2-prior-knowledge", "--compressed", "-o", out,
             "http://127.0.0.1:%d%s" % (self.port, LIST)], capture_output=True, timeout=60))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(open(out, "rb").read(), go_indent(ident))

    def test_head_passes(self):
        before = reads(self.env)
        st, h, b = http_request(self.port, "HEAD", LIST, headers=dict(JSON, **{"Accept-Encoding": "gzip"}))
        self.assertEqual(st, 200)
        self.assertEqual(b, b"")
        self.assertNotEqual(reads(self.env), before, "HEAD is the upstream's")

    def test_watch_never_compressed(self):
        c = http_connection(self.port)
        try:
            c.request("GET", "/api/v1/pods?watch=1&resourceVersion=0&timeoutSeconds=1",
                      headers=dict(JSON, **{"Accept-Encoding": "gzip", "User-Agent": "curl/8"}))
            r = c.getresponse()
            self.assertEqual(r.status, 200)
            self.assertIsNone(r.getheader("Content-Encoding"))
            line = r.read().split(b"\n")[0]  # the watch ends after timeoutSeconds
            self.assertTrue(line.startswith(b'{"type":"ADDED","object":{"kind":"Pod"'), line[:80])
        finally:
            c.close()


if __name__ == "__main__":
    unittest.main()
