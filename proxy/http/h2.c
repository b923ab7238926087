/*
 * h2.c — HTTP/2 downstream on Debian's libnghttp2 (RFC 9113): one
 * nghttp2 server session per connection, one struct hreq per stream, the
 * same accessors and response writer as HTTP/1.1 (hreq.c and hresp.c hand
 * the calls on a stream to the h2_* functions here).
 *
 * Lead's decisions (issue 21, brief decisions 2 and 3):
 *  - HTTP/2 connections stay on the server's (main) loop: nghttp2 sessions
 *    are single-threaded and every request kind on them runs there.
 *  - Protocol selection (http.c): TLS ALPN offers "h2" then "http/1.1" and
 *    the server's order wins (as Go's); in plaintext a connection whose
 *    first bytes are the client preface is HTTP/2 with prior knowledge, any
 *    other HTTP/1.1, byte for byte as before. No h2c Upgrade (kube has none).
 *
 * Bytes: the session's output goes to the bufferevent's output buffer, at
 * most hc->out_high bytes ahead of the kernel (the send callback says
 * WOULDBLOCK past it; the bufferevent's write callback resumes). Each
 * stream queues its body in an evbuffer of its own (and, handed off, its
 * handoff's entries) that the data provider (h2data.c) frames as the
 * stream's window allows, never through nghttp2's buffer
 * (NGHTTP2_DATA_FLAG_NO_COPY): in plaintext a list's blocks and a watch's
 * shared events of 4 KiB or more go by reference, held until they left
 * the output;
 * over TLS each frame is one contiguous copy of at most a record. DATA
 * frames are as large as the client's SETTINGS_MAX_FRAME_SIZE allows (up
 * to 64 KiB in plaintext), so a stream whose window is exhausted waits
 * alone: the connection and the other streams go on. hresp_queued and
 * on_drain are per stream, under a bound per connection:
 *
 * The bound (http2_conn_buffer): the bytes queued for a connection across
 * its streams are bounded; handlers past it wait, woken oldest first as
 * bytes leave (h2room.c, whose header says how).
 *
 * The body (h2body.c): automatic WINDOW_UPDATEs are off. DATA received is
 * given back to the windows, the stream's and the connection's, only when
 * delivered to on_body or discarded, so a handler that stops reading
 * (hreq_body_read off, hreq_body_hold) closes its own stream's window, and
 * a connection holds at most its window (H2_CONN_WINDOW) in bodies nobody
 * read; those held for the stages are capped across connections
 * (max_held_body).
 *
 * Limits (a front end facing the network):
 *  - --http2-max-streams-per-connection -> SETTINGS_MAX_CONCURRENT_STREAMS;
 *    nghttp2 refuses streams past it (RST_STREAM REFUSED_STREAM).
 *  - Rapid reset (CVE-2023-44487) and MadeYouReset (CVE-2025-8671): every
 *    RST_STREAM from the client that closes a stream still open (not one
 *    for a stream already gone), every stream refused and every stream
 *    kwc or nghttp2 resets for the client's error (a WINDOW_UPDATE that
 *    overflows its window, a malformed request, a body past the discard
 *    limit) takes a token from a per-connection bucket of 2 x max streams
 *    tokens, refilled at max streams per 10 s (kube's 100: a burst of 200,
 *    then 10 per second sustained); take_reset. Empty: GOAWAY
 *    ENHANCE_YOUR_CALM and close. Go bounds the same attack by the handlers
 *    still running after their stream was reset (4 x max streams); kwc's
 *    handlers stop at the reset (on_close), so what costs here is the rate
 *    of streams opened and reset, which the bucket bounds. A stream that
 *    ends before its caller is authenticated ends the connection's new
 *    streams (serve/front.c: kube's rule for unauthenticated callers).
 *  - Header lists: each field counts name + value + 32 (RFC 9113's
 *    SETTINGS_MAX_HEADER_LIST_SIZE, which is advertised as max_header_bytes).
 *    Past max_header_bytes the fields are dropped and the stream is
 *    answered 431 with a Status body, as Go's http2 server answers it
 *    (handleHeaderListTooLong) and as kwc answers HTTP/1.1. CONTINUATION
 *    flood (CVE-2024-27316): at most max_header_bytes / 4096 + 8
 *    CONTINUATION frames per header block (nghttp2's max_continuations; a
 *    1 MiB list in 16 KiB frames needs 64), past it nghttp2 ends the
 *    session. HPACK bombs: the decoded size is what is counted, and
 *    nothing is decoded past the field that passes the limit (on_header
 *    pauses the session; cut: 431, GOAWAY ENHANCE_YOUR_CALM, nothing more
 *    read). Across a connection's blocks, at most two header lists plus
 *    H2_HPACK_RATIO bytes per byte received are decoded (hpack_budget), so
 *    references to a large dynamic-table entry cost kwc in proportion to
 *    what they cost the client; past it, GOAWAY ENHANCE_YOUR_CALM.
 *  - SETTINGS/PING floods: nghttp2 queues at most 1000 outbound ACKs (then
 *    ends the session; ACKs queue only when the peer does not read) and
 *    accepts at most 32 settings per frame. PRIORITY: kwc sends
 *    SETTINGS_NO_RFC7540_PRIORITIES; each PRIORITY frame still takes a
 *    token from a bucket of 10 x max streams (refilled at max streams per
 *    second); empty: GOAWAY ENHANCE_YOUR_CALM.
 *  - Zero-window stalls: the connection's timer is the idle timeout while
 *    no stream is open, and while output is waiting (a stream's body or the
 *    connection's buffer) it is the same timeout counted from the last byte
 *    that left; when it fires the connection closes. A quiet stream with
 *    nothing to send (a watch between events) never times out.
 *  - Upgrades: nghttp2 treats Connection, Upgrade, Keep-Alive,
 *    Transfer-Encoding and Proxy-Connection in a request as malformed and
 *    resets the stream (PROTOCOL_ERROR) before kwc sees it, as Go's http2
 *    server does; hreq_upgrade is always false on a stream.
 *  - Shutdown (http_server_shutdown): GOAWAY with the last stream id; open
 *    streams finish, then the connection closes.
 */
