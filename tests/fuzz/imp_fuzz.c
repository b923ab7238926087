/*
 * imp_fuzz.c — libFuzzer target for identity derivation (impersonate.h):
 * request headers -> the impersonation questions -> the identity -> the
 * headers kwc forwards upstream.
 *
 * Input: lines separated by '\n', each one header. A line's first byte picks
 * the name (Impersonate-User / -Group / -Uid / -Extra-<rest of the line up
 * to ':'> / another header, in either case), the rest after ':' is the value
 * (no CR, LF or NUL: the HTTP layer refuses those in values).
 *
 * Invariants (abort on failure):
 *  - a plan asks at most IMP_MAX_ATTRS questions; more is IMP_TOO_MANY;
 *  - every attribute of the identity was asked about: its name is the
 *    user question's, each group is an asked group or one kube adds itself
 *    (system:authenticated, system:unauthenticated for system:anonymous,
 *    the service account's two when no group was asked), each extra
 *    (key, value) and the uid are questions;
 *  - the forwarded headers read back (imp_plan + imp_user, the upstream's
 *    rules) as the same identity, and ask nothing that was not asked here
 *    or added by kube's rules: every attribute forwarded was asked about.
 */
#include "kwc/impersonate.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_LINES 400

static bool
asked(const struct imp_plan *p, enum imp_kind kind, const char *name, const char *key,
      size_t keylen)
{
    for (size_t i = 0; i < p->nq; i++) {
        const struct imp_question *q = &p->q[i];
        if (q->kind != kind || strcmp(q->name, name) != 0)
            continue;
        if (kind == IMP_EXTRA && (q->keylen != keylen || memcmp(q->key, key, keylen) != 0))
            continue;
        return true;
    }
    return false;
}

static const struct imp_question *
user_question(const struct imp_plan *p)
{
    for (size_t i = 0; i < p->nq; i++)
        if (p->q[i].kind == IMP_USER || p->q[i].kind == IMP_SERVICEACCOUNT)
            return &p->q[i];
    return NULL;
}

/* Every attribute of u was asked in p, or is one kube adds. */
static void
check_asked(const struct imp_plan *p, const struct auth_user *u)
{
    const struct imp_question *uq = user_question(p);
    if (!uq)
        abort();
    bool sa = uq->kind == IMP_SERVICEACCOUNT, any_group = false;
    for (size_t i = 0; i < p->nq; i++)
        any_group |= p->q[i].kind == IMP_GROUP;
    if (sa) {
        char *want = xasprintf("system:serviceaccount:%s:%s", uq->namespace_, uq->name);
        if (strcmp(u->name, want) != 0)
            abort();
        free(want);
    } else if (strcmp(u->name, uq->name) != 0) {
        abort();
    }
    bool anonymous = strcmp(u->name, "system:anonymous") == 0;
    for (size_t g = 0; g < u->ngroups; g++) {
        const char *n = u->groups[g];
        if (asked(p, IMP_GROUP, n, NULL, 0))
            continue;
        if (!anonymous && strcmp(n, "system:authenticated") == 0)
            continue;
        if (anonymous && strcmp(n, "system:unauthenticated") == 0)
            continue;
        if (sa && !any_group && strncmp(n, "system:serviceaccounts", 22) == 0) {
            if (n[22] == '\0' || (n[22] == ':' && strcmp(n + 23, uq->namespace_) == 0))
                continue;
        }
        abort();
    }
    for (size_t e = 0; e < u->nextra; e++)
        for (size_t v = 0; v < u->extra[e].nvalues; v++)
            if (!asked(p, IMP_EXTRA, u->extra[e].values[v], u->extra[e].key, u->extra[e].keylen))
                abort();
    if (u->uid[0] && !asked(p, IMP_UID, u->uid, NULL, 0))
        abort();
}

