/*
 * front.h — the request stages on kwc's HTTP server (http.h): the hallway
 * every request walks once its head is read, before its body is. The parts
 * the stages hand requests to are built and wired by app.h; the front only
 * borrows them.
 *
 *   parse (route.h) -> Host check -> authenticate -> impersonate
 *     -> authorize -> route -> respond
 *
 *  - parse: the target into a route_req; a bad one is 400, a long one 414;
 *  - Host check: a plaintext request must name a loopback Host or one
 *    --accept-hosts allows (403);
 *  - with --auth none, and for /healthz, /livez and /readyz, the request
 *    goes from here straight to route;
 *  - authenticate (auth.h): client certificate, TokenReview, anonymous if
 *    allowed; none is 401;
 *  - impersonate (impersonate.h): every Impersonate-* header asked about
 *    (verb impersonate) in kube's order; the first denial is kube's 403;
 *  - authorize: what kwc may answer itself (a get, list or watch of a cached
 *    resource; /metrics; discovery from its copy: discovery.h) with a
 *    SubjectAccessReview (403 when denied);
 *    everything else the upstream decides;
 *  - route: kwc's own endpoints (/healthz, /livez, /readyz, /metrics),
 *    CONNECT (405), upgrade tunnels (exec/attach/port-forward), discovery
 *    from the copy (discovery.h), cached watches (watch.h), lists and gets
 *    (serve.h), and passthrough to the upstream for everything else.
 */
#ifndef KWC_FRONT_H
#define KWC_FRONT_H

#include <stdbool.h>
#include <stddef.h>

struct event_base;
struct up_client;
struct refl;
struct catalog;
struct serve;
struct watch_pool;
struct discovery;
struct pt_options;
struct auth;
struct metrics;
struct access;
struct hreq;
struct front;
struct mailbox;

/* What the stages hand requests to. Everything is borrowed and must outlive
 * the front. */
struct front_parts {
    struct event_base *base; /* the server's loop */
    struct catalog *cat;     /* the caches: /readyz, which requests kwc may answer, on demand */
    int start_wait_ms;       /* --cache-start-timeout: a read waits this long for a warming cache */
    struct serve *serve;     /* cached lists and gets */
    struct watch_pool *watch;                    /* cached watches */
    struct discovery *discovery;                 /* discovery answered from the copy */
    struct up_client *up;                        /* passthrough; tunnels use its uplink */
    const struct pt_options *pt_short, *pt_long; /* passthrough: short, long-running */
    int tunnel_connect_timeout_ms;
    struct auth *auth;  /* NULL: --auth none (every caller acts as kwc) */
    bool forward_token; /* --passthrough-identity=forward-token */
    bool tls;           /* served over TLS: no Host check */
    /* --accept-hosts: may a plaintext request name host (port and brackets
     * off)? NULL: loopback names only. */
    bool (*accept_host)(const void *arg, const char *host);
    const void *accept_host_arg;
    struct metrics *metrics; /* /metrics */
    struct access *access;   /* a record per request (metrics, the access log) */
    /* A serving loop's front (app.c): kwc's endpoints that read the main
     * loop's state (/metrics, /readyz) are rendered there, posted through
     * main_mb, and answered here through loop_mb (mailbox.h). /metrics is
     * rendered by metrics_render (main loop), which calls done there. NULL
     * main_mb: the front runs on the main loop. */
    struct mailbox *main_mb, *loop_mb;
    void (*metrics_render)(void *arg, void (*done)(void *arg, char *text, size_t n),
                           void *done_arg);
    void *metrics_render_arg;
};

/* A new front over p's parts (p copied). */
struct front *front_new(const struct front_parts *p);
void front_free(struct front *f);

/* The stages for one request: an http_request_cb (http.h) whose arg is the
 * front. Each request gets an access record as its note (hreq_set_note); the
 * server's done callback finishes it (access_finish). Loop thread. */
void front_on_request(void *front, struct hreq *req);
/* The store committed, or a cache left or came back into service
 * (refl_ingest_subscribe): requests waiting for a warming cache whose wait
 * is over are routed again. */
void front_caches_changed(void *front);
void front_cache_service(void *front, const struct refl *r, bool serving);
/* Discovery changed (disco_subscribe): requests waiting for its first
 * answer are routed again. */
void front_discovery_changed(void *front);
/* Shutdown has begun (--shutdown-delay-duration): /readyz fails from now
 * on with kube's "[-]shutdown failed"; every other request is served. */
void front_shutting_down(struct front *f);

#endif
