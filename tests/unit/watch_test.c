/*
 * watch_test.c — proxy/serve/watch.c: watch streams of the cache on worker
 * loops (include/kwc/watch.h), through kwc's HTTP server on a socketpair,
 * from a real store and reflector (cachefx.h).
 *
 * The test thread is the writer loop: it writes events to the store and
 * calls watch_committed, as the reflector's commit hook does. A stream's
 * socket leaves the HTTP server for a worker thread, so the client reads
 * its end with poll() until what it waits for has arrived, bounded by a
 * deadline that is only reached when the stream is broken. The worker's own
 * state (a watcher freed, a watcher lagging) is read from watch_stats until
 * it shows, bounded the same way. Bookmarks come from the workers' timers,
 * with a short --bookmark-interval; nothing sleeps to let time pass.
 *
 * Every test runs twice: with a worker thread, and with the pool's local
 * worker on the test's own loop (watch_options.own_loop: how streams bound
 * to their connection's loop, HTTP/2's, are served); the test then runs
 * that loop while it waits, each step bounded as the poll is.
 *
 * Expected events follow kube's watch semantics (k8s-api-concepts "Semantics
 * for watch", "Watch bookmarks") and the README's "Watches".
 */
#include "kwc/watch.h"

#include <jansson.h>
#include <time.h>

#include "cachefx.h"

#define DEADLINE_MS 20000 /* a broken stream; never reached when all is well */

static bool own_loop; /* the streams are served by the test's own loop */

static void
take(struct cfx *f, struct hreq *r, const struct route_req *route)
{
    if (watch_take(f->arg, r, route) == WATCH_NOT_TAKEN)
        hresp_simple(r, 599, "text/plain", "passed", 6);
}

static struct watch_pool *
pool_open(struct cfx *f, size_t budget, size_t window, uint64_t bookmark_ms)
{
    struct watch_options wo = {.workers = 1,
                               .budget = budget,
                               .window_bytes = window,
                               .bookmark_ms = bookmark_ms,
                               .wait_ms = 3000,
                               .own_loop = own_loop};
    struct watch_pool *p = watch_pool_new(f->base, f->st, &f->set, &wo);
    f->take = take;
    f->arg = p;
    return p;
}

static int
watch(struct cfx *f, const char *target, int sndbuf)
{
    int c = cfx_connect(f, sndbuf);
    char req[512];
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: kwc\r\n\r\n", target);
    cfx_send(f, c, req);
    return c;
}

static uint64_t
now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- the events a client got ---- */

struct ev {
    char type[16];
    char name[32];
    uint64_t rv;
    bool initial_end; /* a BOOKMARK with k8s.io/initial-events-end */
};

struct evs {
    struct ev *e;
    size_t n;
    bool bad; /* a line that is not a watch event */
};

/* Every complete event line in client c's stream so far. */
static void
events(struct cfx *f, int c, struct evs *out)
{
    free(out->e);
    *out = (struct evs){0};
    struct cfx_resp r = {0};
    cfx_parse(&f->p[c].in, &r);
    const char *p = r.body.p, *end = p + r.body.len;
    while (p && p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl)
            break;
        json_t *j = json_loadb(p, (size_t)(nl - p), 0, NULL);
        json_t *md = json_object_get(json_object_get(j, "object"), "metadata");
        const char *type = json_string_value(json_object_get(j, "type"));
        const char *rv = json_string_value(json_object_get(md, "resourceVersion"));
        if (!type || !rv) {
            out->bad = true;
        } else {
            out->e = xrealloc(out->e, (out->n + 1) * sizeof(*out->e));
            struct ev *e = &out->e[out->n++];
            *e = (struct ev){.rv = strtoull(rv, NULL, 10)};
            snprintf(e->type, sizeof e->type, "%s", type);
            const char *name = json_string_value(json_object_get(md, "name"));
            snprintf(e->name, sizeof e->name, "%s", name ? name : "");
            const char *ie = json_string_value(
                json_object_get(json_object_get(md, "annotations"), "k8s.io/initial-events-end"));
            e->initial_end = ie && strcmp(ie, "true") == 0;
        }
        json_decref(j);
        p = nl + 1;
    }
    free(r.body.p);
}

