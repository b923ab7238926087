/*
 * hub_test.c — cache/hub.c with a real LMDB store and in-memory sinks: event
 * encoding (TypeMeta; blobs of event lines only, no framing), selector
 * transitions as kube sends them, index routing (an event visits only its
 * buckets), the budget (a watcher over it lags, then catches up from the
 * window of recent batches or the store's history with no gap or duplicate),
 * the initial state in chunks, 410 below the floor, bookmarks, deadlines, the
 * sendInitialEvents wait, and a history reset. Time injected. The same for a
 * protobuf cache: length-prefixed WatchEvent frames (read back with a decoder
 * of the test's own), Status objects in protobuf. Metadata-only watchers in
 * both; a custom resource's JSON cache watched for its metadata in protobuf
 * against frames written by Google's protobuf runtime (pom_vectors.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/gostr.h"
#include "kwc/hub.h"
#include "kwc/index.h"
#include "kwc/object.h"
#include "kwc/selector.h"
#include "kwc/store.h"
#include "pom_vectors.h"
#include "tap.h"

static char dir[256];
static struct store *st;
static struct store_res *sres;
static struct hub_res *res;
static uint64_t rv = 100;

static const struct obj_field fields[] = {
    {"metadata.name", NULL}, {"metadata.namespace", NULL}, {"spec.nodeName", NULL}};
static const char *const field_names[] = {"metadata.name", "metadata.namespace", "spec.nodeName"};

/* ---- a memory sink ---- */

/* One write call: the unit a transport frames (one HTTP/1.1 chunk). */
struct mwrite {
    const struct hub_blob *b; /* identity only, not held */
    size_t off, len;          /* its bytes: buf[off, off + len) */
    bool whole;               /* they were all of b's bytes */
};

struct msink {
    char buf[1 << 20]; /* every byte written, in order */
    size_t len;
    struct mwrite w[2048];
    size_t nw;
    size_t queued; /* what the hub is told is still queued */
    int wakes;
    bool ended;
    enum hub_end why;
};

static void
m_write(void *s, struct hub_blob *b, const char *p, size_t len)
{
    struct msink *m = s;
    if (m->len + len >= sizeof(m->buf) || m->nw == sizeof(m->w) / sizeof(m->w[0]))
        abort(); /* a test outgrew the sink */
    m->w[m->nw++] = (struct mwrite){b, m->len, len, p == b->data && len == b->len};
    memcpy(m->buf + m->len, p, len);
    m->len += len;
}
static size_t
m_queued(void *s)
{
    return ((struct msink *)s)->queued;
}
static void
m_wake(void *s)
{
    ((struct msink *)s)->wakes++;
}
static void
m_end(void *s, enum hub_end why)
{
    struct msink *m = s;
    m->ended = true;
    m->why = why;
}
static const struct hub_sink_ops ops = {m_write, m_queued, m_wake, m_end};

/* The event lines in a sink, as "TYPE key rv" each. */
static int
lines(struct msink *m, char out[][200], int max)
{
    static char body[1 << 20];
    memcpy(body, m->buf, m->len);
    body[m->len] = '\0';
    int n = 0;
    for (char *p = body, *nl; n < max && (nl = strchr(p, '\n')); p = nl + 1) {
        *nl = '\0';
        char type[16] = "", name[64] = "", ns[64] = "", rvs[32] = "";
        char *t = strstr(p, "\"type\":\"");
        if (t)
            sscanf(t + 8, "%15[^\"]", type);
        char *md = strstr(p, "\"metadata\":{");
        char *nm = md ? strstr(md, "\"name\":\"") : NULL;
        if (nm)
            sscanf(nm + 8, "%63[^\"]", name);
        char *nsp = md ? strstr(md, "\"namespace\":\"") : NULL;
        if (nsp)
            sscanf(nsp + 13, "%63[^\"]", ns);
        char *r = md ? strstr(md, "\"resourceVersion\":\"") : NULL;
        if (r)
            sscanf(r + 19, "%31[^\"]", rvs);
        snprintf(out[n++], 200, "%s %s%s%s %s", type, ns, *ns ? "/" : "", name, rvs);
    }
    return n;
}

/* ---- writing events ---- */

static char *
pod(const char *ns, const char *name, const char *flip, const char *node, uint64_t r)
{
    return xasprintf(
        "{\"metadata\":{\"name\":\"%s\",\"namespace\":\"%s\",\"resourceVersion\":\"%llu\","
        "\"labels\":{\"flip\":\"%s\"}},\"spec\":{\"nodeName\":\"%s\"}}",
        name, ns, (unsigned long long)r, flip, node);
}

/* Write one event at the next rv; returns that rv. */
static uint64_t
put(enum store_ev_type t, const char *ns, const char *name, const char *flip, const char *node)
{
    rv++;
    char *o = pod(ns, name, flip, node, rv);
    struct obj_fields_spec spec = {.fields = fields, .n_fields = 3};
    struct obj_meta m;
    if (obj_meta_parse(o, strlen(o), &spec, &m, NULL, 0) != 0)
        abort();
    char *idx;
    size_t il;
    idx_encode(&m, &idx, &il);
    char key[200];
    snprintf(key, sizeof key, "%s/%s", ns, name);
    struct store_wtxn *w;
    store_wtxn_begin(st, 1, &w);
    struct store_event ev = {.type = t,
                             .rv = rv,
                             .key = key,
                             .key_len = strlen(key),
                             .obj = o,
                             .obj_len = strlen(o),
                             .idx = idx,
                             .idx_len = il};
    if (store_wtxn_event(w, sres, &ev) != 0 || store_wtxn_commit(w) != 0)
        abort();
    free(idx);
    obj_meta_fini(&m);
    free(o);
    return rv;
}

static uint64_t posted;

/* Hand what was committed since the last call to the hub. */
static void
publish(struct hub *h)
{
    struct hub_batch *b;
    if (hub_batch_build(st, res, posted, rv, true, &b) != 0)
        abort();
    hub_apply(h, b);
    hub_batch_unref(b);
    posted = rv;
}

static void
setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/kwc-hub-test-XXXXXX");
    if (!mkdtemp(dir))
        abort();
    struct store_options o;
    store_options_default(&o);
    o.map_size = 64 << 20;
    o.history_max_events = 1000;
    if (store_open(dir, &o, &st) != 0 || store_res(st, "v1/pods:json", &sres) != 0)
        abort();
    struct store_wtxn *w;
    store_wtxn_begin(st, 1, &w);
    store_wtxn_reset(w, sres, rv);
    store_wtxn_set_synced(w, sres, true);
    store_wtxn_commit(w);
    posted = rv;
    res = hub_res_new_enc(KWC_ENC_JSON, 0, sres, "Pod", "v1", false, true, field_names, 3, 2);
}

static void
teardown(void)
{
    hub_res_free(res);
    store_close(st);
    char p[512];
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/lock.mdb", dir);
    unlink(p);
    rmdir(dir);
    rv = 100;
}

static struct hub_watcher *
watch(struct hub *h, struct msink *m, const char *ns, const char *lsel, const char *fsel,
      bool initial, uint64_t from)
{
    struct sel *sel = NULL;
    char *err = NULL;
    if (sel_parse(lsel, fsel, &sel, &err) != 0)
        abort();
    struct hub_watch_req req = {
        .ns = ns, .sel = sel, .initial = initial, .rv = from, .deadline_ms = 1000000};
    return hub_watch(h, res, &req, &ops, m, posted, 0, 1);
}

static struct hub_options hopts = {.budget = 4096, .chunk_bytes = 512, .bookmark_ms = 1000};

/* ---- tests ---- */

static void
test_encoding_and_transitions(void)
{
    setup();
    struct hub *h = hub_new(st, &hopts);
    static struct msink all, ns1, flip, node1;
    memset(&all, 0, sizeof all), memset(&ns1, 0, sizeof ns1);
    memset(&flip, 0, sizeof flip), memset(&node1, 0, sizeof node1);
    uint64_t start = rv;
    watch(h, &all, NULL, NULL, NULL, false, start);
    watch(h, &ns1, "ns-1", NULL, NULL, false, start);
    watch(h, &flip, NULL, "flip=a", NULL, false, start);
    watch(h, &node1, NULL, NULL, "spec.nodeName=node-1", false, start);
    put(STORE_ADDED, "ns-1", "a", "a", "node-1");    /* 101 */
    put(STORE_MODIFIED, "ns-1", "a", "b", "node-1"); /* 102: leaves flip=a */
    put(STORE_MODIFIED, "ns-2", "b", "a", "node-2"); /* 103: never seen before by anyone but all */
    put(STORE_MODIFIED, "ns-1", "a", "a", "node-2"); /* 104: enters flip=a, leaves node-1 */
    put(STORE_DELETED, "ns-1", "a", "a", "node-2");  /* 105 */
    publish(h);

    /* the first write, byte for byte: the event's watch line and nothing
     * else (framing is the transport's), TypeMeta back in front */
    const char *want =
        "{\"type\":\"ADDED\",\"object\":{\"kind\":\"Pod\",\"apiVersion\":\"v1\","
        "\"metadata\":{\"name\":\"a\",\"namespace\":\"ns-1\",\"resourceVersion\":\"101\","
        "\"labels\":{\"flip\":\"a\"}},\"spec\":{\"nodeName\":\"node-1\"}}}\n";
    is_int(all.nw, 5, "live: one write per event (one chunk each on HTTP/1.1)");
    is_mem(all.buf + all.w[0].off, all.w[0].len, want, strlen(want),
           "an event's write is its watch line alone, TypeMeta first");
    ok(all.w[0].whole, "and that line is the whole blob: no chunk framing in it");

    char l[16][200];
    int n = lines(&all, l, 16);
    is_int(n, 5, "unfiltered: every event");
    is_str(l[2], "MODIFIED ns-2/b 103", "unfiltered: a MODIFIED stays MODIFIED");
    n = lines(&ns1, l, 16);
    is_int(n, 4, "namespace: its own objects only");
    n = lines(&flip, l, 16);
    is_int(n, 5, "label selector: five events");
    is_str(l[0], "ADDED ns-1/a 101", "flip=a: ADDED");
    /* leaving: the previous object (flip=a) stamped with the event's rv */
    is_str(l[1], "DELETED ns-1/a 102", "flip=a: leaving is DELETED at the event's rv");
    ok(strstr(flip.buf, "\"labels\":{\"flip\":\"a\"}},\"spec\":{\"nodeName\":\"node-1\"}}}\n") !=
           NULL,
       "the leaving DELETED carries the previous object");
    is_str(l[2], "ADDED ns-2/b 103", "a MODIFIED of an object it never had: ADDED");
    is_str(l[3], "ADDED ns-1/a 104", "entering: ADDED");
    is_str(l[4], "DELETED ns-1/a 105", "a DELETED judged by the previous object");
    n = lines(&node1, l, 16);
    is_int(n, 3, "field selector: node-1's events");
    is_str(l[2], "DELETED ns-1/a 104", "moving off the node: DELETED");
    hub_free(h);
    ok(all.ended && all.why == HUB_END_SHUTDOWN, "hub_free ends the streams");
    teardown();
}

