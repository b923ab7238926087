/*
 * disco_test.c — proxy/upstream/disco.c: the upstream's discovery kept
 * current, against a scripted fake upstream (libevent's evhttp on
 * 127.0.0.1, an ephemeral port) through kwc's real upstream client.
 *
 * The loop turns until a condition holds, bounded by a guard timer that
 * only fires when the test is broken; refreshes are asked for with
 * disco_refresh_soon (the interval is long), never waited out.
 */
#include "kwc/disco.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/kubeconfig.h"
#include "kwc/upstream.h"
#include "tap.h"

#define GUARD_S 20
#define MAX_ROUTES 16

struct route {
    const char *path;
    int status;
    const char *ctype, *etag; /* etag: quoted, or NULL */
    const char *body;
    unsigned hits, not_modified;
};

struct fake {
    struct event_base *base;
    struct evhttp *http;
    int port;
    struct route routes[MAX_ROUTES];
    size_t nroutes;
    unsigned requests;
    char last_accept[512];
    struct event *guard;
    bool guard_fired;
    struct kcfg *k;
    struct up_client *up;
    struct disco *d;
    unsigned changes;
};

static struct route *
route_of(struct fake *f, const char *path)
{
    for (size_t i = 0; i < f->nroutes; i++)
        if (strcmp(f->routes[i].path, path) == 0)
            return &f->routes[i];
    return NULL;
}

static unsigned
hits(struct fake *f, const char *path)
{
    struct route *r = route_of(f, path);
    return r ? r->hits : 0;
}

static void
set_route(struct fake *f, const char *path, int status, const char *etag, const char *body)
{
    struct route *r = route_of(f, path);
    if (!r) {
        if (f->nroutes == MAX_ROUTES)
            abort();
        r = &f->routes[f->nroutes++];
        r->path = path;
    }
    r->status = status;
    r->ctype = "application/json";
    r->etag = etag;
    r->body = body;
}

static void
on_request(struct evhttp_request *req, void *arg)
{
    struct fake *f = arg;
    f->requests++;
    struct evkeyvalq *in = evhttp_request_get_input_headers(req);
    const char *acc = evhttp_find_header(in, "Accept");
    snprintf(f->last_accept, sizeof(f->last_accept), "%s", acc ? acc : "");
    const char *uri = evhttp_request_get_uri(req);
    struct route *r = route_of(f, uri);
    struct evkeyvalq *out = evhttp_request_get_output_headers(req);
    if (!r) {
        evhttp_send_reply(req, 404, "Not Found", NULL);
        return;
    }
    r->hits++;
    const char *inm = evhttp_find_header(in, "If-None-Match");
    if (r->etag) {
        evhttp_add_header(out, "Etag", r->etag);
        evhttp_add_header(out, "Vary", "Accept");
        evhttp_add_header(out, "Cache-Control", "public");
    }
    evhttp_add_header(out, "Audit-Id", "not-kept");
    if (r->status == 200 && r->etag && inm && strcmp(inm, r->etag) == 0) {
        r->not_modified++;
        evhttp_send_reply(req, 304, "Not Modified", NULL);
        return;
    }
    evhttp_add_header(out, "Content-Type", r->ctype);
    struct evbuffer *b = evbuffer_new();
    evbuffer_add(b, r->body, strlen(r->body));
    evhttp_send_reply(req, r->status, "X", b);
    evbuffer_free(b);
}

static void
on_guard(evutil_socket_t fd, short what, void *arg)
{
    ((struct fake *)arg)->guard_fired = true;
}

static void
on_change(void *arg)
{
    ((struct fake *)arg)->changes++;
}

