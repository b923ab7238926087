"""Adversarial identity suite: generated Impersonate-* cases sent to kwc
--auth=delegated and to apisim --policy side by side (issue 19).

The emulator is the oracle (its impersonation follows kube's
endpoints/filters/impersonation.go and Go's header parsing, see
tests/apisim/README.md). For every generated case the same request (same
credentials, same header lines byte for byte, an X-Case tag) goes directly to
apisim and through kwc, and two things are required:

  1. kwc's answer equals apisim's: the status, and the body -- byte for byte
     for every answer that is not a 2xx; 2xx bodies as JSON after the
     normalisations below;
  2. nothing reached apisim through kwc under an identity the caller may not
     assume: every record apisim keeps (GET /apisim/requests) of a request
     tagged with the case's X-Case that kwc sent (requestor "kwc") ran as
     exactly the user apisim derived for the direct request ({"user", "uid",
     "groups", "extra"}); when apisim refused the direct request's identity
     (403/500 of the impersonation filter), kwc sent nothing with that tag.

Normalisations (what legitimately differs between the two answers; nothing
else is normalised):
  - the metadata.resourceVersion of a list: apisim's is its current global
    rv, kwc's cache answers with the rv it has seen, and the writes of the
    write cases move it between the two requests (the items are compared;
    they live in namespace idt, which nothing writes after the seed);
  - a create's object (201) and a delete's Status (200): metadata.uid,
    metadata.resourceVersion, metadata.creationTimestamp and managedFields[].time
    of the object, details.uid of the Status: the direct request and the one
    through kwc create/delete two different objects of the same name (the
    test removes or re-creates it between them);
  - a watch is read until its first event (or its error body) and only that
    is compared; an exec upgrade's 101 is compared by status only.

Callers: a bearer token (policy token, user imp-tok) and a client certificate
(CN imp-cert, O cert-team), each allowed to impersonate SOME users, groups,
service accounts, uids and extra keys/values only (policy_doc()). Generated
dimensions (generate()): users (0-3 headers, allowed/denied, every service
account form), groups and extra values 0-70 each, uids 0-3, duplicates,
order, header-name case, SP/HTAB around values, obs-fold, empty values,
percent-encoded extra keys (upper/lower hex, %00, malformed %zz, non-ASCII,
an escaped capital, two spellings of one key, an empty key), system:masters
smuggled late in a long list; request kinds: cached reads (list and get at
resourceVersion=0), passthrough reads, creates and deletes, a cached and a
passthrough watch, and an exec upgrade. One case has more than 256
attributes: kwc must answer 431 with a Status and send nothing upstream.

IDENTITY_SEED=N repeats a run (default 1919; 0 draws a new seed, printed); IDENTITY_CASES=N sets the
number of generated cases (default 4000, plus the fixed ones); IDENTITY_SHOW=N
how many failing cases are shown in full (default 30, and every fixed one).
"""
import collections
import json
import os
import random
import socket
import ssl
import sys
import tempfile
import time
import unittest

import certs
import cluster
from cluster import APISIM, KWC_BIN, KWC_EXTRA_ARGS, KWC_WRAP, PYTHON, ClientTLS, Proc, ProcGroup, wait_for

P = certs.pki()
# a fixed seed by default (CI runs the same cases every time); IDENTITY_SEED=0
# draws a new one (printed) to explore
SEED = int(os.environ.get("IDENTITY_SEED", "1919") or 0) or random.SystemRandom().randrange(1, 1 << 31)
N_CASES = int(os.environ.get("IDENTITY_CASES", "4000"))
UA = "kwc-identity-test/1"
TOK = {"kwc": "tok-kwc-7c1d", "imp": "tok-imp-93ab", "admin": "tok-admin-11fe"}
MASTERS = "system:masters"

# -- the RBAC state -----------------------------------------------------------
OK_USERS = ["u-ok1", "u-ok2"]
BAD_USERS = ["u-bad", "root", "admin"]
SA_OK = ["system:serviceaccount:sa-ns:builder", "system:serviceaccount:sa-ns:a.b-c"]
SA_BAD = ["system:serviceaccount:other:builder"]
# not service accounts for kube (serviceaccount.SplitUsername): plain users,
# and the callers may impersonate them as users
SA_MALFORMED = ["system:serviceaccount:sa-ns", "system:serviceaccount:sa-ns:", "system:serviceaccount:sa-ns:a:b",
                "system:serviceaccount:SA-NS:builder", "system:serviceaccount::builder",
                "system:serviceaccount:sa-ns:Builder", "system:serviceaccount:sa_ns:builder"]
