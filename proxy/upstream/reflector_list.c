/*
 * reflector_list.c — a reflector's LIST (see reflector.h and
 * reflector_int.h): pages of LIST_PAGE objects with continue tokens, loaded
 * into the store in one transaction each (a fresh list resets the cache
 * first), or, for a relist after a 410, compared with the cache and the
 * differences recorded as events (the pure difference is cache/relist.c;
 * this file reads the store for it and writes its events). Then the cache is
 * synced and the watch starts from the list's rv. Also the decoding of one
 * object into its key, rv, index bytes and list-item form, which the watch
 * shares.
 */
#include "reflector_int.h"

#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kwc/base.h"
#include "kwc/index.h"
#include "kwc/log.h"
#include "kwc/relist.h"
#include "kwc/store.h"

#define LIST_PAGE 500

/* ---- decoding one object ---- */

void
refl_decoded_fini(struct refl_decoded *d)
{
    free(d->key);
    free(d->idx);
    free(d->own);
}

/* One object in r's encoding: JSON text, or a protobuf object message. */
int
refl_decode_obj(struct refl *r, const char *json, size_t len, bool from_watch,
                struct refl_decoded *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    struct obj_meta m;
    int rc;
    if (r->d.enc == KWC_ENC_PB) {
        rc = pb_meta_parse(json, len, r->pbf, r->d.n_fields, 0, 0, &m, err, errlen);
    } else {
        struct obj_fields_spec spec = {.fields = r->d.fields, .n_fields = r->d.n_fields};
        rc = obj_meta_parse(json, len, &spec, &m, err, errlen);
    }
    if (rc)
        return rc;
    if (r->d.namespaced)
        out->key = xasprintf("%s/%s", m.namespace_, m.name);
    else
        out->key = xstrdup(m.name);
    out->key_len = strlen(out->key);
    out->rv = m.rv;
    rc = idx_encode(&m, &out->idx, &out->idx_len);
    obj_meta_fini(&m);
    if (rc) {
        snprintf(err, errlen, "too many labels or fields");
        refl_decoded_fini(out);
        return rc;
    }
    out->obj = json;
    out->obj_len = len;
    size_t pl = r->typemeta_len;
    if (from_watch && r->d.enc == KWC_ENC_JSON && !r->d.typed_items && r->typemeta && len > pl &&
        memcmp(json, r->typemeta, pl) == 0) {
        /* cut the TypeMeta kube writes first on typed objects */
        out->own = xmalloc(len - pl + 1);
        out->own[0] = '{';
        memcpy(out->own + 1, json + pl, len - pl);
        out->obj = out->own;
        out->obj_len = len - pl + 1;
    }
    return 0;
}

/* ---- LIST ---- */

void
refl_diff_reset(struct refl *r)
{
    relist_free(r->rl);
    r->rl = NULL;
}

/* diff: every object the cache holds (a deletion if the list lacks it). */
static int
on_stored_obj(void *arg, const struct store_obj *o)
{
    struct relist_obj ro = {.key = o->key,
                            .key_len = o->key_len,
                            .rv = o->rv,
                            .obj = o->raw,
                            .obj_len = o->raw_len,
                            .idx = o->idx,
                            .idx_len = o->idx_len};
    relist_stored(arg, &ro);
    return 0;
}

#define DIFF_DIVERGED 1  /* finish_diff: the cache's history is not the upstream's */
#define LIST_WENT_BACK 2 /* load_page: the list's rv is below the cache's */

/* Record the relist's differences (cache/relist.c) as events, in rv order,
 * in one transaction. Returns 0, DIFF_DIVERGED (what showed it in why, the
 * cache's rv in *held) or an error. */
