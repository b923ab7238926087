/*
 * disco.c — the upstream's discovery, kept current (see disco.h): the
 * fetching and the model's rounds. The copy of discovery answers (its
 * records and their reads) is discocopy.c's, disco_int.h between the two;
 * the documents are read by discodoc.c (pure).
 *
 * Everything kwc asks is a record of the copy (path, Accept): the model's
 * own documents are pinned records (never evicted), so a client whose
 * Accept is the one kwc uses is answered from them too.
 *
 * A round reads the model again, every interval (and soon after
 * disco_refresh_soon, at most once per min_gap):
 *   INDEX  GET /api and /apis with AGG_ACCEPT (If-None-Match when the
 *          last answer had an ETag). Both aggregated: the model is in
 *          them. A plain answer (APIVersions, APIGroupList: an older
 *          kube, apisim) names group versions whose APIResourceLists
 *          are then read:
 *   GVS    GET /api/V and /apis/G/V (Accept: application/json), each time
 *          (they carry no ETag);
 *   APISVC GET the APIService list when the model's documents changed,
 *          at the first round and every APISVC_EVERY rounds: which group
 *          versions an extension server serves (aggregated);
 *   then the model is built; if it differs from the published one it
 *   replaces it, the subscribers are told, and every other record is
 *   fetched again before it is served. Records used since their last
 *   fetch are fetched again each round; idle ones are dropped.
 * A round that fails (no answer, an answer that is not a discovery
 * document) keeps the published model; before the first success it is
 * retried sooner (BACKOFF_MIN_MS doubling, up to the interval).
 *
 * At most PARALLEL GETs are in flight (its own pool: UP_POOL_DISCOVERY);
 * the round's go first. Nothing is freed or started inside curl's
 * callbacks: a transfer's end is handled from a zero-delay event (kick).
 *
 * Threads (disco.h says which calls are any-thread). The loop that made it
 * (the main loop) alone fetches and changes the model and the copy. The
 * serving loops read: the published model under a read lock (model_lk:
 * held for one lookup; the main loop takes it to swap in a new model and
 * frees the old one after), the copy's records under copy_mu (held for a
 * walk of at most DISCO_COPY_MAX_DOCS records; the main loop takes it for
 * every change a reader looks at: the list, a record's doc, current and
 * pin), docs by their atomic reference counts. What a reader would change
 * it posts (a new record, a refresh) or marks with an atomic (in_use,
 * idle, touched: the main loop moves touched records to the front before
 * it evicts, so the least recently used still go first).
 */
#include "kwc/disco.h"

#include <assert.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "kwc/base.h"
#include "kwc/discodoc.h"
#include "kwc/log.h"
#include "kwc/mailbox.h"
#include "kwc/upstream.h"

#include "disco_int.h"

/* The headers a record keeps: those that describe the body (kube sets
 * them), not those of one exchange (Audit-Id, Date, APF's). */
static const char *const kept_headers[KEPT_HEADERS] = {"Content-Type",  "Etag",    "Vary",
                                                       "Cache-Control", "Expires", "Last-Modified"};

bool
disco_on_loop(const struct disco *d)
{
    return pthread_equal(pthread_self(), d->owner);
}

static uint64_t
now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void
arm(struct event *ev, uint64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    evtimer_add(ev, &tv);
}

/* The fetch's answer as a doc (body moved out of the fetch). */
static struct doc *
doc_of(struct fetch *f)
{
    struct doc *doc = xcalloc(1, sizeof(*doc));
    size_t n = evbuffer_get_length(f->body);
    doc->body = xmalloc(n + 1);
    evbuffer_remove(f->body, doc->body, n);
    doc->body[n] = '\0';
    doc->h = xcalloc(f->nh ? f->nh : 1, sizeof(*doc->h));
    doc->strs = xcalloc(2 * f->nh + 1, sizeof(*doc->strs));
    for (size_t i = 0; i < f->nh; i++) {
        doc->strs[doc->nstrs++] = f->h[i].name;
        doc->strs[doc->nstrs++] = f->h[i].value;
        doc->h[i] = (struct disco_hdr){f->h[i].name, f->h[i].value};
        if (strcasecmp(f->h[i].name, "Content-Type") == 0)
            doc->pub.content_type = f->h[i].value;
        else if (strcasecmp(f->h[i].name, "Etag") == 0)
            doc->pub.etag = f->h[i].value;
        f->h[i].name = f->h[i].value = NULL;
    }
    f->nh = 0;
    doc->pub.body = doc->body;
    doc->pub.len = n;
    doc->pub.headers = doc->h;
    doc->pub.nheaders = doc->nstrs / 2;
    doc->refs = 1;
    return doc;
}

