/*
 * collect_test.c — proxy/ops/collect.c, the collectors behind /metrics
 * (include/kwc/collect.h), over real sources kept small:
 *   - a store in a scratch LMDB dir, with three objects and a bookmark in the
 *     JSON cache of v1/configmaps, nothing in the protobuf cache of
 *     apps/v1/deployments (two reflectors, so that label values differ);
 *   - the configmaps reflector started against a fake upstream (libevent's
 *     evhttp on a loopback ephemeral port, on the test's loop) that answers
 *     500 to everything: its discovery fails once, which the reflector
 *     counts (errors, backoff) and the upstream client too (requests by
 *     method and code, the latency histogram);
 *   - the watch pool over both caches (no watchers), the HTTP server with no
 *     listen address and a cap of two connections, three socketpair
 *     connections adopted (two open, one refused), the access records of two
 *     requests in flight, the passthrough budget, delegated auth.
 * The exposition is read by a small parser written from the format's rules
 * (metrics.h; Prometheus text format 0.0.4), independent of metrics.c:
 * every family has one HELP and one TYPE, before its samples, which follow
 * together; every sample belongs to the family above it (histograms:
 * _bucket, _sum, _count); label names are valid and the same for every
 * sample of a family (le aside); no series twice. Then each family kwc
 * documents is checked for its type and label names, and the values
 * against what the sources say (read by the test through their own
 * getters) and against what the test did to them.
 * promtool (Debian's prometheus package), when installed, checks the text
 * too; when it is not, that one check is skipped and says so.
 *
 * Waiting is running the loop (EVLOOP_ONCE) until the reflector has counted
 * the failure, bounded by a guard timer that only fires when it never does.
 * Never a sleep.
 */
#include "kwc/collect.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kwc/access.h"
#include "kwc/auth.h"
#include "kwc/base.h"
#include "kwc/http.h"
#include "kwc/kubeconfig.h"
#include "kwc/log.h"
#include "kwc/metrics.h"
#include "kwc/passthrough.h"
#include "kwc/reflector.h"
#include "kwc/store.h"
#include "kwc/upstream.h"
#include "kwc/watch.h"
#include "lmdbdir.h"
#include "tap.h"

#define GUARD_S 15 /* bound on the one wait; never reached when all is well */
#define BUDGET 123456
#define MAX_CONNS 2

/* ---- a parser of the text format ---- */

#define MAXFAM 128
#define MAXSAMP 2048

struct fam {
    char name[128], type[16];
    int helps, types;
    int first, nsamples; /* its samples: samp[first .. first+nsamples) */
    char labels[256];    /* label names of its first sample, "a,b" (le left out) */
};

struct samp {
    char series[512]; /* name{labels} as written */
    char name[128];
    double v;
};

struct expo {
    struct fam f[MAXFAM];
    int nf;
    struct samp s[MAXSAMP];
    int ns;
    int errors; /* rule violations (each printed as a TAP comment) */
};

static void
bad(struct expo *e, int line, const char *why, const char *text)
{
    e->errors++;
    printf("#   line %d: %s: %.200s\n", line, why, text);
}

static struct fam *
fam_find(struct expo *e, const char *name)
{
    for (int i = 0; i < e->nf; i++)
        if (strcmp(e->f[i].name, name) == 0)
            return &e->f[i];
    return NULL;
}

static bool
valid_name(const char *s, size_t n)
{
    if (n == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_' || s[0] == ':'))
        return false;
    for (size_t i = 1; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == ':'))
            return false;
    return true;
}

/* The label names of "{a="x",b="y\"z"}" at p (p at '{'), as "a,b" with le
 * left out; the end (after '}') or NULL when malformed. */
static const char *
parse_labels(const char *p, char *names, size_t len)
{
    names[0] = '\0';
    p++;
    while (*p != '}') {
        const char *k = p;
        while (*p && *p != '=')
            p++;
        if (*p != '=' || !valid_name(k, (size_t)(p - k)) || p[1] != '"')
            return NULL;
        if (!((p - k) == 2 && strncmp(k, "le", 2) == 0)) {
            if (names[0])
                strncat(names, ",", len - strlen(names) - 1);
            strncat(names, k,
                    (size_t)(p - k) < len - strlen(names) - 1 ? (size_t)(p - k)
                                                              : len - strlen(names) - 1);
        }
        p += 2;
        for (; *p && *p != '"'; p++)
            if (*p == '\\') {
                if (p[1] != '\\' && p[1] != '"' && p[1] != 'n')
                    return NULL;
                p++;
            } else if (*p == '\n') {
                return NULL;
            }
        if (*p != '"')
            return NULL;
        p++;
        if (*p == ',')
            p++;
        else if (*p != '}')
            return NULL;
    }
    return p + 1;
}

static bool
parse_value(const char *s, double *v)
{
    if (strcmp(s, "+Inf") == 0) {
        *v = INFINITY;
        return true;
    }
    if (strcmp(s, "-Inf") == 0) {
        *v = -INFINITY;
        return true;
    }
    if (strcmp(s, "NaN") == 0) {
        *v = NAN;
        return true;
    }
    char *end;
    *v = strtod(s, &end);
    return end != s && *end == '\0' && isfinite(*v);
}

