/*
 * fanout.c — watch fan-out load generator (libevent). Opens N watch streams
 * to a server (kwc, apisim or the etcd bridge), and for every event that
 * arrives finds the annotation apisim stamps on each write
 * (apisim.kwc.dev/written-at, wall clock ns) and records now - stamp: the
 * write-to-receipt latency. Prints one line of JSON: streams connected,
 * deliveries, deliveries/s, latency p50/p99/max in ms, over the measuring
 * window.
 *
 *   fanout --port P --path '/api/v1/pods?watch=1&resourceVersion=N'
 *          --watchers N [--nodes K] [--warmup S] [--seconds S] [--idle]
 *          [--threads T] [--tls [--cacert FILE]] [--token-file FILE] [--deadline S]
 *          [--drain S] [--announce-heads]
 *          [--protobuf] [--accept MEDIA] [--h2-streams-per-conn K [--h2-window BYTES]
 *          [--list PATH]]
 *   fanout --port P --etcd-prefix /bench/ --watchers N ...
 *
 * --protobuf: the streams ask for protobuf (Accept: application/vnd.kubernetes.
 * protobuf, application/json) and the stamp is read from the annotation's
 * protobuf map entry (key bytes, value tag, length byte, digits).
 * --accept MEDIA: the streams' Accept header is MEDIA instead (e.g. a
 * metadata-only watch, application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1;
 * with --protobuf when MEDIA asks for protobuf: the stamp is found the same
 * way, the annotation being part of the object's metadata).
 * --nodes K: stream i adds fieldSelector=spec.nodeName=node-(i % K) (the
 * kubelet pattern). --token-file FILE: one bearer token per line; stream i
 * sends `Authorization: Bearer <line i % n>` (each watcher its own identity;
 * the lines are read once, a stream's request is built as before). A
 * response head whose status is not 2xx is counted (non2xx; a 401 or 403
 * watch is not a stream), and heads_ms is the time from the first connect
 * to the last response head (a burst of requests: when all were answered).
 * --announce-heads: print {"heads":N} once every stream has its response head
 * (or was ended), before the warm-up: a caller that starts the events then
 * measures the fan-out without a connect storm racing the first events.
 * --deadline S: when not every stream has its response head S seconds after
 * the first connect, stop and report what arrived (unanswered: the streams
 * still waiting) instead of waiting for ever. Loss: every event whose stamp (write
 * time) is in the measuring window must reach every stream still open,
 * whenever it arrives. written is the number of distinct such stamps any
 * stream received; a stream that received a stamp past the window (a watch
 * stream is in write order) and fewer than written lost the rest (lost, the
 * sum); one that did not yet is behind (late: the deliveries it still
 * lacks; with --nodes, where streams see different events, none is counted).
 * extra: deliveries past written (duplicates), reordered: stamps not
 * newer than their stream's previous one. --drain S: after the window, keep
 * reading until every open stream is past it, at most S seconds (drain_ms:
 * how long it took); without it fanout stops 0.5 s after the window. --etcd-prefix KEY: instead
 * of HTTP/1.1 watches, each stream is one etcd v3 gRPC Watch (HTTP/2 cleartext through libnghttp2,
 * one connection each, as N separate clients) on the keys under KEY: the same measurement against
 * etcd or `etcd grpc-proxy` (the bench writes values carrying the same stamp). --idle: connect,
 * wait for every response head, report, then hold the streams until killed (the caller measures
 * memory per idle watcher meanwhile). --threads: streams are spread over T event loops (default 1).
 * --tls: the HTTP/1.1 streams speak TLS (OpenSSL): a non-blocking handshake driven by the read
 * event (and a one-shot write event when OpenSSL wants to write), the request
 * sent with SSL_write once it completes, then SSL_read in place of recv.
 * --cacert FILE: the server's certificate must chain to FILE and name
 * 127.0.0.1 (an IP SAN); without it nothing is verified. Each stream is a new
 * client: full handshakes, no session resumption. The client keeps no idle TLS
 * buffers (SSL_MODE_RELEASE_BUFFERS) and reads ahead (one recv for several
 * records), so it costs little more than the plaintext reader.
 *
 * --h2-streams-per-conn K: the watches are HTTP/2 streams (libnghttp2), K per
 * connection (ceil(N / K) connections; the last may carry fewer): plaintext
 * with prior knowledge (the connection preface on a fresh connection, no
 * Upgrade), or with --tls over TLS offering ALPN "h2" only (a connection on
 * which the server picked anything else is counted in alpn_failures and
 * dropped). Every stream is the same GET as the HTTP/1.1 one (:authority
 * 127.0.0.1, the same --nodes selector, token and Accept), its status read
 * from :status, its head counted at its HEADERS, its DATA scanned for stamps
 * like the HTTP/1.1 bytes. Flow control: each stream's window is --h2-window
 * bytes (SETTINGS_INITIAL_WINDOW_SIZE, default 1 MiB), the connection's
 * that times its streams; nghttp2 counts every DATA byte consumed as soon as
 * the chunk callback returns and sends WINDOW_UPDATE when half a window has
 * been consumed, so a client that keeps up never lets a window run dry. All
 * frames the session wants to send (preface, SETTINGS, HEADERS, WINDOW_UPDATE,
 * acks) go through one output buffer per connection, written after every read
 * (send, or SSL_write with partial writes) and on a one-shot write event when
 * the socket is full. The result adds conns (connections whose preface
 * went out), alpn_failures and max_streams (the smallest
 * SETTINGS_MAX_CONCURRENT_STREAMS a server announced: nghttp2 queues streams
 * past it, and those stay unanswered).
 *
 * --list PATH (with --h2-streams-per-conn): each connection first GETs PATH (a
 * list, its body read and dropped) and submits its watch streams only when
 * that stream has ended, as an informer lists then watches (a reconnect
 * storm: --idle --deadline S with a handshake, a list and a watch per
 * client). The result adds list_non2xx (lists answered other than 2xx or
 * reset; their connection's watches are still sent) and, over the
 * connections whose every watch got its head, client_p50_ms / client_p99_ms
 * / client_max_ms: from just before the connection's connect() to its last
 * watch head (handshake, list and watch start as one client sees them).
 *
 * The client must cost less than the server it measures: streams are plain
 * non-blocking sockets with one persistent read event each, one recv into a
 * per-loop buffer per wakeup, a memmem for the stamp and one clock read per
 * recv (everything in one recv arrived at the same time). A stamp cut by a
 * recv boundary is completed from a few bytes kept per stream.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* The stamp in JSON, and in protobuf (the annotation's map entry: the key's
 * bytes, then the value's tag and one length byte, then the digits). */
static const char MARK_JSON[] = "\"apisim.kwc.dev/written-at\":\"";
static const char MARK_PB[] = "apisim.kwc.dev/written-at\x12";
static const char *MARK = MARK_JSON;
static const char *accept_hdr; /* --accept: the Accept header's value */
static size_t MARKLEN = sizeof(MARK_JSON) - 1;
static size_t mark_skip; /* bytes between the mark and the digits */
#define NUMMAX 24        /* digits and the byte after them */
#define TAILMAX (sizeof(MARK_JSON) - 1 + NUMMAX)
#define RBUF (256 * 1024)

