/*
 * h2room.c — the bound on the response bytes an HTTP/2 connection queues
 * across its streams (h2.c's send side calls in here; see h2.h).
 *
 * The bound (http2_conn_buffer; app.c: 4 x the larger of --max-list-buffer
 * and --watch-budget, 1 MiB by default). Over HTTP/1.1 a connection
 * carries one response at a time, so serve.c's mark bounds it; here each
 * of up to 100 streams has a queue, and a client that opens streams and
 * reads slowly, or never opens their windows, would pin 100 of them. So
 * the bytes queued for a connection (every stream's queue, handed-off
 * streams' too, and the connection's output buffer) are bounded: a
 * handler may write while they, plus the room promised to others, stay
 * under the bound. Past it hresp_queued reports just over the handler's
 * own mark (4 x its low-water mark + 1: serve.c stops at 2 x, passthrough.c
 * at 4 x, so a budget that sums what handlers hold sees a stream at its
 * mark), hstream_queued the bound itself (over any watch budget: the hub
 * puts the watcher behind, as a slow HTTP/1.1 one), and the stream waits
 * in a FIFO. When bytes leave, waiting streams are woken oldest first
 * (on_drain; a handed-off stream: on_sent) while there is room; each
 * stream woken (or told it may write) holds a pledge of its low-water
 * mark (>= 16 KiB) until it writes, so handlers that write on a later
 * turn (serve.c's pump) do not all take the same room; a pledge lapses
 * after the next send round (h2_pledges_age), so a handler that was told
 * it may write and then idles (a passthrough waiting on its upstream)
 * holds no room. A stream whose own
 * bytes left goes to the FIFO's tail: no stream is starved. So that
 * streams stalled at closed windows cannot hold the whole bound while a
 * stream with an open window waits, one stream at a time may write past a
 * full connection: one with nothing queued, a window open for its pledge,
 * while the output buffer is low (holds_turn). The connection then holds
 * at most the bound plus one write (and a frame or so); a stalled
 * connection is closed by h2.c's stall timer (the idle timeout).
 */
#include "conn.h"
#include "h2.h"

#include <assert.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <nghttp2/nghttp2.h>

size_t
h2_own_bytes(const struct h2stream *st)
{
    return evbuffer_get_length(st->out) + (st->hs ? h2hs_bytes(st->hs) : 0);
}

static size_t
conn_total(const struct h2conn *hc)
{
    return hc->queued + h2_out_len(hc);
}

/* st's pledge while it lasts (this send round or the one before), else 0 */
static size_t
live_pledge(const struct h2stream *st)
{
    unsigned age = st->hc->gen - st->pledge_gen;
    return age <= 1 ? st->pledge : 0;
}

static size_t
pledged(const struct h2conn *hc)
{
    return hc->pledged[0] + hc->pledged[1];
}

static void
unpledge(struct h2stream *st)
{
    struct h2conn *hc = st->hc;
    unsigned age = hc->gen - st->pledge_gen;
    if (st->pledge && age <= 1)
        hc->pledged[(st->pledge_gen) & 1] -= st->pledge;
    st->pledge = 0;
}

void
h2_pledges_age(struct h2conn *hc)
{
    hc->gen++;
    hc->pledged[hc->gen & 1] = 0; /* the round before last's lapse */
}

/* What a handler told it may write is expected to write: its low-water
 * mark (it refills from there to its mark), at least H2_PLEDGE_MIN. */
static size_t
pledge_size(const struct h2stream *st)
{
    return st->r->low_water > H2_PLEDGE_MIN ? st->r->low_water : H2_PLEDGE_MIN;
}

static void
pledge(struct h2stream *st)
{
    unpledge(st);
    st->pledge = pledge_size(st);
    st->pledge_gen = st->hc->gen;
    st->hc->pledged[st->hc->gen & 1] += st->pledge;
}

/* Could st's next write leave at once (its window takes a pledge)? */
static bool
can_send(const struct h2stream *st)
{
    int32_t w = nghttp2_session_get_stream_remote_window_size(st->hc->ss, st->id);
    return w > 0 && (size_t)w >= pledge_size(st);
}

void
h2_wait_add(struct h2stream *st)
{
    struct h2conn *hc = st->hc;
    if (st->wprev)
        return;
    st->wnext = NULL;
    st->wprev = hc->wtail;
    *hc->wtail = st;
    hc->wtail = &st->wnext;
}