void
disco_queue_remove(struct disco *d, struct drec *r)
{
    struct drec **pp = &d->qhead, *prev = NULL;
    while (*pp && *pp != r) {
        prev = *pp;
        pp = &(*pp)->qnext;
    }
    if (!*pp)
        return;
    *pp = r->qnext;
    if (d->qtail == r)
        d->qtail = prev;
    r->qnext = NULL;
    r->queued = false;
}

/* ---- fetching ---- */

void
disco_enqueue(struct disco *d, struct drec *r, bool first)
{
    if (r->queued || r->f)
        return;
    r->queued = true;
    if (first) {
        r->qnext = d->qhead;
        d->qhead = r;
        if (!d->qtail)
            d->qtail = r;
    } else {
        r->qnext = NULL;
        if (d->qtail)
            d->qtail->qnext = r;
        else
            d->qhead = r;
        d->qtail = r;
    }
}

static int
on_fetch_headers(void *arg, int status, const struct up_header *h, size_t n)
{
    struct fetch *f = arg;
    f->status = status;
    for (size_t i = 0; i < n; i++) {
        if (strcasecmp(h[i].name, "Content-Encoding") == 0 && strcasecmp(h[i].value, "identity"))
            f->encoded = true;
        for (size_t k = 0; k < KWC_ARRAY_LEN(kept_headers); k++)
            if (strcasecmp(h[i].name, kept_headers[k]) == 0 && f->nh < KWC_ARRAY_LEN(f->h) &&
                strlen(h[i].value) < 4096) {
                f->h[f->nh].name = xstrdup(h[i].name);
                f->h[f->nh].value = xstrdup(h[i].value);
                f->nh++;
                break;
            }
    }
    return 0;
}

static int
on_fetch_data(void *arg, const char *p, size_t n)
{
    struct fetch *f = arg;
    if (f->too_big || evbuffer_get_length(f->body) + n > DISCO_DOC_MAX_BYTES) {
        f->too_big = true;
        return 0; /* dropped; the end says so */
    }
    evbuffer_add(f->body, p, n);
    return 0;
}

static void
on_fetch_done(void *arg, int err, const char *msg)
{
    struct fetch *f = arg;
    f->x = NULL;
    f->done = true;
    f->err = err;
    snprintf(f->msg, sizeof(f->msg), "%s", msg ? msg : "");
    f->next_done = f->d->done;
    f->d->done = f;
    event_active(f->d->kick, EV_TIMEOUT, 1);
}

static const struct up_xfer_cbs fetch_cbs = {
    .on_headers = on_fetch_headers, .on_data = on_fetch_data, .on_done = on_fetch_done};

static void
fetch_free(struct fetch *f)
{
    for (size_t i = 0; i < f->nh; i++) {
        free(f->h[i].name);
        free(f->h[i].value);
    }
    evbuffer_free(f->body);
    free(f);
}

static void fetch_ended(struct disco *d, struct drec *r, struct fetch *f);

static void
fetch_start(struct disco *d, struct drec *r)
{
    struct up_header hs[2];
    size_t nh = 0;
    if (r->accept[0])
        hs[nh++] = (struct up_header){"Accept", r->accept};
    if (r->doc && r->doc->pub.etag)
        hs[nh++] = (struct up_header){"If-None-Match", r->doc->pub.etag};
    struct up_request req = {.method = "GET",
                             .target = r->path,
                             .headers = hs,
                             .nheaders = nh,
                             .pool = UP_POOL_DISCOVERY};
    struct fetch *f = xcalloc(1, sizeof(*f));
    f->d = d;
    f->rec = r;
    f->body = evbuffer_new();
    r->f = f;
    d->inflight++;
    d->st.fetches++;
    if (up_xfer_start(d->up, &req, &fetch_cbs, f, &f->x) != 0) {
        f->x = NULL;
        f->done = true;
        f->err = -1;
        snprintf(f->msg, sizeof(f->msg), "the request could not start");
        f->next_done = d->done;
        d->done = f;
        event_active(d->kick, EV_TIMEOUT, 1);
    }
}

