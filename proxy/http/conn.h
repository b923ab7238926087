/*
 * conn.h — the HTTP room's own header (never included from outside
 * proxy/http/): the server, connection and request structs that the room's
 * files share, and the internal calls between them. The public seam is
 * include/kwc/http.h.
 *
 * Who does what:
 *   http.c   the server: listeners and accept, the connection cap (a 429
 *            and a lingering close past it), a connection's life (the
 *            bufferevent callbacks, the head and idle timer, the deferred
 *            kick, close and reap), taking a connection away
 *   h1.c     HTTP/1.1 on libhttp-parser: the parser callbacks, the checks
 *            of a complete head, the parse loop, the Status answer to a bad
 *            head
 *   hreq.c   the request object: its head as handlers read it, the notes
 *            and the done callback, the handler's hooks and body flow control
 *   hresp.c  the response writer (hresp_*): status line, headers, framing
 *   h2.c     HTTP/2 on libnghttp2: a session per connection, a struct hreq
 *            per stream; hreq.c and hresp.c hand a stream's calls to it
 *   htls.c   TLS: the SSL_CTX (protocols, suites, ALPN, client CAs), the
 *            certificate reload timer, a request's TLS identity, the
 *            kernel TLS probe
 *   hpipe.c  the byte pipe an Upgrade's connection becomes (hreq_take_pipe)
 *   h1stream.c  response streams over HTTP/1.1 (hresp_handoff, hstream_*):
 *            the connection leaves the server with its head bytes and is
 *            driven by the loop it is attached to
 *
 * Loop thread only, like http.h. Nothing is freed inside a libevent or
 * parser callback chain: a closing connection is unlinked, marked C_DEAD
 * and freed from the server's reap event (hconn_close).
 */
#ifndef KWC_HTTP_CONN_H
#define KWC_HTTP_CONN_H

#include <assert.h>
#include <http_parser.h>
#include <openssl/ssl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>

#include "kwc/gostr.h"
#include "kwc/http.h"

struct event;
struct evbuffer;
struct evconnlistener;
struct refused;
struct h2conn;
struct h2stream;

#define REQ_MAGIC 0x68726571u  /* "hreq" */
#define READ_CHUNK (64 * 1024) /* bytes fed to the parser per step */

enum conn_state {
    C_IDLE, /* waiting for (the rest of) a request head */
    C_REQ,  /* a request was handed to its handler */
    C_DEAD, /* closed, waiting for the reap */
};

struct hreq {
    uint32_t magic;
    struct hconn *c;
    /* head */
    struct gostr_buf arena; /* target, then header names and values, NUL-separated */
    size_t target_len;
    bool target_done;         /* the parser passed the target's end */
    struct http_header *hdrs; /* pointers into arena once the head is complete */
    size_t nh;
    size_t *hoff; /* while parsing: name offset, value offset per header */
    size_t hcap;
    enum { H_URL, H_FIELD, H_VALUE } hs; /* what the parser is delivering */
    bool fold_ws; /* after an obs-fold: white space is dropped until the value goes on */
    char method[24];
    bool http10, keepalive, upgrade, has_body, chunked, head_method;
    int64_t clen;
    /* body */
    bool reading, sent_continue, expect_continue, complete, body_seen;
    size_t discarded;
    /* handler */
    const struct hreq_handler *h;
    void *harg;
    bool closed_cb; /* on_close ran */
    /* response */
    struct evbuffer *head_out; /* headers added before hresp_start */
    bool started, streamed_chunked, no_body, ended, close_after;
    bool has_date; /* the handler set Date (a passthrough keeps the upstream's) */
    size_t low_water;
    bool complete_fired;         /* on_complete went to whichever handler was set */
    bool held;                   /* hreq_body_hold: the body waits for the next handler */
    struct event *late_complete; /* on_complete for a handler set after that */
    /* headers for the upstream, set by the stages before the handler */
    struct http_header *up_hdrs;
    size_t n_up;
    char *up_arena;
    unsigned sockets; /* hreq_count_socket: the handler's own, counted as taken */
    /* what the done callback reports (hreq_done) */
    void *note;
    bool dispatched, taken;
    int status;
    uint64_t bytes, start_ns, head_ns;
    struct h2stream *h2; /* an HTTP/2 stream (h2.c); NULL on HTTP/1.x */
};