static void
fake_init(struct fake *f)
{
    *f = (struct fake){0};
    f->base = event_base_new();
    f->http = evhttp_new(f->base);
    struct evhttp_bound_socket *s = evhttp_bind_socket_with_handle(f->http, "127.0.0.1", 0);
    if (!s)
        abort();
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    getsockname(evhttp_bound_socket_get_fd(s), (struct sockaddr *)&sa, &sl);
    f->port = ntohs(sa.sin_port);
    evhttp_set_gencb(f->http, on_request, f);
    evhttp_set_allowed_methods(f->http, EVHTTP_REQ_GET);
    f->guard = evtimer_new(f->base, on_guard, f);
    char y[1024], err[512] = "";
    snprintf(y, sizeof(y),
             "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n"
             "    server: http://127.0.0.1:%d\nusers:\n- name: u\n  user:\n    token: t\n"
             "contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
             f->port);
    struct up_options uo = {.connect_timeout_ms = 10000,
                            .max_idle_conns = 4,
                            .max_conns = {[UP_POOL_DISCOVERY] = DISCO_MAX_CONNS}};
    if (kcfg_parse(y, strlen(y), "/", NULL, &f->k, err, sizeof(err)) != 0 ||
        up_client_new(f->base, f->k, &uo, &f->up, err, sizeof(err)) != 0) {
        printf("# %s\n", err);
        abort();
    }
}

static void
fake_start(struct fake *f)
{
    /* a long interval: rounds happen when the test asks (disco_refresh_soon) */
    struct disco_options o = {.interval_ms = 3600 * 1000, .min_gap_ms = 1};
    disco_new(f->base, f->up, &o, &f->d);
    disco_subscribe(f->d, on_change, f);
    disco_start(f->d);
}

static void
fake_fini(struct fake *f)
{
    disco_free(f->d);
    for (int i = 0; i < 8; i++)
        event_base_loop(f->base, EVLOOP_NONBLOCK);
    up_client_free(f->up);
    kcfg_free(f->k);
    if (f->http)
        evhttp_free(f->http);
    event_free(f->guard);
    event_base_free(f->base);
}

static bool
run_until(struct fake *f, bool (*pred)(struct fake *f), const char *what)
{
    struct timeval tv = {GUARD_S, 0};
    f->guard_fired = false;
    evtimer_add(f->guard, &tv);
    bool held = false;
    while (!f->guard_fired && !(held = pred(f)))
        event_base_loop(f->base, EVLOOP_ONCE);
    evtimer_del(f->guard);
    if (!held)
        printf("# never came to pass: %s\n", what);
    return held;
}

static struct disco_stats
stats(struct fake *f)
{
    struct disco_stats st;
    disco_stats(f->d, &st);
    return st;
}

static uint64_t want_rounds;
static bool
rounds_done(struct fake *f)
{
    struct disco_stats st = stats(f);
    return st.refreshes + st.refresh_failures >= want_rounds;
}

/* Ask for a refresh and wait for it (ok or failed). */
static void
refresh(struct fake *f)
{
    struct disco_stats st = stats(f);
    want_rounds = st.refreshes + st.refresh_failures + 1;
    disco_refresh_soon(f->d);
    run_until(f, rounds_done, "a refresh");
}

static bool
is_ready(struct fake *f)
{
    return disco_ready(f->d);
}

/* ---- documents ---- */

static const char agg_api[] =
    "{\"kind\":\"APIGroupDiscoveryList\",\"apiVersion\":\"apidiscovery.k8s.io/v2\",\"metadata\":{},"
    "\"items\":[{\"metadata\":{},\"versions\":[{\"version\":\"v1\",\"resources\":["
    "{\"resource\":\"pods\",\"responseKind\":{\"kind\":\"Pod\"},\"scope\":\"Namespaced\","
    "\"verbs\":[\"get\",\"list\",\"watch\"]}]}]}]}\n";

static const char agg_apis1[] =
    "{\"kind\":\"APIGroupDiscoveryList\",\"apiVersion\":\"apidiscovery.k8s.io/v2\",\"metadata\":{},"
    "\"items\":[{\"metadata\":{\"name\":\"apiregistration.k8s.io\"},\"versions\":[{\"version\":"
    "\"v1\",\"resources\":[{\"resource\":\"apiservices\",\"responseKind\":{\"kind\":"
    "\"APIService\"},\"scope\":\"Cluster\",\"verbs\":[\"list\",\"watch\"]}]}]},"
    "{\"metadata\":{\"name\":\"apps\"},\"versions\":[{\"version\":\"v1\",\"resources\":["
    "{\"resource\":\"deployments\",\"responseKind\":{\"kind\":\"Deployment\"},\"scope\":"
    "\"Namespaced\",\"verbs\":[\"list\",\"watch\"]}]}]},"
    "{\"metadata\":{\"name\":\"metrics.k8s.io\"},\"versions\":[{\"version\":\"v1beta1\","
    "\"resources\":[{\"resource\":\"nodes\",\"responseKind\":{\"kind\":\"NodeMetrics\"},"
    "\"scope\":\"Cluster\",\"verbs\":[\"get\",\"list\"]}]}]}]}\n";

