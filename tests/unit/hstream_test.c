/*
 * hstream_test.c — proxy/http/h1stream.c: response streams over HTTP/1.1
 * (hresp_handoff, hstream_*: the contract in include/kwc/http.h), plain and
 * TLS, without a network.
 *
 * The server adopts one end of a socketpair(AF_UNIX); the test plays the
 * client on the other (plain bytes, or a TLS client pumped between loop
 * turns: tlsfx.h). A request for /w gets a watch's head (the
 * headers watch.c sets, then hresp_start(r, 200, -1)) and is handed off;
 * the test attaches the handoff on the server's loop, or on a second
 * event_base run by a second thread, with hooks that record every call.
 *
 * Expected bytes come from RFC 9112 (chunk framing, the terminal chunk,
 * close-delimited HTTP/1.0) and from the head kwc sent watches before the
 * stream moved into the HTTP layer (watch.c's response_head, kept below as
 * a format string): those wire bytes must not change. Chunked bodies are
 * decoded by a small reader here, independent of proxy/http/.
 *
 * The loop runs with EVLOOP_NONBLOCK until nothing moves, bounded; waits
 * for a timer (the grace) run EVLOOP_ONCE bounded by a guard timer that
 * only fires when the server never acts; the second thread's stream is read
 * with poll() up to a deadline only reached when it is broken. Never a sleep.
 */
#include "kwc/http.h"

#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/gostr.h"
#include "tap.h"
#include "tlsfx.h"

#define DEADLINE_MS 20000 /* bound on reading the other thread's stream */
#define NOTE ((void *)(uintptr_t)0x5151)

/* The head watch.c wrote itself until the stream moved into proxy/http/:
 * version digit, Audit-Id, Content-Type, Date, framing. */
#define WATCH_HEAD                                                                                 \
    "HTTP/1.%d 200 OK\r\n"                                                                         \
    "Audit-Id: %s\r\n"                                                                             \
    "Cache-Control: no-cache, private\r\n"                                                         \
    "Content-Type: %s\r\n"                                                                         \
    "Date: %s\r\n"                                                                                 \
    "%s"                                                                                           \
    "Connection: close\r\n\r\n"
#define AUDIT "0b7d8a4e-1f2a-4c3b-9d5e-6f708192a3b4"

/* ---- what the stream's hooks saw ---- */

struct rec {
    struct gostr_buf log; /* "rel <tag>", "close <sent>" in order */
    int released, sent_calls, closed;
    size_t last_queued;
    uint64_t sent;
    int refs[64]; /* per tag: releases */
};

static void
r_release(void *arg, void *owner, uint32_t tag)
{
    struct rec *r = arg;
    if (owner != r || tag >= 64)
        abort(); /* a reference never given */
    r->released++;
    r->refs[tag]++;
    char b[32];
    snprintf(b, sizeof(b), "rel %u\n", (unsigned)tag);
    gostr_add(&r->log, b);
}

static void
r_sent(void *arg, size_t queued)
{
    struct rec *r = arg;
    r->sent_calls++;
    r->last_queued = queued;
}

static void
r_close(void *arg, uint64_t sent)
{
    struct rec *r = arg;
    r->closed++;
    r->sent = sent;
    gostr_add(&r->log, "close\n");
}

static const struct hstream_ops rec_ops = {
    .release = r_release, .on_sent = r_sent, .on_close = r_close};

static void
rec_fini(struct rec *r)
{
    free(r->log.p);
}

/* ---- the server side ---- */

struct fx {
    struct event_base *base;
    struct http_server *s;
    bool tls;
    struct hstream_handoff *h; /* /w's */
    int nreq, nclose, ndone;
    bool gone_tried; /* /gone: hresp_handoff from on_close */
    struct hstream_handoff *gone;
    SSL_CTX *cctx;
    struct tfx_cl c;     /* the client */
    const struct rec *r; /* the stream's hooks, during run() */
};

static void
h_close(void *arg)
{
    ((struct fx *)arg)->nclose++;
}

static const struct hreq_handler hooks = {.on_close = h_close};

/* /gone: the connection closes before the handler hands the response off. */
static struct hreq *gone_req;

static void
h_gone_close_handoff(void *arg)
{
    struct fx *f = arg;
    f->nclose++;
    f->gone_tried = true;
    hresp_start(gone_req, 200, -1);
    f->gone = hresp_handoff(gone_req);
}

static const struct hreq_handler gone_hooks = {.on_close = h_gone_close_handoff};

static void
on_done(void *arg, const struct hreq_done *d, void *note)
{
    struct fx *f = arg;
    f->ndone++;
    if (d->how == HREQ_END_TAKEN && note != NULL)
        abort(); /* the note moved to the handoff */
}

static void
on_request(void *arg, struct hreq *r)
{
    struct fx *f = arg;
    f->nreq++;
    size_t tl;
    const char *t = hreq_target(r, &tl);
    hreq_set_note(r, NOTE);
    if (strcmp(t, "/gone") == 0) {
        gone_req = r;
        hreq_set_handler(r, &gone_hooks, f);
        return;
    }
    hreq_set_handler(r, &hooks, f);
    /* what watch.c sets */
    hresp_header(r, "Audit-Id", AUDIT);
    hresp_header(r, "Cache-Control", "no-cache, private");
    hresp_header(r, "Content-Type", "application/json");
    hresp_close_after(r);
    hresp_start(r, 200, -1);
    f->h = hresp_handoff(r);
}