OK_GROUPS = ["g-ok1", "g-ok2", "g-ok3", "g-ok4", "g-ok5", "system:authenticated"]
CERT_GROUPS = ["g-ok1", "g-ok2", "g-ok3", "system:authenticated"]   # what imp-cert may impersonate
BAD_GROUPS = ["g-bad", MASTERS, "system:serviceaccounts:sa-ns"]
OK_UIDS = ["uid-ok1", "uid-ok2"]
BAD_UIDS = ["uid-bad"]
# extra key as the header names it (spellings) -> the key kube decodes, allowed values (None: any)
EXTRA_KEYS = {
    "scopes": (["scopes", "Scopes", "SCOPES", "sc%6fpes", "sc%6Fpes"], ["read", "write"]),
    "acme.io/team": (["acme.io%2fteam", "Acme.io%2FTeam", "ACME.IO%2fTEAM"], None),
    "nul\x00key": (["nul%00key", "NUL%00KEY"], None),
    "\u00e9t\u00e9": (["%c3%a9t%c3%a9", "%C3%A9T%C3%A9"], None),
    "%zz": (["%zz", "%ZZ"], None),
    "Upper": (["%55pper", "%55PPER"], None),   # an escaped capital stays a capital after the lower-casing
    "": ([""], None),                           # Impersonate-Extra-: an empty key
}
BAD_EXTRA_KEYS = {"denied-key": (["denied-key", "Denied-Key"], None)}
EXTRA_VALUES = ["read", "write", "x", "v 1", "\u00e9"]
EXTRA_KEYS_OF = {"nul-key": "nul\x00key", "escaped-capital": "Upper", "malformed-escape": "%zz",
                 "non-ascii-key": "\u00e9t\u00e9", "empty-key": ""}   # feature -> the extra key it adds


def policy_doc():
    imp = {"users": ["imp-tok"], "groups": ["cert-team"]}
    tok_only = {"users": ["imp-tok"]}
    rules = [
        {"name": "kwc-cache", "users": ["kwc"], "verbs": ["get", "list", "watch"], "apiGroups": [""],
         "resources": ["configmaps", "secrets"]},
        {"name": "kwc-reviews", "users": ["kwc"], "verbs": ["create"],
         "apiGroups": ["authentication.k8s.io", "authorization.k8s.io"],
         "resources": ["tokenreviews", "subjectaccessreviews"]},
        {"name": "kwc-impersonate", "users": ["kwc"], "verbs": ["impersonate"]},
        # what the callers may impersonate
        dict(imp, name="imp-users", verbs=["impersonate"], apiGroups=[""], resources=["users"],
             resourceNames=OK_USERS + SA_MALFORMED),
        dict(tok_only, name="imp-sa", verbs=["impersonate"], apiGroups=[""], resources=["serviceaccounts"],
             namespaces=["sa-ns"]),
        dict(tok_only, name="imp-groups-tok", verbs=["impersonate"], apiGroups=[""], resources=["groups"],
             resourceNames=OK_GROUPS),
        {"name": "imp-groups-cert", "groups": ["cert-team"], "verbs": ["impersonate"], "apiGroups": [""],
         "resources": ["groups"], "resourceNames": CERT_GROUPS},
        dict(imp, name="imp-uids", verbs=["impersonate"], apiGroups=["authentication.k8s.io"], resources=["uids"],
             resourceNames=OK_UIDS),
    ]
    for key, (_, values) in EXTRA_KEYS.items():
        r = dict(imp, name="imp-extra-%d" % len(rules), verbs=["impersonate"], apiGroups=["authentication.k8s.io"],
                 resources=["userextras/" + key if key else "userextras"])
        if values is not None:
            r["resourceNames"] = values
        rules.append(r)
    rights = [  # what the identities may do
        ("imp-tok", {"users": ["imp-tok"]}, ["get"], ["configmaps"], "idt"),
        ("g-ok1", {"groups": ["g-ok1"]}, ["get", "list", "watch"], ["configmaps"], "idt"),
        ("g-ok2", {"groups": ["g-ok2"]}, ["get", "list", "watch"], ["secrets"], "idt"),
        ("g-ok3", {"groups": ["g-ok3"]}, ["get", "list", "watch"], ["pods"], "idt"),
        ("u-ok1-read", {"users": ["u-ok1"]}, ["get", "list", "watch"], ["configmaps", "secrets", "pods"], "idt"),
        ("u-ok1-write", {"users": ["u-ok1"]}, ["create", "delete"], ["configmaps"], "idt-w"),
        ("u-ok1-exec", {"users": ["u-ok1"]}, ["create", "get"], ["pods/exec"], "idt"),
        ("sa-ns", {"groups": ["system:serviceaccounts:sa-ns"]}, ["get", "list", "watch"], ["secrets", "pods"],
         "idt"),
        ("sa-ns-write", {"groups": ["system:serviceaccounts:sa-ns"]}, ["create"], ["configmaps"], "idt-w"),
        ("sa-builder", {"users": [SA_OK[0]]}, ["delete"], ["configmaps"], "idt-w"),
    ]
    for name, subj, verbs, res, ns in rights:
        rules.append(dict(subj, name=name, verbs=verbs, apiGroups=[""], resources=res, namespaces=[ns]))
    return {"tokens": {TOK["kwc"]: {"user": "kwc"}, TOK["imp"]: {"user": "imp-tok", "uid": "uid-imp"},
                       TOK["admin"]: {"user": "admin", "groups": [MASTERS]}},
            "rules": rules}


