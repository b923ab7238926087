/*
 * ingest_test.c — proxy/upstream/ingest.c, the reflectors' batched store
 * writer (refl_ingest_* in include/kwc/reflector.h; the private half in
 * proxy/upstream/ingest.h, included here as reflector.c includes it).
 *
 * The reflector is a real one (refl_new: its cache's store resource) that is
 * never started, so nothing talks to an upstream: the test pushes its
 * pending writes itself (refl_ingest_push, as reflector.c does for a watch's
 * events) and turns the test's own event loop. What the header promises:
 *   - pushes of one loop turn, from several callbacks, are one commit, after
 *     those callbacks; another turn's pushes another commit; nothing pending,
 *     no commit and no callback;
 *   - on_commit is called after every successful commit (the store already
 *     holds what was pushed), every subscriber in the order it subscribed;
 *   - on_service likewise, in order: a failed write (the map full) takes the
 *     cache out of service (serving false) and calls no on_commit; the next
 *     successful commit brings it back (serving true) before its on_commit;
 *   - refl_ingest_unsubscribe(arg) removes every subscription of arg and no
 *     other; no callback reaches it after;
 *   - refl_ingest_free writes what is still pending.
 * No sockets and no sleeps: the loop runs with EVLOOP_NONBLOCK (every
 * active event, once) a bounded number of times.
 */
#include "../../proxy/upstream/ingest.h"

#include <event2/event.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/log.h"
#include "kwc/reflector.h"
#include "kwc/store.h"
#include "lmdbdir.h"
#include "tap.h"

/* ---- subscribers: each records its calls into one shared journal ---- */

#define JMAX 64

struct journal {
    char ev[JMAX][48]; /* "A commit rv=3", "B service 0" */
    int n;
};

struct sub {
    const char *name;
    struct journal *j;
    struct store *st;
    struct store_res *sres; /* the rv seen at each commit */
    int commits, services;
};

static void
jot(struct journal *j, const char *name, const char *what, unsigned long long v)
{
    if (j->n < JMAX)
        snprintf(j->ev[j->n++], sizeof j->ev[0], "%s %s%llu", name, what, v);
}

static void
on_commit(void *arg)
{
    struct sub *s = arg;
    s->commits++;
    jot(s->j, s->name, "commit rv=", (unsigned long long)store_res_rv(s->st, s->sres, NULL));
}

static void
on_service(void *arg, const struct refl *r, bool serving)
{
    struct sub *s = arg;
    s->services++;
    jot(s->j, s->name, "service ", serving);
}

/* The journal as one string: "A commit rv=3|B commit rv=3". */
static const char *
jstr(struct journal *j)
{
    static char out[JMAX * 50];
    out[0] = '\0';
    for (int i = 0; i < j->n; i++) {
        if (i)
            strcat(out, "|");
        strcat(out, j->ev[i]);
    }
    return out;
}

/* ---- the environment ---- */

struct env {
    struct event_base *base;
    char dir[64];
    struct store *st;
    struct refl_ingest *ing;
    struct refl *r;
    struct store_res *sres;
    struct journal j;
};

static void
env_init(struct env *e, uint64_t map_size)
{
    memset(e, 0, sizeof *e);
    e->base = event_base_new();
    lmdbdir_make(e->dir, sizeof e->dir, "ingest");
    struct store_options so;
    store_options_default(&so);
    so.map_size = map_size;
    if (store_open(e->dir, &so, &e->st) != 0)
        abort();
    struct refl_ingest_options io = {.data_dir = e->dir, .map_size = map_size};
    if (refl_ingest_new(e->base, e->st, &io, &e->ing) != 0)
        abort();
    char err[256];
    if (refl_new(e->base, NULL, e->ing, "v1/configmaps", KWC_ENC_JSON, "test", &e->r, err,
                 sizeof err) != 0) {
        printf("# refl_new: %s\n", err);
        abort();
    }
    e->sres = refl_desc(e->r)->sres;
}

