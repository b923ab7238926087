/*
 * h2.h — HTTP/2's own structs, shared by h2.c (the session, streams as
 * requests) and h2stream.c (a stream handed off as a response stream,
 * hresp_handoff / hstream_*). Never included outside proxy/http/.
 */
#ifndef KWC_HTTP_H2_H
#define KWC_HTTP_H2_H

#include <nghttp2/nghttp2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "conn.h"
#include "kwc/gostr.h"

struct h2hs;
struct h2blk;

/* Session bytes ahead of the kernel (hc->out_high): a quarter of the
 * connection's bound, at most H2_OUT_HIGH, at least H2_OUT_MIN; the write
 * callback refills below a quarter of that (hc->out_low). 256 KiB, not
 * 64: a 1.5 MB list over TLS took 25 loop turns (48 epoll_ctl) per list,
 * and 15 % more CPU than over HTTP/1.1 */
#define H2_OUT_HIGH (256 * 1024)
#define H2_OUT_MIN (64 * 1024)
#define H2_CONN_BUFFER (1u << 20) /* the bound's default (http2_conn_buffer 0) */
#define H2_PLEDGE_MIN (16 * 1024) /* room promised to a handler told it may write */
/* Header data a connection may decode per byte it sent, past an allowance
 * of two full header lists (1 MiB at least): a real client's requests, all fields indexed,
 * decode to ~130 bytes per byte; an HPACK bomb to ~4,000 */
#define H2_HPACK_RATIO 256
#define H2_HPACK_FLOOR                                                                             \
    (1u << 20)                   /* the allowance when two lists are less (a burst of requests)    \
                                  */
#define H2_HELD_BODY (64u << 20) /* max_held_body's default */

struct h2stream {
    struct hreq *r;
    struct h2conn *hc;
    int32_t id;
    struct h2stream *next, **prev; /* open streams (hc->streams), then hc->dead */
    /* the head while it is decoded: regular fields as name\0value\0 */
    struct gostr_buf fields;
    size_t nfields;
    char *path, *authority;
    size_t hbytes; /* the header list's size so far (fields: name + value + 32) */
    bool too_big;
    bool aborted; /* kwc reset it on its own (hresp_abort, a stream it ends): not counted */
    /* the response */
    struct gostr_buf rh; /* response headers: name\0value\0 (lowercase) */
    size_t nrh;
    struct evbuffer *out; /* body bytes for the data provider */
    /* hresp_write_block's blocks in out, oldest first, and the bytes ever
     * taken from out (where a block lies: h2data.c) */
    struct h2blk *blk, **blk_tail;
    uint64_t out_taken;
    bool resp_ended; /* hresp_end: EOF once out is empty */
    bool end_sent;   /* END_STREAM left */
    bool took;       /* the provider took bytes in this send round (hc->took) */
    struct h2stream *tnext;
    /* the request body */
    struct evbuffer *in; /* received, not delivered (reading off or held) */
    bool paused;         /* hreq_body_read(off): buffer, do not discard */
    bool eof_in;         /* END_STREAM received */
    bool closed;         /* nghttp2 closed the stream (on_close ran) */
    bool incomplete;     /* counted in hc->incomplete: its request is not all read */
    struct h2hs *hs;     /* handed off as a response stream (h2stream.c) */
    /* the connection's bound (h2.c): waiting for room, in FIFO order */
    struct h2stream *wnext, **wprev; /* wprev NULL: not waiting */
    size_t pledge;                   /* room promised to its handler, not written yet */
    unsigned pledge_gen;             /* the send round it was promised in */
};

struct bucket {
    double tokens;
    uint64_t at_ns;
};

struct h2conn {
    uint32_t magic;
    struct hconn *c;
    nghttp2_session *ss;
    struct h2stream *streams, *dead;
    unsigned nopen;
    struct bucket resets, prio;
    int tmode; /* the timer: 0 none, 1 idle (no stream), 2 stall (output waits), 3 last words */
    bool in_recv, goaway, calm; /* a GOAWAY submitted; the session ended for a flood */
    /* HPACK bombs: header bytes decoded (fields as counted for the list
     * limit) against the bytes received (h2.c's hpack_budget) */
    uint64_t decoded, received;
    /* a header list over the limit: its stream is answered, nothing more is
     * read (h2.c's cut) */
    struct h2stream *cut; /* set by on_header, handled once nghttp2 returns */
    int32_t cut_id;
    bool deaf, cut_sent;
    /* the bound on queued response bytes (h2.c's header) */
    size_t queued;     /* body bytes in the open streams' queues */
    size_t pledged[2]; /* the streams' pledges of this send round and the one before */
    unsigned gen;      /* send rounds (flush): a pledge lasts this one and the next */
    size_t bound;
    size_t out_high, out_low;          /* the output's marks (H2_OUT_HIGH) */
    struct h2stream *waiting, **wtail; /* streams owed a wake, oldest first */
    struct h2stream *exempt;           /* the one stream let past a full connection */
    struct h2stream *took;             /* streams whose bytes the provider took */
    unsigned incomplete;               /* open streams whose request is not all read */
    /* handed-off streams closed whose bytes are still in the output (their
     * on_close waits for them: h2stream.c) */
    struct h2hs *zombies;
    /* TLS: the record under assembly (h2data.c), handed to the output at
     * the end of each nghttp2_session_send; empty between them */
    uint8_t *rec;
    size_t rec_len;
};

