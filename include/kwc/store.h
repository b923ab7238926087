/*
 * store.h — the LMDB watch cache (DESIGN.md "Storage"). One environment per
 * --data-dir; per cached resource (a name such as "apps/v1/deployments:json")
 * three things:
 *   objects  key "ns/name" (cluster-scoped: "name"), byte order like etcd's keys
 *            -> rv, caller's index bytes (labels, indexed fields), raw object
 *   history  key (rv, seq) -> event type, key, object, previous object, time
 *   meta     current rv (events and bookmarks), history floor, synced flag,
 *            list kind/apiVersion, upstream identity
 *
 * Writes are batched: one write transaction per loop turn (store_wtxn_*), which
 * also trims the history by count, bytes and age. Reads take a short read
 * transaction (store_rtxn_*); a list larger than one callback re-opens one per
 * chunk at the same rv (store_scan with at_rv), which is consistent because a
 * past state is rebuilt from history: state(rv) = current objects with every
 * change after rv undone. Pointers handed to callbacks are valid only during
 * the callback (they point into LMDB's map).
 *
 * Pure: no sockets, no clock (time comes in as `now`, seconds). MDB_* codes do
 * not leave store.c: errors are -errno or KWC_E*.
 */
#ifndef KWC_STORE_H
#define KWC_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct store;
struct store_res;
struct store_wtxn;
struct store_rtxn;

/* The most resources (store_res names) one store holds. */
#define STORE_MAX_RESOURCES 512

struct store_options {
    uint64_t map_size;      /* bytes of address space for the map (sparse file) */
    unsigned max_resources; /* resources opened at most (<= STORE_MAX_RESOURCES; 0: 32): a
                               JSON and a protobuf cache are one each */
    bool durable;           /* fsync at every commit; off: a crash may lose the
                               last commits but never leaves the cache
                               inconsistent with its recorded rv */
    uint64_t history_max_events;
    uint64_t history_max_bytes;
    uint64_t history_max_age; /* seconds. Each of the three bounds trims the
                                 oldest events; the floor follows them */
    bool checksums;           /* default true: every value carries a CRC-32C,
                                 checked on every read. false (writes put 0,
                                 reads check only layouts) exists only so that
                                 bench/ can measure the cost in one run; a data
                                 dir written without checksums reads as damaged
                                 with them. */
};

enum store_ev_type { STORE_ADDED = 1, STORE_MODIFIED = 2, STORE_DELETED = 3 };

/* One change, as the reflector decoded it. All borrowed for the call. */
struct store_event {
    enum store_ev_type type;
    uint64_t rv;     /* the event's place in history */
    uint64_t obj_rv; /* the object's own metadata.resourceVersion; 0: rv.
                        They differ only for a relist difference that
                        history could not place at the object's rv. */
    const char *key; /* "ns/name" or "name" */
    size_t key_len;
    const void *obj; /* raw object bytes as received (DELETED: the last state) */
    size_t obj_len;
    const void *idx; /* caller's index bytes for obj (labels, fields) */
    size_t idx_len;
};

/* An object as stored (valid during a callback or until the rtxn ends). */
struct store_obj {
    const char *key;
    size_t key_len;
    uint64_t rv;
    const void *idx;
    size_t idx_len;
    const void *raw;
    size_t raw_len;
    /* store_rtxn_defer_raw_check: raw is not checked yet; crc_rest covers
     * everything before it, crc_want is the value's crc */
    bool raw_unchecked;
    uint32_t crc_rest, crc_want;
};

/* A history entry (valid during the callback). prev.raw is NULL for ADDED. */
struct store_hist {
    enum store_ev_type type;
    uint64_t rv;
    uint64_t time;
    struct store_obj obj;
    struct store_obj prev;
};

struct store_res_info {
    uint64_t rv;    /* newest rv the cache has reached (events and bookmarks) */
    uint64_t floor; /* watches from rv >= floor and exact reads at rv >= floor work */
    uint64_t objects;
    uint64_t hist_events;
    uint64_t hist_bytes;
    bool synced;     /* an initial list has completed */
    bool namespaced; /* as recorded with the kind */
    bool unserved;   /* the upstream (identity) said it does not serve the resource in the
                        cache's encoding (store_wtxn_set_unserved) */
    char list_kind[128];
    char api_version[128];
    char identity[256]; /* upstream identity recorded with the data */
};

void store_options_default(struct store_options *o);

