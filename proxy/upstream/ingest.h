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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kwc/reflector.h"
#include "kwc/store.h"

struct event;
struct event_base;

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
    unsigned max_staleness;
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
    bool frozen; /* refl_ingest_freeze: no reflector starts, nothing is written */
};

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
