/*
 * htls.c — the server's TLS: one SSL_CTX at a time (protocol floor, Go's
 * TLS 1.3 suite order, ALPN h2 and http/1.1, client CAs verified when presented),
 * built from the certificate and key files; a timer stats the files and
 * builds a new context when they change (connections keep the context they
 * started with: SSL_new holds a reference). A pair that fails to load is
 * logged once and the previous context serves on. Also a request's TLS
 * identity (hreq_client_cert, hreq_tls).
 *
 * Kernel TLS: at start the kernel is asked for its "tls" TCP ULP on a
 * loopback connection of our own (http_tls_ulp_probe); when it has one,
 * every context gets SSL_OP_ENABLE_KTLS and OpenSSL hands each connection's
 * keys to the kernel once its handshake is done (on the socket BIO the
 * OpenSSL bufferevent makes from the fd: BIO_new_socket). A connection the
 * kernel refuses (a cipher it lacks) keeps OpenSSL's records, silently:
 * OpenSSL falls back by itself. Which one served is counted per connection
 * (http.c, at the handshake's end, with htls_ktls_send).
 */
#include "conn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/log.h"

static int
stamp_of(const char *path, struct tls_stamp *st)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return -errno;
    st->dev = sb.st_dev;
    st->ino = sb.st_ino;
    st->size = sb.st_size;
    st->mtime = sb.st_mtim;
    return 0;
}

static bool
stamp_eq(const struct tls_stamp *a, const struct tls_stamp *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec;
}

static int
on_alpn(SSL *ssl, const unsigned char **out, unsigned char *outlen, const unsigned char *in,
        unsigned int inlen, void *arg)
{
    /* h2 first: the server's order wins (SSL_select_next_proto walks ours),
     * as Go's server prefers h2 */
    static const unsigned char ours[] = "\x02h2\x08http/1.1";
    unsigned char *sel;
    if (SSL_select_next_proto(&sel, outlen, ours, sizeof(ours) - 1, in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_NOACK; /* no common protocol: go on without ALPN */
    *out = sel;
    return SSL_TLSEXT_ERR_OK;
}

static void
ssl_err(char *err, size_t errlen, const char *what, const char *file)
{
    unsigned long e = ERR_peek_last_error();
    char buf[256] = "";
    if (e)
        ERR_error_string_n(e, buf, sizeof(buf));
    ERR_clear_error();
    snprintf(err, errlen, "%s %s: %s", what, file, buf[0] ? buf : "unknown OpenSSL error");
}

/* A new server context from the files (ktls: SSL_OP_ENABLE_KTLS); NULL
 * with a message in err. */
static SSL_CTX *
ctx_build(const struct http_server_options *o, bool ktls, char *err, size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        ssl_err(err, errlen, "cannot create a TLS context", "");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, o->tls_min_version ? o->tls_min_version : TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                                 SSL_OP_NO_COMPRESSION);
    if (ktls)
        SSL_CTX_set_options(ctx, SSL_OP_ENABLE_KTLS);
    /* TLS 1.3 suites in Go's order (kube-apiserver's): AES-128-GCM first, it
     * costs ~30 % less per byte than OpenSSL's default AES-256-GCM */
    SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256:"
                                  "TLS_AES_256_GCM_SHA384");
    /* memory per idle connection: OpenSSL frees its record buffers when idle */
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_SERVER);
    SSL_CTX_set_session_id_context(ctx, (const unsigned char *)"kwc", 3);
    if (SSL_CTX_use_certificate_chain_file(ctx, o->tls_cert_file) != 1) {
        ssl_err(err, errlen, "--tls-cert-file: cannot load", o->tls_cert_file);
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, o->tls_key_file, SSL_FILETYPE_PEM) != 1) {
        if (ERR_GET_REASON(ERR_peek_last_error()) != X509_R_KEY_VALUES_MISMATCH) {
            ssl_err(err, errlen, "--tls-private-key-file: cannot load", o->tls_key_file);
            goto fail;
        }
        ERR_clear_error();
        snprintf(err, errlen,
                 "--tls-private-key-file %s does not match the certificate in --tls-cert-file %s",
                 o->tls_key_file, o->tls_cert_file);
        goto fail;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        ERR_clear_error();
        snprintf(err, errlen,
                 "--tls-private-key-file %s does not match the certificate in --tls-cert-file %s",
                 o->tls_key_file, o->tls_cert_file);
        goto fail;
    }
    if (o->client_ca_file) {
        if (SSL_CTX_load_verify_locations(ctx, o->client_ca_file, NULL) != 1) {
            ssl_err(err, errlen, "--client-ca-file: cannot load", o->client_ca_file);
            goto fail;
        }
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(o->client_ca_file);
        if (names)
            SSL_CTX_set_client_CA_list(ctx, names);
        /* verified when presented; a certificate is not required (the
         * request may authenticate otherwise) */
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    }
    SSL_CTX_set_alpn_select_cb(ctx, on_alpn, NULL);
    return ctx;
fail:
    SSL_CTX_free(ctx);
    return NULL;
}

static void
on_reload(evutil_socket_t fd, short what, void *arg)
{
    struct http_server *s = arg;
    struct tls_stamp c, k;
    if (stamp_of(s->o.tls_cert_file, &c) != 0 || stamp_of(s->o.tls_key_file, &k) != 0)
        return; /* mid-replacement, or gone: keep serving what is loaded */
    if (stamp_eq(&c, &s->st_cert) && stamp_eq(&k, &s->st_key))
        return;
    if (stamp_eq(&c, &s->st_failed_cert) && stamp_eq(&k, &s->st_failed_key))
        return; /* this pair failed already: wait for another change */
    char err[512];
    SSL_CTX *ctx = ctx_build(&s->o, s->stats.tls_kernel, err, sizeof(err));
    if (!ctx) {
        log_warnx("tls: the certificate files changed but cannot be used (%s); still serving the "
                  "previous certificate",
                  err);
        s->st_failed_cert = c;
        s->st_failed_key = k;
        return;
    }
    SSL_CTX_free(s->ctx); /* connections hold their own reference */
    s->ctx = ctx;
    s->st_cert = c;
    s->st_key = k;
    HSTAT_ADD(s->stats.tls_reloads, 1);
    log_info("tls: reloaded the serving certificate from %s", s->o.tls_cert_file);
}

