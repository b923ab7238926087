/*
 * srcmap_test.c — cache/srcmap.c: counts per source address, the limit,
 * and a table that holds only the sources counted now.
 *
 * The counts are checked against a plain array model under a long random
 * sequence of takes and releases (deterministic seed), with many sources
 * landing in the same slots (a seed of 0 and few slots), so the backward
 * shift on release is exercised across wrapped runs.
 */
#include "kwc/srcmap.h"

#include "tap.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static struct src_key
v4(uint8_t a, uint8_t b, uint8_t c, uint8_t d)
{
    struct src_key k;
    uint8_t ip[4] = {a, b, c, d};
    src_key_v4(&k, ip);
    return k;
}

static void
test_keys(void)
{
    struct src_key a = v4(10, 0, 0, 1), m;
    uint8_t mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1};
    src_key_v6(&m, mapped);
    ok(memcmp(&a, &m, sizeof(a)) == 0, "an IPv4-mapped IPv6 address is its IPv4 address");
    char t[SRC_KEY_TEXT];
    src_key_text(&a, t, sizeof(t));
    is_str(t, "10.0.0.1", "an IPv4 source as text");
    uint8_t lo[16] = {0};
    lo[15] = 1;
    struct src_key l;
    src_key_v6(&l, lo);
    ok(memcmp(&l, &a, sizeof(l)) != 0, "::1 is not 10.0.0.1");
    src_key_text(&l, t, sizeof(t));
    is_str(t, "0:0:0:0:0:0:0:1", "an IPv6 source as text");
    uint8_t compat[16] = {0};
    compat[12] = 10;
    compat[15] = 1;
    struct src_key c;
    src_key_v6(&c, compat);
    ok(memcmp(&c, &a, sizeof(c)) != 0, "::10.0.0.1 (not mapped) is another source");
}

static void
test_limit(void)
{
    struct srcmap *m = srcmap_new(42);
    struct src_key a = v4(127, 0, 0, 2), b = v4(127, 0, 0, 3);
    for (int i = 0; i < 3; i++)
        ok(srcmap_take(m, &a, 3), "a: under its limit");
    ok(!srcmap_take(m, &a, 3), "a: at its limit, refused");
    is_int(srcmap_count(m, &a), 3, "a refused is not counted");
    ok(srcmap_take(m, &b, 3), "b is not held back by a");
    is_int(srcmap_count(m, &b), 1, "b: one");
    srcmap_release(m, &a);
    ok(srcmap_take(m, &a, 3), "a: one released, one more taken");
    bool all = true;
    for (int i = 0; i < 100; i++)
        all &= srcmap_take(m, &b, 0);
    ok(all, "limit 0: every take counted");
    is_int(srcmap_count(m, &b), 101, "limit 0: no limit");
    is_int(srcmap_sources(m), 2, "two sources");
    for (int i = 0; i < 3; i++)
        srcmap_release(m, &a);
    for (int i = 0; i < 101; i++)
        srcmap_release(m, &b);
    is_int(srcmap_sources(m), 0, "every count back to 0: no source left");
    is_int(srcmap_count(m, &a), 0, "a: none");
    srcmap_free(m);
    srcmap_free(NULL);
}

/* Many sources come and go: the table holds the ones counted now. */
static void
test_bounded(void)
{
    struct srcmap *m = srcmap_new(7);
    size_t most = 0;
    for (unsigned round = 0; round < 50; round++) {
        /* 1000 new addresses each round, 10 connections each, then gone */
        for (unsigned i = 0; i < 1000; i++) {
            struct src_key k = v4(10, (uint8_t)round, (uint8_t)(i >> 8), (uint8_t)i);
            for (int j = 0; j < 10; j++)
                srcmap_take(m, &k, 0);
        }
        if (srcmap_slots(m) > most)
            most = srcmap_slots(m);
        for (unsigned i = 0; i < 1000; i++) {
            struct src_key k = v4(10, (uint8_t)round, (uint8_t)(i >> 8), (uint8_t)i);
            for (int j = 0; j < 10; j++)
                srcmap_release(m, &k);
        }
    }
    ok(most <= 4 * 1000, "slots: at most 4 x the sources counted at once");
    is_int(srcmap_sources(m), 0, "50,000 addresses later: none held");
    is_int(srcmap_slots(m), 16, "the table shrank back to its first size");
    srcmap_free(m);
}

/* Random takes and releases against a model; seed 0 and close addresses
 * put long runs in few slots. */
static void
test_model(void)
{
    enum { N = 64, STEPS = 200000 };
    unsigned model[N] = {0};
    struct srcmap *m = srcmap_new(0);
    unsigned long x = 12345;
    bool same = true;
    size_t most_sources = 0;
    for (int step = 0; step < STEPS && same; step++) {
        x = x * 6364136223846793005ul + 1442695040888963407ul;
        unsigned i = (unsigned)(x >> 33) % N;
        struct src_key k = v4(192, 168, (uint8_t)(i & 1), (uint8_t)i);
        bool take = ((x >> 20) & 3) != 0 || model[i] == 0;
        if (take) {
            bool got = srcmap_take(m, &k, 5);
            same &= got == (model[i] < 5);
            if (got)
                model[i]++;
        } else {
            srcmap_release(m, &k);
            model[i]--;
        }
        /* now and then, empty half of the sources (the table shrinks) */
        if (step % 5000 == 4999)
            for (unsigned j = 0; j < N; j += 2)
                while (model[j]) {
                    struct src_key kj = v4(192, 168, (uint8_t)(j & 1), (uint8_t)j);
                    srcmap_release(m, &kj);
                    model[j]--;
                }
        size_t live = 0;
        for (unsigned j = 0; j < N; j++)
            live += model[j] > 0;
        same &= srcmap_sources(m) == live;
        if (live > most_sources)
            most_sources = live;
        if (step % 97 == 0)
            for (unsigned j = 0; j < N; j++) {
                struct src_key kj = v4(192, 168, (uint8_t)(j & 1), (uint8_t)j);
                same &= srcmap_count(m, &kj) == model[j];
            }
    }
    ok(same, "200,000 random takes and releases: every count as the model's");
    ok(most_sources > N / 2, "the model filled the table past half its sources");
    srcmap_free(m);
}

int
main(void)
{
    TAP_RUN(test_keys);
    TAP_RUN(test_limit);
    TAP_RUN(test_bounded);
    TAP_RUN(test_model);
    return tap_done();
}
