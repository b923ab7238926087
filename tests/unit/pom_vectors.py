#!/usr/bin/python3
"""Golden vectors for pom_pb_from_json (tests/unit/pom_test.c): a stored JSON
custom resource in, the protobuf PartialObjectMetadata kube-apiserver writes
for it out.

The expected bytes come from an encoder independent of kwc: Google's protobuf
runtime for Python (Debian python3-protobuf), with metav1's messages declared
below through descriptor_pb2 (field numbers and types transcribed from
k8s.io/apimachinery/pkg/apis/meta/v1 generated.proto; not kwc's
cache/k8s_min.proto). The expected *values* are written by hand per case from
kube's rules, not computed from the input by a second implementation:

  - meta.AsPartialObjectMetadata reads an unstructured object through its
    accessors (unstructured.go): a string of the wrong type is "", an int64
    of the wrong type 0, labels/annotations with a value that is neither a
    string nor null are dropped (null reads as ""), finalizers with a
    non-string are dropped, ownerReferences with a non-object are dropped
    (controller/blockOwnerDeletion only when booleans), managedFields go
    through DefaultUnstructuredConverter (a wrong type or bad time drops the
    whole slice; fieldsV1 is the value as json.Marshal writes it);
  - times: time.Parse(RFC3339) (offsets applied, a fraction parsed but
    never written), unparsable and the zero time read as zero (a fraction
    past the zero instant is not zero);
  - gogo's MarshalToSizedBuffer: fields in number order, every by-value
    string and int64 written even when empty (1-7) and creationTimestamp
    always (an empty message for the zero time), pointers only when set
    (deletionTimestamp, deletionGracePeriodSeconds, controller,
    blockOwnerDeletion, time, fieldsV1), maps as entries {1 key, 2 value} in
    key order, Time as {1 seconds, 2 nanos} with both written and nanos 0
    (time_proto.go's ProtoTime leaves the fraction out: "our JSON only
    handled seconds").

Instants are given as calendar dates and converted here with Python's
datetime (not with kwc's parser).

Python's proto2 serializer writes every field that was set, in number order,
so each case sets exactly the fields gogo writes.

Regenerate (the output is committed; the unit test does not run Python):
    /usr/bin/python3 tests/unit/pom_vectors.py > tests/unit/pom_vectors.h
Needs Debian's python3-protobuf (apt-get install -y python3-protobuf).
"""
import datetime
import json
import struct
import sys

from google.protobuf import descriptor_pb2, message_factory

F = descriptor_pb2.FieldDescriptorProto
OPT, REP = F.LABEL_OPTIONAL, F.LABEL_REPEATED
STR, BYT, I32, I64, BOOL, MSG = (F.TYPE_STRING, F.TYPE_BYTES, F.TYPE_INT32,
                                 F.TYPE_INT64, F.TYPE_BOOL, F.TYPE_MESSAGE)

