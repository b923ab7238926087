/*
 * collect.c — the scrape-time collectors (see collect.h).
 *
 * Every family here is read from state its module owns: counters written by
 * one thread (the watch workers' per-resource counters: relaxed atomic
 * loads, hub.h), the main loop's own structs (reflectors, upstream client,
 * HTTP server, auth: the scrape runs on that loop), and the store through a
 * short read transaction. Labels per cache: group, resource, encoding
 * ("json" or "protobuf", refl_desc's enc).
 */
#include "kwc/collect.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "kwc/access.h"
#include "kwc/auth.h"
#include "kwc/base.h"
#include "kwc/catalog.h"
#include "kwc/disco.h"
#include "kwc/discovery.h"
#include "kwc/http.h"
#include "kwc/metrics.h"
#include "kwc/passthrough.h"
#include "kwc/reflector.h"
#include "kwc/store.h"
#include "kwc/upstream.h"
#include "kwc/watch.h"

/* version: in auto mode two versions of one resource (autoscaling/v1 and
 * v2 horizontalpodautoscalers) may both have caches */
static const char *const cache_labels[] = {"group", "version", "resource", "encoding", "phase"};
#define NCACHE 4

static void
cache_values(const struct refl *r, const char **v)
{
    const struct refl_desc *d = refl_desc(r);
    v[0] = d->group ? d->group : "";
    v[1] = d->version ? d->version : "";
    v[2] = d->resource ? d->resource : "";
    v[3] = d->enc == KWC_ENC_PB ? "protobuf" : "json";
}

/* ---- caches: the store's numbers and the reflectors' counters ---- */

struct cache_row {
    struct store_res_info info;
    bool have_info;
    struct refl_counters ctr;
    bool synced, serving;
};

static void
cache_family(struct metrics_writer *w, const struct collect_sources *s,
             const struct cache_row *rows, const char *name, const char *help, enum metrics_type t,
             size_t off, bool info)
{
    metrics_write_family(w, name, help, t);
    for (size_t i = 0; i < s->set->n; i++) {
        if (info && !rows[i].have_info)
            continue;
        const char *v[NCACHE];
        cache_values(s->set->r[i], v);
        const char *base = info ? (const char *)&rows[i].info : (const char *)&rows[i].ctr;
        uint64_t x;
        memcpy(&x, base + off, sizeof(x));
        metrics_write_sample(w, name, cache_labels, v, NCACHE, (double)x);
    }
}

#define INFO(f) offsetof(struct store_res_info, f), true
#define CTR(f) offsetof(struct refl_counters, f), false

