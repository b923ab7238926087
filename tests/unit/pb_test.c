/*
 * pb_test.c — cache/pb.c: Kubernetes' protobuf wire format.
 *
 * Two sources of expected bytes, neither of them kwc:
 *  - messages assembled by hand below, each byte commented with the field it
 *    encodes (field numbers from kube's generated.proto files);
 *  - pb_vectors.h, written by Google's protobuf runtime for Python from a
 *    schema declared in tests/unit/pb_vectors.py (regenerate with
 *    /usr/bin/python3 tests/unit/pb_vectors.py > tests/unit/pb_vectors.h).
 * Robustness: every cut of valid inputs, lengths made to overrun their
 * message at every level kwc reads, and single-byte corruptions at every
 * position must give KWC_EPARSE (or a clean answer), never a crash; the
 * splitter gives the same frames at every chunk boundary.
 */
#include "kwc/pb.h"

#include "kwc/base.h"
#include "kwc/gostr.h"
#include "kwc/kinds.h"
#include "kwc/status.h"
#include "pb_vectors.h"
#include "tap.h"

#include <stdlib.h>
#include <string.h>

/* clang-format off: a hand-assembled message keeps its bytes beside the
 * comment naming the field they encode, one field per line. */

#define LIT(s) (s), (sizeof(s) - 1)

static char err[256];

static size_t pods_n;
static const struct pb_field *pods;

/* pb_meta_parse with pods' fields and default bounds */
static int
meta_pods(const void *p, size_t n, struct obj_meta *m)
{
    return pb_meta_parse(p, n, pods, pods_n, 0, 0, m, err, sizeof(err));
}

static const char *
field(const struct obj_meta *m, const char *path)
{
    for (size_t i = 0; i < pods_n && i < m->n_fields; i++)
        if (strcmp(pods[i].path, path) == 0)
            return m->fields[i];
    return NULL;
}