/* The next clients' max_fragment_length (RFC 6066: TLSEXT_max_fragment_length_*)
 * and newest TLS version; 0: OpenSSL's defaults. */
static uint8_t cl_mfl;
static int cl_max_version;

/* A server (plain or TLS) and one client connected to it; sndbuf > 0: the
 * server end's send buffer and the client's receive buffer (a slow network). */
static void
fx_init(struct fx *f, bool tls, int sndbuf, int grace_ms)
{
    *f = (struct fx){.tls = tls};
    f->base = event_base_new();
    struct http_server_options o = {.stream_grace_ms = grace_ms};
    if (tls) {
        o.tls_cert_file = tfx_cert_path;
        o.tls_key_file = tfx_key_path;
    }
    char err[256] = "";
    if (http_server_new(f->base, &o, on_request, f, &f->s, err, sizeof(err)) != 0) {
        printf("# http_server_new: %s\n", err);
        abort();
    }
    http_server_on_done(f->s, on_done, f);
    f->cctx = tls ? tfx_client_ctx() : NULL;
    if (f->cctx && cl_mfl)
        SSL_CTX_set_tlsext_max_fragment_length(f->cctx, cl_mfl);
    if (f->cctx && cl_max_version)
        SSL_CTX_set_max_proto_version(f->cctx, cl_max_version);
    int fd = tfx_cl_open(&f->c, f->cctx, NULL, 0);
    if (sndbuf > 0) {
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
        setsockopt(f->c.fd, SOL_SOCKET, SO_RCVBUF, &sndbuf, sizeof sndbuf);
    }
    http_server_adopt(f->s, fd, NULL, 0);
}

static unsigned long long
hooks_ran(void *arg)
{
    struct fx *f = arg;
    const struct rec *r = f->r;
    return (unsigned long long)f->nreq +
           (r ? (unsigned long long)(r->released + r->sent_calls + r->closed) : 0);
}

/* Loop turns until nothing moves on either side; r: the stream's hooks, or
 * NULL. */
static void
run(struct fx *f, const struct rec *r)
{
    f->r = r;
    tfx_run_quiet(f->base, &f->c, 1, hooks_ran, f);
    f->r = NULL;
}

static bool
rec_closed(void *arg)
{
    return ((const struct rec *)arg)->closed;
}

/* Run (EVLOOP_ONCE) until the stream closed, or the guard fires. */
static bool
run_until_closed(struct fx *f, struct rec *r)
{
    return tfx_wait(f->base, &f->c, 1, rec_closed, r);
}

/* The client asks for target (HTTP/1.1 or 1.0) and the server hands the
 * response off. */
static struct hstream_handoff *
request(struct fx *f, const char *target, bool http10)
{
    char req[256];
    snprintf(req, sizeof(req), "GET %s HTTP/1.%d\r\nHost: h\r\n\r\n", target, http10 ? 0 : 1);
    tfx_cl_sends(&f->c, req);
    run(f, NULL);
    struct hstream_handoff *h = f->h;
    f->h = NULL;
    return h;
}

static void
fx_fini(struct fx *f)
{
    tfx_cl_close(&f->c);
    SSL_CTX_free(f->cctx);
    run(f, NULL);
    http_server_free(f->s);
    is_int(f->nclose, f->nreq, "every request's on_close ran once");
    is_int(f->ndone, f->nreq, "...and its done callback");
    /* a TLS stream's socket closes from the loop's next turn */
    event_base_loop(f->base, EVLOOP_NONBLOCK);
    event_base_free(f->base);
    tfx_cl_fini(&f->c);
}

/* ---- reading what the client got ---- */

/* The head (up to the blank line) and the chunked body after it, decoded;
 * terminal: the zero chunk came. false when the framing is broken. */
static bool
split(const struct gostr_buf *in, size_t *head_len, struct gostr_buf *body, bool *terminal)
{
    *terminal = false;
    body->len = 0;
    const char *p = in->p ? in->p : "", *end = p + in->len;
    const char *e = memmem(p, in->len, "\r\n\r\n", 4);
    if (!e)
        return false;
    *head_len = (size_t)(e + 4 - p);
    p = e + 4;
    while (p < end) {
        char *x;
        unsigned long n = strtoul(p, &x, 16);
        if (x == p || end - x < 2 || x[0] != '\r' || x[1] != '\n')
            return false;
        p = x + 2;
        if (n == 0) {
            *terminal = end - p == 2 && p[0] == '\r' && p[1] == '\n';
            return *terminal;
        }
        if ((unsigned long)(end - p) < n + 2 || p[n] != '\r' || p[n + 1] != '\n')
            return false;
        gostr_addn(body, p, n);
        p += n + 2;
    }
    return true;
}