void
disco_pump(struct disco *d)
{
    while (d->inflight < PARALLEL && d->qhead) {
        struct drec *r = d->qhead;
        d->qhead = r->qnext;
        if (!d->qhead)
            d->qtail = NULL;
        r->qnext = NULL;
        r->queued = false;
        fetch_start(d, r);
    }
}

/* ---- the model ---- */

static bool
is_model_doc(const struct drec *r)
{
    return r->pin == PIN_MODEL;
}

static char *
gv_path(const char *group, const char *version)
{
    return group[0] ? xasprintf("/apis/%s/%s", group, version) : xasprintf("/api/%s", version);
}

static void round_next(struct disco *d);

/* A fetch ended: the record takes what it brought. */
static void
fetch_ended(struct disco *d, struct drec *r, struct fetch *f)
{
    bool answered = !f->err && f->status > 0;
    bool ok = answered && !f->too_big && !f->encoded &&
              (f->status == 200 || (f->status == 304 && r->doc));
    r->f = NULL;
    r->in_use = false;
    if (!ok) {
        d->st.fetch_failures++;
        r->failed = true;
        /* the upstream answered something else now: what it said before
         * is no longer its answer; no answer at all (it is away): the
         * last one stays */
        if (answered && !f->too_big)
            copy_rec_set_doc(d, r, NULL, false);
        if (f->err)
            snprintf(r->why, sizeof(r->why), "%s", f->msg);
        else if (f->too_big)
            snprintf(r->why, sizeof(r->why), "over %zu bytes", DISCO_DOC_MAX_BYTES);
        else if (f->encoded)
            snprintf(r->why, sizeof(r->why), "a Content-Encoding kwc did not ask for");
        else
            snprintf(r->why, sizeof(r->why), "answered %d", f->status);
        log_debug("discovery: GET %s (Accept \"%s\"): %s", r->path, r->accept, r->why);
        return;
    }
    r->failed = false;
    if (f->status == 304) {
        d->st.not_modified++;
        copy_rec_set_current(d, r, true);
        return;
    }
    struct doc *doc = doc_of(f);
    if (r->doc && copy_doc_same(r->doc, doc)) {
        copy_doc_free(doc);
        copy_rec_set_current(d, r, true);
        return;
    }
    bool was_current = r->current && r->doc;
    copy_rec_set_doc(d, r, doc, true);
    r->changed = true;
    copy_evict(d, r);
    /* a client's record changed before the model saw it: read the model */
    if (was_current && r->pin == PIN_NONE)
        disco_refresh_soon(d);
}

static void
on_kick(evutil_socket_t fd, short what, void *arg)
{
    struct disco *d = arg;
    while (d->done) {
        struct fetch *f = d->done;
        d->done = f->next_done;
        d->inflight--;
        struct drec *r = f->rec;
        if (r) {
            bool round = r->round;
            r->round = false;
            fetch_ended(d, r, f);
            if (round) {
                assert(d->pending > 0);
                d->pending--;
            }
        }
        fetch_free(f);
    }
    if (d->step != RS_IDLE && d->pending == 0)
        round_next(d);
    disco_pump(d);
}

static void
round_fetch(struct disco *d, struct drec *r)
{
    if (r->round)
        return;
    if (r->f) {
        /* already on its way (a client's miss): the round waits for it */
        r->round = true;
        d->pending++;
        return;
    }
    r->round = true;
    r->changed = false;
    d->pending++;
    disco_enqueue(d, r, true);
}

static void
round_start(struct disco *d)
{
    d->step = RS_INDEX;
    d->round_changed = false;
    d->round_started_ms = now_ms();
    struct drec *api = copy_rec_get(d, "/api", AGG_ACCEPT, PIN_MODEL);
    struct drec *apis = copy_rec_get(d, "/apis", AGG_ACCEPT, PIN_MODEL);
    api->changed = apis->changed = false;
    round_fetch(d, apis);
    round_fetch(d, api);
    disco_pump(d);
}

