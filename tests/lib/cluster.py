"""Process helpers for kwc's integration tests, benchmarks and demo.

Starts apisim and kwc on ephemeral loopback ports (each writes its bound port
to a --port-file), waits for readiness by polling with a deadline (never a
fixed sleep), stops only the processes it started, and keeps their logs so a
failing test can print them.

TLS mode (KWC_TLS=1, `make integration-tls`): every kwc the tests start
through kwc_proc() (Env does) serves https with the test certificates of
certs.py. A Proc records, under the port it listens on, whether it speaks TLS
and what a client trusts; every way a test reaches a server goes through the
helpers below, which look the port up, so the same test talks https to kwc
and plain HTTP to apisim:
  url(port)              "http(s)://127.0.0.1:PORT"
  connect(port)          a connected socket, TLS-wrapped for a TLS port
  http_connection(port)  http.client.HTTP(S)Connection
  http_request(port,..)  one request on a fresh connection
  kubectl(bin, port,..), kubectl_server_args(port), kubeconfig(port, dir)
  tls_client(port)       the ClientTLS of a port (CA, client cert), or None
In TLS mode kwc also verifies client certificates (--client-ca-file) and
every client presents one (kwc_tls_client()).
A test about plaintext-only behaviour carries @only_in_plaintext_run(reason);
run.py leaves it out of the TLS run (it is not run as a skip).

HTTP/2 mode (KWC_H2=1, `make integration-h2`; with KWC_TLS=1 too, HTTP/2 over
TLS): a Proc also records whether clients speak HTTP/2 to its port (every kwc
kwc_proc() starts; never apisim, which stays HTTP/1.1). http_request and
http_connection then speak HTTP/2 (tests/lib/h2client.py: plaintext with prior
knowledge, TLS with ALPN h2), and so does watchstream.Stream. http_request
keeps one HTTP/2 connection per thread and port, as client-go keeps one per
host: its requests are streams of that connection (HPACK state and stream ids
carry over from request to request), and a connection the server has sent
GOAWAY on or closed is replaced. What stays HTTP/1.1 in that mode: connect()
(raw sockets are about HTTP/1.1 bytes), kubectl and the Node client (Go and
Node clients do not speak HTTP/2 with prior knowledge; over TLS they pick it
by ALPN themselves). A test about HTTP/1.1-only behaviour (HTTP/1.0, chunk
bytes, pipelining) carries @only_over_http1(reason): run.py leaves it out of
the HTTP/2 run and lists it; each has an HTTP/2 counterpart (26_http2.py) or
is HTTP/1.1-only by nature.
"""
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

import certs

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PYTHON = os.environ.get("PYTHON", "/usr/bin/python3")
KWC_BIN = os.environ.get("KWC_BIN", os.path.join(ROOT, "build", "kwc"))
# e.g. KWC_WRAP="valgrind --error-exitcode=99 --leak-check=full": run kwc under a checker.
KWC_WRAP = os.environ.get("KWC_WRAP", "").split()
# Extra kwc flags for every test, e.g. a smaller LMDB map under valgrind.
# kwc's default --shutdown-delay-duration (10 s) is for load balancers: the
# tests stop kwc at once unless they test the delay (their flags come later
# and win).
KWC_EXTRA_ARGS = ["--shutdown-delay-duration=0"] + os.environ.get("KWC_EXTRA_ARGS", "").split()
APISIM = os.path.join(ROOT, "tests", "apisim", "apisim.py")
# KWC_TLS=1: kwc serves https (--tls-cert-file, --tls-private-key-file, --client-ca-file).
TLS = os.environ.get("KWC_TLS", "") == "1"
# KWC_H2=1: the tests speak HTTP/2 to kwc (h2client.py).
H2 = os.environ.get("KWC_H2", "") == "1"


def only_in_plaintext_run(reason):
    """Marks a TestCase class or test method that is about plaintext-only
    behaviour: run.py leaves it out of the TLS run (KWC_TLS=1)."""
    def mark(obj):
        obj.only_in_plaintext_run = reason
        return obj
    return mark


