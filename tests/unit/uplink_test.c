/*
 * uplink_test.c — proxy/upstream/uplink.c: kwc's identity towards the
 * upstream.
 *
 * The header policy replaced four predicates that lived in passthrough.c and
 * tunnel.c (before this module, commit fca5ed1). They are copied here
 * verbatim as oracles, and the one table must answer exactly as they did for
 * every header name below (hop-by-hop, framing, credentials, identity claims,
 * near misses) with and without stripping and under several Connection
 * headers: no behaviour changed. The differences between the two ways
 * (forwarded vs tunnelled) are asserted on their own, with the reason.
 *
 * Then the uplink's credentials and TLS: the bearer and basic header lines,
 * a token file read at start, the SSL_CTX only for https, and the start-time
 * check of the kubeconfig's TLS material.
 *
 * And kwc's own connections (uplink_connect, a tunnel's) on loopback: bytes
 * written before the connection arrive; a refused connection, a TLS
 * handshake with a peer that speaks no TLS, and a reset after connecting
 * are told apart by uplink_conn_error. The loop runs until the awaited
 * event, bounded by a guard timer that only fires on failure.
 */
#include "kwc/uplink.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/kubeconfig.h"
#include "tap.h"

/* ---- the predicates as they were (fca5ed1), verbatim but for names ---- */

/* passthrough.c hop_by_hop */
static bool
old_pt_hop_by_hop(const char *name)
{
    static const char *const hop[] = {"Connection",
                                      "Keep-Alive",
                                      "Proxy-Connection",
                                      "Proxy-Authenticate",
                                      "Proxy-Authorization",
                                      "Te",
                                      "Trailer",
                                      "Transfer-Encoding",
                                      "Upgrade"};
    for (size_t i = 0; i < KWC_ARRAY_LEN(hop); i++)
        if (strcasecmp(name, hop[i]) == 0)
            return true;
    return false;
}

/* passthrough.c named_in_connection */
static bool
old_pt_named_in_connection(const char *conn, const char *name)
{
    if (!conn)
        return false;
    size_t nl = strlen(name);
    for (const char *s = conn; *s;) {
        while (*s == ' ' || *s == ',' || *s == '\t')
            s++;
        size_t l = strcspn(s, " ,\t");
        if (l == nl && strncasecmp(s, name, nl) == 0)
            return true;
        s += l;
    }
    return false;
}

/* passthrough.c collect_header: true when the header was not forwarded as is
 * (X-Forwarded-For is not dropped: the passthrough rewrites it) */
static bool
old_pt_request_dropped(const char *k, const char *connection, bool strip_credentials)
{
    if (old_pt_hop_by_hop(k) || strcasecmp(k, "Host") == 0 ||
        strcasecmp(k, "Content-Length") == 0 || strcasecmp(k, "Expect") == 0 ||
        old_pt_named_in_connection(connection, k))
        return true;
    if (strcasecmp(k, "X-Forwarded-For") == 0)
        return false;
    if (strip_credentials &&
        (strcasecmp(k, "Authorization") == 0 || strncasecmp(k, "Impersonate-", 12) == 0 ||
         strncasecmp(k, "X-Remote-", 9) == 0))
        return true;
    return false;
}

/* passthrough.c on_up_headers: Content-Length is taken for the framing */
static bool
old_pt_response_dropped(const char *name)
{
    return old_pt_hop_by_hop(name) || strcasecmp(name, "Content-Length") == 0;
}

/* tunnel.c skip_header */
static bool
old_tun_skip_header(const char *k, bool strip)
{
    if (strcasecmp(k, "Host") == 0 || strncasecmp(k, "Proxy-", 6) == 0 ||
        strcasecmp(k, "Expect") == 0 || strcasecmp(k, "HTTP2-Settings") == 0 ||
        strcasecmp(k, "Upgrade") == 0)
        return true;
    return strip &&
           (strcasecmp(k, "Authorization") == 0 || strncasecmp(k, "Impersonate-", 12) == 0 ||
            strncasecmp(k, "X-Remote-", 9) == 0);
}

