/*
 * auth.c — delegated authentication and authorization (see auth.h): the
 * reviews sent upstream and the caches of their answers.
 *
 * Sits in front of the data path: a request is authenticated (certificate,
 * then bearer token by TokenReview, then anonymous) and authorized (by
 * SubjectAccessReview) before it reaches the cache or the upstream. What the
 * reviews and the 403 look like is authwire.c's (pure); this file sends
 * them through the upstream client and keeps the answers.
 *
 * Owns two answer caches (ttlcache.c: tokens, questions) and the reviews in
 * flight, each one a fetch of its cache. Both are keyed by a SHA-256 digest
 * (of the token; of the question's bytes, standing for the
 * SubjectAccessReviewSpec JSON by which kube's webhook authorizer keys its
 * cache), so identical questions share one upstream request (coalescing),
 * and every waiter is called back when it ends. At max_entries, expired
 * entries among the oldest go first, else the oldest.
 *
 * Each review has a timer, review_timeout_ms from its start (when it was
 * handed to the upstream client, which queues it while its pool is full):
 * on expiry its transfer is cancelled and it ends like a failed review
 * (401 / AUTH_ERROR) except that nothing is cached, as kube's webhook
 * authenticator and authorizer cache no error. A TokenReview started for
 * a request with a source address is counted in a->review_src[REVIEW_TOKEN]
 * under that source until it ends (answered, timed out, or cancelled with
 * its last waiter); a source at max_reviews_per_source gets 429 for a token
 * that needs a new review. SubjectAccessReviews are counted likewise in
 * a->review_src[REVIEW_SAR] when the caller passes a source (an
 * unauthenticated caller: authenticated ones are not shared out per
 * address), AUTH_BUSY past the share.
 *
 * Invariants: a token lives only in the caller's header and in one review's
 * request body, which is wiped when the review ends; no log line holds it.
 * Upstream response bodies are bounded (AUTH_MAX_BODY) before they are
 * stored. Nothing is freed inside the upstream client's callbacks except by
 * its own rules (on_done ends the xfer; an oversized body is cancelled and
 * answered from a deferred event).
 */
#include "kwc/auth.h"

#include <assert.h>
#include <errno.h>
#include <event2/event.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kwc/base.h"
#include "kwc/log.h"
#include "kwc/ttlcache.h"
#include "kwc/upstream.h"

#define AUTH_MAGIC 0x61757468u   /* "auth" */
#define REVIEW_MAGIC 0x72657677u /* "revw" */
#define WAIT_MAGIC 0x77616974u   /* "wait" */
#define AUTH_MAX_BODY ((size_t)1 << 20)
#define DEFAULT_MAX_ENTRIES 100000
#define KEY_LEN 32 /* SHA-256 */

#define TOKENREVIEW_PATH "/apis/authentication.k8s.io/v1/tokenreviews"
#define SAR_PATH "/apis/authorization.k8s.io/v1/subjectaccessreviews"

/* ---- small helpers ---- */

static double
mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void
sha256(const void *p, size_t n, unsigned char out[KEY_LEN])
{
    unsigned int len = KEY_LEN;
    if (EVP_Digest(p, n, out, &len, EVP_sha256(), NULL) != 1)
        abort(); /* only when OpenSSL cannot run SHA-256 at all */
}

/* The cache key of a question (see auth_question_bytes). */
static void
question_key(const struct auth_user *u, const struct auth_attrs *at, unsigned char key[KEY_LEN])
{
    size_t n;
    char *b = auth_question_bytes(u, at, &n);
    sha256(b, n, key);
    free(b);
}

/* ---- the caches' values ---- */

struct tok_ent {
    int status; /* 0 (u) or 401 */
    struct auth_user *u;
};

struct sar_ent {
    enum auth_decision d;
    char *reason;
};

static void
free_tok_ent(void *p)
{
    struct tok_ent *t = p;
    auth_user_unref(t->u);
    free(t);
}

static void
free_sar_ent(void *p)
{
    struct sar_ent *s = p;
    free(s->reason);
    free(s);
}

