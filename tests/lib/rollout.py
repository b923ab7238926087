"""Clients that judge a rollout (tests/integration/35_rollout.py): informer-
like watchers and a tight request loop, each counting what a user of kwc
would call a failure; and Debian's haproxy as the load balancer in front of
replicas, as a Service's endpoints are: TCP, no retries, health-checked on
/readyz.

An Informer does what client-go's reflector does: one LIST (rv=0), then
WATCH from the list's rv with bookmarks; a watch that ends cleanly (the
terminal chunk: a server draining, or the watch's timeout) is opened again
from the last rv seen, through the balancer, wherever it lands; an ERROR
event or a failed request makes it LIST again (counted as a relist). Every
request is on a new connection (a tight connect loop, as the issue tried).

Counted as failed: a connection refused, reset or closed before a whole
answer (a list's body cut, a watch without its terminal chunk), a status
other than 200. Everything is bounded in time: each client stops when told
or at its deadline.
"""
import http.client
import json
import os
import socket
import subprocess
import threading
import time

from cluster import free_port, get_json, read_to_eof, wait_for  # noqa: F401 (free_port: for the tests)

PODS = "/api/v1/pods"


def upstream_state(tc, env, path=PODS):
    """{namespace/name: resourceVersion} of the upstream (apisim) now."""
    st, d = get_json(env.apisim.port, path)
    tc.assertEqual(st, 200)
    return {"%s/%s" % (o["metadata"].get("namespace", ""), o["metadata"]["name"]): o["metadata"]["resourceVersion"]
            for o in d["items"]}


class Counters:
    def __init__(self):
        self.lock = threading.Lock()
        self.failures = []   # (what, repr)
        self.requests = 0

    def fail(self, what, e):
        with self.lock:
            self.failures.append((what, repr(e)[:200]))

    def count(self):
        with self.lock:
            self.requests += 1


class Informer(threading.Thread):
    def __init__(self, port, counters, deadline, path=PODS):
        super().__init__(daemon=True)
        self.port = port
        self.c = counters
        self.deadline = deadline
        self.path = path
        self.state = {}       # namespace/name -> resourceVersion
        self.rv = None
        self.lists = 0        # the first one included: a relist makes it 2
        self.watches = 0      # watch requests opened (resumes included)
        self.established = 0  # of those, answered 200 (the server holds the stream)
        self.errors = []      # ERROR events' objects
        self.stop_flag = threading.Event()
        self.lock = threading.Lock()

    def conn(self, timeout):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def list(self):
        self.lists += 1
        c = self.conn(30)
        try:
            c.request("GET", self.path + "?resourceVersion=0")
            r = c.getresponse()
            body = r.read()
            self.c.count()
            if r.status != 200:
                raise RuntimeError("list: %d %s" % (r.status, body[:200]))
            d = json.loads(body)
        finally:
            c.close()
        with self.lock:
            self.state = {"%s/%s" % (o["metadata"].get("namespace", ""), o["metadata"]["name"]):
                          o["metadata"]["resourceVersion"] for o in d["items"]}
            self.rv = d["metadata"]["resourceVersion"]

    def watch(self):
        """One watch from self.rv; True when it ended cleanly (resume), False
        after an ERROR event (relist)."""
        self.watches += 1
        c = self.conn(60)
        try:
            c.request("GET", "%s?watch=1&allowWatchBookmarks=true&resourceVersion=%s&timeoutSeconds=300"
                      % (self.path, self.rv))
            r = c.getresponse()
            self.c.count()
            if r.status != 200:
                raise RuntimeError("watch: %d %s" % (r.status, r.read()[:200]))
            self.established += 1
            while not self.stop_flag.is_set():
                line = r.readline()  # http.client undoes the chunking
                if not line:
                    return True  # the terminal chunk (a cut raises IncompleteRead)
                ev = json.loads(line)
                o = ev["object"]
                if ev["type"] == "ERROR":
                    self.errors.append(o)
                    return False
                md = o["metadata"]
                with self.lock:
                    if ev["type"] != "BOOKMARK":
                        k = "%s/%s" % (md.get("namespace", ""), md["name"])
                        if ev["type"] == "DELETED":
                            self.state.pop(k, None)
                        else:
                            self.state[k] = md["resourceVersion"]
                    self.rv = md["resourceVersion"]
            return True
        finally:
            c.close()

    def run(self):
        need_list = True
        while not self.stop_flag.is_set() and time.monotonic() < self.deadline:
            try:
                if need_list:
                    self.list()
                need_list = not self.watch()
            except (OSError, http.client.HTTPException, RuntimeError, ValueError) as e:
                # client-go's reflector: a failed watch is retried from its
                # rv; the failure is what this test counts
                self.c.fail("informer", e)
                time.sleep(0.1)

    def snapshot(self):
        with self.lock:
            return dict(self.state)


