/*
 * reflector.h — one upstream LIST+WATCH per cached resource, feeding the LMDB
 * store (DESIGN.md "The data path": upstream -> reflector -> store).
 *
 *   discover (scope, kind) -> LIST in pages (limit=500) -> WATCH from the
 *   list's rv with allowWatchBookmarks -> on a dropped watch, re-watch from
 *   the last rv with jittered backoff -> on 410, relist and record the
 *   difference as ordinary events (ADDED/MODIFIED at each object's rv,
 *   DELETED at a free rv up to the list's: relist.h), so downstream watches
 *   continue.
 *
 * Events decoded from the watch are batched: one store write transaction per
 * loop turn for every resource (struct refl_ingest). A warm data dir is
 * served at once and the watch resumes from the stored rv.
 *
 * Threads: reflectors live on the main loop, which alone changes them. The
 * serving loops may call, from any thread: refl_serving, refl_started,
 * refl_warming, refl_synced, refl_counts_ready, refl_resetting, refl_desc
 * (struct refl_desc says what of it may change), refl_want (the start is
 * posted to the main loop), and read a struct refl_set. Each answer is
 * one state the main loop published a moment ago: a cache leaves service
 * (refl_serving false) before its data is dropped or rewritten, so a
 * reader that begins its store read transaction and then finds the cache
 * serving reads a snapshot from before any such change (the catalog's own
 * drops wait for the serving loops besides: catalog_set_quiesce). All else
 * (refl_status, refl_cache_state, refl_last_error, refl_out_why,
 * refl_heard_age, refl_counters, the refl_ingest_* calls) is main loop
 * only: /readyz and /metrics are rendered there.
 */
#ifndef KWC_REFLECTOR_H
#define KWC_REFLECTOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kwc/enc.h"
#include "kwc/object.h"

struct event_base;
struct up_client;
struct store;
struct store_res;
struct refl;
struct refl_ingest;

/* The reflectors' clock and random source: now_ms a monotonic clock in
 * milliseconds (retry and staleness decisions, ages in messages), rand a
 * uniform random number (retry jitter, watch timeouts). A NULL function is
 * the real one: CLOCK_MONOTONIC, rand(). Tests bring their own. */
struct refl_clock {
    uint64_t (*now_ms)(void *arg);
    uint32_t (*rand)(void *arg);
    void *arg;
};

/* What serving needs to know about a cached resource (valid once discovered).
 * Any thread: everything but kind, list_kind and namespaced is set by
 * refl_new and never changes; those three are set by discovery (the main
 * loop) as atomics, and a kind or list_kind replaced stays allocated while
 * the reflector lives (a reader holding the old one reads it safely; read
 * each once per request, as the two may change between two reads). */
struct refl_desc {
    enum kwc_enc enc; /* the cache's encoding: JSON text or protobuf object messages */
    char *group, *version, *resource; /* from --resources */
    char *path;                       /* "/api/v1/pods" or "/apis/apps/v1/deployments" */
    char *api_version;                /* "v1" or "apps/v1" */
    char *_Atomic kind, *_Atomic list_kind;
    atomic_bool namespaced;
    bool typed_items; /* list items carry kind/apiVersion (custom resources) */
    /* The selectable fields the cache's index bytes hold: kinds_fields for
     * JSON; for protobuf the ones pb.c can read (pb_fields), so a selector
     * on any other passes through (admit_serves_fields). */
    const struct obj_field *fields;
    const char **field_names;
    size_t n_fields;
    int index_field; /* field with a store index (store_scan_field), -1: none */
    struct store_res *sres;
};

/* The caches serving reads: a set that only grows while kwc runs (the
 * catalog adds caches on demand and never removes one, so index i names one
 * cache for good; a stopped or vanished resource's cache stays, not
 * started). r has cap entries, n of them set (per-cache arrays elsewhere
 * are sized by cap). Any thread reads it: r is allocated once with its cap
 * and never moved, r[i] is set before n passes i (n is stored with release
 * on the main loop; a read of n is an acquire), and a reflector of the set
 * is freed only with the set (catalog_free, once no serving loop runs). */
