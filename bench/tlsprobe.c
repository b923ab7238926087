/*
 * tlsprobe.c — what OpenSSL itself keeps per server-side TLS connection: the
 * floor under kwc's memory per idle TLS connection (bench/run.py idle-tls
 * subtracts it). No kwc, no libevent: N server SSL objects and N client SSL
 * objects on N socketpairs in one process, each pair through a full handshake
 * (the server's certificate and key from the files given, TLS 1.3 as OpenSSL
 * negotiates by default, no resumption), then one request (~100 bytes) read
 * by the server and one response (3.5 KiB) written by it and read by the
 * client: the state of a kwc connection that answered one GET and is idle.
 *
 *   tlsprobe --cert FILE --key FILE [--conns N]
 *
 * Method: every OpenSSL allocation goes through CRYPTO_set_mem_functions and
 * carries a small header naming the side that was running when it was made
 * (a server call, a client call, or setup); a free or realloc charges the
 * side that made the block. After the N exchanges the server side's live
 * bytes over N is OpenSSL's memory per idle server connection. Reported as
 * requested bytes and as glibc heap (each block rounded up to its chunk:
 * size + 8, 16-aligned, at least 32) — the second is what RssAnon sees. A
 * warm-up round first, so one-time allocations (algorithm fetch caches,
 * error strings) are not charged to the connections. Two server contexts:
 * OpenSSL's defaults (read and write buffers kept while idle) and
 * SSL_MODE_RELEASE_BUFFERS (buffers freed whenever empty) — the latter is
 * the minimum OpenSSL needs. Kernel socket memory is outside the process
 * and not counted. Prints one line of JSON.
 */
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

enum side { SETUP, SERVER, CLIENT, NSIDES };

struct hdr {
    size_t size;
    int side;
    int pad; /* the block after the header stays 16-aligned */
};
_Static_assert(sizeof(struct hdr) == 16, "header keeps 16-byte alignment");

static enum side running = SETUP;
static int64_t live_bytes[NSIDES], live_heap[NSIDES], live_blocks[NSIDES];

static int64_t
chunk(size_t n)
{
    size_t c = (n + 8 + 15) & ~(size_t)15;
    return (int64_t)(c < 32 ? 32 : c);
}

static void
charge(const struct hdr *h, int sign)
{
    live_bytes[h->side] += sign * (int64_t)h->size;
    live_heap[h->side] += sign * chunk(h->size);
    live_blocks[h->side] += sign;
}

static void *
m_alloc(size_t n, const char *file, int line)
{
    (void)file;
    (void)line;
    struct hdr *h = malloc(sizeof(*h) + n);
    if (!h)
        return NULL;
    h->size = n;
    h->side = running;
    charge(h, 1);
    return h + 1;
}

static void
m_free(void *p, const char *file, int line)
{
    (void)file;
    (void)line;
    if (!p)
        return;
    struct hdr *h = (struct hdr *)p - 1;
    charge(h, -1);
    free(h);
}

static void *
m_realloc(void *p, size_t n, const char *file, int line)
{
    if (!p)
        return m_alloc(n, file, line);
    struct hdr *h = (struct hdr *)p - 1, old = *h;
    charge(&old, -1);
    struct hdr *nh = realloc(h, sizeof(*h) + n);
    if (!nh) {
        charge(&old, 1);
        return NULL;
    }
    nh->size = n;
    charge(nh, 1);
    return nh + 1;
}

struct pair {
    int fd[2];
    SSL *s, *c;
};

static void
die(const char *what)
{
    fprintf(stderr, "tlsprobe: %s\n", what);
    ERR_print_errors_fp(stderr);
    exit(1);
}

/* An OpenSSL call's result: true when it completed, false when it waits
 * for bytes from the other side. */
