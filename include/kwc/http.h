/*
 * http.h — kwc's HTTP server: listening sockets, TLS (OpenSSL bufferevents),
 * HTTP/1.1 framing (Debian's libhttp-parser) and the hard limits a server
 * facing the network needs (head size, head and idle timeouts, a connection
 * cap). It replaces libevhtp (DESIGN.md "The front end seam").
 *
 * The seam: handlers (kwc's own endpoints, serve, passthrough) never see
 * the protocol. Two do not keep to it yet: a cached watch takes its socket
 * (hreq_take_socket) to a worker loop and frames its chunks there itself
 * (proxy/serve/watch.c), and a tunnel takes the bufferevent once the
 * upstream answered 101 (hreq_take_bev); the response-stream writer of the
 * HTTP/2 work ends both. A handler gets a request head (struct
 * hreq: method, target, headers, peer, TLS identity), reads the body through
 * a reader with flow control (hreq_body_read), and answers through a
 * response writer (hresp_*) that frames the bytes for the protocol and tells
 * the handler when it may write more (on_drain). Per-request state hangs off
 * the request, never the connection, so a second protocol with many streams
 * per connection (HTTP/2, libnghttp2) plugs in behind the same calls.
 *
 * HTTP/1.1 rules kept here (RFC 9112, and Go's net/http where kube's
 * behaviour on the wire decides):
 *  - a request head (request line + headers) over max_header_bytes is
 *    answered 414 (the target alone is too long) or 431, with a Kubernetes
 *    Status body, and the connection closes; nothing is ever truncated;
 *  - Transfer-Encoding with Content-Length, conflicting Content-Lengths,
 *    NUL/CTL/space bytes in the target, a Transfer-Encoding other than
 *    chunked, a missing Host on HTTP/1.1: 400, connection closed;
 *  - pipelined requests are answered in order: the next request is handed
 *    to the handler once the previous response has left the connection;
 *  - HTTP/1.0: keep-alive only when asked for, streamed bodies are
 *    close-delimited; Expect: 100-continue gets "100 Continue" when the
 *    handler starts reading the body (a request answered without reading
 *    its body closes the connection afterwards, as Go does).
 *
 * Loop thread only (the loop that created the server), except where a
 * socket has been taken (hreq_take_socket) and moved elsewhere.
 */
#ifndef KWC_HTTP_H
#define KWC_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

struct event_base;
struct evbuffer;
struct bufferevent;
struct http_server;
struct hreq;
typedef struct ssl_st SSL;
typedef struct x509_st X509;

/* One address to listen on (resolved by the caller). */
struct http_listen_addr {
    struct sockaddr_storage ss;
    socklen_t len;
};

/* Refused connections (the 429 past max_connections) drained at most at once
 * before their close: they hold descriptors too (config.h's budget). */
#define HTTP_LINGER_MAX 256

struct http_server_options {
    const struct http_listen_addr *addrs;
    size_t naddrs;
    int backlog;              /* listen(2) backlog; 0: 1024 */
    size_t max_header_bytes;  /* request line + headers; 0: 1 MiB (Go's DefaultMaxHeaderBytes) */
    size_t max_discard_bytes; /* body bytes read and dropped for a request answered without
                                 reading its body; more closes the connection. 0: 1 MiB */
    int request_header_timeout_ms; /* connection open or first byte -> end of head (and TLS
                                      handshake); 0: none */
    int idle_timeout_ms;           /* keep-alive connection with no request in progress; 0: none */
    unsigned max_connections;      /* open client connections; 0: no cap */
    /* TLS: both files set, or neither (plaintext) */
    const char *tls_cert_file;
    const char *tls_key_file;
    const char *client_ca_file; /* verify client certificates when presented */
    int tls_min_version;        /* OpenSSL's TLS1_2_VERSION / TLS1_3_VERSION; 0: 1.2 */
    int tls_reload_ms;          /* how often the cert/key files are checked for change; 0: 1000 */
    unsigned http2_max_streams; /* HTTP/2: concurrent streams per connection; 0: 100 (kube's) */
};

