/*
 * h1.c — HTTP/1.1 on libhttp-parser: the parser callbacks, the checks of a
 * complete head, the parse loop of a connection (h1_parse) and the Status
 * answer to a bad head (see http.h for the rules, conn.h for the room).
 *
 * Parsing: the input buffer is fed to http_parser_execute. The parser is
 * paused in on_headers_complete (it then stops before the head's final LF,
 * measured on libhttp-parser 2.9.4), the head is checked and handed to the
 * handler outside the parser, and parsing resumes with that LF. It is paused
 * again at on_message_complete: the next pipelined request waits until the
 * response has left the connection, which keeps responses in order and lets
 * a response stream leave with nothing but its own head queued. Body bytes go to the
 * handler while it reads (hreq_body_read), or are counted and dropped.
 * An Upgrade request (Connection: upgrade + an Upgrade other than h2c) is
 * parsed like any other up to the end of its body; the bytes behind it are
 * never parsed: they wait in the input until the handler takes the
 * connection (hreq_take_pipe, after the upstream switched protocols) or the
 * connection closes after the answer (an Upgrade or CONNECT request never
 * keeps its connection alive).
 *
 * The head (request line + headers) is bounded by
 * http_parser_set_max_header_size (process-wide: one server per process,
 * set by http_server_new).
 */
#include "conn.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <http_parser.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kwc/base.h"
#include "kwc/log.h"
#include "kwc/status.h"

#define MAX_HEADERS 1024 /* header lines per request (Go has no count limit; bytes bound it) */

/* ---- small helpers ---- */

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

/* ---- parser callbacks: only record; act after execute returns ---- */

static int
on_message_begin(http_parser *p)
{
    struct hconn *c = p->data;
    assert(!c->req);
    c->req = hreq_new(c);
    if (c->s->shutting_down)
        c->req->close_after = true; /* a new connection's first request, after the drain began */
    if (!c->head_byte) {
        /* a pipelined head, read before the previous response ended: its
         * first byte is in, so the idle timer becomes the head timer */
        c->head_byte = true;
        hconn_arm_timer(c);
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
        c->discard_overflow = true; /* h1_parse closes the connection */
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
    HSTAT_ADD(s->stats.bad_requests, 1);
    char *body = status_failure_json(code, status_reason_for_code(code), message, NULL);
    size_t bl = strlen(body);
    struct evbuffer *out = bufferevent_get_output(c->bev);
    evbuffer_add_printf(out,
                        "HTTP/1.1 %d %s\r\nCache-Control: no-cache, private\r\n"
                        "Content-Type: application/json\r\nDate: %s\r\nContent-Length: %zu\r\n"
                        "Connection: close\r\n\r\n",
                        code, hresp_reason(code), hresp_date(s), bl + 1);
    evbuffer_add(out, body, bl);
    evbuffer_add(out, "\n", 1);
    free(body);
    if (c->req) {
        hreq_closed(c->req, HREQ_END_CLOSED);
        hreq_free(c->req);
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
    c->served = true;
    event_del(c->timer);
    HSTAT_ADD(s->stats.requests, 1);
    HSTAT_ADD(s->h1_open, 1);
    r->dispatched = true;
    r->start_ns = http_now_ns();
    s->on_request(s->arg, r);
}

/*
 * Feed the input to the parser while the state allows. Returns with the
 * parser paused (a request in progress, or waiting for the handler to read)
 * or the input empty.
 */
void
h1_parse(struct hconn *c)
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
                HSTAT_ADD(c->s->stats.bad_requests, 1);
                hconn_close(c);
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
             * connection (hreq_take_pipe), or for nobody. */
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
                hreq_complete_fire(r);
                return;
            }
            continue;
        }
        evbuffer_drain(in, n);
        if (c->discard_overflow) {
            log_debug("http: closing: an unread request body passed %zu bytes",
                      c->s->o.max_discard_bytes);
            hconn_close(c);
            return;
        }
        if (c->msg_complete && c->req && !c->req->complete) {
            struct hreq *r = c->req;
            r->complete = true;
            hreq_complete_fire(r);
            return;
        }
        if (e == HPE_PAUSED && c->parse_paused_body)
            return;
    }
}

/* The response is over and has left: next request, or close. */

void
h1_settings(http_parser_settings *ps)
{
    *ps = (http_parser_settings){
        .on_message_begin = on_message_begin,
        .on_url = on_url,
        .on_header_field = on_header_field,
        .on_header_value = on_header_value,
        .on_headers_complete = on_headers_complete,
        .on_body = on_body,
        .on_message_complete = on_message_complete,
    };
}
