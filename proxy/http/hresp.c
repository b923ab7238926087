/*
 * hresp.c — the response writer (hresp_*, see http.h): the status line and
 * headers, Content-Length or chunked framing (close-delimited on HTTP/1.0),
 * the queue's low-water mark, and the end of a response, after which the
 * connection (http.c) finishes the request once the output has left. Also
 * the reason phrases and the Date value the room's other answers use.
 */
#include "conn.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* ---- small helpers ---- */

const char *
hresp_reason(int code)
{
    switch (code) {
    case 100:
        return "Continue";
    case 101:
        return "Switching Protocols";
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 202:
        return "Accepted";
    case 204:
        return "No Content";
    case 206:
        return "Partial Content";
    case 301:
        return "Moved Permanently";
    case 302:
        return "Found";
    case 304:
        return "Not Modified";
    case 307:
        return "Temporary Redirect";
    case 308:
        return "Permanent Redirect";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 406:
        return "Not Acceptable";
    case 409:
        return "Conflict";
    case 410:
        return "Gone";
    case 411:
        return "Length Required";
    case 412:
        return "Precondition Failed";
    case 413:
        return "Request Entity Too Large";
    case 414:
        return "Request URI Too Long";
    case 415:
        return "Unsupported Media Type";
    case 417:
        return "Expectation Failed";
    case 422:
        return "Unprocessable Entity";
    case 426:
        return "Upgrade Required";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return "";
    }
}

const char *
hresp_date(struct http_server *s)
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

/* ---- the response writer ---- */

void
hresp_header(struct hreq *r, const char *name, const char *value)
{
    hreq_of(r);
    assert(!r->started);
    if (r->h2) {
        h2_resp_header(r, name, value);
        return;
    }
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
    hreq_of(r)->close_after = true; /* HTTP/2: no-op (the connection is shared) */
}

void
hresp_goaway(struct hreq *r)
{
    if (hreq_of(r)->h2)
        h2_shutdown(r->c); /* a no-op once the connection is closing */
}

void
hresp_start(struct hreq *r, int status, int64_t content_length)
{
    struct hconn *c = hreq_of(r)->c;
    assert(!r->started);
    r->started = true;
    if (r->h2) {
        h2_resp_start(r, status, content_length);
        return;
    }
    if (c->state == C_DEAD)
        return;
    /* a request answered before its body was read: the rest of the body must
     * never be parsed as a request (unless it can be discarded in full) */
    if (r->has_body && !r->complete && !r->reading)
        r->close_after = true; /* said in the head: Connection: close */
    r->no_body =
        r->head_method || status == 204 || status == 304 || (status >= 100 && status < 200);
    bool streamed = content_length < 0 && !r->no_body;
    if (streamed && r->http10)
        r->close_after = true; /* close-delimited */
    r->streamed_chunked = streamed && !r->http10;
    bool keep = r->keepalive && !r->close_after;
    struct evbuffer *out = bufferevent_get_output(c->bev);
    size_t before = evbuffer_get_length(out);
    r->status = status;
    r->head_ns = http_now_ns();
    evbuffer_add_printf(out, "HTTP/1.%d %d %s\r\n", r->http10 ? 0 : 1, status,
                        hresp_reason(status));
    if (r->head_out) {
        evbuffer_add_buffer(out, r->head_out);
        evbuffer_free(r->head_out);
        r->head_out = NULL;
    }
    if (!r->has_date)
        evbuffer_add_printf(out, "Date: %s\r\n", hresp_date(c->s));
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
    struct hconn *c = hreq_of(r)->c;
    assert(r->started && !r->ended);
    if (r->h2) {
        h2_resp_write(r, p, n);
        return;
    }
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
    struct hconn *c = hreq_of(r)->c;
    size_t n = evbuffer_get_length(buf);
    if (r->h2) {
        h2_resp_write_buffer(r, buf);
        return;
    }
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

static void
on_block_sent(const void *data, size_t len, void *block)
{
    free(block);
}

void
hresp_write_block(struct hreq *r, void *block, char *p, size_t n)
{
    struct hconn *c = hreq_of(r)->c;
    assert(r->started && !r->ended);
    assert(p >= (char *)block + HRESP_BLOCK_BEFORE);
    if (r->h2) {
        h2_resp_write_block(r, block, p, n); /* referenced in its frames (h2data.c) */
        return;
    }
    if (c->state == C_DEAD || n == 0 || r->no_body) {
        free(block);
        return;
    }
    char *start = p;
    size_t len = n;
    if (r->streamed_chunked) {
        char head[HRESP_BLOCK_BEFORE + 1];
        int hl = snprintf(head, sizeof(head), "%zx\r\n", n);
        assert(hl > 0 && hl <= HRESP_BLOCK_BEFORE);
        start = p - hl;
        memcpy(start, head, (size_t)hl);
        memcpy(p + n, "\r\n", 2);
        len = n + (size_t)hl + 2;
    }
    if (c->ssl)
        hconn_tls_bulk(c, true);
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (evbuffer_add_reference(out, start, len, on_block_sent, block) != 0)
        abort(); /* out of memory */
    r->bytes += len;
}

size_t
hresp_queued(const struct hreq *r)
{
    struct hconn *c = hreq_of(r)->c;
    if (r->h2)
        return h2_resp_queued(r);
    if (c->state == C_DEAD)
        return 0;
    return evbuffer_get_length(bufferevent_get_output(c->bev));
}

void
hresp_low_water(struct hreq *r, size_t n)
{
    struct hconn *c = hreq_of(r)->c;
    r->low_water = n;
    if (c->state != C_DEAD && !r->ended && !r->h2)
        bufferevent_setwatermark(c->bev, EV_WRITE, n, 0);
}

void
hresp_end(struct hreq *r)
{
    struct hconn *c = hreq_of(r)->c;
    assert(r->started);
    if (r->ended)
        return;
    r->ended = true;
    if (r->h2) {
        h2_resp_end(r);
        return;
    }
    if (c->state == C_DEAD)
        return;
    if (r->streamed_chunked) {
        evbuffer_add(bufferevent_get_output(c->bev), "0\r\n\r\n", 5);
        r->bytes += 5;
    }
    if (!r->complete)
        r->close_after = true; /* the body was not read to its end */
    bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
    hconn_kick(c); /* finish once the output has left */
}

void
hresp_abort(struct hreq *r)
{
    struct hconn *c = hreq_of(r)->c;
    r->ended = true;
    if (r->h2)
        h2_resp_abort(r); /* RST_STREAM for this stream only */
    else if (c->state != C_DEAD)
        hconn_close(c);
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