/* ---- reviews in flight ---- */

enum review_kind { REVIEW_TOKEN, REVIEW_SAR };

struct auth_wait {
    uint32_t magic;
    struct ttlc_wait tw; /* in its review's fetch */
    auth_user_cb ucb;
    auth_decision_cb dcb;
    void *arg;
};

static struct auth_wait *
wait_of(struct ttlc_wait *tw)
{
    return (struct auth_wait *)(void *)((char *)tw - offsetof(struct auth_wait, tw));
}

struct review {
    uint32_t magic;
    struct auth *a;
    enum review_kind kind;
    bool cacheable;
    struct ttlc_fetch *f; /* its fetch in a->tokens or a->sars (ctx: this review) */
    struct up_xfer *x;
    char *req; /* the request body (holds the token of a TokenReview) */
    size_t req_len, req_off;
    int status;
    char *resp;
    size_t resp_len, resp_cap;
    struct event *oversize_ev; /* answers an oversized response outside curl */
    struct event *timer;       /* review_timeout_ms from the start */
    bool timed_out;            /* ended by the timer: nothing is cached */
    bool src_counted;          /* counted in a->review_src under src */
    struct src_key src;
};

struct auth {
    uint32_t magic;
    struct event_base *base;
    struct up_client *up;
    struct auth_options o;
    struct ttlc *tokens, *sars;   /* answers, and the reviews in flight */
    struct srcmap *review_src[2]; /* reviews in flight per source, by review_kind */
    struct auth_stats st;
    double last_share_log; /* log_share's rate: a line a second at most */
    unsigned long share_suppressed;
    /* TokenReviews answered "not authenticated" in the last FAIL_WINDOW_S,
     * per source that started them (fail_src), and in order of their end
     * (fq: a ring) so they leave the count as the window passes */
    struct srcmap *fail_src;
    struct fail_rec *fq;
    size_t fq_head, fq_len, fq_cap;
    struct event *fail_ev; /* the oldest's expiry (the count is also trimmed when read) */
};

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

struct fail_rec {
    struct src_key src;
    double at;
};
/* The TTLs' clock: the caller's, else the monotonic one. */
static double
now_of(const struct auth *a)
{
    return a->o.clock ? a->o.clock(a->o.clock_arg) : mono_now();
}

static unsigned
fail_limit(const struct auth *a)
{
    return 2 * a->o.max_reviews_per_source;
}

/* Failures older than the window leave the count; the timer is set for the
 * oldest one left. */
static void
fail_expire(struct auth *a)
{
    double now = now_of(a);
    while (a->fq_len && a->fq[a->fq_head].at + FAIL_WINDOW_S <= now) {
        srcmap_release(a->fail_src, &a->fq[a->fq_head].src);
        a->fq_head = (a->fq_head + 1) % a->fq_cap;
        a->fq_len--;
    }
    event_del(a->fail_ev);
    if (a->fq_len) {
        double left = a->fq[a->fq_head].at + FAIL_WINDOW_S - now;
        struct timeval tv = {(time_t)left, (suseconds_t)((left - (time_t)left) * 1e6) + 1000};
        evtimer_add(a->fail_ev, &tv);
    }
}

static void
on_fail_expire(evutil_socket_t fd, short what, void *arg)
{
    fail_expire(arg);
}

/* A review src started was answered "not authenticated". */
static void
fail_add(struct auth *a, const struct src_key *src)
{
    if (a->fq_len == a->fq_cap) {
        size_t cap = a->fq_cap ? 2 * a->fq_cap : 64;
        struct fail_rec *q = xcalloc(cap, sizeof(*q));
        for (size_t i = 0; i < a->fq_len; i++)
            q[i] = a->fq[(a->fq_head + i) % a->fq_cap];
        free(a->fq);
        a->fq = q;
        a->fq_cap = cap;
        a->fq_head = 0;
    }
    a->fq[(a->fq_head + a->fq_len) % a->fq_cap] = (struct fail_rec){*src, now_of(a)};
    a->fq_len++;
    srcmap_take(a->fail_src, src, 0);
    if (a->fq_len == 1)
        fail_expire(a); /* arms the timer */
}

