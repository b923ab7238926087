"""Helpers for the fault-injection tests (15_integrity .. 18_chaos): comparing
kwc's cached answers with the upstream's byte for byte, damaging data.mdb,
reading kwc's log and /readyz, a tmpfs data dir, and replaying watch streams.

The contract these tests hold kwc to ("never serve what the cache cannot
vouch for") is described in each module's docstring."""
import json
import os
import signal
import subprocess
import tempfile
import time

from cluster import http_request, wait_for
from watchstream import Stream, pump


# ---- lists, compared item by item, as bytes ----

def raw_items(body):
    """(document, [raw bytes of each item]) of a JSON list. Raises ValueError
    if the body is not one valid JSON document."""
    s = body.decode("utf-8")
    doc = json.loads(s)
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        raise ValueError("not a list: %r" % s[:200])
    out = []
    if doc["items"]:
        dec = json.JSONDecoder()
        i = s.index('"items":[') + len('"items":[')
        while True:
            _, j = dec.raw_decode(s, i)
            out.append(s[i:j].encode("utf-8"))
            i = j
            if s[i] == "]":
                break
            assert s[i] == ",", s[i - 20:i + 20]
            i += 1
    if len(out) != len(doc["items"]):
        raise ValueError("found %d raw items, parsed %d" % (len(out), len(doc["items"])))
    return doc, out


def item_key(item):
    md = item["metadata"]
    return "%s/%s" % (md["namespace"], md["name"]) if md.get("namespace") else md["name"]


def keyed_items(body):
    """(list rv, {key: raw item bytes}) of a JSON list body."""
    doc, raws = raw_items(body)
    return int(doc["metadata"]["resourceVersion"]), {item_key(i): r for i, r in zip(doc["items"], raws)}


def get_list(port, path, timeout=60):
    st, h, b = http_request(port, "GET", path, timeout=timeout)
    if st != 200:
        raise AssertionError("GET %s -> %d %s" % (path, st, b[:300]))
    return keyed_items(b)


def converge(env, name_prefix="converge"):
    """Stop churn, write one pod, return its rv (the upstream's rv once
    nothing else writes)."""
    env.sim("POST", "/apisim/churn", {"rate": 0})
    name = "%s-%d-%d" % (name_prefix, os.getpid(), int(time.monotonic() * 1000))
    return env.sim("POST", "/apisim/write", {"verb": "create", "resource": "pods", "namespace": "default",
                                             "name": name, "labels": {"grp": "x"}})["rv"]


def assert_cache_equals_upstream(tc, env, path="/api/v1/pods", timeout=60):
    """With the upstream quiet: kwc's resourceVersion=0 list of path, at the
    upstream's current rv, has the same items as the upstream's list, byte
    for byte. Returns the number of items."""
    rv = converge(env)
    wait_for(lambda: get_list(env.kwc.port, path + "?resourceVersion=0")[0] >= rv, timeout,
             "kwc's list of %s to reach rv %d" % (path, rv))
    got_rv, got = get_list(env.kwc.port, path + "?resourceVersion=0")
    want_rv, want = get_list(env.apisim.port, path)
    tc.assertEqual(got_rv, want_rv, "kwc's list rv vs the upstream's (nothing written since)")
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    differ = sorted(k for k in want if k in got and got[k] != want[k])
    tc.assertEqual((missing[:5], extra[:5], differ[:5]), ([], [], []),
                   "kwc's rv=0 list differs from the upstream's at rv %d: %d missing, %d extra, %d differ%s" % (
                       want_rv, len(missing), len(extra), len(differ),
                       "" if not differ else "; first: kwc %r\nupstream %r" % (got[differ[0]][:400],
                                                                             want[differ[0]][:400])))
    return len(got)


def upstream_state(env, resource="pods", selector=None):
    """{key: rv} of the upstream now; selector: {label: value} that must match."""
    out = {}
    for o in env.sim("GET", "/apisim/state?resource=%s" % resource)["items"]:
        if selector and any((o.get("labels") or {}).get(k) != v for k, v in selector.items()):
            continue
        out[o["key"]] = o["rv"]
    return out


# ---- data.mdb ----

def find_all(path, needle):
    with open(path, "rb") as f:
        data = f.read()
    out, i = [], data.find(needle)
    while i >= 0:
        out.append(i)
        i = data.find(needle, i + 1)
    return out


def overwrite(path, offset, data):
    """pwrite data at offset of path (no fsync: kwc's shared read-only map
    of the file sees the page cache)."""
    fd = os.open(path, os.O_RDWR)
    try:
        n = os.pwrite(fd, data, offset)
        assert n == len(data)
    finally:
        os.close(fd)


# ---- kwc's log and /readyz ----

