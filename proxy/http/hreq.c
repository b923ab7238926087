/*
 * hreq.c — the request object (struct hreq, see http.h): its head as
 * handlers read it, the front end's note and the server's done callback,
 * the headers for the upstream, and the handler's hooks with the body's
 * flow control. One request at a time per connection (conn.h); it is freed
 * by the connection (hreq_free), never inside its own callbacks.
 */
#include "conn.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "kwc/base.h"

/* ---- request objects ---- */

struct hreq *
hreq_new(struct hconn *c)
{
    struct hreq *r = xcalloc(1, sizeof(*r));
    r->magic = REQ_MAGIC;
    r->c = c;
    r->clen = -1;
    return r;
}

/* The sockets the handler counted for r: released with r (a pipe took them
 * over otherwise). */
static void
sockets_release(struct hreq *r)
{
    if (r->sockets) {
        hconn_taken(-(int)r->sockets);
        r->sockets = 0;
    }
}

void
hreq_free(struct hreq *r)
{
    if (!r)
        return;
    sockets_release(r);
    free(r->arena.p);
    free(r->hdrs);
    free(r->hoff);
    free(r->up_hdrs);
    free(r->up_arena);
    if (r->late_complete)
        event_free(r->late_complete);
    if (r->head_out)
        evbuffer_free(r->head_out);
    r->magic = 0;
    free(r);
}

void
hreq_set_upstream_headers(struct hreq *r, const struct http_header *h, size_t n)
{
    free(r->up_hdrs);
    free(r->up_arena);
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += strlen(h[i].name) + strlen(h[i].value) + 2;
    r->up_arena = xmalloc(bytes ? bytes : 1);
    r->up_hdrs = n ? xcalloc(n, sizeof(*r->up_hdrs)) : NULL;
    char *p = r->up_arena;
    for (size_t i = 0; i < n; i++) {
        size_t nl = strlen(h[i].name) + 1, vl = strlen(h[i].value) + 1;
        memcpy(p, h[i].name, nl);
        r->up_hdrs[i].name = p;
        p += nl;
        memcpy(p, h[i].value, vl);
        r->up_hdrs[i].value = p;
        p += vl;
    }
    r->n_up = n;
}

size_t
hreq_upstream_headers(const struct hreq *r, const struct http_header **out)
{
    *out = r->up_hdrs;
    return r->n_up;
}

/* The whole request has been read: tell the handler, once. */
void
hreq_complete_fire(struct hreq *r)
{
    r->complete_fired = true;
    if (!r->ended && r->h && r->h->on_complete)
        r->h->on_complete(r->harg);
}

uint64_t
http_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The server's done callback, then the handler's on_close: once. */
void
hreq_closed(struct hreq *r, enum hreq_end how)
{
    if (r->closed_cb)
        return;
    r->closed_cb = true;
    sockets_release(r);
    struct http_server *s = r->c->s;
    if (r->dispatched && !r->h2)
        HSTAT_SUB(s->h1_open, 1);
    if (r->dispatched && s->on_done) {
        struct hreq_done d = {.method = r->method,
                              .target = r->arena.p ? r->arena.p : "",
                              .proto = hreq_proto(r),
                              .status = r->status,
                              .bytes = r->bytes,
                              .start_ns = r->start_ns,
                              .head_ns = r->head_ns,
                              .end_ns = http_now_ns(),
                              .how = how};
        void *note = r->note;
        r->note = NULL;
        s->on_done(s->done_arg, &d, note);
    }
    if (r->h && r->h->on_close)
        r->h->on_close(r->harg);
}

void
http_server_on_done(struct http_server *s, http_done_cb cb, void *arg)
{
    s->on_done = cb;
    s->done_arg = arg;
}

void
hreq_set_note(struct hreq *r, void *note)
{
    r->note = note;
}

void *
hreq_note(const struct hreq *r)
{
    return r->note;
}

uint64_t
hreq_start_ns(const struct hreq *r)
{
    return r->start_ns;
}

void
hreq_count_socket(struct hreq *r)
{
    hreq_of(r)->sockets++;
    hconn_taken(1);
}

/* ---- the request head ---- */

const char *
hreq_method(const struct hreq *r)
{
    return hreq_of(r)->method;
}