static void
collect_caches(const struct collect_sources *s, struct metrics_writer *w)
{
    struct cache_row *rows = xcalloc(s->set->n ? s->set->n : 1, sizeof(*rows));
    struct store_rtxn *t = NULL;
    if (store_rtxn_begin(s->st, &t) != 0)
        t = NULL;
    for (size_t i = 0; i < s->set->n; i++) {
        const struct refl_desc *d = refl_desc(s->set->r[i]);
        if (t && d->sres && store_info(t, d->sres, &rows[i].info) == 0)
            rows[i].have_info = true;
        refl_counters(s->set->r[i], &rows[i].ctr);
        rows[i].synced = refl_synced(s->set->r[i]);
        rows[i].serving = refl_serving(s->set->r[i]);
    }
    if (t)
        store_rtxn_end(t);

    cache_family(w, s, rows, "kwc_cache_objects", "Objects in the cache.", METRICS_GAUGE,
                 INFO(objects));
    cache_family(w, s, rows, "kwc_cache_resource_version",
                 "The newest resourceVersion the cache has reached (events and bookmarks).",
                 METRICS_GAUGE, INFO(rv));
    cache_family(w, s, rows, "kwc_cache_history_floor",
                 "The oldest resourceVersion a watch or an exact read can start from (older: 410).",
                 METRICS_GAUGE, INFO(floor));
    cache_family(w, s, rows, "kwc_cache_history_events", "Events in the cache's history window.",
                 METRICS_GAUGE, INFO(hist_events));
    cache_family(w, s, rows, "kwc_cache_history_bytes", "Bytes of the cache's history window.",
                 METRICS_GAUGE, INFO(hist_bytes));
    const char *sh[] = {"kwc_cache_synced", "kwc_cache_in_service"};
    const char *hh[] = {
        "1 once the cache's initial list has completed, else 0.",
        "1 while the cache answers requests (synced, not out of service for a "
        "failed write, a checksum or staleness), else 0: its requests pass through."};
    for (int k = 0; k < 2; k++) {
        metrics_write_family(w, sh[k], hh[k], METRICS_GAUGE);
        for (size_t i = 0; i < s->set->n; i++) {
            const char *v[NCACHE];
            cache_values(s->set->r[i], v);
            metrics_write_sample(w, sh[k], cache_labels, v, NCACHE,
                                 k == 0 ? rows[i].synced : rows[i].serving);
        }
    }

    cache_family(w, s, rows, "kwc_reflector_lists_total",
                 "Upstream LISTs started from their first page (initial, relists, retries).",
                 METRICS_COUNTER, CTR(lists));
    cache_family(w, s, rows, "kwc_reflector_relists_total",
                 "LISTs of a cache that had synced: after an upstream 410, or a rebuild.",
                 METRICS_COUNTER, CTR(relists));
    cache_family(w, s, rows, "kwc_reflector_expired_total",
                 "Upstream 410 Gone/Expired answers: a watch whose resourceVersion is too old (a "
                 "relist follows), a continue token that expired (the list restarts).",
                 METRICS_COUNTER, CTR(expired));
    cache_family(w, s, rows, "kwc_reflector_watches_total", "Upstream WATCHes started.",
                 METRICS_COUNTER, CTR(watches));
    cache_family(
        w, s, rows, "kwc_reflector_watch_restarts_total",
        "Upstream WATCHes started after the first (a dropped watch, its timeout, a relist).",
        METRICS_COUNTER, CTR(watch_restarts));
    cache_family(w, s, rows, "kwc_reflector_events_total",
                 "ADDED, MODIFIED and DELETED events received from the upstream watch.",
                 METRICS_COUNTER, CTR(events_in));
    const char *ph[] = {"discovery", "list", "watch"};
    metrics_write_family(w, "kwc_reflector_errors_total",
                         "Failed upstream attempts by phase, each followed by a backoff (a failed "
                         "write of a watch's events counts as watch).",
                         METRICS_COUNTER);
    for (size_t i = 0; i < s->set->n; i++)
        for (int p = 0; p < 3; p++) {
            const char *v[NCACHE + 1];
            cache_values(s->set->r[i], v);
            v[NCACHE] = ph[p];
            metrics_write_sample(w, "kwc_reflector_errors_total", cache_labels, v, NCACHE + 1,
                                 (double)rows[i].ctr.errors[p]);
        }
    metrics_write_family(w, "kwc_reflector_backoff_seconds",
                         "The base of the delay before the next upstream retry after a failure "
                         "(jittered +-50 %), doubled by each failure in a row, at most 30 s; 0 "
                         "once the cache has recovered (a list completed, or its watch has stayed "
                         "open 10 s): a failure then retries after 0.25-0.75 s.",
                         METRICS_GAUGE);
    for (size_t i = 0; i < s->set->n; i++) {
        const char *v[NCACHE];
        cache_values(s->set->r[i], v);
        metrics_write_sample(w, "kwc_reflector_backoff_seconds", cache_labels, v, NCACHE,
                             (double)rows[i].ctr.backoff_ms / 1000.0);
    }
    free(rows);

    struct store_env_info ei;
    if (store_env_info(s->st, &ei) == 0) {
        metrics_write_family(w, "kwc_lmdb_map_size_bytes",
                             "The LMDB map's size (--cache-map-size): the most the cache can hold.",
                             METRICS_GAUGE);
        metrics_write_sample(w, "kwc_lmdb_map_size_bytes", NULL, NULL, 0, (double)ei.map_size);
        metrics_write_family(w, "kwc_lmdb_map_used_bytes",
                             "Bytes of the LMDB map in use (pages up to the last written, free "
                             "pages kept for reuse included).",
                             METRICS_GAUGE);
        metrics_write_sample(w, "kwc_lmdb_map_used_bytes", NULL, NULL, 0, (double)ei.used_bytes);
        metrics_write_family(w, "kwc_lmdb_readers", "LMDB reader slots in use.", METRICS_GAUGE);
        metrics_write_sample(w, "kwc_lmdb_readers", NULL, NULL, 0, ei.readers);
    }
}

/* ---- watch fan-out ---- */

static const char *const from_labels[] = {"group", "version", "resource", "encoding", "from"};