/*
 * Called once per request, when its head has been read and checked (before
 * any body byte is delivered). The handler answers the request on every
 * path: hresp_*, hreq_take_socket or hreq_take_bev. r is valid until its
 * on_close has run (or, for a handler that set none, until the response
 * ends).
 */
typedef void (*http_request_cb)(void *arg, struct hreq *r);

/*
 * Bind every address and start serving on base. o's strings are borrowed
 * and must outlive the server. Returns 0, or a negative errno / KWC_ECONFIG
 * with a message for a person in err (which address, what failed, what to do).
 */
int http_server_new(struct event_base *base, const struct http_server_options *o,
                    http_request_cb on_request, void *arg, struct http_server **out, char *err,
                    size_t errlen);
/* Stop listening, close every connection (each request's on_close runs),
 * free. */
void http_server_free(struct http_server *s);
/* Serve a connected socket (non-blocking; the server owns it from now on):
 * for tests and fuzzing over socketpair(2), or sockets handed over by a
 * supervisor. sa may be NULL. A server may have no listen address at all. */
void http_server_adopt(struct http_server *s, int fd, const struct sockaddr *sa, socklen_t salen);
/* The port bound for the i-th address (useful with port 0). */
int http_server_port(const struct http_server *s, size_t i);

struct http_server_stats {
    unsigned long long accepted, refused, open, tls_handshake_failed, bad_requests, header_timeouts,
        idle_timeouts, requests, tls_reloads;
    unsigned long long taken;         /* connections taken (watch streams, tunnels), still open */
    unsigned long long accept_errors; /* accept(2) out of descriptors or memory: accepting paused */
    unsigned long long max_connections; /* the cap (0: none) */
    /* HTTP/2 (open counts HTTP/1.x and HTTP/2 connections alike) */
    unsigned long long h2_open, h2_accepted; /* connections */
    unsigned long long h2_streams_open, h2_streams_total;
    unsigned long long h2_resets;  /* RST_STREAM from clients */
    unsigned long long h2_refused; /* streams refused past the per-connection limit */
    unsigned long long h2_goaways; /* GOAWAY sent (shutdown, errors, floods) */
};
/* Graceful stop: stop listening; HTTP/2 connections get a GOAWAY with the
 * last stream id (open streams finish, then they close); idle HTTP/1.1
 * connections close, busy ones close after their response.
 * http_server_free closes whatever is left. */
void http_server_shutdown(struct http_server *s);
void http_server_stats(const struct http_server *s, struct http_server_stats *out);

/* ---- the request head (borrowed strings, valid for r's life) ---- */

struct http_header {
    const char *name, *value;
};

const char *hreq_method(const struct hreq *r);
/* The request target as sent ("/api/v1/pods?watch=1"), NUL-terminated. */
const char *hreq_target(const struct hreq *r, size_t *len);
/* HTTP/1.0 (true) or HTTP/1.1 and HTTP/2. */
bool hreq_http10(const struct hreq *r);
/* "HTTP/1.0", "HTTP/1.1" or "HTTP/2.0" (as Go's Request.Proto). */
const char *hreq_proto(const struct hreq *r);
/* The first value of a header (case-insensitive name), NULL when absent. */
const char *hreq_header(const struct hreq *r, const char *name);
/* Every header in the order received. */
size_t hreq_headers(const struct hreq *r, const struct http_header **out);
/* The request carries a body (Content-Length > 0 or chunked). */
bool hreq_has_body(const struct hreq *r);
/* Content-Length, or -1 (chunked, or no body). */
int64_t hreq_content_length(const struct hreq *r);
/* An Upgrade request (Connection: upgrade + an Upgrade naming a protocol
 * other than h2c; never CONNECT): see hreq_take_bev. Its body (if any) is
 * read like any other; the bytes behind it are never parsed, and an answer
 * other than taking the connection closes it. */
