/*
 * main.c — kwc's entry point: flags -> upstream settings -> event loop with the
 * upstream client, the store, the reflectors and the serving side (app.h);
 * SIGTERM/SIGINT stop it cleanly.
 *
 * Shutdown (issue 21; after Go's Server.Shutdown(ctx), which kube-apiserver
 * bounds by its --request-timeout, 60 s): the first SIGTERM/SIGINT drains
 * (app_drain): the listeners close, HTTP/2 clients get a GOAWAY with the
 * last stream id and open no new streams on the connection, idle HTTP/1.1
 * connections close and busy ones get Connection: close, and every watch
 * stream ends cleanly at once (a watch never ends on its own, and its
 * client resumes elsewhere from its last rv). The requests in progress
 * (lists being written, gets, passthroughs) then have
 * --shutdown-drain-grace-period (default 10 s, a third of Kubernetes' default
 * 30 s grace before SIGKILL, leaving time for the rest) to finish; the
 * reflectors and the store go on serving them meanwhile. Drained, or the
 * deadline passed, or a second signal: the loop ends and everything is
 * freed as before (app_free closes what is left, then LMDB closes). 0
 * skips the drain (the loop ends at the first signal). Progress is logged
 * for people: "draining N requests", then "drained" or "drain deadline
 * passed, closing N".
 *
 * Before the drain, on SIGTERM, --shutdown-delay-duration (kube-apiserver's
 * flag and semantics; default 10 s, the delay OpenShift's API servers run
 * with behind a Service: endpoints leave kube-proxy and load balancers in
 * 5-10 s): /readyz fails at once and everything else is served as before,
 * new connections included, because whatever balances clients over
 * replicas keeps sending new connections until it has seen /readyz fail
 * or the endpoint go. Only then the drain. SIGINT (a person at a terminal)
 * and a second signal skip it.
 */
#include <errno.h>
#include <malloc.h>
#include <event2/event.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kwc/app.h"
#include "kwc/base.h"
#include "kwc/catalog.h"
#include "kwc/config.h"
#include "kwc/datadir.h"
#include "kwc/disco.h"
#include "kwc/handover.h"
#include "kwc/kinds.h"
#include "kwc/kubeconfig.h"
#include "kwc/log.h"
#include "kwc/reflector.h"
#include "kwc/store.h"
#include "kwc/upstream.h"
#include "kwc/version.h"

#define SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"

#define DRAIN_CHECK_MS 20 /* how often a drain looks whether it is over */
#define LOG_TICK_MS 250   /* how often repeating warnings' summaries are due (log_repeat) */

struct stopper {
    struct event_base *base;
    struct app *app;
    double drain_s; /* --shutdown-drain-grace-period, in seconds */
    long delay_ms;  /* --shutdown-delay-duration */
    bool delaying, draining;
    struct event *check, *delay;
    struct timespec start;
};

static double
since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

static bool
busy_any(const struct app_busy *b)
{
    return b->requests || b->connections || b->watches;
}

static void
on_drain_check(evutil_socket_t fd, short what, void *arg)
{
    struct stopper *sp = arg;
    struct app_busy b;
    app_busy(sp->app, &b);
    double t = since(&sp->start);
    if (!busy_any(&b)) {
        log_info("kwc: drained in %.1f s", t);
    } else if (t >= (double)sp->drain_s) {
        log_info("kwc: drain deadline (%.3g s) passed, closing %u requests on %u connections "
                 "(%zu watch streams still ending)",
                 sp->drain_s, b.requests, b.connections, b.watches);
    } else {
        return;
    }
    event_del(sp->check);
    event_base_loopexit(sp->base, NULL);
}

static void
on_log_tick(evutil_socket_t fd, short what, void *arg)
{
    log_repeat_tick();
}

