/*
 * route_test.c — proxy/serve/route.c: request target -> struct route_req.
 *
 * The expected values are what kube-apiserver's RequestInfoFactory.NewRequestInfo
 * (k8s.io/apiserver/pkg/endpoints/request/requestinfo.go) assigns to the same
 * method and URL, worked out from that function and the cases of its
 * requestinfo_test.go: Go decodes req.URL.Path before splitting it on '/', a
 * "watch"/"proxy" segment after the version is a special verb, "namespaces/X/Y"
 * is a namespaced resource unless Y is status or finalize, a GET without a name
 * is a list or (with ?watch not "0"/"false" in any case) a watch, and a DELETE
 * without a name is a deletecollection. Query values are decoded like Go's
 * url.ParseQuery ('+' is a space, the first of repeated keys wins). Where kube
 * says Namespace "" kwc says NULL (route.h: "NULL when cluster-wide").
 */
#include "kwc/route.h"

#include "kwc/base.h"
#include "tap.h"

#include <stdlib.h>
#include <string.h>

struct rcase {
    const char *method, *target;
    const char *verb; /* NULL: not a resource request */
    const char *group, *version, *resource, *ns, *name, *sub;
    bool legacy_watch;
};

/* clang-format off */
static const struct rcase cases[] = {
    /* method, target, verb, group, version, resource, namespace, name, subresource, legacy_watch */
    {"GET",    "/api/v1/pods",                                 "list",  "", "v1", "pods", NULL, NULL, NULL, false},
    {"HEAD",   "/api/v1/pods",                                 "list",  "", "v1", "pods", NULL, NULL, NULL, false},
    {"GET",    "/api/v1/pods/",                                "list",  "", "v1", "pods", NULL, NULL, NULL, false},
    {"GET",    "/api/v1/namespaces/ns/pods",                   "list",  "", "v1", "pods", "ns", NULL, NULL, false},

    /* ?watch= follows Convert_Slice_string_To_bool: only "0" and "false" (any case) are false. */
    {"GET",    "/api/v1/pods?watch=true",                      "watch", "", "v1", "pods", NULL, NULL, NULL, false},
    {"GET",    "/api/v1/pods?watch=1",                         "watch", "", "v1", "pods", NULL, NULL, NULL, false},
    {"GET",    "/api/v1/pods?watch=True",                      "watch", "", "v1", "pods", NULL, NULL, NULL, false},
    {"GET",    "/api/v1/pods?watch=yes",                       "watch", "", "v1", "pods", NULL, NULL, NULL, false},
    {"GET",    "/api/v1/pods?watch=",                          "watch", "", "v1", "pods", NULL, NULL, NULL, false},
    {"GET",    "/api/v1/pods?watch",                           "watch", "", "v1", "pods", NULL, NULL, NULL, false},
    {"GET",    "/api/v1/pods?watch=0",                         "list",  "", "v1", "pods", NULL, NULL, NULL, false},
    {"GET",    "/api/v1/pods?watch=false",                     "list",  "", "v1", "pods", NULL, NULL, NULL, false},
    {"GET",    "/api/v1/pods?watch=FALSE",                     "list",  "", "v1", "pods", NULL, NULL, NULL, false},
    {"GET",    "/api/v1/pods?watch=fAlSe",                     "list",  "", "v1", "pods", NULL, NULL, NULL, false},
    {"GET",    "/api/v1/pods?watch=0&watch=1",                 "list",  "", "v1", "pods", NULL, NULL, NULL, false},
    {"GET",    "/api/v1/pods?watch=1&watch=0",                 "watch", "", "v1", "pods", NULL, NULL, NULL, false},
    {"GET",    "/api/v1/pods?watch=%30",                       "list",  "", "v1", "pods", NULL, NULL, NULL, false},
    {"GET",    "/api/v1/namespaces/ns/pods?watch=1",           "watch", "", "v1", "pods", "ns", NULL, NULL, false},
    /* ?watch only turns a nameless get into a watch. */
    {"GET",    "/api/v1/namespaces/ns/pods/name?watch=true",   "get",   "", "v1", "pods", "ns", "name", NULL, false},
    {"POST",   "/api/v1/namespaces/ns/pods?watch=true",        "create", "", "v1", "pods", "ns", NULL, NULL, false},

    /* get and subresources */
    {"GET",    "/api/v1/namespaces/ns/pods/name",              "get",   "", "v1", "pods", "ns", "name", NULL, false},
    {"HEAD",   "/api/v1/namespaces/ns/pods/name",              "get",   "", "v1", "pods", "ns", "name", NULL, false},
    {"GET",    "/api/v1/namespaces/ns/pods/name/status",       "get",   "", "v1", "pods", "ns", "name", "status", false},
    {"GET",    "/api/v1/namespaces/ns/pods/name/exec",         "get",   "", "v1", "pods", "ns", "name", "exec", false},
    {"POST",   "/api/v1/namespaces/ns/pods/name/exec",         "create", "", "v1", "pods", "ns", "name", "exec", false},
    {"GET",    "/api/v1/namespaces/ns/pods/name/log",          "get",   "", "v1", "pods", "ns", "name", "log", false},
    {"GET",    "/api/v1/namespaces/ns/pods/name/proxy/a/b",    "get",   "", "v1", "pods", "ns", "name", "proxy", false},
    {"GET",    "/api/v1/nodes/n1",                             "get",   "", "v1", "nodes", NULL, "n1", NULL, false},
    {"GET",    "/api/v1/nodes/n1/status",                      "get",   "", "v1", "nodes", NULL, "n1", "status", false},

    /* namespaces: "namespaces/X" is the namespace object X, and kube sets Namespace X too */
    {"GET",    "/api/v1/namespaces",                           "list",  "", "v1", "namespaces", NULL, NULL, NULL, false},
    {"GET",    "/api/v1/namespaces?watch=1",                   "watch", "", "v1", "namespaces", NULL, NULL, NULL, false},
    {"GET",    "/api/v1/namespaces/foo",                       "get",   "", "v1", "namespaces", "foo", "foo", NULL, false},
    {"DELETE", "/api/v1/namespaces/foo",                       "delete", "", "v1", "namespaces", "foo", "foo", NULL, false},
    {"GET",    "/api/v1/namespaces/foo/status",                "get",   "", "v1", "namespaces", "foo", "foo", "status", false},
    {"PUT",    "/api/v1/namespaces/foo/status",                "update", "", "v1", "namespaces", "foo", "foo", "status", false},
    {"PUT",    "/api/v1/namespaces/foo/finalize",              "update", "", "v1", "namespaces", "foo", "foo", "finalize", false},
    /* ...except the server-side-apply create: PATCH namespaces/X has no namespace
     * (requestinfo.go: len(currentParts) == 2 && Verb == "patch" -> NamespaceNone;
     * requestinfo_test.go "/api/v1/namespaces/new-namespace"). */
    {"PATCH",  "/api/v1/namespaces/new-namespace",             "patch", "", "v1", "namespaces", NULL, "new-namespace", NULL, false},
    {"DELETE", "/api/v1/namespaces",                           "deletecollection", "", "v1", "namespaces", NULL, NULL, NULL, false},

    /* groups */
    {"GET",    "/apis/apps/v1/namespaces/ns/deployments",      "list",  "apps", "v1", "deployments", "ns", NULL, NULL, false},
    {"GET",    "/apis/apps/v1/namespaces/ns/deployments/d/scale", "get", "apps", "v1", "deployments", "ns", "d", "scale", false},
    {"GET",    "/apis/apps/v1/deployments",                    "list",  "apps", "v1", "deployments", NULL, NULL, NULL, false},
    {"GET",    "/apis/example.com/v1/widgets",                 "list",  "example.com", "v1", "widgets", NULL, NULL, NULL, false},
    {"GET",    "/apis/example.com/v1beta2/namespaces/n/widgets/w", "get", "example.com", "v1beta2", "widgets", "n", "w", NULL, false},
    {"POST",   "/apis/batch/v1/namespaces/ns/jobs",            "create", "batch", "v1", "jobs", "ns", NULL, NULL, false},

    /* legacy watch paths */
    {"GET",    "/api/v1/watch/pods",                           "watch", "", "v1", "pods", NULL, NULL, NULL, true},
    {"GET",    "/api/v1/watch/pods?watch=false",               "watch", "", "v1", "pods", NULL, NULL, NULL, true},
    {"GET",    "/api/v1/watch/namespaces/ns/pods",             "watch", "", "v1", "pods", "ns", NULL, NULL, true},
    {"GET",    "/api/v1/watch/namespaces/ns/pods/name",        "watch", "", "v1", "pods", "ns", "name", NULL, true},
    {"GET",    "/api/v1/watch/namespaces",                     "watch", "", "v1", "namespaces", NULL, NULL, NULL, true},
    {"GET",    "/api/v1/watch/namespaces/foo",                 "watch", "", "v1", "namespaces", "foo", "foo", NULL, true},
    {"GET",    "/apis/apps/v1/watch/deployments",              "watch", "apps", "v1", "deployments", NULL, NULL, NULL, true},
    {"GET",    "/apis/apps/v1/watch/namespaces/ns/deployments", "watch", "apps", "v1", "deployments", "ns", NULL, NULL, true},

    /* proxy special verb: no subresource, the rest is a path */
    {"GET",    "/api/v1/proxy/namespaces/ns/pods/p/sub/path",  "proxy", "", "v1", "pods", "ns", "p", NULL, false},

    /* verbs from methods */
    {"POST",   "/api/v1/namespaces/ns/pods",                   "create", "", "v1", "pods", "ns", NULL, NULL, false},
    {"PUT",    "/api/v1/namespaces/ns/pods/name",              "update", "", "v1", "pods", "ns", "name", NULL, false},
    {"PATCH",  "/api/v1/namespaces/ns/pods/name",              "patch", "", "v1", "pods", "ns", "name", NULL, false},
    {"DELETE", "/api/v1/namespaces/ns/pods/name",              "delete", "", "v1", "pods", "ns", "name", NULL, false},
    {"DELETE", "/api/v1/namespaces/ns/pods",                   "deletecollection", "", "v1", "pods", "ns", NULL, NULL, false},
    {"DELETE", "/api/v1/nodes",                                "deletecollection", "", "v1", "nodes", NULL, NULL, NULL, false},
    {"DELETE", "/apis/apps/v1/namespaces/ns/deployments",      "deletecollection", "apps", "v1", "deployments", "ns", NULL, NULL, false},

    /* the path is decoded before it is split (Go's req.URL.Path) */
    {"GET",    "/api/v1/namespaces/ns/configmaps/a%20b",       "get",   "", "v1", "configmaps", "ns", "a b", NULL, false},
    {"GET",    "/api/v1/namespaces/ns/configmaps/a+b",         "get",   "", "v1", "configmaps", "ns", "a+b", NULL, false},
    {"GET",    "/api/v1/namespaces/ns/configmaps/%61%62",      "get",   "", "v1", "configmaps", "ns", "ab", NULL, false},
    {"GET",    "/api/v1/namespaces/ns/configmaps/a%2Fstatus",  "get",   "", "v1", "configmaps", "ns", "a", "status", false},
    {"GET",    "/api/v1/namespaces/ns%2Fpods",                 "list",  "", "v1", "pods", "ns", NULL, NULL, false},
    {"GET",    "/api%2Fv1%2Fpods",                             "list",  "", "v1", "pods", NULL, NULL, NULL, false},

    /* not resource requests */
    {"GET",    "/",                                            NULL, NULL, NULL, NULL, NULL, NULL, NULL, false},
    {"GET",    "/version",                                     NULL, NULL, NULL, NULL, NULL, NULL, NULL, false},
    {"GET",    "/healthz",                                     NULL, NULL, NULL, NULL, NULL, NULL, NULL, false},
    {"GET",    "/readyz?verbose",                              NULL, NULL, NULL, NULL, NULL, NULL, NULL, false},
    {"GET",    "/api",                                         NULL, NULL, NULL, NULL, NULL, NULL, NULL, false},
    {"GET",    "/api/",                                        NULL, NULL, NULL, NULL, NULL, NULL, NULL, false},
    {"GET",    "/apis",                                        NULL, NULL, NULL, NULL, NULL, NULL, NULL, false},
    {"GET",    "/apis/apps",                                   NULL, NULL, NULL, NULL, NULL, NULL, NULL, false},
    {"GET",    "/api/v1",                                      NULL, NULL, NULL, NULL, NULL, NULL, NULL, false},
    {"GET",    "/api/v1/",                                     NULL, NULL, NULL, NULL, NULL, NULL, NULL, false},
    {"GET",    "/apis/apps/v1",                                NULL, NULL, NULL, NULL, NULL, NULL, NULL, false},
    {"GET",    "/apis/apps/v1/",                               NULL, NULL, NULL, NULL, NULL, NULL, NULL, false},
    {"GET",    "/apis/v1/pods",                                NULL, NULL, NULL, NULL, NULL, NULL, NULL, false},
    {"GET",    "/openapi/v2",                                  NULL, NULL, NULL, NULL, NULL, NULL, NULL, false},
    {"GET",    "/notapi/v1/pods",                              NULL, NULL, NULL, NULL, NULL, NULL, NULL, false},
    {"POST",   "/apis/authorization.k8s.io",                   NULL, NULL, NULL, NULL, NULL, NULL, NULL, false},
};
/* clang-format on */

