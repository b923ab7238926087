/*
 * auth.h — who is calling, and may they (DESIGN.md "Security").
 *
 * kwc delegates both questions to the upstream, as kube-apiserver's
 * --authentication-token-webhook and --authorization-mode=Webhook do, and
 * caches the answers:
 *
 *   authentication, in kube-apiserver's order:
 *     1. a client certificate the TLS layer verified against --client-ca-file:
 *        user = subject CN, groups = subject O values (+ system:authenticated)
 *     2. Authorization: Bearer TOKEN -> TokenReview (authentication.k8s.io/v1),
 *        cached by SHA-256 of the token for token_ttl (kube: 2m), failures for
 *        token_fail_ttl; the token itself is never logged nor kept
 *     3. nothing: system:anonymous / system:unauthenticated if allowed, else 401
 *     A bearer token the upstream rejects is a 401 (kube does not fall back to
 *     anonymous for a bad token).
 *   authorization: SubjectAccessReview (authorization.k8s.io/v1) with kube's
 *     request attributes; allowed answers cached allow_ttl (kube: 5m), denied
 *     deny_ttl (kube: 30s). Concurrent identical questions are asked upstream
 *     once (coalesced while in flight).
 *   impersonation (a caller's own Impersonate-* headers, kubectl --as):
 *     each asked as verb "impersonate" on users / groups / uids /
 *     userextras/KEY / serviceaccounts, then the request runs as that user.
 *
 * Fairness (issue 29): each review has its own deadline, review_timeout_ms,
 * counted from when it is asked (the time it waits for a review connection
 * behind others included), so a review that hangs upstream, and every
 * caller queued behind it, is answered as a failed review (below) instead
 * of waiting for the upstream client's header timeout; nothing is cached
 * from it. And a TokenReview counts against the source address whose
 * request started it (a request that joins a review in flight for the same
 * token costs nothing): past max_reviews_per_source, a source's request
 * that needs a new review is answered 429 at once, so one address flooding
 * kwc with tokens that hang holds at most its share of the pool and the
 * rest is free for other callers' new tokens. The same share holds in the
 * SubjectAccessReview pool for the reviews of callers that are not
 * authenticated (--anonymous-auth's system:anonymous), for which the
 * caller passes a source to auth_authorize.
 * And a source whose TokenReviews the upstream rejected 2 x
 * max_reviews_per_source times in the last second is answered 429 for a
 * token that needs a new review until that second has passed, so bogus
 * tokens from one address cost kwc and the upstream at most that many
 * reviews a second (upstream errors and timeouts are not the caller's
 * failures and do not count).
 *
 * An upstream that cannot answer (down, 5xx, garbage) fails closed, as
 * kube-apiserver does when its webhook fails: authentication gives 401
 * (filters/authentication.go: an authenticator error is a failed login),
 * authorization AUTH_ERROR, which the caller answers 500 InternalError
 * (filters/authorization.go: an error without an allow). Logged, at most once
 * a second; a cached answer still serves.
 *
 * Serving loops (issue 32): one struct auth_shared holds the caches, the
 * reviews in flight and the per-source counts (max_reviews_per_source and
 * the rejections a second are per process, not per loop); each loop has a
 * handle on it (auth_attach) bound to its event_base, its upstream client
 * and its mailbox, and calls the functions below with its own handle, on
 * its own thread. The upstream sees no more reviews for more loops: a hit
 * is answered on the caller's loop at once (a lookup under one of 32 key
 * shards' locks, held for the lookup only); the first loop to miss sends
 * the review through its own upstream client, and identical questions from
 * every loop join it; when it ends, each waiter is called back on its own
 * loop (through the waiter loop's mailbox when it is another). The caches'
 * max_entries is split evenly over the shards (the oldest of a shard go
 * first). auth_new is a shared object with its one handle (one loop, no
 * mailbox needed).
 */
#ifndef KWC_AUTH_H
#define KWC_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kwc/authwire.h" /* the identity, the question, the wire formats */
#include "kwc/srcmap.h"   /* struct src_key */

struct event_base;
struct up_client;
struct x509_st;

struct auth_options {
    bool anonymous; /* --anonymous-auth */
    /* TTLs in seconds, fractions kept (the flags are Go durations: 500ms) */
    double token_ttl_s;              /* --authentication-token-webhook-cache-ttl (120) */
    double token_fail_ttl_s;         /* a rejected or failed token review (10) */
    double allow_ttl_s;              /* --authorization-webhook-cache-authorized-ttl (300) */
    double deny_ttl_s;               /* --authorization-webhook-cache-unauthorized-ttl (30) */
    size_t max_entries;              /* per cache; the oldest go first (default 100000) */
    unsigned review_timeout_ms;      /* a review's deadline from when it is asked; 0: none */
    unsigned max_reviews_per_source; /* reviews a source may have started, per pool, and half
                                        the rejected ones a second; 0: none */
    /* The clock of the TTLs and of the failure log's rate, in seconds (any
     * origin that does not go back); NULL: CLOCK_MONOTONIC. For tests. */
    double (*clock)(void *arg);
    void *clock_arg;
};