static bool
ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static void
expo_parse(struct expo *e, const char *text)
{
    memset(e, 0, sizeof *e);
    struct fam *cur = NULL;
    int no = 0;
    for (const char *l = text; *l;) {
        const char *nl = strchr(l, '\n');
        no++;
        if (!nl) {
            bad(e, no, "the last line has no newline", l);
            break;
        }
        char line[4096];
        snprintf(line, sizeof line, "%.*s", (int)(nl - l), l);
        l = nl + 1;
        char name[128];
        if (strncmp(line, "# HELP ", 7) == 0) {
            const char *n = line + 7, *sp = strchr(n, ' ');
            if (!sp || !valid_name(n, (size_t)(sp - n)) || sp[1] == '\0') {
                bad(e, no, "HELP without a name and a text", line);
                continue;
            }
            snprintf(name, sizeof name, "%.*s", (int)(sp - n), n);
            struct fam *again = fam_find(e, name);
            if (again) {
                bad(e, no, "a family written twice", line);
                again->helps++;
                cur = again;
                continue;
            }
            if (e->nf == MAXFAM)
                abort();
            cur = &e->f[e->nf++];
            snprintf(cur->name, sizeof cur->name, "%s", name);
            cur->helps = 1;
            cur->first = e->ns;
        } else if (strncmp(line, "# TYPE ", 7) == 0) {
            const char *n = line + 7, *sp = strchr(n, ' ');
            if (!sp) {
                bad(e, no, "TYPE without a type", line);
                continue;
            }
            snprintf(name, sizeof name, "%.*s", (int)(sp - n), n);
            if (!cur || strcmp(cur->name, name) != 0 || cur->nsamples) {
                bad(e, no, "TYPE not right after its family's HELP", line);
                continue;
            }
            if (cur->types++)
                bad(e, no, "a second TYPE", line);
            snprintf(cur->type, sizeof cur->type, "%s", sp + 1);
            if (strcmp(cur->type, "counter") && strcmp(cur->type, "gauge") &&
                strcmp(cur->type, "histogram"))
                bad(e, no, "not counter, gauge or histogram", line);
        } else if (line[0] == '#' || line[0] == '\0') {
            bad(e, no, "a line kwc does not write", line);
        } else {
            const char *p = line;
            while (*p && *p != '{' && *p != ' ')
                p++;
            snprintf(name, sizeof name, "%.*s", (int)(p - line), line);
            char lnames[256] = "";
            if (*p == '{' && !(p = parse_labels(p, lnames, sizeof lnames))) {
                bad(e, no, "malformed labels", line);
                continue;
            }
            double v;
            if (*p != ' ' || !parse_value(p + 1, &v)) {
                bad(e, no, "malformed value", line);
                continue;
            }
            if (!cur || !cur->types) {
                bad(e, no, "a sample outside a family", line);
                continue;
            }
            bool mine = strcmp(name, cur->name) == 0;
            if (strcmp(cur->type, "histogram") == 0) {
                char b[160];
                mine = false;
                static const char *const sfx[] = {"_bucket", "_sum", "_count"};
                for (int i = 0; i < 3; i++) {
                    snprintf(b, sizeof b, "%s%s", cur->name, sfx[i]);
                    mine |= strcmp(name, b) == 0;
                }
                if (ends_with(name, "_bucket") != (strstr(line, "le=\"") != NULL))
                    bad(e, no, "le on a bucket and only there", line);
            }
            if (!mine) {
                bad(e, no, "a sample not of the family above it", line);
                continue;
            }
            if (cur->nsamples == 0)
                snprintf(cur->labels, sizeof cur->labels, "%s", lnames);
            else if (strcmp(cur->labels, lnames) != 0)
                bad(e, no, "label names differ within the family", line);
            struct samp *s = &e->s[e->ns];
            snprintf(s->series, sizeof s->series, "%.*s", (int)(p - line), line);
            for (int i = cur->first; i < e->ns; i++)
                if (strcmp(e->s[i].series, s->series) == 0)
                    bad(e, no, "a series written twice", line);
            snprintf(s->name, sizeof s->name, "%s", name);
            s->v = v;
            cur->nsamples++;
            if (++e->ns == MAXSAMP)
                abort();
        }
    }
    for (int i = 0; i < e->nf; i++)
        if (!e->f[i].types)
            bad(e, 0, "a family without TYPE", e->f[i].name);
}

/* The value of series (name{labels} exactly as written), NAN when absent. */
static double
val(const struct expo *e, const char *series)
{
    for (int i = 0; i < e->ns; i++)
        if (strcmp(e->s[i].series, series) == 0)
            return e->s[i].v;
    return NAN;
}

/* Samples of a family (all its names). */
static int
nsamples(struct expo *e, const char *family)
{
    struct fam *f = fam_find(e, family);
    return f ? f->nsamples : -1;
}

/* ---- the fake upstream: 500 to everything ---- */

struct fake {
    struct evhttp *http;
    int port, requests;
};

static void
fake_handle(struct evhttp_request *req, void *arg)
{
    struct fake *f = arg;
    f->requests++;
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"status\":\"Failure\","
                           "\"message\":\"fake\",\"reason\":\"InternalError\",\"code\":500}");
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    evhttp_send_reply(req, 500, "Internal Server Error", b);
    evbuffer_free(b);
}

/* ---- the sources ---- */

struct env {
    struct event_base *base;
    struct fake fk;
    struct kcfg *k;
    struct up_client *up;
    char dir[64];
    struct store *st;
    struct refl_ingest *ing;
    struct refl *refls[2];
    struct refl_set set; /* over refls */
    struct watch_pool *watch;
    struct auth *auth;
    struct http_server *http;
    int peers[3];
    struct metrics *m;
    struct access *acc;
    struct access_rec *recs[2];
    struct pt_budget *budget;
    struct event *guard;
    bool timed_out;
};

static void
on_guard(evutil_socket_t fd, short what, void *arg)
{
    ((struct env *)arg)->timed_out = true;
}

static void
on_request(void *arg, struct hreq *req)
{
}

