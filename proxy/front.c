/*
 * front.c — the request stages on kwc's HTTP server (see front.h, http.h).
 *
 * A request is decided when its head has been read, before any body byte,
 * so a passthrough can stream the body upstream as it arrives. Each stage
 * is one named function; a stage that answers the request ends the pipeline.
 *
 * Authentication and authorization are the "insecure-allow" policy for now:
 * every caller is accepted and every request allowed, and passthrough requests
 * carry kwc's own upstream identity (like `kubectl proxy`). That is why
 * config.c refuses a non-loopback --listen without --insecure-allow-remote,
 * why identity headers from callers are dropped before the upstream sees
 * them, and why a plaintext request must name a loopback Host (a web page
 * using DNS rebinding would otherwise reach kwc's upstream identity).
 */
#include "kwc/front.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kwc/base.h"
#include "kwc/config.h"
#include "kwc/http.h"
#include "kwc/log.h"
#include "kwc/passthrough.h"
#include "kwc/reflector.h"
#include "kwc/respond.h"
#include "kwc/route.h"
#include "kwc/serve.h"
#include "kwc/tunnel.h"
#include "kwc/upstream.h"
#include "kwc/watch.h"

#define FRONT_MAGIC 0x66726e74u /* "frnt" */

struct front {
    uint32_t magic;
    struct event_base *base;
    struct http_server *http;
    const struct kwc_config *cfg;
    const struct kcfg *k;
    struct up_client *up;
    struct pt_options pt_short, pt_long;
    struct tunnel_options tun;
    struct refl *const *refls;
    size_t nrefls;
    struct serve *serve;
    struct watch_pool *watch;
    struct refl_ingest *ing;
    bool tls;
};

/* What the stages learned about one request. Lives on the stack of on_request. */
struct kreq {
    struct hreq *req;
    const char *method;
    struct route_req route;
    const char *user; /* authenticated identity */
};

/* ---- stage: authenticate / authorize (insecure-allow policy) ---- */

static int
authn_insecure_allow(struct front *f, struct kreq *k)
{
    k->user = "system:kwc:insecure-allow";
    return 0;
}

static int
authz_insecure_allow(struct front *f, struct kreq *k)
{
    return 0;
}

/* ---- stage: the Host a plaintext request names ---- */

/* The host part of a Host header value into out (port and brackets off). */
static bool
host_only(const char *v, char *out, size_t len)
{
    size_t n;
    if (v[0] == '[') {
        const char *e = strchr(v, ']');
        if (!e || (e[1] && e[1] != ':'))
            return false;
        n = (size_t)(e - v - 1);
        v++;
    } else {
        const char *colon = strchr(v, ':');
        if (colon && strchr(colon + 1, ':'))
            return false; /* an IPv6 address must be bracketed */
        n = colon ? (size_t)(colon - v) : strlen(v);
    }
    if (n >= len)
        return false;
    memcpy(out, v, n);
    out[n] = '\0';
    return true;
}

static bool
loopback_host(const char *h)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (strcasecmp(h, "localhost") == 0 || strcasecmp(h, "localhost.") == 0)
        return true;
    if (inet_pton(AF_INET, h, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, h, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6);
    return false;
}

/* 0, or a message for the 403. */
static const char *
check_host(struct front *f, struct hreq *r, char *msg, size_t len)
{
    if (f->tls)
        return NULL; /* a rebinding page cannot present kwc's certificate's names */
    const char *v = hreq_header(r, "Host");
    if (!v || !*v)
        return NULL; /* HTTP/1.0 without Host: no browser sends that */
    char h[256];
    if (host_only(v, h, sizeof(h))) {
        if (loopback_host(h))
            return NULL;
        if (cfg_accept_hosts_match(f->cfg, h))
            return NULL;
    }
    snprintf(msg, len,
             "host \"%.200s\" is not allowed: kwc serves plaintext HTTP to loopback names only "
             "(allow more with --accept-hosts REGEX, or serve TLS)",
             v);
    return msg;
}

/* ---- kwc's own endpoints ---- */

/* /readyz: every cache synced. The verbose form names each check, as
 * kube-apiserver's does ("[+]name ok" / "[-]name failed: reason"). */
static void
readyz(struct front *f, struct hreq *req, bool verbose)
{
    struct evbuffer *b = evbuffer_new();
    bool ready = true;
    evbuffer_add_printf(b, "[+]ping ok\n");
    for (size_t i = 0; i < f->nrefls; i++) {
        char st[256];
        refl_status(f->refls[i], st, sizeof(st));
        bool ok = refl_serving(f->refls[i]);
        const char *out = refl_out_why(f->refls[i]);
        ready &= ok;
        if (ok)
            evbuffer_add_printf(b, "[+]cache %s ok\n", st);
        else if (out)
            evbuffer_add_printf(b, "[-]cache %s failed: out of service: %s\n", st, out);
        else
            evbuffer_add_printf(b, "[-]cache %s failed: not synced\n", st);
    }
    evbuffer_add_printf(b, "readyz check %s\n", ready ? "passed" : "failed");
    size_t n = evbuffer_get_length(b);
    char *text = xmalloc(n + 1);
    evbuffer_remove(b, text, n);
    text[n] = '\0';
    evbuffer_free(b);
    respond_text(req, ready ? 200 : 503, verbose || !ready ? text : "ok");
    free(text);
}

