/*
 * base_test.c — cache/base.c: the boolean, percent and base64 decoders and
 * kwc_strerror.
 *
 * Expected values come from the references the functions claim to follow:
 * Go's strconv.ParseBool, k8s.io/apimachinery's Convert_Slice_string_To_bool
 * (what kube-apiserver does with ?watch=...), Go's url unescaping and the
 * RFC 4648 section 10 test vectors.
 */
#include "kwc/base.h"

#include "tap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- kwc_query_bool ------------------------------------------------------ */

static void
test_query_bool(void)
{
    /* Convert_Slice_string_To_bool: only "0" and EqualFold("false") are false. */
    static const char *const falses[] = {"0", "false", "False", "FALSE", "fAlSe"};
    static const char *const trues[] = {"",    "1",   "t",    "T",      "true", "True",  "TRUE",
                                        "yes", "no",  "f",    "F",      "00",   "0 ",    " 0",
                                        "off", "nil", "fals", "falsee", "-1",   "false "};
    char what[64];
    for (size_t i = 0; i < KWC_ARRAY_LEN(falses); i++) {
        snprintf(what, sizeof what, "\"%s\" is false", falses[i]);
        ok(!kwc_query_bool(falses[i], strlen(falses[i])), what);
    }
    for (size_t i = 0; i < KWC_ARRAY_LEN(trues); i++) {
        snprintf(what, sizeof what, "\"%s\" is true", trues[i]);
        ok(kwc_query_bool(trues[i], strlen(trues[i])), what);
    }
    /* The length is what counts, not a NUL: "0" inside a longer buffer. */
    ok(!kwc_query_bool("0abc", 1), "length-bounded \"0\" is false");
    ok(!kwc_query_bool("falsexyz", 5), "length-bounded \"false\" is false");
    ok(kwc_query_bool("0abc", 2), "length-bounded \"0a\" is true");
}

/* ---- kwc_parse_bool ------------------------------------------------------ */

static void
test_parse_bool(void)
{
    static const char *const yes[] = {"1", "t", "T", "TRUE", "true", "True"};
    static const char *const no[] = {"0", "f", "F", "FALSE", "false", "False"};
    static const char *const bad[] = {"",      "tRuE", "fAlSe", "yes",  "no", "on",
                                      "off",   "2",    "-1",    "01",   " 1", "1 ",
                                      "true ", "tr",   "Tr",    "TRUe", "y",  "truex"};
    char what[64];
    for (size_t i = 0; i < KWC_ARRAY_LEN(yes); i++) {
        bool b = false;
        snprintf(what, sizeof what, "\"%s\" parses", yes[i]);
        is_int(kwc_parse_bool(yes[i], strlen(yes[i]), &b), 0, what);
        snprintf(what, sizeof what, "\"%s\" is true", yes[i]);
        ok(b, what);
    }
    for (size_t i = 0; i < KWC_ARRAY_LEN(no); i++) {
        bool b = true;
        snprintf(what, sizeof what, "\"%s\" parses", no[i]);
        is_int(kwc_parse_bool(no[i], strlen(no[i]), &b), 0, what);
        snprintf(what, sizeof what, "\"%s\" is false", no[i]);
        ok(!b, what);
    }
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad); i++) {
        bool b = true;
        snprintf(what, sizeof what, "\"%s\" is an error", bad[i]);
        is_int(kwc_parse_bool(bad[i], strlen(bad[i]), &b), KWC_EPARSE, what);
        snprintf(what, sizeof what, "\"%s\" leaves *out alone", bad[i]);
        ok(b, what);
    }
    bool b = false;
    is_int(kwc_parse_bool("trueXYZ", 4, &b), 0, "length-bounded \"true\" parses");
    ok(b, "length-bounded \"true\" is true");
    is_int(kwc_parse_bool("1\0", 2, &b), KWC_EPARSE, "embedded NUL is an error");
}

/* ---- kwc_pct_decode ------------------------------------------------------ */

/* Decode s (NUL-terminated input) into a buffer of exactly strlen(s) + 1 bytes
 * so ASan sees any write past the documented size. */
static int
pct(const char *s, bool plus, char **out, size_t *outlen)
{
    size_t n = strlen(s);
    *out = xmalloc(n + 1);
    memset(*out, 'X', n + 1);
    return kwc_pct_decode(s, n, plus, *out, outlen);
}

