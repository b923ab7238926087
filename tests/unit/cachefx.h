/*
 * cachefx.h — a cache to serve from, for the serving rooms' unit tests
 * (serve_test.c, watch_test.c): a real LMDB store in a scratch directory
 * holding the v1/pods JSON cache as a synced list left it, and a real
 * reflector that serves it as a warm data dir (refl_start: "served at once,
 * even with the upstream down"). Its upstream is a socket on 127.0.0.1 that
 * listens and never accepts: discovery waits there for the whole test, so
 * the cache changes only by the events a test writes (cfx_event).
 *
 * And the client side: kwc's HTTP server on a fresh event_base, one end of a
 * socketpair(AF_UNIX) adopted per client, the test reading the other.
 * Nothing leaves the process but the connection to the silent upstream.
 */
#ifndef KWC_TEST_CACHEFX_H
#define KWC_TEST_CACHEFX_H

#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/gostr.h"
#include "kwc/http.h"
#include "kwc/index.h"
#include "kwc/kinds.h"
#include "kwc/kubeconfig.h"
#include "kwc/object.h"
#include "kwc/reflector.h"
#include "kwc/route.h"
#include "kwc/store.h"
#include "kwc/upstream.h"
#include "lmdbdir.h"
#include "tap.h"

#define CFX_MAX_PEERS 8
#define CFX_MAX_REQS 64
#define CFX_LIST_RV 100000 /* the rv of the initial list */

struct cfx_peer {
    int fd;
    struct gostr_buf in; /* every byte the server sent */
    bool eof;
};

struct cfx {
    struct event_base *base;
    char dir[64];
    struct store *st;
    struct store_res *sres;
    const struct obj_field *fields;
    size_t nf;
    uint64_t rv; /* the newest rv written */
    int lfd;     /* the upstream: listening, never accepting */
    struct kcfg *k;
    struct up_client *up;
    struct refl_ingest *ing;
    struct refl *refls[1];
    struct refl_set set; /* over refls */
    struct http_server *http;
    struct cfx_peer p[CFX_MAX_PEERS];
    int np;
    /* the requests' routes (a stage's; they outlive the handlers' use) */
    struct route_req routes[CFX_MAX_REQS];
    int nroutes;
    struct hreq *last_req; /* the newest request, NULL once it left the server */
    int ndone;
    struct hreq_done last_done; /* its strings are not kept */
    /* the route stage under test: take r or answer it */
    void (*take)(struct cfx *f, struct hreq *r, const struct route_req *route);
    void *arg;
};

/* A pod of about size bytes (its "pad" field fills it out). */
static inline char *
cfx_pod(const char *ns, const char *name, uint64_t rv, const char *node, size_t size)
{
    char *pad = xmalloc(size + 1);
    memset(pad, 'x', size);
    pad[size] = '\0';
    char *o = xasprintf("{\"metadata\":{\"name\":\"%s\",\"namespace\":\"%s\",\"resourceVersion\":"
                        "\"%llu\",\"labels\":{\"app\":\"web\"}},\"spec\":{\"nodeName\":\"%s\"},"
                        "\"pad\":\"%s\"}",
                        name, ns, (unsigned long long)rv, node, pad);
    free(pad);
    return o;
}

/* Put one pod into w: as of the list (load) or as an event. */
static inline void
cfx_put(struct cfx *f, struct store_wtxn *w, bool load, enum store_ev_type t, const char *ns,
        const char *name, uint64_t rv, size_t size)
{
    char *o = cfx_pod(ns, name, rv, "n1", size);
    struct obj_fields_spec spec = {.fields = f->fields, .n_fields = f->nf};
    struct obj_meta m;
    char *idx;
    size_t il;
    if (obj_meta_parse(o, strlen(o), &spec, &m, NULL, 0) != 0 || idx_encode(&m, &idx, &il) != 0)
        abort();
    char key[200];
    snprintf(key, sizeof key, "%s/%s", ns, name);
    struct store_event ev = {.type = t,
                             .rv = rv,
                             .key = key,
                             .key_len = strlen(key),
                             .obj = o,
                             .obj_len = strlen(o),
                             .idx = idx,
                             .idx_len = il};
    if ((load ? store_wtxn_load(w, f->sres, &ev) : store_wtxn_event(w, f->sres, &ev)) != 0)
        abort();
    free(idx);
    obj_meta_fini(&m);
    free(o);
}

/* An event at the next rv, committed. */
static inline uint64_t
cfx_event(struct cfx *f, enum store_ev_type t, const char *ns, const char *name, size_t size)
{
    struct store_wtxn *w;
    if (store_wtxn_begin(f->st, 1, &w) != 0)
        abort();
    cfx_put(f, w, false, t, ns, name, ++f->rv, size);
    if (store_wtxn_commit(w) != 0)
        abort();
    return f->rv;
}

/* Every request: routed as the front end's parse stage does, then offered
 * to the stage under test. */
