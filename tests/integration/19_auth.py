"""Delegated authentication and authorization (kwc --auth=delegated): kwc
serving TLS in front of apisim --policy (TLS too, so client certificates
authenticate on both sides), and every answer kwc gives compared with the
answer apisim gives to the same request made directly with the caller's own
credentials. The emulator is the oracle: no status or message below is kwc's
own idea. (The direct half is also checked against a table of what the policy
allows, EXPECT, so a policy typo cannot make everything a trivially equal 403.)

  1. matrix: identities x verbs x resources x scopes, direct vs through kwc:
     the same status, byte-identical bodies for every non-2xx answer, the same
     items (namespace, name, resourceVersion) for 200 gets/lists/watches;
  2. no leak: every object in a 200 kwc gave is one the caller may read
     (asked of apisim as a SubjectAccessReview);
  3. cache-servable requests never reached apisim through kwc; passthrough
     ones (quorum reads, create, delete, exec) reached it once, impersonating
     the caller (Impersonate-User, Impersonate-Group) on kwc's credential;
     those kwc denied never reached it;
  4. revocation within --authorization-webhook-cache-authorized-ttl;
  5. 50 concurrent identical requests by a new identity: one TokenReview and
     one SubjectAccessReview; a second burst within the TTL: none;
  6. reviews failing upstream: 401 (TokenReview) / 500 (SubjectAccessReview)
     for a new identity, 200 for one with cached answers;
  7. kubectl (token, client certificate, --as), python3-kubernetes and
     @kubernetes/client-node through kwc with their own credentials;
  8. --passthrough-identity=forward-token.

Certificates that do not verify (expired, or from another CA): apisim (Python
ssl, CERT_OPTIONAL) fails the TLS handshake, as the README of apisim says
(kube-apiserver would complete it and answer 401). With TLS 1.3 the client's
side of the handshake completes first and the refusal shows on the first read
(an alert: "certificate expired" / "unknown ca", or a reset/close). Both sides
must refuse: a TLS failure, or a 401.

AUTHTEST_DIRECT_ONLY=1 runs only the direct half (apisim alone, no kwc): the
check of this module's expectations against the emulator.
"""
import base64
import concurrent.futures
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

import certs
from cluster import (ProcGroup, APISIM, KWC_BIN, KWC_EXTRA_ARGS, KWC_WRAP, PYTHON, ClientTLS, Fatal, Proc,
                     kubectl_binaries, only_in_plaintext_run, wait_for)

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENTS = os.path.join(HERE, "clients")
P = certs.pki()
DIRECT_ONLY = os.environ.get("AUTHTEST_DIRECT_ONLY", "") == "1"
DIRECT_UA = "kwc-authtest/direct"
VIA_UA = "kwc-authtest/via"
AUTHENTICATED = "system:authenticated"

TOK = {n: "tok-%s-5f0c2a91" % n for n in
       ("kwc", "alice", "bob", "sa1", "carol", "impersonator", "admin", "frank", "gina", "hank", "ivy", "judy",
        "mallory")}
SA1 = "system:serviceaccount:ns-a:sa1"
SA_GROUPS = ["system:serviceaccounts", "system:serviceaccounts:ns-a"]
CACHED = ("pods", "configmaps", "secrets", "widgets")
RESOURCES = "v1/pods,v1/configmaps,v1/secrets,example.com/v1/widgets"
NAMES = {"pods": {"ns-a": ["pod-a1", "pod-a2"], "ns-b": ["pod-b1"]},
         "configmaps": {"ns-a": ["cm-1", "cm-2"], "ns-b": ["cm-b1"]},
         "secrets": {"ns-a": ["sec-a1"], "ns-b": ["sec-b1", "sec-b2"]},
         "widgets": {"ns-a": ["w-a1"], "ns-b": ["w-b1", "w-b2"]}}


def policy_doc(alice_read=True):
    """The RBAC state. Beyond the brief's rights, alice may create/delete
    configmaps and exec in ns-a, dave read pods in ns-a and widgets in ns-b,
    sa1 list/watch (not only get) cm-1: so that passthrough writes, exec, the
    custom resource and single-name watches have allowed cells too."""
    tokens = {TOK["kwc"]: {"user": "kwc"},
              TOK["alice"]: {"user": "alice", "uid": "uid-alice"},
              TOK["bob"]: {"user": "bob", "groups": ["readers"]},
              TOK["sa1"]: {"user": SA1, "uid": "uid-sa1", "groups": SA_GROUPS},
              TOK["carol"]: {"user": "carol"},
              TOK["impersonator"]: {"user": "impersonator"},
              TOK["admin"]: {"user": "admin", "groups": ["system:masters"]},
              TOK["mallory"]: {"user": "mallory"}}
    for n in ("frank", "gina", "hank", "ivy", "judy"):  # fresh identities, one per test
        tokens[TOK[n]] = {"user": n, "groups": ["listers"]}
    rules = [
        {"name": "kwc-cache", "users": ["kwc"], "verbs": ["get", "list", "watch"], "apiGroups": ["", "example.com"],
         "resources": list(CACHED)},
        {"name": "kwc-reviews", "users": ["kwc"], "verbs": ["create"],
         "apiGroups": ["authentication.k8s.io", "authorization.k8s.io"],
         "resources": ["tokenreviews", "subjectaccessreviews"]},
        # users, groups, serviceaccounts, uids, userextras/KEY
        {"name": "kwc-impersonate", "users": ["kwc"], "verbs": ["impersonate"]},
        {"name": "alice-write", "users": ["alice"], "verbs": ["create", "delete"], "apiGroups": [""],
         "resources": ["configmaps"], "namespaces": ["ns-a"]},
        {"name": "alice-exec", "users": ["alice"], "verbs": ["create", "get"], "apiGroups": [""],
         "resources": ["pods/exec"], "namespaces": ["ns-a"]},
        {"name": "readers", "groups": ["readers"], "verbs": ["list", "watch"], "apiGroups": [""],
         "resources": ["secrets"]},
        {"name": "dave", "users": ["dave"], "verbs": ["get", "list", "watch"], "apiGroups": [""],
         "resources": ["pods"], "namespaces": ["ns-a"]},
        {"name": "dave-widgets", "users": ["dave"], "verbs": ["get", "list", "watch"], "apiGroups": ["example.com"],
         "resources": ["widgets"], "namespaces": ["ns-b"]},
        {"name": "sa1", "users": [SA1], "verbs": ["get", "list", "watch"], "apiGroups": [""],
         "resources": ["configmaps"], "resourceNames": ["cm-1"], "namespaces": ["ns-a"]},
        {"name": "impersonate-alice", "users": ["impersonator"], "verbs": ["impersonate"], "apiGroups": [""],
         "resources": ["users"], "resourceNames": ["alice"]},
        {"name": "impersonate-groups", "users": ["impersonator"], "verbs": ["impersonate"], "apiGroups": [""],
         "resources": ["groups"]},
        # issue 19's attacker: may impersonate user x (and a service-account-looking
        # user without a name) and group g, nothing else
        {"name": "mallory-users", "users": ["mallory"], "verbs": ["impersonate"], "apiGroups": [""],
         "resources": ["users"], "resourceNames": ["x", "system:serviceaccount:ns-a"]},
        {"name": "mallory-groups", "users": ["mallory"], "verbs": ["impersonate"], "apiGroups": [""],
         "resources": ["groups"], "resourceNames": ["g"]},
        {"name": "listers", "groups": ["listers"], "verbs": ["get", "list", "watch"], "apiGroups": [""],
         "resources": ["pods"], "namespaces": ["ns-a"]},
    ]
    if alice_read:
        rules.insert(3, {"name": "alice-read", "users": ["alice"], "verbs": ["get", "list", "watch"],
                         "apiGroups": [""], "resources": ["pods", "configmaps"], "namespaces": ["ns-a"]})
    return {"tokens": tokens, "rules": rules}


