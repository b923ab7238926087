/*
 * http.h — kwc's HTTP server: listening sockets, TLS (OpenSSL bufferevents),
 * HTTP/1.1 framing (Debian's libhttp-parser) and the hard limits a server
 * facing the network needs (head size, head and idle timeouts, a connection
 * cap). It replaces libevhtp (DESIGN.md "The front end seam").
 *
 * The seam: handlers (kwc's own endpoints, serve, passthrough, watch) never
 * see the protocol. A handler gets a request head (struct hreq: method,
 * target, headers, peer, TLS identity), reads the body through a reader
 * with flow control (hreq_body_read), and answers through a response writer
 * (hresp_*) that frames the bytes for the protocol and tells the handler
 * when it may write more (on_drain). A long streamed body (a watch) leaves
 * the request machinery as a response stream (hresp_handoff, hstream_*)
 * that another loop can drive (DESIGN.md "The front end seam"). A tunnel,
 * once the upstream answered 101, turns the connection into a byte pipe
 * (hreq_take_pipe): unframed bytes both ways, with flow control, and no
 * socket or TLS state in its hands. Per-request state hangs off the
 * request, never the connection, so a second protocol with many streams
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
 * HTTP/2 (RFC 9113, Debian's libnghttp2, proxy/http/h2.c): ALPN h2 over
 * TLS (preferred over http/1.1, as Go), the client preface in plaintext
 * (prior knowledge; no h2c Upgrade). Each stream is a struct hreq behind
 * the same calls (hreq_proto says which protocol); the response writer
 * frames DATA with per-stream flow control (hresp_queued and on_drain are
 * the stream's), hresp_abort resets the stream only, hresp_close_after is
 * a no-op. HTTP/2 connections stay on the server's loop: a response stream
 * handed off from one is bound to that loop (hstream_handoff_home). Limits:
 * http2_max_streams, a rapid-reset budget, header lists bounded by
 * max_header_bytes (431), CONTINUATION/SETTINGS/PING/PRIORITY floods, stalls
 * bounded by idle_timeout_ms; Upgrade requests cannot happen (nghttp2
 * resets streams with connection-specific headers, as Go's server does).
 *
 * Loop thread only (the loop that created the server), except for a
 * response stream, which belongs to the loop it is attached to.
 */
#ifndef KWC_HTTP_H
#define KWC_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "kwc/srcmap.h" /* struct src_key: a client's source address */

struct event_base;
struct evbuffer;
struct http_server;
struct hreq;
typedef struct x509_st X509;

/* One address to listen on (resolved by the caller). */
struct http_listen_addr {
    struct sockaddr_storage ss;
    socklen_t len;
};

/* Refused connections (the 429 past max_connections) drained at most at once
 * before their close: they hold descriptors too (config.h's budget). */
#define HTTP_LINGER_MAX 256

/* Kernel TLS (kTLS): the kernel makes the TLS records once OpenSSL's
 * handshake handed it the keys (SSL_OP_ENABLE_KTLS). */
enum http_tls_kernel {
    HTTP_TLS_KERNEL_AUTO = 0, /* when the kernel has the tls TCP ULP (probed at start) */
    HTTP_TLS_KERNEL_OFF,      /* never: OpenSSL makes every record */
    HTTP_TLS_KERNEL_ON,       /* ask OpenSSL without probing: each connection falls back to
                                 OpenSSL's records when the kernel refuses (tests) */
};