void
h2_wait_del(struct h2stream *st)
{
    if (!st->wprev)
        return;
    *st->wprev = st->wnext;
    if (st->wnext)
        st->wnext->wprev = st->wprev;
    else
        st->hc->wtail = st->wprev;
    st->wprev = NULL;
    st->wnext = NULL;
}

void
h2_queued_add(struct h2stream *st, size_t n)
{
    struct h2conn *hc = st->hc;
    struct http_server_stats *t = &hc->c->s->stats;
    hc->queued += n;
    HSTAT_ADD(t->h2_queued, n);
    size_t total = conn_total(hc);
    if (total > t->h2_queued_peak)
        HSTAT_SET(t->h2_queued_peak, total);
    unpledge(st); /* the handler wrote what it was promised room for */
}

void
h2_queued_sub(struct h2stream *st, size_t n)
{
    assert(st->hc->queued >= n);
    st->hc->queued -= n;
    HSTAT_SUB(st->hc->c->s->stats.h2_queued, n);
}

/* Does h still hold the turn past a full connection: its write is queued
 * and can leave, or it was promised room and has not written yet? A stream
 * that asked and wrote nothing, or whose window closed, loses it. */
static bool
holds_turn(const struct h2stream *h)
{
    return h && (h2_own_bytes(h) > 0 ? can_send(h) : live_pledge(h) > 0);
}

/* May st's handler write now? Room on the connection (what is queued and
 * promised to the others under the bound), or st is the one stream let
 * past a full connection: nothing of its own queued, a window open for a
 * pledge, no other stream holding the turn (holds_turn), and the
 * connection's output buffer low (its bytes are leaving). */
static bool
may_write(struct h2stream *st, size_t own)
{
    struct h2conn *hc = st->hc;
    if (conn_total(hc) + pledged(hc) - live_pledge(st) < hc->bound)
        return true;
    if (own == 0 && (hc->exempt == st || !holds_turn(hc->exempt)) && can_send(st) &&
        h2_out_len(hc) < hc->out_low) {
        hc->exempt = st;
        return true;
    }
    return false;
}

size_t
h2_queued_report(struct h2stream *st, size_t own)
{
    struct h2conn *hc = st->hc;
    if (st->closed || hc->c->state == C_DEAD)
        return own;
    if (may_write(st, own)) {
        /* a handler goes on to write below twice its low-water mark (kwc's
         * stop there or later): room promised for it, else none left held */
        if (!st->hs && own < 2 * pledge_size(st))
            pledge(st);
        else
            unpledge(st);
        return own;
    }
    unpledge(st);
    h2_wait_add(st);
    /* past the handler's own mark: kwc's handlers stop at 2 (serve.c) or
     * 4 (passthrough.c) times their low-water mark; a watch, or a handler
     * without a mark, sees the bound (over any watch budget: app.c) */
    size_t stop = st->hs || st->r->low_water == 0 ? hc->bound : 4 * st->r->low_water + 1;
    return own > stop ? own : stop;
}

/* The streams owed a wake that may write now, oldest first: on_drain (a
 * watch stream: on_sent). A stream whose queue is over its low-water mark
 * leaves the list: it comes back when its own bytes leave (flush). */
void
h2_wake_waiting(struct h2conn *hc)
{
    unsigned budget = 2 * hc->nopen + 2; /* a stream re-added at the tail is seen once more */
    for (struct h2stream *st = hc->waiting; st && budget-- && hc->c->state != C_DEAD;) {
        if (conn_total(hc) + pledged(hc) >= hc->bound &&
            (holds_turn(hc->exempt) || h2_out_len(hc) >= hc->out_low))
            return; /* no room, and the turn past it is taken: nobody can write */
        struct h2stream *next = st->wnext;
        struct hreq *r = st->r;
        size_t own = h2_own_bytes(st);
        if (!st->hs && (st->resp_ended || own > r->low_water || !r->h || !r->h->on_drain)) {
            h2_wait_del(st);
        } else if (may_write(st, own)) {
            h2_wait_del(st);
            if (st->hs) {
                h2hs_sent(st);
            } else {
                pledge(st);
                r->h->on_drain(r->harg);
            }
        }
        st = next;
    }
}

void
h2_unwait(struct h2stream *st)
{
    h2_wait_del(st);
    unpledge(st);
    if (st->hc->exempt == st)
        st->hc->exempt = NULL;
}
