/*
 * hpipe_test.c — proxy/http/hpipe.c: the byte pipe an Upgrade's connection
 * becomes (hreq_take_pipe), plaintext and TLS alike: every test runs over
 * both.
 *
 *  - the bytes the client sent behind its request (head and body) are the
 *    first in the pipe's input, announced by on_read from the loop, never
 *    inside hreq_take_pipe; bytes then flow both ways, byte for byte;
 *  - flow control: with reading off the client's bytes stay in the kernel
 *    (its socket's send queue), and on reads them again; on_drain comes
 *    when the queue towards the client falls to the low-water mark;
 *  - the client's EOF comes after every byte it sent before it (even when
 *    reading was off), and writing still works after it; a failed
 *    connection (writing to a closed peer, TLS garbage) is on_error;
 *  - the connection and a socket counted with hreq_count_socket count
 *    against max_connections until hpipe_free, which releases them at once
 *    and closes the client's connection;
 *  - a request that cannot become a pipe (no upgrade, its body unread) is
 *    refused: NULL, the connection closed, on_close ran.
 *
 * The server adopts one end of a socketpair(AF_UNIX); the test is the
 * client on the other (a plain socket, or an SSL object pumped between loop
 * turns, with a self-signed certificate: tlsfx.h). The loop runs
 * non-blocking turns until nothing moves (bounded). Never a sleep.
 */
#include "kwc/http.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/gostr.h"
#include "tap.h"
#include "tlsfx.h"

#define MAX_CL 4
#define BIG (1024 * 1024)

static bool tls_on; /* the run in progress */

/* ---- the handler ----
 *   /now...    hreq_take_pipe from on_request
 *   /later...  held (its body read) until the test calls take()
 *   with "count" in the target: hreq_count_socket first
 *   anything else: 200 "ok"
 * The pipe's hooks log in order ("close", "taken", "read <n>", "drain",
 * "eof", "error"); on_read consumes the input into got unless hold_input.
 */

struct fx {
    struct event_base *base;
    struct http_server *s;
    SSL_CTX *cctx;
    struct tfx_cl c[MAX_CL];
    int nc;
    /* the handler's */
    struct hreq *held;
    struct hpipe *p;
    struct gostr_buf log, got, body;
    unsigned long long hooks;
    int nreq, nclose, ndrain;
    bool hold_input, free_at_eof, taken_null;
    size_t drain_queued; /* hpipe_queued at the last on_drain */
};

static void
logf_(struct fx *f, const char *s)
{
    gostr_addn(&f->log, s, strlen(s));
    gostr_addn(&f->log, "\n", 1);
    f->hooks++;
}

static const char *
log_str(struct fx *f)
{
    gostr_addn(&f->log, "", 1);
    f->log.len--;
    return f->log.p;
}

static void
p_read(void *arg)
{
    struct fx *f = arg;
    struct evbuffer *in = hpipe_input(f->p);
    char m[64];
    snprintf(m, sizeof(m), "read %zu", evbuffer_get_length(in));
    logf_(f, m);
    if (f->hold_input)
        return;
    size_t n = evbuffer_get_length(in);
    char *b = xmalloc(n ? n : 1);
    evbuffer_remove(in, b, n);
    gostr_addn(&f->got, b, n);
    free(b);
}

static void
p_drain(void *arg)
{
    struct fx *f = arg;
    f->ndrain++;
    f->drain_queued = hpipe_queued(f->p);
    f->hooks++;
}

static void
p_eof(void *arg)
{
    struct fx *f = arg;
    logf_(f, "eof");
    if (f->free_at_eof) {
        hpipe_free(f->p);
        f->p = NULL;
    }
}

static void
p_error(void *arg)
{
    struct fx *f = arg;
    logf_(f, "error");
    hpipe_free(f->p);
    f->p = NULL;
}

static const struct hpipe_ops pops = {
    .on_read = p_read,
    .on_drain = p_drain,
    .on_eof = p_eof,
    .on_error = p_error,
};

