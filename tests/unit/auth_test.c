/*
 * auth_test.c — proxy/identity/auth.c: delegated authentication and
 * authorization, the reviews and the caches of their answers (the pure wire
 * formats and the 403 text are authwire_test's, the cache's expiry, eviction
 * and coalescing ttlcache_test's).
 *
 * The asynchronous paths run against a fake upstream (authfx.h): libevent's
 * evhttp on an ephemeral loopback port, driven by the same event_base as kwc's
 * upstream client (the one socket in this test: the upstream client speaks
 * only HTTP over TCP). It answers TokenReviews and SubjectAccessReviews,
 * counts them, and can hold answers back until the test releases them. The
 * loop runs with EVLOOP_ONCE until the callbacks the test waits for have
 * run, bounded by a guard timer. No test waits on the clock: a TTL runs out
 * on the test's own (auth_options.clock).
 */
#include "kwc/auth.h"

#include "kwc/base.h"
#include "kwc/kubeconfig.h"
#include "kwc/upstream.h"
#include "authfx.h"
#include "tap.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <netinet/in.h>
#include <openssl/x509.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- users and certificates ---- */

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

/* ---- the environment of one async test ---- */

struct env {
    struct event_base *base;
    struct fake f;
    struct kcfg *k;
    struct up_client *up;
    struct auth *a;
    struct event *guard;
    bool timed_out;
};

static void
on_guard(evutil_socket_t fd, short what, void *arg)
{
    ((struct env *)arg)->timed_out = true;
}

static const struct auth_options default_opts = {.anonymous = false,
                                                 .token_ttl_s = 120,
                                                 .token_fail_ttl_s = 10,
                                                 .allow_ttl_s = 300,
                                                 .deny_ttl_s = 30,
                                                 .max_entries = 1000};

static void
env_init(struct env *e, const struct auth_options *o, bool refused)
{
    memset(e, 0, sizeof(*e));
    e->base = event_base_new();
    fake_init(&e->f, e->base);
    e->k = xcalloc(1, sizeof(*e->k));
    e->k->server = xasprintf("http://127.0.0.1:%d", refused ? dead_port() : e->f.port);
    struct up_options uo = {
        .connect_timeout_ms = 5000, .header_timeout_ms = 10000, .max_idle_conns = 8};
    char err[256];
    if (up_client_new(e->base, e->k, &uo, &e->up, err, sizeof(err)) != 0)
        printf("# up_client_new: %s\n", err);
    auth_new(e->base, e->up, o ? o : &default_opts, &e->a);
    e->guard = evtimer_new(e->base, on_guard, e);
}

static void
env_fini(struct env *e)
{
    auth_free(e->a);
    up_client_free(e->up);
    kcfg_free(e->k);
    fake_fini(&e->f);
    event_free(e->guard);
    event_base_free(e->base);
}

/* Run the loop until *n reaches want (or the 15 s guard fires: a failure). */
static void
run_until(struct env *e, const int *n, int want)
{
    struct timeval tv = {15, 0};
    e->timed_out = false;
    evtimer_add(e->guard, &tv);
    while (*n < want && !e->timed_out)
        event_base_loop(e->base, EVLOOP_ONCE);
    evtimer_del(e->guard);
    if (e->timed_out)
        printf("# timed out waiting (%d of %d)\n", *n, want);
}

/* Run the loop until the upstream client has no transfer left. */
static void
run_until_idle(struct env *e)
{
    struct timeval tv = {15, 0};
    struct up_stats us;
    e->timed_out = false;
    evtimer_add(e->guard, &tv);
    for (up_client_stats(e->up, &us); us.active && !e->timed_out; up_client_stats(e->up, &us))
        event_base_loop(e->base, EVLOOP_ONCE);
    evtimer_del(e->guard);
}

struct ures {
    int calls, status;
    char name[64];
    size_t ngroups;
    char last_group[64];
    bool from_token;
};

static int user_calls; /* every on_user call */

static void
on_user(void *arg, int status, struct auth_user *u)
{
    struct ures *r = arg;
    user_calls++;
    r->calls++;
    r->status = status;
    snprintf(r->name, sizeof(r->name), "%s", u ? u->name : "");
    r->ngroups = u ? u->ngroups : 0;
    snprintf(r->last_group, sizeof(r->last_group), "%s",
             u && u->ngroups ? u->groups[u->ngroups - 1] : "");
    r->from_token = u && u->from_token;
}

