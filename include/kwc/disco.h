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

struct event_base;
struct up_client;
struct disco;

struct disco_options {
    unsigned interval_ms; /* between two refreshes; 0: the default (30 s) */
    unsigned min_gap_ms;  /* disco_refresh_soon never refreshes more often; 0: 1 s */
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
 * kind, scope, verbs or aggregation (not after a 304). */
void disco_subscribe(struct disco *d, void (*on_change)(void *arg), void *arg);
/* Refresh soon (not before min_gap since the last one). */
void disco_refresh_soon(struct disco *d);
/* A refresh has completed since start (disco_find decides). */
bool disco_ready(const struct disco *d);

#endif
