/*
 * admit.c — the admission decision for gets, lists and watches (see
 * admit.h). Reads the request and the caches' state it is given, and
 * nothing else: the reflectors and the store appear only in the adapter at
 * the end (admit_refls_init), which serve.c and watch.c hand in.
 */
#include "kwc/admit.h"

#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"
#include "kwc/kinds.h"
#include "kwc/reflector.h"
#include "kwc/route.h"
#include "kwc/selector.h"
#include "kwc/store.h"

static const char *const why_names[] = {
#define ADMIT_WHY_NAME(e, s) s,
    ADMIT_WHYS(ADMIT_WHY_NAME)
#undef ADMIT_WHY_NAME
};

const char *
admit_why_name(enum admit_why w)
{
    return (unsigned)w < sizeof(why_names) / sizeof(why_names[0]) ? why_names[w] : "?";
}

int
admit_find(const struct admit_caches *c, const struct route_req *r, enum kwc_enc enc)
{
    size_t n = c->count ? c->count(c->arg) : c->n;
    for (size_t i = 0; i < n; i++) {
        struct admit_cache ac;
        c->cache(c->arg, i, &ac);
        const struct refl_desc *d = ac.d;
        if ((d->kind || !ac.started) && d->enc == enc && strcmp(d->group, r->group) == 0 &&
            strcmp(d->version, r->version) == 0 && strcmp(d->resource, r->resource) == 0)
            return (int)i;
    }
    return -1;
}

bool
admit_serves_fields(const struct refl_desc *d, const struct sel *sel)
{
    for (size_t i = 0; i < sel_field_count(sel); i++) {
        const char *f = sel_field_name(sel, i);
        bool found = false;
        for (size_t j = 0; j < d->n_fields && !found; j++)
            found = strcmp(f, d->field_names[j]) == 0;
        if (!found || (!d->namespaced && strcmp(f, "metadata.namespace") == 0))
            return false;
    }
    return true;
}

/* A cluster-scoped resource is served at <path> and <path>/<name> only. The
 * route gives "namespaces/X" the namespace X, as kube does, so a Namespace's
 * own get (/api/v1/namespaces/X) carries one. */
static bool
cluster_path(const struct refl_desc *d, const struct route_req *r)
{
    if (!r->namespace_)
        return true;
    size_t pl = strlen(d->path);
    return r->name && strncmp(r->path, d->path, pl) == 0 && r->path[pl] == '/' &&
           strcmp(r->path + pl + 1, r->name) == 0;
}

static void
pass(struct admit *a, enum admit_why why)
{
    a->action = ADMIT_PASS;
    a->why = why;
}

/* The part of the decision that needs no cache: is this a read a cache
 * could answer, and in which encoding (a->enc, a->meta, a->pretty and the
 * error's encoding). False: a->action says why it passes. */
