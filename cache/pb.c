/*
 * pb.c — Kubernetes' protobuf wire format (pb.h), on both sides of the data
 * path: the reflector's upstream bytes -> [pb] -> store, and the store's
 * objects -> [pb] -> a watcher's or a LIST client's bytes. Like object.c it
 * never re-serialises an object: it returns byte spans of the input plus the
 * few values the cache indexes, and writes only the small messages around
 * the objects (envelope, ListMeta, WatchEvent, Status, a bookmark's object).
 *
 * Reading, in two layers:
 *  - a bounds-checked walker (struct walk) over one message's fields: it
 *    splits frames, finds the spans pb.h hands out (list items, Unknown.raw,
 *    RawExtension.raw, typeMeta's strings) and prunes messages;
 *  - protobuf-c, with kwc's own schema (k8s_min.proto, compiled into the
 *    build directory), decodes every value kwc reads. Before it runs, the
 *    walker copies out only the fields on the paths being read (prune()),
 *    so protobuf-c never sees, copies or allocates for the rest of an object
 *    (managedFields, containers, ...), and what it decodes is bounded by
 *    the paths and the label limit, not by the input.
 * Repeated occurrences follow protobuf's merge rules as Go's decoders apply
 * them (the last scalar wins, messages merge, map entries append and a key
 * seen twice keeps its last value); prune() applies them itself where
 * protobuf-c differs (README, traps).
 *
 * Writing follows kube-apiserver's gogo-generated marshallers byte for byte:
 * ascending field numbers, every non-pointer field written (empty strings
 * included), pointer fields only when set.
 *
 * Pure: no I/O, no clock; nothing is kept between calls except a splitter's
 * partial frame.
 */
#include "kwc/pb.h"

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <protobuf-c/protobuf-c.h>

#include "k8s_min.pb-c.h"
#include "kwc/base.h"
#include "kwc/gostr.h"
#include "kwc/status.h"

/* A splitter buffer larger than this is freed once its frame is consumed. */
#define SPLIT_KEEP (1u << 20)
/* Field paths are at most this deep (struct pb_field.nums). */
#define PATH_MAX_DEPTH 4

#define INITIAL_EVENTS_END "k8s.io/initial-events-end"

/* ------------------------------------------------------------------------ */
/* The walker                                                                */

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

/* One field: its number and wire type; its encoding is [off, end), the tag
 * [off, tag_end); its value the varint v, or the bytes [voff, voff + vlen)
 * of a length-delimited or fixed-size value. Offsets are into the walked
 * buffer. */
struct fld {
    uint32_t num;
    unsigned wire;
    uint64_t v;
    size_t off, tag_end, voff, vlen, end;
};

struct walk {
    const uint8_t *p;
    size_t len, pos;
};

/* A base-128 varint of at most 10 bytes (what Go's and protobuf-c's decoders
 * accept); bits past 64 are dropped as Go drops them. */
static bool
get_varint(const uint8_t *p, size_t len, size_t *pos, uint64_t *out)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < 10 && *pos < len; i++) {
        uint8_t b = p[(*pos)++];
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (b < 0x80) {
            *out = v;
            return true;
        }
    }
    return false;
}

/* The next field of the message: 1, 0 at its end, KWC_EPARSE when the bytes
 * are no field (a tag or length running past the end, field number 0, a
 * group or an unknown wire type: kube never writes groups and protobuf-c
 * cannot read them). */
static int
next_field(struct walk *w, struct fld *f)
{
    uint64_t tag, n;
    if (w->pos >= w->len)
        return 0;
    f->off = w->pos;
    if (!get_varint(w->p, w->len, &w->pos, &tag) || tag > UINT32_MAX || (tag >> 3) == 0)
        return KWC_EPARSE;
    f->num = (uint32_t)(tag >> 3);
    f->wire = (unsigned)(tag & 7);
    f->tag_end = w->pos;
    f->v = 0;
    switch (f->wire) {
    case WT_VARINT:
        f->voff = w->pos;
        if (!get_varint(w->p, w->len, &w->pos, &f->v))
            return KWC_EPARSE;
        f->vlen = w->pos - f->voff;
        break;
    case WT_I64:
    case WT_I32:
        n = f->wire == WT_I64 ? 8 : 4;
        if (w->len - w->pos < n)
            return KWC_EPARSE;
        f->voff = w->pos;
        f->vlen = (size_t)n;
        w->pos += (size_t)n;
        break;
    case WT_LEN:
        if (!get_varint(w->p, w->len, &w->pos, &n) || n > w->len - w->pos)
            return KWC_EPARSE;
        f->voff = w->pos;
        f->vlen = (size_t)n;
        w->pos += (size_t)n;
        break;
    default:
        return KWC_EPARSE;
    }
    f->end = w->pos;
    return 1;
}

static int
malformed(char *err, size_t errlen, const char *what, size_t at)
{
    return kwc_errf(err, errlen, KWC_EPARSE, "malformed protobuf in %s at byte %zu", what, at);
}

/* ------------------------------------------------------------------------ */
/* Writing helpers                                                           */

size_t
pb_varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Writes v at p (pb_varint_len(v) bytes); returns the count. */
static size_t
put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

static void
add_varint(struct gostr_buf *b, uint64_t v)
{
    uint8_t tmp[10];
    gostr_addn(b, (const char *)tmp, put_varint(tmp, v));
}

static void
add_bytes(struct gostr_buf *b, const void *p, size_t n)
{
    if (n)
        gostr_addn(b, p, n);
}

/* A length-delimited field: tag byte (fields 1..15), length, bytes. */
static void
add_ld(struct gostr_buf *b, uint8_t tag, const void *p, size_t n)
{
    gostr_addn(b, (const char *)&tag, 1);
    add_varint(b, n);
    add_bytes(b, p, n);
}

/* Bytes add_ld writes. */
static uint64_t
ld_size(uint64_t n)
{
    return 1 + pb_varint_len(n) + n;
}

/* ------------------------------------------------------------------------ */
/* Pruning, then protobuf-c                                                  */

/*
 * A path of field numbers from a message down to a scalar. prune() copies
 * out only the fields on active paths, so that protobuf-c decodes a message
 * whose size is bounded by the paths (and the entry limit), never by how
 * many fields the input repeats:
 *  - a scalar: only its last occurrence, the one Go and protobuf-c keep;
 *  - a message: its occurrences merged into one by concatenating their
 *    contents (protobuf's definition of a merge; protobuf-c's own merge
 *    keeps an earlier bytes value when a later occurrence sets it empty,
 *    where Go takes the later one), each occurrence first checked to be a
 *    message on its own as Go decodes each; then pruned in turn;
 *  - a repeated message (map entries): each entry pruned on its own, and
 *    counted against the request's limit before anything is decoded.
 * Every field kept must have its schema's wire type (Go refuses others).
 * Every path is declared in the descriptor it is pruned under (resolves(),
 * or by construction for the internal paths).
 */
struct path {
    const uint32_t *nums;
    unsigned n;
};

/* A field on an active path at one level: a message's occurrences, or a
 * scalar's last occurrence [off, end). */
struct cont {
    uint32_t num;
    bool message;
    size_t count, first_off, off, end;
};

struct pruner {
    const struct path *paths;
    size_t npaths;
    size_t *scratch;    /* PATH_MAX_DEPTH + 1 lists of path indices */
    struct cont *conts; /* PATH_MAX_DEPTH lists of npaths */
    struct gostr_buf out;
    const uint32_t *limit_nums; /* entries of the repeated field there are limited */
    unsigned limit_n;
    size_t limit, count;
    size_t err_at; /* where a malformed field starts (in the message pruned) */
};

