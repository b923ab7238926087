/*
 * pompb_fuzz.c — libFuzzer target for pom_pb_from_json (cache/pom.c): a
 * stored JSON custom resource through the protobuf PartialObjectMetadata
 * encoder, checked against the JSON form of the same input (pom_json,
 * unstructured), which the unit tests pin to kube's output by hand.
 *
 * Oracles:
 *  - pom_pb_from_json succeeds exactly where pom_json does, and appends
 *    nothing when it fails;
 *  - its bytes are one message {1: ObjectMeta} in gogo's shape, read back by
 *    the small bounded decoder below: fields in ascending number, each
 *    by-value field exactly once (ObjectMeta 1-8, OwnerReference 1/3/4/5,
 *    ManagedFieldsEntry 1/2/3/6/8), pointers at most once, repeated fields
 *    contiguous, map entries {1 key, 2 value} in strictly ascending key
 *    order, a Time empty or {1 seconds, 2 nanos} with nanos 0 (kube's
 *    ProtoTime writes no fraction),
 *    wire types as declared;
 *  - the decoded ObjectMeta, written as the JSON form writes it (omitempty
 *    strings and ints, seconds in RFC 3339 UTC via gmtime, a zero
 *    creationTimestamp null, fieldsV1's raw bytes parsed as JSON), equals
 *    the "metadata" of pom_json's answer (jansson's json_equal). Go writes
 *    a float64 below 1e21 without exponent, which jansson cannot read back
 *    as an integer when it passes int64: then both sides read every number
 *    as a double (as_real).
 */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kwc/base.h"
#include "kwc/pom.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t as_real; /* JSON_DECODE_INT_AS_REAL, or 0 */

static json_t *
int_of(uint64_t v)
{
    return as_real ? json_real((double)(int64_t)v) : json_integer((json_int_t)v);
}

static void
check(bool cond)
{
    if (!cond)
        abort();
}

/* ---- a bounded protobuf reader ---- */

struct rd {
    const uint8_t *p;
    size_t n, i;
};

static uint64_t
varint(struct rd *r)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        check(r->i < r->n);
        uint8_t c = r->p[r->i++];
        v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80))
            return v;
    }
    check(false);
    return 0;
}

/* The next field: its number; *wt its wire type; for length-delimited
 * fields the span in *sub. 0 at the end. */
static unsigned
next(struct rd *r, unsigned *wt, struct rd *sub, uint64_t *val)
{
    if (r->i == r->n)
        return 0;
    uint64_t tag = varint(r);
    unsigned num = (unsigned)(tag >> 3);
    *wt = (unsigned)(tag & 7);
    check(num > 0 && (*wt == 0 || *wt == 2));
    if (*wt == 0) {
        *val = varint(r);
    } else {
        uint64_t len = varint(r);
        check(len <= r->n - r->i);
        *sub = (struct rd){r->p + r->i, (size_t)len, 0};
        r->i += (size_t)len;
    }
    return num;
}

/* Fields come in ascending order; a repeated one may repeat at once. */
struct order {
    unsigned last;
    unsigned seen[32];
};

static void
in_order(struct order *o, unsigned num, bool repeated)
{
    check(num < 32);
    check(num > o->last || (num == o->last && repeated));
    o->last = num;
    o->seen[num]++;
}

static json_t *
str_of(const struct rd *s)
{
    return json_stringn((const char *)s->p, s->n);
}

