/*
 * pom.c — PartialObjectMetadata from stored items (see pom.h). On the
 * serving side of the data path: store -> [pom] -> list/get/watch encoder.
 *
 * Built-in kinds need no parsing beyond locating the top-level "metadata"
 * value: a bounded, non-recursive scanner over bytes object.c validated at
 * ingest. Custom resources parse only that value with jansson and write the
 * typed ObjectMeta as Go's encoding/json would (json.Encoder: HTML-safe
 * string escapes, map keys sorted, shortest floats), reading each field the
 * way the Unstructured accessor does (k8s.io/apimachinery unstructured.go and
 * helpers.go):
 *   strings         getNestedString: a non-string is ""
 *   generation      NestedInt64: only an integer counts
 *   timestamps      Time.UnmarshalQueryParameter + MarshalJSON: RFC 3339
 *                   re-written in UTC without fraction; "", unparsable and
 *                   the zero time are zero (creationTimestamp null,
 *                   deletionTimestamp omitted)
 *   labels, annot.  NestedNullCoercingStringMap: null values are "", any
 *                   other non-string drops the whole map
 *   finalizers      NestedStringSlice: any non-string drops the slice
 *   ownerReferences objects only (else dropped); strings and bools per field
 *   managedFields   DefaultUnstructuredConverter.FromUnstructured into
 *                   ManagedFieldsEntry: a type mismatch or a bad time drops
 *                   the whole slice; fieldsV1 is the value re-marshalled
 * Time parsing follows Go's RFC 3339 fast path (time/format_rfc3339.go);
 * the few forms only Go's generic layout parser accepts (a one-digit hour,
 * a comma before the fraction) read as zero here. kube-apiserver sets both
 * timestamps itself, always in the canonical form.
 *
 * Protobuf for custom resources (pom_pb_from_json): the same ObjectMeta,
 * read by the same accessors, written as gogo's generated marshaller
 * writes the typed struct (see object_meta_pb).
 */
#include "kwc/pom.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/pb.h"

/* ------------------------------------------------------------------------ */
/* Locating the top-level "metadata" value                                   */

static size_t
skip_ws(const char *p, size_t i, size_t n)
{
    while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r'))
        i++;
    return i;
}

/* p[i] == '"': the index after the closing quote, or 0. */
static size_t
str_end(const char *p, size_t i, size_t n)
{
    for (i++; i < n; i++) {
        if (p[i] == '\\')
            i++;
        else if (p[i] == '"')
            return i + 1;
    }
    return 0;
}

/* The index after the value starting at p[i], or 0. Containers are matched by
 * depth only: the grammar was checked when the item was stored. */
static size_t
value_end(const char *p, size_t i, size_t n)
{
    if (i >= n)
        return 0;
    if (p[i] == '"')
        return str_end(p, i, n);
    if (p[i] == '{' || p[i] == '[') {
        size_t depth = 0;
        while (i < n) {
            char c = p[i];
            if (c == '"') {
                i = str_end(p, i, n);
                if (!i)
                    return 0;
                continue;
            }
            if (c == '{' || c == '[') {
                depth++;
            } else if (c == '}' || c == ']') {
                if (--depth == 0)
                    return i + 1;
            }
            i++;
        }
        return 0;
    }
    size_t j = i;
    while (j < n && !strchr(",}] \t\r\n", p[j]))
        j++;
    return j > i ? j : 0;
}

/* 1 and the span when the object has a top-level "metadata", 0 when it has
 * none, -1 when p is not a JSON object. */
