/*
 * admit_test.c — proxy/serve/admit.c: the admission decision for gets,
 * lists and watches (include/kwc/admit.h), on its own: requests parsed by
 * route_parse, caches from a table (no reflector, no store, no loop).
 *
 * Expected answers come from the Kubernetes API semantics
 * (shared/k8s-api-concepts.md: "Semantics for get and list", "Semantics for
 * watch", "410 Gone") and the README's "The cache: what is served, and from
 * where" (which encoding, what passes through), not from the code.
 */
#include "kwc/admit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"
#include "kwc/cont.h"
#include "kwc/reflector.h"
#include "kwc/route.h"
#include "kwc/selector.h"
#include "tap.h"

/* ---- the caches: a table ---- */

static const char *pod_json_fields[] = {"metadata.name", "metadata.namespace", "spec.nodeName",
                                        "status.phase"};
static const char *pod_pb_fields[] = {"metadata.name", "metadata.namespace", "spec.nodeName"};
static const char *meta_fields[] = {"metadata.name", "metadata.namespace"};

struct tcache {
    struct refl_desc d;
    bool started, serving;
    uint64_t rv, floor;
};

#define CUR 100  /* every cache's rv */
#define FLOOR 50 /* ...and its history floor */

enum {
    C_PODS,       /* v1/pods JSON, serving */
    C_PODS_PB,    /* v1/pods protobuf, serving */
    C_NODES,      /* v1/nodes JSON, cluster-scoped, serving */
    C_CM,         /* v1/configmaps JSON, serving */
    C_CM_PB,      /* v1/configmaps protobuf, not started (started by a request) */
    C_SECRETS,    /* v1/secrets JSON, out of service */
    C_SECRETS_PB, /* v1/secrets protobuf, started, not discovered yet */
    C_WIDGETS,    /* example.com/v1/widgets JSON (a custom resource), serving */
    C_N
};

static struct tcache caches[C_N];
static int rv_calls, rv_last;

static struct refl_desc
desc(const char *g, const char *v, const char *res, enum kwc_enc enc, const char *kind,
     bool namespaced, const char **fields, size_t nf)
{
    struct refl_desc d = {.enc = enc,
                          .kind = kind ? xstrdup(kind) : NULL,
                          .namespaced = namespaced,
                          .field_names = fields,
                          .n_fields = nf,
                          .index_field = -1};
    d.group = xstrdup(g);
    d.version = xstrdup(v);
    d.resource = xstrdup(res);
    d.path = g[0] ? xasprintf("/apis/%s/%s/%s", g, v, res) : xasprintf("/api/%s/%s", v, res);
    d.typed_items = g[0] != '\0';
    return d;
}

static void
caches_init(void)
{
    caches[C_PODS].d = desc("", "v1", "pods", KWC_ENC_JSON, "Pod", true, pod_json_fields, 4);
    caches[C_PODS_PB].d = desc("", "v1", "pods", KWC_ENC_PB, "Pod", true, pod_pb_fields, 3);
    caches[C_NODES].d = desc("", "v1", "nodes", KWC_ENC_JSON, "Node", false, meta_fields, 1);
    caches[C_CM].d = desc("", "v1", "configmaps", KWC_ENC_JSON, "ConfigMap", true, meta_fields, 2);
    caches[C_CM_PB].d = desc("", "v1", "configmaps", KWC_ENC_PB, NULL, false, meta_fields, 2);
    caches[C_SECRETS].d = desc("", "v1", "secrets", KWC_ENC_JSON, "Secret", true, meta_fields, 2);
    caches[C_SECRETS_PB].d = desc("", "v1", "secrets", KWC_ENC_PB, NULL, false, meta_fields, 2);
    caches[C_WIDGETS].d =
        desc("example.com", "v1", "widgets", KWC_ENC_JSON, "Widget", true, meta_fields, 2);
    for (int i = 0; i < C_N; i++) {
        caches[i].started = i != C_CM_PB;
        caches[i].serving = i != C_CM_PB && i != C_SECRETS && i != C_SECRETS_PB;
        caches[i].rv = CUR;
        caches[i].floor = FLOOR;
    }
}

static void
caches_fini(void)
{
    for (int i = 0; i < C_N; i++) {
        free(caches[i].d.path);
        free(caches[i].d.group);
        free(caches[i].d.version);
        free(caches[i].d.resource);
        free(caches[i].d.kind);
    }
}

static void
t_cache(const void *arg, size_t i, struct admit_cache *out)
{
    const struct tcache *t = arg;
    *out = (struct admit_cache){.d = &t[i].d, .started = t[i].started, .serving = t[i].serving};
}

static uint64_t
t_rv(const void *arg, size_t i, uint64_t *floor)
{
    const struct tcache *t = arg;
    rv_calls++;
    rv_last = (int)i;
    *floor = t[i].floor;
    return t[i].rv;
}

static const struct admit_caches tcaches = {.n = C_N, .cache = t_cache, .rv = t_rv, .arg = caches};

/* ---- asking ---- */

struct ask {
    const char *method; /* NULL: GET */
    const char *accept, *ua;
    enum decide_too_large too_large;
};

static void
admit_ask(const struct ask *k, const char *target, struct admit *a)
{
    struct route_req r;
    const char *method = k && k->method ? k->method : "GET";
    if (route_parse(method, target, strlen(target), &r) != 0) {
        printf("# route_parse failed: %s\n", target);
        abort();
    }
    struct admit_req q = {.r = &r, .method = method};
    if (k) {
        q.accept = k->accept;
        q.user_agent = k->ua;
        q.too_large = k->too_large;
    }
    rv_calls = 0;
    rv_last = -1;
    admit_decide(&q, &tcaches, a);
    route_fini(&r);
}