/* The value of label key as pb_meta_parse left it, or NULL. */
static const char *
label(const struct obj_meta *m, const char *key)
{
    for (size_t i = 0; i < m->n_labels; i++)
        if (strcmp(m->labels[i].key, key) == 0)
            return m->labels[i].value;
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* The test's own reading of the wire format, for positions only            */

static bool
tvarint(const unsigned char *p, size_t len, size_t *pos, uint64_t *v)
{
    *v = 0;
    for (unsigned i = 0; i < 10 && *pos < len; i++) {
        unsigned char b = p[(*pos)++];
        *v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (b < 0x80)
            return true;
    }
    return false;
}

struct tfield {
    unsigned num, wire;
    size_t off, lpos, lend, voff, end; /* length varint at [lpos, lend) */
};

/* Fields of msg[from, to); returns the count (at most max). */
static size_t
tfields(const unsigned char *p, size_t from, size_t to, struct tfield *out, size_t max)
{
    size_t pos = from, n = 0;
    uint64_t tag, v;
    while (pos < to && n < max) {
        struct tfield f = {.off = pos};
        if (!tvarint(p, to, &pos, &tag))
            break;
        f.num = (unsigned)(tag >> 3);
        f.wire = tag & 7;
        f.lpos = pos;
        if (f.wire == 0) {
            tvarint(p, to, &pos, &v);
        } else if (f.wire == 2) {
            tvarint(p, to, &pos, &v);
            f.lend = pos;
            pos += v;
        } else {
            pos += f.wire == 1 ? 8 : 4;
        }
        f.voff = f.wire == 2 ? f.lend : f.lpos;
        f.end = pos;
        out[n++] = f;
    }
    return n;
}

/* The first field num of msg[from, to): the vectors used here have it. */
static struct tfield
tget(const unsigned char *p, size_t from, size_t to, unsigned num)
{
    struct tfield fs[64];
    size_t n = tfields(p, from, to, fs, 64);
    for (size_t i = 0; i < n; i++)
        if (fs[i].num == num)
            return fs[i];
    abort(); /* the test's own vectors changed */
}

/* A copy of p with the length of the field at f (a LEN field inside a
 * message ending at parent_end) made one byte longer than what is left of
 * that message. */
static unsigned char *
overrun(const unsigned char *p, size_t len, const struct tfield *f, size_t parent_end,
        size_t *out_len)
{
    uint64_t v = parent_end - f->lend + 1;
    unsigned char tmp[10];
    size_t vl = 0;
    while (v >= 0x80) {
        tmp[vl++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    tmp[vl++] = (unsigned char)v;
    unsigned char *c = xmalloc(len + 10);
    memcpy(c, p, f->lpos);
    memcpy(c + f->lpos, tmp, vl);
    memcpy(c + f->lpos + vl, p + f->lend, len - f->lend);
    *out_len = len - (f->lend - f->lpos) + vl;
    return c;
}

/* Exact-size heap copy, so that ASan sees any read past the end. */
static unsigned char *
dup(const void *p, size_t n)
{
    unsigned char *c = xmalloc(n ? n : 1);
    if (n)
        memcpy(c, p, n);
    return c;
}

/* ------------------------------------------------------------------------ */

static void
test_varints(void)
{
    char b[16];
    is_int(pb_varint_len(0), 1, "0");
    is_int(pb_varint_len(127), 1, "127");
    is_int(pb_varint_len(128), 2, "128");
    is_int(pb_varint_len(16383), 2, "16383");
    is_int(pb_varint_len(16384), 3, "16384");
    is_int(pb_varint_len(UINT64_MAX), 10, "UINT64_MAX");
    is_int(pb_item_size(0), 2, "empty item: tag + length");
    is_int(pb_item_size(127), 129, "127-byte item");
    is_int(pb_item_size(128), 131, "128-byte item: 2-byte length");
    is_mem(b, pb_item_prefix(b, 300), "\x12\xac\x02", 3, "item prefix: 2 items, 300 = ac 02");
}

/* ---- the envelope ---- */

/* "k8s\0" + Unknown{typeMeta{v1, Pod}, raw "abc", contentEncoding "", contentType ""} */
static const char ENV_ABC[] = "k8s\0"
                              "\x0a\x09" /* 1 typeMeta, 9 bytes */
                              "\x0a\x02"
                              "v1" /*   1 apiVersion */
                              "\x12\x03"
                              "Pod" /*   2 kind */
                              "\x12\x03"
                              "abc"       /* 2 raw */
                              "\x1a\x00"  /* 3 contentEncoding "" */
                              "\x22\x00"; /* 4 contentType "" */

static int
env_parse(const void *p, size_t n, struct pb_envelope *e)
{
    unsigned char *c = dup(p, n);
    int rc = pb_envelope_parse(c, n, e, err, sizeof(err));
    /* spans into the copy: check them here, before it goes */
    if (rc == 0) {
        ok(e->api_version >= (const char *)c &&
               e->api_version + e->api_version_len <= (char *)c + n && e->kind >= (const char *)c &&
               e->kind + e->kind_len <= (char *)c + n && e->raw_off + e->raw_len <= n,
           "spans inside the input");
        e->api_version = (const char *)p + (e->api_version - (const char *)c);
        e->kind = (const char *)p + (e->kind - (const char *)c);
    }
    free(c);
    return rc;
}

static void
test_envelope(void)
{
    struct pb_envelope e;
    size_t n;

    is_int(env_parse(LIT(ENV_ABC), &e), 0, "hand-made envelope");
    is_mem(e.api_version, e.api_version_len, "v1", 2, "apiVersion");
    is_mem(e.kind, e.kind_len, "Pod", 3, "kind");
    is_mem(ENV_ABC + e.raw_off, e.raw_len, "abc", 3, "raw span");

    char *enc = pb_envelope("v1", "Pod", "abc", 3, &n);
    is_mem(enc, n, ENV_ABC, sizeof(ENV_ABC) - 1, "pb_envelope writes the same bytes");
    free(enc);
    char head[PB_HEAD_MAX + 5];
    n = pb_envelope_head(head, "v1", "Pod", 3);
    is_mem(head, n, ENV_ABC, 17, "pb_envelope_head: up to raw's length");

    enc = pb_envelope("v1", "Pod", VEC_POD, sizeof(VEC_POD), &n);
    is_mem(enc, n, VEC_POD_ENVELOPE, sizeof(VEC_POD_ENVELOPE), "pb_envelope = Python's");
    free(enc);
    is_int(env_parse(VEC_POD_ENVELOPE, sizeof(VEC_POD_ENVELOPE), &e), 0, "Python's envelope");
    is_mem(VEC_POD_ENVELOPE + e.raw_off, e.raw_len, VEC_POD, sizeof(VEC_POD), "its raw");

    /* no contentEncoding/contentType at all, fields out of order, an unknown
     * field 5 (skipped as Go skips it) */
    static const char REORDERED[] = "k8s\0"
                                    "\x12\x02"
                                    "xy" /* 2 raw */
                                    "\x2a\x01"
                                    "?"        /* 5: unknown */
                                    "\x0a\x04" /* 1 typeMeta */
                                    "\x12\x02"
                                    "Ns"; /*   2 kind; no apiVersion */
    is_int(env_parse(LIT(REORDERED), &e), 0, "any field order, unknown field, no tail");
    is_int(e.api_version_len, 0, "absent apiVersion: empty");
    is_mem(e.kind, e.kind_len, "Ns", 2, "kind");
    is_mem(REORDERED + e.raw_off, e.raw_len, "xy", 2, "raw");

    /* typeMeta twice merges; raw twice: the last */
    static const char TWICE[] = "k8s\0"
                                "\x0a\x04"
                                "\x0a\x02"
                                "v1" /* typeMeta{apiVersion v1} */
                                "\x12\x01"
                                "a" /* raw "a" */
                                "\x0a\x03"
                                "\x12\x01"
                                "K" /* typeMeta{kind K} */
                                "\x12\x01"
                                "b"; /* raw "b" */
    is_int(env_parse(LIT(TWICE), &e), 0, "repeated fields");
    is_mem(e.api_version, e.api_version_len, "v1", 2, "merged typeMeta: apiVersion of the first");
    is_mem(e.kind, e.kind_len, "K", 1, "kind of the second");
    is_mem(TWICE + e.raw_off, e.raw_len, "b", 1, "the last raw");

    /* a later typeMeta setting apiVersion "" wins, as in Go */
    static const char AV_EMPTIED[] = "k8s\0"
                                     "\x0a\x04"
                                     "\x0a\x02"
                                     "v1"
                                     "\x0a\x02"
                                     "\x0a\x00";
    is_int(env_parse(LIT(AV_EMPTIED), &e), 0, "apiVersion emptied by a later typeMeta");
    is_int(e.api_version_len, 0, "empty");

    is_int(env_parse(LIT("k8s\0"), &e), 0, "an empty Unknown");
    is_int(e.raw_len, 0, "no raw");

    static const char CT[] = "k8s\0"
                             "\x12\x01"
                             "a"
                             "\x1a\x00"
                             "\x22\x10"
                             "application/json"; /* 4 contentType */
    is_int(env_parse(LIT(CT), &e), KWC_EPARSE, "contentType not empty: refused");
    static const char CE[] = "k8s\0"
                             "\x12\x01"
                             "a"
                             "\x1a\x04"
                             "gzip"; /* 3 contentEncoding */
    is_int(env_parse(LIT(CE), &e), KWC_EPARSE, "contentEncoding not empty: refused");
    static const char NUL_KIND[] = "k8s\0"
                                   "\x0a\x05"
                                   "\x12\x03"
                                   "P\0d";
    is_int(env_parse(LIT(NUL_KIND), &e), KWC_EPARSE, "NUL in kind");
    is_int(env_parse(LIT("k8s"), &e), KWC_EPARSE, "short magic");
    is_int(env_parse(LIT("k8t\0\x12\x00"), &e), KWC_EPARSE, "wrong magic");
    is_int(env_parse(LIT("k8s\0\x12\x05"
                         "abc"),
                     &e),
           KWC_EPARSE, "raw overruns");
    is_int(env_parse(LIT("k8s\0\x10\x05"), &e), KWC_EPARSE, "raw as a varint");
    is_int(env_parse(LIT("k8s\0\x08\x05"), &e), KWC_EPARSE, "typeMeta as a varint");
    is_int(env_parse(LIT("k8s\0\x0a\x02\x08\x01"), &e), KWC_EPARSE, "apiVersion as a varint");
    is_int(env_parse(LIT("k8s\0\x0b\x00"), &e), KWC_EPARSE, "a group (wire type 3)");
    is_int(env_parse(LIT("k8s\0\x02\x00"), &e), KWC_EPARSE, "field number 0");
    is_int(env_parse(LIT("k8s\0\x0f\x00"), &e), KWC_EPARSE, "wire type 7");
    is_int(env_parse(LIT("k8s\0\x2d\x01\x02\x03"), &e), KWC_EPARSE, "fixed32 cut short");
    is_int(env_parse(LIT("k8s\0\x2d\x01\x02\x03\x04"), &e), 0, "fixed32 skipped");
    is_int(env_parse(LIT("k8s\0\x29"
                         "12345678"),
                     &e),
           0, "fixed64 skipped");
    is_int(env_parse(LIT("k8s\0\x28\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"), &e), 0,
           "10-byte varint skipped");
    is_int(env_parse(LIT("k8s\0\x28\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"), &e), KWC_EPARSE,
           "11-byte varint");
    is_int(env_parse(LIT("k8s\0\x2a\xff\xff\xff\xff\x0f"), &e), KWC_EPARSE,
           "a 4 GB length in a 10-byte input");
}

/* ---- objects ---- */

static void
test_pb_fields(void)
{
    static const char *const res[] = {"pods", "secrets", "nodes", "namespaces", "configmaps"};
    for (size_t r = 0; r < KWC_ARRAY_LEN(res); r++) {
        size_t n, kn;
        const struct pb_field *f = pb_fields("", res[r], &n);
        const struct obj_field *k = kinds_fields("", res[r], &kn);
        bool same = n == kn;
        /* the same fields in the same order: an index into kinds_fields (the
         * cache's index field) is one into pb_fields */
        for (size_t i = 0; same && i < n; i++)
            same = strcmp(f[i].path, k[i].path) == 0 &&
                   ((!f[i].missing && !k[i].missing) ||
                    (f[i].missing && k[i].missing && strcmp(f[i].missing, k[i].missing) == 0));
        ok(same, res[r]);
        ok(f[0].n == 2 && f[0].nums[0] == 1 && f[0].nums[1] == 1 && f[1].nums[1] == 3,
           "metadata.name {1,1}, metadata.namespace {1,3} first");
    }
    size_t n;
    pb_fields("", "events", &n);
    is_int(n, 2, "events: only metadata (a field selector on the rest passes through)");
    pb_fields("apps", "pods", &n);
    is_int(n, 2, "the group matters");
    is_int(kinds_index_field("", "pods"), 2, "pods' index field...");
    is_str(pods[2].path, "spec.nodeName", "...is spec.nodeName in pb_fields too");
}

static void
test_meta_vectors(void)
{
    struct obj_meta m;

    is_int(meta_pods(VEC_POD, sizeof(VEC_POD), &m), 0, "Python's pod");
    is_str(m.name, "web-0", "name");
    is_str(m.namespace_, "default", "namespace");
    is_str(m.uid, "uid-web-0", "uid");
    is_int(m.rv, 101, "rv");
    ok(!m.deleting, "not deleting");
    ok(m.kind == NULL && m.api_version == NULL, "no kind/apiVersion in list-item form");
    is_int(m.n_labels, 1, "one label");
    is_str(label(&m, "app"), "web", "app=web");
    is_int(m.n_fields, pods_n, "every field");
    is_str(field(&m, "metadata.name"), "web-0", "metadata.name");
    is_str(field(&m, "metadata.namespace"), "default", "metadata.namespace");
    is_str(field(&m, "spec.nodeName"), "node-1", "spec.nodeName");
    is_str(field(&m, "spec.restartPolicy"), "Always", "spec.restartPolicy");
    is_str(field(&m, "spec.schedulerName"), "default-scheduler", "spec.schedulerName (field 19)");
    is_str(field(&m, "spec.serviceAccountName"), "default", "spec.serviceAccountName");
    is_str(field(&m, "spec.hostNetwork"), "false", "spec.hostNetwork");
    is_str(field(&m, "status.phase"), "Running", "status.phase");
    is_str(field(&m, "status.podIP"), "10.0.0.7", "status.podIP");
    is_str(field(&m, "status.nominatedNodeName"), "", "status.nominatedNodeName");
    obj_meta_fini(&m);

    is_int(meta_pods(VEC_POD_DELETING, sizeof(VEC_POD_DELETING), &m), 0, "a deleting pod");
    ok(m.deleting, "deletionTimestamp: deleting");
    is_int(m.n_labels, 3, "three labels");
    ok(m.n_labels == 3 && strcmp(m.labels[0].key, "app") == 0 &&
           strcmp(m.labels[1].key, "tier") == 0 && strcmp(m.labels[2].key, "zone") == 0,
       "sorted");
    is_str(field(&m, "spec.hostNetwork"), "true", "hostNetwork true");
    is_str(field(&m, "status.podIP"), "", "empty podIP");
    is_str(field(&m, "status.nominatedNodeName"), "node-9", "nominatedNodeName (field 11)");
    is_str(field(&m, "status.phase"), "Pending", "phase");
    obj_meta_fini(&m);

    size_t n;
    const struct pb_field *f = pb_fields("", "secrets", &n);
    is_int(pb_meta_parse(VEC_SECRET, sizeof(VEC_SECRET), f, n, 0, 0, &m, err, sizeof(err)), 0,
           "secret");
    is_str(m.fields[2], "kubernetes.io/tls", "type (top-level field 3)");
    is_str(m.namespace_, "kube-system", "namespace");
    is_int(m.rv, 55, "rv");
    obj_meta_fini(&m);
    f = pb_fields("", "nodes", &n);
    is_int(pb_meta_parse(VEC_NODE, sizeof(VEC_NODE), f, n, 0, 0, &m, err, sizeof(err)), 0, "node");
    is_str(m.fields[2], "true", "spec.unschedulable");
    is_str(m.namespace_, "", "cluster-scoped: namespace \"\"");
    is_str(label(&m, "kubernetes.io/os"), "linux", "label");
    obj_meta_fini(&m);
    f = pb_fields("", "namespaces", &n);
    is_int(pb_meta_parse(VEC_NAMESPACE, sizeof(VEC_NAMESPACE), f, n, 0, 0, &m, err, sizeof(err)), 0,
           "namespace");
    is_str(m.fields[2], "Terminating", "status.phase");
    obj_meta_fini(&m);
    f = pb_fields("", "configmaps", &n);
    is_int(pb_meta_parse(VEC_POD, sizeof(VEC_POD), f, n, 0, 0, &m, err, sizeof(err)), 0,
           "metadata fields only");
    is_int(m.n_fields, 2, "two fields");
    is_str(m.fields[1], "default", "metadata.namespace");
    obj_meta_fini(&m);
    is_int(pb_meta_parse(VEC_POD, sizeof(VEC_POD), NULL, 0, 0, 0, &m, err, sizeof(err)), 0,
           "no fields at all");
    is_int(m.n_fields, 0, "none");
    obj_meta_fini(&m);
    is_int(meta_pods(VEC_POD_RV_BIG, sizeof(VEC_POD_RV_BIG), &m), 0, "rv at UINT64_MAX");
    ok(m.rv == UINT64_MAX, "parsed");
    obj_meta_fini(&m);

    /* fields of the caller's own, not from pb_fields */
    static const struct pb_field mine[] = {
        {"spec.nodeName", NULL, 2, {2, 10}, false},
        {"spec.hostNetwork", "false", 2, {2, 11}, true},
        {"somewhere.else", "dflt", 2, {5, 1}, false}, /* no schema: missing */
        {"spec.hostNetwork-as-string", "x", 2, {2, 11}, false},
    };
    is_int(pb_meta_parse(VEC_POD_DELETING, sizeof(VEC_POD_DELETING), mine, 4, 0, 0, &m, err,
                         sizeof(err)),
           0, "the caller's own fields");
    is_str(m.fields[0], "node-2", "a path the schema declares");
    is_str(m.fields[1], "true", "a bool");
    is_str(m.fields[2], "dflt", "a path no schema declares: its missing value");
    is_str(m.fields[3], "x", "a bool read as a string: no schema agrees, missing");
    obj_meta_fini(&m);
}

/* An object message around ObjectMeta bytes M (a string literal). */
#define OBJ(md) "\x0a" md

static void
test_meta_hand(void)
{
    struct obj_meta m;

    /* {1 metadata{1 name "a", 6 resourceVersion "5"}} */
    static const char MIN[] = "\x0a\x06"
                              "\x0a\x01"
                              "a" /* name */
                              "\x32\x01"
                              "5"; /* resourceVersion */
    is_int(meta_pods(LIT(MIN), &m), 0, "minimal object");
    is_str(m.name, "a", "name");
    is_str(m.namespace_, "", "no namespace: \"\"");
    is_str(m.uid, "", "no uid: \"\"");
    is_int(m.rv, 5, "rv");
    is_str(field(&m, "spec.nodeName"), "", "no spec: missing \"\"");
    is_str(field(&m, "spec.hostNetwork"), "false", "no spec: hostNetwork missing \"false\"");
    is_str(field(&m, "status.phase"), "", "no status");
    obj_meta_fini(&m);

    /* labels {b: 1}, {a: x}, {b: 2}, an entry without value, one without key */
    static const char LABELS[] = "\x0a\x28"
                                 "\x0a\x01"
                                 "n"
                                 "\x32\x01"
                                 "7"
                                 "\x5a\x06"
                                 "\x0a\x01"
                                 "b"
                                 "\x12\x01"
                                 "1" /* labels b=1 */
                                 "\x5a\x06"
                                 "\x0a\x01"
                                 "a"
                                 "\x12\x01"
                                 "x" /* a=x */
                                 "\x5a\x06"
                                 "\x0a\x01"
                                 "b"
                                 "\x12\x01"
                                 "2" /* b=2 */
                                 "\x5a\x03"
                                 "\x0a\x01"
                                 "c" /* c (no value) */
                                 "\x5a\x03"
                                 "\x12\x01"
                                 "v"; /* "" (no key)=v */
    is_int(meta_pods(LIT(LABELS), &m), 0, "labels");
    is_int(m.n_labels, 4, "four keys: a repeated key counts once");
    is_str(label(&m, "b"), "2", "a repeated key keeps its last value (Go's map)");
    is_str(label(&m, "a"), "x", "a");
    is_str(label(&m, "c"), "", "no value: \"\"");
    is_str(label(&m, ""), "v", "no key: \"\"");
    ok(m.n_labels == 4 && strcmp(m.labels[0].key, "") == 0 && strcmp(m.labels[1].key, "a") == 0 &&
           strcmp(m.labels[2].key, "b") == 0 && strcmp(m.labels[3].key, "c") == 0,
       "sorted by key");
    obj_meta_fini(&m);
    is_int(pb_meta_parse(LIT(LABELS), NULL, 0, 0, 5, &m, err, sizeof(err)), 0,
           "five entries at max_labels 5");
    obj_meta_fini(&m);
    is_int(pb_meta_parse(LIT(LABELS), NULL, 0, 0, 4, &m, err, sizeof(err)), KWC_ETOOBIG,
           "five entries over max_labels 4 (entries as sent)");
    ok(m.arena_ == NULL && m.name == NULL, "zeroed on failure");
    obj_meta_fini(&m);
    is_int(pb_meta_parse(LIT(LABELS), NULL, 0, sizeof(LABELS) - 2, 0, &m, err, sizeof(err)),
           KWC_ETOOBIG, "over max_bytes");

    /* metadata in two parts: decoders merge them */
    static const char TWO[] = "\x0a\x08"
                              "\x0a\x01"
                              "a"
                              "\x5a\x03"
                              "\x0a\x01"
                              "k"        /* name, label k */
                              "\x12\x00" /* spec{} */
                              "\x0a\x05"
                              "\x32\x03"
                              "123"; /* rv */
    is_int(meta_pods(LIT(TWO), &m), 0, "metadata twice");
    is_str(m.name, "a", "name from the first");
    is_int(m.rv, 123, "rv from the second");
    is_str(label(&m, "k"), "", "label from the first");
    obj_meta_fini(&m);

    /* a later part setting name "" wins, as in Go (protobuf-c's own merge of
     * two messages would keep "a") */
    static const char EMPTIED[] = "\x0a\x06"
                                  "\x0a\x01"
                                  "a"
                                  "\x32\x01"
                                  "1"
                                  "\x0a\x02"
                                  "\x0a\x00";
    is_int(meta_pods(LIT(EMPTIED), &m), KWC_EPARSE, "name emptied by a later metadata part");
    obj_meta_fini(&m);
    static const char EMPTIED_NODE[] = "\x0a\x06"
                                       "\x0a\x01"
                                       "a"
                                       "\x32\x01"
                                       "1"
                                       "\x12\x04"
                                       "\x52\x02"
                                       "n1"
                                       "\x12\x02"
                                       "\x52\x00";
    is_int(meta_pods(LIT(EMPTIED_NODE), &m), 0, "spec in two parts");
    is_str(field(&m, "spec.nodeName"), "", "nodeName emptied by the later part");
    obj_meta_fini(&m);

    /* a name sent 100000 times: the last wins, and only it is decoded */
    struct gostr_buf big = {0};
    for (int i = 0; i < 100000; i++)
        gostr_addn(&big,
                   "\x0a\x01"
                   "x",
                   3);
    gostr_addn(&big,
               "\x0a\x01"
               "y"
               "\x32\x01"
               "1",
               6);
    for (int i = 0; i < 1000; i++)
        gostr_addn(&big,
                   "\x4a\x02"
                   "\x08\x01",
                   4); /* deletionTimestamp{seconds 1} */
    struct gostr_buf obj = {0};
    gostr_addc(&obj, 0x0a);
    {
        char v[10];
        size_t vl = 0;
        for (uint64_t x = big.len;; x >>= 7) {
            v[vl++] = (char)(x >= 0x80 ? (x & 0x7f) | 0x80 : x);
            if (x < 0x80)
                break;
        }
        gostr_addn(&obj, v, vl);
    }
    gostr_addn(&obj, big.p, big.len);
    is_int(meta_pods(obj.p, obj.len, &m), 0, "a name repeated 100000 times");
    is_str(m.name, "y", "the last");
    ok(m.deleting, "deletionTimestamp repeated: merged");
    obj_meta_fini(&m);
    free(big.p);
    free(obj.p);
    /* a map entry with its key twice: the last */
    static const char ENTRY2[] = "\x0a\x11"
                                 "\x0a\x01"
                                 "a"
                                 "\x32\x01"
                                 "1"
                                 "\x5a\x09"
                                 "\x0a\x01"
                                 "a"
                                 "\x0a\x01"
                                 "b"
                                 "\x12\x01"
                                 "v";
    is_int(meta_pods(LIT(ENTRY2), &m), 0, "an entry with two keys");
    ok(m.n_labels == 1 && strcmp(m.labels[0].key, "b") == 0 && strcmp(m.labels[0].value, "v") == 0,
       "its last key");
    obj_meta_fini(&m);

    /* deletionTimestamp present but empty: a non-nil *Time in Go */
    static const char DEL0[] = "\x0a\x08"
                               "\x0a\x01"
                               "a"
                               "\x32\x01"
                               "1"
                               "\x4a\x00";
    is_int(meta_pods(LIT(DEL0), &m), 0, "empty deletionTimestamp");
    ok(m.deleting, "is deleting");
    obj_meta_fini(&m);

    /* spec{10 nodeName "n1", 11 hostNetwork true, 19 schedulerName "s"} */
    static const char SPEC[] = "\x0a\x06"
                               "\x0a\x01"
                               "a"
                               "\x32\x01"
                               "1"
                               "\x12\x0a"
                               "\x52\x02"
                               "n1"       /* 10 nodeName */
                               "\x58\x01" /* 11 hostNetwork true */
                               "\x9a\x01\x01"
                               "s"; /* 19 schedulerName: a 2-byte tag */
    is_int(meta_pods(LIT(SPEC), &m), 0, "hand-made spec");
    is_str(field(&m, "spec.nodeName"), "n1", "nodeName");
    is_str(field(&m, "spec.hostNetwork"), "true", "hostNetwork");
    is_str(field(&m, "spec.schedulerName"), "s", "schedulerName");
    is_str(field(&m, "spec.restartPolicy"), "", "absent restartPolicy");
    obj_meta_fini(&m);
    /* hostNetwork as a varint of 2 (Go: v != 0) */
    static const char HN2[] = "\x0a\x06"
                              "\x0a\x01"
                              "a"
                              "\x32\x01"
                              "1"
                              "\x12\x02"
                              "\x58\x02";
    is_int(meta_pods(LIT(HN2), &m), 0, "bool varint 2");
    is_str(field(&m, "spec.hostNetwork"), "true", "is true");
    obj_meta_fini(&m);

    struct {
        const char *what;
        const char *p;
        size_t len;
        int rc;
    } bad[] = {
        {"empty input: no metadata", "", 0, KWC_EPARSE},
        {"no metadata", "\x12\x00", 2, KWC_EPARSE},
        {"no name",
         "\x0a\x03"
         "\x32\x01"
         "1",
         5, KWC_EPARSE},
        {"empty name",
         "\x0a\x05"
         "\x0a\x00"
         "\x32\x01"
         "1",
         7, KWC_EPARSE},
        {"NUL in name",
         "\x0a\x07"
         "\x0a\x02"
         "a\0"
         "\x32\x01"
         "1",
         9, KWC_EPARSE},
        {"NUL in namespace",
         "\x0a\x0a"
         "\x0a\x01"
         "a"
         "\x1a\x01"
         "\0"
         "\x32\x01"
         "1",
         12, KWC_EPARSE},
        {"NUL in uid",
         "\x0a\x0a"
         "\x0a\x01"
         "a"
         "\x2a\x01"
         "\0"
         "\x32\x01"
         "1",
         12, KWC_EPARSE},
        {"NUL in a label value",
         "\x0a\x0e"
         "\x0a\x01"
         "a"
         "\x32\x01"
         "1"
         "\x5a\x05"
         "\x0a\x00"
         "\x12\x01"
         "\0",
         16, KWC_EPARSE},
        {"NUL in a label key",
         "\x0a\x0b"
         "\x0a\x01"
         "a"
         "\x32\x01"
         "1"
         "\x5a\x03"
         "\x0a\x01"
         "\0",
         13, KWC_EPARSE},
        {"NUL in spec.nodeName",
         "\x0a\x06"
         "\x0a\x01"
         "a"
         "\x32\x01"
         "1"
         "\x12\x04"
         "\x52\x02"
         "n\0",
         14, KWC_EPARSE},
        {"no rv",
         "\x0a\x03"
         "\x0a\x01"
         "a",
         5, KWC_EPARSE},
        {"rv 0",
         "\x0a\x06"
         "\x0a\x01"
         "a"
         "\x32\x01"
         "0",
         8, KWC_EPARSE},
        {"rv not decimal",
         "\x0a\x07"
         "\x0a\x01"
         "a"
         "\x32\x02"
         "1x",
         9, KWC_EPARSE},
        {"rv -1",
         "\x0a\x07"
         "\x0a\x01"
         "a"
         "\x32\x02"
         "-1",
         9, KWC_EPARSE},
        {"rv over uint64",
         "\x0a\x19"
         "\x0a\x01"
         "a"
         "\x32\x14"
         "18446744073709551616",
         27, KWC_EPARSE},
        {"name as a varint",
         "\x0a\x05"
         "\x08\x01"
         "\x32\x01"
         "1",
         7, KWC_EPARSE},
        {"metadata as a varint", "\x08\x01", 2, KWC_EPARSE},
        {"spec as a varint",
         "\x0a\x06"
         "\x0a\x01"
         "a"
         "\x32\x01"
         "1"
         "\x10\x01",
         10, KWC_EPARSE},
        {"hostNetwork as bytes",
         "\x0a\x06"
         "\x0a\x01"
         "a"
         "\x32\x01"
         "1"
         "\x12\x03"
         "\x5a\x01"
         "t",
         13, KWC_EPARSE},
        {"labels as a varint",
         "\x0a\x08"
         "\x0a\x01"
         "a"
         "\x32\x01"
         "1"
         "\x58\x01",
         10, KWC_EPARSE},
        {"deletionTimestamp as a varint",
         "\x0a\x08"
         "\x0a\x01"
         "a"
         "\x32\x01"
         "1"
         "\x48\x01",
         10, KWC_EPARSE},
        {"metadata overruns",
         "\x0a\x07"
         "\x0a\x01"
         "a"
         "\x32\x01"
         "1",
         8, KWC_EPARSE},
        {"a group inside metadata",
         "\x0a\x08"
         "\x0a\x01"
         "a"
         "\x32\x01"
         "1"
         "\x13\x00",
         10, KWC_EPARSE},
        {"a group at the top",
         "\x0a\x06"
         "\x0a\x01"
         "a"
         "\x32\x01"
         "1"
         "\x23\x24",
         10, KWC_EPARSE},
        /* metadata{6: 1 byte, missing} metadata{"5", name "a"}: concatenated,
         * the two would read rv "5"; Go decodes each part on its own */
        {"a field straddling two metadata parts",
         "\x0a\x02"
         "\x32\x01"
         "\x0a\x04"
         "5"
         "\x0a\x01"
         "a",
         10, KWC_EPARSE},
        {"a group inside a top-level field kwc does not read: not walked",
         "\x0a\x06"
         "\x0a\x01"
         "a"
         "\x32\x01"
         "1"
         "\x22\x02"
         "\x13\x00",
         12, 0},
        {"a bad field inside managedFields: skipped whole",
         "\x0a\x0a"
         "\x0a\x01"
         "a"
         "\x32\x01"
         "1"
         "\x8a\x01\x01"
         "\xff",
         12, 0},
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad); i++) {
        unsigned char *c = dup(bad[i].p, bad[i].len);
        int rc = meta_pods(c, bad[i].len, &m);
        is_int(rc, bad[i].rc, bad[i].what);
        if (rc < 0)
            ok(m.arena_ == NULL && m.name == NULL && *err, "zeroed, with a reason");
        obj_meta_fini(&m);
        free(c);
    }
}

/* Every cut of v (pb_meta_parse with pods' fields) is refused unless it ends
 * on a top-level field of which metadata is complete. */
static void
cuts_meta(const unsigned char *v, size_t len, const char *what)
{
    struct tfield fs[16];
    size_t n = tfields(v, 0, len, fs, 16), bad = 0;
    struct tfield md = tget(v, 0, len, 1);
    for (size_t cut = 0; cut < len; cut++) {
        struct obj_meta m;
        unsigned char *c = dup(v, cut);
        bool boundary = false;
        for (size_t i = 0; i < n; i++)
            boundary |= fs[i].end == cut && cut >= md.end;
        int rc = meta_pods(c, cut, &m);
        if (rc != (boundary ? 0 : KWC_EPARSE)) {
            bad++;
            printf("#   %s: cut at %zu gave %d\n", what, cut, rc);
        }
        obj_meta_fini(&m);
        free(c);
    }
    is_int(bad, 0, what);
}

/* Each length field at a level kwc reads made to overrun its message. */
static void
overruns_meta(const unsigned char *v, size_t len, const char *what)
{
    struct tfield top[16], lvl[64], sub[16];
    size_t nt = tfields(v, 0, len, top, 16), bad = 0, tried = 0;
    /* (parent start, parent end) pairs: the object, metadata, spec, status,
     * and inside metadata each label entry and deletionTimestamp */
    size_t from[128], to[128], np = 0;
    from[np] = 0;
    to[np++] = len;
    for (size_t i = 0; i < nt; i++) {
        if (top[i].wire != 2 || top[i].num < 1 || top[i].num > 3)
            continue;
        from[np] = top[i].voff;
        to[np++] = top[i].end;
        if (top[i].num != 1)
            continue;
        size_t nl = tfields(v, top[i].voff, top[i].end, lvl, 64);
        for (size_t j = 0; j < nl && np < 128; j++)
            if (lvl[j].wire == 2 && (lvl[j].num == 11 || lvl[j].num == 9)) {
                from[np] = lvl[j].voff;
                to[np++] = lvl[j].end;
            }
    }
    for (size_t p = 0; p < np; p++) {
        size_t ns = tfields(v, from[p], to[p], sub, 16);
        for (size_t i = 0; i < ns; i++) {
            if (sub[i].wire != 2)
                continue;
            size_t cl;
            unsigned char *c = overrun(v, len, &sub[i], to[p], &cl);
            struct obj_meta m;
            int rc = meta_pods(c, cl, &m);
            tried++;
            if (rc != KWC_EPARSE) {
                bad++;
                printf("#   %s: field %u at %zu overrun gave %d\n", what, sub[i].num, sub[i].off,
                       rc);
            }
            obj_meta_fini(&m);
            free(c);
        }
    }
    ok(tried > 10, "lengths tried");
    is_int(bad, 0, what);
}

/* Every byte of v replaced by a few values: never a crash, only clean
 * answers. */
static void
corrupt_all(const unsigned char *v, size_t len, const char *what)
{
    static const unsigned char vals[] = {0x00, 0x01, 0x7f, 0x80, 0xff};
    size_t bad = 0;
    for (size_t i = 0; i < len; i++)
        for (size_t k = 0; k <= KWC_ARRAY_LEN(vals); k++) {
            unsigned char *c = dup(v, len);
            c[i] = k < KWC_ARRAY_LEN(vals) ? vals[k] : (unsigned char)(c[i] ^ 0x08);
            struct obj_meta m;
            struct pb_list l;
            struct pb_envelope e;
            struct wevent ev;
            char *out;
            size_t ol;
            int rc = meta_pods(c, len, &m);
            bad += rc != 0 && rc != KWC_EPARSE && rc != KWC_ETOOBIG;
            bad += rc == 0 && (!m.name || !*m.name || m.rv == 0);
            obj_meta_fini(&m);
            rc = pb_list_parse(c, len, &l, err, sizeof(err));
            bad += rc != 0 && rc != KWC_EPARSE && rc != KWC_ETOOBIG;
            pb_list_fini(&l);
            rc = pb_envelope_parse(c, len, &e, err, sizeof(err));
            bad += rc != 0 && rc != KWC_EPARSE;
            rc = pb_wevent_parse(c, len, &ev, &e, err, sizeof(err));
            bad += rc != 0 && rc != KWC_EPARSE && rc != KWC_ETOOBIG;
            wevent_fini(&ev);
            if (len > 4) {
                rc = pb_wevent_parse(c + 4, len - 4, &ev, NULL, err, sizeof(err));
                bad += rc != 0 && rc != KWC_EPARSE && rc != KWC_ETOOBIG;
                wevent_fini(&ev);
            }
            rc = pb_with_rv(c, len, 99, &out, &ol);
            bad += rc != 0 && rc != KWC_EPARSE;
            free(out);
            free(c);
        }
    is_int(bad, 0, what);
}

static void
test_meta_robust(void)
{
    cuts_meta(VEC_POD, sizeof(VEC_POD), "cuts of a pod");
    cuts_meta(VEC_POD_DELETING, sizeof(VEC_POD_DELETING), "cuts of a deleting pod");
    overruns_meta(VEC_POD, sizeof(VEC_POD), "overrun lengths in a pod");
    overruns_meta(VEC_POD_DELETING, sizeof(VEC_POD_DELETING), "overrun lengths, deleting pod");
    corrupt_all(VEC_POD, sizeof(VEC_POD), "corrupted pod bytes");
    corrupt_all(VEC_LIST3, sizeof(VEC_LIST3), "corrupted list bytes");
    corrupt_all(VEC_FRAME_BOOKMARK_END, sizeof(VEC_FRAME_BOOKMARK_END), "corrupted bookmark");
    corrupt_all(VEC_FRAME_ERROR_410, sizeof(VEC_FRAME_ERROR_410), "corrupted error event");
}

/* ---- lists ---- */

static int
list_parse(const void *p, size_t n, struct pb_list *l)
{
    return pb_list_parse(p, n, l, err, sizeof(err));
}

static void
test_list(void)
{
    struct pb_list l;

    is_int(list_parse(VEC_LIST0, sizeof(VEC_LIST0), &l), 0, "empty list");
    is_int(l.n_items, 0, "no items");
    is_int(l.rv, 200, "rv");
    is_str(l.continue_, "", "no continue");
    ok(!l.has_remaining, "no remainingItemCount");
    is_str(l.kind, "PodList", "kind");
    is_str(l.api_version, "v1", "apiVersion");
    pb_list_fini(&l);

    is_int(list_parse(VEC_LIST1, sizeof(VEC_LIST1), &l), 0, "one item");
    is_int(l.n_items, 1, "n_items");
    if (l.n_items == 1)
        is_mem(VEC_LIST1 + l.off[0], l.len[0], VEC_POD, sizeof(VEC_POD), "the item's span");
    is_int(l.rv, 201, "rv");
    pb_list_fini(&l);

    is_int(list_parse(VEC_LIST3, sizeof(VEC_LIST3), &l), 0, "three items");
    is_int(l.n_items, 3, "n_items");
    if (l.n_items == 3) {
        is_mem(VEC_LIST3 + l.off[0], l.len[0], VEC_POD, sizeof(VEC_POD), "item 0");
        is_mem(VEC_LIST3 + l.off[1], l.len[1], VEC_POD_DELETING, sizeof(VEC_POD_DELETING),
               "item 1");
        struct obj_meta m;
        is_int(meta_pods(VEC_LIST3 + l.off[2], l.len[2], &m), 0, "item 2 parses");
        is_str(m.name, "web-2", "item 2");
        is_int(m.n_labels, 0, "no labels");
        obj_meta_fini(&m);
    }
    is_str(l.continue_, "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ", "continue");
    ok(l.has_remaining && l.remaining == 17, "remainingItemCount 17");
    pb_list_fini(&l);

    is_int(list_parse(VEC_LIST_REMAINING0, sizeof(VEC_LIST_REMAINING0), &l), 0, "remaining 0");
    ok(l.has_remaining && l.remaining == 0, "remainingItemCount 0 is set");
    pb_list_fini(&l);

    /* hand-made: ListMeta{2 rv "9", 4 remainingItemCount -1 (10 bytes)}, an
     * item, an unknown field 3 */
    static const char HAND[] = "k8s\0"
                               "\x0a\x0b"
                               "\x0a\x02"
                               "v1"
                               "\x12\x05"
                               "XList"
                               "\x12\x18" /* raw, 24 bytes */
                               "\x0a\x0e" /*   1 metadata */
                               "\x12\x01"
                               "9"                                            /*     2 rv */
                               "\x20\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01" /* 4: -1 */
                               "\x12\x02"
                               "ab"        /*   2 item */
                               "\x18\x07"  /*   3: unknown */
                               "\x12\x00"; /*   2 empty item */
    is_int(list_parse(LIT(HAND), &l), 0, "hand-made list");
    ok(l.has_remaining && l.remaining == -1, "negative remainingItemCount");
    is_int(l.n_items, 2, "two items");
    if (l.n_items == 2) {
        is_mem(HAND + l.off[0], l.len[0], "ab", 2, "item");
        is_int(l.len[1], 0, "empty item");
    }
    is_str(l.continue_, "", "no continue");
    pb_list_fini(&l);

    static const char NOMETA[] = "k8s\0"
                                 "\x12\x04"
                                 "\x12\x02"
                                 "ab";
    is_int(list_parse(LIT(NOMETA), &l), KWC_EPARSE, "no ListMeta: no rv");
    ok(l.off == NULL && l.continue_ == NULL && l.n_items == 0, "zeroed");
    pb_list_fini(&l);
    static const char NULCONT[] = "k8s\0"
                                  "\x12\x0a"
                                  "\x0a\x08"
                                  "\x12\x01"
                                  "9"
                                  "\x1a\x03"
                                  "a\0b";
    is_int(list_parse(LIT(NULCONT), &l), KWC_EPARSE, "NUL in continue");
    pb_list_fini(&l);
    static const char ITEMVARINT[] = "k8s\0"
                                     "\x12\x07"
                                     "\x0a\x03"
                                     "\x12\x01"
                                     "9"
                                     "\x10\x01";
    is_int(list_parse(LIT(ITEMVARINT), &l), KWC_EPARSE, "an item as a varint");
    pb_list_fini(&l);
    static const char RV0[] = "k8s\0"
                              "\x12\x05"
                              "\x0a\x03"
                              "\x12\x01"
                              "0";
    is_int(list_parse(LIT(RV0), &l), KWC_EPARSE, "rv 0");
    pb_list_fini(&l);

    /* a kind of 128 bytes */
    struct gostr_buf b = {0};
    char kind[129];
    memset(kind, 'K', 128);
    kind[128] = '\0';
    char *head;
    size_t hl;
    head = pb_list_head("v1", kind, 5, NULL, -1, 0, &hl);
    gostr_addn(&b, head, hl);
    gostr_addn(&b, PB_ENVELOPE_TAIL, PB_ENVELOPE_TAIL_LEN);
    free(head);
    is_int(list_parse(b.p, b.len, &l), KWC_ETOOBIG, "kind over 127 bytes");
    pb_list_fini(&l);
    free(b.p);
    kind[127] = '\0';
    head = pb_list_head("v1", kind, 5, NULL, -1, 0, &hl);
    is_int(list_parse(head, hl, &l), 0, "kind of 127 bytes (no tail: fine)");
    is_int(strlen(l.kind), 127, "copied");
    pb_list_fini(&l);
    free(head);

    /* ListMeta over OBJ_LIST_MAX_META (a continue token of 64 KiB) */
    char *cont = xmalloc(OBJ_LIST_MAX_META + 1);
    memset(cont, 'c', OBJ_LIST_MAX_META);
    cont[OBJ_LIST_MAX_META] = '\0';
    head = pb_list_head("v1", "PodList", 5, cont, -1, 0, &hl);
    is_int(list_parse(head, hl, &l), KWC_ETOOBIG, "ListMeta over OBJ_LIST_MAX_META");
    pb_list_fini(&l);
    free(head);
    cont[OBJ_LIST_MAX_META - 16] = '\0';
    head = pb_list_head("v1", "PodList", 5, cont, -1, 0, &hl);
    is_int(list_parse(head, hl, &l), 0, "ListMeta just under");
    is_int(strlen(l.continue_), OBJ_LIST_MAX_META - 16, "its continue");
    pb_list_fini(&l);
    free(head);
    free(cont);

    /* every cut before the end of raw is refused; after it, the envelope's
     * own field boundaries are complete lists */
    const unsigned char *v = VEC_LIST3;
    size_t len = sizeof(VEC_LIST3), nbad = 0;
    struct tfield fs[8];
    size_t n = tfields(v, 4, len, fs, 8);
    struct tfield raw = tget(v, 4, len, 2);
    is_int(n, 4, "the test reads the envelope");
    for (size_t cut = 0; cut < len; cut++) {
        unsigned char *c = dup(v, cut);
        bool boundary = false;
        for (size_t i = 0; i < n; i++)
            boundary |= fs[i].end == cut && cut >= raw.end;
        int rc = list_parse(c, cut, &l);
        nbad += rc != (boundary ? 0 : KWC_EPARSE);
        pb_list_fini(&l);
        free(c);
    }
    is_int(nbad, 0, "cuts of a list");
    /* lengths overrunning the envelope, typeMeta, the list and ListMeta */
    size_t from[4] = {4}, to[4] = {len}, np = 1, tried = 0;
    nbad = 0;
    struct tfield tm = tget(v, 4, len, 1);
    from[np] = tm.voff;
    to[np++] = tm.end;
    from[np] = raw.voff;
    to[np++] = raw.end;
    struct tfield lm = tget(v, raw.voff, raw.end, 1);
    from[np] = lm.voff;
    to[np++] = lm.end;
    for (size_t p = 0; p < np; p++) {
        struct tfield sub[16];
        size_t ns = tfields(v, from[p], to[p], sub, 16);
        for (size_t i = 0; i < ns; i++) {
            if (sub[i].wire != 2)
                continue;
            size_t cl;
            unsigned char *c = overrun(v, len, &sub[i], to[p], &cl);
            tried++;
            nbad += list_parse(c, cl, &l) != KWC_EPARSE;
            pb_list_fini(&l);
            free(c);
        }
    }
    ok(tried >= 10, "lengths tried");
    is_int(nbad, 0, "overrun lengths in a list");
}

static void
test_list_encode(void)
{
    struct gostr_buf b = {0};
    char pre[16];
    char *head;
    size_t hl;

    /* hand-written: envelope{v1 PodList} around PodList{ListMeta{"", "200", ""}} */
    static const char LIST0[] = "k8s\0"
                                "\x0a\x0d"
                                "\x0a\x02"
                                "v1"
                                "\x12\x07"
                                "PodList"
                                "\x12\x0b" /* raw, 11 bytes */
                                "\x0a\x09" /*   metadata */
                                "\x0a\x00" /*     selfLink "" */
                                "\x12\x03"
                                "200"      /*     resourceVersion */
                                "\x1a\x00" /*     continue "" */
                                "\x1a\x00"
                                "\x22\x00"; /* the tail */
    head = pb_list_head("v1", "PodList", 200, NULL, -1, 0, &hl);
    gostr_addn(&b, head, hl);
    gostr_addn(&b, PB_ENVELOPE_TAIL, PB_ENVELOPE_TAIL_LEN);
    is_mem(b.p, b.len, LIST0, sizeof(LIST0) - 1, "empty list: hand-written bytes");
    is_mem(b.p, b.len, VEC_LIST0, sizeof(VEC_LIST0), "empty list: Python's bytes");
    free(head);
    free(b.p);
    b = (struct gostr_buf){0};
    head = pb_list_head("v1", "PodList", 200, "", -1, 0, &hl);
    is_mem(head, hl, LIST0, sizeof(LIST0) - 5, "continue \"\" is NULL");
    free(head);

    /* items */
    struct {
        const unsigned char *want;
        size_t wlen;
        uint64_t rv;
        const char *cont;
        int64_t remaining;
        size_t nitems;
        const char *what;
    } cases[] = {
        {VEC_LIST1, sizeof(VEC_LIST1), 201, NULL, -1, 1, "one item"},
        {VEC_LIST3, sizeof(VEC_LIST3), 202, "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ", 17, 3,
         "three items, continue, remainingItemCount"},
        {VEC_LIST_REMAINING0, sizeof(VEC_LIST_REMAINING0), 203, NULL, 0, 1,
         "remainingItemCount 0 written"},
    };
    for (size_t c = 0; c < KWC_ARRAY_LEN(cases); c++) {
        struct pb_list l;
        is_int(list_parse(cases[c].want, cases[c].wlen, &l), 0, "Python's list parses");
        uint64_t items = 0;
        for (size_t i = 0; i < l.n_items; i++)
            items += pb_item_size(l.len[i]);
        head = pb_list_head("v1", "PodList", cases[c].rv, cases[c].cont, cases[c].remaining, items,
                            &hl);
        gostr_addn(&b, head, hl);
        free(head);
        for (size_t i = 0; i < l.n_items; i++) {
            gostr_addn(&b, pre, pb_item_prefix(pre, l.len[i]));
            gostr_addn(&b, (const char *)cases[c].want + l.off[i], l.len[i]);
        }
        gostr_addn(&b, PB_ENVELOPE_TAIL, PB_ENVELOPE_TAIL_LEN);
        is_mem(b.p, b.len, cases[c].want, cases[c].wlen, cases[c].what);
        is_int(l.n_items, cases[c].nitems, "items");
        free(b.p);
        b = (struct gostr_buf){0};
        pb_list_fini(&l);
    }
}

/* ---- watch frames ---- */

static int
wev(const void *frame, size_t n, struct wevent *ev, struct pb_envelope *env)
{
    unsigned char *c = dup(frame, n);
    int rc = pb_wevent_parse(c, n, ev, env, err, sizeof(err));
    if (rc == 0 && env) {
        env->kind = (const char *)frame + (env->kind - (const char *)c);
        env->api_version = (const char *)frame + (env->api_version - (const char *)c);
    }
    free(c);
    return rc;
}

/* A WatchEvent (no length prefix) of type t around envelope(v1, Pod, obj). */
static char *
event(const char *t, const char *obj, size_t olen, size_t *n)
{
    struct gostr_buf b = {0};
    pb_frame_event(&b, t, "v1", "Pod", obj, olen);
    *n = b.len - 4;
    memmove(b.p, b.p + 4, *n);
    return b.p;
}

static void
test_wevent(void)
{
    struct wevent ev;
    struct pb_envelope env;
    size_t n;

    is_int(wev(VEC_FRAME_ADDED + 4, sizeof(VEC_FRAME_ADDED) - 4, &ev, &env), 0, "Python's ADDED");
    is_int(ev.type, WEVENT_ADDED, "ADDED");
    is_mem(VEC_FRAME_ADDED + 4 + ev.obj_off, ev.obj_len, VEC_POD, sizeof(VEC_POD),
           "the object span: the pod");
    is_mem(env.kind, env.kind_len, "Pod", 3, "envelope kind");
    is_mem(env.api_version, env.api_version_len, "v1", 2, "envelope apiVersion");
    ok(ev.reason == NULL && ev.rv == 0, "nothing else");
    wevent_fini(&ev);

    is_int(wev(VEC_FRAME_BOOKMARK_END + 4, sizeof(VEC_FRAME_BOOKMARK_END) - 4, &ev, NULL), 0,
           "Python's BOOKMARK");
    is_int(ev.type, WEVENT_BOOKMARK, "BOOKMARK");
    is_int(ev.rv, 301, "its rv");
    ok(ev.initial_events_end, "initial-events-end");
    wevent_fini(&ev);

    is_int(wev(VEC_FRAME_ERROR_410 + 4, sizeof(VEC_FRAME_ERROR_410) - 4, &ev, &env), 0,
           "Python's ERROR");
    is_int(ev.type, WEVENT_ERROR, "ERROR");
    is_int(ev.code, 410, "code 410");
    is_str(ev.reason, "Expired", "reason");
    is_str(ev.message, "too old resource version: 5 (100)", "message");
    is_mem(env.kind, env.kind_len, "Status", 6, "kind Status");
    wevent_fini(&ev);

    /* hand-made: WatchEvent{1 "DELETED", 2 RawExtension{1 envelope}} */
    static const char DELETED[] = "\x0a\x07"
                                  "DELETED"
                                  "\x12\x13" /* object, 19 bytes */
                                  "\x0a\x11" /*   raw, 17 bytes */
                                  "k8s\0"
                                  "\x0a\x05"
                                  "\x12\x03"
                                  "Pod" /*     typeMeta */
                                  "\x12\x02"
                                  "ob"        /*     raw */
                                  "\x1a\x00"; /*     contentEnc. */
    is_int(wev(LIT(DELETED), &ev, &env), 0, "hand-made DELETED");
    is_int(ev.type, WEVENT_DELETED, "DELETED");
    is_mem(DELETED + ev.obj_off, ev.obj_len, "ob", 2, "object span into the frame");
    is_int(env.api_version_len, 0, "no apiVersion");
    wevent_fini(&ev);

    char *f = event("MODIFIED", (const char *)VEC_POD, sizeof(VEC_POD), &n);
    is_int(wev(f, n, &ev, NULL), 0, "MODIFIED");
    is_int(ev.type, WEVENT_MODIFIED, "type");
    is_mem(f + ev.obj_off, ev.obj_len, VEC_POD, sizeof(VEC_POD), "span");
    wevent_fini(&ev);
    free(f);

    /* bookmarks */
    struct gostr_buf b = {0};
    pb_bookmark_obj(&b, 300, false);
    f = event("BOOKMARK", b.p, b.len, &n);
    is_int(wev(f, n, &ev, NULL), 0, "bookmark without the annotation");
    ok(ev.rv == 300 && !ev.initial_events_end, "rv 300, not the end");
    wevent_fini(&ev);
    free(f);
    free(b.p);
    /* annotations {k8s.io/initial-events-end: "false"} then another key */
    static const char ANN_FALSE[] = "\x0a\x3e"
                                    "\x32\x01"
                                    "7"
                                    "\x62\x22"
                                    "\x0a\x19"
                                    "k8s.io/initial-events-end"
                                    "\x12\x05"
                                    "false"
                                    "\x62\x15"
                                    "\x0a\x01"
                                    "x"
                                    "\x12\x10"
                                    "k8s.io/initial-e";
    f = event("BOOKMARK", LIT(ANN_FALSE), &n);
    is_int(wev(f, n, &ev, NULL), 0, "annotation \"false\"");
    ok(ev.rv == 7 && !ev.initial_events_end, "not the end");
    wevent_fini(&ev);
    free(f);
    /* the annotation twice: "true" then "false": the last wins */
    static const char ANN_TWICE[] = "\x0a\x4a"
                                    "\x32\x01"
                                    "7"
                                    "\x62\x21"
                                    "\x0a\x19"
                                    "k8s.io/initial-events-end"
                                    "\x12\x04"
                                    "true"
                                    "\x62\x22"
                                    "\x0a\x19"
                                    "k8s.io/initial-events-end"
                                    "\x12\x05"
                                    "false";
    f = event("BOOKMARK", LIT(ANN_TWICE), &n);
    is_int(wev(f, n, &ev, NULL), 0, "annotation twice");
    ok(!ev.initial_events_end, "the last value wins");
    wevent_fini(&ev);
    free(f);
    f = event("BOOKMARK", LIT("\x0a\x00"), &n);
    is_int(wev(f, n, &ev, NULL), KWC_EPARSE, "bookmark without rv");
    wevent_fini(&ev);
    free(f);
    f = event("BOOKMARK", LIT(""), &n);
    is_int(wev(f, n, &ev, NULL), KWC_EPARSE, "bookmark without metadata");
    wevent_fini(&ev);
    free(f);

    /* errors */
    b = (struct gostr_buf){0};
    pb_status(&b, 500, "InternalError", "boom", NULL);
    struct gostr_buf fb = {0};
    gostr_addn(&fb,
               "\x0a\x05"
               "ERROR"
               "\x12",
               8);
    {
        char v[10];
        size_t vl = 0;
        uint64_t x = b.len + 1 + pb_varint_len(b.len);
        while (x >= 0x80) {
            v[vl++] = (char)(x | 0x80);
            x >>= 7;
        }
        v[vl++] = (char)x;
        gostr_addn(&fb, v, vl);
        gostr_addc(&fb, 0x0a);
        x = b.len;
        vl = 0;
        while (x >= 0x80) {
            v[vl++] = (char)(x | 0x80);
            x >>= 7;
        }
        v[vl++] = (char)x;
        gostr_addn(&fb, v, vl);
        gostr_addn(&fb, b.p, b.len);
    }
    is_int(wev(fb.p, fb.len, &ev, NULL), 0, "ERROR around pb_status");
    ok(ev.code == 500 && strcmp(ev.reason, "InternalError") == 0 && strcmp(ev.message, "boom") == 0,
       "code, reason, message");
    wevent_fini(&ev);
    free(fb.p);
    free(b.p);
    f = event("ERROR",
              LIT("\x1a\x02"
                  "m\0"),
              &n);
    is_int(wev(f, n, &ev, NULL), KWC_EPARSE, "NUL in the Status message");
    wevent_fini(&ev);
    free(f);
    f = event("ERROR", LIT(""), &n);
    is_int(wev(f, n, &ev, NULL), 0, "an empty Status");
    ok(ev.code == 0 && strcmp(ev.reason, "") == 0 && strcmp(ev.message, "") == 0, "zero values");
    wevent_fini(&ev);
    free(f);
    f = event("ERROR", LIT("\x30\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"), &n);
    is_int(wev(f, n, &ev, NULL), 0, "code -1 (sign-extended)");
    is_int(ev.code, -1, "-1");
    wevent_fini(&ev);
    free(f);

    /* refused */
    f = event("FOO", LIT("x"), &n);
    is_int(wev(f, n, &ev, NULL), KWC_EPARSE, "unknown type");
    ok(ev.arena_ == NULL && ev.obj_len == 0, "zeroed");
    wevent_fini(&ev);
    free(f);
    f = event("added", LIT("x"), &n);
    is_int(wev(f, n, &ev, NULL), KWC_EPARSE, "types are case-sensitive");
    wevent_fini(&ev);
    free(f);
    f = event("ADDED\0", LIT("x"), &n);
    is_int(wev(f, n, &ev, NULL), 0, "a C string type stops at its NUL (encoder side)");
    wevent_fini(&ev);
    free(f);
    is_int(wev(LIT("\x0a\x06"
                   "ADDED\0"
                   "\x12\x00"),
               &ev, NULL),
           KWC_EPARSE, "NUL inside the type");
    is_int(wev(LIT("\x0a\x05"
                   "ADDED"),
               &ev, NULL),
           KWC_EPARSE, "no object");
    is_int(wev(LIT("\x0a\x05"
                   "ADDED"
                   "\x12\x00"),
               &ev, NULL),
           KWC_EPARSE, "object without raw");
    is_int(wev(LIT("\x0a\x05"
                   "ADDED"
                   "\x12\x02"
                   "\x0a\x00"),
               &ev, NULL),
           KWC_EPARSE, "raw without the k8s magic");
    is_int(wev(LIT("\x0a\x05"
                   "ADDED"
                   "\x12\x03"
                   "\x0a\x01"),
               &ev, NULL),
           KWC_EPARSE, "object overruns");
    is_int(wev(LIT("\x0a\x05"
                   "ADDED"
                   "\x10\x01"),
               &ev, NULL),
           KWC_EPARSE, "object a varint");
    is_int(wev(LIT("\x08\x01"
                   "\x12\x00"),
               &ev, NULL),
           KWC_EPARSE, "type a varint");
    is_int(wev(LIT(""), &ev, NULL), KWC_EPARSE, "empty frame");
    static const char CT_EVENT[] = "\x0a\x05"
                                   "ADDED"
                                   "\x12\x14"
                                   "\x0a\x12"
                                   "k8s\0"
                                   "\x12\x01"
                                   "o"
                                   "\x1a\x00"
                                   "\x22\x07"
                                   "foo/bar";
    is_int(wev(LIT(CT_EVENT), &ev, NULL), KWC_EPARSE, "contentType not empty: refused");
    /* type twice: the last wins */
    static const char TYPE_TWICE[] = "\x0a\x03"
                                     "FOO"
                                     "\x12\x0d"
                                     "\x0a\x0b"
                                     "k8s\0"
                                     "\x12\x01"
                                     "o"
                                     "\x1a\x00"
                                     "\x22\x00"
                                     "\x0a\x07"
                                     "DELETED";
    is_int(wev(LIT(TYPE_TWICE), &ev, NULL), 0, "type twice");
    is_int(ev.type, WEVENT_DELETED, "the last");
    wevent_fini(&ev);

    /* every cut of a frame is refused */
    const unsigned char *frames[] = {VEC_FRAME_ADDED, VEC_FRAME_BOOKMARK_END, VEC_FRAME_ERROR_410};
    size_t lens[] = {sizeof(VEC_FRAME_ADDED), sizeof(VEC_FRAME_BOOKMARK_END),
                     sizeof(VEC_FRAME_ERROR_410)};
    size_t nbad = 0, tried = 0;
    for (size_t k = 0; k < 3; k++) {
        const unsigned char *v = frames[k] + 4;
        size_t len = lens[k] - 4;
        for (size_t cut = 0; cut < len; cut++) {
            nbad += wev(v, cut, &ev, NULL) != KWC_EPARSE;
            wevent_fini(&ev);
        }
        /* lengths overrunning the event, its object, the envelope, typeMeta */
        struct tfield obj = tget(v, 0, len, 2);
        struct tfield raw = tget(v, obj.voff, obj.end, 1);
        struct tfield tm = tget(v, raw.voff + 4, raw.end, 1);
        size_t from[] = {0, obj.voff, raw.voff + 4, tm.voff};
        size_t to[] = {len, obj.end, raw.end, tm.end};
        for (size_t p = 0; p < 4; p++) {
            struct tfield sub[8];
            size_t ns = tfields(v, from[p], to[p], sub, 8);
            for (size_t i = 0; i < ns; i++) {
                if (sub[i].wire != 2)
                    continue;
                size_t cl;
                unsigned char *c = overrun(v, len, &sub[i], to[p], &cl);
                tried++;
                nbad += wev(c, cl, &ev, NULL) != KWC_EPARSE;
                wevent_fini(&ev);
                free(c);
            }
        }
    }
    ok(tried >= 20, "lengths tried");
    is_int(nbad, 0, "every cut and overrun length of the frames refused");
}

static void
test_frame_encode(void)
{
    struct gostr_buf b = {0};
    pb_frame_event(&b, "ADDED", "v1", "Pod", VEC_POD, sizeof(VEC_POD));
    is_mem(b.p, b.len, VEC_FRAME_ADDED, sizeof(VEC_FRAME_ADDED), "ADDED frame = Python's");
    free(b.p);

    /* hand-written: a frame of "ADDED" around envelope(v1, Pod, "ob") */
    static const char FRAME[] = "\x00\x00\x00\x22" /* 34 bytes follow */
                                "\x0a\x05"
                                "ADDED"    /* 1 type */
                                "\x12\x19" /* 2 object */
                                "\x0a\x17" /*   1 raw: 23 bytes */
                                "k8s\0"
                                "\x0a\x09"
                                "\x0a\x02"
                                "v1"
                                "\x12\x03"
                                "Pod"
                                "\x12\x02"
                                "ob"
                                "\x1a\x00"
                                "\x22\x00";
    b = (struct gostr_buf){0};
    pb_frame_event(&b, "ADDED", "v1", "Pod", "ob", 2);
    is_mem(b.p, b.len, FRAME, sizeof(FRAME) - 1, "hand-written frame");
    free(b.p);

    b = (struct gostr_buf){0};
    pb_bookmark_obj(&b, 300, false);
    is_mem(b.p, b.len, VEC_BOOKMARK_OBJ, sizeof(VEC_BOOKMARK_OBJ), "bookmark object = Python's");
    is_mem(b.p, b.len,
           "\x0a\x05"
           "\x32\x03"
           "300",
           7, "hand-written: {1 {6 \"300\"}}");
    free(b.p);
    b = (struct gostr_buf){0};
    pb_bookmark_obj(&b, 301, true);
    is_mem(b.p, b.len, VEC_BOOKMARK_OBJ_END, sizeof(VEC_BOOKMARK_OBJ_END),
           "initial-events-end bookmark object = Python's");
    static const char BM_END[] = "\x0a\x28"
                                 "\x32\x03"
                                 "301"
                                 "\x62\x21"
                                 "\x0a\x19"
                                 "k8s.io/initial-events-end"
                                 "\x12\x04"
                                 "true";
    is_mem(b.p, b.len, BM_END, sizeof(BM_END) - 1, "hand-written");
    free(b.p);
    b = (struct gostr_buf){0};
    pb_frame_event(&b, "BOOKMARK", "v1", "Pod", (const char *)VEC_BOOKMARK_OBJ_END,
                   sizeof(VEC_BOOKMARK_OBJ_END));
    is_mem(b.p, b.len, VEC_FRAME_BOOKMARK_END, sizeof(VEC_FRAME_BOOKMARK_END),
           "BOOKMARK frame = Python's");
    free(b.p);
}

static void
test_status_encode(void)
{
    struct gostr_buf b = {0};

    /* hand-written: Status 404 NotFound "x" */
    static const char S404[] = "k8s\0"
                               "\x0a\x0c"
                               "\x0a\x02"
                               "v1"
                               "\x12\x06"
                               "Status"
                               "\x12\x21" /* raw: 33 bytes */
                               "\x0a\x06"
                               "\x0a\x00"
                               "\x12\x00"
                               "\x1a\x00" /* metadata */
                               "\x12\x07"
                               "Failure" /* status */
                               "\x1a\x01"
                               "x" /* message */
                               "\x22\x08"
                               "NotFound"     /* reason */
                               "\x30\x94\x03" /* code 404 */
                               "\x1a\x00"
                               "\x22\x00";
    pb_status(&b, 404, "NotFound", "x", NULL);
    is_mem(b.p, b.len, S404, sizeof(S404) - 1, "404: hand-written bytes");
    free(b.p);

    b = (struct gostr_buf){0};
    pb_status(&b, 410, "Expired", "too old resource version: 5 (100)", NULL);
    is_mem(b.p, b.len, VEC_STATUS_410, sizeof(VEC_STATUS_410), "410 = Python's");
    free(b.p);

    static const struct status_cause causes[] = {
        {"FieldValueInvalid", "must be positive", "spec.x"},
        {"FieldValueRequired", NULL, NULL},
    };
    struct status_details d = {"web-0", NULL, "pods", causes, 2, 0};
    b = (struct gostr_buf){0};
    pb_status(&b, 422, "Invalid", "bad \"x\"", &d);
    is_mem(b.p, b.len, VEC_STATUS_DETAILS, sizeof(VEC_STATUS_DETAILS),
           "details with causes = Python's");
    free(b.p);

    struct status_details r = {NULL, NULL, NULL, NULL, 0, 3};
    b = (struct gostr_buf){0};
    pb_status(&b, 503, "ServiceUnavailable", "not ready", &r);
    is_mem(b.p, b.len, VEC_STATUS_RETRY, sizeof(VEC_STATUS_RETRY), "retryAfterSeconds = Python's");
    free(b.p);

    b = (struct gostr_buf){0};
    pb_status(&b, -1, NULL, NULL, NULL);
    is_mem(b.p, b.len, VEC_STATUS_NEGATIVE, sizeof(VEC_STATUS_NEGATIVE),
           "negative code, NULL strings = Python's");
    free(b.p);

    /* and kwc reads back what it writes */
    b = (struct gostr_buf){0};
    pb_status(&b, 422, "Invalid", "bad \"x\"", &d);
    struct pb_envelope e;
    is_int(pb_envelope_parse(b.p, b.len, &e, err, sizeof(err)), 0, "its envelope parses");
    is_mem(e.kind, e.kind_len, "Status", 6, "kind Status");
    free(b.p);
}

/* ---- pb_with_rv ---- */

static void
with_rv_case(const void *obj, size_t len, uint64_t rv, const void *want, size_t wlen,
             const char *what)
{
    char *out = NULL;
    size_t ol = 0;
    unsigned char *c = dup(obj, len);
    is_int(pb_with_rv(c, len, rv, &out, &ol), 0, what);
    if (want)
        is_mem(out, ol, want, wlen, "bytes");
    struct obj_meta a, m;
    if (meta_pods(obj, len, &a) == 0) {
        is_int(meta_pods(out, ol, &m), 0, "the copy parses");
        ok(m.rv == rv, "with the new rv");
        bool same = strcmp(a.name, m.name) == 0 && strcmp(a.namespace_, m.namespace_) == 0 &&
                    strcmp(a.uid, m.uid) == 0 && a.n_labels == m.n_labels &&
                    a.deleting == m.deleting;
        for (size_t i = 0; same && i < a.n_labels; i++)
            same = strcmp(a.labels[i].key, m.labels[i].key) == 0 &&
                   strcmp(a.labels[i].value, m.labels[i].value) == 0;
        for (size_t i = 0; same && i < a.n_fields; i++)
            same = strcmp(a.fields[i], m.fields[i]) == 0;
        ok(same, "everything else the same");
        obj_meta_fini(&m);
    }
    obj_meta_fini(&a);
    free(out);
    free(c);
}

static void
test_with_rv(void)
{
    with_rv_case(VEC_POD, sizeof(VEC_POD), 101, VEC_POD, sizeof(VEC_POD),
                 "the same rv: same bytes");
    with_rv_case(VEC_POD, sizeof(VEC_POD), UINT64_MAX, VEC_POD_RV_BIG, sizeof(VEC_POD_RV_BIG),
                 "rv 101 -> UINT64_MAX = Python's");
    with_rv_case(VEC_POD_RV_BIG, sizeof(VEC_POD_RV_BIG), 101, VEC_POD, sizeof(VEC_POD), "and back");
    with_rv_case(VEC_META127, sizeof(VEC_META127), 10, VEC_META128, sizeof(VEC_META128),
                 "ObjectMeta 127 -> 128 bytes: its length grows to 2 bytes");
    with_rv_case(VEC_META128, sizeof(VEC_META128), 9, VEC_META127, sizeof(VEC_META127),
                 "128 -> 127 bytes: shrinks to 1 byte");
    with_rv_case(VEC_POD_DELETING, sizeof(VEC_POD_DELETING), 5, NULL, 0, "deleting pod");

    /* no rv field: inserted before the first field above 6 */
    static const char NORV[] = "\x0a\x0b"
                               "\x0a\x01"
                               "a" /* 1 name */
                               "\x1a\x01"
                               "n" /* 3 namespace */
                               "\x5a\x03"
                               "\x0a\x01"
                               "k"; /* 11 labels */
    char *out;
    size_t ol;
    /* pb_with_rv works only on what pb_meta_parse accepts: this has no rv */
    is_int(pb_with_rv(LIT(NORV), 8, &out, &ol), KWC_EPARSE, "an object without rv: refused");
    ok(out == NULL, "no output");
    /* ... but a second metadata part may lack it */
    static const char TWO[] = "\x0a\x03"
                              "\x32\x01"
                              "4"        /* metadata{rv 4} */
                              "\x12\x00" /* spec{} */
                              "\x0a\x0b"
                              "\x0a\x01"
                              "a"
                              "\x1a\x01"
                              "n"
                              "\x5a\x03"
                              "\x0a\x01"
                              "k";
    static const char TWO_WANT[] = "\x0a\x03"
                                   "\x32\x01"
                                   "4"
                                   "\x12\x00"
                                   "\x0a\x0e"
                                   "\x0a\x01"
                                   "a"
                                   "\x1a\x01"
                                   "n"
                                   "\x32\x01"
                                   "8"
                                   "\x5a\x03"
                                   "\x0a\x01"
                                   "k";
    with_rv_case(LIT(TWO), 8, LIT(TWO_WANT),
                 "rv inserted in the last metadata at its ascending position");
    static const char END[] = "\x0a\x03"
                              "\x0a\x01"
                              "a"
                              "\x0a\x03"
                              "\x32\x01"
                              "1";
    static const char END_WANT[] = "\x0a\x03"
                                   "\x0a\x01"
                                   "a"
                                   "\x0a\x03"
                                   "\x32\x01"
                                   "2";
    with_rv_case(LIT(END), 2, LIT(END_WANT), "the last metadata's rv replaced");
    static const char APPEND[] = "\x0a\x03"
                                 "\x32\x01"
                                 "1"
                                 "\x0a\x03"
                                 "\x0a\x01"
                                 "a";
    static const char APPEND_WANT[] = "\x0a\x03"
                                      "\x32\x01"
                                      "1"
                                      "\x0a\x06"
                                      "\x0a\x01"
                                      "a"
                                      "\x32\x01"
                                      "2";
    with_rv_case(LIT(APPEND), 2, LIT(APPEND_WANT), "rv appended when no field above 6");
    /* a non-minimal tag for rv (0xb2 0x00 = field 6, LEN) is kept */
    static const char TAG2[] = "\x0a\x07"
                               "\x0a\x01"
                               "a"
                               "\xb2\x00\x01"
                               "1";
    static const char TAG2_WANT[] = "\x0a\x08"
                                    "\x0a\x01"
                                    "a"
                                    "\xb2\x00\x02"
                                    "12";
    with_rv_case(LIT(TAG2), 12, LIT(TAG2_WANT), "the rv field's own tag bytes kept");

    is_int(pb_with_rv(VEC_POD, sizeof(VEC_POD), 0, &out, &ol), KWC_EPARSE, "rv 0 refused");
    is_int(pb_with_rv(VEC_POD, sizeof(VEC_POD) - 1, 5, &out, &ol), KWC_EPARSE, "cut object");
    is_int(pb_with_rv(LIT(""), 5, &out, &ol), KWC_EPARSE, "empty input");
}

/* ---- the splitter ---- */

static struct gostr_buf stream;
static size_t stream_frames;

static void
stream_add(const void *frame, size_t n)
{
    gostr_addn(&stream, frame, n);
    stream_frames++;
}

/* Feed stream in chunks ending at the cut points (sorted), collect the
 * frames; returns the number of frames or -1 on a mismatch. */
static long
split_run(const size_t *cuts, size_t ncuts, size_t max_frame, size_t *pending)
{
    struct pb_splitter s;
    struct gostr_buf got = {0};
    size_t from = 0, frames = 0;
    long ret;
    pb_split_init(&s, max_frame);
    for (size_t k = 0; k <= ncuts; k++) {
        size_t to = k < ncuts ? cuts[k] : stream.len;
        unsigned char *chunk = dup(stream.p + from, to - from);
        const char *data = (const char *)chunk, *frame;
        size_t len = to - from, fl;
        int rc;
        while ((rc = pb_split_next(&s, &data, &len, &frame, &fl)) == 1) {
            char pre[4] = {(char)(fl >> 24), (char)(fl >> 16), (char)(fl >> 8), (char)fl};
            gostr_addn(&got, pre, 4);
            if (fl)
                gostr_addn(&got, frame, fl);
            frames++;
        }
        free(chunk);
        if (rc < 0) {
            ret = rc;
            goto out;
        }
        from = to;
    }
    ret = got.len == stream.len && memcmp(got.p, stream.p, got.len) == 0 ? (long)frames : -1;
out:
    *pending = pb_split_pending(&s);
    pb_split_fini(&s);
    free(got.p);
    return ret;
}

static void
test_splitter(void)
{
    size_t pending;
    stream_add(VEC_FRAME_ADDED, sizeof(VEC_FRAME_ADDED));
    stream_add("\x00\x00\x00\x00", 4); /* an empty frame */
    stream_add(VEC_FRAME_BOOKMARK_END, sizeof(VEC_FRAME_BOOKMARK_END));
    stream_add(VEC_FRAME_ERROR_410, sizeof(VEC_FRAME_ERROR_410));

    is_int(split_run(NULL, 0, 0, &pending), (long)stream_frames, "whole stream in one chunk");
    is_int(pending, 0, "nothing pending");
    size_t nbad = 0;
    for (size_t i = 0; i <= stream.len; i++) {
        nbad += split_run(&i, 1, 0, &pending) != (long)stream_frames || pending != 0;
    }
    is_int(nbad, 0, "two chunks, every boundary");
    nbad = 0;
    for (size_t i = 0; i <= stream.len; i += 3)
        for (size_t j = i; j <= stream.len; j += 2) {
            size_t c[2] = {i, j};
            nbad += split_run(c, 2, 0, &pending) != (long)stream_frames;
        }
    is_int(nbad, 0, "three chunks");
    size_t *every = xmalloc(stream.len * sizeof(size_t));
    for (size_t i = 0; i < stream.len; i++)
        every[i] = i + 1;
    is_int(split_run(every, stream.len - 1, 0, &pending), (long)stream_frames, "byte by byte");
    free(every);

    /* a cut stream keeps its partial frame pending, prefix included */
    struct pb_splitter s;
    const char *frame, *data = (const char *)VEC_FRAME_ADDED;
    size_t len = 10, fl;
    pb_split_init(&s, 0);
    is_int(pb_split_next(&s, &data, &len, &frame, &fl), 0, "partial frame");
    is_int(pb_split_pending(&s), 10, "10 bytes pending");
    is_int(len, 0, "chunk used up");
    len = sizeof(VEC_FRAME_ADDED) - 10;
    is_int(pb_split_next(&s, &data, &len, &frame, &fl), 1, "completed");
    is_mem(frame, fl, VEC_FRAME_ADDED + 4, sizeof(VEC_FRAME_ADDED) - 4, "the frame, copied");
    is_int(pb_split_pending(&s), 0, "nothing pending once handed out");
    is_int(pb_split_next(&s, &data, &len, &frame, &fl), 0, "no more");
    pb_split_fini(&s);

    /* in place when the frame lies in one chunk */
    data = (const char *)VEC_FRAME_ADDED;
    len = sizeof(VEC_FRAME_ADDED);
    pb_split_init(&s, 0);
    is_int(pb_split_next(&s, &data, &len, &frame, &fl), 1, "frame");
    ok(frame == (const char *)VEC_FRAME_ADDED + 4 && s.buf == NULL, "in place, nothing copied");
    pb_split_fini(&s);

    /* lengths over the bound: refused before anything is allocated for them */
    pb_split_init(&s, 100);
    data = "\x00\x00\x00\x64"
           "abc"; /* 100: at the bound */
    len = 7;
    is_int(pb_split_next(&s, &data, &len, &frame, &fl), 0, "100 bytes announced: waits");
    ok(s.cap <= 104, "buffer within the frame's size");
    pb_split_fini(&s);
    pb_split_init(&s, 100);
    data = "\x00\x00\x00\x65"
           "abc"; /* 101 */
    len = 7;
    is_int(pb_split_next(&s, &data, &len, &frame, &fl), KWC_ETOOBIG, "101 bytes: over");
    ok(s.buf == NULL && s.cap == 0, "nothing allocated");
    data = "\x00\x00\x00\x01"
           "a";
    len = 5;
    is_int(pb_split_next(&s, &data, &len, &frame, &fl), KWC_ETOOBIG, "sticky");
    pb_split_fini(&s);
    pb_split_init(&s, 100);
    data = "\x00\x00";
    len = 2;
    is_int(pb_split_next(&s, &data, &len, &frame, &fl), 0, "half a prefix");
    ok(s.cap <= 4, "only the prefix held");
    is_int(pb_split_pending(&s), 2, "pending");
    data = "\x00\x65";
    len = 2;
    is_int(pb_split_next(&s, &data, &len, &frame, &fl), KWC_ETOOBIG, "prefix completed: over");
    ok(s.buf == NULL && s.cap == 0, "released");
    pb_split_fini(&s);
    pb_split_init(&s, 0);
    data = "\xff\xff\xff\xff"
           "x";
    len = 5;
    is_int(pb_split_next(&s, &data, &len, &frame, &fl), KWC_ETOOBIG,
           "4 GB announced, default bound");
    ok(s.buf == NULL, "nothing allocated");
    pb_split_fini(&s);
    /* a large frame announced is not allocated ahead of its bytes */
    pb_split_init(&s, 0);
    data = "\x01\x00\x00\x00"
           "0123456789";
    len = 14;
    is_int(pb_split_next(&s, &data, &len, &frame, &fl), 0, "16 MB announced, 10 bytes given");
    ok(s.cap <= 4096, "buffer sized by the bytes received");
    pb_split_fini(&s);
    free(stream.p);
}

int
main(void)
{
    pods = pb_fields("", "pods", &pods_n);
    TAP_RUN(test_varints);
    TAP_RUN(test_envelope);
    TAP_RUN(test_pb_fields);
    TAP_RUN(test_meta_vectors);
    TAP_RUN(test_meta_hand);
    TAP_RUN(test_meta_robust);
    TAP_RUN(test_list);
    TAP_RUN(test_list_encode);
    TAP_RUN(test_wevent);
    TAP_RUN(test_frame_encode);
    TAP_RUN(test_status_encode);
    TAP_RUN(test_with_rv);
    TAP_RUN(test_splitter);
    return tap_done();
}
