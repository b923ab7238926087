/*
 * execcred.c — the exec credential plugin, run in the background (execcred.h).
 *
 * Sits beside the uplink (uplink.c asks it for the credential of every
 * upstream request). Owns at most one child process at a time: its pid, the
 * parent's ends of its stdout and stderr pipes (O_CLOEXEC, non-blocking,
 * read by libevent), a deadline and a reaping timer. Invariants: a child is
 * always reaped (waitpid) before the next one starts, its pipes are closed
 * by then, and the child gets no other descriptor of kwc's (closefrom).
 *
 * One run: spawn (posix_spawn: own process group, default signals, empty
 * mask, stdin /dev/null) -> read both pipes to EOF (stdout kept up to
 * EXEC_MAX_STDOUT, stderr logged line by line) -> waitpid -> parse. The
 * deadline kills the process group at any step; the child is then reaped by
 * polling (a SIGKILLed process exits at once, nothing blocks the loop).
 *
 * Threads (execcred.h): everything above runs on the owner's loop. What
 * other loops read — the current credential, whether it is suspect, why
 * there is none — is written under mu and read under it; the credential is
 * reference-counted, so the owner drops its reference on a rotation and the
 * last holder frees it. A 401 seen on another loop marks the credential
 * suspect at once and posts the run to the owner's mailbox.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pipe2, posix_spawn_file_actions_addclosefrom_np */
#endif
#include "kwc/execcred.h"

#include <assert.h>
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/kubeconfig.h"
#include "kwc/log.h"
#include "kwc/mailbox.h"

extern char **environ;

#define EXCRED_MAGIC 0x65786372u /* "excr" */
#define REAP_POLL_MAX_MS 64

struct excred {
    uint32_t magic;
    struct event_base *base;
    const struct kcfg_exec *e;
    const char *name;   /* the command as written, for messages */
    pthread_mutex_t mu; /* guards cur (the pointer), suspect, why, cur->unauthorized */
    struct excred_cred *cur;
    bool suspect; /* cur had a 401; a run is due or running */
    char why[512];
    struct mailbox *mb; /* the owner's loop: runs asked for from any thread */
    void (*on_change)(void *arg);
    void *change_arg;
    uint64_t gens, runs, failures;
    unsigned fails_in_row;
    double last_start;      /* CLOCK_MONOTONIC s of the last run's start */
    struct event *next;     /* the next run */
    double next_at;         /* monotonic s when next fires; 0: not pending */
    struct event *deadline; /* the running child's time bound */
    struct event *reap;     /* polls waitpid once the pipes are at EOF */
    unsigned reap_ms;
    /* the running child (pid 0: none) */
    pid_t pid;
    int out_fd, err_fd;
    struct event *out_ev, *err_ev;
    char *out;
    size_t out_len;
    char line[EXEC_MAX_LINE + 4];
    size_t line_len;
    bool line_cut;
    unsigned lines;
    char killed[160]; /* why kwc killed it; "" if it was not */
};

static double
mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double
wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static struct timeval
tv_of(double s)
{
    if (s < 0)
        s = 0;
    struct timeval tv = {(time_t)s, (suseconds_t)((s - (double)(time_t)s) * 1e6)};
    return tv;
}

