/*
 * reflector.c — upstream LIST+WATCH into the store (see reflector.h).
 *
 * State machine per resource:
 *   DISCOVER -> (warm and same upstream ? WATCH : LIST) ; LIST pages -> WATCH ;
 *   WATCH end -> WATCH (immediately if clean, else after backoff) ;
 *   410 -> LIST in diff mode ; other failures -> backoff, same state again.
 * Retries back off from 0.5 s, doubling, with ±50 % jitter, never past 30 s;
 * the delay starts over once a watch has stayed open for 10 s (or a list
 * completes), so one outage does not slow every later reconnect.
 *
 * Service: a synced cache answers requests unless it is out of service:
 *   write   a commit failed (disk full, I/O error, map full): the events are
 *           dropped and the watch resumes from the store's rv after a
 *           backoff, or at once when free space on the data dir grows; the
 *           first commit of its events that succeeds brings the cache back.
 *   damaged a stored value failed its checksum (store_res_damaged): the cache
 *           starts over from a fresh list and is back when it completes.
 *   stale   --max-staleness passed without an upstream event or bookmark;
 *           back at the next one.
 * Nothing is freed inside curl's callbacks: an xfer ends in on_done, and the
 * next step starts from a zero-delay timer.
 *
 * Objects are stored in their list-item form. For built-in kinds the watch
 * sends `{"kind":"Pod","apiVersion":"v1",...}` while lists send
 * `{"metadata":...}` (kube omits TypeMeta on list items), so the watch's
 * TypeMeta prefix is cut before storing; serving a watch event puts it back.
 *
 * Encodings: a reflector fills one cache in one encoding (DESIGN.md
 * "Encodings"). A protobuf cache (built-in kinds only) asks for
 * application/vnd.kubernetes.protobuf on LIST and WATCH (discovery stays
 * JSON) and stores each object message as the upstream sent it (a list item,
 * or an event's Unknown.raw: the same bytes); everything else — the state
 * machine, relists, service, warm starts — is the one path both share. An
 * upstream that answers such a request in another type (or 406) does not
 * serve the resource in protobuf: the cache says so (refl_last_error), asks
 * again only after PB_REFUSED_RETRY_MS, and its requests pass through.
 * Protobuf caches outside --protobuf-resources start on their first request
 * (refl_want).
 */
#include "kwc/reflector.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>

#include "kwc/base.h"
#include "kwc/index.h"
#include "kwc/kinds.h"
#include "kwc/log.h"
#include "kwc/pb.h"
#include "kwc/store.h"
#include "kwc/upstream.h"

#define REFL_MAGIC 0x7265666cu /* "refl" */
#define LIST_PAGE 500
#define PAGE_MAX_BYTES ((size_t)1 << 30)     /* one LIST page held in memory */
#define DISCOVERY_MAX_BYTES ((size_t)16 << 20)
#define PENDING_MAX_BYTES ((size_t)64 << 20) /* commit at once past this */
#define BACKOFF_MIN_MS 500
#define BACKOFF_MAX_MS 30000   /* the cap on any retry delay, jitter included */
#define HEALTHY_S 10.0         /* a watch open this long resets the backoff */
#define TICK_MS 250            /* damage and staleness checks; write probes */
/* An upstream without protobuf for a resource is asked again this late: it
 * may be upgraded, but not every few seconds. */
#define PB_REFUSED_RETRY_MS (10 * 60 * 1000)

enum refl_state { R_IDLE, R_DISCOVER, R_LIST, R_WATCH };

struct pend {
    struct refl *r;
    bool bookmark;
    enum store_ev_type type;
    uint64_t rv, obj_rv;
    char *key, *obj, *idx;
    size_t key_len, obj_len, idx_len;
};

struct refl_ingest {
    struct event_base *base;
    struct store *st;
    char *data_dir;
    uint64_t map_size;
    unsigned max_staleness;
    struct event *commit_ev;
    struct pend *p;
    size_t n, cap, bytes;
    void (*on_commit)(void *arg);
    void *on_commit_arg;
    void (*on_service)(void *arg, const struct refl *r, bool serving);
    void *on_service_arg;
    void (*on_unknown)(void *arg, const struct refl *r, const char *why);
    void *on_unknown_arg;
};

enum refl_out { OUT_NONE, OUT_STALE, OUT_WRITE, OUT_DAMAGED }; /* stronger later */

struct refl {
    uint32_t magic;
    struct event_base *base;
    struct up_client *up;
    struct refl_ingest *ing;
    struct refl_desc d;
    char *label;             /* "pods", "pods (protobuf)": logs */
    const struct pb_field *pbf; /* protobuf: the fields read (d.fields mirrors them) */
    struct obj_field *own_fields;
    bool started;            /* refl_start ran (protobuf caches may wait for a request) */
    bool wanted;             /* started by a request (refl_want), not at kwc's start */
    bool discovered;         /* discovery has answered once (found or not) */
    bool discovery_failed;   /* an attempt failed before any answer (upstream away) */
    bool ever_synced;        /* synced at least once since kwc started */
    bool refused;            /* protobuf: the upstream does not serve it so (last_err) */
    bool wrong_type;         /* this transfer's 200 came in another Content-Type */
    char got_type[96];       /* ...which one, for the message */
    char *identity;
    char *typemeta;          /* `{"kind":K,"apiVersion":V,` as the watch writes it */
    size_t typemeta_len;
    enum refl_state state;
    struct up_xfer *x;
    int status;
    struct evbuffer *body;   /* discovery / LIST page */
    bool too_big;
    struct event *timer;     /* next step */
    int backoff_ms;
    /* LIST */
    bool diff;               /* relist after 410: record differences as events */
    char *cont;
    uint64_t list_rv;
    char **seen;             /* diff: keys in the new list */
    size_t nseen, capseen;
    struct pend *dpend;      /* diff: events to record */
    size_t ndiff, capdiff;
    uint64_t listed, listed_bytes;
    struct timespec list_t0, last_progress;
    /* WATCH */
    struct wframe_splitter wf; /* JSON */
    struct pb_splitter pf;     /* protobuf */
    uint64_t rv;             /* last rv seen (events, bookmarks, list) */
    bool got_410;
    struct timespec watch_t0;
    bool synced;
    uint64_t events_in;
    /* service */
    enum refl_out out;
    char out_why[512];
    struct timespec last_heard; /* the last upstream event or bookmark, or list end */
    uint64_t free_at_fail;      /* free bytes on the data dir when a write failed */
    char last_err[512];         /* why the last attempt failed, for /readyz */
    struct event *tick;
    struct refl_counters ctr;   /* for /metrics (refl_counters) */
};

static void step(struct refl *r, int delay_ms);
static void backoff(struct refl *r, const char *why);
static uint64_t free_bytes(const struct refl_ingest *ing);
static void set_out(struct refl *r, enum refl_out out, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_in(struct refl *r, enum refl_out out);
static void start_list(struct refl *r, bool diff);
static void start_watch(struct refl *r);

static double
secs_since(const struct timespec *t0)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t0->tv_sec) + (double)(now.tv_nsec - t0->tv_nsec) / 1e9;
}

