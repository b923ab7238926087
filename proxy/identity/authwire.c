/*
 * authwire.c — the pure half of kwc's delegated authentication and
 * authorization (see authwire.h): what kube-apiserver reads and writes on the
 * wire, with no event loop, no clock and no I/O.
 *
 * The Authorization header (request/bearertoken), the user of a verified
 * client certificate, the TokenReview and SubjectAccessReview request and
 * response bodies (plugin/pkg/authenticator/token/webhook and
 * plugin/pkg/authorizer/webhook), the bytes of a question's cache key, and
 * the 403 Status kube writes (responsewriters.forbiddenMessage inside
 * apierrors.NewForbidden). auth.c sends the reviews and caches the answers.
 *
 * Owns nothing between calls; every result is new (or a new reference) and
 * the caller's. Strings that reach JSON are made valid UTF-8 as Go's encoder
 * makes them (each byte that starts no valid sequence becomes U+FFFD).
 */
#include "kwc/authwire.h"

#include <assert.h>
#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/objects.h>
#include <openssl/x509.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kwc/base.h"
#include "kwc/gostr.h"
#include "kwc/status.h"

/* webhook.go maxControlledAttrCacheSize: larger questions are not cached. */
#define MAX_CACHED_ATTR_BYTES 10000

#define USER_ANONYMOUS "system:anonymous"
#define GROUP_AUTHENTICATED "system:authenticated"
#define GROUP_UNAUTHENTICATED "system:unauthenticated"

/* ---- small helpers ---- */

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
    atomic_fetch_add_explicit(&u->refs, 1, memory_order_relaxed);
}

void
auth_user_unref(struct auth_user *u)
{
    /* release: this thread's reads of u happen before the last one frees it */
    if (!u || atomic_fetch_sub_explicit(&u->refs, 1, memory_order_release) > 1)
        return;
    atomic_thread_fence(memory_order_acquire);
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

bool
auth_user_is_anonymous(const struct auth_user *u)
{
    if (strcmp(u->name, USER_ANONYMOUS) == 0)
        return true;
    for (size_t i = 0; i < u->ngroups; i++)
        if (strcmp(u->groups[i], GROUP_UNAUTHENTICATED) == 0)
            return true;
    return false;
}

struct auth_user *
auth_anonymous_user(void)
{
    struct auth_user *u = user_new(USER_ANONYMOUS, "");
    user_add_group(u, GROUP_UNAUTHENTICATED);
    return u;
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
 * The bytes of a question's cache key (auth.c keys its cache by their
 * SHA-256): every field of the spec in the spec's order (extra keys sorted as
 * the spec marshals them). Every field is length-prefixed and every count
 * terminated, so the encoding reads back in exactly one way and distinct
 * questions never share a key (authwire_test and auth_test have a pair that
 * collided when counts were bare numbers). It stands for
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

char *
auth_question_bytes(const struct auth_user *u, const struct auth_attrs *at, size_t *len)
{
    struct gostr_buf b = {0};
    question_key_bytes(u, at, &b);
    *len = b.len;
    return b.p ? b.p : xcalloc(1, 1);
}

bool
auth_question_cacheable(const struct auth_attrs *at)
{
    /* webhook.go shouldCache: the controlled attributes' bytes */
    size_t n = strlen(nz(at->namespace_)) + strlen(nz(at->verb)) + strlen(nz(at->group)) +
               strlen(nz(at->version)) + strlen(nz(at->resource)) + sub_len(at) +
               strlen(nz(at->name)) + strlen(nz(at->path));
    return n < MAX_CACHED_ATTR_BYTES;
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
