/*
 * admit.h — the admission decision for a get, list or watch (DESIGN.md
 * "Serving rules"): can the cache answer this request, from which cache, in
 * which encoding, and what does the decision table (decide.h) say. One
 * decision for lists, gets (serve.c) and watches (watch.c) alike, made when
 * the request's head has been read.
 *
 *   method and verb   a GET of a resource's collection or object, no
 *                     subresource; a watch of a collection (a watch of one
 *                     object by name is the upstream's)
 *   encoding          kube's negotiation of Accept (route_negotiate): JSON,
 *                     or protobuf for built-in kinds; Table, YAML and Accept
 *                     parameters other than as/g/v/pretty are the upstream's;
 *                     pretty JSON (?pretty, a curl-like User-Agent, an
 *                     Accept clause's pretty=1) is served, indented (pretty);
 *                     a watch's events never are, the Status of its
 *                     error before the stream is the upstream's
 *   metadata only     a winning clause as=PartialObjectMetadataList (lists)
 *                     or as=PartialObjectMetadata (gets, watches);
 *                     g=meta.k8s.io;v=v1 (route_accept), JSON or protobuf:
 *                     served from the cache of that encoding with `meta`
 *                     set (the answer is derived, cache/pom.h); a custom
 *                     resource's in protobuf from its JSON cache
 *                     (pom_from_json: kwc keeps no protobuf cache of custom
 *                     resources); the other pairing (kube's 406) is the
 *                     upstream's
 *   cache             the one of the resource in that encoding (each
 *                     encoding has its own: protobuf answers are the
 *                     upstream's protobuf bytes); it must be serving; a
 *                     protobuf cache that has not started is to be started
 *                     (want), the request passes meanwhile
 *   path              a namespaced get names a namespace; a cluster-scoped
 *                     resource is served at its path and <path>/<name> only
 *   selectors         parsed (a collection's); over the parser's bounds, or
 *                     a field the cache cannot read: the upstream's
 *   decision table    decide_read (get, list) or decide_watch with the
 *                     cache's committed rv and floor; a watch from below the
 *                     floor is the upstream's (it may still hold the events);
 *                     an error kube would write in protobuf (a protobuf
 *                     request, or one that lists protobuf first for a custom
 *                     resource) is the upstream's too.
 *
 * Pure: no event loop, no clock, no socket, no allocation beyond the
 * result. The caches' state comes in through struct admit_caches: kwc's
 * reflectors and the store's committed rv (admit_refls_init), or a table in
 * tests. Loop thread (the reflectors' state is the writer loop's).
 */
#ifndef KWC_ADMIT_H
#define KWC_ADMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kwc/decide.h"
#include "kwc/enc.h"

struct refl;
struct refl_desc;
struct route_req;
struct sel;
struct store;

/* One cache as admission sees it. */
struct admit_cache {
    const struct refl_desc *d; /* group/version/resource, encoding, kind (NULL until
                                  discovered), scope, the fields it can read */
    bool started;              /* refl_started */
    bool serving;              /* refl_serving: synced and in service */
};

/* The caches to choose from. cache() and rv() are reads of state the
 * caller owns; rv() is asked once, for the cache chosen, and only when the
 * decision table needs it. */
struct admit_caches {
    size_t n;                         /* how many; or count() when set */
    size_t (*count)(const void *arg); /* a set that grows (refl_set) */
    void (*cache)(const void *arg, size_t i, struct admit_cache *out);
    /* Cache i's committed rv, and its history floor into *floor. */
    uint64_t (*rv)(const void *arg, size_t i, uint64_t *floor);
    const void *arg;
};

/* kwc's caches: the reflectors (borrowed, a set that grows), the store
 * holding their data. */
struct refl_set;
struct admit_refls {
    struct admit_caches c;
    const struct refl_set *set;
    struct store *st;
};
void admit_refls_init(struct admit_refls *ar, const struct refl_set *set, struct store *st);

/* The request. Everything borrowed for the call. */
struct admit_req {
    const struct route_req *r;
    const char *method;
    const char *accept;              /* NULL: no Accept header */
    const char *user_agent;          /* NULL: none */
    enum decide_too_large too_large; /* reads: a NotOlderThan wait that times out */
};

enum admit_action {
    ADMIT_PASS,  /* the upstream answers */
    ADMIT_ERROR, /* kwc answers dec's Status (JSON) */
    ADMIT_SERVE, /* kwc answers from cache `cache` as dec says */
};

