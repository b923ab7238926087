/*
 * ingest.h — private to proxy/upstream: the batched store writer shared by
 * the reflectors of one loop (ingest.c) and what it and reflector.c ask of
 * each other. Loop thread only.
 *
 * Events decoded from the reflectors' watches are pushed (refl_ingest_push)
 * and written in one store transaction per loop turn (refl_ingest_commit
 * runs from an event activated by the first push of the turn), or at once
 * when a reflector needs order with what is pending (a relist) or the
 * pending bytes grow past its bound.
 */
#ifndef KWC_UPSTREAM_INGEST_H
#define KWC_UPSTREAM_INGEST_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kwc/reflector.h"
#include "kwc/store.h"

struct event;
struct event_base;
struct evbuffer;
struct up_client;
struct up_xfer;

/* One pending write: an event, or a bookmark (rv only). Owns key, obj, idx. */
struct pend {
    struct refl *r;
    bool bookmark;
    enum store_ev_type type;
    uint64_t rv, obj_rv;
    char *key, *obj, *idx;
    size_t key_len, obj_len, idx_len;
};

/* One subscriber of the writer (refl_ingest_subscribe). */
struct refl_sub {
    void (*on_commit)(void *arg);
    void (*on_service)(void *arg, const struct refl *r, bool serving);
    void *arg;
};

struct refl_ingest {
    struct event_base *base;
    struct store *st;
    char *data_dir;
    uint64_t map_size;
    uint64_t max_staleness_ms;
    struct refl_clock clock; /* never NULL functions (the real ones by default) */
    struct event *commit_ev;
    struct pend *p;
    size_t n, cap, bytes;
    struct refl_sub *subs; /* refl_ingest_subscribe, called in that order */
    size_t nsubs;
    void (*on_unknown)(void *arg, const struct refl *r, const char *why);
    void *on_unknown_arg;
    void (*on_retry)(void *arg, const struct refl *r, int status);
    void *on_retry_arg;
    /* every reflector of the loop (refl_new adds, refl_free removes) */
    struct refl **all;
    size_t nall;
    struct refl_resets resets; /* kwc_upstream_reset_total */
    /* the upstream's identity (cluster.c); id_up NULL: not checked */
    struct up_client *id_up;
    struct up_xfer *id_x;
    struct evbuffer *id_body;
    int id_status;
    bool id_ok;    /* checked since the last reconnect: watches resume freely */
    bool id_again; /* a reconnect while a check was in flight: check again */
    bool id_told;  /* "cannot read it" was logged (once per run) */
    bool id_too_big;
    atomic_bool frozen; /* refl_ingest_freeze: no reflector starts, nothing is written */
    /* the loop's thread (the main loop's), and the way to it from the
     * serving loops: refl_want posts a start (refl_ingest_post_wants) */
    pthread_t owner;
    struct mailbox *mb;
    atomic_bool wants_posted; /* a run of the reflectors' want_posted is queued */
    bool closing;             /* refl_ingest_free: queued wants start nothing */
};

/* On the ingest's own loop (the thread that made it)? */
bool refl_ingest_on_loop(const struct refl_ingest *ing);
/* From a serving loop: r's want_posted is set; start it from the loop. */
void refl_ingest_post_wants(struct refl_ingest *ing);

/* Reflectors of the loop (refl_new, refl_free). */
void refl_ingest_add(struct refl_ingest *ing, struct refl *r);
void refl_ingest_remove(struct refl_ingest *ing, struct refl *r);
/* Drop r's pending writes (a reset: they belong to a timeline gone). */
void refl_ingest_drop(struct refl_ingest *ing, struct refl *r);

/* ---- cluster.c: the upstream's identity ---- */

/* A reflector's attempt failed for the upstream's sake (no answer, 5xx):
 * once it is back, the identity is checked again before watches resume. */
void refl_ingest_lost(struct refl_ingest *ing);
/* Before r's watch resumes: true when r must wait for the identity (a
 * check is started if none runs; r is unparked, or reset, when it ends). */
bool refl_ingest_identity_wait(struct refl_ingest *ing);
/* Free the identity check's transfer and buffer (refl_ingest_free). */
void refl_ingest_identity_fini(struct refl_ingest *ing);

/* A new pending write, zeroed, for the caller to fill (valid until the next
 * push or commit); the commit of this loop turn is scheduled. */
struct pend *refl_ingest_push(struct refl_ingest *ing);
/* Write everything pending in one transaction now (nothing pending: no-op).
 * Every reflector with a pending write hears refl_commit_failed or
 * refl_commit_done (once per pending write); on success the subscribers
 * then hear of the commit. */
void refl_ingest_commit(struct refl_ingest *ing);
/* What a failed write (rc) means, for a person: the cause and what fixes it. */
void refl_ingest_write_cause(const struct refl_ingest *ing, int rc, char *buf, size_t len);
/* Free bytes for unprivileged writers on the data dir's filesystem (0 when
 * statvfs fails). */
uint64_t refl_ingest_free_bytes(const struct refl_ingest *ing);

/* The store committed: every subscriber's on_commit, in the order they
 * subscribed. */
void refl_ingest_notify_commit(struct refl_ingest *ing);
/* r left service (serving false) or came back: every subscriber's
 * on_service, in order. */
void refl_ingest_notify_service(struct refl_ingest *ing, const struct refl *r, bool serving);

/* reflector.c: a commit carrying r's events failed (why: for a person). */
void refl_commit_failed(struct refl *r, const char *why);
/* reflector.c: a commit carrying r's events succeeded. */
void refl_commit_done(struct refl *r);

#endif
