/*
 * h1stream.c — response streams over HTTP/1.1 (hresp_handoff, hstream_*:
 * see http.h): a watch's body, written by a worker loop.
 *
 * The handoff: after hresp_start(r, 200, -1) the connection leaves the
 * server (http.c forgets it; it keeps counting against max_connections
 * until the stream closes) with its socket, its SSL state and the head
 * bytes still in the bufferevent's output. The loop that attaches it
 * drives the socket itself from then on:
 *   - a ring of entries, each one write: a reference into the handler's
 *     blob (or bytes of its own, or static bytes) with the chunk framing
 *     inline, the header "<hex>\r\n" in hdr and the trailer "\r\n" static,
 *     so no framing is allocated per write (48 bytes an entry; libevent's
 *     evbuffer_add_reference allocates a 1 KiB chain for each, as much as
 *     copying a small event);
 *   - plaintext: writev of many entries at once, write interest only while
 *     bytes are queued, one persistent read event (EOF = client gone;
 *     request bytes are dropped); after the terminal chunk has left,
 *     shutdown(SHUT_WR) and close;
 *   - TLS: entries are copied into an OpenSSL bufferevent on the loop
 *     (encryption copies anyway) while it holds less than TLS_OUT_MAX, and
 *     its write callback asks for more; what it holds counts as queued;
 *   - an ended stream closes once its last bytes left, or after the grace
 *     (stream_grace_ms) if the client does not take them.
 * Writes only queue: the handler flushes (hstream_flush) once per round of
 * its own, so one writev carries several writes.
 *
 * Everything here but hresp_handoff runs on the loop the stream is
 * attached to; hresp_handoff runs on the server's loop. A handoff or stream
 * of an HTTP/2 stream (its first field is H2HS_MAGIC) goes to h2stream.c.
 */
#include "conn.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <limits.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "kwc/base.h"

#define HANDOFF_MAGIC 0x68686f66u /* "hhof" */
#define STREAM_MAGIC 0x68737472u  /* "hstr" */
#define DEFAULT_GRACE_MS 10000
#define WRITE_IOV (3 * 64) /* iovecs per writev: 64 entries of up to three */
/* Plaintext handed to a TLS stream's bufferevent at a time: about one TLS
 * record. Copies of shared bytes live only here, so this (not the ring,
 * which holds references) is what 10,000 lagging TLS streams cost;
 * refilled when it drains below half. */
#define TLS_OUT_MAX (16 * 1024)

struct hstream_handoff {
    uint32_t magic;
    int fd;
    SSL *ssl;   /* NULL: plaintext */
    char *head; /* bytes of the connection not yet written (the head) */
    size_t nhead;
    uint64_t sent; /* bytes of the response that left before the handoff */
    void *note;
    bool chunked, no_body;
    int grace_ms;
};

/* Bytes queued on a stream: a reference into the handler's blob (owner,
 * released with tag), or bytes of its own (own: freed when sent), or
 * static bytes. Sent in order: hdr, then p, then the trailer; each field
 * counts what is left of its part. */
struct qent {
    void *owner;
    char *own;
    const char *p; /* next byte of the data to send */
    uint32_t len;  /* data bytes left */
    uint32_t tag;
    char hdr[12]; /* chunk header bytes left: hdr[0, hdrlen) ("%x\r\n" of a uint32) */
    uint8_t hdrlen;
    uint8_t trail; /* bytes of the trailer "\r\n" left: its last trail bytes */
};
_Static_assert(sizeof(struct qent) <= 48, "a queue entry stays small");

static const char CRLF[2] = {'\r', '\n'};

struct hstream {
    uint32_t magic;
    struct event_base *base;
    const struct hstream_ops *ops;
    void *arg;
    int fd;
    struct bufferevent *tls; /* TLS: owns the SSL; the socket is closed by tls_free */
    struct qent *e;          /* ring */
    size_t head, n, cap;
    size_t bytes; /* queued in the ring */
    struct event *io, *grace;
    bool chunked, no_body, want_write, ending;
    int grace_ms;
    uint64_t pushed; /* bytes queued over the stream's life, head included */
};