# What the policy allows, written out independently of it:
# effective user -> [(resources, verbs, namespaces or None = any incl. cluster scope, names or None)]
RIGHTS = {
    "alice": [({"pods", "configmaps"}, {"get", "list", "watch"}, {"ns-a"}, None),
              ({"configmaps"}, {"create", "delete"}, {"ns-a"}, None),
              ({"pods/exec"}, {"create", "get"}, {"ns-a"}, None)],
    "readers": [({"secrets"}, {"list", "watch"}, None, None)],
    "dave": [({"pods"}, {"get", "list", "watch"}, {"ns-a"}, None),
             ({"widgets"}, {"get", "list", "watch"}, {"ns-b"}, None)],
    SA1: [({"configmaps"}, {"get", "list", "watch"}, {"ns-a"}, {"cm-1"})],
    "listers": [({"pods"}, {"get", "list", "watch"}, {"ns-a"}, None)],
}


def allowed(user, groups, resource, verb, ns, name):
    for subj in [user] + list(groups):
        for res, verbs, nss, names in RIGHTS.get(subj, ()):
            if resource in res and verb in verbs and (nss is None or ns in nss) and \
                    (names is None or name in names):
                return True
    return False


class Ident:
    """A caller: its credential (token, client certificate, Impersonate-*
    headers) and the identity apisim gives it (user, groups), None when it
    never gets one. fail: the answer every request gets whatever it asks
    (401, 403 for a denied impersonation, 500), or "tls"."""

    def __init__(self, key, token=None, cert=None, imp=(), user=None, groups=(), fail=None, raw_auth=None):
        self.key, self.token, self.cert, self.imp = key, token, cert, list(imp)
        self.user, self.groups, self.fail = user, list(groups), fail
        self.raw_auth = raw_auth
        self._ctx = None
        self._lock = threading.Lock()

    def context(self):
        with self._lock:
            if self._ctx is None:
                ctx = ssl.create_default_context(cafile=P.ca.crt)
                if self.cert:
                    ctx.load_cert_chain(self.cert.crt, self.cert.key)
                self._ctx = ctx
            return self._ctx

    def headers(self):
        h = []
        if self.token:
            h.append(("Authorization", "Bearer " + self.token))
        if self.raw_auth:
            h.append(("Authorization", self.raw_auth))
        return h + self.imp

    def expect(self, resource, verb, ns, name, anonymous=True):
        """The status the policy gives (verb: kube's; ns None for all namespaces)."""
        if self.fail:
            return self.fail
        if self.user is None:
            return 403 if anonymous else 401
        if self.user == "system:anonymous":
            return 403
        if not allowed(self.user, self.groups, resource, verb, ns, name):
            return 403
        return {"create": 201, "delete": 200}.get(verb, 200) if resource != "pods/exec" else 101


def idents():
    dave = P.issue("dave", "/O=readers/CN=dave", P.client_ca)
    return {
        "alice": Ident("alice", token=TOK["alice"], user="alice", groups=[AUTHENTICATED]),
        "bob": Ident("bob", token=TOK["bob"], user="bob", groups=["readers", AUTHENTICATED]),
        "dave-cert": Ident("dave-cert", cert=dave, user="dave", groups=["readers", AUTHENTICATED]),
        "sa1": Ident("sa1", token=TOK["sa1"], user=SA1, groups=SA_GROUPS + [AUTHENTICATED]),
        "carol": Ident("carol", token=TOK["carol"], user="carol", groups=[AUTHENTICATED]),
        "bad-token": Ident("bad-token", token="tok-nobody-knows", fail=401),
        "none": Ident("none"),   # anonymous: 403 as system:anonymous, or 401 with --anonymous-auth=false
        "impersonator-as-alice": Ident("impersonator-as-alice", token=TOK["impersonator"],
                                       imp=[("Impersonate-User", "alice")], user="alice", groups=[AUTHENTICATED]),
        "impersonator-as-alice+readers": Ident("impersonator-as-alice+readers", token=TOK["impersonator"],
                                               imp=[("Impersonate-User", "alice"), ("Impersonate-Group", "readers")],
                                               user="alice", groups=["readers", AUTHENTICATED]),
        "carol-as-alice": Ident("carol-as-alice", token=TOK["carol"], imp=[("Impersonate-User", "alice")], fail=403),
        "alice-as-bob": Ident("alice-as-bob", token=TOK["alice"], imp=[("Impersonate-User", "bob")], fail=403),
        # groups without a user: kube's 500 text/plain
        "impersonator-group-only": Ident("impersonator-group-only", token=TOK["impersonator"],
                                         imp=[("Impersonate-Group", "readers")], fail=500),
        "expired-cert": Ident("expired-cert", cert=P.issue("erin-expired", "/O=readers/CN=erin", P.client_ca,
                                                           expired=True), fail="tls"),
        "other-ca-cert": Ident("other-ca-cert", cert=P.other_client, fail="tls"),
    }


# ---------------------------------------------------------------------------
# one request, raw, over TLS with the caller's own credentials
# ---------------------------------------------------------------------------

class Answer:
    def __init__(self, refused=None):
        self.refused = refused      # how the TLS layer refused, or None
        self.status = None
        self.headers = {}
        self.body = b""
        self.events = []            # a 200 watch: the events read
        self.extra = b""            # a 200 watch: bytes after the expected events

    def media(self):
        return self.headers.get("content-type", "").split(";")[0].strip()

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        if self.refused:
            return "<refused: %s>" % self.refused
        return "<%s %s %r>" % (self.status, self.media(), self.body[:400])


def describe(e):
    if isinstance(e, ssl.SSLError):
        return "ssl: %s" % (e.reason or e)
    return "%s: %s" % (e.__class__.__name__, e)


