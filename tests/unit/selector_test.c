/*
 * selector_test.c — cache/selector.c: label and field selectors.
 *
 * Expected results come from k8s.io/apimachinery as shipped with Kubernetes
 * 1.27-1.33: the cases of pkg/labels/selector_test.go and
 * pkg/fields/selector_test.go, messages kube-apiserver was seen answering
 * (quoted in public issues: "app:monolith", "a/b/c", a 64-byte value,
 * "app.kubernetes_io/name"), and the rest worked out by hand from
 * labels.Parser, NewRequirement, validation.IsQualifiedName /
 * IsValidLabelValue, field.Error and fields.parseSelector.
 */
#include "kwc/selector.h"

#include "kwc/base.h"
#include "tap.h"

#include <stdlib.h>
#include <string.h>

/* Messages of k8s.io/apimachinery/pkg/util/validation (RegexError spelled out). */
#define NAME_RE                                                                                    \
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "    \
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "         \
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
#define NAME_PART "name part " NAME_RE
#define QNAME_SLASHES                                                                              \
    "a qualified name " NAME_RE " with an optional DNS subdomain prefix and '/' (e.g. "            \
    "'example.com/MyName')"
#define PREFIX_PART                                                                                \
    "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "          \
    "characters, '-' or '.', and must start and end with an alphanumeric character (e.g. "         \
    "'example.com', regex used for validation is "                                                 \
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
#define VALUE_RE                                                                                   \
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "    \
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "             \
    "'my_value',  or '12345', regex used for validation is "                                       \
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
#define REQ "unable to parse requirement: "
#define KEYERR(q) REQ "<nil>: Invalid value: " q ": "
#define GTLT ": for 'Gt', 'Lt' operators, the value must be an integer"
#define OPS "in, notin, =, ==, !=, gt, lt"

#define A10 "aaaaaaaaaa"
#define A63 A10 A10 A10 A10 A10 A10 "aaa"
#define A64 A63 "a"
#define Z10 "zzzzzzzzzz"
#define Z63 Z10 Z10 Z10 Z10 Z10 Z10 "zzz"
#define Z64 Z63 "z"

struct pcase {
    const char *label, *field;
    int rc;
    const char *msg; /* NULL when rc == 0 */
};