/* The request passes for why. */
static void
is_pass(const struct ask *k, const char *target, enum admit_why why, const char *what)
{
    struct admit a;
    admit_ask(k, target, &a);
    is_int(a.action, ADMIT_PASS, what);
    if (a.why != why)
        printf("#   why %s, want %s\n", admit_why_name(a.why), admit_why_name(why));
    is_int(a.why, why, what);
    ok(a.sel == NULL && a.dec.body == NULL && a.dec.start_key == NULL, "a pass owns nothing");
    admit_fini(&a);
}

static const struct ask PB = {.accept = "application/vnd.kubernetes.protobuf"};
static const struct ask PB_JSON = {.accept =
                                       "application/vnd.kubernetes.protobuf, application/json"};

/* ---- which requests are reads kwc may answer ---- */

static void
test_not_a_read(void)
{
    struct ask head = {.method = "HEAD"}, post = {.method = "POST"}, del = {.method = "DELETE"};
    is_pass(&head, "/api/v1/pods?resourceVersion=0", ADMIT_WHY_NOT_READ, "HEAD");
    is_pass(&post, "/api/v1/namespaces/a/pods", ADMIT_WHY_NOT_READ, "create");
    is_pass(&del, "/api/v1/namespaces/a/pods/p", ADMIT_WHY_NOT_READ, "delete");
    is_pass(NULL, "/api/v1/namespaces/a/pods/p/log", ADMIT_WHY_NOT_READ, "a subresource");
    is_pass(NULL, "/api/v1/namespaces/a/pods/p/status?resourceVersion=0", ADMIT_WHY_NOT_READ,
            "the status subresource");
    is_pass(NULL, "/api/v1", ADMIT_WHY_NOT_READ, "discovery");
    is_pass(NULL, "/version", ADMIT_WHY_NOT_READ, "not a resource");
    is_pass(NULL, "/api/v1/watch/namespaces/a/pods/p", ADMIT_WHY_NOT_READ, "a watch of one object");
    is_int(rv_calls, 0, "the caches' rv is not read for a request that is not a read");
}

/* ---- list: resourceVersion, resourceVersionMatch, limit, continue ---- */

static void
test_list_rv(void)
{
    struct admit a;
    /* rv unset: Most Recent, a quorum read only the upstream can do */
    is_pass(NULL, "/api/v1/pods", ADMIT_WHY_TABLE, "list, rv unset");
    admit_ask(NULL, "/api/v1/pods", &a);
    is_int(a.dec.why, DECIDE_WHY_MOST_RECENT, "list, rv unset: most recent");
    is_int(a.cache, C_PODS, "...of the pods' JSON cache");
    admit_fini(&a);

    /* rv "0": Any */
    admit_ask(NULL, "/api/v1/pods?resourceVersion=0", &a);
    is_int(a.action, ADMIT_SERVE, "list rv=0 is served");
    is_int(a.cache, C_PODS, "...from the pods' JSON cache");
    is_int(a.enc, KWC_ENC_JSON, "...in JSON");
    is_int(a.verb, DECIDE_LIST, "...as a list");
    is_int(a.dec.action, DECIDE_SERVE_LATEST, "...at the newest state (Any)");
    is_int(rv_calls, 1, "the cache's rv is read once");
    is_int(rv_last, C_PODS, "...the chosen cache's");
    is_int(a.current_rv, CUR, "the decision saw the cache's rv");
    is_int(a.floor_rv, FLOOR, "...and floor");
    ok(a.sel && sel_is_everything(a.sel), "no selector: one that selects everything");
    admit_fini(&a);

    admit_ask(NULL, "/api/v1/namespaces/a/pods?resourceVersion=0&limit=5", &a);
    is_int(a.action, ADMIT_SERVE, "list rv=0 with a limit is served (Any)");
    admit_fini(&a);

    /* rv N, no limit: Not older than N */
    admit_ask(NULL, "/api/v1/pods?resourceVersion=80", &a);
    is_int(a.action, ADMIT_SERVE, "list rv=N (reached) is served");
    is_int(a.dec.action, DECIDE_SERVE_AT_LEAST, "...not older than N");
    is_int(a.dec.rv, 80, "...N");
    ok(!a.dec.wait, "...at once: the cache is past N");
    admit_fini(&a);

    admit_ask(NULL, "/api/v1/pods?resourceVersion=150", &a);
    is_int(a.action, ADMIT_SERVE, "list rv=N ahead of the cache is served");
    is_int(a.dec.action, DECIDE_SERVE_AT_LEAST, "...not older than N");
    ok(a.dec.wait, "...once the cache reaches N");
    is_int(a.dec.on_timeout, DECIDE_PASS_THROUGH, "...else the upstream (default policy)");
    admit_fini(&a);

    struct ask strict = {.too_large = DECIDE_TOO_LARGE_504};
    admit_ask(&strict, "/api/v1/pods?resourceVersion=150", &a);
    is_int(a.dec.on_timeout, DECIDE_ERROR, "--too-large-rv=504: kube's 504 after the wait");
    admit_fini(&a);

    /* rv N with a limit: Exact N */
    admit_ask(NULL, "/api/v1/pods?resourceVersion=80&limit=10", &a);
    is_int(a.action, ADMIT_SERVE, "list rv=N limit=n inside the history is served");
    is_int(a.dec.action, DECIDE_SERVE_EXACT, "...at exactly N");
    is_int(a.dec.rv, 80, "...N");
    is_int(a.dec.limit, 10, "...a page of n");
    admit_fini(&a);

    /* Exact below the history: 410 Gone is the server's when it has not
     * retained N; the upstream may still have it */
    is_pass(NULL, "/api/v1/pods?resourceVersion=40&limit=10", ADMIT_WHY_TABLE,
            "list rv=N limit=n below the history floor");
    admit_ask(NULL, "/api/v1/pods?resourceVersion=40&limit=10", &a);
    is_int(a.dec.why, DECIDE_WHY_BELOW_FLOOR, "...why: below the floor");
    admit_fini(&a);
    is_pass(NULL, "/api/v1/pods?resourceVersion=150&limit=10", ADMIT_WHY_TABLE,
            "list rv=N limit=n ahead of the cache (the upstream issued N)");

    /* resourceVersionMatch */
    admit_ask(NULL, "/api/v1/pods?resourceVersion=80&resourceVersionMatch=NotOlderThan&limit=10",
              &a);
    is_int(a.action, ADMIT_SERVE, "NotOlderThan N limit=n is served");
    is_int(a.dec.action, DECIDE_SERVE_AT_LEAST, "...not older than N");
    admit_fini(&a);
    admit_ask(NULL, "/api/v1/pods?resourceVersion=80&resourceVersionMatch=Exact", &a);
    is_int(a.action, ADMIT_SERVE, "Exact N is served");
    is_int(a.dec.action, DECIDE_SERVE_EXACT, "...at exactly N");
    admit_fini(&a);

    /* invalid combinations: kube's 422 / 400, answered by kwc in JSON */
    admit_ask(NULL, "/api/v1/pods?resourceVersionMatch=NotOlderThan", &a);
    is_int(a.action, ADMIT_ERROR, "resourceVersionMatch without resourceVersion: an error");
    is_int(a.dec.code, 422, "...422 Invalid");
    ok(a.dec.body && strstr(a.dec.body, "\"kind\":\"Status\""), "...a Status body");
    admit_fini(&a);
    admit_ask(NULL, "/api/v1/pods?resourceVersion=0&resourceVersionMatch=Exact", &a);
    is_int(a.action, ADMIT_ERROR, "Exact with rv=0: an error");
    is_int(a.dec.code, 422, "...422 Invalid");
    admit_fini(&a);
    admit_ask(NULL, "/api/v1/pods?limit=x", &a);
    is_int(a.action, ADMIT_ERROR, "an unparsable limit: an error");
    is_int(a.dec.code, 400, "...400 BadRequest");
    admit_fini(&a);
}