/* ---- kernel TLS ---- */

/* The tls ULP on the accepted end of a new loopback connection (the ULP
 * needs an established socket): 0 or -errno. */
static int
ulp_try(int family)
{
    struct sockaddr_storage ss = {0};
    socklen_t len;
    if (family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)&ss;
        in->sin_family = AF_INET;
        in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        len = sizeof(*in);
    } else {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
        in6->sin6_family = AF_INET6;
        in6->sin6_addr = in6addr_loopback;
        len = sizeof(*in6);
    }
    int l = -1, c = -1, a = -1, rc;
    l = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l < 0 || bind(l, (struct sockaddr *)&ss, len) != 0 || listen(l, 1) != 0 ||
        getsockname(l, (struct sockaddr *)&ss, &len) != 0)
        goto fail;
    c = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    /* a loopback connect completes at once, into the backlog */
    if (c < 0 || connect(c, (struct sockaddr *)&ss, len) != 0)
        goto fail;
    a = accept4(l, NULL, NULL, SOCK_CLOEXEC);
    if (a < 0)
        goto fail;
    rc = setsockopt(a, IPPROTO_TCP, TCP_ULP, "tls", 3) == 0 ? 0 : -errno;
    goto out;
fail:
    rc = -errno;
out:
    if (a >= 0)
        close(a);
    if (c >= 0)
        close(c);
    if (l >= 0)
        close(l);
    return rc;
}

static bool
ulp_absent(int rc)
{
    return rc == -ENOENT || rc == -ENOPROTOOPT || rc == -EOPNOTSUPP;
}

int
http_tls_ulp_probe(void)
{
    int rc = ulp_try(AF_INET);
    if (rc != 0 && !ulp_absent(rc)) {
        int rc6 = ulp_try(AF_INET6); /* a host without 127.0.0.1 */
        if (rc6 == 0 || ulp_absent(rc6))
            rc = rc6;
    }
    return rc;
}

bool
htls_ktls_send(SSL *ssl)
{
    BIO *b = SSL_get_wbio(ssl);
    return b && BIO_get_ktls_send(b);
}

/* Kernel TLS or not, for every context of s; logged once. */
static bool
ktls_decide(const struct http_server_options *o)
{
#ifdef OPENSSL_NO_KTLS
    if (o->tls_kernel != HTTP_TLS_KERNEL_OFF)
        log_info("tls: records made by OpenSSL (this OpenSSL was built without kernel TLS)");
    return false;
#else
    if (o->tls_kernel == HTTP_TLS_KERNEL_OFF) {
        log_info("tls: records made by OpenSSL (kernel TLS turned off)");
        return false;
    }
    if (o->tls_kernel == HTTP_TLS_KERNEL_ON) {
        log_info("tls: kernel TLS asked for without a probe; connections the kernel refuses keep "
                 "OpenSSL's records");
        return true;
    }
    int rc = http_tls_ulp_probe();
    if (rc == 0) {
        log_info("tls: records made by the kernel: kernel TLS (tls ULP); a connection whose "
                 "cipher the kernel lacks keeps OpenSSL's");
        return true;
    }
    if (ulp_absent(rc))
        log_info("tls: records made by OpenSSL (the kernel has no tls ULP: %s)", strerror(-rc));
    else
        log_info("tls: records made by OpenSSL (the tls ULP probe could not run: %s)",
                 strerror(-rc));
    return false;
#endif
}

int
htls_init(struct http_server *s, char *err, size_t errlen)
{
    const struct http_server_options *o = &s->o;
    if (!o->tls_cert_file && !o->tls_key_file)
        return 0;
    if (!o->tls_cert_file || !o->tls_key_file)
        return kwc_errf(err, errlen, KWC_ECONFIG,
                        "TLS needs both --tls-cert-file and --tls-private-key-file");
    s->ctx = ctx_build(&s->o, false, err, errlen);
    if (!s->ctx)
        return KWC_ECONFIG;
    /* the files load: now which path makes the records */
    if (ktls_decide(o)) {
        HSTAT_SET(s->stats.tls_kernel, true);
        SSL_CTX_set_options(s->ctx, SSL_OP_ENABLE_KTLS);
    }
    stamp_of(o->tls_cert_file, &s->st_cert);
    stamp_of(o->tls_key_file, &s->st_key);
    s->reload_timer = event_new(s->base, -1, EV_PERSIST, on_reload, s);
    struct timeval tv = {s->o.tls_reload_ms / 1000, (s->o.tls_reload_ms % 1000) * 1000};
    evtimer_add(s->reload_timer, &tv);
    return 0;
}

/* ---- a request's TLS identity ---- */

X509 *
hreq_client_cert(const struct hreq *r)
{
    SSL *ssl = r->c->ssl;
    if (!ssl || !r->c->s->o.client_ca_file)
        return NULL;
    if (SSL_get_verify_result(ssl) != X509_V_OK)
        return NULL;
    return SSL_get0_peer_certificate(ssl);
}

bool
hreq_tls(const struct hreq *r)
{
    return r->c->ssl != NULL;
}

const char *
http_tls_library(void)
{
    return OpenSSL_version(OPENSSL_VERSION);
}
