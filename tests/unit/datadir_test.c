/*
 * datadir_test.c — proxy/ops/datadir.c: taking a --data-dir at start
 * (include/kwc/datadir.h).
 *
 * Every case runs in a fresh /tmp/kwc-datadir-XXXXXX directory (removed with
 * everything under it). What the header promises, one case each:
 *   - the policy names;
 *   - a missing dir (and its missing parents) is created 0700, locked, its
 *     kwc.lock (0600) holds this process's pid, and the store opens;
 *   - a dir already taken is refused naming the holder's pid: by a second
 *     datadir_open of this process (flock locks belong to the open file, so
 *     the same process is refused as a second kwc is), by a child process
 *     (fork: it holds the dir until the test lets it go, through a pipe), by
 *     a holder that wrote no pid; closing releases it;
 *   - a good dir opens with its data; a stale pid in kwc.lock is replaced;
 *   - a damaged dir (a truncated file: dbcheck; a flipped value byte:
 *     store_verify; a file that is no LMDB) is refused under fail and left
 *     alone, wiped under rebuild, kept as data.mdb.corrupt-TIME under
 *     move-aside, each starting empty;
 *   - a dir of another kwc format is wiped under every policy, fail too;
 *   - what cannot be created, locked or opened is refused with the reason.
 * What datadir logs goes to a temp file (fd 2 redirected for the call), so
 * that the lines the header names can be checked. No sleeps: the child
 * process is waited for through pipes and waitpid.
 */
#include "kwc/datadir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/log.h"
#include "kwc/store.h"
#include "lmdbdir.h"
#include "tap.h"

static char top[256]; /* this case's scratch dir */

static int
rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(p);
}

static void
fresh(void)
{
    lmdbdir_make(top, sizeof top, "datadir");
}

static void
rm_top(void)
{
    nftw(top, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static struct store_options
opts(void)
{
    struct store_options o;
    store_options_default(&o);
    o.map_size = 16 << 20;
    return o;
}

/* ---- fd 2 into a temp file for one call ---- */

static int saved_err = -1, cap_fd = -1;

static void
cap_begin(void)
{
    char p[] = "/tmp/kwc-datadir-log-XXXXXX";
    cap_fd = mkstemp(p);
    if (cap_fd < 0)
        abort();
    unlink(p);
    fflush(stderr);
    saved_err = dup(2);
    dup2(cap_fd, 2);
}

/* What was logged since cap_begin (static buffer). */
static const char *
cap_end(void)
{
    static char buf[16384];
    dup2(saved_err, 2);
    close(saved_err);
    ssize_t n = pread(cap_fd, buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    close(cap_fd);
    return buf;
}

/* ---- the data ---- */

/* n objects "ns/oI" at rv 1..n into resource v1/configmaps:json. */
static void
put_objects(struct store *st, int n)
{
    struct store_res *r;
    if (store_res(st, "v1/configmaps:json", &r) != 0)
        abort();
    struct store_wtxn *w;
    if (store_wtxn_begin(st, 1, &w) != 0)
        abort();
    for (int i = 1; i <= n; i++) {
        char key[32], obj[96];
        snprintf(key, sizeof key, "ns/o%d", i);
        snprintf(obj, sizeof obj, "{\"metadata\":{\"name\":\"o%d\",\"marker\":\"MARKER-%04d\"}}", i,
                 i);
        struct store_event ev = {.type = STORE_ADDED,
                                 .rv = (uint64_t)i,
                                 .key = key,
                                 .key_len = strlen(key),
                                 .obj = obj,
                                 .obj_len = strlen(obj)};
        if (store_wtxn_event(w, r, &ev) != 0)
            abort();
    }
    if (store_wtxn_commit(w) != 0)
        abort();
}

/* Objects of v1/configmaps:json in st (-1 on a read error). */
static long
objects(struct store *st)
{
    struct store_res *r;
    struct store_rtxn *t;
    struct store_res_info info;
    if (store_res(st, "v1/configmaps:json", &r) != 0 || store_rtxn_begin(st, &t) != 0)
        return -1;
    int rc = store_info(t, r, &info);
    store_rtxn_end(t);
    return rc == 0 ? (long)info.objects : -1;
}

/* A dir with n objects, closed: DIR's data.mdb is what a kwc left. */
static void
make_good(const char *dir, int n)
{
    struct store_options o = opts();
    struct datadir d;
    char err[512];
    if (datadir_open(dir, &o, DATADIR_FAIL, &d, err, sizeof err) != 0)
        abort();
    put_objects(d.st, n);
    datadir_close(&d);
}

static off_t
file_size(const char *dir, const char *name)
{
    char p[1024];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &sb) == 0 ? sb.st_size : -1;
}

static char *
slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = xmalloc((size_t)n + 1);
    size_t got = fread(b, 1, (size_t)n, f);
    fclose(f);
    b[got] = '\0';
    *len = got;
    return b;
}

/* The names in dir starting with prefix: how many; the first into out. */
static int
count_prefixed(const char *dir, const char *prefix, char *out, size_t outlen)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            if (n++ == 0 && out)
                snprintf(out, outlen, "%s", e->d_name);
        }
    closedir(d);
    return n;
}

