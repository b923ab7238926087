/*
 * http_fuzz.c — libFuzzer target for proxy/http/ (http.c, h1.c, hreq.c,
 * hresp.c): raw bytes from a client.
 *
 * Each input gets a fresh event_base and server (no listen address, small
 * limits so they are reached: 2 KiB heads, 256 discarded body bytes) and
 * two adopted socketpair connections: one gets the input in one write, the
 * other in pieces cut at up to three positions derived from the input's
 * hash, with loop turns between the pieces, then a half-close. The loop runs
 * (EVLOOP_NONBLOCK) until nothing moves, bounded; the clients read all the
 * server sends. One input in 16 (by its hash) caps the server at one
 * connection, so the second is refused (429) instead.
 *
 * The handler does what the request target's second byte says, so mutations
 * reach every path of the response writer and the body reader:
 *   /s streamed answer finished from later loop turns   /a stream, then abort
 *   /x answer from on_request, body unread               /p read, pause, resume
 *   /d body discarded, answer on_complete                /t a response stream (handoff,
 *   /b hreq_take_pipe from on_request                       attach, writes, end)
 *   /c hresp_close_after
 *   /w body reading turned on later (100-continue)       /k abort inside on_body
 *   /h large streamed answer paced by on_drain           /q stream while the body
 *   /u read the body, hreq_take_pipe on_complete            is still being read
 *   /l the body held (hreq_body_hold), never read
 *   anything else: echo (method, target, body length)
 * A pipe echoes what the client sends, stops reading while more than 4 KiB
 * are queued (on_drain reads again), and is freed at its EOF or error, or
 * with the server.
 * At the end the server is freed with whatever is still open; every request
 * handed to the handler must have had exactly one on_close. ASan, UBSan and
 * LeakSanitizer (per input: a fresh base, so anything not freed is lost)
 * catch the rest; a loop that never goes quiet aborts.
 */
#include "kwc/http.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define FZ_STREAMS 8    /* /t streams open at once (more are dropped: hstream_handoff_free) */
#define TURNS_MAX 20000 /* loop turns for one phase before "it never goes quiet" */
#define QUIET 3
#define PIPES 2 /* one per connection at most */

/* A check of the server's counters before it is freed (h2_fuzz.c's bounds). */
static void (*fz_check_server)(struct http_server *s);
/* The server's max_header_bytes (h2_fuzz.c's programs raise it, so that
 * lists within it can be HPACK bombs). */
static size_t fz_max_header_bytes = 2048;

struct fz {
    struct event_base *base;
    struct http_server *s;
    int fd[2];     /* client ends; -1 when closed */
    size_t got[2]; /* bytes the server sent to each */
    bool eof[2];
    unsigned long long hooks;
    int nreq, nclose;
    struct fp *pipe[PIPES];
    struct fs *streams[FZ_STREAMS]; /* /t: response streams still open (HTTP/2: several on a
                                       connection) */
};

/* /t: a response stream attached on the same loop. */
struct fs {
    struct fz *z;
    struct hstream *s;
    int refs; /* references given and not yet released */
};

static void
fs_release(void *arg, void *owner, uint32_t tag)
{
    struct fs *f = arg;
    if (owner != f || f->refs-- <= 0)
        abort(); /* a reference released twice, or one never given */
}

static void
fs_sent(void *arg, size_t queued)
{
    ((struct fs *)arg)->z->hooks++;
}

static void
fs_forget(struct fs *f)
{
    for (int i = 0; i < FZ_STREAMS; i++)
        if (f->z->streams[i] == f)
            f->z->streams[i] = NULL;
    free(f);
}

static void
fs_close(void *arg, uint64_t sent)
{
    struct fs *f = arg;
    if (f->refs)
        abort(); /* closed with references never released */
    f->z->hooks++;
    fs_forget(f);
}

static const struct hstream_ops fs_ops = {
    .release = fs_release, .on_sent = fs_sent, .on_close = fs_close};