static void
check_case(const struct rcase *c)
{
    struct route_req r;
    char what[256];
    int rc = route_parse(c->method, c->target, strlen(c->target), &r);
#define W(field) (snprintf(what, sizeof what, "%s %s: %s", c->method, c->target, field), what)
    is_int(rc, 0, W("parses"));
    if (rc != 0) {
        route_fini(&r);
        return;
    }
    is_int(r.is_resource, c->verb != NULL, W("is_resource"));
    if (c->verb && r.is_resource) {
        is_str(route_verb_name(r.verb), c->verb, W("verb"));
        is_str(r.group, c->group, W("group"));
        is_str(r.version, c->version, W("version"));
        is_str(r.resource, c->resource, W("resource"));
        is_str(r.namespace_, c->ns, W("namespace"));
        is_str(r.name, c->name, W("name"));
        is_str(r.subresource, c->sub, W("subresource"));
        is_int(r.legacy_watch, c->legacy_watch, W("legacy_watch"));
    }
#undef W
    route_fini(&r);
}

static void
test_table(void)
{
    for (size_t i = 0; i < KWC_ARRAY_LEN(cases); i++)
        check_case(&cases[i]);
}

/* The decoded path is kept whole (kube's RequestInfo.Path is req.URL.Path). */
static void
test_path(void)
{
    struct route_req r;
    const char *t = "/api/v1/namespaces/ns/configmaps/a%20b%2Fc?limit=5";
    is_int(route_parse("GET", t, strlen(t), &r), 0, "parses");
    is_str(r.path, "/api/v1/namespaces/ns/configmaps/a b/c", "path decoded, query dropped");
    route_fini(&r);
}

