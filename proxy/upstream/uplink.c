/*
 * uplink.c — kwc's identity towards the upstream (see uplink.h): TLS
 * material checked and loaded once, kwc's credentials, and the one table of
 * headers never forwarded or relayed.
 *
 * Owns the SSL_CTX of kwc's own upstream connections (tunnels), their DNS
 * base and how they are opened (uplink_connect); curl builds its own TLS contexts from the same
 * kubeconfig blobs (uplink_curl_setup), so both stacks trust and present the same certificates.
 * Nothing here is process-wide: everything hangs off the uplink, freed with it.
 *
 * Loops: an owner (uplink_new) and its siblings (one per serving loop) share
 * a struct shared (uplink.h's threading contract). What never changes after
 * start (kcfg, SSL_CTX, SNI, the basic line) is read without a lock; the
 * bearer line of a token file and the list of uplinks are under mu; an exec
 * credential is excred's (its own mutex, references). Each uplink keeps its
 * own waiters and a mailbox on its loop: a credential change on the owner's
 * loop posts one wake to every uplink, which wakes its waiters there.
 */
#include "kwc/uplink.h"

#include <arpa/inet.h>
#include <assert.h>
#include <curl/curl.h>
#include <errno.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/dns.h>
#include <event2/util.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "kwc/base.h"
#include "kwc/execcred.h"
#include "kwc/kubeconfig.h"
#include "kwc/log.h"
#include "kwc/mailbox.h"

#define UPLINK_MAGIC 0x75706c6bu /* "uplk" */
#define TOKEN_REREAD_S 60

/* What an owner and its siblings share. */
struct shared {
    const struct kcfg *k;
    SSL_CTX *tls;        /* https:// only; never replaced (SSL_new: any thread) */
    char sni[256];       /* tls-server-name, or the server's host */
    char *basic;         /* "Authorization: Basic ..." or NULL */
    struct excred *exec; /* the kubeconfig's exec plugin (the owner's loop), or NULL */
    pthread_mutex_t mu;  /* guards what follows; never held across I/O */
    char *bearer;        /* "Authorization: Bearer ..." or NULL */
    time_t bearer_read_at;
    bool bearer_reading; /* a thread is reading the token file */
    unsigned reread_s;
    LIST_HEAD(, uplink) all; /* the owner and its siblings, told of new credentials */
};

struct uplink {
    uint32_t magic;
    struct event_base *base;
    struct shared *sh;
    bool owner;             /* made by uplink_new: frees sh */
    struct evdns_base *dns; /* on first use, on this loop */
    struct mailbox *mb;     /* this loop's: a new credential (on_news) */
    TAILQ_HEAD(, uplink_waiter) waiters;
    LIST_ENTRY(uplink) link; /* on sh->all */
};

/* ---- TLS material, checked at start ---- */

/* OpenSSL's last error as text ("" when none). */
static const char *
ssl_reason(void)
{
    unsigned long e = ERR_peek_last_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    return r ? r : "not PEM";
}

/*
 * The kubeconfig's CA, client certificate and key, read as libcurl will read
 * them, so that a broken file is one clear error at start instead of an
 * OpenSSL message on every request ("unable to set private key file: memory
 * blob"): the certificate and key must parse and belong together.
 */