static void
local_endpoint(struct front *f, struct kreq *k)
{
    const char *path = k->route.path;
    const char *t = hreq_target(k->req, NULL);
    const char *q = strchr(t, '?');
    bool verbose = q && strstr(q, "verbose") != NULL;
    if (strcmp(path, "/readyz") == 0)
        readyz(f, k->req, verbose);
    else if (strcmp(path, "/healthz") == 0 && verbose)
        respond_text(k->req, 200, "[+]ping ok\nhealthz check passed\n");
    else
        respond_text(k->req, 200, "ok");
}

/* An answer kwc gives itself once the request's body (if any) has been
 * read and dropped: answering first would close the connection. */
struct later {
    struct front *f;
    struct hreq *r;
    int code; /* a Status answer; 0: kwc's own endpoint */
    char *reason, *msg;
    char path[16]; /* endpoint: its path */
};

static void
answer_now(struct front *f, struct hreq *r, int code, const char *reason, const char *msg,
           const char *path)
{
    if (code) {
        respond_status(r, code, reason, msg, 0);
        return;
    }
    struct kreq k = {.req = r};
    k.route.path = path;
    local_endpoint(f, &k);
}

static void
on_later_complete(void *arg)
{
    struct later *l = arg;
    answer_now(l->f, l->r, l->code, l->reason, l->msg, l->path);
}

static void
on_later_close(void *arg)
{
    struct later *l = arg;
    free(l->reason);
    free(l->msg);
    free(l);
}

static const struct hreq_handler later_handler = {
    .on_complete = on_later_complete,
    .on_close = on_later_close,
};

static void
answer(struct front *f, struct hreq *r, int code, const char *reason, const char *msg,
       const char *endpoint)
{
    if (!hreq_has_body(r)) {
        answer_now(f, r, code, reason, msg, endpoint);
        return;
    }
    struct later *l = xcalloc(1, sizeof(*l));
    l->f = f;
    l->r = r;
    l->code = code;
    l->reason = reason ? xstrdup(reason) : NULL;
    l->msg = msg ? xstrdup(msg) : NULL;
    if (endpoint)
        snprintf(l->path, sizeof(l->path), "%s", endpoint);
    hreq_set_handler(r, &later_handler, l);
}

static bool
is_local_path(const char *p)
{
    return strcmp(p, "/healthz") == 0 || strcmp(p, "/livez") == 0 || strcmp(p, "/readyz") == 0;
}

/* ---- stage: route ---- */

static bool
long_running(const struct route_req *r)
{
    if (r->verb == ROUTE_WATCH || r->verb == ROUTE_PROXY)
        return true;
    static const char *const subs[] = {"log", "exec", "attach", "portforward", "proxy"};
    for (size_t i = 0; r->subresource && i < KWC_ARRAY_LEN(subs); i++)
        if (strcmp(r->subresource, subs[i]) == 0)
            return true;
    return false;
}

static void
route_request(struct front *f, struct kreq *k)
{
    struct hreq *req = k->req;
    if (is_local_path(k->route.path)) {
        answer(f, req, 0, NULL, NULL, k->route.path);
        return;
    }
    if (hreq_upgrade(req)) {
        tunnel_start(req, &f->tun);
        return;
    }
    switch (watch_take(f->watch, req, &k->route)) {
    case WATCH_STREAM:
    case WATCH_ANSWERED:
        return;
    case WATCH_NOT_TAKEN:
        break;
    }
    if (serve_take(f->serve, req, &k->route))
        return;
    pt_forward(req, f->up, long_running(&k->route) ? &f->pt_long : &f->pt_short);
}

/* ---- the pipeline ---- */

static void
on_request(void *arg, struct hreq *req)
{
    struct front *f = arg;
    assert(f->magic == FRONT_MAGIC);
    struct kreq k = {.req = req, .method = hreq_method(req)};

    /* parse */
    size_t tl;
    const char *target = hreq_target(req, &tl);
    int rc = route_parse(k.method, target, tl, &k.route);
    if (rc == KWC_ETOOBIG) {
        answer(f, req, 414, NULL, "the request URI is too long", NULL);
        goto out;
    }
    if (rc != 0) {
        answer(f, req, 400, NULL, "the request URI is not a valid path and query", NULL);
        goto out;
    }
    char msg[400];
    if (check_host(f, req, msg, sizeof(msg))) {
        answer(f, req, 403, "Forbidden", msg, NULL);
        goto out;
    }
    /* authenticate, authorize */
    if (authn_insecure_allow(f, &k) != 0) {
        answer(f, req, 401, NULL, "Unauthorized", NULL);
        goto out;
    }
    if (authz_insecure_allow(f, &k) != 0) {
        answer(f, req, 403, NULL, "forbidden", NULL);
        goto out;
    }
    /* route + respond */
    route_request(f, &k);
out:
    route_fini(&k.route);
}

