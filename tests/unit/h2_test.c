/*
 * h2_test.c — proxy/http/h2.c: HTTP/2 downstream (include/kwc/http.h)
 * without a network. The server adopts one end of a socketpair(AF_UNIX)
 * and the test plays the client on the other with an nghttp2 client
 * session of its own (or raw frames for the hostile cases, or OpenSSL for
 * ALPN). The loop runs with EVLOOP_NONBLOCK until nothing moves (no byte
 * either way, no handler hook, no active event), bounded; waits for a
 * timer run EVLOOP_ONCE until the awaited thing is there, bounded by a
 * guard timer that only fires when the server never acts. Never a sleep.
 *
 * The handler, by path:
 *   /echo    read the body; on_complete: "<method> <target>", host, x-echo,
 *            proto, http10, content length, has_body, then the body
 *   /slow    like /echo, but turns reading off in its first on_body (the
 *            test turns it on again)
 *   /stream  hresp_start -1, STREAM_BYTES of 'x', end
 *   /hold    nothing: the test answers it (or the client resets it)
 *   /held    hreq_body_hold (the stages' wait for authentication): the test
 *            answers it
 *   /abort   a streamed head and "part", then hresp_abort
 *   /hdrs    connection-specific response headers, which must not leave
 *   /big     BIG_BYTES in BIG_PIECE writes while hresp_queued < BIG_MARK,
 *            more from on_drain (low water BIG_MARK / 2), as serve.c does
 *   /block   "<" + a block of BLOCK_BYTES (hresp_write_block, as serve.c's
 *            list chunks) + "|" + another + ">": block_byte(i) each
 *   /block1  one such block alone (last_block: its bytes)
 */
#include "kwc/http.h"

#include <assert.h>
#include <errno.h>
#include <event2/event.h>
#include <nghttp2/nghttp2.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kwc/base.h"
#include "tap.h"
#include "tlsfx.h"

#define RUN_MAX 200000
#define QUIET_TURNS 3
#define GUARD_MS 5000
#define MAX_ST 64
#define MAX_REQ 512
#define STREAM_BYTES (256 * 1024)
#define BIG_BYTES (1024 * 1024)
#define BIG_PIECE (16 * 1024)
#define BIG_MARK (64 * 1024)
#define BLOCK_BYTES (100 * 1000)

static char
block_byte(size_t i)
{
    return (char)('a' + i % 23);
}

static char *last_block; /* the bytes of the last block written */

/* hresp_write_block of BLOCK_BYTES of block_byte */
static void
write_block(struct hreq *r)
{
    char *b = xmalloc(HRESP_BLOCK_BEFORE + BLOCK_BYTES + HRESP_BLOCK_AFTER);
    for (size_t i = 0; i < BLOCK_BYTES; i++)
        b[HRESP_BLOCK_BEFORE + i] = block_byte(i);
    last_block = b + HRESP_BLOCK_BEFORE;
    hresp_write_block(r, b, last_block, BLOCK_BYTES);
}

/* ---- the server's handler ---- */

struct sreq {
    struct srv *sv;
    struct hreq *r;
    char path[32];
    char *body;
    size_t nbody;
    bool closed;
    size_t big_sent;
};

struct srv {
    struct event_base *base;
    struct http_server *s;
    struct event *guard;
    bool guard_fired;
    unsigned long long hooks;
    int nreq, nclose, ndone, ndone_closed, ncomplete, ndrain;
    struct sreq *reqs[MAX_REQ];
    struct sreq *last;
    struct hstream_handoff *hand[4];
    int nhand;
    char last_proto[16];
};

static void
answer_echo(struct sreq *q)
{
    struct hreq *r = q->r;
    char *o = NULL;
    size_t tl;
    const char *t = hreq_target(r, &tl);
    const char *h = hreq_header(r, "Host"), *x = hreq_header(r, "X-Echo");
    int n = asprintf(
        &o, "%s %s\nhost=%s\nx-echo=%s\nproto=%s\nhttp10=%d\nclen=%lld\nhas_body=%d\nbody=",
        hreq_method(r), t, h ? h : "-", x ? x : "-", hreq_proto(r), hreq_http10(r),
        (long long)hreq_content_length(r), hreq_has_body(r));
    if (n < 0)
        abort();
    hresp_header(r, "Content-Type", "text/plain");
    hresp_start(r, 200, (int64_t)(n + q->nbody));
    hresp_write(r, o, (size_t)n);
    hresp_write(r, q->body, q->nbody);
    hresp_end(r);
    free(o);
}

static void
h_body(void *arg, const char *p, size_t n)
{
    struct sreq *q = arg;
    q->sv->hooks++;
    q->body = xrealloc(q->body, q->nbody + n);
    memcpy(q->body + q->nbody, p, n);
    q->nbody += n;
    if (strcmp(q->path, "/slow") == 0)
        hreq_body_read(q->r, false);
}

static void
h_complete(void *arg)
{
    struct sreq *q = arg;
    q->sv->hooks++;
    q->sv->ncomplete++;
    if (strcmp(q->path, "/echo") == 0 || strcmp(q->path, "/slow") == 0)
        answer_echo(q);
}

/* /big: write while the queue is under the mark, as serve.c's pump */
static void
big_fill(struct sreq *q)
{
    static char piece[BIG_PIECE];
    memset(piece, 'z', sizeof(piece));
    while (q->big_sent < BIG_BYTES && hresp_queued(q->r) < BIG_MARK) {
        hresp_write(q->r, piece, sizeof(piece));
        q->big_sent += sizeof(piece);
        if (q->big_sent == BIG_BYTES)
            hresp_end(q->r);
    }
}

static void
h_drain(void *arg)
{
    struct sreq *q = arg;
    q->sv->hooks++;
    q->sv->ndrain++;
    if (strcmp(q->path, "/big") == 0 && !q->closed)
        big_fill(q);
}

static void
h_close(void *arg)
{
    struct sreq *q = arg;
    q->sv->hooks++;
    q->sv->nclose++;
    q->closed = true;
}

static const struct hreq_handler hooks = {
    .on_body = h_body, .on_complete = h_complete, .on_drain = h_drain, .on_close = h_close};

static void
on_request(void *arg, struct hreq *r)
{
    struct srv *sv = arg;
    sv->hooks++;
    struct sreq *q = xcalloc(1, sizeof(*q));
    q->sv = sv;
    q->r = r;
    const char *t = hreq_target(r, NULL);
    snprintf(q->path, sizeof(q->path), "%.*s", (int)strcspn(t, "?"), t);
    snprintf(sv->last_proto, sizeof(sv->last_proto), "%s", hreq_proto(r));
    if (sv->nreq < MAX_REQ)
        sv->reqs[sv->nreq] = q;
    sv->nreq++;
    sv->last = q;
    hreq_set_handler(r, &hooks, q);
    hreq_set_note(r, q);
    if (strcmp(q->path, "/echo") == 0 || strcmp(q->path, "/slow") == 0) {
        hreq_body_read(r, true);
    } else if (strcmp(q->path, "/stream") == 0) {
        hresp_start(r, 200, -1);
        char *b = xmalloc(STREAM_BYTES);
        memset(b, 'x', STREAM_BYTES);
        hresp_write(r, b, STREAM_BYTES);
        free(b);
        hresp_end(r);
    } else if (strcmp(q->path, "/watch") == 0) {
        hresp_header(r, "Content-Type", "application/json");
        hresp_start(r, 200, -1);
        hresp_write(r, "head-", 5); /* before the handoff: goes first */
        if (sv->nhand < 4)
            sv->hand[sv->nhand++] = hresp_handoff(r);
    } else if (strcmp(q->path, "/block") == 0) {
        hresp_start(r, 200, 2 * BLOCK_BYTES + 3);
        hresp_write(r, "<", 1);
        write_block(r);
        hresp_write(r, "|", 1);
        write_block(r);
        hresp_write(r, ">", 1);
        hresp_end(r);
    } else if (strcmp(q->path, "/block1") == 0) {
        hresp_start(r, 200, BLOCK_BYTES);
        write_block(r);
        hresp_end(r);
    } else if (strcmp(q->path, "/big") == 0) {
        hresp_low_water(r, BIG_MARK / 2);
        hresp_start(r, 200, -1);
        big_fill(q);
    } else if (strcmp(q->path, "/held") == 0) {
        hreq_body_hold(r); /* as the stages do while they authenticate */
    } else if (strcmp(q->path, "/abort") == 0) {
        hresp_start(r, 200, -1);
        hresp_write(r, "part", 4);
        hresp_abort(r);
    } else if (strcmp(q->path, "/hdrs") == 0) {
        hresp_header(r, "Connection", "close");
        hresp_header(r, "Transfer-Encoding", "chunked");
        hresp_header(r, "Keep-Alive", "timeout=5");
        hresp_header(r, "X-Mixed-Case", "v");
        hresp_simple(r, 201, "text/plain", "ok", 2);
    }
}

static void
on_done(void *arg, const struct hreq_done *d, void *note)
{
    struct srv *sv = arg;
    sv->ndone++;
    if (d->how == HREQ_END_CLOSED)
        sv->ndone_closed++;
}

static void
on_guard(evutil_socket_t fd, short what, void *arg)
{
    ((struct srv *)arg)->guard_fired = true;
}

static void
srv_init(struct srv *sv, struct http_server_options o)
{
    *sv = (struct srv){0};
    sv->base = event_base_new();
    char err[256];
    if (http_server_new(sv->base, &o, on_request, sv, &sv->s, err, sizeof(err)) != 0) {
        printf("# %s\n", err);
        abort();
    }
    http_server_on_done(sv->s, on_done, sv);
    sv->guard = evtimer_new(sv->base, on_guard, sv);
}

static void
srv_fini(struct srv *sv)
{
    http_server_free(sv->s);
    for (int i = 0; i < sv->nreq && i < MAX_REQ; i++) {
        free(sv->reqs[i]->body);
        free(sv->reqs[i]);
    }
    event_free(sv->guard);
    event_base_free(sv->base);
}

/* ---- the client ---- */

struct cst {
    int32_t id;
    int status;
    char *body;
    size_t nbody;
    bool closed;
    uint32_t close_code;
    bool consume; /* give the window back (false: the stream stalls) */
    char hdrs[512];
};

