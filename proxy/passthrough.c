/*
 * passthrough.c — client request <-> up_xfer (see passthrough.h).
 *
 * Flow control, both directions, with bounded memory:
 *  - request body: evhtp's on_read hook appends to pt->body; past
 *    max_request_buffer we stop reading the client socket; curl's read
 *    callback drains pt->body and re-enables reading below half of it.
 *  - response body: before taking bytes from curl we look at the client
 *    socket's output buffer (libevhtp has no backpressure, TRAPS.md); over
 *    max_response_buffer the transfer pauses, and an evbuffer callback on that
 *    output buffer resumes it (from a deferred event) once it drains below a
 *    quarter.
 * Lifetime: pt lives exactly as long as the evhtp request; the request_fini
 * hook cancels the transfer and frees pt. Nothing is freed inside curl's or
 * evhtp's callback chain except through those hooks.
 */
#include "kwc/passthrough.h"

#include <assert.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kwc/base.h"
#include "kwc/log.h"
#include "kwc/respond.h"
#include "kwc/upstream.h"

#define PT_MAGIC 0x70743031u /* "pt01" */
#define PT_MAX_HEADERS 128

struct pt {
    uint32_t magic;
    evhtp_request_t *req;
    struct up_xfer *x;
    const struct pt_options *o;
    struct evbuffer *body;        /* request body not yet taken by curl */
    struct evbuffer *out;         /* client socket output (borrowed from the bev) */
    struct evbuffer_cb_entry *out_cb;
    struct event *kick;           /* deferred resume of the transfer */
    bool body_done;               /* client finished sending the request */
    bool client_paused;           /* we disabled reading from the client */
    bool want_recv, want_send;    /* what kick should resume */
    bool started, chunked, finished;
    char method[16];
    uint64_t bytes_out;
};

static struct pt *
pt_of(void *arg)
{
    struct pt *p = arg;
    assert(p && p->magic == PT_MAGIC);
    return p;
}

static struct bufferevent *
client_bev(struct pt *p)
{
    return evhtp_connection_get_bev(evhtp_request_get_connection(p->req));
}

static void
kick_soon(struct pt *p)
{
    event_active(p->kick, EV_TIMEOUT, 1);
}

static void
on_kick(evutil_socket_t fd, short what, void *arg)
{
    struct pt *p = pt_of(arg);
    if (!p->x)
        return;
    if (p->want_send) {
        p->want_send = false;
        up_xfer_resume_send(p->x);
    }
    /* resume_send may have finished the transfer */
    if (p->x && p->want_recv) {
        p->want_recv = false;
        up_xfer_resume_recv(p->x);
    }
}

/* The client's output buffer changed: resume the upstream once it has drained. */
static void
on_out_drain(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    struct pt *p = pt_of(arg);
    if (info->n_deleted && p->x && evbuffer_get_length(buf) <= p->o->max_response_buffer / 4) {
        p->want_recv = true;
        kick_soon(p);
    }
}

/* ---- upstream callbacks ---- */

static bool
hop_by_hop(const char *name)
{
    static const char *const hop[] = {"Connection", "Keep-Alive", "Proxy-Connection",
                                      "Proxy-Authenticate", "Proxy-Authorization", "Te",
                                      "Trailer", "Transfer-Encoding", "Upgrade"};
    for (size_t i = 0; i < KWC_ARRAY_LEN(hop); i++)
        if (strcasecmp(name, hop[i]) == 0)
            return true;
    return false;
}

static int
on_up_headers(void *arg, int status, const struct up_header *h, size_t n)
{
    struct pt *p = pt_of(arg);
    const char *clen = NULL;
    for (size_t i = 0; i < n; i++) {
        if (hop_by_hop(h[i].name))
            continue;
        if (strcasecmp(h[i].name, "Content-Length") == 0) {
            clen = h[i].value;
            continue;
        }
        respond_header(p->req, h[i].name, h[i].value);
    }
    p->started = true;
    if (clen) {
        respond_header(p->req, "Content-Length", clen);
        evhtp_send_reply_start(p->req, (evhtp_res)status);
    } else if (p->req->proto == EVHTP_PROTO_11) {
        p->chunked = true;
        evhtp_send_reply_chunk_start(p->req, (evhtp_res)status);
        /* chunk_start decides against chunking for 1xx/204/304/HEAD */
        p->chunked = (p->req->flags & EVHTP_REQ_FLAG_CHUNKED) != 0;
    } else {
        /* HTTP/1.0 has no chunked coding: the body ends when we close. */
        respond_no_keepalive(p->req);
        evhtp_send_reply_start(p->req, (evhtp_res)status);
    }
    log_debug("passthrough: %s %s -> %d", p->method, p->req->uri->path->full, status);
    return 0;
}