static bool
same_user(const struct auth_user *a, const struct auth_user *b)
{
    if (strcmp(a->name, b->name) || strcmp(a->uid, b->uid) || a->ngroups != b->ngroups ||
        a->nextra != b->nextra)
        return false;
    for (size_t i = 0; i < a->ngroups; i++)
        if (strcmp(a->groups[i], b->groups[i]))
            return false;
    for (size_t e = 0; e < a->nextra; e++) {
        const struct auth_extra *x = &a->extra[e], *y = &b->extra[e];
        if (x->keylen != y->keylen || memcmp(x->key, y->key, x->keylen) || x->nvalues != y->nvalues)
            return false;
        for (size_t v = 0; v < x->nvalues; v++)
            if (strcmp(x->values[v], y->values[v]))
                return false;
    }
    return true;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct http_header h[MAX_LINES];
    char *names[MAX_LINES], *values[MAX_LINES];
    size_t n = 0;
    static const char *const fixed[] = {
        "Impersonate-User", "impersonate-group", "Impersonate-Uid", "IMPERSONATE-GROUP",
        "Authorization",    "impersonate-user",  "Impersonate-Uid"};
    for (size_t i = 0; i < size && n < MAX_LINES;) {
        size_t e = i;
        while (e < size && data[e] != '\n')
            e++;
        const char *line = (const char *)data + i;
        size_t len = e - i;
        i = e + 1;
        if (len == 0)
            continue;
        unsigned char pick = (unsigned char)line[0];
        const char *rest = line + 1;
        size_t rl = len - 1;
        const char *colon = memchr(rest, ':', rl);
        size_t kl = colon ? (size_t)(colon - rest) : 0;
        const char *v = colon ? colon + 1 : rest;
        size_t vl = colon ? rl - kl - 1 : rl;
        if (memchr(v, '\0', vl) || memchr(v, '\r', vl))
            continue;
        if (pick % 8 == 7) {
            if (memchr(rest, '\0', kl))
                continue;
            names[n] = xasprintf(
                "%s%.*s", pick & 0x80 ? "impersonate-extra-" : "Impersonate-Extra-", (int)kl, rest);
        } else {
            names[n] = xstrdup(fixed[pick % 8]);
        }
        values[n] = xstrndup(v, vl);
        h[n] = (struct http_header){names[n], values[n]};
        n++;
    }

    struct imp_plan p;
    enum imp_result r = imp_plan(h, n, &p);
    if (p.nq > IMP_MAX_ATTRS || (r == IMP_TOO_MANY && (p.asked <= IMP_MAX_ATTRS || p.nq)))
        abort();
    if (r == IMP_NO_USER) {
        size_t ml;
        char *m = imp_no_user_message(&p, &ml);
        free(m);
    }
    if (r == IMP_ASK) {
        struct auth_user *u = imp_user(&p);
        check_asked(&p, u);
        struct http_header *fh;
        char **fnames;
        size_t fn = imp_headers(u, &fh, &fnames);
        struct imp_plan p2;
        enum imp_result r2 = imp_plan(fh, fn, &p2);
        /* the groups kube adds may carry a full identity past the limit */
        if (r2 == IMP_TOO_MANY && fn > IMP_MAX_ATTRS && fn <= IMP_MAX_ATTRS + 3) {
            imp_plan_fini(&p2);
            imp_headers_free(fh, fnames);
            auth_user_unref(u);
            goto out;
        }
        if (r2 != IMP_ASK)
            abort();
        struct auth_user *u2 = imp_user(&p2);
        if (!same_user(u, u2))
            abort();
        /* what the upstream is asked to let kwc impersonate: asked here, or
         * one of the groups kube adds (checked as attributes of u) */
        check_asked(&p, u2);
        auth_user_unref(u2);
        imp_plan_fini(&p2);
        imp_headers_free(fh, fnames);
        auth_user_unref(u);
    }
out:
    imp_plan_fini(&p);
    for (size_t i = 0; i < n; i++) {
        free(names[i]);
        free(values[i]);
    }
    return 0;
}