static size_t
count(const struct evs *v, const char *type)
{
    size_t n = 0;
    for (size_t i = 0; i < v->n; i++)
        n += strcmp(v->e[i].type, type) == 0;
    return n;
}

static void
on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
}

/* Let the serving side move: its loop (own_loop) runs until an event fired,
 * or a worker thread's bytes for client c (-1: its state) are waited for;
 * either way at most 100 ms, one step of a bounded wait. */
static void
step(struct cfx *f, int c)
{
    if (own_loop) {
        struct event *t = evtimer_new(f->base, on_tick, NULL);
        struct timeval tv = {0, 100 * 1000};
        evtimer_add(t, &tv);
        event_base_loop(f->base, EVLOOP_ONCE);
        event_free(t);
    } else if (c >= 0) {
        struct pollfd pf = {.fd = f->p[c].fd, .events = POLLIN};
        poll(&pf, 1, 100);
    } else {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL); /* another thread's progress: polled, bounded */
    }
}

/* Read client c until it has at least n events of type (NULL: any), or
 * EOF; false at the deadline. */
static bool
wait_events(struct cfx *f, int c, const char *type, size_t n, struct evs *v)
{
    uint64_t end = now_ms() + DEADLINE_MS;
    for (;;) {
        cfx_read(f, c, 0);
        events(f, c, v);
        if ((type ? count(v, type) : v->n) >= n)
            return true;
        if (f->p[c].eof || now_ms() > end)
            return false;
        step(f, c);
    }
}

/* Until the workers' state satisfies cond; false at the deadline. */
static bool
wait_for(struct cfx *f, struct watch_pool *p, bool (*cond)(struct watch_pool *p, const void *arg),
         const void *arg)
{
    uint64_t end = now_ms() + DEADLINE_MS;
    for (;;) {
        if (cond(p, arg))
            return true;
        if (now_ms() > end)
            return false;
        step(f, -1);
    }
}

/* Open streams of the pods (the pool's atomic count: a stream is counted
 * from its hand-off to its close). */
static bool
watchers_are(struct watch_pool *p, const void *arg)
{
    struct watch_res_stats rs;
    watch_res_stats(p, 0, &rs);
    return rs.watchers == *(const unsigned long long *)arg;
}

/* The workers' counters are published after each of their rounds. */
static bool
any_lagging(struct watch_pool *p, const void *arg)
{
    struct watch_stats s;
    watch_stats(p, &s);
    return s.lagging > 0;
}

static bool
delivered_are(struct watch_pool *p, const void *arg)
{
    struct watch_stats s;
    watch_stats(p, &s);
    return s.delivered == *(const unsigned long long *)arg;
}

/* Commit an event and hand it to the workers, as the reflector's hook does. */
static uint64_t
commit(struct cfx *f, struct watch_pool *p, enum store_ev_type t, const char *name, size_t size)
{
    uint64_t rv = cfx_event(f, t, "ns", name, size);
    watch_committed(p);
    return rv;
}

/* ---- open, events, close ---- */

