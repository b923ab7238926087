/*
 * datadir.c — lock, check and open the --data-dir (see datadir.h).
 */
#include "kwc/datadir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/dbcheck.h"
#include "kwc/log.h"
#include "kwc/store.h"

int
datadir_policy(const char *s)
{
    if (strcmp(s, "rebuild") == 0)
        return DATADIR_REBUILD;
    if (strcmp(s, "move-aside") == 0)
        return DATADIR_MOVE_ASIDE;
    if (strcmp(s, "fail") == 0)
        return DATADIR_FAIL;
    return -1;
}

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int
fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return KWC_ECONFIG;
}

/* DIR/kwc.lock: flock()ed for the process's life (released by the kernel
 * when it exits, however it exits), holding the owner's pid for the message
 * a second kwc prints. */
static int
take_lock(const char *dir, int *fd_out, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/kwc.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return fail(err, errlen, "data dir %s: cannot open %s: %s", dir, path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char buf[32] = "";
        ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
        close(fd);
        if (e != EWOULDBLOCK)
            return fail(err, errlen, "data dir %s: cannot lock %s: %s", dir, path, strerror(e));
        long pid = n > 0 ? strtol(buf, NULL, 10) : 0;
        if (pid > 0)
            return fail(err, errlen,
                        "data dir %s is in use by pid %ld (one kwc per data dir: stop it, or "
                        "give this one another --data-dir)",
                        dir, pid);
        return fail(err, errlen,
                    "data dir %s is in use by another kwc (one kwc per data dir: stop it, or "
                    "give this one another --data-dir)",
                    dir);
    }
    char pid[32];
    int pl = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)pl, 0) != pl)
        log_warnx("data dir %s: cannot write the pid into %s: %s", dir, path, strerror(errno));
    *fd_out = fd;
    return 0;
}

/* Remove LMDB's files (rebuild), or keep data.mdb under a new name
 * (move-aside). lock.mdb holds only reader slots: always removed. */
static int
set_aside(const char *dir, enum datadir_on_corrupt policy, char *kept, size_t keptlen)
{
    char data[4096], lock[4096];
    snprintf(data, sizeof(data), "%s/data.mdb", dir);
    snprintf(lock, sizeof(lock), "%s/lock.mdb", dir);
    kept[0] = '\0';
    if (policy == DATADIR_MOVE_ASIDE) {
        char stamp[32];
        time_t t = time(NULL);
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm);
        snprintf(kept, keptlen, "%s/data.mdb.corrupt-%s", dir, stamp);
        if (rename(data, kept) != 0 && errno != ENOENT)
            return -errno;
    } else if (unlink(data) != 0 && errno != ENOENT) {
        return -errno;
    }
    if (unlink(lock) != 0 && errno != ENOENT)
        return -errno;
    return 0;
}

struct progress {
    const char *dir;
};

/* mkdir -p, 0700: missing parents too (errno set on failure). */
static int
mkdir_parents(const char *dir)
{
    char *p = xstrdup(dir);
    int rc = 0;
    for (char *s = p + 1; *s && rc == 0; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0700) != 0 && errno != EEXIST)
            rc = -1;
        *s = '/';
    }
    if (rc == 0 && mkdir(p, 0700) != 0 && errno != EEXIST)
        rc = -1;
    free(p);
    return rc;
}

static void
on_check_progress(uint64_t done, uint64_t total, void *arg)
{
    const struct progress *p = arg;
    log_info("data dir %s: checking the file: %.0f of %.0f MB", p->dir, done / 1e6, total / 1e6);
}

static void
on_verify_progress(void *arg, uint64_t done)
{
    const struct progress *p = arg;
    log_info("data dir %s: checking values: %.0f MB", p->dir, done / 1e6);
}

/* The structure, then (with the store open) every value: 0, or KWC_ECORRUPT /
 * KWC_EFORMAT with why filled; other errors as they come. */
