/*
 * watch.h — watch streams of cached resources, served from the LMDB store by
 * worker threads (DESIGN.md "Fan-out"; the rules in "Serving rules").
 *
 * The front end's route stage offers every watch to watch_take. A watch of a
 * cached, synced resource that asks for plain JSON, or for protobuf
 * (application/vnd.kubernetes.protobuf, built-in kinds: served from the
 * resource's protobuf cache, as ;stream=watch frames), is decided here (kube's
 * 400/422/500 answers through the response writer); a stream to serve sends
 * its head and leaves the request as a response stream (http.h,
 * hresp_handoff), handed to one of the worker loops, which owns it from
 * then on: its cache/hub, its timers, its writes (a stream bound to its
 * connection's loop, HTTP/2, is served by a worker on that loop, the
 * writer's own). After
 * every store commit the writer loop (watch_committed) reads the new events
 * back once, encodes each once, and hands the batch to the workers that have
 * watchers of that resource (a queue and an eventfd per worker).
 *
 * A stream ends at its deadline (timeoutSeconds, else kube's random 30-60
 * minutes) with a terminal chunk, and then kwc closes the connection
 * (`Connection: close` is in the head: the connection has left the HTTP
 * server, so it cannot carry another request).
 *
 * Passed to the upstream: watches of a single object by name
 * (/watch/.../NAME, ?watch on an object path), Table/metadata/YAML Accept
 * headers, pretty JSON, field selectors on fields kwc does not index, a
 * resume from below the history floor (the upstream may still hold the
 * events), and everything while the cache is not synced; protobuf also while its cache
 * does not serve (the request starts it: refl_want), and a protobuf request
 * kube would refuse (its error Status is the upstream's, in protobuf).
 */
#ifndef KWC_WATCH_H
#define KWC_WATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kwc/decide.h"
#include "kwc/hub.h"

struct event_base;
struct store;
struct refl;
struct refl_set;
struct route_req;
struct hreq;
struct watch_pool;
struct mailbox;

struct watch_options {
    unsigned workers; /* 0: one per CPU (ignored with loops) */
    /* Serving loops (app.c): a worker on each of these bases, no threads of
     * the pool's own; watch_take then runs on those loops, and what it
     * shares with watch_committed is done on the writer's loop, posted to
     * main_mb (mailbox.h). Each loop's thread must have stopped before
     * watch_pool_free. */
    struct event_base *const *loops;
    unsigned nloops;
    struct mailbox *main_mb;
    size_t budget;                   /* bytes queued per watcher before it lags */
    size_t window_bytes;             /* recent events kept per resource and worker for catch-up */
    uint64_t bookmark_ms;            /* bookmark interval */
    int wait_ms;                     /* sendInitialEvents: wait for the cache to reach the rv */
    enum decide_too_large too_large; /* ...then: 504 ERROR event, or serve what is cached */
    /* No worker threads: every stream is served by the local worker on the
     * pool's own loop, as streams whose handoff is bound to that loop are
     * (HTTP/2). For tests. */
    bool own_loop;
    /* The longest a round's writes are held so that one write carries
     * several events per watcher (pace.h; --watch-coalesce-max-delay): 0 is
     * PACE_MAX_US, unless no_coalesce. */
    unsigned coalesce_max_us;
    /* Never hold (--watch-coalesce-max-delay 0): every event is written in the
     * round that applied it. */
    bool no_coalesce;
    /* Hold every round's writes at least this long, up to the bound above
     * (pace.h decides otherwise: 0 for a light load). For tests. */
    unsigned flush_hold_us;
};

/* set (the caches, reflector.h: it may grow) is borrowed and must outlive
 * the pool. Starts the worker threads. */
struct watch_pool *watch_pool_new(struct event_base *base, struct store *st,
                                  const struct refl_set *set, const struct watch_options *o);
/* Ends every stream cleanly (terminal chunk), stops and joins the workers.
 * Call before the store closes. */
void watch_pool_free(struct watch_pool *p);
/* Shutdown's first step (the server drains, main.c): every stream ends
 * cleanly now (terminal chunk, END_STREAM over HTTP/2) while the loops go
 * on, so the last bytes leave; a watch that starts after this ends at once
 * (after its head, as kube's expired context). Writer loop. */
void watch_pool_end_streams(struct watch_pool *p);
/* Streams open: handed to a worker and not yet closed (their last bytes may
 * still be leaving). Writer loop. */
size_t watch_pool_streams(struct watch_pool *p);

/* Route stage (head read): not a watch kwc serves (pass it on); an answer
 * kwc gives through the response writer (an error Status); or a stream,
 * whose connection has left the HTTP server. */
enum watch_took { WATCH_NOT_TAKEN, WATCH_ANSWERED, WATCH_STREAM };
enum watch_took watch_take(struct watch_pool *p, struct hreq *req, const struct route_req *r);

/* The store committed (a refl_ingest_subscribe subscriber, p the pool):
 * hand new events to the workers. */
void watch_committed(void *p);
/* The cache of r left service (serving false; a refl_ingest_subscribe
 * subscriber, p the pool): end its streams cleanly, so their clients resume
 * from the upstream while it is out; when it left because the upstream's
 * timeline changed (refl_resetting), with a 410 Expired ERROR event first,
 * so that they relist. Back in service: nothing to do. */
void watch_service_changed(void *p, const struct refl *r, bool serving);

struct watch_stats {
    unsigned long long watchers, live, lagging, delivered, bookmarks, started, ended, batches;
    unsigned long long held; /* rounds whose writes were held to go with later ones (pace.h) */
};
void watch_stats(struct watch_pool *p, struct watch_stats *out);

/* Per cached resource (set->r[i]), summed over the workers: open streams
 * (from the hand-off to the close) and the hubs' counters (hub.h). Any
 * thread; no lock (relaxed loads of single-writer counters). */
struct watch_res_stats {
    uint64_t watchers;
    struct hub_res_stats hub;
};
void watch_res_stats(struct watch_pool *p, size_t i, struct watch_res_stats *out);

/* Store-encoded bytes (initial state, catch-up behind the window) queued on
 * the workers' streams now, summed over the workers (each caps its own at
 * 32 MiB before it reads more for a stream that still holds some). Any
 * thread; relaxed loads. */
size_t watch_store_queued(struct watch_pool *p);

#endif
