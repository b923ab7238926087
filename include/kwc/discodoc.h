/*
 * discodoc.h — the upstream's discovery documents read into a model of its
 * resources (disco.h keeps the model current; this is its pure part: no
 * I/O, no clock, unit-tested and fuzzed on its own).
 *
 * The documents (k8s.io/apimachinery meta/v1 and k8s.io/api apidiscovery):
 *  - APIGroupDiscoveryList (apidiscovery.k8s.io v2 or v2beta1, aggregated
 *    discovery: `GET /api` and `GET /apis` with its Accept): every group,
 *    version and resource at once; items[].metadata.name is the group ("" or
 *    absent: core), versions[].resources[] hold resource, responseKind.kind,
 *    scope (Namespaced | Cluster) and verbs;
 *  - APIVersions (`/api`, plain): versions[] of the core group;
 *  - APIGroupList (`/apis`, plain): groups[].name and versions[].version;
 *  - APIResourceList (`/api/v1`, `/apis/G/V`): groupVersion and resources[]
 *    with name, kind, namespaced and verbs (names holding '/' are
 *    subresources: not resources of their own);
 *  - APIServiceList (apiregistration.k8s.io/v1): the group versions whose
 *    APIService has spec.service set (served by an extension server: the
 *    aggregated APIs kwc never caches).
 *
 * A model is built by adding documents (ddoc_add), then frozen
 * (ddoc_freeze) to be looked up. Sizes are bounded by the caller (the
 * bytes it read); here every count is bounded by DDOC_MAX_RESOURCES and
 * DDOC_MAX_GVS and every string by DDOC_MAX_NAME.
 */
#ifndef KWC_DISCODOC_H
#define KWC_DISCODOC_H

#include <stdbool.h>
#include <stddef.h>

#include "kwc/disco.h"

#define DDOC_MAX_RESOURCES 20000 /* resources in one model */
#define DDOC_MAX_GVS 4000        /* group versions in one model */
#define DDOC_MAX_NAME 512        /* bytes of a group, version, resource or kind */

enum ddoc_kind {
    DDOC_INVALID,     /* not JSON, or not one of the kinds below */
    DDOC_AGGREGATED,  /* APIGroupDiscoveryList */
    DDOC_VERSIONS,    /* APIVersions */
    DDOC_GROUPS,      /* APIGroupList */
    DDOC_RESOURCES,   /* APIResourceList */
    DDOC_APISERVICES, /* APIServiceList */
};

/* One group version ("" group: core). */
struct ddoc_gv {
    const char *group, *version;
};

/* What discovery says: resources and group versions in discovery's order.
 * Strings are owned by the model (its pool); res[i] and gvs[i] point there. */
struct ddoc_model {
    struct disco_res *res;
    size_t nres, capres;
    struct ddoc_gv *gvs;
    size_t ngvs, capgvs;
    char **pool;
    size_t npool, cappool;
    size_t *index; /* ddoc_freeze: res sorted by (group, version, resource) */
    bool frozen;
};

void ddoc_model_init(struct ddoc_model *m);
void ddoc_model_fini(struct ddoc_model *m);

/*
 * Add what the document p[0..n) says to m (not frozen): resources and
 * their group versions (AGGREGATED, RESOURCES), group versions only
 * (VERSIONS, GROUPS); an APIServiceList adds nothing (ddoc_apiservices
 * reads it). Returns its kind; DDOC_INVALID leaves m as it was and says
 * why in err. Entries without a name are skipped; a resource already in m
 * (the same group, version and name) is kept once.
 */
enum ddoc_kind ddoc_add(struct ddoc_model *m, const char *p, size_t n, char *err, size_t errlen);

/*
 * An APIServiceList: the group versions whose APIService has spec.service
 * set, added to out's group versions (out is used as a list of them).
 * Returns their count, or -1 (not an APIServiceList; out unchanged) with
 * err.
 */
int ddoc_apiservices(struct ddoc_model *out, const char *p, size_t n, char *err, size_t errlen);

/* Mark aggregated each resource of m whose group version is one of
 * agg's group versions (ddoc_apiservices); the others not. */
void ddoc_mark_aggregated(struct ddoc_model *m, const struct ddoc_model *agg);

/* Sort the lookup index; m is read-only afterwards. */
void ddoc_freeze(struct ddoc_model *m);

/* Lookups (m frozen). NULL: none. */
const struct disco_res *ddoc_find(const struct ddoc_model *m, const char *group,
                                  const char *version, const char *resource);
bool ddoc_has_gv(const struct ddoc_model *m, const char *group, const char *version);
bool ddoc_has_group(const struct ddoc_model *m, const char *group);

/* The same resources with the same kind, scope, verbs and aggregation, in
 * the same order. */
bool ddoc_same(const struct ddoc_model *a, const struct ddoc_model *b);

#endif