static void
test_lifecycle(void)
{
    struct cfx f;
    cfx_open(&f, 5, 100, 1000);
    struct watch_pool *p = pool_open(&f, 256 * 1024, 1 << 20, 60000);
    struct evs v = {0};

    int c = watch(&f, "/api/v1/namespaces/ns/pods?watch=1", 0);
    if (own_loop)
        ok(cfx_readable(&f, c), "own loop: served from the test's loop, no thread");
    ok(wait_events(&f, c, "ADDED", 5, &v), "rv unset: the state first, as ADDED events");
    struct cfx_resp r = {0};
    cfx_parse(&f.p[c].in, &r);
    is_int(r.status, 200, "200");
    ok(r.chunked, "chunked");
    ok(strcasestr(r.head, "\r\nContent-Type: application/json\r\n") != NULL, "JSON");
    ok(strcasestr(r.head, "\r\nConnection: close\r\n") != NULL, "Connection: close");
    is_int(v.n, 5, "...one per object");
    ok(!v.bad, "every line is a watch event");

    struct watch_stats s;
    watch_stats(p, &s);
    is_int(s.watchers, 1, "one watcher");
    struct watch_res_stats rs;
    watch_res_stats(p, 0, &rs);
    is_int(rs.watchers, 1, "...of the pods");

    uint64_t a = commit(&f, p, STORE_ADDED, "p0005", 100);
    uint64_t m = commit(&f, p, STORE_MODIFIED, "p0001", 100);
    uint64_t d = commit(&f, p, STORE_DELETED, "p0002", 100);
    ok(wait_events(&f, c, NULL, 8, &v), "then every change, live");
    if (v.n >= 8) {
        ok(strcmp(v.e[5].type, "ADDED") == 0 && strcmp(v.e[5].name, "p0005") == 0 && v.e[5].rv == a,
           "ADDED p0005 at its rv");
        ok(strcmp(v.e[6].type, "MODIFIED") == 0 && strcmp(v.e[6].name, "p0001") == 0 &&
               v.e[6].rv == m,
           "MODIFIED p0001 at its rv");
        ok(strcmp(v.e[7].type, "DELETED") == 0 && strcmp(v.e[7].name, "p0002") == 0 &&
               v.e[7].rv == d,
           "DELETED p0002 at its rv");
    }

    /* a second watcher from an rv: the events after it, no state */
    int c2 = watch(&f, "/api/v1/namespaces/ns/pods?watch=1&resourceVersion=100001", 0);
    ok(wait_events(&f, c2, NULL, 2, &v), "rv=N: every event after N");
    ok(v.n >= 2 && v.e[0].rv == m && v.e[1].rv == d, "...MODIFIED then DELETED, no ADDED");

    /* errors before the stream: kube's Status through the response writer */
    int c3 = watch(&f, "/api/v1/pods?watch=1&sendInitialEvents=true", 0);
    cfx_read(&f, c3, 0);
    cfx_parse(&f.p[c3].in, &r);
    is_int(r.status, 422, "sendInitialEvents without resourceVersionMatch: 422");
    free(r.body.p);

    /* the client goes: its watcher is freed */
    cfx_hangup(&f, c);
    unsigned long long one = 1, zero = 0;
    ok(wait_for(&f, p, watchers_are, &one), "a client that closes frees its watcher");
    cfx_hangup(&f, c2);
    ok(wait_for(&f, p, watchers_are, &zero), "...every one");
    watch_stats(p, &s);
    is_int(s.ended, 2, "two streams ended");
    is_int(s.started, 2, "...of two started");

    free(v.e);
    cfx_close_http(&f);
    watch_pool_free(p);
    cfx_close(&f);
}

/* ---- a busy worker holds its writes (pace.h), and its timer sends them ---- */

static void
test_held(void)
{
    struct cfx f;
    cfx_open(&f, 2, 100, 1000);
    struct watch_options wo = {.workers = 1,
                               .budget = 256 * 1024,
                               .window_bytes = 1 << 20,
                               .bookmark_ms = 60000,
                               .wait_ms = 3000,
                               .own_loop = own_loop,
                               .coalesce_max_us = 30000,
                               .flush_hold_us = 30000};
    struct watch_pool *p = watch_pool_new(f.base, f.st, &f.set, &wo);
    f.take = take;
    f.arg = p;
    struct evs v = {0};

    int c = watch(&f, "/api/v1/namespaces/ns/pods?watch=1", 0);
    ok(wait_events(&f, c, "ADDED", 2, &v), "the state");
    uint64_t rv[3];
    rv[0] = commit(&f, p, STORE_ADDED, "p0002", 100);
    rv[1] = commit(&f, p, STORE_MODIFIED, "p0000", 100);
    rv[2] = commit(&f, p, STORE_DELETED, "p0001", 100);
    /* nothing else happens on the worker: only its flush timer sends them */
    ok(wait_events(&f, c, NULL, 5, &v), "held writes leave when the window ends");
    is_int(v.n, 5, "every event once");
    if (v.n == 5)
        ok(v.e[2].rv == rv[0] && v.e[3].rv == rv[1] && v.e[4].rv == rv[2] &&
               strcmp(v.e[4].type, "DELETED") == 0,
           "in order");
    struct watch_stats s;
    watch_stats(p, &s);
    ok(s.held >= 1, "the rounds were held");
    is_int(s.delivered, 3, "three live deliveries");

    /* the end of a held stream goes out with its timer too */
    watch_pool_end_streams(p);
    ok(!wait_events(&f, c, NULL, 6, &v) && f.p[c].eof, "ended: the client sees EOF");
    struct cfx_resp r = {0};
    cfx_parse(&f.p[c].in, &r);
    ok(r.chunked && r.complete, "...after the terminal chunk");
    free(r.body.p);
    free(v.e);
    cfx_close_http(&f);
    watch_pool_free(p);
    cfx_close(&f);
}