/* tunnel.c hop_by_hop (for the relayed refusal) */
static bool
old_tun_hop_by_hop(const char *name, const char *connection)
{
    static const char *const hop[] = {"Connection",         "Keep-Alive", "Proxy-Connection",
                                      "Proxy-Authenticate", "Te",         "Trailer",
                                      "Transfer-Encoding",  "Upgrade",    "Content-Length",
                                      "Proxy-Authorization"};
    for (size_t i = 0; i < KWC_ARRAY_LEN(hop); i++)
        if (strcasecmp(name, hop[i]) == 0)
            return true;
    size_t nl = strlen(name);
    for (const char *s = connection; s && *s;) {
        while (*s == ' ' || *s == '\t' || *s == ',')
            s++;
        size_t l = strcspn(s, ","), e = l;
        while (e && (s[e - 1] == ' ' || s[e - 1] == '\t'))
            e--;
        if (e == nl && strncasecmp(s, name, nl) == 0)
            return true;
        s += l;
    }
    return false;
}

static const char *const names[] = {
    "Connection",
    "connection",
    "Keep-Alive",
    "Proxy-Connection",
    "Proxy-Authenticate",
    "Proxy-Authorization",
    "proxy-authorization",
    "Proxy-Foo",
    "Proxy",
    "Proxy-",
    "Te",
    "TE",
    "Trailer",
    "Trailers",
    "Transfer-Encoding",
    "Upgrade",
    "upgrade",
    "Upgrade-Insecure-Requests",
    "Content-Length",
    "Content-Type",
    "Host",
    "host",
    "Expect",
    "HTTP2-Settings",
    "Authorization",
    "authorization",
    "Authorization2",
    "Impersonate-User",
    "impersonate-group",
    "Impersonate-Extra-Scopes",
    "Impersonate-",
    "Impersonate",
    "X-Remote-User",
    "x-remote-group",
    "X-Remote",
    "X-Forwarded-For",
    "X-Keep",
    "X-Drop",
    "x-drop",
    "Accept",
    "Accept-Encoding",
    "User-Agent",
    "Cookie",
    "Date",
    "Server",
    "Warning",
    "Audit-Id",
    "Sec-WebSocket-Protocol",
    "X-Stream-Protocol-Version",
    "A",
    "B",
};

static const char *const connections[] = {
    NULL,
    "",
    "close",
    "keep-alive",
    "Upgrade",
    "upgrade, X-Drop",
    "X-Drop,Keep-Alive",
    " x-drop , b ",
    "a b",
    "A\tb",
    ",,,",
    "Upgrade, HTTP2-Settings",
    "X-Keep x-drop, Accept",
};

static void
test_policy_as_before(void)
{
    int differ = 0, n = 0;
    for (size_t c = 0; c < KWC_ARRAY_LEN(connections); c++)
        for (size_t i = 0; i < KWC_ARRAY_LEN(names); i++)
            for (int strip = 0; strip < 2; strip++) {
                const char *nm = names[i], *conn = connections[c];
                bool want, got;
                want = old_pt_request_dropped(nm, conn, strip);
                got = uplink_request_header_dropped(UPLINK_FORWARD, nm, conn, strip);
                if (want != got && ++differ < 10)
                    printf("# forward request %s (Connection %s, strip %d): %d, was %d\n", nm,
                           conn ? conn : "-", strip, got, want);
                want = old_tun_skip_header(nm, strip);
                got = uplink_request_header_dropped(UPLINK_TUNNEL, nm, conn, strip);
                if (want != got && ++differ < 10)
                    printf("# tunnel request %s (Connection %s, strip %d): %d, was %d\n", nm,
                           conn ? conn : "-", strip, got, want);
                want = old_pt_response_dropped(nm);
                got = uplink_response_header_dropped(UPLINK_FORWARD, nm, conn);
                if (want != got && ++differ < 10)
                    printf("# forward answer %s (Connection %s): %d, was %d\n", nm,
                           conn ? conn : "-", got, want);
                want = old_tun_hop_by_hop(nm, conn);
                got = uplink_response_header_dropped(UPLINK_TUNNEL, nm, conn);
                if (want != got && ++differ < 10)
                    printf("# tunnel answer %s (Connection %s): %d, was %d\n", nm,
                           conn ? conn : "-", got, want);
                n += 4;
            }
    ok(n > 4000, "every name, Connection header and strip setting was asked");
    is_int(differ, 0, "the one table answers as the four predicates it replaced");
}

