/*
 * impersonate.c — Impersonate-* headers as kube reads them (see impersonate.h).
 */
#include "kwc/impersonate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kwc/base.h"
#include "kwc/gostr.h"

#define SA_PREFIX "system:serviceaccount:"
#define EXTRA_PREFIX "Impersonate-Extra-"

/* ---- serviceaccount.SplitUsername ---- */

static bool
dns_alnum(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

/* A DNS-1123 label: [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 bytes. */
static bool
dns1123_label(const char *s, size_t n)
{
    if (n == 0 || n > 63 || !dns_alnum(s[0]) || !dns_alnum(s[n - 1]))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!dns_alnum(s[i]) && s[i] != '-')
            return false;
    return true;
}

/* A DNS-1123 subdomain: labels joined by '.', at most 253 bytes. */
static bool
dns1123_subdomain(const char *s, size_t n)
{
    if (n == 0 || n > 253)
        return false;
    for (size_t i = 0; i <= n;) {
        size_t l = 0;
        while (i + l < n && s[i + l] != '.')
            l++;
        /* each label as a label, without the 63-byte bound (kube's regexp) */
        if (l == 0 || !dns_alnum(s[i]) || !dns_alnum(s[i + l - 1]))
            return false;
        for (size_t j = i; j < i + l; j++)
            if (!dns_alnum(s[j]) && s[j] != '-')
                return false;
        i += l + 1;
    }
    return true;
}

bool
imp_split_sa(const char *user, size_t *nslen, const char **name)
{
    size_t pl = strlen(SA_PREFIX);
    if (strncmp(user, SA_PREFIX, pl) != 0)
        return false;
    const char *ns = user + pl, *colon = strchr(ns, ':');
    /* strings.Split(trimmed, ":") must give exactly two parts */
    if (!colon || strchr(colon + 1, ':'))
        return false;
    size_t nl = (size_t)(colon - ns);
    if (!dns1123_label(ns, nl) || !dns1123_subdomain(colon + 1, strlen(colon + 1)))
        return false;
    *nslen = nl;
    *name = colon + 1;
    return true;
}

/* ---- the plan ---- */

static bool
name_is(const char *name, const char *want)
{
    return strcasecmp(name, want) == 0;
}

static const char *
extra_suffix(const char *name)
{
    size_t pl = strlen(EXTRA_PREFIX);
    return strncasecmp(name, EXTRA_PREFIX, pl) == 0 ? name + pl : NULL;
}

/* kube's unescapeExtraKey(strings.ToLower(suffix)): url.PathUnescape (a
 * '+' stays), the lower-cased text itself when an escape is malformed. New,
 * *len set (the key may hold NUL bytes). */
static char *
extra_key(const char *suffix, size_t *len)
{
    size_t n = strlen(suffix);
    char *low = xmalloc(n + 1);
    for (size_t i = 0; i <= n; i++)
        low[i] = (char)((suffix[i] >= 'A' && suffix[i] <= 'Z') ? suffix[i] + 32 : suffix[i]);
    char *out = xmalloc(n + 1);
    if (kwc_pct_decode(low, n, false, out, len) != 0) {
        free(out);
        *len = n;
        return low; /* url.EscapeError: the key as it came, lower-cased */
    }
    free(low);
    return out;
}

static struct imp_question *
add_q(struct imp_plan *p, enum imp_kind kind, const char *name)
{
    struct imp_question *q = &p->q[p->nq++];
    *q = (struct imp_question){.kind = kind, .name = xstrdup(name)};
    return q;
}

