/*
 * discodoc.c — discovery documents into a model of the upstream's
 * resources (see discodoc.h). Pure: bytes in, a model out; disco.c does
 * the fetching. jansson reads each document whole (its size is bounded by
 * the caller); a document is checked for its shape before anything of it
 * is added, and an add that would pass a bound is undone, so a model
 * never holds half a document.
 */
#include "kwc/discodoc.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"

void
ddoc_model_init(struct ddoc_model *m)
{
    *m = (struct ddoc_model){0};
}

void
ddoc_model_fini(struct ddoc_model *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->npool; i++)
        free(m->pool[i]);
    free(m->pool);
    free(m->res);
    free(m->gvs);
    free(m->index);
    *m = (struct ddoc_model){0};
}

/* ---- building ---- */

static const char *
pool_add(struct ddoc_model *m, const char *s)
{
    if (m->npool == m->cappool) {
        m->cappool = m->cappool ? m->cappool * 2 : 64;
        m->pool = xrealloc(m->pool, m->cappool * sizeof(*m->pool));
    }
    char *c = xstrdup(s);
    m->pool[m->npool++] = c;
    return c;
}

/* Undo every add since the mark (a bound passed mid-document). */
struct mark {
    size_t nres, ngvs, npool;
};

static struct mark
mark_of(const struct ddoc_model *m)
{
    return (struct mark){m->nres, m->ngvs, m->npool};
}

static void
undo(struct ddoc_model *m, struct mark k)
{
    for (size_t i = k.npool; i < m->npool; i++)
        free(m->pool[i]);
    m->npool = k.npool;
    m->nres = k.nres;
    m->ngvs = k.ngvs;
}

/* A string member short enough and without NUL bytes, or NULL. */
static const char *
str_of(const json_t *v)
{
    const char *s = json_string_value(v);
    if (!s)
        return NULL;
    size_t n = json_string_length(v);
    if (n > DDOC_MAX_NAME || strlen(s) != n)
        return NULL;
    return s;
}

static const char *
member(const json_t *o, const char *key)
{
    return str_of(json_object_get(o, key));
}

static int
add_gv(struct ddoc_model *m, const char *group, const char *version)
{
    if (m->ngvs >= DDOC_MAX_GVS)
        return -1;
    if (m->ngvs == m->capgvs) {
        m->capgvs = m->capgvs ? m->capgvs * 2 : 16;
        m->gvs = xrealloc(m->gvs, m->capgvs * sizeof(*m->gvs));
    }
    m->gvs[m->ngvs++] = (struct ddoc_gv){pool_add(m, group), pool_add(m, version)};
    return 0;
}

static bool
has_verb(const json_t *verbs, const char *verb)
{
    size_t i;
    const json_t *v;
    json_array_foreach(verbs, i, v)
    {
        const char *s = str_of(v);
        if (s && strcmp(s, verb) == 0)
            return true;
    }
    return false;
}

static int
add_res(struct ddoc_model *m, const char *group, const char *version, const char *resource,
        const char *kind, bool namespaced, const json_t *verbs)
{
    if (m->nres >= DDOC_MAX_RESOURCES)
        return -1;
    if (m->nres == m->capres) {
        m->capres = m->capres ? m->capres * 2 : 64;
        m->res = xrealloc(m->res, m->capres * sizeof(*m->res));
    }
    m->res[m->nres++] = (struct disco_res){.group = pool_add(m, group),
                                           .version = pool_add(m, version),
                                           .resource = pool_add(m, resource),
                                           .kind = pool_add(m, kind ? kind : ""),
                                           .namespaced = namespaced,
                                           .list = has_verb(verbs, "list"),
                                           .watch = has_verb(verbs, "watch")};
    return 0;
}