static void
on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct disco *d = arg;
    if (d->step != RS_IDLE) {
        d->again = true;
        return;
    }
    round_start(d);
}

/* Add a model record's document to m: its kind, or DDOC_INVALID. */
static enum ddoc_kind
add_doc(struct ddoc_model *m, const struct drec *r, char *err, size_t errlen)
{
    if (!r || !r->doc || !r->current || r->failed) {
        snprintf(err, errlen, "GET %s failed (%s)", r ? r->path : "?",
                 r && r->failed ? r->why : "no answer");
        return DDOC_INVALID;
    }
    enum ddoc_kind k = ddoc_add(m, r->doc->body, r->doc->pub.len, err, errlen);
    if (k == DDOC_INVALID) {
        char why[256];
        snprintf(why, sizeof(why), "%s", err);
        snprintf(err, errlen, "GET %s: %s", r->path, why);
    }
    return k;
}

/* The group versions the index documents name whose APIResourceLists are
 * needed (plain discovery), fetched in this round; false: an index
 * document is missing or not discovery. */
static bool
fetch_gvs(struct disco *d, char *err, size_t errlen)
{
    const char *idx[] = {"/api", "/apis"};
    /* the legacy records of the last round no longer pinned unless named again */
    for (struct drec *r = d->head; r; r = r->next)
        if (r->pin == PIN_MODEL && strcmp(r->accept, LEGACY_ACCEPT) == 0)
            copy_rec_set_pin(d, r, PIN_NONE);
    for (size_t i = 0; i < 2; i++) {
        struct ddoc_model m;
        ddoc_model_init(&m);
        enum ddoc_kind k = add_doc(&m, copy_rec_find(d, idx[i], AGG_ACCEPT), err, errlen);
        if (k == DDOC_INVALID) {
            ddoc_model_fini(&m);
            return false;
        }
        if (k == DDOC_VERSIONS || k == DDOC_GROUPS) {
            for (size_t g = 0; g < m.ngvs; g++) {
                char *path = gv_path(m.gvs[g].group, m.gvs[g].version);
                round_fetch(d, copy_rec_get(d, path, LEGACY_ACCEPT, PIN_MODEL));
                free(path);
            }
        } else if (k != DDOC_AGGREGATED) {
            snprintf(err, errlen, "GET %s: not a discovery index", idx[i]);
            ddoc_model_fini(&m);
            return false;
        }
        ddoc_model_fini(&m);
    }
    return true;
}

/* The model from the round's documents, in discovery's order. */
static bool
build(struct disco *d, struct ddoc_model *m, char *err, size_t errlen)
{
    const char *idx[] = {"/api", "/apis"};
    bool aggregated = true;
    for (size_t i = 0; i < 2; i++) {
        struct ddoc_model gvs;
        ddoc_model_init(&gvs);
        enum ddoc_kind k = add_doc(&gvs, copy_rec_find(d, idx[i], AGG_ACCEPT), err, errlen);
        if (k == DDOC_AGGREGATED) {
            ddoc_model_fini(&gvs);
            if (add_doc(m, copy_rec_find(d, idx[i], AGG_ACCEPT), err, errlen) != DDOC_AGGREGATED)
                return false;
            continue;
        }
        aggregated = false;
        for (size_t g = 0; g < gvs.ngvs; g++) {
            char *path = gv_path(gvs.gvs[g].group, gvs.gvs[g].version);
            enum ddoc_kind rk = add_doc(m, copy_rec_find(d, path, LEGACY_ACCEPT), err, errlen);
            free(path);
            if (rk != DDOC_RESOURCES) {
                if (rk != DDOC_INVALID)
                    snprintf(err, errlen, "GET /apis/%s/%s: not an APIResourceList",
                             gvs.gvs[g].group, gvs.gvs[g].version);
                ddoc_model_fini(&gvs);
                return false;
            }
        }
        ddoc_model_fini(&gvs);
    }
    d->aggregated_discovery = aggregated;
    return true;
}

