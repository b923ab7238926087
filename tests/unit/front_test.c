/*
 * front_test.c — proxy/serve/front.c: the request stages (front.h), on kwc's
 * real HTTP server, with real parts behind them.
 *
 * Each request is a client on one end of a socketpair(AF_UNIX) whose other
 * end the server adopts (http_server_adopt), as in http_test.c. The parts
 * are the real ones: a store in a scratch LMDB dir with one JSON cache of
 * v1/pods that never starts (so kwc may answer its gets, lists and watches
 * and therefore authorizes them itself, but serve and the watch pool hand
 * them upstream: the cache is not synced), passthrough, delegated auth,
 * the access log's request metrics, /metrics.
 *
 * The upstream is a fake on an ephemeral loopback port (libevent's evhttp,
 * as in auth_test.c), driven by the same event_base: it answers TokenReviews
 * and SubjectAccessReviews from a small policy written below, and answers
 * anything else with 200, recording the path and the identity headers it
 * saw, so a test can tell whether a request went upstream and as whom.
 *
 * Expected statuses and Status bodies are written from kube-apiserver's
 * source (filters/authentication.go: 401 "Unauthorized";
 * responsewriters.forbiddenMessage for 403s; go-restful's 405), and kwc's
 * own texts from front.c's contract (the Host stage's 403). The loop runs
 * with EVLOOP_ONCE until the client holds a whole response, bounded by a
 * guard timer that only fires when something never answers. Never a sleep.
 */
#include "kwc/front.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kwc/access.h"
#include "kwc/auth.h"
#include "kwc/base.h"
#include "kwc/catalog.h"
#include "kwc/http.h"
#include "kwc/kubeconfig.h"
#include "kwc/metrics.h"
#include "kwc/passthrough.h"
#include "kwc/reflector.h"
#include "kwc/serve.h"
#include "kwc/store.h"
#include "kwc/upstream.h"
#include "kwc/watch.h"
#include "lmdbdir.h"
#include "tap.h"

#define GUARD_S 15 /* bound on one request; never reached when all is well */

#define ST_HEAD "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\","

/* ---- the fake upstream ---- */

struct fake {
    struct evhttp *http;
    int port;
    int token_reviews, sars, passed; /* requests seen, by kind */
    char path[512];                  /* the last passed-through request's */
    char imp_user[128], authorization[128];
    char imp_groups[256]; /* every Impersonate-Group, joined with "," */
};

/* The tokens the fake knows, and whom they name. */
static const char *
token_user(const char *token)
{
    if (strcmp(token, "tok-alice") == 0)
        return "alice";
    if (strcmp(token, "tok-admin") == 0)
        return "admin";
    return NULL;
}

