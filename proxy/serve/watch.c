/*
 * watch.c — watch streams on worker loops (see watch.h).
 *
 * Writer loop (the main thread, which also runs the HTTP server and the
 * reflectors):
 *   watch_take: admit (admit_decide), answer errors through the response
 *     writer, or take the socket (hreq_take_socket: the fd, and with TLS its
 *     SSL state) and post a WMSG_WATCH to the least loaded worker.
 *   watch_committed: per resource someone watches, the store's new rv; when
 *     it moved, one hub_batch (events read back and encoded once) posted to
 *     each worker that has watchers of it.
 * Worker loop (one thread each, its own event_base and struct hub):
 *   messages in order: WMSG_BATCH -> hub_apply; WMSG_WATCH -> write the head,
 *   hub_watch; WMSG_STOP -> end every stream, leave the loop. Then every
 *   watcher that got bytes is flushed once (several events, one writev), and
 *   watchers owed stored events are pumped while their sockets have room.
 * A watcher's socket: a ring of references into shared blobs, the chunk
 * framing inline in each entry (48 bytes an entry; libevent's
 * evbuffer_add_reference allocates a 1 KiB chain for each, as much as
 * copying a small event), written with writev, one persistent read event
 * (EOF = client gone; request bytes are dropped), write interest only while
 * bytes are queued, and one timer (bookmarks, deadline, the
 * sendInitialEvents wait).
 * Over TLS the ring feeds an OpenSSL bufferevent on the worker's loop
 * instead of writev: entries are copied into it (encryption copies anyway)
 * while it holds less than TLS_OUT_MAX, and its write callback asks for more;
 * what it holds counts against the watcher's budget like the ring does.
 * Hand-off order is what makes a stream gapless: a WMSG_WATCH carries the rv
 * up to which batches had been posted, so the worker knows every event up
 * to it is in the store and every later one will come in a batch.
 */
#include "kwc/watch.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "kwc/access.h"
#include "kwc/admit.h"
#include "kwc/base.h"
#include "kwc/http.h"
#include "kwc/hub.h"
#include "kwc/log.h"
#include "kwc/pb.h"
#include "kwc/reflector.h"
#include "kwc/respond.h"
#include "kwc/route.h"
#include "kwc/selector.h"
#include "kwc/status.h"
#include "kwc/store.h"

#define CLOSE_GRACE_MS 10000       /* an ended stream's last bytes: then the socket closes anyway */
#define DEFAULT_MIN_TIMEOUT_S 1800 /* kube's minRequestTimeout: deadline in [1x, 2x) */
/* Bytes encoded from the store for single watchers (initial state, catch-up
 * behind the window) queued on one worker's sockets: beyond this a watcher
 * reads the next chunk only once its socket has taken everything queued.
 * Shared blobs do not count. With thousands of lagging or relisting
 * watchers this, not N x budget, bounds their memory; a stuck reader keeps
 * only what it already holds, so it cannot starve one that reads. */
#define PRIVATE_MAX (32u << 20)

#define WRITE_IOV (3 * 64) /* iovecs per writev: 64 entries of up to three */
/* Plaintext handed to a TLS stream's bufferevent at a time: about one TLS
 * record. Copies of shared events live only here, so this (not the budget,
 * which the shared ring mostly holds) is what 10,000 lagging TLS watchers
 * cost; refilled when it drains below half. */
#define TLS_OUT_MAX (16 * 1024)

enum msg_type { WMSG_BATCH, WMSG_WATCH, WMSG_STOP };

/* Bytes queued on a stream: a reference into a blob (shared, or private to
 * it when read from the store: then counted in the worker's private_bytes),
 * or bytes of its own (the head; freed when sent), or static bytes. The
 * blobs hold events only (hub.h): on an HTTP/1.1 stream the entry frames its
 * bytes as one chunk, the header "<hex>\r\n" in hdr and the trailer "\r\n"
 * static, so no framing is allocated per delivery. Sent in order: hdr, then
 * p, then the trailer; each field counts what is left of its part. 48 bytes
 * on LP64 (40 while the blobs carried the framing). */
