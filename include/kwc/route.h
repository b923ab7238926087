/*
 * route.h — the "parse" stage of the request path: what a request addresses
 * (API group/version/resource/namespace/name/subresource, the verb kube-apiserver
 * would assign) and the list/watch query parameters, decoded the way
 * kube-apiserver decodes them (k8s.io/apiserver RequestInfoFactory and the
 * ListOptions parameter codec). Pure: no I/O. Every parser of client bytes here
 * is bounded and fuzzed (tests/fuzz/route_fuzz.c).
 */
#ifndef KWC_ROUTE_H
#define KWC_ROUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kwc/decide.h"

#define ROUTE_MAX_TARGET                                                                           \
    (16 * 1024 * 1024) /* path + query bytes accepted (the front end bounds heads by               \
                          --max-header-bytes first) */

#define ROUTE_VERBS(X)                                                                             \
    X(ROUTE_GET, "get")                                                                            \
    X(ROUTE_LIST, "list")                                                                          \
    X(ROUTE_WATCH, "watch")                                                                        \
    X(ROUTE_CREATE, "create")                                                                      \
    X(ROUTE_UPDATE, "update")                                                                      \
    X(ROUTE_PATCH, "patch")                                                                        \
    X(ROUTE_DELETE, "delete")                                                                      \
    X(ROUTE_DELETECOLLECTION, "deletecollection")                                                  \
    X(ROUTE_PROXY, "proxy")                                                                        \
    X(ROUTE_OTHER, "other")

enum route_verb {
#define ROUTE_VERB_ENUM(e, s) e,
    ROUTE_VERBS(ROUTE_VERB_ENUM)
#undef ROUTE_VERB_ENUM
};

/* Query parameters that matter to the cache; values percent-decoded. A field is
 * NULL when the parameter is absent (an empty value is ""). First value wins,
 * like Go's url.Values.Get. */
struct route_query {
    const char *resource_version;
    const char *resource_version_match;
    const char *limit;
    const char *continue_token;
    const char *label_selector;
    const char *field_selector;
    const char *timeout_seconds;
    const char *watch;                 /* raw; see route_req.verb */
    const char *allow_watch_bookmarks; /* raw; kwc_query_bool() */
    const char *send_initial_events;   /* raw; kwc_query_bool() */
    const char *pretty;                /* raw; route_wants_pretty() */
};

struct route_req {
    bool is_resource;     /* an /api or /apis resource request */
    enum route_verb verb; /* meaningful when is_resource */
    bool legacy_watch;    /* /api/v1/watch/... or /apis/G/V/watch/... */
    const char *path;     /* decoded path */
    const char *group;    /* "" for the core group */
    const char *version;
    const char *resource;   /* NULL for /api/v1 itself etc. */
    const char *namespace_; /* NULL when cluster-wide */
    const char *name;
    const char *subresource;
    struct route_query q;
    char *arena_; /* owns every string above */
};

/*
 * Parse an HTTP method and request target ("/api/v1/pods?watch=1").
 * Fills *out (route_fini() releases it, also after failure).
 * Returns 0, KWC_ETOOBIG (target over ROUTE_MAX_TARGET) or KWC_EPARSE (bad
 * percent-encoding in the path, or a target that is not an absolute path). A
 * query pair with a bad escape or a ';' is ignored, as Go's net/http does.
 */
int route_parse(const char *method, const char *target, size_t len, struct route_req *out);
void route_fini(struct route_req *r);

const char *route_verb_name(enum route_verb v);