/* The head as watch.c wrote it, with the Date the client got. */
static void
want_head(const struct gostr_buf *in, bool http10, char *out, size_t n)
{
    const char *d = in->p ? memmem(in->p, in->len, "\r\nDate: ", 8) : NULL;
    char date[64] = "?";
    if (d) {
        const char *eol = memmem(d + 8, in->len - (size_t)(d + 8 - in->p), "\r\n", 2);
        if (eol && eol - (d + 8) < (ptrdiff_t)sizeof(date))
            snprintf(date, sizeof(date), "%.*s", (int)(eol - (d + 8)), d + 8);
    }
    struct tm tm;
    ok(strptime(date, "%a, %d %b %Y %H:%M:%S GMT", &tm) != NULL, "the Date is an IMF-fixdate");
    snprintf(out, n, WATCH_HEAD, http10 ? 0 : 1, AUDIT, "application/json", date,
             http10 ? "" : "Transfer-Encoding: chunked\r\n");
}

/* ---- the tests ---- */

static char blob[1 << 20]; /* the owner's bytes every reference points into */

/* The head: byte for byte the one watch.c sent, for HTTP/1.1 and 1.0; the
 * note, the connection count; then chunks, each reference released once
 * when its bytes left (not before), and the end. */
static void
head_and_chunks(bool tls, bool http10)
{
    struct fx f;
    fx_init(&f, tls, 0, 0);
    struct hstream_handoff *h = request(&f, "/w", http10);
    ok(h != NULL, "handed off");
    is_int(f.nclose, 1, "the request's on_close ran");
    ok(h && hstream_handoff_note(h) == NOTE, "the note moved to the handoff");
    ok(h && hstream_handoff_home(h) == NULL, "any loop may attach it");
    struct http_server_stats st;
    http_server_stats(f.s, &st);
    is_int(st.open, 0, "the server forgot the connection");
    is_int(st.taken, 1, "...which counts as taken");
    is_int(f.c.in.len, 0, "no byte left before the stream is attached");
    struct rec r = {0};
    struct hstream *s = h ? hstream_attach(h, f.base, &rec_ops, &r) : NULL;
    ok(s != NULL, "attached");
    if (!s) {
        fx_fini(&f);
        return;
    }
    memcpy(blob, "{\"a\":1}\n{\"b\":2}\n", 16);
    hstream_write_ref(s, &r, 1, blob, 8);
    hstream_write_ref(s, &r, 2, blob + 8, 8);
    hstream_write(s, "copied", 6);
    is_int(r.released, 0, "writes only queue");
    ok(hstream_queued(s) > 0, "...and count as queued");
    ok(hstream_flush(s), "flushed, still open");
    run(&f, &r);
    is_int(r.refs[1] + r.refs[2], 2, "each reference released once its bytes left");
    is_int(hstream_queued(s), 0, "nothing queued");
    /* TLS too: the stream writes its records itself, in the flush */
    is_int(r.sent_calls, 0, "no on_sent for bytes sent by the handler's own flush");
    char want[512];
    want_head(&f.c.in, http10, want, sizeof(want));
    size_t hl = strlen(want);
    is_mem(f.c.in.p ? f.c.in.p : "", f.c.in.len < hl ? f.c.in.len : hl, want, hl,
           "the head watch.c sent, byte for byte");
    const char *body = f.c.in.p ? f.c.in.p + hl : "";
    size_t bl = f.c.in.len > hl ? f.c.in.len - hl : 0;
    if (http10)
        is_mem(body, bl, "{\"a\":1}\n{\"b\":2}\ncopied", 22, "HTTP/1.0: the bytes as they are");
    else
        is_mem(body, bl, "8\r\n{\"a\":1}\n\r\n8\r\n{\"b\":2}\n\r\n6\r\ncopied\r\n", 37,
               "one chunk per write");
    size_t got = f.c.in.len;
    hstream_end(s);
    is_int(r.closed, 0, "hstream_end never closes inside");
    hstream_flush(s);
    run(&f, &r);
    if (http10)
        is_int(f.c.in.len, got, "HTTP/1.0: no terminal chunk");
    else
        is_mem(f.c.in.p + got, f.c.in.len - got, "0\r\n\r\n", 5, "the terminal chunk");
    ok(f.c.eof, "then the connection closes");
    if (tls)
        ok(f.c.close_notify, "TLS: ended with close_notify");
    is_int(r.closed, 1, "on_close once");
    is_int(r.sent, f.c.in.len, "...with every byte the client got (head, body, framing)");
    http_server_stats(f.s, &st);
    is_int(st.taken, 0, "closed: no longer taken");
    rec_fini(&r);
    fx_fini(&f);
}

static void
test_head_and_chunks(void)
{
    head_and_chunks(false, false);
    head_and_chunks(false, true);
    head_and_chunks(true, false);
    head_and_chunks(true, true);
}

/* A server and a client whose request for /w was handed off and attached
 * on the server's loop with r's hooks (fx_init's options). NULL when it was
 * not: a failed check, f finished. */
static struct hstream *
fx_stream(struct fx *f, struct rec *r, bool tls, int sndbuf, int grace_ms)
{
    fx_init(f, tls, sndbuf, grace_ms);
    struct hstream_handoff *h = request(f, "/w", false);
    *r = (struct rec){0};
    struct hstream *s = h ? hstream_attach(h, f->base, &rec_ops, r) : NULL;
    if (s)
        return s;
    ok(0, "attached");
    fx_fini(f);
    return NULL;
}

enum { NREF = 64, REF = 16384 };