struct qent {
    struct hub_blob *b;
    char *own;
    const char *p; /* next byte of the data to send */
    uint32_t len;  /* data bytes left (a blob is far below 4 GiB: OBJ_MAX_BYTES) */
    uint32_t acct; /* private bytes this entry counts for (framing included) */
    char hdr[12];  /* chunk header bytes left: hdr[0, hdrlen) ("%x\r\n" of a uint32) */
    uint8_t hdrlen;
    uint8_t trail; /* bytes of the trailer "\r\n" left: its last trail bytes */
};
_Static_assert(sizeof(struct qent) <= 48, "a queue entry stays small");

static const char CRLF[2] = {'\r', '\n'};

/* Bytes of e still to go on the wire. */
static size_t
qent_bytes(const struct qent *e)
{
    return (size_t)e->hdrlen + e->len + e->trail;
}

struct outq {
    struct qent *e; /* ring */
    size_t head, n, cap;
    size_t bytes;
};

struct wconn;

struct msg {
    enum msg_type type;
    struct msg *next;
    struct hub_batch *batch;
    struct wconn *wc;
};

struct worker {
    struct watch_pool *p;
    unsigned idx;
    pthread_t thread;
    struct event_base *base;
    int efd;
    struct event *wake_ev, *pump_ev;
    pthread_mutex_t mu;
    struct msg *head, **tail;
    /* worker-only state */
    struct hub *hub;
    struct wconn *all;    /* every stream this worker owns */
    struct wconn *dirty;  /* got bytes since the last flush */
    struct wconn *pumps;  /* owed stored events, socket has room */
    size_t private_bytes; /* store-encoded bytes queued on this worker's sockets */
    /* private_bytes for /metrics (a relaxed store; read by any thread) */
    _Atomic size_t private_seen;
    unsigned held;      /* streams waiting for private_bytes to fall */
    bool pumping_store; /* sink writes now are such bytes */
    bool stopping;
    struct hub_stats stats; /* published under mu after each round */
    _Atomic unsigned long long started, ended;
    struct hub_res_stats *rstats; /* per resource, written by this worker's hub (hub.h) */
};

/* One resource as the writer loop tracks it. */
struct pres {
    struct refl *rf;
    struct hub_res *hr; /* built at the first watch */
    uint64_t posted_rv;
    atomic_uint *count; /* per worker: watchers of it (main ++, worker --) */
};

struct watch_pool {
    struct event_base *base;
    struct store *st;
    struct watch_options o;
    struct refl *const *refls;
    struct admit_refls caches; /* admission's view of refls (points to itself) */
    struct pres *res;          /* res[i] is refls[i] */
    size_t nres;
    struct worker *w;
    unsigned nw;
    uint64_t rng[2];
    unsigned long long batches;
};

/* A watch stream on a worker. Allocated by the writer, owned by the worker
 * once posted. */
struct wconn {
    struct worker *wk;
    unsigned res;
    int fd;
    SSL *ssl;                /* TLS: moved into tls on the worker */
    struct bufferevent *tls; /* TLS: the stream's OpenSSL bufferevent (worker loop) */
    struct outq q;
    struct event *io, *timer;
    bool want_write, dirty, pumping, ending, http10;
    bool held;              /* owed store reads, waiting for private_bytes to fall */
    struct hub_watcher *hw; /* NULL once the hub let go of it */
    struct wconn *next_dirty, *next_pump;
    struct wconn *next_all, **prev_all;
    uint64_t end_by; /* ending: close at this time even if bytes remain */
    /* from the writer, consumed by the worker */
    char *head;
    struct hub_watch_req req;
    uint64_t posted_rv;
    int64_t timeout_s;
    uint64_t seed;
    struct access_rec *acc; /* the request's record, finished when the stream ends */
    uint64_t pushed;        /* bytes queued over the stream's life */
};

static uint64_t
now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- the sink a hub writes to ---- */