/* The wire type of a field of kwc's schema (no packed repeated scalars). */
static unsigned
wire_of(const ProtobufCFieldDescriptor *fd)
{
    switch (fd->type) {
    case PROTOBUF_C_TYPE_BOOL:
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_INT64:
        return WT_VARINT;
    case PROTOBUF_C_TYPE_BYTES:
    case PROTOBUF_C_TYPE_MESSAGE:
        return WT_LEN;
    default:
        abort(); /* k8s_min.proto declares no other type */
    }
}

static int prune(struct pruner *pr, const uint8_t *p, size_t len, size_t at,
                 const ProtobufCMessageDescriptor *d, const size_t *act, size_t nact,
                 unsigned depth);

/* The active paths going below field num at depth, into sub. */
static size_t
below(const struct pruner *pr, const size_t *act, size_t nact, uint32_t num, unsigned depth,
      size_t *sub)
{
    size_t n = 0;
    for (size_t i = 0; i < nact; i++) {
        const struct path *pa = &pr->paths[act[i]];
        if (pa->nums[depth] == num && pa->n > depth + 1)
            sub[n++] = act[i];
    }
    return n;
}

/* Field num holding msg (len bytes at offset at) pruned under fd. */
static int
emit_message(struct pruner *pr, uint32_t num, const uint8_t *msg, size_t len, size_t at,
             const ProtobufCFieldDescriptor *fd, const size_t *act, size_t nact, unsigned depth)
{
    size_t *sub = pr->scratch + (size_t)(depth + 1) * pr->npaths;
    size_t nsub = below(pr, act, nact, num, depth, sub);
    add_varint(&pr->out, (uint64_t)num << 3 | WT_LEN);
    size_t lat = pr->out.len;
    gostr_addn(&pr->out, "\0\0\0\0\0\0\0\0\0\0", 10); /* the length, fixed below */
    int rc =
        prune(pr, len ? msg : (const uint8_t *)"", len, at, fd->descriptor, sub, nsub, depth + 1);
    if (rc < 0)
        return rc;
    size_t clen = pr->out.len - lat - 10;
    uint8_t tmp[10];
    size_t vl = put_varint(tmp, clen);
    memcpy(pr->out.p + lat, tmp, vl);
    memmove(pr->out.p + lat + vl, pr->out.p + lat + 10, clen);
    pr->out.len = lat + vl + clen;
    return 0;
}

/* Is the field num at depth, under the active paths, the limited one? */
static bool
limited(const struct pruner *pr, const size_t *act, size_t nact, uint32_t num, unsigned depth)
{
    if (!pr->limit_nums || depth + 1 != pr->limit_n || pr->limit_nums[depth] != num)
        return false;
    for (size_t i = 0; i < nact; i++) {
        const struct path *pa = &pr->paths[act[i]];
        if (pa->n >= pr->limit_n &&
            memcmp(pa->nums, pr->limit_nums, pr->limit_n * sizeof(uint32_t)) == 0)
            return true;
    }
    return false;
}