struct conn {
    int fd;
    bool head;
    nghttp2_session *h2; /* --etcd-prefix */
    struct h2c *hc;      /* --h2-streams-per-conn: the connection carrying this stream */
    SSL *ssl;            /* --tls */
    bool handshaken;     /* --tls: the handshake completed */
    char *req;           /* --tls: the request until SSL_write took it */
    int req_len;
    struct event *ev;
    struct event *wev;  /* --tls: one-shot, when OpenSSL wants to write */
    struct event *more; /* --tls: read again next turn (read_again) */
    bool dead;          /* the server ended it: counted, no longer read */
    bool status_seen;   /* the response's status line was looked at */
    size_t req_sent;
    unsigned char ntail;
    char tail[TAILMAX];
    struct loop *lp;
    uint64_t last_stamp; /* the newest stamp this stream received */
    uint32_t got;        /* stamps inside the stamp window [t_measure, t_end) received */
    bool passed;         /* it received a stamp at or after t_end: nothing of the window is late */
};

struct loop {
    pthread_t th;
    struct event_base *base;
    int first, count; /* the streams this loop owns */
    char *buf;        /* TAILMAX + RBUF */
    char *h2buf;      /* RBUF: HTTP/2 bytes before nghttp2 frames them */
    uint64_t now;     /* when the bytes being read arrived */
    double *lat;
    size_t nlat, caplat;
    uint64_t deliveries;
    uint64_t *seen; /* the distinct stamps of the window this loop received (open addressing) */
    size_t nseen, capseen;
    uint64_t
        last_seen; /* the last one added: a fanned-out event arrives on many streams in a row */
    uint64_t reordered; /* stamps not newer than their stream's previous one (duplicate or late) */
};

static int port, nw, nodes, nthreads = 1, seconds = 10, warmup = 2, deadline, drain;
static bool idle;
static bool announce_heads; /* --announce-heads */
static const char *path, *etcd_prefix, *cacert, *token_file;
static bool tls;
static SSL_CTX *tls_ctx;
static atomic_int tls_failures;
static char grpc_req[512]; /* the gRPC-framed WatchRequest every etcd stream sends */
static size_t grpc_req_len;
static struct conn *conns;
static struct loop *loops;
static atomic_int heads, ended, ended_headless; /* streams the server ended (before a head) */
static atomic_int non2xx;                       /* heads with a status other than 2xx */
static _Atomic uint64_t t_measure, t_end, t_start, t_last_head, t_exit;
static char **tokens; /* --token-file: its lines */
static int ntokens;

static uint64_t
wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Adds stamp to a set of distinct stamps (0 is never a stamp). */
static void
seen_add(uint64_t **set, size_t *n, size_t *cap, uint64_t stamp)
{
    if (2 * (*n + 1) > *cap) {
        size_t ncap = *cap ? *cap * 2 : 1024;
        uint64_t *t = calloc(ncap, sizeof(*t));
        if (!t) {
            fprintf(stderr, "fanout: out of memory for stamps\n");
            exit(1);
        }
        for (size_t i = 0; i < *cap; i++)
            for (size_t j = ((*set)[i] * 0x9E3779B97F4A7C15ull) >> 40 & (ncap - 1); (*set)[i];
                 j = (j + 1) & (ncap - 1))
                if (!t[j]) {
                    t[j] = (*set)[i];
                    break;
                }
        free(*set);
        *set = t;
        *cap = ncap;
    }
    size_t j = (stamp * 0x9E3779B97F4A7C15ull) >> 40 & (*cap - 1);
    for (; (*set)[j]; j = (j + 1) & (*cap - 1))
        if ((*set)[j] == stamp)
            return;
    (*set)[j] = stamp;
    (*n)++;
}

/* One event received by stream c at now. Loss is counted by stamps (write
 * time): every stream that is still open must receive every event whose
 * stamp is in [t_measure, t_end), whenever it arrives; latency by receipt
 * time within the same window. */
static void
record(struct conn *c, uint64_t now, uint64_t stamp)
{
    struct loop *lp = c->lp;
    uint64_t from = atomic_load(&t_measure), end = atomic_load(&t_end);
    if (stamp <= c->last_stamp)
        lp->reordered++;
    else
        c->last_stamp = stamp;
    if (from && stamp >= from && stamp < end) {
        c->got++;
        if (stamp != lp->last_seen) {
            lp->last_seen = stamp;
            seen_add(&lp->seen, &lp->nseen, &lp->capseen, stamp);
        }
    }
    if (end && stamp >= end)
        c->passed = true;
    if (!from || now < from || now > end)
        return;
    lp->deliveries++;
    if (lp->nlat == lp->caplat) {
        lp->caplat = lp->caplat ? lp->caplat * 2 : 1 << 20;
        lp->lat = realloc(lp->lat, lp->caplat * sizeof(*lp->lat));
        if (!lp->lat) {
            fprintf(stderr, "fanout: out of memory for latencies\n");
            exit(1);
        }
    }
    lp->lat[lp->nlat++] = now > stamp ? (double)(now - stamp) / 1e6 : 0;
}

/* Scans buf[0, len) for stamps; keeps what may be the start of a cut one. */
static void
scan(struct conn *c, char *buf, size_t len, uint64_t now)
{
    size_t p = 0;
    if (!c->status_seen && !c->h2 && !c->hc) { /* the first bytes of the answer: "HTTP/1.1 200" */
        c->status_seen = true;
        if (len < 10 || memcmp(buf, "HTTP/1.", 7) != 0 || buf[9] != '2')
            atomic_fetch_add(&non2xx, 1);
    }
    if (!c->head) {
        char *e = memmem(buf, len, "\r\n\r\n", 4);
        if (!e) {
            size_t keep = len < 3 ? len : 3;
            memcpy(c->tail, buf + len - keep, keep);
            c->ntail = (unsigned char)keep;
            return;
        }
        c->head = true;
        atomic_fetch_add(&heads, 1);
        atomic_store(&t_last_head, wall_ns());
        p = (size_t)(e - buf) + 4;
    }
    for (;;) {
        char *m = memmem(buf + p, len - p, MARK, MARKLEN);
        if (!m) {
            size_t rest = len - p, keep = rest < MARKLEN - 1 ? rest : MARKLEN - 1;
            memcpy(c->tail, buf + len - keep, keep);
            c->ntail = (unsigned char)keep;
            return;
        }
        size_t at = (size_t)(m - buf) + MARKLEN + mark_skip;
        char *q = NULL;
        for (size_t e = at; e < len && e - at < NUMMAX; e++)
            if (buf[e] < '0' || buf[e] > '9') {
                q = buf + e; /* the closing quote, or the protobuf field after the value */
                break;
            }
        if (!q) {
            size_t keep = len - (size_t)(m - buf);
            if (keep > TAILMAX) { /* not a stamp we understand: skip it */
                p = at;
                continue;
            }
            memcpy(c->tail, m, keep);
            c->ntail = (unsigned char)keep;
            return;
        }
        record(c, now, strtoull(buf + at, NULL, 10));
        p = (size_t)(q - buf) + 1;
    }
}

