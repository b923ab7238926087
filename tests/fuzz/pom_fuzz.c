/*
 * pom_fuzz.c — libFuzzer target for cache/pom.c: stored bytes through
 * pom_json (built-in and unstructured) and pom_pb, with exact-length copies so
 * ASan sees any read past the end. Oracles (jansson):
 *  - whatever pom_json writes is one JSON object with the PartialObjectMetadata
 *    TypeMeta;
 *  - built-in: when jansson reads the input as an object whose "metadata" is
 *    an object, the answer's metadata equals it;
 *  - unstructured: every object jansson reads (no NUL, no number out of
 *    range) gets an answer, and the answer's metadata is an object.
 * pom_pb: the answer is field 1 and its length, nothing else.
 */
#include "kwc/pom.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
check(bool cond)
{
    if (!cond)
        abort();
}

static json_t *
answer(const char *in, size_t size, bool unstructured)
{
    struct gostr_buf b = {0};
    int rc = pom_json(&b, in, size, unstructured);
    check(rc == 0 || rc == -1);
    if (rc != 0) {
        check(b.len == 0);
        free(gostr_take(&b));
        return NULL;
    }
    json_error_t e;
    json_t *j = json_loadb(b.p, b.len, JSON_ALLOW_NUL, &e);
    free(gostr_take(&b));
    return j;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *in = xmalloc(size ? size : 1);
    memcpy(in, data, size);
    json_error_t e;
    json_t *src = memchr(in, '\0', size) ? NULL : json_loadb(in, size, JSON_REJECT_DUPLICATES, &e);
    json_t *src_md = json_is_object(src) ? json_object_get(src, "metadata") : NULL;

    for (int u = 0; u < 2; u++) {
        struct gostr_buf b = {0};
        int rc = pom_json(&b, in, size, u);
        free(gostr_take(&b));
        json_t *j = rc == 0 ? answer(in, size, u) : NULL;
        if (rc == 0 && (u || json_is_object(src_md) || !src)) {
            /* a verbatim copy of garbage metadata is garbage: judged only
             * when the input itself is an object */
            if (src || u) {
                check(json_is_object(j));
                check(json_is_string(json_object_get(j, "kind")) &&
                      !strcmp(json_string_value(json_object_get(j, "kind")), POM_KIND));
                check(json_is_object(json_object_get(j, "metadata")));
            }
        }
        if (!u && json_is_object(src_md) && src)
            check(rc == 0 && json_equal(json_object_get(j, "metadata"), src_md));
        if (u && json_is_object(src))
            check(rc == 0);
        json_decref(j);
    }

    struct gostr_buf b = {0};
    if (pom_pb(&b, in, size) == 0) {
        check(b.len >= 2 && (unsigned char)b.p[0] == 0x0a && b.len <= size + 11);
    } else {
        check(b.len == 0);
    }
    free(gostr_take(&b));
    json_decref(src);
    free(in);
    return 0;
}
