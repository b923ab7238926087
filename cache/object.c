/*
 * object.c — reads Kubernetes objects, watch event lines and LIST bodies as
 * the upstream sent them (object.h), between the reflector's upstream bytes
 * and the store. Never re-serialises: it returns byte spans of the input plus
 * the few values the cache indexes.
 *
 * Two readers share the JSON rules of object.h:
 *  - a validating scanner (struct scan) for envelopes: it checks the grammar,
 *    UTF-8 and escapes exactly as jansson does (tests/fuzz/object_fuzz.c
 *    compares the two on every input) and reports value spans, iteratively
 *    with a bit stack, so hostile nesting costs no C stack;
 *  - jansson for one object at a time, where values are needed.
 * Nothing here is retained between calls except the splitter's partial line.
 */
#include "kwc/object.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"

_Static_assert(OBJ_MAX_DEPTH == JSON_PARSER_MAX_DEPTH, "object depth follows jansson's");

/* A splitter buffer larger than this is freed once its line is consumed. */
#define WFRAME_KEEP (1u << 20)

/* Shared by every jansson parse here: see object.h for why duplicates are
 * refused and NUL accepted. */
#define LOAD_FLAGS (JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL)

/* Up to 40 bytes of s for an error message, non-printable bytes as '?'. */
static const char *
shown(const char *s, size_t len, char buf[static 48])
{
    size_t n = len > 40 ? 40 : len;
    for (size_t i = 0; i < n; i++)
        buf[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    strcpy(buf + n, len > n ? "..." : "");
    return buf;
}

/* ------------------------------------------------------------------------ */
/* The validating scanner                                                    */

struct scan {
    const unsigned char *p;
    size_t len, pos;
    const char *what; /* first error, static text */
};

static bool
is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static bool
is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static void
skip_ws(struct scan *s)
{
    while (s->pos < s->len && is_ws(s->p[s->pos]))
        s->pos++;
}

static int
bad(struct scan *s, const char *what)
{
    if (!s->what)
        s->what = what;
    return KWC_EPARSE;
}

static int
peek(const struct scan *s)
{
    return s->pos < s->len ? s->p[s->pos] : -1;
}

/* The \uXXXX at p[0..5] (p[0] == '\\'), or -1. */
static long
uescape(const unsigned char *p, size_t left)
{
    if (left < 6 || p[0] != '\\' || p[1] != 'u')
        return -1;
    long v = 0;
    for (int i = 2; i < 6; i++) {
        unsigned char c = p[i];
        int d = is_digit(c)              ? c - '0'
                : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                         : -1;
        if (d < 0)
            return -1;
        v = v << 4 | d;
    }
    return v;
}

/* Are all 8 bytes of v printable ASCII other than '"' and '\\'? (bit tricks:
 * a byte below 0x20, a byte equal to '"' or '\\', or a high bit makes the
 * corresponding 0x80 bit of the result set) */
static inline bool
plain8(uint64_t v)
{
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    uint64_t ctl = (v - 0x20 * ones) & ~v;
    uint64_t q = v ^ (0x22 * ones), bs = v ^ (0x5c * ones);
    q = (q - ones) & ~q;
    bs = (bs - ones) & ~bs;
    return ((ctl | q | bs | v) & highs) == 0;
}

/* A string at s->pos (which holds '"'); leaves pos after the closing quote. */
static int
scan_string(struct scan *s)
{
    const unsigned char *p = s->p;
    size_t i = s->pos + 1;
    for (;;) {
        /* the common case: runs of plain ASCII, 8 bytes at a time */
        while (i + 8 <= s->len) {
            uint64_t v;
            memcpy(&v, p + i, 8);
            if (!plain8(v))
                break;
            i += 8;
        }
        if (i >= s->len)
            return bad(s, "unterminated string");
        unsigned char c = p[i];
        if (c == '"') {
            s->pos = i + 1;
            return 0;
        }
        if (c < 0x20)
            return bad(s, "control character in string");
        if (c == '\\') {
            if (i + 1 >= s->len)
                return bad(s, "unterminated string");
            switch (p[i + 1]) {
            case '"':
            case '\\':
            case '/':
            case 'b':
            case 'f':
            case 'n':
            case 'r':
            case 't':
                i += 2;
                continue;
            case 'u':
                break;
            default:
                return bad(s, "invalid escape in string");
            }
            long u = uescape(p + i, s->len - i);
            if (u < 0)
                return bad(s, "invalid \\u escape");
            i += 6;
            if (u >= 0xDC00 && u <= 0xDFFF)
                return bad(s, "lone low surrogate escape");
            if (u >= 0xD800 && u <= 0xDBFF) {
                long lo = uescape(p + i, s->len - i);
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return bad(s, "lone high surrogate escape");
                i += 6;
            }
            continue;
        }
        size_t n = kwc_utf8_seq(p + i, s->len - i);
        if (n == 0)
            return bad(s, "invalid UTF-8");
        i += n;
    }
}

static int
scan_number(struct scan *s)
{
    const unsigned char *p = s->p;
    size_t i = s->pos, n = s->len;
    if (p[i] == '-')
        i++;
    if (i < n && p[i] == '0') {
        i++;
    } else if (i < n && p[i] >= '1' && p[i] <= '9') {
        while (i < n && is_digit(p[i]))
            i++;
    } else {
        return bad(s, "invalid number");
    }
    if (i < n && p[i] == '.') {
        i++;
        if (i >= n || !is_digit(p[i]))
            return bad(s, "invalid number");
        while (i < n && is_digit(p[i]))
            i++;
    }
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        i++;
        if (i < n && (p[i] == '+' || p[i] == '-'))
            i++;
        if (i >= n || !is_digit(p[i]))
            return bad(s, "invalid number");
        while (i < n && is_digit(p[i]))
            i++;
    }
    /* jansson refuses a number too large for a double ("real number
     * overflow"; an integer past 64 bits is read as a double by obj_meta_parse) */
    size_t nl = i - s->pos;
    if (nl > 15 || memchr(p + s->pos, 'e', nl) || memchr(p + s->pos, 'E', nl)) {
        char buf[400], *copy = nl < sizeof(buf) ? buf : xmalloc(nl + 1);
        memcpy(copy, p + s->pos, nl);
        copy[nl] = '\0';
        errno = 0;
        double d = strtod(copy, NULL);
        bool over = errno == ERANGE && d != 0;
        if (copy != buf)
            free(copy);
        if (over)
            return bad(s, "real number overflow");
    }
    s->pos = i;
    return 0;
}

