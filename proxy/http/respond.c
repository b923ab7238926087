/*
 * respond.c — see respond.h.
 */
#include "kwc/respond.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "kwc/http.h"
#include "kwc/status.h"

void
respond_status(struct hreq *r, int code, const char *reason, const char *message, int retry_after)
{
    if (!reason)
        reason = status_reason_for_code(code);
    struct status_details d = {.retry_after_seconds = retry_after};
    char *body = status_failure_json(code, reason, message, retry_after > 0 ? &d : NULL);
    respond_status_body(r, code, body, retry_after);
    free(body);
}

void
respond_status_body(struct hreq *r, int code, const char *body, int retry_after)
{
    hresp_header(r, "Cache-Control", "no-cache, private");
    hresp_header(r, "Content-Type", "application/json");
    if (retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof(ra), "%d", retry_after);
        hresp_header(r, "Retry-After", ra);
    }
    size_t n = strlen(body);
    hresp_start(r, code, (int64_t)n + 1);
    hresp_write(r, body, n);
    hresp_write(r, "\n", 1); /* Go's json.Encoder ends with a newline */
    hresp_end(r);
}

void
respond_text_n(struct hreq *r, int code, const char *text, size_t len)
{
    hresp_header(r, "Content-Type", "text/plain; charset=utf-8");
    hresp_header(r, "X-Content-Type-Options", "nosniff");
    hresp_simple(r, code, NULL, text, len);
}

void
respond_text(struct hreq *r, int code, const char *text)
{
    respond_text_n(r, code, text, strlen(text));
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
respond_audit_id(const struct hreq *r, uint64_t rng[2], char out[RESPOND_AUDIT_ID_LEN])
{
    const char *in = hreq_header(r, "Audit-ID");
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
