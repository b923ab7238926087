/*
 * h1client.h — private to proxy/upstream: kwc as an HTTP/1.1 client on a
 * connection of its own (tunnel.c's upgrade requests). Only the framing
 * lives here; what goes into a head (which headers, whose credentials) and
 * what an answer means are the caller's. Loop thread only; no I/O: bytes go
 * into and come out of the caller's buffers.
 *
 *  - the request head: h1c_head_begin (request line and Host), then
 *    h1c_head_header / h1c_head_line in the caller's order, then h1c_head_end.
 *    The body's framing headers (Content-Length or Transfer-Encoding:
 *    chunked) are among the caller's: a tunnel replays the client's own,
 *    byte for byte, and tells the body encoder which framing they announced.
 *  - the body: h1c_body_write per piece (a chunk each when chunked),
 *    h1c_body_end once (chunked: the last chunk, no trailers).
 *  - the answer: struct h1c_resp parses it with libhttp-parser (a response
 *    to one request: it stops after one message). A 101 ends the parse at
 *    the end of its head (h1c_resp_switching, h1c_resp_head_len): the bytes
 *    behind it belong to the new protocol, and the caller, which fed the
 *    head from its own buffer, still holds it for a verbatim relay.
 */
#ifndef KWC_UPSTREAM_H1CLIENT_H
#define KWC_UPSTREAM_H1CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;

/* ---- the request ---- */

/* "METHOD TARGET HTTP/1.1\r\nHost: host:port\r\n" (an IPv6 literal host in
 * brackets). target in origin form (the caller checked). */
void h1c_head_begin(struct evbuffer *out, const char *method, const char *target, const char *host,
                    const char *port);
/* "name: value\r\n" */
void h1c_head_header(struct evbuffer *out, const char *name, const char *value);
/* A whole header line "Name: value" (as uplink_cred_get gives it) + "\r\n". */
void h1c_head_line(struct evbuffer *out, const char *line);
/* The blank line that ends the head. */
void h1c_head_end(struct evbuffer *out);

/* How the request's body is framed, as its head announced it. */
enum h1c_framing {
    H1C_LENGTH,  /* Content-Length: the bytes as they are */
    H1C_CHUNKED, /* Transfer-Encoding: chunked */
};

/* n bytes of the body (n == 0: nothing; chunked: one chunk "%zx\r\n...\r\n"). */
void h1c_body_write(struct evbuffer *out, enum h1c_framing f, const void *p, size_t n);
/* The body is over: chunked, the last chunk "0\r\n\r\n"; else nothing. */
void h1c_body_end(struct evbuffer *out, enum h1c_framing f);

/* ---- the answer ---- */

#define H1C_MAX_HEADERS 1024 /* more in one head: a malformed answer */

struct h1c_resp;

struct h1c_resp_ops {
    /* The head of a final answer (status >= 200) is complete: the status
     * and headers are readable. Not called for a 101 (the parse stops, see
     * h1c_resp_switching) nor another 1xx (the parse stops too: the caller
     * sees h1c_resp_status). */
    void (*on_head)(void *arg, struct h1c_resp *r);
    /* a piece of the body, de-chunked */
    void (*on_body)(void *arg, const char *p, size_t n);
    /* the answer is complete; the parse stops (nothing more is consumed) */
    void (*on_complete)(void *arg);
};

/* head_method: the request was a HEAD (its answer has no body). */
struct h1c_resp *h1c_resp_new(bool head_method, const struct h1c_resp_ops *ops, void *arg);
void h1c_resp_free(struct h1c_resp *r);

/* Parse n bytes at p (n == 0: the upstream closed the connection); returns
 * how many were consumed. Fewer than n: the parse stopped (an error, a 1xx,
 * the answer complete). Callbacks run inside. */
size_t h1c_resp_feed(struct h1c_resp *r, const char *p, size_t n);
/* NULL, or what is malformed (the parser's description); a stop after a
 * complete answer or a 101 is no error. */
const char *h1c_resp_error(const struct h1c_resp *r);
/* The answer's status once its head is complete, else 0. */
int h1c_resp_status(const struct h1c_resp *r);
/* The answer is a 101: its head ended after h1c_resp_head_len bytes of all
 * fed so far; nothing behind it was consumed. */
bool h1c_resp_switching(const struct h1c_resp *r);
size_t h1c_resp_head_len(const struct h1c_resp *r);
/* The body's length as the head framed it: -1 chunked or until the close,
 * 0 for a HEAD, 204 or 304. Valid from on_head on. */
int64_t h1c_resp_body_length(const struct h1c_resp *r);

/* The head's headers (from on_head on, or once switching), in order, as the
 * parser gave them (NUL-terminated). */
size_t h1c_resp_headers(const struct h1c_resp *r);
const char *h1c_resp_header_name(const struct h1c_resp *r, size_t i);
const char *h1c_resp_header_value(const struct h1c_resp *r, size_t i);
/* The first header named name (case-insensitive), or NULL. */
const char *h1c_resp_header(const struct h1c_resp *r, const char *name);

#endif