/* clang-format off */
static const struct pcase parse_cases[] = {
    /* labels.TestSelectorParse good strings, TestSetSelectorParser valid ones */
    {"x=a,y=b,z=c", NULL, 0, NULL},
    {"", NULL, 0, NULL},
    {NULL, NULL, 0, NULL},
    {"x!=a,y=b", NULL, 0, NULL},
    {"x=", NULL, 0, NULL},
    {"x= ", NULL, 0, NULL},
    {"x=,z= ", NULL, 0, NULL},
    {"x= ,z= ", NULL, 0, NULL},
    {"!x", NULL, 0, NULL},
    {"x>1", NULL, 0, NULL},
    {"x>1,z<5", NULL, 0, NULL},
    {"\rx", NULL, 0, NULL},
    {"this-is-a-dns.domain.com/key-with-dash", NULL, 0, NULL},
    {"this-is-another-dns.domain.com/key-with-dash in (so,what)", NULL, 0, NULL},
    {"0.1.2.domain/99 notin (10.10.100.1, tick.tack.clock)", NULL, 0, NULL},
    {"foo  in\t (abc)", NULL, 0, NULL},
    {"x notin\n (abc)", NULL, 0, NULL},
    {"x  notin\t\t\t(abc,def)", NULL, 0, NULL},
    {"x in (abc,)", NULL, 0, NULL},
    {"x in ()", NULL, 0, NULL},
    {"x notin (abc,def),bar,z in (),w", NULL, 0, NULL},
    {"x,y in (a)", NULL, 0, NULL},
    {"x=a,y!=b,z in (h,i,j)", NULL, 0, NULL},
    {"x notin ( )", NULL, 0, NULL},
    {"x notin (, a)", NULL, 0, NULL},
    {"a ", NULL, 0, NULL},
    {"a in (x,y,notin, z,in)", NULL, 0, NULL},
    {"in in (in),notin notin (notin)", NULL, 0, NULL},
    {"x==a", NULL, 0, NULL},

    /* labels: the bad strings of the same tests, with the messages */
    {"x=a||y=b", NULL, KWC_EPARSE, REQ "values[0][x]: Invalid value: \"a||y\": " VALUE_RE},
    {"x==a==b", NULL, KWC_EPARSE, "found '==', expected: ',' or 'end of string'"},
    {"!x=a", NULL, KWC_EPARSE, "found '=', expected: ',' or 'end of string'"},
    {"x<a", NULL, KWC_EPARSE, REQ "values[0]: Invalid value: \"a\"" GTLT},
    {"x,,y", NULL, KWC_EPARSE, "found ',', expected: identifier after ','"},
    {",x,y", NULL, KWC_EPARSE, "found ',', expected: !, identifier, or 'end of string'"},
    {"x nott in (y)", NULL, KWC_EPARSE, REQ "found 'nott', expected: " OPS},
    {"a in (xyz),", NULL, KWC_EPARSE, "found '', expected: identifier after ','"},
    {"a in (xyz)b notin ()", NULL, KWC_EPARSE, "found 'b', expected: ',' or 'end of string'"},
    {"a in (xyz abc)", NULL, KWC_EPARSE, REQ "found 'abc', expected: ',' or ')'"},
    {"a notin(", NULL, KWC_EPARSE, REQ "found '', expected: ',', ')' or identifier"},
    {"a (", NULL, KWC_EPARSE, REQ "found '(', expected: " OPS},
    {"(", NULL, KWC_EPARSE, "found '(', expected: !, identifier, or 'end of string'"},
    {",", NULL, KWC_EPARSE, "found ',', expected: !, identifier, or 'end of string'"},
    {"!", NULL, KWC_EPARSE, REQ "found '', expected: identifier"},
    {"!!x", NULL, KWC_EPARSE, REQ "found '!', expected: identifier"},
    {"!x in (a)", NULL, KWC_EPARSE, "found 'in', expected: ',' or 'end of string'"},
    {"x!", NULL, KWC_EPARSE, REQ "found '!', expected: " OPS},
    {"x in", NULL, KWC_EPARSE, REQ "found '' expected: '('"},
    {"x in a", NULL, KWC_EPARSE, REQ "found 'a' expected: '('"},
    {"x in (a", NULL, KWC_EPARSE, REQ "found '', expected: ',' or ')'"},
    {"x in (a=)", NULL, KWC_EPARSE, REQ "found '=', expected: ',' or ')'"},
    {"x in (=)", NULL, KWC_EPARSE, REQ "found '=', expected: ',', ')' or identifier"},
    {"x=(a)", NULL, KWC_EPARSE, REQ "found '(', expected: identifier"},
    {"x>=1", NULL, KWC_EPARSE, REQ "found '=', expected: identifier"},
    {"x=a,", NULL, KWC_EPARSE, "found '', expected: identifier after ','"},
    {"x=a y", NULL, KWC_EPARSE, "found 'y', expected: ',' or 'end of string'"},

    /* ",," inside a value list: 1.27-1.33 consume the second comma */
    {"x in (a,,b)", NULL, 0, NULL},
    {"x in (,,a)", NULL, 0, NULL},
    {"x in (a,,,)", NULL, 0, NULL},
    {"x in (a,,)", NULL, KWC_EPARSE, REQ "found ')', expected: ',', or identifier"},
    {"x in (,,)", NULL, KWC_EPARSE, REQ "found ')', expected: ',', or identifier"},

    /* label keys (validateLabelKey with a nil field path: "<nil>") */
    {"app:monolith", NULL, KWC_EPARSE, KEYERR("\"app:monolith\"") NAME_PART},
    {"a/b/c ?=? def", NULL, KWC_EPARSE, KEYERR("\"a/b/c\"") QNAME_SLASHES},
    {"app.kubernetes_io/name=vault-secrets-operator", NULL, KWC_EPARSE,
     KEYERR("\"app.kubernetes_io/name\"") PREFIX_PART},
    {"-x", NULL, KWC_EPARSE, KEYERR("\"-x\"") NAME_PART},
    {"x-", NULL, KWC_EPARSE, KEYERR("\"x-\"") NAME_PART},
    {"/x", NULL, KWC_EPARSE, KEYERR("\"/x\"") "prefix part must be non-empty"},
    {"a/", NULL, KWC_EPARSE, KEYERR("\"a/\"") "name part must be non-empty; " NAME_PART},
    {"/", NULL, KWC_EPARSE,
     KEYERR("\"/\"") "prefix part must be non-empty; name part must be non-empty; " NAME_PART},
    {"Example.com/x", NULL, KWC_EPARSE, KEYERR("\"Example.com/x\"") PREFIX_PART},
    {"a..b/x", NULL, KWC_EPARSE, KEYERR("\"a..b/x\"") PREFIX_PART},
    {"example.com/" A64, NULL, KWC_EPARSE,
     KEYERR("\"example.com/" A64 "\"") "name part must be no more than 63 characters"},
    {A64 "-", NULL, KWC_EPARSE,
     KEYERR("\"" A64 "-\"") "name part must be no more than 63 characters; " NAME_PART},
    {"example.com/" A64 "=x", NULL, KWC_EPARSE,
     KEYERR("\"example.com/" A64 "\"") "name part must be no more than 63 characters"},
    {"k8s.io/app,My_Key.1", NULL, 0, NULL},
    {"example.com/" A63, NULL, 0, NULL},
    /* Go's %q on the key */
    {"a\"b", NULL, KWC_EPARSE, KEYERR("\"a\\\"b\"") NAME_PART},
    {"a\\b", NULL, KWC_EPARSE, KEYERR("\"a\\\\b\"") NAME_PART},
    {"a\x01", NULL, KWC_EPARSE, KEYERR("\"a\\x01\"") NAME_PART},
    {"a\x7f", NULL, KWC_EPARSE, KEYERR("\"a\\x7f\"") NAME_PART},
    {"a\x0b", NULL, KWC_EPARSE, KEYERR("\"a\\v\"") NAME_PART},
    {"\xc3\xa9t\xc3\xa9", NULL, KWC_EPARSE, KEYERR("\"\xc3\xa9t\xc3\xa9\"") NAME_PART},
    {"a\xff", NULL, KWC_EPARSE, KEYERR("\"a\\xff\"") NAME_PART},
    {"a\xc3", NULL, KWC_EPARSE, KEYERR("\"a\\xc3\"") NAME_PART},
    {"a\xc2\xa0", NULL, KWC_EPARSE, KEYERR("\"a\\u00a0\"") NAME_PART},
    {"a\xe2\x80\x8b", NULL, KWC_EPARSE, KEYERR("\"a\\u200b\"") NAME_PART},
    {"a\xf3\xa0\x80\x81", NULL, KWC_EPARSE, KEYERR("\"a\\U000e0001\"") NAME_PART},
    {"a\xed\xa0\x80", NULL, KWC_EPARSE, KEYERR("\"a\\xed\\xa0\\x80\"") NAME_PART},

    /* label values (NewRequirement: "values[i][key]", aggregated) */
    {"good-key=" Z64, NULL, KWC_EPARSE,
     REQ "values[0][good-key]: Invalid value: \"" Z64 "\": must be no more than 63 characters"},
    {"x=" Z64 "-", NULL, KWC_EPARSE,
     REQ "values[0][x]: Invalid value: \"" Z64 "-\": must be no more than 63 characters; " VALUE_RE},
    {"x=" Z63, NULL, 0, NULL},
    {"x=-a", NULL, KWC_EPARSE, REQ "values[0][x]: Invalid value: \"-a\": " VALUE_RE},
    {"x in (ok,-b,-a)", NULL, KWC_EPARSE,
     REQ "[values[0][x]: Invalid value: \"-a\": " VALUE_RE
     ", values[1][x]: Invalid value: \"-b\": " VALUE_RE "]"},
    {"x notin (a.b,c_d,e-f,)", NULL, 0, NULL},
    {"x in (a,b", NULL, KWC_EPARSE, REQ "found '', expected: ',' or ')'"},
    {"x=a\"", NULL, KWC_EPARSE, REQ "values[0][x]: Invalid value: \"a\\\"\": " VALUE_RE},

    /* gt / lt (strconv.ParseInt, then the label value check) */
    {"x>", NULL, KWC_EPARSE, REQ "values[0]: Invalid value: \"\"" GTLT},
    {"x<1a", NULL, KWC_EPARSE, REQ "values[0]: Invalid value: \"1a\"" GTLT},
    {"x>-1", NULL, KWC_EPARSE, REQ "values[0][x]: Invalid value: \"-1\": " VALUE_RE},
    {"x>-0", NULL, KWC_EPARSE, REQ "values[0][x]: Invalid value: \"-0\": " VALUE_RE},
    {"x>a-", NULL, KWC_EPARSE,
     REQ "[values[0]: Invalid value: \"a-\"" GTLT ", values[0][x]: Invalid value: \"a-\": " VALUE_RE "]"},
    {"x>9223372036854775807", NULL, 0, NULL},
    {"x>9223372036854775808", NULL, KWC_EPARSE,
     REQ "values[0]: Invalid value: \"9223372036854775808\"" GTLT},
    {"x<007", NULL, 0, NULL},

    /* fields: fields.TestSelectorParse */
    {NULL, "x=a,y=b,z=c", 0, NULL},
    {NULL, "", 0, NULL},
    {NULL, "x!=a,y=b", 0, NULL},
    {NULL, "x=a||y\\=b", 0, NULL},
    {NULL, "x=a\\=\\=b", 0, NULL},
    {NULL, "x=a||y=b", KWC_EPARSE, "invalid field selector: unescaped character in value: 61"},
    {NULL, "x==a==b", KWC_EPARSE, "invalid field selector: unescaped character in value: 61"},
    {NULL, "x=a,b", KWC_EPARSE, "invalid selector: 'x=a,b'; can't understand 'b'"},
    {NULL, "x in (a)", KWC_EPARSE, "invalid selector: 'x in (a)'; can't understand 'x in (a)'"},
    {NULL, "x in (a,b,c)", KWC_EPARSE, "invalid selector: 'x in (a,b,c)'; can't understand 'b'"},
    {NULL, "x", KWC_EPARSE, "invalid selector: 'x'; can't understand 'x'"},
    /* operators other than =, ==, != */
    {NULL, "x>1", KWC_EPARSE, "invalid selector: 'x>1'; can't understand 'x>1'"},
    {NULL, "!x", KWC_EPARSE, "invalid selector: '!x'; can't understand '!x'"},
    {NULL, "x notin (a)", KWC_EPARSE, "invalid selector: 'x notin (a)'; can't understand 'x notin (a)'"},
    {NULL, "a!==b", KWC_EPARSE, "invalid field selector: unescaped character in value: 61"},
    {NULL, "a=b=c", KWC_EPARSE, "invalid field selector: unescaped character in value: 61"},
    /* escapes (UnescapeValue) */
    {NULL, "k=\\,,k2=v2", 0, NULL},
    {NULL, "k=\\\\,k2=v2", 0, NULL},
    {NULL, "k=\\", KWC_EPARSE, "invalid field selector: invalid escape sequence: \\"},
    {NULL, "k=\\\\\\", KWC_EPARSE, "invalid field selector: invalid escape sequence: \\"},
    {NULL, "k=\\a", KWC_EPARSE, "invalid field selector: invalid escape sequence: \\a"},
    {NULL, "k=\\a\\b\\", KWC_EPARSE, "invalid field selector: invalid escape sequence: \\a"},
    {NULL, "k=\\\xc3\xa9", KWC_EPARSE, "invalid field selector: invalid escape sequence: \\\xc3\xa9"},
    {NULL, "k=\\\xff", KWC_EPARSE, "invalid field selector: invalid escape sequence: \\\xef\xbf\xbd"},
    /* the first bad term in sorted order is the one reported */
    {NULL, "b=\\x,a", KWC_EPARSE, "invalid selector: 'b=\\x,a'; can't understand 'a'"},
    {NULL, "b,a=\\x", KWC_EPARSE, "invalid field selector: invalid escape sequence: \\x"},
    {NULL, "a=,b", KWC_EPARSE, "invalid selector: 'a=,b'; can't understand 'b'"},
    {NULL, "a=b,", 0, NULL},
    {NULL, ",", 0, NULL},
    {NULL, " ", KWC_EPARSE, "invalid selector: ' '; can't understand ' '"},
    {NULL, "\xed\x95\xa8=\xec\x88\x98,\xeb\xaa\xa9=\xeb\xa1\x9d", 0, NULL},

    /* both: the label selector is converted first (autoConvert_v1_ListOptions_To_internalversion_ListOptions) */
    {"!", "x", KWC_EPARSE, REQ "found '', expected: identifier"},
    {"a=b", "x", KWC_EPARSE, "invalid selector: 'x'; can't understand 'x'"},
};
/* clang-format on */

