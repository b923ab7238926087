/*
 * ttlcache_test.c — proxy/identity/ttlcache.c: answers that expire and the
 * questions in flight.
 *
 * The clock is the test's: every call takes `now`, so expiry is checked at
 * the exact instant (an entry put at t for ttl lives while now < t + ttl).
 * Values are counted boxes: each free is recorded, so a value freed twice,
 * never, or too early shows. The fetch tests play auth.c's part: waiters
 * embedded in the caller's own struct, a ctx handed back when the last one
 * leaves.
 */
#include "kwc/ttlcache.h"

#include "kwc/base.h"
#include "tap.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- counted values ---- */

static int frees;         /* values freed */
static int freed_ids[64]; /* their ids, in order (the first 64) */

struct val {
    int id;
};

static void *
val_new(int id)
{
    struct val *v = xmalloc(sizeof(*v));
    v->id = id;
    return v;
}

static void
val_free(void *p)
{
    struct val *v = p;
    if (frees < (int)KWC_ARRAY_LEN(freed_ids))
        freed_ids[frees] = v->id;
    frees++;
    free(v);
}

static int
id_of(void *p)
{
    return p ? ((struct val *)p)->id : -1;
}

static int
get_id(struct ttlc *c, const char *key, double now)
{
    return id_of(ttlc_get(c, key, strlen(key), now));
}

static void
put(struct ttlc *c, const char *key, int id, double ttl, double now)
{
    ttlc_put(c, key, strlen(key), val_new(id), ttl, now);
}

/* ---- entries ---- */

static void
test_get_put(void)
{
    frees = 0;
    struct ttlc *c = ttlc_new(100, val_free);
    is_int(get_id(c, "a", 0), -1, "empty: a miss");
    put(c, "a", 1, 10, 0);
    put(c, "ab", 2, 10, 0);
    is_int(get_id(c, "a", 1), 1, "a");
    is_int(get_id(c, "ab", 1), 2, "ab: a key and its prefix are two keys");
    is_int(get_id(c, "abc", 1), -1, "abc: a miss");
    is_int(ttlc_count(c), 2, "two entries");

    /* key bytes, NUL bytes included; the empty key */
    ttlc_put(c, "x\0y", 3, val_new(3), 10, 0);
    ttlc_put(c, "x\0z", 3, val_new(4), 10, 0);
    ttlc_put(c, "", 0, val_new(5), 10, 0);
    is_int(id_of(ttlc_get(c, "x\0y", 3, 1)), 3, "a key with a NUL byte");
    is_int(id_of(ttlc_get(c, "x\0z", 3, 1)), 4, "the same up to its NUL: another key");
    is_int(id_of(ttlc_get(c, "x", 1, 1)), -1, "cut at the NUL: a miss");
    is_int(id_of(ttlc_get(c, "", 0, 1)), 5, "the empty key");
    is_int(id_of(ttlc_get(c, NULL, 0, 1)), 5, "the empty key, as NULL");

    /* the same key again replaces the entry (the old value freed) */
    put(c, "a", 6, 10, 0);
    is_int(get_id(c, "a", 1), 6, "replaced");
    is_int(frees, 1, "the old value freed");
    is_int(freed_ids[0], 1, "the old one");
    is_int(ttlc_count(c), 5, "still one entry under a");

    /* ttl <= 0 caches nothing and frees the value */
    put(c, "z", 7, 0, 0);
    put(c, "zz", 8, -1, 0);
    is_int(get_id(c, "z", 0), -1, "ttl 0: not cached");
    is_int(get_id(c, "zz", 0), -1, "ttl < 0: not cached");
    is_int(frees, 3, "both values freed");
    ttlc_free(c);
    is_int(frees, 8, "ttlc_free frees every value once");
    ttlc_free(NULL);
}