struct cl {
    int fd;
    SSL *ssl;
    nghttp2_session *ss;
    char *out;
    size_t nout;
    char *in; /* raw bytes received (for the hostile cases without a session) */
    size_t nin;
    bool eof;
    bool goaway;
    int ngoaway;
    uint32_t goaway_code;
    int32_t goaway_last;
    struct cst st[MAX_ST];
    int nst;
    unsigned long long moved;
    size_t max_data; /* the largest DATA frame received */
    bool noread;     /* cl_io reads nothing (the server's bytes wait) */
};

/* SETTINGS_MAX_FRAME_SIZE the next cl_open advertises (0: none, 16 KiB) */
static uint32_t cl_max_frame;
/* SO_SNDBUF of the server's end of the next cl_open (0: the default) */
static int cl_sndbuf;

static struct cst *
cst_of(struct cl *c, int32_t id)
{
    for (int i = 0; i < c->nst; i++)
        if (c->st[i].id == id)
            return &c->st[i];
    return NULL;
}

static int
c_header(nghttp2_session *ss, const nghttp2_frame *f, const uint8_t *name, size_t nl,
         const uint8_t *value, size_t vl, uint8_t flags, void *arg)
{
    struct cst *st = cst_of(arg, f->hd.stream_id);
    if (!st)
        return 0;
    if (nl == 7 && memcmp(name, ":status", 7) == 0 && vl == 3 && memcmp(value, "100", 3) == 0)
        strcat(st->hdrs, "continue\n");
    else if (nl == 7 && memcmp(name, ":status", 7) == 0)
        st->status = atoi((const char *)value);
    else if (strlen(st->hdrs) + nl + vl + 3 < sizeof(st->hdrs))
        snprintf(st->hdrs + strlen(st->hdrs), sizeof(st->hdrs) - strlen(st->hdrs), "%.*s=%.*s\n",
                 (int)nl, name, (int)vl, value);
    return 0;
}

static int
c_data(nghttp2_session *ss, uint8_t flags, int32_t id, const uint8_t *data, size_t len, void *arg)
{
    struct cst *st = cst_of(arg, id);
    nghttp2_session_consume_connection(ss, len);
    if (!st)
        return 0;
    if (st->consume)
        nghttp2_session_consume_stream(ss, id, len);
    st->body = xrealloc(st->body, st->nbody + len + 1);
    memcpy(st->body + st->nbody, data, len);
    st->nbody += len;
    st->body[st->nbody] = '\0';
    return 0;
}

static int
c_close(nghttp2_session *ss, int32_t id, uint32_t code, void *arg)
{
    struct cst *st = cst_of(arg, id);
    if (st) {
        st->closed = true;
        st->close_code = code;
    }
    return 0;
}

static int
c_frame(nghttp2_session *ss, const nghttp2_frame *f, void *arg)
{
    struct cl *c = arg;
    if (f->hd.type == NGHTTP2_DATA && f->hd.length > c->max_data)
        c->max_data = f->hd.length;
    if (f->hd.type == NGHTTP2_GOAWAY) {
        c->ngoaway++;
        c->goaway = true;
        c->goaway_code = f->goaway.error_code;
        c->goaway_last = f->goaway.last_stream_id;
    }
    return 0;
}

static void
cl_raw(struct cl *c, const void *p, size_t n)
{
    c->out = xrealloc(c->out, c->nout + n);
    memcpy(c->out + c->nout, p, n);
    c->nout += n;
}

/* A connection to sv; with_session: an nghttp2 client session (else raw). */
static void
cl_open(struct cl *c, struct srv *sv, bool with_session, SSL_CTX *tls)
{
    *c = (struct cl){0};
    int p[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, p) != 0)
        abort();
    c->fd = p[0];
    if (cl_sndbuf && setsockopt(p[1], SOL_SOCKET, SO_SNDBUF, &cl_sndbuf, sizeof(cl_sndbuf)) != 0)
        abort();
    if (tls)
        c->ssl = tfx_ssl_new(tls, p[0], (const unsigned char *)"\x08http/1.1\x02h2", 12);
    http_server_adopt(sv->s, p[1], NULL, 0);
    if (!with_session)
        return;
    nghttp2_session_callbacks *cb;
    nghttp2_option *opt;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_option_new(&opt);
    nghttp2_option_set_no_auto_window_update(opt, 1);
    nghttp2_session_callbacks_set_on_header_callback(cb, c_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, c_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, c_close);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, c_frame);
    if (nghttp2_session_client_new2(&c->ss, cb, c, opt) != 0)
        abort();
    nghttp2_session_callbacks_del(cb);
    nghttp2_option_del(opt);
    nghttp2_settings_entry iv = {NGHTTP2_SETTINGS_MAX_FRAME_SIZE, cl_max_frame};
    nghttp2_submit_settings(c->ss, NGHTTP2_FLAG_NONE, &iv, cl_max_frame ? 1 : 0);
    nghttp2_session_set_local_window_size(c->ss, NGHTTP2_FLAG_NONE, 0, 1 << 24);
}

static void
cl_close(struct cl *c)
{
    for (int i = 0; i < c->nst; i++)
        free(c->st[i].body);
    if (c->ss)
        nghttp2_session_del(c->ss);
    if (c->ssl)
        SSL_free(c->ssl);
    close(c->fd);
    free(c->out);
    free(c->in);
}

#define NV(n, v)                                                                                   \
    {                                                                                              \
        (uint8_t *)(uintptr_t)(n), (uint8_t *)(uintptr_t)(v), sizeof(n) - 1, strlen(v),            \
            NGHTTP2_NV_FLAG_NONE                                                                   \
    }

struct body_src {
    size_t left;
};

