/*
 * ttlcache.c — answers that expire and the questions in flight (see
 * ttlcache.h).
 *
 * Two chained hash tables over the same key bytes (FNV-1a; the callers'
 * keys are SHA-256 digests, so no caller picks a bucket): the entries, with
 * an age list (oldest first) for eviction, and the fetches in flight, each
 * with its waiters in arrival order. Both grow by doubling when they hold as
 * many nodes as buckets.
 *
 * Invariants: a fetch is in its table exactly while it has not ended and
 * has not been dropped; only an ended fetch puts a value, so a dropped one
 * never does; a fetch in flight has a waiter whenever control is back in
 * the loop (ttlc_leave drops it when its last one goes).
 */
#include "kwc/ttlcache.h"

#include <assert.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include "kwc/base.h"

#define TTLC_MAGIC 0x74746c63u  /* "ttlc" */
#define FETCH_MAGIC 0x66746368u /* "ftch" */

/* ---- a chained table of nodes keyed by bytes ---- */

struct node {
    struct node *next; /* bucket chain */
    uint64_t hash;
    size_t klen;
    const unsigned char *key; /* in the node's container */
};

struct tab {
    struct node **b;
    size_t nb, n;
};

static uint64_t
fnv1a(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static void
tab_init(struct tab *t)
{
    t->nb = 64;
    t->b = xcalloc(t->nb, sizeof(*t->b));
    t->n = 0;
}

static struct node *
tab_get(const struct tab *t, const void *key, size_t klen)
{
    uint64_t h = fnv1a(key, klen);
    for (struct node *e = t->b[h & (t->nb - 1)]; e; e = e->next)
        if (e->hash == h && e->klen == klen && (klen == 0 || memcmp(e->key, key, klen) == 0))
            return e;
    return NULL;
}

static void
tab_put(struct tab *t, struct node *e)
{
    if (t->n >= t->nb) {
        size_t nb = t->nb * 2;
        struct node **b = xcalloc(nb, sizeof(*b));
        for (size_t i = 0; i < t->nb; i++) {
            for (struct node *x = t->b[i], *nx; x; x = nx) {
                nx = x->next;
                x->next = b[x->hash & (nb - 1)];
                b[x->hash & (nb - 1)] = x;
            }
        }
        free(t->b);
        t->b = b;
        t->nb = nb;
    }
    struct node **head = &t->b[e->hash & (t->nb - 1)];
    e->next = *head;
    *head = e;
    t->n++;
}

/* Unlink e (does not free it). */
static void
tab_remove(struct tab *t, struct node *e)
{
    struct node **pp = &t->b[e->hash & (t->nb - 1)];
    while (*pp != e)
        pp = &(*pp)->next;
    *pp = e->next;
    t->n--;
}

/* ---- the cache ---- */

struct ent {
    struct node n; /* first: the table's node */
    TAILQ_ENTRY(ent) age;
    double expires;
    void *value;
    unsigned char key[];
};

struct ttlc_fetch {
    struct node n; /* first: keyed in c->flight */
    uint32_t magic;
    struct ttlc *c;
    void *ctx;
    bool ended; /* out of flight: its waiters are being answered */
    struct ttlc_wait *head, *tail;
    unsigned char key[];
};

struct ttlc {
    uint32_t magic;
    size_t max;
    ttlc_free_cb free_value;
    struct tab ents, flight;
    TAILQ_HEAD(, ent) ages; /* oldest first */
};

struct ttlc *
ttlc_new(size_t max_entries, ttlc_free_cb free_value)
{
    assert(max_entries >= 1);
    struct ttlc *c = xcalloc(1, sizeof(*c));
    c->magic = TTLC_MAGIC;
    c->max = max_entries;
    c->free_value = free_value;
    tab_init(&c->ents);
    tab_init(&c->flight);
    TAILQ_INIT(&c->ages);
    return c;
}

static void
ent_drop(struct ttlc *c, struct ent *e)
{
    tab_remove(&c->ents, &e->n);
    TAILQ_REMOVE(&c->ages, e, age);
    if (c->free_value && e->value)
        c->free_value(e->value);
    free(e);
}

void
ttlc_free(struct ttlc *c)
{
    if (!c)
        return;
    assert(c->magic == TTLC_MAGIC);
    assert(c->flight.n == 0);
    struct ent *e;
    while ((e = TAILQ_FIRST(&c->ages)))
        ent_drop(c, e);
    free(c->ents.b);
    free(c->flight.b);
    c->magic = 0;
    free(c);
}

size_t
ttlc_count(const struct ttlc *c)
{
    return c->ents.n;
}

void *
ttlc_get(struct ttlc *c, const void *key, size_t klen, double now)
{
    assert(c->magic == TTLC_MAGIC);
    struct ent *e = (struct ent *)tab_get(&c->ents, key, klen);
    if (!e)
        return NULL;
    if (e->expires <= now) {
        ent_drop(c, e);
        return NULL;
    }
    return e->value;
}

/* Room for one more under max: an expired entry among the oldest first,
 * else the oldest. */
static void
make_room(struct ttlc *c, double now)
{
    while (c->ents.n >= c->max) {
        struct ent *e = TAILQ_FIRST(&c->ages), *victim = e;
        for (int i = 0; e && i < TTLC_EVICT_SCAN; i++, e = TAILQ_NEXT(e, age)) {
            if (e->expires <= now) {
                victim = e;
                break;
            }
        }
        ent_drop(c, victim);
    }
}

void
ttlc_put(struct ttlc *c, const void *key, size_t klen, void *value, double ttl, double now)
{
    assert(c->magic == TTLC_MAGIC);
    if (!value || ttl <= 0) {
        if (c->free_value && value)
            c->free_value(value);
        return;
    }
    struct ent *old = (struct ent *)tab_get(&c->ents, key, klen);
    if (old)
        ent_drop(c, old);
    make_room(c, now);
    struct ent *e = xmalloc(sizeof(*e) + (klen ? klen : 1));
    if (klen)
        memcpy(e->key, key, klen);
    e->n.hash = fnv1a(key, klen);
    e->n.klen = klen;
    e->n.key = e->key;
    e->expires = now + ttl;
    e->value = value;
    tab_put(&c->ents, &e->n);
    TAILQ_INSERT_TAIL(&c->ages, e, age);
}

/* ---- fetches in flight ---- */

struct ttlc_fetch *
ttlc_fetch_find(const struct ttlc *c, const void *key, size_t klen)
{
    assert(c->magic == TTLC_MAGIC);
    return (struct ttlc_fetch *)tab_get(&c->flight, key, klen);
}

struct ttlc_fetch *
ttlc_fetch_begin(struct ttlc *c, const void *key, size_t klen, void *ctx)
{
    assert(c->magic == TTLC_MAGIC);
    assert(!tab_get(&c->flight, key, klen));
    struct ttlc_fetch *f = xcalloc(1, sizeof(*f) + (klen ? klen : 1));
    if (klen)
        memcpy(f->key, key, klen);
    f->n.hash = fnv1a(key, klen);
    f->n.klen = klen;
    f->n.key = f->key;
    f->magic = FETCH_MAGIC;
    f->c = c;
    f->ctx = ctx;
    tab_put(&c->flight, &f->n);
    return f;
}

struct ttlc_fetch *
ttlc_fetch_any(const struct ttlc *c)
{
    assert(c->magic == TTLC_MAGIC);
    for (size_t i = 0; i < c->flight.nb; i++)
        if (c->flight.b[i])
            return (struct ttlc_fetch *)c->flight.b[i];
    return NULL;
}

void *
ttlc_fetch_ctx(const struct ttlc_fetch *f)
{
    assert(f->magic == FETCH_MAGIC);
    return f->ctx;
}

void
ttlc_join(struct ttlc_fetch *f, struct ttlc_wait *w)
{
    assert(f->magic == FETCH_MAGIC && !f->ended);
    w->fetch = f;
    w->next = NULL;
    w->prev = f->tail;
    if (f->tail)
        f->tail->next = w;
    else
        f->head = w;
    f->tail = w;
}

static void
unlink_wait(struct ttlc_fetch *f, struct ttlc_wait *w)
{
    if (w->prev)
        w->prev->next = w->next;
    else
        f->head = w->next;
    if (w->next)
        w->next->prev = w->prev;
    else
        f->tail = w->prev;
    w->fetch = NULL;
    w->next = w->prev = NULL;
}

void *
ttlc_leave(struct ttlc_wait *w)
{
    struct ttlc_fetch *f = w->fetch;
    assert(f && f->magic == FETCH_MAGIC);
    unlink_wait(f, w);
    if (f->head || f->ended)
        return NULL;
    /* No one waits any more: drop the fetch, cache nothing. */
    void *ctx = f->ctx;
    tab_remove(&f->c->flight, &f->n);
    f->magic = 0;
    free(f);
    return ctx;
}

void
ttlc_fetch_end(struct ttlc_fetch *f, void *value, double ttl, double now)
{
    assert(f->magic == FETCH_MAGIC && !f->ended);
    tab_remove(&f->c->flight, &f->n);
    f->ended = true;
    ttlc_put(f->c, f->key, f->n.klen, value, ttl, now);
}

struct ttlc_wait *
ttlc_fetch_pop(struct ttlc_fetch *f)
{
    assert(f->magic == FETCH_MAGIC && f->ended);
    struct ttlc_wait *w = f->head;
    if (w)
        unlink_wait(f, w);
    return w;
}

void
ttlc_fetch_free(struct ttlc_fetch *f)
{
    if (!f)
        return;
    assert(f->magic == FETCH_MAGIC && f->ended && !f->head);
    f->magic = 0;
    free(f);
}