static int
find_metadata(const char *p, size_t n, size_t *off, size_t *vlen)
{
    static const char key[] = "metadata";
    size_t i = skip_ws(p, 0, n);
    if (i >= n || p[i] != '{')
        return -1;
    i = skip_ws(p, i + 1, n);
    if (i < n && p[i] == '}')
        return 0;
    for (;;) {
        if (i >= n || p[i] != '"')
            return -1;
        size_t ke = str_end(p, i, n);
        if (!ke)
            return -1;
        bool is_meta = ke - i - 2 == sizeof key - 1 && !memcmp(p + i + 1, key, sizeof key - 1);
        i = skip_ws(p, ke, n);
        if (i >= n || p[i] != ':')
            return -1;
        i = skip_ws(p, i + 1, n);
        size_t ve = value_end(p, i, n);
        if (!ve)
            return -1;
        if (is_meta) {
            *off = i;
            *vlen = ve - i;
            return 1;
        }
        i = skip_ws(p, ve, n);
        if (i < n && p[i] == ',')
            i = skip_ws(p, i + 1, n);
        else if (i < n && p[i] == '}')
            return 0;
        else
            return -1;
    }
}

/* ------------------------------------------------------------------------ */
/* Go's encoding/json                                                         */

/* A JSON string as json.Encoder writes it (escapeHTML on). s is valid UTF-8
 * (jansson's strings are). */
static void
add_jstr(struct gostr_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    gostr_addc(b, '"');
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[7] = {0};
        size_t skip = 0;
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
        } else if (c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t') {
            esc[0] = '\\';
            esc[1] = c == '\b' ? 'b' : c == '\f' ? 'f' : c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
        } else if (c < 0x20 || c == '<' || c == '>' || c == '&') {
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 0xF];
        } else if (c == 0xE2 && i + 2 < n && (unsigned char)s[i + 1] == 0x80 &&
                   ((unsigned char)s[i + 2] & 0xFE) == 0xA8) {
            memcpy(esc, (unsigned char)s[i + 2] == 0xA8 ? "\\u2028" : "\\u2029", 6);
            skip = 2;
        } else {
            continue;
        }
        gostr_addn(b, s + start, i - start);
        gostr_add(b, esc);
        i += skip;
        start = i + 1;
    }
    gostr_addn(b, s + start, n - start);
    gostr_addc(b, '"');
}

static void
add_int(struct gostr_buf *b, json_int_t v)
{
    if (v < 0) {
        gostr_addc(b, '-');
        gostr_addu(b, (uint64_t)0 - (uint64_t)v);
    } else {
        gostr_addu(b, (uint64_t)v);
    }
}

/* A float64 as encoding/json writes it: the shortest digits that read back,
 * fixed notation unless |f| < 1e-6 or >= 1e21, exponent without padding. */
static void
add_float(struct gostr_buf *b, double f)
{
    char e[40], out[400];
    int prec;
    for (prec = 0; prec < 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec, f);
        if (strtod(e, NULL) == f)
            break;
    }
    snprintf(e, sizeof e, "%.*e", prec, f);
    /* e: [-]d[.ddd]e(+|-)XX */
    char *ep = strchr(e, 'e');
    int exp = atoi(ep + 1);
    char digits[24];
    size_t nd = 0;
    for (const char *q = e; q < ep; q++)
        if (*q >= '0' && *q <= '9')
            digits[nd++] = *q;
    bool neg = e[0] == '-';
    double a = fabs(f);
    size_t o = 0;
    if (neg)
        out[o++] = '-';
    if (a != 0 && (a < 1e-6 || a >= 1e21)) {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            memcpy(out + o, digits + 1, nd - 1);
            o += nd - 1;
        }
        o += (size_t)snprintf(out + o, sizeof out - o, "e%c%02d", exp < 0 ? '-' : '+', abs(exp));
        /* e-07 -> e-7 (Go keeps e+21 two-digit) */
        if (o >= 4 && out[o - 4] == 'e' && out[o - 3] == '-' && out[o - 2] == '0') {
            out[o - 2] = out[o - 1];
            o--;
        }
    } else if (exp < 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int k = -1; k > exp; k--)
            out[o++] = '0';
        memcpy(out + o, digits, nd);
        o += nd;
    } else {
        for (int k = 0; k <= exp || (size_t)k < nd; k++) {
            if (k == exp + 1)
                out[o++] = '.';
            out[o++] = (size_t)k < nd ? digits[k] : '0';
        }
    }
    gostr_addn(b, out, o);
}

