/*
 * front.c — the request stages on kwc's HTTP server (see front.h, http.h).
 *
 * A request is decided when its head has been read, before any body byte,
 * so a passthrough can stream the body upstream as it arrives. Each stage
 * is one named function; a stage that answers the request ends the pipeline.
 *
 * Stages: parse -> Host -> authenticate -> impersonate -> authorize -> route.
 * The parts the route stage hands requests to (serve, the watch pool,
 * passthrough, tunnels) and those the stages ask (auth, the access log,
 * metrics) are built and wired by app.c; the front borrows them (front.h).
 *
 * --auth delegated (auth.h): the caller is authenticated (client certificate,
 * TokenReview, anonymous if allowed), its Impersonate-* headers are checked
 * (verb impersonate) and applied, and a request kwc may answer from its
 * cache (a get, list or watch of a cached resource) is authorized with a
 * SubjectAccessReview; everything else goes upstream as the caller
 * (Impersonate-* on kwc's credentials, or the caller's own bearer token),
 * and the upstream decides. /healthz, /livez and /readyz need no identity;
 * /metrics is authorized as kube authorizes its own (a non-resource URL:
 * nonResourceAttributes {path, verb}), and so is every discovery request
 * kwc's copy of the upstream's answers could answer (discovery.h): kwc
 * answers it, or records its key, only for a caller kube would allow.
 *
 * Every request carries a record (access.h) from its head on: the stages
 * fill in the route, the caller and the handler that took it; the HTTP
 * server's done callback finishes it (metrics, the access log).
 * The stages that wait for the upstream park the request (a handler whose
 * on_close cancels the wait).
 *
 * --auth none: every caller acts as kwc (like `kubectl proxy`). That is why
 * config.c refuses a non-loopback --listen then, why identity headers from
 * callers are always dropped before the upstream sees them, and why a
 * plaintext request must name a loopback Host (a web page using DNS
 * rebinding would otherwise reach kwc's upstream identity).
 */
#include "kwc/front.h"

#include <arpa/inet.h>
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "kwc/access.h"
#include "kwc/admit.h"
#include "kwc/auth.h"
#include "kwc/base.h"
#include "kwc/catalog.h"
#include "kwc/discovery.h"
#include "kwc/gostr.h"
#include "kwc/http.h"
#include "kwc/impersonate.h"
#include "kwc/mailbox.h"
#include "kwc/metrics.h"
#include "kwc/passthrough.h"
#include "kwc/reflector.h"
#include "kwc/respond.h"
#include "kwc/route.h"
#include "kwc/selector.h"
#include "kwc/serve.h"
#include "kwc/tunnel.h"
#include "kwc/upstream.h"
#include "kwc/watch.h"

#define FRONT_MAGIC 0x66726e74u /* "frnt" */

struct front {
    uint32_t magic;
    struct up_client *up;
    const struct pt_options *pt_short, *pt_long;
    struct tunnel_options tun;
    struct catalog *cat;
    const struct refl_set *set; /* the catalog's */
    int start_wait_ms;
    struct kreq *waiting; /* requests waiting for a warming cache */
    struct serve *serve;
    struct watch_pool *watch;
    struct discovery *discovery; /* discovery answered from the copy */
    struct auth *auth;           /* NULL: --auth none */
    bool tls;
    bool forward_token; /* --passthrough-identity=forward-token */
    bool (*accept_host)(const void *arg, const char *host); /* --accept-hosts */
    const void *accept_host_arg;
    struct metrics *metrics;   /* /metrics */
    struct access *access;     /* request records: metrics, the access log */
    atomic_bool shutting_down; /* front_shutting_down: /readyz fails (read on the main loop) */
    /* a serving loop's (front.h): kwc's endpoints rendered on the main loop */
    struct mailbox *main_mb, *loop_mb;
    void (*metrics_render)(void *arg, void (*done)(void *arg, char *text, size_t n),
                           void *done_arg);
    void *metrics_render_arg;
};

/* What the stages learned about one request (lives until it is routed). */
struct kreq {
    struct front *f;
    struct hreq *req;
    const char *method;
    struct route_req route;
    struct auth_user *caller; /* who authenticated */
    struct auth_user *user;   /* as whom it acts (caller, or whom it impersonates) */
    struct auth_wait *wait;   /* the upstream is being asked */
    struct imp_plan imp;      /* the Impersonate-* questions, asked in order */
    size_t at;                /* the question being asked */
    char nr_verb[16];         /* a non-resource request's verb (the lower-case method) */
    /* kwc may answer it from a cache: --auth none, or a SubjectAccessReview
     * allowed it (stage_authorize). Without it the upstream answers. */
    bool may_serve;
    /* waiting for cache wait_slot's first sync (-1: for discovery's first
     * answer; CATALOG_PENDING: for the main loop to make the cache) until
     * wait_until_ms (--cache-start-timeout from the first wait) */
    uint64_t wait_until_ms;
    int wait_slot;
    struct event *wait_timer;
    struct kreq *wait_next, **wait_prev;
    bool nonresource; /* kwc authorizes it as a non-resource URL */
};