/* apidiscovery v2/v2beta1 APIGroupDiscoveryList */
static int
add_aggregated(struct ddoc_model *m, const json_t *doc)
{
    size_t i, j, k;
    const json_t *item, *ver, *r;
    json_array_foreach(json_object_get(doc, "items"), i, item)
    {
        const char *group = member(json_object_get(item, "metadata"), "name");
        if (!group)
            group = "";
        json_array_foreach(json_object_get(item, "versions"), j, ver)
        {
            const char *version = member(ver, "version");
            if (!version || !*version)
                continue;
            if (add_gv(m, group, version) != 0)
                return -1;
            json_array_foreach(json_object_get(ver, "resources"), k, r)
            {
                const char *name = member(r, "resource");
                if (!name || !*name || strchr(name, '/'))
                    continue;
                const char *scope = member(r, "scope");
                if (add_res(m, group, version, name,
                            member(json_object_get(r, "responseKind"), "kind"),
                            scope && strcmp(scope, "Namespaced") == 0,
                            json_object_get(r, "verbs")) != 0)
                    return -1;
            }
        }
    }
    return 0;
}

/* meta/v1 APIVersions: the core group's versions */
static int
add_versions(struct ddoc_model *m, const json_t *doc)
{
    size_t i;
    const json_t *v;
    json_array_foreach(json_object_get(doc, "versions"), i, v)
    {
        const char *version = str_of(v);
        if (version && *version && add_gv(m, "", version) != 0)
            return -1;
    }
    return 0;
}

/* meta/v1 APIGroupList: every group's versions */
static int
add_groups(struct ddoc_model *m, const json_t *doc)
{
    size_t i, j;
    const json_t *g, *v;
    json_array_foreach(json_object_get(doc, "groups"), i, g)
    {
        const char *group = member(g, "name");
        if (!group || !*group)
            continue;
        json_array_foreach(json_object_get(g, "versions"), j, v)
        {
            const char *version = member(v, "version");
            if (!version || !*version)
                continue;
            if (add_gv(m, group, version) != 0)
                return -1;
        }
    }
    return 0;
}

/* "G/V" or "V" into group and version (buffers of DDOC_MAX_NAME + 1). */
static bool
split_gv(const char *gv, char *group, char *version)
{
    const char *slash = strchr(gv, '/');
    if (!slash) {
        group[0] = '\0';
        snprintf(version, DDOC_MAX_NAME + 1, "%s", gv);
    } else {
        snprintf(group, DDOC_MAX_NAME + 1, "%.*s", (int)(slash - gv), gv);
        snprintf(version, DDOC_MAX_NAME + 1, "%s", slash + 1);
    }
    return version[0] && !strchr(version, '/') && (!slash || group[0]);
}

/* meta/v1 APIResourceList */
static int
add_resources(struct ddoc_model *m, const json_t *doc, const char *group, const char *version)
{
    size_t i;
    const json_t *r;
    if (add_gv(m, group, version) != 0)
        return -1;
    json_array_foreach(json_object_get(doc, "resources"), i, r)
    {
        const char *name = member(r, "name");
        if (!name || !*name || strchr(name, '/'))
            continue;
        if (add_res(m, group, version, name, member(r, "kind"),
                    json_is_true(json_object_get(r, "namespaced")),
                    json_object_get(r, "verbs")) != 0)
            return -1;
    }
    return 0;
}

static json_t *
load(const char *p, size_t n, char *err, size_t errlen)
{
    json_error_t je;
    json_t *doc = json_loadb(p, n, 0, &je);
    if (!doc) {
        snprintf(err, errlen, "not JSON: %s (at byte %d)", je.text, je.position);
        return NULL;
    }
    if (!json_is_object(doc)) {
        snprintf(err, errlen, "not a JSON object");
        json_decref(doc);
        return NULL;
    }
    return doc;
}

static enum ddoc_kind
kind_of(const json_t *doc)
{
    const char *kind = member(doc, "kind");
    if (!kind)
        return DDOC_INVALID;
    if (strcmp(kind, "APIGroupDiscoveryList") == 0)
        return DDOC_AGGREGATED;
    if (strcmp(kind, "APIVersions") == 0)
        return DDOC_VERSIONS;
    if (strcmp(kind, "APIGroupList") == 0)
        return DDOC_GROUPS;
    if (strcmp(kind, "APIResourceList") == 0)
        return DDOC_RESOURCES;
    if (strcmp(kind, "APIServiceList") == 0)
        return DDOC_APISERVICES;
    return DDOC_INVALID;
}

