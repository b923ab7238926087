/*
 * authwire_test.c — proxy/identity/authwire.c: the pure half of auth.
 *
 * Checked against what kube-apiserver does, with the expected values written
 * from kube's source and its own tests: the bearer token rules of
 * request/bearertoken, the user of a client certificate
 * (x509.CommonNameUserConversion, group.AuthenticatedGroupAdder), the 403
 * text of responsewriters.forbiddenMessage wrapped by apierrors.NewForbidden
 * (the messages kubectl users see, e.g. `pods "p1" is forbidden: User "jane"
 * cannot get resource "pods" in API group "" in the namespace "default"`,
 * and the cases of responsewriters/errors_test.go), the
 * SubjectAccessReviewSpec that plugin/pkg/authorizer/webhook fills (Go field
 * order, omitempty, map keys sorted) and its shouldCache limit, and the
 * TokenReview and SubjectAccessReview answers as webhook.go reads them.
 * No loop, no socket, no clock.
 */
#include "kwc/authwire.h"

#include "kwc/base.h"
#include "tap.h"

#include <jansson.h>
#include <openssl/x509.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- pure helpers ---- */

static void
bearer_case(const char *hdr, const char *want)
{
    size_t len = 0;
    const char *t = auth_bearer_token(hdr, &len);
    char got[256] = "";
    if (t)
        snprintf(got, sizeof(got), "%.*s", (int)len, t);
    char what[300];
    snprintf(what, sizeof(what), "bearer [%s]", hdr ? hdr : "(null)");
    for (char *c = what; *c; c++)
        if ((unsigned char)*c < 0x20)
            *c = '?'; /* one line of TAP */
    is_str(t ? got : NULL, want, what);
}

static void
test_bearer(void)
{
    bearer_case(NULL, NULL);
    bearer_case("", NULL);
    bearer_case("Bearer token", "token");
    bearer_case("bearer token", "token");
    bearer_case("BEARER token", "token");
    bearer_case("bEaReR token", "token");
    bearer_case("  Bearer token  ", "token"); /* strings.TrimSpace */
    bearer_case("Bearer token\t", "token");
    bearer_case("Bearer token\r\n", "token");
    bearer_case("\xC2\xA0"
                "Bearer token\xE3\x80\x80",
                "token"); /* U+00A0, U+3000 are unicode.IsSpace */
    bearer_case("Bearer", NULL);
    bearer_case("Bearer ", NULL);               /* trimmed to "Bearer" */
    bearer_case("Bearer  token", NULL);         /* parts[1] is "" */
    bearer_case("Bearer token extra", "token"); /* parts[2:] ignored */
    bearer_case("Bearer\ttoken", NULL);         /* split on " " only */
    bearer_case("Bearer token\tx", "token\tx");
    bearer_case("Basic dXNlcjpwYXNz", NULL);
    bearer_case("Bearertoken", NULL);
    bearer_case("Bearers token", NULL);
    bearer_case("Token token", NULL);
}

static void
forbidden_case(const char *user, const struct auth_attrs *at, const char *reason, const char *want,
               const char *what)
{
    char *s = auth_forbidden_status(user, at, reason);
    is_str(s, want, what);
    free(s);
}

#define ST_HEAD "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\","