struct dres {
    int calls;
    enum auth_decision d;
    char reason[512];
};

static void
on_decision(void *arg, enum auth_decision d, const char *reason)
{
    struct dres *r = arg;
    r->calls++;
    r->d = d;
    snprintf(r->reason, sizeof(r->reason), "%s", reason);
}

/* The caches' clock in the tests that let a TTL run out (seconds). */
static double
test_clock(void *arg)
{
    return *(const double *)arg;
}

static void
test_token_cache(void)
{
    double now = 1000;
    struct auth_options o = default_opts;
    /* a TTL below a second, as --authentication-token-webhook-cache-ttl
     * 500ms gives it: kept, not truncated to 0 (no caching) */
    o.token_ttl_s = 0.5;
    o.token_fail_ttl_s = 1;
    o.clock = test_clock;
    o.clock_arg = &now;
    struct env e;
    env_init(&e, &o, false);
    struct ures r = {0};
    struct auth_wait *w = auth_authenticate(e.a, NULL, "Bearer good-1", NULL, on_user, &r);
    ok(w != NULL, "a token review is pending");
    is_int(r.calls, 0, "no callback from inside auth_authenticate");
    run_until(&e, &r.calls, 1);
    is_int(r.status, 0, "authenticated");
    is_str(r.name, "alice", "user from status.user.username");
    is_int(r.ngroups, 2, "dev + system:authenticated");
    is_str(r.last_group, "system:authenticated", "the authenticated group adder ran");
    ok(r.from_token, "from_token");
    is_str(e.f.last_ctype, "application/json", "the review is sent as JSON");

    w = auth_authenticate(e.a, NULL, "Bearer good-1", NULL, on_user, &r);
    ok(w == NULL && r.calls == 2, "cached: answered at once");
    is_int(e.f.token_reviews, 1, "a cached token needs no second review");

    /* rejected: 401, cached for token_fail_ttl, no anonymous fallback */
    struct ures bad = {0};
    auth_authenticate(e.a, NULL, "Bearer nope", NULL, on_user, &bad);
    run_until(&e, &bad.calls, 1);
    is_int(bad.status, 401, "a rejected token is a 401");
    auth_authenticate(e.a, NULL, "Bearer nope", NULL, on_user, &bad);
    is_int(bad.calls, 2, "the rejection is cached");
    is_int(e.f.token_reviews, 2, "one review per token");

    now += 0.499;
    ok(auth_authenticate(e.a, NULL, "Bearer good-1", NULL, on_user, &r) == NULL && r.calls == 3,
       "cached until its TTL (0.5 s) is out");
    now += 0.501;
    auth_authenticate(e.a, NULL, "Bearer good-1", NULL, on_user, &r);
    run_until(&e, &r.calls, 4);
    is_int(e.f.token_reviews, 3, "an expired entry is reviewed again");
    is_int(r.status, 0, "and still authenticated");
    auth_authenticate(e.a, NULL, "Bearer nope", NULL, on_user, &bad);
    run_until(&e, &bad.calls, 3);
    is_int(e.f.token_reviews, 4, "an expired rejection is reviewed again");
    is_int(bad.status, 401, "and still rejected");

    struct auth_stats st;
    auth_stats(e.a, &st);
    is_int(st.token_reviews, 4, "stats: 4 reviews");
    is_int(st.token_cache_hits, 3, "stats: 3 cache hits");
    is_int(st.authn_token, 4, "stats: 4 token users");
    is_int(st.authn_denied, 3, "stats: 3 denied");
    env_fini(&e);
}

/* An allowed answer is cached allow_ttl, a denied one deny_ttl, on the
 * caches' clock. */
