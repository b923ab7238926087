/*
 * serve.c — cached list and get (see serve.h).
 *
 * One struct sreq per request taken. Lifecycle:
 *   serve_take (head read): admit_decide (the cache, the encoding, the
 *     selectors, the decision table).
 *     ADMIT_PASS -> not taken. Otherwise the body is discarded and the
 *     answer starts when the request has been read (on_complete):
 *   ADMIT_ERROR -> the Status kube-apiserver sends (JSON; a protobuf request
 *     with an error is not taken: the upstream answers it in protobuf);
 *   SERVE_AT_LEAST not yet reached -> waiters list + timer; serve_committed
 *     starts it, the timer hands it upstream (pt_forward_read) or answers 504
 *     (JSON only, as above);
 *   get not found -> 404 NotFound in the request's encoding;
 *   SERVE_* -> get: one object; list: planned first when limited (the
 *     ListMeta of a typed list precedes its items) or when the encoding's
 *     head states the items' length (plan_list), then chunks of items
 *     between the encoding's head and tail (struct encoding).
 * A chunk is one read transaction: store_scan from the next key at the
 * list's rv until the next item would not fit in CHUNK_BYTES (an item
 * larger than that is a chunk of its own) or CHUNK_VISITS objects were
 * visited (selectors may skip most), then the transaction ends. A chunk is
 * one contiguous block that the response takes over (hresp_write_block):
 * framed in place, it leaves as one piece. The next chunk
 * starts from a deferred event while the response queue is below half of
 * max_buffer (its low-water mark), else when it drains there (on_drain):
 * at most max_buffer / 2 + one chunk is queued. (Below max_buffer instead,
 * a chunk just under 64 KiB would let a second one follow it where HTTP/2's
 * connection bound promised room for one: h2room.c.) Over HTTP/2
 * hresp_queued also reports a full connection (h2.c's bound): the first
 * chunk waits for on_drain too.
 * The request's on_close frees the sreq.
 */
#include "kwc/serve.h"

#include <assert.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/admit.h"
#include "kwc/base.h"
#include "kwc/body.h"
#include "kwc/cont.h"
#include "kwc/gostr.h"
#include "kwc/http.h"
#include "kwc/index.h"
#include "kwc/listfmt.h"
#include "kwc/log.h"
#include "kwc/passthrough.h"
#include "kwc/pb.h"
#include "kwc/pom.h"
#include "kwc/reflector.h"
#include "kwc/respond.h"
#include "kwc/route.h"
#include "kwc/selector.h"
#include "kwc/status.h"
#include "kwc/store.h"

#define SREQ_MAGIC 0x73726571u /* "sreq" */
/* A chunk's data, so that with its HTTP/1.1 framing ("fff8\r\n" ... "\r\n")
 * it is at most 64 KiB: four full TLS records */
#define CHUNK_BYTES (64 * 1024 - 8)
#define CHUNK_VISITS 8192
#define ITEM_PREFIX_MAX 11 /* what an encoding writes in front of an item */

struct serve {
    struct event_base *base;
    struct store *st;
    const struct refl_set *set; /* the caches (grows: catalog.h) */
    struct serve_options o;
    struct admit_refls caches; /* admission's view of refls (points to itself) */
    struct sreq *waiters;
    uint64_t rng[2];
    struct serve_stats stats;
};

struct encoding;

struct sreq {
    uint32_t magic;
    struct serve *s;
    struct hreq *req;
    const struct refl_desc *d;
    const struct encoding *enc;
    bool list;
    struct sel *sel;      /* NULL: everything */
    const char *by_field; /* read through the store's field index: this value */
    struct idx_view iv;
    struct decide_result dec;
    char *prefix; /* "ns/" within a namespace, else "" */
    char *key;    /* get: "ns/name" or "name" */
    const char *name;
    struct listfmt fmt;
    char *kinds; /* owns fmt's strings */
    struct listfmt_meta meta;
    char *cont;
    /* streaming */
    uint64_t at_rv;
    char *from; /* next key, inclusive; NULL: from the prefix */
    size_t from_len;
    char *end; /* last key of a limited page, inclusive; NULL: to the end */
    size_t end_len;
    bool any_item, started, done;
    uint64_t items_planned; /* item bytes the head announced (encoding's item_size) */
    uint64_t items_sent;    /* item bytes written so far, prefixes included */
    bool pass_on;           /* the cache failed this one before the answer started */
    char *copy;             /* metadata only: the stored item's checked copy */
    size_t copy_cap;
    struct gostr_buf derived; /* metadata only: what an item becomes */
    struct chunk {
        char *base; /* malloc'd; the data starts HRESP_BLOCK_BEFORE in */
        size_t len, cap;
    } chunk;
    struct body body;                  /* pretty, gzip: what every answer is written through */
    bool error_pretty, error_upstream; /* an error's Status (admit.h) */
    struct event *kick, *timer;
    struct sreq *next_wait, **prev_wait;
    char audit_id[RESPOND_AUDIT_ID_LEN];
};

/* ---- encodings: the bytes around the stored items ---- */

/*
 * The list pipeline and the get are the same for every encoding; an encoding
 * only says what its bytes around the items are (DESIGN.md "Encodings").
 */
