/*
 * reflector.c — upstream LIST+WATCH into the store (see reflector.h).
 *
 * State machine per resource:
 *   DISCOVER -> (warm and same upstream ? WATCH : LIST) ; LIST pages -> WATCH ;
 *   WATCH end -> WATCH (immediately if clean, else after backoff) ;
 *   410 -> LIST in diff mode ; other failures -> backoff, same state again.
 * Retries back off from 0.5 s, doubling, with ±50 % jitter, never past 30 s;
 * the delay starts over once a watch has stayed open for 10 s (or a list
 * completes), so one outage does not slow every later reconnect
 * (refl_backoff, refl_watch_healthy).
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
 * Rooms of the reflector: this file is the state machine (discovery, the
 * watch, service, timers); reflector_list.c the LIST and the relist's glue
 * (reflector_int.h between them); reflector_state.c what a reflector tells
 * (the state serving loops read, the reports); ingest.c the batched writer every
 * reflector of the loop shares (ingest.h); the relist difference itself is
 * pure (cache/relist.c). Time and jitter come from the options' refl_clock,
 * so that tests drive them; only the store's history stamps (for
 * --history-max-age) are wall-clock seconds, time(NULL).
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
#include <stdarg.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kwc/base.h"
#include "kwc/kinds.h"
#include "kwc/log.h"
#include "kwc/pb.h"
#include "kwc/store.h"
#include "kwc/upstream.h"

#include "reflector_int.h"

#define REFL_MAGIC 0x7265666cu           /* "refl" */
#define PAGE_MAX_BYTES ((size_t)1 << 30) /* one LIST page held in memory */
#define DISCOVERY_MAX_BYTES ((size_t)16 << 20)
#define PENDING_MAX_BYTES ((size_t)64 << 20) /* commit at once past this */
#define BACKOFF_MIN_MS 500
#define BACKOFF_MAX_MS 30000 /* the cap on any retry delay, jitter included */
#define HEALTHY_MS 10000     /* a watch open this long resets the backoff */
#define TICK_MS 250          /* damage and staleness checks; write probes */
/* An upstream without protobuf for a resource is asked again this late: it
 * may be upgraded, but not every few seconds. */
#define PB_REFUSED_RETRY_MS (10 * 60 * 1000)