static void
check_pct(const char *in, bool plus, const char *want, size_t wantlen, const char *what)
{
    char *out;
    size_t n = 12345;
    int rc = pct(in, plus, &out, &n);
    is_int(rc, 0, what);
    if (rc == 0) {
        is_mem(out, n, want, wantlen, what);
        ok(out[n] == '\0', "output is NUL-terminated");
    }
    free(out);
}

static void
test_pct_decode(void)
{
    check_pct("", false, "", 0, "empty");
    check_pct("abc", false, "abc", 3, "no escapes");
    check_pct("a%20b", false, "a b", 3, "%20");
    check_pct("%41%42%43", false, "ABC", 3, "only escapes");
    check_pct("%7e%7E", false, "~~", 2, "lower- and upper-case hex");
    check_pct("a%2Fb", false, "a/b", 3, "%2F becomes a slash");
    check_pct("%25", false, "%", 1, "%25 is a literal percent");
    check_pct("%2541", false, "%41", 3, "decoded once, not twice");
    check_pct("%ff%00x", false, "\xff\0x", 3, "any byte, NUL included");
    check_pct("a+b", false, "a+b", 3, "'+' kept in a path");
    check_pct("a+b", true, "a b", 3, "'+' is a space in a query");
    check_pct("a%2Bb", true, "a+b", 3, "%2B is a plus even in a query");
    check_pct("++", true, "  ", 2, "several pluses");
    check_pct("app%3Dx%2Ctier+in+%28a%29", true, "app=x,tier in (a)", 17, "a label selector");

    /* Go's url.unescape rejects an escape without two hex digits after it. */
    static const char *const bad[] = {"%",   "%4", "a%",  "a%4", "%zz", "%4z",
                                      "%z4", "%%", "%-1", "% 1", "%g0", "ab%2"};
    char what[64];
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad); i++) {
        char *out;
        size_t n;
        snprintf(what, sizeof what, "\"%s\" is rejected", bad[i]);
        is_int(pct(bad[i], false, &out, &n), KWC_EPARSE, what);
        free(out);
    }

    /* Only len bytes are read: an escape cut off by len is truncated. */
    char out[8];
    size_t n;
    is_int(kwc_pct_decode("%41", 2, false, out, &n), KWC_EPARSE, "escape cut by len");
    is_int(kwc_pct_decode("ab%41", 2, false, out, &n), 0, "stops at len");
    is_mem(out, n, "ab", 2, "stops at len: value");
}

/* ---- kwc_base64_decode --------------------------------------------------- */

static void
check_b64(const char *in, const char *want, size_t wantlen, const char *what)
{
    unsigned char *out = NULL;
    size_t n = 12345;
    int rc = kwc_base64_decode(in, strlen(in), &out, &n);
    is_int(rc, 0, what);
    if (rc == 0)
        is_mem(out, n, want, wantlen, what);
    free(out);
}

