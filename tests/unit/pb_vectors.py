#!/usr/bin/python3
"""Protobuf test vectors for tests/unit/pb_test.c, from an encoder independent
of kwc: Google's protobuf runtime for Python (Debian python3-protobuf), with
the Kubernetes messages declared below through descriptor_pb2 (no protoc, and
not kwc's cache/k8s_min.proto: field numbers and types are transcribed from
kube's generated.proto files, k8s.io/apimachinery/pkg/runtime,
k8s.io/apimachinery/pkg/apis/meta/v1 and k8s.io/api/core/v1).

kube-apiserver writes protobuf with gogo-generated marshallers: fields in
ascending number order, every non-pointer field (empty strings and zero
integers included), pointer fields only when set, map entries sorted by key.
Python's serializer writes fields in number order and, for proto2, every field
that was set, so the messages below set exactly the fields gogo would write
(map entries are repeated {1 key, 2 value} messages appended in key order).

Regenerate (the output is committed; the unit test does not run Python):
    /usr/bin/python3 tests/unit/pb_vectors.py > tests/unit/pb_vectors.h
Needs Debian's python3-protobuf (apt-get install -y python3-protobuf).
"""
import struct
import sys

from google.protobuf import descriptor_pb2, message_factory

F = descriptor_pb2.FieldDescriptorProto
OPT, REP = F.LABEL_OPTIONAL, F.LABEL_REPEATED
STR, BYT, I32, I64, BOOL, MSG = (F.TYPE_STRING, F.TYPE_BYTES, F.TYPE_INT32,
                                 F.TYPE_INT64, F.TYPE_BOOL, F.TYPE_MESSAGE)

# name: [(field name, number, type, label, message type)]
SCHEMA = {
    # k8s.io/apimachinery/pkg/runtime
    "TypeMeta": [("apiVersion", 1, STR), ("kind", 2, STR)],
    "Unknown": [("typeMeta", 1, MSG, OPT, "TypeMeta"), ("raw", 2, BYT),
                ("contentEncoding", 3, STR), ("contentType", 4, STR)],
    "RawExtension": [("raw", 1, BYT)],
    # k8s.io/apimachinery/pkg/apis/meta/v1
    "Time": [("seconds", 1, I64), ("nanos", 2, I32)],
    "Entry": [("key", 1, STR), ("value", 2, STR)],
    "ObjectMeta": [("name", 1, STR), ("generateName", 2, STR), ("namespace", 3, STR),
                   ("selfLink", 4, STR), ("uid", 5, STR), ("resourceVersion", 6, STR),
                   ("generation", 7, I64), ("creationTimestamp", 8, MSG, OPT, "Time"),
                   ("deletionTimestamp", 9, MSG, OPT, "Time"),
                   ("deletionGracePeriodSeconds", 10, I64),
                   ("labels", 11, MSG, REP, "Entry"), ("annotations", 12, MSG, REP, "Entry"),
                   ("finalizers", 14, STR, REP)],
    "ListMeta": [("selfLink", 1, STR), ("resourceVersion", 2, STR), ("continue", 3, STR),
                 ("remainingItemCount", 4, I64)],
    "StatusCause": [("reason", 1, STR), ("message", 2, STR), ("field", 3, STR)],
    "StatusDetails": [("name", 1, STR), ("group", 2, STR), ("kind", 3, STR),
                      ("causes", 4, MSG, REP, "StatusCause"), ("retryAfterSeconds", 5, I32),
                      ("uid", 6, STR)],
    "Status": [("metadata", 1, MSG, OPT, "ListMeta"), ("status", 2, STR), ("message", 3, STR),
               ("reason", 4, STR), ("details", 5, MSG, OPT, "StatusDetails"), ("code", 6, I32)],
    "WatchEvent": [("type", 1, STR), ("object", 2, MSG, OPT, "RawExtension")],
    # k8s.io/api/core/v1 (the fields used here)
    "Container": [("name", 1, STR), ("image", 2, STR)],
    "PodSpec": [("containers", 2, MSG, REP, "Container"), ("restartPolicy", 3, STR),
                ("terminationGracePeriodSeconds", 4, I64), ("dnsPolicy", 6, STR),
                ("serviceAccountName", 8, STR), ("nodeName", 10, STR),
                ("hostNetwork", 11, BOOL), ("schedulerName", 19, STR)],
    "PodStatus": [("phase", 1, STR), ("hostIP", 5, STR), ("podIP", 6, STR),
                  ("nominatedNodeName", 11, STR)],
    "Pod": [("metadata", 1, MSG, OPT, "ObjectMeta"), ("spec", 2, MSG, OPT, "PodSpec"),
            ("status", 3, MSG, OPT, "PodStatus")],
    "PodList": [("metadata", 1, MSG, OPT, "ListMeta"), ("items", 2, MSG, REP, "Pod")],
    "BytesEntry": [("key", 1, STR), ("value", 2, BYT)],
    "Secret": [("metadata", 1, MSG, OPT, "ObjectMeta"), ("data", 2, MSG, REP, "BytesEntry"),
               ("type", 3, STR)],
    "NodeSpec": [("podCIDR", 1, STR), ("providerID", 3, STR), ("unschedulable", 4, BOOL)],
    "Node": [("metadata", 1, MSG, OPT, "ObjectMeta"), ("spec", 2, MSG, OPT, "NodeSpec")],
    "NamespaceSpec": [("finalizers", 1, STR, REP)],
    "NamespaceStatus": [("phase", 1, STR)],
    "Namespace": [("metadata", 1, MSG, OPT, "ObjectMeta"), ("spec", 2, MSG, OPT, "NamespaceSpec"),
                  ("status", 3, MSG, OPT, "NamespaceStatus")],
}