enum ddoc_kind
ddoc_add(struct ddoc_model *m, const char *p, size_t n, char *err, size_t errlen)
{
    json_t *doc = load(p, n, err, errlen);
    if (!doc)
        return DDOC_INVALID;
    enum ddoc_kind kind = kind_of(doc);
    struct mark k = mark_of(m);
    int rc = 0;
    char group[DDOC_MAX_NAME + 1], version[DDOC_MAX_NAME + 1];
    const char *gv;
    switch (kind) {
    case DDOC_AGGREGATED:
        if (!json_is_array(json_object_get(doc, "items")))
            goto bad_shape;
        rc = add_aggregated(m, doc);
        break;
    case DDOC_VERSIONS:
        if (!json_is_array(json_object_get(doc, "versions")))
            goto bad_shape;
        rc = add_versions(m, doc);
        break;
    case DDOC_GROUPS:
        if (!json_is_array(json_object_get(doc, "groups")))
            goto bad_shape;
        rc = add_groups(m, doc);
        break;
    case DDOC_RESOURCES:
        gv = member(doc, "groupVersion");
        if (!gv || !split_gv(gv, group, version) ||
            !json_is_array(json_object_get(doc, "resources")))
            goto bad_shape;
        rc = add_resources(m, doc, group, version);
        break;
    case DDOC_APISERVICES:
        break;
    case DDOC_INVALID: {
        const char *kn = member(doc, "kind");
        snprintf(err, errlen, "not a discovery document (kind %s%s%s)", kn ? "\"" : "",
                 kn ? kn : "missing", kn ? "\"" : "");
        json_decref(doc);
        return DDOC_INVALID;
    }
    }
    json_decref(doc);
    if (rc != 0) {
        undo(m, k);
        snprintf(err, errlen, "more than %d resources or %d group versions", DDOC_MAX_RESOURCES,
                 DDOC_MAX_GVS);
        return DDOC_INVALID;
    }
    return kind;
bad_shape:
    snprintf(err, errlen, "a malformed %s", member(doc, "kind"));
    json_decref(doc);
    return DDOC_INVALID;
}

int
ddoc_apiservices(struct ddoc_model *out, const char *p, size_t n, char *err, size_t errlen)
{
    json_t *doc = load(p, n, err, errlen);
    if (!doc)
        return -1;
    const json_t *items = json_object_get(doc, "items");
    if (kind_of(doc) != DDOC_APISERVICES || !json_is_array(items)) {
        snprintf(err, errlen, "not an APIServiceList");
        json_decref(doc);
        return -1;
    }
    struct mark k = mark_of(out);
    int count = 0;
    size_t i;
    const json_t *item;
    json_array_foreach(items, i, item)
    {
        const json_t *spec = json_object_get(item, "spec");
        const char *group = member(spec, "group"), *version = member(spec, "version");
        /* local APIServices (the built-in groups, CRDs) have service null */
        if (!version || !*version || !json_is_object(json_object_get(spec, "service")))
            continue;
        if (add_gv(out, group ? group : "", version) != 0) {
            undo(out, k);
            json_decref(doc);
            snprintf(err, errlen, "more than %d APIServices", DDOC_MAX_GVS);
            return -1;
        }
        count++;
    }
    json_decref(doc);
    return count;
}

static bool
gv_in(const struct ddoc_model *m, const char *group, const char *version)
{
    for (size_t i = 0; i < m->ngvs; i++)
        if (strcmp(m->gvs[i].group, group) == 0 && strcmp(m->gvs[i].version, version) == 0)
            return true;
    return false;
}

void
ddoc_mark_aggregated(struct ddoc_model *m, const struct ddoc_model *agg)
{
    for (size_t i = 0; i < m->nres; i++)
        m->res[i].aggregated = agg && gv_in(agg, m->res[i].group, m->res[i].version);
}

