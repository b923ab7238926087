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
 *   - a framed reference (hstream_write_framed_ref: a shared blob framed
 *     once in its own room, hstream_frame) is one contiguous piece: header,
 *     data and trailer in one iovec;
 *   - TLS: the stream drives the SSL on its socket itself (a socket BIO,
 *     the same io event). A flush makes records of up to a full record's
 *     plaintext: a piece that fills one (or is all there is) goes to
 *     SSL_write straight from the shared bytes; several pieces are gathered
 *     into the loop thread's scratch first. One SSL_write = one record = one
 *     write(2). When the socket is full the record is already sealed in
 *     OpenSSL's buffer: the references whose bytes went into it are released
 *     at once, its length (pend) counts as queued, and it is retried with
 *     that length on the write event (SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER:
 *     from any buffer). Reads are drained through SSL_read and dropped;
 *     EOF, close_notify and errors close. SSL_MODE_RELEASE_BUFFERS (the
 *     context's) stays: an idle stream holds no OpenSSL record buffer;
 *   - kernel TLS (kTLS send on the SSL's socket BIO, htls.c's probe): the
 *     kernel makes the records, so the plaintext path serves;
 *   - an ended stream closes once its last bytes left, or after the grace
 *     (stream_grace_ms) if the client does not take them.
 * Writes only queue: the handler flushes (hstream_flush) once per round of
 * its own, so one writev (one TLS record) carries several writes.
 *
 * Everything here but hresp_handoff runs on the loop the stream is
 * attached to; hresp_handoff runs on the server's loop. A handoff or stream
 * of an HTTP/2 stream (its first field is H2HS_MAGIC) goes to h2stream.c.
 */
#include "conn.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <limits.h>
#include <openssl/err.h>
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
/* A TLS record's plaintext at most (TLS 1.2 and 1.3): one SSL_write. */
#define TLS_RECORD 16384
/* Request bytes dropped per read event over TLS before the loop turns */
#define TLS_READ_MAX (256 * 1024)

/* The loop thread's gather buffer for one record: filled and handed to
 * SSL_write in one call, never kept across calls (a sealed record is
 * OpenSSL's; its retry does not read the buffer). */
static _Thread_local char tls_scratch[TLS_RECORD];

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
    SSL *ssl;       /* TLS (freed before the socket is closed), NULL: plaintext */
    uint32_t pend;  /* TLS: plaintext of the sealed record OpenSSL still writes */
    uint32_t rec;   /* TLS: plaintext per record (SSL_write) at most */
    struct qent *e; /* ring */
    size_t head, n, cap;
    size_t bytes; /* queued in the ring */
    struct event *io, *grace;
    bool chunked, no_body, want_write, ending;
    bool ktls;        /* TLS whose records the kernel makes: the plaintext path */
    bool blocked;     /* a write waits for the socket (its io event sends it) */
    bool wr_on_read;  /* TLS: SSL_write wants to read first */
    bool rd_on_write; /* TLS: SSL_read wants to write first */
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

/* Bytes of the chunk header "%x\r\n" of n (hstream_frame's). */
static size_t
frame_head(size_t n)
{
    size_t h = 3;
    while (n >>= 4)
        h++;
    return h;
}

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

/* The queued pieces, in order, into iov[0, max) until they hold limit bytes
 * (the last may hold more); returns how many. */
static int
q_iov(const struct hstream *s, struct iovec *iov, int max, size_t limit)
{
    int k = 0;
    size_t got = 0;
    for (size_t i = 0; i < s->n && k + 3 <= max && got < limit; i++) {
        const struct qent *e = &s->e[(s->head + i) % s->cap];
        if (e->hdrlen)
            iov[k++] = (struct iovec){(void *)(uintptr_t)e->hdr, e->hdrlen};
        if (e->len)
            iov[k++] = (struct iovec){(void *)(uintptr_t)e->p, e->len};
        if (e->trail)
            iov[k++] = (struct iovec){(void *)(uintptr_t)(CRLF + 2 - e->trail), e->trail};
        got += qent_bytes(e);
    }
    return k;
}

/* n bytes of the ring left (sent, or sealed in a TLS record), entry by
 * entry, part by part: a short write may stop inside any of the three.
 * References whose bytes all left are released. */
static void
q_advance(struct hstream *s, size_t n)
{
    size_t left = n;
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
}

/* Send what is queued (one sendmsg of many entries); returns bytes written, or -1 with errno. */
static ssize_t
q_write(struct hstream *s)
{
    struct iovec iov[WRITE_IOV];
    int k = q_iov(s, iov, WRITE_IOV, SIZE_MAX);
    /* sendmsg, not writev: MSG_NOSIGNAL, so a client gone never raises
     * SIGPIPE whatever the process does with the signal */
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)k};
    ssize_t n = k ? sendmsg(s->fd, &mh, MSG_NOSIGNAL) : 0;
    if (n > 0)
        q_advance(s, (size_t)n);
    return n;
}

