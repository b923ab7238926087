/*
 * handover.c — the takeover's control socket (handover.h): the running
 * kwc's side on its event loop, the new kwc's side blocking before its
 * loop runs. Lines of text, bounded; the sockets ride on the last answer
 * as SCM_RIGHTS.
 */
#include "kwc/handover.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/log.h"

#define HELLO "KWC-TAKEOVER 1"
#define LINE_MAX_BYTES 128
#define ANSWER_MAX_BYTES 1024 /* an ERR line's message */
#define HELLO_TIMEOUT_S 10
/* the new kwc checks and opens the data dir meanwhile: a large one takes a while */
#define RELEASED_TIMEOUT_S 600

enum hstate { H_IDLE, H_HELLO, H_RELEASED, H_DONE };

struct handover {
    struct event_base *base;
    struct handover_hooks h;
    char *path;
    int lfd;
    struct event *accept_ev;
    int cfd; /* the takeover being talked (one at a time), or -1 */
    struct event *conn_ev;
    enum hstate state;
    char line[LINE_MAX_BYTES];
    size_t len;
};

static int
sock_path(const char *data_dir, struct sockaddr_un *sa, char *err, size_t errlen)
{
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    int n = snprintf(sa->sun_path, sizeof(sa->sun_path), "%s/%s", data_dir, HANDOVER_SOCKET);
    if (n < 0 || (size_t)n >= sizeof(sa->sun_path))
        return kwc_errf(err, errlen, KWC_ECONFIG,
                        "%s/%s: longer than a unix socket's path may be (%zu bytes): a shorter "
                        "--data-dir allows --takeover",
                        data_dir, HANDOVER_SOCKET, sizeof(sa->sun_path) - 1);
    return 0;
}

/* ---- the running kwc's side ---- */

static void
end_conn(struct handover *h, const char *why)
{
    if (h->cfd < 0)
        return;
    event_free(h->conn_ev);
    h->conn_ev = NULL;
    close(h->cfd);
    h->cfd = -1;
    h->len = 0;
    if (h->state == H_RELEASED) {
        log_warnx("kwc: the takeover did not complete (%s): resuming", why);
        h->h.thaw(h->h.arg);
    } else if (why && h->state == H_HELLO) {
        log_warnx("kwc: a takeover request: %s", why);
    }
    if (h->state != H_DONE)
        h->state = H_IDLE;
    if (h->state == H_IDLE)
        event_add(h->accept_ev, NULL);
}

static bool
say(struct handover *h, const char *text, const int *fds, size_t nfds)
{
    char body[ANSWER_MAX_BYTES];
    size_t n = strlen(text) < sizeof(body) ? strlen(text) : sizeof(body);
    memcpy(body, text, n);
    struct iovec iov = {.iov_base = body, .iov_len = n};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    char cbuf[CMSG_SPACE(sizeof(int) * HANDOVER_MAX_FDS)];
    if (nfds) {
        memset(cbuf, 0, sizeof(cbuf));
        m.msg_control = cbuf;
        m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        if (!c)
            return false;
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    /* a few bytes on a fresh unix socket: all of it, or the peer is gone */
    return sendmsg(h->cfd, &m, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)iov.iov_len;
}

static void
arm(struct handover *h, int seconds)
{
    struct timeval tv = {seconds, 0};
    event_add(h->conn_ev, &tv);
}

static void
on_line(struct handover *h, const char *line)
{
    if (h->state == H_HELLO) {
        if (strcmp(line, HELLO) != 0) {
            say(h, "ERR not a takeover request\n", NULL, 0);
            end_conn(h, "not a takeover request");
            return;
        }
        char err[512] = "";
        log_info("kwc: a new kwc asks to take over: stopping the caches and releasing the data "
                 "dir (serving goes on)");
        if (h->h.freeze(h->h.arg, err, sizeof(err)) != 0) {
            char msg[600];
            snprintf(msg, sizeof(msg), "ERR %s\n", err);
            say(h, msg, NULL, 0);
            end_conn(h, err);
            return;
        }
        h->state = H_RELEASED;
        char msg[64];
        snprintf(msg, sizeof(msg), "RELEASED %ld\n", (long)getpid());
        if (!say(h, msg, NULL, 0)) {
            end_conn(h, "the new kwc went away");
            return;
        }
        arm(h, RELEASED_TIMEOUT_S);
    } else if (h->state == H_RELEASED) {
        if (strcmp(line, "LISTENERS") != 0) {
            end_conn(h, "an unexpected request");
            return;
        }
        int fds[HANDOVER_MAX_FDS];
        size_t n = h->h.listen_fds(h->h.arg, fds, HANDOVER_MAX_FDS);
        char msg[64];
        snprintf(msg, sizeof(msg), "LISTENERS %zu\n", n);
        if (!say(h, msg, fds, n)) {
            end_conn(h, "the new kwc went away before it had the sockets");
            return;
        }
        h->state = H_DONE;
        log_info("kwc: %zu listening sockets handed over to the new kwc: draining", n);
        end_conn(h, NULL);
        h->h.handed(h->h.arg);
    }
}

static void
on_conn(evutil_socket_t fd, short what, void *arg)
{
    struct handover *h = arg;
    if (what & EV_TIMEOUT) {
        end_conn(h, "it timed out");
        return;
    }
    char buf[LINE_MAX_BYTES];
    ssize_t r = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (r <= 0) {
        end_conn(h, r == 0 ? "the new kwc closed the connection" : strerror(errno));
        return;
    }
    for (ssize_t i = 0; i < r && h->cfd >= 0; i++) {
        if (buf[i] != '\n') {
            if (h->len + 1 >= sizeof(h->line)) {
                end_conn(h, "a line too long");
                return;
            }
            h->line[h->len++] = buf[i];
            continue;
        }
        h->line[h->len] = '\0';
        h->len = 0;
        on_line(h, h->line);
    }
}

static void
on_accept(evutil_socket_t lfd, short what, void *arg)
{
    (void)what;
    struct handover *h = arg;
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
        return;
    if (h->cfd >= 0 || h->state == H_DONE) {
        close(fd); /* one takeover at a time, and one only */
        return;
    }
    /* the socket file is 0600 in a 0700 dir; the peer's uid says so again */
    struct ucred cred;
    socklen_t cl = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 ||
        (cred.uid != geteuid() && cred.uid != 0)) {
        log_warnx("kwc: a takeover request from uid %ld refused (only kwc's own user or root)",
                  (long)cred.uid);
        close(fd);
        return;
    }
    h->cfd = fd;
    h->state = H_HELLO;
    h->len = 0;
    h->conn_ev = event_new(h->base, fd, EV_READ | EV_PERSIST, on_conn, h);
    arm(h, HELLO_TIMEOUT_S);
    event_del(h->accept_ev);
}

