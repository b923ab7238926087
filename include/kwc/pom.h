/* TEMPORARY stub of helper "meta"'s pom.h (the brief's API), reverted when
 * wt-meta's pom lands. */
#ifndef KWC_POM_H
#define KWC_POM_H

#include <stdbool.h>
#include <stddef.h>

#include "kwc/gostr.h"

#define POM_API_VERSION "meta.k8s.io/v1"
#define POM_KIND "PartialObjectMetadata"

int pom_json(struct gostr_buf *b, const void *item, size_t len, bool unstructured);
int pom_pb(struct gostr_buf *b, const void *msg, size_t len);

#endif
