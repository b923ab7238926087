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
xaligned_calloc(size_t align, size_t n)
{
    size_t sz = (n + align - 1) / align * align; /* aligned_alloc wants a multiple */
    void *p = aligned_alloc(align, sz ? sz : align);
    if (!p)
        oom(n);
    memset(p, 0, sz);
    return p;
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

/* Go's time.ParseDuration, kept in whole nanoseconds (uint64: up to ~584
 * years, past Go's int64 limit; refused beyond). */
int
kwc_parse_duration(const char *s, uint64_t *ms)
{
    static const struct {
        const char *name;
        uint64_t ns;
    } units[] = {{"ns", 1},
                 {"us", 1000},
                 {"\xc2\xb5s", 1000}, /* U+00B5 micro sign */
                 {"\xce\xbcs", 1000}, /* U+03BC Greek mu */
                 {"ms", 1000000},
                 {"s", 1000000000ull},
                 {"m", 60ull * 1000000000ull},
                 {"h", 3600ull * 1000000000ull}};
    if (!s || !*s)
        return KWC_EPARSE;
    if (*s == '+')
        s++;
    if (strcmp(s, "0") == 0) {
        *ms = 0;
        return 0;
    }
    if (!*s)
        return KWC_EPARSE;
    const uint64_t max = (uint64_t)INT64_MAX; /* Go's limit */
    uint64_t total = 0;
    while (*s) {
        uint64_t whole = 0, frac = 0;
        double scale = 1;
        bool digits = false, frac_full = false;
        for (; *s >= '0' && *s <= '9'; s++, digits = true) {
            if (whole > max / 10)
                return KWC_EPARSE;
            whole = whole * 10 + (uint64_t)(*s - '0');
            if (whole > max)
                return KWC_EPARSE;
        }
        if (*s == '.') {
            /* Go's leadingFraction: digits past int64's reach do not count */
            for (s++; *s >= '0' && *s <= '9'; s++, digits = true) {
                if (frac_full || frac > max / 10 || frac * 10 + (uint64_t)(*s - '0') > max) {
                    frac_full = true;
                    continue;
                }
                frac = frac * 10 + (uint64_t)(*s - '0');
                scale *= 10;
            }
        }
        if (!digits)
            return KWC_EPARSE;
        size_t best = KWC_ARRAY_LEN(units);
        for (size_t i = 0; i < KWC_ARRAY_LEN(units); i++) {
            size_t l = strlen(units[i].name);
            if (strncmp(s, units[i].name, l) == 0 &&
                (best == KWC_ARRAY_LEN(units) || l > strlen(units[best].name)))
                best = i;
        }
        if (best == KWC_ARRAY_LEN(units))
            return KWC_EPARSE; /* Go: a number needs its unit */
        uint64_t u = units[best].ns;
        s += strlen(units[best].name);
        if (whole > max / u)
            return KWC_EPARSE;
        uint64_t v = whole * u;
        /* as Go: float64(f) * (float64(unit) / scale) */
        v += (uint64_t)((double)frac * ((double)u / scale));
        if (v > max || total > max - v)
            return KWC_EPARSE;
        total += v;
    }
    *ms = total / 1000000;
    return 0;
}

char *
kwc_format_duration(uint64_t ms, char *buf, size_t len)
{
    if (ms < 1000) {
        snprintf(buf, len, "%llums", (unsigned long long)ms);
        if (ms == 0)
            snprintf(buf, len, "0s");
        return buf;
    }
    uint64_t h = ms / 3600000, m = ms / 60000 % 60, s = ms / 1000 % 60, frac = ms % 1000;
    char sec[24];
    int n =
        snprintf(sec, sizeof(sec), "%llu.%03llu", (unsigned long long)s, (unsigned long long)frac);
    while (sec[n - 1] == '0') /* Go trims the fraction's zeros, and a bare '.' */
        sec[--n] = '\0';
    if (sec[n - 1] == '.')
        sec[--n] = '\0';
    if (h)
        snprintf(buf, len, "%lluh%llum%ss", (unsigned long long)h, (unsigned long long)m, sec);
    else if (m)
        snprintf(buf, len, "%llum%ss", (unsigned long long)m, sec);
    else
        snprintf(buf, len, "%ss", sec);
    return buf;
}

int
kwc_parse_quantity(const char *s, uint64_t *bytes)
{
    static const struct {
        const char *name;
        long double mult;
    } suffixes[] = {{"Ki", 1024.0L},
                    {"Mi", 1048576.0L},
                    {"Gi", 1073741824.0L},
                    {"Ti", 1099511627776.0L},
                    {"Pi", 1125899906842624.0L},
                    {"Ei", 1152921504606846976.0L},
                    {"k", 1e3L},
                    {"M", 1e6L},
                    {"G", 1e9L},
                    {"T", 1e12L},
                    {"P", 1e15L},
                    {"E", 1e18L}};
    if (!s || !*s)
        return KWC_EPARSE;
    const char *p = s;
    if (*p == '+')
        p++;
    long double v = 0;
    bool digits = false;
    for (; *p >= '0' && *p <= '9'; p++, digits = true)
        v = v * 10 + (*p - '0');
    if (*p == '.') {
        long double scale = 1;
        for (p++; *p >= '0' && *p <= '9'; p++, digits = true)
            v += (*p - '0') * (scale /= 10);
    }
    if (!digits)
        return KWC_EPARSE;
    long double mult = 1;
    if (*p == 'e' || *p == 'E') {
        /* an exponent (1e3), unless it is the suffix E alone */
        const char *q = p + 1;
        bool neg = false;
        if (*q == '+' || *q == '-')
            neg = *q++ == '-';
        if (*q >= '0' && *q <= '9') {
            int e = 0;
            for (; *q >= '0' && *q <= '9'; q++)
                if ((e = e * 10 + (*q - '0')) > 30)
                    return KWC_EPARSE;
            for (int i = 0; i < e; i++)
                mult = neg ? mult / 10 : mult * 10;
            p = q;
        }
    }
    if (*p) {
        size_t i = 0;
        for (; i < KWC_ARRAY_LEN(suffixes); i++)
            if (strcmp(p, suffixes[i].name) == 0)
                break;
        if (i == KWC_ARRAY_LEN(suffixes) || mult != 1)
            return KWC_EPARSE;
        mult = suffixes[i].mult;
    }
    long double b = v * mult;
    if (b > 18446744073709549568.0L)
        return KWC_EPARSE;
    uint64_t n = (uint64_t)b;
    if ((long double)n < b)
        n++; /* Quantity.Value rounds up */
    *bytes = n;
    return 0;
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