int
handover_serve(struct event_base *base, const char *data_dir, const struct handover_hooks *hooks,
               struct handover **out, char *err, size_t errlen)
{
    struct sockaddr_un sa;
    int rc = sock_path(data_dir, &sa, err, errlen);
    if (rc)
        return rc;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return kwc_errf(err, errlen, -errno, "%s: %s", sa.sun_path, strerror(errno));
    unlink(sa.sun_path); /* a stale one, or the kwc this one took over from */
    mode_t old = umask(0177);
    int b = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    umask(old);
    if (b != 0 || listen(fd, 4) != 0) {
        int e = errno;
        close(fd);
        return kwc_errf(err, errlen, -e, "%s: cannot listen: %s", sa.sun_path, strerror(e));
    }
    struct handover *h = xcalloc(1, sizeof(*h));
    h->base = base;
    h->h = *hooks;
    h->path = xstrdup(sa.sun_path);
    h->lfd = fd;
    h->cfd = -1;
    h->accept_ev = event_new(base, fd, EV_READ | EV_PERSIST, on_accept, h);
    event_add(h->accept_ev, NULL);
    *out = h;
    return 0;
}

void
handover_free(struct handover *h)
{
    if (!h)
        return;
    if (h->cfd >= 0) {
        event_free(h->conn_ev);
        close(h->cfd);
    }
    event_free(h->accept_ev);
    close(h->lfd);
    /* the path is the new kwc's after a takeover */
    if (h->state != H_DONE)
        unlink(h->path);
    free(h->path);
    free(h);
}

/* ---- the new kwc's side ---- */

struct handover_client {
    int fd;
    int timeout_ms;
    char buf[ANSWER_MAX_BYTES];
    size_t len;
};

/* One line (without its newline) within the timeout; fds that came with it
 * into fds (up to max, *nfds of them; more are closed). */
static int
read_line(struct handover_client *c, char *line, size_t cap, int *fds, size_t max, size_t *nfds,
          char *err, size_t errlen)
{
    if (nfds)
        *nfds = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        char *nl = memchr(c->buf, '\n', c->len);
        if (nl) {
            size_t l = (size_t)(nl - c->buf);
            snprintf(line, cap, "%.*s", (int)l, c->buf);
            memmove(c->buf, nl + 1, c->len - l - 1);
            c->len -= l + 1;
            return 0;
        }
        if (c->len == sizeof(c->buf))
            return kwc_errf(err, errlen, KWC_ECONFIG,
                            "--takeover: the running kwc's answer is "
                            "not a line");
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        long left =
            c->timeout_ms - ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, (int)left) == 0)
            return kwc_errf(err, errlen, KWC_ECONFIG,
                            "--takeover: the running kwc did not answer within %d s",
                            c->timeout_ms / 1000);
        struct iovec iov = {.iov_base = c->buf + c->len, .iov_len = sizeof(c->buf) - c->len};
        char cbuf[CMSG_SPACE(sizeof(int) * HANDOVER_MAX_FDS)];
        struct msghdr m = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
        ssize_t r = recvmsg(c->fd, &m, MSG_CMSG_CLOEXEC);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return kwc_errf(err, errlen, KWC_ECONFIG,
                            "--takeover: the running kwc closed the connection%s%s",
                            r < 0 ? ": " : "", r < 0 ? strerror(errno) : "");
        for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h)) {
            if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
                continue;
            size_t k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            int got[HANDOVER_MAX_FDS];
            memcpy(got, CMSG_DATA(h), k * sizeof(int));
            for (size_t i = 0; i < k; i++) {
                if (nfds && *nfds < max)
                    fds[(*nfds)++] = got[i];
                else
                    close(got[i]);
            }
        }
        c->len += (size_t)r;
    }
}

