#!/usr/bin/python3
"""A client-go exec credential plugin for tests (33_exec.py).

Its state lives in $EXEC_STATE (a directory):
  runs       how many times it ran (incremented first thing)
  tokens     the tokens it handed out, one per line with its expiry (Unix
             seconds): apisim --token-file reads this file
  info.jsonl one line per run: {"run", "pid", "time", "raw" and "exec_info" (KUBERNETES_EXEC_INFO
             parsed), "env" (EXEC_PLUGIN_* variables), "argv"}
  mode       what to do (default "ok"), read at each run:
               ok       a new token "tok-<run>-<random>" valid for $EXEC_TTL seconds
               cert     clientCertificateData/clientKeyData from files cert.pem and
                        key.pem in the state directory (no token)
               hang     sleep (with a child in its process group) until killed
               big      print 2 MiB on stdout
               fail     a line on stderr, exit 3
               badjson  print something that is not JSON
               wrongver answer with apiVersion client.authentication.k8s.io/v1alpha1
               notoken  a status without token or certificate
Environment: EXEC_STATE, EXEC_TTL (seconds, default 3600), EXEC_API_VERSION.
"""
import json
import os
import secrets
import subprocess
import sys
import time


def bump(path):
    """Increment the counter in path (one plugin runs at a time: kwc's rule)."""
    try:
        with open(path) as f:
            n = int(f.read() or 0)
    except FileNotFoundError:
        n = 0
    n += 1
    with open(path + ".tmp", "w") as f:
        f.write(str(n))
    os.rename(path + ".tmp", path)
    return n


def rfc3339(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%03dZ" % int((t % 1) * 1000)


def main():
    state = os.environ["EXEC_STATE"]
    ttl = float(os.environ.get("EXEC_TTL", "3600"))
    api = os.environ.get("EXEC_API_VERSION", "client.authentication.k8s.io/v1")
    n = bump(os.path.join(state, "runs"))
    info = os.environ.get("KUBERNETES_EXEC_INFO")
    with open(os.path.join(state, "info.jsonl"), "a") as f:
        f.write(json.dumps({"run": n, "pid": os.getpid(), "time": time.time(), "raw": info, "argv": sys.argv[1:],
                            "exec_info": json.loads(info) if info else None,
                            "env": {k: v for k, v in os.environ.items() if k.startswith("EXEC_PLUGIN_")},
                            "stdin_tty": os.isatty(0)}) + "\n")
    try:
        with open(os.path.join(state, "mode")) as f:
            mode = f.read().strip() or "ok"
    except FileNotFoundError:
        mode = "ok"
    status = None
    if mode == "ok":
        tok = "tok-%d-%s" % (n, secrets.token_hex(8))
        exp = time.time() + ttl
        path = os.path.join(state, "tokens")
        lines = []
        if os.path.exists(path):
            with open(path) as f:
                lines = f.read().splitlines()
        lines.append("%s %.3f" % (tok, exp))
        with open(path + ".tmp", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.rename(path + ".tmp", path)
        status = {"token": tok, "expirationTimestamp": rfc3339(exp)}
    elif mode == "cert":
        with open(os.path.join(state, "cert.pem")) as f:
            cert = f.read()
        with open(os.path.join(state, "key.pem")) as f:
            key = f.read()
        status = {"clientCertificateData": cert, "clientKeyData": key}
    elif mode == "hang":
        path = os.path.join(state, "hang.pid")
        with open(path + ".tmp", "w") as f:
            f.write("%d %d\n" % (os.getpid(), subprocess.Popen(["sleep", "600"]).pid))
        os.rename(path + ".tmp", path)
        sys.stderr.write("hanging\n")
        sys.stderr.flush()
        time.sleep(600)
    elif mode == "big":
        chunk = "x" * 65536
        for _ in range(32):
            sys.stdout.write(chunk)
        sys.stdout.flush()
        return 0
    elif mode == "fail":
        sys.stderr.write("error: the credential service said no\nsecond line\n")
        return 3
    elif mode == "badjson":
        print("Token: not json")
        return 0
    elif mode == "wrongver":
        api = "client.authentication.k8s.io/v1alpha1"
        status = {"token": "x"}
    elif mode == "notoken":
        status = {}
    print(json.dumps({"apiVersion": api, "kind": "ExecCredential", "status": status}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