/* The lock file's text. */
static void
lock_text(const char *dir, char *out, size_t len)
{
    char p[512];
    snprintf(p, sizeof p, "%s/kwc.lock", dir);
    size_t n;
    char *b = slurp(p, &n);
    snprintf(out, len, "%s", b ? b : "(none)");
    free(b);
}

/* ---- the cases ---- */

static void
test_policy(void)
{
    is_int(datadir_policy("rebuild"), DATADIR_REBUILD, "rebuild");
    is_int(datadir_policy("move-aside"), DATADIR_MOVE_ASIDE, "move-aside");
    is_int(datadir_policy("fail"), DATADIR_FAIL, "fail");
    is_int(datadir_policy(""), -1, "empty: -1");
    is_int(datadir_policy("Rebuild"), -1, "case matters: -1");
    is_int(datadir_policy("move_aside"), -1, "move_aside: -1");
    is_int(datadir_policy("failx"), -1, "a longer word: -1");
}

static void
test_fresh(void)
{
    fresh();
    char dir[512], parent[400];
    snprintf(parent, sizeof parent, "%s/a/b", top);
    snprintf(dir, sizeof dir, "%s/data", parent);
    struct store_options o = opts();
    struct datadir d = {.lock_fd = 99, .st = NULL};
    char err[512] = "";
    is_int(datadir_open(dir, &o, DATADIR_FAIL, &d, err, sizeof err), 0, "a missing dir opens");
    if (err[0])
        printf("# %s\n", err);
    ok(d.st != NULL, "...with its store");
    ok(d.lock_fd >= 0, "...and the lock's fd");
    struct stat sb;
    ok(stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode), "the dir was created");
    is_int(sb.st_mode & 07777, 0700, "...0700");
    ok(stat(parent, &sb) == 0 && S_ISDIR(sb.st_mode), "its missing parents too");
    is_int(sb.st_mode & 07777, 0700, "...0700");
    char lp[600];
    snprintf(lp, sizeof lp, "%s/kwc.lock", dir);
    ok(stat(lp, &sb) == 0 && S_ISREG(sb.st_mode), "kwc.lock made");
    is_int(sb.st_mode & 07777, 0600, "...0600");
    char want[32], got[64];
    snprintf(want, sizeof want, "%ld\n", (long)getpid());
    lock_text(dir, got, sizeof got);
    is_str(got, want, "kwc.lock holds this process's pid");
    is_int(objects(d.st), 0, "the store is empty");
    put_objects(d.st, 3);
    is_int(objects(d.st), 3, "...and takes writes");
    ok(file_size(dir, "data.mdb") > 0, "data.mdb is in the dir");
    datadir_close(&d);
    is_int(d.lock_fd, -1, "datadir_close: lock_fd -1");
    ok(d.st == NULL, "datadir_close: st NULL");
    datadir_close(&d); /* twice: harmless */
    rm_top();
}

static void
test_existing(void)
{
    fresh();
    make_good(top, 5);
    /* a stale pid, longer than ours, from a kwc that died */
    char lp[512];
    snprintf(lp, sizeof lp, "%s/kwc.lock", top);
    FILE *f = fopen(lp, "w");
    fputs("1234567890123456789\nleft over\n", f);
    fclose(f);
    struct store_options o = opts();
    struct datadir d;
    char err[512] = "";
    cap_begin();
    int rc = datadir_open(top, &o, DATADIR_FAIL, &d, err, sizeof err);
    const char *logged = cap_end();
    is_int(rc, 0, "a good dir opens under fail");
    is_int(objects(d.st), 5, "...with its objects");
    char want[32], got[64];
    snprintf(want, sizeof want, "%ld\n", (long)getpid());
    lock_text(top, got, sizeof got);
    is_str(got, want, "the stale pid is replaced by ours, nothing left of it");
    ok(!strstr(logged, "damaged") && !strstr(logged, "starting empty"),
       "nothing said about damage");
    is_int(count_prefixed(top, "data.mdb.corrupt", NULL, 0), 0, "nothing moved aside");
    datadir_close(&d);
    rm_top();
}