/* Backpressure: a reader that stops lets the queue grow and hears nothing;
 * when it reads again, on_sent says how much is still queued, and every
 * byte arrives once, in order. */
static void
backpressure(bool tls)
{
    struct fx f;
    struct rec r;
    struct hstream *s = fx_stream(&f, &r, tls, 4096, 0);
    if (!s)
        return;
    for (size_t i = 0; i < sizeof(blob); i++)
        blob[i] = (char)('a' + i % 26);
    f.c.paused = true;
    for (int i = 0; i < NREF; i++)
        hstream_write_ref(s, &r, (uint32_t)i, blob + (size_t)i * REF, REF);
    size_t before = hstream_queued(s);
    ok(hstream_flush(s), "flushed");
    run(&f, &r);
    size_t stuck = hstream_queued(s);
    ok(stuck > 0 && stuck <= before, "the reader stopped: bytes stay queued");
    ok(r.released < NREF, "...and their references held");
    is_int(r.sent_calls, 0, "...and no on_sent");
    f.c.paused = false;
    run(&f, &r);
    ok(r.sent_calls > 0, "it reads again: on_sent");
    is_int(r.last_queued, 0, "...until nothing is queued");
    is_int(r.released, NREF, "every reference released");
    int twice = 0;
    for (int i = 0; i < NREF; i++)
        twice += r.refs[i] != 1;
    is_int(twice, 0, "...each once");
    size_t hl;
    bool term;
    struct gostr_buf b = {0};
    ok(split(&f.c.in, &hl, &b, &term) && !term, "chunked, not ended");
    ok(b.len == (size_t)NREF * REF && memcmp(b.p, blob, b.len) == 0, "every byte once, in order");
    free(b.p);
    hstream_close(s);
    run(&f, NULL);
    rec_fini(&r);
    fx_fini(&f);
}

static void
test_backpressure(void)
{
    backpressure(false);
    backpressure(true);
}

/* The client goes: queued references are released, then on_close once
 * with the bytes that left. */
static void
client_eof(bool tls)
{
    struct fx f;
    struct rec r;
    struct hstream *s = fx_stream(&f, &r, tls, 0, 0);
    if (!s)
        return;
    hstream_write_ref(s, &r, 1, blob, 10);
    hstream_flush(s);
    run(&f, &r);
    size_t got = f.c.in.len;
    hstream_write_ref(s, &r, 2, blob, 10); /* never flushed */
    tfx_cl_close(&f.c);
    run(&f, &r);
    is_int(r.closed, 1, "on_close once");
    is_str(r.log.p, "rel 1\nrel 2\nclose\n", "the unsent reference released before on_close");
    is_int(r.sent, got, "sent: what left");
    rec_fini(&r);
    fx_fini(&f);
}

static void
test_client_eof(void)
{
    client_eof(false);
    client_eof(true);
}

/* An ended stream whose client does not read closes after the grace, its
 * references released. */
static void
grace(bool tls)
{
    struct fx f;
    struct rec r;
    struct hstream *s = fx_stream(&f, &r, tls, 4096, 50);
    if (!s)
        return;
    f.c.paused = true;
    for (int i = 0; i < NREF; i++)
        hstream_write_ref(s, &r, (uint32_t)i, blob, REF);
    hstream_end(s);
    ok(hstream_flush(s), "ended, bytes still queued: open");
    run(&f, &r);
    is_int(r.closed, 0, "still open while within the grace");
    ok(run_until_closed(&f, &r), "closed when the grace ran out");
    is_int(r.released, NREF, "every reference released");
    ok(r.sent < (uint64_t)NREF * REF, "sent: only what left");
    rec_fini(&r);
    fx_fini(&f);
}

static void
test_grace(void)
{
    grace(false);
    grace(true);
}

/* hstream_close: one last try, every reference released, no on_close. */
static void
closing(bool tls)
{
    struct fx f;
    struct rec r;
    struct hstream *s = fx_stream(&f, &r, tls, 0, 0);
    if (!s)
        return;
    hstream_write_ref(s, &r, 1, blob, 5);
    hstream_write_ref(s, &r, 2, blob, 5);
    hstream_end(s);
    uint64_t sent = hstream_close(s);
    is_int(r.released, 2, "every reference released");
    is_int(r.closed, 0, "no on_close");
    run(&f, &r);
    ok(f.c.eof, "the client sees the close");
    if (tls)
        ok(f.c.close_notify, "TLS: with close_notify");
    is_int(sent, f.c.in.len, "returns what was sent: all of it (the socket had room)");
    size_t hl;
    bool term;
    struct gostr_buf b = {0};
    ok(split(&f.c.in, &hl, &b, &term) && term && b.len == 10, "the chunks and the terminal chunk");
    free(b.p);
    rec_fini(&r);
    fx_fini(&f);
}

static void
test_close(void)
{
    closing(false);
    closing(true);
}

/* The handoff crosses threads: attached on a second loop run by a second
 * thread, which writes, ends and runs until the stream closed. */
struct other {
    struct hstream_handoff *h;
    struct event_base *base;
    struct rec r;
    bool attached;
};

