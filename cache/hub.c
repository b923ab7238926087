/*
 * hub.c — watch fan-out (see hub.h).
 *
 * One struct hub per worker loop. Per cached resource it keeps `struct hres`:
 * the rv of the last batch applied, its watchers in index buckets (one per
 * namespace, one per value of the indexed field, one for the rest), and the
 * watchers still waiting for an rv. An event visits the "rest" bucket, its
 * namespace's bucket and the buckets of its object's and previous object's
 * indexed value, and nothing else: a kubelet's watcher pinned to its node is
 * never looked at for another node's pods.
 *
 * Selector transitions follow kube-apiserver's cacheWatcher.convertToWatchEvent:
 * the object matches now and did not before -> ADDED; matched before and not
 * now -> DELETED carrying the previous object stamped with the event's rv; a
 * DELETED is judged by the previous object.
 *
 * Encoders: enc_event and enc_bookmark write one event in the resource's
 * encoding. JSON: a line, TypeMeta put back in front of the stored item.
 * Protobuf: a frame (pb_frame_event) around the stored object message; the
 * envelope names the kind, so the item needs no change, and a DELETED at
 * another rv carries a copy with that rv (pb_with_rv), as JSON swaps the
 * rv's digits (obj_rv_span). A metadata-only watcher (hub.h "Forms") gets
 * the same events with each object's PartialObjectMetadata (pom.h) in the
 * same framing: an event holds a blob per (form, variant), so each form is
 * encoded once, when its first watcher needs it. A JSON cache has a third
 * form, metadata in protobuf frames (a custom resource's: kwc keeps no
 * protobuf cache of those), derived from the JSON object (pom_pb_from_json).
 */
#include "kwc/hub.h"

#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>

#include "kwc/base.h"
#include "kwc/gostr.h"
#include "kwc/index.h"
#include "kwc/object.h"
#include "kwc/pb.h"
#include "kwc/pom.h"
#include "kwc/selector.h"
#include "kwc/status.h"

/* ---- blobs ---- */

void
hub_blob_ref(struct hub_blob *b)
{
    __atomic_add_fetch(&b->refs, 1, __ATOMIC_RELAXED);
}

void
hub_blob_unref(struct hub_blob *b)
{
    if (b && __atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) == 0)
        free(b);
}

/* A new blob holding the event lines in lines[0, n), with r's room around
 * them (hub_frame): framed there now, before anyone else sees the blob. */
static struct hub_blob *
blob_new(const struct hub_res *r, const char *lines, size_t n)
{
    const struct hub_frame *f = &r->frame;
    struct hub_blob *b = xmalloc(sizeof(*b) + f->head + n + f->tail);
    b->refs = 1;
    b->len = n;
    b->data = b->room + f->head;
    memcpy(b->data, lines, n);
    b->framed = f->frame && n > 0;
    if (b->framed)
        f->frame(b->data, n);
    return b;
}

static struct hub_blob *
blob_take(const struct hub_res *r, struct gostr_buf *b)
{
    struct hub_blob *out = blob_new(r, b->p ? b->p : "", b->len);
    free(gostr_take(b));
    return out;
}

/* ---- encoding ---- */

/* What a watcher's events carry (hub.h "Forms"): the objects; their
 * PartialObjectMetadata in the cache's encoding; or, from a JSON cache, their
 * PartialObjectMetadata in protobuf frames (hub_watch_req.meta_pb). */
enum form { FORM_FULL, FORM_META, FORM_META_PB, FORM_N };

/* A metadata-only watcher's objects (Accept ...;as=PartialObjectMetadata;
 * g=meta.k8s.io;v=v1): kube's watch handler passes every event's object,
 * bookmarks included, through transformObject, which makes it a
 * PartialObjectMetadata (POM_API_VERSION, POM_KIND); a Status (an
 * ERROR's) is left as it is. */

/* One protobuf frame of type around obj (an object message); with rv set,
 * the object's metadata.resourceVersion is rv. meta: the frame carries the
 * object's PartialObjectMetadata instead (pom_pb: its ObjectMeta copied). */
static void
enc_event_pb(struct gostr_buf *b, const struct hub_res *r, const char *type, const char *obj,
             size_t len, uint64_t rv, bool meta)
{
    char *copy = NULL;
    size_t clen = 0;
    if (rv && pb_with_rv(obj, len, rv, &copy, &clen) == 0) {
        obj = copy;
        len = clen;
    }
    if (meta) {
        /* a stored object is a message pb_meta_parse read: pom_pb cannot
         * fail on it; if it did, an empty ObjectMeta says so to no one */
        struct gostr_buf m = {0};
        (void)pom_pb(&m, obj, len);
        pb_frame_event(b, type, POM_API_VERSION, POM_KIND, m.p ? m.p : "", m.len);
        free(gostr_take(&m));
    } else {
        pb_frame_event(b, type, r->api_version, r->kind, obj, len);
    }
    free(copy);
}

/* A stored JSON item with its metadata.resourceVersion rv, when rv is set
 * and the item has one: a copy (new in *copy, *len updated); else obj. */
static const char *
json_with_rv(const char *obj, size_t *len, uint64_t rv, char **copy)
{
    size_t roff = 0, rlen = 0;
    *copy = NULL;
    if (!rv || obj_rv_span(obj, *len, &roff, &rlen) != 0)
        return obj;
    struct gostr_buf c = {0};
    gostr_addn(&c, obj, roff);
    gostr_addc(&c, '"');
    gostr_addu(&c, rv);
    gostr_addc(&c, '"');
    gostr_addn(&c, obj + roff + rlen, *len - roff - rlen);
    *len = c.len;
    return *copy = gostr_take(&c);
}

/* One protobuf frame of type whose object is the PartialObjectMetadata of
 * a stored JSON item (pom_pb_from_json), its resourceVersion rv when rv is
 * set: a custom resource's metadata in protobuf, as kube's watch handler
 * makes it (transformObject, then the protobuf stream serializer). */
static void
enc_event_meta_pb_json(struct gostr_buf *b, const char *type, const char *obj, size_t len,
                       uint64_t rv)
{
    char *copy;
    obj = json_with_rv(obj, &len, rv, &copy);
    /* stored items are JSON objects (obj_meta_parse read them at ingest):
     * pom_pb_from_json cannot fail on them; if it did, an empty message
     * says so to no one */
    struct gostr_buf m = {0};
    (void)pom_pb_from_json(&m, obj, len);
    pb_frame_event(b, type, POM_API_VERSION, POM_KIND, m.p ? m.p : "", m.len);
    free(gostr_take(&m));
    free(copy);
}

/* `{"type":T,"object":POM}\n`: the stored item's PartialObjectMetadata
 * (pom_json), its resourceVersion rv when rv is set. */
