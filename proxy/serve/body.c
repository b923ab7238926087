/*
 * body.c — pretty-printing and gzip for the answers serve builds from the
 * cache (see body.h). Sits between serve.c and the response writer: serve
 * hands over its blocks as today; a body that needs neither passes them
 * straight on (BODY_DIRECT), any other is re-indented (jindent) into a
 * hold of BODY_GZIP_MIN + 1 bytes, and the hold decides: ended within it,
 * one identity answer with Content-Length; past it, the head goes out and
 * the rest streams, identity (BODY_PLAIN) or through zlib (BODY_GZIP).
 *
 * Why here and not in proxy/http: which answers compress is serving policy
 * (kube's SerializeObject compresses the objects it writes, never a watch,
 * and passthrough keeps the upstream's encoding), and the decision needs
 * the body's size after pretty-printing; http/ frames bytes and knows no
 * Kubernetes. The compression runs on the loop that writes the answer,
 * piece by piece, paced by its response queue like the list it carries.
 */
#include "kwc/body.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#define ZLIB_CONST
#include <zlib.h>

#include "kwc/base.h"
#include "kwc/http.h"
#include "kwc/log.h"

/* The length of the white space (Go's unicode.IsSpace, as strings.TrimSpace
 * trims it) encoded in UTF-8 at s[0..n) from its start (end false) or
 * ending at s + n (end true); 0: none. */
static size_t
space_at(const unsigned char *s, size_t n, bool end)
{
    if (n >= 1) {
        unsigned char c = end ? s[n - 1] : s[0];
        if (c == ' ' || (c >= '\t' && c <= '\r'))
            return 1;
    }
    /* U+0085, U+00A0 (2 bytes); U+1680, U+2000..U+200A, U+2028, U+2029,
     * U+202F, U+205F, U+3000 (3 bytes) */
    if (n >= 2) {
        const unsigned char *p = end ? s + n - 2 : s;
        if (p[0] == 0xC2 && (p[1] == 0x85 || p[1] == 0xA0))
            return 2;
    }
    if (n >= 3) {
        const unsigned char *p = end ? s + n - 3 : s;
        unsigned cp = ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
        if ((p[0] & 0xF0) == 0xE0 && (p[1] & 0xC0) == 0x80 && (p[2] & 0xC0) == 0x80 &&
            (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
             cp == 0x202F || cp == 0x205F || cp == 0x3000))
            return 3;
    }
    return 0;
}

bool
body_accepts_gzip(const char *ae)
{
    if (!ae)
        return false;
    /* kube: strings.Split(h, ","), each token strings.TrimSpace'd, == "gzip" */
    for (const char *s = ae;;) {
        const char *comma = strchr(s, ',');
        const unsigned char *a = (const unsigned char *)s;
        size_t n = comma ? (size_t)(comma - s) : strlen(s), k;
        while ((k = space_at(a, n, false)) > 0) {
            a += k;
            n -= k;
        }
        while ((k = space_at(a, n, true)) > 0)
            n -= k;
        if (n == 4 && memcmp(a, "gzip", 4) == 0)
            return true;
        if (!comma)
            return false;
        s = comma + 1;
    }
}

/* ---- blocks ---- */

static char *
data(struct body_buf *k)
{
    return k->base + HRESP_BLOCK_BEFORE;
}

static void
buf_alloc(struct body_buf *k, size_t cap)
{
    k->base = xmalloc(HRESP_BLOCK_BEFORE + cap + HRESP_BLOCK_AFTER);
    k->len = 0;
    k->cap = cap;
}

/* Room for cap bytes, the bytes held kept (a hold grows as it fills). */
static void
buf_grow(struct body_buf *k, size_t cap)
{
    k->base = xrealloc(k->base, HRESP_BLOCK_BEFORE + cap + HRESP_BLOCK_AFTER);
    k->cap = cap;
}

/* The block goes to the response (which frees it), or is freed if empty. */
static void
buf_send(struct body *b, struct body_buf *k)
{
    if (k->len > 0)
        hresp_write_block(b->req, k->base, data(k), k->len);
    else
        free(k->base);
    *k = (struct body_buf){0};
}

/* ---- the stages ---- */

static bool
input_left(const struct body *b)
{
    return b->in_len > 0 || (b->pretty && jindent_pending(&b->ji));
}

