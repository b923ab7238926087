/*
 * authshare.h — the state every serving loop's auth handle shares (auth.c's
 * inside; see auth.h "Serving loops"): the answer caches with the reviews in
 * flight, split in shards by key; the per-source review counts and
 * rejections, split in shards by source; the refusal log's rate; the
 * handles attached, for the counters' sums.
 *
 * Locks: each shard has its own mutex, held for a table operation and never
 * across I/O or a caller's callback. Order: a key shard's, then a source
 * shard's (a new review checks its source while its key is locked, so two
 * loops cannot both start it); reg_mu and log_mu are taken alone.
 */
#ifndef KWC_AUTHSHARE_H
#define KWC_AUTHSHARE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#include "kwc/auth.h"

#define AUTH_KEY_LEN 32    /* SHA-256 */
#define AUTH_KEY_SHARDS 32 /* a power of two */
#define AUTH_SRC_SHARDS 16 /* a power of two */

enum review_kind { REVIEW_TOKEN, REVIEW_SAR };

/* The counters of struct auth_stats kept per handle (the gauges are the
 * shared tables'): one X-macro list, so the sum never misses one. */
#define AUTH_COUNTERS(X)                                                                           \
    X(authn_cert)                                                                                  \
    X(authn_token)                                                                                 \
    X(authn_anonymous)                                                                             \
    X(authn_denied)                                                                                \
    X(token_cache_hits)                                                                            \
    X(token_reviews)                                                                               \
    X(token_review_errors)                                                                         \
    X(authz_allowed)                                                                               \
    X(authz_denied)                                                                                \
    X(authz_errors)                                                                                \
    X(sar_cache_hits)                                                                              \
    X(sar_sent)                                                                                    \
    X(sar_coalesced)                                                                               \
    X(reviews_cancelled)                                                                           \
    X(reviews_timed_out)                                                                           \
    X(token_reviews_refused)                                                                       \
    X(token_reviews_refused_failed)                                                                \
    X(sar_refused)

/* One loop's counts: written by its thread only, read by any (relaxed). */
struct auth_counters {
#define AUTH_COUNTER_FIELD(name) atomic_uint_least64_t name;
    AUTH_COUNTERS(AUTH_COUNTER_FIELD)
#undef AUTH_COUNTER_FIELD
    LIST_ENTRY(auth_counters) reg; /* in the shared's list (reg_mu) */
};

#define AUTH_COUNT(st, name) atomic_fetch_add_explicit(&(st)->name, 1, memory_order_relaxed)

/* Answers and reviews in flight whose key starts with this shard's bits. */
struct key_shard {
    pthread_mutex_t mu;
    struct ttlc *c[2]; /* by review_kind */
} __attribute__((aligned(64)));

struct fail_rec {
    struct src_key src;
    double at;
};

/* The counts of the sources that hash here. */
struct src_shard {
    pthread_mutex_t mu;
    struct srcmap *review[2]; /* reviews in flight per source, by review_kind */
    /* TokenReviews answered "not authenticated" in the last FAIL_WINDOW_S,
     * per source (fail), and in order of their end (fq: a ring) so they
     * leave the count as the window passes */
    struct srcmap *fail;
    struct fail_rec *fq;
    size_t fq_head, fq_len, fq_cap;
} __attribute__((aligned(64)));

struct auth_shared {
    uint32_t magic;
    struct auth_options o;
    uint64_t src_seed;
    struct key_shard keys[AUTH_KEY_SHARDS];
    struct src_shard srcs[AUTH_SRC_SHARDS];
    pthread_mutex_t log_mu; /* the refusal log's rate: a line a second at most */
    double last_share_log;
    unsigned long share_suppressed;
    pthread_mutex_t reg_mu;
    LIST_HEAD(, auth_counters) handles; /* the attached handles' */
    struct auth_stats retired;          /* the counts of handles detached */
};

/* o copied (max_entries 0: the default); free_value frees a cached answer.
 * New. */
struct auth_shared *share_new(const struct auth_options *o, void (*free_value)(void *));
/* Every handle detached. Accepts NULL. */
void share_free(struct auth_shared *s);

/* The TTLs' clock: the caller's, else the monotonic one. Any thread. */
double share_now(const struct auth_shared *s);

static inline struct key_shard *
share_key_shard(struct auth_shared *s, const unsigned char key[AUTH_KEY_LEN])
{
    return &s->keys[key[0] & (AUTH_KEY_SHARDS - 1)]; /* a digest's bits: spread already */
}

/* May src start a new review of kind? Counts it when yes (the review
 * releases it: share_src_release). A TokenReview is refused for the source's
 * rejections first (*failed set), then for its share. src NULL: yes. */
bool share_src_take(struct auth_shared *s, enum review_kind kind, const struct src_key *src,
                    bool *failed);
void share_src_release(struct auth_shared *s, enum review_kind kind, const struct src_key *src);
/* A TokenReview src started was answered "not authenticated". */
void share_fail_add(struct auth_shared *s, const struct src_key *src);
/* 2 x max_reviews_per_source (0: no budget of rejections). */
unsigned share_fail_limit(const struct auth_shared *s);
/* A source refused (logged at most once a second for the whole process). */
void share_log_refusal(struct auth_shared *s, enum review_kind kind, const struct src_key *src,
                       bool failed);

/* The handle's counters join the sums / leave them (folded into retired). */
void share_register(struct auth_shared *s, struct auth_counters *st);
void share_unregister(struct auth_shared *s, struct auth_counters *st);
/* Every handle's counters summed, and the gauges. Any thread. */
void share_stats(struct auth_shared *s, struct auth_stats *out);

#endif