struct encoding {
    const char *content_type;
    /* Append what precedes the first item / follows the last. */
    void (*head)(const struct sreq *sr, struct evbuffer *out);
    void (*tail)(const struct sreq *sr, struct evbuffer *out);
    /* Write what precedes an item of len bytes into buf (at most
     * ITEM_PREFIX_MAX bytes) and return its length. */
    size_t (*item_prefix)(const struct sreq *sr, char *buf, size_t len);
    /* Bytes an item of len bytes takes in the list, its prefix included, for
     * an encoding whose head states the length of everything after it (so
     * every list is planned before its first byte, not only a limited page);
     * NULL when the head does not. */
    uint64_t (*item_size)(size_t len);
    /* A get: the stored item as the object answered (new), and the 404. */
    char *(*object)(const struct sreq *sr, const void *item, size_t len, size_t *n);
    void (*not_found)(struct sreq *sr, const char *message, const struct status_details *det);
    /* The decision table's errors (400, 422, 500, 504: JSON Status bodies,
     * decide.h) are answered in this encoding; else the request goes
     * upstream instead (see serve_take). */
    bool table_errors;
    /* Metadata only: what a stored item becomes in the answer (appended to
     * b; 0, or -1 for an item it cannot derive). NULL: the item itself. */
    int (*derive)(const struct sreq *sr, struct gostr_buf *b, const void *item, size_t len);
};

static void
json_head(const struct sreq *sr, struct evbuffer *out)
{
    size_t n;
    char *head = listfmt_head(&sr->fmt, &sr->meta, &n);
    evbuffer_add(out, head, n);
    free(head);
}

static void
json_tail(const struct sreq *sr, struct evbuffer *out)
{
    size_t n;
    char *tail = listfmt_tail(&sr->fmt, &sr->meta, &n);
    evbuffer_add(out, tail, n);
    free(tail);
}

static size_t
json_item_prefix(const struct sreq *sr, char *buf, size_t len)
{
    if (!sr->any_item)
        return 0;
    buf[0] = ',';
    return 1;
}

static char *
json_object(const struct sreq *sr, const void *item, size_t len, size_t *n)
{
    return listfmt_object(&sr->fmt, item, len, n);
}

static void answer_status(struct sreq *sr, int code, const char *body, int retry_after);

static void
json_not_found(struct sreq *sr, const char *message, const struct status_details *det)
{
    char *body = status_failure_json(404, "NotFound", message, det);
    answer_status(sr, 404, body, 0);
    free(body);
}

static const struct encoding enc_json = {
    .content_type = "application/json",
    .head = json_head,
    .tail = json_tail,
    .item_prefix = json_item_prefix,
    .object = json_object,
    .not_found = json_not_found,
    .table_errors = true,
};

/* Protobuf (pb.h): b"k8s\0" + Unknown{typeMeta, raw = XxxList{1 ListMeta,
 * 2 item, 2 item, ...}, "", ""}. The envelope's raw length comes before the
 * first item, hence item_size: every protobuf list is planned. */
static void
protobuf_head(const struct sreq *sr, struct evbuffer *out)
{
    size_t n;
    char *head = pb_list_head(sr->fmt.api_version, sr->fmt.list_kind, sr->meta.rv, sr->meta.cont,
                              sr->meta.remaining, sr->items_planned, &n);
    evbuffer_add(out, head, n);
    free(head);
}

static void
protobuf_tail(const struct sreq *sr, struct evbuffer *out)
{
    evbuffer_add(out, PB_ENVELOPE_TAIL, PB_ENVELOPE_TAIL_LEN);
}

static size_t
protobuf_item_prefix(const struct sreq *sr, char *buf, size_t len)
{
    return pb_item_prefix(buf, len);
}

static char *
protobuf_object(const struct sreq *sr, const void *item, size_t len, size_t *n)
{
    return pb_envelope(sr->fmt.api_version, sr->fmt.kind, item, len, n);
}

static void
protobuf_not_found(struct sreq *sr, const char *message, const struct status_details *det)
{
    struct gostr_buf b = {0};
    pb_status(&b, 404, "NotFound", message, det);
    size_t n = b.len;
    char *body = gostr_take(&b);
    hresp_header(sr->req, "Cache-Control", "no-cache, private");
    hresp_header(sr->req, "Content-Type", PB_CONTENT_TYPE);
    body_start(&sr->body, 404, (int64_t)n);
    body_write(&sr->body, body, n);
    body_end(&sr->body);
    free(body);
}

static const struct encoding enc_protobuf = {
    .content_type = PB_CONTENT_TYPE,
    .head = protobuf_head,
    .tail = protobuf_tail,
    .item_prefix = protobuf_item_prefix,
    .item_size = pb_item_size,
    .object = protobuf_object,
    .not_found = protobuf_not_found,
};

/* Metadata only (pom.h): PartialObjectMetadataList around each item's
 * PartialObjectMetadata. JSON: the typed list layout for every kind (the
 * list is metav1.PartialObjectMetadataList, a struct, even for custom
 * resources); a list without items has "items":null, as kube's
 * asPartialObjectMetadataList leaves the slice nil and encoding/json writes
 * it. Protobuf: the usual envelope and list message, each item field 2
 * holding {1: ObjectMeta}. */