static void stage_impersonate(struct kreq *k);
static void stage_authorize(struct kreq *k);
static void stage_route(struct kreq *k);

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
        if (f->accept_host && f->accept_host(f->accept_host_arg, h))
            return NULL;
    }
    snprintf(msg, len,
             "host \"%.200s\" is not allowed: kwc serves plaintext HTTP to loopback names only "
             "(allow more with --accept-hosts REGEX, or serve TLS)",
             v);
    return msg;
}

/* ---- kwc's own endpoints ---- */

/* One cache's line of /readyz; false when it holds readiness back. */
static bool
readyz_cache(struct evbuffer *b, const struct refl *rf, bool counted)
{
    char st[1024]; /* a backing-off cache's last error included */
    refl_status(rf, st, sizeof(st));
    if (!counted) {
        const char *why = refl_last_error(rf);
        evbuffer_add_printf(b,
                            "[+]cache %s ok: not counted%s; its requests pass through while it "
                            "does not serve%s%s%s\n",
                            st, refl_counts_ready(rf) ? " (started on demand)" : " until it serves",
                            why ? " (" : "", why ? why : "", why ? ")" : "");
        return true;
    }
    bool ok = refl_serving(rf);
    const char *out = refl_out_why(rf);
    if (ok)
        evbuffer_add_printf(b, "[+]cache %s ok\n", st);
    else if (out)
        evbuffer_add_printf(b, "[-]cache %s failed: out of service: %s\n", st, out);
    else if (refl_last_error(rf))
        evbuffer_add_printf(b, "[-]cache %s failed: not synced: %s\n", st, refl_last_error(rf));
    else
        evbuffer_add_printf(b, "[-]cache %s failed: not synced\n", st);
    return ok;
}

/* /readyz: every required cache synced. The verbose form names each check,
 * as kube-apiserver's does ("[+]name ok" / "[-]name failed: reason"): the
 * caches /readyz waits for first (--resources LIST: those of the list, and
 * a protobuf cache a request started once it has synced), then those
 * started on demand (auto mode: all), listed but holding nothing back; a
 * cache not running (not asked for yet, stopped while idle) is not listed.
 * One the upstream does not serve in protobuf holds nothing back either. */
static char *
readyz_text(struct front *f, bool verbose, int *code)
{
    struct evbuffer *b = evbuffer_new();
    bool ready = true;
    evbuffer_add_printf(b, "[+]ping ok\n");
    if (atomic_load(&f->shutting_down)) {
        /* kube-apiserver's "shutdown" readyz check, its reason withheld as
         * kube withholds it */
        evbuffer_add_printf(b, "[-]shutdown failed: reason withheld\n");
        ready = false;
    }
    bool auto_mode = catalog_auto(f->cat);
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < f->set->n; i++) {
            const struct refl *rf = f->set->r[i];
            if (!refl_started(rf))
                continue;
            bool counted = !auto_mode && refl_counts_ready(rf);
            if (counted == (pass == 0))
                ready &= readyz_cache(b, rf, counted);
        }
    }
    evbuffer_add_printf(b, "readyz check %s\n", ready ? "passed" : "failed");
    size_t n = evbuffer_get_length(b);
    char *text = xmalloc(n + 1);
    evbuffer_remove(b, text, n);
    text[n] = '\0';
    evbuffer_free(b);
    *code = ready ? 200 : 503;
    if (!verbose && ready) {
        free(text);
        text = xstrdup("ok");
    }
    return text;
}

static void
readyz(struct front *f, struct hreq *req, bool verbose)
{
    int code;
    char *text = readyz_text(f, verbose, &code);
    respond_text(req, code, text);
    free(text);
}

void
front_shutting_down(struct front *f)
{
    atomic_store(&f->shutting_down, true);
}

/* ---- a serving loop's endpoints, rendered on the main loop ---- */

/* One /metrics or /readyz request of a serving loop: the main loop renders
 * (it owns the caches' state and the scrape), the loop answers. The
 * request may close meanwhile (r NULL): the answer is then dropped. */
struct mjob {
    struct front *f;
    struct hreq *r;
    bool answered; /* the answer was given: on_close frees */
    bool metrics, verbose;
    int code;
    char *text;
    size_t n;
    void *later; /* the struct later whose handler this one replaced */
};

