/*
 * tunnel.h — HTTP Upgrade passthrough (exec, attach, port-forward over
 * SPDY or WebSocket): kwc replays the request to the upstream on a fresh
 * connection (the uplink's TLS, credentials and header policy: the
 * kubeconfig's CA and client certificate, SNI and hostname checks; uplink.h)
 * and, once the upstream switched protocols (101), copies bytes both ways
 * until either side closes. Both directions are flow-controlled by
 * bufferevent watermarks.
 */
#ifndef KWC_TUNNEL_H
#define KWC_TUNNEL_H

#include <stdbool.h>

struct hreq;
struct uplink;
struct event_base;

struct tunnel_options {
    struct uplink *link; /* upstream server, TLS, credentials, header policy (borrowed) */
    struct event_base *base;
    bool strip_credentials; /* drop the client's Authorization / Impersonate-* / X-Remote-* */
    int connect_timeout_ms;
};

/* Answer req (an Upgrade request, hreq_upgrade; once its head is read):
 * replay it to the upstream, and only if the upstream answers 101 take the
 * connection as a byte pipe (hreq_take_pipe) and copy bytes both ways; any
 * other answer is relayed as an ordinary response and the connection closes,
 * so nothing the client sent behind the request is forwarded before a 101.
 * A target not in origin form: 400; upstream unreachable: a 503 Status; a
 * TLS failure or a broken answer: 502; the tunnel ending before any answer:
 * 500. The caller never touches req again. */
void tunnel_start(struct hreq *req, const struct tunnel_options *o);

#endif
