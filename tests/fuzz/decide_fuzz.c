/*
 * decide_fuzz.c — libFuzzer target for decide_read, decide_watch and decide_timeout (the
 * resourceVersion, resourceVersionMatch, limit, continue, timeoutSeconds and
 * sendInitialEvents query values straight from clients).
 *
 * Input: two bytes of switches, then up to seven NUL-separated fields: rv,
 * match, limit, continue, timeoutSeconds, sendInitialEvents, selector error.
 * Byte 0: bit 0 get (else list), bit 1 selectors, bit 2 cache synced, bit 3
 * the 504 policy; byte 1: bit i set means field i is present (absent fields
 * are NULL). The cache's floor and rv are small (50 and 100) so that typed
 * numbers land on every side of them. Every result is checked against
 * decide.h's contract: a known action, a why only on a pass through, limits
 * only on a serve, an exact rv inside the window, and an error with a code
 * kube-apiserver uses here and a Status body that is JSON.
 */
#include "kwc/decide.h"

#include "kwc/base.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NFIELDS 7

static void
check_status(const struct decide_result *r)
{
    if (!r->message || !r->body || !r->reason)
        abort();
    json_t *j = json_loads(r->body, 0, NULL);
    if (!j || json_integer_value(json_object_get(j, "code")) != r->code)
        abort();
    json_decref(j);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    uint8_t sw = data[0], present = data[1];
    char *buf = xmalloc(size - 2 + 1);
    memcpy(buf, data + 2, size - 2);
    buf[size - 2] = '\0';
    const char *f[NFIELDS] = {NULL};
    char *p = buf, *end = buf + (size - 2);
    for (int i = 0; i < NFIELDS && p <= end; i++) {
        if (present & (1u << i))
            f[i] = p;
        p += strlen(p) + 1;
    }

    struct decide_req req = {
        .verb = (sw & 1) ? DECIDE_GET : DECIDE_LIST,
        .has_selector = (sw & 2) != 0,
        .resource_version = f[0],
        .resource_version_match = f[1],
        .limit = f[2],
        .continue_token = f[3],
        .timeout_seconds = f[4],
        .send_initial_events = f[5],
        .selector_error = f[6],
    };
    struct decide_cache cache = {.synced = (sw & 4) != 0, .current_rv = 100, .floor_rv = 50};
    enum decide_too_large policy = (sw & 8) ? DECIDE_TOO_LARGE_504 : DECIDE_TOO_LARGE_PASS;

    struct decide_result d;
    decide_read(&req, &cache, policy, &d);
    if (!decide_action_name(d.action) || !decide_why_name(d.why))
        abort();
    if ((d.action == DECIDE_PASS_THROUGH) != (d.why != DECIDE_WHY_NONE))
        abort();
    bool serve = d.action == DECIDE_SERVE_AT_LEAST || d.action == DECIDE_SERVE_EXACT;
    if (d.limit < 0 || (!serve && d.limit != 0) || (d.remaining_count && d.limit == 0))
        abort();
    if (d.remaining_count && req.has_selector)
        abort();
    if (d.start_key && (d.action != DECIDE_SERVE_EXACT || d.start_key[d.start_key_len] != '\0'))
        abort();
    if (d.action != DECIDE_PASS_THROUGH && d.action != DECIDE_ERROR && !cache.synced)
        abort();
    if (d.action == DECIDE_SERVE_EXACT && (d.rv < cache.floor_rv || d.rv > cache.current_rv))
        abort();
    if (d.action == DECIDE_ERROR) {
        if (d.code != 400 && d.code != 422 && d.code != 500)
            abort();
        check_status(&d);
    } else if (d.message || d.body) {
        abort();
    }
    if (d.action == DECIDE_SERVE_AT_LEAST) {
        if (d.rv == 0 || d.wait != (d.rv > cache.current_rv))
            abort();
        struct decide_result t;
        decide_timeout(&d, cache.current_rv, &t);
        if (t.action == DECIDE_ERROR) {
            if (policy != DECIDE_TOO_LARGE_504 || t.code != 504 || t.retry_after_seconds != 1)
                abort();
            check_status(&t);
        } else if (t.action != DECIDE_PASS_THROUGH || t.why != DECIDE_WHY_TOO_LARGE ||
                   policy != DECIDE_TOO_LARGE_PASS) {
            abort();
        }
        decide_result_fini(&t);
    }
    decide_result_fini(&d);

    /* the same query as a watch */
    req.verb = DECIDE_WATCH;
    decide_watch(&req, &cache, &d);
    if (d.action != DECIDE_SERVE_WATCH && d.action != DECIDE_ERROR &&
        d.action != DECIDE_PASS_THROUGH)
        abort();
    if (d.action == DECIDE_PASS_THROUGH && (cache.synced || d.why != DECIDE_WHY_NOT_SYNCED))
        abort();
    if (d.action == DECIDE_ERROR) {
        if (d.code != 400 && d.code != 422 && d.code != 500)
            abort();
        check_status(&d);
    } else if (d.message || d.body) {
        abort();
    }
    if (d.action == DECIDE_SERVE_WATCH) {
        /* wait: an rv ahead of the cache, for sendInitialEvents or a
         * resume (a client from a replica that was ahead) alike */
        if (!cache.synced || (d.wait && d.rv <= cache.current_rv) ||
            (!d.initial && d.wait != (d.rv > cache.current_rv)) || (d.initial_end && !d.initial) ||
            (!d.initial && d.rv == 0))
            abort();
    }
    decide_result_fini(&d);
    free(buf);
    return 0;
}