static void
test_forbidden(void)
{
    struct auth_attrs get_pod = {.resource_request = true,
                                 .verb = "get",
                                 .group = "",
                                 .version = "v1",
                                 .resource = "pods",
                                 .namespace_ = "default",
                                 .name = "p1"};
    forbidden_case("jane", &get_pod, "",
                   ST_HEAD "\"message\":\"pods \\\"p1\\\" is forbidden: User \\\"jane\\\" cannot "
                           "get resource \\\"pods\\\" in API group \\\"\\\" in the namespace "
                           "\\\"default\\\"\",\"reason\":\"Forbidden\",\"details\":{\"name\":"
                           "\"p1\",\"kind\":\"pods\"},\"code\":403}",
                   "named resource in a namespace");

    struct auth_attrs list_pods = {.resource_request = true,
                                   .verb = "list",
                                   .group = "",
                                   .version = "v1",
                                   .resource = "pods",
                                   .namespace_ = "kube-system"};
    forbidden_case("jane", &list_pods, NULL,
                   ST_HEAD "\"message\":\"pods is forbidden: User \\\"jane\\\" cannot list "
                           "resource \\\"pods\\\" in API group \\\"\\\" in the namespace "
                           "\\\"kube-system\\\"\",\"reason\":\"Forbidden\",\"details\":{\"kind\":"
                           "\"pods\"},\"code\":403}",
                   "collection in a namespace");

    struct auth_attrs nodes = {.resource_request = true,
                               .verb = "watch",
                               .group = "",
                               .version = "v1",
                               .resource = "nodes"};
    forbidden_case("system:serviceaccount:default:x", &nodes, "",
                   ST_HEAD "\"message\":\"nodes is forbidden: User "
                           "\\\"system:serviceaccount:default:x\\\" cannot watch resource "
                           "\\\"nodes\\\" in API group \\\"\\\" at the cluster scope\","
                           "\"reason\":\"Forbidden\",\"details\":{\"kind\":\"nodes\"},"
                           "\"code\":403}",
                   "cluster scope");

    struct auth_attrs scale = {.resource_request = true,
                               .verb = "update",
                               .group = "apps",
                               .version = "v1",
                               .resource = "deployments",
                               .subresource = "scale",
                               .namespace_ = "ns1",
                               .name = "web"};
    forbidden_case("jane", &scale, "",
                   ST_HEAD "\"message\":\"deployments.apps \\\"web\\\" is forbidden: User "
                           "\\\"jane\\\" cannot update resource \\\"deployments/scale\\\" in API "
                           "group \\\"apps\\\" in the namespace \\\"ns1\\\"\",\"reason\":"
                           "\"Forbidden\",\"details\":{\"name\":\"web\",\"group\":\"apps\","
                           "\"kind\":\"deployments\"},\"code\":403}",
                   "group, subresource and name");

    struct auth_attrs crds = {.resource_request = true,
                              .verb = "list",
                              .group = "apiextensions.k8s.io",
                              .version = "v1",
                              .resource = "customresourcedefinitions"};
    forbidden_case("jane", &crds, "no RBAC policy matched",
                   ST_HEAD "\"message\":\"customresourcedefinitions.apiextensions.k8s.io is "
                           "forbidden: User \\\"jane\\\" cannot list resource "
                           "\\\"customresourcedefinitions\\\" in API group "
                           "\\\"apiextensions.k8s.io\\\" at the cluster scope: no RBAC policy "
                           "matched\",\"reason\":\"Forbidden\",\"details\":{\"group\":"
                           "\"apiextensions.k8s.io\",\"kind\":\"customresourcedefinitions\"},"
                           "\"code\":403}",
                   "reason appended after \": \"");

    struct auth_attrs metrics = {.resource_request = false, .verb = "get", .path = "/metrics"};
    forbidden_case("system:anonymous", &metrics, "",
                   ST_HEAD "\"message\":\"forbidden: User \\\"system:anonymous\\\" cannot get "
                           "path \\\"/metrics\\\"\",\"reason\":\"Forbidden\",\"details\":{},"
                           "\"code\":403}",
                   "non-resource path");

    /* The sanitizer turns & < > of forbiddenMessage into entities, and Go's
     * encoder then writes & as \u0026; the reason is not sanitized. */
    forbidden_case("a<b>&c", &metrics, "x<y",
                   ST_HEAD "\"message\":\"forbidden: User \\\"a\\u0026lt;b\\u0026gt;\\u0026amp;c"
                           "\\\" cannot get path \\\"/metrics\\\": x\\u003cy\",\"reason\":"
                           "\"Forbidden\",\"details\":{},\"code\":403}",
                   "sanitized message, raw reason");

    /* %q: quotes and backslashes escaped, control bytes as \n / \x01,
     * invalid UTF-8 as \xff, non-printable runes as \u00a0; printable
     * non-ASCII kept. */
    forbidden_case("q\"b\\s\n\x01\xff\xC2\xA0\xC3\xA9", &metrics, "",
                   ST_HEAD "\"message\":\"forbidden: User \\\"q\\\\\\\"b\\\\\\\\s\\\\n\\\\x01"
                           "\\\\xff\\\\u00a0\xC3\xA9\\\" cannot get path \\\"/metrics\\\"\","
                           "\"reason\":\"Forbidden\",\"details\":{},\"code\":403}",
                   "user name quoted as Go's %q");
}

static void
test_token_review_json(void)
{
    size_t n;
    char *s = auth_token_review_json("abc.def-ghi", 11, &n);
    const char *want = "{\"apiVersion\":\"authentication.k8s.io/v1\",\"kind\":\"TokenReview\","
                       "\"spec\":{\"token\":\"abc.def-ghi\"}}";
    is_str(s, want, "TokenReview body");
    is_int(n, strlen(want), "its length");
    free(s);
    s = auth_token_review_json("a\"b\\c\x01\xff", 7, &n);
    is_str(s,
           "{\"apiVersion\":\"authentication.k8s.io/v1\",\"kind\":\"TokenReview\","
           "\"spec\":{\"token\":\"a\\\"b\\\\c\\u0001\\ufffd\"}}",
           "escaped as JSON, invalid UTF-8 as U+FFFD");
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    ok(j != NULL, "valid JSON");
    json_decref(j);
    free(s);
}

static struct auth_user *
mk_user(const char *name, const char *uid)
{
    char body[1024];
    snprintf(body, sizeof(body),
             "{\"status\":{\"authenticated\":true,\"user\":{\"username\":\"%s\",\"uid\":\"%s\","
             "\"groups\":[\"dev\",\"ops\"],\"extra\":{\"scopes\":[\"b\",\"a\"],"
             "\"authentication.kubernetes.io/pod-name\":[\"p\"]}}}}",
             name, uid);
    struct auth_user *u = NULL;
    char err[128];
    int rc = auth_token_review_parse(body, strlen(body), &u, err, sizeof(err));
    if (rc)
        printf("# parse: %s\n", err);
    return u;
}

