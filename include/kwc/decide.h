/*
 * decide.h — the resourceVersion decision table for list and get on a cached
 * resource: given the raw query values and the cache's state, serve from the
 * cache (and how), pass the request to the upstream, or answer the error
 * kube-apiserver would answer. Sits between route (parse) and the handlers
 * of lists, gets and watches: admission (admit.h) asks it. Pure: no I/O, no
 * clock, no allocation beyond the result.
 *
 * Where kube-apiserver serves each cell (k8s.io/apiserver/pkg/storage/cacher
 * shouldDelegateList/Get in kube 1.27-1.30; later releases serve more of the
 * etcd rows from the cache, which changes no answer here):
 *
 * list:
 *   rv     match          limit / continue  semantics         kube    kwc
 *   unset  unset          no continue       Most Recent       etcd    pass through
 *   "0"    unset|NotOlder any, no continue  Any (limit        cacher  SERVE_LATEST
 *                                           ignored)
 *   N      unset          no limit          Not older than N  cacher  SERVE_AT_LEAST(N)
 *   N      unset          limit             Exact N           etcd    SERVE_EXACT(N)
 *   N      NotOlderThan   no limit          Not older than N  cacher  SERVE_AT_LEAST(N)
 *   N      NotOlderThan   limit             Not older than N  etcd    SERVE_AT_LEAST(N), paged
 *   N      Exact          any               Exact N           etcd    SERVE_EXACT(N)
 *   unset  unset          continue          token's rv, Exact etcd    SERVE_EXACT(token rv)
 *   or "0"                                                            from the token's key
 *   N      unset          continue          400 BadRequest
 *   unset  set            any               422 Invalid
 *   any    set            continue          422 Invalid
 *   "0"    Exact          any               422 Invalid
 * get: rv unset -> etcd (pass through); "0" -> cacher, Any (SERVE_LATEST);
 * N -> cacher, Not older than N (SERVE_AT_LEAST). match, limit and continue
 * do not exist for get.
 *
 * kwc passes through where its cache cannot give kube's answer: rv unset (a
 * quorum read only the upstream can do), cache not synced yet, an exact rv
 * (or token rv) below the history floor (the upstream may still have it, and
 * else answers its own 410) or above the cache's rv (the upstream issued it
 * and kwc has not caught up), a token for the latest state (rv < 0), a token
 * cont_decode refuses (the upstream answers kube's 400 for it, or serves it).
 * A NotOlderThan rv the cache has not reached yet is waited for (about 3 s,
 * as the cacher does); then, since a proxy cannot make the upstream report
 * progress on a quiet resource, kwc passes through by default, or answers
 * kube's 504 when configured to (decide_timeout()).
 */
#ifndef KWC_DECIDE_H
#define KWC_DECIDE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum decide_verb { DECIDE_GET, DECIDE_LIST, DECIDE_WATCH };

/* The request: query values percent-decoded, NULL when the parameter is
 * absent (route.h struct route_query holds them). "" counts as unset for
 * resourceVersion, resourceVersionMatch and continue, as in kube-apiserver,
 * but a present limit/timeoutSeconds must parse, even when empty. */
struct decide_req {
    enum decide_verb verb;
    const char *resource_version;
    const char *resource_version_match;
    const char *limit;
    const char *continue_token;
    const char *timeout_seconds;     /* list: parsed, like kube, before limit */
    const char *send_initial_events; /* list: forbidden when present */
    bool has_selector;               /* a non-empty label or field selector */
    /* list: the 400 message for a labelSelector/fieldSelector that failed to
     * parse (the caller's selector module), or NULL. kube-apiserver reports it
     * after timeoutSeconds/limit and before ListOptions validation; field-label
     * conversion errors come after validation and stay with the caller. */
    const char *selector_error;
};

/* The resource's cache (store_info). */
struct decide_cache {
    bool synced;         /* an initial list has completed */
    uint64_t current_rv; /* newest rv the cache has reached */
    uint64_t floor_rv;   /* oldest rv whose exact state the cache can rebuild */
};

/* What to do when a NotOlderThan rv is still ahead of the cache after the wait. */
enum decide_too_large {
    DECIDE_TOO_LARGE_PASS, /* pass the request to the upstream (default) */
    DECIDE_TOO_LARGE_504,  /* kube's 504 Timeout "Too large resource version" */
};

#define DECIDE_ACTIONS(X)                                                                          \
    X(DECIDE_PASS_THROUGH, "pass_through")                                                         \
    X(DECIDE_SERVE_LATEST, "serve_latest")                                                         \
    X(DECIDE_SERVE_AT_LEAST, "serve_at_least")                                                     \
    X(DECIDE_SERVE_EXACT, "serve_exact")                                                           \
    X(DECIDE_SERVE_WATCH, "serve_watch")                                                           \
    X(DECIDE_ERROR, "error")

enum decide_action {
#define DECIDE_ACTION_ENUM(e, s) e,
    DECIDE_ACTIONS(DECIDE_ACTION_ENUM)
#undef DECIDE_ACTION_ENUM
};

