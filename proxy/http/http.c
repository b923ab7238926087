/*
 * http.c — kwc's HTTP/1.1 server on libevent bufferevents (see http.h).
 *
 * One struct hconn per client connection: a bufferevent (a socket, or an
 * OpenSSL bufferevent over it), libhttp-parser's state, at most one request
 * in progress (struct hreq) and one timer. Nothing is freed inside a
 * libevent or parser callback chain: a closing connection is unlinked,
 * marked dead and freed from the server's reap event.
 *
 * Parsing: the input buffer is fed to http_parser_execute. The parser is
 * paused in on_headers_complete (it then stops before the head's final LF,
 * measured on libhttp-parser 2.9.4), the head is checked and handed to the
 * handler outside the parser, and parsing resumes with that LF. It is paused
 * again at on_message_complete: the next pipelined request waits until the
 * response has left the connection, which keeps responses in order and lets
 * a handler take the socket with nothing queued on it. Body bytes go to the
 * handler while it reads (hreq_body_read), or are counted and dropped.
 * An Upgrade request (Connection: upgrade + an Upgrade other than h2c) is
 * parsed like any other up to the end of its body; the bytes behind it are
 * never parsed: they wait in the input until the handler takes the
 * connection (hreq_take_bev, after the upstream switched protocols) or the
 * connection closes after the answer (an Upgrade or CONNECT request never
 * keeps its connection alive).
 *
 * Limits: the head (request line + headers) is bounded by
 * http_parser_set_max_header_size (process-wide: one server per process);
 * one timer per connection is the head timeout (from accept, or from the
 * first byte of a later request) or the idle timeout (between requests).
 * Past max_connections a new connection gets a 429 Status and is closed.
 *
 * TLS: one SSL_CTX at a time; a timer stats the certificate and key files
 * and builds a new context when they change (connections keep the context
 * they started with). Bufferevents are created without BEV_OPT_CLOSE_ON_FREE
 * so the socket and SSL can be handed to another loop; conn_free closes
 * them itself.
 */
#include "kwc/http.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <stdatomic.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <http_parser.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/gostr.h"
#include "kwc/log.h"
#include "kwc/status.h"

#define SRV_MAGIC 0x68737276u  /* "hsrv" */
#define CONN_MAGIC 0x68636e6eu /* "hcnn" */
#define REQ_MAGIC 0x68726571u  /* "hreq" */
#define READ_CHUNK (64 * 1024)  /* bytes fed to the parser per step */
#define MAX_HEADERS 1024         /* header lines per request (Go has no count limit; bytes bound it) */
#define ACCEPT_RETRY_MS 100      /* after EMFILE/ENFILE: stop accepting this long */
#define LINGER_MS 2000

enum conn_state {
    C_IDLE,    /* waiting for (the rest of) a request head */
    C_REQ,     /* a request was handed to its handler */
    C_DEAD,    /* closed, waiting for the reap */
};

struct hreq {
    uint32_t magic;
    struct hconn *c;
    /* head */
    struct gostr_buf arena; /* target, then header names and values, NUL-separated */
    size_t target_len;
    bool target_done; /* the parser passed the target's end */
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
    bool complete_fired;       /* on_complete went to whichever handler was set */
    bool held;                 /* hreq_body_hold: the body waits for the next handler */
    struct event *late_complete; /* on_complete for a handler set after that */
    /* headers for the upstream, set by the stages before the handler */
    struct http_header *up_hdrs;
    size_t n_up;
    char *up_arena;
    /* what the done callback reports (hreq_done) */
    void *note;
    bool dispatched, taken;
    int status;
    uint64_t bytes, start_ns, head_ns;
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
    bool timer_idle;    /* the timer is the idle timeout, not the head timeout */
    bool handshake_done;
    bool parse_paused_body; /* the handler stopped body reading */
    bool head_ready;        /* on_headers_complete ran: dispatch */
    bool msg_complete;      /* on_message_complete ran */
    const char *feed_start, *feed_end; /* the bytes being parsed */
    char feed_prev;                    /* the byte consumed before feed_start ('\0' at first) */
    bool close_when_flushed;
    bool discard_overflow;  /* an unread body went past max_discard_bytes */
    struct sockaddr_storage peer;
    socklen_t peer_len;
    struct hconn *next, **prev;
    struct hconn *next_reap;
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
    SSL_CTX *ctx;
    struct tls_stamp st_cert, st_key, st_failed_cert, st_failed_key;
    struct event *reload_timer;
    struct hconn *conns;
    unsigned nconns;
    struct hconn *reap;
    struct event *reap_ev;
    unsigned nlinger;
    struct refused *lingering; /* closed by http_server_free if still there */
    time_t date_sec;
    char date[40];
    struct http_server_stats stats;
    http_parser_settings ps;
    http_done_cb on_done;
    void *done_arg;
};

/* Connections taken from the server (watch streams on worker loops,
 * tunnels): they count against max_connections until released. One server
 * per process (like the parser's head limit), so one counter. */
static atomic_uint taken_conns;

static void conn_close(struct hconn *c);
static void conn_close_graceful(struct hconn *c);
static void conn_parse(struct hconn *c);
static void conn_arm_timer(struct hconn *c);

/* ---- small helpers ---- */

static const char *
reason_phrase(int code)
{
    switch (code) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 307: return "Temporary Redirect";
    case 308: return "Permanent Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 411: return "Length Required";
    case 412: return "Precondition Failed";
    case 413: return "Request Entity Too Large";
    case 414: return "Request URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Entity";
    case 426: return "Upgrade Required";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "";
    }
}

