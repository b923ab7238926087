/*
 * upstream.c — libcurl multi on libevent (see upstream.h).
 *
 * Data path: a passthrough, a reflector or a review starts an up_xfer; curl
 * tells us which sockets to watch (on_curl_socket) and when to wake
 * (on_curl_timer); libevent calls back into curl_multi_socket_action; curl calls
 * our header/write/read callbacks, which forward to the xfer's owner.
 *
 * Re-entrancy rule: curl forbids removing or adding easy handles from inside
 * its callbacks. While the client is inside curl (c->depth > 0, whichever
 * pool's multi handle), cancels and starts are queued and carried out when
 * curl returns (run_deferred()).
 *
 * Pools (upstream.h): one multi handle each, with its own sockets, timer and
 * cap. Each pool counts its sockets through curl's open/close socket
 * callbacks; curl keeps the close callback's pointer with the connection, so
 * the pools are freed only after curl_multi_cleanup has closed them.
 */
#include "kwc/upstream.h"

#include <assert.h>
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/kubeconfig.h"
#include "kwc/log.h"
#include "kwc/metrics.h"
#include "kwc/uplink.h"

#define UP_MAGIC 0x75706331u   /* "upc1" */
#define XFER_MAGIC 0x75707831u /* "upx1" */
#define HDR_MAX_COUNT 256

struct pool {
    struct up_client *c;
    enum up_pool id;
    CURLM *multi;
    struct event *timer;
    unsigned conns; /* sockets open */
    uint64_t active;
};

struct up_xfer {
    uint32_t magic;
    struct up_client *c;
    struct pool *p;
    CURL *h;
    const struct up_xfer_cbs *cbs;
    void *arg;
    struct curl_slist *req_headers;
    struct curl_slist *connect_to;
    bool cancel_queued;
    struct event *hdr_timer;
    int status;
    bool headers_done, cancelled, done, added, timed_out, recv_paused;
    /* response head being collected */
    struct up_header hdrs[HDR_MAX_COUNT];
    char *hdr_store[HDR_MAX_COUNT];
    size_t nhdrs;
    char errbuf[CURL_ERROR_SIZE];
    TAILQ_ENTRY(up_xfer) pending; /* on c->to_add, c->to_cancel or c->waiting */
    bool caller_auth;             /* the request carries its own Authorization */
    bool waiting;                 /* on c->waiting: no credential yet (execcred.h) */
    struct uplink_waiter cred_wait;
    struct event *cred_timer; /* bounds the wait for a credential */
    uint64_t cred_gen;        /* the exec credential sent (0: none or static) */
    unsigned method_i;        /* up_method_names */
    uint64_t t0_ns;           /* started (CLOCK_MONOTONIC) */
};
TAILQ_HEAD(xfer_list, up_xfer);

struct up_client {
    uint32_t magic;
    struct event_base *base;
    struct pool pools[UP_NPOOLS];
    const struct kcfg *k;
    struct uplink *link; /* TLS material and kwc's credentials */
    struct up_options o;
    char *url_base;   /* scheme://host:port used in request URLs */
    char *connect_to; /* CURLOPT_CONNECT_TO entry for tls-server-name, or NULL */
    int depth;        /* > 0 while inside curl */
    bool sibling;     /* made by up_client_new_sibling: shares its parent's uplink */
    struct xfer_list to_add, to_cancel, waiting;
    struct up_stats stats;
    struct up_metrics m;
};

struct sock {
    struct pool *p;
    struct event *ev;
    curl_socket_t fd;
};

static void check_done(struct pool *p);
static struct up_client *client_new(struct event_base *base, const struct kcfg *k,
                                    struct uplink *link, const struct up_options *o);
static void run_deferred(struct up_client *c);