struct refl_set {
    struct refl **r;
    _Atomic size_t n;
    size_t cap;
};

/* A request wanted this cache: start it if it has not started (protobuf
 * caches outside --protobuf-resources start on their first request, which
 * passes through meanwhile). Any thread: from another than the main loop's,
 * the start is posted to the main loop (it runs there soon). */
void refl_want(struct refl *r);

/* What the reflectors of one loop share beyond the store. */
struct refl_ingest_options {
    const char *data_dir;      /* for messages (statvfs of a failed write) */
    uint64_t map_size;         /* --cache-map-size, for messages */
    uint64_t max_staleness_ms; /* without an upstream event or bookmark
                                before a cache leaves service; 0: never */
    struct refl_clock clock;   /* zero: the real clock and random source */
};

/* Shared by all reflectors of one loop: the batched store writer. */
int refl_ingest_new(struct event_base *base, struct store *st, const struct refl_ingest_options *o,
                    struct refl_ingest **out);
void refl_ingest_free(struct refl_ingest *ing);
/*
 * Subscribe to the writer: on_commit(arg) after every successful commit (the
 * store's rv may have moved), on_service(arg, r, serving) when a cache leaves
 * service (serving false) or comes back; either may be NULL. A cache leaves
 * service when a write fails (disk full, I/O error, map full), when a stored
 * value fails its checksum (it then rebuilds from a fresh list), or when it
 * is stale (--max-staleness); its requests pass through meanwhile and its
 * watchers should be ended so that they resume from the upstream.
 * Subscribers are called in the order they subscribed: whoever must see a
 * commit first subscribes first (app.c: requests waiting for an rv, then
 * watch streams). Not from inside a subscriber's callback.
 */
void refl_ingest_subscribe(struct refl_ingest *ing, void (*on_commit)(void *arg),
                           void (*on_service)(void *arg, const struct refl *r, bool serving),
                           void *arg);
/* Remove every subscription made with arg: no callback reaches arg after. */
void refl_ingest_unsubscribe(struct refl_ingest *ing, void *arg);

/*
 * The upstream's timeline (DESIGN.md "Trust in the upstream's timeline").
 *
 * refl_ingest_check_identity: check now, and again after every reconnect
 * (an attempt that got no answer or a 5xx), the upstream cluster's identity
 * (the kube-system namespace's uid, a LIST of namespaces with the field
 * selector metadata.name=kube-system)
 * against the one recorded in the store: none recorded, it is recorded;
 * another, every cache is reset (its watchers get a 410, its data and
 * history are dropped, those of caches not running too, and it lists
 * afresh). A watch resuming from a cache's rv waits for the answer. Not
 * allowed to read it (403) or no such namespace: said once, and only the
 * rv checks guard the cache. up borrowed, outlives ing.
 */
void refl_ingest_check_identity(struct refl_ingest *ing, struct up_client *up);
/* Caches reset because the upstream's rv went back (each cache counts),
 * and identity changes (each resets every cache, counted once). */
struct refl_resets {
    uint64_t rv_backwards, identity;
};
void refl_ingest_resets(const struct refl_ingest *ing, struct refl_resets *out);
/* The cache is rebuilding after a reset, from the moment the upstream's
 * change was seen until its fresh list completes: not serving, and its
 * watchers end with a 410 (watch_service_changed). */
bool refl_resetting(const struct refl *r);

/* Pure decisions. refl_rv_went_back: an rv seen from the upstream (a list,
 * an event, a bookmark) below what the cache holds (held 0: nothing held).
 * refl_id_decide: the recorded identity ("" none) against the upstream's.
 * refl_id_parse: metadata.uid of a Namespace, or of a NamespaceList's first
 * item (JSON), into uid (uidlen bytes, NUL-ended): 0, or KWC_EPARSE (none,
 * too long, not JSON). */
bool refl_rv_went_back(uint64_t held, uint64_t seen);
enum refl_id_verdict { REFL_ID_RECORD, REFL_ID_SAME, REFL_ID_CHANGED };
enum refl_id_verdict refl_id_decide(const char *recorded, const char *seen);
int refl_id_parse(const char *body, size_t len, char *uid, size_t uidlen);

