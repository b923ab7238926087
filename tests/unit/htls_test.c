/*
 * htls_test.c — proxy/http/htls.c and the TLS paths of proxy/http/http.c:
 * the server's TLS context (handshake, ALPN, client certificates), the
 * certificate reload (a new certificate for new connections, the old one
 * kept by connections already open, a pair that fails to load never
 * replacing the one serving), the configuration errors, and the limits
 * seen through TLS (a refused connection costs no handshake, a handshake
 * that never starts meets the head timeout).
 *
 * Keys, certificates and the client come from tlsfx.h: a self-signed or
 * CA-signed P-256 pair written to a fresh directory (replacing a file is a
 * rename(2) of a new one, as a Secret volume does); the server adopts one
 * end of a socketpair(AF_UNIX), the test plays the TLS client on the other
 * with a plain SSL object, pumped between loop turns. The loop runs with
 * EVLOOP_ONCE until what is awaited is there (tfx_wait), bounded by a
 * guard timer that only fires when the server never acts (a failure, not
 * a margin). The reload timer is configured short; a failed reload is seen
 * in its log line (stderr captured through a pipe). Never a sleep.
 *
 * Kernel TLS: the kernel TLS tests' connections are real loopback TCP
 * connections (the tls ULP is TCP's). setsockopt is wrapped here (this
 * binary's definition comes before libc's for libkwc and libcrypto alike):
 * it counts OpenSSL's attempts to hand a connection's keys to the kernel
 * (SOL_TLS, TLS_TX) and can answer the TCP_ULP "tls" calls with an errno
 * of the test's choosing, so both outcomes of the start probe run on any
 * kernel. What only a kernel with the tls ULP can show (records made by the
 * kernel) says SKIP on a kernel without it.
 */
#include "kwc/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/tls.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kwc/base.h"
#include "tap.h"
#include "tlsfx.h"

#define MAX_CL 8

/* ---- setsockopt, wrapped ---- */

static int fake_ulp = -1; /* >= 0: TCP_ULP "tls" fails with this errno (0: succeeds) */
static int ulp_calls, tls_tx_calls;

int
setsockopt(int fd, int level, int name, const void *v, socklen_t len)
{
    if (level == IPPROTO_TCP && name == TCP_ULP && len >= 3 && memcmp(v, "tls", 3) == 0) {
        ulp_calls++;
        if (fake_ulp > 0) {
            errno = fake_ulp;
            return -1;
        }
        if (fake_ulp == 0)
            return 0;
    }
    if (level == SOL_TLS && name == TLS_TX)
        tls_tx_calls++;
    return (int)syscall(SYS_setsockopt, fd, level, name, v, len);
}

/* ---- the handler: "<method> <target> tls=<0|1> cn=<client CN or ->" ---- */

struct th {
    int nreq, nclose;
};

static void
h_close(void *arg)
{
    struct th *t = arg;
    t->nclose++;
}

static const struct hreq_handler hooks = {.on_close = h_close};

/* "/blocks": BLOCKS chunks of BLOCK_DATA bytes through hresp_write_block,
 * each framed to 64 KiB ("fff8\r\n" ... "\r\n"), byte i of chunk k being
 * 'a' + (i + k) % 26 */
#define BLOCKS 3
#define BLOCK_DATA (64 * 1024 - 8)

static void
write_blocks(struct hreq *r)
{
    hresp_start(r, 200, -1);
    for (int k = 0; k < BLOCKS; k++) {
        char *b = xmalloc(HRESP_BLOCK_BEFORE + BLOCK_DATA + HRESP_BLOCK_AFTER);
        char *p = b + HRESP_BLOCK_BEFORE;
        for (size_t i = 0; i < BLOCK_DATA; i++)
            p[i] = (char)('a' + (i + (size_t)k) % 26);
        hresp_write_block(r, b, p, BLOCK_DATA);
    }
    hresp_end(r);
}

static void
on_request(void *arg, struct hreq *r)
{
    struct th *t = arg;
    t->nreq++;
    hreq_set_handler(r, &hooks, t);
    size_t tl;
    const char *target = hreq_target(r, &tl);
    if (tl == 7 && memcmp(target, "/blocks", 7) == 0) {
        write_blocks(r);
        return;
    }
    char cn[64] = "-";
    X509 *x = hreq_client_cert(r);
    if (x)
        X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof(cn));
    char body[256];
    int n = snprintf(body, sizeof(body), "%s %.*s tls=%d cn=%s", hreq_method(r), (int)tl, target,
                     hreq_tls(r), cn);
    hresp_simple(r, 200, "text/plain", body, (size_t)n);
}

