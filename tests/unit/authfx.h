/*
 * authfx.h — a fake upstream for the auth tests (auth_test, auth_loops_test):
 * libevent's evhttp on an ephemeral loopback port that answers TokenReviews
 * ("good..." tokens are alice, others rejected) and SubjectAccessReviews
 * (a delete, or a group holding "8:abcdefgh", denied; the rest allowed),
 * counts them, and can hold answers back until the test releases them;
 * and the tests' client addresses.
 * Everything of a fake runs on the thread of the event_base it was made
 * on.
 */
#ifndef KWC_AUTHFX_H
#define KWC_AUTHFX_H

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/srcmap.h"

enum fake_mode { FAKE_OK, FAKE_500, FAKE_GARBAGE, FAKE_BIG };

struct fake {
    struct evhttp *http;
    int port;
    enum fake_mode mode;
    bool hold;
    int token_reviews, sars;
    struct evhttp_request *held[256];
    int nheld;
    char last_ctype[64];
};

static inline void
fake_answer(struct fake *f, struct evhttp_request *req)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    char *body = xmalloc(len + 1);
    evbuffer_copyout(in, body, len);
    body[len] = '\0';
    const char *uri = evhttp_request_get_uri(req);
    struct evbuffer *out = evbuffer_new();
    int code = 201;
    if (f->mode == FAKE_500) {
        code = 500;
        evbuffer_add_printf(out, "{\"kind\":\"Status\",\"code\":500}");
    } else if (f->mode == FAKE_GARBAGE) {
        evbuffer_add_printf(out, "<html>not json");
    } else if (f->mode == FAKE_BIG) {
        evbuffer_add_printf(out, "{\"status\":{\"allowed\":true,\"reason\":\"");
        char *pad = xmalloc(1 << 20);
        memset(pad, 'x', 1 << 20);
        evbuffer_add(out, pad, 1 << 20);
        free(pad);
        evbuffer_add_printf(out, "\"}}");
    } else if (strstr(uri, "tokenreviews")) {
        if (strstr(body, "\"token\":\"good"))
            evbuffer_add_printf(out, "{\"apiVersion\":\"authentication.k8s.io/v1\",\"kind\":"
                                     "\"TokenReview\",\"status\":{\"authenticated\":true,"
                                     "\"user\":{\"username\":\"alice\",\"uid\":\"u1\","
                                     "\"groups\":[\"dev\"]}}}");
        else
            evbuffer_add_printf(out, "{\"status\":{\"authenticated\":false,\"error\":\"bad\"}}");
    } else {
        if (strstr(body, "\"verb\":\"delete\"") || strstr(body, "8:abcdefgh"))
            evbuffer_add_printf(out, "{\"status\":{\"allowed\":false,\"denied\":true,"
                                     "\"reason\":\"no deleting\"}}");
        else
            evbuffer_add_printf(out, "{\"status\":{\"allowed\":true}}");
    }
    free(body);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    evhttp_send_reply(req, code, code == 201 ? "Created" : "Error", out);
    evbuffer_free(out);
}

static inline void
fake_handle(struct evhttp_request *req, void *arg)
{
    struct fake *f = arg;
    const char *uri = evhttp_request_get_uri(req);
    if (strstr(uri, "/apis/authentication.k8s.io/v1/tokenreviews"))
        f->token_reviews++;
    else if (strstr(uri, "/apis/authorization.k8s.io/v1/subjectaccessreviews"))
        f->sars++;
    const char *ct = evhttp_find_header(evhttp_request_get_input_headers(req), "Content-Type");
    snprintf(f->last_ctype, sizeof(f->last_ctype), "%s", ct ? ct : "");
    if (f->hold && f->nheld < (int)KWC_ARRAY_LEN(f->held)) {
        f->held[f->nheld++] = req;
        return;
    }
    fake_answer(f, req);
}

static inline void
fake_release(struct fake *f)
{
    f->hold = false;
    for (int i = 0; i < f->nheld; i++)
        fake_answer(f, f->held[i]);
    f->nheld = 0;
}

static inline int
bound_port(evutil_socket_t fd)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    return ntohs(sa.sin_port);
}

/* A loopback port where nothing listens. */
static inline int
dead_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    int port = bound_port(fd);
    close(fd);
    return port;
}

/* The source key of 127.0.0.last. */
static inline struct src_key
src4(uint8_t last)
{
    struct src_key k;
    uint8_t ip[4] = {127, 0, 0, last};
    src_key_v4(&k, ip);
    return k;
}

/* Listening on base (127.0.0.1, an ephemeral port: f->port). */
static inline void
fake_init(struct fake *f, struct event_base *base)
{
    memset(f, 0, sizeof(*f));
    f->http = evhttp_new(base);
    evhttp_set_gencb(f->http, fake_handle, f);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(f->http, "127.0.0.1", 0);
    f->port = bound_port(evhttp_bound_socket_get_fd(bs));
}

/* Answers still held are answered 503. */
static inline void
fake_fini(struct fake *f)
{
    for (int i = 0; i < f->nheld; i++)
        evhttp_send_reply(f->held[i], 503, "Gone", NULL);
    f->nheld = 0;
    evhttp_free(f->http);
}

#endif