static void *
other_main(void *arg)
{
    struct other *o = arg;
    o->base = event_base_new();
    struct hstream *s = hstream_attach(o->h, o->base, &rec_ops, &o->r);
    o->attached = s != NULL;
    if (s) {
        for (int i = 0; i < 8; i++)
            hstream_write_ref(s, &o->r, (uint32_t)i, blob + i * 100, 100);
        hstream_end(s);
        if (hstream_flush(s))
            event_base_dispatch(o->base); /* until the stream's events are gone */
    }
    event_base_loop(o->base, EVLOOP_NONBLOCK); /* a TLS socket's deferred close */
    event_base_free(o->base);
    return NULL;
}

static uint64_t
now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void
other_thread(bool tls)
{
    struct fx f;
    fx_init(&f, tls, 0, 0);
    struct other o = {.h = request(&f, "/w", false)};
    if (!o.h) {
        ok(0, "handed off");
        fx_fini(&f);
        return;
    }
    for (size_t i = 0; i < 800; i++)
        blob[i] = (char)('A' + i % 26);
    pthread_t t;
    if (pthread_create(&t, NULL, other_main, &o) != 0)
        abort();
    uint64_t end = now_ms() + DEADLINE_MS;
    while (!f.c.eof && now_ms() < end) {
        tfx_cl_pump(&f.c);
        struct pollfd pf = {.fd = f.c.fd, .events = POLLIN};
        poll(&pf, 1, 100); /* the other thread's bytes */
    }
    pthread_join(t, NULL);
    ok(o.attached, "attached on the other loop");
    ok(f.c.eof, "the client read to the end");
    size_t hl;
    bool term;
    struct gostr_buf b = {0};
    ok(split(&f.c.in, &hl, &b, &term) && term, "the head, chunks, the terminal chunk");
    ok(b.len == 800 && memcmp(b.p, blob, 800) == 0, "every byte, in order");
    free(b.p);
    is_int(o.r.released, 8, "every reference released on the other thread");
    is_int(o.r.closed, 1, "on_close once there");
    is_int(o.r.sent, f.c.in.len, "...with every byte the client got");
    struct http_server_stats st;
    http_server_stats(f.s, &st);
    is_int(st.taken, 0, "released from the connection count");
    rec_fini(&o.r);
    fx_fini(&f);
}

static void
test_other_thread(void)
{
    other_thread(false);
    other_thread(true);
}

/* ---- records and framing (issue 22, D1 and D2) ---- */

/* The client counts the application-data records it receives (TLS 1.3:
 * each record's inner content type). */
static void
on_record(int write_p, int version, int content_type, const void *buf, size_t len, SSL *ssl,
          void *arg)
{
    if (!write_p && content_type == SSL3_RT_INNER_CONTENT_TYPE && len == 1 &&
        *(const unsigned char *)buf == SSL3_RT_APPLICATION_DATA)
        (*(int *)arg)++;
}

/* A reference's bytes framed once in their own room (as the hub frames a
 * blob): the chunk header before p, the trailer after. */
struct framed {
    char room[HSTREAM_FRAME_HEAD + 65536 + HSTREAM_FRAME_TAIL];
};

static const char *
framed_fill(struct framed *fb, const char *p, size_t n)
{
    char *at = fb->room + HSTREAM_FRAME_HEAD;
    memcpy(at, p, n);
    hstream_frame(at, n);
    return at;
}

static void
test_frame(void)
{
    struct framed fb;
    memset(fb.room, '.', sizeof(fb.room));
    const char *p = framed_fill(&fb, "hello", 5);
    is_mem(p - 3, 3 + 5 + 2, "5\r\nhello\r\n", 10, "hstream_frame: the chunk around the bytes");
    ok(p[-4] == '.', "...and nothing before its header");
    p = framed_fill(&fb, blob, 65536);
    is_mem(p - 7, 7, "10000\r\n", 7, "a longer header ends right before p");
    is_mem(p + 65536, 2, "\r\n", 2, "the trailer right after p + n");
}

/* Several writes, one flush: one TLS record carrying them all (the head
 * too); a flush of more than a record's worth: full records. */
static void
test_records(void)
{
    struct fx f;
    struct rec r;
    struct hstream *s = fx_stream(&f, &r, true, 0, 0);
    if (!s)
        return;
    int records = 0;
    SSL_set_msg_callback(f.c.ssl, on_record);
    SSL_set_msg_callback_arg(f.c.ssl, &records);
    for (size_t i = 0; i < sizeof(blob); i++)
        blob[i] = (char)('a' + i % 26);
    for (int i = 0; i < 8; i++)
        hstream_write_ref(s, &r, (uint32_t)i, blob + i * 1000, 1000);
    hstream_write(s, "copied", 6);
    hstream_flush(s);
    run(&f, &r);
    is_int(records, 1, "the head and nine writes, one flush: one record");
    is_int(r.released, 8, "every reference released");
    size_t hl;
    bool term;
    struct gostr_buf b = {0};
    ok(split(&f.c.in, &hl, &b, &term) && b.len == 8006 && memcmp(b.p, blob, 8000) == 0 &&
           memcmp(b.p + 8000, "copied", 6) == 0,
       "...every byte in order");
    /* 40 events of 1 KiB (41,160 bytes framed): three records */
    records = 0;
    for (int i = 0; i < 40; i++)
        hstream_write_ref(s, &r, (uint32_t)(i + 8), blob + i * 1024, 1024);
    hstream_flush(s);
    run(&f, &r);
    is_int(records, 3, "41,160 bytes in one flush: three records of up to 16 KiB");
    /* one framed reference of 40,000 bytes: straight from its bytes */
    static struct framed fb;
    records = 0;
    hstream_write_framed_ref(s, &r, 60, framed_fill(&fb, blob, 40000), 40000);
    hstream_flush(s);
    run(&f, &r);
    is_int(records, 3, "a framed reference of 40,008 bytes: three records");
    ok(split(&f.c.in, &hl, &b, &term) && b.len == 8006 + 40 * 1024 + 40000 &&
           memcmp(b.p + 8006 + 40 * 1024, blob, 40000) == 0,
       "...its bytes once, in order");
    is_int(r.released, 49, "every reference released");
    free(b.p);
    hstream_close(s);
    rec_fini(&r);
    fx_fini(&f);
}