static int
check(const char *dir, const struct store_options *so, struct store **st, char *why, size_t len)
{
    struct dbcheck_stats ds;
    struct progress pr = {dir};
    int rc = dbcheck_dir(dir, on_check_progress, &pr, &ds, why, len);
    if (rc)
        return rc;
    if ((rc = store_open(dir, so, st)) != 0) {
        snprintf(why, len, "LMDB cannot open it: %s", kwc_strerror(rc));
        return rc == -EINVAL || rc == KWC_ESTORE ? KWC_ECORRUPT : rc;
    }
    if ((rc = store_verify(*st, on_verify_progress, &pr, why, len)) != 0) {
        store_close(*st);
        *st = NULL;
    }
    return rc;
}

int
datadir_open(const char *dir, const struct store_options *so, enum datadir_on_corrupt policy,
             struct datadir *d, char *err, size_t errlen)
{
    d->lock_fd = -1;
    d->st = NULL;
    if (mkdir_parents(dir) != 0)
        return fail(err, errlen, "--data-dir %s: cannot create it: %s", dir, strerror(errno));
    int rc = take_lock(dir, &d->lock_fd, err, errlen);
    if (rc)
        return rc;
    char why[1024] = "";
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = check(dir, so, &d->st, why, sizeof(why));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc == 0) {
        log_debug("data dir %s: checked in %.2f s", dir,
                  (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
        return 0;
    }
    if (rc != KWC_ECORRUPT && rc != KWC_EFORMAT) {
        datadir_close(d);
        return fail(err, errlen, "--data-dir %s: cannot open the cache: %s%s", dir,
                    why[0] ? why : kwc_strerror(rc),
                    rc == -ENOMEM ? " (the address space for --cache-map-size may be unavailable: "
                                    "lower it)"
                                  : "");
    }
    if (rc == KWC_ECORRUPT && policy == DATADIR_FAIL) {
        datadir_close(d);
        return fail(err, errlen,
                    "data dir %s is damaged: %s (--on-corrupt-cache=fail: move %s/data.mdb away, "
                    "or start with --on-corrupt-cache=rebuild)",
                    dir, why, dir);
    }
    char kept[4200];
    bool format = rc == KWC_EFORMAT;
    enum datadir_on_corrupt how = format ? DATADIR_REBUILD : policy;
    if ((rc = set_aside(dir, how, kept, sizeof(kept))) != 0) {
        datadir_close(d);
        return fail(err, errlen, "data dir %s is damaged (%s) and cannot be cleared: %s", dir, why,
                    kwc_strerror(rc));
    }
    if (how == DATADIR_MOVE_ASIDE)
        log_error("data dir %s is damaged: %s; kept it as %s and starting empty: every cache "
                  "lists again from the upstream (--on-corrupt-cache=move-aside)",
                  dir, why, kept);
    else if (format)
        log_warnx("data dir %s: %s; starting empty: every cache lists again from the upstream", dir,
                  why);
    else
        log_error("data dir %s is damaged: %s; wiped it and starting empty: every cache lists "
                  "again from the upstream (--on-corrupt-cache=rebuild)",
                  dir, why);
    if ((rc = store_open(dir, so, &d->st)) != 0) {
        datadir_close(d);
        return fail(err, errlen, "--data-dir %s: cannot open the cache: %s", dir, kwc_strerror(rc));
    }
    return 0;
}

void
datadir_release_lock(struct datadir *d)
{
    if (d->lock_fd >= 0)
        close(d->lock_fd);
    d->lock_fd = -1;
}

int
datadir_retake_lock(const char *dir, struct datadir *d, char *err, size_t errlen)
{
    if (d->lock_fd >= 0)
        return 0;
    return take_lock(dir, &d->lock_fd, err, errlen);
}

void
datadir_close(struct datadir *d)
{
    store_close(d->st);
    d->st = NULL;
    if (d->lock_fd >= 0)
        close(d->lock_fd); /* releases the flock */
    d->lock_fd = -1;
}
