"""A small decoder of Kubernetes' protobuf wire format for kwc's tests.

Written from the protobuf encoding rules and Kubernetes' generated.proto field
numbers, independent of kwc's parser (cache/pb.c) and of apisim's encoder: the
tests read kwc's protobuf answers with it and compare what they find with the
JSON answers. Decoded objects take the shape of their JSON form for the fields
the tests look at (metadata, a pod's spec.nodeName, containers and
status.phase), so the watch model and selector checks written for JSON apply
unchanged.

  envelope(b)      -> (apiVersion, kind, raw)          b"k8s\\0" + Unknown
  decode_body(b)   -> a dict like the JSON body (object, list or Status)
  frames(buf)      -> (list of frames, rest)           4-byte big-endian lengths
  watch_event(f)   -> {"type": ..., "object": ...}
"""
import struct

MAGIC = b"k8s\x00"
CT = "application/vnd.kubernetes.protobuf"
CT_WATCH = CT + ";stream=watch"
ACCEPT = "application/vnd.kubernetes.protobuf, application/json"


class DecodeError(ValueError):
    pass


def varint(b, i):
    v = shift = 0
    while True:
        if i >= len(b):
            raise DecodeError("truncated varint")
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        if not c & 0x80:
            return v, i
        shift += 7
        if shift > 63:
            raise DecodeError("varint too long")


def fields(b):
    """[(field number, wire type, value)]: bytes for length-delimited, int for
    varints, raw bytes for fixed32/64."""
    out, i = [], 0
    while i < len(b):
        key, i = varint(b, i)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise DecodeError("field number 0")
        if wt == 0:
            v, i = varint(b, i)
        elif wt == 2:
            n, i = varint(b, i)
            if i + n > len(b):
                raise DecodeError("length past the end")
            v, i = b[i:i + n], i + n
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise DecodeError("wire type %d" % wt)
        if i > len(b):
            raise DecodeError("truncated")
        out.append((num, wt, v))
    return out


def last(fs, num, default=None):
    v = default
    for n, _, x in fs:
        if n == num:
            v = x
    return v


def every(fs, num):
    return [x for n, _, x in fs if n == num]


def s(x):
    return x.decode("utf-8") if x is not None else None


def envelope(b):
    if b[:4] != MAGIC:
        raise DecodeError("no k8s\\0 magic")
    fs = fields(b[4:])
    tm = fields(last(fs, 1, b""))
    return s(last(tm, 1, b"")), s(last(tm, 2, b"")), last(fs, 2, b"")


def string_map(entries):
    d = {}
    for e in entries:
        f = fields(e)
        d[s(last(f, 1, b""))] = s(last(f, 2, b""))
    return d


def object_meta(b):
    f = fields(b)
    md = {"name": s(last(f, 1, b""))}
    for num, key in ((3, "namespace"), (5, "uid"), (6, "resourceVersion"), (2, "generateName")):
        v = s(last(f, num, b""))
        if v:
            md[key] = v
    if last(f, 9) is not None:
        md["deletionTimestamp"] = True
    labels = string_map(every(f, 11))
    if labels:
        md["labels"] = labels
    ann = string_map(every(f, 12))
    if ann:
        md["annotations"] = ann
    return md


def decode_object(raw, kind=None):
    """An object message (list-item form) in its JSON shape, for the fields the
    tests read."""
    f = fields(raw)
    o = {"metadata": object_meta(last(f, 1, b""))}
    if kind in (None, "Pod"):
        spec = last(f, 2)
        if spec is not None:
            sf = fields(spec)
            sp = {}
            node = s(last(sf, 10, b""))
            if node:
                sp["nodeName"] = node
            cs = []
            for c in every(sf, 2):
                cf = fields(c)
                cs.append({"name": s(last(cf, 1, b"")), "image": s(last(cf, 2, b""))})
            if cs:
                sp["containers"] = cs
            o["spec"] = sp
        st = last(f, 3)
        if st is not None:
            stf = fields(st)
            phase = s(last(stf, 1, b""))
            o["status"] = {"phase": phase} if phase else {}
    return o


def decode_status(raw):
    f = fields(raw)
    st = {"kind": "Status", "apiVersion": "v1", "metadata": {},
          "status": s(last(f, 2, b"")), "message": s(last(f, 3, b"")),
          "reason": s(last(f, 4, b"")), "code": last(f, 6, 0)}
    d = last(f, 5)
    if d is not None:
        df = fields(d)
        det = {}
        for num, key in ((1, "name"), (2, "group"), (3, "kind"), (6, "uid")):
            v = s(last(df, num, b""))
            if v:
                det[key] = v
        causes = []
        for c in every(df, 4):
            cf = fields(c)
            cause = {}
            for num, key in ((1, "reason"), (2, "message"), (3, "field")):
                v = s(last(cf, num, b""))
                if v:
                    cause[key] = v
            causes.append(cause)
        if causes:
            det["causes"] = causes
        ra = last(df, 5, 0)
        if ra:
            det["retryAfterSeconds"] = ra
        st["details"] = det
    return st


def decode_list(raw, list_kind):
    f = fields(raw)
    lm = fields(last(f, 1, b""))
    md = {"resourceVersion": s(last(lm, 2, b""))}
    c = s(last(lm, 3, b""))
    if c:
        md["continue"] = c
    rem = last(lm, 4)
    if rem is not None:
        md["remainingItemCount"] = rem if rem < 1 << 63 else rem - (1 << 64)
    kind = list_kind[:-4] if list_kind.endswith("List") else None
    raw_items = every(f, 2)
    return {"kind": list_kind, "metadata": md, "items": [decode_object(i, kind) for i in raw_items],
            "raw_items": raw_items}


def decode_body(b):
    """A protobuf response body (object, list or Status) in its JSON shape,
    with kind and apiVersion from the envelope."""
    api, kind, raw = envelope(b)
    if kind == "Status":
        d = decode_status(raw)
    elif kind.endswith("List"):
        d = decode_list(raw, kind)
    else:
        d = decode_object(raw, kind)
        d["raw"] = raw
    d["kind"], d["apiVersion"] = kind, api
    return d


def frames(buf):
    """Split a watch stream: (complete frames, the bytes left over)."""
    out, i = [], 0
    while len(buf) - i >= 4:
        n = struct.unpack(">I", buf[i:i + 4])[0]
        if len(buf) - i - 4 < n:
            break
        out.append(buf[i + 4:i + 4 + n])
        i += 4 + n
    return out, buf[i:]


def watch_event(frame):
    f = fields(frame)
    typ = s(last(f, 1, b""))
    ext = fields(last(f, 2, b""))
    env = last(ext, 1, b"")
    return {"type": typ, "object": decode_body(env)}


def list_names(body):
    """(["ns/name", ...], continue) of a protobuf list body."""
    d = decode_body(body)
    names = ["%s/%s" % (i["metadata"].get("namespace", ""), i["metadata"]["name"]) for i in d["items"]]
    return names, d["metadata"].get("continue")