static const char *
date_now(struct http_server *s)
{
    time_t t = time(NULL);
    if (t != s->date_sec) {
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(s->date, sizeof(s->date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
        s->date_sec = t;
    }
    return s->date;
}

static struct hconn *
conn_of(void *arg)
{
    struct hconn *c = arg;
    assert(c && c->magic == CONN_MAGIC);
    return c;
}

/* RFC 9110 tchar */
static bool
is_tchar(unsigned char ch)
{
    static const char extra[] = "!#$%&'*+-.^_`|~";
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch && strchr(extra, ch));
}

static bool
token_has(const char *v, const char *tok)
{
    size_t tl = strlen(tok);
    for (const char *s = v; *s;) {
        while (*s == ' ' || *s == '\t' || *s == ',')
            s++;
        size_t l = strcspn(s, ",");
        size_t e = l;
        while (e && (s[e - 1] == ' ' || s[e - 1] == '\t'))
            e--;
        if (e == tl && strncasecmp(s, tok, tl) == 0)
            return true;
        s += l;
    }
    return false;
}

/* An Upgrade header value names a protocol other than h2c. */
static bool
upgrade_names_other(const char *v)
{
    for (const char *s = v; *s;) {
        while (*s == ' ' || *s == '\t' || *s == ',')
            s++;
        size_t l = strcspn(s, ",");
        size_t e = l;
        while (e && (s[e - 1] == ' ' || s[e - 1] == '\t'))
            e--;
        if (e && !(e == 3 && strncasecmp(s, "h2c", 3) == 0))
            return true;
        s += l;
    }
    return false;
}

/* ---- request objects ---- */

static void
arena_add(struct hreq *r, const char *p, size_t n)
{
    gostr_addn(&r->arena, p, n);
}

/* End the current string: its NUL stays in the arena. */
static void
arena_nul(struct hreq *r)
{
    gostr_addn(&r->arena, "", 1);
}

static struct hreq *
req_new(struct hconn *c)
{
    struct hreq *r = xcalloc(1, sizeof(*r));
    r->magic = REQ_MAGIC;
    r->c = c;
    r->clen = -1;
    return r;
}

static void
req_free(struct hreq *r)
{
    if (!r)
        return;
    free(r->arena.p);
    free(r->hdrs);
    free(r->hoff);
    free(r->up_hdrs);
    free(r->up_arena);
    if (r->late_complete)
        event_free(r->late_complete);
    if (r->head_out)
        evbuffer_free(r->head_out);
    r->magic = 0;
    free(r);
}

void
hreq_set_upstream_headers(struct hreq *r, const struct http_header *h, size_t n)
{
    free(r->up_hdrs);
    free(r->up_arena);
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += strlen(h[i].name) + strlen(h[i].value) + 2;
    r->up_arena = xmalloc(bytes ? bytes : 1);
    r->up_hdrs = n ? xcalloc(n, sizeof(*r->up_hdrs)) : NULL;
    char *p = r->up_arena;
    for (size_t i = 0; i < n; i++) {
        size_t nl = strlen(h[i].name) + 1, vl = strlen(h[i].value) + 1;
        memcpy(p, h[i].name, nl);
        r->up_hdrs[i].name = p;
        p += nl;
        memcpy(p, h[i].value, vl);
        r->up_hdrs[i].value = p;
        p += vl;
    }
    r->n_up = n;
}

size_t
hreq_upstream_headers(const struct hreq *r, const struct http_header **out)
{
    *out = r->up_hdrs;
    return r->n_up;
}

/* The whole request has been read: tell the handler, once. */
static void
complete_fire(struct hreq *r)
{
    r->complete_fired = true;
    if (!r->ended && r->h && r->h->on_complete)
        r->h->on_complete(r->harg);
}

uint64_t
http_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The server's done callback, then the handler's on_close: once. */
static void
req_closed(struct hreq *r, enum hreq_end how)
{
    if (r->closed_cb)
        return;
    r->closed_cb = true;
    struct http_server *s = r->c->s;
    if (r->dispatched && s->on_done) {
        struct hreq_done d = {.method = r->method, .target = r->arena.p ? r->arena.p : "",
                              .status = r->status, .bytes = r->bytes, .start_ns = r->start_ns,
                              .head_ns = r->head_ns, .end_ns = http_now_ns(), .how = how};
        void *note = r->note;
        r->note = NULL;
        s->on_done(s->done_arg, &d, note);
    }
    if (r->h && r->h->on_close)
        r->h->on_close(r->harg);
}

void
http_server_on_done(struct http_server *s, http_done_cb cb, void *arg)
{
    s->on_done = cb;
    s->done_arg = arg;
}

void
hreq_set_note(struct hreq *r, void *note)
{
    r->note = note;
}

void *
hreq_note(const struct hreq *r)
{
    return r->note;
}

uint64_t
hreq_start_ns(const struct hreq *r)
{
    return r->start_ns;
}

/* ---- parser callbacks: only record; act after execute returns ---- */

static int
on_message_begin(http_parser *p)
{
    struct hconn *c = p->data;
    assert(!c->req);
    c->req = req_new(c);
    if (!c->head_byte) {
        /* a pipelined head, read before the previous response ended: its
         * first byte is in, so the idle timer becomes the head timer */
        c->head_byte = true;
        conn_arm_timer(c);
    }
    return 0;
}

static int
on_url(http_parser *p, const char *at, size_t n)
{
    struct hconn *c = p->data;
    arena_add(c->req, at, n);
    c->req->target_len += n;
    /* called before the end of the input: at the byte after the target
     * (data callbacks are otherwise flushed at the end of each execute) */
    if (at + n < c->feed_end)
        c->req->target_done = true;
    return 0;
}

/* Go's net/textproto reads a header value as kube sees it: leading and
 * trailing spaces and tabs trimmed, and each obs-fold (a line break followed
 * by white space, which libhttp-parser hands over as one more piece of the
 * value, starting at that white space) replaced by one space between the
 * trimmed pieces. kwc reads values the same way, so what it checks (an
 * Impersonate-* value, a token) is what kube would have read. */
static void
value_trim_end(struct hreq *r)
{
    size_t start = r->hoff[2 * (r->nh - 1) + 1];
    while (r->arena.len > start &&
           (r->arena.p[r->arena.len - 1] == ' ' || r->arena.p[r->arena.len - 1] == '\t'))
        r->arena.len--;
}

static int
on_header_field(http_parser *p, const char *at, size_t n)
{
    struct hreq *r = ((struct hconn *)p->data)->req;
    if (r->hdrs)
        return 0; /* a trailer after a chunked body: dropped (the head has been handed
                   * out: hdrs point into the arena, hoff is freed) */
    if (r->hs != H_FIELD) {
        /* a new header line: end the target or the previous value */
        if (r->hs == H_VALUE)
            value_trim_end(r);
        arena_nul(r);
        if (r->nh == MAX_HEADERS)
            return 1;
        if (r->nh == r->hcap) {
            r->hcap = r->hcap ? r->hcap * 2 : 16;
            r->hoff = xrealloc(r->hoff, 2 * r->hcap * sizeof(size_t));
        }
        r->hoff[2 * r->nh] = r->arena.len;
        r->hoff[2 * r->nh + 1] = r->arena.len; /* set again when the value starts */
        r->nh++;
        r->hs = H_FIELD;
    }
    arena_add(r, at, n);
    return 0;
}

static int
on_header_value(http_parser *p, const char *at, size_t n)
{
    struct hconn *c = p->data;
    struct hreq *r = c->req;
    if (r->hdrs)
        return 0; /* a trailer field: dropped */
    if (r->hs != H_VALUE) {
        arena_nul(r); /* end of the name */
        r->hoff[2 * (r->nh - 1) + 1] = r->arena.len;
        r->hs = H_VALUE;
        r->fold_ws = false;
    }
    char before = at > c->feed_start ? at[-1] : c->feed_prev;
    if (n && before == '\n') {
        /* an obs-fold: this piece starts a continuation line */
        value_trim_end(r);
        if (r->arena.len > r->hoff[2 * (r->nh - 1) + 1])
            arena_add(r, " ", 1);
        r->fold_ws = true;
    }
    if (r->fold_ws) {
        while (n && (*at == ' ' || *at == '\t'))
            at++, n--;
        if (n)
            r->fold_ws = false;
    }
    arena_add(r, at, n);
    return 0;
}

static int
on_headers_complete(http_parser *p)
{
    struct hconn *c = p->data;
    struct hreq *r = c->req;
    if (r->hs == H_FIELD) {
        /* a name without a value: an empty value */
        arena_nul(r);
        r->hoff[2 * (r->nh - 1) + 1] = r->arena.len;
    } else if (r->hs == H_VALUE) {
        value_trim_end(r);
    }
    arena_nul(r);
    c->head_ready = true;
    http_parser_pause(p, 1);
    return 0;
}

static int
on_body(http_parser *p, const char *at, size_t n)
{
    struct hconn *c = p->data;
    struct hreq *r = c->req;
    r->body_seen = true;
    if (r->reading && r->h && r->h->on_body) {
        r->h->on_body(r->harg, at, n);
        if (c->state == C_DEAD)
            http_parser_pause(p, 1);
        else if (!r->reading) {
            c->parse_paused_body = true;
            http_parser_pause(p, 1);
        }
        return 0;
    }
    r->discarded += n;
    if (r->discarded > c->s->o.max_discard_bytes) {
        c->discard_overflow = true; /* conn_parse closes the connection */
        http_parser_pause(p, 1);
    }
    return 0;
}

static int
on_message_complete(http_parser *p)
{
    struct hconn *c = p->data;
    c->msg_complete = true;
    http_parser_pause(p, 1);
    return 0;
}

/* ---- answering a bad head (no handler involved) ---- */

/* A Status answer written straight to the connection, which then closes. */
static void
conn_reject(struct hconn *c, int code, const char *message)
{
    struct http_server *s = c->s;
    s->stats.bad_requests++;
    char *body = status_failure_json(code, status_reason_for_code(code), message, NULL);
    size_t bl = strlen(body);
    struct evbuffer *out = bufferevent_get_output(c->bev);
    evbuffer_add_printf(out,
                        "HTTP/1.1 %d %s\r\nCache-Control: no-cache, private\r\n"
                        "Content-Type: application/json\r\nDate: %s\r\nContent-Length: %zu\r\n"
                        "Connection: close\r\n\r\n",
                        code, reason_phrase(code), date_now(s), bl + 1);
    evbuffer_add(out, body, bl);
    evbuffer_add(out, "\n", 1);
    free(body);
    if (c->req) {
        req_closed(c->req, HREQ_END_CLOSED);
        req_free(c->req);
        c->req = NULL;
    }
    c->state = C_REQ; /* nothing more is parsed */
    c->close_when_flushed = true;
    bufferevent_disable(c->bev, EV_READ);
    bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
    event_active(c->kick, EV_TIMEOUT, 1);
}

static bool
target_ok(const struct hreq *r)
{
    if (r->target_len == 0)
        return false;
    for (size_t i = 0; i < r->target_len; i++) {
        unsigned char ch = (unsigned char)r->arena.p[i];
        if (ch <= 0x20 || ch == 0x7f)
            return false;
    }
    return true;
}

/* Check a complete head; 0 or the status to answer (message in *msg). */
static int
check_head(struct hconn *c, struct hreq *r, const char **msg)
{
    http_parser *p = &c->p;
    if (p->http_major != 1) {
        *msg = p->http_major == 0 ? "malformed HTTP request line: no HTTP version"
                                  : "unsupported HTTP version";
        return p->http_major == 0 ? 400 : 505;
    }
    if (!target_ok(r)) {
        *msg = "invalid request target: control characters or spaces";
        return 400;
    }
    r->hdrs = xcalloc(r->nh ? r->nh : 1, sizeof(*r->hdrs));
    bool host = false;
    int te = 0, cl = 0;
    for (size_t i = 0; i < r->nh; i++) {
        r->hdrs[i].name = r->arena.p + r->hoff[2 * i];
        r->hdrs[i].value = r->arena.p + r->hoff[2 * i + 1];
        const char *n = r->hdrs[i].name;
        if (!*n) {
            *msg = "invalid header name";
            return 400;
        }
        for (const char *q = n; *q; q++)
            if (!is_tchar((unsigned char)*q)) {
                *msg = "invalid header name";
                return 400;
            }
        for (const unsigned char *q = (const unsigned char *)r->hdrs[i].value; *q; q++)
            if ((*q < 0x20 && *q != '\t') || *q == 0x7f) {
                *msg = "invalid header value";
                return 400;
            }
        if (strcasecmp(n, "Host") == 0) {
            if (host) {
                *msg = "too many Host headers";
                return 400;
            }
            host = true;
        } else if (strcasecmp(n, "Transfer-Encoding") == 0)
            te++;
        else if (strcasecmp(n, "Content-Length") == 0)
            cl++;
    }
    free(r->hoff);
    r->hoff = NULL;
    if (!host && p->http_minor >= 1) {
        *msg = "missing required Host header";
        return 400;
    }
    if (te && cl) {
        *msg = "Transfer-Encoding and Content-Length together";
        return 400;
    }
    if (te) {
        const char *v = NULL;
        for (size_t i = 0; i < r->nh; i++)
            if (strcasecmp(r->hdrs[i].name, "Transfer-Encoding") == 0)
                v = r->hdrs[i].value;
        if (te > 1 || strcasecmp(v, "chunked") != 0) {
            *msg = "unsupported transfer encoding";
            return 501;
        }
    }
    snprintf(r->method, sizeof(r->method), "%s", http_method_str((enum http_method)p->method));
    r->http10 = p->http_minor == 0;
    r->keepalive = http_should_keep_alive(p) != 0;
    r->chunked = (p->flags & F_CHUNKED) != 0;
    if (!r->chunked && p->content_length != ULLONG_MAX && p->content_length > 0) {
        if (p->content_length > (uint64_t)INT64_MAX) {
            *msg = "invalid Content-Length";
            return 400;
        }
        r->clen = (int64_t)p->content_length;
    }
    r->has_body = r->chunked || r->clen > 0;
    r->head_method = p->method == HTTP_HEAD;
    const char *conn = hreq_header(r, "Connection");
    const char *upg = hreq_header(r, "Upgrade");
    /* h2c is an upgrade of this server's own protocol, which it does not
     * speak (neither does Go's net/http without an h2c handler): such a
     * request is served as an ordinary one. CONNECT is never an upgrade. */
    r->upgrade = p->upgrade && p->method != HTTP_CONNECT && upg && upgrade_names_other(upg) &&
                 conn && token_has(conn, "upgrade");
    /* The connection of an Upgrade request not switched, or of a CONNECT
     * request, is not reused: what the client sent behind it may be
     * another protocol's bytes and is never read as a request. */
    if (r->upgrade || p->method == HTTP_CONNECT)
        r->keepalive = false;
    const char *exp = hreq_header(r, "Expect");
    if (exp) {
        if (strcasecmp(exp, "100-continue") != 0) {
            *msg = "unsupported Expect header";
            return 417;
        }
        r->expect_continue = !r->http10 && r->has_body;
    }
    return 0;
}

/* ---- the parse loop ---- */

static void
dispatch(struct hconn *c)
{
    struct hreq *r = c->req;
    struct http_server *s = c->s;
    c->state = C_REQ;
    c->head_byte = false;
    event_del(c->timer);
    s->stats.requests++;
    r->dispatched = true;
    r->start_ns = http_now_ns();
    s->on_request(s->arg, r);
}

/*
 * Feed the input to the parser while the state allows. Returns with the
 * parser paused (a request in progress, or waiting for the handler to read)
 * or the input empty.
 */
static void
conn_parse(struct hconn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    while (c->state != C_DEAD) {
        if (c->state == C_REQ) {
            struct hreq *r = c->req;
            /* body bytes flow only while the handler reads (or discards) */
            if (!r || r->ended || c->msg_complete || c->parse_paused_body)
                return;
        }
        size_t avail = evbuffer_get_length(in);
        if (avail == 0)
            return;
        struct evbuffer_iovec v;
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
            return;
        size_t len = v.iov_len < READ_CHUNK ? v.iov_len : READ_CHUNK;
        c->feed_start = v.iov_base;
        c->feed_end = (const char *)v.iov_base + len;
        size_t n = http_parser_execute(&c->p, &c->s->ps, v.iov_base, len);
        if (n)
            c->feed_prev = ((const char *)v.iov_base)[n - 1];
        enum http_errno e = HTTP_PARSER_ERRNO(&c->p);
        if (e != HPE_OK && e != HPE_PAUSED) {
            bool in_head = c->state == C_IDLE;
            if (!in_head) {
                /* a broken body (bad chunk framing): the request cannot go on */
                log_debug("http: bad request body: %s", http_errno_description(e));
                c->s->stats.bad_requests++;
                conn_close(c);
                return;
            }
            if (e == HPE_HEADER_OVERFLOW) {
                /* the header callbacks of this execute have not run yet */
                bool line = !c->req || !c->req->target_done;
                conn_reject(c, line ? 414 : 431,
                            line ? "the request URI is too long (over --max-header-bytes)"
                                 : "the request headers are too large (over --max-header-bytes)");
            } else if (e == HPE_INVALID_URL) {
                conn_reject(c, 400, "invalid request target: control characters or spaces");
            } else if (e == HPE_INVALID_TRANSFER_ENCODING) {
                conn_reject(c, 501, "unsupported transfer encoding");
            } else if (e == HPE_CB_header_field) {
                conn_reject(c, 431, "too many request headers");
            } else if (e == HPE_UNEXPECTED_CONTENT_LENGTH) {
                conn_reject(c, 400, "conflicting Content-Length or Transfer-Encoding headers");
            } else {
                char m[160];
                snprintf(m, sizeof(m), "malformed HTTP request: %s", http_errno_description(e));
                conn_reject(c, 400, m);
            }
            return;
        }
        if (c->head_ready) {
            c->head_ready = false;
            /* paused before the head's final LF: it is consumed here */
            evbuffer_drain(in, n + 1 < avail ? n + 1 : avail);
            const char *msg = NULL;
            int code = check_head(c, c->req, &msg);
            if (code) {
                conn_reject(c, code, msg);
                return;
            }
            struct hreq *r = c->req;
            /* the LF, then the parser waits at the body (or completes a
             * request without one). An Upgrade request too: its body (the
             * parser's "upgrade" exit comes after it) is read like any
             * other, and the parse stops at its end, so that the bytes
             * behind it stay in the input for whoever takes the
             * connection (hreq_take_bev), or for nobody. */
            http_parser_pause(&c->p, 0);
            http_parser_execute(&c->p, &c->s->ps, "\n", 1);
            e = HTTP_PARSER_ERRNO(&c->p);
            if (e != HPE_OK && e != HPE_PAUSED) {
                conn_reject(c, 400, "malformed HTTP request");
                return;
            }
            if (c->msg_complete)
                r->complete = true; /* no body: complete before the handler sees it */
            dispatch(c);
            if (c->state == C_DEAD || c->req != r)
                return;
            if (r->complete) {
                complete_fire(r);
                return;
            }
            continue;
        }
        evbuffer_drain(in, n);
        if (c->discard_overflow) {
            log_debug("http: closing: an unread request body passed %zu bytes",
                      c->s->o.max_discard_bytes);
            conn_close(c);
            return;
        }
        if (c->msg_complete && c->req && !c->req->complete) {
            struct hreq *r = c->req;
            r->complete = true;
            complete_fire(r);
            return;
        }
        if (e == HPE_PAUSED && c->parse_paused_body)
            return;
    }
}

/* The response is over and has left: next request, or close. */
static void
conn_finish_req(struct hconn *c)
{
    struct hreq *r = c->req;
    bool close = r->close_after || !r->keepalive || !r->complete;
    req_closed(r, HREQ_END_DONE);
    req_free(r);
    c->req = NULL;
    c->msg_complete = false;
    c->parse_paused_body = false;
    if (close) {
        conn_close_graceful(c);
        return;
    }
    http_parser_pause(&c->p, 0);
    c->state = C_IDLE;
    bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
    bufferevent_enable(c->bev, EV_READ);
    conn_arm_timer(c);
    conn_parse(c);
}

static void
on_kick(evutil_socket_t fd, short what, void *arg)
{
    struct hconn *c = conn_of(arg);
    if (c->state == C_DEAD)
        return;
    size_t queued = evbuffer_get_length(bufferevent_get_output(c->bev));
    if (c->close_when_flushed) {
        if (queued == 0)
            conn_close_graceful(c);
        return;
    }
    if (c->req && c->req->ended) {
        if (queued == 0)
            conn_finish_req(c);
        return;
    }
    conn_parse(c);
}

/* ---- bufferevent callbacks ---- */

static void
on_read(struct bufferevent *bev, void *arg)
{
    struct hconn *c = conn_of(arg);
    if (c->state == C_IDLE && !c->head_byte) {
        /* the first byte of a request: the idle timer becomes the head timer */
        c->head_byte = true;
        conn_arm_timer(c);
    }
    conn_parse(c);
    if (c->state != C_DEAD && c->state == C_REQ &&
        evbuffer_get_length(bufferevent_get_input(bev)) > READ_CHUNK)
        bufferevent_disable(bev, EV_READ); /* pipelined bytes wait: bounded */
}

static void
on_write(struct bufferevent *bev, void *arg)
{
    struct hconn *c = conn_of(arg);
    if (c->state == C_DEAD)
        return;
    size_t queued = evbuffer_get_length(bufferevent_get_output(bev));
    if (c->close_when_flushed) {
        if (queued == 0)
            conn_close_graceful(c);
        return;
    }
    struct hreq *r = c->req;
    if (!r)
        return;
    if (r->ended) {
        if (queued == 0)
            conn_finish_req(c);
        return;
    }
    if (r->h && r->h->on_drain && queued <= r->low_water)
        r->h->on_drain(r->harg);
}

static void
on_event(struct bufferevent *bev, short what, void *arg)
{
    struct hconn *c = conn_of(arg);
    if (what & BEV_EVENT_CONNECTED) {
        c->handshake_done = true;
        return;
    }
    if (what & BEV_EVENT_ERROR) {
        if (c->ssl && !c->handshake_done) {
            c->s->stats.tls_handshake_failed++;
            unsigned long e = bufferevent_get_openssl_error(bev);
            if (e) {
                char buf[256];
                ERR_error_string_n(e, buf, sizeof(buf));
                log_debug("http: TLS handshake failed: %s", buf);
            }
        }
    }
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        /* The client is gone, or half-closed: like Go, kwc then gives up on
         * a request in progress; an answer already complete still leaves. */
        if ((what & BEV_EVENT_EOF) && c->req && c->req->ended &&
            evbuffer_get_length(bufferevent_get_output(bev)) > 0) {
            c->close_when_flushed = true;
            bufferevent_disable(bev, EV_READ);
            return;
        }
        conn_close(c);
    }
}