static void
test_sar_ttls(void)
{
    double now = 5000;
    struct auth_options o = default_opts; /* allow 300 s, deny 30 s */
    o.clock = test_clock;
    o.clock_arg = &now;
    struct env e;
    env_init(&e, &o, false);
    struct auth_user *u = mk_user("jane", "");
    struct auth_attrs get = {.resource_request = true,
                             .verb = "get",
                             .version = "v1",
                             .resource = "pods",
                             .namespace_ = "default",
                             .name = "p1"};
    struct auth_attrs del = get;
    del.verb = "delete";
    struct dres a = {0}, d = {0};
    auth_authorize(e.a, u, &get, NULL, on_decision, &a);
    auth_authorize(e.a, u, &del, NULL, on_decision, &d);
    run_until(&e, &a.calls, 1);
    run_until(&e, &d.calls, 1);
    is_int(a.d, AUTH_ALLOW, "allowed");
    is_int(d.d, AUTH_DENY, "denied");
    is_int(e.f.sars, 2, "two questions asked");

    now += 29.999;
    ok(auth_authorize(e.a, u, &del, NULL, on_decision, &d) == NULL,
       "the denial cached at 29.999 s");
    now += 0.001;
    ok(auth_authorize(e.a, u, &del, NULL, on_decision, &d) != NULL, "not at 30 s (deny_ttl)");
    run_until(&e, &d.calls, 3);
    ok(auth_authorize(e.a, u, &get, NULL, on_decision, &a) == NULL,
       "the allow still cached at 30 s");
    now += 269.999;
    ok(auth_authorize(e.a, u, &get, NULL, on_decision, &a) == NULL,
       "the allow cached at 299.999 s");
    now += 0.001;
    ok(auth_authorize(e.a, u, &get, NULL, on_decision, &a) != NULL, "not at 300 s (allow_ttl)");
    run_until(&e, &a.calls, 4);
    is_int(a.d, AUTH_ALLOW, "asked again: allowed");
    is_int(e.f.sars, 4, "each asked twice");
    auth_user_unref(u);
    env_fini(&e);
}

static void
test_token_coalesced(void)
{
    struct env e;
    env_init(&e, NULL, false);
    e.f.hold = true;
    struct ures r[10] = {{0}};
    for (int i = 0; i < 10; i++)
        ok(auth_authenticate(e.a, NULL, "Bearer good-2", NULL, on_user, &r[i]) != NULL, "pending");
    run_until(&e, &e.f.token_reviews, 1);
    fake_release(&e.f);
    int base = user_calls;
    run_until(&e, &user_calls, base + 10);
    int total = 0;
    for (int i = 0; i < 10; i++)
        total += r[i].calls == 1;
    is_int(total, 10, "every waiter called back once");
    (void)base;
    is_int(e.f.token_reviews, 1, "10 concurrent reviews of one token: 1 request");
    env_fini(&e);
}

static void
test_anonymous_and_cert(void)
{
    struct auth_options o = default_opts;
    o.anonymous = true;
    struct env e;
    env_init(&e, &o, false);
    struct ures r = {0};
    ok(auth_authenticate(e.a, NULL, NULL, NULL, on_user, &r) == NULL, "anonymous: at once");
    is_int(r.status, 0, "anonymous allowed");
    is_str(r.name, "system:anonymous", "system:anonymous");
    is_str(r.last_group, "system:unauthenticated", "in system:unauthenticated only");
    is_int(r.ngroups, 1, "one group");
    auth_authenticate(e.a, NULL, "Basic dXNlcg==", NULL, on_user, &r);
    is_str(r.name, "system:anonymous", "not a bearer token: anonymous");

    const char *f[] = {"CN", "admin", "O", "system:masters"};
    X509 *c = mk_cert(f, KWC_ARRAY_LEN(f));
    ok(auth_authenticate(e.a, c, "Bearer good-3", NULL, on_user, &r) == NULL, "cert: at once");
    is_str(r.name, "admin", "the certificate wins over the token");
    is_int(e.f.token_reviews, 0, "no review for a certificate user");
    X509_free(c);

    struct ures bad = {0};
    auth_authenticate(e.a, NULL, "Bearer nope", NULL, on_user, &bad);
    run_until(&e, &bad.calls, 1);
    is_int(bad.status, 401, "a rejected token is 401 even with anonymous on");
    struct auth_stats st;
    auth_stats(e.a, &st);
    is_int(st.authn_anonymous, 2, "stats: anonymous");
    is_int(st.authn_cert, 1, "stats: cert");
    env_fini(&e);

    env_init(&e, NULL, false);
    struct ures n = {0};
    ok(auth_authenticate(e.a, NULL, NULL, NULL, on_user, &n) == NULL, "no credentials: at once");
    is_int(n.status, 401, "no credentials, no anonymous: 401");
    env_fini(&e);
}