static struct timeval
ms_tv(long ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

/* ---- socket and timer plumbing ---- */

static void
on_sock_event(evutil_socket_t fd, short what, void *arg)
{
    struct sock *s = arg;
    struct up_client *c = s->p->c;
    int flags = (what & EV_READ ? CURL_CSELECT_IN : 0) | (what & EV_WRITE ? CURL_CSELECT_OUT : 0);
    int running;
    c->depth++;
    curl_multi_socket_action(s->p->multi, fd, flags, &running);
    c->depth--;
    run_deferred(c);
}

static int
on_curl_socket(CURL *e, curl_socket_t fd, int what, void *userp, void *socketp)
{
    struct pool *p = userp;
    struct sock *s = socketp;
    if (what == CURL_POLL_REMOVE) {
        if (s) {
            event_free(s->ev);
            free(s);
            curl_multi_assign(p->multi, fd, NULL);
        }
        return 0;
    }
    if (!s) {
        s = xcalloc(1, sizeof(*s));
        s->p = p;
        s->fd = fd;
        curl_multi_assign(p->multi, fd, s);
    } else {
        event_free(s->ev);
    }
    short ev =
        EV_PERSIST | (what & CURL_POLL_IN ? EV_READ : 0) | (what & CURL_POLL_OUT ? EV_WRITE : 0);
    s->ev = event_new(p->c->base, fd, ev, on_sock_event, s);
    event_add(s->ev, NULL);
    return 0;
}

static void
on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct pool *p = arg;
    struct up_client *c = p->c;
    int running;
    c->depth++;
    curl_multi_socket_action(p->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    c->depth--;
    run_deferred(c);
}

static int
on_curl_timer(CURLM *m, long timeout_ms, void *userp)
{
    struct pool *p = userp;
    if (timeout_ms < 0) {
        evtimer_del(p->timer);
    } else {
        struct timeval tv = ms_tv(timeout_ms);
        evtimer_add(p->timer, &tv);
    }
    return 0;
}

/* Every socket curl opens or closes, counted per pool (up_pool_stats). */
static curl_socket_t
on_open_socket(void *clientp, curlsocktype purpose, struct curl_sockaddr *a)
{
    struct pool *p = clientp;
    curl_socket_t fd = socket(a->family, a->socktype, a->protocol);
    if (fd != CURL_SOCKET_BAD)
        p->conns++;
    return fd;
}

static int
on_close_socket(void *clientp, curl_socket_t fd)
{
    struct pool *p = clientp;
    if (p->conns)
        p->conns--;
    return close(fd);
}

/* ---- transfer lifecycle ---- */

static uint64_t
mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void
xfer_free(struct up_xfer *x)
{
    struct up_client *c = x->c;
    /* every transfer ends here once: counted by method and code */
    unsigned code = x->headers_done && x->status >= 100 && x->status <= 599
                        ? (unsigned)x->status - 100
                    : x->cancelled && !x->done ? UP_CODE_CANCELLED
                                               : UP_CODE_ERROR;
    c->m.requests[x->method_i][code]++;
    if (x->h) {
        if (x->added)
            curl_multi_remove_handle(x->p->multi, x->h);
        curl_easy_cleanup(x->h);
    }
    if (x->added) {
        if (c->stats.active)
            c->stats.active--;
        if (x->p->active)
            x->p->active--;
    }
    if (x->cancel_queued)
        TAILQ_REMOVE(&c->to_cancel, x, pending);
    if (x->waiting) {
        TAILQ_REMOVE(&c->waiting, x, pending);
        uplink_cred_unwait(c->link, &x->cred_wait);
    }
    if (x->cred_timer)
        event_free(x->cred_timer);
    curl_slist_free_all(x->req_headers);
    curl_slist_free_all(x->connect_to);
    if (x->hdr_timer)
        event_free(x->hdr_timer);
    for (size_t i = 0; i < x->nhdrs; i++)
        free(x->hdr_store[i]);
    x->magic = 0;
    free(x);
}

static void
finish(struct up_xfer *x, int err, const char *msg)
{
    if (x->cancelled) {
        xfer_free(x);
        return;
    }
    x->done = true;
    if (err)
        x->c->stats.failed++;
    /* Detach from curl before the callback so the owner may start new xfers. */
    if (x->added) {
        curl_multi_remove_handle(x->p->multi, x->h);
        x->added = false;
        if (x->c->stats.active)
            x->c->stats.active--;
        if (x->p->active)
            x->p->active--;
    }
    x->cbs->on_done(x->arg, err, msg);
    xfer_free(x);
}

static int
map_curl_error(CURLcode rc)
{
    switch (rc) {
    case CURLE_OK:
        return 0;
    case CURLE_COULDNT_CONNECT:
        return -ECONNREFUSED;
    case CURLE_COULDNT_RESOLVE_HOST:
        return -EHOSTUNREACH;
    case CURLE_OPERATION_TIMEDOUT:
        return -ETIMEDOUT;
    case CURLE_GOT_NOTHING:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
        return -ECONNRESET;
    case CURLE_WRITE_ERROR:
    case CURLE_ABORTED_BY_CALLBACK:
    case CURLE_READ_ERROR:
        return -ECANCELED;
    default:
        return KWC_EUPSTREAM;
    }
}

static void
check_done(struct pool *p)
{
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(p->multi, &left))) {
        if (m->msg != CURLMSG_DONE)
            continue;
        struct up_xfer *x = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
        assert(x && x->magic == XFER_MAGIC);
        CURLcode rc = m->data.result;
        int err = map_curl_error(rc);
        if (rc == CURLE_OK && !x->headers_done)
            err = -ECONNRESET; /* a body-less end before any head */
        const char *msg = x->errbuf[0] ? x->errbuf : curl_easy_strerror(rc);
        finish(x, err, err ? msg : "");
    }
}

