/*
 * auth.c — delegated authentication and authorization (see auth.h).
 *
 * Sits in front of the data path: a request is authenticated (certificate,
 * then bearer token by TokenReview, then anonymous) and authorized (by
 * SubjectAccessReview) before it reaches the cache or the upstream.
 *
 * Owns two answer caches (tokens, questions) and the reviews in flight. Each
 * cache is a hash table keyed by a SHA-256 digest (of the token; of the
 * SubjectAccessReviewSpec JSON, as kube's webhook authorizer keys its cache by
 * that JSON) with an age list: at max_entries, expired entries among the
 * oldest go first, else the oldest. A review in flight is found by the same
 * digest, so identical questions share one upstream request (coalescing), and
 * every waiter is called back when it ends.
 *
 * Invariants: a token lives only in the caller's header and in one review's
 * request body, which is wiped when the review ends; no log line holds it.
 * Upstream response bodies are bounded (AUTH_MAX_BODY) before they are
 * stored. Nothing is freed inside the upstream client's callbacks except by
 * its own rules (on_done ends the xfer; an oversized body is cancelled and
 * answered from a deferred event).
 */
#include "kwc/auth.h"

#include <assert.h>
#include <errno.h>
#include <event2/event.h>
#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/objects.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <time.h>

#include "kwc/base.h"
#include "kwc/gostr.h"
#include "kwc/log.h"
#include "kwc/status.h"
#include "kwc/upstream.h"

#define AUTH_MAGIC 0x61757468u   /* "auth" */
#define REVIEW_MAGIC 0x72657677u /* "revw" */
#define WAIT_MAGIC 0x77616974u   /* "wait" */
#define AUTH_MAX_BODY ((size_t)1 << 20)
#define DEFAULT_MAX_ENTRIES 100000
/* webhook.go maxControlledAttrCacheSize: larger questions are not cached. */
#define MAX_CACHED_ATTR_BYTES 10000
#define EVICT_SCAN 16

#define USER_ANONYMOUS "system:anonymous"
#define GROUP_AUTHENTICATED "system:authenticated"
#define GROUP_UNAUTHENTICATED "system:unauthenticated"

#define TOKENREVIEW_PATH "/apis/authentication.k8s.io/v1/tokenreviews"
#define SAR_PATH "/apis/authorization.k8s.io/v1/subjectaccessreviews"

/* ---- small helpers ---- */

static double
mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static const char *
nz(const char *s)
{
    return s ? s : "";
}



/* s[0..len) as Go's encoding/json sees it: each byte that starts no valid
 * UTF-8 sequence becomes U+FFFD. Into b (NUL bytes kept). */
static void
valid_utf8n(struct gostr_buf *b, const char *s, size_t len)
{
    for (size_t i = 0; i < len;) {
        size_t n = kwc_utf8_seq((const unsigned char *)s + i, len - i);
        if (n == 0) {
            gostr_addn(b, "\xEF\xBF\xBD", 3);
            i++;
        } else {
            gostr_addn(b, s + i, n);
            i += n;
        }
    }
}

/* The same for a C string (new). */
static char *
valid_utf8(const char *s)
{
    struct gostr_buf b = {0};
    valid_utf8n(&b, s, strlen(s));
    return gostr_take(&b);
}

/* An extra key or a subresource may hold NUL bytes (Impersonate-Extra-a%00b:
 * kube's key is "a\x00b", never "a"): their lengths travel with them. */
static size_t
sub_len(const struct auth_attrs *at)
{
    return at->subresource_len ? at->subresource_len : strlen(nz(at->subresource));
}

/* A JSON string of s (invalid UTF-8 replaced as Go's encoder does). New. */
static json_t *
jstr(const char *s)
{
    char *v = valid_utf8(nz(s));
    json_t *j = json_string(v);
    free(v);
    assert(j);
    return j;
}


/* Append s quoted as Go's fmt %q (strconv.Quote) writes it. */

/* Append s with responsewriters' sanitizer applied (& < > as HTML entities). */
static void
sanitize(struct gostr_buf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '&')
            gostr_add(b, "&amp;");
        else if (*s == '<')
            gostr_add(b, "&lt;");
        else if (*s == '>')
            gostr_add(b, "&gt;");
        else
            gostr_addn(b, s, 1);
    }
}

static void
sha256(const void *p, size_t n, unsigned char out[32])
{
    unsigned int len = 32;
    if (EVP_Digest(p, n, out, &len, EVP_sha256(), NULL) != 1)
        abort(); /* only when OpenSSL cannot run SHA-256 at all */
}

/* ---- users ---- */

static struct auth_user *
user_new(const char *name, const char *uid)
{
    struct auth_user *u = xcalloc(1, sizeof(*u));
    u->refs = 1;
    u->name = xstrdup(nz(name));
    u->uid = xstrdup(nz(uid));
    return u;
}

static void
user_add_group(struct auth_user *u, const char *g)
{
    u->groups = xrealloc(u->groups, (u->ngroups + 1) * sizeof(*u->groups));
    u->groups[u->ngroups++] = xstrdup(g);
}

/* group.AuthenticatedGroupAdder: system:authenticated is appended unless the
 * user is system:anonymous or already in system:authenticated or
 * system:unauthenticated. */
static void
add_authenticated_group(struct auth_user *u)
{
    if (strcmp(u->name, USER_ANONYMOUS) == 0)
        return;
    for (size_t i = 0; i < u->ngroups; i++)
        if (strcmp(u->groups[i], GROUP_AUTHENTICATED) == 0 ||
            strcmp(u->groups[i], GROUP_UNAUTHENTICATED) == 0)
            return;
    user_add_group(u, GROUP_AUTHENTICATED);
}

void
auth_user_ref(struct auth_user *u)
{
    u->refs++;
}

void
auth_user_unref(struct auth_user *u)
{
    if (!u || --u->refs > 0)
        return;
    free(u->name);
    free(u->uid);
    for (size_t i = 0; i < u->ngroups; i++)
        free(u->groups[i]);
    free(u->groups);
    for (size_t i = 0; i < u->nextra; i++) {
        free(u->extra[i].key);
        for (size_t j = 0; j < u->extra[i].nvalues; j++)
            free(u->extra[i].values[j]);
        free(u->extra[i].values);
    }
    free(u->extra);
    free(u);
}