/* Where the two ways differ, and why (uplink.h). */
static void
test_policy_differences(void)
{
    /* both: the caller's credentials and identity claims, when kwc's replace them */
    const char *cred[] = {"Authorization", "Impersonate-User", "Impersonate-Extra-X",
                          "X-Remote-User"};
    for (size_t i = 0; i < KWC_ARRAY_LEN(cred); i++) {
        ok(uplink_request_header_dropped(UPLINK_FORWARD, cred[i], NULL, true), cred[i]);
        ok(uplink_request_header_dropped(UPLINK_TUNNEL, cred[i], NULL, true), cred[i]);
        ok(!uplink_request_header_dropped(UPLINK_FORWARD, cred[i], NULL, false), cred[i]);
        ok(!uplink_request_header_dropped(UPLINK_TUNNEL, cred[i], NULL, false), cred[i]);
    }
    /* the tunnel keeps the handshake and the body's framing */
    const char *kept[] = {"Connection", "Transfer-Encoding", "Content-Length", "Keep-Alive", "Te"};
    for (size_t i = 0; i < KWC_ARRAY_LEN(kept); i++) {
        ok(!uplink_request_header_dropped(UPLINK_TUNNEL, kept[i], "Upgrade", true), kept[i]);
        ok(uplink_request_header_dropped(UPLINK_FORWARD, kept[i], NULL, true), kept[i]);
    }
    /* Host and Expect are kwc's to write (or answer) either way; Upgrade too */
    ok(uplink_request_header_dropped(UPLINK_TUNNEL, "Upgrade", NULL, false), "Upgrade rewritten");
    ok(uplink_request_header_dropped(UPLINK_FORWARD, "Host", NULL, false), "Host");
    ok(uplink_request_header_dropped(UPLINK_TUNNEL, "expect", NULL, false), "Expect");
    /* a request's Connection names more hop-by-hop headers when forwarded only */
    ok(uplink_request_header_dropped(UPLINK_FORWARD, "X-Drop", "keep-alive, x-drop", false),
       "forwarded: a header the Connection header names");
    ok(!uplink_request_header_dropped(UPLINK_TUNNEL, "X-Drop", "keep-alive, x-drop", false),
       "tunnelled: replayed as is");
    /* the tunnel drops every Proxy-*, the forward only the hop-by-hop three */
    ok(uplink_request_header_dropped(UPLINK_TUNNEL, "Proxy-Foo", NULL, false), "tunnel: Proxy-*");
    ok(!uplink_request_header_dropped(UPLINK_FORWARD, "Proxy-Foo", NULL, false),
       "forward: Proxy-Foo");
    ok(!uplink_request_header_dropped(UPLINK_FORWARD, "X-Forwarded-For", NULL, true),
       "X-Forwarded-For is not dropped (the passthrough appends to it)");
    /* answers: a relayed refusal honours its Connection header */
    ok(uplink_response_header_dropped(UPLINK_TUNNEL, "X-Hop", "close, X-Hop"), "tunnel answer");
    ok(!uplink_response_header_dropped(UPLINK_FORWARD, "X-Hop", "close, X-Hop"), "forward answer");
    ok(!uplink_response_header_dropped(UPLINK_FORWARD, "Content-Type", NULL), "end-to-end kept");
}

/* ---- credentials and TLS ---- */

static struct kcfg *
kcfg_of(const char *server, const char *user_yaml)
{
    char y[2048];
    snprintf(y, sizeof(y),
             "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: %s\n"
             "users:\n- name: u\n  user:\n%s\ncontexts:\n- name: x\n  context:\n    cluster: c\n"
             "    user: u\ncurrent-context: x\n",
             server, user_yaml);
    struct kcfg *k = NULL;
    char err[512] = "";
    int rc = kcfg_parse(y, strlen(y), "/", NULL, &k, err, sizeof(err));
    if (rc != 0) {
        printf("# kcfg_parse: %s\n", err);
        abort();
    }
    return k;
}

