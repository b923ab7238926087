/*
 * passthrough_test.c — proxy/serve/passthrough.c: the budget of response bytes
 * queued to passthrough clients (pt_budget_should_pause), by its contract in
 * passthrough.h, and the bound it gives when many clients never read.
 */
#include "kwc/passthrough.h"

#include "kwc/base.h"
#include "tap.h"

#include <stdlib.h>
#include <string.h>

static void
test_decision(void)
{
    /* under half the budget nobody pauses, however much one holds */
    ok(!pt_budget_should_pause(100, 100, 50, 1, 2000), "under half the budget: go on");
    ok(!pt_budget_should_pause(950, 900, 50, 2, 2000), "exactly at half: go on");
    /* past it, a holder past an even share of the half pauses ... */
    ok(pt_budget_should_pause(1000, 300, 50, 4, 2000), "over: a holder past max/2/holders pauses");
    /* ... one under its share does not */
    ok(!pt_budget_should_pause(1000, 100, 50, 4, 2000), "over: a small holder goes on");
    ok(!pt_budget_should_pause(1000, 200, 50, 4, 2000), "over: up to its share");
    ok(pt_budget_should_pause(1000, 201, 50, 4, 2000), "over: one byte past its share");
    /* nothing queued: no drain would resume it, so it never pauses */
    ok(!pt_budget_should_pause(5000, 0, 65536, 10, 2000), "holding nothing: go on");
    /* one holder alone takes half the budget, not more */
    ok(!pt_budget_should_pause(900, 900, 100, 1, 2000), "alone: up to half");
    ok(pt_budget_should_pause(900, 900, 101, 1, 2000), "alone: past it");
}

/*
 * 300 clients that never read and one that does, against a budget smaller
 * than their per-client buffers added up: the upstream keeps offering reads
 * of 64 KiB to every transfer that is not paused. They arrive a few per
 * round, so the first ones fill their whole buffers before the budget is
 * reached (the case that decides the bound).
 */
#define NCLIENTS 300
#define READ_SZ 65536
#define PER_CLIENT (1u << 20)

static void
test_flood(void)
{
    const size_t max = 32u << 20;
    size_t held[NCLIENTS + 1];
    bool paused[NCLIENTS + 1];
    memset(held, 0, sizeof(held));
    memset(paused, 0, sizeof(paused));
    size_t total = 0, holders = 0, reader_got = 0;
    for (int round = 0; round < 200; round++) {
        for (int i = 0; i <= NCLIENTS; i++) {
            bool reader = i == NCLIENTS;
            if (!reader && i > 3 * round)
                continue; /* not arrived yet */
            if (reader) { /* it reads everything it was sent */
                total -= held[i];
                holders -= held[i] > 0;
                held[i] = 0;
                paused[i] = false; /* its queue drained: on_drain resumes it */
            }
            if (paused[i] || held[i] > PER_CLIENT)
                continue;
            if (pt_budget_should_pause(total, held[i], READ_SZ, holders, max)) {
                paused[i] = true;
                continue;
            }
            holders += held[i] == 0;
            held[i] += READ_SZ;
            total += READ_SZ;
            reader_got += reader ? READ_SZ : 0;
        }
        ok(total <= max + (size_t)(NCLIENTS + 1) * READ_SZ,
           "the total stays within the budget and one read per client");
    }
    size_t sum = 0;
    unsigned npaused = 0;
    for (int i = 0; i < NCLIENTS; i++) {
        sum += held[i];
        npaused += paused[i];
    }
    is_int(sum + held[NCLIENTS], total, "bookkeeping");
    ok(total <= max + (size_t)(NCLIENTS + 1) * READ_SZ, "in the end too");
    ok(total < (size_t)NCLIENTS * PER_CLIENT / 4, "far below what the per-client buffers allow");
    ok(npaused > NCLIENTS / 2, "most non-readers are paused");
    is_int(reader_got, 200 * READ_SZ, "the client that reads got a read every round");
}

int
main(void)
{
    TAP_RUN(test_decision);
    TAP_RUN(test_flood);
    return tap_done();
}