def exchange(port, ident, method, target, body=None, ua=DIRECT_UA, watch_count=None, upgrade=(), timeout=10.0):
    """One request on a new TLS connection. watch_count: a watch whose 200
    stream is read until that many events arrived (then what else is already
    there, within 0.2 s), then closed. upgrade: extra headers of an Upgrade
    request; its 101 is not read further."""
    a = Answer()
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s = raw
    try:
        try:
            s = ident.context().wrap_socket(raw, server_hostname="127.0.0.1")
        except (ssl.SSLError, OSError) as e:
            a.refused = "handshake: " + describe(e)
            return a
        h = [("Host", "127.0.0.1:%d" % port), ("User-Agent", ua), ("Accept", "application/json")]
        h += ident.headers() + list(upgrade)
        if body is not None:
            data = json.dumps(body).encode()
            h += [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
        else:
            data = b""
            if method in ("POST", "PUT", "PATCH"):
                h.append(("Content-Length", "0"))
        if watch_count is None and not upgrade:
            h.append(("Connection", "close"))
        req = "%s %s HTTP/1.1\r\n%s\r\n" % (method, target, "".join("%s: %s\r\n" % kv for kv in h))
        buf = b""
        try:
            s.sendall(req.encode() + data)
            while b"\r\n\r\n" not in buf:
                d = s.recv(65536)
                if not d:
                    break
                buf += d
        except (ssl.SSLError, OSError) as e:
            a.refused = "after the handshake: " + describe(e)
            return a
        if b"\r\n\r\n" not in buf:
            a.refused = "after the handshake: closed without an answer (%d bytes)" % len(buf)
            return a
        head, rest = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        a.status = int(lines[0].split()[1])
        for line in lines[1:]:
            k, _, v = line.partition(":")
            a.headers[k.strip().lower()] = v.strip()
        if a.status == 101:
            return a
        reader = _Body(s, rest, a.headers)
        if watch_count is not None and a.status == 200:
            deadline = time.monotonic() + 8
            while len(a.events) < watch_count and time.monotonic() < deadline and not reader.done:
                for line in reader.lines(deadline):
                    a.events.append(json.loads(line))
            s.settimeout(0.2)
            try:
                for line in reader.lines(time.monotonic() + 0.2):
                    a.extra += line + b"\n"
                    a.events.append(json.loads(line))
            except (socket.timeout, ssl.SSLError, OSError):
                pass
            a.body = reader.raw
        else:
            a.body = reader.all()
        return a
    finally:
        s.close()


class _Body:
    """An answer's body: Content-Length, chunked, or to the close."""

    def __init__(self, s, rest, headers):
        self.s, self.buf = s, rest
        self.chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        self.length = int(headers["content-length"]) if "content-length" in headers else None
        self.payload = b""
        self.raw = b""
        self.done = False
        self.pending = b""

    def _recv(self):
        try:
            d = self.s.recv(65536)
        except socket.timeout:
            raise
        except (ssl.SSLError, ConnectionError):
            d = b""
        if not d:
            self.done = True
        self.buf += d
        return d

    def _decode(self):
        if self.chunked:
            while True:
                i = self.buf.find(b"\r\n")
                if i < 0:
                    return
                n = int(self.buf[:i].split(b";")[0], 16)
                if len(self.buf) < i + 2 + n + 2:
                    return
                self.payload += self.buf[i + 2:i + 2 + n]
                self.buf = self.buf[i + 2 + n + 2:]
                if n == 0:
                    self.done = True
                    return
        else:
            self.payload += self.buf
            self.buf = b""
            if self.length is not None and len(self.payload) >= self.length:
                self.done = True

    def all(self):
        self._decode()
        while not self.done:
            self._recv()
            self._decode()
        return self.payload

    def lines(self, deadline):
        """Complete lines, reading until at least one is there or the body ends."""
        while True:
            self._decode()
            if b"\n" in self.payload:
                out, _, self.payload = self.payload.rpartition(b"\n")
                self.raw += out + b"\n"
                return out.split(b"\n")
            if self.done or time.monotonic() > deadline:
                return []
            self._recv()


# ---------------------------------------------------------------------------
# apisim's request log, gathered as it goes (it keeps the latest 200)
# ---------------------------------------------------------------------------

class RequestLog:
    def __init__(self, port):
        self.port = port
        self.entries = []
        self.last = 0

    def sync(self):
        """Fetch what apisim logged since the last call; returns the last seq."""
        st, _, b = http(self.port, "GET", "/apisim/requests")
        assert st == 200, b
        d = json.loads(b)
        new = [e for e in d["requests"] if e["seq"] > self.last]
        if new and new[0]["seq"] != self.last + 1:
            raise AssertionError("apisim's request log moved past %d requests unseen (sync more often)"
                                 % (new[0]["seq"] - self.last - 1))
        self.entries += new
        self.last = d["seq"]
        return self.last

    def between(self, lo, hi):
        return [e for e in self.entries if lo < e["seq"] <= hi]


def http(port, method, path, body=None, headers=None, ident=None, timeout=30):
    """A simple request (control API, seeding): (status, headers, body)."""
    a = exchange(port, ident or NOBODY, method, path, body=body, ua="kwc-authtest/control", timeout=timeout,
                 upgrade=list((headers or {}).items()))
    if a.refused:
        raise ConnectionError(a.refused)
    if a.status == 101:
        raise AssertionError("unexpected 101")
    return a.status, a.headers, a.body


NOBODY = Ident("nobody")
ADMIN = Ident("admin", token=TOK["admin"], user="admin", groups=["system:masters", AUTHENTICATED])


def base(resource):
    return "/apis/example.com/v1" if resource == "widgets" else "/api/v1"


def coll(resource, ns=None):
    return base(resource) + ("/namespaces/%s" % ns if ns else "") + "/" + resource


def new_object(resource, name):
    kind = {"pods": "Pod", "configmaps": "ConfigMap", "secrets": "Secret", "widgets": "Widget"}[resource]
    o = {"apiVersion": "example.com/v1" if resource == "widgets" else "v1", "kind": kind,
         "metadata": {"name": name, "labels": {"app": "authtest"}}}
    if resource == "pods":
        o["spec"] = {"containers": [{"name": "c", "image": "busybox"}]}
    elif resource == "configmaps":
        o["data"] = {"k": name}
    elif resource == "secrets":
        o["data"] = {"k": base64.b64encode(name.encode()).decode()}
    else:
        o["spec"] = {"size": 1}
    return o


def key_rv(o):
    md = o.get("metadata", {})
    return (md.get("namespace", ""), md.get("name"), md.get("resourceVersion"))


def write_kubeconfig(d, name, port, ident):
    user = {}
    if ident.token:
        user["token"] = ident.token
    if ident.cert:
        user.update({"client-certificate": ident.cert.crt, "client-key": ident.cert.key})
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
           "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:%d" % port,
                                                  "certificate-authority": P.ca.crt}}],
           "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
           "users": [{"name": "u", "user": user}]}
    path = os.path.join(d, "kubeconfig-%s-%d" % (name, port))
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def h2_last_request(port, token=None):
    """Two requests in turn on one HTTP/2 connection (TLS, ALPN h2) to
    /api/v1/namespaces/ns-a/pods: (status of the first, whether the server
    sent GOAWAY after it, status of the second or None when the connection
    took no second stream)."""
    import h2client
    conn = h2client.Connection(port, tls=ClientTLS(P.ca.crt))
    try:
        hdrs = {"Authorization": "Bearer " + token} if token else {}
        st1, _, _ = conn.request("GET", "/api/v1/namespaces/ns-a/pods", headers=hdrs, timeout=10)
        # the GOAWAY, if any, comes before the answer's HEADERS (kube sets
        # "Connection: close" before the handler writes)
        conn.read_some()
        went = conn.goaway is not None
        st2 = None
        if not went:
            st2, _, _ = conn.request("GET", "/api/v1/namespaces/ns-a/pods", headers=hdrs, timeout=10)
        else:
            conn.pump(lambda: conn.closed, 10, "the connection's close after GOAWAY")
        return st1, went, st2
    finally:
        conn.close()


# ---------------------------------------------------------------------------

