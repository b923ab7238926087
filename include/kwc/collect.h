/*
 * collect.h — the collectors behind /metrics: at scrape time they read the
 * statistics each module keeps (reflector counters, the store's sizes, the
 * watch workers' per-resource counters, the upstream client's, the HTTP
 * server's, authentication's) and write them as Prometheus families
 * (metrics.h). Nothing here is on a request's or an event's path.
 * The families and their labels are listed in README.md ("Operations").
 */
#ifndef KWC_COLLECT_H
#define KWC_COLLECT_H

#include <stddef.h>

struct metrics;
struct refl;
struct refl_set;
struct refl_ingest;
struct store;
struct watch_pool;
struct up_client;
struct auth;
struct http_server;
struct access;
struct pt_budget;
struct disco;
struct discovery;

/*
 * Serving loops (app.c): the request side's counters live per loop (its
 * HTTP server, authentication, upstream client, passthrough budget,
 * discovery copy). A /metrics render on the main loop first asks each loop
 * to copy them on its own thread (collect_loop_take), sums the copies
 * (collect_loop_add into the sources' loops) and renders: every family
 * once, the sum of the loops plus the main loop's own.
 */
struct collect_loop;
struct collect_loop *collect_loop_new(void);
void collect_loop_free(struct collect_loop *l);
/* A copy in place (the snapshots of one render are an array): */
size_t collect_loop_size(void);
void collect_loop_zero(struct collect_loop *l);
void collect_loop_fini(struct collect_loop *l);
/* On the loop's thread: its numbers now. auth, budget, discovery may be
 * NULL. */
void collect_loop_take(struct collect_loop *out, const struct http_server *http,
                       const struct auth *auth, const struct up_client *up,
                       const struct pt_budget *budget, const struct discovery *discovery);
void collect_loop_add(struct collect_loop *sum, const struct collect_loop *x);

/* Everything borrowed; each must outlive the registry's last render. auth
 * may be NULL (--auth none). */
struct collect_sources {
    const struct refl_set *set; /* the caches (it may grow) */
    struct catalog *cat;        /* NULL: no catalog counters */
    struct refl_ingest *ing;    /* the caches' writer (upstream resets); NULL: none */
    struct store *st;
    struct watch_pool *watch;
    struct up_client *up;
    struct auth *auth;
    struct http_server *http;
    struct access *access;
    struct pt_budget *budget;    /* passthrough response bytes */
    struct disco *disco;         /* the upstream's discovery; NULL: none */
    struct discovery *discovery; /* discovery requests; NULL: none */
    /* the serving loops' numbers, summed before each render; NULL: none
     * (the main loop serves: http, auth, budget and discovery are its) */
    const struct collect_loop *loops;
    /* each serving loop's HTTP server, for the per-loop gauges (read with
     * http_server_stats from the scrape's thread); nloops 0: none */
    struct http_server *const *loop_http;
    unsigned nloops;
};

/* Add the collectors to m (src copied). Loop thread of the front end. */
void collect_register(struct metrics *m, const struct collect_sources *src);

#endif