static const struct listfmt meta_fmt = {
    .list_kind = POM_LIST_KIND, .kind = POM_KIND, .api_version = POM_API_VERSION};

static int
meta_json_derive(const struct sreq *sr, struct gostr_buf *b, const void *item, size_t len)
{
    return pom_json(b, item, len, sr->fmt.unstructured);
}

static int
meta_pb_derive(const struct sreq *sr, struct gostr_buf *b, const void *item, size_t len)
{
    return pom_pb(b, item, len);
}

static void
meta_json_head(const struct sreq *sr, struct evbuffer *out)
{
    size_t n;
    char *head = listfmt_head(&meta_fmt, &sr->meta, &n);
    evbuffer_add(out, head, n - 1); /* "items": and no '[' yet */
    free(head);
}

static void
meta_json_tail(const struct sreq *sr, struct evbuffer *out)
{
    evbuffer_add_printf(out, "%s}\n", sr->any_item ? "]" : "null");
}

static size_t
meta_json_item_prefix(const struct sreq *sr, char *buf, size_t len)
{
    buf[0] = sr->any_item ? ',' : '[';
    return 1;
}

/* A get: the object's PartialObjectMetadata (items are derived before they
 * reach an encoding's object: see serve_get). */
static char *
meta_json_object(const struct sreq *sr, const void *item, size_t len, size_t *n)
{
    char *p = xmalloc(len + 1);
    memcpy(p, item, len);
    p[len] = '\n';
    *n = len + 1;
    return p;
}

static const struct encoding enc_json_meta = {
    .content_type = "application/json",
    .head = meta_json_head,
    .tail = meta_json_tail,
    .item_prefix = meta_json_item_prefix,
    .object = meta_json_object,
    .not_found = json_not_found,
    .table_errors = true,
    .derive = meta_json_derive,
};

static void
meta_pb_head(const struct sreq *sr, struct evbuffer *out)
{
    size_t n;
    char *head = pb_list_head(POM_API_VERSION, POM_LIST_KIND, sr->meta.rv, sr->meta.cont,
                              sr->meta.remaining, sr->items_planned, &n);
    evbuffer_add(out, head, n);
    free(head);
}

static char *
meta_pb_object(const struct sreq *sr, const void *item, size_t len, size_t *n)
{
    return pb_envelope(POM_API_VERSION, POM_KIND, item, len, n);
}

static const struct encoding enc_protobuf_meta = {
    .content_type = PB_CONTENT_TYPE,
    .head = meta_pb_head,
    .tail = protobuf_tail,
    .item_prefix = protobuf_item_prefix,
    .item_size = pb_item_size,
    .object = meta_pb_object,
    .not_found = protobuf_not_found,
    .derive = meta_pb_derive,
};

/* A custom resource's metadata in protobuf, from its JSON cache: the same
 * bytes around each item, derived from the JSON object (admit.h
 * pom_from_json). */
static int
meta_pb_json_derive(const struct sreq *sr, struct gostr_buf *b, const void *item, size_t len)
{
    return pom_pb_from_json(b, item, len);
}

static const struct encoding enc_protobuf_meta_json = {
    .content_type = PB_CONTENT_TYPE,
    .head = meta_pb_head,
    .tail = protobuf_tail,
    .item_prefix = protobuf_item_prefix,
    .item_size = pb_item_size,
    .object = meta_pb_object,
    .not_found = protobuf_not_found,
    .derive = meta_pb_json_derive,
};

/* ---- helpers ---- */

static void
audit_id(struct sreq *sr)
{
    respond_audit_id(sr->req, sr->s->rng, sr->audit_id);
}

static void
common_headers(struct sreq *sr)
{
    hresp_header(sr->req, "Audit-Id", sr->audit_id);
    hresp_header(sr->req, "Cache-Control", "no-cache, private");
    hresp_header(sr->req, "Content-Type", sr->enc->content_type);
}

/* A Status (status_failure_json) as kube-apiserver writes it: JSON ending
 * with a newline (Go's json.Encoder), pretty-printed when asked (then
 * without), gzip past the threshold. */
static void
answer_status(struct sreq *sr, int code, const char *body, int retry_after)
{
    hresp_header(sr->req, "Cache-Control", "no-cache, private");
    hresp_header(sr->req, "Content-Type", "application/json");
    if (retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof(ra), "%d", retry_after);
        hresp_header(sr->req, "Retry-After", ra);
    }
    body_set_pretty(&sr->body, sr->error_pretty);
    char *text = xasprintf("%s\n", body);
    size_t n = strlen(text);
    body_start(&sr->body, code, (int64_t)n);
    body_write(&sr->body, text, n);
    body_end(&sr->body);
    free(text);
    sr->done = true;
}

static struct sreq *
sreq_of(void *arg)
{
    struct sreq *sr = arg;
    assert(sr && sr->magic == SREQ_MAGIC);
    return sr;
}

static void
set_key(char **dst, size_t *dl, const char *k, size_t kl, bool successor)
{
    free(*dst);
    *dst = xmalloc(kl + 2);
    memcpy(*dst, k, kl);
    (*dst)[kl] = '\0'; /* the smallest key after k is k + "\0" */
    (*dst)[kl + 1] = '\0';
    *dl = kl + (successor ? 1 : 0);
}