static int
cmp_keys(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sorted keys of an object (new array of borrowed keys). */
static const char **
sorted_keys(json_t *o, size_t *n)
{
    size_t k = 0;
    const char **keys = malloc((json_object_size(o) + 1) * sizeof *keys);
    if (!keys)
        abort();
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) keys[k++] = key;
    qsort(keys, k, sizeof *keys, cmp_keys);
    *n = k;
    return keys;
}

/* Any value as json.Marshal writes the interface{} Go decoded it into. */
static void
add_any(struct gostr_buf *b, json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        size_t n;
        const char **keys = sorted_keys(v, &n);
        gostr_addc(b, '{');
        for (size_t i = 0; i < n; i++) {
            if (i)
                gostr_addc(b, ',');
            add_jstr(b, keys[i], strlen(keys[i]));
            gostr_addc(b, ':');
            add_any(b, json_object_get(v, keys[i]));
        }
        gostr_addc(b, '}');
        free(keys);
        break;
    }
    case JSON_ARRAY:
        gostr_addc(b, '[');
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i)
                gostr_addc(b, ',');
            add_any(b, json_array_get(v, i));
        }
        gostr_addc(b, ']');
        break;
    case JSON_STRING:
        add_jstr(b, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER:
        add_int(b, json_integer_value(v));
        break;
    case JSON_REAL:
        add_float(b, json_real_value(v));
        break;
    case JSON_TRUE:
        gostr_add(b, "true");
        break;
    case JSON_FALSE:
        gostr_add(b, "false");
        break;
    case JSON_NULL:
        gostr_add(b, "null");
        break;
    }
}

/* ------------------------------------------------------------------------ */
/* metav1.Time                                                                */

#define POM_TIME_MAX 64

static bool
num(const char *s, size_t n, int min, int max, int *out)
{
    int x = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        x = x * 10 + (s[i] - '0');
    }
    *out = x;
    return x >= min && x <= max;
}

static bool
leap(int64_t y)
{
    return y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
}

static int64_t
days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static void
civil_from_days(int64_t z, int64_t *y, int *m, int *d)
{
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*m <= 2);
}

/*
 * time.Parse(time.RFC3339, s) (the fast path): the instant as Unix seconds
 * and nanoseconds (the fraction kept, to nine digits, as Go keeps it).
 * 1 a time, 0 the zero time (time.Time{}.IsZero), -1 unparsable.
 */
static int
go_time_parse(const char *s, size_t n, int64_t *sec, int32_t *nsec)
{
    static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int Y, M, D, h, mi, se, ns = 0;
    if (n < 19 || !num(s, 4, 0, 9999, &Y) || !num(s + 5, 2, 1, 12, &M) ||
        !num(s + 11, 2, 0, 23, &h) || !num(s + 14, 2, 0, 59, &mi) || !num(s + 17, 2, 0, 59, &se))
        return -1;
    int dim = mdays[M - 1] + (M == 2 && leap(Y));
    if (!num(s + 8, 2, 1, dim, &D) || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' ||
        s[16] != ':')
        return -1;
    size_t i = 19;
    if (n - i >= 2 && s[i] == '.' && s[i + 1] >= '0' && s[i + 1] <= '9') {
        size_t j = i + 1, k = 0;
        for (; j < n && s[j] >= '0' && s[j] <= '9'; j++)
            if (k++ < 9)
                ns = ns * 10 + (s[j] - '0');
        for (; k < 9; k++)
            ns *= 10;
        i = j;
    }
    int64_t off = 0;
    if (!(n - i == 1 && s[i] == 'Z')) {
        int oh, om;
        if (n - i != 6 || !num(s + i + 1, 2, 0, 23, &oh) || !num(s + i + 4, 2, 0, 59, &om) ||
            (s[i] != '+' && s[i] != '-') || s[i + 3] != ':')
            return -1;
        off = (oh * 60 + om) * 60 * (s[i] == '-' ? -1 : 1);
    }
    *sec = days_from_civil(Y, M, D) * 86400 + h * 3600 + mi * 60 + se - off;
    *nsec = ns;
    return *sec == days_from_civil(1, 1, 1) * 86400 && ns == 0 ? 0 : 1;
}

