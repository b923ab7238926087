/*
 * selector.c — label and field selectors (selector.h), a port of the
 * behaviour of k8s.io/apimachinery as shipped with Kubernetes 1.27-1.33:
 *   pkg/labels/selector.go          Lexer, Parser, NewRequirement, Matches
 *   pkg/util/validation/validation.go IsQualifiedName, IsValidLabelValue,
 *                                   IsDNS1123Subdomain and their messages
 *   pkg/util/validation/field        Invalid(), Path.String(), ToAggregate
 *   pkg/fields/selector.go          splitTerms, splitTerm, UnescapeValue,
 *                                   parseSelector, hasTerm/notHasTerm
 *   strconv                          ParseInt, Quote (fmt %q)
 * The code is ours; each message names the Go function it reproduces.
 *
 * Where it sits: proxy/ parses a request's selectors once; store and hub call
 * sel_matches per object per watcher. Owns copies of every key, value and
 * field name; a parsed selector is immutable. Matching allocates nothing.
 * Parsing is bounded by SEL_MAX_LEN and SEL_MAX_TERMS before anything is
 * sized by the input.
 */
#include "kwc/selector.h"

#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"
#include "kwc/gostr.h"

/* ---- small helpers ------------------------------------------------------ */

/* A byte range of the input. */
struct slice {
    const char *p;
    size_t n;
};

/* Go's string comparison: bytewise, a prefix sorts first. */
static int
slice_cmp(const void *a, const void *b)
{
    const struct slice *x = a, *y = b;
    size_t m = x->n < y->n ? x->n : y->n;
    int c = m ? memcmp(x->p, y->p, m) : 0;
    if (c)
        return c;
    return x->n < y->n ? -1 : x->n > y->n;
}

/* strconv.ParseInt(s, 10, 64). */
static bool
go_parse_int64(const char *s, size_t n, int64_t *out)
{
    size_t i = 0;
    bool neg = false;
    if (n && (s[0] == '+' || s[0] == '-')) {
        neg = s[0] == '-';
        i = 1;
    }
    if (i == n)
        return false;
    uint64_t lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, v = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (lim - d) / 10)
            return false;
        v = v * 10 + d;
    }
    if (neg)
        *out = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
    else
        *out = (int64_t)v;
    return true;
}

/* ---- label key and value validation (pkg/util/validation) -------------- */

/* RegexError(msg, fmt, examples...) spelled out for each use. */
#define QNAME_FMT "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
#define QNAME_ERR                                                                                  \
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "    \
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "         \
    "validation is '" QNAME_FMT "')"
#define DNS1123_SUBDOMAIN_ERR                                                                      \
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "   \
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "  \
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
#define LABEL_VALUE_ERR                                                                            \
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "    \
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "             \
    "'my_value',  or '12345', regex used for validation is '(" QNAME_FMT ")?')"
#define QNAME_MAX 63
#define LABEL_VALUE_MAX 63
#define DNS1123_SUBDOMAIN_MAX 253

static bool
is_alnum(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* ^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$ */
static bool
qname_ok(const char *s, size_t n)
{
    if (n == 0 || !is_alnum(s[0]) || !is_alnum(s[n - 1]))
        return false;
    for (size_t i = 1; i + 1 < n; i++)
        if (!is_alnum(s[i]) && s[i] != '-' && s[i] != '_' && s[i] != '.')
            return false;
    return true;
}

static bool
is_lower_alnum(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

/* ^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$ */
static bool
dns1123_subdomain_ok(const char *s, size_t n)
{
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && s[i] != '.') {
            if (!is_lower_alnum(s[i]) && s[i] != '-')
                return false;
            continue;
        }
        if (i == start || !is_lower_alnum(s[start]) || !is_lower_alnum(s[i - 1]))
            return false;
        start = i + 1;
    }
    return true;
}

/* Adds one message to a "; "-joined detail (validateLabelKey/Value join the
 * messages of IsQualifiedName/IsValidLabelValue that way). */
static void
detail(struct gostr_buf *d, const char *part, const char *msg)
{
    if (d->len)
        gostr_add(d, "; ");
    gostr_add(d, part);
    gostr_add(d, msg);
}