static void
test_index_visits(void)
{
    setup();
    struct hub *h = hub_new(st, &hopts);
    static struct msink m[50];
    memset(m, 0, sizeof m);
    for (int i = 0; i < 50; i++) {
        char f[64];
        snprintf(f, sizeof f, "spec.nodeName=node-%d", i % 5);
        watch(h, &m[i], NULL, NULL, f, false, rv);
    }
    static struct msink other;
    memset(&other, 0, sizeof other);
    watch(h, &other, "ns-9", NULL, NULL, false, rv);
    struct hub_stats s0, s1;
    hub_stats(h, &s0);
    put(STORE_ADDED, "ns-1", "x", "a", "node-3");
    publish(h);
    hub_stats(h, &s1);
    is_int(s1.visits - s0.visits, 10, "an event visits only its node's watchers");
    is_int(s1.delivered - s0.delivered, 10, "and each of them gets it");
    is_int(other.len, 0, "another namespace's watcher is not visited");
    hub_free(h);
    teardown();
}

static void
test_lag_and_catchup(void)
{
    setup();
    struct hub *h = hub_new(st, &hopts);
    static struct msink slow, fast;
    memset(&slow, 0, sizeof slow), memset(&fast, 0, sizeof fast);
    struct hub_watcher *w = watch(h, &slow, NULL, NULL, NULL, false, rv);
    watch(h, &fast, NULL, NULL, NULL, false, rv);
    put(STORE_ADDED, "ns-1", "a", "a", "n");
    publish(h);
    slow.queued = 10000; /* over the 4096 budget: its socket is not draining */
    for (int i = 0; i < 20; i++)
        put(STORE_MODIFIED, "ns-1", "a", i % 2 ? "a" : "b", "n");
    publish(h);
    struct hub_stats s;
    hub_stats(h, &s);
    is_int(s.lagging, 1, "the slow watcher lags");
    ok(slow.wakes > 0, "and is told to pump when it drains");
    size_t before = slow.len;
    ok(hub_pump_wanted(w), "it is owed stored events");
    slow.queued = 0;
    bool alive = true;
    int steps = 0;
    while (hub_pump(w, &alive) && alive && steps < 100)
        steps++;
    ok(alive && steps > 0, "catching up takes several bounded steps");
    ok(slow.len > before, "the history was sent");
    put(STORE_MODIFIED, "ns-1", "a", "a", "n");
    publish(h);
    hub_stats(h, &s);
    is_int(s.lagging, 0, "live again");
    char a[32][200], b[32][200];
    int na = lines(&slow, a, 32), nb = lines(&fast, b, 32);
    is_int(na, 22, "every event once");
    is_int(nb, 22, "the fast watcher too");
    bool same = na == nb;
    for (int i = 0; same && i < na; i++)
        same = strcmp(a[i], b[i]) == 0;
    ok(same, "the same events in the same order as the fast watcher");
    hub_free(h);
    teardown();
}

/* A lagging watcher catches up from the window by reference when it reaches
 * back that far, from the store (encoded for it) when it does not, and from
 * the store then the window when it lags across both: the bytes are the
 * same as a live watcher's each time, selector transitions included. */
static void
catchup_from(size_t window_bytes, bool want_window, bool want_store, const char *what)
{
    setup();
    struct hub_options o = hopts;
    o.window_bytes = window_bytes;
    struct hub *h = hub_new(st, &o);
    static struct msink slow, fast;
    memset(&slow, 0, sizeof slow), memset(&fast, 0, sizeof fast);
    struct hub_watcher *w = watch(h, &slow, NULL, "flip=a", NULL, false, rv);
    watch(h, &fast, NULL, "flip=a", NULL, false, rv);
    put(STORE_ADDED, "ns-1", "a", "a", "n");
    publish(h);
    slow.queued = 10000;          /* over the budget from here on */
    for (int b = 0; b < 4; b++) { /* four batches of five: flips in and out of the selector */
        for (int i = 0; i < 5; i++)
            put(STORE_MODIFIED, "ns-1", i % 2 ? "b" : "c", i % 3 ? "a" : "b", "n");
        publish(h);
    }
    slow.queued = 0;
    bool alive = true;
    for (int i = 0; i < 100 && hub_pump(w, &alive) && alive; i++)
        ;
    struct hub_stats s;
    hub_stats(h, &s);
    char m[4][200];
    snprintf(m[0], sizeof m[0], "%s: live again", what);
    snprintf(m[1], sizeof m[1], "%s: events from the window: %llu", what, s.from_window);
    snprintf(m[2], sizeof m[2], "%s: events from the store: %llu", what, s.from_store);
    is_int(s.lagging, 0, m[0]);
    ok((s.from_window > 0) == want_window, m[1]);
    ok((s.from_store > 0) == want_store, m[2]);
    char a[64][200], b[64][200];
    int na = lines(&slow, a, 64), nb = lines(&fast, b, 64);
    bool same = na == nb && na > 5;
    for (int i = 0; same && i < na; i++)
        same = strcmp(a[i], b[i]) == 0;
    snprintf(m[3], sizeof m[3], "%s: the lagging watcher's %d events are the live watcher's %d",
             what, na, nb);
    ok(same, m[3]);
    /* from the store, several events share one write; the events' bytes are the same */
    snprintf(m[0], sizeof m[0], "%s: byte for byte", what);
    is_mem(slow.buf, slow.len, fast.buf, fast.len, m[0]);
    if (!want_store) {
        /* the window's batches still hold the fast watcher's blobs */
        bool same_writes = slow.nw == fast.nw;
        for (size_t i = 0; same_writes && i < slow.nw; i++)
            same_writes = slow.w[i].b == fast.w[i].b && slow.w[i].len == fast.w[i].len &&
                          slow.w[i].whole && fast.w[i].whole;
        snprintf(m[0], sizeof m[0], "%s: the same writes too (the same shared blobs)", what);
        ok(same_writes, m[0]);
    }
    hub_free(h);
    teardown();
}

static void
test_catchup_sources(void)
{
    catchup_from(16 << 20, true, false, "a window that reaches back");
    catchup_from(1, true, true, "a window of one batch: the store, then the window");
}

/* The window is for watchers: when a resource's last watcher leaves, its
 * window goes (an idle cache holds no events in memory); a later watcher
 * from before catches up from the store, with the same events. */
static void
test_window_freed_without_watchers(void)
{
    setup();
    struct hub *h = hub_new(st, &hopts);
    static struct msink first, later;
    memset(&first, 0, sizeof first), memset(&later, 0, sizeof later);
    uint64_t from = rv;
    struct hub_watcher *w = watch(h, &first, NULL, NULL, NULL, false, from);
    for (int b = 0; b < 3; b++) {
        put(STORE_MODIFIED, "ns-1", "a", b % 2 ? "a" : "b", "n");
        publish(h);
    }
    is_int(lines(&first, (char[8][200]){{0}}, 8), 3, "the first watcher got the three events");
    hub_unwatch(w);
    struct hub_stats s0, s1;
    hub_stats(h, &s0);
    w = watch(h, &later, NULL, NULL, NULL, false, from);
    bool alive = true;
    for (int i = 0; i < 20 && hub_pump(w, &alive) && alive; i++)
        ;
    hub_stats(h, &s1);
    is_int(s1.from_window - s0.from_window, 0, "no window left to catch up from");
    is_int(s1.from_store - s0.from_store, 3, "the store's history instead");
    is_mem(later.buf, later.len, first.buf, first.len, "the same events, byte for byte");
    hub_free(h);
    teardown();
}

static void
test_skipped_batches_are_caught_up(void)
{
    setup();
    struct hub *h = hub_new(st, &hopts);
    static struct msink m;
    memset(&m, 0, sizeof m);
    struct hub_watcher *w = watch(h, &m, NULL, NULL, NULL, false, rv);
    for (int i = 0; i < 3; i++)
        put(STORE_MODIFIED, "ns-1", "a", "a", "n");
    posted = rv; /* a batch this hub never got */
    for (int i = 0; i < 2; i++)
        put(STORE_MODIFIED, "ns-1", "a", "b", "n");
    publish(h);
    ok(hub_pump_wanted(w), "a batch starting past the hub's rv: the watcher reads the history");
    bool alive = true;
    for (int i = 0; i < 10 && hub_pump(w, &alive) && alive; i++)
        ;
    char l[8][200];
    is_int(lines(&m, l, 8), 5, "nothing lost");
    is_str(l[0], "MODIFIED ns-1/a 101", "from the first skipped event");
    is_str(l[4], "MODIFIED ns-1/a 105", "to the last");
    hub_free(h);
    teardown();
}

