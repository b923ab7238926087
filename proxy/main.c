/*
 * main.c — kwc's entry point: flags -> upstream settings -> event loop with the
 * upstream client and the front end; SIGTERM/SIGINT stop it cleanly.
 */
#include <errno.h>
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

#include "kwc/base.h"
#include "kwc/config.h"
#include "kwc/datadir.h"
#include "kwc/front.h"
#include "kwc/kinds.h"
#include "kwc/kubeconfig.h"
#include "kwc/log.h"
#include "kwc/reflector.h"
#include "kwc/store.h"
#include "kwc/upstream.h"

#define KWC_VERSION "0.1.0"
#define SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"

static void
on_signal(evutil_socket_t sig, short what, void *arg)
{
    struct event_base *base = arg;
    log_info("kwc: %s received, shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    event_base_loopexit(base, NULL);
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

int
main(int argc, char **argv)
{
    struct kwc_config cfg;
    char err[1024] = "";
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
        fprintf(stderr, "kwc: %s\n", err);
        cfg_fini(&cfg);
        return 2;
    }
    log_set_level(cfg.log_level);
    log_set_format(cfg.log_format);
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
    if (cfg.auth_delegated && cfg.forward_token && k->cert_pem) {
        /* kube authenticates a client certificate before a bearer token: the
         * upstream would see kwc, not the caller whose token kwc forwards */
        fprintf(stderr,
                "kwc: --passthrough-identity=forward-token needs kwc's upstream credentials to be a "
                "token or basic auth: the client certificate of %s would authenticate kwc instead "
                "of the caller (use a token user, or --passthrough-identity=impersonate)\n",
                cfg.kubeconfig ? cfg.kubeconfig : "the upstream settings");
        kcfg_free(k);
        cfg_fini(&cfg);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);

    struct event_base *base = event_base_new();
    struct up_options uo = {
        .connect_timeout_ms = (int)cfg.upstream_connect_timeout * 1000,
        .header_timeout_ms = (int)cfg.upstream_timeout * 1000,
        .max_idle_conns = 64,
    };
    struct up_client *up = NULL;
    struct front *front = NULL;
    struct store *st = NULL;
    struct datadir dd = {.lock_fd = -1};
    struct refl_ingest *ing = NULL;
    struct refl **refls = NULL;
    size_t nrefls = 0;
    int exit_code = 1;
    if ((rc = up_client_new(base, k, &uo, &up, err, sizeof(err))) != 0) {
        fprintf(stderr, "kwc: %s\n", err);
        exit_code = 2;
        goto out;
    }
    struct store_options so;
    store_options_default(&so);
    so.map_size = (uint64_t)cfg.cache_map_size;
    so.history_max_events = (uint64_t)cfg.history_max_events;
    so.history_max_bytes = (uint64_t)cfg.history_max_bytes;
    so.history_max_age = (uint64_t)cfg.history_max_age;
    if (getenv("KWC_BENCH_NO_CHECKSUMS")) {
        /* bench/run.py integrity only: the cost of checksums, measured end
         * to end. Such a data dir reads as damaged to a normal kwc. */
        so.checksums = false;
        log_warnx("KWC_BENCH_NO_CHECKSUMS is set: stored values carry no checksums (benchmarks only)");
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
                                     .max_staleness = (unsigned)cfg.max_staleness};
    refl_ingest_new(base, st, &io, &ing);
    {
        char *list = xstrdup(cfg.resources ? cfg.resources : KINDS_DEFAULT), *save = NULL;
        for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            while (*t == ' ')
                t++;
            if (!*t)
                continue;
            refls = xrealloc(refls, (nrefls + 1) * sizeof(*refls));
            if ((rc = refl_new(base, up, ing, t, k->server, &refls[nrefls], err, sizeof(err))) != 0) {
                fprintf(stderr, "kwc: %s\n", err);
                free(list);
                exit_code = 2;
                goto out;
            }
            nrefls++;
        }
        free(list);
    }
    if ((rc = front_new(base, &cfg, k, up, st, ing, refls, nrefls, &front, err, sizeof(err))) != 0) {
        fprintf(stderr, "kwc: %s\n", err);
        exit_code = 2; /* a listen address or TLS file that cannot be used */
        goto out;
    }
    if (cfg.port_file && (rc = write_port_file(cfg.port_file, front_port(front))) != 0) {
        fprintf(stderr, "kwc: --port-file %s: %s\n", cfg.port_file, kwc_strerror(rc));
        goto out;
    }
    char where[512];
    listen_text(&cfg, front_port(front), where, sizeof(where));
    log_info("kwc %s: serving on %s (%s), upstream %s%s%s, %s%s", KWC_VERSION, where,
             cfg.tls_cert_file ? "https" : "http", k->server, k->context ? " context " : "",
             k->context ? k->context : "",
             cfg.auth_delegated ? (cfg.forward_token ? "auth delegated, callers' tokens forwarded"
                                                     : "auth delegated, callers impersonated")
                                : "auth none: every caller acts as kwc",
             cfg.listen_loopback ? " (loopback only)" : cfg.auth_delegated ? "" : " (REMOTE!)");

    for (size_t i = 0; i < nrefls; i++)
        refl_start(refls[i]);
    struct event *sigterm = evsignal_new(base, SIGTERM, on_signal, base);
    struct event *sigint = evsignal_new(base, SIGINT, on_signal, base);
    evsignal_add(sigterm, NULL);
    evsignal_add(sigint, NULL);
    event_base_dispatch(base);
    event_free(sigterm);
    event_free(sigint);
    exit_code = 0;
out:
    front_free(front);
    refl_ingest_free(ing); /* commits what is pending: before the reflectors go */
    for (size_t i = 0; i < nrefls; i++)
        refl_free(refls[i]);
    free(refls);
    up_client_free(up);
    datadir_close(&dd); /* the store, then the lock */
    event_base_free(base);
    kcfg_free(k);
    cfg_fini(&cfg);
    return exit_code;
}