/* Framed references put the same bytes on the wire as unframed ones:
 * HTTP/1.1 chunks (plain, TLS), HTTP/1.0 the bytes alone. */
static void
framed_same(bool tls, bool http10)
{
    struct gostr_buf got[2] = {{0}, {0}};
    static struct framed fb[4];
    for (int framed = 0; framed < 2; framed++) {
        struct fx f;
        fx_init(&f, tls, 0, 0);
        struct hstream_handoff *h = request(&f, "/w", http10);
        struct rec r = {0};
        struct hstream *s = h ? hstream_attach(h, f.base, &rec_ops, &r) : NULL;
        if (!s) {
            ok(0, "attached");
            fx_fini(&f);
            return;
        }
        size_t len[4] = {1, 15, 16, 20000};
        for (int i = 0; i < 4; i++) {
            const char *p = blob + 100 * i;
            if (framed)
                hstream_write_framed_ref(s, &r, (uint32_t)i, framed_fill(&fb[i], p, len[i]),
                                         len[i]);
            else
                hstream_write_ref(s, &r, (uint32_t)i, p, len[i]);
            if (i == 1)
                hstream_write(s, "own", 3);
        }
        hstream_end(s);
        hstream_flush(s);
        run_until_closed(&f, &r);
        is_int(r.released, 4, "every reference released once");
        is_int(r.sent, f.c.in.len, "sent: every byte");
        const char *e = memmem(f.c.in.p, f.c.in.len, "\r\n\r\n", 4);
        if (e) /* the body (the head's Date may differ) */
            gostr_addn(&got[framed], e + 4, f.c.in.len - (size_t)(e + 4 - f.c.in.p));
        rec_fini(&r);
        fx_fini(&f);
    }
    ok(got[0].len > 20000, "a body came");
    is_mem(got[1].p, got[1].len, got[0].p, got[0].len,
           "framed references: the bytes of unframed ones");
    free(got[0].p);
    free(got[1].p);
}

static void
test_framed_same(void)
{
    framed_same(false, false);
    framed_same(false, true);
    framed_same(true, false);
    framed_same(true, true);
}

/* A stalled TLS reader with small events (records gathered from several)
 * and with large framed ones (records straight from their bytes): the
 * queue grows, a record the socket could not take stays sealed and is
 * retried from another buffer (the scratch, which a second stream on the
 * same thread fills meanwhile), on_sent when it drains, every byte once
 * in order, every reference released once. */
static void
stalled_tls(bool small)
{
    struct fx f, g;
    struct rec r, q;
    struct hstream *s = fx_stream(&f, &r, true, 4096, 0);
    struct hstream *t = s ? fx_stream(&g, &q, true, 0, 0) : NULL;
    if (!t) {
        if (s) {
            hstream_close(s);
            fx_fini(&f);
        }
        return;
    }
    for (size_t i = 0; i < sizeof(blob); i++)
        blob[i] = (char)('a' + i % 26);
    static struct framed fb[8];
    enum { NSMALL = 600, SMALL = 1000, NBIG = 8, BIG = 40000 };
    int n = small ? NSMALL : NBIG;
    size_t total = 0;
    if (!small) {
        /* the head leaves first: the first record of the stall is then
         * straight from a framed reference's bytes */
        hstream_flush(s);
        run(&f, &r);
    }
    f.c.paused = true;
    for (int i = 0; i < n; i++) {
        if (small) {
            hstream_write_ref(s, &r, (uint32_t)(i % 64), blob + (size_t)i * SMALL, SMALL);
            total += SMALL;
        } else {
            const char *p = framed_fill(&fb[i], blob + (size_t)i * BIG, BIG);
            hstream_write_framed_ref(s, &r, (uint32_t)i, p, BIG);
            total += BIG;
        }
    }
    size_t before = hstream_queued(s);
    ok(hstream_flush(s), "flushed");
    run(&f, &r);
    size_t stuck = hstream_queued(s);
    ok(stuck > 0 && stuck <= before, "the reader stopped: bytes stay queued");
    ok(r.released < n, "...and their references held");
    is_int(r.sent_calls, 0, "...and no on_sent");
    ok(hstream_flush(s), "a flush while the socket is full: a no-op");
    /* another stream of this thread gathers records through the scratch */
    for (int i = 0; i < 64; i++)
        hstream_write_ref(t, &q, (uint32_t)i, blob + 500000 + (size_t)i * 100, 100);
    hstream_flush(t);
    run(&g, &q);
    is_int(q.released, 64, "a second stream's gathered records left meanwhile");
    f.c.paused = false;
    run(&f, &r);
    ok(r.sent_calls > 0, "it reads again: on_sent");
    is_int(r.last_queued, 0, "...until nothing is queued");
    is_int(r.released, n, "every reference released");
    size_t hl;
    bool term;
    struct gostr_buf b = {0};
    ok(split(&f.c.in, &hl, &b, &term) && !term, "chunked, not ended");
    ok(b.len == total && memcmp(b.p, blob, b.len) == 0, "every byte once, in order");
    free(b.p);
    b = (struct gostr_buf){0};
    ok(split(&g.c.in, &hl, &b, &term) && b.len == 6400 && memcmp(b.p, blob + 500000, 100) == 0,
       "...and the second stream's");
    free(b.p);
    hstream_close(t);
    hstream_close(s);
    rec_fini(&r);
    rec_fini(&q);
    fx_fini(&g);
    fx_fini(&f);
}