static const char *
jstr(json_t *o, const char *path1, const char *path2)
{
    json_t *v = json_object_get(o, path1);
    if (path2)
        v = json_object_get(v, path2);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool
eq(const char *a, const char *b)
{
    return a && b && strcmp(a, b) == 0;
}

/*
 * The policy: admin may do anything; alice may get, list and watch pods in
 * "default" and impersonate the user bob; bob may list pods in "default".
 * Everything else is denied (with no reason: kube then adds none).
 */
static bool
allowed(json_t *spec)
{
    const char *user = jstr(spec, "user", NULL);
    json_t *ra = json_object_get(spec, "resourceAttributes");
    const char *verb = jstr(ra, "verb", NULL), *res = jstr(ra, "resource", NULL);
    const char *ns = jstr(ra, "namespace", NULL), *name = jstr(ra, "name", NULL);
    if (eq(user, "admin"))
        return true;
    if (!ra)
        return false; /* a non-resource URL (/metrics) */
    bool pods_default = eq(res, "pods") && eq(ns, "default");
    if (eq(user, "alice"))
        return (pods_default && (eq(verb, "get") || eq(verb, "list") || eq(verb, "watch"))) ||
               (eq(verb, "impersonate") && eq(res, "users") && eq(name, "bob"));
    if (eq(user, "bob"))
        return pods_default && eq(verb, "list");
    return false;
}

static void
reply_json(struct evhttp_request *req, int code, const char *body)
{
    struct evbuffer *out = evbuffer_new();
    evbuffer_add(out, body, strlen(body));
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    evhttp_send_reply(req, code, code == 201 ? "Created" : "OK", out);
    evbuffer_free(out);
}

static void
copy_header(struct evhttp_request *req, const char *name, char *out, size_t len)
{
    const char *v = evhttp_find_header(evhttp_request_get_input_headers(req), name);
    snprintf(out, len, "%s", v ? v : "");
}

static void
fake_handle(struct evhttp_request *req, void *arg)
{
    struct fake *f = arg;
    const char *uri = evhttp_request_get_uri(req);
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    char *body = xmalloc(len + 1);
    evbuffer_copyout(in, body, len);
    body[len] = '\0';
    json_t *doc = json_loads(body, 0, NULL);
    free(body);
    json_t *spec = json_object_get(doc, "spec");
    if (strcmp(uri, "/apis/authentication.k8s.io/v1/tokenreviews") == 0) {
        f->token_reviews++;
        const char *token = jstr(spec, "token", NULL);
        const char *user = token ? token_user(token) : NULL;
        char ans[512];
        if (user)
            snprintf(ans, sizeof(ans),
                     "{\"apiVersion\":\"authentication.k8s.io/v1\",\"kind\":\"TokenReview\","
                     "\"status\":{\"authenticated\":true,\"user\":{\"username\":\"%s\","
                     "\"groups\":[\"dev\",\"system:authenticated\"]}}}",
                     user);
        else
            snprintf(ans, sizeof(ans), "{\"status\":{\"authenticated\":false}}");
        reply_json(req, 201, ans);
    } else if (strcmp(uri, "/apis/authorization.k8s.io/v1/subjectaccessreviews") == 0) {
        f->sars++;
        reply_json(req, 201,
                   allowed(spec) ? "{\"status\":{\"allowed\":true}}"
                                 : "{\"status\":{\"allowed\":false}}");
    } else {
        f->passed++;
        snprintf(f->path, sizeof(f->path), "%s", uri);
        copy_header(req, "Impersonate-User", f->imp_user, sizeof(f->imp_user));
        copy_header(req, "Authorization", f->authorization, sizeof(f->authorization));
        f->imp_groups[0] = '\0';
        struct evkeyvalq *h = evhttp_request_get_input_headers(req);
        for (struct evkeyval *kv = h->tqh_first; kv; kv = kv->next.tqe_next)
            if (strcasecmp(kv->key, "Impersonate-Group") == 0) {
                size_t at = strlen(f->imp_groups);
                snprintf(f->imp_groups + at, sizeof(f->imp_groups) - at, "%s%s", at ? "," : "",
                         kv->value);
            }
        reply_json(req, 200, "{\"kind\":\"Fake\"}");
    }
    json_decref(doc);
}

/* ---- the environment: the parts app.c would build ---- */

struct env {
    struct event_base *base;
    struct fake fk;
    struct kcfg *k;
    struct up_client *up;
    char dir[64];
    struct store *st;
    struct refl_ingest *ing;
    struct catalog *cat;
    struct serve *serve;
    struct watch_pool *watch;
    struct auth *auth;
    struct metrics *m;
    struct access *acc;
    struct pt_options pt_short, pt_long;
    struct front *front;
    struct http_server *http;
    struct event *guard;
    bool timed_out;
};

static void
on_guard(evutil_socket_t fd, short what, void *arg)
{
    ((struct env *)arg)->timed_out = true;
}

static int
bound_port(evutil_socket_t fd)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    return ntohs(sa.sin_port);
}

/* --accept-hosts '^kwc\.example$' */
static bool
accept_one(const void *arg, const char *host)
{
    return strcmp(host, arg) == 0;
}