/* The bearer line uplink_cred_get gives now, in a static buffer ("(null)": none). */
static const char *
bearer_now(struct uplink *u)
{
    static char line[256];
    struct uplink_cred c;
    if (!uplink_cred_get(u, NULL, &c))
        return "(no credential)";
    snprintf(line, sizeof(line), "%s", c.bearer_line ? c.bearer_line : "(null)");
    uplink_cred_clear(&c);
    return line;
}

static void
test_credentials(void)
{
    struct event_base *base = event_base_new();
    char err[512];
    struct uplink *u = NULL;

    struct kcfg *k = kcfg_of("http://127.0.0.1:1", "    token: abc.def");
    is_int(uplink_new(base, k, &u, err, sizeof(err)), 0, "token: made");
    is_str(bearer_now(u), "Authorization: Bearer abc.def", "the bearer line");
    ok(uplink_basic_line(u) == NULL, "no basic auth");
    ok(uplink_ssl_new(u) == NULL, "plain http: no TLS session");
    ok(uplink_kcfg(u) == k, "the settings it was made from");
    uplink_free(u);
    kcfg_free(k);

    /* Aladdin:open sesame, RFC 7617's example */
    k = kcfg_of("http://127.0.0.1:1", "    username: Aladdin\n    password: open sesame");
    is_int(uplink_new(base, k, &u, err, sizeof(err)), 0, "basic: made");
    is_str(uplink_basic_line(u),
           "Authorization: Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==", "the basic line (RFC 7617 2)");
    is_str(bearer_now(u), "(null)", "no token");
    uplink_free(u);
    kcfg_free(k);

    char path[] = "/tmp/kwc-uplink-tokenXXXXXX";
    int fd = mkstemp(path);
    ok(fd >= 0 && write(fd, "from-file\n", 10) == 10, "a token file");
    close(fd);
    char user[600];
    snprintf(user, sizeof(user), "    tokenFile: %s", path);
    k = kcfg_of("http://127.0.0.1:1", user);
    is_int(uplink_new(base, k, &u, err, sizeof(err)), 0, "token file: made");
    is_str(bearer_now(u), "Authorization: Bearer from-file", "read at start, trimmed");
    unlink(path);
    is_str(bearer_now(u), "Authorization: Bearer from-file",
           "gone within the minute: the token read stays");
    uplink_free(u);
    kcfg_free(k);

    k = kcfg_of("https://kube.example:6443", "    token: t\n");
    is_int(uplink_new(base, k, &u, err, sizeof(err)), 0, "https: made");
    SSL *ssl = uplink_ssl_new(u);
    ok(ssl != NULL, "https: a TLS session");
    if (ssl) {
        is_str(SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name), "kube.example",
               "SNI: the server's host");
        SSL_free(ssl);
    }
    uplink_free(u);
    kcfg_free(k);
    event_base_free(base);
}

static void
test_bad_material(void)
{
    /* kcfg_parse takes any bytes as data; the uplink checks them at start */
    struct kcfg *k = kcfg_of("https://127.0.0.1:1", "    token: t");
    static unsigned char junk[] = "not a certificate";
    k->ca_pem = (unsigned char *)xstrdup((const char *)junk);
    k->ca_pem_len = sizeof(junk) - 1;
    struct event_base *base = event_base_new();
    struct uplink *u = NULL;
    char err[512] = "";
    is_int(uplink_new(base, k, &u, err, sizeof(err)), KWC_ECONFIG, "a CA that is no PEM: refused");
    ok(strstr(err, "certificate-authority data in KUBECONFIG is not a PEM certificate") != NULL,
       "the message says which");
    ok(u == NULL, "nothing made");
    kcfg_free(k);
    event_base_free(base);
}

/* ---- kwc's own connections ---- */

#define GUARD_S 10 /* bound on waiting; never reached when all is well */

struct conn_probe {
    short what;    /* the event callback's last flags */
    bool tls;      /* uplink_conn_error's answer */
    char why[320]; /* and its text */
    bool connected;
};

static void
on_probe_event(struct bufferevent *bev, short what, void *arg)
{
    struct conn_probe *p = arg;
    p->what = what;
    if (what & BEV_EVENT_CONNECTED) {
        p->connected = true;
        return;
    }
    p->tls = uplink_conn_error(bev, p->connected, p->why, sizeof(p->why));
}

