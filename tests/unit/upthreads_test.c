/*
 * upthreads_test.c — upstream clients on several loops sharing one uplink
 * (up_client_new_sibling; uplink.h's threading contract) while the
 * credentials rotate.
 *
 * A parent client on the main thread (its loop also runs the exec plugin
 * and the test's rotations) and two siblings, each on a thread of its own
 * with its own event_base, keep two transfers each in flight to a fake
 * upstream (a fourth thread: HTTP/1.1 keep-alive, it echoes the bearer token
 * it got in X-Got). Two rounds:
 *
 *   token file: the test writes token N+1 (write and rename) once every
 *     client has had a transfer carrying token N; the uplink re-reads the
 *     file on every request (uplink_set_token_reread 0). Every transfer
 *     carries a token the test wrote, no older than one before the newest
 *     written when the transfer started.
 *   exec plugin: a shell script prints exec-<n>-<expiry in ms> valid for
 *     EXEC_LIFE_MS, so kwc refreshes it before expiry; the upstream revokes
 *     a credential by answering 401 to one sibling's request, then to every
 *     request with it. Every transfer carries a token not expired when the
 *     transfer started, and after a client saw a 401 none of its later
 *     transfers carries that credential (the 401 made it suspect for every
 *     loop at once, and the new one came from the parent's loop).
 *
 * Nothing may crash, time out or fail. Run under -fsanitize=thread too
 * (make SAN=thread BUILD=build/tsan build/tsan/tests/unit/upthreads_test):
 * the shared credential state is touched from three threads.
 * The loops run until a condition holds, bounded by a guard timer that only
 * fires when the test is broken; no sleeps.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/kubeconfig.h"
#include "kwc/mailbox.h"
#include "kwc/uplink.h"
#include "kwc/upstream.h"
#include "tap.h"

#define GUARD_S 60        /* bound on a round; never reached when all is well */
#define NCLIENTS 3        /* [0] the parent on the main thread, [1], [2] siblings */
#define INFLIGHT 2        /* transfers each client keeps going */
#define FILE_ROTATIONS 25 /* token file round: rotations */
#define EXEC_LIFE_MS 1000 /* exec round: a credential's lifetime */
#define EXEC_REVOKES 2    /* exec round: 401s, one per sibling */
#define EXEC_REVOKE_AT 10 /* requests a credential serves before it is revoked */
#define EXEC_MIN_GENS 4   /* credentials seen: the revoked ones and expiries */
#define MAX_GENS 1024

static char dir[] = "/tmp/kwc-upthreads-XXXXXX";
static char token_path[256];

static long long
wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- the fake upstream (its own thread) ---- */

struct fake {
    struct event_base *base;
    struct mailbox *mb; /* stop */
    int lfd, port;
    struct event *lev;
    bool exec;                 /* the exec round: revocations */
    unsigned served[MAX_GENS]; /* requests answered 200 per exec credential */
    bool revoked[MAX_GENS];
    atomic_uint revokes, gens_seen; /* read by the main thread to decide when to stop */
    unsigned bad;
    pthread_t th;
    pthread_mutex_t ready_mu;
    pthread_cond_t ready_cv;
    bool ready;
};

/* The value of header name in a request head ("" when absent), into out. */
static void
head_value(const char *head, const char *name, char *out, size_t len)
{
    size_t nl = strlen(name);
    out[0] = '\0';
    for (const char *s = strstr(head, "\r\n"); s && s[2]; s = strstr(s, "\r\n")) {
        s += 2;
        if (strncasecmp(s, name, nl) == 0 && s[nl] == ':') {
            const char *v = s + nl + 1;
            while (*v == ' ')
                v++;
            snprintf(out, len, "%.*s", (int)strcspn(v, "\r"), v);
            return;
        }
    }
}