/* --watch-coalesce-max-delay 0: a worker forced busy (a 300 ms hold asked
 * for) still writes every event in the round that applied it. */
static void
test_never_held(void)
{
    struct cfx f;
    cfx_open(&f, 2, 100, 1000);
    struct watch_options wo = {.workers = 1,
                               .budget = 256 * 1024,
                               .window_bytes = 1 << 20,
                               .bookmark_ms = 60000,
                               .wait_ms = 3000,
                               .own_loop = own_loop,
                               .no_coalesce = true,
                               .flush_hold_us = 300000};
    struct watch_pool *p = watch_pool_new(f.base, f.st, &f.set, &wo);
    f.take = take;
    f.arg = p;
    struct evs v = {0};
    int c = watch(&f, "/api/v1/namespaces/ns/pods?watch=1", 0);
    ok(wait_events(&f, c, "ADDED", 2, &v), "the state");
    uint64_t rv0 = commit(&f, p, STORE_ADDED, "p0002", 100);
    uint64_t rv1 = commit(&f, p, STORE_MODIFIED, "p0000", 100);
    ok(wait_events(&f, c, NULL, 4, &v), "the events leave");
    is_int(v.n, 4, "every event once");
    if (v.n == 4)
        ok(v.e[2].rv == rv0 && v.e[3].rv == rv1, "in order");
    /* (a round's counters are published after its flush: wait for them) */
    unsigned long long two = 2;
    ok(wait_for(&f, p, delivered_are, &two), "two live deliveries");
    struct watch_stats s;
    watch_stats(p, &s);
    is_int(s.held, 0, "no round held");
    free(v.e);
    cfx_close_http(&f);
    watch_pool_free(p);
    cfx_close(&f);
}

/* Held streams that go before their window ends: a client that hangs up
 * while its stream waits on the worker's dirty list is forgotten (the
 * other stream's held events still leave, once, in order); a pool freed
 * while a round is held closes every stream without sending it. (ASan:
 * no stream touched after its free.) */
static void
test_held_close(void)
{
    struct cfx f;
    cfx_open(&f, 2, 100, 1000);
    struct watch_options wo = {.workers = 1,
                               .budget = 256 * 1024,
                               .window_bytes = 1 << 20,
                               .bookmark_ms = 60000,
                               .wait_ms = 3000,
                               .own_loop = own_loop,
                               .coalesce_max_us = 300000,
                               .flush_hold_us = 300000};
    struct watch_pool *p = watch_pool_new(f.base, f.st, &f.set, &wo);
    f.take = take;
    f.arg = p;
    struct evs v = {0}, v2 = {0};
    int c = watch(&f, "/api/v1/namespaces/ns/pods?watch=1", 0);
    int c2 = watch(&f, "/api/v1/namespaces/ns/pods?watch=1", 0);
    ok(wait_events(&f, c, "ADDED", 2, &v), "the state");
    ok(wait_events(&f, c2, "ADDED", 2, &v2), "...on both streams");
    unsigned long long two = 2, one = 1;
    ok(wait_for(&f, p, watchers_are, &two), "two watchers");
    uint64_t rv = commit(&f, p, STORE_ADDED, "p0002", 100);
    cfx_hangup(&f, c2); /* its stream is held dirty with the event */
    ok(wait_for(&f, p, watchers_are, &one), "a held stream whose client went is forgotten");
    ok(wait_events(&f, c, NULL, 3, &v), "the other's held event leaves");
    is_int(v.n, 3, "...once");
    if (v.n == 3)
        ok(v.e[2].rv == rv, "...the one committed");
    /* a round held when the pool goes */
    commit(&f, p, STORE_MODIFIED, "p0000", 100);
    struct watch_stats s;
    watch_stats(p, &s);
    ok(s.held >= 1, "the rounds were held");
    free(v.e);
    free(v2.e);
    cfx_close_http(&f);
    watch_pool_free(p);
    cfx_close(&f);
}

