/*
 * authshare.c — what every serving loop's auth handle shares (authshare.h):
 * the sharded answer caches, the per-source counts, the refusal log's rate,
 * the counters' sums. auth.c does the reviews; this file only keeps the
 * tables and their locks.
 *
 * The per-source rules (auth.h "Fairness") hold for the whole process: a
 * source's reviews in flight and its rejections in the last second are
 * counted in one place (its shard) whichever loop its requests are on.
 */
#include "authshare.h"

#include <assert.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kwc/base.h"
#include "kwc/log.h"
#include "kwc/srcmap.h"
#include "kwc/ttlcache.h"

#define SHARE_MAGIC 0x73686172u /* "shar" */
#define DEFAULT_MAX_ENTRIES 100000

/*
 * The failed-review budget: a source whose TokenReviews came back "not
 * authenticated" 2 x max_reviews_per_source times in the last FAIL_WINDOW_S
 * gets 429 for a token that needs a new review (as past its share), until
 * the window passes. A flood of bogus tokens from one address then costs
 * kwc, and the upstream it asks, at most that many reviews a second; a
 * caller with a valid token (cached, or failing rarely) never meets it.
 * Counted against the source that started the review; upstream errors and
 * timeouts are not the caller's failures and do not count.
 */
#define FAIL_WINDOW_S 1.0

static void
lock(pthread_mutex_t *mu)
{
    if (pthread_mutex_lock(mu) != 0)
        abort(); /* only a broken mutex */
}

static void
unlock(pthread_mutex_t *mu)
{
    pthread_mutex_unlock(mu);
}

struct auth_shared *
share_new(const struct auth_options *o, void (*free_value)(void *))
{
    /* the shards' alignment (a cache line each: no false sharing) */
    void *p = NULL;
    if (posix_memalign(&p, _Alignof(struct auth_shared), sizeof(struct auth_shared)) != 0) {
        fprintf(stderr, "kwc: out of memory allocating %zu bytes\n", sizeof(struct auth_shared));
        abort(); /* as xcalloc */
    }
    struct auth_shared *s = memset(p, 0, sizeof(*s));
    s->magic = SHARE_MAGIC;
    s->o = *o;
    if (s->o.max_entries == 0)
        s->o.max_entries = DEFAULT_MAX_ENTRIES;
    /* max_entries per cache, split evenly over its shards */
    size_t per = (s->o.max_entries + AUTH_KEY_SHARDS - 1) / AUTH_KEY_SHARDS;
    for (int i = 0; i < AUTH_KEY_SHARDS; i++) {
        pthread_mutex_init(&s->keys[i].mu, NULL);
        s->keys[i].c[REVIEW_TOKEN] = ttlc_new(per, free_value);
        s->keys[i].c[REVIEW_SAR] = ttlc_new(per, free_value);
    }
    uint64_t seed = 0;
    if (RAND_bytes((unsigned char *)&seed, sizeof(seed)) != 1)
        seed = (uint64_t)(uintptr_t)s; /* only the hashes' spread */
    s->src_seed = seed;
    for (int i = 0; i < AUTH_SRC_SHARDS; i++) {
        struct src_shard *ss = &s->srcs[i];
        pthread_mutex_init(&ss->mu, NULL);
        ss->review[REVIEW_TOKEN] = srcmap_new(seed + (uint64_t)i);
        ss->review[REVIEW_SAR] = srcmap_new((seed + (uint64_t)i) ^ 0x5bd1e995u);
        ss->fail = srcmap_new((seed + (uint64_t)i) ^ 0x9e3779b97f4a7c15ull);
    }
    pthread_mutex_init(&s->log_mu, NULL);
    pthread_mutex_init(&s->reg_mu, NULL);
    LIST_INIT(&s->handles);
    return s;
}

void
share_free(struct auth_shared *s)
{
    if (!s)
        return;
    assert(s->magic == SHARE_MAGIC);
    assert(LIST_EMPTY(&s->handles));
    for (int i = 0; i < AUTH_KEY_SHARDS; i++) {
        ttlc_free(s->keys[i].c[REVIEW_TOKEN]);
        ttlc_free(s->keys[i].c[REVIEW_SAR]);
        pthread_mutex_destroy(&s->keys[i].mu);
    }
    for (int i = 0; i < AUTH_SRC_SHARDS; i++) {
        struct src_shard *ss = &s->srcs[i];
        srcmap_free(ss->review[REVIEW_TOKEN]);
        srcmap_free(ss->review[REVIEW_SAR]);
        srcmap_free(ss->fail);
        free(ss->fq);
        pthread_mutex_destroy(&ss->mu);
    }
    pthread_mutex_destroy(&s->log_mu);
    pthread_mutex_destroy(&s->reg_mu);
    s->magic = 0;
    free(s);
}