static void
test_sar_json(void)
{
    struct auth_user *u = mk_user("jane", "42");
    ok(u != NULL, "user parsed");
    if (!u)
        return;
    struct auth_attrs at = {.resource_request = true,
                            .verb = "list",
                            .group = "apps",
                            .version = "v1",
                            .resource = "deployments",
                            .namespace_ = "ns1"};
    char *s = auth_sar_json(u, &at);
    is_str(s,
           "{\"apiVersion\":\"authorization.k8s.io/v1\",\"kind\":\"SubjectAccessReview\","
           "\"spec\":{\"resourceAttributes\":{\"namespace\":\"ns1\",\"verb\":\"list\",\"group\":"
           "\"apps\",\"version\":\"v1\",\"resource\":\"deployments\"},\"user\":\"jane\","
           "\"groups\":[\"dev\",\"ops\",\"system:authenticated\"],\"extra\":{"
           "\"authentication.kubernetes.io/pod-name\":[\"p\"],\"scopes\":[\"b\",\"a\"]},"
           "\"uid\":\"42\"}}",
           "resource SAR: field order, empty fields omitted, extra keys sorted");
    free(s);

    struct auth_attrs full = {.resource_request = true,
                              .verb = "get",
                              .group = "",
                              .version = "v1",
                              .resource = "pods",
                              .subresource = "log",
                              .namespace_ = "default",
                              .name = "p1"};
    struct auth_user *anon = NULL;
    char body[] = "{\"status\":{\"authenticated\":true,\"user\":{\"username\":\"system:anonymous\","
                  "\"groups\":[\"system:unauthenticated\"]}}}";
    char err[128];
    is_int(auth_token_review_parse(body, strlen(body), &anon, err, sizeof(err)), 0, "parsed");
    s = auth_sar_json(anon, &full);
    is_str(s,
           "{\"apiVersion\":\"authorization.k8s.io/v1\",\"kind\":\"SubjectAccessReview\","
           "\"spec\":{\"resourceAttributes\":{\"namespace\":\"default\",\"verb\":\"get\","
           "\"version\":\"v1\",\"resource\":\"pods\",\"subresource\":\"log\",\"name\":\"p1\"},"
           "\"user\":\"system:anonymous\",\"groups\":[\"system:unauthenticated\"]}}",
           "core group omitted, subresource and name, no uid/extra");
    free(s);

    struct auth_attrs nr = {.resource_request = false, .verb = "get", .path = "/healthz"};
    s = auth_sar_json(anon, &nr);
    is_str(s,
           "{\"apiVersion\":\"authorization.k8s.io/v1\",\"kind\":\"SubjectAccessReview\","
           "\"spec\":{\"nonResourceAttributes\":{\"path\":\"/healthz\",\"verb\":\"get\"},"
           "\"user\":\"system:anonymous\",\"groups\":[\"system:unauthenticated\"]}}",
           "non-resource SAR");
    free(s);
    auth_user_unref(anon);
    auth_user_unref(u);
}

static void
test_parsers(void)
{
    char err[128];
    struct auth_user *u = NULL;
    const char *b1 = "{\"status\":{\"authenticated\":true,\"user\":{\"username\":\"bob\","
                     "\"groups\":[\"system:authenticated\",\"x\"]}}}";
    is_int(auth_token_review_parse(b1, strlen(b1), &u, err, sizeof(err)), 0, "authenticated");
    ok(u && u->ngroups == 2 && u->from_token, "system:authenticated not added twice");
    if (u)
        is_str(u->uid, "", "no uid is \"\"");
    auth_user_unref(u);

    const char *b2 = "{\"status\":{\"authenticated\":false,\"error\":\"token expired\"}}";
    is_int(auth_token_review_parse(b2, strlen(b2), &u, err, sizeof(err)), 0, "rejected parses");
    ok(u == NULL, "rejected: no user");
    is_int(auth_token_review_parse("{}", 2, &u, err, sizeof(err)), 0, "no status: rejected");
    ok(u == NULL, "no user");
    is_int(auth_token_review_parse("nope", 4, &u, err, sizeof(err)), KWC_EPARSE, "not JSON");
    const char *b3 = "{\"status\":{\"authenticated\":true,\"user\":{\"groups\":[1]}}}";
    is_int(auth_token_review_parse(b3, strlen(b3), &u, err, sizeof(err)), KWC_EPARSE,
           "groups of numbers");
    const char *b4 = "{\"status\":{\"authenticated\":\"yes\"}}";
    is_int(auth_token_review_parse(b4, strlen(b4), &u, err, sizeof(err)), KWC_EPARSE,
           "authenticated not a bool");

    enum auth_decision d;
    char *reason = NULL;
    const char *s1 = "{\"status\":{\"allowed\":true}}";
    is_int(auth_sar_parse(s1, strlen(s1), &d, &reason, err, sizeof(err)), 0, "allowed parses");
    is_int(d, AUTH_ALLOW, "allowed");
    is_str(reason, "", "no reason");
    free(reason);
    const char *s2 = "{\"status\":{\"allowed\":true,\"denied\":true,\"reason\":\"both\"}}";
    is_int(auth_sar_parse(s2, strlen(s2), &d, &reason, err, sizeof(err)), 0, "parses");
    is_int(d, AUTH_DENY, "allowed and denied: denied (webhook.go)");
    is_str(reason, "both", "reason");
    free(reason);
    const char *s3 = "{\"status\":{\"reason\":\"no opinion\"}}";
    is_int(auth_sar_parse(s3, strlen(s3), &d, &reason, err, sizeof(err)), 0, "parses");
    is_int(d, AUTH_DENY, "no opinion: denied");
    free(reason);
    is_int(auth_sar_parse("[1]", 3, &d, &reason, err, sizeof(err)), KWC_EPARSE, "not an object");
    ok(reason == NULL, "no reason on error");
}

static X509 *
mk_cert(const char *const *fields, size_t n)
{
    X509 *c = X509_new();
    X509_NAME *nm = X509_get_subject_name(c);
    for (size_t i = 0; i + 1 < n; i += 2)
        X509_NAME_add_entry_by_txt(nm, fields[i], MBSTRING_UTF8,
                                   (const unsigned char *)fields[i + 1], -1, -1, 0);
    return c;
}