#include "conn.h"
#include "h2.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <nghttp2/nghttp2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kwc/base.h"
#include "kwc/log.h"
#include "kwc/status.h"

#define H2_MAGIC 0x68326373u      /* "h2cs" */
#define H2_CONN_WINDOW (1u << 20) /* the connection's receive window */
#define H2_FIELD_OVERHEAD 32      /* RFC 9113 6.5.2 */
#define H2_LAST_WORDS_MS 2000     /* a GOAWAY after a protocol error: time to leave */

static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/* ---- small helpers ---- */

static struct h2conn *
hc_of(const struct hconn *c)
{
    assert(c->h2 && c->h2->magic == H2_MAGIC);
    return c->h2;
}

static unsigned
max_streams(const struct http_server *s)
{
    return s->o.http2_max_streams ? s->o.http2_max_streams : 100;
}

/* Take one token; false when the bucket is empty. burst tokens, refilled
 * at rate per second. */
static bool
bucket_take(struct bucket *b, double burst, double rate)
{
    uint64_t now = http_now_ns();
    if (b->at_ns == 0)
        b->tokens = burst;
    else
        b->tokens += (double)(now - b->at_ns) / 1e9 * rate;
    if (b->tokens > burst)
        b->tokens = burst;
    b->at_ns = now;
    if (b->tokens < 1)
        return false;
    b->tokens -= 1;
    return true;
}

/* GOAWAY ENHANCE_YOUR_CALM and the session's end, even after a graceful
 * GOAWAY (the streams it let finish may be what floods). */
static void
calm_down(struct h2conn *hc, const char *why)
{
    if (hc->calm)
        return;
    hc->calm = true;
    hc->goaway = true;
    HSTAT_ADD(hc->c->s->stats.h2_goaways, 1);
    log_debug("http2: GOAWAY ENHANCE_YOUR_CALM: %s", why);
    nghttp2_session_terminate_session(hc->ss, NGHTTP2_ENHANCE_YOUR_CALM);
}

/* A stream reset: by the client, by nghttp2 for the client's fault (a
 * WINDOW_UPDATE that overflows a stream's window, a malformed request:
 * "MadeYouReset", CVE-2025-8671, which Debian's libnghttp2 1.52 does not
 * count), by kwc for it (a body past --max-discard, the held-body cap) or
 * refused past the streams limit: each takes a token from one bucket of
 * 2 x max streams, refilled at max streams per 10 s. Empty: GOAWAY
 * ENHANCE_YOUR_CALM. Only the aborts kwc decides alone (hresp_abort: its
 * upstream failed) and RST_STREAM NO_ERROR (answered before the body's
 * end) are free. */
static void
take_reset(struct h2conn *hc, const char *why)
{
    unsigned m = max_streams(hc->c->s);
    if (!bucket_take(&hc->resets, 2.0 * m, m / 10.0))
        calm_down(hc, why);
}

static void
stream_unlink(struct h2stream *st)
{
    *st->prev = st->next;
    if (st->next)
        st->next->prev = st->prev;
    st->next = NULL;
    st->prev = NULL;
}

static void
stream_free(struct h2stream *st)
{
    free(st->fields.p);
    free(st->rh.p);
    free(st->path);
    free(st->authority);
    h2_blocks_drop(st);
    if (st->out)
        evbuffer_free(st->out);
    if (st->in)
        evbuffer_free(st->in);
    if (st->r) {
        st->r->h2 = NULL;
        hreq_free(st->r);
    }
    free(st);
}

static void
reap_streams(struct h2conn *hc)
{
    while (hc->dead) {
        struct h2stream *st = hc->dead;
        hc->dead = st->next;
        stream_free(st);
    }
}

/* The stream is over for its handler (once): the done callback and on_close. */
static void
stream_closed(struct h2stream *st, enum hreq_end how)
{
    struct h2conn *hc = st->hc;
    if (st->closed)
        return;
    st->closed = true;
    st->r->ended = true;
    h2_in_drop(st);                      /* what it held is given back to the connection's window */
    h2_queued_sub(st, h2_own_bytes(st)); /* a closed stream's queue is dropped */
    h2_unwait(st);
    h2_done_reading(st);
    hc->nopen--;
    HSTAT_SUB(hc->c->s->stats.h2_streams_open, 1);
    stream_unlink(st);
    st->next = hc->dead;
    hc->dead = st;
    if (st->hs)
        h2hs_closed(st); /* a response stream: its on_close */
    hreq_closed(st->r, how);
}