/* ---- etcd: one gRPC Watch per connection (HTTP/2, libnghttp2) ---- */

/* WatchRequest{create_request: WatchCreateRequest{key, range_end}}, framed
 * as one gRPC message. Protobuf fields are tag (field << 3 | 2: length-
 * delimited) then a varint length; both strings here are < 128 bytes. */
static void
grpc_watch_request(const char *prefix)
{
    size_t kl = strlen(prefix);
    if (kl == 0 || kl > 100) {
        fprintf(stderr, "fanout: --etcd-prefix must be 1 to 100 bytes\n");
        exit(2);
    }
    unsigned char create[256], *p = create;
    *p++ = 1 << 3 | 2, *p++ = (unsigned char)kl;
    memcpy(p, prefix, kl), p += kl;
    *p++ = 2 << 3 | 2, *p++ = (unsigned char)kl; /* range_end: the prefix + 1 */
    memcpy(p, prefix, kl);
    p[kl - 1]++;
    p += kl;
    size_t cl = (size_t)(p - create);
    unsigned char *q = (unsigned char *)grpc_req + 5;
    *q++ = 1 << 3 | 2, *q++ = (unsigned char)cl;
    memcpy(q, create, cl), q += cl;
    size_t ml = (size_t)(q - (unsigned char *)grpc_req) - 5;
    grpc_req[0] = 0; /* not compressed */
    grpc_req[1] = grpc_req[2] = grpc_req[3] = 0;
    grpc_req[4] = (char)ml;
    grpc_req_len = ml + 5;
}

static ssize_t
h2_send(nghttp2_session *s, const uint8_t *data, size_t len, int flags, void *arg)
{
    (void)s;
    (void)flags;
    struct conn *c = arg;
    ssize_t n = send(c->fd, data, len, MSG_NOSIGNAL);
    if (n < 0)
        return errno == EAGAIN || errno == EINTR ? NGHTTP2_ERR_WOULDBLOCK
                                                 : NGHTTP2_ERR_CALLBACK_FAILURE;
    return n;
}

/* The request body: the one WatchRequest, then nothing; the stream stays
 * open (a half-closed Watch ends it at the grpc-proxy). */
static ssize_t
h2_body(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len, uint32_t *flags,
        nghttp2_data_source *src, void *arg)
{
    (void)s;
    (void)id;
    (void)flags;
    (void)src;
    struct conn *c = arg;
    if (c->req_sent == grpc_req_len)
        return NGHTTP2_ERR_DEFERRED;
    size_t n = grpc_req_len - c->req_sent < len ? grpc_req_len - c->req_sent : len;
    memcpy(buf, grpc_req + c->req_sent, n);
    c->req_sent += n;
    return (ssize_t)n;
}

static int
h2_headers_done(nghttp2_session *s, const nghttp2_frame *f, void *arg)
{
    (void)s;
    struct conn *c = arg;
    if (f->hd.type == NGHTTP2_HEADERS && f->headers.cat == NGHTTP2_HCAT_RESPONSE && !c->head) {
        c->head = true;
        atomic_fetch_add(&heads, 1);
    }
    return 0;
}

static int
h2_data(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *data, size_t len, void *arg)
{
    (void)s;
    (void)flags;
    (void)id;
    struct conn *c = arg;
    struct loop *lp = c->lp;
    if (len > RBUF)
        len = RBUF; /* frames are at most 16 KiB unless negotiated */
    char *at = lp->buf + TAILMAX - c->ntail;
    memcpy(at, c->tail, c->ntail);
    memcpy(lp->buf + TAILMAX, data, len);
    scan(c, at, c->ntail + len, lp->now);
    return 0;
}

/* A server that ends watchers (etcd grpc-proxy cancels one whose send
 * blocks) is measured, not fatal: the count is reported. */
static void
conn_lost(struct conn *c)
{
    if (c->dead)
        return;
    c->dead = true;
    atomic_fetch_add(c->head ? &ended : &ended_headless, 1);
}

static int
h2_closed(nghttp2_session *s, int32_t id, uint32_t code, void *arg)
{
    (void)s;
    (void)id;
    (void)code;
    conn_lost(arg);
    return 0;
}

/* nghttp2_nv's fields are not const; nghttp2 copies them and writes nothing */
static uint8_t *
u8(const char *s)
{
    return (uint8_t *)(uintptr_t)s;
}

static void
h2_start(struct conn *c)
{
    nghttp2_session_callbacks *cb;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_send_callback(cb, h2_send);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, h2_headers_done);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, h2_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, h2_closed);
    nghttp2_session_client_new(&c->h2, cb, c);
    nghttp2_session_callbacks_del(cb);
    /* a 1 MiB window, about what a kernel socket buffer holds for an HTTP/1 stream */
    nghttp2_settings_entry set[] = {{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20}};
    nghttp2_submit_settings(c->h2, NGHTTP2_FLAG_NONE, set, 1);
    nghttp2_session_set_local_window_size(c->h2, NGHTTP2_FLAG_NONE, 0, 1 << 20);
    char auth[32];
    snprintf(auth, sizeof auth, "127.0.0.1:%d", port);
#define NV(n, v) {u8(n), u8(v), sizeof(n) - 1, strlen(v), NGHTTP2_NV_FLAG_NONE}
    nghttp2_nv hdrs[] = {NV(":method", "POST"),
                         NV(":scheme", "http"),
                         NV(":path", "/etcdserverpb.Watch/Watch"),
                         NV(":authority", auth),
                         NV("content-type", "application/grpc"),
                         NV("te", "trailers")};
#undef NV
    nghttp2_data_provider body = {.read_callback = h2_body};
    if (nghttp2_submit_request(c->h2, NULL, hdrs, sizeof(hdrs) / sizeof(hdrs[0]), &body, c) < 0 ||
        nghttp2_session_send(c->h2) != 0) {
        fprintf(stderr, "fanout: the etcd watch request could not be sent\n");
        exit(1);
    }
}

static void
conn_drop(struct conn *c)
{
    event_del(c->ev);
    if (c->more)
        event_del(c->more);
    if (c->wev)
        event_del(c->wev);
    if (c->ssl)
        SSL_free(c->ssl);
    c->ssl = NULL;
    free(c->req);
    c->req = NULL;
    close(c->fd);
}

/* ---- --tls: the same stream over OpenSSL on the non-blocking socket ---- */

static SSL_CTX *
tls_ctx_new(void)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx)
        goto fail;
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_read_ahead(ctx, 1);
    if (cacert) {
        if (SSL_CTX_load_verify_locations(ctx, cacert, NULL) != 1)
            goto fail;
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    }
    return ctx;
fail:
    fprintf(stderr, "fanout: TLS setup failed (--cacert %s):\n", cacert ? cacert : "none");
    ERR_print_errors_fp(stderr);
    exit(2);
}

