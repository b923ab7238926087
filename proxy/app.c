/*
 * app.c — the serving side of the process wired from the config (app.h):
 * serve, the watch pool, the passthrough budget and options, delegated
 * auth, the access log, /metrics and its collectors, and kwc's HTTP server
 * whose requests walk the stages of front.c. front.c gets only the parts
 * (struct front_parts); it never reads the config.
 *
 * Owns everything it builds; borrows what main.c built (struct app_deps).
 * On SIGTERM main.c drains first (app_drain, then app_busy until nothing is
 * left or --shutdown-drain-grace-period passed). Order of teardown (app_free): the watch pool first
 * (its streams end with terminal chunks while the store is open), then the HTTP server (each open
 * request's on_close runs: passthroughs cancel their transfers, cached
 * lists end), then what those requests used.
 */
#include "kwc/app.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <unistd.h>
#include <event2/event.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/access.h"
#include "kwc/auth.h"
#include "kwc/base.h"
#include "kwc/catalog.h"
#include "kwc/collect.h"
#include "kwc/config.h"
#include "kwc/disco.h"
#include "kwc/discovery.h"
#include "kwc/kubeconfig.h"
#include "kwc/upstream.h"
#include "kwc/front.h"
#include "kwc/http.h"
#include "kwc/log.h"
#include "kwc/mailbox.h"
#include "kwc/metrics.h"
#include "kwc/passthrough.h"
#include "kwc/reflector.h"
#include "kwc/serve.h"
#include "kwc/watch.h"

#define APP_MAGIC 0x61707020u /* "app " */

/* What the requests of a loop's connections use, all on that loop: a
 * serving loop's, or the main loop's when it serves itself
 * (--serving-threads unset in tests that build an app with no loops). */
struct stack {
    struct event_base *base;
    struct up_client *up;
    struct pt_options pt_short, pt_long;
    struct pt_budget *budget;
    struct serve *serve;
    struct discovery *discovery;
    struct auth *auth;
    struct front *front;
};

/* A serving loop (issue 32): a thread with its own event_base that holds
 * the connections the main loop's acceptor hands it, and everything their
 * requests use: its HTTP server (no listener), front, serve, auth, its own
 * upstream client (passthrough, reviews, tunnels), its passthrough budget
 * share, and the watch pool's worker on its base. Built on the main thread
 * before the thread starts, freed there after it was joined. */
struct sloop {
    struct app *a;
    unsigned idx;
    pthread_t thread;
    bool running;
    struct event_base *base;
    struct mailbox *mb; /* calls from the main loop */
    struct stack s;
    struct http_server *http;
    atomic_bool poke_pending; /* a wake for the waiting requests is posted */
    atomic_uint pending;      /* connections handed to it, not adopted yet */
};

struct app {
    uint32_t magic;
    struct event_base *base;
    struct mailbox *mb; /* the main loop's: calls from the serving loops */
    struct sloop *loops;
    unsigned nloops;
    struct http_limits *limits;     /* the caps, shared by the acceptor and the loops' servers */
    struct collect_loop *loop_sum;  /* /metrics: the loops' numbers, summed per render */
    struct http_server **loop_http; /* /metrics: each loop's server, for its own gauges */
    struct refl_ingest *ing;
    struct catalog *cat;
    struct disco *disco;
    /* the main loop's own stack, when it serves (no serving loops); with
     * loops its server only accepts and hands off, and this is empty */
    struct stack s;
    struct watch_pool *watch;
    struct auth_shared *auth_shared; /* serving loops: their decision caches (auth.h) */
    struct metrics *metrics;
    struct access *access;
    struct http_server *http;
};

/* --accept-hosts for the Host stage (front_parts.accept_host). */
static bool
accept_host(const void *cfg, const char *host)
{
    return cfg_accept_hosts_match(cfg, host);
}

/* The catalog asks whether a cache is watched before it stops it idle, and
 * ends the watchers of a cache whose resource left discovery. */
static bool
cache_watched(void *watch, size_t i)
{
    struct watch_res_stats ws;
    watch_res_stats(watch, i, &ws);
    return ws.watchers > 0;
}

static void
cache_end_watchers(void *arg, size_t i)
{
    struct app *a = arg;
    watch_service_changed(a->watch, catalog_set(a->cat)->r[i], false);
}