static void
h_body(void *arg, const char *p, size_t n)
{
    struct fx *f = arg;
    gostr_addn(&f->body, p, n);
    f->hooks++;
}

static void
h_close(void *arg)
{
    struct fx *f = arg;
    f->nclose++;
    if (f->held)
        f->held = NULL;
    logf_(f, "close");
}

static const struct hreq_handler hooks = {.on_body = h_body, .on_close = h_close};

static void
take(struct fx *f, struct hreq *r)
{
    f->p = hreq_take_pipe(r, &pops, f);
    f->taken_null = f->p == NULL;
    logf_(f, f->p ? "taken" : "taken NULL");
}

static void
on_request(void *arg, struct hreq *r)
{
    struct fx *f = arg;
    f->nreq++;
    hreq_set_handler(r, &hooks, f);
    const char *t = hreq_target(r, NULL);
    if (strstr(t, "count"))
        hreq_count_socket(r);
    if (strncmp(t, "/now", 4) == 0) {
        take(f, r);
    } else if (strncmp(t, "/later", 6) == 0) {
        f->held = r;
        hreq_body_read(r, true);
    } else {
        hresp_simple(r, 200, "text/plain", "ok", 2);
    }
}

/* ---- the fixture ---- */

static void
fx_init(struct fx *f, unsigned max_connections)
{
    *f = (struct fx){0};
    f->base = event_base_new();
    struct http_server_options o = {.max_connections = max_connections};
    if (tls_on) {
        o.tls_cert_file = tfx_cert_path;
        o.tls_key_file = tfx_key_path;
    }
    char err[512] = "";
    if (http_server_new(f->base, &o, on_request, f, &f->s, err, sizeof(err)) != 0) {
        printf("# http_server_new: %s\n", err);
        abort();
    }
    f->cctx = tfx_client_ctx();
}

static int
fx_connect(struct fx *f)
{
    if (f->nc == MAX_CL)
        abort();
    int fd = tfx_cl_open(&f->c[f->nc], tls_on ? f->cctx : NULL, NULL, 0);
    http_server_adopt(f->s, fd, NULL, 0);
    return f->nc++;
}

static unsigned long long
hooks_ran(void *arg)
{
    return ((struct fx *)arg)->hooks;
}

/* Run until nothing moves. */
static void
run(struct fx *f)
{
    tfx_run_quiet(f->base, f->c, f->nc, hooks_ran, f);
}

static void
fx_fini(struct fx *f)
{
    hpipe_free(f->p);
    f->p = NULL;
    for (int i = 0; i < f->nc; i++)
        tfx_cl_close(&f->c[i]);
    run(f);
    http_server_free(f->s);
    is_int(f->nclose, f->nreq, "every request's on_close ran once");
    for (int i = 0; i < TFX_QUIET_TURNS; i++)
        event_base_loop(f->base, EVLOOP_NONBLOCK); /* hpipe_free's deferred close */
    for (int i = 0; i < f->nc; i++)
        tfx_cl_fini(&f->c[i]);
    free(f->log.p);
    free(f->got.p);
    free(f->body.p);
    SSL_CTX_free(f->cctx);
    event_base_free(f->base);
}

static unsigned long long
taken(struct fx *f)
{
    struct http_server_stats st;
    http_server_stats(f->s, &st);
    return st.taken;
}

#define UPGRADE "Host: h\r\nConnection: Upgrade\r\nUpgrade: tunnel\r\n"

/* A server and one client (*a) whose request became a pipe in on_request.
 * false when no pipe came of it: a failed check, f finished. */
static bool
fx_pipe(struct fx *f, int *a)
{
    fx_init(f, 0);
    *a = fx_connect(f);
    tfx_cl_sends(&f->c[*a], "GET /now HTTP/1.1\r\n" UPGRADE "\r\n");
    run(f);
    if (f->p)
        return true;
    ok(0, "taken");
    fx_fini(f);
    return false;
}

