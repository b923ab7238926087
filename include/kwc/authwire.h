/*
 * authwire.h — the pure half of auth (auth.h): who a caller is and what they
 * ask, in kube-apiserver's own formats.
 *
 * The identity and the question (kube's user.Info and authorizer.Attributes),
 * the Authorization header, the user of a client certificate, the
 * TokenReview (authentication.k8s.io/v1) and SubjectAccessReview
 * (authorization.k8s.io/v1) bodies as kube's webhook authenticator and
 * authorizer write and read them, the bytes a question's cache key is made
 * of, and the 403 Status kube answers a denial with. auth.c sends the reviews
 * and caches their answers; impersonate.c builds users too.
 *
 * Pure: no event loop, no clock, no I/O; unit-tested (tests/unit/
 * authwire_test.c) and fuzzed (tests/fuzz/auth_fuzz.c). The functions share
 * auth's prefix: to callers auth.h and authwire.h are one module (auth.h
 * includes this header), split by what may block.
 */
#ifndef KWC_AUTHWIRE_H
#define KWC_AUTHWIRE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

struct x509_st;

struct auth_extra {
    char *key; /* NUL-terminated, and keylen bytes long: a key may hold NUL bytes */
    size_t keylen;
    char **values;
    size_t nvalues;
};

/* An authenticated identity (immutable once made; shared by reference,
 * across threads too: a cached user is handed to every serving loop, so
 * the count is atomic). */
struct auth_user {
    atomic_uint refs;
    char *name;
    char *uid; /* "" when none */
    char **groups;
    size_t ngroups;
    struct auth_extra *extra;
    size_t nextra;
    bool from_token; /* authenticated by a bearer token (forward-token mode) */
};
void auth_user_ref(struct auth_user *u);
/* Drops a reference; the last frees u. Accepts NULL. */
void auth_user_unref(struct auth_user *u);

/* kube's authorizer.Attributes, as RequestInfo fills them. Borrowed strings. */
struct auth_attrs {
    bool resource_request;
    const char
        *verb; /* get list watch create update patch delete deletecollection impersonate ... */
    const char *group; /* "" for core */
    const char *version;
    const char *resource;
    const char *subresource; /* NULL or "" for none */
    size_t subresource_len;  /* its bytes when it may hold NUL (an extra key); 0: strlen */
    const char *namespace_;  /* NULL or "" for cluster scope / all namespaces */
    const char *name;        /* NULL or "" for none */
    const char *path;        /* non-resource requests: the URL path */
};

/* AUTH_BUSY: not asked, the caller's source holds its share of reviews
 * (auth.h): the caller answers kube's max-in-flight 429. */
enum auth_decision { AUTH_ALLOW, AUTH_DENY, AUTH_ERROR, AUTH_BUSY };

/* The token of an Authorization header by kube's bearertoken authenticator
 * (request/bearertoken): the header trimmed of white space (Go's
 * strings.TrimSpace), split on single spaces; the first field must be
 * "bearer" in any case and the token is the second field, which must not be
 * empty (so "Bearer  x", with two spaces, is no token). Fields after the
 * second are ignored, as kube does. Returns a pointer into authorization and
 * sets *len, or NULL if the header holds no bearer token. */
const char *auth_bearer_token(const char *authorization, size_t *len);
/* kube's forbidden message (responsewriters.forbiddenMessage) and the whole
 * 403 Status JSON kube writes for at and user name (reason appended after
 * ": " when non-empty). Caller frees. */
char *auth_forbidden_status(const char *user, const struct auth_attrs *at, const char *reason);

/* The user of a verified client certificate (x509.CommonNameUserConversion
 * plus the authenticated group adder): subject CN (the last one) as name,
 * each O in order as a group, then system:authenticated. Returns 0 and *out
 * (new reference), or KWC_ENOTFOUND when the subject has no usable CN. */
int auth_cert_user(struct x509_st *cert, struct auth_user **out);
/* The user of kube's anonymous authenticator: system:anonymous in the one
 * group system:unauthenticated, no uid (new reference). */
struct auth_user *auth_anonymous_user(void);
/* kube's isAnonymousUser (filters/authentication.go): system:anonymous, or
 * any user in the group system:unauthenticated. */
bool auth_user_is_anonymous(const struct auth_user *u);
/* The TokenReview request body for a token (new; holds the token: wipe it
 * with OPENSSL_cleanse before freeing). */
char *auth_token_review_json(const char *token, size_t len, size_t *outlen);
/* A TokenReview response body: 0 and *out (new reference, group adder
 * applied) when status.authenticated, 0 and *out NULL when not,
 * KWC_EPARSE when the body is not a TokenReview (message in err). */
int auth_token_review_parse(const char *body, size_t len, struct auth_user **out, char *err,
                            size_t errlen);
/* The bytes a question's cache key is the SHA-256 of (new; *len set): every
 * field length-prefixed and every count terminated, so distinct questions
 * have distinct bytes. */
char *auth_question_bytes(const struct auth_user *u, const struct auth_attrs *at, size_t *len);
/* Whether the answer to at may be cached: webhook.go's shouldCache, the
 * bytes of namespace, verb, group, version, resource, subresource, name and
 * path under maxControlledAttrCacheSize (10000). */
bool auth_question_cacheable(const struct auth_attrs *at);
/* The SubjectAccessReview request body for u doing at (new), as kube's
 * webhook authorizer fills it. */
char *auth_sar_json(const struct auth_user *u, const struct auth_attrs *at);
/* A SubjectAccessReview response body: 0, *d (AUTH_ALLOW or AUTH_DENY) and
 * *reason (new, "" when none), or KWC_EPARSE (message in err). */
int auth_sar_parse(const char *body, size_t len, enum auth_decision *d, char **reason, char *err,
                   size_t errlen);

#endif