/* apis1 with a CRD's group added */
static const char agg_apis2[] =
    "{\"kind\":\"APIGroupDiscoveryList\",\"apiVersion\":\"apidiscovery.k8s.io/v2\",\"metadata\":{},"
    "\"items\":[{\"metadata\":{\"name\":\"apiregistration.k8s.io\"},\"versions\":[{\"version\":"
    "\"v1\",\"resources\":[{\"resource\":\"apiservices\",\"responseKind\":{\"kind\":"
    "\"APIService\"},\"scope\":\"Cluster\",\"verbs\":[\"list\",\"watch\"]}]}]},"
    "{\"metadata\":{\"name\":\"apps\"},\"versions\":[{\"version\":\"v1\",\"resources\":["
    "{\"resource\":\"deployments\",\"responseKind\":{\"kind\":\"Deployment\"},\"scope\":"
    "\"Namespaced\",\"verbs\":[\"list\",\"watch\"]}]}]},"
    "{\"metadata\":{\"name\":\"metrics.k8s.io\"},\"versions\":[{\"version\":\"v1beta1\","
    "\"resources\":[{\"resource\":\"nodes\",\"responseKind\":{\"kind\":\"NodeMetrics\"},"
    "\"scope\":\"Cluster\",\"verbs\":[\"get\",\"list\"]}]}]},"
    "{\"metadata\":{\"name\":\"x.example.com\"},\"versions\":[{\"version\":\"v1\",\"resources\":"
    "[{\"resource\":\"gadgets\",\"responseKind\":{\"group\":\"x.example.com\",\"version\":\"v1\","
    "\"kind\":\"Gadget\"},\"scope\":\"Namespaced\",\"verbs\":[\"list\",\"watch\"]}]}]}]}\n";

static const char apiservices[] =
    "{\"kind\":\"APIServiceList\",\"apiVersion\":\"apiregistration.k8s.io/v1\",\"metadata\":{},"
    "\"items\":[{\"metadata\":{\"name\":\"v1.apps\"},\"spec\":{\"group\":\"apps\",\"version\":"
    "\"v1\",\"service\":null}},{\"metadata\":{\"name\":\"v1beta1.metrics.k8s.io\"},\"spec\":{"
    "\"group\":\"metrics.k8s.io\",\"version\":\"v1beta1\",\"service\":{\"namespace\":"
    "\"kube-system\",\"name\":\"metrics-server\"}}}]}\n";

static const char apps_v1[] =
    "{\"kind\":\"APIResourceList\",\"apiVersion\":\"v1\",\"groupVersion\":\"apps/"
    "v1\",\"resources\":"
    "[{\"name\":\"deployments\",\"namespaced\":true,\"kind\":\"Deployment\",\"verbs\":[\"list\","
    "\"watch\"]},{\"name\":\"deployments/scale\",\"namespaced\":true,\"kind\":\"Scale\",\"verbs\":"
    "[\"get\"]}]}\n";

static const char versions[] = "{\"kind\":\"APIVersions\",\"versions\":[\"v1\"]}\n";
static const char groups[] =
    "{\"kind\":\"APIGroupList\",\"apiVersion\":\"v1\",\"groups\":[{\"name\":\"apps\",\"versions\":["
    "{\"groupVersion\":\"apps/v1\",\"version\":\"v1\"}]}]}\n";
static const char core_v1[] =
    "{\"kind\":\"APIResourceList\",\"groupVersion\":\"v1\",\"resources\":[{\"name\":\"pods\","
    "\"namespaced\":true,\"kind\":\"Pod\",\"verbs\":[\"list\",\"watch\"]},{\"name\":\"bindings\","
    "\"namespaced\":true,\"kind\":\"Binding\",\"verbs\":[\"create\"]}]}\n";

static void
aggregated_upstream(struct fake *f)
{
    set_route(f, "/api", 200, "\"A1\"", agg_api);
    set_route(f, "/apis", 200, "\"B1\"", agg_apis1);
    set_route(f, "/apis/apiregistration.k8s.io/v1/apiservices", 200, NULL, apiservices);
    set_route(f, "/apis/apps/v1", 200, NULL, apps_v1);
    set_route(f, "/version", 200, NULL, "{\n  \"major\": \"1\"\n}");
}