static void
fmt_time(double t, char *buf, size_t len)
{
    time_t s = (time_t)t;
    struct tm tm;
    gmtime_r(&s, &tm);
    strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* ---- parsing the plugin's answer ---------------------------------------- */

static int
two(const char *s, int *v)
{
    if (s[0] < '0' || s[0] > '9' || s[1] < '0' || s[1] > '9')
        return -1;
    *v = (s[0] - '0') * 10 + (s[1] - '0');
    return 0;
}

/* RFC 3339 as Go's time.RFC3339 parses it: fractional seconds allowed. */
static int
parse_rfc3339(const char *s, double *out)
{
    int y1, y2, mo, d, h, mi, se, oh = 0, om = 0;
    size_t n = strlen(s), i = 19;
    if (n < 20 || two(s, &y1) || two(s + 2, &y2) || s[4] != '-' || two(s + 5, &mo) || s[7] != '-' ||
        two(s + 8, &d) || (s[10] != 'T' && s[10] != 't') || two(s + 11, &h) || s[13] != ':' ||
        two(s + 14, &mi) || s[16] != ':' || two(s + 17, &se))
        return -1;
    double frac = 0, scale = 0.1;
    if (s[i] == '.') {
        if (!(s[++i] >= '0' && s[i] <= '9'))
            return -1;
        for (; s[i] >= '0' && s[i] <= '9'; i++, scale /= 10)
            frac += (s[i] - '0') * scale;
    }
    int sign = 0;
    if ((s[i] == 'Z' || s[i] == 'z') && i + 1 == n) {
        sign = 0;
    } else if ((s[i] == '+' || s[i] == '-') && i + 6 == n && !two(s + i + 1, &oh) &&
               s[i + 3] == ':' && !two(s + i + 4, &om) && oh < 24 && om < 60) {
        sign = s[i] == '+' ? 1 : -1;
    } else {
        return -1;
    }
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || se > 59)
        return -1;
    struct tm tm = {.tm_year = y1 * 100 + y2 - 1900,
                    .tm_mon = mo - 1,
                    .tm_mday = d,
                    .tm_hour = h,
                    .tm_min = mi,
                    .tm_sec = se};
    time_t t = timegm(&tm);
    *out = (double)t + frac - sign * (oh * 3600 + om * 60);
    return 0;
}

/* A string member of o, or NULL (absent or null); -1 when it is another type. */
static int
opt_str(const json_t *o, const char *key, const char **out)
{
    const json_t *v = json_object_get(o, key);
    *out = NULL;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return -1;
    *out = json_string_value(v);
    return 0;
}

void
excred_cred_free(struct excred_cred *c)
{
    if (!c || atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1)
        return;
    if (c->bearer_line) {
        explicit_bzero(c->bearer_line, strlen(c->bearer_line));
        free(c->bearer_line);
    }
    free(c->cert_pem);
    if (c->key_pem) {
        explicit_bzero(c->key_pem, c->key_pem_len);
        free(c->key_pem);
    }
    X509_free(c->cert);
    EVP_PKEY_free(c->key);
    free(c);
}

static int
cert_pair(struct excred_cred *c, const char *cert, const char *key, char *err, size_t errlen)
{
    c->cert_pem = (unsigned char *)xstrdup(cert);
    c->cert_pem_len = strlen(cert);
    c->key_pem = (unsigned char *)xstrdup(key);
    c->key_pem_len = strlen(key);
    ERR_clear_error();
    BIO *b = BIO_new_mem_buf(c->cert_pem, (int)c->cert_pem_len);
    c->cert = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    b = BIO_new_mem_buf(c->key_pem, (int)c->key_pem_len);
    c->key = b ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    ERR_clear_error();
    if (!c->cert || !c->key)
        return kwc_errf(err, errlen, KWC_EPARSE,
                        "failed parsing client key/certificate: %s is not PEM",
                        !c->cert ? "clientCertificateData" : "clientKeyData");
    if (X509_check_private_key(c->cert, c->key) != 1) {
        ERR_clear_error();
        return kwc_errf(err, errlen, KWC_EPARSE,
                        "failed parsing client key/certificate: clientKeyData does not match "
                        "clientCertificateData");
    }
    return 0;
}

