/*
 * h1client_test.c — proxy/upstream/h1client.c, kwc's HTTP/1.1 client
 * framing (private to proxy/upstream: h1client.h, included here as
 * tunnel.c includes it). No sockets: bytes go into and come out of buffers.
 *
 *  - the request head: its bytes exactly (request line, Host with an IPv6
 *    literal in brackets, headers and whole lines in the caller's order, the
 *    blank line);
 *  - the body: as is under Content-Length, one chunk per write when chunked
 *    (lowercase hex size), the last chunk at the end, nothing for an empty
 *    write;
 *  - the answer: status, headers, body pieces and completion, fed whole and
 *    one byte at a time, Content-Length / chunked / close-delimited / HEAD /
 *    204; nothing consumed after a complete answer;
 *  - a 101: the parse stops at the end of its head (head_len, also split),
 *    the bytes behind it not consumed, no on_head; another 1xx stops too;
 *  - malformed answers: a bad status line, a bad chunk size, too many
 *    headers, each an error with the parser's description.
 */
#include "../../proxy/upstream/h1client.h"

#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"
#include "tap.h"

/* the buffer's bytes as a NUL-terminated string (freed by the caller) */
static char *
drain(struct evbuffer *b)
{
    size_t n = evbuffer_get_length(b);
    char *s = xmalloc(n + 1);
    evbuffer_remove(b, s, n);
    s[n] = '\0';
    return s;
}

static void
test_head(void)
{
    struct evbuffer *b = evbuffer_new();
    h1c_head_begin(b, "GET", "/api/v1/namespaces/a/pods/p/exec?command=sh", "10.0.0.1", "6443");
    h1c_head_header(b, "Upgrade", "SPDY/3.1");
    h1c_head_header(b, "Connection", "Upgrade");
    h1c_head_line(b, "Authorization: Bearer tok");
    h1c_head_end(b);
    char *s = drain(b);
    is_str(s,
           "GET /api/v1/namespaces/a/pods/p/exec?command=sh HTTP/1.1\r\n"
           "Host: 10.0.0.1:6443\r\n"
           "Upgrade: SPDY/3.1\r\n"
           "Connection: Upgrade\r\n"
           "Authorization: Bearer tok\r\n"
           "\r\n",
           "the head's bytes, in the caller's order");
    free(s);

    h1c_head_begin(b, "POST", "/x", "::1", "443");
    h1c_head_end(b);
    s = drain(b);
    is_str(s, "POST /x HTTP/1.1\r\nHost: [::1]:443\r\n\r\n", "an IPv6 host in brackets");
    free(s);
    evbuffer_free(b);
}

static void
test_body(void)
{
    struct evbuffer *b = evbuffer_new();
    h1c_body_write(b, H1C_LENGTH, "hello", 5);
    h1c_body_write(b, H1C_LENGTH, "", 0);
    h1c_body_end(b, H1C_LENGTH);
    char *s = drain(b);
    is_str(s, "hello", "Content-Length: the bytes as they are, nothing at the end");
    free(s);

    char big[300];
    memset(big, 'z', sizeof(big));
    h1c_body_write(b, H1C_CHUNKED, "hello", 5);
    h1c_body_write(b, H1C_CHUNKED, "", 0);
    h1c_body_write(b, H1C_CHUNKED, big, sizeof(big));
    h1c_body_end(b, H1C_CHUNKED);
    s = drain(b);
    char want[400];
    snprintf(want, sizeof(want), "5\r\nhello\r\n12c\r\n%.300s\r\n0\r\n\r\n", big);
    is_str(s, want, "chunked: a chunk per write (lowercase hex), none for an empty one, the last");
    free(s);
    evbuffer_free(b);
}

/* ---- the answer ---- */

struct rec {
    int heads, completes, status;
    int64_t body_len;
    char hdrs[512];
    char body[512];
    size_t body_n;
    int pieces;
};

static void
on_head(void *arg, struct h1c_resp *r)
{
    struct rec *c = arg;
    c->heads++;
    c->status = h1c_resp_status(r);
    c->body_len = h1c_resp_body_length(r);
    size_t used = 0;
    for (size_t i = 0; i < h1c_resp_headers(r) && used < sizeof(c->hdrs); i++) {
        int w = snprintf(c->hdrs + used, sizeof(c->hdrs) - used, "%s=%s;",
                         h1c_resp_header_name(r, i), h1c_resp_header_value(r, i));
        used += w > 0 ? (size_t)w : 0;
    }
}

static void
on_body(void *arg, const char *p, size_t n)
{
    struct rec *c = arg;
    if (c->body_n + n < sizeof(c->body)) {
        memcpy(c->body + c->body_n, p, n);
        c->body_n += n;
    }
    c->pieces++;
}