static char *
memdup(const void *p, size_t n)
{
    char *d = xmalloc(n ? n : 1);
    if (n)
        memcpy(d, p, n);
    return d;
}

/* ---- the batched writer ---- */

static void
pend_free(struct pend *p)
{
    free(p->key);
    free(p->obj);
    free(p->idx);
}

/* What a failed write means, for a person: the cause and what fixes it.
 * LMDB reports a short write as EIO, so a full disk is told apart by the
 * space left on the data dir's filesystem. */
static void
write_cause(const struct refl_ingest *ing, int rc, char *buf, size_t len)
{
    struct statvfs sv;
    bool full = rc == -ENOSPC || rc == -EDQUOT ||
                (rc == -EIO && statvfs(ing->data_dir, &sv) == 0 &&
                 (uint64_t)sv.f_bavail * sv.f_frsize < ((uint64_t)1 << 20));
    if (rc == KWC_EMAPFULL)
        snprintf(buf, len,
                 "the cache reached --cache-map-size (%llu bytes) in %s: raise --cache-map-size, "
                 "or lower --history-max-bytes",
                 (unsigned long long)ing->map_size, ing->data_dir);
    else if (full)
        snprintf(buf, len,
                 "no space left on device in %s: free space there, or move --data-dir to a "
                 "larger volume",
                 ing->data_dir);
    else
        snprintf(buf, len, "writing to %s failed: %s (check the disk and the kernel log)",
                 ing->data_dir, kwc_strerror(rc));
}

/* A commit carrying r's events failed: they are lost, so the cache leaves
 * service and the watch resumes from what the store holds. */
static void
write_failed(struct refl *r, const char *why)
{
    set_out(r, OUT_WRITE, "%s", why);
    r->free_at_fail = free_bytes(r->ing);
    if (r->state == R_WATCH && r->x) {
        up_xfer_cancel(r->x);
        r->x = NULL;
        r->rv = store_res_rv(r->ing->st, r->d.sres, NULL);
        backoff(r, "its events could not be stored");
    }
}

/* A write of r's own (a list page, a relist's events) failed with rc: out
 * of service if it was the disk or the map, not the data. */
static void
store_failed(struct refl *r, int rc)
{
    if (rc == KWC_EMAPFULL || (rc < 0 && rc > -KWC_ERRBASE)) {
        char why[512];
        write_cause(r->ing, rc, why, sizeof(why));
        set_out(r, OUT_WRITE, "%s", why);
        r->free_at_fail = free_bytes(r->ing);
    }
}

static void
ingest_commit(struct refl_ingest *ing)
{
    if (ing->n == 0)
        return;
    struct store_wtxn *w;
    int rc = store_wtxn_begin(ing->st, (uint64_t)time(NULL), &w);
    size_t i = 0;
    for (; rc == 0 && i < ing->n; i++) {
        struct pend *p = &ing->p[i];
        if (p->bookmark) {
            rc = store_wtxn_rv(w, p->r->d.sres, p->rv);
        } else {
            struct store_event ev = {.type = p->type, .rv = p->rv, .key = p->key,
                                     .key_len = p->key_len, .obj = p->obj, .obj_len = p->obj_len,
                                     .idx = p->idx, .idx_len = p->idx_len};
            rc = store_wtxn_event(w, p->r->d.sres, &ev);
        }
    }
    if (rc == 0)
        rc = store_wtxn_commit(w);
    else
        store_wtxn_abort(w);
    if (rc) {
        char why[512];
        write_cause(ing, rc, why, sizeof(why));
        log_error("cache: committing %zu events failed: %s", ing->n, why);
        for (size_t j = 0; j < ing->n; j++)
            write_failed(ing->p[j].r, why);
    } else {
        for (size_t j = 0; j < ing->n; j++)
            if (ing->p[j].r->out == OUT_WRITE)
                set_in(ing->p[j].r, OUT_WRITE);
    }
    for (size_t j = 0; j < ing->n; j++)
        pend_free(&ing->p[j]);
    ing->n = 0;
    ing->bytes = 0;
    if (rc == 0 && ing->on_commit)
        ing->on_commit(ing->on_commit_arg);
}

static void
on_commit(evutil_socket_t fd, short what, void *arg)
{
    ingest_commit(arg);
}

static struct pend *
ingest_push(struct refl_ingest *ing)
{
    if (ing->n == ing->cap) {
        ing->cap = ing->cap ? 2 * ing->cap : 256;
        ing->p = xrealloc(ing->p, ing->cap * sizeof(*ing->p));
    }
    struct pend *p = &ing->p[ing->n++];
    memset(p, 0, sizeof(*p));
    /* One transaction per loop turn: commit after the callbacks of this turn. */
    event_active(ing->commit_ev, EV_TIMEOUT, 1);
    return p;
}

int
refl_ingest_new(struct event_base *base, struct store *st, const struct refl_ingest_options *o,
                struct refl_ingest **out)
{
    struct refl_ingest *ing = xcalloc(1, sizeof(*ing));
    ing->base = base;
    ing->st = st;
    ing->data_dir = xstrdup(o && o->data_dir ? o->data_dir : ".");
    ing->map_size = o ? o->map_size : 0;
    ing->max_staleness = o ? o->max_staleness : 0;
    ing->commit_ev = event_new(base, -1, 0, on_commit, ing);
    *out = ing;
    return 0;
}

void
refl_ingest_on_commit(struct refl_ingest *ing, void (*cb)(void *arg), void *arg)
{
    ing->on_commit = cb;
    ing->on_commit_arg = arg;
}

void
refl_ingest_on_unknown(struct refl_ingest *ing,
                       void (*cb)(void *arg, const struct refl *r, const char *why), void *arg)
{
    ing->on_unknown = cb;
    ing->on_unknown_arg = arg;
}

void
refl_ingest_on_service(struct refl_ingest *ing,
                       void (*cb)(void *arg, const struct refl *r, bool serving), void *arg)
{
    ing->on_service = cb;
    ing->on_service_arg = arg;
}

void
refl_ingest_free(struct refl_ingest *ing)
{
    if (!ing)
        return;
    ingest_commit(ing);
    event_free(ing->commit_ev);
    free(ing->data_dir);
    free(ing->p);
    free(ing);
}

/* ---- decoding one object ---- */

/* Key, rv and index bytes of one object, and its list-item form. */
struct decoded {
    char *key;
    size_t key_len;
    uint64_t rv;
    char *idx;
    size_t idx_len;
    const char *obj;  /* points into the input, or into own */
    size_t obj_len;
    char *own;
};

static void
decoded_fini(struct decoded *d)
{
    free(d->key);
    free(d->idx);
    free(d->own);
}

/* One object in r's encoding: JSON text, or a protobuf object message. */
static int
decode_obj(struct refl *r, const char *json, size_t len, bool from_watch, struct decoded *out,
           char *err, size_t errlen)
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
        decoded_fini(out);
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