static void
on_done(void *arg, const struct hreq_done *d, void *note)
{
    access_finish(note, d);
}

static void
env_init(struct env *e, bool delegated)
{
    memset(e, 0, sizeof(*e));
    e->base = event_base_new();
    e->fk.http = evhttp_new(e->base);
    evhttp_set_gencb(e->fk.http, fake_handle, &e->fk);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(e->fk.http, "127.0.0.1", 0);
    if (!bs)
        abort();
    e->fk.port = bound_port(evhttp_bound_socket_get_fd(bs));
    e->k = xcalloc(1, sizeof(*e->k));
    e->k->server = xasprintf("http://127.0.0.1:%d", e->fk.port);
    struct up_options uo = {.connect_timeout_ms = 5000,
                            .header_timeout_ms = 10000,
                            .max_idle_conns = 8,
                            .max_conns = {[UP_POOL_PASSTHROUGH] = 8,
                                          [UP_POOL_CACHE] = 8,
                                          [UP_POOL_TOKENREVIEW] = 8,
                                          [UP_POOL_SAR] = 8}};
    char err[256] = "";
    if (up_client_new(e->base, e->k, &uo, &e->up, err, sizeof(err)) != 0) {
        printf("# up_client_new: %s\n", err);
        abort();
    }
    lmdbdir_make(e->dir, sizeof(e->dir), "front-test");
    struct store_options so;
    store_options_default(&so);
    so.map_size = 16 << 20;
    if (store_open(e->dir, &so, &e->st) != 0)
        abort();
    refl_ingest_new(e->base, e->st, NULL, &e->ing);
    struct catalog_options co = {
        .resources = "v1/pods", .protobuf = "none", .identity = e->k->server};
    if (catalog_new(e->base, e->up, e->ing, e->st, NULL, &co, &e->cat, err, sizeof(err)) != 0) {
        printf("# catalog_new: %s\n", err);
        abort();
    }
    e->pt_short = (struct pt_options){
        .max_request_buffer = 1 << 20, .max_response_buffer = 1 << 20, .strip_credentials = true};
    e->pt_long = e->pt_short;
    e->pt_long.long_running = true;
    struct serve_options so2 = {.too_large = DECIDE_TOO_LARGE_504,
                                .wait_ms = 1000,
                                .max_buffer = 1 << 20,
                                .up = e->up,
                                .pt = &e->pt_short};
    e->serve = serve_new(e->base, e->st, catalog_set(e->cat), &so2);
    struct watch_options wo = {.workers = 1,
                               .budget = 1 << 20,
                               .window_bytes = 1 << 20,
                               .bookmark_ms = 60000,
                               .wait_ms = 1000,
                               .too_large = DECIDE_TOO_LARGE_504};
    e->watch = watch_pool_new(e->base, e->st, catalog_set(e->cat), &wo);
    if (delegated) {
        struct auth_options ao = {.anonymous = false,
                                  .token_ttl_s = 120,
                                  .token_fail_ttl_s = 10,
                                  .allow_ttl_s = 300,
                                  .deny_ttl_s = 30,
                                  .max_entries = 1000};
        auth_new(e->base, e->up, &ao, &e->auth);
    }
    e->m = metrics_new();
    struct access_options aco = {.log = false, .level = LOG_DEBUG};
    e->acc = access_new(e->m, &aco);
    struct front_parts fp = {.base = e->base,
                             .cat = e->cat,
                             .serve = e->serve,
                             .watch = e->watch,
                             .up = e->up,
                             .pt_short = &e->pt_short,
                             .pt_long = &e->pt_long,
                             .tunnel_connect_timeout_ms = 5000,
                             .auth = e->auth,
                             .accept_host = accept_one,
                             .accept_host_arg = "kwc.example",
                             .metrics = e->m,
                             .access = e->acc};
    e->front = front_new(&fp);
    struct http_server_options ho = {0};
    if (http_server_new(e->base, &ho, front_on_request, e->front, &e->http, err, sizeof(err)) !=
        0) {
        printf("# http_server_new: %s\n", err);
        abort();
    }
    http_server_on_done(e->http, on_done, NULL);
    e->guard = evtimer_new(e->base, on_guard, e);
}

