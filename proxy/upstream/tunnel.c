/*
 * tunnel.c — HTTP Upgrade passthrough (see tunnel.h).
 *
 * kwc opens its own connection to the upstream, writes the request head
 * (with kwc's credentials and the caller's identity headers) and the
 * request's body, and reads the upstream's answer head (h1client.h's parser)
 * while the HTTP server still holds the client's connection
 * (struct hreq): whatever the client sent behind the request stays unread in
 * the server's input buffer. Then:
 *  - 101 Switching Protocols: the client's connection becomes a byte pipe
 *    (hreq_take_pipe: the HTTP room keeps its socket and TLS state), kwc
 *    writes the upstream's 101 head byte for byte and whatever followed it,
 *    and from then on only copies bytes; only now do the client's bytes
 *    behind the request reach the upstream. Each direction stops reading when
 *    the other side's output holds TUN_HIGH bytes and resumes when it drains
 *    below TUN_LOW (the pipe's low water, the upstream bufferevent's write
 *    watermark), so memory stays bounded.
 *  - any other answer: relayed as an ordinary response through the response
 *    writer (status, end-to-end headers, the body decoded by the parser and
 *    framed by kwc, streamed with backpressure: hresp_queued / on_drain), and
 *    the connection closes after it (h1.c never reuses an Upgrade request's
 *    connection), as kube's upgrade-aware proxy does after a refused upgrade
 *    (k8s.io/apimachinery/pkg/util/proxy/upgradeaware.go tryUpgrade). So a
 *    request pipelined behind a refused upgrade is never read by anybody:
 *    nothing reaches the upstream without kwc's authentication,
 *    authorization, identity headers, header stripping and access log.
 *    (Unlike upgradeaware.go, which answers a generic error for a 2xx/3xx
 *    refusal from its kubelet backend, kwc relays it: its upstream is the
 *    apiserver, whose answer is what the client would get without kwc.)
 *  - the upstream unreachable or timing out: 503 Status (Retry-After 1); a
 *    TLS failure, a 1xx other than 101, a malformed or oversized head (over
 *    TUN_HEAD_MAX), or the upstream closing before its head: 502 Status;
 *    both through respond_status, connection closed.
 *
 * kwc is an HTTP/1.1 client of the upstream here: the framing (the request
 * head's bytes, the body's chunks, parsing the answer) is h1client.c's; this
 * file decides what goes into the head and what an answer means. The
 * connection itself (socket, TLS, DNS) is the uplink's (uplink_connect); its
 * socket counts against --max-connections with the client's
 * (hreq_count_socket).
 *
 * Decisions (kube-apiserver's behaviour on the wire):
 *  - Upgrade: h2c is never tunnelled: kube-apiserver runs Go's net/http
 *    server without an h2c handler, which serves such a request as an
 *    ordinary one. h1.c does the same (hreq_upgrade is false), so it goes
 *    through the cache or the passthrough, which drops the hop-by-hop
 *    Upgrade header and HTTP2-Settings (named by the request's Connection
 *    header, as h2c requires). An Upgrade listing h2c among other
 *    protocols is tunnelled with h2c left out; a 101 must name a protocol the
 *    client asked for (as Go's httputil.ReverseProxy checks), never h2c.
 *  - CONNECT is never an upgrade (h1.c) and never tunnelled or forwarded:
 *    kube-apiserver has no CONNECT route (its exec/attach/portforward/proxy
 *    "connect" subresources are GET/POST upgrades) and answers 405 from
 *    go-restful; front.c answers 405 MethodNotAllowed after authentication,
 *    and an authority-form CONNECT target is a 400 like any target not in
 *    origin form. The connection closes after either.
 *  - absolute-form targets ("GET http://host/api/... HTTP/1.1"): front.c's
 *    parse stage answers 400 for any target not starting with '/', before
 *    the tunnel; tunnel_start refuses one too (400), so the upstream only
 *    ever gets an origin-form target.
 *  - a body on the upgrade request: forwarded exactly, as Go's net/http
 *    (the request's body reader stops at its Content-Length or last chunk)
 *    and upgradeaware.go (dial: req.Write(conn) writes head and body) do; a
 *    chunked body is re-chunked, trailers dropped, Expect dropped (kwc
 *    answered 100-continue itself). Bytes after the body are never
 *    forwarded before the 101; a 101 that arrives before the body was all
 *    sent is a 502.
 */