static void
q_push(struct wconn *c, struct qent ent)
{
    struct outq *q = &c->q;
    if (q->n == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 8;
        struct qent *ne = xmalloc(cap * sizeof(*ne));
        for (size_t i = 0; i < q->n; i++)
            ne[i] = q->e[(q->head + i) % q->cap];
        free(q->e);
        q->e = ne;
        q->cap = cap;
        q->head = 0;
    }
    q->e[(q->head + q->n++) % q->cap] = ent;
    q->bytes += qent_bytes(&ent);
    c->pushed += qent_bytes(&ent);
}

/* The first entry was sent (or is dropped). */
static void
q_pop(struct wconn *c)
{
    struct outq *q = &c->q;
    struct qent *e = &q->e[q->head];
    struct worker *wk = c->wk;
    q->bytes -= qent_bytes(e);
    hub_blob_unref(e->b);
    free(e->own);
    q->head = (q->head + 1) % q->cap;
    q->n--;
    if (e->acct) {
        wk->private_bytes -= e->acct;
        atomic_store_explicit(&wk->private_seen, wk->private_bytes, memory_order_relaxed);
        if (wk->held && wk->private_bytes < PRIVATE_MAX / 2 && !wk->stopping)
            event_active(wk->pump_ev, EV_TIMEOUT, 1); /* room again: on_pump wakes the held */
    }
}

static void
q_clear(struct wconn *c)
{
    while (c->q.n)
        q_pop(c);
    free(c->q.e);
    c->q.e = NULL;
    c->q.cap = c->q.head = 0;
}

/* writev what is queued; returns bytes written, or -1 with errno. */
static ssize_t
q_write(struct wconn *c)
{
    struct outq *q = &c->q;
    struct iovec iov[WRITE_IOV];
    int k = 0;
    for (size_t i = 0; i < q->n && k + 3 <= WRITE_IOV; i++) {
        struct qent *e = &q->e[(q->head + i) % q->cap];
        if (e->hdrlen)
            iov[k++] = (struct iovec){e->hdr, e->hdrlen};
        if (e->len)
            iov[k++] = (struct iovec){(void *)(uintptr_t)e->p, e->len};
        if (e->trail)
            iov[k++] = (struct iovec){(void *)(uintptr_t)(CRLF + 2 - e->trail), e->trail};
    }
    ssize_t n = writev(c->fd, iov, k);
    if (n <= 0)
        return n;
    /* what was written, entry by entry, part by part: a short write may
     * stop inside any of the three */
    size_t left = (size_t)n;
    while (left && q->n) {
        struct qent *e = &q->e[q->head];
        size_t before = qent_bytes(e), m = left < e->hdrlen ? left : e->hdrlen;
        memmove(e->hdr, e->hdr + m, e->hdrlen - m);
        e->hdrlen = (uint8_t)(e->hdrlen - m);
        left -= m;
        m = left < e->len ? left : e->len;
        e->p += m;
        e->len -= (uint32_t)m;
        left -= m;
        m = left < e->trail ? left : e->trail;
        e->trail = (uint8_t)(e->trail - m);
        left -= m;
        q->bytes -= before - qent_bytes(e);
        if (qent_bytes(e) > 0)
            break; /* left is 0 */
        q_pop(c);
    }
    return n;
}

static void
mark_dirty(struct wconn *c)
{
    if (c->dirty)
        return;
    c->dirty = true;
    c->next_dirty = c->wk->dirty;
    c->wk->dirty = c;
}

static void
sink_write(void *sink, struct hub_blob *b, const char *p, size_t len)
{
    struct wconn *c = sink;
    struct worker *wk = c->wk;
    if (len == 0)
        return; /* as a chunk it would end the stream */
    assert(len <= UINT32_MAX - 16);
    struct qent e = {.b = b, .p = p, .len = (uint32_t)len};
    if (!c->http10) {
        /* one write, one chunk */
        e.hdrlen = (uint8_t)snprintf(e.hdr, sizeof(e.hdr), "%x\r\n", (unsigned)len);
        e.trail = 2;
    }
    hub_blob_ref(b);
    e.acct = wk->pumping_store ? (uint32_t)qent_bytes(&e) : 0;
    wk->private_bytes += e.acct;
    if (e.acct)
        atomic_store_explicit(&wk->private_seen, wk->private_bytes, memory_order_relaxed);
    q_push(c, e);
    mark_dirty(c);
}

