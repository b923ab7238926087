/*
 * tunnel_test.c — proxy/upstream/tunnel.c: upgrade tunnels end to end on
 * loopback (upfake.h: kwc's HTTP server on a socketpair, the uplink of kwc's
 * real up_client, a fake upstream API server).
 *
 *  - a 101: the upstream gets the request head with kwc's token and the
 *    identity the stages decided (never the caller's credentials), the
 *    client gets the upstream's 101 head byte for byte, and bytes flow both
 *    ways: those the client sent behind its request only after the 101, then
 *    an echo; the client closing ends the upstream connection too.
 *  - any other answer: relayed as an ordinary response, framed by kwc (its
 *    hop-by-hop headers dropped), and the connection closed: a request
 *    pipelined behind the refused upgrade is never answered and none of its
 *    bytes reach the upstream.
 *  - nothing listening: a 503 Status, the connection closed.
 */
#include "kwc/tunnel.h"

#include <signal.h>

#include "kwc/uplink.h"
#include "upfake.h"

struct tun_case {
    struct tunnel_options o;
    struct http_header ids[1];
};

static void
tun_handler(struct uf *f, struct hreq *r)
{
    struct tun_case *c = f->harg;
    hreq_set_upstream_headers(r, c->ids, 1);
    ok(hreq_upgrade(r), "the server sees an upgrade request");
    tunnel_start(r, &c->o);
}

static void
case_init(struct tun_case *c, struct uf *f)
{
    *c = (struct tun_case){
        .o = {.link = up_client_uplink(f->uc),
              .base = f->base,
              .strip_credentials = true,
              .connect_timeout_ms = 10000},
        .ids = {{"Impersonate-User", "alice"}},
    };
}

#define EXEC_HEAD                                                                                  \
    "POST /api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true HTTP/1.1\r\n"               \
    "Host: kwc.example\r\n"                                                                        \
    "Connection: Upgrade\r\n"                                                                      \
    "Upgrade: SPDY/3.1\r\n"                                                                        \
    "X-Stream-Protocol-Version: v4.channel.k8s.io\r\n"                                             \
    "Authorization: Bearer client-token\r\n"                                                       \
    "Impersonate-User: mallory\r\n"                                                                \
    "X-Remote-User: mallory\r\n"                                                                   \
    "Proxy-Authorization: Basic eDp5\r\n"                                                          \
    "\r\n"

static const char switch_head[] = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                                  "Upgrade: SPDY/3.1\r\n"
                                  "X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n";

static bool
got_early(struct uf *f)
{
    return f->ceof || f->in.len >= strlen(switch_head) + strlen("early-bytes");
}

static bool
got_ping(struct uf *f)
{
    return f->ceof || f->in.len >= strlen(switch_head) + strlen("early-bytesping-1234");
}

static bool
upstream_closed(struct uf *f)
{
    return f->up.eof;
}

static bool
client_eof(struct uf *f)
{
    return f->ceof;
}