/* validation.IsQualifiedName; leaves d empty when k is a valid label key. */
static void
check_label_key(const char *k, size_t n, struct gostr_buf *d)
{
    const char *name = k;
    size_t nlen = n;
    const char *slash = memchr(k, '/', n);
    if (slash) {
        size_t plen = (size_t)(slash - k);
        if (memchr(slash + 1, '/', n - plen - 1)) {
            detail(d, "a qualified name ",
                   QNAME_ERR " with an optional DNS subdomain prefix and '/' (e.g. "
                             "'example.com/MyName')");
            return;
        }
        if (plen == 0) {
            detail(d, "prefix part ", "must be non-empty");
        } else {
            if (plen > DNS1123_SUBDOMAIN_MAX)
                detail(d, "prefix part ", "must be no more than 253 characters");
            if (!dns1123_subdomain_ok(k, plen))
                detail(d, "prefix part ", DNS1123_SUBDOMAIN_ERR);
        }
        name = slash + 1;
        nlen = n - plen - 1;
    }
    if (nlen == 0)
        detail(d, "name part ", "must be non-empty");
    else if (nlen > QNAME_MAX)
        detail(d, "name part ", "must be no more than 63 characters");
    if (!qname_ok(name, nlen))
        detail(d, "name part ", QNAME_ERR);
}

/* validation.IsValidLabelValue. */
static void
check_label_value(const char *v, size_t n, struct gostr_buf *d)
{
    if (n > LABEL_VALUE_MAX)
        detail(d, "", "must be no more than 63 characters");
    if (n && !qname_ok(v, n))
        detail(d, "", LABEL_VALUE_ERR);
}

/* ---- the parsed form ---------------------------------------------------- */

/* "=" and "==" are kept as a one-value "in", "!=" as a one-value "notin":
 * Requirement.Matches treats them alike. */
enum lop { LOP_EXISTS, LOP_NOT_EXISTS, LOP_IN, LOP_NOT_IN, LOP_GT, LOP_LT };

struct lreq {
    char *key;
    enum lop op;
    char **vals; /* sorted (bytewise), distinct: sets.String.List() */
    size_t nvals;
    int64_t num; /* LOP_GT, LOP_LT */
};

struct fterm {
    char *field;
    char *value; /* unescaped */
    bool neg;    /* "!=" */
};

struct sel {
    struct lreq *lreqs;
    size_t nl;
    struct fterm *fterms; /* in kube's order: the terms sorted as written */
    size_t nf;
    const char **fnames; /* distinct fterms[].field, first occurrence first */
    size_t nfnames;
};

/* ---- label selector lexer (labels.Lexer) -------------------------------- */

enum tok {
    T_NONE, /* labels.ErrorToken: also "not a keyword" in keyword() */
    T_EOS,
    T_CLOSE,
    T_COMMA,
    T_NOT,
    T_DEQ,
    T_EQ,
    T_GT,
    T_IDENT,
    T_IN,
    T_LT,
    T_NEQ,
    T_NOTIN,
    T_OPEN,
};

struct token {
    enum tok t;
    struct slice lit;
};

struct lexer {
    const char *s;
    size_t n, pos;
};

static bool
is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

static bool
is_special(char c)
{
    return c == '=' || c == '!' || c == '(' || c == ')' || c == ',' || c == '>' || c == '<';
}

/* labels.string2token */
static enum tok
keyword(const char *s, size_t n)
{
    static const struct {
        const char *s;
        enum tok t;
    } kw[] = {{")", T_CLOSE}, {",", T_COMMA},     {"!", T_NOT}, {"==", T_DEQ},
              {"=", T_EQ},    {">", T_GT},        {"in", T_IN}, {"<", T_LT},
              {"!=", T_NEQ},  {"notin", T_NOTIN}, {"(", T_OPEN}};
    for (size_t i = 0; i < KWC_ARRAY_LEN(kw); i++)
        if (strlen(kw[i].s) == n && memcmp(kw[i].s, s, n) == 0)
            return kw[i].t;
    return T_NONE;
}

/* Lexer.read: the next byte, or 0 at the end (the input holds no NUL). */
static char
lread(struct lexer *l)
{
    return l->pos < l->n ? l->s[l->pos++] : '\0';
}