static ssize_t
c_read_body(nghttp2_session *ss, int32_t id, uint8_t *buf, size_t len, uint32_t *flags,
            nghttp2_data_source *src, void *arg)
{
    struct body_src *b = src->ptr;
    size_t n = len < b->left ? len : b->left;
    memset(buf, 'b', n);
    b->left -= n;
    if (b->left == 0)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

/* A request; extra: more header fields (or NULL). Returns its index. */
static int
cl_req(struct cl *c, const char *method, const char *path, const nghttp2_nv *extra, size_t nextra,
       struct body_src *body)
{
    nghttp2_nv nv[16] = {NV(":method", method), NV(":path", path), NV(":scheme", "http"),
                         NV(":authority", "example.com:1")};
    size_t n = 4;
    for (size_t i = 0; i < nextra && n < 16; i++)
        nv[n++] = extra[i];
    nghttp2_data_provider dp = {.source.ptr = body, .read_callback = c_read_body};
    int32_t id = nghttp2_submit_request(c->ss, NULL, nv, n, body ? &dp : NULL, NULL);
    if (id < 0 || c->nst == MAX_ST)
        abort();
    c->st[c->nst] = (struct cst){.id = id, .consume = true};
    return c->nst++;
}

/* Move what can move on the client's side, without blocking. */
static void
cl_io(struct cl *c)
{
    if (c->ssl && !SSL_is_init_finished(c->ssl)) {
        int rc = SSL_do_handshake(c->ssl);
        if (rc != 1) {
            int e = SSL_get_error(c->ssl, rc);
            if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
                c->eof = true;
            return;
        }
        c->moved++;
    }
    while (c->ss && c->nout < 65536 && nghttp2_session_want_write(c->ss)) {
        const uint8_t *p;
        ssize_t n = nghttp2_session_mem_send(c->ss, &p);
        if (n <= 0)
            break;
        cl_raw(c, p, (size_t)n);
    }
    while (c->nout > 0 && !c->eof) {
        ssize_t n = c->ssl ? SSL_write(c->ssl, c->out, (int)c->nout)
                           : send(c->fd, c->out, c->nout, MSG_NOSIGNAL);
        if (n <= 0)
            break;
        memmove(c->out, c->out + n, c->nout - (size_t)n);
        c->nout -= (size_t)n;
        c->moved++;
    }
    char buf[16384];
    while (!c->noread) {
        ssize_t n = c->ssl ? SSL_read(c->ssl, buf, sizeof(buf)) : recv(c->fd, buf, sizeof(buf), 0);
        if (n == 0 || (n < 0 && !c->ssl && errno != EAGAIN && errno != EINTR)) {
            c->eof = true;
            break;
        }
        if (n < 0) {
            if (c->ssl && SSL_get_error(c->ssl, (int)n) != SSL_ERROR_WANT_READ)
                c->eof = true;
            break;
        }
        c->moved++;
        if (c->ss) {
            if (nghttp2_session_mem_recv(c->ss, (const uint8_t *)buf, (size_t)n) < 0)
                c->eof = true;
        } else {
            c->in = xrealloc(c->in, c->nin + (size_t)n);
            memcpy(c->in + c->nin, buf, (size_t)n);
            c->nin += (size_t)n;
        }
    }
}

/* Run the server and the clients until nothing moves. */
static void
pump(struct srv *sv, struct cl *c, int nc)
{
    int quiet = 0;
    for (int turn = 0; turn < RUN_MAX && quiet < QUIET_TURNS; turn++) {
        unsigned long long before = sv->hooks;
        for (int i = 0; i < nc; i++)
            before += c[i].moved;
        for (int i = 0; i < nc; i++)
            cl_io(&c[i]);
        event_base_loop(sv->base, EVLOOP_NONBLOCK);
        for (int i = 0; i < nc; i++)
            cl_io(&c[i]);
        unsigned long long after = sv->hooks;
        for (int i = 0; i < nc; i++)
            after += c[i].moved;
        bool active = event_base_get_num_events(sv->base, EVENT_BASE_COUNT_ACTIVE) > 0;
        quiet = after == before && !active ? quiet + 1 : 0;
    }
}

/* Run until the client sees EOF (the server closed), bounded by the guard. */
static bool
wait_eof(struct srv *sv, struct cl *c)
{
    struct timeval g = {GUARD_MS / 1000, 0};
    sv->guard_fired = false;
    evtimer_add(sv->guard, &g);
    for (int i = 0; i < RUN_MAX && !c->eof && !sv->guard_fired; i++) {
        cl_io(c);
        event_base_loop(sv->base, EVLOOP_ONCE);
        cl_io(c);
    }
    event_del(sv->guard);
    return c->eof;
}

static struct http_server_options
opts(void)
{
    return (struct http_server_options){.max_header_bytes = 4096};
}

/* Does the server's raw output hold a frame of type t (a GOAWAY: its code)? */
static bool
raw_has_frame(const struct cl *c, uint8_t t, uint32_t *code)
{
    size_t i = 0;
    while (i + 9 <= c->nin) {
        const uint8_t *h = (const uint8_t *)c->in + i;
        size_t len = (size_t)h[0] << 16 | (size_t)h[1] << 8 | h[2];
        if (h[3] == t && i + 9 + len <= c->nin) {
            if (code && len >= 8)
                *code =
                    (uint32_t)h[13] << 24 | (uint32_t)h[14] << 16 | (uint32_t)h[15] << 8 | h[16];
            return true;
        }
        i += 9 + len;
    }
    return false;
}

static void
raw_frame(struct cl *c, uint8_t type, uint8_t flags, uint32_t id, const void *p, size_t n)
{
    uint8_t h[9] = {(uint8_t)(n >> 16),  (uint8_t)(n >> 8),   (uint8_t)n,         type,       flags,
                    (uint8_t)(id >> 24), (uint8_t)(id >> 16), (uint8_t)(id >> 8), (uint8_t)id};
    cl_raw(c, h, 9);
    if (n)
        cl_raw(c, p, n);
}

static void
raw_preface(struct cl *c)
{
    cl_raw(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24);
    raw_frame(c, NGHTTP2_SETTINGS, 0, 0, NULL, 0);
}

/* ---- the tests ---- */

static void
test_get(void)
{
    struct srv sv;
    srv_init(&sv, opts());
    struct cl c;
    cl_open(&c, &sv, true, NULL);
    nghttp2_nv x[] = {NV("x-echo", "hi")};
    int a = cl_req(&c, "GET", "/echo?x=1", x, 1, NULL);
    int b = cl_req(&c, "GET", "/hdrs", NULL, 0, NULL);
    pump(&sv, &c, 1);
    is_int(c.st[a].status, 200, "GET answered 200");
    is_str(c.st[a].body,
           "GET /echo?x=1\nhost=example.com:1\nx-echo=hi\nproto=HTTP/2.0\nhttp10=0\nclen=-1\n"
           "has_body=0\nbody=",
           "method, target, Host from :authority, headers, proto");
    ok(strstr(c.st[a].hdrs, "content-type=text/plain\n") != NULL, "response header lowercased");
    ok(strstr(c.st[a].hdrs, "date=") != NULL, "Date added");
    ok(strstr(c.st[a].hdrs, "content-length=") != NULL, "Content-Length sent");
    is_int(c.st[b].status, 201, "second stream answered");
    ok(strstr(c.st[b].hdrs, "x-mixed-case=v\n") != NULL, "a handler's header, lowercased");
    ok(!strstr(c.st[b].hdrs, "connection") && !strstr(c.st[b].hdrs, "transfer-encoding") &&
           !strstr(c.st[b].hdrs, "keep-alive"),
       "no connection-specific headers");
    is_int(sv.ndone, 2, "done callback per stream");
    is_int(sv.nclose, 2, "on_close per stream");
    struct http_server_stats hs;
    http_server_stats(sv.s, &hs);
    is_int(hs.h2_open, 1, "one HTTP/2 connection open");
    is_int(hs.h2_streams_total, 2, "two streams counted");
    is_int(hs.h2_streams_open, 0, "none open");
    cl_close(&c);
    srv_fini(&sv);
}

static void
test_post_flow(void)
{
    struct srv sv;
    srv_init(&sv, opts());
    struct cl c;
    cl_open(&c, &sv, true, NULL);
    struct body_src bs = {.left = 200000};
    nghttp2_nv x[] = {NV("expect", "100-continue")};
    int a = cl_req(&c, "POST", "/slow", x, 1, &bs);
    pump(&sv, &c, 1);
    ok(sv.last && sv.last->nbody > 0, "the body began to arrive");
    ok(sv.last && sv.last->nbody <= 65535, "reading off: the stream's window closed");
    ok(bs.left > 0, "the client could not send the whole body");
    /* read slowly: one chunk per turn of the test */
    for (int i = 0; i < 1000 && !c.st[a].closed; i++) {
        hreq_body_read(sv.last->r, true);
        pump(&sv, &c, 1);
    }
    is_int(c.st[a].status, 200, "POST answered");
    ok(strstr(c.st[a].hdrs, "continue\n") != NULL, "Expect: 100-continue: a 100 first");
    ok(c.st[a].body && strstr(c.st[a].body, "has_body=1\n"), "has_body");
    is_int(sv.last->nbody, 200000, "every body byte delivered");
    cl_close(&c);
    srv_fini(&sv);
}

static void
test_many_streams(void)
{
    struct srv sv;
    srv_init(&sv, opts());
    struct cl c;
    cl_open(&c, &sv, true, NULL);
    for (int i = 0; i < 50; i++)
        cl_req(&c, "GET", "/echo", NULL, 0, NULL);
    pump(&sv, &c, 1);
    int good = 0;
    for (int i = 0; i < 50; i++)
        good += c.st[i].status == 200 && c.st[i].closed;
    is_int(good, 50, "50 concurrent streams answered");
    cl_close(&c);
    srv_fini(&sv);
}

static void
test_stall(void)
{
    struct http_server_options o = opts();
    o.idle_timeout_ms = 200;
    struct srv sv;
    srv_init(&sv, o);
    struct cl c;
    cl_open(&c, &sv, true, NULL);
    int a = cl_req(&c, "GET", "/stream", NULL, 0, NULL);
    c.st[a].consume = false; /* its window never reopens */
    int b = cl_req(&c, "GET", "/stream", NULL, 0, NULL);
    pump(&sv, &c, 1);
    ok(c.st[b].closed && c.st[b].nbody == STREAM_BYTES, "the live stream got all its DATA");
    ok(!c.st[a].closed && c.st[a].nbody <= 65535, "the stalled stream waits at its window");
    ok(!c.eof, "the connection is open");
    ok(wait_eof(&sv, &c), "a stream stalled for the idle timeout closes the connection");
    struct http_server_stats hs;
    http_server_stats(sv.s, &hs);
    is_int(hs.idle_timeouts, 1, "counted as an idle timeout");
    is_int(sv.ndone_closed, 1, "the stalled stream ends closed");
    cl_close(&c);
    srv_fini(&sv);
}

static void
test_reset_abort(void)
{
    struct srv sv;
    srv_init(&sv, opts());
    struct cl c;
    cl_open(&c, &sv, true, NULL);
    int a = cl_req(&c, "GET", "/hold", NULL, 0, NULL);
    pump(&sv, &c, 1);
    ok(sv.last && !sv.last->closed, "held request in progress");
    nghttp2_submit_rst_stream(c.ss, NGHTTP2_FLAG_NONE, c.st[a].id, NGHTTP2_CANCEL);
    pump(&sv, &c, 1);
    ok(sv.last->closed, "client RST_STREAM: on_close");
    is_int(sv.ndone_closed, 1, "done: closed");
    int b = cl_req(&c, "GET", "/abort", NULL, 0, NULL);
    int d = cl_req(&c, "GET", "/echo", NULL, 0, NULL);
    pump(&sv, &c, 1);
    ok(c.st[b].closed, "aborted stream closed");
    is_int(c.st[b].close_code, NGHTTP2_INTERNAL_ERROR, "hresp_abort: RST_STREAM INTERNAL_ERROR");
    is_int(c.st[d].status, 200, "the other stream is answered");
    ok(!c.eof && !c.goaway, "the connection stays");
    struct http_server_stats hs;
    http_server_stats(sv.s, &hs);
    is_int(hs.h2_resets, 1, "client resets counted");
    cl_close(&c);
    srv_fini(&sv);
}

static void
test_max_streams(void)
{
    struct http_server_options o = opts();
    o.http2_max_streams = 4;
    struct srv sv;
    srv_init(&sv, o);
    struct cl c;
    cl_open(&c, &sv, true, NULL);
    for (int i = 0; i < 5; i++) /* before the server's SETTINGS arrive */
        cl_req(&c, "GET", "/hold", NULL, 0, NULL);
    pump(&sv, &c, 1);
    is_int(sv.nreq, 4, "4 streams reach the handler");
    ok(c.st[4].closed, "the 5th is closed");
    is_int(c.st[4].close_code, NGHTTP2_REFUSED_STREAM, "with REFUSED_STREAM");
    struct http_server_stats hs;
    http_server_stats(sv.s, &hs);
    is_int(hs.h2_refused, 1, "refused counted");
    for (int i = 0; i < 4; i++)
        hresp_simple(sv.reqs[i]->r, 200, NULL, "", 0);
    pump(&sv, &c, 1);
    int done = 0;
    for (int i = 0; i < 4; i++)
        done += c.st[i].status == 200;
    is_int(done, 4, "the held ones answered");
    cl_close(&c);
    srv_fini(&sv);
}

/* A client whose stream is reset may send RST_STREAM again for frames still
 * in flight on it (python's h2 does, once per DATA frame): resets of a
 * stream already gone cost nothing and must not empty the rapid-reset
 * bucket. */
static void
test_reset_of_closed_stream_not_counted(void)
{
    struct http_server_options o = opts();
    o.http2_max_streams = 4; /* a bucket of 8 resets */
    struct srv sv;
    srv_init(&sv, o);
    struct cl c;
    cl_open(&c, &sv, false, NULL);
    raw_preface(&c);
    const uint8_t hb[] = {0x82, 0x84, 0x86, 0x41, 0x01, 'h'}; /* GET / http, :authority h */
    const uint8_t cancel[4] = {0, 0, 0, NGHTTP2_CANCEL};
    raw_frame(&c, NGHTTP2_HEADERS, NGHTTP2_FLAG_END_STREAM | NGHTTP2_FLAG_END_HEADERS, 1, hb,
              sizeof(hb));
    for (int i = 0; i < 40; i++) /* the first closes stream 1, the rest find it gone */
        raw_frame(&c, NGHTTP2_RST_STREAM, 0, 1, cancel, 4);
    pump(&sv, &c, 1);
    uint32_t code = 0;
    ok(!raw_has_frame(&c, NGHTTP2_GOAWAY, &code), "resets of a closed stream: no GOAWAY");
    ok(!c.eof, "the connection stays open");
    struct http_server_stats hs;
    http_server_stats(sv.s, &hs);
    is_int(hs.h2_resets, 1, "one reset counted: the one that closed a stream");
    cl_close(&c);
    srv_fini(&sv);
}

static void
test_rapid_reset(void)
{
    struct http_server_options o = opts();
    o.http2_max_streams = 4; /* a bucket of 8 resets */
    struct srv sv;
    srv_init(&sv, o);
    struct cl c;
    cl_open(&c, &sv, false, NULL);
    raw_preface(&c);
    /* each stream opened and reset at once, all in one write */
    const uint8_t hb[] = {0x82, 0x84, 0x86, 0x41, 0x01, 'h'}; /* GET / http, :authority h */
    const uint8_t cancel[4] = {0, 0, 0, NGHTTP2_CANCEL};
    for (uint32_t i = 0; i < 40; i++) {
        raw_frame(&c, NGHTTP2_HEADERS, NGHTTP2_FLAG_END_STREAM | NGHTTP2_FLAG_END_HEADERS,
                  2 * i + 1, hb, sizeof(hb));
        raw_frame(&c, NGHTTP2_RST_STREAM, 0, 2 * i + 1, cancel, 4);
    }
    pump(&sv, &c, 1);
    uint32_t code = 0;
    ok(raw_has_frame(&c, NGHTTP2_GOAWAY, &code), "rapid reset: GOAWAY");
    is_int(code, NGHTTP2_ENHANCE_YOUR_CALM, "ENHANCE_YOUR_CALM");
    ok(c.eof, "the connection closed");
    ok(sv.nreq >= 8 && sv.nreq <= 10, "stopped at the budget");
    struct http_server_stats hs;
    http_server_stats(sv.s, &hs);
    ok(hs.h2_resets >= 9, "resets counted");
    is_int(hs.h2_goaways, 1, "GOAWAY counted");
    cl_close(&c);
    srv_fini(&sv);
}

static void
test_header_list(void)
{
    struct srv sv;
    srv_init(&sv, opts()); /* max_header_bytes 4096 */
    struct cl c;
    cl_open(&c, &sv, true, NULL);
    cl_req(&c, "GET", "/hold", NULL, 0, NULL);
    pump(&sv, &c, 1);
    char big[5000];
    memset(big, 'v', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    nghttp2_nv x[] = {NV("x-big", big)};
    int a = cl_req(&c, "GET", "/echo", x, 1, NULL);
    pump(&sv, &c, 1);
    is_int(c.st[a].status, 431, "a header list over max_header_bytes: 431");
    ok(c.st[a].body && strstr(c.st[a].body, "\"code\":431"), "with a Status body");
    is_int(sv.nreq, 1, "never handed to the handler");
    /* the rest of its block is never decoded: nothing more is read, the
     * connection ends (Go closes it too once a list runs past the limit) */
    ok(c.goaway, "then GOAWAY");
    is_int(c.goaway_code, NGHTTP2_ENHANCE_YOUR_CALM, "ENHANCE_YOUR_CALM");
    is_int(c.goaway_last, c.st[a].id, "naming the 431's stream as the last");
    ok(wait_eof(&sv, &c), "and the connection closes");
    ok(sv.reqs[0]->closed, "the stream open beside it ends with it");
    cl_close(&c);
    srv_fini(&sv);
}

/* An HPACK block as a client may write it: GET / http, :authority h. */
static const uint8_t hb_get[] = {0x82, 0x84, 0x86, 0x01, 0x01, 'h'}; /* not indexed */

/* "x-b: <n x 'a'>" as a literal with incremental indexing, a new name (it
 * becomes dynamic table entry 62: 0xbe references it). */
static size_t
hpack_entry(uint8_t *p, size_t n)
{
    size_t k = 0;
    p[k++] = 0x40;
    p[k++] = 3;
    memcpy(p + k, "x-b", 3);
    k += 3;
    assert(n >= 127 && n < 127 + 128 * 128);
    p[k++] = 0x7f; /* the length, an HPACK integer with a 7-bit prefix */
    size_t v = n - 127;
    while (v >= 128) {
        p[k++] = (uint8_t)(v % 128 + 128);
        v /= 128;
    }
    p[k++] = (uint8_t)v;
    memset(p + k, 'a', n);
    return k + n;
}

/* An HPACK bomb inside one header block: one 4000-byte value, then 1-byte
 * references to it. The list passes the limit at the second field; not one
 * field more is decoded (the stats count every field nghttp2 emits). */
static void
test_hpack_bomb_one_block(void)
{
    struct srv sv;
    srv_init(&sv, opts()); /* max_header_bytes 4096 */
    struct cl c;
    cl_open(&c, &sv, false, NULL);
    raw_preface(&c);
    uint8_t blk[4200 + 12000];
    size_t n = 0;
    memcpy(blk, hb_get, sizeof(hb_get));
    n += sizeof(hb_get);
    n += hpack_entry(blk + n, 4000);
    memset(blk + n, 0xbe, 12000); /* 12,000 references: 48 MB decoded, unchecked */
    n += 12000;
    raw_frame(&c, NGHTTP2_HEADERS, NGHTTP2_FLAG_END_STREAM | NGHTTP2_FLAG_END_HEADERS, 1, blk, n);
    ok(wait_eof(&sv, &c), "the connection ends");
    uint32_t code = 0;
    ok(raw_has_frame(&c, NGHTTP2_GOAWAY, &code), "GOAWAY");
    is_int(code, NGHTTP2_ENHANCE_YOUR_CALM, "ENHANCE_YOUR_CALM");
    ok(raw_has_frame(&c, NGHTTP2_HEADERS, NULL), "the stream is answered (431)");
    is_int(sv.nreq, 0, "never handed to the handler");
    struct http_server_stats hs;
    http_server_stats(sv.s, &hs);
    /* the pseudo-fields, the entry and one reference: the limit plus one field */
    ok(hs.h2_header_bytes <= 4096 + 4000 + 3 + 32, "decoding stopped one field past the limit");
    printf("# %llu header bytes decoded of %zu received\n", hs.h2_header_bytes, n + 9 + 24 + 9);
    cl_close(&c);
    srv_fini(&sv);
}

/* HPACK bombs within the limit, on stream after stream: each block a few
 * bytes of references to one large entry. What a connection decodes is
 * bounded by what it sent: GOAWAY ENHANCE_YOUR_CALM once it passes
 * H2_HPACK_RATIO per byte (past an allowance of two lists). */
static void
test_hpack_bomb_many_blocks(void)
{
    struct http_server_options o = opts();
    o.max_header_bytes = 65536;
    struct srv sv;
    srv_init(&sv, o);
    struct cl c;
    cl_open(&c, &sv, false, NULL);
    raw_preface(&c);
    uint8_t blk[4200];
    size_t n = 0;
    memcpy(blk, hb_get, sizeof(hb_get));
    n += sizeof(hb_get);
    n += hpack_entry(blk + n, 4000);
    raw_frame(&c, NGHTTP2_HEADERS, NGHTTP2_FLAG_END_STREAM | NGHTTP2_FLAG_END_HEADERS, 1, blk, n);
    size_t sent = 24 + 9 + 9 + n;
    /* then 200 streams of 15 references each (~60 KB decoded per 30 bytes) */
    uint8_t refs[sizeof(hb_get) + 15];
    memcpy(refs, hb_get, sizeof(hb_get));
    memset(refs + sizeof(hb_get), 0xbe, 15);
    for (uint32_t i = 1; i <= 200; i++) {
        raw_frame(&c, NGHTTP2_HEADERS, NGHTTP2_FLAG_END_STREAM | NGHTTP2_FLAG_END_HEADERS,
                  2 * i + 1, refs, sizeof(refs));
        sent += 9 + sizeof(refs);
    }
    ok(wait_eof(&sv, &c), "the connection ends");
    uint32_t code = 0;
    ok(raw_has_frame(&c, NGHTTP2_GOAWAY, &code), "GOAWAY");
    is_int(code, NGHTTP2_ENHANCE_YOUR_CALM, "ENHANCE_YOUR_CALM");
    struct http_server_stats hs;
    http_server_stats(sv.s, &hs);
    is_int(hs.h2_hpack_floods, 1, "counted as an HPACK flood");
    ok(sv.nreq < 60, "stopped after a few dozen streams, not 200");
    /* two lists (1 MiB at least), 256 per byte received, one field past it */
    ok(hs.h2_header_bytes <= (1u << 20) + 256 * hs.h2_bytes_in + 4032 + 64,
       "decoded at most the budget of the bytes received");
    printf("# %d streams, %llu header bytes decoded of %llu received (%zu sent)\n", sv.nreq,
           hs.h2_header_bytes, hs.h2_bytes_in, sent);
    cl_close(&c);
    srv_fini(&sv);
}

/* MadeYouReset (CVE-2025-8671): a WINDOW_UPDATE that overflows each new
 * stream's window makes nghttp2 reset it (FLOW_CONTROL_ERROR). Those
 * resets take from the same bucket as the client's own. */
static void
test_made_you_reset(void)
{
    struct http_server_options o = opts();
    o.http2_max_streams = 4; /* a bucket of 8 resets */
    struct srv sv;
    srv_init(&sv, o);
    struct cl c;
    cl_open(&c, &sv, false, NULL);
    raw_preface(&c);
    const uint8_t inc[4] = {0x7f, 0xff, 0xff, 0xff};
    /* one stream at a time, each reset before the next opens (never
     * refused: the limit of 4 is never reached) */
    for (uint32_t i = 0; i < 40 && !c.eof; i++) {
        raw_frame(&c, NGHTTP2_HEADERS, NGHTTP2_FLAG_END_STREAM | NGHTTP2_FLAG_END_HEADERS,
                  2 * i + 1, hb_get, sizeof(hb_get));
        raw_frame(&c, NGHTTP2_WINDOW_UPDATE, 0, 2 * i + 1, inc, 4);
        pump(&sv, &c, 1);
    }
    ok(wait_eof(&sv, &c), "the connection ends");
    uint32_t code = 0;
    ok(raw_has_frame(&c, NGHTTP2_GOAWAY, &code), "MadeYouReset: GOAWAY");
    is_int(code, NGHTTP2_ENHANCE_YOUR_CALM, "ENHANCE_YOUR_CALM");
    struct http_server_stats hs;
    http_server_stats(sv.s, &hs);
    printf("# %d streams, %llu resets sent\n", sv.nreq, hs.h2_resets_server);
    ok(sv.nreq >= 8 && sv.nreq <= 10, "stopped at the budget");
    ok(hs.h2_resets_server >= 8, "the resets nghttp2 sent counted");
    is_int(hs.h2_resets, 0, "none was the client's");
    is_int(hs.h2_refused, 0, "none was refused");
    cl_close(&c);
    srv_fini(&sv);
}

/* Request bodies held while the stages authenticate: the connection's
 * window is given back only for what is delivered or dropped, so one
 * connection holds at most its window however many streams it opens;
 * what it held is given back when the streams end. */
static void
test_held_bodies(void)
{
    struct srv sv;
    srv_init(&sv, opts());
    struct cl c;
    cl_open(&c, &sv, true, NULL);
    struct body_src b[40];
    for (int i = 0; i < 40; i++) {
        b[i].left = 65535; /* each stream's whole window */
        cl_req(&c, "POST", "/held", NULL, 0, &b[i]);
    }
    pump(&sv, &c, 1);
    struct http_server_stats hs;
    http_server_stats(sv.s, &hs);
    is_int(sv.nreq, 40, "40 streams wait");
    printf("# held %llu bytes of 40 x 65535 offered\n", hs.h2_body_held);
    ok(hs.h2_body_held <= 1u << 20, "at most the connection's window held");
    ok(hs.h2_body_held >= (1u << 20) - 65535, "the window filled");
    for (int i = 0; i < 40; i++)
        hresp_simple(sv.reqs[i]->r, 401, "text/plain", "no", 2);
    pump(&sv, &c, 1);
    http_server_stats(sv.s, &hs);
    is_int(hs.h2_body_held, 0, "given back when the streams end");
    cl_close(&c);
    srv_fini(&sv);
}

/* Past max_held_body across connections, a stream whose body would be
 * held is refused; the held bytes stay within the cap. */
static void
test_held_cap(void)
{
    struct http_server_options o = opts();
    o.max_held_body = 3 * 65535;
    struct srv sv;
    srv_init(&sv, o);
    struct cl c[2];
    struct body_src b[8];
    for (int k = 0; k < 2; k++) {
        cl_open(&c[k], &sv, true, NULL);
        for (int i = 0; i < 4; i++) {
            b[4 * k + i].left = 65535;
            cl_req(&c[k], "POST", "/held", NULL, 0, &b[4 * k + i]);
        }
    }
    pump(&sv, c, 2);
    struct http_server_stats hs;
    http_server_stats(sv.s, &hs);
    ok(hs.h2_body_held <= 3 * 65535, "held within the cap");
    is_int(hs.h2_held_refused, 5, "the streams past it refused");
    int refused = 0;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4; i++)
            refused += c[k].st[i].closed && c[k].st[i].close_code == NGHTTP2_REFUSED_STREAM;
    is_int(refused, 5, "RST_STREAM REFUSED_STREAM");
    for (int k = 0; k < 2; k++)
        cl_close(&c[k]);
    srv_fini(&sv);
}

static void
test_continuation_flood(void)
{
    struct srv sv;
    srv_init(&sv, opts()); /* 4096 / 4096 + 8 = 9 CONTINUATION frames at most */
    struct cl c;
    cl_open(&c, &sv, false, NULL);
    raw_preface(&c);
    const uint8_t hb[] = {0x82, 0x84, 0x86}; /* GET / http */
    raw_frame(&c, NGHTTP2_HEADERS, NGHTTP2_FLAG_END_STREAM, 1, hb, sizeof(hb));
    for (int i = 0; i < 100; i++)
        raw_frame(&c, NGHTTP2_CONTINUATION, 0, 1, NULL, 0);
    pump(&sv, &c, 1);
    uint32_t code = 0;
    (void)code; /* nghttp2 ends the session without a GOAWAY */
    ok(c.eof, "CONTINUATION flood: the connection closed");
    is_int(sv.nreq, 0, "no request");
    cl_close(&c);
    srv_fini(&sv);
}

/* A flood of frames that each want an ACK (PING, SETTINGS) from a client
 * that never reads: the server closes the connection. */
static void
ack_flood(uint8_t type, const void *payload, size_t n, const char *what)
{
    struct srv sv;
    srv_init(&sv, opts());
    struct cl c;
    cl_open(&c, &sv, false, NULL);
    raw_preface(&c);
    struct http_server_stats hs = {.open = 1};
    long sent = 0;
    for (int round = 0; round < 100000 && hs.open > 0; round++) {
        while (c.nout < 65536) {
            raw_frame(&c, type, 0, 0, payload, n);
            sent++;
        }
        ssize_t k = send(c.fd, c.out, c.nout, MSG_NOSIGNAL);
        if (k > 0) {
            memmove(c.out, c.out + k, c.nout - (size_t)k);
            c.nout -= (size_t)k;
        }
        event_base_loop(sv.base, EVLOOP_NONBLOCK);
        http_server_stats(sv.s, &hs);
    }
    is_int(hs.open, 0, what);
    printf("# %ld frames written\n", sent);
    cl_close(&c);
    srv_fini(&sv);
}

static void
test_settings_flood(void)
{
    const uint8_t one[6] = {0, 4, 0, 1, 0, 0}; /* INITIAL_WINDOW_SIZE 65536 */
    ack_flood(NGHTTP2_SETTINGS, one, sizeof(one),
              "SETTINGS flood: the server closed the connection");
}

static void
test_ping_flood(void)
{
    const uint8_t ping[8] = {0};
    ack_flood(NGHTTP2_PING, ping, sizeof(ping), "PING flood: the server closed the connection");
}

static void
test_priority_flood(void)
{
    struct http_server_options o = opts();
    o.http2_max_streams = 4; /* a bucket of 40 PRIORITY frames */
    struct srv sv;
    srv_init(&sv, o);
    struct cl c;
    cl_open(&c, &sv, false, NULL);
    raw_preface(&c);
    const uint8_t pri[5] = {0, 0, 0, 0, 16};
    for (int i = 0; i < 100; i++)
        raw_frame(&c, NGHTTP2_PRIORITY, 0, (uint32_t)(2 * i + 1), pri, 5);
    pump(&sv, &c, 1);
    uint32_t code = 0;
    ok(raw_has_frame(&c, NGHTTP2_GOAWAY, &code), "PRIORITY flood: GOAWAY");
    is_int(code, NGHTTP2_ENHANCE_YOUR_CALM, "ENHANCE_YOUR_CALM");
    ok(c.eof, "connection closed");
    cl_close(&c);
    srv_fini(&sv);
}

static void
test_upgrade_refused(void)
{
    struct srv sv;
    srv_init(&sv, opts());
    struct cl c;
    cl_open(&c, &sv, true, NULL);
    nghttp2_nv x[] = {NV("connection", "upgrade"), NV("upgrade", "websocket")};
    int a = cl_req(&c, "GET", "/echo", x, 2, NULL);
    int b = cl_req(&c, "GET", "/echo", NULL, 0, NULL);
    pump(&sv, &c, 1);
    ok(c.st[a].closed, "an upgrade attempt is reset");
    is_int(c.st[a].close_code, NGHTTP2_PROTOCOL_ERROR, "PROTOCOL_ERROR, as Go's server");
    is_int(sv.nreq, 1, "the handler never sees it");
    is_int(c.st[b].status, 200, "the connection goes on");
    cl_close(&c);
    srv_fini(&sv);
}

static void
test_preface_beside_h1(void)
{
    struct srv sv;
    srv_init(&sv, opts());
    struct cl c[3];
    cl_open(&c[0], &sv, true, NULL);
    cl_open(&c[1], &sv, false, NULL);
    cl_open(&c[2], &sv, false, NULL);
    int a = cl_req(&c[0], "GET", "/echo", NULL, 0, NULL);
    cl_raw(&c[1], "GET /echo HTTP/1.1\r\nHost: h\r\n\r\n", 31);
    pump(&sv, c, 3);
    is_int(c[0].st[a].status, 200, "preface: HTTP/2");
    ok(c[0].st[a].body && strstr(c[0].st[a].body, "proto=HTTP/2.0"), "hreq_proto HTTP/2.0");
    ok(c[1].nin > 17 && memcmp(c[1].in, "HTTP/1.1 200 OK\r\n", 17) == 0, "no preface: HTTP/1.1");
    ok(c[1].in && strstr(c[1].in, "proto=HTTP/1.1"), "hreq_proto HTTP/1.1");
    /* one byte at a time: "P" is a prefix of the preface, "PO" is not */
    const char *req = "POST /echo HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi";
    for (size_t i = 0; i < strlen(req); i++) {
        cl_raw(&c[2], req + i, 1);
        pump(&sv, &c[2], 1);
    }
    ok(c[2].nin > 17 && memcmp(c[2].in, "HTTP/1.0 200 OK\r\n", 17) == 0, "byte by byte: HTTP/1.0");
    ok(c[2].in && strstr(c[2].in, "proto=HTTP/1.0\nhttp10=1"), "hreq_proto HTTP/1.0");
    struct http_server_stats hs;
    http_server_stats(sv.s, &hs);
    is_int(hs.h2_open, 1, "one HTTP/2 connection");
    is_int(hs.open, 2, "the HTTP/1.0 one closed after its answer");
    for (int i = 0; i < 3; i++)
        cl_close(&c[i]);
    srv_fini(&sv);
}

static void
test_shutdown(void)
{
    struct srv sv;
    srv_init(&sv, opts());
    struct cl c;
    cl_open(&c, &sv, true, NULL);
    int a = cl_req(&c, "GET", "/hold", NULL, 0, NULL);
    pump(&sv, &c, 1);
    http_server_shutdown(sv.s);
    pump(&sv, &c, 1);
    ok(c.goaway, "shutdown: GOAWAY");
    is_int(c.goaway_code, NGHTTP2_NO_ERROR, "NO_ERROR");
    is_int(c.goaway_last, c.st[a].id, "with the last stream id");
    ok(!c.eof && !c.st[a].closed, "the open stream goes on");
    struct hreq *r = sv.last->r;
    hresp_low_water(r, 0);
    hresp_start(r, 200, -1);
    char big[100000];
    memset(big, 'z', sizeof(big));
    hresp_write(r, big, sizeof(big)); /* over the stream's first window */
    ok(hresp_queued(r) >= sizeof(big), "queued on the stream");
    pump(&sv, &c, 1);
    is_int(hresp_queued(r), 0, "all left once the client opened its window");
    ok(sv.ndrain > 0, "on_drain");
    hresp_write(r, "late", 4);
    pump(&sv, &c, 1);
    ok(!c.st[a].closed, "not ended yet");
    hresp_end(r); /* after the data provider went quiet */
    pump(&sv, &c, 1);
    is_int(c.st[a].status, 200, "and finishes");
    is_int(c.st[a].nbody, sizeof(big) + 4, "with its body");
    ok(c.eof, "then the connection closes");
    cl_close(&c);
    srv_fini(&sv);
}

/* hresp_goaway (kube's UnauthenticatedHTTP2DOSMitigation): the stream that
 * asked finishes, a stream already open beside it finishes, the GOAWAY
 * names the last stream, and then the connection closes. */
static void
test_goaway_after(void)
{
    struct srv sv;
    srv_init(&sv, opts());
    struct cl c;
    cl_open(&c, &sv, true, NULL);
    int a = cl_req(&c, "GET", "/hold", NULL, 0, NULL);
    int b = cl_req(&c, "GET", "/hold", NULL, 0, NULL);
    pump(&sv, &c, 1);
    is_int(sv.nreq, 2, "goaway: two streams open");
    struct hreq *ra = sv.reqs[0]->r, *rb = sv.reqs[1]->r;
    hresp_goaway(ra);
    hresp_goaway(rb); /* both unauthenticated, in one loop turn: one GOAWAY */
    pump(&sv, &c, 1);
    ok(c.goaway, "goaway: GOAWAY sent before the answer");
    is_int(c.ngoaway, 1, "goaway: once, however many streams asked");
    is_int(c.goaway_code, NGHTTP2_NO_ERROR, "goaway: NO_ERROR");
    is_int(c.goaway_last, c.st[b].id, "goaway: the last stream id");
    ok(!c.eof, "goaway: the connection waits for its streams");
    hresp_simple(ra, 401, "text/plain", "no", 2);
    pump(&sv, &c, 1);
    is_int(c.st[a].status, 401, "goaway: the stream that asked is answered");
    ok(!c.eof, "goaway: the other stream still holds the connection");
    hresp_simple(rb, 200, "text/plain", "yes", 3);
    pump(&sv, &c, 1);
    is_int(c.st[b].status, 200, "goaway: the stream beside it is answered");
    ok(c.eof, "goaway: then the connection closes");
    cl_close(&c);
    srv_fini(&sv);
}

static void
test_free_goaway(void)
{
    struct srv sv;
    srv_init(&sv, opts());
    struct cl c;
    cl_open(&c, &sv, true, NULL);
    int a = cl_req(&c, "GET", "/hold", NULL, 0, NULL);
    pump(&sv, &c, 1);
    http_server_free(sv.s); /* no shutdown first: the server goes now */
    sv.s = NULL;
    cl_io(&c);
    ok(c.goaway, "http_server_free: a last GOAWAY");
    is_int(c.goaway_last, c.st[a].id, "with the last stream id");
    ok(sv.last->closed, "the stream's on_close ran");
    cl_close(&c);
    srv_fini(&sv);
}

/* ---- response streams (hresp_handoff, hstream_*) on HTTP/2 ---- */

struct hs_watch {
    int released, sent_calls, closed;
    int released_at_close; /* released when on_close ran */
    uint32_t tags[16];
    uint64_t sent;
};

static void
hw_release(void *arg, void *owner, uint32_t tag)
{
    struct hs_watch *w = arg;
    if (w->released < 16)
        w->tags[w->released] = tag;
    w->released++;
}

static void
hw_sent(void *arg, size_t queued)
{
    ((struct hs_watch *)arg)->sent_calls++;
}

static void
hw_close(void *arg, uint64_t sent)
{
    struct hs_watch *w = arg;
    w->closed++;
    w->sent = sent;
    w->released_at_close = w->released;
}

static const struct hstream_ops hw_ops = {
    .release = hw_release, .on_sent = hw_sent, .on_close = hw_close};

static void
test_hstream(void)
{
    struct srv sv;
    srv_init(&sv, opts());
    struct cl c;
    cl_open(&c, &sv, true, NULL);
    int a = cl_req(&c, "GET", "/watch", NULL, 0, NULL);
    int b = cl_req(&c, "GET", "/watch", NULL, 0, NULL);
    c.st[b].consume = false; /* b stalls at its window */
    pump(&sv, &c, 1);
    is_int(sv.nhand, 2, "two streams handed off");
    ok(sv.hand[0] && hstream_handoff_home(sv.hand[0]) == sv.base, "home: the connection's loop");
    ok(hstream_handoff_note(sv.hand[0]) == sv.reqs[0], "the note moved to the handoff");
    is_int(sv.nclose, 2, "the requests' on_close ran");
    is_int(sv.ndone, 2, "their done callback too");
    struct hs_watch wa = {0}, wb = {0};
    struct hstream *sa = hstream_attach(sv.hand[0], sv.base, &hw_ops, &wa);
    struct hstream *sb = hstream_attach(sv.hand[1], sv.base, &hw_ops, &wb);
    ok(sa && sb, "attached");
    static const char e1[] = "{\"a\":1}\n", e2[] = "{\"b\":2}\n";
    static char big[100000];
    memset(big, 'q', sizeof(big));
    hstream_write_ref(sa, &wa, 1, e1, strlen(e1));
    hstream_write(sa, "copy\n", 5);
    hstream_write_ref(sa, &wa, 2, e2, strlen(e2));
    hstream_write_ref(sb, &wb, 7, big, sizeof(big));
    is_int(hstream_queued(sa), strlen(e1) + 5 + strlen(e2), "queued: not sent before a flush");
    is_int(wa.released, 0, "nothing released inside a write");
    ok(hstream_flush(sa) && hstream_flush(sb), "flushed");
    pump(&sv, &c, 1);
    is_str(c.st[a].body, "head-{\"a\":1}\ncopy\n{\"b\":2}\n", "DATA in order, the head's first");
    ok(strstr(c.st[a].hdrs, "content-type=application/json\n") != NULL, "the head's headers");
    is_int(wa.released, 2, "both references released once framed");
    ok(wa.tags[0] == 1 && wa.tags[1] == 2, "in order, with their tags");
    ok(wa.sent_calls > 0, "on_sent");
    is_int(hstream_queued(sa), 0, "nothing queued");
    ok(hstream_queued(sb) > 0 && wb.released == 0, "the stalled stream keeps its reference");
    /* the live one goes on beside the stalled one */
    hstream_write_ref(sa, &wa, 3, e1, strlen(e1));
    hstream_flush(sa);
    pump(&sv, &c, 1);
    is_int(wa.released, 3, "a later write beside a stalled stream left");
    /* a reference framed once as an HTTP/1.1 chunk (a hub blob): DATA
     * carries the bytes alone */
    static char fr[HSTREAM_FRAME_HEAD + 8 + HSTREAM_FRAME_TAIL];
    memcpy(fr + HSTREAM_FRAME_HEAD, "{\"c\":3}\n", 8);
    hstream_frame(fr + HSTREAM_FRAME_HEAD, 8);
    hstream_write_framed_ref(sa, &wa, 4, fr + HSTREAM_FRAME_HEAD, 8);
    hstream_flush(sa);
    pump(&sv, &c, 1);
    is_int(wa.released, 4, "a framed reference left too");
    is_str(c.st[a].body, "head-{\"a\":1}\ncopy\n{\"b\":2}\n{\"a\":1}\n{\"c\":3}\n",
           "...as its bytes alone, unframed (DATA frames its own)");
    /* the client resets the stalled one: its reference, then on_close */
    nghttp2_submit_rst_stream(c.ss, NGHTTP2_FLAG_NONE, c.st[b].id, NGHTTP2_CANCEL);
    pump(&sv, &c, 1);
    is_int(wb.released, 1, "reset: the queued reference released");
    is_int(wb.closed, 1, "reset: on_close");
    hstream_end(sa);
    is_int(wa.closed, 0, "on_close never inside hstream_end");
    pump(&sv, &c, 1);
    is_int(wa.closed, 1, "ended: on_close once END_STREAM left");
    ok(wa.sent > strlen(e1) * 2, "with the bytes sent");
    ok(c.st[a].closed && c.st[a].close_code == 0, "the client saw a clean end");
    ok(!c.eof, "the connection stays");
    /* gone in transit: attach says so */
    int d = cl_req(&c, "GET", "/watch", NULL, 0, NULL);
    pump(&sv, &c, 1);
    nghttp2_submit_rst_stream(c.ss, NGHTTP2_FLAG_NONE, c.st[d].id, NGHTTP2_CANCEL);
    pump(&sv, &c, 1);
    struct hs_watch wd = {0};
    ok(hstream_attach(sv.hand[2], sv.base, &hw_ops, &wd) == NULL, "reset in transit: NULL");
    /* the server stopping: hstream_close releases, no on_close, resets */
    int e = cl_req(&c, "GET", "/watch", NULL, 0, NULL);
    pump(&sv, &c, 1);
    struct hs_watch we = {0};
    struct hstream *se = hstream_attach(sv.hand[3], sv.base, &hw_ops, &we);
    c.st[e].consume = false;
    hstream_write_ref(se, &we, 9, big, sizeof(big));
    hstream_flush(se);
    pump(&sv, &c, 1);
    ok(hstream_close(se) > 0, "hstream_close: the bytes sent");
    is_int(we.released, 1, "hstream_close: references released");
    pump(&sv, &c, 1);
    is_int(we.closed, 0, "hstream_close: no on_close");
    ok(c.st[e].closed, "hstream_close: the client's stream ends");
    cl_close(&c);
    srv_fini(&sv);
}

/* Many streams with large responses on one connection whose client does
 * not open their windows: what kwc queues for the connection stays under
 * its bound (plus one write), a watch stream there reports the bound; a
 * window opened lets its stream complete; every stream completes once all
 * are read. */
#define CONN_BOUND (256 * 1024)
#define NBIG 40

static void
test_conn_bound(void)
{
    struct http_server_options o = opts();
    o.http2_conn_buffer = CONN_BOUND;
    struct srv sv;
    srv_init(&sv, o);
    struct cl c;
    cl_open(&c, &sv, true, NULL);
    int wi = cl_req(&c, "GET", "/watch", NULL, 0, NULL);
    pump(&sv, &c, 1);
    struct hs_watch ww = {0};
    struct hstream *ws = hstream_attach(sv.hand[0], sv.base, &hw_ops, &ww);
    ok(ws != NULL, "a watch stream beside them");
    int first = c.nst;
    for (int i = 0; i < NBIG; i++) {
        int k = cl_req(&c, "GET", "/big", NULL, 0, NULL);
        c.st[k].consume = false; /* their windows never reopen */
    }
    pump(&sv, &c, 1);
    struct http_server_stats hs;
    http_server_stats(sv.s, &hs);
    printf("# %d streams x %d KiB, unread: peak %llu queued, now %llu (bound %d)\n", NBIG,
           BIG_BYTES / 1024, hs.h2_queued_peak, hs.h2_queued, CONN_BOUND);
    ok(hs.h2_queued_peak <= CONN_BOUND + 2 * BIG_PIECE,
       "the connection's queue stays under its bound (and one write)");
    ok(hs.h2_queued >= CONN_BOUND / 2, "and it is full");
    int open = 0, some = 0;
    for (int i = first; i < first + NBIG; i++) {
        open += !c.st[i].closed;
        some += c.st[i].nbody > 0;
    }
    is_int(open, NBIG, "every stream waits");
    printf("# %d streams got DATA before their windows closed\n", some);
    /* as the hub does: an event written, then the queue asked */
    hstream_write(ws, "ev\n", 3);
    ok(hstream_queued(ws) >= CONN_BOUND, "a watch stream on the full connection reports the bound");
    hstream_flush(ws);
    int sent_before = ww.sent_calls;
    /* one stream's window opens: it completes beside the stalled ones */
    int x = first + NBIG - 1;
    c.st[x].consume = true;
    nghttp2_session_consume_stream(c.ss, c.st[x].id, c.st[x].nbody);
    pump(&sv, &c, 1);
    ok(c.st[x].closed && c.st[x].nbody == BIG_BYTES, "the stream whose window opened completes");
    open = 0;
    for (int i = first; i < first + NBIG; i++)
        open += !c.st[i].closed;
    is_int(open, NBIG - 1, "the others wait");
    http_server_stats(sv.s, &hs);
    ok(hs.h2_queued_peak <= CONN_BOUND + 2 * BIG_PIECE, "still under the bound");
    /* all read: every stream completes */
    for (int i = first; i < first + NBIG; i++) {
        if (c.st[i].closed)
            continue;
        c.st[i].consume = true;
        nghttp2_session_consume_stream(c.ss, c.st[i].id, c.st[i].nbody);
    }
    pump(&sv, &c, 1);
    int whole = 0;
    for (int i = first; i < first + NBIG; i++)
        whole += c.st[i].closed && c.st[i].status == 200 && c.st[i].nbody == BIG_BYTES;
    is_int(whole, NBIG, "every stream completes when all are read");
    http_server_stats(sv.s, &hs);
    ok(hs.h2_queued_peak <= CONN_BOUND + 2 * BIG_PIECE, "under the bound throughout");
    is_int(hs.h2_queued, 0, "nothing queued at the end");
    ok(ww.sent_calls > sent_before, "the watch stream was woken (on_sent) when the room came");
    is_int(hstream_queued(ws), 0, "and reports its own queue again");
    hstream_end(ws);
    pump(&sv, &c, 1);
    ok(c.st[wi].closed, "the watch stream ends");
    cl_close(&c);
    srv_fini(&sv);
}

/* A handler told it may write (hresp_queued) that then writes nothing (a
 * passthrough waiting on its upstream) holds no room past the next send
 * round: the other streams fill the connection. */
/* The body /block should carry. */
static char *
block_body(void)
{
    char *want = xmalloc(2 * BLOCK_BYTES + 4);
    size_t n = 0;
    want[n++] = '<';
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < BLOCK_BYTES; i++)
            want[n++] = block_byte(i);
        want[n++] = k ? '>' : '|';
    }
    want[n] = '\0';
    return want;
}