/* ---- h2data.c: the session's output ---- */

/* One TLS record's plaintext: over TLS, frames are copied into records
 * this large, each one chain of the output (one SSL_write). */
#define H2_REC 16384

/* The session's bytes not yet taken by the kernel: the output's and the
 * record under assembly. */
size_t h2_out_len(const struct h2conn *hc);
/* TLS: n bytes (n <= H2_REC) to fill now at the end of the record under
 * assembly (a record without room for them leaves first). */
uint8_t *h2_rec_take(struct h2conn *hc, size_t n);
/* TLS: the record under assembly to the output (after every
 * nghttp2_session_send: what the session sent leaves in this turn). */
void h2_rec_flush(struct h2conn *hc);

/* ---- h2room.c: the bound on queued bytes (its header) ---- */

/* st's own queue: its evbuffer and a handed-off stream's entries. */
size_t h2_own_bytes(const struct h2stream *st);
/* st is owed a wake when the connection has room (at the FIFO's tail). */
void h2_wait_add(struct h2stream *st);
void h2_wait_del(struct h2stream *st);
/* st owes and is owed nothing more (it closed or its response ended). */
void h2_unwait(struct h2stream *st);
/* A send round begins: pledges older than the last round lapse (a handler
 * told it may write that wrote nothing holds no room). */
void h2_pledges_age(struct h2conn *hc);
/* Wake the streams owed a wake that may write now, oldest first. */
void h2_wake_waiting(struct h2conn *hc);

/* n body bytes entered (h2_queued_add) or left (h2_queued_sub) st's queue. */
void h2_queued_add(struct h2stream *st, size_t n);
void h2_queued_sub(struct h2stream *st, size_t n);
/* What hresp_queued / hstream_queued report for st, whose own queue is
 * own (h2.c's header): own while the connection has room, else a figure
 * that stops its handler; then st waits for a wake. */
size_t h2_queued_report(struct h2stream *st, size_t own);

/* ---- h2body.c: request bodies (its header) ---- */

/* The session's on_data_chunk_recv callback. */
int h2_on_data_chunk(nghttp2_session *ss, uint8_t flags, int32_t id, const uint8_t *data,
                     size_t len, void *arg);
/* Hand buffered body bytes to readers, discard what nobody will read, and
 * complete the requests all read. */
void h2_deliver_bodies(struct h2conn *hc);
/* st's request is all read (END_STREAM and nothing buffered): complete. */
void h2_request_complete(struct h2stream *st);
/* st's request is all read, or st closed: h2_deliver_bodies is done with it. */
void h2_done_reading(struct h2stream *st);
/* st closes: what it buffered is dropped, the windows given back. */
void h2_in_drop(struct h2stream *st);

/* ---- h2data.c: DATA frames (its header) ---- */

/* The session's data provider (NGHTTP2_DATA_FLAG_NO_COPY) and its
 * send_data and data_source_read_length callbacks. */
ssize_t h2_read_data(nghttp2_session *ss, int32_t id, uint8_t *buf, size_t length, uint32_t *flags,
                     nghttp2_data_source *src, void *arg);
int h2_send_data(nghttp2_session *ss, nghttp2_frame *f, const uint8_t *framehd, size_t length,
                 nghttp2_data_source *src, void *arg);
ssize_t h2_read_length(nghttp2_session *ss, uint8_t type, int32_t id, int32_t conn_window,
                       int32_t stream_window, uint32_t max_frame, void *arg);
/* st is freed: its blocks leave the FIFO (those in frames stay held). */
void h2_blocks_drop(struct h2stream *st);

/* ---- h2stream.c ---- */

/* n bytes of the handed-off stream's entries (n <= its own bytes), for a
 * DATA frame: copied to dst (TLS; each entry released once copied), or
 * referenced from out (plaintext; each released once its bytes left out). */
void h2hs_copy(struct h2stream *st, char *dst, size_t n);
void h2hs_move(struct h2stream *st, struct evbuffer *out, size_t n);
/* The connection closed: its closed streams' bytes go with its output. */
void h2hs_conn_gone(struct h2conn *hc);
/* Bytes of the handed-off stream left (the provider took some): on_sent. */
void h2hs_sent(struct h2stream *st);
/* The handed-off stream's own queue (entries not yet framed). */
size_t h2hs_bytes(const struct h2hs *hs);
/* The nghttp2 stream closed: release every reference, on_close, free. */
void h2hs_closed(struct h2stream *st);

#endif