static int
scan_literal(struct scan *s, const char *word)
{
    size_t n = strlen(word);
    if (s->len - s->pos < n || memcmp(s->p + s->pos, word, n) != 0)
        return bad(s, "invalid literal");
    s->pos += n;
    return 0;
}

/*
 * One value at s->pos (after optional whitespace), leaving pos just after it.
 * Its nesting is bounded as if it stood alone, whatever envelope holds it:
 * OBJ_MAX_DEPTH counted as jansson counts (the value itself is one level,
 * each container adds one).
 */
static int
scan_value(struct scan *s)
{
    unsigned char stack[(OBJ_MAX_DEPTH + 7) / 8]; /* bit set: object */
    unsigned d = 0;                               /* containers opened here */
    int c, rc;

value:
    skip_ws(s);
    if (d + 1 > OBJ_MAX_DEPTH)
        return bad(s, "nesting too deep");
    switch ((c = peek(s))) {
    case '{':
    case '[':
        if (c == '{')
            stack[d / 8] |= (unsigned char)(1u << d % 8);
        else
            stack[d / 8] &= (unsigned char)~(1u << d % 8);
        d++;
        s->pos++;
        skip_ws(s);
        if (peek(s) == (c == '{' ? '}' : ']')) {
            s->pos++;
            d--;
            goto after;
        }
        if (c == '[')
            goto value;
        goto key;
    case '"':
        if ((rc = scan_string(s)) < 0)
            return rc;
        goto after;
    case 't':
        rc = scan_literal(s, "true");
        break;
    case 'f':
        rc = scan_literal(s, "false");
        break;
    case 'n':
        rc = scan_literal(s, "null");
        break;
    case -1:
        return bad(s, "unexpected end of input");
    default:
        if (c != '-' && !is_digit((unsigned char)c))
            return bad(s, "unexpected character");
        rc = scan_number(s);
        break;
    }
    if (rc < 0)
        return rc;

after:
    if (d == 0)
        return 0;
    skip_ws(s);
    c = peek(s);
    if (stack[(d - 1) / 8] & (1u << (d - 1) % 8)) {
        if (c == ',') {
            s->pos++;
            goto key;
        }
        if (c != '}')
            return bad(s, c < 0 ? "unexpected end of input" : "expected ',' or '}'");
    } else {
        if (c == ',') {
            s->pos++;
            goto value;
        }
        if (c != ']')
            return bad(s, c < 0 ? "unexpected end of input" : "expected ',' or ']'");
    }
    s->pos++;
    d--;
    goto after;

key:
    skip_ws(s);
    if (peek(s) != '"')
        return bad(s, "expected a key");
    if ((rc = scan_string(s)) < 0)
        return rc;
    skip_ws(s);
    if (peek(s) != ':')
        return bad(s, "expected ':'");
    s->pos++;
    goto value;
}

/* Members of the top-level object, one at a time. */
struct members {
    struct scan *s;
    bool started;
};

static int
members_begin(struct members *m, struct scan *s)
{
    m->s = s;
    m->started = false;
    skip_ws(s);
    if (peek(s) != '{')
        return bad(s, "not a JSON object");
    s->pos++;
    return 0;
}

/*
 * The next member: returns 1 with the key's content span (inside the quotes)
 * and pos at the start of the value, which the caller must scan before asking
 * again; 0 after the closing '}' and trailing whitespace, which must end the
 * input; or an error.
 */
static int
members_next(struct members *m, size_t *key_off, size_t *key_len)
{
    struct scan *s = m->s;
    int rc;
    skip_ws(s);
    if (peek(s) == '}') {
        s->pos++;
        skip_ws(s);
        return s->pos == s->len ? 0 : bad(s, "data after the JSON value");
    }
    if (m->started) {
        if (peek(s) != ',')
            return bad(s, peek(s) < 0 ? "unexpected end of input" : "expected ',' or '}'");
        s->pos++;
        skip_ws(s);
    }
    m->started = true;
    if (peek(s) != '"')
        return bad(s, "expected a key");
    size_t start = s->pos;
    if ((rc = scan_string(s)) < 0)
        return rc;
    *key_off = start + 1;
    *key_len = s->pos - start - 2;
    skip_ws(s);
    if (peek(s) != ':')
        return bad(s, "expected ':'");
    s->pos++;
    skip_ws(s);
    return 1;
}

/* Decode the JSON string at p[0, len) (quotes included) into a new jansson
 * string, or NULL. */