static void
env_fini(struct env *e)
{
    watch_pool_free(e->watch);
    http_server_free(e->http);
    front_free(e->front);
    serve_free(e->serve);
    auth_free(e->auth);
    access_free(e->acc);
    metrics_free(e->m);
    refl_ingest_free(e->ing);
    catalog_free(e->cat);
    up_client_free(e->up);
    store_close(e->st);
    lmdbdir_rm(e->dir);
    kcfg_free(e->k);
    evhttp_free(e->fk.http);
    event_free(e->guard);
    event_base_free(e->base);
}

/* ---- one request as a client ---- */

struct resp {
    int status;
    char *head; /* status line and headers, NUL-terminated */
    char *body;
    size_t blen;
};

static void
resp_free(struct resp *r)
{
    free(r->head);
    free(r->body);
    *r = (struct resp){0};
}

/* The value of a response header (first, case-insensitive), copied into out. */
static const char *
resp_header(const struct resp *r, const char *name, char *out, size_t len)
{
    size_t nl = strlen(name);
    for (const char *l = strstr(r->head, "\r\n"); l && l[2]; l = strstr(l + 2, "\r\n")) {
        const char *h = l + 2;
        if (strncasecmp(h, name, nl) == 0 && h[nl] == ':') {
            const char *v = h + nl + 1;
            while (*v == ' ')
                v++;
            const char *end = strstr(v, "\r\n");
            snprintf(out, len, "%.*s", (int)(end - v), v);
            return out;
        }
    }
    return NULL;
}

/* Is in[0..n) a whole response? Content-Length or chunked bodies (the
 * stages' answers and passthrough's); fills r when it is. */
static bool
parse_whole(const char *in, size_t n, struct resp *r)
{
    const char *end = memmem(in, n, "\r\n\r\n", 4);
    if (!end)
        return false;
    size_t hl = (size_t)(end - in) + 2;
    r->head = xmalloc(hl + 1);
    memcpy(r->head, in, hl);
    r->head[hl] = '\0';
    r->status = atoi(r->head + 9);
    const char *p = end + 4, *lim = in + n;
    char v[64];
    bool whole = false;
    if (resp_header(r, "Content-Length", v, sizeof(v))) {
        size_t cl = strtoul(v, NULL, 10);
        if ((size_t)(lim - p) >= cl) {
            r->body = xmalloc(cl + 1);
            memcpy(r->body, p, cl);
            r->body[cl] = '\0';
            r->blen = cl;
            whole = true;
        }
    } else if (resp_header(r, "Transfer-Encoding", v, sizeof(v)) && strcmp(v, "chunked") == 0) {
        struct {
            char *p;
            size_t n;
        } b = {xcalloc(1, n + 1), 0};
        for (;;) {
            const char *crlf = memmem(p, (size_t)(lim - p), "\r\n", 2);
            if (!crlf)
                break;
            size_t cn = strtoul(p, NULL, 16);
            const char *data = crlf + 2;
            if ((size_t)(lim - data) < cn + 2)
                break;
            if (cn == 0) {
                whole = true;
                break;
            }
            memcpy(b.p + b.n, data, cn);
            b.n += cn;
            p = data + cn + 2;
        }
        r->body = b.p;
        r->blen = b.n;
    }
    if (!whole)
        resp_free(r);
    return whole;
}

/* Send raw (a whole request) on a new connection and wait for one whole
 * response (status 0 when none came). */