int
excred_parse(const char *out, size_t len, const char *api_version, struct excred_cred **cred,
             char *err, size_t errlen)
{
    json_error_t je;
    struct excred_cred *c = NULL;
    const char *av = NULL, *kind = NULL, *tok = NULL, *cert = NULL, *key = NULL, *exp = NULL;
    int rc = KWC_EPARSE;
    *cred = NULL;
    json_t *j = json_loadb(out, len, 0, &je);
    if (!j) {
        kwc_errf(err, errlen, KWC_EPARSE,
                 "decoding stdout: it is not JSON (%s at byte %d); a plugin prints one "
                 "ExecCredential object",
                 je.text, je.position);
        goto out;
    }
    if (!json_is_object(j) || opt_str(j, "apiVersion", &av) || opt_str(j, "kind", &kind) || !av ||
        !kind) {
        kwc_errf(err, errlen, KWC_EPARSE,
                 "decoding stdout: couldn't get version/kind: a plugin prints a JSON object "
                 "with apiVersion and kind");
        goto out;
    }
    if (strcmp(av, api_version) != 0) {
        kwc_errf(err, errlen, KWC_EPARSE,
                 "exec plugin is configured to use API version %s, plugin returned version %.80s: "
                 "make users[].user.exec.apiVersion what the plugin speaks",
                 api_version, av);
        goto out;
    }
    if (strcmp(kind, "ExecCredential") != 0) {
        kwc_errf(err, errlen, KWC_EPARSE, "decoding stdout: kind %.80s is not ExecCredential",
                 kind);
        goto out;
    }
    json_t *st = json_object_get(j, "status");
    if (!st || json_is_null(st)) {
        kwc_errf(err, errlen, KWC_EPARSE, "exec plugin didn't return a status field");
        goto out;
    }
    if (!json_is_object(st) || opt_str(st, "token", &tok) ||
        opt_str(st, "clientCertificateData", &cert) || opt_str(st, "clientKeyData", &key) ||
        opt_str(st, "expirationTimestamp", &exp)) {
        kwc_errf(err, errlen, KWC_EPARSE,
                 "decoding stdout: status must be an object of strings (token, "
                 "clientCertificateData, clientKeyData, expirationTimestamp)");
        goto out;
    }
    tok = tok && *tok ? tok : NULL;
    cert = cert && *cert ? cert : NULL;
    key = key && *key ? key : NULL;
    if (!tok && !cert && !key) {
        kwc_errf(err, errlen, KWC_EPARSE, "exec plugin didn't return a token or cert/key pair");
        goto out;
    }
    if (!cert != !key) {
        kwc_errf(err, errlen, KWC_EPARSE, "exec plugin returned only certificate or key, not both");
        goto out;
    }
    c = xcalloc(1, sizeof(*c));
    atomic_init(&c->refs, 1);
    if (exp && *exp && parse_rfc3339(exp, &c->expiry) != 0) {
        kwc_errf(err, errlen, KWC_EPARSE,
                 "decoding stdout: status.expirationTimestamp %.64s is not an RFC 3339 time "
                 "(2006-01-02T15:04:05Z)",
                 exp);
        goto out;
    }
    if (tok) {
        for (const char *p = tok; *p; p++)
            if (((unsigned char)*p < 0x20 && *p != '\t') || *p == 0x7f) {
                kwc_errf(err, errlen, KWC_EPARSE,
                         "the plugin's token holds a control character: it cannot be sent in "
                         "an HTTP header");
                goto out;
            }
        c->bearer_line = xasprintf("Authorization: Bearer %s", tok);
    }
    if (cert && cert_pair(c, cert, key, err, errlen) != 0)
        goto out;
    *cred = c;
    c = NULL;
    rc = 0;
out:
    excred_cred_free(c);
    json_decref(j);
    return rc;
}

double
excred_refresh_at(double now, double expiry)
{
    if (expiry <= 0)
        return 0;
    double margin = (expiry - now) / 5;
    if (margin > 300)
        margin = 300;
    return margin > 0 ? expiry - margin : expiry;
}

/* ---- scheduling --------------------------------------------------------- */

static void
schedule(struct excred *x, double delay_s, bool only_sooner)
{
    double at = mono_s() + (delay_s > 0 ? delay_s : 0);
    if (only_sooner && x->next_at && x->next_at <= at)
        return;
    struct timeval tv = tv_of(delay_s);
    x->next_at = at;
    evtimer_add(x->next, &tv);
}

static void
notify(struct excred *x)
{
    if (x->on_change)
        x->on_change(x->change_arg);
}