static void
collect_watch(const struct collect_sources *s, struct metrics_writer *w)
{
    struct watch_res_stats *st = xcalloc(s->set->n ? s->set->n : 1, sizeof(*st));
    for (size_t i = 0; i < s->set->n; i++)
        watch_res_stats(s->watch, i, &st[i]);
    metrics_write_family(w, "kwc_watchers", "Open watch streams served from the cache.",
                         METRICS_GAUGE);
    for (size_t i = 0; i < s->set->n; i++) {
        const char *v[NCACHE];
        cache_values(s->set->r[i], v);
        metrics_write_sample(w, "kwc_watchers", cache_labels, v, NCACHE, (double)st[i].watchers);
    }
    metrics_write_family(w, "kwc_watchers_lagging",
                         "Watchers catching up (over --watch-budget, or resuming from a "
                         "resourceVersion): they get no live events until they have caught up.",
                         METRICS_GAUGE);
    for (size_t i = 0; i < s->set->n; i++) {
        const char *v[NCACHE];
        cache_values(s->set->r[i], v);
        metrics_write_sample(w, "kwc_watchers_lagging", cache_labels, v, NCACHE,
                             (double)st[i].hub.lagging);
    }
    const char *froms[] = {"live", "window", "store", "initial"};
    const char *names[] = {"kwc_watch_events_sent_total", "kwc_watch_sent_bytes_total"};
    const char *helps[] = {
        "Watch events handed to watchers, by where they came from: live (as committed), window "
        "(catch-up from the in-memory window of recent events), store (catch-up read from the LMDB "
        "history), initial (the initial state's ADDED events). Bookmarks not included.",
        "Bytes of the watch events counted in kwc_watch_events_sent_total (the events' own bytes, "
        "without HTTP framing)."};
    for (int k = 0; k < 2; k++) {
        metrics_write_family(w, names[k], helps[k], METRICS_COUNTER);
        for (size_t i = 0; i < s->set->n; i++) {
            const struct hub_res_stats *h = &st[i].hub;
            uint64_t x[4][2] = {{h->live, h->live_bytes},
                                {h->window, h->window_bytes},
                                {h->store, h->store_bytes},
                                {h->initial, h->initial_bytes}};
            for (int f = 0; f < 4; f++) {
                const char *v[NCACHE + 1];
                cache_values(s->set->r[i], v);
                v[NCACHE] = froms[f];
                metrics_write_sample(w, names[k], from_labels, v, NCACHE + 1, (double)x[f][k]);
            }
        }
    }
    metrics_write_family(w, "kwc_watch_bookmarks_sent_total",
                         "BOOKMARK events sent to watchers (periodic, and initial-events-end).",
                         METRICS_COUNTER);
    for (size_t i = 0; i < s->set->n; i++) {
        const char *v[NCACHE];
        cache_values(s->set->r[i], v);
        metrics_write_sample(w, "kwc_watch_bookmarks_sent_total", cache_labels, v, NCACHE,
                             (double)st[i].hub.bookmarks);
    }
    free(st);
    metrics_write_family(w, "kwc_watch_store_queued_bytes",
                         "Bytes read from the store for single watchers (initial state, catch-up "
                         "behind the window) queued on watch streams, not yet taken by their "
                         "sockets; past 32 MiB a worker reads more only for a stream that has "
                         "sent all it holds.",
                         METRICS_GAUGE);
    metrics_write_sample(w, "kwc_watch_store_queued_bytes", NULL, NULL, 0,
                         (double)watch_store_queued(s->watch));
}

static void
counter1(struct metrics_writer *w, const char *name, const char *help, const char *label,
         const char *const *vals, const uint64_t *x, size_t n)
{
    metrics_write_family(w, name, help, METRICS_COUNTER);
    for (size_t i = 0; i < n; i++)
        metrics_write_sample(w, name, label ? &label : NULL, label ? &vals[i] : NULL, label ? 1 : 0,
                             (double)x[i]);
}

/* ---- upstream, requests in flight ---- */