static void
test_cert(void)
{
    const char *f1[] = {"O", "system:masters", "CN", "admin", "O", "dev"};
    X509 *c = mk_cert(f1, KWC_ARRAY_LEN(f1));
    struct auth_user *u = NULL;
    is_int(auth_cert_user(c, &u), 0, "a cert with a CN is a user");
    if (u) {
        is_str(u->name, "admin", "CN is the name");
        is_int(u->ngroups, 3, "O, O, system:authenticated");
        if (u->ngroups == 3) {
            is_str(u->groups[0], "system:masters", "first O");
            is_str(u->groups[1], "dev", "second O");
            is_str(u->groups[2], "system:authenticated", "authenticated group appended");
        }
        ok(!u->from_token, "not from a token");
    }
    auth_user_unref(u);
    X509_free(c);
    const char *f2[] = {"O", "dev"};
    c = mk_cert(f2, KWC_ARRAY_LEN(f2));
    is_int(auth_cert_user(c, &u), KWC_ENOTFOUND, "no CN: no user (CommonNameUserConversion)");
    X509_free(c);
}

/* A user with these groups (names copied). */
static struct auth_user *
groups_user(const char *const *groups, size_t n)
{
    struct auth_user *u = xcalloc(1, sizeof(*u));
    u->refs = 1;
    u->name = xstrdup("jane");
    u->uid = xstrdup("");
    u->groups = xcalloc(n, sizeof(char *));
    for (size_t i = 0; i < n; i++)
        u->groups[u->ngroups++] = xstrdup(groups[i]);
    return u;
}

/* An extra key holding a NUL byte is one key, whole, in the review and the
 * 403 (kube's key of Impersonate-Extra-a%00b is "a\x00b"). */
static void
test_extra_key_nul(void)
{
    struct auth_user *u = groups_user(NULL, 0);
    u->extra = xcalloc(1, sizeof(*u->extra));
    u->extra[0].key = xmalloc(4);
    memcpy(u->extra[0].key, "a\0b", 4);
    u->extra[0].keylen = 3;
    u->extra[0].values = xcalloc(1, sizeof(char *));
    u->extra[0].values[u->extra[0].nvalues++] = xstrdup("v");
    u->nextra = 1;
    struct auth_attrs at = {.resource_request = true,
                            .verb = "impersonate",
                            .group = "authentication.k8s.io",
                            .version = "v1",
                            .resource = "userextras",
                            .subresource = "a\0b",
                            .subresource_len = 3,
                            .name = "v"};
    char *j = auth_sar_json(u, &at);
    ok(strstr(j, "\"subresource\":\"a\\u0000b\"") != NULL, "SAR: the subresource whole");
    ok(strstr(j, "\"extra\":{\"a\\u0000b\":[\"v\"]}") != NULL, "SAR: the extra key whole");
    if (!strstr(j, "a\\u0000b"))
        printf("# %s\n", j);
    free(j);
    char *st = auth_forbidden_status("x", &at, "");
    ok(strstr(st, "userextras/a\\\\x00b") != NULL, "403: the key whole, as Go's %q writes it");
    if (!strstr(st, "x00b"))
        printf("# %s\n", st);
    free(st);
    struct auth_attrs cut = at;
    cut.subresource = "a";
    cut.subresource_len = 1;
    size_t l1, l2;
    char *k1 = auth_question_bytes(u, &at, &l1), *k2 = auth_question_bytes(u, &cut, &l2);
    ok(l1 != l2 || memcmp(k1, k2, l1) != 0, "a key cut at its NUL is another question");
    free(k1);
    free(k2);
    auth_user_unref(u);
}

/* ---- more of kube's cases ---- */

static void
test_bearer_more(void)
{
    bearer_case("Bearer: token", NULL);               /* parts[0] is "Bearer:" */
    bearer_case("\tBearer token", "token");           /* TrimSpace: a leading tab */
    bearer_case("\vBearer token\f", "token");         /* \v and \f are spaces too */
    bearer_case("Bearer token\xC2\x85", "token");     /* U+0085 (NEL) is unicode.IsSpace */
    bearer_case("Bearer token\xE2\x80\xA8", "token"); /* U+2028 */
    bearer_case("Bearer token\xE2\x80\x8B", "token\xE2\x80\x8B"); /* U+200B is not */
    bearer_case("Bearer \xC2\xA0token", "\xC2\xA0token");         /* split on ASCII space only */
    bearer_case("Bearer token\xff", "token\xff");                 /* bytes kept as they are */
    bearer_case("Bearer token\xE2\x80", "token\xE2\x80");         /* a cut sequence is no space */
    bearer_case("Bearer a b c", "a");                             /* SplitN(auth, " ", 3) */
    bearer_case("bearer\xC2\xA0token", NULL);                     /* one field: no token */
    bearer_case(" ", NULL);
    bearer_case("\xE3\x80\x80", NULL); /* all white space */
}