static void
add_handle(struct up_xfer *x)
{
    x->added = true;
    x->c->stats.active++;
    x->p->active++;
    curl_multi_add_handle(x->p->multi, x->h);
}

static void
run_deferred(struct up_client *c)
{
    if (c->depth > 0)
        return;
    struct up_xfer *x;
    while ((x = TAILQ_FIRST(&c->to_cancel)))
        xfer_free(x); /* unlinks itself */
    while ((x = TAILQ_FIRST(&c->to_add))) {
        TAILQ_REMOVE(&c->to_add, x, pending);
        add_handle(x);
    }
    for (int i = 0; i < UP_NPOOLS; i++)
        if (c->pools[i].multi)
            check_done(&c->pools[i]);
    /* Finishing may have queued more work (an on_done that starts a request). */
    if (!TAILQ_EMPTY(&c->to_cancel) || !TAILQ_EMPTY(&c->to_add))
        run_deferred(c);
}

/* ---- curl callbacks (c->depth > 0 here) ---- */

/* Go's textproto.CanonicalMIMEHeaderKey for tokens: "content-type" -> "Content-Type". */
static void
canonical_name(char *s)
{
    bool up = true;
    for (; *s; s++) {
        *s = (char)(up ? toupper((unsigned char)*s) : tolower((unsigned char)*s));
        up = *s == '-';
    }
}

static void
reset_head(struct up_xfer *x)
{
    for (size_t i = 0; i < x->nhdrs; i++)
        free(x->hdr_store[i]);
    x->nhdrs = 0;
}

static size_t
on_header_line(char *p, size_t size, size_t n, void *arg)
{
    struct up_xfer *x = arg;
    size_t len = size * n;
    if (x->cancelled)
        return 0;
    size_t l = len;
    while (l && (p[l - 1] == '\n' || p[l - 1] == '\r'))
        l--;
    if (l >= 5 && memcmp(p, "HTTP/", 5) == 0) {
        reset_head(x);
        const char *sp = memchr(p, ' ', l);
        x->status = sp ? atoi(sp + 1) : 0;
        return len;
    }
    if (l == 0) {
        if (x->status < 200)
            return len; /* 100 Continue and friends: the real head follows */
        x->headers_done = true;
        if (x->status == 401 && x->cred_gen) /* client-go: refresh on 401 */
            uplink_unauthorized(x->c->link, x->cred_gen);
        metrics_hist_observe(&x->c->m.latency[x->method_i], (double)(mono_ns() - x->t0_ns) / 1e9);
        if (x->hdr_timer)
            evtimer_del(x->hdr_timer);
        if (x->cbs->on_headers(x->arg, x->status, x->hdrs, x->nhdrs) != 0 || x->cancelled)
            return 0;
        return len;
    }
    const char *colon = memchr(p, ':', l);
    if (!colon || x->nhdrs == HDR_MAX_COUNT)
        return len; /* folded or excess lines: drop */
    size_t nl = (size_t)(colon - p);
    const char *v = colon + 1;
    while (v < p + l && (*v == ' ' || *v == '\t'))
        v++;
    size_t vl = (size_t)(p + l - v);
    char *store = xmalloc(nl + vl + 2);
    memcpy(store, p, nl);
    store[nl] = '\0';
    canonical_name(store);
    memcpy(store + nl + 1, v, vl);
    store[nl + 1 + vl] = '\0';
    x->hdr_store[x->nhdrs] = store;
    x->hdrs[x->nhdrs].name = store;
    x->hdrs[x->nhdrs].value = store + nl + 1;
    x->nhdrs++;
    return len;
}