static void on_later_close(void *arg);

static void
mjob_free(struct mjob *j)
{
    if (j->later)
        on_later_close(j->later);
    free(j->text);
    free(j);
}

static void
mjob_on_close(void *arg)
{
    struct mjob *j = arg;
    if (j->answered)
        mjob_free(j);
    else
        j->r = NULL; /* the answer, when it comes back, frees */
}

static const struct hreq_handler mjob_handler = {.on_close = mjob_on_close};

/* The serving loop: answer, unless the client left. */
static void
mjob_answer(void *arg)
{
    struct mjob *j = arg;
    if (!j->r) {
        mjob_free(j);
        return;
    }
    j->answered = true; /* (on_close may run from inside the answer) */
    struct hreq *r = j->r;
    if (j->metrics) {
        hresp_header(r, "Cache-Control", "no-cache, private");
        hresp_simple(r, 200, METRICS_CONTENT_TYPE, j->text, j->n);
    } else {
        respond_text(r, j->code, j->text);
    }
}

static void
mjob_rendered(void *arg, char *text, size_t n)
{
    struct mjob *j = arg;
    j->text = text;
    j->n = n;
    mailbox_post(j->f->loop_mb, mjob_answer, j);
}

/* The main loop. */
static void
mjob_run(void *arg)
{
    struct mjob *j = arg;
    if (j->metrics) {
        j->f->metrics_render(j->f->metrics_render_arg, mjob_rendered, j);
        return;
    }
    j->text = readyz_text(j->f, j->verbose, &j->code);
    mailbox_post(j->f->loop_mb, mjob_answer, j);
}

static void
main_endpoint(struct front *f, struct hreq *req, bool metrics, bool verbose, void *later)
{
    struct mjob *j = xcalloc(1, sizeof(*j));
    j->later = later;
    j->f = f;
    j->r = req;
    j->metrics = metrics;
    j->verbose = verbose;
    hreq_set_handler(req, &mjob_handler, j);
    mailbox_post(f->main_mb, mjob_run, j);
}

/* /metrics: the Prometheus text format (metrics.h). */
static void
metrics_endpoint(struct front *f, struct hreq *req)
{
    size_t n;
    char *text = metrics_render(f->metrics, &n);
    hresp_header(req, "Cache-Control", "no-cache, private");
    hresp_simple(req, 200, METRICS_CONTENT_TYPE, text, n);
    free(text);
}

static void
local_endpoint(struct front *f, struct kreq *k, void *later)
{
    const char *path = k->route.path;
    const char *t = hreq_target(k->req, NULL);
    const char *q = strchr(t, '?');
    bool verbose = q && strstr(q, "verbose") != NULL;
    if (f->main_mb && (strcmp(path, "/metrics") == 0 || strcmp(path, "/readyz") == 0))
        main_endpoint(f, k->req, strcmp(path, "/metrics") == 0, verbose, later);
    else if (strcmp(path, "/metrics") == 0)
        metrics_endpoint(f, k->req);
    else if (strcmp(path, "/readyz") == 0)
        readyz(f, k->req, verbose);
    else if (strcmp(path, "/healthz") == 0 && verbose)
        respond_text(k->req, 200, "[+]ping ok\nhealthz check passed\n");
    else if (strcmp(path, "/livez") == 0 && verbose)
        respond_text(k->req, 200, "[+]ping ok\nlivez check passed\n");
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
    char *body;      /* a Status already rendered (code set) */
    int retry_after; /* a Status answer's Retry-After (seconds; 0: none) */
    char path[16];   /* endpoint: its path */
};

static void
answer_now(struct front *f, struct hreq *r, int code, const char *reason, const char *msg,
           const char *path, const char *body, int retry_after, void *later)
{
    if (code && body) {
        respond_status_body(r, code, body, retry_after);
        return;
    }
    if (code) {
        respond_status(r, code, reason, msg, retry_after);
        return;
    }
    struct kreq k = {.f = f, .req = r};
    k.route.path = path;
    local_endpoint(f, &k, later);
}

static void
on_later_complete(void *arg)
{
    struct later *l = arg;
    answer_now(l->f, l->r, l->code, l->reason, l->msg, l->path, l->body, l->retry_after, l);
}

static void
on_later_close(void *arg)
{
    struct later *l = arg;
    free(l->reason);
    free(l->msg);
    free(l->body);
    free(l);
}

static const struct hreq_handler later_handler = {
    .on_complete = on_later_complete,
    .on_close = on_later_close,
};

