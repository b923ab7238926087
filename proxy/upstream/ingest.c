/*
 * ingest.c — the batched store writer of the reflectors of one loop (see
 * ingest.h and reflector.h): every reflector's decoded events and bookmarks
 * of one loop turn in one LMDB write transaction, since one transaction per
 * event costs ~30x (TRAPS.md "LMDB"). Owns the pending writes until they are
 * committed; a failed commit is told to each reflector it carried events of
 * (refl_commit_failed), which takes its cache out of service. Also the
 * reflectors' clock and random source (struct refl_clock: the real ones
 * unless the options bring others). Loop thread only, but for
 * refl_ingest_post_wants (any thread: refl_want from a serving loop).
 */
#include "ingest.h"
#include "reflector_int.h"

#include <errno.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>

#include "kwc/base.h"
#include "kwc/log.h"
#include "kwc/mailbox.h"

static uint64_t
real_now_ms(void *arg)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000 + (uint64_t)now.tv_nsec / 1000000;
}

static uint32_t
real_rand(void *arg)
{
    return (uint32_t)rand();
}

/* ---- the batched writer ---- */

static void
pend_free(struct pend *p)
{
    free(p->key);
    free(p->obj);
    free(p->idx);
}

/* What a failed write means, for a person: the cause and what fixes it.
 * LMDB reports a short write as EIO, so a full disk is told apart by the
 * space left on the data dir's filesystem. */
void
refl_ingest_write_cause(const struct refl_ingest *ing, int rc, char *buf, size_t len)
{
    struct statvfs sv;
    bool full = rc == -ENOSPC || rc == -EDQUOT ||
                (rc == -EIO && statvfs(ing->data_dir, &sv) == 0 &&
                 (uint64_t)sv.f_bavail * sv.f_frsize < ((uint64_t)1 << 20));
    if (rc == KWC_EMAPFULL)
        snprintf(buf, len,
                 "the cache reached --cache-map-size (%llu bytes) in %s: raise --cache-map-size, "
                 "or lower --history-max-bytes",
                 (unsigned long long)ing->map_size, ing->data_dir);
    else if (full)
        snprintf(buf, len,
                 "no space left on device in %s: free space there, or move --data-dir to a "
                 "larger volume",
                 ing->data_dir);
    else
        snprintf(buf, len, "writing to %s failed: %s (check the disk and the kernel log)",
                 ing->data_dir, kwc_strerror(rc));
}

/* Free bytes for unprivileged writers on the data dir's filesystem. */
uint64_t
refl_ingest_free_bytes(const struct refl_ingest *ing)
{
    struct statvfs sv;
    return statvfs(ing->data_dir, &sv) == 0 ? (uint64_t)sv.f_bavail * sv.f_frsize : 0;
}

void
refl_ingest_commit(struct refl_ingest *ing)
{
    if (ing->n == 0 || ing->frozen)
        return; /* frozen: another process owns the store; kept for a thaw */
    struct store_wtxn *w;
    int rc = store_wtxn_begin(ing->st, (uint64_t)time(NULL), &w);
    size_t i = 0;
    for (; rc == 0 && i < ing->n; i++) {
        struct pend *p = &ing->p[i];
        if (p->bookmark) {
            rc = store_wtxn_rv(w, refl_desc(p->r)->sres, p->rv);
        } else {
            struct store_event ev = {.type = p->type,
                                     .rv = p->rv,
                                     .key = p->key,
                                     .key_len = p->key_len,
                                     .obj = p->obj,
                                     .obj_len = p->obj_len,
                                     .idx = p->idx,
                                     .idx_len = p->idx_len};
            rc = store_wtxn_event(w, refl_desc(p->r)->sres, &ev);
        }
    }
    if (rc == 0)
        rc = store_wtxn_commit(w);
    else
        store_wtxn_abort(w);
    if (rc) {
        char why[512];
        refl_ingest_write_cause(ing, rc, why, sizeof(why));
        log_error("cache: committing %zu events failed: %s", ing->n, why);
        for (size_t j = 0; j < ing->n; j++)
            refl_commit_failed(ing->p[j].r, why);
    } else {
        for (size_t j = 0; j < ing->n; j++)
            refl_commit_done(ing->p[j].r);
    }
    for (size_t j = 0; j < ing->n; j++)
        pend_free(&ing->p[j]);
    ing->n = 0;
    ing->bytes = 0;
    if (rc == 0)
        refl_ingest_notify_commit(ing);
}

static void
on_commit(evutil_socket_t fd, short what, void *arg)
{
    refl_ingest_commit(arg);
}

struct pend *
refl_ingest_push(struct refl_ingest *ing)
{
    if (ing->n == ing->cap) {
        ing->cap = ing->cap ? 2 * ing->cap : 256;
        ing->p = xrealloc(ing->p, ing->cap * sizeof(*ing->p));
    }
    struct pend *p = &ing->p[ing->n++];
    memset(p, 0, sizeof(*p));
    /* One transaction per loop turn: commit after the callbacks of this turn. */
    event_active(ing->commit_ev, EV_TIMEOUT, 1);
    return p;
}