/* ---- the client side ---- */

struct fx {
    struct event_base *base;
    struct http_server *s;
    struct th t;
    SSL_CTX *cctx;
    struct tfx_cl c[MAX_CL];
    int nc;
    int log_r, saved_err; /* stderr captured (fx_capture) */
    char log[4096];
    size_t nlog;
};

/* The options every TLS test starts from: tfx_dir's cert.pem and key.pem. */
static char ca_path[128];

static struct http_server_options
tls_opts(void)
{
    return (struct http_server_options){.tls_cert_file = tfx_cert_path,
                                        .tls_key_file = tfx_key_path};
}

static void
fx_init(struct fx *f, const struct http_server_options *o)
{
    *f = (struct fx){.log_r = -1, .saved_err = -1};
    f->base = event_base_new();
    char err[512] = "";
    int rc = http_server_new(f->base, o, on_request, &f->t, &f->s, err, sizeof(err));
    if (rc != 0) {
        printf("# http_server_new: %d %s\n", rc, err);
        abort();
    }
    f->cctx = tfx_client_ctx();
}

/* A new client; tls: with an SSL object (its handshake starts at the next
 * pump); alpn: the protocols it offers (wire format) or NULL. */
static int
fx_connect(struct fx *f, bool tls, const unsigned char *alpn, size_t alpn_len)
{
    if (f->nc == MAX_CL)
        abort();
    int fd = tfx_cl_open(&f->c[f->nc], tls ? f->cctx : NULL, alpn, alpn_len);
    http_server_adopt(f->s, fd, NULL, 0);
    return f->nc++;
}

static void
log_read(struct fx *f)
{
    if (f->log_r < 0)
        return;
    for (;;) {
        ssize_t n = read(f->log_r, f->log + f->nlog, sizeof(f->log) - 1 - f->nlog);
        if (n <= 0)
            break;
        f->nlog += (size_t)n;
    }
    f->log[f->nlog] = '\0';
}

/* Capture stderr (the log) from now until fx_release. */
static void
fx_capture(struct fx *f)
{
    int p[2];
    if (pipe2(p, O_NONBLOCK | O_CLOEXEC) != 0)
        abort();
    fflush(stderr);
    f->saved_err = dup(STDERR_FILENO);
    dup2(p[1], STDERR_FILENO);
    close(p[1]);
    f->log_r = p[0];
    f->nlog = 0;
}

static void
fx_release(struct fx *f)
{
    if (f->saved_err < 0)
        return;
    log_read(f);
    dup2(f->saved_err, STDERR_FILENO);
    close(f->saved_err);
    close(f->log_r);
    f->saved_err = f->log_r = -1;
    if (f->nlog)
        printf("# log: %s", f->log);
}

typedef bool (*pred_fn)(struct fx *f, int i);

struct until {
    struct fx *f;
    pred_fn pred;
    int i;
};

static bool
until_holds(void *arg)
{
    struct until *u = arg;
    log_read(u->f);
    return u->pred(u->f, u->i);
}

/* Pump the clients and run the loop until pred holds, or the guard fires. */
static bool
run_until(struct fx *f, pred_fn pred, int i)
{
    struct until u = {f, pred, i};
    return tfx_wait(f->base, f->c, f->nc, until_holds, &u);
}

static bool
p_eof(struct fx *f, int i)
{
    return f->c[i].eof;
}

/* One whole answer (its body is the last thing in the input). */
static bool
p_answer(struct fx *f, int i)
{
    const char *in = tfx_cl_in(&f->c[i]);
    const char *b = strstr(in, "\r\n\r\n");
    const char *cl = strstr(in, "Content-Length: ");
    return f->c[i].eof ||
           (b && cl && in + f->c[i].in.len - (b + 4) >= (ptrdiff_t)strtol(cl + 16, NULL, 10));
}

static bool
p_reloaded(struct fx *f, int want)
{
    struct http_server_stats st;
    http_server_stats(f->s, &st);
    return st.tls_reloads >= (unsigned long long)want;
}

static bool
p_log_unusable(struct fx *f, int i)
{
    return strstr(f->log, "cannot be used") != NULL;
}