static void
test_forbidden_kube(void)
{
    /* responsewriters/errors_test.go TestForbidden, user "NAME" */
    struct auth_attrs path = {.resource_request = false, .verb = "GET", .path = "/whatever"};
    forbidden_case("NAME", &path, "",
                   ST_HEAD "\"message\":\"forbidden: User \\\"NAME\\\" cannot GET path "
                           "\\\"/whatever\\\"\",\"reason\":\"Forbidden\",\"details\":{},"
                           "\"code\":403}",
                   "kube: a path");
    struct auth_attrs script = {.resource_request = false, .verb = "GET", .path = "/<script>"};
    forbidden_case("NAME", &script, "",
                   ST_HEAD "\"message\":\"forbidden: User \\\"NAME\\\" cannot GET path "
                           "\\\"/\\u0026lt;script\\u0026gt;\\\"\",\"reason\":\"Forbidden\","
                           "\"details\":{},\"code\":403}",
                   "kube: a path sanitized");
    struct auth_attrs pod = {.resource_request = true, .verb = "get", .resource = "pod"};
    forbidden_case("NAME", &pod, "",
                   ST_HEAD "\"message\":\"pod is forbidden: User \\\"NAME\\\" cannot get "
                           "resource \\\"pod\\\" in API group \\\"\\\" at the cluster scope\","
                           "\"reason\":\"Forbidden\",\"details\":{\"kind\":\"pod\"},"
                           "\"code\":403}",
                   "kube: a resource without a group");
    struct auth_attrs podv2 = {
        .resource_request = true, .verb = "get", .resource = "pod", .group = "v2"};
    forbidden_case("NAME", &podv2, "",
                   ST_HEAD "\"message\":\"pod.v2 is forbidden: User \\\"NAME\\\" cannot get "
                           "resource \\\"pod\\\" in API group \\\"v2\\\" at the cluster scope\","
                           "\"reason\":\"Forbidden\",\"details\":{\"group\":\"v2\",\"kind\":"
                           "\"pod\"},\"code\":403}",
                   "kube: a resource in a group");
    struct auth_attrs quota = {.resource_request = true,
                               .verb = "get",
                               .namespace_ = "test",
                               .resource = "pod",
                               .group = "v2",
                               .subresource = "quota",
                               .name = "mypod"};
    forbidden_case("NAME", &quota, "",
                   ST_HEAD "\"message\":\"pod.v2 \\\"mypod\\\" is forbidden: User \\\"NAME\\\" "
                           "cannot get resource \\\"pod/quota\\\" in API group \\\"v2\\\" in the "
                           "namespace \\\"test\\\"\",\"reason\":\"Forbidden\",\"details\":{"
                           "\"name\":\"mypod\",\"group\":\"v2\",\"kind\":\"pod\"},\"code\":403}",
                   "kube: a named subresource in a namespace");

    /* forbiddenMessage: no user is the name "" */
    forbidden_case(NULL, &path, NULL,
                   ST_HEAD "\"message\":\"forbidden: User \\\"\\\" cannot GET path "
                           "\\\"/whatever\\\"\",\"reason\":\"Forbidden\",\"details\":{},"
                           "\"code\":403}",
                   "no user: User \"\"");
    /* a non-resource request's group, resource and name are not read */
    struct auth_attrs mixed = {.resource_request = false,
                               .verb = "get",
                               .path = "/api",
                               .resource = "pods",
                               .group = "apps",
                               .name = "x"};
    forbidden_case("u", &mixed, "",
                   ST_HEAD "\"message\":\"forbidden: User \\\"u\\\" cannot get path "
                           "\\\"/api\\\"\",\"reason\":\"Forbidden\",\"details\":{},"
                           "\"code\":403}",
                   "non-resource: no resource in the message or the details");
    /* a name with invalid UTF-8: %q writes \xff in the message, the
     * details carry it as U+FFFD (Go's encoder writes \ufffd) */
    struct auth_attrs bad = {.resource_request = true,
                             .verb = "get",
                             .resource = "pods",
                             .namespace_ = "ns",
                             .name = "a\xff"};
    char *s = auth_forbidden_status("u", &bad, "");
    ok(strstr(s, "pods \\\"a\\\\xff\\\" is forbidden") != NULL, "the name as %q in the message");
    ok(strstr(s, "\"details\":{\"name\":\"a\\ufffd\",\"kind\":\"pods\"}") != NULL,
       "the name as U+FFFD in the details");
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    ok(j != NULL, "valid JSON");
    json_decref(j);
    free(s);
}

static void
test_anonymous_user(void)
{
    struct auth_user *u = auth_anonymous_user();
    is_str(u->name, "system:anonymous", "system:anonymous");
    is_str(u->uid, "", "no uid");
    is_int(u->ngroups, 1, "one group");
    is_str(u->groups[0], "system:unauthenticated", "system:unauthenticated");
    is_int(u->nextra, 0, "no extra");
    ok(!u->from_token, "not from a token");
    ok(auth_user_is_anonymous(u), "kube's isAnonymousUser: the anonymous user");
    free(u->name);
    u->name = xstrdup("alice"); /* any name in system:unauthenticated */
    ok(auth_user_is_anonymous(u), "isAnonymousUser: a user in system:unauthenticated");
    free(u->groups[0]);
    u->groups[0] = xstrdup("system:authenticated");
    ok(!auth_user_is_anonymous(u), "isAnonymousUser: an authenticated user is not");
    free(u->name);
    u->name = xstrdup("system:anonymous");
    ok(auth_user_is_anonymous(u), "isAnonymousUser: system:anonymous whatever its groups");
    is_int(u->refs, 1, "one reference");
    auth_user_ref(u);
    is_int(u->refs, 2, "ref");
    auth_user_unref(u);
    is_int(u->refs, 1, "unref");
    auth_user_unref(u);
    auth_user_unref(NULL);
    ok(1, "unref accepts NULL");
}