/* A cache left service: its watch streams end, so that their clients resume
 * from the upstream while it is out (lists and gets check at each request). */
static void
on_service(void *arg, const struct refl *r, bool serving)
{
    struct front *f = arg;
    if (!serving && f->watch)
        watch_out_of_service(f->watch, r);
}

/* After every store commit: requests waiting for an rv, then watch streams. */
static void
on_commit(void *arg)
{
    struct front *f = arg;
    serve_committed(f->serve);
    if (f->watch)
        watch_committed(f->watch);
}

int
front_new(struct event_base *base, const struct kwc_config *cfg, const struct kcfg *k,
          struct up_client *up, struct store *st, struct refl_ingest *ing,
          struct refl *const *refls, size_t nrefls, struct front **out, char *err, size_t errlen)
{
    struct front *f = xcalloc(1, sizeof(*f));
    f->refls = refls;
    f->nrefls = nrefls;
    f->magic = FRONT_MAGIC;
    f->base = base;
    f->cfg = cfg;
    f->k = k;
    f->up = up;
    f->tls = cfg->tls_cert_file != NULL;
    f->pt_short = (struct pt_options){
        .max_request_buffer = (size_t)cfg->max_request_buffer,
        .max_response_buffer = (size_t)cfg->max_response_buffer,
        .strip_credentials = true,
    };
    f->pt_long = f->pt_short;
    f->pt_long.long_running = true;
    f->tun = (struct tunnel_options){.k = k, .base = base, .strip_credentials = true,
                                     .connect_timeout_ms = (int)cfg->upstream_connect_timeout * 1000};
    struct serve_options so = {
        .too_large = strcmp(cfg->too_large_rv, "504") == 0 ? DECIDE_TOO_LARGE_504 : DECIDE_TOO_LARGE_PASS,
        .wait_ms = (int)cfg->rv_wait_ms,
        .max_buffer = (size_t)cfg->max_list_buffer,
        .up = up,
        .pt = &f->pt_short,
    };
    f->serve = serve_new(base, st, refls, nrefls, &so);
    struct watch_options wo = {
        .workers = (unsigned)cfg->watch_workers,
        .budget = (size_t)cfg->watch_budget,
        .window_bytes = (size_t)cfg->watch_window,
        .bookmark_ms = (uint64_t)cfg->bookmark_interval * 1000,
        .wait_ms = (int)cfg->rv_wait_ms,
        .too_large = so.too_large,
    };
    f->watch = watch_pool_new(base, st, refls, nrefls, &wo);
    f->ing = ing;
    refl_ingest_on_commit(ing, on_commit, f);
    refl_ingest_on_service(ing, on_service, f);

    struct http_server_options ho = {
        .addrs = cfg->listen_addrs,
        .naddrs = cfg->n_listen,
        .max_header_bytes = (size_t)cfg->max_header_bytes,
        .request_header_timeout_ms = (int)cfg->request_header_timeout * 1000,
        .idle_timeout_ms = (int)cfg->idle_timeout * 1000,
        .max_connections = (unsigned)cfg->max_connections_resolved,
        .tls_cert_file = cfg->tls_cert_file,
        .tls_key_file = cfg->tls_private_key_file,
        .client_ca_file = cfg->client_ca_file,
        .tls_min_version = cfg->tls_min_version,
    };
    int rc = http_server_new(base, &ho, on_request, f, &f->http, err, errlen);
    if (rc != 0) {
        refl_ingest_on_commit(ing, NULL, NULL);
        refl_ingest_on_service(ing, NULL, NULL);
        watch_pool_free(f->watch);
        serve_free(f->serve);
        free(f);
        return rc;
    }
    *out = f;
    return 0;
}

int
front_port(const struct front *f)
{
    return http_server_port(f->http, 0);
}

void
front_free(struct front *f)
{
    if (!f)
        return;
    assert(f->magic == FRONT_MAGIC);
    /* watch streams end first (terminal chunks), while the store is open */
    watch_pool_free(f->watch);
    f->watch = NULL;
    /* close what is still open: each request's on_close runs (passthroughs
     * cancel their transfers, cached lists end) */
    http_server_free(f->http);
    refl_ingest_on_commit(f->ing, NULL, NULL);
    refl_ingest_on_service(f->ing, NULL, NULL);
    serve_free(f->serve);
    f->magic = 0;
    free(f);
}