/*
 * The encoding kube-apiserver would answer in, by its negotiation
 * (apiserver/pkg/endpoints/handlers/negotiation + goautoneg): an absent or
 * empty Accept gets JSON; else the clauses are tried most specific first
 * (type and subtype before wildcards, in the header's order otherwise) and
 * the first that names a serializer wins: application/json, then
 * application/vnd.kubernetes.protobuf when `protobuf` (built-in kinds; custom
 * resources have none and fall through to the next clause), application/\*
 * and \*\/\* meaning JSON. Types are compared as Go compares them (exactly).
 * ROUTE_MEDIA_OTHER: anything kwc leaves to the upstream's negotiation — a
 * clause with parameters (as=Table, q=, stream=, pretty=), YAML, or no clause
 * kube would accept (its 406).
 */
enum route_media { ROUTE_MEDIA_JSON, ROUTE_MEDIA_PROTOBUF, ROUTE_MEDIA_OTHER };
enum route_media route_negotiate(const char *accept, bool protobuf);

/*
 * The winning Accept clause as kube-apiserver picks it, parameters included
 * (negotiation.NegotiateMediaTypeOptions over goautoneg.ParseAccept): clauses
 * split on ',' and ';', trimmed of spaces only; a clause whose type is not
 * "t/s" (or "*") and a parameter that is not one "k=v" are skipped; q= orders
 * the clauses with goautoneg's Less (q, then specific types before
 * wildcards; insertion order otherwise, as Go's sort does for <= 12 clauses)
 * and is not a parameter; each clause is tried against the serializers in
 * kube's order (json, yaml, protobuf), and the first one whose parameters
 * acceptMediaTypeOptions admits wins: as=/g=/v= must name Table (json and
 * yaml only), PartialObjectMetadata or PartialObjectMetadataList in
 * meta.k8s.io v1 or v1beta1, and stream= (when non-empty) "watch" on json or
 * protobuf; other parameters are kept, unrecognised.
 *
 * media is JSON or PROTOBUF when kwc can answer the winner itself: no
 * parameters beyond as/g/v/pretty, no conversion but as=PartialObjectMetadata
 * [List];g=meta.k8s.io;v=v1 (then `as`). A plain protobuf clause is
 * refused for a custom resource (!protobuf: its StandardSerializers are
 * JSON and YAML, RequestScope.AllowsMediaTypeTransform), so the next clause
 * wins; its metadata in protobuf is accepted. Else OTHER: YAML, Table, v1beta1,
 * stream=, sv=, unknown parameters, no acceptable clause (kube falls back or
 * answers 406), over ROUTE_ACCEPT_MAX_CLAUSES clauses: the upstream decides.
 * pretty: the winner has pretty=1. An absent or empty header is JSON.
 */
#define ROUTE_ACCEPT_MAX_CLAUSES 12
enum route_as { ROUTE_AS_NONE, ROUTE_AS_POM, ROUTE_AS_POML };
struct route_accept {
    enum route_media media;
    enum route_as as;
    bool pretty;
    bool none; /* no clause was acceptable (media OTHER) */
};
void route_accept(const char *accept, bool protobuf, struct route_accept *out);

/*
 * The same for a Status error (responsewriters.ErrorNegotiated): negotiated
 * again with DefaultEndpointRestrictions, so a clause asking for a
 * conversion (as=) is not acceptable (stream=watch is, but for YAML, and
 * leaves the Status to the upstream: media OTHER); protobuf is. When none is
 * (`none`), kube writes the Status with WriteRawJSON: indented as pretty
 * output, no newline. A metadata-only request whose Accept has no other
 * clause gets its errors that way.
 */
void route_accept_status(const char *accept, struct route_accept *out);

/*
 * kube-apiserver's isPrettyPrint (handlers/responsewriters): ?pretty= decides
 * when present and non-empty (strconv.ParseBool; unparsable is false), else a
 * User-Agent starting with "curl", "Wget" or "Mozilla/5.0" gets indented JSON.
 */
bool route_wants_pretty(const struct route_query *q, const char *user_agent);

/* The decision table's view (decide.h) of a routed list, get or watch. */
void route_decide_req(const struct route_req *r, enum decide_verb verb, bool has_selector,
                      const char *selector_error, struct decide_req *out);

#endif
