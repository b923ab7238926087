/*
 * auth_loops_test.c — proxy/identity/auth.c across serving loops: one
 * shared cache (auth_shared_new), two loops on two threads, each with its
 * own event_base, upstream client, mailbox and handle (auth_attach), as
 * app.c runs them; the fake upstream (authfx.h) on a third thread.
 *
 * What kube-apiserver sees must not depend on how many loops kwc runs: 50
 * concurrent requests with one token over both loops make one TokenReview
 * (one SubjectAccessReview for one question); an answer one loop got
 * serves the other from the cache; a wait cancelled on one loop while the
 * answer lands on the other is never called back; the per-source bounds
 * hold for the process; a loop's handle freed while its review is in
 * flight leaves nothing behind. Built with -fsanitize=thread too (make
 * SAN=thread BUILD=build/tsan build/tests/unit/auth_loops_test).
 *
 * Every call into auth runs on the loop that owns the handle: the test
 * posts it there (on_thread: run and wait, bounded) and reads what the
 * callbacks recorded the same way. Conditions are polled with a deadline;
 * no test depends on a duration. The TTLs and the rejection window run on
 * the test's clock.
 */
#include "kwc/auth.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "authfx.h"
#include "kwc/base.h"
#include "kwc/kubeconfig.h"
#include "kwc/mailbox.h"
#include "kwc/upstream.h"
#include "tap.h"

#define NLOOPS 2
#define DEADLINE_S 30

/* ---- threads with a loop, and calls run on them ---- */

struct thr {
    pthread_t th;
    struct event_base *base;
    struct mailbox *mb;
    bool running;
};

static void *
thr_main(void *arg)
{
    struct thr *t = arg;
    event_base_loop(t->base, EVLOOP_NO_EXIT_ON_EMPTY);
    return NULL;
}

static void
thr_init(struct thr *t)
{
    memset(t, 0, sizeof(*t));
    t->base = event_base_new();
    t->mb = mailbox_new(t->base);
}

static void
thr_start(struct thr *t)
{
    t->running = pthread_create(&t->th, NULL, thr_main, t) == 0;
}

static void
on_stop(void *arg)
{
    event_base_loopbreak(arg);
}

/* The thread ends; what it owned is the main thread's from here. */
static void
thr_stop(struct thr *t)
{
    if (!t->running)
        return;
    mailbox_post(t->mb, on_stop, t->base);
    pthread_join(t->th, NULL);
    t->running = false;
}

static void
thr_fini(struct thr *t)
{
    mailbox_free(t->mb);
    event_base_free(t->base);
}

static struct timespec
deadline(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += DEADLINE_S;
    return ts;
}

struct sync {
    void (*fn)(void *);
    void *arg;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
};

static void
on_sync(void *p)
{
    struct sync *s = p;
    s->fn(s->arg);
    pthread_mutex_lock(&s->mu);
    s->done = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* fn(arg) on t's thread (on this one once t stopped), waited for. */
static void
on_thread(struct thr *t, void (*fn)(void *), void *arg)
{
    if (!t->running) {
        fn(arg);
        return;
    }
    struct sync s = {.fn = fn, .arg = arg};
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    mailbox_post(t->mb, on_sync, &s);
    struct timespec dl = deadline();
    pthread_mutex_lock(&s.mu);
    while (!s.done)
        if (pthread_cond_timedwait(&s.cv, &s.mu, &dl) != 0) {
            printf("# a loop did not run a call within %d s: the test is broken\n", DEADLINE_S);
            abort(); /* the call still refers to s */
        }
    pthread_mutex_unlock(&s.mu);
    pthread_mutex_destroy(&s.mu);
    pthread_cond_destroy(&s.cv);
}

/* A gate: a call that holds its loop until the test opens it, then runs
 * then(arg) there (the calls posted meanwhile wait behind it). */
struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool entered, open;
    void (*then)(void *);
    void *arg;
};

static void
on_gate(void *p)
{
    struct gate *g = p;
    struct timespec dl = deadline();
    pthread_mutex_lock(&g->mu);
    g->entered = true;
    pthread_cond_broadcast(&g->cv);
    while (!g->open)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) != 0)
            abort();
    pthread_mutex_unlock(&g->mu);
    if (g->then)
        g->then(g->arg);
}