/* Three objects at rv 1..3 and a bookmark at rv 10 in the configmaps cache. */
static void
fill_store(struct env *e)
{
    struct store_res *r = refl_desc(e->refls[0])->sres;
    struct store_wtxn *w;
    if (store_wtxn_begin(e->st, 1, &w) != 0)
        abort();
    for (int i = 1; i <= 3; i++) {
        char key[16], obj[64];
        snprintf(key, sizeof key, "ns/c%d", i);
        snprintf(obj, sizeof obj, "{\"metadata\":{\"name\":\"c%d\"}}", i);
        struct store_event ev = {.type = STORE_ADDED,
                                 .rv = (uint64_t)i,
                                 .key = key,
                                 .key_len = strlen(key),
                                 .obj = obj,
                                 .obj_len = strlen(obj)};
        if (store_wtxn_event(w, r, &ev) != 0)
            abort();
    }
    if (store_wtxn_rv(w, r, 10) != 0 || store_wtxn_commit(w) != 0)
        abort();
}

static void
env_init(struct env *e, bool with_auth, bool with_budget)
{
    memset(e, 0, sizeof *e);
    e->base = event_base_new();
    e->fk.http = evhttp_new(e->base);
    evhttp_set_gencb(e->fk.http, fake_handle, &e->fk);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(e->fk.http, "127.0.0.1", 0);
    if (!bs)
        abort();
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&sa, &sl);
    e->fk.port = ntohs(sa.sin_port);
    e->k = xcalloc(1, sizeof *e->k);
    e->k->server = xasprintf("http://127.0.0.1:%d", e->fk.port);
    struct up_options uo = {.connect_timeout_ms = 5000,
                            .header_timeout_ms = 10000,
                            .max_idle_conns = 8,
                            .max_conns = {[UP_POOL_PASSTHROUGH] = 8,
                                          [UP_POOL_CACHE] = 3,
                                          [UP_POOL_DISCOVERY] = 6,
                                          [UP_POOL_TOKENREVIEW] = 4,
                                          [UP_POOL_SAR] = 5}};
    char err[256] = "";
    if (up_client_new(e->base, e->k, &uo, &e->up, err, sizeof err) != 0) {
        printf("# up_client_new: %s\n", err);
        abort();
    }
    lmdbdir_make(e->dir, sizeof e->dir, "collect");
    struct store_options so;
    store_options_default(&so);
    so.map_size = 16 << 20;
    if (store_open(e->dir, &so, &e->st) != 0)
        abort();
    refl_ingest_new(e->base, e->st, NULL, &e->ing);
    if (refl_new(e->base, e->up, e->ing, "v1/configmaps", KWC_ENC_JSON, e->k->server, &e->refls[0],
                 err, sizeof err) != 0 ||
        refl_new(e->base, e->up, e->ing, "apps/v1/deployments", KWC_ENC_PB, e->k->server,
                 &e->refls[1], err, sizeof err) != 0) {
        printf("# refl_new: %s\n", err);
        abort();
    }
    e->set = (struct refl_set){.r = e->refls, .n = 2, .cap = 2};
    fill_store(e);
    struct watch_options wo = {.workers = 1,
                               .budget = 1 << 20,
                               .window_bytes = 1 << 20,
                               .bookmark_ms = 60000,
                               .wait_ms = 1000,
                               .too_large = DECIDE_TOO_LARGE_504};
    e->watch = watch_pool_new(e->base, e->st, &e->set, &wo);
    if (with_auth) {
        struct auth_options ao = {.token_ttl_s = 120,
                                  .token_fail_ttl_s = 10,
                                  .allow_ttl_s = 300,
                                  .deny_ttl_s = 30,
                                  .max_entries = 1000};
        auth_new(e->base, e->up, &ao, &e->auth);
    }
    struct http_server_options ho = {.max_connections = MAX_CONNS};
    if (http_server_new(e->base, &ho, on_request, e, &e->http, err, sizeof err) != 0) {
        printf("# http_server_new: %s\n", err);
        abort();
    }
    for (int i = 0; i < 3; i++) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
            abort();
        e->peers[i] = sv[0];
        http_server_adopt(e->http, sv[1], NULL, 0);
    }
    e->m = metrics_new();
    struct access_options aco = {.log = false, .level = LOG_DEBUG};
    e->acc = access_new(e->m, &aco);
    e->recs[0] = access_begin(e->acc);
    e->recs[1] = access_begin(e->acc);
    if (with_budget)
        e->budget = pt_budget_new(BUDGET);
    struct collect_sources cs = {.set = &e->set,
                                 .st = e->st,
                                 .watch = e->watch,
                                 .up = e->up,
                                 .auth = e->auth,
                                 .http = e->http,
                                 .access = e->acc,
                                 .budget = e->budget};
    collect_register(e->m, &cs);
    e->guard = evtimer_new(e->base, on_guard, e);
}

static void
env_fini(struct env *e)
{
    struct hreq_done d = {.method = "GET", .target = "/x", .status = 200};
    access_finish(e->recs[0], &d);
    access_finish(e->recs[1], &d);
    watch_pool_free(e->watch);
    http_server_free(e->http);
    for (int i = 0; i < 3; i++)
        close(e->peers[i]);
    auth_free(e->auth);
    metrics_free(e->m);
    access_free(e->acc);
    pt_budget_free(e->budget);
    refl_free(e->refls[0]);
    refl_free(e->refls[1]);
    refl_ingest_free(e->ing);
    up_client_free(e->up);
    store_close(e->st);
    lmdbdir_rm(e->dir);
    kcfg_free(e->k);
    evhttp_free(e->fk.http);
    event_free(e->guard);
    event_base_free(e->base);
}

/* Start the configmaps cache; run the loop until its discovery failed. */
static bool
fail_discovery(struct env *e)
{
    refl_start(e->refls[0]);
    struct timeval tv = {GUARD_S, 0};
    evtimer_add(e->guard, &tv);
    struct refl_counters c = {0};
    for (int turns = 0; turns < 1000000 && !e->timed_out; turns++) {
        refl_counters(e->refls[0], &c);
        if (c.errors[0] >= 1)
            break;
        event_base_loop(e->base, EVLOOP_ONCE);
    }
    evtimer_del(e->guard);
    return c.errors[0] >= 1;
}

