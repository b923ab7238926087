/*
 * tlsfx.h — the TLS side of the HTTP layer's unit tests (htls_test.c,
 * hpipe_test.c, hstream_test.c; h2_test.c for ALPN).
 *
 * Keys and certificates are made with OpenSSL (P-256, self-signed or signed
 * by a CA made here) and written to a scratch directory (tfx_dir_open); a
 * file is replaced by a rename(2) of a new one, as a Secret volume does.
 *
 * The client is one end of a socketpair(AF_UNIX) whose other end the server
 * adopts: plain bytes, or an SSL object (the server's certificate is not
 * verified) pumped between loop turns without ever blocking. Two ways to
 * run the loop: tfx_run_quiet turns it (EVLOOP_NONBLOCK) until nothing
 * moves, bounded; tfx_wait turns it (EVLOOP_ONCE) until a predicate holds,
 * bounded by a guard timer that only fires when the server never acts (a
 * failure, not a margin). Never a sleep.
 */
#ifndef KWC_TEST_TLSFX_H
#define KWC_TEST_TLSFX_H

#include <errno.h>
#include <event2/event.h>
#include <ftw.h>
#include <linux/sockios.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kwc/gostr.h"
#include "tap.h"

#define TFX_RUN_MAX 200000 /* loop turns before "it never goes quiet" */
#define TFX_QUIET_TURNS 3  /* turns without a change that make "quiet" */
#define TFX_GUARD_MS 10000 /* bound on one tfx_wait; never reached when all is well */

/* ---- the scratch directory ---- */

static char tfx_dir[64];
/* tfx_dir's cert.pem and key.pem: the pair tfx_write_pair writes */
static char tfx_cert_path[128], tfx_key_path[128];

static inline void
tfx_path(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", tfx_dir, name);
}

/* A fresh /tmp/<name>.XXXXXX. */
static inline void
tfx_dir_open(const char *name)
{
    snprintf(tfx_dir, sizeof(tfx_dir), "/tmp/%s.XXXXXX", name);
    if (!mkdtemp(tfx_dir))
        abort();
    tfx_path(tfx_cert_path, sizeof(tfx_cert_path), "cert.pem");
    tfx_path(tfx_key_path, sizeof(tfx_key_path), "key.pem");
}

static inline int
tfx_rm(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(p);
}

/* Remove the directory and everything in it. */
static inline void
tfx_dir_close(void)
{
    if (nftw(tfx_dir, tfx_rm, 16, FTW_DEPTH | FTW_PHYS) != 0)
        printf("# could not remove %s\n", tfx_dir);
}

/* ---- keys and certificates ---- */

static long tfx_serial = 1;

/* New; aborts on failure. */
static inline EVP_PKEY *
tfx_key_new(void)
{
    EVP_PKEY *k = EVP_EC_gen("P-256");
    if (!k)
        abort();
    return k;
}

static inline void
tfx_add_ext(X509 *x, X509 *issuer, int nid, const char *value)
{
    X509V3_CTX ctx;
    X509V3_set_ctx(&ctx, issuer, x, NULL, NULL, 0);
    X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    if (!e || !X509_add_ext(x, e, -1))
        abort();
    X509_EXTENSION_free(e);
}

/* New: a certificate for key (borrowed) with subject CN=cn, signed by
 * (ca, ca_key) or by itself; a CA when ca_flag. */
static inline X509 *
tfx_cert_new(EVP_PKEY *key, const char *cn, X509 *ca, EVP_PKEY *ca_key, bool ca_flag)
{
    X509 *x = X509_new();
    if (!x)
        abort();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), tfx_serial++);
    X509_gmtime_adj(X509_getm_notBefore(x), -3600);
    X509_gmtime_adj(X509_getm_notAfter(x), 86400);
    X509_set_pubkey(x, key);
    X509_NAME *n = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
    X509_set_issuer_name(x, ca ? X509_get_subject_name(ca) : n);
    if (ca_flag) {
        tfx_add_ext(x, ca ? ca : x, NID_basic_constraints, "critical,CA:TRUE");
        tfx_add_ext(x, ca ? ca : x, NID_key_usage, "critical,keyCertSign,cRLSign");
    }
    if (!X509_sign(x, ca_key ? ca_key : key, EVP_sha256()))
        abort();
    return x;
}