static void
push_event(struct refl *r, enum store_ev_type type, struct decoded *d)
{
    struct pend *p = ingest_push(r->ing);
    p->r = r;
    p->type = type;
    p->rv = d->rv;
    p->key = d->key;
    p->key_len = d->key_len;
    d->key = NULL;
    p->idx = d->idx;
    p->idx_len = d->idx_len;
    d->idx = NULL;
    p->obj = memdup(d->obj, d->obj_len);
    p->obj_len = d->obj_len;
    r->ing->bytes += p->obj_len + p->key_len + p->idx_len;
    if (d->rv > r->rv)
        r->rv = d->rv;
}

/* ---- transfers ---- */

/* Is a Content-Type protobuf's ("application/vnd.kubernetes.protobuf",
 * parameters such as ";stream=watch" aside)? */
static bool
is_pb_type(const char *ct)
{
    size_t l = strlen(PB_CONTENT_TYPE);
    if (!ct || strncasecmp(ct, PB_CONTENT_TYPE, l) != 0)
        return false;
    ct += l;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    return *ct == '\0' || *ct == ';';
}

static void set_refused(struct refl *r, bool refused);

static int
on_xfer_headers(void *arg, int status, const struct up_header *h, size_t n)
{
    struct refl *r = arg;
    r->status = status;
    r->wrong_type = false;
    if (r->d.enc != KWC_ENC_PB || r->state == R_DISCOVER || status != 200)
        return 0;
    const char *ct = NULL;
    for (size_t i = 0; i < n && !ct; i++)
        if (strcasecmp(h[i].name, "Content-Type") == 0)
            ct = h[i].value;
    if (is_pb_type(ct)) {
        set_refused(r, false);
        return 0;
    }
    /* JSON (or anything) for a protobuf request: none to be had here */
    r->wrong_type = true;
    snprintf(r->got_type, sizeof(r->got_type), "%s", ct ? ct : "no Content-Type");
    return 1; /* abort: on_done says so */
}

static int
on_body_data(void *arg, const char *p, size_t n)
{
    struct refl *r = arg;
    if (evbuffer_get_length(r->body) + n > (r->state == R_DISCOVER ? DISCOVERY_MAX_BYTES : PAGE_MAX_BYTES)) {
        r->too_big = true;
        return 0; /* dropped; on_done reports it */
    }
    evbuffer_add(r->body, p, n);
    return 0;
}

static void
start_xfer(struct refl *r, const char *target, const struct up_xfer_cbs *cbs, bool long_running)
{
    static const struct up_header json = {"Accept", "application/json"};
    static const struct up_header pb = {"Accept", PB_CONTENT_TYPE};
    bool want_pb = r->d.enc == KWC_ENC_PB && r->state != R_DISCOVER;
    struct up_request req = {.method = "GET",
                             .target = target,
                             .headers = want_pb ? &pb : &json,
                             .nheaders = 1,
                             .long_running = long_running,
                             .pool = UP_POOL_CACHE};
    r->status = 0;
    r->too_big = false;
    evbuffer_drain(r->body, evbuffer_get_length(r->body));
    if (up_xfer_start(r->up, &req, cbs, r, &r->x) != 0) {
        r->x = NULL;
        step(r, r->backoff_ms);
    }
}

static void
backoff(struct refl *r, const char *why)
{
    r->ctr.errors[r->state == R_LIST ? 1 : r->state == R_WATCH ? 2 : 0]++;
    int base = r->backoff_ms ? r->backoff_ms : BACKOFF_MIN_MS;
    int delay = base / 2 + rand() % (base + 1); /* [0.5, 1.5] x base */
    if (delay > BACKOFF_MAX_MS)
        delay = BACKOFF_MAX_MS;
    log_warnx("cache %s: %s; retrying in %.1f s", r->label, why, delay / 1000.0);
    snprintf(r->last_err, sizeof(r->last_err), "%s", why);
    r->backoff_ms = base * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : base * 2;
    step(r, delay);
}

