/*
 * object_fuzz.c — libFuzzer target for cache/object.c: upstream bytes through
 * obj_meta_parse, the watch stream splitter, wevent_parse and obj_list_*.
 *
 * Every input goes through all of them, with exact-length copies (no NUL) so
 * ASan sees any read past the end, and is checked against object.h's
 * contracts and two oracles:
 *  - jansson: the input, as the "object" of an event line or as the one item
 *    of a list, is accepted whenever jansson parses it as a JSON object, with
 *    the input minus the whitespace around it as the span; and every span
 *    the scanner accepts, jansson parses as an object too (the validating
 *    scanner agrees with jansson on grammar, UTF-8, escapes and depth);
 *  - the splitter gives the same lines, error and pending count whether the
 *    input arrives whole or in pieces (sizes taken from the input).
 */
#include "kwc/object.h"

#include "fuzz_labels.h"

#include "kwc/base.h"
#include "kwc/index.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const struct obj_field fields[] = {
    {"spec.nodeName", NULL},      {"status.phase", NULL}, {"spec.hostNetwork", "false"},
    {"status.podIPs.0.ip", NULL}, {"type", NULL},         {"spec.replicas", NULL},
    {"metadata.name", NULL},      {"a.0.b.1", NULL},      {"", NULL},
};
static const struct obj_fields_spec spec = {fields, KWC_ARRAY_LEN(fields), 0, 64};

static void
check(bool cond)
{
    if (!cond)
        abort();
}

static char *
copy(const char *parts[], const size_t lens[], size_t n, size_t *total)
{
    size_t t = 0;
    for (size_t i = 0; i < n; i++)
        t += lens[i];
    char *p = xmalloc(t ? t : 1);
    for (size_t i = 0, at = 0; i < n; at += lens[i], i++)
        memcpy(p + at, parts[i], lens[i]);
    *total = t;
    return p;
}

static bool
is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static void
check_meta(const char *json, size_t len)
{
    struct obj_meta m;
    char err[128];
    int rc = obj_meta_parse(json, len, &spec, &m, err, sizeof(err));
    check(rc == 0 || rc == KWC_EPARSE || rc == KWC_ETOOBIG);
    if (rc == 0) {
        check(m.name && *m.name && m.namespace_ && m.uid && m.rv > 0);
        check(m.n_fields == KWC_ARRAY_LEN(fields) && m.n_labels <= 64);
        for (size_t i = 0; i < m.n_fields; i++)
            check(m.fields[i] && strlen(m.fields[i]) <= len + 32);
        for (size_t i = 1; i < m.n_labels; i++)
            check(strcmp(m.labels[i - 1].key, m.labels[i].key) < 0);
        check(fuzz_index_labels_ok(&m));
    } else {
        check(memchr(err, '\0', sizeof(err)) != NULL && m.arena_ == NULL);
    }
    obj_meta_fini(&m);
}

/*
 * Whether jansson reads json as an object: 1 yes, 0 no, -1 when the answer
 * says nothing about the syntax (a NUL in a key, a number out of range, a raw
 * NUL byte, which jansson sometimes skips).
 */
static int
jansson_object(const char *json, size_t len)
{
    json_error_t e;
    if (memchr(json, '\0', len)) /* jansson skips a raw NUL after a number */
        return -1;
    json_t *j = json_loadb(json, len, JSON_ALLOW_NUL, &e);
    if (!j && json_error_code(&e) == json_error_numeric_overflow)
        j = json_loadb(json, len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &e);
    if (!j) {
        enum json_error_code c = json_error_code(&e);
        return c == json_error_null_byte_in_key || c == json_error_numeric_overflow ? -1 : 0;
    }
    int is_obj = json_is_object(j);
    json_decref(j);
    return is_obj;
}

static void
trimmed(const char *in, size_t size, size_t *off, size_t *len)
{
    size_t a = 0, b = size;
    while (a < b && is_ws(in[a]))
        a++;
    while (b > a && is_ws(in[b - 1]))
        b--;
    *off = a;
    *len = b - a;
}

static void
event_oracle(const char *in, size_t size)
{
    static const char head[] = "{\"type\":\"ADDED\",\"object\":";
    const char *parts[] = {head, in, "}"};
    const size_t lens[] = {sizeof(head) - 1, size, 1};
    size_t n, off, len;
    char *line = copy(parts, lens, 3, &n);
    struct wevent ev;
    int rc = wevent_parse(line, n, &ev, NULL, 0);
    int want = jansson_object(in, size);
    check(rc == 0 || rc == KWC_EPARSE);
    /* in may close the object and go on ("{},\"x\":1"): the line is then
     * still an event, and the span must be what jansson calls an object */
    if (want == 1) {
        trimmed(in, size, &off, &len);
        check(rc == 0 && ev.obj_off == lens[0] + off && ev.obj_len == len);
    }
    if (rc == 0) {
        check(ev.type == WEVENT_ADDED && jansson_object(line + ev.obj_off, ev.obj_len) != 0);
        check_meta(line + ev.obj_off, ev.obj_len);
    }
    wevent_fini(&ev);
    free(line);
}