/* Write x and/or k (borrowed, either may be NULL) as PEM to name in
 * tfx_dir, by a rename of a new file (a new inode, as a Secret volume's
 * update). */
static inline void
tfx_write_pem(const char *name, X509 *x, EVP_PKEY *k)
{
    char tmp[128], dst[128];
    tfx_path(tmp, sizeof(tmp), ".tmp");
    tfx_path(dst, sizeof(dst), name);
    FILE *f = fopen(tmp, "w");
    if (!f)
        abort();
    if (x && !PEM_write_X509(f, x))
        abort();
    if (k && !PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL))
        abort();
    if (fclose(f) != 0 || rename(tmp, dst) != 0)
        abort();
}

/* A self-signed serving pair for CN=cn as tfx_cert_path and tfx_key_path;
 * keep_key: the key, new (else NULL). */
static inline void
tfx_write_pair(const char *cn, EVP_PKEY **keep_key)
{
    EVP_PKEY *k = tfx_key_new();
    X509 *x = tfx_cert_new(k, cn, NULL, NULL, false);
    tfx_write_pem("cert.pem", x, NULL);
    tfx_write_pem("key.pem", NULL, k);
    X509_free(x);
    if (keep_key)
        *keep_key = k;
    else
        EVP_PKEY_free(k);
}

/* ---- the client ---- */

/* New: a client context that does not verify the server. A write may be
 * retried from a buffer that moved (the clients' output grows by realloc). */
static inline SSL_CTX *
tfx_client_ctx(void)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx)
        abort();
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    return ctx;
}

/* New: a client SSL object on fd (borrowed), its handshake started by the
 * first read or write; alpn: the protocols it offers (wire format) or NULL. */
static inline SSL *
tfx_ssl_new(SSL_CTX *ctx, int fd, const unsigned char *alpn, size_t alpn_len)
{
    SSL *ssl = SSL_new(ctx);
    if (!ssl)
        abort();
    SSL_set_fd(ssl, fd);
    SSL_set_connect_state(ssl);
    if (alpn && SSL_set_alpn_protos(ssl, alpn, (unsigned)alpn_len) != 0)
        abort();
    return ssl;
}

struct tfx_cl {
    int fd;   /* -1 once closed */
    SSL *ssl; /* NULL: plaintext */
    bool hs_done, hs_failed, eof;
    bool close_notify;    /* the server ended TLS with close_notify */
    bool paused;          /* not reading: the server's bytes wait in the kernel */
    struct gostr_buf in;  /* every byte received, NUL-terminated */
    struct gostr_buf out; /* what waits to be sent */
};

/* A client on one end of a new socketpair; tls: its context (an SSL object
 * offering alpn, see tfx_ssl_new), NULL: plaintext. Returns the other end,
 * for the server to adopt. */
static inline int
tfx_cl_open(struct tfx_cl *c, SSL_CTX *tls, const unsigned char *alpn, size_t alpn_len)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
        abort();
    *c = (struct tfx_cl){.fd = sv[0]};
    if (tls)
        c->ssl = tfx_ssl_new(tls, sv[0], alpn, alpn_len);
    return sv[1];
}

static inline void
tfx_cl_send(struct tfx_cl *c, const void *p, size_t n)
{
    gostr_addn(&c->out, p, n);
}

static inline void
tfx_cl_sends(struct tfx_cl *c, const char *s)
{
    tfx_cl_send(c, s, strlen(s));
}

/* What c received, as a string ("" when nothing). */
static inline const char *
tfx_cl_in(const struct tfx_cl *c)
{
    return c->in.p ? c->in.p : "";
}

/* Move what can move on c's side, without blocking: the handshake, then
 * what waits to be sent, then (unless paused) everything to read. */
