/*
 * catalog_test.c — proxy/upstream/catalog.c (with the reflectors and
 * discovery under it) called from threads other than the main loop's, as
 * the serving loops call it: the wants they post (a stopped cache reads as
 * warming at once, a new one is CATALOG_PENDING until the main loop made
 * it, and catalog_subscribe tells when), data drops held until every
 * serving loop has moved on (catalog_set_quiesce), and threads calling
 * every request-path function in a loop while the main loop starts, syncs,
 * stops and drops caches, freezes and thaws, and discovery changes (built
 * with -fsanitize=thread too: `make SAN=thread BUILD=build/tsan
 * build/tsan/tests/unit/catalog_test`).
 *
 * The upstream is a fake on a loopback ephemeral port (libevent's evhttp)
 * on the test's main loop, reached through kwc's real upstream client: it
 * answers discovery (plain: /api, /apis, /api/v1 listing the resources not
 * taken away), LISTs with one object, and WATCHes with a stream it keeps
 * open. Waiting is running the main loop until a condition holds, bounded
 * by a guard timer that only fires when the test is broken. Never a sleep.
 *
 * And the front's wait for such a cache (front.c: wait_for_cache) with the
 * front on a loop of its own thread, a serving loop as app.c makes them:
 * the catalog's and the writer's notifications relayed to it through its
 * mailbox, a client on a socketpair it adopts.
 */
#include "kwc/catalog.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kwc/access.h"
#include "kwc/base.h"
#include "kwc/decide.h"
#include "kwc/disco.h"
#include "kwc/front.h"
#include "kwc/http.h"
#include "kwc/mailbox.h"
#include "kwc/metrics.h"
#include "kwc/passthrough.h"
#include "kwc/serve.h"
#include "kwc/watch.h"
#include "kwc/kubeconfig.h"
#include "kwc/reflector.h"
#include "kwc/store.h"
#include "kwc/upstream.h"
#include "lmdbdir.h"
#include "tap.h"

#define GUARD_S 30 /* bound on any wait; never reached when all is well */
#define NRES 5
#define NWORKERS 2
#define ROUNDS 6
#define WORKER_MAX_ITERS 5000000
#define WORKER_MAX_S 60
#define MAX_WATCHES 256

static const char *const res_names[NRES] = {"configmaps", "secrets", "services", "endpoints",
                                            "serviceaccounts"};
static const char *const res_kinds[NRES] = {"ConfigMap", "Secret", "Service", "Endpoints",
                                            "ServiceAccount"};

struct env;

/* A thread standing for a serving loop. */
struct worker {
    struct env *e;
    pthread_t t;
    unsigned seed;
    atomic_uint seen; /* the quiesce epoch it has passed (a turn between two requests) */
    uint64_t iters, pending, served, empty, docs, names;
};

struct env {
    struct event_base *base;
    struct evhttp *http;
    int port;
    bool gone[NRES]; /* taken out of discovery (and 404 to its LISTs) */
    /* the open watch streams: ended at the end, freed when their client
     * goes (evhttp leaves a started reply's request to its owner then) */
    struct evhttp_request *watches[MAX_WATCHES];
    struct evhttp_connection *watch_conns[MAX_WATCHES];
    size_t nwatches;
    struct event *guard, *tick;
    bool guard_fired;
    struct kcfg *k;
    struct up_client *up;
    char dir[64];
    struct store *st;
    struct refl_ingest *ing;
    struct disco *d;
    struct catalog *cat;
    unsigned disco_changes, cat_changes;
    /* the quiesce hook: held until released (test_quiesce), or until every
     * worker has passed the epoch asked (test_threads) */
    bool q_hold, q_workers;
    void (*q_done)(void *arg);
    void *q_arg;
    unsigned q_calls;
    atomic_uint q_epoch;
    struct worker w[NWORKERS];
    atomic_bool stop;
    /* every target the fake was asked for (main loop) */
    char seen[256][160];
    size_t nseen;
    struct serving *sl;    /* test_front_waits: the serving loop, told of changes */
    struct client *client; /* ...and its client */
};

/* ---- the fake upstream ---- */

static int
res_index(const char *name, size_t len)
{
    for (int k = 0; k < NRES; k++)
        if (strlen(res_names[k]) == len && strncmp(res_names[k], name, len) == 0)
            return k;
    return -1;
}