/* ---- the certificate ---- */

/* An X509_NAME entry's value as UTF-8 (new), or NULL when it is not a string
 * or holds a NUL (Go's pkix skips non-string values; a NUL cannot pass
 * through a C string, so such a value is not used). */
static char *
entry_utf8(X509_NAME_ENTRY *e)
{
    unsigned char *s = NULL;
    int n = ASN1_STRING_to_UTF8(&s, X509_NAME_ENTRY_get_data(e));
    if (n < 0)
        return NULL;
    if (memchr(s, '\0', (size_t)n)) {
        OPENSSL_free(s);
        return NULL;
    }
    char *out = xstrndup((const char *)s, (size_t)n);
    OPENSSL_free(s);
    return out;
}

int
auth_cert_user(struct x509_st *cert, struct auth_user **out)
{
    *out = NULL;
    X509_NAME *subj = cert ? X509_get_subject_name(cert) : NULL;
    if (!subj)
        return KWC_ENOTFOUND;
    /* pkix.Name.FillFromRDNSequence: the last CN wins, every O is kept. */
    char *cn = NULL;
    int n = X509_NAME_entry_count(subj);
    for (int i = 0; i < n; i++) {
        X509_NAME_ENTRY *e = X509_NAME_get_entry(subj, i);
        if (OBJ_obj2nid(X509_NAME_ENTRY_get_object(e)) != NID_commonName)
            continue;
        char *v = entry_utf8(e);
        if (v) {
            free(cn);
            cn = v;
        }
    }
    /* x509.CommonNameUserConversion: no CN, no user from this certificate. */
    if (!cn || !*cn) {
        free(cn);
        return KWC_ENOTFOUND;
    }
    struct auth_user *u = user_new(cn, "");
    free(cn);
    for (int i = 0; i < n; i++) {
        X509_NAME_ENTRY *e = X509_NAME_get_entry(subj, i);
        if (OBJ_obj2nid(X509_NAME_ENTRY_get_object(e)) != NID_organizationName)
            continue;
        char *v = entry_utf8(e);
        if (v) {
            user_add_group(u, v);
            free(v);
        }
    }
    add_authenticated_group(u);
    *out = u;
    return 0;
}

/* ---- bearer tokens ---- */

/* Length of the unicode.IsSpace rune at s (n bytes left), or 0. */
static size_t
space_at(const unsigned char *s, size_t n)
{
    if (*s == ' ' || (*s >= '\t' && *s <= '\r'))
        return 1;
    size_t l = kwc_utf8_seq(s, n);
    if (l < 2)
        return 0;
    size_t w;
    uint32_t r = gostr_decode_rune(s, l, &w);
    bool sp = r == 0x85 || r == 0xa0 || r == 0x1680 || (r >= 0x2000 && r <= 0x200a) ||
              r == 0x2028 || r == 0x2029 || r == 0x202f || r == 0x205f || r == 0x3000;
    return sp ? l : 0;
}

/* Length of the IsSpace rune ending at s + n, or 0. */
static size_t
space_before(const unsigned char *s, size_t n)
{
    for (size_t l = 1; l <= 3 && l <= n; l++)
        if (space_at(s + n - l, l) == l)
            return l;
    return 0;
}

const char *
auth_bearer_token(const char *authorization, size_t *len)
{
    *len = 0;
    if (!authorization)
        return NULL;
    /* strings.TrimSpace */
    const unsigned char *s = (const unsigned char *)authorization;
    size_t n = strlen(authorization), k;
    while (n && (k = space_at(s, n))) {
        s += k;
        n -= k;
    }
    while (n && (k = space_before(s, n)))
        n -= k;
    /* strings.Split(auth, " "): parts[0] must be "bearer" in any case, and
     * parts[1] is the token. */
    const unsigned char *sp = memchr(s, ' ', n);
    if (!sp || sp - s != 6 || strncasecmp((const char *)s, "bearer", 6) != 0)
        return NULL;
    const unsigned char *tok = sp + 1;
    const unsigned char *end = memchr(tok, ' ', n - (size_t)(tok - s));
    size_t tl = end ? (size_t)(end - tok) : n - (size_t)(tok - s);
    if (tl == 0)
        return NULL; /* "Empty bearer tokens aren't valid" */
    *len = tl;
    return (const char *)tok;
}

/* ---- wire formats ---- */

char *
auth_token_review_json(const char *token, size_t len, size_t *outlen)
{
    /* Built by hand so the token is copied only into this buffer, which the
     * caller wipes. Escaping as Go's encoder: invalid UTF-8 is U+FFFD. */
    static const char hex[] = "0123456789abcdef";
    struct gostr_buf b = {0};
    gostr_add(&b, "{\"apiVersion\":\"authentication.k8s.io/v1\",\"kind\":\"TokenReview\","
               "\"spec\":{\"token\":\"");
    for (size_t i = 0; i < len;) {
        const unsigned char *p = (const unsigned char *)token + i;
        size_t n = kwc_utf8_seq(p, len - i);
        if (n == 0) {
            gostr_add(&b, "\\ufffd");
            i++;
        } else if (n == 1 && (*p < 0x20 || *p == '"' || *p == '\\')) {
            char e[6] = {'\\', 'u', '0', '0', hex[*p >> 4], hex[*p & 15]};
            if (*p == '"' || *p == '\\')
                gostr_addn(&b, (char[]){'\\', (char)*p}, 2);
            else
                gostr_addn(&b, e, 6);
            i++;
        } else {
            gostr_addn(&b, (const char *)p, n);
            i += n;
        }
    }
    gostr_add(&b, "\"}}");
    *outlen = b.len;
    return gostr_take(&b);
}