static void
collect_upstream(const struct collect_sources *s, struct metrics_writer *w)
{
    static const char *const lc[] = {"method", "code"};
    const struct up_metrics *m = up_client_metrics(s->up);
    metrics_write_family(w, "kwc_upstream_requests_total",
                         "Requests kwc sent to the upstream API server (its own lists and watches, "
                         "reviews, passthrough) by method and status code; <error>: no response, "
                         "<cancelled>: cancelled before one (the client left).",
                         METRICS_COUNTER);
    for (size_t i = 0; i < UP_NMETHODS; i++)
        for (unsigned c = 0; c < 502; c++) {
            if (!m->requests[i][c])
                continue;
            char code[16];
            if (c == UP_CODE_ERROR)
                snprintf(code, sizeof(code), "<error>");
            else if (c == UP_CODE_CANCELLED)
                snprintf(code, sizeof(code), "<cancelled>");
            else
                snprintf(code, sizeof(code), "%u", c + 100);
            const char *v[] = {up_method_names[i], code};
            metrics_write_sample(w, "kwc_upstream_requests_total", lc, v, 2,
                                 (double)m->requests[i][c]);
        }
    metrics_write_family(w, "kwc_upstream_request_duration_seconds",
                         "Time from sending a request to the upstream to its response head "
                         "(client-go's buckets).",
                         METRICS_HISTOGRAM);
    for (size_t i = 0; i < UP_NMETHODS; i++) {
        if (!m->latency[i].count)
            continue;
        const char *v[] = {up_method_names[i]};
        metrics_write_hist(w, "kwc_upstream_request_duration_seconds", lc, v, 1, &m->latency[i]);
    }
    struct up_stats us;
    up_client_stats(s->up, &us);
    metrics_write_family(w, "kwc_upstream_requests_in_flight",
                         "Requests to the upstream in progress (watches included).", METRICS_GAUGE);
    metrics_write_sample(w, "kwc_upstream_requests_in_flight", NULL, NULL, 0, (double)us.active);

    static const char *const pl[] = {"pool"};
    struct up_pool_stats ps[UP_NPOOLS];
    for (int p = 0; p < UP_NPOOLS; p++)
        up_client_pool_stats(s->up, (enum up_pool)p, &ps[p]);
    metrics_write_family(w, "kwc_upstream_connections",
                         "Connections to the upstream open now (idle ones included), by pool: "
                         "passthrough, cache (kwc's lists and watches), tokenreview, "
                         "subjectaccessreview.",
                         METRICS_GAUGE);
    for (int p = 0; p < UP_NPOOLS; p++)
        metrics_write_sample(w, "kwc_upstream_connections", pl, &up_pool_names[p], 1,
                             (double)ps[p].conns);
    metrics_write_family(w, "kwc_upstream_connections_limit",
                         "The most connections a pool opens (--max-upstream-connections, one per "
                         "cache, --max-review-connections); its requests past it wait.",
                         METRICS_GAUGE);
    for (int p = 0; p < UP_NPOOLS; p++)
        metrics_write_sample(w, "kwc_upstream_connections_limit", pl, &up_pool_names[p], 1,
                             (double)ps[p].max_conns);
    metrics_write_family(w, "kwc_upstream_pool_requests_in_flight",
                         "Requests to the upstream in progress by pool, those waiting for a "
                         "connection included.",
                         METRICS_GAUGE);
    for (int p = 0; p < UP_NPOOLS; p++)
        metrics_write_sample(w, "kwc_upstream_pool_requests_in_flight", pl, &up_pool_names[p], 1,
                             (double)ps[p].active);

    if (s->budget) {
        struct pt_budget_stats bs;
        pt_budget_stats(s->budget, &bs);
        metrics_write_family(w, "kwc_passthrough_buffered_bytes",
                             "Passthrough response bytes queued to clients, all together.",
                             METRICS_GAUGE);
        metrics_write_sample(w, "kwc_passthrough_buffered_bytes", NULL, NULL, 0, (double)bs.queued);
        metrics_write_family(w, "kwc_passthrough_buffer_limit_bytes",
                             "--max-passthrough-buffer: past it, the passthroughs holding the most "
                             "stop reading from the upstream.",
                             METRICS_GAUGE);
        metrics_write_sample(w, "kwc_passthrough_buffer_limit_bytes", NULL, NULL, 0,
                             (double)bs.max);
        metrics_write_family(w, "kwc_passthrough_paused",
                             "Passthroughs not reading from the upstream now because of "
                             "--max-passthrough-buffer.",
                             METRICS_GAUGE);
        metrics_write_sample(w, "kwc_passthrough_paused", NULL, NULL, 0, (double)bs.paused);
        metrics_write_family(w, "kwc_passthrough_client_paused",
                             "Passthroughs not reading from the upstream now because their client "
                             "has more than --max-response-buffer queued (it reads slower than the "
                             "upstream sends).",
                             METRICS_GAUGE);
        metrics_write_sample(w, "kwc_passthrough_client_paused", NULL, NULL, 0,
                             (double)bs.out_paused);
        uint64_t np = bs.pauses;
        counter1(w, "kwc_passthrough_buffer_pauses_total",
                 "Times a passthrough stopped reading from the upstream because of "
                 "--max-passthrough-buffer.",
                 NULL, NULL, &np, 1);
    }

    static const char *const sl[] = {"source"};
    metrics_write_family(w, "kwc_requests_in_flight",
                         "Client requests in progress by source (upstream: passthrough and "
                         "tunnels; cache: lists, gets and watch streams).",
                         METRICS_GAUGE);
    for (int src = 0; src < ACCESS_NSOURCES; src++) {
        const char *v[] = {access_source_name((enum access_source)src)};
        metrics_write_sample(w, "kwc_requests_in_flight", sl, v, 1,
                             (double)access_in_flight(s->access, (enum access_source)src));
    }
}

