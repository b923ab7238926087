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
};

/* Add the collectors to m (src copied). Loop thread of the front end. */
void collect_register(struct metrics *m, const struct collect_sources *src);

#endif
