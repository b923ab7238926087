/*
 * tunnel.c — HTTP Upgrade passthrough (see tunnel.h).
 *
 * kwc takes the client's connection from the HTTP server (hreq_take_bev:
 * the bufferevent, plain or TLS, with any bytes past the head in its input),
 * opens its own connection to the upstream, writes the request head (with
 * kwc's credentials), and from then on only copies bytes. Each direction stops
 * reading when the other side's output holds TUN_HIGH bytes and resumes when it
 * drains below TUN_LOW (bufferevent write watermark), so memory stays bounded
 * whatever the peers do.
 */
#include "kwc/tunnel.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/http.h"
#include "kwc/kubeconfig.h"
#include "kwc/log.h"
#include "kwc/status.h"

#define TUN_MAGIC 0x74756e31u /* "tun1" */
#define TUN_HIGH (1024 * 1024)
#define TUN_LOW (256 * 1024)

struct tunnel {
    uint32_t magic;
    struct bufferevent *client, *up;
    struct event *connect_timer;
    bool connected;
    bool client_eof, up_eof;
    char desc[160]; /* "GET /api/v1/.../exec" for logs */
};

/* One TLS context for all tunnels of the process (settings are immutable). */
static SSL_CTX *tls_ctx;
static struct evdns_base *dns;

static void tunnel_free(struct tunnel *t);

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

static SSL_CTX *
get_tls_ctx(const struct kcfg *k)
{
    if (tls_ctx)
        return tls_ctx;
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    static const unsigned char alpn[] = "\x08http/1.1"; /* upgrades need HTTP/1.1 */
    SSL_CTX_set_alpn_protos(ctx, alpn, sizeof(alpn) - 1);
    if (k->insecure_skip_tls_verify) {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    } else {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        if (!k->ca_pem || load_pem_certs(SSL_CTX_get_cert_store(ctx), k->ca_pem, k->ca_pem_len) == 0)
            SSL_CTX_set_default_verify_paths(ctx);
    }
    if (k->cert_pem && k->key_pem) {
        BIO *b = BIO_new_mem_buf(k->cert_pem, (int)k->cert_pem_len);
        X509 *x = PEM_read_bio_X509(b, NULL, NULL, NULL);
        BIO_free(b);
        b = BIO_new_mem_buf(k->key_pem, (int)k->key_pem_len);
        EVP_PKEY *pk = PEM_read_bio_PrivateKey(b, NULL, NULL, NULL);
        BIO_free(b);
        if (!x || !pk || SSL_CTX_use_certificate(ctx, x) != 1 || SSL_CTX_use_PrivateKey(ctx, pk) != 1)
            log_warnx("tunnel: the kubeconfig's client certificate or key could not be loaded");
        X509_free(x);
        EVP_PKEY_free(pk);
    }
    ERR_clear_error();
    tls_ctx = ctx;
    return ctx;
}

/* ---- relay ---- */

static struct bufferevent *
peer_of(struct tunnel *t, struct bufferevent *bev)
{
    return bev == t->client ? t->up : t->client;
}

static void
maybe_finish(struct tunnel *t)
{
    /* Done when both sides ended, or one ended and the other has nothing left to send to it. */
    bool client_drained = evbuffer_get_length(bufferevent_get_output(t->client)) == 0;
    bool up_drained = !t->up || evbuffer_get_length(bufferevent_get_output(t->up)) == 0;
    if ((t->up_eof && client_drained) || (t->client_eof && up_drained && t->up_eof) ||
        (t->client_eof && !t->connected))
        tunnel_free(t);
    else if (t->client_eof && up_drained && t->up) {
        /* Half-close towards the upstream is not portable through TLS: end both. */
        tunnel_free(t);
    }
}

static void
on_relay_read(struct bufferevent *bev, void *arg)
{
    struct tunnel *t = arg;
    struct bufferevent *peer = peer_of(t, bev);
    struct evbuffer *out = bufferevent_get_output(peer);
    evbuffer_add_buffer(out, bufferevent_get_input(bev));
    if (evbuffer_get_length(out) >= TUN_HIGH) {
        bufferevent_disable(bev, EV_READ);
        bufferevent_setwatermark(peer, EV_WRITE, TUN_LOW, 0);
    }
}

