/*
 * selector.h — label and field selectors of list and watch requests, parsed
 * and matched as kube-apiserver does (k8s.io/apimachinery pkg/labels
 * Parse and pkg/fields ParseSelector, as of Kubernetes 1.27-1.33).
 *
 * On the data path: proxy/ parses ?labelSelector= and ?fieldSelector= once
 * per request; the store and the hub match every object against the parsed
 * selector (per object, per watcher), so matching allocates nothing.
 * Pure: no I/O. The parser is bounded and fuzzed (tests/fuzz/selector_fuzz.c).
 */
#ifndef KWC_SELECTOR_H
#define KWC_SELECTOR_H

#include <stdbool.h>
#include <stddef.h>

/* Bounds on what a client may send (kube has none besides its URL limit).
 * Past them sel_parse answers KWC_ETOOBIG. */
#define SEL_MAX_LEN 16384 /* bytes per selector string */
#define SEL_MAX_TERMS 256 /* label requirements, or field terms, per selector */

/* A parsed label selector and field selector pair; immutable once parsed,
 * so several threads may match against one concurrently. */
struct sel;

/*
 * Parse a request's label selector and field selector; NULL or "" means
 * "everything", and so does a selector kube parses to no requirement (a blank
 * label selector, a field selector of commas or "="). The strings are the
 * decoded query values; they are copied.
 *
 * Returns 0 and sets *out (new; sel_free), or:
 *   KWC_EPARSE   kube rejects the selector: *err (new; free()) is the message
 *                kube-apiserver puts in its 400 BadRequest Status, e.g.
 *                "unable to parse requirement: found '', expected: identifier"
 *                (the label selector is checked first, as kube does).
 *   KWC_ETOOBIG  over SEL_MAX_LEN or SEL_MAX_TERMS; *err says which.
 * err may be NULL; on success *err is set to NULL.
 *
 * Field names are not checked here: kube answers 400 "field label not
 * supported: X" for a field the resource does not index, and only the caller
 * knows the resource (see sel_field_name).
 */
int sel_parse(const char *label_selector, const char *field_selector, struct sel **out, char **err);
void sel_free(struct sel *s);

/* True when the selector restricts nothing (kube's Selector.Empty() on both). */
bool sel_is_everything(const struct sel *s);

/*
 * An object's labels, and the values of the fields the cache indexes for its
 * resource, supplied by the caller (borrowed for the call). Keys and names are
 * unique within a set. A missing label is absent; a missing field reads as ""
 * (kube's fields.Set.Get). A NULL set is empty.
 */
struct sel_labels {
    const char *const *keys;
    const char *const *values;
    size_t n;
};
struct sel_fields {
    const char *const *names;
    const char *const *values;
    size_t n;
};

/* Does the object match both selectors? Allocation-free. As in kube, "!=" and
 * "notin" match an object without the label, "in", "=", ">" and "<" need it. */
bool sel_matches(const struct sel *s, const struct sel_labels *l, const struct sel_fields *f);

/*
 * The value the field selector pins `field` to with "=" or "==" (for
 * "spec.nodeName=node-1", "node-1"), or NULL: fields.Selector.RequiresExactMatch,
 * which the store uses to pick an index. With several such terms on one field
 * the first in kube's (sorted) order wins. Valid until sel_free.
 */
const char *sel_requires_exact(const struct sel *s, const char *field);

/*
 * The distinct field names the field selector uses, in the order kube-apiserver
 * converts them, so the first one the resource does not support is the one kube
 * names in "field label not supported: X". Names are valid until sel_free.
 */
size_t sel_field_count(const struct sel *s);
const char *sel_field_name(const struct sel *s, size_t i);

#endif