/* GET target on client i, and its answer's body ("" when none). */
static const char *
get(struct fx *f, int i, const char *target)
{
    struct tfx_cl *c = &f->c[i];
    c->in.len = 0;
    if (c->in.p)
        c->in.p[0] = '\0';
    char req[256];
    snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: h\r\n\r\n", target);
    tfx_cl_sends(c, req);
    run_until(f, p_answer, i);
    const char *in = tfx_cl_in(c), *b = strstr(in, "\r\n\r\n");
    return b && strncmp(in, "HTTP/1.1 200 OK\r\n", 17) == 0 ? b + 4 : "";
}

/* The subject CN of the certificate client i was served. */
static const char *
served_cn(struct fx *f, int i, char *buf, size_t n)
{
    buf[0] = '\0';
    X509 *x = f->c[i].ssl ? SSL_get0_peer_certificate(f->c[i].ssl) : NULL;
    if (x)
        X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, buf, (int)n);
    return buf;
}

static void
fx_fini(struct fx *f)
{
    fx_release(f);
    for (int i = 0; i < f->nc; i++)
        tfx_cl_close(&f->c[i]);
    for (int i = 0; i < 20; i++)
        event_base_loop(f->base, EVLOOP_NONBLOCK);
    http_server_free(f->s);
    is_int(f->t.nclose, f->t.nreq, "every request's on_close ran once");
    for (int i = 0; i < f->nc; i++)
        tfx_cl_fini(&f->c[i]);
    SSL_CTX_free(f->cctx);
    event_base_free(f->base);
}

/* ---- tests ---- */

static void
test_handshake(void)
{
    tfx_write_pair("one", NULL);
    struct http_server_options o = tls_opts();
    struct fx f;
    fx_init(&f, &o);
    char cn[64];
    /* (a client offering h2 gets it: h2_test.c) */
    static const unsigned char h1[] = "\x08http/1.1";
    int a = fx_connect(&f, true, h1, sizeof(h1) - 1);
    is_str(get(&f, a, "/x"), "GET /x tls=1 cn=-", "served over TLS; no client certificate");
    is_str(served_cn(&f, a, cn, sizeof(cn)), "one", "the configured certificate");
    const unsigned char *sel = NULL;
    unsigned sl = 0;
    SSL_get0_alpn_selected(f.c[a].ssl, &sel, &sl);
    is_mem(sel ? (const char *)sel : "", sl, "http/1.1", 8, "ALPN: http/1.1 offered, chosen");
    ok(SSL_version(f.c[a].ssl) >= TLS1_2_VERSION, "TLS 1.2 or later");
    is_str(get(&f, a, "/y"), "GET /y tls=1 cn=-", "a second request on the connection");

    /* a client offering only protocols kwc does not speak: no ALPN, still
     * served (HTTP/1.1) */
    static const unsigned char other[] = "\x06spdy/3";
    int b = fx_connect(&f, true, other, sizeof(other) - 1);
    is_str(get(&f, b, "/z"), "GET /z tls=1 cn=-", "spdy/3 only: served");
    SSL_get0_alpn_selected(f.c[b].ssl, &sel, &sl);
    is_int(sl, 0, "spdy/3 only: no protocol selected");

    /* a plaintext request on the TLS port: no answer, a failed handshake */
    int c = fx_connect(&f, false, NULL, 0);
    tfx_cl_sends(&f.c[c], "GET / HTTP/1.1\r\nHost: h\r\n\r\n");
    ok(run_until(&f, p_eof, c), "plaintext on TLS: closed");
    ok(strstr(tfx_cl_in(&f.c[c]), "HTTP/1.1") == NULL, "plaintext on TLS: no HTTP answer");
    struct http_server_stats st;
    http_server_stats(f.s, &st);
    is_int(st.tls_handshake_failed, 1, "plaintext on TLS: a failed handshake");
    is_int(st.requests, 3, "three requests");
    is_int(st.open, 2, "the two TLS clients still open");
    fx_fini(&f);
}

/* A new pair on disk: new connections get it, connections already open
 * keep theirs and go on being served; an unusable pair never replaces the
 * one serving, and a later good one does. */