bool hreq_upgrade(const struct hreq *r);
/* The client's address. */
const struct sockaddr *hreq_peer(const struct hreq *r, socklen_t *len);
/* TLS: the verified client certificate (borrowed; NULL without TLS, without
 * a certificate, or when --client-ca-file is not set). */
X509 *hreq_client_cert(const struct hreq *r);
bool hreq_tls(const struct hreq *r);
struct event_base *hreq_base(const struct hreq *r);

/*
 * Headers for the upstream, decided by the stages before the handler (the
 * caller's identity: Impersonate-*, or its own Authorization). Whoever
 * forwards r upstream (passthrough, tunnel) sends them after dropping the
 * caller's own credentials. Copied; r owns them. A new call replaces them.
 */
void hreq_set_upstream_headers(struct hreq *r, const struct http_header *h, size_t n);
size_t hreq_upstream_headers(const struct hreq *r, const struct http_header **out);

/* ---- the handler's hooks ---- */

struct hreq_handler {
    /* Body bytes (only while reading is on: hreq_body_read). */
    void (*on_body)(void *arg, const char *p, size_t n);
    /* The whole request has been read (also for requests without a body,
     * and for bodies being discarded). */
    void (*on_complete)(void *arg);
    /* The response queue fell to the low-water mark set with hresp_low_water. */
    void (*on_drain)(void *arg);
    /* r is over: the response ended and left, or the connection closed
     * (client gone, server shutting down). The handler frees its state;
     * no other hook runs after this one. */
    void (*on_close)(void *arg);
};

/* Install hooks (h borrowed, must outlive r). Call from on_request or later. */
void hreq_set_handler(struct hreq *r, const struct hreq_handler *h, void *arg);

/*
 * Flow control of the body: on delivers body bytes to on_body (the first
 * time, answering Expect: 100-continue), off stops reading the socket once
 * the bytes in hand are delivered. A handler that never turns reading on
 * gets its body discarded (bounded by max_discard_bytes).
 */
void hreq_body_read(struct hreq *r, bool on);
/* Keep the body in the input buffer, neither read nor discarded, until the
 * next hreq_set_handler (the stages before the handler wait for the
 * upstream); that handler then reads it or lets it be discarded. */
void hreq_body_hold(struct hreq *r);

/* ---- the response writer ---- */

/* Add a response header (copied). Before hresp_start. */
void hresp_header(struct hreq *r, const char *name, const char *value);
/* Close the connection once this response is done (no keep-alive). */
void hresp_close_after(struct hreq *r);
/*
 * Send the status line and headers. content_length >= 0: a body of exactly
 * that many bytes follows; -1: a streamed body (chunked on HTTP/1.1,
 * close-delimited on HTTP/1.0). Adds Date, and Content-Length or the
 * framing headers itself.
 */
void hresp_start(struct hreq *r, int status, int64_t content_length);
/* Body bytes (copied). */
void hresp_write(struct hreq *r, const void *p, size_t n);
/* Body bytes moved out of buf (no copy of the data). */
void hresp_write_buffer(struct hreq *r, struct evbuffer *buf);
/* Bytes queued and not yet sent. */
size_t hresp_queued(const struct hreq *r);
/* Call on_drain whenever the queue falls to at most n bytes. */
void hresp_low_water(struct hreq *r, size_t n);
/* The response is complete (terminal chunk on a chunked body). */
void hresp_end(struct hreq *r);
/* Cut the response short: the connection closes without a clean end, so
 * the client sees the body is incomplete. */
void hresp_abort(struct hreq *r);
/* A whole response in one call: status, Content-Type, body (copied). */
void hresp_simple(struct hreq *r, int status, const char *content_type, const void *body, size_t n);
/* The response has started (hresp_start called). */
bool hresp_started(const struct hreq *r);

/* ---- leaving the server ---- */

/*
 * Take the connection away from the server (a watch stream served by a
 * worker loop): the socket and, with TLS, its SSL state. Nothing was queued
 * on the connection (the previous response has left). The server forgets
 * the connection; r's on_close runs before this returns. The connection
 * still counts against max_connections until the taker calls
 * http_taken_release (any thread) when it closes it. Returns 0, or -1
 * when the connection is already gone.
 * HTTP/2 (later): a stream cannot take its connection's socket; a watch
 * there gets a writer bound to the stream instead.
 */
