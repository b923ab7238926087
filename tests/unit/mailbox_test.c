/*
 * mailbox_test.c — proxy/ops/mailbox.c: calls posted from other threads run
 * on the owner's loop, all of them, in each poster's order.
 */
#include "kwc/mailbox.h"

#include <event2/event.h>
#include <pthread.h>
#include <stdlib.h>

#include "tap.h"

#define POSTERS 4
#define PER_POSTER 20000

struct rec {
    struct event_base *base;
    pthread_t owner;
    unsigned next[POSTERS]; /* the sequence number expected next, per poster */
    unsigned ran, wrong_thread, out_of_order;
};

struct call {
    struct rec *r;
    unsigned poster, seq;
};

static void
on_call(void *arg)
{
    struct call *c = arg;
    struct rec *r = c->r;
    if (!pthread_equal(pthread_self(), r->owner))
        r->wrong_thread++;
    if (c->seq != r->next[c->poster])
        r->out_of_order++;
    r->next[c->poster] = c->seq + 1;
    if (++r->ran == POSTERS * PER_POSTER)
        event_base_loopbreak(r->base);
    free(c);
}

struct poster {
    struct mailbox *m;
    struct rec *r;
    unsigned idx;
};

static void *
post_main(void *arg)
{
    struct poster *p = arg;
    for (unsigned i = 0; i < PER_POSTER; i++) {
        struct call *c = malloc(sizeof(*c));
        *c = (struct call){.r = p->r, .poster = p->idx, .seq = i};
        mailbox_post(p->m, on_call, c);
    }
    return NULL;
}

static void
on_self(void *arg)
{
    int *n = arg;
    (*n)++;
}

static void
on_repost(void *arg)
{
    void **a = arg;
    mailbox_post(a[0], on_self, a[1]);
}

static void
test_threads(void)
{
    struct rec r = {.base = event_base_new(), .owner = pthread_self()};
    struct mailbox *m = mailbox_new(r.base);
    struct poster ps[POSTERS];
    pthread_t th[POSTERS];
    for (unsigned i = 0; i < POSTERS; i++) {
        ps[i] = (struct poster){.m = m, .r = &r, .idx = i};
        pthread_create(&th[i], NULL, post_main, &ps[i]);
    }
    /* the loop runs until the last call broke it (no timer: a lost wake
     * would hang, and the suite's own timeout reports it) */
    event_base_dispatch(r.base);
    for (unsigned i = 0; i < POSTERS; i++)
        pthread_join(th[i], NULL);
    is_int(r.ran, POSTERS * PER_POSTER, "every call ran");
    is_int(r.wrong_thread, 0, "on the owner's thread only");
    is_int(r.out_of_order, 0, "each poster's calls in the order posted");
    ok(mailbox_pending(m) == 0, "nothing pending");
    mailbox_free(m);
    event_base_free(r.base);
}

static void
test_free_runs_pending(void)
{
    struct event_base *base = event_base_new();
    struct mailbox *m = mailbox_new(base);
    int n = 0;
    mailbox_post(m, on_self, &n);
    mailbox_post(m, on_self, &n);
    is_int((int)mailbox_pending(m), 2, "two pending before the loop ran");
    mailbox_free(m);
    is_int(n, 2, "free runs what was pending (what the calls own is freed)");
    event_base_free(base);
}

static void
test_post_from_call(void)
{
    struct event_base *base = event_base_new();
    struct mailbox *m = mailbox_new(base);
    int n = 0;
    void *a[2] = {m, &n};
    mailbox_post(m, on_repost, a);
    event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    is_int(n, 0, "a call posted by a call waits for the next turn");
    event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    is_int(n, 1, "and runs then");
    mailbox_free(m);
    event_base_free(base);
}

int
main(void)
{
    test_threads();
    test_free_runs_pending();
    test_post_from_call();
    return tap_done();
}
