/*
 * discodoc_test.c — proxy/upstream/discodoc.c: discovery documents (the
 * aggregated APIGroupDiscoveryList, the plain APIVersions, APIGroupList
 * and APIResourceList, the APIServiceList) read into a model; and
 * discovery.c's path test (pure).
 *
 * The documents are written as kube-apiserver 1.30 writes them (fields
 * and shapes from k8s.io/api apidiscovery/v2 and apimachinery meta/v1),
 * trimmed to what matters; the expectations come from those documents, not
 * from the code under test.
 */
#include "kwc/discodoc.h"

#include <stdlib.h>
#include <string.h>

#include "kwc/discovery.h"
#include "tap.h"

/* /apis with Accept: application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList */
static const char agg_apis[] =
    "{\"kind\":\"APIGroupDiscoveryList\",\"apiVersion\":\"apidiscovery.k8s.io/v2\","
    "\"metadata\":{},\"items\":["
    "{\"metadata\":{\"name\":\"apps\",\"creationTimestamp\":null},\"versions\":[{\"version\":"
    "\"v1\",\"resources\":["
    "{\"resource\":\"deployments\",\"responseKind\":{\"group\":\"\",\"version\":\"\",\"kind\":"
    "\"Deployment\"},\"scope\":\"Namespaced\",\"singularResource\":\"deployment\",\"verbs\":["
    "\"create\",\"delete\",\"deletecollection\",\"get\",\"list\",\"patch\",\"update\",\"watch\"],"
    "\"shortNames\":[\"deploy\"],\"categories\":[\"all\"],\"subresources\":[{\"subresource\":"
    "\"scale\",\"responseKind\":{\"group\":\"autoscaling\",\"version\":\"v1\",\"kind\":\"Scale\"},"
    "\"verbs\":[\"get\",\"patch\",\"update\"]}]}]}]},"
    "{\"metadata\":{\"name\":\"metrics.k8s.io\",\"creationTimestamp\":null},\"versions\":[{"
    "\"version\":\"v1beta1\",\"resources\":[{\"resource\":\"nodes\",\"responseKind\":{\"group\":"
    "\"\",\"version\":\"\",\"kind\":\"NodeMetrics\"},\"scope\":\"Cluster\",\"singularResource\":"
    "\"\",\"verbs\":[\"get\",\"list\"]}],\"freshness\":\"Current\"}]},"
    "{\"metadata\":{\"name\":\"apiextensions.k8s.io\"},\"versions\":[{\"version\":\"v1\","
    "\"resources\":[{\"resource\":\"customresourcedefinitions\",\"responseKind\":{\"kind\":"
    "\"CustomResourceDefinition\"},\"scope\":\"Cluster\",\"verbs\":[\"list\",\"watch\"]}]}]},"
    "{\"metadata\":{\"name\":\"stale.example.com\"},\"versions\":[{\"version\":\"v1\","
    "\"freshness\":\"Stale\"}]}"
    "]}";

/* /api in the aggregated form: the core group has no name */
static const char agg_api[] =
    "{\"kind\":\"APIGroupDiscoveryList\",\"apiVersion\":\"apidiscovery.k8s.io/v2\","
    "\"metadata\":{},\"items\":[{\"metadata\":{\"creationTimestamp\":null},\"versions\":[{"
    "\"version\":\"v1\",\"resources\":["
    "{\"resource\":\"pods\",\"responseKind\":{\"group\":\"\",\"version\":\"\",\"kind\":\"Pod\"},"
    "\"scope\":\"Namespaced\",\"singularResource\":\"pod\",\"verbs\":[\"create\",\"delete\","
    "\"deletecollection\",\"get\",\"list\",\"patch\",\"update\",\"watch\"],\"subresources\":[{"
    "\"subresource\":\"log\",\"responseKind\":{\"kind\":\"Pod\"},\"verbs\":[\"get\"]}]},"
    "{\"resource\":\"bindings\",\"responseKind\":{\"kind\":\"Binding\"},\"scope\":\"Namespaced\","
    "\"verbs\":[\"create\"]},"
    "{\"resource\":\"nodes\",\"responseKind\":{\"kind\":\"Node\"},\"scope\":\"Cluster\","
    "\"verbs\":[\"get\",\"list\",\"watch\"]}]}]}]}";

static const char versions[] = "{\"kind\":\"APIVersions\",\"versions\":[\"v1\"],"
                               "\"serverAddressByClientCIDRs\":[{\"clientCIDR\":\"0.0.0.0/0\","
                               "\"serverAddress\":\"10.0.0.1:6443\"}]}\n";