/* ---- a watcher that stops reading, then catches up ---- */

static void
lagging(size_t window, const char *what)
{
    struct cfx f;
    enum { N = 300, SIZE = 1000 };
    cfx_open(&f, 5, 100, 100000);
    struct watch_pool *p = pool_open(&f, 4096, window, 60000);
    struct evs v = {0};
    int c = watch(&f, "/api/v1/pods?watch=1&resourceVersion=100000", 4096);
    unsigned long long one = 1;
    ok(wait_for(&f, p, watchers_are, &one), "the stream is open");

    for (int i = 0; i < N; i++) {
        char name[32];
        snprintf(name, sizeof name, "q%04d", i);
        commit(&f, p, STORE_ADDED, name, SIZE);
    }
    ok(wait_for(&f, p, any_lagging, NULL), "a watcher that does not read lags");

    /* the client reads: it catches up, every event once, in order */
    ok(wait_events(&f, c, NULL, N, &v), "it gets every event");
    size_t bad = 0;
    for (size_t i = 0; i < v.n; i++)
        bad += v.e[i].rv != 100000 + 1 + i || strcmp(v.e[i].type, "ADDED") != 0;
    is_int(bad, 0, "...each once, in rv order, no gap");
    is_int(v.n, N, "...and no more");
    struct watch_res_stats rs;
    watch_res_stats(p, 0, &rs);
    ok(rs.hub.store + rs.hub.window > 0, "...caught up from the history");
    if (window <= 1)
        ok(rs.hub.store > 0, what);
    else
        ok(rs.hub.window > 0, what);

    /* and is live again */
    uint64_t rv = commit(&f, p, STORE_MODIFIED, "q0000", 10);
    ok(wait_events(&f, c, NULL, N + 1, &v) && v.e[N].rv == rv, "...then live again");
    watch_res_stats(p, 0, &rs);
    is_int(rs.hub.lagging, 0, "no watcher lags any more");

    free(v.e);
    cfx_close_http(&f);
    watch_pool_free(p);
    cfx_close(&f);
}

static void
test_lagging(void)
{
    lagging(1, "behind a one-byte window: from the store");
    lagging(64 << 20, "inside the window: from the window's shared events");
}

/* ---- bookmarks ---- */