static int
check_tls_material(const struct kcfg *k, char *err, size_t errlen)
{
    int rc = 0;
    X509 *cert = NULL;
    EVP_PKEY *key = NULL;
    BIO *b;
    ERR_clear_error();
    if (k->ca_pem) {
        b = BIO_new_mem_buf(k->ca_pem, (int)k->ca_pem_len);
        X509 *ca = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
        BIO_free(b);
        if (!ca) {
            snprintf(err, errlen,
                     "the certificate-authority data in KUBECONFIG is not a PEM certificate (%s)",
                     ssl_reason());
            return KWC_ECONFIG;
        }
        X509_free(ca);
    }
    if (!k->cert_pem && !k->key_pem)
        return 0;
    if (!k->cert_pem || !k->key_pem) {
        snprintf(err, errlen,
                 "KUBECONFIG has a client %s but no client %s: give both "
                 "client-certificate(-data) and client-key(-data), or neither",
                 k->cert_pem ? "certificate" : "key", k->cert_pem ? "key" : "certificate");
        return KWC_ECONFIG;
    }
    b = BIO_new_mem_buf(k->cert_pem, (int)k->cert_pem_len);
    cert = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    if (!cert) {
        snprintf(err, errlen, "the client certificate in KUBECONFIG is not a PEM certificate (%s)",
                 ssl_reason());
        rc = KWC_ECONFIG;
        goto out;
    }
    b = BIO_new_mem_buf(k->key_pem, (int)k->key_pem_len);
    key = b ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    if (!key) {
        snprintf(err, errlen,
                 "the client key in KUBECONFIG is not a PEM private key (%s; an encrypted "
                 "key is not supported)",
                 ssl_reason());
        rc = KWC_ECONFIG;
        goto out;
    }
    if (X509_check_private_key(cert, key) != 1) {
        char subj[256] = "";
        X509_NAME_oneline(X509_get_subject_name(cert), subj, sizeof(subj));
        snprintf(err, errlen,
                 "the client key in KUBECONFIG does not match its client certificate "
                 "(%s): give the key the certificate was issued for",
                 subj);
        rc = KWC_ECONFIG;
    }
out:
    X509_free(cert);
    EVP_PKEY_free(key);
    ERR_clear_error();
    return rc;
}

static int
load_pem_certs(X509_STORE *store, const unsigned char *pem, size_t len)
{
    BIO *b = BIO_new_mem_buf(pem, (int)len);
    int n = 0;
    X509 *x;
    while ((x = PEM_read_bio_X509(b, NULL, NULL, NULL))) {
        if (X509_STORE_add_cert(store, x) == 1)
            n++;
        X509_free(x);
    }
    ERR_clear_error();
    BIO_free(b);
    return n;
}

/* The SSL_CTX of kwc's own connections (settings immutable once built). */
static SSL_CTX *
tls_ctx_new(const struct kcfg *k)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    static const unsigned char alpn[] = "\x08http/1.1"; /* upgrades need HTTP/1.1 */
    SSL_CTX_set_alpn_protos(ctx, alpn, sizeof(alpn) - 1);
    if (k->insecure_skip_tls_verify) {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    } else {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        if (!k->ca_pem ||
            load_pem_certs(SSL_CTX_get_cert_store(ctx), k->ca_pem, k->ca_pem_len) == 0)
            SSL_CTX_set_default_verify_paths(ctx);
    }
    if (k->cert_pem && k->key_pem) {
        BIO *b = BIO_new_mem_buf(k->cert_pem, (int)k->cert_pem_len);
        X509 *x = PEM_read_bio_X509(b, NULL, NULL, NULL);
        BIO_free(b);
        b = BIO_new_mem_buf(k->key_pem, (int)k->key_pem_len);
        EVP_PKEY *pk = PEM_read_bio_PrivateKey(b, NULL, NULL, NULL);
        BIO_free(b);
        if (!x || !pk || SSL_CTX_use_certificate(ctx, x) != 1 ||
            SSL_CTX_use_PrivateKey(ctx, pk) != 1)
            log_warnx("tunnel: the kubeconfig's client certificate or key could not be loaded");
        X509_free(x);
        EVP_PKEY_free(pk);
    }
    ERR_clear_error();
    return ctx;
}

/* ---- lifecycle ---- */

static void bearer_refresh(struct shared *sh);

/* u's loop: a credential may be there; wake the waiters while one is. */
static void
on_news(void *arg)
{
    struct uplink *u = arg;
    struct uplink_waiter *w;
    while ((w = TAILQ_FIRST(&u->waiters))) {
        struct excred_cred *c = excred_acquire(u->sh->exec);
        if (!c)
            return; /* gone again (expired, another 401): the next news */
        excred_cred_free(c);
        TAILQ_REMOVE(&u->waiters, w, link);
        w->queued = false;
        w->on_ready(w->arg);
    }
}

/* The owner's loop: the exec credential changed; tell every loop. */
static void
on_cred_change(void *arg)
{
    struct shared *sh = arg;
    pthread_mutex_lock(&sh->mu);
    struct uplink *u;
    LIST_FOREACH(u, &sh->all, link)
    mailbox_post(u->mb, on_news, u); /* freed only after leaving the list */
    pthread_mutex_unlock(&sh->mu);
}

