/*
 * impersonate_test.c — Impersonate-* headers read as kube-apiserver's
 * filters/impersonation.go reads them (expected values from kube's code and
 * Go's net/http, not from impersonate.c), and the identity's headers for the
 * upstream read back as the same identity.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"
#include "kwc/impersonate.h"
#include "tap.h"

#define H(n, v) ((struct http_header){(n), (v)})

static bool
user_has_group(const struct auth_user *u, const char *g)
{
    for (size_t i = 0; i < u->ngroups; i++)
        if (strcmp(u->groups[i], g) == 0)
            return true;
    return false;
}

/* The groups joined with ",". */
static char *
groups_of(const struct auth_user *u)
{
    char *s = xstrdup("");
    for (size_t i = 0; i < u->ngroups; i++) {
        char *t = xasprintf("%s%s%s", s, i ? "," : "", u->groups[i]);
        free(s);
        s = t;
    }
    return s;
}

static void
test_none(void)
{
    struct imp_plan p;
    struct http_header h[] = {H("Host", "x"), H("Impersonate-User", "")};
    is_int(imp_plan(h, 1, &p), IMP_NONE, "no Impersonate-*: none");
    imp_plan_fini(&p);
    /* headers.Get gives "", len("") == 0: no user, and nothing else asked */
    is_int(imp_plan(h, 2, &p), IMP_NONE, "an empty Impersonate-User alone: none");
    imp_plan_fini(&p);
    struct http_header u[] = {H("Impersonate-Uid", "")};
    is_int(imp_plan(u, 1, &p), IMP_NONE, "an empty Impersonate-Uid alone: none");
    imp_plan_fini(&p);
}

/* Hole 1: every group is a question, the 33rd as much as the first. */
static void
test_every_attribute_asked(void)
{
    struct http_header h[40];
    size_t n = 0;
    h[n++] = H("Impersonate-User", "x");
    for (int i = 0; i < 31; i++)
        h[n++] = H("Impersonate-Group", "g");
    h[n++] = H("Impersonate-Group", "system:masters");
    struct imp_plan p;
    is_int(imp_plan(h, n, &p), IMP_ASK, "33 attributes: asked");
    is_int(p.nq, 33, "33 questions");
    struct auth_attrs at;
    imp_attrs(&p.q[32], &at);
    is_str(at.resource, "groups", "the last question: groups");
    is_str(at.name, "system:masters", "... system:masters");
    struct auth_user *u = imp_user(&p);
    ok(user_has_group(u, "system:masters"), "the identity holds what was asked");
    is_int(u->ngroups, 33, "32 groups asked + system:authenticated");
    auth_user_unref(u);
    imp_plan_fini(&p);
}

static void
test_limit_refuses(void)
{
    struct http_header *h = xcalloc(IMP_MAX_ATTRS + 2, sizeof(*h));
    h[0] = H("Impersonate-User", "x");
    for (int i = 1; i < IMP_MAX_ATTRS; i++)
        h[i] = H("Impersonate-Group", "g");
    struct imp_plan p;
    is_int(imp_plan(h, IMP_MAX_ATTRS, &p), IMP_ASK, "IMP_MAX_ATTRS attributes: asked");
    is_int(p.nq, IMP_MAX_ATTRS, "every one a question");
    imp_plan_fini(&p);
    h[IMP_MAX_ATTRS] = H("Impersonate-Extra-Scopes", "s");
    is_int(imp_plan(h, IMP_MAX_ATTRS + 1, &p), IMP_TOO_MANY, "one more: refused");
    is_int(p.asked, IMP_MAX_ATTRS + 1, "the count is told");
    is_int(p.nq, 0, "no question is asked of a refused plan");
    imp_plan_fini(&p);
    /* a uid counts too */
    h[IMP_MAX_ATTRS] = H("Impersonate-Uid", "1");
    is_int(imp_plan(h, IMP_MAX_ATTRS + 1, &p), IMP_TOO_MANY, "a uid past the limit: refused");
    imp_plan_fini(&p);
    free(h);
}

