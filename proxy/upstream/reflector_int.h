/*
 * reflector_int.h — private to proxy/upstream: one reflector's state (struct
 * refl) and the steps its files share. reflector.c holds the lifecycle,
 * the transfers, discovery, the watch, the service state and the driving
 * timers; reflector_list.c the LIST pages, the relist's glue to the pure
 * difference (cache/relist.c) and the decoding of one object;
 * reflector_state.c the state it tells. Loop thread only, but for what
 * reflector.h names any-thread (below: which fields those read).
 */
#ifndef KWC_UPSTREAM_REFLECTOR_INT_H
#define KWC_UPSTREAM_REFLECTOR_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kwc/object.h"
#include "kwc/pb.h"
#include "kwc/reflector.h"
#include "kwc/upstream.h"

#include "ingest.h"

struct evbuffer;
struct event;
struct relist;

/* R_PROBE: a LIST limit=1 for the upstream's current rv before a watch
 * resumes from the cache's (reflector_reset.c) */
enum refl_state { R_IDLE, R_DISCOVER, R_LIST, R_WATCH, R_PROBE };

enum refl_out { OUT_NONE, OUT_STALE, OUT_WRITE, OUT_DAMAGED }; /* stronger later */

/*
 * Threads: a reflector lives on the main loop (the loop of its ingest) and
 * only that loop changes it. The serving loops read what reflector.h says
 * they may (refl_serving, refl_started, refl_warming, refl_counts_ready,
 * refl_synced, refl_resetting, refl_desc; refl_want posts): the fields
 * behind those are atomics (each read is one value the main loop wrote; two
 * of them may straddle a change, as two reads a moment apart would), and
 * refl_desc's kind and list_kind are replaced, never freed while r lives.
 */
struct refl {
    uint32_t magic;
    struct event_base *base;
    struct up_client *up;
    struct refl_ingest *ing;
    struct refl_desc d;
    char *label;                /* "pods", "pods (protobuf)": logs */
    const struct pb_field *pbf; /* protobuf: the fields read (d.fields mirrors them) */
    struct obj_field *own_fields;
    atomic_bool started;     /* refl_start ran (protobuf caches may wait for a request) */
    atomic_bool wanted;      /* started by a request (refl_want), not at kwc's start */
    bool discovered;         /* discovery has answered once (found or not) */
    bool discovery_failed;   /* an attempt failed before any answer (upstream away) */
    atomic_bool ever_synced; /* synced at least once since kwc started */
    atomic_bool refused;     /* protobuf: the upstream does not serve it so (last_err) */
    atomic_bool failed;      /* an attempt failed since refl_start, before a sync */
    bool wrong_type;         /* this transfer's 200 came in another Content-Type */
    char got_type[96];       /* ...which one, for the message */
    char *identity;
    char *typemeta; /* `{"kind":K,"apiVersion":V,` as the watch writes it */
    size_t typemeta_len;
    enum refl_state state;
    struct up_xfer *x;
    int status;
    struct evbuffer *body; /* discovery / LIST page */
    bool too_big;
    struct event *timer; /* next step */
    int backoff_ms;
    /* LIST */
    bool diff; /* relist after 410: record differences as events */
    char *cont;
    uint64_t list_rv;
    struct relist *rl; /* diff: the difference so far (from the first page) */
    uint64_t listed, listed_bytes;
    uint64_t list_t0_ms, last_progress_ms;
    /* WATCH */
    struct wframe_splitter wf; /* JSON */
    struct pb_splitter pf;     /* protobuf */
    uint64_t rv;               /* last rv seen (events, bookmarks, list) */
    bool got_410;
    uint64_t watch_t0_ms;
    atomic_bool synced;
    uint64_t events_in;
    /* service */
    _Atomic(enum refl_out) out;
    char out_why[512];
    uint64_t last_heard_ms; /* the last upstream event or bookmark, or list end */
    bool heard_ever;        /* ...since refl_start: once, last_heard_ms means something */
    /* failed attempts in a row (reset when an attempt succeeds: a list
     * completes, a watch stays healthy), since when, the next try */
    unsigned fails;
    uint64_t fail_since_ms, next_try_ms;
    uint64_t free_at_fail; /* free bytes on the data dir when a write failed */
    char last_err[512];    /* why the last attempt failed, for /readyz */
    struct event *tick;
    struct refl_counters ctr; /* for /metrics (refl_counters) */
    /* the upstream's timeline (reflector_reset.c) */
    atomic_bool resetting; /* rebuilding after a reset, until its fresh list completes */
    bool parked;           /* probed, waiting for the upstream's identity (cluster.c) */
    char reset_why[160];   /* what the reset saw, for /readyz */
    /* refl_desc's kind and list_kind strings replaced since refl_new: a
     * serving loop may still hold one (freed by refl_free) */
    char **old_names;
    size_t nold_names;
    atomic_bool want_posted; /* refl_want from a serving loop: its start is posted */
};