/* Why a request passes (for logs). */
#define ADMIT_WHYS(X)                                                                              \
    X(ADMIT_WHY_NONE, "none")                                                                      \
    X(ADMIT_WHY_NOT_READ, "not_a_cached_read") /* method, verb, subresource, a watch by name */    \
    X(ADMIT_WHY_MEDIA, "media")                /* Accept kwc leaves to the upstream */             \
    X(ADMIT_WHY_NOT_CACHED, "not_cached")      /* no cache of the resource in the encoding */      \
    X(ADMIT_WHY_NOT_SERVING, "not_serving")    /* not synced, out of service, not started */       \
    X(ADMIT_WHY_PATH, "path")                  /* not a path kube serves the resource at */        \
    X(ADMIT_WHY_SELECTOR_BOUNDS, "selector_bounds") /* over the selector parser's bounds */        \
    X(ADMIT_WHY_TABLE, "decision_table")            /* dec.why says which cell */                  \
    X(ADMIT_WHY_BELOW_FLOOR, "below_floor")         /* a watch from before the history */          \
    X(ADMIT_WHY_ERROR_ENCODING,                                                                    \
      "error_encoding")                   /* an error kube writes otherwise (pb, indented) */      \
    X(ADMIT_WHY_FIELDS, "field_selector") /* a field the cache cannot read */

enum admit_why {
#define ADMIT_WHY_ENUM(e, s) e,
    ADMIT_WHYS(ADMIT_WHY_ENUM)
#undef ADMIT_WHY_ENUM
};

struct admit {
    enum admit_action action;
    enum admit_why why; /* ADMIT_PASS; else ADMIT_WHY_NONE */
    int cache;          /* the cache chosen (index into the caches), -1: none */
    enum kwc_enc enc;   /* the answer's encoding (meaningful once a cache is chosen): the
                           cache's, but for pom_from_json */
    bool want;          /* PASS: the cache has not started; start it (refl_want) */
    enum decide_verb verb;
    /* ERROR, SERVE: a collection's selector as parsed (new; it may select
     * everything), NULL for a get; the cache's rv and floor the table saw;
     * the table's answer (dec.body: the Status of an ERROR). */
    struct sel *sel;
    uint64_t current_rv, floor_rv;
    struct decide_result dec;
    bool bookmarks; /* a watch with allowWatchBookmarks true */
    bool meta;      /* metadata only: PartialObjectMetadata[List] (meta.k8s.io/v1) */
    /* metadata only in protobuf (enc KWC_ENC_PB) for a custom resource: the
     * cache chosen is its JSON one, the answer derived from it
     * (pom_pb_from_json) */
    bool pom_from_json;
    /* JSON indented as kube's pretty output (route_wants_pretty, or the
     * Accept clause's pretty=1); never for protobuf. Lists, gets and their
     * errors are indented; watch events never are (kube's watch encoder is
     * the stream serializer). */
    bool pretty;
    /* The Status of an error (ADMIT_ERROR, a get's 404, a wait's 504),
     * negotiated apart (route_accept_status): indented (error_pretty; also
     * WriteRawJSON's form when no clause fits), or the upstream's to write
     * (error_upstream: protobuf, YAML, parameters kwc does not write). */
    bool error_pretty, error_upstream;
};

/* Decide q against the caches. Fills *out (admit_fini releases it). Never
 * fails; aborts only on OOM. */
void admit_decide(const struct admit_req *q, const struct admit_caches *c, struct admit *out);
void admit_fini(struct admit *a);
/* The part of admit_decide that needs no cache: q is a read a cache could
 * answer (a get, list or watch kwc serves, in an encoding it writes), from
 * the cache of encoding *enc. */
bool admit_wants(const struct admit_req *q, enum kwc_enc *enc);

/* The cache of r's group/version/resource in encoding enc, or -1: a
 * discovered one, or one not started yet (a protobuf cache waiting for its
 * first request: not discovered, not serving). */
int admit_find(const struct admit_caches *c, const struct route_req *r, enum kwc_enc enc);

/* Every field the selector names is one the cache reads (kube would accept
 * it without conversion), so the cache can answer it; else the upstream
 * answers (it converts the field or refuses it). */
bool admit_serves_fields(const struct refl_desc *d, const struct sel *sel);

const char *admit_why_name(enum admit_why w);

#endif