static void
on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct hconn *c = conn_of(arg);
    if (c->state != C_IDLE)
        return;
    if (c->timer_idle)
        c->s->stats.idle_timeouts++;
    else
        c->s->stats.header_timeouts++;
    conn_close(c);
}

static void
conn_arm_timer(struct hconn *c)
{
    const struct http_server_options *o = &c->s->o;
    c->timer_idle = !c->head_byte && c->handshake_done;
    int ms = c->timer_idle ? o->idle_timeout_ms : o->request_header_timeout_ms;
    event_del(c->timer);
    if (ms > 0) {
        struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
        evtimer_add(c->timer, &tv);
    }
}

/* ---- connection lifecycle ---- */

static void
conn_unlink(struct hconn *c)
{
    if (!c->prev)
        return;
    *c->prev = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = NULL;
    c->next = NULL;
    c->s->nconns--;
    c->s->stats.open = c->s->nconns;
}

/* Free what the connection holds; the socket and SSL only when owned. */
static void
conn_free(struct hconn *c)
{
    if (c->bev)
        bufferevent_free(c->bev);
    if (c->ssl)
        SSL_free(c->ssl);
    if (c->fd >= 0)
        close(c->fd);
    event_free(c->timer);
    event_free(c->kick);
    req_free(c->req);
    c->magic = 0;
    free(c);
}