/* Lexer.Lex */
static struct token
lex(struct lexer *l)
{
    char ch;
    do
        ch = lread(l);
    while (is_ws(ch));
    if (ch == '\0')
        return (struct token){T_EOS, {"", 0}};
    size_t start = --l->pos;
    if (is_special(ch)) {
        /* scanSpecialSymbol: the longest run of special bytes that is still
         * a token ("==", "!="); every single special byte is one. */
        enum tok last = T_NONE;
        size_t lastlen = 0, len = 0;
        while ((ch = lread(l)) != '\0') {
            if (!is_special(ch)) {
                l->pos--;
                break;
            }
            len++;
            enum tok t = keyword(l->s + start, len);
            if (t != T_NONE) {
                last = t;
                lastlen = len;
            } else if (last != T_NONE) {
                l->pos--;
                break;
            }
        }
        assert(last != T_NONE && l->pos == start + lastlen);
        return (struct token){last, {l->s + start, lastlen}};
    }
    /* scanIDOrKeyword */
    while ((ch = lread(l)) != '\0') {
        if (is_special(ch) || is_ws(ch)) {
            l->pos--;
            break;
        }
    }
    struct slice lit = {l->s + start, l->pos - start};
    enum tok t = keyword(lit.p, lit.n);
    return (struct token){t == T_NONE ? T_IDENT : t, lit};
}

/* ---- label selector parser (labels.Parser) ------------------------------ */

/* ParserContext: in Values, "in" and "notin" are identifiers. */
enum ctx { CTX_KEYOP, CTX_VALUES };

struct lparser {
    struct lexer lx;
    struct token la; /* the one token of lookahead the Go parser uses */
    struct gostr_buf *err;
    struct sel *s;
    size_t cap;
};

static struct token
lookahead(struct lparser *p, enum ctx c)
{
    struct token t = p->la;
    if (c == CTX_VALUES && (t.t == T_IN || t.t == T_NOTIN))
        t.t = T_IDENT;
    return t;
}

static struct token
consume(struct lparser *p, enum ctx c)
{
    struct token t = lookahead(p, c);
    p->la = lex(&p->lx);
    return t;
}

/* "found '<literal>'<rest>" — most of the parser's messages. */
static int
found(struct lparser *p, struct token t, const char *rest)
{
    gostr_add(p->err, "found '");
    gostr_addn(p->err, t.lit.p, t.lit.n);
    gostr_add(p->err, "'");
    gostr_add(p->err, rest);
    return KWC_EPARSE;
}

/* A set of values under construction (sets.String). */
struct vset {
    struct slice *v;
    size_t n, cap;
};

static void
vset_add(struct vset *vs, struct slice v)
{
    if (vs->n == vs->cap) {
        vs->cap = vs->cap ? vs->cap * 2 : 4;
        vs->v = xrealloc(vs->v, vs->cap * sizeof *vs->v);
    }
    vs->v[vs->n++] = v;
}

static const struct slice empty_slice = {"", 0};

/* parseIdentifiersList, with the 1.27-1.33 handling of ",,": the second
 * comma is consumed, so "(a,,)" is an error there (kubernetes#133419 changed
 * that in 1.35). */
static int
parse_identifiers_list(struct lparser *p, struct vset *vs)
{
    for (;;) {
        struct token t = consume(p, CTX_VALUES);
        if (t.t == T_IDENT) {
            vset_add(vs, t.lit);
            struct token t2 = lookahead(p, CTX_VALUES);
            if (t2.t == T_COMMA)
                continue;
            if (t2.t == T_CLOSE)
                return 0;
            return found(p, t2, ", expected: ',' or ')'");
        } else if (t.t == T_COMMA) {
            if (vs->n == 0)
                vset_add(vs, empty_slice);
            struct token t2 = lookahead(p, CTX_VALUES);
            if (t2.t == T_CLOSE) {
                vset_add(vs, empty_slice);
                return 0;
            }
            if (t2.t == T_COMMA) {
                consume(p, CTX_VALUES);
                vset_add(vs, empty_slice);
            }
        } else {
            return found(p, t, ", expected: ',', or identifier");
        }
    }
}

/* parseValues */
static int
parse_values(struct lparser *p, struct vset *vs)
{
    struct token t = consume(p, CTX_VALUES);
    if (t.t != T_OPEN)
        return found(p, t, " expected: '('");
    t = lookahead(p, CTX_VALUES);
    if (t.t == T_IDENT || t.t == T_COMMA) {
        int rc = parse_identifiers_list(p, vs);
        if (rc)
            return rc;
        /* the list ends only on a lookahead of ')' */
        struct token c = consume(p, CTX_VALUES);
        assert(c.t == T_CLOSE);
        (void)c;
        return 0;
    }
    if (t.t == T_CLOSE) {
        consume(p, CTX_VALUES);
        vset_add(vs, empty_slice);
        return 0;
    }
    return found(p, t, ", expected: ',', ')' or identifier");
}