#include "kwc/tunnel.h"

#include <assert.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kwc/base.h"
#include "kwc/http.h"
#include "kwc/kubeconfig.h"
#include "kwc/log.h"
#include "kwc/respond.h"
#include "kwc/uplink.h"

#include "h1client.h"

#define TUN_MAGIC 0x74756e31u /* "tun1" */
#define TUN_HIGH (1024 * 1024)
#define TUN_LOW (256 * 1024)
#define TUN_HEAD_MAX (1024 * 1024) /* the upstream's answer head, bytes */
#define TUN_PARSE_CHUNK (64 * 1024)

enum tun_phase {
    TUN_HEAD,   /* connecting, sending the request, reading the answer head; the server holds
                   the client's connection (req) */
    TUN_ANSWER, /* relaying a refusal through req's response writer */
    TUN_RELAY,  /* after a 101: the client's connection a pipe, raw bytes both ways */
    TUN_DONE,   /* answered (an error, or the refusal's end); waiting for req's on_close */
};

struct tunnel {
    uint32_t magic;
    enum tun_phase phase;
    bool dead;              /* freed from the next loop turn (reap) */
    struct hreq *req;       /* until its on_close (answered, taken, or the client gone) */
    bool taking;            /* inside hreq_take_pipe: its on_close is expected */
    struct hpipe *client;   /* TUN_RELAY only */
    struct bufferevent *up; /* kwc's own connection to the upstream (uplink_connect) */
    struct event *connect_timer, *reap;
    const char *connect_err; /* a failure to start connecting, reported from the loop */
    bool connected;
    bool client_eof, up_eof;
    /* the request's body, forwarded behind its head */
    bool has_body, body_done, body_paused;
    enum h1c_framing body_framing;
    /* the upstream's answer */
    struct h1c_resp *resp;
    size_t parsed;   /* bytes of the upstream's input already parsed (TUN_HEAD keeps them) */
    char asked[256]; /* the protocols the client asked for (h2c left out) */
    char desc[160];  /* "GET /api/v1/.../exec" for logs */
    struct uplink *link;
    uint64_t cred_gen; /* the exec credential sent (uplink_cred_get), 0: none */
};

static struct tunnel *
tun_of(void *arg)
{
    struct tunnel *t = arg;
    assert(t->magic == TUN_MAGIC);
    return t;
}

/* ---- closing ---- */

static void
on_reap(evutil_socket_t fd, short what, void *arg)
{
    struct tunnel *t = tun_of(arg);
    log_debug("tunnel: %s closed", t->desc);
    if (t->connect_timer)
        event_free(t->connect_timer);
    if (t->up)
        bufferevent_free(t->up);
    h1c_resp_free(t->resp);
    event_free(t->reap);
    t->magic = 0;
    free(t);
}

/* Unhook t from everything that can call it and free it from the next loop
 * turn (never inside the callback chain that decided it). */
static void
tunnel_close(struct tunnel *t)
{
    if (t->dead)
        return;
    t->dead = true;
    if (t->connect_timer)
        evtimer_del(t->connect_timer);
    if (t->up) {
        bufferevent_setcb(t->up, NULL, NULL, NULL, NULL);
        bufferevent_disable(t->up, EV_READ | EV_WRITE);
    }
    /* the pipe's descriptors (the client's and the upstream's) are
     * released now, the socket closed from the next turn */
    hpipe_free(t->client);
    t->client = NULL;
    if (t->req) {
        struct hreq *r = t->req;
        t->req = NULL;
        hreq_set_handler(r, NULL, NULL);
        if (!hresp_started(r))
            respond_status(r, 500, NULL, "the tunnel ended before answering", 0);
        else
            hresp_abort(r);
    }
    event_active(t->reap, EV_TIMEOUT, 1);
}