/* One request head: 200 with the token it carried, or 401 for a revoked one. */
static void
fake_answer(struct fake *f, struct bufferevent *bev, const char *head)
{
    char auth[512], client[16], tok[512] = "none";
    head_value(head, "Authorization", auth, sizeof(auth));
    head_value(head, "X-Client", client, sizeof(client));
    if (strncmp(auth, "Bearer ", 7) == 0)
        snprintf(tok, sizeof(tok), "%s", auth + 7);
    int status = 200;
    unsigned n;
    long long exp;
    if (f->exec && sscanf(tok, "exec-%u-%lld", &n, &exp) == 2 && n < MAX_GENS) {
        if (!f->served[n] && !f->revoked[n])
            atomic_fetch_add(&f->gens_seen, 1);
        /* revoke on a sibling's request: 1, then 2 */
        if (!f->revoked[n] && f->served[n] >= EXEC_REVOKE_AT && f->revokes < EXEC_REVOKES &&
            atoi(client) == (int)f->revokes + 1) {
            f->revoked[n] = true;
            atomic_fetch_add(&f->revokes, 1);
        }
        if (f->revoked[n])
            status = 401;
        else
            f->served[n]++;
    } else if (f->exec) {
        f->bad++;
    }
    char resp[1024];
    snprintf(resp, sizeof(resp),
             "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nX-Got: %s\r\n"
             "Content-Length: 2\r\n\r\n{}",
             status, status == 200 ? "OK" : "Unauthorized", tok);
    bufferevent_write(bev, resp, strlen(resp));
}

static void
fake_on_read(struct bufferevent *bev, void *arg)
{
    struct evbuffer *in = bufferevent_get_input(bev);
    for (;;) {
        struct evbuffer_ptr e = evbuffer_search(in, "\r\n\r\n", 4, NULL);
        if (e.pos < 0)
            return;
        size_t n = (size_t)e.pos + 4;
        char *head = xmalloc(n + 1);
        evbuffer_remove(in, head, n);
        head[n] = '\0';
        fake_answer(arg, bev, head); /* GETs only: no body follows */
        free(head);
    }
}

static void
fake_on_event(struct bufferevent *bev, short what, void *arg)
{
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        bufferevent_free(bev);
}

