/*
 * h2data.c — DATA frames: a stream's body from its queue into the
 * connection's output (h2.c's data provider), never through nghttp2's
 * frame buffer (NGHTTP2_DATA_FLAG_NO_COPY: h2_read_data says how many
 * bytes, h2_send_data writes the frame header and then the bytes).
 *
 * A stream's queue is its evbuffer (st->out: hresp_write copies,
 * hresp_write_buffer's chains, hresp_write_block's blocks as references)
 * followed, once the stream is handed off, by its handoff's entries
 * (h2stream.c: references to the hub's shared blobs, or copies).
 *
 * Plaintext: a frame's bytes are referenced where they lie. A block's
 * (hresp_write_block: a list's 64 KiB pieces) is held by each frame's
 * piece (struct h2blk, counted) until libevent drains the piece, once the
 * kernel took it; a handed-off stream's entry of 4 KiB or more likewise
 * (h2hs_move: the hub's blob is released only once its bytes were
 * written; a smaller one is copied once). Other chains
 * of st->out move whole; a frame's edge inside one of them copies (small
 * writes coalesced by libevent).
 *
 * TLS: the OpenSSL bufferevent makes one SSL_write (one record) per chain
 * segment, so a 9-byte frame header apart from its data would be a record
 * of its own and every reference a record's edge. Every frame of a send
 * round, header and data, is copied once into the connection's record
 * under assembly (H2_REC), the copy that sealing a record makes anyway
 * (docs/architecture.md, traps): a watch event fanned out to 40 streams of
 * one connection leaves in full records, not a record per stream. Entries
 * are released once copied; the record goes to the output by reference,
 * when full and at the end of the round (h2_rec_flush).
 *
 * Frame sizes: as large as the client's SETTINGS_MAX_FRAME_SIZE and the
 * windows allow, up to H2_FRAME_MAX in plaintext (Go's client advertises
 * 1 MiB since x/net's http2Config, none before: 16 KiB; h2load and
 * nghttp 16 KiB), one record over TLS.
 *
 * Loop thread only, as h2.c.
 */
#include "conn.h"
#include "h2.h"

#include <assert.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <nghttp2/nghttp2.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"

#define H2_FRAME_MAX (64 * 1024)  /* DATA payload, when the client's frame size allows */
#define H2_FRAME_TLS (H2_REC - 9) /* over TLS: the frame and its header fill one record */

size_t
h2_out_len(const struct h2conn *hc)
{
    return evbuffer_get_length(bufferevent_get_output(hc->c->bev)) + hc->rec_len;
}

static void
rec_done(const void *data, size_t len, void *arg)
{
    free(arg);
}

void
h2_rec_flush(struct h2conn *hc)
{
    if (hc->rec_len > 0 && hc->c->state != C_DEAD) {
        if (evbuffer_add_reference(bufferevent_get_output(hc->c->bev), hc->rec, hc->rec_len,
                                   rec_done, hc->rec) != 0)
            abort(); /* out of memory */
    } else {
        free(hc->rec);
    }
    hc->rec = NULL;
    hc->rec_len = 0;
}

uint8_t *
h2_rec_take(struct h2conn *hc, size_t n)
{
    assert(n <= H2_REC);
    if (hc->rec && hc->rec_len + n > H2_REC)
        h2_rec_flush(hc);
    if (!hc->rec)
        hc->rec = xmalloc(H2_REC);
    uint8_t *p = hc->rec + hc->rec_len;
    hc->rec_len += n;
    return p;
}

/* A block of hresp_write_block in a stream's out, and in frames sent. */
struct h2blk {
    void *block;    /* the writer's malloc: freed with the last reference */
    const char *p;  /* its bytes */
    uint64_t start; /* its first byte's place in st->out (st->out_taken's count) */
    size_t len;
    unsigned refs; /* its chain in st->out, the FIFO, each piece in the output */
    struct h2blk *next;
};

static void
blk_unref(struct h2blk *b)
{
    if (--b->refs > 0)
        return;
    free(b->block);
    free(b);
}

static void
blk_chain_done(const void *data, size_t len, void *arg)
{
    blk_unref(arg);
}

void
h2_resp_write_block(struct hreq *r, void *block, char *p, size_t n)
{
    struct h2stream *st = r->h2;
    if (st->closed || st->hc->c->state == C_DEAD || n == 0 || r->no_body) {
        free(block);
        return;
    }
    struct h2blk *b = xmalloc(sizeof(*b));
    *b = (struct h2blk){.block = block,
                        .p = p,
                        .start = st->out_taken + evbuffer_get_length(st->out),
                        .len = n,
                        .refs = 2};
    if (evbuffer_add_reference(st->out, p, n, blk_chain_done, b) != 0)
        abort(); /* out of memory */
    if (!st->blk)
        st->blk_tail = &st->blk;
    *st->blk_tail = b;
    st->blk_tail = &b->next;
    h2_queued_add(st, n);
    nghttp2_session_resume_data(st->hc->ss, st->id);
    hconn_kick(st->hc->c);
}