/* ---- the session's callbacks ---- */

static ssize_t
on_send(nghttp2_session *ss, const uint8_t *data, size_t len, int flags, void *arg)
{
    struct h2conn *hc = arg;
    if (h2_out_len(hc) >= hc->out_high)
        return NGHTTP2_ERR_WOULDBLOCK;
    if (hc->c->ssl && len <= H2_REC) {
        memcpy(h2_rec_take(hc, len), data, len); /* in order with the DATA frames */
        return (ssize_t)len;
    }
    h2_rec_flush(hc);
    evbuffer_add(bufferevent_get_output(hc->c->bev), data, len);
    return (ssize_t)len;
}

static int
on_begin_headers(nghttp2_session *ss, const nghttp2_frame *f, void *arg)
{
    struct h2conn *hc = arg;
    if (hc->c->state == C_DEAD)
        return NGHTTP2_ERR_CALLBACK_FAILURE; /* closed meanwhile: stop reading */
    if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    struct h2stream *st = xcalloc(1, sizeof(*st));
    st->hc = hc;
    st->id = f->hd.stream_id;
    st->r = hreq_new(hc->c);
    st->r->h2 = st;
    st->r->keepalive = true;
    st->out = evbuffer_new();
    st->in = evbuffer_new();
    st->next = hc->streams;
    if (st->next)
        st->next->prev = &st->next;
    st->prev = &hc->streams;
    hc->streams = st;
    hc->nopen++;
    st->incomplete = true;
    hc->incomplete++;
    HSTAT_ADD(hc->c->s->stats.h2_streams_open, 1);
    HSTAT_ADD(hc->c->s->stats.h2_streams_total, 1);
    nghttp2_session_set_stream_user_data(ss, st->id, st);
    return 0;
}