/* A test name without control characters (they would break TAP lines). */
static void
printable(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < ' ')
            *s = '?';
}

static void
test_parse(void)
{
    for (size_t i = 0; i < KWC_ARRAY_LEN(parse_cases); i++) {
        const struct pcase *c = &parse_cases[i];
        char what[256];
        snprintf(what, sizeof what, "label %.60s%s field %.60s%s", c->label ? c->label : "(null)",
                 c->label && strlen(c->label) > 60 ? "..." : "", c->field ? c->field : "(null)",
                 c->field && strlen(c->field) > 60 ? "..." : "");
        printable(what);
        struct sel *s = (struct sel *)1;
        char *err = (char *)1;
        int rc = sel_parse(c->label, c->field, &s, &err);
        is_int(rc, c->rc, what);
        if (c->rc == 0) {
            ok(s != NULL && err == NULL, what);
            if (rc != 0)
                printf("#   error: %s\n", err ? err : "(null)");
        } else {
            ok(s == NULL, what);
            is_str(err, c->msg, what);
        }
        sel_free(rc == 0 ? s : NULL);
        if (rc != 0)
            free(err);
    }
}

static void
test_err_may_be_null(void)
{
    struct sel *s = (struct sel *)1;
    is_int(sel_parse("(", NULL, &s, NULL), KWC_EPARSE, "bad selector, err NULL");
    ok(s == NULL, "out cleared on error");
    is_int(sel_parse("a", "b=c", &s, NULL), 0, "good selector, err NULL");
    sel_free(s);
    sel_free(NULL);
}

