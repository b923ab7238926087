/*
 * ttlcache.h — answers that expire, and the questions still being asked:
 * a generic cache (key bytes -> value) with request coalescing.
 *
 * Entries: a copy of the key, a value (the cache's; freed by free_value
 * when it leaves) and an expiry time. An entry whose time has come is
 * dropped when it is next looked up or when room is made. At most
 * max_entries: a put into a full cache first evicts an expired entry among
 * the TTLC_EVICT_SCAN oldest, else the oldest.
 *
 * Fetches in flight: at most one per key, found by the same key bytes, so
 * identical questions share one answer. A fetch carries the caller's ctx
 * (its work: a request upstream) and its waiters, which the caller embeds
 * in its own (struct ttlc_wait). When the fetch ends (ttlc_fetch_end) it
 * leaves the flight table and may put its answer; the caller then pops its
 * waiters, answers each, and frees it. When the last waiter leaves
 * (ttlc_leave) before the end, the fetch is dropped: nothing can be cached
 * from it, the next question under its key begins a new one, and its ctx
 * goes back to the caller to stop the work.
 *
 * Time is the caller's: the calls that read the clock take `now` (seconds,
 * any origin that does not go back). Pure: no clock, no loop, no I/O; one
 * thread at a time: a cache several threads use is behind the caller's
 * lock for every call, and a value or fetch it returns is used under that
 * lock only (auth.c's shards: authshare.h). Unit-tested
 * (tests/unit/ttlcache_test.c).
 */
#ifndef KWC_TTLCACHE_H
#define KWC_TTLCACHE_H

#include <stddef.h>

#define TTLC_EVICT_SCAN 16

typedef void (*ttlc_free_cb)(void *value);

/* Keys are klen bytes at key (any bytes; NULL when klen is 0). */

struct ttlc;       /* a cache */
struct ttlc_fetch; /* a question in flight */

/* One waiter of a fetch, embedded in the caller's waiter (fields are the
 * cache's). */
struct ttlc_wait {
    struct ttlc_fetch *fetch;
    struct ttlc_wait *next, *prev;
};

/* max_entries >= 1. free_value frees a value that leaves the cache (NULL:
 * values are not freed). New. */
struct ttlc *ttlc_new(size_t max_entries, ttlc_free_cb free_value);
/* Frees every entry. No fetch may be in flight (end them first: see
 * ttlc_fetch_any). Accepts NULL. */
void ttlc_free(struct ttlc *c);
/* Entries held, expired ones not yet dropped included. */
size_t ttlc_count(const struct ttlc *c);

/* The value under key (borrowed until the next call that changes c), or
 * NULL when there is none or it expired (expires <= now: then dropped). */
void *ttlc_get(struct ttlc *c, const void *key, size_t klen, double now);
/* Caches value (taken) under key until now + ttl, replacing an entry under
 * the same key. A NULL value or a ttl <= 0 caches nothing (the value freed,
 * nothing evicted or replaced). */
void ttlc_put(struct ttlc *c, const void *key, size_t klen, void *value, double ttl, double now);

/* The fetch in flight under key, or NULL. */
struct ttlc_fetch *ttlc_fetch_find(const struct ttlc *c, const void *key, size_t klen);
/* A fetch in flight under key (none may be), for ctx (borrowed; the
 * caller's work). No waiter yet: join one before control returns to the
 * loop. */
struct ttlc_fetch *ttlc_fetch_begin(struct ttlc *c, const void *key, size_t klen, void *ctx);
/* Any fetch in flight, or NULL (for tearing down). */
struct ttlc_fetch *ttlc_fetch_any(const struct ttlc *c);
void *ttlc_fetch_ctx(const struct ttlc_fetch *f);
/* w waits for f (last in line). */
void ttlc_join(struct ttlc_fetch *f, struct ttlc_wait *w);
/*
 * w stops waiting (the caller frees it). When w was the last waiter of a
 * fetch that has not ended, the fetch is dropped (freed, out of flight,
 * nothing cached from it) and its ctx is returned for the caller to stop;
 * else NULL.
 */
void *ttlc_leave(struct ttlc_wait *w);
/* f's answer is in: f leaves the flight table and value (taken; NULL:
 * none) is put under its key for ttl (ttl <= 0: not cached), as ttlc_put.
 * Then pop its waiters and free it; a waiter that leaves meanwhile (from
 * another's callback) is just unlinked. */
void ttlc_fetch_end(struct ttlc_fetch *f, void *value, double ttl, double now);
/* The next waiter of an ended fetch, unlinked (first come, first out), or
 * NULL when none is left. */
struct ttlc_wait *ttlc_fetch_pop(struct ttlc_fetch *f);
/* Frees an ended fetch whose waiters are all popped. Accepts NULL. */
void ttlc_fetch_free(struct ttlc_fetch *f);

#endif