static void
test_bookmarks(void)
{
    struct cfx f;
    cfx_open(&f, 3, 100, 1000);
    struct watch_pool *p = pool_open(&f, 256 * 1024, 1 << 20, 100);
    struct evs v = {0}, w = {0};

    int quiet = watch(&f, "/api/v1/pods?watch=1", 0);
    int c = watch(&f, "/api/v1/pods?watch=1&allowWatchBookmarks=true", 0);
    ok(wait_events(&f, c, "BOOKMARK", 3, &v), "allowWatchBookmarks: bookmarks, on the interval");
    size_t at_rv = 0;
    for (size_t i = 0; i < v.n; i++)
        at_rv += strcmp(v.e[i].type, "BOOKMARK") == 0 && v.e[i].rv == CFX_LIST_RV;
    is_int(at_rv, count(&v, "BOOKMARK"), "...each at the cache's rv");
    is_int(count(&v, "ADDED"), 3, "...after the state");

    /* an event moves the bookmarks' rv */
    uint64_t rv = commit(&f, p, STORE_MODIFIED, "p0000", 100);
    size_t before = count(&v, "BOOKMARK");
    ok(wait_events(&f, c, "BOOKMARK", before + 1, &v), "another bookmark");
    ok(v.e[v.n - 1].rv == rv, "...at the newest rv");

    /* the watcher that did not ask got the same time and no bookmark */
    cfx_read(&f, quiet, 0);
    events(&f, quiet, &w);
    is_int(count(&w, "BOOKMARK"), 0, "without allowWatchBookmarks: none");
    is_int(w.n, 4, "...the state and the event only");

    /* sendInitialEvents: the state, then the bookmark that ends it */
    int si = watch(&f,
                   "/api/v1/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
                   "&allowWatchBookmarks=true",
                   0);
    ok(wait_events(&f, si, "BOOKMARK", 1, &v), "sendInitialEvents: a bookmark");
    ok(v.n >= 4 && count(&v, "ADDED") == 3 && strcmp(v.e[3].type, "BOOKMARK") == 0 &&
           v.e[3].initial_end,
       "...after the 3 ADDED, with k8s.io/initial-events-end");

    struct watch_res_stats rs;
    watch_res_stats(p, 0, &rs);
    ok(rs.hub.bookmarks >= 5, "the pods' bookmarks are counted");

    free(v.e);
    free(w.e);
    cfx_close_http(&f);
    watch_pool_free(p);
    cfx_close(&f);
}

/* ---- the server drains (SIGTERM): every stream ends, the pool goes on ---- */

static bool
pool_streams_are(struct watch_pool *p, const void *arg)
{
    return watch_pool_streams(p) == *(const size_t *)arg;
}

static void
test_end_streams(void)
{
    struct cfx f;
    cfx_open(&f, 5, 100, 1000);
    struct watch_pool *p = pool_open(&f, 256 * 1024, 1 << 20, 60000);
    struct evs v = {0};
    int c = watch(&f, "/api/v1/namespaces/ns/pods?watch=1", 0);
    int c2 = watch(&f, "/api/v1/pods?watch=1&resourceVersion=100000", 0);
    ok(wait_events(&f, c, "ADDED", 5, &v), "the state");
    size_t two = 2, zero = 0;
    ok(wait_for(&f, p, pool_streams_are, &two), "two streams open");

    watch_pool_end_streams(p);
    ok(!wait_events(&f, c, NULL, 6, &v) && f.p[c].eof, "ended: the client sees EOF");
    struct cfx_resp r = {0};
    cfx_parse(&f.p[c].in, &r);
    ok(r.chunked && r.complete, "...after the terminal chunk");
    is_int(v.n, 5, "...and nothing after the state");
    ok(!wait_events(&f, c2, NULL, 1, &v) && f.p[c2].eof, "the other one too");
    cfx_parse(&f.p[c2].in, &r);
    ok(r.status == 200 && r.complete, "...cleanly");
    ok(wait_for(&f, p, pool_streams_are, &zero), "no stream open");

    /* a watch after it: its head, then it ends at once */
    int c3 = watch(&f, "/api/v1/pods?watch=1&resourceVersion=100000", 0);
    commit(&f, p, STORE_ADDED, "p0009", 100);
    ok(!wait_events(&f, c3, NULL, 1, &v) && f.p[c3].eof, "a later watch ends at once");
    cfx_parse(&f.p[c3].in, &r);
    ok(r.status == 200 && r.complete, "...cleanly, with no event");
    ok(wait_for(&f, p, pool_streams_are, &zero), "no stream open again");
    struct watch_stats s;
    watch_stats(p, &s);
    is_int(s.ended, 3, "three streams ended");

    free(r.body.p);
    free(v.e);
    cfx_close_http(&f);
    watch_pool_free(p);
    cfx_close(&f);
}

/* ---- metadata-only and pretty watches ---- */

static int
watch_h(struct cfx *f, const char *target, const char *headers)
{
    int c = cfx_connect(f, 0);
    char req[1024];
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: kwc\r\n%s\r\n", target, headers);
    cfx_send(f, c, req);
    return c;
}