/* ---- the HTTP server, authentication, the process ---- */

static void
collect_http(const struct collect_sources *s, struct metrics_writer *w)
{
    struct http_server_stats hs;
    http_server_stats(s->http, &hs);
    metrics_write_family(w, "kwc_http_connections_open",
                         "Open client connections (watch streams and tunnels included): what "
                         "--max-connections counts.",
                         METRICS_GAUGE);
    metrics_write_sample(w, "kwc_http_connections_open", NULL, NULL, 0,
                         (double)(hs.open + hs.taken));
    metrics_write_family(w, "kwc_http_connections_limit",
                         "--max-connections as resolved against the open-file limit.",
                         METRICS_GAUGE);
    metrics_write_sample(w, "kwc_http_connections_limit", NULL, NULL, 0,
                         (double)hs.max_connections);
    uint64_t acc = hs.accepted;
    counter1(w, "kwc_http_connections_accepted_total", "Client connections accepted.", NULL, NULL,
             &acc, 1);
    const char *rr[] = {"max_connections", "max_connections_per_source", "out_of_descriptors"};
    uint64_t rx[] = {hs.refused, hs.refused_per_source, hs.accept_errors};
    counter1(w, "kwc_http_connections_refused_total",
             "Client connections refused: over --max-connections or "
             "--max-connections-per-source (a 429, or a close before the TLS handshake), or "
             "accept(2) failing for want of descriptors or memory (accepting pauses for 100 ms).",
             "reason", rr, rx, 3);
    metrics_write_family(w, "kwc_http_connection_sources",
                         "Source addresses with an open client connection counted against "
                         "--max-connections-per-source.",
                         METRICS_GAUGE);
    metrics_write_sample(w, "kwc_http_connection_sources", NULL, NULL, 0, (double)hs.sources);
    const char *cr[] = {"header_timeout", "idle_timeout", "tls_handshake_failed", "bad_request"};
    uint64_t cx[] = {hs.header_timeouts, hs.idle_timeouts, hs.tls_handshake_failed,
                     hs.bad_requests};
    counter1(w, "kwc_http_connections_closed_total",
             "Client connections kwc closed for a reason of its own: --request-header-timeout, "
             "--idle-timeout, a failed TLS handshake, a malformed request (400/414/431/501).",
             "reason", cr, cx, 4);
    /* by protocol: HTTP/1.x connections (taken ones, watch streams and
     * tunnels, are HTTP/1.1) and HTTP/2 ones (ALPN ids as label values) */
    static const char *const proto_l = "protocol";
    const char *pv[] = {"http/1.1", "h2"};
    metrics_write_family(w, "kwc_http_connections_open_by_protocol",
                         "Open client connections by protocol: http/1.1 (HTTP/1.0 included; "
                         "watch streams and tunnels too), h2.",
                         METRICS_GAUGE);
    metrics_write_sample(w, "kwc_http_connections_open_by_protocol", &proto_l, &pv[0], 1,
                         (double)(hs.open - hs.h2_open + hs.taken));
    metrics_write_sample(w, "kwc_http_connections_open_by_protocol", &proto_l, &pv[1], 1,
                         (double)hs.h2_open);
    uint64_t h2a = hs.h2_accepted;
    counter1(w, "kwc_http2_connections_total",
             "Client connections that spoke HTTP/2 (ALPN h2, or the preface in plaintext).", NULL,
             NULL, &h2a, 1);
    metrics_write_family(w, "kwc_http2_streams_open", "HTTP/2 streams open now.", METRICS_GAUGE);
    metrics_write_sample(w, "kwc_http2_streams_open", NULL, NULL, 0, (double)hs.h2_streams_open);
    metrics_write_family(w, "kwc_http2_queued_bytes",
                         "Response bytes queued in HTTP/2 streams now (bounded per connection).",
                         METRICS_GAUGE);
    metrics_write_sample(w, "kwc_http2_queued_bytes", NULL, NULL, 0, (double)hs.h2_queued);
    uint64_t h2s = hs.h2_streams_total;
    counter1(w, "kwc_http2_streams_total", "HTTP/2 streams (requests) opened by clients.", NULL,
             NULL, &h2s, 1);
    const char *rsr[] = {"client", "refused", "client_error"};
    uint64_t rsx[] = {hs.h2_resets, hs.h2_refused, hs.h2_resets_server};
    counter1(w, "kwc_http2_stream_resets_total",
             "HTTP/2 streams reset: by the client (RST_STREAM), refused by kwc (past "
             "--http2-max-streams-per-connection or --max-held-body-buffer), or reset by kwc "
             "for the client's error (flow control, a malformed request, a body past the "
             "discard limit). All count against the connection's reset budget.",
             "reason", rsr, rsx, 3);
    metrics_write_family(w, "kwc_http2_held_body_bytes",
                         "Request-body bytes held in HTTP/2 streams now (bounded by "
                         "--max-held-body-buffer for requests waiting for authentication).",
                         METRICS_GAUGE);
    metrics_write_sample(w, "kwc_http2_held_body_bytes", NULL, NULL, 0, (double)hs.h2_body_held);
    uint64_t hr = hs.h2_held_refused;
    counter1(w, "kwc_http2_held_body_refused_total",
             "HTTP/2 streams refused because request bodies held for authentication passed "
             "--max-held-body-buffer.",
             NULL, NULL, &hr, 1);
    uint64_t hb[] = {hs.h2_bytes_in, hs.h2_header_bytes};
    const char *hbk[] = {"received", "header_fields_decoded"};
    counter1(w, "kwc_http2_bytes_total",
             "HTTP/2 bytes clients sent (received; after TLS), and the header fields kwc decoded "
             "from them (header_fields_decoded: name + value + 32 per field, HPACK's measure); "
             "the second is bounded by the first (HPACK bombs).",
             "what", hbk, hb, 2);
    uint64_t hf = hs.h2_hpack_floods;
    counter1(w, "kwc_http2_hpack_floods_total",
             "HTTP/2 connections ended (GOAWAY ENHANCE_YOUR_CALM) for decoding far more header "
             "data than they sent (HPACK bombs).",
             NULL, NULL, &hf, 1);
    uint64_t ga = hs.h2_goaways;
    counter1(w, "kwc_http2_goaways_total",
             "GOAWAY frames kwc sent: shutdown, protocol errors, floods and rapid resets "
             "(ENHANCE_YOUR_CALM).",
             NULL, NULL, &ga, 1);
    uint64_t rl = hs.tls_reloads;
    counter1(w, "kwc_tls_certificate_reloads_total",
             "Times the serving certificate was reloaded after its files changed.", NULL, NULL, &rl,
             1);
    const char *tr[] = {"kernel", "openssl"};
    uint64_t tlx[] = {hs.tls_records_kernel, hs.tls_records_openssl};
    counter1(w, "kwc_tls_connections_total",
             "TLS handshakes completed, by who makes the connection's records: the kernel "
             "(kernel TLS, --tls-kernel) or OpenSSL.",
             "records", tr, tlx, 2);

    if (s->auth) {
        struct auth_stats as;
        auth_stats(s->auth, &as);
        const char *am[] = {"certificate", "token", "anonymous"};
        uint64_t ax[] = {as.authn_cert, as.authn_token, as.authn_anonymous};
        counter1(w, "kwc_authenticated_requests_total",
                 "Requests authenticated, by method (--auth delegated).", "method", am, ax, 3);
        uint64_t ad = as.authn_denied;
        counter1(w, "kwc_authentication_failures_total",
                 "Requests whose authentication failed (answered 401).", NULL, NULL, &ad, 1);
        const char *dd[] = {"allowed", "denied", "error"};
        uint64_t dx[] = {as.authz_allowed, as.authz_denied, as.authz_errors};
        counter1(w, "kwc_authorization_decisions_total",
                 "Authorization decisions kwc made (SubjectAccessReviews asked or answered from "
                 "the cache), by decision.",
                 "decision", dd, dx, 3);
        const char *rk[] = {"sent", "cache_hit", "error"};
        uint64_t tx[] = {as.token_reviews, as.token_cache_hits, as.token_review_errors};
        counter1(w, "kwc_token_reviews_total",
                 "TokenReviews: sent to the upstream, answered from the cache, failed.", "result",
                 rk, tx, 3);
        const char *sk[] = {"sent", "cache_hit", "coalesced"};
        uint64_t sx[] = {as.sar_sent, as.sar_cache_hits, as.sar_coalesced};
        counter1(w, "kwc_subject_access_reviews_total",
                 "SubjectAccessReviews: sent to the upstream, answered from the cache, joined to "
                 "an identical one in flight.",
                 "result", sk, sx, 3);
        uint64_t rc = as.reviews_cancelled;
        counter1(w, "kwc_reviews_cancelled_total",
                 "TokenReviews and SubjectAccessReviews cancelled because every request waiting "
                 "for them went away.",
                 NULL, NULL, &rc, 1);
        uint64_t rt = as.reviews_timed_out;
        counter1(w, "kwc_reviews_timed_out_total",
                 "TokenReviews and SubjectAccessReviews that had no answer within "
                 "--review-timeout (their callers got a failed review's answer).",
                 NULL, NULL, &rt, 1);
        const char *rvk[] = {"tokenreview", "subjectaccessreview"};
        uint64_t rf[] = {as.token_reviews_refused, as.sar_refused};
        counter1(w, "kwc_reviews_refused_total",
                 "Requests answered 429 because their source address had "
                 "--max-reviews-per-source reviews in flight in that review's pool "
                 "(SubjectAccessReviews: of callers not authenticated).",
                 "review", rvk, rf, 2);
        uint64_t rff = as.token_reviews_refused_failed;
        counter1(w, "kwc_token_reviews_refused_rejected_total",
                 "Requests answered 429 because the upstream rejected 2 x "
                 "--max-reviews-per-source TokenReviews of their source address in the last "
                 "second (bogus tokens).",
                 NULL, NULL, &rff, 1);
        metrics_write_family(w, "kwc_review_rejected_sources",
                             "Source addresses with a TokenReview rejected in the last second.",
                             METRICS_GAUGE);
        metrics_write_sample(w, "kwc_review_rejected_sources", NULL, NULL, 0,
                             (double)as.failing_sources);
        metrics_write_family(w, "kwc_review_sources",
                             "Source addresses with a review counted in flight, per review pool "
                             "(an address in both counts twice).",
                             METRICS_GAUGE);
        metrics_write_sample(w, "kwc_review_sources", NULL, NULL, 0, (double)as.review_sources);
    }
}