static void
gate_close(struct gate *g, struct thr *t, void (*then)(void *), void *arg)
{
    memset(g, 0, sizeof(*g));
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->then = then;
    g->arg = arg;
    mailbox_post(t->mb, on_gate, g);
    struct timespec dl = deadline();
    pthread_mutex_lock(&g->mu);
    while (!g->entered)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) != 0)
            abort();
    pthread_mutex_unlock(&g->mu);
}

static void
gate_open(struct gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* ---- the world: the fake upstream, the shared cache, the loops ---- */

struct loop {
    struct thr t;
    struct up_client *up;
    struct auth *a;
};

struct world {
    struct thr ft; /* the fake upstream's */
    struct fake f;
    struct kcfg *k;
    struct auth_shared *s;
    struct loop l[NLOOPS];
};

static _Atomic double test_now = 1000;

static double
test_clock(void *arg)
{
    return atomic_load(&test_now);
}

static const struct auth_options default_opts = {.token_ttl_s = 120,
                                                 .token_fail_ttl_s = 10,
                                                 .allow_ttl_s = 300,
                                                 .deny_ttl_s = 30,
                                                 .max_entries = 1000,
                                                 .clock = test_clock};

static void
world_init(struct world *w, const struct auth_options *o)
{
    memset(w, 0, sizeof(*w));
    thr_init(&w->ft);
    fake_init(&w->f, w->ft.base);
    thr_start(&w->ft);
    w->k = xcalloc(1, sizeof(*w->k));
    w->k->server = xasprintf("http://127.0.0.1:%d", w->f.port);
    auth_shared_new(o ? o : &default_opts, &w->s);
    struct up_options uo = {
        .connect_timeout_ms = 5000, .header_timeout_ms = 20000, .max_idle_conns = 8};
    for (int i = 0; i < NLOOPS; i++) {
        struct loop *l = &w->l[i];
        thr_init(&l->t);
        char err[256];
        if (up_client_new(l->t.base, w->k, &uo, &l->up, err, sizeof(err)) != 0)
            printf("# up_client_new: %s\n", err);
        auth_attach(w->s, l->t.base, l->up, l->t.mb, &l->a);
        thr_start(&l->t);
    }
}

/* The order app.c frees loops in: every thread stopped, then each loop's
 * handle before its upstream client and event_base. */
static void
world_fini(struct world *w)
{
    for (int i = 0; i < NLOOPS; i++)
        thr_stop(&w->l[i].t);
    for (int i = 0; i < NLOOPS; i++) {
        auth_detach(w->l[i].a);
        up_client_free(w->l[i].up);
        thr_fini(&w->l[i].t);
    }
    auth_shared_free(w->s);
    thr_stop(&w->ft);
    fake_fini(&w->f);
    thr_fini(&w->ft);
    kcfg_free(w->k);
}

/* ---- the fake, from the test's thread ---- */

struct fake_op {
    struct fake *f;
    int hold;         /* 1: hold answers, 0: release them, -1: leave */
    int tokens, sars; /* read back */
    int nheld;
};

static void
on_fake_op(void *p)
{
    struct fake_op *op = p;
    if (op->hold == 1)
        op->f->hold = true;
    else if (op->hold == 0)
        fake_release(op->f);
    op->tokens = op->f->token_reviews;
    op->sars = op->f->sars;
    op->nheld = op->f->nheld;
}

static struct fake_op
fake_op(struct world *w, int hold)
{
    struct fake_op op = {.f = &w->f, .hold = hold};
    on_thread(&w->ft, on_fake_op, &op);
    return op;
}

/* ---- requests made on a loop ---- */

/* One request's record, written on its loop. */
struct req {
    struct loop *l;
    const char *token;
    const struct src_key *src;
    struct auth_attrs at;
    const struct auth_user *u;
    struct auth_wait *w;
    bool pending; /* a wait was returned */
    int calls, status;
    enum auth_decision d;
    char name[32];
    bool wrong_thread; /* called back on another thread than its loop's */
    bool cancelled;    /* its wait was cancelled while it waited */
    int late;          /* callbacks after that cancel */
};

static void
on_user(void *arg, int status, struct auth_user *u)
{
    struct req *r = arg;
    r->calls++;
    r->late += r->cancelled;
    r->status = status;
    snprintf(r->name, sizeof(r->name), "%s", u ? u->name : "");
    r->wrong_thread |= !pthread_equal(pthread_self(), r->l->t.th);
    r->w = NULL;
}

static void
on_decision(void *arg, enum auth_decision d, const char *reason)
{
    struct req *r = arg;
    r->calls++;
    r->late += r->cancelled;
    r->d = d;
    r->wrong_thread |= !pthread_equal(pthread_self(), r->l->t.th);
    r->w = NULL;
}

struct batch {
    struct req *r;
    int n;
};

static void
on_authenticate(void *p)
{
    struct batch *b = p;
    for (int i = 0; i < b->n; i++) {
        struct req *r = &b->r[i];
        r->w = auth_authenticate(r->l->a, NULL, r->token, r->src, on_user, r);
        r->pending = r->w != NULL;
    }
}

static void
on_authorize(void *p)
{
    struct batch *b = p;
    for (int i = 0; i < b->n; i++) {
        struct req *r = &b->r[i];
        r->w = auth_authorize(r->l->a, r->u, &r->at, r->src, on_decision, r);
        r->pending = r->w != NULL;
    }
}

static void
on_cancel(void *p)
{
    struct batch *b = p;
    for (int i = 0; i < b->n; i++) {
        b->r[i].cancelled |= b->r[i].w != NULL; /* (NULL: answered already) */
        auth_cancel(b->r[i].w);
        b->r[i].w = NULL;
    }
}

static void
authenticate(struct req *r, int n)
{
    struct batch b = {r, n};
    on_thread(&r->l->t, on_authenticate, &b);
}

static void
authorize(struct req *r, int n)
{
    struct batch b = {r, n};
    on_thread(&r->l->t, on_authorize, &b);
}

static void
cancel(struct req *r)
{
    struct batch b = {r, 1};
    on_thread(&r->l->t, on_cancel, &b);
}

/* The calls the requests r[0..n) (all on one loop) have had (late: only
 * those after a cancel of a live wait). */
struct count {
    struct req *r;
    int n, calls;
    bool late;
};

static void
on_count(void *p)
{
    struct count *c = p;
    c->calls = 0;
    for (int i = 0; i < c->n; i++)
        c->calls += c->late ? c->r[i].late : c->r[i].calls;
}

static int
calls_of(struct req *r, int n)
{
    struct count c = {r, n, 0, false};
    on_thread(&r->l->t, on_count, &c);
    return c.calls;
}

static void
nap(void)
{
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
}

/* Poll cond (bounded by DEADLINE_S; a failure prints what). */
static bool
poll_until(bool (*cond)(void *), void *arg, const char *what)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (!cond(arg)) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > DEADLINE_S) {
            printf("# timed out waiting for %s\n", what);
            return false;
        }
        nap();
    }
    return true;
}