# k8s.io/apimachinery/pkg/apis/meta/v1 generated.proto (kube >= 1.25: no
# field 15, clusterName)
SCHEMA = {
    "Time": [("seconds", 1, I64), ("nanos", 2, I32)],
    "Entry": [("key", 1, STR), ("value", 2, STR)],
    "OwnerReference": [("kind", 1, STR), ("name", 3, STR), ("uid", 4, STR),
                       ("apiVersion", 5, STR), ("controller", 6, BOOL),
                       ("blockOwnerDeletion", 7, BOOL)],
    "FieldsV1": [("Raw", 1, BYT)],
    "ManagedFieldsEntry": [("manager", 1, STR), ("operation", 2, STR), ("apiVersion", 3, STR),
                           ("time", 4, MSG, OPT, "Time"), ("fieldsType", 6, STR),
                           ("fieldsV1", 7, MSG, OPT, "FieldsV1"), ("subresource", 8, STR)],
    "ObjectMeta": [("name", 1, STR), ("generateName", 2, STR), ("namespace", 3, STR),
                   ("selfLink", 4, STR), ("uid", 5, STR), ("resourceVersion", 6, STR),
                   ("generation", 7, I64), ("creationTimestamp", 8, MSG, OPT, "Time"),
                   ("deletionTimestamp", 9, MSG, OPT, "Time"),
                   ("deletionGracePeriodSeconds", 10, I64),
                   ("labels", 11, MSG, REP, "Entry"), ("annotations", 12, MSG, REP, "Entry"),
                   ("ownerReferences", 13, MSG, REP, "OwnerReference"),
                   ("finalizers", 14, STR, REP),
                   ("managedFields", 17, MSG, REP, "ManagedFieldsEntry")],
    "PartialObjectMetadata": [("metadata", 1, MSG, OPT, "ObjectMeta")],
    # the envelope and watch frames (k8s.io/apimachinery/pkg/runtime, meta/v1)
    "TypeMeta": [("apiVersion", 1, STR), ("kind", 2, STR)],
    "Unknown": [("typeMeta", 1, MSG, OPT, "TypeMeta"), ("raw", 2, BYT),
                ("contentEncoding", 3, STR), ("contentType", 4, STR)],
    "RawExtension": [("raw", 1, BYT)],
    "WatchEvent": [("type", 1, STR), ("object", 2, MSG, OPT, "RawExtension")],
}