class TightLoop(threading.Thread):
    """Small lists on a new connection each, back to back."""

    def __init__(self, port, counters, deadline, path=PODS + "?resourceVersion=0&limit=5"):
        super().__init__(daemon=True)
        self.port, self.c, self.deadline, self.path = port, counters, deadline, path
        self.stop_flag = threading.Event()
        self.done = 0

    def run(self):
        while not self.stop_flag.is_set() and time.monotonic() < self.deadline:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                c.request("GET", self.path)
                r = c.getresponse()
                body = r.read()
                self.c.count()
                if r.status != 200:
                    raise RuntimeError("%d %s" % (r.status, body[:200]))
                json.loads(body)
                self.done += 1
            except (OSError, http.client.HTTPException, RuntimeError, ValueError) as e:
                self.c.fail("request", e)
                time.sleep(0.05)
            finally:
                c.close()


class Haproxy:
    """haproxy in TCP mode in front of backends [(name, port)], retries 0,
    leastconn (the watches spread), each health-checked with GET /readyz every 300 ms (down after 2 fails,
    up after 2 passes)."""

    def __init__(self, workdir, backends):
        self.dir = workdir
        self.port = free_port()
        self.sock = os.path.join(workdir, "haproxy.sock")
        cfg = os.path.join(workdir, "haproxy.cfg")
        servers = "".join("  server %s 127.0.0.1:%d check\n" % b for b in backends)
        with open(cfg, "w") as f:
            f.write("""global
  stats socket %s mode 600 level admin
  maxconn 4000
defaults
  mode tcp
  retries 0
  timeout connect 2s
  timeout client 10m
  timeout server 10m
  timeout check 2s
frontend fe
  bind 127.0.0.1:%d
  default_backend kwc
backend kwc
  balance leastconn
  option httpchk
  http-check send meth GET uri /readyz
  http-check expect status 200
  default-server inter 300ms fall 2 rise 2
%s""" % (self.sock, self.port, servers))
        self.log = open(os.path.join(workdir, "haproxy.log"), "ab")
        self.p = subprocess.Popen(["haproxy", "-f", cfg, "-db"], stdout=self.log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
        wait_for(lambda: os.path.exists(self.sock) and self.states(), 20, "haproxy's stats socket")

    def states(self):
        """{server: status} from `show stat` (UP, DOWN, ...)."""
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        try:
            s.connect(self.sock)
            s.sendall(b"show stat\n")
        except OSError:
            s.close()
            raise
        data = read_to_eof(s)
        out = {}
        lines = data.decode().splitlines()
        head = lines[0].lstrip("# ").split(",")
        for line in lines[1:]:
            row = dict(zip(head, line.split(",")))
            if row.get("pxname") == "kwc" and row.get("svname") not in ("BACKEND", None):
                out[row["svname"]] = row["status"].split(" ")[0]
        return out

    def wait_state(self, server, status, timeout=30):
        wait_for(lambda: self.states().get(server) == status, timeout, "haproxy: %s %s" % (server, status))

    def close(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        self.log.close()