def log_text(proc):
    try:
        with open(proc.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def log_size(proc):
    try:
        return os.path.getsize(proc.log_path)
    except OSError:
        return 0


def log_since(proc, offset):
    with open(proc.log_path, "rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", "replace")


def readyz(port):
    """(status, verbose text) of /readyz?verbose."""
    st, _, b = http_request(port, "GET", "/readyz?verbose", timeout=5)
    return st, b.decode("utf-8", "replace")


def wait_readyz(port, status, timeout=60, what=None, contains=()):
    """Wait until /readyz?verbose answers status and its text holds every
    string of contains. Returns the text."""
    last = [None]

    def ok():
        st, text = readyz(port)
        last[0] = (st, text)
        return text if st == status and all(c in text for c in contains) else None
    try:
        return wait_for(ok, timeout, what or "/readyz %d with %r" % (status, list(contains)), interval=0.05)
    except TimeoutError as e:
        raise AssertionError("%s; last /readyz?verbose: %r" % (e, last[0]))


def wait_exit(p, timeout):
    """Wait for a Popen to exit; kill it (and say so) if it does not."""
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(10)
        raise AssertionError("process %d still running after %.0fs (killed)" % (p.pid, timeout))


def kill9(proc):
    """SIGKILL a Proc, reap it, close its log (restart with Env.start_kwc)."""
    proc.p.send_signal(signal.SIGKILL)
    proc.p.wait(10)
    proc.log.close()
    return proc.p.returncode


def assert_not_signalled(tc, proc):
    """A stopped or exited kwc did not die of a signal (SIGBUS, SIGSEGV...)."""
    if proc.p is not None and proc.p.poll() is not None:
        tc.assertGreaterEqual(proc.p.returncode, 0, "kwc died of signal %d" % -proc.p.returncode)


# ---- watch streams ----

def ev_rv(e):
    return int(e["object"]["metadata"]["resourceVersion"])


def apply_events(state, events):
    """Apply watch events to {key: rv}."""
    for e in events:
        t = e["type"]
        if t == "BOOKMARK":
            continue
        if t == "ERROR":
            raise AssertionError("ERROR event: %r" % (e,))
        k = item_key(e["object"])
        if t == "DELETED":
            state.pop(k, None)
        else:
            state[k] = ev_rv(e)
    return state


def watch_until(port, path, rv_at_least, timeout=60):
    """Open a watch, read until an event with rv >= rv_at_least (or an ERROR
    event, or the end). Returns the Stream (closed)."""
    s = Stream(port, path)
    try:
        pump([s], lambda: s.ended or s.closed or any(e["type"] == "ERROR" for e in s.events) or
             (s.last_rv() or 0) >= rv_at_least, timeout, "watch %s to reach rv %d" % (path, rv_at_least))
    finally:
        s.close()
    return s


# ---- a tmpfs data dir ----

OWNER = "tmpfs.owner"


def _mounts():
    with open("/proc/self/mounts") as f:
        for line in f:
            p = line.split()
            yield p[0], p[1].replace("\\040", " "), p[2]


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def sweep_stale_tmpfs():
    """Unmount tmpfs data dirs a previous run of these tests left mounted
    (under TMPDIR/kwc-it-*/, with an owner file naming a test process that
    is gone). Another run's live mounts are left alone."""
    tmp = tempfile.gettempdir()
    for _, mp, fstype in list(_mounts()):
        if fstype != "tmpfs" or not mp.startswith(os.path.join(tmp, "kwc-it-")):
            continue
        try:
            with open(os.path.join(os.path.dirname(mp), OWNER)) as f:
                pid = int(f.read().strip() or 0)
        except (OSError, ValueError):
            continue
        if pid and not _alive(pid):
            subprocess.run(["umount", "-l", mp], capture_output=True)


class Tmpfs:
    """A tmpfs mounted at path (root needed), unmounted by umount()."""

    def __init__(self, path, size):
        self.path = path
        sweep_stale_tmpfs()
        os.makedirs(path, exist_ok=True)
        if os.path.ismount(path):
            subprocess.run(["umount", "-l", path], capture_output=True)
        with open(os.path.join(os.path.dirname(path), OWNER), "w") as f:
            f.write("%d\n" % os.getpid())
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%s" % size, "tmpfs", path], capture_output=True)
        if r.returncode != 0:
            raise RuntimeError("mount -t tmpfs on %s failed (these tests need root): %s" % (path, r.stderr))
        self.mounted = True

    def resize(self, size):
        subprocess.run(["mount", "-o", "remount,size=%s" % size, self.path], check=True, capture_output=True)

    def umount(self):
        if not self.mounted:
            return
        if subprocess.run(["umount", self.path], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", self.path], capture_output=True)
        self.mounted = False
