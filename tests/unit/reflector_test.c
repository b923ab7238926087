/*
 * reflector_test.c — proxy/upstream/reflector*.c and ingest.c: one reflector
 * against a fake upstream, with its clock and random source injected
 * (struct refl_clock), and the retry policy it applies (refl_backoff,
 * refl_watch_healthy, refl_stale).
 *
 * The fake upstream is a tiny HTTP/1.1 server on a loopback ephemeral port,
 * on the test's own libevent loop; the real up_client (libcurl) talks to it.
 * It answers discovery (/api/v1), LISTs with the body or status the test
 * sets, and WATCHes with a chunked stream the test writes frames into, ends
 * cleanly, or cuts (mid-frame, or without its last chunk). What lands in the
 * store is read back through include/kwc/store.h (LMDB in a fresh /tmp dir
 * per test), and the reflector's counters through refl_counters.
 *
 * Waiting is running the loop until a condition holds, bounded by a guard
 * timer that only fires when the reflector never acts. Never a sleep. Time
 * as the reflector sees it is the test's: it moves only when the test moves
 * it, so that the 10 s of a healthy watch and --max-staleness pass at once;
 * the libevent timers of its retries run on the real clock, and the random
 * source is pinned so that their delays are known (the least, 250 ms, in
 * every wait below).
 */
#include "kwc/reflector.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "kwc/base.h"
#include "kwc/kubeconfig.h"
#include "kwc/log.h"
#include "kwc/store.h"
#include "kwc/upstream.h"
#include "lmdbdir.h"
#include "tap.h"

#define GUARD_S 15 /* bound on any wait; never reached when all is well */
#define MAX_REQS 64

/* ---- the fake upstream ---- */

struct fake;

struct fconn {
    struct fake *f;
    struct bufferevent *bev;
    char head[4096];
    size_t hl;
    bool answered, closing;
    struct fconn *next;
};

struct fake {
    struct event_base *base;
    struct evconnlistener *lis;
    int port;
    char targets[MAX_REQS][512]; /* every request's target, in order */
    int nreq;
    int list_status; /* 200: list_body; else that status with a Status */
    char *list_body;
    int watch_status;    /* 200: a stream; else that status with a Status, once */
    struct fconn *watch; /* the open watch stream */
    int nwatch;          /* watch streams opened */
    uint64_t cur_rv;     /* the newest rv it sent (a list, an event, a bookmark) */
    uint64_t probe_rv;   /* a LIST limit=1 answers at this rv; 0: cur_rv */
    int nprobe;          /* LIST limit=1 answered */
    char *ns_uid;        /* GET of the kube-system namespace: its uid; NULL: 403 */
    int nid;             /* ...asked */
    struct fconn *conns;
};