struct http_server_options {
    const struct http_listen_addr *addrs;
    size_t naddrs;
    int backlog;              /* listen(2) backlog; 0: 1024 */
    const int *listen_fds;    /* NULL, or per addrs: a listening socket to take over (a
                                 takeover, handover.h) instead of binding; -1: bind */
    size_t max_header_bytes;  /* request line + headers; 0: 1 MiB (Go's DefaultMaxHeaderBytes) */
    size_t max_discard_bytes; /* body bytes read and dropped for a request answered without
                                 reading its body; more closes the connection. 0: 1 MiB */
    int request_header_timeout_ms; /* connection open or first byte -> end of head (and TLS
                                      handshake); 0: none */
    int idle_timeout_ms;           /* keep-alive connection with no request in progress; 0: none */
    unsigned max_connections;      /* open client connections; 0: no cap */
    /* open client connections from one source address (srcmap.h: an
     * IPv4-mapped IPv6 address is its IPv4 one); 0: no cap. Past it a new
     * connection from that address is refused as past max_connections (a
     * 429, or a close before the TLS handshake), so one address flooding
     * the server leaves the rest of max_connections to the others. Counts
     * the connections the server holds: a connection taken away (a watch
     * stream handed to a watch worker, a tunnel) has passed the request
     * stages and counts against max_connections only (its release happens
     * on another loop, which the per-source table, one loop's, never sees). */
    unsigned max_connections_per_source;
    /* TLS: both files set, or neither (plaintext) */
    const char *tls_cert_file;
    const char *tls_key_file;
    const char *client_ca_file; /* verify client certificates when presented */
    int tls_min_version;        /* OpenSSL's TLS1_2_VERSION / TLS1_3_VERSION; 0: 1.2 */
    int tls_reload_ms;          /* how often the cert/key files are checked for change; 0: 1000 */
    enum http_tls_kernel tls_kernel; /* who makes the TLS records (see the enum) */
    unsigned http2_max_streams; /* HTTP/2: concurrent streams per connection; 0: 100 (kube's) */
    size_t http2_conn_buffer;   /* HTTP/2: response bytes queued per connection, across its
                                   streams, before their handlers wait (h2.c); 0: 1 MiB */
    int stream_grace_ms; /* an ended response stream's last bytes may take this long to leave,
                            then it closes anyway (hstream_end); 0: 10 s */
    /* Serving loops (app.c): this server accepts, checks the caps, and
     * hands every connection it does not refuse to handoff (called on this
     * server's loop), which gives it to another loop's server
     * (http_server_adopt_counted there, with the same limits). NULL: the
     * server serves what it accepts. */
    void (*handoff)(void *arg, int fd, const struct sockaddr *sa, socklen_t salen,
                    bool src_counted);
    void *handoff_arg;
    /* The counts behind max_connections and max_connections_per_source,
     * shared by an accepting server and the servers it hands connections
     * to (http_limits_new; it must outlive them); NULL: the server's own. */
    struct http_limits *limits;
    size_t max_held_body; /* HTTP/2: request-body bytes held across all connections for
                             requests not yet handed on (hreq_body_hold); past it such a
                             stream is refused. Each connection holds at most its window
                             (1 MiB). 0: 64 MiB */
};

/*
 * Called once per request, when its head has been read and checked (before
 * any body byte is delivered). The handler answers the request on every
 * path: hresp_* (hresp_handoff for a stream), or hreq_take_pipe. r is valid until its
 * on_close has run (or, for a handler that set none, until the response
 * ends).
 */
typedef void (*http_request_cb)(void *arg, struct hreq *r);

/*
 * Bind every address and start serving on base. o's strings are borrowed
 * and must outlive the server. Returns 0, or a negative errno / KWC_ECONFIG
 * with a message for a person in err (which address, what failed, what to do).
 */
/* The listening sockets, in the order of the addresses (max at most);
 * returns how many. They stay the server's. */
size_t http_server_listen_fds(const struct http_server *s, int *fds, size_t max);
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
/* Serve a connection an accepting server (http_server_options.handoff)
 * already counted in the limits this server shares with it; src_counted:
 * it took a count for the peer's source too. This server's loop only. */
void http_server_adopt_counted(struct http_server *s, int fd, const struct sockaddr *sa,
                               socklen_t salen, bool src_counted);
/* Open connections across the servers sharing the limits: what the caps
 * count. Any thread. */