static void
answer_with(struct front *f, struct hreq *r, int code, const char *reason, const char *msg,
            const char *endpoint, const char *body, int retry_after)
{
    if (!hreq_has_body(r)) {
        answer_now(f, r, code, reason, msg, endpoint, body, retry_after, NULL);
        return;
    }
    struct later *l = xcalloc(1, sizeof(*l));
    l->f = f;
    l->r = r;
    l->code = code;
    l->reason = reason ? xstrdup(reason) : NULL;
    l->msg = msg ? xstrdup(msg) : NULL;
    l->body = body ? xstrdup(body) : NULL;
    l->retry_after = retry_after;
    if (endpoint)
        snprintf(l->path, sizeof(l->path), "%s", endpoint);
    hreq_set_handler(r, &later_handler, l);
}

static void
answer(struct front *f, struct hreq *r, int code, const char *reason, const char *msg,
       const char *endpoint)
{
    answer_with(f, r, code, reason, msg, endpoint, NULL, 0);
}

static bool
is_local_path(const char *p)
{
    return strcmp(p, "/healthz") == 0 || strcmp(p, "/livez") == 0 || strcmp(p, "/readyz") == 0;
}

/* kwc's endpoint that needs an identity (authorized as kube's
 * nonResourceURLs: ["/metrics"]). */
static bool
is_metrics_path(const char *p)
{
    return strcmp(p, "/metrics") == 0;
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

static void kreq_free(struct kreq *k);
static bool route_request(struct front *f, struct kreq *k);

/* ---- waiting for a cache's first sync ---- */

static void
wait_unlink(struct kreq *k)
{
    if (!k->wait_prev)
        return;
    *k->wait_prev = k->wait_next;
    if (k->wait_next)
        k->wait_next->wait_prev = k->wait_prev;
    k->wait_prev = NULL;
    event_free(k->wait_timer);
    k->wait_timer = NULL;
}

/* The wait is over (the cache synced or failed, or the deadline passed):
 * route again, the cache's answer or the upstream's. */
static void
on_wait_over(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct kreq *k = arg;
    wait_unlink(k);
    hreq_set_handler(k->req, NULL, NULL);
    if (!route_request(k->f, k))
        kreq_free(k);
}

static void
on_wait_close(void *arg)
{
    kreq_free(arg); /* unlinks it */
}

static const struct hreq_handler wait_handler = {.on_close = on_wait_close};

static uint64_t
mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Is what k waits for still on its way? Its cache's first sync, its
 * cache's making (a serving loop's want: CATALOG_PENDING), or discovery's
 * first answer (-1). */
static bool
still_waiting(const struct front *f, const struct kreq *k)
{
    const struct route_req *r = &k->route;
    if (k->wait_slot == CATALOG_PENDING)
        return catalog_pending(f->cat, r->group, r->version, r->resource);
    return k->wait_slot < 0 ? catalog_discovering(f->cat)
                            : catalog_warming(f->cat, (size_t)k->wait_slot);
}

/* A read of a resource kwc may cache: the catalog finds (auto mode:
 * starts) its cache; one on its way to its first sync is waited for, as
 * kube's Cacher makes requests wait while it initialises, and so is
 * discovery's first answer at kwc's start (whether the resource may be
 * cached is not known before it), --cache-start-timeout in all. On a
 * serving loop the cache may first have to be made on the main loop
 * (CATALOG_PENDING): k waits for that, then asks again (once: a cache the
 * main loop would not make is not asked for again, k passes through). True
 * when k now waits. */
static bool
wait_for_cache(struct front *f, struct kreq *k)
{
    const struct route_req *r = &k->route;
    struct admit_req q = {.r = r,
                          .method = k->method,
                          .accept = hreq_header(k->req, "Accept"),
                          .user_agent = hreq_header(k->req, "User-Agent")};
    enum kwc_enc enc;
    if (!admit_wants(&q, &enc) || f->start_wait_ms <= 0)
        return false;
    /* a list or get with no resourceVersion (a quorum read: the
     * upstream's) starts the cache its watch will want, without waiting */
    bool quorum = r->verb != ROUTE_WATCH && !r->q.resource_version && !r->q.continue_token;
    int i = -1;
    if (!catalog_discovering(f->cat)) {
        /* asked again after a posted want: a creation the main loop
         * refused (--max-caches) is not posted, nor counted, twice */
        if (k->wait_slot == CATALOG_PENDING &&
            catalog_find(f->cat, r->group, r->version, r->resource, enc) < 0)
            return false;
        i = catalog_want(f->cat, r->group, r->version, r->resource, enc);
        if (i == CATALOG_PENDING) {
            if (quorum || k->wait_slot == CATALOG_PENDING)
                return false; /* asked once: the main loop made none */
        } else if (i < 0 || quorum || !catalog_warming(f->cat, (size_t)i)) {
            return false;
        }
    } else if (quorum) {
        return false;
    }
    uint64_t now = mono_ms();
    if (!k->wait_until_ms)
        k->wait_until_ms = now + (uint64_t)f->start_wait_ms;
    if (now >= k->wait_until_ms)
        return false; /* waited long enough: the upstream answers */
    k->wait_slot = i;
    uint64_t left = k->wait_until_ms - now;
    k->wait_timer = evtimer_new(hreq_base(k->req), on_wait_over, k);
    struct timeval tv = {(time_t)(left / 1000), (suseconds_t)(left % 1000) * 1000};
    evtimer_add(k->wait_timer, &tv);
    k->wait_next = f->waiting;
    if (f->waiting)
        f->waiting->wait_prev = &k->wait_next;
    f->waiting = k;
    k->wait_prev = &f->waiting;
    hreq_set_handler(k->req, &wait_handler, k);
    return true;
}