static void
test_sar_coalesced(void)
{
    struct env e;
    env_init(&e, NULL, false);
    struct auth_user *u = mk_user("jane", "");
    struct auth_attrs at = {.resource_request = true,
                            .verb = "get",
                            .version = "v1",
                            .resource = "pods",
                            .namespace_ = "default",
                            .name = "p1"};
    e.f.hold = true;
    static struct dres r[100];
    memset(r, 0, sizeof(r));
    int pending = 0;
    for (int i = 0; i < 100; i++)
        pending += auth_authorize(e.a, u, &at, NULL, on_decision, &r[i]) != NULL;
    is_int(pending, 100, "100 waits");
    run_until(&e, &e.f.sars, 1);
    fake_release(&e.f);
    run_until(&e, &r[99].calls, 1);
    int calls = 0, allowed = 0;
    for (int i = 0; i < 100; i++) {
        calls += r[i].calls;
        allowed += r[i].d == AUTH_ALLOW;
    }
    is_int(calls, 100, "every waiter called back once");
    is_int(allowed, 100, "all allowed");
    is_int(e.f.sars, 1, "100 concurrent identical SARs send 1 request");
    struct auth_stats st;
    auth_stats(e.a, &st);
    is_int(st.sar_sent, 1, "stats: sar_sent 1");
    is_int(st.sar_coalesced, 99, "stats: sar_coalesced 99");

    struct dres again = {0};
    ok(auth_authorize(e.a, u, &at, NULL, on_decision, &again) == NULL, "cached: at once");
    is_int(again.d, AUTH_ALLOW, "cached allow");

    /* another question is another request; a denial carries its reason */
    struct auth_attrs del = at;
    del.verb = "delete";
    struct dres d = {0};
    auth_authorize(e.a, u, &del, NULL, on_decision, &d);
    run_until(&e, &d.calls, 1);
    is_int(d.d, AUTH_DENY, "denied");
    is_str(d.reason, "no deleting", "status.reason");
    is_int(e.f.sars, 2, "a different question is asked");
    auth_authorize(e.a, u, &del, NULL, on_decision, &d);
    is_int(d.calls, 2, "the denial is cached");
    is_int(e.f.sars, 2, "not asked again");
    auth_user_unref(u);
    env_fini(&e);
}

static void
test_cancel(void)
{
    struct env e;
    env_init(&e, NULL, false);
    struct auth_user *u = mk_user("jane", "");
    struct auth_attrs at = {
        .resource_request = true, .verb = "list", .version = "v1", .resource = "pods"};
    e.f.hold = true;
    struct dres a = {0}, b = {0};
    struct auth_wait *wa = auth_authorize(e.a, u, &at, NULL, on_decision, &a);
    struct auth_wait *wb = auth_authorize(e.a, u, &at, NULL, on_decision, &b);
    ok(wa && wb, "two waits");
    auth_cancel(wa);
    run_until(&e, &e.f.sars, 1);
    fake_release(&e.f);
    run_until(&e, &b.calls, 1);
    is_int(a.calls, 0, "cancelled before the answer: no callback");
    is_int(b.calls, 1, "the other waiter is answered");

    /* the last waiter cancelled: the review is cancelled too (its
     * connection closed upstream), nothing is cached, the next asks again */
    struct auth_attrs at2 = at;
    at2.namespace_ = "other";
    e.f.hold = true;
    struct dres c = {0}, c2 = {0};
    struct auth_wait *wc = auth_authorize(e.a, u, &at2, NULL, on_decision, &c);
    struct auth_wait *wc2 = auth_authorize(e.a, u, &at2, NULL, on_decision, &c2);
    run_until(&e, &e.f.sars, 2);
    struct up_pool_stats ps0, ps1;
    up_client_pool_stats(e.up, UP_POOL_SAR, &ps0);
    auth_cancel(wc);
    struct auth_stats st;
    auth_stats(e.a, &st);
    is_int(st.reviews_cancelled, 0, "a coalesced waiter left: the review goes on");
    auth_cancel(wc2);
    auth_stats(e.a, &st);
    is_int(st.reviews_cancelled, 1, "its last waiter left: cancelled");
    run_until_idle(&e);
    up_client_pool_stats(e.up, UP_POOL_SAR, &ps1);
    ok(ps0.conns >= 1, "the review had a connection");
    is_int(ps1.conns, ps0.conns - 1, "its connection was closed");
    /* (evhttp keeps a request whose client left: the reply just frees it) */
    fake_release(&e.f);
    struct dres probe = {0};
    ok(auth_authorize(e.a, u, &at2, NULL, on_decision, &probe) != NULL,
       "nothing was cached from it");
    run_until(&e, &probe.calls, 1);
    is_int(probe.d, AUTH_ALLOW, "asked again and answered");
    is_int(c.calls + c2.calls, 0, "no callback for the cancelled waits");
    is_int(e.f.sars, 3, "its review was repeated");

    /* token reviews too */
    e.f.hold = true;
    struct ures t = {0};
    auth_cancel(auth_authenticate(e.a, NULL, "Bearer good-9", NULL, on_user, &t));
    auth_stats(e.a, &st);
    is_int(st.reviews_cancelled, 2, "a token review without waiters is cancelled");
    fake_release(&e.f);
    struct ures t2 = {0};
    auth_authenticate(e.a, NULL, "Bearer good-9", NULL, on_user, &t2);
    run_until(&e, &t2.calls, 1);
    is_int(t.calls, 0, "cancelled token wait: no callback");
    is_int(t2.status, 0, "a later request is answered");
    auth_user_unref(u);
    env_fini(&e);
}