static json_t *
decode_string(const char *p, size_t len)
{
    json_t *j = json_loadb(p, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (j && !json_is_string(j)) {
        json_decref(j);
        j = NULL;
    }
    return j;
}

/* Whether the key with raw content p[off, off + len) decodes to want[0, wl) (ASCII). */
static bool
key_is_n(const char *p, size_t off, size_t len, const char *want, size_t wl)
{
    if (!memchr(p + off, '\\', len))
        return len == wl && memcmp(p + off, want, wl) == 0;
    if (len > 6 * wl) /* each ASCII character escapes to at most 6 bytes */
        return false;
    json_t *j = decode_string(p + off - 1, len + 2);
    bool eq = j && json_string_length(j) == wl && memcmp(json_string_value(j), want, wl) == 0;
    json_decref(j);
    return eq;
}

static bool
key_is(const char *p, size_t off, size_t len, const char *want)
{
    return key_is_n(p, off, len, want, strlen(want));
}

static int
scan_err(const struct scan *s, char *err, size_t errlen)
{
    return kwc_errf(err, errlen, KWC_EPARSE, "invalid JSON at byte %zu: %s", s->pos,
                    s->what ? s->what : "malformed");
}

/* ------------------------------------------------------------------------ */
/* Objects through jansson                                                   */

/* Parse len bytes as a JSON object (new reference) or fail with a reason. */
static json_t *
load_object(const char *json, size_t len, int *rc, char *err, size_t errlen)
{
    json_error_t e;
    /* jansson skips a raw NUL byte that follows a number ("5\0}"): refuse
     * them first, as every other JSON reader does. */
    const char *nul = memchr(json, '\0', len);
    if (nul) {
        *rc = kwc_errf(err, errlen, KWC_EPARSE, "invalid JSON at byte %zu: NUL byte",
                       (size_t)(nul - json));
        return NULL;
    }
    json_t *root = json_loadb(json, len, LOAD_FLAGS, &e);
    /* jansson refuses integers beyond 64 bits, Go reads them as float64:
     * accept them as reals rather than refuse the object. */
    if (!root && json_error_code(&e) == json_error_numeric_overflow)
        root = json_loadb(json, len, LOAD_FLAGS | JSON_DECODE_INT_AS_REAL, &e);
    if (!root) {
        *rc = kwc_errf(err, errlen, KWC_EPARSE, "invalid JSON at byte %d: %s", e.position, e.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        *rc = kwc_errf(err, errlen, KWC_EPARSE, "not a JSON object");
        return NULL;
    }
    return root;
}

struct strref {
    const char *s; /* NULL: absent */
    size_t len;
};

/* The string member key of obj: absent or null leaves *out absent. */
static int
get_str(json_t *obj, const char *key, const char *what, struct strref *out, char *err,
        size_t errlen)
{
    json_t *v = json_object_get(obj, key);
    out->s = NULL;
    out->len = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return kwc_errf(err, errlen, KWC_EPARSE, "%s is not a string", what);
    out->s = json_string_value(v);
    out->len = json_string_length(v);
    if (memchr(out->s, '\0', out->len))
        return kwc_errf(err, errlen, KWC_EPARSE, "%s contains a NUL character", what);
    return 0;
}

/* Go's strconv.ParseUint(s, 10, 64), refusing 0: no object has rv 0. */
static int
parse_rv(const struct strref *r, const char *what, uint64_t *out, char *err, size_t errlen)
{
    char buf[48];
    uint64_t v = 0;
    if (!r->s || r->len == 0)
        return kwc_errf(err, errlen, KWC_EPARSE, "%s missing", what);
    for (size_t i = 0; i < r->len; i++) {
        unsigned d = (unsigned char)r->s[i] - '0';
        if (d > 9 || v > (UINT64_MAX - d) / 10)
            return kwc_errf(err, errlen, KWC_EPARSE, "%s \"%s\" is not a decimal uint64", what,
                            shown(r->s, r->len, buf));
        v = v * 10 + d;
    }
    if (v == 0)
        return kwc_errf(err, errlen, KWC_EPARSE, "%s is 0", what);
    *out = v;
    return 0;
}

/* The value at a dotted path, or NULL. */
static json_t *
walk(json_t *cur, const char *path)
{
    for (const char *seg = path;;) {
        const char *dot = strchr(seg, '.');
        size_t n = dot ? (size_t)(dot - seg) : strlen(seg);
        if (json_is_object(cur)) {
            cur = json_object_getn(cur, seg, n);
        } else if (json_is_array(cur) && n > 0 && n < 10) {
            size_t idx = 0;
            for (size_t i = 0; i < n; i++) {
                if (!is_digit((unsigned char)seg[i]))
                    return NULL;
                idx = idx * 10 + (size_t)(seg[i] - '0');
            }
            cur = json_array_get(cur, idx);
        } else {
            return NULL;
        }
        if (!cur || !dot)
            return cur;
        seg = dot + 1;
    }
}

/* A field's value as kube formats it into num (for non-strings) or NULL for
 * missing. */
static int
field_value(json_t *v, char num[static 32], struct strref *out, const char *path, char *err,
            size_t errlen)
{
    out->s = NULL;
    if (json_is_string(v)) {
        out->s = json_string_value(v);
        out->len = json_string_length(v);
        if (memchr(out->s, '\0', out->len))
            return kwc_errf(err, errlen, KWC_EPARSE, "field %s contains a NUL character", path);
    } else if (json_is_boolean(v)) {
        out->s = json_is_true(v) ? "true" : "false";
        out->len = strlen(out->s);
    } else if (json_is_integer(v)) {
        out->len = (size_t)snprintf(num, 32, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        out->s = num;
    } else if (json_is_real(v)) {
        /* only after an oversized integer made every number a real */
        double d = json_real_value(v);
        if (d >= -9.2e18 && d <= 9.2e18 && d == (double)(int64_t)d) {
            out->len = (size_t)snprintf(num, 32, "%" PRId64, (int64_t)d);
            out->s = num;
        }
    }
    return 0;
}

static int
label_cmp(const void *a, const void *b)
{
    return strcmp(((const struct obj_label *)a)->key, ((const struct obj_label *)b)->key);
}

/* Copy r into the arena at *at; NULL stays NULL. */
static const char *
put(char **at, const struct strref *r)
{
    if (!r->s)
        return NULL;
    char *dst = *at;
    memcpy(dst, r->s, r->len);
    dst[r->len] = '\0';
    *at += r->len + 1;
    return dst;
}

enum { M_KIND, M_APIVERSION, M_NAMESPACE, M_NAME, M_UID, M_FIXED };

static int
meta_from_json(json_t *root, const struct obj_fields_spec *spec, struct obj_meta *out, char *err,
               size_t errlen)
{
    static const char empty[] = "";
    size_t nf = spec ? spec->n_fields : 0;
    size_t max_labels = spec && spec->max_labels ? spec->max_labels : OBJ_MAX_LABELS;
    struct strref fixed[M_FIXED], rv;
    struct strref *lab = NULL, *fld = NULL;
    char(*num)[32] = NULL;
    int rc;

    json_t *md = json_object_get(root, "metadata");
    if (!md || json_is_null(md))
        return kwc_errf(err, errlen, KWC_EPARSE, "metadata missing");
    if (!json_is_object(md))
        return kwc_errf(err, errlen, KWC_EPARSE, "metadata is not an object");
    if ((rc = get_str(root, "kind", "kind", &fixed[M_KIND], err, errlen)) < 0 ||
        (rc = get_str(root, "apiVersion", "apiVersion", &fixed[M_APIVERSION], err, errlen)) < 0 ||
        (rc = get_str(md, "namespace", "metadata.namespace", &fixed[M_NAMESPACE], err, errlen)) <
            0 ||
        (rc = get_str(md, "name", "metadata.name", &fixed[M_NAME], err, errlen)) < 0 ||
        (rc = get_str(md, "uid", "metadata.uid", &fixed[M_UID], err, errlen)) < 0 ||
        (rc = get_str(md, "resourceVersion", "metadata.resourceVersion", &rv, err, errlen)) < 0)
        return rc;
    if (!fixed[M_NAME].s || fixed[M_NAME].len == 0)
        return kwc_errf(err, errlen, KWC_EPARSE, "metadata.name missing");
    if ((rc = parse_rv(&rv, "metadata.resourceVersion", &out->rv, err, errlen)) < 0)
        return rc;
    for (int i = M_NAMESPACE; i <= M_UID; i++)
        if (!fixed[i].s)
            fixed[i] = (struct strref){empty, 0};
    json_t *dt = json_object_get(md, "deletionTimestamp");
    out->deleting = dt && !json_is_null(dt);

    json_t *labels = json_object_get(md, "labels");
    size_t nl = 0;
    if (labels && !json_is_null(labels)) {
        if (!json_is_object(labels))
            return kwc_errf(err, errlen, KWC_EPARSE, "metadata.labels is not an object");
        nl = json_object_size(labels);
        if (nl > max_labels)
            return kwc_errf(err, errlen, KWC_ETOOBIG, "%zu labels, over the limit of %zu", nl,
                            max_labels);
    }

    lab = xcalloc(nl * 2 + 1, sizeof(*lab));
    fld = xcalloc(nf + 1, sizeof(*fld));
    num = xcalloc(nf + 1, sizeof(*num));
    size_t total = 0, i = 0;
    const char *k;
    size_t klen;
    json_t *v;
    if (nl) {
        json_object_keylen_foreach(labels, k, klen, v)
        {
            char buf[48];
            if (!json_is_string(v) && !json_is_null(v)) {
                rc = kwc_errf(err, errlen, KWC_EPARSE, "metadata.labels[\"%s\"] is not a string",
                              shown(k, klen, buf));
                goto out;
            }
            lab[2 * i] = (struct strref){k, klen};
            /* null into a Go string leaves it empty */
            lab[2 * i + 1] = json_is_null(v)
                                 ? (struct strref){empty, 0}
                                 : (struct strref){json_string_value(v), json_string_length(v)};
            if (memchr(lab[2 * i + 1].s, '\0', lab[2 * i + 1].len)) {
                rc = kwc_errf(err, errlen, KWC_EPARSE, "metadata.labels[\"%s\"] contains a NUL",
                              shown(k, klen, buf));
                goto out;
            }
            total += klen + lab[2 * i + 1].len + 2;
            i++;
        }
    }
    for (size_t f = 0; f < nf; f++) {
        const struct obj_field *of = &spec->fields[f];
        if ((rc = field_value(walk(root, of->path), num[f], &fld[f], of->path, err, errlen)) < 0)
            goto out;
        if (!fld[f].s) {
            fld[f].s = of->missing ? of->missing : empty;
            fld[f].len = strlen(fld[f].s);
        }
        total += fld[f].len + 1;
    }
    for (int f = 0; f < M_FIXED; f++)
        total += fixed[f].s ? fixed[f].len + 1 : 0;

    size_t head = nl * sizeof(struct obj_label) + nf * sizeof(char *);
    char *arena = xmalloc(head + total);
    struct obj_label *labs = (struct obj_label *)(void *)arena;
    const char **flds = (const char **)(void *)(arena + nl * sizeof(struct obj_label));
    char *at = arena + head;
    out->kind = put(&at, &fixed[M_KIND]);
    out->api_version = put(&at, &fixed[M_APIVERSION]);
    out->namespace_ = put(&at, &fixed[M_NAMESPACE]);
    out->name = put(&at, &fixed[M_NAME]);
    out->uid = put(&at, &fixed[M_UID]);
    for (i = 0; i < nl; i++) {
        labs[i].key = put(&at, &lab[2 * i]);
        labs[i].value = put(&at, &lab[2 * i + 1]);
    }
    if (nl > 1) /* qsort(NULL, 0, ...) is undefined */
        qsort(labs, nl, sizeof(*labs), label_cmp);
    for (size_t f = 0; f < nf; f++)
        flds[f] = put(&at, &fld[f]);
    assert(at == arena + head + total);
    out->labels = labs;
    out->n_labels = nl;
    out->fields = flds;
    out->n_fields = nf;
    out->arena_ = arena;
    rc = 0;
out:
    free(lab);
    free(fld);
    free(num);
    return rc;
}

/* ---- pruning: the members obj_meta_parse reads, nothing else ---- */

struct pbuf {
    char *p;
    size_t len, cap;
};

static void
pb_add(struct pbuf *b, const char *s, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 256;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

/* What to keep one level down: "all", or the listed names. */
#define PRUNE_MAX 24
struct keep {
    bool all;
    const char *name[PRUNE_MAX];
    size_t nlen[PRUNE_MAX];
    size_t n;
};

static void
keep_add(struct keep *k, const char *name, size_t nl)
{
    for (size_t i = 0; i < k->n; i++)
        if (k->nlen[i] == nl && memcmp(k->name[i], name, nl) == 0)
            return;
    if (k->n == PRUNE_MAX) {
        k->all = true;
        return;
    }
    k->name[k->n] = name;
    k->nlen[k->n++] = nl;
}

static bool
keep_has(const struct keep *k, const char *p, size_t off, size_t len)
{
    for (size_t i = 0; i < k->n; i++)
        if (key_is_n(p, off, len, k->name[i], k->nlen[i]))
            return true;
    return false;
}

/*
 * Copy the members of the (already validated) object at s->pos whose key
 * keep names (all of them with keep->all); below each kept member, child(i)
 * says what to keep of its value when that is an object (NULL: all of it).
 */
static void
prune_members(struct scan *s, const char *json, const struct keep *keep,
              const struct keep *(*child)(const void *ctx, const char *p, size_t off, size_t len),
              const void *ctx, struct pbuf *b)
{
    struct members m;
    bool first = true;
    members_begin(&m, s); /* past '{' */
    pb_add(b, "{", 1);
    /* the object is nested here, so members_next's end-of-input check does
     * not apply: walk the members by hand */
    for (;;) {
        skip_ws(s);
        if (peek(s) == '}') {
            s->pos++;
            break;
        }
        if (!first) {
            s->pos++; /* ',' */
            skip_ws(s);
        }
        size_t kstart = s->pos;
        scan_string(s);
        size_t koff = kstart + 1, klen = s->pos - kstart - 2;
        skip_ws(s);
        s->pos++; /* ':' */
        skip_ws(s);
        size_t vstart = s->pos;
        bool kept = keep->all || keep_has(keep, json, koff, klen);
        const struct keep *sub = kept && child ? child(ctx, json, koff, klen) : NULL;
        if (kept) {
            if (b->p[b->len - 1] != '{')
                pb_add(b, ",", 1);
            pb_add(b, json + kstart, s->pos - kstart); /* key, ':' and spaces */
        }
        if (kept && sub && peek(s) == '{') {
            prune_members(s, json, sub, NULL, NULL, b);
        } else {
            scan_value(s);
            if (kept)
                pb_add(b, json + vstart, s->pos - vstart);
        }
        first = false;
    }
    pb_add(b, "}", 1);
}

struct prune_ctx {
    struct keep meta;
    struct keep sub[PRUNE_MAX]; /* for top-level key i of top */
    struct keep top;
};

static const struct keep *
top_child(const void *ctx, const char *p, size_t off, size_t len)
{
    const struct prune_ctx *c = ctx;
    if (key_is(p, off, len, "metadata"))
        return &c->meta;
    for (size_t i = 0; i < c->top.n; i++)
        if (key_is_n(p, off, len, c->top.name[i], c->top.nlen[i]))
            return c->sub[i].all ? NULL : &c->sub[i];
    return NULL;
}

/* A copy of the validated object json with only what meta_from_json reads:
 * kind, apiVersion, the metadata members it uses, and the path to every
 * field (whole values below two levels). *out NULL: use json as it is. */
static void
prune_object(const char *json, size_t len, const struct obj_fields_spec *spec, char **out,
             size_t *outlen)
{
    struct prune_ctx c;
    memset(&c, 0, sizeof(c));
    static const char *const md[] = {
        "name", "namespace", "uid", "resourceVersion", "deletionTimestamp", "labels"};
    for (size_t i = 0; i < KWC_ARRAY_LEN(md); i++)
        keep_add(&c.meta, md[i], strlen(md[i]));
    keep_add(&c.top, "kind", 4);
    keep_add(&c.top, "apiVersion", 10);
    keep_add(&c.top, "metadata", 8);
    for (size_t f = 0; spec && f < spec->n_fields; f++) {
        const char *path = spec->fields[f].path;
        const char *dot = strchr(path, '.');
        size_t l1 = dot ? (size_t)(dot - path) : strlen(path);
        if (l1 == 8 && memcmp(path, "metadata", 8) == 0) {
            const char *seg = dot ? dot + 1 : "";
            const char *d2 = strchr(seg, '.');
            keep_add(&c.meta, seg, d2 ? (size_t)(d2 - seg) : strlen(seg));
            if (!dot)
                c.meta.all = true;
            continue;
        }
        keep_add(&c.top, path, l1);
        if (c.top.all)
            return; /* too many: parse it all */
        size_t i;
        for (i = 0; i < c.top.n; i++)
            if (c.top.nlen[i] == l1 && memcmp(c.top.name[i], path, l1) == 0)
                break;
        if (!dot) {
            c.sub[i].all = true;
        } else {
            const char *seg = dot + 1, *d2 = strchr(seg, '.');
            keep_add(&c.sub[i], seg, d2 ? (size_t)(d2 - seg) : strlen(seg));
        }
    }
    struct scan s = {.p = (const unsigned char *)json, .len = len};
    skip_ws(&s);
    if (peek(&s) != '{')
        return;
    struct pbuf b = {0};
    prune_members(&s, json, &c.top, top_child, &c, &b);
    *out = b.p;
    *outlen = b.len;
}

int
obj_meta_parse(const char *json, size_t len, const struct obj_fields_spec *spec,
               struct obj_meta *out, char *err, size_t errlen)
{
    size_t max = spec && spec->max_bytes ? spec->max_bytes : OBJ_MAX_BYTES;
    int rc;
    memset(out, 0, sizeof(*out));
    if (len > max)
        return kwc_errf(err, errlen, KWC_ETOOBIG, "object is %zu bytes, over the limit of %zu", len,
                        max);
    /* The whole object is checked by the scanner; only the parts kwc reads
     * go through jansson (a typical pod's spec, status and managedFields
     * are most of its bytes and were most of the parse time). */
    if (memchr(json, '\0', len))
        return kwc_errf(err, errlen, KWC_EPARSE, "invalid JSON at byte %zu: NUL byte",
                        (size_t)((const char *)memchr(json, '\0', len) - json));
    struct scan sc = {.p = (const unsigned char *)json, .len = len};
    if (scan_value(&sc) < 0)
        return scan_err(&sc, err, errlen);
    skip_ws(&sc);
    if (sc.pos != len)
        return kwc_errf(err, errlen, KWC_EPARSE,
                        "invalid JSON at byte %zu: data after the JSON value", sc.pos);
    char *pruned = NULL;
    size_t plen = 0;
    prune_object(json, len, spec, &pruned, &plen);
    json_t *root = load_object(pruned ? pruned : json, pruned ? plen : len, &rc, err, errlen);
    free(pruned);
    if (!root)
        return rc;
    rc = meta_from_json(root, spec, out, err, errlen);
    json_decref(root);
    if (rc < 0)
        memset(out, 0, sizeof(*out));
    return rc;
}

void
obj_meta_fini(struct obj_meta *m)
{
    if (!m)
        return;
    free(m->arena_);
    memset(m, 0, sizeof(*m));
}

int
obj_rv_span(const char *json, size_t len, size_t *off, size_t *vlen)
{
    struct scan s = {.p = (const unsigned char *)json, .len = len};
    struct members m;
    size_t ko, kl;
    int rc;
    if (members_begin(&m, &s) < 0)
        return KWC_EPARSE;
    while ((rc = members_next(&m, &ko, &kl)) == 1) {
        size_t start = s.pos;
        if (scan_value(&s) < 0)
            return KWC_EPARSE;
        if (!key_is(json, ko, kl, "metadata") || json[start] != '{')
            continue;
        /* the members of metadata: a scan that ends where its value ends */
        struct scan ms = {.p = s.p, .len = s.pos, .pos = start};
        struct members mm;
        if (members_begin(&mm, &ms) < 0)
            return KWC_EPARSE;
        while ((rc = members_next(&mm, &ko, &kl)) == 1) {
            size_t v = ms.pos;
            if (scan_value(&ms) < 0)
                return KWC_EPARSE;
            if (key_is(json, ko, kl, "resourceVersion") && json[v] == '"') {
                *off = v;
                *vlen = ms.pos - v;
                return 0;
            }
        }
        return rc < 0 ? KWC_EPARSE : KWC_ENOTFOUND;
    }
    return rc < 0 ? KWC_EPARSE : KWC_ENOTFOUND;
}

/* ------------------------------------------------------------------------ */
/* Watch stream framing                                                      */

void
wframe_init(struct wframe_splitter *s, size_t max_line)
{
    memset(s, 0, sizeof(*s));
    s->max_line = max_line ? max_line : WFRAME_MAX_LINE;
}

void
wframe_fini(struct wframe_splitter *s)
{
    if (!s)
        return;
    free(s->buf);
    memset(s, 0, sizeof(*s));
}

size_t
wframe_pending(const struct wframe_splitter *s)
{
    return s->handed_out ? 0 : s->len;
}

static int
overflow(struct wframe_splitter *s)
{
    free(s->buf);
    s->buf = NULL;
    s->len = s->cap = 0;
    s->failed = true;
    return KWC_ETOOBIG;
}

/* Append n bytes to the partial line; the caller checked max_line. */
static void
carry(struct wframe_splitter *s, const char *p, size_t n)
{
    size_t need = s->len + n;
    if (need > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < need && cap <= s->max_line / 2)
            cap *= 2;
        if (cap < need || cap > s->max_line)
            cap = s->max_line;
        s->buf = xrealloc(s->buf, cap);
        s->cap = cap;
    }
    memcpy(s->buf + s->len, p, n);
    s->len = need;
}

/* Forget the line handed out; a buffer grown for a rare large object is
 * released rather than kept for the life of the stream. */
static void
reset(struct wframe_splitter *s)
{
    s->len = 0;
    s->handed_out = false;
    if (s->cap > WFRAME_KEEP) {
        free(s->buf);
        s->buf = NULL;
        s->cap = 0;
    }
}

static bool
blank(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!is_ws((unsigned char)p[i]))
            return false;
    return true;
}

int
wframe_next(struct wframe_splitter *s, const char **data, size_t *len, const char **line,
            size_t *line_len)
{
    if (s->failed)
        return KWC_ETOOBIG;
    if (s->handed_out)
        reset(s);
    while (*len > 0) {
        const char *nl = memchr(*data, '\n', *len);
        if (!nl) {
            if (*len > s->max_line - s->len)
                return overflow(s);
            carry(s, *data, *len);
            *data += *len;
            *len = 0;
            return 0;
        }
        size_t n = (size_t)(nl - *data);
        if (n > s->max_line - s->len)
            return overflow(s);
        const char *l = *data;
        size_t ll = n;
        if (s->len) {
            carry(s, *data, n);
            l = s->buf;
            ll = s->len;
            s->handed_out = true;
        }
        *data += n + 1;
        *len -= n + 1;
        if (blank(l, ll)) {
            reset(s);
            continue;
        }
        *line = l;
        *line_len = ll;
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Watch event lines                                                         */

const char *
wevent_type_name(enum wevent_type t)
{
    switch (t) {
#define WEVENT_TYPE_CASE(e, s)                                                                     \
    case e:                                                                                        \
        return s;
        WEVENT_TYPES(WEVENT_TYPE_CASE)
#undef WEVENT_TYPE_CASE
    }
    return NULL;
}

static int
type_from_name(const char *s, size_t len, enum wevent_type *out)
{
    static const enum wevent_type all[] = {
#define WEVENT_TYPE_ALL(e, s) e,
        WEVENT_TYPES(WEVENT_TYPE_ALL)
#undef WEVENT_TYPE_ALL
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(all); i++) {
        const char *name = wevent_type_name(all[i]);
        if (strlen(name) == len && memcmp(name, s, len) == 0) {
            *out = all[i];
            return 0;
        }
    }
    return KWC_EPARSE;
}

/* A bookmark object: its rv and the initial-events-end annotation. */
static int
bookmark(json_t *root, struct wevent *ev, char *err, size_t errlen)
{
    json_t *md = json_object_get(root, "metadata");
    struct strref rv;
    int rc;
    if (!json_is_object(md))
        return kwc_errf(err, errlen, KWC_EPARSE, "BOOKMARK object has no metadata");
    if ((rc = get_str(md, "resourceVersion", "BOOKMARK metadata.resourceVersion", &rv, err,
                      errlen)) < 0 ||
        (rc = parse_rv(&rv, "BOOKMARK metadata.resourceVersion", &ev->rv, err, errlen)) < 0)
        return rc;
    json_t *end = json_object_get(json_object_get(md, "annotations"), "k8s.io/initial-events-end");
    ev->initial_events_end = json_is_string(end) && strcmp(json_string_value(end), "true") == 0;
    return 0;
}

/* An ERROR event's Status: code, reason, message (copied into the arena). */
static int
status(json_t *root, struct wevent *ev, char *err, size_t errlen)
{
    static const char empty[] = "";
    struct strref reason, message;
    int rc;
    if ((rc = get_str(root, "reason", "Status reason", &reason, err, errlen)) < 0 ||
        (rc = get_str(root, "message", "Status message", &message, err, errlen)) < 0)
        return rc;
    if (!reason.s)
        reason = (struct strref){empty, 0};
    if (!message.s)
        message = (struct strref){empty, 0};
    json_t *code = json_object_get(root, "code");
    if (json_is_integer(code) && json_integer_value(code) >= INT32_MIN &&
        json_integer_value(code) <= INT32_MAX)
        ev->code = (int)json_integer_value(code);
    char *at = ev->arena_ = xmalloc(reason.len + message.len + 2);
    ev->reason = put(&at, &reason);
    ev->message = put(&at, &message);
    return 0;
}

int
wevent_parse(const char *line, size_t len, struct wevent *out, char *err, size_t errlen)
{
    struct scan s = {(const unsigned char *)line, len, 0, NULL};
    struct members m;
    size_t koff, klen, type_off = 0, type_len = 0, obj_off = 0, obj_len = 0;
    bool have_type = false, have_obj = false;
    json_t *t = NULL, *root = NULL;
    char buf[48];
    int rc;

    memset(out, 0, sizeof(*out));
    if ((rc = members_begin(&m, &s)) < 0)
        goto bad_json;
    while ((rc = members_next(&m, &koff, &klen)) == 1) {
        size_t start = s.pos;
        bool is_type = key_is(line, koff, klen, "type");
        bool is_obj = !is_type && key_is(line, koff, klen, "object");
        if ((is_type && have_type) || (is_obj && have_obj)) {
            rc = kwc_errf(err, errlen, KWC_EPARSE, "duplicate key \"%s\" in watch event",
                          is_type ? "type" : "object");
            goto fail;
        }
        if ((rc = scan_value(&s)) < 0)
            goto bad_json;
        if (is_type) {
            have_type = true;
            type_off = start;
            type_len = s.pos - start;
        } else if (is_obj) {
            have_obj = true;
            obj_off = start;
            obj_len = s.pos - start;
        }
    }
    if (rc < 0)
        goto bad_json;
    if (!have_type || !have_obj) {
        rc = kwc_errf(err, errlen, KWC_EPARSE, "watch event has no \"%s\"",
                      have_type ? "object" : "type");
        goto fail;
    }
    t = decode_string(line + type_off, type_len);
    if (!t || type_from_name(json_string_value(t), json_string_length(t), &out->type) < 0) {
        rc = kwc_errf(err, errlen, KWC_EPARSE, "unknown watch event type %s",
                      shown(line + type_off, type_len, buf));
        goto fail;
    }
    if (line[obj_off] != '{') {
        rc = kwc_errf(err, errlen, KWC_EPARSE, "watch event object is not a JSON object");
        goto fail;
    }
    out->obj_off = obj_off;
    out->obj_len = obj_len;
    if (out->type == WEVENT_BOOKMARK || out->type == WEVENT_ERROR) {
        if (!(root = load_object(line + obj_off, obj_len, &rc, err, errlen)))
            goto fail;
        rc = out->type == WEVENT_BOOKMARK ? bookmark(root, out, err, errlen)
                                          : status(root, out, err, errlen);
        if (rc < 0)
            goto fail;
    }
    rc = 0;
    goto out;
bad_json:
    rc = scan_err(&s, err, errlen);
fail:
    wevent_fini(out);
out:
    json_decref(t);
    json_decref(root);
    return rc;
}

void
wevent_fini(struct wevent *ev)
{
    if (!ev)
        return;
    free(ev->arena_);
    memset(ev, 0, sizeof(*ev));
}

/* ------------------------------------------------------------------------ */
/* LIST bodies                                                               */

/*
 * Past one value already validated by scan_value, from its first byte.
 * Strings are skipped by their quotes and escapes, containers by counting
 * brackets outside strings.
 */
static size_t
skip_value(const char *p, size_t pos, size_t end)
{
    size_t depth = 0;
    do {
        assert(pos < end);
        char c = p[pos++];
        if (c == '"') {
            while (p[pos] != '"')
                pos += p[pos] == '\\' ? 2 : 1;
            pos++;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            depth--;
        } else if (depth == 0) {
            while (pos < end && !is_ws((unsigned char)p[pos]) && p[pos] != ',' && p[pos] != ']' &&
                   p[pos] != '}')
                pos++;
        }
    } while (depth > 0);
    return pos;
}

/* "items": an array of objects (or null); counts them, records the span. */
static int
scan_items(struct scan *s, struct obj_list *l)
{
    if (peek(s) == 'n')
        return scan_literal(s, "null");
    if (peek(s) != '[')
        return bad(s, "items is not an array");
    s->pos++;
    l->pos_ = s->pos;
    l->n_items = 0;
    skip_ws(s);
    if (peek(s) != ']') {
        for (;;) {
            skip_ws(s);
            if (peek(s) != '{')
                return bad(s, "an item is not a JSON object");
            if (scan_value(s) < 0)
                return KWC_EPARSE;
            l->n_items++;
            skip_ws(s);
            if (peek(s) == ']')
                break;
            if (peek(s) != ',')
                return bad(s, peek(s) < 0 ? "unexpected end of input" : "expected ',' or ']'");
            s->pos++;
        }
    }
    l->end_ = s->pos;
    s->pos++;
    return 0;
}

/* The list's metadata: rv and remainingItemCount into l; continue into *cont,
 * valid while *md (new reference, set even on failure) lives. */
static int
list_meta(struct obj_list *l, const char *p, size_t len, json_t **md, struct strref *cont,
          char *err, size_t errlen)
{
    struct strref rv;
    int rc;
    if (len > OBJ_LIST_MAX_META)
        return kwc_errf(err, errlen, KWC_ETOOBIG,
                        "list metadata is %zu bytes, over the limit of %u", len, OBJ_LIST_MAX_META);
    if (!(*md = load_object(p, len, &rc, err, errlen)))
        return rc;
    if ((rc = get_str(*md, "resourceVersion", "list metadata.resourceVersion", &rv, err, errlen)) <
            0 ||
        (rc = parse_rv(&rv, "list metadata.resourceVersion", &l->rv, err, errlen)) < 0 ||
        (rc = get_str(*md, "continue", "list metadata.continue", cont, err, errlen)) < 0)
        return rc;
    json_t *rem = json_object_get(*md, "remainingItemCount");
    if (rem && !json_is_null(rem)) {
        if (!json_is_integer(rem))
            return kwc_errf(err, errlen, KWC_EPARSE,
                            "list metadata.remainingItemCount is not an integer");
        l->has_remaining = true;
        l->remaining = json_integer_value(rem);
    }
    return 0;
}

int
obj_list_init(struct obj_list *l, const char *body, size_t len, char *err, size_t errlen)
{
    struct scan s = {(const unsigned char *)body, len, 0, NULL};
    struct members m;
    size_t koff, klen, span[2][2] = {{0, 0}, {0, 0}}; /* kind, apiVersion */
    size_t meta_off = 0, meta_len = 0;
    bool seen[4] = {false, false, false, false}; /* kind, apiVersion, metadata, items */
    bool set[4] = {false, false, false, false};  /* ... and not null */
    static const char *const keys[4] = {"kind", "apiVersion", "metadata", "items"};
    int rc;

    memset(l, 0, sizeof(*l));
    l->body_ = body;
    if (members_begin(&m, &s) < 0)
        goto bad_json;
    while ((rc = members_next(&m, &koff, &klen)) == 1) {
        int which = -1;
        for (int i = 0; i < 4 && which < 0; i++)
            if (key_is(body, koff, klen, keys[i]))
                which = i;
        if (which >= 0 && seen[which]) {
            rc = kwc_errf(err, errlen, KWC_EPARSE, "duplicate key \"%s\" in list", keys[which]);
            goto fail;
        }
        size_t start = s.pos;
        if (which >= 0) {
            seen[which] = true;
            set[which] = peek(&s) != 'n'; /* null is absent, as for Go's decoder */
        }
        if (which == 3) {
            if (scan_items(&s, l) < 0)
                goto bad_json;
            continue;
        }
        if (scan_value(&s) < 0)
            goto bad_json;
        if (which == 0 || which == 1) {
            span[which][0] = start;
            span[which][1] = s.pos - start;
        } else if (which == 2) {
            meta_off = start;
            meta_len = s.pos - start;
        }
    }
    if (rc < 0)
        goto bad_json;
    if (!set[2]) {
        rc = kwc_errf(err, errlen, KWC_EPARSE, "list has no metadata");
        goto fail;
    }
    /* kind, apiVersion (strings or null, decoded) and continue, into one arena */
    static const char empty[] = "";
    struct strref str[3] = {{NULL, 0}, {NULL, 0}, {NULL, 0}};
    json_t *dec[3] = {NULL, NULL, NULL};
    if ((rc = list_meta(l, body + meta_off, meta_len, &dec[2], &str[2], err, errlen)) < 0)
        goto out;
    if (!str[2].s)
        str[2] = (struct strref){empty, 0};
    for (int i = 0; i < 2; i++) {
        if (!set[i])
            continue;
        dec[i] = decode_string(body + span[i][0], span[i][1]);
        if (!dec[i] || memchr(json_string_value(dec[i]), '\0', json_string_length(dec[i]))) {
            rc = kwc_errf(err, errlen, KWC_EPARSE, "list %s is not a string", keys[i]);
            goto out;
        }
        str[i] = (struct strref){json_string_value(dec[i]), json_string_length(dec[i])};
    }
    char *at = l->arena_ = xmalloc(str[0].len + str[1].len + str[2].len + 3);
    l->kind = put(&at, &str[0]);
    l->api_version = put(&at, &str[1]);
    l->continue_ = put(&at, &str[2]);
out:
    for (int i = 0; i < 3; i++)
        json_decref(dec[i]);
    if (rc < 0)
        goto fail;
    return 0;
bad_json:
    rc = scan_err(&s, err, errlen);
fail:
    obj_list_fini(l);
    return rc;
}

int
obj_list_next(struct obj_list *l, size_t *off, size_t *len)
{
    const char *p = l->body_;
    size_t pos = l->pos_;
    if (!p || pos >= l->end_)
        return 0;
    while (is_ws((unsigned char)p[pos]) || p[pos] == ',')
        pos++;
    if (pos >= l->end_) {
        l->pos_ = l->end_;
        return 0;
    }
    size_t stop = skip_value(p, pos, l->end_);
    *off = pos;
    *len = stop - pos;
    l->pos_ = stop;
    return 1;
}

void
obj_list_fini(struct obj_list *l)
{
    if (!l)
        return;
    free(l->arena_);
    memset(l, 0, sizeof(*l));
}