/* The upstream connection is no longer needed. */
static void
drop_up(struct tunnel *t)
{
    if (t->up) {
        bufferevent_free(t->up); /* still counted until req closes (hreq_count_socket) */
        t->up = NULL;
    }
    if (t->connect_timer)
        evtimer_del(t->connect_timer);
}

/* Answer the client with a Status (or cut a started answer short); the
 * connection closes after it, then req's on_close frees t. */
static void
fail(struct tunnel *t, int code, const char *reason, const char *msg)
{
    char cause[64];
    snprintf(cause, sizeof(cause), "tunnel failed (answered %d)", code);
    log_repeat(LOG_WARN, cause, "tunnels", t->desc, "tunnel: %s: %s (answered %d)", t->desc, msg,
               code);
    drop_up(t);
    t->phase = TUN_DONE;
    struct hreq *r = t->req;
    if (!r) {
        tunnel_close(t);
        return;
    }
    if (hresp_started(r)) {
        hresp_abort(r); /* on_close: t is closed */
        return;
    }
    hresp_close_after(r);
    respond_status(r, code, reason, msg, code == 503 ? 1 : 0);
}

static void
fail_unavailable(struct tunnel *t, const char *why)
{
    char m[512];
    snprintf(m, sizeof(m), "the upstream API server is unavailable: %s", why);
    fail(t, 503, "ServiceUnavailable", m);
}

static void
fail_bad_gateway(struct tunnel *t, const char *why)
{
    char m[512];
    snprintf(m, sizeof(m), "error talking to the upstream API server: %s", why);
    fail(t, 502, NULL, m);
}

/* ---- relay (after a 101) ---- */

static void
maybe_finish(struct tunnel *t)
{
    /* Done when the upstream ended and the client has everything, or when the
     * client ended and the upstream has everything (half-close towards the
     * upstream is not portable through TLS: end both). */
    bool client_drained = hpipe_queued(t->client) == 0;
    bool up_drained = evbuffer_get_length(bufferevent_get_output(t->up)) == 0;
    if ((t->up_eof && client_drained) || (t->client_eof && up_drained))
        tunnel_close(t);
}

/* client -> upstream */
static void
on_client_read(void *arg)
{
    struct tunnel *t = tun_of(arg);
    struct evbuffer *out = bufferevent_get_output(t->up);
    evbuffer_add_buffer(out, hpipe_input(t->client));
    if (evbuffer_get_length(out) >= TUN_HIGH) {
        hpipe_read(t->client, false);
        bufferevent_setwatermark(t->up, EV_WRITE, TUN_LOW, 0);
    }
}

/* upstream -> client */
static void
on_relay_read(struct bufferevent *bev, void *arg)
{
    struct tunnel *t = tun_of(arg);
    hpipe_write_buffer(t->client, bufferevent_get_input(bev));
    if (hpipe_queued(t->client) >= TUN_HIGH) {
        bufferevent_disable(bev, EV_READ);
        hpipe_low_water(t->client, TUN_LOW);
    }
}

/* The client's queue drained to its low water: the upstream may be read again. */
static void
on_client_drain(void *arg)
{
    struct tunnel *t = tun_of(arg);
    if (!t->up_eof)
        bufferevent_enable(t->up, EV_READ);
    if (t->client_eof || t->up_eof)
        maybe_finish(t);
}

/* The upstream's queue drained below its watermark: the client may be read again. */
static void
on_relay_write(struct bufferevent *bev, void *arg)
{
    struct tunnel *t = tun_of(arg);
    if (!t->client_eof)
        hpipe_read(t->client, true);
    if (t->client_eof || t->up_eof)
        maybe_finish(t);
}

static void
on_client_eof(void *arg)
{
    struct tunnel *t = tun_of(arg);
    t->client_eof = true;
    maybe_finish(t);
}

static void
on_client_error(void *arg)
{
    struct tunnel *t = tun_of(arg);
    t->client_eof = true;
    tunnel_close(t);
}