static void
test_limits(void)
{
    char *big = malloc(SEL_MAX_LEN + 2);
    struct sel *s;
    char *err;

    char *commas = malloc(SEL_MAX_LEN + 1);
    memset(commas, ',', SEL_MAX_LEN);
    commas[SEL_MAX_LEN] = '\0';
    memset(big, ' ', SEL_MAX_LEN);
    big[SEL_MAX_LEN] = '\0';
    is_int(sel_parse(big, commas, &s, &err), 0, "16384 blanks, 16384 commas");
    ok(s && sel_is_everything(s), "blanks and commas select everything");
    sel_free(s);
    free(commas);

    big[SEL_MAX_LEN] = ' ';
    big[SEL_MAX_LEN + 1] = '\0';
    is_int(sel_parse(big, NULL, &s, &err), KWC_ETOOBIG, "16385-byte label selector");
    is_str(err, "label selector is longer than 16384 bytes", "label length message");
    free(err);
    is_int(sel_parse(NULL, big, &s, &err), KWC_ETOOBIG, "16385-byte field selector");
    is_str(err, "field selector is longer than 16384 bytes", "field length message");
    free(err);
    free(big);

    /* 256 requirements / terms are fine, 257 are not */
    char buf[8192];
    size_t o = 0;
    for (int i = 0; i < SEL_MAX_TERMS; i++)
        o += (size_t)snprintf(buf + o, sizeof buf - o, "%sk%d", i ? "," : "", i);
    is_int(sel_parse(buf, NULL, &s, &err), 0, "256 label requirements");
    sel_free(s);
    snprintf(buf + o, sizeof buf - o, ",k256");
    is_int(sel_parse(buf, NULL, &s, &err), KWC_ETOOBIG, "257 label requirements");
    is_str(err, "label selector has more than 256 requirements", "label count message");
    free(err);

    o = 0;
    for (int i = 0; i < SEL_MAX_TERMS; i++)
        o += (size_t)snprintf(buf + o, sizeof buf - o, "%sf%d=v,", i ? "," : "", i);
    is_int(sel_parse(NULL, buf, &s, &err), 0, "256 field terms (and empty ones)");
    sel_free(s);
    snprintf(buf + o, sizeof buf - o, "f256=v");
    is_int(sel_parse(NULL, buf, &s, &err), KWC_ETOOBIG, "257 field terms");
    is_str(err, "field selector has more than 256 terms", "field count message");
    free(err);
}