/* A request left the HTTP server: its record is counted and logged. */
static void
on_request_done(void *arg, const struct hreq_done *d, void *note)
{
    access_finish(note, d);
}

static void
log_auth_stats(const struct auth_stats *st)
{
    struct auth_stats as = *st;
    log_info("auth: %llu TokenReviews (%llu answered from the cache), %llu SubjectAccessReviews "
             "(%llu from the cache, %llu coalesced); %llu allowed, %llu denied, %llu errors",
             (unsigned long long)as.token_reviews, (unsigned long long)as.token_cache_hits,
             (unsigned long long)as.sar_sent, (unsigned long long)as.sar_cache_hits,
             (unsigned long long)as.sar_coalesced, (unsigned long long)as.authz_allowed,
             (unsigned long long)as.authz_denied, (unsigned long long)as.authz_errors);
}

static void
auth_opts(const struct kwc_config *cfg, struct auth_options *ao)
{
    *ao = (struct auth_options){
        .anonymous = cfg->anonymous_auth,
        .token_ttl_s = (double)cfg->token_cache_ttl_ms / 1000.0,
        .token_fail_ttl_s = 10,
        .allow_ttl_s = (double)cfg->authz_allow_ttl_ms / 1000.0,
        .deny_ttl_s = (double)cfg->authz_deny_ttl_ms / 1000.0,
        .max_entries = 100000,
        .review_timeout_ms = (unsigned)cfg->review_timeout_ms,
        .max_reviews_per_source = cfg_per_source_reviews(cfg),
    };
}

static void
pt_opts(const struct kwc_config *cfg, struct pt_budget *budget, struct pt_options *s,
        struct pt_options *l)
{
    *s = (struct pt_options){
        .max_request_buffer = (size_t)cfg->max_request_buffer,
        .max_response_buffer = (size_t)cfg->max_response_buffer,
        .strip_credentials = true,
        .budget = budget,
    };
    *l = *s;
    l->long_running = true;
}

static struct serve *
new_serve(const struct app_deps *d, struct event_base *base, struct up_client *up,
          const struct pt_options *pt)
{
    const struct kwc_config *cfg = d->cfg;
    struct serve_options so = {
        .too_large =
            strcmp(cfg->too_large_rv, "504") == 0 ? DECIDE_TOO_LARGE_504 : DECIDE_TOO_LARGE_PASS,
        .wait_ms = (int)cfg->rv_wait_ms,
        .max_buffer = (size_t)cfg->max_list_buffer,
        .up = up,
        .pt = pt,
    };
    return serve_new(base, d->st, catalog_set(d->cat), &so);
}

/* Loop i's share of a bound split among n loops: v / n, one more for the
 * first v % n, at least 1 (upstream.h). */
static unsigned long
share(unsigned long v, unsigned n, unsigned i)
{
    unsigned long s = v / n + (i < v % n);
    return s ? s : 1;
}

static void render_metrics(void *arg, void (*done)(void *arg, char *text, size_t n),
                           void *done_arg);

/* A stack on s->base with s->up and s->auth set: its share of the
 * passthrough budget (l: a serving loop's; NULL: the main loop's, all of
 * it), its serve, discovery copy and front. */
static void
stack_new(const struct app_deps *d, struct app *a, struct stack *s, struct sloop *l)
{
    const struct kwc_config *cfg = d->cfg;
    unsigned long budget = (unsigned long)cfg->max_passthrough_buffer;
    s->budget = pt_budget_new(l ? share(budget, a->nloops, l->idx) : budget);
    pt_opts(cfg, s->budget, &s->pt_short, &s->pt_long);
    s->serve = new_serve(d, s->base, s->up, &s->pt_short);
    s->discovery = discovery_new(cfg->serve_discovery ? d->disco : NULL);
    struct front_parts fp = {
        .base = s->base,
        .cat = d->cat,
        .serve = s->serve,
        .discovery = s->discovery,
        .up = s->up,
        .pt_short = &s->pt_short,
        .pt_long = &s->pt_long,
        .auth = s->auth,
        .start_wait_ms = (int)cfg->cache_start_timeout,
        .watch = a->watch,
        .tunnel_connect_timeout_ms = (int)cfg->upstream_connect_timeout_ms,
        .forward_token = cfg->forward_token,
        .tls = cfg->tls_cert_file != NULL,
        .accept_host = accept_host,
        .accept_host_arg = cfg,
        .metrics = a->metrics,
        .access = a->access,
    };
    if (l) {
        /* /metrics and /readyz are rendered on the main loop */
        fp.main_mb = a->mb;
        fp.loop_mb = l->mb;
        fp.metrics_render = render_metrics;
        fp.metrics_render_arg = a;
    }
    s->front = front_new(&fp);
}