static void
on_reap(evutil_socket_t fd, short what, void *arg)
{
    struct http_server *s = arg;
    while (s->reap) {
        struct hconn *c = s->reap;
        s->reap = c->next_reap;
        conn_free(c);
    }
}

/* Close now (the client sees EOF or a reset); freed from the reap event. */
static void
conn_close(struct hconn *c)
{
    if (c->state == C_DEAD)
        return;
    c->state = C_DEAD;
    if (c->req)
        req_closed(c->req, c->req->taken ? HREQ_END_TAKEN : HREQ_END_CLOSED);
    conn_unlink(c);
    event_del(c->timer);
    event_del(c->kick);
    bufferevent_disable(c->bev, EV_READ | EV_WRITE);
    bufferevent_setcb(c->bev, NULL, NULL, NULL, NULL);
    if (c->fd >= 0)
        shutdown(c->fd, SHUT_RDWR);
    c->next_reap = c->s->reap;
    c->s->reap = c;
    event_active(c->s->reap_ev, EV_TIMEOUT, 1);
}

/* A refused connection: its request is read and dropped until the client
 * closes (or LINGER_MS), so the 429 is not lost to a reset. */
struct refused {
    struct http_server *s;
    int fd;
    struct event *ev;
    struct refused *next, **prev;
};