static void
reply(struct evhttp_request *req, int status, const char *body)
{
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    struct evbuffer *b = evbuffer_new();
    evbuffer_add(b, body, strlen(body));
    evhttp_send_reply(req, status, "X", b);
    evbuffer_free(b);
}

static void
on_watch_close(struct evhttp_connection *conn, void *arg)
{
    struct env *e = arg;
    for (size_t i = 0; i < e->nwatches; i++)
        if (e->watch_conns[i] == conn) {
            evhttp_request_free(e->watches[i]);
            e->nwatches--;
            e->watches[i] = e->watches[e->nwatches];
            e->watch_conns[i] = e->watch_conns[e->nwatches];
            return;
        }
}

static void
on_request(struct evhttp_request *req, void *arg)
{
    struct env *e = arg;
    const char *uri = evhttp_request_get_uri(req);
    char body[2048];
    if (e->nseen < KWC_ARRAY_LEN(e->seen))
        snprintf(e->seen[e->nseen++], sizeof(e->seen[0]), "%s", uri);
    if (strcmp(uri, "/api") == 0) {
        reply(req, 200, "{\"kind\":\"APIVersions\",\"versions\":[\"v1\"]}");
    } else if (strcmp(uri, "/apis") == 0) {
        reply(req, 200, "{\"kind\":\"APIGroupList\",\"apiVersion\":\"v1\",\"groups\":[]}");
    } else if (strcmp(uri, "/version") == 0) {
        reply(req, 200, "{\"major\":\"1\",\"minor\":\"31\"}");
    } else if (strcmp(uri, "/api/v1") == 0) {
        size_t n = (size_t)snprintf(body, sizeof(body),
                                    "{\"kind\":\"APIResourceList\",\"groupVersion\":\"v1\","
                                    "\"resources\":[");
        bool first = true;
        for (int k = 0; k < NRES; k++) {
            if (e->gone[k])
                continue;
            n += (size_t)snprintf(body + n, sizeof(body) - n,
                                  "%s{\"name\":\"%s\",\"namespaced\":true,\"kind\":\"%s\","
                                  "\"verbs\":[\"get\",\"list\",\"watch\"]}",
                                  first ? "" : ",", res_names[k], res_kinds[k]);
            first = false;
        }
        snprintf(body + n, sizeof(body) - n, "]}");
        reply(req, 200, body);
    } else if (strncmp(uri, "/api/v1/", 8) == 0) {
        const char *name = uri + 8, *q = strchr(name, '?');
        int k = q ? res_index(name, (size_t)(q - name)) : -1;
        if (k < 0 || e->gone[k]) {
            reply(req, 404, "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"code\":404}");
        } else if (strstr(q, "watch=true") && e->nwatches < MAX_WATCHES) {
            /* open, and kept so */
            evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                              "application/json");
            evhttp_send_reply_start(req, 200, "OK");
            struct evhttp_connection *conn = evhttp_request_get_connection(req);
            evhttp_connection_set_closecb(conn, on_watch_close, e);
            e->watches[e->nwatches] = req;
            e->watch_conns[e->nwatches++] = conn;
        } else {
            snprintf(body, sizeof(body),
                     "{\"kind\":\"%sList\",\"apiVersion\":\"v1\",\"metadata\":{"
                     "\"resourceVersion\":\"100\"},\"items\":[{\"metadata\":{\"name\":\"o1\","
                     "\"namespace\":\"ns\",\"resourceVersion\":\"100\"}}]}",
                     res_kinds[k]);
            reply(req, 200, body);
        }
    } else {
        reply(req, 404, "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"code\":404}");
    }
}

/* ---- the main loop ---- */

static void
on_guard(evutil_socket_t fd, short what, void *arg)
{
    ((struct env *)arg)->guard_fired = true;
}

/* The lead's hook in app.c posts to every serving loop and calls done when
 * all have run; here a worker has "run" once it starts an iteration after
 * the epoch was raised. */
static void
quiesce(void *arg, void (*done)(void *done_arg), void *done_arg)
{
    struct env *e = arg;
    e->q_calls++;
    e->q_done = done;
    e->q_arg = done_arg;
    if (e->q_workers)
        atomic_fetch_add(&e->q_epoch, 1);
}