static void step(struct refl *r, int delay_ms);
static void set_out(struct refl *r, enum refl_out out, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

uint64_t
refl_now_ms(const struct refl *r)
{
    return r->ing->clock.now_ms(r->ing->clock.arg);
}

double
refl_secs_since(const struct refl *r, uint64_t t0_ms)
{
    return (double)(int64_t)(refl_now_ms(r) - t0_ms) / 1000.0;
}

/* ---- what the batched writer tells (ingest.h) ---- */

/* A commit carrying r's events failed: they are lost, so the cache leaves
 * service and the watch resumes from what the store holds. */
void
refl_commit_failed(struct refl *r, const char *why)
{
    set_out(r, OUT_WRITE, "%s", why);
    r->free_at_fail = refl_ingest_free_bytes(r->ing);
    if (r->state == R_WATCH && r->x) {
        up_xfer_cancel(r->x);
        r->x = NULL;
        r->rv = store_res_rv(r->ing->st, r->d.sres, NULL);
        refl_retry(r, "cache watch failed: its events could not be stored",
                   "its events could not be stored");
    }
}

/* A write of r's own (a list page, a relist's events) failed with rc: out
 * of service if it was the disk or the map, not the data. */
void
refl_store_failed(struct refl *r, int rc)
{
    if (rc == KWC_EMAPFULL || (rc < 0 && rc > -KWC_ERRBASE)) {
        char why[512];
        refl_ingest_write_cause(r->ing, rc, why, sizeof(why));
        set_out(r, OUT_WRITE, "%s", why);
        r->free_at_fail = refl_ingest_free_bytes(r->ing);
    }
}

void
refl_commit_done(struct refl *r)
{
    if (r->out == OUT_WRITE)
        refl_set_in(r, OUT_WRITE);
}

static void
push_event(struct refl *r, enum store_ev_type type, struct refl_decoded *d)
{
    struct pend *p = refl_ingest_push(r->ing);
    p->r = r;
    p->type = type;
    p->rv = d->rv;
    p->key = d->key;
    p->key_len = d->key_len;
    d->key = NULL;
    p->idx = d->idx;
    p->idx_len = d->idx_len;
    d->idx = NULL;
    p->obj = xmemdup(d->obj, d->obj_len);
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

int
refl_on_xfer_headers(void *arg, int status, const struct up_header *h, size_t n)
{
    struct refl *r = arg;
    r->status = status;
    r->wrong_type = false;
    if (r->d.enc != KWC_ENC_PB || r->state == R_DISCOVER || r->state == R_PROBE || status != 200)
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

int
refl_on_body_data(void *arg, const char *p, size_t n)
{
    struct refl *r = arg;
    if (evbuffer_get_length(r->body) + n >
        (r->state == R_DISCOVER || r->state == R_PROBE ? DISCOVERY_MAX_BYTES : PAGE_MAX_BYTES)) {
        r->too_big = true;
        return 0; /* dropped; on_done reports it */
    }
    evbuffer_add(r->body, p, n);
    return 0;
}

void
refl_xfer_start(struct refl *r, const char *target, const struct up_xfer_cbs *cbs,
                bool long_running)
{
    static const struct up_header json = {"Accept", "application/json"};
    static const struct up_header pb = {"Accept", PB_CONTENT_TYPE};
    /* discovery and the probe in JSON: neither stores objects */
    bool want_pb = r->d.enc == KWC_ENC_PB && r->state != R_DISCOVER && r->state != R_PROBE;
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

int
refl_backoff(int *backoff_ms, uint32_t rnd)
{
    int base = *backoff_ms ? *backoff_ms : BACKOFF_MIN_MS;
    int delay = base / 2 + (int)(rnd % (uint32_t)(base + 1)); /* [0.5, 1.5] x base */
    if (delay > BACKOFF_MAX_MS)
        delay = BACKOFF_MAX_MS;
    *backoff_ms = base * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : base * 2;
    return delay;
}

bool
refl_watch_healthy(uint64_t opened_ms, uint64_t now_ms)
{
    return now_ms >= opened_ms && now_ms - opened_ms >= HEALTHY_MS;
}

bool
refl_stale(uint64_t heard_ms, uint64_t now_ms, uint64_t max_staleness_ms)
{
    return max_staleness_ms && now_ms > heard_ms && now_ms - heard_ms > max_staleness_ms;
}

void
refl_xfer_cause(const struct refl *r, const char *phase, int err, char *buf, size_t len)
{
    if (err)
        snprintf(buf, len, "cache %s failed: %s", phase, kwc_strerror(err));
    else if (r->too_big)
        snprintf(buf, len, "cache %s failed: an answer over the size limit", phase);
    else
        snprintf(buf, len, "cache %s failed: the upstream answered %d", phase, r->status);
}

void
refl_retry(struct refl *r, const char *cause, const char *why)
{
    r->ctr.errors[r->state == R_LIST ? 1 : r->state == R_WATCH || r->state == R_PROBE ? 2 : 0]++;
    if (r->status == 0 || r->status >= 500)
        refl_ingest_lost(r->ing); /* the upstream may come back as another cluster */
    int delay = refl_backoff(&r->backoff_ms, r->ing->clock.rand(r->ing->clock.arg));
    r->ctr.retry_ms = (uint64_t)delay;
    uint64_t now = refl_now_ms(r);
    if (r->fails++ == 0)
        r->fail_since_ms = now;
    r->next_try_ms = now + (uint64_t)delay;
    /* 18 caches retrying through an outage: one line per cause and interval */
    log_repeat(LOG_WARN, cause ? cause : why, "caches", r->label,
               "cache %s: %s; retrying in %.1f s", r->label, why, delay / 1000.0);
    snprintf(r->last_err, sizeof(r->last_err), "%s", why);
    step(r, delay);
    if (!r->synced && !r->failed) {
        /* requests waiting for its first sync (refl_warming) go upstream */
        r->failed = true;
        refl_ingest_notify_service(r->ing, r, false);
    }
    if (r->ing->on_retry)
        r->ing->on_retry(r->ing->on_retry_arg, r, r->status);
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
    if (was_serving)
        refl_ingest_notify_service(r->ing, r, false);
}

/* Back in service, if what kept it out was out. */
void
refl_set_in(struct refl *r, enum refl_out out)
{
    if (r->out != out)
        return;
    r->out = OUT_NONE;
    r->out_why[0] = '\0';
    log_info("cache %s: back in service", r->label);
    refl_ingest_notify_service(r->ing, r, true);
}

/* The upstream answered: the cache is not stale (and a stale one is back). */
void
refl_recovered(struct refl *r)
{
    r->backoff_ms = 0;
    r->fails = 0;
}

void
refl_heard(struct refl *r)
{
    r->heard_ever = true;
    r->last_heard_ms = refl_now_ms(r);
    if (r->out == OUT_STALE)
        refl_set_in(r, OUT_STALE);
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
    if (was != refl_serving(r))
        refl_ingest_notify_service(r->ing, r, !was);
}

/* A LIST or WATCH asked for protobuf got another type (got) or a 406: stop
 * asking for a long while. */
void
refl_refuse(struct refl *r, const char *got)
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
void
refl_status_why(const struct refl *r, const char *what, char *buf, size_t len)
{
    if (r->status == 401)
        snprintf(buf, len,
                 "the upstream rejected kwc's credentials (401) for %s: check the token or "
                 "certificate in KUBECONFIG (in a pod: the service account's token)",
                 what);
    else if (r->status == 403)
        snprintf(buf, len,
                 "kwc's identity may not %s (403): grant it list and watch of %s%s%s "
                 "(conf/kubernetes/base/rbac.yaml)",
                 what, r->d.resource, r->d.group[0] ? "." : "", r->d.group);
    else
        snprintf(buf, len, "%s answered %d", what, r->status);
}

/* The kind discovery (or the store) names, the first kl bytes of kind, and
 * its list kind. A serving loop may be reading the strings they replace:
 * those are kept until refl_free (a kind changes as rarely as a resource
 * is redefined; the same kind again replaces nothing). */
static void
set_kind(struct refl *r, const char *kind, size_t kl)
{
    char *old = r->d.kind;
    if (old && strlen(old) == kl && strncmp(old, kind, kl) == 0)
        return;
    char *k = xstrndup(kind, kl), *lk = xasprintf("%sList", k);
    if (old) {
        r->old_names = xrealloc(r->old_names, (r->nold_names + 2) * sizeof(char *));
        r->old_names[r->nold_names++] = old;
        r->old_names[r->nold_names++] = r->d.list_kind;
    }
    /* list_kind first: a reader that sees the new kind sees its list kind */
    r->d.list_kind = lk;
    r->d.kind = k;
}

/* Discovery's list of a group version's resources, for a person: "a, b, c"
 * (subresources left out), at most len bytes. */
static void
offered(json_t *res, char *buf, size_t len)
{
    size_t i, n = 0;
    json_t *e;
    buf[0] = '\0';
    json_array_foreach(res, i, e)
    {
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
    bool first = !r->discovered && !r->discovery_failed && !r->wanted && r->d.enc == KWC_ENC_JSON;
    r->discovered = true;
    if (first && r->ing->on_unknown) {
        snprintf(r->last_err, sizeof(r->last_err), "%s", why);
        r->ing->on_unknown(r->ing->on_unknown_arg, r, why);
        return;
    }
    refl_retry(r, NULL, why);
}

static void
on_discovery_done(void *arg, int err, const char *msg)
{
    struct refl *r = arg;
    r->x = NULL;
    if (err)
        refl_ingest_lost(r->ing); /* no answer: it may come back as another cluster */
    char why[512];
    if (r->status == 404 && !err) {
        snprintf(why, sizeof(why),
                 "the upstream serves no API group version %s (404 on its "
                 "discovery)",
                 r->d.api_version);
        unknown_resource(r, why);
        return;
    }
    if (err || r->status != 200 || r->too_big) {
        char st[384];
        refl_status_why(r, "read discovery", st, sizeof(st));
        snprintf(why, sizeof(why), "discovery of %s failed (%s)", r->d.path,
                 err          ? msg
                 : r->too_big ? "too large"
                              : st);
        if (!r->discovered)
            r->discovery_failed = true;
        char cause[160];
        refl_xfer_cause(r, "discovery", err, cause, sizeof(cause));
        refl_retry(r, cause, why);
        return;
    }
    size_t len = evbuffer_get_length(r->body);
    json_error_t je;
    json_t *doc = json_loadb((const char *)evbuffer_pullup(r->body, -1), len, 0, &je);
    json_t *res = doc ? json_object_get(doc, "resources") : NULL;
    size_t i;
    json_t *e;
    bool found = false;
    json_array_foreach(res, i, e)
    {
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *kind = json_string_value(json_object_get(e, "kind"));
        if (name && kind && strcmp(name, r->d.resource) == 0 && plain_name(kind)) {
            r->d.namespaced = json_is_true(json_object_get(e, "namespaced"));
            set_kind(r, kind, strlen(kind));
            free(r->typemeta);
            r->typemeta =
                xasprintf("{\"kind\":\"%s\",\"apiVersion\":\"%s\",", kind, r->d.api_version);
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
        r->ever_synced = true;
        r->synced = true;
        log_info("cache %s: warm start with %llu objects at rv %llu; resuming the watch", r->label,
                 (unsigned long long)info.objects, (unsigned long long)info.rv);
        refl_probe_start(r); /* the upstream's rv first: it may have gone back */
    } else {
        if (info.synced)
            log_warnx("cache %s: data dir was filled from \"%s\", not \"%s\": starting over",
                      r->label, info.identity, r->identity);
        refl_list_start(r, false);
    }
}

static const struct up_xfer_cbs discovery_cbs = {
    .on_headers = refl_on_xfer_headers, .on_data = refl_on_body_data, .on_done = on_discovery_done};

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
        return refl_on_body_data(arg, data, n);
    const char *line;
    size_t ll;
    int rc;
    if ((r->backoff_ms || r->fails) && refl_watch_healthy(r->watch_t0_ms, refl_now_ms(r)))
        refl_recovered(r); /* healthy: the next drop retries at once */
    while ((rc = next_event(r, &data, &n, &line, &ll)) == 1) {
        struct wevent ev;
        char err[256] = "";
        int prc = r->d.enc == KWC_ENC_PB ? pb_wevent_parse(line, ll, &ev, NULL, err, sizeof(err))
                                         : wevent_parse(line, ll, &ev, err, sizeof(err));
        if (prc != 0) {
            char why[384];
            snprintf(why, sizeof(why), "bad watch event from the upstream (%s)", err);
            up_xfer_cancel(r->x);
            r->x = NULL;
            refl_retry(r, "cache watch failed: a bad event from the upstream", why);
            return 0;
        }
        switch (ev.type) {
        case WEVENT_ADDED:
        case WEVENT_MODIFIED:
        case WEVENT_DELETED: {
            struct refl_decoded d;
            if (refl_decode_obj(r, line + ev.obj_off, ev.obj_len, true, &d, err, sizeof(err)) !=
                0) {
                log_repeat(LOG_WARN, "cache watch: an event's object rejected", "caches", r->label,
                           "cache %s: watch event object rejected: %s", r->label, err);
                break;
            }
            enum store_ev_type t = ev.type == WEVENT_ADDED      ? STORE_ADDED
                                   : ev.type == WEVENT_MODIFIED ? STORE_MODIFIED
                                                                : STORE_DELETED;
            if (refl_watch_went_back(r, d.rv, "an event")) {
                refl_decoded_fini(&d);
                wevent_fini(&ev);
                return 0;
            }
            push_event(r, t, &d);
            refl_decoded_fini(&d);
            r->events_in++;
            refl_heard(r);
            break;
        }
        case WEVENT_BOOKMARK: {
            if (refl_watch_went_back(r, ev.rv, "a bookmark")) {
                wevent_fini(&ev);
                return 0;
            }
            struct pend *p = refl_ingest_push(r->ing);
            p->r = r;
            p->bookmark = true;
            p->rv = ev.rv;
            if (ev.rv > r->rv)
                r->rv = ev.rv;
            refl_heard(r);
            break;
        }
        case WEVENT_ERROR:
            if (ev.code == 410)
                r->got_410 = true;
            else
                log_repeat(LOG_WARN, "cache watch: an error event from the upstream", "caches",
                           r->label, "cache %s: watch error from the upstream: %d %s", r->label,
                           ev.code, ev.message ? ev.message : "");
            break;
        }
        wevent_fini(&ev);
    }
    if (rc < 0) {
        char why[160];
        snprintf(why, sizeof(why),
                 "a watch event from the upstream is larger than the limit (%u "
                 "bytes)",
                 r->d.enc == KWC_ENC_PB ? PB_MAX_FRAME : WFRAME_MAX_LINE);
        up_xfer_cancel(r->x);
        r->x = NULL;
        refl_retry(r, "cache watch failed: an event over the size limit", why);
        return 0;
    }
    if (r->ing->bytes > PENDING_MAX_BYTES)
        refl_ingest_commit(r->ing);
    return 0;
}

static void
on_watch_done(void *arg, int err, const char *msg)
{
    struct refl *r = arg;
    r->x = NULL;
    if (err)
        refl_ingest_lost(r->ing);
    if (r->wrong_type || (r->d.enc == KWC_ENC_PB && r->status == 406)) {
        refl_refuse(r, r->wrong_type ? r->got_type : "406 Not Acceptable");
        return;
    }
    if (r->status == 410 || r->got_410) {
        log_info("cache %s: the upstream no longer has rv %llu (410); relisting", r->label,
                 (unsigned long long)r->rv);
        refl_ingest_commit(r->ing);
        r->ctr.expired++;
        refl_list_start(r, r->synced);
        return;
    }
    size_t part = r->d.enc == KWC_ENC_PB ? pb_split_pending(&r->pf) : wframe_pending(&r->wf);
    if (r->status == 200 && part && !err) {
        /* not the clean end of a watch: the upstream cut an event */
        char why[160];
        snprintf(why, sizeof(why), "the upstream's watch stopped inside an event (%zu bytes of it)",
                 part);
        refl_retry(r, "cache watch failed: the upstream stopped inside an event", why);
        return;
    }
    if (r->status == 200 && refl_watch_healthy(r->watch_t0_ms, refl_now_ms(r)))
        refl_recovered(r); /* it was healthy: this drop is news, not the outage going on */
    if (err || r->status != 200) {
        char why[512], st[384], what[300];
        snprintf(what, sizeof(what), "WATCH %s", r->d.path);
        refl_status_why(r, what, st, sizeof(st));
        snprintf(why, sizeof(why), "watch of %s ended: %s", r->d.path, err ? msg : st);
        char cause[160];
        refl_xfer_cause(r, "watch", err, cause, sizeof(cause));
        refl_retry(r, cause, why);
        return;
    }
    /* A clean end (timeoutSeconds): watch again from where we are. */
    step(r, r->backoff_ms ? r->backoff_ms : 0);
}

static const struct up_xfer_cbs watch_cbs = {
    .on_headers = refl_on_xfer_headers, .on_data = on_watch_data, .on_done = on_watch_done};

void
refl_watch_start(struct refl *r)
{
    r->state = R_WATCH;
    r->got_410 = false;
    r->ctr.watch_restarts += r->ctr.watches++ > 0;
    wframe_fini(&r->wf);
    wframe_init(&r->wf, 0);
    pb_split_fini(&r->pf);
    pb_split_init(&r->pf, 0);
    r->watch_t0_ms = refl_now_ms(r);
    /* Like client-go: a random timeout in [5, 10) minutes spreads re-watches. */
    int timeout = 300 + (int)(r->ing->clock.rand(r->ing->clock.arg) % 300);
    char *target =
        xasprintf("%s?allowWatchBookmarks=true&resourceVersion=%llu&timeoutSeconds=%d&watch=true",
                  r->d.path, (unsigned long long)r->rv, timeout);
    refl_xfer_start(r, target, &watch_cbs, true);
    free(target);
}

/* ---- driving ---- */

/* Out for a write: once space has come back, retry now rather than at the
 * end of the backoff. Only a commit of r's events brings it back (LMDB
 * reuses freed pages, so a small write can succeed on a full disk). */
static void
retry_write(struct refl *r)
{
    if (r->x || !evtimer_pending(r->timer, NULL))
        return;
    if (refl_ingest_free_bytes(r->ing) < r->free_at_fail + ((uint64_t)1 << 20))
        return;
    log_info("cache %s: space is back in %s; resuming the watch", r->label, r->ing->data_dir);
    r->free_at_fail = refl_ingest_free_bytes(r->ing);
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
        set_out(r, OUT_DAMAGED,
                "a stored value failed its checksum (%s); rebuilding it from a "
                "fresh list",
                key);
        up_xfer_cancel(r->x);
        r->x = NULL;
        evtimer_del(r->timer);
        free(r->cont);
        r->cont = NULL;
        r->backoff_ms = 0;
        refl_list_start(r, false);
        return;
    }
    if (r->out == OUT_WRITE)
        retry_write(r);
    uint64_t max = r->ing->max_staleness_ms;
    char go[KWC_DURATION_LEN];
    if (r->synced && r->out == OUT_NONE && !r->refused &&
        refl_stale(r->last_heard_ms, refl_now_ms(r), max))
        set_out(r, OUT_STALE,
                "stale: no event or bookmark from the upstream for %.0f s (--max-staleness %s)",
                refl_secs_since(r, r->last_heard_ms), kwc_format_duration(max, go, sizeof(go)));
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
            refl_list_start(r, r->synced);
            return;
        }
        refl_xfer_start(r, target, &discovery_cbs, false);
        free(target);
        break;
    }
    case R_LIST:
        refl_list_start(r, r->diff);
        break;
    case R_WATCH: /* a watch resumes from r->rv: the upstream's rv first */
    case R_PROBE:
        refl_probe_start(r);
        break;
    }
}

static void
step(struct refl *r, int delay_ms)
{
    struct timeval tv = {delay_ms / 1000, (delay_ms % 1000) * 1000};
    evtimer_add(r->timer, &tv);
}

void
refl_step(struct refl *r, int delay_ms)
{
    step(r, delay_ms);
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
        snprintf(
            err, errlen,
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
    r->d.api_version =
        r->d.group[0] ? xasprintf("%s/%s", r->d.group, r->d.version) : xstrdup(r->d.version);
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
    r->last_heard_ms = refl_now_ms(r);
    wframe_init(&r->wf, 0);
    pb_split_init(&r->pf, 0);
    refl_ingest_add(ing, r);
    *out = r;
    return 0;
}

void
refl_start(struct refl *r)
{
    if (r->started || r->ing->frozen)
        return;
    r->started = true;
    r->failed = false;
    r->fails = 0;
    r->heard_ever = false;
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
        log_info("cache %s: %s; its requests pass through; asking it again", r->label, r->last_err);
    }
    if (info.synced && strcmp(info.identity, r->identity) == 0 && kl > 4 &&
        strcmp(info.list_kind + kl - 4, "List") == 0 &&
        strcmp(info.api_version, r->d.api_version) == 0) {
        /* what discovery said last time: serve before it answers again */
        r->ever_synced = true;
        r->synced = true;
        r->rv = info.rv;
        r->d.namespaced = info.namespaced;
        set_kind(r, info.list_kind, kl - 4); /* a restart (refl_stop): what it had */
    }
    r->state = R_DISCOVER;
    r->last_heard_ms = refl_now_ms(r);
    struct timeval tick = {0, TICK_MS * 1000};
    event_add(r->tick, &tick);
    step(r, 0);
}

void
refl_stop(struct refl *r)
{
    if (!r->started)
        return;
    up_xfer_cancel(r->x);
    r->x = NULL;
    evtimer_del(r->timer);
    event_del(r->tick);
    evbuffer_drain(r->body, evbuffer_get_length(r->body));
    wframe_fini(&r->wf);
    wframe_init(&r->wf, 0);
    pb_split_fini(&r->pf);
    pb_split_init(&r->pf, 0);
    refl_diff_reset(r);
    free(r->cont);
    r->cont = NULL;
    /* not started first: a serving loop that reads it mid-stop does not
     * take the cache for one warming (refl_warming) */
    r->started = false;
    r->synced = false;
    r->refused = false;
    r->failed = false;
    r->parked = false;
    r->resetting = false;
    r->state = R_IDLE;
    r->backoff_ms = 0;
    r->last_err[0] = '\0';
    if (r->out == OUT_STALE) {
        r->out = OUT_NONE; /* it is not watched: nothing to be stale about */
        r->out_why[0] = '\0';
    }
    log_info("cache %s: stopped (its data stays on disk; the next request resumes it)", r->label);
}

void
refl_free(struct refl *r)
{
    if (!r)
        return;
    assert(r->magic == REFL_MAGIC);
    up_xfer_cancel(r->x);
    if (r->ing && r->body) /* registered (refl_new got that far) */
        refl_ingest_remove(r->ing, r);
    if (r->timer)
        event_free(r->timer);
    if (r->tick)
        event_free(r->tick);
    if (r->body)
        evbuffer_free(r->body);
    wframe_fini(&r->wf);
    pb_split_fini(&r->pf);
    refl_diff_reset(r);
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
    for (size_t i = 0; i < r->nold_names; i++)
        free(r->old_names[i]);
    free(r->old_names);
    free(r->label);
    r->magic = 0;
    free(r);
}

void
refl_want(struct refl *r)
{
    if (r->started || r->ing->frozen)
        return;
    if (!refl_ingest_on_loop(r->ing)) {
        /* a serving loop: the start (transfers on the main loop's upstream
         * client) is the main loop's; once per reflector until it runs */
        if (!atomic_exchange(&r->want_posted, true))
            refl_ingest_post_wants(r->ing);
        return;
    }
    log_info("cache %s: asked for by a request; starting it (requests pass through until it "
             "has synced)",
             r->label);
    r->wanted = true;
    refl_start(r);
}
