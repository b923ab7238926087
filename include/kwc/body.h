/*
 * body.h — the body of an answer kwc builds from the cache (a list, a get,
 * their Status errors), written the way kube-apiserver's response writer
 * (responsewriters.SerializeObject) writes it: pretty-printed JSON when the
 * request asked for it (jindent.h), gzip when the client accepts it and the
 * body is large. Serve (proxy/serve/serve.c) writes through it instead of
 * the response writer (http.h); watches and passthrough never do (kube
 * never compresses a watch; passthrough relays the upstream's bytes).
 *
 * kube's rules (k8s.io/apiserver/pkg/endpoints/handlers/responsewriters):
 *  - gzip iff the first Accept-Encoding header line, split on ',' with each
 *    token trimmed, has a token equal to "gzip" (no q-values: "gzip;q=1",
 *    "GZIP", "*", "x-gzip" are not) AND the body (after pretty-printing)
 *    is larger than BODY_GZIP_MIN bytes; level 1 (gzip.BestSpeed); then
 *    Content-Encoding: gzip, Vary: Accept-Encoding and no Content-Length.
 *  - otherwise the identity body, as without this layer.
 *
 * Streaming and memory: the decision needs the first BODY_GZIP_MIN + 1
 * bytes, so a transformed body (pretty, or gzip accepted) is held until it
 * passes them (then the head goes out, streamed) or ends first (then one
 * answer with Content-Length). Past the decision the body is produced in
 * pieces of at most BODY_PIECE bytes while the response queue stays below
 * `limit`; past it the input waits (body_busy) until the caller's on_drain
 * calls body_flush. Memory per answer: the input block the caller handed
 * over, the hold (BODY_GZIP_MIN + 1) or one piece, zlib's state (about
 * 270 KiB at level 1) and one compressed piece. Pretty output can be many
 * times its input (2 bytes per level per line): it still leaves piece by
 * piece, bounded by the queue.
 *
 * An answer without transformation (compact, no gzip accepted) maps
 * one-to-one onto hresp_start / hresp_write_block / hresp_end: the
 * zero-copy path of lists is unchanged.
 *
 * Loop thread only (the request's).
 */
#ifndef KWC_BODY_H
#define KWC_BODY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kwc/jindent.h"

struct hreq;

/* kube's defaultGzipThresholdBytes: bodies strictly larger are compressed */
#define BODY_GZIP_MIN (128 * 1024)
/* A piece produced at once past the decision (one HTTP/1.1 chunk with its
 * framing in 64 KiB, as serve's list chunks) */
#define BODY_PIECE (64 * 1024 - 24)
/* The hold's first size; it doubles as it fills, to BODY_GZIP_MIN + 1 */
#define BODY_HOLD_FIRST (8 * 1024)

struct body_buf {
    char *base; /* malloc'd: data at base + HRESP_BLOCK_BEFORE */
    size_t len, cap;
};

struct body {
    struct hreq *req;
    bool pretty, gzip_ok;
    size_t limit;
    int status;
    enum { BODY_DIRECT, BODY_HOLD, BODY_PLAIN, BODY_GZIP, BODY_DONE } mode;
    bool in_end; /* body_end called */
    /* the input being consumed (a block taken over) */
    void *in_block;
    const char *in;
    size_t in_len;
    struct jindent ji;
    struct body_buf buf; /* HOLD: what is held; PLAIN: the piece being filled; GZIP: the
                            piece to compress */
    bool held;           /* PLAIN: the hold still leaving, from held_off on */
    size_t held_off;
    struct body_buf zout; /* GZIP: the compressed piece being filled */
    void *z;              /* GZIP: zlib's z_stream */
};

/*
 * Start a body for req: pretty re-indents JSON (false for protobuf),
 * gzip_ok from body_accepts_gzip. limit: the response queue past which the
 * body waits (the caller's low-water mark, whose on_drain calls
 * body_flush). The caller adds its headers (hresp_header) before the first
 * write. body_fini releases it (any time, also mid-answer).
 */
void body_init(struct body *b, struct hreq *req, bool pretty, bool gzip_ok, size_t limit);
void body_fini(struct body *b);
/* Pretty or not for this answer (an error's Status may be negotiated apart
 * from the object asked for: route_accept_status). Before body_start. */
void body_set_pretty(struct body *b, bool pretty);

/* kube's gzip test on the first Accept-Encoding header line (NULL: none). */
bool body_accepts_gzip(const char *accept_encoding);

/*
 * The answer's status. content_length: the body's length as given (before
 * any transformation), or -1 when it is streamed in several writes; only
 * the untransformed answer uses it (as hresp_start does).
 */
void body_start(struct body *b, int status, int64_t content_length);
/* n bytes at p inside block (malloc'd, with HRESP_BLOCK_BEFORE bytes before
 * p and HRESP_BLOCK_AFTER after p + n): taken over, as hresp_write_block.
 * Not while body_busy. */
void body_write_block(struct body *b, void *block, char *p, size_t n);
/* The same for bytes copied from p. */
void body_write(struct body *b, const void *p, size_t n);
/* No more input: the answer ends once what is in hand has been written. */
void body_end(struct body *b);
/* Input in hand waits for the response queue to drain. */
bool body_busy(const struct body *b);
/* Go on after a drain: false while still busy. */
bool body_flush(struct body *b);

#endif
