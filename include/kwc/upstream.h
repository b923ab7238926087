/*
 * upstream.h — kwc's HTTP client to the upstream API server: libcurl's multi
 * interface driven by a libevent loop. One up_client per event loop; each
 * up_xfer is one request with streaming in both directions (request body
 * pulled through on_body, response pushed through on_data) and flow control
 * both ways (pause/resume). Over TLS, transfers share HTTP/2 connections; over
 * plain HTTP, idle HTTP/1.1 connections are reused.
 *
 * Connection pools: each request names its pool (enum up_pool), and each pool
 * is its own curl multi handle with its own connections and its own cap
 * (CURLMOPT_MAX_TOTAL_CONNECTIONS). A transfer past its pool's cap waits in
 * curl for a connection (PENDING; the header timeout keeps counting, the
 * connect timeout starts when it gets its turn) instead of failing. Separate
 * pools, not one shared cap, because on an HTTP/1.1 upstream every long
 * passthrough watch holds a connection: sharing would let them starve the
 * reviews and kwc's own lists and watches. The caps bound the upstream
 * sockets kwc can hold, which --max-connections accounts for (config.h).
 *
 * Loop thread only. No callback is made after up_xfer_cancel() or after
 * on_done, and none from inside up_xfer_start().
 *
 * Loops and threads: one up_client per event loop, used only on that loop's
 * thread (its pools, transfers, stats and metrics included: a scrape from
 * another loop asks through that loop's mailbox or reads counters of its
 * own). The first (up_client_new, on the main loop) owns kwc's upstream
 * identity (uplink.h); each serving loop makes its own client with
 * up_client_new_sibling on its own thread, and frees it there before the
 * parent is freed. A sibling's pools are its own (its connections, its
 * caps: up_options); its credentials are the parent's, taken per transfer
 * under a short mutex (uplink.h's contract): a token file read by one loop
 * at a time, an exec plugin run on the parent's loop only, a 401 on any loop
 * making the credential suspect for all at once.
 */
#ifndef KWC_UPSTREAM_H
#define KWC_UPSTREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kwc/metrics.h"

struct event_base;
struct kcfg;
struct up_client;
struct up_xfer;
struct uplink;

/* The connection pools, X(enum, name for /metrics). */
#define UP_POOLS(X)                                                                                \
    X(UP_POOL_PASSTHROUGH, "passthrough") /* clients' requests kwc forwards */                     \
    X(UP_POOL_CACHE, "cache")             /* the reflectors' discovery, LIST and WATCH */          \
    X(UP_POOL_DISCOVERY, "discovery")     /* discovery kept current (disco.h) */                   \
    X(UP_POOL_TOKENREVIEW, "tokenreview") /* authentication: TokenReview */                        \
    X(UP_POOL_SAR, "subjectaccessreview") /* authorization: SubjectAccessReview */
enum up_pool {
#define UP_POOL_ENUM(e, name) e,
    UP_POOLS(UP_POOL_ENUM)
#undef UP_POOL_ENUM
        UP_NPOOLS
};
extern const char *const up_pool_names[UP_NPOOLS];

struct up_options {
    int connect_timeout_ms;        /* TCP+TLS connect */
    int header_timeout_ms;         /* request sent -> response headers; 0 = none */
    int max_idle_conns;            /* idle connections kept for reuse, per pool */
    unsigned max_conns[UP_NPOOLS]; /* open connections per pool; 0: no cap */
};

struct up_header {
    const char *name, *value; /* borrowed, valid during the callback */
};

#define UP_PAUSE 1         /* on_data: not consumed, call again after up_xfer_resume_recv() */
#define UP_BODY_PAUSE (-2) /* on_body: no bytes now, up_xfer_resume_send() later */

struct up_xfer_cbs {
    /* Final response head (1xx skipped). Names are canonicalised like Go's
     * textproto (Content-Type). Return 0, or non-zero to abort (then on_done). */
    int (*on_headers)(void *arg, int status, const struct up_header *h, size_t n);
    /* Response body bytes. Return 0 (consumed) or UP_PAUSE (not consumed). */
    int (*on_data)(void *arg, const char *p, size_t n);
    /* Fill up to cap bytes of request body. Return the count, 0 at the end of
     * the body, or UP_BODY_PAUSE. Only called when the request has a body. */
    ssize_t (*on_body)(void *arg, char *buf, size_t cap);
    /* Transfer over: err 0 on success, else -errno / KWC_E*; msg says what
     * happened (for logs and Status messages). The xfer is freed after this. */
    void (*on_done)(void *arg, int err, const char *msg);
};