def build():
    fp = descriptor_pb2.FileDescriptorProto(name="kwc_vectors.proto", package="k8s",
                                            syntax="proto2")
    for name, fields in SCHEMA.items():
        m = fp.message_type.add(name=name)
        for f in fields:
            fname, num, typ = f[:3]
            label = f[3] if len(f) > 3 else OPT
            fd = m.field.add(name=fname, number=num, type=typ, label=label)
            if typ == MSG:
                fd.type_name = ".k8s." + f[4]
    classes = message_factory.GetMessages([fp])
    return {n: classes["k8s." + n] for n in SCHEMA}


M = build()


def entries(field, pairs):
    for k, v in pairs:
        e = field.add()
        e.key = k
        e.value = v


def meta(m, name, namespace, uid, rv, labels=(), annotations=(), deleting=False):
    """ObjectMeta as gogo writes it: every string, generation, creationTimestamp."""
    m.name = name
    m.generateName = ""
    m.namespace = namespace
    m.selfLink = ""
    m.uid = uid
    m.resourceVersion = rv
    m.generation = 0
    m.creationTimestamp.seconds = 1700000000
    m.creationTimestamp.nanos = 0
    if deleting:
        m.deletionTimestamp.seconds = 1700000600
        m.deletionTimestamp.nanos = 0
        m.deletionGracePeriodSeconds = 30
    entries(m.labels, labels)
    entries(m.annotations, annotations)


def pod(name, rv, node="node-1", phase="Running", labels=(("app", "web"),), ip="10.0.0.7",
        host_network=False, nominated="", deleting=False):
    p = M["Pod"]()
    meta(p.metadata, name, "default", "uid-" + name, rv, labels, deleting=deleting)
    c = p.spec.containers.add()
    c.name = "app"
    c.image = "nginx:1.25"
    p.spec.restartPolicy = "Always"
    p.spec.terminationGracePeriodSeconds = 30
    p.spec.dnsPolicy = "ClusterFirst"
    p.spec.serviceAccountName = "default"
    p.spec.nodeName = node
    p.spec.hostNetwork = host_network
    p.spec.schedulerName = "default-scheduler"
    p.status.phase = phase
    p.status.hostIP = "192.168.1.10"
    p.status.podIP = ip
    p.status.nominatedNodeName = nominated
    return p


def ser(m):
    return m.SerializeToString(deterministic=True)


def envelope(api_version, kind, raw):
    u = M["Unknown"]()
    u.typeMeta.apiVersion = api_version
    u.typeMeta.kind = kind
    u.raw = raw
    u.contentEncoding = ""
    u.contentType = ""
    return b"k8s\x00" + ser(u)


def frame(typ, api_version, kind, obj):
    ev = M["WatchEvent"]()
    ev.type = typ
    ev.object.raw = envelope(api_version, kind, obj)
    b = ser(ev)
    return struct.pack(">I", len(b)) + b


