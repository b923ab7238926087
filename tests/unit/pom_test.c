/*
 * pom_test.c — cache/pom.c against what kube-apiserver writes for
 * PartialObjectMetadata. Expected strings are written by hand from kube's
 * rules: the typed ObjectMeta's field order and omitempty tags, the
 * Unstructured accessors (unstructured.go) for custom resources, Go's
 * encoding/json escapes and metav1.Time's RFC 3339 in UTC. The protobuf
 * form of custom resources (pom_pb_from_json) is checked against
 * pom_vectors.h: bytes written by Google's protobuf runtime for Python from
 * values written by hand (tests/unit/pom_vectors.py regenerates it).
 */
#include "kwc/pom.h"

#include <stdlib.h>
#include <string.h>

#include "pom_vectors.h"
#include "tap.h"

#define HEAD "{\"kind\":\"PartialObjectMetadata\",\"apiVersion\":\"meta.k8s.io/v1\",\"metadata\":"

static void
json_is(const char *item, bool unstructured, const char *want, const char *what)
{
    struct gostr_buf b = {0};
    int rc = pom_json(&b, item, strlen(item), unstructured);
    is_int(rc, 0, what);
    is_str(b.p ? b.p : "", want, what);
    free(gostr_take(&b));
}

static void
json_fails(const char *item, bool unstructured, const char *what)
{
    struct gostr_buf b = {0};
    gostr_add(&b, "x");
    is_int(pom_json(&b, item, strlen(item), unstructured), -1, what);
    is_int(b.len, 1, "nothing appended");
    free(gostr_take(&b));
}

static void
test_builtin(void)
{
    json_is("{\"metadata\":{\"name\":\"a\",\"namespace\":\"ns\",\"uid\":\"u\",\"resourceVersion\":"
            "\"5\",\"creationTimestamp\":null,\"labels\":{\"z\":\"1\",\"a\":\"2\"}},\"spec\":{}}",
            false,
            HEAD "{\"name\":\"a\",\"namespace\":\"ns\",\"uid\":\"u\",\"resourceVersion\":\"5\","
                 "\"creationTimestamp\":null,\"labels\":{\"z\":\"1\",\"a\":\"2\"}}}",
            "built-in: metadata bytes verbatim (even in an order kube would not write)");
    json_is("{\"spec\":{\"x\":\"}\\\"{[\",\"metadata\":[1]},\"metadata\":{\"name\":\"b\"},"
            "\"status\":{}}",
            false, HEAD "{\"name\":\"b\"}}",
            "built-in: nested metadata keys and brackets inside strings are skipped");
    json_is(" {\"kind\":\"Pod\" , \"metadata\" : {\"name\":\"c\"} } ", false,
            HEAD "{\"name\":\"c\"}}", "whitespace between tokens");
    json_fails("[1]", false, "not an object");
    json_fails("{\"metadata\":", false, "truncated");
    json_fails("{\"metadata\":{\"name\":\"x\"", false, "unclosed metadata");
    json_fails("", false, "empty input");
}

static void
test_unstructured(void)
{
    json_is(
        "{\"apiVersion\":\"x/v1\",\"kind\":\"Foo\",\"metadata\":{\"annotations\":{\"b\":\"<&>\","
        "\"a\":null},\"creationTimestamp\":\"2024-02-03T04:05:06Z\",\"finalizers\":[\"f\"],"
        "\"generation\":3,\"labels\":{\"y\":\"2\",\"x\":\"1\"},\"name\":\"n\",\"namespace\":"
        "\"ns\",\"resourceVersion\":\"9\",\"uid\":\"u\",\"zzz\":1},\"spec\":{}}",
        true,
        HEAD
        "{\"name\":\"n\",\"namespace\":\"ns\",\"uid\":\"u\",\"resourceVersion\":\"9\","
        "\"generation\":3,\"creationTimestamp\":\"2024-02-03T04:05:06Z\",\"labels\":{"
        "\"x\":\"1\",\"y\":\"2\"},\"annotations\":{\"a\":\"\",\"b\":\"\\u003c\\u0026\\u003e\"},"
        "\"finalizers\":[\"f\"]}}",
        "custom resource: struct order, maps sorted, null coerced to \"\", HTML escapes, "
        "unknown key dropped");
    json_is("{\"metadata\":{\"name\":\"n\"}}", true,
            HEAD "{\"name\":\"n\",\"creationTimestamp\":null}}", "no creationTimestamp: null");
    json_is(
        "{\"metadata\":{\"name\":\"n\",\"creationTimestamp\":\"2024-02-29T23:30:00.5-01:00\","
        "\"deletionTimestamp\":\"2024-01-01T00:00:00+02:00\",\"deletionGracePeriodSeconds\":0}}",
        true,
        HEAD "{\"name\":\"n\",\"creationTimestamp\":\"2024-03-01T00:30:00Z\","
             "\"deletionTimestamp\":\"2023-12-31T22:00:00Z\",\"deletionGracePeriodSeconds\":0}}",
        "timestamps in UTC without fraction; a zero grace period is written (a pointer)");
    json_is("{\"metadata\":{\"creationTimestamp\":\"2023-02-29T00:00:00Z\",\"deletionTimestamp\":"
            "\"0001-01-01T00:00:00Z\",\"generation\":1.5,\"name\":7,\"labels\":{\"a\":1},"
            "\"finalizers\":[\"a\",2],\"annotations\":{}}}",
            true, HEAD "{\"creationTimestamp\":null}}",
            "wrong types and bad or zero times read as the accessors read them");
    json_is("{\"metadata\":{\"ownerReferences\":[{\"uid\":\"u\",\"kind\":\"K\",\"controller\":true,"
            "\"x\":1,\"name\":5}],\"managedFields\":[{\"time\":\"2024-01-01T00:00:00Z\","
            "\"manager\":\"m\",\"fieldsV1\":{\"f:b\":{},\"f:a\":{\"v\":1.5e-7}},\"operation\":"
            "\"Update\",\"fieldsType\":\"FieldsV1\",\"apiVersion\":\"x/v1\",\"extra\":[]}]}}",
            true,
            HEAD
            "{\"creationTimestamp\":null,\"ownerReferences\":[{\"apiVersion\":\"\",\"kind\":"
            "\"K\",\"name\":\"\",\"uid\":\"u\",\"controller\":true}],\"managedFields\":[{"
            "\"manager\":\"m\",\"operation\":\"Update\",\"apiVersion\":\"x/v1\",\"time\":"
            "\"2024-01-01T00:00:00Z\",\"fieldsType\":\"FieldsV1\",\"fieldsV1\":{\"f:a\":{\"v\":"
            "1.5e-7},\"f:b\":{}}}]}}",
            "ownerReferences and managedFields in their struct order");
    json_is("{\"metadata\":{\"managedFields\":[{\"manager\":\"m\",\"time\":\"yesterday\"}],"
            "\"ownerReferences\":[{},1]}}",
            true, HEAD "{\"creationTimestamp\":null}}",
            "a bad managedFields time or a non-object owner drops the whole slice");
    json_is("{\"metadata\":{\"managedFields\":[{\"fieldsV1\":{\"n\":[100,1e21,0.25,-0.0]}}]}}",
            true,
            HEAD "{\"creationTimestamp\":null,\"managedFields\":[{\"fieldsV1\":{\"n\":[100,1e+21,"
                 "0.25,-0]}}]}}",
            "fieldsV1 numbers as Go writes float64");
    json_is("{\"metadata\":null}", true, HEAD "{\"creationTimestamp\":null}}", "null metadata");
    json_fails("{\"metadata\":{\"a\":1", true, "malformed metadata");
}