static inline void
cfx_on_request(void *arg, struct hreq *r)
{
    struct cfx *f = arg;
    size_t tl;
    const char *target = hreq_target(r, &tl);
    if (f->nroutes == CFX_MAX_REQS)
        abort();
    struct route_req *route = &f->routes[f->nroutes++];
    if (route_parse(hreq_method(r), target, tl, route) != 0)
        abort();
    f->last_req = r;
    f->take(f, r, route);
}

static inline void
cfx_on_done(void *arg, const struct hreq_done *d, void *note)
{
    struct cfx *f = arg;
    f->last_req = NULL;
    f->ndone++;
    f->last_done = *d;
    f->last_done.method = f->last_done.target = NULL;
}

/*
 * The store (history bounded to hist_events), nobj pods "ns/pNNNN" of about
 * obj_size bytes listed at CFX_LIST_RV, and the reflector serving them.
 */
static inline void
cfx_open(struct cfx *f, size_t nobj, size_t obj_size, uint64_t hist_events)
{
    *f = (struct cfx){.lfd = -1};
    f->base = event_base_new();
    lmdbdir_make(f->dir, sizeof f->dir, "serving");
    struct store_options so;
    store_options_default(&so);
    so.map_size = 256u << 20;
    so.history_max_events = hist_events;
    if (store_open(f->dir, &so, &f->st) != 0 || store_res(f->st, "v1/pods:json", &f->sres) != 0)
        abort();
    f->fields = kinds_fields("", "pods", &f->nf);

    /* the upstream: accepts connections into its backlog, answers nothing */
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (f->lfd < 0 || bind(f->lfd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(f->lfd, 16) != 0 || getsockname(f->lfd, (struct sockaddr *)&sa, &sl) != 0)
        abort();
    char *yaml = xasprintf("apiVersion: v1\nkind: Config\ncurrent-context: t\n"
                           "clusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:%u\n"
                           "contexts:\n- name: t\n  context:\n    cluster: c\n    user: u\n"
                           "users:\n- name: u\n  user:\n    token: t\n",
                           (unsigned)ntohs(sa.sin_port));
    char err[256] = "";
    if (kcfg_parse(yaml, strlen(yaml), NULL, NULL, &f->k, err, sizeof err) != 0) {
        printf("# kcfg_parse: %s\n", err);
        abort();
    }
    free(yaml);

    /* the cache as a synced list from this upstream left it */
    struct store_wtxn *w;
    if (store_wtxn_begin(f->st, 1, &w) != 0 || store_wtxn_reset(w, f->sres, CFX_LIST_RV) != 0)
        abort();
    for (size_t i = 0; i < nobj; i++) {
        char name[32];
        snprintf(name, sizeof name, "p%04zu", i);
        cfx_put(f, w, true, STORE_ADDED, "ns", name, CFX_LIST_RV - nobj + i, obj_size);
    }
    if (store_wtxn_set_kind(w, f->sres, "PodList", "v1", true) != 0 ||
        store_wtxn_set_identity(w, f->sres, f->k->server) != 0 ||
        store_wtxn_set_synced(w, f->sres, true) != 0 || store_wtxn_commit(w) != 0)
        abort();
    f->rv = CFX_LIST_RV;

    struct up_options uo = {.connect_timeout_ms = 60000, .max_idle_conns = 4};
    struct refl_ingest_options io = {.data_dir = f->dir, .map_size = so.map_size};
    if (up_client_new(f->base, f->k, &uo, &f->up, err, sizeof err) != 0 ||
        refl_ingest_new(f->base, f->st, &io, &f->ing) != 0 ||
        refl_new(f->base, f->up, f->ing, "v1/pods", KWC_ENC_JSON, f->k->server, &f->refls[0], err,
                 sizeof err) != 0) {
        printf("# fixture: %s\n", err);
        abort();
    }
    f->set = (struct refl_set){.r = f->refls, .n = 1, .cap = 1};
    refl_start(f->refls[0]);
    ok(refl_serving(f->refls[0]), "the warm cache serves at once");

    struct http_server_options ho = {0};
    if (http_server_new(f->base, &ho, cfx_on_request, f, &f->http, err, sizeof err) != 0) {
        printf("# http_server_new: %s\n", err);
        abort();
    }
    http_server_on_done(f->http, cfx_on_done, f);
}

/* A new client; sndbuf > 0: the server end's send buffer (a slow network). */
static inline int
cfx_connect(struct cfx *f, int sndbuf)
{
    int sv[2];
    if (f->np == CFX_MAX_PEERS ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
        abort();
    if (sndbuf > 0) {
        setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
        setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &sndbuf, sizeof sndbuf);
    }
    f->p[f->np] = (struct cfx_peer){.fd = sv[0]};
    http_server_adopt(f->http, sv[1], NULL, 0);
    return f->np++;
}

/* Read what client i has been sent, up to max bytes (0: all there is). */
static inline size_t
cfx_read(struct cfx *f, int i, size_t max)
{
    struct cfx_peer *p = &f->p[i];
    size_t got = 0;
    while (p->fd >= 0 && !p->eof && (max == 0 || got < max)) {
        char buf[65536];
        size_t want = max && max - got < sizeof buf ? max - got : sizeof buf;
        ssize_t n = recv(p->fd, buf, want, 0);
        if (n > 0) {
            gostr_addn(&p->in, buf, (size_t)n);
            got += (size_t)n;
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EINTR))
            p->eof = true;
        break;
    }
    return got;
}