/* fd 2 into a file while errors are provoked: the token must not appear */
static int saved_stderr = -1;
static FILE *captured;

static void
capture_start(void)
{
    fflush(stderr);
    captured = tmpfile();
    saved_stderr = dup(2);
    dup2(fileno(captured), 2);
}

static char *
capture_end(void)
{
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    long n = ftell(captured);
    if (n < 0)
        n = 0;
    char *s = xcalloc(1, (size_t)n + 1);
    rewind(captured);
    size_t got = fread(s, 1, (size_t)n, captured);
    s[got] = '\0';
    fclose(captured);
    return s;
}

static void
errors_case(enum fake_mode mode, bool refused, const char *what)
{
    struct env e;
    env_init(&e, NULL, refused);
    e.f.mode = mode;
    struct ures r = {0};
    auth_authenticate(e.a, NULL, "Bearer good-SECRET-TOKEN-42", NULL, on_user, &r);
    run_until(&e, &r.calls, 1);
    char msg[200];
    snprintf(msg, sizeof(msg), "%s: token -> 401", what);
    is_int(r.status, 401, msg);
    auth_authenticate(e.a, NULL, "Bearer good-SECRET-TOKEN-42", NULL, on_user, &r);
    snprintf(msg, sizeof(msg), "%s: the failure is cached (token_fail_ttl)", what);
    ok(r.calls == 2 && r.status == 401, msg);

    struct auth_user *u = mk_user("jane", "");
    struct auth_attrs at = {.resource_request = true,
                            .verb = "get",
                            .version = "v1",
                            .resource = "pods",
                            .namespace_ = "x",
                            .name = "y"};
    struct dres d = {0};
    auth_authorize(e.a, u, &at, NULL, on_decision, &d);
    run_until(&e, &d.calls, 1);
    snprintf(msg, sizeof(msg), "%s: SAR -> AUTH_ERROR", what);
    is_int(d.d, AUTH_ERROR, msg);
    ok(d.reason[0] != '\0', "with a message");
    auth_authorize(e.a, u, &at, NULL, on_decision, &d);
    run_until(&e, &d.calls, 2);
    snprintf(msg, sizeof(msg), "%s: errors are not cached", what);
    if (!refused)
        is_int(e.f.sars, 2, msg);
    else
        is_int(d.d, AUTH_ERROR, msg);
    struct auth_stats st;
    auth_stats(e.a, &st);
    is_int(st.authz_errors, 2, "stats: authz_errors");
    ok(st.token_review_errors >= 1, "stats: token_review_errors");
    auth_user_unref(u);
    env_fini(&e);
}

/* review_timeout_ms: a review the upstream holds ends at its deadline like
 * a failed one (401; AUTH_ERROR), its transfer ends, and nothing is cached
 * from it: the next request asks again. The deadline is a real timer of
 * 100 ms (the upstream never answers: the outcome does not depend on it). */