/* ---- TLS ---- */

/* Before an SSL call whose failure SSL_get_error judges: the thread's
 * error queue must hold nothing older (a stale entry would make a
 * WANT_WRITE fatal). ERR_clear_error costs ~110 ns even on an empty queue
 * (it frees 32 NULL pointers), ERR_peek_error ~15 ns: ~15 % of an
 * SSL_write of 1 KiB, bench/results/tls-record.md. */
static void
tls_clear_stale(void)
{
    if (ERR_peek_error())
        ERR_clear_error();
}

/* The next record's plaintext: the first piece alone when it fills a
 * record or is all that is queued (straight from its bytes), else the
 * pieces gathered into the scratch up to a record. Returns its length. */
static size_t
tls_next(struct hstream *s, const char **out)
{
    struct iovec iov[WRITE_IOV];
    int k = q_iov(s, iov, WRITE_IOV, s->rec);
    if (k == 0)
        return 0;
    if (k == 1 || iov[0].iov_len >= s->rec) {
        *out = iov[0].iov_base;
        return iov[0].iov_len < s->rec ? iov[0].iov_len : s->rec;
    }
    size_t n = 0;
    for (int i = 0; i < k && n < s->rec; i++) {
        size_t m = s->rec - n < iov[i].iov_len ? s->rec - n : iov[i].iov_len;
        memcpy(tls_scratch + n, iov[i].iov_base, m);
        n += m;
    }
    *out = tls_scratch;
    return n;
}

/* Records of what is queued until the socket is full. 1: all sent; 0: a
 * write waits (want_write / wr_on_read says for what); -1: the connection
 * failed. */
static int
tls_send(struct hstream *s)
{
    s->wr_on_read = false;
    for (;;) {
        const char *p = tls_scratch; /* a pending record: not read (moving buffer) */
        size_t len = s->pend;
        if (!len) {
            q_pop_sent(s);
            if (!s->n)
                return 1;
            len = tls_next(s, &p);
        }
        tls_clear_stale();
        int w = SSL_write(s->ssl, p, (int)len);
        if (w > 0) {
            if (s->pend)
                s->pend = 0;
            else
                q_advance(s, (size_t)w);
            continue;
        }
        switch (SSL_get_error(s->ssl, w)) {
        case SSL_ERROR_WANT_WRITE:
            /* out of a handshake message (a post-handshake one it owed)
             * nothing of ours was taken; else the record is sealed: its
             * bytes are OpenSSL's, the references go */
            if (!s->pend && !SSL_in_init(s->ssl)) {
                q_advance(s, len);
                s->pend = (uint32_t)len;
            }
            return 0;
        case SSL_ERROR_WANT_READ:
            s->wr_on_read = true; /* nothing taken: retried with the ring's bytes */
            return 0;
        default:
            ERR_clear_error();
            return -1;
        }
    }
}

/* Drain and drop what the client sent. false: it is gone (EOF,
 * close_notify, an error). */