struct http_limits;
struct http_limits *http_limits_new(void);
void http_limits_free(struct http_limits *l);
/* The port bound for the i-th address (useful with port 0). */
int http_server_port(const struct http_server *s, size_t i);
/* The TLS library kwc runs with ("OpenSSL 3.0.x ..."), for kwc_build_info. */
const char *http_tls_library(void);
/*
 * Does the kernel take the "tls" TCP ULP? Tried on a loopback TCP
 * connection of its own (127.0.0.1, else ::1), closed before returning: 0
 * yes; -ENOENT (no tls module, none loadable), -ENOPROTOOPT or -EOPNOTSUPP
 * (no TCP_ULP at all) no; another negative errno when the probe itself
 * could not run (no loopback, out of descriptors). With CAP_NET_ADMIN the
 * kernel may load its tls module for it. Blocks briefly (a loopback
 * connect); at start, not on a serving loop. -ENOTSUP also when this
 * OpenSSL was built without kTLS (OPENSSL_NO_KTLS).
 */
int http_tls_ulp_probe(void);

struct http_server_stats {
    unsigned long long accepted, refused, open, tls_handshake_failed, bad_requests, header_timeouts,
        idle_timeouts, requests, tls_reloads;
    unsigned long long refused_per_source; /* over max_connections_per_source (not in refused) */
    unsigned long long sources;            /* source addresses with a connection counted now */
    /* TLS handshakes completed, by who makes the connection's records (the
     * kernel: kTLS send; OpenSSL) */
    unsigned long long tls_records_kernel, tls_records_openssl;
    bool tls_kernel;                  /* SSL_OP_ENABLE_KTLS is set on the serving context */
    unsigned long long taken;         /* connections taken (watch streams, tunnels), still open */
    unsigned long long accept_errors; /* accept(2) out of descriptors or memory: accepting paused */
    unsigned long long max_connections; /* the cap (0: none) */
    /* HTTP/2 (open counts HTTP/1.x and HTTP/2 connections alike) */
    unsigned long long h2_open, h2_accepted; /* connections */
    unsigned long long h2_streams_open, h2_streams_total;
    unsigned long long h2_resets;        /* RST_STREAM from clients */
    unsigned long long h2_resets_server; /* streams kwc or nghttp2 reset for the client's fault */
    unsigned long long h2_hpack_floods;  /* connections ended for decoding far past their bytes */
    unsigned long long h2_bytes_in;      /* bytes HTTP/2 connections sent (after TLS) */
    unsigned long long h2_header_bytes;  /* header fields decoded: name + value + 32 each */
    unsigned long long h2_body_held;     /* request-body bytes held in HTTP/2 streams now */
    unsigned long long h2_held_refused;  /* streams refused past max_held_body */
    unsigned long long h2_refused;       /* streams refused past the per-connection limit */
    unsigned long long h2_goaways;       /* GOAWAY sent (shutdown, errors, floods) */
    unsigned long long h2_queued;        /* response bytes queued on HTTP/2 connections now */
    unsigned long long h2_queued_peak;   /* the most one HTTP/2 connection held queued */
};
/* Graceful stop (Go's Server.Shutdown): the listening sockets close (new
 * clients are refused); HTTP/2 connections get a GOAWAY with the last
 * stream id (open streams finish, streams the client opens after it are
 * ignored, then the connection closes); idle HTTP/1.1 connections close,
 * busy ones close after their response (which says Connection: close when
 * its head was not written yet). The connections left are stats.open;
 * http_server_free closes whatever is left. */
void http_server_shutdown(struct http_server *s);
/* Requests in progress: HTTP/1.x requests handed to their handler and not
 * over, HTTP/2 streams open (response streams handed off included). Any
 * thread (relaxed counters). */
unsigned http_server_requests(const struct http_server *s);
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
 * other than h2c; never CONNECT): see hreq_take_pipe. Its body (if any) is
 * read like any other; the bytes behind it are never parsed, and an answer
 * other than taking the connection closes it. HTTP/1.1 only: HTTP/2 has no
 * Upgrade (its requests never are one). */
bool hreq_upgrade(const struct hreq *r);
/* The client's address. */
const struct sockaddr *hreq_peer(const struct hreq *r, socklen_t *len);
/* The source an address counts as (srcmap.h): true for an IPv4 or IPv6
 * address (an IPv4-mapped one as its IPv4 address), false for anything
 * else (NULL, a socketpair's). */