static void
env_fini(struct env *e)
{
    refl_ingest_free(e->ing);
    refl_free(e->r);
    store_close(e->st);
    lmdbdir_rm(e->dir);
    event_base_free(e->base);
}

static struct sub
sub_of(struct env *e, const char *name)
{
    return (struct sub){.name = name, .j = &e->j, .st = e->st, .sres = e->sres};
}

/* Push an ADDED of key at rv, obj_len bytes of object ('x' after a JSON head). */
static void
push_event(struct env *e, const char *key, uint64_t rv, size_t obj_len)
{
    struct pend *p = refl_ingest_push(e->ing);
    p->r = e->r;
    p->type = STORE_ADDED;
    p->rv = rv;
    p->key = xstrdup(key);
    p->key_len = strlen(key);
    p->obj = xmalloc(obj_len);
    memset(p->obj, 'x', obj_len);
    p->obj_len = obj_len;
}

static void
push_bookmark(struct env *e, uint64_t rv)
{
    struct pend *p = refl_ingest_push(e->ing);
    p->r = e->r;
    p->bookmark = true;
    p->rv = rv;
}

/* Turn the loop until nothing is active (bounded). */
static void
run(struct env *e)
{
    for (int i = 0; i < 100; i++) {
        event_base_loop(e->base, EVLOOP_NONBLOCK);
        if (event_base_get_num_events(e->base, EVENT_BASE_COUNT_ACTIVE) == 0)
            break;
    }
}

static uint64_t
objects(struct env *e)
{
    struct store_rtxn *t;
    struct store_res_info info = {0};
    if (store_rtxn_begin(e->st, &t) != 0)
        return (uint64_t)-1;
    store_info(t, e->sres, &info);
    store_rtxn_end(t);
    return info.objects;
}

/* ---- pushes of one turn, one commit ---- */

struct pusher {
    struct env *e;
    const char *keys[3];
    uint64_t rvs[3];
    int n;
    uint64_t rv_after; /* the store's rv right after this callback's pushes */
};

static void
on_push(evutil_socket_t fd, short what, void *arg)
{
    struct pusher *p = arg;
    for (int i = 0; i < p->n; i++)
        push_event(p->e, p->keys[i], p->rvs[i], 40);
    p->rv_after = store_res_rv(p->e->st, p->e->sres, NULL);
}

static void
test_one_commit_per_turn(void)
{
    struct env e;
    env_init(&e, 16 << 20);
    struct sub a = sub_of(&e, "A");
    refl_ingest_subscribe(e.ing, on_commit, NULL, &a);

    /* two callbacks of the same turn (as two reflectors' reads) push */
    struct pusher p1 = {&e, {"ns/a", "ns/b"}, {3, 4}, 2, 0};
    struct pusher p2 = {&e, {"ns/c"}, {5}, 1, 0};
    struct event *ev1 = event_new(e.base, -1, 0, on_push, &p1);
    struct event *ev2 = event_new(e.base, -1, 0, on_push, &p2);
    event_active(ev1, EV_TIMEOUT, 1);
    event_active(ev2, EV_TIMEOUT, 1);
    run(&e);
    is_int(p1.rv_after, 0, "nothing is written while the turn's callbacks run");
    is_int(p2.rv_after, 0, "...nor after the second's");
    is_int(a.commits, 1, "one commit for the turn's three pushes");
    is_str(jstr(&e.j), "A commit rv=5", "...after which the store holds them");
    is_int(objects(&e), 3, "three objects");
    is_int(e.ing->n, 0, "nothing pending");

    /* the next turn's pushes: the next commit */
    e.j.n = 0;
    struct pusher p3 = {&e, {"ns/d", "ns/e", "ns/f"}, {6, 7, 8}, 3, 0};
    event_assign(ev1, e.base, -1, 0, on_push, &p3);
    event_active(ev1, EV_TIMEOUT, 1);
    run(&e);
    is_int(p3.rv_after, 5, "the next turn: not written during its callback");
    is_int(a.commits, 2, "one more commit");
    is_str(jstr(&e.j), "A commit rv=8", "...holding the three");
    is_int(objects(&e), 6, "six objects");

    /* pushed outside any callback: written at the next turn, not before */
    e.j.n = 0;
    push_event(&e, "ns/g", 9, 40);
    push_bookmark(&e, 12);
    is_int(store_res_rv(e.st, e.sres, NULL), 8, "pushed: not written yet");
    run(&e);
    is_int(a.commits, 3, "written at the next turn, in one commit");
    is_str(jstr(&e.j), "A commit rv=12", "...the bookmark's rv with the event");
    is_int(objects(&e), 7, "seven objects (a bookmark is none)");

    /* nothing pending: no commit, no callback */
    refl_ingest_commit(e.ing);
    run(&e);
    is_int(a.commits, 3, "nothing pending: no commit");

    event_free(ev1);
    event_free(ev2);
    env_fini(&e);
}

