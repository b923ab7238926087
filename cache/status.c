/*
 * status.c — metav1.Status encoder (jansson). Field order follows
 * kube-apiserver's JSON: kind, apiVersion, metadata, status, message, reason,
 * details, code.
 */
#include "kwc/status.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"

/* A JSON string of s as Go's encoding/json sees it: each byte that is not
 * valid UTF-8 becomes U+FFFD (new reference). */
static json_t *
go_string(const char *s)
{
    size_t len = strlen(s);
    char *buf = xmalloc(len * 3 + 1);
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t n = kwc_utf8_seq((const unsigned char *)s + i, len - i);
        if (n == 0) {
            memcpy(buf + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        } else {
            memcpy(buf + o, s + i, n);
            o += n;
            i += n;
        }
    }
    json_t *j = json_stringn(buf, o);
    free(buf);
    return j;
}

/* Go's json.Encoder escapes <, >, & and U+2028/U+2029 inside strings (and
 * writes invalid bytes as \ufffd). These bytes occur only inside strings in
 * JSON text, so a pass over the whole document is exact. Returns new. */
static char *
go_escape(const char *in)
{
    size_t len = strlen(in), o = 0;
    char *out = xmalloc(len * 6 + 1);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)in[i];
        const char *rep = NULL;
        size_t skip = 0;
        if (c == '<')
            rep = "\\u003c";
        else if (c == '>')
            rep = "\\u003e";
        else if (c == '&')
            rep = "\\u0026";
        else if (c == 0xE2 && i + 2 < len && (unsigned char)in[i + 1] == 0x80 &&
                 ((unsigned char)in[i + 2] == 0xA8 || (unsigned char)in[i + 2] == 0xA9)) {
            rep = (unsigned char)in[i + 2] == 0xA8 ? "\\u2028" : "\\u2029";
            skip = 2;
        } else if (c == 0xEF && i + 2 < len && (unsigned char)in[i + 1] == 0xBF &&
                   (unsigned char)in[i + 2] == 0xBD) {
            rep = "\\ufffd";
            skip = 2;
        }
        if (rep) {
            memcpy(out + o, rep, 6);
            o += 6;
            i += skip;
        } else {
            out[o++] = (char)c;
        }
    }
    out[o] = '\0';
    return out;
}

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
        json_object_set_new(st, "message", go_string(message));
    if (reason && *reason)
        json_object_set_new(st, "reason", json_string(reason));
    if (d) {
        json_t *dj = json_object();
        if (d->name)
            json_object_set_new(dj, "name", go_string(d->name));
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
                    json_object_set_new(c, "message", go_string(d->causes[i].message));
                if (d->causes[i].field)
                    json_object_set_new(c, "field", go_string(d->causes[i].field));
                json_array_append_new(cs, c);
            }
            json_object_set_new(dj, "causes", cs);
        }
        if (d->retry_after_seconds)
            json_object_set_new(dj, "retryAfterSeconds", json_integer(d->retry_after_seconds));
        json_object_set_new(st, "details", dj);
    }
    json_object_set_new(st, "code", json_integer(code));
    char *s = json_dumps(st, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(st);
    if (!s)
        abort(); /* only on OOM: every string above is valid UTF-8 */
    char *out = go_escape(s);
    free(s);
    return out;
}