bool http_source_key(const struct sockaddr *sa, socklen_t len, struct src_key *out);
/* The request's client as a source (http_source_key of hreq_peer). */
bool hreq_source(const struct hreq *r, struct src_key *out);
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
/* Close the connection once this response is done (no keep-alive).
 * HTTP/2: no effect (the connection is shared; see hresp_goaway). */
void hresp_close_after(struct hreq *r);
/* HTTP/2: this stream is the connection's last: a graceful GOAWAY now (no
 * new streams; the open ones finish, then the connection closes), as Go's
 * server does for a handler that sets "Connection: close" over HTTP/2.
 * HTTP/1.x: no effect. Any time until r is freed, its on_close included. */
void hresp_goaway(struct hreq *r);
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
/*
 * Body bytes the response takes over, sent without a copy: the n bytes at p
 * inside block (the caller's malloc), with at least HRESP_BLOCK_BEFORE bytes
 * of block before p and HRESP_BLOCK_AFTER after p + n that the writer may
 * overwrite. HTTP/1.1 chunked: the chunk's header and trailer are written
 * there, so that the frame and its data leave as one contiguous piece (over
 * TLS: whole records, no tiny framing records). block is freed once the
 * bytes have left (or at once when they never will). For large bodies
 * (lists): over TLS the connection keeps its record buffers while such a
 * response runs.
 */
#define HRESP_BLOCK_BEFORE 18 /* "%zx\r\n" of any size_t */
#define HRESP_BLOCK_AFTER 2   /* "\r\n" */
void hresp_write_block(struct hreq *r, void *block, char *p, size_t n);
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

/* ---- response streams ----
 *
 * A long streamed body (a watch) leaves the request machinery and becomes
 * a stream, driven by whichever loop owns it: the handler sends the head
 * with hresp_start(r, status, -1), hands the response off (hresp_handoff),
 * passes the handoff to the loop that will serve it (any thread), and that
 * loop attaches it (hstream_attach). From then on the handler queues body
 * bytes, owned copies or references to shared, refcounted blobs
 * (hstream_write_ref: released once their bytes left), sends them when it
 * likes (hstream_flush: many writes, one writev or TLS record run), hears
 * when bytes left (on_sent: backpressure) and when the client went away
 * (on_close), and ends the stream (hstream_end). The protocol frames the
 * bytes: HTTP/1.1 one chunk per write and a terminal chunk, HTTP/1.0
 * close-delimited; for HTTP/1.1 the whole connection moves with the
 * stream (proxy/http/h1stream.c). A stream is owned by one loop: every
 * hstream_* call on it is made from that loop's thread.
 */
struct hstream;         /* a response stream, owned by one loop */
struct hstream_handoff; /* a stream in transit between loops */

/*
 * After hresp_start(r, status, -1), in the same loop callback: the response
 * leaves the request machinery and becomes a stream. r's on_close runs
 * before this returns (the done callback too, with HREQ_END_TAKEN and no
 * note); r's note moves to the handoff (hstream_handoff_note; no
 * http_done_cb runs for it: the taker reports the request's end). HTTP/1.1:
 * the connection leaves the server (it still counts against
 * max_connections, and in http_server_stats' taken, until the stream
 * closes); bytes of the head not yet written move with it. r's head stays
 * readable until the loop callback that called this returns. NULL when the
 * connection is already gone. The handoff may be passed to another thread.
 */
struct hstream_handoff *hresp_handoff(struct hreq *r);
/* NULL: any loop may attach it (HTTP/1.1: the connection moves). Else the
 * loop that must (HTTP/2: its connection's loop). */
struct event_base *hstream_handoff_home(const struct hstream_handoff *h);
/* The request's note (hreq_set_note), now the taker's. */
void *hstream_handoff_note(const struct hstream_handoff *h);

/* What a stream tells the loop that drives it. None of them runs inside
 * hstream_write_ref, hstream_write or hstream_end; the handler calls no
 * hstream_* function on the stream from on_close. */
