/*
 * front.c — the libevhtp server and the request stages (see front.h).
 *
 * A request is decided in the connection's on_headers hook, before any body
 * byte is read, so a passthrough can stream the body upstream as it arrives.
 * Each stage is one named function; a stage that answers the request ends the
 * pipeline.
 *
 * Authentication and authorization are the "insecure-allow" policy for now:
 * every caller is accepted and every request allowed, and passthrough requests
 * carry kwc's own upstream identity (like `kubectl proxy`). That is why
 * config.c refuses a non-loopback --listen without --insecure-allow-remote.
 */
#include "kwc/front.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <evhtp/evhtp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "kwc/base.h"
#include "kwc/config.h"
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
#define DISCARD_MAX (1024 * 1024) /* body bytes we read and drop before a local answer */

/* A client connection, tracked so that shutdown can close the ones still
 * open (libevhtp frees a connection only when it ends). */
struct fconn {
    evhtp_connection_t *c;
    struct fconn *next, **prev;
};

struct front {
    uint32_t magic;
    struct fconn *conns;
    struct event_base *base;
    evhtp_t *htp;
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
    int port;
};

/* What the stages learned about one request. Lives on the stack of on_headers. */
struct kreq {
    evhtp_request_t *req;
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

/* ---- kwc's own endpoints ---- */

static void
discard_body(evhtp_request_t *req)
{
    respond_discard_body(req, DISCARD_MAX);
}

/* /readyz: every cache synced. The verbose form names each check, as
 * kube-apiserver's does ("[+]name ok" / "[-]name failed: reason"). */
static void
readyz(struct front *f, evhtp_request_t *req, bool verbose)
{
    struct evbuffer *b = evbuffer_new();
    bool ready = true;
    evbuffer_add_printf(b, "[+]ping ok\n");
    for (size_t i = 0; i < f->nrefls; i++) {
        char st[256];
        refl_status(f->refls[i], st, sizeof(st));
        bool ok = refl_synced(f->refls[i]);
        ready &= ok;
        evbuffer_add_printf(b, "[%c]cache %s %s\n", ok ? '+' : '-', st, ok ? "ok" : "failed: not synced");
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
on_local_complete(evhtp_request_t *req, void *arg)
{
    struct front *f = arg;
    const char *path = req->uri->path->full;
    const char *q = req->uri->query_raw ? (const char *)req->uri->query_raw : "";
    bool verbose = strstr(q, "verbose") != NULL;
    if (strcmp(path, "/readyz") == 0)
        readyz(f, req, verbose);
    else if (strcmp(path, "/healthz") == 0 && verbose)
        respond_text(req, 200, "[+]ping ok\nhealthz check passed\n");
    else
        respond_text(req, 200, "ok");
}

static bool
is_local_path(const char *p)
{
    return strcmp(p, "/healthz") == 0 || strcmp(p, "/livez") == 0 || strcmp(p, "/readyz") == 0;
}

static void untrack(struct front *f, evhtp_connection_t *c);

/* ---- stage: route ---- */

static bool
wants_upgrade(evhtp_request_t *req)
{
    const char *up = evhtp_header_find(req->headers_in, "Upgrade");
    const char *conn = evhtp_header_find(req->headers_in, "Connection");
    return up && conn && strcasestr(conn, "upgrade");
}

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
    evhtp_request_t *req = k->req;
    if (is_local_path(k->route.path)) {
        discard_body(req);
        req->cb = on_local_complete;
        req->cbarg = f;
        return;
    }
    if (wants_upgrade(req)) {
        untrack(f, evhtp_request_get_connection(req)); /* the tunnel takes it over */
        tunnel_start(req, &f->tun);
        return;
    }
    switch (watch_take(f->watch, req, &k->route)) {
    case WATCH_STREAM:
        untrack(f, evhtp_request_get_connection(req)); /* a worker owns its socket now */
        return;
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
reject_early(evhtp_request_t *req, int code, const char *msg)
{
    /* Answered before the body: never read it as the next request. */
    respond_no_keepalive(req);
    discard_body(req);
    req->cb = NULL;
    respond_status(req, code, NULL, msg, 0);
}

static evhtp_res
on_headers(evhtp_request_t *req, evhtp_headers_t *hdrs, void *arg)
{
    struct front *f = arg;
    assert(f->magic == FRONT_MAGIC);
    struct kreq k = {.req = req, .method = htparser_get_methodstr_m(req->method)};

    /* parse: a request line without a version leaves libevhtp's uri NULL */
    if (!req->uri || !req->uri->path || !req->uri->path->full) {
        reject_early(req, 400, "the request line is not a valid HTTP/1.x request line");
        goto out;
    }
    const char *path = req->uri->path->full;
    const char *q = req->uri->query_raw ? (const char *)req->uri->query_raw : NULL;
    char *target = q && *q ? xasprintf("%s?%s", path, q) : xstrdup(path);
    int rc = route_parse(k.method, target, strlen(target), &k.route);
    free(target);
    if (rc == KWC_ETOOBIG) {
        reject_early(req, 414, "the request URI is too long");
        goto out;
    }
    if (rc != 0) {
        reject_early(req, 400, "the request URI is not a valid path and query");
        goto out;
    }
    /* authenticate, authorize */
    if (authn_insecure_allow(f, &k) != 0) {
        reject_early(req, 401, "Unauthorized");
        goto out;
    }
    if (authz_insecure_allow(f, &k) != 0) {
        reject_early(req, 403, "forbidden");
        goto out;
    }
    /* route + respond */
    route_request(f, &k);
out:
    route_fini(&k.route);
    return EVHTP_RES_OK;
}

static evhtp_res
on_conn_fini(evhtp_connection_t *conn, void *arg)
{
    struct fconn *fc = arg;
    *fc->prev = fc->next;
    if (fc->next)
        fc->next->prev = fc->prev;
    free(fc);
    return EVHTP_RES_OK;
}

static void
untrack(struct front *f, evhtp_connection_t *c)
{
    for (struct fconn *fc = f->conns; fc; fc = fc->next) {
        if (fc->c == c) {
            evhtp_connection_set_hook(c, evhtp_hook_on_connection_fini, NULL, NULL);
            on_conn_fini(c, fc);
            return;
        }
    }
}

static evhtp_res
on_accept(evhtp_connection_t *conn, void *arg)
{
    struct front *f = arg;
    struct fconn *fc = xcalloc(1, sizeof(*fc));
    fc->c = conn;
    fc->next = f->conns;
    if (f->conns)
        f->conns->prev = &fc->next;
    fc->prev = &f->conns;
    f->conns = fc;
    evhtp_connection_set_hook(conn, evhtp_hook_on_connection_fini, (evhtp_hook)on_conn_fini, fc);
    /* Responses leave in several writes (head, chunks): without NODELAY the
     * last small segment waits for the client's delayed ACK (40 ms) on a
     * kept-alive connection. */
    int one = 1;
    setsockopt(conn->sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    evhtp_connection_set_hook(conn, evhtp_hook_on_headers, (evhtp_hook)on_headers, arg);
    return EVHTP_RES_OK;
}

/* Requests evhtp completes without our hooks having taken them (should not happen). */
static void
on_unrouted(evhtp_request_t *req, void *arg)
{
    respond_status(req, 500, NULL, "kwc: request was not routed", 0);
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
    f->htp = evhtp_new(base, NULL);
    evhtp_set_gencb(f->htp, on_unrouted, f);
    evhtp_set_post_accept_cb(f->htp, on_accept, f);

    char bindaddr[300];
    snprintf(bindaddr, sizeof(bindaddr), "%s:%s", strchr(cfg->listen_host, ':') ? "ipv6" : "ipv4",
             cfg->listen_host);
    if (evhtp_bind_socket(f->htp, bindaddr, (uint16_t)cfg->listen_port, 1024) != 0) {
        snprintf(err, errlen, "--listen %s: cannot bind: %s (is another process using it?)",
                 cfg->listen, strerror(errno));
        evhtp_free(f->htp);
        refl_ingest_on_commit(ing, NULL, NULL);
        watch_pool_free(f->watch);
        serve_free(f->serve);
        free(f);
        return -EADDRINUSE;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    evutil_socket_t fd = evconnlistener_get_fd(f->htp->server);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        f->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    *out = f;
    return 0;
}

int
front_port(const struct front *f)
{
    return f->port;
}

void
front_free(struct front *f)
{
    if (!f)
        return;
    assert(f->magic == FRONT_MAGIC);
    evhtp_unbind_socket(f->htp);
    /* watch streams end first (terminal chunks), while the store is open */
    watch_pool_free(f->watch);
    f->watch = NULL;
    /* close what is still open: each free runs the request and connection
     * hooks (passthroughs cancel their transfers, cached lists end) */
    while (f->conns)
        evhtp_connection_free(f->conns->c);
    evhtp_free(f->htp);
    refl_ingest_on_commit(f->ing, NULL, NULL);
    serve_free(f->serve);
    f->magic = 0;
    free(f);
}