static void
linger_end(struct refused *l)
{
    *l->prev = l->next;
    if (l->next)
        l->next->prev = l->prev;
    l->s->nlinger--;
    event_free(l->ev);
    close(l->fd);
    free(l);
}

static void
on_linger(evutil_socket_t fd, short what, void *arg)
{
    struct refused *l = arg;
    if (what & EV_READ) {
        char buf[4096];
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR)))
            return;
    }
    linger_end(l);
}

/* Close fd once the client has stopped sending (or after LINGER_MS): an
 * answer followed at once by close(2) with unread request bytes makes the
 * kernel send a reset, which can destroy the answer in flight. */
static void
linger_close(struct http_server *s, int fd)
{
    shutdown(fd, SHUT_WR);
    if (s->nlinger >= HTTP_LINGER_MAX) {
        close(fd);
        return;
    }
    struct refused *l = xcalloc(1, sizeof(*l));
    l->s = s;
    l->fd = fd;
    l->ev = event_new(s->base, fd, EV_READ | EV_PERSIST, on_linger, l);
    struct timeval tv = {LINGER_MS / 1000, (LINGER_MS % 1000) * 1000};
    event_add(l->ev, &tv);
    s->nlinger++;
    l->next = s->lingering;
    if (l->next)
        l->next->prev = &l->next;
    l->prev = &s->lingering;
    s->lingering = l;
}

/* Over the connection cap: a fast 429 and close, never a hang. */
static void
refuse(struct http_server *s, int fd)
{
    s->stats.refused++;
    if (!s->ctx) {
        /* a TLS client just sees the close: no handshake is spent on a
         * connection over the cap */
        char *body = status_failure_json(429, "TooManyRequests",
                                         "Too many requests, please try again later.", NULL);
        char buf[1024];
        int n = snprintf(buf, sizeof(buf),
                         "HTTP/1.1 429 Too Many Requests\r\nCache-Control: no-cache, private\r\n"
                         "Content-Type: application/json\r\nDate: %s\r\nRetry-After: 1\r\n"
                         "Content-Length: %zu\r\nConnection: close\r\n\r\n%s\n",
                         date_now(s), strlen(body) + 1, body);
        free(body);
        if (n > 0 && (size_t)n < sizeof(buf)) {
            /* a fresh socket's send buffer takes this at once */
            ssize_t w = send(fd, buf, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
            (void)w;
        }
    }
    linger_close(s, fd);
}

/* Close after a complete answer: plaintext sockets linger (see
 * linger_close); TLS ones close (their reads would need the SSL state). */
static void
conn_close_graceful(struct hconn *c)
{
    if (c->state != C_DEAD && !c->ssl && c->fd >= 0) {
        int fd = c->fd;
        c->fd = -1;
        conn_close(c);
        linger_close(c->s, fd);
        return;
    }
    conn_close(c);
}

static SSL_CTX *
server_ctx(struct http_server *s)
{
    return s->ctx;
}

static void
on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
    http_server_adopt(arg, fd, sa, (socklen_t)salen);
}

void
http_server_adopt(struct http_server *s, int fd, const struct sockaddr *sa, socklen_t salen)
{
    assert(s->magic == SRV_MAGIC);
    s->stats.accepted++;
    if (s->o.max_connections && s->nconns + atomic_load(&taken_conns) >= s->o.max_connections) {
        refuse(s, fd);
        return;
    }
    struct hconn *c = xcalloc(1, sizeof(*c));
    c->magic = CONN_MAGIC;
    c->s = s;
    c->fd = fd;
    if (sa && salen > 0 && (size_t)salen <= sizeof(c->peer)) {
        memcpy(&c->peer, sa, (size_t)salen);
        c->peer_len = (socklen_t)salen;
    }
    int one = 1;
    /* responses leave in several writes: without NODELAY the last small one
     * waits for the client's delayed ACK */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    SSL_CTX *ctx = server_ctx(s);
    if (ctx) {
        c->ssl = SSL_new(ctx);
        if (!c->ssl) {
            close(fd);
            free(c);
            return;
        }
        c->bev = bufferevent_openssl_socket_new(s->base, fd, c->ssl, BUFFEREVENT_SSL_ACCEPTING, 0);
        if (c->bev)
            bufferevent_openssl_set_allow_dirty_shutdown(c->bev, 1);
    } else {
        c->bev = bufferevent_socket_new(s->base, fd, 0);
        c->handshake_done = true;
    }
    c->timer = evtimer_new(s->base, on_timer, c);
    c->kick = event_new(s->base, -1, 0, on_kick, c);
    if (!c->bev || !c->timer || !c->kick) {
        log_warnx("http: cannot set up a connection: out of memory");
        conn_free(c);
        return;
    }
    http_parser_init(&c->p, HTTP_REQUEST);
    c->p.data = c;
    c->state = C_IDLE;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = &c->next;
    c->prev = &s->conns;
    s->conns = c;
    s->nconns++;
    s->stats.open = s->nconns;
    bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
    bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
    bufferevent_enable(c->bev, EV_READ);
    /* a new connection: the head timeout (covering the TLS handshake) */
    c->head_byte = false;
    const struct http_server_options *o = &s->o;
    int ms = o->request_header_timeout_ms;
    if (ms > 0) {
        struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
        evtimer_add(c->timer, &tv);
    }
}

static void
on_accept_retry(evutil_socket_t fd, short what, void *arg)
{
    struct http_server *s = arg;
    for (size_t i = 0; i < s->nls; i++)
        evconnlistener_enable(s->ls[i].l);
}

static void
on_accept_error(struct evconnlistener *l, void *arg)
{
    struct http_server *s = arg;
    int e = EVUTIL_SOCKET_ERROR();
    if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
        /* out of descriptors: stop accepting for a moment instead of spinning */
        s->stats.accept_errors++;
        log_warnx("http: accept: %s; pausing accepts for %d ms (raise the fd limit or lower "
                  "--max-connections)",
                  strerror(e), ACCEPT_RETRY_MS);
        for (size_t i = 0; i < s->nls; i++)
            evconnlistener_disable(s->ls[i].l);
        struct timeval tv = {0, ACCEPT_RETRY_MS * 1000};
        evtimer_add(s->accept_retry, &tv);
        return;
    }
    log_debug("http: accept: %s", strerror(e));
}

/* ---- TLS ---- */

static int
stamp_of(const char *path, struct tls_stamp *st)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return -errno;
    st->dev = sb.st_dev;
    st->ino = sb.st_ino;
    st->size = sb.st_size;
    st->mtime = sb.st_mtim;
    return 0;
}

static bool
stamp_eq(const struct tls_stamp *a, const struct tls_stamp *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec;
}

