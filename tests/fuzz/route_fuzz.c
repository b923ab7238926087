/*
 * route_fuzz.c — libFuzzer target for route_parse (request targets straight
 * from clients).
 *
 * Input: the first byte picks the HTTP method, the rest is the target, passed
 * with its exact length and no NUL so ASan sees any read past it. Every
 * result is checked against route.h's contract: a known return code, and on
 * success NUL-terminated strings that agree with the verb kube-apiserver
 * would assign (a list or watch has no name, a legacy watch is a watch).
 */
#include "kwc/body.h"
#include "kwc/route.h"

#include "kwc/base.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
check_str(const char *s)
{
    if (s && strlen(s) > ROUTE_MAX_TARGET)
        abort();
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const methods[] = {"GET",   "HEAD",   "POST",    "PUT",
                                          "PATCH", "DELETE", "OPTIONS", "CONNECT"};
    if (size < 1)
        return 0;
    const char *method = methods[data[0] % KWC_ARRAY_LEN(methods)];
    const char *target = (const char *)data + 1;
    size_t len = size - 1;

    struct route_req r;
    int rc = route_parse(method, target, len, &r);
    if (rc != 0 && rc != KWC_EPARSE && rc != KWC_ETOOBIG)
        abort();
    if (rc == 0) {
        if (!r.path || r.path[0] != '/')
            abort();
        check_str(r.path);
        if (r.is_resource) {
            /* resource may be NULL: "/api/v1/watch" (kube: an error) */
            if (!r.group || !r.version)
                abort();
            check_str(r.group);
            check_str(r.version);
            check_str(r.resource);
            check_str(r.namespace_);
            check_str(r.name);
            check_str(r.subresource);
            if ((r.verb == ROUTE_LIST || r.verb == ROUTE_DELETECOLLECTION) && r.name)
                abort();
            if (r.legacy_watch && r.verb != ROUTE_WATCH)
                abort();
            if (r.subresource && !r.name)
                abort();
            if (!route_verb_name(r.verb))
                abort();
        }
        const char *const *q = (const char *const *)&r.q;
        for (size_t i = 0; i < sizeof(r.q) / sizeof(*q); i++)
            check_str(q[i]);
        if (r.q.watch)
            (void)kwc_query_bool(r.q.watch, strlen(r.q.watch));
        (void)route_wants_pretty(&r.q, NULL);
    }
    route_fini(&r);
    /* the same bytes as an Accept header and a User-Agent (NUL-terminated
     * copies: libevhtp hands headers over as C strings) */
    char *h = malloc(len + 1);
    if (!h)
        return 0;
    memcpy(h, target, len);
    h[len] = '\0';
    enum route_media custom = route_negotiate(h, false);
    enum route_media m = route_negotiate(h, true);
    if (custom == ROUTE_MEDIA_PROTOBUF)
        abort(); /* custom resources have no protobuf */
    if ((custom != ROUTE_MEDIA_OTHER || m != ROUTE_MEDIA_OTHER) && strchr(h, ';') &&
        !strchr(h, ','))
        abort(); /* a clause with parameters is left to the upstream */
    if (m == ROUTE_MEDIA_PROTOBUF && !strstr(h, "application/vnd.kubernetes.protobuf"))
        abort();
    /* route_accept: bounded, and what it serves is what the header says */
    struct route_accept ab, ac;
    route_accept(h, true, &ab);
    route_accept(h, false, &ac);
    for (int k = 0; k < 2; k++) {
        const struct route_accept *x = k ? &ac : &ab;
        if (x->as != ROUTE_AS_NONE &&
            (x->media == ROUTE_MEDIA_OTHER || !strstr(h, "PartialObjectMetadata") ||
             !strstr(h, "meta.k8s.io")))
            abort();
        if (x->pretty && !strstr(h, "pretty"))
            abort();
        if (x->media == ROUTE_MEDIA_PROTOBUF &&
            (!strstr(h, "vnd.kubernetes.protobuf") || (k && x->as == ROUTE_AS_NONE)))
            abort(); /* a custom resource's protobuf is metadata only */
    }
    /* an error's Status: no conversion is ever its winner */
    struct route_accept st;
    route_accept_status(h, &st);
    if (st.as != ROUTE_AS_NONE || (st.none && st.media != ROUTE_MEDIA_OTHER))
        abort();
    /* the same bytes as an Accept-Encoding line: gzip only if it says so */
    if (body_accepts_gzip(h) && !strstr(h, "gzip"))
        abort();
    struct route_query empty = {0};
    (void)route_wants_pretty(&empty, h);
    free(h);
    return 0;
}