static char *
dupn(const uint8_t *p, size_t n)
{
    char *s = xmalloc(n + 1);
    memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

/* The decoded header data a connection may cost before its bytes pay for
 * more (h2.c's header: HPACK bombs): two lists (H2_HPACK_FLOOR at least),
 * then H2_HPACK_RATIO per byte of the pieces already parsed. */
static uint64_t
hpack_budget(const struct h2conn *hc)
{
    uint64_t lists = 2 * (uint64_t)hc->c->s->o.max_header_bytes;
    return (lists > H2_HPACK_FLOOR ? lists : H2_HPACK_FLOOR) + H2_HPACK_RATIO * hc->received;
}

static int
on_header(nghttp2_session *ss, const nghttp2_frame *f, const uint8_t *name, size_t nl,
          const uint8_t *value, size_t vl, uint8_t flags, void *arg)
{
    struct h2conn *hc = arg;
    if (f->hd.type != NGHTTP2_HEADERS)
        return 0;
    /* every field nghttp2 decoded and validated, kept or not, trailers and
     * refused streams included: the work an HPACK reference buys */
    size_t size = nl + vl + H2_FIELD_OVERHEAD;
    hc->decoded += size;
    HSTAT_ADD(hc->c->s->stats.h2_header_bytes, size);
    if (hc->decoded > hpack_budget(hc)) {
        HSTAT_ADD(hc->c->s->stats.h2_hpack_floods, 1);
        calm_down(hc, "decoded header data far past the bytes received (HPACK bomb)");
        return NGHTTP2_ERR_CALLBACK_FAILURE; /* not one field more */
    }
    struct h2stream *st = nghttp2_session_get_stream_user_data(ss, f->hd.stream_id);
    if (!st)
        return 0;
    st->hbytes += size;
    if (st->hbytes > hc->c->s->o.max_header_bytes) {
        if (st->r->dispatched) {
            /* trailers past the limit: no answer is owed, the session ends */
            calm_down(hc, "request trailers over --max-header-bytes");
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        }
        /* Go stops emitting fields here; nghttp2 cannot skip the rest of a
         * block without validating each field, so kwc stops reading: 431
         * on this stream, then the connection ends (h2_on_read: cut) */
        st->too_big = true;
        hc->cut = st;
        return NGHTTP2_ERR_PAUSE;
    }
    if (st->r->dispatched)
        return 0; /* trailers: not kept */
    struct hreq *r = st->r;
    if (nl > 0 && name[0] == ':') {
        if (nl == 7 && memcmp(name, ":method", 7) == 0) {
            if (vl >= sizeof(r->method))
                return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* RST_STREAM */
            memcpy(r->method, value, vl);
            r->method[vl] = '\0';
        } else if (nl == 5 && memcmp(name, ":path", 5) == 0) {
            free(st->path);
            st->path = dupn(value, vl);
        } else if (nl == 10 && memcmp(name, ":authority", 10) == 0) {
            free(st->authority);
            st->authority = dupn(value, vl);
        }
        return 0; /* :scheme (checked by nghttp2), :protocol (never enabled) */
    }
    gostr_addn(&st->fields, (const char *)name, nl);
    gostr_addc(&st->fields, '\0');
    gostr_addn(&st->fields, (const char *)value, vl);
    gostr_addc(&st->fields, '\0');
    st->nfields++;
    return 0;
}

/* The head as http.h gives it: the target first in the arena, then Host
 * (from :authority when the client sent no host field), then the fields. */
static void
head_build(struct h2stream *st)
{
    struct hreq *r = st->r;
    const char *path = st->path ? st->path : "";
    r->target_len = strlen(path);
    gostr_addn(&r->arena, path, r->target_len);
    gostr_addc(&r->arena, '\0');
    bool host = false;
    const char *p = st->fields.p;
    for (size_t i = 0; i < st->nfields; i++) {
        if (strcmp(p, "host") == 0)
            host = true;
        p += strlen(p) + 1;
        p += strlen(p) + 1;
    }
    size_t n = st->nfields + (!host && st->authority ? 1 : 0);
    size_t *off = xcalloc(n ? 2 * n : 1, sizeof(*off));
    size_t k = 0;
    if (!host && st->authority) {
        off[k++] = r->arena.len;
        gostr_addn(&r->arena, "Host", 5);
        off[k++] = r->arena.len;
        gostr_addn(&r->arena, st->authority, strlen(st->authority) + 1);
    }
    p = st->fields.p;
    for (size_t i = 0; i < st->nfields; i++) {
        off[k++] = r->arena.len;
        size_t l = strlen(p) + 1;
        gostr_addn(&r->arena, p, l);
        p += l;
        off[k++] = r->arena.len;
        l = strlen(p) + 1;
        gostr_addn(&r->arena, p, l);
        p += l;
    }
    r->hdrs = xcalloc(n ? n : 1, sizeof(*r->hdrs));
    for (size_t i = 0; i < n; i++) {
        r->hdrs[i].name = r->arena.p + off[2 * i];
        r->hdrs[i].value = r->arena.p + off[2 * i + 1];
    }
    r->nh = n;
    r->target_done = true;
    free(off);
    free(st->fields.p);
    st->fields = (struct gostr_buf){0};
    const char *cl = hreq_header(r, "content-length");
    if (cl) {
        char *end;
        long long v = strtoll(cl, &end, 10); /* nghttp2 checked its shape */
        r->clen = *end == '\0' && v >= 0 ? v : -1;
    }
    r->head_method = strcmp(r->method, "HEAD") == 0;
}

static void
answer_too_big(struct h2stream *st)
{
    struct http_server *s = st->hc->c->s;
    HSTAT_ADD(s->stats.bad_requests, 1);
    char *body =
        status_failure_json(431, status_reason_for_code(431),
                            "the request headers are too large (over --max-header-bytes)", NULL);
    size_t bl = strlen(body);
    body[bl] = '\n'; /* the trailing NUL becomes the JSON line's end */
    hresp_header(st->r, "Cache-Control", "no-cache, private");
    hresp_simple(st->r, 431, "application/json", body, bl + 1);
    free(body);
}

/* A header list passed --max-header-bytes (on_header paused the session
 * mid-block): its stream is answered 431, and the connection reads nothing
 * more (the rest of the block cannot be skipped without decoding it, and
 * HPACK's state is lost without it): GOAWAY ENHANCE_YOUR_CALM naming that
 * stream as the last, then close once the answer has left, within
 * H2_LAST_WORDS_MS; what arrives meanwhile is read and dropped. The other
 * open streams end with the connection. */
static void
cut(struct h2conn *hc)
{
    struct h2stream *st = hc->cut;
    struct hconn *c = hc->c;
    head_build(st);
    answer_too_big(st);
    if (!hc->goaway) {
        hc->goaway = true;
        HSTAT_ADD(c->s->stats.h2_goaways, 1);
        nghttp2_submit_goaway(hc->ss, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_ENHANCE_YOUR_CALM, NULL,
                              0);
    }
    hc->deaf = true; /* what still arrives is read and dropped (h2_on_read) */
    hc->cut_id = st->id;
    struct evbuffer *in = bufferevent_get_input(c->bev);
    evbuffer_drain(in, evbuffer_get_length(in));
    hc->tmode = 3;
    event_del(c->timer);
    struct timeval tv = {H2_LAST_WORDS_MS / 1000, (H2_LAST_WORDS_MS % 1000) * 1000};
    evtimer_add(c->timer, &tv);
}

static void
dispatch(struct h2stream *st, bool end_stream)
{
    struct hreq *r = st->r;
    struct http_server *s = st->hc->c->s;
    head_build(st);
    r->has_body = !end_stream;
    r->chunked = r->has_body && r->clen < 0;
    const char *expect = hreq_header(r, "expect");
    r->expect_continue = r->has_body && expect && strcasecmp(expect, "100-continue") == 0;
    if (end_stream) {
        st->eof_in = true;
        r->complete = true;
        h2_done_reading(st);
    }
    HSTAT_ADD(s->stats.requests, 1);
    r->dispatched = true;
    r->start_ns = http_now_ns();
    s->on_request(s->arg, r);
    if (r->complete && !st->closed && r->h2)
        hreq_complete_fire(r);
}

static int
on_frame_recv(nghttp2_session *ss, const nghttp2_frame *f, void *arg)
{
    struct h2conn *hc = arg;
    struct http_server *s = hc->c->s;
    if (hc->c->state == C_DEAD)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    struct h2stream *st =
        f->hd.stream_id ? nghttp2_session_get_stream_user_data(ss, f->hd.stream_id) : NULL;
    switch (f->hd.type) {
    case NGHTTP2_HEADERS:
        if (!st)
            break;
        if (f->headers.cat == NGHTTP2_HCAT_REQUEST && !st->r->dispatched) {
            dispatch(st, f->hd.flags & NGHTTP2_FLAG_END_STREAM);
        } else if (f->hd.flags & NGHTTP2_FLAG_END_STREAM) {
            st->eof_in = true; /* trailers */
            h2_request_complete(st);
        }
        break;
    case NGHTTP2_DATA:
        if (st && (f->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
            st->eof_in = true;
            h2_request_complete(st);
        }
        break;
    case NGHTTP2_RST_STREAM:
        /* only a reset that closes a stream still open counts: after a
         * client resets a stream, DATA already in flight may draw another
         * RST from it for a stream that is gone (python's h2 does), which
         * costs kwc nothing */
        if (!st)
            break;
        HSTAT_ADD(s->stats.h2_resets, 1);
        take_reset(hc, "too many streams reset (rapid reset)");
        break;
    default:
        break;
    }
    return 0;
}

/* PRIORITY frames are counted as they begin: with RFC 7540 priorities off
 * nghttp2 drops them without an on_frame_recv. */
static int
on_begin_frame(nghttp2_session *ss, const nghttp2_frame_hd *hd, void *arg)
{
    struct h2conn *hc = arg;
    unsigned m = max_streams(hc->c->s);
    if (hd->type == NGHTTP2_PRIORITY && !bucket_take(&hc->prio, 10.0 * m, m))
        calm_down(hc, "too many PRIORITY frames");
    return 0;
}

static int
on_frame_send(nghttp2_session *ss, const nghttp2_frame *f, void *arg)
{
    struct h2conn *hc = arg;
    struct http_server *s = hc->c->s;
    if (f->hd.type == NGHTTP2_RST_STREAM) {
        uint32_t code = f->rst_stream.error_code;
        struct h2stream *st = nghttp2_session_get_stream_user_data(ss, f->hd.stream_id);
        if (code == NGHTTP2_NO_ERROR || (st && st->aborted))
            return 0;
        if (code == NGHTTP2_REFUSED_STREAM) {
            HSTAT_ADD(s->stats.h2_refused, 1);
            take_reset(hc, "too many streams refused");
        } else {
            HSTAT_ADD(s->stats.h2_resets_server, 1);
            take_reset(hc, "too many streams reset for the client's errors (MadeYouReset)");
        }
        return 0;
    }
    if (f->hd.type == NGHTTP2_GOAWAY && !hc->goaway) {
        hc->goaway = true;
        HSTAT_ADD(s->stats.h2_goaways, 1);
    }
    if (f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA)
        return 0;
    struct h2stream *st = nghttp2_session_get_stream_user_data(ss, f->hd.stream_id);
    if (!st)
        return 0;
    st->r->bytes += f->hd.length + 9;
    if (f->hd.flags & NGHTTP2_FLAG_END_STREAM) {
        st->end_sent = true;
        if (hc->deaf && st->id == hc->cut_id)
            hc->cut_sent = true;
        /* answered before the body's end: the rest is not wanted (RFC 9113
         * 8.1, as Go does) */
        if (!st->eof_in)
            nghttp2_submit_rst_stream(ss, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_NO_ERROR);
    }
    return 0;
}

static int
on_stream_close(nghttp2_session *ss, int32_t id, uint32_t code, void *arg)
{
    struct h2stream *st = nghttp2_session_get_stream_user_data(ss, id);
    if (st)
        stream_closed(st, st->end_sent ? HREQ_END_DONE : HREQ_END_CLOSED);
    return 0;
}

/* ---- the connection ---- */

int
h2_detect(struct hconn *c)
{
    if (c->ssl) {
        const unsigned char *p = NULL;
        unsigned int n = 0;
        SSL_get0_alpn_selected(c->ssl, &p, &n);
        return n == 2 && memcmp(p, "h2", 2) == 0;
    }
    struct evbuffer *in = bufferevent_get_input(c->bev);
    size_t have = evbuffer_get_length(in), want = sizeof(preface) - 1;
    size_t n = have < want ? have : want;
    char buf[sizeof(preface)];
    if (evbuffer_copyout(in, buf, n) != (ev_ssize_t)n || memcmp(buf, preface, n) != 0)
        return 0;
    return n == want ? 1 : -1;
}

void
h2_start(struct hconn *c)
{
    struct http_server *s = c->s;
    struct h2conn *hc = xcalloc(1, sizeof(*hc));
    hc->magic = H2_MAGIC;
    hc->c = c;
    nghttp2_session_callbacks *cb;
    nghttp2_option *opt;
    if (nghttp2_session_callbacks_new(&cb) != 0 || nghttp2_option_new(&opt) != 0)
        abort(); /* out of memory */
    nghttp2_session_callbacks_set_send_callback(cb, on_send);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
    nghttp2_session_callbacks_set_on_begin_frame_callback(cb, on_begin_frame);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, h2_on_data_chunk);
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
    nghttp2_session_callbacks_set_send_data_callback(cb, h2_send_data);
    nghttp2_session_callbacks_set_data_source_read_length_callback(cb, h2_read_length);
    nghttp2_option_set_no_auto_window_update(opt, 1);
    nghttp2_option_set_max_outbound_ack(opt, 1000);
    nghttp2_option_set_max_settings(opt, 32);
    nghttp2_option_set_max_continuations(opt, s->o.max_header_bytes / 4096 + 8);
    int rc = nghttp2_session_server_new2(&hc->ss, cb, hc, opt);
    nghttp2_session_callbacks_del(cb);
    nghttp2_option_del(opt);
    if (rc != 0)
        abort(); /* out of memory */
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, max_streams(s)},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE,
         (uint32_t)(s->o.max_header_bytes > UINT32_MAX ? UINT32_MAX : s->o.max_header_bytes)},
        {NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, 1},
    };
    nghttp2_submit_settings(hc->ss, NGHTTP2_FLAG_NONE, iv, sizeof(iv) / sizeof(iv[0]));
    nghttp2_session_set_local_window_size(hc->ss, NGHTTP2_FLAG_NONE, 0, H2_CONN_WINDOW);
    c->h2 = hc;
    c->state = C_REQ;
    hc->tmode = -1;
    hc->bound = s->o.http2_conn_buffer ? s->o.http2_conn_buffer : H2_CONN_BUFFER;
    hc->wtail = &hc->waiting;
    HSTAT_ADD(s->stats.h2_open, 1);
    HSTAT_ADD(s->stats.h2_accepted, 1);
    size_t q = hc->bound / 4;
    hc->out_high = q > H2_OUT_HIGH ? H2_OUT_HIGH : q < H2_OUT_MIN ? H2_OUT_MIN : q;
    hc->out_low = hc->out_high / 4;
    bufferevent_setwatermark(c->bev, EV_WRITE, hc->out_low, 0);
    h2_on_read(c);
}