static void
test_everything(void)
{
    static const struct {
        const char *label, *field;
        bool everything;
    } cases[] = {
        {NULL, NULL, true},  {"", "", true},       {" \t\r\n", NULL, true},
        {NULL, ",", true},   {NULL, ",,,", true},  {NULL, "=", true},
        {NULL, "!=", true},  {NULL, "==,=", true}, {NULL, "=x", false},
        {"x", NULL, false},  {NULL, "a=", false},  {"x in ()", NULL, false},
        {"!x", NULL, false}, {NULL, "a!=", false},
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(cases); i++) {
        struct sel *s;
        char what[128];
        snprintf(what, sizeof what, "everything: label '%s' field '%s'",
                 cases[i].label ? cases[i].label : "(null)",
                 cases[i].field ? cases[i].field : "(null)");
        printable(what);
        if (!ok(sel_parse(cases[i].label, cases[i].field, &s, NULL) == 0, what))
            continue;
        is_int(sel_is_everything(s), cases[i].everything, what);
        sel_free(s);
    }
}

/* A label or field set written "k=v;k2=v2" ("" is the empty set). */
struct kv {
    const char *k[8], *v[8];
    size_t n;
    char buf[256];
};

static void
kv_parse(struct kv *kv, const char *spec)
{
    kv->n = 0;
    if (!spec || !*spec)
        return;
    snprintf(kv->buf, sizeof kv->buf, "%s", spec);
    for (char *save = NULL, *tok = strtok_r(kv->buf, ";", &save); tok;
         tok = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(tok, '=');
        *eq = '\0';
        kv->k[kv->n] = tok;
        kv->v[kv->n++] = eq + 1;
    }
}