/* A query value with every byte but [A-Za-z0-9] percent-encoded. */
static char *
qescape(const char *s)
{
    char *out = xmalloc(strlen(s) * 3 + 1), *o = out;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
            *o++ = (char)c;
        else
            o += sprintf(o, "%%%02X", c);
    }
    *o = '\0';
    return out;
}

static void
test_list_continue(void)
{
    char *tok = NULL;
    if (cont_encode(80, "a/p1", 4, &tok) != 0)
        abort();
    char *esc = qescape(tok);
    char target[512];
    struct admit a;

    snprintf(target, sizeof(target), "/api/v1/pods?limit=2&continue=%s", esc);
    admit_ask(NULL, target, &a);
    is_int(a.action, ADMIT_SERVE, "a continue token (rv unset) is served");
    is_int(a.dec.action, DECIDE_SERVE_EXACT, "...at the token's rv, exactly");
    is_int(a.dec.rv, 80, "...80");
    ok(a.dec.start_key != NULL, "...from after the token's key");
    admit_fini(&a);

    snprintf(target, sizeof(target), "/api/v1/pods?limit=2&resourceVersion=0&continue=%s", esc);
    admit_ask(NULL, target, &a);
    is_int(a.action, ADMIT_SERVE, "rv=0 with a token: treated as the token");
    is_int(a.dec.rv, 80, "...at the token's rv");
    admit_fini(&a);

    snprintf(target, sizeof(target), "/api/v1/pods?limit=2&resourceVersion=80&continue=%s", esc);
    admit_ask(NULL, target, &a);
    is_int(a.action, ADMIT_ERROR, "rv=N with a token: an error");
    is_int(a.dec.code, 400, "...400 BadRequest");
    admit_fini(&a);

    snprintf(target, sizeof(target),
             "/api/v1/pods?limit=2&resourceVersion=80&resourceVersionMatch=Exact&continue=%s", esc);
    admit_ask(NULL, target, &a);
    is_int(a.action, ADMIT_ERROR, "resourceVersionMatch with a token: an error");
    is_int(a.dec.code, 422, "...422");
    admit_fini(&a);
    free(esc);
    free(tok);

    /* a token older than the history: the upstream answers (its 410) */
    if (cont_encode(40, "a/p1", 4, &tok) != 0)
        abort();
    esc = qescape(tok);
    snprintf(target, sizeof(target), "/api/v1/pods?limit=2&continue=%s", esc);
    is_pass(NULL, target, ADMIT_WHY_TABLE, "a token below the history floor");
    free(esc);
    free(tok);
}

/* ---- get ---- */

static void
test_get(void)
{
    struct admit a;
    is_pass(NULL, "/api/v1/namespaces/a/pods/p", ADMIT_WHY_TABLE, "get, rv unset (Most Recent)");
    admit_ask(NULL, "/api/v1/namespaces/a/pods/p?resourceVersion=0", &a);
    is_int(a.action, ADMIT_SERVE, "get rv=0 is served");
    is_int(a.verb, DECIDE_GET, "...as a get");
    is_int(a.dec.action, DECIDE_SERVE_LATEST, "...Any");
    ok(a.sel == NULL, "...with no selector");
    admit_fini(&a);
    admit_ask(NULL, "/api/v1/namespaces/a/pods/p?resourceVersion=80", &a);
    is_int(a.dec.action, DECIDE_SERVE_AT_LEAST, "get rv=N: not older than N");
    admit_fini(&a);
    /* a namespaced object is served at its namespace's path only */
    is_pass(NULL, "/api/v1/pods/p?resourceVersion=0", ADMIT_WHY_PATH,
            "get of a namespaced object without a namespace");
    /* a cluster-scoped resource: <path> and <path>/<name> only */
    admit_ask(NULL, "/api/v1/nodes/n1?resourceVersion=0", &a);
    is_int(a.action, ADMIT_SERVE, "get of a node is served");
    is_int(a.cache, C_NODES, "...from the nodes' cache");
    admit_fini(&a);
    admit_ask(NULL, "/api/v1/nodes?resourceVersion=0", &a);
    is_int(a.action, ADMIT_SERVE, "list of nodes is served");
    admit_fini(&a);
    is_pass(NULL, "/api/v1/namespaces/a/nodes?resourceVersion=0", ADMIT_WHY_PATH,
            "nodes in a namespace");
    is_pass(NULL, "/api/v1/namespaces/a/nodes/n1?resourceVersion=0", ADMIT_WHY_PATH,
            "a node in a namespace");
    is_pass(NULL, "/api/v1/watch/namespaces/a/nodes", ADMIT_WHY_PATH,
            "a watch of nodes in a namespace");
}