static void
collect_process(struct metrics_writer *w)
{
    FILE *f = fopen("/proc/self/stat", "r");
    if (f) {
        char buf[2048];
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        const char *p = strrchr(buf, ')');
        unsigned long utime = 0, stime = 0;
        long rss = 0;
        /* fields after the command: state(3) ... utime(14) stime(15) ... rss(24) */
        if (p && sscanf(p + 2,
                        "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu %*d %*d %*d %*d "
                        "%*d %*d %*u %*u %ld",
                        &utime, &stime, &rss) == 3) {
            double tick = (double)sysconf(_SC_CLK_TCK);
            metrics_write_family(w, "process_cpu_seconds_total",
                                 "Total user and system CPU time spent in seconds.",
                                 METRICS_COUNTER);
            metrics_write_sample(w, "process_cpu_seconds_total", NULL, NULL, 0,
                                 (double)(utime + stime) / tick);
            metrics_write_family(w, "process_resident_memory_bytes",
                                 "Resident memory size in bytes.", METRICS_GAUGE);
            metrics_write_sample(w, "process_resident_memory_bytes", NULL, NULL, 0,
                                 (double)rss * (double)sysconf(_SC_PAGESIZE));
        }
    }
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        long fds = 0;
        for (struct dirent *e; (e = readdir(d));)
            fds += e->d_name[0] != '.';
        closedir(d);
        metrics_write_family(w, "process_open_fds", "Number of open file descriptors.",
                             METRICS_GAUGE);
        metrics_write_sample(w, "process_open_fds", NULL, NULL, 0, (double)(fds - 1));
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        metrics_write_family(w, "process_max_fds", "Maximum number of open file descriptors.",
                             METRICS_GAUGE);
        metrics_write_sample(w, "process_max_fds", NULL, NULL, 0, (double)rl.rlim_cur);
    }
}