static void
wait_unlink(struct sreq *sr)
{
    if (!sr->prev_wait)
        return;
    *sr->prev_wait = sr->next_wait;
    if (sr->next_wait)
        sr->next_wait->prev_wait = sr->prev_wait;
    sr->prev_wait = NULL;
    sr->next_wait = NULL;
}

static void
sreq_free(struct sreq *sr)
{
    wait_unlink(sr);
    if (sr->kick)
        event_free(sr->kick);
    if (sr->timer)
        event_free(sr->timer);
    free(sr->chunk.base);
    free(sr->copy);
    free(gostr_take(&sr->derived));
    body_fini(&sr->body);
    sel_free(sr->sel);
    idx_view_fini(&sr->iv);
    decide_result_fini(&sr->dec);
    free(sr->prefix);
    free(sr->kinds);
    free(sr->key);
    free(sr->cont);
    free(sr->from);
    free(sr->end);
    sr->magic = 0;
    free(sr);
}

static void
on_close(void *arg)
{
    sreq_free(sreq_of(arg));
}

/* Detach sr from req (before handing req to someone else, who installs its
 * own hooks). */
static void
sreq_release(struct sreq *sr)
{
    hreq_set_handler(sr->req, NULL, NULL);
    sreq_free(sr);
}

static bool
matches(struct sreq *sr, const struct store_obj *o)
{
    if (!sr->sel)
        return true;
    if (idx_view_load(&sr->iv, o->idx, o->idx_len, sr->d->field_names, sr->d->n_fields) != 0)
        return false;
    return sel_matches(sr->sel, &sr->iv.labels, &sr->iv.fields);
}

/* The cache cannot give this answer and nothing of it has been sent: the
 * upstream answers it (sr is released). */
static void
pass_on(struct sreq *sr)
{
    struct serve *s = sr->s;
    struct hreq *req = sr->req;
    sreq_release(sr);
    pt_forward_read(req, s->o.up, s->o.pt);
}

/* Reading the cache failed before anything was sent (a damaged value, a
 * store error). A checksum mismatch has also marked the resource damaged;
 * its reflector takes it out of service. */
static void
log_read_failed(struct sreq *sr, int rc)
{
    log_warnx("cache %s: %s: reading the cache failed: %s; asking the upstream", sr->d->resource,
              hreq_target(sr->req, NULL), kwc_strerror(rc));
    sr->s->stats.errors++;
}

static void
read_failed(struct sreq *sr, int rc)
{
    log_read_failed(sr, rc);
    pass_on(sr);
}

/* The connection closes at once: sr is freed (on_close) before this returns. */
static void
fail_stream(struct sreq *sr, int rc)
{
    log_warnx("cache: %s %s: reading the cache failed mid-list: %s; closing the stream",
              sr->d->resource, hreq_target(sr->req, NULL), kwc_strerror(rc));
    sr->done = true;
    hresp_abort(sr->req);
}

/* ---- get ---- */

static void
serve_get(struct sreq *sr)
{
    struct serve *s = sr->s;
    struct store_rtxn *t;
    struct store_obj o;
    int rc = store_rtxn_begin(s->st, &t);
    if (rc == 0)
        rc = store_get(t, sr->d->sres, sr->key, strlen(sr->key), &o);
    if (rc != 0 && rc != KWC_ENOTFOUND) {
        store_rtxn_end(t);
        read_failed(sr, rc);
        return;
    }
    s->stats.gets++;
    if (rc == 0) {
        size_t n;
        const void *item = o.raw;
        size_t item_len = o.raw_len;
        if (sr->enc->derive) {
            sr->derived.len = 0;
            if (sr->enc->derive(sr, &sr->derived, o.raw, o.raw_len) != 0) {
                store_rtxn_end(t);
                read_failed(sr, KWC_ECORRUPT);
                return;
            }
            item = sr->derived.p;
            item_len = sr->derived.len;
        }
        char *body = sr->enc->object(sr, item, item_len, &n);
        store_rtxn_end(t);
        common_headers(sr);
        body_start(&sr->body, 200, (int64_t)n);
        body_write(&sr->body, body, n);
        body_end(&sr->body);
        free(body);
        sr->done = true;
        return;
    }
    store_rtxn_end(t);
    if ((sr->enc->table_errors &&
         route_negotiate(hreq_header(sr->req, "Accept"), true) == ROUTE_MEDIA_PROTOBUF) ||
        (sr->enc->derive && !sr->enc->table_errors) || sr->error_upstream) {
        /* and a metadata-only get in protobuf: which encoding the Status of
         * a conversion request is written in is left to the upstream */
        /* a custom resource's 404 with protobuf asked for: the upstream's
         * serializer picks the Status's encoding (see serve_take) */
        struct hreq *req = sr->req;
        sreq_release(sr);
        pt_forward_read(req, s->o.up, s->o.pt);
        return;
    }
    /* errors.NewNotFound(qualifiedResource, name) */
    const struct refl_desc *d = sr->d;
    char *msg = d->group[0] ? xasprintf("%s.%s \"%s\" not found", d->resource, d->group, sr->name)
                            : xasprintf("%s \"%s\" not found", d->resource, sr->name);
    struct status_details det = {
        .name = sr->name, .group = d->group[0] ? d->group : NULL, .kind = d->resource};
    hresp_header(sr->req, "Audit-Id", sr->audit_id);
    sr->enc->not_found(sr, msg, &det); /* its own Content-Type and Cache-Control */
    free(msg);
    sr->done = true;
}