static char *
render(struct env *e, struct expo *x)
{
    size_t len;
    char *text = metrics_render(e->m, &len);
    ok(strlen(text) == len, "rendered: its length as told, no NUL inside");
    expo_parse(x, text);
    is_int(x->errors, 0, "the text keeps the format's rules (each broken rule printed above)");
    return text;
}

/* ---- the families kwc documents ---- */

struct want {
    const char *name, *type, *labels;
};

static const struct want caches[] = {
    {"kwc_cache_objects", "gauge", "group,version,resource,encoding"},
    {"kwc_cache_resource_version", "gauge", "group,version,resource,encoding"},
    {"kwc_cache_history_floor", "gauge", "group,version,resource,encoding"},
    {"kwc_cache_history_events", "gauge", "group,version,resource,encoding"},
    {"kwc_cache_history_bytes", "gauge", "group,version,resource,encoding"},
    {"kwc_cache_synced", "gauge", "group,version,resource,encoding"},
    {"kwc_cache_in_service", "gauge", "group,version,resource,encoding"},
    {"kwc_cache_state", "gauge", "group,version,resource,encoding,state"},
    {"kwc_reflector_lists_total", "counter", "group,version,resource,encoding"},
    {"kwc_reflector_relists_total", "counter", "group,version,resource,encoding"},
    {"kwc_reflector_expired_total", "counter", "group,version,resource,encoding"},
    {"kwc_reflector_watches_total", "counter", "group,version,resource,encoding"},
    {"kwc_reflector_watch_restarts_total", "counter", "group,version,resource,encoding"},
    {"kwc_reflector_events_total", "counter", "group,version,resource,encoding"},
    {"kwc_reflector_errors_total", "counter", "group,version,resource,encoding,phase"},
    {"kwc_reflector_backoff_seconds", "gauge", "group,version,resource,encoding"},
    {"kwc_lmdb_map_size_bytes", "gauge", ""},
    {"kwc_lmdb_map_used_bytes", "gauge", ""},
    {"kwc_lmdb_readers", "gauge", ""},
    {"kwc_watchers", "gauge", "group,version,resource,encoding"},
    {"kwc_watchers_lagging", "gauge", "group,version,resource,encoding"},
    {"kwc_watch_events_sent_total", "counter", "group,version,resource,encoding,from"},
    {"kwc_watch_sent_bytes_total", "counter", "group,version,resource,encoding,from"},
    {"kwc_watch_bookmarks_sent_total", "counter", "group,version,resource,encoding"},
    {"kwc_watch_store_queued_bytes", "gauge", ""},
    {"kwc_upstream_requests_total", "counter", "method,code"},
    {"kwc_upstream_request_duration_seconds", "histogram", "method"},
    {"kwc_upstream_requests_in_flight", "gauge", ""},
    {"kwc_upstream_connections", "gauge", "pool"},
    {"kwc_upstream_connections_limit", "gauge", "pool"},
    {"kwc_upstream_pool_requests_in_flight", "gauge", "pool"},
    {"kwc_requests_in_flight", "gauge", "source"},
    {"kwc_http_connections_open", "gauge", ""},
    {"kwc_http_connections_limit", "gauge", ""},
    {"kwc_http_connections_accepted_total", "counter", ""},
    {"kwc_http_connections_refused_total", "counter", "reason"},
    {"kwc_http_connection_sources", "gauge", ""},
    {"kwc_http_connections_closed_total", "counter", "reason"},
    {"kwc_http_connections_open_by_protocol", "gauge", "protocol"},
    {"kwc_http2_connections_total", "counter", ""},
    {"kwc_http2_streams_open", "gauge", ""},
    {"kwc_http2_streams_total", "counter", ""},
    {"kwc_http2_stream_resets_total", "counter", "reason"},
    {"kwc_http2_goaways_total", "counter", ""},
    {"kwc_tls_certificate_reloads_total", "counter", ""},
    {"kwc_tls_connections_total", "counter", "records"},
    {"kwc_build_info", "gauge", "version,git_commit,tls_library,compiler,platform"},
    {"process_cpu_seconds_total", "counter", ""},
    {"process_resident_memory_bytes", "gauge", ""},
    {"process_open_fds", "gauge", ""},
    {"process_max_fds", "gauge", ""},
};

/* no sample until a cache has heard from the upstream (none has here) */
static const struct want heard_fams[] = {
    {"kwc_cache_last_event_age_seconds", "gauge", "group,version,resource,encoding"},
};

static const struct want budget_fams[] = {
    {"kwc_passthrough_buffered_bytes", "gauge", ""},
    {"kwc_passthrough_buffer_limit_bytes", "gauge", ""},
    {"kwc_passthrough_paused", "gauge", ""},
    {"kwc_passthrough_client_paused", "gauge", ""},
    {"kwc_passthrough_buffer_pauses_total", "counter", ""},
};

static const struct want auth_fams[] = {
    {"kwc_authenticated_requests_total", "counter", "method"},
    {"kwc_authentication_failures_total", "counter", ""},
    {"kwc_authorization_decisions_total", "counter", "decision"},
    {"kwc_token_reviews_total", "counter", "result"},
    {"kwc_subject_access_reviews_total", "counter", "result"},
    {"kwc_reviews_cancelled_total", "counter", ""},
    {"kwc_reviews_timed_out_total", "counter", ""},
    {"kwc_reviews_refused_total", "counter", "review"},
    {"kwc_review_sources", "gauge", ""},
};

/* present: each family there (its type, its label names when it has
 * samples; without any, a failure unless may_be_empty), else none of them. */
