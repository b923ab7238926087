/*
 * listfmt_test.c — cache/listfmt.c against the bytes kube-apiserver writes.
 *
 * Expected strings are written out by hand from kube's encoders: a typed
 * XxxList is TypeMeta (kind, apiVersion), ListMeta (resourceVersion, continue,
 * remainingItemCount, each omitempty) and items, via json.Encoder (newline at
 * the end); an UnstructuredList is a Go map, so its keys come sorted and
 * metadata.continue is present even when empty; a typed GET is kind,
 * apiVersion, then the object's own fields.
 */
#include "kwc/listfmt.h"

#include <stdlib.h>
#include <string.h>

#include "tap.h"

static const struct listfmt pods = {.list_kind = "PodList", .kind = "Pod", .api_version = "v1"};
static const struct listfmt deps = {
    .list_kind = "DeploymentList", .kind = "Deployment", .api_version = "apps/v1"};
static const struct listfmt foos = {
    .list_kind = "FooList", .kind = "Foo", .api_version = "example.com/v1", .unstructured = true};

static void
check(char *got, const size_t *len, const char *want, const char *name)
{
    is_int((long long)*len, (long long)strlen(want), name);
    is_str(got, want, name);
    free(got);
}

static void
test_typed(void)
{
    size_t n;
    struct listfmt_meta m = {.rv = 42, .remaining = -1};
    check(listfmt_head(&pods, &m, &n), &n,
          "{\"kind\":\"PodList\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":\"42\"},"
          "\"items\":[",
          "typed head, no continue");
    check(listfmt_tail(&pods, &m, &n), &n, "]}\n", "typed tail");
    m = (struct listfmt_meta){.rv = 7, .cont = "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ", .remaining = 0};
    check(
        listfmt_head(&deps, &m, &n), &n,
        "{\"kind\":\"DeploymentList\",\"apiVersion\":\"apps/v1\",\"metadata\":{\"resourceVersion\":"
        "\"7\",\"continue\":\"eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ\",\"remainingItemCount\":0},"
        "\"items\":[",
        "typed head with continue and a zero remainingItemCount (a pointer: 0 is written)");
    m = (struct listfmt_meta){.rv = 18446744073709551615ull, .cont = "", .remaining = -1};
    check(listfmt_head(&pods, &m, &n), &n,
          "{\"kind\":\"PodList\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":"
          "\"18446744073709551615\"},\"items\":[",
          "an empty continue is omitted; rv up to 2^64-1");
}

static void
test_unstructured(void)
{
    size_t n;
    struct listfmt_meta m = {.rv = 42, .remaining = -1};
    check(listfmt_head(&foos, &m, &n), &n, "{\"apiVersion\":\"example.com/v1\",\"items\":[",
          "unstructured head");
    check(listfmt_tail(&foos, &m, &n), &n,
          "],\"kind\":\"FooList\",\"metadata\":{\"continue\":\"\",\"resourceVersion\":\"42\"}}\n",
          "unstructured tail: continue always present");
    m = (struct listfmt_meta){.rv = 9, .cont = "abc", .remaining = 12};
    check(listfmt_tail(&foos, &m, &n), &n,
          "],\"kind\":\"FooList\",\"metadata\":{\"continue\":\"abc\",\"remainingItemCount\":12,"
          "\"resourceVersion\":\"9\"}}\n",
          "unstructured tail, keys sorted");
}

static void
test_object(void)
{
    size_t n;
    const char *item = "{\"metadata\":{\"name\":\"a\"},\"spec\":{}}";
    check(listfmt_object(&pods, item, strlen(item), &n), &n,
          "{\"kind\":\"Pod\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"a\"},\"spec\":{}}\n",
          "typed GET puts TypeMeta back");
    check(listfmt_object(&pods, "{}", 2, &n), &n, "{\"kind\":\"Pod\",\"apiVersion\":\"v1\"}\n",
          "an empty object gets no stray comma");
    const char *cr = "{\"apiVersion\":\"example.com/v1\",\"kind\":\"Foo\",\"metadata\":{}}";
    check(listfmt_object(&foos, cr, strlen(cr), &n), &n,
          "{\"apiVersion\":\"example.com/v1\",\"kind\":\"Foo\",\"metadata\":{}}\n",
          "custom resources are served as stored");
}

int
main(void)
{
    TAP_RUN(test_typed);
    TAP_RUN(test_unstructured);
    TAP_RUN(test_object);
    return tap_done();
}
