/*
 * index_test.c — cache/index.c: encode what obj_meta_parse extracted from a
 * pod, read it back through a view, match selectors on it, and refuse
 * malformed buffers (they come from disk).
 */
#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"
#include "kwc/index.h"
#include "kwc/object.h"
#include "kwc/selector.h"
#include "tap.h"

static const char pod[] =
    "{\"kind\":\"Pod\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"web-1\",\"namespace\":"
    "\"prod\","
    "\"resourceVersion\":\"42\",\"labels\":{\"tier\":\"web\",\"app\":\"shop\"}},"
    "\"spec\":{\"nodeName\":\"node-7\",\"schedulerName\":\"default-scheduler\"},"
    "\"status\":{\"phase\":\"Running\"}}";

static const struct obj_field fields[] = {
    {"spec.nodeName", NULL}, {"status.phase", NULL}, {"spec.restartPolicy", NULL}};
static const char *const field_names[] = {"spec.nodeName", "status.phase", "spec.restartPolicy"};

static bool
matches(const char *ls, const char *fs, struct idx_view *v)
{
    struct sel *s = NULL;
    char *err = NULL;
    if (sel_parse(ls, fs, &s, &err) != 0) {
        free(err);
        return false;
    }
    bool m = sel_matches(s, &v->labels, &v->fields);
    sel_free(s);
    return m;
}

static void
test_round_trip(void)
{
    struct obj_fields_spec spec = {.fields = fields, .n_fields = 3};
    struct obj_meta m;
    is_int(obj_meta_parse(pod, strlen(pod), &spec, &m, NULL, 0), 0, "pod parsed");
    char *buf;
    size_t len;
    is_int(idx_encode(&m, &buf, &len), 0, "encoded");
    struct idx_view v = {0};
    is_int(idx_view_load(&v, buf, len, field_names, 3), 0, "view loaded");
    is_int(v.labels.n, 2, "two labels");
    is_str(v.labels.keys[0], "app", "labels sorted by key");
    is_str(v.labels.values[0], "shop", "label value");
    is_str(v.labels.keys[1], "tier", "second label");
    is_str(v.fields.values[0], "node-7", "spec.nodeName");
    is_str(v.fields.values[1], "Running", "status.phase");
    is_str(v.fields.values[2], "", "absent spec.restartPolicy reads as empty");
    is_str(idx_field(buf, len, 0), "node-7", "idx_field 0 without a view");
    is_str(idx_field(buf, len, 1), "Running", "idx_field 1");
    ok(idx_field(buf, len, 3) == NULL, "idx_field past the end");

    ok(matches("app=shop", NULL, &v), "label selector matches");
    ok(!matches("app=shop,tier=db", NULL, &v), "label selector excludes");
    ok(matches("tier in (web,db),!canary", "spec.nodeName=node-7", &v),
       "labels and fields together");
    ok(!matches(NULL, "spec.nodeName=node-8", &v), "field mismatch");
    ok(matches(NULL, "spec.restartPolicy=", &v), "an absent field equals empty");

    /* An index written before the resource gained a field: the new one reads as "". */
    is_int(idx_view_load(
               &v, buf, len,
               (const char *const[]){"spec.nodeName", "status.phase", "spec.restartPolicy", "type"},
               4),
           0, "more names than encoded fields");
    is_str(v.fields.values[3], "", "unencoded field reads as empty");
    idx_view_fini(&v);
    free(buf);
    obj_meta_fini(&m);
}

static void
test_malformed(void)
{
    struct idx_view v = {0};
    static const char *const one[] = {"f"};
    is_int(idx_view_load(&v, "\x01", 1, one, 1), KWC_EPARSE, "shorter than the header");
    is_int(idx_view_load(&v, "\x01\x00\x00\x00k", 5, one, 0), KWC_EPARSE, "unterminated label key");
    is_int(idx_view_load(&v, "\x01\x00\x00\x00k\0v", 7, one, 0), KWC_EPARSE,
           "unterminated label value");
    is_int(idx_view_load(&v,
                         "\x00\x00\x01\x00"
                         "abc",
                         7, one, 1),
           KWC_EPARSE, "unterminated field");
    is_int(idx_view_load(&v, "\xff\xff\x00\x00", 4, one, 0), KWC_EPARSE,
           "counts beyond the buffer");
    is_int(idx_view_load(&v, "\x01\x00\x01\x00k\0v\0f\0", 10, one, 1), 0, "well-formed");
    is_str(v.fields.values[0], "f", "field read");
    idx_view_fini(&v);
    ok(idx_field("\x00\x00\x02\x00"
                 "a",
                 5, 1) == NULL,
       "idx_field on a truncated buffer");
}

int
main(void)
{
    TAP_RUN(test_round_trip);
    TAP_RUN(test_malformed);
    return tap_done();
}