/* t.UTC().Format(RFC3339) of Unix seconds t into out (POM_TIME_MAX bytes). */
static void
go_time_format(int64_t t, char *out)
{
    int64_t days = t >= 0 ? t / 86400 : -((-t + 86399) / 86400);
    int64_t rem = t - days * 86400;
    int64_t y;
    int M, D;
    civil_from_days(days, &y, &M, &D);
    /* appendInt(year, 4): a sign, then at least four digits */
    snprintf(out, POM_TIME_MAX, "%s%04llu-%02u-%02uT%02u:%02u:%02uZ", y < 0 ? "-" : "",
             (unsigned long long)(y < 0 ? -y : y), (unsigned)M % 100, (unsigned)D % 100,
             (unsigned)(rem / 3600) % 100, (unsigned)(rem / 60 % 60), (unsigned)(rem % 60));
}

/* Parse, then (a time) format into out: 1 written, 0 the zero time, -1
 * unparsable. */
static int
go_time(const char *s, size_t n, char *out)
{
    int64_t sec;
    int32_t nsec;
    int r = go_time_parse(s, n, &sec, &nsec);
    if (r == 1)
        go_time_format(sec, out);
    return r;
}

/* ------------------------------------------------------------------------ */
/* ObjectMeta of an unstructured object                                      */

struct fields {
    struct gostr_buf *b;
    bool first;
};

static void
key(struct fields *f, const char *k)
{
    if (!f->first)
        gostr_addc(f->b, ',');
    f->first = false;
    add_jstr(f->b, k, strlen(k));
    gostr_addc(f->b, ':');
}

/* A string field with omitempty. */
static void
str_field(struct fields *f, json_t *md, const char *k)
{
    json_t *v = json_object_get(md, k);
    if (json_is_string(v) && json_string_length(v) > 0) {
        key(f, k);
        add_jstr(f->b, json_string_value(v), json_string_length(v));
    }
}

/* Like str_field but written even when empty (OwnerReference's fields). */
static void
str_field_always(struct fields *f, json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    key(f, k);
    if (json_is_string(v))
        add_jstr(f->b, json_string_value(v), json_string_length(v));
    else
        gostr_add(f->b, "\"\"");
}

/* The time at md[k]: 1 and out, 0 zero (absent, "", unparsable, zero). */
static int
time_field(json_t *md, const char *k, char *out)
{
    json_t *v = json_object_get(md, k);
    if (!json_is_string(v))
        return 0;
    return go_time(json_string_value(v), json_string_length(v), out) == 1;
}

static void
add_time(struct fields *f, const char *k, int have, const char *t)
{
    key(f, k);
    if (have) {
        gostr_addc(f->b, '"');
        gostr_add(f->b, t);
        gostr_addc(f->b, '"');
    } else {
        gostr_add(f->b, "null");
    }
}

static void
string_map(struct fields *f, json_t *md, const char *k)
{
    json_t *m = json_object_get(md, k), *v;
    const char *kk;
    if (!json_is_object(m) || json_object_size(m) == 0)
        return;
    json_object_foreach(m, kk, v) if (!json_is_string(v) && !json_is_null(v)) return;
    size_t n;
    const char **keys = sorted_keys(m, &n);
    key(f, k);
    gostr_addc(f->b, '{');
    for (size_t i = 0; i < n; i++) {
        if (i)
            gostr_addc(f->b, ',');
        add_jstr(f->b, keys[i], strlen(keys[i]));
        gostr_addc(f->b, ':');
        v = json_object_get(m, keys[i]);
        if (json_is_string(v))
            add_jstr(f->b, json_string_value(v), json_string_length(v));
        else
            gostr_add(f->b, "\"\"");
    }
    gostr_addc(f->b, '}');
    free(keys);
}