static void failed(struct excred *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
failed(struct excred *x, const char *fmt, ...)
{
    char msg[sizeof(x->why) - 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    x->failures++;
    unsigned ms = EXEC_BACKOFF_MIN_MS;
    for (unsigned i = 0; i < x->fails_in_row && ms < EXEC_BACKOFF_MAX_MS; i++)
        ms *= 2;
    if (ms > EXEC_BACKOFF_MAX_MS)
        ms = EXEC_BACKOFF_MAX_MS;
    x->fails_in_row++;
    /* jitter of +-10 %: replicas sharing a plugin's backend do not retry in step */
    double delay = ms / 1000.0 * (0.9 + 0.2 * (double)rand() / RAND_MAX);
    pthread_mutex_lock(&x->mu);
    snprintf(x->why, sizeof(x->why), "exec credential plugin %s: %s", x->name, msg);
    /* the credential that had a 401 is all there is: requests go with it */
    bool was_suspect = x->suspect;
    x->suspect = false;
    pthread_mutex_unlock(&x->mu);
    log_warnx("exec credential plugin %s: %s; retrying in %.1fs", x->name, msg, delay);
    schedule(x, delay, false);
    if (was_suspect)
        notify(x);
}

static void
succeeded(struct excred *x, struct excred_cred *c)
{
    double now = wall_s();
    c->gen = ++x->gens;
    pthread_mutex_lock(&x->mu);
    struct excred_cred *old = x->cur;
    x->cur = c;
    x->suspect = false;
    pthread_mutex_unlock(&x->mu);
    excred_cred_free(old); /* freed by whoever holds it last */
    char until[40] = "never", at[40] = "";
    if (c->expiry > 0 && c->expiry <= now) {
        fmt_time(c->expiry, until, sizeof until);
        failed(x, "returned a credential that expired at %s already (is a clock wrong?)", until);
        return;
    }
    x->fails_in_row = 0;
    pthread_mutex_lock(&x->mu);
    x->why[0] = '\0';
    pthread_mutex_unlock(&x->mu);
    if (c->expiry > 0) {
        double r = excred_refresh_at(now, c->expiry);
        fmt_time(c->expiry, until, sizeof until);
        fmt_time(r, at, sizeof at);
        schedule(x, r - now, false);
    } else {
        evtimer_del(x->next);
        x->next_at = 0;
    }
    log_info("exec credential plugin %s: new %s (#%llu), expires %s%s%s", x->name,
             c->bearer_line ? (c->cert ? "token and client certificate" : "token")
                            : "client certificate",
             (unsigned long long)c->gen, until, at[0] ? ", refresh at " : "", at);
    notify(x);
}

/* ---- the child ---------------------------------------------------------- */

static void
close_pipe(struct event **ev, int *fd)
{
    if (*ev) {
        event_free(*ev);
        *ev = NULL;
    }
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

static void
flush_line(struct excred *x)
{
    if (!x->line_len && !x->line_cut)
        return;
    if (x->lines < EXEC_MAX_LINES)
        log_info("exec credential plugin %s: stderr: %.*s%s", x->name, (int)x->line_len, x->line,
                 x->line_cut ? "..." : "");
    else if (x->lines == EXEC_MAX_LINES)
        log_info("exec credential plugin %s: stderr: (more lines not logged)", x->name);
    x->lines++;
    x->line_len = 0;
    x->line_cut = false;
}

static void
run_finished(struct excred *x, int status)
{
    x->pid = 0;
    evtimer_del(x->deadline);
    evtimer_del(x->reap);
    char *out = x->out;
    size_t len = x->out_len;
    x->out = NULL;
    x->out_len = 0;
    char err[400];
    struct excred_cred *c;
    if (x->killed[0])
        failed(x, "%s", x->killed);
    else if (WIFSIGNALED(status))
        failed(x, "was killed by signal %d", WTERMSIG(status));
    else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        failed(x, "failed with exit code %d%s", WEXITSTATUS(status),
               x->lines ? " (its stderr is logged above)" : "");
    else if (excred_parse(out ? out : "", len, x->e->api_version, &c, err, sizeof err) != 0)
        failed(x, "%s", err);
    else
        succeeded(x, c);
    if (out) {
        explicit_bzero(out, len);
        free(out);
    }
}

static void
try_reap(struct excred *x)
{
    int status = 0;
    pid_t r = waitpid(x->pid, &status, WNOHANG);
    if (r == x->pid || (r < 0 && errno == ECHILD)) {
        run_finished(x, r == x->pid ? status : 0);
        return;
    }
    /* exited pipes first, the process a moment later: poll, 1 ms doubling */
    struct timeval tv = {0, (suseconds_t)x->reap_ms * 1000};
    if (x->reap_ms < REAP_POLL_MAX_MS)
        x->reap_ms *= 2;
    evtimer_add(x->reap, &tv);
}

static void
kill_run(struct excred *x, const char *why)
{
    if (!x->killed[0])
        snprintf(x->killed, sizeof(x->killed), "%s", why);
    kill(-x->pid, SIGKILL); /* its own process group: what it started too */
    kill(x->pid, SIGKILL);
    close_pipe(&x->out_ev, &x->out_fd);
    close_pipe(&x->err_ev, &x->err_fd);
    try_reap(x);
}

static void
pipes_check(struct excred *x)
{
    if (x->out_fd < 0 && x->err_fd < 0 && x->pid)
        try_reap(x);
}

/* A read of the plugin's pipe: bytes (> 0), 0 at its end (EOF or an
 * error: the pipe is done), -1 when nothing is there now. */
static ssize_t
pipe_read(int fd, char *buf, size_t len)
{
    for (;;) {
        ssize_t n = read(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return -1;
        return n < 0 ? 0 : n;
    }
}

static void
on_stdout(evutil_socket_t fd, short what, void *arg)
{
    struct excred *x = arg;
    (void)what;
    for (;;) {
        char buf[16384];
        ssize_t n = pipe_read(fd, buf, sizeof(buf));
        if (n < 0)
            return;
        if (n == 0) {
            close_pipe(&x->out_ev, &x->out_fd);
            pipes_check(x);
            return;
        }
        if (x->out_len + (size_t)n > EXEC_MAX_STDOUT) {
            char why[120];
            snprintf(why, sizeof why, "printed more than %u KiB on stdout; killed it",
                     EXEC_MAX_STDOUT >> 10);
            kill_run(x, why);
            return;
        }
        x->out = xrealloc(x->out, x->out_len + (size_t)n + 1);
        memcpy(x->out + x->out_len, buf, (size_t)n);
        x->out_len += (size_t)n;
    }
}

static void
on_stderr(evutil_socket_t fd, short what, void *arg)
{
    struct excred *x = arg;
    (void)what;
    for (;;) {
        char buf[4096];
        ssize_t n = pipe_read(fd, buf, sizeof(buf));
        if (n < 0)
            return;
        if (n == 0) {
            flush_line(x);
            close_pipe(&x->err_ev, &x->err_fd);
            pipes_check(x);
            return;
        }
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] == '\n')
                flush_line(x);
            else if (x->line_len < EXEC_MAX_LINE)
                x->line[x->line_len++] = buf[i];
            else
                x->line_cut = true;
        }
    }
}

static void
on_deadline(evutil_socket_t fd, short what, void *arg)
{
    struct excred *x = arg;
    (void)fd;
    (void)what;
    char why[120];
    snprintf(why, sizeof why,
             "did not finish within %.1fs; killed it (a longer bound: --exec-plugin-timeout)",
             x->e->timeout_ms / 1000.0);
    kill_run(x, why);
}

static void
on_reap(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    try_reap(arg);
}

/* exec.LookPath: a name without '/' is searched in $PATH (an empty entry is
 * the working directory, which Go refuses to run from: exec.ErrDot). */
static int
look_path(const char *cmd, char **out)
{
    if (strchr(cmd, '/')) {
        *out = xstrdup(cmd);
        return 0;
    }
    const char *path = getenv("PATH");
    for (const char *p = path ? path : ""; p && *p;) {
        size_t n = strcspn(p, ":");
        if (n && p[0] == '/') {
            char *cand = xasprintf("%.*s/%s", (int)n, p, cmd);
            struct stat st;
            if (stat(cand, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0111)) {
                *out = cand;
                return 0;
            }
            free(cand);
        }
        p += n;
        p += *p == ':';
    }
    return -ENOENT;
}

/* kwc's environment with the plugin's env and KUBERNETES_EXEC_INFO added;
 * a name given again keeps its last value (Go's exec dedups so). New. */
static char **
make_env(const struct kcfg_exec *e, char **info)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **v = xcalloc(n + e->nenv + 2, sizeof(char *));
    *info = xasprintf("KUBERNETES_EXEC_INFO=%s", e->exec_info);
    size_t k = 0;
    for (size_t i = 0; i <= n + e->nenv; i++) {
        char *s = i < n ? environ[i] : i < n + e->nenv ? e->env[i - n] : *info;
        size_t nl = strcspn(s, "=");
        bool later = false;
        for (size_t j = i + 1; j <= n + e->nenv && !later; j++) {
            const char *t = j < n ? environ[j] : j < n + e->nenv ? e->env[j - n] : *info;
            later = strncmp(s, t, nl) == 0 && t[nl] == '=';
        }
        if (!later)
            v[k++] = s;
    }
    return v;
}