static struct uplink *
view_new(struct shared *sh, struct event_base *base, bool owner)
{
    struct uplink *u = xcalloc(1, sizeof(*u));
    u->magic = UPLINK_MAGIC;
    u->base = base;
    u->sh = sh;
    u->owner = owner;
    u->mb = mailbox_new(base);
    TAILQ_INIT(&u->waiters);
    pthread_mutex_lock(&sh->mu);
    LIST_INSERT_HEAD(&sh->all, u, link);
    pthread_mutex_unlock(&sh->mu);
    return u;
}

int
uplink_new(struct event_base *base, const struct kcfg *k, struct uplink **out, char *err,
           size_t errlen)
{
    int rc = check_tls_material(k, err, errlen);
    if (rc)
        return rc;
    struct shared *sh = xcalloc(1, sizeof(*sh));
    sh->k = k;
    pthread_mutex_init(&sh->mu, NULL);
    LIST_INIT(&sh->all);
    sh->reread_s = TOKEN_REREAD_S;
    bool tls;
    char host[256], port[16];
    kcfg_server_hostport(k->server, &tls, host, sizeof(host), port, sizeof(port));
    snprintf(sh->sni, sizeof(sh->sni), "%s", k->tls_server_name ? k->tls_server_name : host);
    if (tls)
        sh->tls = tls_ctx_new(k);
    if (k->token)
        sh->bearer = xasprintf("Authorization: Bearer %s", k->token);
    if (k->username) {
        char *up = xasprintf("%s:%s", k->username, k->password ? k->password : "");
        size_t ul = strlen(up);
        char *b64 = xmalloc(4 * ((ul + 2) / 3) + 1);
        EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)up, (int)ul);
        sh->basic = xasprintf("Authorization: Basic %s", b64);
        free(b64);
        free(up);
    }
    if (k->exec) {
        sh->exec = excred_new(base, k->exec); /* its first run starts from the loop */
        excred_on_change(sh->exec, on_cred_change, sh);
    }
    if (k->token_file)
        bearer_refresh(sh); /* a token file unreadable at start: said now */
    *out = view_new(sh, base, true);
    return 0;
}

struct uplink *
uplink_new_sibling(struct uplink *owner, struct event_base *base)
{
    assert(owner->magic == UPLINK_MAGIC && owner->owner);
    return view_new(owner->sh, base, false);
}

static void
free_line(char *s)
{
    if (s) {
        explicit_bzero(s, strlen(s));
        free(s);
    }
}

void
uplink_free(struct uplink *u)
{
    if (!u)
        return;
    assert(u->magic == UPLINK_MAGIC);
    assert(TAILQ_EMPTY(&u->waiters));
    struct shared *sh = u->sh;
    pthread_mutex_lock(&sh->mu);
    LIST_REMOVE(u, link);
    bool last = LIST_EMPTY(&sh->all);
    pthread_mutex_unlock(&sh->mu);
    assert(!u->owner || last); /* the owner goes after its siblings */
    mailbox_free(u->mb);       /* off the list: no post follows */
    if (u->dns)
        evdns_base_free(u->dns, 0);
    if (u->owner) {
        excred_free(sh->exec);
        SSL_CTX_free(sh->tls);
        free_line(sh->bearer);
        free_line(sh->basic);
        pthread_mutex_destroy(&sh->mu);
        free(sh);
    }
    u->magic = 0;
    free(u);
}

const struct kcfg *
uplink_kcfg(const struct uplink *u)
{
    assert(u->magic == UPLINK_MAGIC);
    return u->sh->k;
}

/* ---- kwc's own connections ---- */

struct ssl_st *
uplink_ssl_new(struct uplink *u)
{
    assert(u->magic == UPLINK_MAGIC);
    struct shared *sh = u->sh;
    if (!sh->tls)
        return NULL;
    SSL *ssl = SSL_new(sh->tls);
    /* a reference: a rotation on the owner's loop frees no certificate in use
     * (SSL_use_* take references of their own) */
    struct excred_cred *ec = sh->exec ? excred_acquire(sh->exec) : NULL;
    if (ec && ec->cert &&
        (SSL_use_certificate(ssl, ec->cert) != 1 || SSL_use_PrivateKey(ssl, ec->key) != 1)) {
        log_warnx("tunnel: the exec plugin's client certificate could not be used");
        ERR_clear_error();
    }
    excred_cred_free(ec);
    SSL_set_tlsext_host_name(ssl, sh->sni);
    if (!sh->k->insecure_skip_tls_verify)
        SSL_set1_host(ssl, sh->sni);
    return ssl;
}