static void
stream_handoff(struct fz *z, struct hreq *r)
{
    hresp_header(r, "Content-Type", "text/plain");
    hresp_start(r, 200, -1);
    struct hstream_handoff *h = hresp_handoff(r); /* q is gone */
    if (!h)
        return;
    struct event_base *home = hstream_handoff_home(h);
    if (home && home != z->base)
        abort(); /* HTTP/1.1: any loop; HTTP/2: the connection's */
    int slot = 0;
    while (slot < FZ_STREAMS && z->streams[slot])
        slot++;
    if (slot == FZ_STREAMS) {
        hstream_handoff_free(h);
        return;
    }
    struct fs *f = xcalloc(1, sizeof(*f));
    f->z = z;
    f->s = hstream_attach(h, z->base, &fs_ops, f);
    if (!f->s) {
        free(f); /* HTTP/2: reset in transit (never on HTTP/1.1: attached at once) */
        if (!home)
            abort();
        return;
    }
    z->streams[slot] = f;
    static const char blob[] = "blob";
    f->refs = 2;
    hstream_write_ref(f->s, f, 0, blob, 4);
    hstream_write(f->s, "copy", 4);
    hstream_write_ref(f->s, f, 1, blob, 0); /* nothing to send: released at the flush */
    hstream_end(f->s);
    (void)hstream_flush(f->s); /* false: closed inside, f is gone */
}

struct fq {
    struct fz *z;
    struct hreq *r;
    struct event *ev; /* deferred steps */
    char mode;
    int step;
    size_t body;
    bool paused;
};

static void
fq_later(struct fq *q)
{
    struct timeval zero = {0, 0};
    evtimer_add(q->ev, &zero);
}

static void
answer(struct fq *q, int status)
{
    char buf[128];
    int n = snprintf(buf, sizeof(buf), "%s %zu\n", hreq_method(q->r), q->body);
    hresp_simple(q->r, status, "text/plain", buf, (size_t)n);
}

static void
stream_start(struct fq *q)
{
    hresp_header(q->r, "Content-Type", "text/plain");
    hresp_start(q->r, 200, -1);
    hresp_write(q->r, "x", 1);
}

/* Deferred steps; anything that can end r (and free q) comes last. */
static void
on_step(evutil_socket_t fd, short what, void *arg)
{
    struct fq *q = arg;
    q->z->hooks++;
    q->step++;
    switch (q->mode) {
    case 's':
        if (q->step == 1) {
            hresp_write(q->r, "yy", 2);
            fq_later(q);
        } else if (q->step == 2) {
            struct evbuffer *b = evbuffer_new();
            evbuffer_add(b, "zzz", 3);
            hresp_write_buffer(q->r, b);
            evbuffer_free(b);
            fq_later(q);
        } else {
            hresp_end(q->r);
        }
        break;
    case 'a':
        hresp_abort(q->r);
        break;
    case 'p':
        hreq_body_read(q->r, true);
        break;
    case 'w':
        hreq_body_read(q->r, true);
        break;
    case 'q':
        if (q->step < 3) {
            hresp_write(q->r, "q", 1);
            fq_later(q);
        } else {
            hresp_end(q->r);
        }
        break;
    default:
        break;
    }
}

static void
h_body(void *arg, const char *p, size_t n)
{
    struct fq *q = arg;
    q->z->hooks++;
    q->body += n;
    if (q->mode == 'p' && !q->paused) {
        q->paused = true;
        hreq_body_read(q->r, false);
        fq_later(q);
    } else if (q->mode == 'k') {
        hresp_abort(q->r); /* q is gone */
    }
}

/* ---- pipes (/b, /u) ---- */

struct fp {
    struct fz *z;
    struct hpipe *p;
    int slot;
};

static void
fp_free(struct fp *f)
{
    hpipe_free(f->p);
    f->z->pipe[f->slot] = NULL;
    free(f);
}

static void
fp_read(void *arg)
{
    struct fp *f = arg;
    f->z->hooks++;
    hpipe_write_buffer(f->p, hpipe_input(f->p));
    if (hpipe_queued(f->p) > 4096)
        hpipe_read(f->p, false);
}

static void
fp_drain(void *arg)
{
    struct fp *f = arg;
    f->z->hooks++;
    hpipe_read(f->p, true);
}

static void
fp_end(void *arg)
{
    struct fp *f = arg;
    f->z->hooks++;
    fp_free(f);
}

static const struct hpipe_ops pipe_ops = {
    .on_read = fp_read,
    .on_drain = fp_drain,
    .on_eof = fp_end,
    .on_error = fp_end,
};

