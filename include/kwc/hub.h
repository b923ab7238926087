/*
 * hub.h — watch fan-out (DESIGN.md "Fan-out"): committed events -> the
 * watchers that match them, each event encoded once and shared.
 *
 * Data path:  store (commit) -> hub_batch_build (the writer loop reads the
 * committed events back from history, encodes each once into an immutable
 * reference-counted blob of event bytes, no framing) -> hub_apply on every
 * worker loop's hub (its own watchers, indexed by namespace and by the
 * resource's indexed field, pods' spec.nodeName) -> a sink per watcher
 * (proxy/serve/watch.c: a chunked HTTP/1.1 stream on the socket the watch
 * took to its worker loop; tests: memory).
 *
 * Threads: a struct hub belongs to one loop thread; blobs, events and batches
 * are immutable once built and shared between threads by atomic reference
 * counts (a variant of an event, e.g. the ADDED that a selector transition
 * needs, is built on first use and published with one compare-and-swap).
 *
 * A watcher moves through
 *   WAIT     (sendInitialEvents with an rv the cache has not reached)
 *   INITIAL  (synthetic ADDED for the state at one snapshot rv, read from the
 *             store in chunks while the sink drains)
 *   CATCHUP  (events after its last rv: from the hub's window of recent
 *             batches when it reaches back that far, by reference to the
 *             same shared blobs live watchers get; else read from the
 *             store's history and encoded for this watcher)
 *   LIVE     (events handed over as the batches arrive)
 * and back from LIVE to CATCHUP when its sink holds more than the budget:
 * it then receives nothing live, and when the sink drains it catches up
 * from where it stopped. The window (hub_options.window_bytes per resource,
 * kube's watch-cache ring in spirit) makes a lagging watcher as cheap as a
 * live one; LMDB behind it makes lag beyond the window still lossless. A watcher whose rv falls
 * below the history floor is ended (the client resumes and gets its 410 then), as is every watcher
 * of a resource whose history jumped (a relist reset it).
 *
 * Encodings: a hub_res is one cache in one encoding (DESIGN.md "Encodings"):
 * JSON lines, or protobuf watch frames (4-byte big-endian length + a
 * WatchEvent whose object is the stored object message in kube's envelope).
 * Everything above is the same for both; only the encoders differ, and
 * watchers of the two caches of one resource never meet.
 *
 * Forms: a watcher asks for the objects themselves or for their metadata
 * only (hub_watch_req.meta: Accept ...;as=PartialObjectMetadata;
 * g=meta.k8s.io;v=v1, in JSON or protobuf). Both forms are watchers of the
 * same hub_res: one store, one batch per commit, one window, one set of
 * index buckets, one rv. A JSON cache of a custom resource has a third
 * form, its metadata in protobuf frames (meta_pb: kwc keeps no protobuf
 * cache of custom resources, and kube answers their metadata in protobuf,
 * typed). The form is a property of the watcher and of the
 * bytes only: each event keeps one shared blob per (form, variant), built
 * on first use (pom.h derives the PartialObjectMetadata from the stored
 * object), so every metadata watcher of a cache shares the one encoding of
 * an event as every full watcher shares the other, and a form nobody
 * watches is never encoded (the writer builds the full form's common
 * variant ahead, as before; the metadata form is built by the first worker
 * that needs it). Catch-up from the window hands out the same per-form
 * blobs; what is read from the store (the initial state, history behind the
 * window) is encoded in the watcher's form. Bookmarks become
 * PartialObjectMetadata too, ERROR events stay Status, as kube's watch
 * handler's transformObject does. (A second hub_res per form would have
 * read each commit's events from the store twice and kept two windows of
 * the same events.) The window's budget (window_bytes) counts the full
 * form only: with metadata watchers its events also hold their metadata
 * blobs, each metadata form at most as large again (in practice a fifth:
 * metadata is ~16 % of a pod), so its memory is bounded by twice the
 * budget, three times for a JSON cache watched in both metadata forms.
 *
 * Pure: no I/O besides LMDB reads through store.h, no clock (times come in as
 * now_ms), no randomness of its own (the caller seeds the bookmark jitter).
 */