static size_t
on_write(char *p, size_t size, size_t n, void *arg)
{
    struct up_xfer *x = arg;
    size_t len = size * n;
    if (x->cancelled)
        return 0;
    if (len == 0)
        return 0;
    int r = x->cbs->on_data(x->arg, p, len);
    if (x->cancelled)
        return 0;
    if (r == UP_PAUSE) {
        x->recv_paused = true;
        return CURL_WRITEFUNC_PAUSE;
    }
    return len;
}

static size_t
on_read(char *buf, size_t size, size_t n, void *arg)
{
    struct up_xfer *x = arg;
    if (x->cancelled)
        return CURL_READFUNC_ABORT;
    ssize_t r = x->cbs->on_body(x->arg, buf, size * n);
    if (x->cancelled)
        return CURL_READFUNC_ABORT;
    if (r == UP_BODY_PAUSE)
        return CURL_READFUNC_PAUSE;
    if (r < 0)
        return CURL_READFUNC_ABORT;
    if (r > 0 && x->hdr_timer && !x->headers_done) {
        /* The header timeout counts from the end of the upload. */
        struct timeval tv = ms_tv(x->c->o.header_timeout_ms);
        evtimer_add(x->hdr_timer, &tv);
    }
    return (size_t)r;
}

static void
on_header_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct up_xfer *x = arg;
    struct up_client *c = x->c;
    char msg[640], why[560];
    if (x->waiting) {
        uplink_cred_why(c->link, why, sizeof(why));
        snprintf(msg, sizeof(msg), "kwc has no credential for the upstream: %s", why);
    } else
        snprintf(msg, sizeof(msg), "the upstream sent no response within %d s",
                 c->o.header_timeout_ms / 1000);
    finish(x, -ETIMEDOUT, msg);
    run_deferred(c);
}

/* ---- kwc's credentials ---- */

static void on_cred_ready(void *arg);
static void on_cred_timeout(evutil_socket_t fd, short what, void *arg);

/* The credential goes on last, when the transfer is handed to curl: an exec
 * plugin's may not be there now. Never out without kwc's credential: the
 * transfer waits for the plugin, bounded by its timeout. */
static void
arm(struct up_xfer *x)
{
    struct up_client *c = x->c;
    if (!x->caller_auth) {
        struct uplink_cred cr;
        if (!uplink_cred_get(c->link, x->h, &cr)) {
            x->waiting = true;
            TAILQ_INSERT_TAIL(&c->waiting, x, pending);
            x->cred_wait = (struct uplink_waiter){.on_ready = on_cred_ready, .arg = x};
            uplink_cred_wait(c->link, &x->cred_wait);
            if (!x->cred_timer) {
                x->cred_timer = evtimer_new(c->base, on_cred_timeout, x);
                struct timeval tv = ms_tv((long)uplink_kcfg(c->link)->exec->timeout_ms);
                evtimer_add(x->cred_timer, &tv);
            }
            return;
        }
        if (cr.bearer_line)
            x->req_headers = curl_slist_append(x->req_headers, cr.bearer_line);
        x->cred_gen = cr.gen;
        uplink_cred_clear(&cr);
    }
    if (x->cred_timer) {
        event_free(x->cred_timer);
        x->cred_timer = NULL;
    }
    curl_easy_setopt(x->h, CURLOPT_HTTPHEADER, x->req_headers);
    if (c->depth > 0) {
        TAILQ_INSERT_TAIL(&c->to_add, x, pending);
        return;
    }
    /* Add now, but let curl act on it from the loop (no callback from here). */
    add_handle(x);
}