/* ---- list ---- */

static int
scan(struct sreq *sr, struct store_rtxn *t, store_obj_cb cb, void *arg)
{
    if (sr->by_field)
        return store_scan_field(t, sr->d->sres, sr->at_rv, sr->by_field, sr->prefix, sr->from,
                                sr->from_len, cb, arg);
    return store_scan(t, sr->d->sres, sr->at_rv, sr->prefix, sr->from, sr->from_len, cb, arg);
}

/*
 * What a list will send, found before its first byte in one read transaction
 * at the list's rv (every chunk's transaction reads that same state): for a
 * limited page its last key, whether keys follow it and (without selectors)
 * how many; for an encoding whose head states the items' length, that
 * length. The pass reads keys, value heads and (with selectors) index bytes,
 * never an item's bytes: their checksums are checked on the copies the
 * chunks make, as for every list (store_rtxn_defer_raw_check).
 */
struct plan {
    struct sreq *sr;
    int64_t limit, matched, count;
    bool more;
    uint64_t items_bytes;
};

static int
on_plan_obj(void *arg, const struct store_obj *o)
{
    struct plan *p = arg;
    struct sreq *sr = p->sr;
    if (p->limit > 0 && p->matched == p->limit) {
        /* kube's etcd store: more = some key follows the page's last */
        p->more = true;
        if (sr->sel)
            return 1;
        p->count++;
        return 0;
    }
    if (!matches(sr, o))
        return 0;
    p->matched++;
    if (sr->enc->item_size) {
        size_t len = o->raw_len;
        if (sr->enc->derive) {
            /* the derived size, from the stored bytes (their checksum is
             * checked when a chunk copies them, and what leaves is derived
             * from that copy: a difference cuts the list, see fill) */
            sr->derived.len = 0;
            if (sr->enc->derive(sr, &sr->derived, o->raw, o->raw_len) != 0)
                return KWC_ECORRUPT;
            len = sr->derived.len;
        }
        p->items_bytes += sr->enc->item_size(len);
    }
    if (p->matched == p->limit)
        set_key(&sr->end, &sr->end_len, o->key, o->key_len, false);
    return 0;
}

static int
on_any_obj(void *arg, const struct store_obj *o)
{
    *(bool *)arg = true;
    return 1;
}

static int
plan_list(struct sreq *sr)
{
    struct plan p = {.sr = sr, .limit = sr->dec.limit};
    struct store_rtxn *t;
    int rc = store_rtxn_begin(sr->s->st, &t);
    if (rc)
        return rc;
    store_rtxn_defer_raw_check(t); /* no item's bytes are read here */
    rc = scan(sr, t, on_plan_obj, &p);
    if (rc == 0 && sr->by_field && p.limit > 0 && p.matched == p.limit && !p.more) {
        /* the index saw no further candidate, but kube's "more" is about any
         * key in the range after the page's last */
        rc = store_scan(t, sr->d->sres, sr->at_rv, sr->prefix, sr->end, sr->end_len + 1, on_any_obj,
                        &p.more);
    }
    store_rtxn_end(t);
    if (rc)
        return rc;
    sr->items_planned = p.items_bytes;
    if (!p.more)
        return 0;
    size_t pl = strlen(sr->prefix);
    rc = cont_encode((int64_t)sr->meta.rv, sr->end + pl, sr->end_len - pl, &sr->cont);
    if (rc)
        return rc;
    sr->meta.cont = sr->cont;
    if (!sr->sel && sr->dec.remaining_count)
        sr->meta.remaining = p.count;
    return 0;
}

/* ---- the chunk being filled ---- */

static char *
chunk_data(struct sreq *sr)
{
    return sr->chunk.base + HRESP_BLOCK_BEFORE;
}

/* Room for n more bytes (one block, grown when it must). */
static char *
chunk_reserve(struct sreq *sr, size_t n)
{
    struct chunk *k = &sr->chunk;
    if (!k->base || k->cap - k->len < n) {
        size_t cap = k->len + n > CHUNK_BYTES ? k->len + n : CHUNK_BYTES;
        k->base = xrealloc(k->base, HRESP_BLOCK_BEFORE + cap + HRESP_BLOCK_AFTER);
        k->cap = cap;
    }
    return chunk_data(sr) + k->len;
}

/* Move what the encoding wrote into b (its head, its tail) to the chunk. */
static void
chunk_add_buffer(struct sreq *sr, struct evbuffer *b)
{
    size_t n = evbuffer_get_length(b);
    evbuffer_remove(b, chunk_reserve(sr, n), n);
    sr->chunk.len += n;
}

/* The chunk goes to the response (which frees it). */
static void
send_chunk(struct sreq *sr)
{
    struct chunk *k = &sr->chunk;
    if (k->len == 0)
        return;
    body_write_block(&sr->body, k->base, chunk_data(sr), k->len);
    *k = (struct chunk){0};
}