static int
finish_diff(struct refl *r, char *why, size_t whylen, uint64_t *held)
{
    if (!r->rl)
        r->rl = relist_new(r->list_rv);
    struct store_rtxn *t;
    int rc = store_rtxn_begin(r->ing->st, &t);
    if (rc)
        return rc;
    struct store_res_info info = {0};
    rc = store_info(t, r->d.sres, &info);
    if (rc == 0)
        rc = store_scan(t, r->d.sres, 0, "", NULL, 0, on_stored_obj, r->rl);
    store_rtxn_end(t);
    if (rc)
        return rc;
    /* A list behind the cache, or an object at an rv the cache passed with
     * another state of it: the cache's history is not the upstream's. Start
     * over from a fresh list. */
    struct relist_outcome o;
    *held = info.rv;
    switch (relist_finish(r->rl, info.rv, &o)) {
    case RELIST_BEHIND:
        snprintf(why, whylen, "a relist");
        return DIFF_DIVERGED;
    case RELIST_PASSED:
        /* the upstream went back and forward again past the cache's rv */
        snprintf(why, whylen,
                 "a relist has %.*s at rv %llu, which the cache passed with another "
                 "state of it",
                 (int)o.key_len, o.key, (unsigned long long)o.rv);
        return DIFF_DIVERGED;
    case RELIST_OK:
        break;
    }
    if (o.crowded)
        log_warnx("cache %s: %zu deletions found by the relist at rv %llu share that rv: the "
                  "upstream's rvs left no room between %llu and it",
                  r->label, o.crowded, (unsigned long long)r->list_rv, (unsigned long long)info.rv);
    refl_ingest_commit(r->ing); /* keep order with anything already pending */
    size_t n;
    const struct relist_event *evs = relist_events(r->rl, &n);
    struct store_wtxn *w;
    if ((rc = store_wtxn_begin(r->ing->st, (uint64_t)time(NULL), &w)))
        return rc;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const struct relist_event *p = &evs[i];
        struct store_event ev = {.type = p->type,
                                 .rv = p->rv,
                                 .key = p->key,
                                 .key_len = p->key_len,
                                 .obj = p->obj,
                                 .obj_len = p->obj_len,
                                 .idx = p->idx,
                                 .idx_len = p->idx_len};
        rc = store_wtxn_event(w, r->d.sres, &ev);
    }
    if (rc == 0)
        rc = store_wtxn_rv(w, r->d.sres, r->list_rv);
    if (rc == 0)
        rc = store_wtxn_commit(w);
    else
        store_wtxn_abort(w);
    if (rc == 0)
        log_info("cache %s: relisted at rv %llu: %zu changes recorded as events", r->label,
                 (unsigned long long)r->list_rv, n);
    return rc;
}

/* One LIST page in either encoding: its rv, continue token and items. */
struct page {
    enum kwc_enc enc;
    uint64_t rv;
    const char *cont; /* "" when none */
    struct obj_list jl;
    struct pb_list pl;
    size_t next; /* protobuf: the next item */
};

static int
page_init(struct page *pg, enum kwc_enc enc, const char *body, size_t len, char *err, size_t errlen)
{
    memset(pg, 0, sizeof(*pg));
    pg->enc = enc;
    int rc;
    if (enc == KWC_ENC_PB) {
        rc = pb_list_parse(body, len, &pg->pl, err, errlen);
        pg->rv = pg->pl.rv;
        pg->cont = pg->pl.continue_ ? pg->pl.continue_ : "";
    } else {
        rc = obj_list_init(&pg->jl, body, len, err, errlen);
        pg->rv = pg->jl.rv;
        pg->cont = pg->jl.continue_ ? pg->jl.continue_ : "";
    }
    return rc;
}

static int
page_next(struct page *pg, size_t *off, size_t *len)
{
    if (pg->enc == KWC_ENC_JSON)
        return obj_list_next(&pg->jl, off, len);
    if (pg->next >= pg->pl.n_items)
        return 0;
    *off = pg->pl.off[pg->next];
    *len = pg->pl.len[pg->next];
    pg->next++;
    return 1;
}

static void
page_fini(struct page *pg)
{
    obj_list_fini(&pg->jl);
    pb_list_fini(&pg->pl);
}