static void
test_cert_more(void)
{
    struct auth_user *u = NULL;
    is_int(auth_cert_user(NULL, &u), KWC_ENOTFOUND, "no certificate: no user");
    ok(u == NULL, "no user out");

    const char *two[] = {"CN", "first", "O", "g", "CN", "second"};
    X509 *c = mk_cert(two, KWC_ARRAY_LEN(two));
    is_int(auth_cert_user(c, &u), 0, "two CNs");
    if (u) {
        is_str(u->name, "second", "the last CN wins (pkix FillFromRDNSequence)");
        is_str(u->uid, "", "no uid");
    }
    auth_user_unref(u);
    X509_free(c);

    const char *empty[] = {"CN", "", "O", "g"};
    c = mk_cert(empty, KWC_ARRAY_LEN(empty));
    is_int(auth_cert_user(c, &u), KWC_ENOTFOUND, "an empty CN: no user");
    X509_free(c);

    /* group.AuthenticatedGroupAdder leaves system:anonymous alone, and a user
     * already in system:authenticated or system:unauthenticated */
    const char *anon[] = {"CN", "system:anonymous", "O", "x"};
    c = mk_cert(anon, KWC_ARRAY_LEN(anon));
    is_int(auth_cert_user(c, &u), 0, "CN system:anonymous");
    if (u) {
        is_int(u->ngroups, 1, "system:anonymous: no group added");
        is_str(u->groups[0], "x", "its O only");
    }
    auth_user_unref(u);
    X509_free(c);
    const char *unauth[] = {"CN", "bob", "O", "system:unauthenticated"};
    c = mk_cert(unauth, KWC_ARRAY_LEN(unauth));
    is_int(auth_cert_user(c, &u), 0, "O system:unauthenticated");
    if (u)
        is_int(u->ngroups, 1, "in system:unauthenticated: no group added");
    auth_user_unref(u);
    X509_free(c);
}

static void
test_token_review_json_more(void)
{
    size_t n;
    char *s = auth_token_review_json("a\0b\x1f\x7f\xC3\xA9", 7, &n);
    is_mem(s, n,
           "{\"apiVersion\":\"authentication.k8s.io/v1\",\"kind\":\"TokenReview\","
           "\"spec\":{\"token\":\"a\\u0000b\\u001f\x7f\xC3\xA9\"}}",
           strlen("{\"apiVersion\":\"authentication.k8s.io/v1\",\"kind\":\"TokenReview\","
                  "\"spec\":{\"token\":\"a\\u0000b\\u001f\x7f\xC3\xA9\"}}"),
           "NUL and control bytes escaped, DEL and UTF-8 kept");
    free(s);
    s = auth_token_review_json("", 0, &n);
    is_str(s,
           "{\"apiVersion\":\"authentication.k8s.io/v1\",\"kind\":\"TokenReview\","
           "\"spec\":{\"token\":\"\"}}",
           "an empty token");
    free(s);
}

static void
test_token_review_parse_more(void)
{
    char err[128];
    struct auth_user *u = NULL;
    const char *b1 = "{\"status\":{\"authenticated\":true,\"user\":{\"username\":\"sa\","
                     "\"uid\":\"u-1\",\"groups\":null,\"extra\":{\"k\":[\"v1\",\"v2\"],"
                     "\"n\":null}}}}";
    is_int(auth_token_review_parse(b1, strlen(b1), &u, err, sizeof(err)), 0, "parses");
    if (u) {
        is_str(u->name, "sa", "username");
        is_str(u->uid, "u-1", "uid");
        is_int(u->ngroups, 1, "groups null: only the group adder's");
        is_str(u->groups[0], "system:authenticated", "system:authenticated");
        is_int(u->nextra, 2, "two extra keys");
        if (u->nextra == 2) {
            is_str(u->extra[0].key, "k", "key k");
            is_int(u->extra[0].keylen, 1, "its length");
            is_int(u->extra[0].nvalues, 2, "two values");
            is_str(u->extra[0].values[1], "v2", "in order");
            is_str(u->extra[1].key, "n", "key n");
            is_int(u->extra[1].nvalues, 0, "null: no values");
        }
        ok(u->from_token, "from a token");
    }
    auth_user_unref(u);

    const char *anon = "{\"status\":{\"authenticated\":true,\"user\":{\"username\":"
                       "\"system:anonymous\"}}}";
    is_int(auth_token_review_parse(anon, strlen(anon), &u, err, sizeof(err)), 0, "parses");
    ok(u && u->ngroups == 0, "system:anonymous: no group added");
    auth_user_unref(u);

    const char *bad[] = {
        "[]",
        "{\"status\":[]}",
        "{\"status\":{\"authenticated\":1}}",
        "{\"status\":{\"authenticated\":true,\"user\":[]}}",
        "{\"status\":{\"authenticated\":true,\"user\":{\"username\":1}}}",
        "{\"status\":{\"authenticated\":true,\"user\":{\"uid\":false}}}",
        "{\"status\":{\"authenticated\":true,\"user\":{\"groups\":\"g\"}}}",
        "{\"status\":{\"authenticated\":true,\"user\":{\"extra\":[]}}}",
        "{\"status\":{\"authenticated\":true,\"user\":{\"extra\":{\"k\":\"v\"}}}}",
        "{\"status\":{\"authenticated\":true,\"user\":{\"extra\":{\"k\":[1]}}}}",
        "{\"status\":{\"authenticated\":true}",
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad); i++) {
        u = NULL;
        char what[160];
        snprintf(what, sizeof(what), "KWC_EPARSE: %s", bad[i]);
        err[0] = '\0';
        is_int(auth_token_review_parse(bad[i], strlen(bad[i]), &u, err, sizeof(err)), KWC_EPARSE,
               what);
        ok(u == NULL && strncmp(err, "TokenReview: ", 13) == 0, "no user, a message");
    }
    /* a body is read to its length, not to a NUL */
    const char *cut = "{\"status\":{\"authenticated\":false}}garbage";
    is_int(auth_token_review_parse(cut, 34, &u, err, sizeof(err)), 0, "read to its length");
    ok(u == NULL, "rejected");
}

