/*
 * cont_fuzz.c — libFuzzer target for cont_decode (?continue= tokens straight
 * from clients) and cont_encode.
 *
 * Input: the whole input is a token, passed with its exact length and no NUL
 * so ASan sees any read past it; it is also used as a key to encode (rv from
 * its first byte). Every result is checked against cont.h's contract: a known
 * return code, KWC_ETOOBIG exactly past CONT_MAX_TOKEN, and on success a
 * token rv != 0 with a NUL-terminated start key that cannot climb above the
 * prefix; an encoded token stays in the alphabet and within the bound, and
 * decodes back to its rv and key + NUL when the key is one plain element.
 */
#include "kwc/cont.h"

#include "kwc/base.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
check_decoded(const struct cont_token *t)
{
    if (t->rv == 0 || !t->start || t->start[t->start_len] != '\0')
        abort();
    /* path.Clean left it alone: no leading '/', no empty, "." or ".." element */
    const char *k = t->start;
    size_t n = t->start_len;
    if (n > 0 && (k[0] == '/' || k[n - 1] == '/'))
        abort();
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && k[j] != '/')
            j++;
        size_t e = j - i;
        if (e == 0 || (k[i] == '.' && (e == 1 || (e == 2 && k[i + 1] == '.'))))
            abort();
        i = j + 1;
    }
}

/* printable ASCII without '/': one path element, escaped and read back as is */
static bool
plain_element(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x20 || s[i] > 0x7E || s[i] == '/')
            return false;
    return true;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cont_token t;
    int rc = cont_decode((const char *)data, size, &t);
    if (rc == 0)
        check_decoded(&t);
    else if (rc != KWC_EPARSE && rc != KWC_ETOOBIG)
        abort();
    if ((rc == KWC_ETOOBIG) != (size > CONT_MAX_TOKEN))
        abort();
    cont_token_fini(&t);

    int64_t rv = size ? (int64_t)(int8_t)data[0] * 1000003 : 1;
    char *tok = NULL;
    rc = cont_encode(rv, (const char *)data, size, &tok);
    if (rc == KWC_ETOOBIG) {
        if (tok)
            abort();
        return 0;
    }
    if (rc != 0 || !tok || strlen(tok) > CONT_MAX_TOKEN)
        abort();
    for (const char *p = tok; *p; p++)
        if (!strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", *p))
            abort();
    rc = cont_decode(tok, strlen(tok), &t);
    if (rv != 0 && plain_element(data, size)) {
        if (rc != 0 || t.rv != rv || t.start_len != size + 1 || memcmp(t.start, data, size) != 0 ||
            t.start[size] != '\0')
            abort();
    } else if (rc == 0) {
        check_decoded(&t);
        if (t.rv != rv || t.start_len == 0 || t.start[t.start_len - 1] != '\0')
            abort();
    }
    cont_token_fini(&t);
    free(tok);
    return 0;
}