static void
test_reload(void)
{
    tfx_write_pair("one", NULL);
    struct http_server_options o = tls_opts();
    o.tls_reload_ms = 10;
    struct fx f;
    fx_init(&f, &o);
    char cn[64];
    struct http_server_stats st;

    int a = fx_connect(&f, true, NULL, 0);
    is_str(get(&f, a, "/a1"), "GET /a1 tls=1 cn=-", "before: served");
    is_str(served_cn(&f, a, cn, sizeof(cn)), "one", "before: the first certificate");

    EVP_PKEY *k2 = NULL;
    tfx_write_pair("two", &k2);
    ok(run_until(&f, (pred_fn)p_reloaded, 1), "the new pair is loaded");
    int b = fx_connect(&f, true, NULL, 0);
    is_str(get(&f, b, "/b1"), "GET /b1 tls=1 cn=-", "after: a new connection served");
    is_str(served_cn(&f, b, cn, sizeof(cn)), "two", "after: with the new certificate");
    is_str(get(&f, a, "/a2"), "GET /a2 tls=1 cn=-", "after: the open connection still served");
    ok(!f.c[a].eof, "after: the open connection not dropped");
    http_server_stats(f.s, &st);
    is_int(st.tls_reloads, 1, "one reload");
    is_int(st.open, 2, "both open");

    /* a certificate whose key is not the one beside it */
    fx_capture(&f);
    EVP_PKEY *k3 = tfx_key_new();
    X509 *x3 = tfx_cert_new(k3, "three", NULL, NULL, false);
    tfx_write_pem("cert.pem", x3, NULL);
    ok(run_until(&f, p_log_unusable, 0), "mismatched pair: logged as unusable");
    fx_release(&f);
    int c = fx_connect(&f, true, NULL, 0);
    is_str(get(&f, c, "/c1"), "GET /c1 tls=1 cn=-", "mismatched pair: still served");
    is_str(served_cn(&f, c, cn, sizeof(cn)), "two", "mismatched pair: the previous certificate");
    http_server_stats(f.s, &st);
    is_int(st.tls_reloads, 1, "mismatched pair: no reload counted");

    /* its key arrives: loaded */
    tfx_write_pem("key.pem", NULL, k3);
    ok(run_until(&f, (pred_fn)p_reloaded, 2), "the completed pair is loaded");
    int d = fx_connect(&f, true, NULL, 0);
    is_str(get(&f, d, "/d1"), "GET /d1 tls=1 cn=-", "completed pair: served");
    is_str(served_cn(&f, d, cn, sizeof(cn)), "three", "completed pair: the third certificate");
    is_str(get(&f, b, "/b2"), "GET /b2 tls=1 cn=-", "completed pair: older connections served");
    is_str(get(&f, a, "/a3"), "GET /a3 tls=1 cn=-", "completed pair: the oldest too");
    http_server_stats(f.s, &st);
    is_int(st.open, 4, "every connection open");
    X509_free(x3);
    EVP_PKEY_free(k3);
    EVP_PKEY_free(k2);
    fx_fini(&f);
}

/* --client-ca-file: a certificate it signed is the request's identity; no
 * certificate is no identity (still served); one it did not sign fails
 * the handshake. */
static void
test_client_cert(void)
{
    tfx_write_pair("server", NULL);
    EVP_PKEY *cak = tfx_key_new(), *other_k = tfx_key_new(), *ck = tfx_key_new();
    X509 *ca = tfx_cert_new(cak, "test-ca", NULL, NULL, true);
    X509 *other = tfx_cert_new(other_k, "other-ca", NULL, NULL, true);
    X509 *good = tfx_cert_new(ck, "alice", ca, cak, false);
    X509 *bad = tfx_cert_new(ck, "mallory", other, other_k, false);
    tfx_write_pem("ca.pem", ca, NULL);
    struct http_server_options o = tls_opts();
    tfx_path(ca_path, sizeof(ca_path), "ca.pem");
    o.client_ca_file = ca_path;
    struct fx f;
    fx_init(&f, &o);

    int a = fx_connect(&f, true, NULL, 0);
    SSL_use_certificate(f.c[a].ssl, good);
    SSL_use_PrivateKey(f.c[a].ssl, ck);
    is_str(get(&f, a, "/a"), "GET /a tls=1 cn=alice", "a certificate the CA signed: its CN");

    int b = fx_connect(&f, true, NULL, 0);
    is_str(get(&f, b, "/b"), "GET /b tls=1 cn=-", "no certificate: served, no identity");

    int c = fx_connect(&f, true, NULL, 0);
    SSL_use_certificate(f.c[c].ssl, bad);
    SSL_use_PrivateKey(f.c[c].ssl, ck);
    tfx_cl_sends(&f.c[c], "GET /c HTTP/1.1\r\nHost: h\r\n\r\n");
    ok(run_until(&f, p_eof, c), "a certificate another CA signed: closed");
    ok(strstr(tfx_cl_in(&f.c[c]), "HTTP/1.1") == NULL, "another CA: no answer");
    struct http_server_stats st;
    http_server_stats(f.s, &st);
    is_int(st.tls_handshake_failed, 1, "another CA: a failed handshake");
    is_int(st.requests, 2, "two requests");
    fx_fini(&f);
    X509_free(ca);
    X509_free(other);
    X509_free(good);
    X509_free(bad);
    EVP_PKEY_free(cak);
    EVP_PKEY_free(other_k);
    EVP_PKEY_free(ck);
}