/* Open (creating) the environment in dir. Returns 0, -errno or KWC_E*. */
int store_open(const char *dir, const struct store_options *o, struct store **out);
void store_close(struct store *s);

/* The resource named name (created on first use; stays valid until store_close). */
int store_res(struct store *s, const char *name, struct store_res **out);

/*
 * Integrity. Every read below (and store_wtxn_event's read of the previous
 * object, trim's, store_res_index's rebuild) checks each value's layout and
 * checksum; a mismatch returns KWC_ECORRUPT and marks the resource damaged.
 * A meta record of another kwc format is KWC_EFORMAT (not a damage: the data
 * dir is to be started over).
 *
 * store_res_damaged: whether any thread's read found a mismatch in r since the
 * last committed store_wtxn_reset of r (the mark is cleared when that reset
 * commits, since the damaged values are gone then; an aborted reset leaves
 * it). Copies the first bad value's name into key (keylen bytes, NUL-ended,
 * may be NULL): "ns/name" for an object, "history rv N" for a history entry,
 * "meta" for the meta record. Thread-safe, any thread.
 */
bool store_res_damaged(struct store_res *r, char *key, size_t keylen);

/*
 * Read every value of every resource in the environment (found in LMDB's
 * database names, without store_res) and check it: each object's and history
 * entry's layout and checksum, each meta record's checksum, and the meta
 * against the data: objects and hist_events equal the entries, hist_bytes
 * their sizes, every history rv in (floor, rv], last_hist_rv the newest, floor
 * <= rv, and the field index (when there is one) one entry per object.
 * progress (may be NULL) gets the bytes read so far about every 64 MiB.
 * Returns 0, KWC_ECORRUPT or KWC_EFORMAT with a sentence in why naming the
 * resource and the key or counter, or an error. Meant for start, after
 * store_open: not concurrently with store_res / store_res_index (LMDB opens
 * named databases one thread at a time). Marks nothing damaged.
 */
int store_verify(struct store *s, void (*progress)(void *arg, uint64_t done_bytes), void *arg,
                 char *why, size_t whylen);

/*
 * Index field number `field` of the caller's index bytes (idx_field) so that
 * store_scan_field reads only the objects with one value of it (pods by
 * spec.nodeName: a kubelet's list touches its own pods). Call once, before
 * writing; an existing data dir whose index is missing or stale is indexed
 * now. Returns 0, KWC_EPARSE for a second, different field, or an error.
 */
int store_res_index(struct store_res *r, unsigned field);
/* Bytes of the pages r's data takes in the map (objects, history, index). */
uint64_t store_res_disk_bytes(struct store *s, struct store_res *r);
/* Drop r's data (objects, history, index, meta) in a transaction of its
 * own: not while a write transaction is open on this thread. r stays open
 * and empty, as if new. Returns 0, -errno or KWC_E*. */
int store_res_clear(struct store *s, struct store_res *r);

/*
 * The upstream cluster's identity recorded with the data (the kube-system
 * namespace's uid: DESIGN.md "Trust in the upstream's timeline"), at most
 * 255 bytes. store_cluster_id copies it into buf ("" when none is recorded);
 * 0, KWC_ECORRUPT (its checksum) or an error. store_set_cluster_id records
 * it. store_rebase drops every resource's data (objects, history, index,
 * meta: those opened with store_res stay open and empty, as if new; any
 * other is deleted) and records id, in one transaction: the data dir then
 * belongs to that cluster and holds nothing of another. Not while a write
 * transaction is open on this thread.
 */
int store_cluster_id(struct store *s, char *buf, size_t len);
int store_set_cluster_id(struct store *s, const char *id);
int store_rebase(struct store *s, const char *id);

/* ---- writing: one transaction per loop turn ---- */
/* now: seconds, stamped on the events written and used to trim by age. */
int store_wtxn_begin(struct store *s, uint64_t now, struct store_wtxn **out);
/* Apply one event: objects updated, history appended (with the previous object). */
int store_wtxn_event(struct store_wtxn *w, struct store_res *r, const struct store_event *ev);
/* Initial sync: put an object as of a list, without a history entry (the
 * state before the list's rv is not history). Call between store_wtxn_reset
 * and marking the resource synced. ev->type is ignored. */