static void
test_initial_state(void)
{
    setup();
    for (int i = 0; i < 30; i++) {
        char name[16];
        snprintf(name, sizeof name, "p%02d", i);
        put(STORE_ADDED, i % 2 ? "ns-1" : "ns-2", name, i % 3 ? "a" : "b", "n");
    }
    posted = rv;
    uint64_t snap = rv;
    struct hub *h = hub_new(st, &hopts);
    static struct msink m;
    memset(&m, 0, sizeof m);
    struct sel *sel = NULL;
    char *err = NULL;
    sel_parse("flip=a", NULL, &sel, &err);
    struct hub_watch_req req = {.ns = "ns-1",
                                .sel = sel,
                                .initial = true,
                                .initial_end = true,
                                .bookmarks = true,
                                .deadline_ms = 1000000};
    struct hub_watcher *w = hub_watch(h, res, &req, &ops, &m, posted, 0, 1);
    ok(w && hub_pump_wanted(w), "initial state owed");
    put(STORE_ADDED, "ns-1", "zz", "a", "n"); /* after the snapshot: a live event */
    publish(h);
    bool alive = true;
    int steps = 0;
    while (hub_pump(w, &alive) && alive && steps < 100)
        steps++;
    ok(steps > 1, "in several chunks");
    char l[40][200];
    int n = lines(&m, l, 40);
    /* ns-1 has odd i; flip=a where i % 3 != 0: 1,5,7,11,13,17,19,23,25,29 */
    is_int(n, 12, "10 objects, the bookmark, the later event");
    is_str(l[0], "ADDED ns-1/p01 102", "in key order");
    is_str(l[9], "ADDED ns-1/p29 130", "the last of the state");
    char want[64];
    snprintf(want, sizeof want, "BOOKMARK  %llu", (unsigned long long)snap);
    is_str(l[10], want, "then the initial-events-end bookmark at the snapshot rv");
    ok(strstr(m.buf, "\"annotations\":{\"k8s.io/initial-events-end\":\"true\"}") != NULL,
       "with its annotation");
    is_str(l[11], "ADDED ns-1/zz 131", "then what happened after");
    hub_free(h);
    teardown();
}

static void
test_too_old_and_reset(void)
{
    setup();
    for (int i = 0; i < 1200; i++) /* history holds 1000 */
        put(STORE_MODIFIED, "ns-1", "a", "a", "n");
    posted = rv;
    struct hub *h = hub_new(st, &hopts);
    static struct msink m, later;
    memset(&m, 0, sizeof m), memset(&later, 0, sizeof later);
    ok(watch(h, &m, NULL, NULL, NULL, false, 150) == NULL, "below the floor: no watcher");
    ok(m.ended && m.why == HUB_END_ERROR_EVENT, "the stream ends after its ERROR event");
    const char *expired =
        "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"apiVersion\":\"v1\","
        "\"metadata\":{},\"status\":\"Failure\",\"message\":\"too old resource version: "
        "150 (300)\",\"reason\":\"Expired\",\"code\":410}}\n";
    is_mem(m.buf, m.len, expired, strlen(expired),
           "kube's 410 Expired Status, the ERROR event's line alone");
    ok(m.nw == 1 && m.w[0].whole, "in one write of its whole blob");
    struct hub_watch_req req = {.initial = false, .rv = rv, .deadline_ms = 100};
    hub_watch(h, res, &req, &ops, &later, posted, 0, 1);
    put(STORE_MODIFIED, "ns-1", "a", "b", "n"); /* 1301 */
    publish(h);
    const char *modified =
        "{\"type\":\"MODIFIED\",\"object\":{\"kind\":\"Pod\",\"apiVersion\":\"v1\","
        "\"metadata\":{\"name\":\"a\",\"namespace\":\"ns-1\",\"resourceVersion\":\"1301\","
        "\"labels\":{\"flip\":\"b\"}},\"spec\":{\"nodeName\":\"n\"}}}\n";
    is_mem(later.buf, later.len, modified, strlen(modified),
           "a live event: its line and nothing around it");
    struct hub_batch *b;
    hub_batch_build(st, res, rv, rv, false, &b);
    b->gap = true;
    hub_apply(h, b);
    hub_batch_unref(b);
    ok(later.ended && later.why == HUB_END_RESET, "a history reset ends the watchers");
    hub_free(h);
    teardown();
}

/* The upstream's timeline changed: watchers end with a 410 Expired ERROR
 * event; the resource starts over at a lower rv, and a hub with no watchers
 * of it, that missed the gap, follows it down when a watcher comes. */
static void
test_upstream_reset(void)
{
    setup();
    put(STORE_ADDED, "ns-1", "a", "a", "n");
    posted = rv;
    struct hub *h = hub_new(st, &hopts), *idle = hub_new(st, &hopts);
    static struct msink m, after;
    memset(&m, 0, sizeof m), memset(&after, 0, sizeof after);
    struct hub_watch_req req = {.rv = rv, .deadline_ms = 100000};
    hub_watch(h, res, &req, &ops, &m, posted, 0, 1);
    static struct msink seen_idle;
    memset(&seen_idle, 0, sizeof seen_idle);
    struct hub_watch_req ri = {.rv = rv, .deadline_ms = 100000};
    struct hub_watcher *wi = hub_watch(idle, res, &ri, &ops, &seen_idle, posted, 0, 1);
    hub_unwatch(wi); /* that hub knows rv 101 and has no watcher of it now */
    struct hub_batch *b;
    hub_batch_build(st, res, posted, posted, false, &b);
    b->gap = true;
    b->expired = true;
    hub_apply(h, b);
    hub_batch_unref(b);
    ok(m.ended && m.why == HUB_END_UPSTREAM, "the watcher ended: the upstream's reset");
    const char *gone = "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"apiVersion\":\"v1\","
                       "\"metadata\":{},\"status\":\"Failure\",\"message\":\"too old resource "
                       "version: 101 (the upstream was restored or replaced: its resourceVersions "
                       "went back; relist)\",\"reason\":\"Expired\",\"code\":410}}\n";
    is_mem(m.buf, m.len, gone, strlen(gone),
           "after kube's 410 Expired ERROR event, as for a too "
           "old rv");
    /* the cache starts over at rv 5 */
    if (store_res_clear(st, sres) != 0)
        abort();
    struct store_wtxn *w;
    store_wtxn_begin(st, 1, &w);
    store_wtxn_reset(w, sres, 5);
    store_wtxn_set_synced(w, sres, true);
    store_wtxn_commit(w);
    rv = 5;
    hub_batch_build(st, res, 5, 5, false, &b);
    b->gap = true;
    hub_apply(h, b);
    hub_batch_unref(b);
    posted = 5;
    struct hub_watch_req r2 = {.rv = 5, .deadline_ms = 100000};
    hub_watch(h, res, &r2, &ops, &after, posted, 0, 1);
    static struct msink on_idle;
    memset(&on_idle, 0, sizeof on_idle);
    hub_watch(idle, res, &r2, &ops, &on_idle, posted, 0, 1);
    put(STORE_ADDED, "ns-1", "b", "a", "n"); /* 6 */
    struct hub_batch *b2;
    hub_batch_build(st, res, posted, rv, true, &b2);
    hub_apply(h, b2);
    hub_apply(idle, b2);
    hub_batch_unref(b2);
    posted = rv;
    char l[4][200];
    ok(lines(&after, l, 4) == 1 && strcmp(l[0], "ADDED ns-1/b 6") == 0,
       "the hub followed the store down: the new timeline's events reach new watchers");
    ok(lines(&on_idle, l, 4) == 1 && strcmp(l[0], "ADDED ns-1/b 6") == 0,
       "...on a hub that missed the reset too");
    hub_free(h);
    hub_free(idle);
    rv = 100;
    teardown();
}

static void
test_time(void)
{
    setup();
    struct hub *h = hub_new(st, &hopts); /* bookmarks every 1000 ms */
    static struct msink m, quiet, waiting;
    memset(&m, 0, sizeof m), memset(&quiet, 0, sizeof quiet), memset(&waiting, 0, sizeof waiting);
    struct hub_watch_req req = {.rv = rv, .bookmarks = true, .deadline_ms = 10000};
    struct hub_watcher *w = hub_watch(h, res, &req, &ops, &m, posted, 0, 7);
    uint64_t t = hub_next_timer(w);
    ok(t >= 950 && t <= 1050, "first bookmark after about the interval");
    put(STORE_MODIFIED, "ns-1", "a", "a", "n");
    publish(h);
    hub_timer(w, t);
    char l[8][200];
    int n = lines(&m, l, 8);
    char want[64];
    snprintf(want, sizeof want, "BOOKMARK  %llu", (unsigned long long)rv);
    ok(n == 2 && strcmp(l[1], want) == 0, "a bookmark at the newest rv");
    ok(strstr(m.buf, "{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"Pod\",\"apiVersion\":\"v1\","
                     "\"metadata\":{\"resourceVersion\":") != NULL,
       "kube's bookmark object");
    struct hub_watch_req r2 = {.rv = rv, .bookmarks = true, .deadline_ms = 2500};
    struct hub_watcher *w2 = hub_watch(h, res, &r2, &ops, &quiet, posted, 0, 7);
    is_int(hub_next_timer(w2), 500, "a bookmark 2 s before the deadline when that comes first");
    hub_timer(w2, 500);
    is_int(hub_next_timer(w2), 2500, "then only the deadline");
    hub_timer(w2, 2500);
    ok(quiet.ended && quiet.why == HUB_END_TIMEOUT, "the deadline ends the stream");
    struct hub_watch_req r3 = {.initial = true,
                               .rv = rv + 10,
                               .deadline_ms = 100000,
                               .wait_until_ms = 300,
                               .too_large_status = xstrdup("{\"kind\":\"Status\",\"code\":504}")};
    struct hub_watcher *w3 = hub_watch(h, res, &r3, &ops, &waiting, posted, 0, 7);
    ok(w3 && !hub_pump_wanted(w3), "an rv the cache has not reached: waiting");
    is_int(hub_next_timer(w3), 300, "until the wait ends");
    hub_timer(w3, 300);
    ok(waiting.ended, "then the stream ends");
    const char *gave_up = "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"code\":504}}\n";
    is_mem(waiting.buf, waiting.len, gave_up, strlen(gave_up),
           "after the 504 ERROR event, its line alone");
    static struct msink reached;
    memset(&reached, 0, sizeof reached);
    struct hub_watch_req r4 = {
        .initial = true, .rv = rv + 1, .deadline_ms = 100000, .wait_until_ms = 300};
    struct hub_watcher *w4 = hub_watch(h, res, &r4, &ops, &reached, posted, 0, 7);
    ok(!hub_pump_wanted(w4), "waiting for rv + 1");
    put(STORE_ADDED, "ns-1", "b", "a", "n");
    publish(h);
    ok(hub_pump_wanted(w4) && reached.wakes > 0, "the batch reaching it starts the initial state");

    /* a resume from an rv ahead of the cache (its client came from a
     * replica that was ahead): it waits, then gets only what follows */
    static struct msink ahead, behind;
    memset(&ahead, 0, sizeof ahead), memset(&behind, 0, sizeof behind);
    uint64_t from = rv + 2;
    struct hub_watch_req r5 = {
        .rv = from, .bookmarks = true, .deadline_ms = 100000, .wait_until_ms = 5000};
    struct hub_watcher *w5 = hub_watch(h, res, &r5, &ops, &ahead, posted, 0, 7);
    ok(w5 && !hub_pump_wanted(w5), "a resume ahead of the cache waits");
    uint64_t bm = hub_next_timer(w5);
    ok(bm >= 950 && bm <= 1050, "its bookmark timer runs while it waits");
    hub_timer(w5, bm);
    ok(ahead.len == 0, "no bookmark below the rv it resumed from");
    put(STORE_ADDED, "ns-1", "c", "a", "n");
    publish(h);
    ok(ahead.len == 0 && !hub_pump_wanted(w5), "an event it had already: not sent, still waiting");
    put(STORE_ADDED, "ns-1", "d", "a", "n");
    put(STORE_ADDED, "ns-1", "e", "a", "n");
    publish(h); /* one batch passes its rv: d (== from) is not sent, e is */
    bool alive = true;
    for (int i = 0; i < 10 && hub_pump(w5, &alive) && alive; i++)
        ;
    n = lines(&ahead, l, 8);
    ok(n == 1 && strncmp(l[0], "ADDED ns-1/e ", 13) == 0, "then only the events after its rv");
    put(STORE_MODIFIED, "ns-1", "e", "b", "n");
    publish(h);
    n = lines(&ahead, l, 8);
    ok(n == 2 && strncmp(l[1], "MODIFIED ns-1/e ", 16) == 0, "and live ones");
    struct hub_watch_req r6 = {.rv = rv + 50,
                               .deadline_ms = 100000,
                               .wait_until_ms = 300,
                               .too_large_status = xstrdup("{\"kind\":\"Status\",\"code\":504}")};
    struct hub_watcher *w6 = hub_watch(h, res, &r6, &ops, &behind, posted, 0, 7);
    ok(w6 && !hub_pump_wanted(w6), "a resume far ahead waits too");
    hub_timer(w6, 300);
    ok(behind.ended, "then ends");
    is_mem(behind.buf, behind.len, gave_up, strlen(gave_up), "with kube's 504, never a 410");
    hub_free(h);
    teardown();
}