static void
enc_event_meta_json(struct gostr_buf *b, const struct hub_res *r, const char *type, const char *obj,
                    size_t len, uint64_t rv)
{
    char *copy;
    obj = json_with_rv(obj, &len, rv, &copy);
    gostr_add(b, "{\"type\":\"");
    gostr_add(b, type);
    gostr_add(b, "\",\"object\":");
    /* stored items are JSON objects (obj_meta_parse read them at ingest) */
    if (pom_json(b, obj, len, r->unstructured) != 0)
        gostr_add(b, "{\"kind\":\"" POM_KIND "\",\"apiVersion\":\"" POM_API_VERSION
                     "\",\"metadata\":{}}");
    gostr_add(b, "}\n");
    free(copy);
}

/* `{"type":T,"object":OBJ}\n` with OBJ in its watch form: built-in kinds get
 * their TypeMeta back (stored items are in list-item form); with rv set, the
 * object's metadata.resourceVersion is replaced by it. Protobuf: a frame.
 * FORM_META: OBJ is the object's PartialObjectMetadata; FORM_META_PB: that,
 * from a JSON item, in a protobuf frame. */
static void
enc_event(struct gostr_buf *b, const struct hub_res *r, const char *type, const char *obj,
          size_t len, uint64_t rv, enum form form)
{
    if (r->enc == KWC_ENC_PB) {
        enc_event_pb(b, r, type, obj, len, rv, form != FORM_FULL);
        return;
    }
    if (form == FORM_META_PB) {
        enc_event_meta_pb_json(b, type, obj, len, rv);
        return;
    }
    if (form == FORM_META) {
        enc_event_meta_json(b, r, type, obj, len, rv);
        return;
    }
    gostr_add(b, "{\"type\":\"");
    gostr_add(b, type);
    gostr_add(b, "\",\"object\":");
    size_t roff = 0, rlen = 0;
    bool swap = rv && obj_rv_span(obj, len, &roff, &rlen) == 0;
    size_t at = 0;
    if (!r->unstructured && len > 0 && obj[0] == '{') {
        gostr_add(b, "{\"kind\":\"");
        gostr_add(b, r->kind);
        gostr_add(b, "\",\"apiVersion\":\"");
        gostr_add(b, r->api_version);
        gostr_addc(b, '"');
        if (len > 1 && obj[1] != '}')
            gostr_addc(b, ',');
        at = 1;
    }
    if (swap) {
        gostr_addn(b, obj + at, roff - at);
        gostr_addc(b, '"');
        gostr_addu(b, rv);
        gostr_addc(b, '"');
        gostr_addn(b, obj + roff + rlen, len - roff - rlen);
    } else {
        gostr_addn(b, obj + at, len - at);
    }
    gostr_add(b, "}\n");
}

/* kube's bookmark object: TypeMeta and metadata.resourceVersion (and the
 * initial-events-end annotation); a custom resource's is an unstructured
 * map, keys sorted. meta: that object made a PartialObjectMetadata, as
 * transformObject makes it (a typed one, for custom resources too: the
 * same bytes with the POM's TypeMeta; in protobuf, the ObjectMeta of the
 * bookmark's object message). FORM_META_PB: the PartialObjectMetadata of
 * the JSON bookmark object in a protobuf frame. */
static void
enc_bookmark(struct gostr_buf *b, const struct hub_res *r, uint64_t rv, bool initial_end,
             enum form form)
{
    static const char ann[] = "\"annotations\":{\"k8s.io/initial-events-end\":\"true\"}";
    bool meta = form != FORM_FULL;
    if (r->enc == KWC_ENC_PB) {
        struct gostr_buf o = {0};
        pb_bookmark_obj(&o, rv, initial_end);
        enc_event_pb(b, r, "BOOKMARK", o.p ? o.p : "", o.len, 0, meta);
        free(gostr_take(&o));
        return;
    }
    if (form == FORM_META_PB) {
        struct gostr_buf o = {0};
        gostr_add(&o, "{\"metadata\":{");
        if (initial_end) {
            gostr_add(&o, ann);
            gostr_addc(&o, ',');
        }
        gostr_add(&o, "\"resourceVersion\":\"");
        gostr_addu(&o, rv);
        gostr_add(&o, "\"}}");
        enc_event_meta_pb_json(b, "BOOKMARK", o.p, o.len, 0);
        free(gostr_take(&o));
        return;
    }
    gostr_add(b, "{\"type\":\"BOOKMARK\",\"object\":{");
    if (r->unstructured && !meta) {
        gostr_add(b, "\"apiVersion\":\"");
        gostr_add(b, r->api_version);
        gostr_add(b, "\",\"kind\":\"");
        gostr_add(b, r->kind);
        gostr_add(b, "\",\"metadata\":{");
        if (initial_end) {
            gostr_add(b, ann);
            gostr_addc(b, ',');
        }
        gostr_add(b, "\"resourceVersion\":\"");
        gostr_addu(b, rv);
        gostr_add(b, "\"}}}\n");
        return;
    }
    gostr_add(b, "\"kind\":\"");
    gostr_add(b, meta ? POM_KIND : r->kind);
    gostr_add(b, "\",\"apiVersion\":\"");
    gostr_add(b, meta ? POM_API_VERSION : r->api_version);
    gostr_add(b, "\",\"metadata\":{\"resourceVersion\":\"");
    gostr_addu(b, rv);
    gostr_addc(b, '"');
    if (initial_end) {
        gostr_addc(b, ',');
        gostr_add(b, ann);
    }
    gostr_add(b, "}}}\n");
}

/* One ERROR event carrying a Status JSON (its line only, no framing). New
 * blob (one reference). */
static struct hub_blob *
error_blob(const struct hub_res *r, const char *status_json)
{
    struct gostr_buf b = {0};
    gostr_add(&b, "{\"type\":\"ERROR\",\"object\":");
    gostr_add(&b, status_json);
    gostr_add(&b, "}\n");
    return blob_take(r, &b);
}

#define STATUS_MAX_CAUSES 64

/* A failure Status as status_failure_json writes it, in protobuf (pb_status),
 * appended to b as an ERROR frame. The JSON is kwc's own; a field it lacks
 * is written empty, as kube writes an unset one. */
static void
enc_error_pb(struct gostr_buf *b, const char *status_json)
{
    json_t *st = json_loads(status_json, 0, NULL);
    json_t *det = json_object_get(st, "details");
    struct status_cause causes[STATUS_MAX_CAUSES];
    struct status_details d = {0};
    if (json_is_object(det)) {
        d.name = json_string_value(json_object_get(det, "name"));
        d.group = json_string_value(json_object_get(det, "group"));
        d.kind = json_string_value(json_object_get(det, "kind"));
        d.retry_after_seconds = (int)json_integer_value(json_object_get(det, "retryAfterSeconds"));
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(det, "causes"), i, c)
        {
            if (d.ncauses == STATUS_MAX_CAUSES)
                break;
            causes[d.ncauses++] =
                (struct status_cause){json_string_value(json_object_get(c, "reason")),
                                      json_string_value(json_object_get(c, "message")),
                                      json_string_value(json_object_get(c, "field"))};
        }
        d.causes = causes;
    }
    struct gostr_buf env = {0};
    pb_status(&env, (int)json_integer_value(json_object_get(st, "code")),
              json_string_value(json_object_get(st, "reason")),
              json_string_value(json_object_get(st, "message")), json_is_object(det) ? &d : NULL);
    json_decref(st);
    /* pb_status writes the envelope; the frame wants the Status message */
    struct pb_envelope e;
    if (pb_envelope_parse(env.p, env.len, &e, NULL, 0) == 0)
        pb_frame_event(b, "ERROR", "v1", "Status", env.p + e.raw_off, e.raw_len);
    free(gostr_take(&env));
}