void
front_caches_changed(void *arg)
{
    struct front *f = arg;
    for (struct kreq *k = f->waiting; k; k = k->wait_next)
        if (!still_waiting(f, k))
            event_active(k->wait_timer, EV_TIMEOUT, 1); /* routed from the loop, not from here */
}

void
front_discovery_changed(void *arg)
{
    front_caches_changed(arg);
}

void
front_cache_service(void *arg, const struct refl *r, bool serving)
{
    (void)r;
    (void)serving;
    front_caches_changed(arg);
}

/* Route k. False when k is done with (the caller frees it), true when it
 * waits for a cache (it is freed when the wait ends). */
static bool
route_request(struct front *f, struct kreq *k)
{
    struct hreq *req = k->req;
    if (is_local_path(k->route.path) || is_metrics_path(k->route.path)) {
        answer(f, req, 0, NULL, NULL, k->route.path);
        return false;
    }
    if (strcmp(k->method, "CONNECT") == 0) {
        /* kube-apiserver has no CONNECT handler (its "connect" subresources
         * are GET/POST upgrades): go-restful answers 405. kwc never tunnels
         * or forwards it; the server closes the connection after. */
        answer(f, req, 405, "MethodNotAllowed",
               "the server does not allow this method on the requested resource", NULL);
        return false;
    }
    if (hreq_upgrade(req)) {
        access_set_source(req, ACCESS_UPSTREAM);
        tunnel_start(req, &f->tun);
        return false;
    }
    /* what kwc did not authorize itself, the upstream answers (and decides) */
    if (k->may_serve) {
        /* the cache's, unless neither takes it (passthrough marks its own) */
        access_set_source(req, ACCESS_CACHE);
        if (discovery_take(f->discovery, req, &k->route, true))
            return false;
        if (wait_for_cache(f, k))
            return true;
        switch (watch_take(f->watch, req, &k->route)) {
        case WATCH_STREAM:
        case WATCH_ANSWERED:
            return false;
        case WATCH_NOT_TAKEN:
            break;
        }
        if (serve_take(f->serve, req, &k->route))
            return false;
    }
    pt_forward(req, f->up, long_running(&k->route) ? f->pt_long : f->pt_short);
    return false;
}

/* ---- the pipeline ---- */

static void
kreq_free(struct kreq *k)
{
    wait_unlink(k);
    auth_cancel(k->wait);
    if (k->user)
        auth_user_unref(k->user);
    if (k->caller)
        auth_user_unref(k->caller);
    imp_plan_fini(&k->imp);
    route_fini(&k->route);
    free(k);
}

/* The client went away while the upstream was being asked. A stream that
 * ends before its caller is known counts as an unauthenticated request
 * (on_authenticated's rule): Go's handler goes on after a reset and learns
 * the answer; kwc stops asking, so it cannot learn it, and the connection
 * takes no new stream however the stream ended (a reset by the client, or
 * one it made kwc send: CVE-2025-8671). */
static void
on_parked_close(void *arg)
{
    struct kreq *k = arg;
    if (!k->caller)
        hresp_goaway(k->req);
    kreq_free(k);
}

static const struct hreq_handler parked_handler = {.on_close = on_parked_close};

/* Answer now (the request is over for the stages); retry_after: a
 * Retry-After (and the Status's retryAfterSeconds) in seconds, or 0. */
static void
finish_retry(struct kreq *k, int code, const char *reason, const char *msg, const char *body,
             int retry_after)
{
    hreq_set_handler(k->req, NULL, NULL);
    answer_with(k->f, k->req, code, reason, msg, NULL, body, retry_after);
    kreq_free(k);
}

static void
finish(struct kreq *k, int code, const char *reason, const char *msg, const char *body)
{
    finish_retry(k, code, reason, msg, body, 0);
}

