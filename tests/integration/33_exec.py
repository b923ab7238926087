"""Exec credential plugins in kwc's kubeconfig (issue 31, part 6;
include/kwc/execcred.h). The plugin is tests/integration/clients/exec_plugin.py:
it hands out rotating tokens with short expirations into a file that apisim
(--token-file) reads, so apisim accepts only tokens the plugin issued and
not yet expired or revoked.

  1. Rotation: kwc started with an exec kubeconfig (a relative command,
     args, env, provideClusterInfo with the cluster's exec extension) serves
     lists and watches; tokens of 3 s are replaced before they expire, with
     no failed request and not one 401 at apisim; no pipe is left open and
     no child left unreaped; KUBERNETES_EXEC_INFO is what client-go sends
     (exact bytes), env adds to kwc's environment and wins over it, stdin is
     not a terminal.
  2. Revocation: a token revoked at apisim (401) makes kwc run the plugin
     again, once for any number of 401s to that token, and recover; a
     plugin failing then (exit 3, stderr logged) is retried with backoff
     until it works again.
  3. Failures, bounded and reported (one kwc each, side by side): a plugin
     that hangs (killed past --exec-plugin-timeout, its process group too,
     reaped, retried), prints too much, is missing (its installHint in the
     line), prints no JSON, the wrong apiVersion, no token; meanwhile a
     request waits for a credential (bounded by --exec-plugin-timeout) and
     gets 503.
     interactiveMode Always is refused at start.
  4. A client certificate from the plugin (no token): kwc's TLS connections
     present it and apisim (--client-ca) accepts kwc.
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import unittest

import certs
from cluster import (APISIM, KWC_BIN, PYTHON, ROOT, ClientTLS, ProcGroup, Proc, http_request, kwc_proc,
                     wait_for)
from watchstream import Stream, pump

PLUGIN = os.path.join(ROOT, "tests", "integration", "clients", "exec_plugin.py")
V1 = "client.authentication.k8s.io/v1"
EXT = {"audience": "kwc-test", "list": [1, 2.5, "yes-string", True], "nested": {"b": 2, "a": 1}}


def kubeconfig(d, server, state, exec_extra=None, cluster_extra=None, env=()):
    """A kubeconfig in d whose user runs ./plugin (a link to exec_plugin.py in d)."""
    link = os.path.join(d, "plugin")
    if not os.path.exists(link):
        os.symlink(PLUGIN, link)
    ex = {"apiVersion": V1, "command": "./plugin", "args": ["--flag", "value with space"],
          "env": [{"name": "EXEC_STATE", "value": state}, {"name": "EXEC_PLUGIN_MARK", "value": "from-kubeconfig"}]
          + [{"name": k, "value": v} for k, v in env],
          "interactiveMode": "Never"}
    ex.update(exec_extra or {})
    cluster = {"server": server}
    cluster.update(cluster_extra or {})
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "t",
           "clusters": [{"name": "c", "cluster": cluster}],
           "users": [{"name": "u", "user": {"exec": ex}}],
           "contexts": [{"name": "t", "context": {"cluster": "c", "user": "u"}}]}
    path = os.path.join(d, "kubeconfig")
    with open(path, "w") as f:
        json.dump(cfg, f)  # JSON is YAML
    return path


def new_state(d, name="state", mode="ok"):
    s = os.path.join(d, name)
    os.makedirs(s, exist_ok=True)
    with open(os.path.join(s, "mode"), "w") as f:
        f.write(mode)
    return s


def set_mode(state, mode):
    with open(os.path.join(state, "mode") + ".tmp", "w") as f:
        f.write(mode)
    os.rename(os.path.join(state, "mode") + ".tmp", os.path.join(state, "mode"))


def runs(state):
    try:
        with open(os.path.join(state, "runs")) as f:
            return int(f.read() or 0)
    except FileNotFoundError:
        return 0


def infos(state):
    with open(os.path.join(state, "info.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def revoke_all(state):
    path = os.path.join(state, "tokens")
    with open(path + ".tmp", "w") as f:
        f.write("")
    os.rename(path + ".tmp", path)


def sim_stats(port):
    st, _, b = http_request(port, "GET", "/apisim/stats")
    assert st == 200, b
    return json.loads(b)


def pipes_of(pid):
    n = 0
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            n += os.readlink("/proc/%d/fd/%s" % (pid, fd)).startswith("pipe:")
        except OSError:
            pass
    return n


def children_of(pid):
    """(pid, state) of the processes whose parent is pid."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % p) as f:
                st = f.read()
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()
        if int(fields[1]) == pid:
            out.append((int(p), fields[0]))
    return out