def only_over_http1(reason):
    """Marks a TestCase class or test method about HTTP/1.1-only behaviour
    (HTTP/1.0, chunk framing, pipelining): run.py leaves it out of the HTTP/2
    run (KWC_H2=1). The reason names the HTTP/2 counterpart, if there is one."""
    def mark(obj):
        obj.only_over_http1 = reason
        return obj
    return mark


class ClientTLS:
    """What a client of one TLS server uses: the CA it trusts and, optionally,
    the certificate it presents. context() is one shared ssl.SSLContext."""

    def __init__(self, ca, cert=None, key=None):
        self.ca, self.cert, self.key = ca, cert, key
        self._ctx = None
        self._h2ctx = None
        self._lock = threading.Lock()

    def context(self):
        with self._lock:
            if self._ctx is None:
                ctx = ssl.create_default_context(cafile=self.ca)  # hostname (IP SAN) checked
                if self.cert:
                    ctx.load_cert_chain(self.cert, self.key)
                self._ctx = ctx
            return self._ctx

    def h2_context(self):
        """Another shared context, offering ALPN h2 only (context() offers no
        ALPN: its clients speak HTTP/1.1)."""
        with self._lock:
            if self._h2ctx is None:
                ctx = ssl.create_default_context(cafile=self.ca)
                if self.cert:
                    ctx.load_cert_chain(self.cert, self.key)
                ctx.set_alpn_protocols(["h2"])
                self._h2ctx = ctx
            return self._h2ctx


# port -> ClientTLS (or None for plain HTTP) of the last Proc that listened on
# it: a port a stopped server leaves is taken by the next one that binds it.
_listeners = {}
# port -> True when the tests speak HTTP/2 to it (HTTP/2 mode, kwc's ports)
_h2_listeners = {}


def speaks_h2(port):
    """Whether http_request, http_connection and watchstream.Stream speak
    HTTP/2 to port."""
    return _h2_listeners.get(port, False)


def tls_client(port):
    """The ClientTLS for a server this process started on port, None if it
    speaks plain HTTP."""
    return _listeners.get(port)


def kwc_tls_args():
    """The TLS mode's serving flags: the test server certificate, and client
    certificates from the test client CA verified when presented."""
    p = certs.pki()
    return ["--tls-cert-file", p.server.crt, "--tls-private-key-file", p.server.key,
            "--client-ca-file", p.client_ca.crt,
            # the TLS run tests the transport: every caller acts as kwc, as
            # in the plaintext run (the auth modules pass --auth delegated)
            "--auth", "none"]


def kwc_tls_client():
    """How the tests reach a kwc in TLS mode: trusting the test CA and
    presenting alice's client certificate. (kubectl needs some credential for
    an https server: without one it prompts for a username on stdin and
    fails. Connections without a certificate are 14_tls's business.)"""
    p = certs.pki()
    return ClientTLS(p.ca.crt, p.client.crt, p.client.key)


def url(port, host="127.0.0.1"):
    return "%s://%s:%d" % ("https" if tls_client(port) else "http", "[%s]" % host if ":" in host else host, port)