static void
test_expiry(void)
{
    frees = 0;
    struct ttlc *c = ttlc_new(100, val_free);
    put(c, "k", 1, 120, 1000);
    is_int(get_id(c, "k", 1000), 1, "at once");
    is_int(get_id(c, "k", 1119.999), 1, "just before now + ttl");
    is_int(frees, 0, "nothing freed");
    is_int(get_id(c, "k", 1120), -1, "at now + ttl: expired");
    is_int(frees, 1, "dropped on the way");
    is_int(ttlc_count(c), 0, "no entry left");
    is_int(get_id(c, "k", 1000), -1, "gone, whatever the clock says later");

    /* each entry its own ttl */
    put(c, "ok", 2, 300, 0);
    put(c, "no", 3, 30, 0);
    is_int(get_id(c, "no", 29), 3, "deny_ttl not yet out");
    is_int(get_id(c, "no", 30), -1, "deny_ttl out");
    is_int(get_id(c, "ok", 30), 2, "allow_ttl not yet out");
    is_int(get_id(c, "ok", 300), -1, "allow_ttl out");

    /* an expired entry that is never looked up stays until room is made */
    put(c, "old", 4, 1, 0);
    is_int(ttlc_count(c), 1, "held");
    ttlc_free(c);
    is_int(frees, 4, "every value freed once");
}

/* At max_entries a put first evicts: an expired entry among the 16 oldest,
 * else the oldest. */
static void
test_eviction(void)
{
    frees = 0;
    struct ttlc *c = ttlc_new(3, val_free);
    put(c, "a", 1, 100, 0);
    put(c, "b", 2, 100, 1);
    put(c, "c", 3, 100, 2);
    put(c, "d", 4, 100, 3);
    is_int(ttlc_count(c), 3, "never over max_entries");
    is_int(get_id(c, "a", 3), -1, "none expired: the oldest went");
    is_int(freed_ids[0], 1, "a freed");
    is_int(get_id(c, "b", 3), 2, "b kept");

    /* b (oldest) lives on, c expires: c goes first */
    ttlc_free(c);
    frees = 0;
    c = ttlc_new(3, val_free);
    put(c, "a", 1, 100, 0);
    put(c, "b", 2, 5, 0);
    put(c, "c", 3, 100, 0);
    put(c, "d", 4, 100, 10);
    is_int(frees, 1, "one evicted");
    is_int(freed_ids[0], 2, "the expired one, not the oldest");
    is_int(get_id(c, "a", 10), 1, "the oldest kept");

    /* a replace makes no room it does not need */
    put(c, "d", 5, 100, 10);
    is_int(frees, 2, "only the replaced value freed");
    is_int(get_id(c, "a", 10), 1, "a kept");
    is_int(get_id(c, "c", 10), 3, "c kept");
    ttlc_free(c);

    /* the scan looks at the 16 oldest only */
    for (int exp = 15; exp <= 16; exp++) {
        frees = 0;
        c = ttlc_new(20, val_free);
        char k[16];
        for (int i = 0; i < 20; i++) {
            snprintf(k, sizeof(k), "k%d", i);
            put(c, k, i, i == exp ? 1 : 100, 0);
        }
        put(c, "new", 99, 100, 50);
        char what[80];
        snprintf(what, sizeof(what), "entry %d expired: %s evicted", exp,
                 exp < TTLC_EVICT_SCAN ? "it is" : "the oldest is");
        is_int(freed_ids[0], exp < TTLC_EVICT_SCAN ? exp : 0, what);
        is_int(frees, 1, "one entry evicted");
        ttlc_free(c);
    }
}

