/*
 * servefx.h — serve (serve.c) behind the cache fixture's HTTP server
 * (cachefx.h): a request kwc's serve does not take is answered 599
 * "passed" (the upstream's, in kwc), so a test sees which it was.
 */
#ifndef KWC_TEST_SERVEFX_H
#define KWC_TEST_SERVEFX_H

#include "kwc/serve.h"

#include "cachefx.h"

static void
servefx_take(struct cfx *f, struct hreq *r, const struct route_req *route)
{
    if (!serve_take(f->arg, r, route))
        hresp_simple(r, 599, "text/plain", "passed", 6);
}

/* serve over f's store and first cache, lists bounded by max_buffer. */
static struct serve *
serve_open(struct cfx *f, size_t max_buffer)
{
    struct serve_options so = {
        .too_large = DECIDE_TOO_LARGE_PASS, .wait_ms = 3000, .max_buffer = max_buffer, .up = f->up};
    struct serve *s = serve_new(f->base, f->st, &f->set, &so);
    f->take = servefx_take;
    f->arg = s;
    return s;
}

#endif