#ifndef KWC_HUB_H
#define KWC_HUB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kwc/enc.h"
#include "kwc/store.h"

struct sel;

/* ---- blobs: immutable bytes shared by reference ---- */

/*
 * The bytes of one or more complete watch events (JSON lines, each
 * `{"type":...,"object":...}\n`, or protobuf frames, each a 4-byte length
 * and a WatchEvent) and nothing else: protocol-neutral, so an
 * HTTP/1.1 chunk, an HTTP/1.0 body and an HTTP/2 DATA frame all send the
 * same shared bytes, the transport putting its own framing, if any, in front
 * (see hub_sink_ops.write).
 *
 * A transport may have its framing written once around the shared bytes
 * (hub_res_set_frame): each blob then keeps head bytes of room before data
 * and tail bytes after data + len, which the frame callback fills when the
 * blob is made, before it is shared; data[0, len) stays the same bytes.
 */
struct hub_blob {
    unsigned refs; /* atomic */
    bool framed;   /* the resource's hub_frame wrote its room around the bytes */
    size_t len;
    char *data; /* the bytes: room[head, head + len) */
    char room[];
};

void hub_blob_ref(struct hub_blob *b);
void hub_blob_unref(struct hub_blob *b);

/* Room around each blob's bytes and what fills it (a transport's framing:
 * watch.c gives HTTP/1.1's chunk header and trailer, http.h's
 * hstream_frame). frame(p, n) may write p[-head, 0) and p[n, n + tail);
 * called for n > 0 only. All zero: no room, no framing. */
struct hub_frame {
    size_t head, tail;
    void (*frame)(char *p, size_t n);
};

/* ---- a cached resource as the hub sees it (immutable, shared) ---- */

struct hub_res {
    struct hub_frame frame; /* every blob of the resource's */
    unsigned id;            /* index among the cached resources */
    enum kwc_enc enc;       /* how its events are written: JSON lines, protobuf frames */
    struct store_res *sres;
    char *kind, *api_version;
    bool unstructured; /* custom resource: items keep TypeMeta, sorted maps */
    bool namespaced;
    char **field_names; /* the selectable fields, as in the index bytes */
    size_t n_fields;
    int index_field; /* watchers pinned to one value of it are indexed */
};

/* A resource whose store holds objects in encoding enc (JSON text, or
 * protobuf object messages in list-item form). */
struct hub_res *hub_res_new_enc(enum kwc_enc enc, unsigned id, struct store_res *sres,
                                const char *kind, const char *api_version, bool unstructured,
                                bool namespaced, const char *const *field_names, size_t n_fields,
                                int index_field);
/* Set r's blob room and framing (none by default): before the first batch
 * of r is built or watched. */
void hub_res_set_frame(struct hub_res *r, const struct hub_frame *f);
void hub_res_free(struct hub_res *r);

/* ---- batches: the events of one commit of one resource ---- */

struct hub_event;

struct hub_batch {
    unsigned refs; /* atomic */
    const struct hub_res *res;
    uint64_t from_rv, rv; /* events with from_rv < rv' <= rv; rv: the cache's rv after it */
    bool gap;             /* the history no longer held (from_rv, rv]: end every watcher */
    /* with gap: the upstream's timeline changed (a restored or replaced
     * cluster): each watcher gets an ERROR event with a 410 Expired Status
     * first, so that its client relists, as after a too old rv; rv may then
     * be below the hub's (the cache starts over) */
    bool expired;
    size_t n;
    struct hub_event **ev;
    size_t bytes; /* the events' shared bytes (the window's measure) */
};

/*
 * Read the events (from_rv, to_rv] of r from the store and encode each once.
 * with_events false: only the rv moves (nobody watches r). Returns 0 and a
 * batch holding one reference, or an error (store).
 */