struct fill {
    struct sreq *sr;
    size_t visits;
    bool more;
};

/* An item's bytes into the chunk behind the encoding's prefix (check: the
 * stored bytes, their checksum checked on the copy): 0 added, 1 the chunk
 * is full (o starts the next one), else the check's error (nothing
 * committed: the chunk is as before). */
static int
chunk_item(struct sreq *sr, struct fill *f, const struct store_obj *o, const char *p, size_t len,
           bool check)
{
    size_t need = ITEM_PREFIX_MAX + len;
    if (sr->chunk.len > 0 && sr->chunk.len + need > CHUNK_BYTES) {
        set_key(&sr->from, &sr->from_len, o->key, o->key_len, false);
        f->more = true;
        return 1;
    }
    char *d = chunk_reserve(sr, need);
    size_t n = sr->enc->item_prefix(sr, d, len);
    memcpy(d + n, p, len);
    int rc = check ? store_obj_check_raw(sr->d->sres, o, d + n) : 0;
    if (rc)
        return rc;
    sr->chunk.len += n + len;
    sr->any_item = true;
    sr->items_sent += n + len;
    return 0;
}

static int
on_fill_obj(void *arg, const struct store_obj *o)
{
    struct fill *f = arg;
    struct sreq *sr = f->sr;
    if (sr->end && store_keycmp(o->key, o->key_len, sr->end, sr->end_len) > 0)
        return 1; /* past the page */
    if (matches(sr, o)) {
        int rc;
        if (sr->enc->derive) {
            /* metadata only: the stored bytes copied and checked, the
             * answer derived from the copy */
            if (sr->copy_cap < o->raw_len) {
                sr->copy = xrealloc(sr->copy, o->raw_len);
                sr->copy_cap = o->raw_len;
            }
            memcpy(sr->copy, o->raw, o->raw_len);
            if ((rc = store_obj_check_raw(sr->d->sres, o, sr->copy)) != 0)
                return rc;
            sr->derived.len = 0;
            if (sr->enc->derive(sr, &sr->derived, sr->copy, o->raw_len) != 0)
                return KWC_ECORRUPT;
            rc = chunk_item(sr, f, o, sr->derived.p, sr->derived.len, false);
        } else {
            /* the object's bytes read once, from the map into the answer,
             * and their checksum checked there (store_rtxn_defer_raw_check) */
            rc = chunk_item(sr, f, o, o->raw, o->raw_len, true);
        }
        if (rc)
            return rc;
    }
    if (++f->visits >= CHUNK_VISITS || sr->chunk.len >= CHUNK_BYTES) {
        set_key(&sr->from, &sr->from_len, o->key, o->key_len, true);
        f->more = true;
        return 1;
    }
    return 0;
}

static void
start_stream(struct sreq *sr)
{
    common_headers(sr);
    sr->started = true;
    /* chunked on HTTP/1.1; HTTP/1.0: the body ends when kwc closes */
    body_start(&sr->body, 200, -1);
}

/* One chunk, or the last one with the tail (sr->done). False when the
 * stream was cut: sr is gone (hresp_abort closed the request). */
static bool
fill(struct sreq *sr)
{
    struct fill f = {.sr = sr};
    struct store_rtxn *t;
    int rc = store_rtxn_begin(sr->s->st, &t);
    if (rc == 0) {
        store_rtxn_defer_raw_check(t); /* on_fill_obj checks each copy */
        rc = scan(sr, t, on_fill_obj, &f);
    }
    store_rtxn_end(t);
    if (rc) {
        if (!sr->started) {
            log_read_failed(sr, rc);
            sr->done = true;
            sr->pass_on = true; /* pump hands it upstream: sr goes with it */
            return true;
        }
        fail_stream(sr, rc);
        return false;
    }
    if (sr->enc->item_size &&
        (sr->items_sent > sr->items_planned || (!f.more && sr->items_sent != sr->items_planned))) {
        /* Never expected: the plan and the chunks read one state (at_rv).
         * But a message whose length disagrees with its envelope must not
         * leave: before the answer started the upstream answers instead;
         * after, the stream is cut so that the client sees it incomplete. */
        log_warnx("cache %s: %s: the items came to %llu bytes where the plan at rv %llu counted "
                  "%llu; %s",
                  sr->d->resource, hreq_target(sr->req, NULL), (unsigned long long)sr->items_sent,
                  (unsigned long long)sr->at_rv, (unsigned long long)sr->items_planned,
                  sr->started ? "closing the stream" : "asking the upstream");
        sr->s->stats.errors++;
        sr->done = true;
        if (sr->started) {
            hresp_abort(sr->req);
            return false;
        }
        sr->pass_on = true;
        return true;
    }
    if (!f.more) {
        struct evbuffer *tail = evbuffer_new();
        sr->enc->tail(sr, tail);
        chunk_add_buffer(sr, tail);
        evbuffer_free(tail);
        sr->done = true;
        if (!sr->started) {
            /* the whole list in one piece: a plain response with Content-Length */
            common_headers(sr);
            body_start(&sr->body, 200, (int64_t)sr->chunk.len);
            send_chunk(sr);
            body_end(&sr->body);
            return true;
        }
        send_chunk(sr);
        body_end(&sr->body);
        return true;
    }
    if (!sr->started)
        start_stream(sr);
    send_chunk(sr);
    return true;
}