/* parseExactValue */
static int
parse_exact_value(struct lparser *p, struct vset *vs)
{
    struct token t = lookahead(p, CTX_VALUES);
    if (t.t == T_EOS || t.t == T_COMMA) {
        vset_add(vs, empty_slice);
        return 0;
    }
    t = consume(p, CTX_VALUES);
    if (t.t == T_IDENT) {
        vset_add(vs, t.lit);
        return 0;
    }
    return found(p, t, ", expected: identifier");
}

/* Appends msg (taken) to msgs unless already there: ErrorList.ToAggregate
 * drops repeated messages. */
static void
msgs_add(char ***msgs, size_t *n, char *msg)
{
    for (size_t i = 0; i < *n; i++) {
        if (strcmp((*msgs)[i], msg) == 0) {
            free(msg);
            return;
        }
    }
    *msgs = xrealloc(*msgs, (*n + 1) * sizeof **msgs);
    (*msgs)[(*n)++] = msg;
}

/*
 * NewRequirement(key, op, values.List(), WithPath(nil)) for a key already
 * validated: the field paths are "values[i]" and "values[i][key]", the errors
 * an aggregate ("[a, b]" when there are several). On success the requirement
 * joins p->s and the values are copied.
 */
static int
new_requirement(struct lparser *p, struct slice key, enum lop op, struct vset *vs)
{
    if (vs->n > 1)
        if (vs->n > 1) /* qsort(NULL, 0, ...) is undefined */
            qsort(vs->v, vs->n, sizeof *vs->v, slice_cmp);
    size_t n = 0;
    for (size_t i = 0; i < vs->n; i++)
        if (n == 0 || slice_cmp(&vs->v[n - 1], &vs->v[i]) != 0)
            vs->v[n++] = vs->v[i];
    vs->n = n;

    char **msgs = NULL;
    size_t nmsgs = 0;
    int64_t num = 0;
    if (op == LOP_GT || op == LOP_LT) {
        /* the parser always supplies exactly one value here */
        if (!go_parse_int64(vs->v[0].p, vs->v[0].n, &num)) {
            struct gostr_buf m = {0};
            gostr_add(&m, "values[0]: Invalid value: ");
            gostr_quote(&m, vs->v[0].p, vs->v[0].n);
            gostr_add(&m, ": for 'Gt', 'Lt' operators, the value must be an integer");
            msgs_add(&msgs, &nmsgs, gostr_take(&m));
        }
    }
    for (size_t i = 0; i < vs->n; i++) {
        struct gostr_buf d = {0};
        check_label_value(vs->v[i].p, vs->v[i].n, &d);
        if (!d.len)
            continue;
        struct gostr_buf m = {0};
        gostr_add(&m, "values[");
        gostr_addu(&m, i);
        gostr_add(&m, "][");
        gostr_addn(&m, key.p, key.n);
        gostr_add(&m, "]: Invalid value: ");
        gostr_quote(&m, vs->v[i].p, vs->v[i].n);
        gostr_add(&m, ": ");
        gostr_addn(&m, d.p, d.len);
        free(d.p);
        msgs_add(&msgs, &nmsgs, gostr_take(&m));
    }
    if (nmsgs) {
        if (nmsgs > 1)
            gostr_addc(p->err, '[');
        for (size_t i = 0; i < nmsgs; i++) {
            if (i)
                gostr_add(p->err, ", ");
            gostr_add(p->err, msgs[i]);
            free(msgs[i]);
        }
        if (nmsgs > 1)
            gostr_addc(p->err, ']');
        free(msgs);
        return KWC_EPARSE;
    }

    struct sel *s = p->s;
    if (s->nl == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 4;
        s->lreqs = xrealloc(s->lreqs, p->cap * sizeof *s->lreqs);
    }
    struct lreq *r = &s->lreqs[s->nl++];
    r->key = xstrndup(key.p, key.n);
    r->op = op;
    r->num = num;
    r->nvals = vs->n;
    r->vals = vs->n ? xcalloc(vs->n, sizeof *r->vals) : NULL;
    for (size_t i = 0; i < vs->n; i++)
        r->vals[i] = xstrndup(vs->v[i].p, vs->v[i].n);
    return 0;
}