static int
parse_strings(json_t *arr, char ***out, size_t *n)
{
    if (!json_is_array(arr))
        return KWC_EPARSE;
    size_t cnt = json_array_size(arr);
    char **v = xcalloc(cnt ? cnt : 1, sizeof(*v));
    for (size_t i = 0; i < cnt; i++) {
        const char *s = json_string_value(json_array_get(arr, i));
        if (!s) {
            for (size_t j = 0; j < i; j++)
                free(v[j]);
            free(v);
            return KWC_EPARSE;
        }
        v[i] = xstrdup(s);
    }
    *out = v;
    *n = cnt;
    return 0;
}

int
auth_token_review_parse(const char *body, size_t len, struct auth_user **out, char *err,
                        size_t errlen)
{
    *out = NULL;
    json_error_t je;
    json_t *doc = json_loadb(body, len, 0, &je);
    if (!doc)
        return kwc_errf(err, errlen, KWC_EPARSE, "TokenReview: not JSON (%s)", je.text);
    int rc = KWC_EPARSE;
    struct auth_user *u = NULL;
    json_t *st = json_object_get(doc, "status");
    json_t *ok = json_object_get(st, "authenticated");
    if (!json_is_object(doc) || (st && !json_is_object(st)) || (ok && !json_is_boolean(ok))) {
        kwc_errf(err, errlen, rc, "TokenReview: malformed status");
        goto out;
    }
    if (!json_is_true(ok)) {
        rc = 0; /* rejected (status.error, if any, says why) */
        goto out;
    }
    json_t *ju = json_object_get(st, "user");
    json_t *name = json_object_get(ju, "username"), *uid = json_object_get(ju, "uid");
    json_t *groups = json_object_get(ju, "groups"), *extra = json_object_get(ju, "extra");
    if ((ju && !json_is_object(ju)) || (name && !json_is_string(name)) ||
        (uid && !json_is_string(uid)) ||
        (extra && !json_is_null(extra) && !json_is_object(extra))) {
        kwc_errf(err, errlen, rc, "TokenReview: malformed status.user");
        goto out;
    }
    u = user_new(json_string_value(name), json_string_value(uid));
    u->from_token = true;
    if (groups && !json_is_null(groups) && parse_strings(groups, &u->groups, &u->ngroups) != 0) {
        kwc_errf(err, errlen, rc, "TokenReview: status.user.groups is not a list of strings");
        goto out;
    }
    size_t ne = json_is_object(extra) ? json_object_size(extra) : 0;
    u->extra = xcalloc(ne ? ne : 1, sizeof(*u->extra));
    const char *k;
    json_t *v;
    json_object_foreach(json_is_object(extra) ? extra : NULL, k, v)
    {
        struct auth_extra *e = &u->extra[u->nextra];
        if (!json_is_null(v) && parse_strings(v, &e->values, &e->nvalues) != 0) {
            kwc_errf(err, errlen, rc, "TokenReview: status.user.extra is not lists of strings");
            goto out;
        }
        e->key = xstrdup(k); /* jansson refuses \u0000 in a document: no NUL here */
        e->keylen = strlen(k);
        u->nextra++;
    }
    add_authenticated_group(u);
    *out = u;
    u = NULL;
    rc = 0;
out:
    auth_user_unref(u);
    json_decref(doc);
    return rc;
}

static void
set_nonempty(json_t *o, const char *key, const char *v)
{
    if (v && *v)
        json_object_set_new(o, key, jstr(v));
}

static int
cmp_extra(const void *a, const void *b)
{
    /* Go's sort.Strings: bytewise, a prefix first */
    const struct auth_extra *x = *(const struct auth_extra *const *)a,
                            *y = *(const struct auth_extra *const *)b;
    int c = memcmp(x->key, y->key, x->keylen < y->keylen ? x->keylen : y->keylen);
    return c ? c : (x->keylen > y->keylen) - (x->keylen < y->keylen);
}

/*
 * authorizationv1.SubjectAccessReviewSpec as webhook.go's Authorize fills
 * it, in the Go struct's field order with its omitempty rules:
 * resourceAttributes {namespace, verb, group, version, resource, subresource,
 * name} or nonResourceAttributes {path, verb}, then user, groups, extra (Go
 * marshals a map with sorted keys), uid. New.
 */
static json_t *
sar_spec(const struct auth_user *u, const struct auth_attrs *at)
{
    json_t *spec = json_object();
    json_t *ra = json_object();
    if (at->resource_request) {
        set_nonempty(ra, "namespace", at->namespace_);
        set_nonempty(ra, "verb", at->verb);
        set_nonempty(ra, "group", at->group);
        set_nonempty(ra, "version", at->version);
        set_nonempty(ra, "resource", at->resource);
        if (sub_len(at)) {
            struct gostr_buf sb = {0};
            valid_utf8n(&sb, at->subresource, sub_len(at));
            json_object_set_new(ra, "subresource", json_stringn(sb.p, sb.len));
            free(sb.p);
        }
        set_nonempty(ra, "name", at->name);
        json_object_set_new(spec, "resourceAttributes", ra);
    } else {
        set_nonempty(ra, "path", at->path);
        set_nonempty(ra, "verb", at->verb);
        json_object_set_new(spec, "nonResourceAttributes", ra);
    }
    if (u) {
        set_nonempty(spec, "user", u->name);
        if (u->ngroups) {
            json_t *g = json_array();
            for (size_t i = 0; i < u->ngroups; i++)
                json_array_append_new(g, jstr(u->groups[i]));
            json_object_set_new(spec, "groups", g);
        }
        if (u->nextra) {
            const struct auth_extra **ex = xmalloc(u->nextra * sizeof(*ex));
            for (size_t i = 0; i < u->nextra; i++)
                ex[i] = &u->extra[i];
            qsort(ex, u->nextra, sizeof(*ex), cmp_extra);
            json_t *eo = json_object();
            for (size_t i = 0; i < u->nextra; i++) {
                json_t *vals = json_array();
                for (size_t j = 0; j < ex[i]->nvalues; j++)
                    json_array_append_new(vals, jstr(ex[i]->values[j]));
                struct gostr_buf kb = {0};
                valid_utf8n(&kb, ex[i]->key, ex[i]->keylen);
                json_object_setn_new(eo, kb.p ? kb.p : "", kb.len, vals);
                free(kb.p);
            }
            free(ex);
            json_object_set_new(spec, "extra", eo);
        }
        set_nonempty(spec, "uid", u->uid);
    }
    return spec;
}