/* Fill while the client keeps up; else wait for its socket to drain. The
 * body writes what it holds first (pretty output, gzip: body.h). */
static void
pump(struct sreq *sr)
{
    if (!body_flush(&sr->body))
        return; /* on_drain goes on */
    if (sr->done)
        return;
    if (!fill(sr))
        return; /* the stream was cut: sr is gone */
    if (sr->pass_on) {
        pass_on(sr);
        return;
    }
    if (sr->done)
        return;
    if (hresp_queued(sr->req) < sr->s->o.max_buffer / 2 && !body_busy(&sr->body))
        event_active(sr->kick, EV_TIMEOUT, 1); /* let other work run between chunks */
}

static void
on_kick(evutil_socket_t fd, short what, void *arg)
{
    pump(sreq_of(arg));
}

/* The response queue drained to half of max_buffer. */
static void
on_drain(void *arg)
{
    struct sreq *sr = sreq_of(arg);
    if (!sr->done || body_busy(&sr->body))
        event_active(sr->kick, EV_TIMEOUT, 1);
}

static void
serve_list(struct sreq *sr)
{
    struct serve *s = sr->s;
    s->stats.lists++;
    int rc = 0;
    if ((sr->dec.limit > 0 || sr->enc->item_size) && (rc = plan_list(sr)) != 0) {
        read_failed(sr, rc);
        return;
    }
    struct evbuffer *head = evbuffer_new();
    sr->enc->head(sr, head);
    chunk_add_buffer(sr, head);
    evbuffer_free(head);
    /* an HTTP/2 connection over its bound (h2.c) has no room even for the
     * first chunk: on_drain starts it (HTTP/1.1: nothing is queued here) */
    if (hresp_queued(sr->req) >= s->o.max_buffer)
        return;
    pump(sr);
}

/* ---- starting: at once, or after the cache reaches an rv ---- */

static uint64_t
cache_rv(struct serve *s, const struct refl_desc *d, uint64_t *floor)
{
    return store_res_rv(s->st, d->sres, floor);
}

static void
start(struct sreq *sr)
{
    /* exact: the rv asked for; else the newest the cache has */
    sr->at_rv = sr->dec.action == DECIDE_SERVE_EXACT ? sr->dec.rv : cache_rv(sr->s, sr->d, NULL);
    sr->meta.rv = sr->at_rv;
    if (sr->list)
        serve_list(sr);
    else
        serve_get(sr);
}

static void
on_wait_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct sreq *sr = sreq_of(arg);
    struct serve *s = sr->s;
    uint64_t cur = cache_rv(s, sr->d, NULL);
    wait_unlink(sr);
    if (cur >= sr->dec.rv) {
        start(sr);
        return;
    }
    struct decide_result t;
    decide_timeout(&sr->dec, cur, &t);
    if (t.action == DECIDE_ERROR && sr->enc->table_errors && !sr->error_upstream) {
        s->stats.errors++;
        hresp_header(sr->req, "Audit-Id", sr->audit_id);
        answer_status(sr, t.code, t.body, t.retry_after_seconds);
        decide_result_fini(&t);
        return;
    }
    decide_result_fini(&t);
    s->stats.passed_after_wait++;
    log_debug("cache %s: rv %llu not reached in %d ms (cache at %llu): asking the upstream",
              sr->d->resource, (unsigned long long)sr->dec.rv, s->o.wait_ms,
              (unsigned long long)cur);
    pass_on(sr);
}

void
serve_committed(void *arg)
{
    struct serve *s = arg;
    struct sreq *sr = s->waiters;
    while (sr) {
        struct sreq *next = sr->next_wait;
        if (cache_rv(s, sr->d, NULL) >= sr->dec.rv) {
            wait_unlink(sr);
            evtimer_del(sr->timer);
            start(sr);
        }
        sr = next;
    }
}

/* The request has been read (its body, if any, dropped). */
static void
on_complete(void *arg)
{
    struct sreq *sr = sreq_of(arg);
    struct serve *s = sr->s;
    struct hreq *req = sr->req;
    if (sr->dec.action == DECIDE_ERROR) {
        s->stats.errors++;
        hresp_header(req, "Audit-Id", sr->audit_id);
        answer_status(sr, sr->dec.code, sr->dec.body, sr->dec.retry_after_seconds);
        return;
    }
    if (sr->dec.action == DECIDE_SERVE_AT_LEAST && cache_rv(s, sr->d, NULL) < sr->dec.rv) {
        s->stats.waited++;
        sr->next_wait = s->waiters;
        if (s->waiters)
            s->waiters->prev_wait = &sr->next_wait;
        s->waiters = sr;
        sr->prev_wait = &s->waiters;
        sr->timer = evtimer_new(s->base, on_wait_timeout, sr);
        struct timeval tv = {s->o.wait_ms / 1000, (s->o.wait_ms % 1000) * 1000};
        evtimer_add(sr->timer, &tv);
        return;
    }
    start(sr);
}