static void
test_base64_decode(void)
{
    /* RFC 4648 section 10, padded and unpadded. */
    static const struct {
        const char *plain, *padded, *bare;
    } v[] = {
        {"", "", ""},
        {"f", "Zg==", "Zg"},
        {"fo", "Zm8=", "Zm8"},
        {"foo", "Zm9v", "Zm9v"},
        {"foob", "Zm9vYg==", "Zm9vYg"},
        {"fooba", "Zm9vYmE=", "Zm9vYmE"},
        {"foobar", "Zm9vYmFy", "Zm9vYmFy"},
    };
    char what[64];
    for (size_t i = 0; i < KWC_ARRAY_LEN(v); i++) {
        snprintf(what, sizeof what, "\"%s\" -> \"%s\"", v[i].padded, v[i].plain);
        check_b64(v[i].padded, v[i].plain, strlen(v[i].plain), what);
        snprintf(what, sizeof what, "\"%s\" (no padding) -> \"%s\"", v[i].bare, v[i].plain);
        check_b64(v[i].bare, v[i].plain, strlen(v[i].plain), what);
    }

    /* 0xfb 0xff = 111110 111111 1111(00): 62, 63, 60 -> "+/8" or URL-safe "-_8". */
    check_b64("+/8=", "\xfb\xff", 2, "standard alphabet + and /");
    check_b64("-_8=", "\xfb\xff", 2, "URL-safe alphabet - and _");
    check_b64("-_8", "\xfb\xff", 2, "URL-safe, unpadded");
    /* All 64 symbols once: 48 bytes, first and last three worked out by hand. */
    static const char all64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    unsigned char *out = NULL;
    size_t n = 0;
    is_int(kwc_base64_decode(all64, 64, &out, &n), 0, "whole alphabet decodes");
    is_int(n, 48, "64 symbols are 48 bytes");
    /* "ABCD" = sextets 0,1,2,3 = 000000 000001 000010 000011 = 0x00 0x10 0x83. */
    if (out && n >= 3)
        is_mem(out, 3, "\x00\x10\x83", 3, "first three bytes");
    /* "89+/" = 60,61,62,63 = 111100 111101 111110 111111 = 0xf3 0xdf 0xbf. */
    if (out && n == 48)
        is_mem(out + 45, 3, "\xf3\xdf\xbf", 3, "last three bytes");
    free(out);

    /* PEM-style line breaks inside (kubeconfig data fields are pasted). */
    check_b64("Zm9v\nYmFy\n", "foobar", 6, "newlines ignored");
    check_b64("Zm9v\r\nYmE=\r\n", "fooba", 5, "CRLF ignored");

    static const char *const bad[] = {
        "Z", "Zm9vY", "Zm9v!", "Zm 9v*", "Zg==Zg==", "Zg=a", "Zm9v.", "\x80\x81", "Zm9v\"", "Z==="};
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad); i++) {
        out = NULL;
        snprintf(what, sizeof what, "garbage #%zu rejected", i);
        is_int(kwc_base64_decode(bad[i], strlen(bad[i]), &out, &n), KWC_EPARSE, what);
    }
}

/* ---- kwc_strerror -------------------------------------------------------- */

static void
test_strerror(void)
{
    const char *s0 = kwc_strerror(0);
    ok(s0 && *s0, "0 has a text");
    is_str(kwc_strerror(-ENOENT), strerror(ENOENT), "-ENOENT is strerror(ENOENT)");
    is_str(kwc_strerror(-EINVAL), strerror(EINVAL), "-EINVAL is strerror(EINVAL)");

    const char *unknown = kwc_strerror(-(KWC_ERRBASE + 999));
    ok(unknown && *unknown, "an unknown project code has a text");

    static const struct {
        int code;
        const char *name;
    } codes[] = {
#define ROW(name, n, text) {name, #name},
        KWC_ERRORS(ROW)
#undef ROW
    };
    ok(KWC_ARRAY_LEN(codes) >= 6, "at least the six documented codes");
    char what[96];
    for (size_t i = 0; i < KWC_ARRAY_LEN(codes); i++) {
        const char *s = kwc_strerror(codes[i].code);
        snprintf(what, sizeof what, "%s has its own text", codes[i].name);
        ok(s && *s && strcmp(s, unknown) != 0 && strcmp(s, s0) != 0, what);
        snprintf(what, sizeof what, "%s is outside the errno range", codes[i].name);
        ok(codes[i].code <= -KWC_ERRBASE, what);
        for (size_t j = 0; j < i; j++) {
            snprintf(what, sizeof what, "%s and %s differ", codes[j].name, codes[i].name);
            ok(codes[i].code != codes[j].code && strcmp(s, kwc_strerror(codes[j].code)) != 0, what);
        }
    }
}

/* ---- kwc_parse_duration, kwc_parse_quantity ------------------------------ */

/* Expected values from Go's time.ParseDuration table (time_test.go
 * parseDurationTests) and its error cases, in milliseconds. */