/* The timer: idle while no stream is open, stall while output waits (from
 * the last byte that left: progress), none otherwise. */
static void
timer_update(struct h2conn *hc, bool progress)
{
    struct hconn *c = hc->c;
    int mode = 0;
    if (hc->nopen == 0) {
        mode = 1;
    } else if (evbuffer_get_length(bufferevent_get_output(c->bev)) > 0) {
        mode = 2;
    } else {
        for (struct h2stream *st = hc->streams; st; st = st->next)
            if (h2_own_bytes(st) > 0) {
                mode = 2;
                break;
            }
    }
    if (mode == hc->tmode && !(mode == 2 && progress))
        return;
    hc->tmode = mode;
    event_del(c->timer);
    int ms = c->s->o.idle_timeout_ms;
    c->timer_idle = true;
    if (mode && ms > 0) {
        struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
        evtimer_add(c->timer, &tv);
    }
}

void
h2_on_timer(struct hconn *c)
{
    struct h2conn *hc = hc_of(c);
    if (hc->tmode != 3)
        HSTAT_ADD(c->s->stats.idle_timeouts, 1);
    log_debug("http2: closing a connection: %s",
              hc->tmode == 2 ? "its output made no progress (stalled)" : "idle");
    hconn_close(c);
}

/* nghttp2_session_send, its record under assembly to the output. */
static int
send_all(struct h2conn *hc)
{
    int rc = nghttp2_session_send(hc->ss);
    h2_rec_flush(hc);
    return rc;
}