/* An upstream review's failure (never with a token): while the upstream is
 * away every review fails, so the line is written once per cause (the
 * stable part of why) and interval, with counts (log_repeat); the subjects
 * are the client addresses the reviews were for. */
static void
log_failure(const char *what, const char *cause, const char *why, const struct src_key *src)
{
    char key[LOG_REPEAT_KEY_MAX], s[SRC_KEY_TEXT] = "-";
    snprintf(key, sizeof(key), "auth: %s failed: %s", what, cause);
    if (src)
        src_key_text(src, s, sizeof(s));
    log_repeat(LOG_WARN, key, "client addresses", s,
               "auth: %s failed: %s; answering 401 / an authorization error until the upstream "
               "answers",
               what, why);
}

/* A source past its share: logged at most once a second, with the count of
 * those left out (a flood is refused many times a second). */
static void
log_share(struct auth *a, enum review_kind kind, const struct src_key *src, bool failed)
{
    double now = now_of(a);
    if (a->last_share_log && now - a->last_share_log < 1.0) {
        a->share_suppressed++;
        return;
    }
    char s[SRC_KEY_TEXT];
    src_key_text(src, s, sizeof(s));
    if (failed)
        log_warnx("auth: %s had %u TokenReviews rejected in the last second (2 x "
                  "--max-reviews-per-source): answering 429 to its requests that need another "
                  "(%lu more since the last such line)",
                  s, fail_limit(a), a->share_suppressed);
    else
        log_warnx("auth: %s holds %u %s (--max-reviews-per-source): answering 429 to its "
                  "requests that need another (%lu more since the last such line)",
                  s, a->o.max_reviews_per_source,
                  kind == REVIEW_TOKEN ? "TokenReviews"
                                       : "SubjectAccessReviews of callers not "
                                         "authenticated",
                  a->share_suppressed);
    a->last_share_log = now;
    a->share_suppressed = 0;
}

static void
review_free(struct review *r)
{
    if (r->x)
        up_xfer_cancel(r->x);
    if (r->timer)
        event_free(r->timer);
    if (r->src_counted)
        srcmap_release(r->a->review_src[r->kind], &r->src);
    if (r->req) {
        OPENSSL_cleanse(r->req, r->req_len);
        free(r->req);
    }
    free(r->resp);
    if (r->oversize_ev)
        event_free(r->oversize_ev);
    r->magic = 0;
    free(r);
}

static int
on_review_headers(void *arg, int status, const struct up_header *h, size_t n)
{
    struct review *r = arg;
    assert(r->magic == REVIEW_MAGIC);
    r->status = status;
    return 0;
}

static ssize_t
on_review_body(void *arg, char *buf, size_t cap)
{
    struct review *r = arg;
    assert(r->magic == REVIEW_MAGIC);
    size_t n = r->req_len - r->req_off;
    if (n > cap)
        n = cap;
    memcpy(buf, r->req + r->req_off, n);
    r->req_off += n;
    return (ssize_t)n;
}

static void review_done(struct review *r, int err, const char *msg);

static void
on_oversize(evutil_socket_t fd, short what, void *arg)
{
    review_done(arg, KWC_ETOOBIG, "the response exceeds 1 MiB");
}

static int
on_review_data(void *arg, const char *p, size_t n)
{
    struct review *r = arg;
    assert(r->magic == REVIEW_MAGIC);
    if (n > AUTH_MAX_BODY - r->resp_len) {
        /* Bounded before allocation: stop the transfer and answer from a
         * deferred event, outside the upstream client's callbacks. */
        up_xfer_cancel(r->x);
        r->x = NULL;
        r->oversize_ev = event_new(r->a->base, -1, 0, on_oversize, r);
        event_active(r->oversize_ev, EV_TIMEOUT, 1);
        return 0;
    }
    if (r->resp_len + n > r->resp_cap) {
        size_t cap = r->resp_cap ? r->resp_cap : 4096;
        while (cap < r->resp_len + n)
            cap *= 2;
        r->resp = xrealloc(r->resp, cap);
        r->resp_cap = cap;
    }
    memcpy(r->resp + r->resp_len, p, n);
    r->resp_len += n;
    return 0;
}

