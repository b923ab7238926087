/*
 * kinds.h — what kwc knows about resources ahead of discovery: the default
 * set it caches, and the fields each kind lets field selectors use (kube's
 * per-kind ToSelectableFields: pkg/registry/core/pod/strategy.go and friends).
 * Every resource also has metadata.name and metadata.namespace. Pure.
 */
#ifndef KWC_KINDS_H
#define KWC_KINDS_H

#include <stdbool.h>
#include <stddef.h>

#include "kwc/object.h"

/* The --resources list kwc used to default to (tests and benchmarks that
 * want a fixed set name it). */
#define KINDS_DEFAULT                                                                              \
    "v1/pods,v1/nodes,v1/namespaces,v1/services,v1/endpoints,v1/configmaps,v1/secrets,"            \
    "apps/v1/deployments,apps/v1/replicasets,apps/v1/daemonsets,apps/v1/statefulsets"

/* Default --resources-exclude: written often, rarely listed (every event a
 * write of kwc's, next to no read served). */
#define KINDS_EXCLUDE_DEFAULT "v1/events,events.k8s.io/v1/events,coordination.k8s.io/v1/leases"

/* Default --protobuf-resources: the protobuf caches that start with kwc,
 * by resource name (built-in groups): what kubelets, kube-proxy and node
 * agents read, in protobuf, so the first of them is served at once. */
#define KINDS_PB_DEFAULT                                                                           \
    "pods,nodes,services,endpoints,endpointslices,configmaps,secrets,namespaces,"                  \
    "persistentvolumes,persistentvolumeclaims,csidrivers,csinodes,runtimeclasses,networkpolicies"

/*
 * The selectable fields of group/resource, metadata.name and
 * metadata.namespace first. Unknown resources get those two only. The array
 * is static.
 */
const struct obj_field *kinds_fields(const char *group, const char *resource, size_t *n);

/* The field (an index into kinds_fields) the cache indexes for exact-match
 * field selectors, or -1: pods by spec.nodeName. */
int kinds_index_field(const char *group, const char *resource);

/* Is group served by kube-apiserver itself (typed objects: list items carry no
 * kind/apiVersion), as opposed to a custom resource (unstructured)? */
bool kinds_builtin_group(const char *group);

#endif