enum imp_result
imp_plan(const struct http_header *h, size_t n, struct imp_plan *out)
{
    *out = (struct imp_plan){0};
    const char *user = NULL, *uid = NULL;
    bool any = false;
    size_t asked = 0;
    for (size_t i = 0; i < n; i++) {
        if (name_is(h[i].name, "Impersonate-User")) {
            if (!user)
                user = h[i].value; /* Header.Get: the first value */
        } else if (name_is(h[i].name, "Impersonate-Uid")) {
            if (!uid)
                uid = h[i].value;
        } else if (name_is(h[i].name, "Impersonate-Group") || extra_suffix(h[i].name)) {
            any = true;
            asked++;
        }
    }
    bool has_user = user && *user, has_uid = uid && *uid;
    asked += has_user + has_uid;
    out->asked = asked;
    if (!has_user && !has_uid && !any)
        return IMP_NONE;
    if (asked > IMP_MAX_ATTRS)
        return IMP_TOO_MANY;

    out->q = xcalloc(asked, sizeof(*out->q));
    if (has_user) {
        size_t nl;
        const char *sa_name;
        if (imp_split_sa(user, &nl, &sa_name)) {
            struct imp_question *q = add_q(out, IMP_SERVICEACCOUNT, sa_name);
            q->namespace_ = xstrndup(user + strlen(SA_PREFIX), nl);
        } else {
            add_q(out, IMP_USER, user);
        }
    }
    for (size_t i = 0; i < n; i++)
        if (name_is(h[i].name, "Impersonate-Group"))
            add_q(out, IMP_GROUP, h[i].value);
    /* extras: each header name (case aside) once, at its first place, with
     * every value of every header of that name */
    for (size_t i = 0; i < n; i++) {
        const char *suffix = extra_suffix(h[i].name);
        if (!suffix)
            continue;
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++)
            seen = strcasecmp(h[j].name, h[i].name) == 0;
        if (seen)
            continue;
        size_t kl;
        char *key = extra_key(suffix, &kl);
        for (size_t j = i; j < n; j++) {
            if (strcasecmp(h[j].name, h[i].name) != 0)
                continue;
            struct imp_question *q = add_q(out, IMP_EXTRA, h[j].value);
            q->key = xmalloc(kl + 1);
            memcpy(q->key, key, kl + 1);
            q->keylen = kl;
        }
        free(key);
    }
    if (has_uid)
        add_q(out, IMP_UID, uid);
    return has_user ? IMP_ASK : IMP_NO_USER;
}

void
imp_plan_fini(struct imp_plan *p)
{
    for (size_t i = 0; i < p->nq; i++) {
        free(p->q[i].name);
        free(p->q[i].namespace_);
        free(p->q[i].key);
    }
    free(p->q);
    *p = (struct imp_plan){0};
}

void
imp_attrs(const struct imp_question *q, struct auth_attrs *at)
{
    static const char *const res[] = {[IMP_USER] = "users",
                                      [IMP_SERVICEACCOUNT] = "serviceaccounts",
                                      [IMP_GROUP] = "groups",
                                      [IMP_EXTRA] = "userextras",
                                      [IMP_UID] = "uids"};
    bool authn = q->kind == IMP_EXTRA || q->kind == IMP_UID;
    *at = (struct auth_attrs){.resource_request = true,
                              .verb = "impersonate",
                              .group = authn ? "authentication.k8s.io" : "",
                              .version = "v1",
                              .resource = res[q->kind],
                              .subresource = q->kind == IMP_EXTRA ? q->key : NULL,
                              .subresource_len = q->kind == IMP_EXTRA ? q->keylen : 0,
                              .namespace_ = q->namespace_,
                              .name = q->name};
}

/* ---- the identity ---- */

static void
add_group(struct auth_user *u, const char *g)
{
    u->groups = xrealloc(u->groups, (u->ngroups + 1) * sizeof(*u->groups));
    u->groups[u->ngroups++] = xstrdup(g);
}

static bool
has_group(const struct auth_user *u, const char *g)
{
    for (size_t i = 0; i < u->ngroups; i++)
        if (strcmp(u->groups[i], g) == 0)
            return true;
    return false;
}

static void
add_extra(struct auth_user *u, const char *key, size_t kl, const char *value)
{
    size_t e = 0;
    while (e < u->nextra && !(u->extra[e].keylen == kl && memcmp(u->extra[e].key, key, kl) == 0))
        e++;
    if (e == u->nextra) {
        u->extra = xrealloc(u->extra, (u->nextra + 1) * sizeof(*u->extra));
        char *k = xmalloc(kl + 1);
        memcpy(k, key, kl);
        k[kl] = '\0';
        u->extra[u->nextra++] = (struct auth_extra){.key = k, .keylen = kl};
    }
    struct auth_extra *x = &u->extra[e];
    x->values = xrealloc(x->values, (x->nvalues + 1) * sizeof(*x->values));
    x->values[x->nvalues++] = xstrdup(value);
}