/* OpenSSL's answer r from an SSL call: true to wait (read or write event),
 * false when the stream is over (closed, reset or a TLS error). */
static bool
tls_wait(struct conn *c, int r)
{
    switch (SSL_get_error(c->ssl, r)) {
    case SSL_ERROR_WANT_READ:
        return true; /* the persistent read event is armed */
    case SSL_ERROR_WANT_WRITE:
        event_add(c->wev, NULL);
        return true;
    case SSL_ERROR_ZERO_RETURN:
        return false;
    default:
        if (!c->handshaken && atomic_fetch_add(&tls_failures, 1) == 0) {
            const char *why = ERR_reason_error_string(ERR_peek_error());
            fprintf(stderr, "fanout: a TLS handshake failed (the first; more are counted): %s\n",
                    why ? why : "connection closed");
        }
        ERR_clear_error();
        return false;
    }
}

static void on_read(evutil_socket_t fd, short what, void *arg);

/* OpenSSL holds decrypted bytes the socket will not announce: read them in
 * the loop's next turn, after it polled the sockets. (event_active would
 * run the callback again in this turn, before any poll: against a server
 * that sends faster than this loop reads, the connection would hold the
 * loop for ever, its timers included.) */
static void
read_again(struct event **more, struct event_base *base, event_callback_fn cb, void *arg)
{
    static const struct timeval now = {0, 0};
    if (!*more)
        *more = evtimer_new(base, cb, arg);
    evtimer_add(*more, &now);
}

/* Handshake, then the request: true once both are done. */
static bool
tls_ready(struct conn *c)
{
    if (!c->handshaken) {
        int r = SSL_do_handshake(c->ssl);
        if (r != 1) {
            if (!tls_wait(c, r))
                conn_lost(c);
            return false;
        }
        c->handshaken = true;
    }
    if (c->req) {
        int r = SSL_write(c->ssl, c->req, c->req_len);
        if (r <= 0) {
            if (!tls_wait(c, r))
                conn_lost(c);
            return false;
        }
        free(c->req);
        c->req = NULL;
    }
    return true;
}

/* Every record OpenSSL can give without blocking, up to RBUF, scanned as one
 * arrival; whatever OpenSSL still holds is read in the next loop turn. */
static void
tls_read(struct conn *c)
{
    struct loop *lp = c->lp;
    if (!tls_ready(c)) {
        if (c->dead)
            conn_drop(c);
        return;
    }
    char *data = lp->buf + TAILMAX - c->ntail;
    memcpy(data, c->tail, c->ntail);
    size_t got = 0;
    bool over = false;
    while (got < RBUF) {
        int n = SSL_read(c->ssl, lp->buf + TAILMAX + got, (int)(RBUF - got));
        if (n > 0) {
            got += (size_t)n;
            continue;
        }
        over = !tls_wait(c, n);
        break;
    }
    if (got) {
        lp->now = wall_ns();
        scan(c, data, c->ntail + got, lp->now);
    }
    if (over) {
        conn_lost(c);
        conn_drop(c);
        return;
    }
    if (got == RBUF && SSL_has_pending(c->ssl))
        read_again(&c->more, lp->base, on_read, c);
}

/* ---- --h2-streams-per-conn: watch streams multiplexed on HTTP/2 ---- */

struct h2c {
    int fd;
    nghttp2_session *s;
    SSL *ssl;
    bool handshaken;
    bool dead;
    struct event *ev;
    struct event *wev;  /* one-shot: the socket took less than the output buffer */
    struct event *more; /* --tls: read again next turn (read_again) */
    struct loop *lp;
    int first, count; /* its streams: conns[first, first + count) */
    uint8_t *out;     /* frames nghttp2 gave, not yet written */
    size_t outlen, outoff, outcap;
    int32_t list_id;         /* --list: its stream while it runs */
    int nheads;              /* watch heads received */
    uint64_t t_open, t_done; /* --list: before connect(); the last watch head */
};

static int h2_per_conn;       /* 0: HTTP/1.1 (or etcd) */
static const char *list_path; /* --list */
static atomic_int list_non2xx;
static void h2c_submit(struct h2c *h, int i);
static int32_t h2_window = 1 << 20;
static SSL_CTX *h2_tls_ctx;
static struct h2c *h2conns;
static int nh2c;
static atomic_int h2_opened, alpn_failures;
static atomic_int h2_max_streams = INT32_MAX;

/* The connection is over: every stream on it not yet ended is counted. */
static void
h2c_lost(struct h2c *h)
{
    if (h->dead)
        return;
    h->dead = true;
    for (int i = h->first; i < h->first + h->count; i++)
        conn_lost(&conns[i]);
    event_del(h->ev);
    event_del(h->wev);
    if (h->more)
        event_del(h->more);
    if (h->ssl)
        SSL_free(h->ssl);
    h->ssl = NULL;
    close(h->fd);
}

/* Writes what nghttp2 wants sent: false when the connection failed. */
static bool
h2c_flush(struct h2c *h)
{
    for (;;) {
        if (h->outoff == h->outlen) {
            h->outoff = h->outlen = 0;
            while (h->outlen < 64 * 1024) {
                const uint8_t *d;
                ssize_t n = nghttp2_session_mem_send(h->s, &d);
                if (n < 0)
                    return false;
                if (n == 0)
                    break;
                if (h->outlen + (size_t)n > h->outcap) {
                    h->outcap = (h->outlen + (size_t)n) * 2;
                    h->out = realloc(h->out, h->outcap);
                    if (!h->out) {
                        fprintf(stderr, "fanout: out of memory for HTTP/2 output\n");
                        exit(1);
                    }
                }
                memcpy(h->out + h->outlen, d, (size_t)n);
                h->outlen += (size_t)n;
            }
            if (!h->outlen)
                return true;
        }
        size_t len = h->outlen - h->outoff;
        if (h->ssl) {
            int r = SSL_write(h->ssl, h->out + h->outoff, len > INT32_MAX ? INT32_MAX : (int)len);
            if (r <= 0) {
                int e = SSL_get_error(h->ssl, r);
                if (e == SSL_ERROR_WANT_WRITE)
                    event_add(h->wev, NULL);
                ERR_clear_error();
                return e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ;
            }
            h->outoff += (size_t)r;
            continue;
        }
        ssize_t n = send(h->fd, h->out + h->outoff, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno != EAGAIN && errno != EINTR)
                return false;
            event_add(h->wev, NULL);
            return true;
        }
        h->outoff += (size_t)n;
    }
}

static int
h2w_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name, size_t namelen,
           const uint8_t *value, size_t valuelen, uint8_t flags, void *arg)
{
    (void)flags;
    struct h2c *h = arg;
    if (h->list_id && f->hd.stream_id == h->list_id && namelen == 7 &&
        !memcmp(name, ":status", 7) && (valuelen != 3 || value[0] != '2')) {
        atomic_fetch_add(&list_non2xx, 1);
        h->list_id = -h->list_id; /* counted; the close below must not count it again */
        return 0;
    }
    struct conn *c = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
    if (c && f->hd.type == NGHTTP2_HEADERS && !c->status_seen && namelen == 7 &&
        !memcmp(name, ":status", 7)) {
        c->status_seen = true;
        if (valuelen != 3 || value[0] != '2')
            atomic_fetch_add(&non2xx, 1);
    }
    return 0;
}

