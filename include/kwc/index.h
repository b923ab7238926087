/*
 * index.h — the index bytes stored beside each cached object: its labels and
 * the values of its resource's selectable fields, so that list filtering and
 * watch fan-out match selectors without parsing the object's JSON again.
 *
 * Layout: u16 n_labels | u16 n_fields | n_labels x (key NUL value NUL)
 *         | n_fields x (value NUL). Strings are NUL-terminated inside the
 * buffer, so a view points into it (e.g. into LMDB's map) without copying.
 * Pure.
 */
#ifndef KWC_INDEX_H
#define KWC_INDEX_H

#include <stddef.h>

#include "kwc/object.h"
#include "kwc/selector.h"

#define IDX_MAX_LABELS 65535
#define IDX_MAX_FIELDS 64

/* Encode m's labels and field values (new buffer, caller frees).
 * Returns 0 or KWC_ETOOBIG. */
int idx_encode(const struct obj_meta *m, char **out, size_t *out_len);

/* Selector inputs over one index buffer. Reused across objects: its arrays
 * grow as needed and are freed by idx_view_fini. */
struct idx_view {
    const char **lkeys, **lvals, **fvals;
    size_t lcap;
    struct sel_labels labels;
    struct sel_fields fields;
};

/*
 * Point v at the labels and fields in buf (borrowed: valid while buf is).
 * field_names names the resource's fields in the order they were encoded
 * (borrowed, must outlive the use of v). Returns 0 or KWC_EPARSE for a
 * malformed buffer (never trusted: it comes from disk).
 */
int idx_view_load(struct idx_view *v, const void *buf, size_t len, const char *const *field_names,
                  size_t n_fields);
void idx_view_fini(struct idx_view *v);

/* The value of field i in buf without building a view (for indexes), or NULL. */
const char *idx_field(const void *buf, size_t len, size_t i);

#endif