/* A list's blocks (hresp_write_block) in DATA frames as large as the client
 * allows: 16 KiB by default, larger when its SETTINGS_MAX_FRAME_SIZE says
 * so (Go's client: 1 MiB); the bytes intact around the blocks' edges. */
static void
test_frame_sizes(void)
{
    char *want = block_body();
    for (int big = 0; big < 2; big++) {
        struct srv sv;
        srv_init(&sv, opts());
        struct cl c;
        cl_max_frame = big ? 1u << 20 : 0;
        cl_open(&c, &sv, true, NULL);
        cl_max_frame = 0;
        int a = cl_req(&c, "GET", "/block", NULL, 0, NULL);
        pump(&sv, &c, 1);
        is_int(c.st[a].status, 200, "/block answered");
        ok(c.st[a].nbody == 2 * BLOCK_BYTES + 3 && memcmp(c.st[a].body, want, c.st[a].nbody) == 0,
           "the blocks and the bytes between them, intact");
        printf("# client max frame %s: DATA frames up to %zu bytes\n", big ? "1 MiB" : "default",
               c.max_data);
        if (big)
            ok(c.max_data > 16384, "frames past 16 KiB when the client allows them");
        else
            is_int(c.max_data, 16384, "16 KiB frames by default (RFC 9113's initial size)");
        cl_close(&c);
        srv_fini(&sv);
    }
    free(want);
}