static bool
done(SSL *ssl, int r)
{
    if (r > 0)
        return true;
    int e = SSL_get_error(ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
        return false;
    die("a TLS call failed");
    return false;
}

static bool
hs(enum side side, SSL *ssl)
{
    running = side;
    bool ok = done(ssl, SSL_do_handshake(ssl));
    running = SETUP;
    return ok;
}

/* Reads want bytes the other side has already written (the client also
 * consumes the session tickets the server sent after the handshake). */
static void
read_all(enum side side, SSL *ssl, size_t want)
{
    char buf[8192];
    size_t got = 0;
    while (got < want) {
        running = side;
        int n = SSL_read(ssl, buf, sizeof buf);
        running = SETUP;
        if (!done(ssl, n))
            die("a read stalled: the other side wrote less than expected");
        got += (size_t)n;
    }
}

static void
exchange(struct pair *p)
{
    static const char req[] = "GET /api/v1/namespaces/ns-0/pods/pod-0?resourceVersion=0 "
                              "HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: tlsprobe\r\n\r\n";
    static char resp[3584];
    if (!resp[0]) {
        memset(resp, 'x', sizeof resp);
        memcpy(resp, "HTTP/1.1 200 OK\r\n", 17);
    }
    running = CLIENT;
    if (SSL_write(p->c, req, sizeof req - 1) != (int)(sizeof req - 1))
        die("the request was not written");
    running = SETUP;
    read_all(SERVER, p->s, sizeof req - 1);
    running = SERVER;
    if (SSL_write(p->s, resp, sizeof resp) != (int)sizeof resp)
        die("the response was not written");
    running = SETUP;
    read_all(CLIENT, p->c, sizeof resp);
}

static void
open_pairs(SSL_CTX *sctx, SSL_CTX *cctx, struct pair *ps, int n, int64_t *after_new)
{
    int64_t s0 = live_heap[SERVER];
    for (int i = 0; i < n; i++) {
        struct pair *p = &ps[i];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, p->fd) != 0)
            die(strerror(errno));
        running = SERVER;
        p->s = SSL_new(sctx);
        if (!p->s || SSL_set_fd(p->s, p->fd[0]) != 1)
            die("SSL_new (server)");
        SSL_set_accept_state(p->s);
        running = CLIENT;
        p->c = SSL_new(cctx);
        if (!p->c || SSL_set_fd(p->c, p->fd[1]) != 1)
            die("SSL_new (client)");
        SSL_set_connect_state(p->c);
        running = SETUP;
    }
    if (after_new)
        *after_new = live_heap[SERVER] - s0;
    for (int i = 0; i < n; i++) {
        struct pair *p = &ps[i];
        bool sd = false, cd = false;
        for (int round = 0; !(sd && cd); round++) {
            if (round > 100)
                die("the handshake did not finish");
            if (!cd)
                cd = hs(CLIENT, p->c);
            if (!sd)
                sd = hs(SERVER, p->s);
        }
        exchange(p);
    }
}

static void
close_pairs(struct pair *ps, int n)
{
    for (int i = 0; i < n; i++) {
        running = SERVER;
        SSL_free(ps[i].s);
        running = CLIENT;
        SSL_free(ps[i].c);
        running = SETUP;
        close(ps[i].fd[0]);
        close(ps[i].fd[1]);
    }
}

static void
measure(const char *name, long mode, const char *cert, const char *key, int n, bool last)
{
    SSL_CTX *sctx = SSL_CTX_new(TLS_server_method());
    SSL_CTX *cctx = SSL_CTX_new(TLS_client_method());
    if (!sctx || !cctx)
        die("SSL_CTX_new");
    if (SSL_CTX_use_certificate_chain_file(sctx, cert) != 1 ||
        SSL_CTX_use_PrivateKey_file(sctx, key, SSL_FILETYPE_PEM) != 1)
        die("the certificate or key could not be loaded");
    SSL_CTX_set_mode(sctx, mode);
    struct pair *ps = calloc((size_t)n, sizeof(*ps));
    if (!ps)
        die("out of memory");
    open_pairs(sctx, cctx, ps, 4, NULL); /* warm-up: one-time allocations */
    close_pairs(ps, 4);
    int64_t b0 = live_bytes[SERVER], h0 = live_heap[SERVER], k0 = live_blocks[SERVER];
    int64_t after_new;
    open_pairs(sctx, cctx, ps, n, &after_new);
    SSL *s = ps[0].s;
    printf("\"%s\":{\"ssl_new_heap\":%.0f,\"idle_bytes\":%.0f,\"idle_heap\":%.0f,"
           "\"idle_blocks\":%.1f,\"protocol\":\"%s\",\"cipher\":\"%s\"}%s",
           name, (double)after_new / n, (double)(live_bytes[SERVER] - b0) / n,
           (double)(live_heap[SERVER] - h0) / n, (double)(live_blocks[SERVER] - k0) / n,
           SSL_get_version(s), SSL_get_cipher_name(s), last ? "" : ",");
    close_pairs(ps, n);
    free(ps);
    SSL_CTX_free(sctx);
    SSL_CTX_free(cctx);
}

int
main(int argc, char **argv)
{
    const char *cert = NULL, *key = NULL;
    int n = 1000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--cert"))
            cert = argv[i + 1];
        else if (!strcmp(argv[i], "--key"))
            key = argv[i + 1];
        else if (!strcmp(argv[i], "--conns"))
            n = atoi(argv[i + 1]);
        else
            goto usage;
    }
    if (!cert || !key || n <= 0 || argc % 2 == 0)
        goto usage;
    if (!CRYPTO_set_mem_functions(m_alloc, m_realloc, m_free))
        die("OpenSSL allocated before the probe could count (CRYPTO_set_mem_functions)");
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if ((rlim_t)n * 2 + 16 > rl.rlim_cur) {
        fprintf(stderr, "tlsprobe: %d pairs need %d open files (limit %llu)\n", n, n * 2 + 16,
                (unsigned long long)rl.rlim_cur);
        return 2;
    }
    printf("{\"conns\":%d,\"openssl\":\"%s\",", n, OpenSSL_version(OPENSSL_VERSION));
    measure("default", 0, cert, key, n, false);
    measure("release_buffers", SSL_MODE_RELEASE_BUFFERS, cert, key, n, true);
    printf("}\n");
    return 0;
usage:
    fprintf(stderr, "usage: tlsprobe --cert FILE --key FILE [--conns N]\n");
    return 2;
}
