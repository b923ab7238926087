/*
 * watch.c — watch streams on worker loops (see watch.h).
 *
 * Writer loop (the main thread, which also runs the HTTP server and the
 * reflectors):
 *   watch_take: admit (admit_decide), answer errors through the response
 *     writer, or send the head (hresp_start) and hand the response off as a
 *     stream (hresp_handoff), posted in a WMSG_WATCH to the least loaded
 *     worker. A metadata-only watch (admit's meta) is a watcher of the same
 *     cache in the hub's metadata form (hub.h "Forms"; a custom resource's
 *     in protobuf: its JSON cache's protobuf metadata form, a protobuf
 *     stream); a pretty one is any watch (events are never indented).
 *   watch_committed: per resource someone watches, the store's new rv; when
 *     it moved, one hub_batch (events read back and encoded once) posted to
 *     each worker that has watchers of it.
 * Worker loop (one thread each, its own event_base and struct hub):
 *   messages in order: WMSG_BATCH -> hub_apply; WMSG_WATCH -> attach the
 *   stream (hstream_attach), hub_watch; WMSG_END -> end every stream
 *   cleanly, the loop goes on (the server drains: watch_pool_end_streams);
 *   WMSG_STOP -> end every stream, leave the loop. Then every watcher that got bytes is flushed
 * once (hstream_flush: several events, one writev), and watchers owed stored events are pumped
 * while their streams have room. A watcher's stream (include/kwc/http.h, hstream_*) frames and
 * sends: the hub's blobs go to it by reference (hstream_write_ref, released when their bytes left),
 * its on_sent is the backpressure that wakes a lagging watcher, its on_close the client gone or the
 * end sent. One timer per watcher (bookmarks, deadline, the sendInitialEvents wait). Hand-off order
 * is what makes a stream gapless: a WMSG_WATCH carries the rv up to which batches had been posted,
 * so the worker knows every event up to it is in the store and every later one will come in a
 * batch.
 *
 * A stream whose handoff is bound to a home loop (HTTP/2: the connection
 * stays on the main loop, DESIGN.md "The front end seam") is served by the
 * pool's local worker: the same struct worker on the writer loop's own
 * base, no thread and no eventfd; a post to it activates its wake event on
 * that base, so messages are applied from the next turn, in order, exactly
 * as a thread applies them. watch_options.own_loop makes it the only worker
 * (tests: every stream is then served on the test's loop).
 */
#include "kwc/watch.h"

#include <assert.h>
#include <errno.h>
#include <event2/event.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "kwc/access.h"
#include "kwc/admit.h"
#include "kwc/base.h"
#include "kwc/http.h"
#include "kwc/hub.h"
#include "kwc/log.h"
#include "kwc/mailbox.h"
#include "kwc/metrics.h"
#include "kwc/pace.h"
#include "kwc/pb.h"
#include "kwc/reflector.h"
#include "kwc/respond.h"
#include "kwc/route.h"
#include "kwc/selector.h"
#include "kwc/status.h"
#include "kwc/store.h"

#define DEFAULT_MIN_TIMEOUT_S 1800 /* kube's minRequestTimeout: deadline in [1x, 2x) */
/* Bytes encoded from the store for single watchers (initial state, catch-up
 * behind the window) queued on one worker's streams: beyond this a watcher
 * reads the next chunk only once its stream has sent everything queued.
 * Shared blobs do not count. With thousands of lagging or relisting
 * watchers this, not N x budget, bounds their memory; a stuck reader keeps
 * only what it already holds, so it cannot starve one that reads. Counted
 * in body bytes (the stream's framing aside): each write's tag. */
#define PRIVATE_MAX (32u << 20)

enum msg_type { WMSG_BATCH, WMSG_WATCH, WMSG_END, WMSG_STOP };

struct wconn;

/* A worker's own count of the references its streams hold on one shared
 * blob: one atomic reference per blob and worker, taken at the first write
 * of it, instead of one atomic per write and per release (every worker's
 * writes of an event hit the same cache line). Worker-only. Found again
 * through a small direct-mapped table (LREF_SLOTS): a live event goes to
 * every watcher in turn, a catch-up walks the same recent blobs for each
 * lagging watcher; a blob whose slot was taken by another gets a second
 * count of its own, which is only slower. */
struct lref {
    struct hub_blob *b;
    unsigned n;
    unsigned slot;
};
#define LREF_SLOTS 64 /* (sink_write's hash takes 6 bits) */

struct msg {
    enum msg_type type;
    struct msg *next;
    struct hub_batch *batch;
    struct wconn *wc;
};

