/*
 * hpipe.c — the byte pipe an HTTP/1.1 connection becomes after its Upgrade
 * request (see http.h, hreq_take_pipe): the connection's bufferevent (a
 * socket, or OpenSSL over it) leaves the server and carries unframed bytes
 * both ways for one handler (a tunnel), which never sees the socket or the
 * TLS state.
 *
 * Only HTTP/1.1 has pipes: an HTTP/2 request is never an upgrade (h2 rejects
 * upgrades at its protocol), so hreq_take_pipe never applies to one.
 *
 * The pipe owns the bufferevent, which was made without
 * BEV_OPT_CLOSE_ON_FREE (http.c), so hpipe_free closes the socket and frees
 * the SSL itself, from the next loop turn: a bufferevent freed inside its
 * own callback may still use its SSL when the callback returns. The
 * connection, and the sockets its request counted (hreq_count_socket),
 * count against max_connections until hpipe_free.
 *
 * Announcing: bytes already in the input when the pipe is made (those the
 * client sent behind its request), or when reading is turned back on, get
 * an on_read from the loop (the announce event), never from inside the
 * handler's own call.
 */
#include "conn.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <openssl/ssl.h>
#include <stdlib.h>
#include <unistd.h>

#include "kwc/base.h"

#define PIPE_MAGIC 0x68706970u /* "hpip" */

struct hpipe {
    uint32_t magic;
    struct bufferevent *bev;
    const struct hpipe_ops *ops;
    void *arg;
    struct event *announce; /* on_read for bytes already in the input */
    unsigned counted;       /* descriptors counted as taken: the connection and r's sockets */
    bool reading, eof;
};

static struct hpipe *
pipe_of(void *arg)
{
    struct hpipe *p = arg;
    assert(p && p->magic == PIPE_MAGIC);
    return p;
}

static void
announce_if_any(struct hpipe *p)
{
    if (p->reading && evbuffer_get_length(bufferevent_get_input(p->bev)))
        event_active(p->announce, EV_TIMEOUT, 1);
}

/* ---- the bufferevent's callbacks ---- */

static void
on_announce(evutil_socket_t fd, short what, void *arg)
{
    struct hpipe *p = pipe_of(arg);
    if (p->reading && evbuffer_get_length(bufferevent_get_input(p->bev)) && p->ops->on_read)
        p->ops->on_read(p->arg);
}

static void
on_read(struct bufferevent *bev, void *arg)
{
    struct hpipe *p = pipe_of(arg);
    if (p->reading && p->ops->on_read)
        p->ops->on_read(p->arg);
}

static void
on_write(struct bufferevent *bev, void *arg)
{
    struct hpipe *p = pipe_of(arg);
    if (p->ops->on_drain)
        p->ops->on_drain(p->arg);
}

static void
on_event(struct bufferevent *bev, short what, void *arg)
{
    struct hpipe *p = pipe_of(arg);
    if (what & BEV_EVENT_ERROR) {
        p->eof = true;
        bufferevent_disable(bev, EV_READ | EV_WRITE);
        event_del(p->announce);
        if (p->ops->on_error)
            p->ops->on_error(p->arg);
        return;
    }
    if (!(what & BEV_EVENT_EOF) || p->eof)
        return;
    p->eof = true;
    bufferevent_disable(bev, EV_READ);
    event_del(p->announce);
    /* what came before the end is the handler's before it hears of the end;
     * on_read may free the pipe */
    if (p->reading && evbuffer_get_length(bufferevent_get_input(bev)) && p->ops->on_read) {
        p->ops->on_read(p->arg);
        if (p->magic != PIPE_MAGIC)
            return;
    }
    if (p->ops->on_eof)
        p->ops->on_eof(p->arg);
}

/* ---- the pipe ---- */

struct hpipe *
hreq_take_pipe(struct hreq *r, const struct hpipe_ops *ops, void *arg)
{
    struct hconn *c = hreq_of(r)->c;
    if (c->state == C_DEAD)
        return NULL;
    if (r->h2) {
        hresp_abort(r); /* HTTP/2 has no upgrades: this stream only */
        return NULL;
    }
    if (!r->upgrade || !r->complete || r->started) {
        hconn_close(c); /* a handler's mistake: the request cannot go on */
        return NULL;
    }
    struct hpipe *p = xcalloc(1, sizeof(*p));
    p->magic = PIPE_MAGIC;
    p->ops = ops;
    p->arg = arg;
    p->announce = event_new(c->s->base, -1, 0, on_announce, p);
    /* the connection (counted by hconn_leave) and the request's sockets */
    p->counted = 1 + r->sockets;
    r->sockets = 0;
    p->bev = hconn_leave(c); /* r's on_close runs here */
    p->reading = true;
    bufferevent_setcb(p->bev, on_read, on_write, on_event, p);
    bufferevent_enable(p->bev, EV_READ | EV_WRITE);
    announce_if_any(p);
    return p;
}

struct evbuffer *
hpipe_input(struct hpipe *p)
{
    return bufferevent_get_input(pipe_of(p)->bev);
}

void
hpipe_write(struct hpipe *p, const void *data, size_t n)
{
    evbuffer_add(bufferevent_get_output(pipe_of(p)->bev), data, n);
}

void
hpipe_write_buffer(struct hpipe *p, struct evbuffer *buf)
{
    evbuffer_add_buffer(bufferevent_get_output(pipe_of(p)->bev), buf);
}

size_t
hpipe_queued(const struct hpipe *p)
{
    return evbuffer_get_length(bufferevent_get_output(pipe_of((void *)(uintptr_t)p)->bev));
}

void
hpipe_read(struct hpipe *p, bool on)
{
    pipe_of(p);
    if (p->eof || p->reading == on)
        return;
    p->reading = on;
    if (on) {
        bufferevent_enable(p->bev, EV_READ);
        announce_if_any(p);
    } else {
        bufferevent_disable(p->bev, EV_READ);
        event_del(p->announce);
    }
}

void
hpipe_low_water(struct hpipe *p, size_t n)
{
    bufferevent_setwatermark(pipe_of(p)->bev, EV_WRITE, n, 0);
}

/* From the loop: nothing of the bufferevent's is running any more. */
static void
on_pipe_free(evutil_socket_t fd_, short what, void *arg)
{
    struct hpipe *p = arg;
    SSL *ssl = bufferevent_openssl_get_ssl(p->bev);
    int fd = bufferevent_getfd(p->bev);
    bufferevent_free(p->bev);
    if (ssl)
        SSL_free(ssl);
    if (fd >= 0)
        close(fd);
    event_free(p->announce);
    free(p);
}

void
hpipe_free(struct hpipe *p)
{
    if (!p)
        return;
    pipe_of(p);
    p->magic = 0;
    hconn_taken(-(int)p->counted);
    bufferevent_setcb(p->bev, NULL, NULL, NULL, NULL);
    bufferevent_disable(p->bev, EV_READ | EV_WRITE);
    event_del(p->announce);
    struct timeval zero = {0, 0};
    if (event_base_once(bufferevent_get_base(p->bev), -1, EV_TIMEOUT, on_pipe_free, p, &zero) != 0)
        on_pipe_free(-1, 0, p);
}