static void
check_fams(struct expo *x, const struct want *w, size_t n, bool present, bool may_be_empty)
{
    for (size_t i = 0; i < n; i++) {
        struct fam *f = fam_find(x, w[i].name);
        char what[200];
        if (!present) {
            snprintf(what, sizeof what, "%s: absent", w[i].name);
            ok(f == NULL, what);
            continue;
        }
        snprintf(what, sizeof what, "%s: present, HELP and TYPE once", w[i].name);
        ok(f && f->helps == 1 && f->types == 1, what);
        if (!f)
            continue;
        snprintf(what, sizeof what, "%s: %s", w[i].name, w[i].type);
        is_str(f->type, w[i].type, what);
        snprintf(what, sizeof what, "%s: labels {%s}", w[i].name, w[i].labels);
        if (f->nsamples)
            is_str(f->labels, w[i].labels, what);
        else if (!may_be_empty)
            ok(0, what);
        if (strcmp(w[i].type, "counter") == 0) {
            snprintf(what, sizeof what, "%s: a counter's name ends in _total", w[i].name);
            ok(ends_with(w[i].name, "_total"), what);
        }
    }
}

#define CM "{group=\"\",version=\"v1\",resource=\"configmaps\",encoding=\"json\"}"
#define DEP "{group=\"apps\",version=\"v1\",resource=\"deployments\",encoding=\"protobuf\"}"

/* The value of series s is v (NAN: absent). */
#define is_val(x, s, v, what)                                                                      \
    do {                                                                                           \
        double g_ = val((x), (s)), w_ = (v);                                                       \
        if (!tap_ok(isnan(w_) ? isnan(g_) : g_ == w_, __FILE__, __LINE__, (what)))                 \
            printf("#   %s: got %.17g, want %.17g\n", (s), g_, w_);                                \
    } while (0)

static void
check_caches(struct env *e, struct expo *x)
{
    /* the store, read by the test */
    struct store_rtxn *t;
    struct store_res_info ci = {0}, di = {0};
    store_rtxn_begin(e->st, &t);
    int crc = store_info(t, refl_desc(e->refls[0])->sres, &ci);
    int drc = store_info(t, refl_desc(e->refls[1])->sres, &di);
    store_rtxn_end(t);
    is_int(crc, 0, "the configmaps cache's info");
    is_int(ci.objects, 3, "...three objects");
    is_int(ci.rv, 10, "...rv 10");
    is_val(x, "kwc_cache_objects" CM, 3, "kwc_cache_objects: the store's 3");
    is_val(x, "kwc_cache_resource_version" CM, 10,
           "kwc_cache_resource_version: 10, the bookmark's");
    is_val(x, "kwc_cache_history_floor" CM, (double)ci.floor, "kwc_cache_history_floor");
    is_val(x, "kwc_cache_history_events" CM, 3, "kwc_cache_history_events: 3");
    ok(ci.hist_bytes > 0, "the history has bytes");
    is_val(x, "kwc_cache_history_bytes" CM, (double)ci.hist_bytes, "kwc_cache_history_bytes");
    if (drc == 0) {
        is_val(x, "kwc_cache_objects" DEP, (double)di.objects, "the empty cache's objects");
        is_val(x, "kwc_cache_resource_version" DEP, (double)di.rv, "...and rv");
    } else {
        is_val(x, "kwc_cache_objects" DEP, NAN, "no info for the empty cache: no sample");
        is_val(x, "kwc_cache_resource_version" DEP, NAN, "...no rv either");
    }
    is_val(x, "kwc_cache_synced" CM, refl_synced(e->refls[0]), "kwc_cache_synced");
    is_val(x, "kwc_cache_synced" DEP, 0, "kwc_cache_synced: 0, never started");
    is_val(x, "kwc_cache_in_service" CM, refl_serving(e->refls[0]), "kwc_cache_in_service");
    is_val(x, "kwc_cache_in_service" DEP, 0, "...0");

    /* the state, one series per state: 1 for the cache's own */
    enum refl_cache_state cs = refl_cache_state(e->refls[0]);
    ok(cs != REFL_CS_STOPPED, "the configmaps cache runs");
    for (int k = 0; k < REFL_CS_COUNT; k++) {
        char s[256];
        snprintf(s, sizeof s, "kwc_cache_state%.*s,state=\"%s\"}", (int)strlen(CM) - 1, CM,
                 refl_cache_state_label((enum refl_cache_state)k));
        is_val(x, s, k == (int)cs, "kwc_cache_state: 1 for its state, 0 for each other");
        snprintf(s, sizeof s, "kwc_cache_state%.*s,state=\"%s\"}", (int)strlen(DEP) - 1, DEP,
                 refl_cache_state_label((enum refl_cache_state)k));
        is_val(x, s, k == REFL_CS_STOPPED, "...the cache never started: stopped");
    }
    is_int(nsamples(x, "kwc_cache_state"), 2 * REFL_CS_COUNT, "...every state of each cache");
    double age;
    if (refl_heard_age(e->refls[0], &age))
        ok(!isnan(val(x, "kwc_cache_last_event_age_seconds" CM)),
           "kwc_cache_last_event_age_seconds: a sample once the upstream spoke");
    else
        is_val(x, "kwc_cache_last_event_age_seconds" CM, NAN, "...none before");
    is_val(x, "kwc_cache_last_event_age_seconds" DEP, NAN,
           "...none for a cache that never started (never NaN)");

    /* the reflectors' counters */
    struct refl_counters c, d;
    refl_counters(e->refls[0], &c);
    refl_counters(e->refls[1], &d);
    is_int(c.errors[0], 1, "the configmaps reflector: one failed discovery");
    is_val(x,
           "kwc_reflector_errors_total{group=\"\",version=\"v1\",resource=\"configmaps\",encoding="
           "\"json\","
           "phase=\"discovery\"}",
           1, "kwc_reflector_errors_total: discovery 1");
    is_val(x,
           "kwc_reflector_errors_total{group=\"\",version=\"v1\",resource=\"configmaps\",encoding="
           "\"json\","
           "phase=\"list\"}",
           (double)c.errors[1], "...list");
    is_val(x,
           "kwc_reflector_errors_total{group=\"\",version=\"v1\",resource=\"configmaps\",encoding="
           "\"json\","
           "phase=\"watch\"}",
           (double)c.errors[2], "...watch");
    is_val(x,
           "kwc_reflector_errors_total{group=\"apps\",version=\"v1\",resource=\"deployments\","
           "encoding=\"protobuf\",phase=\"discovery\"}",
           0, "...the other cache's: 0");
    is_int(nsamples(x, "kwc_reflector_errors_total"), 6, "...three phases for each cache");
    ok(c.backoff_ms > 0, "the failure set a backoff");
    is_val(x, "kwc_reflector_backoff_seconds" CM, (double)c.backoff_ms / 1000.0,
           "kwc_reflector_backoff_seconds: the counter's ms in seconds");
    is_val(x, "kwc_reflector_backoff_seconds" DEP, 0, "...0 for the other");
    is_val(x, "kwc_reflector_lists_total" CM, (double)c.lists, "kwc_reflector_lists_total");
    is_val(x, "kwc_reflector_watches_total" CM, (double)c.watches, "kwc_reflector_watches_total");
    is_val(x, "kwc_reflector_events_total" CM, (double)c.events_in, "kwc_reflector_events_total");
    is_val(x, "kwc_reflector_relists_total" DEP, (double)d.relists, "kwc_reflector_relists_total");
    is_int(nsamples(x, "kwc_reflector_lists_total"), 2, "one sample per cache");

    /* LMDB */
    struct store_env_info ei;
    is_int(store_env_info(e->st, &ei), 0, "store_env_info");
    is_val(x, "kwc_lmdb_map_size_bytes", 16 << 20, "kwc_lmdb_map_size_bytes: the map's 16 MiB");
    is_val(x, "kwc_lmdb_map_used_bytes", (double)ei.used_bytes, "kwc_lmdb_map_used_bytes");
    ok(ei.used_bytes > 0, "...some bytes used");
    is_val(x, "kwc_lmdb_readers", (double)ei.readers, "kwc_lmdb_readers");
}