static inline void
tfx_cl_pump(struct tfx_cl *c)
{
    if (c->fd < 0 || c->eof)
        return;
    if (c->ssl && !c->hs_done) {
        int rc = SSL_do_handshake(c->ssl);
        if (rc != 1) {
            int e = SSL_get_error(c->ssl, rc);
            if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
                c->hs_failed = c->eof = true;
            ERR_clear_error();
            return;
        }
        c->hs_done = true;
    }
    while (c->out.len) {
        size_t n = c->out.len > 16384 ? 16384 : c->out.len;
        ssize_t w =
            c->ssl ? SSL_write(c->ssl, c->out.p, (int)n) : send(c->fd, c->out.p, n, MSG_NOSIGNAL);
        if (w <= 0)
            break;
        memmove(c->out.p, c->out.p + w, c->out.len - (size_t)w);
        c->out.len -= (size_t)w;
    }
    char buf[65536];
    while (!c->paused) {
        ssize_t n =
            c->ssl ? SSL_read(c->ssl, buf, (int)sizeof(buf)) : recv(c->fd, buf, sizeof(buf), 0);
        if (n > 0) {
            gostr_addn(&c->in, buf, (size_t)n);
            continue;
        }
        if (c->ssl) {
            int e = SSL_get_error(c->ssl, (int)n);
            if (e == SSL_ERROR_ZERO_RETURN)
                c->close_notify = true;
            if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
                c->eof = true;
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            c->eof = true;
        }
        break;
    }
    ERR_clear_error();
}

/* Bytes c wrote that the server has not read (its socket's send queue);
 * -1 once closed. */
static inline int
tfx_cl_unread(const struct tfx_cl *c)
{
    int q = 0;
    if (c->fd < 0 || ioctl(c->fd, SIOCOUTQ, &q) != 0)
        return -1;
    return q;
}

/* Close c's end (the server sees the end); its buffers stay. */
static inline void
tfx_cl_close(struct tfx_cl *c)
{
    if (c->ssl)
        SSL_free(c->ssl);
    c->ssl = NULL;
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}

static inline void
tfx_cl_fini(struct tfx_cl *c)
{
    tfx_cl_close(c);
    free(c->in.p);
    free(c->out.p);
    c->in = c->out = (struct gostr_buf){0};
}

/* ---- running the loop ---- */

/* A sum that changes whenever a byte moves on the clients' side (weighted
 * so that bytes leaving one buffer and arriving in another do not cancel). */
static inline unsigned long long
tfx_moved(const struct tfx_cl *c, int nc)
{
    unsigned long long v = 0;
    for (int i = 0; i < nc; i++) {
        v += c[i].in.len + c[i].out.len * 3 + c[i].eof + c[i].hs_done;
        int q = tfx_cl_unread(&c[i]);
        v += q > 0 ? (unsigned)q * 7919u : 0;
    }
    return v;
}

/* The server side's count of what happened (hooks that ran). */
typedef unsigned long long (*tfx_progress_cb)(void *arg);

/* Turn base (EVLOOP_NONBLOCK) and pump the nc clients c until neither
 * tfx_moved nor progress(arg) changes for TFX_QUIET_TURNS turns; a failed
 * check when that never happens. */
static inline void
tfx_run_quiet(struct event_base *base, struct tfx_cl *c, int nc, tfx_progress_cb progress,
              void *arg)
{
    int idle = 0, i;
    for (i = 0; i < TFX_RUN_MAX && idle < TFX_QUIET_TURNS; i++) {
        unsigned long long before = tfx_moved(c, nc) + progress(arg);
        event_base_loop(base, EVLOOP_NONBLOCK);
        for (int k = 0; k < nc; k++)
            tfx_cl_pump(&c[k]);
        idle = tfx_moved(c, nc) + progress(arg) != before ? 0 : idle + 1;
    }
    if (i == TFX_RUN_MAX)
        ok(0, "the loop goes quiet");
}

typedef bool (*tfx_done_cb)(void *arg);

static inline void
tfx_on_guard(evutil_socket_t fd, short what, void *arg)
{
    *(bool *)arg = true;
}

/* Pump the nc clients c and turn base (EVLOOP_ONCE: it blocks until
 * something happens) until done(arg) holds, or TFX_GUARD_MS pass. Returns
 * done(arg). */
static inline bool
tfx_wait(struct event_base *base, struct tfx_cl *c, int nc, tfx_done_cb done, void *arg)
{
    bool fired = false, got = false;
    struct event *guard = evtimer_new(base, tfx_on_guard, &fired);
    struct timeval tv = {TFX_GUARD_MS / 1000, (TFX_GUARD_MS % 1000) * 1000};
    evtimer_add(guard, &tv);
    for (int n = 0; n < TFX_RUN_MAX; n++) {
        for (int k = 0; k < nc; k++)
            tfx_cl_pump(&c[k]);
        if ((got = done(arg)) || fired)
            break;
        event_base_loop(base, EVLOOP_ONCE);
    }
    event_free(guard);
    return got;
}

#endif