static bool
tls_drain(struct hstream *s)
{
    char buf[4096];
    s->rd_on_write = false;
    for (size_t got = 0; got < TLS_READ_MAX; got += sizeof(buf)) {
        tls_clear_stale();
        int n = SSL_read(s->ssl, buf, (int)sizeof(buf));
        if (n > 0)
            continue; /* anything a client sends on a stream is dropped */
        int e = SSL_get_error(s->ssl, n);
        ERR_clear_error();
        if (e == SSL_ERROR_WANT_READ)
            return true;
        if (e == SSL_ERROR_WANT_WRITE) {
            s->rd_on_write = true;
            return true;
        }
        return false;
    }
    if (SSL_has_pending(s->ssl))
        event_active(s->io, EV_READ, 1); /* decrypted bytes the socket will not announce */
    return true;
}

/* Shutdown: one last non-blocking try to send what is queued and a
 * close_notify, without the loop (it stops). Whatever does not fit is
 * dropped, as on a plaintext socket. */
static void
tls_last_write(struct hstream *s)
{
    if (tls_send(s) < 0 || s->pend)
        return;
    ERR_clear_error();
    SSL_shutdown(s->ssl);
    ERR_clear_error();
}

/* ---- closing ---- */

size_t
hstream_queued(const struct hstream *s)
{
    if (h2hs_is(s))
        return h2hs_queued(s);
    stream_of(s);
    return s->bytes + s->pend;
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
    if (s->ssl)
        SSL_free(s->ssl); /* its BIO does not own the socket */
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

/* TLS: the io event waits for the socket's room (a record to write, or a
 * read that has to write first). */
static bool
tls_want_write(const struct hstream *s)
{
    return (s->blocked && !s->wr_on_read) || s->rd_on_write;
}

/* The stream ended and its last bytes left: close_notify over TLS, FIN. */
static void
finish(struct hstream *s)
{
    if (s->ssl) {
        ERR_clear_error();
        SSL_shutdown(s->ssl); /* one try: the socket had room for the rest */
        ERR_clear_error();
    }
    shutdown(s->fd, SHUT_WR);
    stream_free(s, true);
}

/* Write what is queued. Returns false when s was closed (on_close ran). */
static bool
flush(struct hstream *s)
{
    if (s->ssl && !s->ktls) {
        int rc = tls_send(s);
        if (rc < 0) {
            stream_free(s, true); /* the client is gone */
            return false;
        }
        if (s->ending && rc == 1) {
            finish(s);
            return false;
        }
        s->blocked = rc == 0;
        set_io(s, tls_want_write(s));
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
        finish(s);
        return false;
    }
    s->blocked = s->bytes > 0;
    set_io(s, s->blocked);
    return true;
}

bool
hstream_flush(struct hstream *s)
{
    if (h2hs_is(s))
        return h2hs_flush(s);
    stream_of(s);
    if (s->blocked)
        return true; /* its socket was full: its io event sends it (no EAGAIN try) */
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
    if (s->ssl && !s->ktls) {
        if (((what & EV_READ) || (s->rd_on_write && (what & EV_WRITE))) && !tls_drain(s)) {
            stream_free(s, true); /* client closed: nothing more to send */
            return;
        }
        if ((what & EV_WRITE) || (s->wr_on_read && (what & EV_READ))) {
            s->blocked = false;
            sent_from_event(s);
        } else {
            set_io(s, tls_want_write(s));
        }
        return;
    }
    if (what & EV_READ) {
        char buf[4096];
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            stream_free(s, true); /* client closed: nothing more to send */
            return;
        }
        /* anything a client sends on a stream is dropped (kTLS: records
         * the kernel does not decrypt, the client's close_notify among
         * them; its EOF still closes) */
    }
    if (what & EV_WRITE) {
        s->blocked = false;
        sent_from_event(s);
    }
}

static void
on_grace(evutil_socket_t fd, short what, void *arg)
{
    stream_free(stream_of(arg), true); /* its last bytes did not leave in time */
}

/* ---- the stream (its loop) ---- */