static void
on_cred_ready(void *arg)
{
    struct up_xfer *x = arg;
    assert(x->magic == XFER_MAGIC && x->waiting);
    TAILQ_REMOVE(&x->c->waiting, x, pending);
    x->waiting = false;
    arm(x); /* waits again if another 401 came first */
}

static void
on_cred_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct up_xfer *x = arg;
    struct up_client *c = x->c;
    char msg[640], why[560];
    uplink_cred_why(c->link, why, sizeof(why));
    snprintf(msg, sizeof(msg), "kwc has no credential for the upstream: %s", why);
    finish(x, -EAGAIN, msg);
    run_deferred(c);
}

/* ---- public API ---- */

int
up_client_new(struct event_base *base, const struct kcfg *k, const struct up_options *o,
              struct up_client **out, char *err, size_t errlen)
{
    static bool curl_ready;
    if (!curl_ready) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
            snprintf(err, errlen, "libcurl failed to initialise");
            return KWC_EUPSTREAM;
        }
        curl_ready = true;
    }
    if (!k->server ||
        (strncmp(k->server, "http://", 7) != 0 && strncmp(k->server, "https://", 8) != 0)) {
        snprintf(err, errlen, "upstream server \"%s\" must start with http:// or https://",
                 k->server ? k->server : "");
        return KWC_ECONFIG;
    }
    struct uplink *link;
    int rc = uplink_new(base, k, &link, err, errlen);
    if (rc)
        return rc;
    *out = client_new(base, k, link, o);
    return 0;
}

int
up_client_new_sibling(struct up_client *parent, struct event_base *base, const struct up_options *o,
                      struct up_client **out, char *err, size_t errlen)
{
    assert(parent->magic == UP_MAGIC && !parent->sibling);
    (void)err;
    (void)errlen;
    struct up_client *c = client_new(base, parent->k, uplink_new_sibling(parent->link, base), o);
    c->sibling = true;
    *out = c;
    return 0;
}

/* A pool's multi handle, made on its first transfer: a loop that never uses
 * a pool (a serving loop's cache pool) holds no descriptor for it (curl's
 * wakeup socketpair). */
static void
pool_init(struct pool *p)
{
    struct up_client *c = p->c;
    const struct up_options *o = &c->o;
    int i = (int)p->id;
    p->multi = curl_multi_init();
    p->timer = evtimer_new(c->base, on_timer, p);
    long idle = o->max_idle_conns > 0 ? o->max_idle_conns : 32;
    if (o->max_conns[i] && idle > (long)o->max_conns[i])
        idle = (long)o->max_conns[i];
    curl_multi_setopt(p->multi, CURLMOPT_SOCKETFUNCTION, on_curl_socket);
    curl_multi_setopt(p->multi, CURLMOPT_SOCKETDATA, p);
    curl_multi_setopt(p->multi, CURLMOPT_TIMERFUNCTION, on_curl_timer);
    curl_multi_setopt(p->multi, CURLMOPT_TIMERDATA, p);
    curl_multi_setopt(p->multi, CURLMOPT_PIPELINING, (long)CURLPIPE_MULTIPLEX);
    curl_multi_setopt(p->multi, CURLMOPT_MAXCONNECTS, idle);
    /* Past the cap a transfer waits for a connection (curl's PENDING
     * state) rather than failing; with HTTP/2 it multiplexes on the open
     * ones first (PIPEWAIT). Idle connections count too: curl closes the
     * oldest idle one to make room. */
    curl_multi_setopt(p->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)o->max_conns[i]);
}