static void
owner_refs(struct fields *f, json_t *md)
{
    json_t *a = json_object_get(md, "ownerReferences");
    if (!json_is_array(a) || json_array_size(a) == 0)
        return;
    for (size_t i = 0; i < json_array_size(a); i++)
        if (!json_is_object(json_array_get(a, i)))
            return;
    key(f, "ownerReferences");
    gostr_addc(f->b, '[');
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *o = json_array_get(a, i), *v;
        struct fields of = {f->b, true};
        if (i)
            gostr_addc(f->b, ',');
        gostr_addc(f->b, '{');
        str_field_always(&of, o, "apiVersion");
        str_field_always(&of, o, "kind");
        str_field_always(&of, o, "name");
        str_field_always(&of, o, "uid");
        if (json_is_boolean(v = json_object_get(o, "controller"))) {
            key(&of, "controller");
            gostr_add(f->b, json_is_true(v) ? "true" : "false");
        }
        if (json_is_boolean(v = json_object_get(o, "blockOwnerDeletion"))) {
            key(&of, "blockOwnerDeletion");
            gostr_add(f->b, json_is_true(v) ? "true" : "false");
        }
        gostr_addc(f->b, '}');
    }
    gostr_addc(f->b, ']');
}

static void
finalizers(struct fields *f, json_t *md)
{
    json_t *a = json_object_get(md, "finalizers");
    if (!json_is_array(a) || json_array_size(a) == 0)
        return;
    for (size_t i = 0; i < json_array_size(a); i++)
        if (!json_is_string(json_array_get(a, i)))
            return;
    key(f, "finalizers");
    gostr_addc(f->b, '[');
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *v = json_array_get(a, i);
        if (i)
            gostr_addc(f->b, ',');
        add_jstr(f->b, json_string_value(v), json_string_length(v));
    }
    gostr_addc(f->b, ']');
}

/* One ManagedFieldsEntry into e; false when FromUnstructured would fail. */
static bool
managed_entry(struct gostr_buf *e, json_t *o)
{
    static const char *const strs[] = {"manager",    "operation", "apiVersion", NULL,
                                       "fieldsType", NULL,        "subresource"};
    struct fields f = {e, true};
    gostr_addc(e, '{');
    for (size_t i = 0; i < sizeof strs / sizeof *strs; i++) {
        const char *k = strs[i] ? strs[i] : i == 3 ? "time" : "fieldsV1";
        json_t *v = json_object_get(o, k);
        if (!v || json_is_null(v))
            continue;
        if (i == 3) {
            char t[POM_TIME_MAX];
            int r =
                json_is_string(v) ? go_time(json_string_value(v), json_string_length(v), t) : -1;
            if (r < 0)
                return false;
            add_time(&f, k, r, t);
        } else if (i == 5) {
            key(&f, k);
            add_any(e, v);
        } else {
            if (!json_is_string(v))
                return false;
            if (json_string_length(v) > 0) {
                key(&f, k);
                add_jstr(e, json_string_value(v), json_string_length(v));
            }
        }
    }
    gostr_addc(e, '}');
    return true;
}

static void
managed_fields(struct fields *f, json_t *md)
{
    json_t *a = json_object_get(md, "managedFields");
    if (!json_is_array(a) || json_array_size(a) == 0)
        return;
    struct gostr_buf e = {0};
    gostr_addc(&e, '[');
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *o = json_array_get(a, i);
        if (i)
            gostr_addc(&e, ',');
        if (!json_is_object(o) || !managed_entry(&e, o)) {
            free(gostr_take(&e));
            return;
        }
    }
    gostr_addc(&e, ']');
    key(f, "managedFields");
    gostr_addn(f->b, e.p, e.len);
    free(gostr_take(&e));
}