struct want_calls {
    struct req *r;
    int n, want;
};

static bool
has_calls(void *p)
{
    struct want_calls *c = p;
    return calls_of(c->r, c->n) >= c->want;
}

/* Until the requests of r[0..n) have had want calls in all. */
static bool
wait_calls(struct req *r, int n, int want)
{
    struct want_calls c = {r, n, want};
    return poll_until(has_calls, &c, "callbacks");
}

struct want_fake {
    struct world *w;
    int tokens, sars;
};

static bool
has_reviews(void *p)
{
    struct want_fake *c = p;
    struct fake_op op = fake_op(c->w, -1);
    return op.tokens >= c->tokens && op.sars >= c->sars;
}

/* Until the fake has had these many reviews. */
static bool
wait_fake(struct world *w, int tokens, int sars)
{
    struct want_fake c = {w, tokens, sars};
    return poll_until(has_reviews, &c, "the fake's reviews");
}

/* Transfers in flight on a loop's upstream client. */
struct active {
    struct loop *l;
    uint64_t n;
};

static void
on_active(void *p)
{
    struct active *a = p;
    struct up_stats us;
    up_client_stats(a->l->up, &us);
    a->n = us.active;
}

static bool
is_idle(void *p)
{
    struct active a = {p, 0};
    on_thread(&a.l->t, on_active, &a);
    return a.n == 0;
}