static int
prune(struct pruner *pr, const uint8_t *p, size_t len, size_t at,
      const ProtobufCMessageDescriptor *d, const size_t *act, size_t nact, unsigned depth)
{
    struct walk w = {p, len, 0};
    struct fld f;
    struct cont *conts = pr->conts + (size_t)depth * pr->npaths;
    size_t nconts = 0;
    int rc;
    assert(depth < PATH_MAX_DEPTH);
    while ((rc = next_field(&w, &f)) == 1) {
        size_t i = 0;
        while (i < nact && pr->paths[act[i]].nums[depth] != f.num)
            i++;
        if (i == nact)
            continue;
        const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field(d, f.num);
        assert(fd);
        if (f.wire != wire_of(fd)) { /* Go's decoders refuse it: "wrong wireType" */
            pr->err_at = at + f.off;
            return KWC_EPARSE;
        }
        if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
            assert(fd->type == PROTOBUF_C_TYPE_MESSAGE);
            if (limited(pr, act, nact, f.num, depth) && ++pr->count > pr->limit)
                return KWC_ETOOBIG;
            if ((rc = emit_message(pr, f.num, p + f.voff, f.vlen, at + f.voff, fd, act, nact,
                                   depth)) < 0)
                return rc;
            continue;
        }
        size_t c = 0;
        while (c < nconts && conts[c].num != f.num)
            c++;
        if (c == nconts)
            conts[nconts++] = (struct cont){
                f.num, fd->type == PROTOBUF_C_TYPE_MESSAGE, 0, at + f.off, f.off, f.end};
        conts[c].count++;
        conts[c].off = f.off;
        conts[c].end = f.end;
    }
    if (rc < 0) {
        pr->err_at = at + f.off;
        return KWC_EPARSE;
    }
    for (size_t c = 0; c < nconts; c++) {
        struct cont *k = &conts[c];
        if (!k->message) {
            gostr_addn(&pr->out, (const char *)p + k->off, k->end - k->off);
            continue;
        }
        const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field(d, k->num);
        if (k->count == 1) {
            w = (struct walk){p, k->end, k->off};
            next_field(&w, &f);
            rc = emit_message(pr, k->num, p + f.voff, f.vlen, at + f.voff, fd, act, nact, depth);
        } else {
            struct gostr_buf cat = {0};
            rc = 0;
            w.pos = 0;
            while (rc == 0 && next_field(&w, &f) == 1) {
                if (f.num != k->num)
                    continue;
                struct walk ow = {p, f.end, f.voff};
                struct fld g;
                while ((rc = next_field(&ow, &g)) == 1)
                    ;
                if (rc < 0)
                    pr->err_at = at + g.off;
                else
                    add_bytes(&cat, p + f.voff, f.vlen);
            }
            if (rc == 0) /* errors below: somewhere in these occurrences */
                rc = emit_message(pr, k->num, (const uint8_t *)cat.p, cat.len, k->first_off, fd,
                                  act, nact, depth);
            free(cat.p);
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* What unpack_pruned decodes. */
struct unpack_req {
    const ProtobufCMessageDescriptor *desc;
    const struct path *paths;
    size_t npaths;
    const char *what; /* for errors: "the envelope", "object", ... */
    size_t base;      /* offset of the message in the caller's input, for errors */
    /* optional bound (limit_what not NULL): at most limit entries of the
     * repeated field at limit_nums (limit_n deep) */
    const uint32_t *limit_nums;
    unsigned limit_n;
    size_t limit;
    const char *limit_what;
};

/*
 * Prune msg to rq's paths and decode the rest with protobuf-c. Returns 0
 * with *out (protobuf_c_message_free_unpacked), KWC_EPARSE or KWC_ETOOBIG.
 */
static int
unpack_pruned(const struct unpack_req *rq, const uint8_t *msg, size_t len, ProtobufCMessage **out,
              char *err, size_t errlen)
{
    struct pruner pr = {
        .paths = rq->paths,
        .npaths = rq->npaths,
        .limit_nums = rq->limit_what ? rq->limit_nums : NULL,
        .limit_n = rq->limit_n,
        .limit = rq->limit,
    };
    int rc;
    *out = NULL;
    pr.scratch = xmalloc((PATH_MAX_DEPTH + 1) * rq->npaths * sizeof(size_t));
    pr.conts = xmalloc(PATH_MAX_DEPTH * rq->npaths * sizeof(*pr.conts));
    for (size_t i = 0; i < rq->npaths; i++)
        pr.scratch[i] = i;
    /* the pruned message is rarely more than a few hundred bytes */
    pr.out.cap = len < 1024 ? len + 16 : 1024;
    pr.out.p = xmalloc(pr.out.cap);
    rc = prune(&pr, msg, len, 0, rq->desc, pr.scratch, rq->npaths, 0);
    if (rc == KWC_ETOOBIG) {
        rc = kwc_errf(err, errlen, KWC_ETOOBIG, "over %zu %s", rq->limit, rq->limit_what);
        goto out;
    }
    if (rc < 0) {
        rc = malformed(err, errlen, rq->what, rq->base + pr.err_at);
        goto out;
    }
    *out = protobuf_c_message_unpack(rq->desc, NULL, pr.out.len, (const uint8_t *)pr.out.p);
    if (!*out)
        rc = kwc_errf(err, errlen, KWC_EPARSE, "malformed protobuf in %s: %s does not decode",
                      rq->what, rq->desc->short_name);
out:
    free(pr.out.p);
    free(pr.scratch);
    free(pr.conts);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Values                                                                    */

struct span {
    const char *s; /* NULL: absent */
    size_t len;
};

static struct span
bin(protobuf_c_boolean has, ProtobufCBinaryData d)
{
    if (!has)
        return (struct span){NULL, 0};
    return (struct span){d.len ? (const char *)d.data : "", d.len};
}

static struct span
or_empty(struct span s)
{
    return s.s ? s : (struct span){"", 0};
}

/* Up to 40 bytes of s for an error message, non-printable bytes as '?'. */
static const char *
shown(const char *s, size_t len, char buf[static 48])
{
    size_t n = len > 40 ? 40 : len;
    for (size_t i = 0; i < n; i++)
        buf[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    strcpy(buf + n, len > n ? "..." : "");
    return buf;
}

static int
no_nul(struct span v, const char *what, char *err, size_t errlen)
{
    if (v.s && memchr(v.s, '\0', v.len))
        return kwc_errf(err, errlen, KWC_EPARSE, "%s contains a NUL byte", what);
    return 0;
}

/* Go's strconv.ParseUint(s, 10, 64), refusing 0: no object has rv 0. */
static int
parse_rv(struct span r, const char *what, uint64_t *out, char *err, size_t errlen)
{
    char buf[48];
    uint64_t v = 0;
    if (!r.s || r.len == 0)
        return kwc_errf(err, errlen, KWC_EPARSE, "%s missing", what);
    for (size_t i = 0; i < r.len; i++) {
        unsigned d = (unsigned)(unsigned char)r.s[i] - '0';
        if (d > 9 || v > (UINT64_MAX - d) / 10)
            return kwc_errf(err, errlen, KWC_EPARSE, "%s \"%s\" is not a decimal uint64", what,
                            shown(r.s, r.len, buf));
        v = v * 10 + d;
    }
    if (v == 0)
        return kwc_errf(err, errlen, KWC_EPARSE, "%s is 0", what);
    *out = v;
    return 0;
}

static bool
span_is(struct span v, const char *s)
{
    return v.s && v.len == strlen(s) && memcmp(v.s, s, v.len) == 0;
}

/* The member at offset (a field descriptor's offset or quantifier_offset) of m. */
static const void *
member(const ProtobufCMessage *m, unsigned offset)
{
    return (const char *)m + offset;
}

/* ------------------------------------------------------------------------ */
/* Objects: metadata and field paths                                         */

/* clang-format off */
#define PB_META {"metadata.name", NULL, 2, {1, 1}, false}, {"metadata.namespace", NULL, 2, {1, 3}, false}
/* clang-format on */

static const struct pb_field pf_meta[] = {PB_META};
/* the order of kinds.c's f_pods, so that an index into one is one into the other */
static const struct pb_field pf_pods[] = {
    PB_META,
    {"spec.nodeName", NULL, 2, {2, 10}, false},
    {"spec.restartPolicy", NULL, 2, {2, 3}, false},
    {"spec.schedulerName", NULL, 2, {2, 19}, false},
    {"spec.serviceAccountName", NULL, 2, {2, 8}, false},
    {"spec.hostNetwork", "false", 2, {2, 11}, true},
    {"status.phase", NULL, 2, {3, 1}, false},
    {"status.podIP", NULL, 2, {3, 6}, false},
    {"status.nominatedNodeName", NULL, 2, {3, 11}, false},
};
static const struct pb_field pf_secrets[] = {PB_META, {"type", NULL, 1, {3}, false}};
static const struct pb_field pf_nodes[] = {PB_META,
                                           {"spec.unschedulable", "false", 2, {2, 4}, true}};
static const struct pb_field pf_namespaces[] = {PB_META, {"status.phase", NULL, 2, {3, 1}, false}};

/* group, resource, fields, the object message of k8s_min.proto they are read with */
#define PB_KINDS(X)                                                                                \
    X("", "pods", pf_pods, kwcpb__pod__descriptor)                                                 \
    X("", "secrets", pf_secrets, kwcpb__secret__descriptor)                                        \
    X("", "nodes", pf_nodes, kwcpb__node__descriptor)                                              \
    X("", "namespaces", pf_namespaces, kwcpb__namespace__descriptor)

const struct pb_field *
pb_fields(const char *group, const char *resource, size_t *n)
{
#define PB_KIND_ROW(g, r, arr, desc)                                                               \
    if (strcmp(group, g) == 0 && strcmp(resource, r) == 0) {                                       \
        *n = KWC_ARRAY_LEN(arr);                                                                   \
        return arr;                                                                                \
    }
    PB_KINDS(PB_KIND_ROW)
#undef PB_KIND_ROW
    *n = KWC_ARRAY_LEN(pf_meta);
    return pf_meta;
}

/* The leaf's descriptor when f's path is declared under d: messages down to
 * a bool (f->boolean) or a bytes or integer field (!f->boolean); else NULL. */
static const ProtobufCFieldDescriptor *
resolves(const ProtobufCMessageDescriptor *d, const struct pb_field *f)
{
    if (f->n < 1 || f->n > PATH_MAX_DEPTH)
        return NULL;
    for (unsigned i = 0;; i++) {
        const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field(d, f->nums[i]);
        if (!fd || fd->label != PROTOBUF_C_LABEL_OPTIONAL)
            return NULL;
        if (i + 1 < f->n) {
            if (fd->type != PROTOBUF_C_TYPE_MESSAGE)
                return NULL;
            d = fd->descriptor;
            continue;
        }
        switch (fd->type) {
        case PROTOBUF_C_TYPE_BOOL:
            return f->boolean ? fd : NULL;
        case PROTOBUF_C_TYPE_BYTES:
        case PROTOBUF_C_TYPE_INT32:
        case PROTOBUF_C_TYPE_INT64:
            return f->boolean ? NULL : fd;
        default:
            return NULL;
        }
    }
}

/*
 * The object message to read fields with: the kind's own when fields lie in
 * one of pb_fields' tables, else the first kind whose schema declares the
 * most of their paths (Object, metadata only, when none declares any). A
 * path the chosen schema does not declare reads as missing.
 */
static const ProtobufCMessageDescriptor *
object_desc(const struct pb_field *fields, size_t n)
{
    static const struct {
        const struct pb_field *fields;
        size_t n;
        const ProtobufCMessageDescriptor *desc;
    } kinds[] = {
#define PB_KIND_DESC(g, r, arr, desc) {arr, KWC_ARRAY_LEN(arr), &desc},
        PB_KINDS(PB_KIND_DESC)
#undef PB_KIND_DESC
    };
    if (n == 0)
        return &kwcpb__object__descriptor;
    for (size_t k = 0; k < KWC_ARRAY_LEN(kinds); k++) {
        uintptr_t a = (uintptr_t)fields, lo = (uintptr_t)kinds[k].fields;
        if (a >= lo && a + n * sizeof(*fields) <= lo + kinds[k].n * sizeof(*fields))
            return kinds[k].desc;
    }
    const ProtobufCMessageDescriptor *best = &kwcpb__object__descriptor;
    size_t most = 0;
    for (size_t k = 0; k < KWC_ARRAY_LEN(kinds); k++) {
        size_t r = 0;
        for (size_t i = 0; i < n; i++)
            r += resolves(kinds[k].desc, &fields[i]) != NULL;
        if (r > most) {
            most = r;
            best = kinds[k].desc;
        }
    }
    return best;
}

static const uint32_t P_NAME[] = {1, 1}, P_NS[] = {1, 3}, P_UID[] = {1, 5}, P_RV[] = {1, 6},
                      P_DEL_S[] = {1, 9, 1}, P_DEL_N[] = {1, 9, 2}, P_LABEL_K[] = {1, 11, 1},
                      P_LABEL_V[] = {1, 11, 2}, P_ANN_K[] = {1, 12, 1}, P_ANN_V[] = {1, 12, 2};

/* An object decoded for its metadata (and the fields' paths that resolved). */
struct object_dec {
    ProtobufCMessage *top; /* owned: protobuf_c_message_free_unpacked */
    const ProtobufCMessageDescriptor *desc;
    const Kwcpb__ObjectMeta *md; /* NULL: no metadata */
};

/*
 * Decode obj's metadata (bookmark: resourceVersion and annotations; else
 * name, namespace, uid, resourceVersion, deletionTimestamp, labels, with at
 * most max_entries labels) and the paths of fields[i] that resolve
 * (resolved[i]). Returns 0, KWC_EPARSE or KWC_ETOOBIG.
 */
static int
decode_object(const uint8_t *obj, size_t len, const struct pb_field *fields, size_t nf,
              bool bookmark, size_t max_entries, struct object_dec *dc, bool *resolved, char *err,
              size_t errlen)
{
    struct path *paths = xmalloc((8 + nf) * sizeof(*paths));
    size_t np = 0;
    int rc;

    memset(dc, 0, sizeof(*dc));
    dc->desc = object_desc(fields, nf);
    if (bookmark) {
        paths[np++] = (struct path){P_RV, 2};
        paths[np++] = (struct path){P_ANN_K, 3};
        paths[np++] = (struct path){P_ANN_V, 3};
    } else {
        paths[np++] = (struct path){P_NAME, 2};
        paths[np++] = (struct path){P_NS, 2};
        paths[np++] = (struct path){P_UID, 2};
        paths[np++] = (struct path){P_RV, 2};
        paths[np++] = (struct path){P_DEL_S, 3};
        paths[np++] = (struct path){P_DEL_N, 3};
        paths[np++] = (struct path){P_LABEL_K, 3};
        paths[np++] = (struct path){P_LABEL_V, 3};
    }
    for (size_t i = 0; i < nf; i++) {
        resolved[i] = resolves(dc->desc, &fields[i]) != NULL;
        if (resolved[i])
            paths[np++] = (struct path){fields[i].nums, fields[i].n};
    }
    struct unpack_req rq = {
        .desc = dc->desc,
        .paths = paths,
        .npaths = np,
        .what = "object",
        .limit_nums = bookmark ? P_ANN_K : P_LABEL_K,
        .limit_n = 2,
        .limit = max_entries,
        .limit_what = bookmark ? "annotations" : "labels",
    };
    rc = unpack_pruned(&rq, obj, len, &dc->top, err, errlen);
    free(paths);
    if (rc < 0)
        return rc;
    const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field(dc->desc, 1);
    assert(fd && fd->descriptor == &kwcpb__object_meta__descriptor);
    dc->md = *(const Kwcpb__ObjectMeta *const *)member(dc->top, fd->offset);
    return 0;
}

/* The value of f in m (under d; f resolved there): *out, its s NULL when
 * absent; integers are formatted into num. */
static int
field_value(const ProtobufCMessage *m, const ProtobufCMessageDescriptor *d,
            const struct pb_field *f, char num[static 32], struct span *out, char *err,
            size_t errlen)
{
    char what[160];
    out->s = NULL;
    for (unsigned i = 0;; i++) {
        const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field(d, f->nums[i]);
        if (i + 1 < f->n) {
            m = *(const ProtobufCMessage *const *)member(m, fd->offset);
            if (!m)
                return 0;
            d = fd->descriptor;
            continue;
        }
        if (!*(const protobuf_c_boolean *)member(m, fd->quantifier_offset))
            return 0;
        switch (fd->type) {
        case PROTOBUF_C_TYPE_BYTES:
            *out = bin(1, *(const ProtobufCBinaryData *)member(m, fd->offset));
            snprintf(what, sizeof(what), "field %s", f->path);
            return no_nul(*out, what, err, errlen);
        case PROTOBUF_C_TYPE_BOOL:
            out->s = *(const protobuf_c_boolean *)member(m, fd->offset) ? "true" : "false";
            break;
        case PROTOBUF_C_TYPE_INT32:
            out->s = num;
            snprintf(num, 32, "%" PRId32, *(const int32_t *)member(m, fd->offset));
            break;
        case PROTOBUF_C_TYPE_INT64:
            out->s = num;
            snprintf(num, 32, "%" PRId64, *(const int64_t *)member(m, fd->offset));
            break;
        default:
            abort(); /* resolves() admits no other type */
        }
        out->len = strlen(out->s);
        return 0;
    }
}

struct entry {
    struct span key, value;
    size_t idx;
};

static int
entry_cmp(const void *a, const void *b)
{
    const struct entry *x = a, *y = b;
    size_t n = x->key.len < y->key.len ? x->key.len : y->key.len;
    int c = n ? memcmp(x->key.s, y->key.s, n) : 0;
    if (c)
        return c;
    if (x->key.len != y->key.len)
        return x->key.len < y->key.len ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Copy r into the arena at *at. */
static const char *
put(char **at, struct span r)
{
    char *dst = *at;
    if (r.len)
        memcpy(dst, r.s, r.len);
    dst[r.len] = '\0';
    *at += r.len + 1;
    return dst;
}

enum { M_NAMESPACE, M_NAME, M_UID, M_FIXED };

/* *out from a decoded object, as obj_meta_parse fills it. */
static int
meta_fill(const struct object_dec *dc, const struct pb_field *fields, size_t nf,
          const bool *resolved, struct obj_meta *out, char *err, size_t errlen)
{
    const Kwcpb__ObjectMeta *md = dc->md;
    struct span fixed[M_FIXED];
    struct entry *lab = NULL;
    struct span *fld = NULL;
    char(*num)[32] = NULL;
    int rc;

    if (!md)
        return kwc_errf(err, errlen, KWC_EPARSE, "metadata missing");
    fixed[M_NAME] = bin(md->has_name, md->name);
    fixed[M_NAMESPACE] = or_empty(bin(md->has_namespace_, md->namespace_));
    fixed[M_UID] = or_empty(bin(md->has_uid, md->uid));
    if (!fixed[M_NAME].s || fixed[M_NAME].len == 0)
        return kwc_errf(err, errlen, KWC_EPARSE, "metadata.name missing");
    if ((rc = no_nul(fixed[M_NAME], "metadata.name", err, errlen)) < 0 ||
        (rc = no_nul(fixed[M_NAMESPACE], "metadata.namespace", err, errlen)) < 0 ||
        (rc = no_nul(fixed[M_UID], "metadata.uid", err, errlen)) < 0 ||
        (rc = parse_rv(bin(md->has_resourceversion, md->resourceversion),
                       "metadata.resourceVersion", &out->rv, err, errlen)) < 0)
        return rc;
    out->deleting = md->deletiontimestamp != NULL;

    size_t nl = md->n_labels, total = 0;
    lab = xcalloc(nl + 1, sizeof(*lab));
    for (size_t i = 0; i < nl; i++) {
        const Kwcpb__StringEntry *e = md->labels[i];
        char buf[48], what[96];
        lab[i].key = or_empty(bin(e->has_key, e->key));
        lab[i].value = or_empty(bin(e->has_value, e->value));
        lab[i].idx = i;
        snprintf(what, sizeof(what), "metadata.labels[\"%s\"]",
                 shown(lab[i].key.s, lab[i].key.len, buf));
        if ((rc = no_nul(lab[i].key, "a key of metadata.labels", err, errlen)) < 0 ||
            (rc = no_nul(lab[i].value, what, err, errlen)) < 0)
            goto out;
    }
    /* sorted by key; of a repeated key the last entry stays, as in a Go map */
    if (nl > 1)
        qsort(lab, nl, sizeof(*lab), entry_cmp);
    size_t nu = 0;
    for (size_t i = 0; i < nl; i++) {
        if (i + 1 < nl && entry_cmp(&(struct entry){lab[i].key, {0}, 0},
                                    &(struct entry){lab[i + 1].key, {0}, 0}) == 0)
            continue;
        lab[nu++] = lab[i];
    }
    for (size_t i = 0; i < nu; i++)
        total += lab[i].key.len + lab[i].value.len + 2;

    fld = xcalloc(nf + 1, sizeof(*fld));
    num = xcalloc(nf + 1, sizeof(*num));
    for (size_t f = 0; f < nf; f++) {
        if (resolved[f] &&
            (rc = field_value(dc->top, dc->desc, &fields[f], num[f], &fld[f], err, errlen)) < 0)
            goto out;
        if (!fld[f].s)
            fld[f] = (struct span){fields[f].missing ? fields[f].missing : "",
                                   fields[f].missing ? strlen(fields[f].missing) : 0};
        total += fld[f].len + 1;
    }
    for (int f = 0; f < M_FIXED; f++)
        total += fixed[f].len + 1;

    size_t head = nu * sizeof(struct obj_label) + nf * sizeof(char *);
    char *arena = xmalloc(head + total);
    struct obj_label *labs = (struct obj_label *)(void *)arena;
    const char **flds = (const char **)(void *)(arena + nu * sizeof(struct obj_label));
    char *at = arena + head;
    out->namespace_ = put(&at, fixed[M_NAMESPACE]);
    out->name = put(&at, fixed[M_NAME]);
    out->uid = put(&at, fixed[M_UID]);
    for (size_t i = 0; i < nu; i++) {
        labs[i].key = put(&at, lab[i].key);
        labs[i].value = put(&at, lab[i].value);
    }
    for (size_t f = 0; f < nf; f++)
        flds[f] = put(&at, fld[f]);
    assert(at == arena + head + total);
    out->labels = labs;
    out->n_labels = nu;
    out->fields = flds;
    out->n_fields = nf;
    out->arena_ = arena;
    rc = 0;
out:
    free(lab);
    free(fld);
    free(num);
    return rc;
}

int
pb_meta_parse(const void *obj, size_t len, const struct pb_field *fields, size_t n_fields,
              size_t max_bytes, size_t max_labels, struct obj_meta *out, char *err, size_t errlen)
{
    size_t max = max_bytes ? max_bytes : OBJ_MAX_BYTES;
    struct object_dec dc;
    bool *resolved;
    int rc;

    memset(out, 0, sizeof(*out));
    if (len > max)
        return kwc_errf(err, errlen, KWC_ETOOBIG, "object is %zu bytes, over the limit of %zu", len,
                        max);
    resolved = xcalloc(n_fields + 1, sizeof(*resolved));
    rc = decode_object(obj, len, fields, n_fields, false, max_labels ? max_labels : OBJ_MAX_LABELS,
                       &dc, resolved, err, errlen);
    if (rc == 0)
        rc = meta_fill(&dc, fields, n_fields, resolved, out, err, errlen);
    if (dc.top)
        protobuf_c_message_free_unpacked(dc.top, NULL);
    free(resolved);
    if (rc < 0)
        memset(out, 0, sizeof(*out));
    return rc;
}

int
pb_with_rv(const void *obj, size_t len, uint64_t rv, char **out, size_t *out_len)
{
    const uint8_t *p = obj;
    struct walk w = {p, len, 0};
    struct fld f, md = {0}, r = {0};
    bool have_md = false, have_rv = false;
    struct obj_meta m;
    int rc;

    *out = NULL;
    *out_len = 0;
    /* only an object pb_meta_parse reads (at any size): its copy reads the same */
    if (rv == 0 || pb_meta_parse(obj, len, NULL, 0, SIZE_MAX, SIZE_MAX, &m, NULL, 0) < 0)
        return KWC_EPARSE;
    obj_meta_fini(&m);
    while ((rc = next_field(&w, &f)) == 1)
        if (f.num == 1) {
            md = f;
            have_md = true;
        }
    if (rc < 0 || !have_md || md.wire != WT_LEN)
        return KWC_EPARSE;
    /* the last resourceVersion of the last metadata is the one decoders keep */
    struct walk mw = {p + md.voff, md.vlen, 0};
    size_t ins = md.vlen;
    bool have_ins = false;
    while ((rc = next_field(&mw, &f)) == 1) {
        if (f.num == 6) {
            r = f;
            have_rv = true;
        } else if (f.num > 6 && !have_ins) {
            ins = f.off;
            have_ins = true;
        }
    }
    if (rc < 0)
        return KWC_EPARSE;

    char rvs[24];
    size_t rl = (size_t)snprintf(rvs, sizeof(rvs), "%" PRIu64, rv);
    /* metadata's content: [0, cut), the rv field, [resume, vlen) */
    size_t cut = have_rv ? r.off : ins, resume = have_rv ? r.end : ins;
    size_t tagl = have_rv ? r.tag_end - r.off : 1;
    uint64_t mlen = md.vlen - (resume - cut) + tagl + pb_varint_len(rl) + rl;
    struct gostr_buf b = {0};
    add_bytes(&b, p, md.tag_end);
    add_varint(&b, mlen);
    add_bytes(&b, p + md.voff, cut);
    if (have_rv)
        add_bytes(&b, p + md.voff + r.off, tagl);
    else
        gostr_addc(&b, 0x32);
    add_varint(&b, rl);
    add_bytes(&b, rvs, rl);
    add_bytes(&b, p + md.voff + resume, md.vlen - resume);
    add_bytes(&b, p + md.end, len - md.end);
    *out_len = b.len;
    *out = gostr_take(&b);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The envelope                                                              */

int
pb_envelope_parse(const void *buf, size_t len, struct pb_envelope *out, char *err, size_t errlen)
{
    static const uint32_t P_AV[] = {1, 1}, P_KIND[] = {1, 2}, P_CE[] = {3}, P_CT[] = {4};
    static const struct path paths[] = {{P_AV, 2}, {P_KIND, 2}, {P_CE, 1}, {P_CT, 1}};
    const uint8_t *p = buf;
    struct walk w = {p, len, PB_MAGIC_LEN};
    struct fld f, g;
    size_t av_off = 0, av_len = 0, k_off = 0, k_len = 0, raw_off = len, raw_len = 0;
    ProtobufCMessage *m;
    char b1[48], b2[48];
    int rc;

    memset(out, 0, sizeof(*out));
    if (len < PB_MAGIC_LEN || memcmp(p, PB_MAGIC, PB_MAGIC_LEN) != 0)
        return kwc_errf(err, errlen, KWC_EPARSE,
                        "not a Kubernetes protobuf message (no \"k8s\\x00\" prefix)");
    /* spans: typeMeta's strings and raw, the last of each as decoders keep them */
    while ((rc = next_field(&w, &f)) == 1) {
        if (f.num == 1 && f.wire == WT_LEN) {
            struct walk tw = {p, f.end, f.voff};
            while ((rc = next_field(&tw, &g)) == 1) {
                if (g.num == 1 && g.wire == WT_LEN) {
                    av_off = g.voff;
                    av_len = g.vlen;
                } else if (g.num == 2 && g.wire == WT_LEN) {
                    k_off = g.voff;
                    k_len = g.vlen;
                }
            }
            if (rc < 0)
                return malformed(err, errlen, "the envelope's typeMeta", g.off);
        } else if (f.num == 2) {
            if (f.wire != WT_LEN)
                return malformed(err, errlen, "the envelope", f.off);
            raw_off = f.voff;
            raw_len = f.vlen;
        }
    }
    if (rc < 0)
        return malformed(err, errlen, "the envelope", f.off);

    /* the values, decoded */
    struct unpack_req rq = {.desc = &kwcpb__unknown__descriptor,
                            .paths = paths,
                            .npaths = KWC_ARRAY_LEN(paths),
                            .what = "the envelope",
                            .base = PB_MAGIC_LEN};
    if ((rc = unpack_pruned(&rq, p + PB_MAGIC_LEN, len - PB_MAGIC_LEN, &m, err, errlen)) < 0)
        return rc;
    const Kwcpb__Unknown *u = (const Kwcpb__Unknown *)m;
    struct span ce = bin(u->has_contentencoding, u->contentencoding);
    struct span ct = bin(u->has_contenttype, u->contenttype);
    struct span av = {NULL, 0}, kind = {NULL, 0};
    if (u->typemeta) {
        av = bin(u->typemeta->has_apiversion, u->typemeta->apiversion);
        kind = bin(u->typemeta->has_kind, u->typemeta->kind);
    }
    /* the walker and protobuf-c read the same bytes */
    assert(av.len == av_len && (!av_len || memcmp(av.s, p + av_off, av_len) == 0));
    assert(kind.len == k_len && (!k_len || memcmp(kind.s, p + k_off, k_len) == 0));
    if (ce.len || ct.len)
        rc = kwc_errf(err, errlen, KWC_EPARSE,
                      "envelope with contentEncoding \"%s\" and contentType \"%s\": kwc reads "
                      "only the plain encoding",
                      shown(ce.s ? ce.s : "", ce.len, b1), shown(ct.s ? ct.s : "", ct.len, b2));
    else if ((rc = no_nul(av, "the envelope's apiVersion", err, errlen)) == 0)
        rc = no_nul(kind, "the envelope's kind", err, errlen);
    protobuf_c_message_free_unpacked(m, NULL);
    if (rc < 0)
        return rc;
    out->raw_off = raw_off;
    out->raw_len = raw_len;
    out->api_version = (const char *)p + av_off;
    out->api_version_len = av_len;
    out->kind = (const char *)p + k_off;
    out->kind_len = k_len;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Lists                                                                     */

int
pb_list_parse(const void *body, size_t len, struct pb_list *l, char *err, size_t errlen)
{
    static const uint32_t L_RV[] = {1, 2}, L_CONT[] = {1, 3}, L_REM[] = {1, 4};
    static const struct path paths[] = {{L_RV, 2}, {L_CONT, 2}, {L_REM, 2}};
    const uint8_t *p = body;
    struct pb_envelope env;
    struct fld f;
    ProtobufCMessage *m = NULL;
    size_t n = 0, meta = 0;
    int rc;

    memset(l, 0, sizeof(*l));
    if ((rc = pb_envelope_parse(body, len, &env, err, errlen)) < 0)
        return rc;
    if (env.kind_len >= sizeof(l->kind) || env.api_version_len >= sizeof(l->api_version))
        return kwc_errf(err, errlen, KWC_ETOOBIG, "list kind or apiVersion over %zu bytes",
                        sizeof(l->kind) - 1);
    memcpy(l->kind, env.kind, env.kind_len);
    memcpy(l->api_version, env.api_version, env.api_version_len);

    /* XxxList{1 metadata, 2 items}: count, bound, then take the spans */
    const uint8_t *raw = p + env.raw_off;
    struct walk w = {raw, env.raw_len, 0};
    while ((rc = next_field(&w, &f)) == 1) {
        if ((f.num == 1 || f.num == 2) && f.wire != WT_LEN)
            break;
        n += f.num == 2;
        meta += f.num == 1 ? f.vlen : 0;
    }
    if (rc != 0) {
        rc = malformed(err, errlen, "the list", env.raw_off + f.off);
        goto fail;
    }
    if (meta > OBJ_LIST_MAX_META) {
        rc = kwc_errf(err, errlen, KWC_ETOOBIG, "list metadata is %zu bytes, over the limit of %u",
                      meta, OBJ_LIST_MAX_META);
        goto fail;
    }
    l->off = xcalloc(n + 1, sizeof(*l->off));
    l->len = xcalloc(n + 1, sizeof(*l->len));
    w.pos = 0;
    while (next_field(&w, &f) == 1)
        if (f.num == 2) {
            l->off[l->n_items] = env.raw_off + f.voff;
            l->len[l->n_items++] = f.vlen;
        }
    assert(l->n_items == n);

    struct unpack_req rq = {.desc = &kwcpb__list__descriptor,
                            .paths = paths,
                            .npaths = KWC_ARRAY_LEN(paths),
                            .what = "the list",
                            .base = env.raw_off};
    if ((rc = unpack_pruned(&rq, raw, env.raw_len, &m, err, errlen)) < 0)
        goto fail;
    const Kwcpb__ListMeta *lm = ((const Kwcpb__List *)m)->metadata;
    struct span rv = {NULL, 0}, cont = {NULL, 0};
    if (lm) {
        rv = bin(lm->has_resourceversion, lm->resourceversion);
        cont = or_empty(bin(lm->has_continuetoken, lm->continuetoken));
        l->has_remaining = lm->has_remainingitemcount;
        l->remaining = lm->has_remainingitemcount ? lm->remainingitemcount : 0;
    }
    if ((rc = parse_rv(rv, "ListMeta.resourceVersion", &l->rv, err, errlen)) < 0 ||
        (rc = no_nul(cont, "ListMeta.continue", err, errlen)) < 0)
        goto fail;
    l->continue_ = xstrndup(cont.s ? cont.s : "", cont.len);
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
fail:
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
    pb_list_fini(l);
    return rc;
}

void
pb_list_fini(struct pb_list *l)
{
    if (!l)
        return;
    free(l->continue_);
    free(l->off);
    free(l->len);
    memset(l, 0, sizeof(*l));
}

/* ------------------------------------------------------------------------ */
/* Watch stream framing                                                      */

void
pb_split_init(struct pb_splitter *s, size_t max_frame)
{
    memset(s, 0, sizeof(*s));
    s->max_frame = max_frame ? max_frame : PB_MAX_FRAME;
}

void
pb_split_fini(struct pb_splitter *s)
{
    if (!s)
        return;
    free(s->buf);
    memset(s, 0, sizeof(*s));
}

size_t
pb_split_pending(const struct pb_splitter *s)
{
    return s->handed_out ? 0 : s->len;
}

static size_t
be32(const char *p)
{
    const unsigned char *u = (const unsigned char *)p;
    return (size_t)u[0] << 24 | (size_t)u[1] << 16 | (size_t)u[2] << 8 | u[3];
}

static int
split_overflow(struct pb_splitter *s)
{
    free(s->buf);
    s->buf = NULL;
    s->len = s->cap = 0;
    s->failed = true;
    return KWC_ETOOBIG;
}

/* Append n bytes of a frame whose whole size (prefix included) is total,
 * or 4 while its prefix is incomplete: the buffer doubles as bytes arrive
 * and never exceeds the frame, so a length is never allocated ahead of the
 * bytes that back it by more than twice. */
static void
split_carry(struct pb_splitter *s, const char *p, size_t n, size_t total)
{
    size_t need = s->len + n;
    assert(need <= total);
    if (need > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < need)
            cap *= 2;
        if (cap > total)
            cap = total;
        s->buf = xrealloc(s->buf, cap);
        s->cap = cap;
    }
    if (n)
        memcpy(s->buf + s->len, p, n);
    s->len = need;
}

static void
split_reset(struct pb_splitter *s)
{
    s->len = 0;
    s->handed_out = false;
    if (s->cap > SPLIT_KEEP) {
        free(s->buf);
        s->buf = NULL;
        s->cap = 0;
    }
}

int
pb_split_next(struct pb_splitter *s, const char **data, size_t *len, const char **frame,
              size_t *frame_len)
{
    size_t fl, n;
    if (s->failed)
        return KWC_ETOOBIG;
    if (s->handed_out)
        split_reset(s);
    if (*len == 0)
        return 0;
    if (s->len == 0 && *len >= 4) {
        /* a frame that starts in this chunk: in place when it ends here too */
        fl = be32(*data);
        if (fl > s->max_frame)
            return split_overflow(s);
        if (*len - 4 >= fl) {
            *frame = *data + 4;
            *frame_len = fl;
            *data += 4 + fl;
            *len -= 4 + fl;
            return 1;
        }
        split_carry(s, *data, *len, 4 + fl);
        *data += *len;
        *len = 0;
        return 0;
    }
    if (s->len < 4) {
        n = 4 - s->len < *len ? 4 - s->len : *len;
        split_carry(s, *data, n, 4);
        *data += n;
        *len -= n;
        if (s->len < 4)
            return 0;
        if (be32(s->buf) > s->max_frame)
            return split_overflow(s);
    }
    fl = be32(s->buf);
    n = 4 + fl - s->len < *len ? 4 + fl - s->len : *len;
    split_carry(s, *data, n, 4 + fl);
    *data += n;
    *len -= n;
    if (s->len < 4 + fl)
        return 0;
    *frame = s->buf + 4;
    *frame_len = fl;
    s->handed_out = true;
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Watch events                                                              */

static int
type_from_name(struct span t, enum wevent_type *out)
{
    static const enum wevent_type all[] = {
#define PB_WEVENT_ALL(e, s) e,
        WEVENT_TYPES(PB_WEVENT_ALL)
#undef PB_WEVENT_ALL
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(all); i++)
        if (span_is(t, wevent_type_name(all[i]))) {
            *out = all[i];
            return 0;
        }
    return KWC_EPARSE;
}

/* A bookmark's object: its rv and the initial-events-end annotation. */
static int
bookmark(const uint8_t *obj, size_t len, struct wevent *ev, char *err, size_t errlen)
{
    struct object_dec dc;
    int rc = decode_object(obj, len, NULL, 0, true, OBJ_MAX_LABELS, &dc, NULL, err, errlen);
    if (rc < 0)
        return rc;
    if (!dc.md) {
        rc = kwc_errf(err, errlen, KWC_EPARSE, "BOOKMARK object has no metadata");
    } else if ((rc = parse_rv(bin(dc.md->has_resourceversion, dc.md->resourceversion),
                              "BOOKMARK metadata.resourceVersion", &ev->rv, err, errlen)) == 0) {
        /* a map: the last entry of a key wins */
        for (size_t i = 0; i < dc.md->n_annotations; i++) {
            const Kwcpb__StringEntry *e = dc.md->annotations[i];
            if (span_is(or_empty(bin(e->has_key, e->key)), INITIAL_EVENTS_END))
                ev->initial_events_end = span_is(bin(e->has_value, e->value), "true");
        }
    }
    protobuf_c_message_free_unpacked(dc.top, NULL);
    return rc;
}

/* An ERROR event's Status: code, reason, message (copied into the arena). */
static int
error_status(const uint8_t *obj, size_t len, size_t base, struct wevent *ev, char *err,
             size_t errlen)
{
    static const uint32_t P_MSG[] = {3}, P_REASON[] = {4}, P_CODE[] = {6};
    static const struct path paths[] = {{P_MSG, 1}, {P_REASON, 1}, {P_CODE, 1}};
    struct unpack_req rq = {.desc = &kwcpb__status__descriptor,
                            .paths = paths,
                            .npaths = KWC_ARRAY_LEN(paths),
                            .what = "Status",
                            .base = base};
    ProtobufCMessage *m;
    int rc = unpack_pruned(&rq, obj, len, &m, err, errlen);
    if (rc < 0)
        return rc;
    const Kwcpb__Status *st = (const Kwcpb__Status *)m;
    struct span reason = or_empty(bin(st->has_reason, st->reason));
    struct span message = or_empty(bin(st->has_message, st->message));
    if ((rc = no_nul(reason, "Status reason", err, errlen)) == 0 &&
        (rc = no_nul(message, "Status message", err, errlen)) == 0) {
        ev->code = st->has_code ? st->code : 0;
        char *at = ev->arena_ = xmalloc(reason.len + message.len + 2);
        ev->reason = put(&at, reason);
        ev->message = put(&at, message);
    }
    protobuf_c_message_free_unpacked(m, NULL);
    return rc;
}

int
pb_wevent_parse(const void *frame, size_t len, struct wevent *out, struct pb_envelope *env,
                char *err, size_t errlen)
{
    static const uint32_t P_TYPE[] = {1};
    static const struct path paths[] = {{P_TYPE, 1}};
    const uint8_t *p = frame;
    struct walk w = {p, len, 0};
    struct fld f, g;
    size_t raw_off = 0, raw_len = 0;
    bool have_raw = false;
    struct pb_envelope e;
    ProtobufCMessage *m;
    char buf[48];
    int rc;

    memset(out, 0, sizeof(*out));
    if (env)
        memset(env, 0, sizeof(*env));
    /* object: RawExtension{1 raw}, the last raw as decoders keep it */
    while ((rc = next_field(&w, &f)) == 1) {
        if (f.num != 2)
            continue;
        if (f.wire != WT_LEN)
            return malformed(err, errlen, "the watch event", f.off);
        struct walk ow = {p, f.end, f.voff};
        while ((rc = next_field(&ow, &g)) == 1)
            if (g.num == 1) {
                if (g.wire != WT_LEN)
                    return malformed(err, errlen, "the watch event's object", g.off);
                raw_off = g.voff;
                raw_len = g.vlen;
                have_raw = true;
            }
        if (rc < 0)
            return malformed(err, errlen, "the watch event's object", g.off);
    }
    if (rc < 0)
        return malformed(err, errlen, "the watch event", f.off);

    struct unpack_req rq = {.desc = &kwcpb__watch_event__descriptor,
                            .paths = paths,
                            .npaths = KWC_ARRAY_LEN(paths),
                            .what = "the watch event"};
    if ((rc = unpack_pruned(&rq, p, len, &m, err, errlen)) < 0)
        return rc;
    const Kwcpb__WatchEvent *we = (const Kwcpb__WatchEvent *)m;
    struct span type = or_empty(bin(we->has_type, we->type));
    rc = type_from_name(type, &out->type);
    if (rc < 0)
        rc = kwc_errf(err, errlen, KWC_EPARSE, "unknown watch event type \"%s\"",
                      shown(type.s, type.len, buf));
    protobuf_c_message_free_unpacked(m, NULL);
    if (rc < 0)
        return rc;
    if (!have_raw)
        return kwc_errf(err, errlen, KWC_EPARSE, "watch event has no object");
    if ((rc = pb_envelope_parse(p + raw_off, raw_len, &e, err, errlen)) < 0)
        goto fail;
    out->obj_off = raw_off + e.raw_off;
    out->obj_len = e.raw_len;
    if (out->type == WEVENT_BOOKMARK)
        rc = bookmark(p + out->obj_off, out->obj_len, out, err, errlen);
    else if (out->type == WEVENT_ERROR)
        rc = error_status(p + out->obj_off, out->obj_len, out->obj_off, out, err, errlen);
    if (rc < 0)
        goto fail;
    if (env)
        *env = e;
    return 0;
fail:
    wevent_fini(out);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                   */

int
pb_object_meta(struct gostr_buf *b, const void *obj, size_t len)
{
    struct walk w = {.p = obj, .len = len};
    struct fld f, meta = {0};
    bool have = false;
    int rc;
    while ((rc = next_field(&w, &f)) == 1) {
        if (f.num != 1)
            continue;
        if (have || f.wire != WT_LEN)
            return -1; /* kube writes ObjectMeta once, as a message */
        have = true;
        meta = f;
    }
    if (rc != 0 || !have)
        return -1;
    add_ld(b, 0x0a, w.p + meta.voff, meta.vlen);
    return 0;
}

size_t
pb_envelope_head(char *buf, const char *api_version, const char *kind, uint64_t raw_len)
{
    size_t al = strlen(api_version), kl = strlen(kind), n = 0;
    uint8_t *p = (uint8_t *)buf;
    memcpy(p, PB_MAGIC, PB_MAGIC_LEN);
    n += PB_MAGIC_LEN;
    p[n++] = 0x0a; /* typeMeta */
    n += put_varint(p + n, ld_size(al) + ld_size(kl));
    p[n++] = 0x0a; /* apiVersion */
    n += put_varint(p + n, al);
    memcpy(p + n, api_version, al);
    n += al;
    p[n++] = 0x12; /* kind */
    n += put_varint(p + n, kl);
    memcpy(p + n, kind, kl);
    n += kl;
    p[n++] = 0x12; /* raw */
    n += put_varint(p + n, raw_len);
    assert(n <= PB_HEAD_MAX + al + kl);
    return n;
}

char *
pb_envelope(const char *api_version, const char *kind, const void *obj, size_t len, size_t *out_len)
{
    char *buf =
        xmalloc(PB_HEAD_MAX + strlen(api_version) + strlen(kind) + len + PB_ENVELOPE_TAIL_LEN);
    size_t n = pb_envelope_head(buf, api_version, kind, len);
    if (len)
        memcpy(buf + n, obj, len);
    memcpy(buf + n + len, PB_ENVELOPE_TAIL, PB_ENVELOPE_TAIL_LEN);
    *out_len = n + len + PB_ENVELOPE_TAIL_LEN;
    return buf;
}

uint64_t
pb_item_size(size_t len)
{
    return ld_size(len);
}

size_t
pb_item_prefix(char *buf, size_t len)
{
    buf[0] = 0x12;
    return 1 + put_varint((uint8_t *)buf + 1, len);
}

char *
pb_list_head(const char *api_version, const char *list_kind, uint64_t rv, const char *cont,
             int64_t remaining, uint64_t items_bytes, size_t *out_len)
{
    char rvs[24];
    size_t rl = (size_t)snprintf(rvs, sizeof(rvs), "%" PRIu64, rv);
    size_t cl = cont ? strlen(cont) : 0;
    /* ListMeta{1 selfLink "", 2 resourceVersion, 3 continue, [4 remainingItemCount]} */
    uint64_t lm = ld_size(0) + ld_size(rl) + ld_size(cl) +
                  (remaining >= 0 ? 1 + pb_varint_len((uint64_t)remaining) : 0);
    char *buf = xmalloc(PB_HEAD_MAX + strlen(api_version) + strlen(list_kind) + ld_size(lm));
    size_t n = pb_envelope_head(buf, api_version, list_kind, ld_size(lm) + items_bytes);
    uint8_t *p = (uint8_t *)buf;
    p[n++] = 0x0a;
    n += put_varint(p + n, lm);
    p[n++] = 0x0a;
    p[n++] = 0x00;
    p[n++] = 0x12;
    n += put_varint(p + n, rl);
    memcpy(p + n, rvs, rl);
    n += rl;
    p[n++] = 0x1a;
    n += put_varint(p + n, cl);
    if (cl)
        memcpy(p + n, cont, cl);
    n += cl;
    if (remaining >= 0) {
        p[n++] = 0x20;
        n += put_varint(p + n, (uint64_t)remaining);
    }
    *out_len = n;
    return buf;
}

void
pb_frame_event(struct gostr_buf *b, const char *type, const char *api_version, const char *kind,
               const void *obj, size_t len)
{
    size_t tl = strlen(type);
    char *head = xmalloc(PB_HEAD_MAX + strlen(api_version) + strlen(kind));
    size_t hl = pb_envelope_head(head, api_version, kind, len);
    uint64_t env = hl + len + PB_ENVELOPE_TAIL_LEN;
    uint64_t rawext = ld_size(env); /* RawExtension{1 raw} */
    uint64_t we = ld_size(tl) + ld_size(rawext);
    assert(we <= UINT32_MAX);
    char pre[4] = {(char)(we >> 24), (char)(we >> 16), (char)(we >> 8), (char)we};
    gostr_addn(b, pre, 4);
    add_ld(b, 0x0a, type, tl);
    gostr_addc(b, 0x12);
    add_varint(b, rawext);
    gostr_addc(b, 0x0a);
    add_varint(b, env);
    gostr_addn(b, head, hl);
    add_bytes(b, obj, len);
    gostr_addn(b, PB_ENVELOPE_TAIL, PB_ENVELOPE_TAIL_LEN);
    free(head);
}

void
pb_bookmark_obj(struct gostr_buf *b, uint64_t rv, bool initial_end)
{
    static const char key[] = INITIAL_EVENTS_END;
    char rvs[24];
    size_t rl = (size_t)snprintf(rvs, sizeof(rvs), "%" PRIu64, rv);
    uint64_t entry = ld_size(sizeof(key) - 1) + ld_size(4);
    uint64_t md = ld_size(rl) + (initial_end ? ld_size(entry) : 0);
    gostr_addc(b, 0x0a); /* metadata */
    add_varint(b, md);
    add_ld(b, 0x32, rvs, rl); /* resourceVersion */
    if (initial_end) {
        gostr_addc(b, 0x62); /* annotations */
        add_varint(b, entry);
        add_ld(b, 0x0a, key, sizeof(key) - 1);
        add_ld(b, 0x12, "true", 4);
    }
}

static size_t
slen(const char *s)
{
    return s ? strlen(s) : 0;
}

void
pb_status(struct gostr_buf *b, int code, const char *reason, const char *message,
          const struct status_details *d)
{
    struct gostr_buf st = {0};
    /* metadata: ListMeta{selfLink "", resourceVersion "", continue ""} */
    gostr_addn(&st, "\x0a\x06\x0a\x00\x12\x00\x1a\x00", 8);
    add_ld(&st, 0x12, "Failure", 7);
    add_ld(&st, 0x1a, message, slen(message));
    add_ld(&st, 0x22, reason, slen(reason));
    if (d) {
        struct gostr_buf db = {0};
        add_ld(&db, 0x0a, d->name, slen(d->name));
        add_ld(&db, 0x12, d->group, slen(d->group));
        add_ld(&db, 0x1a, d->kind, slen(d->kind));
        for (size_t i = 0; i < d->ncauses; i++) {
            const struct status_cause *c = &d->causes[i];
            struct gostr_buf cb = {0};
            add_ld(&cb, 0x0a, c->reason, slen(c->reason)); /* the cause's "type" */
            add_ld(&cb, 0x12, c->message, slen(c->message));
            add_ld(&cb, 0x1a, c->field, slen(c->field));
            add_ld(&db, 0x22, cb.p, cb.len);
            free(cb.p);
        }
        gostr_addc(&db, 0x28); /* retryAfterSeconds: int32, always written */
        add_varint(&db, (uint64_t)(int64_t)d->retry_after_seconds);
        add_ld(&db, 0x32, NULL, 0); /* uid "" */
        add_ld(&st, 0x2a, db.p, db.len);
        free(db.p);
    }
    gostr_addc(&st, 0x30); /* code: int32, sign-extended as Go's uint64(int32) */
    add_varint(&st, (uint64_t)(int64_t)(int32_t)code);

    char head[PB_HEAD_MAX + 8];
    size_t hl = pb_envelope_head(head, "v1", "Status", st.len);
    gostr_addn(b, head, hl);
    gostr_addn(b, st.p, st.len);
    gostr_addn(b, PB_ENVELOPE_TAIL, PB_ENVELOPE_TAIL_LEN);
    free(st.p);
}