static void
start_run(struct excred *x)
{
    const struct kcfg_exec *e = x->e;
    char *path = NULL, *info = NULL, **env = NULL, **argv = NULL;
    int outp[2] = {-1, -1}, errp[2] = {-1, -1}, rc;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    bool fa_init = false, attr_init = false;

    x->runs++;
    x->last_start = mono_s();
    if (look_path(e->command, &path) != 0) {
        const char *p = getenv("PATH");
        failed(x,
               "executable %s not found on $PATH (%.200s): install it or fix "
               "users[].user.exec.command in the kubeconfig%s%s",
               e->command, p ? p : "unset", e->install_hint ? "; " : "",
               e->install_hint ? e->install_hint : "");
        goto out;
    }
    if (pipe2(outp, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0) {
        failed(x, "cannot make a pipe: %s", strerror(errno));
        goto out;
    }
    argv = xcalloc(e->nargs + 2, sizeof(char *));
    argv[0] = e->command;
    for (size_t i = 0; i < e->nargs; i++)
        argv[i + 1] = e->args[i];
    env = make_env(e, &info);
    posix_spawn_file_actions_init(&fa);
    fa_init = true;
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, outp[1], 1);
    posix_spawn_file_actions_adddup2(&fa, errp[1], 2);
    posix_spawn_file_actions_addclosefrom_np(&fa, 3);
    posix_spawnattr_init(&attr);
    attr_init = true;
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all); /* kwc ignores SIGPIPE; a plugin must not */
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
                                        POSIX_SPAWN_SETPGROUP);
    rc = posix_spawn(&x->pid, path, &fa, &attr, argv, env);
    if (rc != 0) {
        x->pid = 0;
        failed(x, "cannot run %s: %s", path, strerror(rc));
        goto out;
    }
    close(outp[1]);
    close(errp[1]);
    outp[1] = errp[1] = -1;
    x->out_fd = outp[0];
    x->err_fd = errp[0];
    outp[0] = errp[0] = -1;
    fcntl(x->out_fd, F_SETFL, O_NONBLOCK);
    fcntl(x->err_fd, F_SETFL, O_NONBLOCK);
    x->out_ev = event_new(x->base, x->out_fd, EV_READ | EV_PERSIST, on_stdout, x);
    x->err_ev = event_new(x->base, x->err_fd, EV_READ | EV_PERSIST, on_stderr, x);
    event_add(x->out_ev, NULL);
    event_add(x->err_ev, NULL);
    x->killed[0] = '\0';
    x->lines = 0;
    x->line_len = 0;
    x->line_cut = false;
    x->reap_ms = 1;
    struct timeval tv = tv_of(e->timeout_ms / 1000.0);
    evtimer_add(x->deadline, &tv);
    log_debug("exec credential plugin %s: started pid %d", x->name, (int)x->pid);