int
refl_ingest_new(struct event_base *base, struct store *st, const struct refl_ingest_options *o,
                struct refl_ingest **out)
{
    struct refl_ingest *ing = xcalloc(1, sizeof(*ing));
    ing->base = base;
    ing->st = st;
    ing->data_dir = xstrdup(o && o->data_dir ? o->data_dir : ".");
    ing->map_size = o ? o->map_size : 0;
    ing->max_staleness_ms = o ? o->max_staleness_ms : 0;
    if (o)
        ing->clock = o->clock;
    if (!ing->clock.now_ms)
        ing->clock.now_ms = real_now_ms;
    if (!ing->clock.rand)
        ing->clock.rand = real_rand;
    ing->commit_ev = event_new(base, -1, 0, on_commit, ing);
    ing->owner = pthread_self();
    ing->mb = mailbox_new(base);
    *out = ing;
    return 0;
}

bool
refl_ingest_on_loop(const struct refl_ingest *ing)
{
    return pthread_equal(pthread_self(), ing->owner);
}

/* The loop: start every reflector a serving loop asked for (refl_want).
 * The flag is cleared before the scan, so that a want set after the scan
 * passed its reflector posts again. */
static void
run_wants(void *arg)
{
    struct refl_ingest *ing = arg;
    atomic_store(&ing->wants_posted, false);
    for (size_t i = 0; i < ing->nall && !ing->closing; i++)
        if (atomic_exchange(&ing->all[i]->want_posted, false))
            refl_want(ing->all[i]);
}

void
refl_ingest_post_wants(struct refl_ingest *ing)
{
    if (!atomic_exchange(&ing->wants_posted, true))
        mailbox_post(ing->mb, run_wants, ing);
}

void
refl_ingest_notify_commit(struct refl_ingest *ing)
{
    for (size_t i = 0; i < ing->nsubs; i++)
        if (ing->subs[i].on_commit)
            ing->subs[i].on_commit(ing->subs[i].arg);
}

void
refl_ingest_notify_service(struct refl_ingest *ing, const struct refl *r, bool serving)
{
    for (size_t i = 0; i < ing->nsubs; i++)
        if (ing->subs[i].on_service)
            ing->subs[i].on_service(ing->subs[i].arg, r, serving);
}

void
refl_ingest_subscribe(struct refl_ingest *ing, void (*commit_cb)(void *arg),
                      void (*service_cb)(void *arg, const struct refl *r, bool serving), void *arg)
{
    ing->subs = xrealloc(ing->subs, (ing->nsubs + 1) * sizeof(*ing->subs));
    ing->subs[ing->nsubs++] = (struct refl_sub){commit_cb, service_cb, arg};
}

void
refl_ingest_unsubscribe(struct refl_ingest *ing, void *arg)
{
    size_t n = 0;
    for (size_t i = 0; i < ing->nsubs; i++)
        if (ing->subs[i].arg != arg)
            ing->subs[n++] = ing->subs[i];
    ing->nsubs = n;
}

void
refl_ingest_freeze(struct refl_ingest *ing, bool frozen)
{
    ing->frozen = false;
    refl_ingest_commit(ing); /* what is pending goes to disk first (or, thawed, at last) */
    ing->frozen = frozen;
}

bool
refl_ingest_frozen(const struct refl_ingest *ing)
{
    return ing->frozen;
}

void
refl_ingest_on_unknown(struct refl_ingest *ing,
                       void (*cb)(void *arg, const struct refl *r, const char *why), void *arg)
{
    ing->on_unknown = cb;
    ing->on_unknown_arg = arg;
}

void
refl_ingest_on_retry(struct refl_ingest *ing,
                     void (*cb)(void *arg, const struct refl *r, int status), void *arg)
{
    ing->on_retry = cb;
    ing->on_retry_arg = arg;
}

void
refl_ingest_add(struct refl_ingest *ing, struct refl *r)
{
    ing->all = xrealloc(ing->all, (ing->nall + 1) * sizeof(*ing->all));
    ing->all[ing->nall++] = r;
}

void
refl_ingest_remove(struct refl_ingest *ing, struct refl *r)
{
    size_t n = 0;
    for (size_t i = 0; i < ing->nall; i++)
        if (ing->all[i] != r)
            ing->all[n++] = ing->all[i];
    ing->nall = n;
    refl_ingest_drop(ing, r);
}

void
refl_ingest_drop(struct refl_ingest *ing, struct refl *r)
{
    size_t n = 0;
    for (size_t i = 0; i < ing->n; i++) {
        struct pend *p = &ing->p[i];
        if (p->r == r) {
            ing->bytes -= p->obj_len + p->key_len + p->idx_len;
            pend_free(p);
        } else {
            ing->p[n++] = *p;
        }
    }
    ing->n = n;
}

void
refl_ingest_free(struct refl_ingest *ing)
{
    if (!ing)
        return;
    ing->closing = true;
    mailbox_free(ing->mb); /* a want queued now starts nothing */
    refl_ingest_identity_fini(ing);
    refl_ingest_commit(ing);
    for (size_t i = 0; i < ing->nall; i++)
        ing->all[i]->ing = NULL; /* freed after it (main.c): they must not reach it */
    event_free(ing->commit_ev);
    free(ing->data_dir);
    free(ing->p);
    free(ing->subs);
    free(ing->all);
    free(ing);
}
