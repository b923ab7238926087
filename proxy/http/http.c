/*
 * http.c — kwc's HTTP/1.1 server on libevent bufferevents (see http.h):
 * listeners and accept, the connection cap, each connection's life, and
 * taking a connection away (an Upgrade tunnel; response streams:
 * h1stream.c). The room's other files: conn.h. An HTTP/2 connection (ALPN
 * h2, or the client preface in plaintext) keeps the same struct hconn and
 * bufferevent; its callbacks go to h2.c.
 *
 * One struct hconn per client connection: a bufferevent (a socket, or an
 * OpenSSL bufferevent over it), libhttp-parser's state (h1.c), at most one
 * request in progress (struct hreq, hreq.c) and one timer. Nothing is freed
 * inside a libevent or parser callback chain: a closing connection is
 * unlinked, marked dead and freed from the server's reap event.
 *
 * Limits: one timer per connection is the head timeout (from accept, or
 * from the first byte of a later request) or the idle timeout (between
 * requests). Past max_connections a new connection gets a 429 Status and is
 * closed; connections taken away (watch streams, tunnels) count until
 * their taker releases them. Past max_connections_per_source for its
 * address (counted in a srcmap while the server holds the connection), the
 * same 429 and close: one address flooding kwc past max_connections would
 * otherwise have every other client refused.
 *
 * TLS (htls.c builds the contexts): a connection starts with the context
 * of the moment. Bufferevents are created without BEV_OPT_CLOSE_ON_FREE
 * so the socket and SSL can be handed to another loop; conn_free closes
 * them itself.
 */
#include "conn.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <stdatomic.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <http_parser.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/log.h"
#include "kwc/status.h"

#define SRV_MAGIC 0x68737276u  /* "hsrv" */
#define CONN_MAGIC 0x68636e6eu /* "hcnn" */
#define ACCEPT_RETRY_MS 100    /* after EMFILE/ENFILE: stop accepting this long */
#define LINGER_MS 2000

/* Connections taken from the server (response streams, tunnels): they count against max_connections
 * until released. One server per process (like the parser's head limit), so one counter. */
static atomic_uint taken_conns;

/* What the caps count, shared by the servers of one process's loops: the
 * accepting server takes a count, the serving loop's server releases it
 * when the connection goes. The per-source table is touched once per
 * connection (accept, close), under its mutex. */
struct http_limits {
    atomic_uint open;
    pthread_mutex_t mu;
    struct srcmap *per_source;
};

struct http_limits *
http_limits_new(void)
{
    struct http_limits *l = xcalloc(1, sizeof(*l));
    pthread_mutex_init(&l->mu, NULL);
    uint64_t seed = 0;
    if (RAND_bytes((unsigned char *)&seed, sizeof(seed)) != 1)
        seed = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)l; /* only the hash's spread */
    l->per_source = srcmap_new(seed);
    return l;
}