/* ---- protobuf: the same fan-out, frames instead of lines ---- */

/* A second cache of the same pods in protobuf (its own store resource, rv
 * space shared), written with an encoder of the test's own. */
static struct store_res *sres_pb;
static struct hub_res *res_pb;
static uint64_t posted_pb;

static void
w_varint(struct gostr_buf *b, uint64_t v)
{
    while (v >= 0x80) {
        gostr_addc(b, (char)(v | 0x80));
        v >>= 7;
    }
    gostr_addc(b, (char)v);
}

static void
w_bytes(struct gostr_buf *b, unsigned num, const char *p, size_t n)
{
    w_varint(b, (uint64_t)num << 3 | 2);
    w_varint(b, n);
    gostr_addn(b, p, n);
}

/* Pod{1 metadata{1 name, 3 namespace, 6 resourceVersion, 11 labels{flip}},
 * 2 spec{10 nodeName}}, the object message kwc stores. */
static char *
pod_pb(const char *ns, const char *name, const char *flip, const char *node, uint64_t r,
       size_t *len)
{
    struct gostr_buf md = {0}, lab = {0}, spec = {0}, pod = {0};
    char rvs[24];
    snprintf(rvs, sizeof rvs, "%llu", (unsigned long long)r);
    w_bytes(&lab, 1, "flip", 4);
    w_bytes(&lab, 2, flip, strlen(flip));
    w_bytes(&md, 1, name, strlen(name));
    w_bytes(&md, 3, ns, strlen(ns));
    w_bytes(&md, 6, rvs, strlen(rvs));
    w_bytes(&md, 11, lab.p, lab.len);
    w_bytes(&spec, 10, node, strlen(node));
    w_bytes(&pod, 1, md.p, md.len);
    w_bytes(&pod, 2, spec.p, spec.len);
    free(gostr_take(&md)), free(gostr_take(&lab)), free(gostr_take(&spec));
    *len = pod.len;
    return gostr_take(&pod);
}

/* Write one protobuf event at the next rv (index bytes from the same pod in
 * JSON: the index does not depend on the encoding). */
static uint64_t
put_pb(enum store_ev_type t, const char *ns, const char *name, const char *flip, const char *node)
{
    rv++;
    char *j = pod(ns, name, flip, node, rv);
    struct obj_fields_spec spec = {.fields = fields, .n_fields = 3};
    struct obj_meta m;
    if (obj_meta_parse(j, strlen(j), &spec, &m, NULL, 0) != 0)
        abort();
    char *idx;
    size_t il, ol;
    idx_encode(&m, &idx, &il);
    char *o = pod_pb(ns, name, flip, node, rv, &ol);
    char key[200];
    snprintf(key, sizeof key, "%s/%s", ns, name);
    struct store_wtxn *w;
    store_wtxn_begin(st, 1, &w);
    struct store_event ev = {.type = t,
                             .rv = rv,
                             .key = key,
                             .key_len = strlen(key),
                             .obj = o,
                             .obj_len = ol,
                             .idx = idx,
                             .idx_len = il};
    if (store_wtxn_event(w, sres_pb, &ev) != 0 || store_wtxn_commit(w) != 0)
        abort();
    free(idx), free(o), free(j);
    obj_meta_fini(&m);
    return rv;
}

static void
publish_pb(struct hub *h)
{
    struct hub_batch *b;
    if (hub_batch_build(st, res_pb, posted_pb, rv, true, &b) != 0)
        abort();
    hub_apply(h, b);
    hub_batch_unref(b);
    posted_pb = rv;
}

static void
setup_pb(void)
{
    setup();
    if (store_res(st, "v1/pods:pb", &sres_pb) != 0)
        abort();
    struct store_wtxn *w;
    store_wtxn_begin(st, 1, &w);
    store_wtxn_reset(w, sres_pb, rv);
    store_wtxn_set_synced(w, sres_pb, true);
    store_wtxn_commit(w);
    posted_pb = rv;
    res_pb = hub_res_new_enc(KWC_ENC_PB, 1, sres_pb, "Pod", "v1", false, true, field_names, 3, 2);
}

static void
teardown_pb(void)
{
    hub_res_free(res_pb);
    res_pb = NULL;
    teardown();
}

/* One protobuf field: tag, and a length-delimited value's span or a varint. */
static bool
r_field(const unsigned char **p, const unsigned char *end, unsigned *num, int *wt,
        const unsigned char **v, size_t *vl, uint64_t *x)
{
    uint64_t t = 0, l = 0;
    int s = 0;
    do {
        if (*p >= end || s > 63)
            return false;
        t |= (uint64_t)(**p & 0x7f) << s, s += 7;
    } while (*(*p)++ & 0x80);
    *num = (unsigned)(t >> 3);
    *wt = (int)(t & 7);
    if (*wt != 0 && *wt != 2)
        return false;
    s = 0;
    do {
        if (*p >= end || s > 63)
            return false;
        l |= (uint64_t)(**p & 0x7f) << s, s += 7;
    } while (*(*p)++ & 0x80);
    if (*wt == 0) {
        *x = l;
        return true;
    }
    if (l > (uint64_t)(end - *p))
        return false;
    *v = *p;
    *vl = (size_t)l;
    *p += l;
    return true;
}

/* The value of field num in msg (the last one, as protobuf reads it). */
static bool
r_get(const unsigned char *msg, size_t len, unsigned want, const unsigned char **v, size_t *vl,
      uint64_t *x)
{
    const unsigned char *p = msg, *end = msg + len;
    bool found = false;
    while (p < end) {
        unsigned num;
        int wt;
        const unsigned char *fv = NULL;
        size_t fl = 0;
        uint64_t fx = 0;
        if (!r_field(&p, end, &num, &wt, &fv, &fl, &fx))
            return false;
        if (num == want)
            *v = fv, *vl = fl, *x = fx, found = true;
    }
    return found;
}

struct pbev {
    char type[16], kind[32], api[16];
    char name[64], ns[64], rv[32];
    const unsigned char *obj; /* the envelope's raw: the object message */
    size_t obj_len;
    bool initial_end;
    bool frame_whole; /* the frame's length matched its bytes */
};

static void
cpy(char *dst, size_t cap, const unsigned char *v, size_t l)
{
    snprintf(dst, cap, "%.*s", (int)l, (const char *)v);
}

/* Every frame of a protobuf watch stream: 4-byte big-endian length, then a
 * WatchEvent{1 type, 2 RawExtension{1 raw: "k8s\0" + Unknown{1 typeMeta{1
 * apiVersion, 2 kind}, 2 raw, 3 contentEncoding, 4 contentType}}}. Returns
 * the count, -1 when the bytes are not that. */