static void
request(struct env *e, const char *raw, struct resp *out)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
        abort();
    http_server_adopt(e->http, sv[1], NULL, 0);
    size_t len = strlen(raw);
    if (send(sv[0], raw, len, MSG_NOSIGNAL) != (ssize_t)len)
        abort(); /* a small request fits the socket buffer */
    char *in = NULL;
    size_t n = 0;
    bool eof = false;
    *out = (struct resp){0};
    struct timeval tv = {GUARD_S, 0};
    e->timed_out = false;
    evtimer_add(e->guard, &tv);
    while (!e->timed_out && !eof) {
        event_base_loop(e->base, EVLOOP_ONCE);
        for (;;) {
            char buf[65536];
            ssize_t got = recv(sv[0], buf, sizeof(buf), 0);
            if (got > 0) {
                in = xrealloc(in, n + (size_t)got);
                memcpy(in + n, buf, (size_t)got);
                n += (size_t)got;
                continue;
            }
            if (got == 0 || (errno != EAGAIN && errno != EINTR))
                eof = true;
            break;
        }
        if (n && parse_whole(in, n, out))
            break;
    }
    evtimer_del(e->guard);
    if (e->timed_out)
        printf("# timed out waiting for a response to %.60s\n", raw);
    free(in);
    close(sv[0]);
    /* let the server see the close (bounded: nothing else is pending) */
    for (int i = 0; i < 8; i++)
        event_base_loop(e->base, EVLOOP_NONBLOCK);
}

/* GET path with the given extra header lines ("" for none). */
static void
get(struct env *e, const char *path, const char *headers, struct resp *out)
{
    char raw[2048];
    snprintf(raw, sizeof(raw), "GET %s HTTP/1.1\r\nHost: localhost:8001\r\n%s\r\n", path, headers);
    request(e, raw, out);
}

/* The Status body kube writes (one line, then Go's encoder's newline). */
static void
is_status(const struct resp *r, int code, const char *json, const char *what)
{
    char want[2048], what2[256], ct[128] = "";
    snprintf(want, sizeof(want), "%s\n", json);
    snprintf(what2, sizeof(what2), "%s: status", what);
    is_int(r->status, code, what2);
    snprintf(what2, sizeof(what2), "%s: Status body", what);
    is_str(r->body, want, what2);
    snprintf(what2, sizeof(what2), "%s: Content-Type", what);
    is_str(resp_header(r, "Content-Type", ct, sizeof(ct)), "application/json", what2);
}

/* ---- --auth none ---- */

static void
test_host_check(void)
{
    struct env e;
    env_init(&e, false);
    struct resp r;
    request(&e,
            "GET /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: evil.example:8001\r\n\r\n",
            &r);
    is_status(&r, 403,
              ST_HEAD "\"message\":\"host \\\"evil.example:8001\\\" is not allowed: kwc serves "
                      "plaintext HTTP to loopback names only (allow more with --accept-hosts "
                      "REGEX, or serve TLS)\",\"reason\":\"Forbidden\",\"code\":403}",
              "a name that is not loopback");
    is_int(e.fk.passed, 0, "the refused request never reached the upstream");
    resp_free(&r);

    request(&e, "GET /healthz HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n", &r);
    is_int(r.status, 403, "an address that is not loopback: refused, even for /healthz");
    resp_free(&r);

    static const char *const ok_hosts[] = {"localhost",       "LOCALHOST:1",  "localhost.",
                                           "127.0.0.1",       "127.9.9.9:80", "[::1]:8001",
                                           "kwc.example:8001"};
    for (size_t i = 0; i < KWC_ARRAY_LEN(ok_hosts); i++) {
        char raw[256], what[128];
        snprintf(raw, sizeof(raw), "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", ok_hosts[i]);
        request(&e, raw, &r);
        snprintf(what, sizeof(what), "Host %s is allowed (loopback, or --accept-hosts)",
                 ok_hosts[i]);
        is_int(r.status, 200, what);
        resp_free(&r);
    }
    request(&e, "GET /healthz HTTP/1.1\r\nHost: ::1\r\n\r\n", &r);
    is_int(r.status, 403, "an IPv6 address must be bracketed");
    resp_free(&r);
    env_fini(&e);
}