struct worker {
    struct watch_pool *p;
    unsigned idx;
    bool local; /* the pool's own loop: no thread, no eventfd */
    bool ext;   /* a serving loop's base (watch_options.loops): no thread of ours */
    pthread_t thread;
    struct event_base *base;
    int efd;
    struct event *wake_ev, *pump_ev, *flush_ev;
    pthread_mutex_t mu;
    struct msg *head, **tail;
    /* worker-only state */
    struct hub *hub;
    struct wconn *all;              /* every stream this worker owns */
    struct wconn *dirty;            /* got bytes since the last flush */
    struct wconn *pumps;            /* owed stored events, stream has room */
    struct pace pace;               /* when the dirty streams are flushed (pace.h) */
    bool flush_armed;               /* flush_ev waits: the dirty streams are held */
    unsigned long long held_rounds; /* rounds held (published as held_seen) */
    struct lref *lref[LREF_SLOTS];  /* shared blobs written, while referenced */
    size_t private_bytes;           /* store-encoded bytes queued on this worker's streams */
    /* private_bytes for /metrics (a relaxed store; read by any thread) */
    _Atomic size_t private_seen;
    unsigned held;      /* streams waiting for private_bytes to fall */
    bool pumping_store; /* sink writes now are such bytes */
    bool stopping;
    struct hub_stats stats;       /* published under mu after each round */
    unsigned long long held_seen; /* held_rounds, published with stats */
    _Atomic unsigned long long started, ended;
    struct hub_res_stats *rstats; /* per resource, written by this worker's hub (hub.h) */
};

/* One resource as the writer loop tracks it. */
struct pres {
    struct refl *rf;
    struct hub_res *hr; /* built at the first watch */
    uint64_t posted_rv;
    atomic_uint *count; /* per worker (the local one last): watchers of it (main ++, worker --) */
};

struct watch_pool {
    struct event_base *base;
    struct store *st;
    struct watch_options o;
    const struct refl_set *set; /* the caches (grows: catalog.h) */
    struct admit_refls caches;  /* admission's view of set (points to itself) */
    struct pres *res;           /* res[i] is set->r[i]; cap entries, set up at first use */
    size_t nres;                /* set->cap */
    struct worker *w;           /* nw threads, then the local worker (w[nw]) */
    unsigned nw;
    unsigned long long batches;
    bool ending; /* watch_pool_end_streams: the server is draining */
};

/* A watch stream on a worker. Allocated by the writer, owned by the worker
 * once posted. */
struct wconn {
    struct worker *wk;
    unsigned res;
    struct hstream_handoff *h; /* until attached */
    struct hstream *s;         /* attached; NULL once closed */
    struct event *timer;
    bool dirty, pumping;
    bool held;              /* owed store reads, waiting for private_bytes to fall */
    struct hub_watcher *hw; /* NULL once the hub let go of it */
    struct wconn *next_dirty, *next_pump;
    struct wconn *next_all, **prev_all;
    /* from the writer, consumed by the worker */
    char *ns; /* the namespace (req.ns) until hub_watch copied it */
    struct hub_watch_req req;
    uint64_t posted_rv;
    uint64_t cur;            /* the cache's rv at admission (a first watch's start) */
    struct watch_pool *p;    /* for the hop to the writer's loop */
    struct event_base *home; /* the handoff's home loop; NULL: any */
    int64_t timeout_s;
    uint64_t seed;
    struct access_rec *acc; /* the request's record, finished when the stream ends */
};

/* Audit ids and deadlines' jitter: watch_take runs on every serving loop,
 * each with its own generator. */
static _Thread_local uint64_t tl_rng[2];

static uint64_t *
rng(void)
{
    if (!tl_rng[0] && !tl_rng[1])
        respond_rng_seed(tl_rng);
    return tl_rng;
}

static uint64_t
now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t
now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static void
private_add(struct worker *wk, size_t n, bool add)
{
    if (add)
        wk->private_bytes += n;
    else
        wk->private_bytes -= n;
    atomic_store_explicit(&wk->private_seen, wk->private_bytes, memory_order_relaxed);
}

/* ---- the sink a hub writes to ---- */

static void
mark_dirty(struct wconn *c)
{
    if (c->dirty)
        return;
    c->dirty = true;
    c->next_dirty = c->wk->dirty;
    c->wk->dirty = c;
}

/* A hub blob's bytes to the stream: whole and framed once in the hub, as
 * one piece (hstream_write_framed_ref); a part of one, as bytes. */
static void
queue_blob(struct wconn *c, void *owner, uint32_t tag, const struct hub_blob *b, const char *p,
           size_t len)
{
    if (b->framed && p == b->data && len == b->len)
        hstream_write_framed_ref(c->s, owner, tag, p, len);
    else
        hstream_write_ref(c->s, owner, tag, p, len);
}

static void
sink_write(void *sink, struct hub_blob *b, const char *p, size_t len)
{
    struct wconn *c = sink;
    struct worker *wk = c->wk;
    if (len == 0)
        return; /* as a chunk it would end the stream */
    uint32_t acct = wk->pumping_store ? (uint32_t)len : 0;
    if (acct) {
        /* this watcher's own bytes: the blob itself is the owner (tag set) */
        private_add(wk, acct, true);
        hub_blob_ref(b);
        queue_blob(c, b, acct, b, p, len);
    } else {
        /* shared: counted on the worker (on_release) */
        unsigned slot = (unsigned)(((uintptr_t)b * 0x9e3779b97f4a7c15ull) >> 58); /* of 64 */
        struct lref *r = wk->lref[slot];
        if (r && r->b == b) {
            r->n++;
        } else {
            r = xmalloc(sizeof(*r));
            r->b = b;
            r->n = 1;
            r->slot = slot;
            hub_blob_ref(b);
            wk->lref[slot] = r;
        }
        queue_blob(c, r, 0, b, p, len);
    }
    mark_dirty(c);
}