static void
on_review_done(void *arg, int err, const char *msg)
{
    struct review *r = arg;
    assert(r->magic == REVIEW_MAGIC);
    r->x = NULL; /* the client frees it after this */
    review_done(r, err, msg);
}

/* The review's deadline: its transfer ends (a connection freed, or its
 * place in the pool's queue given up) and its waiters get a failed
 * review's answer. From the loop, outside curl. */
static void
on_review_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct review *r = arg;
    assert(r->magic == REVIEW_MAGIC);
    up_xfer_cancel(r->x);
    r->x = NULL;
    r->timed_out = true;
    r->a->st.reviews_timed_out++;
    char msg[128];
    unsigned ms = r->a->o.review_timeout_ms;
    if (ms % 1000 == 0)
        snprintf(msg, sizeof(msg), "no answer within %u s (--review-timeout)", ms / 1000);
    else
        snprintf(msg, sizeof(msg), "no answer within %u ms (--review-timeout)", ms);
    review_done(r, -ETIMEDOUT, msg);
}

static const struct up_xfer_cbs review_cbs = {.on_headers = on_review_headers,
                                              .on_data = on_review_data,
                                              .on_body = on_review_body,
                                              .on_done = on_review_done};

static struct ttlc *
cache_of(struct auth *a, enum review_kind kind)
{
    return kind == REVIEW_TOKEN ? a->tokens : a->sars;
}

/* Start the review of body (taken) under key: a fetch of its kind's cache.
 * src: the source it counts against (already taken in a->review_src; the
 * review releases it), or NULL. NULL if it could not start (logged; body
 * wiped and freed, src released). */
static struct review *
review_start(struct auth *a, enum review_kind kind, const unsigned char key[KEY_LEN], char *body,
             size_t len, bool cacheable, const struct src_key *src)
{
    struct review *r = xcalloc(1, sizeof(*r));
    r->magic = REVIEW_MAGIC;
    r->a = a;
    r->kind = kind;
    r->cacheable = cacheable;
    r->req = body;
    r->req_len = len;
    if (src) {
        r->src = *src;
        r->src_counted = true;
    }
    static const struct up_header hdrs[] = {{"Content-Type", "application/json"},
                                            {"Accept", "application/json"}};
    struct up_request req = {.method = "POST",
                             .target = kind == REVIEW_TOKEN ? TOKENREVIEW_PATH : SAR_PATH,
                             .headers = hdrs,
                             .nheaders = KWC_ARRAY_LEN(hdrs),
                             .has_body = true,
                             .body_len = (int64_t)len,
                             .pool = kind == REVIEW_TOKEN ? UP_POOL_TOKENREVIEW : UP_POOL_SAR};
    int rc = up_xfer_start(a->up, &req, &review_cbs, r, &r->x);
    if (rc != 0) {
        r->x = NULL;
        log_failure(kind == REVIEW_TOKEN ? "TokenReview" : "SubjectAccessReview", kwc_strerror(rc),
                    kwc_strerror(rc), src);
        review_free(r);
        return NULL;
    }
    r->f = ttlc_fetch_begin(cache_of(a, kind), key, KEY_LEN, r);
    if (a->o.review_timeout_ms) {
        r->timer = evtimer_new(a->base, on_review_timeout, r);
        struct timeval tv = {a->o.review_timeout_ms / 1000, (a->o.review_timeout_ms % 1000) * 1000};
        evtimer_add(r->timer, &tv);
    }
    return r;
}

static struct auth_wait *
wait_add(struct ttlc_fetch *f, auth_user_cb ucb, auth_decision_cb dcb, void *arg)
{
    struct auth_wait *w = xcalloc(1, sizeof(*w));
    w->magic = WAIT_MAGIC;
    w->ucb = ucb;
    w->dcb = dcb;
    w->arg = arg;
    ttlc_join(f, &w->tw);
    return w;
}