static void
q_poll(struct env *e)
{
    if (!e->q_done || e->q_hold)
        return;
    unsigned want = atomic_load(&e->q_epoch);
    for (int i = 0; e->q_workers && i < NWORKERS; i++)
        if (atomic_load(&e->w[i].seen) < want)
            return;
    void (*done)(void *) = e->q_done;
    e->q_done = NULL;
    done(e->q_arg);
}

static void
on_tick(evutil_socket_t fd, short what, void *arg)
{
    q_poll(arg);
}

static bool
run_until(struct env *e, bool (*pred)(struct env *e, int k), int k, const char *what)
{
    struct timeval tv = {GUARD_S, 0};
    e->guard_fired = false;
    evtimer_add(e->guard, &tv);
    bool held = false;
    while (!e->guard_fired && !(held = pred(e, k)))
        event_base_loop(e->base, EVLOOP_ONCE);
    evtimer_del(e->guard);
    if (!held)
        printf("# never came to pass: %s\n", what);
    return held;
}

static void
on_disco(void *arg)
{
    ((struct env *)arg)->disco_changes++;
}

static void serving_tell(struct serving *sl);

static void
on_catalog(void *arg)
{
    struct env *e = arg;
    e->cat_changes++;
    if (e->sl)
        serving_tell(e->sl);
}

/* hook: the quiesce hook installed (else the default: done at once). */
static void
env_init(struct env *e, unsigned max_caches, bool hook)
{
    *e = (struct env){0};
    e->base = event_base_new();
    e->http = evhttp_new(e->base);
    struct evhttp_bound_socket *s = evhttp_bind_socket_with_handle(e->http, "127.0.0.1", 0);
    if (!s)
        abort();
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    getsockname(evhttp_bound_socket_get_fd(s), (struct sockaddr *)&sa, &sl);
    e->port = ntohs(sa.sin_port);
    evhttp_set_gencb(e->http, on_request, e);
    evhttp_set_allowed_methods(e->http, EVHTTP_REQ_GET);
    e->guard = evtimer_new(e->base, on_guard, e);
    e->tick = event_new(e->base, -1, EV_PERSIST, on_tick, e);
    struct timeval tick = {0, 5000};
    event_add(e->tick, &tick);
    char y[1024], err[512] = "";
    snprintf(y, sizeof(y),
             "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n"
             "    server: http://127.0.0.1:%d\nusers:\n- name: u\n  user:\n    token: t\n"
             "contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
             e->port);
    struct up_options uo = {
        .connect_timeout_ms = 10000,
        .max_idle_conns = 8,
        .max_conns = {[UP_POOL_DISCOVERY] = DISCO_MAX_CONNS, [UP_POOL_CACHE] = 32}};
    if (kcfg_parse(y, strlen(y), "/", NULL, &e->k, err, sizeof(err)) != 0 ||
        up_client_new(e->base, e->k, &uo, &e->up, err, sizeof(err)) != 0) {
        printf("# %s\n", err);
        abort();
    }
    lmdbdir_make(e->dir, sizeof(e->dir), "catalog-test");
    struct store_options so;
    store_options_default(&so);
    so.map_size = 32 << 20;
    if (store_open(e->dir, &so, &e->st) != 0)
        abort();
    refl_ingest_new(e->base, e->st, NULL, &e->ing);
    struct disco_options dopt = {.interval_ms = 3600 * 1000, .min_gap_ms = 20};
    disco_new(e->base, e->up, &dopt, &e->d);
    disco_subscribe(e->d, on_disco, e);
    struct catalog_options co = {.auto_mode = true,
                                 .protobuf = "none",
                                 .max_caches = max_caches,
                                 .disk_budget = UINT64_MAX,
                                 .identity = "test"};
    if (catalog_new(e->base, e->up, e->ing, e->st, e->d, &co, &e->cat, err, sizeof(err)) != 0) {
        printf("# catalog_new: %s\n", err);
        abort();
    }
    catalog_subscribe(e->cat, on_catalog, e);
    if (hook)
        catalog_set_quiesce(e->cat, quiesce, e);
    disco_start(e->d);
    catalog_start(e->cat);
}