/* The pipe's input, not consumed ("" when none). */
static const char *
input(struct fx *f, size_t *n)
{
    struct evbuffer *in = f->p ? hpipe_input(f->p) : NULL;
    *n = in ? evbuffer_get_length(in) : 0;
    return *n ? (const char *)evbuffer_pullup(in, -1) : "";
}

/* ---- tests ---- */

/* The bytes behind the request come first, from the loop; then both ways. */
static void
test_bytes_behind_and_both_ways(void)
{
    struct fx f;
    fx_init(&f, 0);
    int a = fx_connect(&f);
    tfx_cl_sends(&f.c[a], "POST /later HTTP/1.1\r\n" UPGRADE "Content-Length: 4\r\n\r\nbodyBEHIND");
    run(&f);
    ok(f.held != NULL, "the request is held");
    is_mem(f.body.p, f.body.len, "body", 4, "its body went to the handler");
    is_int(f.c[a].in.len, 0, "nothing answered yet");
    f.hold_input = true;
    if (f.held)
        take(&f, f.held);
    is_str(log_str(&f), "close\ntaken\n", "r's on_close ran inside; nothing read inside");
    run(&f);
    is_str(log_str(&f), "close\ntaken\nread 6\n", "on_read from the loop");
    size_t n;
    const char *in = input(&f, &n);
    is_mem(in, n, "BEHIND", 6, "the bytes behind the body, unparsed, first in the input");
    f.hold_input = false;
    /* the client's next bytes: after those */
    static char big[BIG];
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (char)('a' + i % 26);
    tfx_cl_send(&f.c[a], big, sizeof(big));
    run(&f);
    ok(f.got.len == 6 + sizeof(big) && memcmp(f.got.p, "BEHIND", 6) == 0 &&
           memcmp(f.got.p + 6, big, sizeof(big)) == 0,
       "client -> pipe: every byte, in order");
    /* the other way */
    if (f.p) {
        hpipe_write(f.p, "hello ", 6);
        struct evbuffer *b = evbuffer_new();
        evbuffer_add(b, big, sizeof(big));
        hpipe_write_buffer(f.p, b);
        is_int(evbuffer_get_length(b), 0, "hpipe_write_buffer moves the bytes");
        evbuffer_free(b);
    }
    run(&f);
    ok(f.c[a].in.len == 6 + sizeof(big) && memcmp(f.c[a].in.p, "hello ", 6) == 0 &&
           memcmp(f.c[a].in.p + 6, big, sizeof(big)) == 0,
       "pipe -> client: every byte, in order, nothing of HTTP's");
    is_int(f.p ? hpipe_queued(f.p) : 1, 0, "queue empty");
    ok(f.ndrain > 0, "on_drain once the queue emptied (low water 0)");
    is_int(f.nreq, 1, "the bytes behind were never a request");
    fx_fini(&f);
}

/* Taken inside on_request: what followed the head comes with the pipe. */
static void
test_take_in_on_request(void)
{
    struct fx f;
    fx_init(&f, 0);
    int a = fx_connect(&f);
    f.hold_input = true;
    tfx_cl_sends(&f.c[a], "GET /now HTTP/1.1\r\n" UPGRADE "\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n");
    run(&f);
    is_str(log_str(&f), "close\ntaken\nread 27\n", "taken, then on_read");
    size_t n;
    const char *in = input(&f, &n);
    is_mem(in, n, "GET / HTTP/1.1\r\nHost: h\r\n\r\n", 27, "the next request's bytes, unparsed");
    is_int(f.nreq, 1, "one request");
    is_int(f.c[a].in.len, 0, "nothing answered");
    fx_fini(&f);
}