void
http_limits_free(struct http_limits *l)
{
    if (!l)
        return;
    srcmap_free(l->per_source);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

static bool
limits_take_source(struct http_limits *l, const struct src_key *src, unsigned max)
{
    pthread_mutex_lock(&l->mu);
    bool ok = srcmap_take(l->per_source, src, max);
    pthread_mutex_unlock(&l->mu);
    return ok;
}

static void
limits_release_source(struct http_limits *l, const struct src_key *src)
{
    pthread_mutex_lock(&l->mu);
    srcmap_release(l->per_source, src);
    pthread_mutex_unlock(&l->mu);
}

static struct hconn *
conn_of(void *arg)
{
    struct hconn *c = arg;
    assert(c && c->magic == CONN_MAGIC);
    return c;
}

/* ---- the parse loop's other half: a response left ---- */

/* Pipelined bytes wait in the input while a request is in progress, at most
 * READ_CHUNK of them (and one read): reading stops past it. Every place that
 * lets the parser go on (a response left) enables reading, then asks again
 * here, so a client that pipelines faster than its answers leave cannot
 * make kwc read ahead of them. */
static void
read_gate(struct hconn *c)
{
    if (c->state == C_REQ && !c->h2 &&
        evbuffer_get_length(bufferevent_get_input(c->bev)) > READ_CHUNK)
        bufferevent_disable(c->bev, EV_READ);
}

/* The response is over and has left: next request, or close. */
static void
conn_finish_req(struct hconn *c)
{
    struct hreq *r = c->req;
    bool close = r->close_after || !r->keepalive || !r->complete;
    hconn_tls_bulk(c, false); /* the output has left: an idle connection's size */
    hreq_closed(r, HREQ_END_DONE);
    hreq_free(r);
    c->req = NULL;
    c->msg_complete = false;
    c->parse_paused_body = false;
    if (close) {
        hconn_close_graceful(c);
        return;
    }
    http_parser_pause(&c->p, 0);
    c->state = C_IDLE;
    bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
    bufferevent_enable(c->bev, EV_READ);
    hconn_arm_timer(c);
    h1_parse(c);
    read_gate(c);
}

static void
on_kick(evutil_socket_t fd, short what, void *arg)
{
    struct hconn *c = conn_of(arg);
    if (c->state == C_DEAD)
        return;
    size_t queued = evbuffer_get_length(bufferevent_get_output(c->bev));
    if (c->close_when_flushed) {
        if (queued == 0)
            hconn_close_graceful(c);
        return;
    }
    if (c->h2) {
        h2_on_kick(c);
        return;
    }
    if (c->req && c->req->ended) {
        if (queued == 0)
            conn_finish_req(c);
        return;
    }
    h1_parse(c);
}

void
hconn_tls_bulk(struct hconn *c, bool on)
{
    if (!c->ssl || c->tls_bulk == on)
        return;
    c->tls_bulk = on;
    if (!(SSL_CTX_get_mode(SSL_get_SSL_CTX(c->ssl)) & SSL_MODE_RELEASE_BUFFERS))
        return;
    if (on) {
        SSL_clear_mode(c->ssl, SSL_MODE_RELEASE_BUFFERS);
        return;
    }
    SSL_set_mode(c->ssl, SSL_MODE_RELEASE_BUFFERS);
    SSL_free_buffers(c->ssl); /* fails (keeps them) while a record is pending */
}

void
hconn_kick(struct hconn *c)
{
    if (c->state != C_DEAD)
        event_active(c->kick, EV_TIMEOUT, 1);
}

/* ---- bufferevent callbacks ---- */

static void
on_read(struct bufferevent *bev, void *arg)
{
    struct hconn *c = conn_of(arg);
    if (c->state == C_IDLE && !c->head_byte) {
        /* the first byte of a request: the idle timer becomes the head timer */
        c->head_byte = true;
        hconn_arm_timer(c);
    }
    if (!c->proto_known) {
        /* HTTP/2 (ALPN h2, or the preface in plaintext), else HTTP/1.x */
        int h2 = h2_detect(c);
        if (h2 < 0)
            return; /* a prefix of the preface so far */
        c->proto_known = true;
        if (h2) {
            h2_start(c);
            if (c->s->shutting_down && c->state != C_DEAD)
                h2_shutdown(c); /* GOAWAY: its streams past the last go elsewhere */
            return;
        }
    }
    if (c->h2) {
        h2_on_read(c);
        return;
    }
    h1_parse(c);
    read_gate(c);
}

static void
on_write(struct bufferevent *bev, void *arg)
{
    struct hconn *c = conn_of(arg);
    if (c->state == C_DEAD)
        return;
    size_t queued = evbuffer_get_length(bufferevent_get_output(bev));
    if (c->close_when_flushed) {
        if (queued == 0)
            hconn_close_graceful(c);
        return;
    }
    if (c->h2) {
        h2_on_write(c);
        return;
    }
    struct hreq *r = c->req;
    if (!r)
        return;
    if (r->ended) {
        if (queued == 0)
            conn_finish_req(c);
        return;
    }
    if (r->h && r->h->on_drain && queued <= r->low_water)
        r->h->on_drain(r->harg);
}

static void
on_event(struct bufferevent *bev, short what, void *arg)
{
    struct hconn *c = conn_of(arg);
    if (what & BEV_EVENT_CONNECTED) {
        c->handshake_done = true;
        if (htls_ktls_send(c->ssl))
            HSTAT_ADD(c->s->stats.tls_records_kernel, 1);
        else
            HSTAT_ADD(c->s->stats.tls_records_openssl, 1);
        return;
    }
    if (what & BEV_EVENT_ERROR) {
        if (c->ssl && !c->handshake_done) {
            HSTAT_ADD(c->s->stats.tls_handshake_failed, 1);
            unsigned long e = bufferevent_get_openssl_error(bev);
            if (e) {
                char buf[256];
                ERR_error_string_n(e, buf, sizeof(buf));
                log_debug("http: TLS handshake failed: %s", buf);
            }
        }
    }
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        /* The client is gone, or half-closed: like Go, kwc then gives up on
         * a request in progress; an answer already complete still leaves. */
        if ((what & BEV_EVENT_EOF) && c->req && c->req->ended &&
            evbuffer_get_length(bufferevent_get_output(bev)) > 0) {
            c->close_when_flushed = true;
            bufferevent_disable(bev, EV_READ);
            return;
        }
        hconn_close(c);
    }
}

