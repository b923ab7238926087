/*
 * access.c — request records, request metrics and the access log (see
 * access.h).
 *
 * A record is small and fixed (labels are bounded copies), allocated once
 * per request by the front end. The log's strings (method, target, user)
 * are copied only when the log is on. Counting a finished request is three
 * stored-family updates in the thread's own shard (metrics_thread_shard);
 * the gauge of requests in flight is three atomics (a stream ends on a
 * worker thread).
 */
#include "kwc/access.h"

#include <assert.h>
#include <ctype.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kwc/base.h"
#include "kwc/gostr.h"
#include "kwc/http.h"
#include "kwc/metrics.h"
#include "kwc/route.h"

#define ACC_MAGIC 0x61636331u /* "acc1" */

struct access {
    struct access_options o;
    struct metrics_family *requests, *duration, *bytes;
    atomic_ullong in_flight[ACCESS_NSOURCES];
};

struct access_rec {
    uint32_t magic;
    struct access *a;
    enum access_source source;
    bool long_running; /* WATCH, CONNECT: the duration metric is the time to the head */
    char verb[20];
    char group[64], resource[64]; /* label values (access_label_name) */
    /* the log's (only when it is on) */
    char *user;
    char *method, *target; /* streams: copies of the head */
    const char *proto;     /* streams: hreq_proto's (static) */
    /* streams: what the HTTP server no longer sees */
    int status;
    uint64_t start_ns, head_ns;
};

static const char *const req_labels[] = {"verb", "group", "resource", "code", "source"};
static const char *const dur_labels[] = {"verb", "group", "resource", "source"};

const char *
access_source_name(enum access_source s)
{
    switch (s) {
    case ACCESS_CACHE:
        return "cache";
    case ACCESS_UPSTREAM:
        return "upstream";
    default:
        return "kwc";
    }
}

struct access *
access_new(struct metrics *m, const struct access_options *o)
{
    struct access *a = xcalloc(1, sizeof(*a));
    a->o = *o;
    a->requests = metrics_family_new(
        m, METRICS_COUNTER, "kwc_requests_total",
        "Requests by verb (kube's metric verbs), API group, resource, HTTP status code and "
        "source: cache (answered from kwc's cache), upstream (passed through or tunnelled), kwc "
        "(kwc's own endpoints and the errors its stages answer). Code 0: no response head was "
        "sent (the client left first, or an upgrade tunnel). Watch streams count when they end.",
        req_labels, 5, NULL, 0);
    a->duration = metrics_family_new(
        m, METRICS_HISTOGRAM, "kwc_request_duration_seconds",
        "Response latency in seconds (kube-apiserver's buckets): to the end of the response; for "
        "WATCH and CONNECT, to the response head, as kube measures long-running requests.",
        dur_labels, 4, metrics_request_buckets, metrics_request_nbuckets);
    a->bytes = metrics_family_new(
        m, METRICS_COUNTER, "kwc_response_bytes_total",
        "Response bytes queued to clients (head, body and chunk framing), by verb, group, "
        "resource and source: list bytes are verb LIST, watch stream bytes verb WATCH.",
        dur_labels, 4, NULL, 0);
    return a;
}

void
access_free(struct access *a)
{
    free(a);
}

uint64_t
access_in_flight(const struct access *a, enum access_source s)
{
    return atomic_load_explicit(&((struct access *)(uintptr_t)a)->in_flight[s],
                                memory_order_relaxed);
}

struct access_rec *
access_begin(struct access *a)
{
    struct access_rec *r = xcalloc(1, sizeof(*r));
    r->magic = ACC_MAGIC;
    r->a = a;
    r->source = ACCESS_KWC;
    atomic_fetch_add_explicit(&a->in_flight[ACCESS_KWC], 1, memory_order_relaxed);
    return r;
}

static struct access_rec *
rec_of(void *p)
{
    struct access_rec *r = p;
    assert(!r || r->magic == ACC_MAGIC);
    return r;
}

/* ---- labels ---- */

const char *
access_label_name(const char *s)
{
    if (!s)
        return "";
    size_t n = 0;
    for (const char *c = s; *c; c++, n++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '.' || *c == '-'))
            return METRICS_OVERFLOW;
    return n <= 253 ? s : METRICS_OVERFLOW;
}

const char *
access_metric_verb(const char *method, const struct route_req *route, bool upgrade)
{
    static const char *const methods[] = {"GET",    "HEAD",    "POST",    "PUT",  "PATCH",
                                          "DELETE", "OPTIONS", "CONNECT", "TRACE"};
    if (upgrade)
        return "CONNECT";
    if (route && route->is_resource) {
        switch (route->verb) {
        case ROUTE_WATCH:
            return "WATCH";
        case ROUTE_LIST:
            return "LIST";
        case ROUTE_GET:
            return "GET";
        case ROUTE_PROXY:
            return "CONNECT";
        default:
            break;
        }
        if (route->subresource &&
            (strcmp(route->subresource, "exec") == 0 || strcmp(route->subresource, "attach") == 0 ||
             strcmp(route->subresource, "portforward") == 0 ||
             strcmp(route->subresource, "proxy") == 0))
            return "CONNECT";
    }
    for (size_t i = 0; i < KWC_ARRAY_LEN(methods); i++)
        if (strcmp(method, methods[i]) == 0)
            return strcmp(method, "HEAD") == 0 ? "GET" : methods[i];
    return "other";
}