/* One field of a question's key: its length, ':', its bytes. */
static void
key_fieldn(struct gostr_buf *b, const char *s, size_t n)
{
    gostr_addu(b, n);
    gostr_addc(b, ':');
    gostr_addn(b, s ? s : "", n);
}

static void
key_field(struct gostr_buf *b, const char *s)
{
    key_fieldn(b, s, s ? strlen(s) : 0);
}

/* A count of the fields that follow: the number, then ';' (a field's
 * length ends in ':'), so a count and the field after it never read as
 * another count or field. */
static void
key_count(struct gostr_buf *b, size_t n)
{
    gostr_addu(b, n);
    gostr_addc(b, ';');
}

/*
 * The cache key of a question: SHA-256 of every field of the spec in the
 * spec's order (extra keys sorted as the spec marshals them). Every field is
 * length-prefixed and every count terminated, so the encoding reads back in
 * exactly one way and distinct questions never share a key (auth_test has a
 * pair that collided when counts were bare numbers). It stands for
 * webhook.go's key (the marshalled spec) without building the JSON on every
 * request: a cached answer is the hot path of every read kwc serves.
 * Strings are taken raw, so two spellings the JSON would make equal (invalid
 * UTF-8) are two entries: never the other way round.
 */
static void
question_key_bytes(const struct auth_user *u, const struct auth_attrs *at, struct gostr_buf *b)
{
    gostr_addc(b, at->resource_request ? 'R' : 'N');
    if (at->resource_request) {
        key_field(b, at->namespace_);
        key_field(b, at->verb);
        key_field(b, at->group);
        key_field(b, at->version);
        key_field(b, at->resource);
        key_fieldn(b, at->subresource, sub_len(at));
        key_field(b, at->name);
    } else {
        key_field(b, at->path);
        key_field(b, at->verb);
    }
    gostr_addc(b, u ? 'U' : '-');
    if (u) {
        key_field(b, u->name);
        key_field(b, u->uid);
        key_count(b, u->ngroups);
        for (size_t i = 0; i < u->ngroups; i++)
            key_field(b, u->groups[i]);
        size_t ne = u->nextra;
        const struct auth_extra **ex = xmalloc((ne ? ne : 1) * sizeof(*ex));
        for (size_t i = 0; i < ne; i++)
            ex[i] = &u->extra[i];
        if (ne > 1)
            qsort(ex, ne, sizeof(*ex), cmp_extra);
        key_count(b, ne);
        for (size_t i = 0; i < ne; i++) {
            key_fieldn(b, ex[i]->key, ex[i]->keylen);
            key_count(b, ex[i]->nvalues);
            for (size_t j = 0; j < ex[i]->nvalues; j++)
                key_field(b, ex[i]->values[j]);
        }
        free(ex);
    }
}

static void
question_key(const struct auth_user *u, const struct auth_attrs *at, unsigned char key[32])
{
    struct gostr_buf b = {0};
    question_key_bytes(u, at, &b);
    sha256(b.p, b.len, key);
    free(b.p);
}

char *
auth_question_bytes(const struct auth_user *u, const struct auth_attrs *at, size_t *len)
{
    struct gostr_buf b = {0};
    question_key_bytes(u, at, &b);
    *len = b.len;
    return b.p ? b.p : xcalloc(1, 1);
}

static char *
dump(const json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!s)
        abort(); /* only on OOM: every string in it is valid UTF-8 */
    return s;
}

static json_t *
sar_doc(json_t *spec)
{
    json_t *doc = json_object();
    json_object_set_new(doc, "apiVersion", json_string("authorization.k8s.io/v1"));
    json_object_set_new(doc, "kind", json_string("SubjectAccessReview"));
    json_object_set(doc, "spec", spec);
    return doc;
}

char *
auth_sar_json(const struct auth_user *u, const struct auth_attrs *at)
{
    json_t *spec = sar_spec(u, at);
    json_t *doc = sar_doc(spec);
    char *s = dump(doc);
    json_decref(doc);
    json_decref(spec);
    return s;
}

/* Every \u0000 escape of a JSON text (s, len bytes) becomes \ufffd, in
 * place (an escaped backslash before "u0000" is not an escape). Returns
 * whether one was found. */
static bool
nul_escapes_replaced(char *s, size_t len)
{
    bool found = false;
    for (size_t i = 0; i + 1 < len; i++) {
        if (s[i] != '\\')
            continue;
        if (s[i + 1] == 'u' && i + 6 <= len && memcmp(s + i + 2, "0000", 4) == 0) {
            memcpy(s + i + 2, "fffd", 4);
            found = true;
        }
        i++; /* the escaped character */
    }
    return found;
}

int
auth_sar_parse(const char *body, size_t len, enum auth_decision *d, char **reason, char *err,
               size_t errlen)
{
    *reason = NULL;
    json_error_t je;
    /* the upstream echoes the spec: an extra key or subresource may hold a
     * NUL (\u0000), which jansson refuses unless told, and in an object key
     * (spec.extra) refuses whatever it is told: those escapes are read as
     * U+FFFD instead (only status is read from the answer) */
    json_t *doc = json_loadb(body, len, JSON_ALLOW_NUL, &je);
    if (!doc) {
        char *copy = xmalloc(len + 1);
        memcpy(copy, body, len);
        copy[len] = '\0';
        if (nul_escapes_replaced(copy, len))
            doc = json_loadb(copy, len, JSON_ALLOW_NUL, &je);
        free(copy);
    }
    if (!doc)
        return kwc_errf(err, errlen, KWC_EPARSE, "SubjectAccessReview: not JSON (%s)", je.text);
    int rc = KWC_EPARSE;
    json_t *st = json_object_get(doc, "status");
    json_t *allowed = json_object_get(st, "allowed"), *denied = json_object_get(st, "denied");
    json_t *why = json_object_get(st, "reason");
    if (!json_is_object(doc) || (st && !json_is_object(st)) ||
        (allowed && !json_is_boolean(allowed)) || (denied && !json_is_boolean(denied)) ||
        (why && !json_is_string(why))) {
        kwc_errf(err, errlen, rc, "SubjectAccessReview: malformed status");
        goto out;
    }
    /* webhook.go: denied (with or without allowed) denies, allowed allows,
     * neither is no opinion — a denial for kwc, which asks no other authorizer. */
    *d = json_is_true(allowed) && !json_is_true(denied) ? AUTH_ALLOW : AUTH_DENY;
    *reason = xstrdup(why ? json_string_value(why) : "");
    rc = 0;
out:
    json_decref(doc);
    return rc;
}