/* A client on base with its own pools; the uplink is its. */
static struct up_client *
client_new(struct event_base *base, const struct kcfg *k, struct uplink *link,
           const struct up_options *o)
{
    struct up_client *c = xcalloc(1, sizeof(*c));
    c->magic = UP_MAGIC;
    c->link = link;
    c->base = base;
    c->k = k;
    c->o = *o;
    TAILQ_INIT(&c->to_add);
    TAILQ_INIT(&c->to_cancel);
    TAILQ_INIT(&c->waiting);
    c->url_base = xstrdup(k->server);
    size_t ul = strlen(c->url_base);
    while (ul && c->url_base[ul - 1] == '/')
        c->url_base[--ul] = '\0';
    if (k->tls_server_name && strncmp(k->server, "https://", 8) == 0) {
        /* Send SNI and verify as tls-server-name while connecting to server:
         * the URL names tls-server-name, CONNECT_TO maps it to the real host. */
        bool tls;
        char host[256], port[16];
        kcfg_server_hostport(k->server, &tls, host, sizeof(host), port, sizeof(port));
        free(c->url_base);
        c->url_base = xasprintf("https://%s:%s", k->tls_server_name, port);
        c->connect_to =
            xasprintf("%s:%s:%s%s%s:%s", k->tls_server_name, port, strchr(host, ':') ? "[" : "",
                      host, strchr(host, ':') ? "]" : "", port);
    }

    for (size_t i = 0; i < UP_NMETHODS; i++)
        metrics_hist_init(&c->m.latency[i], metrics_client_buckets, metrics_client_nbuckets);
    for (int i = 0; i < UP_NPOOLS; i++) {
        c->pools[i].c = c;
        c->pools[i].id = (enum up_pool)i;
    }
    return c;
}

void
up_client_free(struct up_client *c)
{
    if (!c)
        return;
    assert(c->magic == UP_MAGIC);
    struct up_xfer *x;
    while ((x = TAILQ_FIRST(&c->to_cancel)))
        xfer_free(x);
    while ((x = TAILQ_FIRST(&c->to_add))) {
        TAILQ_REMOVE(&c->to_add, x, pending);
        xfer_free(x);
    }
    while ((x = TAILQ_FIRST(&c->waiting)))
        xfer_free(x); /* unlinks itself */
    for (int i = 0; i < UP_NPOOLS; i++) {
        if (!c->pools[i].multi)
            continue;                          /* never used */
        curl_multi_cleanup(c->pools[i].multi); /* closes its sockets: on_close_socket */
        event_free(c->pools[i].timer);
    }
    for (size_t i = 0; i < UP_NMETHODS; i++)
        metrics_hist_fini(&c->m.latency[i]);
    free(c->url_base);
    free(c->connect_to);
    uplink_free(c->link);
    c->magic = 0;
    free(c);
}

struct uplink *
up_client_uplink(const struct up_client *c)
{
    return c->link;
}

void
up_client_stats(const struct up_client *c, struct up_stats *out)
{
    *out = c->stats;
}

void
up_client_pool_stats(const struct up_client *c, enum up_pool p, struct up_pool_stats *out)
{
    assert((unsigned)p < UP_NPOOLS);
    *out = (struct up_pool_stats){
        .conns = c->pools[p].conns, .max_conns = c->o.max_conns[p], .active = c->pools[p].active};
}

const char *const up_pool_names[UP_NPOOLS] = {
#define UP_POOL_NAME(e, name) name,
    UP_POOLS(UP_POOL_NAME)
#undef UP_POOL_NAME
};

const char *const up_method_names[UP_NMETHODS] = {"GET",   "HEAD",   "POST",    "PUT",
                                                  "PATCH", "DELETE", "OPTIONS", "other"};

const struct up_metrics *
up_client_metrics(const struct up_client *c)
{
    return &c->m;
}

