/*
 * impersonate.h — a caller's Impersonate-* headers as kube-apiserver reads
 * them (staging/src/k8s.io/apiserver/pkg/endpoints/filters/impersonation.go:
 * buildImpersonationRequests, then WithImpersonation's loop), and the
 * headers that carry an identity upstream.
 *
 * One list, by construction: imp_plan() turns the headers into the ordered
 * list of questions (verb "impersonate") the caller must be allowed, and
 * imp_user() builds the identity from that list and nothing else, in kube's
 * loop, adding only the groups kube adds itself (a service account's when no
 * group was asked for, then system:authenticated or, for system:anonymous,
 * system:unauthenticated). imp_headers() writes that identity for the
 * upstream so that it reads back, by the same rules, as the same identity:
 * every attribute that leaves kwc was asked about. A request asking for more
 * than IMP_MAX_ATTRS attributes is refused whole (IMP_TOO_MANY); kwc never
 * checks a prefix and forwards the rest.
 *
 * Header rules (Go's net/http and kube, matched exactly):
 *  - names are compared without regard to case (Go canonicalizes them);
 *  - values arrive trimmed and with obs-folds joined (h1.c reads them as
 *    Go's textproto does);
 *  - Impersonate-User and Impersonate-Uid: the first value only
 *    (http.Header.Get); an empty first value is no user / no uid;
 *  - Impersonate-Group: every value in order, "" included;
 *  - Impersonate-Extra-KEY: every value in order; KEY is the rest of the
 *    header name lower-cased, then url.PathUnescape'd (kube's
 *    unescapeExtraKey; a malformed escape keeps the lower-cased text). The
 *    decoded key may hold any byte, NUL included, and upper case (%41 is
 *    "A"). Headers whose names differ only in case are one header to Go: their
 *    values are taken together, at the first one's place. Keys are taken in
 *    the order they first appear (Go walks a map there: any order is kube's;
 *    apisim and kwc both take this one);
 *  - a user that is system:serviceaccount:NS:NAME with NS a DNS-1123 label
 *    and NAME a DNS-1123 subdomain (serviceaccount.SplitUsername) is the
 *    service account NAME in NS; anything else is a plain user;
 *  - groups, extras or a uid without a user: kube's 500
 *    ("requested [...] without impersonating a user").
 *
 * Pure: no loop, no I/O; unit-tested and fuzzed (tests/fuzz/imp_fuzz.c).
 */
#ifndef KWC_IMPERSONATE_H
#define KWC_IMPERSONATE_H

#include <stdbool.h>
#include <stddef.h>

#include "kwc/auth.h"
#include "kwc/http.h"

/* Impersonated attributes (user + groups + extra values + uid) one request
 * may ask for. Go bounds them only by the 1 MiB head; 256 is far above what
 * any client sends (kubectl --as-group takes a handful) and keeps the
 * questions of one request bounded. More is refused (431), never cut. */
#define IMP_MAX_ATTRS 256

enum imp_kind { IMP_USER, IMP_SERVICEACCOUNT, IMP_GROUP, IMP_EXTRA, IMP_UID };

/* One question: may the caller impersonate this? Strings owned by the plan. */
struct imp_question {
    enum imp_kind kind;
    char *name;       /* the user, the service account's name, group, extra value or uid */
    char *namespace_; /* a service account's namespace; else NULL */
    char *key;        /* an extra's decoded key (keylen bytes, NUL-terminated too) */
    size_t keylen;
};

struct imp_plan {
    struct imp_question *q;
    size_t nq;
    size_t asked; /* attributes the headers ask for (> IMP_MAX_ATTRS: refused) */
};

enum imp_result {
    IMP_NONE = 0,      /* no impersonation: the request acts as its caller */
    IMP_ASK = 1,       /* ask each question of plan->q in order, then act as imp_user() */
    IMP_NO_USER = -1,  /* kube's 500: imp_no_user_message() */
    IMP_TOO_MANY = -2, /* over IMP_MAX_ATTRS: refuse (plan->asked says how many) */
};

/* The plan of h[0..n) (an http_header's name and value). *out is filled in
 * every case and freed with imp_plan_fini (empty for IMP_NONE and
 * IMP_TOO_MANY). */
enum imp_result imp_plan(const struct http_header *h, size_t n, struct imp_plan *out);
void imp_plan_fini(struct imp_plan *p);

/* q as authorizer attributes (strings borrowed from q), as
 * WithImpersonation's actingAsAttributes. */
void imp_attrs(const struct imp_question *q, struct auth_attrs *at);

/* The identity a plan makes (new reference), WithImpersonation's loop. */
struct auth_user *imp_user(const struct imp_plan *p);

/* kube's `requested %v without impersonating a user` for an IMP_NO_USER
 * plan: the questions as core/v1 ObjectReferences (new; *len bytes: an
 * extra key may hold NUL bytes). */
char *imp_no_user_message(const struct imp_plan *p, size_t *len);

/* serviceaccount.SplitUsername: true and the namespace's length and the
 * name's start when user names a service account. */
bool imp_split_sa(const char *user, size_t *nslen, const char **name);

/* The headers that carry u upstream: Impersonate-User, every group
 * (always at least one, so the upstream adds none of its own),
 * Impersonate-Uid when set, an Impersonate-Extra-KEY per value with KEY
 * percent-encoded so that kube's unescapeExtraKey reads back u's key
 * (everything but a-z 0-9 - _ . ~ is %XX: upper case would be lower-cased,
 * a NUL or a '%' would not survive). *names holds the header names the
 * array points at; free both with imp_headers_free. Returns the count. */
size_t imp_headers(const struct auth_user *u, struct http_header **out, char ***names);
void imp_headers_free(struct http_header *h, char **names);

#endif