/* Pop the next waiter of an ended fetch (freed), or false when none is
 * left. */
static bool
wait_pop(struct ttlc_fetch *f, struct auth_wait *out)
{
    struct ttlc_wait *tw = ttlc_fetch_pop(f);
    if (!tw)
        return false;
    struct auth_wait *w = wait_of(tw);
    assert(w->magic == WAIT_MAGIC);
    *out = *w;
    w->magic = 0;
    free(w);
    return true;
}

/* The review ended (err 0: r->status and r->resp hold the answer). Cache
 * it, call every waiter back, free r. */
static void
review_done(struct review *r, int err, const char *msg)
{
    assert(r->magic == REVIEW_MAGIC);
    struct auth *a = r->a;
    /* The token leaves memory as soon as its review is over. */
    OPENSSL_cleanse(r->req, r->req_len);
    char why[256] = "";
    if (err)
        snprintf(why, sizeof(why), "%s", msg && *msg ? msg : kwc_strerror(err));
    else if (r->status != 200 && r->status != 201)
        snprintf(why, sizeof(why), "the upstream answered HTTP %d", r->status);
    /* the same for every review that fails so: the key of its log line */
    char cause[sizeof(why)];
    snprintf(cause, sizeof(cause), "%s",
             err      ? kwc_strerror(err)
             : why[0] ? why
                      : "an answer kwc cannot read");
    const struct src_key *src = r->src_counted ? &r->src : NULL;
    struct auth_wait w;
    if (r->kind == REVIEW_TOKEN) {
        struct auth_user *u = NULL;
        if (!why[0] &&
            auth_token_review_parse(r->resp ? r->resp : "", r->resp_len, &u, why, sizeof(why)) !=
                0 &&
            !why[0])
            snprintf(why, sizeof(why), "unparsable TokenReview");
        if (why[0]) {
            a->st.token_review_errors++;
            log_failure("TokenReview", cause, why, src);
        }
        int status = u ? 0 : 401;
        if (!u && !why[0] && !r->timed_out && r->src_counted && fail_limit(a))
            fail_add(a, &r->src); /* the upstream said no: the source's failure */
        /* Out of flight and cached before any waiter runs (a waiter that
         * cancels another only unlinks it). */
        struct tok_ent *e = xcalloc(1, sizeof(*e));
        e->status = status;
        e->u = u;
        if (u)
            auth_user_ref(u);
        if (r->timed_out) {
            free_tok_ent(e); /* a review that timed out says nothing of the token */
            e = NULL;
        }
        ttlc_fetch_end(r->f, e, status == 0 ? a->o.token_ttl_s : a->o.token_fail_ttl_s, now_of(a));
        while (wait_pop(r->f, &w)) {
            if (u)
                a->st.authn_token++;
            else
                a->st.authn_denied++;
            w.ucb(w.arg, status, u);
        }
        auth_user_unref(u);
    } else {
        enum auth_decision d = AUTH_ERROR;
        char *reason = NULL;
        if (!why[0] && auth_sar_parse(r->resp ? r->resp : "", r->resp_len, &d, &reason, why,
                                      sizeof(why)) != 0) {
            d = AUTH_ERROR;
            if (!why[0])
                snprintf(why, sizeof(why), "unparsable SubjectAccessReview");
        }
        struct sar_ent *e = NULL;
        double ttl = 0;
        if (d == AUTH_ERROR) {
            log_failure("SubjectAccessReview", cause, why, src);
            free(reason);
            reason = xasprintf("SubjectAccessReview failed: %s", why);
        } else if (r->cacheable) {
            e = xcalloc(1, sizeof(*e));
            e->d = d;
            e->reason = xstrdup(reason);
            ttl = d == AUTH_ALLOW ? a->o.allow_ttl_s : a->o.deny_ttl_s;
        }
        ttlc_fetch_end(r->f, e, ttl, now_of(a)); /* errors are not cached */
        while (wait_pop(r->f, &w)) {
            if (d == AUTH_ALLOW)
                a->st.authz_allowed++;
            else if (d == AUTH_DENY)
                a->st.authz_denied++;
            else
                a->st.authz_errors++;
            w.dcb(w.arg, d, reason);
        }
        free(reason);
    }
    ttlc_fetch_free(r->f);
    review_free(r);
}