static int
on_alpn(SSL *ssl, const unsigned char **out, unsigned char *outlen, const unsigned char *in,
        unsigned int inlen, void *arg)
{
    static const unsigned char ours[] = "\x08http/1.1";
    unsigned char *sel;
    if (SSL_select_next_proto(&sel, outlen, ours, sizeof(ours) - 1, in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_NOACK; /* no common protocol: go on without ALPN */
    *out = sel;
    return SSL_TLSEXT_ERR_OK;
}

static void
ssl_err(char *err, size_t errlen, const char *what, const char *file)
{
    unsigned long e = ERR_peek_last_error();
    char buf[256] = "";
    if (e)
        ERR_error_string_n(e, buf, sizeof(buf));
    ERR_clear_error();
    snprintf(err, errlen, "%s %s: %s", what, file, buf[0] ? buf : "unknown OpenSSL error");
}

/* A new server context from the files; NULL with a message in err. */
static SSL_CTX *
ctx_build(const struct http_server_options *o, char *err, size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        ssl_err(err, errlen, "cannot create a TLS context", "");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, o->tls_min_version ? o->tls_min_version : TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                                 SSL_OP_NO_COMPRESSION);
    /* TLS 1.3 suites in Go's order (kube-apiserver's): AES-128-GCM first, it
     * costs ~30 % less per byte than OpenSSL's default AES-256-GCM */
    SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256:"
                                  "TLS_AES_256_GCM_SHA384");
    /* memory per idle connection: OpenSSL frees its record buffers when idle */
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_SERVER);
    SSL_CTX_set_session_id_context(ctx, (const unsigned char *)"kwc", 3);
    if (SSL_CTX_use_certificate_chain_file(ctx, o->tls_cert_file) != 1) {
        ssl_err(err, errlen, "--tls-cert-file: cannot load", o->tls_cert_file);
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, o->tls_key_file, SSL_FILETYPE_PEM) != 1) {
        if (ERR_GET_REASON(ERR_peek_last_error()) != X509_R_KEY_VALUES_MISMATCH) {
            ssl_err(err, errlen, "--tls-private-key-file: cannot load", o->tls_key_file);
            goto fail;
        }
        ERR_clear_error();
        snprintf(err, errlen,
                 "--tls-private-key-file %s does not match the certificate in --tls-cert-file %s",
                 o->tls_key_file, o->tls_cert_file);
        goto fail;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        ERR_clear_error();
        snprintf(err, errlen,
                 "--tls-private-key-file %s does not match the certificate in --tls-cert-file %s",
                 o->tls_key_file, o->tls_cert_file);
        goto fail;
    }
    if (o->client_ca_file) {
        if (SSL_CTX_load_verify_locations(ctx, o->client_ca_file, NULL) != 1) {
            ssl_err(err, errlen, "--client-ca-file: cannot load", o->client_ca_file);
            goto fail;
        }
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(o->client_ca_file);
        if (names)
            SSL_CTX_set_client_CA_list(ctx, names);
        /* verified when presented; a certificate is not required (the
         * request may authenticate otherwise) */
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    }
    SSL_CTX_set_alpn_select_cb(ctx, on_alpn, NULL);
    return ctx;
fail:
    SSL_CTX_free(ctx);
    return NULL;
}

static void
on_reload(evutil_socket_t fd, short what, void *arg)
{
    struct http_server *s = arg;
    struct tls_stamp c, k;
    if (stamp_of(s->o.tls_cert_file, &c) != 0 || stamp_of(s->o.tls_key_file, &k) != 0)
        return; /* mid-replacement, or gone: keep serving what is loaded */
    if (stamp_eq(&c, &s->st_cert) && stamp_eq(&k, &s->st_key))
        return;
    if (stamp_eq(&c, &s->st_failed_cert) && stamp_eq(&k, &s->st_failed_key))
        return; /* this pair failed already: wait for another change */
    char err[512];
    SSL_CTX *ctx = ctx_build(&s->o, err, sizeof(err));
    if (!ctx) {
        log_warnx("tls: the certificate files changed but cannot be used (%s); still serving the "
                  "previous certificate",
                  err);
        s->st_failed_cert = c;
        s->st_failed_key = k;
        return;
    }
    SSL_CTX_free(s->ctx); /* connections hold their own reference */
    s->ctx = ctx;
    s->st_cert = c;
    s->st_key = k;
    s->stats.tls_reloads++;
    log_info("tls: reloaded the serving certificate from %s", s->o.tls_cert_file);
}

/* ---- the server ---- */

static int
listen_one(struct http_server *s, const struct http_listen_addr *a, int port_override,
           struct listener *out, char *err, size_t errlen)
{
    struct sockaddr_storage ss = a->ss;
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (ss.ss_family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)&ss;
        if (port_override)
            in->sin_port = htons((uint16_t)port_override);
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        port = ntohs(in->sin_port);
    } else if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
        if (port_override)
            in6->sin6_port = htons((uint16_t)port_override);
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        port = ntohs(in6->sin6_port);
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return kwc_errf(err, errlen, -errno, "--listen %s:%d: cannot create a socket: %s", host,
                        port, strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ss.ss_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&ss, a->len) != 0) {
        int e = errno;
        close(fd);
        return kwc_errf(err, errlen, -e, "--listen %s%s%s:%d: cannot bind: %s%s",
                        ss.ss_family == AF_INET6 ? "[" : "", host,
                        ss.ss_family == AF_INET6 ? "]" : "", port, strerror(e),
                        e == EADDRINUSE ? " (is another process using it?)" : "");
    }
    out->l = evconnlistener_new(s->base, on_accept, s, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC,
                                s->o.backlog ? s->o.backlog : 1024, fd);
    if (!out->l) {
        int e = errno;
        close(fd);
        return kwc_errf(err, errlen, -e, "--listen %s:%d: cannot listen: %s", host, port,
                        strerror(e));
    }
    evconnlistener_set_error_cb(out->l, on_accept_error);
    struct sockaddr_storage got;
    socklen_t gl = sizeof(got);
    if (getsockname(fd, (struct sockaddr *)&got, &gl) == 0)
        out->port = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                                    : ((struct sockaddr_in *)&got)->sin_port);
    return 0;
}

int
http_server_new(struct event_base *base, const struct http_server_options *o,
                http_request_cb on_request, void *arg, struct http_server **out, char *err,
                size_t errlen)
{
    struct http_server *s = xcalloc(1, sizeof(*s));
    s->magic = SRV_MAGIC;
    s->base = base;
    s->o = *o;
    if (!s->o.max_header_bytes)
        s->o.max_header_bytes = 1u << 20;
    if (!s->o.max_discard_bytes)
        s->o.max_discard_bytes = 1u << 20;
    if (!s->o.tls_reload_ms)
        s->o.tls_reload_ms = 1000;
    s->on_request = on_request;
    s->arg = arg;
    http_parser_set_max_header_size((uint32_t)(s->o.max_header_bytes > UINT32_MAX
                                                   ? UINT32_MAX
                                                   : s->o.max_header_bytes));
    s->ps = (http_parser_settings){
        .on_message_begin = on_message_begin,
        .on_url = on_url,
        .on_header_field = on_header_field,
        .on_header_value = on_header_value,
        .on_headers_complete = on_headers_complete,
        .on_body = on_body,
        .on_message_complete = on_message_complete,
    };
    s->reap_ev = event_new(base, -1, 0, on_reap, s);
    s->accept_retry = evtimer_new(base, on_accept_retry, s);
    int rc = 0;
    if (o->tls_cert_file || o->tls_key_file) {
        if (!o->tls_cert_file || !o->tls_key_file) {
            rc = kwc_errf(err, errlen, KWC_ECONFIG,
                          "TLS needs both --tls-cert-file and --tls-private-key-file");
            goto fail;
        }
        s->ctx = ctx_build(&s->o, err, errlen);
        if (!s->ctx) {
            rc = KWC_ECONFIG;
            goto fail;
        }
        stamp_of(o->tls_cert_file, &s->st_cert);
        stamp_of(o->tls_key_file, &s->st_key);
        s->reload_timer = event_new(base, -1, EV_PERSIST, on_reload, s);
        struct timeval tv = {s->o.tls_reload_ms / 1000, (s->o.tls_reload_ms % 1000) * 1000};
        evtimer_add(s->reload_timer, &tv);
    }
    s->ls = xcalloc(o->naddrs ? o->naddrs : 1, sizeof(*s->ls));
    int first_port = 0;
    for (size_t i = 0; i < o->naddrs; i++) {
        /* with port 0 on several addresses, they all share the first one's port */
        char e1[256];
        rc = listen_one(s, &o->addrs[i], first_port, &s->ls[s->nls], e1, sizeof(e1));
        if (rc == -EADDRNOTAVAIL || rc == -EAFNOSUPPORT) {
            /* a name's address this host cannot bind (::1 without IPv6):
             * the others serve; none at all is an error below */
            log_warnx("%s: skipped", e1);
            snprintf(err, errlen, "%s", e1);
            continue;
        }
        if (rc != 0) {
            snprintf(err, errlen, "%s", e1);
            goto fail;
        }
        if (s->nls++ == 0)
            first_port = s->ls[0].port;
    }
    if (o->naddrs && !s->nls)
        goto fail; /* err says why the last one failed */
    rc = 0;

    *out = s;
    return 0;
fail:
    http_server_free(s);
    return rc;
}

