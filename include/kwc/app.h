/*
 * app.h — the serving side of the process, wired from the config: the
 * request stages (front.h) on kwc's HTTP server (http.h), and the parts they
 * hand requests to (serve, the watch pool, passthrough with its budget,
 * tunnels, delegated auth, the access log, /metrics and its collectors).
 * main.c builds what it stands on (the upstream client, the store, the
 * reflectors and their batched writer) and frees it after app_free.
 *
 * The store's commits reach their subscribers straight from the writer
 * (refl_ingest_subscribe): requests waiting for an rv (serve) first, then
 * watch streams (the watch pool), so a list that waited for an rv is
 * answered before the watch events of the same commit go out; a cache
 * leaving service ends its watch streams.
 * Loop thread only.
 */
#ifndef KWC_APP_H
#define KWC_APP_H

#include <stddef.h>

struct event_base;
struct kwc_config;
struct up_client;
struct up_options;
struct kcfg;
struct store;
struct refl;
struct refl_ingest;
struct catalog;
struct disco;
struct app;

/* What the app stands on; borrowed, must outlive the app. */
struct app_deps {
    struct event_base *base;
    const struct kwc_config *cfg;
    struct up_client *up; /* the main loop's: the caches, discovery */
    /* the serving loops' upstream clients are made from these (app.c);
     * up_opts NULL: no serving loop, the main loop serves (tests) */
    const struct kcfg *kcfg;
    const struct up_options *up_opts;
    struct store *st;
    struct refl_ingest *ing; /* the writer the app subscribes to */
    struct catalog *cat;     /* the caches (catalog.h) */
    struct disco *disco;     /* discovery answers are served from its copy; NULL: none */
    const int *listen_fds;   /* per cfg->listen_addrs: a socket taken over (handover.h), or
                                -1; NULL: bind them all */
};

/* Build the parts, bind and start serving. /readyz answers 200 while every
 * started cache that counts (refl_counts_ready) serves. Returns 0, or the
 * HTTP server's error (a listen address or TLS file that cannot be used)
 * with a message in err. */
int app_new(const struct app_deps *d, struct app **out, char *err, size_t errlen);
/* The port actually bound for the first listen address (--listen ADDR:0). */
int app_port(const struct app *a);
/* Shutdown's graceful part (main.c, on SIGTERM): the HTTP server stops
 * accepting and tells its clients (http_server_shutdown: GOAWAY over
 * HTTP/2, Connection: close over HTTP/1.1), every watch stream ends
 * cleanly (watch_pool_end_streams), and the requests in progress go on. */
void app_drain(struct app *a);
/* The listening sockets (a takeover hands them over); how many. */
size_t app_listen_fds(const struct app *a, int *fds, size_t max);
/* Before the drain (--shutdown-delay-duration): /readyz fails, everything
 * else goes on being served, new connections included. */
void app_shutting_down(struct app *a);
/* What is still going on while draining: requests in progress
 * (http_server_requests), client connections still open, watch streams not
 * yet closed (their last bytes leaving). Drained when all three are 0. */
struct app_busy {
    unsigned requests, connections;
    size_t watches;
};
void app_busy(const struct app *a, struct app_busy *out);
/* Ends watch streams (terminal chunks) and closes every connection, then
 * frees the parts. Before the store closes and the reflectors go. NULL ok. */
void app_free(struct app *a);

#endif