static void
env_fini(struct env *e)
{
    refl_ingest_free(e->ing);
    catalog_free(e->cat);
    disco_free(e->d);
    for (int i = 0; i < 8; i++)
        event_base_loop(e->base, EVLOOP_NONBLOCK);
    while (e->nwatches > 0) {
        e->nwatches--;
        evhttp_connection_set_closecb(e->watch_conns[e->nwatches], NULL, NULL);
        evhttp_send_reply_end(e->watches[e->nwatches]);
    }
    up_client_free(e->up);
    store_close(e->st);
    lmdbdir_rm(e->dir);
    kcfg_free(e->k);
    evhttp_free(e->http);
    event_free(e->guard);
    event_free(e->tick);
    event_base_free(e->base);
}

/* ---- conditions ---- */

static bool
disco_is_ready(struct env *e, int k)
{
    return disco_ready(e->d);
}

static bool
disco_changed(struct env *e, int k)
{
    return e->disco_changes > (unsigned)k;
}

static bool
cat_changed(struct env *e, int k)
{
    return e->cat_changes > (unsigned)k;
}

static bool
serving(struct env *e, int i)
{
    return refl_serving(catalog_set(e->cat)->r[i]);
}

static bool
stopped(struct env *e, int i)
{
    return !refl_started(catalog_set(e->cat)->r[i]);
}

static bool
none_pending(struct env *e, int k)
{
    for (int j = 0; j < NRES; j++)
        if (catalog_pending(e->cat, "", "v1", res_names[j]))
            return false;
    return true;
}

static bool
quiesce_asked(struct env *e, int k)
{
    return e->q_calls > (unsigned)k;
}

static uint64_t
cache_rv(struct env *e, int i)
{
    return store_res_rv(e->st, refl_desc(catalog_set(e->cat)->r[i])->sres, NULL);
}

/* Take resource k out of discovery (gone) or put it back; true once
 * discovery has seen it. */
static bool
set_gone(struct env *e, int k, bool gone)
{
    unsigned before = e->disco_changes;
    e->gone[k] = gone;
    disco_refresh_soon(e->d);
    return run_until(e, disco_changed, (int)before, "discovery changed");
}

/* ---- one call on another thread, as a serving loop makes it ---- */

struct call {
    struct env *e;
    const char *resource;
    int want;     /* catalog_want's answer */
    bool warming; /* catalog_warming of it, at once after */
    bool pending; /* catalog_pending, at once after */
    bool started; /* refl_started of it, at once after */
};

static void *
call_want(void *arg)
{
    struct call *c = arg;
    c->want = catalog_want(c->e->cat, "", "v1", c->resource, KWC_ENC_JSON);
    c->pending = catalog_pending(c->e->cat, "", "v1", c->resource);
    if (c->want >= 0) {
        c->warming = catalog_warming(c->e->cat, (size_t)c->want);
        c->started = refl_started(catalog_set(c->e->cat)->r[c->want]);
    }
    return NULL;
}

static struct call
want_off_loop(struct env *e, const char *resource)
{
    struct call c = {.e = e, .resource = resource};
    pthread_t t;
    pthread_create(&t, NULL, call_want, &c);
    pthread_join(t, NULL);
    return c;
}

/* ---- tests ---- */