static int
frames(const char *buf, size_t len, struct pbev *out, int max)
{
    const unsigned char *p = (const unsigned char *)buf, *end = p + len;
    int n = 0;
    while (p < end && n < max) {
        if (end - p < 4)
            return -1;
        size_t fl = (size_t)p[0] << 24 | (size_t)p[1] << 16 | (size_t)p[2] << 8 | p[3];
        p += 4;
        if (fl > (size_t)(end - p))
            return -1;
        struct pbev *e = &out[n++];
        memset(e, 0, sizeof(*e));
        const unsigned char *v, *re, *env, *raw, *tm, *md;
        size_t vl, rel, envl, rawl, tml, mdl;
        uint64_t x;
        if (!r_get(p, fl, 1, &v, &vl, &x) || !r_get(p, fl, 2, &re, &rel, &x) ||
            !r_get(re, rel, 1, &env, &envl, &x))
            return -1;
        cpy(e->type, sizeof e->type, v, vl);
        if (envl < 4 || memcmp(env, "k8s\0", 4) != 0)
            return -1;
        env += 4, envl -= 4;
        if (!r_get(env, envl, 1, &tm, &tml, &x) || !r_get(env, envl, 2, &raw, &rawl, &x))
            return -1;
        if ((r_get(env, envl, 3, &v, &vl, &x) && vl) || (r_get(env, envl, 4, &v, &vl, &x) && vl))
            return -1; /* contentEncoding, contentType: empty */
        if (r_get(tm, tml, 1, &v, &vl, &x))
            cpy(e->api, sizeof e->api, v, vl);
        if (r_get(tm, tml, 2, &v, &vl, &x))
            cpy(e->kind, sizeof e->kind, v, vl);
        e->obj = raw;
        e->obj_len = rawl;
        if (r_get(raw, rawl, 1, &md, &mdl, &x)) {
            if (r_get(md, mdl, 1, &v, &vl, &x))
                cpy(e->name, sizeof e->name, v, vl);
            if (r_get(md, mdl, 3, &v, &vl, &x))
                cpy(e->ns, sizeof e->ns, v, vl);
            if (r_get(md, mdl, 6, &v, &vl, &x))
                cpy(e->rv, sizeof e->rv, v, vl);
            const unsigned char *a, *ak, *av;
            size_t al, akl, avl;
            if (r_get(md, mdl, 12, &a, &al, &x) && r_get(a, al, 1, &ak, &akl, &x) &&
                r_get(a, al, 2, &av, &avl, &x))
                e->initial_end = akl == 25 && memcmp(ak, "k8s.io/initial-events-end", 25) == 0 &&
                                 avl == 4 && memcmp(av, "true", 4) == 0;
        }
        e->frame_whole = true;
        p += fl;
    }
    return n;
}

/* "TYPE ns/name rv" of each frame, as lines() does for JSON. */
static int
pb_lines(struct msink *m, char out[][200], int max)
{
    static struct pbev ev[256];
    int n = frames(m->buf, m->len, ev, max < 256 ? max : 256);
    for (int i = 0; i < n; i++)
        snprintf(out[i], 200, "%.15s %.63s%s%.63s %.31s", ev[i].type, ev[i].ns,
                 *ev[i].ns ? "/" : "", ev[i].name, ev[i].rv);
    return n;
}

static struct hub_watcher *
watch_pb(struct hub *h, struct msink *m, const char *ns, const char *lsel, const char *fsel,
         bool initial, uint64_t from)
{
    struct sel *sel = NULL;
    char *err = NULL;
    if (sel_parse(lsel, fsel, &sel, &err) != 0)
        abort();
    struct hub_watch_req req = {
        .ns = ns, .sel = sel, .initial = initial, .rv = from, .deadline_ms = 1000000};
    return hub_watch(h, res_pb, &req, &ops, m, posted_pb, 0, 1);
}

static void
test_pb_encoding_and_transitions(void)
{
    setup_pb();
    struct hub *h = hub_new(st, &hopts);
    static struct msink all, all2, ns1, flip, node1;
    memset(&all, 0, sizeof all), memset(&all2, 0, sizeof all2), memset(&ns1, 0, sizeof ns1);
    memset(&flip, 0, sizeof flip), memset(&node1, 0, sizeof node1);
    uint64_t start = rv;
    watch_pb(h, &all, NULL, NULL, NULL, false, start);
    watch_pb(h, &all2, NULL, NULL, NULL, false, start);
    watch_pb(h, &ns1, "ns-1", NULL, NULL, false, start);
    watch_pb(h, &flip, NULL, "flip=a", NULL, false, start);
    watch_pb(h, &node1, NULL, NULL, "spec.nodeName=node-1", false, start);
    put_pb(STORE_ADDED, "ns-1", "a", "a", "node-1");    /* 101 */
    put_pb(STORE_MODIFIED, "ns-1", "a", "b", "node-1"); /* 102: leaves flip=a */
    put_pb(STORE_MODIFIED, "ns-2", "b", "a", "node-2"); /* 103 */
    put_pb(STORE_MODIFIED, "ns-1", "a", "a", "node-2"); /* 104: enters flip=a, leaves node-1 */
    put_pb(STORE_DELETED, "ns-1", "a", "a", "node-2");  /* 105 */
    publish_pb(h);

    is_int(all.nw, 5, "live: one write per event");
    struct pbev ev[8];
    is_int(frames(all.buf + all.w[0].off, all.w[0].len, ev, 8), 1,
           "an event's write is one length-prefixed WatchEvent frame and nothing else");
    ok(all.w[0].whole, "the whole blob");
    is_str(ev[0].type, "ADDED", "its type");
    ok(strcmp(ev[0].kind, "Pod") == 0 && strcmp(ev[0].api, "v1") == 0,
       "the envelope names kind and apiVersion");
    size_t want_len;
    char *want = pod_pb("ns-1", "a", "a", "node-1", 101, &want_len);
    is_mem(ev[0].obj, ev[0].obj_len, want, want_len,
           "the object is the stored object message, byte for byte");
    free(want);
    bool shared = all.nw == all2.nw;
    for (size_t i = 0; shared && i < all.nw; i++)
        shared = all.w[i].b == all2.w[i].b;
    ok(shared, "two watchers get the same shared blobs: one encoding per event");

    char l[16][200];
    int n = pb_lines(&all, l, 16);
    is_int(n, 5, "unfiltered: every event");
    is_str(l[2], "MODIFIED ns-2/b 103", "a MODIFIED stays MODIFIED");
    is_int(pb_lines(&ns1, l, 16), 4, "namespace: its own objects only");
    n = pb_lines(&flip, l, 16);
    is_int(n, 5, "label selector: five events");
    is_str(l[0], "ADDED ns-1/a 101", "flip=a: ADDED");
    is_str(l[1], "DELETED ns-1/a 102", "leaving: DELETED at the event's rv");
    frames(flip.buf, flip.len, ev, 8);
    want = pod_pb("ns-1", "a", "a", "node-1", 102, &want_len);
    is_mem(ev[1].obj, ev[1].obj_len, want, want_len,
           "the leaving DELETED is the previous object with the event's rv");
    free(want);
    is_str(l[2], "ADDED ns-2/b 103", "a MODIFIED of an object it never had: ADDED");
    is_str(l[3], "ADDED ns-1/a 104", "entering: ADDED");
    is_str(l[4], "DELETED ns-1/a 105", "a DELETED judged by the previous object");
    n = pb_lines(&node1, l, 16);
    is_int(n, 3, "field selector: node-1's events");
    is_str(l[2], "DELETED ns-1/a 104", "moving off the node: DELETED at the event's rv");
    hub_free(h);
    ok(all.ended && all.why == HUB_END_SHUTDOWN, "hub_free ends the streams");
    teardown_pb();
}

/* The JSON and protobuf caches of one resource: each watcher gets its own
 * encoding only, from its own cache. */
static void
test_pb_and_json_side_by_side(void)
{
    setup_pb();
    struct hub *h = hub_new(st, &hopts);
    static struct msink js, pbs;
    memset(&js, 0, sizeof js), memset(&pbs, 0, sizeof pbs);
    watch(h, &js, NULL, NULL, NULL, false, rv);
    watch_pb(h, &pbs, NULL, NULL, NULL, false, rv);
    put(STORE_ADDED, "ns-1", "a", "a", "n");    /* 101, JSON cache */
    put_pb(STORE_ADDED, "ns-1", "a", "a", "n"); /* 102, protobuf cache */
    publish(h);
    publish_pb(h);
    char l[4][200];
    is_int(lines(&js, l, 4), 1, "the JSON watcher: one line");
    is_str(l[0], "ADDED ns-1/a 101", "from the JSON cache");
    is_int(pb_lines(&pbs, l, 4), 1, "the protobuf watcher: one frame");
    is_str(l[0], "ADDED ns-1/a 102", "from the protobuf cache");
    hub_free(h);
    teardown_pb();
}

static void
test_pb_initial_bookmarks_and_catchup(void)
{
    setup_pb();
    for (int i = 0; i < 20; i++) {
        char name[16];
        snprintf(name, sizeof name, "p%02d", i);
        put_pb(STORE_ADDED, "ns-1", name, i % 3 ? "a" : "b", "n");
    }
    posted_pb = rv;
    uint64_t snap = rv;
    struct hub *h = hub_new(st, &hopts);
    static struct msink init, slow, fast;
    memset(&init, 0, sizeof init), memset(&slow, 0, sizeof slow), memset(&fast, 0, sizeof fast);
    struct sel *sel = NULL;
    char *err = NULL;
    sel_parse("flip=a", NULL, &sel, &err);
    struct hub_watch_req req = {.sel = sel,
                                .initial = true,
                                .initial_end = true,
                                .bookmarks = true,
                                .deadline_ms = 1000000};
    struct hub_watcher *wi = hub_watch(h, res_pb, &req, &ops, &init, posted_pb, 0, 1);
    bool alive = true;
    int steps = 0;
    while (hub_pump(wi, &alive) && alive && steps < 100)
        steps++;
    ok(steps > 0, "the initial state in chunks (512 bytes each)");
    char l[40][200];
    int n = pb_lines(&init, l, 40);
    is_int(n, 14, "13 objects that match, then the bookmark");
    is_str(l[0], "ADDED ns-1/p01 102", "synthetic ADDED in key order");
    char want[64];
    snprintf(want, sizeof want, "BOOKMARK  %llu", (unsigned long long)snap);
    is_str(l[13], want, "the initial-events-end bookmark at the snapshot rv");
    struct pbev ev[16];
    frames(init.buf, init.len, ev, 16);
    ok(ev[13].initial_end && strcmp(ev[13].kind, "Pod") == 0,
       "a Pod bookmark carrying k8s.io/initial-events-end: \"true\"");

    /* a lagging watcher catches up from the store: the same frames */
    struct hub_watcher *ws = watch_pb(h, &slow, NULL, "flip=a", NULL, false, rv);
    watch_pb(h, &fast, NULL, "flip=a", NULL, false, rv);
    put_pb(STORE_MODIFIED, "ns-1", "p01", "a", "n");
    publish_pb(h);
    slow.queued = 10000;
    for (int i = 0; i < 10; i++)
        put_pb(STORE_MODIFIED, "ns-1", i % 2 ? "p01" : "p02", i % 3 ? "a" : "b", "n");
    publish_pb(h);
    slow.queued = 0;
    for (int i = 0; i < 100 && hub_pump(ws, &alive) && alive; i++)
        ;
    is_mem(slow.buf, slow.len, fast.buf, fast.len,
           "a lagging watcher's frames are the live watcher's, byte for byte");
    ok(pb_lines(&slow, l, 40) > 5, "and they are frames");

    /* bookmarks at the newest rv */
    static struct msink bm;
    memset(&bm, 0, sizeof bm);
    struct hub_watch_req r2 = {.rv = rv, .bookmarks = true, .deadline_ms = 10000};
    struct hub_watcher *wb = hub_watch(h, res_pb, &r2, &ops, &bm, posted_pb, 0, 7);
    hub_timer(wb, hub_next_timer(wb));
    is_int(frames(bm.buf, bm.len, ev, 4), 1, "a bookmark: one frame");
    snprintf(want, sizeof want, "%llu", (unsigned long long)rv);
    ok(strcmp(ev[0].type, "BOOKMARK") == 0 && strcmp(ev[0].rv, want) == 0 && !ev[0].initial_end,
       "BOOKMARK at the newest rv, no annotation");
    hub_free(h);
    teardown_pb();
}

