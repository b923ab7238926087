/*
 * passthrough.c — client request <-> up_xfer (see passthrough.h).
 *
 * Flow control, both directions, with bounded memory:
 *  - request body: the request's on_body hook appends to pt->body; past
 *    max_request_buffer body reading stops (hreq_body_read off); curl's read
 *    callback drains pt->body and turns reading on again below half of it.
 *  - response body: before taking bytes from curl we look at the response
 *    writer's queue; over max_response_buffer the transfer pauses, and the
 *    writer's on_drain (low water: a quarter) resumes it from a deferred event.
 *  - all responses together (pt_budget): each pt's share, p->held, is its
 *    queue as last seen (on data, on drain), so the total only lags a queue
 *    that drains, never one that grows: it errs on the side of pausing. Over
 *    the budget a pt that holds more than an even share pauses like one over
 *    its own buffer and resumes the same way, when its client reads.
 * Lifetime: pt lives exactly as long as the request; its on_close hook
 * cancels the transfer and frees pt. Nothing is freed inside curl's
 * callback chain except through that hook.
 */
#include "kwc/passthrough.h"

#include <assert.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kwc/access.h"
#include "kwc/base.h"
#include "kwc/http.h"
#include "kwc/log.h"
#include "kwc/respond.h"
#include "kwc/uplink.h"
#include "kwc/upstream.h"

#define PT_MAGIC 0x70743031u /* "pt01" */

struct pt {
    uint32_t magic;
    struct hreq *req;
    struct up_xfer *x;
    const struct pt_options *o;
    struct evbuffer *body;     /* request body not yet taken by curl */
    struct event *kick;        /* deferred resume of the transfer */
    bool body_done;            /* client finished sending the request */
    bool client_paused;        /* we stopped reading the body */
    bool want_recv, want_send; /* what kick should resume */
    bool started, finished;
    bool budget_paused; /* paused by the budget, not its own buffer */
    /* paused by its own buffer (counted in the budget's stats) */
    bool out_paused;
    size_t held; /* bytes counted in the budget */
    char method[24];
    char *path; /* for logs */
    uint64_t bytes_out;
};

#define BUDGET_MAGIC 0x70746275u /* "ptbu" */

struct pt_budget {
    uint32_t magic;
    size_t max, total;
    size_t holders; /* pts with held > 0 */
    unsigned paused;
    uint64_t pauses;
    /* pts paused by their own max_response_buffer */
    unsigned out_paused;
};

struct pt_budget *
pt_budget_new(size_t max)
{
    struct pt_budget *b = xcalloc(1, sizeof(*b));
    b->magic = BUDGET_MAGIC;
    b->max = max ? max : 1;
    return b;
}

void
pt_budget_free(struct pt_budget *b)
{
    if (!b)
        return;
    assert(b->magic == BUDGET_MAGIC && b->total == 0 && b->holders == 0 && b->out_paused == 0);
    b->magic = 0;
    free(b);
}

void
pt_budget_stats(const struct pt_budget *b, struct pt_budget_stats *out)
{
    *out = (struct pt_budget_stats){.queued = b->total,
                                    .max = b->max,
                                    .paused = b->paused,
                                    .pauses = b->pauses,
                                    .out_paused = b->out_paused};
}

bool
pt_budget_should_pause(size_t total, size_t held, size_t n, size_t holders, size_t max)
{
    size_t half = max / 2;
    if (held == 0 || total + n <= half)
        return false;
    return held + n > half / (holders ? holders : 1);
}

static struct pt *
pt_of(void *arg)
{
    struct pt *p = arg;
    assert(p && p->magic == PT_MAGIC);
    return p;
}

/* p's share of the budget is now `queued` bytes. */
static void
budget_set(struct pt *p, size_t queued)
{
    struct pt_budget *b = p->o->budget;
    if (!b || queued == p->held)
        return;
    b->total = b->total - p->held + queued;
    if (!p->held != !queued)
        b->holders += queued ? 1 : (size_t)-1;
    p->held = queued;
}