static void
start_drain(struct stopper *sp, const char *name)
{
    if (sp->drain_s <= 0) {
        log_info("kwc: %s received, shutting down", name);
        event_base_loopexit(sp->base, NULL);
        return;
    }
    sp->draining = true;
    clock_gettime(CLOCK_MONOTONIC, &sp->start);
    struct app_busy b;
    app_busy(sp->app, &b);
    size_t watches = b.watches; /* before they end (on their workers, at once) */
    app_drain(sp->app);
    app_busy(sp->app, &b);
    b.watches = watches;
    log_info("kwc: %s received, shutting down: draining %u requests on %u connections, %zu watch "
             "streams ending (up to %.3g s; a second signal stops at once)",
             name, b.requests, b.connections, b.watches, sp->drain_s);
    struct timeval tv = {0, DRAIN_CHECK_MS * 1000};
    event_add(sp->check, &tv);
    on_drain_check(-1, 0, sp); /* nothing in progress: at once */
}

static void
on_delay_end(evutil_socket_t fd, short what, void *arg)
{
    struct stopper *sp = arg;
    sp->delaying = false;
    log_info("kwc: --shutdown-delay-duration (%.1f s) passed", (double)sp->delay_ms / 1000);
    start_drain(sp, "SIGTERM");
}

static void
on_signal(evutil_socket_t sig, short what, void *arg)
{
    struct stopper *sp = arg;
    const char *name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
    if (sp->draining || sp->delaying) {
        struct app_busy b;
        app_busy(sp->app, &b);
        log_info("kwc: %s received while %s: closing %u requests on %u connections now", name,
                 sp->draining ? "draining" : "waiting for --shutdown-delay-duration", b.requests,
                 b.connections);
        event_base_loopexit(sp->base, NULL);
        return;
    }
    if (sig == SIGTERM && sp->delay_ms > 0) {
        sp->delaying = true;
        app_shutting_down(sp->app);
        log_info("kwc: SIGTERM received: /readyz fails from now on; serving goes on for %.1f s "
                 "(--shutdown-delay-duration) while load balancers stop sending connections, then "
                 "the drain (a second signal stops at once)",
                 (double)sp->delay_ms / 1000);
        struct timeval tv = {sp->delay_ms / 1000, (sp->delay_ms % 1000) * 1000};
        event_add(sp->delay, &tv);
        return;
    }
    start_drain(sp, name);
}

/* ---- a takeover (handover.h): this kwc's side ---- */

#define RETAKE_TRIES 100 /* 100 ms apart: the failed new kwc's lock goes at its exit */

struct takeover {
    struct stopper *sp;
    struct catalog *cat;
    struct datadir *dd;
    const char *dir;
    struct event *retake;
    int tries;
};

static int
to_freeze(void *arg, char *err, size_t errlen)
{
    struct takeover *t = arg;
    if (t->sp->delaying || t->sp->draining)
        return kwc_errf(err, errlen, KWC_ECONFIG, "this kwc is shutting down");
    catalog_freeze(t->cat);
    datadir_release_lock(t->dd);
    return 0;
}

static void
on_retake(evutil_socket_t fd, short what, void *arg)
{
    struct takeover *t = arg;
    char err[512];
    if (datadir_retake_lock(t->dir, t->dd, err, sizeof(err)) == 0) {
        catalog_thaw(t->cat);
        return;
    }
    if (++t->tries < RETAKE_TRIES) {
        struct timeval tv = {0, 100 * 1000};
        evtimer_add(t->retake, &tv);
        return;
    }
    log_error("kwc: the takeover failed and the data dir cannot be taken back (%s): the caches "
              "stay stopped (their requests pass through); restart kwc",
              err);
}

static void
to_thaw(void *arg)
{
    struct takeover *t = arg;
    t->tries = 0;
    on_retake(-1, 0, t);
}

static size_t
to_fds(void *arg, int *fds, size_t max)
{
    struct takeover *t = arg;
    return app_listen_fds(t->sp->app, fds, max);
}

static void
to_handed(void *arg)
{
    struct takeover *t = arg;
    /* no delay: the sockets stay open in the new kwc, nothing is refused */
    start_drain(t->sp, "a takeover");
}

/* A --resources entry the upstream does not have (a typo): exit 2 naming it. */
struct unknown_exit {
    struct event_base *base;
    bool hit;
};

static void
on_unknown_resource(void *arg, const struct refl *r, const char *why)
{
    struct unknown_exit *u = arg;
    const struct refl_desc *d = refl_desc(r);
    if (!u->hit)
        fprintf(stderr, "kwc: --resources: %s%s%s/%s: %s (fix or remove the entry)\n", d->group,
                d->group[0] ? "/" : "", d->version, d->resource, why);
    u->hit = true;
    event_base_loopexit(u->base, NULL);
}