/* Key, rv and index bytes of one object, and its list-item form. */
struct refl_decoded {
    char *key;
    size_t key_len;
    uint64_t rv;
    char *idx;
    size_t idx_len;
    const char *obj; /* points into the input, or into own */
    size_t obj_len;
    char *own;
};

/* ---- reflector.c ---- */

/* The reflectors' clock (refl_clock): now, and seconds since t0_ms. */
uint64_t refl_now_ms(const struct refl *r);
double refl_secs_since(const struct refl *r, uint64_t t0_ms);
/* A failed attempt (why: for a person, logged and kept for /readyz): retry
 * the same step after the backoff (refl_backoff). cause: the same text for
 * every cache that fails so (refl_xfer_cause), the key under which an
 * outage's retries are logged once per cause and interval (log_repeat);
 * NULL: why itself (a cause of this cache's own). */
void refl_retry(struct refl *r, const char *cause, const char *why);
/* The cause of a failed transfer in phase ("discovery", "list", "watch"),
 * the same for every cache: "cache watch failed: Connection refused",
 * "cache list failed: the upstream answered 503". */
void refl_xfer_cause(const struct refl *r, const char *phase, int err, char *buf, size_t len);
/* A LIST or WATCH asked for protobuf got another type (got) or a 406. */
void refl_refuse(struct refl *r, const char *got);
/* An upstream answer other than 200 to what (e.g. "LIST /api/v1/pods"), for
 * a person, into buf. */
void refl_status_why(const struct refl *r, const char *what, char *buf, size_t len);
/* A write of r's own failed with rc: out of service if the disk or map. */
void refl_store_failed(struct refl *r, int rc);
/* Start a GET of target with cbs (r as their arg); on failure, retry later. */
void refl_xfer_start(struct refl *r, const char *target, const struct up_xfer_cbs *cbs,
                     bool long_running);
/* The up_xfer_cbs every transfer shares: the status and type of the
 * answer; a body collected into r->body up to its bound. */
int refl_on_xfer_headers(void *arg, int status, const struct up_header *h, size_t n);
int refl_on_body_data(void *arg, const char *p, size_t n);
/* The upstream answered: not stale. */
void refl_heard(struct refl *r);
/* An attempt succeeded (a list completed, a watch stayed healthy): the
 * backoff and the run of failures start over. */
void refl_recovered(struct refl *r);
/* Back in service if what kept it out was out. */
void refl_set_in(struct refl *r, enum refl_out out);
/* WATCH from r->rv. */
void refl_watch_start(struct refl *r);
/* The next step (the current state's) after delay_ms. */
void refl_step(struct refl *r, int delay_ms);

/* ---- reflector_reset.c ---- */

/* Before a watch resumes from r->rv: LIST limit=1 (a quorum read, cheap)
 * for the upstream's current rv; below r->rv, the upstream went back
 * (refl_reset), else the watch starts (once the upstream's identity is
 * known: cluster.c). */
void refl_probe_start(struct refl *r);
/* The upstream's timeline changed: r stops serving at once (its watchers
 * end with a 410), its pending writes are dropped, and (started) it lists
 * afresh. identity: every cache is reset by cluster.c, which drops the
 * data and counts it once; else the rv went back (seen below held): r's
 * data is dropped here, logged and counted. why (may be NULL): what showed
 * it, for the log and /readyz. */
void refl_reset(struct refl *r, bool identity, uint64_t seen, uint64_t held, const char *why);
/* An event or bookmark (what) of the open watch at rv: below the cache's,
 * the watch ends (its pending events dropped) and the probe before the next
 * one decides after a backoff; true then (stop reading the stream). */
bool refl_watch_went_back(struct refl *r, uint64_t rv, const char *what);
/* A parked reflector (refl_probe_start) goes on: its watch starts. */
void refl_unpark(struct refl *r);

/* ---- reflector_list.c ---- */

/* LIST from the first page (or the next: r->cont); diff: a relist whose
 * differences are recorded as events. */
void refl_list_start(struct refl *r, bool diff);
/* Drop the relist's difference so far. */
void refl_diff_reset(struct refl *r);
/* One object in r's encoding (JSON text or a protobuf object message) into
 * out (refl_decoded_fini it); from_watch: cut the TypeMeta a watch writes
 * first. Returns 0, or an error with a message in err. */
int refl_decode_obj(struct refl *r, const char *json, size_t len, bool from_watch,
                    struct refl_decoded *out, char *err, size_t errlen);
void refl_decoded_fini(struct refl_decoded *d);

#endif