/* The stack's loop stopped (or never ran); the server that fed it is freed. */
static void
stack_free(struct stack *s)
{
    if (s->front)
        front_free(s->front);
    if (s->serve)
        serve_free(s->serve);
    discovery_free(s->discovery);
    pt_budget_free(s->budget); /* every passthrough has closed */
}

static void
http_fill(const struct kwc_config *cfg, struct http_server_options *ho)
{
    *ho = (struct http_server_options){
        .max_header_bytes = (size_t)cfg->max_header_bytes,
        .request_header_timeout_ms = (int)cfg->request_header_timeout_ms,
        .idle_timeout_ms = (int)cfg->idle_timeout_ms,
        .max_connections = (unsigned)cfg->max_connections_resolved,
        .max_connections_per_source = cfg_per_source_connections(cfg),
        .http2_max_streams = (unsigned)cfg->http2_max_streams,
        /* a few responses at their marks (h2.c): the larger of the list
         * and watch marks, four times */
        .http2_conn_buffer =
            4 * (size_t)(cfg->max_list_buffer > cfg->watch_budget ? cfg->max_list_buffer
                                                                  : cfg->watch_budget),
        .max_held_body = (size_t)cfg->max_held_body_buffer,
        .tls_cert_file = cfg->tls_cert_file,
        .tls_key_file = cfg->tls_private_key_file,
        .client_ca_file = cfg->client_ca_file,
        .tls_min_version = cfg->tls_min_version,
        .tls_kernel = cfg->tls_kernel,
    };
}

/* ---- serving loops ---- */

static void *
loop_main(void *arg)
{
    struct sloop *l = arg;
    char name[16];
    snprintf(name, sizeof(name), "kwc-serve/%u", l->idx);
    pthread_setname_np(pthread_self(), name);
    metrics_thread_shard(1 + l->idx); /* the main loop's is 0 */
    event_base_dispatch(l->base);
    return NULL;
}

/* The main loop's side of an accept: the least loaded loop takes it.
 * Connections first (open, and those on their way), HTTP/2 streams at
 * 1/LOOP_STREAMS_PER_CONN of a connection each: a burst of clients (a
 * rollout, a reconnect storm) opens its streams right after each
 * handshake, so at an accept the loops' streams lag their connections
 * unevenly, and counting a stream like a connection split 100 connections
 * x 40 streams 55/45 (bench/results/cores.md). A loop holding thousands of
 * streams more than another still gets fewer new connections. */
#define LOOP_STREAMS_PER_CONN 64

struct handed {
    struct sloop *l;
    int fd;
    bool src_counted;
    socklen_t salen;
    struct sockaddr_storage sa;
};

static void
on_handed(void *arg)
{
    struct handed *h = arg;
    atomic_fetch_sub(&h->l->pending, 1);
    http_server_adopt_counted(h->l->http, h->fd, h->salen ? (struct sockaddr *)&h->sa : NULL,
                              h->salen, h->src_counted);
    free(h);
}

static void
handoff(void *arg, int fd, const struct sockaddr *sa, socklen_t salen, bool src_counted)
{
    struct app *a = arg;
    struct sloop *best = &a->loops[0];
    unsigned long long bl = ULLONG_MAX;
    for (unsigned i = 0; i < a->nloops; i++) {
        struct sloop *l = &a->loops[i];
        struct http_server_stats hs;
        http_server_stats(l->http, &hs);
        unsigned long long load =
            (hs.open + atomic_load(&l->pending)) * LOOP_STREAMS_PER_CONN + hs.h2_streams_open;
        if (load < bl)
            bl = load, best = l;
    }
    struct handed *h = xcalloc(1, sizeof(*h));
    h->l = best;
    h->fd = fd;
    h->src_counted = src_counted;
    if (sa && salen > 0 && (size_t)salen <= sizeof(h->sa)) {
        memcpy(&h->sa, sa, (size_t)salen);
        h->salen = salen;
    }
    atomic_fetch_add(&best->pending, 1);
    mailbox_post(best->mb, on_handed, h);
}