static void
test_config_errors(void)
{
    struct event_base *base = event_base_new();
    struct http_server *s = NULL;
    char err[512];
    struct th t = {0};
    tfx_write_pair("one", NULL);

    struct http_server_options o = tls_opts();
    o.tls_key_file = NULL;
    err[0] = '\0';
    is_int(http_server_new(base, &o, on_request, &t, &s, err, sizeof(err)), KWC_ECONFIG,
           "a certificate without a key: KWC_ECONFIG");
    ok(strstr(err, "--tls-cert-file") && strstr(err, "--tls-private-key-file"),
       "a certificate without a key: both flags named");

    o = tls_opts();
    char missing[160];
    tfx_path(missing, sizeof(missing), "missing.pem");
    o.tls_cert_file = missing;
    err[0] = '\0';
    is_int(http_server_new(base, &o, on_request, &t, &s, err, sizeof(err)), KWC_ECONFIG,
           "a missing certificate file: KWC_ECONFIG");
    ok(strstr(err, "--tls-cert-file: cannot load") && strstr(err, missing),
       "a missing certificate file: the flag and the path");

    /* a key that is not the certificate's */
    EVP_PKEY *k = tfx_key_new();
    char other[160];
    tfx_path(other, sizeof(other), "other-key.pem");
    tfx_write_pem("other-key.pem", NULL, k);
    EVP_PKEY_free(k);
    o = tls_opts();
    o.tls_key_file = other;
    err[0] = '\0';
    is_int(http_server_new(base, &o, on_request, &t, &s, err, sizeof(err)), KWC_ECONFIG,
           "a key of another certificate: KWC_ECONFIG");
    ok(strstr(err, "does not match the certificate"), "a key of another certificate: said so");

    o = tls_opts();
    char bad_ca[160];
    tfx_path(bad_ca, sizeof(bad_ca), "missing-ca.pem");
    o.client_ca_file = bad_ca;
    err[0] = '\0';
    is_int(http_server_new(base, &o, on_request, &t, &s, err, sizeof(err)), KWC_ECONFIG,
           "a missing client CA file: KWC_ECONFIG");
    ok(strstr(err, "--client-ca-file: cannot load"), "a missing client CA file: the flag");
    ok(s == NULL, "no server on any error");
    event_base_free(base);
}

/* Over the cap a TLS connection is closed before any handshake: no 429
 * (it would need one), no handshake spent. */
static void
test_refused_tls(void)
{
    tfx_write_pair("one", NULL);
    struct http_server_options o = tls_opts();
    o.max_connections = 1;
    struct fx f;
    fx_init(&f, &o);
    int a = fx_connect(&f, true, NULL, 0);
    is_str(get(&f, a, "/a"), "GET /a tls=1 cn=-", "the first: served");
    int b = fx_connect(&f, true, NULL, 0);
    tfx_cl_sends(&f.c[b], "GET /b HTTP/1.1\r\nHost: h\r\n\r\n");
    ok(run_until(&f, p_eof, b), "the second: closed");
    ok(f.c[b].hs_failed, "the second: no handshake");
    is_int(f.c[b].in.len, 0, "the second: nothing answered");
    struct http_server_stats st;
    http_server_stats(f.s, &st);
    is_int(st.refused, 1, "one refused");
    is_int(st.tls_handshake_failed, 0, "no handshake failed on the server");
    is_int(st.open, 1, "the first still open");
    is_str(get(&f, a, "/a2"), "GET /a2 tls=1 cn=-", "the first: still served");
    fx_fini(&f);
}

/* The head timeout covers the handshake: a client that connects and never
 * says hello, or stops halfway through its hello, is closed by it. */