static int
on_up_data(void *arg, const char *data, size_t n)
{
    struct pt *p = pt_of(arg);
    if (evbuffer_get_length(p->out) > p->o->max_response_buffer)
        return UP_PAUSE; /* resumed by on_out_drain */
    if (p->chunked) {
        evbuffer_add_printf(p->out, "%zx\r\n", n);
        evbuffer_add(p->out, data, n);
        evbuffer_add(p->out, "\r\n", 2);
    } else {
        evbuffer_add(p->out, data, n);
    }
    p->bytes_out += n;
    return 0;
}

static ssize_t
on_up_body(void *arg, char *buf, size_t cap)
{
    struct pt *p = pt_of(arg);
    int n = evbuffer_remove(p->body, buf, cap);
    if (n > 0) {
        if (p->client_paused && evbuffer_get_length(p->body) < p->o->max_request_buffer / 2) {
            p->client_paused = false;
            struct bufferevent *bev = client_bev(p);
            if (bev)
                bufferevent_enable(bev, EV_READ);
        }
        return n;
    }
    return p->body_done ? 0 : UP_BODY_PAUSE;
}

static void
on_up_done(void *arg, int err, const char *msg)
{
    struct pt *p = pt_of(arg);
    p->x = NULL;
    p->finished = true;
    if (!p->body_done)
        respond_no_keepalive(p->req); /* unread body bytes must not be parsed as a request */
    if (!p->started) {
        int code;
        const char *reason;
        char m[512];
        if (err == -ETIMEDOUT) {
            code = 504;
            reason = "Timeout";
            snprintf(m, sizeof(m), "the upstream API server did not answer in time: %s", msg);
        } else if (err == -ECONNREFUSED || err == -EHOSTUNREACH || err == -ECONNRESET) {
            code = 503;
            reason = "ServiceUnavailable";
            snprintf(m, sizeof(m), "the upstream API server is unavailable: %s", msg);
        } else {
            code = 502;
            reason = "";
            snprintf(m, sizeof(m), "error talking to the upstream API server: %s", msg);
        }
        log_warnx("passthrough: %s %s: %s (answered %d)", p->method, p->req->uri->path->full, msg,
                  code);
        respond_status(p->req, code, reason, m, code == 503 ? 1 : 0);
        return;
    }
    if (err)
        log_warnx("passthrough: %s %s: upstream failed mid-response after %llu bytes: %s",
                  p->method, p->req->uri->path->full, (unsigned long long)p->bytes_out, msg);
    respond_end_stream(p->req, p->chunked, err == 0);
}

static const struct up_xfer_cbs pt_cbs = {
    .on_headers = on_up_headers,
    .on_data = on_up_data,
    .on_body = on_up_body,
    .on_done = on_up_done,
};

/* ---- client-side hooks ---- */

static evhtp_res
on_client_body(evhtp_request_t *req, struct evbuffer *buf, void *arg)
{
    struct pt *p = pt_of(arg);
    evbuffer_add_buffer(p->body, buf); /* drained: evhtp keeps no copy */
    if (p->x) {
        p->want_send = true;
        kick_soon(p);
    }
    if (!p->client_paused && evbuffer_get_length(p->body) > p->o->max_request_buffer) {
        p->client_paused = true;
        struct bufferevent *bev = client_bev(p);
        if (bev)
            bufferevent_disable(bev, EV_READ);
    }
    return EVHTP_RES_OK;
}

/* The whole request has been read (evhtp's request callback). */
static void
on_client_complete(evhtp_request_t *req, void *arg)
{
    struct pt *p = pt_of(arg);
    p->body_done = true;
    if (p->x) {
        p->want_send = true;
        kick_soon(p);
    }
}

static evhtp_res
on_request_fini(evhtp_request_t *req, void *arg)
{
    struct pt *p = pt_of(arg);
    up_xfer_cancel(p->x);
    p->x = NULL;
    if (p->out_cb)
        evbuffer_remove_cb_entry(p->out, p->out_cb);
    event_free(p->kick);
    evbuffer_free(p->body);
    p->magic = 0;
    free(p);
    return EVHTP_RES_OK;
}

/* ---- request head -> upstream request ---- */

struct hdr_collect {
    struct up_header h[PT_MAX_HEADERS];
    size_t n;
    bool strip_credentials;
    const char *connection; /* the client's Connection header: tokens name more hop-by-hop headers */
    const char *xff;
};

