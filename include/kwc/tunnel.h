/*
 * tunnel.h — HTTP Upgrade passthrough (exec, attach, port-forward over
 * SPDY or WebSocket): kwc replays the request head to the upstream on a fresh
 * connection (TLS with the kubeconfig's CA and client certificate, SNI and
 * hostname checks), then copies bytes both ways until either side closes.
 * Both directions are flow-controlled by bufferevent watermarks.
 */
#ifndef KWC_TUNNEL_H
#define KWC_TUNNEL_H

#include <stdbool.h>

struct kcfg;
struct hreq;
struct event_base;

struct tunnel_options {
    const struct kcfg *k;     /* upstream server and credentials (borrowed) */
    struct event_base *base;
    bool strip_credentials;   /* drop the client's Authorization / Impersonate-* / X-Remote-* */
    int connect_timeout_ms;
};

/* Take over req and its connection (once its head is read). Answers a Status
 * 503 if the upstream cannot be reached; otherwise the upstream's own answer
 * (101 or an error) is relayed byte for byte. */
void tunnel_start(struct hreq *req, const struct tunnel_options *o);

#endif