static void
test_local_endpoints(void)
{
    struct env e;
    env_init(&e, false);
    struct resp r;
    char v[128];
    get(&e, "/healthz", "", &r);
    is_int(r.status, 200, "/healthz");
    is_str(r.body, "ok", "/healthz: ok");
    is_str(resp_header(&r, "Content-Type", v, sizeof(v)), "text/plain; charset=utf-8",
           "/healthz: text");
    resp_free(&r);
    get(&e, "/healthz?verbose", "", &r);
    is_str(r.body, "[+]ping ok\nhealthz check passed\n", "/healthz?verbose names its check");
    resp_free(&r);
    get(&e, "/livez?verbose=1", "", &r);
    is_str(r.body, "[+]ping ok\nlivez check passed\n", "/livez?verbose");
    resp_free(&r);
    get(&e, "/readyz", "", &r);
    is_int(r.status, 200, "/readyz: a cache not started is not a check");
    is_str(r.body, "ok", "/readyz: ok");
    resp_free(&r);
    get(&e, "/readyz?verbose", "", &r);
    is_str(r.body, "[+]ping ok\nreadyz check passed\n", "/readyz?verbose");
    resp_free(&r);

    get(&e, "/metrics", "", &r);
    is_int(r.status, 200, "/metrics with --auth none");
    is_str(resp_header(&r, "Content-Type", v, sizeof(v)), METRICS_CONTENT_TYPE,
           "/metrics: Prometheus text");
    is_str(resp_header(&r, "Cache-Control", v, sizeof(v)), "no-cache, private",
           "/metrics: not cached");
    ok(r.body && strstr(r.body, "# TYPE kwc_requests_total counter"),
       "/metrics: the request counter");
    /* the five requests above, finished by the done callback */
    ok(r.body && strstr(r.body, "code=\"200\""), "/metrics: the requests before it were counted");
    resp_free(&r);
    is_int(e.fk.passed + e.fk.token_reviews + e.fk.sars, 0,
           "kwc's endpoints never ask the upstream");
    env_fini(&e);
}

static void
test_route_none(void)
{
    struct env e;
    env_init(&e, false);
    struct resp r;
    get(&e, "/api/v1/namespaces/default/configmaps?limit=5",
        "Authorization: Bearer tok-alice\r\nImpersonate-User: bob\r\n", &r);
    is_int(r.status, 200, "a resource kwc does not cache: passed through");
    is_str(r.body, "{\"kind\":\"Fake\"}", "passthrough: the upstream's body");
    is_int(e.fk.passed, 1, "passthrough: one request upstream");
    is_str(e.fk.path, "/api/v1/namespaces/default/configmaps?limit=5", "passthrough: its target");
    is_str(e.fk.imp_user, "", "--auth none: the caller's Impersonate-User is dropped");
    is_str(e.fk.authorization, "", "--auth none: the caller's Authorization is dropped");
    resp_free(&r);

    get(&e, "/api/v1/namespaces/default/pods", "", &r);
    is_int(r.status, 200, "a cached resource whose cache has not synced: passed through");
    is_str(e.fk.path, "/api/v1/namespaces/default/pods", "the cache's list went upstream");
    resp_free(&r);

    request(&e, "CONNECT /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: localhost\r\n\r\n", &r);
    is_status(&r, 405,
              ST_HEAD "\"message\":\"the server does not allow this method on the requested "
                      "resource\",\"reason\":\"MethodNotAllowed\",\"code\":405}",
              "CONNECT: go-restful's 405, never tunnelled");
    resp_free(&r);
    const char *bad_target =
        ST_HEAD "\"message\":\"the request URI is not a valid path and query\",\"reason\":"
                "\"BadRequest\",\"code\":400}";
    request(&e, "CONNECT localhost:443 HTTP/1.1\r\nHost: localhost:443\r\n\r\n", &r);
    is_status(&r, 400, bad_target, "CONNECT to an authority: no path");
    resp_free(&r);
    get(&e, "/api/v1/namespaces/%zz/pods", "", &r);
    is_status(&r, 400, bad_target, "a path that does not percent-decode");
    resp_free(&r);
    is_int(e.fk.passed, 2, "nothing else went upstream");
    env_fini(&e);
}