static void
test_in_use_same_process(void)
{
    fresh();
    struct store_options o = opts();
    struct datadir d1, d2 = {.lock_fd = 77, .st = (struct store *)&d1};
    char err[512] = "";
    is_int(datadir_open(top, &o, DATADIR_REBUILD, &d1, err, sizeof err), 0, "the first open");
    put_objects(d1.st, 2);
    is_int(datadir_open(top, &o, DATADIR_REBUILD, &d2, err, sizeof err), KWC_ECONFIG,
           "a second open of the same dir: KWC_ECONFIG");
    char want[1024];
    snprintf(want, sizeof want,
             "data dir %s is in use by pid %ld (one kwc per data dir: stop it, or give this one "
             "another --data-dir)",
             top, (long)getpid());
    is_str(err, want, "...naming the holder's pid");
    is_int(d2.lock_fd, -1, "...no lock fd");
    ok(d2.st == NULL, "...no store");
    is_int(objects(d1.st), 2, "the holder's store is untouched");
    char got[64];
    snprintf(want, sizeof want, "%ld\n", (long)getpid());
    lock_text(top, got, sizeof got);
    is_str(got, want, "kwc.lock still holds the holder's pid");
    datadir_close(&d1);
    is_int(datadir_open(top, &o, DATADIR_REBUILD, &d2, err, sizeof err), 0,
           "once closed, the dir opens again");
    is_int(objects(d2.st), 2, "...with the data");
    datadir_close(&d2);
    rm_top();
}