/* The catalog (catalog.h): how many caches, and what started, stopped and
 * dropped them. */
static void
collect_catalog(const struct collect_sources *s, struct metrics_writer *w)
{
    if (!s->cat)
        return;
    struct catalog_stats cs;
    catalog_stats(s->cat, &cs);
    static const struct {
        const char *name, *help;
        enum metrics_type t;
        size_t off;
    } rows[] = {
        {"kwc_caches", "Caches kwc has made (each resource and encoding is one).", METRICS_GAUGE,
         offsetof(struct catalog_stats, caches)},
        {"kwc_caches_running", "Caches with their upstream list and watch running.", METRICS_GAUGE,
         offsetof(struct catalog_stats, running)},
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(rows); i++) {
        size_t v;
        memcpy(&v, (const char *)&cs + rows[i].off, sizeof(v));
        metrics_write_family(w, rows[i].name, rows[i].help, rows[i].t);
        metrics_write_sample(w, rows[i].name, NULL, NULL, 0, (double)v);
    }
    static const char *const ev_label[] = {"event"};
    const struct {
        const char *event;
        uint64_t n;
    } evs[] = {{"started", cs.started},
               {"idle_stopped", cs.idle_stops},
               {"data_dropped", cs.dropped},
               {"vanished", cs.vanished},
               {"refused_max_caches", cs.refused_max}};
    metrics_write_family(w, "kwc_cache_lifecycle_total",
                         "Caches started on demand (new or resumed), stopped for "
                         "--cache-idle-timeout, whose data went for --cache-disk-budget, whose "
                         "resource left discovery, and requests that found --max-caches reached.",
                         METRICS_COUNTER);
    for (size_t i = 0; i < KWC_ARRAY_LEN(evs); i++) {
        const char *v[] = {evs[i].event};
        metrics_write_sample(w, "kwc_cache_lifecycle_total", ev_label, v, 1, (double)evs[i].n);
    }
}

