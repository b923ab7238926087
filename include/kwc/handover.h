/*
 * handover.h — a new kwc takes over from a running one (issue 31, part 2):
 * a binary upgrade of a single instance that refuses no connection, as
 * haproxy (-x) and nginx hand their listening sockets to a new process.
 *
 * Every kwc listens on DIR/kwc.sock (DIR: its --data-dir; mode 0600, only
 * its own user or root may talk to it). `kwc --takeover` with the same
 * flags then:
 *
 *   new -> old  "KWC-TAKEOVER 1\n"
 *   old         stops its caches and writes nothing more (catalog_freeze),
 *               releases the data dir's lock; it goes on serving (its reads
 *               pass through meanwhile), accepting too
 *   old -> new  "RELEASED <pid>\n"
 *   new         takes the lock, checks and opens the data dir
 *   new -> old  "LISTENERS\n"
 *   old -> new  "LISTENERS <n>\n" carrying its n listening sockets
 *               (SCM_RIGHTS), then drains and exits: its watch streams end
 *               cleanly and their clients come back to the same sockets
 *   new         serves on those sockets (whatever queued in their backlog
 *               meanwhile is accepted now), its caches resume from the
 *               data dir's resourceVersions: no relist, no refused
 *               connection.
 *
 * If the new one goes away before it has the sockets (it fails, the
 * connection closes, a step times out), the old one takes its lock back
 * and its caches resume (catalog_thaw).
 */
#ifndef KWC_HANDOVER_H
#define KWC_HANDOVER_H

#include <stddef.h>

#include "kwc/http.h"

struct event_base;
struct handover;
struct handover_client;

#define HANDOVER_SOCKET "kwc.sock"
#define HANDOVER_MAX_FDS 16

/* The running kwc's side: what a takeover asks of it. */
struct handover_hooks {
    /* stop writing the data dir and release its lock; 0, or an error with a
     * message in err (the takeover is refused) */
    int (*freeze)(void *arg, char *err, size_t errlen);
    void (*thaw)(void *arg);                               /* it failed: resume */
    size_t (*listen_fds)(void *arg, int *fds, size_t max); /* the sockets to hand over */
    void (*handed)(void *arg);                             /* sent: drain and exit */
    void *arg;
};

/* Listen on data_dir/kwc.sock (replacing a stale one). Returns 0, or an
 * error with a message in err (kwc then runs without it: it logs why). */
int handover_serve(struct event_base *base, const char *data_dir, const struct handover_hooks *h,
                   struct handover **out, char *err, size_t errlen);
void handover_free(struct handover *h);

/* The new kwc's side, before its event loop runs (blocking, each step
 * bounded by timeout_ms): ask the kwc on data_dir to release it. 0, or
 * KWC_ECONFIG with a message for a person in err. */
int handover_request(const char *data_dir, int timeout_ms, struct handover_client **out, char *err,
                     size_t errlen);
/* Once the data dir is open: the running kwc's listening sockets (*n of
 * them, at most max); they are the caller's. */
int handover_take_listeners(struct handover_client *c, int *fds, size_t max, size_t *n, char *err,
                            size_t errlen);
/* Closing before handover_take_listeners makes the running kwc resume. */
void handover_client_free(struct handover_client *c);
/* out[i]: the socket of got listening on addrs[i] (a port 0 there takes
 * any port), or -1 (bound anew). Sockets no address wants are closed. */
void handover_match(const struct http_listen_addr *addrs, size_t naddrs, int *got, size_t ngot,
                    int *out);

#endif