/* Many entries (the tables grow): every one found, none lost. */
static void
test_many(void)
{
    frees = 0;
    struct ttlc *c = ttlc_new(5000, val_free);
    char k[16];
    for (int i = 0; i < 5000; i++) {
        snprintf(k, sizeof(k), "key-%d", i);
        put(c, k, i, 100, 0);
    }
    int found = 0;
    for (int i = 0; i < 5000; i++) {
        snprintf(k, sizeof(k), "key-%d", i);
        found += get_id(c, k, 1) == i;
    }
    is_int(found, 5000, "5000 entries found");
    put(c, "one-more", 5000, 100, 1);
    is_int(ttlc_count(c), 5000, "at max_entries");
    is_int(get_id(c, "key-0", 1), -1, "the oldest made room");
    is_int(get_id(c, "key-1", 1), 1, "the next kept");
    ttlc_free(c);
    is_int(frees, 5001, "every value freed once");
}

/* ---- fetches in flight ---- */

struct waiter {
    int id;
    struct ttlc_wait tw;
};

static struct waiter *
waiter_of(struct ttlc_wait *tw)
{
    return (struct waiter *)(void *)((char *)tw - offsetof(struct waiter, tw));
}

static void
test_coalescing(void)
{
    frees = 0;
    struct ttlc *c = ttlc_new(10, val_free);
    int work = 7; /* the caller's ctx */
    ok(ttlc_fetch_find(c, "q", 1) == NULL, "nothing in flight");
    ok(ttlc_fetch_any(c) == NULL, "nothing at all");
    struct ttlc_fetch *f = ttlc_fetch_begin(c, "q", 1, &work);
    ok(ttlc_fetch_find(c, "q", 1) == f, "found in flight");
    ok(ttlc_fetch_find(c, "qq", 2) == NULL, "under its key only");
    ok(ttlc_fetch_any(c) == f, "the one in flight");
    ok(ttlc_fetch_ctx(f) == &work, "its ctx");
    struct waiter w[5];
    for (int i = 0; i < 5; i++) {
        w[i].id = i;
        ttlc_join(ttlc_fetch_find(c, "q", 1), &w[i].tw);
    }
    is_int(get_id(c, "q", 0), -1, "in flight is not cached");

    ttlc_fetch_end(f, val_new(1), 30, 100);
    ok(ttlc_fetch_find(c, "q", 1) == NULL, "ended: out of flight");
    is_int(get_id(c, "q", 100), 1, "its answer cached before any waiter runs");
    is_int(get_id(c, "q", 129.5), 1, "for its ttl");
    int order = 0, n = 0;
    struct ttlc_wait *tw;
    while ((tw = ttlc_fetch_pop(f)) != NULL) {
        order += waiter_of(tw)->id == n;
        n++;
        if (n == 2) {
            /* a waiter's callback cancels another waiter of the same
             * fetch: it is unlinked, nothing else */
            ok(ttlc_leave(&w[3].tw) == NULL, "leaving an ended fetch hands nothing back");
        }
    }
    is_int(n, 4, "four waiters popped (one left)");
    is_int(order, 3, "in arrival order: 0, 1, 2");
    ttlc_fetch_free(f);
    ttlc_fetch_free(NULL);
    is_int(get_id(c, "q", 130), -1, "expired at 100 + 30");

    /* an answer that is not cached */
    f = ttlc_fetch_begin(c, "e", 1, &work);
    ttlc_join(f, &w[0].tw);
    ttlc_fetch_end(f, val_new(2), 0, 200);
    is_int(get_id(c, "e", 200), -1, "ttl 0: not cached");
    ok(ttlc_fetch_pop(f) == &w[0].tw, "its waiter");
    ok(ttlc_fetch_pop(f) == NULL, "then none");
    ttlc_fetch_free(f);
    f = ttlc_fetch_begin(c, "e", 1, &work);
    ttlc_join(f, &w[0].tw);
    ttlc_fetch_end(f, NULL, 30, 200);
    is_int(ttlc_count(c), 0, "no value: nothing cached");
    ttlc_fetch_pop(f);
    ttlc_fetch_free(f);
    ttlc_free(c);
    is_int(frees, 2, "every value freed once");
}