/* ---- watch ---- */

static void
test_watch(void)
{
    struct admit a;
    /* rv unset and "0": Get State and Start (synthetic ADDED first) */
    admit_ask(NULL, "/api/v1/pods?watch=1", &a);
    is_int(a.action, ADMIT_SERVE, "watch, rv unset, is served");
    is_int(a.verb, DECIDE_WATCH, "...as a watch");
    is_int(a.dec.action, DECIDE_SERVE_WATCH, "...a stream");
    ok(a.dec.initial, "...starting with the state");
    ok(!a.bookmarks, "...without bookmarks unless asked");
    admit_fini(&a);
    admit_ask(NULL, "/api/v1/namespaces/a/pods?watch=true&resourceVersion=0", &a);
    is_int(a.action, ADMIT_SERVE, "watch rv=0 in a namespace is served");
    ok(a.dec.initial, "...starting with the state");
    admit_fini(&a);
    admit_ask(NULL, "/api/v1/watch/pods?resourceVersion=0", &a);
    is_int(a.action, ADMIT_SERVE, "the legacy watch path is served");
    is_int(a.verb, DECIDE_WATCH, "...as a watch");
    admit_fini(&a);

    /* rv N: Start at Exact, every change after N, no synthetic ADDED */
    admit_ask(NULL, "/api/v1/pods?watch=1&resourceVersion=80", &a);
    is_int(a.action, ADMIT_SERVE, "watch rv=N in the history is served");
    ok(!a.dec.initial, "...without the state");
    is_int(a.dec.rv, 80, "...after N");
    admit_fini(&a);
    is_pass(NULL, "/api/v1/pods?watch=1&resourceVersion=40", ADMIT_WHY_BELOW_FLOOR,
            "watch from below the history floor (the upstream may still hold N, else its 410)");
    admit_ask(NULL, "/api/v1/pods?watch=1&resourceVersion=50", &a);
    is_int(a.action, ADMIT_SERVE, "watch from the floor itself is served");
    admit_fini(&a);

    /* allowWatchBookmarks: parsed like Go's strconv.ParseBool */
    static const char *const yes[] = {"true", "True", "1", "t"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        char t[128];
        snprintf(t, sizeof(t), "/api/v1/pods?watch=1&allowWatchBookmarks=%s", yes[i]);
        admit_ask(NULL, t, &a);
        ok(a.action == ADMIT_SERVE && a.bookmarks, yes[i]);
        admit_fini(&a);
    }
    admit_ask(NULL, "/api/v1/pods?watch=1&allowWatchBookmarks=false", &a);
    ok(a.action == ADMIT_SERVE && !a.bookmarks, "allowWatchBookmarks=false: none");
    admit_fini(&a);

    /* sendInitialEvents */
    admit_ask(NULL,
              "/api/v1/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
              "&allowWatchBookmarks=true",
              &a);
    is_int(a.action, ADMIT_SERVE, "sendInitialEvents=true is served");
    ok(a.dec.initial && a.dec.initial_end, "...the state, then the initial-events-end bookmark");
    ok(a.bookmarks, "...with bookmarks");
    admit_fini(&a);
    admit_ask(NULL,
              "/api/v1/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
              "&allowWatchBookmarks=true&resourceVersion=150",
              &a);
    is_int(a.action, ADMIT_SERVE, "sendInitialEvents=true, N ahead of the cache, is served");
    ok(a.dec.initial && a.dec.wait, "...once the cache reaches N");
    admit_fini(&a);
    admit_ask(NULL,
              "/api/v1/pods?watch=1&sendInitialEvents=false&resourceVersionMatch=NotOlderThan"
              "&resourceVersion=80",
              &a);
    is_int(a.action, ADMIT_SERVE, "sendInitialEvents=false rv=N is served");
    ok(!a.dec.initial && a.dec.rv == 80, "...from N, without the state");
    admit_fini(&a);
    admit_ask(NULL, "/api/v1/pods?watch=1&sendInitialEvents=true", &a);
    is_int(a.action, ADMIT_ERROR, "sendInitialEvents without resourceVersionMatch: an error");
    is_int(a.dec.code, 422, "...422");
    admit_fini(&a);
    admit_ask(NULL, "/api/v1/pods?watch=1&resourceVersion=80&resourceVersionMatch=NotOlderThan",
              &a);
    is_int(a.action, ADMIT_ERROR, "resourceVersionMatch on a watch without sendInitialEvents");
    is_int(a.dec.code, 422, "...422");
    admit_fini(&a);
    admit_ask(NULL, "/api/v1/pods?sendInitialEvents=true&resourceVersionMatch=NotOlderThan", &a);
    is_int(a.action, ADMIT_ERROR, "sendInitialEvents on a list: an error");
    is_int(a.dec.code, 422, "...422");
    admit_fini(&a);

    admit_ask(NULL, "/api/v1/pods?watch=1&timeoutSeconds=30", &a);
    is_int(a.dec.timeout_seconds, 30, "timeoutSeconds is the stream's length");
    admit_fini(&a);
}

