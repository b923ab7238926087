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
 * turns, with a self-signed certificate made here). The loop runs
 * non-blocking turns until nothing moves (bounded). Never a sleep.
 */
#include "kwc/http.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <linux/sockios.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/gostr.h"
#include "tap.h"

#define RUN_MAX 200000 /* loop turns before "it never goes quiet" */
#define QUIET_TURNS 3
#define MAX_CL 4
#define BIG (1024 * 1024)

static char dir[64], cert_path[128], key_path[128];
static bool tls_on; /* the run in progress */

/* ---- a self-signed serving pair ---- */

static void
write_pair(void)
{
    EVP_PKEY *k = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    if (!k || !x)
        abort();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -3600);
    X509_gmtime_adj(X509_getm_notAfter(x), 86400);
    X509_set_pubkey(x, k);
    X509_NAME *n = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)"kwc", -1, -1, 0);
    X509_set_issuer_name(x, n);
    if (!X509_sign(x, k, EVP_sha256()))
        abort();
    snprintf(cert_path, sizeof(cert_path), "%s/cert.pem", dir);
    snprintf(key_path, sizeof(key_path), "%s/key.pem", dir);
    FILE *f = fopen(cert_path, "w");
    if (!f || !PEM_write_X509(f, x) || fclose(f) != 0)
        abort();
    f = fopen(key_path, "w");
    if (!f || !PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL) || fclose(f) != 0)
        abort();
    X509_free(x);
    EVP_PKEY_free(k);
}

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
    struct cl {
        int fd;
        SSL *ssl;
        bool hs_done, eof, no_read;
        struct gostr_buf in, out;
    } c[MAX_CL];
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
        o.tls_cert_file = cert_path;
        o.tls_key_file = key_path;
    }
    char err[512] = "";
    if (http_server_new(f->base, &o, on_request, f, &f->s, err, sizeof(err)) != 0) {
        printf("# http_server_new: %s\n", err);
        abort();
    }
    f->cctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_verify(f->cctx, SSL_VERIFY_NONE, NULL);
}

static int
fx_connect(struct fx *f)
{
    int sv[2];
    if (f->nc == MAX_CL || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv))
        abort();
    struct cl *c = &f->c[f->nc];
    *c = (struct cl){.fd = sv[0]};
    if (tls_on) {
        c->ssl = SSL_new(f->cctx);
        SSL_set_fd(c->ssl, sv[0]);
        SSL_set_connect_state(c->ssl);
    }
    http_server_adopt(f->s, sv[1], NULL, 0);
    return f->nc++;
}

static void
cl_send(struct fx *f, int i, const void *p, size_t n)
{
    gostr_addn(&f->c[i].out, p, n);
}

static void
cl_sends(struct fx *f, int i, const char *s)
{
    cl_send(f, i, s, strlen(s));
}

/* Move what can move on client c's side, without blocking. */
static void
cl_pump(struct cl *c)
{
    if (c->fd < 0 || c->eof)
        return;
    char buf[65536];
    if (!c->ssl) {
        if (c->out.len) {
            ssize_t w = send(c->fd, c->out.p, c->out.len, MSG_NOSIGNAL);
            if (w > 0) {
                memmove(c->out.p, c->out.p + w, c->out.len - (size_t)w);
                c->out.len -= (size_t)w;
            }
        }
        while (!c->no_read) {
            ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
            if (n > 0) {
                gostr_addn(&c->in, buf, (size_t)n);
                continue;
            }
            if (n == 0 || (errno != EAGAIN && errno != EINTR))
                c->eof = true;
            break;
        }
        return;
    }
    if (!c->hs_done) {
        int rc = SSL_do_handshake(c->ssl);
        if (rc != 1) {
            int e = SSL_get_error(c->ssl, rc);
            if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
                c->eof = true;
            ERR_clear_error();
            return;
        }
        c->hs_done = true;
    }
    while (c->out.len) {
        int w = SSL_write(c->ssl, c->out.p, (int)(c->out.len > 16384 ? 16384 : c->out.len));
        if (w <= 0)
            break;
        memmove(c->out.p, c->out.p + w, c->out.len - (size_t)w);
        c->out.len -= (size_t)w;
    }
    while (!c->no_read) {
        int n = SSL_read(c->ssl, buf, (int)sizeof(buf));
        if (n > 0) {
            gostr_addn(&c->in, buf, (size_t)n);
            continue;
        }
        int e = SSL_get_error(c->ssl, n);
        if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
            c->eof = true;
        break;
    }
    ERR_clear_error();
}