static void
check_watch(struct env *e, struct expo *x)
{
    static const char *const froms[] = {"live", "window", "store", "initial"};
    for (size_t i = 0; i < 2; i++) {
        struct watch_res_stats ws;
        watch_res_stats(e->watch, i, &ws);
        const char *lab = i == 0 ? CM : DEP;
        char s[256];
        snprintf(s, sizeof s, "kwc_watchers%s", lab);
        is_val(x, s, (double)ws.watchers, "kwc_watchers");
        snprintf(s, sizeof s, "kwc_watchers_lagging%s", lab);
        is_val(x, s, (double)ws.hub.lagging, "kwc_watchers_lagging");
        snprintf(s, sizeof s, "kwc_watch_bookmarks_sent_total%s", lab);
        is_val(x, s, (double)ws.hub.bookmarks, "kwc_watch_bookmarks_sent_total");
        for (int f = 0; f < 4; f++) {
            snprintf(s, sizeof s, "kwc_watch_events_sent_total%.*s,from=\"%s\"}",
                     (int)strlen(lab) - 1, lab, froms[f]);
            ok(!isnan(val(x, s)), "kwc_watch_events_sent_total: each source of events");
            snprintf(s, sizeof s, "kwc_watch_sent_bytes_total%.*s,from=\"%s\"}",
                     (int)strlen(lab) - 1, lab, froms[f]);
            ok(!isnan(val(x, s)), "kwc_watch_sent_bytes_total: each source of events");
        }
    }
    is_int(nsamples(x, "kwc_watch_events_sent_total"), 8, "four sources for each cache");
}

static void
check_upstream(struct env *e, struct expo *x)
{
    const struct up_metrics *m = up_client_metrics(e->up);
    is_int(m->requests[0][500 - 100], 1, "the client counted one GET answered 500");
    is_str(up_method_names[0], "GET", "method 0 is GET");
    is_val(x, "kwc_upstream_requests_total{method=\"GET\",code=\"500\"}", 1,
           "kwc_upstream_requests_total: GET 500, 1");
    is_int(nsamples(x, "kwc_upstream_requests_total"), 1, "...and no other (zeros left out)");
    const struct metrics_hist *h = &m->latency[0];
    is_int(h->count, 1, "the client's latency histogram: one GET");
    is_val(x, "kwc_upstream_request_duration_seconds_count{method=\"GET\"}", 1, "..._count 1");
    is_val(x, "kwc_upstream_request_duration_seconds_sum{method=\"GET\"}", h->sum, "..._sum");
    is_val(x, "kwc_upstream_request_duration_seconds_bucket{method=\"GET\",le=\"+Inf\"}", 1,
           "...le=\"+Inf\" = count");
    /* cumulative buckets: each bound's count, in order, never falling */
    double prev = 0;
    bool rising = true;
    int nb = 0;
    uint64_t cum = 0;
    bool same = true;
    for (int i = 0; i < x->ns; i++) {
        if (strncmp(x->s[i].series,
                    "kwc_upstream_request_duration_seconds_bucket{method=\"GET\",le=\"", 62) != 0)
            continue;
        rising &= x->s[i].v >= prev;
        prev = x->s[i].v;
        if (nb < (int)h->n) {
            cum += h->counts[nb];
            same &= x->s[i].v == (double)cum;
        }
        nb++;
    }
    is_int(nb, metrics_client_nbuckets + 1, "client-go's buckets and +Inf");
    ok(rising, "...cumulative");
    ok(same, "...the histogram's counts summed");
    is_int(nsamples(x, "kwc_upstream_request_duration_seconds"), (int)metrics_client_nbuckets + 3,
           "one method observed: only its series");

    struct up_stats us;
    up_client_stats(e->up, &us);
    is_val(x, "kwc_upstream_requests_in_flight", (double)us.active,
           "kwc_upstream_requests_in_flight");
    static const unsigned limits[] = {8, 3, 6, 4, 5}; /* in UP_POOLS' order */
    for (int p = 0; p < UP_NPOOLS; p++) {
        struct up_pool_stats ps;
        up_client_pool_stats(e->up, (enum up_pool)p, &ps);
        char s[200];
        snprintf(s, sizeof s, "kwc_upstream_connections_limit{pool=\"%s\"}", up_pool_names[p]);
        is_val(x, s, limits[p], "kwc_upstream_connections_limit: the pool's cap");
        snprintf(s, sizeof s, "kwc_upstream_connections{pool=\"%s\"}", up_pool_names[p]);
        is_val(x, s, (double)ps.conns, "kwc_upstream_connections");
        snprintf(s, sizeof s, "kwc_upstream_pool_requests_in_flight{pool=\"%s\"}",
                 up_pool_names[p]);
        is_val(x, s, (double)ps.active, "kwc_upstream_pool_requests_in_flight");
    }
    is_int(nsamples(x, "kwc_upstream_connections"), UP_NPOOLS, "one sample per pool");

    is_val(x, "kwc_requests_in_flight{source=\"kwc\"}", 2, "kwc_requests_in_flight: two kwc");
    is_val(x, "kwc_requests_in_flight{source=\"cache\"}", 0, "...no cache");
    is_val(x, "kwc_requests_in_flight{source=\"upstream\"}", 0, "...no upstream");
}

