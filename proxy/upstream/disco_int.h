/*
 * disco_int.h — private to proxy/upstream: discovery's state (struct
 * disco) and what its two files share. disco.c fetches and keeps the model
 * current; discocopy.c keeps the copy of discovery answers (its records,
 * their bounds and the reads serving loops make of it). Threads: see
 * disco.c.
 */
#ifndef KWC_UPSTREAM_DISCO_INT_H
#define KWC_UPSTREAM_DISCO_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kwc/base.h"
#include "kwc/disco.h"
#include "kwc/discodoc.h"

struct event;
struct event_base;
struct evbuffer;
struct mailbox;
struct up_client;
struct up_xfer;

#define DISCO_MAGIC 0x6469736fu /* "diso" */
#define PARALLEL DISCO_MAX_CONNS
#define APISVC_EVERY 10    /* rounds between two reads of the APIService list */
#define IDLE_ROUNDS 10     /* a record nobody asked for this many rounds is dropped */
#define BACKOFF_MIN_MS 500 /* a failed first round is retried this soon, doubling */
#define APISVC_PATH "/apis/apiregistration.k8s.io/v1/apiservices"
#define LEGACY_ACCEPT "application/json"
/* aggregated discovery first (kube >= 1.26; v2 since 1.30), the plain
 * documents otherwise (client-go's discovery client asks the same way) */
#define AGG_ACCEPT                                                                                 \
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/"            \
    "json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"

/* The headers a record keeps (disco.c's kept_headers). */
#define KEPT_HEADERS 6

/* A recorded answer (struct disco_doc is its public face). */
struct doc {
    struct disco_doc pub;
    atomic_uint refs; /* dropped by any thread (disco_doc_unref) */
    char *body;
    struct disco_hdr *h;
    char **strs; /* the header names and values */
    size_t nstrs;
};

enum pin { PIN_NONE, PIN_MODEL, PIN_INTERNAL /* the APIService list: never served */ };

struct fetch;

struct drec {
    struct drec *prev, *next; /* the copy, most recently used first */
    struct drec *qnext;       /* the fetch queue */
    char *path, *accept;      /* accept "": none */
    struct doc *doc;          /* the last 200, or NULL */
    bool current;             /* doc may be served: fetched since the last change */
    enum pin pin;
    bool queued;
    bool round;          /* the round waits for it */
    bool changed;        /* its doc changed in this round (model records) */
    bool failed;         /* its last fetch failed */
    atomic_bool in_use;  /* asked for since its last fetch */
    atomic_bool touched; /* asked for by a serving loop since the last evict */
    char why[160];       /* why its last fetch failed */
    atomic_uint idle;    /* rounds without a request */
    struct fetch *f;     /* in flight */
};

struct fetch {
    struct disco *d;
    struct drec *rec; /* NULL: the record was dropped meanwhile */
    struct up_xfer *x;
    struct fetch *next_done;
    int status;
    bool too_big, encoded, done;
    int err;
    char msg[160];
    struct evbuffer *body;
    struct {
        char *name, *value;
    } h[KEPT_HEADERS];
    size_t nh;
};

enum round_step { RS_IDLE, RS_INDEX, RS_GVS, RS_APISVC };

struct sub {
    void (*on_change)(void *arg);
    void *arg;
};

struct disco {
    uint32_t magic;
    struct event_base *base;
    struct up_client *up;
    unsigned interval_ms, min_gap_ms;
    struct event *timer; /* the next round */
    struct event *kick;  /* transfers ended: handle them, start more */
    struct drec *head, *tail;
    size_t ndocs, bytes;
    struct drec *qhead, *qtail;
    unsigned inflight;
    struct fetch *done; /* ended transfers, handled by on_kick */
    /* the model */
    struct ddoc_model model; /* published (frozen) */
    struct ddoc_model agg;   /* group versions served by an extension server */
    bool ready, aggregated_discovery, agg_known, agg_warned;
    /* the round */
    enum round_step step;
    unsigned pending; /* round fetches not ended */
    bool round_changed, again;
    uint64_t rounds, round_started_ms, last_ok_ms;
    unsigned backoff_ms;
    bool failing; /* the last round failed (logged once) */
    struct sub *subs;
    size_t nsubs;
    struct disco_stats st;
    /* threads */
    pthread_t owner; /* the loop's */
    struct mailbox *mb;
    bool closing;               /* disco_free: what is posted now does nothing */
    atomic_bool ready_pub;      /* ready, for any thread */
    atomic_bool refresh_posted; /* a serving loop's disco_refresh_soon is queued */
    pthread_rwlock_t model_lk;  /* the published model (see above) */
    pthread_mutex_t copy_mu;    /* the copy's records (see above) */
};

/* ---- disco.c ---- */

/* On the loop that made d? */
bool disco_on_loop(const struct disco *d);
/* r into the fetch queue (first: at its head), out of it; start what the
 * queue and PARALLEL allow. */
void disco_enqueue(struct disco *d, struct drec *r, bool first);
void disco_queue_remove(struct disco *d, struct drec *r);
void disco_pump(struct disco *d);

/* ---- discocopy.c: docs and records (changes on the loop, under copy_mu
 * where a serving loop looks) ---- */

void copy_doc_free(struct doc *doc);
void copy_doc_unref(struct doc *doc);
bool copy_doc_same(const struct doc *a, const struct doc *b);
void copy_rec_unlink(struct disco *d, struct drec *r);
void copy_rec_push_front(struct disco *d, struct drec *r);
/* The record's doc, and whether it may be served. */
void copy_rec_set_doc(struct disco *d, struct drec *r, struct doc *doc, bool current);
void copy_rec_set_pin(struct disco *d, struct drec *r, enum pin pin);
void copy_rec_set_current(struct disco *d, struct drec *r, bool current);
void copy_rec_free(struct disco *d, struct drec *r);
struct drec *copy_rec_find(struct disco *d, const char *path, const char *accept);
/* Past the bounds: the least recently used records that are neither
 * pinned nor in flight go, keep aside. */
void copy_evict(struct disco *d, const struct drec *keep);
/* The record of (path, accept), made (and pin raised to pin) if need be. */
struct drec *copy_rec_get(struct disco *d, const char *path, const char *accept, enum pin pin);

#endif