/*
 * An empty segment is kept by Go's splitPath (it trims only the ends), so in
 * "namespaces//pods" the namespace is "" and the resource is pods.
 */
static void
test_empty_segment(void)
{
    struct route_req r;
    const char *t = "/api/v1/namespaces//pods";
    is_int(route_parse("GET", t, strlen(t), &r), 0, "parses");
    ok(r.is_resource, "a resource request");
    is_str(route_verb_name(r.verb), "list", "verb list");
    is_str(r.resource, "pods", "resource pods, not namespaces");
    is_str(r.name, NULL, "no name");
    ok(r.namespace_ == NULL || r.namespace_[0] == '\0', "namespace empty");
    route_fini(&r);
}

/* ---- query parameters ---------------------------------------------------- */

static void
test_query(void)
{
    struct route_req r;
    const char *t = "/api/v1/pods?labelSelector=app%3Dx%2Ctier+in+%28a%29"
                    "&fieldSelector=spec.nodeName%3Dn1&resourceVersion=123"
                    "&resourceVersionMatch=NotOlderThan&limit=500&continue=abc%3D%3D"
                    "&timeoutSeconds=30&allowWatchBookmarks=true&sendInitialEvents=1"
                    "&watch=1&unknown=zzz";
    is_int(route_parse("GET", t, strlen(t), &r), 0, "parses");
    is_str(r.q.label_selector, "app=x,tier in (a)", "labelSelector decoded, '+' is a space");
    is_str(r.q.field_selector, "spec.nodeName=n1", "fieldSelector");
    is_str(r.q.resource_version, "123", "resourceVersion");
    is_str(r.q.resource_version_match, "NotOlderThan", "resourceVersionMatch");
    is_str(r.q.limit, "500", "limit");
    is_str(r.q.continue_token, "abc==", "continue");
    is_str(r.q.timeout_seconds, "30", "timeoutSeconds");
    is_str(r.q.allow_watch_bookmarks, "true", "allowWatchBookmarks");
    is_str(r.q.send_initial_events, "1", "sendInitialEvents");
    is_str(r.q.watch, "1", "watch raw");
    is_str(route_verb_name(r.verb), "watch", "verb watch");
    route_fini(&r);

    t = "/api/v1/pods";
    is_int(route_parse("GET", t, strlen(t), &r), 0, "no query parses");
    ok(!r.q.resource_version && !r.q.resource_version_match && !r.q.limit && !r.q.continue_token &&
           !r.q.label_selector && !r.q.field_selector && !r.q.timeout_seconds && !r.q.watch &&
           !r.q.allow_watch_bookmarks && !r.q.send_initial_events,
       "absent parameters are NULL");
    route_fini(&r);

    t = "/api/v1/pods?";
    is_int(route_parse("GET", t, strlen(t), &r), 0, "empty query parses");
    is_str(r.q.watch, NULL, "empty query: no watch");
    is_str(route_verb_name(r.verb), "list", "empty query: list");
    route_fini(&r);

    /* url.Values.Get: the first value wins. */
    t = "/api/v1/pods?limit=1&limit=2&labelSelector=a&labelSelector=b";
    is_int(route_parse("GET", t, strlen(t), &r), 0, "repeated keys parse");
    is_str(r.q.limit, "1", "first limit wins");
    is_str(r.q.label_selector, "a", "first labelSelector wins");
    route_fini(&r);

    /* A key without '=' is present with an empty value; an empty value is "". */
    t = "/api/v1/pods?resourceVersion&limit=&labelSelector";
    is_int(route_parse("GET", t, strlen(t), &r), 0, "valueless keys parse");
    is_str(r.q.resource_version, "", "key without '=' is \"\"");
    is_str(r.q.limit, "", "key= is \"\"");
    is_str(r.q.label_selector, "", "last key without '='");
    route_fini(&r);

    /* Keys are decoded too; keys are case-sensitive; empty pairs are skipped. */
    t = "/api/v1/pods?&&label%53elector=k&&LIMIT=9&resourceversion=7&fieldSelector=a%3Db=c";
    is_int(route_parse("GET", t, strlen(t), &r), 0, "odd query parses");
    is_str(r.q.label_selector, "k", "percent-encoded key");
    is_str(r.q.limit, NULL, "LIMIT is not limit");
    is_str(r.q.resource_version, NULL, "resourceversion is not resourceVersion");
    is_str(r.q.field_selector, "a=b=c", "value split at the first '='");
    route_fini(&r);

    /* A '?' in the query belongs to the value; '+' in a value is a space, %2B a plus. */
    t = "/api/v1/pods?continue=a?b&labelSelector=x%2By+z";
    is_int(route_parse("GET", t, strlen(t), &r), 0, "'?' in the query parses");
    is_str(r.q.continue_token, "a?b", "'?' kept in a value");
    is_str(r.q.label_selector, "x+y z", "%2B and '+'");
    is_str(r.path, "/api/v1/pods", "path stops at the first '?'");
    route_fini(&r);
}