/* A Status in protobuf: {1 metadata, 2 status, 3 message, 4 reason, 5
 * details{..., 4 causes{1 reason, 2 message}, 5 retryAfterSeconds}, 6 code}. */
static void
check_status(const struct pbev *e, int code, const char *reason, const char *message,
             const char *what)
{
    const unsigned char *v;
    size_t vl;
    uint64_t x;
    char got[256], m[300];
    snprintf(m, sizeof m, "%s: an ERROR frame whose object is a v1 Status", what);
    ok(strcmp(e->type, "ERROR") == 0 && strcmp(e->kind, "Status") == 0 && strcmp(e->api, "v1") == 0,
       m);
    snprintf(m, sizeof m, "%s: code", what);
    is_int(r_get(e->obj, e->obj_len, 6, &v, &vl, &x) ? (int)x : -1, code, m);
    got[0] = '\0';
    if (r_get(e->obj, e->obj_len, 4, &v, &vl, &x))
        cpy(got, sizeof got, v, vl);
    snprintf(m, sizeof m, "%s: reason", what);
    is_str(got, reason, m);
    got[0] = '\0';
    if (r_get(e->obj, e->obj_len, 3, &v, &vl, &x))
        cpy(got, sizeof got, v, vl);
    snprintf(m, sizeof m, "%s: message", what);
    is_str(got, message, m);
    got[0] = '\0';
    if (r_get(e->obj, e->obj_len, 2, &v, &vl, &x))
        cpy(got, sizeof got, v, vl);
    snprintf(m, sizeof m, "%s: status Failure", what);
    is_str(got, "Failure", m);
}

static void
test_pb_errors(void)
{
    setup_pb();
    for (int i = 0; i < 1200; i++) /* history holds 1000 */
        put_pb(STORE_MODIFIED, "ns-1", "a", "a", "n");
    posted_pb = rv;
    struct hub *h = hub_new(st, &hopts);
    static struct msink m, waiting;
    memset(&m, 0, sizeof m), memset(&waiting, 0, sizeof waiting);
    ok(watch_pb(h, &m, NULL, NULL, NULL, false, 150) == NULL, "below the floor: no watcher");
    ok(m.ended && m.why == HUB_END_ERROR_EVENT, "the stream ends after its ERROR event");
    struct pbev ev[4];
    is_int(frames(m.buf, m.len, ev, 4), 1, "one frame");
    check_status(&ev[0], 410, "Expired", "too old resource version: 150 (300)", "410");

    const char *st504 = "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":"
                        "\"Failure\",\"message\":\"Timeout: Too large resource version: 1311, "
                        "current: 1300\",\"reason\":\"Timeout\",\"details\":{\"causes\":[{"
                        "\"reason\":\"ResourceVersionTooLarge\",\"message\":\"Too large resource "
                        "version\"}],\"retryAfterSeconds\":1},\"code\":504}";
    struct hub_watch_req r3 = {.initial = true,
                               .rv = rv + 10,
                               .deadline_ms = 100000,
                               .wait_until_ms = 300,
                               .too_large_status = xstrdup(st504)};
    struct hub_watcher *w3 = hub_watch(h, res_pb, &r3, &ops, &waiting, posted_pb, 0, 7);
    ok(w3 != NULL, "an rv the cache has not reached: waiting");
    hub_timer(w3, 300);
    ok(waiting.ended && waiting.why == HUB_END_ERROR_EVENT, "the wait ends with an ERROR");
    is_int(frames(waiting.buf, waiting.len, ev, 4), 1, "one frame");
    check_status(&ev[0], 504, "Timeout", "Timeout: Too large resource version: 1311, current: 1300",
                 "504");
    const unsigned char *d, *c, *v;
    size_t dl, cl, vl;
    uint64_t x = 0;
    char cause[64] = "";
    if (r_get(ev[0].obj, ev[0].obj_len, 5, &d, &dl, &x) && r_get(d, dl, 4, &c, &cl, &x) &&
        r_get(c, cl, 1, &v, &vl, &x))
        cpy(cause, sizeof cause, v, vl);
    is_str(cause, "ResourceVersionTooLarge", "504: details.causes[0].reason");
    x = 0;
    ok(r_get(ev[0].obj, ev[0].obj_len, 5, &d, &dl, &x) && r_get(d, dl, 5, &v, &vl, &x) && x == 1,
       "504: details.retryAfterSeconds 1");
    hub_free(h);
    teardown_pb();
}

/* ---- blobs framed once (hub_res_set_frame) ---- */

static int framed_ok, framed_bad;

static void
t_frame(char *p, size_t n)
{
    memcpy(p - 4, "HEAD", 4);
    memcpy(p + n, "TL", 2);
}

/* Every write is a whole blob whose room holds the frame around its bytes,
 * written before the sink saw it. */
static void
f_write(void *s, struct hub_blob *b, const char *p, size_t len)
{
    bool good = b->framed && p == b->data && len == b->len && memcmp(p - 4, "HEAD", 4) == 0 &&
                memcmp(p + len, "TL", 2) == 0;
    good ? framed_ok++ : framed_bad++;
    m_write(s, b, p, len);
}

static const struct hub_sink_ops fops = {f_write, m_queued, m_wake, m_end};

static void
test_framed_blobs(void)
{
    setup();
    hub_res_set_frame(res, &(struct hub_frame){.head = 4, .tail = 2, .frame = t_frame});
    struct hub *h = hub_new(st, &hopts);
    static struct msink live, init;
    memset(&live, 0, sizeof live), memset(&init, 0, sizeof init);
    struct hub_watch_req req = {.rv = rv, .bookmarks = true, .deadline_ms = 10000};
    struct hub_watcher *w = hub_watch(h, res, &req, &fops, &live, posted, 0, 7);
    put(STORE_ADDED, "ns-1", "a", "a", "node-1");
    put(STORE_MODIFIED, "ns-1", "a", "b", "node-1");
    publish(h);
    struct hub_watch_req ri = {
        .initial = true, .initial_end = true, .bookmarks = true, .rv = rv, .deadline_ms = 10000};
    struct hub_watcher *wi = hub_watch(h, res, &ri, &fops, &init, posted, 0, 1);
    bool alive = true;
    for (int i = 0; i < 10 && wi && hub_pump(wi, &alive) && alive; i++)
        ;
    hub_timer(w, hub_next_timer(w));
    char l[8][200];
    is_int(lines(&live, l, 8), 3, "live: two events and a bookmark");
    ok(strncmp(l[2], "BOOKMARK", 8) == 0, "...the bookmark last");
    ok(lines(&init, l, 8) >= 2, "initial state and its bookmark");
    ok(framed_ok >= 4 && framed_ok == (int)(live.nw + init.nw),
       "events, the initial state and bookmarks: whole framed blobs");
    is_int(framed_bad, 0, "...every one of them");
    ok(strstr(live.buf, "HEAD") == NULL && strstr(live.buf, "TL") == NULL,
       "the bytes a write covers are the event's alone");
    hub_free(h);
    teardown();
}

/* ---- metadata-only watchers (hub_watch_req.meta) ---- */

#define POM_HEAD "{\"kind\":\"PartialObjectMetadata\",\"apiVersion\":\"meta.k8s.io/v1\","

static struct hub_watcher *
watch_form(struct hub *h, const struct hub_res *r, uint64_t at, struct msink *m, const char *lsel,
           uint64_t from, bool meta)
{
    struct sel *sel = NULL;
    char *err = NULL;
    if (sel_parse(lsel, NULL, &sel, &err) != 0)
        abort();
    struct hub_watch_req req = {.sel = sel, .rv = from, .deadline_ms = 1000000, .meta = meta};
    return hub_watch(h, r, &req, &ops, m, at, 0, 1);
}

/* Do the writes of a and b share their blobs (the same shared bytes)? */
static bool
same_blobs(const struct msink *a, const struct msink *b)
{
    bool same = a->nw == b->nw && a->nw > 0;
    for (size_t i = 0; same && i < a->nw; i++)
        same = a->w[i].b == b->w[i].b;
    return same;
}

static bool
no_blob_shared(const struct msink *a, const struct msink *b)
{
    for (size_t i = 0; i < a->nw; i++)
        for (size_t k = 0; k < b->nw; k++)
            if (a->w[i].b == b->w[k].b)
                return false;
    return true;
}

/* Metadata watchers and full watchers of one cache: the same events, each
 * form encoded once and shared by every watcher of it. */
