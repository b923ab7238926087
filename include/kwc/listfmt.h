/*
 * listfmt.h — the bytes kube-apiserver writes around the items of a JSON list
 * and around a single object, so that kwc can stream cached item bytes
 * between them without re-encoding anything.
 *
 * Built-in kinds (typed XxxList, json.Encoder): TypeMeta, then ListMeta with
 * resourceVersion, continue, remainingItemCount (omitempty), then items:
 *   {"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7",
 *    "continue":"...","remainingItemCount":3},"items":[ ... ]}\n
 * Custom resources (UnstructuredList: a map, keys sorted, metadata.continue
 * always present because UpdateList sets it even when empty):
 *   {"apiVersion":"x/v1","items":[ ... ],"kind":"FooList","metadata":
 *    {"continue":"","remainingItemCount":3,"resourceVersion":"7"}}\n
 * Items are stored in list-item form: built-in items without kind/apiVersion
 * (kubernetes#3030), custom resources with them. A GET of a built-in object
 * puts its TypeMeta back in front.
 * Pure.
 */
#ifndef KWC_LISTFMT_H
#define KWC_LISTFMT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct listfmt {
    const char *list_kind;   /* "PodList" */
    const char *kind;        /* "Pod" */
    const char *api_version; /* "v1", "apps/v1" */
    bool unstructured;       /* custom resource: sorted map layout */
};

/* ListMeta of one response. cont NULL: none; remaining < 0: none. */
struct listfmt_meta {
    uint64_t rv;
    const char *cont;
    int64_t remaining;
};

/*
 * Head (everything before the first item) and tail (everything after the
 * last, newline included) of a list. For built-in kinds the whole ListMeta
 * is in the head, for custom resources in the tail; f->unstructured says
 * which (for a built-in kind the caller must know continue and
 * remainingItemCount before the first byte). New strings; caller frees.
 */
char *listfmt_head(const struct listfmt *f, const struct listfmt_meta *m, size_t *len);
char *listfmt_tail(const struct listfmt *f, const struct listfmt_meta *m, size_t *len);

/*
 * The GET form of a stored item: for built-in kinds `{"kind":K,"apiVersion":V,`
 * then the item without its leading '{' (an item not starting with '{' is
 * returned as is); for custom resources the item itself. A newline follows,
 * as json.Encoder writes it. New buffer; caller frees.
 */
char *listfmt_object(const struct listfmt *f, const void *item, size_t len, size_t *out_len);

#endif