static bool
target(const struct admit_req *q, struct admit *a)
{
    const struct route_req *r = q->r;
    *a = (struct admit){.cache = -1};
    a->verb = r->verb == ROUTE_WATCH  ? DECIDE_WATCH
              : r->verb == ROUTE_LIST ? DECIDE_LIST
                                      : DECIDE_GET;
    if (!r->is_resource || !r->resource || r->subresource || strcmp(q->method, "GET") != 0 ||
        (r->verb != ROUTE_GET && r->verb != ROUTE_LIST && r->verb != ROUTE_WATCH) ||
        (r->verb == ROUTE_WATCH && r->name)) {
        pass(a, ADMIT_WHY_NOT_READ);
        return false;
    }
    /* JSON from the JSON cache, protobuf (built-in kinds) from the protobuf
     * one; kube's protobuf serializer has no pretty form: ?pretty and a curl
     * User-Agent indent JSON only */
    bool builtin = kinds_builtin_group(r->group);
    enum route_media media = route_negotiate(q->accept, builtin);
    struct route_accept acc;
    route_accept(q->accept, builtin, &acc);
    if (acc.as != ROUTE_AS_NONE && acc.media != ROUTE_MEDIA_OTHER) {
        /* metadata only: a list asks for the List kind, a get or a watch for
         * the object's (else kube's 406, the upstream's to write) */
        if ((acc.as == ROUTE_AS_POML) != (a->verb == DECIDE_LIST)) {
            pass(a, ADMIT_WHY_MEDIA);
            return false;
        }
        a->meta = true;
        media = acc.media;
    } else if (acc.media == ROUTE_MEDIA_OTHER ||
               (media != ROUTE_MEDIA_OTHER && media != acc.media)) {
        /* route_negotiate reads no q=: where goautoneg's order by q makes
         * another clause kube's winner (YAML, a Table, another encoding
         * with q=2), the upstream answers */
        media = ROUTE_MEDIA_OTHER;
    } else if (acc.pretty && acc.media == ROUTE_MEDIA_JSON) {
        media = ROUTE_MEDIA_JSON; /* application/json;pretty=1 */
    }
    if (media == ROUTE_MEDIA_OTHER) {
        pass(a, ADMIT_WHY_MEDIA);
        return false;
    }
    /* a custom resource has no protobuf cache: its metadata in protobuf is
     * derived from its JSON cache (pom_pb_from_json), as kube converts the
     * unstructured object to a typed PartialObjectMetadata */
    a->pom_from_json = media == ROUTE_MEDIA_PROTOBUF && !builtin && a->meta;
    if (media == ROUTE_MEDIA_PROTOBUF && !builtin && !a->meta) {
        pass(a, ADMIT_WHY_NOT_CACHED);
        return false;
    }
    /* pretty: the winning clause's pretty=1, or isPrettyPrint (?pretty, a
     * curl-like User-Agent); kube's NegotiateOutputMediaType ORs them */
    bool wants_pretty = route_wants_pretty(&r->q, q->user_agent);
    a->pretty = media == ROUTE_MEDIA_JSON && (acc.pretty || wants_pretty);
    a->error_pretty = a->pretty;
    if (a->meta) {
        /* the Status is negotiated without conversions: a metadata-only
         * Accept with no other clause gets WriteRawJSON's indented form */
        struct route_accept st;
        route_accept_status(q->accept, &st);
        if (st.none)
            a->error_pretty = true;
        else if (st.media == ROUTE_MEDIA_JSON)
            a->error_pretty = st.pretty || wants_pretty;
        else
            a->error_upstream = true;
    }
    a->enc = media == ROUTE_MEDIA_PROTOBUF ? KWC_ENC_PB : KWC_ENC_JSON;
    return true;
}

/* The encoding of the cache that answers a: the answer's, but a custom
 * resource's protobuf metadata comes from its JSON cache. */
static enum kwc_enc
cache_enc(const struct admit *a)
{
    return a->pom_from_json ? KWC_ENC_JSON : a->enc;
}

bool
admit_wants(const struct admit_req *q, enum kwc_enc *enc)
{
    struct admit a;
    bool ok = target(q, &a);
    *enc = cache_enc(&a);
    return ok;
}