static void
budget_unpause(struct pt *p)
{
    if (p->budget_paused) {
        p->budget_paused = false;
        p->o->budget->paused--;
    }
    if (p->out_paused) {
        p->out_paused = false;
        p->o->budget->out_paused--;
    }
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

/* The response queue drained to a quarter: resume the upstream. */
static void
on_out_drain(void *arg)
{
    struct pt *p = pt_of(arg);
    budget_set(p, hresp_queued(p->req));
    if (p->x) {
        p->want_recv = true;
        kick_soon(p);
    }
}

/* ---- upstream callbacks ---- */

static int
on_up_headers(void *arg, int status, const struct up_header *h, size_t n)
{
    struct pt *p = pt_of(arg);
    const char *clen = NULL;
    for (size_t i = 0; i < n; i++) {
        if (strcasecmp(h[i].name, "Content-Length") == 0) {
            clen = h[i].value; /* kwc's response writer frames the body */
            continue;
        }
        if (uplink_response_header_dropped(UPLINK_FORWARD, h[i].name, NULL))
            continue;
        hresp_header(p->req, h[i].name, h[i].value);
    }
    p->started = true;
    hresp_start(p->req, status, clen ? strtoll(clen, NULL, 10) : -1);
    log_debug("passthrough: %s %s -> %d", p->method, p->path, status);
    return 0;
}

static int
on_up_data(void *arg, const char *data, size_t n)
{
    struct pt *p = pt_of(arg);
    struct pt_budget *b = p->o->budget;
    size_t queued = hresp_queued(p->req);
    budget_set(p, queued);
    budget_unpause(p);
    if (queued > p->o->max_response_buffer) {
        if (b) {
            p->out_paused = true;
            b->out_paused++;
        }
        return UP_PAUSE; /* resumed by on_out_drain */
    }
    if (b && pt_budget_should_pause(b->total, p->held, n, b->holders, b->max)) {
        p->budget_paused = true;
        b->paused++;
        b->pauses++;
        return UP_PAUSE; /* resumed by on_out_drain too */
    }
    hresp_write(p->req, data, n);
    budget_set(p, hresp_queued(p->req));
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
            hreq_body_read(p->req, true);
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
        hresp_close_after(p->req); /* unread body bytes must not be parsed as a request */
    if (!p->started) {
        int code;
        const char *reason;
        char m[512];
        if (err == -ETIMEDOUT) {
            code = 504;
            reason = "Timeout";
            snprintf(m, sizeof(m), "the upstream API server did not answer in time: %s", msg);
        } else if (err == -ECONNREFUSED || err == -EHOSTUNREACH || err == -ECONNRESET ||
                   err == -EAGAIN) { /* EAGAIN: no credential from the exec plugin yet */
            code = 503;
            reason = "ServiceUnavailable";
            snprintf(m, sizeof(m), "the upstream API server is unavailable: %s", msg);
        } else {
            code = 502;
            reason = "";
            snprintf(m, sizeof(m), "error talking to the upstream API server: %s", msg);
        }
        /* every passthrough fails so while the upstream is away: one line per
         * cause and interval (log_repeat) */
        char cause[128], subj[256];
        snprintf(cause, sizeof(cause), "passthrough failed: %s (answered %d)", kwc_strerror(err),
                 code);
        snprintf(subj, sizeof(subj), "%s %s", p->method, p->path);
        log_repeat(LOG_WARN, cause, "requests", subj, "passthrough: %s %s: %s (answered %d)",
                   p->method, p->path, msg, code);
        respond_status(p->req, code, reason, m, code == 503 ? 1 : 0);
        return;
    }
    if (err) {
        char cause[128], subj[256];
        snprintf(cause, sizeof(cause), "passthrough cut mid-response: %s", kwc_strerror(err));
        snprintf(subj, sizeof(subj), "%s %s", p->method, p->path);
        log_repeat(LOG_WARN, cause, "requests", subj,
                   "passthrough: %s %s: upstream failed mid-response after %llu bytes: %s",
                   p->method, p->path, (unsigned long long)p->bytes_out, msg);
    }
    if (err == 0)
        hresp_end(p->req);
    else
        hresp_abort(p->req); /* the client sees the body is incomplete */
}

static const struct up_xfer_cbs pt_cbs = {
    .on_headers = on_up_headers,
    .on_data = on_up_data,
    .on_body = on_up_body,
    .on_done = on_up_done,
};

/* ---- client-side hooks ---- */

static void
on_client_body(void *arg, const char *data, size_t n)
{
    struct pt *p = pt_of(arg);
    evbuffer_add(p->body, data, n);
    if (p->x) {
        p->want_send = true;
        kick_soon(p);
    }
    if (!p->client_paused && evbuffer_get_length(p->body) > p->o->max_request_buffer) {
        p->client_paused = true;
        hreq_body_read(p->req, false);
    }
}

/* The whole request has been read. */
static void
on_client_complete(void *arg)
{
    struct pt *p = pt_of(arg);
    p->body_done = true;
    if (p->x) {
        p->want_send = true;
        kick_soon(p);
    }
}

static void
on_request_close(void *arg)
{
    struct pt *p = pt_of(arg);
    up_xfer_cancel(p->x);
    p->x = NULL;
    budget_set(p, 0);
    if (p->o->budget)
        budget_unpause(p);
    event_free(p->kick);
    evbuffer_free(p->body);
    free(p->path);
    p->magic = 0;
    free(p);
}

static const struct hreq_handler pt_handler = {
    .on_body = on_client_body,
    .on_complete = on_client_complete,
    .on_drain = on_out_drain,
    .on_close = on_request_close,
};

/* ---- request head -> upstream request ---- */

struct hdr_collect {
    struct up_header *h; /* room for every header of the caller, its identity and X-Forwarded-For */
    size_t n;
    bool strip_credentials;
    const char
        *connection; /* the client's Connection header: tokens name more hop-by-hop headers */
    const char *xff;
};

static void
collect_header(struct hdr_collect *hc, const char *k, const char *v)
{
    if (uplink_request_header_dropped(UPLINK_FORWARD, k, hc->connection, hc->strip_credentials))
        return;
    if (strcasecmp(k, "X-Forwarded-For") == 0) {
        hc->xff = v; /* kwc appends the client's address */
        return;
    }
    hc->h[hc->n].name = k;
    hc->h[hc->n].value = v;
    hc->n++;
}

static void
client_addr(struct hreq *req, char *out, size_t len)
{
    socklen_t sl;
    const struct sockaddr *sa = hreq_peer(req, &sl);
    out[0] = '\0';
    if (!sl)
        return;
    if (sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, out, (socklen_t)len);
    else if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, out, (socklen_t)len);
}

