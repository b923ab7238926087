"""Passthrough basics: kwc forwards any request and its answer faithfully."""
import hashlib
import json
import unittest

from cluster import EnvTestCase, Env, connect, http_connection, http_request, read_to_eof, wait_for


def norm_headers(h):
    # Date and per-connection headers legitimately differ between two answers.
    return {k: v for k, v in h.items() if k not in ("date", "audit-id", "connection", "keep-alive")}


class PassthroughTest(EnvTestCase):
    apisim_args = ["--pods", "40", "--nodes", "4"]

    def both(self, method, path, body=None, headers=None):
        d = http_request(self.env.apisim.port, method, path, body=body, headers=headers)
        k = http_request(self.env.kwc.port, method, path, body=body, headers=headers)
        return d, k

    def assertSameAnswer(self, path, headers=None):
        d, k = self.both("GET", path, headers=headers)
        self.assertEqual(d[0], k[0], path)
        self.assertEqual(d[2], k[2], path)
        self.assertEqual(norm_headers(d[1]), norm_headers(k[1]), path)
        return k

    def test_reads_identical(self):
        for path in ["/version", "/api", "/api/v1", "/apis", "/apis/apps/v1",
                     "/api/v1/pods", "/api/v1/namespaces/default/pods?limit=5",
                     "/api/v1/pods?labelSelector=app%3Dapp-1%2Ctier+in+%28web%2Cdb%29",
                     "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1",
                     "/api/v1/nodes/node-0", "/api/v1/namespaces/default/pods/does-not-exist",
                     "/api/v1/pods?fieldSelector=spec.bogus%3Dx", "/apis/example.com/v1/widgets"]:
            self.assertSameAnswer(path)

    def test_status_bodies_pass_through(self):
        st, h, b = http_request(self.env.kwc.port, "GET", "/api/v1/namespaces/default/pods/nope")
        self.assertEqual(st, 404)
        s = json.loads(b)
        self.assertEqual((s["kind"], s["reason"], s["code"]), ("Status", "NotFound", 404))

    def test_crud_through_kwc(self):
        kp, ap = self.env.kwc.port, self.env.apisim.port
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "pt-crud"}, "data": {"a": "1"}}
        st, _, b = http_request(kp, "POST", "/api/v1/namespaces/default/configmaps", body=cm)
        self.assertEqual(st, 201, b)
        st, _, b = http_request(kp, "POST", "/api/v1/namespaces/default/configmaps", body=cm)
        self.assertEqual(st, 409, b)
        st, _, b = http_request(ap, "GET", "/api/v1/namespaces/default/configmaps/pt-crud")
        self.assertEqual(json.loads(b)["data"], {"a": "1"})
        st, _, b = http_request(kp, "PATCH", "/api/v1/namespaces/default/configmaps/pt-crud",
                                body=b'{"data":{"b":"2"}}',
                                headers={"Content-Type": "application/merge-patch+json"})
        self.assertEqual(st, 200, b)
        obj = json.loads(b)
        self.assertEqual(obj["data"], {"a": "1", "b": "2"})
        obj["data"] = {"c": "3"}
        st, _, b = http_request(kp, "PUT", "/api/v1/namespaces/default/configmaps/pt-crud", body=obj)
        self.assertEqual(st, 200, b)
        st, _, b = http_request(kp, "PUT", "/api/v1/namespaces/default/configmaps/pt-crud", body=obj)
        self.assertEqual(st, 409, b)  # stale resourceVersion
        st, _, b = http_request(kp, "DELETE", "/api/v1/namespaces/default/configmaps/pt-crud")
        self.assertEqual(st, 200, b)
        st, _, b = http_request(ap, "GET", "/api/v1/namespaces/default/configmaps/pt-crud")
        self.assertEqual(st, 404)

    def test_head(self):
        d, k = self.both("HEAD", "/api/v1/nodes")
        self.assertEqual(d[0], k[0])
        self.assertEqual(k[2], b"")

    def test_http10_client_gets_no_chunking(self):
        s = connect(self.env.kwc.port, timeout=20)
        s.sendall(b"GET /api/v1/nodes?watch=true&timeoutSeconds=1 HTTP/1.0\r\nHost: localhost\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break  # the body is close-delimited
            data += chunk
        s.close()
        head, body = data.split(b"\r\n\r\n", 1)
        self.assertTrue(head.startswith(b"HTTP/1.0 200") or head.startswith(b"HTTP/1.1 200"), head)
        self.assertNotIn(b"chunked", head.lower())
        events = [json.loads(l) for l in body.splitlines() if l.strip()]
        self.assertEqual(len(events), 4)  # one ADDED per node, as raw JSON lines
        self.assertTrue(all(e["type"] == "ADDED" for e in events))

    def test_own_endpoints_read_and_drop_bodies(self):
        # Each request's body is bounded on its own: many moderate bodies in a
        # row are all answered (the bound is not a process-wide total).
        body = b"x" * (700 * 1024)
        for _ in range(3):
            st, _, b = http_request(self.env.kwc.port, "POST", "/healthz", body=body)
            self.assertEqual((st, b), (200, b"ok"))

    def test_keepalive_connection_reused(self):
        c = http_connection(self.env.kwc.port, timeout=10)
        bodies = []
        for _ in range(5):
            c.request("GET", "/api/v1/nodes/node-1")
            r = c.getresponse()
            bodies.append(r.read())
            self.assertEqual(r.status, 200)
        c.close()
        self.assertEqual(len(set(bodies)), 1)

    def raw(self, port, request):
        s = connect(port, timeout=10)
        s.sendall(request)
        return read_to_eof(s)

    def test_bad_query_pairs_forwarded_like_the_upstream_sees_them(self):
        # Go's net/http drops query pairs with bad escapes; kwc forwards the
        # query untouched, so both paths give the upstream's own answer.
        req = b"GET /api/v1/nodes?limit=%zz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        d = self.raw(self.env.apisim.port, req)
        k = self.raw(self.env.kwc.port, req)
        self.assertEqual(d.split(b"\r\n", 1)[0], k.split(b"\r\n", 1)[0])
        self.assertEqual(d.split(b"\r\n\r\n", 1)[1], k.split(b"\r\n\r\n", 1)[1])

    def test_bad_path_escape_is_a_400_status(self):
        data = self.raw(self.env.kwc.port, b"GET /api/v1/pods/%zz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        self.assertTrue(data.startswith(b"HTTP/1.1 400"), data[:200])
        body = data.split(b"\r\n\r\n", 1)[1]
        self.assertEqual(json.loads(body)["reason"], "BadRequest")


class CredentialsTest(unittest.TestCase):
    """In insecure-allow mode kwc speaks with its own identity (like kubectl
    proxy): a caller's Authorization or Impersonate-* must not reach the upstream."""

    def test_client_token_is_stripped(self):
        with Env(apisim_args=["--token", "sekret", "--nodes", "2"], wait_ready=False) as env:
            st, _, _ = http_request(env.apisim.port, "GET", "/api/v1/nodes",
                                    headers={"Authorization": "Bearer sekret"})
            self.assertEqual(st, 200)  # the token is right
            st, _, b = http_request(env.kwc.port, "GET", "/api/v1/nodes",
                                    headers={"Authorization": "Bearer sekret",
                                             "Impersonate-User": "admin"})
            self.assertEqual(st, 401, b)  # ...but kwc did not pass it on
            self.assertEqual(json.loads(b)["reason"], "Unauthorized")


if __name__ == "__main__":
    unittest.main()
