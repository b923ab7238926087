/*
 * cont_test.c — cache/cont.c: continue tokens.
 *
 * Tokens are built by hand from the format kube-apiserver writes
 * (k8s.io/apiserver/pkg/storage/continue.go EncodeContinue: json.Marshal of
 * {"v","rv","start"}, then base64.RawURLEncoding), the base64 taken from an
 * independent encoder (Python's base64.urlsafe_b64encode, padding stripped);
 * each token's JSON is in the comment beside it. Which tokens DecodeContinue
 * accepts, and what it decodes them to, is worked out from continue.go and
 * Go's encoding/base64 and encoding/json.
 */
#include "kwc/cont.h"

#include "kwc/base.h"
#include "tap.h"

#include <stdlib.h>
#include <string.h>

/* {"v":"meta.k8s.io/v1","rv":12345,"start":"default/pod-a\u0000"} */
#define TOK_KUBE_NS                                                                                \
    "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTIzNDUsInN0YXJ0IjoiZGVmYXVsdC9wb2QtYVx1MDAwMCJ9"
/* {"v":"meta.k8s.io/v1","rv":7,"start":"pod-a\u0000"} */
#define TOK_KUBE_IN_NS "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6Nywic3RhcnQiOiJwb2QtYVx1MDAwMCJ9"

struct ok_case {
    const char *what, *token;
    int64_t rv;
    const char *start;
    size_t start_len;
};

