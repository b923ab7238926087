/*
 * h1client.c — kwc's HTTP/1.1 client framing (see h1client.h): the request
 * head and body written into the caller's buffer, the answer parsed with
 * libhttp-parser (HTTP_RESPONSE).
 */
#include "h1client.h"

#include <event2/buffer.h>
#include <http_parser.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kwc/base.h"
#include "kwc/gostr.h"

/* ---- the request ---- */

void
h1c_head_begin(struct evbuffer *out, const char *method, const char *target, const char *host,
               const char *port)
{
    bool v6 = strchr(host, ':') != NULL;
    evbuffer_add_printf(out, "%s %s HTTP/1.1\r\nHost: %s%s%s:%s\r\n", method, target, v6 ? "[" : "",
                        host, v6 ? "]" : "", port);
}

void
h1c_head_header(struct evbuffer *out, const char *name, const char *value)
{
    evbuffer_add_printf(out, "%s: %s\r\n", name, value);
}

void
h1c_head_line(struct evbuffer *out, const char *line)
{
    evbuffer_add_printf(out, "%s\r\n", line);
}

void
h1c_head_end(struct evbuffer *out)
{
    evbuffer_add(out, "\r\n", 2);
}

void
h1c_body_write(struct evbuffer *out, enum h1c_framing f, const void *p, size_t n)
{
    if (n == 0)
        return; /* chunked, an empty chunk would end the body */
    if (f == H1C_CHUNKED) {
        evbuffer_add_printf(out, "%zx\r\n", n);
        evbuffer_add(out, p, n);
        evbuffer_add(out, "\r\n", 2);
    } else {
        evbuffer_add(out, p, n);
    }
}

void
h1c_body_end(struct evbuffer *out, enum h1c_framing f)
{
    if (f == H1C_CHUNKED)
        evbuffer_add(out, "0\r\n\r\n", 5);
}

/* ---- the answer ---- */

struct h1c_resp {
    http_parser p;
    const struct h1c_resp_ops *ops;
    void *arg;
    bool head_method;
    bool switching;
    int status;
    int64_t body_len;
    size_t fed;            /* bytes consumed by every feed so far */
    size_t head_len;       /* a 101: where its head ended */
    struct gostr_buf hbuf; /* header names and values, NUL-terminated */
    size_t *hoff;          /* name offset, value offset per header */
    size_t nh, hcap;
    bool in_value;
};

static int
on_message_begin(http_parser *p)
{
    struct h1c_resp *r = p->data;
    r->nh = 0;
    r->in_value = false;
    r->hbuf.len = 0;
    return 0;
}

static int
on_header_field(http_parser *p, const char *at, size_t n)
{
    struct h1c_resp *r = p->data;
    if (r->nh == 0 || r->in_value) {
        if (r->nh)
            gostr_addn(&r->hbuf, "", 1); /* end the previous value */
        if (r->nh == H1C_MAX_HEADERS)
            return 1;
        if (r->nh == r->hcap) {
            r->hcap = r->hcap ? 2 * r->hcap : 32;
            r->hoff = xrealloc(r->hoff, 2 * r->hcap * sizeof(*r->hoff));
        }
        r->hoff[2 * r->nh] = r->hbuf.len;
        r->hoff[2 * r->nh + 1] = r->hbuf.len;
        r->nh++;
        r->in_value = false;
    }
    gostr_addn(&r->hbuf, at, n);
    return 0;
}

static int
on_header_value(http_parser *p, const char *at, size_t n)
{
    struct h1c_resp *r = p->data;
    if (!r->in_value) {
        gostr_addn(&r->hbuf, "", 1); /* end the name */
        r->hoff[2 * (r->nh - 1) + 1] = r->hbuf.len;
        r->in_value = true;
    }
    gostr_addn(&r->hbuf, at, n);
    return 0;
}

static int
on_headers_complete(http_parser *p)
{
    struct h1c_resp *r = p->data;
    if (r->nh) {
        if (!r->in_value) {
            gostr_addn(&r->hbuf, "", 1);
            r->hoff[2 * (r->nh - 1) + 1] = r->hbuf.len;
        }
        gostr_addn(&r->hbuf, "", 1);
    }
    r->status = p->status_code;
    if (r->status == 101) {
        r->switching = true;
        return 2; /* neither a body nor another response: the rest is the new protocol */
    }
    if (r->status >= 100 && r->status < 200)
        return 1;     /* the caller refuses it (h1c_resp_status) */
    r->body_len = -1; /* chunked or close-delimited */
    if (r->head_method || r->status == 204 || r->status == 304)
        r->body_len = 0;
    else if (!(p->flags & F_CHUNKED) && p->content_length != ULLONG_MAX &&
             p->content_length <= (uint64_t)INT64_MAX)
        r->body_len = (int64_t)p->content_length;
    r->ops->on_head(r->arg, r);
    return r->head_method ? 1 : 0;
}

static int
on_body(http_parser *p, const char *at, size_t n)
{
    struct h1c_resp *r = p->data;
    r->ops->on_body(r->arg, at, n);
    return 0;
}

static int
on_message_complete(http_parser *p)
{
    struct h1c_resp *r = p->data;
    if (!r->switching && r->status >= 200)
        r->ops->on_complete(r->arg);
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings settings = {
    .on_message_begin = on_message_begin,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

struct h1c_resp *
h1c_resp_new(bool head_method, const struct h1c_resp_ops *ops, void *arg)
{
    struct h1c_resp *r = xcalloc(1, sizeof(*r));
    http_parser_init(&r->p, HTTP_RESPONSE);
    r->p.data = r;
    r->ops = ops;
    r->arg = arg;
    r->head_method = head_method;
    r->body_len = -1;
    return r;
}

void
h1c_resp_free(struct h1c_resp *r)
{
    if (!r)
        return;
    free(r->hbuf.p);
    free(r->hoff);
    free(r);
}

size_t
h1c_resp_feed(struct h1c_resp *r, const char *p, size_t n)
{
    bool was_switching = r->switching;
    size_t used = http_parser_execute(&r->p, &settings, n ? p : NULL, n);
    r->fed += used;
    if (r->switching && !was_switching)
        r->head_len = r->fed;
    return used;
}

const char *
h1c_resp_error(const struct h1c_resp *r)
{
    enum http_errno e = HTTP_PARSER_ERRNO(&r->p);
    return e == HPE_OK || e == HPE_PAUSED ? NULL : http_errno_description(e);
}

int
h1c_resp_status(const struct h1c_resp *r)
{
    return r->status;
}

bool
h1c_resp_switching(const struct h1c_resp *r)
{
    return r->switching;
}

size_t
h1c_resp_head_len(const struct h1c_resp *r)
{
    return r->head_len;
}

int64_t
h1c_resp_body_length(const struct h1c_resp *r)
{
    return r->body_len;
}

size_t
h1c_resp_headers(const struct h1c_resp *r)
{
    return r->nh;
}

const char *
h1c_resp_header_name(const struct h1c_resp *r, size_t i)
{
    return r->hbuf.p + r->hoff[2 * i];
}

const char *
h1c_resp_header_value(const struct h1c_resp *r, size_t i)
{
    return r->hbuf.p + r->hoff[2 * i + 1];
}

const char *
h1c_resp_header(const struct h1c_resp *r, const char *name)
{
    for (size_t i = 0; i < r->nh; i++)
        if (strcasecmp(h1c_resp_header_name(r, i), name) == 0)
            return h1c_resp_header_value(r, i);
    return NULL;
}