static void
on_guard(evutil_socket_t fd, short what, void *arg)
{
    *(bool *)arg = true;
}

/* A listening socket on 127.0.0.1 (non-blocking), its port in *port. */
static int
listener(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 8) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &l) != 0)
        abort();
    *port = ntohs(a.sin_port);
    return fd;
}

/* Run the loop until the probe saw what (any of its bits), or the guard. */
static bool
wait_for(struct event_base *base, struct conn_probe *p, short what)
{
    bool fired = false;
    struct event *g = evtimer_new(base, on_guard, &fired);
    struct timeval tv = {GUARD_S, 0};
    evtimer_add(g, &tv);
    while (!(p->what & what) && !fired)
        event_base_loop(base, EVLOOP_ONCE);
    event_free(g);
    return (p->what & what) != 0;
}

/* An uplink for scheme://127.0.0.1:port. */
static struct uplink *
uplink_for(struct event_base *base, const char *scheme, int port, struct kcfg **k)
{
    char server[64];
    snprintf(server, sizeof(server), "%s://127.0.0.1:%d", scheme, port);
    *k = kcfg_of(server, "    token: t");
    if (strcmp(scheme, "https") == 0)
        (*k)->insecure_skip_tls_verify = true;
    struct uplink *u = NULL;
    char err[512];
    if (uplink_new(base, *k, &u, err, sizeof(err)) != 0)
        abort();
    return u;
}

