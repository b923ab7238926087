/*
 * discovery.h — clients' discovery requests answered from kwc's copy of
 * the upstream's answers (disco.h): GET /api, /apis, /api/V, /apis/G,
 * /apis/G/V in every form the upstream negotiates (plain or aggregated,
 * JSON or protobuf), and /version.
 *
 * What kube-apiserver does (k8s.io/apiserver/pkg/endpoints/discovery,
 * discovery/aggregated; version.go) and kwc with it:
 *  - the body is the upstream's, with the headers that describe it
 *    (Content-Type, Etag, Vary, Cache-Control, ...) and an Audit-Id of
 *    kwc's own;
 *  - aggregated discovery (ServeHTTPWithETag) answers 304, with its Etag,
 *    Vary and Cache-Control and no body, when If-None-Match is exactly the
 *    quoted ETag; kwc does the same for any record with an ETag;
 *  - discovery documents are written by WriteObjectNegotiated
 *    (responsewriters.SerializeObject): indented when ?pretty= or the
 *    User-Agent asks for it (JSON only), gzip past 128 KiB when the client
 *    accepts it: kwc's body writer (body.h) does both over the recorded
 *    compact bytes; /version is WriteRawJSON (always indented, never
 *    compressed): its bytes go out as they are.
 * Only GET with no body, a query of timeout= and pretty= only, and an
 * Accept without "pretty" is answered from the copy; HEAD and anything
 * else passes through. A request the copy has no current answer for passes
 * through (and its key is recorded for the next ones).
 *
 * Authorization (front.c): kube authorizes these paths as non-resource
 * URLs (system:discovery grants get on /api, /api/..., /apis, /apis/... and
 * system:public-info-viewer on /version); with --auth delegated the front
 * asks a SubjectAccessReview {path, verb get} before kwc answers from the
 * copy, as it does for /metrics.
 *
 * Loop thread only (the front's).
 */
#ifndef KWC_DISCOVERY_H
#define KWC_DISCOVERY_H

#include <stdbool.h>
#include <stdint.h>

struct disco;
struct hreq;
struct route_req;
struct discovery;

/* d borrowed, must outlive it; NULL: nothing is answered from a copy (the
 * requests are still counted). */
struct discovery *discovery_new(struct disco *d);
void discovery_free(struct discovery *s);

/* A discovery path (/version included), whatever the method and query. */
bool discovery_path(const char *path);

/*
 * May kwc answer req from the copy now (see above)? s may be NULL (no). Looks the copy up: a
 * miss records the key. The answer may change before discovery_take (a
 * refresh in between): the front authorizes when this says yes.
 */
bool discovery_answerable(struct discovery *s, struct hreq *req, const struct route_req *r);

/*
 * Answer req from the copy: true when it is taken (answered on every path
 * from here on); false when the copy has no current answer for it, or
 * may_answer is false (kwc did not authorize it): the caller passes it
 * on. Counts discovery requests by who answers them. s may be NULL (false).
 */
bool discovery_take(struct discovery *s, struct hreq *req, const struct route_req *r,
                    bool may_answer);

struct discovery_stats {
    uint64_t cache;        /* answered from the copy (304s included) */
    uint64_t upstream;     /* passed through */
    uint64_t not_modified; /* of the copy's answers, 304 */
};
void discovery_stats(const struct discovery *s, struct discovery_stats *out);

#endif
