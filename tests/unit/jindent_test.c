/*
 * jindent_test.c — cache/jindent.c: compact JSON re-indented as Go's
 * json.MarshalIndent(v, "", "  ") writes it, fed in pieces split anywhere
 * and written out through any room.
 *
 * The expected texts are written out by hand from encoding/json's Indent
 * rules (and what MarshalIndent gives for such values: kube's pretty
 * output), not from the code under test.
 */
#include "kwc/jindent.h"

#include <stdlib.h>

#include "tap.h"

/* The whole input at once into ample room. */
static size_t
indent_all(const char *in, size_t n, char *out, size_t cap)
{
    struct jindent j;
    jindent_init(&j);
    size_t used, w = jindent_run(&j, in, n, &used, out, cap);
    ok(used == n && !jindent_pending(&j), "everything consumed and written");
    return w;
}

/* The input split at `split`, the output through a room of `room` bytes. */
static size_t
indent_pieces(const char *in, size_t n, size_t split, size_t room, char *out, size_t cap)
{
    struct jindent j;
    jindent_init(&j);
    size_t w = 0;
    size_t cuts[3] = {0, split, n};
    for (int p = 0; p < 2; p++) {
        const char *s = in + cuts[p];
        size_t left = cuts[p + 1] - cuts[p];
        for (;;) {
            size_t used, r = room < cap - w ? room : cap - w;
            w += jindent_run(&j, s, left, &used, out + w, r);
            s += used;
            left -= used;
            if (left == 0 && !jindent_pending(&j))
                break;
            if (w == cap)
                return w;
        }
    }
    return w;
}

static void
check(const char *in, const char *want, const char *what)
{
    char out[4096];
    size_t n = indent_all(in, strlen(in), out, sizeof out);
    is_mem(out, n, want, strlen(want), what);
}

static void
test_rules(void)
{
    check("{}\n", "{}", "an empty object stays compact, no newline at the end");
    check("[]\n", "[]", "an empty array stays compact");
    check("{\"a\":1}\n", "{\n  \"a\": 1\n}", "one key");
    check("[1,2,3]", "[\n  1,\n  2,\n  3\n]", "an array");
    check("{\"a\":{},\"b\":[],\"c\":[{}]}\n",
          "{\n  \"a\": {},\n  \"b\": [],\n  \"c\": [\n    {}\n  ]\n}", "empty ones inside");
    check("{\"a\":{\"b\":{\"c\":[true,false,null]}}}",
          "{\n  \"a\": {\n    \"b\": {\n      \"c\": [\n        true,\n        false,\n"
          "        null\n      ]\n    }\n  }\n}",
          "nested, scalars");
    check("{\"k\":-1.5e+10}", "{\n  \"k\": -1.5e+10\n}", "a number as it is");
    check("\"x\"\n", "\"x\"", "a bare string");
    check("{\"a,b\":\"c:d{}[]\"}", "{\n  \"a,b\": \"c:d{}[]\"\n}",
          "punctuation in strings untouched");
    check("{\"q\":\"say \\\"hi\\\", {ok}\"}", "{\n  \"q\": \"say \\\"hi\\\", {ok}\"\n}",
          "escaped quotes keep the string open");
    check("{\"p\":\"C:\\\\\",\"n\":1}", "{\n  \"p\": \"C:\\\\\",\n  \"n\": 1\n}",
          "an escaped backslash before the closing quote");
    check("[\"\\u003chtml\\u003e\\u0026 \\u2028\",\"\xc3\xa9\"]",
          "[\n  \"\\u003chtml\\u003e\\u0026 \\u2028\",\n  \"\xc3\xa9\"\n]",
          "unicode escapes and UTF-8 bytes untouched");
    check("{\"s\":\" a\\n\\tb \"}", "{\n  \"s\": \" a\\n\\tb \"\n}", "whitespace in strings kept");
    check("{ \"a\" : [ 1 , 2 ] }\n", "{\n  \"a\": [\n    1,\n    2\n  ]\n}",
          "whitespace outside strings dropped (Indent's rule)");
    check("]]}{", "\n]\n]\n}{", "stray closes never take the depth below zero");
    check("", "", "nothing in, nothing out");
}

/* A kube-like list, split at every byte, written through rooms of 1..7 bytes
 * and ample room: always the same bytes. */
static const char sample[] =
    "{\"kind\":\"PodList\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":\"12\"},"
    "\"items\":[{\"metadata\":{\"name\":\"a\\\"b\\\\\",\"labels\":{\"x\":\"\\u003c\"},"
    "\"annotations\":{}},\"spec\":{\"containers\":[{\"args\":[\"-c\",\"echo \\\\\\\"\"]}],"
    "\"n\":[1,2.5,-3e2,true,false,null]},\"status\":{}},{\"metadata\":{\"name\":\"c\"}}]}\n";

static void
test_split_anywhere(void)
{
    size_t n = strlen(sample);
    char want[8192], got[8192];
    size_t wn = indent_all(sample, n, want, sizeof want);
    ok(wn > n, "the sample grows");
    size_t bad = 0;
    for (size_t split = 0; split <= n; split++) {
        for (size_t room = 1; room <= 8; room++) {
            size_t room_ = room == 8 ? sizeof got : room;
            size_t gn = indent_pieces(sample, n, split, room_, got, sizeof got);
            if (gn != wn || memcmp(got, want, wn) != 0) {
                if (!bad)
                    printf("#   split %zu room %zu: %.*s\n", split, room_, (int)gn, got);
                bad++;
            }
        }
    }
    is_int(bad, 0, "every split, every room: the same output");

    /* re-compacting the output (whitespace outside strings dropped) gives
     * the input without its newline */
    char comp[8192];
    size_t cn = 0;
    bool str = false, esc = false;
    for (size_t i = 0; i < wn; i++) {
        char c = want[i];
        if (str) {
            str = esc || c != '"';
            esc = !esc && c == '\\';
            comp[cn++] = c;
        } else if (c != ' ' && c != '\n') {
            str = c == '"';
            comp[cn++] = c;
        }
    }
    is_mem(comp, cn, sample, n - 1, "compacted back: the input");
}

/* Deep nesting: the indentation is counted, not buffered; a room of 3 bytes
 * still gets all of it. */
static void
test_deep(void)
{
    enum { D = 3000 };
    char *in = malloc(2 * D + 1);
    size_t n = 0;
    for (size_t i = 0; i < D; i++)
        in[n++] = '[';
    in[n++] = '1';
    for (size_t i = 0; i < D; i++)
        in[n++] = ']';
    /* each '[' is followed by '\n' and 2*d spaces (d = 1..D); then "1";
     * each ']' is preceded by '\n' and 2*d spaces (d = D-1..0) */
    size_t want = 0;
    for (size_t d = 1; d <= D; d++)
        want += 2 + 2 * d;
    want += 1;
    for (size_t d = 0; d < D; d++)
        want += 2 + 2 * d;
    size_t cap = want + 16;
    char *all = malloc(cap), *small = malloc(cap);
    size_t an = indent_all(in, n, all, cap);
    is_int(an, want, "the indentation of every level");
    size_t sn = indent_pieces(in, n, n / 2, 3, small, cap);
    is_mem(small, sn, all, an, "through a room of 3 bytes: the same");
    free(in);
    free(all);
    free(small);
}

int
main(void)
{
    TAP_RUN(test_rules);
    TAP_RUN(test_split_anywhere);
    TAP_RUN(test_deep);
    return tap_done();
}