static void
object_meta(struct gostr_buf *b, json_t *md)
{
    struct fields f = {b, true};
    json_t *v;
    char t[POM_TIME_MAX];
    gostr_addc(b, '{');
    str_field(&f, md, "name");
    str_field(&f, md, "generateName");
    str_field(&f, md, "namespace");
    str_field(&f, md, "selfLink");
    str_field(&f, md, "uid");
    str_field(&f, md, "resourceVersion");
    if (json_is_integer(v = json_object_get(md, "generation")) && json_integer_value(v) != 0) {
        key(&f, "generation");
        add_int(b, json_integer_value(v));
    }
    add_time(&f, "creationTimestamp", time_field(md, "creationTimestamp", t), t);
    if (time_field(md, "deletionTimestamp", t))
        add_time(&f, "deletionTimestamp", 1, t);
    if (json_is_integer(v = json_object_get(md, "deletionGracePeriodSeconds"))) {
        key(&f, "deletionGracePeriodSeconds");
        add_int(b, json_integer_value(v));
    }
    string_map(&f, md, "labels");
    string_map(&f, md, "annotations");
    owner_refs(&f, md);
    finalizers(&f, md);
    managed_fields(&f, md);
    gostr_addc(b, '}');
}

/* ------------------------------------------------------------------------ */

/* The unstructured object's "metadata" value, parsed: 0 and *md (new, NULL
 * when absent), or -1 when the item is not a JSON object or the value is
 * not JSON. */