static size_t
qent_bytes(const struct qent *e)
{
    return (size_t)e->hdrlen + e->len + e->trail;
}

static struct hstream *
stream_of(const struct hstream *s)
{
    assert(s && s->magic == STREAM_MAGIC);
    return (struct hstream *)(uintptr_t)s;
}

/* ---- the handoff (the server's loop) ---- */

struct hstream_handoff *
hresp_handoff(struct hreq *r)
{
    if (hreq_of(r)->h2)
        return h2_resp_handoff(r); /* h2stream.c */
    struct hconn *c = hreq_of(r)->c;
    assert(r->started && !r->ended);
    if (c->state == C_DEAD)
        return NULL;
    struct hstream_handoff *h = xcalloc(1, sizeof(*h));
    h->magic = HANDOFF_MAGIC;
    h->fd = c->fd;
    h->ssl = c->ssl;
    h->chunked = r->streamed_chunked;
    h->no_body = r->no_body;
    h->grace_ms = c->s->o.stream_grace_ms > 0 ? c->s->o.stream_grace_ms : DEFAULT_GRACE_MS;
    /* what the bufferevent has not written yet: the head (the previous
     * response on the connection left before this request was handed out) */
    struct evbuffer *out = bufferevent_get_output(c->bev);
    h->nhead = evbuffer_get_length(out);
    assert(h->nhead < UINT32_MAX);
    if (h->nhead) {
        h->head = xmalloc(h->nhead);
        /* a bufferevent keeps its output's start frozen (only it drains
         * it): this one never writes again */
        evbuffer_unfreeze(out, 1);
        ev_ssize_t got = evbuffer_remove(out, h->head, h->nhead);
        assert(got == (ev_ssize_t)h->nhead);
        (void)got;
    }
    h->sent = r->bytes > h->nhead ? r->bytes - h->nhead : 0;
    h->note = r->note;
    r->note = NULL;
    r->ended = true;
    r->taken = true;
    hconn_taken(1); /* released when the stream closes */
    /* the server forgets the connection without closing it */
    c->fd = -1;
    c->ssl = NULL;
    hconn_close(c);
    return h;
}

struct event_base *
hstream_handoff_home(const struct hstream_handoff *h)
{
    if (h2hs_is(h))
        return h2hs_home(h);
    assert(h->magic == HANDOFF_MAGIC);
    return NULL;
}

void *
hstream_handoff_note(const struct hstream_handoff *h)
{
    if (h2hs_is(h))
        return h2hs_note(h);
    assert(h->magic == HANDOFF_MAGIC);
    return h->note;
}

void
hstream_handoff_free(struct hstream_handoff *h)
{
    if (h && h2hs_is(h)) {
        h2hs_handoff_free(h);
        return;
    }
    if (!h)
        return;
    assert(h->magic == HANDOFF_MAGIC);
    if (h->ssl)
        SSL_free(h->ssl);
    close(h->fd);
    hconn_taken(-1);
    free(h->head);
    h->magic = 0;
    free(h);
}

/* ---- the ring ---- */

static void
q_push(struct hstream *s, struct qent ent)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        struct qent *ne = xmalloc(cap * sizeof(*ne));
        for (size_t i = 0; i < s->n; i++)
            ne[i] = s->e[(s->head + i) % s->cap];
        free(s->e);
        s->e = ne;
        s->cap = cap;
        s->head = 0;
    }
    s->e[(s->head + s->n++) % s->cap] = ent;
    s->bytes += qent_bytes(&ent);
    s->pushed += qent_bytes(&ent);
}