/* The caller's source holds its share of reviews (auth.h): what kube's
 * max-in-flight filter answers a request past its limit. */
static void
finish_busy(struct kreq *k)
{
    finish_retry(k, 429, "TooManyRequests", "Too many requests, please try again later.", NULL, 1);
}

/* The source an unauthenticated caller's new reviews count against (auth.h);
 * NULL for an authenticated caller or a peer without an IP address. */
static const struct src_key *
review_source(struct kreq *k, struct src_key *buf)
{
    if (!k->caller || !auth_user_is_anonymous(k->caller))
        return NULL;
    return hreq_source(k->req, buf) ? buf : NULL;
}

/* kube's 500 for an authorizer error or a bad impersonation request
 * (filters/authorization.go, impersonation.go: responsewriters.InternalError,
 * which is http.Error of `Internal Server Error: %q: %v` with & < > escaped):
 * plain text, not a Status. */
static void
finish_internal_n(struct kreq *k, const char *why, size_t whylen)
{
    struct gostr_buf b = {0};
    gostr_add(&b, "Internal Server Error: ");
    const char *uri = hreq_target(k->req, NULL);
    gostr_quote(&b, uri, strlen(uri));
    gostr_add(&b, ": ");
    gostr_addn(&b, why, whylen); /* may hold NUL bytes (an extra key), as Go's would */
    struct gostr_buf out = {0};
    for (size_t i = 0; i < b.len; i++) {
        char c = b.p[i];
        if (c == '&')
            gostr_add(&out, "&amp;");
        else if (c == '<')
            gostr_add(&out, "&lt;");
        else if (c == '>')
            gostr_add(&out, "&gt;");
        else
            gostr_addc(&out, c);
    }
    gostr_addc(&out, '\n');
    hreq_set_handler(k->req, NULL, NULL);
    respond_text_n(k->req, 500, out.p, out.len);
    free(out.p);
    free(b.p);
    kreq_free(k);
}

static void
finish_internal(struct kreq *k, const char *why)
{
    finish_internal_n(k, why, strlen(why));
}

/* ---- stage: authenticate ---- */

static void
on_authenticated(void *arg, int status, struct auth_user *u)
{
    struct kreq *k = arg;
    k->wait = NULL;
    /* HTTP/2 is costly and prone to abuse (CVE-2023-44487): kube's
     * UnauthenticatedHTTP2DOSMitigation (on by default since 1.29) limits
     * a caller that is not authenticated, or authenticated as anonymous, to
     * this one request on its HTTP/2 connection (Go's graceful GOAWAY behind
     * "Connection: close"); HTTP/1.1 keep-alive stays as it is. */
    if (status != 0 || !u || auth_user_is_anonymous(u))
        hresp_goaway(k->req);
    if (status == 429) {
        finish_busy(k);
        return;
    }
    if (status != 0 || !u) {
        /* kube's 401 (responsewriters/errors.go via filters/authentication.go) */
        finish(k, 401, "Unauthorized", "Unauthorized", NULL);
        return;
    }
    auth_user_ref(u);
    k->caller = u;
    auth_user_ref(u);
    k->user = u;
    access_set_user(hreq_note(k->req), u->name);
    stage_impersonate(k);
}

static void
stage_authenticate(struct kreq *k)
{
    hreq_set_handler(k->req, &parked_handler, k);
    hreq_body_hold(k->req); /* for whoever takes the request after the stages */
    /* an answer known at once calls back before this returns, and may free k */
    struct src_key src;
    bool has_src = hreq_source(k->req, &src);
    struct auth_wait *w = auth_authenticate(k->f->auth, hreq_client_cert(k->req),
                                            hreq_header(k->req, "Authorization"),
                                            has_src ? &src : NULL, on_authenticated, k);
    if (w)
        k->wait = w;
}

/* ---- stage: impersonate (kube's filters/impersonation.go) ---- */

/*
 * impersonate.h reads the headers into one list of questions; each is asked
 * in kube's order, the first denial ends the request with kube's 403, and
 * the identity the request then acts as is built from that same list
 * (imp_user), so nothing reaches the upstream that was not asked about.
 */

static void next_impersonation(struct kreq *k);

static void
on_impersonation_decided(void *arg, enum auth_decision d, const char *reason)
{
    struct kreq *k = arg;
    k->wait = NULL;
    if (d == AUTH_BUSY) {
        finish_busy(k);
        return;
    }
    if (d == AUTH_ERROR) {
        finish_internal(k, reason);
        return;
    }
    if (d == AUTH_DENY) {
        struct auth_attrs at;
        imp_attrs(&k->imp.q[k->at], &at);
        char *body = auth_forbidden_status(k->caller->name, &at, reason);
        finish(k, 403, NULL, NULL, body);
        free(body);
        return;
    }
    k->at++;
    next_impersonation(k);
}