struct mcase {
    const char *label, *field;
    const char *labels, *fields; /* "k=v;k2=v2" */
    bool want;
};

/* clang-format off */
static const struct mcase match_cases[] = {
    /* labels.TestSelectorMatches */
    {"", NULL, "x=y", NULL, true},
    {"x=y", NULL, "x=y", NULL, true},
    {"x=y,z=w", NULL, "x=y;z=w", NULL, true},
    {"x!=y,z!=w", NULL, "x=z;z=a", NULL, true},
    {"notin=in", NULL, "notin=in", NULL, true},
    {"x", NULL, "x=z", NULL, true},
    {"!x", NULL, "y=z", NULL, true},
    {"x>1", NULL, "x=2", NULL, true},
    {"x<1", NULL, "x=0", NULL, true},
    {"x=z", NULL, "", NULL, false},
    {"x=y", NULL, "x=z", NULL, false},
    {"x=y,z=w", NULL, "x=w;z=w", NULL, false},
    {"x!=y,z!=w", NULL, "x=z;z=w", NULL, false},
    {"x", NULL, "y=z", NULL, false},
    {"!x", NULL, "x=z", NULL, false},
    {"x>1", NULL, "x=0", NULL, false},
    {"x<1", NULL, "x=2", NULL, false},
    {"foo=bar", NULL, "foo=bar;baz=blah", NULL, true},
    {"baz=blah", NULL, "foo=bar;baz=blah", NULL, true},
    {"foo=bar,baz=blah", NULL, "foo=bar;baz=blah", NULL, true},
    {"foo=blah", NULL, "foo=bar;baz=blah", NULL, false},
    {"baz=bar", NULL, "foo=bar;baz=blah", NULL, false},
    {"foo=bar,foobar=bar,baz=blah", NULL, "foo=bar;baz=blah", NULL, false},
    /* labels.TestRequirementSelectorMatching */
    {"x in (foo),y notin (alpha)", NULL, "x=foo;y=baz", NULL, true},
    {"x in (foo),y in (alpha)", NULL, "x=foo;y=baz", NULL, false},
    {"x notin (),y", NULL, "y=", NULL, true},
    {"!x,y", NULL, "y=", NULL, true},
    {"x notin (),!y", NULL, "y=", NULL, false},
    {"x in ()", NULL, "y=baz", NULL, false},
    {"z>1", NULL, "z=2", NULL, true},
    {"z>1", NULL, "z=v2", NULL, false},
    /* an absent label: only !=, notin and !key match */
    {"x!=a", NULL, "", NULL, true},
    {"x notin (a,b)", NULL, "", NULL, true},
    {"x in (a,b)", NULL, "", NULL, false},
    {"x=", NULL, "", NULL, false},
    {"x=", NULL, "x=", NULL, true},
    {"x!=", NULL, "", NULL, true},
    {"x!=", NULL, "x=", NULL, false},
    {"x>0", NULL, "", NULL, false},
    {"x<0", NULL, "", NULL, false},
    {"x", NULL, "x=", NULL, true},
    /* set-based with several values */
    {"env in (prod, qa)", NULL, "env=qa", NULL, true},
    {"env in (prod, qa)", NULL, "env=dev", NULL, false},
    {"env notin (prod, qa)", NULL, "env=dev", NULL, true},
    {"env notin (prod, qa)", NULL, "env=prod", NULL, false},
    {"x in (j,i,h,g,f,e,d,c,b,a,a)", NULL, "x=a", NULL, true},
    {"x in (j,i,h,g,f,e,d,c,b,a,a)", NULL, "x=g", NULL, true},
    {"x in (j,i,h,g,f,e,d,c,b,a,a)", NULL, "x=j", NULL, true},
    {"x in (j,i,h,g,f,e,d,c,b,a,a)", NULL, "x=gg", NULL, false},
    {"x in (j,i,h,g,f,e,d,c,b,a,a)", NULL, "x=", NULL, false},
    {"x in (a,,b)", NULL, "x=", NULL, true},
    {"x in (a,)", NULL, "x=", NULL, true},
    {"x in (a,b)", NULL, "x=", NULL, false},
    {"in in (in, notin)", NULL, "in=notin", NULL, true},
    {"k8s.io/app=web", NULL, "k8s.io/app=web", NULL, true},
    {"k8s.io/app=web", NULL, "app=web", NULL, false},
    /* gt / lt compare integers (strconv.ParseInt on the label value) */
    {"x>007", NULL, "x=8", NULL, true},
    {"x>7", NULL, "x=007", NULL, false},
    {"x<0", NULL, "x=-1", NULL, true},
    {"x>9223372036854775806", NULL, "x=9223372036854775807", NULL, true},
    {"x>9223372036854775806", NULL, "x=9223372036854775808", NULL, false},
    {"x<1", NULL, "x=-9223372036854775808", NULL, true},
    {"x<1", NULL, "x=-9223372036854775809", NULL, false},
    {"x>1", NULL, "x=+2", NULL, true},
    {"x>1", NULL, "x=2.0", NULL, false},
    {"x>1", NULL, "x=", NULL, false},

    /* fields.TestSelectorMatches */
    {NULL, "", NULL, "x=y", true},
    {NULL, "x=y", NULL, "x=y", true},
    {NULL, "x=y,z=w", NULL, "x=y;z=w", true},
    {NULL, "x!=y,z!=w", NULL, "x=z;z=a", true},
    {NULL, "notin=in", NULL, "notin=in", true},
    {NULL, "x=y", NULL, "x=z", false},
    {NULL, "x=y,z=w", NULL, "x=w;z=w", false},
    {NULL, "x!=y,z!=w", NULL, "x=z;z=w", false},
    {NULL, "foo=bar", NULL, "foo=bar;baz=blah;complex==value\\,\\", true},
    {NULL, "foo=bar,baz=blah", NULL, "foo=bar;baz=blah;complex==value\\,\\", true},
    {NULL, "foo=bar,baz=blah,complex=\\=value\\\\\\,\\\\", NULL,
     "foo=bar;baz=blah;complex==value\\,\\", true},
    {NULL, "foo=blah", NULL, "foo=bar;baz=blah;complex==value\\,\\", false},
    {NULL, "baz=bar", NULL, "foo=bar;baz=blah;complex==value\\,\\", false},
    {NULL, "foo=bar,foobar=bar,baz=blah", NULL, "foo=bar;baz=blah;complex==value\\,\\", false},
    /* escapes */
    {NULL, "metadata.name=a\\,b", NULL, "metadata.name=a,b", true},
    {NULL, "metadata.name=a\\,b", NULL, "metadata.name=a", false},
    {NULL, "x=a||y\\=b", NULL, "x=a||y=b", true},
    {NULL, "x==a\\=\\=b", NULL, "x=a==b", true},
    {NULL, "k=\\,,k2=v2", NULL, "k=,;k2=v2", true},
    {NULL, "k=\\\\,k2=v2", NULL, "k=\\;k2=v2", true},
    {NULL, "a=\xff", NULL, "a=\xff", true},
    {NULL, "a=\xff\\,", NULL, "a=\xef\xbf\xbd,", true},
    {NULL, "a=\xff\\,", NULL, "a=\xff,", false},
    {NULL, "\xed\x95\xa8=\xec\x88\x98,\xeb\xaa\xa9=\xeb\xa1\x9d", NULL,
     "\xed\x95\xa8=\xec\x88\x98;\xeb\xaa\xa9=\xeb\xa1\x9d", true},
    /* a field the object does not carry reads as "" */
    {NULL, "spec.nodeName=", NULL, "", true},
    {NULL, "spec.nodeName=", NULL, "spec.nodeName=n1", false},
    {NULL, "spec.nodeName!=", NULL, "", false},
    {NULL, "spec.nodeName!=", NULL, "spec.nodeName=n1", true},
    {NULL, "spec.nodeName!=n1", NULL, "", true},
    {NULL, "spec.nodeName==n1", NULL, "", false},
    {NULL, "=", NULL, "", true},
    {NULL, " a = b ", NULL, "a=b", false},
    {NULL, " a = b ", NULL, " a = b ", true},
    /* both */
    {"app=web", "spec.nodeName=n1", "app=web", "spec.nodeName=n1", true},
    {"app=web", "spec.nodeName=n1", "app=web", "spec.nodeName=n2", false},
    {"app=web", "spec.nodeName=n1", "app=db", "spec.nodeName=n1", false},
    {"app!=web", "metadata.namespace!=kube-system", "", "metadata.namespace=default", true},
};
/* clang-format on */