/* ---- the model ---- */

static void
test_aggregated(void)
{
    struct fake f;
    fake_init(&f);
    aggregated_upstream(&f);
    fake_start(&f);
    struct disco_res r;
    is_int(disco_find(f.d, "", "v1", "pods", &r), DISCO_UNKNOWN, "nothing decided before a read");
    ok(run_until(&f, is_ready, "ready"), "discovery read");
    ok(strstr(f.last_accept, "as=APIGroupDiscoveryList") || f.routes[0].hits, "asked aggregated");
    is_int(f.changes, 1, "subscribers told of the first model");
    is_int(disco_find(f.d, "", "v1", "pods", &r), DISCO_PRESENT, "pods");
    ok(r.namespaced && r.list && r.watch && strcmp(r.kind, "Pod") == 0 && !r.aggregated,
       "pods: Pod, namespaced, list, watch, local");
    is_int(disco_find(f.d, "apps", "v1", "deployments", &r), DISCO_PRESENT, "deployments");
    is_int(disco_find(f.d, "metrics.k8s.io", "v1beta1", "nodes", &r), DISCO_PRESENT, "NodeMetrics");
    ok(r.aggregated && r.list && !r.watch, "metrics.k8s.io: an extension server's (APIService)");
    is_int(disco_find(f.d, "x.example.com", "v1", "gadgets", NULL), DISCO_ABSENT, "no CRD yet");
    struct disco_stats st = stats(&f);
    ok(st.ready && st.aggregated && st.resources == 4 && st.extension_gvs == 1, "stats");
    is_int(hits(&f, "/apis/apps/v1"), 0, "no plain document read");

    /* nothing changed: 304s, no news */
    refresh(&f);
    st = stats(&f);
    is_int(st.refreshes, 2, "a second round");
    is_int(route_of(&f, "/api")->not_modified + route_of(&f, "/apis")->not_modified, 2,
           "If-None-Match: both 304");
    is_int(st.not_modified, 2, "counted");
    is_int(f.changes, 1, "no change told");

    /* a CRD: /apis changes */
    set_route(&f, "/apis", 200, "\"B2\"", agg_apis2);
    refresh(&f);
    is_int(f.changes, 2, "the change told once");
    is_int(disco_find(f.d, "x.example.com", "v1", "gadgets", &r), DISCO_PRESENT,
           "the CRD's resource");
    ok(strcmp(r.kind, "Gadget") == 0 && !r.aggregated, "its kind");
    is_int(stats(&f).changes, 1, "kwc_discovery_changes_total");
    unsigned apisvc = hits(&f, "/apis/apiregistration.k8s.io/v1/apiservices");
    is_int(apisvc, 2, "the APIService list read at start and after the change");

    /* and removed again */
    set_route(&f, "/apis", 200, "\"B3\"", agg_apis1);
    refresh(&f);
    is_int(f.changes, 3, "told");
    is_int(disco_find(f.d, "x.example.com", "v1", "gadgets", NULL), DISCO_ABSENT, "gone");

    /* each resource once, in discovery's order */
    fake_fini(&f);
}

static unsigned each_n;
static void
count_each(void *arg, const struct disco_res *r)
{
    (void)r;
    (*(unsigned *)arg)++;
}