static int
send_line(struct handover_client *c, const char *s, char *err, size_t errlen)
{
    size_t n = strlen(s);
    if (send(c->fd, s, n, MSG_NOSIGNAL) != (ssize_t)n)
        return kwc_errf(err, errlen, KWC_ECONFIG, "--takeover: cannot talk to the running kwc: %s",
                        strerror(errno));
    return 0;
}

int
handover_request(const char *data_dir, int timeout_ms, struct handover_client **out, char *err,
                 size_t errlen)
{
    struct sockaddr_un sa;
    int rc = sock_path(data_dir, &sa, err, errlen);
    if (rc)
        return rc;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return kwc_errf(err, errlen, KWC_ECONFIG,
                        "--takeover: no running kwc to take over on data dir %s (%s: %s); start "
                        "without --takeover",
                        data_dir, sa.sun_path, strerror(e));
    }
    struct handover_client *c = xcalloc(1, sizeof(*c));
    c->fd = fd;
    c->timeout_ms = timeout_ms;
    char line[ANSWER_MAX_BYTES];
    if ((rc = send_line(c, HELLO "\n", err, errlen)) != 0 ||
        (rc = read_line(c, line, sizeof(line), NULL, 0, NULL, err, errlen)) != 0) {
        handover_client_free(c);
        return rc;
    }
    if (strncmp(line, "RELEASED ", 9) != 0) {
        handover_client_free(c);
        return kwc_errf(err, errlen, KWC_ECONFIG, "--takeover: the running kwc refused: %s",
                        strncmp(line, "ERR ", 4) == 0 ? line + 4 : line);
    }
    log_info("kwc: taking over from pid %s: it released data dir %s", line + 9, data_dir);
    *out = c;
    return 0;
}

int
handover_take_listeners(struct handover_client *c, int *fds, size_t max, size_t *n, char *err,
                        size_t errlen)
{
    char line[ANSWER_MAX_BYTES];
    int rc = send_line(c, "LISTENERS\n", err, errlen);
    if (rc == 0)
        rc = read_line(c, line, sizeof(line), fds, max, n, err, errlen);
    if (rc)
        return rc;
    unsigned long want;
    if (sscanf(line, "LISTENERS %lu", &want) != 1 || want != *n) {
        for (size_t i = 0; i < *n; i++)
            close(fds[i]);
        *n = 0;
        return kwc_errf(err, errlen, KWC_ECONFIG,
                        "--takeover: the running kwc's sockets did not come (%s)", line);
    }
    return 0;
}

void
handover_client_free(struct handover_client *c)
{
    if (!c)
        return;
    close(c->fd);
    free(c);
}

/* ---- the sockets to the new kwc's addresses ---- */

static bool
same_addr(const struct sockaddr_storage *got, const struct http_listen_addr *a)
{
    if (got->ss_family != a->ss.ss_family)
        return false;
    if (got->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)got, *y = (const void *)&a->ss;
        return x->sin_addr.s_addr == y->sin_addr.s_addr &&
               (y->sin_port == 0 || x->sin_port == y->sin_port);
    }
    const struct sockaddr_in6 *x = (const void *)got, *y = (const void *)&a->ss;
    return memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr)) == 0 &&
           (y->sin6_port == 0 || x->sin6_port == y->sin6_port);
}

void
handover_match(const struct http_listen_addr *addrs, size_t naddrs, int *got, size_t ngot, int *out)
{
    for (size_t i = 0; i < naddrs; i++) {
        out[i] = -1;
        for (size_t j = 0; j < ngot; j++) {
            struct sockaddr_storage ss;
            socklen_t l = sizeof(ss);
            if (got[j] >= 0 && getsockname(got[j], (struct sockaddr *)&ss, &l) == 0 &&
                same_addr(&ss, &addrs[i])) {
                out[i] = got[j];
                got[j] = -1;
                break;
            }
        }
        if (out[i] < 0)
            log_warnx("kwc: --takeover: the running kwc did not listen on --listen's address %zu; "
                      "binding it anew",
                      i + 1);
    }
    for (size_t j = 0; j < ngot; j++)
        if (got[j] >= 0) {
            log_warnx("kwc: --takeover: the running kwc listened on an address --listen does not "
                      "name: closed (its clients are refused from now on)");
            close(got[j]);
        }
}