static bool
gvs_same(const struct ddoc_model *a, const struct ddoc_model *b)
{
    if (a->ngvs != b->ngvs)
        return false;
    for (size_t i = 0; i < a->ngvs; i++)
        if (strcmp(a->gvs[i].group, b->gvs[i].group) != 0 ||
            strcmp(a->gvs[i].version, b->gvs[i].version) != 0)
            return false;
    return true;
}

static void
round_end(struct disco *d, bool ok, const char *why)
{
    uint64_t now = now_ms();
    d->step = RS_IDLE;
    uint64_t next = d->interval_ms;
    if (ok) {
        d->rounds++;
        d->st.refreshes++;
        d->last_ok_ms = now;
        d->backoff_ms = 0;
        if (d->failing)
            log_info("discovery: read again from the upstream");
        d->failing = false;
    } else {
        d->st.refresh_failures++;
        if (!d->failing)
            log_warnx("discovery: %s; %s", why,
                      d->ready ? "the last discovery read stays in use"
                               : "discovery requests pass through until it is read");
        d->failing = true;
        if (!d->ready) {
            d->backoff_ms = d->backoff_ms ? d->backoff_ms * 2 : BACKOFF_MIN_MS;
            if (d->backoff_ms < next)
                next = d->backoff_ms;
        }
    }
    /* the copy: records in use are asked again, idle ones go */
    for (struct drec *r = d->head, *nx; r; r = nx) {
        nx = r->next;
        if (r->pin != PIN_NONE || r->f || r->queued)
            continue;
        if (r->in_use || (r->current && r->idle < IDLE_ROUNDS)) {
            if (r->in_use) {
                r->idle = 0;
                disco_enqueue(d, r, false);
            } else {
                r->idle++;
            }
            continue;
        }
        copy_rec_free(d, r);
    }
    if (d->again) {
        d->again = false;
        uint64_t since = now - d->round_started_ms;
        next = since >= d->min_gap_ms ? 0 : d->min_gap_ms - since;
    }
    arm(d->timer, next);
    disco_pump(d);
}

/* The model built: published if it differs, then the copy follows. */
static void
publish(struct disco *d, struct ddoc_model *m)
{
    ddoc_mark_aggregated(m, &d->agg);
    ddoc_freeze(m);
    bool first = !d->ready;
    if (!first && ddoc_same(&d->model, m) && gvs_same(&d->model, m)) {
        ddoc_model_fini(m);
        return;
    }
    size_t before = d->model.nres;
    struct ddoc_model old = d->model;
    pthread_rwlock_wrlock(&d->model_lk);
    d->model = *m;
    d->ready = true;
    atomic_store(&d->ready_pub, true);
    pthread_rwlock_unlock(&d->model_lk);
    ddoc_model_fini(&old); /* no reader holds it: they hold the lock while they read */
    *m = (struct ddoc_model){0};
    d->st.resources = d->model.nres;
    if (first) {
        log_info("discovery: %zu resources in %zu group versions (%s discovery), %zu served by "
                 "an extension server (APIService)",
                 d->model.nres, d->model.ngvs, d->aggregated_discovery ? "aggregated" : "plain",
                 d->agg.ngvs);
    } else {
        d->st.changes++;
        log_info("discovery changed: %zu resources (were %zu) in %zu group versions, %zu served "
                 "by an extension server (APIService)",
                 d->model.nres, before, d->model.ngvs, d->agg.ngvs);
        /* every other record waits for its fetch before it is served */
        for (struct drec *r = d->head; r; r = r->next)
            if (r->pin == PIN_NONE && r->doc) {
                copy_rec_set_current(d, r, false);
                disco_enqueue(d, r, false);
            }
    }
    for (size_t i = 0; i < d->nsubs; i++)
        d->subs[i].on_change(d->subs[i].arg);
}