/* The same in r's encoding (and form: FORM_META_PB writes protobuf): for
 * protobuf, one frame whose object is the Status (as status_failure_json
 * writes it: code, reason, message, details) in protobuf. New blob (one
 * reference). */
static struct hub_blob *
error_event(const struct hub_res *r, enum form form, const char *status_json)
{
    if (r->enc != KWC_ENC_PB && form != FORM_META_PB)
        return error_blob(r, status_json);
    struct gostr_buf b = {0};
    enc_error_pb(&b, status_json);
    return blob_take(r, &b);
}

static const char *
type_name(enum store_ev_type t)
{
    return t == STORE_ADDED ? "ADDED" : t == STORE_MODIFIED ? "MODIFIED" : "DELETED";
}

/* ---- resources ---- */

struct hub_res *
hub_res_new_enc(enum kwc_enc enc, unsigned id, struct store_res *sres, const char *kind,
                const char *api_version, bool unstructured, bool namespaced,
                const char *const *field_names, size_t n_fields, int index_field)
{
    struct hub_res *r = xcalloc(1, sizeof(*r));
    r->id = id;
    r->enc = enc;
    r->sres = sres;
    r->kind = xstrdup(kind);
    r->api_version = xstrdup(api_version);
    r->unstructured = unstructured;
    r->namespaced = namespaced;
    r->n_fields = n_fields;
    r->field_names = xcalloc(n_fields + 1, sizeof(char *));
    for (size_t i = 0; i < n_fields; i++)
        r->field_names[i] = xstrdup(field_names[i]);
    r->index_field = index_field;
    return r;
}

void
hub_res_set_frame(struct hub_res *r, const struct hub_frame *f)
{
    r->frame = *f;
}

void
hub_res_free(struct hub_res *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n_fields; i++)
        free(r->field_names[i]);
    free(r->field_names);
    free(r->kind);
    free(r->api_version);
    free(r);
}

/* ---- events ---- */

enum variant { VAR_NONE = -1, VAR_AS_IS = 0, VAR_ADDED = 1, VAR_DELETED = 2 };

/* One side (object or previous object) of an event: its bytes and index. */
struct side {
    char *raw;
    size_t raw_len;
    char *idx;
    struct idx_view v;
    const char *node; /* the indexed field's value, NULL without an index */
    bool ok;          /* present, index readable */
};

struct hub_event {
    unsigned refs;
    enum store_ev_type type;
    uint64_t rv;
    char *key;
    size_t key_len, ns_len; /* namespace: key[0, ns_len) */
    const struct hub_res *res;
    struct side obj, prev;
    /* the shared bytes per form (enum form) and variant, each built on
     * first use: a form nobody watches costs a NULL pointer */
    struct hub_blob *_Atomic blob[FORM_N][3];
};

static size_t
ns_len_of(const struct hub_res *r, const char *key, size_t kl)
{
    if (!r->namespaced)
        return 0;
    const char *slash = memchr(key, '/', kl);
    return slash ? (size_t)(slash - key) : 0;
}

static void
side_init(struct side *s, const struct hub_res *r, const struct store_obj *o)
{
    memset(s, 0, sizeof(*s));
    if (!o->raw)
        return;
    s->raw = xmalloc(o->raw_len + 1);
    memcpy(s->raw, o->raw, o->raw_len);
    s->raw_len = o->raw_len;
    s->idx = xmalloc(o->idx_len + 1);
    memcpy(s->idx, o->idx, o->idx_len);
    s->ok = idx_view_load(&s->v, s->idx, o->idx_len, (const char *const *)r->field_names,
                          r->n_fields) == 0;
    if (s->ok && r->index_field >= 0 && (size_t)r->index_field < r->n_fields)
        s->node = s->v.fields.values[r->index_field];
}

static void
side_fini(struct side *s)
{
    free(s->raw);
    free(s->idx);
    idx_view_fini(&s->v);
}

static struct hub_event *
event_new(const struct hub_res *r, const struct store_hist *h)
{
    struct hub_event *e = xcalloc(1, sizeof(*e));
    e->refs = 1;
    e->type = h->type;
    e->rv = h->rv;
    e->res = r;
    e->key = xstrndup(h->obj.key, h->obj.key_len);
    e->key_len = h->obj.key_len;
    e->ns_len = ns_len_of(r, e->key, e->key_len);
    side_init(&e->obj, r, &h->obj);
    side_init(&e->prev, r, &h->prev);
    return e;
}