static void
test_cancel(void)
{
    frees = 0;
    struct ttlc *c = ttlc_new(10, val_free);
    int work = 7;
    struct ttlc_fetch *f = ttlc_fetch_begin(c, "q", 1, &work);
    struct waiter a = {.id = 1}, b = {.id = 2};
    ttlc_join(f, &a.tw);
    ttlc_join(f, &b.tw);
    ok(ttlc_leave(&a.tw) == NULL, "one of two leaves: the fetch goes on");
    ok(ttlc_fetch_find(c, "q", 1) == f, "still in flight");
    ok(ttlc_leave(&b.tw) == &work, "the last leaves: its ctx comes back");
    ok(ttlc_fetch_find(c, "q", 1) == NULL, "out of flight");
    ok(ttlc_fetch_any(c) == NULL, "nothing in flight");
    is_int(get_id(c, "q", 0), -1, "nothing cached from it");

    /* the next question under its key begins a new fetch */
    struct ttlc_fetch *g = ttlc_fetch_begin(c, "q", 1, &work);
    ttlc_join(g, &a.tw);
    ttlc_fetch_end(g, val_new(1), 10, 0);
    ok(ttlc_fetch_pop(g) == &a.tw, "the new fetch's waiter");
    ttlc_fetch_free(g);
    is_int(get_id(c, "q", 1), 1, "the new fetch's answer is cached");

    /* the first waiter leaves, later ones stay in order */
    struct waiter w[3] = {{.id = 0}, {.id = 1}, {.id = 2}};
    f = ttlc_fetch_begin(c, "r", 1, &work);
    for (int i = 0; i < 3; i++)
        ttlc_join(f, &w[i].tw);
    ok(ttlc_leave(&w[0].tw) == NULL, "the first leaves");
    ok(ttlc_leave(&w[2].tw) == NULL, "the last leaves");
    ttlc_fetch_end(f, NULL, 0, 0);
    ok(ttlc_fetch_pop(f) == &w[1].tw, "the middle one is left");
    ok(ttlc_fetch_pop(f) == NULL, "alone");
    ttlc_fetch_free(f);

    /* the last waiter of an ended fetch leaves (from the callback of the
     * one before it): unlinked only, the fetch is the caller's to free */
    f = ttlc_fetch_begin(c, "s", 1, &work);
    ttlc_join(f, &w[0].tw);
    ttlc_join(f, &w[1].tw);
    ttlc_fetch_end(f, val_new(2), 10, 0);
    ok(ttlc_fetch_pop(f) == &w[0].tw, "the first popped");
    ok(ttlc_leave(&w[1].tw) == NULL, "the last leaves an ended fetch: no ctx back");
    ok(ttlc_fetch_pop(f) == NULL, "none left");
    ttlc_fetch_free(f);
    is_int(get_id(c, "s", 1), 2, "its answer stays cached");

    /* tearing down: every fetch in flight found, ended without an answer */
    struct waiter t[4];
    char k[16];
    for (int i = 0; i < 4; i++) {
        snprintf(k, sizeof(k), "t%d", i);
        ttlc_join(ttlc_fetch_begin(c, k, 2, &t[i]), &t[i].tw);
    }
    int ended = 0;
    while ((f = ttlc_fetch_any(c)) != NULL && ended < 10) {
        struct waiter *ctx = ttlc_fetch_ctx(f);
        ttlc_fetch_end(f, NULL, 0, 0);
        ended += ttlc_fetch_pop(f) == &ctx->tw;
        ttlc_fetch_free(f);
    }
    is_int(ended, 4, "four fetches torn down");
    ttlc_free(c);
    is_int(frees, 2, "every value freed once");
}

int
main(void)
{
    TAP_RUN(test_get_put);
    TAP_RUN(test_expiry);
    TAP_RUN(test_eviction);
    TAP_RUN(test_many);
    TAP_RUN(test_coalescing);
    TAP_RUN(test_cancel);
    return tap_done();
}