static size_t
sink_queued(void *sink)
{
    struct wconn *c = sink;
    return hstream_queued(c->s);
}

static void
want_pump(struct wconn *c)
{
    if (c->pumping || !c->hw)
        return;
    c->pumping = true;
    c->next_pump = c->wk->pumps;
    c->wk->pumps = c;
    event_active(c->wk->pump_ev, EV_TIMEOUT, 1);
}

static void
sink_wake(void *sink)
{
    struct wconn *c = sink;
    if (hstream_queued(c->s) < c->wk->p->o.budget / 2)
        want_pump(c);
}

static void
sink_end(void *sink, enum hub_end why)
{
    struct wconn *c = sink;
    c->hw = NULL;
    hstream_end(c->s); /* on_close once its last bytes left */
    log_debug("watch: stream ended (%s)", hub_end_name(why));
    mark_dirty(c);
}

static const struct hub_sink_ops sink_ops = {
    .write = sink_write,
    .queued = sink_queued,
    .wake = sink_wake,
    .end = sink_end,
};

/* ---- the stream's hooks ---- */

static void arm_timer(struct wconn *c);

/* Forget c (its stream closed with sent bytes, or never opened). */
static void
conn_free(struct wconn *c, uint64_t sent)
{
    struct worker *wk = c->wk;
    access_stream_end(c->acc, sent);
    if (c->hw) {
        hub_unwatch(c->hw);
        c->hw = NULL;
    }
    /* off the worker's lists (rare: a close inside a round) */
    for (struct wconn **pp = &wk->dirty; c->dirty && *pp; pp = &(*pp)->next_dirty)
        if (*pp == c) {
            *pp = c->next_dirty;
            break;
        }
    for (struct wconn **pp = &wk->pumps; c->pumping && *pp; pp = &(*pp)->next_pump)
        if (*pp == c) {
            *pp = c->next_pump;
            break;
        }
    if (c->held)
        wk->held--;
    if (c->prev_all) {
        *c->prev_all = c->next_all;
        if (c->next_all)
            c->next_all->prev_all = c->prev_all;
    }
    if (c->timer)
        event_free(c->timer);
    hstream_handoff_free(c->h);
    atomic_fetch_sub(&wk->p->res[c->res].count[wk->idx], 1);
    wk->ended++;
    free(c->ns);
    free(c->req.too_large_status);
    sel_free(c->req.sel);
    free(c);
}

static void
on_release(void *arg, void *owner, uint32_t tag)
{
    struct wconn *c = arg;
    struct worker *wk = c->wk;
    if (!tag) {
        struct lref *r = owner;
        if (--r->n)
            return;
        if (wk->lref[r->slot] == r)
            wk->lref[r->slot] = NULL;
        hub_blob_unref(r->b);
        free(r);
        return;
    }
    hub_blob_unref(owner); /* a watcher's own bytes (sink_write) */
    private_add(wk, tag, false);
    if (wk->held && wk->private_bytes < PRIVATE_MAX / 2 && !wk->stopping)
        event_active(wk->pump_ev, EV_TIMEOUT, 1); /* room again: on_pump wakes the held */
}

/* The stream has room: a watcher owed stored events pumps again. */
static void
room(struct wconn *c, size_t queued)
{
    if (c->hw && hub_pump_wanted(c->hw) && queued < c->wk->p->o.budget / 2)
        want_pump(c);
}

static void
on_sent(void *arg, size_t queued)
{
    room(arg, queued);
}

static void
on_stream_close(void *arg, uint64_t sent)
{
    struct wconn *c = arg;
    c->s = NULL;
    conn_free(c, sent);
}

static const struct hstream_ops stream_ops = {
    .release = on_release,
    .on_sent = on_sent,
    .on_close = on_stream_close,
};

/* Send what is queued. Returns false when c was closed. */
static bool
flush(struct wconn *c)
{
    if (!hstream_flush(c->s))
        return false;
    room(c, hstream_queued(c->s));
    return true;
}

static void
on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct wconn *c = arg;
    if (c->hw)
        hub_timer(c->hw, now_ms());
    if (!flush(c))
        return;
    arm_timer(c);
}

static void
arm_timer(struct wconn *c)
{
    uint64_t at = c->hw ? hub_next_timer(c->hw) : 0;
    if (!at) {
        evtimer_del(c->timer);
        return;
    }
    uint64_t now = now_ms();
    uint64_t d = at > now ? at - now : 0;
    struct timeval tv = {(time_t)(d / 1000), (suseconds_t)(d % 1000) * 1000};
    evtimer_add(c->timer, &tv);
}

/* ---- worker rounds ---- */

static void
flush_dirty(struct worker *wk)
{
    while (wk->dirty) {
        struct wconn *c = wk->dirty;
        wk->dirty = c->next_dirty;
        c->dirty = false;
        c->next_dirty = NULL;
        flush(c);
    }
}

static void publish_stats(struct worker *wk);

/* Flush every dirty stream now; a round that batches made dirty (measured)
 * teaches the pace what a flush costs. */