static void
on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct hconn *c = conn_of(arg);
    if (c->h2 && c->state != C_DEAD) {
        h2_on_timer(c);
        return;
    }
    if (c->state != C_IDLE)
        return;
    if (c->timer_idle)
        HSTAT_ADD(c->s->stats.idle_timeouts, 1);
    else
        HSTAT_ADD(c->s->stats.header_timeouts, 1);
    hconn_close(c);
}

void
hconn_arm_timer(struct hconn *c)
{
    const struct http_server_options *o = &c->s->o;
    c->timer_idle = !c->head_byte && c->handshake_done;
    int ms = c->timer_idle ? o->idle_timeout_ms : o->request_header_timeout_ms;
    event_del(c->timer);
    if (ms > 0) {
        struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
        evtimer_add(c->timer, &tv);
    }
}

/* ---- connection lifecycle ---- */

static void
conn_unlink(struct hconn *c)
{
    if (!c->prev)
        return;
    *c->prev = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = NULL;
    c->next = NULL;
    c->s->nconns--;
    HSTAT_SET(c->s->stats.open, c->s->nconns);
    atomic_fetch_sub(&c->s->lim->open, 1);
    if (c->src_counted) {
        limits_release_source(c->s->lim, &c->src);
        c->src_counted = false;
    }
}

/* Free what the connection holds; the socket and SSL only when owned. */
static void
conn_free(struct hconn *c)
{
    if (c->bev)
        bufferevent_free(c->bev);
    if (c->ssl)
        SSL_free(c->ssl);
    if (c->fd >= 0)
        close(c->fd);
    event_free(c->timer);
    event_free(c->kick);
    hreq_free(c->req);
    h2_conn_free(c);
    c->magic = 0;
    free(c);
}

static void
on_reap(evutil_socket_t fd, short what, void *arg)
{
    struct http_server *s = arg;
    while (s->reap) {
        struct hconn *c = s->reap;
        s->reap = c->next_reap;
        conn_free(c);
    }
}

/* Close now (the client sees EOF or a reset); freed from the reap event. */
void
hconn_close(struct hconn *c)
{
    if (c->state == C_DEAD)
        return;
    c->state = C_DEAD;
    if (c->req)
        hreq_closed(c->req, c->req->taken ? HREQ_END_TAKEN : HREQ_END_CLOSED);
    if (c->h2)
        h2_conn_closed(c);
    conn_unlink(c);
    event_del(c->timer);
    event_del(c->kick);
    bufferevent_disable(c->bev, EV_READ | EV_WRITE);
    bufferevent_setcb(c->bev, NULL, NULL, NULL, NULL);
    if (c->fd >= 0)
        shutdown(c->fd, SHUT_RDWR);
    c->next_reap = c->s->reap;
    c->s->reap = c;
    event_active(c->s->reap_ev, EV_TIMEOUT, 1);
}

/* A refused connection: its request is read and dropped until the client
 * closes (or LINGER_MS), so the 429 is not lost to a reset. */
struct refused {
    struct http_server *s;
    int fd;
    struct event *ev;
    struct refused *next, **prev;
};

static void
linger_end(struct refused *l)
{
    *l->prev = l->next;
    if (l->next)
        l->next->prev = l->prev;
    l->s->nlinger--;
    event_free(l->ev);
    close(l->fd);
    free(l);
}