static void
fake_on_accept(evutil_socket_t lfd, short what, void *arg)
{
    struct fake *f = arg;
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
        return;
    struct bufferevent *bev = bufferevent_socket_new(f->base, fd, BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(bev, fake_on_read, NULL, fake_on_event, f);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
}

static void
fake_stop(void *arg)
{
    struct fake *f = arg;
    event_base_loopbreak(f->base);
}

static void *
fake_main(void *arg)
{
    struct fake *f = arg;
    f->base = event_base_new();
    f->mb = mailbox_new(f->base);
    f->lev = event_new(f->base, f->lfd, EV_READ | EV_PERSIST, fake_on_accept, f);
    event_add(f->lev, NULL);
    pthread_mutex_lock(&f->ready_mu);
    f->ready = true;
    pthread_cond_signal(&f->ready_cv);
    pthread_mutex_unlock(&f->ready_mu);
    event_base_dispatch(f->base);
    event_free(f->lev);
    mailbox_free(f->mb);
    event_base_free(f->base); /* frees the connections' bufferevents' events */
    return NULL;
}

static void
fake_start(struct fake *f, bool exec)
{
    *f = (struct fake){.exec = exec};
    pthread_mutex_init(&f->ready_mu, NULL);
    pthread_cond_init(&f->ready_cv, NULL);
    f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    if (f->lfd < 0 || bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        listen(f->lfd, 64) != 0 || getsockname(f->lfd, (struct sockaddr *)&sa, &sl) != 0)
        abort();
    f->port = ntohs(sa.sin_port);
    pthread_create(&f->th, NULL, fake_main, f);
    pthread_mutex_lock(&f->ready_mu);
    while (!f->ready)
        pthread_cond_wait(&f->ready_cv, &f->ready_mu);
    pthread_mutex_unlock(&f->ready_mu);
}

static void
fake_join(struct fake *f)
{
    mailbox_post(f->mb, fake_stop, f);
    pthread_join(f->th, NULL);
    close(f->lfd);
    pthread_mutex_destroy(&f->ready_mu);
    pthread_cond_destroy(&f->ready_cv);
}

/* ---- the clients ---- */

struct round;

struct drv {
    struct round *r;
    int id;
    struct event_base *base;
    struct up_client *c;
    unsigned inflight;
    /* counted on the client's own thread; read by the main one after it is joined
     * (the parent's: the main thread's own) */
    unsigned done, failed, n401, stale, foreign, expired, after401;
    unsigned max401; /* the newest exec credential this client had a 401 for */
    char first_bad[700];
    atomic_uint acked; /* token file round: the newest token a transfer of its carried */
    pthread_t th;
};

struct round {
    bool exec;
    struct fake up;
    struct kcfg *k;
    struct up_client *parent;
    struct drv d[NCLIENTS];
    atomic_bool stop;
    atomic_uint writing; /* token file round: the newest token being written */
    atomic_uint written; /* ... and in the file (rename done) */
    struct mailbox *main_mb;
    int sibs_done;
};

struct xfer {
    struct drv *d;
    struct up_xfer *x;
    unsigned written_at_start, max401_at_start;
    long long start_ms;
    int status;
    char got[512];
};

static void start_one(struct drv *d);

static int
x_headers(void *arg, int status, const struct up_header *h, size_t n)
{
    struct xfer *t = arg;
    t->status = status;
    for (size_t i = 0; i < n; i++)
        if (strcmp(h[i].name, "X-Got") == 0)
            snprintf(t->got, sizeof(t->got), "%s", h[i].value);
    return 0;
}

static int
x_data(void *arg, const char *p, size_t n)
{
    return 0;
}

static void
bad(struct drv *d, unsigned *counter, struct xfer *t, const char *what)
{
    (*counter)++;
    if (!d->first_bad[0])
        snprintf(d->first_bad, sizeof(d->first_bad), "%s: status %d, token %s", what, t->status,
                 t->got);
}

/* What the transfer carried, checked on the client's thread. */
static void
judge(struct drv *d, struct xfer *t)
{
    unsigned g;
    long long exp;
    if (!d->r->exec) {
        if (t->status != 200 || sscanf(t->got, "file-%u", &g) != 1 ||
            g > atomic_load(&d->r->writing)) {
            bad(d, &d->foreign, t, "not a token the test wrote");
            return;
        }
        if (g + 1 < t->written_at_start)
            bad(d, &d->stale, t, "older than the one before the newest written");
        if (g > atomic_load(&d->acked))
            atomic_store(&d->acked, g);
        return;
    }
    if (sscanf(t->got, "exec-%u-%lld", &g, &exp) != 2) {
        bad(d, &d->foreign, t, "not a token the plugin printed");
        return;
    }
    if (exp <= t->start_ms)
        bad(d, &d->expired, t, "expired when the transfer started");
    if (g <= t->max401_at_start)
        bad(d, &d->after401, t, "a credential this client had a 401 for");
    if (t->status == 401) {
        d->n401++;
        if (g > d->max401)
            d->max401 = g;
    } else if (t->status != 200) {
        bad(d, &d->foreign, t, "neither 200 nor 401");
    }
}

static void
x_done(void *arg, int err, const char *msg)
{
    struct xfer *t = arg;
    struct drv *d = t->d;
    d->inflight--;
    d->done++;
    if (err) {
        d->failed++;
        if (!d->first_bad[0])
            snprintf(d->first_bad, sizeof(d->first_bad), "transfer failed: %s", msg);
    } else {
        judge(d, t);
    }
    free(t);
    if (!atomic_load(&d->r->stop))
        start_one(d);
}

static const struct up_xfer_cbs x_cbs = {
    .on_headers = x_headers, .on_data = x_data, .on_done = x_done};

static void
start_one(struct drv *d)
{
    struct xfer *t = xcalloc(1, sizeof(*t));
    t->d = d;
    t->written_at_start = atomic_load(&d->r->written);
    t->max401_at_start = d->max401;
    t->start_ms = wall_ms();
    char id[8];
    snprintf(id, sizeof(id), "%d", d->id);
    struct up_header h[] = {{"X-Client", id}};
    struct up_request rq = {.method = "GET",
                            .target = "/api/v1/namespaces/default/pods/p",
                            .headers = h,
                            .nheaders = 1,
                            .pool = UP_POOL_PASSTHROUGH};
    d->inflight++;
    if (up_xfer_start(d->c, &rq, &x_cbs, t, &t->x) != 0) {
        d->inflight--;
        d->failed++;
        free(t);
    }
}

static const struct up_options client_opts = {
    .connect_timeout_ms = 10000,
    .header_timeout_ms = 20000,
    .max_idle_conns = 4,
    .max_conns = {[UP_POOL_PASSTHROUGH] = 4}, /* a serving loop's share */
};

static void
on_sib_done(void *arg)
{
    struct round *r = arg;
    r->sibs_done++;
}

/* A sibling: its loop, its client, transfers until told to stop. */
static void *
sib_main(void *arg)
{
    struct drv *d = arg;
    char err[256];
    d->base = event_base_new();
    if (up_client_new_sibling(d->r->parent, d->base, &client_opts, &d->c, err, sizeof(err)) != 0)
        abort();
    for (int i = 0; i < INFLIGHT; i++)
        start_one(d);
    /* each turn waits for an event: a transfer's; each transfer is bounded */
    while (d->inflight > 0)
        event_base_loop(d->base, EVLOOP_ONCE);
    up_client_free(d->c);
    event_base_free(d->base);
    mailbox_post(d->r->main_mb, on_sib_done, d->r);
    return NULL;
}

/* ---- the rounds ---- */

static void
write_token(unsigned n)
{
    char tmp[300], tok[32];
    snprintf(tmp, sizeof(tmp), "%s.new", token_path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int len = snprintf(tok, sizeof(tok), "file-%u\n", n);
    if (fd < 0 || write(fd, tok, (size_t)len) != len || close(fd) != 0 ||
        rename(tmp, token_path) != 0)
        abort(); /* as kubelet does: the new file replaces the old at once */
}

static void
on_guard(evutil_socket_t fd, short what, void *arg)
{
    *(bool *)arg = true;
}

/* Token file round: the next token once every client has sent the newest. */
static bool
rotate_file(struct round *r)
{
    unsigned w = atomic_load(&r->written);
    for (int i = 0; i < NCLIENTS; i++)
        if (atomic_load(&r->d[i].acked) < w)
            return false;
    if (w == FILE_ROTATIONS + 1)
        return true;
    atomic_store(&r->writing, w + 1);
    write_token(w + 1);
    atomic_store(&r->written, w + 1);
    return false;
}

static bool
exec_done(struct round *r)
{
    return atomic_load(&r->up.revokes) >= EXEC_REVOKES &&
           atomic_load(&r->up.gens_seen) >= EXEC_MIN_GENS;
}

static void
run_round(struct round *r, bool exec)
{
    char y[2048], err[512] = "", user[600];
    struct event_base *base = event_base_new();
    r->exec = exec;
    fake_start(&r->up, exec);
    if (exec)
        snprintf(user, sizeof(user),
                 "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n"
                 "      command: %s/plugin\n      interactiveMode: Never\n",
                 dir);
    else
        snprintf(user, sizeof(user), "    tokenFile: %s\n", token_path);
    snprintf(y, sizeof(y),
             "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n"
             "    server: http://127.0.0.1:%d\nusers:\n- name: u\n  user:\n%s"
             "contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n"
             "current-context: x\n",
             r->up.port, user);
    if (!exec) {
        atomic_store(&r->writing, 1);
        write_token(1);
        atomic_store(&r->written, 1);
    }
    if (kcfg_parse(y, strlen(y), "/", NULL, &r->k, err, sizeof(err)) != 0 ||
        up_client_new(base, r->k, &client_opts, &r->parent, err, sizeof(err)) != 0) {
        printf("# %s\n", err);
        abort();
    }
    if (!exec)
        uplink_set_token_reread(up_client_uplink(r->parent), 0);
    r->main_mb = mailbox_new(base);
    for (int i = 0; i < NCLIENTS; i++) {
        r->d[i].r = r;
        r->d[i].id = i;
    }
    r->d[0].base = base;
    r->d[0].c = r->parent;
    for (int i = 1; i < NCLIENTS; i++)
        pthread_create(&r->d[i].th, NULL, sib_main, &r->d[i]);
    for (int i = 0; i < INFLIGHT; i++)
        start_one(&r->d[0]);

    bool guard_fired = false;
    struct event *guard = evtimer_new(base, on_guard, &guard_fired);
    struct timeval tv = {GUARD_S, 0};
    evtimer_add(guard, &tv);
    /* a tick for the test's own checks between events */
    struct event *tick = event_new(base, -1, EV_PERSIST, on_guard, &(bool){false});
    struct timeval tick_tv = {0, 1000};
    evtimer_add(tick, &tick_tv);
    while (!guard_fired && !atomic_load(&r->stop)) {
        event_base_loop(base, EVLOOP_ONCE);
        if (exec ? exec_done(r) : rotate_file(r))
            atomic_store(&r->stop, true);
    }
    atomic_store(&r->stop, true);
    event_free(tick);
    /* the parent's loop serves until the siblings are gone (their waits for a
     * credential may need it) */
    while (!guard_fired && (r->sibs_done < NCLIENTS - 1 || r->d[0].inflight > 0))
        event_base_loop(base, EVLOOP_ONCE);
    ok(!guard_fired, "the round ended within the guard");
    if (guard_fired)
        abort(); /* threads still running: nothing safe to free */
    for (int i = 1; i < NCLIENTS; i++)
        pthread_join(r->d[i].th, NULL);
    event_free(guard);
    mailbox_free(r->main_mb);
    up_client_free(r->parent);
    fake_join(&r->up);
    event_base_free(base);
    kcfg_free(r->k);
}

static void
check_clients(struct round *r)
{
    for (int i = 0; i < NCLIENTS; i++) {
        struct drv *d = &r->d[i];
        char what[160];
        snprintf(what, sizeof(what), "client %d (%s): %u transfers", i,
                 i ? "a sibling on its thread" : "the parent", d->done);
        ok(d->done >= 10, what);
        ok(!d->failed && !d->foreign && !d->stale && !d->expired && !d->after401,
           "every transfer carried a current credential");
        if (d->first_bad[0])
            printf("#   failed %u, foreign %u, stale %u, expired %u, after a 401 %u; first: %s\n",
                   d->failed, d->foreign, d->stale, d->expired, d->after401, d->first_bad);
    }
}

static void
test_token_file(void)
{
    struct round *r = xcalloc(1, sizeof(*r));
    run_round(r, false);
    is_int(atomic_load(&r->written), FILE_ROTATIONS + 1, "the token file rotated");
    check_clients(r);
    free(r);
}

static void
test_exec(void)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/plugin", dir);
    FILE *p = fopen(path, "w");
    if (!p)
        abort();
    /* exec-<n>-<expiry ms>, valid EXEC_LIFE_MS: kwc refreshes at four fifths */
    fprintf(p,
            "#!/bin/sh\n"
            "n=$(( $(cat %s/n 2>/dev/null || echo 0) + 1 ))\n"
            "echo $n > %s/n\n"
            "exp=$(( $(date +%%s%%N) / 1000000 + %d ))\n"
            "ts=$(date -u -d \"@$(( exp / 1000 )).$(printf %%03d $(( exp %% 1000 )))\" "
            "+%%Y-%%m-%%dT%%H:%%M:%%S.%%3NZ)\n"
            "printf '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":"
            "\"ExecCredential\",\"status\":{\"token\":\"exec-%%s-%%s\","
            "\"expirationTimestamp\":\"%%s\"}}' $n $exp $ts\n",
            dir, dir, EXEC_LIFE_MS);
    fclose(p);
    chmod(path, 0700);

    struct round *r = xcalloc(1, sizeof(*r));
    run_round(r, true);
    is_int(atomic_load(&r->up.revokes), EXEC_REVOKES,
           "credentials revoked with a 401 on the siblings");
    ok(atomic_load(&r->up.gens_seen) >= EXEC_MIN_GENS, "the plugin's credentials rotated");
    is_int(r->up.bad, 0, "every request carried the plugin's token");
    ok(r->d[1].n401 >= 1 && r->d[2].n401 >= 1, "each sibling had a 401");
    check_clients(r);
    printf("# credentials seen %u; 401s: %u %u %u\n", atomic_load(&r->up.gens_seen), r->d[0].n401,
           r->d[1].n401, r->d[2].n401);
    free(r);
}

int
main(void)
{
    if (!mkdtemp(dir))
        abort();
    snprintf(token_path, sizeof(token_path), "%s/token", dir);
    TAP_RUN(test_token_file);
    TAP_RUN(test_exec);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        printf("# could not remove %s\n", dir);
    return tap_done();
}