static void
test_plain(void)
{
    struct fake f;
    fake_init(&f);
    set_route(&f, "/api", 200, NULL, versions);
    set_route(&f, "/apis", 200, NULL, groups);
    set_route(&f, "/api/v1", 200, NULL, core_v1);
    set_route(&f, "/apis/apps/v1", 200, NULL, apps_v1);
    fake_start(&f);
    ok(run_until(&f, is_ready, "ready"), "discovery read from the plain documents");
    struct disco_res r;
    is_int(disco_find(f.d, "", "v1", "pods", &r), DISCO_PRESENT, "pods from /api/v1");
    is_int(disco_find(f.d, "", "v1", "bindings", &r), DISCO_PRESENT, "bindings");
    ok(!r.list && !r.watch, "bindings: neither list nor watch");
    is_int(disco_find(f.d, "apps", "v1", "deployments", &r), DISCO_PRESENT, "deployments");
    is_int(disco_find(f.d, "apps", "v1", "deployments/scale", NULL), DISCO_ABSENT,
           "no subresource");
    unsigned n = 0;
    disco_each(f.d, count_each, &n);
    is_int(n, 3, "disco_each: every resource");
    ok(!stats(&f).aggregated, "plain discovery");
    is_int(hits(&f, "/api/v1"), 1, "each group version read");
    refresh(&f);
    is_int(hits(&f, "/api/v1"), 2, "read again each round (no ETag)");
    is_int(f.changes, 1, "the same bytes: no change");
    /* a group version gone: its resources too */
    set_route(&f, "/apis", 200, NULL, "{\"kind\":\"APIGroupList\",\"groups\":[]}");
    refresh(&f);
    is_int(disco_find(f.d, "apps", "v1", "deployments", NULL), DISCO_ABSENT, "apps gone");
    is_int(f.changes, 2, "told");
    (void)each_n;
    fake_fini(&f);
}

static void
test_failures(void)
{
    struct fake f;
    fake_init(&f);
    aggregated_upstream(&f);
    set_route(&f, "/apis", 500, NULL, "{\"kind\":\"Status\"}");
    fake_start(&f);
    want_rounds = 1;
    run_until(&f, rounds_done, "a first round");
    ok(!disco_ready(f.d), "not ready while /apis fails");
    ok(stats(&f).refresh_failures >= 1, "a failed round");
    is_int(disco_find(f.d, "", "v1", "pods", NULL), DISCO_UNKNOWN, "nothing decided");
    set_route(&f, "/apis", 200, "\"B1\"", agg_apis1);
    ok(run_until(&f, is_ready, "ready after the failure (retried sooner)"),
       "ready once it answers");
    /* a round that fails later keeps the model */
    set_route(&f, "/apis", 200, "\"B9\"", "not json");
    refresh(&f);
    is_int(disco_find(f.d, "apps", "v1", "deployments", NULL), DISCO_PRESENT,
           "the last model stays after a bad document");
    ok(disco_ready(f.d), "still ready");
    fake_fini(&f);
}

/* ---- the copy ---- */

static uint64_t want_failures;
static bool
failed_more(struct fake *f)
{
    return stats(f).fetch_failures >= want_failures;
}

static const char *want_path, *want_accept;
static bool
recorded(struct fake *f)
{
    const struct disco_doc *d = disco_doc_get(f->d, want_path, want_accept);
    disco_doc_unref(d);
    return d != NULL;
}

static void
test_copy(void)
{
    struct fake f;
    fake_init(&f);
    aggregated_upstream(&f);
    fake_start(&f);
    run_until(&f, is_ready, "ready");
    /* the model's own documents answer the Accept kwc asks with */
    const struct disco_doc *d = disco_doc_get(
        f.d, "/apis",
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/"
        "json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json");
    ok(d && d->len == strlen(agg_apis1) && memcmp(d->body, agg_apis1, d->len) == 0,
       "/apis with kwc's Accept: the model's record");
    ok(d && d->etag && strcmp(d->etag, "\"B1\"") == 0, "its ETag");
    bool audit = false;
    for (size_t i = 0; d && i < d->nheaders; i++)
        audit |= strcasecmp(d->headers[i].name, "Audit-Id") == 0;
    ok(d && !audit && d->nheaders == 4,
       "Content-Type, Etag, Vary, Cache-Control kept; no Audit-Id");
    disco_doc_unref(d);

    unsigned before = hits(&f, "/apis/apps/v1");
    ok(!disco_doc_get(f.d, "/apis/apps/v1", "application/json"), "a new key: a miss");
    want_path = "/apis/apps/v1";
    want_accept = "application/json";
    ok(run_until(&f, recorded, "recorded"), "then recorded");
    is_int(hits(&f, "/apis/apps/v1"), before + 1, "asked once");
    is_str(f.last_accept, "application/json", "with the client's Accept");
    d = disco_doc_get(f.d, "/apis/apps/v1", "application/json");
    ok(d && d->len == strlen(apps_v1) && !d->etag && d->content_type &&
           strcmp(d->content_type, "application/json") == 0,
       "the upstream's bytes and Content-Type");
    /* a reference outlives the record's replacement */
    set_route(&f, "/apis/apps/v1", 404, NULL, "404 page not found\n");
    want_failures = stats(&f).fetch_failures + 1;
    refresh(&f); /* the record was in use: asked again after the round */
    ok(run_until(&f, failed_more, "the record's 404"), "asked again (in use)");
    ok(d && memcmp(d->body, apps_v1, d->len) == 0, "a reference held stays valid");
    disco_doc_unref(d);
    ok(!disco_doc_get(f.d, "/apis/apps/v1", "application/json"), "a 404 is not served");

    unsigned reqs = f.requests;
    ok(!disco_doc_get(f.d, "/apis/nosuch.example.com/v1", NULL), "a group version not listed");
    ok(!disco_doc_get(f.d, "/apis/apps/v1/deployments", NULL), "not discovery");
    char big[DISCO_ACCEPT_MAX + 2];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    ok(!disco_doc_get(f.d, "/apis", big), "an Accept too long");
    for (int i = 0; i < 20; i++)
        event_base_loop(f.base, EVLOOP_NONBLOCK);
    is_int(f.requests, reqs, "none of them asked upstream");
    /* /version is copied too (the model does not need it) */
    want_path = "/version";
    want_accept = NULL;
    ok(!disco_doc_get(f.d, "/version", NULL) && run_until(&f, recorded, "/version"),
       "/version recorded");
    ok(stats(&f).docs >= 4, "the copy holds them");
    fake_fini(&f);
}