/* Until l's upstream client has no transfer left. */
static bool
wait_idle(struct loop *l)
{
    return poll_until(is_idle, l, "a loop's transfers to end");
}

static struct auth_stats
stats(struct world *w)
{
    struct auth_stats st;
    auth_shared_stats(w->s, &st); /* from the test's thread, while the loops run */
    return st;
}

static void
fill(struct req *r, int n, struct loop *l, const char *token, const struct src_key *src)
{
    for (int i = 0; i < n; i++)
        r[i] = (struct req){.l = l, .token = token, .src = src};
}

/* token asked on loop 0 (into *a), then on loop 1 (into *b), the fake
 * holding its answer: both wait for one review. */
static bool
ask_both(struct world *w, const char *token, struct req *a, struct req *b)
{
    fake_op(w, 1);
    fill(a, 1, &w->l[0], token, NULL);
    fill(b, 1, &w->l[1], token, NULL);
    authenticate(a, 1);
    authenticate(b, 1);
    return a->pending && b->pending;
}

static const struct auth_attrs pods_get = {.resource_request = true,
                                           .verb = "get",
                                           .version = "v1",
                                           .resource = "pods",
                                           .namespace_ = "default",
                                           .name = "p"};

static struct auth_user *
user_alice(void)
{
    const char body[] = "{\"status\":{\"authenticated\":true,\"user\":{\"username\":\"alice\"}}}";
    struct auth_user *u = NULL;
    char err[128];
    auth_token_review_parse(body, sizeof(body) - 1, &u, err, sizeof(err));
    return u;
}

static void
fill_q(struct req *r, int n, struct loop *l, const struct auth_user *u, const struct auth_attrs *at,
       const struct src_key *src)
{
    for (int i = 0; i < n; i++)
        r[i] = (struct req){.l = l, .u = u, .at = *at, .src = src};
}

/* ---- the tests ---- */

#define HALF 25

/* 50 concurrent requests, 25 on each loop, for one token: one TokenReview,
 * every request answered on its own loop; then 50 for one question: one
 * SubjectAccessReview. */
static void
test_coalesced_across_loops(void)
{
    struct world w;
    world_init(&w, NULL);
    fake_op(&w, 1);
    static struct req r[NLOOPS][HALF];
    for (int i = 0; i < NLOOPS; i++) {
        fill(r[i], HALF, &w.l[i], "Bearer good-shared", NULL);
        authenticate(r[i], HALF);
    }
    int pending = 0;
    for (int i = 0; i < NLOOPS; i++)
        for (int j = 0; j < HALF; j++)
            pending += r[i][j].pending;
    is_int(pending, 2 * HALF, "50 waits, none answered yet");
    ok(wait_fake(&w, 1, 0), "the upstream is asked");
    struct auth_stats st = stats(&w);
    is_int(st.token_reviews, 1, "one TokenReview sent for both loops");
    fake_op(&w, 0);
    for (int i = 0; i < NLOOPS; i++)
        ok(wait_calls(r[i], HALF, HALF), "every request of the loop answered");
    int good = 0, wrong = 0, calls = 0;
    for (int i = 0; i < NLOOPS; i++)
        for (int j = 0; j < HALF; j++) {
            calls += r[i][j].calls;
            good += r[i][j].status == 0 && strcmp(r[i][j].name, "alice") == 0;
            wrong += r[i][j].wrong_thread;
        }
    is_int(calls, 2 * HALF, "each called back once");
    is_int(good, 2 * HALF, "each as alice");
    is_int(wrong, 0, "each on its own loop's thread");
    is_int(fake_op(&w, -1).tokens, 1, "the upstream saw one TokenReview");

    struct auth_user *u = user_alice();
    static struct req q[NLOOPS][HALF];
    fake_op(&w, 1);
    for (int i = 0; i < NLOOPS; i++) {
        fill_q(q[i], HALF, &w.l[i], u, &pods_get, NULL);
        authorize(q[i], HALF);
    }
    ok(wait_fake(&w, 1, 1), "the question is asked");
    fake_op(&w, 0);
    int allowed = 0;
    wrong = 0;
    for (int i = 0; i < NLOOPS; i++) {
        ok(wait_calls(q[i], HALF, HALF), "every question of the loop answered");
        for (int j = 0; j < HALF; j++) {
            allowed += q[i][j].calls == 1 && q[i][j].d == AUTH_ALLOW;
            wrong += q[i][j].wrong_thread;
        }
    }
    is_int(allowed, 2 * HALF, "each allowed once");
    is_int(wrong, 0, "each on its own loop's thread");
    is_int(fake_op(&w, -1).sars, 1, "the upstream saw one SubjectAccessReview");
    st = stats(&w);
    is_int(st.sar_sent, 1, "stats: one sent");
    is_int(st.sar_coalesced, 2 * HALF - 1, "stats: the other 49 joined it");
    is_int(st.authn_token, 2 * HALF, "stats: summed over the loops");
    is_int(st.authz_allowed, 2 * HALF, "stats: allowed, summed");
    auth_user_unref(u);
    world_fini(&w);
}

