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
#include "kwc/front.h"
#include "kwc/http.h"
#include "kwc/log.h"
#include "kwc/metrics.h"
#include "kwc/passthrough.h"
#include "kwc/reflector.h"
#include "kwc/serve.h"
#include "kwc/watch.h"

#define APP_MAGIC 0x61707020u /* "app " */

struct app {
    uint32_t magic;
    struct refl_ingest *ing;
    struct catalog *cat;
    struct disco *disco;
    struct pt_options pt_short, pt_long;
    struct pt_budget *budget; /* --max-passthrough-buffer */
    struct serve *serve;
    struct watch_pool *watch;
    struct discovery *discovery; /* discovery answered from the copy (--serve-discovery) */
    struct auth *auth;           /* NULL: --auth none */
    struct metrics *metrics;
    struct access *access;
    struct front *front;
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
log_auth_stats(const struct auth *auth)
{
    struct auth_stats as;
    auth_stats(auth, &as);
    log_info("auth: %llu TokenReviews (%llu answered from the cache), %llu SubjectAccessReviews "
             "(%llu from the cache, %llu coalesced); %llu allowed, %llu denied, %llu errors",
             (unsigned long long)as.token_reviews, (unsigned long long)as.token_cache_hits,
             (unsigned long long)as.sar_sent, (unsigned long long)as.sar_cache_hits,
             (unsigned long long)as.sar_coalesced, (unsigned long long)as.authz_allowed,
             (unsigned long long)as.authz_denied, (unsigned long long)as.authz_errors);
}

int
app_new(const struct app_deps *d, struct app **out, char *err, size_t errlen)
{
    const struct kwc_config *cfg = d->cfg;
    struct app *a = xcalloc(1, sizeof(*a));
    a->magic = APP_MAGIC;
    a->ing = d->ing;
    a->cat = d->cat;
    a->disco = d->disco;
    const struct refl_set *set = catalog_set(d->cat);
    a->pt_short = (struct pt_options){
        .max_request_buffer = (size_t)cfg->max_request_buffer,
        .max_response_buffer = (size_t)cfg->max_response_buffer,
        .strip_credentials = true,
    };
    a->budget = pt_budget_new((size_t)cfg->max_passthrough_buffer);
    a->pt_short.budget = a->budget;
    a->pt_long = a->pt_short;
    a->pt_long.long_running = true;
    struct serve_options so = {
        .too_large =
            strcmp(cfg->too_large_rv, "504") == 0 ? DECIDE_TOO_LARGE_504 : DECIDE_TOO_LARGE_PASS,
        .wait_ms = (int)cfg->rv_wait_ms,
        .max_buffer = (size_t)cfg->max_list_buffer,
        .up = d->up,
        .pt = &a->pt_short,
    };
    a->serve = serve_new(d->base, d->st, set, &so);
    struct watch_options wo = {
        .workers = (unsigned)cfg->watch_workers,
        .budget = (size_t)cfg->watch_budget,
        .window_bytes = (size_t)cfg->watch_window,
        .bookmark_ms = (uint64_t)cfg->bookmark_interval_ms,
        .wait_ms = (int)cfg->rv_wait_ms,
        .too_large = so.too_large,
        .coalesce_max_us = (unsigned)cfg->watch_coalesce_max_ms * 1000,
        .no_coalesce = cfg->watch_coalesce_max_ms == 0,
    };
    a->watch = watch_pool_new(d->base, d->st, set, &wo);
    a->discovery = discovery_new(cfg->serve_discovery ? d->disco : NULL);
    a->metrics = metrics_new();
    struct access_options aco = {.log = cfg->access_log || log_enabled(LOG_DEBUG),
                                 .level = cfg->access_log ? LOG_INFO : LOG_DEBUG};
    a->access = access_new(a->metrics, &aco);
    if (cfg->auth_delegated) {
        struct auth_options ao = {
            .anonymous = cfg->anonymous_auth,
            .token_ttl_s = (double)cfg->token_cache_ttl_ms / 1000.0,
            .token_fail_ttl_s = 10,
            .allow_ttl_s = (double)cfg->authz_allow_ttl_ms / 1000.0,
            .deny_ttl_s = (double)cfg->authz_deny_ttl_ms / 1000.0,
            .max_entries = 100000,
            .review_timeout_ms = (unsigned)cfg->review_timeout_ms,
            .max_reviews_per_source = cfg_per_source_reviews(cfg),
        };
        auth_new(d->base, d->up, &ao, &a->auth);
    }
    /* after every commit: requests waiting for an rv first, then watch
     * streams (the order of subscription is the order of the calls) */
    refl_ingest_subscribe(d->ing, serve_committed, NULL, a->serve);
    refl_ingest_subscribe(d->ing, watch_committed, watch_service_changed, a->watch);

    struct front_parts fp = {
        .base = d->base,
        .cat = d->cat,
        .start_wait_ms = (int)cfg->cache_start_timeout,
        .serve = a->serve,
        .watch = a->watch,
        .discovery = a->discovery,
        .up = d->up,
        .pt_short = &a->pt_short,
        .pt_long = &a->pt_long,
        .tunnel_connect_timeout_ms = (int)cfg->upstream_connect_timeout_ms,
        .auth = a->auth,
        .forward_token = cfg->forward_token,
        .tls = cfg->tls_cert_file != NULL,
        .accept_host = accept_host,
        .accept_host_arg = cfg,
        .metrics = a->metrics,
        .access = a->access,
    };
    a->front = front_new(&fp);
    /* requests waiting for a warming cache, after the watch streams */
    refl_ingest_subscribe(d->ing, front_caches_changed, front_cache_service, a->front);
    if (d->disco)
        disco_subscribe(d->disco, front_discovery_changed, a->front);
    catalog_set_busy(d->cat, cache_watched, a->watch);
    catalog_set_end(d->cat, cache_end_watchers, a);

    struct http_server_options ho = {
        .addrs = cfg->listen_addrs,
        .naddrs = cfg->n_listen,
        .listen_fds = d->listen_fds,
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
    int rc = http_server_new(d->base, &ho, front_on_request, a->front, &a->http, err, errlen);
    if (rc != 0) {
        refl_ingest_unsubscribe(d->ing, a->front);
        if (d->disco)
            disco_unsubscribe(d->disco, a->front);
        refl_ingest_unsubscribe(d->ing, a->watch);
        refl_ingest_unsubscribe(d->ing, a->serve);
        catalog_set_busy(d->cat, NULL, NULL);
        catalog_set_end(d->cat, NULL, NULL);
        front_free(a->front);
        auth_free(a->auth);
        watch_pool_free(a->watch);
        serve_free(a->serve);
        discovery_free(a->discovery);
        access_free(a->access);
        metrics_free(a->metrics);
        pt_budget_free(a->budget);
        free(a);
        return rc;
    }
    http_server_on_done(a->http, on_request_done, a);
    struct collect_sources cs = {.set = set,
                                 .cat = d->cat,
                                 .ing = d->ing,
                                 .st = d->st,
                                 .watch = a->watch,
                                 .up = d->up,
                                 .auth = a->auth,
                                 .http = a->http,
                                 .access = a->access,
                                 .budget = a->budget,
                                 .disco = d->disco,
                                 .discovery = a->discovery};
    collect_register(a->metrics, &cs);
    *out = a;
    return 0;
}

int
app_port(const struct app *a)
{
    return http_server_port(a->http, 0);
}

void
app_drain(struct app *a)
{
    assert(a->magic == APP_MAGIC);
    /* the watch streams end first: over HTTP/2 their connection can only
     * close once they did, and they never end on their own */
    watch_pool_end_streams(a->watch);
    http_server_shutdown(a->http);
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
    front_shutting_down(a->front);
}

void
app_busy(const struct app *a, struct app_busy *out)
{
    assert(a->magic == APP_MAGIC);
    struct http_server_stats hs;
    http_server_stats(a->http, &hs);
    out->requests = http_server_requests(a->http);
    out->connections = (unsigned)hs.open;
    out->watches = watch_pool_streams(a->watch);
}

void
app_free(struct app *a)
{
    if (!a)
        return;
    assert(a->magic == APP_MAGIC);
    /* watch streams end first (terminal chunks), while the store is open */
    refl_ingest_unsubscribe(a->ing, a->watch);
    catalog_set_busy(a->cat, NULL, NULL);
    catalog_set_end(a->cat, NULL, NULL);
    watch_pool_free(a->watch);
    a->watch = NULL;
    /* close what is still open: each request's on_close runs (passthroughs
     * cancel their transfers, cached lists end) */
    http_server_free(a->http);
    refl_ingest_unsubscribe(a->ing, a->front);
    if (a->disco)
        disco_unsubscribe(a->disco, a->front);
    front_free(a->front);
    refl_ingest_unsubscribe(a->ing, a->serve);
    serve_free(a->serve);
    discovery_free(a->discovery);
    if (a->auth)
        log_auth_stats(a->auth);
    auth_free(a->auth);
    access_free(a->access);
    metrics_free(a->metrics);
    pt_budget_free(a->budget); /* after the server: every passthrough has closed */
    a->magic = 0;
    free(a);
}