/* ---- public API ---- */

int
auth_new(struct event_base *base, struct up_client *up, const struct auth_options *o,
         struct auth **out)
{
    struct auth *a = xcalloc(1, sizeof(*a));
    a->magic = AUTH_MAGIC;
    a->base = base;
    a->up = up;
    a->o = *o;
    if (a->o.max_entries == 0)
        a->o.max_entries = DEFAULT_MAX_ENTRIES;
    a->tokens = ttlc_new(a->o.max_entries, free_tok_ent);
    a->sars = ttlc_new(a->o.max_entries, free_sar_ent);
    uint64_t seed = 0;
    if (RAND_bytes((unsigned char *)&seed, sizeof(seed)) != 1)
        seed = (uint64_t)(uintptr_t)a; /* only the hash's spread */
    a->review_src[REVIEW_TOKEN] = srcmap_new(seed);
    a->review_src[REVIEW_SAR] = srcmap_new(seed ^ 0x5bd1e995u);
    a->fail_src = srcmap_new(seed ^ 0x9e3779b97f4a7c15ull);
    a->fail_ev = evtimer_new(base, on_fail_expire, a);
    *out = a;
    return 0;
}

void
auth_free(struct auth *a)
{
    if (!a)
        return;
    assert(a->magic == AUTH_MAGIC);
    for (int k = REVIEW_TOKEN; k <= REVIEW_SAR; k++) {
        struct ttlc *c = cache_of(a, (enum review_kind)k);
        struct ttlc_fetch *f;
        while ((f = ttlc_fetch_any(c))) {
            struct review *r = ttlc_fetch_ctx(f);
            struct auth_wait w;
            ttlc_fetch_end(f, NULL, 0, 0); /* no answer: nothing cached */
            while (wait_pop(f, &w))
                ;
            ttlc_fetch_free(f);
            review_free(r);
        }
    }
    ttlc_free(a->tokens);
    ttlc_free(a->sars);
    srcmap_free(a->review_src[REVIEW_TOKEN]);
    srcmap_free(a->review_src[REVIEW_SAR]);
    srcmap_free(a->fail_src);
    free(a->fq);
    event_free(a->fail_ev);
    a->magic = 0;
    free(a);
}

void
auth_stats(const struct auth *a, struct auth_stats *out)
{
    *out = a->st;
    out->review_sources =
        srcmap_sources(a->review_src[REVIEW_TOKEN]) + srcmap_sources(a->review_src[REVIEW_SAR]);
    out->failing_sources = srcmap_sources(a->fail_src);
}