int
http_server_port(const struct http_server *s, size_t i)
{
    return i < s->nls ? s->ls[i].port : 0;
}

void
http_server_stats(const struct http_server *s, struct http_server_stats *out)
{
    *out = s->stats;
    out->taken = atomic_load(&taken_conns);
    out->max_connections = s->o.max_connections;
}

void
http_server_free(struct http_server *s)
{
    if (!s)
        return;
    assert(s->magic == SRV_MAGIC);
    for (size_t i = 0; i < s->nls; i++)
        evconnlistener_free(s->ls[i].l);
    free(s->ls);
    while (s->conns)
        conn_close(s->conns);
    on_reap(-1, 0, s);
    while (s->lingering)
        linger_end(s->lingering);
    if (s->reload_timer)
        event_free(s->reload_timer);
    if (s->reap_ev)
        event_free(s->reap_ev);
    if (s->accept_retry)
        event_free(s->accept_retry);
    SSL_CTX_free(s->ctx);
    s->magic = 0;
    free(s);
}

/* ---- the request head ---- */

static struct hreq *
req_of(const struct hreq *r)
{
    assert(r && r->magic == REQ_MAGIC);
    return (struct hreq *)(uintptr_t)r;
}

const char *
hreq_method(const struct hreq *r)
{
    return req_of(r)->method;
}

const char *
hreq_target(const struct hreq *r, size_t *len)
{
    if (len)
        *len = r->target_len;
    return r->arena.p;
}

bool
hreq_http10(const struct hreq *r)
{
    return r->http10;
}

const char *
hreq_header(const struct hreq *r, const char *name)
{
    for (size_t i = 0; r->hdrs && i < r->nh; i++)
        if (strcasecmp(r->hdrs[i].name, name) == 0)
            return r->hdrs[i].value;
    return NULL;
}

size_t
hreq_headers(const struct hreq *r, const struct http_header **out)
{
    *out = r->hdrs;
    return r->nh;
}

bool
hreq_has_body(const struct hreq *r)
{
    return r->has_body;
}

int64_t
hreq_content_length(const struct hreq *r)
{
    return r->chunked ? -1 : r->clen;
}

bool
hreq_upgrade(const struct hreq *r)
{
    return r->upgrade;
}

const struct sockaddr *
hreq_peer(const struct hreq *r, socklen_t *len)
{
    if (len)
        *len = r->c->peer_len;
    return (const struct sockaddr *)&r->c->peer;
}

X509 *
hreq_client_cert(const struct hreq *r)
{
    SSL *ssl = r->c->ssl;
    if (!ssl || !r->c->s->o.client_ca_file)
        return NULL;
    if (SSL_get_verify_result(ssl) != X509_V_OK)
        return NULL;
    return SSL_get0_peer_certificate(ssl);
}

bool
hreq_tls(const struct hreq *r)
{
    return r->c->ssl != NULL;
}

struct event_base *
hreq_base(const struct hreq *r)
{
    return r->c->s->base;
}

/* ---- handler hooks and the body ---- */

static void kick(struct hconn *c);

static void
on_late_complete(evutil_socket_t fd, short what, void *arg)
{
    complete_fire(arg);
}

void
hreq_set_handler(struct hreq *r, const struct hreq_handler *h, void *arg)
{
    req_of(r);
    r->h = h;
    r->harg = arg;
    if (r->held) {
        /* the next handler reads the body (hreq_body_read) before the
         * deferred parse runs, or lets it be discarded */
        struct hconn *c = r->c;
        r->held = false;
        if (!r->reading && c->state != C_DEAD) {
            c->parse_paused_body = false;
            http_parser_pause(&c->p, 0);
            kick(c);
        }
    }
    /* A handler set after the request completed (the stages waited for the
     * upstream to authenticate it) still hears of it, from the loop. */
    if (r->complete_fired && h && h->on_complete && !r->ended) {
        if (!r->late_complete)
            r->late_complete = event_new(r->c->s->base, -1, 0, on_late_complete, r);
        event_active(r->late_complete, EV_TIMEOUT, 1);
    }
}

static void
kick(struct hconn *c)
{
    if (c->state != C_DEAD)
        event_active(c->kick, EV_TIMEOUT, 1);
}

void
hreq_body_hold(struct hreq *r)
{
    struct hconn *c = req_of(r)->c;
    if (c->state == C_DEAD || r->reading || r->complete)
        return;
    r->held = true;
    c->parse_paused_body = true; /* conn_parse stops before the body */
}

void
hreq_body_read(struct hreq *r, bool on)
{
    struct hconn *c = req_of(r)->c;
    if (c->state == C_DEAD || r->reading == on)
        return;
    r->reading = on;
    if (!on)
        c->parse_paused_body = true; /* held in the input buffer, not discarded */
    if (on) {
        if (r->expect_continue && !r->sent_continue && !r->started) {
            r->sent_continue = true;
            evbuffer_add(bufferevent_get_output(c->bev), "HTTP/1.1 100 Continue\r\n\r\n", 25);
        }
        if (c->parse_paused_body) {
            c->parse_paused_body = false;
            http_parser_pause(&c->p, 0);
        }
        bufferevent_enable(c->bev, EV_READ);
        kick(c); /* bytes already in the input buffer */
    }
}

/* ---- the response writer ---- */

void
hresp_header(struct hreq *r, const char *name, const char *value)
{
    req_of(r);
    assert(!r->started);
    if (!r->head_out)
        r->head_out = evbuffer_new();
    if (strcasecmp(name, "Date") == 0)
        r->has_date = true;
    /* a value cannot carry a line break into the head */
    size_t vl = strcspn(value, "\r\n");
    evbuffer_add_printf(r->head_out, "%s: %.*s\r\n", name, (int)vl, value);
}

void
hresp_close_after(struct hreq *r)
{
    req_of(r)->close_after = true;
}

