/*
 * disco.h — the upstream's discovery, kept current (issue 30). Two readers:
 *
 *  - the catalog (catalog.h) asks which resources exist, whether they can be
 *    listed and watched, their kind and scope, and whether their group
 *    version is an aggregated API (an APIService with a service: never
 *    cached, always passed through), and is told when any of it changed
 *    (a CRD or APIService created, changed or deleted);
 *  - the serve room answers clients' discovery requests (/api, /apis,
 *    /api/v1, /apis/GROUP, /apis/GROUP/VERSION, plain and aggregated forms)
 *    from the copy: the upstream's bytes, its ETag, 304 on If-None-Match.
 *
 * The copy is refreshed at a bounded interval with If-None-Match (a 304
 * costs the upstream next to nothing) and at once when disco_refresh_soon
 * is called (a cache saw its resource vanish; a request named a resource
 * discovery does not have yet). proxy/upstream/disco.c does the fetching,
 * discodoc.h reads the documents.
 *
 * Threads: the loop that made it (the main loop) alone fetches and changes
 * it. Any thread may call disco_find, disco_ready, disco_refresh_soon,
 * disco_doc_get and disco_doc_unref (the serving loops: the catalog's
 * checks, kwc_may_answer, discovery answered from the copy); from another
 * thread a refresh and a record to fetch are posted to the loop, and
 * disco_find hands out no strings. Everything else is the loop's, and
 * disco_free comes once no serving loop runs.
 *
 * The model comes from aggregated discovery (GET /api and /apis, two
 * requests, ETags) or, from an upstream that answers the plain documents,
 * from /api, /apis and every /api/V and /apis/G/V; the APIService list
 * (apiregistration.k8s.io/v1, kwc's RBAC needs list on apiservices) is
 * read at the first refresh, after a change and every tenth refresh. A
 * group version aggregated discovery reports Stale (its extension server
 * away) lists no resource: its resources are ABSENT until it is back. A
 * refresh that fails (no answer, not a discovery document) keeps the
 * model as it was.
 */
#ifndef KWC_DISCO_H
#define KWC_DISCO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct up_client;
struct disco;

#define DISCO_INTERVAL_MS 30000 /* the default refresh interval */
#define DISCO_MIN_GAP_MS 1000   /* the default floor between two refreshes */
/* Its GETs in flight at once, on the upstream client's UP_POOL_DISCOVERY
 * (its own pool: over HTTP/1.1 the cache pool's connections are held by
 * watches); the pool's cap. */
#define DISCO_MAX_CONNS 4

struct disco_options {
    unsigned interval_ms; /* between two refreshes; 0: DISCO_INTERVAL_MS */
    unsigned min_gap_ms;  /* disco_refresh_soon never refreshes more often; 0: DISCO_MIN_GAP_MS */
};

/* What discovery says of one resource. Strings borrowed from the copy: valid
 * until the next change is published (the on_change callbacks). */
struct disco_res {
    const char *group, *version, *resource; /* "" group: core */
    const char *kind;
    bool namespaced;
    bool list, watch; /* verbs the upstream lists for it */
    bool aggregated;  /* its group version is served by an APIService with a service */
};

enum disco_found {
    DISCO_UNKNOWN, /* no discovery has succeeded yet: do not decide */
    DISCO_ABSENT,  /* the upstream does not serve it (the latest copy) */
    DISCO_PRESENT,
};

int disco_new(struct event_base *base, struct up_client *up, const struct disco_options *o,
              struct disco **out);
/* First fetch at once, then every interval. */
void disco_start(struct disco *d);
void disco_free(struct disco *d);

/* Look up group/version/resource (no subresource) in the latest copy; out
 * (may be NULL) gets the resource. A binary search. Any thread; from
 * another than the loop's, out's strings are NULL (the model may be
 * replaced once the call returns): only its flags are set. */
enum disco_found disco_find(const struct disco *d, const char *group, const char *version,
                            const char *resource, struct disco_res *out);