void
h2_blocks_drop(struct h2stream *st)
{
    while (st->blk) {
        struct h2blk *b = st->blk;
        st->blk = b->next;
        blk_unref(b);
    }
}

/* n bytes left st->out: the blocks all taken leave the FIFO. */
static void
out_took(struct h2stream *st, size_t n)
{
    st->out_taken += n;
    while (st->blk && st->blk->start + st->blk->len <= st->out_taken) {
        struct h2blk *b = st->blk;
        st->blk = b->next;
        blk_unref(b);
    }
}

/* n bytes of st->out to out: a block's by reference, the rest moved. */
static int
out_move(struct h2stream *st, struct evbuffer *out, size_t n)
{
    while (n > 0) {
        struct h2blk *b = st->blk;
        size_t k;
        if (b && b->start <= st->out_taken) {
            size_t off = (size_t)(st->out_taken - b->start);
            k = b->len - off < n ? b->len - off : n;
            b->refs++;
            if (evbuffer_add_reference(out, b->p + off, k, blk_chain_done, b) != 0)
                abort(); /* out of memory */
            evbuffer_drain(st->out, k);
        } else {
            /* up to the next block: whole chains move, an edge copies */
            k = b && b->start - st->out_taken < n ? (size_t)(b->start - st->out_taken) : n;
            if (evbuffer_remove_buffer(st->out, out, k) != (int)k)
                return -1;
        }
        out_took(st, k);
        n -= k;
    }
    return 0;
}

ssize_t
h2_read_data(nghttp2_session *ss, int32_t id, uint8_t *buf, size_t length, uint32_t *flags,
             nghttp2_data_source *src, void *arg)
{
    struct h2stream *st = src->ptr;
    struct h2conn *hc = st->hc;
    /* the bytes go in h2_send_data */
    size_t have = h2_own_bytes(st);
    size_t n = have < length ? have : length;
    if (n > 0)
        *flags |= NGHTTP2_DATA_FLAG_NO_COPY;
    if (n == have && st->resp_ended)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    else if (n == 0)
        return NGHTTP2_ERR_DEFERRED;
    if (n > 0 && !st->took) {
        st->took = true;
        st->tnext = hc->took;
        hc->took = st;
    }
    return (ssize_t)n;
}

int
h2_send_data(nghttp2_session *ss, nghttp2_frame *f, const uint8_t *framehd, size_t length,
             nghttp2_data_source *src, void *arg)
{
    struct h2conn *hc = arg;
    struct h2stream *st = src->ptr;
    struct evbuffer *out = bufferevent_get_output(hc->c->bev);
    if (h2_out_len(hc) >= hc->out_high)
        return NGHTTP2_ERR_WOULDBLOCK; /* called again with the same frame */
    assert(f->data.padlen == 0);       /* kwc never pads */
    if (h2_own_bytes(st) < length)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* its queue went (closed): reset */
    size_t own = evbuffer_get_length(st->out);
    size_t a = own < length ? own : length; /* st->out's; the rest is the handoff's */
    if (hc->c->ssl) {
        uint8_t *p = h2_rec_take(hc, 9 + length); /* H2_FRAME_TLS: 9 + length <= H2_REC */
        memcpy(p, framehd, 9);
        if (a > 0 && evbuffer_remove(st->out, p + 9, a) != (int)a)
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        out_took(st, a);
        if (length > a)
            h2hs_copy(st, (char *)p + 9 + a, length - a);
    } else {
        evbuffer_add(out, framehd, 9);
        if (out_move(st, out, a) != 0)
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        if (length > a)
            h2hs_move(st, out, length - a);
    }
    h2_queued_sub(st, length);
    return 0;
}

/* DATA frames as large as the client allows (SETTINGS_MAX_FRAME_SIZE) and
 * the windows take, up to H2_FRAME_MAX: fewer frames, fewer headers. Over
 * TLS a frame with its header is one full record (H2_FRAME_TLS). */
ssize_t
h2_read_length(nghttp2_session *ss, uint8_t type, int32_t id, int32_t conn_window,
               int32_t stream_window, uint32_t max_frame, void *arg)
{
    struct h2conn *hc = arg;
    ssize_t most = hc->c->ssl ? H2_FRAME_TLS : H2_FRAME_MAX;
    ssize_t n = max_frame < (uint32_t)most ? (ssize_t)max_frame : most;
    if (conn_window < n)
        n = conn_window;
    if (stream_window < n)
        n = stream_window;
    return n > 0 ? n : 1;
}