/* The answer's next bytes (re-indented, or as given) into dst[0..room). */
static size_t
produce(struct body *b, char *dst, size_t room)
{
    size_t used, w;
    if (b->pretty) {
        w = jindent_run(&b->ji, b->in, b->in_len, &used, dst, room);
    } else {
        w = used = b->in_len < room ? b->in_len : room;
        if (w > 0) /* b->in is NULL when nothing is in hand */
            memcpy(dst, b->in, w);
    }
    if (used > 0) {
        b->in += used;
        b->in_len -= used;
    }
    if (b->in_len == 0) {
        free(b->in_block);
        b->in_block = NULL;
        b->in = NULL;
    }
    return w;
}

/* n bytes at p through zlib; the compressed bytes leave piece by piece
 * (last: the stream's end, whatever zlib still holds). */
static void
gz_write(struct body *b, const char *p, size_t n, bool last)
{
    z_stream *z = b->z;
    z->next_in = (const Bytef *)p;
    z->avail_in = (uInt)n;
    for (;;) {
        if (!b->zout.base)
            buf_alloc(&b->zout, BODY_PIECE);
        size_t room = b->zout.cap - b->zout.len;
        z->next_out = (Bytef *)data(&b->zout) + b->zout.len;
        z->avail_out = (uInt)room;
        int rc = deflate(z, last ? Z_FINISH : Z_NO_FLUSH);
        assert(rc == Z_OK || rc == Z_STREAM_END || rc == Z_BUF_ERROR);
        size_t made = room - z->avail_out;
        b->zout.len += made;
        if (b->zout.len == b->zout.cap) {
            buf_send(b, &b->zout);
            continue;
        }
        if (last ? rc == Z_STREAM_END : z->avail_in == 0)
            return;
    }
}

