"""Debian's python3-kubernetes watching pods the way controllers written with
it do: watch.Watch().stream from a resourceVersion with bookmarks and a short
server timeout, resuming from the last rv the client saw each time the stream
ends, until the pod named by --until appears. Prints one JSON line per event
("type", "key", "rv") and a last line with the bookmark count.

  /usr/bin/python3 py_watch.py --server URL [--ca CA.crt --cert C.crt --key C.key] --rv N --until NS/NAME
"""
import argparse
import json
import sys

from kubernetes import client, watch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--ca", help="the CA file an https server's certificate chains to")
    ap.add_argument("--cert", help="a client certificate to present (with --key)")
    ap.add_argument("--key")
    ap.add_argument("--rv", required=True)
    ap.add_argument("--until", required=True)
    ap.add_argument("--timeout", type=int, default=3)
    a = ap.parse_args()
    cfg = client.Configuration()
    cfg.host = a.server
    if a.ca:
        cfg.ssl_ca_cert = a.ca
    if a.cert:
        cfg.cert_file, cfg.key_file = a.cert, a.key
    v1 = client.CoreV1Api(client.ApiClient(cfg))
    w = watch.Watch()
    rv = a.rv
    bookmarks = 0
    segments = 0
    while True:
        segments += 1
        for ev in w.stream(v1.list_pod_for_all_namespaces, resource_version=rv, allow_watch_bookmarks=True,
                           timeout_seconds=a.timeout):
            if ev["type"] == "BOOKMARK":
                bookmarks += 1
                print(json.dumps({"type": "BOOKMARK"}), flush=True)
                continue
            md = ev["object"].metadata
            key = "%s/%s" % (md.namespace, md.name)
            print(json.dumps({"type": ev["type"], "key": key, "rv": md.resource_version}), flush=True)
            if key == a.until and ev["type"] == "ADDED":
                print(json.dumps({"bookmarks": bookmarks, "segments": segments}), flush=True)
                return 0
        rv = w.resource_version  # the last rv seen, bookmarks included: resume there


if __name__ == "__main__":
    sys.exit(main())