static void
test_stalled_tls(void)
{
    stalled_tls(true);
    stalled_tls(false);
}

/* hstream_close while a sealed record waits for the socket: every
 * reference released once, no on_close, sent counts what the client can
 * read (the pending record is not in it). */
static void
test_close_pending(void)
{
    struct fx f;
    struct rec r;
    struct hstream *s = fx_stream(&f, &r, true, 4096, 0);
    if (!s)
        return;
    f.c.paused = true;
    for (int i = 0; i < 64; i++)
        hstream_write_ref(s, &r, (uint32_t)i, blob + i * 1000, 1000);
    hstream_flush(s);
    run(&f, &r);
    ok(hstream_queued(s) > 0, "the reader stopped");
    uint64_t sent = hstream_close(s);
    is_int(r.released, 64, "close: every reference released");
    int twice = 0;
    for (int i = 0; i < 64; i++)
        twice += r.refs[i] != 1;
    is_int(twice, 0, "...each once");
    is_int(r.closed, 0, "no on_close");
    f.c.paused = false;
    run(&f, &r);
    ok(f.c.eof, "the client sees the close");
    ok(!f.c.close_notify, "...without close_notify (a record was cut)");
    is_int(sent, f.c.in.len, "sent: what the client could read");
    rec_fini(&r);
    fx_fini(&f);
}

/* An error some other code left in the thread's OpenSSL error queue does
 * not close a TLS stream: neither when its SSL_write succeeds nor when the
 * socket is full (SSL_get_error would read the stale entry and call a
 * WANT_WRITE fatal); every byte arrives once the reader reads again. */
static void
test_stale_error(void)
{
    struct fx f;
    struct rec r;
    struct hstream *s = fx_stream(&f, &r, true, 4096, 0);
    if (!s)
        return;
    for (size_t i = 0; i < sizeof(blob); i++)
        blob[i] = (char)('a' + i % 26);
    ERR_raise(ERR_LIB_SSL, SSL_R_BAD_LENGTH);
    hstream_write_ref(s, &r, 0, blob, 100);
    ok(hstream_flush(s), "a flush with a stale error queued");
    run(&f, &r);
    is_int(r.closed, 0, "...does not close the stream");
    is_int(r.released, 1, "...and its record left");
    f.c.paused = true;
    for (int i = 1; i < 64; i++)
        hstream_write_ref(s, &r, (uint32_t)i, blob + (size_t)i * 16384, 16384);
    ERR_raise(ERR_LIB_SSL, SSL_R_BAD_LENGTH);
    ok(hstream_flush(s), "a flush into a full socket with a stale error queued");
    ok(hstream_queued(s) > 0, "...the socket is full");
    is_int(r.closed, 0, "...and the stream stays");
    f.c.paused = false;
    run(&f, &r);
    is_int(r.closed, 0, "the reader reads again: the stream still open");
    is_int(r.released, 64, "every reference released");
    size_t hl;
    bool term;
    struct gostr_buf b = {0};
    ok(split(&f.c.in, &hl, &b, &term) && !term, "chunked, not ended");
    ok(b.len == 100 + 63 * 16384 && memcmp(b.p, blob, 100) == 0 &&
           memcmp(b.p + 100, blob + 16384, 63 * 16384) == 0,
       "every byte once, in order");
    free(b.p);
    hstream_close(s);
    rec_fini(&r);
    fx_fini(&f);
}

/* A stalled TLS reader whose client changes keys (TLS 1.3 KeyUpdate,
 * update_requested) or makes records small (max_fragment_length 512), or
 * speaks TLS 1.2: the sealed record still goes first, the server's own
 * KeyUpdate after it, every byte once, in order, nothing closed. */
static char wbuf[160];
#define W(x) (snprintf(wbuf, sizeof(wbuf), "%s: %s", what, (x)), wbuf)