static const char groups[] =
    "{\"kind\":\"APIGroupList\",\"apiVersion\":\"v1\",\"groups\":["
    "{\"name\":\"apps\",\"versions\":[{\"groupVersion\":\"apps/v1\",\"version\":\"v1\"}],"
    "\"preferredVersion\":{\"groupVersion\":\"apps/v1\",\"version\":\"v1\"}},"
    "{\"name\":\"batch\",\"versions\":[{\"groupVersion\":\"batch/v1\",\"version\":\"v1\"},"
    "{\"groupVersion\":\"batch/v1beta1\",\"version\":\"v1beta1\"}],\"preferredVersion\":{"
    "\"groupVersion\":\"batch/v1\",\"version\":\"v1\"}}]}\n";

static const char core_v1[] =
    "{\"kind\":\"APIResourceList\",\"groupVersion\":\"v1\",\"resources\":["
    "{\"name\":\"pods\",\"singularName\":\"pod\",\"namespaced\":true,\"kind\":\"Pod\",\"verbs\":"
    "[\"create\",\"delete\",\"deletecollection\",\"get\",\"list\",\"patch\",\"update\",\"watch\"],"
    "\"shortNames\":[\"po\"],\"categories\":[\"all\"],\"storageVersionHash\":\"xPOwRZ+Yhw8=\"},"
    "{\"name\":\"pods/status\",\"singularName\":\"\",\"namespaced\":true,\"kind\":\"Pod\","
    "\"verbs\":[\"get\",\"patch\",\"update\"]},"
    "{\"name\":\"componentstatuses\",\"singularName\":\"componentstatus\",\"namespaced\":false,"
    "\"kind\":\"ComponentStatus\",\"verbs\":[\"get\",\"list\"]}]}\n";

static const char apps_v1[] =
    "{\"kind\":\"APIResourceList\",\"apiVersion\":\"v1\",\"groupVersion\":\"apps/v1\","
    "\"resources\":[{\"name\":\"deployments\",\"singularName\":\"deployment\",\"namespaced\":"
    "true,\"kind\":\"Deployment\",\"verbs\":[\"get\",\"list\",\"watch\"]},{\"name\":"
    "\"deployments/scale\",\"singularName\":\"\",\"namespaced\":true,\"group\":\"autoscaling\","
    "\"version\":\"v1\",\"kind\":\"Scale\",\"verbs\":[\"get\",\"patch\",\"update\"]}]}\n";

static const char apiservices[] =
    "{\"kind\":\"APIServiceList\",\"apiVersion\":\"apiregistration.k8s.io/v1\",\"metadata\":{"
    "\"resourceVersion\":\"100\"},\"items\":["
    "{\"metadata\":{\"name\":\"v1.apps\"},\"spec\":{\"group\":\"apps\",\"version\":\"v1\","
    "\"groupPriorityMinimum\":17800,\"versionPriority\":15},\"status\":{}},"
    "{\"metadata\":{\"name\":\"v1beta1.metrics.k8s.io\"},\"spec\":{\"service\":{\"namespace\":"
    "\"kube-system\",\"name\":\"metrics-server\",\"port\":443},\"group\":\"metrics.k8s.io\","
    "\"version\":\"v1beta1\",\"insecureSkipTLSVerify\":true,\"groupPriorityMinimum\":100,"
    "\"versionPriority\":100},\"status\":{}},"
    "{\"metadata\":{\"name\":\"v1.\"},\"spec\":{\"service\":null,\"version\":\"v1\","
    "\"groupPriorityMinimum\":18000,\"versionPriority\":1},\"status\":{}}]}";

static enum ddoc_kind
add(struct ddoc_model *m, const char *doc)
{
    char err[256];
    return ddoc_add(m, doc, strlen(doc), err, sizeof(err));
}