static void
check_list(const char *body, size_t n, size_t want_single)
{
    struct obj_list l;
    size_t off, len, count = 0, last_end = 0;
    int rc = obj_list_init(&l, body, n, NULL, 0);
    check(rc == 0 || rc == KWC_EPARSE || rc == KWC_ETOOBIG);
    if (rc != 0) {
        check(want_single == 0);
        obj_list_fini(&l);
        return;
    }
    check(l.rv > 0 && l.continue_);
    while (obj_list_next(&l, &off, &len) == 1) {
        check(off >= last_end && off + len <= n && len >= 2);
        check(body[off] == '{' && body[off + len - 1] == '}');
        check(jansson_object(body + off, len) != 0);
        check_meta(body + off, len);
        last_end = off + len;
        count++;
    }
    check(count == l.n_items);
    if (want_single)
        check(count == 1);
    obj_list_fini(&l);
}

static void
list_oracle(const char *in, size_t size)
{
    static const char head[] = "{\"metadata\":{\"resourceVersion\":\"1\"},\"items\":[";
    const char *parts[] = {head, in, "]}"};
    const size_t lens[] = {sizeof(head) - 1, size, 2};
    size_t n;
    char *body = copy(parts, lens, 3, &n);
    check_list(body, n, jansson_object(in, size) == 1);
    free(body);
    char *raw = copy(&in, &size, 1, &n);
    check_list(raw, n, 0);
    free(raw);
}

struct split_result {
    uint64_t hash;
    size_t lines, pending;
    int rc;
};

/* Split in pieces whose sizes come from the input bytes (0: all at once). */
static void
split(const char *in, size_t size, bool pieces, struct split_result *r)
{
    struct wframe_splitter s;
    wframe_init(&s, 512);
    memset(r, 0, sizeof(*r));
    r->hash = 1469598103934665603u;
    for (size_t at = 0, k = 0; at < size && r->rc == 0; k++) {
        size_t n = pieces ? 1 + (unsigned char)in[k % size] % 97 : size;
        if (n > size - at)
            n = size - at;
        char *chunk = xmalloc(n);
        memcpy(chunk, in + at, n);
        const char *p = chunk, *line;
        size_t left = n, line_len;
        int rc;
        while ((rc = wframe_next(&s, &p, &left, &line, &line_len)) == 1) {
            check(line_len <= 512 && !memchr(line, '\n', line_len));
            for (size_t i = 0; i < line_len; i++)
                r->hash = (r->hash ^ (unsigned char)line[i]) * 1099511628211u;
            r->hash = (r->hash ^ 0x100) * 1099511628211u;
            r->lines++;
            if (!pieces) {
                struct wevent ev;
                if (wevent_parse(line, line_len, &ev, NULL, 0) == 0) {
                    check(ev.obj_off + ev.obj_len <= line_len && line[ev.obj_off] == '{');
                    if (ev.type == WEVENT_ERROR)
                        check(ev.reason && ev.message);
                    if (ev.type == WEVENT_BOOKMARK)
                        check(ev.rv > 0);
                    check_meta(line + ev.obj_off, ev.obj_len);
                }
                wevent_fini(&ev);
            }
        }
        check(rc == 0 || rc == KWC_ETOOBIG);
        check(rc != 0 || left == 0);
        r->rc = rc;
        check(s.cap <= 512);
        free(chunk);
        at += n;
    }
    r->pending = wframe_pending(&s);
    wframe_fini(&s);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *in = (const char *)data;
    char *buf = xmalloc(size ? size : 1);
    memcpy(buf, in, size);

    check_meta(buf, size);
    event_oracle(buf, size);
    list_oracle(buf, size);

    struct split_result whole, pieces;
    split(buf, size, false, &whole);
    split(buf, size, true, &pieces);
    check(whole.hash == pieces.hash && whole.lines == pieces.lines && whole.rc == pieces.rc &&
          whole.pending == pieces.pending);

    struct wevent ev;
    if (wevent_parse(buf, size, &ev, NULL, 0) == 0)
        check(ev.obj_off + ev.obj_len <= size);
    wevent_fini(&ev);
    free(buf);
    return 0;
}