/* Send what the session has (bounded by hc->out_high), tell the streams
 * that drained, free closed streams, close a finished session. */
static void
flush(struct h2conn *hc, bool progress)
{
    struct hconn *c = hc->c;
    if (c->state == C_DEAD || hc->in_recv)
        return;
    h2_pledges_age(hc);
    int rc = send_all(hc);
    if (rc != 0) {
        log_debug("http2: closing a connection: %s", nghttp2_strerror(rc));
        hconn_close(c);
        return;
    }
    /* the streams whose bytes were taken (freed only by reap_streams below) */
    struct h2stream *took = hc->took;
    hc->took = NULL;
    for (struct h2stream *st = took; st && c->state != C_DEAD;) {
        struct h2stream *next = st->tnext;
        struct hreq *r = st->r;
        st->took = false;
        st->tnext = NULL;
        progress = true;
        if (hc->exempt == st && h2_own_bytes(st) == 0)
            hc->exempt = NULL; /* its write left: the next one's turn */
        if (st->closed) {
            /* nothing owed */
        } else if (st->hs) {
            h2_wait_del(st);
            h2hs_sent(st); /* on_sent with what it reports (it may wait again) */
        } else if (!st->resp_ended && r->h && r->h->on_drain &&
                   evbuffer_get_length(st->out) <= r->low_water) {
            h2_wait_add(st); /* woken in turn, when the connection has room */
        }
        st = next;
    }
    if (c->state == C_DEAD)
        return;
    h2_wake_waiting(hc);
    if (c->state == C_DEAD)
        return;
    if (nghttp2_session_want_write(hc->ss) &&
        evbuffer_get_length(bufferevent_get_output(c->bev)) < hc->out_high)
        hconn_kick(c); /* a handler wrote in on_drain */
    reap_streams(hc);
    if (hc->deaf) {
        /* cut: close once the 431 has left (the last-words timer runs) */
        if (hc->cut_sent) {
            /* graceful: a plaintext socket lingers, so what the client
             * still sends does not turn the answer into a TCP reset */
            if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
                hconn_close_graceful(c);
            else
                c->close_when_flushed = true;
        }
        return;
    }
    if (!nghttp2_session_want_read(hc->ss) && !nghttp2_session_want_write(hc->ss)) {
        /* GOAWAY sent and every stream over */
        if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
            hconn_close(c);
        else
            c->close_when_flushed = true; /* http.c closes once it left */
        return;
    }
    timer_update(hc, progress);
}

