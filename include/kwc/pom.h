/*
 * pom.h — PartialObjectMetadata (meta.k8s.io/v1) derived from a stored item,
 * for metadata-only answers (Accept ...;as=PartialObjectMetadata[List];
 * g=meta.k8s.io;v=v1). Nothing is stored twice: the metadata is taken from
 * the bytes the cache keeps, as kube-apiserver's asPartialObjectMetadata
 * (handlers/response.go, meta.AsPartialObjectMetadata) builds it:
 *
 *  - built-in kinds (typed): the item's "metadata" value IS the typed
 *    ObjectMeta encoding, so it is copied verbatim;
 *  - custom resources (unstructured): ObjectMeta is rebuilt through the
 *    Unstructured accessors (GetName, GetLabels, ...) and encoded as the typed
 *    struct is: Go struct field order, omitempty, maps sorted, creationTimestamp
 *    null when zero, unknown keys dropped, values of the wrong type read as
 *    the accessor reads them (zero);
 *  - protobuf: every kube object message carries its ObjectMeta as field 1,
 *    and PartialObjectMetadata is {1: ObjectMeta}, so field 1 is copied;
 *  - protobuf for custom resources (kwc keeps them in JSON only): the
 *    ObjectMeta rebuilt as for the JSON form, then written as kube's gogo
 *    marshaller writes the typed struct.
 *
 * Pure. Input is upstream bytes the cache has checked; every read is bounded
 * by len all the same.
 */
#ifndef KWC_POM_H
#define KWC_POM_H

#include <stdbool.h>
#include <stddef.h>

#include "kwc/gostr.h"

/* The TypeMeta of the answers. */
#define POM_API_VERSION "meta.k8s.io/v1"
#define POM_KIND "PartialObjectMetadata"
#define POM_LIST_KIND "PartialObjectMetadataList"

/* Append the JSON PartialObjectMetadata of a stored JSON item (list-item form for
 * built-in kinds, a full object for custom resources) to b, without newline:
 * {"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":M}.
 * Built-in: M is the item's metadata bytes verbatim; unstructured: ObjectMeta
 * re-encoded in Go struct order as kube's typed ObjectMeta would be.
 * 0, or -1 (nothing appended) when the item is not a JSON object. */
int pom_json(struct gostr_buf *b, const void *item, size_t len, bool unstructured);
/* Append the protobuf PartialObjectMetadata message of a stored protobuf object
 * message (no envelope) to b: field 1 copied. 0, or -1 when malformed. */
int pom_pb(struct gostr_buf *b, const void *msg, size_t len);
/* Append the protobuf PartialObjectMetadata message (no envelope) of a stored
 * JSON custom-resource object to b: {1: ObjectMeta} as kube-apiserver writes
 * it for that object (metav1.PartialObjectMetadata built through the
 * Unstructured accessors, as pom_json's unstructured form, then protobuf:
 * timestamps as {seconds, nanos 0}). 0, or -1 (nothing
 * appended) exactly where pom_json(unstructured) fails. */
int pom_pb_from_json(struct gostr_buf *b, const void *item, size_t len);

#endif