static void
round_next(struct disco *d)
{
    char err[512];
    switch (d->step) {
    case RS_IDLE:
        return;
    case RS_INDEX:
        d->step = RS_GVS;
        if (!fetch_gvs(d, err, sizeof(err))) {
            round_end(d, false, err);
            return;
        }
        /* aggregated: no APIResourceList to wait for */
        if (d->pending > 0)
            return;
        /* fall through */
    case RS_GVS: {
        bool changed = !d->ready;
        for (struct drec *r = d->head; r; r = r->next)
            changed |= is_model_doc(r) && r->changed;
        bool has_apisvc;
        if (changed) {
            /* the documents as they are now (the published model is older) */
            struct ddoc_model probe;
            ddoc_model_init(&probe);
            if (!build(d, &probe, err, sizeof(err))) {
                ddoc_model_fini(&probe);
                round_end(d, false, err);
                return;
            }
            has_apisvc = ddoc_has_gv(&probe, "apiregistration.k8s.io", "v1");
            ddoc_model_fini(&probe);
        } else {
            has_apisvc = ddoc_has_gv(&d->model, "apiregistration.k8s.io", "v1");
        }
        d->round_changed = changed;
        d->step = RS_APISVC;
        if (has_apisvc && (d->round_changed || !d->agg_known || d->rounds % APISVC_EVERY == 0)) {
            round_fetch(d, copy_rec_get(d, APISVC_PATH, LEGACY_ACCEPT, PIN_INTERNAL));
            return;
        }
        if (!has_apisvc) {
            ddoc_model_fini(&d->agg);
            d->agg_known = true;
        }
    }
        /* fall through */
    case RS_APISVC: {
        struct drec *as = copy_rec_find(d, APISVC_PATH, LEGACY_ACCEPT);
        if (as && as->changed) {
            as->changed = false;
            struct ddoc_model agg;
            ddoc_model_init(&agg);
            if (as->doc &&
                ddoc_apiservices(&agg, as->doc->body, as->doc->pub.len, err, sizeof(err)) >= 0) {
                ddoc_model_fini(&d->agg);
                d->agg = agg;
                d->agg_known = true;
                d->round_changed = true;
            } else {
                ddoc_model_fini(&agg);
            }
        }
        if (as && as->failed && !d->agg_known && !d->agg_warned) {
            d->agg_warned = true;
            log_warnx("discovery: kwc cannot read the APIService list (%s): aggregated APIs "
                      "cannot be told apart (give kwc list on apiservices.apiregistration.k8s.io)",
                      APISVC_PATH);
        }
        if (d->round_changed) {
            struct ddoc_model m;
            ddoc_model_init(&m);
            if (!build(d, &m, err, sizeof(err))) {
                ddoc_model_fini(&m);
                round_end(d, false, err);
                return;
            }
            publish(d, &m);
        }
        round_end(d, true, NULL);
        return;
    }
    }
}

/* ---- the interface ---- */

int
disco_new(struct event_base *base, struct up_client *up, const struct disco_options *o,
          struct disco **out)
{
    struct disco *d = xcalloc(1, sizeof(*d));
    d->magic = DISCO_MAGIC;
    d->base = base;
    d->up = up;
    d->interval_ms = o && o->interval_ms ? o->interval_ms : DISCO_INTERVAL_MS;
    d->min_gap_ms = o && o->min_gap_ms ? o->min_gap_ms : DISCO_MIN_GAP_MS;
    d->timer = evtimer_new(base, on_timer, d);
    d->kick = event_new(base, -1, 0, on_kick, d);
    d->owner = pthread_self();
    d->mb = mailbox_new(base);
    pthread_rwlock_init(&d->model_lk, NULL);
    pthread_mutex_init(&d->copy_mu, NULL);
    ddoc_model_init(&d->model);
    ddoc_model_init(&d->agg);
    *out = d;
    return 0;
}

void
disco_start(struct disco *d)
{
    assert(d->magic == DISCO_MAGIC);
    arm(d->timer, 0);
}

void
disco_free(struct disco *d)
{
    if (!d)
        return;
    assert(d->magic == DISCO_MAGIC);
    d->closing = true;
    mailbox_free(d->mb); /* what a serving loop posted last does nothing */
    for (struct drec *r = d->head; r; r = r->next)
        if (r->f && r->f->x) {
            up_xfer_cancel(r->f->x);
            r->f->x = NULL;
            fetch_free(r->f);
            r->f = NULL;
        }
    while (d->done) {
        struct fetch *f = d->done;
        d->done = f->next_done;
        if (f->rec)
            f->rec->f = NULL;
        fetch_free(f);
    }
    while (d->head)
        copy_rec_free(d, d->head);
    event_free(d->timer);
    event_free(d->kick);
    ddoc_model_fini(&d->model);
    ddoc_model_fini(&d->agg);
    free(d->subs);
    pthread_rwlock_destroy(&d->model_lk);
    pthread_mutex_destroy(&d->copy_mu);
    d->magic = 0;
    free(d);
}