static void
test_posted_wants(void)
{
    struct env e;
    env_init(&e, 3, false);
    ok(run_until(&e, disco_is_ready, 0, "discovery answered"), "discovery answers");

    /* a cache with no slot: made by the main loop, told to subscribers */
    unsigned before = e.cat_changes;
    struct call c = want_off_loop(&e, "configmaps");
    is_int(c.want, CATALOG_PENDING, "a new cache wanted off the main loop is pending");
    ok(c.pending, "...and catalog_pending says so");
    is_int(catalog_set(e.cat)->n, 0, "...no slot is made off the main loop");
    c = want_off_loop(&e, "configmaps");
    is_int(c.want, CATALOG_PENDING, "a second want meanwhile is pending too");
    ok(run_until(&e, cat_changed, (int)before, "the want carried out"),
       "the main loop carries it out and tells the subscribers");
    ok(!catalog_pending(e.cat, "", "v1", "configmaps"), "no longer pending");
    is_int(catalog_set(e.cat)->n, 1, "one slot made for both wants");
    ok(refl_started(catalog_set(e.cat)->r[0]), "its cache started");
    c = want_off_loop(&e, "configmaps");
    is_int(c.want, 0, "asked again, the want finds its slot");
    ok(run_until(&e, serving, 0, "configmaps serving"), "it syncs and serves");

    /* its resource leaves discovery: stopped, its data dropped */
    ok(set_gone(&e, 0, true), "configmaps leaves discovery");
    ok(run_until(&e, stopped, 0, "configmaps stopped"), "its cache stops");
    is_int(cache_rv(&e, 0), 0, "its data is dropped at once without a quiesce hook");
    c = want_off_loop(&e, "configmaps");
    ok(c.want == 0 && !c.warming, "a want of a resource discovery lacks starts nothing");

    /* back: a stopped cache reads as warming from the want on */
    ok(set_gone(&e, 0, false), "configmaps is back in discovery");
    before = e.cat_changes;
    c = want_off_loop(&e, "configmaps");
    is_int(c.want, 0, "a want off the main loop finds the stopped cache");
    ok(!c.started && c.warming, "it reads as warming before the main loop has started it");
    ok(run_until(&e, cat_changed, (int)before, "the start carried out"),
       "the main loop starts it and tells the subscribers");
    ok(refl_started(catalog_set(e.cat)->r[0]), "started");
    ok(run_until(&e, serving, 0, "configmaps serving again"), "it lists afresh and serves");

    /* --max-caches: the main loop refuses, the want finds no slot */
    want_off_loop(&e, "secrets");
    want_off_loop(&e, "services");
    ok(run_until(&e, none_pending, 0, "two creations carried out"), "two more made");
    is_int(catalog_set(e.cat)->n, 3, "three caches: --max-caches reached");
    before = e.cat_changes;
    c = want_off_loop(&e, "endpoints");
    is_int(c.want, CATALOG_PENDING, "a fourth is pending");
    ok(run_until(&e, cat_changed, (int)before, "the refusal told"),
       "the main loop refuses it and tells the subscribers");
    ok(!catalog_pending(e.cat, "", "v1", "endpoints"), "no longer pending");
    is_int(catalog_set(e.cat)->n, 3, "no slot made for it");
    struct catalog_stats cs;
    catalog_stats(e.cat, &cs);
    ok(cs.refused_max >= 1, "counted as refused for --max-caches");

    /* on the main loop, catalog_want decides at once as it always did */
    int i = catalog_want(e.cat, "", "v1", "configmaps", KWC_ENC_JSON);
    is_int(i, 0, "on the main loop a want returns the slot at once");
    is_int(catalog_want(e.cat, "", "v1", "endpoints", KWC_ENC_JSON), -1,
           "...and -1 at once for one past --max-caches");
    env_fini(&e);
}

/* The data of a cache whose resource left discovery waits for the quiesce
 * round: a serving loop that saw it serving finishes its turn first. */
static void
test_quiesce(void)
{
    struct env e;
    env_init(&e, 3, true);
    ok(run_until(&e, disco_is_ready, 0, "discovery answered"), "discovery answers");
    is_int(catalog_want(e.cat, "", "v1", "secrets", KWC_ENC_JSON), 0, "secrets wanted");
    is_int(catalog_want(e.cat, "", "v1", "services", KWC_ENC_JSON), 1, "services wanted");
    ok(run_until(&e, serving, 0, "secrets serving"), "secrets serves");
    ok(run_until(&e, serving, 1, "services serving"), "services serves");
    e.q_hold = true;
    ok(set_gone(&e, 1, true), "secrets leaves discovery");
    ok(run_until(&e, stopped, 0, "secrets stopped"), "its cache stops");
    ok(run_until(&e, quiesce_asked, 0, "quiesce asked"), "the catalog asks for a quiesce round");
    ok(cache_rv(&e, 0) > 0, "its data stays while a serving loop may read it");
    /* a second drop while the round runs waits for a round of its own */
    ok(set_gone(&e, 2, true), "services leaves discovery too");
    ok(run_until(&e, stopped, 1, "services stopped"), "its cache stops");
    is_int(e.q_calls, 1, "one round at a time");
    e.q_hold = false;
    q_poll(&e); /* every serving loop has moved on */
    is_int(cache_rv(&e, 0), 0, "the round done, secrets' data is dropped");
    ok(cache_rv(&e, 1) > 0, "services' waits for the next round");
    is_int(e.q_calls, 2, "...which is asked at once");
    q_poll(&e);
    is_int(cache_rv(&e, 1), 0, "that round done, services' data is dropped");
    struct catalog_stats cs;
    catalog_stats(e.cat, &cs);
    is_int(cs.vanished, 2, "both counted as vanished");
    env_fini(&e);
}

