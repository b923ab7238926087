/*
 * relist.h — the difference between the cache and a fresh upstream list, as
 * events (DESIGN.md "Storage"): after a 410 the reflector relists and records
 * what changed as ordinary events, so that downstream watches stay open
 * instead of every client relisting at once.
 *
 *   an object the list has and the cache has not      ADDED at its own rv
 *   an object the list has at another rv than cached  MODIFIED at its own rv
 *   an object the list has at the cached rv           nothing
 *   an object the cache has and the list has not      DELETED (its last state)
 *                                                     at an rv of its own
 *
 * Every event lands at an rv above the cache's, no two at one rv when the
 * upstream's rvs leave room (relist_finish), and the events come out in rv
 * order: a watcher sees them in order and resuming from any of them misses
 * none of the rest (tests/integration/17_relist_order.py).
 *
 * Pure: no store, no clock, no I/O. The reflector feeds it every item of the
 * new list with what the cache holds under that key (relist_listed), then
 * every object the cache holds (relist_stored), then asks for the verdict and
 * the events (relist_finish, relist_events) and writes them.
 */
#ifndef KWC_RELIST_H
#define KWC_RELIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kwc/store.h"

struct relist;

/* One object, borrowed for the call: its key ("ns/name" or "name"), its own
 * rv, its bytes as stored and its index bytes (kwc/index.h). */
struct relist_obj {
    const char *key;
    size_t key_len;
    uint64_t rv;
    const void *obj;
    size_t obj_len;
    const void *idx;
    size_t idx_len;
};

/* One event to record (owned by the relist, valid until relist_free). */
struct relist_event {
    enum store_ev_type type;
    uint64_t rv;
    char *key;
    size_t key_len;
    char *obj; /* DELETED: the cache's last state of the object */
    size_t obj_len;
    char *idx;
    size_t idx_len;
};

/* What relist_finish found. */
enum relist_verdict {
    RELIST_OK,     /* the events are placed and sorted */
    RELIST_BEHIND, /* the list's rv is below the cache's: the upstream went back */
    RELIST_PASSED, /* the list has an object at an rv the cache already passed
                      with another state of it (a restored etcd, an event the
                      cache never got): not tellable in rv order */
};

struct relist_outcome {
    /* RELIST_OK: deletions left at the list's rv because the upstream's rvs
     * left no free one between the cache's rv and the list's */
    size_t crowded;
    /* RELIST_PASSED: the first such object (valid until relist_free) */
    const char *key;
    size_t key_len;
    uint64_t rv;
};

/* A new difference against the list taken at list_rv (the list's
 * metadata.resourceVersion). */
struct relist *relist_new(uint64_t list_rv);
void relist_free(struct relist *d);

/* One item of the new list (copied as needed). have_cur: the cache holds an
 * object under the same key, at cur_rv. */
void relist_listed(struct relist *d, const struct relist_obj *item, bool have_cur, uint64_t cur_rv);

/* One object the cache holds, after the last relist_listed (any order): if the
 * list had no item with its key, a DELETED carrying o's bytes. */
void relist_stored(struct relist *d, const struct relist_obj *o);

/* Check the difference against the cache's rv (cache_rv) and, when it fits,
 * give each deletion the highest rv in (cache_rv, list_rv] that no other
 * event holds, counting down from list_rv (any that find none stay at
 * list_rv: out->crowded), and sort the events by rv. out may be NULL. */
enum relist_verdict relist_finish(struct relist *d, uint64_t cache_rv, struct relist_outcome *out);

/* The events (*n of them): in rv order after RELIST_OK from relist_finish;
 * valid until relist_free. */
const struct relist_event *relist_events(const struct relist *d, size_t *n);

#endif