def free_port():
    """A port free now, for a process that must listen on the same one
    again (a restart, a takeover: port 0 would pick another each time) or
    that cannot be told to pick one."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def read_to_eof(s):
    """Every byte a socket delivers until the peer closes; closes s."""
    data = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        data += d
    s.close()
    return data


def dechunk(body):
    """The payload of an HTTP/1.1 chunked body (trailers ignored)."""
    out, i = bytearray(), 0
    while True:
        j = body.index(b"\r\n", i)
        n = int(body[i:j], 16)
        if n == 0:
            break
        out += body[j + 2:j + 2 + n]
        i = j + 2 + n + 2
    return bytes(out)


def connect(port, timeout=10.0, rcvbuf=None, host="127.0.0.1"):
    """A connected blocking socket (TLS handshake done on a TLS port).
    rcvbuf: SO_RCVBUF, set before connecting."""
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(timeout)
        s.connect((host, port))
        t = tls_client(port)
        if t:
            s = t.context().wrap_socket(s, server_hostname=host)
        return s
    except BaseException:
        s.close()
        raise


def http_connection(port, timeout=30.0, host="127.0.0.1"):
    if speaks_h2(port):
        import h2client
        return h2client.HTTPConnection(port, host=host, timeout=timeout)
    t = tls_client(port)
    if t:
        return http.client.HTTPSConnection(host, port, timeout=timeout, context=t.context())
    return http.client.HTTPConnection(host, port, timeout=timeout)


class Fatal(Exception):
    """Raised from a wait_for predicate: stop waiting, this will never succeed."""


def wait_for(pred, timeout=10.0, what="condition", interval=0.02):
    """Poll pred() until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            v = pred()
            if v:
                return v
        except Fatal:
            raise
        except Exception as e:  # the thing we wait for may not be up yet
            last_exc = e
        time.sleep(interval)
    raise TimeoutError("timed out after %.1fs waiting for %s%s" % (
        timeout, what, " (last error: %r)" % last_exc if last_exc else ""))