void
h2_on_read(struct hconn *c)
{
    struct h2conn *hc = hc_of(c);
    struct evbuffer *in = bufferevent_get_input(c->bev);
    size_t len;
    if (hc->deaf) {
        evbuffer_drain(in, evbuffer_get_length(in)); /* cut: nothing more is read */
        return;
    }
    while (c->state != C_DEAD && (len = evbuffer_get_contiguous_space(in)) > 0) {
        const uint8_t *p = evbuffer_pullup(in, (ev_ssize_t)len);
        hc->in_recv = true;
        ssize_t n = nghttp2_session_mem_recv(hc->ss, p, len);
        hc->in_recv = false;
        /* counted once taken: what this piece decodes is paid for by the
         * bytes before it (hpack_budget), never by ones not yet parsed */
        hc->received += n >= 0 ? (size_t)n : len;
        HSTAT_ADD(c->s->stats.h2_bytes_in, n >= 0 ? (size_t)n : len);
        if (n < 0) {
            log_debug("http2: closing a connection: %s", nghttp2_strerror((int)n));
            if (n == NGHTTP2_ERR_FLOODED || n == NGHTTP2_ERR_BAD_CLIENT_MAGIC)
                HSTAT_ADD(c->s->stats.bad_requests, 1);
            /* nghttp2 queued a GOAWAY for a protocol error: let it leave,
             * for H2_LAST_WORDS_MS at most. A flood closes now (its peer
             * does not read). */
            if (c->state != C_DEAD && n != NGHTTP2_ERR_FLOODED && send_all(hc) == 0 &&
                evbuffer_get_length(bufferevent_get_output(c->bev)) > 0) {
                c->close_when_flushed = true;
                bufferevent_disable(c->bev, EV_READ);
                hc->tmode = 3;
                struct timeval tv = {H2_LAST_WORDS_MS / 1000, (H2_LAST_WORDS_MS % 1000) * 1000};
                evtimer_add(c->timer, &tv);
            } else {
                hconn_close(c);
            }
            return;
        }
        evbuffer_drain(in, (size_t)n);
        if (hc->cut) {
            cut(hc);
            hc->cut = NULL;
            break;
        }
    }
    if (c->state == C_DEAD)
        return;
    h2_deliver_bodies(hc);
    flush(hc, false);
}

void
h2_on_write(struct hconn *c)
{
    flush(hc_of(c), true);
}

void
h2_on_kick(struct hconn *c)
{
    struct h2conn *hc = hc_of(c);
    h2_deliver_bodies(hc);
    flush(hc, false);
}

void
h2_conn_closed(struct hconn *c)
{
    struct h2conn *hc = hc_of(c);
    HSTAT_SUB(c->s->stats.h2_open, 1);
    while (hc->streams)
        stream_closed(hc->streams, HREQ_END_CLOSED);
    h2hs_conn_gone(hc);
}

void
h2_conn_free(struct hconn *c)
{
    struct h2conn *hc = c->h2;
    if (!hc)
        return;
    assert(!hc->streams);
    reap_streams(hc);
    h2_rec_flush(hc); /* dead: freed */
    nghttp2_session_del(hc->ss);
    hc->magic = 0;
    free(hc);
    c->h2 = NULL;
}

void
h2_last_words(struct hconn *c)
{
    struct h2conn *hc = hc_of(c);
    if (c->state == C_DEAD || hc->in_recv)
        return;
    if (!hc->goaway) {
        hc->goaway = true;
        HSTAT_ADD(c->s->stats.h2_goaways, 1);
        nghttp2_submit_goaway(hc->ss, NGHTTP2_FLAG_NONE,
                              nghttp2_session_get_last_proc_stream_id(hc->ss), NGHTTP2_NO_ERROR,
                              NULL, 0);
    }
    if (send_all(hc) != 0 || c->ssl || c->fd < 0)
        return;
    /* the bufferevent keeps its output's start frozen (only it drains it);
     * it never writes again: one try here, never blocking */
    struct evbuffer *out = bufferevent_get_output(c->bev);
    evbuffer_unfreeze(out, 1);
    evbuffer_write(out, c->fd);
}

void
h2_shutdown(struct hconn *c)
{
    struct h2conn *hc = hc_of(c);
    if (c->state == C_DEAD || hc->goaway)
        return;
    hc->goaway = true; /* once: every unauthenticated stream asks for it */
    HSTAT_ADD(c->s->stats.h2_goaways, 1);
    nghttp2_submit_goaway(hc->ss, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(hc->ss), NGHTTP2_NO_ERROR, NULL,
                          0);
    hconn_kick(c);
}