/* Hole 3: serviceaccount.SplitUsername, and the groups it brings. */
static void
test_service_accounts(void)
{
    static const struct {
        const char *user;
        bool sa;
    } cases[] = {
        {"system:serviceaccount:ns:name", true},
        {"system:serviceaccount:kube-system:a.b-c", true},
        {"system:serviceaccount:ns", false},
        {"system:serviceaccount:ns:", false},
        {"system:serviceaccount::name", false},
        {"system:serviceaccount:ns:a:b", false},
        {"system:serviceaccount:NS:name", false},
        {"system:serviceaccount:ns:Name", false},
        {"system:serviceaccount:-ns:name", false},
        {"system:serviceaccount:ns:name-", false},
        {"system:serviceaccount:ns:a..b", false},
        {"system:serviceaccount:ns:.a", false},
        {"system:serviceaccounts:ns:name", false},
        {"System:serviceaccount:ns:name", false},
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(cases); i++) {
        struct http_header h[] = {H("Impersonate-User", cases[i].user)};
        struct imp_plan p;
        imp_plan(h, 1, &p);
        struct auth_attrs at;
        imp_attrs(&p.q[0], &at);
        struct auth_user *u = imp_user(&p);
        char *g = groups_of(u);
        if (cases[i].sa) {
            is_str(at.resource, "serviceaccounts", cases[i].user);
            char *want = xasprintf("system:serviceaccounts,system:serviceaccounts:%.*s,"
                                   "system:authenticated",
                                   (int)strcspn(cases[i].user + 22, ":"), cases[i].user + 22);
            is_str(g, want, "a service account's groups");
            free(want);
        } else {
            is_str(at.resource, "users", cases[i].user);
            is_str(g, "system:authenticated", "a plain user's groups");
        }
        is_str(u->name, cases[i].user, "the name as asked");
        free(g);
        auth_user_unref(u);
        imp_plan_fini(&p);
    }
    /* a 63-byte namespace is a label, 64 is not */
    char ns63[64], ns64[65];
    memset(ns63, 'a', 63);
    ns63[63] = '\0';
    memset(ns64, 'a', 64);
    ns64[64] = '\0';
    size_t nl;
    const char *name;
    char *u63 = xasprintf("system:serviceaccount:%s:n", ns63);
    char *u64 = xasprintf("system:serviceaccount:%s:n", ns64);
    ok(imp_split_sa(u63, &nl, &name) && nl == 63, "63-byte namespace");
    ok(!imp_split_sa(u64, &nl, &name), "64-byte namespace: a plain user");
    free(u63);
    free(u64);

    /* groups asked: the service account's are not added */
    struct http_header h[] = {H("Impersonate-User", "system:serviceaccount:ns:n"),
                              H("Impersonate-Group", "g")};
    struct imp_plan p;
    imp_plan(h, 2, &p);
    struct auth_user *u = imp_user(&p);
    char *g = groups_of(u);
    is_str(g, "g,system:authenticated", "groups asked: only those and system:authenticated");
    struct auth_attrs at;
    imp_attrs(&p.q[0], &at);
    is_str(at.namespace_, "ns", "the service account question: its namespace");
    is_str(at.name, "n", "... its name");
    free(g);
    auth_user_unref(u);
    imp_plan_fini(&p);
}