void
hresp_start(struct hreq *r, int status, int64_t content_length)
{
    struct hconn *c = req_of(r)->c;
    assert(!r->started);
    r->started = true;
    if (c->state == C_DEAD)
        return;
    /* a request answered before its body was read: the rest of the body must
     * never be parsed as a request (unless it can be discarded in full) */
    if (r->has_body && !r->complete && !r->reading)
        r->close_after = true; /* said in the head: Connection: close */
    r->no_body = r->head_method || status == 204 || status == 304 || (status >= 100 && status < 200);
    bool streamed = content_length < 0 && !r->no_body;
    if (streamed && r->http10)
        r->close_after = true; /* close-delimited */
    r->streamed_chunked = streamed && !r->http10;
    bool keep = r->keepalive && !r->close_after;
    struct evbuffer *out = bufferevent_get_output(c->bev);
    size_t before = evbuffer_get_length(out);
    r->status = status;
    r->head_ns = http_now_ns();
    evbuffer_add_printf(out, "HTTP/1.%d %d %s\r\n", r->http10 ? 0 : 1, status, reason_phrase(status));
    if (r->head_out) {
        evbuffer_add_buffer(out, r->head_out);
        evbuffer_free(r->head_out);
        r->head_out = NULL;
    }
    if (!r->has_date)
        evbuffer_add_printf(out, "Date: %s\r\n", date_now(c->s));
    if (content_length >= 0 && status != 204 && status != 304 && status >= 200)
        evbuffer_add_printf(out, "Content-Length: %lld\r\n", (long long)content_length);
    else if (r->streamed_chunked)
        evbuffer_add(out, "Transfer-Encoding: chunked\r\n", 28);
    if (!keep)
        evbuffer_add(out, "Connection: close\r\n", 19);
    else if (r->http10)
        evbuffer_add(out, "Connection: keep-alive\r\n", 24);
    evbuffer_add(out, "\r\n", 2);
    r->bytes += evbuffer_get_length(out) - before;
    if (!keep)
        r->close_after = true;
}

void
hresp_write(struct hreq *r, const void *p, size_t n)
{
    struct hconn *c = req_of(r)->c;
    assert(r->started && !r->ended);
    if (c->state == C_DEAD || n == 0 || r->no_body)
        return;
    struct evbuffer *out = bufferevent_get_output(c->bev);
    size_t before = evbuffer_get_length(out);
    if (r->streamed_chunked) {
        evbuffer_add_printf(out, "%zx\r\n", n);
        evbuffer_add(out, p, n);
        evbuffer_add(out, "\r\n", 2);
    } else {
        evbuffer_add(out, p, n);
    }
    r->bytes += evbuffer_get_length(out) - before;
}

void
hresp_write_buffer(struct hreq *r, struct evbuffer *buf)
{
    struct hconn *c = req_of(r)->c;
    size_t n = evbuffer_get_length(buf);
    if (c->state == C_DEAD || n == 0 || r->no_body) {
        evbuffer_drain(buf, n);
        return;
    }
    struct evbuffer *out = bufferevent_get_output(c->bev);
    size_t before = evbuffer_get_length(out);
    if (r->streamed_chunked) {
        evbuffer_add_printf(out, "%zx\r\n", n);
        evbuffer_add_buffer(out, buf);
        evbuffer_add(out, "\r\n", 2);
    } else {
        evbuffer_add_buffer(out, buf);
    }
    r->bytes += evbuffer_get_length(out) - before;
}

size_t
hresp_queued(const struct hreq *r)
{
    struct hconn *c = req_of(r)->c;
    if (c->state == C_DEAD)
        return 0;
    return evbuffer_get_length(bufferevent_get_output(c->bev));
}

void
hresp_low_water(struct hreq *r, size_t n)
{
    struct hconn *c = req_of(r)->c;
    r->low_water = n;
    if (c->state != C_DEAD && !r->ended)
        bufferevent_setwatermark(c->bev, EV_WRITE, n, 0);
}

void
hresp_end(struct hreq *r)
{
    struct hconn *c = req_of(r)->c;
    assert(r->started);
    if (r->ended)
        return;
    r->ended = true;
    if (c->state == C_DEAD)
        return;
    if (r->streamed_chunked) {
        evbuffer_add(bufferevent_get_output(c->bev), "0\r\n\r\n", 5);
        r->bytes += 5;
    }
    if (!r->complete)
        r->close_after = true; /* the body was not read to its end */
    bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
    kick(c); /* finish once the output has left */
}

void
hresp_abort(struct hreq *r)
{
    struct hconn *c = req_of(r)->c;
    r->ended = true;
    if (c->state != C_DEAD)
        conn_close(c);
}

void
hresp_simple(struct hreq *r, int status, const char *content_type, const void *body, size_t n)
{
    if (content_type)
        hresp_header(r, "Content-Type", content_type);
    hresp_start(r, status, (int64_t)n);
    hresp_write(r, body, n);
    hresp_end(r);
}

bool
hresp_started(const struct hreq *r)
{
    return r->started;
}

/* ---- leaving the server ---- */

/* Forget c without closing its socket or freeing its SSL. */
static void
conn_detach(struct hconn *c)
{
    c->fd = -1;
    c->ssl = NULL;
    conn_close(c);
}

int
hreq_take_socket(struct hreq *r, struct http_taken *out)
{
    struct hconn *c = req_of(r)->c;
    if (c->state == C_DEAD)
        return -1;
    assert(evbuffer_get_length(bufferevent_get_output(c->bev)) == 0 || !r->started);
    out->fd = c->fd;
    out->ssl = c->ssl;
    out->note = r->note;
    r->note = NULL;
    r->ended = true;
    r->taken = true;
    atomic_fetch_add(&taken_conns, 1);
    conn_detach(c);
    return 0;
}

struct bufferevent *
hreq_take_bev(struct hreq *r)
{
    struct hconn *c = req_of(r)->c;
    if (c->state == C_DEAD)
        return NULL;
    struct bufferevent *bev = c->bev;
    atomic_fetch_add(&taken_conns, 1);
    bufferevent_setcb(bev, NULL, NULL, NULL, NULL);
    bufferevent_setwatermark(bev, EV_READ | EV_WRITE, 0, 0);
    c->bev = NULL;
    r->ended = true;
    /* the bufferevent keeps the socket and SSL: conn_close must not touch them */
    c->fd = -1;
    c->ssl = NULL;
    c->state = C_DEAD;
    req_closed(r, HREQ_END_TAKEN);
    conn_unlink(c);
    event_del(c->timer);
    event_del(c->kick);
    c->next_reap = c->s->reap;
    c->s->reap = c;
    event_active(c->s->reap_ev, EV_TIMEOUT, 1);
    return bev;
}

static void
on_bev_free(evutil_socket_t fd_, short what, void *arg)
{
    struct bufferevent *bev = arg;
    SSL *ssl = bufferevent_openssl_get_ssl(bev);
    int fd = bufferevent_getfd(bev);
    bufferevent_free(bev);
    if (ssl)
        SSL_free(ssl);
    if (fd >= 0)
        close(fd);
}

void
http_taken_hold(void)
{
    atomic_fetch_add(&taken_conns, 1);
}

void
http_taken_release(void)
{
    atomic_fetch_sub(&taken_conns, 1);
}

void
http_bev_free(struct bufferevent *bev)
{
    if (!bev)
        return;
    http_taken_release();
    /* The caller may be inside one of bev's callbacks, which may still use
     * the SSL when it returns: the socket and SSL go from the next loop turn. */
    bufferevent_setcb(bev, NULL, NULL, NULL, NULL);
    bufferevent_disable(bev, EV_READ | EV_WRITE);
    struct timeval zero = {0, 0};
    if (event_base_once(bufferevent_get_base(bev), -1, EV_TIMEOUT, on_bev_free, bev, &zero) != 0)
        on_bev_free(-1, 0, bev);
}