static int
write_port_file(const char *path, int port)
{
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -errno;
    fprintf(f, "%d\n", port);
    if (fclose(f) != 0 || rename(tmp, path) != 0)
        return -errno;
    return 0;
}

static void
raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* Does connecting to the upstream resolve a name (curl's resolver then holds
 * descriptors of its own)? */
static bool
upstream_is_name(const struct kcfg *k)
{
    bool tls;
    char host[256] = "", port[16];
    kcfg_server_hostport(k->server, &tls, host, sizeof(host), port, sizeof(port));
    unsigned char a[16];
    return inet_pton(AF_INET, host, a) != 1 && inet_pton(AF_INET6, host, a) != 1;
}

/* --max-connections against the open-file limit (config.h cfg_fd_budget). */
static int
fd_budget(struct kwc_config *cfg, const struct kcfg *k, struct cfg_fd_budget *out, char *err,
          size_t errlen)
{
    struct rlimit rl;
    unsigned long limit = 1024; /* the usual default, should getrlimit fail */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        limit = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > UINT32_MAX
                    ? UINT32_MAX
                    : (unsigned long)rl.rlim_cur;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    struct cfg_fd_budget b;
    int rc = cfg_fd_budget(cfg, limit, ncpu > 0 ? (unsigned)ncpu : 1, upstream_is_name(k), &b, err,
                           errlen);
    if (rc != 0)
        return rc;
    cfg->max_connections_resolved = (unsigned)b.connections;
    *out = b;
    return 0;
}

static int
load_upstream(const struct kwc_config *cfg, struct kcfg **k, char *err, size_t errlen)
{
    if (cfg->upstream) {
        *k = xcalloc(1, sizeof(**k));
        (*k)->server = xstrdup(cfg->upstream);
        size_t l = strlen((*k)->server);
        while (l > 0 && (*k)->server[l - 1] == '/')
            (*k)->server[--l] = '\0';
        return 0;
    }
    if (cfg->kubeconfig)
        return kcfg_load_file(cfg->kubeconfig, cfg->context, k, err, errlen);
    return kcfg_in_cluster(SA_DIR, getenv("KUBERNETES_SERVICE_HOST"),
                           getenv("KUBERNETES_SERVICE_PORT"), k, err, errlen);
}

/* How many caches the store opens at most: all it can (auto), or two per
 * --resources entry (JSON and protobuf: cache_conns counts them). */
static unsigned
max_caches(const struct kwc_config *cfg)
{
    if (cfg->auto_resources) /* every resource ever cached keeps its slot (catalog.h) */
        return STORE_MAX_RESOURCES;
    size_t n = cfg->cache_conns;
    if (n < 32)
        n = 32;
    return n > STORE_MAX_RESOURCES ? STORE_MAX_RESOURCES : (unsigned)n;
}

/* "127.0.0.1:8001, [::1]:8001" for the log. */
static void
listen_text(const struct kwc_config *cfg, int port, char *out, size_t len)
{
    size_t at = 0;
    out[0] = '\0';
    for (size_t i = 0; i < cfg->n_listen && at < len; i++) {
        const struct sockaddr_storage *ss = &cfg->listen_addrs[i].ss;
        char h[INET6_ADDRSTRLEN] = "?";
        bool v6 = ss->ss_family == AF_INET6;
        if (v6)
            inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)ss)->sin6_addr, h, sizeof(h));
        else
            inet_ntop(AF_INET, &((const struct sockaddr_in *)ss)->sin_addr, h, sizeof(h));
        int n = snprintf(out + at, len - at, "%s%s%s%s:%d", i ? ", " : "", v6 ? "[" : "", h,
                         v6 ? "]" : "", port);
        if (n < 0)
            break;
        at += (size_t)n;
    }
}