/* The first entry was sent (or is dropped). */
static void
q_pop(struct hstream *s)
{
    struct qent e = s->e[s->head];
    s->bytes -= qent_bytes(&e);
    s->head = (s->head + 1) % s->cap;
    s->n--;
    free(e.own);
    if (e.owner)
        s->ops->release(s->arg, e.owner, e.tag);
}

/* Entries with nothing left to send go (references whose bytes left). */
static void
q_pop_sent(struct hstream *s)
{
    while (s->n && qent_bytes(&s->e[s->head]) == 0)
        q_pop(s);
}

/* writev what is queued; returns bytes written, or -1 with errno. */
static ssize_t
q_write(struct hstream *s)
{
    struct iovec iov[WRITE_IOV];
    int k = 0;
    for (size_t i = 0; i < s->n && k + 3 <= WRITE_IOV; i++) {
        struct qent *e = &s->e[(s->head + i) % s->cap];
        if (e->hdrlen)
            iov[k++] = (struct iovec){e->hdr, e->hdrlen};
        if (e->len)
            iov[k++] = (struct iovec){(void *)(uintptr_t)e->p, e->len};
        if (e->trail)
            iov[k++] = (struct iovec){(void *)(uintptr_t)(CRLF + 2 - e->trail), e->trail};
    }
    ssize_t n = k ? writev(s->fd, iov, k) : 0;
    if (n < 0)
        return n;
    /* what was written, entry by entry, part by part: a short write may
     * stop inside any of the three */
    size_t left = (size_t)n;
    while (s->n) {
        struct qent *e = &s->e[s->head];
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
        s->bytes -= before - qent_bytes(e);
        if (qent_bytes(e) > 0)
            break; /* left is 0 */
        q_pop(s);
    }
    return n;
}

/* ---- closing ---- */

static void
on_tls_free(evutil_socket_t fd_, short what, void *arg)
{
    struct bufferevent *bev = arg;
    SSL *ssl = bufferevent_openssl_get_ssl(bev);
    int fd = bufferevent_getfd(bev);
    bufferevent_free(bev);
    if (ssl)
        SSL_free(ssl);
    if (fd >= 0)
        close(fd);
}

/* The caller may be inside one of bev's callbacks, which may still use the
 * SSL when it returns: the socket and SSL go from the next loop turn. */
static void
tls_free(struct bufferevent *bev)
{
    bufferevent_setcb(bev, NULL, NULL, NULL, NULL);
    bufferevent_disable(bev, EV_READ | EV_WRITE);
    struct timeval zero = {0, 0};
    if (event_base_once(bufferevent_get_base(bev), -1, EV_TIMEOUT, on_tls_free, bev, &zero) != 0)
        on_tls_free(-1, 0, bev);
}

size_t
hstream_queued(const struct hstream *s)
{
    if (h2hs_is(s))
        return h2hs_queued(s);
    stream_of(s);
    return s->bytes + (s->tls ? evbuffer_get_length(bufferevent_get_output(s->tls)) : 0);
}

/* Release every reference, close the connection, free s; on_close (when
 * notify) between the releases and the free. Returns the bytes sent. */
static uint64_t
stream_free(struct hstream *s, bool notify)
{
    uint64_t sent = s->pushed - hstream_queued(s);
    while (s->n)
        q_pop(s);
    free(s->e);
    if (s->io)
        event_free(s->io);
    if (s->grace)
        event_free(s->grace);
    if (s->tls)
        tls_free(s->tls);
    else
        close(s->fd);
    hconn_taken(-1);
    if (notify)
        s->ops->on_close(s->arg, sent);
    s->magic = 0;
    free(s);
    return sent;
}

/* ---- sending ---- */

static void
set_io(struct hstream *s, bool want_write)
{
    if (s->want_write == want_write)
        return;
    s->want_write = want_write;
    event_del(s->io);
    event_assign(s->io, s->base, s->fd, EV_READ | EV_PERSIST | (want_write ? EV_WRITE : 0),
                 event_get_callback(s->io), s);
    event_add(s->io, NULL);
}