/* A watch event of EV_BIG bytes: "{" + 'x's + "}\n" (by reference in
 * plaintext: h2stream.c's H2_REF_MIN) */
#define EV_BIG 5000

static void
ev_fill(char *ev)
{
    memset(ev, 'x', EV_BIG);
    ev[0] = '{';
    ev[EV_BIG - 2] = '}';
    ev[EV_BIG - 1] = '\n';
}

/* A watch stream the client resets while its framed bytes still wait in
 * the connection's output (the socket is full): on_close waits for them,
 * and what the handler writes meanwhile is released before on_close. */
static void
test_hstream_zombie(void)
{
    struct srv sv;
    srv_init(&sv, opts());
    struct cl c;
    cl_sndbuf = 8192;
    cl_open(&c, &sv, true, NULL);
    cl_sndbuf = 0;
    int w = cl_req(&c, "GET", "/watch", NULL, 0, NULL);
    pump(&sv, &c, 1);
    struct hs_watch ww = {0};
    struct hstream *ws = hstream_attach(sv.hand[0], sv.base, &hw_ops, &ww);
    ok(ws != NULL, "attached");
    c.noread = true;
    int a = cl_req(&c, "GET", "/stream", NULL, 0, NULL); /* its window's worth fills the socket */
    pump(&sv, &c, 1);
    static char e1[EV_BIG];
    ev_fill(e1);
    hstream_write_ref(ws, &ww, 1, e1, EV_BIG);
    hstream_flush(ws);
    pump(&sv, &c, 1);
    is_int(ww.released, 0, "framed behind bytes the socket cannot take: held");
    nghttp2_submit_rst_stream(c.ss, NGHTTP2_FLAG_NONE, c.st[w].id, NGHTTP2_CANCEL);
    pump(&sv, &c, 1);
    ok(ww.closed == 0 && ww.released == 0, "reset: on_close waits for the bytes in the output");
    hstream_write_ref(ws, &ww, 2, e1, EV_BIG); /* the handler does not know yet */
    hstream_flush(ws);
    c.noread = false;
    pump(&sv, &c, 1);
    is_int(ww.closed, 1, "on_close once they left");
    is_int(ww.released_at_close, 2, "both references released before it");
    ok(c.st[a].nbody > 0 && !c.eof, "the connection goes on");
    cl_close(&c);
    srv_fini(&sv);
}