double
share_now(const struct auth_shared *s)
{
    if (s->o.clock)
        return s->o.clock(s->o.clock_arg);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- sources ---- */

static struct src_shard *
src_shard(struct auth_shared *s, const struct src_key *k)
{
    /* seeded: an address cannot be picked to share another's lock on
     * every kwc (it would only share a lock: the counts are per address) */
    uint64_t h = s->src_seed ^ 0xcbf29ce484222325ull;
    for (size_t i = 0; i < sizeof(k->b); i++) {
        h ^= k->b[i];
        h *= 0x100000001b3ull;
    }
    return &s->srcs[(h >> 32) & (AUTH_SRC_SHARDS - 1)];
}

unsigned
share_fail_limit(const struct auth_shared *s)
{
    return 2 * s->o.max_reviews_per_source;
}

/* Rejections older than the window leave the count. ss locked. */
static void
fail_expire(struct src_shard *ss, double now)
{
    while (ss->fq_len && ss->fq[ss->fq_head].at + FAIL_WINDOW_S <= now) {
        srcmap_release(ss->fail, &ss->fq[ss->fq_head].src);
        ss->fq_head = (ss->fq_head + 1) % ss->fq_cap;
        ss->fq_len--;
    }
}

bool
share_src_take(struct auth_shared *s, enum review_kind kind, const struct src_key *src,
               bool *failed)
{
    *failed = false;
    if (!src)
        return true;
    struct src_shard *ss = src_shard(s, src);
    double now = kind == REVIEW_TOKEN && share_fail_limit(s) ? share_now(s) : 0;
    lock(&ss->mu);
    if (kind == REVIEW_TOKEN && share_fail_limit(s)) {
        fail_expire(ss, now);
        if (srcmap_count(ss->fail, src) >= share_fail_limit(s))
            *failed = true;
    }
    bool ok = !*failed && srcmap_take(ss->review[kind], src, s->o.max_reviews_per_source);
    unlock(&ss->mu);
    return ok;
}

void
share_src_release(struct auth_shared *s, enum review_kind kind, const struct src_key *src)
{
    struct src_shard *ss = src_shard(s, src);
    lock(&ss->mu);
    srcmap_release(ss->review[kind], src);
    unlock(&ss->mu);
}

void
share_fail_add(struct auth_shared *s, const struct src_key *src)
{
    struct src_shard *ss = src_shard(s, src);
    double now = share_now(s);
    lock(&ss->mu);
    fail_expire(ss, now); /* the ring holds the last window only */
    if (ss->fq_len == ss->fq_cap) {
        size_t cap = ss->fq_cap ? 2 * ss->fq_cap : 64;
        struct fail_rec *q = xcalloc(cap, sizeof(*q));
        for (size_t i = 0; i < ss->fq_len; i++)
            q[i] = ss->fq[(ss->fq_head + i) % ss->fq_cap];
        free(ss->fq);
        ss->fq = q;
        ss->fq_cap = cap;
        ss->fq_head = 0;
    }
    ss->fq[(ss->fq_head + ss->fq_len) % ss->fq_cap] = (struct fail_rec){*src, now};
    ss->fq_len++;
    srcmap_take(ss->fail, src, 0);
    unlock(&ss->mu);
}

void
share_log_refusal(struct auth_shared *s, enum review_kind kind, const struct src_key *src,
                  bool failed)
{
    double now = share_now(s);
    lock(&s->log_mu);
    if (s->last_share_log && now - s->last_share_log < 1.0) {
        s->share_suppressed++;
        unlock(&s->log_mu);
        return;
    }
    unsigned long suppressed = s->share_suppressed;
    s->last_share_log = now;
    s->share_suppressed = 0;
    unlock(&s->log_mu);
    char t[SRC_KEY_TEXT];
    src_key_text(src, t, sizeof(t));
    if (failed)
        log_warnx("auth: %s had %u TokenReviews rejected in the last second (2 x "
                  "--max-reviews-per-source): answering 429 to its requests that need another "
                  "(%lu more since the last such line)",
                  t, share_fail_limit(s), suppressed);
    else
        log_warnx("auth: %s holds %u %s (--max-reviews-per-source): answering 429 to its "
                  "requests that need another (%lu more since the last such line)",
                  t, s->o.max_reviews_per_source,
                  kind == REVIEW_TOKEN ? "TokenReviews"
                                       : "SubjectAccessReviews of callers not "
                                         "authenticated",
                  suppressed);
}

/* ---- counters ---- */

void
share_register(struct auth_shared *s, struct auth_counters *st)
{
    lock(&s->reg_mu);
    LIST_INSERT_HEAD(&s->handles, st, reg);
    unlock(&s->reg_mu);
}

/* out += st (a relaxed read of each: a scrape sees each count as of some
 * moment, never torn). */
static void
add_counters(struct auth_stats *out, const struct auth_counters *st)
{
#define AUTH_COUNTER_ADD(name) out->name += atomic_load_explicit(&st->name, memory_order_relaxed);
    AUTH_COUNTERS(AUTH_COUNTER_ADD)
#undef AUTH_COUNTER_ADD
}

void
share_unregister(struct auth_shared *s, struct auth_counters *st)
{
    lock(&s->reg_mu);
    LIST_REMOVE(st, reg);
    add_counters(&s->retired, st); /* the totals never go back */
    unlock(&s->reg_mu);
}

void
share_stats(struct auth_shared *s, struct auth_stats *out)
{
    lock(&s->reg_mu);
    *out = s->retired;
    struct auth_counters *st;
    LIST_FOREACH(st, &s->handles, reg)
    add_counters(out, st);
    unlock(&s->reg_mu);
    out->review_sources = out->failing_sources = 0;
    double now = share_now(s);
    for (int i = 0; i < AUTH_SRC_SHARDS; i++) {
        struct src_shard *ss = &s->srcs[i];
        lock(&ss->mu);
        fail_expire(ss, now);
        out->review_sources +=
            srcmap_sources(ss->review[REVIEW_TOKEN]) + srcmap_sources(ss->review[REVIEW_SAR]);
        out->failing_sources += srcmap_sources(ss->fail);
        unlock(&ss->mu);
    }
}
