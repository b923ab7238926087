/*
 * reflector_reset.c — a reflector's trust in the upstream's timeline
 * (DESIGN.md "Trust in the upstream's timeline"; reflector_int.h).
 *
 * rvs from one upstream only grow. One that goes back means the upstream
 * is not the one the cache was filled from any more (etcd restored from a
 * backup, a cluster rebuilt behind the same address): nothing the cache
 * holds may be served or resumed from. Where it is seen:
 *   - a LIST (a quorum read: kwc never lists with an rv) whose rv is below
 *     the cache's: a relist after a 410, or a rebuild (reflector_list.c);
 *   - a probe before every watch resumes from the cache's rv (a warm start,
 *     a watch that ended, cleanly or not): LIST limit=1, one object, the
 *     upstream's current rv. A restarted upstream at a lower rv may well
 *     accept a watch from a future rv and stay silent until its rvs pass
 *     it, and then the two histories mix; the probe sees it first. Its cost
 *     is one small request per cache per re-watch (client-go's 5-10 minute
 *     watch timeouts: a few a minute for 20 caches), and one per reconnect;
 *   - an event or bookmark below the cache's rv on a watch: the watch ends
 *     and the probe decides (a misbehaving upstream costs a backoff, not a
 *     reset).
 * The reset: the cache stops serving at once (requests pass through, its
 * watchers end with a 410 so that their clients relist), its pending
 * writes, data and history are dropped, and it lists afresh.
 * Loop thread only.
 */
#include "reflector_int.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"
#include "kwc/log.h"
#include "kwc/object.h"
#include "kwc/store.h"

bool
refl_rv_went_back(uint64_t held, uint64_t seen)
{
    return held > 0 && seen < held;
}

bool
refl_resetting(const struct refl *r)
{
    return r->resetting;
}

void
refl_reset(struct refl *r, bool identity, uint64_t seen, uint64_t held, const char *why)
{
    struct refl_ingest *ing = r->ing;
    if (identity) {
        snprintf(r->reset_why, sizeof(r->reset_why), "the upstream is another cluster");
    } else {
        ing->resets.rv_backwards++;
        snprintf(r->reset_why, sizeof(r->reset_why),
                 "the upstream's resourceVersion went back: %llu seen, %llu held",
                 (unsigned long long)seen, (unsigned long long)held);
        log_warnx("cache %s: the upstream's resourceVersion went back: %llu seen, the cache "
                  "holds %llu%s%s%s: a restored or replaced upstream; dropping the cache (its "
                  "watchers get 410 Expired, its requests pass through) and listing afresh",
                  r->label, (unsigned long long)seen, (unsigned long long)held, why ? " (" : "",
                  why ? why : "", why ? ")" : "");
    }
    up_xfer_cancel(r->x);
    r->x = NULL;
    evtimer_del(r->timer);
    r->parked = false;
    refl_ingest_drop(ing, r);
    bool was = refl_serving(r);
    r->resetting = r->started; /* a cache not running starts from its (empty) store */
    r->synced = false;
    refl_diff_reset(r);
    free(r->cont);
    r->cont = NULL;
    r->diff = false;
    r->got_410 = false;
    if (was) /* its watchers get a 410 (refl_resetting), its requests pass through */
        refl_ingest_notify_service(ing, r, false);
    if (!identity) {
        int rc = store_res_clear(ing->st, r->d.sres);
        if (rc)
            log_error("cache %s: dropping its data failed: %s (the fresh list replaces it)",
                      r->label, kwc_strerror(rc));
        /* the store's rv went down: the watch pool follows it */
        refl_ingest_notify_commit(ing);
    }
    r->rv = 0;
    if (r->started) {
        r->state = R_LIST;
        refl_step(r, 0);
    }
}

/* An event or bookmark at an rv below the cache's: the upstream went back,
 * or misbehaves. The watch ends (nothing of it stored) and the probe before
 * the next one decides (reflector_reset.c), after a backoff. */
bool
refl_watch_went_back(struct refl *r, uint64_t rv, const char *what)
{
    if (!refl_rv_went_back(r->rv, rv))
        return false;
    char why[256];
    snprintf(why, sizeof(why), "the upstream's watch sent %s at rv %llu, below the cache's %llu",
             what, (unsigned long long)rv, (unsigned long long)r->rv);
    up_xfer_cancel(r->x);
    r->x = NULL;
    refl_ingest_drop(r->ing, r); /* this watch's events are not to be trusted either */
    r->rv = store_res_rv(r->ing->st, r->d.sres, NULL);
    refl_retry(r, "cache watch failed: an rv below the cache's", why);
    return true;
}

/* ---- the probe ---- */

static void
on_probe_done(void *arg, int err, const char *msg)
{
    struct refl *r = arg;
    r->x = NULL;
    if (err)
        refl_ingest_lost(r->ing);
    char why[512];
    if (err || r->too_big || r->status != 200) {
        char what[300], st[384];
        snprintf(what, sizeof(what), "LIST %s?limit=1 (the upstream's resourceVersion)", r->d.path);
        refl_status_why(r, what, st, sizeof(st));
        if (err || r->too_big)
            snprintf(why, sizeof(why), "%s failed: %s", what, err ? msg : "answer too large");
        else
            snprintf(why, sizeof(why), "%s", st);
        char cause[160];
        refl_xfer_cause(r, "probe", err, cause, sizeof(cause));
        refl_retry(r, cause, why);
        return;
    }
    struct obj_list l;
    char perr[256] = "";
    size_t len = evbuffer_get_length(r->body);
    int rc = obj_list_init(&l, (const char *)evbuffer_pullup(r->body, -1), len, perr, sizeof(perr));
    uint64_t seen = l.rv;
    obj_list_fini(&l);
    if (rc) {
        snprintf(why, sizeof(why), "LIST %s?limit=1: %s", r->d.path, perr);
        refl_retry(r, NULL, why);
        return;
    }
    if (refl_rv_went_back(r->rv, seen)) {
        refl_reset(r, false, seen, r->rv, NULL);
        return;
    }
    if (refl_ingest_identity_wait(r->ing)) {
        r->parked = true;
        return;
    }
    refl_watch_start(r);
}

static const struct up_xfer_cbs probe_cbs = {
    .on_headers = refl_on_xfer_headers, .on_data = refl_on_body_data, .on_done = on_probe_done};

void
refl_probe_start(struct refl *r)
{
    r->state = R_PROBE;
    char *target = xasprintf("%s?limit=1", r->d.path);
    refl_xfer_start(r, target, &probe_cbs, false);
    free(target);
}

void
refl_unpark(struct refl *r)
{
    if (!r->parked)
        return;
    r->parked = false;
    if (r->started && !r->x && r->state == R_PROBE)
        refl_watch_start(r);
}