/* r becomes a pipe (q is gone either way) */
static void
take_pipe(struct fz *z, struct hreq *r)
{
    int slot = z->pipe[0] ? 1 : 0;
    if (z->pipe[slot])
        abort(); /* more pipes than connections */
    struct fp *f = xcalloc(1, sizeof(*f));
    f->z = z;
    f->slot = slot;
    f->p = hreq_take_pipe(r, &pipe_ops, f);
    if (f->p)
        z->pipe[slot] = f;
    else
        free(f);
}

static void
h_complete(void *arg)
{
    struct fq *q = arg;
    q->z->hooks++;
    switch (q->mode) {
    case 's':
        stream_start(q);
        fq_later(q);
        break;
    case 'a':
    case 'q':
    case 'x':
    case 'h':
        break; /* answered or answering already */
    case 'c':
        hresp_close_after(q->r);
        answer(q, 201);
        break;
    case 'u':
        take_pipe(q->z, q->r); /* q is gone */
        break;
    case 'd':
        answer(q, 404);
        break;
    default:
        answer(q, 200);
        break;
    }
}

static void
h_drain(void *arg)
{
    struct fq *q = arg;
    q->z->hooks++;
    if (q->mode != 'h' || !hresp_started(q->r))
        return;
    if (++q->step > 4) {
        hresp_end(q->r);
        return;
    }
    static char blob[16384];
    memset(blob, 'h', sizeof(blob));
    hresp_write(q->r, blob, sizeof(blob));
}

static void
h_close(void *arg)
{
    struct fq *q = arg;
    q->z->hooks++;
    q->z->nclose++;
    event_free(q->ev);
    free(q);
}

static const struct hreq_handler hooks = {
    .on_body = h_body,
    .on_complete = h_complete,
    .on_drain = h_drain,
    .on_close = h_close,
};

static void
on_request(void *arg, struct hreq *r)
{
    struct fz *z = arg;
    z->hooks++;
    z->nreq++;
    size_t tl;
    const char *t = hreq_target(r, &tl);
    if (strlen(t) != tl)
        abort(); /* the target is NUL-terminated at its length, with no NUL inside */
    const struct http_header *hs;
    size_t nh = hreq_headers(r, &hs);
    for (size_t i = 0; i < nh; i++)
        if (!hs[i].name || !hs[i].value || !*hs[i].name)
            abort();
    (void)hreq_header(r, "Host");
    (void)hreq_content_length(r);
    (void)hreq_http10(r);
    (void)hreq_upgrade(r);
    (void)hreq_peer(r, NULL);
    if (hreq_tls(r) || hreq_client_cert(r))
        abort();

    struct fq *q = xcalloc(1, sizeof(*q));
    q->z = z;
    q->r = r;
    q->mode = tl >= 2 ? t[1] : 'e';
    q->ev = evtimer_new(z->base, on_step, q);
    hreq_set_handler(r, &hooks, q);
    switch (q->mode) {
    case 'x':
        hresp_header(r, "X-Early", "1\r\nInjected: no"); /* cut at the line break */
        answer(q, 200);
        break;
    case 'a':
        hreq_body_read(r, true);
        stream_start(q);
        fq_later(q);
        break;
    case 't':
        stream_handoff(z, r);
        break;
    case 'b':
        take_pipe(z, r); /* q is gone */
        break;
    case 'd':
        break; /* discarded */
    case 'l':
        hreq_body_hold(r); /* held, as the stages hold it, until the server goes */
        break;
    case 'w':
        fq_later(q);
        break;
    case 'h':
        hresp_low_water(r, 1024);
        hresp_start(r, 200, -1);
        hresp_write(r, "h", 1);
        break;
    case 'q':
        hreq_body_read(r, true);
        stream_start(q);
        fq_later(q);
        break;
    default:
        hreq_body_read(r, true);
        break;
    }
}

/* ---- driving the loop ---- */

static void
clients_read(struct fz *z)
{
    for (int i = 0; i < 2; i++) {
        while (z->fd[i] >= 0 && !z->eof[i]) {
            char buf[65536];
            ssize_t n = recv(z->fd[i], buf, sizeof(buf), 0);
            if (n > 0) {
                z->got[i] += (size_t)n;
                continue;
            }
            if (n == 0 || (errno != EAGAIN && errno != EINTR))
                z->eof[i] = true;
            break;
        }
    }
}