/* Bytes client i wrote that the server has not read (its send queue). */
static int
cl_unread(struct fx *f, int i)
{
    int q = 0;
    if (f->c[i].fd < 0 || ioctl(f->c[i].fd, SIOCOUTQ, &q) != 0)
        return -1;
    return q;
}

static unsigned long long
progress(struct fx *f)
{
    unsigned long long v = f->hooks;
    for (int i = 0; i < f->nc; i++) {
        struct cl *c = &f->c[i];
        v += c->in.len + c->out.len * 3 + c->eof + c->hs_done;
        int q = cl_unread(f, i);
        v += q > 0 ? (unsigned)q * 7919u : 0;
    }
    return v;
}

/* Run until nothing moves. */
static void
run(struct fx *f)
{
    int idle = 0, i;
    for (i = 0; i < RUN_MAX && idle < QUIET_TURNS; i++) {
        unsigned long long before = progress(f);
        event_base_loop(f->base, EVLOOP_NONBLOCK);
        for (int k = 0; k < f->nc; k++)
            cl_pump(&f->c[k]);
        idle = progress(f) != before ? 0 : idle + 1;
    }
    if (i == RUN_MAX)
        ok(0, "the loop goes quiet");
}

static void
cl_close(struct fx *f, int i)
{
    struct cl *c = &f->c[i];
    if (c->ssl)
        SSL_free(c->ssl);
    c->ssl = NULL;
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}

