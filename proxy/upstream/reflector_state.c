/*
 * reflector_state.c — what a reflector tells of itself (see reflector.h):
 * the state the serving loops read from any thread (refl_serving,
 * refl_started, refl_warming, refl_counts_ready, refl_synced, refl_desc:
 * atomics, reflector_int.h), and the main loop's reports for /readyz and
 * /metrics (refl_status, refl_cache_state, refl_counters and the rest:
 * they read what only the main loop may, main loop only).
 */
#include "reflector_int.h"

#include <event2/event.h>
#include <stdio.h>

#include "kwc/base.h"

bool
refl_warming(const struct refl *r)
{
    /* a cache rebuilding after an upstream reset is not waited for: its
     * requests pass through until it is back */
    return r->started && !r->synced && r->out == OUT_NONE && !r->refused && !r->failed &&
           !r->resetting;
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

/* Between failed attempts: the retry's timer runs, no transfer. */
static bool
backing_off(const struct refl *r)
{
    return r->started && r->fails && !r->x && evtimer_pending(r->timer, NULL);
}

enum refl_cache_state
refl_cache_state(const struct refl *r)
{
    if (!r->started)
        return REFL_CS_STOPPED;
    if (r->refused)
        return REFL_CS_UNSERVED;
    if (r->out == OUT_WRITE || r->out == OUT_DAMAGED)
        return REFL_CS_OUT;
    if (r->out == OUT_STALE)
        return REFL_CS_STALE;
    if (backing_off(r))
        return REFL_CS_BACKING_OFF;
    return r->state == R_WATCH || r->state == R_PROBE ? REFL_CS_WATCHING : REFL_CS_SYNCING;
}

const char *
refl_cache_state_label(enum refl_cache_state s)
{
    static const char *const labels[] = {
#define REFL_CS_LABEL(e, label) label,
        REFL_CACHE_STATES(REFL_CS_LABEL)
#undef REFL_CS_LABEL
    };
    return (unsigned)s < REFL_CS_COUNT ? labels[s] : "unknown";
}

bool
refl_heard_age(const struct refl *r, double *age_s)
{
    if (!r->started || !r->heard_ever)
        return false;
    *age_s = refl_secs_since(r, r->last_heard_ms);
    return true;
}

void
refl_status(const struct refl *r, char *buf, size_t len)
{
    static const char *const states[] = {"idle", "discovering", "listing", "watching",
                                         "checking the upstream's resourceVersion"};
    uint64_t now = refl_now_ms(r);
    char state[768], heard[96], stale[64] = "", dur[32];
    if (r->out == OUT_STALE)
        snprintf(stale, sizeof(stale), "stale (past --max-staleness %s), ",
                 kwc_format_duration(r->ing->max_staleness_ms, dur, sizeof(dur)));
    if (r->refused)
        snprintf(state, sizeof(state), "not served in protobuf");
    else if (backing_off(r))
        /* between attempts: say so, and why, not the step it will retry */
        snprintf(state, sizeof(state),
                 "backing off for %.0f s (%u failed attempt%s; next in %.1f s; last error: %s)",
                 refl_secs_since(r, r->fail_since_ms), r->fails, r->fails == 1 ? "" : "s",
                 r->next_try_ms > now ? (double)(r->next_try_ms - now) / 1000.0 : 0.0,
                 r->last_err[0] ? r->last_err : "unknown");
    else if (r->state == R_WATCH && !(r->x && r->status == 200))
        snprintf(state, sizeof(state), "starting its watch");
    else if (r->parked)
        snprintf(state, sizeof(state), "waiting for the upstream's identity");
    else
        snprintf(state, sizeof(state), "%s", states[r->state]);
    char pre[sizeof(r->reset_why) + 48] = ""; /* it serves nothing meanwhile (passes through) */
    if (r->resetting)
        snprintf(pre, sizeof(pre), "rebuilding after an upstream reset (%s): ", r->reset_why);
    if (r->heard_ever)
        snprintf(heard, sizeof(heard), "last upstream event or bookmark %.0f s ago",
                 refl_secs_since(r, r->last_heard_ms));
    else
        snprintf(heard, sizeof(heard), "nothing heard from the upstream yet");
    snprintf(buf, len, "%s%s: %s, %s%s%s, rv %llu, %llu events in, %s",
             r->d.api_version[0] ? r->d.path : "", r->d.enc == KWC_ENC_PB ? " (protobuf)" : "",
             !r->started ? "not started"
             : r->synced ? "synced"
                         : "not synced",
             stale, pre, state, (unsigned long long)r->rv, (unsigned long long)r->events_in, heard);
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
refl_counters(const struct refl *r, struct refl_counters *out)
{
    *out = r->ctr;
    out->events_in = r->events_in;
    /* a watch open long enough starts the backoff over when it drops
     * (on_watch_done): say so while it is open */
    bool healthy = r->state == R_WATCH && r->x && r->status == 200 &&
                   refl_watch_healthy(r->watch_t0_ms, refl_now_ms(r));
    out->backoff_ms = healthy ? 0 : (uint64_t)r->backoff_ms;
}