static void
stalled_peer(const char *what, bool keyupdate)
{
    struct fx f;
    struct rec r;
    struct hstream *s = fx_stream(&f, &r, true, 4096, 0);
    if (!s)
        return;
    for (size_t i = 0; i < sizeof(blob); i++)
        blob[i] = (char)('a' + i % 26);
    static struct framed fb[4];
    size_t total = 0;
    f.c.paused = true;
    for (int i = 0; i < 60; i++) {
        if (i % 15 == 14) {
            const char *p = framed_fill(&fb[i / 15], blob + total, 30000);
            hstream_write_framed_ref(s, &r, (uint32_t)i, p, 30000);
            total += 30000;
        } else {
            hstream_write_ref(s, &r, (uint32_t)i, blob + total, 700);
            total += 700;
        }
    }
    ok(hstream_flush(s), W("flushed"));
    run(&f, &r);
    ok(hstream_queued(s) > 0, W("the reader stopped"));
    if (keyupdate) {
        ok(SSL_key_update(f.c.ssl, SSL_KEY_UPDATE_REQUESTED) == 1, W("the client asks"));
        tfx_cl_sends(&f.c, "x"); /* the KeyUpdate goes with the client's next record */
        run(&f, &r);
        is_int(tfx_cl_unread(&f.c), 0, W("the server read it"));
    }
    is_int(r.closed, 0, W("the stream stays"));
    f.c.paused = false;
    run(&f, &r);
    is_int(r.closed, 0, W("it reads again: still open"));
    is_int(r.released, 60, W("every reference released"));
    is_int(r.last_queued, 0, W("nothing queued"));
    size_t hl;
    bool term;
    struct gostr_buf b = {0};
    ok(split(&f.c.in, &hl, &b, &term) && !term, W("chunked, not ended"));
    ok(b.len == total && memcmp(b.p, blob, b.len) == 0, W("every byte once, in order"));
    free(b.p);
    if (keyupdate) {
        /* and after the server's KeyUpdate, more records under the new keys */
        hstream_write_ref(s, &r, 61, blob, 100);
        hstream_flush(s);
        run(&f, &r);
        is_int(r.released, 61, W("a write after the key change left"));
        is_int(r.closed, 0, W("...the stream still open"));
    }
    hstream_close(s);
    rec_fini(&r);
    fx_fini(&f);
}

static void
test_stalled_peer(void)
{
    stalled_peer("keyupdate", true);
    cl_mfl = TLSEXT_max_fragment_length_512;
    stalled_peer("mfl 512", false);
    stalled_peer("mfl 512, keyupdate", true);
    cl_mfl = 0;
    cl_max_version = TLS1_2_VERSION;
    stalled_peer("TLS 1.2", false);
    cl_mfl = TLSEXT_max_fragment_length_1024;
    stalled_peer("TLS 1.2, mfl 1024", false);
    cl_mfl = 0;
    cl_max_version = 0;
}

/* A connection gone before the handoff: NULL. Gone between handoff and
 * attach: the stream attaches and closes at once, with nothing sent. */
static void
test_gone(void)
{
    struct fx f;
    fx_init(&f, false, 0, 0);
    tfx_cl_sends(&f.c, "GET /gone HTTP/1.1\r\nHost: h\r\n\r\n");
    run(&f, NULL);
    tfx_cl_close(&f.c);
    run(&f, NULL);
    ok(f.gone_tried, "the handler tried once the connection had closed");
    ok(f.gone == NULL, "hresp_handoff: NULL");
    struct http_server_stats st;
    http_server_stats(f.s, &st);
    is_int(st.taken, 0, "nothing taken");
    fx_fini(&f);

    fx_init(&f, false, 0, 0);
    struct hstream_handoff *h = request(&f, "/w", false);
    tfx_cl_close(&f.c);
    run(&f, NULL);
    struct rec r = {0};
    struct hstream *s = h ? hstream_attach(h, f.base, &rec_ops, &r) : NULL;
    ok(s != NULL, "a handoff whose client left still attaches");
    if (s) {
        hstream_write_ref(s, &r, 1, blob, 3);
        run(&f, &r);
    }
    is_int(r.closed, 1, "...and closes from the loop");
    is_int(r.released, 1, "...its reference released");
    is_int(r.sent, 0, "...nothing sent");
    http_server_stats(f.s, &st);
    is_int(st.taken, 0, "released from the connection count");
    rec_fini(&r);
    fx_fini(&f);

    /* a handoff never attached */
    fx_init(&f, false, 0, 0);
    h = request(&f, "/w", false);
    http_server_stats(f.s, &st);
    is_int(st.taken, 1, "a handoff in transit counts");
    hstream_handoff_free(h);
    http_server_stats(f.s, &st);
    is_int(st.taken, 0, "...until freed");
    run(&f, NULL);
    ok(f.c.eof, "the client sees the close");
    fx_fini(&f);
}

int
main(void)
{
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    tfx_dir_open("hstream_test");
    tfx_write_pair("kwc", NULL);
    TAP_RUN(test_head_and_chunks);
    TAP_RUN(test_backpressure);
    TAP_RUN(test_client_eof);
    TAP_RUN(test_grace);
    TAP_RUN(test_close);
    TAP_RUN(test_other_thread);
    TAP_RUN(test_gone);
    TAP_RUN(test_frame);
    TAP_RUN(test_records);
    TAP_RUN(test_framed_same);
    TAP_RUN(test_stalled_tls);
    TAP_RUN(test_close_pending);
    TAP_RUN(test_stale_error);
    TAP_RUN(test_stalled_peer);
    tfx_dir_close();
    return tap_done();
}
