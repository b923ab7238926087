/*
 * base.h — what every module shares: error codes, allocation that aborts on
 * OOM (internal small sizes only: anything sized by the network is bounded by
 * the caller first), and the tiny parsers kube-apiserver's Go code gets from
 * its standard library (strconv.ParseBool, percent-decoding).
 */
#ifndef KWC_BASE_H
#define KWC_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Fallible functions return 0, -errno, or one of these (outside the errno
 * range). kwc_strerror() names both kinds.
 */
#define KWC_ERRBASE 100000
#define KWC_ERRORS(X)                                                                              \
    X(KWC_EPARSE, 1, "malformed input")                                                            \
    X(KWC_ETOOBIG, 2, "input exceeds its size limit")                                              \
    X(KWC_ECONFIG, 3, "invalid configuration")                                                     \
    X(KWC_EUNSUPPORTED, 4, "not supported")                                                        \
    X(KWC_ENOTFOUND, 5, "not found")                                                               \
    X(KWC_EUPSTREAM, 6, "upstream error")                                                          \
    X(KWC_EEXPIRED, 7, "resource version is older than the kept history")                          \
    X(KWC_ESTORE, 8, "cache storage error")                                                        \
    X(KWC_ECORRUPT, 9, "the cache's data is damaged (checksum or structure)")                      \
    X(KWC_EFORMAT, 10, "the cache's data was written by another kwc format")                       \
    X(KWC_EMAPFULL, 11, "the cache reached its map size")

enum kwc_err {
#define KWC_ERR_ENUM(name, n, text) name = -(KWC_ERRBASE + (n)),
    KWC_ERRORS(KWC_ERR_ENUM)
#undef KWC_ERR_ENUM
};

/* Static text for 0, -errno or a KWC_E* code. */
const char *kwc_strerror(int err);

/* Abort with a message on allocation failure. */
void *xmalloc(size_t n);
void *xcalloc(size_t nmemb, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
/* n zeroed bytes at a multiple of align (a power of two); free() frees it. */
void *xaligned_calloc(size_t align, size_t n);
char *xstrndup(const char *s, size_t n);
/* A copy of n bytes of p (n may be 0: a valid, empty allocation). */
void *xmemdup(const void *p, size_t n);
/* printf into a new string (new). */
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * Go's strconv.ParseBool: 1 t T TRUE true True / 0 f F FALSE false False.
 * Returns 0 and sets *out, or KWC_EPARSE.
 */
int kwc_parse_bool(const char *s, size_t len, bool *out);

/*
 * Go's time.ParseDuration ("300ms", "1.5h", "2h45m", "10s"; units ns, us,
 * µs, ms, s, m, h; a bare "0"), for kube-style flag values: a negative or
 * overflowing duration is refused. Sets *ms (nanoseconds truncated to
 * milliseconds). Returns 0 or KWC_EPARSE.
 */
int kwc_parse_duration(const char *s, uint64_t *ms);

/*
 * ms as Go's time.Duration.String writes it ("0s", "25ms", "1.5s", "1m30s",
 * "1h0m0s"), for help texts and messages that kube users read. buf of at
 * least KWC_DURATION_LEN bytes; returns buf.
 */
#define KWC_DURATION_LEN 32
char *kwc_format_duration(uint64_t ms, char *buf, size_t len);

/*
 * A byte count as a Kubernetes resource.Quantity writes one ("1Gi", "512Mi",
 * "1.5G", "100k", "1e9", "4096"): binary suffixes Ki Mi Gi Ti Pi Ei, decimal
 * k M G T P E, or an exponent; a fraction rounds up to a whole byte as
 * Quantity.Value does. Negative, "m" (milli) and overflow are refused.
 * Returns 0 and sets *bytes, or KWC_EPARSE.
 */
int kwc_parse_quantity(const char *s, uint64_t *bytes);

/*
 * A boolean query parameter as kube-apiserver converts it
 * (Convert_Slice_string_To_bool in k8s.io/apimachinery): only "0" and
 * "false" in any case are false; anything else, the empty string included, is
 * true. This accepts every spelling strconv.ParseBool does ("True", "1", ...).
 */
bool kwc_query_bool(const char *s, size_t len);

/*
 * Percent-decode len bytes of s into out (which must hold len + 1 bytes);
 * '+' becomes ' ' only when plus_is_space (query strings). NUL-terminates.
 * Returns 0 and sets *outlen, or KWC_EPARSE on a bad escape.
 */
int kwc_pct_decode(const char *s, size_t len, bool plus_is_space, char *out, size_t *outlen);

/* Length of the valid UTF-8 sequence at s (RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF; what Go's utf8.DecodeRune accepts), or 0
 * when the byte at s starts none. left > 0 bytes are readable. */
size_t kwc_utf8_seq(const unsigned char *s, size_t left);

/* The 6-bit value of a base64 character, -1 for none: both alphabets
 * ('+' '/' and '-' '_'), or only the URL-safe one when url_only. */
int kwc_base64_sextet(unsigned char c, bool url_only);

/* Base64 (standard alphabet, padding optional) into a new buffer. */
int kwc_base64_decode(const char *s, size_t len, unsigned char **out, size_t *outlen);

/* Format a message into err (when err and errlen) and return rc: the one
 * error reporter behind the parsers that fill a caller's buffer. */
int kwc_errf(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define KWC_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
