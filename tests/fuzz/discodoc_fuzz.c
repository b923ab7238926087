/*
 * discodoc_fuzz.c — libFuzzer target for the discovery document reader
 * (proxy/upstream/discodoc.c): the upstream's discovery answers, untrusted
 * bytes read into a model.
 *
 * Input: the document (any bytes). Each is read as a discovery document
 * into a model that already holds one (a model is built from several) and
 * as an APIServiceList. Checked: a document that is refused leaves the
 * model as it was; after freezing, every resource is found by its own key
 * and is that resource, no key twice; the aggregation marks follow the
 * APIService list's group versions.
 */
#include "kwc/discodoc.h"

#include <assert.h>
#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char seed[] =
    "{\"kind\":\"APIResourceList\",\"groupVersion\":\"v1\",\"resources\":[{\"name\":\"pods\","
    "\"namespaced\":true,\"kind\":\"Pod\",\"verbs\":[\"list\",\"watch\"]}]}";

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data;
    char err[256];
    struct ddoc_model m, agg;
    ddoc_model_init(&m);
    ddoc_model_init(&agg);
    assert(ddoc_add(&m, seed, sizeof(seed) - 1, err, sizeof(err)) == DDOC_RESOURCES);
    size_t nres = m.nres, ngvs = m.ngvs, npool = m.npool;
    enum ddoc_kind k = ddoc_add(&m, p, size, err, sizeof(err));
    if (k == DDOC_INVALID || k == DDOC_APISERVICES)
        assert(m.nres == nres && m.ngvs == ngvs && m.npool == npool);
    int n = ddoc_apiservices(&agg, p, size, err, sizeof(err));
    assert(n == -1 ? agg.ngvs == 0 : agg.ngvs == (size_t)n);
    ddoc_mark_aggregated(&m, &agg);
    ddoc_freeze(&m);
    for (size_t i = 0; i < m.nres; i++) {
        const struct disco_res *r = &m.res[i];
        assert(ddoc_find(&m, r->group, r->version, r->resource) == r);
        assert(ddoc_has_gv(&m, r->group, r->version) && ddoc_has_group(&m, r->group));
        assert(r->aggregated == ddoc_has_gv(&agg, r->group, r->version));
        assert(strlen(r->resource) > 0 && !strchr(r->resource, '/'));
    }
    for (size_t i = 1; i < m.nres; i++) {
        const struct disco_res *a = &m.res[m.index[i - 1]], *b = &m.res[m.index[i]];
        assert(strcmp(a->group, b->group) != 0 || strcmp(a->version, b->version) != 0 ||
               strcmp(a->resource, b->resource) != 0);
    }
    assert(ddoc_same(&m, &m));
    ddoc_model_fini(&m);
    ddoc_model_fini(&agg);
    return 0;
}