class Proc:
    """A child process with a port file and a log file."""

    def __init__(self, name, argv, workdir, env=None, tls=None, h2=False, new_session=False):
        """tls: a ClientTLS if the process serves TLS on its port; h2: the
        tests speak HTTP/2 to it; new_session: in a session of its own, so
        that a terminal's Ctrl-C reaches only the script that stops it
        (the demo)."""
        self.name = name
        self.workdir = workdir
        self.port_file = os.path.join(workdir, name + ".port")
        self.log_path = os.path.join(workdir, name + ".log")
        self.argv = argv + ["--port-file", self.port_file]
        self.env = env
        self.tls = tls
        self.h2 = h2
        self.new_session = new_session
        self.p = None
        self.port = None
        self.exit_code = None

    def start(self, timeout=20.0):
        if os.path.exists(self.port_file):
            os.unlink(self.port_file)
        self.log = open(self.log_path, "ab")
        self.p = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=self.env, start_new_session=self.new_session)

        def ready():
            if self.p.poll() is not None:
                raise Fatal("%s exited with %s:\n%s" % (self.name, self.p.returncode, self.logs()))
            with open(self.port_file) as f:
                s = f.read().strip()
            return int(s) if s else None
        self.port = wait_for(ready, timeout, "%s to listen" % self.name)
        _listeners[self.port] = self.tls
        _h2_listeners[self.port] = self.h2
        return self

    def logs(self, tail=80):
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode("utf-8", "replace").splitlines()
            return "\n".join(lines[-tail:])
        except OSError:
            return ""

    def pid(self):
        return self.p.pid

    def rss_kib(self, field="VmRSS"):
        with open("/proc/%d/status" % self.p.pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        return 0

    def stop(self, sig=signal.SIGTERM, timeout=15.0):
        try:
            return self._stop(sig, timeout)
        finally:
            _h2_forget(self.port)  # after the exit: pooled connections to it are dead

    def _stop(self, sig, timeout):
        if self.p is None or self.p.poll() is not None:
            self.exit_code = self.p.returncode if self.p else None
            return self.exit_code
        self.p.send_signal(sig)
        try:
            self.exit_code = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.exit_code = self.p.wait(5)
            raise RuntimeError("%s did not exit within %.0fs of %s" % (self.name, timeout, sig))
        finally:
            self.log.close()
        return self.exit_code

    def kill(self):
        if self.p and self.p.poll() is None:
            self.p.kill()
            self.p.wait(5)
        self.exit_code = self.p.returncode if self.p else None


# HTTP/2 mode: each thread's connections, (port, host) -> h2client.Connection
_h2_pool = threading.local()
_h2_all = []  # every pooled connection (a stopped server's are closed)
_h2_all_lock = threading.Lock()


def _h2_forget(port):
    """Close the HTTP/2 connections (http_request's and watchstream's) to a
    server that has stopped."""
    with _h2_all_lock:
        for c in [c for c in _h2_all if c.port == port]:
            c.close()
            _h2_all.remove(c)
    ws = sys.modules.get("watchstream")
    for c in (ws._h2_conns.pop(port, []) if ws else []):
        c.close()


def h2_pooled(port, host="127.0.0.1", timeout=30.0):
    """This thread's HTTP/2 connection to port (a new one when there is none,
    or the last one got GOAWAY, closed or is full)."""
    import h2client
    pool = getattr(_h2_pool, "conns", None)
    if pool is None:
        pool = _h2_pool.conns = {}
    c = pool.get((port, host))
    if c is None or not c.usable():
        if c is not None:
            c.close()
        c = h2client.Connection(port, host=host, timeout=timeout, initial_window=h2client.DEFAULT_WINDOW)
        pool[(port, host)] = c
        with _h2_all_lock:
            _h2_all.append(c)
    c.timeout = timeout
    return c


def _h2_request(port, method, path, body, headers, timeout, host):
    import h2client
    h = {}
    for k, v in (headers or {}).items():
        h[k.lower()] = v
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        h.setdefault("content-type", "application/json")
    elif isinstance(body, str):
        body = body.encode()
    for attempt in range(2):
        c = h2_pooled(port, host, timeout)
        st = c.open(method, path, h, body)
        try:
            return st.result(timeout)
        except h2client.H2Error:
            # as Go's transport: a stream the server never took (past its
            # GOAWAY's last stream id, or the connection gone before any
            # answer to a request that may be repeated) goes once more on a
            # new connection
            again = st.refused_by_goaway or (st.status is None and not st.remote_reset
                                             and method in ("GET", "HEAD", "OPTIONS"))
            if attempt or not again:
                raise


def http_request(port, method, path, body=None, headers=None, timeout=30.0, host="127.0.0.1"):
    """One request on a fresh connection (HTTP/2 mode: a stream of this
    thread's connection to port). Returns (status, headers dict, body bytes)."""
    if speaks_h2(port):
        return _h2_request(port, method, path, body, headers, timeout, host)
    c = http_connection(port, timeout=timeout, host=host)
    try:
        h = dict(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        c.close()


def get_json(port, path, **kw):
    st, h, b = http_request(port, "GET", path, **kw)
    return st, json.loads(b) if b else None


# kwc's --resources before it cached every resource on demand (KINDS_DEFAULT)
FIXED_RESOURCES = ("v1/pods,v1/nodes,v1/namespaces,v1/services,v1/endpoints,v1/configmaps,v1/secrets,"
                   "apps/v1/deployments,apps/v1/replicasets,apps/v1/daemonsets,apps/v1/statefulsets")


def kwc_proc(name, args, workdir, kwc_bin=None, auto=False):
    """A Proc for kwc as the tests run it: under KWC_WRAP, with KWC_EXTRA_ARGS,
    serving TLS in TLS mode; args (the test's own flags) come last. Without
    auto and without --resources in args, kwc caches FIXED_RESOURCES: the
    modules written before on-demand caches (issue 30) test a fixed set,
    required by /readyz; 31_ondemand.py and later ones run kwc's default."""
    args = list(args)
    if not auto and not any(a == "--resources" or a.startswith("--resources=") for a in args):
        args = ["--resources", FIXED_RESOURCES] + args
    tls = kwc_tls_args() if TLS else []
    return Proc(name, KWC_WRAP + [kwc_bin or KWC_BIN] + KWC_EXTRA_ARGS + tls + list(args), workdir,
                tls=kwc_tls_client() if TLS else None, h2=H2)


# Every Env's directory (data dirs, logs) is removed when the test process
# exits, after every failure has printed its logs; KWC_KEEP_TMP=1 keeps them.
_ENV_DIRS = []


def _remove_env_dirs():
    if os.environ.get("KWC_KEEP_TMP"):
        return
    import shutil
    for d in _ENV_DIRS:
        shutil.rmtree(d, ignore_errors=True)


import atexit  # noqa: E402

atexit.register(_remove_env_dirs)


class Env:
    """apisim + kwc for one test class. Use as a context manager or call close()."""

    def __init__(self, apisim_args=(), kwc_args=(), start_kwc=True, kwc_bin=None, wait_ready=True,
                 auto=False):
        self.dir = tempfile.mkdtemp(prefix="kwc-it-")
        _ENV_DIRS.append(self.dir)
        self.apisim = Proc("apisim", [PYTHON, APISIM, "--listen", "127.0.0.1:0"] + list(apisim_args), self.dir)
        self.kwc = None
        self.kwc_bin = kwc_bin or KWC_BIN
        self.kwc_args = list(kwc_args)
        self.auto = auto
        self.wait_ready = wait_ready  # False: the caches cannot sync (e.g. no credentials)
        try:
            self.apisim.start()
            if start_kwc:
                self.start_kwc()
        except BaseException:
            # kwc refused its flags or never got ready: stop what did start
            # (nobody gets this Env to close it), then report
            self.dump_logs()
            self.close()
            raise

    def start_kwc(self, extra=()):
        self.kwc = kwc_proc("kwc", ["--upstream", "http://127.0.0.1:%d" % self.apisim.port, "--listen", "127.0.0.1:0",
                                    "--data-dir", os.path.join(self.dir, "data")] + self.kwc_args + list(extra),
                            self.dir, self.kwc_bin, auto=self.auto)
        self.kwc.start()
        probe = "/readyz" if self.wait_ready else "/healthz"
        wait_for(lambda: http_request(self.kwc.port, "GET", probe, timeout=2)[0] == 200, 30, "kwc " + probe)
        return self.kwc

    def sim(self, method, path, body=None):
        st, h, b = http_request(self.apisim.port, method, path, body=body)
        if st >= 300:
            raise RuntimeError("apisim %s %s -> %d %s" % (method, path, st, b[:300]))
        return json.loads(b) if b else None

    def stats(self):
        return self.sim("GET", "/apisim/stats")

    def dump_logs(self, out=sys.stderr):
        for p in (self.apisim, self.kwc):
            if p:
                out.write("---- %s log (%s) ----\n%s\n" % (p.name, p.log_path, p.logs()))

    def close(self):
        codes = {}
        for p in (self.kwc, self.apisim):
            if p:
                try:
                    codes[p.name] = p.stop()
                except RuntimeError as e:
                    codes[p.name] = str(e)
        return codes

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.dump_logs()  # what the processes said, next to the failure
        self.close()


def kubectl_dir():
    real = os.path.realpath(subprocess.check_output(["bash", "-c", "command -v kubectl"]).decode().strip())
    return os.path.dirname(real)


def kubectl_binaries():
    """The dispatcher on PATH plus the side-by-side versioned binaries."""
    d = kubectl_dir()
    out = {"default": "kubectl"}
    for v in ("1.27", "1.30", "1.33"):
        p = os.path.join(d, "kubectl." + v)
        if os.path.exists(p):
            out[v] = p
    return out


def kubectl_server_args(port):
    """kubectl flags to reach port: --server; for a TLS port the CA and the
    client certificate."""
    t = tls_client(port)
    args = ["--server", url(port)]
    if t:
        args += ["--certificate-authority", t.ca]
    if t and t.cert:
        args += ["--client-certificate", t.cert, "--client-key", t.key]
    return args


def kubeconfig(port, d):
    """A kubeconfig file in d for port; for a TLS port the server is https://,
    certificate-authority the CA's file and the user the client certificate
    (if the port's ClientTLS has one). Returns its path."""
    t = tls_client(port)
    if t:
        cluster = {"server": url(port), "certificate-authority": t.ca}
    else:  # client-node refuses http:// unless told to skip TLS verification
        cluster = {"server": url(port), "insecure-skip-tls-verify": True}
    user = {"client-certificate": t.cert, "client-key": t.key} if t and t.cert else {}
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
           "clusters": [{"name": "c", "cluster": cluster}],
           "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
           "users": [{"name": "u", "user": user}]}
    path = os.path.join(d, "kubeconfig-%d" % port)
    with open(path, "w") as f:
        json.dump(cfg, f)  # JSON is YAML
    return path


def kubectl(binary, port, *args, input=None, timeout=60, check=True):
    """Run kubectl against port (http or https) with an empty kubeconfig."""
    env = dict(os.environ)
    env["KUBECONFIG"] = "/dev/null"
    env["HOME"] = tempfile.gettempdir()  # no cache dir shared between runs
    cmd = [binary] + kubectl_server_args(port) + ["--cache-dir",
           os.path.join(tempfile.gettempdir(), "kwc-kubectl-cache-%d" % port)] + list(args)
    r = subprocess.run(cmd, input=input, capture_output=True, timeout=timeout, env=env)
    if check and r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stderr.decode()[-2000:]))
    return r