static void
on_linger(evutil_socket_t fd, short what, void *arg)
{
    struct refused *l = arg;
    if (what & EV_READ) {
        char buf[4096];
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR)))
            return;
    }
    linger_end(l);
}

/* Close fd once the client has stopped sending (or after LINGER_MS): an
 * answer followed at once by close(2) with unread request bytes makes the
 * kernel send a reset, which can destroy the answer in flight. */
static void
linger_close(struct http_server *s, int fd)
{
    shutdown(fd, SHUT_WR);
    if (s->nlinger >= HTTP_LINGER_MAX) {
        close(fd);
        return;
    }
    struct refused *l = xcalloc(1, sizeof(*l));
    l->s = s;
    l->fd = fd;
    l->ev = event_new(s->base, fd, EV_READ | EV_PERSIST, on_linger, l);
    struct timeval tv = {LINGER_MS / 1000, (LINGER_MS % 1000) * 1000};
    event_add(l->ev, &tv);
    s->nlinger++;
    l->next = s->lingering;
    if (l->next)
        l->next->prev = &l->next;
    l->prev = &s->lingering;
    s->lingering = l;
}

/* Over the connection cap: a fast 429 and close, never a hang. */
static void
refuse(struct http_server *s, int fd)
{
    if (!s->ctx) {
        /* a TLS client just sees the close: no handshake is spent on a
         * connection over the cap */
        char *body = status_failure_json(429, "TooManyRequests",
                                         "Too many requests, please try again later.", NULL);
        char buf[1024];
        int n = snprintf(buf, sizeof(buf),
                         "HTTP/1.1 429 Too Many Requests\r\nCache-Control: no-cache, private\r\n"
                         "Content-Type: application/json\r\nDate: %s\r\nRetry-After: 1\r\n"
                         "Content-Length: %zu\r\nConnection: close\r\n\r\n%s\n",
                         hresp_date(s), strlen(body) + 1, body);
        free(body);
        if (n > 0 && (size_t)n < sizeof(buf)) {
            /* a fresh socket's send buffer takes this at once */
            ssize_t w = send(fd, buf, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
            (void)w;
        }
    }
    linger_close(s, fd);
}

/* Close after a complete answer: plaintext sockets linger (see
 * linger_close); TLS ones close (their reads would need the SSL state). */
void
hconn_close_graceful(struct hconn *c)
{
    if (c->state != C_DEAD && !c->ssl && c->fd >= 0) {
        int fd = c->fd;
        c->fd = -1;
        hconn_close(c);
        linger_close(c->s, fd);
        return;
    }
    hconn_close(c);
}

static SSL_CTX *
server_ctx(struct http_server *s)
{
    return s->ctx;
}

/* A flood is refused many times a second: one line a second at most, with
 * the count of those left out. */
static void
log_source_refused(struct http_server *s, const struct src_key *src)
{
    time_t now = time(NULL);
    if (now == s->src_log_sec) {
        s->src_log_suppressed++;
        return;
    }
    char a[SRC_KEY_TEXT];
    src_key_text(src, a, sizeof(a));
    log_warnx("http: refusing a connection from %s: it holds %u connections "
              "(--max-connections-per-source; %lu more refused since the last such line)",
              a, s->o.max_connections_per_source, s->src_log_suppressed);
    s->src_log_sec = now;
    s->src_log_suppressed = 0;
}

static void
on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
    http_server_adopt(arg, fd, sa, (socklen_t)salen);
}

void
http_server_adopt(struct http_server *s, int fd, const struct sockaddr *sa, socklen_t salen)
{
    assert(s->magic == SRV_MAGIC);
    HSTAT_ADD(s->stats.accepted, 1);
    struct http_limits *l = s->lim;
    /* taken first, then checked: two loops' accepts never both pass the
     * last free place */
    unsigned open = atomic_fetch_add(&l->open, 1);
    if (s->o.max_connections && open + atomic_load(&taken_conns) >= s->o.max_connections) {
        atomic_fetch_sub(&l->open, 1);
        HSTAT_ADD(s->stats.refused, 1);
        refuse(s, fd);
        return;
    }
    struct src_key src = {{0}};
    bool counted = false;
    if (s->o.max_connections_per_source && http_source_key(sa, salen, &src)) {
        if (!limits_take_source(l, &src, s->o.max_connections_per_source)) {
            atomic_fetch_sub(&l->open, 1);
            HSTAT_ADD(s->stats.refused_per_source, 1);
            log_source_refused(s, &src);
            refuse(s, fd);
            return;
        }
        counted = true;
    }
    if (s->o.handoff) {
        s->o.handoff(s->o.handoff_arg, fd, sa, salen, counted);
        return;
    }
    http_server_adopt_counted(s, fd, sa, salen, counted);
}