/* clang-format off */
static const struct ok_case ok_cases[] = {
    {"kube token, cluster-wide namespaced list", TOK_KUBE_NS, 12345, "default/pod-a\0", 14},
    {"kube token, within a namespace", TOK_KUBE_IN_NS, 7, "pod-a\0", 6},
    /* "start":"/ns/a\u0000": a leading '/' is the prefix boundary */
    {"leading slash", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6OSwic3RhcnQiOiIvbnMvYVx1MDAwMCJ9", 9, "ns/a\0", 5},
    /* "start":"/" is clean: the whole prefix */
    {"start at the prefix", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6OSwic3RhcnQiOiIvIn0", 9, "", 0},
    /* the same with non-zero bits after the last byte (Go's decoder is not strict) */
    {"trailing bits ignored", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6OSwic3RhcnQiOiIvIn3", 9, "", 0},
    /* rv -1: the token kube-apiserver sends with its 410 for a compacted continue */
    {"negative rv", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6LTEsInN0YXJ0IjoibnMvYlx1MDAwMCJ9", -1, "ns/b\0", 5},
    /* "rv":9223372036854775807,"start":"x" */
    {"largest rv", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6OTIyMzM3MjAzNjg1NDc3NTgwNywic3RhcnQiOiJ4In0", INT64_MAX, "x", 1},
    /* "start":"\ud83d\ude00x": a surrogate pair is one rune */
    {"surrogate pair", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6Mywic3RhcnQiOiJcdWQ4M2RcdWRlMDB4In0", 3, "\xF0\x9F\x98\x80x", 5},
    /* "start":"a\u003cb\u003e\u0026c\/d\u0000": json.Marshal's HTML escapes, "\/" */
    {"escapes", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NCwic3RhcnQiOiJhXHUwMDNjYlx1MDAzZVx1MDAyNmNcL2RcdTAwMDAifQ", 4, "a<b>&c/d\0", 9},
    /* ' {\t"start" : "x" ,\r\n"rv":2 , "v":"meta.k8s.io/v1" }\n' */
    {"whitespace, any key order", "IHsJInN0YXJ0IiA6ICJ4IiAsDQoicnYiOjIgLCAidiI6Im1ldGEuazhzLmlvL3YxIiB9Cg", 2, "x", 1},
    /* "start":"..\u0000" is no ".." element */
    {"dots and a NUL", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6OCwic3RhcnQiOiIuLlx1MDAwMCJ9", 8, "..\0", 3},
};

struct bad_case {
    const char *what, *token;
};

/* Tokens DecodeContinue refuses too (kube-apiserver: 400 "invalid continue
 * token: continue key is not valid: ..."). */
static const struct bad_case bad_cases[] = {
    {"illegal base64 byte", "eyJ2Ijo*"},
    {"padding", "eyJhIjoxfQ=="},
    {"standard alphabet", "+/8"},
    {"one character left over", "QUJDR"},
    {"empty token", ""},
    {"not JSON", "aGVsbG8"},                                             /* hello */
    {"truncated JSON", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6Mywic3Rh"},   /* {"v":..,"rv":3,"sta */
    {"trailing bytes", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6Mywic3RhcnQiOiJ4In0geA"}, /* {..} x */
    {"array", "WzFd"},
    {"number", "NDI"},
    {"null", "bnVsbA"},
    {"rv a string", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6IjUiLCJzdGFydCI6ImFcdTAwMDAifQ"},
    {"rv fractional", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MS41LCJzdGFydCI6ImFcdTAwMDAifQ"},
    {"rv with exponent", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MWUzLCJzdGFydCI6ImFcdTAwMDAifQ"},
    {"rv overflows int64", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6OTIyMzM3MjAzNjg1NDc3NTgwOCwic3RhcnQiOiJhXHUwMDAwIn0"},
    {"rv a bool", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6dHJ1ZSwic3RhcnQiOiJ4In0"},
    {"v an object", "eyJ2Ijp7ImEiOjF9LCJydiI6Mywic3RhcnQiOiJ4In0"},
    {"start a number", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6Mywic3RhcnQiOjV9"},
    {"start null", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NSwic3RhcnQiOm51bGx9"},
    {"other version", "eyJ2IjoibWV0YS5rOHMuaW8vdjIiLCJydiI6NSwic3RhcnQiOiJhXHUwMDAwIn0"},
    {"no version", "eyJydiI6NSwic3RhcnQiOiJhXHUwMDAwIn0"},
    {"rv 0", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MCwic3RhcnQiOiJhXHUwMDAwIn0"},
    {"no rv", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJzdGFydCI6ImFcdTAwMDAifQ"},
    {"empty start", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NSwic3RhcnQiOiIifQ"},
    {"path traversal", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NSwic3RhcnQiOiJhLy4uL2IifQ"}, /* a/../b */
    {"trailing slash", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NSwic3RhcnQiOiJucy8ifQ"},  /* ns/ */
    {"double slash", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NSwic3RhcnQiOiJhLy9iIn0"},   /* a//b */
    {"dot element", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NSwic3RhcnQiOiIuL2EifQ"},     /* ./a */
    {"dot-dot", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NSwic3RhcnQiOiIuLiJ9"},           /* .. */
    {"rooted double slash", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NSwic3RhcnQiOiIvL2EifQ"}, /* //a */
};

/* Tokens DecodeContinue reads but cont_decode refuses, so that kwc passes
 * them to the upstream. */
static const struct bad_case lenient_cases[] = {
    /* Go's base64 skips CR and LF */
    {"newlines in base64", "eyJ2IjoibWV0\nYS5rOHMuaW8vdjEiLCJydiI6Nywic3RhcnQiOiJwb2QtYVx1MDAwMCJ9\r\n"},
    /* {"V":..,"RV":3,"Start":"x\u0000"}: encoding/json folds key case */
    {"keys in other case", "eyJWIjoibWV0YS5rOHMuaW8vdjEiLCJSViI6MywiU3RhcnQiOiJ4XHUwMDAwIn0"},
    /* ..,"extra":[1,{"a":null}] */
    {"unknown key", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6Mywic3RhcnQiOiJ4IiwiZXh0cmEiOlsxLHsiYSI6bnVsbH1dfQ"},
    /* "rv":1,..,"rv":2: the last wins */
    {"duplicate key", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MSwic3RhcnQiOiJ4IiwicnYiOjJ9"},
    /* "start":"x","start":null: null leaves "x" */
    {"null ignored", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6Mywic3RhcnQiOiJ4Iiwic3RhcnQiOm51bGx9"},
    /* "start":"\ud800x": a lone surrogate becomes U+FFFD */
    {"lone surrogate", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6Mywic3RhcnQiOiJcdWQ4MDB4In0"},
    /* "start":"x<ff>y": invalid UTF-8 becomes U+FFFD */
    {"invalid UTF-8", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6Mywic3RhcnQiOiJ4_3kifQ"},
};
/* clang-format on */

static void
test_decode_ok(void)
{
    for (size_t i = 0; i < KWC_ARRAY_LEN(ok_cases); i++) {
        const struct ok_case *c = &ok_cases[i];
        struct cont_token t;
        int rc = cont_decode(c->token, strlen(c->token), &t);
        is_int(rc, 0, c->what);
        if (rc != 0)
            continue;
        is_int(t.rv, c->rv, "rv");
        is_mem(t.start, t.start_len, c->start, c->start_len, "start key");
        ok(t.start[t.start_len] == '\0', "start NUL-terminated");
        cont_token_fini(&t);
    }
}

static void
refuse(const struct bad_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct cont_token t;
        is_int(cont_decode(cases[i].token, strlen(cases[i].token), &t), KWC_EPARSE, cases[i].what);
        ok(t.start == NULL && t.start_len == 0, "nothing decoded");
        cont_token_fini(&t);
    }
}

static void
test_decode_bad(void)
{
    refuse(bad_cases, KWC_ARRAY_LEN(bad_cases));
}

static void
test_decode_lenient_refused(void)
{
    refuse(lenient_cases, KWC_ARRAY_LEN(lenient_cases));
}

static void
test_bounds(void)
{
    char *big = xmalloc(CONT_MAX_TOKEN + 2);
    memset(big, 'A', CONT_MAX_TOKEN + 1);
    big[CONT_MAX_TOKEN + 1] = '\0';
    struct cont_token t;
    is_int(cont_decode(big, CONT_MAX_TOKEN + 1, &t), KWC_ETOOBIG, "oversize token refused");
    /* at the bound it is decoded: 3072 zero bytes, not JSON */
    is_int(cont_decode(big, CONT_MAX_TOKEN, &t), KWC_EPARSE, "token at the bound decoded");
    free(big);
    /* the length is explicit: bytes past it are never read */
    is_int(cont_decode(TOK_KUBE_NS "garbage*", strlen(TOK_KUBE_NS), &t), 0, "only len bytes read");
    is_int(t.rv, 12345, "rv from the first len bytes");
    cont_token_fini(&t);

    /* {"v":"meta.k8s.io/v1","rv":5,"start":"k...k\u0000"}: 3026 k's make a
     * 4096-byte token, 3027 one byte more */
    char *key = xmalloc(CONT_MAX_TOKEN + 1);
    memset(key, 'k', CONT_MAX_TOKEN + 1);
    char *tok = NULL;
    is_int(cont_encode(5, key, 3026, &tok), 0, "largest key encoded");
    is_int(strlen(tok), CONT_MAX_TOKEN, "token of CONT_MAX_TOKEN bytes");
    is_int(cont_decode(tok, strlen(tok), &t), 0, "and decoded back");
    is_int(t.start_len, 3027, "whole key + NUL");
    cont_token_fini(&t);
    free(tok);
    tok = NULL;
    is_int(cont_encode(5, key, 3027, &tok), KWC_ETOOBIG, "one more byte refused");
    ok(tok == NULL, "no token");
    is_int(cont_encode(5, key, CONT_MAX_TOKEN + 1, &tok), KWC_ETOOBIG, "oversize key refused");
    ok(tok == NULL, "no token");
    free(key);
}

static void
test_encode(void)
{
    char *tok = NULL;
    is_int(cont_encode(12345, "default/pod-a", 13, &tok), 0, "encode");
    is_str(tok, TOK_KUBE_NS, "the bytes kube-apiserver writes");
    free(tok);
    is_int(cont_encode(7, "pod-a", 5, &tok), 0, "encode in a namespace");
    is_str(tok, TOK_KUBE_IN_NS, "namespace-relative key");
    free(tok);

    /* json.Marshal escaping: HTML-safe <, >, &; \n, \", \\ short escapes:
     * {"v":"meta.k8s.io/v1","rv":-1,"start":"a\u003cb\u003e\u0026c\n\"\\\u0000"} */
    is_int(cont_encode(-1, "a<b>&c\n\"\\", 9, &tok), 0, "encode escapes");
    is_str(
        tok,
        "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6LTEsInN0YXJ0IjoiYVx1MDAzY2JcdTAwM2VcdTAwMjZjXG5cIlxc"
        "XHUwMDAwIn0",
        "Go's HTML-safe escaping");
    free(tok);
    /* invalid byte -> \ufffd, U+2028 escaped, \b short (Go >= 1.22), other
     * controls \u00XX, DEL and other UTF-8 raw:
     * {"v":..,"rv":42,"start":"x\ufffd\u2028\b\u0001<7f>é\u0000"} */
    is_int(cont_encode(42, "x\xFF\xE2\x80\xA8\b\x01\x7F\xC3\xA9", 10, &tok), 0, "encode bytes");
    is_str(
        tok,
        "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NDIsInN0YXJ0IjoieFx1ZmZmZFx1MjAyOFxiXHUwMDAxf8OpXHUw"
        "MDAwIn0",
        "Go's escaping of odd bytes");
    free(tok);
    /* U+2029, \f, \t, \r, 0x1f; rv INT64_MIN:
     * {"v":..,"rv":-9223372036854775808,"start":"\u2029\f\t\r\u001f\u0000"} */
    is_int(cont_encode(INT64_MIN, "\xE2\x80\xA9\f\t\r\x1F", 7, &tok), 0, "encode more bytes");
    is_str(
        tok,
        "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6LTkyMjMzNzIwMzY4NTQ3NzU4MDgsInN0YXJ0IjoiXHUyMDI5XGZc"
        "dFxyXHUwMDFmXHUwMDAwIn0",
        "U+2029 and short escapes");
    free(tok);
}

/* encode then decode gives back rv and key + "\0" */
static void
test_round_trip(void)
{
    static const struct {
        int64_t rv;
        const char *key;
        size_t len;
    } rt[] = {
        {1, "a", 1},
        {INT64_MAX, "kube-system/coredns-5d78c9869d-abcde", 36},
        {-1, "ns/name", 7},
        {INT64_MIN, "x", 1},
        {99, "with\0nul", 8},
        {3, "\xC3\xA9t\xC3\xA9/\xE2\x82\xAC", 9},
        {4, "quote\"back\\slash<&>", 19},
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(rt); i++) {
        char *tok = NULL;
        struct cont_token t;
        is_int(cont_encode(rt[i].rv, rt[i].key, rt[i].len, &tok), 0, "encode");
        is_int(cont_decode(tok, strlen(tok), &t), 0, "decode");
        is_int(t.rv, rt[i].rv, "rv survives");
        ok(t.start_len == rt[i].len + 1 && memcmp(t.start, rt[i].key, rt[i].len) == 0 &&
               t.start[rt[i].len] == '\0',
           "key + NUL survives");
        cont_token_fini(&t);
        free(tok);
    }
    cont_token_fini(NULL);
}

int
main(void)
{
    TAP_RUN(test_decode_ok);
    TAP_RUN(test_decode_bad);
    TAP_RUN(test_decode_lenient_refused);
    TAP_RUN(test_bounds);
    TAP_RUN(test_encode);
    TAP_RUN(test_round_trip);
    return tap_done();
}