static void
test_meta_forms_shared(void)
{
    setup();
    struct hub *h = hub_new(st, &hopts);
    static struct msink m1, m2, full, mflip;
    memset(&m1, 0, sizeof m1), memset(&m2, 0, sizeof m2);
    memset(&full, 0, sizeof full), memset(&mflip, 0, sizeof mflip);
    watch_form(h, res, posted, &m1, NULL, rv, true);
    watch_form(h, res, posted, &full, NULL, rv, false);
    watch_form(h, res, posted, &m2, NULL, rv, true);
    watch_form(h, res, posted, &mflip, "flip=a", rv, true);
    put(STORE_ADDED, "ns-1", "a", "a", "node-1");    /* 101 */
    put(STORE_MODIFIED, "ns-1", "a", "b", "node-1"); /* 102: leaves flip=a */
    put(STORE_DELETED, "ns-1", "a", "b", "node-1");  /* 103 */
    publish(h);

    const char *want = "{\"type\":\"ADDED\",\"object\":" POM_HEAD
                       "\"metadata\":{\"name\":\"a\",\"namespace\":\"ns-1\",\"resourceVersion\":"
                       "\"101\",\"labels\":{\"flip\":\"a\"}}}}\n";
    is_int(m1.nw, 3, "metadata watcher: one write per event");
    is_mem(m1.buf + m1.w[0].off, m1.w[0].len, want, strlen(want),
           "its object is a PartialObjectMetadata of the stored item's metadata");
    ok(strstr(m1.buf, "spec") == NULL, "and nothing else of the object");
    char l[8][200];
    is_int(lines(&m1, l, 8), 3, "every event");
    is_str(l[1], "MODIFIED ns-1/a 102", "MODIFIED");
    is_str(l[2], "DELETED ns-1/a 103", "DELETED");
    ok(same_blobs(&m1, &m2), "two metadata watchers get the same shared blobs");
    is_mem(m1.buf, m1.len, m2.buf, m2.len, "...the same bytes");
    is_int(full.nw, 3, "the full watcher: the same events");
    ok(no_blob_shared(&m1, &full), "in blobs of its own form");
    ok(strstr(full.buf, "\"kind\":\"Pod\"") != NULL && strstr(full.buf, "spec") != NULL,
       "full objects");
    is_int(lines(&mflip, l, 8), 2, "a metadata watcher with a selector: transitions too");
    is_str(l[1], "DELETED ns-1/a 102", "leaving: DELETED at the event's rv");
    const char *left = "{\"type\":\"DELETED\",\"object\":" POM_HEAD
                       "\"metadata\":{\"name\":\"a\",\"namespace\":\"ns-1\",\"resourceVersion\":"
                       "\"102\",\"labels\":{\"flip\":\"a\"}}}}\n";
    is_mem(mflip.buf + mflip.w[1].off, mflip.w[1].len, left, strlen(left),
           "...the previous object's metadata, stamped with the event's rv");
    hub_free(h);
    teardown();
}

/* A metadata watcher's initial state, bookmarks, catch-up (window and
 * store) and 410: every object a PartialObjectMetadata, the ERROR a Status. */
static void
meta_catchup(size_t window_bytes, bool want_store, const char *what)
{
    setup();
    struct hub_options o = hopts;
    o.window_bytes = window_bytes;
    struct hub *h = hub_new(st, &o);
    static struct msink slow, fast;
    memset(&slow, 0, sizeof slow), memset(&fast, 0, sizeof fast);
    struct hub_watcher *w = watch_form(h, res, posted, &slow, "flip=a", rv, true);
    watch_form(h, res, posted, &fast, "flip=a", rv, true);
    put(STORE_ADDED, "ns-1", "a", "a", "n");
    publish(h);
    slow.queued = 10000;
    for (int b = 0; b < 4; b++) {
        for (int i = 0; i < 5; i++)
            put(STORE_MODIFIED, "ns-1", i % 2 ? "b" : "c", i % 3 ? "a" : "b", "n");
        publish(h);
    }
    slow.queued = 0;
    bool alive = true;
    for (int i = 0; i < 100 && hub_pump(w, &alive) && alive; i++)
        ;
    struct hub_stats s;
    hub_stats(h, &s);
    char m[3][200];
    snprintf(m[0], sizeof m[0], "%s: live again, from the store: %llu", what, s.from_store);
    ok(s.lagging == 0 && (s.from_store > 0) == want_store, m[0]);
    snprintf(m[1], sizeof m[1], "%s: the lagging metadata watcher's bytes are the live one's",
             what);
    is_mem(slow.buf, slow.len, fast.buf, fast.len, m[1]);
    snprintf(m[2], sizeof m[2], "%s: PartialObjectMetadata throughout", what);
    ok(slow.len > 0 && strstr(slow.buf, "\"kind\":\"Pod\"") == NULL &&
           strstr(slow.buf, POM_HEAD) != NULL,
       m[2]);
    if (!want_store) {
        snprintf(m[0], sizeof m[0], "%s: the window's metadata blobs, shared", what);
        ok(same_blobs(&slow, &fast), m[0]);
    }
    hub_free(h);
    teardown();
}

static void
test_meta_initial_bookmarks_catchup_410(void)
{
    meta_catchup(16 << 20, false, "window");
    meta_catchup(1, true, "store");

    setup();
    for (int i = 0; i < 6; i++) {
        char name[16];
        snprintf(name, sizeof name, "p%02d", i);
        put(STORE_ADDED, "ns-1", name, i % 2 ? "a" : "b", "n");
    }
    posted = rv;
    struct hub *h = hub_new(st, &hopts);
    static struct msink init, bm, cr, old;
    memset(&init, 0, sizeof init), memset(&bm, 0, sizeof bm);
    memset(&cr, 0, sizeof cr), memset(&old, 0, sizeof old);
    struct hub_watch_req ri = {.initial = true,
                               .initial_end = true,
                               .bookmarks = true,
                               .deadline_ms = 1000000,
                               .meta = true};
    struct hub_watcher *wi = hub_watch(h, res, &ri, &ops, &init, posted, 0, 1);
    bool alive = true;
    for (int i = 0; i < 100 && hub_pump(wi, &alive) && alive; i++)
        ;
    char l[16][200];
    is_int(lines(&init, l, 16), 7, "initial state: six objects and the bookmark");
    const char *add0 = "{\"type\":\"ADDED\",\"object\":" POM_HEAD
                       "\"metadata\":{\"name\":\"p00\",\"namespace\":\"ns-1\",\"resourceVersion\":"
                       "\"101\",\"labels\":{\"flip\":\"b\"}}}}\n";
    ok(init.len > strlen(add0) && memcmp(init.buf, add0, strlen(add0)) == 0,
       "synthetic ADDED of PartialObjectMetadata");
    char want[400];
    snprintf(want, sizeof want,
             "{\"type\":\"BOOKMARK\",\"object\":" POM_HEAD
             "\"metadata\":{\"resourceVersion\":\"%llu\",\"annotations\":{\"k8s.io/"
             "initial-events-end\":\"true\"}}}}\n",
             (unsigned long long)rv);
    ok(init.len > strlen(want) &&
           memcmp(init.buf + init.len - strlen(want), want, strlen(want)) == 0,
       "the initial-events-end bookmark is a PartialObjectMetadata");

    struct hub_watch_req rb = {.rv = rv, .bookmarks = true, .deadline_ms = 10000, .meta = true};
    struct hub_watcher *wb = hub_watch(h, res, &rb, &ops, &bm, posted, 0, 7);
    hub_timer(wb, hub_next_timer(wb));
    snprintf(want, sizeof want,
             "{\"type\":\"BOOKMARK\",\"object\":" POM_HEAD
             "\"metadata\":{\"resourceVersion\":\"%llu\"}}}\n",
             (unsigned long long)rv);
    is_mem(bm.buf, bm.len, want, strlen(want), "a periodic bookmark: PartialObjectMetadata");

    /* a custom resource's bookmark (an unstructured map in full) is a typed
     * PartialObjectMetadata: kube's transformObject makes it one */
    struct hub_res *crr = hub_res_new_enc(KWC_ENC_JSON, 5, sres, "Widget", "example.com/v1", true,
                                          true, field_names, 3, -1);
    struct hub_watch_req rc = {.rv = rv, .bookmarks = true, .deadline_ms = 10000, .meta = true};
    struct hub_watcher *wc = hub_watch(h, crr, &rc, &ops, &cr, posted, 0, 7);
    hub_timer(wc, hub_next_timer(wc));
    is_mem(cr.buf, cr.len, want, strlen(want), "a custom resource's: the same");

    for (int i = 0; i < 1100; i++) /* history holds 1000 */
        put(STORE_MODIFIED, "ns-1", "p00", "a", "n");
    publish(h);
    ok(watch_form(h, res, posted, &old, NULL, 150, true) == NULL, "below the floor: no watcher");
    const char *expired =
        "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"apiVersion\":\"v1\","
        "\"metadata\":{},\"status\":\"Failure\",\"message\":\"too old resource version: "
        "150 (206)\",\"reason\":\"Expired\",\"code\":410}}\n";
    is_mem(old.buf, old.len, expired, strlen(expired), "the 410's ERROR stays a Status");
    hub_free(h);
    hub_res_free(crr);
    teardown();
}

/* The same in protobuf: frames whose envelope is meta.k8s.io/v1
 * PartialObjectMetadata {1: the stored object's ObjectMeta}. */
static void
pb_pom_of(const char *ns, const char *name, const char *flip, uint64_t r, struct gostr_buf *out)
{
    size_t pl;
    char *pod = pod_pb(ns, name, flip, "node-1", r, &pl);
    const unsigned char *md;
    size_t mdl;
    uint64_t x;
    if (!r_get((const unsigned char *)pod, pl, 1, &md, &mdl, &x))
        abort();
    w_bytes(out, 1, (const char *)md, mdl);
    free(pod);
}

