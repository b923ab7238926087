/*
 * upfake.h — a harness for the rooms that talk to the upstream
 * (passthrough_test, tunnel_test): kwc's real HTTP server (http.h) adopting
 * one end of a socketpair, the test playing the client on the other end; a
 * fake upstream API server listening on 127.0.0.1 (an ephemeral port),
 * scripted per test, that records the request head it got; and kwc's real
 * upstream client (up_client over libcurl) and uplink, from a kubeconfig
 * naming the fake upstream with a token.
 *
 * Everything runs on one event_base. uf_run_until() turns the loop
 * (EVLOOP_ONCE: it blocks until something happens) until a predicate holds,
 * bounded by a guard timer that only fires when the test is broken. Never a
 * sleep. The client's answers are read by libhttp-parser (HTTP_RESPONSE),
 * independent of kwc's response writer: status, headers, the decoded body
 * and how many heads arrived.
 */
#ifndef KWC_UPFAKE_H
#define KWC_UPFAKE_H

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <http_parser.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/gostr.h"
#include "kwc/http.h"
#include "kwc/kubeconfig.h"
#include "kwc/upstream.h"
#include "tap.h"

#define UF_GUARD_S 30        /* bound on one uf_run_until; never reached when all is well */
#define UF_TURNS_MAX 5000000 /* loop turns, the same */
#define UF_TOKEN "kwc-token"

/* ---- the fake upstream ---- */

enum uf_mode {
    UF_SMALL,       /* 200, a 2-byte JSON body, hop-by-hop headers of its own */
    UF_BIG_CHUNKED, /* 200, big_total bytes of pattern in chunks, written as it drains */
    UF_CUT_LENGTH,  /* 200 with Content-Length 100000, 5000 bytes (uf_up_cut closes) */
    UF_CUT_CHUNKED, /* 200 chunked: a 5000-byte chunk and 100 bytes of the next (the same) */
    UF_SWITCH,      /* 101 Switching Protocols, then echoes every byte */
    UF_REFUSE,      /* 403 with a JSON body; reads on (records what else arrives) */
};

struct uf_up {
    enum uf_mode mode;
    int lfd, port;
    struct event *lev;
    struct bufferevent *bev; /* the one connection */
    unsigned conns;
    struct gostr_buf head;  /* the request head it received */
    struct gostr_buf after; /* bytes after the head (tunnel: what the client sent through) */
    bool got_head, eof;
    size_t big_total, big_sent; /* UF_BIG_CHUNKED: body bytes */
    unsigned chunk_no;
    bool big_done;
    uint64_t written; /* bytes handed to its socket's output */
};

static inline unsigned char
uf_pat(size_t i)
{
    return (unsigned char)(i * 7u + (i >> 11));
}

static inline void
uf_up_out(struct uf_up *u, const void *p, size_t n)
{
    bufferevent_write(u->bev, p, n);
    u->written += n;
}

static inline void
uf_up_outs(struct uf_up *u, const char *s)
{
    uf_up_out(u, s, strlen(s));
}

/* UF_BIG_CHUNKED: top the output up to 256 KiB, chunk sizes varying. */
static inline void
uf_big_fill(struct uf_up *u)
{
    struct evbuffer *out = bufferevent_get_output(u->bev);
    static unsigned char buf[65536];
    while (!u->big_done && evbuffer_get_length(out) < 256 * 1024) {
        size_t n = 1 + (size_t)(u->chunk_no++ * 7919u) % sizeof(buf);
        if (n > u->big_total - u->big_sent)
            n = u->big_total - u->big_sent;
        if (n == 0) {
            uf_up_outs(u, "0\r\n\r\n");
            u->big_done = true;
            break;
        }
        for (size_t i = 0; i < n; i++)
            buf[i] = uf_pat(u->big_sent + i);
        char line[32];
        snprintf(line, sizeof(line), "%zx\r\n", n);
        uf_up_outs(u, line);
        uf_up_out(u, buf, n);
        uf_up_outs(u, "\r\n");
        u->big_sent += n;
    }
}

static inline void
uf_up_on_write(struct bufferevent *bev, void *arg)
{
    struct uf_up *u = arg;
    if (u->mode == UF_BIG_CHUNKED && u->got_head)
        uf_big_fill(u);
}