static void
fx_fini(struct fx *f)
{
    hpipe_free(f->p);
    f->p = NULL;
    for (int i = 0; i < f->nc; i++)
        cl_close(f, i);
    run(f);
    http_server_free(f->s);
    is_int(f->nclose, f->nreq, "every request's on_close ran once");
    for (int i = 0; i < QUIET_TURNS; i++)
        event_base_loop(f->base, EVLOOP_NONBLOCK); /* hpipe_free's deferred close */
    for (int i = 0; i < f->nc; i++) {
        free(f->c[i].in.p);
        free(f->c[i].out.p);
    }
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

/* ---- tests ---- */

/* The bytes behind the request come first, from the loop; then both ways. */
static void
test_bytes_behind_and_both_ways(void)
{
    struct fx f;
    fx_init(&f, 0);
    int a = fx_connect(&f);
    cl_sends(&f, a, "POST /later HTTP/1.1\r\n" UPGRADE "Content-Length: 4\r\n\r\nbodyBEHIND");
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
    struct evbuffer *in = f.p ? hpipe_input(f.p) : NULL;
    size_t n = in ? evbuffer_get_length(in) : 0;
    is_mem(in ? (char *)evbuffer_pullup(in, -1) : "", n, "BEHIND", 6,
           "the bytes behind the body, unparsed, first in the input");
    f.hold_input = false;
    /* the client's next bytes: after those */
    static char big[BIG];
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (char)('a' + i % 26);
    cl_send(&f, a, big, sizeof(big));
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
    cl_sends(&f, a, "GET /now HTTP/1.1\r\n" UPGRADE "\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n");
    run(&f);
    is_str(log_str(&f), "close\ntaken\nread 27\n", "taken, then on_read");
    struct evbuffer *in = f.p ? hpipe_input(f.p) : NULL;
    size_t n = in ? evbuffer_get_length(in) : 0;
    is_mem(in ? (char *)evbuffer_pullup(in, -1) : "", n, "GET / HTTP/1.1\r\nHost: h\r\n\r\n", 27,
           "the next request's bytes, unparsed");
    is_int(f.nreq, 1, "one request");
    is_int(f.c[a].in.len, 0, "nothing answered");
    fx_fini(&f);
}

/* Flow control both ways. */
static void
test_flow_control(void)
{
    struct fx f;
    fx_init(&f, 0);
    int a = fx_connect(&f);
    cl_sends(&f, a, "GET /now HTTP/1.1\r\n" UPGRADE "\r\n");
    run(&f);
    ok(f.p != NULL, "taken");
    if (!f.p) {
        fx_fini(&f);
        return;
    }
    /* reading off: the client's bytes stay in the kernel */
    hpipe_read(f.p, false);
    hpipe_read(f.p, false); /* twice: no change */
    size_t before = f.log.len;
    cl_sends(&f, a, "0123456789");
    run(&f);
    ok(f.log.len == before, "reading off: no on_read");
    is_int(f.got.len, 0, "reading off: nothing delivered");
    is_int(evbuffer_get_length(hpipe_input(f.p)), 0, "reading off: nothing in the input");
    ok(cl_unread(&f, a) >= 10, "reading off: the bytes wait in the client's socket");
    hpipe_read(f.p, true);
    run(&f);
    is_mem(f.got.p ? f.got.p : "", f.got.len, "0123456789", 10, "reading on: delivered");
    is_int(cl_unread(&f, a), 0, "reading on: the socket read");

    /* bytes left in the input when reading is turned off and on again are
     * announced again */
    f.hold_input = true;
    cl_sends(&f, a, "abc");
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
    f.c[a].no_read = true;
    static char big[4 * BIG];
    memset(big, 'z', sizeof(big));
    hpipe_write(f.p, big, sizeof(big));
    f.ndrain = 0;
    run(&f);
    ok(hpipe_queued(f.p) > 64 * 1024, "the client not reading: the queue stays high");
    is_int(f.ndrain, 0, "no on_drain above the low water");
    f.c[a].no_read = false;
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
    fx_init(&f, 0);
    int a = fx_connect(&f);
    cl_sends(&f, a, "GET /now HTTP/1.1\r\n" UPGRADE "\r\n");
    run(&f);
    if (!f.p) {
        ok(0, "taken");
        fx_fini(&f);
        return;
    }
    /* reading off: the end waits with the bytes before it */
    hpipe_read(f.p, false);
    cl_sends(&f, a, "last words");
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
    fx_init(&f, 0);
    int a = fx_connect(&f);
    cl_sends(&f, a, "GET /now HTTP/1.1\r\n" UPGRADE "\r\n");
    run(&f);
    if (!f.p) {
        ok(0, "taken");
        fx_fini(&f);
        return;
    }
    if (f.c[a].ssl) {
        /* bytes that are no TLS record */
        static const char junk[] = "\x17\x03\x03\x00\x08garbage!";
        ssize_t w = send(f.c[a].fd, junk, sizeof(junk) - 1, MSG_NOSIGNAL);
        ok(w == (ssize_t)sizeof(junk) - 1, "junk sent");
    } else {
        /* the client gone while the pipe does not read: the write fails */
        hpipe_read(f.p, false);
        cl_close(&f, a);
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
    cl_sends(&f, a, "GET /later?count HTTP/1.1\r\n" UPGRADE "\r\n");
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
    cl_sends(&f, c, "GET / HTTP/1.1\r\nHost: h\r\n\r\n");
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
    cl_sends(&f, a, "GET /now HTTP/1.1\r\nHost: h\r\n\r\n");
    run(&f);
    ok(f.taken_null, "no upgrade: NULL");
    ok(f.c[a].eof && f.c[a].in.len == 0, "no upgrade: closed, nothing sent");
    is_int(f.nclose, 1, "no upgrade: on_close ran");
    int b = fx_connect(&f);
    f.taken_null = false;
    cl_sends(&f, b, "POST /now HTTP/1.1\r\n" UPGRADE "Content-Length: 5\r\n\r\n12345");
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
    snprintf(dir, sizeof(dir), "/tmp/hpipe_test.XXXXXX");
    if (!mkdtemp(dir))
        abort();
    write_pair();
    run_all(false);
    run_all(true);
    unlink(cert_path);
    unlink(key_path);
    rmdir(dir);
    return tap_done();
}