static bool
named_in_connection(const char *conn, const char *name)
{
    if (!conn)
        return false;
    size_t nl = strlen(name);
    for (const char *s = conn; *s;) {
        while (*s == ' ' || *s == ',' || *s == '\t')
            s++;
        size_t l = strcspn(s, " ,\t");
        if (l == nl && strncasecmp(s, name, nl) == 0)
            return true;
        s += l;
    }
    return false;
}

static int
collect_header(evhtp_kv_t *kv, void *arg)
{
    struct hdr_collect *hc = arg;
    const char *k = kv->key;
    if (hop_by_hop(k) || strcasecmp(k, "Host") == 0 || strcasecmp(k, "Content-Length") == 0 ||
        strcasecmp(k, "Expect") == 0 || named_in_connection(hc->connection, k))
        return 0;
    if (strcasecmp(k, "X-Forwarded-For") == 0) {
        hc->xff = kv->val;
        return 0;
    }
    if (hc->strip_credentials &&
        (strcasecmp(k, "Authorization") == 0 || strncasecmp(k, "Impersonate-", 12) == 0))
        return 0;
    if (hc->n < PT_MAX_HEADERS - 1) { /* one slot kept for X-Forwarded-For */
        hc->h[hc->n].name = k;
        hc->h[hc->n].value = kv->val;
        hc->n++;
    }
    return 0;
}

static void
client_addr(evhtp_request_t *req, char *out, size_t len)
{
    evhtp_connection_t *c = evhtp_request_get_connection(req);
    out[0] = '\0';
    if (!c || !c->saddr)
        return;
    if (c->saddr->sa_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)c->saddr)->sin_addr, out, (socklen_t)len);
    else if (c->saddr->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)c->saddr)->sin6_addr, out, (socklen_t)len);
}

static void
pt_start(evhtp_request_t *req, struct up_client *up, const struct pt_options *o, bool read)
{
    struct pt *p = xcalloc(1, sizeof(*p));
    p->magic = PT_MAGIC;
    p->req = req;
    p->body_done = read;
    p->o = o;
    p->body = evbuffer_new();
    struct bufferevent *bev = client_bev(p);
    p->out = bufferevent_get_output(bev);
    p->kick = event_new(bufferevent_get_base(bev), -1, 0, on_kick, p);
    snprintf(p->method, sizeof(p->method), "%s", htparser_get_methodstr_m(req->method));

    evhtp_request_set_hook(req, evhtp_hook_on_read, (evhtp_hook)on_client_body, p);
    evhtp_request_set_hook(req, evhtp_hook_on_request_fini, (evhtp_hook)on_request_fini, p);
    req->cb = on_client_complete;
    req->cbarg = p;

    struct hdr_collect hc = {.strip_credentials = o->strip_credentials,
                             .connection = evhtp_header_find(req->headers_in, "Connection")};
    evhtp_headers_for_each(req->headers_in, collect_header, &hc);
    char addr[64], xff[512];
    client_addr(req, addr, sizeof(addr));
    if (addr[0]) {
        if (hc.xff)
            snprintf(xff, sizeof(xff), "%s, %s", hc.xff, addr);
        else
            snprintf(xff, sizeof(xff), "%s", addr);
        hc.h[hc.n].name = "X-Forwarded-For";
        hc.h[hc.n].value = xff;
        hc.n++;
    }

    const char *cl = evhtp_header_find(req->headers_in, "Content-Length");
    const char *te = evhtp_header_find(req->headers_in, "Transfer-Encoding");
    struct up_request r = {
        .method = p->method,
        .headers = hc.h,
        .nheaders = hc.n,
        .has_body = !read && (cl != NULL || (te && strcasestr(te, "chunked"))),
        .body_len = cl && !read ? strtoll(cl, NULL, 10) : -1,
        .long_running = o->long_running,
    };
    const char *path = req->uri->path->full;
    const char *q = (const char *)req->uri->query_raw;
    char *target = q && *q ? xasprintf("%s?%s", path, q) : xstrdup(path);
    r.target = target;
    int rc = up_xfer_start(up, &r, &pt_cbs, p, &p->x);
    free(target);
    if (rc != 0) {
        p->x = NULL;
        respond_status(req, 502, "", "kwc could not start the upstream request", 0);
        return;
    }
    p->out_cb = evbuffer_add_cb(p->out, on_out_drain, p);
}

void
pt_forward(evhtp_request_t *req, struct up_client *up, const struct pt_options *o)
{
    pt_start(req, up, o, false);
}

void
pt_forward_read(evhtp_request_t *req, struct up_client *up, const struct pt_options *o)
{
    pt_start(req, up, o, true);
}