static int
h2w_frame(nghttp2_session *s, const nghttp2_frame *f, void *arg)
{
    if (f->hd.type == NGHTTP2_SETTINGS && !(f->hd.flags & NGHTTP2_FLAG_ACK)) {
        int32_t m = (int32_t)nghttp2_session_get_remote_settings(
            s, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
        int32_t cur = atomic_load(&h2_max_streams);
        while (m < cur && !atomic_compare_exchange_weak(&h2_max_streams, &cur, m))
            ;
        return 0;
    }
    if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_RESPONSE)
        return 0;
    struct conn *c = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
    if (c && !c->head) {
        c->head = true;
        atomic_fetch_add(&heads, 1);
        atomic_store(&t_last_head, wall_ns());
        struct h2c *h = arg;
        if (++h->nheads == h->count)
            h->t_done = wall_ns();
    }
    return 0;
}

/* DATA of one stream: scanned as that stream's bytes (its own tail). nghttp2
 * counts them consumed when this returns (automatic WINDOW_UPDATE). */
static int
h2w_data(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *data, size_t len, void *arg)
{
    (void)flags;
    struct h2c *h = arg;
    struct conn *c = nghttp2_session_get_stream_user_data(s, id);
    if (!c || c->dead)
        return 0;
    struct loop *lp = h->lp;
    while (len) { /* frames are at most 16 KiB unless the client asks for more: it does not */
        size_t n = len < RBUF ? len : RBUF;
        char *at = lp->buf + TAILMAX - c->ntail;
        memcpy(at, c->tail, c->ntail);
        memcpy(lp->buf + TAILMAX, data, n);
        scan(c, at, c->ntail + n, lp->now);
        data += n;
        len -= n;
    }
    return 0;
}

static int
h2w_closed(nghttp2_session *s, int32_t id, uint32_t code, void *arg)
{
    struct h2c *h = arg;
    if (h->list_id && (id == h->list_id || id == -h->list_id)) { /* --list: now the watches */
        if (code != NGHTTP2_NO_ERROR && h->list_id > 0)
            atomic_fetch_add(&list_non2xx, 1);
        h->list_id = 0;
        for (int i = h->first; i < h->first + h->count; i++)
            h2c_submit(h, i);
        return 0; /* h2c_event flushes them after this read */
    }
    struct conn *c = nghttp2_session_get_stream_user_data(s, id);
    if (c)
        conn_lost(c);
    return 0;
}

/* The request of stream i (the HTTP/1.1 one's fields as HTTP/2 headers). */
static void
h2c_submit(struct h2c *h, int i)
{
    char target[2048], sel[64] = "", auth[1100] = "";
    if (nodes)
        snprintf(sel, sizeof sel, "&fieldSelector=spec.nodeName%%3Dnode-%d", i % nodes);
    int tl = snprintf(target, sizeof target, "%s%s", path, sel);
    int al = ntokens ? snprintf(auth, sizeof auth, "Bearer %s", tokens[i % ntokens]) : 0;
    if (tl < 0 || tl >= (int)sizeof target || al < 0 || al >= (int)sizeof auth) {
        fprintf(stderr, "fanout: the request of stream %d is too long\n", i);
        exit(1);
    }
#define NV(n, v, vl)                                                                               \
    {                                                                                              \
        u8(n), u8(v), sizeof(n) - 1, vl, NGHTTP2_NV_FLAG_NONE                                      \
    }
    const char *accept =
        accept_hdr ? accept_hdr : "application/vnd.kubernetes.protobuf, application/json";
    nghttp2_nv hdrs[] = {NV(":method", "GET", 3),
                         NV(":scheme", tls ? "https" : "http", tls ? 5 : 4),
                         NV(":path", target, (size_t)tl),
                         NV(":authority", "127.0.0.1", 9),
                         NV("authorization", auth, (size_t)al),
                         NV("accept", accept, strlen(accept))};
#undef NV
    size_t n = 4;
    if (ntokens)
        hdrs[n++] = hdrs[4];
    if (MARK == MARK_PB || accept_hdr)
        hdrs[n++] = hdrs[5];
    conns[i].hc = h;
    conns[i].lp = h->lp;
    if (nghttp2_submit_request(h->s, NULL, hdrs, n, NULL, &conns[i]) < 0) {
        fprintf(stderr, "fanout: the HTTP/2 request of stream %d could not be submitted\n", i);
        exit(1);
    }
}

/* The TLS handshake is done: the server must have picked h2. */
static bool
h2c_alpn_ok(struct h2c *h)
{
    const unsigned char *p;
    unsigned int n;
    SSL_get0_alpn_selected(h->ssl, &p, &n);
    if (n == 2 && !memcmp(p, "h2", 2))
        return true;
    if (atomic_fetch_add(&alpn_failures, 1) == 0)
        fprintf(stderr,
                "fanout: the server did not pick ALPN h2 (it picked '%.*s'; more are "
                "counted)\n",
                (int)n, n ? (const char *)p : "");
    return false;
}

static void
h2c_event(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct h2c *h = arg;
    struct loop *lp = h->lp;
    if (h->dead)
        return;
    if (h->ssl && !h->handshaken) {
        int r = SSL_do_handshake(h->ssl);
        if (r != 1) {
            int e = SSL_get_error(h->ssl, r);
            if (e == SSL_ERROR_WANT_WRITE)
                event_add(h->wev, NULL);
            else if (e != SSL_ERROR_WANT_READ) {
                if (atomic_fetch_add(&tls_failures, 1) == 0) {
                    const char *why = ERR_reason_error_string(ERR_peek_error());
                    fprintf(stderr,
                            "fanout: a TLS handshake failed (the first; more are counted): %s\n",
                            why ? why : "connection closed");
                }
                ERR_clear_error();
                h2c_lost(h);
            }
            return;
        }
        h->handshaken = true;
        if (!h2c_alpn_ok(h)) {
            h2c_lost(h);
            return;
        }
        atomic_fetch_add(&h2_opened, 1);
        if (!h2c_flush(h)) /* the preface, SETTINGS and every stream's HEADERS */
            h2c_lost(h);
        return;
    }
    size_t got = 0;
    bool over = false;
    if (h->ssl) {
        while (got < RBUF) {
            int n = SSL_read(h->ssl, lp->h2buf + got, (int)(RBUF - got));
            if (n > 0) {
                got += (size_t)n;
                continue;
            }
            int e = SSL_get_error(h->ssl, n);
            if (e == SSL_ERROR_WANT_WRITE)
                event_add(h->wev, NULL);
            over = e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE;
            ERR_clear_error();
            break;
        }
    } else {
        ssize_t n = recv(fd, lp->h2buf, RBUF, 0);
        if (n > 0)
            got = (size_t)n;
        else
            over = n == 0 || (errno != EAGAIN && errno != EINTR);
    }
    if (got) {
        lp->now = wall_ns();
        if (nghttp2_session_mem_recv(h->s, (const uint8_t *)lp->h2buf, got) < 0)
            over = true;
    }
    if (over || !h2c_flush(h) ||
        (!nghttp2_session_want_read(h->s) && !nghttp2_session_want_write(h->s))) {
        h2c_lost(h);
        return;
    }
    if (h->ssl && got == RBUF && SSL_has_pending(h->ssl))
        read_again(&h->more, lp->base, h2c_event, h);
}