/* The store committed, a cache left or came back into service, discovery
 * changed: each loop's waiting requests look again (one wake per loop in
 * flight, however many commits). */
static void
on_poke(void *arg)
{
    struct sloop *l = arg;
    atomic_store(&l->poke_pending, false);
    serve_committed(l->s.serve);
    front_caches_changed(l->s.front);
}

static void
poke_loops(void *arg)
{
    struct app *a = arg;
    for (unsigned i = 0; i < a->nloops; i++) {
        struct sloop *l = &a->loops[i];
        if (!atomic_exchange(&l->poke_pending, true))
            mailbox_post(l->mb, on_poke, l);
    }
}

static void
poke_service(void *arg, const struct refl *r, bool serving)
{
    (void)r;
    (void)serving;
    poke_loops(arg);
}

/* Before the catalog drops a stopped cache's data, every serving loop has
 * passed a turn (catalog_set_quiesce): a request that saw it serving a
 * moment before is over. */
struct quiesce {
    struct app *a;
    unsigned pending;
    void (*done)(void *arg);
    void *done_arg;
};

static void
on_quiesce_back(void *arg)
{
    struct quiesce *q = arg;
    if (--q->pending)
        return;
    q->done(q->done_arg);
    free(q);
}

static void
on_quiesce_loop(void *arg)
{
    struct quiesce *q = arg;
    mailbox_post(q->a->mb, on_quiesce_back, q);
}

static void
quiesce(void *arg, void (*done)(void *arg), void *done_arg)
{
    struct app *a = arg;
    struct quiesce *q = xcalloc(1, sizeof(*q));
    *q = (struct quiesce){.a = a, .pending = a->nloops, .done = done, .done_arg = done_arg};
    for (unsigned i = 0; i < a->nloops; i++)
        mailbox_post(a->loops[i].mb, on_quiesce_loop, q);
}

/* /metrics with serving loops: each loop copies its numbers on its own
 * thread, the main loop sums them and renders. */
struct scrape {
    struct app *a;
    unsigned pending;
    struct collect_loop **snaps;
    void (*done)(void *arg, char *text, size_t n);
    void *done_arg;
};

struct scrape_part {
    struct scrape *sc;
    unsigned i;
};

static void
on_scrape_back(void *arg)
{
    struct scrape *sc = arg;
    if (--sc->pending)
        return;
    struct app *a = sc->a;
    collect_loop_zero(a->loop_sum);
    for (unsigned i = 0; i < a->nloops; i++)
        collect_loop_add(a->loop_sum, sc->snaps[i]);
    size_t n;
    char *text = metrics_render(a->metrics, &n);
    sc->done(sc->done_arg, text, n);
    for (unsigned i = 0; i < a->nloops; i++)
        collect_loop_free(sc->snaps[i]);
    free(sc->snaps);
    free(sc);
}

static void
on_scrape_loop(void *arg)
{
    struct scrape_part *p = arg;
    struct scrape *sc = p->sc;
    struct sloop *l = &sc->a->loops[p->i];
    /* (authentication's counters are the shared cache's: collect_sources) */
    collect_loop_take(sc->snaps[p->i], l->http, NULL, l->s.up, l->s.budget, l->s.discovery);
    free(p);
    mailbox_post(sc->a->mb, on_scrape_back, sc);
}

static void
render_metrics(void *arg, void (*done)(void *arg, char *text, size_t n), void *done_arg)
{
    struct app *a = arg;
    struct scrape *sc = xcalloc(1, sizeof(*sc));
    sc->a = a;
    sc->pending = a->nloops;
    sc->snaps = xcalloc(a->nloops, sizeof(*sc->snaps));
    for (unsigned i = 0; i < a->nloops; i++)
        sc->snaps[i] = collect_loop_new();
    sc->done = done;
    sc->done_arg = done_arg;
    for (unsigned i = 0; i < a->nloops; i++) {
        struct scrape_part *p = xcalloc(1, sizeof(*p));
        p->sc = sc;
        p->i = i;
        mailbox_post(a->loops[i].mb, on_scrape_loop, p);
    }
}

