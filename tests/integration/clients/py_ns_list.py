"""Debian's python3-kubernetes configured from a kubeconfig lists the pods of
one namespace (a plain list: no resourceVersion). Prints one JSON line:
{"status": 200, "items": [[key, rv], ...]} (sorted by key), or for an API
error {"status": N, "reason": R, "body": the answer's body}.

  /usr/bin/python3 py_ns_list.py KUBECONFIG NAMESPACE
"""
import json
import sys

from kubernetes import client, config
from kubernetes.client.rest import ApiException


def main():
    kc, ns = sys.argv[1], sys.argv[2]
    v1 = client.CoreV1Api(config.new_client_from_config(config_file=kc))
    try:
        lst = v1.list_namespaced_pod(ns)
    except ApiException as e:
        print(json.dumps({"status": e.status, "reason": e.reason, "body": e.body}), flush=True)
        return 0
    items = sorted(["%s/%s" % (p.metadata.namespace, p.metadata.name), p.metadata.resource_version]
                   for p in lst.items)
    print(json.dumps({"status": 200, "items": items}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
