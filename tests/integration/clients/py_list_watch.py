"""Debian's python3-kubernetes configured from a kubeconfig (kwc over https
with the kubeconfig's certificate-authority, or apisim over http): list pods,
then watch them from the list's resourceVersion with a server-side
timeoutSeconds, each stream read to its end and resumed from the last rv, until
the pod named by --until has been ADDED and its stream has ended.

Prints one JSON line for the list ({"rv", "items": [[key, rv], ...]}), one per
watch event ("type", "key", "rv") and a last line with the number of streams.

  /usr/bin/python3 py_list_watch.py --kubeconfig FILE --until NS/NAME
"""
import argparse
import json
import sys

from kubernetes import client, config, watch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--until", required=True)
    ap.add_argument("--timeout", type=int, default=2)
    a = ap.parse_args()
    v1 = client.CoreV1Api(config.new_client_from_config(config_file=a.kubeconfig))
    lst = v1.list_pod_for_all_namespaces()
    items = sorted(["%s/%s" % (p.metadata.namespace, p.metadata.name), p.metadata.resource_version]
                   for p in lst.items)
    print(json.dumps({"rv": lst.metadata.resource_version, "items": items}), flush=True)
    rv = lst.metadata.resource_version
    w = watch.Watch()
    streams = 0
    seen = False
    while not seen:
        streams += 1
        # the stream ends when the server's timeoutSeconds does: read it to the end
        for ev in w.stream(v1.list_pod_for_all_namespaces, resource_version=rv, timeout_seconds=a.timeout):
            md = ev["object"].metadata
            key = "%s/%s" % (md.namespace, md.name)
            print(json.dumps({"type": ev["type"], "key": key, "rv": md.resource_version}), flush=True)
            seen = seen or (key == a.until and ev["type"] == "ADDED")
        rv = w.resource_version
    print(json.dumps({"streams": streams}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