/* ---- threads calling the request path while the main loop changes it ---- */

static uint64_t
mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec;
}

static void *
worker_run(void *arg)
{
    struct worker *w = arg;
    struct env *e = w->e;
    struct catalog *cat = e->cat;
    const struct refl_set *set = catalog_set(cat);
    uint64_t until = mono_s() + WORKER_MAX_S;
    for (; w->iters < WORKER_MAX_ITERS && !atomic_load(&e->stop); w->iters++) {
        /* between two requests: any drop asked before now may go */
        atomic_store(&w->seen, atomic_load(&e->q_epoch));
        if ((w->iters & 1023) == 0 && mono_s() > until)
            break;
        const char *r = res_names[rand_r(&w->seed) % NRES];
        catalog_may_cache(cat, "", "v1", r);
        int i = catalog_want(cat, "", "v1", r, KWC_ENC_JSON);
        if (i == CATALOG_PENDING) {
            w->pending++;
            catalog_pending(cat, "", "v1", r);
        } else if (i >= 0) {
            catalog_warming(cat, (size_t)i);
            catalog_required(cat, (size_t)i);
            const struct refl *rf = set->r[i];
            const struct refl_desc *d = refl_desc(rf);
            const char *kind = d->kind, *list_kind = d->list_kind;
            if (kind && list_kind)
                w->names += strlen(kind) + strlen(list_kind) + atomic_load(&d->namespaced);
            refl_counts_ready(rf);
            refl_warming(rf);
            refl_resetting(rf);
            refl_synced(rf);
            if (refl_serving(rf)) {
                w->served++;
                /* serving a moment ago: its data is there for this turn */
                if (store_res_rv(e->st, d->sres, NULL) == 0)
                    w->empty++;
            }
        }
        size_t n = set->n;
        for (size_t j = 0; j < n; j++)
            refl_started(set->r[j]);
        catalog_discovering(cat);
        if ((w->iters & 63) == 0)
            catalog_missed(cat, "", "v1", "nosuchthings");
        struct disco_res dr;
        disco_find(e->d, "", "v1", r, &dr);
        const struct disco_doc *doc = disco_doc_get(e->d, "/api/v1", "application/json");
        if (doc) {
            w->docs += doc->len > 0 && doc->body[doc->len - 1] == '}';
            disco_doc_unref(doc);
        }
        sched_yield();
    }
    atomic_store(&w->seen, UINT32_MAX); /* gone: never holds a round back */
    return NULL;
}

static bool
some_serving(struct env *e, int k)
{
    const struct refl_set *set = catalog_set(e->cat);
    for (size_t i = 0; i < set->n; i++)
        if (refl_serving(set->r[i]))
            return true;
    return false;
}

static bool
no_round(struct env *e, int k)
{
    return !e->q_done;
}

static void
test_threads(void)
{
    struct env e;
    env_init(&e, 3, true);
    e.q_workers = true;
    ok(run_until(&e, disco_is_ready, 0, "discovery answered"), "discovery answers");
    for (int i = 0; i < NWORKERS; i++) {
        e.w[i] = (struct worker){.e = &e, .seed = 17u + (unsigned)i};
        pthread_create(&e.w[i].t, NULL, worker_run, &e.w[i]);
    }
    bool all = true;
    for (int round = 0; round < ROUNDS && all; round++) {
        int k = round % NRES;
        all &= run_until(&e, some_serving, 0, "a cache serving");
        all &= set_gone(&e, k, true);
        catalog_want(e.cat, "", "v1", res_names[(k + 1) % NRES], KWC_ENC_JSON);
        all &= set_gone(&e, k, false);
        if (round % 2) {
            catalog_freeze(e.cat);
            event_base_loop(e.base, EVLOOP_NONBLOCK);
            catalog_thaw(e.cat);
        }
    }
    all &= run_until(&e, no_round, 0, "the last quiesce round done");
    atomic_store(&e.stop, true);
    uint64_t iters = 0, pending = 0, served = 0, empty = 0, docs = 0;
    for (int i = 0; i < NWORKERS; i++) {
        pthread_join(e.w[i].t, NULL);
        iters += e.w[i].iters;
        pending += e.w[i].pending;
        served += e.w[i].served;
        empty += e.w[i].empty;
        docs += e.w[i].docs;
    }
    printf("# %llu iterations: %llu pending, %llu served, %llu discovery docs; %u quiesce "
           "rounds\n",
           (unsigned long long)iters, (unsigned long long)pending, (unsigned long long)served,
           (unsigned long long)docs, e.q_calls);
    ok(all, "the main loop went through every round");
    ok(served > 0, "the threads found caches serving");
    ok(pending > 0, "the threads wanted caches with no slot yet");
    is_int(empty, 0, "no thread found a cache it saw serving emptied under it");
    ok(e.q_calls > 0, "drops went through quiesce rounds");
    env_fini(&e);
}