static size_t
conn_queued(const struct wconn *c)
{
    return c->q.bytes + (c->tls ? evbuffer_get_length(bufferevent_get_output(c->tls)) : 0);
}

static size_t
sink_queued(void *sink)
{
    return conn_queued(sink);
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
    if (conn_queued(c) < c->wk->p->o.budget / 2)
        want_pump(c);
}

static void
sink_end(void *sink, enum hub_end why)
{
    struct wconn *c = sink;
    c->hw = NULL;
    c->ending = true;
    c->end_by = now_ms() + CLOSE_GRACE_MS;
    if (!c->http10)
        q_push(c, (struct qent){.p = "0\r\n\r\n", .len = 5});
    log_debug("watch: stream ended (%s)", hub_end_name(why));
    mark_dirty(c);
}

static const struct hub_sink_ops sink_ops = {
    .write = sink_write,
    .queued = sink_queued,
    .wake = sink_wake,
    .end = sink_end,
};

/* ---- sockets ---- */

static void arm_timer(struct wconn *c);

static void
set_io(struct wconn *c, bool want_write)
{
    if (c->want_write == want_write)
        return;
    c->want_write = want_write;
    event_del(c->io);
    event_assign(c->io, c->wk->base, c->fd, EV_READ | EV_PERSIST | (want_write ? EV_WRITE : 0),
                 event_get_callback(c->io), c);
    event_add(c->io, NULL);
}

static void
conn_free(struct wconn *c)
{
    struct worker *wk = c->wk;
    access_stream_end(c->acc, c->pushed - conn_queued(c));
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
    if (c->io)
        event_free(c->io);
    if (c->timer)
        event_free(c->timer);
    q_clear(c);
    if (c->tls) {
        /* maybe inside its own callback: closed from the next loop turn
         * (and released from the connection cap) */
        http_bev_free(c->tls);
        c->fd = -1;
        c->ssl = NULL;
    }
    if (c->ssl)
        SSL_free(c->ssl);
    if (c->fd >= 0) {
        close(c->fd);
        http_taken_release();
    }
    atomic_fetch_sub(&wk->p->res[c->res].count[wk->idx], 1);
    wk->ended++;
    free(c->head);
    free(c->req.too_large_status);
    sel_free(c->req.sel);
    free(c);
}

/* TLS: move queued entries into the bufferevent while it holds little. */
static void
tls_feed(struct wconn *c)
{
    struct evbuffer *out = bufferevent_get_output(c->tls);
    struct outq *q = &c->q;
    while (q->n && evbuffer_get_length(out) < TLS_OUT_MAX) {
        struct qent *e = &q->e[q->head];
        evbuffer_add(out, e->hdr, e->hdrlen);
        evbuffer_add(out, e->p, e->len);
        evbuffer_add(out, CRLF + 2 - e->trail, e->trail);
        q_pop(c);
    }
}

/* Shutdown: one last try to send what is queued (the terminal chunk) and
 * close_notify, without the loop (it stops). Whatever does not fit is
 * dropped, as on a plaintext socket. */
static void
tls_last_write(struct wconn *c)
{
    SSL *ssl = bufferevent_openssl_get_ssl(c->tls);
    struct evbuffer *out = bufferevent_get_output(c->tls);
    for (int rounds = 0; rounds < 64 && (c->q.n || evbuffer_get_length(out)); rounds++) {
        tls_feed(c);
        size_t n = evbuffer_get_length(out);
        if (!n)
            break;
        int w = SSL_write(ssl, evbuffer_pullup(out, (ev_ssize_t)n), n > INT_MAX ? INT_MAX : (int)n);
        if (w <= 0)
            return; /* full, or a write libevent had begun: give up */
        evbuffer_drain(out, (size_t)w);
    }
    SSL_shutdown(ssl);
}