/* The hold passed BODY_GZIP_MIN: the head goes out, the rest streams. */
static void
decide_stream(struct body *b)
{
    if (b->gzip_ok) {
        z_stream *z = xcalloc(1, sizeof(*z));
        /* level 1 (kube: gzip.BestSpeed), a gzip wrapper (15 + 16) */
        if (deflateInit2(z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK) {
            b->z = z;
            hresp_header(b->req, "Content-Encoding", "gzip");
            hresp_header(b->req, "Vary", "Accept-Encoding");
            hresp_start(b->req, b->status, -1);
            b->mode = BODY_GZIP;
            gz_write(b, data(&b->buf), b->buf.len, false);
            /* the 128 KiB hold is done with: the next pieces take 64 KiB */
            free(b->buf.base);
            b->buf = (struct body_buf){0};
            return;
        }
        free(z);
        log_warnx("%s: zlib could not start (out of memory): answering uncompressed",
                  hreq_target(b->req, NULL));
    }
    hresp_start(b->req, b->status, -1);
    b->mode = BODY_PLAIN;
    b->held = true; /* it leaves piece by piece, as the queue allows */
}

/* The answer is whole: what it held is released now, not when the request
 * closes (its last bytes may wait long for a slow client, and over HTTP/2
 * a connection carries many such answers). */
static void
finish(struct body *b)
{
    hresp_end(b->req);
    b->mode = BODY_DONE;
    free(b->buf.base);
    b->buf = (struct body_buf){0};
    if (b->z) {
        deflateEnd(b->z);
        free(b->z);
        b->z = NULL;
    }
}

/* Work through the input in hand while the response queue allows. */
static void
step(struct body *b)
{
    for (;;) {
        switch (b->mode) {
        case BODY_HOLD:
            /* the hold grows as it fills (most answers are small: a get of
             * one object need not take 128 KiB), to BODY_GZIP_MIN + 1 */
            if (!b->buf.base)
                buf_alloc(&b->buf, BODY_HOLD_FIRST);
            else if (b->buf.len == b->buf.cap && b->buf.cap <= BODY_GZIP_MIN)
                buf_grow(&b->buf,
                         b->buf.cap * 2 < BODY_GZIP_MIN + 1 ? b->buf.cap * 2 : BODY_GZIP_MIN + 1);
            b->buf.len += produce(b, data(&b->buf) + b->buf.len, b->buf.cap - b->buf.len);
            if (b->buf.len == b->buf.cap && b->buf.cap <= BODY_GZIP_MIN && input_left(b))
                continue; /* full below the threshold: grow */
            if (b->buf.len > BODY_GZIP_MIN) {
                decide_stream(b);
                continue;
            }
            if (b->in_end) {
                /* within the threshold: one identity answer */
                hresp_start(b->req, b->status, (int64_t)b->buf.len);
                buf_send(b, &b->buf);
                finish(b);
            }
            return;
        case BODY_PLAIN:
            if (hresp_queued(b->req) >= b->limit)
                return;
            if (b->held) {
                /* the hold, 128 KiB, would overrun the queue's bound at once
                 * (and HTTP/2's room for one piece: h2room.c) */
                size_t k =
                    b->buf.len - b->held_off < BODY_PIECE ? b->buf.len - b->held_off : BODY_PIECE;
                struct body_buf piece;
                buf_alloc(&piece, k);
                memcpy(data(&piece), data(&b->buf) + b->held_off, k);
                piece.len = k;
                buf_send(b, &piece);
                b->held_off += k;
                if (b->held_off == b->buf.len) {
                    free(b->buf.base);
                    b->buf = (struct body_buf){0};
                    b->held = false;
                }
                continue;
            }
            if (!b->buf.base)
                buf_alloc(&b->buf, BODY_PIECE);
            b->buf.len += produce(b, data(&b->buf) + b->buf.len, b->buf.cap - b->buf.len);
            if (b->buf.len == b->buf.cap) {
                buf_send(b, &b->buf);
                continue;
            }
            /* the input is used up (else the piece would be full) */
            if (b->in_end) {
                buf_send(b, &b->buf);
                finish(b);
            }
            return;
        case BODY_GZIP: {
            if (hresp_queued(b->req) >= b->limit || (!input_left(b) && !b->in_end))
                return;
            if (!b->buf.base)
                buf_alloc(&b->buf, BODY_PIECE);
            size_t n = produce(b, data(&b->buf), b->buf.cap);
            bool last = b->in_end && !input_left(b);
            gz_write(b, data(&b->buf), n, last);
            if (last) {
                buf_send(b, &b->zout);
                finish(b);
                return;
            }
            continue;
        }
        case BODY_DIRECT:
        case BODY_DONE:
            return;
        }
    }
}

/* ---- the interface ---- */

void
body_init(struct body *b, struct hreq *req, bool pretty, bool gzip_ok, size_t limit)
{
    *b = (struct body){.req = req, .pretty = pretty, .gzip_ok = gzip_ok, .limit = limit};
    b->mode = pretty || gzip_ok ? BODY_HOLD : BODY_DIRECT;
    jindent_init(&b->ji);
}

void
body_set_pretty(struct body *b, bool pretty)
{
    assert(b->status == 0); /* before body_start */
    b->pretty = pretty;
    b->mode = pretty || b->gzip_ok ? BODY_HOLD : BODY_DIRECT;
}

void
body_fini(struct body *b)
{
    free(b->in_block);
    free(b->buf.base);
    free(b->zout.base);
    if (b->z) {
        deflateEnd(b->z);
        free(b->z);
    }
    *b = (struct body){0};
}

void
body_start(struct body *b, int status, int64_t content_length)
{
    b->status = status;
    if (b->mode == BODY_DIRECT)
        hresp_start(b->req, status, content_length);
}

void
body_write_block(struct body *b, void *block, char *p, size_t n)
{
    if (b->mode == BODY_DIRECT) {
        hresp_write_block(b->req, block, p, n);
        return;
    }
    assert(!b->in_block && b->in_len == 0 && !b->in_end && b->mode != BODY_DONE);
    if (n == 0) {
        free(block);
        return;
    }
    b->in_block = block;
    b->in = p;
    b->in_len = n;
    step(b);
}

void
body_write(struct body *b, const void *p, size_t n)
{
    if (b->mode == BODY_DIRECT) {
        hresp_write(b->req, p, n);
        return;
    }
    char *block = xmalloc(HRESP_BLOCK_BEFORE + n + HRESP_BLOCK_AFTER);
    memcpy(block + HRESP_BLOCK_BEFORE, p, n);
    body_write_block(b, block, block + HRESP_BLOCK_BEFORE, n);
}

void
body_end(struct body *b)
{
    if (b->mode == BODY_DIRECT) {
        hresp_end(b->req);
        b->mode = BODY_DONE;
        return;
    }
    b->in_end = true;
    step(b);
}

bool
body_busy(const struct body *b)
{
    return b->mode != BODY_DIRECT && b->mode != BODY_DONE &&
           (input_left(b) || b->in_end || b->held);
}

bool
body_flush(struct body *b)
{
    step(b);
    return !body_busy(b);
}
