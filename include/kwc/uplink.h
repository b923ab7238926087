/*
 * uplink.h — kwc's identity towards the upstream API server, in one place:
 * the TLS settings (the kubeconfig's CA, client certificate and key, SNI and
 * hostname checks), kwc's own credentials (bearer token, re-read from its
 * file, an exec plugin's token or certificate, or basic auth), and the header policy: which headers
 * of a client's request are never forwarded, and which of the upstream's answer are never relayed.
 * Three ways to the upstream use it: libcurl transfers (upstream.h: passthrough, reviews,
 * reflectors), the passthrough's header filter (passthrough.h) and upgrade tunnels (tunnel.h),
 * which open their own connections through the uplink (uplink_connect: its SSL_CTX and DNS base).
 *
 * One uplink per event loop, made with the up_client (up_client_uplink) at
 * start and freed with it: no process-wide state. Loop thread only.
 */
#ifndef KWC_UPLINK_H
#define KWC_UPLINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct bufferevent;
struct event_base;
struct evdns_base;
struct kcfg;
struct ssl_st;
struct uplink;

/*
 * Check the kubeconfig's TLS material (the CA, the client certificate and
 * key parse and belong together: one clear error at start rather than one per
 * request) and build the uplink: for an https server, the SSL_CTX the
 * tunnels use. k is borrowed and must outlive the uplink. Returns 0 or
 * KWC_ECONFIG with a message for a person in err.
 */
int uplink_new(struct event_base *base, const struct kcfg *k, struct uplink **out, char *err,
               size_t errlen);
void uplink_free(struct uplink *u);

/* The upstream settings the uplink was made from (borrowed). */
const struct kcfg *uplink_kcfg(const struct uplink *u);

/*
 * A new TLS session for a connection of kwc's own to the upstream (the
 * caller owns it; bufferevent_openssl takes it): the uplink's SSL_CTX
 * (ALPN http/1.1), SNI and, unless insecure-skip-tls-verify, the hostname
 * check against tls-server-name or the server's host. NULL for a plain
 * http:// server.
 */
struct ssl_st *uplink_ssl_new(struct uplink *u);

/* The DNS base for connecting to the upstream by name (made on first use on
 * the uplink's loop, freed with the uplink). */
struct evdns_base *uplink_dns(struct uplink *u);

/*
 * Start a connection of kwc's own to the kubeconfig's server on base (an
 * Upgrade tunnel's): for https, TLS with a session of uplink_ssl_new's; to
 * an address, or to a name through uplink_dns. Returns a new bufferevent
 * (callbacks deferred: none runs before the loop; bufferevent_free closes
 * the socket and frees the TLS state). The caller sets its callbacks and
 * may write at once (the bytes wait for the connection); its event callback
 * gets BEV_EVENT_CONNECTED once connected (TLS: the handshake done), or
 * BEV_EVENT_ERROR / BEV_EVENT_EOF (uplink_conn_error says why). NULL, with
 * the reason in *err (static), when connecting could not even start.
 */
struct bufferevent *uplink_connect(struct uplink *u, struct event_base *base, const char **err);

/*
 * Why a connection of uplink_connect's failed, for a person, into buf
 * (called from its event callback, with errno and OpenSSL's error queue as
 * they are then). Not yet connected: a failed TLS handshake gives
 * "TLS handshake failed: <OpenSSL's reason>" and true; anything else the
 * socket's error ("Connection refused"; "connection closed" when there is
 * none) and false. Connected: the socket's error, false.
 */
bool uplink_conn_error(struct bufferevent *bev, bool connected, char *buf, size_t len);

/*
 * Set a curl easy handle (a CURL *) up with the same identity: for an
 * https server the CA, client certificate and key as blobs (borrowed from
 * the kubeconfig) and insecure-skip-tls-verify; basic auth unless the
 * caller's own Authorization is forwarded (caller_auth).
 */
void uplink_curl_setup(const struct uplink *u, void *easy, bool caller_auth);

/*
 * kwc's credentials as request header lines without CRLF, or NULL:
 * "Authorization: Bearer ..." (a token file is re-read at most once a minute,
 * as client-go does; an unreadable one keeps the previous token, logged), and
 * "Authorization: Basic ...". A kubeconfig never sets both. Valid until the
 * next call or the uplink's end.
 */
const char *uplink_bearer_line(struct uplink *u);
const char *uplink_basic_line(const struct uplink *u);

/*
 * The kubeconfig's exec credential plugin (execcred.h), NULL without one.
 * With one, uplink_bearer_line gives its current token (NULL while there is
 * none: wait on excred_wait), uplink_ssl_new presents its current client
 * certificate, and:
 *   uplink_cred_gen: the current exec credential's number, to hand back to
 *     uplink_unauthorized on a 401 (0: none, or static credentials); with
 *     easy (a CURL *) it also sets that handle's client certificate and key
 *     (copied) when the plugin gave one.
 *   uplink_unauthorized: the upstream answered 401 to a request made with
 *     credential gen (client-go runs the plugin again; see execcred.h).
 */
struct excred *uplink_exec(const struct uplink *u);
uint64_t uplink_cred_gen(struct uplink *u, void *easy);
void uplink_unauthorized(struct uplink *u, uint64_t gen);

/*
 * The header policy, one table (uplink.c) for every way a request reaches
 * the upstream:
 *   UPLINK_FORWARD: the passthrough (curl writes the framing, Host and
 *     Expect): hop-by-hop headers, Host, Content-Length and Expect are
 *     dropped, with any header the client's Connection header names.
 *   UPLINK_TUNNEL: an upgrade request's head replayed byte for byte on a
 *     connection of its own, as kube's upgrade-aware proxy does: Connection,
 *     Transfer-Encoding, Content-Length, Keep-Alive, Te and Trailer stay (the
 *     handshake and the body's framing travel with it), Host, Expect, Upgrade
 *     (rewritten without h2c), HTTP2-Settings and every Proxy-* go.
 * With strip_credentials (kwc's own credentials replace the caller's), both
 * drop Authorization, Impersonate-* and X-Remote-*: the caller's identity
 * reaches the upstream only as the front's stages decided it
 * (hreq_upstream_headers). connection: the request's Connection header or NULL.
 */
enum uplink_way {
    UPLINK_FORWARD,
    UPLINK_TUNNEL,
};
bool uplink_request_header_dropped(enum uplink_way way, const char *name, const char *connection,
                                   bool strip_credentials);

/*
 * The same for a header of the upstream's answer relayed to the client:
 * hop-by-hop headers (and Content-Length, which kwc's response writer frames
 * itself) are never relayed; a tunnel's relayed refusal also drops the
 * headers its Connection header names. connection: the answer's Connection
 * header or NULL.
 */
bool uplink_response_header_dropped(enum uplink_way way, const char *name, const char *connection);

#endif