/* A counted connection that never became one. */
static void
unaccount(struct http_server *s, const struct src_key *src)
{
    atomic_fetch_sub(&s->lim->open, 1);
    if (src)
        limits_release_source(s->lim, src);
}

void
http_server_adopt_counted(struct http_server *s, int fd, const struct sockaddr *sa, socklen_t salen,
                          bool counted)
{
    assert(s->magic == SRV_MAGIC);
    struct src_key src = {{0}};
    if (counted && !http_source_key(sa, salen, &src))
        counted = false; /* (the accepting server's key came from the same address) */
    struct hconn *c = xcalloc(1, sizeof(*c));
    c->magic = CONN_MAGIC;
    c->s = s;
    c->fd = fd;
    c->accepted_ns = http_now_ns();
    c->src = src;
    c->src_counted = counted;
    if (sa && salen > 0 && (size_t)salen <= sizeof(c->peer)) {
        memcpy(&c->peer, sa, (size_t)salen);
        c->peer_len = (socklen_t)salen;
    }
    int one = 1;
    /* responses leave in several writes: without NODELAY the last small one
     * waits for the client's delayed ACK */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    SSL_CTX *ctx = server_ctx(s);
    if (ctx) {
        c->ssl = SSL_new(ctx);
        if (!c->ssl) {
            close(fd);
            free(c);
            unaccount(s, counted ? &src : NULL);
            return;
        }
        c->bev = bufferevent_openssl_socket_new(s->base, fd, c->ssl, BUFFEREVENT_SSL_ACCEPTING, 0);
        if (c->bev)
            bufferevent_openssl_set_allow_dirty_shutdown(c->bev, 1);
    } else {
        c->bev = bufferevent_socket_new(s->base, fd, 0);
        c->handshake_done = true;
    }
    c->timer = evtimer_new(s->base, on_timer, c);
    c->kick = event_new(s->base, -1, 0, on_kick, c);
    if (!c->bev || !c->timer || !c->kick) {
        log_warnx("http: cannot set up a connection: out of memory");
        conn_free(c);
        unaccount(s, counted ? &src : NULL);
        return;
    }
    http_parser_init(&c->p, HTTP_REQUEST);
    c->p.data = c;
    c->state = C_IDLE;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = &c->next;
    c->prev = &s->conns;
    s->conns = c;
    s->nconns++;
    HSTAT_SET(s->stats.open, s->nconns);
    bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
    bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
    bufferevent_enable(c->bev, EV_READ);
    /* a new connection: the head timeout (covering the TLS handshake) */
    c->head_byte = false;
    const struct http_server_options *o = &s->o;
    int ms = o->request_header_timeout_ms;
    if (ms > 0) {
        struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
        evtimer_add(c->timer, &tv);
    }
}

static void
on_accept_retry(evutil_socket_t fd, short what, void *arg)
{
    struct http_server *s = arg;
    for (size_t i = 0; i < s->nls; i++)
        if (s->ls[i].l)
            evconnlistener_enable(s->ls[i].l);
}

static void
on_accept_error(struct evconnlistener *l, void *arg)
{
    struct http_server *s = arg;
    int e = EVUTIL_SOCKET_ERROR();
    if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
        /* out of descriptors: stop accepting for a moment instead of spinning */
        HSTAT_ADD(s->stats.accept_errors, 1);
        /* again every ACCEPT_RETRY_MS while it lasts: one line per interval */
        char cause[96];
        snprintf(cause, sizeof(cause), "http: accept failed: %s", strerror(e));
        log_repeat(LOG_WARN, cause, "listeners", "accept",
                   "http: accept: %s; pausing accepts for %d ms (raise the fd limit or lower "
                   "--max-connections)",
                   strerror(e), ACCEPT_RETRY_MS);
        for (size_t i = 0; i < s->nls; i++)
            if (s->ls[i].l)
                evconnlistener_disable(s->ls[i].l);
        struct timeval tv = {0, ACCEPT_RETRY_MS * 1000};
        evtimer_add(s->accept_retry, &tv);
        return;
    }
    log_debug("http: accept: %s", strerror(e));
}