def list_meta(lm, rv, cont="", remaining=None):
    lm.selfLink = ""
    lm.resourceVersion = rv
    setattr(lm, "continue", cont)
    if remaining is not None:
        lm.remainingItemCount = remaining


def pod_list(pods, rv, cont="", remaining=None):
    pl = M["PodList"]()
    list_meta(pl.metadata, rv, cont, remaining)
    for p in pods:
        pl.items.add().CopyFrom(p)
    return envelope("v1", "PodList", ser(pl))


def status(code, reason, message, details=None):
    st = M["Status"]()
    list_meta(st.metadata, "")
    st.status = "Failure"
    st.message = message
    st.reason = reason
    if details is not None:
        d = st.details
        d.name, d.group, d.kind = details["name"], details["group"], details["kind"]
        for typ, msg, field in details.get("causes", ()):
            c = d.causes.add()
            c.reason, c.message, c.field = typ, msg, field
        d.retryAfterSeconds = details.get("retry", 0)
        d.uid = ""
    st.code = code
    return st


def bookmark_obj(rv, initial_end):
    p = M["Pod"]()
    p.metadata.resourceVersion = rv
    if initial_end:
        entries(p.metadata.annotations, [("k8s.io/initial-events-end", "true")])
    return ser(p)


def meta_of_size(size, rv):
    """A Pod whose ObjectMeta is exactly size bytes: name, rv, a padding label."""
    for pad in range(0, size):
        p = M["Pod"]()
        p.metadata.name = "p"
        p.metadata.resourceVersion = rv
        entries(p.metadata.labels, [("pad", "x" * pad)])
        p.spec.nodeName = "n"
        n = len(ser(p.metadata))
        if n == size:
            return p
        if n > size:
            break
    raise SystemExit("no ObjectMeta of %d bytes" % size)


VECTORS = []


def vec(name, data, comment):
    VECTORS.append((name, data, comment))