struct evdns_base *
uplink_dns(struct uplink *u)
{
    assert(u->magic == UPLINK_MAGIC);
    if (!u->dns)
        u->dns = evdns_base_new(u->base, EVDNS_BASE_INITIALIZE_NAMESERVERS);
    return u->dns;
}

struct bufferevent *
uplink_connect(struct uplink *u, struct event_base *base, const char **err)
{
    assert(u->magic == UPLINK_MAGIC);
    bool tls;
    char host[256], port[16];
    kcfg_server_hostport(u->sh->k->server, &tls, host, sizeof(host), port, sizeof(port));
    struct bufferevent *bev;
    if (tls) {
        SSL *ssl = uplink_ssl_new(u);
        bev = bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                                             BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
    } else {
        bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
    }
    int rc = -1;
    if (bev) {
        struct sockaddr_storage ss;
        memset(&ss, 0, sizeof(ss));
        struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
        int portn = atoi(port);
        if (inet_pton(AF_INET, host, &s4->sin_addr) == 1) {
            s4->sin_family = AF_INET;
            s4->sin_port = htons((uint16_t)portn);
            rc = bufferevent_socket_connect(bev, (struct sockaddr *)s4, sizeof(*s4));
        } else if (inet_pton(AF_INET6, host, &s6->sin6_addr) == 1) {
            s6->sin6_family = AF_INET6;
            s6->sin6_port = htons((uint16_t)portn);
            rc = bufferevent_socket_connect(bev, (struct sockaddr *)s6, sizeof(*s6));
        } else {
            assert(base == u->base); /* its DNS base is bound to u's loop */
            rc = bufferevent_socket_connect_hostname(bev, uplink_dns(u), AF_UNSPEC, host, portn);
        }
    }
    if (rc != 0) {
        if (bev)
            bufferevent_free(bev);
        *err = "the connection could not be started";
        return NULL;
    }
    return bev;
}

bool
uplink_conn_error(struct bufferevent *bev, bool connected, char *buf, size_t len)
{
    int err = EVUTIL_SOCKET_ERROR();
    if (connected) {
        snprintf(buf, len, "%s", evutil_socket_error_to_string(err));
        return false;
    }
    unsigned long ssl_err = bufferevent_get_openssl_error(bev);
    if (ssl_err) {
        char reason[256];
        ERR_error_string_n(ssl_err, reason, sizeof(reason));
        snprintf(buf, len, "TLS handshake failed: %s", reason);
        return true;
    }
    snprintf(buf, len, "%s", err ? evutil_socket_error_to_string(err) : "connection closed");
    return false;
}

/* ---- curl ---- */

static struct curl_blob
blob(const unsigned char *p, size_t n)
{
    struct curl_blob b = {.data = (void *)(uintptr_t)p, .len = n, .flags = CURL_BLOB_NOCOPY};
    return b;
}

void
uplink_curl_setup(const struct uplink *u, void *easy, bool caller_auth)
{
    assert(u->magic == UPLINK_MAGIC);
    const struct kcfg *k = u->sh->k;
    CURL *h = easy;
    if (u->sh->tls) {
        if (k->insecure_skip_tls_verify) {
            curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
            curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
        }
        if (k->ca_pem) {
            struct curl_blob b = blob(k->ca_pem, k->ca_pem_len);
            curl_easy_setopt(h, CURLOPT_CAINFO_BLOB, &b);
        }
        if (k->cert_pem) {
            struct curl_blob b = blob(k->cert_pem, k->cert_pem_len);
            curl_easy_setopt(h, CURLOPT_SSLCERT_BLOB, &b);
            curl_easy_setopt(h, CURLOPT_SSLCERTTYPE, "PEM");
        }
        if (k->key_pem) {
            struct curl_blob b = blob(k->key_pem, k->key_pem_len);
            curl_easy_setopt(h, CURLOPT_SSLKEY_BLOB, &b);
            curl_easy_setopt(h, CURLOPT_SSLKEYTYPE, "PEM");
        }
    }
    if (k->username && !caller_auth) {
        curl_easy_setopt(h, CURLOPT_HTTPAUTH, (long)CURLAUTH_BASIC);
        curl_easy_setopt(h, CURLOPT_USERNAME, k->username);
        curl_easy_setopt(h, CURLOPT_PASSWORD, k->password ? k->password : "");
    }
}