/* parseRequirement with parseKeyAndInferOperator and parseOperator inlined.
 * Errors are written bare; the caller adds "unable to parse requirement: ". */
static int
parse_requirement(struct lparser *p)
{
    bool not = false;
    struct token t = consume(p, CTX_VALUES);
    if (t.t == T_NOT) {
        not = true;
        t = consume(p, CTX_VALUES);
    }
    if (t.t != T_IDENT)
        return found(p, t, ", expected: identifier");
    struct slice key = t.lit;
    struct gostr_buf d = {0};
    check_label_key(key.p, key.n, &d);
    if (d.len) {
        /* validateLabelKey(literal, p.path) with a nil path */
        gostr_add(p->err, "<nil>: Invalid value: ");
        gostr_quote(p->err, key.p, key.n);
        gostr_add(p->err, ": ");
        gostr_addn(p->err, d.p, d.len);
        free(d.p);
        return KWC_EPARSE;
    }

    struct vset vs = {0};
    int rc;
    enum tok next = lookahead(p, CTX_VALUES).t;
    if (not || next == T_EOS || next == T_COMMA) {
        rc = new_requirement(p, key, not ? LOP_NOT_EXISTS : LOP_EXISTS, &vs);
        goto out;
    }
    enum lop op;
    t = consume(p, CTX_KEYOP);
    switch (t.t) {
    case T_IN:
        op = LOP_IN;
        break;
    case T_NOTIN:
        op = LOP_NOT_IN;
        break;
    case T_EQ:
    case T_DEQ:
        op = LOP_IN;
        break;
    case T_NEQ:
        op = LOP_NOT_IN;
        break;
    case T_GT:
        op = LOP_GT;
        break;
    case T_LT:
        op = LOP_LT;
        break;
    default:
        rc = found(p, t, ", expected: in, notin, =, ==, !=, gt, lt");
        goto out;
    }
    if (t.t == T_IN || t.t == T_NOTIN)
        rc = parse_values(p, &vs);
    else
        rc = parse_exact_value(p, &vs);
    if (rc == 0)
        rc = new_requirement(p, key, op, &vs);
out:
    free(vs.v);
    return rc;
}

/* Parser.parse */
static int
parse_labels(struct sel *s, const char *src, size_t n, struct gostr_buf *err)
{
    struct lparser p = {.lx = {src, n, 0}, .err = err, .s = s};
    p.la = lex(&p.lx);
    for (;;) {
        struct token t = lookahead(&p, CTX_VALUES);
        if (t.t == T_EOS)
            return 0;
        if (t.t != T_IDENT && t.t != T_NOT)
            return found(&p, t, ", expected: !, identifier, or 'end of string'");
        if (s->nl == SEL_MAX_TERMS) {
            gostr_add(err, "label selector has more than 256 requirements");
            return KWC_ETOOBIG;
        }
        gostr_add(err, "unable to parse requirement: ");
        int rc = parse_requirement(&p);
        if (rc)
            return rc;
        err->len = 0;
        err->p[0] = '\0';
        t = consume(&p, CTX_VALUES);
        if (t.t == T_EOS)
            return 0;
        if (t.t != T_COMMA)
            return found(&p, t, ", expected: ',' or 'end of string'");
        struct token t2 = lookahead(&p, CTX_VALUES);
        if (t2.t != T_IDENT && t2.t != T_NOT)
            return found(&p, t2, ", expected: identifier after ','");
    }
}

/* ---- field selector (fields.parseSelector) ------------------------------ */

/* UnescapeValue: "\\", "\," and "\=" are the escapes; a bare ',' or '=' is
 * an error. Only a value that needs unescaping goes through Go's rune loop,
 * which turns each invalid UTF-8 byte into U+FFFD; others are kept as is. */