/* ---- the 403 ---- */

char *
auth_forbidden_status(const char *user, const struct auth_attrs *at, const char *reason)
{
    struct gostr_buf m = {0}, msg = {0};
    const char *resource = at->resource_request ? nz(at->resource) : "";
    const char *group = at->resource_request ? nz(at->group) : "";
    const char *name = at->resource_request ? nz(at->name) : "";

    /* responsewriters.forbiddenMessage */
    gostr_add(&m, "User ");
    gostr_quote(&m, nz(user), strlen(nz(user)));
    gostr_add(&m, " cannot ");
    gostr_add(&m, nz(at->verb));
    if (!at->resource_request) {
        /* `User %q cannot %s path %q` */
        gostr_add(&m, " path ");
        gostr_quote(&m, nz(at->path), strlen(nz(at->path)));
    } else {
        /* `User %q cannot %s resource %q in API group %q` + scope, the
         * resource with "/subresource" when there is one */
        struct gostr_buf res = {0};
        gostr_add(&res, resource);
        if (sub_len(at)) {
            gostr_add(&res, "/");
            gostr_addn(&res, at->subresource, sub_len(at));
        }
        gostr_add(&m, " resource ");
        gostr_quote(&m, res.p ? res.p : "", res.len);
        free(res.p);
        gostr_add(&m, " in API group ");
        gostr_quote(&m, group, strlen(group));
        if (at->namespace_ && *at->namespace_) {
            gostr_add(&m, " in the namespace ");
            gostr_quote(&m, at->namespace_, strlen(at->namespace_));
        } else {
            gostr_add(&m, " at the cluster scope");
        }
    }

    /* apierrors.NewForbidden(gr, name, err): qualifiedResource.String() is
     * "resource" or "resource.group"; `forbidden: ` when both are empty,
     * `%s is forbidden: ` without a name, `%s %q is forbidden: ` with one. */
    if (!*resource && !*group) {
        gostr_add(&msg, "forbidden: ");
    } else {
        gostr_add(&msg, resource);
        if (*group) {
            gostr_add(&msg, ".");
            gostr_add(&msg, group);
        }
        if (*name) {
            gostr_add(&msg, " ");
            gostr_quote(&msg, name, strlen(name));
        }
        gostr_add(&msg, " is forbidden: ");
    }
    /* responsewriters.Forbidden: sanitizer.Replace(forbiddenMessage(...)),
     * then `%s: %s` with the reason when it is non-empty. */
    sanitize(&msg, m.p);
    free(m.p);
    if (reason && *reason) {
        gostr_add(&msg, ": ");
        gostr_add(&msg, reason);
    }
    /* NewForbidden's StatusDetails {Name, Group, Kind: resource}, each
     * omitempty; status_failure_json writes the metav1.Status as kube does. */
    char *vname = valid_utf8(name), *vgroup = valid_utf8(group), *vkind = valid_utf8(resource);
    struct status_details d = {.name = *vname ? vname : NULL,
                               .group = *vgroup ? vgroup : NULL,
                               .kind = *vkind ? vkind : NULL};
    char *out = status_failure_json(403, "Forbidden", msg.p, &d);
    free(vname);
    free(vgroup);
    free(vkind);
    free(msg.p);
    return out;
}

/* ---- hash tables keyed by SHA-256 digests ---- */

struct hent {
    unsigned char key[32];
    struct hent *next; /* bucket chain */
    TAILQ_ENTRY(hent) age;
    double expires;
};
TAILQ_HEAD(hent_list, hent);

struct htab {
    struct hent **b;
    size_t nb, n;
    struct hent_list ages; /* oldest first */
    void (*free_ent)(struct hent *e);
};

static void
htab_init(struct htab *t, void (*free_ent)(struct hent *e))
{
    t->nb = 64;
    t->b = xcalloc(t->nb, sizeof(*t->b));
    t->n = 0;
    TAILQ_INIT(&t->ages);
    t->free_ent = free_ent;
}

static size_t
bucket(const struct htab *t, const unsigned char key[32])
{
    uint64_t h;
    memcpy(&h, key, sizeof(h));
    return (size_t)(h & (t->nb - 1));
}

static struct hent *
htab_get(const struct htab *t, const unsigned char key[32])
{
    for (struct hent *e = t->b[bucket(t, key)]; e; e = e->next)
        if (memcmp(e->key, key, 32) == 0)
            return e;
    return NULL;
}

/* Unlink e (does not free it). */
static void
htab_remove(struct htab *t, struct hent *e)
{
    struct hent **pp = &t->b[bucket(t, e->key)];
    while (*pp != e)
        pp = &(*pp)->next;
    *pp = e->next;
    TAILQ_REMOVE(&t->ages, e, age);
    t->n--;
}

static void
htab_put(struct htab *t, struct hent *e)
{
    assert(!htab_get(t, e->key));
    if (t->n >= t->nb) {
        size_t nb = t->nb * 2;
        struct hent **b = xcalloc(nb, sizeof(*b));
        for (size_t i = 0; i < t->nb; i++) {
            for (struct hent *x = t->b[i], *nx; x; x = nx) {
                nx = x->next;
                uint64_t h;
                memcpy(&h, x->key, sizeof(h));
                x->next = b[h & (nb - 1)];
                b[h & (nb - 1)] = x;
            }
        }
        free(t->b);
        t->b = b;
        t->nb = nb;
    }
    size_t i = bucket(t, e->key);
    e->next = t->b[i];
    t->b[i] = e;
    TAILQ_INSERT_TAIL(&t->ages, e, age);
    t->n++;
}