/* TLS: move queued entries into the bufferevent while it holds little. */
static void
tls_feed(struct hstream *s)
{
    struct evbuffer *out = bufferevent_get_output(s->tls);
    while (s->n && evbuffer_get_length(out) < TLS_OUT_MAX) {
        struct qent *e = &s->e[s->head];
        evbuffer_add(out, e->hdr, e->hdrlen);
        evbuffer_add(out, e->p, e->len);
        evbuffer_add(out, CRLF + 2 - e->trail, e->trail);
        q_pop(s);
    }
}

/* Shutdown: one last try to send what is queued and close_notify, without
 * the loop (it stops). Whatever does not fit is dropped, as on a plaintext
 * socket. */
static void
tls_last_write(struct hstream *s)
{
    SSL *ssl = bufferevent_openssl_get_ssl(s->tls);
    struct evbuffer *out = bufferevent_get_output(s->tls);
    for (int rounds = 0; rounds < 64 && (s->n || evbuffer_get_length(out)); rounds++) {
        tls_feed(s);
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

/* Write what is queued. Returns false when s was closed (on_close ran). */
static bool
flush(struct hstream *s)
{
    if (s->tls) {
        tls_feed(s);
        if (s->ending && hstream_queued(s) == 0) {
            stream_free(s, true);
            return false;
        }
        return true;
    }
    q_pop_sent(s);
    while (s->n > 0) {
        ssize_t n = q_write(s);
        if (n > 0 || (n == 0 && s->n == 0))
            continue; /* (0: only entries with nothing to send were left) */
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            break;
        stream_free(s, true); /* the client is gone */
        return false;
    }
    if (s->ending && s->bytes == 0) {
        shutdown(s->fd, SHUT_WR);
        stream_free(s, true);
        return false;
    }
    set_io(s, s->bytes > 0);
    return true;
}

bool
hstream_flush(struct hstream *s)
{
    if (h2hs_is(s))
        return h2hs_flush(s);
    stream_of(s);
    if (s->want_write)
        return true; /* its socket was full: the write event sends it (no EAGAIN try) */
    return flush(s);
}

static void
sent_from_event(struct hstream *s)
{
    if (flush(s) && !s->ending && s->ops->on_sent)
        s->ops->on_sent(s->arg, hstream_queued(s));
}

/* ---- events ---- */

static void
on_io(evutil_socket_t fd, short what, void *arg)
{
    struct hstream *s = stream_of(arg);
    if (what & EV_READ) {
        char buf[4096];
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            stream_free(s, true); /* client closed: nothing more to send */
            return;
        }
        /* anything a client sends on a stream is dropped */
    }
    if (what & EV_WRITE)
        sent_from_event(s);
}

static void
on_tls_read(struct bufferevent *bev, void *arg)
{
    /* anything a client sends on a stream is dropped */
    struct evbuffer *in = bufferevent_get_input(bev);
    evbuffer_drain(in, evbuffer_get_length(in));
}

static void
on_tls_write(struct bufferevent *bev, void *arg)
{
    sent_from_event(stream_of(arg));
}

static void
on_tls_event(struct bufferevent *bev, short what, void *arg)
{
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        stream_free(stream_of(arg), true); /* the client is gone */
}

static void
on_grace(evutil_socket_t fd, short what, void *arg)
{
    stream_free(stream_of(arg), true); /* its last bytes did not leave in time */
}

/* ---- the stream (its loop) ---- */

struct hstream *
hstream_attach(struct hstream_handoff *h, struct event_base *base, const struct hstream_ops *ops,
               void *arg)
{
    if (h2hs_is(h))
        return h2hs_attach(h, base, ops, arg);
    assert(h && h->magic == HANDOFF_MAGIC);
    struct hstream *s = xcalloc(1, sizeof(*s));
    s->magic = STREAM_MAGIC;
    s->base = base;
    s->ops = ops;
    s->arg = arg;
    s->fd = h->fd;
    s->chunked = h->chunked;
    s->no_body = h->no_body;
    s->grace_ms = h->grace_ms;
    s->pushed = h->sent;
    s->grace = evtimer_new(base, on_grace, s);
    if (h->ssl) {
        s->tls = bufferevent_openssl_socket_new(base, h->fd, h->ssl, BUFFEREVENT_SSL_OPEN, 0);
        if (s->tls) {
            h->ssl = NULL; /* the bufferevent's now; tls_free frees it and the socket */
            bufferevent_openssl_set_allow_dirty_shutdown(s->tls, 1);
            bufferevent_setcb(s->tls, on_tls_read, on_tls_write, on_tls_event, s);
            bufferevent_setwatermark(s->tls, EV_WRITE, TLS_OUT_MAX / 2, 0);
            bufferevent_enable(s->tls, EV_READ | EV_WRITE);
        }
    } else {
        s->io = event_new(base, h->fd, EV_READ | EV_PERSIST, on_io, s);
        if (s->io)
            event_add(s->io, NULL);
    }
    if (!s->grace || (!s->tls && !s->io)) {
        if (s->io)
            event_free(s->io);
        if (s->grace)
            event_free(s->grace);
        free(s);
        hstream_handoff_free(h); /* closes the connection */
        return NULL;
    }
    if (h->nhead) {
        q_push(s, (struct qent){.own = h->head, .p = h->head, .len = (uint32_t)h->nhead});
        h->head = NULL;
    }
    h->magic = 0;
    free(h);
    return s;
}

void
hstream_write_ref(struct hstream *s, void *owner, uint32_t tag, const char *p, size_t n)
{
    if (h2hs_is(s)) {
        h2hs_write_ref(s, owner, tag, p, n);
        return;
    }
    stream_of(s);
    assert(!s->ending && n <= UINT32_MAX - 16);
    struct qent e = {.owner = owner, .tag = tag, .p = p, .len = (uint32_t)n};
    if (s->no_body || n == 0) {
        e.len = 0; /* nothing to send: released at the next flush */
    } else if (s->chunked) {
        /* one write, one chunk */
        e.hdrlen = (uint8_t)snprintf(e.hdr, sizeof(e.hdr), "%x\r\n", (unsigned)n);
        e.trail = 2;
    }
    q_push(s, e);
}

void
hstream_write(struct hstream *s, const void *p, size_t n)
{
    if (h2hs_is(s)) {
        h2hs_write(s, p, n);
        return;
    }
    stream_of(s);
    assert(!s->ending && n <= UINT32_MAX - 16);
    if (s->no_body || n == 0)
        return;
    char *own = xmalloc(n);
    memcpy(own, p, n);
    struct qent e = {.own = own, .p = own, .len = (uint32_t)n};
    if (s->chunked) {
        e.hdrlen = (uint8_t)snprintf(e.hdr, sizeof(e.hdr), "%x\r\n", (unsigned)n);
        e.trail = 2;
    }
    q_push(s, e);
}

void
hstream_end(struct hstream *s)
{
    if (h2hs_is(s)) {
        h2hs_end(s);
        return;
    }
    stream_of(s);
    if (s->ending)
        return;
    s->ending = true;
    if (s->chunked)
        q_push(s, (struct qent){.p = "0\r\n\r\n", .len = 5});
    struct timeval tv = {s->grace_ms / 1000, (s->grace_ms % 1000) * 1000};
    evtimer_add(s->grace, &tv);
}

uint64_t
hstream_close(struct hstream *s)
{
    if (h2hs_is(s))
        return h2hs_close(s);
    stream_of(s);
    if (s->tls) {
        tls_last_write(s);
    } else {
        q_pop_sent(s);
        if (s->n)
            (void)q_write(s);
    }
    return stream_free(s, false);
}