static void
test_sar_parse_more(void)
{
    char err[128];
    enum auth_decision d;
    char *reason = NULL;
    const char *denied = "{\"status\":{\"denied\":true,\"reason\":\"nope\"}}";
    is_int(auth_sar_parse(denied, strlen(denied), &d, &reason, err, sizeof(err)), 0, "parses");
    is_int(d, AUTH_DENY, "denied");
    is_str(reason, "nope", "its reason");
    free(reason);
    const char *no = "{\"status\":{\"allowed\":false}}";
    is_int(auth_sar_parse(no, strlen(no), &d, &reason, err, sizeof(err)), 0, "parses");
    is_int(d, AUTH_DENY, "allowed false: denied");
    free(reason);

    /* the upstream echoes the spec: an extra key holding a NUL (\u0000)
     * must not make the answer unreadable; an escaped backslash before
     * "u0000" is no escape */
    const char *echo = "{\"spec\":{\"extra\":{\"a\\u0000b\":[\"v\"]}},\"status\":{\"allowed\":"
                       "true,\"reason\":\"x\\\\u0000\"}}";
    is_int(auth_sar_parse(echo, strlen(echo), &d, &reason, err, sizeof(err)), 0,
           "a NUL in an echoed extra key");
    is_int(d, AUTH_ALLOW, "allowed");
    is_str(reason, "x\\u0000", "the escaped backslash left alone");
    free(reason);
    const char *nulreason = "{\"status\":{\"allowed\":true,\"reason\":\"a\\u0000b\"}}";
    is_int(auth_sar_parse(nulreason, strlen(nulreason), &d, &reason, err, sizeof(err)), 0,
           "a NUL in the reason");
    is_str(reason, "a", "read as a C string");
    free(reason);

    const char *bad[] = {
        "",
        "{\"status\":1}",
        "{\"status\":{\"allowed\":\"true\"}}",
        "{\"status\":{\"denied\":0}}",
        "{\"status\":{\"allowed\":true,\"reason\":7}}",
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad); i++) {
        char what[160];
        snprintf(what, sizeof(what), "KWC_EPARSE: [%s]", bad[i]);
        reason = NULL;
        err[0] = '\0';
        is_int(auth_sar_parse(bad[i], strlen(bad[i]), &d, &reason, err, sizeof(err)), KWC_EPARSE,
               what);
        ok(reason == NULL && strncmp(err, "SubjectAccessReview: ", 21) == 0,
           "no reason, a message");
    }
}

static void
test_sar_json_more(void)
{
    /* no user: only the attributes */
    struct auth_attrs at = {.resource_request = true, .verb = "list", .resource = "nodes"};
    char *s = auth_sar_json(NULL, &at);
    is_str(s,
           "{\"apiVersion\":\"authorization.k8s.io/v1\",\"kind\":\"SubjectAccessReview\","
           "\"spec\":{\"resourceAttributes\":{\"verb\":\"list\",\"resource\":\"nodes\"}}}",
           "no user");
    free(s);
    /* invalid UTF-8 becomes U+FFFD as Go's encoder writes it; groups in
     * their order, "" kept (it is an element, not an omitted field) */
    const char *g[] = {"z", "", "a\xff"};
    struct auth_user *u = groups_user(g, 3);
    free(u->name);
    u->name = xstrdup("j\xc3");
    struct auth_attrs nr = {.resource_request = false, .verb = "post", .path = "/x\xfe"};
    s = auth_sar_json(u, &nr);
    is_str(s,
           "{\"apiVersion\":\"authorization.k8s.io/v1\",\"kind\":\"SubjectAccessReview\","
           "\"spec\":{\"nonResourceAttributes\":{\"path\":\"/x\xEF\xBF\xBD\",\"verb\":\"post\"},"
           "\"user\":\"j\xEF\xBF\xBD\",\"groups\":[\"z\",\"\",\"a\xEF\xBF\xBD\"]}}",
           "invalid UTF-8 as U+FFFD, groups in order");
    free(s);
    auth_user_unref(u);
}

/* The key bytes of a question, pinned: a change to the encoding is a
 * change to every cache key. */