/* Why a request is passed through (for logs: serve.c's debug line). */
#define DECIDE_WHYS(X)                                                                             \
    X(DECIDE_WHY_NONE, "none")                                                                     \
    X(DECIDE_WHY_MOST_RECENT, "most_recent") /* needs a quorum read */                             \
    X(DECIDE_WHY_NOT_SYNCED, "not_synced")                                                         \
    X(DECIDE_WHY_BELOW_FLOOR, "below_floor")            /* exact rv older than the history */      \
    X(DECIDE_WHY_AHEAD, "ahead_of_cache")               /* exact rv newer than the cache */        \
    X(DECIDE_WHY_TOKEN_LATEST, "continue_latest")       /* token rv < 0 */                         \
    X(DECIDE_WHY_TOKEN_UNDECODED, "continue_undecoded") /* cont_decode refused it */               \
    X(DECIDE_WHY_TOO_LARGE, "too_large_rv")             /* NotOlderThan wait timed out */

enum decide_why {
#define DECIDE_WHY_ENUM(e, s) e,
    DECIDE_WHYS(DECIDE_WHY_ENUM)
#undef DECIDE_WHY_ENUM
};

struct decide_result {
    enum decide_action action;
    enum decide_why why; /* PASS_THROUGH only; else DECIDE_WHY_NONE */

    /* SERVE_AT_LEAST: serve at the cache's rv once it is >= rv (wait is true
     * when it is not yet); SERVE_EXACT: serve the state at exactly rv. */
    uint64_t rv;
    bool wait;
    enum decide_action on_timeout; /* SERVE_AT_LEAST: PASS_THROUGH or ERROR */

    int64_t limit;        /* page size; 0: the whole list */
    bool remaining_count; /* a cut page carries remainingItemCount (no selector) */
    /* SERVE_EXACT from a continue token: the first key to return (inclusive),
     * relative to the request's key prefix, usually "<last key>\0"; new,
     * may hold NULs. NULL otherwise. */
    char *start_key;
    size_t start_key_len;

    /* SERVE_WATCH: initial: synthetic ADDED for the state at the start
     * (at least rv when rv > 0; wait: the cache is not there yet), then
     * live; else every event after rv (the cache's rv for "from now"; wait:
     * rv is ahead of the cache, the watch waits for it as a too-large read).
     * initial_end: sendInitialEvents, so a BOOKMARK with
     * k8s.io/initial-events-end follows the initial events (when bookmarks
     * are allowed). timeout_seconds: the watch's length, 0: kube's random
     * default, < 0: ends at once. */
    bool initial, initial_end;
    int64_t timeout_seconds;
    /* ERROR: the Status kube-apiserver sends. */
    int code;
    const char *reason;      /* static; "" for none (a plain 500) */
    char *message;           /* new */
    char *body;              /* new: the Status JSON (status_failure_json) */
    int retry_after_seconds; /* > 0: also send a Retry-After header */
};

/*
 * Decide a list or get. Checks run in kube-apiserver's order: query decoding
 * (400), ListOptions validation (422), then the storage layer's own checks
 * (400, or a plain 500 for an unparsable rv on the cacher's path), and only
 * then the cache's state. Fills *out (decide_result_fini releases it). Never
 * fails; aborts only on OOM.
 */
void decide_read(const struct decide_req *req, const struct decide_cache *cache,
                 enum decide_too_large policy, struct decide_result *out);
/*
 * Decide a watch (kube-apiserver's ListResource with watch=true, then the
 * cacher's Watch): query decoding (400), validateWatchOptions (422), then
 * PASS_THROUGH while the cache is not synced, a plain 500 for an rv the
 * cacher cannot parse, else SERVE_WATCH:
 *   sendInitialEvents=true  (NotOlderThan N, "" or 0)  initial, at least N
 *   sendInitialEvents=false rv "" or "0"               from now
 *   sendInitialEvents=false rv N                       events after N
 *   no sendInitialEvents    rv "" or "0"               initial (current state)
 *   no sendInitialEvents    rv N                       events after N
 * An rv below the history floor is the caller's to answer: admission passes
 * such a watch to the upstream (it may still hold the events); one that
 * slips below the floor before its stream starts gets a 410 ERROR event
 * from the hub, as kube sends it.
 */
void decide_watch(const struct decide_req *req, const struct decide_cache *cache,
                  struct decide_result *out);

/*
 * A SERVE_AT_LEAST whose rv the cache (now at current_rv) has not reached by
 * the end of the wait: *out becomes PASS_THROUGH (DECIDE_WHY_TOO_LARGE) or
 * the 504 kube-apiserver's watch cache answers, per d->on_timeout.
 */
void decide_timeout(const struct decide_result *d, uint64_t current_rv, struct decide_result *out);

void decide_result_fini(struct decide_result *r);

const char *decide_action_name(enum decide_action a);
const char *decide_why_name(enum decide_why w);

#endif