static unsigned long long
progress(const struct fz *z)
{
    unsigned long long v = z->hooks;
    for (int i = 0; i < 2; i++) {
        v += z->got[i] + z->eof[i];
        int q = 0;
        if (z->fd[i] >= 0 && ioctl(z->fd[i], SIOCOUTQ, &q) == 0)
            v += (unsigned)q * 7919u;
    }
    return v;
}

static bool
turn(struct fz *z)
{
    unsigned long long before = progress(z);
    event_base_loop(z->base, EVLOOP_NONBLOCK);
    clients_read(z);
    return progress(z) != before;
}

static void
run(struct fz *z)
{
    int idle = 0;
    for (int i = 0; idle < QUIET; i++) {
        if (i == TURNS_MAX)
            abort(); /* the server never goes quiet */
        idle = turn(z) ? 0 : idle + 1;
    }
}

static void
send_piece(struct fz *z, int i, const uint8_t *p, size_t n)
{
    int stuck = 0;
    while (n && z->fd[i] >= 0) {
        ssize_t w = send(z->fd[i], p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            stuck = 0;
        } else if (w < 0 && errno == EAGAIN && ++stuck < 1000) {
            turn(z);
        } else {
            return; /* the server closed, or stopped reading */
        }
    }
    turn(z);
}

static uint64_t
fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static int
cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
    signal(SIGPIPE, SIG_IGN);
    log_set_level(LOG_ERROR);
    return 0;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t h = fnv1a(data, size);
    struct fz z = {.fd = {-1, -1}};
    z.base = event_base_new();
    if (!z.base)
        abort();
    struct http_server_options o = {
        .max_header_bytes = fz_max_header_bytes,
        .max_discard_bytes = 256,
        .max_connections = (h >> 60) == 0 ? 1 : 0,
        /* both connections come from one address: now and then only the
         * first may stay (the second is refused as past max_connections) */
        .max_connections_per_source = ((h >> 56) & 15) == 0 ? 1 : 2,
    };
    struct sockaddr_in6 src = {.sin6_family = AF_INET6};
    src.sin6_addr.s6_addr[10] = src.sin6_addr.s6_addr[11] = 0xff; /* ::ffff:127.0.0.2 */
    src.sin6_addr.s6_addr[12] = 127;
    src.sin6_addr.s6_addr[15] = 2;
    char err[256];
    if (http_server_new(z.base, &o, on_request, &z, &z.s, err, sizeof(err)) != 0)
        abort();
    for (int i = 0; i < 2; i++) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
            abort();
        z.fd[i] = sv[0];
        http_server_adopt(z.s, sv[1], (const struct sockaddr *)&src, sizeof(src));
    }

    /* connection 0: the input whole */
    send_piece(&z, 0, data, size);
    run(&z);

    /* connection 1: in pieces, then a half-close */
    size_t cut[5] = {0, h % (size + 1), (h >> 20) % (size + 1), (h >> 40) % (size + 1), size};
    qsort(cut, 5, sizeof(cut[0]), cmp_size);
    for (int k = 0; k < 4; k++) {
        send_piece(&z, 1, data + cut[k], cut[k + 1] - cut[k]);
        run(&z);
    }
    shutdown(z.fd[1], SHUT_WR);
    run(&z);
    struct http_server_stats st;
    http_server_stats(z.s, &st);
    if (st.sources > 1 || (st.open > 0) != (st.sources == 1))
        abort(); /* one address: counted while (and only while) it has a connection open */

    /* the server goes with connection 0 still open, and the pipes still open */
    if (fz_check_server)
        fz_check_server(z.s);
    http_server_free(z.s);
    if (z.nclose != z.nreq)
        abort(); /* a request without its on_close, or with two */
    for (int i = 0; i < PIPES; i++)
        if (z.pipe[i])
            fp_free(z.pipe[i]);
    for (int i = 0; i < FZ_STREAMS; i++)
        if (z.streams[i]) {
            struct fs *f = z.streams[i];
            (void)hstream_close(f->s);
            if (f->refs)
                abort(); /* hstream_close must release every reference */
            fs_forget(f);
        }
    for (int i = 0; i < 2; i++)
        close(z.fd[i]);
    /* callbacks queued with event_base_once (hpipe_free, a TLS stream's close) */
    for (int i = 0; i < QUIET; i++)
        event_base_loop(z.base, EVLOOP_NONBLOCK);
    event_base_free(z.base);
    return 0;
}