/* Unix seconds as metav1.Time's MarshalJSON writes them (RFC 3339, UTC). */
static json_t *
rfc3339(int64_t sec)
{
    time_t t = (time_t)sec;
    struct tm tm;
    check(gmtime_r(&t, &tm) != NULL);
    long year = (long)tm.tm_year + 1900;
    char buf[64];
    snprintf(buf, sizeof buf, "%s%04ld-%02d-%02dT%02d:%02d:%02dZ", year < 0 ? "-" : "",
             year < 0 ? -year : year, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
    return json_string(buf);
}

/* A Time message: null for the empty (zero) one, else its RFC 3339. */
static json_t *
time_of(struct rd r)
{
    if (r.n == 0)
        return json_null();
    struct order o = {0};
    unsigned wt;
    struct rd sub;
    uint64_t v = 0, sec = 0, nanos = 0;
    for (unsigned num; (num = next(&r, &wt, &sub, &v));) {
        check(wt == 0 && (num == 1 || num == 2));
        in_order(&o, num, false);
        if (num == 1)
            sec = v;
        else
            nanos = v;
    }
    check(o.seen[1] == 1 && o.seen[2] == 1 && nanos == 0);
    return rfc3339((int64_t)sec);
}

/* One map entry {1 key, 2 value}, added to m; keys strictly ascending. */
static void
map_entry(json_t *m, struct rd r, struct rd *prev)
{
    struct order o = {0};
    unsigned wt;
    struct rd sub, key = {0}, val = {0};
    uint64_t v;
    for (unsigned num; (num = next(&r, &wt, &sub, &v));) {
        check(wt == 2 && (num == 1 || num == 2));
        in_order(&o, num, false);
        if (num == 1)
            key = sub;
        else
            val = sub;
    }
    check(o.seen[1] == 1 && o.seen[2] == 1);
    if (prev->p) {
        size_t n = prev->n < key.n ? prev->n : key.n;
        int c = memcmp(prev->p, key.p, n);
        check(c < 0 || (c == 0 && prev->n < key.n));
    }
    *prev = key;
    char *k = xstrndup((const char *)key.p, key.n);
    check(strlen(k) == key.n); /* jansson's keys hold no NUL */
    json_object_set_new(m, k, str_of(&val));
    free(k);
}

/* A string field of the JSON form with omitempty. */
static void
set_nonempty(json_t *o, const char *k, const struct rd *s)
{
    if (s->n)
        json_object_set_new(o, k, str_of(s));
}

static json_t *
owner_of(struct rd r)
{
    static const char *const names[8] = {NULL,  "kind",       "apiVersion", "name",
                                         "uid", "apiVersion", "controller", "blockOwnerDeletion"};
    json_t *o = json_object();
    struct order ord = {0};
    unsigned wt;
    struct rd sub;
    uint64_t v;
    for (unsigned num; (num = next(&r, &wt, &sub, &v));) {
        check(num == 1 || (num >= 3 && num <= 7));
        in_order(&ord, num, false);
        if (num <= 5) {
            check(wt == 2);
            json_object_set_new(o, names[num], str_of(&sub));
        } else {
            check(wt == 0 && v <= 1);
            json_object_set_new(o, names[num], json_boolean(v));
        }
    }
    check(ord.seen[1] == 1 && ord.seen[3] == 1 && ord.seen[4] == 1 && ord.seen[5] == 1);
    return o;
}

static json_t *
managed_of(struct rd r)
{
    static const char *const names[9] = {NULL, "manager",    "operation", "apiVersion", "time",
                                         NULL, "fieldsType", "fieldsV1",  "subresource"};
    json_t *o = json_object();
    struct order ord = {0};
    unsigned wt;
    struct rd sub;
    uint64_t v;
    for (unsigned num; (num = next(&r, &wt, &sub, &v));) {
        check(wt == 2 && num >= 1 && num <= 8 && num != 5);
        in_order(&ord, num, false);
        if (num == 4) {
            json_object_set_new(o, "time", time_of(sub));
        } else if (num == 7) {
            /* FieldsV1 {1 Raw}: the value json.Marshal wrote */
            struct order fo = {0};
            struct rd raw = {0}, rs;
            unsigned fwt;
            for (unsigned fnum; (fnum = next(&sub, &fwt, &rs, &v));) {
                check(fnum == 1 && fwt == 2);
                in_order(&fo, fnum, false);
                raw = rs;
            }
            check(fo.seen[1] == 1);
            json_error_t e;
            json_t *fv = json_loadb((const char *)raw.p, raw.n,
                                    JSON_DECODE_ANY | JSON_ALLOW_NUL | as_real, &e);
            check(fv != NULL);
            json_object_set_new(o, "fieldsV1", fv);
        } else {
            set_nonempty(o, names[num], &sub);
        }
    }
    check(ord.seen[1] == 1 && ord.seen[2] == 1 && ord.seen[3] == 1 && ord.seen[6] == 1 &&
          ord.seen[8] == 1);
    return o;
}

/* The ObjectMeta message, in the JSON form's shape. */
static json_t *
object_meta_of(struct rd r)
{
    static const char *const strs[7] = {NULL,       "name", "generateName",   "namespace",
                                        "selfLink", "uid",  "resourceVersion"};
    json_t *md = json_object();
    json_t *labels = json_object(), *annotations = json_object();
    json_t *owners = json_array(), *finalizers = json_array(), *managed = json_array();
    struct rd prev_label = {0}, prev_annotation = {0};
    struct order ord = {0};
    unsigned wt;
    struct rd sub;
    uint64_t v;
    for (unsigned num; (num = next(&r, &wt, &sub, &v));) {
        bool repeated = num == 11 || num == 12 || num == 13 || num == 14 || num == 17;
        in_order(&ord, num, repeated);
        if (num >= 1 && num <= 6) {
            check(wt == 2);
            set_nonempty(md, strs[num], &sub);
        } else if (num == 7 || num == 10) {
            check(wt == 0);
            if (num == 10 || v != 0)
                json_object_set_new(md, num == 7 ? "generation" : "deletionGracePeriodSeconds",
                                    int_of(v));
        } else if (num == 8 || num == 9) {
            check(wt == 2);
            json_t *t = time_of(sub);
            check(num == 8 || !json_is_null(t)); /* a zero deletionTimestamp is unset */
            json_object_set_new(md, num == 8 ? "creationTimestamp" : "deletionTimestamp", t);
        } else if (num == 11 || num == 12) {
            check(wt == 2);
            map_entry(num == 11 ? labels : annotations, sub,
                      num == 11 ? &prev_label : &prev_annotation);
        } else if (num == 13) {
            check(wt == 2);
            json_array_append_new(owners, owner_of(sub));
        } else if (num == 14) {
            check(wt == 2);
            json_array_append_new(finalizers, str_of(&sub));
        } else {
            check(num == 17 && wt == 2);
            json_array_append_new(managed, managed_of(sub));
        }
    }
    for (unsigned i = 1; i <= 8; i++)
        check(ord.seen[i] == 1);
    check(ord.seen[9] <= 1 && ord.seen[10] <= 1);
    struct {
        const char *k;
        json_t *v;
        size_t n;
    } colls[] = {{"labels", labels, json_object_size(labels)},
                 {"annotations", annotations, json_object_size(annotations)},
                 {"ownerReferences", owners, json_array_size(owners)},
                 {"finalizers", finalizers, json_array_size(finalizers)},
                 {"managedFields", managed, json_array_size(managed)}};
    for (size_t i = 0; i < sizeof colls / sizeof colls[0]; i++) {
        if (colls[i].n)
            json_object_set_new(md, colls[i].k, colls[i].v);
        else
            json_decref(colls[i].v);
    }
    return md;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *in = xmalloc(size ? size : 1);
    memcpy(in, data, size);

    struct gostr_buf j = {0}, b = {0};
    gostr_add(&b, "~");
    int rj = pom_json(&j, in, size, true);
    int rb = pom_pb_from_json(&b, in, size);
    check(rb == rj);
    if (rb != 0) {
        check(b.len == 1);
    } else {
        json_error_t e;
        as_real = 0;
        json_t *ans = json_loadb(j.p, j.len, JSON_ALLOW_NUL, &e);
        if (!ans) {
            as_real = JSON_DECODE_INT_AS_REAL;
            ans = json_loadb(j.p, j.len, JSON_ALLOW_NUL | as_real, &e);
        }
        check(json_is_object(ans));
        struct rd top = {(const uint8_t *)b.p + 1, b.len - 1, 0}, sub;
        unsigned wt;
        uint64_t v;
        check(next(&top, &wt, &sub, &v) == 1 && wt == 2);
        check(top.i == top.n); /* {1: ObjectMeta} and nothing else */
        json_t *got = object_meta_of(sub);
        json_t *want = json_object_get(ans, "metadata");
        check(json_is_object(want));
        if (!json_equal(got, want)) {
            char *g = json_dumps(got, JSON_SORT_KEYS | JSON_ENCODE_ANY);
            fprintf(stderr, "protobuf read back: %s\njson form:          %.*s\n", g, (int)j.len,
                    j.p);
            free(g);
            check(false);
        }
        json_decref(got);
        json_decref(ans);
    }
    free(gostr_take(&j));
    free(gostr_take(&b));
    free(in);
    return 0;
}