/* Connection j: its socket, session, SETTINGS and every stream's request,
 * sent now (plaintext) or once the handshake is done (TLS). */
static void
h2c_open(struct loop *lp, int j, const struct sockaddr_in *sin)
{
    struct h2c *h = &h2conns[j];
    h->lp = lp;
    h->first = j * h2_per_conn;
    h->count = nw - h->first < h2_per_conn ? nw - h->first : h2_per_conn;
    h->t_open = wall_ns();
    h->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (h->fd < 0 || connect(h->fd, (const struct sockaddr *)sin, sizeof(*sin)) != 0) {
        fprintf(stderr, "fanout: connect failed at connection %d: %s\n", j, strerror(errno));
        exit(1);
    }
    int one = 1;
    setsockopt(h->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    evutil_make_socket_nonblocking(h->fd);
    nghttp2_session_callbacks *cb;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_on_header_callback(cb, h2w_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, h2w_frame);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, h2w_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, h2w_closed);
    nghttp2_session_client_new(&h->s, cb, h);
    nghttp2_session_callbacks_del(cb);
    nghttp2_settings_entry set[] = {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
                                    {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, (uint32_t)h2_window}};
    nghttp2_submit_settings(h->s, NGHTTP2_FLAG_NONE, set, 2);
    /* the connection's window covers every stream's */
    int64_t cw = (int64_t)h2_window * h->count;
    nghttp2_session_set_local_window_size(h->s, NGHTTP2_FLAG_NONE, 0,
                                          cw > INT32_MAX ? INT32_MAX : (int32_t)cw);
    if (list_path) {
        nghttp2_nv hdrs[] = {
            {u8(":method"), u8("GET"), 7, 3, NGHTTP2_NV_FLAG_NONE},
            {u8(":scheme"), u8(tls ? "https" : "http"), 7, tls ? 5 : 4, NGHTTP2_NV_FLAG_NONE},
            {u8(":path"), u8(list_path), 5, strlen(list_path), NGHTTP2_NV_FLAG_NONE},
            {u8(":authority"), u8("127.0.0.1"), 10, 9, NGHTTP2_NV_FLAG_NONE}};
        h->list_id = nghttp2_submit_request(h->s, NULL, hdrs, 4, NULL, NULL);
        if (h->list_id < 0) {
            fprintf(stderr, "fanout: the list of connection %d could not be submitted\n", j);
            exit(1);
        }
    } else {
        for (int i = h->first; i < h->first + h->count; i++)
            h2c_submit(h, i);
    }
    h->ev = event_new(lp->base, h->fd, EV_READ | EV_PERSIST, h2c_event, h);
    h->wev = event_new(lp->base, h->fd, EV_WRITE, h2c_event, h);
    event_add(h->ev, NULL);
    if (tls) {
        h->ssl = SSL_new(h2_tls_ctx);
        if (!h->ssl || SSL_set_fd(h->ssl, h->fd) != 1) {
            fprintf(stderr, "fanout: out of memory for TLS connection %d\n", j);
            exit(1);
        }
        if (cacert)
            X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(h->ssl), "127.0.0.1");
        SSL_set_connect_state(h->ssl);
        h2c_event(h->fd, EV_WRITE, h); /* the ClientHello */
        return;
    }
    atomic_fetch_add(&h2_opened, 1);
    if (!h2c_flush(h))
        h2c_lost(h);
}

static void
on_read(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct conn *c = arg;
    struct loop *lp = c->lp;
    if (c->ssl) {
        tls_read(c);
        return;
    }
    char *data = lp->buf + TAILMAX - c->ntail;
    char *into = c->h2 ? lp->h2buf : lp->buf + TAILMAX;
    if (!c->h2)
        memcpy(data, c->tail, c->ntail);
    ssize_t n = recv(fd, into, RBUF, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0)
        conn_lost(c);
    if (c->dead) {
        conn_drop(c);
        return;
    }
    lp->now = wall_ns();
    if (!c->h2) {
        scan(c, data, c->ntail + (size_t)n, lp->now);
        return;
    }
    if (nghttp2_session_mem_recv(c->h2, (const uint8_t *)into, (size_t)n) < 0 ||
        nghttp2_session_send(c->h2) != 0) /* window updates, pings, acks */
        conn_lost(c);
    if (c->dead)
        conn_drop(c);
}

static void
open_some(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct loop *lp = arg;
    static _Thread_local int next = -1;
    static _Thread_local struct event *self;
    if (next < 0) {
        next = lp->first;
        self = evtimer_new(lp->base, open_some, lp);
    }
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    if (h2_per_conn) { /* a loop's first and count are connections */
        for (int k = 0; k < 10 && next < lp->first + lp->count; k++, next++)
            h2c_open(lp, next, &sin);
        if (next < lp->first + lp->count) {
            struct timeval tv = {0, 2000};
            evtimer_add(self, &tv);
        }
        return;
    }
    for (int k = 0; k < 100 && next < lp->first + lp->count; k++, next++) {
        struct conn *c = &conns[next];
        c->lp = lp;
        c->fd = socket(AF_INET, SOCK_STREAM, 0);
        if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sin, sizeof(sin)) != 0) {
            fprintf(stderr, "fanout: connect failed at stream %d: %s\n", next, strerror(errno));
            exit(1);
        }
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (etcd_prefix) {
            evutil_make_socket_nonblocking(c->fd);
            h2_start(c);
            c->ev = event_new(lp->base, c->fd, EV_READ | EV_PERSIST, on_read, c);
            event_add(c->ev, NULL);
            continue;
        }
        char req[2048], sel[64] = "";
        if (nodes)
            snprintf(sel, sizeof sel, "&fieldSelector=spec.nodeName%%3Dnode-%d", next % nodes);
        char acc[512] = "";
        if (accept_hdr)
            snprintf(acc, sizeof acc, "Accept: %s\r\n", accept_hdr);
        else if (MARK == MARK_PB)
            snprintf(acc, sizeof acc,
                     "Accept: application/vnd.kubernetes.protobuf, "
                     "application/json\r\n");
        int len = snprintf(req, sizeof req, "GET %s%s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s%s%s%s\r\n",
                           path, sel, ntokens ? "Authorization: Bearer " : "",
                           ntokens ? tokens[next % ntokens] : "", ntokens ? "\r\n" : "", acc);
        if (len < 0 || len >= (int)sizeof req) {
            fprintf(stderr, "fanout: the request of stream %d is over %zu bytes\n", next,
                    sizeof req);
            exit(1);
        }
        if (tls) {
            evutil_make_socket_nonblocking(c->fd);
            c->req = strdup(req);
            c->req_len = len;
            c->ssl = SSL_new(tls_ctx);
            if (!c->req || !c->ssl || SSL_set_fd(c->ssl, c->fd) != 1) {
                fprintf(stderr, "fanout: out of memory for TLS stream %d\n", next);
                exit(1);
            }
            if (cacert)
                X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), "127.0.0.1");
            SSL_set_connect_state(c->ssl);
            c->ev = event_new(lp->base, c->fd, EV_READ | EV_PERSIST, on_read, c);
            c->wev = event_new(lp->base, c->fd, EV_WRITE, on_read, c);
            event_add(c->ev, NULL);
            tls_read(c); /* the ClientHello */
            continue;
        }
        if (send(c->fd, req, (size_t)len, 0) != len) {
            fprintf(stderr, "fanout: request not sent on stream %d\n", next);
            exit(1);
        }
        evutil_make_socket_nonblocking(c->fd);
        c->ev = event_new(lp->base, c->fd, EV_READ | EV_PERSIST, on_read, c);
        event_add(c->ev, NULL);
    }
    if (next < lp->first + lp->count) {
        struct timeval tv = {0, 2000};
        evtimer_add(self, &tv);
    }
}