static void
on_complete(void *arg)
{
    struct rec *c = arg;
    c->completes++;
}

static const struct h1c_resp_ops rec_ops = {
    .on_head = on_head,
    .on_body = on_body,
    .on_complete = on_complete,
};

/* Feed s whole (step 0) or step bytes at a time, as tunnel.c does: stop
 * where a feed consumes less than it was given; eof: then a close. Returns
 * the bytes consumed. */
static size_t
feed(struct h1c_resp *r, const char *s, size_t step, bool eof)
{
    size_t len = strlen(s), off = 0;
    while (off < len) {
        size_t n = step && step < len - off ? step : len - off;
        size_t used = h1c_resp_feed(r, s + off, n);
        off += used;
        if (used < n)
            return off;
    }
    if (eof)
        h1c_resp_feed(r, NULL, 0);
    return off;
}

static void
test_answer(void)
{
    const char *ans = "HTTP/1.1 403 Forbidden\r\n"
                      "Content-Type: application/json\r\n"
                      "X-Two:  spaced\r\n"
                      "Content-Length: 11\r\n"
                      "\r\n"
                      "{\"kind\":1}\n"
                      "HTTP/1.1 200 OK\r\n\r\n";
    size_t head_body = strlen(ans) - strlen("HTTP/1.1 200 OK\r\n\r\n");
    for (size_t step = 0; step <= 1; step++) {
        tap_group = step ? "answer, a byte at a time" : "answer, whole";
        struct rec c = {0};
        struct h1c_resp *r = h1c_resp_new(false, &rec_ops, &c);
        size_t used = feed(r, ans, step, false);
        is_int(c.heads, 1, "on_head once");
        is_int(c.status, 403, "its status");
        is_int(h1c_resp_status(r), 403, "h1c_resp_status");
        is_str(c.hdrs, "Content-Type=application/json;X-Two=spaced;Content-Length=11;",
               "the headers in order");
        is_str(h1c_resp_header(r, "content-type"), "application/json", "found by any case");
        ok(h1c_resp_header(r, "Upgrade") == NULL, "absent: NULL");
        is_int(c.body_len, 11, "the Content-Length");
        is_mem(c.body, c.body_n, "{\"kind\":1}\n", 11, "the body");
        is_int(c.completes, 1, "complete once");
        is_int(used, head_body, "nothing consumed after the answer");
        ok(!h1c_resp_switching(r), "not switching");
        ok(h1c_resp_error(r) == NULL, "no error");
        h1c_resp_free(r);
    }
    tap_group = "";
}

static void
test_chunked_and_close(void)
{
    const char *chunked = "HTTP/1.1 400 Bad Request\r\n"
                          "Transfer-Encoding: chunked\r\n"
                          "\r\n"
                          "3\r\nabc\r\n"
                          "a\r\n0123456789\r\n"
                          "0\r\n\r\n";
    for (size_t step = 0; step <= 1; step++) {
        struct rec c = {0};
        struct h1c_resp *r = h1c_resp_new(false, &rec_ops, &c);
        feed(r, chunked, step, false);
        is_int(c.body_len, -1, "chunked: length -1");
        is_mem(c.body, c.body_n, "abc0123456789", 13, "chunked: the body de-chunked");
        is_int(c.completes, 1, "chunked: complete at the last chunk");
        if (!step)
            is_int(c.pieces, 2, "chunked, whole: a piece per chunk");
        ok(h1c_resp_error(r) == NULL, "chunked: no error");
        h1c_resp_free(r);
    }

    struct rec c = {0};
    struct h1c_resp *r = h1c_resp_new(false, &rec_ops, &c);
    feed(r, "HTTP/1.1 500 Oops\r\n\r\nuntil the end", 0, false);
    is_int(c.body_len, -1, "close-delimited: length -1");
    is_int(c.completes, 0, "close-delimited: not complete before the close");
    h1c_resp_feed(r, NULL, 0);
    is_int(c.completes, 1, "close-delimited: complete at the close");
    is_mem(c.body, c.body_n, "until the end", 13, "close-delimited: the body");
    h1c_resp_free(r);

    memset(&c, 0, sizeof(c));
    r = h1c_resp_new(true, &rec_ops, &c);
    feed(r, "HTTP/1.1 403 Forbidden\r\nContent-Length: 42\r\n\r\n", 0, false);
    is_int(c.body_len, 0, "HEAD: length 0");
    is_int(c.completes, 1, "HEAD: complete at the head (no body despite Content-Length)");
    h1c_resp_free(r);

    memset(&c, 0, sizeof(c));
    r = h1c_resp_new(false, &rec_ops, &c);
    feed(r, "HTTP/1.1 204 No Content\r\n\r\n", 0, false);
    is_int(c.body_len, 0, "204: length 0");
    is_int(c.completes, 1, "204: complete at the head");
    h1c_resp_free(r);
}