static void
on_relay_write(struct bufferevent *bev, void *arg)
{
    struct tunnel *t = arg;
    struct bufferevent *peer = peer_of(t, bev);
    /* bev drained below its low watermark: its producer may read again */
    if (peer && !(bev == t->up ? t->client_eof : t->up_eof))
        bufferevent_enable(peer, EV_READ);
    if (t->client_eof || t->up_eof)
        maybe_finish(t);
}

static void
on_relay_event(struct bufferevent *bev, short what, void *arg)
{
    struct tunnel *t = arg;
    if (what & BEV_EVENT_CONNECTED) {
        t->connected = true;
        if (t->connect_timer)
            evtimer_del(t->connect_timer);
        bufferevent_enable(t->up, EV_READ);
        bufferevent_enable(t->client, EV_READ);
        /* Bytes the client sent behind the request head are already in its
         * input buffer: no read event will announce them. */
        if (evbuffer_get_length(bufferevent_get_input(t->client)))
            on_relay_read(t->client, t);
        return;
    }
    if (bev == t->up && !t->connected) {
        char body[512];
        snprintf(body, sizeof(body), "the upstream API server is unavailable: %s",
                 evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
        log_warnx("tunnel: %s: %s", t->desc, body);
        char *st = status_failure_json(503, "ServiceUnavailable", body, NULL);
        evbuffer_add_printf(bufferevent_get_output(t->client),
                            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                            "Content-Length: %zu\r\nConnection: close\r\n\r\n%s\n",
                            strlen(st) + 1, st);
        free(st);
        bufferevent_free(t->up);
        http_taken_release(); /* its hold (tunnel_start) */
        t->up = NULL;
        t->up_eof = true;
        bufferevent_disable(t->client, EV_READ);
        bufferevent_setwatermark(t->client, EV_WRITE, 0, 0);
        return; /* freed when the answer is written (on_relay_write) */
    }
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        if (bev == t->client) {
            t->client_eof = true;
        } else {
            t->up_eof = true;
            /* Whatever the upstream sent before closing still goes to the client. */
            struct evbuffer *in = bufferevent_get_input(t->up);
            if (evbuffer_get_length(in))
                evbuffer_add_buffer(bufferevent_get_output(t->client), in);
            bufferevent_setwatermark(t->client, EV_WRITE, 0, 0);
        }
        bufferevent_disable(bev, EV_READ);
        if (what & BEV_EVENT_ERROR)
            tunnel_free(t);
        else
            maybe_finish(t);
    }
}

static void
on_connect_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct tunnel *t = arg;
    log_warnx("tunnel: %s: connecting to the upstream timed out", t->desc);
    on_relay_event(t->up, BEV_EVENT_ERROR, t);
}

static void
tunnel_free(struct tunnel *t)
{
    assert(t->magic == TUN_MAGIC);
    log_debug("tunnel: %s closed", t->desc);
    if (t->connect_timer)
        event_free(t->connect_timer);
    if (t->up) {
        bufferevent_free(t->up);
        http_taken_release(); /* its hold (tunnel_start) */
    }
    http_bev_free(t->client);
    t->magic = 0;
    free(t);
}

/* ---- start ---- */

static bool
skip_header(const char *k, bool strip)
{
    if (strcasecmp(k, "Host") == 0 || strncasecmp(k, "Proxy-", 6) == 0)
        return true;
    return strip && (strcasecmp(k, "Authorization") == 0 || strncasecmp(k, "Impersonate-", 12) == 0 ||
                     strncasecmp(k, "X-Remote-", 9) == 0);
}