enum disco_found
disco_find(const struct disco *d, const char *group, const char *version, const char *resource,
           struct disco_res *out)
{
    if (disco_on_loop(d)) {
        if (!d->ready)
            return DISCO_UNKNOWN;
        const struct disco_res *r = ddoc_find(&d->model, group, version, resource);
        if (!r)
            return DISCO_ABSENT;
        if (out)
            *out = *r;
        return DISCO_PRESENT;
    }
    /* a serving loop: the model may be replaced once the lock is let go,
     * so its strings are not handed out */
    struct disco *w = (struct disco *)(uintptr_t)d; /* the lock, not the model */
    enum disco_found f = DISCO_UNKNOWN;
    pthread_rwlock_rdlock(&w->model_lk);
    if (d->ready) {
        const struct disco_res *r = ddoc_find(&d->model, group, version, resource);
        f = r ? DISCO_PRESENT : DISCO_ABSENT;
        if (r && out)
            *out = (struct disco_res){.namespaced = r->namespaced,
                                      .list = r->list,
                                      .watch = r->watch,
                                      .aggregated = r->aggregated};
    }
    pthread_rwlock_unlock(&w->model_lk);
    return f;
}

void
disco_each(const struct disco *d, void (*cb)(void *arg, const struct disco_res *r), void *arg)
{
    for (size_t i = 0; d->ready && i < d->model.nres; i++)
        cb(arg, &d->model.res[i]);
}

void
disco_subscribe(struct disco *d, void (*on_change)(void *arg), void *arg)
{
    d->subs = xrealloc(d->subs, (d->nsubs + 1) * sizeof(*d->subs));
    d->subs[d->nsubs++] = (struct sub){on_change, arg};
}

void
disco_unsubscribe(struct disco *d, void *arg)
{
    size_t n = 0;
    for (size_t i = 0; i < d->nsubs; i++)
        if (d->subs[i].arg != arg)
            d->subs[n++] = d->subs[i];
    d->nsubs = n;
}

static void
run_refresh(void *arg)
{
    struct disco *d = arg;
    atomic_store(&d->refresh_posted, false);
    if (!d->closing)
        disco_refresh_soon(d);
}

void
disco_refresh_soon(struct disco *d)
{
    assert(d->magic == DISCO_MAGIC);
    if (!disco_on_loop(d)) {
        /* a serving loop: the timer is the loop's; one post at a time */
        if (!atomic_exchange(&d->refresh_posted, true))
            mailbox_post(d->mb, run_refresh, d);
        return;
    }
    if (d->step != RS_IDLE) {
        d->again = true;
        return;
    }
    uint64_t since = now_ms() - d->round_started_ms;
    uint64_t wait = d->rounds == 0 || since >= d->min_gap_ms ? 0 : d->min_gap_ms - since;
    struct timeval left;
    /* never later than already planned */
    if (evtimer_pending(d->timer, &left)) {
        struct timeval now;
        event_base_gettimeofday_cached(d->base, &now);
        int64_t in_ms = ((int64_t)left.tv_sec - now.tv_sec) * 1000 +
                        ((int64_t)left.tv_usec - now.tv_usec) / 1000;
        if (in_ms >= 0 && (uint64_t)in_ms <= wait)
            return;
    }
    arm(d->timer, wait);
}

bool
disco_ready(const struct disco *d)
{
    return atomic_load(&d->ready_pub);
}

void
disco_stats(const struct disco *d, struct disco_stats *out)
{
    *out = d->st;
    out->ready = d->ready;
    out->aggregated = d->aggregated_discovery;
    out->docs = d->ndocs;
    out->doc_bytes = d->bytes;
    out->resources = d->model.nres;
    out->extension_gvs = d->agg.ngvs;
    out->last_refresh_age_s = d->last_ok_ms ? (double)(now_ms() - d->last_ok_ms) / 1000.0 : -1.0;
}