# -- the request kinds ----------------------------------------------------------
NS = "/api/v1/namespaces/idt"
KINDS = {  # kind -> (method, target; cache: kwc answers it itself)
    "list-secrets-cached": ("GET", NS + "/secrets?resourceVersion=0", True),
    "get-cm-cached": ("GET", NS + "/configmaps/c1?resourceVersion=0", True),
    "list-cm-cached": ("GET", NS + "/configmaps?resourceVersion=0", True),
    "list-secrets-pass": ("GET", NS + "/secrets", False),
    "get-secret-pass": ("GET", NS + "/secrets/s1", False),
    "create-cm": ("POST", "/api/v1/namespaces/idt-w/configmaps", False),
    "delete-cm": ("DELETE", "/api/v1/namespaces/idt-w/configmaps/%s", False),
    "watch-cm-cached": ("GET", NS + "/configmaps?watch=1&resourceVersion=0", True),
    "watch-pods-pass": ("GET", NS + "/pods?watch=1&resourceVersion=0", False),
    "exec": ("POST", NS + "/pods/p1/exec?command=true&stdout=true", False),
}


# -- a raw HTTP/1.1 client (header lines as given, byte for byte) ----------------
class Answer:
    def __init__(self):
        self.status = None
        self.refused = None
        self.headers = {}
        self.body = b""

    def short(self):
        if self.refused:
            return "<refused: %s>" % self.refused
        return "%s %r" % (self.status, self.body[:300])