/* Make room for one more under max: expired entries among the oldest first,
 * else the oldest. */
static void
htab_make_room(struct htab *t, size_t max, double now)
{
    while (t->n >= max) {
        struct hent *e = TAILQ_FIRST(&t->ages), *victim = e;
        for (int i = 0; e && i < EVICT_SCAN; i++, e = TAILQ_NEXT(e, age)) {
            if (e->expires <= now) {
                victim = e;
                break;
            }
        }
        htab_remove(t, victim);
        t->free_ent(victim);
    }
}

static void
htab_fini(struct htab *t)
{
    struct hent *e;
    while ((e = TAILQ_FIRST(&t->ages))) {
        htab_remove(t, e);
        t->free_ent(e);
    }
    free(t->b);
}

/* ---- the caches ---- */

struct tok_ent {
    struct hent h; /* first: the table's entry */
    int status;
    struct auth_user *u;
};

struct sar_ent {
    struct hent h;
    enum auth_decision d;
    char *reason;
};

static void
free_tok_ent(struct hent *e)
{
    struct tok_ent *t = (struct tok_ent *)e;
    auth_user_unref(t->u);
    free(t);
}

static void
free_sar_ent(struct hent *e)
{
    struct sar_ent *s = (struct sar_ent *)e;
    free(s->reason);
    free(s);
}

/* ---- reviews in flight ---- */

enum review_kind { REVIEW_TOKEN, REVIEW_SAR };

struct auth_wait {
    uint32_t magic;
    struct review *r;
    TAILQ_ENTRY(auth_wait) link;
    auth_user_cb ucb;
    auth_decision_cb dcb;
    void *arg;
};

struct review {
    struct hent h; /* first: keyed in a->pending */
    uint32_t magic;
    struct auth *a;
    enum review_kind kind;
    bool cacheable;
    bool ending; /* review_done is calling the waiters back */
    struct up_xfer *x;
    char *req; /* the request body (holds the token of a TokenReview) */
    size_t req_len, req_off;
    int status;
    char *resp;
    size_t resp_len, resp_cap;
    struct event *oversize_ev; /* answers an oversized response outside curl */
    TAILQ_HEAD(, auth_wait) waiters;
};

static void
free_review_ent(struct hent *e)
{
    (void)e; /* reviews are freed by review_free, never through the table */
    abort();
}

struct auth {
    uint32_t magic;
    struct event_base *base;
    struct up_client *up;
    struct auth_options o;
    struct htab tokens, sars;
    struct htab pending[2]; /* reviews in flight, by enum review_kind */
    struct auth_stats st;
    double last_log;
    unsigned long suppressed;
};

/* Upstream failures are logged at most once a second (never with a token). */
static void
log_failure(struct auth *a, const char *what, const char *why)
{
    double now = mono_now();
    if (a->last_log && now - a->last_log < 1.0) {
        a->suppressed++;
        return;
    }
    if (a->suppressed)
        log_warnx("auth: %s failed: %s (and %lu more failures in the last second); answering "
                  "401 / an authorization error until the upstream answers",
                  what, why, a->suppressed);
    else
        log_warnx("auth: %s failed: %s; answering 401 / an authorization error until the "
                  "upstream answers",
                  what, why);
    a->last_log = now;
    a->suppressed = 0;
}

static void
review_free(struct review *r)
{
    assert(TAILQ_EMPTY(&r->waiters));
    if (r->x)
        up_xfer_cancel(r->x);
    if (r->req) {
        OPENSSL_cleanse(r->req, r->req_len);
        free(r->req);
    }
    free(r->resp);
    if (r->oversize_ev)
        event_free(r->oversize_ev);
    r->magic = 0;
    free(r);
}

static int
on_review_headers(void *arg, int status, const struct up_header *h, size_t n)
{
    struct review *r = arg;
    assert(r->magic == REVIEW_MAGIC);
    r->status = status;
    return 0;
}

static ssize_t
on_review_body(void *arg, char *buf, size_t cap)
{
    struct review *r = arg;
    assert(r->magic == REVIEW_MAGIC);
    size_t n = r->req_len - r->req_off;
    if (n > cap)
        n = cap;
    memcpy(buf, r->req + r->req_off, n);
    r->req_off += n;
    return (ssize_t)n;
}

static void review_done(struct review *r, int err, const char *msg);

static void
on_oversize(evutil_socket_t fd, short what, void *arg)
{
    review_done(arg, KWC_ETOOBIG, "the response exceeds 1 MiB");
}

static int
on_review_data(void *arg, const char *p, size_t n)
{
    struct review *r = arg;
    assert(r->magic == REVIEW_MAGIC);
    if (n > AUTH_MAX_BODY - r->resp_len) {
        /* Bounded before allocation: stop the transfer and answer from a
         * deferred event, outside the upstream client's callbacks. */
        up_xfer_cancel(r->x);
        r->x = NULL;
        r->oversize_ev = event_new(r->a->base, -1, 0, on_oversize, r);
        event_active(r->oversize_ev, EV_TIMEOUT, 1);
        return 0;
    }
    if (r->resp_len + n > r->resp_cap) {
        size_t cap = r->resp_cap ? r->resp_cap : 4096;
        while (cap < r->resp_len + n)
            cap *= 2;
        r->resp = xrealloc(r->resp, cap);
        r->resp_cap = cap;
    }
    memcpy(r->resp + r->resp_len, p, n);
    r->resp_len += n;
    return 0;
}

static void
on_review_done(void *arg, int err, const char *msg)
{
    struct review *r = arg;
    assert(r->magic == REVIEW_MAGIC);
    r->x = NULL; /* the client frees it after this */
    review_done(r, err, msg);
}

static const struct up_xfer_cbs review_cbs = {.on_headers = on_review_headers,
                                              .on_data = on_review_data,
                                              .on_body = on_review_body,
                                              .on_done = on_review_done};

/* Start the review of body (taken) under key. NULL if it could not start
 * (logged; body wiped and freed). */