/* ---- the server ---- */

static int
listen_one(struct http_server *s, const struct http_listen_addr *a, int port_override, int given,
           struct listener *out, char *err, size_t errlen)
{
    struct sockaddr_storage ss = a->ss;
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (ss.ss_family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)&ss;
        if (port_override)
            in->sin_port = htons((uint16_t)port_override);
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        port = ntohs(in->sin_port);
    } else if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
        if (port_override)
            in6->sin6_port = htons((uint16_t)port_override);
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        port = ntohs(in6->sin6_port);
    }
    int fd = given;
    if (fd < 0)
        fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return kwc_errf(err, errlen, -errno, "--listen %s:%d: cannot create a socket: %s", host,
                        port, strerror(errno));
    int one = 1;
    if (given >= 0) {
        /* taken over, listening already: the connections in its backlog
         * wait for this process's accept */
        evutil_make_socket_nonblocking(fd);
        evutil_make_socket_closeonexec(fd);
    } else {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (ss.ss_family == AF_INET6)
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    }
    if (given < 0 && bind(fd, (struct sockaddr *)&ss, a->len) != 0) {
        int e = errno;
        close(fd);
        return kwc_errf(err, errlen, -e, "--listen %s%s%s:%d: cannot bind: %s%s",
                        ss.ss_family == AF_INET6 ? "[" : "", host,
                        ss.ss_family == AF_INET6 ? "]" : "", port, strerror(e),
                        e == EADDRINUSE ? " (is another process using it?)" : "");
    }
    out->l =
        evconnlistener_new(s->base, on_accept, s, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC,
                           s->o.backlog ? s->o.backlog : 1024, fd);
    if (!out->l) {
        int e = errno;
        close(fd);
        return kwc_errf(err, errlen, -e, "--listen %s:%d: cannot listen: %s", host, port,
                        strerror(e));
    }
    evconnlistener_set_error_cb(out->l, on_accept_error);
    struct sockaddr_storage got;
    socklen_t gl = sizeof(got);
    if (getsockname(fd, (struct sockaddr *)&got, &gl) == 0)
        out->port = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                                    : ((struct sockaddr_in *)&got)->sin_port);
    return 0;
}

size_t
http_server_listen_fds(const struct http_server *s, int *fds, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < s->nls && n < max; i++)
        if (s->ls[i].l)
            fds[n++] = evconnlistener_get_fd(s->ls[i].l);
    return n;
}

int
http_server_new(struct event_base *base, const struct http_server_options *o,
                http_request_cb on_request, void *arg, struct http_server **out, char *err,
                size_t errlen)
{
    struct http_server *s = xcalloc(1, sizeof(*s));
    s->magic = SRV_MAGIC;
    s->base = base;
    s->o = *o;
    if (!s->o.max_header_bytes)
        s->o.max_header_bytes = 1u << 20;
    if (!s->o.max_discard_bytes)
        s->o.max_discard_bytes = 1u << 20;
    if (!s->o.tls_reload_ms)
        s->o.tls_reload_ms = 1000;
    s->on_request = on_request;
    s->arg = arg;
    http_parser_set_max_header_size(
        (uint32_t)(s->o.max_header_bytes > UINT32_MAX ? UINT32_MAX : s->o.max_header_bytes));
    h1_settings(&s->ps);
    s->reap_ev = event_new(base, -1, 0, on_reap, s);
    s->accept_retry = evtimer_new(base, on_accept_retry, s);
    if (o->limits) {
        s->lim = o->limits;
    } else {
        s->own_lim = http_limits_new();
        s->lim = s->own_lim;
    }
    int rc = htls_init(s, err, errlen);
    if (rc != 0)
        goto fail;
    s->ls = xcalloc(o->naddrs ? o->naddrs : 1, sizeof(*s->ls));
    int first_port = 0;
    for (size_t i = 0; i < o->naddrs; i++) {
        /* with port 0 on several addresses, they all share the first one's port */
        char e1[256];
        rc = listen_one(s, &o->addrs[i], first_port, o->listen_fds ? o->listen_fds[i] : -1,
                        &s->ls[s->nls], e1, sizeof(e1));
        if (rc == -EADDRNOTAVAIL || rc == -EAFNOSUPPORT) {
            /* a name's address this host cannot bind (::1 without IPv6):
             * the others serve; none at all is an error below */
            log_warnx("%s: skipped", e1);
            snprintf(err, errlen, "%s", e1);
            continue;
        }
        if (rc != 0) {
            snprintf(err, errlen, "%s", e1);
            goto fail;
        }
        if (s->nls++ == 0)
            first_port = s->ls[0].port;
    }
    if (o->naddrs && !s->nls)
        goto fail; /* err says why the last one failed */
    rc = 0;

    *out = s;
    return 0;
fail:
    http_server_free(s);
    return rc;
}