static void
next_impersonation(struct kreq *k)
{
    if (k->at == k->imp.nq) {
        /* every question allowed: act as what they make */
        auth_user_unref(k->user);
        k->user = imp_user(&k->imp);
        stage_authorize(k);
        return;
    }
    struct auth_attrs at;
    imp_attrs(&k->imp.q[k->at], &at);
    struct src_key src;
    struct auth_wait *w = auth_authorize(k->f->auth, k->caller, &at, review_source(k, &src),
                                         on_impersonation_decided, k);
    if (w)
        k->wait = w; /* else k may be gone already */
}

static void
stage_impersonate(struct kreq *k)
{
    const struct http_header *hs;
    size_t nh = hreq_headers(k->req, &hs);
    switch (imp_plan(hs, nh, &k->imp)) {
    case IMP_NONE:
        stage_authorize(k);
        return;
    case IMP_TOO_MANY: {
        char msg[200];
        snprintf(msg, sizeof(msg),
                 "the request asks to impersonate %zu attributes (user, groups, extra values, "
                 "uid); kwc checks at most %d per request",
                 k->imp.asked, IMP_MAX_ATTRS);
        finish(k, 431, NULL, msg, NULL);
        return;
    }
    case IMP_NO_USER: {
        size_t len;
        char *why = imp_no_user_message(&k->imp, &len);
        finish_internal_n(k, why, len);
        free(why);
        return;
    }
    case IMP_ASK:
        k->at = 0;
        next_impersonation(k);
        return;
    }
}

/* ---- stage: authorize what kwc answers itself ---- */

/* A get, list or watch of a cached resource (or kwc's own endpoint): kwc may
 * answer it, so kwc decides; all else the upstream decides. */
static bool
kwc_may_answer(struct kreq *k)
{
    const struct route_req *r = &k->route;
    if (!r->is_resource || !r->resource)
        return false;
    if (strcmp(k->method, "GET") != 0 && strcmp(k->method, "HEAD") != 0)
        return false;
    if (r->verb != ROUTE_GET && r->verb != ROUTE_LIST && r->verb != ROUTE_WATCH)
        return false;
    if (catalog_may_cache(k->f->cat, r->group, r->version, r->resource))
        return true;
    /* a resource discovery does not list yet (a new CRD): ask it again */
    catalog_missed(k->f->cat, r->group, r->version, r->resource);
    return false;
}

/* kube's RequestInfo name: the path's, or a list/watch's metadata.name=X. */
static void
request_attrs(struct kreq *k, struct sel **sel, struct auth_attrs *at)
{
    const struct route_req *r = &k->route;
    const char *name = r->name;
    *sel = NULL;
    if (k->nonresource) {
        /* kube's RequestInfo for a non-resource URL: the path, the method in lower case */
        size_t i = 0;
        for (; k->method[i] && i + 1 < sizeof(k->nr_verb); i++)
            k->nr_verb[i] = (char)tolower((unsigned char)k->method[i]);
        k->nr_verb[i] = '\0';
        *at = (struct auth_attrs){.resource_request = false, .verb = k->nr_verb, .path = r->path};
        return;
    }
    if (!name && r->q.field_selector && (r->verb == ROUTE_LIST || r->verb == ROUTE_WATCH)) {
        char *err = NULL;
        if (sel_parse(NULL, r->q.field_selector, sel, &err) == 0)
            name = sel_requires_exact(*sel, "metadata.name");
        free(err);
    }
    *at = (struct auth_attrs){.resource_request = true,
                              .verb = route_verb_name(r->verb),
                              .group = r->group,
                              .version = r->version,
                              .resource = r->resource,
                              .subresource = r->subresource,
                              .namespace_ = r->namespace_,
                              .name = name};
}

static void
on_authorized(void *arg, enum auth_decision d, const char *reason)
{
    struct kreq *k = arg;
    k->wait = NULL;
    if (d == AUTH_ALLOW) {
        k->may_serve = !is_metrics_path(k->route.path);
        stage_route(k);
        return;
    }
    if (d == AUTH_BUSY) {
        finish_busy(k);
        return;
    }
    if (d == AUTH_ERROR) {
        finish_internal(k, reason);
        return;
    }
    struct sel *sel;
    struct auth_attrs at;
    request_attrs(k, &sel, &at);
    char *body = auth_forbidden_status(k->user->name, &at, reason);
    sel_free(sel);
    finish(k, 403, NULL, NULL, body);
    free(body);
}