struct hconn {
    uint32_t magic;
    struct http_server *s;
    struct bufferevent *bev;
    int fd;
    SSL *ssl;
    enum conn_state state;
    http_parser p;
    struct hreq *req;
    struct event *timer;
    struct event *kick; /* deferred: continue parsing / finish a response */
    bool head_byte;     /* a byte of the current head arrived */
    bool served;        /* a request was dispatched on it (not a new connection) */
    uint64_t accepted_ns;
    bool timer_idle; /* the timer is the idle timeout, not the head timeout */
    bool handshake_done;
    bool tls_bulk;                     /* hconn_tls_bulk: SSL_MODE_RELEASE_BUFFERS is off */
    bool parse_paused_body;            /* the handler stopped body reading */
    bool head_ready;                   /* on_headers_complete ran: dispatch */
    bool msg_complete;                 /* on_message_complete ran */
    const char *feed_start, *feed_end; /* the bytes being parsed */
    char feed_prev;                    /* the byte consumed before feed_start ('\0' at first) */
    bool close_when_flushed;
    bool discard_overflow; /* an unread body went past max_discard_bytes */
    struct sockaddr_storage peer;
    socklen_t peer_len;
    struct src_key src; /* peer as a source, when src_counted */
    bool src_counted;   /* counted in s->per_source until unlinked */
    struct hconn *next, **prev;
    struct hconn *next_reap;
    bool proto_known;  /* HTTP/2 or not was decided (ALPN, or the preface) */
    struct h2conn *h2; /* HTTP/2 (h2.c); NULL on HTTP/1.x */
};

struct listener {
    struct evconnlistener *l;
    int port;
};

struct tls_stamp {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
};

struct http_server {
    uint32_t magic;
    struct event_base *base;
    struct http_server_options o;
    http_request_cb on_request;
    void *arg;
    struct listener *ls;
    size_t nls;
    struct event *accept_retry;
    struct event *shutdown_ev; /* shutting down: closes new connections left idle */
    bool shutting_down;
    SSL_CTX *ctx;
    struct tls_stamp st_cert, st_key, st_failed_cert, st_failed_key;
    struct event *reload_timer;
    struct hconn *conns;
    unsigned nconns;
    struct http_limits *lim; /* the caps' counts: shared with an accepting server, or own */
    struct http_limits *own_lim;
    time_t src_log_sec; /* the per-source refusal log: the second of the last line */
    unsigned long src_log_suppressed;
    struct hconn *reap;
    struct event *reap_ev;
    unsigned nlinger;
    struct refused *lingering; /* closed by http_server_free if still there */
    time_t date_sec;
    char date[40];
    struct http_server_stats stats;
    /* HTTP/1.x requests handed to their handler and not closed yet
     * (http_server_requests; HSTAT: any thread reads it) */
    unsigned long long h1_open;
    http_parser_settings ps;
    http_done_cb on_done;
    void *done_arg;
};

/* A server's stats are written by its loop only and read from any thread
 * (the /metrics render runs on the main loop while the serving loops count):
 * single-writer relaxed atomics, no lock and no locked instruction. */
#define HSTAT_GET(f) __atomic_load_n(&(f), __ATOMIC_RELAXED)
#define HSTAT_SET(f, v) __atomic_store_n(&(f), (v), __ATOMIC_RELAXED)
#define HSTAT_ADD(f, n) HSTAT_SET(f, HSTAT_GET(f) + (n))
#define HSTAT_SUB(f, n) HSTAT_SET(f, HSTAT_GET(f) - (n))

/* r, checked (REQ_MAGIC). */
static inline struct hreq *
hreq_of(const struct hreq *r)
{
    assert(r && r->magic == REQ_MAGIC);
    return (struct hreq *)(uintptr_t)r;
}

/* ---- http.c: the connection's life ---- */

/* Close now (the client sees EOF or a reset); freed from the reap event.
 * The request's done callback and on_close run from here. */
void hconn_close(struct hconn *c);
/* Close after a complete answer: plaintext sockets linger until the client
 * stops sending, TLS ones close. */
void hconn_close_graceful(struct hconn *c);
/* (Re)arm the connection's timer: the head timeout once a byte of a head
 * came in (or before the handshake), else the idle timeout. */
void hconn_arm_timer(struct hconn *c);
/* TLS: on, the connection keeps OpenSSL's record buffers between writes (a
 * large response: no allocation per record); off, it frees them when idle
 * (SSL_MODE_RELEASE_BUFFERS, as the context sets it). */
void hconn_tls_bulk(struct hconn *c, bool on);
/* Go on from the next loop turn: parse, or finish a response that left. */
void hconn_kick(struct hconn *c);
/* Descriptors that are no open connection of the server's but count against
 * max_connections (taken connections, the handlers' own sockets): add
 * delta (negative: released). Thread-safe. */
void hconn_taken(int delta);
/* c leaves the server with its bufferevent (the socket and SSL in it; its
 * callbacks cleared, watermarks zero), counted as taken (hconn_taken): the
 * request's done callback (HREQ_END_TAKEN) and on_close run, c is
 * forgotten and freed from the reap event. c must not be dead. */