int hub_batch_build(struct store *st, const struct hub_res *r, uint64_t from_rv, uint64_t to_rv,
                    bool with_events, struct hub_batch **out);
void hub_batch_ref(struct hub_batch *b);
void hub_batch_unref(struct hub_batch *b);

/* ---- watchers ---- */

/* Why a stream ended (sink end op; also for logs and metrics). */
#define HUB_ENDS(X)                                                                                \
    X(HUB_END_TIMEOUT, "timeout")         /* its deadline: a clean end, as kube's */               \
    X(HUB_END_ERROR_EVENT, "error_event") /* an ERROR event was the last thing written */          \
    X(HUB_END_EXPIRED, "expired")         /* fell below the history floor while lagging */         \
    X(HUB_END_RESET, "reset")             /* the resource's history was reset */                   \
    X(HUB_END_UPSTREAM, "upstream_reset") /* a 410: the upstream's timeline changed */             \
    X(HUB_END_STORE, "store_error")       /* reading the store failed */                           \
    X(HUB_END_SHUTDOWN, "shutdown")

enum hub_end {
#define HUB_END_ENUM(e, s) e,
    HUB_ENDS(HUB_END_ENUM)
#undef HUB_END_ENUM
};
const char *hub_end_name(enum hub_end e);

struct hub_sink_ops {
    /* Queue len bytes at p, which lie inside b: take a reference (hub_blob_ref)
     * and drop it when the bytes have been sent or discarded. The bytes are
     * one or more complete events (len > 0), never part of one, and carry no
     * framing: the transport frames each call as one unit (an HTTP/1.1 chunk,
     * an HTTP/2 DATA frame) with its own small header in front of the shared
     * bytes, so one write is one chunk; when b->framed and (p, len) is all
     * of b (p == b->data, len == b->len), that framing may already be in
     * b's room (hub_res_set_frame). */
    void (*write)(void *sink, struct hub_blob *b, const char *p, size_t len);
    /* Bytes queued and not yet sent, as on the wire (framing included):
     * what the hub holds against hub_options.budget. */
    size_t (*queued)(void *sink);
    /* Stored state or history is owed (INITIAL, CATCHUP): call hub_pump
     * whenever fewer than budget / 2 bytes are queued, until it says done. */
    void (*wake)(void *sink);
    /* The stream is over: send what is queued, end it (terminal chunk), close.
     * Called once; the watcher is freed right after it returns. */
    void (*end)(void *sink, enum hub_end why);
};

/* What the request asked for (decide_watch's result, in hub terms). */
struct hub_watch_req {
    const char *ns;         /* namespace from the path, NULL: all (copied) */
    struct sel *sel;        /* NULL: everything; the watcher takes it */
    bool initial;           /* synthetic ADDED for the state at the start, then live */
    uint64_t rv;            /* initial: wait until the cache reaches rv (sendInitialEvents
                               with NotOlderThan N); else: events after rv */
    bool initial_end;       /* a BOOKMARK with k8s.io/initial-events-end after them */
    bool bookmarks;         /* allowWatchBookmarks */
    bool meta;              /* metadata-only (as=PartialObjectMetadata;g=meta.k8s.io;v=v1):
                               every object, bookmarks too, a PartialObjectMetadata; an
                               ERROR's Status as it is */
    bool meta_pb;           /* with meta, of a JSON cache: in protobuf frames (a custom
                               resource's metadata in protobuf: pom_pb_from_json), ERROR
                               events' Status in protobuf too */
    uint64_t deadline_ms;   /* when the stream ends (caller's clock) */
    uint64_t wait_until_ms; /* WAIT: give up (the 504 ERROR event) at this time */
    char *too_large_status; /* WAIT timeout: the Status JSON of the ERROR (taken); a
                               protobuf resource's ERROR carries it as a protobuf Status */
};