/* ---- discovery: the copy and the requests it answers ---- */

static void
one(struct metrics_writer *w, const char *name, const char *help, enum metrics_type t, double v)
{
    metrics_write_family(w, name, help, t);
    metrics_write_sample(w, name, NULL, NULL, 0, v);
}

static void
collect_discovery(const struct collect_sources *s, struct metrics_writer *w)
{
    if (s->discovery) {
        struct discovery_stats ds;
        discovery_stats(s->discovery, &ds);
        static const char *const src[] = {"source"};
        const char *cache[] = {"cache"}, *up[] = {"upstream"};
        metrics_write_family(w, "kwc_discovery_requests_total",
                             "Discovery requests (/api, /apis and below, /version) by who "
                             "answered: kwc from its copy of the upstream's answers, or the "
                             "upstream.",
                             METRICS_COUNTER);
        metrics_write_sample(w, "kwc_discovery_requests_total", src, cache, 1, (double)ds.cache);
        metrics_write_sample(w, "kwc_discovery_requests_total", src, up, 1, (double)ds.upstream);
        one(w, "kwc_discovery_not_modified_total",
            "Discovery requests kwc answered 304 from its copy (If-None-Match of its ETag).",
            METRICS_COUNTER, (double)ds.not_modified);
    }
    if (!s->disco)
        return;
    struct disco_stats st;
    disco_stats(s->disco, &st);
    static const char *const res[] = {"result"};
    const char *ok[] = {"ok"}, *failed[] = {"failed"};
    metrics_write_family(w, "kwc_discovery_refreshes_total",
                         "Rounds of reading the upstream's discovery, by result.", METRICS_COUNTER);
    metrics_write_sample(w, "kwc_discovery_refreshes_total", res, ok, 1, (double)st.refreshes);
    metrics_write_sample(w, "kwc_discovery_refreshes_total", res, failed, 1,
                         (double)st.refresh_failures);
    one(w, "kwc_discovery_changes_total",
        "Refreshes that found the upstream's resources changed (their subscribers were told).",
        METRICS_COUNTER, (double)st.changes);
    one(w, "kwc_discovery_upstream_requests_total",
        "GET requests kwc sent the upstream for discovery (refreshes and its copy).",
        METRICS_COUNTER, (double)st.fetches);
    one(w, "kwc_discovery_upstream_not_modified_total",
        "Of kwc's discovery requests, those the upstream answered 304 Not Modified.",
        METRICS_COUNTER, (double)st.not_modified);
    one(w, "kwc_discovery_upstream_failures_total",
        "Of kwc's discovery requests, those that failed (no answer, or not 200 or 304).",
        METRICS_COUNTER, (double)st.fetch_failures);
    one(w, "kwc_discovery_ready", "1 once the upstream's discovery has been read.", METRICS_GAUGE,
        st.ready);
    one(w, "kwc_discovery_aggregated",
        "1 when the upstream serves aggregated discovery (apidiscovery.k8s.io).", METRICS_GAUGE,
        st.aggregated);
    one(w, "kwc_discovery_resources", "Resources the upstream's discovery lists.", METRICS_GAUGE,
        (double)st.resources);
    one(w, "kwc_discovery_copy_documents",
        "Answers of the upstream kwc keeps to answer discovery requests.", METRICS_GAUGE,
        (double)st.docs);
    one(w, "kwc_discovery_copy_bytes", "Bytes of those answers.", METRICS_GAUGE,
        (double)st.doc_bytes);
    if (st.last_refresh_age_s >= 0)
        one(w, "kwc_discovery_last_refresh_age_seconds",
            "Seconds since the upstream's discovery was last read in full.", METRICS_GAUGE,
            st.last_refresh_age_s);
}

static void
collect(void *arg, struct metrics_writer *w)
{
    const struct collect_sources *s = arg;
    collect_caches(s, w);
    collect_catalog(s, w);
    collect_watch(s, w);
    collect_upstream(s, w);
    collect_http(s, w);
    collect_discovery(s, w);
    collect_process(w);
}

void
collect_register(struct metrics *m, const struct collect_sources *src)
{
    struct collect_sources *s = xmalloc(sizeof(*s));
    *s = *src;
    metrics_collector_add(m, collect, s, free);
}