/* A takeover (handover.h) froze the data dir: while frozen no reflector
 * starts (refl_start and refl_want do nothing) and the catalog drops no
 * data, so that another process may own the store. */
void refl_ingest_freeze(struct refl_ingest *ing, bool frozen);
bool refl_ingest_frozen(const struct refl_ingest *ing);

/* Call cb when the first discovery of a cache since kwc started finds that
 * the upstream has no such resource (or group version): a typo in
 * --resources. Without cb, or on later discoveries, it is retried with
 * backoff and reported by refl_last_error. An upstream that cannot be
 * reached is not this case. */
void refl_ingest_on_unknown(struct refl_ingest *ing,
                            void (*cb)(void *arg, const struct refl *r, const char *why),
                            void *arg);

/* Call cb after every failed attempt of any cache (before its backoff),
 * with the upstream's status (0: none, a transfer error): the catalog asks
 * discovery again when a cache's resource answers 404. */
void refl_ingest_on_retry(struct refl_ingest *ing,
                          void (*cb)(void *arg, const struct refl *r, int status), void *arg);

/* Parse "g/v/r" or "v/r" (core) into a new reflector (not started) filling
 * the cache of that resource in encoding enc (store resource "v1/pods:json",
 * "v1/pods:pb"). Returns 0, KWC_ECONFIG with a message for a person in err
 * (a malformed gvr; protobuf for a custom resource), or the store's error
 * (KWC_ETOOBIG: more resources than the store was opened for). */
int refl_new(struct event_base *base, struct up_client *up, struct refl_ingest *ing,
             const char *gvr, enum kwc_enc enc, const char *identity, struct refl **out, char *err,
             size_t errlen);
/* Start discovery, list and watch (a warm cache serves at once). Once. */
void refl_start(struct refl *r);
void refl_free(struct refl *r);
/* Stop: the upstream transfer and the timers end, the cache stops serving
 * (not synced) and its data stays in the store; refl_start resumes it (a
 * warm start from the stored rv). The catalog stops caches nobody uses. */
void refl_stop(struct refl *r);
/* Started and on its way to its first sync: no attempt has failed since
 * refl_start, it is in service, not refused and not rebuilding after an
 * upstream reset (refl_resetting: its requests pass through). A request that started it
 * may wait for it (the catalog's on-demand caches); it ends with a commit
 * that syncs it or a failure (refl_ingest's on_service(r, false)). */
bool refl_warming(const struct refl *r);

bool refl_synced(const struct refl *r);
/* Synced and in service: the cache may answer r's requests. A protobuf cache
 * the upstream does not serve in protobuf is not. */
bool refl_serving(const struct refl *r);
/* refl_start ran (at kwc's start, or on a request: refl_want). */
bool refl_started(const struct refl *r);
/* /readyz waits for this cache: started, and not a protobuf cache the
 * upstream does not serve in protobuf (kwc cannot fix that; its requests
 * pass through, and refl_last_error says why). */
bool refl_counts_ready(const struct refl *r);
/* Why the cache is out of service ("no space left on device in DIR: ..."),
 * NULL when it is not. Valid until the reflector's next step. */
const char *refl_out_why(const struct refl *r);
/* Why the last upstream attempt failed ("the upstream does not serve
 * v1/foos", "LIST /api/v1/pods answered 403", "the upstream does not serve
 * v1/pods in protobuf (application/json)"), NULL before any failed. */
const char *refl_last_error(const struct refl *r);
/* Valid while r lives; NULL fields until discovery succeeded. */
const struct refl_desc *refl_desc(const struct refl *r);
/* "/api/v1/pods: synced, watching, rv 4711, 12 events in, last upstream
 * event or bookmark 3 s ago" into buf; a protobuf cache's path is followed by
 * " (protobuf)". The state part says "stale (past --max-staleness N s), "
 * first for a stale cache, then what it does: "discovering", "listing",
 * "starting its watch", "watching", "backing off for N s (K failed attempts;
 * next in T s; last error: ...)", "not served in protobuf". */
void refl_status(const struct refl *r, char *buf, size_t len);