/* Counters (for /metrics). */
struct auth_stats {
    uint64_t authn_cert, authn_token, authn_anonymous, authn_denied;
    uint64_t token_cache_hits, token_reviews, token_review_errors;
    uint64_t authz_allowed, authz_denied, authz_errors;
    uint64_t sar_cache_hits, sar_sent, sar_coalesced;
    uint64_t reviews_cancelled;            /* no one waited for them any more */
    uint64_t reviews_timed_out;            /* past review_timeout_ms (each kind) */
    uint64_t token_reviews_refused;        /* a source past max_reviews_per_source: 429 */
    uint64_t token_reviews_refused_failed; /* a source past its rejected reviews a second: 429 */
    uint64_t failing_sources;              /* sources with a rejected review in the last second */
    uint64_t sar_refused;                  /* the same for an unauthenticated caller's SAR */
    uint64_t review_sources;               /* sources with a review counted now, per pool, summed */
};

struct auth;        /* one loop's handle */
struct auth_shared; /* what every loop's handle shares */
struct auth_wait;   /* a pending question; cancel it if the caller goes away first */
struct mailbox;

/* One loop, one handle: a shared object with its only handle, bound to
 * base and up. o is copied. A ttl of 0 caches nothing of that kind;
 * max_entries 0 means 100000. Returns 0. */
int auth_new(struct event_base *base, struct up_client *up, const struct auth_options *o,
             struct auth **out);
/* auth_detach, and for auth_new's handle its shared object too. Accepts
 * NULL. */
void auth_free(struct auth *a);

/* The caches, reviews and counts every loop's handle shares. o as
 * auth_new's. New. Any thread. */
int auth_shared_new(const struct auth_options *o, struct auth_shared **out);
/* Every handle detached. Accepts NULL. */
void auth_shared_free(struct auth_shared *s);
/*
 * A handle on s for one loop: its reviews go out through up and their
 * timers run on base; waiters on other loops are answered through their
 * loops' mailboxes, and this loop's through mb (NULL only when no other
 * handle is ever attached to s). base, up and mb are borrowed and must
 * outlive the handle. Any thread (it touches neither base nor up): on the
 * main thread before the loop's thread starts, or on the loop's thread.
 */
int auth_attach(struct auth_shared *s, struct event_base *base, struct up_client *up,
                struct mailbox *mb, struct auth **out);
/*
 * Frees a handle: on its loop's thread, or on any thread once that loop's
 * thread has stopped; not from inside an auth callback. Every wait made
 * through it must be over (answered or cancelled: free what holds them
 * first). The reviews it sent and that are still in flight end: their
 * transfers are cancelled and nothing is cached from them; their waiters on
 * this loop are dropped without their callbacks (auth_free's rule), those
 * on other loops are answered as by a failed review (401 / AUTH_ERROR)
 * through their mailboxes. Before this loop's up_client_free and
 * event_base_free; this loop's mailbox may be freed before or after (calls
 * it still holds for this handle are safe to run after it is gone). A loop
 * whose waits are all over is never posted to again, so freeing the
 * stopped loops one after another, each as front (its waits cancelled),
 * handle, up_client, mailbox, base, is safe; auth_shared_free after the
 * last. Accepts NULL.
 */
void auth_detach(struct auth *a);
/* The counters of every handle of a's shared object, summed (those of
 * handles detached included), and the shared gauges: the process's totals,
 * not a's loop's. Any thread (relaxed reads: each count is as of some
 * moment during the call). Do not sum it over loops. */
void auth_stats(const struct auth *a, struct auth_stats *out);
void auth_shared_stats(struct auth_shared *s, struct auth_stats *out);

/*
 * Who is this. cert: the verified client certificate (NULL: none);
 * authorization: the Authorization header (NULL: none; borrowed, not kept
 * past the call); src: the client's address (borrowed; NULL: none, no
 * share applies). status: 0 and u (borrowed for the callback: keep it with
 * auth_user_ref), 401 and NULL, or 429 and NULL (src holds its share of
 * TokenReviews: answer kube's max-in-flight 429 TooManyRequests with
 * Retry-After). An answer known at once (the certificate, the cache,
 * anonymous, no credentials, a review that could not be started, a source
 * past its share) calls cb before returning and returns NULL; else a wait
 * the caller may cancel until cb runs. Identical tokens under review share
 * one TokenReview, whichever loop asks. a: this loop's handle; cb runs on
 * this loop's thread.
 */
typedef void (*auth_user_cb)(void *arg, int status, struct auth_user *u);
struct auth_wait *auth_authenticate(struct auth *a, struct x509_st *cert, const char *authorization,
                                    const struct src_key *src, auth_user_cb cb, void *arg);

/* reason: the SubjectAccessReview's status.reason (or the error), "" if none;
 * valid during the callback. u and at are borrowed for the call only. src:
 * the source a new review counts against, for a caller that is not
 * authenticated (NULL: none; borrowed); past its share, AUTH_BUSY at once.
 * Same synchronous rule as auth_authenticate (a cache hit, a review that
 * could not be started, a source past its share). */
typedef void (*auth_decision_cb)(void *arg, enum auth_decision d, const char *reason);
struct auth_wait *auth_authorize(struct auth *a, const struct auth_user *u,
                                 const struct auth_attrs *at, const struct src_key *src,
                                 auth_decision_cb cb, void *arg);
/*
 * The caller went away: w's callback never runs and w is freed. When w was
 * the last waiter of its review (coalesced or not), the review is cancelled
 * too: its upstream transfer ends (a connection and a descriptor freed, or
 * its place in the pool's queue given up) and nothing is cached from it, so
 * the next request with the same token or question asks again. A review that
 * hangs upstream therefore lasts no longer than its callers wait. Accepts
 * NULL. Not for a wait whose callback has run. On the loop thread that made
 * w; safe while the answer is landing on another loop (w's callback then
 * never runs either).
 */
void auth_cancel(struct auth_wait *w);

#endif
