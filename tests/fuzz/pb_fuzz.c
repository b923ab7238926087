/*
 * pb_fuzz.c — libFuzzer target for cache/pb.c: upstream protobuf bytes
 * through pb_meta_parse (pods' fields), pb_list_parse, pb_envelope_parse,
 * pb_wevent_parse, the frame splitter and pb_with_rv.
 *
 * Every input goes through all of them as an exact-length copy (ASan sees
 * any read past the end) and is checked against pb.h's contracts:
 *  - spans lie inside the input; decoded strings are NUL-terminated, labels
 *    sorted and unique, and read back the same from the index bytes
 *    (idx_encode, idx_view_load); failures leave their output zeroed;
 *  - pb_with_rv: a copy exists exactly when the object parses, and the copy
 *    parses to the new rv (rvs chosen across varint-length boundaries) with
 *    the same name, namespace, uid, labels and field values;
 *  - round trips through kwc's encoders: an object that parses, wrapped by
 *    pb_envelope, pb_frame_event and pb_list_head, comes back as the same
 *    span from pb_envelope_parse, pb_wevent_parse and pb_list_parse;
 *  - the splitter gives the same frames, error and pending count whether the
 *    input arrives whole or in pieces (sizes taken from the input).
 */
#include "kwc/pb.h"

#include "kwc/base.h"
#include "kwc/gostr.h"
#include "kwc/index.h"

#include "fuzz_labels.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_FRAME 512
#define MAX_LABELS 64

static const struct pb_field *pods;
static size_t npods;
static char err[256];

#define check(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "pb_fuzz.c:%d: check failed: %s\n", __LINE__, #cond);                  \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static bool
err_ok(void)
{
    return memchr(err, '\0', sizeof(err)) != NULL && err[0] != '\0';
}

static bool
same_meta(const struct obj_meta *a, const struct obj_meta *b)
{
    if (strcmp(a->name, b->name) || strcmp(a->namespace_, b->namespace_) ||
        strcmp(a->uid, b->uid) || a->deleting != b->deleting || a->n_labels != b->n_labels ||
        a->n_fields != b->n_fields)
        return false;
    for (size_t i = 0; i < a->n_labels; i++)
        if (strcmp(a->labels[i].key, b->labels[i].key) ||
            strcmp(a->labels[i].value, b->labels[i].value))
            return false;
    for (size_t i = 0; i < a->n_fields; i++)
        if (strcmp(a->fields[i], b->fields[i]))
            return false;
    return true;
}

static void
meta_invariants(const struct obj_meta *m, size_t nf, size_t len)
{
    check(m->name && *m->name && m->namespace_ && m->uid && m->rv > 0);
    check(!m->kind && !m->api_version && m->n_fields == nf);
    check(strlen(m->name) < len && strlen(m->namespace_) < len && strlen(m->uid) < len);
    for (size_t i = 1; i < m->n_labels; i++)
        check(strcmp(m->labels[i - 1].key, m->labels[i].key) < 0);
    check(fuzz_index_labels_ok(m));
    for (size_t i = 0; i < m->n_fields; i++)
        check(m->fields[i] && strlen(m->fields[i]) <= len + 8);
}

/* The object's round trips through kwc's encoders. */
static void
round_trips(const char *obj, size_t len, uint64_t rv)
{
    struct pb_envelope e;
    struct wevent ev;
    struct pb_list l;
    size_t n;

    char *env = pb_envelope("v1", "Pod", obj, len, &n);
    check(pb_envelope_parse(env, n, &e, err, sizeof(err)) == 0);
    check(e.raw_len == len && memcmp(env + e.raw_off, obj, len) == 0);
    check(e.kind_len == 3 && memcmp(e.kind, "Pod", 3) == 0);
    free(env);

    struct gostr_buf b = {0};
    pb_frame_event(&b, "MODIFIED", "v1", "Pod", obj, len);
    check(b.len >= 4 && ((size_t)(unsigned char)b.p[0] << 24 | (size_t)(unsigned char)b.p[1] << 16 |
                         (size_t)(unsigned char)b.p[2] << 8 | (unsigned char)b.p[3]) == b.len - 4);
    check(pb_wevent_parse(b.p + 4, b.len - 4, &ev, NULL, err, sizeof(err)) == 0);
    check(ev.type == WEVENT_MODIFIED && ev.obj_len == len &&
          memcmp(b.p + 4 + ev.obj_off, obj, len) == 0);
    wevent_fini(&ev);
    free(b.p);

    char pre[16];
    b = (struct gostr_buf){0};
    char *head =
        pb_list_head("v1", "PodList", rv, "c", (int64_t)(rv % 3) - 1, 2 * pb_item_size(len), &n);
    gostr_addn(&b, head, n);
    free(head);
    for (int i = 0; i < 2; i++) {
        gostr_addn(&b, pre, pb_item_prefix(pre, len));
        gostr_addn(&b, obj, len);
    }
    gostr_addn(&b, PB_ENVELOPE_TAIL, PB_ENVELOPE_TAIL_LEN);
    check(pb_list_parse(b.p, b.len, &l, err, sizeof(err)) == 0);
    check(l.rv == rv && strcmp(l.continue_, "c") == 0 && l.n_items == 2);
    check(l.has_remaining == (rv % 3 != 0) &&
          (!l.has_remaining || l.remaining == (int64_t)(rv % 3) - 1));
    for (size_t i = 0; i < 2; i++)
        check(l.len[i] == len && memcmp(b.p + l.off[i], obj, len) == 0);
    pb_list_fini(&l);
    free(b.p);
}

