/*
 * pace_test.c — proxy/serve/pace.c: when a watch worker flushes (pace.h).
 *
 * Time is passed in: a worker's life is played as batches at given
 * intervals and flush rounds of given costs, then the window is read.
 */
#include "kwc/pace.h"

#include "tap.h"

/* n batches gap_us apart, each followed by a flush round of flush_us
 * (the rounds a worker flushing at once runs); returns the clock after. */
static uint64_t
play(struct pace *p, uint64_t t, int n, uint64_t gap_us, uint64_t flush_us)
{
    for (int i = 0; i < n; i++) {
        t += gap_us;
        pace_batch(p, t);
        pace_flushed(p, flush_us);
    }
    return t;
}

static void
test_fresh(void)
{
    struct pace p;
    pace_init(&p, PACE_MAX_US);
    is_int(pace_window_us(&p), 0, "nothing known: flush at once");
    pace_batch(&p, 5);
    pace_flushed(&p, 100000);
    is_int(pace_window_us(&p), 0, "one costly round after the first batch: no gap known yet");
}

static void
test_light(void)
{
    struct pace p;
    pace_init(&p, PACE_MAX_US);
    /* 100 batches/s, a flush of 1 ms (a few hundred watchers): 10 % busy */
    play(&p, 1, 200, 10000, 1000);
    is_int(pace_window_us(&p), 0, "flushes a small share of the gap: at once (latency unchanged)");
    /* one idle second then a burst: still at once */
    struct pace q;
    pace_init(&q, PACE_MAX_US);
    play(&q, 1, 50, 1000000, 200);
    is_int(pace_window_us(&q), 0, "rare batches: at once");
}

static void
test_busy(void)
{
    struct pace p;
    pace_init(&p, PACE_MAX_US);
    /* 50 batches/s, a flush of 10 ms (5,000 watchers): half the worker's time */
    play(&p, 1, 200, 20000, 10000);
    is_int(pace_window_us(&p), PACE_MAX_US, "busy: held for the window, capped at PACE_MAX_US");
    /* 200 batches/s, a flush of 2 ms: window = 2 ms / 25 % = 8 ms, beyond the 5 ms gap */
    struct pace q;
    pace_init(&q, PACE_MAX_US);
    play(&q, 1, 200, 5000, 2000);
    is_int(pace_window_us(&q), 8000, "the window is the flush cost over the duty share");
    /* batches back to back (several in one wake) */
    struct pace r;
    pace_init(&r, PACE_MAX_US);
    play(&r, 1, 200, 0, 1000);
    is_int(pace_window_us(&r), 1000 * 100 / PACE_DUTY_PCT, "back to back: held");
}

static void
test_never_beyond_max(void)
{
    struct pace p;
    pace_init(&p, PACE_MAX_US);
    uint64_t t = 1;
    for (uint64_t flush = 1; flush < 10000000; flush *= 3) {
        t = play(&p, t, 20, 0, flush);
        ok(pace_window_us(&p) <= PACE_MAX_US, "never beyond PACE_MAX_US");
    }
    t = play(&p, t, 1, 0, UINT64_MAX / 2); /* a clock gone mad */
    ok(pace_window_us(&p) <= PACE_MAX_US, "a huge round: still capped");
}

/* The operator's bound (--watch-coalesce-max-delay): the window never passes
 * it, above or below PACE_MAX_US; 0 never holds however busy the worker. */
static void
test_bound(void)
{
    struct pace p;
    pace_init(&p, 10000);
    /* busy as in test_busy: the default bound would hold 25 ms */
    play(&p, 1, 200, 20000, 10000);
    is_int(pace_window_us(&p), 0, "a 10 ms bound below the 20 ms gap: at once (no gain)");
    pace_init(&p, 10000);
    play(&p, 1, 200, 5000, 10000);
    is_int(pace_window_us(&p), 10000, "a 10 ms bound: held 10 ms, not 25");
    pace_init(&p, 1000000);
    play(&p, 1, 200, 20000, 10000);
    is_int(pace_window_us(&p), 10000 * 100 / PACE_DUTY_PCT,
           "a 1 s bound: the window is the flush cost over the duty share, past PACE_MAX_US");
    uint64_t t = 1;
    for (uint64_t flush = 1; flush < 10000000; flush *= 3) {
        t = play(&p, t, 20, 0, flush);
        ok(pace_window_us(&p) <= 1000000, "never beyond the bound");
    }

    struct pace z;
    pace_init(&z, 0);
    is_int(pace_window_us(&z), 0, "bound 0, fresh: at once");
    play(&z, 1, 200, 20000, 10000);
    is_int(pace_window_us(&z), 0, "bound 0, busy: at once");
    play(&z, 1, 200, 0, 1000);
    is_int(pace_window_us(&z), 0, "bound 0, batches back to back: at once");
    play(&z, 1, 20, 0, UINT64_MAX / 2);
    is_int(pace_window_us(&z), 0, "bound 0, a huge round: at once");
}

static void
test_moves_back(void)
{
    struct pace p;
    pace_init(&p, PACE_MAX_US);
    uint64_t t = play(&p, 1, 200, 20000, 10000);
    ok(pace_window_us(&p) > 0, "busy");
    /* one cheap round does not flip it */
    pace_flushed(&p, 10);
    ok(pace_window_us(&p) > 0, "one cheap round: still busy");
    /* the load goes: rare batches, cheap rounds */
    t = play(&p, t, 60, 500000, 300);
    is_int(pace_window_us(&p), 0, "load gone: at once again");
    /* and comes back */
    play(&p, t, 200, 20000, 10000);
    is_int(pace_window_us(&p), PACE_MAX_US, "load back: held again");
}

static void
test_clock_backwards(void)
{
    struct pace p;
    pace_init(&p, PACE_MAX_US);
    pace_batch(&p, 1000000);
    pace_batch(&p, 10); /* never goes back, but must not wrap */
    ok(p.gap_us < 1000000, "a gap from a clock going back counts as none");
}

int
main(void)
{
    TAP_RUN(test_fresh);
    TAP_RUN(test_light);
    TAP_RUN(test_busy);
    TAP_RUN(test_never_beyond_max);
    TAP_RUN(test_bound);
    TAP_RUN(test_moves_back);
    TAP_RUN(test_clock_backwards);
    return tap_done();
}
