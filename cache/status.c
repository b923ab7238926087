/*
 * status.c — metav1.Status encoder (jansson). Field order follows
 * kube-apiserver's JSON: kind, apiVersion, metadata, status, message, reason,
 * details, code.
 */
#include "kwc/status.h"

#include <jansson.h>
#include <stdlib.h>

#include "kwc/base.h"

const char *
status_reason_for_code(int code)
{
    switch (code) {
    case 400:
        return "BadRequest";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "NotFound";
    case 405:
        return "MethodNotAllowed";
    case 406:
        return "NotAcceptable";
    case 409:
        return "Conflict";
    case 410:
        return "Expired";
    case 413:
        return "RequestEntityTooLarge";
    case 415:
        return "UnsupportedMediaType";
    case 422:
        return "Invalid";
    case 429:
        return "TooManyRequests";
    case 500:
        return "InternalError";
    case 503:
        return "ServiceUnavailable";
    case 504:
        return "Timeout";
    default:
        return "";
    }
}

char *
status_failure_json(int code, const char *reason, const char *message,
                    const struct status_details *d)
{
    json_t *st = json_object();
    json_object_set_new(st, "kind", json_string("Status"));
    json_object_set_new(st, "apiVersion", json_string("v1"));
    json_object_set_new(st, "metadata", json_object());
    json_object_set_new(st, "status", json_string("Failure"));
    if (message && *message)
        json_object_set_new(st, "message", json_string(message));
    if (reason && *reason)
        json_object_set_new(st, "reason", json_string(reason));
    if (d) {
        json_t *dj = json_object();
        if (d->name)
            json_object_set_new(dj, "name", json_string(d->name));
        if (d->group)
            json_object_set_new(dj, "group", json_string(d->group));
        if (d->kind)
            json_object_set_new(dj, "kind", json_string(d->kind));
        if (d->ncauses) {
            json_t *cs = json_array();
            for (size_t i = 0; i < d->ncauses; i++) {
                json_t *c = json_object();
                if (d->causes[i].reason)
                    json_object_set_new(c, "reason", json_string(d->causes[i].reason));
                if (d->causes[i].message)
                    json_object_set_new(c, "message", json_string(d->causes[i].message));
                if (d->causes[i].field)
                    json_object_set_new(c, "field", json_string(d->causes[i].field));
                json_array_append_new(cs, c);
            }
            json_object_set_new(dj, "causes", cs);
        }
        if (d->retry_after_seconds)
            json_object_set_new(dj, "retryAfterSeconds", json_integer(d->retry_after_seconds));
        json_object_set_new(st, "details", dj);
    }
    json_object_set_new(st, "code", json_integer(code));
    char *s = json_dumps(st, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
    json_decref(st);
    if (!s)
        abort(); /* only on OOM: every value above is valid UTF-8 or replaced */
    return s;
}