static void
check_meta(const char *obj, size_t len, uint64_t seed)
{
    static const uint64_t rvs[] = {1, 9, 10, 127, 128, 16383, 16384, UINT64_MAX};
    struct obj_meta m, any, with;
    int rc = pb_meta_parse(obj, len, pods, npods, 0, MAX_LABELS, &m, err, sizeof(err));
    check(rc == 0 || rc == KWC_EPARSE || rc == KWC_ETOOBIG);
    if (rc == 0) {
        meta_invariants(&m, npods, len);
        check(m.n_labels <= MAX_LABELS);
    } else {
        check(err_ok() && m.arena_ == NULL && m.name == NULL);
    }
    /* pb_with_rv works exactly on what pb_meta_parse accepts at any size */
    int arc = pb_meta_parse(obj, len, NULL, 0, SIZE_MAX, SIZE_MAX, &any, err, sizeof(err));
    check(arc == 0 || arc == KWC_EPARSE);
    check(rc != 0 || arc == 0);
    uint64_t rv = rvs[seed % KWC_ARRAY_LEN(rvs)];
    char *out = (char *)1;
    size_t ol = 0;
    int wrc = pb_with_rv(obj, len, rv, &out, &ol);
    check(wrc == 0 || wrc == KWC_EPARSE);
    check((wrc == 0) == (arc == 0));
    if (wrc == 0) {
        check(pb_meta_parse(out, ol, NULL, 0, SIZE_MAX, SIZE_MAX, &with, err, sizeof(err)) == 0);
        check(with.rv == rv && same_meta(&any, &with));
        obj_meta_fini(&with);
        if (rc == 0) {
            check(pb_meta_parse(out, ol, pods, npods, 0, MAX_LABELS, &with, err, sizeof(err)) == 0);
            check(with.rv == rv && same_meta(&m, &with));
            obj_meta_fini(&with);
        }
        free(out);
    } else {
        check(out == NULL && ol == 0);
    }
    if (rc == 0)
        round_trips(obj, len, m.rv);
    obj_meta_fini(&any);
    obj_meta_fini(&m);
}

static void
check_envelope(const char *buf, size_t size, uint64_t seed)
{
    struct pb_envelope e;
    int rc = pb_envelope_parse(buf, size, &e, err, sizeof(err));
    check(rc == 0 || rc == KWC_EPARSE);
    if (rc != 0) {
        check(err_ok() && e.kind == NULL && e.raw_len == 0);
        return;
    }
    check(size >= PB_MAGIC_LEN && memcmp(buf, PB_MAGIC, PB_MAGIC_LEN) == 0);
    check(e.kind >= buf && e.kind + e.kind_len <= buf + size && !memchr(e.kind, 0, e.kind_len));
    check(e.api_version >= buf && e.api_version + e.api_version_len <= buf + size &&
          !memchr(e.api_version, 0, e.api_version_len));
    check(e.raw_off >= PB_MAGIC_LEN && e.raw_off <= size && e.raw_len <= size - e.raw_off);
    check_meta(buf + e.raw_off, e.raw_len, seed);
}