/* ---- encodings ---- */

static void
test_encoding(void)
{
    struct admit a;
    admit_ask(&PB, "/api/v1/pods?resourceVersion=0", &a);
    is_int(a.action, ADMIT_SERVE, "a protobuf list is served");
    is_int(a.cache, C_PODS_PB, "...from the pods' protobuf cache");
    is_int(a.enc, KWC_ENC_PB, "...in protobuf");
    admit_fini(&a);
    admit_ask(&PB_JSON, "/api/v1/pods?watch=1", &a);
    is_int(a.action, ADMIT_SERVE, "protobuf with a JSON fallback: a protobuf watch");
    is_int(a.cache, C_PODS_PB, "...from the protobuf cache");
    admit_fini(&a);
    struct ask any = {.accept = "*/*"}, json = {.accept = "application/json"};
    admit_ask(&any, "/api/v1/pods?resourceVersion=0", &a);
    ok(a.action == ADMIT_SERVE && a.enc == KWC_ENC_JSON, "*/*: JSON");
    admit_fini(&a);
    admit_ask(&json, "/api/v1/pods?resourceVersion=0", &a);
    ok(a.action == ADMIT_SERVE && a.enc == KWC_ENC_JSON, "application/json: JSON");
    admit_fini(&a);
    admit_ask(NULL, "/api/v1/pods?resourceVersion=0", &a);
    ok(a.action == ADMIT_SERVE && a.enc == KWC_ENC_JSON, "no Accept: JSON");
    admit_fini(&a);

    struct ask table = {.accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"};
    struct ask yaml = {.accept = "application/yaml"};
    struct ask meta = {.accept = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"};
    struct ask none = {.accept = "text/html"};
    is_pass(&table, "/api/v1/pods?resourceVersion=0", ADMIT_WHY_MEDIA, "kubectl's Table Accept");
    is_pass(&table, "/api/v1/pods?watch=1", ADMIT_WHY_MEDIA, "a Table watch");
    is_pass(&yaml, "/api/v1/pods?resourceVersion=0", ADMIT_WHY_MEDIA, "YAML");
    is_pass(&meta, "/api/v1/pods?resourceVersion=0", ADMIT_WHY_MEDIA, "metadata only");
    is_pass(&none, "/api/v1/pods?resourceVersion=0", ADMIT_WHY_MEDIA, "no serializer (kube's 406)");

    /* metadata only: as=PartialObjectMetadataList for lists, as=PartialObjectMetadata
     * for gets and watches, JSON or protobuf, from the cache of that encoding */
    struct ask poml = {.accept =
                           "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"};
    struct ask poml_pb = {
        .accept = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;"
                  "v=v1, application/json"};
    struct ask pom_pb = {
        .accept =
            "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"};
    struct ask poml_pretty = {
        .accept = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1;pretty=1"};
    admit_ask(&poml, "/api/v1/pods?resourceVersion=0", &a);
    ok(a.action == ADMIT_SERVE && a.meta && a.enc == KWC_ENC_JSON && a.cache == C_PODS,
       "a metadata list in JSON: served from the JSON cache, metadata only");
    admit_fini(&a);
    admit_ask(&poml_pb, "/api/v1/pods?resourceVersion=0", &a);
    ok(a.action == ADMIT_SERVE && a.meta && a.enc == KWC_ENC_PB && a.cache == C_PODS_PB,
       "a metadata list in protobuf: from the protobuf cache");
    admit_fini(&a);
    admit_ask(&meta, "/api/v1/namespaces/ns-1/pods/p?resourceVersion=0", &a);
    ok(a.action == ADMIT_SERVE && a.meta, "a metadata get");
    admit_fini(&a);
    admit_ask(&pom_pb, "/api/v1/pods?watch=1", &a);
    ok(a.action == ADMIT_SERVE && a.meta && a.enc == KWC_ENC_PB,
       "a metadata watch is admitted with meta set (the hub's metadata form)");
    admit_fini(&a);
    admit_ask(&meta, "/api/v1/pods?watch=1&pretty=true", &a);
    ok(a.action == ADMIT_SERVE && a.meta && a.enc == KWC_ENC_JSON, "...a pretty one too");
    admit_fini(&a);
    is_pass(&meta, "/api/v1/pods?watch=1&sendInitialEvents=true", ADMIT_WHY_ERROR_ENCODING,
            "a metadata watch's error: kube negotiates it without the as= clause");
    admit_ask(&poml, "/apis/example.com/v1/widgets?resourceVersion=0", &a);
    ok(a.action == ADMIT_SERVE && a.meta && a.cache == C_WIDGETS,
       "a custom resource's metadata list in JSON");
    admit_fini(&a);
    admit_ask(&poml, "/api/v1/pods?resourceVersion=0&pretty=0", &a);
    ok(a.action == ADMIT_SERVE && a.meta, "?pretty=0 with metadata: served");
    admit_fini(&a);
    is_pass(&poml, "/api/v1/namespaces/ns-1/pods/p?resourceVersion=0", ADMIT_WHY_MEDIA,
            "the List kind on a get (kube's 406)");
    is_pass(&poml, "/api/v1/pods?watch=1", ADMIT_WHY_MEDIA, "the List kind on a watch");
    admit_ask(&poml, "/api/v1/pods?resourceVersion=0", &a);
    ok(a.error_pretty && !a.error_upstream && !a.pretty,
       "a metadata-only Accept alone: its errors in WriteRawJSON's indented form");
    admit_fini(&a);
    struct ask poml_json = {.accept = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;"
                                      "v=v1, application/json"};
    admit_ask(&poml_json, "/api/v1/pods?resourceVersion=0", &a);
    ok(a.meta && !a.error_pretty && !a.error_upstream, "with a JSON clause after it: compact");
    admit_fini(&a);
    struct ask poml_yaml = {.accept = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;"
                                      "v=v1, application/yaml"};
    admit_ask(&poml_yaml, "/api/v1/pods?resourceVersion=0", &a);
    ok(a.meta && a.error_upstream, "with YAML after it: its errors are the upstream's");
    admit_fini(&a);
    is_pass(&poml_yaml, "/api/v1/pods?resourceVersion=0&limit=x", ADMIT_WHY_ERROR_ENCODING,
            "a metadata list's 400 whose Status would be YAML");
    admit_ask(&poml, "/api/v1/pods?resourceVersion=0&limit=x", &a);
    ok(a.action == ADMIT_ERROR && a.error_pretty, "a metadata list's 400: served, indented");
    admit_fini(&a);
    admit_ask(&poml_pretty, "/api/v1/pods?resourceVersion=0", &a);
    ok(a.action == ADMIT_SERVE && a.meta && a.pretty,
       "metadata with pretty=1 in Accept: served pretty");
    admit_fini(&a);
    admit_ask(&poml, "/api/v1/pods?resourceVersion=0&pretty=1", &a);
    ok(a.action == ADMIT_SERVE && a.meta && a.pretty, "metadata with ?pretty=1: served pretty");
    admit_fini(&a);
    struct ask json_pretty = {.accept = "application/json;pretty=1"};
    admit_ask(&json_pretty, "/api/v1/pods?resourceVersion=0&pretty=0", &a);
    ok(a.action == ADMIT_SERVE && !a.meta && a.pretty,
       "application/json;pretty=1: served pretty (ORed with ?pretty=0, as kube does)");
    admit_fini(&a);
    /* a custom resource's metadata in protobuf: kube converts the object to
     * a typed PartialObjectMetadata and writes it in protobuf; kwc derives
     * it from the JSON cache (there is no protobuf cache of it) */
    admit_ask(&poml_pb, "/apis/example.com/v1/widgets?resourceVersion=0", &a);
    ok(a.action == ADMIT_SERVE && a.meta && a.enc == KWC_ENC_PB && a.pom_from_json &&
           a.cache == C_WIDGETS && !a.want,
       "a custom resource's metadata list in protobuf: from its JSON cache");
    admit_fini(&a);
    admit_ask(&pom_pb, "/apis/example.com/v1/namespaces/ns-1/widgets/w?resourceVersion=0", &a);
    ok(a.action == ADMIT_SERVE && a.meta && a.enc == KWC_ENC_PB && a.pom_from_json &&
           a.cache == C_WIDGETS,
       "...a get");
    admit_fini(&a);
    admit_ask(&pom_pb, "/apis/example.com/v1/widgets?watch=1&resourceVersion=0", &a);
    ok(a.action == ADMIT_SERVE && a.meta && a.enc == KWC_ENC_PB && a.pom_from_json &&
           a.cache == C_WIDGETS && a.verb == DECIDE_WATCH,
       "...a watch");
    admit_fini(&a);
    admit_ask(&poml_pb, "/api/v1/pods?resourceVersion=0", &a);
    ok(!a.pom_from_json, "a built-in kind's protobuf metadata: its protobuf cache");
    admit_fini(&a);
    admit_ask(&poml, "/apis/example.com/v1/widgets?resourceVersion=0", &a);
    ok(!a.pom_from_json && a.enc == KWC_ENC_JSON, "a custom resource's metadata in JSON");
    admit_fini(&a);
    is_pass(&poml_pb, "/apis/example.com/v1/widgets?resourceVersionMatch=Exact",
            ADMIT_WHY_ERROR_ENCODING, "...its 422: kube writes it in protobuf, the upstream's");
    is_pass(&pom_pb, "/apis/example.com/v1/widgets?resourceVersion=0", ADMIT_WHY_MEDIA,
            "...the object kind on a list (kube's 406)");
    caches[C_WIDGETS].serving = false;
    admit_ask(&poml_pb, "/apis/example.com/v1/widgets?resourceVersion=0", &a);
    ok(a.action == ADMIT_PASS && a.why == ADMIT_WHY_NOT_SERVING && !a.want,
       "...its JSON cache not serving: the upstream's, nothing to start");
    admit_fini(&a);
    caches[C_WIDGETS].serving = true;
    /* goautoneg orders the clauses by q (any float): where that order picks
     * another clause than the first plain one, kube's winner decides */
    struct ask yaml_q = {.accept = "application/json, application/yaml;q=2"};
    is_pass(&yaml_q, "/api/v1/pods?resourceVersion=0", ADMIT_WHY_MEDIA,
            "YAML with q=2 after plain JSON: kube answers YAML");
    struct ask table_q = {.accept = "application/json, application/json;as=Table;g=meta.k8s.io;"
                                    "v=v1;q=2"};
    is_pass(&table_q, "/api/v1/pods?resourceVersion=0", ADMIT_WHY_MEDIA,
            "a Table clause with q=2 after plain JSON: kube answers a Table");
    struct ask json_q = {.accept = "application/vnd.kubernetes.protobuf, application/json;q=2"};
    admit_ask(&json_q, "/api/v1/pods?resourceVersion=0", &a);
    ok(a.action == ADMIT_PASS || a.enc == KWC_ENC_JSON,
       "JSON with q=2 after protobuf: never answered in protobuf");
    admit_fini(&a);
    struct ask poml_stream = {.accept = "application/json;as=PartialObjectMetadataList;"
                                        "g=meta.k8s.io;v=v1, application/json;stream=watch"};
    admit_ask(&poml_stream, "/api/v1/pods?resourceVersion=0", &a);
    ok(a.meta && a.error_upstream && !a.error_pretty,
       "a stream=watch clause after the metadata one: kube writes errors through it");
    admit_fini(&a);

    /* pretty JSON: ?pretty or a curl User-Agent, served indented; protobuf
     * has no pretty form */
    struct ask curl = {.ua = "curl/8.1.2"}, curl_pb = {.ua = "curl/8.1.2", .accept = PB.accept};
    admit_ask(NULL, "/api/v1/pods?resourceVersion=0&pretty=true", &a);
    ok(a.action == ADMIT_SERVE && a.pretty, "?pretty=true: served pretty");
    admit_fini(&a);
    admit_ask(&curl, "/api/v1/pods?resourceVersion=0", &a);
    ok(a.action == ADMIT_SERVE && a.pretty, "curl's User-Agent: served pretty");
    admit_fini(&a);
    admit_ask(&curl, "/api/v1/namespaces/ns/pods/p?resourceVersion=0", &a);
    ok(a.action == ADMIT_SERVE && a.pretty, "curl's get: served pretty");
    admit_fini(&a);
    admit_ask(&curl, "/api/v1/pods?watch=1", &a);
    ok(a.action == ADMIT_SERVE && a.pretty, "curl's watch: served (its events are never indented)");
    admit_fini(&a);
    admit_ask(NULL, "/api/v1/pods?watch=1&pretty=true", &a);
    ok(a.action == ADMIT_SERVE && a.enc == KWC_ENC_JSON, "a watch with ?pretty=true: served");
    admit_fini(&a);
    is_pass(&curl, "/api/v1/pods?watch=1&sendInitialEvents=true", ADMIT_WHY_ERROR_ENCODING,
            "a pretty watch's error Status (indented) is the upstream's");
    admit_ask(&curl_pb, "/api/v1/pods?resourceVersion=0", &a);
    ok(a.action == ADMIT_SERVE && a.enc == KWC_ENC_PB && !a.pretty,
       "curl asking for protobuf: served, not pretty");
    admit_fini(&a);
    admit_ask(&curl, "/api/v1/pods?resourceVersion=0&pretty=false", &a);
    ok(a.action == ADMIT_SERVE && !a.pretty, "?pretty=false overrides curl's User-Agent");
    admit_fini(&a);
    admit_ask(NULL, "/api/v1/pods?resourceVersion=0", &a);
    ok(a.action == ADMIT_SERVE && !a.pretty, "no ?pretty, no curl: compact");
    admit_fini(&a);

    /* custom resources have no protobuf: kube negotiates JSON */
    admit_ask(&PB_JSON, "/apis/example.com/v1/widgets?resourceVersion=0", &a);
    is_int(a.action, ADMIT_SERVE, "a custom resource asked for protobuf, JSON fallback");
    is_int(a.cache, C_WIDGETS, "...from its JSON cache");
    is_int(a.enc, KWC_ENC_JSON, "...in JSON");
    admit_fini(&a);
    is_pass(&PB, "/apis/example.com/v1/widgets?resourceVersion=0", ADMIT_WHY_MEDIA,
            "a custom resource asked for protobuf only (kube's 406)");

    /* the table's errors: kube writes them in protobuf when asked */
    is_pass(&PB, "/api/v1/pods?resourceVersionMatch=Exact", ADMIT_WHY_ERROR_ENCODING,
            "a protobuf list's 422");
    is_pass(&PB, "/api/v1/pods?watch=1&sendInitialEvents=true", ADMIT_WHY_ERROR_ENCODING,
            "a protobuf watch's 422");
    is_pass(&PB_JSON, "/apis/example.com/v1/widgets?resourceVersionMatch=Exact",
            ADMIT_WHY_ERROR_ENCODING, "a custom resource's 422 with protobuf asked for first");
    struct ask json_pb = {.accept = "application/json, application/vnd.kubernetes.protobuf"};
    admit_ask(&json_pb, "/apis/example.com/v1/widgets?resourceVersionMatch=Exact", &a);
    is_int(a.action, ADMIT_ERROR, "...with JSON first: kwc's own 422");
    admit_fini(&a);
}

/* ---- which cache, and its state ---- */

static void
test_caches(void)
{
    struct admit a;
    is_pass(NULL, "/apis/apps/v1/deployments?resourceVersion=0", ADMIT_WHY_NOT_CACHED,
            "a resource kwc does not cache");
    is_pass(NULL, "/api/v2/pods?resourceVersion=0", ADMIT_WHY_NOT_CACHED, "another version");
    is_int(rv_calls, 0, "the rv is not read for a resource not cached");

    admit_ask(NULL, "/api/v1/secrets?resourceVersion=0", &a);
    is_int(a.action, ADMIT_PASS, "a cache out of service passes");
    is_int(a.why, ADMIT_WHY_NOT_SERVING, "...not serving");
    is_int(a.cache, C_SECRETS, "...naming the cache");
    ok(!a.want, "...and asks nothing of it");
    admit_fini(&a);
    is_pass(NULL, "/api/v1/secrets?watch=1", ADMIT_WHY_NOT_SERVING, "...a watch of it too");

    /* a protobuf cache that starts on its first request */
    admit_ask(&PB, "/api/v1/configmaps?resourceVersion=0", &a);
    is_int(a.action, ADMIT_PASS, "a protobuf cache not started: the request passes");
    is_int(a.why, ADMIT_WHY_NOT_SERVING, "...not serving yet");
    is_int(a.cache, C_CM_PB, "...naming the protobuf cache");
    ok(a.want, "...and starts it");
    admit_fini(&a);
    admit_ask(NULL, "/api/v1/configmaps?resourceVersion=0", &a);
    ok(a.action == ADMIT_SERVE && a.cache == C_CM && !a.want,
       "the same resource in JSON: its own cache serves");
    admit_fini(&a);

    /* a started protobuf cache out of service: nothing to start */
    caches[C_PODS_PB].serving = false;
    admit_ask(&PB, "/api/v1/pods?resourceVersion=0", &a);
    ok(a.why == ADMIT_WHY_NOT_SERVING && a.cache == C_PODS_PB && !a.want,
       "a protobuf cache out of service passes and is not started again");
    admit_fini(&a);
    caches[C_PODS_PB].serving = true;

    /* started, still discovering: not a cache to choose, nothing to start */
    admit_ask(&PB, "/api/v1/secrets?resourceVersion=0", &a);
    is_int(a.why, ADMIT_WHY_NOT_CACHED, "a protobuf cache still discovering is not chosen");
    ok(!a.want, "...nor started again");
    admit_fini(&a);

    /* once it serves, it is chosen */
    caches[C_CM_PB].started = caches[C_CM_PB].serving = true;
    caches[C_CM_PB].d.kind = xstrdup("ConfigMap");
    caches[C_CM_PB].d.namespaced = true;
    admit_ask(&PB, "/api/v1/configmaps?resourceVersion=0", &a);
    ok(a.action == ADMIT_SERVE && a.cache == C_CM_PB && !a.want, "a started protobuf cache serves");
    admit_fini(&a);

    /* the rv the decision sees is the chosen cache's */
    caches[C_PODS_PB].rv = 200;
    caches[C_PODS_PB].floor = 150;
    admit_ask(&PB, "/api/v1/pods?watch=1&resourceVersion=120", &a);
    is_int(rv_last, C_PODS_PB, "a protobuf watch reads the protobuf cache's rv");
    is_int(a.why, ADMIT_WHY_BELOW_FLOOR, "...and its floor");
    admit_fini(&a);
    admit_ask(NULL, "/api/v1/pods?watch=1&resourceVersion=120", &a);
    is_int(a.action, ADMIT_SERVE, "the JSON cache has its own floor");
    admit_fini(&a);
    caches[C_PODS_PB].rv = CUR;
    caches[C_PODS_PB].floor = FLOOR;
}

/* ---- selectors ---- */

static void
test_selectors(void)
{
    struct admit a;
    admit_ask(NULL, "/api/v1/pods?resourceVersion=0&labelSelector=app%3Dweb", &a);
    is_int(a.action, ADMIT_SERVE, "a label selector is served");
    ok(a.sel && !sel_is_everything(a.sel), "...with the selector");
    admit_fini(&a);
    admit_ask(NULL, "/api/v1/pods?resourceVersion=0&fieldSelector=spec.nodeName%3Dn1", &a);
    is_int(a.action, ADMIT_SERVE, "pods by spec.nodeName (JSON) are served");
    admit_fini(&a);
    admit_ask(NULL, "/api/v1/pods?watch=1&fieldSelector=status.phase%3DRunning", &a);
    is_int(a.action, ADMIT_SERVE, "a JSON watch by status.phase is served");
    admit_fini(&a);
    admit_ask(&PB, "/api/v1/pods?watch=1&fieldSelector=spec.nodeName%3Dn1", &a);
    is_int(a.action, ADMIT_SERVE, "a protobuf watch by spec.nodeName is served");
    admit_fini(&a);
    is_pass(&PB, "/api/v1/pods?resourceVersion=0&fieldSelector=status.phase%3DRunning",
            ADMIT_WHY_FIELDS, "a field the protobuf cache cannot read");
    is_pass(NULL, "/api/v1/configmaps?resourceVersion=0&fieldSelector=data.x%3D1", ADMIT_WHY_FIELDS,
            "a field kube does not select by (its 400 is the upstream's)");
    is_pass(NULL, "/api/v1/nodes?watch=1&fieldSelector=metadata.namespace%3Da", ADMIT_WHY_FIELDS,
            "metadata.namespace of a cluster-scoped resource");
    admit_ask(NULL, "/api/v1/pods?watch=1&fieldSelector=metadata.name%3Dp", &a);
    is_int(a.action, ADMIT_SERVE, "a watch of one pod by metadata.name is served");
    admit_fini(&a);

    /* selectors kube refuses: its 400, unless protobuf was asked for */
    admit_ask(NULL, "/api/v1/pods?resourceVersion=0&labelSelector=a%20in%20(", &a);
    is_int(a.action, ADMIT_ERROR, "an unparsable label selector: an error");
    is_int(a.dec.code, 400, "...400 BadRequest");
    ok(a.sel == NULL, "...no selector");
    admit_fini(&a);
    admit_ask(NULL, "/api/v1/pods?watch=1&fieldSelector=spec.nodeName%3D%3D%3D", &a);
    is_int(a.action, ADMIT_ERROR, "an unparsable field selector on a watch: an error");
    admit_fini(&a);
    is_pass(&PB, "/api/v1/pods?watch=1&labelSelector=a%20in%20(", ADMIT_WHY_ERROR_ENCODING,
            "...in protobuf: the upstream's");
    /* a get has no selectors: they are not parsed */
    admit_ask(NULL, "/api/v1/namespaces/a/pods/p?resourceVersion=0&labelSelector=a%20in%20(", &a);
    is_int(a.action, ADMIT_SERVE, "a get ignores selectors");
    admit_fini(&a);

    /* over the parser's bounds: the upstream's */
    size_t n = SEL_MAX_LEN + 64;
    char *t = xmalloc(n + 64);
    int off = sprintf(t, "/api/v1/pods?resourceVersion=0&labelSelector=");
    for (size_t i = 0; i < SEL_MAX_LEN + 8; i++)
        t[off++] = 'a';
    t[off] = '\0';
    is_pass(NULL, t, ADMIT_WHY_SELECTOR_BOUNDS, "a selector over the parser's bounds");
    free(t);
}

int
main(void)
{
    caches_init();
    TAP_RUN(test_not_a_read);
    TAP_RUN(test_list_rv);
    TAP_RUN(test_list_continue);
    TAP_RUN(test_get);
    TAP_RUN(test_watch);
    TAP_RUN(test_encoding);
    TAP_RUN(test_caches);
    TAP_RUN(test_selectors);
    caches_fini();
    return tap_done();
}