static void
event_unref(struct hub_event *e)
{
    if (!e || __atomic_sub_fetch(&e->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    for (int f = 0; f < FORM_N; f++)
        for (int i = 0; i < 3; i++)
            hub_blob_unref(atomic_load(&e->blob[f][i]));
    side_fini(&e->obj);
    side_fini(&e->prev);
    free(e->key);
    free(e);
}

static void
enc_variant(struct gostr_buf *b, const struct hub_res *r, enum store_ev_type type, enum variant v,
            uint64_t rv, const char *obj, size_t obj_len, const char *prev, size_t prev_len,
            enum form form)
{
    if (v == VAR_DELETED)
        enc_event(b, r, "DELETED", prev, prev_len, rv, form);
    else if (type == STORE_DELETED)
        /* the object's last state, at the rv it went away: kube's DELETED.
         * From the upstream's watch the two rvs are the same; a relist
         * records a deletion it found at an rv of its own. */
        enc_event(b, r, "DELETED", obj, obj_len, rv, form);
    else
        enc_event(b, r, v == VAR_ADDED ? "ADDED" : type_name(type), obj, obj_len, 0, form);
}

/* The shared bytes of one variant of e in one form, built on first use by
 * whichever thread needs it first; borrowed (e holds the reference). */
static struct hub_blob *
event_blob(struct hub_event *e, enum variant v, enum form form)
{
    struct hub_blob *_Atomic *slot = &e->blob[form][v];
    struct hub_blob *b = atomic_load_explicit(slot, memory_order_acquire);
    if (b)
        return b;
    struct gostr_buf g = {0};
    enc_variant(&g, e->res, e->type, v, e->rv, e->obj.raw, e->obj.raw_len, e->prev.raw,
                e->prev.raw_len, form);
    struct hub_blob *nb = blob_take(e->res, &g), *expect = NULL;
    if (atomic_compare_exchange_strong_explicit(slot, &expect, nb, memory_order_acq_rel,
                                                memory_order_acquire))
        return nb;
    hub_blob_unref(nb);
    return expect;
}

/* ---- batches ---- */

struct build_ctx {
    const struct hub_res *r;
    uint64_t to_rv;
    struct hub_event **ev;
    size_t n, cap, bytes;
};

static int
on_build_hist(void *arg, const struct store_hist *h)
{
    struct build_ctx *c = arg;
    if (h->rv > c->to_rv)
        return 1;
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 16;
        c->ev = xrealloc(c->ev, c->cap * sizeof(*c->ev));
    }
    struct hub_event *e = event_new(c->r, h);
    /* the common variant now, on the writer's thread, off the workers' */
    /* what the event holds: its shared bytes, both objects and their
     * index bytes (for the variants and the matching) */
    c->bytes += event_blob(e, VAR_AS_IS, FORM_FULL)->len + sizeof(*e) + e->key_len +
                e->obj.raw_len + e->prev.raw_len + h->obj.idx_len + h->prev.idx_len;
    c->ev[c->n++] = e;
    return 0;
}

int
hub_batch_build(struct store *st, const struct hub_res *r, uint64_t from_rv, uint64_t to_rv,
                bool with_events, struct hub_batch **out)
{
    struct hub_batch *b = xcalloc(1, sizeof(*b));
    b->refs = 1;
    b->res = r;
    b->from_rv = from_rv;
    b->rv = to_rv;
    if (with_events && to_rv > from_rv) {
        struct store_rtxn *t;
        int rc = store_rtxn_begin(st, &t);
        if (rc) {
            free(b);
            return rc;
        }
        struct build_ctx c = {.r = r, .to_rv = to_rv};
        rc = store_history(t, r->sres, from_rv, on_build_hist, &c);
        store_rtxn_end(t);
        b->ev = c.ev;
        b->n = c.n;
        b->bytes = c.bytes;
        if (rc == KWC_EEXPIRED) {
            b->gap = true;
        } else if (rc) {
            hub_batch_unref(b);
            return rc;
        }
    }
    *out = b;
    return 0;
}

void
hub_batch_ref(struct hub_batch *b)
{
    __atomic_add_fetch(&b->refs, 1, __ATOMIC_RELAXED);
}

void
hub_batch_unref(struct hub_batch *b)
{
    if (!b || __atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    for (size_t i = 0; i < b->n; i++)
        event_unref(b->ev[i]);
    free(b->ev);
    free(b);
}

/* ---- the hub ---- */

enum mode { M_WAIT, M_INITIAL, M_CATCHUP, M_LIVE };

struct bucket {
    UT_hash_handle hh;
    struct hub_watcher *head;
    size_t n;
    char key[];
};

struct hres {
    const struct hub_res *r;
    uint64_t rv;              /* every event up to it has reached this hub (batches or store) */
    uint64_t last_ev_rv;      /* rv of the last event applied (events may share an rv) */
    struct hub_watcher *rest; /* watchers in no namespace and no field bucket */
    struct bucket *by_ns, *by_node;
    struct hub_watcher *waiting; /* WAIT: not in any bucket */
    size_t n;
    /* The window: the batches applied here, oldest first, contiguous: they
     * hold every event in (win_from, rv]. A ring of win_cap slots. */
    struct hub_batch **win;
    size_t win_head, win_n, win_cap, win_bytes;
    uint64_t win_from;
    struct hub_res_stats *st, own_st; /* the caller's counters for it, or own_st */
};

/* A per-resource counter: written by this hub's thread only (hub.h). */
#define RS_ADD(hr, f, n)                                                                           \
    __atomic_store_n(&(hr)->st->f,                                                                 \
                     __atomic_load_n(&(hr)->st->f, __ATOMIC_RELAXED) + (uint64_t)(n),              \
                     __ATOMIC_RELAXED)

struct hub {
    struct store *st;
    struct hub_options o;
    struct hres **res;
    size_t nres;
    struct idx_view scratch[2];
    struct hub_stats stats;
};

struct hub_watcher {
    struct hub *h;
    struct hres *hr;
    const struct hub_sink_ops *ops;
    void *sink;
    enum mode mode;
    char *ns;
    size_t ns_len;
    struct sel *sel;
    const char *node; /* sel pins the indexed field to this value */
    /* list membership: a bucket's list, hr->rest or hr->waiting */
    struct bucket *bucket;
    struct hub_watcher *next, **prev;
    uint64_t last_rv;  /* CATCHUP: events after it are owed; INITIAL: the snapshot rv;
                          LIVE: events up to it were dealt with */
    uint64_t start_rv; /* bookmarks never go below where the client started */
    uint64_t wait_rv;
    char *from; /* INITIAL: next key (inclusive); NULL: from the start */
    size_t from_len;
    bool initial_end, bookmarks;
    bool resume;    /* WAIT: a resume (events after wait_rv), not an initial state */
    enum form form; /* what its events carry (hub_watch_req.meta, meta_pb) */
    uint64_t deadline, wait_until, next_bm;
    uint64_t rng;
    char *too_large_status;
};

static uint64_t
rng_next(uint64_t *s)
{
    /* splitmix64: bookmark jitter only */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct hub *
hub_new(struct store *st, const struct hub_options *o)
{
    struct hub *h = xcalloc(1, sizeof(*h));
    h->st = st;
    h->o = *o;
    if (!h->o.budget)
        h->o.budget = 256 * 1024;
    if (!h->o.chunk_bytes)
        h->o.chunk_bytes = 64 * 1024;
    if (!h->o.bookmark_ms)
        h->o.bookmark_ms = 60000;
    if (!h->o.window_bytes)
        h->o.window_bytes = 64 * 1024 * 1024;
    return h;
}

static struct hres *
hres_of(struct hub *h, const struct hub_res *r)
{
    if (r->id >= h->nres) {
        size_t n = r->id + 1;
        h->res = xrealloc(h->res, n * sizeof(*h->res));
        memset(h->res + h->nres, 0, (n - h->nres) * sizeof(*h->res));
        h->nres = n;
    }
    if (!h->res[r->id]) {
        h->res[r->id] = xcalloc(1, sizeof(struct hres));
        h->res[r->id]->r = r;
        h->res[r->id]->st =
            r->id < h->o.n_res_stats ? &h->o.res_stats[r->id] : &h->res[r->id]->own_st;
    }
    return h->res[r->id];
}

/* ---- membership ---- */

static void
list_add(struct hub_watcher **head, struct hub_watcher *w)
{
    w->next = *head;
    if (*head)
        (*head)->prev = &w->next;
    w->prev = head;
    *head = w;
}

static void
list_del(struct hub_watcher *w)
{
    if (!w->prev)
        return;
    *w->prev = w->next;
    if (w->next)
        w->next->prev = w->prev;
    w->next = NULL;
    w->prev = NULL;
}

static struct bucket *
bucket_get(struct bucket **map, const char *key, size_t kl, bool create)
{
    struct bucket *b = NULL;
    HASH_FIND(hh, *map, key, kl, b);
    if (b || !create)
        return b;
    b = xcalloc(1, sizeof(*b) + kl + 1);
    memcpy(b->key, key, kl);
    HASH_ADD_KEYPTR(hh, *map, b->key, kl, b);
    return b;
}

static void
index_add(struct hub_watcher *w)
{
    struct hres *hr = w->hr;
    if (w->node) {
        w->bucket = bucket_get(&hr->by_node, w->node, strlen(w->node), true);
    } else if (w->ns) {
        w->bucket = bucket_get(&hr->by_ns, w->ns, w->ns_len, true);
    } else {
        list_add(&hr->rest, w);
        return;
    }
    w->bucket->n++;
    list_add(&w->bucket->head, w);
}

static void
index_del(struct hub_watcher *w)
{
    list_del(w);
    struct bucket *b = w->bucket;
    if (!b)
        return;
    w->bucket = NULL;
    if (--b->n == 0) {
        struct hres *hr = w->hr;
        if (w->node)
            HASH_DEL(hr->by_node, b);
        else
            HASH_DEL(hr->by_ns, b);
        free(b);
    }
}

/* ---- matching ---- */

static bool
side_matches(const struct hub_watcher *w, const char *key, size_t ns_len, const struct idx_view *v)
{
    if (w->ns && (ns_len != w->ns_len || memcmp(key, w->ns, ns_len) != 0))
        return false;
    return !w->sel || sel_matches(w->sel, &v->labels, &v->fields);
}

/* kube's convertToWatchEvent. ov/pv NULL: that side is absent (or its index
 * unreadable, which no selector can match). */
static enum variant
variant_for(const struct hub_watcher *w, enum store_ev_type type, const char *key, size_t ns_len,
            const struct idx_view *ov, const struct idx_view *pv)
{
    if (!w->ns && !w->sel)
        return VAR_AS_IS;
    if (type == STORE_ADDED)
        return ov && side_matches(w, key, ns_len, ov) ? VAR_AS_IS : VAR_NONE;
    if (type == STORE_DELETED) {
        const struct idx_view *v = pv ? pv : ov;
        return v && side_matches(w, key, ns_len, v) ? VAR_AS_IS : VAR_NONE;
    }
    bool cur = ov && side_matches(w, key, ns_len, ov);
    bool old = pv && side_matches(w, key, ns_len, pv);
    if (cur)
        return old ? VAR_AS_IS : VAR_ADDED;
    return old ? VAR_DELETED : VAR_NONE;
}

/* ---- writing to a sink ---- */

static void
put(struct hub_watcher *w, struct hub_blob *b)
{
    w->ops->write(w->sink, b, b->data, b->len);
}

static void
put_take(struct hub_watcher *w, struct hub_blob *b)
{
    put(w, b);
    hub_blob_unref(b);
}

static void win_reset(struct hres *hr, uint64_t rv);

static void
watcher_free(struct hub_watcher *w)
{
    struct hres *hr = w->hr;
    if (w->mode == M_WAIT)
        list_del(w);
    else
        index_del(w);
    if (--hr->n == 0)
        win_reset(hr, hr->rv); /* nobody to catch up: the memory goes (an idle cache holds none) */
    struct hub_stats *st = &w->h->stats;
    st->watchers--;
    if (w->mode == M_LIVE)
        st->live--;
    else if (w->mode == M_CATCHUP)
        st->lagging--;
    RS_ADD(hr, lagging, -(int64_t)(w->mode == M_CATCHUP));
    sel_free(w->sel);
    free(w->ns);
    free(w->from);
    free(w->too_large_status);
    free(w);
}

static void
end(struct hub_watcher *w, enum hub_end why)
{
    w->ops->end(w->sink, why);
    watcher_free(w);
}

static void
set_mode(struct hub_watcher *w, enum mode m)
{
    struct hub_stats *st = &w->h->stats;
    if (w->mode == M_LIVE)
        st->live--;
    else if (w->mode == M_CATCHUP)
        st->lagging--;
    RS_ADD(w->hr, lagging, (int64_t)(m == M_CATCHUP) - (int64_t)(w->mode == M_CATCHUP));
    w->mode = m;
    if (m == M_LIVE)
        st->live++;
    else if (m == M_CATCHUP)
        st->lagging++;
}

static void
schedule_bookmark(struct hub_watcher *w, uint64_t now)
{
    /* cache_watcher.go nextBookmarkTime: about every interval (jittered here
     * by +-5 %), never later than 2 s before the deadline, none after that */
    w->next_bm = 0;
    if (!w->bookmarks)
        return;
    uint64_t iv = w->h->o.bookmark_ms;
    uint64_t j = iv / 10 ? rng_next(&w->rng) % (iv / 10) : 0;
    uint64_t nb = now + iv - iv / 20 + j;
    if (w->deadline) {
        uint64_t pre = w->deadline > 2000 ? w->deadline - 2000 : 0;
        if (pre < nb)
            nb = pre;
        if (nb <= now)
            return; /* the pre-deadline bookmark was sent, or its time is gone */
    }
    w->next_bm = nb ? nb : 1;
}

/* ---- live dispatch ---- */

static void wake(struct hub_watcher *w);

static void
deliver(struct hub *h, struct hub_watcher *w, struct hub_event *e, bool same_group)
{
    h->stats.visits++;
    if (w->mode != M_LIVE || e->rv <= w->last_rv)
        return;
    enum variant v = variant_for(w, e->type, e->key, e->ns_len, e->obj.ok ? &e->obj.v : NULL,
                                 e->prev.ok ? &e->prev.v : NULL);
    if (v == VAR_NONE)
        return;
    if (!same_group && w->ops->queued(w->sink) > h->o.budget) {
        /* over budget: stop sending live; read the history from e on */
        set_mode(w, M_CATCHUP);
        w->last_rv = e->rv - 1;
        h->stats.lag_events++;
        wake(w);
        return;
    }
    struct hub_blob *bl = event_blob(e, v, w->form);
    put(w, bl);
    w->last_rv = e->rv;
    h->stats.delivered++;
    RS_ADD(w->hr, live, 1);
    RS_ADD(w->hr, live_bytes, bl->len);
}

static void
visit_list(struct hub *h, struct hub_watcher *head, struct hub_event *e, bool same_group)
{
    for (struct hub_watcher *w = head, *next; w; w = next) {
        next = w->next;
        deliver(h, w, e, same_group);
    }
}

static void
visit_bucket(struct hub *h, struct bucket *map, const char *key, size_t kl, struct hub_event *e,
             bool same_group)
{
    struct bucket *b = bucket_get(&map, key, kl, false);
    if (b)
        visit_list(h, b->head, e, same_group);
}

static void start_initial(struct hub_watcher *w);
static void start_waited(struct hub_watcher *w);

static void
resync(struct hub_watcher *w, uint64_t from)
{
    if (w->mode != M_LIVE)
        return;
    set_mode(w, M_CATCHUP);
    if (w->last_rv < from)
        w->last_rv = from;
    w->h->stats.lag_events++;
    wake(w);
}

static void
wake(struct hub_watcher *w)
{
    w->ops->wake(w->sink);
}

/* End every watcher of a resource (each end frees its watcher, and the last
 * watcher of a bucket frees the bucket). */
static void
end_all(struct hres *hr, enum hub_end why)
{
    while (hr->rest)
        end(hr->rest, why);
    while (hr->waiting)
        end(hr->waiting, why);
    while (hr->by_ns)
        end(hr->by_ns->head, why);
    while (hr->by_node)
        end(hr->by_node->head, why);
}

/* End every watcher of a resource with a 410 Expired ERROR event, as kube
 * ends a watch whose rv is too old (its client relists): the upstream's
 * timeline changed, so no rv a watcher holds means anything any more. The
 * message starts as kube's, since some clients read it. */
static void
end_all_expired(struct hres *hr)
{
    struct hub_watcher *w;
    while ((w = hr->rest      ? hr->rest
                : hr->waiting ? hr->waiting
                : hr->by_ns   ? hr->by_ns->head
                : hr->by_node ? hr->by_node->head
                              : NULL)) {
        char *msg = xasprintf("too old resource version: %llu (the upstream was restored or "
                              "replaced: its resourceVersions went back; relist)",
                              (unsigned long long)w->last_rv);
        char *st = status_failure_json(410, "Expired", msg, NULL);
        put_take(w, error_event(hr->r, w->form, st));
        free(st);
        free(msg);
        end(w, HUB_END_UPSTREAM);
    }
}

/* ---- the window of recent batches ---- */

static struct hub_batch *
win_at(const struct hres *hr, size_t i)
{
    return hr->win[(hr->win_head + i) % hr->win_cap];
}

/* Empty the window; it covers (rv, hr->rv] from now on. */
static void
win_reset(struct hres *hr, uint64_t rv)
{
    for (size_t i = 0; i < hr->win_n; i++)
        hub_batch_unref(win_at(hr, i));
    hr->win_head = hr->win_n = hr->win_bytes = 0;
    hr->win_from = rv;
}

/* b was just applied (the window stays contiguous: every batch after the
 * last reset reaches this hub). The oldest leave while it holds more than
 * window_bytes; the variants built on demand are not counted. */
static void
win_push(struct hub *h, struct hres *hr, struct hub_batch *b)
{
    if (b->n == 0)
        return; /* only the rv moved */
    if (hr->win_n == hr->win_cap) {
        size_t cap = hr->win_cap ? hr->win_cap * 2 : 64;
        struct hub_batch **nw = xcalloc(cap, sizeof(*nw));
        for (size_t i = 0; i < hr->win_n; i++)
            nw[i] = win_at(hr, i);
        free(hr->win);
        hr->win = nw;
        hr->win_cap = cap;
        hr->win_head = 0;
    }
    hub_batch_ref(b);
    hr->win[(hr->win_head + hr->win_n++) % hr->win_cap] = b;
    hr->win_bytes += b->bytes;
    while (hr->win_n > 1 && hr->win_bytes > h->o.window_bytes) {
        struct hub_batch *old = win_at(hr, 0);
        hr->win_head = (hr->win_head + 1) % hr->win_cap;
        hr->win_n--;
        hr->win_bytes -= old->bytes;
        hr->win_from = old->rv;
        hub_batch_unref(old);
    }
}

/* This hub's rv for a resource jumps to rv without the batches in between
 * (the writer posts batches only to hubs with watchers of it, so a hub that
 * had none catches up through the rv a new watcher brings). Any watcher that
 * is live here then owes what it has not seen: it reads it from the history,
 * so a jump can never become a gap. */
static void
advance(struct hres *hr, uint64_t rv)
{
    if (rv <= hr->rv)
        return;
    for (struct hub_watcher *w = hr->rest; w; w = w->next)
        resync(w, hr->rv);
    struct bucket *maps[2] = {hr->by_ns, hr->by_node}, *bk, *tmp;
    for (int m = 0; m < 2; m++) {
        HASH_ITER(hh, maps[m], bk, tmp)
        {
            for (struct hub_watcher *w = bk->head; w; w = w->next)
                resync(w, hr->rv);
        }
    }
    hr->rv = rv;
    win_reset(hr, rv); /* what lies in between never came as batches */
}

void
hub_apply(struct hub *h, struct hub_batch *b)
{
    struct hres *hr = hres_of(h, b->res);
    if (!b->gap && b->from_rv > hr->rv)
        advance(hr, b->from_rv);
    if (b->gap) {
        /* the history no longer reaches where this hub is: nobody can be
         * told what happened in between */
        if (b->expired)
            end_all_expired(hr);
        end_all(hr, HUB_END_RESET);
        /* the writer posts rvs in order, so a gap below this hub's rv is
         * the resource starting over (a rebuilt cache): follow it down */
        hr->rv = b->rv;
        if (hr->last_ev_rv > b->rv)
            hr->last_ev_rv = 0;
        win_reset(hr, hr->rv);
        return;
    }
    for (size_t i = 0; i < b->n; i++) {
        struct hub_event *e = b->ev[i];
        if (e->rv <= hr->rv)
            continue; /* already in the store when a watcher here read it */
        bool same = e->rv == hr->last_ev_rv;
        visit_list(h, hr->rest, e, same);
        if (e->ns_len)
            visit_bucket(h, hr->by_ns, e->key, e->ns_len, e, same);
        if (e->obj.node)
            visit_bucket(h, hr->by_node, e->obj.node, strlen(e->obj.node), e, same);
        if (e->prev.node && (!e->obj.node || strcmp(e->prev.node, e->obj.node) != 0))
            visit_bucket(h, hr->by_node, e->prev.node, strlen(e->prev.node), e, same);
        hr->last_ev_rv = e->rv;
    }
    if (b->rv > hr->rv)
        hr->rv = b->rv;
    win_push(h, hr, b);
    /* sendInitialEvents watchers whose rv the cache reached */
    for (struct hub_watcher *w = hr->waiting, *next; w; w = next) {
        next = w->next;
        if (hr->rv >= w->wait_rv)
            start_waited(w);
    }
}

/* ---- new watchers ---- */

/* A resume that waited for its rv: events after it, from the window or the
 * history (this batch's included: the watcher was in no bucket) */
static void
start_resume(struct hub_watcher *w)
{
    list_del(w);
    w->last_rv = w->wait_rv;
    w->start_rv = w->wait_rv;
    w->mode = M_CATCHUP;
    w->h->stats.lagging++;
    RS_ADD(w->hr, lagging, 1);
    index_add(w);
    if (w->last_rv >= w->hr->rv)
        set_mode(w, M_LIVE);
    else
        wake(w);
}

static void
start_waited(struct hub_watcher *w)
{
    if (w->resume)
        start_resume(w);
    else
        start_initial(w);
}

static void
start_initial(struct hub_watcher *w)
{
    list_del(w);
    w->last_rv = w->hr->rv; /* the snapshot */
    w->start_rv = w->last_rv;
    w->mode = M_INITIAL;
    index_add(w);
    wake(w);
}

struct hub_watcher *
hub_watch(struct hub *h, const struct hub_res *r, struct hub_watch_req *req,
          const struct hub_sink_ops *ops, void *sink, uint64_t posted_rv, uint64_t now_ms,
          uint64_t seed)
{
    struct hres *hr = hres_of(h, r);
    if (posted_rv < hr->rv) {
        /* the writer's rv only goes down when the resource starts over
         * (a rebuilt cache), and this hub, with no watchers of it, missed
         * the gap that said so */
        end_all(hr, HUB_END_RESET);
        hr->rv = posted_rv;
        hr->last_ev_rv = 0;
        win_reset(hr, posted_rv);
    }
    advance(hr, posted_rv);
    struct hub_watcher *w = xcalloc(1, sizeof(*w));
    w->h = h;
    w->hr = hr;
    w->ops = ops;
    w->sink = sink;
    if (req->ns && r->namespaced) {
        w->ns = xstrdup(req->ns);
        w->ns_len = strlen(w->ns);
    }
    if (req->sel && !sel_is_everything(req->sel)) {
        w->sel = req->sel;
        if (r->index_field >= 0 && (size_t)r->index_field < r->n_fields)
            w->node = sel_requires_exact(w->sel, r->field_names[r->index_field]);
    } else {
        sel_free(req->sel);
    }
    req->sel = NULL;
    w->initial_end = req->initial_end;
    w->bookmarks = req->bookmarks;
    w->form = !req->meta                               ? FORM_FULL
              : req->meta_pb && r->enc == KWC_ENC_JSON ? FORM_META_PB
                                                       : FORM_META;
    w->deadline = req->deadline_ms;
    w->wait_until = req->wait_until_ms;
    w->too_large_status = req->too_large_status;
    req->too_large_status = NULL;
    w->rng = seed;
    hr->n++;
    h->stats.watchers++;

    if (!req->initial && req->rv > hr->rv && req->wait_until_ms) {
        /* a resume from an rv this cache has not reached (a client coming
         * from a replica that was ahead): it waits, as a read of a too
         * large rv does, and never sees an older state or a 410 */
        w->mode = M_WAIT;
        w->wait_rv = req->rv;
        w->resume = true;
        list_add(&hr->waiting, w);
    } else if (req->initial) {
        if (req->rv > hr->rv) {
            w->mode = M_WAIT;
            w->wait_rv = req->rv;
            list_add(&hr->waiting, w);
            return w;
        }
        w->mode = M_WAIT;
        list_add(&hr->waiting, w);
        start_initial(w);
    } else {
        /* events after rv: from the history while it is behind this hub */
        struct store_rtxn *t;
        struct store_res_info info = {0};
        int rc = store_rtxn_begin(h->st, &t);
        if (rc == 0) {
            rc = store_info(t, r->sres, &info);
            store_rtxn_end(t);
        }
        w->mode = M_CATCHUP;
        h->stats.lagging++;
        RS_ADD(hr, lagging, 1);
        index_add(w);
        if (rc) {
            end(w, HUB_END_STORE);
            return NULL;
        }
        if (req->rv < info.floor) {
            /* watch_cache.go getAllEventsSinceLocked: NewResourceExpired, as
             * one ERROR event on a 200 stream (cacher.go newErrWatcher) */
            char *msg = xasprintf("too old resource version: %llu (%llu)",
                                  (unsigned long long)req->rv, (unsigned long long)info.floor);
            char *st = status_failure_json(410, "Expired", msg, NULL);
            put_take(w, error_event(r, w->form, st));
            free(st);
            free(msg);
            end(w, HUB_END_ERROR_EVENT);
            return NULL;
        }
        w->last_rv = req->rv;
        w->start_rv = req->rv;
        if (req->rv >= hr->rv)
            set_mode(w, M_LIVE); /* nothing stored after it yet */
        else
            wake(w);
    }
    schedule_bookmark(w, now_ms);
    return w;
}

void
hub_unwatch(struct hub_watcher *w)
{
    if (w)
        watcher_free(w);
}

/* ---- pumping stored state and history ---- */

bool
hub_pump_wanted(const struct hub_watcher *w)
{
    return w->mode == M_INITIAL || w->mode == M_CATCHUP;
}

bool
hub_pump_reads_store(const struct hub_watcher *w)
{
    return w->mode == M_INITIAL || (w->mode == M_CATCHUP && w->last_rv < w->hr->win_from);
}

struct pump_ctx {
    struct hub_watcher *w;
    struct gostr_buf out;
    uint64_t last_rv; /* CATCHUP: last rv consumed */
    bool more;        /* stopped on the chunk bound */
    const char *last_key;
    size_t last_key_len;
};

static int
on_initial_obj(void *arg, const struct store_obj *o)
{
    struct pump_ctx *c = arg;
    struct hub_watcher *w = c->w;
    if (c->out.len >= w->h->o.chunk_bytes) {
        c->more = true;
        free(w->from);
        w->from = xmalloc(o->key_len + 1);
        memcpy(w->from, o->key, o->key_len);
        w->from[o->key_len] = '\0';
        w->from_len = o->key_len;
        return 1;
    }
    if (w->sel) {
        struct idx_view *v = &w->h->scratch[0];
        if (idx_view_load(v, o->idx, o->idx_len, (const char *const *)w->hr->r->field_names,
                          w->hr->r->n_fields) != 0 ||
            !sel_matches(w->sel, &v->labels, &v->fields))
            return 0;
    }
    size_t before = c->out.len;
    enc_event(&c->out, w->hr->r, "ADDED", o->raw, o->raw_len, 0, w->form);
    RS_ADD(w->hr, initial, 1);
    RS_ADD(w->hr, initial_bytes, c->out.len - before);
    return 0;
}

static int
on_catchup_hist(void *arg, const struct store_hist *hh)
{
    struct pump_ctx *c = arg;
    struct hub_watcher *w = c->w;
    if (hh->rv > w->hr->rv)
        return 1; /* the batches bring the rest */
    if (c->out.len >= w->h->o.chunk_bytes && hh->rv != c->last_rv) {
        c->more = true;
        return 1;
    }
    c->last_rv = hh->rv;
    struct hub *h = w->h;
    const struct hub_res *r = w->hr->r;
    const struct idx_view *ov = NULL, *pv = NULL;
    if (idx_view_load(&h->scratch[0], hh->obj.idx, hh->obj.idx_len,
                      (const char *const *)r->field_names, r->n_fields) == 0)
        ov = &h->scratch[0];
    if (hh->prev.raw && idx_view_load(&h->scratch[1], hh->prev.idx, hh->prev.idx_len,
                                      (const char *const *)r->field_names, r->n_fields) == 0)
        pv = &h->scratch[1];
    size_t nsl = ns_len_of(r, hh->obj.key, hh->obj.key_len);
    enum variant v = variant_for(w, hh->type, hh->obj.key, nsl, ov, pv);
    if (v != VAR_NONE) {
        size_t before = c->out.len;
        enc_variant(&c->out, r, hh->type, v, hh->rv, hh->obj.raw, hh->obj.raw_len, hh->prev.raw,
                    hh->prev.raw_len, w->form);
        h->stats.from_store++;
        RS_ADD(w->hr, store, 1);
        RS_ADD(w->hr, store_bytes, c->out.len - before);
    }
    return 0;
}

/* CATCHUP inside the window: what the watcher would have been handed live,
 * the same shared blobs, up to chunk_bytes per step (an rv's group is never
 * split). Returns true when more remains. */
static bool
pump_window(struct hub_watcher *w)
{
    struct hub *h = w->h;
    struct hres *hr = w->hr;
    size_t lo = 0, hi = hr->win_n, sent = 0;
    while (lo < hi) { /* the first batch with events after last_rv */
        size_t mid = lo + (hi - lo) / 2;
        if (win_at(hr, mid)->rv <= w->last_rv)
            lo = mid + 1;
        else
            hi = mid;
    }
    uint64_t last = w->last_rv;
    for (size_t i = lo; i < hr->win_n; i++) {
        struct hub_batch *b = win_at(hr, i);
        for (size_t k = 0; k < b->n; k++) {
            struct hub_event *e = b->ev[k];
            if (e->rv <= w->last_rv)
                continue;
            if (sent >= h->o.chunk_bytes && e->rv != last) {
                w->last_rv = last;
                return true;
            }
            last = e->rv;
            enum variant v =
                variant_for(w, e->type, e->key, e->ns_len, e->obj.ok ? &e->obj.v : NULL,
                            e->prev.ok ? &e->prev.v : NULL);
            if (v == VAR_NONE)
                continue;
            struct hub_blob *bl = event_blob(e, v, w->form);
            put(w, bl);
            sent += bl->len;
            h->stats.from_window++;
            RS_ADD(hr, window, 1);
            RS_ADD(hr, window_bytes, bl->len);
        }
    }
    w->last_rv = hr->rv;
    return false;
}

bool
hub_pump(struct hub_watcher *w, bool *alive)
{
    struct hub *h = w->h;
    *alive = true;
    if (!hub_pump_wanted(w))
        return false;
    if (!hub_pump_reads_store(w)) {
        if (pump_window(w))
            return true;
        set_mode(w, M_LIVE);
        return false;
    }
    struct store_rtxn *t;
    int rc = store_rtxn_begin(h->st, &t);
    if (rc) {
        *alive = false;
        end(w, HUB_END_STORE);
        return false;
    }
    struct pump_ctx c = {.w = w, .last_rv = w->last_rv};
    const struct hub_res *r = w->hr->r;
    if (w->mode == M_INITIAL) {
        char *prefix = w->ns ? xasprintf("%s/", w->ns) : xstrdup("");
        if (w->node)
            rc = store_scan_field(t, r->sres, w->last_rv, w->node, prefix, w->from, w->from_len,
                                  on_initial_obj, &c);
        else
            rc = store_scan(t, r->sres, w->last_rv, prefix, w->from, w->from_len, on_initial_obj,
                            &c);
        free(prefix);
    } else {
        rc = store_history(t, r->sres, w->last_rv, on_catchup_hist, &c);
    }
    store_rtxn_end(t);
    if (rc) {
        free(gostr_take(&c.out));
        *alive = false;
        end(w, rc == KWC_EEXPIRED ? HUB_END_EXPIRED : HUB_END_STORE);
        return false;
    }
    if (w->mode == M_INITIAL && !c.more) {
        if (w->initial_end && w->bookmarks) {
            enc_bookmark(&c.out, r, w->last_rv, true, w->form);
            RS_ADD(w->hr, bookmarks, 1);
        }
        free(w->from);
        w->from = NULL;
        set_mode(w, M_CATCHUP);
        c.more = w->hr->rv > w->last_rv;
    } else if (w->mode == M_CATCHUP) {
        w->last_rv = c.last_rv;
    }
    if (c.out.len)
        put_take(w, blob_take(r, &c.out));
    else
        free(gostr_take(&c.out));
    if (w->mode == M_CATCHUP && !c.more) {
        /* every stored event up to this hub's rv has been sent */
        if (w->last_rv < w->hr->rv)
            w->last_rv = w->hr->rv;
        set_mode(w, M_LIVE);
    }
    return hub_pump_wanted(w);
}

/* ---- time ---- */

uint64_t
hub_next_timer(const struct hub_watcher *w)
{
    uint64_t t = w->deadline;
    if (w->mode == M_WAIT && w->wait_until && (!t || w->wait_until < t))
        t = w->wait_until;
    if (w->next_bm && (!t || w->next_bm < t))
        t = w->next_bm;
    return t;
}

void
hub_timer(struct hub_watcher *w, uint64_t now)
{
    struct hub *h = w->h;
    if (w->deadline && now >= w->deadline) {
        end(w, HUB_END_TIMEOUT);
        return;
    }
    if (w->mode == M_WAIT && w->wait_until && now >= w->wait_until) {
        if (w->too_large_status) {
            put_take(w, error_event(w->hr->r, w->form, w->too_large_status));
            end(w, HUB_END_ERROR_EVENT);
        } else {
            start_waited(w); /* no answer configured: serve what the cache has */
        }
        return;
    }
    if (w->next_bm && now >= w->next_bm) {
        /* at the newest rv this hub knows, once the watcher has everything
         * up to it; a lagging watcher gets its bookmark when it is live */
        if (w->mode == M_LIVE && w->hr->rv >= w->start_rv) {
            struct gostr_buf b = {0};
            enc_bookmark(&b, w->hr->r, w->hr->rv, false, w->form);
            put_take(w, blob_take(w->hr->r, &b));
            h->stats.bookmarks++;
            RS_ADD(w->hr, bookmarks, 1);
            schedule_bookmark(w, now);
        } else {
            w->next_bm = now + 1000;
            if (w->deadline && w->next_bm + 2000 > w->deadline)
                w->next_bm = 0;
        }
    }
}

void
hub_stats(const struct hub *h, struct hub_stats *out)
{
    *out = h->stats;
}

void
hub_end_all(struct hub *h, enum hub_end why)
{
    for (size_t i = 0; i < h->nres; i++)
        if (h->res[i])
            end_all(h->res[i], why);
}

void
hub_free(struct hub *h)
{
    if (!h)
        return;
    for (size_t i = 0; i < h->nres; i++) {
        struct hres *hr = h->res[i];
        if (!hr)
            continue;
        end_all(hr, HUB_END_SHUTDOWN);
        win_reset(hr, 0);
        free(hr->win);
        free(hr);
    }
    free(h->res);
    idx_view_fini(&h->scratch[0]);
    idx_view_fini(&h->scratch[1]);
    free(h);
}

const char *
hub_end_name(enum hub_end e)
{
    switch (e) {
#define HUB_END_CASE(e, s)                                                                         \
    case e:                                                                                        \
        return s;
        HUB_ENDS(HUB_END_CASE)
#undef HUB_END_CASE
    }
    return "?";
}

void
hub_res_stats_read(const struct hub_res_stats *s, struct hub_res_stats *out)
{
#define RS_READ(f) out->f = __atomic_load_n(&s->f, __ATOMIC_RELAXED)
    RS_READ(lagging);
    RS_READ(live);
    RS_READ(live_bytes);
    RS_READ(window);
    RS_READ(window_bytes);
    RS_READ(store);
    RS_READ(store_bytes);
    RS_READ(initial);
    RS_READ(initial_bytes);
    RS_READ(bookmarks);
#undef RS_READ
}