static void
test_review_timeout(void)
{
    struct auth_options o = default_opts;
    o.review_timeout_ms = 100;
    struct env e;
    env_init(&e, &o, false);
    e.f.hold = true;
    struct ures r1 = {0}, r2 = {0};
    ok(auth_authenticate(e.a, NULL, "Bearer good-t", NULL, on_user, &r1) != NULL, "pending");
    ok(auth_authenticate(e.a, NULL, "Bearer good-t", NULL, on_user, &r2) != NULL,
       "a second waiter joins");
    capture_start();
    run_until(&e, &r2.calls, 1);
    char *log = capture_end();
    is_int(r1.calls + r2.calls, 2, "both waiters answered");
    is_int(r1.status, 401, "a review past its deadline: 401, as a failed review");
    is_int(r2.status, 401, "the coalesced waiter too");
    ok(strstr(log, "--review-timeout") != NULL, "logged, naming the flag");
    free(log);
    struct auth_stats st;
    auth_stats(e.a, &st);
    is_int(st.reviews_timed_out, 1, "stats: one timed out");
    is_int(e.f.token_reviews, 1, "one review was asked");
    run_until_idle(&e);
    struct up_pool_stats ps;
    up_client_pool_stats(e.up, UP_POOL_TOKENREVIEW, &ps);
    is_int(ps.active, 0, "its transfer ended");
    fake_release(&e.f);
    struct ures r3 = {0};
    ok(auth_authenticate(e.a, NULL, "Bearer good-t", NULL, on_user, &r3) != NULL,
       "nothing was cached: asked again");
    run_until(&e, &r3.calls, 1);
    is_int(r3.status, 0, "and answered");
    is_str(r3.name, "alice", "as the upstream says");

    /* authorization: AUTH_ERROR (the caller's 500), not cached */
    struct auth_user *u = mk_user("alice", "u1");
    struct auth_attrs at = {.resource_request = true,
                            .verb = "get",
                            .version = "v1",
                            .resource = "pods",
                            .namespace_ = "default",
                            .name = "p"};
    e.f.hold = true;
    struct dres d = {0};
    ok(auth_authorize(e.a, u, &at, NULL, on_decision, &d) != NULL,
       "a SubjectAccessReview is pending");
    capture_start();
    run_until(&e, &d.calls, 1);
    free(capture_end());
    is_int(d.d, AUTH_ERROR, "past its deadline: an authorization error");
    ok(strstr(d.reason, "--review-timeout") != NULL, "its reason says why");
    fake_release(&e.f);
    struct dres d2 = {0};
    ok(auth_authorize(e.a, u, &at, NULL, on_decision, &d2) != NULL, "not cached: asked again");
    run_until(&e, &d2.calls, 1);
    is_int(d2.d, AUTH_ALLOW, "and answered");
    auth_stats(e.a, &st);
    is_int(st.reviews_timed_out, 2, "stats: two timed out");
    auth_user_unref(u);
    env_fini(&e);
}

/* max_reviews_per_source: a source holds at most its share of TokenReviews;
 * past it a token that needs a new review is answered 429 at once, while a
 * token already under review still joins it and other sources are not held
 * back; a review that ends gives its source the room back. */
/* Rejected reviews per source: 2 x max_reviews_per_source TokenReviews the
 * upstream rejects within a second, and the source's next new token is
 * answered 429 without a review until that second has passed; a cached
 * rejection, another source and a source without a key are not held back. */
static void
test_source_rejections(void)
{
    double now = 1000;
    struct auth_options o = default_opts;
    o.max_reviews_per_source = 2; /* 4 rejections a second */
    o.clock = test_clock;
    o.clock_arg = &now;
    struct env e;
    env_init(&e, &o, false);
    struct src_key a = src4(2), b = src4(3);
    struct ures r[8] = {{0}};
    char tok[32];
    for (int i = 0; i < 4; i++) {
        snprintf(tok, sizeof(tok), "Bearer bogus-%d", i);
        ok(auth_authenticate(e.a, NULL, tok, &a, on_user, &r[i]) != NULL, "a: a review");
        run_until(&e, &r[i].calls, 1);
        is_int(r[i].status, 401, "rejected: 401");
    }
    is_int(e.f.token_reviews, 4, "four reviews asked");
    struct ures x = {0};
    ok(auth_authenticate(e.a, NULL, "Bearer bogus-4", &a, on_user, &x) == NULL && x.status == 429,
       "a: the fifth new token in the second: 429 at once");
    is_int(e.f.token_reviews, 4, "...without a review");
    struct ures c = {0};
    ok(auth_authenticate(e.a, NULL, "Bearer bogus-0", &a, on_user, &c) == NULL && c.status == 401,
       "a: a rejection cached: still its 401");
    struct ures y = {0};
    ok(auth_authenticate(e.a, NULL, "Bearer good-b", &b, on_user, &y) != NULL,
       "b: not held back by a");
    run_until(&e, &y.calls, 1);
    is_int(y.status, 0, "b: authenticated");
    struct ures z = {0};
    ok(auth_authenticate(e.a, NULL, "Bearer good-n", NULL, on_user, &z) != NULL,
       "no source: asked");
    run_until(&e, &z.calls, 1);
    struct auth_stats st;
    auth_stats(e.a, &st);
    is_int(st.token_reviews_refused_failed, 1, "stats: one refused for its rejections");
    is_int(st.token_reviews_refused, 0, "not for its share");
    is_int(st.failing_sources, 1, "stats: one source with rejections");
    now += 0.999;
    struct ures w1 = {0};
    ok(auth_authenticate(e.a, NULL, "Bearer good-a", &a, on_user, &w1) == NULL && w1.status == 429,
       "a: within the second, still 429");
    now += 0.001;
    struct ures w2 = {0};
    ok(auth_authenticate(e.a, NULL, "Bearer good-a", &a, on_user, &w2) != NULL,
       "a: the second over: reviewed again");
    run_until(&e, &w2.calls, 1);
    is_int(w2.status, 0, "and authenticated");
    auth_stats(e.a, &st);
    is_int(st.failing_sources, 0, "the rejections left the count");
    env_fini(&e);
}