static void
test_aggregated(void)
{
    struct ddoc_model m;
    ddoc_model_init(&m);
    is_int(add(&m, agg_api), DDOC_AGGREGATED, "/api aggregated");
    is_int(add(&m, agg_apis), DDOC_AGGREGATED, "/apis aggregated");
    ddoc_freeze(&m);
    is_int(m.nres, 6, "every resource, no subresource");
    /* discovery's order: /api's first, then /apis's */
    is_str(m.res[0].resource, "pods", "first: pods");
    is_str(m.res[3].resource, "deployments", "then apps");
    const struct disco_res *r = ddoc_find(&m, "", "v1", "pods");
    ok(r && strcmp(r->kind, "Pod") == 0 && r->namespaced && r->list && r->watch,
       "pods: Pod, namespaced, list and watch");
    r = ddoc_find(&m, "", "v1", "bindings");
    ok(r && !r->list && !r->watch && r->namespaced, "bindings: create only");
    r = ddoc_find(&m, "", "v1", "nodes");
    ok(r && !r->namespaced && strcmp(r->kind, "Node") == 0, "nodes: cluster-scoped");
    r = ddoc_find(&m, "apps", "v1", "deployments");
    ok(r && strcmp(r->kind, "Deployment") == 0 && strcmp(r->group, "apps") == 0,
       "deployments in apps/v1");
    r = ddoc_find(&m, "metrics.k8s.io", "v1beta1", "nodes");
    ok(r && r->list && !r->watch && !r->namespaced, "NodeMetrics: list, no watch");
    ok(!ddoc_find(&m, "apps", "v1", "deployments/scale"), "no subresource");
    ok(!ddoc_find(&m, "apps", "v1beta1", "deployments"), "no other version");
    ok(!ddoc_find(&m, "", "v1", "deployments"), "not in core");
    ok(ddoc_has_gv(&m, "stale.example.com", "v1"), "a stale group version is known");
    ok(ddoc_has_group(&m, "apps") && !ddoc_has_group(&m, "batch"), "groups");
    ok(ddoc_has_gv(&m, "", "v1") && !ddoc_has_gv(&m, "", "v2"), "core versions");
    for (size_t i = 0; i < m.nres; i++)
        ok(!m.res[i].aggregated, "nothing aggregated without the APIService list");
    ddoc_model_fini(&m);
}

static void
test_plain(void)
{
    struct ddoc_model m;
    ddoc_model_init(&m);
    is_int(add(&m, versions), DDOC_VERSIONS, "APIVersions");
    is_int(add(&m, groups), DDOC_GROUPS, "APIGroupList");
    is_int(m.nres, 0, "the index names no resource");
    is_int(m.ngvs, 4, "v1, apps/v1, batch/v1, batch/v1beta1");
    is_str(m.gvs[0].group, "", "core first");
    is_str(m.gvs[3].version, "v1beta1", "every version, not only the preferred");
    is_int(add(&m, core_v1), DDOC_RESOURCES, "APIResourceList v1");
    is_int(add(&m, apps_v1), DDOC_RESOURCES, "APIResourceList apps/v1");
    ddoc_freeze(&m);
    is_int(m.nres, 3, "pods, componentstatuses, deployments");
    is_int(m.ngvs, 4, "group versions named twice are kept once");
    const struct disco_res *r = ddoc_find(&m, "", "v1", "componentstatuses");
    ok(r && !r->namespaced && r->list && !r->watch, "componentstatuses");
    r = ddoc_find(&m, "apps", "v1", "deployments");
    ok(r && r->namespaced && strcmp(r->kind, "Deployment") == 0, "deployments from apps/v1");
    ok(!ddoc_find(&m, "", "v1", "pods/status"), "pods/status is a subresource");
    ddoc_model_fini(&m);
}

static void
test_apiservices(void)
{
    struct ddoc_model m, agg;
    char err[256];
    ddoc_model_init(&m);
    ddoc_model_init(&agg);
    add(&m, agg_apis);
    is_int(add(&m, apiservices), DDOC_APISERVICES, "an APIServiceList adds nothing");
    is_int(ddoc_apiservices(&agg, apiservices, strlen(apiservices), err, sizeof(err)), 1,
           "one APIService with a service");
    ddoc_mark_aggregated(&m, &agg);
    ddoc_freeze(&m);
    const struct disco_res *r = ddoc_find(&m, "metrics.k8s.io", "v1beta1", "nodes");
    ok(r && r->aggregated, "metrics.k8s.io is aggregated");
    r = ddoc_find(&m, "apps", "v1", "deployments");
    ok(r && !r->aggregated, "apps is local (service null or absent)");
    is_int(ddoc_apiservices(&agg, groups, strlen(groups), err, sizeof(err)), -1,
           "not an APIServiceList");
    is_int(agg.ngvs, 1, "unchanged by a wrong document");
    ddoc_mark_aggregated(&m, NULL);
    r = ddoc_find(&m, "metrics.k8s.io", "v1beta1", "nodes");
    ok(r && !r->aggregated, "marks are reset");
    ddoc_model_fini(&m);
    ddoc_model_fini(&agg);
}