static void
on_relay_event(struct bufferevent *bev, short what, void *arg)
{
    struct tunnel *t = tun_of(arg);
    if (!(what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)))
        return;
    t->up_eof = true;
    /* Whatever the upstream sent before closing still goes to the client. */
    struct evbuffer *in = bufferevent_get_input(t->up);
    if (evbuffer_get_length(in))
        hpipe_write_buffer(t->client, in);
    hpipe_low_water(t->client, 0);
    bufferevent_disable(bev, EV_READ);
    if (what & BEV_EVENT_ERROR)
        tunnel_close(t);
    else
        maybe_finish(t);
}

static const struct hpipe_ops client_ops = {
    .on_read = on_client_read,
    .on_drain = on_client_drain,
    .on_eof = on_client_eof,
    .on_error = on_client_error,
};

/* The upstream answered 101 with a head of head_len bytes at the start of
 * its input: the connection becomes a tunnel. */
static void
switch_protocols(struct tunnel *t, size_t head_len)
{
    if (t->has_body && !t->body_done) {
        fail_bad_gateway(t, "it switched protocols before the request body was sent");
        return;
    }
    t->taking = true;
    struct hpipe *c = hreq_take_pipe(t->req, &client_ops, t);
    t->taking = false;
    t->req = NULL;
    if (!c) {
        tunnel_close(t); /* the client is gone */
        return;
    }
    t->client = c;
    t->phase = TUN_RELAY;
    log_debug("tunnel: %s: switched protocols", t->desc);
    struct evbuffer *in = bufferevent_get_input(t->up);
    struct evbuffer *head = evbuffer_new();
    evbuffer_remove_buffer(in, head, head_len);
    hpipe_write_buffer(c, head);
    evbuffer_free(head);
    bufferevent_setcb(t->up, on_relay_read, on_relay_write, on_relay_event, t);
    bufferevent_setwatermark(t->up, EV_WRITE, 0, 0);
    bufferevent_enable(t->up, EV_READ | EV_WRITE);
    /* Bytes already in the upstream's input: no read event will announce
     * them (the client's, behind its request, come with the pipe's on_read). */
    if (evbuffer_get_length(in))
        on_relay_read(t->up, t);
}

/* ---- the upstream's answer ---- */

/* token (case-insensitive) is in the comma-separated list */
static bool
list_has(const char *list, const char *tok, size_t tl)
{
    for (const char *s = list; *s;) {
        while (*s == ' ' || *s == '\t' || *s == ',')
            s++;
        size_t l = strcspn(s, ","), e = l;
        while (e && (s[e - 1] == ' ' || s[e - 1] == '\t'))
            e--;
        if (e && e == tl && strncasecmp(s, tok, tl) == 0)
            return true;
        s += l;
    }
    return false;
}

/* A final answer other than a 101: the upstream refused the upgrade; relay it. */
static void
on_up_head(void *arg, struct h1c_resp *resp)
{
    struct tunnel *t = tun_of(arg);
    int status = h1c_resp_status(resp);
    const char *conn = h1c_resp_header(resp, "Connection");
    for (size_t i = 0; i < h1c_resp_headers(resp); i++) {
        const char *name = h1c_resp_header_name(resp, i);
        if (!uplink_response_header_dropped(UPLINK_TUNNEL, name, conn))
            hresp_header(t->req, name, h1c_resp_header_value(resp, i));
    }
    log_debug("tunnel: %s: the upstream refused the upgrade with %d", t->desc, status);
    if (status == 401)
        uplink_unauthorized(t->link, t->cred_gen);
    t->phase = TUN_ANSWER;
    hresp_close_after(t->req);
    /* -1 (chunked or close-delimited): kwc streams it */
    hresp_start(t->req, status, h1c_resp_body_length(resp));
}

static void
on_up_body(void *arg, const char *p, size_t n)
{
    struct tunnel *t = tun_of(arg);
    if (t->phase == TUN_ANSWER)
        hresp_write(t->req, p, n);
}

static void
on_up_complete(void *arg)
{
    struct tunnel *t = tun_of(arg);
    if (t->phase == TUN_ANSWER) {
        t->phase = TUN_DONE;
        hresp_end(t->req); /* then the connection closes, and on_close frees t */
    }
}

