/*
 * status_test.c — cache/status.c: metav1.Status bodies.
 *
 * Each body is parsed back with jansson and compared with what kube-apiserver
 * sends for the same failure: the metav1.Status Go struct serialised by
 * encoding/json, so fields appear in struct order (kind, apiVersion, metadata,
 * status, message, reason, details, code), empty optional fields are omitted
 * (omitempty), a StatusCause is {reason, message, field}, and invalid UTF-8 in
 * a string is replaced by U+FFFD rather than dropped. The reason for a bare
 * code follows the constructors in k8s.io/apimachinery/pkg/api/errors.
 */
#include "kwc/status.h"

#include "kwc/base.h"
#include "tap.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static json_t *
parse(const char *s)
{
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    if (!j)
        printf("#   not JSON (%s): %s\n", e.text, s);
    return j;
}

static const char *
str_at(json_t *obj, const char *key)
{
    return json_string_value(json_object_get(obj, key));
}

/* The object's keys in order, comma-joined, into buf. */
static const char *
key_order(json_t *obj, char *buf, size_t len)
{
    const char *k;
    json_t *v;
    size_t at = 0;
    buf[0] = '\0';
    json_object_foreach(obj, k, v)
    {
        int n = snprintf(buf + at, len - at, "%s%s", at ? "," : "", k);
        if (n < 0 || (size_t)n >= len - at)
            break;
        at += (size_t)n;
    }
    return buf;
}

static void
test_minimal(void)
{
    char *s = status_failure_json(404, "NotFound", "pods \"x\" not found", NULL);
    ok(s != NULL, "rendered");
    /* kube-apiserver's bytes start exactly like this. */
    ok(strncmp(s, "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{}", 48) == 0,
       "starts with kind, apiVersion, metadata");
    json_t *j = parse(s);
    ok(j && json_is_object(j), "a JSON object");
    char order[256];
    is_str(key_order(j, order, sizeof order), "kind,apiVersion,metadata,status,message,reason,code",
           "top-level field order");
    is_str(str_at(j, "kind"), "Status", "kind");
    is_str(str_at(j, "apiVersion"), "v1", "apiVersion");
    ok(json_is_object(json_object_get(j, "metadata")) &&
           json_object_size(json_object_get(j, "metadata")) == 0,
       "metadata is {}");
    is_str(str_at(j, "status"), "Failure", "status");
    is_str(str_at(j, "message"), "pods \"x\" not found", "message");
    is_str(str_at(j, "reason"), "NotFound", "reason");
    ok(json_is_integer(json_object_get(j, "code")), "code is an integer");
    is_int(json_integer_value(json_object_get(j, "code")), 404, "code");
    ok(json_object_get(j, "details") == NULL, "no details when none given");
    json_decref(j);
    free(s);
}

static void
test_omitempty(void)
{
    char *s = status_failure_json(500, NULL, NULL, NULL);
    json_t *j = parse(s);
    ok(j != NULL, "parses");
    char order[256];
    is_str(key_order(j, order, sizeof order), "kind,apiVersion,metadata,status,code",
           "no message or reason keys");
    is_int(json_integer_value(json_object_get(j, "code")), 500, "code");
    json_decref(j);
    free(s);

    s = status_failure_json(500, "", "", NULL);
    j = parse(s);
    ok(j && !json_object_get(j, "message") && !json_object_get(j, "reason"),
       "empty message and reason omitted");
    json_decref(j);
    free(s);

    /* Details with nothing in them: kube writes "details":{} only if the pointer is set. */
    struct status_details d = {0};
    s = status_failure_json(409, "Conflict", "m", &d);
    j = parse(s);
    json_t *dj = json_object_get(j, "details");
    ok(dj == NULL || (json_is_object(dj) && json_object_size(dj) == 0), "empty details empty");
    json_decref(j);
    free(s);
}

