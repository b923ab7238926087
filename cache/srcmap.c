/*
 * srcmap.c — a count per source address (see srcmap.h).
 *
 * Linear probing with backward-shift deletion (no tombstones: a table whose
 * sources come and go never fills with dead slots). The load stays at or
 * below 1/2, so a probe is short; the table doubles past 1/2 and halves
 * below 1/8 (never under SRCMAP_MIN_SLOTS), which keeps its memory in
 * proportion to the sources counted now.
 */
#include "kwc/srcmap.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"

#define SRCMAP_MIN_SLOTS 16

struct slot {
    struct src_key k;
    unsigned n; /* 0: empty */
};

struct srcmap {
    struct slot *s;
    size_t cap; /* a power of two */
    size_t len; /* slots in use */
    uint64_t seed;
};

static const uint8_t v4_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

void
src_key_v4(struct src_key *k, const uint8_t a[4])
{
    memcpy(k->b, v4_prefix, sizeof(v4_prefix));
    memcpy(k->b + 12, a, 4);
}

void
src_key_v6(struct src_key *k, const uint8_t a[16])
{
    memcpy(k->b, a, 16);
}

void
src_key_text(const struct src_key *k, char *out, size_t len)
{
    const uint8_t *b = k->b;
    if (memcmp(b, v4_prefix, sizeof(v4_prefix)) == 0) {
        snprintf(out, len, "%u.%u.%u.%u", b[12], b[13], b[14], b[15]);
        return;
    }
    snprintf(out, len, "%x:%x:%x:%x:%x:%x:%x:%x", b[0] << 8 | b[1], b[2] << 8 | b[3],
             b[4] << 8 | b[5], b[6] << 8 | b[7], b[8] << 8 | b[9], b[10] << 8 | b[11],
             b[12] << 8 | b[13], b[14] << 8 | b[15]);
}

/* A 64-bit finaliser (splitmix64's) over both halves, keyed by the seed. */
static uint64_t
mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static size_t
slot_of(const struct srcmap *m, const struct src_key *k)
{
    uint64_t lo, hi;
    memcpy(&lo, k->b, 8);
    memcpy(&hi, k->b + 8, 8);
    return (size_t)(mix(mix(lo ^ m->seed) ^ hi) & (m->cap - 1));
}

/* The slot holding k, or the empty slot where it would go. */
static size_t
find(const struct srcmap *m, const struct src_key *k)
{
    size_t i = slot_of(m, k);
    while (m->s[i].n && memcmp(&m->s[i].k, k, sizeof(*k)) != 0)
        i = (i + 1) & (m->cap - 1);
    return i;
}

static void
resize(struct srcmap *m, size_t cap)
{
    struct slot *old = m->s;
    size_t ocap = m->cap;
    m->s = xcalloc(cap, sizeof(*m->s));
    m->cap = cap;
    for (size_t i = 0; i < ocap; i++)
        if (old[i].n)
            m->s[find(m, &old[i].k)] = old[i];
    free(old);
}

struct srcmap *
srcmap_new(uint64_t seed)
{
    struct srcmap *m = xcalloc(1, sizeof(*m));
    m->seed = seed;
    m->cap = SRCMAP_MIN_SLOTS;
    m->s = xcalloc(m->cap, sizeof(*m->s));
    return m;
}

void
srcmap_free(struct srcmap *m)
{
    if (!m)
        return;
    free(m->s);
    free(m);
}

unsigned
srcmap_count(const struct srcmap *m, const struct src_key *k)
{
    return m->s[find(m, k)].n;
}

bool
srcmap_take(struct srcmap *m, const struct src_key *k, unsigned limit)
{
    size_t i = find(m, k);
    if (m->s[i].n) {
        if (limit && m->s[i].n >= limit)
            return false;
        m->s[i].n++;
        return true;
    }
    if ((m->len + 1) * 2 > m->cap) {
        resize(m, m->cap * 2);
        i = find(m, k);
    }
    m->s[i].k = *k;
    m->s[i].n = 1;
    m->len++;
    return true;
}

void
srcmap_release(struct srcmap *m, const struct src_key *k)
{
    size_t i = find(m, k);
    assert(m->s[i].n > 0);
    if (--m->s[i].n)
        return;
    /* backward shift: move later members of the run into the hole when
     * their home slot does not lie (cyclically) between the hole and them */
    size_t mask = m->cap - 1, hole = i, j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!m->s[j].n)
            break;
        size_t home = slot_of(m, &m->s[j].k);
        bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
        if (stays)
            continue;
        m->s[hole] = m->s[j];
        m->s[j].n = 0;
        hole = j;
    }
    m->s[hole].n = 0;
    m->len--;
    if (m->cap > SRCMAP_MIN_SLOTS && m->len * 8 < m->cap)
        resize(m, m->cap / 2);
}

size_t
srcmap_sources(const struct srcmap *m)
{
    return m->len;
}

size_t
srcmap_slots(const struct srcmap *m)
{
    return m->cap;
}