static int
load_metadata(const char *p, size_t len, json_t **md)
{
    size_t off = 0, vlen = 0;
    int found = find_metadata(p, len, &off, &vlen);
    *md = NULL;
    if (found < 0)
        return -1;
    if (found) {
        json_error_t err;
        *md = json_loadb(p + off, vlen, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
        if (!*md)
            return -1;
    }
    return 0;
}

int
pom_json(struct gostr_buf *b, const void *item, size_t len, bool unstructured)
{
    static const char head[] =
        "{\"kind\":\"" POM_KIND "\",\"apiVersion\":\"" POM_API_VERSION "\",\"metadata\":";
    const char *p = item;
    size_t off = 0, vlen = 0;
    if (!unstructured && find_metadata(p, len, &off, &vlen) > 0) {
        gostr_add(b, head);
        gostr_addn(b, p + off, vlen);
        gostr_addc(b, '}');
        return 0;
    }
    json_t *md;
    if (load_metadata(p, len, &md) != 0)
        return -1;
    gostr_add(b, head);
    object_meta(b, json_is_object(md) ? md : NULL);
    gostr_addc(b, '}');
    json_decref(md);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Protobuf                                                                   */

int
pom_pb(struct gostr_buf *b, const void *msg, size_t len)
{
    return pb_object_meta(b, msg, len); /* field 1 is every object's ObjectMeta */
}

/*
 * The typed ObjectMeta of an unstructured object as gogo's generated
 * MarshalToSizedBuffer writes it (k8s.io/apimachinery/pkg/apis/meta/v1
 * generated.pb.go): fields in ascending number; every string and int64 the
 * struct holds by value written even when empty or zero (1 name,
 * 2 generateName, 3 namespace, 4 selfLink, 5 uid, 6 resourceVersion,
 * 7 generation, 8 creationTimestamp), pointers only when set (9
 * deletionTimestamp, 10 deletionGracePeriodSeconds), slices and maps only
 * when not empty (11 labels, 12 annotations: entries {1 key, 2 value} in
 * key order; 13 ownerReferences, 14 finalizers, 17 managedFields).
 * metav1.Time is {1 seconds, 2 nanos}, both written, nanos always 0
 * (time_proto.go ProtoTime leaves the fraction out: "our JSON only handled
 * seconds"), and an empty message for the zero time; a time with only a
 * fraction past the zero instant is not zero. The values are read as the
 * JSON form reads them above: the same accessors, the same failures. (kube
 * <= 1.24 also wrote field 15, the deprecated clusterName, always; it is
 * gone since 1.25.)
 */

static void
pb_varint(struct gostr_buf *b, uint64_t v)
{
    char t[10];
    size_t n = 0;
    do {
        t[n++] = (char)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    gostr_addn(b, t, n);
}

#define WT_VARINT 0u
#define WT_LEN 2u

static void
pb_tag(struct gostr_buf *b, unsigned field, unsigned wt)
{
    pb_varint(b, (uint64_t)field << 3 | wt);
}

static void
pb_bytes(struct gostr_buf *b, unsigned field, const char *p, size_t n)
{
    pb_tag(b, field, WT_LEN);
    pb_varint(b, n);
    gostr_addn(b, p, n);
}

/* m as a message field; m is emptied. */
static void
pb_msg(struct gostr_buf *b, unsigned field, struct gostr_buf *m)
{
    pb_bytes(b, field, m->p ? m->p : "", m->len);
    free(gostr_take(m));
}

static void
pb_int(struct gostr_buf *b, unsigned field, uint64_t v)
{
    pb_tag(b, field, WT_VARINT);
    pb_varint(b, v);
}

/* A string held by value: o[k] when it is a string, else "". */
static void
pb_str(struct gostr_buf *b, unsigned field, json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    if (json_is_string(v))
        pb_bytes(b, field, json_string_value(v), json_string_length(v));
    else
        pb_bytes(b, field, "", 0);
}

/* A metav1.Time: r as go_time_parse returned it (1 a time, else zero); sec
 * its Unix seconds (time.Time.Unix: the fraction, never negative, is not
 * in them). */
static void
pb_time(struct gostr_buf *b, unsigned field, int r, int64_t sec)
{
    struct gostr_buf m = {0};
    if (r == 1) {
        pb_int(&m, 1, (uint64_t)sec);
        pb_int(&m, 2, 0);
    }
    pb_msg(b, field, &m);
}

/* The time at md[k] as the accessors read it (1 a time, else zero). */
static int
pb_time_value(json_t *md, const char *k, int64_t *sec)
{
    json_t *v = json_object_get(md, k);
    int32_t nsec;
    if (!json_is_string(v))
        return 0;
    return go_time_parse(json_string_value(v), json_string_length(v), sec, &nsec) == 1;
}

static void
pb_string_map(struct gostr_buf *b, unsigned field, json_t *md, const char *k)
{
    json_t *m = json_object_get(md, k), *v;
    const char *kk;
    if (!json_is_object(m) || json_object_size(m) == 0)
        return;
    json_object_foreach(m, kk, v) if (!json_is_string(v) && !json_is_null(v)) return;
    size_t n;
    const char **keys = sorted_keys(m, &n);
    for (size_t i = 0; i < n; i++) {
        struct gostr_buf e = {0};
        pb_bytes(&e, 1, keys[i], strlen(keys[i]));
        pb_str(&e, 2, m, keys[i]);
        pb_msg(b, field, &e);
    }
    free(keys);
}

static void
pb_bool(struct gostr_buf *b, unsigned field, json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    if (json_is_boolean(v))
        pb_int(b, field, json_is_true(v));
}

static void
pb_owner_refs(struct gostr_buf *b, json_t *md)
{
    json_t *a = json_object_get(md, "ownerReferences");
    if (!json_is_array(a))
        return;
    for (size_t i = 0; i < json_array_size(a); i++)
        if (!json_is_object(json_array_get(a, i)))
            return;
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *o = json_array_get(a, i);
        struct gostr_buf m = {0};
        pb_str(&m, 1, o, "kind");
        pb_str(&m, 3, o, "name");
        pb_str(&m, 4, o, "uid");
        pb_str(&m, 5, o, "apiVersion");
        pb_bool(&m, 6, o, "controller");
        pb_bool(&m, 7, o, "blockOwnerDeletion");
        pb_msg(b, 13, &m);
    }
}

static void
pb_finalizers(struct gostr_buf *b, json_t *md)
{
    json_t *a = json_object_get(md, "finalizers");
    if (!json_is_array(a))
        return;
    for (size_t i = 0; i < json_array_size(a); i++)
        if (!json_is_string(json_array_get(a, i)))
            return;
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *v = json_array_get(a, i);
        pb_bytes(b, 14, json_string_value(v), json_string_length(v));
    }
}

/* One ManagedFieldsEntry {1 manager, 2 operation, 3 apiVersion, 4 time
 * (*Time), 6 fieldsType, 7 fieldsV1 (*FieldsV1 {1 raw: the value as
 * json.Marshal writes it}), 8 subresource} into e; false when
 * FromUnstructured would fail (as managed_entry). A null is the zero value. */
static bool
pb_managed_entry(struct gostr_buf *e, json_t *o)
{
    static const struct {
        const char *k;
        unsigned field;
    } strs[] = {
        {"manager", 1}, {"operation", 2}, {"apiVersion", 3}, {"fieldsType", 6}, {"subresource", 8}};
    /* first the checks, then the fields in number order */
    for (size_t i = 0; i < sizeof strs / sizeof *strs; i++) {
        json_t *v = json_object_get(o, strs[i].k);
        if (v && !json_is_null(v) && !json_is_string(v))
            return false;
    }
    json_t *t = json_object_get(o, "time"), *f = json_object_get(o, "fieldsV1");
    int64_t sec = 0;
    int32_t nsec = 0;
    int tr = 0;
    if (t && !json_is_null(t)) {
        tr = json_is_string(t)
                 ? go_time_parse(json_string_value(t), json_string_length(t), &sec, &nsec)
                 : -1;
        if (tr < 0)
            return false;
    }
    for (size_t i = 0; i < 3; i++)
        pb_str(e, strs[i].field, o, strs[i].k);
    if (t && !json_is_null(t))
        pb_time(e, 4, tr, sec);
    pb_str(e, 6, o, "fieldsType");
    if (f && !json_is_null(f)) {
        struct gostr_buf raw = {0}, m = {0};
        add_any(&raw, f);
        pb_msg(&m, 1, &raw);
        pb_msg(e, 7, &m);
    }
    pb_str(e, 8, o, "subresource");
    return true;
}

static void
pb_managed_fields(struct gostr_buf *b, json_t *md)
{
    json_t *a = json_object_get(md, "managedFields");
    if (!json_is_array(a) || json_array_size(a) == 0)
        return;
    struct gostr_buf all = {0};
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *o = json_array_get(a, i);
        struct gostr_buf e = {0};
        if (!json_is_object(o) || !pb_managed_entry(&e, o)) {
            free(gostr_take(&e));
            free(gostr_take(&all));
            return;
        }
        pb_msg(&all, 17, &e);
    }
    gostr_addn(b, all.p, all.len);
    free(gostr_take(&all));
}