/* Write what is queued. Returns false when c was closed. */
static bool
flush(struct wconn *c)
{
    if (c->tls) {
        tls_feed(c);
        if (c->ending && conn_queued(c) == 0) {
            conn_free(c);
            return false;
        }
    } else {
        while (c->q.n > 0) {
            ssize_t n = q_write(c);
            if (n > 0)
                continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
                break;
            conn_free(c); /* the client is gone */
            return false;
        }
        if (c->ending && c->q.bytes == 0) {
            shutdown(c->fd, SHUT_WR);
            conn_free(c);
            return false;
        }
        set_io(c, c->q.bytes > 0);
    }
    size_t left = conn_queued(c);
    if (c->hw && hub_pump_wanted(c->hw) && left < c->wk->p->o.budget / 2)
        want_pump(c);
    return true;
}

/* ---- TLS streams: the bufferevent's callbacks ---- */

static void
on_tls_read(struct bufferevent *bev, void *arg)
{
    /* anything a client sends on a watch is dropped */
    struct evbuffer *in = bufferevent_get_input(bev);
    evbuffer_drain(in, evbuffer_get_length(in));
}

static void
on_tls_write(struct bufferevent *bev, void *arg)
{
    struct wconn *c = arg;
    bool ending = c->ending;
    if (flush(c) && ending)
        arm_timer(c);
}

static void
on_tls_event(struct bufferevent *bev, short what, void *arg)
{
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        conn_free(arg); /* the client is gone */
}

static void
on_io(evutil_socket_t fd, short what, void *arg)
{
    struct wconn *c = arg;
    if (what & EV_READ) {
        char buf[4096];
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            conn_free(c); /* client closed: nothing more to send */
            return;
        }
        /* anything a client sends on a watch is dropped */
    }
    if (what & EV_WRITE)
        flush(c);
}

static void
on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct wconn *c = arg;
    uint64_t now = now_ms();
    if (c->ending) {
        if (now >= c->end_by)
            conn_free(c);
        else
            arm_timer(c);
        return;
    }
    if (c->hw)
        hub_timer(c->hw, now);
    if (!flush(c))
        return;
    arm_timer(c);
}

static void
arm_timer(struct wconn *c)
{
    uint64_t at = c->ending ? c->end_by : c->hw ? hub_next_timer(c->hw) : 0;
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
        bool ending = c->ending;
        if (c->want_write && !ending)
            continue; /* its socket was full: the write event sends it (no EAGAIN try) */
        if (c->tls && !ending && evbuffer_get_length(bufferevent_get_output(c->tls)) >= TLS_OUT_MAX)
            continue; /* its write callback feeds it */
        if (flush(c) && ending)
            arm_timer(c);
    }
}