def main():
    p1 = pod("web-0", "101")
    vec("POD", ser(p1), "Pod web-0: ns default, uid uid-web-0, rv 101, labels {app: web}, "
        "spec{containers, restartPolicy Always, terminationGracePeriodSeconds 30, "
        "dnsPolicy, serviceAccountName default, nodeName node-1, hostNetwork false, "
        "schedulerName default-scheduler}, status{phase Running, hostIP, podIP 10.0.0.7, "
        "nominatedNodeName \"\"}")
    vec("POD_ENVELOPE", envelope("v1", "Pod", ser(p1)), "k8s\\0 + Unknown{v1 Pod, raw VEC_POD}")
    p2 = pod("web-1", "102", node="node-2", phase="Pending", ip="",
             labels=(("app", "web"), ("tier", "front"), ("zone", "a")), host_network=True,
             nominated="node-9", deleting=True)
    vec("POD_DELETING", ser(p2), "Pod web-1: rv 102, labels {app: web, tier: front, zone: a}, "
        "deletionTimestamp set, nodeName node-2, hostNetwork true, phase Pending, podIP \"\", "
        "nominatedNodeName node-9")
    p3 = pod("web-2", "103", labels=())
    vec("LIST0", pod_list([], "200"), "PodList, rv 200, no items")
    vec("LIST1", pod_list([p1], "201"), "PodList, rv 201, items [VEC_POD]")
    vec("LIST3", pod_list([p1, p2, p3], "202", cont="eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ",
                          remaining=17),
        "PodList, rv 202, continue eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ, remainingItemCount 17, "
        "items [VEC_POD, VEC_POD_DELETING, web-2]")
    vec("LIST_REMAINING0", pod_list([p1], "203", remaining=0),
        "PodList, rv 203, remainingItemCount 0 (set: written), items [VEC_POD]")
    vec("FRAME_ADDED", frame("ADDED", "v1", "Pod", ser(p1)),
        "watch frame: ADDED, object envelope(v1 Pod, VEC_POD)")
    vec("BOOKMARK_OBJ", bookmark_obj("300", False), "Pod{metadata{resourceVersion 300}}")
    vec("BOOKMARK_OBJ_END", bookmark_obj("301", True),
        "Pod{metadata{resourceVersion 301, annotations {k8s.io/initial-events-end: true}}}")
    vec("FRAME_BOOKMARK_END", frame("BOOKMARK", "v1", "Pod", bookmark_obj("301", True)),
        "watch frame: BOOKMARK, VEC_BOOKMARK_OBJ_END")
    st410 = status(410, "Expired", "too old resource version: 5 (100)")
    vec("STATUS_410", envelope("v1", "Status", ser(st410)),
        "Status{Failure, message \"too old resource version: 5 (100)\", reason Expired, "
        "code 410}")
    vec("FRAME_ERROR_410", frame("ERROR", "v1", "Status", ser(st410)),
        "watch frame: ERROR, Status 410 of VEC_STATUS_410")
    st422 = status(422, "Invalid", "bad \"x\"", {
        "name": "web-0", "group": "", "kind": "pods",
        "causes": [("FieldValueInvalid", "must be positive", "spec.x"),
                   ("FieldValueRequired", "", "")], "retry": 0})
    vec("STATUS_DETAILS", envelope("v1", "Status", ser(st422)),
        "Status 422 Invalid, message \"bad \\\"x\\\"\", details{name web-0, group \"\", "
        "kind pods, causes [{FieldValueInvalid, must be positive, spec.x}, "
        "{FieldValueRequired, \"\", \"\"}], retryAfterSeconds 0, uid \"\"}")
    st503 = status(503, "ServiceUnavailable", "not ready",
                   {"name": "", "group": "", "kind": "", "retry": 3})
    vec("STATUS_RETRY", envelope("v1", "Status", ser(st503)),
        "Status 503 ServiceUnavailable, message \"not ready\", details{retryAfterSeconds 3}")
    stneg = status(-1, "", "")
    vec("STATUS_NEGATIVE", envelope("v1", "Status", ser(stneg)),
        "Status code -1, empty reason and message: int32 sign-extended to 10 bytes")
    s = M["Secret"]()
    meta(s.metadata, "tls", "kube-system", "uid-tls", "55")
    e = s.data.add()
    e.key, e.value = "tls.crt", b"\x00\x01\x02"
    s.type = "kubernetes.io/tls"
    vec("SECRET", ser(s), "Secret tls, ns kube-system, rv 55, data {tls.crt}, "
        "type kubernetes.io/tls")
    n = M["Node"]()
    meta(n.metadata, "node-1", "", "uid-node-1", "77", (("kubernetes.io/os", "linux"),))
    n.spec.podCIDR = "10.0.1.0/24"
    n.spec.providerID = ""
    n.spec.unschedulable = True
    vec("NODE", ser(n), "Node node-1 (cluster-scoped), rv 77, spec.unschedulable true")
    ns = M["Namespace"]()
    meta(ns.metadata, "team-a", "", "uid-team-a", "88")
    ns.spec.finalizers.append("kubernetes")
    ns.status.phase = "Terminating"
    vec("NAMESPACE", ser(ns), "Namespace team-a, rv 88, status.phase Terminating")
    # pb_with_rv across a varint boundary: ObjectMeta 127 bytes with rv "9"
    # becomes 128 bytes with rv "10", and back.
    vec("META127", ser(meta_of_size(127, "9")), "Pod: ObjectMeta of 127 bytes, rv 9")
    vec("META128", ser(meta_of_size(128, "10")), "the same Pod, rv 10: ObjectMeta of 128 bytes")
    vec("POD_RV_BIG", ser(pod("web-0", "18446744073709551615")),
        "VEC_POD with rv 18446744073709551615 (the largest uint64)")

    out = sys.stdout
    out.write("/*\n * pb_vectors.h — generated by tests/unit/pb_vectors.py (Google's protobuf\n"
              " * runtime for Python, an encoder independent of kwc); do not edit.\n"
              " * Regenerate: /usr/bin/python3 tests/unit/pb_vectors.py > tests/unit/pb_vectors.h\n"
              " */\n#ifndef KWC_PB_VECTORS_H\n#define KWC_PB_VECTORS_H\n\n")
    for name, data, comment in VECTORS:
        out.write("/* %s */\nstatic const unsigned char VEC_%s[%d] = {\n" %
                  (comment, name, len(data)))
        for i in range(0, len(data), 16):
            out.write("    " + ", ".join("0x%02x" % b for b in data[i:i + 16]) + ",\n")
        out.write("};\n\n")
    out.write("#endif\n")


main()
