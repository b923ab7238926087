/*
 * catalog.h — which caches kwc runs (issue 30). It owns the reflectors and
 * the set serving reads (struct refl_set: it only grows, so an index names
 * one cache for good).
 *
 * Two modes:
 *  - explicit (--resources LIST): a JSON cache per entry, started with kwc
 *    and required by /readyz, and for a built-in resource a protobuf cache,
 *    started with kwc when --protobuf-resources names it, else by its first
 *    protobuf request. Nothing else is ever cached.
 *  - auto (the default): any resource the upstream's discovery (disco.h)
 *    lists with the verbs list and watch, not in an aggregated API and not
 *    excluded (--resources-exclude), gets a cache in the encoding a request
 *    asks for at its first list, get or watch (catalog_want), while fewer
 *    than --max-caches run (a stopped one keeps its slot in the set and
 *    resumes in it; the set holds every resource ever cached); the protobuf caches
 * --protobuf-resources names start as soon as discovery has answered. None is required by /readyz.
 * A cache nobody read and nobody watched for --cache-idle-timeout stops (its data stays on disk, it
 * resumes from its rv at its next request); the data of stopped caches is kept within
 * --cache-disk-budget, the least recently used dropped first. A resource that leaves discovery (a
 * CRD deleted, a version no longer served) has its cache stopped, its watchers ended as kube ends
 * them, and its data dropped.
 *
 * Threads. The catalog lives on the main loop (the thread that made it: the
 * reflectors', the writer's and discovery's), which alone changes it. The
 * serving loops (app.c) may call, from any thread: catalog_set (and read
 * the set: reflector.h's struct refl_set), catalog_auto, catalog_may_cache,
 * catalog_want, catalog_pending, catalog_missed, catalog_discovering,
 * catalog_warming and catalog_required. Off the main loop, catalog_want
 * posts to the main loop what only it may do (start a cache; make one:
 * CATALOG_PENDING) and the main loop tells catalog_subscribe's subscribers
 * once it is done. Everything else is main loop only; on the main loop each
 * call behaves as it always did (decides and starts at once). No call
 * holds a lock across I/O or a callback; the set, the slots and discovery
 * are read without one (atomics; discovery's model under a read lock).
 *
 * What the main loop does under a serving loop: a cache stops (idle, a
 * takeover's freeze, its resource gone, an upstream reset) by leaving
 * service first (refl_serving false: a request that has not looked yet
 * passes through); store reads are LMDB snapshots, so a read begun before
 * sees the data as it was; and the data of a stopped cache is dropped
 * (--cache-disk-budget, its resource gone) only once every serving loop
 * has passed a turn since (catalog_set_quiesce), so that a request that saw
 * it serving a moment before does not find it emptied in the same turn.
 * A reflector is never freed before catalog_free, which runs once no
 * serving loop does.
 */
#ifndef KWC_CATALOG_H
#define KWC_CATALOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kwc/enc.h"

struct event_base;
struct up_client;
struct refl_ingest;
struct refl_set;
struct store;
struct disco;
struct catalog;

struct catalog_options {
    bool auto_mode;
    const char *resources; /* explicit: the list */
    const char *exclude;   /* auto: --resources-exclude (NULL or "": none) */
    const char *protobuf;  /* --protobuf-resources; NULL: KINDS_PB_DEFAULT; "none" */
    unsigned max_caches;   /* auto: caches running at once at most */
    uint64_t idle_ms;      /* auto: --cache-idle-timeout; 0: never */
    uint64_t disk_budget;  /* auto: --cache-disk-budget, bytes */
    const char *identity;  /* the upstream's, recorded with the data */
};

/* Build the catalog. Explicit mode creates its caches here (not started);
 * disco is required in auto mode (borrowed; it may be NULL in explicit
 * mode). Returns 0, or KWC_ECONFIG/the store's error with a message for a
 * person in err. */
int catalog_new(struct event_base *base, struct up_client *up, struct refl_ingest *ing,
                struct store *st, struct disco *disco, const struct catalog_options *o,
                struct catalog **out, char *err, size_t errlen);
/* Start what starts with kwc (explicit: the list; auto: the protobuf
 * defaults once discovery has answered). */
void catalog_start(struct catalog *c);
void catalog_free(struct catalog *c);

/* A takeover (handover.h): every running cache stops (requests pass
 * through), nothing starts and nothing is written or dropped until
 * catalog_thaw, which restarts those that ran (the takeover failed). */
void catalog_freeze(struct catalog *c);
void catalog_thaw(struct catalog *c);