static inline void
uf_up_answer(struct uf_up *u)
{
    switch (u->mode) {
    case UF_SMALL:
        uf_up_outs(u, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                      "Keep-Alive: timeout=5\r\nX-Up: 1\r\n\r\n{}");
        break;
    case UF_BIG_CHUNKED:
        uf_up_outs(u, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n");
        bufferevent_setwatermark(u->bev, EV_WRITE, 64 * 1024, 0);
        uf_big_fill(u);
        break;
    case UF_CUT_LENGTH:
    case UF_CUT_CHUNKED: {
        bool chunked = u->mode == UF_CUT_CHUNKED;
        uf_up_outs(u, chunked ? "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                                "Transfer-Encoding: chunked\r\n\r\n1388\r\n"
                              : "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                                "Content-Length: 100000\r\n\r\n");
        unsigned char b[5000];
        for (size_t i = 0; i < sizeof(b); i++)
            b[i] = uf_pat(i);
        uf_up_out(u, b, sizeof(b));
        if (chunked) {
            uf_up_outs(u, "\r\n1000\r\n");
            uf_up_out(u, b, 100); /* part of the next chunk */
        }
        break; /* the test cuts the connection (uf_up_cut) */
    }
    case UF_SWITCH:
        uf_up_outs(u, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                      "Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n");
        break;
    case UF_REFUSE:
        uf_up_outs(u, "HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\n"
                      "Content-Length: 27\r\nKeep-Alive: timeout=5\r\nX-Up: 1\r\n\r\n"
                      "{\"kind\":\"Status\",\"code\":403}");
        break;
    }
}

static inline void
uf_up_on_read(struct bufferevent *bev, void *arg)
{
    struct uf_up *u = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    if (!u->got_head) {
        struct evbuffer_ptr e = evbuffer_search(in, "\r\n\r\n", 4, NULL);
        if (e.pos < 0)
            return;
        size_t n = (size_t)e.pos + 4;
        gostr_addn(&u->head, (const char *)evbuffer_pullup(in, (ev_ssize_t)n), n);
        evbuffer_drain(in, n);
        u->got_head = true;
        uf_up_answer(u);
        if (!u->bev)
            return;
    }
    size_t n = evbuffer_get_length(in);
    if (n) {
        gostr_addn(&u->after, (const char *)evbuffer_pullup(in, -1), n);
        if (u->mode == UF_SWITCH)
            uf_up_out(u, evbuffer_pullup(in, -1), n);
        evbuffer_drain(in, n);
    }
}

static inline void
uf_up_on_event(struct bufferevent *bev, short what, void *arg)
{
    struct uf_up *u = arg;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        bufferevent_free(u->bev);
        u->bev = NULL;
        u->eof = true;
    }
}

static inline void
uf_up_on_accept(evutil_socket_t lfd, short what, void *arg)
{
    struct uf_up *u = arg;
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
        return;
    u->conns++;
    if (u->bev) { /* one connection per test */
        close(fd);
        return;
    }
    u->bev = bufferevent_socket_new(event_get_base(u->lev), fd, BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(u->bev, uf_up_on_read, uf_up_on_write, uf_up_on_event, u);
    bufferevent_enable(u->bev, EV_READ | EV_WRITE);
}

/* The fake upstream closes its connection now. */
static inline void
uf_up_cut(struct uf_up *u)
{
    if (u->bev) {
        bufferevent_free(u->bev);
        u->bev = NULL;
        u->eof = true;
    }
}

/* ---- the client's view of kwc's answers ---- */

struct uf_resp {
    http_parser p;
    int heads;     /* heads parsed (a second one would be a bug) */
    bool complete; /* a whole message */
    int status;
    struct gostr_buf hdrs; /* "Name: value\n" each */
    struct gostr_buf body; /* decoded */
    bool in_value;
    size_t parsed;
    bool bad;   /* kwc's bytes are no HTTP answer */
    bool ended; /* the stream ended (what was cut stays incomplete) */
};

static inline int
uf_r_begin(http_parser *p)
{
    struct uf_resp *r = p->data;
    r->heads++;
    return 0;
}

static inline int
uf_r_field(http_parser *p, const char *at, size_t n)
{
    struct uf_resp *r = p->data;
    if (r->in_value || r->hdrs.len == 0) {
        if (r->in_value)
            gostr_addn(&r->hdrs, "\n", 1);
        r->in_value = false;
    }
    gostr_addn(&r->hdrs, at, n);
    return 0;
}

static inline int
uf_r_value(http_parser *p, const char *at, size_t n)
{
    struct uf_resp *r = p->data;
    if (!r->in_value)
        gostr_addn(&r->hdrs, ": ", 2);
    r->in_value = true;
    gostr_addn(&r->hdrs, at, n);
    return 0;
}

static inline int
uf_r_headers_complete(http_parser *p)
{
    struct uf_resp *r = p->data;
    if (r->in_value)
        gostr_addn(&r->hdrs, "\n", 1);
    r->in_value = false;
    r->status = p->status_code;
    return p->status_code == 101 ? 2 : 0;
}

static inline int
uf_r_body(http_parser *p, const char *at, size_t n)
{
    struct uf_resp *r = p->data;
    gostr_addn(&r->body, at, n);
    return 0;
}

static inline int
uf_r_complete(http_parser *p)
{
    struct uf_resp *r = p->data;
    r->complete = true;
    return 0;
}

static const http_parser_settings uf_resp_settings = {
    .on_message_begin = uf_r_begin,
    .on_header_field = uf_r_field,
    .on_header_value = uf_r_value,
    .on_headers_complete = uf_r_headers_complete,
    .on_body = uf_r_body,
    .on_message_complete = uf_r_complete,
};

/* "Name: value" is among the answer's headers (case-sensitive value). */
static inline bool
uf_resp_has(const struct uf_resp *r, const char *line)
{
    size_t l = strlen(line);
    for (const char *s = r->hdrs.p; s && *s;) {
        size_t n = strcspn(s, "\n");
        if (n == l && strncasecmp(s, line, l) == 0)
            return true;
        s += n + (s[n] == '\n');
    }
    return false;
}

/* ---- the fixture ---- */

struct uf {
    struct event_base *base;
    struct http_server *s;
    struct uf_up up;
    struct kcfg *k;
    struct up_client *uc;
    void (*handler)(struct uf *f, struct hreq *r);
    void *harg;
    struct hreq *req;          /* the last request, until it leaves the server */
    int done_how, done_status; /* how it left (enum hreq_end), its status */
    int cfd;                   /* the client's end */
    struct event *cev;
    struct gostr_buf in; /* every byte kwc sent the client */
    bool ceof;
    struct uf_resp resp;
    struct event *guard;
    bool guard_fired;
};

static inline void
uf_on_done(void *arg, const struct hreq_done *d, void *note)
{
    struct uf *f = arg;
    f->req = NULL;
    f->done_how = (int)d->how;
    f->done_status = d->status;
}

static inline void
uf_on_request(void *arg, struct hreq *r)
{
    struct uf *f = arg;
    f->req = r;
    f->handler(f, r);
}

static inline void
uf_on_guard(evutil_socket_t fd, short what, void *arg)
{
    struct uf *f = arg;
    f->guard_fired = true;
}

/* Parse what arrived for the client (a 101 ends the HTTP part). At the
 * end of the stream the parser is told so: a message cut short stays
 * incomplete (complete false), which is no parse error. */
static inline void
uf_parse(struct uf *f)
{
    struct uf_resp *r = &f->resp;
    if (r->bad || r->ended || (r->status == 101 && r->complete))
        return;
    size_t avail = f->in.len - r->parsed;
    if (avail) {
        size_t n = http_parser_execute(&r->p, &uf_resp_settings, f->in.p + r->parsed, avail);
        r->parsed += n;
        if (HTTP_PARSER_ERRNO(&r->p) != HPE_OK) {
            r->bad = true;
            printf("# the client could not parse kwc's answer: %s\n",
                   http_errno_name(HTTP_PARSER_ERRNO(&r->p)));
            return;
        }
        if (r->status == 101)
            r->complete = true; /* the rest is the new protocol */
    }
    if (f->ceof && r->parsed == f->in.len && !r->complete) {
        r->ended = true;
        http_parser_execute(&r->p, &uf_resp_settings, NULL, 0);
    }
}

static inline void
uf_client_read(struct uf *f)
{
    for (;;) {
        char buf[65536];
        ssize_t n = recv(f->cfd, buf, sizeof(buf), 0);
        if (n > 0) {
            gostr_addn(&f->in, buf, (size_t)n);
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EINTR))
            f->ceof = true;
        break;
    }
    uf_parse(f);
}

static inline void
uf_on_client(evutil_socket_t fd, short what, void *arg)
{
    struct uf *f = arg;
    uf_client_read(f);
    if (f->ceof)
        event_del(f->cev);
}

/* The client reads (on) or leaves kwc's answer in the socket (off). */
static inline void
uf_client_reading(struct uf *f, bool on)
{
    if (on && !f->ceof)
        event_add(f->cev, NULL);
    else
        event_del(f->cev);
}

static inline void
uf_init(struct uf *f, enum uf_mode mode, void (*handler)(struct uf *, struct hreq *), void *harg)
{
    *f = (struct uf){.cfd = -1};
    f->base = event_base_new();
    f->handler = handler;
    f->harg = harg;
    f->up.mode = mode;
    f->up.lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    if (f->up.lfd < 0 || bind(f->up.lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        listen(f->up.lfd, 16) != 0 || getsockname(f->up.lfd, (struct sockaddr *)&sa, &sl) != 0)
        abort();
    f->up.port = ntohs(sa.sin_port);
    f->up.lev = event_new(f->base, f->up.lfd, EV_READ | EV_PERSIST, uf_up_on_accept, &f->up);
    event_add(f->up.lev, NULL);

    char y[1024], err[512] = "";
    snprintf(y, sizeof(y),
             "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n"
             "    server: http://127.0.0.1:%d\nusers:\n- name: u\n  user:\n    token: " UF_TOKEN
             "\n"
             "contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
             f->up.port);
    struct up_options uo = {.connect_timeout_ms = 10000, .max_idle_conns = 4};
    if (kcfg_parse(y, strlen(y), "/", NULL, &f->k, err, sizeof(err)) != 0 ||
        up_client_new(f->base, f->k, &uo, &f->uc, err, sizeof(err)) != 0) {
        printf("# %s\n", err);
        abort();
    }
    struct http_server_options ho = {0};
    if (http_server_new(f->base, &ho, uf_on_request, f, &f->s, err, sizeof(err)) != 0) {
        printf("# %s\n", err);
        abort();
    }
    http_server_on_done(f->s, uf_on_done, f);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
        abort();
    f->cfd = sv[0];
    /* the client's address as kwc sees it (X-Forwarded-For) */
    struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(40000)};
    inet_pton(AF_INET, "192.0.2.7", &peer.sin_addr);
    http_server_adopt(f->s, sv[1], (struct sockaddr *)&peer, sizeof(peer));
    f->cev = event_new(f->base, f->cfd, EV_READ | EV_PERSIST, uf_on_client, f);
    event_add(f->cev, NULL);
    http_parser_init(&f->resp.p, HTTP_RESPONSE);
    f->resp.p.data = &f->resp;
    f->guard = evtimer_new(f->base, uf_on_guard, f);
}

/* Turn the loop until pred(f) holds; false (and a diagnostic) if it never does. */
static inline bool
uf_run_until(struct uf *f, bool (*pred)(struct uf *f), const char *what)
{
    struct timeval tv = {UF_GUARD_S, 0};
    f->guard_fired = false;
    evtimer_add(f->guard, &tv);
    bool held = false;
    for (long i = 0; i < UF_TURNS_MAX && !f->guard_fired; i++) {
        if ((held = pred(f)))
            break;
        event_base_loop(f->base, EVLOOP_ONCE);
    }
    held = held || pred(f);
    evtimer_del(f->guard);
    if (!held)
        printf("# never came to pass: %s\n", what);
    return held;
}

static inline void
uf_send(struct uf *f, const char *s)
{
    size_t n = strlen(s);
    if (send(f->cfd, s, n, MSG_NOSIGNAL) != (ssize_t)n)
        abort(); /* a socketpair takes a request head at once */
}

/* The client closes its end; the loop runs until kwc has let everything go
 * (the fake upstream's connection closed too, when there was one). */
static inline void
uf_fini(struct uf *f)
{
    if (f->cfd >= 0)
        close(f->cfd);
    event_free(f->cev);
    http_server_free(f->s);
    if (f->up.bev)
        bufferevent_free(f->up.bev);
    event_free(f->up.lev);
    close(f->up.lfd);
    /* deferred frees (reaps, deferred callbacks) */
    for (int i = 0; i < 8; i++)
        event_base_loop(f->base, EVLOOP_NONBLOCK);
    up_client_free(f->uc);
    kcfg_free(f->k);
    event_free(f->guard);
    event_base_free(f->base);
    free(f->up.head.p);
    free(f->up.after.p);
    free(f->in.p);
    free(f->resp.hdrs.p);
    free(f->resp.body.p);
}

/* A header line "Name: value" is in the head the fake upstream received. */
static inline bool
uf_up_has(const struct uf *f, const char *line)
{
    size_t l = strlen(line);
    const char *h = f->up.head.p;
    for (const char *s = h ? strstr(h, "\r\n") : NULL; s && s[2];) {
        s += 2;
        size_t n = strcspn(s, "\r");
        if (n == l && strncasecmp(s, line, l) == 0)
            return true;
        s = strstr(s, "\r\n");
    }
    return false;
}

/* The number of header lines whose name is name. */
static inline int
uf_up_count(const struct uf *f, const char *name)
{
    int c = 0;
    size_t l = strlen(name);
    const char *h = f->up.head.p;
    for (const char *s = h ? strstr(h, "\r\n") : NULL; s && s[2];) {
        s += 2;
        if (strncasecmp(s, name, l) == 0 && s[l] == ':')
            c++;
        s = strstr(s, "\r\n");
    }
    return c;
}

#endif
