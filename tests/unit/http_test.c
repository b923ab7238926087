/*
 * http_test.c — proxy/http/ (http.c, h1.c, hreq.c, hresp.c): kwc's HTTP/1.1
 * server (include/kwc/http.h), without a network: every test builds a
 * server with no listen address on a fresh event_base, adopts one end of a
 * socketpair(AF_UNIX) and plays the client on the other (test_listen alone
 * listens, on loopback port 0). TLS: htls_test.c.
 *
 * Request bytes are written in one piece or one byte at a time with a loop
 * turn after each (so the server reads them apart); both must give the same
 * answer. The loop runs with EVLOOP_NONBLOCK until nothing moves (no byte
 * read by either side, no handler hook), bounded. Timeouts are configured
 * short and the loop runs with EVLOOP_ONCE until the client sees what it
 * waits for, bounded by a guard timer that only fires when the server never
 * acts. Never a sleep.
 *
 * Expected bytes are written from RFC 9112 and http.h (status line, the
 * headers the contract names, chunk framing); the Date header's value is
 * the clock's, so it is checked for shape once and then cut out before
 * comparing. A small response splitter below (independent of proxy/http/)
 * reads Content-Length and chunked bodies.
 *
 * A socketpair is the one socket here but for test_listen's (127.0.0.1): it
 * is how the server's own reads and writes are driven; nothing leaves the
 * process.
 */
#include "kwc/gostr.h"
#include "kwc/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <fcntl.h>
#include <jansson.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kwc/base.h"
#include "tap.h"

#define RUN_MAX 200000 /* loop turns before "the server never goes quiet" */
#define QUIET_TURNS 3  /* turns without progress that count as quiet */
#define GUARD_MS 3000  /* bound on waiting for a timer; never reached when all is well */
#define MAX_PEERS 8
#define MAX_REQS 256

/* ---- a growable byte string ---- */

struct sbuf {
    char *p;
    size_t n, cap;
};

static void
sb_add(struct sbuf *b, const void *p, size_t n)
{
    /* kwc's string builder, under the short field names the tests use */
    struct gostr_buf g = {.p = b->p, .len = b->n, .cap = b->cap};
    gostr_addn(&g, n ? p : "", n);
    b->p = g.p;
    b->n = g.len;
    b->cap = g.cap;
}

static void sb_addf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
sb_addf(struct sbuf *b, const char *fmt, ...)
{
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(tmp))
        abort(); /* a test outgrew the buffer */
    sb_add(b, tmp, (size_t)n);
}

static void
sb_str(struct sbuf *b, const char *s)
{
    sb_add(b, s, strlen(s));
}

static void
sb_reset(struct sbuf *b)
{
    b->n = 0;
    if (b->p)
        b->p[0] = '\0';
}

static void
sb_free(struct sbuf *b)
{
    free(b->p);
    *b = (struct sbuf){0};
}

/* ---- the test handler ----
 *
 * What it does depends on the target's path:
 *   /stream  read the body; on_complete: a streamed response (hresp_start
 *            -1) with the pieces "a" and "bb", left open for the test;
 *   /early   answer "early" from on_request, without reading the body;
 *   /defer   hooks only: the test turns body reading on; echo on_complete;
 *   /take    a streamed head, then hresp_handoff from on_request (the
 *            handoff kept in th.handoff);
 *   /pipe    hreq_take_pipe from on_request (kept in th.pipe; its on_read
 *            logs "pipe read <bytes in its input>" and consumes nothing);
 *   /count   hreq_count_socket, then parked like /park;
 *   /peer    answer "<address>:<port>" of hreq_peer;
 *   anything else: echo (read the body unless the target has "noread";
 *            with "pause", turn reading off inside the first on_body).
 * The echo body: "<method> <target>\n", "host=<v>\n" and "x-echo=<v>\n"
 * when present, then "body=" and the body bytes.
 * Every hook is logged in order ("req <id> <method> <target>", "body <id>
 * <n>", "complete <id>", "close <id>").
 */

struct th;

struct treq {
    struct th *t;
    struct hreq *r;
    int id;
    bool stream, pause, echo;
    struct sbuf body;
};

struct th {
    struct sbuf log;
    unsigned long long hooks; /* every hook, for "has anything moved" */
    int nreq, ncomplete, nclose;
    struct treq *reqs[MAX_REQS];     /* by id; NULL once closed */
    struct hstream_handoff *handoff; /* /take */
    struct hpipe *pipe;              /* /pipe */
    bool notes;                      /* test_done: each request gets a note (http_server_on_done) */
};