static void
flush_round(struct worker *wk, bool measured)
{
    if (wk->flush_armed) {
        evtimer_del(wk->flush_ev);
        wk->flush_armed = false;
    }
    if (!wk->dirty)
        return;
    uint64_t t0 = measured ? now_us() : 0;
    flush_dirty(wk);
    if (measured)
        pace_flushed(&wk->pace, now_us() - t0);
}

/* The end of a round: flush now, or (a busy worker) hold the dirty streams
 * for the pace's window so each write carries several events. Held, they
 * are flushed by flush_ev, whatever else happens meanwhile: the pace's bound
 * (--watch-coalesce-max-delay, PACE_MAX_US by default; 0 never holds) is the
 * most an event waits here. */
static void
end_round(struct worker *wk, bool measured)
{
    if (!wk->dirty || wk->flush_armed)
        return;
    uint64_t w = pace_window_us(&wk->pace);
    if (w < wk->p->o.flush_hold_us)
        w = wk->p->o.flush_hold_us;
    if (w > wk->pace.max_us)
        w = wk->pace.max_us; /* the bound holds the test's hold too */
    if (!w) {
        flush_round(wk, measured);
        return;
    }
    struct timeval tv = {(time_t)(w / 1000000), (suseconds_t)(w % 1000000)};
    evtimer_add(wk->flush_ev, &tv);
    wk->flush_armed = true;
    wk->held_rounds++;
}

static void
on_flush(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct worker *wk = arg;
    wk->flush_armed = false;
    if (wk->stopping)
        return;
    flush_round(wk, true);
    publish_stats(wk);
}

static void
publish_stats(struct worker *wk)
{
    pthread_mutex_lock(&wk->mu);
    hub_stats(wk->hub, &wk->stats);
    wk->held_seen = wk->held_rounds;
    pthread_mutex_unlock(&wk->mu);
}

static void
on_pump(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct worker *wk = arg;
    if (wk->held && wk->private_bytes < PRIVATE_MAX / 2) {
        for (struct wconn *c = wk->all; c; c = c->next_all)
            if (c->held) {
                c->held = false;
                wk->held--;
                want_pump(c);
            }
    }
    /* one step per watcher per round, so one large catch-up does not hold
     * the loop; the ones that still have room and work go again */
    struct wconn *list = wk->pumps;
    wk->pumps = NULL;
    while (list) {
        struct wconn *c = list;
        list = c->next_pump;
        c->next_pump = NULL;
        c->pumping = false;
        if (!c->hw)
            continue;
        bool store = hub_pump_reads_store(c->hw);
        if (store && wk->private_bytes >= PRIVATE_MAX && hstream_queued(c->s) > 0) {
            if (!c->held) { /* again when its stream sent it all, or when there is room */
                c->held = true;
                wk->held++;
            }
            continue;
        }
        if (c->held) {
            c->held = false;
            wk->held--;
        }
        bool alive;
        wk->pumping_store = store;
        hub_pump(c->hw, &alive);
        wk->pumping_store = false;
        /* to the stream now: a round over thousands of watchers must not
         * hold a chunk for each before the first is written (the kernel
         * takes most; the cap above counts what it does not) */
        flush(c);
    }
    end_round(wk, false); /* (a pump round's flush says little about a batch's) */
    publish_stats(wk);
}

static void
abort_msg(const char *what, int err)
{
    log_warnx("%s: %s", what, strerror(err));
    abort();
}

static void
start_watch(struct worker *wk, struct wconn *c)
{
    c->wk = wk;
    c->next_all = wk->all;
    if (wk->all)
        wk->all->prev_all = &c->next_all;
    c->prev_all = &wk->all;
    wk->all = c;
    wk->started++;
    c->s = hstream_attach(c->h, wk->base, &stream_ops, c);
    c->h = NULL;
    c->timer = evtimer_new(wk->base, on_timer, c);
    if (!c->s || !c->timer) {
        if (c->s)
            hstream_close(c->s);
        conn_free(c, 0);
        return;
    }
    mark_dirty(c); /* the head */
    uint64_t now = now_ms();
    if (c->timeout_s < 0)
        c->req.deadline_ms = now; /* ends at once, as kube's expired context does */
    else
        c->req.deadline_ms = now + (uint64_t)c->timeout_s * 1000;
    if (c->req.wait_until_ms)
        c->req.wait_until_ms += now;
    c->hw = hub_watch(wk->hub, wk->p->res[c->res].hr, &c->req, &sink_ops, c, c->posted_rv, now,
                      c->seed);
    free(c->ns); /* hub_watch has copied it */
    c->ns = NULL;
    c->req.ns = NULL;
    /* a deadline already passed (timeoutSeconds < 0, or the server draining)
     * ends the stream now, before a batch of this round could deliver to it */
    if (c->hw && c->req.deadline_ms <= now)
        hub_timer(c->hw, now);
    if (c->hw)
        arm_timer(c);
}

static void
stop_all(struct worker *wk)
{
    wk->stopping = true;
    hub_free(wk->hub); /* every stream: terminal chunk */
    wk->hub = NULL;
    /* one last try to send each; whatever does not fit is dropped */
    wk->dirty = NULL;
    wk->pumps = NULL;
    if (wk->flush_armed) {
        evtimer_del(wk->flush_ev);
        wk->flush_armed = false;
    }
    while (wk->all) {
        struct wconn *c = wk->all;
        c->dirty = c->pumping = false;
        uint64_t sent = hstream_close(c->s);
        c->s = NULL;
        conn_free(c, sent);
    }
    if (!wk->local && !wk->ext)
        event_base_loopbreak(wk->base);
}