static void
test_source_share(void)
{
    struct auth_options o = default_opts;
    o.max_reviews_per_source = 2;
    struct env e;
    env_init(&e, &o, false);
    e.f.hold = true;
    struct src_key a = src4(2), b = src4(3);
    struct ures a1 = {0}, a2 = {0}, a3 = {0}, a1b = {0}, b1 = {0}, b2 = {0}, n1 = {0}, n2 = {0},
                n3 = {0};
    ok(auth_authenticate(e.a, NULL, "Bearer good-a1", &a, on_user, &a1) != NULL, "a: first");
    struct auth_wait *wa2 = auth_authenticate(e.a, NULL, "Bearer good-a2", &a, on_user, &a2);
    ok(wa2 != NULL, "a: second");
    ok(auth_authenticate(e.a, NULL, "Bearer good-a3", &a, on_user, &a3) == NULL,
       "a: a third new token is answered at once");
    is_int(a3.status, 429, "...with 429");
    ok(auth_authenticate(e.a, NULL, "Bearer good-a1", &a, on_user, &a1b) != NULL,
       "a: a token under review still joins it");
    ok(auth_authenticate(e.a, NULL, "Bearer good-b1", &b, on_user, &b1) != NULL,
       "b: not held back by a");
    ok(auth_authenticate(e.a, NULL, "Bearer good-a2", &b, on_user, &b2) != NULL,
       "b: joins a's review");
    ok(auth_authenticate(e.a, NULL, "Bearer good-n1", NULL, on_user, &n1) != NULL &&
           auth_authenticate(e.a, NULL, "Bearer good-n2", NULL, on_user, &n2) != NULL &&
           auth_authenticate(e.a, NULL, "Bearer good-n3", NULL, on_user, &n3) != NULL,
       "no source: no share");
    struct auth_stats st;
    auth_stats(e.a, &st);
    is_int(st.token_reviews_refused, 1, "stats: one refused");
    is_int(st.review_sources, 2, "stats: two sources counted");
    /* a's second review loses its own waiter but b still waits: it goes on,
     * and still counts against a */
    auth_cancel(wa2);
    struct ures a4 = {0};
    ok(auth_authenticate(e.a, NULL, "Bearer good-a4", &a, on_user, &a4) == NULL && a4.status == 429,
       "a: its review goes on for b: still no room");
    int before = user_calls;
    fake_release(&e.f);
    run_until(&e, &user_calls, before + 7);
    is_int(a1.calls + a1b.calls + b1.calls + b2.calls + n1.calls + n2.calls + n3.calls, 7,
           "every waiter answered once");
    is_int(a1.status + a1b.status + b1.status + b2.status + n1.status + n2.status + n3.status, 0,
           "...as authenticated");
    is_int(a2.calls, 0, "the cancelled wait: no callback");
    auth_stats(e.a, &st);
    is_int(st.review_sources, 0, "every review over: no source counted");
    struct ures a5 = {0};
    ok(auth_authenticate(e.a, NULL, "Bearer good-a5", &a, on_user, &a5) != NULL,
       "a: room again once its reviews ended");
    run_until(&e, &a5.calls, 1);
    is_int(a5.status, 0, "and answered");

    /* SubjectAccessReviews: counted when the caller passes a source (an
     * unauthenticated caller's), AUTH_BUSY past the share */
    struct auth_user *anon = auth_anonymous_user();
    struct auth_attrs at[4];
    static const char *const names[] = {"p0", "p1", "p2", "p3"};
    for (int i = 0; i < 4; i++)
        at[i] = (struct auth_attrs){.resource_request = true,
                                    .verb = "get",
                                    .version = "v1",
                                    .resource = "pods",
                                    .namespace_ = "default",
                                    .name = names[i]};
    e.f.hold = true;
    struct dres d[4] = {{0}}, d3 = {0};
    ok(auth_authorize(e.a, anon, &at[0], &a, on_decision, &d[0]) != NULL &&
           auth_authorize(e.a, anon, &at[1], &a, on_decision, &d[1]) != NULL,
       "anonymous from a: two questions asked");
    ok(auth_authorize(e.a, anon, &at[2], &a, on_decision, &d[2]) == NULL && d[2].d == AUTH_BUSY,
       "a third new question from a: AUTH_BUSY at once");
    ok(auth_authorize(e.a, anon, &at[2], &b, on_decision, &d3) != NULL, "from b: asked");
    ok(auth_authorize(e.a, anon, &at[3], NULL, on_decision, &d[3]) != NULL,
       "no source (an authenticated caller): asked");
    auth_stats(e.a, &st);
    is_int(st.sar_refused, 1, "stats: one SubjectAccessReview refused");
    fake_release(&e.f);
    run_until(&e, &d3.calls, 1);
    run_until(&e, &d[3].calls, 1);
    run_until(&e, &d[0].calls, 1);
    run_until(&e, &d[1].calls, 1);
    is_int(d[0].calls + d[1].calls + d3.calls + d[3].calls, 4, "the asked ones answered");
    ok(d[0].d == AUTH_ALLOW && d[1].d == AUTH_ALLOW && d3.d == AUTH_ALLOW && d[3].d == AUTH_ALLOW,
       "...allowed");
    auth_stats(e.a, &st);
    is_int(st.review_sources, 0, "over: no source counted");
    auth_user_unref(anon);
    env_fini(&e);
}