static const struct h1c_resp_ops up_ops = {
    .on_head = on_up_head,
    .on_body = on_up_body,
    .on_complete = on_up_complete,
};

/* A 101 names a protocol the client asked for, never h2c. */
static bool
upgrade_ok(const struct tunnel *t)
{
    const char *u = h1c_resp_header(t->resp, "Upgrade");
    if (!u)
        return false;
    size_t l = strcspn(u, ",");
    while (l && (u[l - 1] == ' ' || u[l - 1] == '\t'))
        l--;
    return l && !(l == 3 && strncasecmp(u, "h2c", 3) == 0) && list_has(t->asked, u, l);
}

/*
 * Parse what the upstream sent, while its answer head is awaited (the bytes
 * stay in the input, for a 101 to pass on verbatim) or a refusal is relayed
 * (the bytes are drained as parsed; stops while the client's queue is over
 * TUN_HIGH, on_drain resumes). eof: the upstream closed. May close t.
 */
static void
parse_up(struct tunnel *t, bool eof)
{
    struct evbuffer *in = bufferevent_get_input(t->up);
    while (t->phase == TUN_HEAD || t->phase == TUN_ANSWER) {
        if (t->phase == TUN_ANSWER && hresp_queued(t->req) >= TUN_HIGH) {
            bufferevent_disable(t->up, EV_READ);
            hresp_low_water(t->req, TUN_LOW);
            return;
        }
        size_t avail = evbuffer_get_length(in) - t->parsed;
        size_t n = 0;
        if (avail == 0) {
            if (!eof)
                return;
            h1c_resp_feed(t->resp, NULL, 0);
        } else {
            struct evbuffer_ptr pos;
            struct evbuffer_iovec v;
            if (evbuffer_ptr_set(in, &pos, t->parsed, EVBUFFER_PTR_SET) != 0 ||
                evbuffer_peek(in, -1, &pos, &v, 1) < 1)
                return;
            size_t len = v.iov_len < TUN_PARSE_CHUNK ? v.iov_len : TUN_PARSE_CHUNK;
            n = h1c_resp_feed(t->resp, v.iov_base, len);
        }
        const char *err = h1c_resp_error(t->resp);
        int status = h1c_resp_status(t->resp);
        t->parsed += n;
        if (eof && avail == 0 && t->phase == TUN_HEAD) {
            fail_bad_gateway(t, "it closed the connection before answering the upgrade request");
            return;
        }
        if (h1c_resp_switching(t->resp)) {
            if (!upgrade_ok(t)) {
                fail_bad_gateway(t, "it switched to a protocol the client did not ask for");
                return;
            }
            /* its head is still at the start of the input (TUN_HEAD drains nothing) */
            switch_protocols(t, h1c_resp_head_len(t->resp));
            return;
        }
        if (t->phase == TUN_HEAD && status >= 100 && status < 200) {
            char m[80];
            snprintf(m, sizeof(m), "it answered the upgrade request with %d", status);
            fail_bad_gateway(t, m);
            return;
        }
        if (err) {
            char m[200];
            snprintf(m, sizeof(m), "a malformed answer to the upgrade request: %s", err);
            fail_bad_gateway(t, m);
            return;
        }
        if (t->phase == TUN_HEAD && t->parsed > TUN_HEAD_MAX) {
            fail_bad_gateway(t, "its answer head to the upgrade request is too large");
            return;
        }
        if (t->phase != TUN_HEAD) {
            evbuffer_drain(in, t->parsed);
            t->parsed = 0;
        }
        if (t->dead || t->phase == TUN_DONE)
            return;
        if (eof && avail == 0) {
            fail(t, 502, NULL, "the upstream API server closed the connection mid-answer");
            return;
        }
    }
}

static void
on_up_read(struct bufferevent *bev, void *arg)
{
    parse_up(tun_of(arg), false);
}