static struct review *
review_start(struct auth *a, enum review_kind kind, const unsigned char key[32], char *body,
             size_t len, bool cacheable)
{
    struct review *r = xcalloc(1, sizeof(*r));
    r->magic = REVIEW_MAGIC;
    r->a = a;
    r->kind = kind;
    r->cacheable = cacheable;
    memcpy(r->h.key, key, 32);
    r->req = body;
    r->req_len = len;
    TAILQ_INIT(&r->waiters);
    static const struct up_header hdrs[] = {{"Content-Type", "application/json"},
                                            {"Accept", "application/json"}};
    struct up_request req = {.method = "POST",
                             .target = kind == REVIEW_TOKEN ? TOKENREVIEW_PATH : SAR_PATH,
                             .headers = hdrs,
                             .nheaders = KWC_ARRAY_LEN(hdrs),
                             .has_body = true,
                             .body_len = (int64_t)len,
                             .pool = kind == REVIEW_TOKEN ? UP_POOL_TOKENREVIEW : UP_POOL_SAR};
    int rc = up_xfer_start(a->up, &req, &review_cbs, r, &r->x);
    if (rc != 0) {
        r->x = NULL;
        log_failure(a, kind == REVIEW_TOKEN ? "TokenReview" : "SubjectAccessReview",
                    kwc_strerror(rc));
        review_free(r);
        return NULL;
    }
    htab_put(&a->pending[kind], &r->h);
    return r;
}

static struct auth_wait *
wait_add(struct review *r, auth_user_cb ucb, auth_decision_cb dcb, void *arg)
{
    struct auth_wait *w = xcalloc(1, sizeof(*w));
    w->magic = WAIT_MAGIC;
    w->r = r;
    w->ucb = ucb;
    w->dcb = dcb;
    w->arg = arg;
    TAILQ_INSERT_TAIL(&r->waiters, w, link);
    return w;
}

/* Pop the next waiter of r (freed), or false when none is left. */
static bool
wait_pop(struct review *r, struct auth_wait *out)
{
    struct auth_wait *w = TAILQ_FIRST(&r->waiters);
    if (!w)
        return false;
    TAILQ_REMOVE(&r->waiters, w, link);
    *out = *w;
    w->magic = 0;
    free(w);
    return true;
}

static void
token_cache_put(struct auth *a, const unsigned char key[32], int status, struct auth_user *u)
{
    unsigned ttl = status == 0 ? a->o.token_ttl_s : a->o.token_fail_ttl_s;
    if (ttl == 0)
        return;
    double now = mono_now();
    htab_make_room(&a->tokens, a->o.max_entries, now);
    struct tok_ent *e = xcalloc(1, sizeof(*e));
    memcpy(e->h.key, key, 32);
    e->h.expires = now + ttl;
    e->status = status;
    e->u = u;
    if (u)
        auth_user_ref(u);
    htab_put(&a->tokens, &e->h);
}

static void
sar_cache_put(struct auth *a, const unsigned char key[32], enum auth_decision d, const char *reason)
{
    unsigned ttl = d == AUTH_ALLOW ? a->o.allow_ttl_s : a->o.deny_ttl_s;
    if (ttl == 0)
        return;
    double now = mono_now();
    htab_make_room(&a->sars, a->o.max_entries, now);
    struct sar_ent *e = xcalloc(1, sizeof(*e));
    memcpy(e->h.key, key, 32);
    e->h.expires = now + ttl;
    e->d = d;
    e->reason = xstrdup(reason);
    htab_put(&a->sars, &e->h);
}

/* The review ended (err 0: r->status and r->resp hold the answer). Cache
 * it, call every waiter back, free r. */
static void
review_done(struct review *r, int err, const char *msg)
{
    assert(r->magic == REVIEW_MAGIC);
    struct auth *a = r->a;
    htab_remove(&a->pending[r->kind], &r->h);
    r->ending = true; /* a callback that cancels another waiter must not free r */
    /* The token leaves memory as soon as its review is over. */
    OPENSSL_cleanse(r->req, r->req_len);
    char why[256] = "";
    if (err)
        snprintf(why, sizeof(why), "%s", msg && *msg ? msg : kwc_strerror(err));
    else if (r->status != 200 && r->status != 201)
        snprintf(why, sizeof(why), "the upstream answered HTTP %d", r->status);
    struct auth_wait w;
    if (r->kind == REVIEW_TOKEN) {
        struct auth_user *u = NULL;
        if (!why[0] &&
            auth_token_review_parse(r->resp ? r->resp : "", r->resp_len, &u, why, sizeof(why)) !=
                0 &&
            !why[0])
            snprintf(why, sizeof(why), "unparsable TokenReview");
        if (why[0]) {
            a->st.token_review_errors++;
            log_failure(a, "TokenReview", why);
        }
        int status = u ? 0 : 401;
        token_cache_put(a, r->h.key, status, u);
        while (wait_pop(r, &w)) {
            if (u)
                a->st.authn_token++;
            else
                a->st.authn_denied++;
            w.ucb(w.arg, status, u);
        }
        auth_user_unref(u);
    } else {
        enum auth_decision d = AUTH_ERROR;
        char *reason = NULL;
        if (!why[0] && auth_sar_parse(r->resp ? r->resp : "", r->resp_len, &d, &reason, why,
                                      sizeof(why)) != 0) {
            d = AUTH_ERROR;
            if (!why[0])
                snprintf(why, sizeof(why), "unparsable SubjectAccessReview");
        }
        if (d == AUTH_ERROR) {
            log_failure(a, "SubjectAccessReview", why);
            free(reason);
            reason = xasprintf("SubjectAccessReview failed: %s", why);
        } else if (r->cacheable) {
            sar_cache_put(a, r->h.key, d, reason);
        }
        while (wait_pop(r, &w)) {
            if (d == AUTH_ALLOW)
                a->st.authz_allowed++;
            else if (d == AUTH_DENY)
                a->st.authz_denied++;
            else
                a->st.authz_errors++;
            w.dcb(w.arg, d, reason);
        }
        free(reason);
    }
    review_free(r);
}

/* ---- public API ---- */