static int
unescape(struct slice v, struct gostr_buf *out, struct gostr_buf *err)
{
    bool special = false;
    for (size_t i = 0; i < v.n && !special; i++)
        special = v.p[i] == '\\' || v.p[i] == ',' || v.p[i] == '=';
    if (!special) {
        gostr_addn(out, v.p, v.n);
        return 0;
    }
    bool in_slash = false;
    for (size_t i = 0; i < v.n;) {
        size_t w;
        uint32_t r = gostr_decode_rune((const unsigned char *)v.p + i, v.n - i, &w);
        const char *enc = v.p + i;
        size_t enclen = w;
        if (r == GOSTR_RUNE_ERROR && w == 1) {
            enc = "\xEF\xBF\xBD";
            enclen = 3;
        }
        i += w;
        if (in_slash) {
            if (r != '\\' && r != ',' && r != '=') {
                gostr_add(err, "invalid field selector: invalid escape sequence: \\");
                gostr_addn(err, enc, enclen);
                return KWC_EPARSE;
            }
            gostr_addc(out, (char)r);
            in_slash = false;
        } else if (r == '\\') {
            in_slash = true;
        } else if (r == ',' || r == '=') {
            /* UnescapedRune prints the rune with %v: its number */
            gostr_add(err, "invalid field selector: unescaped character in value: ");
            gostr_addu(err, r);
            return KWC_EPARSE;
        } else {
            gostr_addn(out, enc, enclen);
        }
    }
    if (in_slash) {
        gostr_add(err, "invalid field selector: invalid escape sequence: \\");
        return KWC_EPARSE;
    }
    return 0;
}

static int
parse_fields(struct sel *s, const char *src, size_t n, struct gostr_buf *err)
{
    if (n == 0)
        return 0;
    /* splitTerms: split on ',' not escaped by a backslash (the backslash
     * stays in the term). */
    size_t nparts = 1, nonempty = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\\')
            i++;
        else if (src[i] == ',')
            nparts++;
    }
    struct slice *parts = xcalloc(nparts, sizeof *parts);
    size_t k = 0, start = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\\') {
            i++;
        } else if (src[i] == ',') {
            parts[k++] = (struct slice){src + start, i - start};
            start = i + 1;
        }
    }
    parts[k++] = (struct slice){src + start, n - start};
    assert(k == nparts);
    for (size_t i = 0; i < nparts; i++)
        nonempty += parts[i].n != 0;
    int rc = 0;
    if (nonempty > SEL_MAX_TERMS) {
        gostr_add(err, "field selector has more than 256 terms");
        rc = KWC_ETOOBIG;
        goto out;
    }
    if (nparts > 1) /* qsort(NULL, 0, ...) is undefined */
        qsort(parts, nparts, sizeof *parts, slice_cmp);
    s->fterms = xcalloc(nonempty ? nonempty : 1, sizeof *s->fterms);
    for (size_t i = 0; i < nparts; i++) {
        struct slice part = parts[i];
        if (part.n == 0)
            continue;
        /* splitTerm: the first "!=", "==" or "=" (tried in that order at
         * each position); the field name is taken literally. */
        size_t j, oplen = 0;
        bool neg = false;
        for (j = 0; j < part.n; j++) {
            if (part.p[j] == '!' && j + 1 < part.n && part.p[j + 1] == '=') {
                neg = true;
                oplen = 2;
            } else if (part.p[j] == '=') {
                oplen = j + 1 < part.n && part.p[j + 1] == '=' ? 2 : 1;
            }
            if (oplen)
                break;
        }
        if (!oplen) {
            gostr_add(err, "invalid selector: '");
            gostr_addn(err, src, n);
            gostr_add(err, "'; can't understand '");
            gostr_addn(err, part.p, part.n);
            gostr_add(err, "'");
            rc = KWC_EPARSE;
            goto out;
        }
        struct slice value = {part.p + j + oplen, part.n - j - oplen};
        struct gostr_buf v = {0};
        rc = unescape(value, &v, err);
        if (rc) {
            free(v.p);
            goto out;
        }
        /* ParseSelector's identity Transform drops a term whose field and
         * value are both empty ("=", "!="). */
        if (j == 0 && v.len == 0) {
            free(v.p);
            continue;
        }
        struct fterm *ft = &s->fterms[s->nf++];
        ft->field = xstrndup(part.p, j);
        ft->value = gostr_take(&v);
        ft->neg = neg;
    }
    s->fnames = xcalloc(s->nf ? s->nf : 1, sizeof *s->fnames);
    for (size_t i = 0; i < s->nf; i++) {
        size_t m;
        for (m = 0; m < s->nfnames; m++)
            if (strcmp(s->fnames[m], s->fterms[i].field) == 0)
                break;
        if (m == s->nfnames)
            s->fnames[s->nfnames++] = s->fterms[i].field;
    }
