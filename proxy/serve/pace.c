/*
 * pace.c — the flush window of a watch worker (see pace.h).
 */
#include "kwc/pace.h"

/* A gap longer than this counts as this: an idle minute must not take many
 * batches to forget, nor overflow the average. */
#define GAP_CAP_US 1000000u

void
pace_init(struct pace *p, uint64_t max_us)
{
    p->max_us = max_us;
    p->last_batch_us = 0;
    p->gap_us = GAP_CAP_US; /* nothing known: light load */
    p->flush_us = 0;
}

void
pace_batch(struct pace *p, uint64_t now_us)
{
    if (p->last_batch_us) {
        uint64_t g = now_us > p->last_batch_us ? now_us - p->last_batch_us : 0;
        if (g > GAP_CAP_US)
            g = GAP_CAP_US;
        p->gap_us = p->gap_us - p->gap_us / 8 + g / 8; /* an eighth of each new gap */
    }
    p->last_batch_us = now_us ? now_us : 1;
}

void
pace_flushed(struct pace *p, uint64_t took_us)
{
    if (took_us > GAP_CAP_US)
        took_us = GAP_CAP_US;
    p->flush_us = p->flush_us - p->flush_us / 4 + took_us / 4; /* a quarter of each round */
}

uint64_t
pace_window_us(const struct pace *p)
{
    uint64_t w = p->flush_us * 100 / PACE_DUTY_PCT;
    if (w > p->max_us)
        w = p->max_us;
    /* the next batch would not come inside it: nothing to gain by waiting
     * (and a bound of 0 never holds, back to back batches included) */
    return w && w >= p->gap_us ? w : 0;
}