static int
load_page(struct refl *r, struct page *l, char *err, size_t errlen)
{
    const char *body = (const char *)evbuffer_pullup(r->body, -1);
    struct store_wtxn *w = NULL;
    struct store_rtxn *t = NULL;
    int rc;
    bool first = r->cont == NULL;
    if (first)
        r->list_rv = l->rv;
    /* a quorum read below what the cache holds (a relist, a rebuild) */
    if (first && r->synced && refl_rv_went_back(r->rv, l->rv))
        return LIST_WENT_BACK;
    if (r->diff && !r->rl) /* the first page (refl_list_start dropped any other) */
        r->rl = relist_new(r->list_rv);
    if (r->diff) {
        if ((rc = store_rtxn_begin(r->ing->st, &t)))
            return rc;
    } else {
        if ((rc = store_wtxn_begin(r->ing->st, (uint64_t)time(NULL), &w)))
            return rc;
        if (first && (rc = store_wtxn_reset(w, r->d.sres, l->rv)))
            goto out;
    }
    size_t off, len;
    bool first_item = true;
    while (page_next(l, &off, &len) == 1) {
        if (first_item && first && r->d.enc == KWC_ENC_JSON) {
            /* Custom resources keep their TypeMeta on list items. */
            r->d.typed_items = len > 8 && (memcmp(body + off, "{\"kind\":", 8) == 0 ||
                                           memcmp(body + off, "{\"apiVersion\":", 14) == 0);
        }
        first_item = false;
        struct refl_decoded d;
        if ((rc = refl_decode_obj(r, body + off, len, false, &d, err, errlen)))
            goto out;
        r->listed++;
        r->listed_bytes += len;
        if (!r->diff) {
            struct store_event ev = {.rv = d.rv,
                                     .key = d.key,
                                     .key_len = d.key_len,
                                     .obj = d.obj,
                                     .obj_len = d.obj_len,
                                     .idx = d.idx,
                                     .idx_len = d.idx_len};
            rc = store_wtxn_load(w, r->d.sres, &ev);
            refl_decoded_fini(&d);
            if (rc)
                goto out;
            continue;
        }
        struct store_obj cur;
        int g = store_get(t, r->d.sres, d.key, d.key_len, &cur);
        struct relist_obj item = {.key = d.key,
                                  .key_len = d.key_len,
                                  .rv = d.rv,
                                  .obj = d.obj,
                                  .obj_len = d.obj_len,
                                  .idx = d.idx,
                                  .idx_len = d.idx_len};
        relist_listed(r->rl, &item, g == 0, g == 0 ? cur.rv : 0);
        refl_decoded_fini(&d);
    }
    rc = 0;
out:
    if (w) {
        if (rc == 0)
            rc = store_wtxn_commit(w);
        else
            store_wtxn_abort(w);
    }
    store_rtxn_end(t);
    return rc;
}