/* A list's block goes by reference in plaintext: its first frame, framed
 * when the request was read and written on a later loop turn, carries a
 * byte changed in between (the block is held until its bytes left). */
static void
test_block_no_copy(void)
{
    struct srv sv;
    srv_init(&sv, opts());
    struct cl c;
    cl_open(&c, &sv, true, NULL);
    pump(&sv, &c, 1); /* the prefaces and SETTINGS */
    int a = cl_req(&c, "GET", "/block1", NULL, 0, NULL);
    cl_io(&c);
    for (int i = 0; i < RUN_MAX && sv.nreq == 0; i++)
        event_base_loop(sv.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    is_int(sv.nreq, 1, "the request read, its first frames made");
    last_block[1] = 'Z';
    pump(&sv, &c, 1);
    is_int(c.st[a].nbody, BLOCK_BYTES, "the whole block");
    ok(c.st[a].nbody > 1 && c.st[a].body[1] == 'Z', "sent from the block itself (no copy)");
    cl_close(&c);
    srv_fini(&sv);
}

/* A watch's large entries go by reference in plaintext: the hub's bytes are
 * written from where they lie (a byte changed after framing is what the
 * client gets) and the reference is held until they left the connection's
 * output; a stream that ends meanwhile gets on_close only after that
 * release; hstream_close on such a stream releases before it returns. A
 * small entry is copied once and released as it is framed. */
static void
test_hstream_no_copy(void)
{
    struct srv sv;
    srv_init(&sv, opts());
    struct cl c;
    cl_open(&c, &sv, true, NULL);
    int a = cl_req(&c, "GET", "/watch", NULL, 0, NULL);
    int b = cl_req(&c, "GET", "/watch", NULL, 0, NULL);
    int d = cl_req(&c, "GET", "/watch", NULL, 0, NULL);
    pump(&sv, &c, 1);
    is_int(sv.nhand, 3, "three streams handed off");
    struct hs_watch wa = {0}, wb = {0}, wd = {0};
    struct hstream *sa = hstream_attach(sv.hand[0], sv.base, &hw_ops, &wa);
    struct hstream *sb = hstream_attach(sv.hand[1], sv.base, &hw_ops, &wb);
    struct hstream *sd = hstream_attach(sv.hand[2], sv.base, &hw_ops, &wd);
    ok(sa && sb && sd, "attached");
    static char ev[EV_BIG], ev2[EV_BIG];
    ev_fill(ev);
    ev_fill(ev2);
    hstream_write_ref(sa, &wa, 1, ev, EV_BIG);
    hstream_flush(sa);
    /* one loop turn: the connection's kick frames it into the output; the
     * socket's write event comes on a later turn */
    event_base_loop(sv.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    is_int(wa.released, 0, "framed, not yet written: the reference is held");
    ev[1] = '9';
    pump(&sv, &c, 1);
    ok(c.st[a].nbody == 5 + EV_BIG && c.st[a].body[6] == '9',
       "the bytes went from the blob itself (no copy)");
    is_int(wa.released, 1, "released once they left");
    /* a small one: copied once as it is framed */
    static const char e1[] = "{\"a\":1}\n";
    hstream_write_ref(sa, &wa, 4, e1, strlen(e1));
    hstream_flush(sa);
    event_base_loop(sv.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    is_int(wa.released, 2, "a small event: released once framed (copied)");
    pump(&sv, &c, 1);
    ok(c.st[a].nbody == 5 + EV_BIG + strlen(e1), "...and sent");
    /* ends while its bytes wait in the output: on_close after the release */
    hstream_write_ref(sb, &wb, 2, ev2, EV_BIG);
    hstream_end(sb);
    event_base_loop(sv.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    ok(wb.released == 0 && wb.closed == 0, "END_STREAM framed: neither released nor closed yet");
    pump(&sv, &c, 1);
    is_int(c.st[b].nbody, 5 + EV_BIG, "its bytes arrived");
    is_int(wb.closed, 1, "on_close once they left");
    is_int(wb.released_at_close, 1, "...after the release");
    ok(c.st[b].closed && c.st[b].close_code == 0, "a clean end");
    /* hstream_close while its bytes wait: released before it returns */
    hstream_write_ref(sd, &wd, 3, ev2, EV_BIG);
    hstream_end(sd);
    event_base_loop(sv.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    is_int(wd.released, 0, "a third framed and ended, held");
    ok(wd.closed == 0 && hstream_close(sd) > 0, "hstream_close on it (not closed yet)");
    is_int(wd.released, 1, "hstream_close released it");
    pump(&sv, &c, 1);
    is_int(wd.closed, 0, "no on_close after hstream_close");
    is_int(c.st[d].nbody, 5 + EV_BIG, "its bytes left first (the socket had room)");
    ok(!c.eof, "the connection stays");
    hstream_end(sa);
    pump(&sv, &c, 1);
    is_int(wa.closed, 1, "the first ends cleanly");
    cl_close(&c);
    srv_fini(&sv);
}

static void
test_pledge_lapses(void)
{
    struct http_server_options o = opts();
    o.http2_conn_buffer = CONN_BOUND;
    struct srv sv;
    srv_init(&sv, o);
    struct cl c;
    cl_open(&c, &sv, true, NULL);
    cl_req(&c, "GET", "/hold", NULL, 0, NULL);
    pump(&sv, &c, 1);
    struct hreq *idle = sv.last->r;
    hresp_low_water(idle, 3 * CONN_BOUND / 4); /* its pledge: most of the bound */
    hresp_start(idle, 200, -1);
    is_int(hresp_queued(idle), 0, "the idle stream may write");
    int first = c.nst;
    for (int i = 0; i < 10; i++) {
        int k = cl_req(&c, "GET", "/big", NULL, 0, NULL);
        c.st[k].consume = false;
    }
    pump(&sv, &c, 1);
    struct http_server_stats hs;
    http_server_stats(sv.s, &hs);
    printf("# an idle stream's pledge of %d KiB: %llu queued by the others\n",
           3 * CONN_BOUND / 4 / 1024, hs.h2_queued);
    ok(hs.h2_queued >= CONN_BOUND - BIG_MARK, "the others fill the connection (the pledge lapsed)");
    ok(hs.h2_queued_peak <= CONN_BOUND + 2 * BIG_PIECE, "under the bound");
    hresp_end(idle);
    for (int i = first; i < first + 10; i++) {
        c.st[i].consume = true;
        nghttp2_session_consume_stream(c.ss, c.st[i].id, c.st[i].nbody);
    }
    pump(&sv, &c, 1);
    int whole = 0;
    for (int i = first; i < first + 10; i++)
        whole += c.st[i].closed && c.st[i].nbody == BIG_BYTES;
    is_int(whole, 10, "all complete once read");
    cl_close(&c);
    srv_fini(&sv);
}

/* ---- TLS: ALPN ---- */

/* A server serving TLS with o's limits, and a client of it (offering
 * http/1.1 first, then h2); tls_close ends all three. */
static SSL_CTX *
tls_open(struct srv *sv, struct cl *c, struct http_server_options o)
{
    tfx_dir_open("h2_test");
    tfx_write_pair("localhost", NULL);
    o.tls_cert_file = tfx_cert_path;
    o.tls_key_file = tfx_key_path;
    srv_init(sv, o);
    SSL_CTX *cctx = tfx_client_ctx();
    cl_open(c, sv, true, cctx);
    return cctx;
}

static void
tls_close(struct srv *sv, struct cl *c, SSL_CTX *cctx)
{
    cl_close(c);
    srv_fini(sv);
    SSL_CTX_free(cctx);
    tfx_dir_close();
}

static void
test_alpn(void)
{
    struct srv sv;
    struct cl c;
    SSL_CTX *cctx = tls_open(&sv, &c, opts());
    int a = cl_req(&c, "GET", "/echo", NULL, 0, NULL);
    pump(&sv, &c, 1);
    const unsigned char *p = NULL;
    unsigned int n = 0;
    SSL_get0_alpn_selected(c.ssl, &p, &n);
    ok(n == 2 && memcmp(p, "h2", 2) == 0, "ALPN: the server prefers h2");
    is_int(c.st[a].status, 200, "HTTP/2 over TLS answered");
    ok(c.st[a].body && strstr(c.st[a].body, "proto=HTTP/2.0"), "as HTTP/2.0");
    tls_close(&sv, &c, cctx);
}

/* ---- TLS: a DATA frame and its header fill one record ---- */

#define MAX_REC 512
static size_t rec_len[MAX_REC]; /* application data records received: length on the wire */
static int nrec;

static void
on_msg(int write_p, int version, int content_type, const void *buf, size_t len, SSL *ssl, void *arg)
{
    const unsigned char *h = buf;
    if (!write_p && content_type == SSL3_RT_HEADER && len == 5 &&
        h[0] == SSL3_RT_APPLICATION_DATA && nrec < MAX_REC)
        rec_len[nrec++] = ((size_t)h[3] << 8) | h[4];
}

/* Over TLS a body goes out in DATA frames of 16384 - 9 bytes, each with its
 * header one piece: full records (without that, every frame's 9-byte header
 * and its data are sealed apart and no record is a full one). */
static void
test_tls_records(void)
{
    struct srv sv;
    struct cl c;
    SSL_CTX *cctx = tls_open(&sv, &c, opts());
    SSL_set_msg_callback(c.ssl, on_msg);
    int a = cl_req(&c, "GET", "/stream", NULL, 0, NULL);
    pump(&sv, &c, 1);
    is_int(c.st[a].status, 200, "HTTP/2 over TLS answered");
    is_int(c.st[a].nbody, STREAM_BYTES, "the whole body");
    int full = 0;
    for (int i = 0; i < nrec; i++)
        full += rec_len[i] == 16384 + 17; /* TLS 1.3: a type byte and a 16-byte tag */
    printf("# %d application data records, %d full\n", nrec, full);
    ok(full >= STREAM_BYTES / (16384 - 9) - 1, "the body's records are full ones");
    char *want = block_body();
    int b = cl_req(&c, "GET", "/block", NULL, 0, NULL);
    pump(&sv, &c, 1);
    ok(c.st[b].nbody == 2 * BLOCK_BYTES + 3 && memcmp(c.st[b].body, want, c.st[b].nbody) == 0,
       "blocks over TLS: intact");
    ok(c.max_data <= 16384 - 9, "a frame and its header within one record");
    free(want);
    tls_close(&sv, &c, cctx);
}

/* Frames of many streams share records: 30 answers of ~3 KB in one send
 * round leave in full records, not one record (and one write) a frame. */
static void
test_tls_records_shared(void)
{
    struct http_server_options o = opts();
    o.max_header_bytes = 16384;
    struct srv sv;
    struct cl c;
    SSL_CTX *cctx = tls_open(&sv, &c, o);
    SSL_set_msg_callback(c.ssl, on_msg);
    int first = cl_req(&c, "GET", "/echo", NULL, 0, NULL);
    pump(&sv, &c, 1);
    is_int(c.st[first].status, 200, "the handshake and a first answer");
    char big[2901];
    memset(big, 'e', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    nghttp2_nv x[] = {NV("x-echo", big)}; /* each answer carries it: ~3 KB */
    int from = nrec, n = 30;
    for (int i = 0; i < n; i++)
        cl_req(&c, "GET", "/echo", x, 1, NULL);
    pump(&sv, &c, 1);
    int good = 0;
    size_t bytes = 0;
    for (int i = first + 1; i <= first + n; i++)
        good += c.st[i].status == 200 && c.st[i].nbody > 2900;
    is_int(good, n, "every stream answered over TLS");
    for (int i = from; i < nrec; i++)
        bytes += rec_len[i];
    int recs = nrec - from;
    printf("# %d answers of ~3 KB: %d records, %zu bytes\n", n, recs, bytes);
    ok(recs <= (int)(bytes / (16384 + 17)) + 3,
       "records as full as the answers' bytes allow, not one a frame");
    tls_close(&sv, &c, cctx);
}

int
main(void)
{
    signal(SIGPIPE, SIG_IGN);
    TAP_RUN(test_get);
    TAP_RUN(test_post_flow);
    TAP_RUN(test_many_streams);
    TAP_RUN(test_stall);
    TAP_RUN(test_reset_abort);
    TAP_RUN(test_max_streams);
    TAP_RUN(test_rapid_reset);
    TAP_RUN(test_reset_of_closed_stream_not_counted);
    TAP_RUN(test_header_list);
    TAP_RUN(test_hpack_bomb_one_block);
    TAP_RUN(test_hpack_bomb_many_blocks);
    TAP_RUN(test_made_you_reset);
    TAP_RUN(test_held_bodies);
    TAP_RUN(test_held_cap);
    TAP_RUN(test_continuation_flood);
    TAP_RUN(test_ping_flood);
    TAP_RUN(test_settings_flood);
    TAP_RUN(test_priority_flood);
    TAP_RUN(test_upgrade_refused);
    TAP_RUN(test_preface_beside_h1);
    TAP_RUN(test_shutdown);
    TAP_RUN(test_goaway_after);
    TAP_RUN(test_free_goaway);
    TAP_RUN(test_alpn);
    TAP_RUN(test_tls_records);
    TAP_RUN(test_tls_records_shared);
    TAP_RUN(test_hstream);
    TAP_RUN(test_conn_bound);
    TAP_RUN(test_pledge_lapses);
    TAP_RUN(test_frame_sizes);
    TAP_RUN(test_hstream_no_copy);
    TAP_RUN(test_block_no_copy);
    TAP_RUN(test_hstream_zombie);
    return tap_done();
}