/*
 * Go's url.ParseQuery, as net/http's Request.URL.Query() uses it, drops a pair
 * with a bad escape or a ';' and keeps the rest; kube-apiserver never sees them.
 */
static void
test_query_pairs_dropped_like_go(void)
{
    struct route_req r;
    const char *t = "/api/v1/pods?limit=%zz&watch=false;x&labelSelector=a%3Db&%=1&timeoutSeconds=5";
    is_int(route_parse("GET", t, strlen(t), &r), 0, "parses");
    is_str(r.q.limit, NULL, "limit=%zz dropped");
    is_str(r.q.watch, NULL, "watch=false;x dropped");
    is_str(route_verb_name(r.verb), "list", "so the request is a list");
    is_str(r.q.label_selector, "a=b", "good pair kept");
    is_str(r.q.timeout_seconds, "5", "pair after a bad key kept");
    route_fini(&r);
}

/* ---- errors and limits --------------------------------------------------- */

static void
test_errors(void)
{
    struct route_req r;
    static const char *const bad_pct[] = {
        "/api/v1/pods%",
        "/api/v1/pods%4",
        "/api/v1/pods/%zz",
    };
    char what[128];
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad_pct); i++) {
        snprintf(what, sizeof what, "%s: KWC_EPARSE", bad_pct[i]);
        is_int(route_parse("GET", bad_pct[i], strlen(bad_pct[i]), &r), KWC_EPARSE, what);
        route_fini(&r);
        ok(r.arena_ == NULL && r.path == NULL, "route_fini after failure clears");
    }

    static const char *const not_abs[] = {"", "api/v1/pods", "*", "http://h/api/v1/pods",
                                          "?watch=1"};
    for (size_t i = 0; i < KWC_ARRAY_LEN(not_abs); i++) {
        snprintf(what, sizeof what, "\"%s\": KWC_EPARSE", not_abs[i]);
        is_int(route_parse("GET", not_abs[i], strlen(not_abs[i]), &r), KWC_EPARSE, what);
        route_fini(&r);
    }

    /* Only len bytes are read: a target cut before its bad escape parses. */
    is_int(route_parse("GET", "/api/v1/pods%zz", 12, &r), 0, "len bounds the input");
    is_str(r.resource, "pods", "len bounds the input: resource");
    route_fini(&r);

    /* route_fini twice and on a zeroed struct are harmless. */
    route_fini(&r);
    route_fini(NULL);
}