int
up_xfer_start(struct up_client *c, const struct up_request *r, const struct up_xfer_cbs *cbs,
              void *arg, struct up_xfer **out)
{
    assert(c->magic == UP_MAGIC);
    struct up_xfer *x = xcalloc(1, sizeof(*x));
    x->magic = XFER_MAGIC;
    x->c = c;
    assert((unsigned)r->pool < UP_NPOOLS);
    x->p = &c->pools[r->pool];
    if (!x->p->multi)
        pool_init(x->p);
    x->cbs = cbs;
    x->arg = arg;
    x->t0_ns = mono_ns();
    x->method_i = UP_NMETHODS - 1;
    for (unsigned i = 0; i + 1 < UP_NMETHODS; i++)
        if (strcmp(r->method, up_method_names[i]) == 0)
            x->method_i = i;
    x->h = curl_easy_init();
    CURL *h = x->h;
    char *url = xasprintf("%s%s", c->url_base, r->target);
    curl_easy_setopt(h, CURLOPT_URL, url);
    free(url);
    curl_easy_setopt(h, CURLOPT_PRIVATE, x);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, x->errbuf);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header_line);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)c->o.connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 30L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 10L);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, on_open_socket);
    curl_easy_setopt(h, CURLOPT_OPENSOCKETDATA, x->p);
    curl_easy_setopt(h, CURLOPT_CLOSESOCKETFUNCTION, on_close_socket);
    curl_easy_setopt(h, CURLOPT_CLOSESOCKETDATA, x->p);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
    /* PIPEWAIT: wait for a connection that may multiplex rather than open one.
     * Only HTTP/2 (TLS) multiplexes; on plain HTTP/1.1 it would queue requests
     * behind busy connections. */
    if (strncmp(c->url_base, "https://", 8) == 0)
        curl_easy_setopt(h, CURLOPT_PIPEWAIT, 1L);
    curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 65536L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    if (c->connect_to) {
        x->connect_to = curl_slist_append(NULL, c->connect_to);
        curl_easy_setopt(h, CURLOPT_CONNECT_TO, x->connect_to);
    }
    /* A caller's own Authorization (--passthrough-identity=forward-token)
     * replaces kwc's token or basic credentials on this request. */
    bool caller_auth = false;
    for (size_t i = 0; i < r->nheaders; i++)
        caller_auth |= strcasecmp(r->headers[i].name, "Authorization") == 0;
    uplink_curl_setup(c->link, h, caller_auth);

    struct curl_slist *hl = NULL;
    for (size_t i = 0; i < r->nheaders; i++) {
        /* "Name:" would tell curl to drop the header: an empty value is
         * curl's "Name;" (Impersonate-Group "" is a group kube reads) */
        const char *v = r->headers[i].value;
        char *line =
            *v ? xasprintf("%s: %s", r->headers[i].name, v) : xasprintf("%s;", r->headers[i].name);
        hl = curl_slist_append(hl, line);
        free(line);
    }
    hl = curl_slist_append(hl, "Expect:"); /* we stream: no 100-continue round trip */
    bool has_accept = false;
    for (size_t i = 0; i < r->nheaders; i++)
        if (strcasecmp(r->headers[i].name, "Accept") == 0)
            has_accept = true;
    if (!has_accept)
        hl = curl_slist_append(hl, "Accept:"); /* do not invent one */
    x->req_headers = hl;
    x->caller_auth = caller_auth;

    if (strcmp(r->method, "HEAD") == 0) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (r->has_body) {
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(h, CURLOPT_READDATA, x);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->body_len);
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r->method);
    } else if (strcmp(r->method, "GET") != 0) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r->method);
    }

    if (c->o.header_timeout_ms > 0 && !r->long_running) {
        x->hdr_timer = evtimer_new(c->base, on_header_timeout, x);
        struct timeval tv = ms_tv(c->o.header_timeout_ms);
        evtimer_add(x->hdr_timer, &tv);
    }
    c->stats.started++;
    *out = x;
    arm(x);
    return 0;
}

static void
resume(struct up_xfer *x)
{
    struct up_client *c = x->c;
    if (x->cancelled || x->done || !x->added)
        return;
    x->recv_paused = false;
    c->depth++;
    curl_easy_pause(x->h, CURLPAUSE_CONT);
    c->depth--;
    run_deferred(c);
}

void
up_xfer_resume_recv(struct up_xfer *x)
{
    assert(x->magic == XFER_MAGIC);
    if (x->recv_paused)
        resume(x);
}

void
up_xfer_resume_send(struct up_xfer *x)
{
    assert(x->magic == XFER_MAGIC);
    resume(x);
}

void
up_xfer_cancel(struct up_xfer *x)
{
    if (!x)
        return;
    assert(x->magic == XFER_MAGIC);
    if (x->done || x->cancelled)
        return; /* inside on_done: the xfer frees itself */
    struct up_client *c = x->c;
    x->cancelled = true;
    if (x->waiting) {
        xfer_free(x); /* unlinks itself */
        return;
    }
    if (!x->added) {
        TAILQ_REMOVE(&c->to_add, x, pending);
        xfer_free(x);
        return;
    }
    if (c->depth > 0) {
        TAILQ_INSERT_TAIL(&c->to_cancel, x, pending);
        x->cancel_queued = true;
        return;
    }
    xfer_free(x);
}