/* The body client c has read so far (new). */
static char *
body_of(struct cfx *f, int c, size_t *len)
{
    struct cfx_resp r = {0};
    cfx_parse(&f->p[c].in, &r);
    *len = r.body.len;
    return r.body.p;
}

static void
test_meta_and_pretty(void)
{
    struct cfx f;
    cfx_open(&f, 4, 100, 1000);
    struct watch_pool *p = pool_open(&f, 256 * 1024, 1 << 20, 60000);
    struct evs v = {0}, m = {0};
    const char *path = "/api/v1/namespaces/ns/pods?watch=1";
    int full = watch(&f, path, 0);
    int meta = watch_h(&f, path,
                       "Accept: application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1\r\n");
    int pretty = watch(&f, "/api/v1/namespaces/ns/pods?watch=1&pretty=true", 0);
    int curl = watch_h(&f, path, "User-Agent: curl/8.5.0\r\n");
    ok(wait_events(&f, full, "ADDED", 4, &v), "a full watcher: the state");
    ok(wait_events(&f, meta, "ADDED", 4, &m), "a metadata watcher of the same cache: the state");
    uint64_t rv = commit(&f, p, STORE_MODIFIED, "p0001", 100);
    ok(wait_events(&f, full, NULL, 5, &v) && wait_events(&f, meta, NULL, 5, &m),
       "...and the event, both");
    bool same = v.n == 5 && m.n == 5;
    for (size_t i = 0; same && i < 5; i++)
        same = strcmp(v.e[i].type, m.e[i].type) == 0 && strcmp(v.e[i].name, m.e[i].name) == 0 &&
               v.e[i].rv == m.e[i].rv;
    ok(same && m.e[4].rv == rv, "the same events");
    size_t ml, fl;
    char *mb = body_of(&f, meta, &ml), *fb = body_of(&f, full, &fl);
    ok(mb && strstr(mb, "{\"type\":\"MODIFIED\",\"object\":{\"kind\":\"PartialObjectMetadata\","
                        "\"apiVersion\":\"meta.k8s.io/v1\",\"metadata\":{") != NULL,
       "...as PartialObjectMetadata");
    ok(mb && !strstr(mb, "\"kind\":\"Pod\"") && fb && strstr(fb, "\"kind\":\"Pod\""),
       "...where the full watcher has Pods");
    struct cfx_resp r = {0};
    cfx_parse(&f.p[meta].in, &r);
    ok(r.status == 200 && strcasestr(r.head, "\r\nContent-Type: application/json\r\n") != NULL,
       "200, application/json");
    free(r.body.p);
    free(mb);

    /* pretty: served from the cache, its events as every watcher's */
    struct evs pv = {0};
    ok(wait_events(&f, pretty, NULL, 5, &pv), "?pretty=true: served");
    size_t pl;
    char *pb = body_of(&f, pretty, &pl);
    is_mem(pb, pl, fb, fl, "...the same bytes: events are never indented");
    free(pb);
    ok(wait_events(&f, curl, NULL, 5, &pv), "a curl User-Agent: served");
    pb = body_of(&f, curl, &pl);
    is_mem(pb, pl, fb, fl, "...the same bytes");
    free(pb);
    free(fb);

    free(v.e);
    free(m.e);
    free(pv.e);
    cfx_close_http(&f);
    watch_pool_free(p);
    cfx_close(&f);
}

int
main(void)
{
    TAP_RUN(test_lifecycle);
    TAP_RUN(test_lagging);
    TAP_RUN(test_bookmarks);
    TAP_RUN(test_end_streams);
    TAP_RUN(test_held);
    TAP_RUN(test_held_close);
    TAP_RUN(test_never_held);
    TAP_RUN(test_meta_and_pretty);
    own_loop = true;
    TAP_RUN(test_lifecycle);
    TAP_RUN(test_lagging);
    TAP_RUN(test_bookmarks);
    TAP_RUN(test_end_streams);
    TAP_RUN(test_held);
    TAP_RUN(test_held_close);
    TAP_RUN(test_never_held);
    TAP_RUN(test_meta_and_pretty);
    return tap_done();
}