/* ---- credentials ---- */

struct excred *
uplink_exec(const struct uplink *u)
{
    assert(u->magic == UPLINK_MAGIC);
    return u->sh->exec;
}

/* A token file read again when due, by one thread at a time and outside mu
 * (file I/O); the others meanwhile send the token read last. */
static void
bearer_refresh(struct shared *sh)
{
    time_t now = time(NULL);
    pthread_mutex_lock(&sh->mu);
    bool due = !sh->bearer_reading && (!sh->bearer || now - sh->bearer_read_at >= sh->reread_s);
    sh->bearer_reading |= due;
    pthread_mutex_unlock(&sh->mu);
    if (!due)
        return;
    int ferr;
    char *tok = kcfg_bearer_token(sh->k, &ferr);
    char *line = tok ? xasprintf("Authorization: Bearer %s", tok) : NULL;
    free_line(tok);
    pthread_mutex_lock(&sh->mu);
    char *old = line ? sh->bearer : NULL;
    if (line)
        sh->bearer = line;
    sh->bearer_read_at = now;
    sh->bearer_reading = false;
    pthread_mutex_unlock(&sh->mu);
    free_line(old);
    if (!line)
        log_warnx("upstream: cannot read token file %s: %s (keeping the previous token)",
                  sh->k->token_file, ferr ? strerror(ferr) : "empty");
}

bool
uplink_cred_get(struct uplink *u, void *easy, struct uplink_cred *cr)
{
    assert(u->magic == UPLINK_MAGIC);
    struct shared *sh = u->sh;
    *cr = (struct uplink_cred){0};
    if (sh->exec) {
        struct excred_cred *c = excred_acquire(sh->exec);
        if (!c)
            return false;
        cr->bearer_line = c->bearer_line ? xstrdup(c->bearer_line) : NULL;
        cr->gen = c->gen;
        if (c->cert && easy && sh->tls) {
            /* copied: a rotation frees these while a watch may hold its handle */
            struct curl_blob cb = {
                .data = c->cert_pem, .len = c->cert_pem_len, .flags = CURL_BLOB_COPY};
            struct curl_blob kb = {
                .data = c->key_pem, .len = c->key_pem_len, .flags = CURL_BLOB_COPY};
            curl_easy_setopt(easy, CURLOPT_SSLCERT_BLOB, &cb);
            curl_easy_setopt(easy, CURLOPT_SSLCERTTYPE, "PEM");
            curl_easy_setopt(easy, CURLOPT_SSLKEY_BLOB, &kb);
            curl_easy_setopt(easy, CURLOPT_SSLKEYTYPE, "PEM");
        }
        excred_cred_free(c);
        return true;
    }
    if (sh->k->token_file)
        bearer_refresh(sh);
    pthread_mutex_lock(&sh->mu);
    cr->bearer_line = sh->bearer ? xstrdup(sh->bearer) : NULL;
    pthread_mutex_unlock(&sh->mu);
    return true;
}

void
uplink_cred_clear(struct uplink_cred *c)
{
    free_line(c->bearer_line);
    *c = (struct uplink_cred){0};
}

void
uplink_set_token_reread(struct uplink *u, unsigned s)
{
    pthread_mutex_lock(&u->sh->mu);
    u->sh->reread_s = s;
    pthread_mutex_unlock(&u->sh->mu);
}

void
uplink_unauthorized(struct uplink *u, uint64_t gen)
{
    assert(u->magic == UPLINK_MAGIC);
    if (u->sh->exec && gen)
        excred_unauthorized(u->sh->exec, gen);
}

void
uplink_cred_wait(struct uplink *u, struct uplink_waiter *w)
{
    assert(u->magic == UPLINK_MAGIC && u->sh->exec && !w->queued);
    TAILQ_INSERT_TAIL(&u->waiters, w, link);
    w->queued = true;
}

void
uplink_cred_unwait(struct uplink *u, struct uplink_waiter *w)
{
    if (!w->queued)
        return;
    TAILQ_REMOVE(&u->waiters, w, link);
    w->queued = false;
}

void
uplink_cred_why(struct uplink *u, char *buf, size_t len)
{
    if (u->sh->exec)
        excred_why(u->sh->exec, buf, len);
    else
        snprintf(buf, len, "no credential");
}