/* Hole 4: which header wins, empty values, anonymous. */
static void
test_header_rules(void)
{
    struct imp_plan p;
    struct http_header two_uids[] = {H("Impersonate-User", "x"), H("Impersonate-Uid", "first"),
                                     H("impersonate-uid", "second")};
    imp_plan(two_uids, 3, &p);
    struct auth_user *u = imp_user(&p);
    is_str(u->uid, "first", "two Impersonate-Uid: the first (Header.Get)");
    is_int(p.nq, 2, "one uid question");
    auth_user_unref(u);
    imp_plan_fini(&p);

    struct http_header empty_uid[] = {H("Impersonate-User", "x"), H("Impersonate-Uid", ""),
                                      H("Impersonate-Uid", "second")};
    imp_plan(empty_uid, 3, &p);
    u = imp_user(&p);
    is_str(u->uid, "", "an empty first Impersonate-Uid: no uid");
    is_int(p.nq, 1, "no uid question");
    auth_user_unref(u);
    imp_plan_fini(&p);

    struct http_header two_users[] = {H("IMPERSONATE-USER", "a"), H("Impersonate-User", "b")};
    imp_plan(two_users, 2, &p);
    u = imp_user(&p);
    is_str(u->name, "a", "two Impersonate-User: the first, whatever its case");
    is_int(p.nq, 1, "one user question");
    auth_user_unref(u);
    imp_plan_fini(&p);

    struct http_header empty_user[] = {H("Impersonate-User", ""), H("Impersonate-User", "b"),
                                       H("Impersonate-Group", "g")};
    is_int(imp_plan(empty_user, 3, &p), IMP_NO_USER, "an empty first user with a group: no user");
    size_t ml;
    char *m = imp_no_user_message(&p, &ml);
    is_str(m, "requested [{Group  g    }] without impersonating a user", "kube's message");
    free(m);
    imp_plan_fini(&p);

    struct http_header nouser[] = {H("Impersonate-Group", "g"), H("Impersonate-Extra-K", "v"),
                                   H("Impersonate-Uid", "u")};
    is_int(imp_plan(nouser, 3, &p), IMP_NO_USER, "group, extra, uid without a user");
    m = imp_no_user_message(&p, &ml);
    is_str(m,
           "requested [{Group  g    } {UserExtra  v  authentication.k8s.io/v1  k} {UID  u  "
           "authentication.k8s.io/v1  }] without impersonating a user",
           "kube's message lists every request");
    free(m);
    imp_plan_fini(&p);

    struct http_header groups[] = {H("Impersonate-User", "x"), H("Impersonate-Group", ""),
                                   H("impersonate-group", "g"), H("Impersonate-Group", "g")};
    imp_plan(groups, 4, &p);
    u = imp_user(&p);
    char *g = groups_of(u);
    is_str(g, ",g,g,system:authenticated", "every group in order, empty and duplicates kept");
    free(g);
    auth_user_unref(u);
    imp_plan_fini(&p);

    struct http_header anon[] = {H("Impersonate-User", "system:anonymous")};
    imp_plan(anon, 1, &p);
    u = imp_user(&p);
    g = groups_of(u);
    is_str(g, "system:unauthenticated", "system:anonymous: system:unauthenticated");
    free(g);
    auth_user_unref(u);
    imp_plan_fini(&p);

    struct http_header unauth[] = {H("Impersonate-User", "x"),
                                   H("Impersonate-Group", "system:unauthenticated")};
    imp_plan(unauth, 2, &p);
    u = imp_user(&p);
    g = groups_of(u);
    is_str(g, "system:unauthenticated", "system:unauthenticated asked: no system:authenticated");
    free(g);
    auth_user_unref(u);
    imp_plan_fini(&p);
}

/* Extra keys: lower-cased, then url.PathUnescape'd. */
static void
test_extra_keys(void)
{
    static const struct {
        const char *name, *key;
        size_t keylen;
    } cases[] = {
        {"Impersonate-Extra-Scopes", "scopes", 6},   {"impersonate-extra-Foo%2Fbar", "foo/bar", 7},
        {"Impersonate-Extra-a%41", "aA", 2},         {"Impersonate-Extra-a%00b", "a\0b", 3},
        {"Impersonate-Extra-A%zz", "a%zz", 4},       {"Impersonate-Extra-a%4", "a%4", 3},
        {"Impersonate-Extra-%C3%A9", "\xc3\xa9", 2}, {"Impersonate-Extra-", "", 0},
        {"Impersonate-Extra-a+b", "a+b", 3},
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(cases); i++) {
        struct http_header h[] = {H("Impersonate-User", "x"), H(cases[i].name, "v")};
        struct imp_plan p;
        imp_plan(h, 2, &p);
        is_int(p.nq, 2, cases[i].name);
        ok(p.q[1].keylen == cases[i].keylen &&
               memcmp(p.q[1].key, cases[i].key, cases[i].keylen) == 0,
           cases[i].name);
        struct auth_attrs at;
        imp_attrs(&p.q[1], &at);
        is_str(at.resource, "userextras", "an extra: userextras");
        is_str(at.group, "authentication.k8s.io", "... in authentication.k8s.io");
        is_int(at.subresource_len, cases[i].keylen, "... the key as subresource, whole");
        imp_plan_fini(&p);
    }
    /* names equal but for case are one header: values together, first place */
    struct http_header h[] = {H("Impersonate-User", "x"), H("Impersonate-Extra-A", "1"),
                              H("Impersonate-Extra-B", "2"), H("impersonate-extra-a", "3")};
    struct imp_plan p;
    imp_plan(h, 4, &p);
    is_int(p.nq, 4, "three extra questions");
    ok(p.q[1].key[0] == 'a' && strcmp(p.q[1].name, "1") == 0, "a=1 first");
    ok(p.q[2].key[0] == 'a' && strcmp(p.q[2].name, "3") == 0, "a=3 with it");
    ok(p.q[3].key[0] == 'b', "then b");
    struct auth_user *u = imp_user(&p);
    is_int(u->nextra, 2, "two keys");
    is_int(u->extra[0].nvalues, 2, "a: two values");
    auth_user_unref(u);
    imp_plan_fini(&p);
}