static int
loop_new(const struct app_deps *d, struct app *a, struct sloop *l, char *err, size_t errlen)
{
    const struct kwc_config *cfg = d->cfg;
    l->a = a;
    if (!l->base) {
        snprintf(err, errlen, "serving loop %u: cannot create its event loop", l->idx);
        return -ENOMEM;
    }
    l->mb = mailbox_new(l->base);
    /* the loops share the bounds of the upstream pools and the
     * passthrough buffer: each its ceiling share */
    struct up_options uo = *d->up_opts;
    for (int p = 0; p < UP_NPOOLS; p++)
        uo.max_conns[p] =
            p == UP_POOL_PASSTHROUGH || p == UP_POOL_TOKENREVIEW || p == UP_POOL_SAR
                ? (unsigned)share(uo.max_conns[p], a->nloops, l->idx)
                : 0; /* (the caches' and discovery's: the main loop's; 0 reports none) */
    l->s.base = l->base;
    int rc = up_client_new_sibling(d->up, l->base, &uo, &l->s.up, err, errlen);
    if (rc != 0)
        return rc;
    if (a->auth_shared)
        auth_attach(a->auth_shared, l->base, l->s.up, l->mb, &l->s.auth);
    stack_new(d, a, &l->s, l);
    struct http_server_options ho;
    http_fill(cfg, &ho);
    ho.limits = a->limits;
    ho.max_held_body = share(ho.max_held_body ? ho.max_held_body : 64u << 20, a->nloops, l->idx);
    return http_server_new(l->base, &ho, front_on_request, l->s.front, &l->http, err, errlen);
}

static void
on_loop_stop(void *arg)
{
    struct sloop *l = arg;
    event_base_loopbreak(l->base);
}

/* Main thread, the loop's thread joined (or never started). */
static void
loop_free(struct sloop *l)
{
    if (l->http)
        http_server_free(l->http);
    stack_free(&l->s);
    if (l->s.auth)
        auth_detach(l->s.auth);
    up_client_free(l->s.up);
    if (l->mb)
        mailbox_free(l->mb);
    if (l->base) {
        /* deferred frees (TLS streams) still queued */
        event_base_loop(l->base, EVLOOP_NONBLOCK);
        event_base_free(l->base);
    }
}

static void
stop_loops(struct app *a)
{
    for (unsigned i = 0; i < a->nloops; i++)
        if (a->loops[i].running)
            mailbox_post(a->loops[i].mb, on_loop_stop, &a->loops[i]);
    for (unsigned i = 0; i < a->nloops; i++)
        if (a->loops[i].running) {
            pthread_join(a->loops[i].thread, NULL);
            a->loops[i].running = false;
        }
}

/* With serving loops the main loop's server hands every connection off
 * (http_server_options.handoff) before a request can be read. */
static void
accept_only(void *arg, struct hreq *r)
{
    (void)arg;
    (void)r;
    abort();
}

static unsigned
loops_wanted(const struct kwc_config *cfg)
{
    if (cfg->serving_threads > 0)
        return (unsigned)cfg->serving_threads;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1;
}