static void
test_connect(void)
{
    struct event_base *base = event_base_new();
    struct kcfg *k;
    int port, lfd = listener(&port);
    struct uplink *u = uplink_for(base, "http", port, &k);

    /* connected: the bytes written before it arrive */
    struct conn_probe p = {0};
    const char *err = NULL;
    struct bufferevent *bev = uplink_connect(u, base, &err);
    ok(bev != NULL && err == NULL, "started");
    bufferevent_setcb(bev, NULL, NULL, on_probe_event, &p);
    bufferevent_write(bev, "early", 5);
    ok(wait_for(base, &p, BEV_EVENT_CONNECTED), "connected");
    int afd = accept(lfd, NULL, NULL);
    ok(afd >= 0, "the listener has it");
    char buf[16] = "";
    for (int i = 0; i < 1000 && afd >= 0; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        ssize_t n = recv(afd, buf, sizeof(buf) - 1, MSG_DONTWAIT);
        if (n > 0 || (n < 0 && errno != EAGAIN))
            break;
    }
    is_str(buf, "early", "the bytes written before the connection");

    /* a reset once connected: the socket's error */
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(afd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(afd);
    bufferevent_enable(bev, EV_READ);
    ok(wait_for(base, &p, BEV_EVENT_ERROR | BEV_EVENT_EOF), "the reset is seen");
    ok(p.what & BEV_EVENT_ERROR, "as an error");
    ok(!p.tls, "no TLS error");
    is_str(p.why, "Connection reset by peer", "connected: the socket's error");
    bufferevent_free(bev);

    /* nothing listening: refused */
    close(lfd);
    p = (struct conn_probe){0};
    bev = uplink_connect(u, base, &err);
    ok(bev != NULL, "started");
    if (bev) {
        bufferevent_setcb(bev, NULL, NULL, on_probe_event, &p);
        ok(wait_for(base, &p, BEV_EVENT_ERROR | BEV_EVENT_EOF), "refused: an error");
        ok(!p.tls, "refused: no TLS error");
        is_str(p.why, "Connection refused", "refused: the socket's error");
        bufferevent_free(bev);
    }
    uplink_free(u);
    kcfg_free(k);

    /* https to a peer that speaks no TLS: the handshake's error */
    lfd = listener(&port);
    u = uplink_for(base, "https", port, &k);
    p = (struct conn_probe){0};
    bev = uplink_connect(u, base, &err);
    ok(bev != NULL, "https: started");
    if (bev) {
        bufferevent_setcb(bev, NULL, NULL, on_probe_event, &p);
        bufferevent_enable(bev, EV_READ);
        for (int i = 0; i < 1000 && (afd = accept(lfd, NULL, NULL)) < 0; i++)
            event_base_loop(base, EVLOOP_NONBLOCK);
        static const char plain[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
        ok(afd >= 0 && send(afd, plain, sizeof(plain) - 1, MSG_NOSIGNAL) > 0,
           "the peer answers in plaintext");
        ok(wait_for(base, &p, BEV_EVENT_ERROR | BEV_EVENT_EOF), "https: the handshake fails");
        ok(!p.connected, "never connected");
        ok(p.tls, "a TLS error");
        ok(strncmp(p.why, "TLS handshake failed: ", 22) == 0 && strlen(p.why) > 22,
           "with OpenSSL's reason");
        printf("# %s\n", p.why);
        bufferevent_free(bev);
        if (afd >= 0)
            close(afd);
    }
    close(lfd);
    uplink_free(u);
    kcfg_free(k);
    event_base_free(base);
}

/* A sibling (another loop's uplink) shares the owner's identity and
 * credentials and connects on its own loop; the owner goes last. The
 * threads are upthreads_test's. */
static void
test_sibling(void)
{
    struct event_base *base = event_base_new(), *base2 = event_base_new();
    char path[] = "/tmp/kwc-uplink-sibXXXXXX";
    int fd = mkstemp(path);
    ok(fd >= 0 && write(fd, "one\n", 4) == 4 && close(fd) == 0, "a token file");
    char user[600];
    snprintf(user, sizeof(user), "    tokenFile: %s", path);
    int port, lfd = listener(&port);
    char server[64];
    snprintf(server, sizeof(server), "http://127.0.0.1:%d", port);
    struct kcfg *k = kcfg_of(server, user);
    struct uplink *u = NULL;
    char err[512];
    is_int(uplink_new(base, k, &u, err, sizeof(err)), 0, "the owner");
    struct uplink *s = uplink_new_sibling(u, base2);
    ok(s != NULL && uplink_kcfg(s) == k, "a sibling with the owner's settings");
    is_str(bearer_now(s), "Authorization: Bearer one", "the owner's token");
    uplink_set_token_reread(u, 0);
    fd = open(path, O_WRONLY | O_TRUNC);
    ok(fd >= 0 && write(fd, "two\n", 4) == 4 && close(fd) == 0, "the token rotates");
    is_str(bearer_now(s), "Authorization: Bearer two", "the sibling reads the new one");
    is_str(bearer_now(u), "Authorization: Bearer two", "and the owner sends it too");
    ok(uplink_exec(s) == NULL, "no plugin");
    unlink(path);

    /* a connection on the sibling's loop */
    struct conn_probe p = {0};
    const char *cerr = NULL;
    struct bufferevent *bev = uplink_connect(s, base2, &cerr);
    ok(bev != NULL, "a sibling's connection started");
    if (bev) {
        bufferevent_setcb(bev, NULL, NULL, on_probe_event, &p);
        ok(wait_for(base2, &p, BEV_EVENT_CONNECTED), "connected on the sibling's loop");
        bufferevent_free(bev);
    }
    close(lfd);
    uplink_free(s);
    uplink_free(u);
    kcfg_free(k);

    k = kcfg_of("https://kube.example:6443", "    token: t\n");
    is_int(uplink_new(base, k, &u, err, sizeof(err)), 0, "https: the owner");
    s = uplink_new_sibling(u, base2);
    SSL *ssl = uplink_ssl_new(s);
    ok(ssl != NULL, "a sibling's TLS session, from the owner's SSL_CTX");
    if (ssl) {
        is_str(SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name), "kube.example",
               "SNI: the server's host");
        SSL_free(ssl);
    }
    uplink_free(s);
    uplink_free(u);
    kcfg_free(k);
    event_base_free(base2);
    event_base_free(base);
}

int
main(void)
{
    signal(SIGPIPE, SIG_IGN);
    TAP_RUN(test_policy_as_before);
    TAP_RUN(test_policy_differences);
    TAP_RUN(test_credentials);
    TAP_RUN(test_bad_material);
    TAP_RUN(test_connect);
    TAP_RUN(test_sibling);
    return tap_done();
}