static void
test_in_use_other_process(void)
{
    fresh();
    int up[2], down[2]; /* child -> parent: "locked"; parent -> child: "go" (close) */
    if (pipe(up) != 0 || pipe(down) != 0)
        abort();
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        abort();
    if (pid == 0) {
        close(up[0]);
        close(down[1]);
        struct store_options o = opts();
        struct datadir d;
        char err[512];
        char c = datadir_open(top, &o, DATADIR_FAIL, &d, err, sizeof err) == 0 ? 'L' : 'E';
        if (write(up[1], &c, 1) != 1)
            _exit(2);
        char x;
        while (read(down[0], &x, 1) > 0) /* until the parent closes its end */
            ;
        datadir_close(&d);
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    char c = 0;
    is_int(read(up[0], &c, 1), 1, "the child said");
    is_int(c, 'L', "...it holds the dir");
    struct store_options o = opts();
    struct datadir d;
    char err[512] = "", want[1024];
    is_int(datadir_open(top, &o, DATADIR_FAIL, &d, err, sizeof err), KWC_ECONFIG,
           "another process's dir: KWC_ECONFIG");
    snprintf(want, sizeof want,
             "data dir %s is in use by pid %ld (one kwc per data dir: stop it, or give this one "
             "another --data-dir)",
             top, (long)pid);
    is_str(err, want, "...naming the child's pid");
    close(down[1]);
    int status = -1;
    is_int(waitpid(pid, &status, 0), pid, "the child ended");
    ok(WIFEXITED(status) && WEXITSTATUS(status) == 0, "...cleanly");
    close(up[0]);
    is_int(datadir_open(top, &o, DATADIR_FAIL, &d, err, sizeof err), 0,
           "its lock went with it: the dir opens");
    datadir_close(&d);
    rm_top();
}

static void
test_in_use_no_pid(void)
{
    fresh();
    char lp[512];
    snprintf(lp, sizeof lp, "%s/kwc.lock", top);
    int fd = open(lp, O_RDWR | O_CREAT, 0600);
    ok(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0, "a holder that wrote no pid");
    struct store_options o = opts();
    struct datadir d;
    char err[512] = "", want[1024];
    is_int(datadir_open(top, &o, DATADIR_FAIL, &d, err, sizeof err), KWC_ECONFIG,
           "refused: KWC_ECONFIG");
    snprintf(want, sizeof want,
             "data dir %s is in use by another kwc (one kwc per data dir: stop it, or give this "
             "one another --data-dir)",
             top);
    is_str(err, want, "...by another kwc, without a pid");
    close(fd);
    rm_top();
}

/* Damage: truncate data.mdb to 2 pages (LMDB's metas alone). */
static void
damage_truncate(const char *dir)
{
    char p[512];
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    if (truncate(p, 2 * sysconf(_SC_PAGESIZE)) != 0)
        abort();
}

/* Damage: flip a byte of every copy of the marker of object 1 (a value's
 * checksum then fails; dbcheck sees no structural fault). */
static void
damage_value(const char *dir)
{
    char p[512];
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    size_t n;
    char *b = slurp(p, &n);
    int found = 0;
    for (size_t i = 0; i + 11 <= n; i++)
        if (memcmp(b + i, "MARKER-0001", 11) == 0) {
            b[i + 3] ^= 1;
            found++;
        }
    if (!found)
        abort();
    FILE *f = fopen(p, "r+b");
    fwrite(b, 1, n, f);
    fclose(f);
    free(b);
}

/* Damage: a data.mdb that is no LMDB file at all. */
static void
damage_foreign(const char *dir)
{
    char p[512];
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    FILE *f = fopen(p, "wb");
    for (int i = 0; i < 4096; i++)
        fputs("not an LMDB file ", f);
    fclose(f);
}

struct damage {
    const char *name;
    void (*fn)(const char *dir);
};

static const struct damage damages[] = {
    {"a truncated file", damage_truncate},
    {"a flipped value byte", damage_value},
    {"a file that is no LMDB", damage_foreign},
};

static void
test_damaged_fail(void)
{
    for (size_t k = 0; k < sizeof damages / sizeof damages[0]; k++) {
        tap_group = damages[k].name;
        fresh();
        make_good(top, 4);
        damages[k].fn(top);
        char p[512];
        snprintf(p, sizeof p, "%s/data.mdb", top);
        size_t n0, n1;
        char *before = slurp(p, &n0);
        struct store_options o = opts();
        struct datadir d = {.lock_fd = 55};
        char err[1024] = "", want[600];
        cap_begin();
        int rc = datadir_open(top, &o, DATADIR_FAIL, &d, err, sizeof err);
        cap_end();
        is_int(rc, KWC_ECONFIG, "fail: refused with KWC_ECONFIG");
        snprintf(want, sizeof want, "data dir %s is damaged: ", top);
        ok(strncmp(err, want, strlen(want)) == 0, "...\"data dir DIR is damaged: \"");
        snprintf(want, sizeof want,
                 " (--on-corrupt-cache=fail: move %s/data.mdb away, or start with "
                 "--on-corrupt-cache=rebuild)",
                 top);
        ok(strlen(err) > strlen(want) && strcmp(err + strlen(err) - strlen(want), want) == 0,
           "...saying what to do");
        printf("# %s\n", err);
        is_int(d.lock_fd, -1, "...no lock fd");
        ok(d.st == NULL, "...no store");
        char *after = slurp(p, &n1);
        ok(before && after && n0 == n1 && memcmp(before, after, n0) == 0,
           "data.mdb is left as it was");
        free(before);
        free(after);
        is_int(count_prefixed(top, "data.mdb.corrupt", NULL, 0), 0, "nothing moved aside");
        /* the lock was released: another policy takes the dir now */
        cap_begin();
        rc = datadir_open(top, &o, DATADIR_REBUILD, &d, err, sizeof err);
        cap_end();
        is_int(rc, 0, "the lock was released: rebuild opens it");
        datadir_close(&d);
        rm_top();
    }
}

static void
test_damaged_rebuild(void)
{
    for (size_t k = 0; k < sizeof damages / sizeof damages[0]; k++) {
        tap_group = damages[k].name;
        fresh();
        make_good(top, 4);
        damages[k].fn(top);
        struct store_options o = opts();
        struct datadir d;
        char err[1024] = "", want[600];
        cap_begin();
        int rc = datadir_open(top, &o, DATADIR_REBUILD, &d, err, sizeof err);
        const char *logged = cap_end();
        is_int(rc, 0, "rebuild: opens");
        if (rc)
            printf("# %s\n", err);
        is_int(rc == 0 ? objects(d.st) : -1, 0, "...empty");
        char why[256];
        is_int(rc == 0 ? store_verify(d.st, NULL, NULL, why, sizeof why) : -1, 0,
               "...and sound (store_verify)");
        is_int(count_prefixed(top, "data.mdb.corrupt", NULL, 0), 0, "nothing kept aside");
        snprintf(want, sizeof want, "error data dir %s is damaged: ", top);
        ok(strstr(logged, want) != NULL, "logged at error: the dir is damaged");
        ok(strstr(logged, "; wiped it and starting empty: every cache lists again from the "
                          "upstream (--on-corrupt-cache=rebuild)\n") != NULL,
           "...wiped, starting empty");
        if (rc == 0) {
            put_objects(d.st, 1);
            is_int(objects(d.st), 1, "the new store takes writes");
        }
        datadir_close(&d);
        rm_top();
    }
}

static void
test_damaged_move_aside(void)
{
    for (size_t k = 0; k < sizeof damages / sizeof damages[0]; k++) {
        tap_group = damages[k].name;
        fresh();
        make_good(top, 4);
        damages[k].fn(top);
        char p[512];
        snprintf(p, sizeof p, "%s/data.mdb", top);
        size_t n0, n1;
        char *before = slurp(p, &n0);
        struct store_options o = opts();
        struct datadir d;
        char err[1024] = "", kept[256] = "", want[1024];
        cap_begin();
        int rc = datadir_open(top, &o, DATADIR_MOVE_ASIDE, &d, err, sizeof err);
        const char *logged = cap_end();
        is_int(rc, 0, "move-aside: opens");
        is_int(rc == 0 ? objects(d.st) : -1, 0, "...empty");
        is_int(count_prefixed(top, "data.mdb.corrupt-", kept, sizeof kept), 1,
               "one data.mdb.corrupt-TIME");
        /* TIME: %Y%m%dT%H%M%SZ */
        const char *t = kept + strlen("data.mdb.corrupt-");
        ok(strlen(t) == 16 && t[8] == 'T' && t[15] == 'Z' && strspn(t, "0123456789") == 8 &&
               strspn(t + 9, "0123456789") == 6,
           "...named by a UTC time");
        char kp[600];
        snprintf(kp, sizeof kp, "%s/%s", top, kept);
        char *after = slurp(kp, &n1);
        ok(before && after && n0 == n1 && memcmp(before, after, n0) == 0,
           "...holding the damaged file's bytes");
        free(before);
        free(after);
        snprintf(want, sizeof want, "; kept it as %s and starting empty", kp);
        ok(strstr(logged, "error data dir ") && strstr(logged, want) &&
               strstr(logged, "(--on-corrupt-cache=move-aside)\n"),
           "logged at error: kept as that name, starting empty");
        datadir_close(&d);
        rm_top();
    }
}

/* A meta record of an older kwc format (version 1 first), put with a raw
 * LMDB transaction beside a good resource. */
static void
put_old_format(const char *dir)
{
    MDB_env *env;
    MDB_txn *t;
    MDB_dbi dbi;
    unsigned char rec[576] = {0};
    uint32_t version = 1;
    memcpy(rec, &version, 4);
    MDB_val k = {11, (void *)(uintptr_t) "v1/old:json"}, v = {sizeof rec, rec};
    if (mdb_env_create(&env) || mdb_env_set_maxdbs(env, 64) || mdb_env_set_mapsize(env, 16 << 20) ||
        mdb_env_open(env, dir, 0, 0600) || mdb_txn_begin(env, NULL, 0, &t) ||
        mdb_dbi_open(t, "meta", MDB_CREATE, &dbi) || mdb_put(t, dbi, &k, &v, 0) ||
        mdb_txn_commit(t))
        abort();
    mdb_env_close(env);
}

static void
test_other_format(void)
{
    static const struct {
        const char *name;
        enum datadir_on_corrupt p;
    } pol[] = {
        {"fail", DATADIR_FAIL}, {"rebuild", DATADIR_REBUILD}, {"move-aside", DATADIR_MOVE_ASIDE}};
    for (size_t k = 0; k < 3; k++) {
        tap_group = pol[k].name;
        fresh();
        make_good(top, 3);
        put_old_format(top);
        struct store_options o = opts();
        struct datadir d;
        char err[1024] = "", want[600];
        cap_begin();
        int rc = datadir_open(top, &o, pol[k].p, &d, err, sizeof err);
        const char *logged = cap_end();
        is_int(rc, 0, "another kwc format: opens under every policy");
        if (rc)
            printf("# %s\n", err);
        is_int(rc == 0 ? objects(d.st) : -1, 0, "...wiped: the good resource too");
        char why[256] = "";
        is_int(rc == 0 ? store_verify(d.st, NULL, NULL, why, sizeof why) : -1, 0,
               "...nothing of the old format left");
        is_int(count_prefixed(top, "data.mdb.corrupt", NULL, 0), 0, "...nothing kept aside");
        snprintf(want, sizeof want, "warn  data dir %s: ", top);
        ok(strstr(logged, want) && strstr(logged, "another kwc format") &&
               strstr(logged, "; starting empty: every cache lists again from the upstream\n"),
           "logged as a warning, not a damage");
        ok(!strstr(logged, "damaged"), "...never called damaged");
        datadir_close(&d);
        rm_top();
    }
}

static void
test_cannot(void)
{
    fresh();
    struct store_options o = opts();
    struct datadir d = {.lock_fd = 66};
    char err[1024] = "", dir[512], want[2048];

    /* a parent that is a file */
    snprintf(dir, sizeof dir, "%s/file", top);
    FILE *f = fopen(dir, "w");
    fclose(f);
    snprintf(dir, sizeof dir, "%s/file/data", top);
    is_int(datadir_open(dir, &o, DATADIR_REBUILD, &d, err, sizeof err), KWC_ECONFIG,
           "a parent that is a file: KWC_ECONFIG");
    snprintf(want, sizeof want, "--data-dir %s: cannot create it: %s", dir, strerror(ENOTDIR));
    is_str(err, want, "...cannot create it, and why");
    is_int(d.lock_fd, -1, "...no lock fd");

    /* kwc.lock that cannot be opened for writing (a directory) */
    snprintf(dir, sizeof dir, "%s/lockdir", top);
    char lp[600];
    snprintf(lp, sizeof lp, "%s/kwc.lock", dir);
    if (mkdir(dir, 0700) != 0 || mkdir(lp, 0700) != 0)
        abort();
    is_int(datadir_open(dir, &o, DATADIR_REBUILD, &d, err, sizeof err), KWC_ECONFIG,
           "kwc.lock not openable: KWC_ECONFIG");
    snprintf(want, sizeof want, "data dir %s: cannot open %s: %s", dir, lp, strerror(EISDIR));
    is_str(err, want, "...naming the lock file and why");
    rmdir(lp);

    /* data.mdb that cannot be read (a directory): not a damage, not wiped */
    snprintf(dir, sizeof dir, "%s/mdbdir", top);
    char mp[600];
    snprintf(mp, sizeof mp, "%s/data.mdb", dir);
    if (mkdir(dir, 0700) != 0 || mkdir(mp, 0700) != 0)
        abort();
    cap_begin();
    int rc = datadir_open(dir, &o, DATADIR_REBUILD, &d, err, sizeof err);
    cap_end();
    is_int(rc, KWC_ECONFIG, "data.mdb unreadable: KWC_ECONFIG even under rebuild");
    snprintf(want, sizeof want, "--data-dir %s: cannot open the cache: ", dir);
    ok(strncmp(err, want, strlen(want)) == 0, "...cannot open the cache");
    printf("# %s\n", err);
    struct stat sb;
    ok(stat(mp, &sb) == 0 && S_ISDIR(sb.st_mode), "...and nothing removed");
    is_int(d.lock_fd, -1, "...no lock fd");
    ok(d.st == NULL, "...no store");
    rmdir(mp);
    is_int(datadir_open(dir, &o, DATADIR_REBUILD, &d, err, sizeof err), 0,
           "the lock was released: the dir opens once it is fixed");
    datadir_close(&d);
    rm_top();
}

int
main(void)
{
    log_set_level(LOG_WARN); /* the progress lines (info) stay out of the output */
    TAP_RUN(test_policy);
    TAP_RUN(test_fresh);
    TAP_RUN(test_existing);
    TAP_RUN(test_in_use_same_process);
    TAP_RUN(test_in_use_other_process);
    TAP_RUN(test_in_use_no_pid);
    TAP_RUN(test_damaged_fail);
    TAP_RUN(test_damaged_rebuild);
    TAP_RUN(test_damaged_move_aside);
    TAP_RUN(test_other_format);
    TAP_RUN(test_cannot);
    return tap_done();
}