static void
test_limits(void)
{
    struct route_req r;
    size_t max = ROUTE_MAX_TARGET;
    char *t = xmalloc(max + 2);

    /* Exactly the limit: a list with a long label selector. */
    const char *pre = "/api/v1/pods?labelSelector=";
    memcpy(t, pre, strlen(pre));
    memset(t + strlen(pre), 'a', max - strlen(pre));
    t[max] = 'a';
    t[max + 1] = '\0';
    is_int(route_parse("GET", t, max, &r), 0, "ROUTE_MAX_TARGET bytes accepted");
    ok(r.q.label_selector && strlen(r.q.label_selector) == max - strlen(pre),
       "long value kept whole");
    route_fini(&r);
    is_int(route_parse("GET", t, max + 1, &r), KWC_ETOOBIG, "one byte more: KWC_ETOOBIG");
    route_fini(&r);
    ok(r.arena_ == NULL, "route_fini after KWC_ETOOBIG");

    /* The worst case for the arena: every byte an empty parameter. */
    memcpy(t, "/?", 2);
    memset(t + 2, '&', max - 2);
    is_int(route_parse("GET", t, max, &r), 0, "all-'&' query parses");
    route_fini(&r);
    memset(t + 2, '=', max - 2);
    is_int(route_parse("GET", t, max, &r), 0, "all-'=' query parses");
    route_fini(&r);

    /* Very many segments: kube ignores parts after the subresource. Either kwc
     * agrees, or it declines to interpret the path (a non-resource request). */
    size_t n = 0;
    const char *head = "/api/v1/namespaces/ns/pods/p/log";
    memcpy(t, head, strlen(head));
    n = strlen(head);
    while (n + 2 <= max) {
        t[n++] = '/';
        t[n++] = 'x';
    }
    is_int(route_parse("GET", t, n, &r), 0, "deep path parses");
    ok(!r.is_resource ||
           (r.resource && strcmp(r.resource, "pods") == 0 && r.name && strcmp(r.name, "p") == 0 &&
            r.subresource && strcmp(r.subresource, "log") == 0),
       "deep path: pods/p/log or not interpreted");
    route_fini(&r);

    /* 100 segments of a few bytes, just past any fixed table. */
    n = 0;
    for (int i = 0; i < 100; i++)
        n += (size_t)snprintf(t + n, max - n, "/s%d", i);
    is_int(route_parse("GET", t, n, &r), 0, "100 segments parse");
    ok(!r.is_resource, "100 segments outside /api: not a resource");
    route_fini(&r);

    /* Only slashes. */
    memset(t, '/', max);
    is_int(route_parse("GET", t, max, &r), 0, "all slashes parse");
    ok(!r.is_resource, "all slashes: not a resource");
    route_fini(&r);
    free(t);
}