out:
    for (int i = 0; i < 2; i++) {
        if (outp[i] >= 0)
            close(outp[i]);
        if (errp[i] >= 0)
            close(errp[i]);
    }
    if (fa_init)
        posix_spawn_file_actions_destroy(&fa);
    if (attr_init)
        posix_spawnattr_destroy(&attr);
    free(argv);
    free(env);
    if (info) {
        explicit_bzero(info, strlen(info));
        free(info);
    }
    free(path);
}

static void
on_next(evutil_socket_t fd, short what, void *arg)
{
    struct excred *x = arg;
    (void)fd;
    (void)what;
    assert(x->magic == EXCRED_MAGIC);
    x->next_at = 0;
    if (x->pid)
        return; /* running: its end schedules the next one */
    start_run(x);
}

/* ---- public ------------------------------------------------------------- */

struct excred *
excred_new(struct event_base *base, const struct kcfg_exec *e)
{
    struct excred *x = xcalloc(1, sizeof(*x));
    x->magic = EXCRED_MAGIC;
    x->base = base;
    x->e = e;
    const char *slash = strrchr(e->command, '/');
    x->name = slash ? slash + 1 : e->command;
    x->out_fd = x->err_fd = -1;
    pthread_mutex_init(&x->mu, NULL);
    x->mb = mailbox_new(base);
    x->next = evtimer_new(base, on_next, x);
    x->deadline = evtimer_new(base, on_deadline, x);
    x->reap = evtimer_new(base, on_reap, x);
    snprintf(x->why, sizeof(x->why), "waiting for the exec credential plugin %s", x->name);
    schedule(x, 0, false);
    return x;
}

