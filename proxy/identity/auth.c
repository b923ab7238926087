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
 * The answer caches (ttlcache.c: tokens, questions) and the reviews in
 * flight, each one a fetch of its cache, are shared by every serving loop's
 * handle (authshare.c: sharded by key, each shard under its own lock). Both
 * are keyed by a SHA-256 digest
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
 * a request with a source address is counted under that source (shared:
 * authshare.c) until it ends (answered, timed out, or cancelled with its
 * last waiter); a source at max_reviews_per_source gets 429 for a token
 * that needs a new review. SubjectAccessReviews are counted likewise when
 * the caller passes a source (an unauthenticated caller: authenticated ones
 * are not shared out per address), AUTH_BUSY past the share.
 *
 * Across loops: a review belongs to the loop that sent it (its transfer,
 * timer and events are that loop's); only its fetch, under its shard's
 * lock, is seen by the others. A waiter belongs to the loop that made it
 * and is called back there: its answer is posted to that loop's mailbox
 * while the shard is still locked, so a cancel that finds the wait out of
 * its fetch knows the answer is queued and only marks it (the queued call
 * frees it). A cancel that leaves another loop's review without waiters
 * marks it dropped and posts its end to the owner (on_abort); the owner's
 * answer, if it lands first, sees the mark and leaves it to on_abort.
 *
 * Invariants: a token lives only in the caller's header and in one review's
 * request body, which is wiped when the review ends; no log line holds it.
 * Upstream response bodies are bounded (AUTH_MAX_BODY) before they are
 * stored. Nothing is freed inside the upstream client's callbacks except by
 * its own rules (on_done ends the xfer; an oversized body is cancelled and
 * answered from a deferred event). No lock is held across a caller's
 * callback or the upstream client.
 */
#include "kwc/auth.h"

#include <assert.h>
#include <errno.h>
#include <event2/event.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "authshare.h"
#include "kwc/base.h"
#include "kwc/log.h"
#include "kwc/mailbox.h"
#include "kwc/ttlcache.h"
#include "kwc/upstream.h"

#define AUTH_MAGIC 0x61757468u   /* "auth" */
#define REVIEW_MAGIC 0x72657677u /* "revw" */
#define WAIT_MAGIC 0x77616974u   /* "wait" */
#define AUTH_MAX_BODY ((size_t)1 << 20)
#define KEY_LEN AUTH_KEY_LEN

#define TOKENREVIEW_PATH "/apis/authentication.k8s.io/v1/tokenreviews"
#define SAR_PATH "/apis/authorization.k8s.io/v1/subjectaccessreviews"

/* ---- small helpers ---- */

static void
lock(struct key_shard *sh)
{
    if (pthread_mutex_lock(&sh->mu) != 0)
        abort(); /* only a broken mutex */
}

static void
unlock(struct key_shard *sh)
{
    pthread_mutex_unlock(&sh->mu);
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

/* ---- answers: the caches' values, and what waiters are told ---- */

/* Immutable once made; shared by reference between the cache and the
 * loops being told (any thread drops one). */
struct answer {
    atomic_uint refs;
    int status;           /* a TokenReview's: 0 (u) or 401 */
    struct auth_user *u;  /* a reference, or NULL */
    enum auth_decision d; /* a SubjectAccessReview's */
    char reason[];        /* "" if none */
};

static struct answer *
answer_new(int status, struct auth_user *u, enum auth_decision d, const char *reason)
{
    size_t n = reason ? strlen(reason) : 0;
    struct answer *x = xcalloc(1, sizeof(*x) + n + 1);
    atomic_init(&x->refs, 1);
    x->status = status;
    x->u = u;
    if (u)
        auth_user_ref(u);
    x->d = d;
    if (n)
        memcpy(x->reason, reason, n);
    return x;
}

static struct answer *
answer_ref(struct answer *x)
{
    atomic_fetch_add_explicit(&x->refs, 1, memory_order_relaxed);
    return x;
}

static void
answer_unref(void *p)
{
    struct answer *x = p;
    if (!x || atomic_fetch_sub_explicit(&x->refs, 1, memory_order_release) > 1)
        return;
    atomic_thread_fence(memory_order_acquire);
    auth_user_unref(x->u);
    free(x);
}

/* ---- handles, waits, reviews ---- */

struct review;

struct auth {
    uint32_t magic;
    struct auth_shared *s;
    bool owns_shared; /* auth_new's */
    struct event_base *base;
    struct up_client *up;
    struct mailbox *mb;
    struct auth_counters st; /* this loop's counts */
    EVP_MD *md;              /* SHA-256, fetched once */
    EVP_MD_CTX *mdc;
    LIST_HEAD(, review) reviews; /* sent from this loop, not freed yet */
    size_t waits;                /* made here, not answered nor cancelled */
};

/* Every request's key: with the digest fetched once and a context of the
 * loop's own, not EVP_Digest(EVP_sha256()), whose implicit fetch costs a
 * third of a cache hit and reads OpenSSL's method store under a lock every
 * thread shares. */
static void
sha256(struct auth *a, const void *p, size_t n, unsigned char out[KEY_LEN])
{
    unsigned int len = KEY_LEN;
    if (EVP_DigestInit_ex(a->mdc, a->md, NULL) != 1 || EVP_DigestUpdate(a->mdc, p, n) != 1 ||
        EVP_DigestFinal_ex(a->mdc, out, &len) != 1)
        abort(); /* only when OpenSSL cannot run SHA-256 at all */
}

/* The cache key of a question (see auth_question_bytes). */
static void
question_key(struct auth *a, const struct auth_user *u, const struct auth_attrs *at,
             unsigned char key[KEY_LEN])
{
    size_t n;
    char *b = auth_question_bytes(u, at, &n);
    sha256(a, b, n, key);
    free(b);
}

struct auth_wait {
    uint32_t magic;
    struct ttlc_wait tw; /* in its review's fetch, under sh's lock */
    struct key_shard *sh;
    struct auth *a; /* the loop it was made on, and is answered on */
    auth_user_cb ucb;
    auth_decision_cb dcb;
    void *arg;
    bool cancelled;         /* out of its fetch with its answer queued: drop it */
    struct auth_wait *next; /* in the list it is being answered from */
};

static struct auth_wait *
wait_of(struct ttlc_wait *tw)
{
    return (struct auth_wait *)(void *)((char *)tw - offsetof(struct auth_wait, tw));
}

/* Answers queued for one loop's waiters of a fetch. */
struct delivery {
    struct auth *to;
    struct answer *ans; /* a reference */
    struct auth_wait *head, **tail;
    struct delivery *next;
};

struct review {
    uint32_t magic;
    struct auth *a; /* the loop that sent it; NULL once its handle is gone */
    struct auth_shared *s;
    struct key_shard *sh;
    enum review_kind kind;
    bool cacheable;
    /* under sh's lock: */
    struct ttlc_fetch *f;    /* its fetch (ctx: this review); NULL once ended or dropped */
    bool dropped;            /* its last waiter left from another loop: on_abort is posted */
    LIST_ENTRY(review) link; /* in a->reviews */
    struct up_xfer *x;
    char *req; /* the request body (holds the token of a TokenReview) */
    size_t req_len, req_off;
    int status;
    char *resp;
    size_t resp_len, resp_cap;
    struct event *oversize_ev; /* answers an oversized response outside curl */
    struct event *timer;       /* review_timeout_ms from the start */
    bool timed_out;            /* ended by the timer: nothing is cached */
    bool src_counted;          /* counted under src (shared) */
    struct src_key src;
};

/* Another loop's call: to's mailbox (a handle that shares its caches
 * needs one). */
static void
post(struct auth *to, mailbox_fn fn, void *arg)
{
    if (!to->mb) {
        log_warnx("auth: a loop's handle has no mailbox but shares its caches with another "
                  "(auth_attach)");
        abort();
    }
    mailbox_post(to->mb, fn, arg);
}

/* Call w back with ans (unless it was cancelled) and free it. On w's loop. */
static void
answer_wait(struct auth_wait *w, const struct answer *ans)
{
    assert(w->magic == WAIT_MAGIC);
    struct auth_wait c = *w;
    w->magic = 0;
    free(w);
    if (c.cancelled)
        return; /* its handle may be gone: touch nothing of it */
    c.a->waits--;
    if (c.ucb) {
        if (ans->u)
            AUTH_COUNT(&c.a->st, authn_token);
        else
            AUTH_COUNT(&c.a->st, authn_denied);
        c.ucb(c.arg, ans->status, ans->u);
    } else {
        if (ans->d == AUTH_ALLOW)
            AUTH_COUNT(&c.a->st, authz_allowed);
        else if (ans->d == AUTH_DENY)
            AUTH_COUNT(&c.a->st, authz_denied);
        else
            AUTH_COUNT(&c.a->st, authz_errors);
        c.dcb(c.arg, ans->d, ans->reason);
    }
}

/* In turn: a callback may cancel a wait further down (marked, then
 * skipped). */
static void
answer_list(struct auth_wait *w, const struct answer *ans)
{
    while (w) {
        struct auth_wait *next = w->next;
        answer_wait(w, ans);
        w = next;
    }
}

static void
on_delivery(void *arg)
{
    struct delivery *d = arg;
    answer_list(d->head, d->ans);
    answer_unref(d->ans);
    free(d);
}

/* Drop waits without their callbacks (auth_free's rule). */
static void
drop_list(struct auth_wait *w)
{
    while (w) {
        struct auth_wait *next = w->next;
        if (!w->cancelled)
            w->a->waits--;
        w->magic = 0;
        free(w);
        w = next;
    }
}

/*
 * f's answer is in; sh locked. f leaves the flight table, val (taken;
 * NULL: none) is cached for ttl, and its waiters leave f: those of other
 * loops are posted ans now, before the lock is let go (a cancel after
 * this finds them out of f, their answer queued); self's are returned,
 * in order, to be answered once sh is unlocked.
 */
static struct auth_wait *
end_fetch(struct ttlc_fetch *f, struct answer *ans, struct answer *val, double ttl, double now,
          struct auth *self)
{
    ttlc_fetch_end(f, val, ttl, now);
    struct auth_wait *own = NULL, **tail = &own;
    struct delivery *ds = NULL;
    struct ttlc_wait *tw;
    while ((tw = ttlc_fetch_pop(f))) {
        struct auth_wait *w = wait_of(tw);
        assert(w->magic == WAIT_MAGIC);
        w->next = NULL;
        if (w->a == self) {
            *tail = w;
            tail = &w->next;
            continue;
        }
        struct delivery *d = ds;
        while (d && d->to != w->a)
            d = d->next;
        if (!d) {
            d = xcalloc(1, sizeof(*d));
            d->to = w->a;
            d->ans = answer_ref(ans);
            d->tail = &d->head;
            d->next = ds;
            ds = d;
        }
        *d->tail = w;
        d->tail = &w->next;
    }
    ttlc_fetch_free(f);
    while (ds) {
        struct delivery *next = ds->next;
        post(ds->to, on_delivery, ds);
        ds = next;
    }
    return own;
}

/* What waiters are told of a review that gave no answer. */
static struct answer *
failure_answer(enum review_kind kind, const char *why)
{
    if (kind == REVIEW_TOKEN)
        return answer_new(401, NULL, AUTH_ERROR, "");
    char *reason = xasprintf("SubjectAccessReview failed: %s", why);
    struct answer *x = answer_new(0, NULL, AUTH_ERROR, reason);
    free(reason);
    return x;
}

/* The review's transfer, events and source count let go (on its loop). */
static void
review_release(struct review *r)
{
    if (r->x)
        up_xfer_cancel(r->x);
    r->x = NULL;
    if (r->timer)
        event_free(r->timer);
    r->timer = NULL;
    if (r->oversize_ev)
        event_free(r->oversize_ev);
    r->oversize_ev = NULL;
    if (r->src_counted)
        share_src_release(r->s, r->kind, &r->src);
    r->src_counted = false;
}

/* Out of its fetch (ended or dropped). On its loop. */
static void
review_free(struct review *r)
{
    review_release(r);
    if (r->req) {
        OPENSSL_cleanse(r->req, r->req_len);
        free(r->req);
    }
    free(r->resp);
    if (r->a)
        LIST_REMOVE(r, link);
    r->magic = 0;
    free(r);
}

/* Its last waiter left from another loop (auth_cancel). On its loop, or
 * when its mailbox is freed after its handle. */
static void
on_abort(void *arg)
{
    struct review *r = arg;
    assert(r->magic == REVIEW_MAGIC);
    review_free(r);
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
    AUTH_COUNT(&r->a->st, reviews_timed_out);
    char msg[128];
    unsigned ms = r->s->o.review_timeout_ms;
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

/* A new review of kind under key, sh locked, none in flight: its fetch,
 * with the caller's wait joined (*w). src: already counted (the review
 * releases it), or NULL. Sent by review_send once sh is unlocked. */
static struct review *
review_new(struct auth *a, struct key_shard *sh, enum review_kind kind,
           const unsigned char key[KEY_LEN], bool cacheable, const struct src_key *src)
{
    struct review *r = xcalloc(1, sizeof(*r));
    r->magic = REVIEW_MAGIC;
    r->a = a;
    r->s = a->s;
    r->sh = sh;
    r->kind = kind;
    r->cacheable = cacheable;
    if (src) {
        r->src = *src;
        r->src_counted = true;
    }
    r->f = ttlc_fetch_begin(sh->c[kind], key, KEY_LEN, r);
    LIST_INSERT_HEAD(&a->reviews, r, link);
    return r;
}

static struct auth_wait *
wait_add(struct auth *a, struct key_shard *sh, struct ttlc_fetch *f, auth_user_cb ucb,
         auth_decision_cb dcb, void *arg)
{
    struct auth_wait *w = xcalloc(1, sizeof(*w));
    w->magic = WAIT_MAGIC;
    w->sh = sh;
    w->a = a;
    w->ucb = ucb;
    w->dcb = dcb;
    w->arg = arg;
    ttlc_join(f, &w->tw);
    a->waits++;
    return w;
}

/* Send r's request (body taken). 0; or the upstream client's error
 * (logged): r has ended, nothing cached, waiters other loops joined
 * meanwhile told it failed, the caller's own wait dropped (it answers at
 * once). */
static int
review_send(struct review *r, char *body, size_t len)
{
    struct auth *a = r->a;
    r->req = body;
    r->req_len = len;
    static const struct up_header hdrs[] = {{"Content-Type", "application/json"},
                                            {"Accept", "application/json"}};
    struct up_request req = {.method = "POST",
                             .target = r->kind == REVIEW_TOKEN ? TOKENREVIEW_PATH : SAR_PATH,
                             .headers = hdrs,
                             .nheaders = KWC_ARRAY_LEN(hdrs),
                             .has_body = true,
                             .body_len = (int64_t)len,
                             .pool = r->kind == REVIEW_TOKEN ? UP_POOL_TOKENREVIEW : UP_POOL_SAR};
    int rc = up_xfer_start(a->up, &req, &review_cbs, r, &r->x);
    if (rc != 0) {
        r->x = NULL;
        log_failure(r->kind == REVIEW_TOKEN ? "TokenReview" : "SubjectAccessReview",
                    kwc_strerror(rc), kwc_strerror(rc), r->src_counted ? &r->src : NULL);
        struct answer *ans = failure_answer(r->kind, "the request could not be started");
        lock(r->sh);
        struct auth_wait *own = end_fetch(r->f, ans, NULL, 0, 0, a);
        r->f = NULL;
        unlock(r->sh);
        drop_list(own);
        answer_unref(ans);
        review_free(r);
        return rc;
    }
    unsigned ms = r->s->o.review_timeout_ms;
    if (ms) {
        r->timer = evtimer_new(a->base, on_review_timeout, r);
        struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
        evtimer_add(r->timer, &tv);
    }
    return 0;
}

/* The review ended (err 0: r->status and r->resp hold the answer). Cache
 * it, call every waiter back (on their loops), free r. */
static void
review_done(struct review *r, int err, const char *msg)
{
    assert(r->magic == REVIEW_MAGIC);
    struct auth *a = r->a;
    struct auth_shared *s = r->s;
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
    struct answer *ans, *val = NULL;
    double ttl = 0;
    bool rejected = false;
    if (r->kind == REVIEW_TOKEN) {
        struct auth_user *u = NULL;
        if (!why[0] &&
            auth_token_review_parse(r->resp ? r->resp : "", r->resp_len, &u, why, sizeof(why)) !=
                0 &&
            !why[0])
            snprintf(why, sizeof(why), "unparsable TokenReview");
        ans = answer_new(u ? 0 : 401, u, AUTH_ERROR, "");
        auth_user_unref(u);
        /* the upstream said no: the source's failure */
        rejected = !u && !why[0] && !r->timed_out && src && share_fail_limit(s);
        if (!r->timed_out) { /* a review that timed out says nothing of the token */
            val = answer_ref(ans);
            ttl = u ? s->o.token_ttl_s : s->o.token_fail_ttl_s;
        }
    } else {
        enum auth_decision d = AUTH_ERROR;
        char *reason = NULL;
        if (!why[0] && auth_sar_parse(r->resp ? r->resp : "", r->resp_len, &d, &reason, why,
                                      sizeof(why)) != 0) {
            d = AUTH_ERROR;
            if (!why[0])
                snprintf(why, sizeof(why), "unparsable SubjectAccessReview");
        }
        if (d == AUTH_ERROR) {
            ans = failure_answer(REVIEW_SAR, why); /* errors are not cached */
        } else {
            ans = answer_new(0, NULL, d, reason);
            if (r->cacheable) {
                val = answer_ref(ans);
                ttl = d == AUTH_ALLOW ? s->o.allow_ttl_s : s->o.deny_ttl_s;
            }
        }
        free(reason);
    }
    /* Out of flight and cached before any waiter runs (a waiter that
     * cancels another only marks it). */
    double now = share_now(s);
    lock(r->sh);
    if (r->dropped) {
        /* no one waits any more: on_abort, queued, frees it */
        unlock(r->sh);
        review_release(r);
        answer_unref(val);
        answer_unref(ans);
        return;
    }
    struct auth_wait *own = end_fetch(r->f, ans, val, ttl, now, a);
    r->f = NULL;
    unlock(r->sh);
    if (why[0]) {
        if (r->kind == REVIEW_TOKEN)
            AUTH_COUNT(&a->st, token_review_errors);
        log_failure(r->kind == REVIEW_TOKEN ? "TokenReview" : "SubjectAccessReview", cause, why,
                    src);
    }
    if (rejected)
        share_fail_add(s, src);
    answer_list(own, ans);
    answer_unref(ans);
    review_free(r);
}

/* ---- public API ---- */

int
auth_shared_new(const struct auth_options *o, struct auth_shared **out)
{
    *out = share_new(o, answer_unref);
    return 0;
}

void
auth_shared_free(struct auth_shared *s)
{
    share_free(s);
}

int
auth_attach(struct auth_shared *s, struct event_base *base, struct up_client *up,
            struct mailbox *mb, struct auth **out)
{
    struct auth *a = xcalloc(1, sizeof(*a));
    a->magic = AUTH_MAGIC;
    a->s = s;
    a->base = base;
    a->up = up;
    a->mb = mb;
    a->md = EVP_MD_fetch(NULL, "SHA2-256", NULL);
    a->mdc = EVP_MD_CTX_new();
    if (!a->md || !a->mdc)
        abort(); /* only when OpenSSL cannot run SHA-256 at all */
    LIST_INIT(&a->reviews);
    share_register(s, &a->st);
    *out = a;
    return 0;
}

void
auth_detach(struct auth *a)
{
    if (!a)
        return;
    assert(a->magic == AUTH_MAGIC);
    struct review *r;
    while ((r = LIST_FIRST(&a->reviews))) {
        lock(r->sh);
        if (r->dropped) {
            unlock(r->sh);
            /* on_abort is queued in this loop's mailbox: it frees the rest */
            review_release(r);
            LIST_REMOVE(r, link);
            r->a = NULL;
            continue;
        }
        struct answer *ans = failure_answer(r->kind, "the loop that asked it stopped");
        struct auth_wait *own = end_fetch(r->f, ans, NULL, 0, 0, a); /* nothing cached */
        r->f = NULL;
        unlock(r->sh);
        drop_list(own);
        answer_unref(ans);
        review_free(r);
    }
    if (a->waits) {
        log_warnx("auth: a loop's handle freed with %zu authentication or authorization waits "
                  "not over (free what holds them first)",
                  a->waits);
        abort();
    }
    share_unregister(a->s, &a->st);
    EVP_MD_CTX_free(a->mdc);
    EVP_MD_free(a->md);
    a->magic = 0;
    free(a);
}

int
auth_new(struct event_base *base, struct up_client *up, const struct auth_options *o,
         struct auth **out)
{
    struct auth_shared *s;
    auth_shared_new(o, &s);
    auth_attach(s, base, up, NULL, out);
    (*out)->owns_shared = true;
    return 0;
}

void
auth_free(struct auth *a)
{
    if (!a)
        return;
    struct auth_shared *s = a->owns_shared ? a->s : NULL;
    auth_detach(a);
    auth_shared_free(s);
}

void
auth_stats(const struct auth *a, struct auth_stats *out)
{
    share_stats(a->s, out);
}

void
auth_shared_stats(struct auth_shared *s, struct auth_stats *out)
{
    share_stats(s, out);
}

/* A source refused a new review: counted, logged (rate-limited). */
static void
refused(struct auth *a, enum review_kind kind, const struct src_key *src, bool failed)
{
    if (kind == REVIEW_SAR)
        AUTH_COUNT(&a->st, sar_refused);
    else if (failed)
        AUTH_COUNT(&a->st, token_reviews_refused_failed);
    else
        AUTH_COUNT(&a->st, token_reviews_refused);
    share_log_refusal(a->s, kind, src, failed);
}

struct auth_wait *
auth_authenticate(struct auth *a, struct x509_st *cert, const char *authorization,
                  const struct src_key *src, auth_user_cb cb, void *arg)
{
    assert(a->magic == AUTH_MAGIC);
    /* 1. x509: a verified certificate with a CN */
    struct auth_user *u = NULL;
    if (cert && auth_cert_user(cert, &u) == 0) {
        AUTH_COUNT(&a->st, authn_cert);
        cb(arg, 0, u);
        auth_user_unref(u);
        return NULL;
    }
    /* 2. bearertoken -> the caching webhook token authenticator */
    size_t tl;
    const char *tok = auth_bearer_token(authorization, &tl);
    if (tok) {
        unsigned char key[KEY_LEN];
        sha256(a, tok, tl, key);
        struct key_shard *sh = share_key_shard(a->s, key);
        double now = share_now(a->s);
        lock(sh);
        struct answer *e = ttlc_get(sh->c[REVIEW_TOKEN], key, KEY_LEN, now);
        if (e) {
            answer_ref(e);
            unlock(sh);
            AUTH_COUNT(&a->st, token_cache_hits);
            if (e->status == 0)
                AUTH_COUNT(&a->st, authn_token);
            else
                AUTH_COUNT(&a->st, authn_denied);
            cb(arg, e->status, e->u);
            answer_unref(e);
            return NULL;
        }
        struct ttlc_fetch *f = ttlc_fetch_find(sh->c[REVIEW_TOKEN], key, KEY_LEN);
        if (f) {
            struct auth_wait *w = wait_add(a, sh, f, cb, NULL, arg);
            unlock(sh);
            return w;
        }
        /* a new review: the source's failed reviews and its share (auth.h) */
        bool failed;
        if (!share_src_take(a->s, REVIEW_TOKEN, src, &failed)) {
            unlock(sh);
            refused(a, REVIEW_TOKEN, src, failed);
            cb(arg, 429, NULL);
            return NULL;
        }
        struct review *r = review_new(a, sh, REVIEW_TOKEN, key, true, src);
        struct auth_wait *w = wait_add(a, sh, r->f, cb, NULL, arg);
        unlock(sh);
        size_t bl;
        char *body = auth_token_review_json(tok, tl, &bl);
        if (review_send(r, body, bl) != 0) {
            AUTH_COUNT(&a->st, token_review_errors);
            AUTH_COUNT(&a->st, authn_denied);
            cb(arg, 401, NULL);
            return NULL;
        }
        AUTH_COUNT(&a->st, token_reviews);
        return w;
    }
    /* 3. anonymous (unionauth.NewFailOnError: only when nothing above
     * applied; a rejected token never gets here) */
    if (a->s->o.anonymous) {
        u = auth_anonymous_user();
        AUTH_COUNT(&a->st, authn_anonymous);
        cb(arg, 0, u);
        auth_user_unref(u);
        return NULL;
    }
    AUTH_COUNT(&a->st, authn_denied);
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
    question_key(a, u, at, key);
    struct key_shard *sh = share_key_shard(a->s, key);
    double now = share_now(a->s);
    lock(sh);
    struct answer *e = ttlc_get(sh->c[REVIEW_SAR], key, KEY_LEN, now);
    if (e) {
        answer_ref(e);
        unlock(sh);
        AUTH_COUNT(&a->st, sar_cache_hits);
        if (e->d == AUTH_ALLOW)
            AUTH_COUNT(&a->st, authz_allowed);
        else
            AUTH_COUNT(&a->st, authz_denied);
        cb(arg, e->d, e->reason);
        answer_unref(e);
        return NULL;
    }
    struct ttlc_fetch *f = ttlc_fetch_find(sh->c[REVIEW_SAR], key, KEY_LEN);
    if (f) {
        struct auth_wait *w = wait_add(a, sh, f, NULL, cb, arg);
        unlock(sh);
        AUTH_COUNT(&a->st, sar_coalesced);
        return w;
    }
    /* a new review: an unauthenticated caller's source's share (auth.h) */
    bool failed;
    if (!share_src_take(a->s, REVIEW_SAR, src, &failed)) {
        unlock(sh);
        refused(a, REVIEW_SAR, src, false);
        cb(arg, AUTH_BUSY, "");
        return NULL;
    }
    struct review *r = review_new(a, sh, REVIEW_SAR, key, auth_question_cacheable(at), src);
    struct auth_wait *w = wait_add(a, sh, r->f, NULL, cb, arg);
    unlock(sh);
    char *body = auth_sar_json(u, at);
    if (review_send(r, body, strlen(body)) != 0) {
        AUTH_COUNT(&a->st, authz_errors);
        cb(arg, AUTH_ERROR, "SubjectAccessReview failed: the request could not be started");
        return NULL;
    }
    AUTH_COUNT(&a->st, sar_sent);
    return w;
}

void
auth_cancel(struct auth_wait *w)
{
    if (!w)
        return;
    assert(w->magic == WAIT_MAGIC);
    struct auth *a = w->a;
    struct key_shard *sh = w->sh;
    lock(sh);
    if (!w->tw.fetch) {
        /* its review ended: the answer is queued for this loop, which
         * drops it (and frees w) */
        unlock(sh);
        w->cancelled = true;
        a->waits--;
        return;
    }
    /* The last waiter gone (see auth.h): its review's fetch is dropped, so
     * nothing is cached from it; end the transfer, on its own loop. */
    struct review *r = ttlc_leave(&w->tw);
    bool mine = false;
    if (r) {
        assert(r->magic == REVIEW_MAGIC);
        r->f = NULL;
        mine = r->a == a;
        if (!mine) {
            r->dropped = true;
            post(r->a, on_abort, r);
        }
    }
    unlock(sh);
    a->waits--;
    w->magic = 0;
    free(w);
    if (!r)
        return;
    AUTH_COUNT(&a->st, reviews_cancelled);
    if (mine)
        review_free(r);
}