static void
on_list_done(void *arg, int err, const char *msg)
{
    struct refl *r = arg;
    r->x = NULL;
    if (err)
        refl_ingest_lost(r->ing);
    char why[512], cause[160];
    if (r->wrong_type || (r->d.enc == KWC_ENC_PB && r->status == 406)) {
        refl_refuse(r, r->wrong_type ? r->got_type : "406 Not Acceptable");
        return;
    }
    if (err || r->too_big) {
        snprintf(why, sizeof(why), "LIST %s failed: %s", r->d.path, err ? msg : "page too large");
        refl_xfer_cause(r, "list", err, cause, sizeof(cause));
        refl_retry(r, cause, why);
        return;
    }
    if (r->status == 410) {
        r->ctr.expired++;
        /* the continue token expired: start the list again */
        log_warnx("cache %s: continue token expired; restarting the list", r->label);
        free(r->cont);
        r->cont = NULL;
        refl_list_start(r, r->diff);
        return;
    }
    if (r->status != 200) {
        char what[300];
        snprintf(what, sizeof(what), "LIST %s", r->d.path);
        refl_status_why(r, what, why, sizeof(why));
        refl_xfer_cause(r, "list", 0, cause, sizeof(cause));
        refl_retry(r, cause, why);
        return;
    }
    size_t len = evbuffer_get_length(r->body);
    struct page l;
    char perr[256] = "";
    int rc = page_init(&l, r->d.enc, (const char *)evbuffer_pullup(r->body, -1), len, perr,
                       sizeof(perr));
    if (rc == 0)
        rc = load_page(r, &l, perr, sizeof(perr));
    char *next = rc == 0 && l.cont[0] ? xstrdup(l.cont) : NULL;
    page_fini(&l);
    if (rc == LIST_WENT_BACK) {
        refl_reset(r, false, r->list_rv, r->rv, "a list");
        return;
    }
    if (rc) {
        snprintf(why, sizeof(why), "LIST %s: %s", r->d.path, perr[0] ? perr : kwc_strerror(rc));
        free(next);
        refl_store_failed(r, rc);
        snprintf(cause, sizeof(cause), "cache list failed: %s", kwc_strerror(rc));
        refl_retry(r, cause, why);
        return;
    }
    if (refl_secs_since(r, r->last_progress_ms) >= 2.0) {
        double s = refl_secs_since(r, r->list_t0_ms);
        log_info("cache %s: listed %llu objects (%.1f MB) in %.1f s, %.0f objects/s", r->label,
                 (unsigned long long)r->listed, r->listed_bytes / 1e6, s,
                 r->listed / (s > 0 ? s : 1));
        r->last_progress_ms = refl_now_ms(r);
    }
    free(r->cont);
    r->cont = next;
    if (next) {
        refl_list_start(r, r->diff); /* next page */
        return;
    }
    /* The list is complete. */
    uint64_t held = 0;
    if (r->diff && (rc = finish_diff(r, why, sizeof(why), &held)) == DIFF_DIVERGED) {
        /* the cache's history is not the upstream's */
        refl_reset(r, false, r->list_rv, held, why);
        return;
    }
    if (r->diff && rc != 0) {
        snprintf(why, sizeof(why), "recording the relist of %s: %s", r->d.path, kwc_strerror(rc));
        refl_diff_reset(r);
        refl_store_failed(r, rc);
        snprintf(cause, sizeof(cause), "cache relist not recorded: %s", kwc_strerror(rc));
        refl_retry(r, cause, why);
        return;
    }
    refl_diff_reset(r);
    struct store_wtxn *w;
    if (store_wtxn_begin(r->ing->st, (uint64_t)time(NULL), &w) == 0) {
        store_wtxn_set_kind(w, r->d.sres, r->d.list_kind, r->d.api_version, r->d.namespaced);
        store_wtxn_set_identity(w, r->d.sres, r->identity);
        store_wtxn_set_synced(w, r->d.sres, true);
        if (store_wtxn_commit(w) != 0)
            log_error("cache %s: could not record the synced state", r->label);
    }
    double s = refl_secs_since(r, r->list_t0_ms);
    log_info("cache %s: synced %llu objects (%.1f MB) at rv %llu in %.2f s (%.0f objects/s)",
             r->label, (unsigned long long)r->listed, r->listed_bytes / 1e6,
             (unsigned long long)r->list_rv, s, r->listed / (s > 0 ? s : 1));
    r->rv = r->list_rv;
    r->ever_synced = true;
    r->synced = true;
    r->diff = false;
    if (r->resetting)
        log_info("cache %s: rebuilt after the upstream's reset (%s)", r->label, r->reset_why);
    r->resetting = false;
    refl_recovered(r);
    refl_heard(r);
    refl_set_in(r, OUT_DAMAGED); /* rebuilt */
    refl_ingest_notify_commit(r->ing);
    refl_watch_start(r);
}

static const struct up_xfer_cbs list_cbs = {
    .on_headers = refl_on_xfer_headers, .on_data = refl_on_body_data, .on_done = on_list_done};

void
refl_list_start(struct refl *r, bool diff)
{
    r->state = R_LIST;
    if (!r->cont) {
        r->ctr.lists++;
        r->ctr.relists += r->synced || diff;
        r->diff = diff;
        refl_diff_reset(r);
        r->listed = r->listed_bytes = 0;
        r->list_t0_ms = refl_now_ms(r);
        r->last_progress_ms = r->list_t0_ms;
    }
    char *target;
    if (r->cont) {
        char *esc = xmalloc(strlen(r->cont) * 3 + 1), *o = esc;
        for (const char *c = r->cont; *c; c++) {
            if ((*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') ||
                *c == '-' || *c == '_' || *c == '.' || *c == '~')
                *o++ = *c;
            else
                o += sprintf(o, "%%%02X", (unsigned char)*c);
        }
        *o = '\0';
        target = xasprintf("%s?limit=%d&continue=%s", r->d.path, LIST_PAGE, esc);
        free(esc);
    } else {
        target = xasprintf("%s?limit=%d", r->d.path, LIST_PAGE);
    }
    refl_xfer_start(r, target, &list_cbs, false);
    free(target);
}