int
auth_new(struct event_base *base, struct up_client *up, const struct auth_options *o,
         struct auth **out)
{
    struct auth *a = xcalloc(1, sizeof(*a));
    a->magic = AUTH_MAGIC;
    a->base = base;
    a->up = up;
    a->o = *o;
    if (a->o.max_entries == 0)
        a->o.max_entries = DEFAULT_MAX_ENTRIES;
    htab_init(&a->tokens, free_tok_ent);
    htab_init(&a->sars, free_sar_ent);
    htab_init(&a->pending[REVIEW_TOKEN], free_review_ent);
    htab_init(&a->pending[REVIEW_SAR], free_review_ent);
    *out = a;
    return 0;
}

void
auth_free(struct auth *a)
{
    if (!a)
        return;
    assert(a->magic == AUTH_MAGIC);
    for (int k = 0; k < 2; k++) {
        struct hent *e;
        while ((e = TAILQ_FIRST(&a->pending[k].ages))) {
            struct review *r = (struct review *)e;
            struct auth_wait w;
            htab_remove(&a->pending[k], e);
            while (wait_pop(r, &w))
                ;
            review_free(r);
        }
        htab_fini(&a->pending[k]);
    }
    htab_fini(&a->tokens);
    htab_fini(&a->sars);
    a->magic = 0;
    free(a);
}

void
auth_stats(const struct auth *a, struct auth_stats *out)
{
    *out = a->st;
}

/* A cached answer for key, or NULL (an expired one is dropped). */
static struct hent *
cache_get(struct htab *t, const unsigned char key[32])
{
    struct hent *e = htab_get(t, key);
    if (e && e->expires <= mono_now()) {
        htab_remove(t, e);
        t->free_ent(e);
        return NULL;
    }
    return e;
}

struct auth_wait *
auth_authenticate(struct auth *a, struct x509_st *cert, const char *authorization, auth_user_cb cb,
                  void *arg)
{
    assert(a->magic == AUTH_MAGIC);
    /* 1. x509: a verified certificate with a CN */
    struct auth_user *u = NULL;
    if (cert && auth_cert_user(cert, &u) == 0) {
        a->st.authn_cert++;
        cb(arg, 0, u);
        auth_user_unref(u);
        return NULL;
    }
    /* 2. bearertoken -> the caching webhook token authenticator */
    size_t tl;
    const char *tok = auth_bearer_token(authorization, &tl);
    if (tok) {
        unsigned char key[32];
        sha256(tok, tl, key);
        struct tok_ent *e = (struct tok_ent *)cache_get(&a->tokens, key);
        if (e) {
            a->st.token_cache_hits++;
            if (e->status == 0)
                a->st.authn_token++;
            else
                a->st.authn_denied++;
            cb(arg, e->status, e->u);
            return NULL;
        }
        struct review *r = (struct review *)htab_get(&a->pending[REVIEW_TOKEN], key);
        if (!r) {
            size_t bl;
            char *body = auth_token_review_json(tok, tl, &bl);
            r = review_start(a, REVIEW_TOKEN, key, body, bl, true);
            if (!r) {
                a->st.token_review_errors++;
                a->st.authn_denied++;
                cb(arg, 401, NULL);
                return NULL;
            }
            a->st.token_reviews++;
        }
        return wait_add(r, cb, NULL, arg);
    }
    /* 3. anonymous (unionauth.NewFailOnError: only when nothing above
     * applied; a rejected token never gets here) */
    if (a->o.anonymous) {
        u = user_new(USER_ANONYMOUS, "");
        user_add_group(u, GROUP_UNAUTHENTICATED);
        a->st.authn_anonymous++;
        cb(arg, 0, u);
        auth_user_unref(u);
        return NULL;
    }
    a->st.authn_denied++;
    cb(arg, 401, NULL);
    return NULL;
}

static size_t
attr_bytes(const struct auth_attrs *at)
{
    return strlen(nz(at->namespace_)) + strlen(nz(at->verb)) + strlen(nz(at->group)) +
           strlen(nz(at->version)) + strlen(nz(at->resource)) + sub_len(at) +
           strlen(nz(at->name)) + strlen(nz(at->path));
}

struct auth_wait *
auth_authorize(struct auth *a, const struct auth_user *u, const struct auth_attrs *at,
               auth_decision_cb cb, void *arg)
{
    assert(a->magic == AUTH_MAGIC);
    /* webhook.go keys its cache by the marshalled SubjectAccessReviewSpec;
     * question_key is the same question, without the JSON */
    unsigned char key[32];
    question_key(u, at, key);

    struct sar_ent *e = (struct sar_ent *)cache_get(&a->sars, key);
    if (e) {
        a->st.sar_cache_hits++;
        if (e->d == AUTH_ALLOW)
            a->st.authz_allowed++;
        else
            a->st.authz_denied++;
        cb(arg, e->d, e->reason);
        return NULL;
    }
    struct review *r = (struct review *)htab_get(&a->pending[REVIEW_SAR], key);
    if (r) {
        a->st.sar_coalesced++;
        return wait_add(r, NULL, cb, arg);
    }
    json_t *spec = sar_spec(u, at);
    json_t *doc = sar_doc(spec);
    char *body = dump(doc);
    json_decref(doc);
    json_decref(spec);
    r = review_start(a, REVIEW_SAR, key, body, strlen(body),
                     attr_bytes(at) < MAX_CACHED_ATTR_BYTES);
    if (!r) {
        a->st.authz_errors++;
        cb(arg, AUTH_ERROR, "SubjectAccessReview failed: the request could not be started");
        return NULL;
    }
    a->st.sar_sent++;
    return wait_add(r, NULL, cb, arg);
}

void
auth_cancel(struct auth_wait *w)
{
    if (!w)
        return;
    assert(w->magic == WAIT_MAGIC);
    struct review *r = w->r;
    TAILQ_REMOVE(&r->waiters, w, link);
    w->magic = 0;
    free(w);
    if (!TAILQ_EMPTY(&r->waiters) || r->ending)
        return;
    /* No one waits any more (see auth.h): end the transfer, cache nothing. */
    struct auth *a = r->a;
    htab_remove(&a->pending[r->kind], &r->h);
    a->st.reviews_cancelled++;
    review_free(r);
}