/* Flow control both ways. */
static void
test_flow_control(void)
{
    struct fx f;
    int a;
    if (!fx_pipe(&f, &a))
        return;
    ok(f.p != NULL, "taken");
    /* reading off: the client's bytes stay in the kernel */
    hpipe_read(f.p, false);
    hpipe_read(f.p, false); /* twice: no change */
    size_t before = f.log.len;
    tfx_cl_sends(&f.c[a], "0123456789");
    run(&f);
    ok(f.log.len == before, "reading off: no on_read");
    is_int(f.got.len, 0, "reading off: nothing delivered");
    is_int(evbuffer_get_length(hpipe_input(f.p)), 0, "reading off: nothing in the input");
    ok(tfx_cl_unread(&f.c[a]) >= 10, "reading off: the bytes wait in the client's socket");
    hpipe_read(f.p, true);
    run(&f);
    is_mem(f.got.p ? f.got.p : "", f.got.len, "0123456789", 10, "reading on: delivered");
    is_int(tfx_cl_unread(&f.c[a]), 0, "reading on: the socket read");

    /* bytes left in the input when reading is turned off and on again are
     * announced again */
    f.hold_input = true;
    tfx_cl_sends(&f.c[a], "abc");
    run(&f);
    hpipe_read(f.p, false);
    f.hold_input = false;
    size_t reads = f.log.len;
    hpipe_read(f.p, true);
    ok(f.log.len == reads, "reading on: not announced inside the call");
    run(&f);
    is_mem(f.got.p ? f.got.p + 10 : "", f.got.len - 10, "abc", 3,
           "bytes left in the input: announced from the loop when reading is on again");

    /* towards the client: on_drain at the low-water mark */
    hpipe_low_water(f.p, 64 * 1024);
    f.c[a].paused = true;
    static char big[4 * BIG];
    memset(big, 'z', sizeof(big));
    hpipe_write(f.p, big, sizeof(big));
    f.ndrain = 0;
    run(&f);
    ok(hpipe_queued(f.p) > 64 * 1024, "the client not reading: the queue stays high");
    is_int(f.ndrain, 0, "no on_drain above the low water");
    f.c[a].paused = false;
    run(&f);
    ok(f.ndrain > 0, "the client reads: on_drain");
    ok(f.drain_queued <= 64 * 1024, "on_drain at or under the low water");
    is_int(f.c[a].in.len, sizeof(big), "every byte arrived");
    fx_fini(&f);
}

/* The client's end: after its last bytes; writing goes on (plaintext). */
static void
test_eof(void)
{
    struct fx f;
    int a;
    if (!fx_pipe(&f, &a))
        return;
    /* reading off: the end waits with the bytes before it */
    hpipe_read(f.p, false);
    tfx_cl_sends(&f.c[a], "last words");
    run(&f);
    if (f.c[a].ssl)
        SSL_shutdown(f.c[a].ssl);
    shutdown(f.c[a].fd, SHUT_WR);
    run(&f);
    ok(!strstr(log_str(&f), "eof"), "reading off: the end is not seen");
    hpipe_read(f.p, true);
    run(&f);
    is_str(log_str(&f), "close\ntaken\nread 10\neof\n", "the bytes, then the end");
    is_mem(f.got.p ? f.got.p : "", f.got.len, "last words", 10, "every byte before the end");
    hpipe_read(f.p, true); /* after the end: nothing happens */
    if (!f.c[a].ssl) {
        hpipe_write(f.p, "still here", 10);
        run(&f);
        is_mem(f.c[a].in.p ? f.c[a].in.p : "", f.c[a].in.len, "still here", 10,
               "after the client's end: writing works");
    }
    f.free_at_eof = true;
    hpipe_free(f.p);
    f.p = NULL;
    run(&f);
    ok(f.c[a].eof, "freed: the client sees the end");
    fx_fini(&f);
}