struct hub_options {
    size_t budget;        /* bytes queued on a sink before the watcher lags */
    size_t chunk_bytes;   /* encoded per pump step (initial state, catch-up) */
    uint64_t bookmark_ms; /* interval between bookmarks */
    size_t window_bytes;  /* recent batches kept per resource for catch-up by reference */
    struct hub_res_stats *res_stats; /* per resource id (< n_res_stats): counted there; the
                                        caller's memory, outliving the hub (may be NULL) */
    size_t n_res_stats;
};

struct hub;
struct hub_watcher;

struct hub *hub_new(struct store *st, const struct hub_options *o);
/* Ends every watcher (HUB_END_SHUTDOWN) and frees h. */
void hub_free(struct hub *h);
/* Ends every watcher now (each sink's end op, why); h goes on (new
 * watchers, batches). */
void hub_end_all(struct hub *h, enum hub_end why);

/*
 * Deliver a batch: the hub's rv for the resource moves to b->rv and each LIVE
 * watcher gets the events it matches (several pending events go out in one
 * write: the caller flushes its sinks after this returns). A watcher over
 * the budget turns to CATCHUP (hub_pump_wanted). Watchers waiting for an rv
 * the batch reaches start.
 */
void hub_apply(struct hub *h, struct hub_batch *b);

/*
 * A new watcher of r. posted_rv: the rv up to which the writer had handed
 * batches of r over when it sent this watcher (every event up to it is in
 * the store). Returns the watcher; an ERROR answer (a start below the floor)
 * is written to the sink and ended before this returns (NULL then).
 */
struct hub_watcher *hub_watch(struct hub *h, const struct hub_res *r, struct hub_watch_req *req,
                              const struct hub_sink_ops *ops, void *sink, uint64_t posted_rv,
                              uint64_t now_ms, uint64_t seed);

/* The client went away: forget the watcher without calling its sink's end. */
void hub_unwatch(struct hub_watcher *w);

/*
 * More stored events or state to send (INITIAL or CATCHUP) and the sink has
 * room: the caller calls hub_pump when the sink drains below budget / 2.
 */
bool hub_pump_wanted(const struct hub_watcher *w);
/* The next hub_pump encodes from the store (the initial state, or history
 * behind the window): bytes of this watcher's own, not shared. */
bool hub_pump_reads_store(const struct hub_watcher *w);
/* Encode one chunk of what is owed. Returns true when more remains. May end
 * the watcher (then it is freed: pass *alive to learn it). */
bool hub_pump(struct hub_watcher *w, bool *alive);

/* The next time hub_timer should run for w (ms, caller's clock), 0: none. */
uint64_t hub_next_timer(const struct hub_watcher *w);
/* Bookmarks, the deadline and the WAIT timeout. May end and free w. */
void hub_timer(struct hub_watcher *w, uint64_t now_ms);

/* Counters of one hub. */
struct hub_stats {
    unsigned long long watchers, live, lagging, delivered, visits, lag_events, bookmarks;
    unsigned long long from_window, from_store; /* events sent by catch-up, by source */
};
void hub_stats(const struct hub *h, struct hub_stats *out);

/* ---- per-resource counters (for /metrics) ---- */

/*
 * One hub's counts for one resource, in memory the caller hands over
 * (hub_options.res_stats[id]). Only the hub's loop thread writes them, each
 * update a relaxed atomic load and store (a plain move on x86: no lock, no
 * shared cache line per delivery); any thread reads them with
 * hub_res_stats_read (relaxed loads) and sums the hubs.
 */
struct hub_res_stats {
    uint64_t lagging;                /* gauge: watchers in CATCHUP (over budget, or resuming) */
    uint64_t live, live_bytes;       /* events handed over live, and their bytes (no framing) */
    uint64_t window, window_bytes;   /* catch-up events from the window (shared blobs) */
    uint64_t store, store_bytes;     /* catch-up events read from the store's history */
    uint64_t initial, initial_bytes; /* initial-state ADDED events (read from the store) */
    uint64_t bookmarks;              /* BOOKMARK events (periodic and initial-events-end) */
};
void hub_res_stats_read(const struct hub_res_stats *s, struct hub_res_stats *out);

#endif