/*
 * glibc's malloc gives a thread arena's free top back to the kernel
 * (madvise DONTNEED) whenever it passes M_TRIM_THRESHOLD, 128 KiB while no
 * block was ever mmap'd: a serving loop whose output buffers fill and drain
 * hundreds of times a second then faults its pages back in as often. Under
 * HTTP/2 fan-out over TLS at 200,000 deliveries/s that was ~100,000 page
 * faults/s per loop and 17 % of kwc's CPU, for no smaller RSS
 * (bench/results/cores.md). An arena keeps up to 8 MiB of free top; blocks
 * up to 1 MiB come from the arenas (fixed values end glibc's own adaptive
 * thresholds). An operator's GLIBC_TUNABLES for malloc win.
 */
static void
tune_malloc(void)
{
    const char *t = getenv("GLIBC_TUNABLES");
    if (t && strstr(t, "glibc.malloc."))
        return;
    mallopt(M_TRIM_THRESHOLD, 8 << 20);
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
}

int
main(int argc, char **argv)
{
    struct kwc_config cfg;
    char err[1024] = "";
    tune_malloc();
    raise_fd_limit(); /* first: --max-connections 0 is derived from the limit */
    int rc = cfg_parse(argc, argv, &cfg, err, sizeof(err));
    if (rc == CFG_SHOW_HELP) {
        cfg_usage(stdout);
        return 0;
    }
    if (rc == CFG_SHOW_VERSION) {
        printf("kwc %s\n", KWC_VERSION);
        return 0;
    }
    if (rc != 0) {
        /* the notes first: a bound broken under an old name is reported
         * under the new one, which the note names */
        for (size_t i = 0; i < cfg.n_notes; i++)
            fprintf(stderr, "kwc: %s\n", cfg.notes[i]);
        fprintf(stderr, "kwc: %s\n", err);
        cfg_fini(&cfg);
        return 2;
    }
    log_set_level(cfg.log_level);
    log_set_format(cfg.log_format);
    for (size_t i = 0; i < cfg.n_notes; i++)
        log_warnx("kwc: %s", cfg.notes[i]);
    log_set_repeat_interval((uint64_t)cfg.log_summary_interval);
    /* rand() jitters upstream retries: kwc replicas must not retry in step */
    unsigned seed;
    if (getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed))
        seed = (unsigned)getpid() ^ (unsigned)time(NULL);
    srand(seed);

    struct kcfg *k = NULL;
    if ((rc = load_upstream(&cfg, &k, err, sizeof(err))) != 0) {
        fprintf(stderr, "kwc: %s\n", err[0] ? err : kwc_strerror(rc));
        cfg_fini(&cfg);
        return 2;
    }
    if (k->exec)
        k->exec->timeout_ms = (unsigned)cfg.exec_plugin_timeout;
    if (cfg.auth_delegated && cfg.forward_token && k->cert_pem) {
        /* kube authenticates a client certificate before a bearer token: the
         * upstream would see kwc, not the caller whose token kwc forwards */
        fprintf(
            stderr,
            "kwc: --passthrough-identity=forward-token needs kwc's upstream credentials to be a "
            "token or basic auth: the client certificate of %s would authenticate kwc instead "
            "of the caller (use a token user, or --passthrough-identity=impersonate)\n",
            cfg.kubeconfig ? cfg.kubeconfig : "the upstream settings");
        kcfg_free(k);
        cfg_fini(&cfg);
        return 2;
    }
    struct cfg_fd_budget fdb;
    if ((rc = fd_budget(&cfg, k, &fdb, err, sizeof(err))) != 0) {
        fprintf(stderr, "kwc: %s\n", err);
        kcfg_free(k);
        cfg_fini(&cfg);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);

    struct event_base *base = event_base_new();
    struct up_options uo = {
        .connect_timeout_ms = (int)cfg.upstream_connect_timeout_ms,
        .header_timeout_ms = (int)cfg.upstream_timeout_ms,
        .max_idle_conns = 64,
        .max_conns = {[UP_POOL_PASSTHROUGH] = (unsigned)cfg.max_upstream_connections,
                      [UP_POOL_CACHE] = cfg.cache_conns,
                      [UP_POOL_DISCOVERY] = DISCO_MAX_CONNS,
                      [UP_POOL_TOKENREVIEW] = (unsigned)cfg.max_review_connections,
                      [UP_POOL_SAR] = (unsigned)cfg.max_review_connections},
    };
    struct up_client *up = NULL;
    struct app *app = NULL;
    struct disco *disco = NULL; /* the upstream's discovery (disco.h) */
    struct store *st = NULL;
    struct datadir dd = {.lock_fd = -1};
    struct refl_ingest *ing = NULL;
    struct catalog *cat = NULL;
    struct handover_client *hc = NULL; /* --takeover: the running kwc */
    struct handover *ho = NULL;        /* this one's control socket */
    struct takeover to = {.dd = &dd, .dir = cfg.data_dir};
    int *lfds = NULL;
    int exit_code = 1;
    if ((rc = up_client_new(base, k, &uo, &up, err, sizeof(err))) != 0) {
        fprintf(stderr, "kwc: %s\n", err);
        exit_code = 2;
        goto out;
    }
    struct disco_options dso = {.interval_ms = (unsigned)cfg.discovery_interval};
    disco_new(base, up, &dso, &disco);
    /* once the settings are known to be usable (a bad one is the only line) */
    log_info("kwc: open-file limit %lu: up to %lu client connections, %lu kept for upstream "
             "connections, %lu reserved (listeners, event loops, LMDB, refused connections)",
             fdb.limit, fdb.connections, fdb.upstream, fdb.reserve);
    if (cfg_per_source_connections(&cfg))
        log_info("kwc: at most %u client connections from one address "
                 "(--max-connections-per-source)",
                 cfg_per_source_connections(&cfg));
    else
        log_info(
            "kwc: no limit of client connections per address (--max-connections-per-source 0)");
    struct store_options so;
    store_options_default(&so);
    so.map_size = (uint64_t)cfg.cache_map_size;
    so.history_max_events = (uint64_t)cfg.history_max_events;
    so.history_max_bytes = (uint64_t)cfg.history_max_bytes;
    /* the store keeps whole seconds: a fraction counts as one more */
    so.history_max_age = ((uint64_t)cfg.history_max_age_ms + 999) / 1000;
    so.max_resources = max_caches(&cfg);
    if (getenv("KWC_BENCH_NO_CHECKSUMS")) {
        /* bench/run.py integrity only: the cost of checksums, measured end
         * to end. Such a data dir reads as damaged to a normal kwc. */
        so.checksums = false;
        log_warnx(
            "KWC_BENCH_NO_CHECKSUMS is set: stored values carry no checksums (benchmarks only)");
    }
    if (cfg.takeover && (rc = handover_request(cfg.data_dir, 30000, &hc, err, sizeof(err))) != 0) {
        fprintf(stderr, "kwc: %s\n", err);
        exit_code = 2;
        goto out;
    }
    if ((rc = datadir_open(cfg.data_dir, &so, datadir_policy(cfg.on_corrupt_cache), &dd, err,
                           sizeof(err))) != 0) {
        fprintf(stderr, "kwc: %s\n", err);
        exit_code = 2;
        goto out;
    }
    st = dd.st;
    struct refl_ingest_options io = {.data_dir = cfg.data_dir,
                                     .map_size = (uint64_t)cfg.cache_map_size,
                                     .max_staleness_ms = (uint64_t)cfg.max_staleness_ms};
    refl_ingest_new(base, st, &io, &ing);
    struct unknown_exit unknown = {.base = base};
    if (!cfg.auto_resources) /* a typo in --resources: kwc exits 2 */
        refl_ingest_on_unknown(ing, on_unknown_resource, &unknown);
    struct catalog_options co = {.auto_mode = cfg.auto_resources,
                                 .resources = cfg.resources,
                                 .exclude = cfg.resources_exclude,
                                 .protobuf = cfg.protobuf_resources,
                                 .max_caches = (unsigned)cfg.max_caches,
                                 .idle_ms = (uint64_t)cfg.cache_idle_timeout,
                                 .disk_budget = (uint64_t)cfg.cache_disk_budget,
                                 .identity = k->server};
    if ((rc = catalog_new(base, up, ing, st, disco, &co, &cat, err, sizeof(err))) != 0) {
        fprintf(stderr, "kwc: %s\n", err);
        exit_code = 2;
        goto out;
    }
    if (hc) {
        int got[HANDOVER_MAX_FDS];
        size_t ngot = 0;
        if ((rc = handover_take_listeners(hc, got, HANDOVER_MAX_FDS, &ngot, err, sizeof(err)))) {
            fprintf(stderr, "kwc: %s\n", err);
            exit_code = 2;
            goto out;
        }
        lfds = xcalloc(cfg.n_listen, sizeof(*lfds));
        handover_match(cfg.listen_addrs, cfg.n_listen, got, ngot, lfds);
    }
    struct app_deps deps = {.base = base,
                            .cfg = &cfg,
                            .up = up,
                            .st = st,
                            .ing = ing,
                            .cat = cat,
                            .disco = disco,
                            .kcfg = k,
                            .up_opts = &uo,
                            .listen_fds = lfds};
    if ((rc = app_new(&deps, &app, err, sizeof(err))) != 0) {
        fprintf(stderr, "kwc: %s\n", err);
        exit_code = 2; /* a listen address or TLS file that cannot be used */
        goto out;
    }
    handover_client_free(hc); /* the running kwc drains: this one serves its sockets */
    hc = NULL;
    if (cfg.port_file && (rc = write_port_file(cfg.port_file, app_port(app))) != 0) {
        fprintf(stderr, "kwc: --port-file %s: %s\n", cfg.port_file, kwc_strerror(rc));
        goto out;
    }
    char where[512];
    listen_text(&cfg, app_port(app), where, sizeof(where));
    log_info("kwc %s: serving on %s (%s), upstream %s%s%s, %s%s", KWC_VERSION, where,
             cfg.tls_cert_file ? "https" : "http", k->server, k->context ? " context " : "",
             k->context ? k->context : "",
             cfg.auth_delegated ? (cfg.forward_token ? "auth delegated, callers' tokens forwarded"
                                                     : "auth delegated, callers impersonated")
                                : "auth none: every caller acts as kwc",
             cfg.listen_loopback  ? " (loopback only)"
             : cfg.auth_delegated ? ""
                                  : " (REMOTE!)");

    disco_start(disco);
    refl_ingest_check_identity(ing, up); /* before any watch resumes from a stored rv */
    catalog_start(cat);
    struct stopper sp = {.base = base,
                         .app = app,
                         .drain_s = (double)cfg.shutdown_drain_ms / 1000.0,
                         .delay_ms = cfg.shutdown_delay};
    to.sp = &sp;
    to.cat = cat;
    to.retake = evtimer_new(base, on_retake, &to);
    struct handover_hooks hh = {.freeze = to_freeze,
                                .thaw = to_thaw,
                                .listen_fds = to_fds,
                                .handed = to_handed,
                                .arg = &to};
    if (handover_serve(base, cfg.data_dir, &hh, &ho, err, sizeof(err)) != 0)
        log_warnx("kwc: no takeover of this kwc is possible: %s", err);
    sp.check = event_new(base, -1, EV_PERSIST, on_drain_check, &sp);
    sp.delay = evtimer_new(base, on_delay_end, &sp);
    struct event *sigterm = evsignal_new(base, SIGTERM, on_signal, &sp);
    struct event *sigint = evsignal_new(base, SIGINT, on_signal, &sp);
    evsignal_add(sigterm, NULL);
    evsignal_add(sigint, NULL);
    /* repeating warnings' summaries and recoveries are written when due
     * even if nothing else is logged (log_repeat) */
    struct event *logtick = event_new(base, -1, EV_PERSIST, on_log_tick, NULL);
    struct timeval logtv = {0, LOG_TICK_MS * 1000};
    event_add(logtick, &logtv);
    event_base_dispatch(base);
    event_free(logtick);
    log_repeat_flush(); /* what was counted and not written yet */
    event_free(sigterm);
    event_free(sigint);
    event_free(sp.check);
    event_free(sp.delay);
    handover_free(ho);
    event_free(to.retake);
    exit_code = unknown.hit ? 2 : 0;
out:
    handover_client_free(hc); /* not taken over: the running kwc resumes */
    free(lfds);
    app_free(app);
    refl_ingest_free(ing); /* commits what is pending: before the reflectors go */
    catalog_free(cat);
    disco_free(disco); /* after the app: it borrows the copy */
    up_client_free(up);
    datadir_close(&dd); /* the store, then the lock */
    event_base_free(base);
    kcfg_free(k);
    cfg_fini(&cfg);
    return exit_code;
}