/* An answer one loop got serves the other from the cache, at once. */
static void
test_hit_on_other_loop(void)
{
    struct world w;
    world_init(&w, NULL);
    struct req a = {.l = &w.l[0], .token = "Bearer good-hit"};
    authenticate(&a, 1);
    ok(a.pending && wait_calls(&a, 1, 1), "loop A: reviewed");
    struct req b = {.l = &w.l[1], .token = "Bearer good-hit"};
    authenticate(&b, 1);
    ok(!b.pending && b.calls == 1 && b.status == 0, "loop B: answered at once");
    is_str(b.name, "alice", "from A's answer");
    ok(!b.wrong_thread, "on B's thread");

    struct auth_user *u = user_alice();
    struct req qa, qb;
    fill_q(&qa, 1, &w.l[0], u, &pods_get, NULL);
    fill_q(&qb, 1, &w.l[1], u, &pods_get, NULL);
    authorize(&qa, 1);
    ok(qa.pending && wait_calls(&qa, 1, 1), "loop A: asked");
    authorize(&qb, 1);
    ok(!qb.pending && qb.calls == 1 && qb.d == AUTH_ALLOW, "loop B: allowed at once");
    struct fake_op op = fake_op(&w, -1);
    ok(op.tokens == 1 && op.sars == 1, "loop B sent nothing");
    struct auth_stats st = stats(&w);
    ok(st.token_cache_hits == 1 && st.sar_cache_hits == 1, "stats: B's hits");
    auth_user_unref(u);
    world_fini(&w);
}

static void
cancel_req(void *p)
{
    struct req *r = p;
    auth_cancel(r->w);
    r->w = NULL;
}

static void
break_loop(void *p)
{
    struct req *r = p;
    cancel_req(r);
    event_base_loopbreak(r->l->t.base);
}