/* --drain: every open stream of this loop received a stamp past the window. */
static bool
loop_passed(struct loop *lp)
{
    for (int i = 0; i < nw; i++)
        if (conns[i].lp == lp && conns[i].head && !conns[i].dead && !conns[i].passed)
            return false;
    return true;
}

static void
on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct loop *lp = arg;
    uint64_t now = wall_ns(), end = atomic_load(&t_end);
    int settled = atomic_load(&heads) + atomic_load(&ended_headless);
    if (idle && settled == nw) {
        event_base_loopbreak(lp->base);
        return;
    }
    if (deadline && settled < nw &&
        now > atomic_load(&t_start) + (uint64_t)deadline * 1000000000ull) {
        event_base_loopbreak(lp->base); /* reported as unanswered */
        return;
    }
    if (end && now > end + 500000000ull &&
        (!drain || now > end + (uint64_t)drain * 1000000000ull || loop_passed(lp))) {
        atomic_store(&t_exit, now);
        event_base_loopbreak(lp->base);
        return;
    }
    static bool announced;
    if (lp == &loops[0] && end && !announced && now >= atomic_load(&t_measure)) {
        announced = true; /* the caller reads the server's CPU from here to the result */
        printf("{\"measuring\":%d}\n", seconds);
        fflush(stdout);
    }
    if (lp == &loops[0] && !idle && settled == nw && !atomic_load(&t_measure)) {
        uint64_t from = now + (uint64_t)warmup * 1000000000ull;
        if (announce_heads) { /* the caller may start the events now */
            printf("{\"heads\":%d}\n", atomic_load(&heads));
            fflush(stdout);
        }
        atomic_store(&t_end, from + (uint64_t)seconds * 1000000000ull);
        atomic_store(&t_measure, from);
    }
}

static void *
run_loop(void *arg)
{
    struct loop *lp = arg;
    event_base_once(lp->base, -1, EV_TIMEOUT, open_some, lp, NULL);
    struct timeval tv = {0, 50000};
    event_add(event_new(lp->base, -1, EV_PERSIST, on_tick, lp), &tv);
    event_base_dispatch(lp->base);
    return NULL;
}

/* --token-file: every non-empty line, without its line end */
static void
read_tokens(const char *file)
{
    FILE *f = fopen(file, "r");
    if (!f) {
        fprintf(stderr, "fanout: --token-file %s: %s\n", file, strerror(errno));
        exit(2);
    }
    char line[1024];
    int cap = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0])
            continue;
        if (ntokens == cap) {
            cap = cap ? cap * 2 : 1024;
            tokens = realloc(tokens, (size_t)cap * sizeof(*tokens));
        }
        if (!tokens || !(tokens[ntokens++] = strdup(line))) {
            fprintf(stderr, "fanout: out of memory for tokens\n");
            exit(1);
        }
    }
    fclose(f);
    if (!ntokens) {
        fprintf(stderr, "fanout: --token-file %s has no tokens\n", file);
        exit(2);
    }
}

