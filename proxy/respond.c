/*
 * respond.c — see respond.h. The one place that knows libevhtp's reply quirks:
 * a streamed reply is only finalised from its write callback, which libevhtp
 * runs when output drains; if nothing is left to write we trigger it ourselves
 * (deferred), or the request would never finish.
 */
#include "kwc/respond.h"

#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/status.h"

void
respond_header(evhtp_request_t *req, const char *name, const char *value)
{
    evhtp_headers_add_header(req->headers_out, evhtp_header_new(name, value, 1, 1));
}

void
respond_status(evhtp_request_t *req, int code, const char *reason, const char *message,
               int retry_after)
{
    if (!reason)
        reason = status_reason_for_code(code);
    struct status_details d = {.retry_after_seconds = retry_after};
    char *body = status_failure_json(code, reason, message, retry_after > 0 ? &d : NULL);
    respond_status_body(req, code, body, retry_after);
    free(body);
}

void
respond_status_body(evhtp_request_t *req, int code, const char *body, int retry_after)
{
    respond_header(req, "Content-Type", "application/json");
    respond_header(req, "Cache-Control", "no-cache, private");
    if (retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof(ra), "%d", retry_after);
        respond_header(req, "Retry-After", ra);
    }
    evbuffer_add(req->buffer_out, body, strlen(body));
    evbuffer_add(req->buffer_out, "\n", 1); /* Go's json.Encoder ends with a newline */
    evhtp_send_reply(req, (evhtp_res)code);
}

void
respond_text(evhtp_request_t *req, int code, const char *text)
{
    respond_header(req, "Content-Type", "text/plain; charset=utf-8");
    respond_header(req, "X-Content-Type-Options", "nosniff");
    evbuffer_add(req->buffer_out, text, strlen(text));
    evhtp_send_reply(req, (evhtp_res)code);
}

void
respond_no_keepalive(evhtp_request_t *req)
{
    /* evhtp_request_set_keepalive(req, 0) only ever sets the flag: clear it here. */
    req->flags &= (uint16_t)~EVHTP_REQ_FLAG_KEEPALIVE;
}

void
respond_end_stream(evhtp_request_t *req, bool chunked, bool clean)
{
    struct bufferevent *bev = evhtp_connection_get_bev(evhtp_request_get_connection(req));
    if (!clean)
        respond_no_keepalive(req);
    if (clean && chunked)
        evhtp_send_reply_chunk_end(req);
    else
        evhtp_send_reply_end(req);
    if (bev)
        bufferevent_trigger(bev, EV_WRITE, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
}

static evhtp_res
on_discard(evhtp_request_t *req, struct evbuffer *buf, void *arg)
{
    evbuffer_drain(buf, evbuffer_get_length(buf));
    return EVHTP_RES_OK;
}

void
respond_discard_body(evhtp_request_t *req, size_t max)
{
    evhtp_request_set_max_body_size(req, max);
    evhtp_request_set_hook(req, evhtp_hook_on_read, (evhtp_hook)on_discard, NULL);
}

void
respond_rng_seed(uint64_t rng[2])
{
    if (getrandom(rng, 2 * sizeof(uint64_t), 0) != (ssize_t)(2 * sizeof(uint64_t)) ||
        (!rng[0] && !rng[1])) {
        rng[0] = (uint64_t)(uintptr_t)rng ^ 0x9e3779b97f4a7c15ull;
        rng[1] = 1;
    }
}

static uint64_t
rng_next(uint64_t s[2])
{
    /* xorshift128+ */
    uint64_t a = s[0], b = s[1];
    s[0] = b;
    a ^= a << 23;
    s[1] = a ^ b ^ (a >> 17) ^ (b >> 26);
    return s[1] + b;
}

void
respond_audit_id(evhtp_request_t *req, uint64_t rng[2], char out[RESPOND_AUDIT_ID_LEN])
{
    const char *in = evhtp_header_find(req->headers_in, "Audit-ID");
    if (in && strlen(in) < RESPOND_AUDIT_ID_LEN) {
        snprintf(out, RESPOND_AUDIT_ID_LEN, "%s", in);
        return;
    }
    uint64_t a = rng_next(rng), b = rng_next(rng);
    a = (a & ~0xf000ull) | 0x4000ull;       /* version 4 */
    b = (b & ~(3ull << 62)) | (2ull << 62); /* variant 10 */
    snprintf(out, RESPOND_AUDIT_ID_LEN, "%08x-%04x-%04x-%04x-%012llx", (unsigned)(a >> 32),
             (unsigned)((a >> 16) & 0xffff), (unsigned)(a & 0xffff), (unsigned)(b >> 48),
             (unsigned long long)(b & 0xffffffffffffull));
}