/* ---- the order of the subscribers ---- */

static void
test_order(void)
{
    struct env e;
    env_init(&e, 16 << 20);
    struct sub a = sub_of(&e, "A"), b = sub_of(&e, "B"), c = sub_of(&e, "C");
    /* as app.c: requests waiting for an rv (serve) before watch streams */
    refl_ingest_subscribe(e.ing, on_commit, NULL, &b);
    refl_ingest_subscribe(e.ing, on_commit, on_service, &a);
    refl_ingest_subscribe(e.ing, on_commit, on_service, &c);
    push_event(&e, "ns/a", 3, 40);
    run(&e);
    is_str(jstr(&e.j), "B commit rv=3|A commit rv=3|C commit rv=3",
           "every subscriber once, in the order subscribed (not by address or name)");
    e.j.n = 0;
    push_event(&e, "ns/b", 4, 40);
    run(&e);
    is_str(jstr(&e.j), "B commit rv=4|A commit rv=4|C commit rv=4", "...at every commit");

    e.j.n = 0;
    refl_ingest_notify_service(e.ing, e.r, false);
    is_str(jstr(&e.j), "A service 0|C service 0",
           "on_service in the same order; a NULL on_service is skipped");
    e.j.n = 0;
    refl_ingest_notify_commit(e.ing);
    is_str(jstr(&e.j), "B commit rv=4|A commit rv=4|C commit rv=4",
           "refl_ingest_notify_commit: the same order");
    env_fini(&e);
}

/* ---- unsubscribing ---- */

static void
test_unsubscribe(void)
{
    struct env e;
    env_init(&e, 16 << 20);
    struct sub a = sub_of(&e, "A"), b = sub_of(&e, "B"), c = sub_of(&e, "C");
    refl_ingest_subscribe(e.ing, on_commit, NULL, &a);
    refl_ingest_subscribe(e.ing, on_commit, NULL, &b);
    refl_ingest_subscribe(e.ing, NULL, on_service, &b); /* b twice */
    refl_ingest_subscribe(e.ing, on_commit, on_service, &c);
    refl_ingest_unsubscribe(e.ing, &b);
    push_event(&e, "ns/a", 3, 40);
    run(&e);
    is_str(jstr(&e.j), "A commit rv=3|C commit rv=3", "an unsubscribed arg hears no commit");
    e.j.n = 0;
    refl_ingest_notify_service(e.ing, e.r, false);
    is_str(jstr(&e.j), "C service 0", "...nor of service: both its subscriptions went");
    is_int(b.commits + b.services, 0, "b was never called");

    refl_ingest_unsubscribe(e.ing, &e); /* never subscribed: changes nothing */
    e.j.n = 0;
    push_event(&e, "ns/b", 4, 40);
    run(&e);
    is_str(jstr(&e.j), "A commit rv=4|C commit rv=4", "unsubscribing an unknown arg: no change");

    refl_ingest_unsubscribe(e.ing, &a);
    refl_ingest_subscribe(e.ing, on_commit, NULL, &a); /* back, now last */
    e.j.n = 0;
    push_event(&e, "ns/c", 5, 40);
    run(&e);
    is_str(jstr(&e.j), "C commit rv=5|A commit rv=5", "subscribing again: in the new place");

    refl_ingest_unsubscribe(e.ing, &a);
    refl_ingest_unsubscribe(e.ing, &c);
    e.j.n = 0;
    push_event(&e, "ns/d", 6, 40);
    run(&e);
    is_int(e.j.n, 0, "no subscribers: no callback");
    is_int(objects(&e), 4, "...and the commit was made");
    env_fini(&e);
}