/*
 * A cache's state, for kwc_cache_state and /readyz: the first of these that
 * holds, in this order (X(enum, label)):
 *   stopped         not running: not started yet (a protobuf cache before its
 *                   first request) or stopped while idle (--cache-idle-timeout)
 *   unserved        the upstream does not serve it in protobuf (asked again
 *                   every 10 minutes; its requests pass through)
 *   out_of_service  a write failed or a stored value failed its checksum
 *                   (refl_out_why)
 *   stale           --max-staleness passed without an upstream event or
 *                   bookmark (out of service until one comes)
 *   backing_off     between failed attempts (the upstream away or failing)
 *   syncing         reading discovery or listing (the first list, a relist
 *                   after a 410, a rebuild: after an upstream reset too)
 *   watching        its upstream watch is open or being opened (the probe of
 *                   the upstream's rv before it included)
 */
#define REFL_CACHE_STATES(X)                                                                       \
    X(REFL_CS_STOPPED, "stopped")                                                                  \
    X(REFL_CS_UNSERVED, "unserved")                                                                \
    X(REFL_CS_OUT, "out_of_service")                                                               \
    X(REFL_CS_STALE, "stale")                                                                      \
    X(REFL_CS_BACKING_OFF, "backing_off")                                                          \
    X(REFL_CS_SYNCING, "syncing")                                                                  \
    X(REFL_CS_WATCHING, "watching")
enum refl_cache_state {
#define REFL_CS_ENUM(e, label) e,
    REFL_CACHE_STATES(REFL_CS_ENUM)
#undef REFL_CS_ENUM
        REFL_CS_COUNT
};
enum refl_cache_state refl_cache_state(const struct refl *r);
/* "backing_off": the label of kwc_cache_state's state. */
const char *refl_cache_state_label(enum refl_cache_state s);
/* Seconds since the upstream last spoke to the cache (an event, a bookmark,
 * a completed list) into *age_s; false when it has not since the cache
 * started (warm from the data dir, or the upstream away from the start),
 * and for a stopped cache. */
bool refl_heard_age(const struct refl *r, double *age_s);

/* Counters for /metrics (loop thread). */
struct refl_counters {
    uint64_t lists;          /* LISTs started from their first page (initial, relists, retries) */
    uint64_t relists;        /* ...of a cache that had synced: after a 410, a rebuild */
    uint64_t expired;        /* upstream 410s: a watch too old (a relist follows), a continue
                                token expired (the list restarts) */
    uint64_t watches;        /* upstream WATCHes started */
    uint64_t watch_restarts; /* ...after the first */
    uint64_t errors[3];      /* failed attempts, each followed by a backoff: discovery, list,
                                watch (a failed write of the watch's events counts as watch) */
    uint64_t events_in;      /* ADDED/MODIFIED/DELETED events from the upstream watch */
    /* Gauges. The base of the next retry's delay after a failure (refl_backoff):
     * 0 at start and once the cache recovered (a list completed, or the
     * watch has been open refl_watch_healthy long, so that its drop retries
     * at once); failures in a row double it. */
    uint64_t backoff_ms;
    uint64_t retry_ms; /* the delay of the last retry after a failure; 0: none yet */
};
void refl_counters(const struct refl *r, struct refl_counters *out);

/*
 * The retry policy (pure; the reflector applies it with its refl_clock).
 *
 * refl_backoff: the delay before the retry after a failure, from the base
 * *backoff_ms (0: the least, 500 ms) with +-50 % jitter from rnd (delay in
 * [base/2, 3*base/2]), never past 30 s; then doubles *backoff_ms, up to 30 s.
 *
 * refl_watch_healthy: a watch open since opened_ms (now now_ms) for 10 s or
 * more is healthy: it starts the backoff over (its drop is news, not the
 * outage going on).
 *
 * refl_stale: no upstream event or bookmark since heard_ms for more than
 * max_staleness_ms (0: never stale).
 */
int refl_backoff(int *backoff_ms, uint32_t rnd);
bool refl_watch_healthy(uint64_t opened_ms, uint64_t now_ms);
bool refl_stale(uint64_t heard_ms, uint64_t now_ms, uint64_t max_staleness_ms);

#endif