static void
test_question_bytes(void)
{
    const char *g[] = {"a"};
    struct auth_user *u = groups_user(g, 1);
    struct auth_attrs at = {.resource_request = true,
                            .verb = "get",
                            .version = "v1",
                            .resource = "pods",
                            .namespace_ = "default",
                            .name = "p1"};
    size_t n;
    char *b = auth_question_bytes(u, &at, &n);
    const char *want = "R7:default3:get0:2:v14:pods0:2:p1U4:jane0:1;1:a0;";
    is_mem(b, n, want, strlen(want), "a resource question");
    free(b);
    struct auth_attrs nr = {.resource_request = false, .verb = "get", .path = "/healthz"};
    b = auth_question_bytes(NULL, &nr, &n);
    is_mem(b, n, "N8:/healthz3:get-", 17, "a non-resource question without a user");
    free(b);

    /* extra keys in any order are one question (the spec sorts them) */
    struct auth_user *x = groups_user(NULL, 0), *y = groups_user(NULL, 0);
    const char *keys[] = {"b", "a", "ab"};
    for (int k = 0; k < 2; k++) {
        struct auth_user *v = k ? y : x;
        v->extra = xcalloc(3, sizeof(*v->extra));
        for (int i = 0; i < 3; i++) {
            const char *key = keys[k ? 2 - i : i];
            struct auth_extra *e = &v->extra[v->nextra++];
            e->key = xstrdup(key);
            e->keylen = strlen(key);
            e->values = xcalloc(1, sizeof(char *));
            e->values[e->nvalues++] = xstrdup("v");
        }
    }
    size_t lx, ly;
    char *kx = auth_question_bytes(x, &at, &lx), *ky = auth_question_bytes(y, &at, &ly);
    is_mem(kx, lx, ky, ly, "extra keys in another order: the same bytes");
    ok(strstr(kx, "U4:jane0:0;3;1:a1;1:v2:ab1;1:v1:b1;1:v") != NULL,
       "sorted bytewise, a prefix first");
    free(kx);
    free(ky);
    /* the uid, a group, the verb: each field is part of the key */
    struct auth_attrs other = at;
    other.verb = "list";
    char *k1 = auth_question_bytes(u, &at, &lx), *k2 = auth_question_bytes(u, &other, &ly);
    ok(lx != ly || memcmp(k1, k2, lx) != 0, "another verb, other bytes");
    free(k2);
    free(u->uid);
    u->uid = xstrdup("1");
    k2 = auth_question_bytes(u, &at, &ly);
    ok(lx != ly || memcmp(k1, k2, lx) != 0, "another uid, other bytes");
    free(k1);
    free(k2);
    auth_user_unref(x);
    auth_user_unref(y);
    auth_user_unref(u);
}

/* The pair of questions whose keys collided while counts were bare numbers
 * (see auth_test's test_question_key_collision for the cache). */
static void
test_question_bytes_collision(void)
{
    char big[111];
    snprintf(big, sizeof(big), "0123456789");
    for (int i = 0; i < 10; i++)
        strcat(big, "8:abcdefgh");
    const char *one[] = {big};
    const char *eleven[] = {"0123456789", "abcdefgh", "abcdefgh", "abcdefgh",
                            "abcdefgh",   "abcdefgh", "abcdefgh", "abcdefgh",
                            "abcdefgh",   "abcdefgh", "abcdefgh"};
    struct auth_user *a = groups_user(one, 1), *b = groups_user(eleven, 11);
    struct auth_attrs at = {.resource_request = true,
                            .verb = "get",
                            .version = "v1",
                            .resource = "secrets",
                            .namespace_ = "default"};
    size_t la, lb;
    char *ka = auth_question_bytes(a, &at, &la), *kb = auth_question_bytes(b, &at, &lb);
    ok(la != lb || memcmp(ka, kb, la) != 0, "the two questions' key bytes differ");
    free(ka);
    free(kb);
    auth_user_unref(a);
    auth_user_unref(b);
}

/* webhook.go shouldCache: the controlled attributes under 10000 bytes. */
static void
test_question_cacheable(void)
{
    static char name[10001];
    /* verb "get" (3) + version "v1" (2) + resource "pods" (4) + namespace
     * "ns" (2) + subresource "log" (3) = 14 */
    memset(name, 'n', 10000 - 14 - 1);
    name[10000 - 14 - 1] = '\0';
    struct auth_attrs at = {.resource_request = true,
                            .verb = "get",
                            .version = "v1",
                            .resource = "pods",
                            .subresource = "log",
                            .namespace_ = "ns",
                            .name = name};
    ok(auth_question_cacheable(&at), "9999 bytes: cached");
    name[10000 - 14 - 1] = 'n';
    name[10000 - 14] = '\0';
    ok(!auth_question_cacheable(&at), "10000 bytes: not cached");
    at.name = "p";
    at.path = name; /* the path counts too */
    ok(!auth_question_cacheable(&at), "the path counts");
    at.path = NULL;
    at.subresource = "a\0b";
    at.subresource_len = 3;
    ok(auth_question_cacheable(&at), "a short question");
    static char sub[10000];
    memset(sub, 0, sizeof(sub));
    at.subresource = sub;
    at.subresource_len = sizeof(sub);
    ok(!auth_question_cacheable(&at), "a subresource counts by its length, NUL bytes and all");
}

int
main(void)
{
    TAP_RUN(test_bearer);
    TAP_RUN(test_bearer_more);
    TAP_RUN(test_forbidden);
    TAP_RUN(test_forbidden_kube);
    TAP_RUN(test_token_review_json);
    TAP_RUN(test_token_review_json_more);
    TAP_RUN(test_sar_json);
    TAP_RUN(test_sar_json_more);
    TAP_RUN(test_parsers);
    TAP_RUN(test_token_review_parse_more);
    TAP_RUN(test_sar_parse_more);
    TAP_RUN(test_cert);
    TAP_RUN(test_cert_more);
    TAP_RUN(test_anonymous_user);
    TAP_RUN(test_question_bytes);
    TAP_RUN(test_question_bytes_collision);
    TAP_RUN(test_question_cacheable);
    TAP_RUN(test_extra_key_nul);
    return tap_done();
}