struct bufferevent *hconn_leave(struct hconn *c);

/* ---- h1.c: HTTP/1.1 ---- */

/* libhttp-parser's callbacks for a server's connections. */
void h1_settings(http_parser_settings *ps);
/* Feed the input to the parser while the state allows. Returns with the
 * parser paused (a request in progress, or waiting for the handler to read)
 * or the input empty. */
void h1_parse(struct hconn *c);

/* ---- h2.c: HTTP/2 ---- */

/* Is c HTTP/2? TLS: ALPN chose h2; plaintext: the input starts with the
 * client preface. 1 yes, 0 no, -1 a prefix of the preface so far (wait). */
int h2_detect(struct hconn *c);
/* c speaks HTTP/2 from now on (its input still holds the preface). */
void h2_start(struct hconn *c);
/* http.c's bufferevent and timer callbacks, on an HTTP/2 connection */
void h2_on_read(struct hconn *c);
void h2_on_write(struct hconn *c);
void h2_on_kick(struct hconn *c);
void h2_on_timer(struct hconn *c);
/* hconn_close: every open stream's done callback and on_close */
void h2_conn_closed(struct hconn *c);
/* conn_free: the session and the streams. Accepts c->h2 == NULL. */
void h2_conn_free(struct hconn *c);
/* GOAWAY with the last stream id: open streams finish, then it closes. */
void h2_shutdown(struct hconn *c);
/* The server is going now: a GOAWAY and one non-blocking try to send it
 * (plaintext), so the client learns which streams were not processed. */
void h2_last_words(struct hconn *c);
/* a stream's side of hreq_body_read and hresp_* */
void h2_body_read(struct hreq *r, bool on);
void h2_resp_header(struct hreq *r, const char *name, const char *value);
void h2_resp_start(struct hreq *r, int status, int64_t content_length);
void h2_resp_write(struct hreq *r, const void *p, size_t n);
void h2_resp_write_buffer(struct hreq *r, struct evbuffer *buf);
void h2_resp_write_block(struct hreq *r, void *block, char *p, size_t n);
size_t h2_resp_queued(const struct hreq *r);
void h2_resp_end(struct hreq *r);
void h2_resp_abort(struct hreq *r);

/* ---- h2stream.c: response streams on HTTP/2 (h1stream.c hands them over) ---- */

#define H2HS_MAGIC 0x68327373u /* "h2ss": the first field of an HTTP/2 handoff/stream */
static inline bool
h2hs_is(const void *p)
{
    return *(const uint32_t *)p == H2HS_MAGIC;
}
struct hstream_handoff *h2_resp_handoff(struct hreq *r);
struct event_base *h2hs_home(const struct hstream_handoff *h);
void *h2hs_note(const struct hstream_handoff *h);
void h2hs_handoff_free(struct hstream_handoff *h);
struct hstream *h2hs_attach(struct hstream_handoff *h, struct event_base *base,
                            const struct hstream_ops *ops, void *arg);
void h2hs_write_ref(struct hstream *s, void *owner, uint32_t tag, const char *p, size_t n);
void h2hs_write(struct hstream *s, const void *p, size_t n);
size_t h2hs_queued(const struct hstream *s);
bool h2hs_flush(struct hstream *s);
void h2hs_end(struct hstream *s);
uint64_t h2hs_close(struct hstream *s);

/* ---- hreq.c: the request object ---- */

/* new: a request on c, its head still to be parsed */
struct hreq *hreq_new(struct hconn *c);
/* Accepts NULL. */
void hreq_free(struct hreq *r);
/* The server's done callback, then the handler's on_close: once. */
void hreq_closed(struct hreq *r, enum hreq_end how);
/* The whole request has been read: tell the handler, once. */
void hreq_complete_fire(struct hreq *r);

/* ---- hresp.c: the response writer ---- */

/* The reason phrase of an HTTP status ("" for one without). */
const char *hresp_reason(int code);
/* The Date header's value for now (valid until the next call). */
const char *hresp_date(struct http_server *s);

/* ---- htls.c: TLS ---- */

/* With a certificate and key in s->o: the first context, and the reload
 * timer. 0 (also without TLS), or KWC_ECONFIG with a message in err. */
int htls_init(struct http_server *s, char *err, size_t errlen);
/* Does the kernel make ssl's records (kTLS send on its socket BIO)? Then
 * plaintext written to the socket (write, sendmsg) leaves as TLS records
 * of ssl's session, once OpenSSL's own pending output has left. Known from
 * the end of the handshake on; ssl borrowed. */
bool htls_ktls_send(SSL *ssl);

#endif