static void
pt_start(struct hreq *req, struct up_client *up, const struct pt_options *o, bool read)
{
    struct pt *p = xcalloc(1, sizeof(*p));
    p->magic = PT_MAGIC;
    p->req = req;
    p->body_done = read || !hreq_has_body(req);
    p->o = o;
    p->body = evbuffer_new();
    p->kick = event_new(hreq_base(req), -1, 0, on_kick, p);
    snprintf(p->method, sizeof(p->method), "%s", hreq_method(req));
    size_t tl;
    const char *target = hreq_target(req, &tl);
    p->path = xstrndup(target, strcspn(target, "?"));
    hreq_set_handler(req, &pt_handler, p);
    hresp_low_water(req, o->max_response_buffer / 4);
    access_set_source(req, ACCESS_UPSTREAM);

    const struct http_header *hs, *ids;
    size_t nh = hreq_headers(req, &hs), nid = hreq_upstream_headers(req, &ids);
    struct hdr_collect hc = {.h = xcalloc(nh + nid + 1, sizeof(*hc.h)),
                             .strip_credentials = o->strip_credentials,
                             .connection = hreq_header(req, "Connection")};
    for (size_t i = 0; i < nh; i++)
        collect_header(&hc, hs[i].name, hs[i].value);
    /* the caller's identity, as the front's stages decided it: added as is
     * (not through collect_header: a caller's Connection header must not
     * be able to name them away) */
    for (size_t i = 0; i < nid; i++) {
        hc.h[hc.n].name = ids[i].name;
        hc.h[hc.n].value = ids[i].value;
        hc.n++;
    }
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

    bool body = !read && hreq_has_body(req);
    struct up_request r = {
        .method = p->method,
        .headers = hc.h,
        .nheaders = hc.n,
        .has_body = body,
        .body_len = body ? hreq_content_length(req) : -1,
        .long_running = o->long_running,
        .target = target,
    };
    int rc = up_xfer_start(up, &r, &pt_cbs, p, &p->x);
    free(hc.h);
    if (rc != 0) {
        p->x = NULL;
        respond_status(req, 502, "", "kwc could not start the upstream request", 0);
        return;
    }
    if (body)
        hreq_body_read(req, true);
}

void
pt_forward(struct hreq *req, struct up_client *up, const struct pt_options *o)
{
    pt_start(req, up, o, false);
}

void
pt_forward_read(struct hreq *req, struct up_client *up, const struct pt_options *o)
{
    pt_start(req, up, o, true);
}