static void
test_parse_duration(void)
{
    static const struct {
        const char *in;
        uint64_t ms;
    } good[] = {{"0", 0},
                {"5s", 5000},
                {"30s", 30000},
                {"1478s", 1478000},
                {"+5s", 5000},
                {"5.0s", 5000},
                {"5.6s", 5600},
                {"5.s", 5000},
                {".5s", 500},
                {"1.0s", 1000},
                {"1.004s", 1004},
                {"100.00100s", 100001},
                {"10ms", 10},
                {"1500us", 1},
                {"2000000ns", 2},
                {"3\xc2\xb5s", 0},
                {"3m", 180000},
                {"2m", 120000},
                {"10h", 36000000},
                {"3h30m", 12600000},
                {"10.5s4m", 250500},
                {"1h2m3s4ms5us6ns", 3723004},
                {"39h9m14.425s", 140954425},
                {"0.3333333333333333333h", 1200000},
                {"9223372036854775807ns", 9223372036854ull}};
    char what[96];
    for (size_t i = 0; i < KWC_ARRAY_LEN(good); i++) {
        uint64_t ms = 7;
        snprintf(what, sizeof what, "duration \"%s\"", good[i].in);
        is_int(kwc_parse_duration(good[i].in, &ms), 0, what);
        is_int((long long)ms, (long long)good[i].ms, what);
    }
    static const char *const bad[] = {
        "",    "3",         "-3s", "s",   ".s",  ".",   "1d",
        "1.5", "x",         "1sx", "3 s", " 3s", "1hh", "9223372036854775808ns",
        "-0",  "300000000h"};
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad); i++) {
        uint64_t ms;
        snprintf(what, sizeof what, "duration \"%s\" refused", bad[i]);
        is_int(kwc_parse_duration(bad[i], &ms), KWC_EPARSE, what);
    }
}

/* Expected strings from Go's time.Duration.String (time_test.go
 * durationTests), at millisecond precision. */
static void
test_format_duration(void)
{
    static const struct {
        uint64_t ms;
        const char *out;
    } t[] = {{0, "0s"},
             {1, "1ms"},
             {25, "25ms"},
             {999, "999ms"},
             {1000, "1s"},
             {1500, "1.5s"},
             {2001, "2.001s"},
             {60000, "1m0s"},
             {90000, "1m30s"},
             {600000, "10m0s"},
             {3600000, "1h0m0s"},
             {5400500, "1h30m0.5s"},
             {86400000, "24h0m0s"},
             {360000000000ull, "100000h0m0s"}};
    char buf[KWC_DURATION_LEN], what[64];
    for (size_t i = 0; i < KWC_ARRAY_LEN(t); i++) {
        snprintf(what, sizeof what, "%llu ms", (unsigned long long)t[i].ms);
        is_str(kwc_format_duration(t[i].ms, buf, sizeof buf), t[i].out, what);
        uint64_t back;
        ok(kwc_parse_duration(buf, &back) == 0 && back == t[i].ms, "parses back");
    }
}

/* Expected values from resource.Quantity: the suffix tables of
 * k8s.io/apimachinery/pkg/api/resource/suffix.go and Value()'s rounding up. */
static void
test_parse_quantity(void)
{
    static const struct {
        const char *in;
        uint64_t bytes;
    } good[] = {{"0", 0},
                {"4096", 4096},
                {"1Ki", 1024},
                {"1Mi", 1048576},
                {"64Mi", 67108864},
                {"1Gi", 1073741824},
                {"1.5Gi", 1610612736},
                {"16Gi", 17179869184ull},
                {"1Ti", 1099511627776ull},
                {"100k", 100000},
                {"1M", 1000000},
                {"2G", 2000000000},
                {"1e3", 1000},
                {"1E3", 1000},
                {"1E", 1000000000000000000ull},
                {"0.1", 1},
                {"1.2", 2},
                {"+5", 5},
                {"1e-1", 1}};
    char what[96];
    for (size_t i = 0; i < KWC_ARRAY_LEN(good); i++) {
        uint64_t b = 7;
        snprintf(what, sizeof what, "quantity \"%s\"", good[i].in);
        is_int(kwc_parse_quantity(good[i].in, &b), 0, what);
        is_int((long long)b, (long long)good[i].bytes, what);
    }
    static const char *const bad[] = {"",  "-1",   "1m",    "1KiB",  "1kb", "Gi",
                                      ".", "1 Gi", "1e3Gi", "100Ei", "x",   "1u"};
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad); i++) {
        uint64_t b;
        snprintf(what, sizeof what, "quantity \"%s\" refused", bad[i]);
        is_int(kwc_parse_quantity(bad[i], &b), KWC_EPARSE, what);
    }
}

int
main(void)
{
    TAP_RUN(test_parse_duration);
    TAP_RUN(test_parse_quantity);
    TAP_RUN(test_format_duration);
    TAP_RUN(test_query_bool);
    TAP_RUN(test_parse_bool);
    TAP_RUN(test_pct_decode);
    TAP_RUN(test_base64_decode);
    TAP_RUN(test_strerror);
    return tap_done();
}