static void
test_switch(void)
{
    struct uf f;
    struct tun_case c;
    uf_init(&f, UF_SWITCH, tun_handler, &c);
    case_init(&c, &f);
    uf_send(&f, EXEC_HEAD "early-bytes");
    ok(uf_run_until(&f, got_early, "the 101 and the echo of the early bytes"),
       "the 101 and the echo of the bytes sent behind the request");
    ok(!f.ceof, "the tunnel is open");
    size_t hl = strlen(switch_head);
    ok(f.in.len >= hl && memcmp(f.in.p, switch_head, hl) == 0, "the upstream's 101, byte for byte");
    is_int(f.resp.status, 101, "101");
    is_int(f.done_how, HREQ_END_TAKEN, "the connection left the server");

    ok(strncmp(f.up.head.p,
               "POST /api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true HTTP/1.1\r\n",
               76) == 0,
       "the request line as sent");
    ok(uf_up_has(&f, "Authorization: Bearer " UF_TOKEN), "kwc's token");
    is_int(uf_up_count(&f, "Authorization"), 1, "no other Authorization");
    ok(uf_up_has(&f, "Impersonate-User: alice"), "the identity the stages decided");
    is_int(uf_up_count(&f, "Impersonate-User"), 1, "not the caller's Impersonate-User");
    is_int(uf_up_count(&f, "X-Remote-User"), 0, "nor X-Remote-*");
    is_int(uf_up_count(&f, "Proxy-Authorization"), 0, "nor Proxy-*");
    ok(uf_up_has(&f, "Connection: Upgrade"), "the handshake: Connection");
    ok(uf_up_has(&f, "Upgrade: SPDY/3.1"), "the handshake: Upgrade");
    ok(uf_up_has(&f, "X-Stream-Protocol-Version: v4.channel.k8s.io"), "end-to-end headers");
    char host[64];
    snprintf(host, sizeof(host), "Host: 127.0.0.1:%d", f.up.port);
    ok(uf_up_has(&f, host), "Host: the upstream's");
    is_str(f.up.after.p, "early-bytes", "the bytes behind the request, after the 101");

    uf_send(&f, "ping-1234");
    ok(uf_run_until(&f, got_ping, "the echo"), "bytes flow both ways");
    is_mem(f.in.p + hl, f.in.len - hl, "early-bytesping-1234", 20, "the client got the echo");

    shutdown(f.cfd, SHUT_WR);
    ok(uf_run_until(&f, upstream_closed, "the upstream's connection closes"),
       "the client closing ends the upstream connection");
    ok(uf_run_until(&f, client_eof, "the client's connection closes"), "and the client's");
    is_int(f.up.conns, 1, "one upstream connection");
    uf_fini(&f);
}

static void
test_refused(void)
{
    struct uf f;
    struct tun_case c;
    uf_init(&f, UF_REFUSE, tun_handler, &c);
    case_init(&c, &f);
    uf_send(&f, EXEC_HEAD "GET /api/v1/secrets HTTP/1.1\r\nHost: kwc\r\n\r\n");
    ok(uf_run_until(&f, client_eof, "the connection closes"), "the connection closes after it");
    is_int(f.resp.status, 403, "the upstream's 403");
    ok(f.resp.complete, "a complete message, framed by kwc");
    is_mem(f.resp.body.p, f.resp.body.len, "{\"kind\":\"Status\",\"code\":403}", 27, "its body");
    ok(uf_resp_has(&f.resp, "Content-Length: 27"), "its length");
    ok(uf_resp_has(&f.resp, "X-Up: 1"), "its end-to-end header relayed");
    ok(!uf_resp_has(&f.resp, "Keep-Alive: timeout=5"), "its hop-by-hop header not");
    is_int(f.resp.heads, 1, "one answer: the pipelined request is never answered");
    is_int(f.resp.parsed, f.in.len, "nothing after it");
    ok(f.up.after.len == 0, "nothing behind the refused request reached the upstream");
    ok(uf_up_has(&f, "Authorization: Bearer " UF_TOKEN), "the upgrade request carried kwc's token");
    uf_fini(&f);
}

static void
test_unreachable(void)
{
    struct uf f;
    struct tun_case c;
    uf_init(&f, UF_SWITCH, tun_handler, &c);
    case_init(&c, &f);
    shutdown(f.up.lfd, SHUT_RDWR); /* bound, not listening: refused */
    uf_send(&f, EXEC_HEAD);
    ok(uf_run_until(&f, client_eof, "the connection closes"), "the connection closes after it");
    is_int(f.resp.status, 503, "503");
    ok(uf_resp_has(&f.resp, "Retry-After: 1"), "Retry-After: 1");
    ok(f.resp.body.p && strstr(f.resp.body.p, "\"reason\":\"ServiceUnavailable\""), "a Status");
    is_int(f.up.conns, 0, "nothing reached the upstream");
    uf_fini(&f);
}

int
main(void)
{
    signal(SIGPIPE, SIG_IGN);
    TAP_RUN(test_switch);
    TAP_RUN(test_refused);
    TAP_RUN(test_unreachable);
    return tap_done();
}