const char *
hreq_target(const struct hreq *r, size_t *len)
{
    if (len)
        *len = r->target_len;
    return r->arena.p;
}

bool
hreq_http10(const struct hreq *r)
{
    return r->http10;
}

const char *
hreq_proto(const struct hreq *r)
{
    return r->h2 ? "HTTP/2.0" : r->http10 ? "HTTP/1.0" : "HTTP/1.1";
}

const char *
hreq_header(const struct hreq *r, const char *name)
{
    for (size_t i = 0; r->hdrs && i < r->nh; i++)
        if (strcasecmp(r->hdrs[i].name, name) == 0)
            return r->hdrs[i].value;
    return NULL;
}

size_t
hreq_headers(const struct hreq *r, const struct http_header **out)
{
    *out = r->hdrs;
    return r->nh;
}

bool
hreq_has_body(const struct hreq *r)
{
    return r->has_body;
}

int64_t
hreq_content_length(const struct hreq *r)
{
    return r->chunked ? -1 : r->clen;
}

bool
hreq_upgrade(const struct hreq *r)
{
    return r->upgrade;
}

const struct sockaddr *
hreq_peer(const struct hreq *r, socklen_t *len)
{
    if (len)
        *len = r->c->peer_len;
    return (const struct sockaddr *)&r->c->peer;
}

bool
http_source_key(const struct sockaddr *sa, socklen_t len, struct src_key *out)
{
    if (!sa)
        return false;
    if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
        src_key_v4(out, (const uint8_t *)&in->sin_addr);
        return true;
    }
    if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;
        src_key_v6(out, in6->sin6_addr.s6_addr);
        return true;
    }
    return false;
}

bool
hreq_source(const struct hreq *r, struct src_key *out)
{
    return http_source_key((const struct sockaddr *)&r->c->peer, r->c->peer_len, out);
}

struct event_base *
hreq_base(const struct hreq *r)
{
    return r->c->s->base;
}

/* ---- handler hooks and the body ---- */

static void
on_late_complete(evutil_socket_t fd, short what, void *arg)
{
    hreq_complete_fire(arg);
}

void
hreq_set_handler(struct hreq *r, const struct hreq_handler *h, void *arg)
{
    hreq_of(r);
    r->h = h;
    r->harg = arg;
    if (r->held) {
        /* the next handler reads the body (hreq_body_read) before the
         * deferred parse runs, or lets it be discarded */
        struct hconn *c = r->c;
        r->held = false;
        if (!r->reading && c->state != C_DEAD) {
            c->parse_paused_body = false;
            http_parser_pause(&c->p, 0);
            hconn_kick(c);
        }
    }
    /* A handler set after the request completed (the stages waited for the
     * upstream to authenticate it) still hears of it, from the loop. */
    if (r->complete_fired && h && h->on_complete && !r->ended) {
        if (!r->late_complete)
            r->late_complete = event_new(r->c->s->base, -1, 0, on_late_complete, r);
        event_active(r->late_complete, EV_TIMEOUT, 1);
    }
}

void
hreq_body_hold(struct hreq *r)
{
    struct hconn *c = hreq_of(r)->c;
    if (c->state == C_DEAD || r->reading || r->complete)
        return;
    r->held = true;
    if (r->h2)
        return;                  /* h2.c buffers the stream's DATA while held */
    c->parse_paused_body = true; /* h1_parse stops before the body */
}

void
hreq_body_read(struct hreq *r, bool on)
{
    struct hconn *c = hreq_of(r)->c;
    if (c->state == C_DEAD || r->reading == on)
        return;
    if (r->h2) {
        h2_body_read(r, on);
        return;
    }
    r->reading = on;
    if (!on)
        c->parse_paused_body = true; /* held in the input buffer, not discarded */
    if (on) {
        if (r->expect_continue && !r->sent_continue && !r->started) {
            r->sent_continue = true;
            evbuffer_add(bufferevent_get_output(c->bev), "HTTP/1.1 100 Continue\r\n\r\n", 25);
        }
        if (c->parse_paused_body) {
            c->parse_paused_body = false;
            http_parser_pause(&c->p, 0);
        }
        bufferevent_enable(c->bev, EV_READ);
        hconn_kick(c); /* bytes already in the input buffer */
    }
}