static void
test_invalid(void)
{
    static const char *const bad[] = {
        "",
        "not json",
        "[]",
        "{}",
        "{\"kind\":\"Status\",\"status\":\"Failure\",\"code\":404}",
        "{\"kind\":\"APIGroupDiscoveryList\",\"items\":{}}",
        "{\"kind\":\"APIVersions\",\"versions\":\"v1\"}",
        "{\"kind\":\"APIGroupList\"}",
        "{\"kind\":\"APIResourceList\",\"resources\":[]}",
        "{\"kind\":\"APIResourceList\",\"groupVersion\":\"a/b/c\",\"resources\":[]}",
        "{\"kind\":\"APIResourceList\",\"groupVersion\":\"/v1\",\"resources\":[]}",
        "{\"kind\":\"APIResourceList\",\"groupVersion\":\"\",\"resources\":[]}",
        "{\"kind\":\"APIResourceList\",\"groupVersion\":\"v1\",\"resources\":[{\"name\":",
    };
    struct ddoc_model m;
    ddoc_model_init(&m);
    add(&m, core_v1);
    size_t nres = m.nres, ngvs = m.ngvs, npool = m.npool;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[256] = "";
        is_int(ddoc_add(&m, bad[i], strlen(bad[i]), err, sizeof(err)), DDOC_INVALID, bad[i]);
        ok(err[0], "says why");
    }
    ok(m.nres == nres && m.ngvs == ngvs && m.npool == npool, "the model is unchanged");
    ddoc_model_fini(&m);
}

static void
test_entries(void)
{
    /* entries without a name or with a name past DDOC_MAX_NAME are
     * skipped; wrong types are not resources */
    char *long_name = malloc(DDOC_MAX_NAME + 2);
    memset(long_name, 'a', DDOC_MAX_NAME + 1);
    long_name[DDOC_MAX_NAME + 1] = '\0';
    char *doc = malloc(4096);
    snprintf(doc, 4096,
             "{\"kind\":\"APIResourceList\",\"groupVersion\":\"x.io/v1\",\"resources\":["
             "{\"kind\":\"A\"},{\"name\":\"\",\"kind\":\"B\"},{\"name\":\"%s\",\"kind\":\"D\"},{"
             "\"name\":7},\"e\",{\"name\":\"fs\",\"kind\":"
             "\"F\",\"verbs\":\"list\",\"namespaced\":\"true\"},{\"name\":\"gs\"}]}",
             long_name);
    struct ddoc_model m;
    ddoc_model_init(&m);
    is_int(add(&m, doc), DDOC_RESOURCES, "an APIResourceList with odd entries");
    ddoc_freeze(&m);
    is_int(m.nres, 2, "fs and gs only");
    const struct disco_res *r = ddoc_find(&m, "x.io", "v1", "fs");
    ok(r && !r->list && !r->namespaced, "verbs and namespaced of the wrong type: false");
    r = ddoc_find(&m, "x.io", "v1", "gs");
    ok(r && strcmp(r->kind, "") == 0, "no kind: empty");
    ddoc_model_fini(&m);
    free(doc);
    free(long_name);
}

static void
test_same_and_dups(void)
{
    struct ddoc_model a, b;
    ddoc_model_init(&a);
    ddoc_model_init(&b);
    add(&a, core_v1);
    add(&a, core_v1); /* the same list twice: kept once */
    ddoc_freeze(&a);
    is_int(a.nres, 2, "a resource named twice is kept once");
    is_str(a.res[0].resource, "pods", "in its first place");
    add(&b, core_v1);
    ddoc_freeze(&b);
    ok(ddoc_same(&a, &b), "the same resources");
    b.res[1].watch = true;
    ok(!ddoc_same(&a, &b), "a verb differs");
    b.res[1].watch = false;
    b.res[0].aggregated = true;
    ok(!ddoc_same(&a, &b), "aggregation differs");
    ddoc_model_fini(&b);
    ddoc_model_init(&b);
    add(&b, apps_v1);
    ddoc_freeze(&b);
    ok(!ddoc_same(&a, &b), "other resources");
    ddoc_model_fini(&a);
    ddoc_model_fini(&b);
}

static void
test_paths(void)
{
    static const char *const yes[] = {
        "/api",          "/apis",    "/api/v1",           "/apis/apps",
        "/apis/apps/v1", "/version", "/apis/x.io/v1beta1"};
    static const char *const no[] = {
        "/",         "/api/",       "/apis/",    "/api/v1/pods",  "/apis/apps/v1/deployments",
        "/apisx",    "/apiv1",      "/apis//v1", "/apis/apps/",   "/version/",
        "/versions", "/openapi/v2", "/api/v1/",  "/apis/a/b/c/d", ""};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
        ok(discovery_path(yes[i]), yes[i]);
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
        ok(!discovery_path(no[i]), no[i]);
}

int
main(void)
{
    TAP_RUN(test_aggregated);
    TAP_RUN(test_plain);
    TAP_RUN(test_apiservices);
    TAP_RUN(test_invalid);
    TAP_RUN(test_entries);
    TAP_RUN(test_same_and_dups);
    TAP_RUN(test_paths);
    return tap_done();
}
