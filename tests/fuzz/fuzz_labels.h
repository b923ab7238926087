/*
 * fuzz_labels.h — one check object_fuzz and pb_fuzz share: the labels read
 * back from the index bytes the store keeps beside an object (idx_encode,
 * idx_view_load: what selectors match) are the parsed object's, in order.
 */
#ifndef KWC_FUZZ_LABELS_H
#define KWC_FUZZ_LABELS_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/index.h"
#include "kwc/object.h"

static inline bool
fuzz_index_labels_ok(const struct obj_meta *m)
{
    char *buf;
    size_t len;
    if (idx_encode(m, &buf, &len) != 0)
        return false;
    struct idx_view v = {0};
    bool ok = idx_view_load(&v, buf, len, NULL, 0) == 0 && v.labels.n == m->n_labels;
    for (size_t i = 0; ok && i < m->n_labels; i++)
        ok = strcmp(v.labels.keys[i], m->labels[i].key) == 0 &&
             strcmp(v.labels.values[i], m->labels[i].value) == 0;
    idx_view_fini(&v);
    free(buf);
    return ok;
}

#endif
