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
 * discovery does not have yet). Loop thread only.
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

/* Look up group/version/resource (no subresource) in the latest copy. */
enum disco_found disco_find(const struct disco *d, const char *group, const char *version,
                            const char *resource, struct disco_res *out);
/* Every resource of the latest copy, in discovery's order: cb for each. */
void disco_each(const struct disco *d, void (*cb)(void *arg, const struct disco_res *r), void *arg);

/* on_change(arg) after a refresh that changed the set of resources or their
 * kind, scope, verbs or aggregation, or the set of group versions (not
 * after a 304). The model is already the new one when it runs. */
void disco_subscribe(struct disco *d, void (*on_change)(void *arg), void *arg);
/* Remove every subscription made with arg. */
void disco_unsubscribe(struct disco *d, void *arg);
/* Refresh soon (not before min_gap since the last one). */
void disco_refresh_soon(struct disco *d);
/* A refresh has completed since start (disco_find decides). */
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
 * recorded). A miss on such a path records the key (see above).
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
    double last_refresh_age_s; /* since the last round completed; -1: never */
};
void disco_stats(const struct disco *d, struct disco_stats *out);

#endif