static void
test_details(void)
{
    const struct status_cause causes[] = {
        {"ResourceVersionTooLarge", "Too large resource version", NULL},
        {"FieldValueInvalid", "Invalid value: \"x\"", "metadata.name"},
        {"UnexpectedServerResponse", NULL, NULL},
    };
    struct status_details d = {
        .name = "web-0",
        .group = "apps",
        .kind = "statefulsets",
        .causes = causes,
        .ncauses = KWC_ARRAY_LEN(causes),
        .retry_after_seconds = 3,
    };
    char *s = status_failure_json(504, "Timeout", "Too large resource version: 10, current: 5", &d);
    json_t *j = parse(s);
    ok(j != NULL, "parses");
    char order[256];
    is_str(key_order(j, order, sizeof order),
           "kind,apiVersion,metadata,status,message,reason,details,code", "field order");
    json_t *dj = json_object_get(j, "details");
    ok(json_is_object(dj), "details is an object");
    is_str(key_order(dj, order, sizeof order), "name,group,kind,causes,retryAfterSeconds",
           "details field order");
    is_str(str_at(dj, "name"), "web-0", "details.name");
    is_str(str_at(dj, "group"), "apps", "details.group");
    is_str(str_at(dj, "kind"), "statefulsets", "details.kind");
    is_int(json_integer_value(json_object_get(dj, "retryAfterSeconds")), 3,
           "details.retryAfterSeconds");
    json_t *cs = json_object_get(dj, "causes");
    ok(json_is_array(cs), "details.causes is an array");
    is_int(json_array_size(cs), 3, "three causes");
    json_t *c0 = json_array_get(cs, 0), *c1 = json_array_get(cs, 1), *c2 = json_array_get(cs, 2);
    is_str(str_at(c0, "reason"), "ResourceVersionTooLarge", "cause 0 reason");
    is_str(str_at(c0, "message"), "Too large resource version", "cause 0 message");
    ok(json_object_get(c0, "field") == NULL, "cause 0 has no field");
    is_str(key_order(c1, order, sizeof order), "reason,message,field", "cause field order");
    is_str(str_at(c1, "message"), "Invalid value: \"x\"", "cause 1 message");
    is_str(str_at(c1, "field"), "metadata.name", "cause 1 field");
    is_str(key_order(c2, order, sizeof order), "reason", "cause 2: reason only");
    is_int(json_integer_value(json_object_get(j, "code")), 504, "code");
    json_decref(j);
    free(s);

    /* Only the fields that were given. */
    struct status_details d2 = {.name = "x", .retry_after_seconds = 0};
    s = status_failure_json(404, "NotFound", "m", &d2);
    j = parse(s);
    dj = json_object_get(j, "details");
    is_str(key_order(dj, order, sizeof order), "name", "details: name only");
    json_decref(j);
    free(s);

    struct status_details d3 = {.retry_after_seconds = 1};
    s = status_failure_json(429, "TooManyRequests", "slow down", &d3);
    j = parse(s);
    is_int(json_integer_value(json_object_get(json_object_get(j, "details"), "retryAfterSeconds")),
           1, "retryAfterSeconds alone");
    json_decref(j);
    free(s);
}

static void
test_strings(void)
{
    /* Quotes, backslashes, control characters and UTF-8 survive the round trip. */
    const char *msg = "a \"q\" \\ back\nslash\ttab \x01 caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x99\x82";
    char *s = status_failure_json(400, "BadRequest", msg, NULL);
    json_t *j = parse(s);
    is_str(str_at(j, "message"), msg, "message round-trips");
    json_decref(j);
    free(s);

    /* Go's encoding/json replaces each invalid byte with U+FFFD; the message
     * is still there (it may quote a client's bytes, e.g. a name from the URL). */
    s = status_failure_json(404, "NotFound", "pods \"\xff\" not found", NULL);
    j = parse(s);
    ok(j != NULL, "invalid UTF-8: still JSON");
    is_str(str_at(j, "message"), "pods \"\xef\xbf\xbd\" not found",
           "invalid UTF-8 in message replaced by U+FFFD");
    json_decref(j);
    free(s);

    struct status_details d = {.name = "a\xc3(b", .kind = "pods"};
    s = status_failure_json(404, "NotFound", "m", &d);
    j = parse(s);
    is_str(str_at(json_object_get(j, "details"), "name"), "a\xef\xbf\xbd(b",
           "invalid UTF-8 in details.name replaced by U+FFFD");
    json_decref(j);
    free(s);
}

static void
test_reason_for_code(void)
{
    /* metav1.StatusReason values kube pairs with each code: NewGenericServerResponse
     * in k8s.io/apimachinery/pkg/api/errors, plus NewResourceExpired (410, the
     * watch cache's "too old resource version"), NewRequestEntityTooLargeError
     * (413) and NewInternalError (500). */
    static const struct {
        int code;
        const char *reason;
    } v[] = {
        {400, "BadRequest"},
        {401, "Unauthorized"},
        {403, "Forbidden"},
        {404, "NotFound"},
        {405, "MethodNotAllowed"},
        {406, "NotAcceptable"},
        {409, "Conflict"},
        {410, "Expired"},
        {413, "RequestEntityTooLarge"},
        {415, "UnsupportedMediaType"},
        {422, "Invalid"},
        {429, "TooManyRequests"},
        {500, "InternalError"},
        {503, "ServiceUnavailable"},
        {504, "Timeout"},
    };
    char what[64];
    for (size_t i = 0; i < KWC_ARRAY_LEN(v); i++) {
        snprintf(what, sizeof what, "%d -> %s", v[i].code, v[i].reason);
        is_str(status_reason_for_code(v[i].code), v[i].reason, what);
    }
    const char *r = status_reason_for_code(200);
    ok(r == NULL || *r == '\0', "200 has no failure reason");
    r = status_reason_for_code(418);
    ok(r == NULL || *r == '\0', "418 has no reason");

    /* status_failure_json with the paired reason carries both. */
    char *s = status_failure_json(503, status_reason_for_code(503), "cache not ready", NULL);
    json_t *j = parse(s);
    is_str(str_at(j, "reason"), "ServiceUnavailable", "reason from code");
    is_int(json_integer_value(json_object_get(j, "code")), 503, "code 503");
    json_decref(j);
    free(s);
}

int
main(void)
{
    TAP_RUN(test_minimal);
    TAP_RUN(test_omitempty);
    TAP_RUN(test_details);
    TAP_RUN(test_strings);
    TAP_RUN(test_reason_for_code);
    return tap_done();
}