class Client:
    """Requests on one kept-alive TLS connection (a new one after the server
    closes it); watches and upgrades on a connection of their own."""

    def __init__(self, port, ctx):
        self.port, self.ctx = port, ctx
        self.s = None

    def _open(self):
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=60)
        return self.ctx.wrap_socket(raw, server_hostname="127.0.0.1")

    def close(self):
        if self.s is not None:
            self.s.close()
            self.s = None

    def request(self, method, target, lines, body=b"", mode=None):
        """lines: header lines (bytes, without CRLF). mode: None, "watch" (read
        the first event line), "upgrade" (read the status only)."""
        own = mode is not None
        for attempt in (0, 1):
            fresh = own or self.s is None
            s = self._open() if fresh else self.s
            if not own:
                self.s = s
            head = [b"%s %s HTTP/1.1" % (method.encode(), target.encode()), b"Host: 127.0.0.1:%d" % self.port,
                    b"User-Agent: " + UA.encode(), b"Accept: application/json"] + list(lines)
            if body or method in ("POST", "PUT", "PATCH"):
                head += [b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
            a = Answer()
            try:
                s.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
                self._read(s, a, mode)
            except (OSError, ssl.SSLError, ValueError) as e:
                if not own:
                    self.close()
                if not fresh and attempt == 0 and a.status is None:
                    continue   # a kept-alive connection the server had closed: once more on a new one
                a.refused = "%s: %s" % (e.__class__.__name__, e)
            finally:
                if own:
                    s.close()
            if not own and (a.refused or a.headers.get("connection", "").lower() == "close"):
                self.close()
            return a

    @staticmethod
    def _read(s, a, mode):
        buf = b""
        while b"\r\n\r\n" not in buf:
            d = s.recv(65536)
            if not d:
                raise ConnectionError("closed before an answer (%d bytes)" % len(buf))
            buf += d
        head, rest = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        a.status = int(lines[0].split()[1])
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            a.headers[k.strip().lower()] = v.strip()
        if a.status == 101 or mode == "upgrade" and a.status < 300:
            return
        chunked = a.headers.get("transfer-encoding", "").lower() == "chunked"
        length = int(a.headers["content-length"]) if "content-length" in a.headers else None
        watch = mode == "watch" and a.status == 200
        payload = b""
        while True:
            if chunked:
                while True:
                    i = rest.find(b"\r\n")
                    if i < 0:
                        break
                    n = int(rest[:i].split(b";")[0], 16)
                    if len(rest) < i + 2 + n + 2:
                        break
                    payload += rest[i + 2:i + 2 + n]
                    rest = rest[i + 2 + n + 2:]
                    if n == 0:
                        a.body = payload
                        return
            else:
                payload += rest
                rest = b""
                if length is not None and len(payload) >= length:
                    a.body = payload[:length]
                    return
            if watch and b"\n" in payload:
                a.body = payload.split(b"\n", 1)[0] + b"\n"   # the first event
                return
            d = s.recv(65536)
            if not d:
                if chunked or length is not None:
                    raise ConnectionError("closed inside the body")
                a.body = payload
                return
            rest += d


# -- generated cases ----------------------------------------------------------------
class Case:
    def __init__(self, n, caller, kind):
        self.n, self.caller, self.kind = n, caller, kind
        self.hdrs = []        # (name as sent, value, lead ws, trail ws, fold)
        self.features = set()
        self.attrs = 0

    def lines(self):
        out = [b"X-Case: %d" % self.n]
        for name, value, lead, trail, fold in self.hdrs:
            v = value.encode()
            if fold and b" " in v.strip():
                a, b = v.strip().split(b" ", 1)
                v = a + b"\r\n \t" + b   # obs-fold: Go joins the lines with one space
            out.append(name.encode() + b":" + lead.encode() + v + trail.encode())
        return out

    def describe(self):
        return "case %d (caller %s, %s %s %s; %d attributes; features %s)\n      headers: %r" % (
            self.n, self.caller, self.kind, KINDS[self.kind][0], self.target(), self.attrs,
            ",".join(sorted(self.features)) or "-", [ln.decode("utf-8", "replace") for ln in self.lines()])

    def target(self):
        m, t, _ = KINDS[self.kind]
        return t % ("d-%d" % self.n) if "%s" in t else t


EXOTIC = ["whitespace", "name-case", "obs-fold", "nul-key", "escaped-capital", "malformed-escape", "non-ascii-key",
          "empty-key", "two-spellings", "empty-user", "multi-user", "no-user", "multi-uid", "sa-valid",
          "sa-malformed", "empty-value"]


def count(rng):
    r = rng.random()
    if r < 0.35:
        return rng.randint(0, 3)
    if r < 0.65:
        return rng.randint(4, 31)
    return rng.randint(32, 70)


def generate(rng, n, caller, kind):
    """One case: the Impersonate-* headers of a caller. Each exotic dimension
    (EXOTIC) is drawn per case, so that the failing cases can be told apart by
    what they have (the feature table at the end)."""
    c = Case(n, caller, kind)
    mode = rng.choices(["clean", "one-bad", "wild"], [0.55, 0.35, 0.1])[0]
    on = {f for f in EXOTIC if rng.random() < 0.09}
    c.features |= on | {mode}
    groups_ok = OK_GROUPS if caller == "imp-tok" else CERT_GROUPS
    # users: the first one counts, an empty first one is none
    if "no-user" in on:
        users = []
    elif "sa-malformed" in on:
        users = [rng.choice(SA_MALFORMED)]
    elif "sa-valid" in on and caller == "imp-tok":
        users = [rng.choice(SA_OK)]
    else:
        users = [rng.choice(OK_USERS)]
    if "multi-user" in on:
        users += [rng.choice(OK_USERS + BAD_USERS + SA_BAD + SA_MALFORMED) for _ in range(rng.randint(1, 2))]
    if "empty-user" in on:
        users.insert(0, "")
    # groups
    groups = [rng.choice(groups_ok) for _ in range(count(rng))]
    if mode == "wild":
        groups = [rng.choice(groups_ok + BAD_GROUPS) for _ in groups]
    # extras: (header key spelling, value)
    keys = ["scopes", "acme.io/team"] + [EXTRA_KEYS_OF[f] for f in sorted(on) if f in EXTRA_KEYS_OF]
    nx = count(rng) if rng.random() < 0.5 else rng.randint(0, 2)
    nx = max(nx, len(keys) - 2)
    extras = []
    for i in range(nx):
        key = keys[2 + i] if i < len(keys) - 2 else rng.choice(keys)
        spellings, values = EXTRA_KEYS[key]
        sp = rng.choice(spellings[:3])
        if key == "scopes" and "two-spellings" in on and rng.random() < 0.5:
            sp = rng.choice(spellings[3:])   # another header name than "Scopes" (kube: another map entry)
        extras.append((sp, rng.choice(values) if values else rng.choice(EXTRA_VALUES)))
    rng.shuffle(extras)
    # uids: the first one counts, an empty first one is none
    uids = [rng.choice(OK_UIDS)] if rng.random() < 0.5 else []
    if "multi-uid" in on:
        uids = [rng.choice(["", "uid-ok1"])] + [rng.choice(OK_UIDS + BAD_UIDS + [""]) for _ in range(rng.randint(1, 2))]
    if "empty-value" in on:
        if rng.random() < 0.5:
            groups.insert(rng.randint(0, len(groups)), "")
        else:
            extras.insert(rng.randint(0, len(extras)), ("acme.io%2fteam", ""))
    if mode == "one-bad":
        what = rng.choice(["masters-late", "masters-late", "group", "extra", "uid"])
        if what in ("masters-late", "group"):
            if what == "masters-late" and len(groups) < 31:
                groups += [rng.choice(groups_ok) for _ in range(31 - len(groups) + rng.randint(0, 8))]
            pos = rng.randint(31, len(groups)) if what == "masters-late" else rng.randint(0, len(groups))
            groups.insert(pos, MASTERS if what == "masters-late" else rng.choice(BAD_GROUPS))
            c.features.add("masters-late" if what == "masters-late" else "bad-group")
        elif what == "extra":
            bad = (rng.choice(BAD_EXTRA_KEYS["denied-key"][0]), "x") if rng.random() < 0.5 else ("scopes", "admin")
            extras.insert(rng.randint(0, len(extras)), bad)
            c.features.add("bad-extra")
        else:
            uids = [BAD_UIDS[0]] + uids
            c.features.add("bad-uid")
    if MASTERS in groups:
        c.features.add("masters")
    if mode == "one-bad":
        # where kube asks about the denied attribute: user, groups, extras (one
        # header name at a time), uid; kwc before issue 19's fix asked about 32
        u = 1 if users and users[0] else 0
        if what in ("masters-late", "group"):
            at = u + pos
        elif what == "extra":
            names = list(dict.fromkeys(sp.lower() for sp, _ in extras))
            order = [i for n in names for i, (sp, _) in enumerate(extras) if sp.lower() == n]
            at = u + len(groups) + order.index(extras.index(bad))
        else:
            at = u + len(groups) + len(extras)
        c.features.add("denied>=32" if at >= 32 else "denied<32")
    # the header lines, interleaved in a random order (each kind keeps its own order)
    seqs = [[("Impersonate-User", u) for u in users], [("Impersonate-Group", g) for g in groups],
            [("Impersonate-Extra-" + sp, v) for sp, v in extras], [("Impersonate-Uid", u) for u in uids]]
    ws = ["", " ", "\t", "  ", " \t ", "\t\t"]
    while any(seqs):
        s = rng.choice([s for s in seqs if s])
        name, value = s.pop(0)
        lead, trail = (rng.choice(ws), rng.choice(ws)) if "whitespace" in on else ("", "")
        if "name-case" in on:
            name = rng.choice([name, name.lower(), name.upper(),
                               "".join(ch.upper() if rng.random() < 0.5 else ch.lower() for ch in name)])
        fold = "obs-fold" in on and " " in value.strip() and rng.random() < 0.7
        c.hdrs.append((name, value, lead, trail, fold))
    if "obs-fold" in on and not any(h[4] for h in c.hdrs) and users:
        c.hdrs.append(("Impersonate-Extra-Acme.io%2fTeam", "v 1", "", "", True))
        extras.append(("Acme.io%2fTeam", "v 1"))
    c.attrs = (1 if users and users[0] else 0) + len(groups) + len(extras) + (1 if uids and uids[0] else 0)
    if c.attrs > 32:
        c.features.add("attrs>32")
    if c.attrs > 60:
        c.features.add("attrs>60")
    return c


def fixed_cases(start):
    """The holes of issue 19 written out, whatever the seed draws."""
    out = []

    def add(caller, kind, hdrs, *features):
        c = Case(start + len(out), caller, kind)
        c.hdrs = [(k, v, "", "", False) for k, v in hdrs]
        c.features = set(features) | {"fixed"}
        users = [v for k, v in hdrs if k.lower() == "impersonate-user"]
        uids = [v for k, v in hdrs if k.lower() == "impersonate-uid"]
        c.attrs = (1 if users and users[0] else 0) + sum(
            1 for k, _ in hdrs if k.lower() == "impersonate-group" or k.lower().startswith("impersonate-extra-")) + \
            (1 if uids and uids[0] else 0)
        out.append(c)
    late = [("Impersonate-User", "u-ok2")] + [("Impersonate-Group", "g-ok4")] * 31 + [("Impersonate-Group", MASTERS)]
    for kind in ("list-secrets-cached", "list-secrets-pass", "create-cm", "exec"):
        add("imp-tok", kind, late, "masters-late", "attrs>32")
    for u in SA_MALFORMED:
        for kind in ("list-secrets-cached", "get-secret-pass"):
            add("imp-tok", kind, [("Impersonate-User", u)], "sa-malformed")
    add("imp-tok", "get-secret-pass", [("Impersonate-User", "u-ok1"), ("Impersonate-Uid", "uid-ok1"),
                                       ("Impersonate-Uid", "uid-bad")], "multi-uid")
    add("imp-tok", "get-secret-pass", [("Impersonate-User", "u-ok1"), ("Impersonate-Uid", ""),
                                       ("Impersonate-Uid", "uid-ok2")], "multi-uid", "empty-first-uid")
    add("imp-tok", "get-cm-cached", [("Impersonate-User", ""), ("Impersonate-User", "u-ok1")], "empty-user")
    add("imp-tok", "get-cm-cached", [("Impersonate-User", "")], "empty-user")
    add("imp-tok", "list-secrets-pass", [("Impersonate-User", "u-ok1"), ("Impersonate-Extra-nul%00key", "x")],
        "nul-key")
    add("imp-tok", "list-secrets-pass", [("Impersonate-User", "u-ok1"), ("Impersonate-Extra-%55pper", "x")],
        "escaped-capital")
    add("imp-tok", "list-secrets-pass", [("Impersonate-User", "u-ok1"), ("Impersonate-Extra-", "x")], "empty-key")
    c = Case(start + len(out), "imp-tok", "list-secrets-pass")
    c.hdrs = [("Impersonate-User", "u-ok1", "", "", False), ("Impersonate-Extra-Acme.io%2fteam", "v 1", "", "", True)]
    c.features, c.attrs = {"fixed", "obs-fold"}, 2
    out.append(c)
    # more than 256 attributes: kwc's 431, nothing upstream
    big = [("Impersonate-User", "u-ok1")] + [("Impersonate-Group", "g-ok%d" % (1 + i % 5)) for i in range(200)] + \
        [("Impersonate-Extra-Scopes", "read")] * 60
    add("imp-tok", "list-secrets-pass", big, "attrs>256", "attrs>32", "attrs>60")
    return out


# -- the test ----------------------------------------------------------------------
def normalise(kind, status, body):
    """The JSON of a 2xx body with what legitimately differs blanked (module doc)."""
    try:
        d = json.loads(body)
    except ValueError:
        return body
    if not isinstance(d, dict):
        return d
    md = d.get("metadata") if isinstance(d.get("metadata"), dict) else None
    if "items" in d and md is not None and "resourceVersion" in md:
        md["resourceVersion"] = "<list rv>"
    if kind in ("create-cm", "delete-cm") and md is not None:
        for k in ("uid", "resourceVersion", "creationTimestamp"):
            if k in md:
                md[k] = "<%s>" % k
        for mf in md.get("managedFields", []) or []:
            if "time" in mf:
                mf["time"] = "<time>"
    if kind == "delete-cm" and isinstance(d.get("details"), dict) and "uid" in d["details"]:
        d["details"]["uid"] = "<uid>"
    return d


class IdentityTest(ProcGroup, unittest.TestCase):
    dump_tail = 6000
    only_in_plaintext_run = "sets up TLS on both sides itself: a TLS run would repeat it"

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="kwc-identity-")
        cluster._ENV_DIRS.append(cls.dir)   # removed at exit, as an Env's (KWC_KEEP_TMP=1 keeps it)
        cls.procs = []
        pf = os.path.join(cls.dir, "policy.json")
        with open(pf, "w") as f:
            json.dump(policy_doc(), f)
        try:
            cls.apisim = Proc("apisim", [PYTHON, APISIM, "--listen", "127.0.0.1:0", "--nodes", "1",
                                         "--tls-cert", P.server.crt, "--tls-key", P.server.key,
                                         "--client-ca", P.client_ca.crt, "--policy", pf,
                                         "--recent-requests", "100000"], cls.dir, tls=ClientTLS(P.ca.crt))
            cls.apisim.start()
            cls.procs.append(cls.apisim)
            cls.ctx = {}
            for who, cert in (("imp-tok", None), ("imp-cert", P.issue("imp-cert", "/O=cert-team/CN=imp-cert",
                                                                      P.client_ca)), ("plain", None)):
                ctx = ssl.create_default_context(cafile=P.ca.crt)
                if cert:
                    ctx.load_cert_chain(cert.crt, cert.key)
                cls.ctx[who] = ctx
            cls.control = Client(cls.apisim.port, cls.ctx["plain"])
            cls.seed()
            kc = os.path.join(cls.dir, "kwc-kubeconfig")
            with open(kc, "w") as f:
                json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "sim",
                           "clusters": [{"name": "sim", "cluster": {
                               "server": "https://127.0.0.1:%d" % cls.apisim.port,
                               "certificate-authority": P.ca.crt}}],
                           "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "kwc"}}],
                           "users": [{"name": "kwc", "user": {"token": TOK["kwc"]}}]}, f)
            cls.kwc = Proc("kwc", KWC_WRAP + [KWC_BIN] + KWC_EXTRA_ARGS + [
                "--kubeconfig", kc, "--listen", "127.0.0.1:0", "--data-dir", os.path.join(cls.dir, "data"),
                "--resources", "v1/configmaps,v1/secrets", "--auth=delegated", "--anonymous-auth=false",
                "--tls-cert-file", P.server.crt, "--tls-private-key-file", P.server.key,
                "--client-ca-file", P.client_ca.crt], cls.dir, tls=ClientTLS(P.ca.crt))
            cls.procs.append(cls.kwc)
            cls.kwc.start()
            admin = [b"Authorization: Bearer " + TOK["admin"].encode()]
            via = Client(cls.kwc.port, cls.ctx["plain"])

            def synced():
                a = via.request("GET", NS + "/configmaps?resourceVersion=0", admin)
                b = via.request("GET", NS + "/secrets?resourceVersion=0", admin)
                return a.status == 200 and len(json.loads(a.body)["items"]) == 2 and \
                    b.status == 200 and len(json.loads(b.body)["items"]) == 1
            wait_for(synced, 60, "kwc's cache to hold namespace idt")
            via.close()
        except BaseException:
            cls.dump()
            cls.stop_all()
            raise

    @classmethod
    def seed(cls):
        admin = [b"Authorization: Bearer " + TOK["admin"].encode()]
        for ns in ("idt", "idt-w", "sa-ns"):
            a = cls.control.request("POST", "/api/v1/namespaces", admin, json.dumps(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}).encode())
            assert a.status == 201, a.short()
        for res, obj in (("configmaps", {"metadata": {"name": "c1"}, "data": {"k": "1"}}),
                         ("configmaps", {"metadata": {"name": "c2"}, "data": {"k": "2"}}),
                         ("secrets", {"metadata": {"name": "s1"}, "data": {"k": "czE="}}),
                         ("pods", {"metadata": {"name": "p1"},
                                   "spec": {"containers": [{"name": "c", "image": "busybox"}]}})):
            a = cls.control.request("POST", NS + "/" + res, admin, json.dumps(obj).encode())
            assert a.status == 201, a.short()

    # -- one case ---------------------------------------------------------------
    def sim_write(self, verb, name):
        a = self.control.request("POST", "/apisim/write", [], json.dumps(
            {"verb": verb, "resource": "configmaps", "namespace": "idt-w", "name": name}).encode())
        assert a.status == 200 or verb == "delete" and a.status in (400, 404), a.short()

    def send(self, client, case, lines):
        method, _, _ = KINDS[case.kind]
        body = b""
        mode = {"watch-cm-cached": "watch", "watch-pods-pass": "watch", "exec": "upgrade"}.get(case.kind)
        if case.kind == "create-cm":
            body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w-%d" % case.n},
                               "data": {"k": "v"}}).encode()
        if case.kind == "exec":
            lines = lines + [b"Connection: Upgrade", b"Upgrade: SPDY/3.1",
                             b"X-Stream-Protocol-Version: v4.channel.k8s.io"]
        return client.request(method, case.target(), lines, body, mode=mode)

    def run_case(self, case, clients):
        cred = [b"Authorization: Bearer " + TOK["imp"].encode()] if case.caller == "imp-tok" else []
        lines = cred + case.lines()
        if case.kind == "delete-cm":
            self.sim_write("create", "d-%d" % case.n)
        d = self.send(clients[case.caller][0], case, lines)
        if case.kind == "create-cm":
            self.sim_write("delete", "w-%d" % case.n)
        if case.kind == "delete-cm":
            self.sim_write("delete", "d-%d" % case.n)
            self.sim_write("create", "d-%d" % case.n)
        v = self.send(clients[case.caller][1], case, lines)
        if case.kind in ("create-cm", "delete-cm"):
            self.sim_write("delete", ("w-%d" if case.kind == "create-cm" else "d-%d") % case.n)
        return d, v

    def audit(self, case, since):
        a = self.control.request("GET", "/apisim/requests?since=%d" % since, [])
        assert a.status == 200, a.short()
        doc = json.loads(a.body)
        recs = [r for r in doc["requests"] if r["headers"].get("x-case") == str(case.n)]
        direct = [r for r in recs if r["requestor"] and r["requestor"]["user"] == case.caller]
        via = [r for r in recs if r["requestor"] and r["requestor"]["user"] == "kwc"]
        other = [r for r in recs if r not in direct and r not in via]
        return doc["seq"], direct, via, other

    def compare(self, case, d, v):
        """Problems with kwc's answer, as text ([] when it equals apisim's)."""
        if case.attrs > 256:
            if v.status != 431 or not v.body.startswith(b"{") or json.loads(v.body).get("kind") != "Status" or \
                    json.loads(v.body).get("code") != 431:
                return ["more than 256 attributes: kwc answered %s, not a 431 Status" % v.short()]
            return []
        if d.refused or v.refused or d.status != v.status:
            return ["status: apisim %s, kwc %s" % (d.short(), v.short())]
        if d.status == 101:
            return []
        if 200 <= d.status < 300:
            nd, nv = normalise(case.kind, d.status, d.body), normalise(case.kind, v.status, v.body)
            if nd != nv:
                return ["%d bodies differ after normalisation:\n        apisim %r\n        kwc    %r" % (
                    d.status, d.body[:600], v.body[:600])]
            return []
        if d.body != v.body:
            return ["%d bodies differ:\n        apisim %r\n        kwc    %r" % (d.status, d.body[:600], v.body[:600])]
        return []

    def test_generated_identities(self):
        rng = random.Random(SEED)
        kinds = sorted(KINDS)
        cases = []
        for n in range(N_CASES):
            caller = "imp-tok" if rng.random() < 0.7 else "imp-cert"
            cases.append(generate(rng, n, caller, kinds[n % len(kinds)]))
        cases += fixed_cases(N_CASES)
        sys.stderr.write("\n24_identity: seed %d (IDENTITY_SEED=%d repeats it): %d generated + %d fixed cases\n"
                         % (SEED, SEED, N_CASES, len(cases) - N_CASES))
        clients = {who: (Client(self.apisim.port, self.ctx[who]), Client(self.kwc.port, self.ctx[who]))
                   for who in ("imp-tok", "imp-cert")}
        since = json.loads(self.control.request("GET", "/apisim/requests?since=1000000000", []).body)["seq"]
        failures = []
        audited = 0
        feat_all = collections.Counter()
        outcome = collections.Counter()
        t0 = time.monotonic()
        for i, case in enumerate(cases):
            feat_all.update(case.features)
            d, v = self.run_case(case, clients)
            since_next, direct, via, other = self.audit(case, since)
            since = since_next
            audited += len(direct) + len(via)
            outcome["%s %s" % (case.kind, d.status)] += 1
            problems = self.compare(case, d, v)
            ident = direct[0]["user"] if len(direct) == 1 else None
            if case.attrs <= 256 and len(direct) != 1:
                problems.append("apisim recorded %d direct requests of the case, not 1" % len(direct))
            if other:
                problems.append("records of the case from neither the caller nor kwc: %r" % other)
            for r in via:
                if ident is None:
                    problems.append("reached apisim through kwc as %s although apisim refused the caller's "
                                    "identity (direct answer %s)" % (json.dumps(r["user"]), d.short()))
                elif r["user"] != ident:
                    problems.append("reached apisim through kwc as\n        %s\n      but the caller may only be\n"
                                    "        %s" % (json.dumps(r["user"]), json.dumps(ident)))
            if case.attrs > 256 and via:
                problems.append("more than 256 attributes, yet %d requests reached apisim through kwc" % len(via))
            if problems:
                failures.append((case, problems, ident))
            if (i + 1) % 500 == 0:
                sys.stderr.write("24_identity: %d/%d cases, %d failing, %.0f s\n"
                                 % (i + 1, len(cases), len(failures), time.monotonic() - t0))
        for a, b in clients.values():
            a.close()
            b.close()
        sys.stderr.write("24_identity: %d cases generated (+%d fixed), %d upstream requests audited "
                         "(direct and through kwc), %.0f s; seed %d\n"
                         % (N_CASES, len(cases) - N_CASES, audited, time.monotonic() - t0, SEED))
        sys.stderr.write("24_identity: direct outcomes: %s\n" % ", ".join(
            "%s: %d" % kv for kv in sorted(outcome.items())))
        if failures:
            feat_fail = collections.Counter()
            for c, _, _ in failures:
                feat_fail.update(c.features)
            sys.stderr.write("24_identity: %d failing cases; by feature (failing/all):\n" % len(failures))
            for f, n in sorted(feat_all.items()):
                sys.stderr.write("    %-18s %5d / %5d\n" % (f, feat_fail.get(f, 0), n))
            k = int(os.environ.get("IDENTITY_SHOW", "30"))
            shown = failures[:k] + [f for f in failures[k:] if "fixed" in f[0].features]
            msg = ["%d of %d cases failed (seed %d); %d shown:" % (len(failures), len(cases), SEED, len(shown))]
            for c, probs, ident in shown:
                msg.append("  " + c.describe())
                msg.append("      apisim's identity for it: %s" % json.dumps(ident))
                msg += ["      - " + p for p in probs]
            self.fail("\n".join(msg))


if __name__ == "__main__":
    unittest.main()