static void
test_switching(void)
{
    const char *head = "HTTP/1.1 101 Switching Protocols\r\n"
                       "Upgrade: SPDY/3.1\r\n"
                       "Connection: Upgrade\r\n"
                       "\r\n";
    char all[256];
    snprintf(all, sizeof(all), "%s%s", head, "\x80\x03\x00\x01 new protocol");
    for (size_t step = 0; step <= 7; step += 7) {
        struct rec c = {0};
        struct h1c_resp *r = h1c_resp_new(false, &rec_ops, &c);
        size_t used = feed(r, all, step, false);
        ok(h1c_resp_switching(r), "101: switching");
        is_int(h1c_resp_head_len(r), strlen(head), "101: the head's length");
        is_int(used, strlen(head), "101: nothing behind the head consumed");
        is_int(h1c_resp_status(r), 101, "101: its status");
        is_str(h1c_resp_header(r, "Upgrade"), "SPDY/3.1", "101: its headers readable");
        is_int(c.heads + c.completes + c.pieces, 0, "101: no on_head, on_body, on_complete");
        ok(h1c_resp_error(r) == NULL, "101: no error");
        is_int(h1c_resp_feed(r, all + used, strlen(all) - used), 0, "101: a later feed takes none");
        h1c_resp_free(r);
    }

    struct rec c = {0};
    struct h1c_resp *r = h1c_resp_new(false, &rec_ops, &c);
    feed(r, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", 0, false);
    is_int(h1c_resp_status(r), 100, "another 1xx: the parse stops at it");
    ok(!h1c_resp_switching(r), "another 1xx: not switching");
    is_int(c.heads + c.completes, 0, "another 1xx: no on_head, no on_complete");
    h1c_resp_free(r);
}

static void
test_malformed(void)
{
    struct rec c = {0};
    struct h1c_resp *r = h1c_resp_new(false, &rec_ops, &c);
    feed(r, "HTTP/1.1 2x0 OK\r\n\r\n", 0, false);
    ok(h1c_resp_error(r) != NULL, "a bad status line: an error");
    is_int(c.heads, 0, "...no head");
    h1c_resp_free(r);

    memset(&c, 0, sizeof(c));
    r = h1c_resp_new(false, &rec_ops, &c);
    feed(r, "HTTP/1.1 400 Bad\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 0, false);
    const char *e = h1c_resp_error(r);
    ok(e != NULL, "a bad chunk size: an error");
    is_str(e, "invalid character in chunk size header", "...the parser's description");
    is_int(c.completes, 0, "...not complete");
    h1c_resp_free(r);

    memset(&c, 0, sizeof(c));
    r = h1c_resp_new(false, &rec_ops, &c);
    h1c_resp_feed(r, "HTTP/1.1 200 OK\r\n", 17);
    for (int i = 0; i <= H1C_MAX_HEADERS && !h1c_resp_error(r); i++)
        h1c_resp_feed(r, "X-A: b\r\n", 8);
    ok(h1c_resp_error(r) != NULL, "more than H1C_MAX_HEADERS headers: an error");
    is_int(c.heads, 0, "...no head");
    h1c_resp_free(r);

    memset(&c, 0, sizeof(c));
    r = h1c_resp_new(false, &rec_ops, &c);
    h1c_resp_feed(r, "HTTP/1.1 200 OK\r\n", 17);
    for (int i = 0; i < H1C_MAX_HEADERS; i++)
        h1c_resp_feed(r, "X-A: b\r\n", 8);
    h1c_resp_feed(r, "\r\n", 2);
    ok(h1c_resp_error(r) == NULL, "exactly H1C_MAX_HEADERS headers: fine");
    is_int(c.heads, 1, "...a head");
    h1c_resp_free(r);

    memset(&c, 0, sizeof(c));
    r = h1c_resp_new(false, &rec_ops, &c);
    feed(r, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", 0, true);
    ok(h1c_resp_error(r) != NULL, "a close before the Content-Length: an error");
    is_int(c.completes, 0, "...not complete");
    h1c_resp_free(r);
}

int
main(void)
{
    TAP_RUN(test_head);
    TAP_RUN(test_body);
    TAP_RUN(test_answer);
    TAP_RUN(test_chunked_and_close);
    TAP_RUN(test_switching);
    TAP_RUN(test_malformed);
    return tap_done();
}