import unittest  # noqa: E402


class EnvTestCase(unittest.TestCase):
    """A TestCase class sharing one apisim + kwc: set apisim_args / kwc_args.
    Logs are printed when a test fails; kwc must exit 0 at the end (under ASan
    that includes LeakSanitizer finding nothing)."""
    apisim_args = ()
    kwc_args = ()
    auto = False  # True: kwc's default --resources auto (else FIXED_RESOURCES)

    @classmethod
    def setUpClass(cls):
        cls.env = Env(apisim_args=cls.apisim_args, kwc_args=cls.kwc_args, auto=cls.auto)

    @classmethod
    def tearDownClass(cls):
        codes = cls.env.close()
        if codes.get("kwc") != 0:
            cls.env.dump_logs()
            raise AssertionError("kwc exit status %r" % codes.get("kwc"))

    def run(self, result=None):
        before = len(result.failures) + len(result.errors) if result else 0
        r = super().run(result)
        if result and len(result.failures) + len(result.errors) > before:
            self.env.dump_logs()
        return r


class Reader:
    """A client process whose stdout lines are collected by a thread."""

    def __init__(self, argv, env=None, stderr=subprocess.PIPE, stdin=None):
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, stdin=stdin, env=env, text=True)
        self.lines = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait(self, timeout):
        try:
            self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            raise
        self.t.join(5)
        return self.p.returncode

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)
        self.t.join(5)

    def stderr(self):
        try:
            return self.p.stderr.read()[-3000:]
        except (ValueError, OSError):
            return ""