static void
check_http(struct env *e, struct expo *x)
{
    struct http_server_stats hs;
    http_server_stats(e->http, &hs);
    is_int(hs.accepted, 3, "the server accepted three");
    is_int(hs.refused, 1, "...refused one past its cap");
    is_val(x, "kwc_http_connections_open", (double)(hs.open + hs.taken),
           "kwc_http_connections_open: open and taken");
    is_val(x, "kwc_http_connections_open", MAX_CONNS, "...the two under the cap");
    is_val(x, "kwc_http_connections_limit", MAX_CONNS, "kwc_http_connections_limit");
    is_val(x, "kwc_http_connections_accepted_total", 3, "kwc_http_connections_accepted_total");
    is_val(x, "kwc_http_connections_refused_total{reason=\"max_connections\"}", 1,
           "kwc_http_connections_refused_total: max_connections 1");
    is_val(x, "kwc_http_connections_refused_total{reason=\"out_of_descriptors\"}",
           (double)hs.accept_errors, "...out_of_descriptors");
    static const char *const reasons[] = {"header_timeout", "idle_timeout", "tls_handshake_failed",
                                          "bad_request"};
    for (int i = 0; i < 4; i++) {
        char s[200];
        snprintf(s, sizeof s, "kwc_http_connections_closed_total{reason=\"%s\"}", reasons[i]);
        is_val(x, s, 0, "kwc_http_connections_closed_total: each reason, 0");
    }
    is_val(x, "kwc_watch_store_queued_bytes", (double)watch_store_queued(e->watch),
           "kwc_watch_store_queued_bytes");
    is_val(x, "kwc_tls_certificate_reloads_total", 0, "kwc_tls_certificate_reloads_total");
    is_val(x, "kwc_tls_connections_total{records=\"kernel\"}", 0,
           "kwc_tls_connections_total: kernel 0 (plaintext)");
    is_val(x, "kwc_tls_connections_total{records=\"openssl\"}", 0,
           "kwc_tls_connections_total: openssl 0 (plaintext)");
}

static void
check_auth_budget(struct env *e, struct expo *x)
{
    is_val(x, "kwc_passthrough_buffer_limit_bytes", BUDGET,
           "kwc_passthrough_buffer_limit_bytes: the budget's cap");
    is_val(x, "kwc_passthrough_buffered_bytes", 0, "kwc_passthrough_buffered_bytes: 0");
    is_val(x, "kwc_passthrough_paused", 0, "kwc_passthrough_paused: 0");
    is_val(x, "kwc_passthrough_client_paused", 0, "kwc_passthrough_client_paused: 0");
    is_val(x, "kwc_passthrough_buffer_pauses_total", 0, "kwc_passthrough_buffer_pauses_total: 0");
    static const char *const am[] = {"certificate", "token", "anonymous"};
    for (int i = 0; i < 3; i++) {
        char s[200];
        snprintf(s, sizeof s, "kwc_authenticated_requests_total{method=\"%s\"}", am[i]);
        is_val(x, s, 0, "kwc_authenticated_requests_total: each method");
    }
    static const char *const dd[] = {"allowed", "denied", "error"};
    for (int i = 0; i < 3; i++) {
        char s[200];
        snprintf(s, sizeof s, "kwc_authorization_decisions_total{decision=\"%s\"}", dd[i]);
        is_val(x, s, 0, "kwc_authorization_decisions_total: each decision");
    }
    is_val(x, "kwc_token_reviews_total{result=\"cache_hit\"}", 0, "kwc_token_reviews_total");
    is_val(x, "kwc_subject_access_reviews_total{result=\"coalesced\"}", 0,
           "kwc_subject_access_reviews_total");
}

static void
check_process(struct env *e, struct expo *x)
{
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    is_val(x, "process_max_fds", (double)rl.rlim_cur, "process_max_fds: RLIMIT_NOFILE");
    ok(val(x, "process_resident_memory_bytes") > 0, "process_resident_memory_bytes > 0");
    ok(val(x, "process_cpu_seconds_total") >= 0, "process_cpu_seconds_total >= 0");
    /* the descriptors open now, counted apart from the one reading them */
    DIR *d = opendir("/proc/self/fd");
    long fds = 0;
    char self[16];
    snprintf(self, sizeof self, "%d", dirfd(d));
    for (struct dirent *de; (de = readdir(d));)
        fds += de->d_name[0] != '.' && strcmp(de->d_name, self) != 0;
    closedir(d);
    is_val(x, "process_open_fds", (double)fds, "process_open_fds: the process's descriptors");
    /* one more descriptor, one more counted */
    double before = val(x, "process_open_fds");
    int fd = dup(1);
    struct expo *y = xmalloc(sizeof *y);
    char *text = render(e, y);
    is_val(y, "process_open_fds", before + 1, "process_open_fds: one more after a dup");
    close(fd);
    free(text);
    free(y);
}