struct hstream_ops {
    /* A reference given with hstream_write_ref is released: its bytes left,
     * or the stream closes (then every reference still queued is released,
     * before on_close). Once per reference. */
    void (*release)(void *arg, void *owner, uint32_t tag);
    /* Bytes left from a write event of the stream's own (never from inside
     * a call of the handler; not after hstream_end): queued is what remains
     * queued (hstream_queued). */
    void (*on_sent)(void *arg, size_t queued);
    /* The stream is over: the client went away or reset it, a write failed,
     * or it ended (hstream_end) and its last bytes left or its grace ran
     * out. sent: bytes that left (head, body, framing). Once; may run inside
     * hstream_flush; s is freed after it returns. */
    void (*on_close)(void *arg, uint64_t sent);
};
/* Attach h on base (the calling thread runs base; == home when home is
 * set); ops borrowed (must outlive the stream), arg the handler's. NULL
 * when the stream is gone already or cannot be set up (its connection is
 * then closed; no hook runs). h is freed either way. */
struct hstream *hstream_attach(struct hstream_handoff *h, struct event_base *base,
                               const struct hstream_ops *ops, void *arg);
/* Drop a handoff never attached: its connection closes. Accepts NULL. */
void hstream_handoff_free(struct hstream_handoff *h);
/* n bytes at p, kept alive by one reference on owner that the caller hands
 * over (released through ops->release with tag once they left, or when the
 * stream closes). One write = one HTTP/1.1 chunk / DATA frame(s); queued,
 * not sent (hstream_flush). n == 0 queues nothing to send (a chunk of 0
 * would end the stream): the reference goes at the next flush. Not after
 * hstream_end. */
void hstream_write_ref(struct hstream *s, void *owner, uint32_t tag, const char *p, size_t n);
/* n bytes at p, copied. */
void hstream_write(struct hstream *s, const void *p, size_t n);
/*
 * Framing written once into the bytes' own room (D2: shared event blobs are
 * framed when they are made, not per stream). hstream_frame writes the
 * HTTP/1.1 chunk header "%x\r\n" of n (at most HSTREAM_FRAME_HEAD bytes)
 * right before p and the trailer "\r\n" right after p + n (n > 0, and
 * p[-HSTREAM_FRAME_HEAD, n + HSTREAM_FRAME_TAIL) is the caller's).
 * hstream_write_framed_ref is hstream_write_ref for (p, n) so framed: an
 * HTTP/1.1 chunked stream sends the header, the bytes and the trailer as
 * one contiguous piece (one iovec; one SSL_write over TLS); HTTP/1.0 and
 * HTTP/2 send (p, n) as hstream_write_ref does.
 */
#define HSTREAM_FRAME_HEAD 10 /* "%x\r\n" of a 32-bit length */
#define HSTREAM_FRAME_TAIL 2
void hstream_frame(char *p, size_t n);
void hstream_write_framed_ref(struct hstream *s, void *owner, uint32_t tag, const char *p,
                              size_t n);
/* Bytes not yet taken by the kernel (framing included; over TLS also the
 * plaintext waiting for encryption). */
size_t hstream_queued(const struct hstream *s);
/* Send what can go now (coalesced: many writes, one writev / one run of
 * TLS records). false when the stream closed (on_close ran inside). */
bool hstream_flush(struct hstream *s);
/* The end of the body: terminal chunk (HTTP/1.1) / END_STREAM, queued like
 * a write (hstream_flush sends it). on_close follows once the last bytes
 * left, or after the grace (http_server_options.stream_grace_ms) if they
 * do not; never inside this call. */
void hstream_end(struct hstream *s);
/* Close now, with one non-blocking last try to send what is queued (the
 * server is stopping; TLS: and a close_notify); releases every reference;
 * no on_close. Returns the bytes sent over the stream's life. */
uint64_t hstream_close(struct hstream *s);

/* ---- leaving the server ---- */

/*
 * The handler opened a connection of its own for r (a tunnel's upstream
 * socket): it is one more descriptor, counted against max_connections
 * (config.h's open-file budget) until r closes or, when r's connection
 * becomes a pipe (hreq_take_pipe), until the pipe is freed. Once per socket.
 */