static void
pb_is(const char *msg, size_t len, const char *want, size_t wlen, const char *what)
{
    struct gostr_buf b = {0};
    is_int(pom_pb(&b, msg, len), 0, what);
    is_mem(b.p ? b.p : "", b.len, want, wlen, what);
    free(gostr_take(&b));
}

static void
test_pb(void)
{
    /* Pod {1: ObjectMeta{1:"a"}, 2: spec{}, 3: status{}} */
    static const char pod[] = "\x0a\x03\x0a\x01\x61\x12\x00\x1a\x02\x08\x01";
    pb_is(pod, sizeof pod - 1, "\x0a\x03\x0a\x01\x61", 5, "field 1 copied");
    static const char later[] = "\x10\x05\x11\x01\x02\x03\x04\x05\x06\x07\x08\x0a\x00";
    pb_is(later, sizeof later - 1, "\x0a\x00", 2, "other wire types skipped; empty field 1");
    struct gostr_buf b = {0};
    static const char bad[][4] = {"\x0a\x05\x01", "\x12\x00", "\x0b\x00", "\x0a\x00\x0a\x00",
                                  "\x08\x05\x0a\x00"};
    static const size_t bad_len[] = {3, 2, 2, 4, 4};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        is_int(pom_pb(&b, bad[i], bad_len[i]), -1,
               "malformed: overlong, no field 1, a group, field 1 twice, field 1 not a message");
    is_int(b.len, 0, "nothing appended on failure");
    free(gostr_take(&b));
}

static void
test_pb_from_json(void)
{
    for (size_t i = 0; i < sizeof POM_VECTORS / sizeof POM_VECTORS[0]; i++) {
        const struct pom_vector *v = &POM_VECTORS[i];
        /* an exact-length copy: a read past the end is ASan's to see */
        char *in = malloc(v->in_len);
        memcpy(in, v->in, v->in_len);
        struct gostr_buf b = {0};
        gostr_add(&b, "pre");
        is_int(pom_pb_from_json(&b, in, v->in_len), 0, v->name);
        is_mem(b.p + 3, b.len - 3, v->want, v->want_len, v->name);
        /* the JSON form reads the same input */
        struct gostr_buf j = {0};
        is_int(pom_json(&j, in, v->in_len, true), 0, v->name);
        free(gostr_take(&j));
        free(gostr_take(&b));
        free(in);
    }
    /* where the JSON form fails, so does this, appending nothing */
    static const char *const bad[] = {"",
                                      "[1]",
                                      "{\"metadata\":",
                                      "{\"metadata\":{\"a\":1",
                                      "{\"metadata\":{\"labels\":{\"a\\u0000\":\"x\"}}}",
                                      "{\"metadata\":{\"generation\":99999999999999999999}}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct gostr_buf b = {0}, j = {0};
        gostr_add(&b, "x");
        is_int(pom_pb_from_json(&b, bad[i], strlen(bad[i])), -1, bad[i]);
        is_int(b.len, 1, "nothing appended");
        is_int(pom_json(&j, bad[i], strlen(bad[i]), true), -1, "pom_json fails there too");
        free(gostr_take(&b));
        free(gostr_take(&j));
    }
}

int
main(void)
{
    TAP_RUN(test_builtin);
    TAP_RUN(test_unstructured);
    TAP_RUN(test_pb);
    TAP_RUN(test_pb_from_json);
    return tap_done();
}