class ProcGroup:
    """For a TestCase class whose setUpClass starts its own processes into
    cls.procs (apisim and kwc with settings an Env does not take): stop them
    all at the end and fail on a bad exit status (sanitizers report there),
    and print their logs when a test fails. dump_tail: the last bytes of
    each log only."""
    dump_tail = None

    @classmethod
    def stop_all(cls):
        codes = {}
        for p in reversed(cls.procs):
            if p.p is not None and p.exit_code is None:
                try:
                    codes[p.name] = p.stop()
                except RuntimeError as e:
                    codes[p.name] = str(e)
        return codes

    @classmethod
    def dump(cls):
        for p in cls.procs:
            logs = p.logs()
            if cls.dump_tail:
                sys.stderr.write("---- %s log (%s), last %d bytes ----\n%s\n" % (
                    p.name, p.log_path, cls.dump_tail, logs[-cls.dump_tail:]))
            else:
                sys.stderr.write("---- %s log (%s) ----\n%s\n" % (p.name, p.log_path, logs))

    @classmethod
    def tearDownClass(cls):
        codes = cls.stop_all()
        bad = {n: c for n, c in codes.items() if c != 0}
        if bad:
            cls.dump()
            raise AssertionError("exit status %r" % bad)

    def run(self, result=None):
        before = len(result.failures) + len(result.errors) if result else 0
        r = super().run(result)
        if result and len(result.failures) + len(result.errors) > before:
            self.dump()
        return r