/* ---- the front on a serving loop ---- */

/* A serving loop as app.c will make one: its own base, thread and mailbox,
 * a front over a serve and a watch pool of its own, passthrough on an
 * upstream client of its own; the catalog is the main loop's. */
struct serving {
    struct env *e;
    struct event_base *base;
    struct mailbox *mb;
    pthread_t t;
    struct up_client *up;
    struct pt_options pt_short, pt_long;
    struct serve *serve;
    struct watch_pool *watch;
    struct metrics *m;
    struct access *acc;
    struct front *front;
    struct http_server *http;
};

static void
on_front_done(void *arg, const struct hreq_done *d, void *note)
{
    access_finish(note, d);
}

static void
tell_front(void *arg)
{
    front_caches_changed(((struct serving *)arg)->front);
}

/* Main loop: what the lead's relay does, the serving loop told. */
static void
serving_tell(struct serving *sl)
{
    mailbox_post(sl->mb, tell_front, sl);
}

static void
on_commit_relay(void *arg)
{
    serving_tell(arg);
}

static void
on_service_relay(void *arg, const struct refl *r, bool serving)
{
    serving_tell(arg);
}

static void
stop_loop(void *arg)
{
    event_base_loopbreak(((struct serving *)arg)->base);
}

static void *
serving_run(void *arg)
{
    struct serving *sl = arg;
    event_base_loop(sl->base, EVLOOP_NO_EXIT_ON_EMPTY);
    return NULL;
}

/* Made on the main thread before its loop runs (nothing of it is touched
 * by two threads at once), then run on its own. */
static void
serving_start(struct serving *sl, struct env *e)
{
    *sl = (struct serving){.e = e, .base = event_base_new()};
    sl->mb = mailbox_new(sl->base);
    char err[512] = "";
    struct up_options uo = {
        .connect_timeout_ms = 10000, .max_idle_conns = 4, .max_conns = {[UP_POOL_PASSTHROUGH] = 4}};
    if (up_client_new(sl->base, e->k, &uo, &sl->up, err, sizeof(err)) != 0)
        abort();
    sl->pt_short = (struct pt_options){
        .max_request_buffer = 1 << 20, .max_response_buffer = 1 << 20, .strip_credentials = true};
    sl->pt_long = sl->pt_short;
    sl->pt_long.long_running = true;
    struct serve_options so = {.too_large = DECIDE_TOO_LARGE_504,
                               .wait_ms = 1000,
                               .max_buffer = 1 << 20,
                               .up = sl->up,
                               .pt = &sl->pt_short};
    sl->serve = serve_new(sl->base, e->st, catalog_set(e->cat), &so);
    struct watch_options wo = {.budget = 1 << 20,
                               .window_bytes = 1 << 20,
                               .bookmark_ms = 60000,
                               .wait_ms = 1000,
                               .too_large = DECIDE_TOO_LARGE_504,
                               .own_loop = true};
    sl->watch = watch_pool_new(sl->base, e->st, catalog_set(e->cat), &wo);
    sl->m = metrics_new();
    struct access_options aco = {.log = false};
    sl->acc = access_new(sl->m, &aco);
    struct front_parts fp = {.base = sl->base,
                             .cat = e->cat,
                             .start_wait_ms = GUARD_S * 1000,
                             .serve = sl->serve,
                             .watch = sl->watch,
                             .up = sl->up,
                             .pt_short = &sl->pt_short,
                             .pt_long = &sl->pt_long,
                             .tunnel_connect_timeout_ms = 5000,
                             .metrics = sl->m,
                             .access = sl->acc};
    sl->front = front_new(&fp);
    struct http_server_options ho = {0};
    if (http_server_new(sl->base, &ho, front_on_request, sl->front, &sl->http, err, sizeof(err)) !=
        0)
        abort();
    http_server_on_done(sl->http, on_front_done, NULL);
    e->sl = sl;
    refl_ingest_subscribe(e->ing, on_commit_relay, on_service_relay, sl);
    pthread_create(&sl->t, NULL, serving_run, sl);
}