static void
test_handshake_timeout(void)
{
    tfx_write_pair("one", NULL);
    struct http_server_options o = tls_opts();
    o.request_header_timeout_ms = 50;
    struct fx f;
    fx_init(&f, &o);
    int a = fx_connect(&f, false, NULL, 0); /* a socket, no SSL: never a ClientHello */
    int b = fx_connect(&f, false, NULL, 0);
    tfx_cl_sends(&f.c[b],
                 "\x16\x03\x01\x02\x00\x01"); /* a record header and the start of a hello */
    ok(run_until(&f, p_eof, a), "silent: closed");
    ok(run_until(&f, p_eof, b), "half a hello: closed");
    is_int(f.c[a].in.len + f.c[b].in.len, 0, "nothing sent to either");
    struct http_server_stats st;
    http_server_stats(f.s, &st);
    is_int(st.header_timeouts, 2, "two header timeouts");
    is_int(st.open, 0, "none open");
    fx_fini(&f);
}

/* ---- kernel TLS ---- */

/* A client on a new loopback TCP connection (the server adopts the accepted
 * end); tls12: the client goes no higher than TLS 1.2. */
static int
fx_connect_tcp(struct fx *f, bool tls12)
{
    if (f->nc == MAX_CL)
        abort();
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l < 0 || bind(l, (struct sockaddr *)&sa, len) != 0 || listen(l, 1) != 0 ||
        getsockname(l, (struct sockaddr *)&sa, &len) != 0)
        abort();
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c < 0 || connect(c, (struct sockaddr *)&sa, len) != 0)
        abort();
    int a = accept4(l, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (a < 0 || fcntl(c, F_SETFL, O_NONBLOCK) != 0)
        abort();
    close(l);
    struct tfx_cl *cl = &f->c[f->nc];
    *cl = (struct tfx_cl){.fd = c, .ssl = tfx_ssl_new(f->cctx, c, NULL, 0)};
    if (tls12)
        SSL_set_max_proto_version(cl->ssl, TLS1_2_VERSION);
    http_server_adopt(f->s, a, NULL, 0);
    return f->nc++;
}

/* The real kernel's answer (nothing faked): 0 when it has the tls ULP. */
static int kernel_ulp;

static bool
absent(int rc)
{
    return rc == -ENOENT || rc == -ENOPROTOOPT || rc == -EOPNOTSUPP;
}

/* The probe on this kernel: a verdict, and the same one the kernel's list
 * of ULPs gives once the probe ran (it loads the module when it can). */
static void
test_ulp_probe(void)
{
    fake_ulp = -1;
    ulp_calls = 0;
    kernel_ulp = http_tls_ulp_probe();
    printf("# this kernel's tls ULP: %s\n", kernel_ulp == 0 ? "yes" : strerror(-kernel_ulp));
    ok(kernel_ulp == 0 || absent(kernel_ulp), "the probe gives a verdict");
    is_int(ulp_calls, 1, "one TCP_ULP call");
    FILE *fp = fopen("/proc/sys/net/ipv4/tcp_available_ulp", "r");
    if (!fp) {
        printf("# no /proc/sys/net/ipv4/tcp_available_ulp: the cross-check skipped, not passed\n");
        return;
    }
    char line[256] = "";
    if (!fgets(line, sizeof(line), fp))
        line[0] = '\0';
    fclose(fp);
    bool listed = false;
    for (char *save, *t = strtok_r(line, " \n", &save); t; t = strtok_r(NULL, " \n", &save))
        listed |= strcmp(t, "tls") == 0;
    is_int(listed, kernel_ulp == 0, "the probe agrees with tcp_available_ulp");
}

/* The probe's errno (faked) and the path the server takes. */
static void
test_ulp_probe_outcomes(void)
{
    static const struct {
        int err;
        int want;
    } cases[] = {{0, 0},
                 {ENOENT, -ENOENT},
                 {ENOPROTOOPT, -ENOPROTOOPT},
                 {EOPNOTSUPP, -EOPNOTSUPP},
                 {EACCES, -EACCES}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        fake_ulp = cases[i].err;
        ulp_calls = 0;
        char what[64];
        snprintf(what, sizeof(what), "TCP_ULP answering %s", strerror(cases[i].err));
        is_int(http_tls_ulp_probe(), cases[i].want, what);
        /* a probe that could not run (neither yes nor no) tries ::1 too */
        is_int(ulp_calls, cases[i].err == EACCES ? 2 : 1, "...TCP_ULP calls");
    }
    fake_ulp = -1;
}

