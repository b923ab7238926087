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

/* Default --resources: group/version/resource ("" group for core). */
#define KINDS_DEFAULT                                                                              \
    "v1/pods,v1/nodes,v1/namespaces,v1/services,v1/endpoints,v1/configmaps,v1/secrets,"            \
    "apps/v1/deployments,apps/v1/replicasets,apps/v1/daemonsets,apps/v1/statefulsets"

/* Default --protobuf-resources: the protobuf caches that start with kwc (the
 * kinds kubelets and kube-proxy read in protobuf), of those in --resources. */
#define KINDS_PB_DEFAULT                                                                           \
    "pods,nodes,services,endpoints,endpointslices,configmaps,secrets,namespaces,"                  \
    "persistentvolumes,persistentvolumeclaims"

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