/* ---- --auth delegated ---- */

static void
test_authenticate(void)
{
    struct env e;
    env_init(&e, true);
    struct resp r;
    const char *unauthorized =
        ST_HEAD "\"message\":\"Unauthorized\",\"reason\":\"Unauthorized\",\"code\":401}";
    get(&e, "/api/v1/namespaces/default/configmaps", "", &r);
    is_status(&r, 401, unauthorized, "no credentials (anonymous off)");
    is_int(e.fk.token_reviews, 0, "no token: no TokenReview");
    resp_free(&r);
    get(&e, "/api/v1/namespaces/default/configmaps", "Authorization: Bearer tok-nobody\r\n", &r);
    is_status(&r, 401, unauthorized, "a token the upstream does not know");
    is_int(e.fk.token_reviews, 1, "one TokenReview");
    resp_free(&r);
    get(&e, "/metrics", "", &r);
    is_status(&r, 401, unauthorized, "/metrics needs an identity");
    resp_free(&r);
    is_int(e.fk.passed, 0, "nothing unauthenticated went upstream");

    get(&e, "/healthz", "", &r);
    is_int(r.status, 200, "/healthz needs no identity");
    resp_free(&r);
    get(&e, "/readyz?verbose", "", &r);
    is_str(r.body, "[+]ping ok\nreadyz check passed\n", "/readyz needs no identity");
    resp_free(&r);
    request(&e, "GET /healthz HTTP/1.1\r\nHost: evil.example\r\n\r\n", &r);
    is_int(r.status, 403, "the Host check comes before authentication");
    resp_free(&r);
    is_int(e.fk.token_reviews, 1, "...and asks nobody");
    env_fini(&e);
}

static void
test_authorize(void)
{
    struct env e;
    env_init(&e, true);
    struct resp r;
    get(&e, "/api/v1/namespaces/kube-system/pods", "Authorization: Bearer tok-alice\r\n", &r);
    is_status(&r, 403,
              ST_HEAD "\"message\":\"pods is forbidden: User \\\"alice\\\" cannot list resource "
                      "\\\"pods\\\" in API group \\\"\\\" in the namespace \\\"kube-system\\\"\","
                      "\"reason\":\"Forbidden\",\"details\":{\"kind\":\"pods\"},\"code\":403}",
              "a cached list kwc may answer, denied: kube's 403");
    is_int(e.fk.sars, 1, "one SubjectAccessReview");
    is_int(e.fk.passed, 0, "the denied list never went upstream");
    resp_free(&r);

    get(&e, "/api/v1/namespaces/kube-system/pods/p1", "Authorization: Bearer tok-alice\r\n", &r);
    is_status(&r, 403,
              ST_HEAD "\"message\":\"pods \\\"p1\\\" is forbidden: User \\\"alice\\\" cannot get "
                      "resource \\\"pods\\\" in API group \\\"\\\" in the namespace "
                      "\\\"kube-system\\\"\",\"reason\":\"Forbidden\",\"details\":{\"name\":"
                      "\"p1\",\"kind\":\"pods\"},\"code\":403}",
              "a cached get, denied");
    resp_free(&r);

    get(&e, "/metrics", "Authorization: Bearer tok-alice\r\n", &r);
    is_status(&r, 403,
              ST_HEAD "\"message\":\"forbidden: User \\\"alice\\\" cannot get path "
                      "\\\"/metrics\\\"\",\"reason\":\"Forbidden\",\"details\":{},\"code\":403}",
              "/metrics denied: a non-resource URL");
    resp_free(&r);
    get(&e, "/metrics", "Authorization: Bearer tok-admin\r\n", &r);
    is_int(r.status, 200, "/metrics allowed");
    ok(r.body && strstr(r.body, "kwc_requests_total"), "/metrics allowed: the metrics");
    resp_free(&r);

    int sars = e.fk.sars;
    get(&e, "/api/v1/namespaces/default/pods", "Authorization: Bearer tok-alice\r\n", &r);
    is_int(r.status, 200, "a cached list, allowed: routed (the cache has not synced: upstream)");
    is_int(e.fk.sars, sars + 1, "kwc asked whether alice may list");
    is_str(e.fk.path, "/api/v1/namespaces/default/pods", "the allowed list went upstream");
    is_str(e.fk.imp_user, "alice", "...acting as alice (Impersonate-User)");
    is_str(e.fk.imp_groups, "dev,system:authenticated", "...with her groups");
    is_str(e.fk.authorization, "", "...never with her token");
    resp_free(&r);

    sars = e.fk.sars;
    get(&e, "/api/v1/namespaces/kube-system/configmaps", "Authorization: Bearer tok-alice\r\n", &r);
    is_int(r.status, 200, "a resource kwc does not cache: the upstream decides");
    is_int(e.fk.sars, sars, "no SubjectAccessReview from kwc for it");
    is_str(e.fk.path, "/api/v1/namespaces/kube-system/configmaps", "it went upstream");
    is_str(e.fk.imp_user, "alice", "...as alice");
    resp_free(&r);
    env_fini(&e);
}