static void
fconn_free(struct fconn *c)
{
    struct fake *f = c->f;
    for (struct fconn **p = &f->conns; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    if (f->watch == c)
        f->watch = NULL;
    bufferevent_free(c->bev);
    free(c);
}

/* Close once what was written has left (at once when nothing is pending). */
static void
fconn_close(struct fconn *c)
{
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        fconn_free(c);
    else
        c->closing = true;
}

static void fconn_printf(struct fconn *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
fconn_printf(struct fconn *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    evbuffer_add_vprintf(bufferevent_get_output(c->bev), fmt, ap);
    va_end(ap);
}

static void
answer(struct fconn *c, int status, const char *body)
{
    fconn_printf(c,
                 "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                 "Connection: close\r\n\r\n%s",
                 status, strlen(body), body);
    fconn_close(c);
}

static void
answer_status(struct fconn *c, int status)
{
    char body[256];
    snprintf(body, sizeof(body),
             "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"status\":\"Failure\",\"message\":"
             "\"fake\",\"reason\":\"%s\",\"code\":%d}",
             status == 410 ? "Expired" : "InternalError", status);
    answer(c, status, body);
}

static void
on_request(struct fconn *c, const char *target)
{
    struct fake *f = c->f;
    if (f->nreq < MAX_REQS)
        snprintf(f->targets[f->nreq++], sizeof(f->targets[0]), "%s", target);
    if (strcmp(target, "/api/v1") == 0) {
        answer(c, 200,
               "{\"kind\":\"APIResourceList\",\"groupVersion\":\"v1\",\"resources\":["
               "{\"name\":\"pods\",\"namespaced\":true,\"kind\":\"Pod\",\"verbs\":[\"list\"]},"
               "{\"name\":\"pods/log\",\"namespaced\":true,\"kind\":\"Pod\",\"verbs\":[]}]}");
    } else if (strstr(target, "watch=true")) {
        if (f->watch_status != 200) { /* once */
            answer_status(c, f->watch_status);
            f->watch_status = 200;
            return;
        }
        fconn_printf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
        f->watch = c;
        f->nwatch++;
    } else if (strcmp(target, "/api/v1/pods?limit=1") == 0) {
        /* the probe before a watch resumes: the current rv */
        char body[256];
        snprintf(body, sizeof(body),
                 "{\"kind\":\"PodList\",\"apiVersion\":\"v1\",\"metadata\":{"
                 "\"resourceVersion\":\"%llu\"},\"items\":[]}",
                 (unsigned long long)(f->probe_rv ? f->probe_rv : f->cur_rv));
        f->nprobe++;
        answer(c, 200, body);
    } else if (strcmp(target, "/api/v1/namespaces?fieldSelector=metadata.name%3Dkube-system") ==
               0) {
        f->nid++;
        if (!f->ns_uid) {
            answer_status(c, 403);
        } else {
            char body[256];
            snprintf(body, sizeof(body),
                     "{\"kind\":\"NamespaceList\",\"apiVersion\":\"v1\",\"metadata\":{},"
                     "\"items\":[{\"metadata\":{\"name\":\"kube-system\",\"uid\":\"%s\"}}]}",
                     f->ns_uid);
            answer(c, 200, body);
        }
    } else if (strncmp(target, "/api/v1/pods?limit=500", 22) == 0) {
        if (f->list_status != 200)
            answer_status(c, f->list_status);
        else
            answer(c, 200, f->list_body);
    } else {
        answer_status(c, 404);
    }
}

static void
on_fconn_read(struct bufferevent *bev, void *arg)
{
    struct fconn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t n = evbuffer_get_length(in);
    if (c->answered || c->hl + n >= sizeof(c->head)) {
        evbuffer_drain(in, n);
        return;
    }
    evbuffer_remove(in, c->head + c->hl, n);
    c->hl += n;
    c->head[c->hl] = '\0';
    if (!strstr(c->head, "\r\n\r\n"))
        return;
    c->answered = true;
    char method[16], target[512];
    if (sscanf(c->head, "%15s %511s", method, target) != 2)
        snprintf(target, sizeof(target), "?");
    on_request(c, target);
}

static void
on_fconn_write(struct bufferevent *bev, void *arg)
{
    struct fconn *c = arg;
    if (c->closing)
        fconn_free(c);
}

static void
on_fconn_event(struct bufferevent *bev, short what, void *arg)
{
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        fconn_free(arg);
}

static void
on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len, void *arg)
{
    struct fake *f = arg;
    struct fconn *c = xcalloc(1, sizeof(*c));
    c->f = f;
    c->bev = bufferevent_socket_new(f->base, fd, BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(c->bev, on_fconn_read, on_fconn_write, on_fconn_event, c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    c->next = f->conns;
    f->conns = c;
}

/* One watch frame (a JSON line) in a chunk of its own. */
static void
watch_frame(struct fake *f, const char *line)
{
    if (f->watch)
        fconn_printf(f->watch, "%zx\r\n%s\r\n", strlen(line), line);
}

/* The clean end of the stream (the last chunk), then close. */
static void
watch_end(struct fake *f)
{
    if (!f->watch)
        return;
    fconn_printf(f->watch, "0\r\n\r\n");
    struct fconn *c = f->watch;
    f->watch = NULL;
    fconn_close(c);
}

/* Close the stream without its last chunk (a dropped connection). */
static void
watch_cut(struct fake *f)
{
    struct fconn *c = f->watch;
    f->watch = NULL;
    if (c)
        fconn_close(c);
}

/* ---- objects ---- */

/* A pod as a list item (typed: as a watch event's object, with TypeMeta). */
static char *
pod(const char *name, uint64_t rv, const char *grp, bool typed)
{
    return xasprintf("{%s\"metadata\":{\"name\":\"%s\",\"namespace\":\"default\","
                     "\"resourceVersion\":\"%llu\",\"labels\":{\"grp\":\"%s\"}},"
                     "\"spec\":{\"nodeName\":\"n1\"}}",
                     typed ? "\"kind\":\"Pod\",\"apiVersion\":\"v1\"," : "", name,
                     (unsigned long long)rv, grp);
}

static void
set_list(struct fake *f, uint64_t rv, const char *const *names, const uint64_t *rvs, size_t n)
{
    free(f->list_body);
    if (rv > f->cur_rv)
        f->cur_rv = rv;
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b,
                        "{\"kind\":\"PodList\",\"apiVersion\":\"v1\",\"metadata\":{"
                        "\"resourceVersion\":\"%llu\"},\"items\":[",
                        (unsigned long long)rv);
    for (size_t i = 0; i < n; i++) {
        char *p = pod(names[i], rvs[i], "x", false);
        evbuffer_add_printf(b, "%s%s", i ? "," : "", p);
        free(p);
    }
    evbuffer_add_printf(b, "]}");
    size_t len = evbuffer_get_length(b);
    f->list_body = xmalloc(len + 1);
    evbuffer_remove(b, f->list_body, len);
    f->list_body[len] = '\0';
    evbuffer_free(b);
}

static void
send_event(struct fake *f, const char *type, const char *name, uint64_t rv)
{
    char *p = pod(name, rv, "x", true);
    char *line = xasprintf("{\"type\":\"%s\",\"object\":%s}\n", type, p);
    if (rv > f->cur_rv)
        f->cur_rv = rv;
    watch_frame(f, line);
    free(line);
    free(p);
}

static void
send_bookmark(struct fake *f, uint64_t rv)
{
    char *line = xasprintf("{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"Pod\",\"apiVersion\":"
                           "\"v1\",\"metadata\":{\"resourceVersion\":\"%llu\"}}}\n",
                           (unsigned long long)rv);
    if (rv > f->cur_rv)
        f->cur_rv = rv;
    watch_frame(f, line);
    free(line);
}

static void
send_error(struct fake *f, int code)
{
    char *line = xasprintf("{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"apiVersion\":"
                           "\"v1\",\"status\":\"Failure\",\"message\":\"fake\",\"reason\":\"%s\","
                           "\"code\":%d}}\n",
                           code == 410 ? "Expired" : "InternalError", code);
    watch_frame(f, line);
    free(line);
}

/* ---- the environment of one test ---- */

struct env {
    struct event_base *base;
    struct fake f;
    char dir[64];
    struct store *st;
    struct kcfg *k;
    struct up_client *up;
    struct refl_ingest *ing;
    struct refl *r;
    struct event *guard;
    bool timed_out;
    uint64_t now;   /* the reflector's clock (ms) */
    uint32_t rnd;   /* its random source */
    unsigned nrand; /* calls of it */
};

static uint64_t
fake_now(void *arg)
{
    return ((struct env *)arg)->now;
}

static uint32_t
fake_rand(void *arg)
{
    struct env *e = arg;
    e->nrand++;
    return e->rnd;
}

static void
on_guard(evutil_socket_t fd, short what, void *arg)
{
    ((struct env *)arg)->timed_out = true;
}

static int
bound_port(evutil_socket_t fd)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    return ntohs(sa.sin_port);
}

/* A reflector of v1/pods (not started) against the fake upstream, which
 * lists a (rv 3), b (rv 7) and c (rv 9) at rv 10. */
static void
env_init(struct env *e, uint64_t max_staleness_ms)
{
    memset(e, 0, sizeof(*e));
    e->now = 1000000;
    e->base = event_base_new();
    e->f.base = e->base;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    e->f.lis = evconnlistener_new_bind(e->base, on_accept, &e->f,
                                       LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, -1,
                                       (struct sockaddr *)&sa, sizeof(sa));
    if (!e->f.lis)
        abort();
    e->f.port = bound_port(evconnlistener_get_fd(e->f.lis));
    e->f.list_status = 200;
    e->f.watch_status = 200;
    static const char *const names[] = {"a", "b", "c"};
    static const uint64_t rvs[] = {3, 7, 9};
    set_list(&e->f, 10, names, rvs, 3);

    lmdbdir_make(e->dir, sizeof(e->dir), "refl");
    struct store_options so;
    store_options_default(&so);
    so.map_size = 64 << 20;
    if (store_open(e->dir, &so, &e->st) != 0)
        abort();
    e->k = xcalloc(1, sizeof(*e->k));
    e->k->server = xasprintf("http://127.0.0.1:%d", e->f.port);
    struct up_options uo = {
        .connect_timeout_ms = 5000, .header_timeout_ms = 10000, .max_idle_conns = 8};
    char err[256];
    if (up_client_new(e->base, e->k, &uo, &e->up, err, sizeof(err)) != 0) {
        printf("# up_client_new: %s\n", err);
        abort();
    }
    struct refl_ingest_options io = {.data_dir = e->dir,
                                     .map_size = so.map_size,
                                     .max_staleness_ms = max_staleness_ms,
                                     .clock = {.now_ms = fake_now, .rand = fake_rand, .arg = e}};
    refl_ingest_new(e->base, e->st, &io, &e->ing);
    if (refl_new(e->base, e->up, e->ing, "v1/pods", KWC_ENC_JSON, "fake-upstream", &e->r, err,
                 sizeof(err)) != 0) {
        printf("# refl_new: %s\n", err);
        abort();
    }
    e->guard = evtimer_new(e->base, on_guard, e);
}

static void
env_fini(struct env *e)
{
    refl_free(e->r);
    refl_ingest_free(e->ing);
    up_client_free(e->up);
    kcfg_free(e->k);
    while (e->f.conns)
        fconn_free(e->f.conns);
    evconnlistener_free(e->f.lis);
    free(e->f.list_body);
    free(e->f.ns_uid);
    event_free(e->guard);
    store_close(e->st);
    event_base_free(e->base);
    lmdbdir_rm(e->dir);
}

static void
guard_start(struct env *e)
{
    struct timeval tv = {GUARD_S, 0};
    e->timed_out = false;
    evtimer_add(e->guard, &tv);
}

static void
guard_stop(struct env *e, const char *what)
{
    evtimer_del(e->guard);
    if (e->timed_out)
        printf("# timed out waiting for %s\n", what);
}

/* Run the loop until cond holds (or the guard fires: the check after fails). */
#define RUN_UNTIL(e, cond)                                                                         \
    do {                                                                                           \
        guard_start(e);                                                                            \
        while (!(cond) && !(e)->timed_out)                                                         \
            event_base_loop((e)->base, EVLOOP_ONCE);                                               \
        guard_stop((e), #cond);                                                                    \
    } while (0)

static struct refl_counters
ctr(const struct env *e)
{
    struct refl_counters c;
    refl_counters(e->r, &c);
    return c;
}

static uint64_t
store_rv(const struct env *e)
{
    return store_res_rv(e->st, refl_desc(e->r)->sres, NULL);
}

/* The stored object under key ("default/a"): its rv and bytes into raw
 * (NUL-terminated), or -1 when there is none. */
static long long
stored(const struct env *e, const char *key, char *raw, size_t rawlen)
{
    struct store_rtxn *t;
    if (store_rtxn_begin(e->st, &t) != 0)
        return -2;
    struct store_obj o;
    long long rv = -1;
    if (store_get(t, refl_desc(e->r)->sres, key, strlen(key), &o) == 0) {
        rv = (long long)o.rv;
        if (raw)
            snprintf(raw, rawlen, "%.*s", (int)o.raw_len, (const char *)o.raw);
    }
    store_rtxn_end(t);
    return rv;
}

static struct store_res_info
info(const struct env *e)
{
    struct store_res_info in = {0};
    struct store_rtxn *t;
    if (store_rtxn_begin(e->st, &t) == 0) {
        store_info(t, refl_desc(e->r)->sres, &in);
        store_rtxn_end(t);
    }
    return in;
}

/* History after rv as "TYPE key@rv" lines. */
struct hist_buf {
    char s[2048];
    size_t n;
};

static int
on_hist(void *arg, const struct store_hist *h)
{
    struct hist_buf *b = arg;
    static const char *const names[] = {"?", "ADDED", "MODIFIED", "DELETED"};
    int w = snprintf(b->s + b->n, sizeof(b->s) - b->n, "%s %.*s@%llu\n", names[h->type],
                     (int)h->obj.key_len, h->obj.key, (unsigned long long)h->rv);
    if (w > 0 && (size_t)w < sizeof(b->s) - b->n)
        b->n += (size_t)w;
    return 0;
}

static void
history(const struct env *e, uint64_t after, struct hist_buf *b)
{
    memset(b, 0, sizeof(*b));
    struct store_rtxn *t;
    if (store_rtxn_begin(e->st, &t) == 0) {
        store_history(t, refl_desc(e->r)->sres, after, on_hist, b);
        store_rtxn_end(t);
    }
}

static const char *
last_target(const struct env *e)
{
    return e->f.nreq ? e->f.targets[e->f.nreq - 1] : "";
}

/* Run until the reflector has read the open watch's head: a bookmark at rv
 * reached the store. */
static void
watch_read(struct env *e, uint64_t rv)
{
    send_bookmark(&e->f, rv);
    RUN_UNTIL(e, store_rv(e) >= rv);
}

/* Start the reflector and run until its first watch is open. */
static void
env_sync(struct env *e)
{
    refl_start(e->r);
    RUN_UNTIL(e, e->f.nwatch >= 1 && e->f.watch);
    ok(refl_synced(e->r) && e->f.watch, "synced, watching");
}

/* ---- the retry policy, pure ---- */

static void
test_policy(void)
{
    /* growth: from the least (500 ms), doubling, capped at 30 s; with the
     * least jitter each delay is half the base, with the most 1.5 times */
    static const int base[] = {500, 1000, 2000, 4000, 8000, 16000, 30000, 30000};
    int b_lo = 0, b_hi = 0;
    bool lo_ok = true, hi_ok = true;
    for (size_t i = 0; i < KWC_ARRAY_LEN(base); i++) {
        int want_hi = base[i] + base[i] / 2 > 30000 ? 30000 : base[i] + base[i] / 2;
        lo_ok = lo_ok && refl_backoff(&b_lo, 0) == base[i] / 2;
        hi_ok = hi_ok && refl_backoff(&b_hi, (uint32_t)base[i]) == want_hi;
    }
    ok(lo_ok, "the least jitter: 250 ms, 500 ms, 1 s, ... 15 s: half of each base");
    ok(hi_ok, "the most: 750 ms, 1.5 s, ... and never past 30 s");
    is_int(b_lo, 30000, "the base stops at 30 s");

    /* bounds for any random number */
    uint32_t x = 12345;
    bool in = true, cap = true;
    for (int run = 0; run < 50; run++) {
        int b = 0;
        for (int i = 0; i < 10; i++) {
            int cur = b ? b : 500;
            x = x * 1103515245u + 12345u;
            int d = refl_backoff(&b, x);
            in = in && d >= cur / 2 && d <= cur + cur / 2;
            cap = cap && d <= 30000;
        }
    }
    ok(in, "every delay within [base/2, 3*base/2]");
    ok(cap, "no delay past 30 s, jitter included");
    int b = 0;
    is_int(refl_backoff(&b, 0xffffffffu), 250 + (int)(0xffffffffu % 501),
           "the jitter is the "
           "random number mod "
           "base+1");

    /* a watch is healthy after 10 s, not before */
    ok(!refl_watch_healthy(1000, 1000), "just opened: not healthy");
    ok(!refl_watch_healthy(1000, 10999), "9.999 s: not yet");
    ok(refl_watch_healthy(1000, 11000), "10 s: healthy");
    ok(!refl_watch_healthy(11000, 1000), "a clock behind the open: not healthy");

    /* staleness: more than max seconds without an event or bookmark */
    ok(!refl_stale(1000, 6000, 5000), "exactly --max-staleness: not stale");
    ok(refl_stale(1000, 6001, 5000), "past it: stale");
    ok(!refl_stale(1000, 1000 + 86400000, 0), "--max-staleness 0: never stale");
    ok(!refl_stale(6001, 1000, 5000), "a clock behind the last event: not stale");
    /* milliseconds, as --max-staleness 1500ms gives them (not seconds) */
    ok(refl_stale(1000, 2501, 1500), "1500ms: stale past 1.5 s");
    ok(!refl_stale(1000, 2500, 1500), "1500ms: not at 1.5 s");
}

/* ---- against the fake upstream ---- */

static void
test_list_then_watch(void)
{
    struct env e;
    env_init(&e, 0);
    e.rnd = 7;
    env_sync(&e);
    is_int(e.f.nreq, 3, "three requests: discovery, LIST, WATCH");
    is_str(e.f.targets[0], "/api/v1", "discovery of the group version");
    is_str(e.f.targets[1], "/api/v1/pods?limit=500", "a LIST in pages of 500");
    is_str(e.f.targets[2],
           "/api/v1/pods?allowWatchBookmarks=true&resourceVersion=10&timeoutSeconds=307&watch=true",
           "a WATCH from the list's rv, its timeout 300 s + the random source's number mod 300");
    ok(refl_serving(e.r), "in service");
    struct store_res_info in = info(&e);
    is_int(in.objects, 3, "the list's three objects stored");
    is_int(in.rv, 10, "at the list's rv");
    ok(in.synced, "recorded as synced");
    is_str(in.list_kind, "PodList", "with the kind discovery gave");
    char raw[512], *want = pod("b", 7, "x", false);
    is_int(stored(&e, "default/b", raw, sizeof(raw)), 7, "b at its rv");
    is_str(raw, want, "as the list item's bytes");
    free(want);

    send_event(&e.f, "ADDED", "d", 11);
    send_event(&e.f, "MODIFIED", "a", 12);
    send_event(&e.f, "DELETED", "b", 13);
    send_bookmark(&e.f, 15);
    RUN_UNTIL(&e, store_rv(&e) >= 15);
    is_int(store_rv(&e), 15, "the bookmark's rv reached the store");
    want = pod("d", 11, "x", false);
    is_int(stored(&e, "default/d", raw, sizeof(raw)), 11, "the ADDED object stored");
    is_str(raw, want, "in its list-item form: the watch's TypeMeta cut");
    free(want);
    is_int(stored(&e, "default/a", NULL, 0), 12, "the MODIFIED object at its new rv");
    is_int(stored(&e, "default/b", NULL, 0), -1, "the DELETED object gone");
    struct hist_buf h;
    history(&e, 10, &h);
    is_str(h.s, "ADDED default/d@11\nMODIFIED default/a@12\nDELETED default/b@13\n",
           "the events in history, in order");
    struct refl_counters c = ctr(&e);
    is_int(c.events_in, 3, "three events in (the bookmark is none)");
    is_int(c.lists, 1, "one LIST");
    is_int(c.relists, 0, "no relist");
    is_int(c.watches, 1, "one WATCH");
    is_int(c.errors[0] + c.errors[1] + c.errors[2], 0, "no error");
    char st[512];
    refl_status(e.r, st, sizeof(st));
    ok(strstr(st, "/api/v1/pods: synced, watching, rv 15, 3 events in") != NULL,
       "refl_status says synced, watching, rv 15, 3 events");

    /* a clean end (the watch's timeout): watched again at once, from rv 15 */
    watch_end(&e.f);
    RUN_UNTIL(&e, e.f.nwatch >= 2 && e.f.watch);
    ok(strstr(last_target(&e), "resourceVersion=15&") != NULL, "re-watched from the last rv");
    c = ctr(&e);
    is_int(c.watch_restarts, 1, "one watch restart");
    is_int(c.errors[2], 0, "a clean end is no error");
    is_int(c.retry_ms, 0, "and no retry delay");
    env_fini(&e);
}

static void
test_watch_410_relists(void)
{
    struct env e;
    env_init(&e, 0);
    env_sync(&e);
    /* the upstream moved on and compacted: a (3) unchanged, b modified at
     * 15, d created at 12, c deleted; the list is at 20 */
    static const char *const names[] = {"a", "b", "d"};
    static const uint64_t rvs[] = {3, 15, 12};
    set_list(&e.f, 20, names, rvs, 3);
    e.f.watch_status = 410;
    watch_end(&e.f);
    RUN_UNTIL(&e, ctr(&e).lists >= 2 && e.f.nwatch >= 2 && e.f.watch);
    struct refl_counters c = ctr(&e);
    is_int(c.expired, 1, "the 410 counted");
    is_int(c.lists, 2, "a second LIST");
    is_int(c.relists, 1, "...a relist");
    ok(refl_synced(e.r) && refl_serving(e.r), "in service all along");
    is_int(store_rv(&e), 20, "at the new list's rv");
    struct hist_buf h;
    history(&e, 10, &h);
    is_str(h.s, "ADDED default/d@12\nMODIFIED default/b@15\nDELETED default/c@20\n",
           "the difference recorded as events in rv order, the deletion at a free rv");
    is_int(stored(&e, "default/c", NULL, 0), -1, "c gone");
    is_int(stored(&e, "default/b", NULL, 0), 15, "b at 15");
    is_int(info(&e).objects, 3, "three objects");
    ok(strstr(last_target(&e), "resourceVersion=20&") != NULL, "watching from the list's rv");

    /* an ERROR event other than 410 is logged; the watch goes on */
    int nreq = e.f.nreq;
    send_error(&e.f, 500);
    send_event(&e.f, "ADDED", "e", 21);
    RUN_UNTIL(&e, store_rv(&e) >= 21);
    is_int(stored(&e, "default/e", NULL, 0), 21, "events after an ERROR 500 still land");
    is_int(e.f.nreq, nreq, "no new request");
    ok(e.f.watch != NULL, "the stream stays open");

    /* an ERROR 410 event inside the stream: relist when it ends */
    static const char *const names2[] = {"a", "b", "d", "e"};
    static const uint64_t rvs2[] = {3, 15, 12, 21};
    set_list(&e.f, 25, names2, rvs2, 4);
    send_error(&e.f, 410);
    watch_end(&e.f);
    RUN_UNTIL(&e, ctr(&e).lists >= 3 && e.f.nwatch >= 3 && e.f.watch);
    c = ctr(&e);
    is_int(c.expired, 2, "the ERROR 410 counted");
    is_int(c.relists, 2, "a second relist");
    is_int(store_rv(&e), 25, "at its rv");
    history(&e, 21, &h);
    is_str(h.s, "", "nothing changed: no event");
    is_int(c.errors[0] + c.errors[1] + c.errors[2], 0, "no error");
    env_fini(&e);
}

static void
test_cut_mid_frame(void)
{
    struct env e;
    env_init(&e, 0);
    env_sync(&e);
    send_event(&e.f, "ADDED", "x", 11);
    RUN_UNTIL(&e, store_rv(&e) >= 11);
    /* half an event, then the stream's clean end */
    watch_frame(&e.f, "{\"type\":\"ADDED\",\"object\":{\"kind\":\"Pod\",\"apiVer");
    watch_end(&e.f);
    RUN_UNTIL(&e, ctr(&e).errors[2] >= 1);
    struct refl_counters c = ctr(&e);
    is_int(c.errors[2], 1, "a stream ending inside an event is a watch error");
    is_int(c.retry_ms, 250, "retried after the least delay (base 500 ms, random 0)");
    is_int(c.backoff_ms, 1000, "the next base doubled");
    RUN_UNTIL(&e, e.f.nwatch >= 2 && e.f.watch);
    ok(strstr(last_target(&e), "resourceVersion=11&") != NULL, "re-watched from the last rv");
    is_int(info(&e).objects, 4, "the half event stored nothing");

    /* half an event, then the connection drops (no last chunk) */
    watch_frame(&e.f, "{\"type\":\"MODIFIED\",\"obj");
    watch_cut(&e.f);
    RUN_UNTIL(&e, ctr(&e).errors[2] >= 2);
    c = ctr(&e);
    is_int(c.errors[2], 2, "a cut stream is a watch error");
    is_int(c.retry_ms, 500, "retried after the grown delay (base 1 s)");
    is_int(c.backoff_ms, 2000, "the base doubled again");
    RUN_UNTIL(&e, e.f.nwatch >= 3 && e.f.watch);
    ok(strstr(last_target(&e), "resourceVersion=11&") != NULL, "re-watched from the last rv");
    is_int(info(&e).objects, 4, "nothing stored from it");
    ok(refl_serving(e.r), "in service throughout");
    env_fini(&e);
}

/* The backoff starts over once a watch has been open 10 s on the reflector's
 * clock: the test moves that clock, never waits for it. */
static void
test_healthy_resets_backoff(void)
{
    struct env e;
    env_init(&e, 0);
    env_sync(&e);
    uint64_t t0 = e.now;
    watch_cut(&e.f); /* at once: not healthy */
    RUN_UNTIL(&e, ctr(&e).errors[2] >= 1);
    is_int(ctr(&e).retry_ms, 250, "first drop: the least delay");
    RUN_UNTIL(&e, e.f.nwatch >= 2 && e.f.watch);
    is_int(ctr(&e).backoff_ms, 1000, "a fresh watch: the grown base stands");
    e.now = t0 + 9999;
    is_int(ctr(&e).backoff_ms, 1000, "open 9.999 s: still grown");
    watch_cut(&e.f);
    RUN_UNTIL(&e, ctr(&e).errors[2] >= 2);
    is_int(ctr(&e).retry_ms, 500, "a drop before 10 s: the grown delay");
    is_int(ctr(&e).backoff_ms, 2000, "and the base grows");
    RUN_UNTIL(&e, e.f.nwatch >= 3 && e.f.watch);
    watch_read(&e, 11);
    is_int(ctr(&e).backoff_ms, 2000, "open, not 10 s yet: grown");
    e.now += 10000;
    is_int(ctr(&e).backoff_ms, 0, "open 10 s: the gauge says the backoff starts over");
    e.rnd = 500; /* the most jitter for the least base */
    watch_cut(&e.f);
    RUN_UNTIL(&e, ctr(&e).errors[2] >= 3);
    is_int(ctr(&e).retry_ms, 750,
           "a drop after a healthy watch: back to the least base (250-750 ms)");
    is_int(ctr(&e).backoff_ms, 1000, "and the base starts over");

    /* a watch that delivers events after 10 s starts over too, at once */
    e.rnd = 0;
    struct env e2;
    env_fini(&e);
    env_init(&e2, 0);
    env_sync(&e2);
    watch_cut(&e2.f);
    RUN_UNTIL(&e2, e2.f.nwatch >= 2 && e2.f.watch);
    is_int(ctr(&e2).backoff_ms, 1000, "grown after a drop");
    e2.now += 10000;
    send_event(&e2.f, "ADDED", "y", 11);
    RUN_UNTIL(&e2, store_rv(&e2) >= 11);
    watch_frame(&e2.f, "{\"type\":\"ADDED\""); /* cut inside an event: no reset of its own */
    watch_end(&e2.f);
    RUN_UNTIL(&e2, ctr(&e2).errors[2] >= 2);
    is_int(ctr(&e2).retry_ms, 250, "reset by the events of a healthy watch");
    env_fini(&e2);
}

static void
test_list_errors_back_off(void)
{
    struct env e;
    env_init(&e, 0);
    e.f.list_status = 503;
    refl_start(e.r);
    RUN_UNTIL(&e, ctr(&e).errors[1] >= 1);
    struct refl_counters c = ctr(&e);
    is_int(c.errors[1], 1, "a failed LIST is a list error");
    is_int(c.retry_ms, 250, "retried after the least delay");
    ok(!refl_synced(e.r), "not synced");
    ok(strstr(refl_last_error(e.r) ? refl_last_error(e.r) : "", "answered 503") != NULL,
       "refl_last_error says the LIST answered 503");
    /* /readyz's line tells the truth between attempts (issue 31) */
    char st[768];
    refl_status(e.r, st, sizeof(st));
    ok(strstr(st, "not synced, backing off for 0 s (1 failed attempt; next in 0.2 s; last "
                  "error: LIST /api/v1/pods answered 503)") != NULL,
       "backing off: since when, how many, the next try, the last error");
    ok(strstr(st, "nothing heard from the upstream yet") != NULL,
       "no age of an event that never came");
    ok(strstr(st, "listing") == NULL, "not the step it will retry");
    is_str(refl_cache_state_label(refl_cache_state(e.r)), "backing_off",
           "kwc_cache_state: backing_off");
    double age = -1;
    ok(!refl_heard_age(e.r, &age), "no age: nothing heard yet");
    RUN_UNTIL(&e, ctr(&e).errors[1] >= 2);
    c = ctr(&e);
    is_int(c.retry_ms, 500, "the second failure waits twice as long");
    is_int(c.lists, 2, "each attempt a LIST from its first page");
    e.f.list_status = 200;
    RUN_UNTIL(&e, e.f.nwatch >= 1 && e.f.watch);
    ok(refl_synced(e.r), "synced once the upstream answers");
    is_int(ctr(&e).backoff_ms, 0, "a completed list starts the backoff over");
    refl_status(e.r, st, sizeof(st));
    ok(strstr(st, "synced, ") && !strstr(st, "backing off") &&
           strstr(st, "last upstream event or bookmark 0 s ago"),
       "recovered: no backing off, and the last word from the upstream");
    is_str(refl_cache_state_label(refl_cache_state(e.r)), "watching", "state: watching");
    ok(refl_heard_age(e.r, &age) && age == 0.0, "an age once the list completed");
    refl_stop(e.r);
    is_str(refl_cache_state_label(refl_cache_state(e.r)), "stopped", "stopped: stopped");
    ok(!refl_heard_age(e.r, &age), "...and no age");
    env_fini(&e);
}

/* --max-staleness on the reflector's clock. */
static void
test_staleness(void)
{
    struct env e;
    env_init(&e, 5000);
    env_sync(&e);
    ok(refl_serving(e.r), "in service after the list");
    is_str(refl_out_why(e.r), NULL, "no reason to be out");
    e.now += 5001;
    RUN_UNTIL(&e, !refl_serving(e.r)); /* the next tick sees it */
    ok(!refl_serving(e.r), "out of service past --max-staleness");
    ok(refl_synced(e.r), "still synced");
    const char *why = refl_out_why(e.r);
    ok(why && strstr(why, "stale: no event or bookmark from the upstream for 5 s "
                          "(--max-staleness 5s)"),
       "the reason says stale, for how long");
    is_str(refl_cache_state_label(refl_cache_state(e.r)), "stale", "state: stale");
    char st[512];
    refl_status(e.r, st, sizeof(st));
    ok(strstr(st, "synced, stale (past --max-staleness 5s), watching, ") != NULL,
       "refl_status: stale, then what it does");
    double age = 0;
    ok(refl_heard_age(e.r, &age) && age > 5.0, "its age: past --max-staleness");
    send_bookmark(&e.f, 12);
    RUN_UNTIL(&e, refl_serving(e.r));
    ok(refl_serving(e.r), "a bookmark brings it back");
    is_str(refl_out_why(e.r), NULL, "no reason left");
    is_str(refl_cache_state_label(refl_cache_state(e.r)), "watching", "state: watching again");
    refl_status(e.r, st, sizeof(st));
    ok(strstr(st, "last upstream event or bookmark 0 s ago") != NULL,
       "the age starts over at the bookmark");
    env_fini(&e);
}

/* ---- the upstream's timeline ---- */

static void
test_timeline_pure(void)
{
    ok(!refl_rv_went_back(0, 5), "nothing held: nothing went back");
    ok(!refl_rv_went_back(10, 10), "the same rv");
    ok(!refl_rv_went_back(10, 11), "ahead");
    ok(refl_rv_went_back(1158, 10), "below what the cache holds");
    is_int(refl_id_decide("", "u1"), REFL_ID_RECORD, "none recorded: record it");
    is_int(refl_id_decide("u1", "u1"), REFL_ID_SAME, "the same cluster");
    is_int(refl_id_decide("u1", "u2"), REFL_ID_CHANGED, "another cluster");
    char uid[64];
    static const char ns[] = "{\"kind\":\"Namespace\",\"metadata\":{\"name\":\"kube-system\","
                             "\"uid\":\"2f1c-9a\"}}";
    ok(refl_id_parse(ns, strlen(ns), uid, sizeof(uid)) == 0 && strcmp(uid, "2f1c-9a") == 0,
       "the namespace's uid");
    static const char nouid[] = "{\"metadata\":{\"name\":\"kube-system\"}}";
    ok(refl_id_parse(nouid, strlen(nouid), uid, sizeof(uid)) != 0, "no uid: an error");
    static const char list[] = "{\"kind\":\"NamespaceList\",\"metadata\":{},\"items\":[{"
                               "\"metadata\":{\"name\":\"kube-system\",\"uid\":\"u-9\"}}]}";
    ok(refl_id_parse(list, strlen(list), uid, sizeof(uid)) == 0 && strcmp(uid, "u-9") == 0,
       "a list's first item's uid");
    static const char empty[] = "{\"kind\":\"NamespaceList\",\"metadata\":{},\"items\":[]}";
    ok(refl_id_parse(empty, strlen(empty), uid, sizeof(uid)) != 0, "an empty list: none");
    ok(refl_id_parse("{", 1, uid, sizeof(uid)) != 0, "not JSON: an error");
    ok(refl_id_parse(ns, strlen(ns), uid, 4) != 0, "longer than the buffer: an error");
}

/* What the ingest's subscribers hear: services lost, and whether the cache
 * was resetting then (its watchers' 410). */
struct heard {
    int out, out_resetting;
};

static void
on_heard_service(void *arg, const struct refl *r, bool serving)
{
    struct heard *h = arg;
    if (!serving) {
        h->out++;
        h->out_resetting += refl_resetting(r);
    }
}

static struct refl_resets
resets(const struct env *e)
{
    struct refl_resets rs;
    refl_ingest_resets(e->ing, &rs);
    return rs;
}

/* The upstream restarted at a lower rv with other objects: the probe before
 * the watch resumes sees it; the cache drops everything and lists afresh. */
static void
test_probe_went_back(void)
{
    struct env e;
    env_init(&e, 0);
    struct heard h = {0};
    refl_ingest_subscribe(e.ing, NULL, on_heard_service, &h);
    env_sync(&e);
    send_event(&e.f, "ADDED", "x", 11);
    RUN_UNTIL(&e, store_rv(&e) >= 11);
    static const char *const names[] = {"p"};
    static const uint64_t rvs[] = {4};
    set_list(&e.f, 5, names, rvs, 1);
    e.f.probe_rv = 5;
    watch_cut(&e.f);
    RUN_UNTIL(&e, ctr(&e).lists >= 2 && e.f.nwatch >= 2 && e.f.watch);
    is_int(e.f.nprobe, 1, "one probe before the watch would resume");
    is_int(resets(&e).rv_backwards, 1, "counted");
    is_int(resets(&e).identity, 0, "not an identity change");
    is_int(h.out, 1, "it left service");
    is_int(h.out_resetting, 1, "...resetting (its watchers get 410)");
    is_int(info(&e).objects, 1, "only the new upstream's object");
    is_int(stored(&e, "default/a", NULL, 0), -1, "none of the old ones");
    is_int(stored(&e, "default/x", NULL, 0), -1, "nor the old watch's");
    is_int(stored(&e, "default/p", NULL, 0), 4, "the new one");
    is_int(store_rv(&e), 5, "at the new list's rv");
    struct hist_buf hb;
    history(&e, 5, &hb);
    is_str(hb.s, "", "no history of the old timeline");
    ok(refl_serving(e.r) && !refl_resetting(e.r), "rebuilt and serving");
    ok(strstr(last_target(&e), "resourceVersion=5&") != NULL, "watching from the new list's rv");
    env_fini(&e);
}

/* A bookmark below the cache's rv ends the watch; the probe finds the
 * upstream where it was: no reset, the watch resumes from the cache's rv. */
static void
test_bookmark_below(void)
{
    struct env e;
    env_init(&e, 0);
    env_sync(&e);
    send_event(&e.f, "ADDED", "x", 11);
    RUN_UNTIL(&e, store_rv(&e) >= 11);
    send_bookmark(&e.f, 8);
    send_event(&e.f, "ADDED", "y", 9); /* after it on the same watch: not stored */
    RUN_UNTIL(&e, e.f.nwatch >= 2 && e.f.watch);
    is_int(resets(&e).rv_backwards, 0, "no reset");
    is_int(e.f.nprobe, 1, "the probe decided");
    is_int(ctr(&e).errors[2], 1, "a watch error (with its backoff)");
    is_int(ctr(&e).lists, 1, "no list");
    is_int(stored(&e, "default/x", NULL, 0), 11, "the cache kept its data");
    is_int(stored(&e, "default/y", NULL, 0), -1, "nothing after the low bookmark was stored");
    ok(strstr(last_target(&e), "resourceVersion=11&") != NULL, "resumed from the cache's rv");
    ok(refl_serving(e.r), "serving all along");
    env_fini(&e);
}

/* A relist (after a 410) at an rv below the cache's: a reset, not a diff. */
static void
test_relist_went_back(void)
{
    struct env e;
    env_init(&e, 0);
    env_sync(&e);
    send_event(&e.f, "ADDED", "x", 11);
    RUN_UNTIL(&e, store_rv(&e) >= 11);
    static const char *const names[] = {"q"};
    static const uint64_t rvs[] = {6};
    set_list(&e.f, 6, names, rvs, 1);
    send_error(&e.f, 410);
    watch_end(&e.f);
    RUN_UNTIL(&e, ctr(&e).lists >= 3 && e.f.nwatch >= 2 && e.f.watch);
    is_int(resets(&e).rv_backwards, 1, "counted");
    is_int(info(&e).objects, 1, "the new list alone");
    is_int(stored(&e, "default/q", NULL, 0), 6, "its object");
    is_int(stored(&e, "default/x", NULL, 0), -1, "nothing of the old timeline");
    struct hist_buf hb;
    history(&e, 6, &hb);
    is_str(hb.s, "", "no difference recorded as events");
    ok(refl_serving(e.r), "rebuilt");
    env_fini(&e);
}

/* The kube-system uid: recorded at the first answer; another one after a
 * reconnect resets the cache (and the data of caches not running); a 403
 * does not block the watch. */
static void
test_identity(void)
{
    struct env e;
    env_init(&e, 0);
    e.f.ns_uid = xstrdup("uid-a");
    refl_ingest_check_identity(e.ing, e.up);
    env_sync(&e);
    char rec[256];
    RUN_UNTIL(&e, e.f.nid >= 1 && store_cluster_id(e.st, rec, sizeof(rec)) == 0 && rec[0]);
    is_str(rec, "uid-a", "recorded");
    /* a resource of a cache not running, from the same data dir */
    struct store_res *other;
    store_res(e.st, "v1/secrets:json", &other);
    struct store_wtxn *w;
    store_wtxn_begin(e.st, 1, &w);
    store_wtxn_reset(w, other, 30);
    store_wtxn_set_synced(w, other, true);
    store_wtxn_commit(w);

    /* the upstream comes back as another cluster, with rvs ahead */
    free(e.f.ns_uid);
    e.f.ns_uid = xstrdup("uid-b");
    static const char *const names[] = {"z"};
    static const uint64_t rvs[] = {40};
    set_list(&e.f, 50, names, rvs, 1);
    int nwatch = e.f.nwatch;
    watch_cut(&e.f);
    RUN_UNTIL(&e, resets(&e).identity >= 1 && e.f.nwatch > nwatch && e.f.watch);
    is_int(resets(&e).identity, 1, "an identity change, counted once");
    is_int(resets(&e).rv_backwards, 0, "its rvs did not go back");
    store_cluster_id(e.st, rec, sizeof(rec));
    is_str(rec, "uid-b", "the new identity recorded");
    is_int(stored(&e, "default/a", NULL, 0), -1, "the old cluster's objects dropped");
    is_int(stored(&e, "default/z", NULL, 0), 40, "the new one's listed");
    ok(strstr(last_target(&e), "resourceVersion=50&") != NULL, "watching from the new list");
    struct store_rtxn *t;
    struct store_res_info oi = {0};
    store_rtxn_begin(e.st, &t);
    store_info(t, other, &oi);
    store_rtxn_end(t);
    ok(!oi.synced && oi.rv == 0, "a cache not running lost its data too");

    /* not allowed to read it: the watch goes on, nothing reset */
    free(e.f.ns_uid);
    e.f.ns_uid = NULL;
    nwatch = e.f.nwatch;
    int nid = e.f.nid;
    watch_cut(&e.f);
    RUN_UNTIL(&e, e.f.nwatch > nwatch && e.f.watch);
    is_int(e.f.nid, nid + 1, "asked again after the reconnect");
    is_int(resets(&e).identity, 1, "a 403 is no change");
    ok(refl_serving(e.r), "serving");

    /* the same cluster after a reconnect: nothing */
    e.f.ns_uid = xstrdup("uid-b");
    nwatch = e.f.nwatch;
    watch_cut(&e.f);
    RUN_UNTIL(&e, e.f.nwatch > nwatch && e.f.watch);
    is_int(resets(&e).identity, 1, "the same uid: no change");
    is_int(ctr(&e).lists, 2, "no list");
    env_fini(&e);
}

int
main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* TAP lines whole among the logs on stderr */
    log_set_level(LOG_ERROR);         /* the reflector's retries and relists log warnings */
    TAP_RUN(test_policy);
    TAP_RUN(test_list_then_watch);
    TAP_RUN(test_watch_410_relists);
    TAP_RUN(test_cut_mid_frame);
    TAP_RUN(test_healthy_resets_backoff);
    TAP_RUN(test_list_errors_back_off);
    TAP_RUN(test_staleness);
    TAP_RUN(test_timeline_pure);
    TAP_RUN(test_probe_went_back);
    TAP_RUN(test_bookmark_below);
    TAP_RUN(test_relist_went_back);
    TAP_RUN(test_identity);
    return tap_done();
}
