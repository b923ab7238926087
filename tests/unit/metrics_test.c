/*
 * metrics_test.c — proxy/ops/metrics.c (the Prometheus text format 0.0.4 and
 * histogram math) and the pure helpers of proxy/ops/access.c (query redaction,
 * kube's metric verbs, label bounds).
 *
 * Expected texts are written out by hand from the format's rules
 * (prometheus/docs exposition_formats.md): HELP escapes \ and newline, label
 * values \, " and newline; histogram buckets are cumulative and end with
 * le="+Inf" equal to _count; values are the shortest decimal that reads back.
 */
#include "kwc/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/access.h"
#include "kwc/route.h"
#include "tap.h"

static char *
value_text(double v)
{
    struct gostr_buf b = {0};
    metrics_write_value(&b, v);
    return gostr_take(&b);
}

static void
test_values(void)
{
    struct {
        double v;
        const char *want;
    } cases[] = {
        {0, "0"},
        {1, "1"},
        {-3, "-3"},
        {0.005, "0.005"},
        {0.1, "0.1"},
        {1.25, "1.25"},
        {6.365e-05, "6.365e-05"},
        {1e20, "1e+20"},
        {123456789012, "123456789012"},
        {0.30000000000000004, "0.30000000000000004"},
        {INFINITY, "+Inf"},
        {-INFINITY, "-Inf"},
        {NAN, "NaN"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *t = value_text(cases[i].v);
        is_str(t, cases[i].want, cases[i].want);
        if (!isnan(cases[i].v) && !isinf(cases[i].v))
            ok(strtod(t, NULL) == cases[i].v, "reads back as the same double");
        free(t);
    }
}

static void
test_escaping(void)
{
    struct metrics_writer w = {0};
    metrics_write_family(&w, "x_total", "a \\ b\nc \"q\"", METRICS_COUNTER);
    const char *labels[] = {"a", "b"};
    const char *values[] = {"back\\slash \"quoted\"\nnew", ""};
    metrics_write_sample(&w, "x_total", labels, values, 2, 7);
    metrics_write_sample(&w, "x_total", NULL, NULL, 0, 1.5);
    char *got = gostr_take(&w.b);
    is_str(got,
           "# HELP x_total a \\\\ b\\nc \"q\"\n"
           "# TYPE x_total counter\n"
           "x_total{a=\"back\\\\slash \\\"quoted\\\"\\nnew\",b=\"\"} 7\n"
           "x_total 1.5\n",
           "HELP escapes \\ and newline (not quotes); label values \\, \" and newline");
    free(got);
}

static void
test_histogram(void)
{
    static const double bounds[] = {0.25, 1, 10};
    struct metrics_hist h;
    metrics_hist_init(&h, bounds, 3);
    double obs[] = {0.125, 0.25, 0.5, 1, 1.5, 10, 11, 1000}; /* exact in binary: an exact sum */
    for (size_t i = 0; i < sizeof(obs) / sizeof(obs[0]); i++)
        metrics_hist_observe(&h, obs[i]);
    is_int(h.counts[0], 2, "le is inclusive: 0.125 and 0.25 in the first bucket");
    is_int(h.counts[1], 2, "0.5 and 1 in (0.25, 1]");
    is_int(h.counts[2], 2, "1.5 and 10 in (1, 10]");
    is_int(h.counts[3], 2, "11 and 1000 above the last bound");
    is_int(h.count, 8, "count");

    struct metrics_writer w = {0};
    const char *labels[] = {"verb"};
    const char *values[] = {"GET"};
    metrics_write_family(&w, "d_seconds", "Durations.", METRICS_HISTOGRAM);
    metrics_write_hist(&w, "d_seconds", labels, values, 1, &h);
    char *got = gostr_take(&w.b);
    is_str(got,
           "# HELP d_seconds Durations.\n"
           "# TYPE d_seconds histogram\n"
           "d_seconds_bucket{verb=\"GET\",le=\"0.25\"} 2\n"
           "d_seconds_bucket{verb=\"GET\",le=\"1\"} 4\n"
           "d_seconds_bucket{verb=\"GET\",le=\"10\"} 6\n"
           "d_seconds_bucket{verb=\"GET\",le=\"+Inf\"} 8\n"
           "d_seconds_sum{verb=\"GET\"} 1024.375\n"
           "d_seconds_count{verb=\"GET\"} 8\n",
           "cumulative buckets, +Inf = count, then sum and count");
    free(got);

    struct metrics_hist h2;
    metrics_hist_init(&h2, bounds, 3);
    metrics_hist_observe(&h2, 0.5);
    metrics_hist_observe(&h2, NAN);
    is_int(h2.counts[3], 1, "NaN counts in +Inf only");
    metrics_hist_fini(&h);
    metrics_hist_fini(&h2);

    /* no labels: le alone */
    struct metrics_hist h3;
    metrics_hist_init(&h3, bounds, 1);
    metrics_hist_observe(&h3, 0.01);
    struct metrics_writer w3 = {0};
    metrics_write_hist(&w3, "e", NULL, NULL, 0, &h3);
    char *g3 = gostr_take(&w3.b);
    is_str(g3, "e_bucket{le=\"0.25\"} 1\ne_bucket{le=\"+Inf\"} 1\ne_sum 0.01\ne_count 1\n",
           "a histogram without labels");
    free(g3);
    metrics_hist_fini(&h3);
}

static void
test_kube_buckets(void)
{
    is_int(metrics_request_nbuckets, 23, "kube's apiserver_request_duration_seconds: 23 bounds");
    ok(metrics_request_buckets[0] == 0.005 && metrics_request_buckets[22] == 60,
       "from 5 ms to 60 s");
    for (size_t i = 1; i < metrics_request_nbuckets; i++)
        if (!(metrics_request_buckets[i] > metrics_request_buckets[i - 1]))
            ok(0, "bounds ascend");
    ok(metrics_client_buckets[metrics_client_nbuckets - 1] == 60, "client-go's end at 60 s");
}

static void
test_registry(void)
{
    struct metrics *m = metrics_new();
    static const char *const l2[] = {"code", "source"};
    struct metrics_family *c =
        metrics_family_new(m, METRICS_COUNTER, "req_total", "Requests.", l2, 2, NULL, 0);
    static const char *const l1[] = {"source"};
    static const double b[] = {1, 2};
    struct metrics_family *h =
        metrics_family_new(m, METRICS_HISTOGRAM, "lat_seconds", "Latency.", l1, 1, b, 2);
    struct metrics_family *g =
        metrics_family_new(m, METRICS_GAUGE, "g", "A gauge.", NULL, 0, NULL, 0);
    const char *v1[] = {"200", "cache"}, *v2[] = {"404", "upstream"}, *v3[] = {"20", "0cache"};
    metrics_add(c, v1, 1);
    metrics_add(c, v2, 1);
    metrics_add(c, v1, 2);
    metrics_add(c, v3, 1); /* "20","0cache" must not be the same series as "200","cache" */
    is_int((long long)metrics_get(c, v1), 3, "a series adds up");
    is_int((long long)metrics_get(c, v3), 1, "label values are kept apart");
    const char *hv[] = {"cache"};
    metrics_observe(h, hv, 1.5);
    metrics_add(g, NULL, 5);
    metrics_add(g, NULL, -1); /* a gauge goes down too */
    char *got = metrics_render(m, NULL);
    is_str(got,
           "# HELP req_total Requests.\n# TYPE req_total counter\n"
           "req_total{code=\"200\",source=\"cache\"} 3\n"
           "req_total{code=\"404\",source=\"upstream\"} 1\n"
           "req_total{code=\"20\",source=\"0cache\"} 1\n"
           "# HELP lat_seconds Latency.\n# TYPE lat_seconds histogram\n"
           "lat_seconds_bucket{source=\"cache\",le=\"1\"} 0\n"
           "lat_seconds_bucket{source=\"cache\",le=\"2\"} 1\n"
           "lat_seconds_bucket{source=\"cache\",le=\"+Inf\"} 1\n"
           "lat_seconds_sum{source=\"cache\"} 1.5\n"
           "lat_seconds_count{source=\"cache\"} 1\n"
           "# HELP g A gauge.\n# TYPE g gauge\ng 4\n",
           "families in order, series in creation order, each family once");
    free(got);

    /* bounded: past METRICS_MAX_SERIES everything goes to one overflow series */
    for (int i = 0; i < METRICS_MAX_SERIES + 10; i++) {
        char code[16];
        snprintf(code, sizeof(code), "%d", 1000 + i);
        const char *v[] = {code, "x"};
        metrics_add(c, v, 1);
    }
    const char *ov[] = {METRICS_OVERFLOW, METRICS_OVERFLOW};
    is_int((long long)metrics_get(c, ov), 13, "the series past the bound are counted together");
    metrics_free(m);
}

/* ---- shards: each thread counts apart, a render sums them ---- */

struct recorder {
    struct metrics_family *c, *h;
    unsigned shard;
    int from, n; /* codes from..from+n-1, once each; or n adds of "200" when from < 0 */
};

static void *
record_main(void *arg)
{
    struct recorder *r = arg;
    metrics_thread_shard(r->shard);
    for (int i = 0; i < r->n; i++) {
        char code[16];
        snprintf(code, sizeof(code), "%d", r->from < 0 ? 200 : r->from + i);
        const char *v[] = {code};
        metrics_add(r->c, v, 1);
        if (r->h)
            metrics_observe(r->h, v, (double)(i % 3)); /* 0, 1, 2: one in each bucket */
    }
    return NULL;
}

/* Runs the recorders at once, scraping m meanwhile when given (a race
 * between a scrape and the shards shows under make tsan's build). */
static void
run_recorders(struct recorder *r, size_t n, struct metrics *m)
{
    pthread_t t[8];
    for (size_t i = 0; i < n; i++)
        if (pthread_create(&t[i], NULL, record_main, &r[i]) != 0)
            abort();
    for (int i = 0; m && i < 20; i++)
        free(metrics_render(m, NULL));
    for (size_t i = 0; i < n; i++)
        pthread_join(t[i], NULL);
}

/* How many lines of text start with prefix. */
static int
count_lines(const char *text, const char *prefix)
{
    int n = 0;
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        n += strncmp(p, prefix, strlen(prefix)) == 0;
    return n;
}

static void
test_shards(void)
{
    struct metrics *m = metrics_new();
    static const char *const l1[] = {"code"};
    static const double b[] = {0, 1};
    struct metrics_family *c =
        metrics_family_new(m, METRICS_COUNTER, "t_total", "T.", l1, 1, NULL, 0);
    struct metrics_family *h =
        metrics_family_new(m, METRICS_HISTOGRAM, "t_seconds", "T.", l1, 1, b, 2);

    /* four threads, four shards (one beyond the count: modulo), at once */
    struct recorder r[4];
    for (unsigned i = 0; i < 4; i++)
        r[i] = (struct recorder){
            .c = c, .h = h, .shard = i == 3 ? 1000 : 1 + i, .from = -1, .n = 30000};
    run_recorders(r, 4, m);
    const char *v200[] = {"200"};
    metrics_add(c, v200, 5); /* this thread: shard 0 */
    is_int((long long)metrics_get(c, v200), 4 * 30000 + 5, "metrics_get sums the shards");
    char *got = metrics_render(m, NULL);
    is_str(got,
           "# HELP t_total T.\n# TYPE t_total counter\n"
           "t_total{code=\"200\"} 120005\n"
           "# HELP t_seconds T.\n# TYPE t_seconds histogram\n"
           "t_seconds_bucket{code=\"200\",le=\"0\"} 40000\n"
           "t_seconds_bucket{code=\"200\",le=\"1\"} 80000\n"
           "t_seconds_bucket{code=\"200\",le=\"+Inf\"} 120000\n"
           "t_seconds_sum{code=\"200\"} 120000\n"
           "t_seconds_count{code=\"200\"} 120000\n",
           "one sample per series: the shards' counts and buckets summed");
    free(got);

    /* the bound holds over all shards: shard 1 fills it, then shard 2's new
     * series go to the overflow series */
    struct recorder fill[2] = {
        {.c = c, .shard = 1, .from = 1000, .n = METRICS_MAX_SERIES - 1},
        {.c = c, .shard = 2, .from = 1000000, .n = 10},
    };
    run_recorders(&fill[0], 1, NULL);
    run_recorders(&fill[1], 1, NULL);
    got = metrics_render(m, NULL);
    is_int(count_lines(got, "t_total{"), METRICS_MAX_SERIES + 1, "the bound, and one overflow");
    ok(strstr(got, "\nt_total{code=\"" METRICS_OVERFLOW "\"} 10\n") != NULL,
       "the series past the bound, over all shards, are counted together");
    ok(strstr(got, "t_total{code=\"1000000\"}") == NULL, "a series past the bound is not shown");
    free(got);
    const char *past[] = {"1000005"};
    is_int((long long)metrics_get(c, past), 0,
           "nor kept: the bound is the family's, not a shard's");
    /* a label set one shard holds is no new series for another */
    struct recorder again = {.c = c, .shard = 3, .from = 1000, .n = 5};
    run_recorders(&again, 1, NULL);
    const char *known[] = {"1002"}, *ov[] = {METRICS_OVERFLOW};
    is_int((long long)metrics_get(c, known), 2, "a label set counted in two shards");
    is_int((long long)metrics_get(c, ov), 10, "and not as overflow");
    metrics_free(m);
}

static int collected;
static void
collector(void *arg, struct metrics_writer *w)
{
    collected++;
    metrics_write_family(w, (const char *)arg, "From a collector.", METRICS_GAUGE);
    metrics_write_sample(w, (const char *)arg, NULL, NULL, 0, 42);
}

static void
test_collectors(void)
{
    struct metrics *m = metrics_new();
    static char first[] = "first", second[] = "second";
    metrics_collector_add(m, collector, first, NULL);
    metrics_collector_add(m, collector, second, NULL);
    size_t n;
    char *got = metrics_render(m, &n);
    is_str(got,
           "# HELP first From a collector.\n# TYPE first gauge\nfirst 42\n"
           "# HELP second From a collector.\n# TYPE second gauge\nsecond 42\n",
           "collectors in the order added");
    is_int(n, strlen(got), "length");
    is_int(collected, 2, "each called once per render");
    free(got);
    metrics_free(m);
}

static void
test_redact(void)
{
    struct {
        const char *in, *want;
    } cases[] = {
        {"/api/v1/pods", "/api/v1/pods"},
        {"/api/v1/pods?watch=1", "/api/v1/pods?watch=1"},
        {"/x?token=abc", "/x?token=REDACTED"},
        {"/x?a=1&token=abc&b=2", "/x?a=1&token=REDACTED&b=2"},
        {"/x?access_token=abc&id_token=def", "/x?access_token=REDACTED&id_token=REDACTED"},
        {"/x?Password=p&clientSecret=s", "/x?Password=REDACTED&clientSecret=REDACTED"},
        {"/x?%74oken=abc", "/x?%74oken=REDACTED"},
        {"/x?token", "/x?token"},
        {"/x?token=", "/x?token=REDACTED"},
        {"/x?tok=abc;secret=s", "/x?tok=abc;secret=REDACTED"},
        {"/x?labelSelector=token%3Dabc", "/x?labelSelector=token%3Dabc"},
        {"/x?", "/x?"},
        {"/x?&&token=a&", "/x?&&token=REDACTED&"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *got = access_redact_target(cases[i].in);
        is_str(got, cases[i].want, cases[i].in);
        free(got);
    }
}

static const char *
verb_of(const char *method, const char *target, bool upgrade)
{
    static char out[32];
    struct route_req r;
    if (route_parse(method, target, strlen(target), &r) != 0) {
        route_fini(&r);
        return "unparsed";
    }
    snprintf(out, sizeof(out), "%s", access_metric_verb(method, &r, upgrade));
    route_fini(&r);
    return out;
}

static void
test_verbs(void)
{
    is_str(verb_of("GET", "/api/v1/pods", false), "LIST", "a collection GET is LIST");
    is_str(verb_of("GET", "/api/v1/namespaces/a/pods/p", false), "GET", "an object GET");
    is_str(verb_of("HEAD", "/api/v1/namespaces/a/pods/p", false), "GET", "HEAD as GET");
    is_str(verb_of("GET", "/api/v1/pods?watch=1", false), "WATCH", "?watch");
    is_str(verb_of("GET", "/api/v1/watch/pods", false), "WATCH", "legacy /watch/");
    is_str(verb_of("POST", "/api/v1/namespaces/a/pods", false), "POST", "create: the method");
    is_str(verb_of("DELETE", "/api/v1/namespaces/a/pods", false), "DELETE", "deletecollection");
    is_str(verb_of("PATCH", "/apis/apps/v1/namespaces/a/deployments/d", false), "PATCH", "patch");
    is_str(verb_of("POST", "/api/v1/namespaces/a/pods/p/exec?command=ls", false), "CONNECT",
           "exec");
    is_str(verb_of("GET", "/api/v1/namespaces/a/pods/p/exec", true), "CONNECT", "an upgrade");
    is_str(verb_of("GET", "/metrics", false), "GET", "non-resource: the method");
    is_str(verb_of("BREW", "/x", false), "other", "unknown methods are bounded");
    is_str(access_metric_verb("GET", NULL, false), "GET", "no route");
}

static void
test_labels(void)
{
    is_str(access_label_name("pods"), "pods", "a resource");
    is_str(access_label_name("apps"), "apps", "a group");
    is_str(access_label_name("example.com"), "example.com", "a dotted group");
    is_str(access_label_name(""), "", "the core group");
    is_str(access_label_name(NULL), "", "none");
    is_str(access_label_name("Pods"), METRICS_OVERFLOW, "upper case is no resource name");
    is_str(access_label_name("a\"b"), METRICS_OVERFLOW, "quotes never reach a label");
    char big[300];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    is_str(access_label_name(big), METRICS_OVERFLOW, "over 253 bytes");
}

int
main(void)
{
    TAP_RUN(test_values);
    TAP_RUN(test_escaping);
    TAP_RUN(test_histogram);
    TAP_RUN(test_kube_buckets);
    TAP_RUN(test_registry);
    TAP_RUN(test_shards);
    TAP_RUN(test_collectors);
    TAP_RUN(test_redact);
    TAP_RUN(test_verbs);
    TAP_RUN(test_labels);
    return tap_done();
}