/* More keys than DISCO_COPY_MAX_DOCS: the least recently used go, the
 * model's own records stay. */
static void
test_bounds(void)
{
    struct fake f;
    fake_init(&f);
    aggregated_upstream(&f);
    fake_start(&f);
    run_until(&f, is_ready, "ready");
    uint64_t base = stats(&f).fetches;
    char accept[64];
    for (int i = 0; i < DISCO_COPY_MAX_DOCS + 50; i++) {
        snprintf(accept, sizeof(accept), "application/json;x=%d", i);
        disco_doc_get(f.d, "/version", accept);
    }
    snprintf(accept, sizeof(accept), "application/json;x=%d", DISCO_COPY_MAX_DOCS + 49);
    want_path = "/version";
    want_accept = accept;
    ok(run_until(&f, recorded, "the newest key recorded"), "the newest key recorded");
    ok(stats(&f).docs <= DISCO_COPY_MAX_DOCS, "at most DISCO_COPY_MAX_DOCS records");
    ok(stats(&f).fetches - base <= DISCO_COPY_MAX_DOCS + 50,
       "each key asked at most once (one evicted before its turn is not asked)");
    ok(disco_ready(f.d) && disco_find(f.d, "", "v1", "pods", NULL) == DISCO_PRESENT,
       "the model unaffected");
    refresh(&f);
    ok(stats(&f).refresh_failures == 0, "its records stayed (a round finds them)");
    fake_fini(&f);
}

/* The upstream away: rounds fail, the model and the copy stay (what the
 * upstream said last is still its last word). */
static void
test_upstream_away(void)
{
    struct fake f;
    fake_init(&f);
    aggregated_upstream(&f);
    fake_start(&f);
    run_until(&f, is_ready, "ready");
    want_path = "/apis/apps/v1";
    want_accept = "application/json";
    disco_doc_get(f.d, want_path, want_accept);
    ok(run_until(&f, recorded, "recorded"), "a client's key recorded");
    evhttp_free(f.http); /* the listening socket closes: connections are refused */
    f.http = NULL;
    uint64_t failed = stats(&f).refresh_failures;
    refresh(&f);
    is_int(stats(&f).refresh_failures, failed + 1, "the round fails");
    is_int(disco_find(f.d, "apps", "v1", "deployments", NULL), DISCO_PRESENT, "the model stays");
    ok(recorded(&f), "the copy still answers");
    want_failures = stats(&f).fetch_failures + 1;
    ok(run_until(&f, failed_more, "the record asked again"), "the record's own fetch failed too");
    ok(recorded(&f), "and still answers");
    fake_fini(&f);
}

int
main(void)
{
    TAP_RUN(test_aggregated);
    TAP_RUN(test_plain);
    TAP_RUN(test_failures);
    TAP_RUN(test_copy);
    TAP_RUN(test_upstream_away);
    TAP_RUN(test_bounds);
    return tap_done();
}