static void
object_meta_pb(struct gostr_buf *b, json_t *md)
{
    static const char *const strs[] = {"name",     "generateName", "namespace",
                                       "selfLink", "uid",          "resourceVersion"};
    for (unsigned i = 0; i < sizeof strs / sizeof *strs; i++)
        pb_str(b, i + 1, md, strs[i]);
    json_t *v = json_object_get(md, "generation");
    pb_int(b, 7, json_is_integer(v) ? (uint64_t)json_integer_value(v) : 0);
    int64_t sec = 0;
    int r = pb_time_value(md, "creationTimestamp", &sec);
    pb_time(b, 8, r, sec);
    if (pb_time_value(md, "deletionTimestamp", &sec))
        pb_time(b, 9, 1, sec);
    if (json_is_integer(v = json_object_get(md, "deletionGracePeriodSeconds")))
        pb_int(b, 10, (uint64_t)json_integer_value(v));
    pb_string_map(b, 11, md, "labels");
    pb_string_map(b, 12, md, "annotations");
    pb_owner_refs(b, md);
    pb_finalizers(b, md);
    pb_managed_fields(b, md);
}

int
pom_pb_from_json(struct gostr_buf *b, const void *item, size_t len)
{
    json_t *md;
    if (load_metadata(item, len, &md) != 0)
        return -1;
    struct gostr_buf m = {0};
    object_meta_pb(&m, json_is_object(md) ? md : NULL);
    json_decref(md);
    pb_msg(b, 1, &m);
    return 0;
}