int
http_server_port(const struct http_server *s, size_t i)
{
    return i < s->nls ? s->ls[i].port : 0;
}

unsigned
http_server_requests(const struct http_server *s)
{
    /* counters, not a walk of the connections: any thread may ask */
    unsigned long long n = HSTAT_GET(s->stats.h2_streams_open) + HSTAT_GET(s->h1_open);
    return n > UINT32_MAX ? UINT32_MAX : (unsigned)n;
}

void
http_server_stats(const struct http_server *s, struct http_server_stats *out)
{
    /* field by field: this server's loop may be counting meanwhile */
    const struct http_server_stats *in = &s->stats;
    *out = (struct http_server_stats){
        .accepted = HSTAT_GET(in->accepted),
        .refused = HSTAT_GET(in->refused),
        .open = HSTAT_GET(in->open),
        .tls_handshake_failed = HSTAT_GET(in->tls_handshake_failed),
        .bad_requests = HSTAT_GET(in->bad_requests),
        .header_timeouts = HSTAT_GET(in->header_timeouts),
        .idle_timeouts = HSTAT_GET(in->idle_timeouts),
        .requests = HSTAT_GET(in->requests),
        .tls_reloads = HSTAT_GET(in->tls_reloads),
        .refused_per_source = HSTAT_GET(in->refused_per_source),
        .tls_records_kernel = HSTAT_GET(in->tls_records_kernel),
        .tls_records_openssl = HSTAT_GET(in->tls_records_openssl),
        .tls_kernel = HSTAT_GET(in->tls_kernel),
        .accept_errors = HSTAT_GET(in->accept_errors),
        .h2_open = HSTAT_GET(in->h2_open),
        .h2_accepted = HSTAT_GET(in->h2_accepted),
        .h2_streams_open = HSTAT_GET(in->h2_streams_open),
        .h2_streams_total = HSTAT_GET(in->h2_streams_total),
        .h2_resets = HSTAT_GET(in->h2_resets),
        .h2_resets_server = HSTAT_GET(in->h2_resets_server),
        .h2_hpack_floods = HSTAT_GET(in->h2_hpack_floods),
        .h2_bytes_in = HSTAT_GET(in->h2_bytes_in),
        .h2_header_bytes = HSTAT_GET(in->h2_header_bytes),
        .h2_body_held = HSTAT_GET(in->h2_body_held),
        .h2_held_refused = HSTAT_GET(in->h2_held_refused),
        .h2_refused = HSTAT_GET(in->h2_refused),
        .h2_goaways = HSTAT_GET(in->h2_goaways),
        .h2_queued = HSTAT_GET(in->h2_queued),
        .h2_queued_peak = HSTAT_GET(in->h2_queued_peak),
    };
    out->taken = atomic_load(&taken_conns);
    out->max_connections = s->o.max_connections;
    if (s->own_lim || s->o.handoff) { /* shared: the accepting server reports them */
        pthread_mutex_lock(&s->lim->mu);
        out->sources = srcmap_sources(s->lim->per_source);
        pthread_mutex_unlock(&s->lim->mu);
    }
}