def build():
    fp = descriptor_pb2.FileDescriptorProto(name="kwc_pom_vectors.proto", package="k8s",
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
UTC = datetime.timezone.utc


def at(y, mo, d, h=0, mi=0, s=0, nanos=0):
    """An instant given in UTC, to the nanosecond: (Unix seconds, nanos).
    Unix seconds count whole seconds (the fraction is never negative)."""
    t = datetime.datetime(y, mo, d, h, mi, s, tzinfo=UTC)
    epoch = datetime.datetime(1970, 1, 1, tzinfo=UTC)
    return (int((t - epoch).total_seconds()), nanos)


ZERO = "zero"  # a Time that is written as an empty message


def set_time(msg, t):
    msg.SetInParent()
    if t is not ZERO:
        msg.seconds = t[0]
        msg.nanos = 0  # ProtoTime: Nanos left out, the field still written


def owner(kind="", name="", uid="", api_version="", controller=None, block=None):
    return dict(kind=kind, name=name, uid=uid, apiVersion=api_version, controller=controller,
                blockOwnerDeletion=block)


def managed(manager="", operation="", api_version="", time=None, fields_type="",
            fields_raw=None, subresource=""):
    return dict(manager=manager, operation=operation, apiVersion=api_version, time=time,
                fieldsType=fields_type, fieldsV1=fields_raw, subresource=subresource)


def pom(name="", generate_name="", namespace="", self_link="", uid="", rv="", generation=0,
        created=ZERO, deleted=None, grace=None, labels=(), annotations=(), owners=(),
        finalizers=(), managed_fields=()):
    """The expected PartialObjectMetadata, field by field as gogo writes it."""
    p = M["PartialObjectMetadata"]()
    m = p.metadata
    m.name, m.generateName, m.namespace = name, generate_name, namespace
    m.selfLink, m.uid, m.resourceVersion = self_link, uid, rv
    m.generation = generation
    set_time(m.creationTimestamp, created)
    if deleted is not None:
        set_time(m.deletionTimestamp, deleted)
    if grace is not None:
        m.deletionGracePeriodSeconds = grace
    for field, pairs in ((m.labels, labels), (m.annotations, annotations)):
        for k, v in pairs:  # in the order given: the case lists them sorted
            e = field.add()
            e.key, e.value = k, v
    for o in owners:
        r = m.ownerReferences.add()
        r.kind, r.name, r.uid, r.apiVersion = o["kind"], o["name"], o["uid"], o["apiVersion"]
        if o["controller"] is not None:
            r.controller = o["controller"]
        if o["blockOwnerDeletion"] is not None:
            r.blockOwnerDeletion = o["blockOwnerDeletion"]
    m.finalizers.extend(finalizers)
    for mf in managed_fields:
        e = m.managedFields.add()
        e.manager, e.operation, e.apiVersion = mf["manager"], mf["operation"], mf["apiVersion"]
        if mf["time"] is not None:
            set_time(e.time, mf["time"])
        e.fieldsType = mf["fieldsType"]
        if mf["fieldsV1"] is not None:
            e.fieldsV1.Raw = mf["fieldsV1"]
        e.subresource = mf["subresource"]
    return p.SerializeToString(deterministic=True)


def envelope(raw):
    """k8s\\0 + Unknown{meta.k8s.io/v1 PartialObjectMetadata, raw, "", ""}."""
    u = M["Unknown"]()
    u.typeMeta.apiVersion = "meta.k8s.io/v1"
    u.typeMeta.kind = "PartialObjectMetadata"
    u.raw = raw
    u.contentEncoding = ""
    u.contentType = ""
    return b"k8s\x00" + u.SerializeToString(deterministic=True)


def frame(typ, raw):
    """One ;stream=watch frame: 4-byte big-endian length + WatchEvent{type,
    RawExtension{the envelope}}."""
    ev = M["WatchEvent"]()
    ev.type = typ
    ev.object.raw = envelope(raw)
    b = ev.SerializeToString(deterministic=True)
    return struct.pack(">I", len(b)) + b


CASES = []
FRAMES = []


def case(name, item, want, comment):
    """item: the stored JSON text (exactly these bytes), want: expected bytes."""
    CASES.append((name, item.encode() if isinstance(item, str) else item, want, comment))


def cr(metadata):
    """A stored custom resource around a metadata value given as JSON text."""
    return ('{"apiVersion":"example.com/v1","kind":"Widget","metadata":%s,"spec":{"size":3}}'
            % metadata)


def main():
    case("EMPTY", cr("{}"), pom(), "empty metadata: the six strings, generation 0 and an "
         "empty creationTimestamp are still written")
    case("NO_METADATA", '{"apiVersion":"example.com/v1","kind":"Widget"}', pom(),
         "no metadata key at all")
    case("NULL_METADATA", cr("null"), pom(), "metadata null")
    case("STRING_METADATA", cr('"x"'), pom(), "metadata not an object")

    full = cr(json.dumps({
        "zzz": {"unknown": True},
        "uid": "0d6a2f42-3b1e-4c43-9c5b-6f4d2a1b7e10",
        "resourceVersion": "12345",
        "name": "w-1",
        "generateName": "w-",
        "namespace": "team-a",
        "selfLink": "/apis/example.com/v1/namespaces/team-a/widgets/w-1",
        "generation": 7,
        "creationTimestamp": "2024-05-06T07:08:09Z",
        "deletionTimestamp": "2024-05-07T00:00:00Z",
        "deletionGracePeriodSeconds": 30,
        "labels": {"tier": "front", "app": "web", "app.kubernetes.io/name": "w"},
        "annotations": {"note": "<b>&amp;</b>", "empty": None},
        "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs-1", "uid": "u-rs",
             "controller": True, "blockOwnerDeletion": True},
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u-cm"},
            {"kind": "Thing", "controller": False, "blockOwnerDeletion": False, "extra": 1}],
        "finalizers": ["example.com/cleanup", "", "b"],
        "managedFields": [{
            "manager": "kubectl", "operation": "Apply", "apiVersion": "example.com/v1",
            "time": "2024-05-06T07:08:09Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:size": {}}, "f:metadata": {"f:labels": {".": {}}}},
            "subresource": "status"}],
    }))
    case("FULL", full, pom(
        name="w-1", generate_name="w-", namespace="team-a",
        self_link="/apis/example.com/v1/namespaces/team-a/widgets/w-1",
        uid="0d6a2f42-3b1e-4c43-9c5b-6f4d2a1b7e10", rv="12345", generation=7,
        created=at(2024, 5, 6, 7, 8, 9), deleted=at(2024, 5, 7), grace=30,
        labels=[("app", "web"), ("app.kubernetes.io/name", "w"), ("tier", "front")],
        annotations=[("empty", ""), ("note", "<b>&amp;</b>")],
        owners=[owner("ReplicaSet", "rs-1", "u-rs", "apps/v1", True, True),
                owner("ConfigMap", "cm", "u-cm", "v1"),
                owner("Thing", controller=False, block=False)],
        finalizers=["example.com/cleanup", "", "b"],
        managed_fields=[managed("kubectl", "Apply", "example.com/v1", at(2024, 5, 6, 7, 8, 9),
                                "FieldsV1",
                                b'{"f:metadata":{"f:labels":{".":{}}},"f:spec":{"f:size":{}}}',
                                "status")]),
        "every field set, keys in no particular order, an unknown key dropped")

    case("MAP_ORDER", cr('{"labels":{"b":"1","a":"2","B":"3","a.b":"4","a/b":"5","\\u00e9":"6",'
                         '"":"7"},"annotations":{"z":"","y":null}}'),
         pom(labels=[("", "7"), ("B", "3"), ("a", "2"), ("a.b", "4"),
                     ("a/b", "5"), ("b", "1"), ("\u00e9", "6")],
             annotations=[("y", ""), ("z", "")]),
         "map entries in bytewise key order (gogo sortkeys.Strings); empty key, UTF-8")
    case("MAP_WRONG", cr('{"labels":{"a":"1","b":2},"annotations":[["a","b"]]}'), pom(),
         "a label that is not a string drops all labels; annotations not an object")
    case("MAP_EMPTY", cr('{"labels":{},"annotations":null}'), pom(),
         "empty and null maps are not written")

    case("OWNERS", cr('{"ownerReferences":[{"uid":"u","kind":"K","name":5,"apiVersion":null,'
                      '"controller":"true","blockOwnerDeletion":true},{}]}'),
         pom(owners=[owner("K", "", "u", "", None, True), owner()]),
         "ownerReferences: wrong-typed strings read as \"\", a non-bool controller is unset; "
         "an empty object is four empty strings")
    case("OWNERS_DROPPED", cr('{"ownerReferences":[{"kind":"K"},"x"]}'), pom(),
         "a non-object owner drops the slice")
    case("OWNERS_NOT_ARRAY", cr('{"ownerReferences":{"kind":"K"},"finalizers":"f"}'), pom(),
         "ownerReferences and finalizers not arrays")
    case("FINALIZERS_DROPPED", cr('{"finalizers":["a",2]}'), pom(),
         "a non-string finalizer drops the slice")

    case("MANAGED", cr(
        '{"managedFields":[{"manager":"m","time":null,"fieldsV1":{"f:b":{},"f:a":{"v":1.5e-7,'
        '"w":[100,1e21,0.25,-0.0,1.0,"<&>"]}}},{"time":"0001-01-01T00:00:00Z","fieldsV1":"s",'
        '"operation":null,"extra":[1]},{"fieldsV1":null,"time":"2024-01-02T03:04:05.678+01:00"}'
        ']}'),
        pom(managed_fields=[
            managed("m", fields_raw=b'{"f:a":{"v":1.5e-7,"w":[100,1e+21,0.25,-0,1,'
                                    b'"\\u003c\\u0026\\u003e"]},"f:b":{}}'),
            managed(time=ZERO, fields_raw=b'"s"'),
            managed(time=at(2024, 1, 2, 2, 4, 5, 678000000))]),
        "managedFields: null fields unset, strings always written, fieldsV1 re-marshalled "
        "(keys sorted, Go's float64 form, HTML escapes), the zero time set but empty, "
        "an offset time with a fraction")
    case("MANAGED_BAD_TIME", cr('{"managedFields":[{"manager":"m"},{"time":"yesterday"}]}'), pom(),
         "a bad managedFields time drops the whole slice")
    case("MANAGED_EMPTY_TIME", cr('{"managedFields":[{"time":""}]}'), pom(),
         "an empty managedFields time fails time.Parse too")
    case("MANAGED_BAD_TYPE", cr('{"managedFields":[{"manager":5}]}'), pom(),
         "a non-string manager drops the whole slice")
    case("MANAGED_NOT_OBJECT", cr('{"managedFields":[{"manager":"m"},[]]}'), pom(),
         "a non-object entry drops the whole slice")
    case("MANAGED_EMPTY", cr('{"managedFields":[{}]}'), pom(managed_fields=[managed()]),
         "an empty entry: its four strings written empty")

    case("TIMES_FRACTION", cr('{"creationTimestamp":"2024-02-29T23:30:00.5-01:00",'
                              '"deletionTimestamp":"2024-01-01T00:00:00.123456789123+02:00",'
                              '"deletionGracePeriodSeconds":0}'),
         pom(created=at(2024, 3, 1, 0, 30, 0, 500000000),
             deleted=at(2023, 12, 31, 22, 0, 0, 123456789), grace=0),
         "fractions parsed and not written (nanos 0), offsets applied, "
         "a zero grace period written (a pointer)")
    case("TIMES_BEFORE_EPOCH", cr('{"creationTimestamp":"1969-12-31T23:59:59.5Z",'
                                  '"deletionTimestamp":"0001-01-01T00:00:01Z"}'),
         pom(created=at(1969, 12, 31, 23, 59, 59, 500000000), deleted=at(1, 1, 1, 0, 0, 1)),
         "negative seconds (a ten-byte varint); year 1 but not zero")
    case("TIMES_ZERO_FRACTION", cr('{"creationTimestamp":"0001-01-01T00:00:00.5Z"}'),
         pom(created=at(1, 1, 1, 0, 0, 0, 500000000)),
         "half a second past the zero instant is not zero: its seconds are written")
    case("TIMES_INVALID", cr('{"creationTimestamp":"2023-02-29T00:00:00Z",'
                             '"deletionTimestamp":"0001-01-01T00:00:00Z"}'),
         pom(), "an impossible date is zero; the zero deletionTimestamp is unset")
    case("TIMES_WRONG", cr('{"creationTimestamp":12,"deletionTimestamp":"2024-01-01T00:00:00"}'),
         pom(), "a number, a time without zone: zero")
    case("TIMES_NULLISH", cr('{"creationTimestamp":"null","deletionTimestamp":""}'), pom(),
         "the strings \"null\" and \"\" read as zero")
    case("TIMES_ZERO_OFFSET", cr('{"creationTimestamp":"0001-01-01T01:00:00+01:00"}'), pom(),
         "the zero instant written with an offset is zero")

    case("WRONG_TYPES", cr('{"name":7,"namespace":true,"uid":null,"generation":1.5,'
                           '"deletionGracePeriodSeconds":"30","resourceVersion":["1"]}'),
         pom(), "wrong types read as the accessors read them: \"\", 0, unset")
    case("GENERATION_STRING", cr('{"generation":"3","name":"n"}'), pom(name="n"),
         "generation as a string is 0")
    case("NEGATIVE", cr('{"generation":-1,"deletionGracePeriodSeconds":-5}'),
         pom(generation=-1, grace=-5), "negative int64s: ten-byte varints")
    case("BIG", cr('{"generation":9223372036854775807}'), pom(generation=9223372036854775807),
         "the largest int64")
    case("STRINGS", cr('{"name":"a\\u0000b","namespace":"\\u00fcml\\u00e4ut","uid":"<>&",'
                       '"resourceVersion":"\\ud83d\\ude00"}'),
         pom(name="a\x00b", namespace="\u00fcml\u00e4ut", uid="<>&", rv="\U0001F600"),
         "strings are their UTF-8 bytes: NUL, non-ASCII, no HTML escaping, a surrogate pair")
    case("WHITESPACE", ' { "kind" : "W" ,\n "metadata" : { "name" : "n" } } ', pom(name="n"),
         "whitespace between tokens")

    # hub_test.c's custom resource (stored JSON {"metadata":{"name","namespace",
    # "resourceVersion","labels":{"flip"}},"spec":{"nodeName"}}) watched for its
    # metadata in protobuf
    FRAMES.append(("ADDED_A101", frame("ADDED", pom(name="a", namespace="ns-1", rv="101",
                                                    labels=[("flip", "a")])),
                   "ADDED ns-1/a rv 101 {flip: a}"))
    FRAMES.append(("DELETED_A102", frame("DELETED", pom(name="a", namespace="ns-1", rv="102",
                                                        labels=[("flip", "a")])),
                   "DELETED: ns-1/a's previous object {flip: a} stamped with rv 102"))
    FRAMES.append(("ADDED_A102B", frame("ADDED", pom(name="a", namespace="ns-1", rv="102",
                                                     labels=[("flip", "b")])),
                   "ADDED ns-1/a rv 102 {flip: b}"))
    FRAMES.append(("BOOKMARK_102", frame("BOOKMARK", pom(rv="102")),
                   "BOOKMARK at 102: the bookmark object's ObjectMeta, every by-value field"))
    FRAMES.append(("BOOKMARK_END_102", frame("BOOKMARK", pom(
        rv="102", annotations=[("k8s.io/initial-events-end", "true")])),
        "BOOKMARK at 102 with the k8s.io/initial-events-end annotation"))

    out = sys.stdout
    out.write("/*\n * pom_vectors.h — generated by tests/unit/pom_vectors.py (Google's protobuf\n"
              " * runtime for Python, an encoder independent of kwc); do not edit.\n"
              " * Regenerate: /usr/bin/python3 tests/unit/pom_vectors.py > "
              "tests/unit/pom_vectors.h\n"
              " */\n#ifndef KWC_POM_VECTORS_H\n#define KWC_POM_VECTORS_H\n\n#include <stddef.h>\n\n"
              "/* each test includes the vectors it uses, and the others */\n"
              "#define POM_VEC_UNUSED __attribute__((unused))\n\n")

    def arr(name, data):
        out.write("static const unsigned char %s[%d] POM_VEC_UNUSED = {\n" % (name, max(len(data), 1)))
        for i in range(0, len(data), 16):
            out.write("    " + ", ".join("0x%02x" % b for b in data[i:i + 16]) + ",\n")
        out.write("};\n")

    def cstr(data):
        esc = "".join("\\" + chr(b) if chr(b) in '"\\' else
                      chr(b) if 0x20 <= b < 0x7f and chr(b) != "?" else "\\%03o" % b
                      for b in data)
        return '"%s"' % esc

    for name, item, want, comment in CASES:
        out.write("/* %s */\n" % comment.replace("*/", "* /"))
        out.write("static const char POM_IN_%s[] POM_VEC_UNUSED = %s;\n" % (name, cstr(item)))
        arr("POM_WANT_%s" % name, want)
        out.write("\n")
    out.write("struct pom_vector {\n    const char *name;\n    const char *in;\n"
              "    size_t in_len;\n    const unsigned char *want;\n    size_t want_len;\n};\n\n")
    out.write("static const struct pom_vector POM_VECTORS[] POM_VEC_UNUSED = {\n")
    for name, item, want, comment in CASES:
        out.write("    {\"%s\", POM_IN_%s, %d, POM_WANT_%s, %d},\n"
                  % (name, name, len(item), name, len(want)))
    out.write("};\n\n")
    for name, data, comment in FRAMES:
        out.write("/* %s */\n" % comment)
        arr("POM_FRAME_%s" % name, data)
        out.write("\n")
    out.write("#undef POM_VEC_UNUSED\n\n#endif\n")


main()