static void
test_errors(void)
{
    capture_start();
    errors_case(FAKE_500, false, "upstream 500");
    errors_case(FAKE_GARBAGE, false, "garbage body");
    errors_case(FAKE_BIG, false, "body over 1 MiB");
    errors_case(FAKE_OK, true, "connection refused");
    char *log = capture_end();
    ok(strstr(log, "auth: TokenReview failed") != NULL, "failures are logged");
    ok(strstr(log, "SECRET-TOKEN") == NULL, "the token never appears in the log");
    ok(strstr(log, "HTTP 500") != NULL, "the cause is logged");
    if (!strstr(log, "auth:"))
        printf("# log: %s\n", log);
    free(log);
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

/*
 * Two questions whose cache keys collided while counts were written as bare
 * numbers in front of length-prefixed fields: one group of 110 bytes ("1",
 * "110:", ...) against eleven groups, the first of 10 bytes ("11", "10:",
 * ...), the rest spelled inside the long group. The fake denies the long
 * one; answered from the other's cached allow it would be let through.
 */
static void
test_question_key_collision(void)
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

    struct env e;
    env_init(&e, NULL, false);
    struct dres rb = {0}, ra = {0};
    auth_authorize(e.a, b, &at, NULL, on_decision, &rb);
    run_until(&e, &rb.calls, 1);
    is_int(rb.d, AUTH_ALLOW, "eleven groups: allowed (and cached)");
    auth_authorize(e.a, a, &at, NULL, on_decision, &ra);
    run_until(&e, &ra.calls, 1);
    is_int(e.f.sars, 2, "the long group is asked, not answered from the other's entry");
    is_int(ra.d, AUTH_DENY, "the long group: denied");
    auth_user_unref(a);
    auth_user_unref(b);
    env_fini(&e);
}

int
main(void)
{
    TAP_RUN(test_token_cache);
    TAP_RUN(test_sar_ttls);
    TAP_RUN(test_token_coalesced);
    TAP_RUN(test_anonymous_and_cert);
    TAP_RUN(test_sar_coalesced);
    TAP_RUN(test_cancel);
    TAP_RUN(test_review_timeout);
    TAP_RUN(test_source_share);
    TAP_RUN(test_source_rejections);
    TAP_RUN(test_errors);
    TAP_RUN(test_question_key_collision);
    return tap_done();
}