static void
stage_authorize(struct kreq *k)
{
    k->nonresource =
        is_metrics_path(k->route.path) || discovery_servable(k->f->discovery, k->req, &k->route);
    if (!k->nonresource && !kwc_may_answer(k)) {
        stage_route(k);
        return;
    }
    struct sel *sel;
    struct auth_attrs at;
    request_attrs(k, &sel, &at);
    struct src_key src;
    struct auth_wait *w =
        auth_authorize(k->f->auth, k->user, &at, review_source(k, &src), on_authorized, k);
    sel_free(sel);
    if (w)
        k->wait = w; /* else k may be gone already */
}

/* ---- stage: the caller's identity upstream, then route ---- */

/* The caller's identity for the upstream (hreq_set_upstream_headers): its
 * own token and Impersonate-* headers (--passthrough-identity=forward-token,
 * the upstream judges them), or the identity the stages decided, carried by
 * impersonate.h's headers on kwc's credentials. */
static void
set_identity(struct kreq *k)
{
    if (k->f->forward_token && k->caller->from_token) {
        const struct http_header *hs;
        size_t nh = hreq_headers(k->req, &hs), n = 0;
        struct http_header *h = xcalloc(nh + 1, sizeof(*h));
        h[n++] = (struct http_header){"Authorization", hreq_header(k->req, "Authorization")};
        for (size_t i = 0; i < nh; i++)
            if (strncasecmp(hs[i].name, "Impersonate-", 12) == 0)
                h[n++] = hs[i];
        hreq_set_upstream_headers(k->req, h, n);
        free(h);
        return;
    }
    struct http_header *h;
    char **names;
    size_t n = imp_headers(k->user, &h, &names);
    hreq_set_upstream_headers(k->req, h, n);
    imp_headers_free(h, names);
}

static void
stage_route(struct kreq *k)
{
    if (k->f->auth)
        set_identity(k);
    hreq_set_handler(k->req, NULL, NULL);
    if (!route_request(k->f, k))
        kreq_free(k);
}

void
front_on_request(void *arg, struct hreq *req)
{
    struct front *f = arg;
    assert(f->magic == FRONT_MAGIC);
    struct kreq *k = xcalloc(1, sizeof(*k));
    k->f = f;
    k->req = req;
    k->method = hreq_method(req);
    struct access_rec *acc = access_begin(f->access);
    hreq_set_note(req, acc);

    /* parse */
    size_t tl;
    const char *target = hreq_target(req, &tl);
    int rc = route_parse(k->method, target, tl, &k->route);
    access_set_route(acc, k->method, rc == 0 ? &k->route : NULL, hreq_upgrade(req));
    if (rc == KWC_ETOOBIG) {
        answer(f, req, 414, NULL, "the request URI is too long", NULL);
        kreq_free(k);
        return;
    }
    if (rc != 0) {
        answer(f, req, 400, NULL, "the request URI is not a valid path and query", NULL);
        kreq_free(k);
        return;
    }
    char msg[400];
    if (check_host(f, req, msg, sizeof(msg))) {
        answer(f, req, 403, "Forbidden", msg, NULL);
        kreq_free(k);
        return;
    }
    if (!f->auth || is_local_path(k->route.path)) {
        k->may_serve = !f->auth; /* --auth none: every caller acts as kwc */
        if (!route_request(f, k))
            kreq_free(k);
        return;
    }
    stage_authenticate(k);
}

struct front *
front_new(const struct front_parts *p)
{
    struct front *f = xcalloc(1, sizeof(*f));
    struct event_base *base = p->base;
    f->magic = FRONT_MAGIC;
    f->up = p->up;
    f->pt_short = p->pt_short;
    f->pt_long = p->pt_long;
    f->cat = p->cat;
    f->set = catalog_set(p->cat);
    f->start_wait_ms = p->start_wait_ms;
    f->serve = p->serve;
    f->watch = p->watch;
    f->discovery = p->discovery;
    f->auth = p->auth;
    f->tls = p->tls;
    f->forward_token = p->forward_token;
    f->accept_host = p->accept_host;
    f->accept_host_arg = p->accept_host_arg;
    f->metrics = p->metrics;
    f->access = p->access;
    f->main_mb = p->main_mb;
    f->loop_mb = p->loop_mb;
    f->metrics_render = p->metrics_render;
    f->metrics_render_arg = p->metrics_render_arg;
    f->tun = (struct tunnel_options){.link = up_client_uplink(p->up),
                                     .base = base,
                                     .strip_credentials = true,
                                     .connect_timeout_ms = p->tunnel_connect_timeout_ms};
    return f;
}

void
front_free(struct front *f)
{
    if (!f)
        return;
    assert(f->magic == FRONT_MAGIC);
    f->magic = 0;
    free(f);
}