/* The headers for the upstream, read back by the same rules: the same
 * identity (kube upstream reads what kwc checked). */
static void
round_trip(const struct http_header *h, size_t n, const char *what)
{
    struct imp_plan p;
    if (imp_plan(h, n, &p) != IMP_ASK) {
        ok(0, what);
        imp_plan_fini(&p);
        return;
    }
    struct auth_user *u = imp_user(&p);
    struct http_header *fh;
    char **names;
    size_t fn = imp_headers(u, &fh, &names);
    struct imp_plan p2;
    is_int(imp_plan(fh, fn, &p2), IMP_ASK, what);
    struct auth_user *u2 = imp_user(&p2);
    bool same = strcmp(u->name, u2->name) == 0 && strcmp(u->uid, u2->uid) == 0 &&
                u->ngroups == u2->ngroups && u->nextra == u2->nextra;
    for (size_t i = 0; same && i < u->ngroups; i++)
        same = strcmp(u->groups[i], u2->groups[i]) == 0;
    for (size_t e = 0; same && e < u->nextra; e++) {
        same = u->extra[e].keylen == u2->extra[e].keylen &&
               memcmp(u->extra[e].key, u2->extra[e].key, u->extra[e].keylen) == 0 &&
               u->extra[e].nvalues == u2->extra[e].nvalues;
        for (size_t v = 0; same && v < u->extra[e].nvalues; v++)
            same = strcmp(u->extra[e].values[v], u2->extra[e].values[v]) == 0;
    }
    ok(same, what);
    auth_user_unref(u);
    auth_user_unref(u2);
    imp_plan_fini(&p);
    imp_plan_fini(&p2);
    imp_headers_free(fh, names);
}

static void
test_forwarded(void)
{
    struct http_header a[] = {H("Impersonate-User", "x"), H("Impersonate-Extra-a%41%00%25z", "v"),
                              H("Impersonate-Extra-A%zz", "w"), H("Impersonate-Uid", "u"),
                              H("Impersonate-Group", "")};
    round_trip(a, KWC_ARRAY_LEN(a), "upper case, NUL, '%' and malformed keys survive");
    struct http_header b[] = {H("Impersonate-User", "system:serviceaccount:ns:n")};
    round_trip(b, 1, "a service account");
    struct http_header c[] = {H("Impersonate-User", "system:serviceaccount:ns")};
    round_trip(c, 1, "a plain user named like a service account");
    struct http_header d[] = {H("Impersonate-User", "system:anonymous")};
    round_trip(d, 1, "anonymous");

    /* the names kwc sends: A-Z and '%' encoded */
    struct imp_plan p;
    imp_plan(a, KWC_ARRAY_LEN(a), &p);
    struct auth_user *u = imp_user(&p);
    struct http_header *fh;
    char **names;
    size_t fn = imp_headers(u, &fh, &names);
    bool found = false;
    for (size_t i = 0; i < fn; i++)
        found |= strcmp(fh[i].name, "Impersonate-Extra-a%41%00%25z") == 0;
    ok(found, "Impersonate-Extra-a%41%00%25z for the key \"aA\\0%z\"");
    imp_headers_free(fh, names);
    auth_user_unref(u);
    imp_plan_fini(&p);
}

int
main(void)
{
    TAP_RUN(test_none);
    TAP_RUN(test_every_attribute_asked);
    TAP_RUN(test_limit_refuses);
    TAP_RUN(test_service_accounts);
    TAP_RUN(test_header_rules);
    TAP_RUN(test_extra_keys);
    TAP_RUN(test_forwarded);
    return tap_done();
}