/* Out of service for a cause at least as strong as the current one. */
static void
set_out(struct refl *r, enum refl_out out, const char *fmt, ...)
{
    if (r->out > out)
        return;
    char why[sizeof(r->out_why)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    bool was_serving = r->out == OUT_NONE;
    if (was_serving || strcmp(why, r->out_why) != 0)
        log_error("cache %s: out of service: %s; its requests pass through to the upstream",
                  r->label, why);
    r->out = out;
    memcpy(r->out_why, why, sizeof(why));
    if (was_serving && r->ing->on_service)
        r->ing->on_service(r->ing->on_service_arg, r, false);
}

/* Back in service, if what kept it out was out. */
static void
set_in(struct refl *r, enum refl_out out)
{
    if (r->out != out)
        return;
    r->out = OUT_NONE;
    r->out_why[0] = '\0';
    log_info("cache %s: back in service", r->label);
    if (r->ing->on_service)
        r->ing->on_service(r->ing->on_service_arg, r, true);
}

/* The upstream answered: the cache is not stale (and a stale one is back). */
static void
heard(struct refl *r)
{
    clock_gettime(CLOCK_MONOTONIC, &r->last_heard);
    if (r->out == OUT_STALE)
        set_in(r, OUT_STALE);
}

/* Protobuf: whether the upstream serves the resource so. A cache it stops
 * serving in protobuf leaves service like one out for a write (its watchers
 * end and resume from the upstream), but does not hold /readyz back: kwc
 * cannot fix it, and its requests pass through (refl_counts_ready). The
 * store keeps the answer, so that a restart while the upstream is away does
 * not wait for this cache either. */
static void
set_refused(struct refl *r, bool refused)
{
    if (r->refused == refused)
        return;
    bool was = refl_serving(r);
    r->refused = refused;
    if (refused) {
        /* what it holds is not served again: a fresh list when it is back */
        r->synced = false;
        free(r->cont);
        r->cont = NULL;
        r->diff = false;
        r->state = R_LIST;
    }
    struct store_wtxn *w;
    if (store_wtxn_begin(r->ing->st, (uint64_t)time(NULL), &w) == 0) {
        if (refused) {
            store_wtxn_set_synced(w, r->d.sres, false);
            store_wtxn_set_identity(w, r->d.sres, r->identity);
        }
        store_wtxn_set_unserved(w, r->d.sres, refused);
        if (store_wtxn_commit(w) != 0)
            log_warnx("cache %s: could not record whether the upstream serves it", r->label);
    }
    if (!refused)
        log_info("cache %s: the upstream serves it in protobuf", r->label);
    if (was != refl_serving(r) && r->ing->on_service)
        r->ing->on_service(r->ing->on_service_arg, r, !was);
}

/* A LIST or WATCH asked for protobuf got another type (got) or a 406: stop
 * asking for a long while. */
static void
refuse(struct refl *r, const char *got)
{
    bool news = !r->refused;
    snprintf(r->last_err, sizeof(r->last_err), "the upstream does not serve %s/%s in protobuf (%s)",
             r->d.api_version, r->d.resource, got);
    set_refused(r, true);
    if (news)
        log_warnx("cache %s: %s; its protobuf requests pass through; asking again every %d "
                  "minutes",
                  r->label, r->last_err, PB_REFUSED_RETRY_MS / 60000);
    step(r, PB_REFUSED_RETRY_MS);
}

/* ---- DISCOVER ---- */

/* Kinds are Go identifiers; anything else would need escaping where kwc
 * writes it into list heads and TypeMeta. */
static bool
plain_name(const char *s)
{
    if (!*s || strlen(s) > 100)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9')))
            return false;
    return true;
}

/* An upstream answer other than 200 as the operator needs to read it:
 * credentials and permissions named, everything else with its status. */
static void
status_why(const struct refl *r, const char *what, char *buf, size_t len)
{
    if (r->status == 401)
        snprintf(buf, len,
                 "the upstream rejected kwc's credentials (401) for %s: check the token or "
                 "certificate in KUBECONFIG (in a pod: the service account's token)",
                 what);
    else if (r->status == 403)
        snprintf(buf, len,
                 "kwc's identity may not %s (403): grant it get, list and watch of %s%s%s "
                 "(conf/kubernetes/10-rbac.yaml)",
                 what, r->d.resource, r->d.group[0] ? "." : "", r->d.group);
    else
        snprintf(buf, len, "%s answered %d", what, r->status);
}

/* Discovery's list of a group version's resources, for a person: "a, b, c"
 * (subresources left out), at most len bytes. */
static void
offered(json_t *res, char *buf, size_t len)
{
    size_t i, n = 0;
    json_t *e;
    buf[0] = '\0';
    json_array_foreach(res, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        if (!name || strchr(name, '/'))
            continue;
        int w = snprintf(buf + n, len - n, "%s%s", n ? ", " : "", name);
        if (w < 0 || (size_t)w >= len - n) {
            if (len > 4)
                snprintf(buf + (n < len - 4 ? n : len - 4), 4, "...");
            return;
        }
        n += (size_t)w;
    }
}

/* The resource does not exist upstream: on the first discovery since kwc
 * started, a configuration error (main exits 2); later, a reason for /readyz. */
static void
unknown_resource(struct refl *r, const char *why)
{
    /* only what kwc was started with, and only when the upstream answered at
     * once: an upstream away at start reports it in /readyz once known */
    bool first = !r->discovered && !r->discovery_failed && !r->wanted &&
                 r->d.enc == KWC_ENC_JSON;
    r->discovered = true;
    if (first && r->ing->on_unknown) {
        snprintf(r->last_err, sizeof(r->last_err), "%s", why);
        r->ing->on_unknown(r->ing->on_unknown_arg, r, why);
        return;
    }
    backoff(r, why);
}

static void
on_discovery_done(void *arg, int err, const char *msg)
{
    struct refl *r = arg;
    r->x = NULL;
    char why[512];
    if (r->status == 404 && !err) {
        snprintf(why, sizeof(why), "the upstream serves no API group version %s (404 on its "
                 "discovery)", r->d.api_version);
        unknown_resource(r, why);
        return;
    }
    if (err || r->status != 200 || r->too_big) {
        char st[384];
        status_why(r, "read discovery", st, sizeof(st));
        snprintf(why, sizeof(why), "discovery of %s failed (%s)", r->d.path,
                 err ? msg : r->too_big ? "too large" : st);
        if (!r->discovered)
            r->discovery_failed = true;
        backoff(r, why);
        return;
    }
    size_t len = evbuffer_get_length(r->body);
    json_error_t je;
    json_t *doc = json_loadb((const char *)evbuffer_pullup(r->body, -1), len, 0, &je);
    json_t *res = doc ? json_object_get(doc, "resources") : NULL;
    size_t i;
    json_t *e;
    bool found = false;
    json_array_foreach(res, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *kind = json_string_value(json_object_get(e, "kind"));
        if (name && kind && strcmp(name, r->d.resource) == 0 && plain_name(kind)) {
            r->d.namespaced = json_is_true(json_object_get(e, "namespaced"));
            free(r->d.kind);
            free(r->d.list_kind);
            r->d.kind = xstrdup(kind);
            r->d.list_kind = xasprintf("%sList", kind);
            free(r->typemeta);
            r->typemeta = xasprintf("{\"kind\":\"%s\",\"apiVersion\":\"%s\",", kind, r->d.api_version);
            r->typemeta_len = strlen(r->typemeta);
            found = true;
            break;
        }
    }
    if (!found) {
        char names[256];
        offered(res, names, sizeof(names));
        snprintf(why, sizeof(why), "the upstream has no resource \"%s\" in %s (it serves: %s)",
                 r->d.resource, r->d.api_version, names[0] ? names : "nothing");
        json_decref(doc);
        unknown_resource(r, why);
        return;
    }
    json_decref(doc);
    r->discovered = true;
    /* Warm start: the same upstream's synced cache is served at once and the
     * watch resumes from its rv; anything else starts from a fresh list. */
    struct store_rtxn *t;
    struct store_res_info info = {0};
    if (store_rtxn_begin(r->ing->st, &t) == 0) {
        store_info(t, r->d.sres, &info);
        store_rtxn_end(t);
    }
    if (info.synced && strcmp(info.identity, r->identity) == 0) {
        r->rv = info.rv;
        r->synced = r->ever_synced = true;
        log_info("cache %s: warm start with %llu objects at rv %llu; resuming the watch",
                 r->label, (unsigned long long)info.objects, (unsigned long long)info.rv);
        start_watch(r);
    } else {
        if (info.synced)
            log_warnx("cache %s: data dir was filled from \"%s\", not \"%s\": starting over",
                      r->label, info.identity, r->identity);
        start_list(r, false);
    }
}

static const struct up_xfer_cbs discovery_cbs = {
    .on_headers = on_xfer_headers, .on_data = on_body_data, .on_done = on_discovery_done};

/* ---- LIST ---- */

static int
cmp_key(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int
cmp_pend_rv(const void *a, const void *b)
{
    const struct pend *x = a, *y = b;
    return x->rv < y->rv ? -1 : x->rv > y->rv;
}

static void
diff_reset(struct refl *r)
{
    for (size_t i = 0; i < r->nseen; i++)
        free(r->seen[i]);
    free(r->seen);
    r->seen = NULL;
    r->nseen = r->capseen = 0;
    for (size_t i = 0; i < r->ndiff; i++)
        pend_free(&r->dpend[i]);
    free(r->dpend);
    r->dpend = NULL;
    r->ndiff = r->capdiff = 0;
}

/* Append a relist difference; it takes key, obj and idx (all new). */
static void
diff_add(struct refl *r, enum store_ev_type type, uint64_t rv, char *key, size_t key_len, char *obj,
         size_t obj_len, char *idx, size_t idx_len)
{
    if (r->ndiff == r->capdiff) {
        r->capdiff = r->capdiff ? 2 * r->capdiff : 64;
        r->dpend = xrealloc(r->dpend, r->capdiff * sizeof(*r->dpend));
    }
    r->dpend[r->ndiff++] = (struct pend){.r = r, .type = type, .rv = rv, .key = key,
                                         .key_len = key_len, .obj = obj, .obj_len = obj_len,
                                         .idx = idx, .idx_len = idx_len};
}

struct del_scan {
    struct refl *r;
};

/* diff: a stored object the new list does not have was deleted. */
static int
on_stored_obj(void *arg, const struct store_obj *o)
{
    struct refl *r = ((struct del_scan *)arg)->r;
    char *k = xstrndup(o->key, o->key_len);
    bool seen = bsearch(&k, r->seen, r->nseen, sizeof(char *), cmp_key) != NULL;
    if (!seen) {
        diff_add(r, STORE_DELETED, r->list_rv, k, o->key_len, memdup(o->raw, o->raw_len), o->raw_len,
                 memdup(o->idx, o->idx_len), o->idx_len);
        return 0;
    }
    free(k);
    return 0;
}

static int
cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/*
 * Give each deletion found by a relist an rv of its own. Every deleted object
 * went away at some rv in (from_rv, list_rv] that no surviving object of the
 * resource holds as its own rv (one write, one rv), so there are as many such
 * rvs as deletions: take the highest, counting down from the list's rv. A
 * watcher then sees every event of the relist at an rv of its own, in order,
 * and resuming from any of them misses none of the rest. An upstream whose
 * rvs do not work that way leaves the remainder at the list's rv (logged).
 */
static void
place_deletions(struct refl *r, uint64_t from_rv)
{
    uint64_t *used = xmalloc((r->ndiff + 1) * sizeof(*used));
    size_t nu = 0, crowded = 0;
    for (size_t i = 0; i < r->ndiff; i++)
        if (r->dpend[i].type != STORE_DELETED)
            used[nu++] = r->dpend[i].rv;
    if (nu > 1)
        qsort(used, nu, sizeof(*used), cmp_u64);
    uint64_t slot = r->list_rv;
    size_t u = nu;
    for (size_t i = 0; i < r->ndiff; i++) {
        struct pend *p = &r->dpend[i];
        if (p->type != STORE_DELETED)
            continue;
        while (slot > from_rv) {
            while (u > 0 && used[u - 1] > slot)
                u--;
            if (u > 0 && used[u - 1] == slot) {
                slot--;
                continue;
            }
            break;
        }
        if (slot > from_rv) {
            p->rv = slot--;
        } else {
            p->rv = r->list_rv;
            crowded++;
        }
    }
    free(used);
    if (crowded)
        log_warnx("cache %s: %zu deletions found by the relist at rv %llu share that rv: the "
                  "upstream's rvs left no room between %llu and it",
                  r->label, crowded, (unsigned long long)r->list_rv,
                  (unsigned long long)from_rv);
}

#define DIFF_DIVERGED 1 /* finish_diff: the cache's history is not the upstream's */

/* Record the relist's differences as events, in rv order, in one transaction.
 * Returns 0, DIFF_DIVERGED or an error. */
static int
finish_diff(struct refl *r)
{
    if (r->nseen > 1) /* qsort(NULL, 0, ...) is undefined */
        qsort(r->seen, r->nseen, sizeof(char *), cmp_key);
    struct store_rtxn *t;
    int rc = store_rtxn_begin(r->ing->st, &t);
    if (rc)
        return rc;
    struct store_res_info info;
    store_info(t, r->d.sres, &info);
    struct del_scan ds = {r};
    rc = store_scan(t, r->d.sres, 0, "", NULL, 0, on_stored_obj, &ds);
    store_rtxn_end(t);
    if (rc)
        return rc;
    /* An object the list has at an rv the cache had already passed, other
     * than the cache has it (a restored etcd, an event the cache never got):
     * that change cannot be told to watchers in rv order, and the cache's
     * history is not the upstream's. Start over from a fresh list. */
    if (r->list_rv < info.rv) {
        log_warnx("cache %s: the upstream listed at rv %llu, behind the cache's rv %llu",
                  r->label, (unsigned long long)r->list_rv, (unsigned long long)info.rv);
        return DIFF_DIVERGED;
    }
    for (size_t i = 0; i < r->ndiff; i++) {
        if (r->dpend[i].type != STORE_DELETED && r->dpend[i].rv <= info.rv) {
            log_warnx("cache %s: the upstream has %.*s at rv %llu, which the cache passed (rv "
                      "%llu) with another state of it",
                      r->label, (int)r->dpend[i].key_len, r->dpend[i].key,
                      (unsigned long long)r->dpend[i].rv, (unsigned long long)info.rv);
            return DIFF_DIVERGED;
        }
    }
    place_deletions(r, info.rv);
    if (r->ndiff > 1) /* qsort(NULL, 0, ...) is undefined */
        qsort(r->dpend, r->ndiff, sizeof(*r->dpend), cmp_pend_rv);
    ingest_commit(r->ing); /* keep order with anything already pending */
    struct store_wtxn *w;
    if ((rc = store_wtxn_begin(r->ing->st, (uint64_t)time(NULL), &w)))
        return rc;
    for (size_t i = 0; i < r->ndiff && rc == 0; i++) {
        struct pend *p = &r->dpend[i];
        struct store_event ev = {.type = p->type, .rv = p->rv, .obj_rv = p->obj_rv, .key = p->key,
                                 .key_len = p->key_len, .obj = p->obj, .obj_len = p->obj_len,
                                 .idx = p->idx, .idx_len = p->idx_len};
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
                 (unsigned long long)r->list_rv, r->ndiff);
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
page_init(struct page *pg, enum kwc_enc enc, const char *body, size_t len, char *err,
          size_t errlen)
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
        struct decoded d;
        if ((rc = decode_obj(r, body + off, len, false, &d, err, errlen)))
            goto out;
        r->listed++;
        r->listed_bytes += len;
        if (!r->diff) {
            struct store_event ev = {.rv = d.rv, .key = d.key, .key_len = d.key_len, .obj = d.obj,
                                     .obj_len = d.obj_len, .idx = d.idx, .idx_len = d.idx_len};
            rc = store_wtxn_load(w, r->d.sres, &ev);
            decoded_fini(&d);
            if (rc)
                goto out;
            continue;
        }
        if (r->nseen == r->capseen) {
            r->capseen = r->capseen ? 2 * r->capseen : 1024;
            r->seen = xrealloc(r->seen, r->capseen * sizeof(char *));
        }
        r->seen[r->nseen++] = xstrdup(d.key);
        struct store_obj cur;
        int g = store_get(t, r->d.sres, d.key, d.key_len, &cur);
        if (g == 0 && cur.rv == d.rv) {
            decoded_fini(&d);
            continue;
        }
        diff_add(r, g == 0 ? STORE_MODIFIED : STORE_ADDED, d.rv, d.key, d.key_len,
                 memdup(d.obj, d.obj_len), d.obj_len, d.idx, d.idx_len);
        d.key = d.idx = NULL;
        decoded_fini(&d);
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
    char why[512];
    if (r->wrong_type || (r->d.enc == KWC_ENC_PB && r->status == 406)) {
        refuse(r, r->wrong_type ? r->got_type : "406 Not Acceptable");
        return;
    }
    if (err || r->too_big) {
        snprintf(why, sizeof(why), "LIST %s failed: %s", r->d.path, err ? msg : "page too large");
        backoff(r, why);
        return;
    }
    if (r->status == 410) {
        r->ctr.expired++;
        /* the continue token expired: start the list again */
        log_warnx("cache %s: continue token expired; restarting the list", r->label);
        free(r->cont);
        r->cont = NULL;
        start_list(r, r->diff);
        return;
    }
    if (r->status != 200) {
        char what[300];
        snprintf(what, sizeof(what), "LIST %s", r->d.path);
        status_why(r, what, why, sizeof(why));
        backoff(r, why);
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
    if (rc) {
        snprintf(why, sizeof(why), "LIST %s: %s", r->d.path, perr[0] ? perr : kwc_strerror(rc));
        free(next);
        store_failed(r, rc);
        backoff(r, why);
        return;
    }
    if (secs_since(&r->last_progress) >= 2.0) {
        double s = secs_since(&r->list_t0);
        log_info("cache %s: listed %llu objects (%.1f MB) in %.1f s, %.0f objects/s", r->label,
                 (unsigned long long)r->listed, r->listed_bytes / 1e6, s, r->listed / (s > 0 ? s : 1));
        clock_gettime(CLOCK_MONOTONIC, &r->last_progress);
    }
    free(r->cont);
    r->cont = next;
    if (next) {
        start_list(r, r->diff); /* next page */
        return;
    }
    /* The list is complete. */
    if (r->diff && (rc = finish_diff(r)) == DIFF_DIVERGED) {
        log_warnx("cache %s: its history does not match the upstream's: starting over from a "
                  "fresh list (its watchers end and resume from the upstream)",
                  r->label);
        diff_reset(r);
        r->synced = false; /* not served until the new list is complete */
        start_list(r, false);
        return;
    }
    if (r->diff && rc != 0) {
        snprintf(why, sizeof(why), "recording the relist of %s: %s", r->d.path, kwc_strerror(rc));
        diff_reset(r);
        store_failed(r, rc);
        backoff(r, why);
        return;
    }
    diff_reset(r);
    struct store_wtxn *w;
    if (store_wtxn_begin(r->ing->st, (uint64_t)time(NULL), &w) == 0) {
        store_wtxn_set_kind(w, r->d.sres, r->d.list_kind, r->d.api_version, r->d.namespaced);
        store_wtxn_set_identity(w, r->d.sres, r->identity);
        store_wtxn_set_synced(w, r->d.sres, true);
        if (store_wtxn_commit(w) != 0)
            log_error("cache %s: could not record the synced state", r->label);
    }
    double s = secs_since(&r->list_t0);
    log_info("cache %s: synced %llu objects (%.1f MB) at rv %llu in %.2f s (%.0f objects/s)",
             r->label, (unsigned long long)r->listed, r->listed_bytes / 1e6,
             (unsigned long long)r->list_rv, s, r->listed / (s > 0 ? s : 1));
    r->rv = r->list_rv;
    r->synced = r->ever_synced = true;
    r->diff = false;
    r->backoff_ms = 0;
    heard(r);
    set_in(r, OUT_DAMAGED); /* rebuilt */
    if (r->ing->on_commit)
        r->ing->on_commit(r->ing->on_commit_arg);
    start_watch(r);
}

static const struct up_xfer_cbs list_cbs = {
    .on_headers = on_xfer_headers, .on_data = on_body_data, .on_done = on_list_done};

static void
start_list(struct refl *r, bool diff)
{
    r->state = R_LIST;
    if (!r->cont) {
        r->ctr.lists++;
        r->ctr.relists += r->synced || diff;
        r->diff = diff;
        diff_reset(r);
        r->listed = r->listed_bytes = 0;
        clock_gettime(CLOCK_MONOTONIC, &r->list_t0);
        r->last_progress = r->list_t0;
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
    start_xfer(r, target, &list_cbs, false);
    free(target);
}

/* ---- WATCH ---- */

/* The next event of the watch stream: a JSON line, or a protobuf frame. */
static int
next_event(struct refl *r, const char **data, size_t *n, const char **ev, size_t *len)
{
    if (r->d.enc == KWC_ENC_PB)
        return pb_split_next(&r->pf, data, n, ev, len);
    return wframe_next(&r->wf, data, n, ev, len);
}

static int
on_watch_data(void *arg, const char *data, size_t n)
{
    struct refl *r = arg;
    if (r->status != 200)
        return on_body_data(arg, data, n);
    const char *line;
    size_t ll;
    int rc;
    if (r->backoff_ms && secs_since(&r->watch_t0) >= HEALTHY_S)
        r->backoff_ms = 0; /* healthy: the next drop retries at once */
    while ((rc = next_event(r, &data, &n, &line, &ll)) == 1) {
        struct wevent ev;
        char err[256] = "";
        int prc = r->d.enc == KWC_ENC_PB ? pb_wevent_parse(line, ll, &ev, NULL, err, sizeof(err))
                                         : wevent_parse(line, ll, &ev, err, sizeof(err));
        if (prc != 0) {
            log_warnx("cache %s: bad watch event from the upstream (%s); restarting the watch",
                      r->label, err);
            up_xfer_cancel(r->x);
            r->x = NULL;
            backoff(r, "bad watch event");
            return 0;
        }
        switch (ev.type) {
        case WEVENT_ADDED:
        case WEVENT_MODIFIED:
        case WEVENT_DELETED: {
            struct decoded d;
            if (decode_obj(r, line + ev.obj_off, ev.obj_len, true, &d, err, sizeof(err)) != 0) {
                log_warnx("cache %s: watch event object rejected: %s", r->label, err);
                break;
            }
            enum store_ev_type t = ev.type == WEVENT_ADDED      ? STORE_ADDED
                                   : ev.type == WEVENT_MODIFIED ? STORE_MODIFIED
                                                                : STORE_DELETED;
            push_event(r, t, &d);
            decoded_fini(&d);
            r->events_in++;
            heard(r);
            break;
        }
        case WEVENT_BOOKMARK: {
            struct pend *p = ingest_push(r->ing);
            p->r = r;
            p->bookmark = true;
            p->rv = ev.rv;
            if (ev.rv > r->rv)
                r->rv = ev.rv;
            heard(r);
            break;
        }
        case WEVENT_ERROR:
            if (ev.code == 410)
                r->got_410 = true;
            else
                log_warnx("cache %s: watch error from the upstream: %d %s", r->label, ev.code,
                          ev.message ? ev.message : "");
            break;
        }
        wevent_fini(&ev);
    }
    if (rc < 0) {
        log_warnx("cache %s: a watch event from the upstream is larger than the limit (%u "
                  "bytes); restarting the watch",
                  r->label, r->d.enc == KWC_ENC_PB ? PB_MAX_FRAME : WFRAME_MAX_LINE);
        up_xfer_cancel(r->x);
        r->x = NULL;
        backoff(r, "watch event larger than the line limit");
        return 0;
    }
    if (r->ing->bytes > PENDING_MAX_BYTES)
        ingest_commit(r->ing);
    return 0;
}

static void
on_watch_done(void *arg, int err, const char *msg)
{
    struct refl *r = arg;
    r->x = NULL;
    if (r->wrong_type || (r->d.enc == KWC_ENC_PB && r->status == 406)) {
        refuse(r, r->wrong_type ? r->got_type : "406 Not Acceptable");
        return;
    }
    if (r->status == 410 || r->got_410) {
        log_info("cache %s: the upstream no longer has rv %llu (410); relisting", r->label,
                 (unsigned long long)r->rv);
        ingest_commit(r->ing);
        r->ctr.expired++;
        start_list(r, r->synced);
        return;
    }
    size_t part = r->d.enc == KWC_ENC_PB ? pb_split_pending(&r->pf) : wframe_pending(&r->wf);
    if (r->status == 200 && part && !err) {
        /* not the clean end of a watch: the upstream cut an event */
        log_warnx("cache %s: the upstream's watch stopped inside an event (%zu bytes of it)",
                  r->label, part);
        backoff(r, "the upstream's watch stopped inside an event");
        return;
    }
    if (r->status == 200 && secs_since(&r->watch_t0) >= HEALTHY_S)
        r->backoff_ms = 0; /* it was healthy: this drop is news, not the outage going on */
    if (err || r->status != 200) {
        char why[512], st[384], what[300];
        snprintf(what, sizeof(what), "WATCH %s", r->d.path);
        status_why(r, what, st, sizeof(st));
        snprintf(why, sizeof(why), "watch of %s ended: %s", r->d.path, err ? msg : st);
        backoff(r, why);
        return;
    }
    /* A clean end (timeoutSeconds): watch again from where we are. */
    step(r, r->backoff_ms ? r->backoff_ms : 0);
}

static const struct up_xfer_cbs watch_cbs = {
    .on_headers = on_xfer_headers, .on_data = on_watch_data, .on_done = on_watch_done};

static void
start_watch(struct refl *r)
{
    r->state = R_WATCH;
    r->got_410 = false;
    r->ctr.watch_restarts += r->ctr.watches++ > 0;
    wframe_fini(&r->wf);
    wframe_init(&r->wf, 0);
    pb_split_fini(&r->pf);
    pb_split_init(&r->pf, 0);
    clock_gettime(CLOCK_MONOTONIC, &r->watch_t0);
    /* Like client-go: a random timeout in [5, 10) minutes spreads re-watches. */
    int timeout = 300 + rand() % 300;
    char *target = xasprintf("%s?allowWatchBookmarks=true&resourceVersion=%llu&timeoutSeconds=%d&watch=true",
                             r->d.path, (unsigned long long)r->rv, timeout);
    start_xfer(r, target, &watch_cbs, true);
    free(target);
}

/* ---- driving ---- */

/* Free bytes for unprivileged writers on the data dir's filesystem. */
static uint64_t
free_bytes(const struct refl_ingest *ing)
{
    struct statvfs sv;
    return statvfs(ing->data_dir, &sv) == 0 ? (uint64_t)sv.f_bavail * sv.f_frsize : 0;
}

/* Out for a write: once space has come back, retry now rather than at the
 * end of the backoff. Only a commit of r's events brings it back (LMDB
 * reuses freed pages, so a small write can succeed on a full disk). */
static void
retry_write(struct refl *r)
{
    if (r->x || !evtimer_pending(r->timer, NULL))
        return;
    if (free_bytes(r->ing) < r->free_at_fail + ((uint64_t)1 << 20))
        return;
    log_info("cache %s: space is back in %s; resuming the watch", r->label, r->ing->data_dir);
    r->free_at_fail = free_bytes(r->ing);
    r->backoff_ms = 0;
    evtimer_del(r->timer);
    step(r, 0);
}

static void
on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct refl *r = arg;
    char key[256];
    if (r->synced && r->out != OUT_DAMAGED && store_res_damaged(r->d.sres, key, sizeof(key))) {
        set_out(r, OUT_DAMAGED, "a stored value failed its checksum (%s); rebuilding it from a "
                                "fresh list",
                key);
        up_xfer_cancel(r->x);
        r->x = NULL;
        evtimer_del(r->timer);
        free(r->cont);
        r->cont = NULL;
        r->backoff_ms = 0;
        start_list(r, false);
        return;
    }
    if (r->out == OUT_WRITE)
        retry_write(r);
    unsigned max = r->ing->max_staleness;
    if (max && r->synced && r->out == OUT_NONE && !r->refused && secs_since(&r->last_heard) > max)
        set_out(r, OUT_STALE,
                "stale: no event or bookmark from the upstream for %.0f s (--max-staleness %u)",
                secs_since(&r->last_heard), max);
}

static void
on_step(evutil_socket_t fd, short what, void *arg)
{
    struct refl *r = arg;
    if (r->x)
        return;
    switch (r->state) {
    case R_IDLE:
    case R_DISCOVER: {
        r->state = R_DISCOVER;
        const char *gv = r->d.group[0] ? "/apis" : "/api";
        char *target = r->d.group[0] ? xasprintf("%s/%s/%s", gv, r->d.group, r->d.version)
                                     : xasprintf("%s/%s", gv, r->d.version);
        if (r->got_410 && r->d.kind) { /* a failed commit asked for a relist */
            free(target);
            start_list(r, r->synced);
            return;
        }
        start_xfer(r, target, &discovery_cbs, false);
        free(target);
        break;
    }
    case R_LIST:
        start_list(r, r->diff);
        break;
    case R_WATCH:
        start_watch(r);
        break;
    }
}

static void
step(struct refl *r, int delay_ms)
{
    struct timeval tv = {delay_ms / 1000, (delay_ms % 1000) * 1000};
    evtimer_add(r->timer, &tv);
}

int
refl_new(struct event_base *base, struct up_client *up, struct refl_ingest *ing, const char *gvr,
         enum kwc_enc enc, const char *identity, struct refl **out, char *err, size_t errlen)
{
    char *parts[3] = {0};
    int n = 0;
    char *copy = xstrdup(gvr), *save = NULL;
    for (char *t = strtok_r(copy, "/", &save); t; t = strtok_r(NULL, "/", &save)) {
        if (n == 3) {
            n = 4;
            break;
        }
        parts[n++] = t;
    }
    if (n != 2 && n != 3) {
        snprintf(err, errlen,
                 "--resources: \"%s\" is not group/version/resource (or version/resource for the core "
                 "group), e.g. apps/v1/deployments or v1/pods",
                 gvr);
        free(copy);
        return KWC_ECONFIG;
    }
    struct refl *r = xcalloc(1, sizeof(*r));
    r->magic = REFL_MAGIC;
    r->base = base;
    r->up = up;
    r->ing = ing;
    r->identity = xstrdup(identity);
    r->d.group = xstrdup(n == 3 ? parts[0] : "");
    r->d.version = xstrdup(parts[n - 2]);
    r->d.resource = xstrdup(parts[n - 1]);
    free(copy);
    r->d.api_version = r->d.group[0] ? xasprintf("%s/%s", r->d.group, r->d.version) : xstrdup(r->d.version);
    r->d.path = r->d.group[0] ? xasprintf("/apis/%s/%s/%s", r->d.group, r->d.version, r->d.resource)
                              : xasprintf("/api/%s/%s", r->d.version, r->d.resource);
    r->d.enc = enc;
    r->label =
        enc == KWC_ENC_PB ? xasprintf("%s (protobuf)", r->d.resource) : xstrdup(r->d.resource);
    r->d.typed_items = !kinds_builtin_group(r->d.group);
    if (enc == KWC_ENC_PB && r->d.typed_items) {
        snprintf(err, errlen, "%s is a custom resource: custom resources have no protobuf", gvr);
        refl_free(r);
        return KWC_ECONFIG;
    }
    size_t nk;
    const struct obj_field *kf = kinds_fields(r->d.group, r->d.resource, &nk);
    int kidx = kinds_index_field(r->d.group, r->d.resource);
    r->d.index_field = kidx;
    if (enc == KWC_ENC_PB) {
        /* the fields pb.c can read without the schema; a selector on another
         * passes through (admit_serves_fields), and so does the index when
         * pb.c cannot read its field */
        r->pbf = pb_fields(r->d.group, r->d.resource, &r->d.n_fields);
        r->own_fields = xcalloc(r->d.n_fields ? r->d.n_fields : 1, sizeof(*r->own_fields));
        r->d.index_field = -1;
        for (size_t i = 0; i < r->d.n_fields; i++) {
            r->own_fields[i] = (struct obj_field){r->pbf[i].path, r->pbf[i].missing};
            if (kidx >= 0 && strcmp(r->pbf[i].path, kf[kidx].path) == 0)
                r->d.index_field = (int)i;
        }
        r->d.fields = r->own_fields;
    } else {
        r->d.fields = kf;
        r->d.n_fields = nk;
    }
    r->d.field_names = xcalloc(r->d.n_fields ? r->d.n_fields : 1, sizeof(char *));
    for (size_t i = 0; i < r->d.n_fields; i++)
        r->d.field_names[i] = r->d.fields[i].path;
    char name[300];
    snprintf(name, sizeof(name), "%s/%s:%s", r->d.api_version, r->d.resource,
             enc == KWC_ENC_PB ? "pb" : "json");
    int rc = store_res(ing->st, name, &r->d.sres);
    if (rc == 0 && r->d.index_field >= 0)
        rc = store_res_index(r->d.sres, (unsigned)r->d.index_field);
    if (rc) {
        snprintf(err, errlen, "cache for %s: %s", gvr, kwc_strerror(rc));
        r->magic = REFL_MAGIC;
        refl_free(r);
        return rc;
    }
    r->body = evbuffer_new();
    r->timer = evtimer_new(base, on_step, r);
    r->tick = event_new(base, -1, EV_PERSIST, on_tick, r);
    clock_gettime(CLOCK_MONOTONIC, &r->last_heard);
    wframe_init(&r->wf, 0);
    pb_split_init(&r->pf, 0);
    *out = r;
    return 0;
}

void
refl_start(struct refl *r)
{
    if (r->started)
        return;
    r->started = true;
    /* A warm cache from the same upstream is served at once, even while the
     * upstream is unreachable; discovery then resumes the watch. */
    struct store_rtxn *t;
    struct store_res_info info = {0};
    if (store_rtxn_begin(r->ing->st, &t) == 0) {
        store_info(t, r->d.sres, &info);
        store_rtxn_end(t);
    }
    size_t kl = strlen(info.list_kind);
    if (info.unserved && strcmp(info.identity, r->identity) == 0) {
        /* known from the last run: not waited for until the upstream says
         * otherwise (discovery and the list ask it again) */
        r->refused = true;
        snprintf(r->last_err, sizeof(r->last_err),
                 "the upstream did not serve %s/%s in protobuf when last asked", r->d.api_version,
                 r->d.resource);
        log_info("cache %s: %s; its requests pass through; asking it again", r->label,
                 r->last_err);
    }
    if (info.synced && strcmp(info.identity, r->identity) == 0 && kl > 4 &&
        strcmp(info.list_kind + kl - 4, "List") == 0 && strcmp(info.api_version, r->d.api_version) == 0) {
        /* what discovery said last time: serve before it answers again */
        r->synced = r->ever_synced = true;
        r->rv = info.rv;
        r->d.namespaced = info.namespaced;
        r->d.list_kind = xstrdup(info.list_kind);
        r->d.kind = xstrndup(info.list_kind, kl - 4);
    }
    r->state = R_DISCOVER;
    clock_gettime(CLOCK_MONOTONIC, &r->last_heard);
    struct timeval tick = {0, TICK_MS * 1000};
    event_add(r->tick, &tick);
    step(r, 0);
}

void
refl_free(struct refl *r)
{
    if (!r)
        return;
    assert(r->magic == REFL_MAGIC);
    up_xfer_cancel(r->x);
    if (r->timer)
        event_free(r->timer);
    if (r->tick)
        event_free(r->tick);
    if (r->body)
        evbuffer_free(r->body);
    wframe_fini(&r->wf);
    pb_split_fini(&r->pf);
    diff_reset(r);
    free(r->cont);
    free(r->identity);
    free(r->typemeta);
    free(r->d.group);
    free(r->d.version);
    free(r->d.resource);
    free(r->d.path);
    free(r->d.api_version);
    free(r->d.kind);
    free(r->d.list_kind);
    free(r->d.field_names);
    free(r->own_fields);
    free(r->label);
    r->magic = 0;
    free(r);
}

bool
refl_synced(const struct refl *r)
{
    return r->synced;
}

bool
refl_serving(const struct refl *r)
{
    return r->synced && r->out == OUT_NONE && !r->refused;
}

bool
refl_started(const struct refl *r)
{
    return r->started;
}

/* A cache started by a request joins /readyz once it has synced: kwc was
 * ready without it, and a client asking for protobuf must not take the
 * whole replica out of its Service while the new cache lists. */
bool
refl_counts_ready(const struct refl *r)
{
    return r->started && !r->refused && (!r->wanted || r->ever_synced);
}

const struct refl_desc *
refl_desc(const struct refl *r)
{
    return &r->d;
}

void
refl_status(const struct refl *r, char *buf, size_t len)
{
    static const char *const states[] = {"idle", "discovering", "listing", "watching"};
    snprintf(buf, len,
             "%s%s: %s, %s, rv %llu, %llu events in, last upstream event or bookmark %.0f s ago",
             r->d.api_version[0] ? r->d.path : "", r->d.enc == KWC_ENC_PB ? " (protobuf)" : "",
             !r->started ? "not started" : r->synced ? "synced" : "not synced",
             r->refused ? "not served in protobuf" : states[r->state], (unsigned long long)r->rv,
             (unsigned long long)r->events_in, secs_since(&r->last_heard));
}

const char *
refl_last_error(const struct refl *r)
{
    return r->last_err[0] ? r->last_err : NULL;
}

const char *
refl_out_why(const struct refl *r)
{
    return r->out == OUT_NONE ? NULL : r->out_why;
}

void
refl_want(struct refl *r)
{
    if (r->started)
        return;
    log_info("cache %s: asked for by a request; starting it (requests pass through until it "
             "has synced)",
             r->label);
    r->wanted = true;
    refl_start(r);
}

void
refl_counters(const struct refl *r, struct refl_counters *out)
{
    *out = r->ctr;
    out->events_in = r->events_in;
}