/* ---- freezing and lookups ---- */

static int
key_cmp(const char *ga, const char *va, const char *ra, const char *gb, const char *vb,
        const char *rb)
{
    int c = strcmp(ga, gb);
    if (c == 0)
        c = strcmp(va, vb);
    if (c == 0)
        c = strcmp(ra, rb);
    return c;
}

static const struct ddoc_model *sort_model; /* qsort has no argument: single-threaded use */

static int
index_cmp(const void *a, const void *b)
{
    const struct disco_res *x = &sort_model->res[*(const size_t *)a];
    const struct disco_res *y = &sort_model->res[*(const size_t *)b];
    int c = key_cmp(x->group, x->version, x->resource, y->group, y->version, y->resource);
    if (c == 0) /* the first in discovery's order first */
        c = *(const size_t *)a < *(const size_t *)b ? -1 : 1;
    return c;
}

static void
build_index(struct ddoc_model *m)
{
    free(m->index);
    m->index = xmalloc((m->nres ? m->nres : 1) * sizeof(*m->index));
    for (size_t i = 0; i < m->nres; i++)
        m->index[i] = i;
    sort_model = m;
    qsort(m->index, m->nres, sizeof(*m->index), index_cmp);
    sort_model = NULL;
}

void
ddoc_freeze(struct ddoc_model *m)
{
    /* a resource named twice (a version listed by two documents) is kept
     * where it came first */
    build_index(m);
    bool *drop = xcalloc(m->nres ? m->nres : 1, sizeof(*drop));
    bool any = false;
    for (size_t i = 1; i < m->nres; i++) {
        const struct disco_res *a = &m->res[m->index[i - 1]], *b = &m->res[m->index[i]];
        if (key_cmp(a->group, a->version, a->resource, b->group, b->version, b->resource) == 0)
            any = drop[m->index[i]] = true;
    }
    if (any) {
        size_t w = 0;
        for (size_t i = 0; i < m->nres; i++)
            if (!drop[i])
                m->res[w++] = m->res[i];
        m->nres = w;
        build_index(m);
    }
    free(drop);
    size_t w = 0;
    for (size_t i = 0; i < m->ngvs; i++) {
        bool seen = false;
        for (size_t j = 0; j < w && !seen; j++)
            seen = strcmp(m->gvs[j].group, m->gvs[i].group) == 0 &&
                   strcmp(m->gvs[j].version, m->gvs[i].version) == 0;
        if (!seen)
            m->gvs[w++] = m->gvs[i];
    }
    m->ngvs = w;
    m->frozen = true;
}

const struct disco_res *
ddoc_find(const struct ddoc_model *m, const char *group, const char *version, const char *resource)
{
    size_t lo = 0, hi = m->frozen ? m->nres : 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const struct disco_res *r = &m->res[m->index[mid]];
        int c = key_cmp(r->group, r->version, r->resource, group, version, resource);
        if (c == 0)
            return r;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

bool
ddoc_has_gv(const struct ddoc_model *m, const char *group, const char *version)
{
    return gv_in(m, group, version);
}

bool
ddoc_has_group(const struct ddoc_model *m, const char *group)
{
    for (size_t i = 0; i < m->ngvs; i++)
        if (strcmp(m->gvs[i].group, group) == 0)
            return true;
    return false;
}

bool
ddoc_same(const struct ddoc_model *a, const struct ddoc_model *b)
{
    if (a->nres != b->nres)
        return false;
    for (size_t i = 0; i < a->nres; i++) {
        const struct disco_res *x = &a->res[i], *y = &b->res[i];
        if (strcmp(x->group, y->group) != 0 || strcmp(x->version, y->version) != 0 ||
            strcmp(x->resource, y->resource) != 0 || strcmp(x->kind, y->kind) != 0 ||
            x->namespaced != y->namespaced || x->list != y->list || x->watch != y->watch ||
            x->aggregated != y->aggregated)
            return false;
    }
    return true;
}