static void
test_match(void)
{
    for (size_t i = 0; i < KWC_ARRAY_LEN(match_cases); i++) {
        const struct mcase *c = &match_cases[i];
        char what[256];
        snprintf(what, sizeof what, "'%s' '%s' on labels {%s} fields {%s}",
                 c->label ? c->label : "", c->field ? c->field : "", c->labels ? c->labels : "",
                 c->fields ? c->fields : "");
        printable(what);
        struct sel *s;
        char *err;
        if (!ok(sel_parse(c->label, c->field, &s, &err) == 0, what)) {
            printf("#   error: %s\n", err);
            free(err);
            continue;
        }
        struct kv lkv, fkv;
        kv_parse(&lkv, c->labels);
        kv_parse(&fkv, c->fields);
        struct sel_labels l = {lkv.k, lkv.v, lkv.n};
        struct sel_fields f = {fkv.k, fkv.v, fkv.n};
        is_int(sel_matches(s, &l, &f), c->want, what);
        sel_free(s);
    }
}

static void
test_match_null_sets(void)
{
    struct sel *s;
    ok(sel_parse("x!=a,!y", "spec.nodeName=", &s, NULL) == 0, "parse");
    ok(sel_matches(s, NULL, NULL), "NULL sets are empty sets");
    sel_free(s);
    ok(sel_parse("x", NULL, &s, NULL) == 0, "parse");
    ok(!sel_matches(s, NULL, NULL), "exists needs the label");
    sel_free(s);
}