def alive(pid):
    """pid exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            st = f.read()
    except OSError:
        return False
    return st[st.rindex(")") + 2] != "Z"


def drain(w):
    """Read what the watch has now."""
    try:
        pump([w], lambda: False, 0.05)
    except TimeoutError:
        pass


def start_sim(d, *args, tls=None):
    p = Proc("apisim", [PYTHON, APISIM, "--listen", "127.0.0.1:0"] + list(args), d, tls=tls)
    return p.start()


def start_kwc(d, name, kc, *args, env=None):
    p = kwc_proc(name, ["--kubeconfig", kc, "--listen", "127.0.0.1:0", "--data-dir", os.path.join(d, "data-" + name),
                        "--resources", "v1/pods"] + list(args), d)
    if env is not None:
        p.env = env
    return p.start()


class Rotation(ProcGroup, unittest.TestCase):
    TTL = 3

    @classmethod
    def setUpClass(cls):
        cls.procs = []
        cls.dir = tempfile.mkdtemp(prefix="kwc-exec-")
        cls.state = new_state(cls.dir)
        try:
            cls.sim = start_sim(cls.dir, "--token-file", os.path.join(cls.state, "tokens"), "--pods", "3")
            cls.procs.append(cls.sim)
            # the server as written (a trailing slash) is what the plugin is told
            cls.server = "http://127.0.0.1:%d/" % cls.sim.port
            kc = kubeconfig(cls.dir, cls.server, cls.state,
                            exec_extra={"provideClusterInfo": True},
                            cluster_extra={"extensions": [
                                {"name": "other.example.com/x", "extension": {"no": 1}},
                                {"name": "client.authentication.k8s.io/exec", "extension": EXT}]},
                            env=[("EXEC_TTL", str(cls.TTL))])
            # kwc's own environment reaches the plugin; the kubeconfig's env wins
            env = dict(os.environ, EXEC_PLUGIN_FROM_KWC="1", EXEC_PLUGIN_MARK="from-kwc")
            cls.kwc = start_kwc(cls.dir, "kwc", kc, env=env)
            cls.procs.append(cls.kwc)
            wait_for(lambda: http_request(cls.kwc.port, "GET", "/readyz", timeout=2)[0] == 200, 30, "kwc ready")
        except BaseException:
            cls.dump()
            cls.stop_all()
            raise

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_1_exec_info_env_args(self):
        first = infos(self.state)[0]
        want = ('{"kind":"ExecCredential","apiVersion":"%s","spec":{"cluster":{"server":"%s",'
                '"config":{"audience":"kwc-test","list":[1,2.5,"yes-string",true],"nested":{"a":1,"b":2}}},'
                '"interactive":false}}\n' % (V1, self.server))
        self.assertEqual(first["raw"], want)
        self.assertEqual(first["argv"], ["--flag", "value with space"])
        self.assertEqual(first["env"], {"EXEC_PLUGIN_FROM_KWC": "1", "EXEC_PLUGIN_MARK": "from-kubeconfig"})
        self.assertFalse(first["stdin_tty"])

    def test_2_lists_watches_rotation_without_failures(self):
        port = self.kwc.port
        st, _, b = http_request(port, "GET", "/api/v1/pods?resourceVersion=0")
        self.assertEqual(st, 200, b[:300])
        lst = json.loads(b)
        self.assertEqual(len(lst["items"]), 3)
        w = Stream(port, "/api/v1/pods?watch=1&resourceVersion=%s" % lst["metadata"]["resourceVersion"])
        kpid = self.kwc.pid()
        pipes0 = pipes_of(kpid)
        r0, t0 = runs(self.state), time.monotonic()
        codes, created = [], []
        # passthrough requests (each carries the current token) until the
        # token has been replaced twice
        deadline = t0 + 6 * self.TTL + 10
        while runs(self.state) < r0 + 2 and time.monotonic() < deadline:
            codes.append(http_request(port, "GET", "/api/v1/namespaces")[0])
            if len(codes) % 10 == 1:
                name = "exec-%d" % len(codes)
                body = json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                                   "spec": {"containers": [{"name": "c", "image": "i"}]}}).encode()
                st, _, b = http_request(port, "POST", "/api/v1/namespaces/default/pods", body=body,
                                        headers={"Content-Type": "application/json"})
                codes.append(st)
                created.append(name)
            drain(w)
        elapsed = time.monotonic() - t0
        self.assertGreaterEqual(runs(self.state), r0 + 2, "the token was not rotated: " + self.kwc.logs(20))
        self.assertEqual([c for c in codes if c not in (200, 201)], [], "failed requests")
        self.assertEqual(sim_stats(self.sim.port)["requests"].get("unauthorized", 0), 0,
                         "kwc sent a token apisim no longer accepted")
        # before expiry, not in a loop: about one run per 0.8 TTL
        self.assertLessEqual(runs(self.state) - r0, elapsed / (0.5 * self.TTL) + 2)
        with open(os.path.join(self.state, "tokens")) as f:
            expiry = {int(l.split()[0].split("-")[1]): float(l.split()[1]) for l in f if l.strip()}
        for i in infos(self.state):
            if i["run"] > r0:
                self.assertLess(i["time"], expiry[i["run"] - 1], "run %d came after its token expired" % i["run"])
        # the watch sees every pod created across the rotations
        pump([w], lambda: {e["object"]["metadata"]["name"] for e in w.events if e["type"] == "ADDED"}
             >= set(created), 10, "the watch events")
        w.close()
        # every plugin's pipes closed and every child reaped
        # (a run due meanwhile holds two for a moment)
        wait_for(lambda: pipes_of(kpid) == pipes0, 10, "kwc's pipes back to %d" % pipes0)
        wait_for(lambda: not [c for c in children_of(kpid) if c[1] == "Z"], 5, "no zombie children")
        self.assertRegex(self.kwc.logs(200), r"exec credential plugin plugin: new token \(#\d+\), expires ")


class Revocation(ProcGroup, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.procs = []
        cls.dir = tempfile.mkdtemp(prefix="kwc-exec-")
        cls.state = new_state(cls.dir)
        try:
            cls.sim = start_sim(cls.dir, "--token-file", os.path.join(cls.state, "tokens"))
            cls.procs.append(cls.sim)
            kc = kubeconfig(cls.dir, "http://127.0.0.1:%d" % cls.sim.port, cls.state)
            cls.kwc = start_kwc(cls.dir, "kwc", kc)
            cls.procs.append(cls.kwc)
            wait_for(lambda: http_request(cls.kwc.port, "GET", "/readyz", timeout=2)[0] == 200, 30, "kwc ready")
        except BaseException:
            cls.dump()
            cls.stop_all()
            raise

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def get(self):
        return http_request(self.kwc.port, "GET", "/api/v1/namespaces")[0]

    def concurrent_gets(self, n):
        out = []
        ts = [threading.Thread(target=lambda: out.append(self.get())) for _ in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        return out

    def test_1_revoked_token_reruns_once_and_recovers(self):
        self.assertEqual(self.get(), 200)
        r0 = runs(self.state)
        revoke_all(self.state)
        codes = self.concurrent_gets(6)
        self.assertIn(401, codes)  # relayed: that request was made with the revoked token
        wait_for(lambda: runs(self.state) == r0 + 1, 10, "one more plugin run")
        wait_for(lambda: self.get() == 200, 10, "a request with the new token")
        # once for the revoked token however many 401s it got
        self.assertEqual(self.concurrent_gets(4), [200] * 4)
        self.assertEqual(runs(self.state), r0 + 1)
        self.assertIn("upstream: 401 Unauthorized with credential", self.kwc.logs(50))

    def test_2_failing_plugin_retried_with_backoff(self):
        self.assertEqual(self.get(), 200)
        r0 = runs(self.state)
        set_mode(self.state, "fail")
        revoke_all(self.state)
        self.get()
        wait_for(lambda: "failed with exit code 3 (its stderr is logged above); retrying in" in self.kwc.logs(40),
                 10, "the failure logged")
        logs = self.kwc.logs(40)
        self.assertIn("exec credential plugin plugin: stderr: error: the credential service said no", logs)
        self.assertIn("exec credential plugin plugin: stderr: second line", logs)
        wait_for(lambda: runs(self.state) >= r0 + 2, 10, "a retry after the backoff")
        set_mode(self.state, "ok")
        wait_for(lambda: self.get() == 200, 20, "recovery once the plugin works again")


class Failures(ProcGroup, unittest.TestCase):
    CASES = {
        # name: (mode, exec settings, what the log says)
        "hang": ("hang", {}, "did not finish within 0.5s; killed it"),
        "big": ("big", {}, "printed more than 1024 KiB on stdout; killed it"),
        "missing": ("ok", {"command": "kwc-no-such-plugin", "installHint": "get it with: apt-get install kwc-plugin"},
                    "executable kwc-no-such-plugin not found on $PATH"),
        "badjson": ("badjson", {}, "decoding stdout: it is not JSON"),
        "wrongver": ("wrongver", {}, "exec plugin is configured to use API version %s, plugin returned version "
                     "client.authentication.k8s.io/v1alpha1" % V1),
        "notoken": ("notoken", {}, "exec plugin didn't return a token or cert/key pair"),
    }

    @classmethod
    def setUpClass(cls):
        cls.procs = []
        cls.dir = tempfile.mkdtemp(prefix="kwc-exec-")
        cls.kwcs = {}
        cls.states = {}
        try:
            cls.sim = start_sim(cls.dir, "--token", "nobody-has-it")
            cls.procs.append(cls.sim)
            for name, (mode, extra, _) in cls.CASES.items():
                d = os.path.join(cls.dir, name)
                os.makedirs(d)
                cls.states[name] = new_state(d, mode=mode)
                kc = kubeconfig(d, "http://127.0.0.1:%d" % cls.sim.port, cls.states[name], exec_extra=extra)
                # a short bound for the hang only: python's start under load must fit the others'
                cls.kwcs[name] = start_kwc(d, "kwc-" + name, kc, "--exec-plugin-timeout",
                                           "500ms" if name == "hang" else "20s")
                cls.procs.append(cls.kwcs[name])
        except BaseException:
            cls.dump()
            cls.stop_all()
            raise

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_each_failure_reported_and_retried(self):
        for name, (mode, extra, want) in self.CASES.items():
            k = self.kwcs[name]
            wait_for(lambda: want in k.logs(30), 15, "%s: %r in the log" % (name, want))
            line = [l for l in k.logs(30).splitlines() if want in l][0]
            self.assertRegex(line, r"warn .*exec credential plugin .*; retrying in \d+\.\ds$")
            if name == "missing":
                self.assertIn("get it with: apt-get install kwc-plugin", line)
        # retried with backoff: a second run follows the first (1 s later)
        wait_for(lambda: runs(self.states["badjson"]) >= 2, 10, "a retry")
        self.assertLessEqual(runs(self.states["badjson"]), 3)

    def test_hung_plugin_killed_with_its_children_and_reaped(self):
        k = self.kwcs["hang"]
        path = os.path.join(self.states["hang"], "hang.pid")
        wait_for(lambda: os.path.exists(path) and "killed it" in k.logs(30), 15, "a hung run killed")
        with open(path) as f:
            plugin, child = (int(x) for x in f.read().split())
        wait_for(lambda: not alive(plugin) and not alive(child), 10, "the plugin and its child gone")
        wait_for(lambda: plugin not in [p for p, _ in children_of(k.pid())], 10, "the plugin reaped")
        self.assertIn("exec credential plugin plugin: stderr: hanging", k.logs(60))

    def test_requests_wait_bounded_then_503(self):
        # bounded by --exec-plugin-timeout (500ms for the hanging plugin)
        t0 = time.monotonic()
        st, _, b = http_request(self.kwcs["hang"].port, "GET", "/api/v1/namespaces")
        self.assertEqual(st, 503, b[:300])
        self.assertLess(time.monotonic() - t0, 10)
        self.assertIn("kwc has no credential for the upstream: exec credential plugin plugin", json.loads(b)["message"])
        # nothing reached apisim without a credential
        self.assertEqual(sim_stats(self.sim.port)["requests"].get("unauthorized", 0), 0)

    def test_interactive_always_refused_at_start(self):
        d = os.path.join(self.dir, "always")
        os.makedirs(d)
        kc = kubeconfig(d, "http://127.0.0.1:1", new_state(d), exec_extra={"interactiveMode": "Always"})
        r = subprocess.run([KWC_BIN, "--kubeconfig", kc, "--data-dir", os.path.join(d, "data"), "--listen",
                            "127.0.0.1:0"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("interactiveMode Always needs a terminal", r.stderr)


class ClientCertificate(ProcGroup, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.procs = []
        cls.dir = tempfile.mkdtemp(prefix="kwc-exec-")
        pki = certs.pki()
        cls.state = new_state(cls.dir, mode="cert")
        shutil.copy(pki.client.crt, os.path.join(cls.state, "cert.pem"))
        shutil.copy(pki.client.key, os.path.join(cls.state, "key.pem"))
        try:
            cls.sim = start_sim(cls.dir, "--tls-cert", pki.server.crt, "--tls-key", pki.server.key,
                                "--client-ca", pki.client_ca.crt,
                                tls=ClientTLS(pki.ca.crt, pki.client.crt, pki.client.key))
            cls.procs.append(cls.sim)
            with open(pki.ca.crt, "rb") as f:
                import base64
                ca = base64.b64encode(f.read()).decode()
            kc = kubeconfig(cls.dir, "https://127.0.0.1:%d" % cls.sim.port, cls.state,
                            cluster_extra={"certificate-authority-data": ca})
            cls.kwc = start_kwc(cls.dir, "kwc", kc)
            cls.procs.append(cls.kwc)
        except BaseException:
            cls.dump()
            cls.stop_all()
            raise

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_certificate_from_the_plugin(self):
        wait_for(lambda: http_request(self.kwc.port, "GET", "/readyz", timeout=2)[0] == 200, 30, "kwc ready")
        self.assertEqual(http_request(self.kwc.port, "GET", "/api/v1/namespaces")[0], 200)
        self.assertRegex(self.kwc.logs(30), r"exec credential plugin plugin: new client certificate \(#1\)")
        self.assertEqual(sim_stats(self.sim.port)["requests"].get("unauthorized", 0), 0)


if __name__ == "__main__":
    unittest.main()