void
excred_free(struct excred *x)
{
    if (!x)
        return;
    assert(x->magic == EXCRED_MAGIC);
    mailbox_free(x->mb); /* a 401's run asked for: nothing to do any more */
    if (x->pid) {
        kill(-x->pid, SIGKILL);
        kill(x->pid, SIGKILL);
        while (waitpid(x->pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    close_pipe(&x->out_ev, &x->out_fd);
    close_pipe(&x->err_ev, &x->err_fd);
    event_free(x->next);
    event_free(x->deadline);
    event_free(x->reap);
    free(x->out);
    excred_cred_free(x->cur);
    pthread_mutex_destroy(&x->mu);
    x->magic = 0;
    free(x);
}

/* cur if it may be sent now; under mu */
static struct excred_cred *
usable(struct excred *x)
{
    if (!x->cur || x->suspect || (x->cur->expiry > 0 && wall_s() >= x->cur->expiry))
        return NULL;
    return x->cur;
}

const struct excred_cred *
excred_current(struct excred *x)
{
    assert(x->magic == EXCRED_MAGIC);
    pthread_mutex_lock(&x->mu);
    const struct excred_cred *c = usable(x);
    pthread_mutex_unlock(&x->mu);
    return c;
}

struct excred_cred *
excred_acquire(struct excred *x)
{
    assert(x->magic == EXCRED_MAGIC);
    pthread_mutex_lock(&x->mu);
    struct excred_cred *c = usable(x);
    if (c)
        atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
    pthread_mutex_unlock(&x->mu);
    return c;
}

void
excred_on_change(struct excred *x, void (*fn)(void *arg), void *arg)
{
    x->on_change = fn;
    x->change_arg = arg;
}

/* The owner's loop: a 401 made the credential suspect; run the plugin again. */
static void
on_unauthorized(void *arg)
{
    struct excred *x = arg;
    pthread_mutex_lock(&x->mu);
    bool still = x->suspect; /* a run since may have replaced it */
    pthread_mutex_unlock(&x->mu);
    if (still && !x->pid)
        schedule(x, x->last_start + EXEC_MIN_401_MS / 1000.0 - mono_s(), true);
}

void
excred_unauthorized(struct excred *x, uint64_t gen)
{
    assert(x->magic == EXCRED_MAGIC);
    pthread_mutex_lock(&x->mu);
    bool first = x->cur && x->cur->gen == gen && !x->cur->unauthorized;
    if (first) {
        x->cur->unauthorized = true;
        x->suspect = true;
        snprintf(x->why, sizeof(x->why),
                 "the upstream refused the credential of exec plugin %s (401); running it again",
                 x->name);
    }
    pthread_mutex_unlock(&x->mu);
    if (!first)
        return;
    log_warnx("upstream: 401 Unauthorized with credential #%llu of exec credential plugin %s: "
              "running it again",
              (unsigned long long)gen, x->name);
    mailbox_post(x->mb, on_unauthorized, x);
}

void
excred_why(struct excred *x, char *buf, size_t len)
{
    pthread_mutex_lock(&x->mu);
    snprintf(buf, len, "%s",
             x->why[0] ? x->why : "the exec credential plugin's credential expired");
    pthread_mutex_unlock(&x->mu);
}

void
excred_counts(const struct excred *x, uint64_t *runs, uint64_t *failures)
{
    *runs = x->runs;
    *failures = x->failures;
}