/* The connection's SSL, now driven here: it must sit on a socket BIO of
 * the stream's socket (the connection's OpenSSL bufferevent made one that
 * does not own the socket, and frees neither it nor the SSL: http.c
 * created it without BEV_OPT_CLOSE_ON_FREE). false: it cannot be set up. */
static bool
tls_adopt(struct hstream *s, SSL *ssl)
{
    if (SSL_get_fd(ssl) != s->fd && SSL_set_fd(ssl, s->fd) != 1)
        return false;
    /* a sealed record is retried from another buffer (pend, the scratch);
     * writes never exceed one record, so partial writes never happen */
    SSL_set_mode(ssl, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    s->ssl = ssl;
    s->rec = TLS_RECORD;
    /* a client's max_fragment_length (RFC 6066) makes records smaller:
     * one SSL_write must stay one record, or a sealed record's retry would
     * read its buffer */
    uint8_t mfl = SSL_SESSION_get_max_fragment_length(SSL_get0_session(ssl));
    if (mfl >= TLSEXT_max_fragment_length_512 && mfl <= TLSEXT_max_fragment_length_4096)
        s->rec = 512u << (mfl - TLSEXT_max_fragment_length_512);
    /* kTLS send (D3: htls.c enables it when the kernel has the tls ULP):
     * the kernel makes the records from what is written to the socket, so
     * the plaintext sendmsg path serves; the SSL stays for the close */
    s->ktls = BIO_get_ktls_send(SSL_get_wbio(ssl));
    return true;
}

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
    s->io = event_new(base, h->fd, EV_READ | EV_PERSIST, on_io, s);
    if (!s->grace || !s->io || (h->ssl && !tls_adopt(s, h->ssl))) {
        if (s->io)
            event_free(s->io);
        if (s->grace)
            event_free(s->grace);
        free(s);
        hstream_handoff_free(h); /* closes the connection */
        return NULL;
    }
    h->ssl = NULL; /* the stream's */
    event_add(s->io, NULL);
    if (s->ssl && !s->ktls)
        event_active(s->io, EV_READ, 1); /* what the connection's reads left in the SSL */
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
    /* framed in place: one piece */
    char *own = xmalloc(HSTREAM_FRAME_HEAD + n + HSTREAM_FRAME_TAIL),
         *at = own + HSTREAM_FRAME_HEAD;
    memcpy(at, p, n);
    struct qent e = {.own = own, .p = at, .len = (uint32_t)n};
    if (s->chunked) {
        size_t h = frame_head(n);
        hstream_frame(at, n);
        e.p = at - h;
        e.len = (uint32_t)(h + n + HSTREAM_FRAME_TAIL);
    }
    q_push(s, e);
}

void
hstream_frame(char *p, size_t n)
{
    assert(n > 0 && n <= UINT32_MAX - 16);
    char hdr[HSTREAM_FRAME_HEAD + 1];
    int h = snprintf(hdr, sizeof(hdr), "%x\r\n", (unsigned)n);
    memcpy(p - h, hdr, (size_t)h);
    memcpy(p + n, CRLF, HSTREAM_FRAME_TAIL);
}

void
hstream_write_framed_ref(struct hstream *s, void *owner, uint32_t tag, const char *p, size_t n)
{
    if (h2hs_is(s) || !stream_of(s)->chunked || s->no_body || n == 0) {
        hstream_write_ref(s, owner, tag, p, n); /* the bytes as they are */
        return;
    }
    assert(!s->ending && n <= UINT32_MAX - 16);
    size_t h = frame_head(n);
    /* header, data, trailer: one piece (hstream_frame wrote them) */
    assert(memcmp(p + n, CRLF, 2) == 0 && p[-1] == '\n' && p[-2] == '\r');
    q_push(s, (struct qent){.owner = owner,
                            .tag = tag,
                            .p = p - h,
                            .len = (uint32_t)(h + n + HSTREAM_FRAME_TAIL)});
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
    if (s->ssl && !s->ktls) {
        tls_last_write(s);
    } else {
        q_pop_sent(s);
        if (s->n)
            (void)q_write(s);
    }
    return stream_free(s, false);
}