static void
test_verb_names(void)
{
    static const struct {
        enum route_verb v;
        const char *name;
    } v[] = {
        {ROUTE_GET, "get"},       {ROUTE_LIST, "list"},
        {ROUTE_WATCH, "watch"},   {ROUTE_CREATE, "create"},
        {ROUTE_UPDATE, "update"}, {ROUTE_PATCH, "patch"},
        {ROUTE_DELETE, "delete"}, {ROUTE_DELETECOLLECTION, "deletecollection"},
        {ROUTE_PROXY, "proxy"},
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(v); i++)
        is_str(route_verb_name(v[i].v), v[i].name, v[i].name);

    struct route_req r;
    const char *t = "/api/v1/namespaces/ns/pods/p";
    is_int(route_parse("OPTIONS", t, strlen(t), &r), 0, "OPTIONS parses");
    ok(r.is_resource, "OPTIONS on a resource is a resource request");
    ok(r.verb != ROUTE_GET && r.verb != ROUTE_LIST && r.verb != ROUTE_WATCH,
       "OPTIONS is not a read");
    route_fini(&r);
}

static void
test_accept_and_pretty(void)
{
    /* kube's answer for a built-in kind (protobuf) and a custom resource */
    enum { J = ROUTE_MEDIA_JSON, P = ROUTE_MEDIA_PROTOBUF, O = ROUTE_MEDIA_OTHER };
    static const struct {
        const char *accept;
        int builtin, custom;
    } a[] = {
        {NULL, J, J},
        {"", J, J},
        {"application/json", J, J},
        {"application/json, */*", J, J},
        {"APPLICATION/JSON", O, O}, /* Go compares media types exactly: kube's 406 */
        {" application/json ,application/* , */*", J, J},
        {"*/*", J, J},
        {"*", J, J},
        {"application/*", J, J},
        {"application/vnd.kubernetes.protobuf, application/json", P, J},
        {"application/vnd.kubernetes.protobuf,application/json", P, J},
        {"application/json, application/vnd.kubernetes.protobuf", J, J},
        {"application/vnd.kubernetes.protobuf", P, O},
        {"application/vnd.kubernetes.protobuf, */*", P, J},
        {"*/*, application/vnd.kubernetes.protobuf", P, J}, /* specific before wildcards */
        {"application/*, application/vnd.kubernetes.protobuf", P, J},
        {"text/html, application/vnd.kubernetes.protobuf", P, O},
        {"application/vnd.kubernetes.protobuf;stream=watch", O, O},
        {"application/json;as=Table;v=v1;g=meta.k8s.io,application/json", O, O},
        {"application/json;q=0.5, */*", O, O},
        {"application/yaml", O, O},
        {"application/json, application/yaml", J, J},
        {"application/yaml, application/json", O, O},
        {"text/html", O, O},
        {"bogus, application/json", J, J},
        {"a;b/json", O, O}, /* no clause: 406 */
        {" ", O, O},
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(a); i++) {
        const char *name = a[i].accept ? a[i].accept : "(absent)";
        is_int(route_negotiate(a[i].accept, true), a[i].builtin, name);
        is_int(route_negotiate(a[i].accept, false), a[i].custom, name);
    }

    static const struct {
        const char *target, *ua;
        bool pretty;
    } p[] = {
        {"/api/v1/pods", NULL, false},
        {"/api/v1/pods", "kubectl/v1.30.0", false},
        {"/api/v1/pods", "curl/7.88.1", true},
        {"/api/v1/pods", "Wget/1.21", true},
        {"/api/v1/pods", "Mozilla/5.0 (X11)", true},
        {"/api/v1/pods?pretty=false", "curl/7.88.1", false},
        {"/api/v1/pods?pretty=", "curl/7.88.1", true}, /* empty: the agent decides */
        {"/api/v1/pods?pretty=true", NULL, true},
        {"/api/v1/pods?pretty=1", NULL, true},
        {"/api/v1/pods?pretty=yes", NULL, false}, /* ParseBool fails: false */
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(p); i++) {
        struct route_req r;
        route_parse("GET", p[i].target, strlen(p[i].target), &r);
        char name[128];
        snprintf(name, sizeof(name), "pretty: %s UA %s", p[i].target, p[i].ua ? p[i].ua : "-");
        is_int(route_wants_pretty(&r.q, p[i].ua), p[i].pretty, name);
        route_fini(&r);
    }
}