/* A wait cancelled on one loop while the answer lands on the other. */
static void
test_cancel_while_answered(void)
{
    struct world w;
    world_init(&w, NULL);
    struct loop *A = &w.l[0], *B = &w.l[1];

    /* 1. the answer is already queued for B when B cancels: never called */
    struct req a1, b1;
    ok(ask_both(&w, "Bearer good-c1", &a1, &b1), "A asks, B joins");
    struct gate g;
    gate_close(&g, &B->t, cancel_req, &b1); /* B holds, then cancels */
    fake_op(&w, 0);
    ok(wait_calls(&a1, 1, 1), "A answered");
    ok(mailbox_pending(B->t.mb) >= 1, "B's answer is queued behind the gate");
    gate_open(&g);
    is_int(calls_of(&b1, 1), 0, "B cancelled after its answer was queued: no callback");
    is_int(stats(&w).reviews_cancelled, 0, "the review was answered, not cancelled");

    /* 2. B's cancel leaves A's review without waiters: A ends it */
    struct req a2, b2;
    ok(ask_both(&w, "Bearer good-c2", &a2, &b2), "A asks, B joins");
    ok(wait_fake(&w, 2, 0), "asked");
    cancel(&a2);
    is_int(stats(&w).reviews_cancelled, 0, "A's wait left, B still waits");
    cancel(&b2);
    is_int(stats(&w).reviews_cancelled, 1, "B's was the last: cancelled");
    ok(wait_idle(A), "A's transfer ended");
    fake_op(&w, 0);
    struct req b2b = {.l = B, .token = "Bearer good-c2"};
    authenticate(&b2b, 1);
    ok(b2b.pending, "nothing was cached from it");
    ok(wait_calls(&b2b, 1, 1) && b2b.status == 0, "asked again, answered");
    is_int(a2.calls + b2.calls, 0, "no callback for the cancelled waits");

    /* 3. the answer lands on A while B drops the review: either order */
    int lost = 0;
    for (int k = 0; k < 20; k++) {
        char tok[32];
        snprintf(tok, sizeof(tok), "Bearer good-r%d", k);
        struct req a3, b3;
        ok(ask_both(&w, tok, &a3, &b3), "A asks, B joins");
        cancel(&a3);
        struct gate ga;
        gate_close(&ga, &A->t, NULL, NULL); /* A holds */
        fake_op(&w, 0);                     /* its answer is on the way to A */
        cancel(&b3);                        /* B drops it: A's end queued */
        gate_open(&ga);
        ok(wait_idle(A), "A's transfer ended");
        lost += calls_of(&a3, 1) + calls_of(&b3, 1);
    }
    is_int(lost, 0, "20 races of an answer and a cancel: no callback for a cancelled wait");

    /* 4. no gates: B cancels right after joining, A's answers land as they come */
    static struct req a4[50], b4[50];
    char toks[50][32];
    for (int k = 0; k < 50; k++) {
        snprintf(toks[k], sizeof(toks[k]), "Bearer good-s%d", k);
        fill(&a4[k], 1, A, toks[k], NULL);
        fill(&b4[k], 1, B, toks[k], NULL);
        authenticate(&a4[k], 1);
        struct batch bb = {&b4[k], 1};
        mailbox_post(B->t.mb, on_authenticate, &bb);
        mailbox_post(B->t.mb, on_cancel, &bb);
        on_thread(&B->t, on_count, &(struct count){&b4[k], 1, 0, false}); /* both ran */
    }
    ok(wait_calls(a4, 50, 50), "A's 50 answered");
    /* an answer that reached B before its cancel ran is a callback before
     * the cancel (the wait ended then; the cancel finds none): only one
     * after a cancel of a live wait is wrong */
    struct count late = {b4, 50, 0, true};
    on_thread(&B->t, on_count, &late);
    is_int(late.calls, 0, "B's cancelled waits: no callback after the cancel");
    world_fini(&w);
}

/* max_reviews_per_source and the rejections a second bound a source for
 * the process, whichever loops its requests are on. */