const struct refl_set *catalog_set(const struct catalog *c);
bool catalog_auto(const struct catalog *c);

/* Could kwc answer a read of group/version/resource from a cache (one it
 * has, or one it would start)? The front authorizes such reads itself. */
bool catalog_may_cache(const struct catalog *c, const char *group, const char *version,
                       const char *resource);
/*
 * A request would be answered from the cache of group/version/resource in
 * enc: find that cache, in auto mode starting it (a new one, a stopped one)
 * when the resource may be cached, and mark it used now. Returns its index
 * in the set, or -1 (not cached: the request passes through).
 *
 * Any thread. Off the main loop the start is posted: a cache to be started
 * reads as warming (catalog_warming) from the call on, until the main loop
 * has started it (it warms) or refused (--max-caches reached, frozen: it
 * does not); a cache with no slot yet returns CATALOG_PENDING, and the main
 * loop makes it (or refuses) soon: the caller waits (catalog_pending) and
 * asks again when told (catalog_subscribe).
 */
#define CATALOG_PENDING (-2)
int catalog_want(struct catalog *c, const char *group, const char *version, const char *resource,
                 enum kwc_enc enc);
/* A creation catalog_want posted for group/version/resource (any
 * encoding) has not been carried out yet. Any thread; a short lock. */
/* The slot of group/version/resource in enc, or -1; nothing started,
 * made or posted (a request asking again after a posted want: a refused
 * creation is not asked for twice). Any thread. */
int catalog_find(const struct catalog *c, const char *group, const char *version,
                 const char *resource, enum kwc_enc enc);
bool catalog_pending(struct catalog *c, const char *group, const char *version,
                     const char *resource);
/* Main loop: on_change(arg) runs on the main loop after each want a serving
 * loop posted was carried out (a slot made, a cache started, or the start
 * refused), so that requests waiting for it look again (front.h's
 * front_caches_changed, relayed to each serving loop). */
void catalog_subscribe(struct catalog *c, void (*on_change)(void *arg), void *arg);
void catalog_unsubscribe(struct catalog *c, void *arg);
/*
 * Main loop: how the catalog knows that every serving loop has moved on.
 * Before it drops a stopped cache's data, the catalog calls fn(arg, done,
 * done_arg); fn must have done(done_arg) called on the main loop once every
 * serving loop has passed a turn since (e.g. post a no-op to each and call
 * done when all have run), exactly once, and before catalog_free. One round
 * at a time covers every drop asked meanwhile. Without a hook (the
 * default) done runs at once, inside the call.
 */
void catalog_set_quiesce(struct catalog *c,
                         void (*fn)(void *arg, void (*done)(void *done_arg), void *done_arg),
                         void *arg);
/* A read of a resource kwc may not cache (catalog_may_cache said no): if
 * discovery does not list it, discovery is asked again soon (a CRD created
 * since), rate-limited by disco_refresh_soon. */
void catalog_missed(struct catalog *c, const char *group, const char *version,
                    const char *resource);
/* Auto mode: discovery has not answered yet, so whether a resource may be
 * cached is unknown; a read may wait for it (as for a warming cache). */
bool catalog_discovering(const struct catalog *c);
/* Cache i is on its way to its first sync (refl_warming): a request may
 * wait for it, up to --cache-start-timeout. */
bool catalog_warming(const struct catalog *c, size_t i);
/* /readyz: cache i is required (explicit mode's), not one started on demand. */
bool catalog_required(const struct catalog *c, size_t i);

/* Whether cache i has watchers now (the watch pool's count), asked before
 * an idle cache is stopped. */
void catalog_set_busy(struct catalog *c, bool (*busy)(void *arg, size_t i), void *arg);
/* Ends the watch streams of cache i (its resource left discovery), as the
 * watch pool ends those of a cache out of service. */
void catalog_set_end(struct catalog *c, void (*end)(void *arg, size_t i), void *arg);

/* Counters for /metrics. */
struct catalog_stats {
    size_t caches;        /* in the set */
    size_t running;       /* started */
    uint64_t started;     /* caches started on demand (new or resumed) */
    uint64_t idle_stops;  /* stopped for --cache-idle-timeout */
    uint64_t dropped;     /* stopped caches whose data went for the disk budget */
    uint64_t vanished;    /* caches whose resource left discovery */
    uint64_t refused_max; /* requests that found --max-caches reached */
};
void catalog_stats(const struct catalog *c, struct catalog_stats *out);

#endif