int
app_new(const struct app_deps *d, struct app **out, char *err, size_t errlen)
{
    const struct kwc_config *cfg = d->cfg;
    struct app *a = xcalloc(1, sizeof(*a));
    a->magic = APP_MAGIC;
    a->base = d->base;
    a->ing = d->ing;
    a->cat = d->cat;
    a->disco = d->disco;
    a->mb = mailbox_new(d->base);
    a->nloops = d->up_opts ? loops_wanted(cfg) : 0;
    const struct refl_set *set = catalog_set(d->cat);
    a->loops = xcalloc(a->nloops ? a->nloops : 1, sizeof(*a->loops));
    struct event_base **bases = xcalloc(a->nloops ? a->nloops : 1, sizeof(*bases));
    for (unsigned i = 0; i < a->nloops; i++)
        a->loops[i].idx = i;
    a->metrics = metrics_new();
    struct access_options aco = {.log = cfg->access_log || log_enabled(LOG_DEBUG),
                                 .level = cfg->access_log ? LOG_INFO : LOG_DEBUG};
    a->access = access_new(a->metrics, &aco);
    if (cfg->auth_delegated) {
        struct auth_options ao;
        auth_opts(cfg, &ao);
        if (a->nloops)
            auth_shared_new(&ao, &a->auth_shared); /* one cache, one bound per source */
        else
            auth_new(d->base, d->up, &ao, &a->s.auth);
    }
    a->limits = http_limits_new();
    int rc = 0;
    /* the loops' bases first: the watch pool puts a worker on each */
    for (unsigned i = 0; i < a->nloops; i++) {
        a->loops[i].base = event_base_new();
        if (!a->loops[i].base) {
            log_warnx("kwc: cannot create serving loop %u's event loop", i);
            abort();
        }
        bases[i] = a->loops[i].base;
    }
    struct watch_options wo = {
        .loops = bases,
        .nloops = a->nloops,
        .main_mb = a->mb,
        .workers = a->nloops ? 0 : 1,
        .budget = (size_t)cfg->watch_budget,
        .window_bytes = (size_t)cfg->watch_window,
        .bookmark_ms = (uint64_t)cfg->bookmark_interval_ms,
        .wait_ms = (int)cfg->rv_wait_ms,
        .too_large =
            strcmp(cfg->too_large_rv, "504") == 0 ? DECIDE_TOO_LARGE_504 : DECIDE_TOO_LARGE_PASS,
        .coalesce_max_us = (unsigned)cfg->watch_coalesce_max_ms * 1000,
        .no_coalesce = cfg->watch_coalesce_max_ms == 0,
    };
    a->watch = watch_pool_new(d->base, d->st, set, &wo);
    free(bases);
    for (unsigned i = 0; i < a->nloops && rc == 0; i++)
        rc = loop_new(d, a, &a->loops[i], err, errlen);
    a->loop_sum = collect_loop_new();
    /* after every commit: requests waiting for an rv first, then watch
     * streams (the order of subscription is the order of the calls) */
    if (!a->nloops) {
        a->s.base = d->base;
        a->s.up = d->up;
        stack_new(d, a, &a->s, NULL);
        refl_ingest_subscribe(d->ing, serve_committed, NULL, a->s.serve);
    }
    refl_ingest_subscribe(d->ing, watch_committed, watch_service_changed, a->watch);
    /* requests waiting for a warming cache, after the watch streams */
    if (a->nloops) {
        refl_ingest_subscribe(d->ing, poke_loops, poke_service, a);
        if (d->disco)
            disco_subscribe(d->disco, poke_loops, a);
        /* a creation a serving loop asked for was carried out */
        catalog_subscribe(d->cat, poke_loops, a);
        catalog_set_quiesce(d->cat, quiesce, a);
    } else {
        refl_ingest_subscribe(d->ing, front_caches_changed, front_cache_service, a->s.front);
        if (d->disco)
            disco_subscribe(d->disco, front_discovery_changed, a->s.front);
    }
    catalog_set_busy(d->cat, cache_watched, a->watch);
    catalog_set_end(d->cat, cache_end_watchers, a);

    struct http_server_options ho;
    http_fill(cfg, &ho);
    ho.addrs = cfg->listen_addrs;
    ho.naddrs = cfg->n_listen;
    ho.listen_fds = d->listen_fds;
    ho.limits = a->limits;
    if (a->nloops) {
        ho.handoff = handoff;
        ho.handoff_arg = a;
    }
    if (rc == 0)
        rc = http_server_new(d->base, &ho, a->nloops ? accept_only : front_on_request, a->s.front,
                             &a->http, err, errlen);
    if (rc != 0) {
        app_free(a);
        return rc;
    }
    http_server_on_done(a->http, on_request_done, a);
    for (unsigned i = 0; i < a->nloops; i++)
        http_server_on_done(a->loops[i].http, on_request_done, a);
    a->loop_http = xcalloc(a->nloops ? a->nloops : 1, sizeof(*a->loop_http));
    for (unsigned i = 0; i < a->nloops; i++)
        a->loop_http[i] = a->loops[i].http;
    struct collect_sources cs = {.set = set,
                                 .cat = d->cat,
                                 .ing = d->ing,
                                 .st = d->st,
                                 .watch = a->watch,
                                 .up = d->up,
                                 /* process totals, from any handle */
                                 .auth = a->nloops ? a->loops[0].s.auth : a->s.auth,
                                 .http = a->http,
                                 .access = a->access,
                                 .budget = a->s.budget, /* (NULL with loops: theirs) */
                                 .disco = d->disco,
                                 .discovery = a->s.discovery,
                                 .loops = a->nloops ? a->loop_sum : NULL,
                                 .loop_http = a->loop_http,
                                 .nloops = a->nloops};
    collect_register(a->metrics, &cs);
    for (unsigned i = 0; i < a->nloops; i++) {
        struct sloop *l = &a->loops[i];
        int e = pthread_create(&l->thread, NULL, loop_main, l);
        if (e) {
            snprintf(err, errlen, "serving loop %u: cannot start its thread: %s", i, strerror(e));
            app_free(a);
            return -e;
        }
        l->running = true;
    }
    log_info("kwc: %u serving loop%s (--serving-threads)", a->nloops, a->nloops == 1 ? "" : "s");
    *out = a;
    return 0;
}