static void
serving_stop(struct serving *sl)
{
    mailbox_post(sl->mb, stop_loop, sl);
    pthread_join(sl->t, NULL);
    sl->e->sl = NULL;
    refl_ingest_unsubscribe(sl->e->ing, sl);
    http_server_free(sl->http);
    front_free(sl->front);
    watch_pool_free(sl->watch);
    serve_free(sl->serve);
    access_free(sl->acc);
    metrics_free(sl->m);
    for (int i = 0; i < 8; i++)
        event_base_loop(sl->base, EVLOOP_NONBLOCK);
    up_client_free(sl->up);
    mailbox_free(sl->mb);
    event_base_free(sl->base);
}

/* A client on a socketpair: its end, what it read. */
struct client {
    int fd;
    char in[65536];
    size_t n;
};

/* On the serving loop: the server adopts the other end. */
struct adopt_box {
    struct serving *sl;
    int fd;
};

static void
adopt(void *arg)
{
    struct adopt_box *b = arg;
    http_server_adopt(b->sl->http, b->fd, NULL, 0);
    free(b);
}

/* A whole response read (chunked, or a Content-Length JSON body). */
static bool
answered(struct env *e, int k)
{
    struct client *c = e->client;
    for (;;) {
        ssize_t got = recv(c->fd, c->in + c->n, sizeof(c->in) - 1 - c->n, 0);
        if (got <= 0)
            break;
        c->n += (size_t)got;
    }
    c->in[c->n] = '\0';
    return strstr(c->in, "\r\n0\r\n\r\n") != NULL ||
           (strstr(c->in, "Content-Length") && strstr(c->in, "\r\n\r\n{"));
}

static bool
was_asked(const struct env *e, const char *target)
{
    for (size_t i = 0; i < e->nseen; i++)
        if (strcmp(e->seen[i], target) == 0)
            return true;
    return false;
}

/* A list of a resource with no cache yet, on a serving loop: the want is
 * CATALOG_PENDING, the request waits for the main loop to make the cache,
 * asks again, waits for its first sync, and is answered from it. */
static void
test_front_waits(void)
{
    struct env e;
    env_init(&e, 3, false);
    ok(run_until(&e, disco_is_ready, 0, "discovery answered"), "discovery answers");
    struct serving sl;
    serving_start(&sl, &e);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
        abort();
    static const char raw[] = "GET /api/v1/namespaces/ns/configmaps?resourceVersion=0 HTTP/1.1\r\n"
                              "Host: localhost:8001\r\n\r\n";
    if (send(sv[0], raw, strlen(raw), MSG_NOSIGNAL) != (ssize_t)strlen(raw))
        abort();
    static struct client c;
    c = (struct client){.fd = sv[0]};
    e.client = &c;
    struct adopt_box *box = xcalloc(1, sizeof(*box));
    *box = (struct adopt_box){&sl, sv[1]};
    mailbox_post(sl.mb, adopt, box);
    ok(run_until(&e, answered, 0, "the list answered"), "the list is answered");
    ok(strncmp(c.in, "HTTP/1.1 200", 12) == 0, "with 200");
    ok(strstr(c.in, "\"o1\"") != NULL, "holding the cached object");
    ok(!was_asked(&e, "/api/v1/namespaces/ns/configmaps?resourceVersion=0"),
       "not passed through: it waited for the cache the main loop made");
    ok(was_asked(&e, "/api/v1/configmaps?limit=500"), "the cache listed upstream");
    is_int(catalog_set(e.cat)->n, 1, "one cache made");
    close(sv[0]);
    serving_stop(&sl);
    env_fini(&e);
}

int
main(void)
{
    TAP_RUN(test_posted_wants);
    TAP_RUN(test_quiesce);
    TAP_RUN(test_threads);
    TAP_RUN(test_front_waits);
    return tap_done();
}
