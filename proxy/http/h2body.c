/*
 * h2body.c — an HTTP/2 stream's request body (h2.c's sessions): DATA
 * delivered to the handler's on_body, buffered while it is not read, or
 * discarded; and the windows given back for what left.
 *
 * DATA is given back to the windows (connection and stream) only when it
 * is delivered to on_body or discarded, never while it waits in st->in
 * (held for the stages, a handler that paused, or not yet delivered), so
 * what a connection can make kwc hold is its window, H2_CONN_WINDOW, as
 * Go's server hands back only what handlers read. Across connections the
 * bytes held for requests that wait for the stages (hreq_body_hold: not
 * authenticated yet) are capped by max_held_body: past it such a stream is
 * refused (RST_STREAM REFUSED_STREAM: nothing of it went anywhere).
 *
 * Loop thread only, as h2.c.
 */
#include "conn.h"
#include "h2.h"

#include <event2/buffer.h>
#include <nghttp2/nghttp2.h>

#include "kwc/log.h"

static size_t
held_cap(const struct http_server *s)
{
    return s->o.max_held_body ? s->o.max_held_body : H2_HELD_BODY;
}

/* n bytes of st->in leave it (delivered or dropped): the windows reopen. */
static void
in_consumed(struct h2stream *st, size_t n)
{
    struct h2conn *hc = st->hc;
    HSTAT_SUB(hc->c->s->stats.h2_body_held, n);
    if (hc->c->state != C_DEAD)
        nghttp2_session_consume(hc->ss, st->id, n); /* the connection's too, stream closed or not */
}

void
h2_in_drop(struct h2stream *st)
{
    size_t n = evbuffer_get_length(st->in);
    if (n == 0)
        return;
    evbuffer_drain(st->in, n);
    in_consumed(st, n);
}

/* st's request is all read, or st closed: deliver_bodies has nothing more
 * to do for it (so a connection whose requests are all read skips it). */
void
h2_done_reading(struct h2stream *st)
{
    if (st->incomplete) {
        st->incomplete = false;
        st->hc->incomplete--;
    }
}

void
h2_request_complete(struct h2stream *st)
{
    struct hreq *r = st->r;
    if (r->complete || !st->eof_in || evbuffer_get_length(st->in) > 0)
        return;
    r->complete = true;
    h2_done_reading(st);
    if (r->dispatched && !st->closed)
        hreq_complete_fire(r);
}

int
h2_on_data_chunk(nghttp2_session *ss, uint8_t flags, int32_t id, const uint8_t *data, size_t len,
                 void *arg)
{
    struct h2conn *hc = arg;
    struct http_server *s = hc->c->s;
    struct h2stream *st = nghttp2_session_get_stream_user_data(ss, id);
    if (!st || st->closed) {
        nghttp2_session_consume(ss, id, len);
        return 0;
    }
    struct hreq *r = st->r;
    r->body_seen = true;
    if (r->reading && evbuffer_get_length(st->in) == 0 && r->h && r->h->on_body && !r->ended) {
        nghttp2_session_consume(ss, id, len);
        r->h->on_body(r->harg, (const char *)data, len);
        return 0;
    }
    if (r->held || st->paused || r->reading || !r->dispatched) {
        if (r->held && s->stats.h2_body_held + len > held_cap(s)) {
            nghttp2_session_consume(ss, id, len);
            h2_in_drop(st);
            HSTAT_ADD(s->stats.h2_held_refused, 1);
            log_debug("http2: refusing a stream: request bodies held for authentication "
                      "passed --max-held-body-buffer (%zu bytes)",
                      held_cap(s));
            nghttp2_submit_rst_stream(ss, NGHTTP2_FLAG_NONE, id, NGHTTP2_REFUSED_STREAM);
            return 0;
        }
        evbuffer_add(st->in, data, len); /* bounded by the windows, not consumed */
        HSTAT_ADD(s->stats.h2_body_held, len);
        return 0;
    }
    nghttp2_session_consume(ss, id, len);
    r->discarded += len;
    if (r->discarded > s->o.max_discard_bytes) {
        log_debug("http2: resetting a stream: an unread request body passed %zu bytes",
                  s->o.max_discard_bytes);
        nghttp2_submit_rst_stream(ss, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
    }
    return 0;
}

/* Hand buffered body bytes to readers, discard what nobody will read. */
void
h2_deliver_bodies(struct h2conn *hc)
{
    if (hc->incomplete == 0)
        return; /* every request all read: nothing to deliver or complete */
    for (struct h2stream *st = hc->streams; st && hc->c->state != C_DEAD;) {
        struct h2stream *next = st->next;
        struct hreq *r = st->r;
        size_t n = evbuffer_get_length(st->in);
        if (n && r->dispatched && !r->held && !st->paused) {
            if (r->reading && r->h && r->h->on_body) {
                char buf[16384];
                while (r->reading && !st->closed && evbuffer_get_length(st->in) > 0) {
                    int k = evbuffer_remove(st->in, buf, sizeof(buf));
                    if (k <= 0)
                        break;
                    in_consumed(st, (size_t)k);
                    r->h->on_body(r->harg, buf, (size_t)k);
                }
            } else if (!r->reading) {
                h2_in_drop(st);
                r->discarded += n;
            }
        }
        if (!st->closed)
            h2_request_complete(st);
        st = next;
    }
}