static void
test_source_limits_across_loops(void)
{
    struct auth_options o = default_opts;
    o.max_reviews_per_source = 2; /* and 4 rejections a second */
    o.anonymous = true;
    struct world w;
    world_init(&w, &o);
    struct loop *A = &w.l[0], *B = &w.l[1];
    struct src_key sa = src4(2), sb = src4(3), sc = src4(4);

    fake_op(&w, 1);
    struct req r[6];
    fill(&r[0], 1, A, "Bearer good-a1", &sa);
    fill(&r[1], 1, B, "Bearer good-a2", &sa);
    fill(&r[2], 1, A, "Bearer good-a3", &sa);
    fill(&r[3], 1, B, "Bearer good-a4", &sa);
    fill(&r[4], 1, B, "Bearer good-a1", &sa);
    fill(&r[5], 1, B, "Bearer good-b1", &sb);
    for (int i = 0; i < 6; i++)
        authenticate(&r[i], 1);
    ok(r[0].pending && r[1].pending, "a: one review on each loop");
    ok(!r[2].pending && r[2].status == 429, "a: a third on A: 429 at once");
    ok(!r[3].pending && r[3].status == 429, "a: a fourth on B: 429 at once");
    ok(r[4].pending, "a: a token under review joins it from the other loop");
    ok(r[5].pending, "b: not held back by a");
    struct auth_stats st = stats(&w);
    is_int(st.token_reviews_refused, 2, "stats: two refused");
    is_int(st.review_sources, 2, "stats: two sources counted, once each");
    fake_op(&w, 0);
    ok(wait_calls(&r[0], 1, 1) && wait_calls(&r[1], 1, 1) && wait_calls(&r[4], 1, 1) &&
           wait_calls(&r[5], 1, 1),
       "the reviews answered");
    is_int(stats(&w).review_sources, 0, "over: no source counted");

    /* rejections: two on each loop, then a's new tokens are refused on both */
    struct req bad[4];
    char toks[4][32];
    for (int i = 0; i < 4; i++) {
        snprintf(toks[i], sizeof(toks[i]), "Bearer bogus-%d", i);
        fill(&bad[i], 1, &w.l[i % 2], toks[i], &sa);
        authenticate(&bad[i], 1);
        ok(wait_calls(&bad[i], 1, 1) && bad[i].status == 401, "rejected: 401");
    }
    struct req x[3];
    fill(&x[0], 1, A, "Bearer bogus-x", &sa);
    fill(&x[1], 1, B, "Bearer bogus-y", &sa);
    fill(&x[2], 1, B, "Bearer good-z", &sb);
    for (int i = 0; i < 3; i++)
        authenticate(&x[i], 1);
    ok(!x[0].pending && x[0].status == 429, "a, on A: 429 after 4 rejections in the second");
    ok(!x[1].pending && x[1].status == 429, "a, on B: the same");
    ok(x[2].pending, "b: not held back");
    ok(wait_calls(&x[2], 1, 1), "b: answered");
    st = stats(&w);
    is_int(st.token_reviews_refused_failed, 2, "stats: two refused for a's rejections");
    is_int(st.failing_sources, 1, "stats: one failing source");
    atomic_store(&test_now, atomic_load(&test_now) + 1.0);
    struct req y = {.l = B, .token = "Bearer good-y", .src = &sa};
    authenticate(&y, 1);
    ok(y.pending && wait_calls(&y, 1, 1), "a: the second over, reviewed again");

    /* SubjectAccessReviews of callers not authenticated */
    struct auth_user *anon = auth_anonymous_user();
    static const char *const names[] = {"p0", "p1", "p2", "p3"};
    struct req q[4];
    fake_op(&w, 1);
    for (int i = 0; i < 4; i++) {
        struct auth_attrs at = pods_get;
        at.name = names[i];
        fill_q(&q[i], 1, &w.l[i % 2], anon, &at, &sc);
        authorize(&q[i], 1);
    }
    ok(q[0].pending && q[1].pending, "c: a question on each loop");
    ok(!q[2].pending && q[2].d == AUTH_BUSY, "c: a third on A: AUTH_BUSY");
    ok(!q[3].pending && q[3].d == AUTH_BUSY, "c: a fourth on B: AUTH_BUSY");
    is_int(stats(&w).sar_refused, 2, "stats: two refused");
    fake_op(&w, 0);
    ok(wait_calls(&q[0], 1, 1) && wait_calls(&q[1], 1, 1), "answered");
    auth_user_unref(anon);
    world_fini(&w);
}

/* A loop's handle freed while a review it sent is in flight, in app.c's
 * order (every thread stopped first): the other loop's waiter is told the
 * review failed, on its loop's mailbox; a review another loop dropped
 * whose end is still queued in the freed loop's mailbox is freed with it. */
