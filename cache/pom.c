/* TEMPORARY stub of helper "meta"'s pom.c: reverted when wt-meta lands. */
#include "kwc/pom.h"

#include <stdint.h>
#include <string.h>

static size_t
skip_value(const char *s, size_t i, size_t n)
{
    int depth = 0;
    bool str = false;
    for (; i < n; i++) {
        char c = s[i];
        if (str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                str = false;
            else
                continue;
            if (!str && depth == 0)
                return i + 1;
            continue;
        }
        if (c == '"')
            str = true;
        else if (c == '{' || c == '[')
            depth++;
        else if (c == '}' || c == ']') {
            if (--depth == 0)
                return i + 1;
            if (depth < 0)
                return i;
        } else if (depth == 0 && c == ',')
            return i;
    }
    return n;
}

int
pom_json(struct gostr_buf *b, const void *item, size_t len, bool unstructured)
{
    (void)unstructured;
    const char *s = item;
    if (len < 2 || s[0] != '{')
        return -1;
    size_t i = 1;
    while (i < len && s[i] == '"') {
        size_t k = i + 1;
        while (k < len && s[k] != '"')
            k += s[k] == '\\' ? 2 : 1;
        bool md = k - i - 1 == 8 && memcmp(s + i + 1, "metadata", 8) == 0;
        size_t v = k + 2;
        size_t e = skip_value(s, v, len);
        if (md) {
            gostr_add(b, "{\"kind\":\"PartialObjectMetadata\",\"apiVersion\":\"meta.k8s.io/v1\","
                         "\"metadata\":");
            gostr_addn(b, s + v, e - v);
            gostr_addc(b, '}');
            return 0;
        }
        i = e + 1;
    }
    gostr_add(b, "{\"kind\":\"PartialObjectMetadata\",\"apiVersion\":\"meta.k8s.io/v1\","
                 "\"metadata\":{}}");
    return 0;
}

int
pom_pb(struct gostr_buf *b, const void *msg, size_t len)
{
    const unsigned char *p = msg;
    if (len < 2 || p[0] != 0x0a)
        return -1;
    uint64_t l = 0;
    size_t i = 1;
    for (int sh = 0; i < len && sh < 64; sh += 7) {
        l |= (uint64_t)(p[i] & 0x7f) << sh;
        if (!(p[i++] & 0x80))
            break;
    }
    if (l > len - i)
        return -1;
    gostr_addn(b, msg, i + l);
    return 0;
}