static void
check_list(const char *buf, size_t size, uint64_t seed)
{
    struct pb_list l;
    int rc = pb_list_parse(buf, size, &l, err, sizeof(err));
    check(rc == 0 || rc == KWC_EPARSE || rc == KWC_ETOOBIG);
    if (rc != 0) {
        check(err_ok() && l.off == NULL && l.continue_ == NULL && l.n_items == 0);
        pb_list_fini(&l);
        return;
    }
    check(l.rv > 0 && l.continue_ && strlen(l.kind) < sizeof(l.kind) &&
          strlen(l.api_version) < sizeof(l.api_version));
    size_t last = 0;
    for (size_t i = 0; i < l.n_items; i++) {
        check(l.off[i] >= last && l.off[i] <= size && l.len[i] <= size - l.off[i]);
        last = l.off[i] + l.len[i];
        check_meta(buf + l.off[i], l.len[i], seed + i);
    }
    pb_list_fini(&l);
}

static void
check_wevent(const char *frame, size_t len, uint64_t seed)
{
    struct wevent ev;
    struct pb_envelope e;
    int rc = pb_wevent_parse(frame, len, &ev, &e, err, sizeof(err));
    check(rc == 0 || rc == KWC_EPARSE || rc == KWC_ETOOBIG);
    if (rc != 0) {
        check(err_ok() && ev.arena_ == NULL && ev.obj_len == 0 && e.kind == NULL);
        wevent_fini(&ev);
        return;
    }
    check(ev.obj_off <= len && ev.obj_len <= len - ev.obj_off);
    check(e.kind >= frame && e.kind + e.kind_len <= frame + len);
    switch (ev.type) {
    case WEVENT_ERROR:
        check(ev.reason && ev.message && ev.rv == 0);
        break;
    case WEVENT_BOOKMARK:
        check(ev.rv > 0 && !ev.reason);
        break;
    default:
        check(!ev.reason && ev.rv == 0 && !ev.initial_events_end);
        check_meta(frame + ev.obj_off, ev.obj_len, seed);
    }
    wevent_fini(&ev);
}

struct split_result {
    uint64_t hash;
    size_t frames, pending;
    int rc;
};

/* Split in pieces whose sizes come from the input bytes, or all at once. */
static void
split(const char *in, size_t size, bool pieces, struct split_result *r)
{
    struct pb_splitter s;
    pb_split_init(&s, MAX_FRAME);
    memset(r, 0, sizeof(*r));
    r->hash = 1469598103934665603u;
    for (size_t at = 0, k = 0; at < size && r->rc == 0; k++) {
        size_t n = pieces ? 1 + (unsigned char)in[k % size] % 13 : size;
        if (n > size - at)
            n = size - at;
        char *chunk = xmalloc(n);
        memcpy(chunk, in + at, n);
        const char *p = chunk, *frame;
        size_t left = n, fl;
        int rc;
        while ((rc = pb_split_next(&s, &p, &left, &frame, &fl)) == 1) {
            check(fl <= MAX_FRAME);
            for (size_t i = 0; i < fl; i++)
                r->hash = (r->hash ^ (unsigned char)frame[i]) * 1099511628211u;
            r->hash = (r->hash ^ 0x100) * 1099511628211u;
            r->frames++;
            if (!pieces) {
                char *copy = xmalloc(fl ? fl : 1);
                if (fl)
                    memcpy(copy, frame, fl);
                check_wevent(copy, fl, r->frames);
                free(copy);
            }
        }
        check(rc == 0 || rc == KWC_ETOOBIG);
        check(rc != 0 || left == 0);
        check(s.cap <= MAX_FRAME + 4);
        r->rc = rc;
        free(chunk);
        at += n;
    }
    r->pending = pb_split_pending(&s);
    pb_split_fini(&s);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!pods)
        pods = pb_fields("", "pods", &npods);
    char *buf = xmalloc(size ? size : 1);
    if (size)
        memcpy(buf, data, size);
    uint64_t seed = size;
    for (size_t i = 0; i < size && i < 8; i++)
        seed = seed * 31 + data[i];

    check_meta(buf, size, seed);
    check_envelope(buf, size, seed);
    check_list(buf, size, seed);
    check_wevent(buf, size, seed);

    struct split_result whole, pieces;
    split(buf, size, false, &whole);
    split(buf, size, true, &pieces);
    check(whole.hash == pieces.hash && whole.frames == pieces.frames && whole.rc == pieces.rc &&
          whole.pending == pieces.pending);
    free(buf);
    return 0;
}