/* Graceful stop, as Go's Server.Shutdown (with x/net/http2's GOAWAY): the
 * listening sockets close (a new client is refused at once, instead of
 * waiting in the backlog of a server that will never accept it), idle
 * connections close, busy HTTP/1.1 ones answer with Connection: close (when
 * their head is still to be written) and close after their response, and
 * HTTP/2 connections get a GOAWAY with the last stream id, finish their open
 * streams and close. */
/* Go's Server.Shutdown counts a connection that has not sent its first
 * request as idle only 5 s after it was accepted: its request may be on
 * the way (a connection accepted just before the listener closed, or
 * handed over), and closing it would fail that request. */
#define SHUTDOWN_NEW_IDLE_NS (5ull * 1000 * 1000 * 1000)

static void
shutdown_conns(struct http_server *s)
{
    uint64_t now = http_now_ns();
    for (struct hconn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->h2)
            h2_shutdown(c);
        else if (c->state == C_IDLE && !c->head_byte &&
                 (c->served || now - c->accepted_ns >= SHUTDOWN_NEW_IDLE_NS))
            hconn_close_graceful(c);
        else if (c->req)
            c->req->close_after = true;
    }
}

static void
on_shutdown_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    shutdown_conns(arg);
}

void
http_server_shutdown(struct http_server *s)
{
    assert(s->magic == SRV_MAGIC);
    for (size_t i = 0; i < s->nls; i++)
        if (s->ls[i].l) {
            evconnlistener_free(s->ls[i].l);
            s->ls[i].l = NULL;
        }
    event_del(s->accept_retry);
    s->shutting_down = true;
    shutdown_conns(s);
    /* new connections still waiting for their first request: again each
     * half second, until they sent one or their 5 s passed */
    if (!s->shutdown_ev) {
        s->shutdown_ev = event_new(s->base, -1, EV_PERSIST, on_shutdown_tick, s);
        struct timeval tv = {0, 500 * 1000};
        event_add(s->shutdown_ev, &tv);
    }
}

void
http_server_free(struct http_server *s)
{
    if (!s)
        return;
    assert(s->magic == SRV_MAGIC);
    for (size_t i = 0; s->ls && i < s->nls; i++)
        if (s->ls[i].l)
            evconnlistener_free(s->ls[i].l);
    free(s->ls);
    if (s->shutdown_ev)
        event_free(s->shutdown_ev);
    for (struct hconn *c = s->conns; c; c = c->next)
        if (c->h2)
            h2_last_words(c);
    while (s->conns)
        hconn_close(s->conns);
    on_reap(-1, 0, s);
    while (s->lingering)
        linger_end(s->lingering);
    if (s->reload_timer)
        event_free(s->reload_timer);
    if (s->reap_ev)
        event_free(s->reap_ev);
    if (s->accept_retry)
        event_free(s->accept_retry);
    http_limits_free(s->own_lim);
    SSL_CTX_free(s->ctx);
    s->magic = 0;
    free(s);
}

/* ---- leaving the server ---- */

struct bufferevent *
hconn_leave(struct hconn *c)
{
    assert(c->state != C_DEAD && c->req);
    struct hreq *r = c->req;
    struct bufferevent *bev = c->bev;
    hconn_tls_bulk(c, false);
    atomic_fetch_add(&taken_conns, 1);
    bufferevent_setcb(bev, NULL, NULL, NULL, NULL);
    bufferevent_setwatermark(bev, EV_READ | EV_WRITE, 0, 0);
    c->bev = NULL;
    r->ended = true;
    /* the bufferevent keeps the socket and SSL: hconn_close must not touch them */
    c->fd = -1;
    c->ssl = NULL;
    c->state = C_DEAD;
    hreq_closed(r, HREQ_END_TAKEN);
    conn_unlink(c);
    event_del(c->timer);
    event_del(c->kick);
    c->next_reap = c->s->reap;
    c->s->reap = c;
    event_active(c->s->reap_ev, EV_TIMEOUT, 1);
    return bev;
}

void
hconn_taken(int delta)
{
    if (delta >= 0)
        atomic_fetch_add(&taken_conns, (unsigned)delta);
    else
        atomic_fetch_sub(&taken_conns, (unsigned)-delta);
}