/* A failed connection: on_error. */
static void
test_error(void)
{
    struct fx f;
    int a;
    if (!fx_pipe(&f, &a))
        return;
    if (f.c[a].ssl) {
        /* bytes that are no TLS record */
        static const char junk[] = "\x17\x03\x03\x00\x08garbage!";
        ssize_t w = send(f.c[a].fd, junk, sizeof(junk) - 1, MSG_NOSIGNAL);
        ok(w == (ssize_t)sizeof(junk) - 1, "junk sent");
    } else {
        /* the client gone while the pipe does not read: the write fails */
        hpipe_read(f.p, false);
        tfx_cl_close(&f.c[a]);
        static char big[BIG];
        hpipe_write(f.p, big, sizeof(big));
    }
    run(&f);
    ok(strstr(log_str(&f), "error") != NULL, "on_error");
    ok(!strstr(log_str(&f), "eof"), "not on_eof");
    is_int(f.p == NULL, 1, "freed inside on_error");
    is_int(taken(&f), 0, "released");
    fx_fini(&f);
}

/* The descriptors count until hpipe_free, which releases them at once. */
static void
test_count(void)
{
    struct fx f;
    fx_init(&f, 2);
    int a = fx_connect(&f);
    tfx_cl_sends(&f.c[a], "GET /later?count HTTP/1.1\r\n" UPGRADE "\r\n");
    run(&f);
    struct http_server_stats st;
    http_server_stats(f.s, &st);
    is_int(st.open, 1, "held: open");
    is_int(st.taken, 1, "held: its counted socket");
    if (f.held)
        take(&f, f.held);
    http_server_stats(f.s, &st);
    is_int(st.open, 0, "a pipe: not open on the server");
    is_int(st.taken, 2, "a pipe: the connection and the counted socket");
    int b = fx_connect(&f);
    run(&f);
    ok(f.c[b].eof, "over the cap: a new connection refused");
    http_server_stats(f.s, &st);
    is_int(st.refused, 1, "refused");
    hpipe_free(f.p);
    f.p = NULL;
    is_int(taken(&f), 0, "freed: released at once");
    run(&f);
    ok(f.c[a].eof, "freed: the client sees the end");
    int c = fx_connect(&f);
    tfx_cl_sends(&f.c[c], "GET / HTTP/1.1\r\nHost: h\r\n\r\n");
    run(&f);
    ok(f.c[c].in.len > 13 && strncmp(f.c[c].in.p, "HTTP/1.1 200 ", 13) == 0,
       "freed: a new connection served");
    fx_fini(&f);
}

/* What cannot become a pipe is closed. */
static void
test_refused(void)
{
    struct fx f;
    fx_init(&f, 0);
    int a = fx_connect(&f);
    tfx_cl_sends(&f.c[a], "GET /now HTTP/1.1\r\nHost: h\r\n\r\n");
    run(&f);
    ok(f.taken_null, "no upgrade: NULL");
    ok(f.c[a].eof && f.c[a].in.len == 0, "no upgrade: closed, nothing sent");
    is_int(f.nclose, 1, "no upgrade: on_close ran");
    int b = fx_connect(&f);
    f.taken_null = false;
    tfx_cl_sends(&f.c[b], "POST /now HTTP/1.1\r\n" UPGRADE "Content-Length: 5\r\n\r\n12345");
    run(&f);
    ok(f.taken_null, "an upgrade with its body unread: NULL");
    ok(f.c[b].eof && f.c[b].in.len == 0, "its body unread: closed, nothing sent");
    is_int(taken(&f), 0, "nothing counted");
    fx_fini(&f);
}

static void
run_all(bool tls)
{
    tls_on = tls;
    printf("# %s\n", tls ? "TLS" : "plaintext");
    TAP_RUN(test_bytes_behind_and_both_ways);
    TAP_RUN(test_take_in_on_request);
    TAP_RUN(test_flow_control);
    TAP_RUN(test_eof);
    TAP_RUN(test_error);
    TAP_RUN(test_count);
    TAP_RUN(test_refused);
}

int
main(void)
{
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    tfx_dir_open("hpipe_test");
    tfx_write_pair("kwc", NULL);
    run_all(false);
    run_all(true);
    tfx_dir_close();
    return tap_done();
}