void
tunnel_start(struct hreq *req, const struct tunnel_options *o)
{
    const struct kcfg *k = o->k;
    bool tls;
    char host[256], port[16];
    kcfg_server_hostport(k->server, &tls, host, sizeof(host), port, sizeof(port));
    const char *sni = k->tls_server_name ? k->tls_server_name : host;

    struct tunnel *t = xcalloc(1, sizeof(*t));
    t->magic = TUN_MAGIC;
    const char *method = hreq_method(req);
    size_t tl;
    const char *target = hreq_target(req, &tl);
    snprintf(t->desc, sizeof(t->desc), "%s %.*s", method, (int)strcspn(target, "?") > 140 ? 140 : (int)strcspn(target, "?"), target);

    /* The request head, replayed to the upstream. */
    struct evbuffer *head = evbuffer_new();
    evbuffer_add_printf(head, "%s %s HTTP/1.1\r\nHost: %s%s%s%s%s\r\n", method, target,
                        strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "", ":", port);
    const struct http_header *hs;
    size_t nh = hreq_headers(req, &hs);
    for (size_t i = 0; i < nh; i++)
        if (!skip_header(hs[i].name, o->strip_credentials))
            evbuffer_add_printf(head, "%s: %s\r\n", hs[i].name, hs[i].value);
    /* the caller's identity, as the front's stages decided it */
    bool caller_auth = false;
    nh = hreq_upstream_headers(req, &hs);
    for (size_t i = 0; i < nh; i++) {
        evbuffer_add_printf(head, "%s: %s\r\n", hs[i].name, hs[i].value);
        caller_auth |= strcasecmp(hs[i].name, "Authorization") == 0;
    }
    if (o->strip_credentials && !caller_auth) {
        int ferr;
        char *tok = kcfg_bearer_token(k, &ferr);
        if (tok)
            evbuffer_add_printf(head, "Authorization: Bearer %s\r\n", tok);
        free(tok);
        if (k->username) {
            /* basic auth for the upgrade request */
            char *up = xasprintf("%s:%s", k->username, k->password ? k->password : "");
            size_t ul = strlen(up);
            char *b64 = xmalloc(4 * ((ul + 2) / 3) + 1);
            EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)up, (int)ul);
            evbuffer_add_printf(head, "Authorization: Basic %s\r\n", b64);
            free(b64);
            free(up);
        }
    }
    evbuffer_add(head, "\r\n", 2);

    /* Take the client connection from the server: it parses no more of it. */
    t->client = hreq_take_bev(req);
    if (!t->client) {
        evbuffer_free(head);
        free(t);
        return;
    }

    if (tls) {
        SSL *ssl = SSL_new(get_tls_ctx(k));
        SSL_set_tlsext_host_name(ssl, sni);
        if (!k->insecure_skip_tls_verify)
            SSL_set1_host(ssl, sni);
        t->up = bufferevent_openssl_socket_new(o->base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                                               BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
    } else {
        t->up = bufferevent_socket_new(o->base, -1, BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
    }
    /* the upstream socket is a descriptor too: --max-connections counts a
     * tunnel twice (config.h's budget) */
    http_taken_hold();
    bufferevent_setcb(t->client, on_relay_read, on_relay_write, on_relay_event, t);
    bufferevent_setcb(t->up, on_relay_read, on_relay_write, on_relay_event, t);
    bufferevent_write_buffer(t->up, head);
    evbuffer_free(head);

    int rc;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    int portn = atoi(port);
    if (inet_pton(AF_INET, host, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)portn);
        rc = bufferevent_socket_connect(t->up, (struct sockaddr *)s4, sizeof(*s4));
    } else if (inet_pton(AF_INET6, host, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)portn);
        rc = bufferevent_socket_connect(t->up, (struct sockaddr *)s6, sizeof(*s6));
    } else {
        if (!dns)
            dns = evdns_base_new(o->base, EVDNS_BASE_INITIALIZE_NAMESERVERS);
        rc = bufferevent_socket_connect_hostname(t->up, dns, AF_UNSPEC, host, portn);
    }
    t->connect_timer = evtimer_new(o->base, on_connect_timeout, t);
    struct timeval tv = {o->connect_timeout_ms / 1000, (o->connect_timeout_ms % 1000) * 1000};
    evtimer_add(t->connect_timer, &tv);
    /* Nothing is read from the client until the upstream is connected. */
    bufferevent_disable(t->client, EV_READ);
    if (rc != 0) {
        /* Report from the loop, not from inside the server's parser. */
        event_active(t->connect_timer, EV_TIMEOUT, 1);
    }
    log_debug("tunnel: %s -> %s:%s", t->desc, host, port);
}