const char *
uplink_basic_line(const struct uplink *u)
{
    assert(u->magic == UPLINK_MAGIC);
    return u->sh->basic;
}

/* ---- the header policy ---- */

/* Where a rule applies. */
#define REQ_FWD 0x01u  /* a forwarded request (passthrough) */
#define REQ_TUN 0x02u  /* a tunnelled request's replayed head */
#define RESP_FWD 0x04u /* a forwarded answer */
#define RESP_TUN 0x08u /* a tunnel's relayed refusal */
#define CRED 0x10u     /* requests, when kwc's credentials replace the caller's */
#define HOP (REQ_FWD | RESP_FWD | RESP_TUN)

/*
 * The one list. Hop-by-hop headers (RFC 9112 and Go's httputil list) never
 * cross kwc on a forwarded request or answer; a tunnel replays the client's
 * head as is apart from what kwc writes itself (Host, Upgrade) or answered
 * itself (Expect), so the handshake (Connection: Upgrade) and the body's
 * framing travel with it. Content-Length: curl and kwc's response writer frame
 * bodies themselves (the passthrough hands the answer's value to the
 * writer); a tunnel forwards the request body exactly, so its length stays.
 */
static const struct hdr_rule {
    const char *name;
    bool prefix;
    unsigned where;
} rules[] = {
    {"Connection", false, HOP},
    {"Keep-Alive", false, HOP},
    {"Proxy-Connection", false, HOP},
    {"Proxy-Authenticate", false, HOP},
    {"Proxy-Authorization", false, HOP},
    {"Te", false, HOP},
    {"Trailer", false, HOP},
    {"Transfer-Encoding", false, HOP},
    {"Upgrade", false, HOP | REQ_TUN},
    {"Content-Length", false, REQ_FWD | RESP_FWD | RESP_TUN},
    {"Host", false, REQ_FWD | REQ_TUN},
    {"Expect", false, REQ_FWD | REQ_TUN},
    /* the tunnel's head: nothing meant for a proxy, nor HTTP/2's upgrade */
    {"Proxy-", true, REQ_TUN},
    {"HTTP2-Settings", false, REQ_TUN},
    /* the caller's credentials and identity claims */
    {"Authorization", false, CRED},
    {"Impersonate-", true, CRED},
    {"X-Remote-", true, CRED},
};

/*
 * name is one of the tokens of a Connection header. Two readings, kept as
 * they were: a request's tokens end at a comma, space or tab (any word
 * names a header); an answer's at a comma, trimmed (Go's
 * httputil.removeHopByHopHeaders). They differ only for a value that is not a
 * token list ("a b").
 */
static bool
named_in_connection(const char *conn, const char *name, bool words)
{
    if (!conn)
        return false;
    size_t nl = strlen(name);
    for (const char *s = conn; *s;) {
        while (*s == ' ' || *s == '\t' || *s == ',')
            s++;
        size_t l = strcspn(s, words ? " ,\t" : ","), e = l;
        while (e && (s[e - 1] == ' ' || s[e - 1] == '\t'))
            e--;
        if (e == nl && strncasecmp(s, name, nl) == 0)
            return true;
        s += l;
    }
    return false;
}

static bool
ruled(unsigned where, const char *name)
{
    for (size_t i = 0; i < KWC_ARRAY_LEN(rules); i++) {
        const struct hdr_rule *r = &rules[i];
        if (!(r->where & where))
            continue;
        if (r->prefix ? strncasecmp(name, r->name, strlen(r->name)) == 0
                      : strcasecmp(name, r->name) == 0)
            return true;
    }
    return false;
}

bool
uplink_request_header_dropped(enum uplink_way way, const char *name, const char *connection,
                              bool strip_credentials)
{
    unsigned where = (way == UPLINK_TUNNEL ? REQ_TUN : REQ_FWD) | (strip_credentials ? CRED : 0);
    if (ruled(where, name))
        return true;
    return way == UPLINK_FORWARD && named_in_connection(connection, name, true);
}

bool
uplink_response_header_dropped(enum uplink_way way, const char *name, const char *connection)
{
    if (ruled(way == UPLINK_TUNNEL ? RESP_TUN : RESP_FWD, name))
        return true;
    return way == UPLINK_TUNNEL && named_in_connection(connection, name, false);
}