int
app_port(const struct app *a)
{
    return http_server_port(a->http, 0);
}

static void
on_loop_drain(void *arg)
{
    struct sloop *l = arg;
    http_server_shutdown(l->http);
}

void
app_drain(struct app *a)
{
    assert(a->magic == APP_MAGIC);
    /* the watch streams end first: over HTTP/2 their connection can only
     * close once they did, and they never end on their own */
    watch_pool_end_streams(a->watch);
    http_server_shutdown(a->http);
    for (unsigned i = 0; i < a->nloops; i++)
        mailbox_post(a->loops[i].mb, on_loop_drain, &a->loops[i]);
}

size_t
app_listen_fds(const struct app *a, int *fds, size_t max)
{
    return http_server_listen_fds(a->http, fds, max);
}

void
app_shutting_down(struct app *a)
{
    assert(a->magic == APP_MAGIC);
    if (a->s.front)
        front_shutting_down(a->s.front);
    for (unsigned i = 0; i < a->nloops; i++)
        front_shutting_down(a->loops[i].s.front);
}

void
app_busy(const struct app *a, struct app_busy *out)
{
    assert(a->magic == APP_MAGIC);
    struct http_server_stats hs;
    http_server_stats(a->http, &hs);
    out->requests = http_server_requests(a->http);
    out->connections = (unsigned)hs.open;
    for (unsigned i = 0; i < a->nloops; i++) {
        http_server_stats(a->loops[i].http, &hs);
        out->connections += (unsigned)hs.open + atomic_load(&a->loops[i].pending);
        out->requests += http_server_requests(a->loops[i].http);
    }
    out->watches = watch_pool_streams(a->watch);
}

void
app_free(struct app *a)
{
    if (!a)
        return;
    assert(a->magic == APP_MAGIC);
    refl_ingest_unsubscribe(a->ing, a);
    if (a->disco)
        disco_unsubscribe(a->disco, a);
    catalog_unsubscribe(a->cat, a);
    if (a->nloops)
        catalog_set_quiesce(a->cat, NULL, NULL); /* (a round in flight ends below) */
    /* the serving loops stop; from here the main thread owns what they held */
    stop_loops(a);
    /* watch streams end first (terminal chunks), while the store is open */
    refl_ingest_unsubscribe(a->ing, a->watch);
    catalog_set_busy(a->cat, NULL, NULL);
    catalog_set_end(a->cat, NULL, NULL);
    watch_pool_free(a->watch);
    a->watch = NULL;
    /* close what is still open: each request's on_close runs (passthroughs
     * cancel their transfers, cached lists end) */
    http_server_free(a->http);
    for (unsigned i = 0; i < a->nloops; i++) {
        /* handed over but never adopted */
        mailbox_free(a->loops[i].mb);
        a->loops[i].mb = NULL;
        loop_free(&a->loops[i]);
    }
    free(a->loops);
    if (a->auth_shared) {
        struct auth_stats as;
        auth_shared_stats(a->auth_shared, &as);
        log_auth_stats(&as);
        auth_shared_free(a->auth_shared);
    }
    if (a->s.front) {
        refl_ingest_unsubscribe(a->ing, a->s.front);
        if (a->disco)
            disco_unsubscribe(a->disco, a->s.front);
    }
    if (a->s.serve)
        refl_ingest_unsubscribe(a->ing, a->s.serve);
    stack_free(&a->s);
    if (a->s.auth) {
        struct auth_stats as;
        auth_stats(a->s.auth, &as);
        log_auth_stats(&as);
    }
    auth_free(a->s.auth);
    access_free(a->access);
    metrics_free(a->metrics);
    collect_loop_free(a->loop_sum);
    free(a->loop_http);
    http_limits_free(a->limits);
    mailbox_free(a->mb);
    a->magic = 0;
    free(a);
}