static void
test_accept_params(void)
{
    /* kube's winning clause (negotiate.go + goautoneg), parameters included:
     * media for a built-in kind / a custom resource, the as= it asks, pretty */
    enum { J = ROUTE_MEDIA_JSON, P = ROUTE_MEDIA_PROTOBUF, O = ROUTE_MEDIA_OTHER };
    enum { N = ROUTE_AS_NONE, M = ROUTE_AS_POM, L = ROUTE_AS_POML };
#define POML ";as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
#define POM ";as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
    static const struct {
        const char *accept;
        int builtin, custom, as;
        bool pretty;
    } a[] = {
        {NULL, J, J, N, false},
        {"application/json" POML, J, J, L, false},
        {"application/json" POM, J, J, M, false},
        {"application/vnd.kubernetes.protobuf" POML, P, P, L, false},
        {"application/json;v=v1;g=meta.k8s.io;as=PartialObjectMetadata", J, J, M, false},
        {"application/json" POML ";pretty=1", J, J, L, true},
        {"application/json;pretty=1", J, J, N, true},
        {"application/json;pretty=true", J, J, N, false}, /* only "1" */
        {"application/json ; as = PartialObjectMetadataList ; g=meta.k8s.io;v=v1 ", J, J, L, false},
        {"application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1", O, O, N, false},
        {"application/json;as=Table;g=meta.k8s.io;v=v1", O, O, N, false},
        {"application/vnd.kubernetes.protobuf;as=Table;g=meta.k8s.io;v=v1, application/json", J, J,
         N, false}, /* Table has no protobuf: the next clause */
        {"application/json;as=Foo;g=x;v=v1, application/json" POM, J, J, M, false},
        {"application/json;as=PartialObjectMetadata, application/json", J, J, N, false},
        {"application/json;q=0.5" POM ", application/json" POML, J, J, L, false}, /* q orders */
        {"application/json" POM ";q=0.9, application/vnd.kubernetes.protobuf" POML, P, P, L, false},
        {"*/*" POML, J, J, L, false},
        {"application/*" POML, J, J, L, false},
        {"application/yaml" POML ", application/json", O, O, N, false},
        {"application/json" POML ";stream=watch", O, O, N, false},
        {"application/json" POML ";stream=bogus, application/json", J, J, N, false},
        {"application/json" POML ";x=y", O, O, N, false},
        {"application/json" POML ";sv=v1", O, O, N, false},
        {"application/json;charset=utf-8", O, O, N, false},
        {"application/json;as=PartialObjectMetadataList=x;g=meta.k8s.io;v=v1", O, O, N, false},
        {"application/json;g=meta.k8s.io;v=v1;as=Table;as=PartialObjectMetadataList", J, J, L,
         false}, /* a map: the last value wins */
        {"application/vnd.kubernetes.protobuf, application/json", P, J, N, false},
        {"application/vnd.kubernetes.protobuf", P, O, N, false}, /* a custom resource's 406 */
        {"text/html, application/json" POML, J, J, L, false},
        {"a/b/c" POML ", application/json", J, J, N, false},
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(a); i++) {
        const char *name = a[i].accept ? a[i].accept : "(absent)";
        struct route_accept b, c;
        route_accept(a[i].accept, true, &b);
        route_accept(a[i].accept, false, &c);
        is_int(b.media, a[i].builtin, name);
        is_int(c.media, a[i].custom, name);
        is_int(b.media == ROUTE_MEDIA_OTHER ? N : (int)b.as, a[i].as, name);
        is_int(b.pretty, a[i].pretty, name);
    }

    /* over ROUTE_ACCEPT_MAX_CLAUSES clauses Go's sort is no longer an
     * insertion sort (pdqsort: equal clauses may swap): the upstream decides,
     * even when a plain clause comes first (kube: the q=2 metadata clause) */
    {
        char many[1024] = "application/json, application/json" POML ";q=2";
        for (int i = 2; i <= ROUTE_ACCEPT_MAX_CLAUSES; i++)
            strcat(many, ", text/x-filler");
        struct route_accept b, c;
        route_accept(many, true, &b);
        route_accept(many, false, &c);
        is_int(b.media, O, "13 clauses: the upstream's");
        is_int(c.media, O, "13 clauses (a custom resource): the upstream's");
        route_accept_status(many, &b);
        is_int(b.media, O, "13 clauses, a Status: the upstream's");
        ok(!b.none, "...not none (kube may have found one)");
    }

    /* a q= value over the parser's bound is no q=0 (Go reads 0.5 in it):
     * the upstream decides */
    {
        char longq[256] = "application/vnd.kubernetes.protobuf;q=0.1, application/json;q=0.5";
        for (int i = 0; i < 80; i++)
            strcat(longq, "0");
        strcat(longq, "1");
        struct route_accept b;
        route_accept(longq, true, &b);
        is_int(b.media, O, "a q= of 83 digits: the upstream's");
    }

    /* the Status of an error: negotiated again without conversions
     * (DefaultEndpointRestrictions); none acceptable: WriteRawJSON */
    static const struct {
        const char *accept;
        int media;
        bool none, pretty;
    } st[] = {
        {NULL, J, false, false},
        {"application/json" POML, O, true, false},
        {"application/vnd.kubernetes.protobuf" POML, O, true, false},
        {"application/json" POML ", application/json", J, false, false},
        {"application/json" POML ", application/json;pretty=1", J, false, true},
        {"application/json" POML ";pretty=1", O, true, false},
        {"application/json" POML ", application/vnd.kubernetes.protobuf", P, false, false},
        {"application/json" POML ", application/yaml", O, false, false},
        /* DefaultEndpointRestrictions allows stream=watch: that clause is
         * the Status's (a parameter kwc leaves to the upstream), not none */
        {"application/json;stream=watch", O, false, false},
        {"application/json" POML ", application/json;stream=watch", O, false, false},
        {"application/yaml;stream=watch", O, true, false},
        {"application/json;stream=", J, false, false},
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(st); i++) {
        char name[200];
        snprintf(name, sizeof(name), "status: %s", st[i].accept ? st[i].accept : "(absent)");
        struct route_accept b;
        route_accept_status(st[i].accept, &b);
        is_int(b.media, st[i].media, name);
        is_int(b.none, st[i].none, name);
        is_int(b.pretty, st[i].pretty, name);
    }
#undef POM
#undef POML
}

int
main(void)
{
    TAP_RUN(test_table);
    TAP_RUN(test_path);
    TAP_RUN(test_empty_segment);
    TAP_RUN(test_query);
    TAP_RUN(test_query_pairs_dropped_like_go);
    TAP_RUN(test_errors);
    TAP_RUN(test_limits);
    TAP_RUN(test_verb_names);
    TAP_RUN(test_accept_and_pretty);
    TAP_RUN(test_accept_params);
    return tap_done();
}