/* promtool check metrics, when installed: its exit status (-1: not installed). */
static int
promtool(const char *text, char *out, size_t outlen)
{
    if (system("command -v promtool >/dev/null 2>&1") != 0)
        return -1;
    char in[] = "/tmp/kwc-collect-metrics-XXXXXX";
    int fd = mkstemp(in);
    if (fd < 0)
        return -2;
    size_t n = strlen(text);
    if (write(fd, text, n) != (ssize_t)n)
        abort();
    close(fd);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s 2>&1", in);
    FILE *p = popen(cmd, "r");
    size_t got = p ? fread(out, 1, outlen - 1, p) : 0;
    out[got] = '\0';
    int st = p ? pclose(p) : -1;
    unlink(in);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -2;
}

static void
test_all_sources(void)
{
    struct env e;
    env_init(&e, true, true);
    ok(fail_discovery(&e), "the configmaps cache's discovery failed against the fake");
    struct expo *x = xmalloc(sizeof *x);
    char *text = render(&e, x);
    check_fams(x, caches, sizeof caches / sizeof caches[0], true, false);
    check_fams(x, heard_fams, sizeof heard_fams / sizeof heard_fams[0], true, true);
    check_fams(x, budget_fams, sizeof budget_fams / sizeof budget_fams[0], true, false);
    check_fams(x, auth_fams, sizeof auth_fams / sizeof auth_fams[0], true, false);
    check_caches(&e, x);
    check_watch(&e, x);
    check_upstream(&e, x);
    check_http(&e, x);
    check_auth_budget(&e, x);
    check_process(&e, x);

    char out[8192];
    int rc = promtool(text, out, sizeof out);
    if (rc == -1) {
        printf("# promtool is not installed (Debian: prometheus): "
               "promtool check metrics skipped, not passed\n");
    } else {
        if (rc != 0)
            printf("# promtool says:\n# %s\n", out);
        is_int(rc, 0, "promtool check metrics: no complaint");
    }
    free(text);
    free(x);
    env_fini(&e);
}

static void
test_without_auth_budget(void)
{
    struct env e;
    env_init(&e, false, false);
    struct expo *x = xmalloc(sizeof *x);
    char *text = render(&e, x);
    check_fams(x, auth_fams, sizeof auth_fams / sizeof auth_fams[0], false, true);
    check_fams(x, budget_fams, sizeof budget_fams / sizeof budget_fams[0], false, true);
    /* no upstream request yet: the two families of requests have no sample */
    check_fams(x, caches, sizeof caches / sizeof caches[0], true, true);
    /* the reflector never started: its counters are 0, its series there */
    is_val(x,
           "kwc_reflector_errors_total{group=\"\",version=\"v1\",resource=\"configmaps\",encoding="
           "\"json\","
           "phase=\"discovery\"}",
           0, "not started: discovery errors 0");
    is_int(nsamples(x, "kwc_upstream_requests_total"), 0, "no request yet: no sample");
    is_int(nsamples(x, "kwc_upstream_request_duration_seconds"), 0, "...no histogram series");
    free(text);
    free(x);
    env_fini(&e);
}

/* The parser itself: it must refuse what breaks the rules, or the checks
 * above could pass on anything. */
static void
test_parser(void)
{
    static const struct {
        const char *text;
        int errors;
        const char *what;
    } cases[] = {
        {"# HELP a_total A.\n# TYPE a_total counter\na_total 1\n", 0, "a good family"},
        {"# HELP a A.\n# TYPE a gauge\na 1\n# HELP a A.\n# TYPE a gauge\n", 1 + 1,
         "a family twice (HELP and TYPE)"},
        {"# HELP a A.\n# TYPE a gauge\na{x=\"1\"} 1\na{y=\"1\"} 2\n", 1, "label names differ"},
        {"# HELP a A.\n# TYPE a gauge\na{x=\"1\"} 1\na{x=\"1\"} 2\n", 1, "a series twice"},
        {"# HELP a A.\n# TYPE a gauge\nb 1\n", 1, "a sample of another name"},
        {"a 1\n", 1, "a sample before any family"},
        {"# HELP a A.\n# TYPE a gauge\na{x=\"1} 1\n", 1, "an unterminated label value"},
        {"# HELP a A.\n# TYPE a gauge\na one\n", 1, "a value that is no number"},
        {"# HELP a A.\n# TYPE a summary\na 1\n", 1, "a type kwc does not write"},
        {"# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 0\nh_bucket{le=\"+Inf\"} 1\n"
         "h_sum 2\nh_count 1\n",
         0, "a good histogram"},
        {"# HELP h H.\n# TYPE h histogram\nh_sum{le=\"1\"} 0\n", 1, "le outside a bucket"},
        {"# HELP a A.\n# TYPE a gauge\na 1", 1, "no final newline"},
        {"# HELP a A.\na 1\n", 1 + 1, "no TYPE"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct expo *x = xmalloc(sizeof *x);
        printf("# %s:\n", cases[i].what);
        expo_parse(x, cases[i].text);
        is_int(x->errors, cases[i].errors, cases[i].what);
        free(x);
    }
}

int
main(void)
{
    log_set_level(LOG_ERROR); /* the reflector's retries are expected */
    TAP_RUN(test_parser);
    TAP_RUN(test_all_sources);
    TAP_RUN(test_without_auth_budget);
    return tap_done();
}