static void
test_impersonate(void)
{
    struct env e;
    env_init(&e, true);
    struct resp r;
    get(&e, "/api/v1/namespaces/default/pods",
        "Authorization: Bearer tok-alice\r\nImpersonate-User: carol\r\n", &r);
    is_status(&r, 403,
              ST_HEAD "\"message\":\"users \\\"carol\\\" is forbidden: User \\\"alice\\\" cannot "
                      "impersonate resource \\\"users\\\" in API group \\\"\\\" at the cluster "
                      "scope\",\"reason\":\"Forbidden\",\"details\":{\"name\":\"carol\",\"kind\":"
                      "\"users\"},\"code\":403}",
              "impersonating a user alice may not: refused before authorization");
    is_int(e.fk.sars, 1, "one SubjectAccessReview: the impersonation, not the list");
    is_int(e.fk.passed, 0, "the refused request never went upstream");
    resp_free(&r);

    get(&e, "/api/v1/namespaces/default/pods",
        "Authorization: Bearer tok-alice\r\nImpersonate-User: bob\r\n", &r);
    is_int(r.status, 200, "impersonating bob (allowed), who may list: routed");
    is_int(e.fk.sars, 3, "two more SubjectAccessReviews: impersonate bob, then bob's list");
    is_str(e.fk.imp_user, "bob", "the list went upstream as bob");
    /* kube's impersonation filter: a user impersonated without groups is
     * in system:authenticated, and in none of the caller's groups */
    is_str(e.fk.imp_groups, "system:authenticated", "...in system:authenticated only");
    resp_free(&r);

    get(&e, "/api/v1/namespaces/default/pods/p1",
        "Authorization: Bearer tok-alice\r\nImpersonate-User: bob\r\n", &r);
    is_status(&r, 403,
              ST_HEAD "\"message\":\"pods \\\"p1\\\" is forbidden: User \\\"bob\\\" cannot get "
                      "resource \\\"pods\\\" in API group \\\"\\\" in the namespace "
                      "\\\"default\\\"\",\"reason\":\"Forbidden\",\"details\":{\"name\":\"p1\","
                      "\"kind\":\"pods\"},\"code\":403}",
              "authorization asks about the impersonated user, not the caller");
    resp_free(&r);
    is_int(e.fk.passed, 1, "only the allowed list went upstream");
    env_fini(&e);
}

int
main(void)
{
    TAP_RUN(test_host_check);
    TAP_RUN(test_local_endpoints);
    TAP_RUN(test_route_none);
    TAP_RUN(test_authenticate);
    TAP_RUN(test_authorize);
    TAP_RUN(test_impersonate);
    return tap_done();
}
