/*
 * base.c — error texts, aborting allocators and small standard parsers.
 * Pure: no I/O besides the abort message on OOM.
 */
#include "kwc/base.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *
kwc_strerror(int err)
{
    switch (err) {
    case 0:
        return "success";
#define KWC_ERR_CASE(name, n, text)                                                                \
    case name:                                                                                     \
        return text;
        KWC_ERRORS(KWC_ERR_CASE)
#undef KWC_ERR_CASE
    default:
        break;
    }
    if (err < 0 && err > -KWC_ERRBASE)
        return strerror(-err);
    return "unknown error";
}

static void
oom(size_t n)
{
    fprintf(stderr, "kwc: out of memory allocating %zu bytes\n", n);
    abort();
}

void *
xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        oom(n);
    return p;
}

void *
xcalloc(size_t nmemb, size_t size)
{
    void *p = calloc(nmemb ? nmemb : 1, size ? size : 1);
    if (!p)
        oom(nmemb * size);
    return p;
}

void *
xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        oom(n);
    return q;
}

void *
xmemdup(const void *p, size_t n)
{
    void *d = xmalloc(n ? n : 1);
    if (n)
        memcpy(d, p, n);
    return d;
}

char *
xstrdup(const char *s)
{
    return xstrndup(s, strlen(s));
}

char *
xstrndup(const char *s, size_t n)
{
    char *p = xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *
xasprintf(const char *fmt, ...)
{
    va_list ap;
    char *p = NULL;
    va_start(ap, fmt);
    int n = vasprintf(&p, fmt, ap);
    va_end(ap);
    if (n < 0)
        oom(strlen(fmt));
    return p;
}

int
kwc_parse_bool(const char *s, size_t len, bool *out)
{
    static const char *const yes[] = {"1", "t", "T", "TRUE", "true", "True"};
    static const char *const no[] = {"0", "f", "F", "FALSE", "false", "False"};
    for (size_t i = 0; i < KWC_ARRAY_LEN(yes); i++) {
        if (strlen(yes[i]) == len && memcmp(yes[i], s, len) == 0) {
            *out = true;
            return 0;
        }
        if (strlen(no[i]) == len && memcmp(no[i], s, len) == 0) {
            *out = false;
            return 0;
        }
    }
    return KWC_EPARSE;
}

bool
kwc_query_bool(const char *s, size_t len)
{
    if (len == 1 && s[0] == '0')
        return false;
    return !(len == 5 && strncasecmp(s, "false", 5) == 0);
}

static int
hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int
kwc_pct_decode(const char *s, size_t len, bool plus_is_space, char *out, size_t *outlen)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == '%') {
            if (i + 2 >= len)
                return KWC_EPARSE;
            int hi = hexval(s[i + 1]), lo = hexval(s[i + 2]);
            if (hi < 0 || lo < 0)
                return KWC_EPARSE;
            out[o++] = (char)(hi << 4 | lo);
            i += 2;
        } else if (c == '+' && plus_is_space) {
            out[o++] = ' ';
        } else {
            out[o++] = c;
        }
    }
    out[o] = '\0';
    *outlen = o;
    return 0;
}

int
kwc_base64_sextet(unsigned char c, bool url_only)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '-' || (c == '+' && !url_only))
        return 62;
    if (c == '_' || (c == '/' && !url_only))
        return 63;
    return -1;
}

int
kwc_errf(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

int
kwc_base64_decode(const char *s, size_t len, unsigned char **out, size_t *outlen)
{
    unsigned char *buf = xmalloc(len / 4 * 3 + 3);
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    size_t i = 0;
    for (; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '=')
            break;
        if (c == '\n' || c == '\r' || c == ' ' || c == '\t')
            continue;
        int v = kwc_base64_sextet(c, false);
        if (v < 0)
            goto bad;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            buf[o++] = (unsigned char)(acc >> bits);
        }
    }
    for (; i < len; i++)
        if (s[i] != '=' && s[i] != '\n' && s[i] != '\r')
            goto bad;
    if (bits >= 6)
        goto bad; /* a lone sextet cannot encode a byte */
    *out = buf;
    *outlen = o;
    return 0;
bad:
    free(buf);
    return KWC_EPARSE;
}

size_t
kwc_utf8_seq(const unsigned char *s, size_t left)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        lo = c == 0xE0 ? 0xA0 : 0x80;
        hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        lo = c == 0xF0 ? 0x90 : 0x80;
        hi = c == 0xF4 ? 0x8F : 0xBF;
    } else {
        return 0;
    }
    if (left < n || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return n;
}