/* Every resource of the latest copy, in discovery's order: cb for each. */
void disco_each(const struct disco *d, void (*cb)(void *arg, const struct disco_res *r), void *arg);

/* on_change(arg) after a refresh that changed the set of resources or their
 * kind, scope, verbs or aggregation, or the set of group versions (not
 * after a 304), the first model included. The model is already the new one
 * when it runs; it may call disco_find and disco_refresh_soon. */
void disco_subscribe(struct disco *d, void (*on_change)(void *arg), void *arg);
/* Remove every subscription made with arg. */
void disco_unsubscribe(struct disco *d, void *arg);
/* Refresh soon (not before min_gap since the last one). Any thread. */
void disco_refresh_soon(struct disco *d);
/* A refresh has completed since start (disco_find decides). Any thread. */
bool disco_ready(const struct disco *d);

/*
 * ---- the copy: the upstream's answers to discovery requests ----
 *
 * Keyed by (path, Accept exactly as the client sent it): the upstream's
 * negotiation decides what each Accept gets (plain or aggregated, JSON or
 * protobuf, v2 or v2beta1), so kwc never guesses it. A key's first request
 * passes through, and kwc asks the upstream for the same key itself (GET,
 * that Accept, no query, kwc's credentials): its 200 is recorded, with the
 * headers that describe it. Each record is asked again every interval
 * while clients use it (If-None-Match when it has an ETag: a 304 keeps
 * it), and at once after discovery changed (it is not served until then).
 * A record whose refresh is answered with anything but 200 or 304 is
 * dropped; one whose refresh gets no answer (the upstream away) is kept.
 * Bounded: DISCO_COPY_MAX_DOCS records, DISCO_COPY_MAX_BYTES together,
 * DISCO_DOC_MAX_BYTES each; the least recently used go first.
 */
#define DISCO_COPY_MAX_DOCS 256
#define DISCO_COPY_MAX_BYTES ((size_t)64 << 20)
#define DISCO_DOC_MAX_BYTES ((size_t)16 << 20)
#define DISCO_ACCEPT_MAX 512 /* a longer Accept is never recorded */

struct disco_hdr {
    const char *name, *value;
};

/* One recorded answer (200). Immutable; the strings are the doc's. */
struct disco_doc {
    const char *body;
    size_t len;
    /* those of Content-Type, Etag, Vary, Cache-Control, Expires and
     * Last-Modified it had, named as received, in the order received */
    const struct disco_hdr *headers;
    size_t nheaders;
    const char *content_type, *etag; /* values among headers; NULL: absent */
};

/*
 * The copy's answer to GET path with this Accept (NULL: no Accept), with
 * a reference the caller drops with disco_doc_unref; NULL when the copy
 * has none that is current. path: /version, /api, /apis, /api/V, /apis/G
 * or /apis/G/V of a group version discovery knows (others: NULL, never
 * recorded). A miss on such a path records the key (see above). Any
 * thread (from a serving loop the record is made on the loop, soon); a
 * doc's reference may be dropped on any thread.
 */
const struct disco_doc *disco_doc_get(struct disco *d, const char *path, const char *accept);
void disco_doc_unref(const struct disco_doc *doc);

/* For /metrics (collect.c). */
struct disco_stats {
    bool ready, aggregated; /* aggregated: the upstream serves aggregated discovery */
    uint64_t refreshes;     /* rounds completed (the model read again) */
    uint64_t refresh_failures;
    uint64_t changes;      /* rounds that changed the model */
    uint64_t fetches;      /* GETs kwc sent for discovery (rounds and records) */
    uint64_t not_modified; /* of them answered 304 */
    uint64_t fetch_failures;
    uint64_t docs, doc_bytes;  /* the copy now */
    uint64_t resources;        /* in the model */
    uint64_t extension_gvs;    /* group versions an APIService serves from a service */
    double last_refresh_age_s; /* since the last round completed; -1: never */
};
void disco_stats(const struct disco *d, struct disco_stats *out);

#endif
