/*
 * relist.c — the difference between the cache and a fresh upstream list, as
 * events (see relist.h). Owns copies of the list's keys (to find what it no
 * longer has) and of every event's bytes. Pure: no store, no clock.
 */
#include "kwc/relist.h"

#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"

struct relist {
    uint64_t list_rv;
    char **seen; /* the list's keys; sorted once relist_stored asks */
    size_t nseen, capseen;
    bool sorted;
    struct relist_event *ev;
    size_t nev, capev;
};

static int
cmp_key(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int
cmp_event_rv(const void *a, const void *b)
{
    const struct relist_event *x = a, *y = b;
    return x->rv < y->rv ? -1 : x->rv > y->rv;
}

static int
cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

struct relist *
relist_new(uint64_t list_rv)
{
    struct relist *d = xcalloc(1, sizeof(*d));
    d->list_rv = list_rv;
    return d;
}

void
relist_free(struct relist *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->nseen; i++)
        free(d->seen[i]);
    free(d->seen);
    for (size_t i = 0; i < d->nev; i++) {
        free(d->ev[i].key);
        free(d->ev[i].obj);
        free(d->ev[i].idx);
    }
    free(d->ev);
    free(d);
}

static void
add_event(struct relist *d, enum store_ev_type type, uint64_t rv, const struct relist_obj *o)
{
    if (d->nev == d->capev) {
        d->capev = d->capev ? 2 * d->capev : 64;
        d->ev = xrealloc(d->ev, d->capev * sizeof(*d->ev));
    }
    d->ev[d->nev++] = (struct relist_event){.type = type,
                                            .rv = rv,
                                            .key = xstrndup(o->key, o->key_len),
                                            .key_len = o->key_len,
                                            .obj = xmemdup(o->obj, o->obj_len),
                                            .obj_len = o->obj_len,
                                            .idx = xmemdup(o->idx, o->idx_len),
                                            .idx_len = o->idx_len};
}

void
relist_listed(struct relist *d, const struct relist_obj *item, bool have_cur, uint64_t cur_rv)
{
    if (d->nseen == d->capseen) {
        d->capseen = d->capseen ? 2 * d->capseen : 1024;
        d->seen = xrealloc(d->seen, d->capseen * sizeof(char *));
    }
    d->seen[d->nseen++] = xstrndup(item->key, item->key_len);
    d->sorted = false;
    if (have_cur && cur_rv == item->rv)
        return; /* unchanged */
    add_event(d, have_cur ? STORE_MODIFIED : STORE_ADDED, item->rv, item);
}

void
relist_stored(struct relist *d, const struct relist_obj *o)
{
    if (!d->sorted) {
        if (d->nseen > 1) /* qsort(NULL, 0, ...) is undefined */
            qsort(d->seen, d->nseen, sizeof(char *), cmp_key);
        d->sorted = true;
    }
    char *k = xstrndup(o->key, o->key_len);
    bool seen = d->nseen && bsearch(&k, d->seen, d->nseen, sizeof(char *), cmp_key) != NULL;
    free(k);
    if (!seen)
        add_event(d, STORE_DELETED, d->list_rv, o);
}

/*
 * Give each deletion an rv of its own. Every deleted object went away at some
 * rv in (from_rv, list_rv] that no surviving object of the resource holds as
 * its own rv (one write, one rv), so there are as many such rvs as deletions:
 * take the highest, counting down from the list's rv. A watcher then sees
 * every event of the relist at an rv of its own, in order, and resuming from
 * any of them misses none of the rest. An upstream whose rvs do not work that
 * way leaves the remainder at the list's rv (counted in crowded).
 */
static size_t
place_deletions(struct relist *d, uint64_t from_rv)
{
    uint64_t *used = xmalloc((d->nev + 1) * sizeof(*used));
    size_t nu = 0, crowded = 0;
    for (size_t i = 0; i < d->nev; i++)
        if (d->ev[i].type != STORE_DELETED)
            used[nu++] = d->ev[i].rv;
    if (nu > 1)
        qsort(used, nu, sizeof(*used), cmp_u64);
    uint64_t slot = d->list_rv;
    size_t u = nu;
    for (size_t i = 0; i < d->nev; i++) {
        struct relist_event *p = &d->ev[i];
        if (p->type != STORE_DELETED)
            continue;
        while (slot > from_rv) {
            while (u > 0 && used[u - 1] > slot)
                u--;
            if (u > 0 && used[u - 1] == slot) {
                slot--;
                continue;
            }
            break;
        }
        if (slot > from_rv) {
            p->rv = slot--;
        } else {
            p->rv = d->list_rv;
            crowded++;
        }
    }
    free(used);
    return crowded;
}

enum relist_verdict
relist_finish(struct relist *d, uint64_t cache_rv, struct relist_outcome *out)
{
    struct relist_outcome o = {0};
    enum relist_verdict v = RELIST_OK;
    if (d->list_rv < cache_rv) {
        v = RELIST_BEHIND;
        goto out;
    }
    for (size_t i = 0; i < d->nev; i++) {
        if (d->ev[i].type != STORE_DELETED && d->ev[i].rv <= cache_rv) {
            o.key = d->ev[i].key;
            o.key_len = d->ev[i].key_len;
            o.rv = d->ev[i].rv;
            v = RELIST_PASSED;
            goto out;
        }
    }
    o.crowded = place_deletions(d, cache_rv);
    if (d->nev > 1) /* qsort(NULL, 0, ...) is undefined */
        qsort(d->ev, d->nev, sizeof(*d->ev), cmp_event_rv);
out:
    if (out)
        *out = o;
    return v;
}

const struct relist_event *
relist_events(const struct relist *d, size_t *n)
{
    *n = d->nev;
    return d->ev;
}