void
access_set_route(struct access_rec *r, const char *method, const struct route_req *route,
                 bool upgrade)
{
    const char *verb = access_metric_verb(method, route, upgrade);
    snprintf(r->verb, sizeof(r->verb), "%s", verb);
    r->long_running = strcmp(verb, "WATCH") == 0 || strcmp(verb, "CONNECT") == 0;
    if (route && route->is_resource) {
        const char *g = access_label_name(route->group);
        const char *res = access_label_name(route->resource);
        if (strlen(g) >= sizeof(r->group))
            g = METRICS_OVERFLOW;
        if (strlen(res) >= sizeof(r->resource))
            res = METRICS_OVERFLOW;
        snprintf(r->group, sizeof(r->group), "%s", g);
        snprintf(r->resource, sizeof(r->resource), "%s", res);
    }
}

void
access_set_user(struct access_rec *r, const char *user)
{
    if (!r || !r->a->o.log || !user)
        return;
    free(r->user);
    r->user = xstrdup(user);
}

void
access_set_source(struct hreq *req, enum access_source s)
{
    struct access_rec *r = rec_of(hreq_note(req));
    if (!r || r->source == s)
        return;
    atomic_fetch_sub_explicit(&r->a->in_flight[r->source], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&r->a->in_flight[s], 1, memory_order_relaxed);
    r->source = s;
}

/* ---- redaction ---- */

static bool
secret_name(const char *p, size_t n)
{
    char name[256];
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < sizeof(name); i++) {
        char c = p[i];
        if (c == '%' && i + 2 < n && isxdigit((unsigned char)p[i + 1]) &&
            isxdigit((unsigned char)p[i + 2])) {
            char hex[3] = {p[i + 1], p[i + 2], 0};
            c = (char)strtol(hex, NULL, 16);
            i += 2;
        } else if (c == '+') {
            c = ' ';
        }
        name[k++] = (char)tolower((unsigned char)c);
    }
    name[k] = '\0';
    if (n >= sizeof(name))
        return true; /* a name too long to check is not logged either */
    return strstr(name, "token") || strstr(name, "password") || strstr(name, "secret");
}

char *
access_redact_target(const char *target)
{
    const char *q = strchr(target, '?');
    if (!q)
        return xstrdup(target);
    struct gostr_buf b = {0};
    gostr_addn(&b, target, (size_t)(q - target) + 1);
    const char *p = q + 1;
    while (*p) {
        size_t len = strcspn(p, "&;");
        size_t nl = strcspn(p, "=&;");
        if (nl < len && secret_name(p, nl)) {
            gostr_addn(&b, p, nl + 1);
            gostr_add(&b, "REDACTED");
        } else {
            gostr_addn(&b, p, len);
        }
        p += len;
        if (*p) {
            gostr_addc(&b, *p);
            p++;
        }
    }
    return gostr_take(&b);
}

/* ---- finishing ---- */

static void
rec_free(struct access_rec *r)
{
    free(r->user);
    free(r->method);
    free(r->target);
    r->magic = 0;
    free(r);
}

static void
record(struct access_rec *r, const char *method, const char *target, const char *proto, int status,
       uint64_t bytes, uint64_t start_ns, uint64_t head_ns, uint64_t end_ns)
{
    struct access *a = r->a;
    char code[16];
    snprintf(code, sizeof(code), "%d", status);
    const char *src = access_source_name(r->source);
    const char *rv[] = {r->verb[0] ? r->verb : "other", r->group, r->resource, code, src};
    const char *dv[] = {rv[0], r->group, r->resource, src};
    uint64_t until = r->long_running && head_ns ? head_ns : end_ns;
    double secs = until > start_ns ? (double)(until - start_ns) / 1e9 : 0;
    metrics_add(a->requests, rv, 1);
    metrics_observe(a->duration, dv, secs);
    metrics_add(a->bytes, dv, (double)bytes);
    atomic_fetch_sub_explicit(&a->in_flight[r->source], 1, memory_order_relaxed);
    if (!a->o.log)
        return;
    char *path = access_redact_target(target ? target : "");
    double ms = end_ns > start_ns ? (double)(end_ns - start_ns) / 1e6 : 0;
    ms = (double)(long long)(ms * 1000 + 0.5) / 1000; /* microsecond resolution */
    struct log_field f[] = {
        LOG_STR("method", method ? method : "-"),
        LOG_STR("path", path),
        LOG_STR("proto", proto ? proto : "-"),
        LOG_STR("user", r->user ? r->user : "-"),
        LOG_NUM("code", status),
        LOG_NUM("bytes", bytes),
        LOG_NUM("duration_ms", ms),
        LOG_STR("source", src),
    };
    log_fields(a->o.level, "request", f, KWC_ARRAY_LEN(f));
    free(path);
}

void
access_finish(struct access_rec *r, const struct hreq_done *d)
{
    r = rec_of(r);
    if (!r)
        return;
    record(r, d->method, d->target, d->proto, d->status, d->bytes, d->start_ns, d->head_ns,
           d->end_ns);
    rec_free(r);
}

struct access_rec *
access_stream(void *note, struct hreq *req, int status)
{
    struct access_rec *r = rec_of(note);
    if (!r)
        return NULL;
    r->status = status;
    r->start_ns = hreq_start_ns(req);
    r->head_ns = http_now_ns();
    r->proto = hreq_proto(req);
    if (r->a->o.log) {
        r->method = xstrdup(hreq_method(req));
        r->target = xstrdup(hreq_target(req, NULL));
    }
    return r;
}

void
access_stream_end(struct access_rec *r, uint64_t bytes)
{
    r = rec_of(r);
    if (!r)
        return;
    record(r, r->method, r->target, r->proto, r->status, bytes, r->start_ns, r->head_ns,
           http_now_ns());
    rec_free(r);
}