static int
cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int
main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--idle")) {
            idle = true;
            continue;
        }
        if (!strcmp(a, "--announce-heads")) {
            announce_heads = true;
            continue;
        }
        if (!strcmp(a, "--tls")) {
            tls = true;
            continue;
        }
        if (!strcmp(a, "--protobuf")) {
            MARK = MARK_PB;
            MARKLEN = sizeof(MARK_PB) - 1;
            mark_skip = 1;
            continue;
        }
        if (!v)
            goto usage;
        i++;
        if (!strcmp(a, "--h2-streams-per-conn"))
            h2_per_conn = atoi(v);
        else if (!strcmp(a, "--h2-window"))
            h2_window = atoi(v);
        else if (!strcmp(a, "--port"))
            port = atoi(v);
        else if (!strcmp(a, "--path"))
            path = v;
        else if (!strcmp(a, "--watchers"))
            nw = atoi(v);
        else if (!strcmp(a, "--nodes"))
            nodes = atoi(v);
        else if (!strcmp(a, "--seconds"))
            seconds = atoi(v);
        else if (!strcmp(a, "--warmup"))
            warmup = atoi(v);
        else if (!strcmp(a, "--threads"))
            nthreads = atoi(v);
        else if (!strcmp(a, "--etcd-prefix"))
            etcd_prefix = v;
        else if (!strcmp(a, "--cacert"))
            cacert = v;
        else if (!strcmp(a, "--token-file"))
            token_file = v;
        else if (!strcmp(a, "--deadline"))
            deadline = atoi(v);
        else if (!strcmp(a, "--drain"))
            drain = atoi(v);
        else if (!strcmp(a, "--accept"))
            accept_hdr = v;
        else if (!strcmp(a, "--list"))
            list_path = v;
        else
            goto usage;
    }
    if (etcd_prefix)
        grpc_watch_request(etcd_prefix);
    if (!port || (!path && !etcd_prefix) || nw <= 0 || nthreads <= 0 || nthreads > 64 ||
        seconds <= 0 || drain < 0 || (tls && etcd_prefix) || (cacert && !tls) ||
        (token_file && etcd_prefix) || (accept_hdr && (etcd_prefix || strlen(accept_hdr) > 400)) ||
        h2_per_conn < 0 || (h2_per_conn && etcd_prefix) || h2_window < 65535 ||
        (list_path && !h2_per_conn))
        goto usage;
    if (h2_per_conn) {
        nh2c = (nw + h2_per_conn - 1) / h2_per_conn;
        h2conns = calloc((size_t)nh2c, sizeof(*h2conns));
        if (nthreads > nh2c)
            nthreads = nh2c;
    }
    if (token_file)
        read_tokens(token_file);
    if (tls && !h2_per_conn)
        tls_ctx = tls_ctx_new();
    if (tls && h2_per_conn) { /* ALPN h2 only; nghttp2's frames are written in pieces */
        h2_tls_ctx = tls_ctx_new();
        SSL_CTX_set_mode(h2_tls_ctx,
                         SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
        if (SSL_CTX_set_alpn_protos(h2_tls_ctx, (const unsigned char *)"\x02h2", 3) != 0) {
            fprintf(stderr, "fanout: ALPN setup failed\n");
            return 2;
        }
    }
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    int nfd = h2_per_conn ? nh2c : nw;
    if ((rlim_t)nfd + 16 > rl.rlim_cur) {
        fprintf(stderr, "fanout: %d connections need more than the %llu open files allowed\n", nfd,
                (unsigned long long)rl.rlim_cur);
        return 2;
    }
    conns = calloc((size_t)nw, sizeof(*conns));
    loops = calloc((size_t)nthreads, sizeof(*loops));
    atomic_store(&t_start, wall_ns());
    for (int t = 0, at = 0; t < nthreads; t++) {
        struct loop *lp = &loops[t];
        lp->base = event_base_new();
        lp->buf = malloc(TAILMAX + RBUF);
        lp->h2buf = malloc(RBUF);
        int units = h2_per_conn ? nh2c : nw; /* connections or streams */
        lp->first = at;
        lp->count = units / nthreads + (t < units % nthreads);
        at += lp->count;
        pthread_create(&lp->th, NULL, run_loop, lp);
    }
    uint64_t deliveries = 0;
    size_t nlat = 0;
    for (int t = 0; t < nthreads; t++) {
        pthread_join(loops[t].th, NULL);
        deliveries += loops[t].deliveries;
        nlat += loops[t].nlat;
    }
    uint64_t t_heads = atomic_load(&t_last_head), t0 = atomic_load(&t_start);
    double heads_ms = t_heads > t0 ? (double)(t_heads - t0) / 1e6 : 0;
    int unanswered = nw - atomic_load(&heads) - atomic_load(&ended_headless);
    char h2tail[384] = "";
    if (h2_per_conn) {
        int ms = atomic_load(&h2_max_streams);
        int k = snprintf(
            h2tail, sizeof h2tail, ",\"conns\":%d,\"alpn_failures\":%d,\"max_streams\":%d",
            atomic_load(&h2_opened), atomic_load(&alpn_failures), ms == INT32_MAX ? -1 : ms);
        if (list_path) { /* each connection: connect() to its last watch head */
            double *cl = malloc((size_t)nh2c * sizeof(*cl));
            size_t ncl = 0;
            for (int j = 0; cl && j < nh2c; j++)
                if (h2conns[j].t_done > h2conns[j].t_open)
                    cl[ncl++] = (double)(h2conns[j].t_done - h2conns[j].t_open) / 1e6;
            if (cl)
                qsort(cl, ncl, sizeof(*cl), cmp);
            snprintf(h2tail + k, sizeof h2tail - (size_t)k,
                     ",\"list_non2xx\":%d,\"clients\":%zu,\"client_p50_ms\":%.1f,"
                     "\"client_p99_ms\":%.1f,\"client_max_ms\":%.1f",
                     atomic_load(&list_non2xx), ncl, ncl ? cl[ncl / 2] : 0,
                     ncl ? cl[(size_t)((double)ncl * 0.99)] : 0, ncl ? cl[ncl - 1] : 0);
            free(cl);
        }
    }
    if (idle) {
        printf("{\"streams\":%d,\"ended\":%d,\"tls_failures\":%d,\"non2xx\":%d,\"heads_ms\":%.1f,"
               "\"unanswered\":%d%s}\n",
               atomic_load(&heads), atomic_load(&ended) + atomic_load(&ended_headless),
               atomic_load(&tls_failures), atomic_load(&non2xx), heads_ms, unanswered, h2tail);
        fflush(stdout);
        pause(); /* the streams stay open until the caller has measured and kills us */
        return 0;
    }
    double *lat = malloc((nlat ? nlat : 1) * sizeof(*lat));
    for (int t = 0, at = 0; t < nthreads; t++) {
        memcpy(lat + at, loops[t].lat, loops[t].nlat * sizeof(*lat));
        at += (int)loops[t].nlat;
    }
    qsort(lat, nlat, sizeof(*lat), cmp);
    double p50 = nlat ? lat[nlat / 2] : 0, p99 = nlat ? lat[(size_t)((double)nlat * 0.99)] : 0;
    double mx = nlat ? lat[nlat - 1] : 0;
    /* written: the distinct stamps of the window any stream received; each
     * open stream past the window that has fewer lost the rest (a watch
     * stream is in write order), one not past it yet is behind (late) */
    uint64_t *all = NULL, reordered = 0, lost = 0, late = 0, extra = 0;
    size_t written = 0, capall = 0;
    for (int t = 0; t < nthreads; t++) {
        reordered += loops[t].reordered;
        for (size_t i = 0; i < loops[t].capseen; i++)
            if (loops[t].seen[i])
                seen_add(&all, &written, &capall, loops[t].seen[i]);
    }
    int behind = 0;
    for (int i = 0; i < nw && !nodes; i++) { /* --nodes: each stream has its own events */
        struct conn *c = &conns[i];
        if (!c->head || c->dead)
            continue;
        if (c->got > written)
            extra += c->got - written;
        uint64_t miss = c->got < written ? written - c->got : 0;
        if (c->passed)
            lost += miss;
        else {
            behind++;
            late += miss;
        }
    }
    uint64_t te = atomic_load(&t_end), tx = atomic_load(&t_exit);
    double drain_ms = tx > te ? (double)(tx - te) / 1e6 : 0;
    printf("{\"streams\":%d,\"ended\":%d,\"deliveries\":%llu,\"per_s\":%.0f,\"p50_ms\":%.2f,"
           "\"p99_ms\":%.2f,\"max_ms\":%.2f,\"tls_failures\":%d,\"non2xx\":%d,\"heads_ms\":%.1f,"
           "\"unanswered\":%d,\"written\":%zu,\"lost\":%llu,\"behind\":%d,\"late\":%llu,"
           "\"extra\":%llu,\"reordered\":%llu,\"drain_ms\":%.0f%s}\n",
           atomic_load(&heads), atomic_load(&ended) + atomic_load(&ended_headless),
           (unsigned long long)deliveries, (double)deliveries / seconds, p50, p99, mx,
           atomic_load(&tls_failures), atomic_load(&non2xx), heads_ms, unanswered, written,
           (unsigned long long)lost, behind, (unsigned long long)late, (unsigned long long)extra,
           (unsigned long long)reordered, drain_ms, h2tail);
    fflush(stdout);
    return 0;
usage:
    fprintf(stderr,
            "usage: fanout --port P --path PATH --watchers N [--nodes K] [--seconds S] "
            "[--warmup S] [--idle] [--threads T] [--tls [--cacert FILE]] [--token-file "
            "FILE] [--deadline S] [--drain S] [--announce-heads] [--protobuf] "
            "[--accept MEDIA] [--h2-streams-per-conn K [--h2-window BYTES] [--list PATH]] | "
            "[--etcd-prefix KEY]\n");
    return 2;
}