out:
    free(parts);
    return rc;
}

/* ---- public API --------------------------------------------------------- */

int
sel_parse(const char *label_selector, const char *field_selector, struct sel **out, char **err)
{
    *out = NULL;
    if (err)
        *err = NULL;
    struct sel *s = xcalloc(1, sizeof *s);
    struct gostr_buf e = {0};
    int rc = 0;
    size_t ln = label_selector ? strnlen(label_selector, SEL_MAX_LEN + 1) : 0;
    size_t fn = field_selector ? strnlen(field_selector, SEL_MAX_LEN + 1) : 0;
    if (ln > SEL_MAX_LEN) {
        gostr_add(&e, "label selector is longer than 16384 bytes");
        rc = KWC_ETOOBIG;
        goto fail;
    }
    rc = parse_labels(s, label_selector ? label_selector : "", ln, &e);
    if (rc)
        goto fail;
    if (fn > SEL_MAX_LEN) {
        gostr_add(&e, "field selector is longer than 16384 bytes");
        rc = KWC_ETOOBIG;
        goto fail;
    }
    rc = parse_fields(s, field_selector ? field_selector : "", fn, &e);
    if (rc)
        goto fail;
    free(e.p);
    *out = s;
    return 0;
fail:
    sel_free(s);
    if (err)
        *err = gostr_take(&e);
    else
        free(e.p);
    return rc;
}

void
sel_free(struct sel *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->nl; i++) {
        for (size_t j = 0; j < s->lreqs[i].nvals; j++)
            free(s->lreqs[i].vals[j]);
        free(s->lreqs[i].vals);
        free(s->lreqs[i].key);
    }
    free(s->lreqs);
    for (size_t i = 0; i < s->nf; i++) {
        free(s->fterms[i].field);
        free(s->fterms[i].value);
    }
    free(s->fterms);
    free(s->fnames);
    free(s);
}

bool
sel_is_everything(const struct sel *s)
{
    return s->nl == 0 && s->nf == 0;
}

static const char *
label_get(const struct sel_labels *l, const char *key)
{
    if (!l)
        return NULL;
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->keys[i], key) == 0)
            return l->values[i];
    return NULL;
}

/* Requirement.hasValue over the sorted values. */
static bool
has_value(const struct lreq *r, const char *v)
{
    size_t lo = 0, hi = r->nvals;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(r->vals[mid], v);
        if (c == 0)
            return true;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}

/* Requirement.Matches */
static bool
lreq_matches(const struct lreq *r, const struct sel_labels *l)
{
    const char *v = label_get(l, r->key);
    int64_t num;
    switch (r->op) {
    case LOP_EXISTS:
        return v != NULL;
    case LOP_NOT_EXISTS:
        return v == NULL;
    case LOP_IN:
        return v && has_value(r, v);
    case LOP_NOT_IN:
        return !v || !has_value(r, v);
    case LOP_GT:
    case LOP_LT:
        if (!v || !go_parse_int64(v, strlen(v), &num))
            return false;
        return r->op == LOP_GT ? num > r->num : num < r->num;
    }
    return false;
}

static const char *
field_get(const struct sel_fields *f, const char *name)
{
    if (f)
        for (size_t i = 0; i < f->n; i++)
            if (strcmp(f->names[i], name) == 0)
                return f->values[i];
    return "";
}

bool
sel_matches(const struct sel *s, const struct sel_labels *l, const struct sel_fields *f)
{
    for (size_t i = 0; i < s->nl; i++)
        if (!lreq_matches(&s->lreqs[i], l))
            return false;
    for (size_t i = 0; i < s->nf; i++) {
        const struct fterm *t = &s->fterms[i];
        if ((strcmp(field_get(f, t->field), t->value) == 0) == t->neg)
            return false;
    }
    return true;
}

const char *
sel_requires_exact(const struct sel *s, const char *field)
{
    for (size_t i = 0; i < s->nf; i++)
        if (!s->fterms[i].neg && strcmp(s->fterms[i].field, field) == 0)
            return s->fterms[i].value;
    return NULL;
}

size_t
sel_field_count(const struct sel *s)
{
    return s->nfnames;
}

const char *
sel_field_name(const struct sel *s, size_t i)
{
    return i < s->nfnames ? s->fnames[i] : NULL;
}
