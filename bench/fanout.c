/*
 * fanout.c — watch fan-out load generator (libevent). Opens N watch streams
 * to a server (kwc or apisim), and for every event that arrives finds the
 * annotation apisim stamps on each write (apisim.kwc.dev/written-at, wall
 * clock ns) and records now - stamp: the write-to-receipt latency. Prints one
 * line of JSON: streams connected, deliveries, deliveries/s, latency
 * p50/p99/max in ms, over the measuring window.
 *
 *   fanout --port P --path '/api/v1/pods?watch=1&resourceVersion=N'
 *          --watchers N [--nodes K] [--warmup S] [--seconds S] [--idle]
 *
 * --nodes K: stream i adds fieldSelector=spec.nodeName=node-(i % K) (the
 * kubelet pattern). --idle: connect, wait for every response head, report
 * and exit (memory per idle watcher is measured by the caller).
 */
#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static const char MARK[] = "\"apisim.kwc.dev/written-at\":\"";

struct conn {
    struct bufferevent *bev;
    bool head;
};

static struct event_base *base;
static int port, nw, nodes, opened, heads, seconds = 10, warmup = 2;
static bool idle;
static const char *path;
static struct conn *conns;
static uint64_t t_measure, t_end, deliveries;
static double *lat;
static size_t nlat, caplat;

static uint64_t
wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void
record(uint64_t stamp)
{
    uint64_t now = wall_ns();
    if (now < t_measure || now > t_end)
        return;
    deliveries++;
    if (nlat == caplat) {
        caplat = caplat ? caplat * 2 : 1 << 20;
        lat = realloc(lat, caplat * sizeof(*lat));
    }
    lat[nlat++] = now > stamp ? (double)(now - stamp) / 1e6 : 0;
}

static void
on_read(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    if (!c->head) {
        struct evbuffer_ptr p = evbuffer_search(in, "\r\n\r\n", 4, NULL);
        if (p.pos < 0)
            return;
        evbuffer_drain(in, (size_t)p.pos + 4);
        c->head = true;
        heads++;
    }
    for (;;) {
        struct evbuffer_ptr p = evbuffer_search(in, MARK, sizeof(MARK) - 1, NULL);
        if (p.pos < 0) {
            size_t len = evbuffer_get_length(in);
            if (len > 64)
                evbuffer_drain(in, len - 64);
            return;
        }
        size_t at = (size_t)p.pos + sizeof(MARK) - 1;
        char num[24];
        if (evbuffer_get_length(in) < at + sizeof(num))
            return; /* the number may be incomplete */
        evbuffer_drain(in, at);
        evbuffer_copyout(in, num, sizeof(num) - 1);
        num[sizeof(num) - 1] = '\0';
        record(strtoull(num, NULL, 10));
        evbuffer_drain(in, 1);
    }
}

static void
on_event(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    (void)arg;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        fprintf(stderr, "fanout: a stream ended (%s)\n", what & BEV_EVENT_EOF ? "eof" : "error");
        exit(1);
    }
}

static void open_some(evutil_socket_t fd, short what, void *arg);

static void
open_some(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct event *self = arg;
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    for (int k = 0; k < 200 && opened < nw; k++, opened++) {
        struct conn *c = &conns[opened];
        c->bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
        bufferevent_setcb(c->bev, on_read, NULL, on_event, c);
        bufferevent_enable(c->bev, EV_READ);
        if (bufferevent_socket_connect(c->bev, (struct sockaddr *)&sin, sizeof(sin)) != 0) {
            fprintf(stderr, "fanout: connect failed at stream %d\n", opened);
            exit(1);
        }
        char sel[64] = "";
        if (nodes)
            snprintf(sel, sizeof sel, "&fieldSelector=spec.nodeName%%3Dnode-%d", opened % nodes);
        evbuffer_add_printf(bufferevent_get_output(c->bev), "GET %s%s HTTP/1.1\r\nHost: x\r\n\r\n", path,
                            sel);
    }
    if (opened < nw) {
        struct timeval tv = {0, 2000};
        evtimer_add(self, &tv);
    }
}

static int
cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void
on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct event *self = arg;
    uint64_t now = wall_ns();
    if (idle && heads == nw) {
        printf("{\"streams\":%d}\n", heads);
        fflush(stdout);
        event_base_loopbreak(base);
        return;
    }
    if (!idle && heads == nw && !t_measure) {
        t_measure = now + (uint64_t)warmup * 1000000000ull;
        t_end = t_measure + (uint64_t)seconds * 1000000000ull;
    }
    if (t_end && now > t_end + 500000000ull) {
        qsort(lat, nlat, sizeof(*lat), cmp);
        double p50 = nlat ? lat[nlat / 2] : 0, p99 = nlat ? lat[(size_t)(nlat * 0.99)] : 0;
        double mx = nlat ? lat[nlat - 1] : 0;
        printf("{\"streams\":%d,\"deliveries\":%llu,\"per_s\":%.0f,\"p50_ms\":%.2f,\"p99_ms\":%.2f,"
               "\"max_ms\":%.2f}\n",
               heads, (unsigned long long)deliveries, (double)deliveries / seconds, p50, p99, mx);
        fflush(stdout);
        event_base_loopbreak(base);
        return;
    }
    struct timeval tv = {0, 100000};
    evtimer_add(self, &tv);
}

int
main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--idle")) {
            idle = true;
            continue;
        }
        if (!v)
            goto usage;
        i++;
        if (!strcmp(a, "--port"))
            port = atoi(v);
        else if (!strcmp(a, "--path"))
            path = v;
        else if (!strcmp(a, "--watchers"))
            nw = atoi(v);
        else if (!strcmp(a, "--nodes"))
            nodes = atoi(v);
        else if (!strcmp(a, "--seconds"))
            seconds = atoi(v);
        else if (!strcmp(a, "--warmup"))
            warmup = atoi(v);
        else
            goto usage;
    }
    if (!port || !path || nw <= 0)
        goto usage;
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    if ((rlim_t)nw + 16 > rl.rlim_cur) {
        fprintf(stderr, "fanout: %d streams need more than the %llu open files allowed\n", nw,
                (unsigned long long)rl.rlim_cur);
        return 2;
    }
    base = event_base_new();
    conns = calloc((size_t)nw, sizeof(*conns));
    struct event *opener = evtimer_new(base, open_some, event_self_cbarg());
    event_active(opener, EV_TIMEOUT, 1);
    struct event *tick = evtimer_new(base, on_tick, event_self_cbarg());
    struct timeval tv = {0, 100000};
    evtimer_add(tick, &tv);
    event_base_dispatch(base);
    return 0;
usage:
    fprintf(stderr, "usage: fanout --port P --path PATH --watchers N [--nodes K] [--seconds S] "
                    "[--warmup S] [--idle]\n");
    return 2;
}
