/*
 * cont.c — continue-token codec (cont.h), compatible with kube-apiserver.
 *
 * Sits beside the list path: the front end decodes a client's ?continue= here
 * (through decide.c) and encodes the token of each page it cuts. Owns nothing
 * beyond its results. Pure: no I/O.
 *
 * Encoding writes the bytes EncodeContinue writes: json.Marshal of
 *     struct continueToken { APIVersion string `json:"v"`;
 *                            ResourceVersion int64 `json:"rv"`;
 *                            StartKey string `json:"start"` }
 * then base64.RawURLEncoding.
 *
 * Decoding takes the strict subset of what DecodeContinue accepts: base64
 * from the alphabet only, then strict JSON (jansson, which refuses duplicate
 * keys, invalid UTF-8 and lone surrogates) holding exactly the three keys as
 * EncodeContinue spells them, then DecodeContinue's own checks. Go's decoders
 * are more lenient (CR/LF skipped, keys matched case-insensitively, unknown
 * keys and nulls ignored, the last duplicate wins, bad UTF-8 replaced) and
 * their error texts come from encoding/json's internals; rather than
 * reproduce all that, kwc hands any token it refuses to the upstream, whose
 * answer is kube-apiserver's by construction.
 * Invariant: len is bounded by CONT_MAX_TOKEN before anything is allocated.
 */
#include "kwc/cont.h"

#include "kwc/base.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONT_VERSION "meta.k8s.io/v1"

/* ---- base64, RawURLEncoding ---- */

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/* Decode into out (len / 4 * 3 + 2 bytes). Bits left over after the last
 * whole byte are ignored, as by Go's (non-strict) decoder; a lone last
 * character carries no whole byte and is an error, as in Go. */
static int
b64_decode(const char *s, size_t len, unsigned char *out, size_t *outlen)
{
    uint32_t acc = 0;
    int bits = 0;
    size_t n = 0;
    if (len % 4 == 1)
        return KWC_EPARSE;
    for (size_t i = 0; i < len; i++) {
        int v = kwc_base64_sextet((unsigned char)s[i], true);
        if (v < 0)
            return KWC_EPARSE;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[n++] = (unsigned char)(acc >> bits);
        }
    }
    *outlen = n;
    return 0;
}

/* Encode into out ((len * 4 + 2) / 3 + 1 bytes), NUL-terminated. */
static void
b64_encode(const unsigned char *s, size_t len, char *out)
{
    uint32_t acc = 0;
    int bits = 0;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        acc = acc << 8 | s[i];
        bits += 8;
        while (bits >= 6) {
            bits -= 6;
            out[n++] = b64_alphabet[acc >> bits & 63];
        }
    }
    if (bits > 0)
        out[n++] = b64_alphabet[acc << (6 - bits) & 63];
    out[n] = '\0';
}

/* ---- encoding ---- */

/* The inside of a JSON string as json.Marshal writes it (encoding/json
 * appendString with HTML escaping, Go >= 1.22): at most 6 bytes per input
 * byte into dst. Returns the bytes written. */
static size_t
json_escape(char *dst, const char *src, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    static const char shorts[] = "\"\\\b\f\n\r\t", letters[] = "\"\\bfnrt";
    const unsigned char *s = (const unsigned char *)src;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        unsigned char c = s[i];
        if (c < 0x80) {
            const char *sh = c ? strchr(shorts, c) : NULL;
            if (sh) {
                dst[n++] = '\\';
                dst[n++] = letters[sh - shorts];
            } else if (c < 0x20 || c == '<' || c == '>' || c == '&') {
                n += (size_t)sprintf(dst + n, "\\u00%c%c", hex[c >> 4], hex[c & 0xF]);
            } else {
                dst[n++] = (char)c;
            }
            i++;
            continue;
        }
        size_t w = kwc_utf8_seq(s + i, len - i);
        if (w == 0) {
            n += (size_t)sprintf(dst + n, "\\ufffd");
            i++;
        } else if (w == 3 && c == 0xE2 && s[i + 1] == 0x80 && (s[i + 2] & 0xFE) == 0xA8) {
            /* U+2028, U+2029 */
            n += (size_t)sprintf(dst + n, "\\u202%c", s[i + 2] == 0xA8 ? '8' : '9');
            i += 3;
        } else {
            memcpy(dst + n, src + i, w);
            n += w;
            i += w;
        }
    }
    return n;
}