static void
test_pb_meta(void)
{
    setup_pb();
    struct hub *h = hub_new(st, &hopts);
    static struct msink m1, m2, full, mflip, bm;
    memset(&m1, 0, sizeof m1), memset(&m2, 0, sizeof m2), memset(&full, 0, sizeof full);
    memset(&mflip, 0, sizeof mflip), memset(&bm, 0, sizeof bm);
    watch_form(h, res_pb, posted_pb, &m1, NULL, rv, true);
    watch_form(h, res_pb, posted_pb, &full, NULL, rv, false);
    watch_form(h, res_pb, posted_pb, &m2, NULL, rv, true);
    watch_form(h, res_pb, posted_pb, &mflip, "flip=a", rv, true);
    put_pb(STORE_ADDED, "ns-1", "a", "a", "node-1");    /* 101 */
    put_pb(STORE_MODIFIED, "ns-1", "a", "b", "node-1"); /* 102: leaves flip=a */
    publish_pb(h);
    struct pbev ev[8];
    is_int(frames(m1.buf, m1.len, ev, 8), 2, "metadata watcher: a frame per event");
    ok(strcmp(ev[0].kind, "PartialObjectMetadata") == 0 && strcmp(ev[0].api, "meta.k8s.io/v1") == 0,
       "the envelope names meta.k8s.io/v1 PartialObjectMetadata");
    struct gostr_buf want = {0};
    pb_pom_of("ns-1", "a", "a", 101, &want);
    is_mem(ev[0].obj, ev[0].obj_len, want.p, want.len,
           "the object: {1: the stored object's ObjectMeta}, byte for byte");
    free(gostr_take(&want));
    ok(same_blobs(&m1, &m2), "two metadata watchers share the blobs");
    ok(no_blob_shared(&m1, &full), "the full watcher has blobs of its own");
    is_int(frames(full.buf, full.len, ev, 8), 2, "...with the same events");
    is_str(ev[0].kind, "Pod", "...as Pods");
    is_int(frames(mflip.buf, mflip.len, ev, 8), 2, "selector transitions");
    pb_pom_of("ns-1", "a", "a", 102, &want);
    ok(strcmp(ev[1].type, "DELETED") == 0 && ev[1].obj_len == want.len &&
           memcmp(ev[1].obj, want.p, want.len) == 0,
       "leaving: DELETED, the previous object's metadata at the event's rv");
    free(gostr_take(&want));

    struct hub_watch_req rb = {.rv = rv, .bookmarks = true, .deadline_ms = 10000, .meta = true};
    struct hub_watcher *wb = hub_watch(h, res_pb, &rb, &ops, &bm, posted_pb, 0, 7);
    hub_timer(wb, hub_next_timer(wb));
    char rvs[24];
    snprintf(rvs, sizeof rvs, "%llu", (unsigned long long)rv);
    ok(frames(bm.buf, bm.len, ev, 4) == 1 && strcmp(ev[0].type, "BOOKMARK") == 0 &&
           strcmp(ev[0].kind, "PartialObjectMetadata") == 0 && strcmp(ev[0].rv, rvs) == 0,
       "a bookmark: a PartialObjectMetadata at the newest rv");

    static struct msink init;
    memset(&init, 0, sizeof init);
    struct hub_watch_req ri = {.initial = true,
                               .initial_end = true,
                               .bookmarks = true,
                               .deadline_ms = 1000000,
                               .meta = true};
    struct hub_watcher *wi = hub_watch(h, res_pb, &ri, &ops, &init, posted_pb, 0, 1);
    bool alive = true;
    for (int i = 0; i < 100 && hub_pump(wi, &alive) && alive; i++)
        ;
    is_int(frames(init.buf, init.len, ev, 8), 2, "initial state: the object and the bookmark");
    ok(strcmp(ev[0].type, "ADDED") == 0 && strcmp(ev[0].kind, "PartialObjectMetadata") == 0,
       "a synthetic ADDED of its metadata");
    ok(strcmp(ev[1].kind, "PartialObjectMetadata") == 0 && ev[1].initial_end,
       "the initial-events-end bookmark, a PartialObjectMetadata");

    for (int i = 0; i < 1100; i++)
        put_pb(STORE_MODIFIED, "ns-1", "a", "a", "n");
    publish_pb(h);
    static struct msink old;
    memset(&old, 0, sizeof old);
    ok(watch_form(h, res_pb, posted_pb, &old, NULL, 150, true) == NULL, "below the floor");
    is_int(frames(old.buf, old.len, ev, 4), 1, "one frame");
    check_status(&ev[0], 410, "Expired", "too old resource version: 150 (202)", "410, metadata");
    hub_free(h);
    teardown_pb();
}

/* A custom resource's JSON cache watched for its metadata in protobuf
 * (hub_watch_req.meta_pb: kwc has no protobuf cache of custom resources):
 * protobuf frames of typed PartialObjectMetadata derived from the JSON
 * objects, byte for byte as kube writes them, a form of its own. */
static struct hub_watcher *
watch_cr(struct hub *h, const struct hub_res *r, struct msink *m, const char *lsel,
         struct hub_watch_req req)
{
    char *err = NULL;
    if (sel_parse(lsel, NULL, &req.sel, &err) != 0)
        abort();
    if (!req.deadline_ms)
        req.deadline_ms = 1000000;
    return hub_watch(h, r, &req, &ops, m, posted, 0, 7);
}

static void
publish_to(struct hub *h, const struct hub_res *r)
{
    struct hub_batch *b;
    if (hub_batch_build(st, r, posted, rv, true, &b) != 0)
        abort();
    hub_apply(h, b);
    hub_batch_unref(b);
    posted = rv;
}

static void
test_cr_meta_pb(void)
{
    setup();
    struct hub_res *cr = hub_res_new_enc(KWC_ENC_JSON, 5, sres, "Widget", "example.com/v1", true,
                                         true, field_names, 3, -1);
    struct hub *h = hub_new(st, &hopts);
    static struct msink p1, p2, mj, full, pflip;
    memset(&p1, 0, sizeof p1), memset(&p2, 0, sizeof p2), memset(&mj, 0, sizeof mj);
    memset(&full, 0, sizeof full), memset(&pflip, 0, sizeof pflip);
    struct hub_watch_req pb = {.rv = rv, .meta = true, .meta_pb = true};
    watch_cr(h, cr, &p1, NULL, pb);
    watch_cr(h, cr, &mj, NULL, (struct hub_watch_req){.rv = rv, .meta = true});
    watch_cr(h, cr, &p2, NULL, pb);
    watch_cr(h, cr, &full, NULL, (struct hub_watch_req){.rv = rv});
    watch_cr(h, cr, &pflip, "flip=a", pb);
    put(STORE_ADDED, "ns-1", "a", "a", "node-1");    /* 101 */
    put(STORE_MODIFIED, "ns-1", "a", "b", "node-1"); /* 102: leaves flip=a */
    publish_to(h, cr);

    is_int(p1.nw, 2, "protobuf metadata of a JSON cache: one write per event");
    is_mem(p1.buf + p1.w[0].off, p1.w[0].len, POM_FRAME_ADDED_A101, sizeof POM_FRAME_ADDED_A101,
           "ADDED: one frame, a typed PartialObjectMetadata as kube writes it");
    struct pbev ev[8];
    is_int(frames(p1.buf, p1.len, ev, 8), 2, "frames throughout");
    ok(strcmp(ev[1].type, "MODIFIED") == 0 && strcmp(ev[1].rv, "102") == 0, "MODIFIED at 102");
    ok(same_blobs(&p1, &p2), "two such watchers share the blobs");
    ok(no_blob_shared(&p1, &mj) && no_blob_shared(&p1, &full),
       "a form of its own: neither the JSON metadata nor the objects");
    ok(mj.nw == 2 && strstr(mj.buf, POM_HEAD) != NULL, "the JSON metadata watcher: JSON lines");
    ok(full.nw == 2 && strstr(full.buf, "\"spec\"") != NULL, "the full watcher: the objects");
    is_int(pflip.nw, 2, "a selector: transitions");
    is_mem(pflip.buf + pflip.w[1].off, pflip.w[1].len, POM_FRAME_DELETED_A102,
           sizeof POM_FRAME_DELETED_A102,
           "leaving: DELETED, the previous object's metadata stamped with the event's rv");

    static struct msink bm, init, old;
    memset(&bm, 0, sizeof bm), memset(&init, 0, sizeof init), memset(&old, 0, sizeof old);
    struct hub_watcher *wb = watch_cr(
        h, cr, &bm, NULL,
        (struct hub_watch_req){
            .rv = rv, .bookmarks = true, .deadline_ms = 10000, .meta = true, .meta_pb = true});
    hub_timer(wb, hub_next_timer(wb));
    is_mem(bm.buf, bm.len, POM_FRAME_BOOKMARK_102, sizeof POM_FRAME_BOOKMARK_102,
           "a periodic bookmark: a typed PartialObjectMetadata in protobuf");
    struct hub_watcher *wi = watch_cr(h, cr, &init, NULL,
                                      (struct hub_watch_req){.initial = true,
                                                             .initial_end = true,
                                                             .bookmarks = true,
                                                             .meta = true,
                                                             .meta_pb = true});
    bool alive = true;
    for (int i = 0; i < 100 && hub_pump(wi, &alive) && alive; i++)
        ;
    size_t la = sizeof POM_FRAME_ADDED_A102B, lb = sizeof POM_FRAME_BOOKMARK_END_102;
    ok(init.len == la + lb && memcmp(init.buf, POM_FRAME_ADDED_A102B, la) == 0 &&
           memcmp(init.buf + la, POM_FRAME_BOOKMARK_END_102, lb) == 0,
       "initial state: a synthetic ADDED, then the initial-events-end bookmark");

    for (int i = 0; i < 1100; i++) /* history holds 1000 */
        put(STORE_MODIFIED, "ns-1", "a", "a", "n");
    publish_to(h, cr);
    ok(watch_cr(h, cr, &old, NULL,
                (struct hub_watch_req){.rv = 150, .meta = true, .meta_pb = true}) == NULL,
       "below the floor: no watcher");
    is_int(frames(old.buf, old.len, ev, 4), 1, "one frame");
    check_status(&ev[0], 410, "Expired", "too old resource version: 150 (202)",
                 "410, a custom resource's metadata in protobuf");
    hub_free(h);
    hub_res_free(cr);
    teardown();
}

int
main(void)
{
    TAP_RUN(test_encoding_and_transitions);
    TAP_RUN(test_framed_blobs);
    TAP_RUN(test_index_visits);
    TAP_RUN(test_lag_and_catchup);
    TAP_RUN(test_catchup_sources);
    TAP_RUN(test_window_freed_without_watchers);
    TAP_RUN(test_skipped_batches_are_caught_up);
    TAP_RUN(test_initial_state);
    TAP_RUN(test_too_old_and_reset);
    TAP_RUN(test_upstream_reset);
    TAP_RUN(test_time);
    TAP_RUN(test_pb_encoding_and_transitions);
    TAP_RUN(test_pb_and_json_side_by_side);
    TAP_RUN(test_pb_initial_bookmarks_and_catchup);
    TAP_RUN(test_pb_errors);
    TAP_RUN(test_meta_forms_shared);
    TAP_RUN(test_meta_initial_bookmarks_catchup_410);
    TAP_RUN(test_pb_meta);
    TAP_RUN(test_cr_meta_pb);
    return tap_done();
}