struct auth_wait *
auth_authenticate(struct auth *a, struct x509_st *cert, const char *authorization,
                  const struct src_key *src, auth_user_cb cb, void *arg)
{
    assert(a->magic == AUTH_MAGIC);
    /* 1. x509: a verified certificate with a CN */
    struct auth_user *u = NULL;
    if (cert && auth_cert_user(cert, &u) == 0) {
        a->st.authn_cert++;
        cb(arg, 0, u);
        auth_user_unref(u);
        return NULL;
    }
    /* 2. bearertoken -> the caching webhook token authenticator */
    size_t tl;
    const char *tok = auth_bearer_token(authorization, &tl);
    if (tok) {
        unsigned char key[KEY_LEN];
        sha256(tok, tl, key);
        struct tok_ent *e = ttlc_get(a->tokens, key, KEY_LEN, now_of(a));
        if (e) {
            a->st.token_cache_hits++;
            if (e->status == 0)
                a->st.authn_token++;
            else
                a->st.authn_denied++;
            cb(arg, e->status, e->u);
            return NULL;
        }
        struct ttlc_fetch *f = ttlc_fetch_find(a->tokens, key, KEY_LEN);
        if (!f) {
            /* a new review: the source's failed reviews and its share (auth.h) */
            if (src && fail_limit(a)) {
                fail_expire(a);
                if (srcmap_count(a->fail_src, src) >= fail_limit(a)) {
                    a->st.token_reviews_refused_failed++;
                    log_share(a, REVIEW_TOKEN, src, true);
                    cb(arg, 429, NULL);
                    return NULL;
                }
            }
            if (src &&
                !srcmap_take(a->review_src[REVIEW_TOKEN], src, a->o.max_reviews_per_source)) {
                a->st.token_reviews_refused++;
                log_share(a, REVIEW_TOKEN, src, false);
                cb(arg, 429, NULL);
                return NULL;
            }
            size_t bl;
            char *body = auth_token_review_json(tok, tl, &bl);
            struct review *r = review_start(a, REVIEW_TOKEN, key, body, bl, true, src);
            if (!r) {
                a->st.token_review_errors++;
                a->st.authn_denied++;
                cb(arg, 401, NULL);
                return NULL;
            }
            a->st.token_reviews++;
            f = r->f;
        }
        return wait_add(f, cb, NULL, arg);
    }
    /* 3. anonymous (unionauth.NewFailOnError: only when nothing above
     * applied; a rejected token never gets here) */
    if (a->o.anonymous) {
        u = auth_anonymous_user();
        a->st.authn_anonymous++;
        cb(arg, 0, u);
        auth_user_unref(u);
        return NULL;
    }
    a->st.authn_denied++;
    cb(arg, 401, NULL);
    return NULL;
}

struct auth_wait *
auth_authorize(struct auth *a, const struct auth_user *u, const struct auth_attrs *at,
               const struct src_key *src, auth_decision_cb cb, void *arg)
{
    assert(a->magic == AUTH_MAGIC);
    /* webhook.go keys its cache by the marshalled SubjectAccessReviewSpec;
     * question_key is the same question, without the JSON */
    unsigned char key[KEY_LEN];
    question_key(u, at, key);

    struct sar_ent *e = ttlc_get(a->sars, key, KEY_LEN, now_of(a));
    if (e) {
        a->st.sar_cache_hits++;
        if (e->d == AUTH_ALLOW)
            a->st.authz_allowed++;
        else
            a->st.authz_denied++;
        cb(arg, e->d, e->reason);
        return NULL;
    }
    struct ttlc_fetch *f = ttlc_fetch_find(a->sars, key, KEY_LEN);
    if (f) {
        a->st.sar_coalesced++;
        return wait_add(f, NULL, cb, arg);
    }
    /* a new review: an unauthenticated caller's source's share (auth.h) */
    if (src && !srcmap_take(a->review_src[REVIEW_SAR], src, a->o.max_reviews_per_source)) {
        a->st.sar_refused++;
        log_share(a, REVIEW_SAR, src, false);
        cb(arg, AUTH_BUSY, "");
        return NULL;
    }
    char *body = auth_sar_json(u, at);
    struct review *r =
        review_start(a, REVIEW_SAR, key, body, strlen(body), auth_question_cacheable(at), src);
    if (!r) {
        a->st.authz_errors++;
        cb(arg, AUTH_ERROR, "SubjectAccessReview failed: the request could not be started");
        return NULL;
    }
    a->st.sar_sent++;
    return wait_add(r->f, NULL, cb, arg);
}

void
auth_cancel(struct auth_wait *w)
{
    if (!w)
        return;
    assert(w->magic == WAIT_MAGIC);
    /* The last waiter gone (see auth.h): its review's fetch is dropped, so
     * nothing is cached from it; end the transfer. */
    struct review *r = ttlc_leave(&w->tw);
    w->magic = 0;
    free(w);
    if (!r)
        return;
    assert(r->magic == REVIEW_MAGIC);
    r->a->st.reviews_cancelled++;
    review_free(r);
}