void
admit_decide(const struct admit_req *q, const struct admit_caches *c, struct admit *a)
{
    const struct route_req *r = q->r;
    if (!target(q, a))
        return;
    a->cache = admit_find(c, r, cache_enc(a));
    if (a->cache < 0) {
        pass(a, ADMIT_WHY_NOT_CACHED);
        return;
    }
    struct admit_cache ac;
    c->cache(c->arg, (size_t)a->cache, &ac);
    if (!ac.serving) {
        /* a lazily started protobuf cache starts now */
        a->want = cache_enc(a) == KWC_ENC_PB && !ac.started;
        pass(a, ADMIT_WHY_NOT_SERVING);
        return;
    }
    const struct refl_desc *d = ac.d;
    bool collection = a->verb != DECIDE_GET;
    if (d->namespaced ? (!collection && !r->namespace_) : !cluster_path(d, r)) {
        pass(a, ADMIT_WHY_PATH); /* not a path kube serves this resource at: its 404 */
        return;
    }

    char *sel_err = NULL;
    if (collection &&
        sel_parse(r->q.label_selector, r->q.field_selector, &a->sel, &sel_err) == KWC_ETOOBIG) {
        free(sel_err);
        pass(a, ADMIT_WHY_SELECTOR_BOUNDS);
        return;
    }
    a->current_rv = c->rv(c->arg, (size_t)a->cache, &a->floor_rv);
    struct decide_req dq;
    route_decide_req(r, a->verb, a->sel && !sel_is_everything(a->sel), sel_err, &dq);
    struct decide_cache dc = {.synced = true, .current_rv = a->current_rv, .floor_rv = a->floor_rv};
    if (a->verb == DECIDE_WATCH)
        decide_watch(&dq, &dc, &a->dec);
    else
        decide_read(&dq, &dc, q->too_large, &a->dec);
    free(sel_err);

    enum decide_action act = a->dec.action;
    if (act == DECIDE_PASS_THROUGH) {
        pass(a, ADMIT_WHY_TABLE);
    } else if (act == DECIDE_SERVE_WATCH && !a->dec.initial && a->dec.rv < a->floor_rv) {
        /* Below the history floor (kwc started or rebuilt after the
         * client's rv): the upstream may still hold those events, as kube's
         * own window does; it answers, and sends the 410 itself if it has
         * them not either. */
        pass(a, ADMIT_WHY_BELOW_FLOOR);
    } else if (act == DECIDE_ERROR && (a->enc == KWC_ENC_PB || a->error_upstream ||
                                       route_negotiate(q->accept, true) == ROUTE_MEDIA_PROTOBUF)) {
        /* kwc writes the table's Status bodies in JSON; kube writes them in
         * protobuf when that is asked for (a custom resource's too: which
         * encoding kube writes a Status in for a resource without protobuf
         * is its serializer's business). Those cells depend on the request
         * alone (its parameters, or an rv the upstream issued), so the
         * upstream reaches the same answer and encodes it as asked. */
        pass(a, ADMIT_WHY_ERROR_ENCODING);
    } else if (act == DECIDE_ERROR && a->pretty && a->verb == DECIDE_WATCH) {
        /* a pretty watch's events are never indented (kube's watch encoder
         * is the stream serializer), but the Status of its error before the
         * stream is: watch.c writes it compact, the upstream answers it */
        pass(a, ADMIT_WHY_ERROR_ENCODING);
    } else if (act == DECIDE_ERROR && a->meta && a->verb == DECIDE_WATCH) {
        /* kube negotiates an error's encoding with no conversion: the as=
         * clauses do not count, and with no plain clause after them it
         * writes the Status indented (responsewriters WriteRawJSON) */
        pass(a, ADMIT_WHY_ERROR_ENCODING);
    } else if (act != DECIDE_ERROR && a->sel && !admit_serves_fields(d, a->sel)) {
        pass(a, ADMIT_WHY_FIELDS);
    } else {
        a->action = act == DECIDE_ERROR ? ADMIT_ERROR : ADMIT_SERVE;
    }
    if (a->action == ADMIT_PASS) {
        decide_result_fini(&a->dec);
        sel_free(a->sel);
        a->sel = NULL;
        return;
    }
    a->bookmarks = a->verb == DECIDE_WATCH && r->q.allow_watch_bookmarks &&
                   kwc_query_bool(r->q.allow_watch_bookmarks, strlen(r->q.allow_watch_bookmarks));
}

void
admit_fini(struct admit *a)
{
    decide_result_fini(&a->dec);
    sel_free(a->sel);
    a->sel = NULL;
}

/* ---- kwc's caches: the reflectors and the store ---- */

static void
refls_cache(const void *arg, size_t i, struct admit_cache *out)
{
    const struct admit_refls *ar = arg;
    const struct refl *rf = ar->set->r[i];
    *out = (struct admit_cache){
        .d = refl_desc(rf), .started = refl_started(rf), .serving = refl_serving(rf)};
}

static uint64_t
refls_rv(const void *arg, size_t i, uint64_t *floor)
{
    const struct admit_refls *ar = arg;
    return store_res_rv(ar->st, refl_desc(ar->set->r[i])->sres, floor);
}

static size_t
refls_count(const void *arg)
{
    const struct admit_refls *ar = arg;
    return ar->set->n;
}

void
admit_refls_init(struct admit_refls *ar, const struct refl_set *set, struct store *st)
{
    *ar = (struct admit_refls){
        .c = {.count = refls_count, .cache = refls_cache, .rv = refls_rv, .arg = ar},
        .set = set,
        .st = st};
}