struct http_taken {
    int fd;     /* non-blocking; the taker closes it */
    SSL *ssl;   /* NULL for plaintext; the taker frees it */
    void *note; /* the request's note (hreq_set_note), now the taker's: no
                   http_done_cb runs for it (the taker reports the request's end) */
};
int hreq_take_socket(struct hreq *r, struct http_taken *out);
/* (r itself, and its head, stay readable until the loop callback that took
 * the socket returns: the server frees it from its next turn.) */

/*
 * Take the connection's bufferevent (plain or OpenSSL) for an Upgrade
 * tunnel: bytes the client sent after the request (its head and body) are
 * in its input buffer, unparsed. No response was started on r. The
 * taker frees it with http_bev_free (it was made without
 * BEV_OPT_CLOSE_ON_FREE: bufferevent_free alone would leave the socket and
 * the SSL open). r's on_close runs before this returns. Returns NULL when
 * the connection is gone.
 */
struct bufferevent *hreq_take_bev(struct hreq *r);
/* Free a bufferevent over a taken connection (hreq_take_bev's, or one the
 * taker of hreq_take_socket built on its own loop, as watch.c does over
 * TLS): closes its socket and frees its SSL (from the next turn of the
 * bufferevent's loop: safe inside its own callbacks), and releases the
 * connection (http_taken_release). */
void http_bev_free(struct bufferevent *bev);
/* A socket taken with hreq_take_socket has been closed. Thread-safe. */
void http_taken_release(void);
/* Count one more descriptor against max_connections that is no client
 * connection: a tunnel's upstream socket (the open-file budget, config.h).
 * Release it with http_taken_release. Thread-safe. */
void http_taken_hold(void);

/* ---- when a request leaves the server (metrics, the access log) ---- */

/*
 * The front end attaches a note of its own to each request (who asked, what
 * it addressed, which handler took it); the server completes the picture
 * with what only it sees — the status, the bytes, the times — and hands
 * both to one server-level callback when the request leaves it:
 *   HREQ_END_DONE    the response ended and left the connection
 *   HREQ_END_CLOSED  the connection closed first (client gone, an aborted
 *                    response, the server shutting down)
 *   HREQ_END_TAKEN   the connection left the server: an Upgrade tunnel
 *                    (hreq_take_bev: status 0, as kube records a hijacked
 *                    connection); hreq_take_socket moves the note to its
 *                    taker (http_taken.note) instead, with no callback.
 * Called once per request handed to on_request, just before the request's
 * own on_close, with note NULL when none was attached.
 */
enum hreq_end { HREQ_END_DONE, HREQ_END_CLOSED, HREQ_END_TAKEN };

struct hreq_done {
    const char *method, *target; /* borrowed for the call */
    const char *proto;           /* hreq_proto's (static) */
    int status;                  /* hresp_start's; 0: no response head was sent */
    uint64_t bytes;              /* response bytes queued on the connection: head, body, framing */
    uint64_t start_ns;           /* CLOCK_MONOTONIC: the head was read and handed to on_request */
    uint64_t head_ns;            /* the response head was queued; 0: never */
    uint64_t end_ns;
    enum hreq_end how;
};
typedef void (*http_done_cb)(void *arg, const struct hreq_done *d, void *note);
void http_server_on_done(struct http_server *s, http_done_cb cb, void *arg);
/* Attach the front end's note (borrowed by the server, handed back once to
 * the http_done_cb, or to the taker of the socket). */
void hreq_set_note(struct hreq *r, void *note);
void *hreq_note(const struct hreq *r);
/* When r's head was handed to on_request (http_now_ns's clock). */
uint64_t hreq_start_ns(const struct hreq *r);
/* CLOCK_MONOTONIC nanoseconds, the clock of struct hreq_done. */
uint64_t http_now_ns(void);

#endif
