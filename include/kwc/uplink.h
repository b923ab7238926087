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
 * One uplink per event loop, made with the up_client (up_client_uplink) and
 * freed with it: no process-wide state. The first (uplink_new, the owner, on
 * the main loop) holds what all share: the TLS material and SSL_CTX, the
 * credentials (token file, exec plugin: excred runs on the owner's loop
 * only). Every serving loop's client has an uplink of its own made from the
 * owner's (uplink_new_sibling) on its own thread: its DNS base and its own
 * list of requests waiting for a credential; credentials come from the owner.
 *
 * Threading contract: each uplink is used on its own loop's thread. The
 * calls a sibling makes that reach the shared state are safe against the
 * owner's loop rotating credentials: uplink_curl_setup and uplink_basic_line
 * read what never changes; uplink_cred_get copies the credential (bearer
 * line, exec client certificate) out under a mutex held only for the copy
 * (a token file is read outside it by one thread at a time); an exec
 * credential is reference-counted (excred_acquire), so uplink_ssl_new and
 * uplink_cred_get never see one freed; uplink_unauthorized marks the
 * credential suspect at once and asks the owner's loop to run the plugin
 * (mailbox.h); a new credential wakes every uplink's waiters on its own loop
 * (mailbox.h again). The owner is freed last, after every sibling.
 */
#ifndef KWC_UPLINK_H
#define KWC_UPLINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

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
/* An uplink for another loop (base, on base's thread) sharing owner's
 * identity and credentials (owner: an uplink_new's, alive until this one is
 * freed). Never fails. */
struct uplink *uplink_new_sibling(struct uplink *owner, struct event_base *base);
/* On the uplink's own thread; the owner after all its siblings. */
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
 * the uplink's loop, freed with the uplink): each loop its own, as an
 * evdns_base is bound to one loop. */
struct evdns_base *uplink_dns(struct uplink *u);

/*
 * Start a connection of kwc's own to the kubeconfig's server on base (the
 * uplink's loop; an
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
 * kwc's credentials for one request, taken at once (the bearer line and the
 * exec credential's number belong to the same credential):
 *   bearer_line: "Authorization: Bearer ..." without CRLF, or NULL (a token
 *     file is re-read at most once a minute, as client-go does; an
 *     unreadable one keeps the previous token, logged); the caller's copy.
 *   gen: the exec credential's number, to hand back to uplink_unauthorized
 *     on a 401 (0: none, or static credentials).
 * With easy (a CURL *) it also sets that handle's client certificate and
 * key (copied) when an exec plugin gave one. Returns false (c empty) when an
 * exec plugin has no credential now: wait (uplink_cred_wait) or refuse.
 * uplink_cred_clear wipes and frees the copy.
 */
struct uplink_cred {
    char *bearer_line;
    uint64_t gen;
};
bool uplink_cred_get(struct uplink *u, void *easy, struct uplink_cred *c);
void uplink_cred_clear(struct uplink_cred *c);

/* "Authorization: Basic ..." or NULL; fixed at start (any thread). A
 * kubeconfig never sets both a token and basic auth. */
const char *uplink_basic_line(const struct uplink *u);

/* Tests: re-read the token file when older than s seconds (default 60). */
void uplink_set_token_reread(struct uplink *u, unsigned s);

/*
 * The kubeconfig's exec credential plugin (execcred.h), NULL without one
 * (the same for every uplink of an owner; off the owner's loop only
 * execcred.h's any-thread calls may be made on it). With one, uplink_cred_get
 * gives its current token, uplink_ssl_new presents its current client
 * certificate, and:
 *   uplink_unauthorized: the upstream answered 401 to a request made with
 *     credential gen (client-go runs the plugin again; see execcred.h).
 *   uplink_cred_wait: w->on_ready(w->arg) runs on u's loop once a
 *     credential may be there (check again with uplink_cred_get: another
 *     401 may have come first); w is then off the list. Embed w in the
 *     waiting object and uplink_cred_unwait before freeing it.
 *   uplink_cred_why: why there is none, for messages, into buf.
 */
struct uplink_waiter {
    void (*on_ready)(void *arg);
    void *arg;
    TAILQ_ENTRY(uplink_waiter) link;
    bool queued;
};
struct excred *uplink_exec(const struct uplink *u);
void uplink_unauthorized(struct uplink *u, uint64_t gen);
void uplink_cred_wait(struct uplink *u, struct uplink_waiter *w);
void uplink_cred_unwait(struct uplink *u, struct uplink_waiter *w);
void uplink_cred_why(struct uplink *u, char *buf, size_t len);

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