struct xcase {
    const char *label, *field, *query;
    const char *want; /* NULL: not pinned */
};

/* clang-format off */
static const struct xcase exact_cases[] = {
    /* fields.TestRequiresExactMatch, through the parser */
    {NULL, "", "test", NULL},
    {NULL, "a=b", "test", NULL},
    {NULL, "test=b", "test", "b"},
    {NULL, "test=", "test", ""},
    {NULL, "test!=b", "test", NULL},
    {NULL, "test!=", "test", NULL},
    {NULL, "a=x,test=b", "test", "b"},
    /* the kubelet's watch, and its spellings */
    {NULL, "spec.nodeName=node-1", "spec.nodeName", "node-1"},
    {NULL, "spec.nodeName==node-1", "spec.nodeName", "node-1"},
    {NULL, "spec.nodeName!=node-1", "spec.nodeName", NULL},
    {NULL, "metadata.name=a\\,b", "metadata.name", "a,b"},
    {NULL, "metadata.name=a\\,b", "spec.nodeName", NULL},
    /* the first term in sorted order wins; != terms are skipped */
    {NULL, "spec.nodeName=b,spec.nodeName=a", "spec.nodeName", "a"},
    {NULL, "spec.nodeName!=a,spec.nodeName=b", "spec.nodeName", "b"},
    /* labels never pin a field */
    {"spec.nodeName=node-1", NULL, "spec.nodeName", NULL},
};
/* clang-format on */

static void
test_requires_exact(void)
{
    for (size_t i = 0; i < KWC_ARRAY_LEN(exact_cases); i++) {
        const struct xcase *c = &exact_cases[i];
        char what[160];
        snprintf(what, sizeof what, "requires_exact('%s' / '%s', %s)", c->label ? c->label : "",
                 c->field ? c->field : "", c->query);
        struct sel *s;
        if (!ok(sel_parse(c->label, c->field, &s, NULL) == 0, what))
            continue;
        is_str(sel_requires_exact(s, c->query), c->want, what);
        sel_free(s);
    }
}

static void
test_field_names(void)
{
    static const struct {
        const char *field;
        size_t n;
        const char *names[4];
    } cases[] = {
        {NULL, 0, {NULL}},
        {"", 0, {NULL}},
        {"b=1,a=2,b!=3", 2, {"a", "b"}},
        {"spec.nodeName=n1", 1, {"spec.nodeName"}},
        {"metadata.name!=x,status.phase=Running,metadata.name!=y",
         2,
         {"metadata.name", "status.phase"}},
        {"=x", 1, {""}},
        {"=,a=", 1, {"a"}},
        {" a =b", 1, {" a "}},
        /* splitTerm takes the field literally, escapes and all */
        {"a\\,b=c", 1, {"a\\,b"}},
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(cases); i++) {
        char what[128];
        snprintf(what, sizeof what, "field names of '%s'", cases[i].field ? cases[i].field : "");
        struct sel *s;
        if (!ok(sel_parse(NULL, cases[i].field, &s, NULL) == 0, what))
            continue;
        is_int(sel_field_count(s), cases[i].n, what);
        for (size_t j = 0; j < cases[i].n; j++)
            is_str(sel_field_name(s, j), cases[i].names[j], what);
        ok(sel_field_name(s, cases[i].n) == NULL, what);
        sel_free(s);
    }
}

int
main(void)
{
    TAP_RUN(test_parse);
    TAP_RUN(test_err_may_be_null);
    TAP_RUN(test_limits);
    TAP_RUN(test_everything);
    TAP_RUN(test_match);
    TAP_RUN(test_match_null_sets);
    TAP_RUN(test_requires_exact);
    TAP_RUN(test_field_names);
    return tap_done();
}