void hreq_count_socket(struct hreq *r);

/*
 * A byte pipe: an HTTP/1.1 connection after its Upgrade request, switched
 * to another protocol (a tunnel, once the upstream answered 101). Unframed
 * bytes both ways, plain or TLS alike; the server no longer parses, times
 * or answers anything on it. Loop thread only (the server's loop).
 */
struct hpipe;
struct hpipe_ops {
    /* Bytes are in hpipe_input (while reading is on): new ones, the ones
     * there when the pipe was made, or left there when reading was turned
     * back on. Never from inside a call of the handler's. */
    void (*on_read)(void *arg);
    /* The output queue fell to the low-water mark (hpipe_low_water) after a
     * write to the client. */
    void (*on_drain)(void *arg);
    /* The client closed its end (or half-closed it): it sends nothing more,
     * and every byte it sent before has been announced by on_read. Reading
     * stops; writing still works while the connection lasts. */
    void (*on_eof)(void *arg);
    /* The connection failed (a reset, a TLS error): nothing more moves. */
    void (*on_error)(void *arg);
};
/*
 * Turn r's connection into a pipe with the handler's ops and arg (borrowed,
 * must outlive the pipe). Only for an Upgrade request (hreq_upgrade: never
 * one over HTTP/2, which rejects upgrades at its protocol) read whole (its
 * body, if any, was delivered or discarded), with no response started. What
 * the client sent behind the request is in hpipe_input, unparsed, announced
 * by on_read from the next loop turn; reading is on. Bytes of the server's
 * still queued (a 100 Continue) leave first. The request leaves the server:
 * its done callback (HREQ_END_TAKEN) and r's on_close run before this
 * returns, and r is not to be used after it. The connection, and every
 * socket counted with hreq_count_socket, count against max_connections
 * until hpipe_free. Returns the new pipe, or NULL when the connection is
 * gone or r cannot be taken (not an upgrade, not read whole, answered): then
 * the connection is closed (r's on_close has run too).
 */
struct hpipe *hreq_take_pipe(struct hreq *r, const struct hpipe_ops *ops, void *arg);
/* The client's bytes, not yet consumed: the handler drains what it takes
 * (evbuffer_remove / evbuffer_add_buffer). Borrowed, valid until hpipe_free. */
struct evbuffer *hpipe_input(struct hpipe *p);
/* Bytes for the client: copied, or moved out of buf (no copy of the data). */
void hpipe_write(struct hpipe *p, const void *data, size_t n);
void hpipe_write_buffer(struct hpipe *p, struct evbuffer *buf);
/* Bytes queued for the client, not yet sent. */
size_t hpipe_queued(const struct hpipe *p);
/* Flow control of the client's bytes: off stops reading its socket (they
 * stay in the kernel, and TCP pushes back on the client); on reads again. */
void hpipe_read(struct hpipe *p, bool on);
/* Call on_drain whenever the output queue falls to at most n bytes (0 at
 * first: when it is empty). */
void hpipe_low_water(struct hpipe *p, size_t n);
/* Close the connection now (bytes still queued are dropped): the socket is
 * closed and the TLS state freed from the next loop turn (safe inside the
 * pipe's own callbacks, none of which runs after this), and the descriptors
 * are released from max_connections at once. Accepts NULL. */
void hpipe_free(struct hpipe *p);

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
 *                    (hreq_take_pipe: status 0, as kube records a hijacked
 *                    connection), or a response stream (hresp_handoff:
 *                    its note moved to the handoff, so the callback gets
 *                    none; the taker reports the end).
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
 * the http_done_cb, or to the taker of a response stream). */
void hreq_set_note(struct hreq *r, void *note);
void *hreq_note(const struct hreq *r);
/* When r's head was handed to on_request (http_now_ns's clock). */
uint64_t hreq_start_ns(const struct hreq *r);
/* CLOCK_MONOTONIC nanoseconds, the clock of struct hreq_done. */
uint64_t http_now_ns(void);

#endif