static void
on_wake(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct worker *wk = arg;
    uint64_t v, now = now_us();
    if (!wk->local && fd >= 0 && read(fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        log_warnx("watch: worker %u: eventfd read: %s", wk->idx, strerror(errno));
    pthread_mutex_lock(&wk->mu);
    struct msg *m = wk->head;
    wk->head = NULL;
    wk->tail = &wk->head;
    pthread_mutex_unlock(&wk->mu);
    while (m) {
        struct msg *next = m->next;
        switch (m->type) {
        case WMSG_BATCH:
            pace_batch(&wk->pace, now); /* (several in one wake: back to back) */
            if (!wk->stopping)
                hub_apply(wk->hub, m->batch);
            hub_batch_unref(m->batch);
            break;
        case WMSG_WATCH:
            if (wk->stopping) {
                m->wc->wk = wk;
                conn_free(m->wc, 0);
            } else {
                start_watch(wk, m->wc);
            }
            break;
        case WMSG_END:
            /* the server drains: every stream ends cleanly now (terminal
             * chunk / END_STREAM, on_close once it left); the loop goes on */
            if (!wk->stopping)
                hub_end_all(wk->hub, HUB_END_SHUTDOWN);
            break;
        case WMSG_STOP:
            if (!wk->stopping)
                stop_all(wk);
            break;
        }
        free(m);
        m = next;
    }
    if (wk->stopping)
        return;
    end_round(wk, true);
    publish_stats(wk);
}

static void *
worker_main(void *arg)
{
    struct worker *wk = arg;
    /* the comm (15 bytes) names the thread in /proc/PID/task/TID/stat and top
     * -H (bench/run.py --only cores); its streams' counts go to its shard */
    char name[16];
    snprintf(name, sizeof(name), "kwc-watch/%u", wk->idx);
    pthread_setname_np(pthread_self(), name);
    metrics_thread_shard(1 + wk->idx);
    event_base_dispatch(wk->base);
    return NULL;
}

static void
post(struct worker *wk, struct msg *m)
{
    m->next = NULL;
    pthread_mutex_lock(&wk->mu);
    *wk->tail = m;
    wk->tail = &m->next;
    pthread_mutex_unlock(&wk->mu);
    if (wk->local) {
        event_active(wk->wake_ev, EV_READ, 1); /* the writer's own loop, next turn */
        return;
    }
    uint64_t one = 1;
    if (write(wk->efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        log_warnx("watch: worker %u: eventfd write: %s", wk->idx, strerror(errno));
}

/* ---- the writer loop's side ---- */

/* Hand b to every worker with watchers of pr; takes the caller's reference. */
static void
post_batch(struct watch_pool *p, struct pres *pr, struct hub_batch *b)
{
    for (unsigned i = 0; i <= p->nw; i++) { /* the threads, then the local worker */
        if (atomic_load(&pr->count[i]) == 0)
            continue;
        struct msg *m = xcalloc(1, sizeof(*m));
        m->type = WMSG_BATCH;
        hub_batch_ref(b);
        m->batch = b;
        post(&p->w[i], m);
    }
    hub_batch_unref(b);
}

static void
publish(struct watch_pool *p, struct pres *pr)
{
    const struct refl_desc *d = refl_desc(pr->rf);
    uint64_t rv = store_res_rv(p->st, d->sres, NULL);
    if (rv == pr->posted_rv)
        return;
    bool any = false;
    for (unsigned i = 0; i <= p->nw; i++)
        any |= atomic_load(&pr->count[i]) > 0;
    if (any) {
        struct hub_batch *b;
        int rc;
        if (rv < pr->posted_rv) {
            rc = hub_batch_build(p->st, pr->hr, rv, rv, false, &b);
            if (rc == 0)
                b->gap = true; /* the resource was reset to an older rv */
        } else {
            rc = hub_batch_build(p->st, pr->hr, pr->posted_rv, rv, true, &b);
        }
        if (rc) {
            log_warnx("watch %s: reading committed events failed: %s", d->resource,
                      kwc_strerror(rc));
            return; /* tried again at the next commit */
        }
        post_batch(p, pr, b);
        p->batches++;
    }
    pr->posted_rv = rv;
}

void
watch_service_changed(void *arg, const struct refl *r, bool serving)
{
    struct watch_pool *p = arg;
    if (serving)
        return; /* streams of a cache back in service start with new requests */
    for (size_t i = 0; i < p->set->n; i++) {
        struct pres *pr = &p->res[i];
        if (pr->rf != r || !pr->hr)
            continue;
        /* a gap batch at the rv already posted: every watcher ends (clean;
         * with a 410 when the upstream's timeline changed, so that its
         * client relists instead of resuming from an rv of the old one) */
        struct hub_batch *b;
        if (hub_batch_build(p->st, pr->hr, pr->posted_rv, pr->posted_rv, false, &b) != 0)
            return;
        b->gap = true;
        b->expired = refl_resetting(r);
        post_batch(p, pr, b);
    }
}

void
watch_committed(void *arg)
{
    struct watch_pool *p = arg;
    for (size_t i = 0; i < p->set->n; i++)
        if (p->res[i].hr)
            publish(p, &p->res[i]);
}

/* An error before the stream: kube's Status, through the response writer. */
static void
answer_error(struct watch_pool *p, struct hreq *req, struct decide_result *dec)
{
    char audit[RESPOND_AUDIT_ID_LEN];
    respond_audit_id(req, rng(), audit);
    hresp_header(req, "Audit-Id", audit);
    respond_status_body(req, dec->code, dec->body, 0);
}

/* The head kwc has always sent a watch (its bytes unchanged since the
 * stream moved into the HTTP layer): Audit-Id, Cache-Control,
 * Content-Type, then the server's Date, framing and Connection: close (the
 * connection leaves the HTTP server, so it cannot carry another request). */
static void
start_response(struct watch_pool *p, struct hreq *req, enum kwc_enc enc)
{
    char audit[RESPOND_AUDIT_ID_LEN];
    respond_audit_id(req, rng(), audit);
    hresp_header(req, "Audit-Id", audit);
    hresp_header(req, "Cache-Control", "no-cache, private");
    hresp_header(req, "Content-Type",
                 enc == KWC_ENC_PB ? PB_WATCH_CONTENT_TYPE : "application/json");
    hresp_close_after(req);
    hresp_start(req, 200, -1);
}

static unsigned
least_loaded(struct watch_pool *p, struct pres *pr)
{
    /* the worker with the fewest watchers of this resource: fan-out of one
     * resource's events is what must be spread */
    unsigned best = 0, bn = UINT32_MAX;
    for (unsigned i = 0; i < p->nw; i++) {
        unsigned n = atomic_load(&pr->count[i]);
        if (n < bn)
            bn = n, best = i;
    }
    return best;
}

static void register_watch(void *arg);

enum watch_took
watch_take(struct watch_pool *p, struct hreq *req, const struct route_req *r)
{
    if (r->verb != ROUTE_WATCH)
        return WATCH_NOT_TAKEN;
    struct admit_req q = {.r = r,
                          .method = hreq_method(req),
                          .accept = hreq_header(req, "Accept"),
                          .user_agent = hreq_header(req, "User-Agent"),
                          .too_large = p->o.too_large};
    struct admit a;
    admit_decide(&q, &p->caches.c, &a);
    if (a.want)
        refl_want(p->set->r[a.cache]); /* (any thread: it posts the start) */
    if (a.action == ADMIT_PASS)
        return WATCH_NOT_TAKEN;
    if (a.action == ADMIT_ERROR) {
        answer_error(p, req, &a.dec);
        admit_fini(&a);
        return WATCH_ANSWERED;
    }
    const struct refl_desc *d = refl_desc(p->set->r[a.cache]);
    struct decide_result dec = a.dec;
    struct sel *sel = a.sel;

    struct wconn *c = xcalloc(1, sizeof(*c));
    c->p = p;
    c->res = (unsigned)a.cache;
    c->cur = a.current_rv;
    c->req = (struct hub_watch_req){
        .ns = NULL,
        .sel = sel,
        .initial = dec.initial,
        .rv = dec.rv,
        .initial_end = dec.initial_end,
        .bookmarks = a.bookmarks,
        .meta = a.meta,             /* the same cache's events, each object's metadata only */
        .meta_pb = a.pom_from_json, /* ...a custom resource's, in protobuf */
    };
    if (dec.wait) {
        /* sendInitialEvents at an rv the cache has not reached, or a resume
         * from one (its client came from a replica that was ahead): the
         * wait of a too-large rv. A resume ends with kube's 504 ERROR if
         * the cache does not get there (the client lists again, waiting
         * there as well), whatever --too-large-rv says of reads */
        c->req.wait_until_ms = (uint64_t)p->o.wait_ms;
        if (p->o.too_large == DECIDE_TOO_LARGE_504 || !dec.initial) {
            struct decide_result t;
            struct decide_result w = {.rv = dec.rv, .on_timeout = DECIDE_ERROR};
            decide_timeout(&w, c->cur, &t);
            c->req.too_large_status = t.body;
            t.body = NULL;
            decide_result_fini(&t);
        }
    }
    c->timeout_s = dec.timeout_seconds;
    if (c->timeout_s == 0) {
        uint64_t x;
        if (getrandom(&x, sizeof(x), 0) != (ssize_t)sizeof(x))
            x = (uint64_t)now_ms() * 0x9e3779b97f4a7c15ull;
        c->timeout_s = DEFAULT_MIN_TIMEOUT_S + (int64_t)(x % DEFAULT_MIN_TIMEOUT_S);
    }
    c->seed = rng()[0] ^ (rng()[1] << 1) ^ (uint64_t)(uintptr_t)c;
    decide_result_fini(&dec);

    /* the head, then the response leaves the request as a stream */
    start_response(p, req, a.enc);
    c->h = hresp_handoff(req);
    if (!c->h) {
        free(c->req.too_large_status);
        sel_free(sel);
        free(c);
        return WATCH_STREAM; /* gone already */
    }
    c->acc = access_stream(hstream_handoff_note(c->h), req, 200);
    if (r->namespace_ && d->namespaced) {
        /* the namespace must outlive the route request */
        c->ns = xstrdup(r->namespace_);
        c->req.ns = c->ns;
    }
    /* HTTP/1.1: any loop (the connection moves); else the stream's home:
     * this loop (HTTP/2 connections stay on theirs) */
    c->home = hstream_handoff_home(c->h);
    if (p->o.nloops) {
        mailbox_post(p->o.main_mb, register_watch, c);
        return WATCH_STREAM;
    }
    assert(!c->home || c->home == p->base);
    register_watch(c);
    return WATCH_STREAM;
}

/* The writer's loop: the stream joins its resource's fan-out. Ordered with
 * watch_committed (the same loop): c's posted_rv is the rv up to which
 * batches went to the workers, so the worker knows what to read from the
 * store and what comes in batches. */
static void
register_watch(void *arg)
{
    struct wconn *c = arg;
    struct watch_pool *p = c->p;
    struct pres *pr = &p->res[c->res];
    if (!pr->rf) {
        /* a cache's first watch: its slot in the pool (the catalog may
         * have added it since the pool started) */
        pr->rf = p->set->r[c->res];
        pr->count = xcalloc(p->nw + 1, sizeof(atomic_uint));
    }
    const struct refl_desc *d = refl_desc(pr->rf);
    if (!pr->hr) {
        pr->hr = hub_res_new_enc(d->enc, c->res, d->sres, d->kind, d->api_version, d->typed_items,
                                 d->namespaced, d->field_names, d->n_fields, d->index_field);
        /* every blob framed once as an HTTP/1.1 chunk, before it is shared */
        hub_res_set_frame(pr->hr, &(struct hub_frame){.head = HSTREAM_FRAME_HEAD,
                                                      .tail = HSTREAM_FRAME_TAIL,
                                                      .frame = hstream_frame});
        /* what the store holds now, not c->cur: on a serving loop the
         * request was admitted at an rv the writer may have committed past
         * since, and those commits posted no batch (this resource had no
         * hub); the worker reads up to here from the store */
        pr->posted_rv = store_res_rv(p->st, d->sres, NULL);
    } else {
        publish(p, pr); /* anything committed since the last hook goes first */
    }
    if (p->ending)
        c->timeout_s =
            -1; /* draining: it ends at once (a clean end; the client resumes elsewhere) */
    c->posted_rv = pr->posted_rv;
    unsigned wi;
    if (p->o.own_loop) {
        wi = p->nw;
    } else if (c->home) {
        wi = p->nw; /* the writer's own loop, unless a serving loop's */
        for (unsigned i = 0; i < p->nw; i++)
            if (p->w[i].base == c->home)
                wi = i;
    } else {
        wi = least_loaded(p, pr);
    }
    atomic_fetch_add(&pr->count[wi], 1);
    struct msg *m = xcalloc(1, sizeof(*m));
    m->type = WMSG_WATCH;
    m->wc = c;
    post(&p->w[wi], m);
}

/* ---- lifecycle ---- */

/* Worker i: a thread with its own loop, or (local) the pool's own loop. */
static void
worker_init(struct watch_pool *p, unsigned i, bool local, struct hub_options ho)
{
    struct worker *wk = &p->w[i];
    wk->p = p;
    wk->idx = i;
    wk->local = local;
    wk->ext = !local && p->o.nloops;
    wk->base = local ? p->base : wk->ext ? p->o.loops[i] : event_base_new();
    wk->efd = local ? -1 : eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!wk->base || (!local && wk->efd < 0))
        abort_msg("watch: cannot create worker loop", errno);
    pthread_mutex_init(&wk->mu, NULL);
    wk->tail = &wk->head;
    wk->rstats = xcalloc(p->nres ? p->nres : 1, sizeof(*wk->rstats));
    ho.res_stats = wk->rstats;
    ho.n_res_stats = p->nres;
    wk->hub = hub_new(p->st, &ho);
    wk->pump_ev = event_new(wk->base, -1, 0, on_pump, wk);
    wk->flush_ev = evtimer_new(wk->base, on_flush, wk);
    pace_init(&wk->pace, p->o.no_coalesce ? 0 : p->o.coalesce_max_us);
    if (!wk->pump_ev || !wk->flush_ev)
        abort_msg("watch: cannot create worker events", ENOMEM);
    if (local) {
        wk->wake_ev = event_new(wk->base, -1, 0, on_wake, wk); /* post() activates it */
        return;
    }
    wk->wake_ev = event_new(wk->base, wk->efd, EV_READ | EV_PERSIST, on_wake, wk);
    event_add(wk->wake_ev, NULL);
    if (wk->ext)
        return; /* the serving loop's thread runs it */
    int rc = pthread_create(&wk->thread, NULL, worker_main, wk);
    if (rc)
        abort_msg("watch: cannot start a worker thread", rc);
}

struct watch_pool *
watch_pool_new(struct event_base *base, struct store *st, const struct refl_set *set,
               const struct watch_options *o)
{
    struct watch_pool *p = xcalloc(1, sizeof(*p));
    p->base = base;
    p->st = st;
    p->o = *o;
    p->nw = o->nloops ? o->nloops : o->workers;
    if (o->own_loop)
        p->nw = 0; /* the local worker alone */
    else if (!p->nw && !o->nloops) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        p->nw = n > 0 ? (unsigned)n : 1;
    }
    if (!p->o.budget)
        p->o.budget = 256 * 1024;
    if (!p->o.coalesce_max_us)
        p->o.coalesce_max_us = PACE_MAX_US;
    p->set = set;
    p->nres = set->cap;
    admit_refls_init(&p->caches, set, st);
    p->res = xcalloc(p->nres ? p->nres : 1, sizeof(*p->res));
    p->w = xcalloc(p->nw + 1, sizeof(*p->w));
    struct hub_options ho = {
        .budget = p->o.budget, .bookmark_ms = o->bookmark_ms, .window_bytes = o->window_bytes};
    for (unsigned i = 0; i <= p->nw; i++)
        worker_init(p, i, i == p->nw, ho);
    return p;
}

void
watch_pool_free(struct watch_pool *p)
{
    if (!p)
        return;
    for (unsigned i = 0; i <= p->nw; i++) {
        struct msg *m = xcalloc(1, sizeof(*m));
        m->type = WMSG_STOP;
        post(&p->w[i], m);
    }
    /* the local worker and the serving loops' (stopped): what is posted to
     * them, the stop last, applied now on this thread */
    for (unsigned i = 0; i <= p->nw; i++)
        if (p->w[i].local || p->w[i].ext)
            on_wake(-1, 0, &p->w[i]);
    for (unsigned i = 0; i <= p->nw; i++) {
        struct worker *wk = &p->w[i];
        if (!wk->local && !wk->ext)
            pthread_join(wk->thread, NULL);
        /* messages posted after the stop (none from here on) */
        for (struct msg *m = wk->head, *next; m; m = next) {
            next = m->next;
            if (m->type == WMSG_BATCH)
                hub_batch_unref(m->batch);
            else if (m->type == WMSG_WATCH) {
                m->wc->wk = wk;
                conn_free(m->wc, 0);
            }
            free(m);
        }
        event_free(wk->wake_ev);
        event_free(wk->pump_ev);
        event_free(wk->flush_ev);
        if (wk->ext) {
            close(wk->efd); /* (the base is the serving loop's) */
        } else if (!wk->local) {
            /* deferred frees of TLS streams still queued */
            event_base_loop(wk->base, EVLOOP_NONBLOCK);
            event_base_free(wk->base);
            close(wk->efd);
        }
        pthread_mutex_destroy(&wk->mu);
        free(wk->rstats);
    }
    for (size_t i = 0; i < p->nres; i++) {
        hub_res_free(p->res[i].hr);
        free(p->res[i].count);
    }
    free(p->res);
    free(p->w);
    free(p);
}

void
watch_pool_end_streams(struct watch_pool *p)
{
    if (p->ending)
        return;
    p->ending = true;
    for (unsigned i = 0; i <= p->nw; i++) {
        struct msg *m = xcalloc(1, sizeof(*m));
        m->type = WMSG_END;
        post(&p->w[i], m);
    }
}

size_t
watch_pool_streams(struct watch_pool *p)
{
    size_t n = 0;
    for (size_t i = 0; i < p->nres; i++)
        for (unsigned w = 0; p->res[i].count && w <= p->nw; w++)
            n += atomic_load(&p->res[i].count[w]);
    return n;
}

void
watch_stats(struct watch_pool *p, struct watch_stats *out)
{
    memset(out, 0, sizeof(*out));
    for (unsigned i = 0; i <= p->nw; i++) {
        struct worker *wk = &p->w[i];
        pthread_mutex_lock(&wk->mu);
        out->watchers += wk->stats.watchers;
        out->live += wk->stats.live;
        out->lagging += wk->stats.lagging;
        out->delivered += wk->stats.delivered;
        out->bookmarks += wk->stats.bookmarks;
        out->started += wk->started;
        out->ended += wk->ended;
        out->held += wk->held_seen;
        pthread_mutex_unlock(&wk->mu);
    }
    out->batches = p->batches;
}

void
watch_res_stats(struct watch_pool *p, size_t i, struct watch_res_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (i >= p->nres)
        return;
    atomic_uint *count = p->res[i].count; /* NULL until the cache's first watch */
    for (unsigned k = 0; k <= p->nw; k++) {
        struct hub_res_stats s;
        hub_res_stats_read(&p->w[k].rstats[i], &s);
        if (count)
            out->watchers += atomic_load_explicit(&count[k], memory_order_relaxed);
        out->hub.lagging += s.lagging;
        out->hub.live += s.live;
        out->hub.live_bytes += s.live_bytes;
        out->hub.window += s.window;
        out->hub.window_bytes += s.window_bytes;
        out->hub.store += s.store;
        out->hub.store_bytes += s.store_bytes;
        out->hub.initial += s.initial;
        out->hub.initial_bytes += s.initial_bytes;
        out->hub.bookmarks += s.bookmarks;
    }
}

size_t
watch_store_queued(struct watch_pool *p)
{
    size_t n = 0;
    for (unsigned k = 0; k <= p->nw; k++)
        n += atomic_load_explicit(&p->w[k].private_seen, memory_order_relaxed);
    return n;
}