/* --tls-kernel auto: the server follows the probe (faked both ways) and
 * says so once; a connection whose keys the kernel does not take (here:
 * the faked yes, no ULP behind it) is served with OpenSSL's records. */
static void
test_ktls_auto(void)
{
    tfx_write_pair("one", NULL);
    static const struct {
        int err;
        bool kernel;
        const char *log;
    } cases[] = {{ENOENT, false, "records made by OpenSSL (the kernel has no tls ULP"},
                 {EACCES, false, "records made by OpenSSL (the tls ULP probe could not run"},
                 {0, true, "records made by the kernel: kernel TLS (tls ULP)"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        fake_ulp = cases[i].err;
        struct http_server_options o = tls_opts();
        struct fx f;
        fx_capture(&f);
        int saved = f.saved_err, r = f.log_r;
        fx_init(&f, &o);
        f.saved_err = saved, f.log_r = r;
        log_read(&f);
        ok(strstr(f.log, cases[i].log), cases[i].log);
        struct http_server_stats st;
        http_server_stats(f.s, &st);
        is_int(st.tls_kernel, cases[i].kernel, "...kernel TLS asked of OpenSSL");
        tls_tx_calls = 0;
        int a = fx_connect_tcp(&f, false);
        is_str(get(&f, a, "/k"), "GET /k tls=1 cn=-", "...served");
        is_int(tls_tx_calls > 0, cases[i].kernel, "...OpenSSL offered the kernel the keys");
        http_server_stats(f.s, &st);
        is_int(st.tls_records_openssl, kernel_ulp == 0 && !fake_ulp ? 0 : 1,
               "...records by OpenSSL (the kernel took no keys)");
        fx_fini(&f);
    }
    fake_ulp = -1;
}

/* --tls-kernel off: no probe, OpenSSL never offers the kernel the keys. */
static void
test_ktls_off(void)
{
    tfx_write_pair("one", NULL);
    struct http_server_options o = tls_opts();
    o.tls_kernel = HTTP_TLS_KERNEL_OFF;
    struct fx f;
    fx_capture(&f);
    int saved = f.saved_err, r = f.log_r;
    ulp_calls = tls_tx_calls = 0;
    fx_init(&f, &o);
    f.saved_err = saved, f.log_r = r;
    log_read(&f);
    ok(strstr(f.log, "records made by OpenSSL (kernel TLS turned off)"), "off: said so");
    is_int(ulp_calls, 0, "off: no probe");
    int a = fx_connect_tcp(&f, false);
    is_str(get(&f, a, "/o"), "GET /o tls=1 cn=-", "off: served");
    is_int(tls_tx_calls, 0, "off: the keys stay with OpenSSL");
    struct http_server_stats st;
    http_server_stats(f.s, &st);
    ok(!st.tls_kernel, "off: no kernel TLS");
    is_int(st.tls_records_openssl, 1, "off: OpenSSL's records");
    is_int(st.tls_records_kernel, 0, "off: none by the kernel");
    fx_fini(&f);
}

/* Kernel TLS asked of OpenSSL on this kernel, TLS 1.3 and 1.2: with the
 * tls ULP the kernel makes the records; without, each connection falls
 * back to OpenSSL's and is served the same. */
static void
test_ktls_kernel(void)
{
    tfx_write_pair("one", NULL);
    struct http_server_options o = tls_opts();
    o.tls_kernel = HTTP_TLS_KERNEL_ON;
    struct fx f;
    fx_init(&f, &o);
    tls_tx_calls = 0;
    int a = fx_connect_tcp(&f, false), b = fx_connect_tcp(&f, true);
    char big[200];
    memset(big, 'x', sizeof(big) - 1);
    big[0] = '/';
    big[sizeof(big) - 1] = '\0';
    char want[400];
    snprintf(want, sizeof(want), "GET %s tls=1 cn=-", big);
    is_str(get(&f, a, big), want, "TLS 1.3: served");
    is_str(get(&f, a, "/again"), "GET /again tls=1 cn=-", "TLS 1.3: a second request");
    is_str(get(&f, b, big), want, "TLS 1.2: served");
    is_int(SSL_version(f.c[b].ssl), TLS1_2_VERSION, "TLS 1.2 it is");
    ok(tls_tx_calls >= 2, "OpenSSL offered the kernel each connection's keys");
    struct http_server_stats st;
    http_server_stats(f.s, &st);
    if (kernel_ulp == 0) {
        is_int(st.tls_records_kernel, 2, "the kernel makes both connections' records");
        is_int(st.tls_records_openssl, 0, "OpenSSL none");
        printf("# SKIP the fallback on a kernel that refuses: this kernel has the tls ULP\n");
    } else {
        is_int(st.tls_records_openssl, 2, "the kernel refused: OpenSSL makes the records");
        is_int(st.tls_records_kernel, 0, "the kernel none");
        printf("# SKIP records made by the kernel: this kernel has no tls ULP (%s)\n",
               strerror(-kernel_ulp));
    }
    fx_fini(&f);
}

/* ---- the records a client received (SSL_set_msg_callback) ---- */

#define MAX_RECORDS 256
static size_t rec_len[MAX_RECORDS]; /* application data records: length on the wire */
static int nrec;

static void
on_msg(int write_p, int version, int content_type, const void *buf, size_t len, SSL *ssl, void *arg)
{
    const unsigned char *h = buf;
    if (!write_p && content_type == SSL3_RT_HEADER && len == 5 &&
        h[0] == SSL3_RT_APPLICATION_DATA && nrec < MAX_RECORDS)
        rec_len[nrec++] = ((size_t)h[3] << 8) | h[4];
}

/* A chunked answer has ended ("0\r\n\r\n" last). */
static bool
p_chunked_end(struct fx *f, int i)
{
    const struct tfx_cl *c = &f->c[i];
    return f->c[i].eof ||
           (c->in.len >= 5 && memcmp(tfx_cl_in(c) + c->in.len - 5, "0\r\n\r\n", 5) == 0);
}

/* hresp_write_block over TLS: each chunk's header, data and trailer leave as
 * one piece, so the records are full ones: no record of a few bytes for a
 * chunk's framing (and the body arrives whole). */
static void
test_blocks_records(void)
{
    tfx_write_pair("one", NULL);
    struct http_server_options o = tls_opts();
    struct fx f;
    fx_init(&f, &o);
    int a = fx_connect(&f, true, NULL, 0);
    SSL_set_msg_callback(f.c[a].ssl, on_msg);
    is_str(get(&f, a, "/a"), "GET /a tls=1 cn=-", "a first answer");
    nrec = 0;
    f.c[a].in.len = 0;
    tfx_cl_sends(&f.c[a], "GET /blocks HTTP/1.1\r\nHost: h\r\n\r\n");
    ok(run_until(&f, p_chunked_end, a), "the chunked answer ended");
    const char *in = tfx_cl_in(&f.c[a]), *b = strstr(in, "\r\n\r\n");
    bool whole = b != NULL;
    const char *p = b ? b + 4 : NULL;
    for (int k = 0; whole && k < BLOCKS; k++) {
        whole = strncmp(p, "fff8\r\n", 6) == 0;
        p += 6;
        for (size_t i = 0; whole && i < BLOCK_DATA; i++)
            whole = p[i] == (char)('a' + (i + (size_t)k) % 26);
        p += BLOCK_DATA;
        whole = whole && strncmp(p, "\r\n", 2) == 0;
        p += 2;
    }
    ok(whole && strcmp(p, "0\r\n\r\n") == 0, "the body: each chunk whole, then the end");
    int full = 0, tiny = 0;
    for (int i = 0; i < nrec; i++) {
        full += rec_len[i] == 16384 + 17; /* TLS 1.3: a type byte and a 16-byte tag */
        tiny += rec_len[i] < 64 + 17 && i != nrec - 1;
    }
    printf("# %d application data records, %d full\n", nrec, full);
    ok(full >= BLOCKS * 3, "most records are full ones");
    is_int(tiny, 0, "no record of a few bytes before the last");
    ok(nrec <= BLOCKS * 5 + 2, "at most five records per 64 KiB chunk");
    fx_fini(&f);
}

int
main(void)
{
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    tfx_dir_open("htls_test");
    TAP_RUN(test_handshake);
    TAP_RUN(test_reload);
    TAP_RUN(test_client_cert);
    TAP_RUN(test_config_errors);
    TAP_RUN(test_refused_tls);
    TAP_RUN(test_handshake_timeout);
    TAP_RUN(test_ulp_probe);
    TAP_RUN(test_ulp_probe_outcomes);
    TAP_RUN(test_ktls_auto);
    TAP_RUN(test_ktls_off);
    TAP_RUN(test_ktls_kernel);
    TAP_RUN(test_blocks_records);
    tfx_dir_close();
    return tap_done();
}
