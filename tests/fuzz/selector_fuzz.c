/*
 * selector_fuzz.c — libFuzzer target for sel_parse and sel_matches (the
 * labelSelector and fieldSelector query values straight from clients).
 *
 * Input: the label selector, then a NUL or newline, then the field selector
 * (each copied into a buffer of its exact length plus the terminator, so ASan
 * sees any read past it). Every result is checked against selector.h's
 * contract: a known return code, a message exactly when parsing failed, and a
 * parsed selector that behaves consistently on a small fixed object.
 */
#include "kwc/selector.h"

#include "kwc/base.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const lkeys[] = {"app", "tier", "k8s.io/name", "n", "empty"};
    static const char *const lvals[] = {"web", "frontend", "x", "42", ""};
    static const char *const fnames[] = {"metadata.name", "metadata.namespace", "spec.nodeName",
                                         "status.phase"};
    static const char *const fvals[] = {"pod-1", "default", "node-1", "Running"};
    static const struct sel_labels labels = {lkeys, lvals, KWC_ARRAY_LEN(lkeys)};
    static const struct sel_labels nolabels = {NULL, NULL, 0};
    static const struct sel_fields fields = {fnames, fvals, KWC_ARRAY_LEN(fnames)};

    size_t cut = 0;
    while (cut < size && data[cut] != '\0' && data[cut] != '\n')
        cut++;
    char *label = xstrndup((const char *)data, cut);
    char *field = NULL;
    if (cut < size) {
        /* the field part ends at its first NUL, as a C string would */
        const char *f = (const char *)data + cut + 1;
        field = xstrndup(f, strnlen(f, size - cut - 1));
    }

    struct sel *s = NULL;
    char *err = NULL;
    int rc = sel_parse(label, field, &s, &err);
    if (rc != 0 && rc != KWC_EPARSE && rc != KWC_ETOOBIG)
        abort();
    if ((rc == 0) != (s != NULL) || (rc == 0) != (err == NULL))
        abort();
    if (rc == 0) {
        bool m = sel_matches(s, &labels, &fields);
        (void)sel_matches(s, &nolabels, NULL);
        if (sel_is_everything(s) && (!m || sel_field_count(s) != 0))
            abort();
        size_t n = sel_field_count(s);
        if (n > SEL_MAX_TERMS || sel_field_name(s, n) != NULL)
            abort();
        bool uses_node = false;
        for (size_t i = 0; i < n; i++) {
            const char *name = sel_field_name(s, i);
            if (!name)
                abort();
            uses_node |= strcmp(name, "spec.nodeName") == 0;
            const char *v = sel_requires_exact(s, name);
            if (v)
                (void)strlen(v);
        }
        /* a pinned field is one the selector uses, and pins the match */
        const char *node = sel_requires_exact(s, "spec.nodeName");
        if (node && (!uses_node || (m && strcmp(node, "node-1") != 0)))
            abort();
    } else if (strlen(err) == 0) {
        abort();
    }
    free(err);
    sel_free(s);
    free(label);
    free(field);
    return 0;
}