int store_wtxn_load(struct store_wtxn *w, struct store_res *r, const struct store_event *ev);
/* Advance the resource's rv without an event (bookmark); never moves it back. */
int store_wtxn_rv(struct store_wtxn *w, struct store_res *r, uint64_t rv);
/* Start over from a fresh list: clears objects and history, floor = rv. */
int store_wtxn_reset(struct store_wtxn *w, struct store_res *r, uint64_t rv);
int store_wtxn_set_synced(struct store_wtxn *w, struct store_res *r, bool synced);
/* What discovery said about the resource, kept so that a warm restart can
 * serve before the upstream answers discovery again. */
int store_wtxn_set_kind(struct store_wtxn *w, struct store_res *r, const char *list_kind,
                        const char *api_version, bool namespaced);
int store_wtxn_set_identity(struct store_wtxn *w, struct store_res *r, const char *identity);
/* Whether the upstream serves the resource in this cache's encoding (a
 * protobuf cache of an upstream without protobuf for it): kept so that a
 * restart knows it before the upstream answers again. */
int store_wtxn_set_unserved(struct store_wtxn *w, struct store_res *r, bool unserved);
/* Trim history (bounds from the options, age against the begin's now), commit,
 * free w (also on failure). */
int store_wtxn_commit(struct store_wtxn *w);
void store_wtxn_abort(struct store_wtxn *w);

/* ---- reading ---- */
int store_rtxn_begin(struct store *s, struct store_rtxn **out);
void store_rtxn_end(struct store_rtxn *t);
/*
 * Objects that store_scan / store_scan_field hand out from t come with their
 * raw bytes not yet checked (all else is): the caller copies raw out and
 * checks the copy with store_obj_check_raw. Reading the bytes once, from the
 * map into the answer, and checking them where they landed (in the CPU's
 * cache) is what keeps checksums cheap for a list, whose cost is that copy.
 */
void store_rtxn_defer_raw_check(struct store_rtxn *t);
/* Check the copy of o->raw (o->raw_len bytes at copy) against o's crc: 0, or
 * KWC_ECORRUPT with r marked damaged. 0 when o->raw_unchecked is false. */
int store_obj_check_raw(struct store_res *r, const struct store_obj *o, const void *copy);

int store_info(struct store_rtxn *t, struct store_res *r, struct store_res_info *out);
/* The resource's rv (and floor, when asked) from a read transaction of its
 * own; 0 when the store cannot be read. */
uint64_t store_res_rv(struct store *s, struct store_res *r, uint64_t *floor);
/* One object by key at the latest state. Returns 0, KWC_ENOTFOUND or an error. */
int store_get(struct store_rtxn *t, struct store_res *r, const char *key, size_t key_len,
              struct store_obj *out);

/* The order of object keys: bytes, as memcmp, a prefix first (etcd's order). */
int store_keycmp(const char *a, size_t al, const char *b, size_t bl);

/* Visit objects in key order: those whose key starts with prefix (may be ""),
 * from the first key >= from (fl bytes, may hold NULs; NULL: from the start;
 * the key after k is k + "\0", as in etcd range reads), at the state of at_rv
 * (0: latest). cb returns 0 to go on, 1 to stop (not an error), <0 to abort
 * with that code. Returns 0, the cb's code, KWC_EEXPIRED if at_rv is below the
 * floor, or an error. */
typedef int (*store_obj_cb)(void *arg, const struct store_obj *o);
int store_scan(struct store_rtxn *t, struct store_res *r, uint64_t at_rv, const char *prefix,
               const char *from, size_t fl, store_obj_cb cb, void *arg);

/* store_scan over the objects whose indexed field (store_res_index) equals
 * value at at_rv, plus any object that changed after at_rv (its state then
 * may have had the value): a superset, in key order, that the caller filters
 * with its selector. KWC_EPARSE without an index. */
int store_scan_field(struct store_rtxn *t, struct store_res *r, uint64_t at_rv, const char *value,
                     const char *prefix, const char *from, size_t fl, store_obj_cb cb, void *arg);

/* Visit history events with rv > after_rv in order. KWC_EEXPIRED if after_rv
 * is below the floor (the events are gone: a watcher must get 410). */
typedef int (*store_hist_cb)(void *arg, const struct store_hist *h);
int store_history(struct store_rtxn *t, struct store_res *r, uint64_t after_rv, store_hist_cb cb,
                  void *arg);

/* The LMDB environment's size (for /metrics): map size, bytes of the map in
 * use (the pages up to the last one written, free pages included), page
 * size, reader slots used and allowed. Returns 0 or an error. Any thread. */
struct store_env_info {
    uint64_t map_size, used_bytes, page_size;
    unsigned readers, max_readers;
};
int store_env_info(struct store *s, struct store_env_info *out);

#endif