static void
on_up_write(struct bufferevent *bev, void *arg)
{
    struct tunnel *t = tun_of(arg);
    /* the request body's bytes drained below TUN_LOW: read more of them */
    if (t->body_paused && t->req) {
        t->body_paused = false;
        bufferevent_setwatermark(t->up, EV_WRITE, 0, 0);
        hreq_body_read(t->req, true);
    }
}

static void
on_up_event(struct bufferevent *bev, short what, void *arg)
{
    struct tunnel *t = tun_of(arg);
    if (what & BEV_EVENT_CONNECTED) {
        t->connected = true;
        evtimer_del(t->connect_timer);
        bufferevent_enable(t->up, EV_READ);
        return;
    }
    if (!(what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)))
        return;
    char why[320];
    if (!t->connected) {
        if (uplink_conn_error(bev, false, why, sizeof(why)))
            fail_bad_gateway(t, why); /* the TLS handshake */
        else
            fail_unavailable(t, why);
        return;
    }
    if (what & BEV_EVENT_ERROR) {
        uplink_conn_error(bev, true, why, sizeof(why));
        fail_bad_gateway(t, why);
        return;
    }
    parse_up(t, true);
}

static void
on_connect_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct tunnel *t = tun_of(arg);
    fail_unavailable(t, t->connect_err ? t->connect_err : "connecting timed out");
}

/* ---- the client's request, held by the server ---- */

static void
on_req_body(void *arg, const char *p, size_t n)
{
    struct tunnel *t = tun_of(arg);
    if (!t->up)
        return;
    struct evbuffer *out = bufferevent_get_output(t->up);
    h1c_body_write(out, t->body_framing, p, n);
    if (evbuffer_get_length(out) >= TUN_HIGH && !t->body_paused) {
        t->body_paused = true;
        bufferevent_setwatermark(t->up, EV_WRITE, TUN_LOW, 0);
        hreq_body_read(t->req, false);
    }
}

static void
on_req_complete(void *arg)
{
    struct tunnel *t = tun_of(arg);
    if (t->body_done)
        return;
    t->body_done = true;
    if (t->has_body && t->up)
        h1c_body_end(bufferevent_get_output(t->up), t->body_framing);
}

static void
on_req_drain(void *arg)
{
    struct tunnel *t = tun_of(arg);
    if (t->phase != TUN_ANSWER || !t->up)
        return;
    bufferevent_enable(t->up, EV_READ);
    parse_up(t, false);
}

static void
on_req_close(void *arg)
{
    struct tunnel *t = tun_of(arg);
    t->req = NULL;
    if (t->taking)
        return; /* hreq_take_pipe: the connection is ours now */
    tunnel_close(t);
}

static const struct hreq_handler tun_handler = {
    .on_body = on_req_body,
    .on_complete = on_req_complete,
    .on_drain = on_req_drain,
    .on_close = on_req_close,
};

/* ---- start ---- */

/* The Upgrade header's protocols without h2c, into t->asked. */
static void
set_asked(struct tunnel *t, const char *v)
{
    size_t used = 0;
    t->asked[0] = '\0';
    for (const char *s = v ? v : ""; *s;) {
        while (*s == ' ' || *s == '\t' || *s == ',')
            s++;
        size_t l = strcspn(s, ","), e = l;
        while (e && (s[e - 1] == ' ' || s[e - 1] == '\t'))
            e--;
        if (e && !(e == 3 && strncasecmp(s, "h2c", 3) == 0) && used + e + 3 < sizeof(t->asked)) {
            used += (size_t)snprintf(t->asked + used, sizeof(t->asked) - used, "%s%.*s",
                                     used ? ", " : "", (int)e, s);
        }
        s += l;
    }
}

