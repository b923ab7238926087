#!/usr/bin/python3
"""apisim: a Kubernetes API server emulator for kwc's tests, benchmarks and demo.

Python 3 standard library only (run with /usr/bin/python3).  One asyncio loop in one
thread, so the whole state is consistent without locks.  It speaks kube-apiserver's
REST protocol on the wire: discovery, list/get/watch with the resourceVersion rules,
continue tokens, selectors, Table output, writes, Status errors, bookmarks,
sendInitialEvents, exec over websockets, plus a control API under /apisim/.

Where a status code or message copies kube-apiserver, the comment names the source
file in kubernetes/kubernetes it was taken from.  See README.md beside this file.
"""

import argparse
import asyncio
import base64
import bisect
import collections
import functools
import datetime
import gc
import hashlib
import json
import math
import os
import random
import re
import signal
import ssl
import struct
import sys
import time
import uuid
import zlib
from urllib.parse import parse_qsl, unquote

JSON_CT = b"application/json"

# ---------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------

_dumps_py = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_dumps_sorted_py = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, sort_keys=True).encode
_dumps_indent_py = json.JSONEncoder(indent=2, separators=(",", ": "), ensure_ascii=False).encode
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def go_escape(s):
    """Go's encoding/json string escaping on top of Python's: strings are written with
    HTMLEscape, "<", ">", "&", U+2028, U+2029 -> \\u003c \\u003e \\u0026 \\u2028 \\u2029
    (encoding/json encode.go; kube-apiserver's serializer is a json.Encoder with the default
    EscapeHTML, k8s.io/apimachinery/pkg/runtime/serializer/json/json.go doEncode).  These
    characters can only occur inside strings of the encoded text, so a replace on the whole
    output is exact.  Python already matches Go for '"', '\\', control characters
    (\\n \\r \\t; \\b \\f short since Go 1.22 = kube 1.30+ builds; else \\u00xx) and raw UTF-8."""
    if "<" in s:
        s = s.replace("<", "\\u003c")
    if ">" in s:
        s = s.replace(">", "\\u003e")
    if "&" in s:
        s = s.replace("&", "\\u0026")
    if "\u2028" in s:
        s = s.replace("\u2028", "\\u2028")
    if "\u2029" in s:
        s = s.replace("\u2029", "\\u2029")
    return s


def _utf8(s):
    try:
        return s.encode()
    except UnicodeEncodeError:
        # a lone surrogate escape (json.loads keeps it); Go's decoder made it U+FFFD
        return _LONE_SURROGATE.sub("\ufffd", s).encode()


def dumpb(obj):
    """Compact JSON bytes as Go's encoding/json writes a struct: no spaces, UTF-8, HTML
    escaping, keys in the order given (canon() gives the Go struct field order)."""
    return _utf8(go_escape(_dumps_py(obj)))


def dumpb_sorted(obj):
    """Compact JSON bytes as Go's encoding/json writes a map[string]interface{}: keys
    sorted at every level (custom resources are unstructured.Unstructured, encoded from
    their map: apimachinery unstructured.go UnstructuredJSONScheme.doEncode)."""
    return _utf8(go_escape(_dumps_sorted_py(go_numbers(obj))))


def dumpb_indent(obj):
    """json.MarshalIndent(obj, "", "  ") without a trailing newline: what
    apiserver/pkg/endpoints/handlers/responsewriters/writers.go WriteRawJSON writes for
    non-API objects (/version, the / path index)."""
    return _utf8(go_escape(_dumps_indent_py(obj)))


_INDENT_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\],:]|[ \t\r\n]+|[^"{}\[\],: \t\r\n]+', re.S)


class GoIndenter:
    """Go's json.Indent(dst, src, "", "  ") (encoding/json indent.go appendIndent) as a
    stream: feed() compact JSON in pieces that split it between tokens (never inside a
    string or a number), get the indented bytes.  A newline and two spaces per depth
    after "{" / "[" and ",", ": " after a key, "{}" and "[]" kept compact, whitespace
    outside strings dropped (the trailing newline of json.Encoder.Encode too), string
    contents untouched (their escaping stays the compact encoder's).  What
    json.MarshalIndent writes: Marshal's compact bytes re-indented, no newline at the end.
    A pretty API answer (serializer/json/json.go doEncode with options.Pretty) is that."""
    __slots__ = ("depth", "need")

    def __init__(self):
        self.depth = 0
        self.need = False   # a "{" or "[" was written: its newline waits for the first element

    def feed(self, src):
        out = []
        depth, need = self.depth, self.need
        for m in _INDENT_TOKEN.finditer(src):
            t = m.group()
            c = t[0]
            if c in b" \t\r\n":
                continue
            if need and c != 0x7D and c != 0x5D:   # not "}" / "]"
                need = False
                depth += 1
                out.append(b"\n" + b"  " * depth)
            if c == 0x7B or c == 0x5B:             # "{" "["
                need = True
                out.append(t)
            elif c == 0x2C:                        # ","
                out.append(b",\n" + b"  " * depth)
            elif c == 0x3A:                        # ":"
                out.append(b": ")
            elif c == 0x7D or c == 0x5D:           # "}" "]"
                if need:
                    need = False                   # empty: "{}" / "[]"
                else:
                    depth -= 1
                    out.append(b"\n" + b"  " * depth)
                out.append(t)
            else:
                out.append(t)
        self.depth, self.need = depth, need
        return b"".join(out)


def go_indent(src):
    """json.Indent of a whole compact JSON text (see GoIndenter)."""
    return GoIndenter().feed(src)


def go_parse_bool(s):
    """strconv.ParseBool: (value, ok)."""
    if s in ("1", "t", "T", "TRUE", "true", "True"):
        return True, True
    if s in ("0", "f", "F", "FALSE", "false", "False"):
        return False, True
    return False, False


_HEX = "0123456789abcdefABCDEF"


def go_query_unescape(s):
    """url.QueryUnescape: "+" is a space, "%XX" a byte; a "%" without two hex digits
    after it is an error (None)."""
    if "%" not in s:
        return s.replace("+", " ")
    out = bytearray()
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == "%":
            if i + 3 > n or s[i + 1] not in _HEX or s[i + 2] not in _HEX:
                return None
            out.append(int(s[i + 1:i + 3], 16))
            i += 3
            continue
        out += (" " if c == "+" else c).encode("latin-1", "replace")
        i += 1
    return out.decode("utf-8", "replace")


def go_query_get(raw, key):
    """url.Values.Get(key) of url.ParseQuery(raw) (Go 1.17+): pairs split at "&", a
    pair with a ";" is an error and skipped, an empty one skipped, key and value
    QueryUnescape'd (a pair that fails is skipped); the first value, or ""."""
    for pair in raw.split("&"):
        if not pair or ";" in pair:
            continue
        k, _, v = pair.partition("=")
        k = go_query_unescape(k)
        if k is None or k != key:
            continue
        v = go_query_unescape(v)
        if v is not None:
            return v
    return ""


def first_header(req, name):
    """http.Header.Get(name): the first line's value ("" when absent)."""
    for k, v in req.hlist:
        if k == name:
            return v
    return ""


def is_pretty_print(req):
    """responsewriters/writers.go isPrettyPrint: a query that contains "pretty" with a
    non-empty pretty= value decides alone (strconv.ParseBool; unparsable is false);
    else a User-Agent starting with curl, Wget or Mozilla/5.0 (case-sensitive)."""
    raw = req.target.partition("?")[2]
    if "pretty" in raw:
        pp = go_query_get(raw, "pretty")
        if pp:
            return go_parse_bool(pp)[0]
    ua = first_header(req, "user-agent")
    return ua.startswith(("curl", "Wget", "Mozilla/5.0"))


GZIP_THRESHOLD = 131072   # responsewriters/writers.go defaultGzipThresholdBytes (128 KiB)


def wants_gzip(req):
    """writers.go negotiateContentEncoding: the first Accept-Encoding line, split at
    ",", each token TrimSpace'd; gzip iff one is exactly "gzip" (no q-values, no "*",
    case-sensitive)."""
    v = first_header(req, "accept-encoding")
    return bool(v) and any(t.strip(" \t\n\v\f\r") == "gzip" for t in v.split(","))


class GoGzip:
    """A gzip member as Go's compress/gzip writes one at gzip.BestSpeed (level 1), the
    level kube's deferredResponseWriter uses: header 1f 8b 08, no flags, mtime 0, XFL 4
    (best speed), OS 255 (unknown); raw deflate; CRC-32 and length.  The deflate bytes
    are zlib's, not Go's (both valid; tests compare decompressed bytes)."""
    HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x04\xff"
    __slots__ = ("z", "crc", "n", "head")

    def __init__(self):
        self.z = zlib.compressobj(1, zlib.DEFLATED, -15)
        self.crc = 0
        self.n = 0
        self.head = self.HEADER

    def write(self, data):
        self.crc = zlib.crc32(data, self.crc)
        self.n += len(data)
        out = self.head + self.z.compress(data)
        self.head = b""
        return out

    def close(self):
        out = self.head + self.z.flush() + struct.pack("<II", self.crc, self.n & 0xFFFFFFFF)
        self.head = b""
        return out


def go_gzip(data):
    g = GoGzip()
    return g.write(data) + g.close()


def go_numbers(v):
    """Unstructured content as Go holds it: a JSON number is int64 when integral, else
    float64, and float64 encodes without ".0" (3.0 -> 3).  Integral floats become ints."""
    if isinstance(v, dict):
        return {k: go_numbers(x) for k, x in v.items()}
    if isinstance(v, list):
        return [go_numbers(x) for x in v]
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e21:
        return int(v)
    return v


def now_rfc3339(t=None):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if t is None else t))


def parse_rfc3339(s):
    try:
        return time.mktime(time.strptime(s[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    except (ValueError, TypeError):
        return None


def human_duration(seconds):
    """k8s.io/apimachinery/pkg/util/duration HumanDuration (kubectl's AGE)."""
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    s = int(seconds)
    if s < 60 * 2:
        return "%ds" % s
    minutes = s // 60
    if minutes < 10:
        sec = s % 60
        return "%dm" % minutes if sec == 0 else "%dm%ds" % (minutes, sec)
    if minutes < 60 * 3:
        return "%dm" % minutes
    hours = s // 3600
    if hours < 8:
        m = minutes % 60
        return "%dh" % hours if m == 0 else "%dh%dm" % (hours, m)
    if hours < 48:
        return "%dh" % hours
    if hours < 24 * 8:
        h = hours % 24
        return "%dd" % (hours // 24) if h == 0 else "%dd%dh" % (hours // 24, h)
    if hours < 24 * 365 * 2:
        return "%dd" % (hours // 24)
    if hours < 24 * 365 * 8:
        dy = (hours // 24) % 365
        return "%dy" % (hours // 24 // 365) if dy == 0 else "%dy%dd" % (hours // 24 // 365, dy)
    return "%dy" % (hours // 24 // 365)


def age_of(ts):
    t = parse_rfc3339(ts) if ts else None
    return "<unknown>" if t is None else human_duration(time.time() - t)


def kube_bool(value):
    """Query booleans as kube-apiserver decodes them.

    k8s.io/apimachinery/pkg/runtime/conversion.go Convert_Slice_string_To_bool: only
    "0" and case-insensitive "false" are false; any other value (even "" or "no") is
    true.  This is NOT strconv.ParseBool and never an error.
    """
    return not (value == "0" or value.lower() == "false")


def go_path_clean(p):
    """Go's path.Clean."""
    if p == "":
        return "."
    rooted = p.startswith("/")
    out = []
    for part in p.split("/"):
        if part == "" or part == ".":
            continue
        if part == "..":
            if out and out[-1] != "..":
                out.pop()
            elif not rooted:
                out.append("..")
            continue
        out.append(part)
    s = "/".join(out)
    if rooted:
        return "/" + s
    return s or "."


_B64URL = re.compile(r"^[A-Za-z0-9_\-\r\n]*$")


def raw_url_b64decode(s):
    """Go base64.RawURLEncoding.DecodeString; raises ValueError with Go's message."""
    if not _B64URL.match(s):
        for i, ch in enumerate(s):
            if not (ch.isalnum() or ch in "-_\r\n") or ord(ch) > 127:
                raise ValueError("illegal base64 data at input byte %d" % i)
    t = s.replace("\r", "").replace("\n", "")
    if len(t) % 4 == 1:
        raise ValueError("illegal base64 data at input byte %d" % (len(t) - 1))
    return base64.urlsafe_b64decode(t + "=" * (-len(t) % 4))


def raw_url_b64encode(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def go_json_string(s):
    """json.Marshal of a Go string (escapes <, >, & and control characters)."""
    out = json.dumps(s, ensure_ascii=False)
    return out.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def encode_continue(start_key, rv):
    """k8s.io/apiserver/pkg/storage/continue.go EncodeContinue; start_key already
    relative to the request's key prefix and ending in NUL."""
    raw = '{"v":"meta.k8s.io/v1","rv":%d,"start":%s}' % (rv, go_json_string(start_key))
    return raw_url_b64encode(raw.encode())


class ContinueError(Exception):
    pass


def decode_continue(token):
    """continue.go DecodeContinue -> (start_key relative to prefix, rv)."""
    try:
        data = raw_url_b64decode(token)
    except (ValueError, base64.binascii.Error) as e:
        raise ContinueError("continue key is not valid: %s" % e)
    try:
        c = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ContinueError("continue key is not valid: invalid character in JSON (%s)" % e.__class__.__name__)
    if not isinstance(c, dict):
        raise ContinueError("continue key is not valid: json: cannot unmarshal %s into Go value of type storage.continueToken"
                            % {list: "array", str: "string", int: "number", float: "number", bool: "bool"}.get(type(c), "value"))
    v = c.get("v", "")
    rv = c.get("rv", 0)
    start = c.get("start", "")
    if not isinstance(rv, int) or isinstance(rv, bool):
        raise ContinueError("continue key is not valid: json: cannot unmarshal %s into Go struct field continueToken.rv of type int64"
                            % ("string" if isinstance(rv, str) else "number"))
    if not isinstance(start, str) or not isinstance(v, str):
        raise ContinueError("continue key is not valid: json: cannot unmarshal value into Go struct field of type string")
    if v != "meta.k8s.io/v1":
        raise ContinueError("continue key is not valid: server does not recognize this encoded version %s" % v)
    if rv == 0:
        raise ContinueError("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
    if not start:
        raise ContinueError("continue key is not valid: encoded start key empty (version meta.k8s.io/v1)")
    key = start if start.startswith("/") else "/" + start
    if go_path_clean(key) != key:
        raise ContinueError("continue key is not valid: %s" % start)
    return key[1:], rv


# ---------------------------------------------------------------------------
# Status errors (k8s.io/apimachinery/pkg/api/errors/errors.go)
# ---------------------------------------------------------------------------

class ApiError(Exception):
    def __init__(self, code, reason, message, details=None, headers=None, extra=None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or []
        self.extra = extra  # e.g. {"continue": token} for ListMeta

    def status(self):
        st = {"kind": "Status", "apiVersion": "v1", "metadata": self.extra or {}, "status": "Failure",
              "message": self.message}
        if self.reason:
            st["reason"] = self.reason
        if self.details is not None:
            st["details"] = self.details
        st["code"] = self.code
        return st


def _qualified(rt):
    return rt.plural if not rt.group else "%s.%s" % (rt.plural, rt.group)


def _details(rt, name=None):
    d = {}
    if name:
        d["name"] = name
    if rt.group:
        d["group"] = rt.group
    d["kind"] = rt.plural
    return d


def err_not_found(rt, name):
    # errors.go NewNotFound: `%s "%s" not found` with the qualified resource.
    return ApiError(404, "NotFound", '%s "%s" not found' % (_qualified(rt), name), _details(rt, name))


def err_already_exists(rt, name):
    # errors.go NewAlreadyExists
    return ApiError(409, "AlreadyExists", '%s "%s" already exists' % (_qualified(rt), name), _details(rt, name))


def err_conflict(rt, name, why):
    # errors.go NewConflict: "Operation cannot be fulfilled on %s %q: %v"
    return ApiError(409, "Conflict", 'Operation cannot be fulfilled on %s "%s": %s' % (_qualified(rt), name, why),
                    _details(rt, name))


OBJ_MODIFIED = "the object has been modified; please apply your changes to the latest version and try again"


def err_bad_request(msg):
    # errors.go NewBadRequest (no details)
    return ApiError(400, "BadRequest", msg)


def err_expired(msg, cont=None):
    # errors.go NewResourceExpired: 410 reason Expired
    return ApiError(410, "Expired", msg, extra=({"continue": cont} if cont else None))


def field_err(ftype, field, detail, value=None, supported=None):
    """One field.Error as (type, field, body) -- validation/field/errors.go ErrorBody."""
    if ftype == "FieldValueForbidden":
        body = "Forbidden: " + detail
    elif ftype == "FieldValueRequired":
        body = "Required value" + (": " + detail if detail else "")
    elif ftype == "FieldValueNotSupported":
        body = "Unsupported value: %s" % json.dumps(value)
        if supported is not None:
            body += ": supported values: " + ", ".join(json.dumps(s) for s in supported)
    elif ftype == "FieldValueInvalid":
        body = "Invalid value: %s" % (json.dumps(value) if isinstance(value, str) else value)
        if detail:
            body += ": " + detail
    else:
        body = detail
    return (ftype, field, body)


def err_invalid(group, kind, name, errs):
    """errors.go NewInvalid: 422 `<Kind>.<group> "<name>" is invalid: <aggregate>`."""
    qk = kind if not group else "%s.%s" % (kind, group)
    msgs = ["%s: %s" % (f, b) for (_t, f, b) in errs]
    agg = msgs[0] if len(msgs) == 1 else "[" + ", ".join(msgs) + "]"
    details = {}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    details["kind"] = kind
    details["causes"] = [{"reason": t, "message": b, "field": f} for (t, f, b) in errs]
    return ApiError(422, "Invalid", '%s "%s" is invalid: %s' % (qk, name, agg), details)


def err_too_large_rv(want, current, retry):
    # k8s.io/apiserver/pkg/storage/errors.go NewTooLargeResourceVersionError + errors.go
    # NewTimeoutError ("Timeout: %s", 504, reason Timeout, details.retryAfterSeconds).
    details = {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]}
    headers = []
    if retry:
        details["retryAfterSeconds"] = retry
        headers = [(b"Retry-After", b"%d" % retry)]
    return ApiError(504, "Timeout", "Timeout: Too large resource version: %d, current: %d" % (want, current),
                    details, headers)


def err_generic(code, message):
    # responsewriters/status.go ErrorToAPIStatus for an error that is not a Status:
    # reason StatusReasonUnknown (""), omitted.
    return ApiError(code, "", message)


ERR_NOT_FOUND_PATH = ApiError(404, "NotFound", "the server could not find the requested resource", {})
ERR_METHOD = ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {})


# ---------------------------------------------------------------------------
# selectors (k8s.io/apimachinery/pkg/labels/selector.go, pkg/fields/selector.go)
# ---------------------------------------------------------------------------

class SelectorError(Exception):
    pass


_LBL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS1123_SUB = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SPECIAL = "(),=!<>"


def _validate_label_key(k):
    parts = k.split("/")
    if len(parts) == 1:
        name = parts[0]
        prefix = None
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return "prefix part must be non-empty"
        if len(prefix) > 253 or not _DNS1123_SUB.match(prefix):
            return "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
    else:
        return "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
    if not name:
        return "name part must be non-empty"
    if len(name) > 63:
        return "name part must be no more than 63 characters"
    if not _LBL_NAME.match(name):
        return "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
    return None


def _validate_label_value(v):
    if v == "":
        return None
    if len(v) > 63:
        return "must be no more than 63 characters"
    if not _LBL_NAME.match(v):
        return "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
    return None


def _lex_labels(s):
    toks = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c.isspace():
            i += 1
            continue
        if c in _SPECIAL:
            two = s[i:i + 2]
            if two in ("==", "!="):
                toks.append(("OP", two))
                i += 2
                continue
            if c == "!":
                toks.append(("NOT", c))
            elif c in "=<>":
                toks.append(("OP", c))
            elif c == ",":
                toks.append(("COMMA", c))
            else:
                toks.append(("OPEN" if c == "(" else "CLOSE", c))
            i += 1
            continue
        j = i
        while j < n and not s[j].isspace() and s[j] not in _SPECIAL:
            j += 1
        word = s[i:j]
        toks.append(("OP", word) if word in ("in", "notin") else ("ID", word))
        i = j
    toks.append(("EOS", ""))
    return toks


class LabelSelector:
    """A parsed label selector: a list of (key, op, values)."""

    __slots__ = ("reqs", "text")

    def __init__(self, text):
        self.text = text
        self.reqs = []
        if text.strip() == "":
            return
        toks = _lex_labels(text)
        pos = 0

        def lit(t):
            return t[1] if t[0] != "EOS" else "end of string"

        while True:
            t = toks[pos]
            if t[0] in ("ID", "NOT"):
                neg = False
                if t[0] == "NOT":
                    neg = True
                    pos += 1
                    t = toks[pos]
                    if t[0] != "ID":
                        raise SelectorError("unable to parse requirement: found '%s', expected: identifier" % lit(t))
                key = t[1]
                pos += 1
                err = _validate_label_key(key)
                if err:
                    raise SelectorError('unable to parse requirement: key: Invalid value: "%s": %s' % (key, err))
                nt = toks[pos]
                if neg:
                    self.reqs.append((key, "!", ()))
                elif nt[0] in ("COMMA", "EOS"):
                    self.reqs.append((key, "exists", ()))
                else:
                    if nt[0] != "OP":
                        raise SelectorError("unable to parse requirement: found '%s', expected: in, notin, =, ==, !=, gt, lt" % lit(nt))
                    op = nt[1]
                    pos += 1
                    vals = []
                    if op in ("in", "notin"):
                        if toks[pos][0] != "OPEN":
                            raise SelectorError("unable to parse requirement: found '%s', expected: '('" % lit(toks[pos]))
                        pos += 1
                        expect_val = True
                        while True:
                            vt = toks[pos]
                            if vt[0] == "ID" and expect_val:
                                vals.append(vt[1])
                                expect_val = False
                                pos += 1
                            elif vt[0] == "COMMA":
                                if expect_val:
                                    vals.append("")
                                expect_val = True
                                pos += 1
                            elif vt[0] == "CLOSE":
                                if expect_val and vals:
                                    vals.append("")
                                pos += 1
                                break
                            else:
                                raise SelectorError("unable to parse requirement: found '%s', expected: ',', ')' or identifier" % lit(vt))
                        if not vals:
                            raise SelectorError("unable to parse requirement: values: Invalid value: []string{}: for 'in', 'notin' operators, values set can't be empty")
                    else:
                        vt = toks[pos]
                        if vt[0] == "ID":
                            vals.append(vt[1])
                            pos += 1
                        elif vt[0] in ("COMMA", "EOS"):
                            vals.append("")
                        else:
                            raise SelectorError("unable to parse requirement: found '%s', expected: identifier" % lit(vt))
                        if op in (">", "<"):
                            try:
                                int(vals[0])
                            except ValueError:
                                raise SelectorError('unable to parse requirement: values[0]: Invalid value: "%s": for \'Gt\', \'Lt\' operators, the value must be an integer' % vals[0])
                    for i, v in enumerate(vals):
                        if op in (">", "<"):
                            break
                        verr = _validate_label_value(v)
                        if verr:
                            raise SelectorError('unable to parse requirement: values[%d][%s]: Invalid value: "%s": %s' % (i, key, v, verr))
                    self.reqs.append((key, {"==": "=", "!=": "!="}.get(op, op), tuple(vals)))
                t = toks[pos]
                if t[0] == "EOS":
                    break
                if t[0] == "COMMA":
                    pos += 1
                    if toks[pos][0] not in ("ID", "NOT"):
                        raise SelectorError("found '%s', expected: identifier after ','" % lit(toks[pos]))
                    continue
                raise SelectorError("found '%s', expected: ',' or 'end of string'" % lit(t))
            elif t[0] == "EOS":
                break
            else:
                raise SelectorError("found '%s', expected: !, identifier, or 'end of string'" % lit(t))

    def empty(self):
        return not self.reqs

    def matches(self, labels):
        for key, op, vals in self.reqs:
            if op == "=" or op == "in":
                v = labels.get(key)
                if v is None or v not in vals:
                    return False
            elif op == "!=" or op == "notin":
                v = labels.get(key)
                if v is not None and v in vals:
                    return False
            elif op == "exists":
                if key not in labels:
                    return False
            elif op == "!":
                if key in labels:
                    return False
            elif op in (">", "<"):
                v = labels.get(key)
                if v is None:
                    return False
                try:
                    iv = int(v)
                except ValueError:
                    return False
                if op == ">" and not iv > int(vals[0]):
                    return False
                if op == "<" and not iv < int(vals[0]):
                    return False
        return True


def _split_field_terms(s):
    terms, cur, i = [], [], 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            cur.append(s[i:i + 2])
            i += 2
            continue
        if c == ",":
            terms.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    terms.append("".join(cur))
    return terms


def _unescape_field_value(v):
    out, i = [], 0
    while i < len(v):
        c = v[i]
        if c == "\\":
            if i + 1 >= len(v) or v[i + 1] not in "\\,=":
                raise SelectorError("invalid field selector: invalid escape sequence")
            out.append(v[i + 1])
            i += 2
            continue
        if c in ",=":
            raise SelectorError("invalid field selector: unescaped %s" % c)
        out.append(c)
        i += 1
    return "".join(out)


class FieldSelector:
    """A parsed field selector: list of (field, negate, value)."""

    __slots__ = ("terms", "text")

    def __init__(self, text):
        self.text = text
        self.terms = []
        parts = sorted(_split_field_terms(text))
        for part in parts:
            if part == "":
                continue
            found = None
            for i in range(len(part)):
                for op in ("!=", "==", "="):
                    if part.startswith(op, i):
                        found = (part[:i], op, part[i + len(op):])
                        break
                if found:
                    break
            if not found:
                raise SelectorError("invalid selector: '%s'; can't understand '%s'" % (text, part))
            lhs, op, rhs = found
            self.terms.append((lhs, op == "!=", _unescape_field_value(rhs)))

    def empty(self):
        return not self.terms

    def name_value(self):
        for f, neg, v in self.terms:
            if f == "metadata.name" and not neg:
                return v
        return None

    def matches(self, obj):
        for f, neg, v in self.terms:
            if f == "metadata.name":
                have = obj.name
            elif f == "metadata.namespace":
                have = obj.ns
            else:
                have = obj.fields.get(f, "") if obj.fields else ""
            if (have == v) == neg:
                return False
        return True


# ---------------------------------------------------------------------------
# objects: canonical encoding, builders, resource types
# ---------------------------------------------------------------------------

META_ORDER = ("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
              "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
              "ownerReferences", "finalizers", "managedFields")


def meta_order(md):
    """ObjectMeta in its Go struct field order, label/annotation maps sorted."""
    om = {}
    for k in META_ORDER:
        v = md.get(k)
        if v is None:
            continue
        if k in ("labels", "annotations") and isinstance(v, dict):
            if not v:
                continue
            v = {kk: v[kk] for kk in sorted(v)}
        om[k] = v
    for k, v in md.items():
        if k not in om and v is not None and k not in META_ORDER:
            om[k] = v
    return om


def _go_time(v):
    """metav1.Time read from a string as Unstructured's accessors read it
    (time.Parse RFC 3339) and written as MarshalJSON writes it (UTC, no
    fraction): None for the zero time, an unparsable or a non-string value."""
    if not isinstance(v, str):
        return None
    m = re.fullmatch(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", v)
    if not m:
        return None
    try:
        t = datetime.datetime(int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]), int(m[6]))
    except ValueError:
        return None
    if m[8] != "Z":
        hh, mm = int(m[8][1:3]), int(m[8][4:6])
        if hh > 23 or mm > 59:
            return None
        off = datetime.timedelta(hours=hh, minutes=mm)
        try:
            t = t - off if m[8][0] == "+" else t + off
        except OverflowError:
            return None
    nsec = int((m[7] or "0")[:9].ljust(9, "0"))
    if t == datetime.datetime(1, 1, 1) and nsec == 0:
        return None
    return "%04d-%02d-%02dT%02d:%02d:%02dZ" % (t.year, t.month, t.day, t.hour, t.minute, t.second)


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def partial_meta(md):
    """ObjectMeta as kube's meta.AsPartialObjectMetadata builds it and the typed
    struct encodes it: through the Unstructured accessors for a custom resource
    (unstructured.go: a value of the wrong type reads as zero, null label
    values as "", unknown keys dropped, creationTimestamp null when zero), which
    gives a built-in kind's stored metadata back unchanged."""
    if not isinstance(md, dict):
        md = {}
    out = {}
    for k in ("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion"):
        if isinstance(md.get(k), str) and md[k]:
            out[k] = md[k]
    if _is_int(md.get("generation")) and md["generation"]:
        out["generation"] = md["generation"]
    out["creationTimestamp"] = _go_time(md.get("creationTimestamp"))
    if _go_time(md.get("deletionTimestamp")):
        out["deletionTimestamp"] = _go_time(md.get("deletionTimestamp"))
    if _is_int(md.get("deletionGracePeriodSeconds")):
        out["deletionGracePeriodSeconds"] = md["deletionGracePeriodSeconds"]
    for k in ("labels", "annotations"):
        m = md.get(k)
        if isinstance(m, dict) and m and all(v is None or isinstance(v, str) for v in m.values()):
            out[k] = {kk: m[kk] or "" for kk in sorted(m)}
    refs = md.get("ownerReferences")
    if isinstance(refs, list) and refs and all(isinstance(o, dict) for o in refs):
        out["ownerReferences"] = []
        for o in refs:
            r = {k: o[k] if isinstance(o.get(k), str) else "" for k in ("apiVersion", "kind", "name", "uid")}
            for k in ("controller", "blockOwnerDeletion"):
                if isinstance(o.get(k), bool):
                    r[k] = o[k]
            out["ownerReferences"].append(r)
    fin = md.get("finalizers")
    if isinstance(fin, list) and fin and all(isinstance(f, str) for f in fin):
        out["finalizers"] = fin
    mf = md.get("managedFields")
    if isinstance(mf, list) and mf:
        entries = []
        for o in mf:
            e = {}
            if not isinstance(o, dict):
                entries = None
                break
            for k in ("manager", "operation", "apiVersion", "time", "fieldsType", "fieldsV1", "subresource"):
                v = o.get(k)
                if v is None:
                    continue
                if k == "fieldsV1":
                    e[k] = v
                elif not isinstance(v, str):
                    entries = None
                    break
                elif k == "time":
                    if _go_time(v) is None and v != "0001-01-01T00:00:00Z":
                        entries = None
                        break
                    e[k] = _go_time(v)
                elif v:
                    e[k] = v
            if entries is None:
                break
            entries.append(e)
        if entries:
            out["managedFields"] = entries
    return out


def canon(d):
    """Reorder an object for its canonical encoding: kind, apiVersion, metadata (in
    ObjectMeta field order, maps sorted like Go), spec, status, then the rest."""
    out = {}
    if "kind" in d:
        out["kind"] = d["kind"]
    if "apiVersion" in d:
        out["apiVersion"] = d["apiVersion"]
    md = d.get("metadata")
    if isinstance(md, dict):
        out["metadata"] = meta_order(md)
    for k in KIND_FIELDS.get(d.get("kind"), ("spec", "status")):
        if k in d:
            v = d[k]
            if k in SORTED_MAPS and isinstance(v, dict):
                v = {kk: v[kk] for kk in sorted(v)}   # a Go map[string]string/[]byte: sorted keys
            out[k] = v
    for k, v in d.items():
        if k not in out:
            out[k] = v
    return out


# Top-level fields after metadata, in the Go struct order of k8s.io/api/core/v1 types.go
# (ConfigMap: Immutable, Data, BinaryData; Secret: Immutable, Data, StringData, Type).
KIND_FIELDS = {"ConfigMap": ("immutable", "data", "binaryData"),
               "Secret": ("immutable", "data", "stringData", "type"),
               "Endpoints": ("subsets",)}
SORTED_MAPS = ("data", "binaryData", "stringData")


class Obj:
    """One stored object: its key, selector attributes and canonical JSON bytes."""

    __slots__ = ("key", "ns", "name", "rv", "labels", "fields", "data", "uid", "pb")

    def __init__(self, key, ns, name, rv, labels, fields, data, uid=""):
        self.key = key
        self.ns = ns
        self.name = name
        self.rv = rv
        self.labels = labels
        self.fields = fields
        self.data = data
        self.uid = uid
        self.pb = None      # the protobuf message (no envelope), encoded when first asked for

    def with_rv(self, rv):
        """The same object re-stamped with another resourceVersion (DELETED events)."""
        old = b'"resourceVersion":"%d"' % self.rv
        data = self.data.replace(old, b'"resourceVersion":"%d"' % rv, 1)
        return Obj(self.key, self.ns, self.name, rv, self.labels, self.fields, data, self.uid)

    def dict(self):
        return json.loads(self.data)


def convert_obj(obj, rt):
    """obj (of the same resource in another version) as rt's version stores it: the
    same object with rt's apiVersion, converted by rt.convert when it has one (events)."""
    d = json.loads(obj.data)
    if rt.convert is not None:
        d = rt.convert(d)
    d["apiVersion"] = rt.api_version
    fields = rt.fields_fn(d) if rt.fields_fn else obj.fields
    return Obj(obj.key, obj.ns, obj.name, obj.rv, obj.labels, fields, rt.encode(d), obj.uid)


# pkg/apis/events/v1/conversion.go: core/v1 Event field <-> events.k8s.io/v1 Event field,
# in the Go field order of events.k8s.io/v1 Event (then of core/v1 Event, below)
_EV_V1 = [("eventTime", "eventTime"), ("series", "series"), ("reportingComponent", "reportingController"),
          ("reportingInstance", "reportingInstance"), ("action", "action"), ("reason", "reason"),
          ("involvedObject", "regarding"), ("related", "related"), ("message", "note"), ("type", "type"),
          ("source", "deprecatedSource"), ("firstTimestamp", "deprecatedFirstTimestamp"),
          ("lastTimestamp", "deprecatedLastTimestamp"), ("count", "deprecatedCount")]
_EV_CORE = ("involvedObject", "reason", "message", "source", "firstTimestamp", "lastTimestamp", "count", "type",
            "eventTime", "series", "action", "related", "reportingComponent", "reportingInstance")


def event_to_v1(d):
    """A core/v1 Event as events.k8s.io/v1 shows it (one storage, two versions)."""
    if d.get("apiVersion") == "events.k8s.io/v1":
        return d
    out = {"kind": "Event", "apiVersion": "events.k8s.io/v1", "metadata": d.get("metadata")}
    for core, v1 in _EV_V1:
        if core in d:
            out[v1] = d[core]
    return out


def event_to_core(d):
    """An events.k8s.io/v1 Event as core/v1 shows it."""
    if d.get("apiVersion") == "v1":
        return d
    back = {v1: core for core, v1 in _EV_V1}
    conv = {back[k]: v for k, v in d.items() if k in back}
    out = {"kind": "Event", "apiVersion": "v1", "metadata": d.get("metadata")}
    for k in _EV_CORE:
        if k in conv:
            out[k] = conv[k]
    return out


def _s(v):
    return "" if v is None else (("true" if v else "false") if isinstance(v, bool) else str(v))


def pod_fields(d):
    sp = d.get("spec") or {}
    st = d.get("status") or {}
    return {"spec.nodeName": _s(sp.get("nodeName")), "spec.restartPolicy": _s(sp.get("restartPolicy")),
            "spec.schedulerName": _s(sp.get("schedulerName")),
            "spec.serviceAccountName": _s(sp.get("serviceAccountName")),
            "status.phase": _s(st.get("phase")), "status.podIP": _s(st.get("podIP")),
            "status.nominatedNodeName": _s(st.get("nominatedNodeName"))}


def node_fields(d):
    return {"spec.unschedulable": "true" if (d.get("spec") or {}).get("unschedulable") else "false"}


def ns_fields(d):
    return {"status.phase": _s((d.get("status") or {}).get("phase"))}


def secret_fields(d):
    return {"type": _s(d.get("type"))}


def rs_fields(d):
    return {"status.replicas": _s((d.get("status") or {}).get("replicas", 0))}


# --- builders: v maps variable names to strings (real values, or template sentinels)

def build_pod(v):
    app, ts, img = v["app"], v["ts"], "registry.example.com/%s:1.4.2" % v["app"]
    ann = {}
    if v.get("pad"):
        ann["apisim.kwc.dev/pad"] = v["pad"]
    cond = [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": ts}
            for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")]
    d = {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": v["name"], "namespace": v["ns"], "uid": v["uid"], "resourceVersion": v["rv"],
                     "generation": 1, "creationTimestamp": ts,
                     "labels": {"app": app, "pod-template-hash": v["hash"], "tier": v["tier"]},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                          "name": "%s-%s" % (app, v["hash"]), "uid": v["rsuid"],
                                          "controller": True, "blockOwnerDeletion": True}]},
        "spec": {
            "volumes": [{"name": "kube-api-access", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1",
                                                                               "fieldPath": "metadata.namespace"}}]}}],
                "defaultMode": 420}}],
            "containers": [{
                "name": "app", "image": img,
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                          {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
                "env": [{"name": "APP_NAME", "value": app}, {"name": "LOG_LEVEL", "value": "info"},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}],
                "resources": {"limits": {"cpu": "500m", "memory": "256Mi"},
                              "requests": {"cpu": "100m", "memory": "128Mi"}},
                "volumeMounts": [{"name": "kube-api-access", "readOnly": True,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent"}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "serviceAccount": "default", "nodeName": v["node"],
            "securityContext": {}, "schedulerName": "default-scheduler",
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300},
                            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300}],
            "priority": 0, "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority"},
        "status": {
            "phase": "Running", "conditions": cond, "hostIP": v["hostip"], "hostIPs": [{"ip": v["hostip"]}],
            "podIP": v["ip"], "podIPs": [{"ip": v["ip"]}], "startTime": ts,
            "containerStatuses": [{"name": "app", "state": {"running": {"startedAt": ts}}, "lastState": {},
                                   "ready": True, "restartCount": 0, "image": img,
                                   "imageID": "registry.example.com/%s@sha256:%s" % (app, v["cid"]),
                                   "containerID": "containerd://" + v["cid"], "started": True}],
            "qosClass": "Burstable"}}
    if ann:
        d["metadata"]["annotations"] = ann
    return d


def ann_of(md):
    a = md.get("annotations")
    if not isinstance(a, dict):
        a = md["annotations"] = {}
    return a


def build_node(v):
    ts = v["ts"]
    conds = [{"type": t, "status": "False", "lastHeartbeatTime": ts, "lastTransitionTime": ts,
              "reason": "Kubelet" + r, "message": m}
             for t, r, m in (("MemoryPressure", "HasSufficientMemory", "kubelet has sufficient memory available"),
                             ("DiskPressure", "HasNoDiskPressure", "kubelet has no disk pressure"),
                             ("PIDPressure", "HasSufficientPID", "kubelet has sufficient PID available"))]
    conds.append({"type": "Ready", "status": "True", "lastHeartbeatTime": ts, "lastTransitionTime": ts,
                  "reason": "KubeletReady", "message": "kubelet is posting ready status"})
    cap = {"cpu": "8", "ephemeral-storage": "102350Mi", "hugepages-2Mi": "0", "memory": "32863724Ki", "pods": "110"}
    d = {"kind": "Node", "apiVersion": "v1",
         "metadata": {"name": v["name"], "uid": v["uid"], "resourceVersion": v["rv"], "generation": 1,
                      "creationTimestamp": ts,
                      "labels": {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                                 "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": v["name"],
                                 "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "apisim.large"},
                      "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                      "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
         "spec": {"podCIDR": v["cidr"], "podCIDRs": [v["cidr"]], "providerID": "apisim://" + v["name"]},
         "status": {"capacity": cap, "allocatable": dict(cap), "conditions": conds,
                    "addresses": [{"type": "InternalIP", "address": v["ip"]}, {"type": "Hostname", "address": v["name"]}],
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                    "nodeInfo": {"machineID": v["mid"], "systemUUID": v["uid"], "bootID": v["mid"],
                                 "kernelVersion": "6.1.0-apisim", "osImage": "Debian GNU/Linux 12 (bookworm)",
                                 "containerRuntimeVersion": "containerd://1.7.13", "kubeletVersion": v["kver"],
                                 "kubeProxyVersion": v["kver"], "operatingSystem": "linux", "architecture": "amd64"}}}
    if v.get("pad"):
        d["metadata"]["annotations"]["apisim.kwc.dev/pad"] = v["pad"]
    return d


def build_namespace(v):
    return {"kind": "Namespace", "apiVersion": "v1",
            "metadata": {"name": v["name"], "uid": v["uid"], "resourceVersion": v["rv"], "generation": 1,
                         "creationTimestamp": v["ts"], "labels": {"kubernetes.io/metadata.name": v["name"]}},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}


def _simple_meta(v, labels=None):
    md = {"name": v["name"], "namespace": v["ns"], "uid": v["uid"], "resourceVersion": v["rv"],
          "generation": 1, "creationTimestamp": v["ts"]}
    if labels:
        md["labels"] = labels
    if v.get("pad"):
        md["annotations"] = {"apisim.kwc.dev/pad": v["pad"]}
    return md


def build_configmap(v):
    return {"kind": "ConfigMap", "apiVersion": "v1", "metadata": _simple_meta(v, {"app": v["app"]}),
            "data": {"app.properties": "name=%s\nreplicas=3\n" % v["app"], "mode": "production"}}


def build_secret(v):
    return {"kind": "Secret", "apiVersion": "v1", "metadata": _simple_meta(v, {"app": v["app"]}),
            "data": {"password": "c2VjcmV0LXBhc3N3b3Jk", "username": "YWRtaW4="}, "type": "Opaque"}


def build_service(v):
    return {"kind": "Service", "apiVersion": "v1", "metadata": _simple_meta(v, {"app": v["app"]}),
            "spec": {"ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                     "selector": {"app": v["app"]}, "clusterIP": v["ip"], "clusterIPs": [v["ip"]],
                     "type": "ClusterIP", "sessionAffinity": "None", "ipFamilies": ["IPv4"],
                     "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Cluster"},
            "status": {"loadBalancer": {}}}


def build_endpoints(v):
    return {"kind": "Endpoints", "apiVersion": "v1", "metadata": _simple_meta(v, {"app": v["app"]}),
            "subsets": [{"addresses": [{"ip": v["ip"], "nodeName": v["node"]}],
                         "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]}


def _pod_template(app):
    return {"metadata": {"labels": {"app": app}},
            "spec": {"containers": [{"name": "app", "image": "registry.example.com/%s:1.4.2" % app,
                                     "resources": {}, "terminationMessagePath": "/dev/termination-log",
                                     "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}],
                     "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
                     "securityContext": {}, "schedulerName": "default-scheduler"}}


def build_deployment(v):
    ts = v["ts"]
    return {"kind": "Deployment", "apiVersion": "apps/v1", "metadata": _simple_meta(v, {"app": v["app"]}),
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": v["app"]}}, "template": _pod_template(v["app"]),
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}},
                     "revisionHistoryLimit": 10, "progressDeadlineSeconds": 600},
            "status": {"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3, "readyReplicas": 3,
                       "availableReplicas": 3,
                       "conditions": [{"type": "Available", "status": "True", "lastUpdateTime": ts,
                                       "lastTransitionTime": ts, "reason": "MinimumReplicasAvailable",
                                       "message": "Deployment has minimum availability."}]}}


def build_replicaset(v):
    return {"kind": "ReplicaSet", "apiVersion": "apps/v1", "metadata": _simple_meta(v, {"app": v["app"]}),
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": v["app"]}}, "template": _pod_template(v["app"])},
            "status": {"replicas": 3, "fullyLabeledReplicas": 3, "readyReplicas": 3, "availableReplicas": 3,
                       "observedGeneration": 1}}


def build_daemonset(v):
    return {"kind": "DaemonSet", "apiVersion": "apps/v1", "metadata": _simple_meta(v, {"app": v["app"]}),
            "spec": {"selector": {"matchLabels": {"app": v["app"]}}, "template": _pod_template(v["app"]),
                     "updateStrategy": {"type": "RollingUpdate"}, "revisionHistoryLimit": 10},
            "status": {"currentNumberScheduled": 3, "numberMisscheduled": 0, "desiredNumberScheduled": 3,
                       "numberReady": 3, "observedGeneration": 1, "updatedNumberScheduled": 3,
                       "numberAvailable": 3}}


def build_statefulset(v):
    return {"kind": "StatefulSet", "apiVersion": "apps/v1", "metadata": _simple_meta(v, {"app": v["app"]}),
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": v["app"]}}, "template": _pod_template(v["app"]),
                     "serviceName": v["app"], "podManagementPolicy": "OrderedReady",
                     "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
                     "revisionHistoryLimit": 10},
            "status": {"observedGeneration": 1, "replicas": 3, "readyReplicas": 3, "currentReplicas": 3,
                       "updatedReplicas": 3, "availableReplicas": 3}}


def build_widget(v):
    return {"kind": "Widget", "apiVersion": "example.com/v1", "metadata": _simple_meta(v, {"app": v["app"]}),
            "spec": {"color": "blue", "size": 3}, "status": {"phase": "Ready"}}


# --- Table printers (pkg/printers/internalversion/printers.go, column names & cells)

def col(name, desc="", prio=0, fmt="", typ="string"):
    return {"name": name, "type": typ, "format": fmt, "description": desc, "priority": prio}


NAME_DESC = ("Name must be unique within a namespace. Is required when creating resources, although some "
             "resources may allow a client to request the generation of an appropriate name automatically. "
             "Name is primarily intended for creation idempotence and configuration definition. Cannot be "
             "updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names")
AGE_DESC = ("CreationTimestamp is a timestamp representing the server time when this object was created. It is "
            "not guaranteed to be set in happens-before order across separate operations. Clients may not set "
            "this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. "
            "Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/"
            "api-conventions.md#metadata")
NAME_COL = col("Name", NAME_DESC, fmt="name")
AGE_COL = col("Age", AGE_DESC)


def _none(v):
    return v if v else "<none>"


def pod_row(d):
    md, sp, st = d.get("metadata", {}), d.get("spec", {}), d.get("status", {})
    cs = st.get("containerStatuses") or []
    total = len(sp.get("containers") or [])
    ready = sum(1 for c in cs if c.get("ready"))
    restarts = sum(int(c.get("restartCount", 0)) for c in cs)
    reason = st.get("reason") or st.get("phase") or ""
    for c in cs:
        state = c.get("state") or {}
        if "waiting" in state and state["waiting"].get("reason"):
            reason = state["waiting"]["reason"]
        elif "terminated" in state:
            reason = state["terminated"].get("reason") or "Error"
    if md.get("deletionTimestamp"):
        reason = "Terminating"
    return [md.get("name", ""), "%d/%d" % (ready, total), reason, str(restarts), age_of(md.get("creationTimestamp")),
            _none(st.get("podIP")), _none(sp.get("nodeName")), _none(st.get("nominatedNodeName")), "<none>"]


def node_row(d):
    md, sp, st = d.get("metadata", {}), d.get("spec", {}), d.get("status", {})
    status = "Unknown"
    for c in st.get("conditions") or []:
        if c.get("type") == "Ready":
            status = "Ready" if c.get("status") == "True" else "NotReady"
    if sp.get("unschedulable"):
        status += ",SchedulingDisabled"
    roles = sorted(k.split("/", 1)[1] for k in (md.get("labels") or {}) if k.startswith("node-role.kubernetes.io/"))
    info = st.get("nodeInfo") or {}
    addrs = {a.get("type"): a.get("address") for a in st.get("addresses") or []}
    return [md.get("name", ""), status, ",".join(roles) or "<none>", age_of(md.get("creationTimestamp")),
            info.get("kubeletVersion", ""), _none(addrs.get("InternalIP")), _none(addrs.get("ExternalIP")),
            info.get("osImage", ""), info.get("kernelVersion", ""), info.get("containerRuntimeVersion", "")]


def ns_row(d):
    md = d.get("metadata", {})
    return [md.get("name", ""), (d.get("status") or {}).get("phase", ""), age_of(md.get("creationTimestamp"))]


def cm_row(d):
    md = d.get("metadata", {})
    return [md.get("name", ""), len(d.get("data") or {}) + len(d.get("binaryData") or {}),
            age_of(md.get("creationTimestamp"))]


def secret_row(d):
    md = d.get("metadata", {})
    return [md.get("name", ""), d.get("type", ""), len(d.get("data") or {}), age_of(md.get("creationTimestamp"))]


def svc_row(d):
    md, sp = d.get("metadata", {}), d.get("spec", {})
    ports = ",".join("%s/%s" % (p.get("port"), p.get("protocol", "TCP")) for p in sp.get("ports") or []) or "<none>"
    sel = ",".join("%s=%s" % kv for kv in sorted((sp.get("selector") or {}).items())) or "<none>"
    return [md.get("name", ""), sp.get("type", "ClusterIP"), _none(sp.get("clusterIP")), "<none>", ports,
            age_of(md.get("creationTimestamp")), sel]


def ep_row(d):
    md = d.get("metadata", {})
    eps = []
    for ss in d.get("subsets") or []:
        for a in ss.get("addresses") or []:
            for p in ss.get("ports") or [{}]:
                eps.append("%s:%s" % (a.get("ip"), p.get("port")) if p else a.get("ip"))
    return [md.get("name", ""), ",".join(eps[:3]) + (" + %d more..." % (len(eps) - 3) if len(eps) > 3 else "") or "<none>",
            age_of(md.get("creationTimestamp"))]


def _containers(d):
    cs = ((((d.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers")) or []
    return ",".join(c.get("name", "") for c in cs), ",".join(c.get("image", "") for c in cs)


def _selector(d):
    ml = ((d.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return ",".join("%s=%s" % kv for kv in sorted(ml.items())) or "<none>"


def deploy_row(d):
    md, sp, st = d.get("metadata", {}), d.get("spec", {}), d.get("status", {})
    names, images = _containers(d)
    return [md.get("name", ""), "%d/%d" % (st.get("readyReplicas", 0), sp.get("replicas", 1)),
            st.get("updatedReplicas", 0), st.get("availableReplicas", 0), age_of(md.get("creationTimestamp")),
            names, images, _selector(d)]


def rs_row(d):
    md, sp, st = d.get("metadata", {}), d.get("spec", {}), d.get("status", {})
    names, images = _containers(d)
    return [md.get("name", ""), sp.get("replicas", 1), st.get("replicas", 0), st.get("readyReplicas", 0),
            age_of(md.get("creationTimestamp")), names, images, _selector(d)]


def ds_row(d):
    md, st = d.get("metadata", {}), d.get("status", {})
    names, images = _containers(d)
    return [md.get("name", ""), st.get("desiredNumberScheduled", 0), st.get("currentNumberScheduled", 0),
            st.get("numberReady", 0), st.get("updatedNumberScheduled", 0), st.get("numberAvailable", 0), "<none>",
            age_of(md.get("creationTimestamp")), names, images, _selector(d)]


def sts_row(d):
    md, sp, st = d.get("metadata", {}), d.get("spec", {}), d.get("status", {})
    names, images = _containers(d)
    return [md.get("name", ""), "%d/%d" % (st.get("readyReplicas", 0), sp.get("replicas", 1)),
            age_of(md.get("creationTimestamp")), names, images]


def default_row(d):
    md = d.get("metadata", {})
    return [md.get("name", ""), age_of(md.get("creationTimestamp"))]


TABLES = {
    "pods": ([NAME_COL, col("Ready", "The aggregate readiness state of this pod for accepting traffic."),
              col("Status", "The aggregate status of the containers in this pod."),
              col("Restarts", "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted."),
              AGE_COL, col("IP", "podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.", 1),
              col("Node", "NodeName indicates in which node this pod is scheduled.", 1),
              col("Nominated Node", "nominatedNodeName is set only when this pod preempts other pods on the node.", 1),
              col("Readiness Gates", "If specified, all readiness gates will be evaluated for pod readiness.", 1)], pod_row),
    "nodes": ([NAME_COL, col("Status", "The status of the node"), col("Roles", "The roles of the node"), AGE_COL,
               col("Version", "Kubelet Version reported by the node."),
               col("Internal-IP", "List of addresses reachable to the node. Queried from cloud provider, if available.", 1),
               col("External-IP", "List of addresses reachable to the node. Queried from cloud provider, if available.", 1),
               col("OS-Image", "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).", 1),
               col("Kernel-Version", "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).", 1),
               col("Container-Runtime", "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).", 1)], node_row),
    "namespaces": ([NAME_COL, col("Status", "The status of the namespace"), AGE_COL], ns_row),
    "configmaps": ([NAME_COL, col("Data", "Data contains the configuration data.", typ="integer"), AGE_COL], cm_row),
    "secrets": ([NAME_COL, col("Type", "The type of secret"), col("Data", "Data contains the secret data.", typ="integer"), AGE_COL], secret_row),
    "services": ([NAME_COL, col("Type", "type determines how the Service is exposed."),
                  col("Cluster-IP", "clusterIP is the IP address of the service."),
                  col("External-IP", "List of IP addresses for which nodes in the cluster will also accept traffic for this service."),
                  col("Port(s)", "The list of ports that are exposed by this service."), AGE_COL,
                  col("Selector", "Route service traffic to pods with label keys and values matching this selector.", 1)], svc_row),
    "endpoints": ([NAME_COL, col("Endpoints", "Endpoints of the resource"), AGE_COL], ep_row),
    "deployments": ([NAME_COL, col("Ready", "Number of the pod with ready state"),
                     col("Up-to-date", "Total number of non-terminated pods targeted by this deployment that have the desired template spec.", typ="integer"),
                     col("Available", "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.", typ="integer"),
                     AGE_COL, col("Containers", "Names of each container in the template.", 1),
                     col("Images", "Images referenced by each container in the template.", 1),
                     col("Selector", "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment.", 1)], deploy_row),
    "replicasets": ([NAME_COL, col("Desired", "Replicas is the number of desired replicas.", typ="integer"),
                     col("Current", "Replicas is the most recently observed number of replicas.", typ="integer"),
                     col("Ready", "The number of ready replicas for this replica set.", typ="integer"), AGE_COL,
                     col("Containers", "Names of each container in the template.", 1),
                     col("Images", "Images referenced by each container in the template.", 1),
                     col("Selector", "Selector is a label query over pods that should match the replica count.", 1)], rs_row),
    "daemonsets": ([NAME_COL, col("Desired", "The total number of nodes that should be running the daemon pod.", typ="integer"),
                    col("Current", "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod.", typ="integer"),
                    col("Ready", "numberReady is the number of nodes that should be running the daemon pod and have one or more of the daemon pod running and ready.", typ="integer"),
                    col("Up-to-date", "The total number of nodes that are running updated daemon pod", typ="integer"),
                    col("Available", "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available.", typ="integer"),
                    col("Node Selector", "NodeSelector is a selector which must be true for the pod to fit on a node."), AGE_COL,
                    col("Containers", "Names of each container in the template.", 1),
                    col("Images", "Images referenced by each container in the template.", 1),
                    col("Selector", "A label query over pods that are managed by the daemon set.", 1)], ds_row),
    "statefulsets": ([NAME_COL, col("Ready", "Number of the pod with ready state"), AGE_COL,
                      col("Containers", "Names of each container in the template.", 1),
                      col("Images", "Images referenced by each container in the template.", 1)], sts_row),
}
DEFAULT_TABLE = ([NAME_COL, AGE_COL], default_row)


# ---------------------------------------------------------------------------
# Kubernetes protobuf (application/vnd.kubernetes.protobuf), apisim's own encoder
# ---------------------------------------------------------------------------
#
# What kube-apiserver's gogo-generated marshallers (k8s.io/api/*/generated.pb.go,
# MarshalToSizedBuffer) write: fields in ascending field-number order; every
# non-pointer field always (strings as tag + length 0, numbers and bools as varint
# 0, embedded non-pointer messages always); pointer fields only when set; map
# fields as one {1 key, 2 value} entry per key, keys sorted; repeated fields one
# entry per element (proto2: varints unpacked).  metav1.Time is Timestamp{1
# seconds, 2 nanos} with nanos always 0 and an empty message for the zero time
# (apimachinery meta/v1/time_proto.go); resource.Quantity is {1 string} with its
# canonical string (api/resource/quantity_proto.go, here: the JSON string as
# stored); intstr.IntOrString is {1 type, 2 intVal, 3 strVal}, all written.
#
# The schema: "Message: N jsonName KIND[:Sub][@minor], ..." with the field numbers of
# staging/src/k8s.io/api/{core,apps,autoscaling}/v1/generated.proto and
# apimachinery/pkg/apis/meta/v1/generated.proto; KIND says how the Go field is
# declared (the .proto cannot: proto2 makes everything optional):
#   S string     I int32/int64   B bool   T metav1.Time   Q resource.Quantity
#   IOS intstr.IntOrString   M message (non-pointer: always written)
#   IN an embedded struct inlined in JSON (`json:",inline"`, e.g. Volume.VolumeSource)
#   a trailing "?" = a Go pointer (written only when the JSON value is present, not null)
#   RS / RI / RM repeated string / varint / message
#   MSS / MSB / MSQ map<string,string> / map<string,bytes> (base64 in JSON) / map<string,Quantity>
#   F? *metav1.FieldsV1 ({1 Raw}: the field's compact JSON)
#   @N: the field exists since 1.N (non-pointer fields added later change the bytes)
# A JSON field the schema does not name is not encoded (README: "Protobuf").

PB_SCHEMA = """
ListMeta: 1 selfLink S, 2 resourceVersion S, 3 continue S, 4 remainingItemCount I?
ObjectMeta: 1 name S, 2 generateName S, 3 namespace S, 4 selfLink S, 5 uid S, 6 resourceVersion S,
  7 generation I, 8 creationTimestamp T, 9 deletionTimestamp T?, 10 deletionGracePeriodSeconds I?,
  11 labels MSS, 12 annotations MSS, 13 ownerReferences RM:OwnerReference, 14 finalizers RS,
  17 managedFields RM:ManagedFieldsEntry
OwnerReference: 1 kind S, 3 name S, 4 uid S, 5 apiVersion S, 6 controller B?, 7 blockOwnerDeletion B?
ManagedFieldsEntry: 1 manager S, 2 operation S, 3 apiVersion S, 4 time T?, 6 fieldsType S, 7 fieldsV1 F?,
  8 subresource S
LabelSelector: 1 matchLabels MSS, 2 matchExpressions RM:LabelSelectorRequirement
LabelSelectorRequirement: 1 key S, 2 operator S, 3 values RS
Condition: 1 type S, 2 status S, 3 observedGeneration I, 4 lastTransitionTime T, 5 reason S, 6 message S
Status: 1 metadata M:ListMeta, 2 status S, 3 message S, 4 reason S, 5 details M?:StatusDetails, 6 code I
StatusDetails: 1 name S, 2 group S, 3 kind S, 4 causes RM:StatusCause, 5 retryAfterSeconds I, 6 uid S
StatusCause: 1 reason S, 2 message S, 3 field S
PartialObjectMetadata: 1 metadata M:ObjectMeta

Pod: 1 metadata M:ObjectMeta, 2 spec M:PodSpec, 3 status M:PodStatus
PodTemplateSpec: 1 metadata M:ObjectMeta, 2 spec M:PodSpec
PodSpec: 1 volumes RM:Volume, 2 containers RM:Container, 3 restartPolicy S, 4 terminationGracePeriodSeconds I?,
  5 activeDeadlineSeconds I?, 6 dnsPolicy S, 7 nodeSelector MSS, 8 serviceAccountName S, 9 serviceAccount S,
  10 nodeName S, 11 hostNetwork B, 12 hostPID B, 13 hostIPC B, 14 securityContext M?:PodSecurityContext,
  15 imagePullSecrets RM:LocalObjectReference, 16 hostname S, 17 subdomain S, 18 affinity M?:Affinity,
  19 schedulerName S, 20 initContainers RM:Container, 21 automountServiceAccountToken B?,
  22 tolerations RM:Toleration, 23 hostAliases RM:HostAlias, 24 priorityClassName S, 25 priority I?,
  26 dnsConfig M?:PodDNSConfig, 27 shareProcessNamespace B?, 28 readinessGates RM:PodReadinessGate,
  29 runtimeClassName S?, 30 enableServiceLinks B?, 31 preemptionPolicy S?, 32 overhead MSQ,
  33 topologySpreadConstraints RM:TopologySpreadConstraint, 35 setHostnameAsFQDN B?, 36 os M?:PodOS,
  37 hostUsers B?, 38 schedulingGates RM:PodSchedulingGate, 40 resources M?:ResourceRequirements
Volume: 1 name S, 2 volumeSource IN:VolumeSource
VolumeSource: 1 hostPath M?:HostPathVolumeSource, 2 emptyDir M?:EmptyDirVolumeSource, 6 secret M?:SecretVolumeSource,
  10 persistentVolumeClaim M?:PersistentVolumeClaimVolumeSource, 16 downwardAPI M?:DownwardAPIVolumeSource,
  19 configMap M?:ConfigMapVolumeSource, 26 projected M?:ProjectedVolumeSource
HostPathVolumeSource: 1 path S, 2 type S?
EmptyDirVolumeSource: 1 medium S, 2 sizeLimit Q?
SecretVolumeSource: 1 secretName S, 2 items RM:KeyToPath, 3 defaultMode I?, 4 optional B?
PersistentVolumeClaimVolumeSource: 1 claimName S, 2 readOnly B
DownwardAPIVolumeSource: 1 items RM:DownwardAPIVolumeFile, 2 defaultMode I?
ConfigMapVolumeSource: 1 localObjectReference IN:LocalObjectReference, 2 items RM:KeyToPath, 3 defaultMode I?,
  4 optional B?
ProjectedVolumeSource: 1 sources RM:VolumeProjection, 2 defaultMode I?
VolumeProjection: 1 secret M?:SecretProjection, 2 downwardAPI M?:DownwardAPIProjection,
  3 configMap M?:ConfigMapProjection, 4 serviceAccountToken M?:ServiceAccountTokenProjection
SecretProjection: 1 localObjectReference IN:LocalObjectReference, 2 items RM:KeyToPath, 4 optional B?
ConfigMapProjection: 1 localObjectReference IN:LocalObjectReference, 2 items RM:KeyToPath, 4 optional B?
DownwardAPIProjection: 1 items RM:DownwardAPIVolumeFile
DownwardAPIVolumeFile: 1 path S, 2 fieldRef M?:ObjectFieldSelector, 3 resourceFieldRef M?:ResourceFieldSelector,
  4 mode I?
ServiceAccountTokenProjection: 1 audience S, 2 expirationSeconds I?, 3 path S
KeyToPath: 1 key S, 2 path S, 3 mode I?
LocalObjectReference: 1 name S
ObjectFieldSelector: 1 apiVersion S, 2 fieldPath S
ResourceFieldSelector: 1 containerName S, 2 resource S, 3 divisor Q
Container: 1 name S, 2 image S, 3 command RS, 4 args RS, 5 workingDir S, 6 ports RM:ContainerPort,
  7 env RM:EnvVar, 8 resources M:ResourceRequirements, 9 volumeMounts RM:VolumeMount, 10 livenessProbe M?:Probe,
  11 readinessProbe M?:Probe, 12 lifecycle M?:Lifecycle, 13 terminationMessagePath S, 14 imagePullPolicy S,
  15 securityContext M?:SecurityContext, 16 stdin B, 17 stdinOnce B, 18 tty B, 19 envFrom RM:EnvFromSource,
  20 terminationMessagePolicy S, 21 volumeDevices RM:VolumeDevice, 22 startupProbe M?:Probe,
  23 resizePolicy RM:ContainerResizePolicy, 24 restartPolicy S?
ContainerPort: 1 name S, 2 hostPort I, 3 containerPort I, 4 protocol S, 5 hostIP S
EnvVar: 1 name S, 2 value S, 3 valueFrom M?:EnvVarSource
EnvVarSource: 1 fieldRef M?:ObjectFieldSelector, 2 resourceFieldRef M?:ResourceFieldSelector,
  3 configMapKeyRef M?:ConfigMapKeySelector, 4 secretKeyRef M?:SecretKeySelector
ConfigMapKeySelector: 1 localObjectReference IN:LocalObjectReference, 2 key S, 3 optional B?
SecretKeySelector: 1 localObjectReference IN:LocalObjectReference, 2 key S, 3 optional B?
EnvFromSource: 1 prefix S, 2 configMapRef M?:ConfigMapEnvSource, 3 secretRef M?:SecretEnvSource
ConfigMapEnvSource: 1 localObjectReference IN:LocalObjectReference, 2 optional B?
SecretEnvSource: 1 localObjectReference IN:LocalObjectReference, 2 optional B?
ResourceRequirements: 1 limits MSQ, 2 requests MSQ, 3 claims RM:ResourceClaim
ResourceClaim: 1 name S, 2 request S@31
VolumeMount: 1 name S, 2 readOnly B, 3 mountPath S, 4 subPath S, 5 mountPropagation S?, 6 subPathExpr S,
  7 recursiveReadOnly S?
VolumeDevice: 1 name S, 2 devicePath S
ContainerResizePolicy: 1 resourceName S, 2 restartPolicy S
Probe: 1 handler IN:ProbeHandler, 2 initialDelaySeconds I, 3 timeoutSeconds I, 4 periodSeconds I,
  5 successThreshold I, 6 failureThreshold I, 7 terminationGracePeriodSeconds I?
ProbeHandler: 1 exec M?:ExecAction, 2 httpGet M?:HTTPGetAction, 3 tcpSocket M?:TCPSocketAction,
  4 grpc M?:GRPCAction
ExecAction: 1 command RS
HTTPGetAction: 1 path S, 2 port IOS, 3 host S, 4 scheme S, 5 httpHeaders RM:HTTPHeader
HTTPHeader: 1 name S, 2 value S
TCPSocketAction: 1 port IOS, 2 host S
GRPCAction: 1 port I, 2 service S?
Lifecycle: 1 postStart M?:LifecycleHandler, 2 preStop M?:LifecycleHandler, 3 stopSignal S?
LifecycleHandler: 1 exec M?:ExecAction, 2 httpGet M?:HTTPGetAction, 3 tcpSocket M?:TCPSocketAction,
  4 sleep M?:SleepAction
SleepAction: 1 seconds I
SecurityContext: 1 capabilities M?:Capabilities, 2 privileged B?, 3 seLinuxOptions M?:SELinuxOptions,
  4 runAsUser I?, 5 runAsNonRoot B?, 6 readOnlyRootFilesystem B?, 7 allowPrivilegeEscalation B?,
  8 runAsGroup I?, 9 procMount S?, 11 seccompProfile M?:SeccompProfile, 12 appArmorProfile M?:AppArmorProfile
Capabilities: 1 add RS, 2 drop RS
SELinuxOptions: 1 user S, 2 role S, 3 type S, 4 level S
SeccompProfile: 1 type S, 2 localhostProfile S?
AppArmorProfile: 1 type S, 2 localhostProfile S?
PodSecurityContext: 1 seLinuxOptions M?:SELinuxOptions, 2 runAsUser I?, 3 runAsNonRoot B?,
  4 supplementalGroups RI, 5 fsGroup I?, 6 runAsGroup I?, 7 sysctls RM:Sysctl, 9 fsGroupChangePolicy S?,
  10 seccompProfile M?:SeccompProfile, 11 appArmorProfile M?:AppArmorProfile, 12 supplementalGroupsPolicy S?,
  13 seLinuxChangePolicy S?
Sysctl: 1 name S, 2 value S
Toleration: 1 key S, 2 operator S, 3 value S, 4 effect S, 5 tolerationSeconds I?
HostAlias: 1 ip S, 2 hostnames RS
PodReadinessGate: 1 conditionType S
PodOS: 1 name S
PodSchedulingGate: 1 name S
PodDNSConfig: 1 nameservers RS, 2 searches RS, 3 options RM:PodDNSConfigOption
PodDNSConfigOption: 1 name S, 2 value S?
Affinity: 1 nodeAffinity M?:NodeAffinity, 2 podAffinity M?:PodAffinity, 3 podAntiAffinity M?:PodAffinity
NodeAffinity: 1 requiredDuringSchedulingIgnoredDuringExecution M?:NodeSelector,
  2 preferredDuringSchedulingIgnoredDuringExecution RM:PreferredSchedulingTerm
NodeSelector: 1 nodeSelectorTerms RM:NodeSelectorTerm
NodeSelectorTerm: 1 matchExpressions RM:NodeSelectorRequirement, 2 matchFields RM:NodeSelectorRequirement
NodeSelectorRequirement: 1 key S, 2 operator S, 3 values RS
PreferredSchedulingTerm: 1 weight I, 2 preference M:NodeSelectorTerm
PodAffinity: 1 requiredDuringSchedulingIgnoredDuringExecution RM:PodAffinityTerm,
  2 preferredDuringSchedulingIgnoredDuringExecution RM:WeightedPodAffinityTerm
PodAffinityTerm: 1 labelSelector M?:LabelSelector, 2 namespaces RS, 3 topologyKey S,
  4 namespaceSelector M?:LabelSelector, 5 matchLabelKeys RS, 6 mismatchLabelKeys RS
WeightedPodAffinityTerm: 1 weight I, 2 podAffinityTerm M:PodAffinityTerm
TopologySpreadConstraint: 1 maxSkew I, 2 topologyKey S, 3 whenUnsatisfiable S, 4 labelSelector M?:LabelSelector,
  5 minDomains I?, 6 nodeAffinityPolicy S?, 7 nodeTaintsPolicy S?, 8 matchLabelKeys RS
PodStatus: 1 phase S, 2 conditions RM:PodCondition, 3 message S, 4 reason S, 5 hostIP S, 6 podIP S,
  7 startTime T?, 8 containerStatuses RM:ContainerStatus, 9 qosClass S, 10 initContainerStatuses RM:ContainerStatus,
  11 nominatedNodeName S, 12 podIPs RM:PodIP, 13 ephemeralContainerStatuses RM:ContainerStatus, 14 resize S,
  16 hostIPs RM:HostIP, 17 observedGeneration I@33
PodCondition: 1 type S, 2 status S, 3 lastProbeTime T, 4 lastTransitionTime T, 5 reason S, 6 message S,
  7 observedGeneration I@33
PodIP: 1 ip S
HostIP: 1 ip S
ContainerStatus: 1 name S, 2 state M:ContainerState, 3 lastState M:ContainerState, 4 ready B, 5 restartCount I,
  6 image S, 7 imageID S, 8 containerID S, 9 started B?, 10 allocatedResources MSQ,
  11 resources M?:ResourceRequirements, 12 volumeMounts RM:VolumeMountStatus, 15 stopSignal S?
VolumeMountStatus: 1 name S, 2 mountPath S, 3 readOnly B, 4 recursiveReadOnly S?
ContainerState: 1 waiting M?:ContainerStateWaiting, 2 running M?:ContainerStateRunning,
  3 terminated M?:ContainerStateTerminated
ContainerStateWaiting: 1 reason S, 2 message S
ContainerStateRunning: 1 startedAt T
ContainerStateTerminated: 1 exitCode I, 2 signal I, 3 reason S, 4 message S, 5 startedAt T, 6 finishedAt T,
  7 containerID S

Node: 1 metadata M:ObjectMeta, 2 spec M:NodeSpec, 3 status M:NodeStatus
NodeSpec: 1 podCIDR S, 2 externalID S, 3 providerID S, 4 unschedulable B, 5 taints RM:Taint, 7 podCIDRs RS
Taint: 1 key S, 2 value S, 3 effect S, 4 timeAdded T?
NodeStatus: 1 capacity MSQ, 2 allocatable MSQ, 3 phase S, 4 conditions RM:NodeCondition,
  5 addresses RM:NodeAddress, 6 daemonEndpoints M:NodeDaemonEndpoints, 7 nodeInfo M:NodeSystemInfo,
  8 images RM:ContainerImage, 9 volumesInUse RS, 10 volumesAttached RM:AttachedVolume
NodeCondition: 1 type S, 2 status S, 3 lastHeartbeatTime T, 4 lastTransitionTime T, 5 reason S, 6 message S
NodeAddress: 1 type S, 2 address S
NodeDaemonEndpoints: 1 kubeletEndpoint M:DaemonEndpoint
DaemonEndpoint: 1 Port I
NodeSystemInfo: 1 machineID S, 2 systemUUID S, 3 bootID S, 4 kernelVersion S, 5 osImage S,
  6 containerRuntimeVersion S, 7 kubeletVersion S, 8 kubeProxyVersion S, 9 operatingSystem S, 10 architecture S
ContainerImage: 1 names RS, 2 sizeBytes I
AttachedVolume: 1 name S, 2 devicePath S

Namespace: 1 metadata M:ObjectMeta, 2 spec M:NamespaceSpec, 3 status M:NamespaceStatus
NamespaceSpec: 1 finalizers RS
NamespaceStatus: 1 phase S, 2 conditions RM:NamespaceCondition
NamespaceCondition: 1 type S, 2 status S, 4 lastTransitionTime T, 5 reason S, 6 message S

ConfigMap: 1 metadata M:ObjectMeta, 2 data MSS, 3 binaryData MSB, 4 immutable B?
Secret: 1 metadata M:ObjectMeta, 2 data MSB, 3 type S, 4 stringData MSS, 5 immutable B?

Service: 1 metadata M:ObjectMeta, 2 spec M:ServiceSpec, 3 status M:ServiceStatus
ServiceSpec: 1 ports RM:ServicePort, 2 selector MSS, 3 clusterIP S, 4 type S, 5 externalIPs RS,
  7 sessionAffinity S, 8 loadBalancerIP S, 9 loadBalancerSourceRanges RS, 10 externalName S,
  11 externalTrafficPolicy S, 12 healthCheckNodePort I, 13 publishNotReadyAddresses B,
  14 sessionAffinityConfig M?:SessionAffinityConfig, 17 ipFamilyPolicy S?, 18 clusterIPs RS, 19 ipFamilies RS,
  20 allocateLoadBalancerNodePorts B?, 21 loadBalancerClass S?, 22 internalTrafficPolicy S?,
  23 trafficDistribution S?
ServicePort: 1 name S, 2 protocol S, 3 port I, 4 targetPort IOS, 5 nodePort I, 6 appProtocol S?
SessionAffinityConfig: 1 clientIP M?:ClientIPConfig
ClientIPConfig: 1 timeoutSeconds I?
ServiceStatus: 1 loadBalancer M:LoadBalancerStatus, 2 conditions RM:Condition
LoadBalancerStatus: 1 ingress RM:LoadBalancerIngress
LoadBalancerIngress: 1 ip S, 2 hostname S, 3 ipMode S?, 4 ports RM:PortStatus
PortStatus: 1 port I, 2 protocol S, 3 error S?

Endpoints: 1 metadata M:ObjectMeta, 2 subsets RM:EndpointSubset
EndpointSubset: 1 addresses RM:EndpointAddress, 2 notReadyAddresses RM:EndpointAddress, 3 ports RM:EndpointPort
EndpointAddress: 1 ip S, 2 targetRef M?:ObjectReference, 3 hostname S, 4 nodeName S?
EndpointPort: 1 name S, 2 port I, 3 protocol S, 4 appProtocol S?
ObjectReference: 1 kind S, 2 namespace S, 3 name S, 4 uid S, 5 apiVersion S, 6 resourceVersion S, 7 fieldPath S

Deployment: 1 metadata M:ObjectMeta, 2 spec M:DeploymentSpec, 3 status M:DeploymentStatus
DeploymentSpec: 1 replicas I?, 2 selector M?:LabelSelector, 3 template M:PodTemplateSpec,
  4 strategy M:DeploymentStrategy, 5 minReadySeconds I, 6 revisionHistoryLimit I?, 7 paused B,
  9 progressDeadlineSeconds I?
DeploymentStrategy: 1 type S, 2 rollingUpdate M?:RollingUpdateDeployment
RollingUpdateDeployment: 1 maxUnavailable IOS?, 2 maxSurge IOS?
DeploymentStatus: 1 observedGeneration I, 2 replicas I, 3 updatedReplicas I, 4 availableReplicas I,
  5 unavailableReplicas I, 6 conditions RM:DeploymentCondition, 7 readyReplicas I, 8 collisionCount I?,
  9 terminatingReplicas I?
DeploymentCondition: 1 type S, 2 status S, 4 reason S, 5 message S, 6 lastUpdateTime T, 7 lastTransitionTime T
ReplicaSet: 1 metadata M:ObjectMeta, 2 spec M:ReplicaSetSpec, 3 status M:ReplicaSetStatus
ReplicaSetSpec: 1 replicas I?, 2 selector M?:LabelSelector, 3 template M:PodTemplateSpec, 4 minReadySeconds I
ReplicaSetStatus: 1 replicas I, 2 fullyLabeledReplicas I, 3 observedGeneration I, 4 readyReplicas I,
  5 availableReplicas I, 6 conditions RM:AppsCondition, 7 terminatingReplicas I?
AppsCondition: 1 type S, 2 status S, 3 lastTransitionTime T, 4 reason S, 5 message S
DaemonSet: 1 metadata M:ObjectMeta, 2 spec M:DaemonSetSpec, 3 status M:DaemonSetStatus
DaemonSetSpec: 1 selector M?:LabelSelector, 2 template M:PodTemplateSpec, 3 updateStrategy M:DaemonSetUpdateStrategy,
  4 minReadySeconds I, 6 revisionHistoryLimit I?
DaemonSetUpdateStrategy: 1 type S, 2 rollingUpdate M?:RollingUpdateDaemonSet
RollingUpdateDaemonSet: 1 maxUnavailable IOS?, 2 maxSurge IOS?
DaemonSetStatus: 1 currentNumberScheduled I, 2 numberMisscheduled I, 3 desiredNumberScheduled I, 4 numberReady I,
  5 observedGeneration I, 6 updatedNumberScheduled I, 7 numberAvailable I, 8 numberUnavailable I,
  9 collisionCount I?, 10 conditions RM:AppsCondition
StatefulSet: 1 metadata M:ObjectMeta, 2 spec M:StatefulSetSpec, 3 status M:StatefulSetStatus
StatefulSetSpec: 1 replicas I?, 2 selector M?:LabelSelector, 3 template M:PodTemplateSpec, 5 serviceName S,
  6 podManagementPolicy S, 7 updateStrategy M:StatefulSetUpdateStrategy, 8 revisionHistoryLimit I?,
  9 minReadySeconds I, 10 persistentVolumeClaimRetentionPolicy M?:StatefulSetPersistentVolumeClaimRetentionPolicy,
  11 ordinals M?:StatefulSetOrdinals
StatefulSetUpdateStrategy: 1 type S, 2 rollingUpdate M?:RollingUpdateStatefulSetStrategy
RollingUpdateStatefulSetStrategy: 1 partition I?, 2 maxUnavailable IOS?
StatefulSetPersistentVolumeClaimRetentionPolicy: 1 whenDeleted S, 2 whenScaled S
StatefulSetOrdinals: 1 start I
StatefulSetStatus: 1 observedGeneration I, 2 replicas I, 3 readyReplicas I, 4 currentReplicas I,
  5 updatedReplicas I, 6 currentRevision S, 7 updateRevision S, 9 collisionCount I?,
  10 conditions RM:AppsCondition, 11 availableReplicas I

Scale: 1 metadata M:ObjectMeta, 2 spec M:ScaleSpec, 3 status M:ScaleStatus
ScaleSpec: 1 replicas I
ScaleStatus: 1 replicas I, 2 selector S
"""

PB_CT = b"application/vnd.kubernetes.protobuf"
PB_WATCH_CT = b"application/vnd.kubernetes.protobuf;stream=watch"
PB_MAGIC = b"k8s\x00"   # runtime/serializer/protobuf/protobuf.go protoEncodingPrefix

_VARINT = [bytes([n]) if n < 0x80 else bytes([(n & 0x7f) | 0x80, n >> 7]) for n in range(1 << 14)]


def pb_varint(n):
    if 0 <= n < 16384:
        return _VARINT[n]
    if n < 0:
        n += 1 << 64   # int32/int64 negatives: sign-extended to 64 bits, 10 bytes
    out = bytearray()
    while n > 0x7f:
        out.append((n & 0x7f) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def pb_bytes(tag, b):
    """A length-delimited field: tag byte(s), length, payload."""
    n = len(b)
    return tag + (_VARINT[n] if n < 16384 else pb_varint(n)) + b


def pb_tag(num, wire):
    return pb_varint((num << 3) | wire)


def _pb_int(v):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    try:
        return int(float(v)) if isinstance(v, (float, str)) else 0
    except (ValueError, OverflowError):
        return 0


def _pb_str(v):
    if isinstance(v, str):
        return _utf8(v)
    if v is None:
        return b""
    if isinstance(v, bool):
        return b"true" if v else b"false"
    return str(v).encode()


_TIME_CACHE = {}


def pb_time_seconds(s):
    """Unix seconds of an RFC 3339 time (metav1.Time keeps whole seconds)."""
    r = _TIME_CACHE.get(s)
    if r is None:
        try:
            t = s.strip()
            if t.endswith("Z") or t.endswith("z"):
                t = t[:-1] + "+00:00"
            dt = datetime.datetime.fromisoformat(t)
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=datetime.timezone.utc)
            r = math.floor(dt.timestamp())
        except (ValueError, AttributeError, TypeError):
            r = None
        if len(_TIME_CACHE) > 100000:
            _TIME_CACHE.clear()
        _TIME_CACHE[s] = r
    return r


def pb_time(v):
    """metav1.Time's message (time_proto.go): {1 seconds, 2 nanos 0}; the zero time
    (JSON null, absent or unparsable) is an empty message."""
    if not v or not isinstance(v, str):
        return b""
    secs = pb_time_seconds(v)
    if secs is None:
        return b""
    return b"\x08" + pb_varint(secs) + b"\x10\x00"


def pb_quantity(v):
    """resource.Quantity {1 string}: its canonical string; the zero Quantity is "0"."""
    if v is None or v == "":
        s = b"0"
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
        s = str(int(v) if float(v).is_integer() else v).encode()
    else:
        s = _pb_str(v)
    return pb_bytes(b"\x0a", s)


def pb_intorstr(v):
    """intstr.IntOrString {1 type, 2 intVal, 3 strVal}, every field written."""
    if isinstance(v, str):
        return b"\x08\x01\x10\x00" + pb_bytes(b"\x1a", _utf8(v))
    return b"\x08\x00\x10" + pb_varint(_pb_int(v)) + b"\x1a\x00"


class PbSchema:
    """The messages of PB_SCHEMA, compiled into per-message field lists."""

    KINDS = ("S", "S?", "I", "I?", "B", "B?", "T", "T?", "Q", "Q?", "IOS", "IOS?", "M", "M?", "IN",
             "RS", "RI", "RM", "MSS", "MSB", "MSQ", "F?")

    def __init__(self, text, minor):
        self.msgs = {}
        body = re.sub(r"\n[ \t]+", " ", text.strip())
        for line in body.split("\n"):
            line = line.strip()
            if not line:
                continue
            name, _, rest = line.partition(":")
            fields = []
            for f in rest.split(","):
                if not f.strip():
                    continue
                num, key, kind = f.split()
                since = 0
                if "@" in kind:
                    kind, _, s = kind.partition("@")
                    since = int(s)
                sub = None
                if ":" in kind:
                    kind, _, sub = kind.partition(":")
                if kind not in self.KINDS:
                    raise ValueError("PB_SCHEMA %s.%s: kind %s" % (name, key, kind))
                if since and minor < since:
                    continue
                num = int(num)
                wire = 0 if kind in ("I", "I?", "B", "B?", "RI") else 2
                fields.append((num, key, kind, sub, pb_tag(num, wire)))
            fields.sort()
            self.msgs[name.strip()] = fields
        for name, fields in self.msgs.items():
            for f in fields:
                if f[3] is not None and f[3] not in self.msgs:
                    raise ValueError("PB_SCHEMA %s.%s: no message %s" % (name, f[1], f[3]))

    def encode(self, name, d):
        """The message `name` for the JSON value d (a dict; None/absent = all zero)."""
        if not isinstance(d, dict):
            d = {}
        out = []
        app = out.append
        for _num, key, kind, sub, tag in self.msgs[name]:
            v = d.get(key)
            if kind == "S":
                app(pb_bytes(tag, _pb_str(v)))
            elif kind == "M":
                app(pb_bytes(tag, self.encode(sub, v)))
            elif kind == "I":
                app(tag + pb_varint(_pb_int(v)))
            elif kind == "B":
                app(tag + (b"\x01" if v else b"\x00"))
            elif kind == "T":
                app(pb_bytes(tag, pb_time(v)))
            elif kind == "IN":
                app(pb_bytes(tag, self.encode(sub, d)))
            elif kind == "Q":
                app(pb_bytes(tag, pb_quantity(v)))
            elif kind == "IOS":
                app(pb_bytes(tag, pb_intorstr(v)))
            elif v is None:
                continue
            elif kind == "RM":
                if isinstance(v, list):
                    for x in v:
                        app(pb_bytes(tag, self.encode(sub, x)))
            elif kind == "RS":
                if isinstance(v, list):
                    for x in v:
                        app(pb_bytes(tag, _pb_str(x)))
            elif kind == "MSS":
                if isinstance(v, dict):
                    for k in sorted(v):
                        app(pb_bytes(tag, pb_bytes(b"\x0a", _utf8(k)) + pb_bytes(b"\x12", _pb_str(v[k]))))
            elif kind == "S?":
                app(pb_bytes(tag, _pb_str(v)))
            elif kind == "M?":
                app(pb_bytes(tag, self.encode(sub, v)))
            elif kind == "I?":
                app(tag + pb_varint(_pb_int(v)))
            elif kind == "B?":
                app(tag + (b"\x01" if v else b"\x00"))
            elif kind == "T?":
                app(pb_bytes(tag, pb_time(v)))
            elif kind == "MSQ":
                if isinstance(v, dict):
                    for k in sorted(v):
                        app(pb_bytes(tag, pb_bytes(b"\x0a", _utf8(k)) + pb_bytes(b"\x12", pb_quantity(v[k]))))
            elif kind == "MSB":
                # map<string, bytes>: a JSON null value is a nil []byte, its value field left out
                if isinstance(v, dict):
                    for k in sorted(v):
                        e = pb_bytes(b"\x0a", _utf8(k))
                        if v[k] is not None:
                            try:
                                raw = base64.b64decode(v[k]) if isinstance(v[k], str) else b""
                            except ValueError:
                                raw = b""
                            e += pb_bytes(b"\x12", raw)
                        app(pb_bytes(tag, e))
            elif kind == "Q?":
                app(pb_bytes(tag, pb_quantity(v)))
            elif kind == "IOS?":
                app(pb_bytes(tag, pb_intorstr(v)))
            elif kind == "RI":
                if isinstance(v, list):
                    for x in v:
                        app(tag + pb_varint(_pb_int(x)))
            elif kind == "F?":
                app(pb_bytes(tag, pb_bytes(b"\x0a", dumpb_sorted(v))))
        return b"".join(out)


def _pb_s(tag, v):
    return pb_bytes(tag, _utf8(v) if isinstance(v, str) else b"")


def pb_object_meta(pm):
    """metav1.ObjectMeta's message, exactly as gogo's generated marshaller writes it
    (apimachinery/pkg/apis/meta/v1/generated.pb.go ObjectMeta.MarshalToSizedBuffer,
    fields written back to front there, so in ascending order on the wire), for pm the
    PartialObjectMetadata metadata of partial_meta() (meta.AsPartialObjectMetadata over
    the Unstructured accessors):
      1 name, 2 generateName, 3 namespace, 4 selfLink, 5 uid, 6 resourceVersion: strings,
        always written (tag + length, 0 when empty);
      7 generation: varint, always (0 too);
      8 creationTimestamp: metav1.Time, always; its message is Timestamp {1 seconds,
        2 nanos 0} (time_proto.go: whole seconds, nanos never set), empty for the zero time;
      9 deletionTimestamp: *Time, only when set; 10 deletionGracePeriodSeconds: *int64,
        only when set (a negative value is a 10-byte varint);
      11 labels, 12 annotations: map<string,string>, one entry {1 key, 2 value} per key in
        sorted key order (both always written), nothing for an empty map;
      13 ownerReferences: each {1 kind, 3 name, 4 uid, 5 apiVersion: always; 6 controller,
        7 blockOwnerDeletion: *bool, only when set};
      14 finalizers: one string per element;
      (15 clusterName: removed in 1.25, not written; 16 unused)
      17 managedFields (tag 0x8a 0x01): each {1 manager, 2 operation, 3 apiVersion: always;
        4 time: *Time, when the key is there (an empty message for a zero time);
        6 fieldsType: always; 7 fieldsV1: *FieldsV1 {1 raw: the JSON bytes as Go's
        json.Marshal writes the value}, only when not null; 8 subresource: always}."""
    out = [_pb_s(b"\x0a", pm.get("name")), _pb_s(b"\x12", pm.get("generateName")),
           _pb_s(b"\x1a", pm.get("namespace")), _pb_s(b"\x22", pm.get("selfLink")), _pb_s(b"\x2a", pm.get("uid")),
           _pb_s(b"\x32", pm.get("resourceVersion")), b"\x38" + pb_varint(_pb_int(pm.get("generation"))),
           pb_bytes(b"\x42", pb_time(pm.get("creationTimestamp")))]
    if pm.get("deletionTimestamp"):
        out.append(pb_bytes(b"\x4a", pb_time(pm["deletionTimestamp"])))
    if pm.get("deletionGracePeriodSeconds") is not None:
        out.append(b"\x50" + pb_varint(_pb_int(pm["deletionGracePeriodSeconds"])))
    for tag, k in ((b"\x5a", "labels"), (b"\x62", "annotations")):
        m = pm.get(k) or {}
        for kk in sorted(m):
            out.append(pb_bytes(tag, _pb_s(b"\x0a", kk) + _pb_s(b"\x12", m[kk])))
    for o in pm.get("ownerReferences") or []:
        r = _pb_s(b"\x0a", o.get("kind")) + _pb_s(b"\x1a", o.get("name")) + _pb_s(b"\x22", o.get("uid")) + \
            _pb_s(b"\x2a", o.get("apiVersion"))
        if o.get("controller") is not None:
            r += b"\x30" + (b"\x01" if o["controller"] else b"\x00")
        if o.get("blockOwnerDeletion") is not None:
            r += b"\x38" + (b"\x01" if o["blockOwnerDeletion"] else b"\x00")
        out.append(pb_bytes(b"\x6a", r))
    for f in pm.get("finalizers") or []:
        out.append(_pb_s(b"\x72", f))
    for e in pm.get("managedFields") or []:
        r = _pb_s(b"\x0a", e.get("manager")) + _pb_s(b"\x12", e.get("operation")) + _pb_s(b"\x1a", e.get("apiVersion"))
        if "time" in e:
            r += pb_bytes(b"\x22", pb_time(e["time"]))
        r += _pb_s(b"\x32", e.get("fieldsType"))
        if e.get("fieldsV1") is not None:
            r += pb_bytes(b"\x3a", pb_bytes(b"\x0a", dumpb_sorted(e["fieldsV1"])))
        r += _pb_s(b"\x42", e.get("subresource"))
        out.append(pb_bytes(b"\x8a\x01", r))
    return b"".join(out)


def pb_partial_meta(md):
    """PartialObjectMetadata {1 metadata} of a custom resource's metadata."""
    return pb_bytes(b"\x0a", pb_object_meta(partial_meta(md)))


def pb_typemeta(api_version, kind):
    """runtime.TypeMeta {1 apiVersion, 2 kind} (apimachinery/pkg/runtime/generated.proto)."""
    return pb_bytes(b"\x0a", api_version.encode()) + pb_bytes(b"\x12", kind.encode())


def pb_envelope_parts(typemeta, raw_len):
    """(head, tail) of the envelope around a raw message of raw_len bytes: the magic
    then runtime.Unknown {1 typeMeta, 2 raw, 3 contentEncoding "", 4 contentType ""}
    (runtime/types_proto.go NestedMarshalTo: every field written)."""
    return PB_MAGIC + pb_bytes(b"\x0a", typemeta) + b"\x12" + pb_varint(raw_len), b"\x1a\x00\x22\x00"


def pb_envelope(typemeta, raw):
    head, tail = pb_envelope_parts(typemeta, len(raw))
    return head + raw + tail


def pb_watch_event(etype, envelope):
    """One protobuf watch frame: a 4-byte big-endian length, then metav1.WatchEvent
    {1 type, 2 object RawExtension {1 raw = the object's envelope}}
    (runtime/serializer/protobuf RawSerializer + LengthDelimitedFramer)."""
    ev = pb_bytes(b"\x0a", etype.encode()) + pb_bytes(b"\x12", pb_bytes(b"\x0a", envelope))
    return struct.pack(">I", len(ev)) + ev


def storage_version_hash(group, version, kind):
    return base64.b64encode(hashlib.sha256(("%s/%s/%s" % (group, version, kind)).encode()).digest()[:8]).decode()


class RType:
    """A served resource type."""

    def __init__(self, plural, singular, kind, group, version, namespaced, short=(), categories=(),
                 subresources=(), fields=None, field_err="default", builder=None, returns_obj=False,
                 has_status=True, verbs=None, key=None, storage_version=None):
        self.plural, self.singular, self.kind = plural, singular, kind
        # the store's name in Cluster.stores and the /apisim controls: the plural, or
        # plural.group where two groups serve the same plural (events), or for a
        # custom resource version other than the first served one, plural.group/version
        self.key = key or plural
        self.crd = None         # the CRD's name, for a custom resource
        self.convert = None     # dict -> dict: an object of a linked store as this version has it
        self.mirrors = []       # the stores of the same objects in the other versions
        self.group, self.version, self.namespaced = group, version, namespaced
        self.short, self.categories, self.subresources = list(short), list(categories), subresources
        self.fields_fn = fields
        self.field_err = field_err
        self.builder = builder
        self.returns_obj = returns_obj
        self.has_status = has_status
        self.verbs = verbs or ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        self.api_version = version if not group else "%s/%s" % (group, version)
        self.list_kind = kind + "List"
        self.prefix = "/api/v1" if not group else "/apis/%s/%s" % (group, version)
        self.extra_fields = set()
        if fields:
            self.extra_fields = set(fields({}).keys())
        # Custom resources are unstructured in kube-apiserver (apiextensions-apiserver):
        # encoded from a map, keys sorted at every level, list items keep apiVersion/kind.
        self.unstructured = field_err == "cr"
        # A built-in object's encoding starts with its TypeMeta (kind, apiVersion: the
        # inline struct comes first); a list item is the same object with it left out.
        self.tm_prefix = b'{"kind":"%s","apiVersion":"%s",' % (kind.encode(), self.api_version.encode())
        self.table = TABLES.get(plural, DEFAULT_TABLE)
        # protobuf: built-in kinds only (custom resources have no protobuf form)
        self.pb_tm = pb_typemeta(self.api_version, kind)
        self.pb_list_tm = pb_typemeta(self.api_version, self.list_kind)
        # endpoints/discovery/storageversionhash.go StorageVersionHash(group, version, kind):
        # base64 of the first 8 bytes of sha256("group/version/kind") of the storage version
        self.storage_hash = storage_version_hash(group, storage_version or version, kind)

    def encode(self, d):
        """The stored (and GET / watch) encoding of an object dict, without newline."""
        if self.unstructured:
            d["apiVersion"], d["kind"] = self.api_version, self.kind
            return dumpb_sorted(d)
        d["kind"], d["apiVersion"] = self.kind, self.api_version
        return dumpb(canon(d))

    def list_frame(self, rv, cont=None, remaining=None):
        """(head, tail) of a list response around its items; tail ends with the newline
        of json.Encoder.Encode (serializer/json/json.go doEncode).

        Built-in: the typed XxxList struct, TypeMeta then ListMeta (resourceVersion,
        continue, remainingItemCount, all omitempty) then items.  Custom resources: an
        unstructured.UnstructuredList, encoded as the map of its Object plus "items"
        (unstructured.go UnstructuredJSONScheme.doEncode), keys sorted -- apiVersion,
        items, kind, metadata -- and metadata.continue always present, "" at the end:
        APIObjectVersioner.UpdateList calls SetContinue(nextKey) unconditionally and
        UnstructuredList.SetContinue sets even an empty string
        (apiserver/pkg/storage/etcd3, apimachinery unstructured_list.go)."""
        if self.unstructured:
            meta = b'"continue":"%s"' % (cont or "").encode()
            if remaining is not None:
                meta += b',"remainingItemCount":%d' % remaining
            meta += b',"resourceVersion":"%d"' % rv
            return (b'{"apiVersion":"%s","items":[' % self.api_version.encode(),
                    b'],"kind":"%s","metadata":{%s}}\n' % (self.list_kind.encode(), meta))
        meta = b'"resourceVersion":"%d"' % rv
        if cont:
            meta += b',"continue":"%s"' % cont.encode()
        if remaining is not None:
            meta += b',"remainingItemCount":%d' % remaining
        return (b'{"kind":"%s","apiVersion":"%s","metadata":{%s},"items":[' % (
            self.list_kind.encode(), self.api_version.encode(), meta), b"]}\n")

    def item_parts(self, items, lazy=False):
        """The items of a list as byte pieces (memoryviews, no copy) with their commas;
        lazy: a generator, 512 items at a time (a streamed list starts at once).

        Built-in types: items carry NO kind/apiVersion -- the list's TypeMeta is set, the
        items' is empty (kubernetes/kubernetes#3030, #63676: "The API server omits the
        kind and apiVersion attributes for items in collections").  Custom resources:
        items are unstructured maps and keep both."""
        if lazy:
            return (p for i in range(0, len(items), 512) for p in self._item_parts(items[i:i + 512], i > 0))
        return self._item_parts(items, False)

    def _item_parts(self, items, more):
        parts = []
        if self.unstructured:
            for x in items:
                if more:
                    parts.append(b",")
                more = True
                parts.append(x.data)
            return parts
        pre = self.tm_prefix
        n = len(pre)
        for x in items:
            d = x.data
            if d.startswith(pre):
                parts.append(b",{" if more else b"{")
                parts.append(memoryview(d)[n:])
            else:   # not in canonical form (never expected): strip by decoding
                dd = json.loads(d)
                dd.pop("kind", None)
                dd.pop("apiVersion", None)
                if more:
                    parts.append(b",")
                parts.append(dumpb(canon(dd)))
            more = True
        return parts

    def convert_field_label(self, label):
        """ConvertFieldLabel: pkg/apis/core/v1/conversion.go (pods, nodes, namespaces,
        secrets: "field label not supported: %s"), runtime.DefaultMetaV1FieldSelectorConversion
        (k8s.io/apimachinery/pkg/runtime/conversion.go) for the rest, and the CR converter
        (apiextensions-apiserver) for custom resources."""
        if self.plural == "pods" and label == "spec.host":
            return "spec.nodeName"
        if label == "metadata.name":
            return label
        if label == "metadata.namespace" and self.plural not in ("nodes", "namespaces") and \
                not (self.field_err == "cr" and not self.namespaced):
            return label
        if label in self.extra_fields:
            return label
        if self.field_err == "default":
            raise SelectorError('"%s" is not a known field selector: only "metadata.name", "metadata.namespace"' % label)
        raise SelectorError("field label not supported: %s" % label)

    def obj_from_dict(self, d, data, rv):
        md = d.get("metadata") or {}
        name = md.get("name", "")
        ns = md.get("namespace", "") if self.namespaced else ""
        key = "%s/%s" % (ns, name) if self.namespaced else name
        labels = md.get("labels") or {}
        fields = self.fields_fn(d) if self.fields_fn else None
        return Obj(key, ns, name, rv, labels, fields, data, md.get("uid", ""))


def make_types():
    core_status = lambda kind: {"status": (kind, ["get", "patch", "update"])}  # noqa: E731
    pod_sub = {"status": ("Pod", ["get", "patch", "update"]), "log": ("Pod", ["get"]),
               "exec": ("PodExecOptions", ["create", "get"]), "attach": ("PodAttachOptions", ["create", "get"]),
               "portforward": ("PodPortForwardOptions", ["create", "get"]),
               "binding": ("Binding", ["create"]), "eviction": ("Eviction", ["create"])}
    types = [
        RType("pods", "pod", "Pod", "", "v1", True, ["po"], ["all"], pod_sub, pod_fields, "strict", build_pod, True),
        RType("nodes", "node", "Node", "", "v1", False, ["no"], [], core_status("Node"), node_fields, "strict",
              build_node),
        RType("namespaces", "namespace", "Namespace", "", "v1", False, ["ns"], [],
              {"status": ("Namespace", ["get", "patch", "update"]), "finalize": ("Namespace", ["update"])},
              ns_fields, "strict", build_namespace, True,
              verbs=["create", "delete", "get", "list", "patch", "update", "watch"]),
        RType("configmaps", "configmap", "ConfigMap", "", "v1", True, ["cm"], [], {}, None, "default",
              build_configmap, has_status=False),
        RType("secrets", "secret", "Secret", "", "v1", True, [], [], {}, secret_fields, "strict", build_secret,
              has_status=False),
        RType("services", "service", "Service", "", "v1", True, ["svc"], ["all"], core_status("Service"), None,
              "default", build_service, True),
        RType("endpoints", "endpoints", "Endpoints", "", "v1", True, ["ep"], [], {}, None, "default",
              build_endpoints, has_status=False),
        RType("deployments", "deployment", "Deployment", "apps", "v1", True, ["deploy"], ["all"],
              {"status": ("Deployment", ["get", "patch", "update"]), "scale": ("Scale", ["get", "patch", "update"])},
              None, "default", build_deployment),
        RType("replicasets", "replicaset", "ReplicaSet", "apps", "v1", True, ["rs"], ["all"],
              {"status": ("ReplicaSet", ["get", "patch", "update"]), "scale": ("Scale", ["get", "patch", "update"])},
              rs_fields, "default", build_replicaset),
        RType("daemonsets", "daemonset", "DaemonSet", "apps", "v1", True, ["ds"], ["all"],
              core_status("DaemonSet"), None, "default", build_daemonset),
        RType("statefulsets", "statefulset", "StatefulSet", "apps", "v1", True, ["sts"], ["all"],
              {"status": ("StatefulSet", ["get", "patch", "update"]), "scale": ("Scale", ["get", "patch", "update"])},
              None, "default", build_statefulset),
        RType("widgets", "widget", "Widget", "example.com", "v1", True, ["wd"], [], core_status("Widget"), None,
              "cr", build_widget),
    ]
    for (plural, singular, kind, gv, namespaced, short, cats, subs, fields, ferr, key, storage) in GENERIC_TYPES:
        group, _, version = gv.rpartition("/")
        sub = {}
        for sname in subs:
            if sname == "status":
                sub["status"] = (kind, ["get", "patch", "update"])
            elif sname == "scale":
                sub["scale"] = ("Scale", ["get", "patch", "update"])
            elif sname == "approval":
                sub["approval"] = (kind, ["get", "patch", "update"])
            elif sname == "token":
                sub["token"] = ("TokenRequest", ["create"], "authentication.k8s.io", "v1")
        rt = RType(plural, singular, kind, group, version, namespaced, short, cats, sub, fields, ferr,
                   generic_builder, returns_obj=False, has_status="status" in subs, key=key,
                   storage_version=storage)
        rt.builder = functools.partial(generic_builder, rt)
        types.append(rt)
    return types


def event_fields(d):
    """pkg/apis/core/v1/conversion.go: the field selectors of core/v1 events."""
    io = d.get("involvedObject") or {}
    out = {"involvedObject.%s" % k: _s(io.get(k)) for k in ("kind", "namespace", "name", "uid", "apiVersion",
                                                             "resourceVersion", "fieldPath")}
    out.update({"reason": _s(d.get("reason")), "reportingComponent": _s(d.get("reportingComponent")),
                "source": _s((d.get("source") or {}).get("component")), "type": _s(d.get("type"))})
    return out


def events_v1_fields(d):
    """pkg/apis/events/v1/conversion.go: the field selectors of events.k8s.io/v1 events
    (the labels of the core Event they map to, read from the events.k8s.io form)."""
    rg = d.get("regarding") or {}
    out = {"regarding.%s" % k: _s(rg.get(k)) for k in ("kind", "namespace", "name", "uid", "apiVersion",
                                                       "resourceVersion", "fieldPath")}
    out.update({"reason": _s(d.get("reason")), "reportingController": _s(d.get("reportingController")),
                "type": _s(d.get("type"))})
    return out


def rc_fields(d):
    return {"status.replicas": _s((d.get("status") or {}).get("replicas", 0))}


# Built-in kinds served generically (issue 30): stored and served like the others, JSON
# in Go's top-level order (kind, apiVersion, metadata, spec, status, the rest as sent),
# protobuf with their ObjectMeta exact and spec/status as empty messages (README).
# (plural, singular, kind, group/version, namespaced, shortNames, categories,
#  subresources, field-selector fields, field error style, store key, storage version)
GENERIC_TYPES = [
    ("serviceaccounts", "serviceaccount", "ServiceAccount", "/v1", True, ["sa"], [], ["token"], None,
     "default", None, None),
    ("persistentvolumes", "persistentvolume", "PersistentVolume", "/v1", False, ["pv"], [], ["status"], None,
     "strict", None, None),
    ("persistentvolumeclaims", "persistentvolumeclaim", "PersistentVolumeClaim", "/v1", True, ["pvc"], [],
     ["status"], None, "default", None, None),
    ("podtemplates", "podtemplate", "PodTemplate", "/v1", True, [], [], [], None, "default", None, None),
    ("replicationcontrollers", "replicationcontroller", "ReplicationController", "/v1", True, ["rc"], ["all"],
     ["scale", "status"], rc_fields, "strict", None, None),
    ("limitranges", "limitrange", "LimitRange", "/v1", True, ["limits"], [], [], None, "default", None, None),
    ("resourcequotas", "resourcequota", "ResourceQuota", "/v1", True, ["quota"], [], ["status"], None,
     "default", None, None),
    ("events", "event", "Event", "/v1", True, ["ev"], [], [], event_fields, "strict", None, None),
    ("endpointslices", "endpointslice", "EndpointSlice", "discovery.k8s.io/v1", True, [], [], [], None,
     "default", None, None),
    ("leases", "lease", "Lease", "coordination.k8s.io/v1", True, [], [], [], None, "default", None, None),
    ("events", "event", "Event", "events.k8s.io/v1", True, ["ev"], [], [], events_v1_fields, "strict",
     "events.events.k8s.io", None),
    ("controllerrevisions", "controllerrevision", "ControllerRevision", "apps/v1", True, [], [], [], None,
     "default", None, None),
    ("jobs", "job", "Job", "batch/v1", True, [], ["all"], ["status"], None, "default", None, None),
    ("cronjobs", "cronjob", "CronJob", "batch/v1", True, ["cj"], ["all"], ["status"], None, "default", None, None),
    ("horizontalpodautoscalers", "horizontalpodautoscaler", "HorizontalPodAutoscaler", "autoscaling/v2", True,
     ["hpa"], ["all"], ["status"], None, "default", None, None),
    ("horizontalpodautoscalers", "horizontalpodautoscaler", "HorizontalPodAutoscaler", "autoscaling/v1", True,
     ["hpa"], ["all"], ["status"], None, "default", "horizontalpodautoscalers.autoscaling/v1", "v2"),
    ("poddisruptionbudgets", "poddisruptionbudget", "PodDisruptionBudget", "policy/v1", True, ["pdb"], [],
     ["status"], None, "default", None, None),
    ("networkpolicies", "networkpolicy", "NetworkPolicy", "networking.k8s.io/v1", True, ["netpol"], [], [], None,
     "default", None, None),
    ("ingresses", "ingress", "Ingress", "networking.k8s.io/v1", True, ["ing"], [], ["status"], None, "default",
     None, None),
    ("ingressclasses", "ingressclass", "IngressClass", "networking.k8s.io/v1", False, [], [], [], None, "default",
     None, None),
    ("storageclasses", "storageclass", "StorageClass", "storage.k8s.io/v1", False, ["sc"], [], [], None,
     "default", None, None),
    ("csidrivers", "csidriver", "CSIDriver", "storage.k8s.io/v1", False, [], [], [], None, "default", None, None),
    ("csinodes", "csinode", "CSINode", "storage.k8s.io/v1", False, [], [], [], None, "default", None, None),
    ("volumeattachments", "volumeattachment", "VolumeAttachment", "storage.k8s.io/v1", False, [], [], ["status"],
     None, "default", None, None),
    ("csistoragecapacities", "csistoragecapacity", "CSIStorageCapacity", "storage.k8s.io/v1", True, [], [], [],
     None, "default", None, None),
    ("runtimeclasses", "runtimeclass", "RuntimeClass", "node.k8s.io/v1", False, [], [], [], None, "default", None,
     None),
    ("priorityclasses", "priorityclass", "PriorityClass", "scheduling.k8s.io/v1", False, ["pc"], [], [], None,
     "default", None, None),
    ("roles", "role", "Role", "rbac.authorization.k8s.io/v1", True, [], [], [], None, "default", None, None),
    ("rolebindings", "rolebinding", "RoleBinding", "rbac.authorization.k8s.io/v1", True, [], [], [], None,
     "default", None, None),
    ("clusterroles", "clusterrole", "ClusterRole", "rbac.authorization.k8s.io/v1", False, [], [], [], None,
     "default", None, None),
    ("clusterrolebindings", "clusterrolebinding", "ClusterRoleBinding", "rbac.authorization.k8s.io/v1", False, [],
     [], [], None, "default", None, None),
    ("mutatingwebhookconfigurations", "mutatingwebhookconfiguration", "MutatingWebhookConfiguration",
     "admissionregistration.k8s.io/v1", False, [], ["api-extensions"], [], None, "default", None, None),
    ("validatingwebhookconfigurations", "validatingwebhookconfiguration", "ValidatingWebhookConfiguration",
     "admissionregistration.k8s.io/v1", False, [], ["api-extensions"], [], None, "default", None, None),
    ("certificatesigningrequests", "certificatesigningrequest", "CertificateSigningRequest",
     "certificates.k8s.io/v1", False, ["csr"], [], ["approval", "status"], None, "default", None, None),
    ("customresourcedefinitions", "customresourcedefinition", "CustomResourceDefinition", "apiextensions.k8s.io/v1",
     False, ["crd", "crds"], ["api-extensions"], ["status"], None, "default", None, None),
    ("apiservices", "apiservice", "APIService", "apiregistration.k8s.io/v1", False, [], ["api-extensions"],
     ["status"], None, "default", None, None),
]

# The message of each generic kind in protobuf: ObjectMeta, and spec/status (non-pointer
# structs: always written) as empty messages; every other field is left out (README).
GENERIC_PB_SPEC_STATUS = {
    "PersistentVolume": 3, "PersistentVolumeClaim": 3, "ReplicationController": 3, "LimitRange": 2,
    "ResourceQuota": 3, "Lease": 2, "Job": 3, "CronJob": 3, "HorizontalPodAutoscaler": 3,
    "PodDisruptionBudget": 3, "NetworkPolicy": 2, "Ingress": 3, "IngressClass": 2, "CSIDriver": 2, "CSINode": 2,
    "VolumeAttachment": 3, "CertificateSigningRequest": 3, "CustomResourceDefinition": 3, "APIService": 3}


def generic_pb_schema():
    lines = ["Empty:"]
    seen = set()
    for t in GENERIC_TYPES:
        kind = t[2]
        if kind in seen:
            continue
        seen.add(kind)
        if kind == "PodTemplate":
            lines.append("PodTemplate: 1 metadata M:ObjectMeta, 2 template M:PodTemplateSpec")
            continue
        n = GENERIC_PB_SPEC_STATUS.get(kind, 1)
        f = ["1 metadata M:ObjectMeta"] + (["2 spec M:Empty"] if n >= 2 else []) + (["3 status M:Empty"] if n >= 3 else [])
        lines.append("%s: %s" % (kind, ", ".join(f)))
    return "\n".join(lines) + "\n"


def _meta_for(rt, v, labels=None):
    md = _simple_meta(v, labels)
    if not rt.namespaced:
        del md["namespace"]
    return md


# a small spec per kind for seeded objects (POST /apisim/seed)
GENERIC_SEED = {
    "Lease": {"spec": {"holderIdentity": "%(name)s-holder", "leaseDurationSeconds": 15}},
    "ServiceAccount": {},
    "PriorityClass": {"value": 1000, "description": "apisim"},
    "Event": {"involvedObject": {"kind": "Pod", "namespace": "%(ns)s", "name": "%(app)s"}, "reason": "Started",
              "message": "apisim", "source": {"component": "apisim"}, "type": "Normal", "count": 1},
    "StorageClass": {"provisioner": "apisim.kwc.dev/hostpath", "reclaimPolicy": "Delete",
                     "volumeBindingMode": "Immediate"},
    "Job": {"spec": {"completions": 1}, "status": {}},
}


def generic_builder(rt, v):
    d = {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": _meta_for(rt, v, {"app": v["app"]})}
    extra = GENERIC_SEED.get(rt.kind)
    if extra is None:
        extra = {"spec": {}}
    for k, val in extra.items():
        d[k] = json.loads(json.dumps(val).replace("%(name)s", v["name"]).replace("%(ns)s", v["ns"])
                          .replace("%(app)s", v["app"]))
    if rt.group == "events.k8s.io":
        d = {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": d["metadata"],
             "regarding": {"kind": "Pod", "namespace": v["ns"], "name": v["app"]}, "reason": "Started",
             "note": "apisim", "type": "Normal", "reportingController": "apisim", "action": "Start"}
    return d


# ---------------------------------------------------------------------------
# templates for fast seeding
# ---------------------------------------------------------------------------

class Template:
    """An object encoding with %(var)s holes, filled with plain string formatting
    (a few microseconds per object instead of a JSON encode)."""

    def __init__(self, rt, keys, with_pad):
        sentinel = {k: "@@%s@@" % k for k in keys}
        if with_pad:
            sentinel["pad"] = "@@pad@@"
        s = rt.encode(rt.builder(sentinel)).decode().replace("%", "%%")
        for k in sentinel:
            s = s.replace("@@%s@@" % k, "%%(%s)s" % k)
        self.fmt = s

    def render(self, v):
        return (self.fmt % v).encode()


def fast_uid(rng):
    h = "%032x" % rng.getrandbits(128)
    return "%s-%s-4%s-a%s-%s" % (h[:8], h[8:12], h[13:16], h[17:20], h[20:32])


# ---------------------------------------------------------------------------
# the cluster state
# ---------------------------------------------------------------------------

class Event:
    __slots__ = ("rv", "type", "obj", "prev", "_line", "_framed", "_left", "_pb", "_pbf")

    def __init__(self, rv, etype, obj, prev):
        self.rv = rv
        self.type = etype
        self.obj = obj
        self.prev = prev
        self._line = None
        self._framed = None
        self._left = None
        self._pb = None
        self._pbf = None

    def pb_frame(self, app, rt):
        """The event's protobuf watch frame (length + WatchEvent), encoded once."""
        if self._pb is None:
            self._pb = pb_watch_event(self.type, pb_envelope(rt.pb_tm, app.pb_raw(rt, self.obj)))
        return self._pb

    def pb_chunk(self, w):
        if w.conn.http10:
            return self.pb_frame(w.app, w.st.rt)
        if self._pbf is None:
            f = self.pb_frame(w.app, w.st.rt)
            self._pbf = b"%x\r\n%s\r\n" % (len(f), f)
        return self._pbf

    def line(self):
        if self._line is None:
            self._line = b'{"type":"%s","object":%s}\n' % (self.type.encode(), self.obj.data)
        return self._line

    def framed(self):
        if self._framed is None:
            ln = self.line()
            self._framed = b"%x\r\n%s\r\n" % (len(ln), ln)
        return self._framed

    def left_obj(self):
        """The previous object stamped with this event's rv (selector-leaving DELETED)."""
        if self._left is None:
            self._left = self.prev.with_rv(self.rv)
        return self._left


class RStore:
    """Objects, sorted keys, history and watchers of one resource type."""

    def __init__(self, rt):
        self.rt = rt
        self.objs = {}
        self.keys = []          # always sorted (byte order == code point order)
        self.hist = []          # Events, increasing rv
        self.evicted_rv = 0     # every event with rv <= this is gone from hist
        self.watchers = set()
        self.snaps = collections.OrderedDict()  # rv -> (objs, keys)
        self.seq = 0            # name counter for seeding/churn creates
        self.templates = {}

    def range_for_ns(self, keys, ns):
        if ns is None:
            return 0, len(keys)
        lo = bisect.bisect_left(keys, ns + "/")
        hi = bisect.bisect_left(keys, ns + "0")  # '0' follows '/' in byte order
        return lo, hi


class Cluster:
    def __init__(self, args):
        self.args = args
        self.rv = 0
        self.compacted = 0
        self.history_cap = max(1, args.history)
        self.types = make_types()
        self.stores = {t.key: RStore(t) for t in self.types}
        # autoscaling/v1 horizontalpodautoscalers: the v2 objects seen through v1
        self.link_versions([self.stores["horizontalpodautoscalers"],
                            self.stores["horizontalpodautoscalers.autoscaling/v1"]])
        # core/v1 and events.k8s.io/v1 events: one storage seen through two versions
        self.stores["events"].rt.convert = event_to_core
        self.stores["events.events.k8s.io"].rt.convert = event_to_v1
        self.link_versions([self.stores["events"], self.stores["events.events.k8s.io"]])
        self.pending = []
        self.flush_scheduled = False
        self.rv_waiters = []
        self.events_total = 0
        self.rng = random.Random(args.seed)
        self.loop = None
        self.kver = "v%s.0" % args.version
        self.on_discovery_change = None

    def store_for(self, name):
        """A store by its key, or by plural, plural.group or plural.group/version."""
        st = self.stores.get(name)
        if st is not None:
            return st
        for st in self.stores.values():
            rt = st.rt
            if name in (rt.plural, "%s.%s" % (rt.plural, rt.group), "%s.%s/%s" % (rt.plural, rt.group, rt.version)):
                return st
        raise KeyError(name)

    def link_versions(self, stores):
        """Stores of one resource in several versions: every write to one of them is
        written to the others too (same rv; the object with its apiVersion changed), as
        kube keeps one watch cache per served version over the same etcd objects."""
        for st in stores:
            st.rt.mirrors = [o for o in stores if o is not st]

    def add_store(self, rt, like=None):
        """A new store for rt; like: a store of the same resource in another version,
        whose objects it starts with (history empty: older rvs are 410s)."""
        st = RStore(rt)
        if like is not None:
            for k in like.keys:
                st.objs[k] = convert_obj(like.objs[k], rt)
            st.keys = list(like.keys)
            st.evicted_rv = self.rv
        self.stores[rt.key] = st
        self.types.append(rt)
        return st

    def remove_store(self, st):
        """Stop serving a store: its watches end cleanly (kube's cacher stops), then it
        is forgotten."""
        if self.pending:
            self._flush()   # the events already written reach its watchers first
        self.stores.pop(st.rt.key, None)
        if st.rt in self.types:
            self.types.remove(st.rt)
        for o in st.rt.mirrors:
            o.rt.mirrors = [m for m in o.rt.mirrors if m is not st]
        for w in list(st.watchers):
            w.finish(clean=True)
        self.pending = [(s, ev) for s, ev in self.pending if s is not st]

    # -- history floor ------------------------------------------------------
    def floor(self, st):
        return max(self.compacted, st.evicted_rv)

    # -- writes -------------------------------------------------------------
    def _next_rv(self):
        self.rv += 1
        return self.rv

    def _commit(self, st, etype, obj, prev, mirror=True):
        if mirror and st.rt.mirrors:
            for mst in st.rt.mirrors:
                mprev = mst.objs.get(obj.key)
                if etype == "DELETED":
                    if mprev is None:
                        continue
                    del mst.objs[obj.key]
                    i = bisect.bisect_left(mst.keys, obj.key)
                    if i < len(mst.keys) and mst.keys[i] == obj.key:
                        del mst.keys[i]
                    mobj = convert_obj(obj, mst.rt)
                else:
                    mobj = convert_obj(obj, mst.rt)
                    if mprev is None:
                        bisect.insort(mst.keys, obj.key)
                    mst.objs[obj.key] = mobj
                self._commit(mst, etype if (etype != "MODIFIED" or mprev is not None) else "ADDED", mobj, mprev,
                             False)
        ev = Event(obj.rv, etype, obj, prev)
        if st.rt.key in ("customresourcedefinitions", "apiservices") and self.on_discovery_change is not None:
            self.on_discovery_change()
        h = st.hist
        h.append(ev)
        if len(h) > self.history_cap + (self.history_cap >> 3) + 16:
            cut = len(h) - self.history_cap
            st.evicted_rv = max(st.evicted_rv, h[cut - 1].rv)
            del h[:cut]
        self.events_total += 1
        if st.watchers:
            self.pending.append((st, ev))
            if not self.flush_scheduled:
                self.flush_scheduled = True
                self.loop.call_soon(self._flush)
        if self.rv_waiters:
            self._wake_waiters()
        if st.snaps:
            st.snaps.clear()
        return ev

    def store_new(self, st, d, etype="ADDED"):
        """Insert a new object dict (metadata complete except resourceVersion)."""
        rv = self._next_rv()
        d["metadata"]["resourceVersion"] = str(rv)
        data = st.rt.encode(d)
        obj = st.rt.obj_from_dict(d, data, rv)
        st.objs[obj.key] = obj
        bisect.insort(st.keys, obj.key)
        self._commit(st, etype, obj, None)
        return obj

    def store_update(self, st, d, prev):
        rv = self._next_rv()
        d["metadata"]["resourceVersion"] = str(rv)
        data = st.rt.encode(d)
        obj = st.rt.obj_from_dict(d, data, rv)
        st.objs[obj.key] = obj
        self._commit(st, "MODIFIED", obj, prev)
        return obj

    def store_delete(self, st, prev, stamp=None):
        rv = self._next_rv()
        del st.objs[prev.key]
        i = bisect.bisect_left(st.keys, prev.key)
        if i < len(st.keys) and st.keys[i] == prev.key:
            del st.keys[i]
        obj = prev.with_rv(rv)
        if stamp is not None:
            d = obj.dict()
            ann_of(d["metadata"])[WRITTEN_AT] = stamp
            obj = Obj(obj.key, obj.ns, obj.name, rv, obj.labels, obj.fields, st.rt.encode(d), obj.uid)
        self._commit(st, "DELETED", obj, prev)
        return obj

    def compact(self, rv):
        rv = min(max(rv, 0), self.rv)
        if rv > self.compacted:
            self.compacted = rv
        for st in self.stores.values():
            h = st.hist
            i = 0
            while i < len(h) and h[i].rv <= self.compacted:
                i += 1
            if i:
                del h[:i]
            st.snaps.clear()
        return self.compacted

    # -- fan-out ------------------------------------------------------------
    def _flush(self):
        self.flush_scheduled = False
        pend = self.pending
        self.pending = []
        groups = {}
        for st, ev in pend:
            groups.setdefault(st, []).append(ev)
        for st, evs in groups.items():
            for w in list(st.watchers):
                w.deliver(evs)

    # -- waiting for a resourceVersion ----------------------------------------
    def _wake_waiters(self):
        keep = []
        for target, fut in self.rv_waiters:
            if fut.done():
                continue
            if self.rv >= target:
                fut.set_result(True)
            else:
                keep.append((target, fut))
        self.rv_waiters = keep

    async def wait_for_rv(self, target, timeout):
        if self.rv >= target:
            return True
        fut = self.loop.create_future()
        self.rv_waiters.append((target, fut))
        try:
            await asyncio.wait_for(fut, timeout)
            return True
        except asyncio.TimeoutError:
            return self.rv >= target

    # -- snapshots at a past resourceVersion ------------------------------------
    def snapshot(self, st, rv):
        """(objs dict, sorted keys) as of rv (caller checked floor <= rv <= self.rv)."""
        if rv >= self.rv or not st.hist or st.hist[-1].rv <= rv:
            return st.objs, st.keys
        snap = st.snaps.get(rv)
        if snap is not None:
            st.snaps.move_to_end(rv)
            return snap
        objs = dict(st.objs)
        h = st.hist
        i = len(h) - 1
        while i >= 0 and h[i].rv > rv:
            ev = h[i]
            if ev.prev is None:
                objs.pop(ev.obj.key, None)
            else:
                objs[ev.prev.key] = ev.prev
            i -= 1
        snap = (objs, sorted(objs))
        st.snaps[rv] = snap
        while len(st.snaps) > 4:
            st.snaps.popitem(last=False)
        return snap

    # -- seeding ------------------------------------------------------------
    def template(self, st, size):
        t = st.templates.get(size)
        if t is None:
            keys = SEED_VARS.get(st.rt.key, _COMMON_VARS)
            base = Template(st.rt, keys, False)
            probe = base.render(self.sample_vars(st, 0, "default", 1, 0))
            if size and size > len(probe) + 40:
                padded = Template(st.rt, keys, True)
                v = self.sample_vars(st, 0, "default", 1, 0)
                v["pad"] = ""
                n = size - len(padded.render(v))
                t = (padded, "x" * max(0, n))
            else:
                t = (base, None)
            st.templates[size] = t
        return t

    def sample_vars(self, st, i, ns, nodes, pad_n):
        rng = self.rng
        plural = st.rt.plural
        k = i % 50
        v = {"name": "x", "ns": ns, "uid": fast_uid(rng), "rv": "1", "ts": now_rfc3339(), "app": "app-%d" % k}
        if plural == "pods":
            node = i % max(1, nodes)
            h = hashlib.md5(v["app"].encode()).hexdigest()
            v.update(node="node-%d" % node, tier=("frontend", "backend", "cache")[i % 3], hash=h[:10],
                     rsuid="%s-%s-4%s-a%s-%s" % (h[:8], h[8:12], h[13:16], h[17:20], h[20:32]),
                     ip="10.%d.%d.%d" % (64 + (((i + 2) >> 16) & 63), ((i + 2) >> 8) & 255, (i + 2) & 255),
                     hostip="192.168.%d.%d" % ((node >> 8) & 255, node & 255), cid="%064x" % rng.getrandbits(256))
        elif plural == "nodes":
            v.update(ip="192.168.%d.%d" % ((i >> 8) & 255, i & 255), cidr="10.%d.%d.0/24" % (64 + (i >> 8) % 64, i & 255),
                     mid="%032x" % rng.getrandbits(128), kver=self.kver)
        elif plural in ("services",):
            v.update(ip="10.96.%d.%d" % ((i >> 8) & 255, i & 255))
        elif plural == "endpoints":
            v.update(ip="10.64.%d.%d" % ((i >> 8) & 255, i & 255), node="node-%d" % (i % max(1, nodes)))
        return v

    def seed(self, plural, count, ns=None, nodes=1, size=0, namespaces=None, prefix=None):
        """Create count objects quickly. Returns the number created."""
        st = self.store_for(plural)
        rt = st.rt
        plural = rt.key
        tmpl, pad = self.template(st, size)
        if rt.namespaced and namespaces is None:
            namespaces = [ns or "default"]
        for n in set(namespaces or ()):
            self.ensure_namespace(n)
        prefix = prefix or {"pods": "pod", "nodes": "node", "namespaces": "ns", "configmaps": "cm",
                            "secrets": "secret", "services": "svc", "endpoints": "ep", "deployments": "deploy",
                            "replicasets": "rs", "daemonsets": "ds", "statefulsets": "sts",
                            "widgets": "widget"}.get(plural, rt.singular)
        made = 0
        fields_fn = rt.fields_fn
        start_seq = st.seq
        new_keys = []
        tries = 0
        while made < count and tries < count * 2 + 10:
            tries += 1
            i = st.seq
            st.seq += 1
            name = "%s-%d" % (prefix, i)
            nsv = namespaces[i % len(namespaces)] if rt.namespaced else ""
            key = "%s/%s" % (nsv, name) if rt.namespaced else name
            if key in st.objs:
                continue
            v = self.sample_vars(st, i, nsv, nodes, 0)
            v["name"] = name
            rv = self._next_rv()
            v["rv"] = str(rv)
            if pad is not None:
                v["pad"] = pad
            data = tmpl.render(v)
            if plural == "pods":
                labels = POD_LABELS.get((v["app"], v["tier"], v["hash"]))
                if labels is None:
                    labels = POD_LABELS[(v["app"], v["tier"], v["hash"])] = {
                        "app": v["app"], "pod-template-hash": v["hash"], "tier": v["tier"]}
                fields = {"spec.nodeName": v["node"], "spec.restartPolicy": "Always",
                          "spec.schedulerName": "default-scheduler", "spec.serviceAccountName": "default",
                          "status.phase": "Running", "status.podIP": v["ip"], "status.nominatedNodeName": ""}
                obj = Obj(key, nsv, name, rv, labels, fields, data, v["uid"])
            else:
                d = json.loads(data) if (fields_fn or plural in ("nodes", "namespaces")) else None
                labels = (d["metadata"].get("labels") or {}) if d is not None else {"app": v["app"]}
                obj = Obj(key, nsv, name, rv, labels, fields_fn(d) if fields_fn else None, data, v["uid"])
            st.objs[key] = obj
            new_keys.append(key)
            self._commit(st, "ADDED", obj, None)
            made += 1
        if new_keys:
            st.keys.extend(new_keys)
            st.keys.sort()
        del start_seq
        return made

    def ensure_namespace(self, name):
        st = self.stores["namespaces"]
        if name in st.objs:
            return st.objs[name]
        uid = fast_uid(self.rng)
        if name == "kube-system" and self.args.cluster_uid:
            uid = self.args.cluster_uid
        d = build_namespace({"name": name, "uid": uid, "rv": "0", "ts": now_rfc3339()})
        return self.store_new(st, d)


WRITTEN_AT = "apisim.kwc.dev/written-at"
POD_LABELS = {}
_COMMON_VARS = ["name", "ns", "uid", "rv", "ts", "app"]
SEED_VARS = {
    "pods": _COMMON_VARS + ["node", "tier", "hash", "rsuid", "ip", "hostip", "cid"],
    "nodes": ["name", "uid", "rv", "ts", "ip", "cidr", "mid", "kver"],
    "namespaces": ["name", "uid", "rv", "ts"],
    "configmaps": _COMMON_VARS, "secrets": _COMMON_VARS, "services": _COMMON_VARS + ["ip"],
    "endpoints": _COMMON_VARS + ["ip", "node"], "deployments": _COMMON_VARS, "replicasets": _COMMON_VARS,
    "daemonsets": _COMMON_VARS, "statefulsets": _COMMON_VARS, "widgets": _COMMON_VARS,
}


# ---------------------------------------------------------------------------
# HTTP/1.1 server (hand-written parser on asyncio.Protocol)
# ---------------------------------------------------------------------------

REASONS = {100: b"Continue", 101: b"Switching Protocols", 200: b"OK", 201: b"Created", 202: b"Accepted",
           204: b"No Content", 400: b"Bad Request", 401: b"Unauthorized", 403: b"Forbidden",
           404: b"Not Found", 405: b"Method Not Allowed", 406: b"Not Acceptable", 409: b"Conflict",
           410: b"Gone", 413: b"Request Entity Too Large", 415: b"Unsupported Media Type",
           422: b"Unprocessable Entity", 429: b"Too Many Requests", 431: b"Request Header Fields Too Large",
           500: b"Internal Server Error", 501: b"Not Implemented", 502: b"Bad Gateway",
           503: b"Service Unavailable", 504: b"Gateway Timeout"}
STATUS_REASON = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
                 406: "NotAcceptable", 409: "Conflict", 410: "Expired", 413: "RequestEntityTooLarge",
                 415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
                 503: "ServiceUnavailable", 504: "Timeout"}
MAX_HEADER = 1 << 20
MAX_BODY = 64 << 20
RECENT_REQUESTS = 200   # request heads kept for GET /apisim/requests
_audit_rng = random.Random()
_date_cache = [0, b""]
# apiserver/pkg/server/filters/priority-and-fairness.go setResponseHeaders: the UIDs of
# the FlowSchema and PriorityLevelConfiguration the request matched -- the same for every
# request of one client (objects' UIDs, not per request).  Set only on requests that went
# through APF: not on a 401 (authentication runs before APF in DefaultBuildHandlerChain:
# APF needs the user) and not on long-running non-watch requests (exec, attach, log,
# portforward, proxy: "Skip tracking long running non-watch requests").
PF_HEADERS = (b"X-Kubernetes-Pf-Flowschema-Uid: 7d0f8a66-5c1e-4c7e-9f3b-2a61c0e9d401\r\n"
              b"X-Kubernetes-Pf-Prioritylevel-Uid: 3b1a2c44-8e2d-4d8e-a1c5-5f0e9b7c6d02\r\n")


def http_date():
    t = int(time.time())
    if _date_cache[0] != t:
        _date_cache[0] = t
        _date_cache[1] = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(t)).encode()
    return _date_cache[1]


class HttpError(Exception):
    def __init__(self, code, msg):
        super().__init__(msg)
        self.code = code


# net/textproto's header bytes (Go 1.22 reader.go): a field name is a token
# (validHeaderFieldByte); a value byte is VCHAR, SP, HTAB or obs-text (>= 0x80)
_TCHAR = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_BAD_VALUE_BYTE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


def parse_header_lines(lines):
    """The header lines of a request head as Go's net/http reads them
    (textproto.Reader.ReadMIMEHeader, which kube-apiserver's server uses):
    [(name, value)] in order, names lower-cased (apisim's stand-in for
    CanonicalMIMEHeaderKey), values latin-1 text of the raw bytes.
      - an obs-fold line (starting with SP or HTAB) continues the previous
        line: readContinuedLineSlice joins the lines, each trimmed of SP/HTAB
        at both ends, with one space; a first header line that starts with
        SP/HTAB is an error ("malformed MIME header initial line");
      - the value is what follows the first ':' with leading SP/HTAB removed
        (TrimLeft) -- trailing SP/HTAB went with the line's trim; no other
        byte is trimmed (Python's strip() would also take VT, FF, CR);
      - a name with a byte that is not a token char is an error, except a
        space (go.dev/issue/34540): such a name is kept as sent and never
        canonicalized, so it is no known header ("Impersonate-User : x" is
        not Impersonate-User); an empty name is an error;
      - a value with a control byte other than HTAB is an error.
    Errors are HttpError 400, as net/http answers them."""
    out = []
    joined = []
    for ln in lines:
        if ln[:1] in (b" ", b"\t"):
            if not joined:
                raise HttpError(400, "malformed MIME header initial line")
            joined[-1] += b" " + ln.strip(b" \t")
        else:
            joined.append(ln.strip(b" \t"))
    for kv in joined:
        k, sep, v = kv.partition(b":")
        if not sep or not k:
            raise HttpError(400, "malformed MIME header line")
        if not all(c in _TCHAR or c == 0x20 for c in k):
            raise HttpError(400, "malformed MIME header line")
        if _BAD_VALUE_BYTE.search(v):
            raise HttpError(400, "malformed MIME header line")
        name = k.decode("latin-1")
        if b" " not in k:
            name = name.lower()
        out.append((name, v.lstrip(b" \t").decode("latin-1")))
    return out


class Request:
    __slots__ = ("method", "target", "path", "query", "version", "headers", "body", "keep_alive", "qlist",
                 "t0", "started", "hlist", "pretty")

    def __init__(self, method, target, version, headers, hlist=()):
        self.method = method
        self.hlist = hlist   # [(lower-cased name, value)] in order: repeated headers kept apart
        self.target = target
        self.version = version
        self.headers = headers
        self.body = b""
        p, _, q = target.partition("?")
        self.path = unquote(p)
        self.qlist = parse_qsl(q, keep_blank_values=True) if q else []
        self.query = {}
        for k, v in self.qlist:
            if k not in self.query:
                self.query[k] = v
        conn = headers.get("connection", "").lower()
        if version == "HTTP/1.0":
            self.keep_alive = "keep-alive" in conn
        else:
            self.keep_alive = "close" not in conn
        self.t0 = time.monotonic()
        self.started = False
        self.pretty = None   # App.negotiate's decision for the answer (None: not negotiated)

    def qall(self, key):
        return [v for k, v in self.qlist if k == key]


class Conn(asyncio.Protocol):
    def __init__(self, app):
        self.app = app
        self.loop = app.loop
        self.transport = None
        self.buf = bytearray()
        self.req = None
        self.body_mode = None
        self.body_len = 0
        self.chunks = None
        self.sent_continue = False
        self.busy = False
        self.closed = False
        self.paused = False
        self.waiters = []
        self.upgraded = None
        self.task = None
        self.watchers = set()
        self.peer_cert = None
        self.http10 = False
        self.keep_alive = True
        self.audit_id = b""
        self.apf = True
        self.cc = b"no-cache, private"

    # -- asyncio callbacks --------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport
        transport.set_write_buffer_limits(high=1 << 20, low=1 << 18)
        sslobj = transport.get_extra_info("ssl_object")
        if sslobj is not None:
            try:
                self.peer_cert = sslobj.getpeercert()
            except (ValueError, ssl.SSLError):
                self.peer_cert = None
        self.app.conns.add(self)

    def connection_lost(self, exc):
        self.closed = True
        self.app.conns.discard(self)
        for f in self.waiters:
            if not f.done():
                f.set_exception(ConnectionResetError("closed"))
        self.waiters = []
        for w in list(self.watchers):
            w.finish(clean=False)
        if self.upgraded is not None:
            try:
                self.upgraded.on_close()
            except Exception:
                pass
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False
        for f in self.waiters:
            if not f.done():
                f.set_result(None)
        self.waiters = []

    async def drain(self):
        if self.closed:
            raise ConnectionResetError("closed")
        if not self.paused:
            return
        f = self.loop.create_future()
        self.waiters.append(f)
        await f

    def data_received(self, data):
        if self.upgraded is not None:
            self.upgraded.feed(data)
            return
        self.buf += data
        if not self.busy:
            self.process()

    def eof_received(self):
        if self.upgraded is not None:
            self.upgraded.feed(b"")
        return False

    # -- request parsing ------------------------------------------------------
    def _parse(self):
        buf = self.buf
        if self.req is None:
            while buf.startswith(b"\r\n"):
                del buf[:2]
            idx = buf.find(b"\r\n\r\n")
            if idx < 0:
                if len(buf) > MAX_HEADER:
                    raise HttpError(431, "header too large")
                return None
            head = bytes(buf[:idx])
            del buf[:idx + 4]
            lines = head.split(b"\r\n")
            try:
                method, target, version = lines[0].decode("latin-1").split(" ")
            except ValueError:
                raise HttpError(400, "malformed request line")
            if not version.startswith("HTTP/1."):
                raise HttpError(400, "unsupported version")
            headers = {}
            hlist = []
            for k, v in parse_header_lines(lines[1:]):
                hlist.append((k, v))
                headers[k] = headers[k] + ", " + v if k in headers else v
            req = Request(method, target, version, headers, hlist)
            te = headers.get("transfer-encoding", "").lower()
            if "chunked" in te:
                self.body_mode = "chunked"
                self.chunks = []
                self.body_len = 0
            elif "content-length" in headers:
                try:
                    n = int(headers["content-length"])
                except ValueError:
                    raise HttpError(400, "bad content-length")
                if n < 0:
                    raise HttpError(400, "bad content-length")
                if n > MAX_BODY:
                    raise HttpError(413, "body too large")
                self.body_mode = "length" if n else None
                self.body_len = n
            else:
                self.body_mode = None
            self.req = req
            self.sent_continue = False
        req = self.req
        if self.body_mode == "length":
            if len(buf) < self.body_len:
                self._maybe_continue()
                return None
            req.body = bytes(buf[:self.body_len])
            del buf[:self.body_len]
        elif self.body_mode == "chunked":
            while True:
                i = buf.find(b"\r\n")
                if i < 0:
                    self._maybe_continue()
                    return None
                try:
                    size = int(bytes(buf[:i]).split(b";")[0].strip(), 16)
                except ValueError:
                    raise HttpError(400, "bad chunk size")
                if size == 0:
                    j = buf.find(b"\r\n", i + 2)
                    # trailers: read lines until an empty one
                    k = i + 2
                    while True:
                        j = buf.find(b"\r\n", k)
                        if j < 0:
                            return None
                        if j == k:
                            break
                        k = j + 2
                    del buf[:j + 2]
                    req.body = b"".join(self.chunks)
                    self.chunks = None
                    break
                if len(buf) < i + 2 + size + 2:
                    self._maybe_continue()
                    return None
                self.body_len += size
                if self.body_len > MAX_BODY:
                    raise HttpError(413, "body too large")
                self.chunks.append(bytes(buf[i + 2:i + 2 + size]))
                del buf[:i + 2 + size + 2]
        self.req = None
        self.body_mode = None
        return req

    def _maybe_continue(self):
        if not self.sent_continue and self.req is not None and \
                self.req.headers.get("expect", "").lower() == "100-continue":
            self.sent_continue = True
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def process(self):
        while not self.busy and not self.closed and self.upgraded is None:
            try:
                req = self._parse()
            except HttpError as e:
                self.app.stats["http %d" % e.code] += 1
                body = b"%d %s" % (e.code, REASONS.get(e.code, b"Error"))
                self.transport.write(b"HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
                                     b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
                                     % (e.code, REASONS.get(e.code, b"Error"), len(body), body))
                self.transport.close()
                self.closed = True
                return
            if req is None:
                return
            self.http10 = req.version == "HTTP/1.0"
            self.keep_alive = req.keep_alive
            # endpoints/filters/audit_init.go WithAuditInit: the request's Audit-ID echoed,
            # else a new uuid per request; set before anything else (every API answer)
            aid = req.headers.get("audit-id", "")
            self.audit_id = aid.encode("latin-1") if aid else fast_uid(_audit_rng).encode()
            self.apf = True
            self.cc = b"no-cache, private"
            self.busy = True
            try:
                r = self.app.dispatch(req, self)
            except ApiError as e:
                self.respond_error(e, req)
                r = None
            except Exception as e:  # a bug: answer like kube-apiserver would (500)
                self.app.log("internal error: %r" % (e,))
                import traceback
                traceback.print_exc()
                self.respond_error(err_generic(500, "apisim internal error: %s" % e), req)
                r = None
            if r is None:
                self._done()
            else:
                self.task = self.loop.create_task(self._run(r, req))
                return

    async def _run(self, coro, req):
        try:
            await coro
        except ApiError as e:
            if not self.closed and not req.started:
                self.respond_error(e, req)
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception as e:
            self.app.log("internal error: %r" % (e,))
            import traceback
            traceback.print_exc()
            if not self.closed and not req.started:
                self.respond_error(err_generic(500, "apisim internal error: %s" % e), req)
        finally:
            self.task = None
            self._done()
            if not self.closed and self.upgraded is None and self.buf:
                self.loop.call_soon(self.process)

    def _done(self):
        self.busy = False
        if not self.keep_alive and not self.closed and self.upgraded is None:
            self.transport.close()
            self.closed = True

    # -- responses ----------------------------------------------------------
    def head(self, code, ctype=JSON_CT, length=None, chunked=False, extra=(), gz=False):
        # Cache-Control from endpoints/filters/cachecontrol.go WithCacheControl (every
        # response); Content-Type application/json for objects, lists, Status errors and
        # JSON watches (handlers/watch.go: ";stream=watch" only for non-JSON media types).
        # gz: a gzip body (writers.go deferredResponseWriter: Content-Encoding, Vary).
        # (Cache-Control: public for aggregated discovery, whose handler sets it over the
        # filter's; a 304 has no Content-Type, as Go's server suppresses it)
        parts = [b"HTTP/1.1 %d %s\r\nAudit-Id: %s\r\nCache-Control: %s\r\n%s%sDate: %s\r\n" % (
            code, REASONS.get(code, b"Unknown"), self.audit_id, self.cc,
            b"Content-Encoding: gzip\r\n" if gz else b"",
            b"Content-Type: %s\r\n" % ctype if ctype is not None else b"", http_date())]
        for k, v in extra:   # before the APF headers: Go writes header names sorted
            parts.append(b"%s: %s\r\n" % (k, v))
        if gz:
            parts.append(b"Vary: Accept-Encoding\r\n")
        if self.apf:
            parts.append(PF_HEADERS)
        if chunked:
            parts.append(b"Transfer-Encoding: chunked\r\n")
        elif length is not None:
            parts.append(b"Content-Length: %d\r\n" % length)
        if not self.keep_alive:
            parts.append(b"Connection: close\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)

    def respond(self, code, body, req, ctype=JSON_CT, extra=(), nl=False, nolength=False):
        """nl: append the newline json.Encoder.Encode ends an API object with.
        nolength: no Content-Length (a 304)."""
        if self.closed:
            return
        if nl:
            return self.respond_api(code, body + b"\n", req, ctype, extra)
        h = self.head(code, ctype, None if nolength else len(body) + nl, extra=extra)
        if req.method == "HEAD":
            self.transport.write(h)
        elif nl:
            self.transport.write(b"".join((h, body, b"\n")))
        else:
            self.transport.write(h + body)

    def respond_json(self, code, obj, req, extra=(), nl=True):
        """An API object as kube-apiserver writes it (responsewriters.SerializeObject ->
        json.Encoder.Encode: compact, HTML-escaped, one trailing newline; pretty and
        gzip as respond_api says).  nl=False: apisim's own JSON (the control API)."""
        self.respond(code, dumpb(obj), req, extra=extra, nl=nl)

    def respond_api(self, code, body, req, ctype=JSON_CT, extra=(), pretty=None):
        """An answer of responsewriters.SerializeObject: body is the encoder's bytes
        (compact JSON with its newline, or protobuf).
          - pretty (JSON only; default req.pretty, else App.pretty(req)): the serializer
            is the pretty one (json.go doEncode: json.MarshalIndent, no newline);
          - gzip (writers.go deferredResponseWriter): when the first Accept-Encoding line
            names gzip and the body is > 128 KiB: level 1, Content-Encoding: gzip and
            Vary: Accept-Encoding, no Content-Length (chunked; close-delimited on
            HTTP/1.0).  Never for WriteRawJSON's answers, watches, logs."""
        if self.closed:
            return
        if ctype == JSON_CT or ctype.startswith(JSON_CT + b";"):  # aggregated discovery's too
            if pretty is None:
                pretty = req.pretty if req.pretty is not None else self.app.pretty(req)
            if pretty:
                body = go_indent(body)
        if len(body) <= GZIP_THRESHOLD or not wants_gzip(req):
            self.respond(code, body, req, ctype, extra)
            return
        if req.method == "HEAD":
            self.transport.write(self.head(code, ctype, None, False, extra, gz=True))
            return
        self.start_stream(req, code, ctype, extra, gz=True)
        self.write_chunk(go_gzip(body))
        self.end_stream()

    def respond_error(self, e, req):
        """A Status error as responsewriters.ErrorNegotiated writes it: in the encoding
        the Accept header negotiates (App.error_encoding), pretty as that negotiation
        and isPrettyPrint say; when none fits, WriteObjectNegotiated falls back to
        WriteRawJSON (2-space indented, no newline, never gzip)."""
        enc = self.app.error_encoding(req)
        if enc == "pb":
            self.respond_api(e.code, self.app.pb_status(e.status()), req, ctype=PB_CT, extra=e.headers)
        elif enc is None:
            self.respond(e.code, dumpb_indent(e.status()), req, extra=e.headers)
        else:
            self.respond_api(e.code, dumpb(e.status()) + b"\n", req, extra=e.headers, pretty=self.app.pretty(req))

    def start_stream(self, req, code=200, ctype=JSON_CT, extra=(), gz=False):
        """Start a streamed (chunked) response; HTTP/1.0 gets a close-delimited body."""
        req.started = True
        if self.http10:
            self.keep_alive = False
            self.transport.write(self.head(code, ctype, None, False, extra, gz))
        else:
            self.transport.write(self.head(code, ctype, None, True, extra, gz))

    def frame(self, data):
        if self.http10:
            return data
        return b"%x\r\n%s\r\n" % (len(data), data)

    def write_chunk(self, data):
        if data and not self.closed:
            self.transport.write(self.frame(data))

    def end_stream(self):
        if not self.closed and not self.http10:
            self.transport.write(b"0\r\n\r\n")

    def abort(self):
        if not self.closed:
            self.closed = True
            self.transport.abort()


# ---------------------------------------------------------------------------
# watchers
# ---------------------------------------------------------------------------

WATCH_BUFFER_LIMIT = 64 << 20   # a watcher this far behind is closed (kube closes slow watchers too)


class Watcher:
    def __init__(self, app, conn, st, ns, lsel, fsel, mode, table_ver, include_obj, bookmarks, deadline, enc="json"):
        self.app = app
        self.conn = conn
        self.st = st
        self.ns = ns
        self.lsel = lsel
        self.fsel = fsel
        self.mode = mode                  # "json" | "table" | "meta"
        self.enc = enc                    # "json" | "pb"
        self.table_ver = table_ver
        self.include_obj = include_obj
        unfiltered = mode == "json" and ns is None and lsel is None and fsel is None
        self.simple = unfiltered and enc == "json"
        self.simple_pb = unfiltered and enc == "pb"
        self.live = False
        self.queue = []
        self.start_rv = 0
        self.last_rv = 0
        self.bookmarks = bookmarks
        self.deadline = deadline          # loop time
        self.next_bm = None
        self.closed = False
        self.done = app.loop.create_future()
        self.first = True
        self.timer = None

    def match(self, obj):
        if self.ns is not None and obj.ns != self.ns:
            return False
        if self.lsel is not None and not self.lsel.matches(obj.labels):
            return False
        if self.fsel is not None and not self.fsel.matches(obj):
            return False
        return True

    def encode(self, etype, obj):
        """One watch event line for a non-plain mode (Table / PartialObjectMetadata)."""
        d = obj.dict()
        if self.mode == "table":
            o = self.app.table_for(self.st.rt, [d], self.table_ver, self.include_obj,
                                   {"resourceVersion": str(obj.rv)}, headers=self.first)
            self.first = False
        else:
            o = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/" + self.table_ver,
                 "metadata": partial_meta(d.get("metadata"))}
        return b'{"type":"%s","object":%s}\n' % (etype.encode(), dumpb(o))

    def pb_frame(self, etype, obj):
        return pb_watch_event(etype, self.app.pb_object(self.st.rt, (self.mode, self.table_ver, "pb"), obj=obj))

    def chunk_for(self, ev):
        if self.simple:
            return ev.line() if self.conn.http10 else ev.framed()
        if self.simple_pb:
            return ev.pb_chunk(self)
        t = ev.type
        if t == "ADDED":
            if not self.match(ev.obj):
                return None
            o = ev.obj
        elif t == "DELETED":
            if not self.match(ev.prev):
                return None
            o = ev.obj
        else:
            cur = self.match(ev.obj)
            old = self.match(ev.prev)
            if cur and old:
                o = ev.obj
            elif cur:
                t, o = "ADDED", ev.obj
            elif old:
                t, o = "DELETED", ev.left_obj()
            else:
                return None
        if self.enc == "pb":
            if self.mode == "json" and t == ev.type:
                return ev.pb_chunk(self)
            return self.conn.frame(self.pb_frame(t, o))
        if self.mode == "json":
            if t == ev.type:
                return ev.line() if self.conn.http10 else ev.framed()
            return self.conn.frame(b'{"type":"%s","object":%s}\n' % (t.encode(), o.data))
        return self.conn.frame(self.encode(t, o))

    def initial_chunk(self, obj):
        if self.enc == "pb":
            return self.conn.frame(self.pb_frame("ADDED", obj))
        if self.mode == "json":
            return self.conn.frame(b'{"type":"ADDED","object":%s}\n' % obj.data)
        return self.conn.frame(self.encode("ADDED", obj))

    def write(self, data):
        if self.closed or self.conn.closed:
            return
        tr = self.conn.transport
        tr.write(data)
        if tr.get_write_buffer_size() > WATCH_BUFFER_LIMIT:
            self.app.log("closing slow watcher on %s (%d bytes buffered)" % (self.st.rt.plural,
                                                                              tr.get_write_buffer_size()))
            self.finish(clean=False)
            self.conn.abort()

    def deliver(self, evs):
        if self.closed:
            return
        if not self.live:
            self.queue.extend(evs)
            return
        out = []
        srv = self.start_rv
        for ev in evs:
            if ev.rv <= srv:
                continue
            c = self.chunk_for(ev)
            if c is not None:
                out.append(c)
        self.last_rv = max(self.last_rv, evs[-1].rv)
        if out:
            self.write(b"".join(out) if len(out) > 1 else out[0])

    def go_live(self):
        self.live = True
        q = self.queue
        self.queue = []
        if q:
            self.deliver(q)

    def bookmark_line(self, rv, initial_end=False):
        rt = self.st.rt
        if self.enc == "pb":
            # the cacher's bookmark: an empty object of the kind (every non-pointer
            # field at its zero value, as the marshaller writes them) with only
            # resourceVersion (and the initial-events-end annotation) set
            md = {"resourceVersion": str(rv)}
            if initial_end:
                md["annotations"] = {"k8s.io/initial-events-end": "true"}
            return pb_watch_event("BOOKMARK", self.app.pb_object(rt, (self.mode, self.table_ver, "pb"),
                                                                  d={"metadata": md}))
        if self.mode == "table":
            o = {"kind": "Table", "apiVersion": "meta.k8s.io/" + self.table_ver,
                 "metadata": {"resourceVersion": str(rv)}, "columnDefinitions": None, "rows": []}
            if initial_end:
                o["metadata"]["annotations"] = {"k8s.io/initial-events-end": "true"}
            return b'{"type":"BOOKMARK","object":%s}\n' % dumpb(o)
        if self.mode == "json" and rt.unstructured:
            # an unstructured.Unstructured with GVK and rv set: a map, keys sorted
            md = b'"resourceVersion":"%d"' % rv
            if initial_end:
                md = b'"annotations":{"k8s.io/initial-events-end":"true"},' + md
            return b'{"type":"BOOKMARK","object":{"apiVersion":"%s","kind":"%s","metadata":{%s}}}\n' % (
                rt.api_version.encode(), rt.kind.encode(), md)
        kind, apiv = (rt.kind, rt.api_version) if self.mode == "json" else \
            ("PartialObjectMetadata", "meta.k8s.io/" + self.table_ver)
        if initial_end:
            return (b'{"type":"BOOKMARK","object":{"kind":"%s","apiVersion":"%s","metadata":{"resourceVersion":"%d",'
                    b'"annotations":{"k8s.io/initial-events-end":"true"}}}}\n' % (kind.encode(), apiv.encode(), rv))
        return (b'{"type":"BOOKMARK","object":{"kind":"%s","apiVersion":"%s","metadata":{"resourceVersion":"%d"}}}\n'
                % (kind.encode(), apiv.encode(), rv))

    def send_bookmark(self, rv, initial_end=False):
        self.write(self.conn.frame(self.bookmark_line(rv, initial_end)))
        self.last_rv = max(self.last_rv, rv)

    def schedule_bookmark(self, now):
        """storage/cacher/cache_watcher.go nextBookmarkTime: every bookmark interval, but
        never later than 2 s before the watch deadline; none once that time has passed."""
        iv = self.app.args.bookmark_interval
        nb = now + iv * random.uniform(0.95, 1.05)
        if self.deadline is not None:
            pre = self.deadline - 2.0
            if pre < nb:
                nb = pre
            if nb < now:
                nb = None
        self.next_bm = nb

    def finish(self, clean=True):
        if self.closed:
            return
        self.closed = True
        self.st.watchers.discard(self)
        self.conn.watchers.discard(self)
        self.app.watch_counts[self.st.rt.plural] -= 1
        self.app.watch_enc_counts[(self.st.rt.plural, "protobuf" if self.enc == "pb" else "json")] -= 1
        if self.timer is not None:
            self.timer.cancel()
        if not self.done.done():
            self.done.set_result(clean)


# ---------------------------------------------------------------------------
# patches
# ---------------------------------------------------------------------------

def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


_SMP_KEYS = ("name", "type", "containerPort", "mountPath", "ip", "key", "port", "devicePath")


def strategic_merge_patch(target, patch):
    """A light strategic merge patch: merge-patch, but lists of objects merge by their
    usual merge key (name, type, containerPort, ...); $-directives mostly ignored."""
    if not isinstance(patch, dict):
        return patch
    if patch.get("$patch") == "replace":
        return {k: v for k, v in patch.items() if not k.startswith("$")}
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$"):
            continue
        if v is None:
            out.pop(k, None)
            continue
        cur = out.get(k)
        if isinstance(v, list) and isinstance(cur, list) and v and all(isinstance(e, dict) for e in v) and \
                all(isinstance(e, dict) for e in cur):
            mk = next((m for m in _SMP_KEYS if all(m in e for e in v)), None)
            if mk is not None:
                merged = list(cur)
                for e in v:
                    idx = next((i for i, c in enumerate(merged) if c.get(mk) == e.get(mk)), None)
                    if e.get("$patch") == "delete":
                        if idx is not None:
                            merged.pop(idx)
                    elif idx is None:
                        merged.append({kk: vv for kk, vv in e.items() if not kk.startswith("$")})
                    else:
                        merged[idx] = strategic_merge_patch(merged[idx], e)
                out[k] = merged
                continue
        out[k] = strategic_merge_patch(cur, v) if isinstance(v, dict) else v
    return out


class PatchError(Exception):
    pass


def _ptr(path):
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError("invalid JSON pointer %r" % path)
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc, ops):
    """RFC 6902 JSON patch."""
    import copy
    doc = copy.deepcopy(doc)
    if not isinstance(ops, list):
        raise PatchError("json patch must be an array")

    def parent(d, parts):
        for p in parts[:-1]:
            if isinstance(d, list):
                d = d[int(p)]
            elif isinstance(d, dict) and p in d:
                d = d[p]
            else:
                raise PatchError("doc is missing path: %s" % "/".join(parts))
        return d

    def get(d, parts):
        for p in parts:
            if isinstance(d, list):
                d = d[int(p)]
            elif isinstance(d, dict) and p in d:
                d = d[p]
            else:
                raise PatchError("doc is missing path")
        return d

    for op in ops:
        try:
            kind = op["op"]
            parts = _ptr(op["path"])
            if kind in ("add", "replace", "test"):
                val = op["value"]
            if kind == "test":
                if get(doc, parts) != val:
                    raise PatchError("testing value %s failed" % op["path"])
                continue
            if kind in ("move", "copy"):
                val = get(doc, _ptr(op["from"]))
                if kind == "move":
                    fp = _ptr(op["from"])
                    pa = parent(doc, fp)
                    if isinstance(pa, list):
                        pa.pop(int(fp[-1]))
                    else:
                        del pa[fp[-1]]
                kind = "add"
            if not parts:
                if kind == "remove":
                    raise PatchError("cannot remove root")
                doc = val
                continue
            pa = parent(doc, parts)
            last = parts[-1]
            if kind == "add":
                if isinstance(pa, list):
                    if last == "-":
                        pa.append(val)
                    else:
                        pa.insert(int(last), val)
                else:
                    pa[last] = val
            elif kind == "replace":
                if isinstance(pa, list):
                    pa[int(last)] = val
                elif last in pa:
                    pa[last] = val
                else:
                    raise PatchError("replace operation does not apply: doc is missing key: %s" % op["path"])
            elif kind == "remove":
                if isinstance(pa, list):
                    pa.pop(int(last))
                elif last in pa:
                    del pa[last]
                else:
                    raise PatchError("remove operation does not apply: doc is missing path: \"%s\"" % op["path"])
            else:
                raise PatchError("Unexpected kind: %s" % kind)
        except (KeyError, IndexError, ValueError, TypeError) as e:
            raise PatchError("invalid patch operation: %s" % e)
    return doc


# ---------------------------------------------------------------------------
# websockets (RFC 6455) for exec, and the raw echo upgrade
# ---------------------------------------------------------------------------

WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def ws_frame(opcode, payload):
    n = len(payload)
    if n < 126:
        hdr = struct.pack("!BB", 0x80 | opcode, n)
    elif n < 65536:
        hdr = struct.pack("!BBH", 0x80 | opcode, 126, n)
    else:
        hdr = struct.pack("!BBQ", 0x80 | opcode, 127, n)
    return hdr + payload


def ws_unmask(payload, mask):
    n = len(payload)
    if n == 0:
        return b""
    m = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(m, "big")).to_bytes(n, "big")


class ExecSession:
    """A fake process behind the v4/v5.channel.k8s.io websocket protocol."""

    def __init__(self, app, conn, proto, command, stdin, stdout, stderr, tty, pod_name):
        self.app = app
        self.conn = conn
        self.proto = proto
        self.command = command
        self.want_stdin, self.want_stdout, self.want_stderr, self.tty = stdin, stdout, stderr, tty
        self.pod_name = pod_name
        self.buf = bytearray()
        self.msg = bytearray()
        self.msg_op = None
        self.stdin_q = asyncio.Queue()
        self.closed = False
        self.stdin_eof = False

    # -- incoming frames --
    def feed(self, data):
        if data == b"":
            self._eof()
            return
        self.buf += data
        while True:
            b = self.buf
            if len(b) < 2:
                return
            fin = b[0] & 0x80
            op = b[0] & 0x0F
            masked = b[1] & 0x80
            n = b[1] & 0x7F
            pos = 2
            if n == 126:
                if len(b) < 4:
                    return
                n = struct.unpack("!H", b[2:4])[0]
                pos = 4
            elif n == 127:
                if len(b) < 10:
                    return
                n = struct.unpack("!Q", b[2:10])[0]
                pos = 10
            mask = b""
            if masked:
                if len(b) < pos + 4:
                    return
                mask = bytes(b[pos:pos + 4])
                pos += 4
            if len(b) < pos + n:
                return
            payload = bytes(b[pos:pos + n])
            del b[:pos + n]
            if masked:
                payload = ws_unmask(payload, mask)
            if op == 0x8:
                self._send(0x8, payload[:2] if len(payload) >= 2 else b"")
                self._eof()
                return
            if op == 0x9:
                self._send(0xA, payload)
                continue
            if op == 0xA:
                continue
            if op in (0x1, 0x2):
                self.msg = bytearray(payload)
                self.msg_op = op
            elif op == 0x0:
                self.msg += payload
            if fin:
                self._message(bytes(self.msg))
                self.msg = bytearray()

    def _message(self, m):
        if not m:
            return
        ch = m[0]
        if ch == 0:
            if len(m) > 1:
                self.stdin_q.put_nowait(m[1:])
        elif ch == 255 and self.proto.startswith("v5") and len(m) >= 2 and m[1] == 0:
            self._stdin_close()

    def _stdin_close(self):
        if not self.stdin_eof:
            self.stdin_eof = True
            self.stdin_q.put_nowait(None)

    def _eof(self):
        self._stdin_close()
        self.closed = True

    def on_close(self):
        self._eof()

    def _send(self, op, payload):
        if not self.conn.closed:
            self.conn.transport.write(ws_frame(op, payload))

    def out(self, ch, data):
        if isinstance(data, str):
            data = data.encode()
        if not data:
            return
        if ch == 2 and self.tty:
            ch = 1
        if (ch == 1 and not self.want_stdout) or (ch == 2 and not (self.want_stderr or self.tty)):
            return
        self._send(0x2, bytes([ch]) + data)

    async def read_stdin(self):
        if not self.want_stdin:
            return None
        return await self.stdin_q.get()

    # -- the fake shell --
    async def run_words(self, words):
        """Run one command; returns (exit code, error message or None)."""
        if not words:
            return 0, None
        cmd, args = words[0].rsplit("/", 1)[-1], words[1:]
        if cmd == "echo":
            nl = True
            if args and args[0] == "-n":
                nl, args = False, args[1:]
            self.out(1, " ".join(args) + ("\n" if nl else ""))
            return 0, None
        if cmd == "printf":
            self.out(1, (args[0] if args else "").replace("\\n", "\n"))
            return 0, None
        if cmd == "cat":
            if args:
                for a in args:
                    self.out(2, "cat: %s: No such file or directory\n" % a)
                return 1, None
            while True:
                chunk = await self.read_stdin()
                if chunk is None:
                    return 0, None
                self.out(1, chunk)
        if cmd == "true":
            return 0, None
        if cmd == "false":
            return 1, None
        if cmd == "exit":
            try:
                return int(args[0]) if args else 0, "exit"
            except ValueError:
                return 2, "exit"
        if cmd == "hostname":
            self.out(1, self.pod_name + "\n")
            return 0, None
        if cmd == "date":
            self.out(1, time.strftime("%a %b %d %H:%M:%S UTC %Y\n", time.gmtime()))
            return 0, None
        if cmd == "env":
            self.out(1, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nHOSTNAME=%s\n" % self.pod_name)
            return 0, None
        if cmd == "sleep":
            try:
                await asyncio.sleep(min(float(args[0]), 3600.0) if args else 0)
            except ValueError:
                return 1, None
            return 0, None
        if cmd in ("sh", "bash", "ash") and len(args) >= 2 and args[0] == "-c":
            return await self.run_script(args[1])
        return -1, cmd

    async def run_script(self, script):
        import shlex
        code = 0
        for part in re.split(r";|&&|\n", script):
            try:
                words = shlex.split(part)
            except ValueError:
                self.out(2, "sh: syntax error\n")
                return 2, "exit"
            if not words:
                continue
            code, why = await self.run_words(words)
            if code == -1:
                self.out(2, "sh: 1: %s: not found\n" % why)
                code = 127
            if why == "exit":
                return code, "exit"
        return code, "exit"

    async def run(self):
        code, why = await self.run_words(self.command)
        if code == -1:
            # containerd's failure for a missing binary, as kubelet reports it
            inner = ('error executing command in container: failed to exec in container: failed to start exec '
                     '"apisim": OCI runtime exec failed: exec failed: unable to start container process: exec: '
                     '"%s": executable file not found in $PATH: unknown' % why)
            status = {"metadata": {}, "status": "Failure", "message": "Internal error occurred: " + inner,
                      "reason": "InternalError", "details": {"causes": [{"message": inner}]}, "code": 500}
        elif code == 0:
            status = {"metadata": {}, "status": "Success"}
        else:
            # kubelet's remotecommand (v4WriteStatusFunc) with containerd's CodeExitError text
            status = {"metadata": {}, "status": "Failure",
                      "message": "command terminated with non-zero exit code: error executing command %s, exit code %d"
                                 % ("[" + " ".join(self.command) + "]", code),
                      "reason": "NonZeroExitCode",
                      "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}
        self.finish(status)

    def finish(self, status):
        self._send(0x2, b"\x03" + dumpb(status))
        self._send(0x8, struct.pack("!H", 1000))
        if not self.conn.closed:
            self.conn.closed = True
            self.conn.transport.close()


# SPDY/3 header compression dictionary (draft-mbelshe-httpbis-spdy, section 2.6.10.1):
# length-prefixed header names, then a run of common values.  kubectl <= 1.29 exec
# over SPDY/3.1 (moby/spdystream) checks its zlib DICTID.
SPDY_DICT = b"".join(struct.pack("!I", len(n)) + n.encode() for n in (
    "options head post put delete trace accept accept-charset accept-encoding accept-language accept-ranges age "
    "allow authorization cache-control connection content-base content-encoding content-language content-length "
    "content-location content-md5 content-range content-type date etag expect expires from host if-match "
    "if-modified-since if-none-match if-range if-unmodified-since last-modified location max-forwards pragma "
    "proxy-authenticate proxy-authorization range referer retry-after server te trailer transfer-encoding upgrade "
    "user-agent vary via warning www-authenticate method get status").split() +
    ["200 OK", "version", "HTTP/1.1", "url", "public", "set-cookie", "keep-alive", "origin"]) + (
    b"100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
    b"203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized"
    b"403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service Unavailable"
    b"Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT"
    b"chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,"
    b"text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.")


class SpdyExecSession(ExecSession):
    """The same fake process behind SPDY/3.1 streams (error, stdin, stdout, stderr,
    resize), as kubelet serves exec to kubectl <= 1.29."""

    def __init__(self, *a):
        super().__init__(*a)
        self.inflate = zlib.decompressobj(zdict=SPDY_DICT)
        self.deflate = zlib.compressobj(zdict=SPDY_DICT)
        self.streams = {}
        self.need = {"error"}
        if self.want_stdin:
            self.need.add("stdin")
        if self.want_stdout:
            self.need.add("stdout")
        if self.want_stderr and not self.tty:
            self.need.add("stderr")
        if self.tty:
            self.need.add("resize")
        self.ready = asyncio.Event()

    def _ctrl(self, ftype, flags, payload):
        if not self.conn.closed:
            self.conn.transport.write(struct.pack("!HHI", 0x8003, ftype, (flags << 24) | len(payload)) + payload)

    def _data(self, sid, data, fin=False):
        if not self.conn.closed:
            self.conn.transport.write(struct.pack("!II", sid & 0x7FFFFFFF, ((1 if fin else 0) << 24) | len(data)) + data)

    def feed(self, data):
        if data == b"":
            self._eof()
            return
        self.buf += data
        b = self.buf
        while len(b) >= 8:
            length = int.from_bytes(b[5:8], "big")
            if len(b) < 8 + length:
                return
            flags = b[4]
            payload = bytes(b[8:8 + length])
            control = b[0] & 0x80
            head = bytes(b[:4])
            del b[:8 + length]
            if not control:
                sid = int.from_bytes(head, "big") & 0x7FFFFFFF
                if sid == self.streams.get("stdin"):
                    if payload:
                        self.stdin_q.put_nowait(payload)
                    if flags & 1:
                        self._stdin_close()
                continue
            ftype = int.from_bytes(head[2:4], "big")
            if ftype == 1:      # SYN_STREAM
                sid = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
                hdrs = self._headers(self.inflate.decompress(payload[10:]))
                stype = hdrs.get("streamtype", "")
                self.streams[stype] = sid
                reply = self.deflate.compress(b"\x00\x00\x00\x00") + self.deflate.flush(zlib.Z_SYNC_FLUSH)
                self._ctrl(2, 0, struct.pack("!I", sid) + reply)      # SYN_REPLY, no headers
                if stype == "stdin" and flags & 1:
                    self._stdin_close()
                if self.need <= set(self.streams):
                    self.ready.set()
            elif ftype == 3:    # RST_STREAM
                sid = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
                if sid == self.streams.get("stdin"):
                    self._stdin_close()
            elif ftype == 6:    # PING
                self._ctrl(6, 0, payload)
            elif ftype == 7:    # GOAWAY
                self._eof()

    @staticmethod
    def _headers(block):
        out = {}
        try:
            n = struct.unpack("!I", block[:4])[0]
            pos = 4
            for _ in range(n):
                ln = struct.unpack("!I", block[pos:pos + 4])[0]
                name = block[pos + 4:pos + 4 + ln].decode().lower()
                pos += 4 + ln
                lv = struct.unpack("!I", block[pos:pos + 4])[0]
                out[name] = block[pos + 4:pos + 4 + lv].decode()
                pos += 4 + lv
        except (struct.error, UnicodeDecodeError):
            pass
        return out

    def out(self, ch, data):
        if isinstance(data, str):
            data = data.encode()
        if not data:
            return
        if ch == 2 and self.tty:
            ch = 1
        sid = self.streams.get("stdout" if ch == 1 else "stderr")
        if sid is not None:
            self._data(sid, data)

    async def run(self):
        try:
            await asyncio.wait_for(self.ready.wait(), 30)
        except asyncio.TimeoutError:
            self.conn.abort()
            return
        await super().run()

    def finish(self, status):
        if status.get("status") != "Success" or self.proto.startswith(("v4", "v5")):
            self._data(self.streams["error"], dumpb(status))
        for st in ("stdout", "stderr", "error"):
            if st in self.streams:
                self._data(self.streams[st], b"", fin=True)
        self._ctrl(7, 0, struct.pack("!II", 0, 0))   # GOAWAY
        if not self.conn.closed:
            self.conn.closed = True
            self.conn.transport.close()


class EchoUpgrade:
    def __init__(self, conn):
        self.conn = conn

    def feed(self, data):
        if data == b"":
            if not self.conn.closed:
                try:
                    self.conn.transport.write_eof()
                except (OSError, NotImplementedError, AttributeError, RuntimeError):
                    self.conn.transport.close()
            return
        if not self.conn.closed:
            self.conn.transport.write(data)

    def on_close(self):
        pass


# ---------------------------------------------------------------------------
# the API server
# ---------------------------------------------------------------------------

_INT64 = re.compile(r"^[+-]?[0-9]+$")
EXPIRED_LIST = "The resourceVersion for the provided list is too old."
# k8s.io/apiserver/pkg/storage/etcd3/errors.go (inconsistentContinue)
INCONSISTENT_CONTINUE = ("The provided continue parameter is too old to display a consistent list result. You can "
                         "start a new list without the continue parameter, or use the continue token in this response "
                         "to retrieve the remainder of the results. Continuing with the provided token results in an "
                         "inconsistent list - objects that were created, modified, or deleted between the time the "
                         "first chunk was returned and now may show up in the list.")
GO_VERSIONS = {"1.27": "go1.20.14", "1.28": "go1.21.13", "1.29": "go1.22.8", "1.30": "go1.22.8",
               "1.31": "go1.22.5", "1.32": "go1.23.3", "1.33": "go1.24.0"}
NAME_INVALID = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
GEN_CHARS = "bcdfghjklmnpqrstvwxz2456789"   # k8s.io/apimachinery/pkg/util/rand


def parse_int64(s):
    """strconv.ParseInt(s, 10, 64) with Go's error text (runtime/conversion.go)."""
    if not _INT64.match(s):
        raise err_bad_request('strconv.ParseInt: parsing %s: invalid syntax' % go_json_string(s))
    v = int(s)
    if v < -(1 << 63) or v >= (1 << 63):
        raise err_bad_request('strconv.ParseInt: parsing %s: value out of range' % go_json_string(s))
    return v


def parse_uint_rv(s):
    """storage.APIObjectVersioner.ParseResourceVersion -> int or the field error text."""
    if s in ("", "0"):
        return 0, None
    if not re.match(r"^[0-9]+$", s) or int(s) >= (1 << 64):
        why = "value out of range" if re.match(r"^[0-9]+$", s) else "invalid syntax"
        return None, 'resourceVersion: Invalid value: %s: strconv.ParseUint: parsing %s: %s' % (
            go_json_string(s), go_json_string(s), why)
    return int(s), None


# ---------------------------------------------------------------------------
# authentication, authorization, impersonation (only with --policy)
#
# The filter chain of k8s.io/apiserver/pkg/server/config.go DefaultBuildHandlerChain,
# outermost first: authentication (401) -> impersonation -> priority-and-fairness ->
# authorization (403) -> handler.  So a 401 and an impersonation 403/500 carry no APF
# headers; an authorization 403 does (except on long-running non-watch requests).
# ---------------------------------------------------------------------------

ALL_AUTHENTICATED = "system:authenticated"
ALL_UNAUTHENTICATED = "system:unauthenticated"
ANONYMOUS = "system:anonymous"
MASTERS = "system:masters"
# kube-apiserver's default --api-audiences: the service account issuer (kubeadm/kind)
DEFAULT_API_AUDIENCES = ["https://kubernetes.default.svc.cluster.local"]
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

# plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go: the ClusterRoles every
# cluster has, with their ClusterRoleBindings of the same name.  system:discovery is
# bound to system:authenticated only (since 1.14); system:public-info-viewer to both
# system:authenticated and system:unauthenticated.
BUILTIN_RULES = [
    {"name": "system:public-info-viewer", "groups": [ALL_AUTHENTICATED, ALL_UNAUTHENTICATED], "verbs": ["get"],
     "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"]},
    {"name": "system:discovery", "groups": [ALL_AUTHENTICATED], "verbs": ["get"],
     "nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*",
                         "/readyz", "/version", "/version/"]},
    {"name": "system:basic-user", "groups": [ALL_AUTHENTICATED], "verbs": ["create"],
     "apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]},
]


def go_quote(s):
    """strconv.Quote (fmt %q) of a string."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch in "\a\b\f\n\r\t\v":
            out.append({"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
                        "\v": "\\v"}[ch])
        elif o < 0x20 or o == 0x7f:
            out.append("\\x%02x" % o)
        elif o >= 0x80 and not ch.isprintable():
            out.append("\\u%04x" % o if o <= 0xffff else "\\U%08x" % o)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


_GO_VERB = re.compile(r"%([-+# 0]*[0-9]*(?:\.[0-9]*)?)(.?)", re.S)


def go_errorf_noargs(s):
    """fmt.Errorf(s) with no arguments, as responsewriters.Forbidden calls it on its
    message: %% is %, any other verb prints %!v(MISSING)."""
    def sub(m):
        verb = m.group(2)
        if verb == "%":
            return "%"
        if not verb:
            return "%!(NOVERB)"
        return "%!" + verb + "(MISSING)"
    return _GO_VERB.sub(sub, s)


def go_bool_flag(v):
    """A Go bool flag (strconv.ParseBool)."""
    if v in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if v in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise argparse.ArgumentTypeError("invalid boolean value %r" % v)


class UserInfo:
    __slots__ = ("name", "uid", "groups", "extra")

    def __init__(self, name, uid="", groups=(), extra=None):
        self.name = name
        self.uid = uid
        self.groups = list(groups)
        self.extra = dict(extra or {})


def with_authenticated(u):
    """authentication/group/authenticated_group_adder.go: system:authenticated added to
    every user the authenticator chain returns, unless present already."""
    if ALL_AUTHENTICATED not in u.groups:
        u.groups.append(ALL_AUTHENTICATED)
    return u


class Attrs:
    """authorizer.AttributesRecord, from request.RequestInfo for a request."""
    __slots__ = ("user", "verb", "group", "version", "resource", "sub", "ns", "name", "path", "is_resource")

    def __init__(self, user, verb, path="", group="", version="", resource="", sub="", ns="", name="",
                 is_resource=True):
        self.user, self.verb, self.path = user, verb, path
        self.group, self.version, self.resource, self.sub = group, version, resource, sub
        self.ns, self.name, self.is_resource = ns, name, is_resource


def _valid_path_segment_name(name):
    # apimachinery/pkg/api/validation/path/name.go IsValidPathSegmentName
    return name not in (".", "..") and "/" not in name and "%" not in name


def request_attrs(req, user):
    """k8s.io/apiserver/pkg/endpoints/request/requestinfo.go NewRequestInfo."""
    path = req.path
    parts = [p for p in path.strip("/").split("/")] if path.strip("/") else []
    non = Attrs(user, req.method.lower(), path=path, is_resource=False)
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return non
    prefix = parts[0]
    parts = parts[1:]
    group = ""
    if prefix == "apis":
        if len(parts) < 3:
            return non
        group = parts[0]
        parts = parts[1:]
    version = parts[0]
    parts = parts[1:]
    a = Attrs(user, "", path=path, group=group, version=version)
    if parts[0] in ("proxy", "watch"):          # specialVerbs
        if len(parts) < 2:
            return non  # kube: an error, then a non-resource request
        a.verb = parts[0]
        parts = parts[1:]
    else:
        a.verb = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch",
                  "DELETE": "delete"}.get(req.method, "")
    if parts[0] == "namespaces":
        if len(parts) > 1:
            a.ns = parts[1]
            if len(parts) > 2 and parts[2] not in ("status", "finalize"):   # namespaceSubresources
                parts = parts[2:]
    if len(parts) >= 3 and a.verb != "proxy":    # specialVerbsNoSubresources
        a.sub = parts[2]
    if len(parts) >= 2:
        a.name = parts[1]
    if len(parts) >= 1:
        a.resource = parts[0]
    if not a.name and a.verb == "get":
        watch, fname, ok = False, None, True
        q = req.query
        try:
            fs = FieldSelector(q.get("fieldSelector", ""))
            LabelSelector(q.get("labelSelector", ""))
            for k in ("limit", "timeoutSeconds"):
                if k in q:
                    parse_int64(q[k])
            fname = fs.name_value()
            watch = "watch" in q and kube_bool(q["watch"])
        except (SelectorError, ApiError):
            ok = False
            w = req.qall("watch")
            watch = bool(w) and w[0].lower() not in ("false", "0")
        a.verb = "watch" if watch else "list"
        if ok and fname is not None and _valid_path_segment_name(fname):
            a.name = fname
    if not a.name and a.verb == "delete":
        a.verb = "deletecollection"
    return a


def forbidden_error(a, reason=""):
    """responsewriters/errors.go Forbidden + forbiddenMessage, and apimachinery
    api/errors/errors.go NewForbidden(GroupResource{APIGroup, Resource}, Name, err)."""
    uname = a.user.name if a.user is not None else ""
    if not a.is_resource:
        msg = "User %s cannot %s path %s" % (go_quote(uname), a.verb, go_quote(a.path))
    else:
        res = a.resource + ("/" + a.sub if a.sub else "")
        if a.ns:
            msg = "User %s cannot %s resource %s in API group %s in the namespace %s" % (
                go_quote(uname), a.verb, go_quote(res), go_quote(a.group), go_quote(a.ns))
        else:
            msg = "User %s cannot %s resource %s in API group %s at the cluster scope" % (
                go_quote(uname), a.verb, go_quote(res), go_quote(a.group))
    msg = msg.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")   # sanitizer
    err = go_errorf_noargs(msg if not reason else "%s: %s" % (msg, reason))
    group = a.group if a.is_resource else ""
    resource = a.resource if a.is_resource else ""
    name = a.name if a.is_resource else ""
    if not group and not resource:
        message = "forbidden: " + err
    else:
        qr = resource if not group else "%s.%s" % (resource, group)
        message = ("%s is forbidden: %s" % (qr, err)) if not name else \
            ("%s %s is forbidden: %s" % (qr, go_quote(name), err))
    details = {}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    if resource:
        details["kind"] = resource
    return ApiError(403, "Forbidden", message, details, headers=[(b"X-Content-Type-Options", b"nosniff")])


def _list_all(v):
    return v is None or "*" in v


def _url_match(patterns, path):
    for p in patterns:
        if p == "*" or p == path or (p.endswith("*") and path.startswith(p[:-1])):
            return True
    return False


class TokenFile:
    """--token-file FILE: bearer tokens of an all-powerful user (as --token), one per
    line, each optionally followed by a Unix time (seconds, fractions allowed) after
    which it is refused -- a bound token's expiry. The file is read again whenever
    it changes (inode, size or mtime), so a test can add and revoke tokens while
    apisim runs (write a temporary file and rename it over)."""

    def __init__(self, path):
        self.path = path
        self.key = None
        self.tokens = {}

    def _load(self):
        try:
            st = os.stat(self.path)
        except OSError:
            self.key, self.tokens = None, {}
            return
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        if key == self.key:
            return
        tokens = {}
        with open(self.path) as f:
            for line in f:
                parts = line.split()
                if parts:
                    tokens[parts[0]] = float(parts[1]) if len(parts) > 1 else None
        self.key, self.tokens = key, tokens

    def valid(self, tok):
        self._load()
        if tok not in self.tokens:
            return False
        exp = self.tokens[tok]
        return exp is None or time.time() < exp


class Policy:
    """--policy FILE / POST /apisim/policy (see README.md)."""

    def __init__(self, doc):
        if not isinstance(doc, dict):
            raise ValueError("policy must be a JSON object")
        self.tokens = {}
        for tok, u in (doc.get("tokens") or {}).items():
            if not isinstance(u, dict) or not u.get("user"):
                raise ValueError("token entries need a user")
            self.tokens[tok] = (u["user"], str(u.get("uid", "")), [str(g) for g in u.get("groups") or []],
                                {str(k): [str(x) for x in v] for k, v in (u.get("extra") or {}).items()})
        rules = doc.get("rules") or []
        if not isinstance(rules, list):
            raise ValueError("rules must be a list")
        self.rules = []
        for i, r in enumerate(rules):
            if not isinstance(r, dict):
                raise ValueError("rule %d is not an object" % i)
            r = dict(r)
            r.setdefault("name", "apisim-rule-%d" % i)
            self.rules.append(r)
        self.audiences = list(doc.get("audiences") or DEFAULT_API_AUDIENCES)
        self.doc = doc

    def token_user(self, tok):
        t = self.tokens.get(tok)
        if t is None:
            return None
        name, uid, groups, extra = t
        return UserInfo(name, uid, groups, extra)

    @staticmethod
    def subject(rule, u):
        """The RBAC subject (kind, name) through which rule applies to u, or None.
        users and groups both absent (or "*") = everyone."""
        users, groups = rule.get("users"), rule.get("groups")
        if users is None and groups is None:
            for g in (ALL_AUTHENTICATED, ALL_UNAUTHENTICATED):
                if g in u.groups:
                    return ("Group", g)
            return ("User", u.name)
        if users is not None and ("*" in users or u.name in users):
            return ("User", u.name)
        if groups is not None:
            if "*" in groups:
                return ("Group", u.groups[0]) if u.groups else ("User", u.name)
            for g in groups:
                if g in u.groups:
                    return ("Group", g)
        return None

    @staticmethod
    def allows(rule, a):
        """rbac/rbac.go RuleAllows, plus the namespace of the binding."""
        verbs = rule.get("verbs")
        if not _list_all(verbs) and a.verb not in verbs:
            return False
        urls = rule.get("nonResourceURLs")
        if not a.is_resource:
            return urls is not None and _url_match(urls, a.path)
        if urls is not None:
            return False
        if not _list_all(rule.get("apiGroups")) and a.group not in rule["apiGroups"]:
            return False
        res = rule.get("resources")
        if not _list_all(res):
            combined = a.resource + ("/" + a.sub if a.sub else "")
            if combined not in res and not (a.sub and "*/" + a.sub in res):
                return False
        names = rule.get("resourceNames")
        if not _list_all(names) and names and a.name not in names:
            return False
        nss = rule.get("namespaces")
        if not _list_all(nss) and a.ns not in nss:
            return False
        return True

    def authorize(self, a):
        """(allowed, reason) as the union authorizer of kube-apiserver --authorization-mode
        RBAC answers: system:masters first (authorizerfactory.NewPrivilegedGroups, no
        reason), then the bootstrap roles and the policy's rules, reason
        `RBAC: allowed by ClusterRoleBinding "N" of ClusterRole "N" to User "u"`
        (rbac/rbac.go authorizingVisitor; a rule with namespaces is a RoleBinding in it)."""
        u = a.user
        if MASTERS in u.groups:
            return True, ""
        for rule in BUILTIN_RULES + self.rules:
            subj = self.subject(rule, u)
            if subj is None or not self.allows(rule, a):
                continue
            nss = rule.get("namespaces")
            who = "%s %s" % (subj[0], go_quote(subj[1]))
            if _list_all(nss):
                src = "ClusterRoleBinding %s of ClusterRole %s to %s" % (go_quote(rule["name"]),
                                                                         go_quote(rule["name"]), who)
            else:
                src = "RoleBinding %s of Role %s to %s" % (go_quote(rule["name"] + "/" + a.ns),
                                                           go_quote(rule["name"]), who)
            return True, "RBAC: allowed by " + src
        return False, ""


_IMP_EXTRA = "impersonate-extra-"


def unescape_extra_key(key):
    """impersonation.go unescapeExtraKey of the lower-cased name suffix:
    url.PathUnescape, the key as it is when an escape is malformed (a '%' not
    followed by two hex digits); the bytes decoded as UTF-8 (U+FFFD for an
    invalid byte), %00 a NUL inside the key."""
    if re.search(r"%(?![0-9a-fA-F]{2})", key):
        return key
    return unquote(key, errors="replace")


def go_text(v):
    """A header value (latin-1 text of its bytes) as the UTF-8 text a Go string
    of those bytes is."""
    return v.encode("latin-1").decode("utf-8", "replace")


def user_record(u):
    """A UserInfo as /apisim/requests records it (None stays None)."""
    if u is None:
        return None
    return {"user": u.name, "uid": u.uid, "groups": list(u.groups),
            "extra": {k: list(v) for k, v in u.extra.items()}}


def split_sa_username(name):
    """serviceaccount.SplitUsername: system:serviceaccount:NS:NAME -> (NS, NAME) or None."""
    pfx = "system:serviceaccount:"
    if not name.startswith(pfx):
        return None
    parts = name[len(pfx):].split(":")
    if len(parts) != 2:
        return None
    ns, sa = parts
    # validation.IsDNS1123Label / IsDNS1123Subdomain (Go's $ is the end of text: fullmatch)
    if len(ns) > 63 or not _DNS1123_LABEL.fullmatch(ns) or len(sa) > 253 or not _DNS1123_SUB.fullmatch(sa):
        return None
    return ns, sa


def _go_objref(kind, ns="", name="", apiv="", fieldpath=""):
    # fmt %v of a core/v1 ObjectReference value: {Kind Namespace Name UID APIVersion ResourceVersion FieldPath}
    return "{%s %s %s %s %s %s %s}" % (kind, ns, name, "", apiv, "", fieldpath)


class ImpersonationError(Exception):
    pass


REVIEWS = {("authentication.k8s.io", "v1", "tokenreviews"), ("authorization.k8s.io", "v1", "subjectaccessreviews")}


def _user_json(u):
    """authentication/v1 UserInfo: username, uid, groups, extra (all omitempty)."""
    d = {"username": u.name}
    if u.uid:
        d["uid"] = u.uid
    if u.groups:
        d["groups"] = list(u.groups)
    if u.extra:
        d["extra"] = {k: u.extra[k] for k in sorted(u.extra)}
    return d


def _fields_v1(spec):
    """The FieldsV1 set of a review's spec (structured-merge-diff: leaves and atomic
    lists are {}, an added struct pointer or map also gets "."); keys sorted."""
    out = {}
    for k, v in spec.items():
        if isinstance(v, dict):
            sub = {".": {}}
            for kk in v:
                sub["f:" + kk] = {}
            out["f:" + k] = {kk: sub[kk] for kk in sorted(sub)}
        else:
            out["f:" + k] = {}
    return {k: out[k] for k in sorted(out)}


def _prefix_from_user_agent(ua):
    """handlers/rest.go prefixFromUserAgent: the User-Agent up to its first "/",
    printable characters only, at most 128 bytes."""
    m = ua.split("/")[0]
    out, n = [], 0
    for ch in m:
        if not ch.isprintable():
            continue
        if n >= 128:
            break
        out.append(ch)
        n += len(ch.encode("utf-8", "surrogatepass"))
    return "".join(out)


def parse_accept(header):
    """github.com/munnerz/goautoneg ParseAccept, which kube's negotiation uses: the
    comma-separated clauses as (type, subtype, q, params) -- case kept, "*" read as
    "*/*", a clause without one "/" skipped, q parsed apart (unparsable: 0) -- then
    sorted by its Less (higher q first, then a specific type before "*", a specific
    subtype before "*"); Go's sort.Sort on so few elements is an insertion sort."""
    out = []
    for part in header.split(","):
        part = part.strip(" ")
        mrp = part.split(";")
        sp = mrp[0].split("/")
        typ = sp[0].strip(" ")
        if len(sp) == 1 and typ == "*":
            sub = "*"
        elif len(sp) == 2:
            sub = sp[1].strip(" ")
        else:
            continue
        q = 1.0
        params = {}
        for prm in mrp[1:]:
            kv = prm.split("=", 1)
            if len(kv) != 2:
                continue
            tok = kv[0].strip(" ")
            if tok == "q":
                try:
                    q = float(kv[1]) if kv[1] == kv[1].strip() and "_" not in kv[1] else 0.0
                except ValueError:
                    q = 0.0
            else:
                params[tok] = kv[1].strip(" ")
        out.append((typ, sub, q, params))

    def less(a, b):
        if a[2] > b[2]:
            return True
        if a[0] != "*" and b[0] == "*":
            return True
        return a[1] != "*" and b[1] == "*"
    for i in range(1, len(out)):
        j = i
        while j > 0 and less(out[j], out[j - 1]):
            out[j], out[j - 1] = out[j - 1], out[j]
            j -= 1
    return out


# The serializers of kube's CodecFactory, in order (JSON, YAML, protobuf).  apisim
# writes no YAML: a clause only YAML fits is passed over.
SERIALIZERS = (("application", "json", "json"), ("application", "yaml", None),
               ("application", "vnd.kubernetes.protobuf", "pb"))
META_GV = ("v1", "v1beta1")


def negotiate_accept(header, rt, clauses=None):
    """(mode, version, encoding) for an Accept header, or None (406).  rt None: the
    DefaultEndpointRestrictions of error answers (no conversion; any kind).  clauses:
    parse_accept's clauses to try instead of the header's."""
    for typ, sub, _q, params in (parse_accept(header) if clauses is None else clauses):
        for st, ss, enc in SERIALIZERS:
            if not ((typ == st and (sub == ss or sub == "*")) or (typ == "*" and sub == "*")):
                continue
            # negotiate.go acceptMediaTypeOptions
            conv = None
            ok = True
            for k, v in params.items():
                if k in ("as", "g", "v"):
                    conv = conv or {"as": "", "g": "", "v": ""}
                    conv[k] = v
                elif k == "stream" and v and (enc is None or v != "watch"):
                    ok = False
            if not ok or enc is None:
                continue
            if conv is None:
                if rt is not None and rt.unstructured and enc == "pb":
                    continue   # StandardSerializers of a custom resource: JSON, YAML
                return ("json", None, enc)
            if rt is None or conv["g"] != "meta.k8s.io" or conv["v"] not in META_GV:
                continue
            if conv["as"] == "Table" and enc == "json":
                return ("table", conv["v"], "json")
            if conv["as"] in ("PartialObjectMetadata", "PartialObjectMetadataList"):
                return ("meta", conv["v"], enc)
    return None


def accept_pretty(header, rt):
    """negotiate.go acceptMediaTypeOptions: options.Pretty = (pretty == "1") in the
    clause that wins the negotiation (negotiate_accept's)."""
    for c in parse_accept(header):
        if negotiate_accept(None, rt, [c]) is not None:
            return c[3].get("pretty") == "1"
    return False


CRD_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"
AUTOMANAGED = "kube-aggregator.kubernetes.io/automanaged"
CRD_NAME_KEYS = ("plural", "singular", "shortNames", "kind", "listKind", "categories")
CRD_VERSION_KEYS = ("name", "served", "storage", "deprecated", "deprecationWarning", "schema", "subresources",
                    "additionalPrinterColumns", "selectableFields")


def _ordered(d, keys):
    out = {k: d[k] for k in keys if k in d}
    out.update((k, v) for k, v in d.items() if k not in out)
    return out


def crd_names(names):
    """CustomResourceDefinitionNames as Go encodes them (plural, kind always)."""
    out = {"plural": names.get("plural", "")}
    if names.get("singular"):
        out["singular"] = names["singular"]
    if names.get("shortNames"):
        out["shortNames"] = names["shortNames"]
    out["kind"] = names.get("kind", "")
    if names.get("listKind"):
        out["listKind"] = names["listKind"]
    if names.get("categories"):
        out["categories"] = names["categories"]
    return out


def canon_crd(d):
    """A CustomResourceDefinition in its Go field order (spec, names, versions, status)."""
    sp = d.get("spec")
    if isinstance(sp, dict):
        if isinstance(sp.get("names"), dict):
            sp["names"] = crd_names(sp["names"])
        if isinstance(sp.get("versions"), list):
            sp["versions"] = [_ordered(v, CRD_VERSION_KEYS) if isinstance(v, dict) else v for v in sp["versions"]]
        d["spec"] = _ordered(sp, ("group", "names", "scope", "versions", "conversion", "preserveUnknownFields"))
    stt = d.get("status")
    if isinstance(stt, dict):
        d["status"] = _ordered(stt, ("conditions", "acceptedNames", "storedVersions"))
    return d


def crd_cond(typ, status, ts, reason, message):
    return {"type": typ, "status": status, "lastTransitionTime": ts, "reason": reason, "message": message}


def set_condition(conds, c):
    """apihelpers SetCRDCondition: replace the condition of that type (its transition time
    kept when the status did not change), else append."""
    for i, o in enumerate(conds):
        if o.get("type") == c["type"]:
            if o.get("status") == c["status"]:
                c["lastTransitionTime"] = o.get("lastTransitionTime", c["lastTransitionTime"])
            conds[i] = c
            return
    conds.append(c)


def crd_condition(d, typ):
    for c in ((d.get("status") or {}).get("conditions") or []):
        if isinstance(c, dict) and c.get("type") == typ:
            return c.get("status")
    return None


def build_apiservice(group, version, gprio, vprio, managed, ts=None):
    """A local APIService as kube-aggregator's autoregister / crdregistration controllers
    make it (spec.service absent: served by kube-apiserver itself), status Available."""
    md = {"name": "%s.%s" % (version, group), "uid": str(uuid.uuid4()), "creationTimestamp": ts or now_rfc3339(),
          "labels": {AUTOMANAGED: managed}}
    return {"kind": "APIService", "apiVersion": "apiregistration.k8s.io/v1", "metadata": md,
            "spec": {"group": group, "version": version, "groupPriorityMinimum": gprio, "versionPriority": vprio},
            "status": {"conditions": [{"type": "Available", "status": "True", "lastTransitionTime": md[
                "creationTimestamp"], "reason": "Local", "message": "Local APIServices are always available"}]}}


def apiservice_condition(a, cluster):
    """availability controller: Local, or for a service not running here ServiceNotFound
    (its Service does not exist) / MissingEndpoints."""
    now = now_rfc3339()
    svc = (a.get("spec") or {}).get("service")
    if not svc:
        return {"type": "Available", "status": "True", "lastTransitionTime": now, "reason": "Local",
                "message": "Local APIServices are always available"}
    ns, name = svc.get("namespace", ""), svc.get("name", "")
    if "%s/%s" % (ns, name) not in cluster.stores["services"].objs:
        return {"type": "Available", "status": "False", "lastTransitionTime": now, "reason": "ServiceNotFound",
                "message": 'service/%s in "%s" is not present' % (name, ns)}
    return {"type": "Available", "status": "False", "lastTransitionTime": now, "reason": "MissingEndpoints",
            "message": 'endpoints for service/%s in "%s" have no addresses with port name ""' % (name, ns)}


# kube-apiserver's APIService priorities (cmd/kube-apiserver/app/aggregator.go and
# pkg/controlplane/apiserver/aggregator.go): (GroupPriorityMinimum, VersionPriority)
BUILTIN_PRIORITY = {
    ("", "v1"): (18000, 1), ("apps", "v1"): (17800, 15), ("events.k8s.io", "v1"): (17750, 15),
    ("authentication.k8s.io", "v1"): (17700, 15), ("authorization.k8s.io", "v1"): (17600, 15),
    ("autoscaling", "v1"): (17500, 15), ("autoscaling", "v2"): (17500, 30), ("batch", "v1"): (17400, 15),
    ("certificates.k8s.io", "v1"): (17300, 15), ("networking.k8s.io", "v1"): (17200, 15),
    ("policy", "v1"): (17100, 15), ("rbac.authorization.k8s.io", "v1"): (17000, 15),
    ("storage.k8s.io", "v1"): (16800, 15), ("apiextensions.k8s.io", "v1"): (16700, 15),
    ("admissionregistration.k8s.io", "v1"): (16700, 15), ("scheduling.k8s.io", "v1"): (16600, 15),
    ("coordination.k8s.io", "v1"): (16500, 15), ("node.k8s.io", "v1"): (16300, 15),
    ("discovery.k8s.io", "v1"): (16200, 15)}


def widgets_crd(ts):
    """The CustomResourceDefinition of example.com/v1 widgets, made at start-up."""
    return {"kind": "CustomResourceDefinition", "apiVersion": "apiextensions.k8s.io/v1",
            "metadata": {"name": "widgets.example.com", "uid": str(uuid.uuid4()), "generation": 1,
                         "creationTimestamp": ts},
            "spec": {"group": "example.com",
                     "names": {"plural": "widgets", "singular": "widget", "shortNames": ["wd"], "kind": "Widget",
                               "listKind": "WidgetList"},
                     "scope": "Namespaced",
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": {"type": "object",
                                                                  "x-kubernetes-preserve-unknown-fields": True}},
                                   "subresources": {"status": {}}}],
                     "conversion": {"strategy": "None"}},
            "status": {"conditions": [
                crd_cond("NamesAccepted", "True", ts, "NoConflicts", "no conflicts found"),
                crd_cond("Established", "True", ts, "InitialNamesAccepted", "the initial names have been accepted")],
                "acceptedNames": {"plural": "widgets", "singular": "widget", "shortNames": ["wd"], "kind": "Widget",
                                  "listKind": "WidgetList"},
                "storedVersions": ["v1"]}}


_KUBE_VERSION = re.compile(r"^v([1-9][0-9]*)(?:(alpha|beta)([1-9][0-9]*))?$")


def compare_kube_versions(a, b):
    """apimachinery/pkg/version/helpers.go CompareKubeAwareVersionStrings: > 0 when a
    sorts first (GA > beta > alpha, then the higher major, then the higher minor;
    kube-like versions before others, which sort alphabetically)."""
    if a == b:
        return 0
    ma, mb = _KUBE_VERSION.match(a), _KUBE_VERSION.match(b)
    if not ma and not mb:
        return (b > a) - (b < a)
    if not ma:
        return -1
    if not mb:
        return 1
    rank = {"alpha": 0, "beta": 1, None: 2}
    ta, tb = rank[ma[2]], rank[mb[2]]
    if ta != tb:
        return ta - tb
    if int(ma[1]) != int(mb[1]):
        return int(ma[1]) - int(mb[1])
    return int(ma[3] or 0) - int(mb[3] or 0)


# customresource_discovery_controller.go: the verbs of a custom resource (in this order),
# fewer while its CRD is terminating
CRD_VERBS = ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"]
CRD_TERMINATING_VERBS = ["delete", "deletecollection", "get", "list", "watch"]


class ListOpts:
    __slots__ = ("watch", "rv", "match", "cont", "limit", "timeout", "bookmarks", "sie", "lsel", "fsel")


class App:
    def __init__(self, args, loop):
        self.args = args
        self.loop = loop
        self.cluster = Cluster(args)
        self.cluster.loop = loop
        self.conns = set()
        self.stats = collections.Counter()
        self.watch_counts = collections.Counter()
        self.watch_enc_counts = collections.Counter()   # (plural, "json"|"protobuf") -> open watches
        # protobuf: the schema of the kube version emulated (fields added in later
        # releases are left out)
        self.pb = PbSchema(PB_SCHEMA + generic_pb_schema(), int(args.version.split(".")[1]))
        self.status_tm = pb_typemeta("v1", "Status")
        self.fails = []
        self.token_file = TokenFile(args.token_file) if args.token_file else None
        self.churn = None
        self.churn_task = None
        self.port = 0
        self.host = "127.0.0.1"
        self.cluster.on_discovery_change = self.discovery_changed
        self.crd_cleaning = set()
        self.disc_cache = {}
        self.rebuild_routes()
        # the groups kube-apiserver serves itself (go-restful): an unknown path under
        # them is a 404 Status; under any other group it is http.NotFound's text
        self.builtin_groups = {t.group for t in self.cluster.types if not t.unstructured} | {
            "authentication.k8s.io", "authorization.k8s.io"}
        self.builtin_gvs = {(t.group, t.version) for t in self.cluster.types if not t.unstructured}
        wl = args.watch_list
        if wl == "auto":
            wl = "on" if args.version == "1.32" else "off"
        self.watchlist_enabled = wl in ("on", "accept")
        self.watchlist_defaulting = wl == "on"
        self.started = time.time()
        # GET /apisim/requests: the heads of the latest non-/apisim requests, so a
        # test can check what a proxy in front passed on (or did not)
        self.seen = collections.deque(maxlen=max(1, getattr(args, "recent_requests", RECENT_REQUESTS)))
        self.seen_seq = 0
        # --policy: kube's authentication, impersonation and authorization (see Policy)
        self.hanging_reviews = {"started": 0, "open": 0, "closed_by_client": 0}
        self.policy = None
        if args.policy:
            with open(args.policy) as f:
                self.policy = Policy(json.load(f))

    def log(self, msg):
        sys.stderr.write("apisim: %s\n" % msg)
        sys.stderr.flush()

    # -- entry point --------------------------------------------------------
    def dispatch(self, req, conn):
        if self.args.log_requests:
            self.log("%s %s" % (req.method, req.target))
        path = req.path
        if path.startswith("/apisim/"):
            return self.control(req, conn)
        self.seen_seq += 1
        head = self.request_head(req)
        self.seen.append(head)
        if self.policy is not None:
            if not self.guard(req, conn, head):
                return None
        elif not self.authenticate(req, conn) and path not in ("/version", "/healthz", "/livez", "/readyz"):
            # k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go (401 Unauthorized)
            self.stats["unauthorized"] += 1
            conn.apf = False
            conn.respond_error(ApiError(401, "Unauthorized", "Unauthorized"), req)
            return None
        if self.fails:
            r = self.inject_failure(req, conn)
            if r is not False:
                return r
        return self.route(req, conn)

    def request_head(self, req):
        """What GET /apisim/requests shows of a request: its head, the Authorization
        value reduced to its scheme (the credential is never kept), whether there was one,
        and the Impersonate-* headers one by one (a repeated Impersonate-Group apart)."""
        headers = dict(req.headers)
        auth = headers.get("authorization")
        if auth is not None:
            headers["authorization"] = auth.split(" ", 1)[0] + " <redacted>" if auth.strip() else ""
        return {"seq": self.seen_seq, "method": req.method, "target": req.target, "version": req.version,
                "headers": headers, "authorization": auth is not None,
                "impersonate": [[k, v] for k, v in req.hlist if k.startswith("impersonate-")]}

    # -- --policy: authentication, impersonation, authorization ------------------
    def guard(self, req, conn, head):
        """The filters of DefaultBuildHandlerChain in their order; False when one of them
        answered the request. head (the request's /apisim/requests record) gets who
        asked and as whom the request ran: "requestor" (the authenticated user, None
        after a 401), "user" (the user after impersonation -- the requestor when no
        Impersonate-* header asks for another --, None when authentication or
        impersonation refused the request) and "authorized" (the authorization
        filter's decision, None when it was not reached)."""
        head["requestor"] = head["user"] = head["authorized"] = None
        u = self.authn(req, conn)
        head["requestor"] = user_record(u)
        if u is None:
            # filters/authentication.go Unauthorized: NewUnauthorized("Unauthorized"), before APF
            self.stats["unauthorized"] += 1
            conn.apf = False
            conn.respond_error(ApiError(401, "Unauthorized", "Unauthorized"), req)
            return False
        try:
            u = self.impersonate(req, conn, u)
        except ImpersonationError:
            return False
        head["user"] = user_record(u)
        a = request_attrs(req, u)
        ok, reason = self.policy.authorize(a)
        head["authorized"] = ok
        if not ok:
            # filters/authorization.go -> responsewriters.Forbidden; inside APF, which skips
            # long-running non-watch requests (server/filters/longrunning.go)
            if a.verb == "proxy" or a.sub in ("log", "exec", "attach", "portforward", "proxy"):
                conn.apf = False
            self.stats["forbidden"] += 1
            conn.respond_error(forbidden_error(a, reason), req)
            return False
        return True

    def token_user(self, tok):
        """The bearer-token authenticators: --token and --token-file (user admin in
        system:masters), then the policy's tokens; the group adder puts
        system:authenticated last."""
        if (self.args.token and tok == self.args.token) or (self.token_file and self.token_file.valid(tok)):
            return with_authenticated(UserInfo("admin", "", [MASTERS]))
        u = self.policy.token_user(tok)
        return with_authenticated(u) if u is not None else None

    def bearer(self, auth):
        """authentication/request/bearertoken/bearertoken.go: (token or None)."""
        auth = auth.strip()
        if not auth:
            return None
        parts = auth.split(" ", 2)
        if len(parts) < 2 or parts[0].lower() != "bearer" or not parts[1]:
            return None
        return parts[1]

    def authn(self, req, conn):
        """The request authenticator of pkg/kubeapiserver/authenticator/config.go: x509
        client certificates, then bearer tokens (a token nobody knows is an error: 401,
        never anonymous), then anonymous when --anonymous-auth."""
        if self.args.client_ca and conn.peer_cert:
            # authentication/request/x509/x509.go CommonNameUserConversion
            cn, orgs = "", []
            for rdn in conn.peer_cert.get("subject", ()):
                for k, v in rdn:
                    if k == "commonName":
                        cn = v
                    elif k == "organizationName":
                        orgs.append(v)
            if cn:
                return with_authenticated(UserInfo(cn, "", orgs))
        first = next((v for k, v in req.hlist if k == "authorization"), "")
        tok = self.bearer(first)
        if tok is not None:
            return self.token_user(tok)
        if self.args.anonymous_auth:
            return UserInfo(ANONYMOUS, "", [ALL_UNAUTHENTICATED])
        return None

    def impersonate(self, req, conn, requestor):
        """endpoints/filters/impersonation.go WithImpersonation (1.31)."""
        # Go strings are the header's bytes: UTF-8 text here (what Go's JSON and
        # fmt show of them; an invalid byte is U+FFFD, as encoding/json writes it)
        hl = [(k, go_text(v)) for k, v in req.hlist if k.startswith("impersonate-")]
        if not hl:
            return requestor
        # headers.Get: the first value, even an empty one (then no user / no uid)
        users = [v for k, v in hl if k == "impersonate-user"]
        ruser = users[0] if users else ""
        groups_h = [v for k, v in hl if k == "impersonate-group"]
        # `for headerName, values := range headers`: one header name at a time
        # (Go map order; here the order names first appear), its values in order
        by_name = {}
        for k, v in hl:
            if k.startswith(_IMP_EXTRA):
                by_name.setdefault(k, []).append(v)
        extras = []
        for k, vs in by_name.items():
            extras += [(unescape_extra_key(k[len(_IMP_EXTRA):]), v) for v in vs]
        uids = [v for k, v in hl if k == "impersonate-uid"]
        ruid = uids[0] if uids else ""
        reqs = []
        if ruser:
            sa = split_sa_username(ruser)
            reqs.append(("ServiceAccount", sa[0], sa[1], "", "") if sa else ("User", "", ruser, "", ""))
        reqs += [("Group", "", g, "", "") for g in groups_h]
        reqs += [("UserExtra", "", v, "authentication.k8s.io/v1", k) for k, v in extras]
        if ruid:
            reqs.append(("UID", "", ruid, "authentication.k8s.io/v1", ""))
        if not reqs:
            return requestor
        if (groups_h or extras or ruid) and not ruser:
            # buildImpersonationRequests' error -> responsewriters.InternalError: http.Error
            # (text/plain, nosniff, a newline) of the sanitized
            # `Internal Server Error: %q: requested %v without impersonating a user`
            text = "Internal Server Error: %s: requested [%s] without impersonating a user" % (
                go_quote(req.target), " ".join(_go_objref(*r) for r in reqs))
            text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            conn.apf = False
            conn.respond(500, text.encode() + b"\n", req, ctype=b"text/plain; charset=utf-8",
                         extra=[(b"X-Content-Type-Options", b"nosniff")])
            raise ImpersonationError()
        username, groups, extra, uid = "", [], {}, ""
        for kind, ns, name, apiv, fp in reqs:
            at = Attrs(requestor, "impersonate", path=req.path, ns=ns, name=name)
            if kind == "ServiceAccount":
                at.resource = "serviceaccounts"
                username = "system:serviceaccount:%s:%s" % (ns, name)
                if not groups_h:
                    groups = ["system:serviceaccounts", "system:serviceaccounts:" + ns]
            elif kind == "User":
                at.resource = "users"
                username = name
            elif kind == "Group":
                at.resource = "groups"
                groups.append(name)
            elif kind == "UserExtra":
                at.group, at.version, at.resource, at.sub = "authentication.k8s.io", "v1", "userextras", fp
                extra.setdefault(fp, []).append(name)
            else:
                at.group, at.version, at.resource = "authentication.k8s.io", "v1", "uids"
                uid = name
            ok, reason = self.policy.authorize(at)
            if not ok:
                conn.apf = False   # impersonation runs before APF
                self.stats["forbidden"] += 1
                conn.respond_error(forbidden_error(at, reason), req)
                raise ImpersonationError()
        if username != ANONYMOUS:
            if ALL_AUTHENTICATED not in groups and ALL_UNAUTHENTICATED not in groups:
                groups.append(ALL_AUTHENTICATED)
        elif ALL_UNAUTHENTICATED not in groups:
            groups.append(ALL_UNAUTHENTICATED)
        return UserInfo(username, uid, groups, extra)

    def authenticate(self, req, conn):
        a = self.args
        if not a.token and not a.client_ca and not self.token_file:
            return True
        if a.token and req.headers.get("authorization", "") == "Bearer " + a.token:
            return True
        auth = req.headers.get("authorization", "")
        if self.token_file and auth.startswith("Bearer ") and self.token_file.valid(auth[7:]):
            return True
        if a.client_ca and conn.peer_cert:
            return True
        return False

    def inject_failure(self, req, conn):
        for rule in self.fails:
            if rule["count"] > 0 and rule.get("match", "") in req.target:
                rule["count"] -= 1
                if rule["count"] <= 0:
                    self.fails.remove(rule)
                mode = rule.get("mode", "status")
                self.stats["injected " + mode] += 1
                if mode == "reset":
                    conn.abort()
                    return None
                if mode == "hang":
                    return self._hang()
                if mode == "delay":
                    return self._delayed(req, conn, float(rule.get("delay", 1.0)))
                code = int(rule.get("status", 503))
                extra = [(b"Retry-After", b"1")] if code in (429, 503) else []
                conn.respond_error(ApiError(code, STATUS_REASON.get(code, ""),
                                            "apisim: injected failure (%d)" % code, headers=extra), req)
                return None
        return False

    async def _hang(self):
        await self.loop.create_future()

    async def _delayed(self, req, conn, delay):
        await asyncio.sleep(delay)
        r = self.route(req, conn)
        if r is not None:
            await r

    # -- routing ------------------------------------------------------------
    def route(self, req, conn):
        path = req.path
        parts = [p for p in path.split("/") if p]
        m = req.method
        if not parts:
            # server/routes/index.go: the listed paths, sorted
            groups = self.legacy_groups()
            return self.reply(req, conn, {"paths": sorted(["/api", "/api/v1", "/apis", "/apis/"] +
                                          ["/apis/%s" % g for g, _ in groups] +
                                          ["/apis/%s/%s" % (g, v) for g, vs in groups for v in vs] +
                                          ["/healthz", "/livez", "/readyz", "/version"])}, "raw")
        head = parts[0]
        if head == "openapi" and len(parts) >= 2 and parts[1] == "v3":
            return self.openapi_v3(req, conn, parts[2:])
        if head in ("openapi", "swagger-2.0.0.pb-v1") and (parts[-1] in ("v2", "swagger-2.0.0.pb-v1")) \
                and len(parts) <= 2:
            return self.openapi_v2(req, conn)
        if head == "version" and len(parts) == 1:
            return self.reply(req, conn, self.version_info(), "raw")
        if head in ("healthz", "livez", "readyz"):
            conn.respond(200, b"ok", req, ctype=b"text/plain; charset=utf-8")
            return None
        if head == "api":
            if len(parts) == 1:
                agg = self.negotiate_discovery(req)
                if agg:
                    return self.serve_aggregated(req, conn, "api", agg)
                return self.reply(req, conn, {"kind": "APIVersions", "versions": ["v1"],
                                              "serverAddressByClientCIDRs": [
                                                  {"clientCIDR": "0.0.0.0/0",
                                                   "serverAddress": "%s:%d" % (self.host, self.port)}]})
            if parts[1] != "v1":
                raise ERR_NOT_FOUND_PATH
            if len(parts) == 2:
                return self.reply(req, conn, self.resource_list("", "v1"))
            return self.resource(req, conn, "", "v1", parts[2:])
        if head == "apis":
            if len(parts) == 1:
                agg = self.negotiate_discovery(req)
                if agg:
                    return self.serve_aggregated(req, conn, "apis", agg)
                return self.reply(req, conn, {"kind": "APIGroupList", "apiVersion": "v1",
                                              "groups": [self.group_info(g, vs) for g, vs in self.legacy_groups()]})
            g = parts[1]
            if self.policy is not None and len(parts) == 4 and (g, parts[2], parts[3]) in REVIEWS:
                return self.review(req, conn, g, parts[3])
            if g in self.builtin_groups:
                # go-restful's web services: /apis/G and /apis/G/V of the built-in groups
                # (served whatever the APIServices say)
                vs = sorted((v for g2, v in self.builtin_gvs if g2 == g), key=lambda v: -BUILTIN_PRIORITY.get(
                    (g, v), (0, 0))[1])
                if not vs:
                    raise ERR_NOT_FOUND_PATH
                if len(parts) == 2:
                    return self.reply(req, conn, self.api_group(g, vs))
                if parts[2] not in vs:
                    raise ERR_NOT_FOUND_PATH
                if len(parts) == 3:
                    return self.reply(req, conn, self.resource_list(g, parts[2]))
                return self.resource(req, conn, g, parts[2], parts[3:])
            # the aggregator, then apiextensions' crdHandler, then http.NotFound
            groups = dict(self.legacy_groups())
            remote = self.remote_gvs()
            if len(parts) >= 3 and (g, parts[2]) in remote:
                # kube-aggregator handler_proxy.go: an APIService whose service is not
                # Available: proxyError(w, req, "service unavailable", 503) (http.Error)
                conn.respond(503, b"service unavailable\n", req, ctype=b"text/plain; charset=utf-8",
                             extra=[(b"X-Content-Type-Options", b"nosniff")])
                return None
            if len(parts) == 2 and g in groups:
                return self.reply(req, conn, self.api_group(g, groups[g]))
            if len(parts) == 3 and parts[2] in groups.get(g, ()) and (g, parts[2]) not in remote:
                return self.reply(req, conn, self.resource_list(g, parts[2]))
            if len(parts) >= 4 and self.cr_route(g, parts[2], parts[3:]) is not None:
                return self.resource(req, conn, g, parts[2], parts[3:])
            return self.page_not_found(req, conn)
        raise ERR_NOT_FOUND_PATH

    # -- discovery --------------------------------------------------------------
    def rebuild_routes(self):
        self.routes = {(t.group, t.version, t.plural): t for t in self.cluster.types}
        self.discovery_changed()

    def discovery_changed(self):
        self.disc_cache = {}

    def apiservices(self):
        """The APIService objects (dicts), cached until an APIService or a type changes."""
        r = self.disc_cache.get("apiservices")
        if r is None:
            st = self.cluster.stores["apiservices"]
            r = self.disc_cache["apiservices"] = [json.loads(st.objs[k].data) for k in st.keys]
        return r

    def remote_gvs(self):
        """(group, version) of the APIServices with spec.service (aggregated APIs)."""
        r = self.disc_cache.get("remote")
        if r is None:
            r = self.disc_cache["remote"] = {((a.get("spec") or {}).get("group", ""),
                                              (a.get("spec") or {}).get("version", ""))
                                             for a in self.apiservices() if (a.get("spec") or {}).get("service")}
        return r

    def legacy_groups(self):
        """[(group, [versions])] as the aggregator's /apis lists them (handler_apis.go):
        apiregistration.k8s.io first, then the groups of the APIServices sorted by
        apiregistration/v1 helpers.go SortedByGroupAndVersion (GroupPriorityMinimum
        highest first, then the APIService name; in a group VersionPriority highest
        first, then kube-aware version order); the legacy group "" left out."""
        r = self.disc_cache.get("legacy")
        if r is not None:
            return r
        svcs = []
        for a in self.apiservices():
            sp = a.get("spec") or {}
            svcs.append((-_pb_int(sp.get("groupPriorityMinimum")), a["metadata"]["name"], sp.get("group", ""),
                         sp.get("version", ""), _pb_int(sp.get("versionPriority"))))
        svcs.sort(key=lambda x: (x[0], x[1]))
        order = []
        by_group = {}
        for _p, _n, g, v, vp in svcs:
            if g not in by_group:
                by_group[g] = []
                order.append(g)
            by_group[g].append((vp, v))
        r = [("apiregistration.k8s.io", ["v1"])]
        for g in order:
            if g in ("", "apiregistration.k8s.io"):
                continue
            vs = sorted(by_group[g], key=functools.cmp_to_key(
                lambda a, b: (b[0] - a[0]) or -compare_kube_versions(a[1], b[1])))
            r.append((g, [v for _vp, v in vs]))
        self.disc_cache["legacy"] = r
        return r

    def discovery_entries(self, group, version):
        """[(rt, [(sub or None, kind, verbs, group, version)])] of a local group version,
        by resource name; subresources by name (installer.go sorts the storage paths).
        Custom resources: the verbs of customresource_discovery_controller.go."""
        out = []
        for t in sorted((t for t in self.cluster.types if t.group == group and t.version == version),
                        key=lambda t: t.plural):
            if t.crd is not None:
                term = self.crd_terminating(t.crd)
                verbs = CRD_TERMINATING_VERBS if term else CRD_VERBS
            else:
                verbs = t.verbs
            ent = [(None, t.kind, verbs, "", "")]
            for sub in sorted(t.subresources):
                v = t.subresources[sub]
                kind, sverbs = v[0], v[1]
                sg, sv = (v[2], v[3]) if len(v) > 2 else (("autoscaling", "v1") if kind == "Scale" else ("", ""))
                ent.append((sub, kind, sverbs, sg, sv))
            out.append((t, ent))
        return out

    def negotiate_discovery(self, req):
        """The aggregated discovery version an Accept header asks for, or None (the plain
        documents): discovery/aggregated/wrapper.go negotiates with
        DiscoveryEndpointRestrictions, which accept a clause only when it converts to
        apidiscovery.k8s.io/<v> APIGroupDiscoveryList (a clause without as/g/v is not
        acceptable there), stream=watch allowed, sv= refused; the first acceptable clause
        in goautoneg's order decides.  v2beta1 from 1.26 (beta, on from 1.27), v2 from
        1.30, v2beta1 no longer served from 1.33 (AggregatedDiscoveryRemoveBetaType).
        apisim writes neither YAML nor protobuf discovery: those clauses are passed over."""
        acc = req.headers.get("accept", "")
        if not acc:
            return None
        minor = int(self.args.version.split(".")[1])
        allowed = ("v2beta1",) if minor < 30 else ("v2", "v2beta1") if minor < 33 else ("v2",)
        for typ, sub, _q, params in parse_accept(acc):
            for st, ss, enc in SERIALIZERS:
                if not ((typ == st and (sub == ss or sub == "*")) or (typ == "*" and sub == "*")):
                    continue
                conv = None
                ok = True
                for k, v in params.items():
                    if k in ("as", "g", "v"):
                        conv = conv or {"as": "", "g": "", "v": ""}
                        conv[k] = v
                    elif k == "stream" and v and (enc is None or v != "watch"):
                        ok = False
                    elif k == "sv" and v:
                        ok = False
                if not ok or conv is None or conv["g"] != "apidiscovery.k8s.io" or \
                        conv["as"] != "APIGroupDiscoveryList" or conv["v"] not in allowed:
                    continue
                if enc != "json":
                    continue
                return conv["v"]
        return None

    def aggregated(self, root):
        """(APIGroupDiscoveryList items, ETag) for /api or /apis (endpoints/discovery/
        aggregated/handler.go): groups by their highest GroupPriorityMinimum then name
        (apiregistration.k8s.io first, as the aggregator adds its own group), versions
        by VersionPriority then kube-aware order; resources as
        ConvertGroupVersionIntoToDiscovery builds them from the plain lists (responseKind
        group/version empty but for subresources of another group), custom resources as
        the apiextensions discovery controller does (responseKind with group and version);
        an aggregated APIService's version with freshness Stale and no resources.  The
        ETag is the upper-case hex SHA-512 of json.Marshal of the list without TypeMeta
        (etag.go calculateETag)."""
        r = self.disc_cache.get("agg-" + root)
        if r is not None:
            return r
        if root == "api":
            items = [{"metadata": {"creationTimestamp": None}, "versions": [self.aggregated_version("", "v1")]}]
        else:
            prio = {}
            vprio = {}
            for a in self.apiservices():
                sp = a.get("spec") or {}
                g, v = sp.get("group", ""), sp.get("version", "")
                if not g:
                    continue
                prio[g] = max(prio.get(g, 0), _pb_int(sp.get("groupPriorityMinimum")))
                vprio[(g, v)] = _pb_int(sp.get("versionPriority"))
            prio["apiregistration.k8s.io"] = 1 << 30
            vprio[("apiregistration.k8s.io", "v1")] = 15
            groups = {}
            for (g, v) in vprio:
                groups.setdefault(g, []).append(v)
            items = []
            for g in sorted(groups, key=lambda g: (-prio[g], g)):
                vs = sorted(groups[g], key=functools.cmp_to_key(
                    lambda a, b: (vprio[(g, b)] - vprio[(g, a)]) or -compare_kube_versions(a, b)))
                items.append({"metadata": {"name": g, "creationTimestamp": None},
                              "versions": [self.aggregated_version(g, v) for v in vs]})
        etag = hashlib.sha512(dumpb({"metadata": {}, "items": items})).hexdigest().upper()
        r = self.disc_cache["agg-" + root] = (items, etag)
        return r

    def aggregated_version(self, g, v):
        if (g, v) in self.remote_gvs():
            return {"version": v, "freshness": "Stale"}
        res = []
        for t, ent in self.discovery_entries(g, v):
            cr = t.crd is not None
            e = {"resource": t.plural,
                 "responseKind": {"group": g if cr else "", "version": v if cr else "", "kind": t.kind},
                 "scope": "Namespaced" if t.namespaced else "Cluster", "singularResource": t.singular,
                 "verbs": ent[0][2]}
            if t.short:
                e["shortNames"] = t.short
            if t.categories:
                e["categories"] = t.categories
            subs = []
            for sub, kind, verbs, sg, sv in ent[1:]:
                if cr and not sg:
                    sg, sv = g, v
                subs.append({"subresource": sub, "responseKind": {"group": sg, "version": sv, "kind": kind},
                             "verbs": verbs})
            if subs:
                e["subresources"] = subs
            res.append(e)
        out = {"version": v}
        if res:
            out["resources"] = res
        out["freshness"] = "Current"
        return out

    def serve_aggregated(self, req, conn, root, ver):
        """etag.go ServeHTTPWithETag: ETag (quoted), Vary: Accept, Cache-Control: public;
        If-None-Match equal to the quoted ETag: 304, no body; else the document through
        WriteObjectNegotiated with the GVK in the Content-Type."""
        if req.method not in ("GET", "HEAD"):
            raise ERR_METHOD
        items, etag = self.aggregated(root)
        qetag = ('"%s"' % etag).encode()
        conn.cc = b"public"
        extra = [(b"Etag", qetag), (b"Vary", b"Accept")]
        self.stats["discovery aggregated " + root] += 1
        if req.headers.get("if-none-match") == qetag.decode():
            conn.respond(304, b"", req, ctype=None, extra=extra, nolength=True)
            return None
        ctype = ("application/json;g=apidiscovery.k8s.io;v=%s;as=APIGroupDiscoveryList" % ver).encode()
        body = dumpb({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/" + ver, "metadata": {},
                      "items": items}) + b"\n"
        conn.respond_api(200, body, req, ctype=ctype, extra=extra, pretty=self.discovery_pretty(req))
        return None

    def discovery_pretty(self, req):
        acc = req.headers.get("accept", "")
        for c in parse_accept(acc):
            if c[3].get("g") == "apidiscovery.k8s.io":
                return c[3].get("pretty") == "1" or is_pretty_print(req)
        return is_pretty_print(req)

    # -- CustomResourceDefinitions and APIServices ---------------------------------
    def crd_dicts(self):
        r = self.disc_cache.get("crds")
        if r is None:
            st = self.cluster.stores["customresourcedefinitions"]
            r = self.disc_cache["crds"] = {k: json.loads(st.objs[k].data) for k in st.keys}
        return r

    def crd_terminating(self, name):
        d = self.crd_dicts().get(name)
        return d is not None and crd_condition(d, "Terminating") == "True"

    def post_write(self, rt):
        """After an API write: CRDs and APIServices drive what is served (the controllers
        of apiextensions-apiserver and kube-aggregator, run at once)."""
        if rt.key in ("customresourcedefinitions", "apiservices"):
            self.reconcile()

    def reconcile(self):
        cl = self.cluster
        cst = cl.stores["customresourcedefinitions"]
        now = now_rfc3339()
        # naming + establishing controllers: a new CRD gets its accepted names
        # (NamesAccepted True, Established False "Installing"), then Established True
        for name in list(cst.keys):
            prev = cst.objs[name]
            d = prev.dict()
            stt = d.setdefault("status", {})
            if crd_condition(d, "NamesAccepted") is None and not d["metadata"].get("deletionTimestamp"):
                stt["acceptedNames"] = crd_names(d["spec"].get("names") or {})
                stt["conditions"] = [
                    crd_cond("NamesAccepted", "True", now, "NoConflicts", "no conflicts found"),
                    crd_cond("Established", "False", now, "Installing", "the initial names have been accepted")]
                prev = cl.store_update(cst, canon_crd(d), prev)
                d = prev.dict()
                set_condition(d["status"]["conditions"],
                              crd_cond("Established", "True", now, "InitialNamesAccepted",
                                       "the initial names have been accepted"))
                cl.store_update(cst, canon_crd(d), prev)
            if d["metadata"].get("deletionTimestamp") and CRD_FINALIZER in (d["metadata"].get("finalizers") or []) \
                    and name not in self.crd_cleaning:
                self.crd_cleaning.add(name)
                self.loop.call_soon(self.crd_cleanup, name)
        # what the CRDs serve
        want = {}
        for name, d in self.crd_dicts().items():
            if crd_condition(d, "Established") != "True" and crd_condition(d, "NamesAccepted") != "True":
                continue
            sp = d.get("spec") or {}
            names = (d.get("status") or {}).get("acceptedNames") or sp.get("names") or {}
            for v in sp.get("versions") or []:
                if v.get("served"):
                    want[(sp.get("group", ""), v.get("name", ""), names.get("plural", ""))] = (name, d, v)
        changed = False
        for t in [t for t in cl.types if t.unstructured]:
            w = want.get((t.group, t.version, t.plural))
            if w is None:
                cl.remove_store(cl.stores[t.key])
                changed = True
            else:
                self.update_cr_type(t, *w)
        by_crd = {}
        for t in cl.types:
            if t.unstructured:
                by_crd.setdefault(t.crd, []).append(cl.stores[t.key])
        for gvr in sorted(want):
            if gvr in {(t.group, t.version, t.plural) for t in cl.types if t.unstructured}:
                continue
            name, d, v = want[gvr]
            rt = self.cr_type(name, d, v)
            like = (by_crd.get(name) or [None])[0]
            st = cl.add_store(rt, like)
            by_crd.setdefault(name, []).append(st)
            changed = True
        for sts in by_crd.values():
            cl.link_versions(sts)
        # crdregistration_controller.go: an APIService per served CRD group version
        # (automanaged "true"), removed with it; availability for the others
        ast = cl.stores["apiservices"]
        want_gv = {(g, v) for (g, v, _p) in want if (g, v) not in self.builtin_gvs}
        for key in list(ast.keys):
            prev = ast.objs[key]
            a = prev.dict()
            sp = a.get("spec") or {}
            gv = (sp.get("group", ""), sp.get("version", ""))
            if (a["metadata"].get("labels") or {}).get(AUTOMANAGED) == "true" and gv not in want_gv:
                cl.store_delete(ast, prev)
                continue
            if not (a.get("status") or {}).get("conditions"):
                a["status"] = {"conditions": [apiservice_condition(a, self.cluster)]}
                cl.store_update(ast, a, prev)
        for g, v in sorted(want_gv):
            key = "%s.%s" % (v, g)
            if key not in ast.objs:
                cl.store_new(ast, build_apiservice(g, v, 1000, 100, "true"))
        if changed:
            self.rebuild_routes()

    def crd_cleanup(self, name):
        """finalizer/crd_finalizer.go: Terminating "InstanceDeletionInProgress", every
        custom resource deleted, then the finalizer removed, which deletes the CRD (its
        DELETED event carries the last stored state); then its storage stops (open watches
        end cleanly), its APIServices go and discovery no longer lists it."""
        self.crd_cleaning.discard(name)
        cl = self.cluster
        cst = cl.stores["customresourcedefinitions"]
        prev = cst.objs.get(name)
        if prev is None:
            return
        d = prev.dict()
        set_condition(d.setdefault("status", {}).setdefault("conditions", []),
                      crd_cond("Terminating", "True", now_rfc3339(), "InstanceDeletionInProgress",
                               "CustomResource deletion is in progress"))
        prev = cl.store_update(cst, canon_crd(d), prev)
        for t in list(cl.types):
            if t.crd == name and t.key in cl.stores:
                st = cl.stores[t.key]
                for k in list(st.keys):
                    if k in st.objs:
                        cl.store_delete(st, st.objs[k])
                break
        cl.store_delete(cst, prev)
        self.reconcile()

    def update_cr_type(self, t, name, d, v):
        names = (d.get("status") or {}).get("acceptedNames") or d["spec"].get("names") or {}
        t.crd = name
        t.short = list(names.get("shortNames") or [])
        t.categories = list(names.get("categories") or [])
        subs = v.get("subresources") or {}
        t.subresources = {}
        if "status" in subs:
            t.subresources["status"] = (t.kind, ["get", "patch", "update"])
        if "scale" in subs:
            t.subresources["scale"] = ("Scale", ["get", "patch", "update"])
        t.has_status = "status" in subs
        storage = next((x.get("name") for x in d["spec"].get("versions") or [] if x.get("storage")), t.version)
        t.storage_hash = storage_version_hash(t.group, storage, t.kind)

    def cr_type(self, name, d, v):
        sp = d["spec"]
        names = (d.get("status") or {}).get("acceptedNames") or sp.get("names") or {}
        plural, group, version = names.get("plural", ""), sp.get("group", ""), v.get("name", "")
        widgets = (plural, group, version) == ("widgets", "example.com", "v1")
        key = "widgets" if widgets else "%s.%s/%s" % (plural, group, version)
        rt = RType(plural, names.get("singular") or names.get("kind", "").lower(), names.get("kind", ""), group,
                   version, sp.get("scope") == "Namespaced", [], [], {}, None, "cr",
                   build_widget if widgets else None, verbs=CRD_VERBS, key=key)
        if not widgets:
            rt.builder = functools.partial(generic_builder, rt)
        self.update_cr_type(rt, name, d, v)
        return rt

    def crd_delete(self, req, conn, rt, st, prev):
        """apiextensions registry customresourcedefinition/etcd.go Delete: the first DELETE
        sets deletionTimestamp, the customresourcecleanup finalizer and Terminating True
        "InstanceDeletionPending" (and the generic store's deletionGracePeriodSeconds 0)
        and answers the CRD so marked; the cleanup follows (crd_cleanup)."""
        d = prev.dict()
        md = d["metadata"]
        obj = prev
        if not md.get("deletionTimestamp"):
            md["deletionTimestamp"] = now_rfc3339()
            md["deletionGracePeriodSeconds"] = 0
            fin = md.setdefault("finalizers", [])
            if CRD_FINALIZER not in fin:
                fin.append(CRD_FINALIZER)
            set_condition(d.setdefault("status", {}).setdefault("conditions", []),
                          crd_cond("Terminating", "True", now_rfc3339(), "InstanceDeletionPending",
                                   "CustomResourceDefinition marked for deletion; CustomResource deletion will "
                                   "begin soon"))
            if not self.dry_run(req):
                obj = self.cluster.store_update(st, canon_crd(d), prev)
                self.reconcile()
            else:
                self.respond_write(req, conn, rt, 200, data=rt.encode(canon_crd(d)))
                return None
        self.respond_write(req, conn, rt, 200, obj=obj)
        return None

    def validate_crd(self, d):
        """The checks of apiextensions validation.go that matter here (422 Invalid)."""
        sp = d.get("spec") if isinstance(d.get("spec"), dict) else {}
        names = sp.get("names") if isinstance(sp.get("names"), dict) else {}
        name = d["metadata"].get("name", "")
        errs = []
        group = sp.get("group") or ""
        if not group:
            errs.append(field_err("FieldValueRequired", "spec.group", ""))
        elif "." not in group:
            errs.append(field_err("FieldValueInvalid", "spec.group", "should be a domain with at least one dot",
                                  group))
        if not names.get("plural"):
            errs.append(field_err("FieldValueRequired", "spec.names.plural", ""))
        if not names.get("kind"):
            errs.append(field_err("FieldValueRequired", "spec.names.kind", ""))
        if names.get("plural") and group and name != "%s.%s" % (names["plural"], group):
            errs.append(field_err("FieldValueInvalid", "metadata.name",
                                  'must be spec.names.plural+"."+spec.group', name))
        if sp.get("scope") not in ("Namespaced", "Cluster"):
            errs.append(field_err("FieldValueNotSupported", "spec.scope", "", sp.get("scope") or "",
                                  ["Cluster", "Namespaced"]))
        vers = sp.get("versions") if isinstance(sp.get("versions"), list) else []
        if not vers:
            errs.append(field_err("FieldValueInvalid", "spec.versions", "must have exactly one version marked as "
                                  "storage version", []))
        elif sum(1 for v in vers if isinstance(v, dict) and v.get("storage")) != 1:
            errs.append(field_err("FieldValueInvalid", "spec.versions", "must have exactly one version marked as "
                                  "storage version", None))
        if errs:
            raise err_invalid("apiextensions.k8s.io", "CustomResourceDefinition", name, errs)

    def page_not_found(self, req, conn):
        """net/http NotFound (notfoundhandler.go, the end of kube-apiserver's delegation
        chain): text/plain "404 page not found", for a path no API group claims (an
        unknown group, a custom resource whose CRD does not exist or does not serve that
        version)."""
        conn.respond(404, b"404 page not found\n", req, ctype=b"text/plain; charset=utf-8",
                     extra=[(b"X-Content-Type-Options", b"nosniff")])
        return None

    def cr_route(self, group, version, rest):
        """The custom resource type a /apis/G/V/... path names, or None (crdHandler
        delegates to NotFound: no such CRD, version not served, scope mismatch)."""
        if rest[0] == "watch":
            rest = rest[1:]
            if not rest:
                return None
        ns = False
        if rest[0] == "namespaces" and len(rest) > 2:
            ns = True
            rest = rest[2:]
        rt = self.routes.get((group, version, rest[0]))
        if rt is None or not rt.unstructured:
            return None
        if ns and not rt.namespaced:
            return None
        return rt

    def openapi_v2(self, req, conn):
        """An OpenAPI v2 document without definitions.  kubectl 1.27-1.29 download it
        (protobuf, gnostic openapi_v2.Document) before `create -f`; with no schema for a
        kind, kubectl skips client-side validation of it."""
        if req.method not in ("GET", "HEAD"):
            raise ERR_METHOD
        ver = ("v%s.0" % self.args.version).encode()
        if "protobuf" in req.headers.get("accept", "") or req.path.endswith(".pb-v1"):
            info = b"\x0a\x0aKubernetes\x12" + bytes([len(ver)]) + ver
            body = b"\x0a\x032.0\x12" + bytes([len(info)]) + info
            conn.respond(200, body, req, ctype=b"application/octet-stream")
            return None
        return self.reply(req, conn, {"swagger": "2.0", "info": {"title": "Kubernetes", "version": ver.decode()},
                                      "paths": {}, "definitions": {}}, "openapi")

    def openapi_v3(self, req, conn, rest):
        """A minimal OpenAPI v3 surface: the root index and, per group-version, one PATCH
        operation per kind that advertises the fieldValidation query parameter.  That is
        what kubectl's QueryParamVerifierV3 (k8s.io/cli-runtime/pkg/resource/
        query_param_verifier_v3.go) looks for before it skips client-side schema
        validation in `kubectl create/replace -f` (server-side validation instead)."""
        gvs = [("", "v1")] + [(g, v) for g, vs in self.legacy_groups() for v in vs if (g, v) not in self.remote_gvs()]

        def gvpath(g, v):
            return "api/v1" if not g else "apis/%s/%s" % (g, v)
        if not rest:
            return self.reply(req, conn, {"paths": {gvpath(g, v): {"serverRelativeURL": "/openapi/v3/%s?hash=%s" % (
                gvpath(g, v), hashlib.sha1(gvpath(g, v).encode()).hexdigest()[:16].upper())} for g, v in gvs}}, "openapi")
        want = "/".join(rest)
        for g, v in gvs:
            if gvpath(g, v) != want:
                continue
            paths = {}
            for t in self.cluster.types:
                if t.group != g or t.version != v:
                    continue
                base = t.prefix + ("/namespaces/{namespace}/" if t.namespaced else "/") + t.plural
                gvk = {"group": g, "version": v, "kind": t.kind}
                params = [{"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
                          for n in ("dryRun", "fieldManager", "fieldValidation")]
                paths[base + "/{name}"] = {
                    "patch": {"operationId": "patch" + t.kind, "x-kubernetes-group-version-kind": gvk,
                              "x-kubernetes-action": "patch", "parameters": params,
                              "responses": {"200": {"description": "OK"}}}}
                paths[base] = {
                    "post": {"operationId": "create" + t.kind, "x-kubernetes-group-version-kind": gvk,
                             "x-kubernetes-action": "post", "parameters": params,
                             "responses": {"201": {"description": "Created"}}}}
            return self.reply(req, conn, {"openapi": "3.0.0",
                                          "info": {"title": "Kubernetes", "version": "v%s.0" % self.args.version},
                                          "paths": paths, "components": {"schemas": {}}}, "openapi")
        raise ERR_NOT_FOUND_PATH

    def reply(self, req, conn, obj, form="api"):
        """form "api": an API object (discovery: WriteObjectNegotiated, newline-terminated);
        "raw": WriteRawJSON's MarshalIndent, no newline (/version, the / index); "openapi":
        compact, no newline (kube-openapi writes its json.Marshal bytes)."""
        if req.method not in ("GET", "HEAD"):
            raise ERR_METHOD
        if form == "raw":
            conn.respond(200, dumpb_indent(obj), req)
        else:
            conn.respond_json(200, obj, req, nl=form == "api")
        return None

    def version_info(self):
        minor = self.args.version.split(".")[1]
        return {"major": "1", "minor": minor, "gitVersion": "v%s.0" % self.args.version,
                "gitCommit": hashlib.sha1(self.args.version.encode()).hexdigest(), "gitTreeState": "clean",
                "buildDate": "2024-08-13T07:28:49Z", "goVersion": GO_VERSIONS.get(self.args.version, "go1.22.5"),
                "compiler": "gc", "platform": "linux/amd64"}

    def group_info(self, g, versions):
        vs = [{"groupVersion": "%s/%s" % (g, v), "version": v} for v in versions]
        return {"name": g, "versions": vs, "preferredVersion": vs[0]}

    def api_group(self, g, versions):
        return dict([("kind", "APIGroup"), ("apiVersion", "v1")] + list(self.group_info(g, versions).items()))

    def resource_list(self, group, version):
        res = []
        for t, entries in self.discovery_entries(group, version):
            for sub, kind, verbs, sgroup, sversion in entries:
                if sub is None:
                    e = {"name": t.plural, "singularName": t.singular, "namespaced": t.namespaced, "kind": t.kind,
                         "verbs": verbs}
                    if t.short:
                        e["shortNames"] = t.short
                    if t.categories:
                        e["categories"] = t.categories
                    e["storageVersionHash"] = t.storage_hash
                else:
                    e = {"name": "%s/%s" % (t.plural, sub), "singularName": "", "namespaced": t.namespaced}
                    if sgroup:
                        e["group"] = sgroup
                        e["version"] = sversion
                    e["kind"] = kind
                    e["verbs"] = verbs
                res.append(e)
        out = {"kind": "APIResourceList"}
        if group:
            out["apiVersion"] = "v1"
        out["groupVersion"] = version if not group else "%s/%s" % (group, version)
        out["resources"] = res
        return out

    def resource(self, req, conn, group, version, rest):
        watch_path = False
        if rest[0] == "watch":
            watch_path = True
            rest = rest[1:]
            if not rest:
                raise ERR_NOT_FOUND_PATH
        ns = None
        if rest[0] == "namespaces" and len(rest) > 2 and rest[2] not in ("status", "finalize"):
            ns = rest[1]
            rest = rest[2:]
        rt = self.routes.get((group, version, rest[0]))
        if rt is None or len(rest) > 3:
            raise ERR_NOT_FOUND_PATH
        if ns is not None and not rt.namespaced:
            raise ERR_NOT_FOUND_PATH
        st = self.cluster.stores[rt.key]
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        m = req.method
        if sub in ("log", "exec", "attach", "portforward", "proxy"):
            conn.apf = False   # long-running non-watch: not through APF (see PF_HEADERS)
        if watch_path:
            if sub is not None:
                raise ERR_NOT_FOUND_PATH
            if m not in ("GET", "HEAD"):
                raise ERR_METHOD
            accept = self.negotiate(req, rt)
            o = self.parse_opts(req, rt, force_watch=True)
            self.stats["watch " + rt.plural] += 1
            return self.do_watch(req, conn, rt, st, ns, name, accept, o)
        if name is None:
            if m in ("GET", "HEAD"):
                accept = self.negotiate(req, rt)
                o = self.parse_opts(req, rt)
                if o.watch:
                    self.stats["watch " + rt.plural] += 1
                    return self.do_watch(req, conn, rt, st, ns, None, accept, o)
                # a list of one object at the current rv, nothing else asked: a probe of the
                # upstream's rv (kwc's before a watch resumes), counted apart from lists
                probe = o.limit == 1 and o.rv == "" and not o.cont and "labelSelector" not in req.query and \
                    "fieldSelector" not in req.query
                self.stats[("probe " if probe else "list ") + rt.plural] += 1
                return self.do_list(req, conn, rt, st, ns, accept, o)
            if m == "POST":
                if rt.namespaced and ns is None:
                    raise ERR_METHOD
                self.stats["create " + rt.plural] += 1
                return self.do_create(req, conn, rt, st, ns)
            if m == "DELETE":
                self.stats["deletecollection " + rt.plural] += 1
                return self.do_deletecollection(req, conn, rt, st, ns)
            raise ERR_METHOD
        if rt.namespaced and ns is None:
            raise ERR_NOT_FOUND_PATH
        key = "%s/%s" % (ns, name) if rt.namespaced else name
        if sub is None:
            if m in ("GET", "HEAD"):
                self.stats["get " + rt.plural] += 1
                return self.do_get(req, conn, rt, st, key, name, self.negotiate(req, rt))
            if m == "PUT":
                self.stats["update " + rt.plural] += 1
                return self.do_update(req, conn, rt, st, ns, key, name, None)
            if m == "PATCH":
                self.stats["patch " + rt.plural] += 1
                return self.do_patch(req, conn, rt, st, ns, key, name, None)
            if m == "DELETE":
                self.stats["delete " + rt.plural] += 1
                return self.do_delete(req, conn, rt, st, key, name)
            raise ERR_METHOD
        if sub not in rt.subresources:
            raise ERR_NOT_FOUND_PATH
        sr = "%s/%s" % (rt.plural, sub)
        if sub in ("status", "scale"):
            if m in ("GET", "HEAD"):
                self.stats["get " + sr] += 1
                if sub == "scale":
                    return self.respond_scale(req, conn, rt, self.scale_of(rt, self.must_get(rt, st, key, name)))
                return self.do_get(req, conn, rt, st, key, name, self.negotiate(req, rt))
            if m == "PUT":
                self.stats["update " + sr] += 1
                return self.do_update(req, conn, rt, st, ns, key, name, sub)
            if m == "PATCH":
                self.stats["patch " + sr] += 1
                return self.do_patch(req, conn, rt, st, ns, key, name, sub)
            raise ERR_METHOD
        if sub == "log" and m in ("GET", "HEAD"):
            self.stats["get " + sr] += 1
            return self.do_log(req, conn, st, key, name)
        if sub in ("exec", "attach") and m in ("GET", "POST"):
            self.stats["create " + sr] += 1
            return self.do_exec(req, conn, st, key, name, sub)
        if sub == "finalize" and m == "PUT":
            return self.do_update(req, conn, rt, st, ns, key, name, "finalize")
        raise ERR_METHOD

    # -- protobuf ---------------------------------------------------------------
    def pb_raw(self, rt, obj):
        """The protobuf message of a stored built-in object (no envelope), encoded from
        its JSON on first use and kept with it."""
        r = obj.pb
        if r is None:
            r = obj.pb = self.pb.encode(rt.kind, json.loads(obj.data))
        return r

    def pb_status(self, status):
        """A metav1.Status dict as its protobuf envelope {apiVersion v1, kind Status}."""
        return pb_envelope(self.status_tm, self.pb.encode("Status", status))

    def pb_object(self, rt, accept, obj=None, d=None):
        """One object's protobuf envelope: the kind's own message, or in meta mode a
        PartialObjectMetadata (meta.k8s.io/<version>) of its metadata."""
        if accept[0] == "meta":
            if d is None:
                d = obj.dict()
            tm = pb_typemeta("meta.k8s.io/" + accept[1], "PartialObjectMetadata")
            if rt.unstructured:
                return pb_envelope(tm, pb_partial_meta(d.get("metadata")))
            return pb_envelope(tm, self.pb.encode("PartialObjectMetadata", {"metadata": d.get("metadata")}))
        raw = self.pb_raw(rt, obj) if obj is not None else self.pb.encode(rt.kind, d)
        return pb_envelope(rt.pb_tm, raw)

    @staticmethod
    def pb_listmeta(rv, cont, remaining):
        """ListMeta {1 selfLink, 2 resourceVersion, 3 continue, 4 remainingItemCount (a
        pointer: only when set)}, as field 1 of an XxxList."""
        lm = b"\x0a\x00" + pb_bytes(b"\x12", str(rv).encode()) + pb_bytes(b"\x1a", (cont or "").encode())
        if remaining is not None:
            lm += b"\x20" + pb_varint(remaining)
        return pb_bytes(b"\x0a", lm)

    def write_enc(self, req, rt):
        """Writes (create, update, patch, delete) answer in protobuf when the Accept
        header negotiates it for rt; otherwise in JSON, as before (apisim answers no
        write with 406 or a Table).  Request bodies are JSON only."""
        acc = req.headers.get("accept", "")
        if not acc or rt.unstructured:
            return "json"
        r = negotiate_accept(acc, rt)
        return "pb" if r is not None and r[0] == "json" and r[2] == "pb" else "json"

    def respond_write(self, req, conn, rt, code, obj=None, data=None):
        """A write's answer: the stored object (obj) or an encoded one (data)."""
        if self.write_enc(req, rt) == "pb":
            if obj is not None:
                body = pb_envelope(rt.pb_tm, self.pb_raw(rt, obj))
            else:
                body = pb_envelope(rt.pb_tm, self.pb.encode(rt.kind, json.loads(data)))
            conn.respond_api(code, body, req, ctype=PB_CT)
        else:
            conn.respond(code, obj.data if obj is not None else data, req, nl=True)

    def respond_scale(self, req, conn, rt, scale):
        """The scale subresource's autoscaling/v1 Scale, in protobuf when negotiated."""
        if req.method not in ("GET", "HEAD", "PUT", "PATCH"):
            raise ERR_METHOD
        if self.write_enc(req, rt) == "pb":
            conn.respond_api(200, pb_envelope(pb_typemeta("autoscaling/v1", "Scale"), self.pb.encode("Scale", scale)),
                             req, ctype=PB_CT)
        else:
            conn.respond_json(200, scale, req)
        return None

    # -- content negotiation --------------------------------------------------
    def negotiate(self, req, rt):
        """The answer's form for a get, list or watch of rt: (mode, version, encoding)
        with mode "json" (the object itself), "table" or "meta" (PartialObjectMetadata
        in meta.k8s.io/version), encoding "json" or "pb".  kube-apiserver's
        endpoints/handlers/negotiation/negotiate.go NegotiateMediaTypeOptions with the
        RequestScope's restrictions (handlers/rest.go AllowsMediaTypeTransform): an
        absent or empty Accept is JSON; else the first clause, in goautoneg's order
        (parse_accept), that a serializer (JSON, YAML, protobuf, in that order; apisim
        writes no YAML and skips it) accepts with its parameters: protobuf for built-in
        kinds only (a custom resource's StandardSerializers leave it out), as=Table
        only in JSON, as=PartialObjectMetadata[List] in JSON or protobuf, for custom
        resources too.  None fits: 406."""
        acc = req.headers.get("accept", "")
        if not acc:
            req.pretty = is_pretty_print(req)
            return ("json", None, "json")
        r = negotiate_accept(acc, rt)
        if r is not None:
            req.pretty = r[2] == "json" and (accept_pretty(acc, rt) or is_pretty_print(req))
        if r is None:
            # k8s.io/apiserver/pkg/endpoints/handlers/negotiation/errors.go NewNotAcceptableError
            # (the negotiated serializer's media types: a custom resource's include protobuf)
            raise ApiError(406, "NotAcceptable", "only the following media types are accepted: application/json, "
                                                 "application/yaml, application/vnd.kubernetes.protobuf")
        return r

    def pretty(self, req, rt=None):
        """Whether a JSON answer is pretty (negotiation.NegotiateOutputMediaType:
        the winning Accept clause's pretty=1 or isPrettyPrint; the JSON serializer has a
        pretty form, protobuf none).  rt None: DefaultEndpointRestrictions (errors,
        discovery, writes)."""
        acc = req.headers.get("accept", "")
        return (bool(acc) and accept_pretty(acc, rt)) or is_pretty_print(req)

    def error_encoding(self, req):
        """The encoding of a Status error (responsewriters.ErrorNegotiated: negotiated
        again with DefaultEndpointRestrictions, no conversion allowed, protobuf allowed
        for every kind): "json", "pb", or None when nothing fits (then kube writes the
        Status with WriteRawJSON)."""
        acc = req.headers.get("accept", "")
        if not acc:
            return "json"
        r = negotiate_accept(acc, None)
        return None if r is None else r[2]

    # -- list options ---------------------------------------------------------
    def parse_opts(self, req, rt, force_watch=False):
        q = req.query
        o = ListOpts()
        # DecodeParameters, in ListOptions field order; errors are 400 BadRequest
        # (handlers/get.go ListResource: errors.NewBadRequest(err.Error())).
        try:
            o.lsel = LabelSelector(q.get("labelSelector", ""))
            o.fsel = FieldSelector(q.get("fieldSelector", ""))
        except SelectorError as e:
            raise err_bad_request(str(e))
        o.watch = force_watch or ("watch" in q and kube_bool(q["watch"]))
        o.bookmarks = "allowWatchBookmarks" in q and kube_bool(q["allowWatchBookmarks"])
        o.rv = q.get("resourceVersion", "")
        o.match = q.get("resourceVersionMatch", "")
        o.timeout = parse_int64(q["timeoutSeconds"]) if "timeoutSeconds" in q else None
        o.limit = parse_int64(q["limit"]) if "limit" in q else 0
        o.cont = q.get("continue", "")
        o.sie = kube_bool(q["sendInitialEvents"]) if "sendInitialEvents" in q else None
        # metainternalversion.SetListOptionsDefaults (only with the WatchList gate on)
        if self.watchlist_defaulting and o.watch and o.sie is None and not o.match and o.rv in ("", "0"):
            o.sie = True
            o.match = "NotOlderThan"
        # staging/src/k8s.io/apimachinery/pkg/apis/meta/internalversion/validation/validation.go
        errs = []
        if o.watch:
            if o.sie is not None:
                if o.match != "NotOlderThan":
                    errs.append(field_err("FieldValueForbidden", "resourceVersionMatch",
                                          "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"))
                if not self.watchlist_enabled:
                    errs.append(field_err("FieldValueForbidden", "sendInitialEvents",
                                          "sendInitialEvents is forbidden for watch unless the WatchList feature "
                                          "gate is enabled"))
            if o.match:
                if o.sie is None:
                    errs.append(field_err("FieldValueForbidden", "resourceVersionMatch",
                                          "resourceVersionMatch is forbidden for watch unless sendInitialEvents is "
                                          "provided"))
                if o.match != "NotOlderThan":
                    errs.append(field_err("FieldValueNotSupported", "resourceVersionMatch", "", o.match,
                                          ["NotOlderThan"]))
                if o.cont:
                    errs.append(field_err("FieldValueForbidden", "resourceVersionMatch",
                                          "resourceVersionMatch is forbidden when continue is provided"))
        else:
            if o.match:
                if not o.rv:
                    errs.append(field_err("FieldValueForbidden", "resourceVersionMatch",
                                          "resourceVersionMatch is forbidden unless resourceVersion is provided"))
                if o.cont:
                    errs.append(field_err("FieldValueForbidden", "resourceVersionMatch",
                                          "resourceVersionMatch is forbidden when continue is provided"))
                if o.match not in ("Exact", "NotOlderThan"):
                    errs.append(field_err("FieldValueNotSupported", "resourceVersionMatch", "", o.match,
                                          ["Exact", "NotOlderThan", ""]))
                if o.match == "Exact" and o.rv == "0":
                    errs.append(field_err("FieldValueForbidden", "resourceVersionMatch",
                                          'resourceVersionMatch "exact" is forbidden for resourceVersion "0"'))
            if o.sie is not None:
                errs.append(field_err("FieldValueForbidden", "sendInitialEvents", "sendInitialEvents is forbidden for list"))
        if errs:
            raise err_invalid("meta.k8s.io", "ListOptions", "", errs)
        # field label conversion (handlers/get.go: errors.NewBadRequest(err.Error()))
        if o.fsel.terms:
            try:
                o.fsel.terms = [(rt.convert_field_label(f), neg, v) for f, neg, v in o.fsel.terms]
            except SelectorError as e:
                raise err_bad_request(str(e))
        if not o.lsel.reqs:
            o.lsel = None
        if not o.fsel.terms:
            o.fsel = None
        return o

    # -- list -----------------------------------------------------------------
    def do_list(self, req, conn, rt, st, ns, accept, o):
        cl = self.cluster
        # Which layer kube-apiserver uses (storage/cacher/cacher.go shouldDelegateList): the
        # watch cache serves rv="0" and rv=N without limit (NotOlderThan); etcd the rest.
        delegate = o.rv == "" or bool(o.cont) or (o.limit > 0 and o.rv != "0") or o.match == "Exact"
        if not delegate:
            n, perr = parse_uint_rv(o.rv)
            if perr:
                raise err_generic(500, perr)
            if n > cl.rv:
                return self._list_wait(req, conn, rt, st, ns, accept, o, n)
            return self.serve_list(req, conn, rt, st, ns, accept, o, cl.rv, st.objs, st.keys, None, 0)
        with_rev = 0
        start_rel = None
        min_rv = 0
        if o.cont:
            # storage/etcd3/store.go GetList + storage/continue.go DecodeContinue
            try:
                start_rel, crv = decode_continue(o.cont)
            except ContinueError as e:
                raise err_bad_request("invalid continue token: %s" % e)
            if o.rv and o.rv != "0":
                raise err_bad_request("specifying resource version is not allowed when using continue")
            if crv > 0:
                with_rev = crv
        elif o.rv:
            n, perr = parse_uint_rv(o.rv)
            if perr:
                raise err_bad_request("invalid resource version: %s" % perr)
            if o.match == "Exact":
                with_rev = n
            elif o.match == "" and o.limit > 0 and n > 0:
                with_rev = n
            elif o.match == "NotOlderThan":
                min_rv = n
        cur = cl.rv
        if with_rev:
            if with_rev < cl.floor(st):
                # storage/etcd3: interpretListError / handleCompactedErrorForPaging
                if o.cont:
                    raise err_expired(INCONSISTENT_CONTINUE, encode_continue(start_rel, -1))
                raise err_expired(EXPIRED_LIST)
            if with_rev > cur:
                raise err_generic(500, "etcdserver: mvcc: required revision is a future revision")
            objs, keys = cl.snapshot(st, with_rev)
            read_rv = with_rev
        else:
            if min_rv > cur:
                # store.validateMinimumResourceVersion: NewTooLargeResourceVersionError(.., 0)
                raise err_too_large_rv(min_rv, cur, 0)
            objs, keys, read_rv = st.objs, st.keys, cur
        return self.serve_list(req, conn, rt, st, ns, accept, o, read_rv, objs, keys, start_rel, o.limit)

    async def _list_wait(self, req, conn, rt, st, ns, accept, o, n):
        # cacher waitUntilFreshAndBlock: 3 s, then 504 with retryAfterSeconds 1
        ok = await self.cluster.wait_for_rv(n, 3.0)
        if not ok:
            raise err_too_large_rv(n, self.cluster.rv, 1)
        r = self.serve_list(req, conn, rt, st, ns, accept, o, self.cluster.rv, st.objs, st.keys, None, 0)
        if r is not None:
            await r

    def serve_list(self, req, conn, rt, st, ns, accept, o, read_rv, objs, keys, start_rel, limit):
        lo, hi = st.range_for_ns(keys, ns)
        i = lo
        if start_rel is not None:
            abs_start = ns + "/" + start_rel if ns is not None else start_rel
            i = max(lo, bisect.bisect_left(keys, abs_start, lo, hi))
        start_i = i
        lsel, fsel = o.lsel, o.fsel
        has_more = False
        last_key = None
        remaining = None
        if lsel is None and fsel is None:
            if limit > 0:
                j = min(hi, i + limit)
                page = keys[i:j]
                has_more = j < hi
                if has_more:
                    last_key = page[-1]
                    remaining = (hi - start_i) - limit
            else:
                page = keys[i:hi]
            items = [objs[k] for k in page]
        else:
            items = []
            nm = fsel.name_value() if fsel is not None else None
            if nm is not None and ns is not None and limit <= 0:
                ob = objs.get(ns + "/" + nm)
                rng = [] if ob is None else [ob.key]
                for k in rng:
                    ob = objs[k]
                    if (lsel is None or lsel.matches(ob.labels)) and (fsel is None or fsel.matches(ob)):
                        items.append(ob)
            else:
                for idx in range(i, hi):
                    if limit > 0 and len(items) >= limit:
                        has_more = True
                        break
                    k = keys[idx]
                    ob = objs[k]
                    last_key = k
                    if (lsel is None or lsel.matches(ob.labels)) and (fsel is None or fsel.matches(ob)):
                        items.append(ob)
        cont = None
        if has_more:
            rel = last_key[len(ns) + 1:] if ns is not None else last_key
            cont = encode_continue(rel + "\x00", read_rv)
        mode = accept[0]
        if accept[2] == "pb":
            return self.pb_list(req, conn, rt, accept, items, read_rv, cont, remaining)
        if mode == "json":
            head, tail = rt.list_frame(read_rv, cont, remaining)
            total = len(head) + sum([len(x.data) for x in items]) + len(items) + len(tail)  # ~ (items: +1 -tm)
            if total > (1 << 20) and req.method != "HEAD":
                return self._stream_list(req, conn, head, rt.item_parts(items, lazy=True), tail)
            parts = rt.item_parts(items)
            parts.insert(0, head)
            parts.append(tail)
            conn.respond_api(200, b"".join(parts), req)
            return None
        meta = {"resourceVersion": str(read_rv)}
        if cont:
            meta["continue"] = cont
        if remaining is not None:
            meta["remainingItemCount"] = remaining
        dicts = [x.dict() for x in items]
        if mode == "table":
            out = self.table_for(rt, dicts, accept[1], req.query.get("includeObject", "Metadata"), meta)
        else:
            out = {"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/" + accept[1], "metadata": meta,
                   # asPartialObjectMetadataList appends to a nil slice: no items is null
                   "items": [{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/" + accept[1],
                              "metadata": partial_meta(d.get("metadata"))} for d in dicts] or None}
        conn.respond_json(200, out, req)
        return None

    def pb_list(self, req, conn, rt, accept, items, rv, cont, remaining):
        """A list in protobuf: the envelope {apiVersion, kind XxxList} around XxxList
        {1 ListMeta, 2 items: each object's message, no envelope}; in meta mode a
        PartialObjectMetadataList.  Objects not encoded yet are encoded first (in
        batches between which the loop runs on, when there are many)."""
        todo = len(items) if accept[0] == "meta" else sum(1 for x in items if x.pb is None)
        if todo > 2000:
            return self._pb_list_async(req, conn, rt, accept, items, rv, cont, remaining)
        return self._pb_list_send(req, conn, rt, accept, self._pb_items(rt, accept, items), rv, cont, remaining)

    def _pb_items(self, rt, accept, items):
        if accept[0] == "meta":
            if rt.unstructured:
                return [pb_partial_meta(json.loads(x.data).get("metadata")) for x in items]
            enc = self.pb.encode
            return [enc("PartialObjectMetadata", {"metadata": json.loads(x.data).get("metadata")}) for x in items]
        return [self.pb_raw(rt, x) for x in items]

    async def _pb_list_async(self, req, conn, rt, accept, items, rv, cont, remaining):
        raws = []
        for i in range(0, len(items), 1000):
            raws.extend(self._pb_items(rt, accept, items[i:i + 1000]))
            await asyncio.sleep(0)
            if conn.closed:
                return
        r = self._pb_list_send(req, conn, rt, accept, raws, rv, cont, remaining)
        if r is not None:
            await r

    def _pb_list_send(self, req, conn, rt, accept, raws, rv, cont, remaining):
        tm = rt.pb_list_tm if accept[0] != "meta" else \
            pb_typemeta("meta.k8s.io/" + accept[1], "PartialObjectMetadataList")
        parts = [self.pb_listmeta(rv, cont, remaining)]
        for r in raws:
            n = len(r)
            parts.append(b"\x12" + (_VARINT[n] if n < 16384 else pb_varint(n)))
            parts.append(r)
        raw_len = sum(map(len, parts))
        head, tail = pb_envelope_parts(tm, raw_len)
        if raw_len > (1 << 20) and req.method != "HEAD":
            return self._stream_list(req, conn, head, parts, tail, PB_CT)
        parts.insert(0, head)
        parts.append(tail)
        conn.respond_api(200, b"".join(parts), req, ctype=PB_CT)
        return None

    async def _stream_list(self, req, conn, head, items, tail, ctype=JSON_CT):
        """A large list written as it is encoded (always > 128 KiB: gzip when asked,
        compressed as it goes; pretty JSON re-indented as it goes)."""
        gz = GoGzip() if wants_gzip(req) else None
        ind = GoIndenter() if ctype == JSON_CT and req.pretty else None
        conn.start_stream(req, ctype=ctype, gz=gz is not None)

        def out(data, last=False):
            if ind is not None:
                data = ind.feed(data)
            if gz is not None:
                data = gz.write(data) + (gz.close() if last else b"")
            conn.write_chunk(data)
        parts = [head]
        size = len(head)
        for p in items:
            parts.append(p)
            size += len(p)
            if size >= 262144:
                out(b"".join(parts))
                parts = []
                size = 0
                await conn.drain()
        parts.append(tail)
        out(b"".join(parts), True)
        conn.end_stream()

    def table_for(self, rt, dicts, ver, include_obj, meta, headers=True):
        cols, rowfn = rt.table
        rows = []
        for d in dicts:
            row = {"cells": rowfn(d)}
            if include_obj == "Object":
                row["object"] = d
            elif include_obj != "None":
                row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/" + ver,
                                 "metadata": partial_meta(d.get("metadata"))}
            rows.append(row)
        return {"kind": "Table", "apiVersion": "meta.k8s.io/" + ver, "metadata": meta,
                "columnDefinitions": cols if headers else None, "rows": rows}

    def respond_obj(self, req, conn, rt, obj, accept, code=200):
        mode = accept[0]
        if accept[2] == "pb":
            conn.respond_api(code, self.pb_object(rt, accept, obj=obj), req, ctype=PB_CT)
            return
        if mode == "json":
            conn.respond(code, obj.data, req, nl=True)
            return
        d = obj.dict()
        if mode == "table":
            out = self.table_for(rt, [d], accept[1], req.query.get("includeObject", "Metadata"),
                                 {"resourceVersion": str(obj.rv)})
        else:
            out = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/" + accept[1],
                   "metadata": partial_meta(d.get("metadata"))}
        conn.respond_json(code, out, req)

    # -- get ------------------------------------------------------------------
    def must_get(self, rt, st, key, name):
        obj = st.objs.get(key)
        if obj is None:
            raise err_not_found(rt, name)
        return obj

    def do_get(self, req, conn, rt, st, key, name, accept):
        rv = req.query.get("resourceVersion", "")
        if rv:
            n, perr = parse_uint_rv(rv)
            if perr:
                raise err_generic(500, perr)
            if n > self.cluster.rv:
                return self._get_wait(req, conn, rt, st, key, name, accept, n)
        self.respond_obj(req, conn, rt, self.must_get(rt, st, key, name), accept)
        return None

    async def _get_wait(self, req, conn, rt, st, key, name, accept, n):
        ok = await self.cluster.wait_for_rv(n, 3.0)
        if not ok:
            raise err_too_large_rv(n, self.cluster.rv, 1)
        self.respond_obj(req, conn, rt, self.must_get(rt, st, key, name), accept)

    # -- watch ----------------------------------------------------------------
    def do_watch(self, req, conn, rt, st, ns, name, accept, o):
        if name is not None:
            # handlers/get.go ListResource for the legacy /watch/.../NAME path
            if o.fsel is not None:
                if o.fsel.name_value() != name:
                    raise err_bad_request("fieldSelector metadata.name doesn't match requested name")
            else:
                o.fsel = FieldSelector("metadata.name=" + name.replace("\\", "\\\\").replace(",", "\\,")
                                       .replace("=", "\\="))
        n = 0
        if o.rv not in ("", "0"):
            n, perr = parse_uint_rv(o.rv)
            if perr:
                raise err_generic(500, perr)
        return self._watch(req, conn, rt, st, ns, accept, o, n)

    async def _watch(self, req, conn, rt, st, ns, accept, o, n):
        cl = self.cluster
        loop = self.loop
        if o.timeout:
            timeout = max(0, o.timeout)
        else:
            # handlers/get.go: minRequestTimeout (1800 s) * (rand.Float64() + 1.0)
            timeout = 1800.0 * (random.random() + 1.0)
        deadline = loop.time() + timeout
        w = Watcher(self, conn, st, ns, o.lsel, o.fsel, accept[0], accept[1] or "v1",
                    req.query.get("includeObject", "Metadata"), o.bookmarks, deadline, accept[2])
        # handlers/watch.go: ";stream=watch" is added to every media type but JSON's
        conn.start_stream(req, ctype=PB_WATCH_CT if accept[2] == "pb" else JSON_CT)
        st.watchers.add(w)
        conn.watchers.add(w)
        self.watch_counts[rt.plural] += 1
        self.watch_enc_counts[(rt.plural, "protobuf" if accept[2] == "pb" else "json")] += 1
        w.timer = loop.call_at(deadline, w.finish, True)
        try:
            initial = None
            cur = cl.rv
            if o.sie:
                if n > cur:
                    if not await cl.wait_for_rv(n, 3.0):
                        self._watch_error(w, err_too_large_rv(n, cl.rv, 1))
                        return
                    cur = cl.rv
                initial = True
                w.start_rv = cur
            elif o.rv in ("", "0"):
                w.start_rv = cur
                initial = o.sie is None
            else:
                floor = cl.floor(st)
                if n < floor:
                    # storage/cacher/watch_cache.go getAllEventsSinceLocked: NewResourceExpired,
                    # sent as one ERROR event on a 200 stream (cacher.go newErrWatcher)
                    self._watch_error(w, err_expired("too old resource version: %d (%d)" % (n, floor)))
                    return
                w.start_rv = n
                if n < cur:
                    h = st.hist
                    idx = bisect.bisect_right([e.rv for e in h], n) if len(h) < 4096 else self._hist_index(h, n)
                    out = []
                    for ev in h[idx:]:
                        c = w.chunk_for(ev)
                        if c is not None:
                            out.append(c)
                        if len(out) >= 512:
                            w.write(b"".join(out))
                            out = []
                    if out:
                        w.write(b"".join(out))
                    w.last_rv = cur
                    w.start_rv = cur
            if initial:
                lo, hi = st.range_for_ns(st.keys, ns)
                snap = [st.objs[k] for k in st.keys[lo:hi]]
                out = []
                size = 0
                for ob in snap:
                    if w.simple or w.match(ob):
                        c = w.initial_chunk(ob)
                        out.append(c)
                        size += len(c)
                        if size > 262144:
                            w.write(b"".join(out))
                            out = []
                            size = 0
                            await conn.drain()
                            if w.enc == "pb":
                                await asyncio.sleep(0)   # objects encoded on first use: let others run
                            if w.closed:
                                break
                if out:
                    w.write(b"".join(out))
                w.last_rv = w.start_rv
                if o.sie and o.bookmarks:
                    w.send_bookmark(w.start_rv, initial_end=True)
            w.go_live()
            if o.bookmarks:
                w.schedule_bookmark(loop.time())
            clean = await w.done
            if clean and not conn.closed:
                conn.end_stream()
        finally:
            w.finish(clean=False)

    def _hist_index(self, h, n):
        lo, hi = 0, len(h)
        while lo < hi:
            mid = (lo + hi) // 2
            if h[mid].rv <= n:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _watch_error(self, w, e):
        if w.enc == "pb":
            w.write(w.conn.frame(pb_watch_event("ERROR", self.pb_status(e.status()))))
        else:
            w.write(w.conn.frame(b'{"type":"ERROR","object":%s}\n' % dumpb(e.status())))
        w.finish(clean=True)
        w.conn.end_stream()

    # -- writes ---------------------------------------------------------------
    def body_obj(self, req, rt):
        if not req.body:
            raise err_bad_request("the object provided is unrecognized (must be of type %s): couldn't get "
                                  "version/kind; json parse error: unexpected end of JSON input" % rt.kind)
        try:
            d = json.loads(req.body)
        except (ValueError, UnicodeDecodeError) as e:
            raise err_bad_request("the object provided is unrecognized (must be of type %s): couldn't get "
                                  "version/kind; json parse error: %s" % (rt.kind, e))
        if not isinstance(d, dict):
            raise err_bad_request("the object provided is unrecognized (must be of type %s): couldn't get "
                                  "version/kind; json parse error: json: cannot unmarshal array into Go value of "
                                  "type struct" % rt.kind)
        self.check_kind(d, rt)
        if not isinstance(d.get("metadata", {}), dict):
            raise err_bad_request("metadata must be an object")
        return d

    def check_kind(self, d, rt):
        kind, apiv = d.get("kind"), d.get("apiVersion")
        if (kind and kind != rt.kind) or (apiv and apiv != rt.api_version):
            raise err_bad_request("the object provided is unrecognized (must be of type %s): %s in version %s "
                                  "cannot be handled as a %s" % (rt.kind, kind or "", go_json_string(apiv or ""),
                                                                 rt.kind))
        d["kind"] = rt.kind
        d["apiVersion"] = rt.api_version

    def validate_name(self, rt, name):
        if len(name) > 253 or not _DNS1123_SUB.match(name):
            raise err_invalid(rt.group, rt.kind, name,
                              [field_err("FieldValueInvalid", "metadata.name", NAME_INVALID, name)])

    def dry_run(self, req):
        return bool(req.qall("dryRun"))

    def do_create(self, req, conn, rt, st, ns):
        cl = self.cluster
        d = self.body_obj(req, rt)
        md = d.setdefault("metadata", {})
        if rt.namespaced:
            bns = md.get("namespace")
            if bns and bns != ns:
                # handlers/rest.go: EnsureObjectNamespaceMatchesRequestNamespace
                raise err_bad_request("the namespace of the provided object does not match the namespace sent on "
                                      "the request")
            md["namespace"] = ns
        else:
            md.pop("namespace", None)
        name = md.get("name") or ""
        if not name:
            gn = md.get("generateName") or ""
            if not gn:
                # apimachinery/pkg/api/validation/objectmeta.go ValidateObjectMetaAccessor
                raise err_invalid(rt.group, rt.kind, "", [field_err("FieldValueRequired", "metadata.name",
                                                                    "name or generateName is required")])
            base = gn[:63 - 5] if len(gn) > 58 else gn
            for _ in range(16):
                name = base + "".join(random.choice(GEN_CHARS) for _ in range(5))
                if ("%s/%s" % (ns, name) if rt.namespaced else name) not in st.objs:
                    break
            md["name"] = name
        self.validate_name(rt, name)
        if md.get("resourceVersion"):
            # storage/etcd3/store.go Create
            raise err_generic(500, "resourceVersion should not be set on objects to be created")
        if rt.crd is not None and self.crd_terminating(rt.crd):
            # customresource_handler.go serveResource: NewMethodNotSupported, message replaced
            raise ApiError(405, "MethodNotAllowed", "create not allowed while custom resource definition is "
                           "terminating", {"group": rt.group, "kind": rt.plural})
        if rt.namespaced and ns not in cl.stores["namespaces"].objs:
            # plugin/pkg/admission/namespace/lifecycle: NewNotFound(namespaces)
            raise ApiError(404, "NotFound", 'namespaces "%s" not found' % ns, {"name": ns, "kind": "namespaces"})
        key = "%s/%s" % (ns, name) if rt.namespaced else name
        if key in st.objs:
            raise err_already_exists(rt, name)
        md["uid"] = str(uuid.uuid4())
        md["generation"] = 1
        md["creationTimestamp"] = now_rfc3339()
        for k in ("deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            md.pop(k, None)
        self.defaults(rt, d)
        if self.dry_run(req):
            md.pop("resourceVersion", None)
            self.respond_write(req, conn, rt, 201, data=rt.encode(d))
            return None
        obj = cl.store_new(st, d)
        self.respond_write(req, conn, rt, 201, obj=obj)
        self.post_write(rt)
        return None

    def defaults(self, rt, d):
        if rt.key == "customresourcedefinitions":
            # v1 defaults.go (singular, listKind, conversion None); strategy.go
            # PrepareForCreate: status reset, storedVersions = the storage version
            self.validate_crd(d)
            sp = d["spec"]
            names = sp["names"]
            names.setdefault("singular", names["kind"].lower())
            names.setdefault("listKind", names["kind"] + "List")
            sp.setdefault("conversion", {"strategy": "None"})
            d["status"] = {"acceptedNames": {"plural": "", "kind": ""},
                           "storedVersions": [v["name"] for v in sp["versions"] if v.get("storage")]}
            canon_crd(d)
            return
        if rt.key == "apiservices":
            d["status"] = {}   # strategy.go PrepareForCreate; availability sets it
            return
        if rt.plural == "pods":
            st = d.setdefault("status", {})
            st.setdefault("phase", "Pending")
            st.setdefault("qosClass", "BestEffort")
            sp = d.setdefault("spec", {})
            sp.setdefault("restartPolicy", "Always")
            sp.setdefault("schedulerName", "default-scheduler")
            sp.setdefault("serviceAccountName", "default")
            sp.setdefault("dnsPolicy", "ClusterFirst")
            sp.setdefault("terminationGracePeriodSeconds", 30)
        elif rt.plural == "namespaces":
            d.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
            d["status"] = {"phase": "Active"}
            d["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = d["metadata"]["name"]
        elif rt.plural == "secrets":
            d.setdefault("type", "Opaque")
            sd = d.pop("stringData", None)
            if isinstance(sd, dict):
                data = d.setdefault("data", {})
                for k, v in sd.items():
                    data[k] = base64.b64encode(str(v).encode()).decode()
        elif rt.plural == "services":
            sp = d.setdefault("spec", {})
            sp.setdefault("type", "ClusterIP")
            if "clusterIP" not in sp:
                ip = "10.96.%d.%d" % (random.randint(1, 254), random.randint(1, 254))
                sp["clusterIP"] = ip
                sp["clusterIPs"] = [ip]
            sp.setdefault("sessionAffinity", "None")
            d.setdefault("status", {"loadBalancer": {}})

    def merged_for_write(self, rt, prev_d, new_d, sub):
        """Apply status-subresource rules; returns the object to store."""
        if sub == "status":
            # a status update changes status only (metadata and spec from the stored object)
            out = dict(prev_d)
            if "status" in new_d:
                out["status"] = new_d["status"]
            out["metadata"] = dict(prev_d.get("metadata", {}))
            return out
        if sub == "finalize":
            out = dict(prev_d)
            if "spec" in new_d:
                out["spec"] = new_d["spec"]
            return out
        out = dict(new_d)
        if rt.has_status:
            if "status" in prev_d:
                out["status"] = prev_d["status"]
            else:
                out.pop("status", None)
        return out

    def finish_write(self, req, conn, rt, st, prev, d, sub):
        """Common tail of update and patch: preserve immutable metadata, bump generation,
        skip no-op writes, store."""
        cl = self.cluster
        prev_d = prev.dict()
        d = self.merged_for_write(rt, prev_d, d, sub)
        md = d.setdefault("metadata", {})
        pmd = prev_d["metadata"]
        for k in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "generation"):
            if k in pmd:
                md[k] = pmd[k]
            else:
                md.pop(k, None)
        if d.get("spec") != prev_d.get("spec") and sub is None:
            md["generation"] = int(pmd.get("generation", 1)) + 1
        md["resourceVersion"] = str(prev.rv)
        if rt.plural == "secrets" and isinstance(d.get("stringData"), dict):
            data = d.setdefault("data", {})
            for k, v in d.pop("stringData").items():
                data[k] = base64.b64encode(str(v).encode()).decode()
        data = rt.encode(d)
        if data == prev.data or self.dry_run(req):
            # etcd3 GuaranteedUpdate: an unchanged object is not written (no new rv)
            if self.dry_run(req):
                self.respond_write(req, conn, rt, 200, data=data)
            else:
                self.respond_write(req, conn, rt, 200, obj=prev)
            return None
        if rt.key == "customresourcedefinitions":
            canon_crd(d)
        obj = cl.store_update(st, d, prev)
        self.respond_write(req, conn, rt, 200, obj=obj)
        self.post_write(rt)
        return None

    def write_scale(self, req, conn, rt, st, key, name, patch_ct=None):
        prev = self.must_get(rt, st, key, name)
        cur = self.scale_of(rt, prev)
        try:
            body = json.loads(req.body or b"null")
        except ValueError as e:
            raise err_bad_request("error decoding Scale: %s" % e)
        if patch_ct is None:
            new = body
        elif patch_ct == "application/json-patch+json":
            try:
                new = json_patch(cur, body)
            except PatchError as e:
                raise ApiError(422, "Invalid", str(e), {})
        else:
            new = merge_patch(cur, body)
        if not isinstance(new, dict):
            raise err_bad_request("the object provided is unrecognized (must be of type Scale)")
        brv = (new.get("metadata") or {}).get("resourceVersion")
        if brv and brv != str(prev.rv):
            raise err_conflict(rt, name, OBJ_MODIFIED)
        reps = (new.get("spec") or {}).get("replicas")
        if not isinstance(reps, int) or reps < 0:
            raise err_invalid("autoscaling", "Scale", name, [field_err(
                "FieldValueInvalid", "spec.replicas", "must be greater than or equal to 0", reps)])
        d = prev.dict()
        d.setdefault("spec", {})["replicas"] = reps
        d["metadata"]["generation"] = int(d["metadata"].get("generation", 1)) + (1 if reps != cur["spec"]["replicas"] else 0)
        obj = self.cluster.store_update(st, d, prev) if reps != cur["spec"]["replicas"] else prev
        return self.respond_scale(req, conn, rt, self.scale_of(rt, obj))
        return None

    def do_update(self, req, conn, rt, st, ns, key, name, sub):
        if sub == "scale":
            return self.write_scale(req, conn, rt, st, key, name)
        d = self.body_obj(req, rt)
        md = d.setdefault("metadata", {})
        bname = md.get("name", "")
        if bname != name:
            # handlers/update.go
            raise err_bad_request("the name of the object (%s) does not match the name on the URL (%s)"
                                  % (bname, name))
        if rt.namespaced and md.get("namespace") and md["namespace"] != ns:
            raise err_bad_request("the namespace of the provided object does not match the namespace sent on "
                                  "the request")
        prev = self.must_get(rt, st, key, name)
        brv = md.get("resourceVersion")
        if brv and brv != str(prev.rv):
            raise err_conflict(rt, name, OBJ_MODIFIED)
        return self.finish_write(req, conn, rt, st, prev, d, sub)

    def do_patch(self, req, conn, rt, st, ns, key, name, sub):
        ct = req.headers.get("content-type", "").split(";")[0].strip().lower()
        kinds = ("application/json-patch+json", "application/merge-patch+json", "application/strategic-merge-patch+json",
                 "application/apply-patch+yaml")
        if ct not in kinds:
            # handlers/patch.go
            raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - accepted "
                           "media types include: application/json-patch+json, application/merge-patch+json, "
                           "application/apply-patch+yaml, application/strategic-merge-patch+json")
        if sub == "scale":
            return self.write_scale(req, conn, rt, st, key, name, ct)
        try:
            patch = json.loads(req.body or b"null")
        except (ValueError, UnicodeDecodeError) as e:
            raise err_bad_request("error decoding patch: %s" % e)
        prev = st.objs.get(key)
        if prev is None:
            if ct == "application/apply-patch+yaml" and sub is None and isinstance(patch, dict):
                patch.setdefault("metadata", {})["name"] = name
                req.body = dumpb(patch)
                return self.do_create(req, conn, rt, st, ns)
            raise err_not_found(rt, name)
        cur = prev.dict()
        try:
            if ct == "application/json-patch+json":
                new = json_patch(cur, patch)
            elif ct == "application/merge-patch+json" or ct == "application/apply-patch+yaml":
                if not isinstance(patch, dict):
                    raise PatchError("patch must be a JSON object")
                new = merge_patch(cur, patch)
            else:
                if not isinstance(patch, dict):
                    raise PatchError("patch must be a JSON object")
                new = strategic_merge_patch(cur, patch)
        except PatchError as e:
            raise ApiError(422, "Invalid", str(e), {})
        if not isinstance(new, dict):
            raise ApiError(422, "Invalid", "patched object is not a JSON object", {})
        self.check_kind(new, rt)
        nmd = new.setdefault("metadata", {})
        if nmd.get("name") != name:
            raise err_bad_request("the name of the object (%s) does not match the name on the URL (%s)"
                                  % (nmd.get("name", ""), name))
        prv = nmd.get("resourceVersion")
        if prv and prv != str(prev.rv):
            raise err_conflict(rt, name, OBJ_MODIFIED)
        return self.finish_write(req, conn, rt, st, prev, new, sub)

    def do_delete(self, req, conn, rt, st, key, name):
        cl = self.cluster
        prev = self.must_get(rt, st, key, name)
        opts = {}
        if req.body:
            try:
                opts = json.loads(req.body)
            except (ValueError, UnicodeDecodeError) as e:
                raise err_bad_request("error decoding DeleteOptions: %s" % e)
        pre = (opts or {}).get("preconditions") or {}
        why = None
        if pre.get("uid") and pre["uid"] != prev.uid:
            why = "Precondition failed: UID in precondition: %s, UID in object meta: %s" % (pre["uid"], prev.uid)
        elif pre.get("resourceVersion") and pre["resourceVersion"] != str(prev.rv):
            why = "Precondition failed: ResourceVersion in precondition: %s, ResourceVersion in object meta: %d" % (
                pre["resourceVersion"], prev.rv)
        if why:
            # storage/interfaces.go Preconditions.Check -> NewInvalidObjError -> NewConflict
            raise err_conflict(rt, name, "StorageError: invalid object, Code: 4, Key: /registry/%s/%s, "
                                         "ResourceVersion: 0, AdditionalErrorMsg: %s" % (rt.plural, key, why))
        if rt.key == "customresourcedefinitions":
            return self.crd_delete(req, conn, rt, st, prev)
        if self.dry_run(req):
            deleted = prev
        else:
            deleted = cl.store_delete(st, prev)
            self.post_write(rt)
            if rt.plural == "namespaces":
                for ost in cl.stores.values():
                    if ost.rt.namespaced:
                        lo, hi = ost.range_for_ns(ost.keys, name)
                        for k in list(ost.keys[lo:hi]):
                            cl.store_delete(ost, ost.objs[k])
        if rt.returns_obj:
            self.respond_write(req, conn, rt, 200, obj=deleted)
        else:
            # registry/generic/registry/store.go finalizeDelete: Status Success with details
            details = {"name": name}
            if rt.group:
                details["group"] = rt.group
            details["kind"] = rt.plural
            details["uid"] = prev.uid
            status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}
            if self.write_enc(req, rt) == "pb":
                conn.respond_api(200, self.pb_status(status), req, ctype=PB_CT)
            else:
                conn.respond_json(200, status, req)
        return None

    def do_deletecollection(self, req, conn, rt, st, ns):
        o = self.parse_opts(req, rt)
        lo, hi = st.range_for_ns(st.keys, ns)
        victims = [st.objs[k] for k in st.keys[lo:hi]
                   if (o.lsel is None or o.lsel.matches(st.objs[k].labels)) and
                   (o.fsel is None or o.fsel.matches(st.objs[k]))]
        out = []
        if not self.dry_run(req):
            for ob in victims:
                out.append(self.cluster.store_delete(st, ob))
            self.post_write(rt)
        else:
            out = victims
        if self.write_enc(req, rt) == "pb":
            return self._pb_list_send(req, conn, rt, ("json", None, "pb"), [self.pb_raw(rt, x) for x in out],
                                      self.cluster.rv, None, None)
        head, tail = rt.list_frame(self.cluster.rv)
        conn.respond_api(200, b"".join([head] + rt.item_parts(out) + [tail]), req)
        return None

    def scale_of(self, rt, obj):
        d = obj.dict()
        md = d["metadata"]
        reps = (d.get("spec") or {}).get("replicas", 1)
        sel = ",".join("%s=%s" % kv for kv in sorted((((d.get("spec") or {}).get("selector") or {})
                                                      .get("matchLabels") or {}).items()))
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {k: md[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                             if k in md},
                "spec": {"replicas": reps},
                "status": {"replicas": (d.get("status") or {}).get("replicas", reps), "selector": sel}}

    # -- logs -----------------------------------------------------------------
    def do_log(self, req, conn, st, key, name):
        rt = st.rt
        obj = self.must_get(rt, st, key, name)
        q = req.query
        follow = "follow" in q and kube_bool(q["follow"])
        try:
            tail = int(q.get("tailLines", "10"))
        except ValueError:
            raise err_bad_request('strconv.ParseInt: parsing %s: invalid syntax' % go_json_string(q["tailLines"]))
        lines = ["%s INFO %s: request served (line %d)\n" % (now_rfc3339(), name, i) for i in range(max(0, tail))]
        if not follow:
            conn.respond(200, "".join(lines).encode(), req, ctype=b"text/plain")
            return None
        return self._follow_log(req, conn, st, obj, lines)

    async def _follow_log(self, req, conn, st, obj, lines):
        conn.start_stream(req, ctype=b"text/plain")
        conn.write_chunk("".join(lines).encode())
        i = len(lines)
        end = self.loop.time() + 3600
        while not conn.closed and self.loop.time() < end and st.objs.get(obj.key) is not None:
            await asyncio.sleep(1.0)
            conn.write_chunk(("%s INFO %s: request served (line %d)\n" % (now_rfc3339(), obj.name, i)).encode())
            i += 1
        conn.end_stream()

    # -- exec -----------------------------------------------------------------
    def do_exec(self, req, conn, st, key, name, sub):
        rt = st.rt
        obj = self.must_get(rt, st, key, name)
        h = req.headers
        upgrade = h.get("upgrade", "").lower()
        q = req.query
        d = obj.dict()
        cnames = [c.get("name") for c in (d.get("spec") or {}).get("containers") or []]
        container = q.get("container") or (cnames[0] if cnames else "")
        if container not in cnames:
            raise err_bad_request("container %s is not valid for pod %s" % (container, name))
        command = req.qall("command")
        if sub == "exec" and not command:
            raise err_bad_request("you must specify at least 1 command")
        stdin = "stdin" in q and kube_bool(q["stdin"])
        stdout = "stdout" in q and kube_bool(q["stdout"])
        stderr = "stderr" in q and kube_bool(q["stderr"])
        tty = "tty" in q and kube_bool(q["tty"])
        if sub == "attach":
            command = ["cat"]
        if upgrade.startswith("spdy/3"):
            offered = [p.strip() for p in h.get("x-stream-protocol-version", "").split(",") if p.strip()]
            proto = next((p for p in offered if p in ("v5.channel.k8s.io", "v4.channel.k8s.io")), None)
            if proto is None:
                # apimachinery/pkg/util/httpstream/httpstream.go Handshake (403)
                raise ApiError(403, "Forbidden", "unable to upgrade: unable to negotiate protocol: client supports "
                               "%s, server supports [v5.channel.k8s.io v4.channel.k8s.io]" % offered, {})
            conn.transport.write(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
                                 b"X-Stream-Protocol-Version: %s\r\n\r\n" % proto.encode())
            sess = SpdyExecSession(self, conn, proto, command, stdin, stdout, stderr, tty, name)
            conn.upgraded = sess
            if conn.buf:
                data = bytes(conn.buf)
                conn.buf.clear()
                sess.feed(data)
            return sess.run()
        if upgrade != "websocket":
            raise err_bad_request("Upgrade request required")
        offered = [p.strip() for p in h.get("sec-websocket-protocol", "").split(",") if p.strip()]
        proto = next((p for p in offered if p in ("v5.channel.k8s.io", "v4.channel.k8s.io")), None)
        wskey = h.get("sec-websocket-key")
        if proto is None or not wskey:
            raise err_bad_request("requested protocol(s) are not supported: %s; supports [v5.channel.k8s.io "
                                  "v4.channel.k8s.io]" % offered)
        accept = base64.b64encode(hashlib.sha1(wskey.encode() + WS_GUID).digest())
        conn.transport.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                             b"Sec-WebSocket-Accept: %s\r\nSec-WebSocket-Protocol: %s\r\n\r\n"
                             % (accept, proto.encode()))
        sess = ExecSession(self, conn, proto, command, stdin, stdout, stderr, tty, name)
        conn.upgraded = sess
        if conn.buf:
            data = bytes(conn.buf)
            conn.buf.clear()
            sess.feed(data)
        return sess.run()

    # -- TokenReview / SubjectAccessReview (with --policy) ------------------------
    def review(self, req, conn, group, plural):
        """POST /apis/authentication.k8s.io/v1/tokenreviews (pkg/registry/authentication/
        tokenreview/storage.go) and /apis/authorization.k8s.io/v1/subjectaccessreviews
        (pkg/registry/authorization/subjectaccessreview/rest.go): 201 with the object
        echoed as its Go type encodes it and a status."""
        if req.method != "POST":
            raise ERR_METHOD
        kind = "TokenReview" if plural == "tokenreviews" else "SubjectAccessReview"
        rt = argparse.Namespace(kind=kind, api_version=group + "/v1")
        d = self.body_obj(req, rt)
        md = d.get("metadata") or {}
        spec = d.get("spec") if isinstance(d.get("spec"), dict) else {}
        hang = self.args.hang_token_prefix
        if kind == "TokenReview" and hang and str(spec.get("token") or "").startswith(hang):
            return self._hanging_review()
        if kind == "TokenReview":
            out_spec, status = self.token_review(spec)
        else:
            out_spec, status = self.access_review(spec)
        meta = {}
        for k in ("name", "generateName"):
            if md.get(k):
                meta[k] = md[k]
        meta["creationTimestamp"] = None   # a zero metav1.Time encodes as null
        for k in ("labels", "annotations"):
            if isinstance(md.get(k), dict) and md[k]:
                meta[k] = {kk: md[k][kk] for kk in sorted(md[k])}
        # handlers/create.go runs the field manager on every create: one Update entry
        # for the fields the request set (spec only here; the empty new object already
        # has "spec":{}, so spec itself is not "added", a pointer/map under it is: ".")
        fields = _fields_v1(out_spec)
        if fields:
            ent = {}
            mgr = req.query.get("fieldManager") or _prefix_from_user_agent(req.headers.get("user-agent", ""))
            if mgr:
                ent["manager"] = mgr
            ent.update((("operation", "Update"), ("apiVersion", rt.api_version), ("time", now_rfc3339()),
                        ("fieldsType", "FieldsV1"), ("fieldsV1", {"f:spec": fields})))
            meta["managedFields"] = [ent]
        self.stats["create " + plural] += 1
        conn.respond_json(201, {"kind": kind, "apiVersion": rt.api_version, "metadata": meta, "spec": out_spec,
                                "status": status}, req)
        return None

    async def _hanging_review(self):
        """--hang-token-prefix: a TokenReview that never answers; it ends when its
        client closes the connection (Conn.connection_lost cancels this task)."""
        h = self.hanging_reviews
        h["started"] += 1
        h["open"] += 1
        try:
            await self.loop.create_future()
        finally:
            h["open"] -= 1
            h["closed_by_client"] += 1

    def token_review(self, spec):
        out = {}
        token = spec.get("token") or ""
        if token:
            out["token"] = str(token)
        if spec.get("audiences"):
            out["audiences"] = [str(x) for x in spec["audiences"]]
        if not token:
            raise err_bad_request("token is required for TokenReview in authentication")
        # the whole request authenticator on a request with only "Authorization: Bearer
        # <token>"; token authenticators are audience-agnostic (authenticator/audiences.go):
        # the wanted audiences (spec, else --api-audiences) must meet the API's.
        tok = self.bearer("Bearer " + token)
        apiauds = self.policy.audiences
        want = out.get("audiences") or apiauds
        inter = [x for x in want if x in apiauds]
        if tok is None:
            if not self.args.anonymous_auth:
                return out, {"user": {}}
            # anonymous has no audiences: storage.go's badAuthenticatorAuds
            raise ApiError(500, "InternalError", "Internal error occurred: error validating audiences",
                           {"causes": [{"message": "error validating audiences"}]})
        u = self.token_user(tok) if inter else None
        if u is None:
            # bearertoken.go: no authenticator said yes and none failed -> invalidToken
            return out, {"user": {}, "error": "invalid bearer token"}
        return out, {"authenticated": True, "user": _user_json(u), "audiences": inter}

    def access_review(self, spec):
        ra, nra = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
        ra = ra if isinstance(ra, dict) else None
        nra = nra if isinstance(nra, dict) else None
        out = {}
        if ra is not None:
            out["resourceAttributes"] = {k: str(ra[k]) for k in ("namespace", "verb", "group", "version", "resource",
                                                                 "subresource", "name") if ra.get(k)}
        if nra is not None:
            out["nonResourceAttributes"] = {k: str(nra[k]) for k in ("path", "verb") if nra.get(k)}
        user = str(spec.get("user") or "")
        groups = [str(g) for g in spec.get("groups") or []]
        extra = {str(k): [str(x) for x in v or []] for k, v in (spec.get("extra") or {}).items()}
        uid = str(spec.get("uid") or "")
        if user:
            out["user"] = user
        if groups:
            out["groups"] = groups
        if extra:
            out["extra"] = {k: extra[k] for k in sorted(extra)}
        if uid:
            out["uid"] = uid
        # pkg/apis/authorization/validation/validation.go ValidateSubjectAccessReviewSpec (1.31)
        errs = []
        if ra is not None and nra is not None:
            n = out["nonResourceAttributes"]
            errs.append(("FieldValueInvalid", "spec.nonResourceAttributes",
                         "Invalid value: authorization.NonResourceAttributes{Path:%s, Verb:%s}: cannot be specified "
                         "in combination with resourceAttributes" % (go_quote(n.get("path", "")),
                                                                     go_quote(n.get("verb", "")))))
        if ra is None and nra is None:
            errs.append(("FieldValueInvalid", "spec.resourceAttributes", 'Invalid value: "null": exactly one of '
                         "nonResourceAttributes or resourceAttributes must be specified"))
        if not user and not groups:
            errs.append(("FieldValueInvalid", "spec.user",
                         'Invalid value: "": at least one of user or group must be specified'))
        if errs:
            # NewInvalid(authorizationapi.Kind(sar.Kind), "", errs): the internal object's
            # Kind is empty, so the qualified kind is ".authorization.k8s.io"
            msgs = ["%s: %s" % (f, b) for (_t, f, b) in errs]
            agg = msgs[0] if len(msgs) == 1 else "[" + ", ".join(msgs) + "]"
            raise ApiError(422, "Invalid", '.authorization.k8s.io "" is invalid: ' + agg,
                           {"group": "authorization.k8s.io",
                            "causes": [{"reason": t, "message": b, "field": f} for (t, f, b) in errs]})
        u = UserInfo(user, uid, groups, extra)   # as given: no system:authenticated added
        if ra is not None:
            r = out["resourceAttributes"]
            a = Attrs(u, r.get("verb", ""), group=r.get("group", ""), version=r.get("version") or "*",
                      resource=r.get("resource", ""), sub=r.get("subresource", ""), ns=r.get("namespace", ""),
                      name=r.get("name", ""))
        else:
            n = out["nonResourceAttributes"]
            a = Attrs(u, n.get("verb", ""), path=n.get("path", ""), is_resource=False)
        allowed, reason = self.policy.authorize(a)
        status = {"allowed": allowed}   # RBAC never says Deny: no "denied"
        if reason:
            status["reason"] = reason
        return out, status

    # -- controls (/apisim/...) -------------------------------------------------
    def control(self, req, conn):
        path = req.path.rstrip("/")
        cl = self.cluster
        m = req.method
        if path == "/apisim/echo-upgrade":
            if req.headers.get("upgrade", "").lower() != "kwc-echo":
                conn.respond_json(400, {"error": "Upgrade: kwc-echo required"}, req, nl=False)
                return None
            conn.transport.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: kwc-echo\r\nConnection: Upgrade\r\n\r\n")
            conn.upgraded = EchoUpgrade(conn)
            if conn.buf:
                data = bytes(conn.buf)
                conn.buf.clear()
                conn.upgraded.feed(data)
            return None
        if path == "/apisim/upgrade-answer":
            return self.upgrade_answer(req, conn)
        try:
            body = json.loads(req.body) if req.body else {}
        except ValueError as e:
            conn.respond_json(400, {"error": "bad JSON: %s" % e}, req, nl=False)
            return None
        if not isinstance(body, dict):
            body = {}
        try:
            out = self.control_op(path, m, body, req)
        except (KeyError, ValueError, TypeError) as e:
            conn.respond_json(400, {"error": "%s: %s" % (e.__class__.__name__, e)}, req, nl=False)
            return None
        if out is None:
            conn.respond_json(404, {"error": "unknown control %s %s" % (m, path)}, req, nl=False)
        else:
            conn.respond_json(200, out, req, nl=False)
        return None

    def upgrade_answer(self, req, conn):
        """GET|POST /apisim/upgrade-answer?status=N[&framing=length|chunked|close][&body=T]
        [&after=T]: an upstream that answers an (Upgrade) request with the status the test
        chose. 101 (only for a request that asks for an Upgrade other than h2c; else 400)
        names the requested protocol, then writes `after` and echoes every byte it gets, as
        /apisim/echo-upgrade. Any other status is an ordinary answer of text/plain `body`
        framed as asked (close: Connection: close and the connection ends), after which the
        connection stays open like Go's net/http server after an Upgrade request it did not
        hijack: bytes pipelined behind the request are read as the next request. Logged in
        /apisim/requests (unlike the other /apisim endpoints) with the request body."""
        self.seen_seq += 1
        head = self.request_head(req)
        head["body"] = req.body.decode("latin-1")
        self.seen.append(head)
        q = req.query
        code = int(q.get("status", "101"))
        up = req.headers.get("upgrade", "")
        asked = [t.strip() for t in up.split(",") if t.strip() and t.strip().lower() != "h2c"]
        conn_tokens = [t.strip().lower() for t in req.headers.get("connection", "").split(",")]
        if code == 101:
            if not asked or "upgrade" not in conn_tokens:
                conn.respond_json(400, {"error": "not an upgrade request"}, req, nl=False)
                return None
            conn.transport.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: %s\r\nConnection: Upgrade\r\n\r\n%s"
                                 % (asked[0].encode("latin-1"), q.get("after", "").encode("latin-1")))
            conn.upgraded = EchoUpgrade(conn)
            if conn.buf:
                data = bytes(conn.buf)
                conn.buf.clear()
                conn.upgraded.feed(data)
            return None
        body = q.get("body", "").encode("latin-1") * int(q.get("repeat", "1"))
        framing = q.get("framing", "length")
        h = b"HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nX-Apisim-Upgrade-Answer: %d\r\n" % (
            code, REASONS.get(code, b"Unknown"), code)
        if framing == "chunked":
            out = h + b"Transfer-Encoding: chunked\r\n\r\n"
            step = 3 if len(body) < 64 else 65536   # several chunks
            for i in range(0, len(body), step):
                out += b"%x\r\n%s\r\n" % (len(body[i:i + step]), body[i:i + step])
            out += b"0\r\n\r\n"
        elif framing == "close":
            out = h + b"Connection: close\r\n\r\n" + body
            conn.keep_alive = False
        else:
            out = h + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        conn.transport.write(out)
        return None

    def open_watches_by_encoding(self):
        """{resource: {"json": n, "protobuf": m}} of the watches open now (resources
        with none left out, both encodings always named)."""
        out = {}
        for (plural, enc), n in sorted(self.watch_enc_counts.items()):
            if n:
                out.setdefault(plural, {"json": 0, "protobuf": 0})[enc] = n
        return out

    def control_op(self, path, m, body, req):
        cl = self.cluster
        if path == "/apisim/stats" and m == "GET":
            by_enc = self.open_watches_by_encoding()
            return {"rv": cl.rv, "floor": cl.compacted,
                    "floors": {p: cl.floor(s) for p, s in cl.stores.items()},
                    "requests": dict(self.stats),
                    "open_watches": {p: n for p, n in self.watch_counts.items() if n},
                    "open_watches_by_encoding": by_enc,
                    "watches_open": by_enc,   # the same (the name kwc's 20_protobuf reads)
                    "objects": {p: len(s.objs) for p, s in cl.stores.items() if s.objs},
                    "events": cl.events_total, "connections": len(self.conns),
                    "churn": self.churn_info(), "uptime": round(time.time() - self.started, 3),
                    "hanging_reviews": dict(self.hanging_reviews)}
        if path == "/apisim/requests" and m == "GET":
            try:
                since = int(req.query.get("since", "0") or 0)
            except ValueError:
                raise ValueError("since: not an integer")
            return {"seq": self.seen_seq, "requests": [h for h in self.seen if h["seq"] > since]}
        if path == "/apisim/policy" and m == "GET":
            return {"policy": self.policy.doc if self.policy is not None else None}
        if path == "/apisim/policy" and m == "POST":
            self.policy = Policy(body)
            return {"ok": True, "tokens": len(self.policy.tokens), "rules": len(self.policy.rules)}
        if path == "/apisim/reset-stats" and m == "POST":
            self.stats.clear()
            return {"ok": True}
        if path == "/apisim/health":
            return {"ok": True, "rv": cl.rv}
        if path == "/apisim/state" and m == "GET":
            plural = req.query.get("resource", "pods")
            st = cl.store_for(plural)
            ns = req.query.get("namespace")
            lo, hi = st.range_for_ns(st.keys, ns)
            return {"resource": plural, "rv": cl.rv,
                    "items": [{"key": k, "rv": st.objs[k].rv, "labels": st.objs[k].labels} for k in st.keys[lo:hi]]}
        if m != "POST":
            return None
        if path == "/apisim/seed":
            plural = body.get("resource", "pods")
            cl.store_for(plural)
            t0 = time.monotonic()
            nss = body.get("namespaces")
            if isinstance(nss, int):
                nss = ["ns-%d" % i for i in range(nss)] if nss > 1 else None
            made = cl.seed(plural, int(body.get("count", 1)), ns=body.get("namespace"),
                           nodes=int(body.get("nodes", self.args.nodes or 1)), size=int(body.get("size", 0) or 0),
                           namespaces=nss, prefix=body.get("prefix"))
            if made > 10000:
                gc.freeze()
            return {"created": made, "rv": cl.rv, "seconds": round(time.monotonic() - t0, 3)}
        if path == "/apisim/churn":
            args = (body.get("resources") or ["pods"],
                    body.get("mix") or {"update": 0.8, "create": 0.1, "delete": 0.1},
                    float(body.get("label_flip", 0.0)), body.get("namespace"))
            if "count" in body:
                return self.churn_burst(int(body["count"]), *args)
            self.set_churn(float(body.get("rate", 0)), *args)
            return self.churn_info()
        if path == "/apisim/write":
            return self.scripted_write(body)
        if path == "/apisim/compact":
            floor = cl.compact(int(body.get("rv", cl.rv)))
            return {"floor": floor, "rv": cl.rv}
        if path == "/apisim/drop-watches":
            plural = body.get("resource")
            n = 0
            for st in cl.stores.values():
                if plural and plural not in (st.rt.plural, st.rt.key):
                    continue
                for w in list(st.watchers):
                    w.finish(clean=False)
                    w.conn.abort()
                    n += 1
            return {"dropped": n}
        if path == "/apisim/fail":
            if body.get("clear"):
                self.fails = []
            else:
                self.add_fail(body)
            return {"pending": self.fails}
        return None

    def add_fail(self, body):
        """A fault rule (POST /apisim/fail, --fail)."""
        mode = body.get("mode", "status")
        if mode not in ("status", "reset", "delay", "hang"):
            raise ValueError("mode must be status|reset|delay|hang")
        self.fails.append({"count": int(body.get("count", 1)), "match": body.get("match", "") or "",
                           "mode": mode, "status": int(body.get("status", 503)),
                           "delay": float(body.get("delay", 1.0))})

    def scripted_write(self, body):
        cl = self.cluster
        verb = body.get("verb", "update")
        plural = body.get("resource", "pods")
        st = cl.store_for(plural)
        rt = st.rt
        ns = body.get("namespace") or ("default" if rt.namespaced else "")
        name = body["name"]
        key = "%s/%s" % (ns, name) if rt.namespaced else name
        stamp = str(time.time_ns())
        if verb == "create":
            if key in st.objs:
                raise ValueError("%s already exists" % key)
            if rt.namespaced:
                cl.ensure_namespace(ns)
            if body.get("object"):
                d = body["object"]
                d.setdefault("metadata", {}).update(name=name)
                if rt.namespaced:
                    d["metadata"]["namespace"] = ns
                d["kind"], d["apiVersion"] = rt.kind, rt.api_version
                d["metadata"].setdefault("uid", str(uuid.uuid4()))
                d["metadata"].setdefault("creationTimestamp", now_rfc3339())
            else:
                d = self.build_new(st, name, ns)
            md = d["metadata"]
            if "labels" in body:
                md["labels"] = dict(body["labels"] or {})
            if body.get("annotations"):
                ann_of(md).update(body["annotations"])
            ann_of(md)[WRITTEN_AT] = stamp
            obj = cl.store_new(st, d)
            self.post_write(rt)
            return {"rv": obj.rv, "key": key}
        prev = st.objs.get(key)
        if prev is None:
            raise ValueError("%s not found" % key)
        if verb == "delete":
            obj = cl.store_delete(st, prev)
            self.post_write(rt)
            return {"rv": obj.rv, "key": key}
        d = prev.dict()
        md = d["metadata"]
        if "labels" in body:
            md["labels"] = dict(body["labels"] or {})
        if body.get("annotations"):
            ann_of(md).update(body["annotations"])
        if body.get("status") is not None:
            d["status"] = merge_patch(d.get("status") or {}, body["status"])
        if body.get("spec") is not None:
            d["spec"] = merge_patch(d.get("spec") or {}, body["spec"])
        ann_of(md)[WRITTEN_AT] = stamp
        obj = cl.store_update(st, d, prev)
        self.post_write(rt)
        return {"rv": obj.rv, "key": key}

    def build_new(self, st, name, ns):
        cl = self.cluster
        i = st.seq
        st.seq += 1
        v = cl.sample_vars(st, i, ns, max(1, len(cl.stores["nodes"].objs)), 0)
        v["name"] = name
        v["rv"] = "0"
        return st.rt.builder(v)

    # -- churn ----------------------------------------------------------------
    def churn_info(self):
        c = self.churn
        if not c:
            return {"rate": 0}
        return {"rate": c["rate"], "resources": c["resources"], "mix": c["mix"], "label_flip": c["label_flip"],
                "done": c["done"]}

    def churn_spec(self, rate, resources, mix, label_flip, namespace):
        for r in resources:
            self.cluster.store_for(r)
        tot = sum(float(v) for v in mix.values()) or 1.0
        return {"rate": rate, "resources": list(resources),
                "mix": {k: float(v) / tot for k, v in mix.items()}, "label_flip": label_flip,
                "namespace": namespace, "done": 0}

    def set_churn(self, rate, resources, mix, label_flip, namespace=None):
        spec = self.churn_spec(rate, resources, mix, label_flip, namespace)
        if self.churn_task is not None:
            self.churn_task.cancel()
            self.churn_task = None
        if rate <= 0:
            self.churn = None
            return
        self.churn = spec
        self.churn_task = self.loop.create_task(self._churn_loop(self.churn))

    def churn_burst(self, count, resources, mix, label_flip, namespace=None):
        """count churn writes at once (a running churn goes on): a test that
        waits for its watchers to reach the answer's rv before the next burst
        knows how far any of them can lag."""
        if count < 0:
            raise ValueError("count must be >= 0")
        c = self.churn_spec(0, resources, mix, label_flip, namespace)
        rng = random.Random(self.cluster.rng.random())
        ops = list(c["mix"].items())
        for _ in range(count):
            self.churn_one(c, rng, ops)
        return {"done": count, "rv": self.cluster.rv}

    async def _churn_loop(self, c):
        loop = self.loop
        start = loop.time()
        done = 0
        rng = random.Random(self.args.seed)
        ops = list(c["mix"].items())
        while True:
            now = loop.time()
            due = int((now - start) * c["rate"]) - done
            if due > c["rate"] * 0.5:  # more than half a second behind: skip the backlog
                start = now - done / c["rate"]
                due = int(c["rate"] * 0.01) + 1
            for _ in range(due):
                self.churn_one(c, rng, ops)
                done += 1
            c["done"] = done
            # evenly paced: wake when the next write is due (a benchmark's
            # "N events/s" means one every 1/N s, not bursts), at most 20 ms
            await asyncio.sleep(min(0.02, max(0.0, start + (done + 1) / c["rate"] - loop.time())))

    def churn_one(self, c, rng, ops):
        cl = self.cluster
        st = cl.store_for(c["resources"][rng.randrange(len(c["resources"]))])
        r = rng.random()
        op = ops[-1][0]
        for name, p in ops:
            if r < p:
                op = name
                break
            r -= p
        stamp = str(time.time_ns())
        ns_only = c.get("namespace")
        if op != "create" and st.keys:
            if ns_only and st.rt.namespaced:
                lo, hi = st.range_for_ns(st.keys, ns_only)
                if lo == hi:
                    op = "create"
                else:
                    key = st.keys[rng.randrange(lo, hi)]
            else:
                key = st.keys[rng.randrange(len(st.keys))]
        elif op != "create":
            op = "create"
        if op == "delete":
            cl.store_delete(st, st.objs[key], stamp=stamp)
            return
        if op == "update":
            prev = st.objs[key]
            d = prev.dict()
            md = d["metadata"]
            ann_of(md)[WRITTEN_AT] = stamp
            if c["label_flip"] and rng.random() < c["label_flip"]:
                labels = md.setdefault("labels", {})
                labels["flip"] = "b" if labels.get("flip") == "a" else "a"
            cl.store_update(st, d, prev)
            return
        rt = st.rt
        if rt.namespaced:
            if ns_only:
                ns = ns_only
            elif st.keys:
                ns = st.objs[st.keys[rng.randrange(len(st.keys))]].ns
            else:
                ns = "default"
            cl.ensure_namespace(ns)
        else:
            ns = ""
        name = "churn-%d" % st.seq
        key = "%s/%s" % (ns, name) if rt.namespaced else name
        if key in st.objs:
            st.seq += 1
            return
        d = self.build_new(st, name, ns)
        ann_of(d["metadata"])[WRITTEN_AT] = stamp
        cl.store_new(st, d)

    # -- bookmarks ------------------------------------------------------------
    async def bookmark_loop(self):
        iv = self.args.bookmark_interval
        tick = min(1.0, max(0.02, iv / 5.0))
        cl = self.cluster
        while True:
            await asyncio.sleep(tick)
            now = self.loop.time()
            # kube's bookmark rv never runs ahead of the events a watcher was
            # sent: deliver what is pending before bookmarking the current rv
            if cl.pending:
                cl._flush()
            cur = cl.rv
            for st in cl.stores.values():
                if not st.watchers:
                    continue
                for w in list(st.watchers):
                    if not w.bookmarks or not w.live or w.next_bm is None or w.next_bm > now:
                        continue
                    if cur >= w.start_rv and cur >= w.last_rv:
                        w.send_bookmark(cur)
                    w.schedule_bookmark(now)


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description="apisim: a Kubernetes API server emulator")
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0 = ephemeral)")
    p.add_argument("--port-file", help="write the bound port here (atomically) once listening")
    p.add_argument("--pods", type=int, default=0)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--namespaces", type=int, default=1, help="pods spread over ns-0..ns-N-1 (1 = default)")
    p.add_argument("--churn", type=float, default=0.0, help="events per second at start")
    p.add_argument("--history", type=int, default=10000, help="events kept per resource")
    p.add_argument("--bookmark-interval", type=float, default=60.0)
    p.add_argument("--version", default="1.31", help="reported Kubernetes version 1.27..1.33")
    p.add_argument("--watch-list", default="accept", choices=("accept", "on", "off", "auto"),
                   help="sendInitialEvents: accept (default), on (+server-side defaulting like 1.32), "
                        "off (422 like 1.27-1.31/1.33), auto (by --version)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--pod-size", type=int, default=3000)
    p.add_argument("--tls-cert")
    p.add_argument("--tls-key")
    p.add_argument("--client-ca")
    p.add_argument("--token", help="a bearer token for an all-powerful user (with --policy: user admin, "
                                    "group system:masters)")
    p.add_argument("--token-file", help="bearer tokens of an all-powerful user, one per line, each optionally "
                                         "followed by its expiry (Unix seconds); re-read when it changes")
    p.add_argument("--policy", help="JSON: tokens and rules; turns on kube's authentication, impersonation and "
                                    "authorization (README.md)")
    p.add_argument("--anonymous-auth", type=go_bool_flag, nargs="?", const=True, default=True,
                   help="with --policy: requests without credentials are system:anonymous (default true)")
    p.add_argument("--log-requests", action="store_true")
    p.add_argument("--recent-requests", type=int, default=RECENT_REQUESTS,
                   help="request records kept for GET /apisim/requests (default %d)" % RECENT_REQUESTS)
    p.add_argument("--start-rv", type=int, default=0,
                   help="after seeding, the cluster's resourceVersion jumps to this (history compacted "
                        "up to it): with --seed and --cluster-uid, a restart that looks like the same "
                        "cluster coming back; lower than before, a restore to an older backup")
    p.add_argument("--cluster-uid", default="",
                   help="the kube-system namespace's uid, the conventional cluster id (default: random, "
                        "or from --seed)")
    p.add_argument("--fail", action="append", default=[], type=json.loads,
                   help="a fault rule as POST /apisim/fail takes it (JSON), in place from the first "
                        "request (repeatable)")
    p.add_argument("--hang-token-prefix", default="",
                   help="with --policy: a TokenReview of a token starting with this never answers "
                        "(until its client goes away)")
    a = p.parse_args(argv)
    if not re.match(r"^1\.(2[7-9]|3[0-3])$", a.version):
        p.error("--version must be 1.27 .. 1.33")
    return a


def seed_initial(app, args):
    cl = app.cluster
    for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
        cl.ensure_namespace(ns)
    nss = ["ns-%d" % i for i in range(args.namespaces)] if args.namespaces > 1 else ["default"]
    for ns in nss:
        cl.ensure_namespace(ns)
    # the "kubernetes" service and its endpoints, as in every cluster
    svc = build_service({"name": "kubernetes", "ns": "default", "uid": str(uuid.uuid4()), "rv": "0",
                         "ts": now_rfc3339(), "app": "kubernetes", "ip": "10.96.0.1"})
    svc["metadata"]["labels"] = {"component": "apiserver", "provider": "kubernetes"}
    svc["spec"]["ports"] = [{"name": "https", "protocol": "TCP", "port": 443, "targetPort": 6443}]
    del svc["spec"]["selector"]
    cl.store_new(cl.stores["services"], svc)
    # kube-aggregator's autoregister: a local APIService per built-in group version
    ts = now_rfc3339()
    for (g, v), (gp, vp) in sorted(BUILTIN_PRIORITY.items()):
        if (g, v) in app.builtin_gvs or g == "":
            cl.store_new(cl.stores["apiservices"], build_apiservice(g, v, gp, vp, "onstart", ts))
    # example.com/v1 widgets: a CRD made at start-up (established), and its APIService
    cl.store_new(cl.stores["customresourcedefinitions"], widgets_crd(ts))
    app.reconcile()
    if args.nodes > 0:
        cl.seed("nodes", args.nodes)
    if args.pods > 0:
        cl.seed("pods", args.pods, nodes=max(1, args.nodes), size=args.pod_size, namespaces=nss)
    if args.start_rv > cl.rv:
        # an etcd that has been written to before: rvs go on from there, older ones are compacted
        cl.rv = args.start_rv
        cl.compact(cl.rv)


_KEEP = []


async def amain(args):
    loop = asyncio.get_running_loop()
    app = App(args, loop)
    t0 = time.monotonic()
    _KEEP.append(app)   # freed by os._exit, not object by object
    seed_initial(app, args)
    for rule in args.fail:
        app.add_fail(rule)
    gc.freeze()         # seeded objects never need a cyclic-GC scan
    if args.pods:
        app.log("seeded %d pods in %.2fs (rv %d)" % (args.pods, time.monotonic() - t0, app.cluster.rv))
    host, _, port = args.listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    ctx = None
    if args.tls_cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls_cert, args.tls_key)
        ctx.set_alpn_protocols(["http/1.1"])
        if args.client_ca:
            ctx.load_verify_locations(args.client_ca)
            ctx.verify_mode = ssl.CERT_OPTIONAL
    server = await loop.create_server(lambda: Conn(app), host, int(port or 0), ssl=ctx, backlog=4096,
                                      reuse_address=True)
    app.port = server.sockets[0].getsockname()[1]
    app.host = host
    if args.port_file:
        tmp = "%s.tmp.%d" % (args.port_file, os.getpid())
        with open(tmp, "w") as f:
            f.write("%d\n" % app.port)
        os.replace(tmp, args.port_file)
    sys.stdout.write("apisim listening on %s://%s:%d\n" % ("https" if ctx else "http",
                                                          host if ":" not in host else "[%s]" % host, app.port))
    sys.stdout.flush()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [loop.create_task(app.bookmark_loop())]
    if args.churn > 0:
        app.set_churn(args.churn, ["pods"], {"update": 0.8, "create": 0.1, "delete": 0.1}, 0.0)
    await stop.wait()
    server.close()
    for c in list(app.conns):
        c.abort()
    for t in tasks:
        t.cancel()
    if app.churn_task:
        app.churn_task.cancel()


def main():
    args = parse_args()
    try:
        asyncio.run(amain(args))
    except KeyboardInterrupt:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    # skip freeing hundreds of MB object by object at interpreter exit
    os._exit(0)


if __name__ == "__main__":
    main()