static void
publish_stats(struct worker *wk)
{
    pthread_mutex_lock(&wk->mu);
    hub_stats(wk->hub, &wk->stats);
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
        if (store && wk->private_bytes >= PRIVATE_MAX && c->q.n > 0) {
            if (!c->held) { /* again when its socket takes it all, or when there is room */
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
        /* to the socket now: a round over thousands of watchers must not
         * hold a chunk for each before the first is written (the kernel
         * takes most; the cap above counts what it does not) */
        bool ending = c->ending;
        if (flush(c) && ending)
            arm_timer(c);
    }
    flush_dirty(wk);
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
    c->timer = evtimer_new(wk->base, on_timer, c);
    if (c->ssl) {
        c->tls = bufferevent_openssl_socket_new(wk->base, c->fd, c->ssl, BUFFEREVENT_SSL_OPEN, 0);
        if (!c->tls)
            abort_msg("watch: cannot set up a TLS stream", ENOMEM);
        c->ssl = NULL; /* the bufferevent's now; http_bev_free frees it and the socket */
        bufferevent_openssl_set_allow_dirty_shutdown(c->tls, 1);
        bufferevent_setcb(c->tls, on_tls_read, on_tls_write, on_tls_event, c);
        bufferevent_setwatermark(c->tls, EV_WRITE, TLS_OUT_MAX / 2, 0);
        bufferevent_enable(c->tls, EV_READ | EV_WRITE);
    } else {
        c->io = event_new(wk->base, c->fd, EV_READ | EV_PERSIST, on_io, c);
        event_add(c->io, NULL);
    }
    wk->started++;
    size_t hl = strlen(c->head);
    char *head = xmalloc(hl);
    memcpy(head, c->head, hl);
    /* in entries of at most 4 GiB (an earlier response's tail may lead it);
     * the last one owns the bytes */
    for (size_t off = 0; off < hl;) {
        size_t n = hl - off < UINT32_MAX ? hl - off : UINT32_MAX;
        off += n;
        struct qent e = {.own = off == hl ? head : NULL, .p = head + off - n, .len = (uint32_t)n};
        q_push(c, e);
    }
    mark_dirty(c);
    uint64_t now = now_ms();
    if (c->timeout_s < 0)
        c->req.deadline_ms = now; /* ends at once, as kube's expired context does */
    else
        c->req.deadline_ms = now + (uint64_t)c->timeout_s * 1000;
    if (c->req.wait_until_ms)
        c->req.wait_until_ms += now;
    c->hw = hub_watch(wk->hub, wk->p->res[c->res].hr, &c->req, &sink_ops, c, c->posted_rv, now,
                      c->seed);
    free(c->head); /* also held req.ns, which hub_watch has copied */
    c->head = NULL;
    c->req.ns = NULL;
    if (c->hw || c->ending)
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
    while (wk->all) {
        struct wconn *c = wk->all;
        c->dirty = c->pumping = false;
        if (c->tls)
            tls_last_write(c);
        else if (c->q.n)
            (void)q_write(c);
        conn_free(c);
    }
    event_base_loopbreak(wk->base);
}

static void
on_wake(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct worker *wk = arg;
    uint64_t v;
    if (read(fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
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
            if (!wk->stopping)
                hub_apply(wk->hub, m->batch);
            hub_batch_unref(m->batch);
            break;
        case WMSG_WATCH:
            if (wk->stopping) {
                m->wc->wk = wk;
                conn_free(m->wc);
            } else {
                start_watch(wk, m->wc);
            }
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
    flush_dirty(wk);
    publish_stats(wk);
}

static void *
worker_main(void *arg)
{
    struct worker *wk = arg;
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
    uint64_t one = 1;
    if (write(wk->efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        log_warnx("watch: worker %u: eventfd write: %s", wk->idx, strerror(errno));
}

/* ---- the writer loop's side ---- */

/* Hand b to every worker with watchers of pr; takes the caller's reference. */
static void
post_batch(struct watch_pool *p, struct pres *pr, struct hub_batch *b)
{
    for (unsigned i = 0; i < p->nw; i++) {
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
    for (unsigned i = 0; i < p->nw; i++)
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
    for (size_t i = 0; i < p->nres; i++) {
        struct pres *pr = &p->res[i];
        if (pr->rf != r || !pr->hr)
            continue;
        /* a gap batch at the rv already posted: every watcher ends (clean) */
        struct hub_batch *b;
        if (hub_batch_build(p->st, pr->hr, pr->posted_rv, pr->posted_rv, false, &b) != 0)
            return;
        b->gap = true;
        post_batch(p, pr, b);
    }
}

void
watch_committed(void *arg)
{
    struct watch_pool *p = arg;
    for (size_t i = 0; i < p->nres; i++)
        if (p->res[i].hr)
            publish(p, &p->res[i]);
}

/* An error before the stream: kube's Status, through the response writer. */
static void
answer_error(struct watch_pool *p, struct hreq *req, struct decide_result *dec)
{
    char audit[RESPOND_AUDIT_ID_LEN];
    respond_audit_id(req, p->rng, audit);
    hresp_header(req, "Audit-Id", audit);
    respond_status_body(req, dec->code, dec->body, 0);
}

static char *
response_head(struct watch_pool *p, struct hreq *req, bool http10, enum kwc_enc enc)
{
    char audit[RESPOND_AUDIT_ID_LEN], date[64];
    respond_audit_id(req, p->rng, audit);
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    return xasprintf("HTTP/1.%d 200 OK\r\n"
                     "Audit-Id: %s\r\n"
                     "Cache-Control: no-cache, private\r\n"
                     "Content-Type: %s\r\n"
                     "Date: %s\r\n"
                     "%s"
                     "Connection: close\r\n\r\n",
                     http10 ? 0 : 1, audit,
                     enc == KWC_ENC_PB ? PB_WATCH_CONTENT_TYPE : "application/json", date,
                     http10 ? "" : "Transfer-Encoding: chunked\r\n");
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
        refl_want(p->refls[a.cache]);
    if (a.action == ADMIT_PASS)
        return WATCH_NOT_TAKEN;
    if (a.action == ADMIT_ERROR) {
        answer_error(p, req, &a.dec);
        admit_fini(&a);
        return WATCH_ANSWERED;
    }
    struct pres *pr = &p->res[a.cache];
    const struct refl_desc *d = refl_desc(pr->rf);
    struct decide_result dec = a.dec;
    uint64_t cur = a.current_rv;
    struct sel *sel = a.sel;

    if (!pr->hr) {
        pr->hr = hub_res_new_enc(d->enc, (unsigned)(pr - p->res), d->sres, d->kind, d->api_version,
                                 d->typed_items, d->namespaced, d->field_names, d->n_fields,
                                 d->index_field);
        pr->posted_rv = cur;
    } else {
        publish(p, pr); /* anything committed since the last hook goes first */
    }

    struct wconn *c = xcalloc(1, sizeof(*c));
    c->fd = -1;
    c->res = (unsigned)(pr - p->res);
    c->http10 = hreq_http10(req);
    c->head = response_head(p, req, c->http10, d->enc);
    c->req = (struct hub_watch_req){
        .ns = NULL,
        .sel = sel,
        .initial = dec.initial,
        .rv = dec.rv,
        .initial_end = dec.initial_end,
        .bookmarks = a.bookmarks,
    };
    if (dec.initial && dec.wait) {
        c->req.wait_until_ms = (uint64_t)p->o.wait_ms;
        if (p->o.too_large == DECIDE_TOO_LARGE_504) {
            struct decide_result t;
            struct decide_result w = {.rv = dec.rv, .on_timeout = DECIDE_ERROR};
            decide_timeout(&w, cur, &t);
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
    c->posted_rv = pr->posted_rv;
    c->seed = p->rng[0] ^ (p->rng[1] << 1) ^ (uint64_t)(uintptr_t)c;
    decide_result_fini(&dec);

    /* the previous response on this connection has left: the socket is ours */
    struct http_taken tk;
    if (hreq_take_socket(req, &tk) != 0) {
        free(c->head);
        free(c->req.too_large_status);
        sel_free(sel);
        free(c);
        return WATCH_STREAM; /* gone already */
    }
    c->fd = tk.fd;
    c->ssl = tk.ssl;
    c->acc = access_stream(tk.note, req, 200);
    if (r->namespace_ && d->namespaced) {
        /* the namespace must outlive the route request: keep a copy after the head */
        size_t hl = strlen(c->head), nl = strlen(r->namespace_);
        c->head = xrealloc(c->head, hl + 1 + nl + 1);
        memcpy(c->head + hl + 1, r->namespace_, nl + 1);
        c->req.ns = c->head + hl + 1;
    }
    unsigned wi = least_loaded(p, pr);
    atomic_fetch_add(&pr->count[wi], 1);
    struct msg *m = xcalloc(1, sizeof(*m));
    m->type = WMSG_WATCH;
    m->wc = c;
    post(&p->w[wi], m);
    return WATCH_STREAM;
}

/* ---- lifecycle ---- */

struct watch_pool *
watch_pool_new(struct event_base *base, struct store *st, struct refl *const *refls, size_t nrefls,
               const struct watch_options *o)
{
    struct watch_pool *p = xcalloc(1, sizeof(*p));
    p->base = base;
    p->st = st;
    p->o = *o;
    p->nw = o->workers;
    if (!p->nw) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        p->nw = n > 0 ? (unsigned)n : 1;
    }
    if (!p->o.budget)
        p->o.budget = 256 * 1024;
    respond_rng_seed(p->rng);
    p->refls = refls;
    p->nres = nrefls;
    admit_refls_init(&p->caches, refls, nrefls, st);
    p->res = xcalloc(nrefls ? nrefls : 1, sizeof(*p->res));
    for (size_t i = 0; i < nrefls; i++) {
        p->res[i].rf = refls[i];
        p->res[i].count = xcalloc(p->nw, sizeof(atomic_uint));
    }
    p->w = xcalloc(p->nw, sizeof(*p->w));
    struct hub_options ho = {
        .budget = p->o.budget, .bookmark_ms = o->bookmark_ms, .window_bytes = o->window_bytes};
    for (unsigned i = 0; i < p->nw; i++) {
        struct worker *wk = &p->w[i];
        wk->p = p;
        wk->idx = i;
        wk->base = event_base_new();
        wk->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (!wk->base || wk->efd < 0)
            abort_msg("watch: cannot create worker loop", errno);
        pthread_mutex_init(&wk->mu, NULL);
        wk->tail = &wk->head;
        wk->rstats = xcalloc(nrefls ? nrefls : 1, sizeof(*wk->rstats));
        ho.res_stats = wk->rstats;
        ho.n_res_stats = nrefls;
        wk->hub = hub_new(st, &ho);
        wk->wake_ev = event_new(wk->base, wk->efd, EV_READ | EV_PERSIST, on_wake, wk);
        wk->pump_ev = event_new(wk->base, -1, 0, on_pump, wk);
        event_add(wk->wake_ev, NULL);
        int rc = pthread_create(&wk->thread, NULL, worker_main, wk);
        if (rc)
            abort_msg("watch: cannot start a worker thread", rc);
    }
    return p;
}

void
watch_pool_free(struct watch_pool *p)
{
    if (!p)
        return;
    for (unsigned i = 0; i < p->nw; i++) {
        struct msg *m = xcalloc(1, sizeof(*m));
        m->type = WMSG_STOP;
        post(&p->w[i], m);
    }
    for (unsigned i = 0; i < p->nw; i++) {
        struct worker *wk = &p->w[i];
        pthread_join(wk->thread, NULL);
        /* messages posted after the stop (none from here on) */
        for (struct msg *m = wk->head, *next; m; m = next) {
            next = m->next;
            if (m->type == WMSG_BATCH)
                hub_batch_unref(m->batch);
            else if (m->type == WMSG_WATCH) {
                m->wc->wk = wk;
                conn_free(m->wc);
            }
            free(m);
        }
        event_free(wk->wake_ev);
        event_free(wk->pump_ev);
        /* deferred frees of TLS streams (http_bev_free) still queued */
        event_base_loop(wk->base, EVLOOP_NONBLOCK);
        event_base_free(wk->base);
        close(wk->efd);
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
watch_stats(struct watch_pool *p, struct watch_stats *out)
{
    memset(out, 0, sizeof(*out));
    for (unsigned i = 0; i < p->nw; i++) {
        struct worker *wk = &p->w[i];
        pthread_mutex_lock(&wk->mu);
        out->watchers += wk->stats.watchers;
        out->live += wk->stats.live;
        out->lagging += wk->stats.lagging;
        out->delivered += wk->stats.delivered;
        out->bookmarks += wk->stats.bookmarks;
        out->started += wk->started;
        out->ended += wk->ended;
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
    for (unsigned k = 0; k < p->nw; k++) {
        struct hub_res_stats s;
        hub_res_stats_read(&p->w[k].rstats[i], &s);
        out->watchers += atomic_load_explicit(&p->res[i].count[k], memory_order_relaxed);
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
    for (unsigned k = 0; k < p->nw; k++)
        n += atomic_load_explicit(&p->w[k].private_seen, memory_order_relaxed);
    return n;
}