/* ---- a failed write: out of service, then back ---- */

static void
test_failed_commit(void)
{
    struct env e;
    env_init(&e, 1 << 20); /* 1 MiB map */
    struct sub a = sub_of(&e, "A"), b = sub_of(&e, "B");
    refl_ingest_subscribe(e.ing, on_commit, on_service, &a);
    refl_ingest_subscribe(e.ing, on_commit, on_service, &b);
    push_event(&e, "ns/small", 3, 40);
    run(&e);
    is_str(jstr(&e.j), "A commit rv=3|B commit rv=3", "a first commit");

    char p[] = "/tmp/kwc-ingest-log-XXXXXX";
    int cap = mkstemp(p);
    unlink(p);
    fflush(stderr);
    int saved = dup(2);
    dup2(cap, 2);
    e.j.n = 0;
    push_event(&e, "ns/big", 4, 2 << 20); /* past the map */
    push_event(&e, "ns/other", 5, 40);
    run(&e);
    dup2(saved, 2);
    close(saved);
    char logged[4096] = "";
    ssize_t n = pread(cap, logged, sizeof logged - 1, 0);
    logged[n > 0 ? n : 0] = '\0';
    close(cap);
    is_str(jstr(&e.j), "A service 0|B service 0",
           "a failed commit: out of service, in order, once; no on_commit");
    ok(refl_out_why(e.r) && strstr(refl_out_why(e.r), "--cache-map-size"),
       "...the cache is out of service for the map");
    is_int(store_res_rv(e.st, e.sres, NULL), 3, "nothing of the failed commit was written");
    is_int(objects(&e), 1, "...not even the small event beside it");
    is_int(e.ing->n, 0, "...and nothing is left pending");
    ok(strstr(logged, "error cache: committing 2 events failed: the cache reached "
                      "--cache-map-size (1048576 bytes) in ") != NULL,
       "logged: the commit failed, and why");

    e.j.n = 0;
    push_event(&e, "ns/next", 6, 40);
    fflush(stderr);
    saved = dup(2);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 2);
    run(&e);
    dup2(saved, 2);
    close(saved);
    close(devnull);
    is_str(jstr(&e.j), "A service 1|B service 1|A commit rv=6|B commit rv=6",
           "the next commit: back in service first, then the commit, each in order");
    ok(refl_out_why(e.r) == NULL, "...no longer out");
    env_fini(&e);
}

/* ---- refl_ingest_free writes what is pending ---- */

static void
test_free_commits(void)
{
    struct env e;
    env_init(&e, 16 << 20);
    push_event(&e, "ns/a", 3, 40);
    push_event(&e, "ns/b", 4, 40);
    refl_ingest_free(e.ing);
    e.ing = NULL;
    is_int(store_res_rv(e.st, e.sres, NULL), 4, "refl_ingest_free: the pending events written");
    is_int(objects(&e), 2, "...both");
    refl_free(e.r);
    store_close(e.st);
    lmdbdir_rm(e.dir);
    event_base_free(e.base);
}

int
main(void)
{
    TAP_RUN(test_one_commit_per_turn);
    TAP_RUN(test_order);
    TAP_RUN(test_unsubscribe);
    TAP_RUN(test_failed_commit);
    TAP_RUN(test_free_commits);
    return tap_done();
}
