/*
 * htls.c — the server's TLS: one SSL_CTX at a time (protocol floor, Go's
 * TLS 1.3 suite order, ALPN h2 and http/1.1, client CAs verified when presented),
 * built from the certificate and key files; a timer stats the files and
 * builds a new context when they change (connections keep the context they
 * started with: SSL_new holds a reference). A pair that fails to load is
 * logged once and the previous context serves on. Also a request's TLS
 * identity (hreq_client_cert, hreq_tls).
 */
#include "conn.h"

#include <errno.h>
#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

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

/* A new server context from the files; NULL with a message in err. */
static SSL_CTX *
ctx_build(const struct http_server_options *o, char *err, size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        ssl_err(err, errlen, "cannot create a TLS context", "");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, o->tls_min_version ? o->tls_min_version : TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                                 SSL_OP_NO_COMPRESSION);
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
    SSL_CTX *ctx = ctx_build(&s->o, err, sizeof(err));
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
    s->stats.tls_reloads++;
    log_info("tls: reloaded the serving certificate from %s", s->o.tls_cert_file);
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
    s->ctx = ctx_build(&s->o, err, errlen);
    if (!s->ctx)
        return KWC_ECONFIG;
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