/* ---- a stream's request and response (hreq.c, hresp.c) ---- */

static bool
stream_live(const struct h2stream *st)
{
    return !st->closed && st->hc->c->state != C_DEAD;
}

static nghttp2_nv
nv_of(const char *name, const char *value)
{
    return (nghttp2_nv){(uint8_t *)(uintptr_t)name, (uint8_t *)(uintptr_t)value, strlen(name),
                        strlen(value), NGHTTP2_NV_FLAG_NONE};
}

void
h2_body_read(struct hreq *r, bool on)
{
    struct h2stream *st = r->h2;
    r->reading = on;
    st->paused = !on;
    if (!on || !stream_live(st))
        return;
    if (r->expect_continue && !r->sent_continue && !r->started) {
        /* a 100 HEADERS frame, as Go's server sends when the body is read */
        r->sent_continue = true;
        nghttp2_nv nv = nv_of(":status", "100");
        nghttp2_submit_headers(st->hc->ss, NGHTTP2_FLAG_NONE, st->id, NULL, &nv, 1, NULL);
    }
    hconn_kick(st->hc->c);
}

void
h2_resp_header(struct hreq *r, const char *name, const char *value)
{
    struct h2stream *st = r->h2;
    /* connection-specific fields have no place in HTTP/2 (RFC 9113 8.2.2) */
    static const char *const drop[] = {"connection", "transfer-encoding", "keep-alive", "upgrade",
                                       "proxy-connection"};
    for (size_t i = 0; i < sizeof(drop) / sizeof(drop[0]); i++)
        if (strcasecmp(name, drop[i]) == 0)
            return;
    if (strcasecmp(name, "Date") == 0)
        r->has_date = true;
    for (const char *p = name; *p; p++)
        gostr_addc(&st->rh, (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p));
    gostr_addc(&st->rh, '\0');
    gostr_addn(&st->rh, value, strcspn(value, "\r\n"));
    gostr_addc(&st->rh, '\0');
    st->nrh++;
}

void
h2_resp_start(struct hreq *r, int status, int64_t content_length)
{
    struct h2stream *st = r->h2;
    r->status = status;
    r->head_ns = http_now_ns();
    r->no_body = r->head_method || status == 204 || status == 304 || status < 200;
    if (!stream_live(st))
        return;
    nghttp2_nv *nv = xcalloc(st->nrh + 3, sizeof(*nv));
    size_t n = 0;
    char code[8], clen[24];
    snprintf(code, sizeof(code), "%d", status);
    nv[n++] = nv_of(":status", code);
    const char *p = st->rh.p;
    for (size_t i = 0; i < st->nrh; i++) {
        const char *v = p + strlen(p) + 1;
        nv[n++] = nv_of(p, v);
        p = v + strlen(v) + 1;
    }
    if (!r->has_date)
        nv[n++] = nv_of("date", hresp_date(st->hc->c->s));
    if (content_length >= 0 && status != 204 && status != 304 && status >= 200) {
        snprintf(clen, sizeof(clen), "%lld", (long long)content_length);
        nv[n++] = nv_of("content-length", clen);
    }
    nghttp2_data_provider dp = {.source.ptr = st, .read_callback = h2_read_data};
    nghttp2_submit_response(st->hc->ss, st->id, nv, n, r->no_body ? NULL : &dp);
    free(nv);
    hconn_kick(st->hc->c);
}

void
h2_resp_write(struct hreq *r, const void *p, size_t n)
{
    struct h2stream *st = r->h2;
    if (!stream_live(st) || n == 0 || r->no_body)
        return;
    evbuffer_add(st->out, p, n);
    h2_queued_add(st, n);
    nghttp2_session_resume_data(st->hc->ss, st->id);
    hconn_kick(st->hc->c);
}

void
h2_resp_write_buffer(struct hreq *r, struct evbuffer *buf)
{
    struct h2stream *st = r->h2;
    if (!stream_live(st) || r->no_body) {
        evbuffer_drain(buf, evbuffer_get_length(buf));
        return;
    }
    size_t n = evbuffer_get_length(buf);
    evbuffer_add_buffer(st->out, buf);
    h2_queued_add(st, n);
    nghttp2_session_resume_data(st->hc->ss, st->id);
    hconn_kick(st->hc->c);
}

size_t
h2_resp_queued(const struct hreq *r)
{
    return stream_live(r->h2) ? h2_queued_report(r->h2, evbuffer_get_length(r->h2->out)) : 0;
}

void
h2_resp_end(struct hreq *r)
{
    struct h2stream *st = r->h2;
    st->resp_ended = true;
    if (!stream_live(st))
        return;
    h2_unwait(st);
    nghttp2_session_resume_data(st->hc->ss, st->id);
    hconn_kick(st->hc->c);
}

void
h2_resp_abort(struct hreq *r)
{
    struct h2stream *st = r->h2;
    if (!stream_live(st))
        return;
    st->aborted = true; /* kwc's own decision: not counted against the client */
    nghttp2_submit_rst_stream(st->hc->ss, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
    hconn_kick(st->hc->c);
}