static void th_log(struct th *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
th_log(struct th *t, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    sb_str(&t->log, tmp);
    sb_add(&t->log, "\n", 1);
    t->hooks++;
}

static void
echo_answer(struct treq *q)
{
    struct hreq *r = q->r;
    struct sbuf o = {0};
    size_t tl;
    const char *target = hreq_target(r, &tl);
    sb_str(&o, hreq_method(r));
    sb_add(&o, " ", 1);
    sb_add(&o, target, tl);
    sb_add(&o, "\n", 1);
    const char *v;
    if ((v = hreq_header(r, "Host")))
        sb_addf(&o, "host=%s\n", v);
    if ((v = hreq_header(r, "X-Echo")))
        sb_addf(&o, "x-echo=%s\n", v);
    sb_str(&o, "body=");
    sb_add(&o, q->body.p, q->body.n);
    hresp_start(r, 200, (int64_t)o.n);
    hresp_write(r, o.p, o.n);
    hresp_end(r);
    sb_free(&o);
}

static void
h_body(void *arg, const char *p, size_t n)
{
    struct treq *q = arg;
    sb_add(&q->body, p, n);
    th_log(q->t, "body %d %zu", q->id, n);
    if (q->pause) {
        q->pause = false;
        hreq_body_read(q->r, false);
    }
}

static void
h_complete(void *arg)
{
    struct treq *q = arg;
    th_log(q->t, "complete %d", q->id);
    q->t->ncomplete++;
    if (q->stream) {
        hresp_start(q->r, 200, -1);
        hresp_write(q->r, "a", 1);
        hresp_write(q->r, "bb", 2);
    } else if (q->echo) {
        echo_answer(q);
    }
}

static void
h_close(void *arg)
{
    struct treq *q = arg;
    th_log(q->t, "close %d", q->id);
    q->t->nclose++;
    q->t->reqs[q->id] = NULL;
    sb_free(&q->body);
    free(q);
}

static const struct hreq_handler hooks = {
    .on_body = h_body,
    .on_complete = h_complete,
    .on_close = h_close,
};

/* /park: the stages before a handler wait (for the upstream to
 * authenticate): a handler that only frees, and the body held. */
static const struct hreq_handler parked_hooks = {.on_close = h_close};

static void
pipe_read(void *arg)
{
    struct th *t = arg;
    th_log(t, "pipe read %zu", evbuffer_get_length(hpipe_input(t->pipe)));
}

static const struct hpipe_ops pipe_ops = {.on_read = pipe_read};

static void
on_request(void *arg, struct hreq *r)
{
    struct th *t = arg;
    size_t tl;
    const char *target = hreq_target(r, &tl);
    if (t->nreq >= MAX_REQS)
        abort();
    struct treq *q = xcalloc(1, sizeof(*q));
    q->t = t;
    q->r = r;
    q->id = t->nreq++;
    t->reqs[q->id] = q;
    th_log(t, "req %d %s %.*s", q->id, hreq_method(r), tl > 64 ? 64 : (int)tl, target);
    hreq_set_handler(r, &hooks, q);
    if (t->notes)
        hreq_set_note(r, (void *)(uintptr_t)(0x1000 + q->id));
    if (strncmp(target, "/stream", 7) == 0) {
        q->stream = true;
        hreq_body_read(r, true);
    } else if (strncmp(target, "/early", 6) == 0) {
        hresp_simple(r, 200, NULL, "early", 5);
    } else if (strncmp(target, "/defer", 6) == 0) {
        q->echo = true;
    } else if (strncmp(target, "/park", 5) == 0 || strncmp(target, "/count", 6) == 0) {
        if (target[1] == 'c')
            hreq_count_socket(r);
        hreq_set_handler(r, &parked_hooks, q);
        hreq_body_hold(r);
    } else if (strncmp(target, "/take", 5) == 0) {
        hresp_header(r, "X-Stream", "1");
        hresp_start(r, 200, -1);
        t->handoff = hresp_handoff(r);
        th_log(t, "taken %d", t->handoff != NULL);
    } else if (strncmp(target, "/pipe", 5) == 0) {
        t->pipe = hreq_take_pipe(r, &pipe_ops, t);
        th_log(t, "pipe %d", t->pipe != NULL);
    } else if (strncmp(target, "/peer", 5) == 0) {
        socklen_t sl = 0;
        const struct sockaddr *sa = hreq_peer(r, &sl);
        char a[INET_ADDRSTRLEN] = "?", b[64];
        int port = -1;
        if (sa->sa_family == AF_INET && sl == sizeof(struct sockaddr_in)) {
            const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
            inet_ntop(AF_INET, &in->sin_addr, a, sizeof(a));
            port = ntohs(in->sin_port);
        }
        int n = snprintf(b, sizeof(b), "%s:%d", a, port);
        hresp_simple(r, 200, NULL, b, (size_t)n);
    } else {
        q->echo = true;
        q->pause = strstr(target, "pause") != NULL;
        if (!strstr(target, "noread"))
            hreq_body_read(r, true);
    }
}

/* ---- the fixture: a server, its loop and the client ends ---- */

struct peer {
    int fd;
    struct sbuf in; /* every byte the server sent */
    bool eof;
};

struct fx {
    struct event_base *base;
    struct http_server *s;
    struct th t;
    struct peer p[MAX_PEERS];
    int np;
    struct event *guard;
    bool guard_fired;
};

static void
on_guard(evutil_socket_t fd, short what, void *arg)
{
    struct fx *f = arg;
    f->guard_fired = true;
}

static void
fx_init(struct fx *f, const struct http_server_options *o)
{
    *f = (struct fx){0};
    f->base = event_base_new();
    struct http_server_options none = {0};
    char err[256] = "";
    int rc = http_server_new(f->base, o ? o : &none, on_request, &f->t, &f->s, err, sizeof(err));
    if (rc != 0) {
        printf("# http_server_new: %d %s\n", rc, err);
        abort();
    }
    f->guard = evtimer_new(f->base, on_guard, f);
}

/* A new client connection; returns its index. */
static int
fx_connect(struct fx *f)
{
    int sv[2];
    if (f->np == MAX_PEERS ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
        abort();
    struct peer *p = &f->p[f->np];
    *p = (struct peer){.fd = sv[0]};
    http_server_adopt(f->s, sv[1], NULL, 0);
    return f->np++;
}

/* A new client connection that the server sees as coming from sa. */
static int
fx_connect_from(struct fx *f, const struct sockaddr *sa, socklen_t len)
{
    int sv[2];
    if (f->np == MAX_PEERS ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
        abort();
    struct peer *p = &f->p[f->np];
    *p = (struct peer){.fd = sv[0]};
    http_server_adopt(f->s, sv[1], sa, len);
    return f->np++;
}

/* Read what the server sent to every client. */
static void
peers_read(struct fx *f)
{
    for (int i = 0; i < f->np; i++) {
        struct peer *p = &f->p[i];
        if (p->fd < 0 || p->eof)
            continue;
        for (;;) {
            char buf[65536];
            ssize_t n = recv(p->fd, buf, sizeof(buf), 0);
            if (n > 0) {
                sb_add(&p->in, buf, (size_t)n);
                continue;
            }
            if (n == 0 || (errno != EAGAIN && errno != EINTR))
                p->eof = true; /* EOF, or a reset after the last byte */
            break;
        }
    }
}

/* Something that changes whenever either side does anything. */
static unsigned long long
progress(const struct fx *f)
{
    unsigned long long v = f->t.hooks;
    for (int i = 0; i < f->np; i++) {
        const struct peer *p = &f->p[i];
        v += p->in.n + p->eof;
        int q = 0;
        if (p->fd >= 0 && ioctl(p->fd, SIOCOUTQ, &q) == 0)
            v += (unsigned)q * 7919u; /* bytes the server has not read yet */
    }
    return v;
}

/* One non-blocking loop turn; returns whether anything moved. */
static bool
turn(struct fx *f)
{
    unsigned long long before = progress(f);
    event_base_loop(f->base, EVLOOP_NONBLOCK);
    peers_read(f);
    return progress(f) != before;
}

/* Run until quiet. */
static void
run(struct fx *f)
{
    int idle = 0, i;
    for (i = 0; i < RUN_MAX && idle < QUIET_TURNS; i++)
        idle = turn(f) ? 0 : idle + 1;
    if (i == RUN_MAX)
        ok(0, "the loop goes quiet");
}

/* Write bytes from client i: whole (piece 0) or in pieces of that size,
 * with a loop turn after each piece; then run until quiet. */
static void
send_bytes(struct fx *f, int i, const void *data, size_t len, size_t piece)
{
    const char *d = data;
    size_t off = 0;
    int stuck = 0;
    while (off < len) {
        size_t n = piece ? piece : len - off;
        if (n > len - off)
            n = len - off;
        ssize_t w = send(f->p[i].fd, d + off, n, MSG_NOSIGNAL);
        if (w > 0) {
            off += (size_t)w;
            stuck = 0;
        } else if (w < 0 && errno == EAGAIN) {
            if (++stuck > 1000)
                break; /* the server stopped reading: what is sent is sent */
        } else {
            break; /* the server closed */
        }
        turn(f);
    }
    run(f);
}

static void
send_str(struct fx *f, int i, const char *s, size_t piece)
{
    send_bytes(f, i, s, strlen(s), piece);
}

/* Run with EVLOOP_ONCE until client i sees EOF (or the guard fires). */
static bool
run_until_eof(struct fx *f, int i)
{
    struct timeval tv = {GUARD_MS / 1000, (GUARD_MS % 1000) * 1000};
    f->guard_fired = false;
    evtimer_add(f->guard, &tv);
    peers_read(f);
    for (int n = 0; n < 100000 && !f->p[i].eof && !f->guard_fired; n++) {
        event_base_loop(f->base, EVLOOP_ONCE);
        peers_read(f);
    }
    evtimer_del(f->guard);
    return f->p[i].eof;
}

/* Client i closes its end. */
static void
fx_hangup(struct fx *f, int i)
{
    if (f->p[i].fd >= 0)
        close(f->p[i].fd);
    f->p[i].fd = -1;
}

/* Every client closes, the server goes; every request was closed once. */
static void
fx_fini(struct fx *f)
{
    for (int i = 0; i < f->np; i++)
        fx_hangup(f, i);
    run(f);
    http_server_free(f->s);
    is_int(f->t.nclose, f->t.nreq, "every request's on_close ran once");
    for (int i = 0; i < f->np; i++)
        sb_free(&f->p[i].in);
    hstream_handoff_free(f->t.handoff);
    sb_free(&f->t.log);
    event_free(f->guard);
    event_base_free(f->base);
}

/* ---- reading responses ---- */

/* The client's bytes with every "Date: ...\r\n" header line cut out. */
static void
undated(const struct sbuf *in, struct sbuf *out)
{
    sb_reset(out);
    const char *p = in->p ? in->p : "", *end = p + in->n;
    while (p < end) {
        const char *d = memmem(p, (size_t)(end - p), "\r\nDate: ", 8);
        if (!d) {
            sb_add(out, p, (size_t)(end - p));
            break;
        }
        const char *eol = memmem(d + 2, (size_t)(end - d - 2), "\r\n", 2);
        if (!eol) {
            sb_add(out, p, (size_t)(end - p));
            break;
        }
        sb_add(out, p, (size_t)(d - p));
        p = eol; /* keep the CRLF that ended the previous line */
    }
}

/* Check the bytes client i got, Date lines aside. */
static void
is_got(struct fx *f, int i, const char *want, const char *what)
{
    struct sbuf u = {0};
    undated(&f->p[i].in, &u);
    is_mem(u.p ? u.p : "", u.n, want, strlen(want), what);
    sb_free(&u);
}

struct resp {
    bool complete;
    int status;
    char version[16];
    struct sbuf head; /* the header lines, each ending in CRLF */
    struct sbuf body; /* decoded */
    bool chunked;
    size_t raw_len; /* bytes this response took on the wire */
};

static void
resp_free(struct resp *r)
{
    sb_free(&r->head);
    sb_free(&r->body);
}

/* A header's value (first of that name, case-insensitive), or NULL; into buf. */
static const char *
resp_header(const struct resp *r, const char *name, char *buf, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *p = r->head.p; p && *p;) {
        const char *eol = strstr(p, "\r\n");
        if (!eol)
            break;
        if ((size_t)(eol - p) > nl && p[nl] == ':' && strncasecmp(p, name, nl) == 0) {
            const char *v = p + nl + 1;
            while (*v == ' ')
                v++;
            snprintf(buf, cap, "%.*s", (int)(eol - v), v);
            return buf;
        }
        p = eol + 2;
    }
    return NULL;
}

/*
 * Parse one response from p (RFC 9112: status line, fields, a body framed
 * by Content-Length, chunked coding or the close). eof: the connection
 * closed after these bytes. head_req: the response answers a HEAD (no body).
 */
static void
resp_parse(const char *p, size_t n, bool eof, bool head_req, struct resp *r)
{
    *r = (struct resp){0};
    const char *end = p + n;
    const char *he = memmem(p, n, "\r\n\r\n", 4);
    if (!he)
        return;
    const char *sl = memmem(p, n, "\r\n", 2);
    if (sscanf(p, "%15s %d", r->version, &r->status) != 2)
        return;
    sb_add(&r->head, sl + 2, (size_t)(he + 2 - (sl + 2)));
    const char *b = he + 4;
    char v[64];
    if (head_req || r->status == 204 || r->status == 304 || r->status / 100 == 1) {
        r->complete = true;
        r->raw_len = (size_t)(b - p);
        return;
    }
    if (resp_header(r, "Transfer-Encoding", v, sizeof(v))) {
        r->chunked = true;
        for (;;) {
            const char *le = memmem(b, (size_t)(end - b), "\r\n", 2);
            if (!le)
                return;
            unsigned long sz = strtoul(b, NULL, 16);
            if (sz == 0) {
                if ((size_t)(end - le) < 4 || memcmp(le, "\r\n\r\n", 4) != 0)
                    return;
                r->complete = true;
                r->raw_len = (size_t)(le + 4 - p);
                return;
            }
            if ((size_t)(end - (le + 2)) < sz + 2)
                return;
            sb_add(&r->body, le + 2, sz);
            b = le + 2 + sz + 2;
        }
    }
    if (resp_header(r, "Content-Length", v, sizeof(v))) {
        size_t cl = strtoul(v, NULL, 10);
        if ((size_t)(end - b) < cl)
            return;
        sb_add(&r->body, b, cl);
        r->complete = true;
        r->raw_len = (size_t)(b + cl - p);
        return;
    }
    sb_add(&r->body, b, (size_t)(end - b)); /* close-delimited */
    r->complete = eof;
    r->raw_len = n;
}

static const char *
jstr(const json_t *j, const char *key)
{
    const char *v = json_string_value(json_object_get(j, key));
    return v ? v : "";
}

/* Client i's bytes hold exactly one response, a Status for code, then EOF. */
static void
is_status_answer(struct fx *f, int i, int code, const char *what)
{
    char m[200];
    struct peer *p = &f->p[i];
    struct resp r;
    resp_parse(p->in.p ? p->in.p : "", p->in.n, p->eof, false, &r);
    snprintf(m, sizeof(m), "%s: a complete response", what);
    ok(r.complete, m);
    snprintf(m, sizeof(m), "%s: HTTP/1.1 %d", what, code);
    ok(strcmp(r.version, "HTTP/1.1") == 0, m);
    is_int(r.status, code, m);
    snprintf(m, sizeof(m), "%s: nothing after it", what);
    is_int(r.raw_len, p->in.n, m);
    char v[64];
    snprintf(m, sizeof(m), "%s: Connection: close", what);
    is_str(resp_header(&r, "Connection", v, sizeof(v)), "close", m);
    snprintf(m, sizeof(m), "%s: Content-Type: application/json", what);
    is_str(resp_header(&r, "Content-Type", v, sizeof(v)), "application/json", m);
    json_error_t je;
    json_t *j = json_loadb(r.body.p ? r.body.p : "", r.body.n, 0, &je);
    snprintf(m, sizeof(m), "%s: a Status body, kind Status, status Failure, code %d", what, code);
    ok(j && json_is_object(j) && strcmp(jstr(j, "kind"), "Status") == 0 &&
           strcmp(jstr(j, "apiVersion"), "v1") == 0 && strcmp(jstr(j, "status"), "Failure") == 0 &&
           json_integer_value(json_object_get(j, "code")) == code && *jstr(j, "message"),
       m);
    json_decref(j);
    snprintf(m, sizeof(m), "%s: the connection closes", what);
    ok(p->eof, m);
    resp_free(&r);
}

/* The response the echo handler gives (Date aside). */
static void
want_echo(struct sbuf *w, const char *version, const char *conn, const char *method,
          const char *target, const char *host, const char *xecho, const char *body, size_t blen)
{
    struct sbuf e = {0};
    sb_str(&e, method);
    sb_str(&e, " ");
    sb_str(&e, target);
    sb_str(&e, "\n");
    if (host)
        sb_addf(&e, "host=%s\n", host);
    if (xecho)
        sb_addf(&e, "x-echo=%s\n", xecho);
    sb_str(&e, "body=");
    sb_add(&e, body, blen);
    sb_addf(w, "%s 200 OK\r\nContent-Length: %zu\r\n", version, e.n);
    if (conn)
        sb_addf(w, "Connection: %s\r\n", conn);
    sb_str(w, "\r\n");
    sb_add(w, e.p, e.n);
    sb_free(&e);
}

/* The same request bytes whole and one byte at a time. */
static const size_t pieces[] = {0, 1};

static const char *
piece_name(size_t piece)
{
    return piece ? "byte by byte" : "in one write";
}

/* ---- tests ---- */

static void
test_simple_get(void)
{
    for (size_t k = 0; k < KWC_ARRAY_LEN(pieces); k++) {
        struct fx f;
        char m[128];
        fx_init(&f, NULL);
        int c = fx_connect(&f);
        send_str(&f, c, "GET /a?b=c HTTP/1.1\r\nHost: h\r\nX-Echo: x y\r\n\r\n", pieces[k]);
        struct sbuf w = {0};
        want_echo(&w, "HTTP/1.1", NULL, "GET", "/a?b=c", "h", "x y", "", 0);
        snprintf(m, sizeof(m), "%s: the echo, exact bytes", piece_name(pieces[k]));
        is_got(&f, c, w.p, m);
        /* Date: IMF-fixdate (RFC 9110 5.6.7) */
        const char *d = f.p[c].in.p ? strstr(f.p[c].in.p, "\r\nDate: ") : NULL;
        int dd, yy, hh, mi, ss;
        char wd[4], mo[4];
        snprintf(m, sizeof(m), "%s: Date is an IMF-fixdate", piece_name(pieces[k]));
        ok(d &&
               sscanf(d, "\r\nDate: %3[A-Za-z], %2d %3[A-Za-z] %4d %2d:%2d:%2d GMT", wd, &dd, mo,
                      &yy, &hh, &mi, &ss) == 7 &&
               strstr(d + 2, "GMT\r\n") == d + 2 + 32,
           m);
        snprintf(m, sizeof(m), "%s: kept open", piece_name(pieces[k]));
        ok(!f.p[c].eof, m);
        is_str(f.t.log.p, "req 0 GET /a?b=c\ncomplete 0\nclose 0\n",
               "hooks: request, complete, close");
        struct http_server_stats st;
        http_server_stats(f.s, &st);
        is_int(st.accepted, 1, "stats: accepted");
        is_int(st.open, 1, "stats: open");
        is_int(st.requests, 1, "stats: requests");
        sb_free(&w);
        fx_fini(&f);
    }
}

static void
test_head(void)
{
    struct fx f;
    fx_init(&f, NULL);
    int c = fx_connect(&f);
    send_str(&f, c, "HEAD /h HTTP/1.1\r\nHost: h\r\n\r\nGET /g HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    struct sbuf w = {0};
    /* HEAD: the Content-Length a GET would have, no body (RFC 9110 9.3.2) */
    sb_str(&w, "HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n");
    want_echo(&w, "HTTP/1.1", NULL, "GET", "/g", "h", NULL, "", 0);
    is_got(&f, c, w.p, "HEAD answered without a body, then the next request");
    sb_free(&w);
    fx_fini(&f);
}

static void
test_keepalive(void)
{
    for (size_t k = 0; k < KWC_ARRAY_LEN(pieces); k++) {
        struct fx f;
        fx_init(&f, NULL);
        int c = fx_connect(&f);
        struct sbuf w = {0};
        send_str(&f, c, "GET /1 HTTP/1.1\r\nHost: h\r\n\r\n", pieces[k]);
        want_echo(&w, "HTTP/1.1", NULL, "GET", "/1", "h", NULL, "", 0);
        is_got(&f, c, w.p, "first answer");
        send_str(&f, c, "GET /2 HTTP/1.1\r\nHost: h\r\n\r\n", pieces[k]);
        want_echo(&w, "HTTP/1.1", NULL, "GET", "/2", "h", NULL, "", 0);
        is_got(&f, c, w.p, "second answer on the same connection");
        ok(!f.p[c].eof, "still open");
        sb_free(&w);
        fx_fini(&f);
    }
}

static void
test_http10(void)
{
    for (size_t k = 0; k < KWC_ARRAY_LEN(pieces); k++) {
        struct fx f;
        struct sbuf w = {0};
        fx_init(&f, NULL);
        /* 1.0 without keep-alive: answered "Connection: close", then EOF */
        int c = fx_connect(&f);
        send_str(&f, c, "GET /a HTTP/1.0\r\n\r\n", pieces[k]);
        want_echo(&w, "HTTP/1.0", "close", "GET", "/a", NULL, NULL, "", 0);
        is_got(&f, c, w.p, "HTTP/1.0: Connection: close");
        ok(f.p[c].eof, "HTTP/1.0: the connection closes");

        /* 1.0 with keep-alive: stays open, a second request works */
        int d = fx_connect(&f);
        sb_reset(&w);
        send_str(&f, d, "GET /b HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", pieces[k]);
        want_echo(&w, "HTTP/1.0", "keep-alive", "GET", "/b", NULL, NULL, "", 0);
        is_got(&f, d, w.p, "HTTP/1.0 keep-alive: Connection: keep-alive");
        ok(!f.p[d].eof, "HTTP/1.0 keep-alive: open");
        send_str(&f, d, "GET /c HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", pieces[k]);
        want_echo(&w, "HTTP/1.0", "keep-alive", "GET", "/c", NULL, NULL, "", 0);
        is_got(&f, d, w.p, "HTTP/1.0 keep-alive: second answer");

        /* 1.1 with Connection: close */
        int e = fx_connect(&f);
        sb_reset(&w);
        send_str(&f, e, "GET /d HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", pieces[k]);
        want_echo(&w, "HTTP/1.1", "close", "GET", "/d", "h", NULL, "", 0);
        is_got(&f, e, w.p, "HTTP/1.1 Connection: close: answered with Connection: close");
        ok(f.p[e].eof, "HTTP/1.1 Connection: close: the connection closes");

        /* 1.0: a streamed body is close-delimited, never chunked */
        int g = fx_connect(&f);
        send_str(&f, g, "GET /stream HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", pieces[k]);
        struct treq *q = f.t.reqs[f.t.nreq - 1];
        ok(q && q->stream, "HTTP/1.0 stream: in progress");
        if (q) {
            hresp_write(q->r, "ccc", 3);
            hresp_end(q->r);
        }
        run(&f);
        is_got(&f, g, "HTTP/1.0 200 OK\r\nConnection: close\r\n\r\nabbccc",
               "HTTP/1.0 stream: close-delimited");
        ok(f.p[g].eof, "HTTP/1.0 stream: the close ends it");
        sb_free(&w);
        fx_fini(&f);
    }
}

/* n requests in one write, the middle one streamed and finished later. */
static void
pipeline(size_t n, size_t piece)
{
    char m[160];
    struct fx f;
    fx_init(&f, NULL);
    int c = fx_connect(&f);
    struct sbuf req = {0}, w = {0};
    size_t slow = n / 2;
    for (size_t i = 0; i < n; i++) {
        if (i == slow)
            sb_str(&req, "GET /stream HTTP/1.1\r\nHost: h\r\n\r\n");
        else
            sb_addf(&req, "GET /r%zu HTTP/1.1\r\nHost: h\r\nX-Echo: %zu\r\n\r\n", i, i);
    }
    /* the answers before the slow one, and its beginning */
    for (size_t i = 0; i < slow; i++) {
        char t[32], x[32];
        snprintf(t, sizeof(t), "/r%zu", i);
        snprintf(x, sizeof(x), "%zu", i);
        want_echo(&w, "HTTP/1.1", NULL, "GET", t, "h", x, "", 0);
    }
    sb_str(&w, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n2\r\nbb\r\n");
    send_bytes(&f, c, req.p, req.n, piece);
    snprintf(m, sizeof(m), "%zu pipelined, %s: answered in order up to the slow one", n,
             piece_name(piece));
    is_got(&f, c, w.p, m);
    snprintf(m, sizeof(m), "%zu pipelined, %s: nothing after the slow one is dispatched", n,
             piece_name(piece));
    is_int(f.t.nreq, slow + 1, m);
    /* finished from a later loop turn */
    struct treq *q = f.t.reqs[slow];
    if (q) {
        hresp_write(q->r, "ccc", 3);
        hresp_end(q->r);
    }
    run(&f);
    sb_str(&w, "3\r\nccc\r\n0\r\n\r\n");
    for (size_t i = slow + 1; i < n; i++) {
        char t[32], x[32];
        snprintf(t, sizeof(t), "/r%zu", i);
        snprintf(x, sizeof(x), "%zu", i);
        want_echo(&w, "HTTP/1.1", NULL, "GET", t, "h", x, "", 0);
    }
    snprintf(m, sizeof(m), "%zu pipelined, %s: every answer, in order, complete", n,
             piece_name(piece));
    is_got(&f, c, w.p, m);
    snprintf(m, sizeof(m), "%zu pipelined, %s: every request handled", n, piece_name(piece));
    is_int(f.t.nreq, n, m);
    ok(!f.p[c].eof, "still open");
    sb_free(&req);
    sb_free(&w);
    fx_fini(&f);
}

static void
test_pipelining(void)
{
    pipeline(3, 0);
    pipeline(3, 1);
    pipeline(50, 0);
    pipeline(50, 7);
}

static void
test_bodies(void)
{
    static const struct {
        const char *what, *req, *body;
    } cases[] = {
        {"Content-Length", "POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\nhello world",
         "hello world"},
        {"chunked",
         "POST /p HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
         "5\r\nhello\r\n1;ext=1\r\n \r\nA\r\n0123456789\r\n0\r\n\r\n",
         "hello 0123456789"},
        {"chunked with a trailer",
         "POST /p HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
         "3\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n",
         "abc"},
        {"Content-Length: 0", "POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n", ""},
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(cases); i++) {
        for (size_t k = 0; k < KWC_ARRAY_LEN(pieces); k++) {
            char m[160];
            struct fx f;
            fx_init(&f, NULL);
            int c = fx_connect(&f);
            /* the request twice: the connection is reusable after a body */
            struct sbuf req = {0}, w = {0};
            sb_str(&req, cases[i].req);
            sb_str(&req, cases[i].req);
            send_bytes(&f, c, req.p, req.n, pieces[k]);
            want_echo(&w, "HTTP/1.1", NULL, "POST", "/p", "h", NULL, cases[i].body,
                      strlen(cases[i].body));
            want_echo(&w, "HTTP/1.1", NULL, "POST", "/p", "h", NULL, cases[i].body,
                      strlen(cases[i].body));
            snprintf(m, sizeof(m), "%s, %s: the body delivered exactly, twice", cases[i].what,
                     piece_name(pieces[k]));
            is_got(&f, c, w.p, m);
            snprintf(m, sizeof(m), "%s, %s: on_complete once per request", cases[i].what,
                     piece_name(pieces[k]));
            is_int(f.t.ncomplete, 2, m);
            sb_free(&req);
            sb_free(&w);
            fx_fini(&f);
        }
    }

    /* a body of 200 KB in pieces of 1000 bytes: nothing lost or repeated */
    struct fx f;
    fx_init(&f, NULL);
    int c = fx_connect(&f);
    size_t bl = 200 * 1024;
    char *body = xmalloc(bl);
    for (size_t i = 0; i < bl; i++)
        body[i] = (char)('a' + (i * 7 + i / 251) % 26);
    struct sbuf req = {0}, w = {0};
    sb_addf(&req, "PUT /big HTTP/1.1\r\nHost: h\r\nContent-Length: %zu\r\n\r\n", bl);
    sb_add(&req, body, bl);
    send_bytes(&f, c, req.p, req.n, 1000);
    want_echo(&w, "HTTP/1.1", NULL, "PUT", "/big", "h", NULL, body, bl);
    is_got(&f, c, w.p, "200 KB body in 1000-byte writes: echoed exactly");
    is_int(f.t.ncomplete, 1, "200 KB body: on_complete once");
    free(body);
    sb_free(&req);
    sb_free(&w);
    fx_fini(&f);
}

static void
test_expect_continue(void)
{
    for (size_t k = 0; k < KWC_ARRAY_LEN(pieces); k++) {
        struct fx f;
        fx_init(&f, NULL);
        int c = fx_connect(&f);
        send_str(&f, c,
                 "POST /defer HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n"
                 "Content-Length: 4\r\n\r\n",
                 pieces[k]);
        ok(f.p[c].in.n == 0, "no 100 Continue before the handler reads");
        struct treq *q = f.t.reqs[0];
        ok(q != NULL, "the request is in progress");
        if (!q) {
            fx_fini(&f);
            continue;
        }
        hreq_body_read(q->r, true);
        run(&f);
        is_got(&f, c, "HTTP/1.1 100 Continue\r\n\r\n", "100 Continue when reading starts");
        send_str(&f, c, "abcd", pieces[k]);
        struct sbuf w = {0};
        sb_str(&w, "HTTP/1.1 100 Continue\r\n\r\n");
        want_echo(&w, "HTTP/1.1", NULL, "POST", "/defer", "h", NULL, "abcd", 4);
        is_got(&f, c, w.p, "then the final response, once");
        ok(!f.p[c].eof, "kept open");
        sb_free(&w);
        fx_fini(&f);
    }

    /* answered without reading: no 100 Continue, Connection: close */
    struct fx f;
    fx_init(&f, NULL);
    int c = fx_connect(&f);
    send_str(&f, c,
             "POST /early HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n",
             0);
    is_got(&f, c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nearly",
           "answered before reading: no 100 Continue, Connection: close");
    ok(f.p[c].eof, "answered before reading: closed");
    fx_fini(&f);
}

static void
test_early_answer(void)
{
    /* Answered from on_request while the body is still coming: the response
     * is complete, and the rest of the body is never parsed as a request. */
    for (size_t k = 0; k < KWC_ARRAY_LEN(pieces); k++) {
        struct fx f;
        fx_init(&f, NULL);
        int c = fx_connect(&f);
        send_str(&f, c, "POST /early HTTP/1.1\r\nHost: h\r\nContent-Length: 40\r\n\r\n", pieces[k]);
        send_str(&f, c, "GET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n", pieces[k]);
        struct resp r;
        resp_parse(f.p[c].in.p ? f.p[c].in.p : "", f.p[c].in.n, f.p[c].eof, false, &r);
        ok(r.complete && r.status == 200 && r.body.n == 5 && memcmp(r.body.p, "early", 5) == 0,
           "the early answer");
        ok(r.head.p && strstr(r.head.p, "Connection: close\r\n"),
           "the early answer says Connection: close (it closes after)");
        is_int(r.raw_len, f.p[c].in.n, "nothing after it");
        ok(f.p[c].eof, "the connection closes");
        is_int(f.t.nreq, 1, "the body bytes were not a request");
        resp_free(&r);
        fx_fini(&f);
    }
}

struct reject_case {
    const char *what, *req;
    size_t len;
    int code;
};

/* A string literal and its length (some hold a NUL). */
#define REQ(lit) lit, sizeof(lit) - 1

static void
rejects(const struct reject_case *cases, size_t n, const struct http_server_options *o)
{
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < KWC_ARRAY_LEN(pieces); k++) {
            char m[200];
            struct fx f;
            fx_init(&f, o);
            int c = fx_connect(&f);
            /* a pipelined request after the bad one is never answered */
            struct sbuf req = {0};
            sb_add(&req, cases[i].req, cases[i].len);
            sb_str(&req, "GET /after HTTP/1.1\r\nHost: h\r\n\r\n");
            send_bytes(&f, c, req.p, req.n, pieces[k]);
            if (!f.p[c].eof)
                run_until_eof(&f, c);
            snprintf(m, sizeof(m), "%s (%s)", cases[i].what, piece_name(pieces[k]));
            is_status_answer(&f, c, cases[i].code, m);
            snprintf(m, sizeof(m), "%s (%s): the handler never saw it", cases[i].what,
                     piece_name(pieces[k]));
            is_int(f.t.nreq, 0, m);
            struct http_server_stats st;
            http_server_stats(f.s, &st);
            snprintf(m, sizeof(m), "%s (%s): counted as a bad request", cases[i].what,
                     piece_name(pieces[k]));
            is_int(st.bad_requests, 1, m);
            sb_free(&req);
            fx_fini(&f);
        }
    }
}

static void
test_framing_errors(void)
{
    static const struct reject_case cases[] = {
        {"Transfer-Encoding with Content-Length",
         REQ("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"
             "0\r\n\r\n"),
         400},
        {"Content-Length with Transfer-Encoding",
         REQ("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
             "0\r\n\r\n"),
         400},
        {"two different Content-Lengths",
         REQ("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"),
         400},
        {"a Content-Length list",
         REQ("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 6\r\n\r\nhello!"), 400},
        {"a negative Content-Length",
         REQ("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n"), 400},
        {"Transfer-Encoding: gzip",
         REQ("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n"), 501},
        {"Transfer-Encoding: gzip, chunked",
         REQ("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"),
         501},
        {"Transfer-Encoding: gzip with Content-Length",
         REQ("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\nContent-Length: 1\r\n\r\nx"),
         400},
        {"NUL in the target", REQ("GET /a\0b HTTP/1.1\r\nHost: h\r\n\r\n"), 400},
        {"\\x01 in the target",
         REQ("GET /a\x01"
             "b HTTP/1.1\r\nHost: h\r\n\r\n"),
         400},
        {"\\x7f in the target",
         REQ("GET /a\x7f"
             "b HTTP/1.1\r\nHost: h\r\n\r\n"),
         400},
        {"TAB in the target", REQ("GET /a\tb HTTP/1.1\r\nHost: h\r\n\r\n"), 400},
        {"space in the target", REQ("GET /a b HTTP/1.1\r\nHost: h\r\n\r\n"), 400},
        {"a request line without a version", REQ("GET /\r\n\r\n"), 400},
        {"HTTP/2.0", REQ("GET / HTTP/2.0\r\nHost: h\r\n\r\n"), 505},
        {"HTTP/3.0", REQ("GET / HTTP/3.0\r\nHost: h\r\n\r\n"), 505},
        {"HTTP/1.1 without Host", REQ("GET / HTTP/1.1\r\nX-Echo: 1\r\n\r\n"), 400},
        {"two Host headers", REQ("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400},
        {"a header name with a space", REQ("GET / HTTP/1.1\r\nHost: h\r\nBad Name: v\r\n\r\n"),
         400},
        {"a space before the colon", REQ("GET / HTTP/1.1\r\nHost: h\r\nX-Echo : v\r\n\r\n"), 400},
        {"an empty header name", REQ("GET / HTTP/1.1\r\nHost: h\r\n: v\r\n\r\n"), 400},
        {"a control byte in a header value",
         REQ("GET / HTTP/1.1\r\nHost: h\r\nX-Echo: a\x01"
             "b\r\n\r\n"),
         400},
        {"an unknown method", REQ("FROB / HTTP/1.1\r\nHost: h\r\n\r\n"), 400},
        {"an unsupported Expect", REQ("GET / HTTP/1.1\r\nHost: h\r\nExpect: 200-ok\r\n\r\n"), 417},
    };
    rejects(cases, KWC_ARRAY_LEN(cases), NULL);
}

/* Header values as Go's net/textproto reads them (kube's view of a request):
 * leading and trailing spaces and tabs trimmed, each obs-fold replaced by one
 * space between the trimmed lines; whether the bytes arrive at once or one by
 * one (the fold then straddles reads). */
static void
test_obs_fold(void)
{
    static const struct {
        const char *wire, *value;
    } cases[] = {
        {"X-Echo: a\r\n b\r\n", "a b"},     {"X-Echo:  a \t\r\n \t b  c \r\n\t d\r\n", "a b  c d"},
        {"X-Echo:\r\n  b\r\n", "b"},        {"X-Echo: a   \r\n", "a"},
        {"X-Echo: \t a\tb \t\r\n", "a\tb"}, {"X-Echo: a\r\n \r\n b\r\n", "a b"},
        {"X-Echo: x  y\r\n", "x  y"},
    };
    for (size_t k = 0; k < KWC_ARRAY_LEN(pieces); k++) {
        for (size_t i = 0; i < KWC_ARRAY_LEN(cases); i++) {
            struct fx f;
            fx_init(&f, NULL);
            int c = fx_connect(&f);
            char wire[256];
            snprintf(wire, sizeof(wire), "GET /f HTTP/1.1\r\nHost: h\r\n%s\r\n", cases[i].wire);
            send_str(&f, c, wire, pieces[k]);
            struct resp r;
            resp_parse(f.p[c].in.p ? f.p[c].in.p : "", f.p[c].in.n, f.p[c].eof, false, &r);
            is_int(r.status, 200, "obs-fold/trim: answered");
            char want[128];
            snprintf(want, sizeof(want), "x-echo=%s\n", cases[i].value);
            ok(r.body.p && strstr(r.body.p, want), "obs-fold/trim: the value is Go's");
            if (!(r.body.p && strstr(r.body.p, want)))
                fprintf(stderr, "# case %zu %s: want [%s], got [%s]", i, piece_name(pieces[k]),
                        cases[i].value, r.body.p ? r.body.p : "");
            resp_free(&r);
            fx_fini(&f);
        }
    }
}

static void
test_limits(void)
{
    struct http_server_options o = {.max_header_bytes = 8192};
    char m[160];

    /* 9000-byte target: 414; 9000-byte header: 431 (as the first header or
     * after others, in the name or the value) */
    struct sbuf t9 = {0}, h9 = {0}, n9 = {0}, f9 = {0};
    sb_str(&t9, "GET /");
    for (int i = 0; i < 9000; i++)
        sb_add(&t9, "t", 1);
    sb_str(&t9, " HTTP/1.1\r\nHost: h\r\n\r\n");
    sb_str(&h9, "GET / HTTP/1.1\r\nHost: h\r\nX-Big: ");
    for (int i = 0; i < 9000; i++)
        sb_add(&h9, "v", 1);
    sb_str(&h9, "\r\n\r\n");
    sb_str(&n9, "GET / HTTP/1.1\r\nX-");
    for (int i = 0; i < 9000; i++)
        sb_add(&n9, "n", 1);
    sb_str(&n9, ": v\r\nHost: h\r\n\r\n");
    sb_str(&f9, "GET / HTTP/1.1\r\nX-Big: ");
    for (int i = 0; i < 9000; i++)
        sb_add(&f9, "v", 1);
    sb_str(&f9, "\r\nHost: h\r\n\r\n");
    const struct reject_case cases[] = {
        {"9000-byte target", t9.p, t9.n, 414},
        {"9000-byte header value", h9.p, h9.n, 431},
        {"9000-byte first header name", n9.p, n9.n, 431},
        {"9000-byte first header value", f9.p, f9.n, 431},
    };
    rejects(cases, KWC_ARRAY_LEN(cases), &o);

    /* a target that fits, then a header name that does not: 431, wherever
     * the reads split the head (at 5000 bytes, the overflow is found in the
     * same read as the target's end) */
    struct http_server_options o5 = {.max_header_bytes = 5000};
    struct sbuf tn = {0}, t6 = {0};
    sb_str(&tn, "GET /");
    sb_str(&t6, "GET /");
    for (int i = 0; i < 4500; i++)
        sb_add(&tn, "t", 1);
    for (int i = 0; i < 6000; i++)
        sb_add(&t6, "t", 1);
    sb_str(&tn, " HTTP/1.1\r\nX-");
    for (int i = 0; i < 6000; i++)
        sb_add(&tn, "n", 1);
    sb_str(&tn, ": v\r\nHost: h\r\n\r\n");
    sb_str(&t6, " HTTP/1.1\r\nHost: h\r\n\r\n");
    const struct reject_case cases5[] = {
        {"4500-byte target, 6000-byte header name (max 5000)", tn.p, tn.n, 431},
        {"6000-byte target (max 5000)", t6.p, t6.n, 414},
    };
    rejects(cases5, KWC_ARRAY_LEN(cases5), &o5);
    sb_free(&tn);
    sb_free(&t6);
    sb_free(&t9);
    sb_free(&h9);
    sb_free(&n9);
    sb_free(&f9);

    /* a head of exactly 8000 bytes: accepted, the target intact */
    for (size_t k = 0; k < KWC_ARRAY_LEN(pieces); k++) {
        struct fx f;
        fx_init(&f, &o);
        int c = fx_connect(&f);
        static const char pre[] = "GET /", post[] = " HTTP/1.1\r\nHost: h\r\n\r\n";
        size_t tl = 8000 - (sizeof(pre) - 1) - (sizeof(post) - 1);
        struct sbuf req = {0}, target = {0}, w = {0};
        sb_str(&target, "/");
        for (size_t i = 0; i < tl; i++)
            sb_add(&target, &"0123456789abcdefghijklmnopqrstuvwxyz"[(i * 7) % 36], 1);
        sb_str(&req, "GET ");
        sb_add(&req, target.p, target.n);
        sb_str(&req, post);
        is_int(req.n, 8000, "the head is 8000 bytes");
        send_bytes(&f, c, req.p, req.n, pieces[k]);
        want_echo(&w, "HTTP/1.1", NULL, "GET", target.p, "h", NULL, "", 0);
        snprintf(m, sizeof(m), "8000-byte head, %s: accepted, the target byte-identical",
                 piece_name(pieces[k]));
        is_got(&f, c, w.p, m);
        sb_free(&req);
        sb_free(&target);
        sb_free(&w);
        fx_fini(&f);
    }

    /* a 100 KB target at the default limit: delivered intact */
    for (size_t piece = 0; piece <= 1000; piece += 1000) {
        struct fx f;
        fx_init(&f, NULL);
        int c = fx_connect(&f);
        struct sbuf req = {0}, target = {0}, w = {0};
        sb_str(&target, "/api/v1/pods?labelSelector=");
        while (target.n < 100 * 1024)
            sb_addf(&target, "k%zu%%3Dv,", target.n);
        sb_str(&req, "GET ");
        sb_add(&req, target.p, target.n);
        sb_str(&req, " HTTP/1.1\r\nHost: h\r\n\r\n");
        send_bytes(&f, c, req.p, req.n, piece);
        want_echo(&w, "HTTP/1.1", NULL, "GET", target.p, "h", NULL, "", 0);
        snprintf(m, sizeof(m), "100 KB target, %s: delivered intact",
                 piece ? "1000-byte writes" : "one write");
        is_got(&f, c, w.p, m);
        sb_free(&req);
        sb_free(&target);
        sb_free(&w);
        fx_fini(&f);
    }
}

static void
test_timeouts(void)
{
    struct http_server_stats st;

    /* a partial head: closed by the head timeout, nothing answered */
    {
        struct http_server_options o = {.request_header_timeout_ms = 50, .idle_timeout_ms = 50};
        struct fx f;
        fx_init(&f, &o);
        int c = fx_connect(&f);
        send_str(&f, c, "GET / HTTP/1.1\r\nHo", 1);
        ok(!f.p[c].eof, "partial head: open at first");
        ok(run_until_eof(&f, c), "partial head: closed by the server");
        is_int(f.p[c].in.n, 0, "partial head: no answer");
        http_server_stats(f.s, &st);
        is_int(st.header_timeouts, 1, "partial head: a header timeout");
        is_int(st.idle_timeouts, 0, "partial head: no idle timeout");
        is_int(st.open, 0, "partial head: not open any more");
        fx_fini(&f);
    }
    /* a connection that never sends: the head timeout too */
    {
        struct http_server_options o = {.request_header_timeout_ms = 50};
        struct fx f;
        fx_init(&f, &o);
        int c = fx_connect(&f);
        ok(run_until_eof(&f, c), "silent connection: closed");
        http_server_stats(f.s, &st);
        is_int(st.header_timeouts, 1, "silent connection: a header timeout");
        fx_fini(&f);
    }
    /* an idle kept-alive connection: the idle timeout */
    {
        struct http_server_options o = {.idle_timeout_ms = 50};
        struct fx f;
        fx_init(&f, &o);
        int c = fx_connect(&f);
        send_str(&f, c, "GET / HTTP/1.1\r\nHost: h\r\n\r\n", 0);
        ok(f.p[c].in.n > 0 && !f.p[c].eof, "idle: answered, open");
        ok(run_until_eof(&f, c), "idle: closed by the server");
        http_server_stats(f.s, &st);
        is_int(st.idle_timeouts, 1, "idle: an idle timeout");
        is_int(st.header_timeouts, 0, "idle: no header timeout");
        fx_fini(&f);
    }
    /* a pipelined head left partial after an answer: the head timeout
     * (its first byte came in), even with no idle timeout */
    {
        struct http_server_options o = {.request_header_timeout_ms = 50};
        struct fx f;
        fx_init(&f, &o);
        int c = fx_connect(&f);
        send_str(&f, c, "GET /a HTTP/1.1\r\nHost: h\r\n\r\nGET /b HTTP/1.1\r\nHo", 0);
        is_int(f.t.nreq, 1, "pipelined partial head: the first answered");
        ok(run_until_eof(&f, c), "pipelined partial head: closed by the server");
        http_server_stats(f.s, &st);
        is_int(st.header_timeouts, 1, "pipelined partial head: a header timeout");
        fx_fini(&f);
    }
    /* a request in progress is not idle: b has a streamed response open
     * before a's idle timer starts; when a is closed, b is still open */
    {
        struct http_server_options o = {.request_header_timeout_ms = 50, .idle_timeout_ms = 50};
        struct fx f;
        fx_init(&f, &o);
        int b = fx_connect(&f);
        send_str(&f, b, "GET /stream HTTP/1.1\r\nHost: h\r\n\r\n", 0);
        int a = fx_connect(&f);
        send_str(&f, a, "GET / HTTP/1.1\r\nHost: h\r\n\r\n", 0);
        ok(run_until_eof(&f, a), "in progress: the idle one closed");
        ok(!f.p[b].eof, "in progress: the busy one still open");
        http_server_stats(f.s, &st);
        is_int(st.idle_timeouts, 1, "in progress: one idle timeout");
        is_int(st.header_timeouts, 0, "in progress: no header timeout");
        struct treq *q = f.t.reqs[0];
        ok(q && q->stream, "in progress: the stream is there");
        if (q) {
            hresp_write(q->r, "ccc", 3);
            hresp_end(q->r);
        }
        run(&f);
        is_got(&f, b,
               "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n2\r\nbb\r\n"
               "3\r\nccc\r\n0\r\n\r\n",
               "in progress: the stream complete");
        ok(run_until_eof(&f, b), "in progress: idle after its end, then closed");
        http_server_stats(f.s, &st);
        is_int(st.idle_timeouts, 2, "in progress: then an idle timeout");
        fx_fini(&f);
    }
}

static void
test_max_connections(void)
{
    struct http_server_options o = {.max_connections = 2};
    struct fx f;
    fx_init(&f, &o);
    int a = fx_connect(&f), b = fx_connect(&f), c = fx_connect(&f);
    run(&f);
    ok(f.p[c].eof, "the third: closed");
    ok(f.p[c].in.p && strncmp(f.p[c].in.p, "HTTP/1.1 429 ", 13) == 0, "the third: HTTP/1.1 429");
    struct resp r;
    resp_parse(f.p[c].in.p ? f.p[c].in.p : "", f.p[c].in.n, true, false, &r);
    char v[64];
    is_str(resp_header(&r, "Retry-After", v, sizeof(v)), "1", "the third: Retry-After: 1");
    resp_free(&r);
    is_status_answer(&f, c, 429, "the third");
    ok(!f.p[a].eof && !f.p[b].eof, "the first two: open");
    struct http_server_stats st;
    http_server_stats(f.s, &st);
    is_int(st.refused, 1, "stats: refused");
    is_int(st.accepted, 3, "stats: accepted");
    is_int(st.open, 2, "stats: open");
    send_str(&f, b, "GET / HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    ok(f.p[b].in.n > 0 && strncmp(f.p[b].in.p, "HTTP/1.1 200 ", 13) == 0, "the second: served");
    /* a closes: room for another */
    fx_hangup(&f, a);
    run(&f);
    int d = fx_connect(&f);
    send_str(&f, d, "GET / HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    ok(f.p[d].in.n > 0 && strncmp(f.p[d].in.p, "HTTP/1.1 200 ", 13) == 0,
       "after a close: a new one is served");
    http_server_stats(f.s, &st);
    is_int(st.refused, 1, "stats: still one refused");
    fx_fini(&f);
}

static struct sockaddr_in
addr4(const char *ip, int port)
{
    struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, ip, &in.sin_addr);
    return in;
}

static bool
refused_429(struct fx *f, int i)
{
    return f->p[i].eof && f->p[i].in.n > 13 && strncmp(f->p[i].in.p, "HTTP/1.1 429 ", 13) == 0;
}

/* Serving loops (app.c): an accepting server takes the caps' counts and
 * hands each connection it does not refuse to another server sharing its
 * limits, which serves it and gives the counts back when it closes. */
struct handto {
    struct http_server *to;
    int handed;
};

static void
hand(void *arg, int fd, const struct sockaddr *sa, socklen_t salen, bool src_counted)
{
    struct handto *h = arg;
    h->handed++;
    http_server_adopt_counted(h->to, fd, sa, salen, src_counted);
}

static int
accept_from(struct fx *f, struct http_server *acc, const struct sockaddr *sa, socklen_t len)
{
    int sv[2];
    if (f->np == MAX_PEERS ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
        abort();
    f->p[f->np] = (struct peer){.fd = sv[0]};
    http_server_adopt(acc, sv[1], sa, len);
    return f->np++;
}

static void
test_handoff_shared_limits(void)
{
    struct http_limits *lim = http_limits_new();
    struct http_server_options so = {
        .max_connections = 3, .max_connections_per_source = 2, .limits = lim};
    struct fx f;
    fx_init(&f, &so);
    struct handto h = {.to = f.s};
    struct http_server_options ao = so;
    ao.handoff = hand;
    ao.handoff_arg = &h;
    struct http_server *acc = NULL;
    char err[256];
    is_int(http_server_new(f.base, &ao, on_request, &f.t, &acc, err, sizeof(err)), 0,
           "the accepting server");
    struct sockaddr_in a2 = addr4("127.0.0.2", 40000), a3 = addr4("127.0.0.3", 40001);
    int a = accept_from(&f, acc, (struct sockaddr *)&a2, sizeof(a2));
    int b = accept_from(&f, acc, (struct sockaddr *)&a2, sizeof(a2));
    int c = accept_from(&f, acc, (struct sockaddr *)&a2, sizeof(a2));
    int d = accept_from(&f, acc, (struct sockaddr *)&a3, sizeof(a3));
    int e = accept_from(&f, acc, (struct sockaddr *)&a3, sizeof(a3));
    run(&f);
    is_int(h.handed, 3, "three handed over");
    ok(refused_429(&f, c), "127.0.0.2's third: refused by the acceptor (per source)");
    ok(refused_429(&f, e), "the fourth in all: refused by the acceptor (max_connections)");
    send_str(&f, a, "GET / HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    ok(f.p[a].in.n > 13 && strncmp(f.p[a].in.p, "HTTP/1.1 200 ", 13) == 0,
       "a handed connection is served by the other server");
    struct http_server_stats st;
    http_server_stats(f.s, &st);
    is_int(st.open, 3, "the serving server holds the three");
    is_int(st.accepted, 0, "(it accepted none itself)");
    http_server_stats(acc, &st);
    is_int(st.open, 0, "the acceptor holds none");
    is_int(st.refused + st.refused_per_source, 2, "the acceptor counts the refusals");
    is_int(st.sources, 2, "the acceptor reports the shared sources");
    /* closes on the serving side give the counts back to the acceptor */
    fx_hangup(&f, b);
    fx_hangup(&f, d);
    run(&f);
    int g = accept_from(&f, acc, (struct sockaddr *)&a2, sizeof(a2));
    int i = accept_from(&f, acc, (struct sockaddr *)&a3, sizeof(a3));
    run(&f);
    ok(!f.p[g].eof && !f.p[i].eof, "after two closes: two more handed over");
    is_int(h.handed, 5, "five handed over in all");
    http_server_free(acc);
    fx_fini(&f);
    http_limits_free(lim);
}

/* max_connections_per_source: one address past its share is refused like
 * a connection past max_connections, and the other addresses are not; an
 * IPv4-mapped IPv6 peer is its IPv4 address; a peer with no IP address is
 * no source; a close gives the address its room back, and the table
 * forgets an address with nothing open. */
static void
test_max_connections_per_source(void)
{
    struct http_server_options o = {.max_connections = 10, .max_connections_per_source = 2};
    struct fx f;
    fx_init(&f, &o);
    struct sockaddr_in a2 = addr4("127.0.0.2", 40000), a3 = addr4("127.0.0.3", 40001);
    struct sockaddr_in6 m2 = {.sin6_family = AF_INET6, .sin6_port = htons(40002)};
    inet_pton(AF_INET6, "::ffff:127.0.0.2", &m2.sin6_addr);
    int a = fx_connect_from(&f, (struct sockaddr *)&a2, sizeof(a2));
    int b = fx_connect_from(&f, (struct sockaddr *)&m2, sizeof(m2));
    int c = fx_connect_from(&f, (struct sockaddr *)&a2, sizeof(a2));
    int d = fx_connect_from(&f, (struct sockaddr *)&a3, sizeof(a3));
    int e = fx_connect(&f), g = fx_connect(&f), h = fx_connect(&f);
    run(&f);
    ok(!f.p[a].eof && !f.p[b].eof, "127.0.0.2 and ::ffff:127.0.0.2: its two, open");
    ok(refused_429(&f, c), "127.0.0.2's third: HTTP/1.1 429 and closed");
    is_status_answer(&f, c, 429, "127.0.0.2's third");
    ok(!f.p[d].eof, "127.0.0.3: open (another source)");
    ok(!f.p[e].eof && !f.p[g].eof && !f.p[h].eof, "no address: no source, no limit");
    struct http_server_stats st;
    http_server_stats(f.s, &st);
    is_int(st.refused_per_source, 1, "stats: one refused for its source");
    is_int(st.refused, 0, "stats: none past max_connections");
    is_int(st.sources, 2, "stats: two sources counted");
    send_str(&f, d, "GET / HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    ok(f.p[d].in.n > 13 && strncmp(f.p[d].in.p, "HTTP/1.1 200 ", 13) == 0, "127.0.0.3: served");
    fx_hangup(&f, a);
    run(&f);
    http_server_stats(f.s, &st);
    int i = fx_connect_from(&f, (struct sockaddr *)&a2, sizeof(a2));
    send_str(&f, i, "GET / HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    ok(f.p[i].in.n > 13 && strncmp(f.p[i].in.p, "HTTP/1.1 200 ", 13) == 0,
       "127.0.0.2 after one of its own closed: served");
    fx_hangup(&f, b);
    fx_hangup(&f, d);
    fx_hangup(&f, i);
    run(&f);
    http_server_stats(f.s, &st);
    is_int(st.sources, 0, "every source's connections closed: none counted");
    fx_fini(&f);
}

/* The handler is set after the stages waited: it still hears that a
 * request without a body is complete, and a held body reaches it whole. */
static void
test_late_handler(void)
{
    struct fx f;
    fx_init(&f, NULL);
    int c = fx_connect(&f);
    send_str(&f, c, "GET /park HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    run(&f);
    struct treq *q = f.t.reqs[0];
    ok(q != NULL, "parked GET: the request is there");
    is_int(f.p[c].in.n, 0, "parked GET: no answer yet");
    if (q) {
        q->echo = true;
        hreq_set_handler(q->r, &hooks, q);
        run(&f);
    }
    is_int(f.t.ncomplete, 1, "parked GET: the late handler heard it complete");
    struct sbuf w = {0};
    want_echo(&w, "HTTP/1.1", NULL, "GET", "/park", "h", NULL, "", 0);
    is_got(&f, c, w.p, "parked GET: answered by the late handler");
    sb_free(&w);
    fx_fini(&f);

    for (size_t k = 0; k < KWC_ARRAY_LEN(pieces); k++) {
        fx_init(&f, NULL);
        c = fx_connect(&f);
        send_str(&f, c, "POST /park HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\nhello world",
                 pieces[k]);
        run(&f);
        q = f.t.reqs[0];
        ok(q != NULL, "parked POST: the request is there");
        is_int(f.t.ncomplete, 0, "parked POST: the held body is not discarded (not complete)");
        if (q) {
            q->echo = true;
            hreq_set_handler(q->r, &hooks, q);
            hreq_body_read(q->r, true);
            run(&f);
        }
        w = (struct sbuf){0};
        want_echo(&w, "HTTP/1.1", NULL, "POST", "/park", "h", NULL, "hello world", 11);
        is_got(&f, c, w.p, "parked POST: the late handler read the whole body");
        sb_free(&w);
        fx_fini(&f);
    }

    /* a late handler that does not read: the body is discarded, then complete */
    fx_init(&f, NULL);
    c = fx_connect(&f);
    send_str(&f, c, "POST /park HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nabcde", 0);
    run(&f);
    q = f.t.reqs[0];
    if (q) {
        q->echo = true;
        hreq_set_handler(q->r, &hooks, q);
        run(&f);
    }
    is_int(f.t.ncomplete, 1, "late handler without reading: complete after the discard");
    w = (struct sbuf){0};
    want_echo(&w, "HTTP/1.1", NULL, "POST", "/park", "h", NULL, "", 0);
    is_got(&f, c, w.p, "late handler without reading: answered");
    sb_free(&w);
    fx_fini(&f);
}

static void
test_body_flow_control(void)
{
    /* reading off inside the first on_body: nothing more until it is on */
    for (size_t k = 0; k < KWC_ARRAY_LEN(pieces); k++) {
        struct fx f;
        fx_init(&f, NULL);
        int c = fx_connect(&f);
        send_str(&f, c, "POST /pause HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n", 0);
        send_str(&f, c, "01234", 0);
        send_str(&f, c, "56789", pieces[k]);
        struct treq *q = f.t.reqs[0];
        ok(q && q->body.n == 5, "paused: only the first on_body's bytes");
        is_int(f.t.ncomplete, 0, "paused: not complete");
        is_int(f.p[c].in.n, 0, "paused: no answer yet");
        if (q) {
            hreq_body_read(q->r, true);
            run(&f);
        }
        struct sbuf w = {0};
        want_echo(&w, "HTTP/1.1", NULL, "POST", "/pause", "h", NULL, "0123456789", 10);
        is_got(&f, c, w.p, "resumed: the whole body, once, in order");
        is_int(f.t.ncomplete, 1, "resumed: complete once");
        sb_free(&w);
        fx_fini(&f);
    }

    /* reading off from outside the hooks (a consumer's buffer filled up):
     * the same, bytes held and not dropped */
    for (size_t k = 0; k < KWC_ARRAY_LEN(pieces); k++) {
        struct fx f;
        fx_init(&f, NULL);
        int c = fx_connect(&f);
        send_str(&f, c, "POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n0123", 0);
        struct treq *q = f.t.reqs[0];
        ok(q && q->body.n == 4, "off later: the first bytes");
        if (!q) {
            fx_fini(&f);
            continue;
        }
        hreq_body_read(q->r, false);
        send_str(&f, c, "456789", pieces[k]);
        q = f.t.reqs[0];
        ok(q && q->body.n == 4, "off later: no more bytes while off");
        is_int(f.t.ncomplete, 0, "off later: not complete");
        if (q)
            hreq_body_read(q->r, true);
        run(&f);
        struct sbuf w = {0};
        want_echo(&w, "HTTP/1.1", NULL, "POST", "/p", "h", NULL, "0123456789", 10);
        is_got(&f, c, w.p, "off later, on again: the whole body");
        sb_free(&w);
        fx_fini(&f);
    }

    /* a body never read: discarded up to max_discard_bytes, then on_complete
     * (and the connection is reusable); past it, the connection closes */
    struct http_server_options o = {.max_discard_bytes = 100};
    for (size_t k = 0; k < KWC_ARRAY_LEN(pieces); k++) {
        struct fx f;
        fx_init(&f, &o);
        int c = fx_connect(&f);
        struct sbuf req = {0}, w = {0};
        sb_str(&req, "POST /noread HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\n");
        for (int i = 0; i < 100; i++)
            sb_add(&req, "x", 1);
        sb_str(&req, "GET /next HTTP/1.1\r\nHost: h\r\n\r\n");
        send_bytes(&f, c, req.p, req.n, pieces[k]);
        want_echo(&w, "HTTP/1.1", NULL, "POST", "/noread", "h", NULL, "", 0);
        want_echo(&w, "HTTP/1.1", NULL, "GET", "/next", "h", NULL, "", 0);
        is_got(&f, c, w.p, "100 unread bytes: discarded, answered, the next request too");
        ok(!f.p[c].eof, "100 unread bytes: open");

        int d = fx_connect(&f);
        sb_reset(&req);
        sb_str(&req, "POST /noread HTTP/1.1\r\nHost: h\r\nContent-Length: 1000\r\n\r\n");
        for (int i = 0; i < 1000; i++)
            sb_add(&req, "x", 1);
        send_bytes(&f, d, req.p, req.n, pieces[k]);
        if (!f.p[d].eof)
            run_until_eof(&f, d);
        ok(f.p[d].eof, "1000 unread bytes: the connection closes");
        is_int(f.p[d].in.n, 0, "1000 unread bytes: no answer");
        is_int(f.t.ncomplete, 2, "1000 unread bytes: never complete");
        is_int(f.t.nclose, 3, "1000 unread bytes: on_close ran");
        sb_free(&req);
        sb_free(&w);
        fx_fini(&f);
    }
}

static void
test_abort_and_end(void)
{
    for (size_t k = 0; k < KWC_ARRAY_LEN(pieces); k++) {
        struct fx f;
        fx_init(&f, NULL);
        int c = fx_connect(&f);
        send_str(&f, c, "GET /stream HTTP/1.1\r\nHost: h\r\n\r\n", pieces[k]);
        struct treq *q = f.t.reqs[0];
        is_got(&f, c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n2\r\nbb\r\n",
               "streamed: the head and two chunks");
        if (q)
            hresp_abort(q->r);
        run(&f);
        is_got(&f, c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n2\r\nbb\r\n",
               "aborted: no terminal chunk");
        ok(f.p[c].eof, "aborted: closed");
        is_int(f.t.nclose, 1, "aborted: on_close ran");

        int d = fx_connect(&f);
        send_str(&f, d, "GET /stream HTTP/1.1\r\nHost: h\r\n\r\n", pieces[k]);
        q = f.t.reqs[1];
        if (q)
            hresp_end(q->r);
        run(&f);
        is_got(
            &f, d,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n2\r\nbb\r\n0\r\n\r\n",
            "ended: the terminal chunk 0\\r\\n\\r\\n");
        ok(!f.p[d].eof, "ended: open");
        is_int(f.t.nclose, 2, "ended: on_close ran");
        fx_fini(&f);
    }
}

/* A response stream's hooks, for /take's handoff attached on the test's loop. */
struct sh {
    int released, sent_calls, closed;
    uint64_t sent;
};

static void
sh_release(void *arg, void *owner, uint32_t tag)
{
    ((struct sh *)arg)->released++;
}

static void
sh_sent(void *arg, size_t queued)
{
    ((struct sh *)arg)->sent_calls++;
}

static void
sh_close(void *arg, uint64_t sent)
{
    struct sh *h = arg;
    h->closed++;
    h->sent = sent;
}

static const struct hstream_ops sh_ops = {
    .release = sh_release, .on_sent = sh_sent, .on_close = sh_close};

/* hresp_handoff: the connection leaves the server with the head still
 * unwritten; attached (here on the same loop), the stream sends the head,
 * its chunks and the terminal chunk, and closes. */
static void
test_handoff(void)
{
    struct fx f;
    fx_init(&f, NULL);
    int c = fx_connect(&f);
    send_str(&f, c, "GET /take HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    ok(f.t.handoff != NULL, "handed off");
    is_str(f.t.log.p, "req 0 GET /take\nclose 0\ntaken 1\n",
           "handed off: on_close ran before it returned");
    is_int(f.p[c].in.n, 0, "handed off: the head waits for the stream");
    ok(!f.p[c].eof, "handed off: the client's connection stays");
    ok(f.t.handoff && hstream_handoff_home(f.t.handoff) == NULL, "HTTP/1.1: any loop may attach");
    struct http_server_stats st;
    http_server_stats(f.s, &st);
    is_int(st.open, 0, "handed off: the server forgot it");
    is_int(st.taken, 1, "handed off: counted as taken");
    /* the server reads nothing more from it */
    send_str(&f, c, "GET /after HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    is_int(f.t.nreq, 1, "handed off: no request read after it");
    struct sh h = {0};
    struct hstream *s = f.t.handoff ? hstream_attach(f.t.handoff, f.base, &sh_ops, &h) : NULL;
    f.t.handoff = NULL;
    ok(s != NULL, "attached");
    if (s) {
        static char blob[] = "hello";
        hstream_write_ref(s, blob, 7, blob, 5);
        hstream_write(s, "hi", 2);
        hstream_end(s);
        ok(hstream_flush(s) == false, "everything left at once: closed inside the flush");
    }
    run(&f);
    is_got(&f, c,
           "HTTP/1.1 200 OK\r\nX-Stream: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
           "5\r\nhello\r\n2\r\nhi\r\n0\r\n\r\n",
           "the head, two chunks, the terminal chunk");
    ok(f.p[c].eof, "then EOF");
    is_int(h.released, 1, "the reference released once");
    is_int(h.closed, 1, "on_close once");
    is_int(h.sent, f.p[c].in.n, "...with every byte the client got");
    is_int(h.sent_calls, 0, "no on_sent from inside the handler's calls");
    http_server_stats(f.s, &st);
    is_int(st.taken, 0, "closed: no longer counted");
    fx_fini(&f);
}

/* Connections taken away count against max_connections until their taker
 * releases them (a handoff freed, a stream closed), and so does a socket
 * of the handler's own counted with hreq_count_socket, until its request
 * closes: past the cap, a 429. */
static void
test_taken_count(void)
{
    struct http_server_options o = {.max_connections = 2};
    struct fx f;
    fx_init(&f, &o);
    struct http_server_stats st;
    int a = fx_connect(&f);
    send_str(&f, a, "GET /take HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    ok(f.t.handoff != NULL, "taken");
    http_server_stats(f.s, &st);
    is_int(st.taken, 1, "stats: one taken");
    is_int(st.open, 0, "stats: none open");
    int b = fx_connect(&f);
    int c = fx_connect(&f);
    run(&f);
    ok(!f.p[b].eof, "taken + one open: the second connection open");
    ok(f.p[c].eof && f.p[c].in.n > 13 && strncmp(f.p[c].in.p, "HTTP/1.1 429 ", 13) == 0,
       "taken + one open: the third refused with a 429");
    /* the taker drops it: room again */
    hstream_handoff_free(f.t.handoff);
    f.t.handoff = NULL;
    http_server_stats(f.s, &st);
    is_int(st.taken, 0, "released: none taken");
    int d = fx_connect(&f);
    send_str(&f, d, "GET / HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    ok(f.p[d].in.n > 13 && strncmp(f.p[d].in.p, "HTTP/1.1 200 ", 13) == 0,
       "released: a new connection served");
    fx_hangup(&f, d);
    run(&f);
    /* a socket counted for a request (a tunnel's upstream) counts too */
    int h = fx_connect(&f);
    send_str(&f, h, "GET /count HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    http_server_stats(f.s, &st);
    is_int(st.taken, 1, "counted: one more");
    int e = fx_connect(&f);
    run(&f);
    ok(f.p[e].eof && f.p[e].in.n > 13 && strncmp(f.p[e].in.p, "HTTP/1.1 429 ", 13) == 0,
       "counted: refused");
    fx_hangup(&f, h);
    run(&f);
    http_server_stats(f.s, &st);
    is_int(st.taken, 0, "counted: released when its request closed");
    int g = fx_connect(&f);
    send_str(&f, g, "GET / HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    ok(f.p[g].in.n > 13 && strncmp(f.p[g].in.p, "HTTP/1.1 200 ", 13) == 0, "hold released: served");
    http_server_stats(f.s, &st);
    is_int(st.refused, 2, "stats: two refused");
    is_int(st.max_connections, 2, "stats: the cap");
    fx_fini(&f);
}

/* hreq_take_pipe: the bytes behind an Upgrade request wait unparsed in the
 * pipe's input; the connection counts against the cap until hpipe_free,
 * which closes it from the next loop turn. (hpipe_test.c: the rest.) */
static void
test_take_pipe(void)
{
    struct http_server_options o = {.max_connections = 1};
    struct fx f;
    fx_init(&f, &o);
    int a = fx_connect(&f);
    send_str(&f, a,
             "GET /pipe HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: tunnel\r\n\r\n"
             "GET /not-a-request HTTP/1.1\r\n\r\n",
             0);
    ok(f.t.pipe != NULL, "taken");
    is_str(f.t.log.p, "req 0 GET /pipe\nclose 0\npipe 1\npipe read 31\n",
           "on_close ran before it returned; on_read from the loop");
    struct evbuffer *in = f.t.pipe ? hpipe_input(f.t.pipe) : NULL;
    size_t n = in ? evbuffer_get_length(in) : 0;
    char *p = in ? (char *)evbuffer_pullup(in, -1) : NULL;
    is_mem(p ? p : "", n, "GET /not-a-request HTTP/1.1\r\n\r\n", 31,
           "the bytes behind the request: in its input, unparsed");
    is_int(f.p[a].in.n, 0, "the server answered nothing");
    struct http_server_stats st;
    http_server_stats(f.s, &st);
    is_int(st.taken, 1, "stats: one taken");
    is_int(st.open, 0, "stats: none open");
    int b = fx_connect(&f);
    run(&f);
    ok(f.p[b].eof && f.p[b].in.n > 13 && strncmp(f.p[b].in.p, "HTTP/1.1 429 ", 13) == 0,
       "while taken: a second connection refused");
    if (f.t.pipe) {
        hpipe_write(f.t.pipe, "pong", 4);
        run(&f);
        is_got(&f, a, "pong", "the taker writes to the client");
        hpipe_free(f.t.pipe);
        f.t.pipe = NULL;
    }
    http_server_stats(f.s, &st);
    is_int(st.taken, 0, "freed: released at once");
    run(&f);
    ok(f.p[a].eof, "freed: the client sees EOF");
    int c = fx_connect(&f);
    send_str(&f, c, "GET / HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    ok(f.p[c].in.n > 13 && strncmp(f.p[c].in.p, "HTTP/1.1 200 ", 13) == 0,
       "freed: a new connection served");
    is_int(f.t.nreq, 2, "two requests");
    fx_fini(&f);
}

/* The head timeout runs from a head's first byte: a head trickled in a
 * byte per loop turn is cut by it all the same (bytes never re-arm it). */
static void
test_trickled_head(void)
{
    struct http_server_options o = {.request_header_timeout_ms = 100};
    struct fx f;
    fx_init(&f, &o);
    int c = fx_connect(&f);
    send_str(&f, c, "GET / HTTP/1.1\r\nHost: h\r\nX-Slow: ", 0);
    struct timeval tv = {GUARD_MS / 1000, (GUARD_MS % 1000) * 1000};
    f.guard_fired = false;
    evtimer_add(f.guard, &tv);
    size_t sent = 0;
    /* bounded: far fewer bytes than the 1 MiB head limit */
    for (int n = 0; n < 200000 && !f.p[c].eof && !f.guard_fired; n++) {
        if (send(f.p[c].fd, "a", 1, MSG_NOSIGNAL) == 1)
            sent++;
        event_base_loop(f.base, EVLOOP_ONCE);
        peers_read(&f);
    }
    evtimer_del(f.guard);
    ok(f.p[c].eof, "closed while bytes kept coming");
    ok(!f.guard_fired, "closed by the head timeout, not the test's guard");
    ok(sent > 1, "bytes came in several reads");
    is_int(f.p[c].in.n, 0, "nothing answered");
    is_int(f.t.nreq, 0, "no request");
    struct http_server_stats st;
    http_server_stats(f.s, &st);
    is_int(st.header_timeouts, 1, "a header timeout");
    fx_fini(&f);
}

/* A listener on loopback port 0: the port bound, a connection accepted
 * with its peer address; a second server on that port fails with a message
 * that names the address. */
static void
test_listen(void)
{
    struct http_listen_addr la = {.len = sizeof(struct sockaddr_in)};
    struct sockaddr_in *sin = (struct sockaddr_in *)&la.ss;
    sin->sin_family = AF_INET;
    sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct http_server_options o = {.addrs = &la, .naddrs = 1};
    struct fx f;
    fx_init(&f, &o);
    int port = http_server_port(f.s, 0);
    ok(port > 0, "a port bound");
    is_int(http_server_port(f.s, 1), 0, "no second listener");
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* a blocking connect on loopback completes from the backlog */
    ok(fd >= 0 && connect(fd, (struct sockaddr *)&to, sizeof(to)) == 0, "connected");
    struct sockaddr_in me;
    socklen_t ml = sizeof(me);
    getsockname(fd, (struct sockaddr *)&me, &ml);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    f.p[f.np] = (struct peer){.fd = fd};
    int c = f.np++;
    send_str(&f, c, "GET /peer HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", 0);
    ok(run_until_eof(&f, c), "answered and closed");
    char want[64];
    snprintf(want, sizeof(want), "127.0.0.1:%d", ntohs(me.sin_port));
    size_t wl = strlen(want);
    ok(f.p[c].in.n > wl && memcmp(f.p[c].in.p + f.p[c].in.n - wl, want, wl) == 0,
       "the peer: the client's address and port");
    struct http_server_stats st;
    http_server_stats(f.s, &st);
    is_int(st.accepted, 1, "stats: one accepted");

    sin->sin_port = htons((uint16_t)port);
    struct http_server *s2 = NULL;
    char err[256] = "", at[64];
    is_int(http_server_new(f.base, &o, on_request, &f.t, &s2, err, sizeof(err)), -EADDRINUSE,
           "the same port again: EADDRINUSE");
    snprintf(at, sizeof(at), "--listen 127.0.0.1:%d: cannot bind", port);
    ok(strstr(err, at) != NULL, "the message names the address");
    ok(s2 == NULL, "no second server");
    fx_fini(&f);
}

/* ---- the request-done seam (metrics, the access log) ---- */

static void
on_done(void *arg, const struct hreq_done *d, void *note)
{
    struct th *t = arg;
    static const char *const how[] = {"done", "closed", "taken"};
    th_log(t, "done %s %s %s %d %llu note=%lx%s", how[d->how], d->method, d->target, d->status,
           (unsigned long long)d->bytes, (unsigned long)(uintptr_t)note,
           d->start_ns && d->end_ns >= d->start_ns &&
                   (!d->head_ns || (d->head_ns >= d->start_ns && d->end_ns >= d->head_ns))
               ? ""
               : " (times out of order)");
}

static void
test_done(void)
{
    struct fx f;
    fx_init(&f, NULL);
    f.t.notes = true;
    http_server_on_done(f.s, on_done, &f.t);
    int c = fx_connect(&f);
    send_str(&f, c, "GET /a?b=c HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    char want[256];
    snprintf(want, sizeof(want),
             "req 0 GET /a?b=c\ncomplete 0\ndone done GET /a?b=c 200 %zu note=1000\nclose 0\n",
             f.p[c].in.n);
    is_str(f.t.log.p, want,
           "answered: once, before on_close, every byte the client got, the note back");

    /* a streamed answer cut short: closed, the head and two chunks counted */
    sb_reset(&f.t.log);
    int d = fx_connect(&f);
    send_str(&f, d, "GET /stream HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    size_t got = f.p[d].in.n;
    if (f.t.reqs[1])
        hresp_abort(f.t.reqs[1]->r);
    run(&f);
    snprintf(want, sizeof(want),
             "req 1 GET /stream\ncomplete 1\ndone closed GET /stream 200 %zu note=1001\nclose 1\n",
             got);
    is_str(f.t.log.p, want, "aborted: closed, with what was queued");

    /* the client leaves before any answer: status 0 */
    sb_reset(&f.t.log);
    int e = fx_connect(&f);
    send_str(&f, e, "GET /defer HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n", 0);
    close(f.p[e].fd);
    f.p[e].fd = -1;
    run(&f);
    is_str(f.t.log.p, "req 2 GET /defer\ndone closed GET /defer 0 0 note=1002\nclose 2\n",
           "the client left first: status 0, no bytes");

    /* a response handed off: the note goes to the taker, the callback gets none */
    sb_reset(&f.t.log);
    int g = fx_connect(&f);
    send_str(&f, g, "GET /take HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    static const char head[] = "HTTP/1.1 200 OK\r\nX-Stream: 1\r\nDate: Thu, 01 Jan 1970 00:00:00 "
                               "GMT\r\nTransfer-Encoding: chunked\r\n\r\n";
    snprintf(want, sizeof(want),
             "req 3 GET /take\ndone taken GET /take 200 %zu note=0\nclose 3\ntaken 1\n",
             sizeof(head) - 1);
    is_str(f.t.log.p, want, "taken: the callback with the head's bytes, without the note");
    ok(f.t.handoff && hstream_handoff_note(f.t.handoff) == (void *)(uintptr_t)0x1003,
       "taken: the taker has the note");
    hstream_handoff_free(f.t.handoff);
    f.t.handoff = NULL;

    /* a head refused before any handler: no callback at all */
    sb_reset(&f.t.log);
    int h = fx_connect(&f);
    send_str(&f, h, "GET /x HTTP/1.1\r\n\r\n", 0);
    ok(!strstr(f.t.log.p ? f.t.log.p : "", "done"),
       "a 400 at the head: not a request of the handler's");
    fx_fini(&f);
}

/* Is the server's end of client i's socketpair closed?  Writing then fails
 * with EPIPE (a shut-down-for-writing end still accepts the bytes). */
static bool
server_end_closed(struct fx *f, int i)
{
    return send(f->p[i].fd, "x", 1, MSG_NOSIGNAL) < 0 && errno == EPIPE;
}

static void
test_server_free(void)
{
    struct http_server_options o = {.max_connections = 3};
    struct fx f;
    fx_init(&f, &o);
    int idle = fx_connect(&f);
    send_str(&f, idle, "GET / HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    int busy = fx_connect(&f);
    send_str(&f, busy, "POST /stream HTTP/1.1\r\nHost: h\r\nContent-Length: 9\r\n\r\nabc", 0);
    /* answered and closed, the client still there: the server lingers on
     * the socket (reading what the client may still send) */
    int closing = fx_connect(&f);
    send_str(&f, closing, "GET / HTTP/1.0\r\n\r\n", 0);
    ok(f.p[closing].eof, "the HTTP/1.0 one: answered and closed");
    int bad = fx_connect(&f);
    send_str(&f, bad, "GET /\x01 HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    ok(f.p[bad].eof, "the bad one: answered and closed");
    int partial = fx_connect(&f);
    send_str(&f, partial, "GET / HTTP/1.1\r\nHo", 0);
    int refused = fx_connect(&f);
    run(&f);
    ok(f.p[refused].eof, "the one over the cap: answered and closed");
    struct http_server_stats st;
    http_server_stats(f.s, &st);
    is_int(st.refused, 1, "the one over the cap: refused");
    is_int(f.t.nreq - f.t.nclose, 1, "one request open");

    http_server_free(f.s);
    f.s = NULL;
    is_int(f.t.nclose, f.t.nreq, "freed: every on_close ran");
    is_str(f.t.log.p + f.t.log.n - 8, "close 1\n", "freed: the busy request closed last");
    for (int i = 0; i < f.np; i++) {
        char m[64];
        peers_read(&f);
        snprintf(m, sizeof(m), "freed: client %d sees EOF", i);
        ok(f.p[i].eof, m);
        snprintf(m, sizeof(m), "freed: client %d's server end is closed", i);
        ok(server_end_closed(&f, i), m);
    }
    /* the loop runs on without the server */
    for (int i = 0; i < f.np; i++)
        fx_hangup(&f, i);
    for (int i = 0; i < 10; i++)
        event_base_loop(f.base, EVLOOP_NONBLOCK);
    for (int i = 0; i < f.np; i++)
        sb_free(&f.p[i].in);
    sb_free(&f.t.log);
    event_free(f.guard);
    event_base_free(f.base);
}

/* http_server_shutdown over HTTP/1.1, as Go's Server.Shutdown: the listener
 * closes (a new client is refused), an idle keep-alive connection closes at
 * once, a response in progress finishes and then its connection closes
 * (Connection: close in a head written after the shutdown), a request whose
 * head is still arriving is answered the same way; requests in progress and
 * open connections are counted down to 0. */
static void
test_shutdown(void)
{
    struct http_listen_addr la = {.len = sizeof(struct sockaddr_in)};
    struct sockaddr_in *sin = (struct sockaddr_in *)&la.ss;
    sin->sin_family = AF_INET;
    sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct http_server_options o = {.addrs = &la, .naddrs = 1};
    struct fx f;
    fx_init(&f, &o);
    int port = http_server_port(f.s, 0);
    int idle = fx_connect(&f);
    send_str(&f, idle, "GET /a HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    ok(f.p[idle].in.n > 0 && !f.p[idle].eof, "idle: answered, kept alive");
    int streaming = fx_connect(&f);
    send_str(&f, streaming, "GET /stream HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    int deferred = fx_connect(&f);
    send_str(&f, deferred, "GET /park HTTP/1.1\r\nHost: h\r\n\r\n", 0);
    int partial = fx_connect(&f);
    send_str(&f, partial, "GET /b HTTP/1.1\r\nHo", 0);
    is_int(http_server_requests(f.s), 2, "two requests in progress (the partial head is none)");

    http_server_shutdown(f.s);
    run(&f);
    ok(f.p[idle].eof, "idle: closed at the shutdown");
    ok(!f.p[streaming].eof && !f.p[deferred].eof && !f.p[partial].eof, "the busy ones: open");
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok(fd >= 0 && connect(fd, (struct sockaddr *)&to, sizeof(to)) != 0 && errno == ECONNREFUSED,
       "the listener is closed: a new client is refused");
    if (fd >= 0)
        close(fd);
    is_int(http_server_port(f.s, 0), port, "the port is still known");

    /* the stream's head left before the shutdown: it ends, then closes */
    struct treq *q = f.t.reqs[1];
    if (q)
        hresp_end(q->r);
    ok(run_until_eof(&f, streaming), "streaming: closed after its response");
    is_got(&f, streaming,
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n2\r\nbb\r\n0\r\n\r\n",
           "streaming: the whole response");
    /* a head written after the shutdown says Connection: close */
    q = f.t.reqs[2];
    if (q)
        hresp_simple(q->r, 200, NULL, "late", 4);
    ok(run_until_eof(&f, deferred), "deferred: closed after its response");
    ok(f.p[deferred].in.p && strstr(f.p[deferred].in.p, "\r\nConnection: close\r\n") &&
           strstr(f.p[deferred].in.p, "\r\n\r\nlate"),
       "deferred: answered whole, with Connection: close");
    send_str(&f, partial, "st: h\r\n\r\n", 0);
    ok(run_until_eof(&f, partial), "partial: closed after its response");
    ok(f.p[partial].in.p && strstr(f.p[partial].in.p, "\r\nConnection: close\r\n") &&
           strstr(f.p[partial].in.p, "GET /b\n"),
       "partial: answered, with Connection: close");
    run(&f);
    struct http_server_stats st;
    http_server_stats(f.s, &st);
    is_int(st.open, 0, "every connection closed");
    is_int(http_server_requests(f.s), 0, "no request in progress");
    fx_fini(&f);
}

int
main(void)
{
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    TAP_RUN(test_simple_get);
    TAP_RUN(test_head);
    TAP_RUN(test_keepalive);
    TAP_RUN(test_http10);
    TAP_RUN(test_pipelining);
    TAP_RUN(test_bodies);
    TAP_RUN(test_expect_continue);
    TAP_RUN(test_early_answer);
    TAP_RUN(test_framing_errors);
    TAP_RUN(test_obs_fold);
    TAP_RUN(test_limits);
    TAP_RUN(test_timeouts);
    TAP_RUN(test_max_connections);
    TAP_RUN(test_max_connections_per_source);
    TAP_RUN(test_handoff_shared_limits);
    TAP_RUN(test_body_flow_control);
    TAP_RUN(test_late_handler);
    TAP_RUN(test_abort_and_end);
    TAP_RUN(test_handoff);
    TAP_RUN(test_taken_count);
    TAP_RUN(test_take_pipe);
    TAP_RUN(test_trickled_head);
    TAP_RUN(test_listen);
    TAP_RUN(test_done);
    TAP_RUN(test_server_free);
    TAP_RUN(test_shutdown);
    return tap_done();
}