int
cont_encode(int64_t rv, const char *last_key, size_t last_key_len, char **out)
{
    /* the longest head (rv INT64_MIN) and tail */
    static const char head_max[] =
        "{\"v\":\"" CONT_VERSION "\",\"rv\":-9223372036854775808,\"start\":\"";
    static const char tail[] = "\\u0000\"}"; /* the NUL that makes the next key */
    *out = NULL;
    /* bound the work by the key first: escaping grows a byte at most 6x */
    if (last_key_len > CONT_MAX_TOKEN)
        return KWC_ETOOBIG;
    size_t cap = sizeof(head_max) + 6 * last_key_len + sizeof(tail);
    char *json = xmalloc(cap);
    size_t n = (size_t)snprintf(json, cap, "{\"v\":\"" CONT_VERSION "\",\"rv\":%lld,\"start\":\"",
                                (long long)rv);
    n += json_escape(json + n, last_key, last_key_len);
    memcpy(json + n, tail, sizeof(tail) - 1);
    n += sizeof(tail) - 1;

    size_t tlen = (n * 4 + 2) / 3;
    if (tlen > CONT_MAX_TOKEN) {
        free(json);
        return KWC_ETOOBIG;
    }
    *out = xmalloc(tlen + 1);
    b64_encode((const unsigned char *)json, n, *out);
    free(json);
    return 0;
}

/* ---- decoding ---- */

/* path.Clean("/" + p) == "/" + p: p is empty, or has no empty, "." or ".."
 * element (so no "//", no leading or trailing '/'). */
static bool
rooted_is_clean(const char *p, size_t len)
{
    if (len == 0)
        return true;
    for (size_t i = 0;;) {
        size_t j = i;
        while (j < len && p[j] != '/')
            j++;
        size_t n = j - i;
        if (n == 0 || (p[i] == '.' && (n == 1 || (n == 2 && p[i + 1] == '.'))))
            return false;
        if (j == len)
            return true;
        i = j + 1;
    }
}

static bool
json_str_is(const json_t *s, const char *want)
{
    return json_string_length(s) == strlen(want) &&
           memcmp(json_string_value(s), want, strlen(want)) == 0;
}

int
cont_decode(const char *token, size_t len, struct cont_token *out)
{
    unsigned char *data = NULL;
    json_t *root = NULL, *v, *rv, *start;
    const char *key;
    size_t dlen = 0, key_len;
    int rc = KWC_EPARSE;

    memset(out, 0, sizeof(*out));
    if (len > CONT_MAX_TOKEN)
        return KWC_ETOOBIG;
    data = xmalloc(len / 4 * 3 + 2);
    if (b64_decode(token, len, data, &dlen) != 0)
        goto out;
    root = json_loadb((const char *)data, dlen, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, NULL);
    v = json_object_get(root, "v");
    rv = json_object_get(root, "rv");
    start = json_object_get(root, "start");
    if (json_object_size(root) != 3 || !json_is_string(v) || !json_is_integer(rv) ||
        !json_is_string(start))
        goto out;

    /* DecodeContinue: the version, rv != 0, a start key that path.Clean
     * leaves alone once rooted (no climbing above the prefix) */
    key = json_string_value(start);
    key_len = json_string_length(start);
    if (!json_str_is(v, CONT_VERSION) || json_integer_value(rv) == 0 || key_len == 0)
        goto out;
    if (key[0] == '/') { /* already rooted: the key is what follows */
        key++;
        key_len--;
    }
    if (!rooted_is_clean(key, key_len))
        goto out;
    out->rv = json_integer_value(rv);
    out->start = xmalloc(key_len + 1);
    memcpy(out->start, key, key_len);
    out->start[key_len] = '\0';
    out->start_len = key_len;
    rc = 0;
out:
    json_decref(root);
    free(data);
    return rc;
}

void
cont_token_fini(struct cont_token *t)
{
    if (!t)
        return;
    free(t->start);
    t->start = NULL;
    t->start_len = 0;
}