void
tunnel_start(struct hreq *req, const struct tunnel_options *o)
{
    const struct kcfg *k = uplink_kcfg(o->link);
    const char *method = hreq_method(req);
    size_t tl;
    const char *target = hreq_target(req, &tl);
    if (target[0] != '/') {
        respond_status(req, 400, NULL, "the request URI is not a valid path and query", 0);
        return;
    }
    const struct http_header *uh;
    bool own_auth = false;
    for (size_t i = 0, n = hreq_upstream_headers(req, &uh); i < n; i++)
        own_auth |= strcasecmp(uh[i].name, "Authorization") == 0;
    /* kwc's own credentials (a kubeconfig has a token, basic auth or a plugin),
     * taken once: the bearer line and the number of the same credential */
    struct uplink_cred cred = {0};
    if (o->strip_credentials && !own_auth && !uplink_cred_get(o->link, NULL, &cred)) {
        /* a tunnel does not wait for the plugin: the client retries (Retry-After) */
        char m[640], why[560];
        uplink_cred_why(o->link, why, sizeof(why));
        snprintf(m, sizeof(m), "kwc has no credential for the upstream yet: %s", why);
        respond_status(req, 503, "ServiceUnavailable", m, 1);
        return;
    }
    bool tls;
    char host[256], port[16]; /* for the Host header (uplink_connect connects to them) */
    kcfg_server_hostport(k->server, &tls, host, sizeof(host), port, sizeof(port));

    struct tunnel *t = xcalloc(1, sizeof(*t));
    t->link = o->link;
    t->magic = TUN_MAGIC;
    t->phase = TUN_HEAD;
    t->req = req;
    int dl = (int)strcspn(target, "?");
    snprintf(t->desc, sizeof(t->desc), "%s %.*s", method, dl > 140 ? 140 : dl, target);
    t->has_body = hreq_has_body(req);
    t->body_framing = hreq_content_length(req) < 0 ? H1C_CHUNKED : H1C_LENGTH;
    set_asked(t, hreq_header(req, "Upgrade"));
    t->resp = h1c_resp_new(strcmp(method, "HEAD") == 0, &up_ops, t);
    t->reap = event_new(o->base, -1, 0, on_reap, t);
    t->connect_timer = evtimer_new(o->base, on_connect_timeout, t);

    /* The request head, replayed to the upstream. */
    struct evbuffer *head = evbuffer_new();
    h1c_head_begin(head, method, target, host, port);
    h1c_head_header(head, "Upgrade", t->asked);
    const struct http_header *hs;
    size_t nh = hreq_headers(req, &hs);
    for (size_t i = 0; i < nh; i++)
        if (!uplink_request_header_dropped(UPLINK_TUNNEL, hs[i].name, NULL, o->strip_credentials))
            h1c_head_header(head, hs[i].name, hs[i].value);
    /* the caller's identity, as the front's stages decided it */
    nh = hreq_upstream_headers(req, &hs);
    for (size_t i = 0; i < nh; i++)
        h1c_head_header(head, hs[i].name, hs[i].value);
    if (o->strip_credentials && !own_auth) {
        const char *basic = uplink_basic_line(o->link);
        if (cred.bearer_line)
            h1c_head_line(head, cred.bearer_line);
        t->cred_gen = cred.gen;
        if (basic)
            h1c_head_line(head, basic);
    }
    uplink_cred_clear(&cred);
    h1c_head_end(head);

    /* Callbacks are deferred: nothing of t's runs before the loop. */
    t->up = uplink_connect(o->link, o->base, &t->connect_err);
    if (t->up) {
        /* the upstream socket is a descriptor too: --max-connections counts a
         * tunnel twice (config.h's budget) */
        hreq_count_socket(req);
        bufferevent_setcb(t->up, on_up_read, on_up_write, on_up_event, t);
        bufferevent_write_buffer(t->up, head);
    }
    evbuffer_free(head);

    /* The server keeps the client's connection until the upstream answers;
     * the body (if any) follows the head, nothing behind it is read. */
    hreq_set_handler(req, &tun_handler, t);
    if (t->has_body)
        hreq_body_read(req, true);

    if (!t->up) {
        /* Report from the loop, not from inside the server's parser. */
        event_active(t->connect_timer, EV_TIMEOUT, 1);
    } else {
        struct timeval tv = {o->connect_timeout_ms / 1000, (o->connect_timeout_ms % 1000) * 1000};
        evtimer_add(t->connect_timer, &tv);
    }
    log_debug("tunnel: %s -> %s:%s", t->desc, host, port);
}