struct auth_user *
imp_user(const struct imp_plan *p)
{
    struct auth_user *u = xcalloc(1, sizeof(*u));
    u->refs = 1;
    bool groups_asked = false;
    for (size_t i = 0; i < p->nq; i++)
        groups_asked |= p->q[i].kind == IMP_GROUP;
    char *name = NULL, *uid = NULL;
    for (size_t i = 0; i < p->nq; i++) {
        const struct imp_question *q = &p->q[i];
        switch (q->kind) {
        case IMP_SERVICEACCOUNT:
            free(name);
            name = xasprintf(SA_PREFIX "%s:%s", q->namespace_, q->name);
            if (!groups_asked) {
                /* serviceaccount.MakeGroupNames: the fixed mapping */
                char *nsg = xasprintf("system:serviceaccounts:%s", q->namespace_);
                add_group(u, "system:serviceaccounts");
                add_group(u, nsg);
                free(nsg);
            }
            break;
        case IMP_USER:
            free(name);
            name = xstrdup(q->name);
            break;
        case IMP_GROUP:
            add_group(u, q->name);
            break;
        case IMP_EXTRA:
            add_extra(u, q->key, q->keylen, q->name);
            break;
        case IMP_UID:
            free(uid);
            uid = xstrdup(q->name);
            break;
        }
    }
    u->name = name ? name : xstrdup("");
    u->uid = uid ? uid : xstrdup("");
    if (strcmp(u->name, "system:anonymous") != 0) {
        if (!has_group(u, "system:authenticated") && !has_group(u, "system:unauthenticated"))
            add_group(u, "system:authenticated");
    } else if (!has_group(u, "system:unauthenticated")) {
        add_group(u, "system:unauthenticated");
    }
    return u;
}

char *
imp_no_user_message(const struct imp_plan *p, size_t *len)
{
    /* fmt's %v of []v1.ObjectReference: {Kind Namespace Name UID APIVersion
     * ResourceVersion FieldPath}, space-separated */
    struct gostr_buf b = {0};
    gostr_add(&b, "requested [");
    for (size_t i = 0; i < p->nq; i++) {
        const struct imp_question *q = &p->q[i];
        if (i)
            gostr_addc(&b, ' ');
        switch (q->kind) {
        case IMP_GROUP:
            gostr_add(&b, "{Group  ");
            gostr_add(&b, q->name);
            gostr_add(&b, "    }");
            break;
        case IMP_EXTRA:
            gostr_add(&b, "{UserExtra  ");
            gostr_add(&b, q->name);
            gostr_add(&b, "  authentication.k8s.io/v1  ");
            gostr_addn(&b, q->key, q->keylen);
            gostr_add(&b, "}");
            break;
        case IMP_UID:
            gostr_add(&b, "{UID  ");
            gostr_add(&b, q->name);
            gostr_add(&b, "  authentication.k8s.io/v1  }");
            break;
        case IMP_USER:
        case IMP_SERVICEACCOUNT:
            break; /* not in a plan without a user */
        }
    }
    gostr_add(&b, "] without impersonating a user");
    *len = b.len;
    return gostr_take(&b);
}

/* ---- upstream ---- */

static bool
key_byte_plain(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' ||
           c == '~';
}

size_t
imp_headers(const struct auth_user *u, struct http_header **out, char ***names)
{
    size_t n = 1 + u->ngroups + (u->uid[0] != 0);
    for (size_t e = 0; e < u->nextra; e++)
        n += u->extra[e].nvalues;
    struct http_header *h = xcalloc(n + 1, sizeof(*h));
    char **nm = xcalloc(u->nextra + 1, sizeof(*nm));
    size_t i = 0;
    h[i++] = (struct http_header){"Impersonate-User", u->name};
    for (size_t g = 0; g < u->ngroups; g++)
        h[i++] = (struct http_header){"Impersonate-Group", u->groups[g]};
    if (u->uid[0])
        h[i++] = (struct http_header){"Impersonate-Uid", u->uid};
    for (size_t e = 0; e < u->nextra; e++) {
        struct gostr_buf b = {0};
        gostr_add(&b, EXTRA_PREFIX);
        for (size_t k = 0; k < u->extra[e].keylen; k++) {
            unsigned char c = (unsigned char)u->extra[e].key[k];
            if (key_byte_plain(c)) {
                gostr_addc(&b, (char)c);
            } else {
                char esc[4];
                snprintf(esc, sizeof(esc), "%%%02X", c);
                gostr_add(&b, esc);
            }
        }
        nm[e] = gostr_take(&b);
        for (size_t v = 0; v < u->extra[e].nvalues; v++)
            h[i++] = (struct http_header){nm[e], u->extra[e].values[v]};
    }
    *out = h;
    *names = nm;
    return i;
}

void
imp_headers_free(struct http_header *h, char **names)
{
    if (names)
        for (size_t i = 0; names[i]; i++)
            free(names[i]);
    free(names);
    free(h);
}