static void
test_detach_in_flight(void)
{
    struct world w;
    world_init(&w, NULL);
    struct loop *A = &w.l[0], *B = &w.l[1];
    struct req a, b;
    ok(ask_both(&w, "Bearer good-d1", &a, &b), "A asks, B joins");
    ok(wait_fake(&w, 1, 0), "asked");
    thr_stop(&A->t);
    thr_stop(&B->t);
    cancel(&a); /* A's front would, freed first (on this thread now) */
    auth_detach(A->a);
    A->a = NULL;
    ok(mailbox_pending(B->t.mb) == 1, "B's answer is queued");
    mailbox_run(B->t.mb);
    ok(b.calls == 1 && b.status == 401, "B's waiter: a failed review's 401");
    struct auth_stats st = stats(&w);
    is_int(st.token_reviews, 1, "stats: A's counts kept after it left");
    world_fini(&w);

    /* B drops A's review; A stops before its end runs */
    world_init(&w, NULL);
    A = &w.l[0];
    B = &w.l[1];
    struct req a2, b2;
    ok(ask_both(&w, "Bearer good-d2", &a2, &b2), "A asks, B joins");
    ok(wait_fake(&w, 1, 0), "asked");
    cancel(&a2);
    struct gate g;
    gate_close(&g, &A->t, break_loop, &(struct req){.l = A}); /* A stops after the gate */
    cancel(&b2); /* the last waiter: A's end of it queued behind the gate */
    ok(mailbox_pending(A->t.mb) >= 1, "A's end of the review is queued");
    gate_open(&g);
    pthread_join(A->t.th, NULL);
    A->t.running = false;
    ok(mailbox_pending(A->t.mb) >= 1, "still queued when A stopped");
    is_int(stats(&w).reviews_cancelled, 1, "stats: cancelled");
    world_fini(&w); /* A's handle first, then its mailbox runs the end: nothing leaks */
}

static void
on_guard(evutil_socket_t fd, short what, void *arg)
{
    *(bool *)arg = true;
}

/* The answer lands on the loop that sent the review after another loop's
 * cancel dropped it and before the end that cancel posted runs: nothing is
 * cached, nothing called, and the end frees the review. The order is made
 * by hand: A's handle takes its calls through a mailbox the test runs, and
 * once A's thread stopped the test turns A's loop itself. */
static void
test_answer_after_drop(void)
{
    struct world w;
    world_init(&w, NULL);
    struct loop *A = &w.l[0], *B = &w.l[1];
    struct event_base *side = event_base_new();
    struct mailbox *amb = mailbox_new(side);
    thr_stop(&A->t);
    auth_detach(A->a);
    auth_attach(w.s, A->t.base, A->up, amb, &A->a);
    thr_start(&A->t);
    struct req a, b;
    ok(ask_both(&w, "Bearer good-late", &a, &b), "A asks, B joins");
    ok(wait_fake(&w, 1, 0), "asked");
    cancel(&a);
    thr_stop(&A->t); /* A's loop is the test's now */
    cancel(&b);      /* the last waiter: dropped, A's end of it posted */
    is_int((int)mailbox_pending(amb), 1, "A's end of the review is queued");
    fake_op(&w, 0);
    bool late = false;
    struct event *guard = evtimer_new(A->t.base, on_guard, &late);
    struct timeval tv = {DEADLINE_S, 0};
    evtimer_add(guard, &tv);
    struct active act = {A, 1};
    for (on_active(&act); act.n && !late; on_active(&act))
        event_base_loop(A->t.base, EVLOOP_ONCE);
    event_free(guard);
    ok(!late, "the answer reached A");
    is_int((int)mailbox_pending(amb), 1, "...before A's end of it ran");
    mailbox_run(amb);
    is_int(a.calls + b.calls, 0, "no callback");
    struct req b2 = {.l = B, .token = "Bearer good-late"};
    authenticate(&b2, 1);
    ok(b2.pending, "nothing was cached from it");
    ok(wait_calls(&b2, 1, 1) && b2.status == 0, "asked again, answered");
    is_int(stats(&w).reviews_cancelled, 1, "stats: cancelled");
    world_fini(&w);
    mailbox_free(amb);
    event_base_free(side);
}

int
main(void)
{
    TAP_RUN(test_coalesced_across_loops);
    TAP_RUN(test_hit_on_other_loop);
    TAP_RUN(test_cancel_while_answered);
    TAP_RUN(test_source_limits_across_loops);
    TAP_RUN(test_detach_in_flight);
    TAP_RUN(test_answer_after_drop);
    return tap_done();
}