struct up_request {
    const char *method;
    const char *target;              /* path?query, sent as is */
    const struct up_header *headers; /* extra request headers (already filtered) */
    size_t nheaders;
    bool has_body;
    int64_t body_len;  /* -1: unknown (chunked) */
    bool long_running; /* a watch or stream: no header timeout needed */
    enum up_pool pool; /* whose connections carry it (0: passthrough) */
};

/*
 * Create the client for one loop from resolved upstream settings (borrowed;
 * must outlive the client). Returns 0 or a negative code, with a message in err.
 */
int up_client_new(struct event_base *base, const struct kcfg *k, const struct up_options *o,
                  struct up_client **out, char *err, size_t errlen);
/*
 * A client for another loop (base: a serving loop's, on whose thread this
 * is called and the client used and freed) sharing parent's uplink: the
 * same kubeconfig, TLS material and credentials; pools of its own, capped by
 * o. parent must be an up_client_new's and outlive it. Returns 0 (no
 * failure today; err for the future).
 *
 * Caps: the flags stay totals (they bound the upstream sockets
 * --max-connections and the descriptor budget count, config.h), so of N
 * serving loops loop i gets total / N, + 1 for i < total % N, and at least
 * 1 (then the total is max(total, N): budget that) for the passthrough
 * (--max-upstream-connections) and each review pool
 * (--max-review-connections); the cache and discovery pools stay on the
 * main loop's client. A pool's curl multi handle (and its wakeup socketpair)
 * is made on its first transfer, so a pool a loop never uses costs nothing.
 * Over TLS the upstream speaks HTTP/2 and one connection carries ~100
 * streams, so small shares cost little; on a plain HTTP/1.1 upstream each
 * passthrough watch holds a connection and a loop's share bounds its
 * watches (more wait for one): raise the flag with the loop count there.
 */
int up_client_new_sibling(struct up_client *parent, struct event_base *base,
                          const struct up_options *o, struct up_client **out, char *err,
                          size_t errlen);
/* On the client's own thread; a parent after all its siblings. */
void up_client_free(struct up_client *c);

/* The client's identity towards the upstream (TLS, credentials, header
 * policy: uplink.h), for the connections kwc opens itself (tunnels) on the
 * client's loop; valid for the client's life. A sibling's is its own
 * uplink (its loop's DNS base, waiters) sharing the parent's credentials. */
struct uplink *up_client_uplink(const struct up_client *c);

/* Start a request (cbs borrowed, must outlive the xfer). */
int up_xfer_start(struct up_client *c, const struct up_request *r, const struct up_xfer_cbs *cbs,
                  void *arg, struct up_xfer **out);
void up_xfer_resume_recv(struct up_xfer *x);
void up_xfer_resume_send(struct up_xfer *x);
/* Abort; no callback follows. Safe from inside this xfer's own callbacks. */
void up_xfer_cancel(struct up_xfer *x);

/* Counters for /metrics and tests. */
struct up_stats {
    uint64_t started, failed, active;
};
void up_client_stats(const struct up_client *c, struct up_stats *out);

/* One pool: its open connections (sockets curl opened and has not closed
 * yet, idle ones included), its cap (0: none) and its transfers in flight,
 * those waiting for a connection included. */
struct up_pool_stats {
    unsigned conns, max_conns;
    uint64_t active;
};
void up_client_pool_stats(const struct up_client *c, enum up_pool p, struct up_pool_stats *out);

/* Requests to the upstream by method and status code, and the time from
 * the start to the response head (client-go's rest_client_request_*
 * metrics in spirit), for /metrics. Loop thread. */
#define UP_NMETHODS 8         /* GET HEAD POST PUT PATCH DELETE OPTIONS other */
#define UP_CODE_ERROR 500     /* requests[m][code - 100] for 100..599; then: no response */
#define UP_CODE_CANCELLED 501 /* cancelled before a response (the client went away) */
extern const char *const up_method_names[UP_NMETHODS];
struct up_metrics {
    uint64_t requests[UP_NMETHODS][502];
    struct metrics_hist latency[UP_NMETHODS];
};
const struct up_metrics *up_client_metrics(const struct up_client *c);

#endif
