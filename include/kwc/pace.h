/*
 * pace.h — when a watch worker writes what its rounds queued (watch.c).
 *
 * A worker applies each committed batch to its hub, which queues the event's
 * shared bytes on every watcher's stream; a flush then writes each dirty
 * stream once. Under light load that flush runs at once: an event leaves
 * within the round that applied it. Under load one write per watcher per
 * batch is most of kwc's CPU (a sendmsg of ~1 KiB to each socket, plus the
 * receiver's softirq on loopback), so a busy worker holds its dirty streams
 * for a short window and writes several events to each in one sendmsg.
 *
 * Busy means: a flush round costs a large share of the gap between batches.
 * The window is the flush cost divided by PACE_DUTY_PCT (flushes then take
 * at most that share of the worker's time), capped at the bound; when it
 * would not reach the next batch (batches further apart than the window),
 * holding gains nothing and the flush runs at once. The pace's bound (max_us,
 * --watch-coalesce-max-delay; PACE_MAX_US by default) is the most an event
 * waits for company: the latency this adds, at most (25 ms: a resource
 * changing 50 times a second, one batch every 20 ms, still fits two batches
 * in one write). A bound of 0 never holds: every event leaves in the round
 * that applied it.
 *
 * Pure: time is passed in (microseconds, any monotonic origin). Estimates are
 * moving averages, so one slow round or one burst does not flip the mode.
 */
#ifndef KWC_PACE_H
#define KWC_PACE_H

#include <stdint.h>

#define PACE_MAX_US 25000u /* the default bound: the longest a queued event waits */
#define PACE_DUTY_PCT 25u  /* flushing may take this share of a busy worker's time */

struct pace {
    uint64_t last_batch_us; /* when the last batch arrived (0: none yet) */
    uint64_t gap_us;        /* moving average of the gap between batches */
    uint64_t flush_us;      /* moving average of one flush round's cost */
    uint64_t max_us;        /* the bound: the window never exceeds it (0: never hold) */
};

/* max_us: the bound (PACE_MAX_US unless the operator set it; 0: never hold). */
void pace_init(struct pace *p, uint64_t max_us);
/* A batch arrived at now_us. */
void pace_batch(struct pace *p, uint64_t now_us);
/* A flush round of the dirty streams took took_us. */
void pace_flushed(struct pace *p, uint64_t took_us);
/* How long after the first write of a round its streams may wait before the
 * flush: 0 = flush now; never more than the bound. */
uint64_t pace_window_us(const struct pace *p);

#endif