/* ---- the route stage ---- */

static const struct hreq_handler serve_handler = {
    .on_complete = on_complete,
    .on_drain = on_drain,
    .on_close = on_close,
};

bool
serve_take(struct serve *s, struct hreq *req, const struct route_req *r)
{
    if (r->verb != ROUTE_GET && r->verb != ROUTE_LIST)
        return false;
    struct admit_req q = {.r = r,
                          .method = hreq_method(req),
                          .accept = hreq_header(req, "Accept"),
                          .user_agent = hreq_header(req, "User-Agent"),
                          .too_large = s->o.too_large};
    struct admit a;
    admit_decide(&q, &s->caches.c, &a);
    if (a.want)
        refl_want(s->set->r[a.cache]);
    if (a.action == ADMIT_PASS) {
        if (a.why == ADMIT_WHY_TABLE || a.why == ADMIT_WHY_ERROR_ENCODING ||
            a.why == ADMIT_WHY_FIELDS)
            log_debug("cache %s: %s passed through (%s)", refl_desc(s->set->r[a.cache])->resource,
                      r->path,
                      a.why == ADMIT_WHY_TABLE            ? decide_why_name(a.dec.why)
                      : a.why == ADMIT_WHY_ERROR_ENCODING ? "an error to answer in protobuf"
                                                          : "field selector");
        admit_fini(&a);
        return false;
    }
    const struct refl_desc *d = refl_desc(s->set->r[a.cache]);
    bool list = a.verb == DECIDE_LIST;

    struct sreq *sr = xcalloc(1, sizeof(*sr));
    sr->magic = SREQ_MAGIC;
    sr->s = s;
    sr->req = req;
    sr->d = d;
    sr->enc = a.pom_from_json       ? &enc_protobuf_meta_json
              : a.enc == KWC_ENC_PB ? (a.meta ? &enc_protobuf_meta : &enc_protobuf)
              : a.meta              ? &enc_json_meta
                                    : &enc_json;
    body_init(&sr->body, req, a.pretty && a.enc == KWC_ENC_JSON,
              body_accepts_gzip(hreq_header(req, "Accept-Encoding")), s->o.max_buffer / 2);
    hresp_low_water(req, s->o.max_buffer / 2);
    sr->kick = event_new(s->base, -1, 0, on_kick, sr);
    sr->error_pretty = a.error_pretty;
    sr->error_upstream = a.error_upstream;
    sr->list = list;
    sr->dec = a.dec;
    a.dec = (struct decide_result){0};
    if (a.sel && !sel_is_everything(a.sel)) {
        sr->sel = a.sel;
        a.sel = NULL;
    }
    admit_fini(&a);
    if (sr->sel && d->index_field >= 0)
        sr->by_field = sel_requires_exact(sr->sel, d->field_names[d->index_field]);
    /* copies: a rediscovery may replace the descriptor's strings mid-stream
     * (on the main loop, while this one reads: each is read once) */
    const char *list_kind = d->list_kind, *kind = d->kind;
    sr->kinds = xasprintf("%s%c%s%c%s", list_kind, 0, kind, 0, d->api_version);
    sr->fmt = (struct listfmt){.list_kind = sr->kinds,
                               .kind = sr->kinds + strlen(list_kind) + 1,
                               .api_version = sr->kinds + strlen(list_kind) + strlen(kind) + 2,
                               .unstructured = d->typed_items};
    sr->meta.remaining = -1;
    sr->prefix = r->namespace_ && d->namespaced ? xasprintf("%s/", r->namespace_) : xstrdup("");
    if (!list) {
        sr->key = xasprintf("%s%s", sr->prefix, r->name);
        sr->name = sr->key + strlen(sr->prefix);
    }
    if (sr->dec.start_key) {
        /* a continue token's start key, relative to the prefix */
        size_t pl = strlen(sr->prefix);
        sr->from_len = pl + sr->dec.start_key_len;
        sr->from = xmalloc(sr->from_len + 1);
        memcpy(sr->from, sr->prefix, pl);
        memcpy(sr->from + pl, sr->dec.start_key, sr->dec.start_key_len);
        sr->from[sr->from_len] = '\0';
    }
    audit_id(sr);
    hreq_set_handler(req, &serve_handler, sr);
    return true;
}

struct serve *
serve_new(struct event_base *base, struct store *st, const struct refl_set *set,
          const struct serve_options *o)
{
    struct serve *s = xcalloc(1, sizeof(*s));
    s->base = base;
    s->st = st;
    s->set = set;
    s->o = *o;
    admit_refls_init(&s->caches, set, st);
    respond_rng_seed(s->rng);
    return s;
}

void
serve_free(struct serve *s)
{
    if (!s)
        return;
    /* Call after the HTTP server is freed (its requests' on_close hooks free
     * every sreq); anything left waiting is only detached. */
    for (struct sreq *sr = s->waiters, *next; sr; sr = next) {
        next = sr->next_wait;
        evtimer_del(sr->timer);
        sr->prev_wait = NULL;
        sr->next_wait = NULL;
    }
    free(s);
}

void
serve_stats(const struct serve *s, struct serve_stats *out)
{
    *out = s->stats;
}