/* Bytes the server end has queued in the kernel for client i, unread. */
static inline bool
cfx_readable(struct cfx *f, int i)
{
    struct pollfd pf = {.fd = f->p[i].fd, .events = POLLIN};
    return f->p[i].fd >= 0 && poll(&pf, 1, 0) == 1;
}

/* Something that changes whenever the server sends (or a client reads). */
static inline unsigned long long
cfx_progress(struct cfx *f)
{
    unsigned long long v = (unsigned long long)f->nroutes;
    for (int i = 0; i < f->np; i++) {
        int q = 0;
        v += f->p[i].in.len + f->p[i].eof;
        if (f->p[i].fd >= 0 && ioctl(f->p[i].fd, FIONREAD, &q) == 0)
            v += (unsigned)q * 7919u;
    }
    return v;
}

/* Loop turns until nothing moves on the server's side (clients read only
 * when the test says): bounded. */
static inline void
cfx_run(struct cfx *f)
{
    int i, idle = 0;
    for (i = 0; i < 100000 && idle < 3; i++) {
        unsigned long long before = cfx_progress(f);
        event_base_loop(f->base, EVLOOP_NONBLOCK);
        bool busy = event_base_get_num_events(f->base, EVENT_BASE_COUNT_ACTIVE) > 0;
        idle = busy || cfx_progress(f) != before ? 0 : idle + 1;
    }
    if (i == 100000)
        ok(0, "the loop goes quiet");
}

static inline void
cfx_send(struct cfx *f, int i, const char *s)
{
    if (send(f->p[i].fd, s, strlen(s), MSG_NOSIGNAL) != (ssize_t)strlen(s))
        abort();
    cfx_run(f);
}

static inline void
cfx_hangup(struct cfx *f, int i)
{
    if (f->p[i].fd >= 0)
        close(f->p[i].fd);
    f->p[i].fd = -1;
}

/* The HTTP server first (its requests' hooks), then what serves. */
static inline void
cfx_close_http(struct cfx *f)
{
    for (int i = 0; i < f->np; i++)
        cfx_hangup(f, i);
    cfx_run(f);
    http_server_free(f->http);
    f->http = NULL;
}

static inline void
cfx_close(struct cfx *f)
{
    if (f->http)
        cfx_close_http(f);
    for (int i = 0; i < f->np; i++)
        free(f->p[i].in.p);
    for (int i = 0; i < f->nroutes; i++)
        route_fini(&f->routes[i]);
    refl_free(f->refls[0]);
    refl_ingest_free(f->ing);
    up_client_free(f->up);
    kcfg_free(f->k);
    store_close(f->st);
    close(f->lfd);
    lmdbdir_rm(f->dir);
    event_base_free(f->base);
}

/* ---- reading an HTTP/1.1 response ---- */

struct cfx_resp {
    int status; /* 0: no complete head yet */
    int heads;  /* status lines seen ("HTTP/1.") at the start of a head */
    char head[2048];
    struct gostr_buf body; /* decoded */
    bool chunked, complete;
};

/* Split the bytes of one response (from the start of in). */
static inline void
cfx_parse(const struct gostr_buf *in, struct cfx_resp *r)
{
    free(r->body.p);
    *r = (struct cfx_resp){0};
    const char *p = in->p ? in->p : "", *end = p + in->len;
    const char *he = memmem(p, (size_t)(end - p), "\r\n\r\n", 4);
    if (!he || sscanf(p, "HTTP/1.%*d %d", &r->status) != 1)
        return;
    for (const char *q = p; q && q < end; q = memmem(q + 1, (size_t)(end - q - 1), "HTTP/1.", 7))
        r->heads++;
    size_t hl = (size_t)(he - p) + 2;
    snprintf(r->head, sizeof r->head, "%.*s", (int)(hl < sizeof r->head ? hl : sizeof r->head - 1),
             p);
    const char *b = he + 4;
    r->chunked = strcasestr(r->head, "\r\nTransfer-Encoding: chunked\r\n") != NULL;
    if (!r->chunked) {
        const char *cl = strcasestr(r->head, "\r\nContent-Length: ");
        size_t n = cl ? strtoul(cl + 18, NULL, 10) : 0;
        size_t have = (size_t)(end - b);
        gostr_addn(&r->body, b, have < n ? have : n);
        r->complete = cl && have >= n;
        return;
    }
    while (b < end) {
        char *e;
        unsigned long n = strtoul(b, &e, 16);
        const char *crlf = memmem(b, (size_t)(end - b), "\r\n", 2);
        if (!crlf || e != crlf)
            return;
        if (n == 0) {
            r->complete = (size_t)(end - crlf) >= 4;
            return;
        }
        if ((size_t)(end - crlf - 2) < n + 2)
            return; /* a chunk not all here */
        gostr_addn(&r->body, crlf + 2, n);
        b = crlf + 2 + n + 2;
    }
}

#endif