class AuthCase(ProcGroup, unittest.TestCase):
    """apisim --policy over TLS (--client-ca the test client CA) seeded by
    admin, and kwc --auth=delegated serving TLS with --client-ca-file."""
    only_in_plaintext_run = "sets up TLS on both sides itself: a TLS run would repeat it"
    anonymous = True
    kwc_flags = ()

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="kwc-auth-")
        cls.procs = []
        cls.ids = idents()
        cls.policy_file = os.path.join(cls.dir, "policy.json")
        with open(cls.policy_file, "w") as f:
            json.dump(policy_doc(), f)
        try:
            cls.apisim = Proc("apisim", [PYTHON, APISIM, "--listen", "127.0.0.1:0", "--nodes", "1",
                                         "--tls-cert", P.server.crt, "--tls-key", P.server.key,
                                         "--client-ca", P.client_ca.crt, "--policy", cls.policy_file,
                                         "--anonymous-auth=%s" % ("true" if cls.anonymous else "false")],
                              cls.dir, tls=ClientTLS(P.ca.crt))
            cls.apisim.start()
            cls.procs.append(cls.apisim)
            # kwc first: its history then holds every seed event, so the watches
            # from rv_mid (before the seed's updates) are the cache's to serve
            cls.kwc = None if DIRECT_ONLY else cls.start_kwc("kwc", *cls.kwc_flags)
            cls.seed()
            cls.log = RequestLog(cls.apisim.port)
            if cls.kwc:
                cls.wait_synced(cls.kwc)
            cls.log.sync()
        except BaseException:
            cls.dump()
            cls.stop_all()
            raise

    # -- set-up ------------------------------------------------------------------
    @classmethod
    def start_kwc(cls, name, *flags):
        kc = os.path.join(cls.dir, "kwc-kubeconfig")
        with open(kc, "w") as f:
            json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "sim",
                       "clusters": [{"name": "sim", "cluster": {"server": "https://127.0.0.1:%d" % cls.apisim.port,
                                                                "certificate-authority": P.ca.crt}}],
                       "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "kwc"}}],
                       "users": [{"name": "kwc", "user": {"token": TOK["kwc"]}}]}, f)
        args = ["--kubeconfig", kc, "--listen", "127.0.0.1:0", "--data-dir", os.path.join(cls.dir, "data-" + name),
                "--resources", RESOURCES, "--auth=delegated",
                "--anonymous-auth=%s" % ("true" if cls.anonymous else "false"),
                "--tls-cert-file", P.server.crt, "--tls-private-key-file", P.server.key,
                "--client-ca-file", P.client_ca.crt] + list(flags)
        p = Proc(name, KWC_WRAP + [KWC_BIN] + KWC_EXTRA_ARGS + args, cls.dir, tls=ClientTLS(P.ca.crt))
        cls.procs.append(p)
        p.start()
        # admin's credential: /readyz may want one (--anonymous-auth=false)
        wait_for(lambda: exchange(p.port, ADMIN, "GET", "/readyz", timeout=5).status == 200, 30, name + " /readyz")
        return p

    @classmethod
    def seed(cls):
        port = cls.apisim.port
        for ns in ("ns-a", "ns-b"):
            st, _, b = http(port, "POST", "/api/v1/namespaces", ident=ADMIN,
                            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            assert st == 201, b
        for res in CACHED:
            for ns, names in NAMES[res].items():
                for n in names:
                    st, _, b = http(port, "POST", coll(res, ns), ident=ADMIN, body=new_object(res, n))
                    assert st == 201, (res, ns, n, st, b)
        cls.rv_mid = json.loads(http(port, "GET", "/apisim/stats")[2])["rv"]
        # after rv_mid: one update of the first object of each namespace, per resource
        cls.updates = []
        for res in CACHED:
            for ns in ("ns-a", "ns-b"):
                n = NAMES[res][ns][0]
                st, _, b = http(port, "POST", "/apisim/write", body={"verb": "update", "resource": res,
                                                                    "namespace": ns, "name": n,
                                                                    "labels": {"app": "authtest", "touched": "1"}})
                assert st == 200, b
                cls.updates.append((res, ns, n, str(json.loads(b)["rv"])))
        cls.victims = set()

    @classmethod
    def truth(cls, target):
        """admin's direct answer (the whole state; authorization never filters)."""
        a = exchange(cls.apisim.port, ADMIN, "GET", target)
        assert a.status == 200, (target, a)
        d = a.json()
        return sorted(key_rv(o) for o in d["items"]) if "items" in d else [key_rv(d)]

    @classmethod
    def wait_synced(cls, kwc):
        """kwc's cache holds what apisim holds, for every resource (admin asks)."""
        for res in CACHED:
            want = cls.truth(coll(res) + "?resourceVersion=0")

            def same():
                a = exchange(kwc.port, ADMIN, "GET", coll(res) + "?resourceVersion=0", ua=VIA_UA)
                if a.refused or a.status not in (200,):
                    raise Fatal("kwc answered admin's list of %s: %r" % (res, a))
                return sorted(key_rv(o) for o in a.json()["items"]) == want
            wait_for(same, 30, "kwc's cache of %s to hold the seed" % res)

    def ensure_victim(self, res):
        """ns-a/victim exists (deleted by allowed callers, made again by admin)."""
        st, _, b = http(self.apisim.port, "POST", "/apisim/write",
                        body={"verb": "create", "resource": res, "namespace": "ns-a", "name": "victim"})
        assert st == 200 or b"already exists" in b, b

    # -- the matrix ----------------------------------------------------------------
    def read_cases(self, res):
        a1, b1 = NAMES[res]["ns-a"][0], NAMES[res]["ns-b"][0]
        by_name = "fieldSelector=metadata.name%3D" + a1
        rv = self.rv_mid
        return [  # (case, kube verb, namespace, name, target, cache-servable)
            ("get ns-a", "get", "ns-a", a1, coll(res, "ns-a") + "/%s?resourceVersion=0" % a1, True),
            ("get ns-b", "get", "ns-b", b1, coll(res, "ns-b") + "/%s?resourceVersion=0" % b1, True),
            ("get ns-a quorum", "get", "ns-a", a1, coll(res, "ns-a") + "/" + a1, False),
            ("list ns-a", "list", "ns-a", None, coll(res, "ns-a") + "?resourceVersion=0", True),
            ("list ns-b", "list", "ns-b", None, coll(res, "ns-b") + "?resourceVersion=0", True),
            ("list all", "list", None, None, coll(res) + "?resourceVersion=0", True),
            ("list name", "list", "ns-a", a1, coll(res, "ns-a") + "?%s&resourceVersion=0" % by_name, True),
            ("list ns-a quorum", "list", "ns-a", None, coll(res, "ns-a"), False),
            ("list all quorum", "list", None, None, coll(res), False),
            ("watch ns-a rv=0", "watch", "ns-a", None, coll(res, "ns-a") + "?watch=1&resourceVersion=0", True),
            ("watch ns-b rv=0", "watch", "ns-b", None, coll(res, "ns-b") + "?watch=1&resourceVersion=0", True),
            ("watch all rv=0", "watch", None, None, coll(res) + "?watch=1&resourceVersion=0", True),
            ("watch ns-a rv=N", "watch", "ns-a", None, coll(res, "ns-a") + "?watch=1&resourceVersion=%d" % rv,
             True),
            ("watch all rv=N", "watch", None, None, coll(res) + "?watch=1&resourceVersion=%d" % rv, True),
            ("watch name rv=0", "watch", "ns-a", a1,
             coll(res, "ns-a") + "?watch=1&%s&resourceVersion=0" % by_name, True),
            ("watch name rv=N", "watch", "ns-a", a1,
             coll(res, "ns-a") + "?watch=1&%s&resourceVersion=%d" % (by_name, rv), True),
        ]

    def watch_truth(self, res, case, ns, name):
        """The events every allowed watcher gets, as (type, ns, name, rv)."""
        if case.endswith("rv=N"):
            return [("MODIFIED", n_ns, n, rv) for r, n_ns, n, rv in self.updates
                    if r == res and (ns is None or n_ns == ns) and (name is None or n == name)]
        target = coll(res, ns) + "?resourceVersion=0"
        return sorted(("ADDED",) + k for k in self.truth(target) if name is None or k[1] == name)

    def pair(self, ident, method, target, body_of=None, watch_count=None, upgrade=()):
        """The same request direct and through kwc: (direct, via or None)."""
        d = exchange(self.apisim.port, ident, method, target, body=body_of("d") if body_of else None,
                     watch_count=watch_count, upgrade=upgrade)
        if self.kwc is None:
            return d, None, None
        lo = self.log.sync()
        v = exchange(self.kwc.port, ident, method, target, body=body_of("v") if body_of else None, ua=VIA_UA,
                     watch_count=watch_count, upgrade=upgrade)
        return d, v, (lo, self.log.sync())

    def compare(self, cell, ident, expect, d, v, kind, truth=None):
        """Problems with one cell, as strings."""
        out = []
        if ident.fail == "tls":
            for side, a in (("direct", d), ("kwc", v)):
                if a is not None and not a.refused and a.status != 401:
                    out.append("%s: %s accepted a certificate that does not verify: %r" % (cell, side, a))
            return out
        if d.refused or d.status != expect:
            out.append("%s: direct answer %r, the policy says %s (the test's expectations are wrong)"
                       % (cell, d, expect))
        if truth is not None and d.status == 200:
            got = self.items_of(d, kind)
            if got != truth:
                out.append("%s: direct items %r, admin sees %r" % (cell, got, truth))
        if v is None:
            return out
        if v.refused:
            return out + ["%s: kwc refused at the TLS layer (%s), apisim answered %r" % (cell, v.refused, d)]
        if v.status != d.status:
            return out + ["%s: kwc %r, apisim %r" % (cell, v, d)]
        if d.status >= 300 and d.status != 101:
            if v.body != d.body:
                out.append("%s: %d bodies differ:\n  kwc    %r\n  apisim %r" % (cell, d.status, v.body, d.body))
            if v.media() != d.media():
                out.append("%s: content type %r, apisim %r" % (cell, v.media(), d.media()))
        elif d.status == 200 and kind in ("get", "list", "watch"):
            gv, gd = self.items_of(v, kind), self.items_of(d, kind)
            if gv != gd:
                out.append("%s: items differ:\n  kwc    %r\n  apisim %r" % (cell, gv, gd))
        return out

    @staticmethod
    def items_of(a, kind):
        if kind == "watch":
            ev = [(e["type"],) + key_rv(e["object"]) for e in a.events if e["type"] != "BOOKMARK"]
            return sorted(ev) if all(t == "ADDED" for t, *_ in ev) else ev
        d = a.json()
        return sorted(key_rv(o) for o in d["items"]) if kind == "list" else [key_rv(d)]

    def run_matrix(self, names, resources=CACHED, writes=True):
        """Every read cell of every identity, then every write cell (a write
        changes what later reads would see: the rv=N watches expect only the
        seed's updates). Returns (problems, records); a record is dict(ident,
        res, case, verb, method, target, cache, direct, via, window)."""
        problems, records = [], []
        for ik in names:
            ident = self.ids[ik]
            for res in resources:
                cases = self.read_cases(res)
                if ident.fail == "tls":  # the TLS layer decides: a few requests tell it
                    cases = [c for c in cases if c[0] in ("list ns-a", "watch ns-a rv=0")]
                for case, verb, ns, name, target, cache in cases:
                    expect = ident.expect(res, verb, ns, name, self.anonymous)
                    truth = self.watch_truth(res, case, ns, name) if verb == "watch" else None
                    if verb == "list" and expect == 200:
                        truth = [k for k in self.truth(coll(res, ns) + "?resourceVersion=0")
                                 if name is None or k[1] == name]
                    d, v, win = self.pair(ident, "GET", target,
                                          watch_count=len(truth) if verb == "watch" else None)
                    cell = "%s %s %s" % (ik, res, case)
                    problems += self.compare(cell, ident, expect, d, v, verb, truth)
                    records.append(dict(ident=ident, res=res, case=case, verb=verb, method="GET", target=target,
                                        cache=cache, direct=d, via=v, window=win))
                if self.kwc:
                    self.log.sync()
        for ik in names if writes else ():
            ident = self.ids[ik]
            for res in resources:
                if ident.fail != "tls":
                    problems += self.write_cells(ident, res, records)
                if self.kwc:
                    self.log.sync()
        return problems, records

    def write_cells(self, ident, res, records):
        problems = []
        ik = ident.key
        for ns in ("ns-a", "ns-b"):
            tag = "%s-%s-%s" % (ik.replace("+", "-"), res, ns)
            target = coll(res, ns) + "?fieldManager=" + tag
            d, v, win = self.pair(ident, "POST", target, body_of=lambda side: new_object(res, "c-%s-%s" % (tag, side)))
            problems += self.compare("%s %s create %s" % (ik, res, ns), ident,
                                     ident.expect(res, "create", ns, None, self.anonymous), d, v, "create")
            records.append(dict(ident=ident, res=res, case="create " + ns, verb="create", method="POST",
                                target=target, cache=False, direct=d, via=v, window=win))
        # delete ns-a/victim: made again before each side
        target = coll(res, "ns-a") + "/victim"
        self.ensure_victim(res)
        d = exchange(self.apisim.port, ident, "DELETE", target)
        v = win = None
        if self.kwc:
            self.ensure_victim(res)
            self.wait_victim(res)
            lo = self.log.sync()
            v = exchange(self.kwc.port, ident, "DELETE", target, ua=VIA_UA)
            win = (lo, self.log.sync())
        problems += self.compare("%s %s delete ns-a" % (ik, res), ident,
                                 ident.expect(res, "delete", "ns-a", "victim", self.anonymous), d, v, "delete")
        records.append(dict(ident=ident, res=res, case="delete ns-a", verb="delete", method="DELETE", target=target,
                            cache=False, direct=d, via=v, window=win))
        if res == "pods":
            for ns in ("ns-a", "ns-b"):
                pod = NAMES["pods"][ns][0]
                target = "/api/v1/namespaces/%s/pods/%s/exec?command=echo&command=%s&stdout=true" % (
                    ns, pod, "x-" + ik.replace("+", "-"))
                d, v, win = self.pair(ident, "POST", target, upgrade=[
                    ("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1"),
                    ("X-Stream-Protocol-Version", "v4.channel.k8s.io")])
                problems += self.compare("%s exec %s" % (ik, ns), ident,
                                         ident.expect("pods/exec", "create", ns, pod, self.anonymous), d, v, "exec")
                records.append(dict(ident=ident, res="pods/exec", case="exec " + ns, verb="create", method="POST",
                                    target=target, cache=False, direct=d, via=v, window=win))
        return problems

    def wait_victim(self, res):
        """kwc's cache has ns-a/victim (a delete through kwc of an object its
        cache lacks would still pass through; this only keeps the
        direct-vs-kwc comparison about the same state)."""
        want = self.truth(coll(res, "ns-a") + "?resourceVersion=0")
        wait_for(lambda: sorted(key_rv(o) for o in exchange(
            self.kwc.port, ADMIN, "GET", coll(res, "ns-a") + "?resourceVersion=0", ua=VIA_UA).json()["items"])
            == want, 10, "kwc's cache to have ns-a/victim")

    def report(self, problems, what):
        if problems:
            self.fail("%d problems in %s; the first ones:\n%s" % (len(problems), what, "\n".join(problems[:25])))


@only_in_plaintext_run(AuthCase.only_in_plaintext_run)
class AuthMatrixTest(AuthCase):
    """--anonymous-auth=true on both sides."""
    matrix_idents = ["alice", "bob", "dave-cert", "sa1", "carol", "bad-token", "none", "impersonator-as-alice",
                     "impersonator-as-alice+readers", "carol-as-alice", "alice-as-bob", "impersonator-group-only",
                     "expired-cert", "other-ca-cert"]
    _matrix = None

    def matrix(self):
        cls = type(self)
        if cls._matrix is None:
            t0 = time.monotonic()
            cls._matrix = self.run_matrix(self.matrix_idents)
            cls.matrix_seconds = time.monotonic() - t0
        return cls._matrix

    def test_1_matrix(self):
        problems, records = self.matrix()
        tls = [(r["ident"].key, r["case"], r["direct"].refused or r["direct"].status,
                r["via"] and (r["via"].refused or r["via"].status)) for r in records if r["ident"].fail == "tls"]
        print("\n  TLS refusals observed (identity, case, apisim, kwc): %s" % sorted(set(tls)), file=sys.stderr)
        print("  matrix: %d cells in %.1fs" % (len(records), self.matrix_seconds), file=sys.stderr)
        self.report(problems, "the matrix")
        self.assertGreater(sum(1 for r in records if r["direct"].status == 200 and r["verb"] == "watch"), 10)

    @unittest.skipIf(DIRECT_ONLY, "needs kwc")
    def test_2_no_leak(self):
        _, records = self.matrix()
        memo, problems, seen = {}, [], 0
        for r in records:
            v, ident = r["via"], r["ident"]
            if v is None or v.refused or v.status != 200 or r["verb"] not in ("get", "list", "watch"):
                continue
            if v.events or r["verb"] == "watch":
                objs = [e["object"] for e in v.events if e["type"] != "BOOKMARK"]
            else:
                d = v.json()
                objs = d.get("items", [d]) if "items" in d else [d]
            for o in objs:
                ns, name, _ = key_rv(o)
                seen += 1
                if ident.user is None:
                    problems.append("%s %s: kwc returned %s/%s to a caller with no identity" % (
                        ident.key, r["case"], ns, name))
                    continue
                q = (ident.user, tuple(ident.groups), r["verb"], r["res"], ns, name)
                if q not in memo:
                    memo[q] = self.may(*q)
                if not memo[q]:
                    problems.append("%s %s: kwc returned %s/%s, which %s may not %s" % (
                        ident.key, r["case"], ns, name, ident.user, r["verb"]))
        self.report(problems, "kwc's 200 answers (objects the caller may not read)")
        self.assertGreater(seen, 50)

    def may(self, user, groups, verb, res, ns, name):
        ra = {"namespace": ns, "verb": verb, "group": "example.com" if res == "widgets" else "",
              "resource": res, "name": name}
        st, _, b = http(self.apisim.port, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", ident=ADMIN,
                        body={"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                              "spec": {"resourceAttributes": ra, "user": user, "groups": list(groups)}})
        self.assertEqual(st, 201, b)
        return json.loads(b)["status"]["allowed"]

    @unittest.skipIf(DIRECT_ONLY, "needs kwc")
    def test_3_cache_served_and_passthrough_identity(self):
        _, records = self.matrix()
        self.log.sync()
        cache_targets = {r["target"] for r in records if r["cache"]}
        users = {i.user for i in self.ids.values() if i.user} | {"system:anonymous"}
        problems = []
        for e in self.log.entries:
            if e["headers"].get("user-agent") == DIRECT_UA or e["target"].startswith("/apis/authori") \
                    or e["target"].startswith("/apis/authentication"):
                continue
            imp = [v for k, v in e["impersonate"] if k == "impersonate-user"]
            if e["target"] in cache_targets or (e["method"] == "GET" and set(imp) & users and (
                    "resourceVersion=0" in e["target"] or "watch=" in e["target"])):
                problems.append("a cache-servable request reached apisim through kwc: %s %s %r" % (
                    e["method"], e["target"], e["impersonate"]))
        passed = 0
        for r in records:
            v, d, ident = r["via"], r["direct"], r["ident"]
            if r["cache"] or v is None or v.refused or r["window"] is None:
                continue
            seen = [e for e in self.log.between(*r["window"])
                    if e["method"] == r["method"] and e["target"] == r["target"]]
            cell = "%s %s %s" % (ident.key, r["res"], r["case"])
            if v.status in (200, 201, 101):
                passed += 1
                if len(seen) != 1:
                    problems.append("%s: %d requests reached apisim for it (want 1)" % (cell, len(seen)))
                    continue
                e = seen[0]
                imp_user = [v_ for k, v_ in e["impersonate"] if k == "impersonate-user"]
                imp_groups = set(v_ for k, v_ in e["impersonate"] if k == "impersonate-group")
                want = set(ident.groups) - {AUTHENTICATED}
                if imp_user != [ident.user]:
                    problems.append("%s: Impersonate-User %r, want [%r]" % (cell, imp_user, ident.user))
                if not want <= imp_groups <= set(ident.groups) | {AUTHENTICATED}:
                    problems.append("%s: Impersonate-Group %r, want %r (+ %s)" % (
                        cell, sorted(imp_groups), sorted(want), AUTHENTICATED))
                # apisim granted the impersonation, so the credential was one allowed to
                # impersonate: kwc's, never the caller's (no test caller that reaches
                # this line may impersonate alice... except impersonator, see the report)
                if not e["authorization"] or not e["headers"].get("authorization", "").startswith("Bearer"):
                    problems.append("%s: reached apisim without kwc's bearer token: %r" % (cell, e["headers"]))
            elif v.status == d.status and v.status in (401, 403, 500):
                if ident.fail or v.status != 403:
                    # kwc refuses the caller itself (authentication, impersonation)
                    if seen:
                        problems.append("%s: kwc refused it (%d) but passed it on anyway: %r" % (
                            cell, v.status, seen))
                elif len(seen) > 1 or (not seen and r["method"] != "GET"):
                    # a read of a cached resource kwc may decide itself (it asks the
                    # same SubjectAccessReview); anything else the upstream decides,
                    # as the caller
                    problems.append("%s: a 403 for the upstream to give; %d requests reached it (want 1)" % (
                        cell, len(seen)))
                elif seen:
                    imp_user = [v_ for k, v_ in seen[0]["impersonate"] if k == "impersonate-user"]
                    if imp_user != [ident.user or "system:anonymous"]:
                        problems.append("%s: the upstream judged Impersonate-User %r, want [%r]" % (
                            cell, imp_user, ident.user or "system:anonymous"))
        self.report(problems, "what reached apisim through kwc")
        self.assertGreater(passed, 10)

    @unittest.skipIf(DIRECT_ONLY, "needs kwc")
    def test_h2_anonymous_gets_one_request(self):
        """kube's UnauthenticatedHTTP2DOSMitigation: over HTTP/2 an anonymous
        caller's connection carries that one request (GOAWAY, then close);
        an authenticated caller's goes on; HTTP/1.1 keep-alive is untouched."""
        st1, went, st2 = h2_last_request(self.kwc.port)
        self.assertEqual(st1, 403, "anonymous over HTTP/2: RBAC's 403 as system:anonymous")
        self.assertTrue(went, "anonymous over HTTP/2: GOAWAY after the request")
        st1, went, st2 = h2_last_request(self.kwc.port, TOK["admin"])
        self.assertEqual((st1, went, st2), (200, False, 200),
                         "authenticated over HTTP/2: no GOAWAY, the connection carries a second request")

    def test_9_identity_holes(self):
        """Issue 19's reported holes get kube's answer (apisim's, asked directly),
        and nothing reaches apisim as an identity the caller may not assume."""
        problems = []
        masters = [("Impersonate-User", "x")] + [("Impersonate-Group", "g")] * 31 + \
            [("Impersonate-Group", "system:masters")]
        attacker = Ident("mallory-masters", token=TOK["mallory"], imp=masters, fail=403)
        before = self.log.sync()
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "stolen", "namespace": "ns-a"}}
        for method, target, body in (("GET", "/api/v1/secrets?resourceVersion=0", None),
                                     ("GET", "/api/v1/namespaces/ns-b/secrets/sec-b1", None),
                                     ("POST", "/api/v1/namespaces/ns-a/secrets", secret)):
            d = exchange(self.apisim.port, attacker, method, target, body=body)
            v = exchange(self.kwc.port, attacker, method, target, body=body, ua=VIA_UA)
            if (v.status, v.body) != (d.status, d.body) or d.status != 403:
                problems.append("system:masters as the 33rd attribute, %s %s: kwc %r, apisim %r" % (
                    method, target, v, d))
            elif b'groups \\"system:masters\\" is forbidden' not in v.body:
                problems.append("%s %s: not kube's message: %r" % (method, target, v.body))
        self.log.sync()
        for e in self.log.between(before, self.log.last):
            if e["headers"].get("user-agent") == VIA_UA and ("impersonate-group", "system:masters") in \
                    [tuple(x) for x in e["impersonate"]]:
                problems.append("system:masters reached apisim through kwc: %s %s" % (e["method"], e["target"]))
            if e["method"] == "POST" and "/secrets" in e["target"] and e["headers"].get("user-agent") == VIA_UA:
                problems.append("the Secret POST reached apisim through kwc")

        # a service-account-looking user without a name is a plain user: no
        # service-account groups (kube's SplitUsername), kube's answer either way
        for user in ("system:serviceaccount:ns-a", "system:serviceaccount:ns-a:a:b"):
            who = Ident("mallory-sa", token=TOK["mallory"], imp=[("Impersonate-User", user)])
            before = self.log.sync()
            target = "/api/v1/namespaces/ns-a/configmaps"  # no resourceVersion: passthrough
            d = exchange(self.apisim.port, who, "GET", target)
            v = exchange(self.kwc.port, who, "GET", target, ua=VIA_UA)
            if (v.status, v.body) != (d.status, d.body):
                problems.append("%s: kwc %r, apisim %r" % (user, v, d))
            self.log.sync()
            for e in self.log.between(before, self.log.last):
                if e["headers"].get("user-agent") != VIA_UA:
                    continue
                groups = [x[1] for x in e["impersonate"] if x[0] == "impersonate-group"]
                if any(g.startswith("system:serviceaccounts") for g in groups):
                    problems.append("%s reached apisim with service-account groups %r" % (user, groups))
        self.report(problems, "issue 19's identity holes")

    @unittest.skipIf(DIRECT_ONLY, "needs kwc")
    def test_4_revocation_within_authorized_ttl(self):
        k = self.start_kwc("kwc-ttl", "--authorization-webhook-cache-authorized-ttl=2s")
        alice = self.ids["alice"]
        target = coll("pods", "ns-a") + "?resourceVersion=0"
        try:
            self.wait_synced(k)
            a = exchange(k.port, alice, "GET", target, ua=VIA_UA)
            self.assertEqual(a.status, 200, a)
            self.post_policy(policy_doc(alice_read=False))
            t0 = time.monotonic()
            d = exchange(self.apisim.port, alice, "GET", target)
            self.assertEqual(d.status, 403, d)

            def revoked():
                v = exchange(k.port, alice, "GET", target, ua=VIA_UA)
                if v.status not in (200, 403):
                    raise Fatal("kwc answered %r" % v)
                return v if v.status == 403 else None
            v = wait_for(revoked, 2 + 3, "kwc to stop allowing alice within the 2 s TTL (+3 s)", interval=0.1)
            print("\n  revoked after %.2fs" % (time.monotonic() - t0), file=sys.stderr)
            self.assertEqual(v.body, d.body)
            self.assertEqual(v.media(), d.media())
        finally:
            self.post_policy(policy_doc())
            self.assertEqual(k.stop(), 0)

    def post_policy(self, doc):
        st, _, b = http(self.apisim.port, "POST", "/apisim/policy", body=doc)
        self.assertEqual(st, 200, b)

    def review_counts(self):
        r = json.loads(http(self.apisim.port, "GET", "/apisim/stats")[2])["requests"]
        return r.get("create tokenreviews", 0), r.get("create subjectaccessreviews", 0)

    @unittest.skipIf(DIRECT_ONLY, "needs kwc")
    def test_5_reviews_cached_and_coalesced(self):
        frank = Ident("frank", token=TOK["frank"], user="frank", groups=["listers", AUTHENTICATED])
        target = coll("pods", "ns-a") + "?resourceVersion=0"
        want = self.truth(target)
        pool = concurrent.futures.ThreadPoolExecutor(50)
        try:
            for burst, expect in ((1, (1, 1)), (2, (0, 0))):
                before = self.review_counts()
                gate = threading.Barrier(50)

                def one(_):
                    gate.wait(10)
                    return exchange(self.kwc.port, frank, "GET", target, ua=VIA_UA)
                answers = list(pool.map(one, range(50)))
                for a in answers:
                    self.assertEqual(a.status, 200, a)
                    self.assertEqual(sorted(key_rv(o) for o in a.json()["items"]), want)
                after = self.review_counts()
                self.assertEqual((after[0] - before[0], after[1] - before[1]), expect,
                                 "burst %d: (TokenReviews, SubjectAccessReviews) at apisim" % burst)
        finally:
            pool.shutdown()

    @unittest.skipIf(DIRECT_ONLY, "needs kwc")
    def test_6_review_failures_fail_closed(self):
        alice, target = self.ids["alice"], coll("pods", "ns-a") + "?resourceVersion=0"
        # alice's token and her list are cached since the matrix (or now)
        self.assertEqual(exchange(self.kwc.port, alice, "GET", target, ua=VIA_UA).status, 200)
        bad = exchange(self.apisim.port, self.ids["bad-token"], "GET", target)
        self.assertEqual(bad.status, 401)
        sim = self.apisim.port
        try:
            st, _, b = http(sim, "POST", "/apisim/fail", body={"count": 1000, "status": 503,
                                                              "match": "/apis/authentication.k8s.io/v1/tokenreviews"})
            self.assertEqual(st, 200, b)
            gina = Ident("gina", token=TOK["gina"])
            v = exchange(self.kwc.port, gina, "GET", target, ua=VIA_UA)
            self.assertEqual((v.status, v.body), (401, bad.body), "a TokenReview that failed is a failed login")
            self.assertEqual(exchange(self.kwc.port, alice, "GET", target, ua=VIA_UA).status, 200,
                             "a cached identity and decision still serve")
            http(sim, "POST", "/apisim/fail", body={"clear": True})
            st, _, b = http(sim, "POST", "/apisim/fail", body={"count": 1000, "status": 503,
                                                              "match": "/subjectaccessreviews"})
            self.assertEqual(st, 200, b)
            hank = Ident("hank", token=TOK["hank"])
            v = exchange(self.kwc.port, hank, "GET", target, ua=VIA_UA)
            self.assertEqual(v.status, 500, v)
            # kube: filters/authorization.go -> responsewriters.InternalError (text/plain
            # "Internal Server Error: %q: %v"); a Status with code 500 is accepted too
            if v.media() == "text/plain":
                self.assertTrue(v.body.startswith(b'Internal Server Error: "%s": ' % target.encode()), v)
            else:
                s = v.json()
                self.assertEqual((s.get("kind"), s.get("code")), ("Status", 500), v)
            self.assertNotIn(b"pod-a1", v.body)
            self.assertEqual(exchange(self.kwc.port, alice, "GET", target, ua=VIA_UA).status, 200,
                             "a cached identity and decision still serve")
        finally:
            http(sim, "POST", "/apisim/fail", body={"clear": True})

    @unittest.skipIf(DIRECT_ONLY, "needs kwc")
    def test_7_real_clients(self):
        d = tempfile.mkdtemp(prefix="clients-", dir=self.dir)
        ports = {"kwc": self.kwc.port, "apisim": self.apisim.port}
        kubectl = kubectl_binaries()["default"]

        def run_kubectl(who, ident, *args):
            out = {}
            for side, port in ports.items():
                env = dict(os.environ, KUBECONFIG=write_kubeconfig(d, who, port, ident), HOME=d)
                r = subprocess.run([kubectl, "--cache-dir", os.path.join(d, "cache-%s-%s" % (who, side))]
                                   + list(args), capture_output=True, timeout=60, env=env)
                out[side] = (r.returncode, r.stdout, r.stderr)
            return out
        for who, ident, extra in (("alice-token", self.ids["alice"], ()), ("dave-cert", self.ids["dave-cert"], ()),
                                  ("impersonator-as-alice", Ident("imp", token=TOK["impersonator"]),
                                   ("--as", "alice"))):
            with self.subTest(kubectl=who):
                ok = run_kubectl(who, ident, *extra, "get", "pods", "-n", "ns-a", "-o", "name")
                self.assertEqual(ok["apisim"][0], 0, ok["apisim"])
                self.assertEqual(ok["kwc"], ok["apisim"])
                self.assertIn(b"pod/pod-a1", ok["kwc"][1].split())
                no = run_kubectl(who, ident, *extra, "get", "pods", "-n", "ns-b", "-o", "name")
                self.assertNotEqual(no["apisim"][0], 0)
                self.assertIn(b'Error from server (Forbidden): pods is forbidden: User "', no["apisim"][2])
                self.assertEqual(no["kwc"], no["apisim"], "kubectl's failure differs through kwc")
        alice = self.ids["alice"]
        for name, argv in (("python3-kubernetes", [PYTHON, os.path.join(CLIENTS, "py_ns_list.py")]),
                           ("client-node", ["node", os.path.join(CLIENTS, "ns_list.mjs")])):
            for ns, status in (("ns-a", 200), ("ns-b", 403)):
                with self.subTest(client=name, namespace=ns):
                    out = {}
                    for side, port in ports.items():
                        r = subprocess.run(argv + [write_kubeconfig(d, "alice", port, alice), ns],
                                           capture_output=True, text=True, timeout=60, cwd=HERE)
                        self.assertEqual(r.returncode, 0, "%s %s: %s" % (name, side, r.stderr[-2000:]))
                        out[side] = json.loads(r.stdout)
                    self.assertEqual(out["apisim"]["status"], status, out["apisim"])
                    self.assertEqual(out["kwc"], out["apisim"])

    @unittest.skipIf(DIRECT_ONLY, "needs kwc")
    def test_8_forward_token(self):
        k = self.start_kwc("kwc-fwd", "--passthrough-identity=forward-token")
        alice, bob = self.ids["alice"], self.ids["bob"]
        try:
            self.wait_synced(k)
            cases = [(alice, "POST", coll("configmaps", "ns-a") + "?fieldManager=fwd-alice",
                      new_object("configmaps", "fwd-alice"), 201),
                     (bob, "GET", coll("secrets"), None, 200),                 # a quorum list
                     (alice, "POST", coll("configmaps", "ns-b") + "?fieldManager=fwd-alice-b",
                      new_object("configmaps", "fwd-alice-b"), 403)]
            for ident, method, target, body, status in cases:
                with self.subTest(ident=ident.key, target=target):
                    lo = self.log.sync()
                    v = exchange(k.port, ident, method, target, body=body, ua=VIA_UA)
                    seen = [e for e in self.log.between(lo, self.log.sync())
                            if e["method"] == method and e["target"] == target]
                    self.assertEqual(v.status, status, v)
                    if status == 403:
                        # a write: the upstream judges the caller's own token
                        d = exchange(self.apisim.port, ident, method, target, body=body)
                        self.assertEqual(v.body, d.body)
                        self.assertEqual(len(seen), 1, seen)
                        self.assertEqual((seen[0]["impersonate"], seen[0]["authorization"]), ([], True))
                        continue
                    self.assertEqual(len(seen), 1, seen)
                    # no impersonation and yet allowed: the credential was the caller's own
                    # (kwc's may not create configmaps nor list secrets)
                    self.assertEqual(seen[0]["impersonate"], [])
                    self.assertTrue(seen[0]["authorization"])
        finally:
            self.assertEqual(k.stop(), 0)


@only_in_plaintext_run(AuthCase.only_in_plaintext_run)
class AnonymousDisabledTest(AuthCase):
    """--anonymous-auth=false on both sides: no credentials is 401."""
    anonymous = False

    def test_h2_unauthorized_gets_one_request(self):
        """kube's Unauthorized handler: over HTTP/2 the 401 is the
        connection's last request."""
        st1, went, _ = h2_last_request(self.kwc.port)
        self.assertEqual(st1, 401)
        self.assertTrue(went, "401 over HTTP/2: GOAWAY after the request")
        st1, went, st2 = h2_last_request(self.kwc.port, TOK["admin"])
        self.assertEqual((st1, went, st2), (200, False, 200))

    def test_matrix_anonymous_disabled(self):
        problems, records = self.run_matrix(["none", "alice", "bad-token"], writes=False)
        self.report(problems, "the matrix with --anonymous-auth=false")
        self.assertTrue(all(r["direct"].status == 401 for r in records if r["ident"].key == "none"))


if __name__ == "__main__":
    unittest.main()
