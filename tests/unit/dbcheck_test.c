/*
 * dbcheck_test.c — cache/dbcheck.c against real LMDB files: an environment
 * written with liblmdb (several named DBs, thousands of records, values big
 * enough for overflow pages, deletes so the free list is not empty), then
 * damaged in known ways. The pages to damage are found by a small walker of
 * this file's own (not by guessing offsets, and not with the code under test).
 *
 * A flipped byte inside a value is not structurally visible and is not tested
 * as if it were: kwc's per-value checksums cover values.
 */
#include <fcntl.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/dbcheck.h"
#include "lmdbdir.h"
#include "tap.h"

#define NDBS 4
#define NREC 3000

static char dir[256];
static unsigned char *file;
static size_t file_len;
static uint64_t want_entries;

static void
must(int rc, const char *what)
{
    if (rc) {
        fprintf(stderr, "%s: %s\n", what, mdb_strerror(rc));
        abort();
    }
}

static uint32_t rng_state = 12345;

static uint32_t
rnd(void)
{
    rng_state = rng_state * 1103515245u + 12345u;
    return rng_state >> 8;
}

/* Writes the environment in several transactions; returns the records left. */
static uint64_t
build_env(const char *d)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi[NDBS];
    static const char *names[NDBS] = {"meta", "objs/pods", "hist/pods", "objs/configmaps"};
    static char val[20000];
    uint64_t n = 0;

    for (size_t i = 0; i < sizeof(val); i++)
        val[i] = (char)('a' + i % 26);
    must(mdb_env_create(&env), "create");
    must(mdb_env_set_mapsize(env, 256u << 20), "mapsize");
    must(mdb_env_set_maxdbs(env, 16), "maxdbs");
    must(mdb_env_open(env, d, MDB_NOSYNC, 0600), "open");
    must(mdb_txn_begin(env, NULL, 0, &txn), "begin");
    for (int i = 0; i < NDBS; i++)
        must(mdb_dbi_open(txn, names[i], MDB_CREATE, &dbi[i]), "dbi");
    must(mdb_txn_commit(txn), "commit");

    for (int batch = 0; batch < 6; batch++) {
        must(mdb_txn_begin(env, NULL, 0, &txn), "begin");
        for (int i = batch * (NREC / 6); i < (batch + 1) * (NREC / 6); i++) {
            for (int k = 0; k < NDBS; k++) {
                char key[64];
                snprintf(key, sizeof key, "ns-%d/object-%05d", i % 7, (i * 37) % NREC);
                /* every 17th value needs overflow pages */
                size_t len = i % 17 == 0 ? 5000 + (size_t)(i % 5) * 3000 : 40 + (size_t)(i % 90);
                MDB_val kv = {strlen(key), key}, dv = {len, val};
                must(mdb_put(txn, dbi[k], &kv, &dv, 0), "put");
                n++;
            }
        }
        must(mdb_txn_commit(txn), "commit");
    }
    /* deletes and rewrites: the free list fills up */
    for (int round = 0; round < 3; round++) {
        must(mdb_txn_begin(env, NULL, 0, &txn), "begin");
        for (int i = round; i < NREC; i += 5) {
            char key[64];
            snprintf(key, sizeof key, "ns-%d/object-%05d", i % 7, (i * 37) % NREC);
            MDB_val kv = {strlen(key), key};
            int rc = mdb_del(txn, dbi[1 + round % 3], &kv, NULL);
            if (rc == 0)
                n--;
            else if (rc != MDB_NOTFOUND)
                must(rc, "del");
        }
        must(mdb_txn_commit(txn), "commit");
    }
    mdb_env_close(env);
    return n;
}

static void
read_file(const char *path, unsigned char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        abort();
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = xmalloc(*len);
    if (fread(*out, 1, *len, f) != *len)
        abort();
    fclose(f);
}

static void
write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len)
        abort();
    fclose(f);
}

/* ---- the test's own walker: where the pages of each kind are ---- */

struct found {
    uint64_t branch, leaf, overflow;
    size_t psize;
    uint64_t last_pg;
    unsigned char *is_tree; /* a tree page or the first page of an overflow run */
};

static uint64_t
u64_at(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static unsigned
u16_at(const unsigned char *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static void
find_walk(const unsigned char *f, struct found *fd, uint64_t pg, int main_db)
{
    const unsigned char *p = f + pg * fd->psize;
    unsigned flags = u16_at(p + 10), n = (u16_at(p + 12) - 16) / 2;
    fd->is_tree[pg] = 1;
    if (flags == 1 && !fd->branch)
        fd->branch = pg;
    if (flags == 2 && !main_db && !fd->leaf)
        fd->leaf = pg;
    for (unsigned i = 0; i < n; i++) {
        const unsigned char *node = p + u16_at(p + 16 + 2 * i);
        unsigned nflags = u16_at(node + 4), ks = u16_at(node + 6);
        uint64_t lo = u16_at(node) | (uint64_t)u16_at(node + 2) << 16;
        if (flags == 1) {
            find_walk(f, fd, lo | (uint64_t)nflags << 32, main_db);
        } else if (nflags & 2) {
            uint64_t root = u64_at(node + 8 + ks + 40);
            if (root != UINT64_MAX)
                find_walk(f, fd, root, 0);
        } else if (nflags & 1) {
            uint64_t ov = u64_at(node + 8 + ks);
            fd->is_tree[ov] = 1;
            if (!fd->overflow)
                fd->overflow = ov;
        }
    }
}

static void
find_pages(const unsigned char *f, struct found *fd)
{
    memset(fd, 0, sizeof(*fd));
    const unsigned char *m0 = f + 16;
    fd->psize = *(const uint32_t *)(m0 + 24);
    const unsigned char *m1 = f + fd->psize + 16;
    const unsigned char *m = u64_at(m1 + 128) > u64_at(m0 + 128) ? m1 : m0;
    fd->last_pg = u64_at(m + 120);
    fd->is_tree = xcalloc(fd->last_pg + 1, 1);
    uint64_t main_root = u64_at(m + 24 + 48 + 40);
    find_walk(f, fd, main_root, 1);
}

static int
check_copy(const unsigned char *data, size_t len, char *why, size_t whylen)
{
    struct dbcheck_stats st;
    /* an exact-size heap copy, so ASan sees any read past the end */
    unsigned char *copy = xmalloc(len);
    memcpy(copy, data, len);
    int rc = dbcheck_mem(copy, len, &st, why, whylen);
    free(copy);
    return rc;
}

/* Flip one byte at off; the check must fail. */
static void
flip_detected(size_t off, unsigned char mask, const char *what)
{
    char why[512];
    unsigned char *f = xmalloc(file_len);
    memcpy(f, file, file_len);
    f[off] ^= mask;
    int rc = check_copy(f, file_len, why, sizeof why);
    is_int(rc, KWC_ECORRUPT, what);
    if (rc == KWC_ECORRUPT)
        printf("#   %s\n", why);
    free(f);
}

/* ---- tests ---- */

static void
test_sound(void)
{
    struct dbcheck_stats st;
    char why[512];
    int rc = dbcheck_dir(dir, NULL, NULL, &st, why, sizeof why);
    is_int(rc, 0, "the file LMDB wrote passes");
    if (rc)
        printf("#   %s\n", why);
    is_int(st.entries, want_entries, "every record written and not deleted is counted");
    is_int(st.dbs, NDBS, "every named database is found");
    is_int(st.psize, 4096, "default page size");
    ok(st.free_pages > 0, "the free list is not empty (the deletes freed pages)");
    ok(st.pages > 2 && st.pages <= st.last_pg + 1, "pages reached within the pages in use");
    is_int(st.file_pages * st.psize, file_len, "file pages");
    is_int(check_copy(file, file_len, why, sizeof why), 0, "dbcheck_mem agrees");
}

static void
test_new_dir(void)
{
    char d[256], p[512];
    struct dbcheck_stats st;
    char why[128];
    snprintf(d, sizeof d, "/tmp/kwc-dbcheck-test-XXXXXX");
    if (!mkdtemp(d))
        abort();
    is_int(dbcheck_dir(d, NULL, NULL, &st, why, sizeof why), 0, "no data.mdb: a new dir");
    snprintf(p, sizeof p, "%s/data.mdb", d);
    write_file(p, "", 0);
    is_int(dbcheck_dir(d, NULL, NULL, &st, why, sizeof why), 0, "an empty data.mdb: a new dir");
    is_int(st.entries, 0, "nothing in it");
    write_file(p, file, 100);
    is_int(dbcheck_dir(d, NULL, NULL, &st, why, sizeof why), KWC_ECORRUPT, "100 bytes: damaged");
    ok(strstr(why, "too short") != NULL, "the reason says the file is too short");
    lmdbdir_rm(d);
}

static void
test_truncated(void)
{
    char d[256], p[512], why[512];
    snprintf(d, sizeof d, "/tmp/kwc-dbcheck-test-XXXXXX");
    if (!mkdtemp(d))
        abort();
    snprintf(p, sizeof p, "%s/data.mdb", d);
    write_file(p, file, file_len / 2);
    int rc = dbcheck_dir(d, NULL, NULL, NULL, why, sizeof why);
    is_int(rc, KWC_ECORRUPT, "half the file is damaged");
    ok(strstr(why, "truncated") != NULL, "the reason names the truncation");
    printf("#   %s\n", why);
    lmdbdir_rm(d);
}

static void
test_overwrites(void)
{
    struct found fd;
    find_pages(file, &fd);
    char why[512];
    int tried = 0, skipped = 0;
    rng_state = 4242;
    while (tried < 12) {
        size_t off = file_len / 4 + rnd() % (file_len / 2);
        /* a 4 KiB range holds one page's first byte: when that page is a
         * tree page or an overflow run's first page, the damage is visible;
         * over a value's bytes or a free page it is not */
        uint64_t pg = (off + fd.psize - 1) / fd.psize;
        if (pg > fd.last_pg || !fd.is_tree[pg]) {
            skipped++;
            continue;
        }
        unsigned char *f = xmalloc(file_len);
        memcpy(f, file, file_len);
        for (size_t i = 0; i < 4096 && off + i < file_len; i++)
            f[off + i] = (unsigned char)rnd();
        char what[96];
        snprintf(what, sizeof what, "4 KiB of random bytes at offset %zu (over page %llu)", off,
                 (unsigned long long)pg);
        is_int(check_copy(f, file_len, why, sizeof why), KWC_ECORRUPT, what);
        printf("#   %s\n", why);
        free(f);
        tried++;
    }
    printf("# %d random offsets fell over value bytes or free pages and were skipped\n", skipped);
    free(fd.is_tree);
}

static void
test_flips(void)
{
    struct found fd;
    find_pages(file, &fd);
    ok(fd.branch && fd.leaf && fd.overflow, "the walker found branch, leaf and overflow pages");
    size_t ps = fd.psize;
    size_t b = fd.branch * ps, l = fd.leaf * ps, o = fd.overflow * ps;
    unsigned nb = (u16_at(file + b + 12) - 16) / 2;
    ok(nb >= 2, "the branch page has two children");

    flip_detected(b + 0, 0x01, "branch page: a bit of its page number");
    flip_detected(b + 10, 0x02, "branch page: its flags say leaf");
    /* the child pointer of the branch's second node */
    size_t child = b + u16_at(file + b + 16 + 2);
    flip_detected(child + 0, 0x01, "branch page: a bit of a child's page number");
    flip_detected(child + 0, 0x40, "branch page: another bit of a child's page number");
    flip_detected(l + 10, 0x03, "leaf page header: flags");
    flip_detected(l + 12, 0x02, "leaf page header: mp_lower (one record more or less)");
    flip_detected(l + 14, 0x80, "leaf page header: mp_upper");
    flip_detected(l + 16, 0x01, "leaf node offset: odd");
    flip_detected(l + 17, 0x10, "leaf node offset: 4 KiB away");
    flip_detected(l + 16 + 2, 0x04, "leaf node offset: into another record");
    size_t node = l + u16_at(file + l + 16);
    flip_detected(node + 6, 0x04, "leaf node: its key size");
    flip_detected(node + 4, 0x04, "leaf node: a DUPDATA flag");
    flip_detected(o + 12, 0x01, "overflow page: one page more or less in its count");
    flip_detected(o + 13, 0x01, "overflow page: 256 pages more in its count");
    flip_detected(o + 0, 0x08, "overflow page: its page number");

    /* meta pages: 16-byte page header, then magic @0, dbs @24, last_pg @120,
     * txnid @128 */
    flip_detected(16 + 0, 0x01, "meta page 0: magic");
    flip_detected(ps + 16 + 0, 0x01, "meta page 1: magic");
    flip_detected(16 + 128, 0x04, "meta page 0: txnid");
    flip_detected(ps + 16 + 128, 0x04, "meta page 1: txnid");
    flip_detected(16 + 24, 0x01, "meta page 0: page size");
    flip_detected(ps + 16 + 24, 0x10, "meta page 1: page size");
    free(fd.is_tree);
}

static void
test_meta_current_root(void)
{
    size_t ps = 4096;
    unsigned cur = u64_at(file + ps + 16 + 128) > u64_at(file + 16 + 128);
    size_t m = cur * ps + 16;
    flip_detected(m + 24 + 48 + 40, 0x01, "current meta: the main database's root");
    flip_detected(m + 24 + 48 + 32, 0x01, "current meta: the main database's entry count");
    flip_detected(m + 120, 0x01, "current meta: last page (even to odd)");
    flip_detected(m + 120 + 5, 0x01, "current meta: last page beyond the file");
}

static void
test_older_meta_damaged(void)
{
    /* only the older meta is damaged: the current one alone would open,
     * but LMDB's fallback copy is gone, so it is reported */
    size_t ps = 4096;
    unsigned cur = u64_at(file + ps + 16 + 128) > u64_at(file + 16 + 128);
    size_t old = (1 - cur) * ps;
    char why[512];
    unsigned char *f = xmalloc(file_len);
    memcpy(f, file, file_len);
    memset(f + old + 16, 0xa5, 64);
    is_int(check_copy(f, file_len, why, sizeof why), KWC_ECORRUPT, "older meta overwritten");
    char want[32];
    snprintf(want, sizeof want, "meta page %u", 1 - cur);
    ok(strstr(why, want) != NULL, "the reason names the older meta page");
    printf("#   %s\n", why);
    free(f);
    flip_detected(old + 16 + 4, 0x02, "older meta: version");
    flip_detected(old + 16 + 24 + 48 + 6, 0x40, "older meta: main database depth");
}

/* Many small transactions of random puts, overwrites (overflow values grow
 * and shrink in place) and deletes: LMDB's own bookkeeping of free pages is
 * exercised hard, and the result must still pass. */
static void
test_churn(void)
{
    char d[256], why[512];
    static char val[30000];
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi[3];
    uint64_t live = 0;
    static unsigned char present[3][800];
    snprintf(d, sizeof d, "/tmp/kwc-dbcheck-test-XXXXXX");
    if (!mkdtemp(d))
        abort();
    memset(val, 'v', sizeof val);
    memset(present, 0, sizeof present);
    must(mdb_env_create(&env), "create");
    must(mdb_env_set_mapsize(env, 256u << 20), "mapsize");
    must(mdb_env_set_maxdbs(env, 8), "maxdbs");
    must(mdb_env_open(env, d, MDB_NOSYNC, 0600), "open");
    rng_state = 99;
    for (int t = 0; t < 300; t++) {
        must(mdb_txn_begin(env, NULL, 0, &txn), "begin");
        for (int k = 0; k < 3; k++) {
            char name[16];
            snprintf(name, sizeof name, "db%d", k);
            must(mdb_dbi_open(txn, name, MDB_CREATE, &dbi[k]), "dbi");
        }
        for (int op = 0; op < 40; op++) {
            unsigned k = rnd() % 3, i = rnd() % 800;
            char key[32];
            snprintf(key, sizeof key, "key-%u", i * 2654435761u);
            MDB_val kv = {strlen(key), key};
            if (rnd() % 3 == 0) {
                if (mdb_del(txn, dbi[k], &kv, NULL) == 0) {
                    present[k][i] = 0;
                    live--;
                }
            } else {
                unsigned r = rnd() % 10;
                MDB_val dv = {r < 3 ? 2000 + rnd() % 28000 : 1 + rnd() % 300, val};
                must(mdb_put(txn, dbi[k], &kv, &dv, 0), "put");
                if (!present[k][i])
                    live++;
                present[k][i] = 1;
            }
        }
        must(mdb_txn_commit(txn), "commit");
    }
    mdb_env_close(env);
    struct dbcheck_stats st;
    int rc = dbcheck_dir(d, NULL, NULL, &st, why, sizeof why);
    is_int(rc, 0, "300 transactions of puts, overwrites and deletes: the file passes");
    if (rc)
        printf("#   %s\n", why);
    is_int(st.entries, live, "the records left are counted");
    ok(st.free_pages > 0, "with a free list");
    lmdbdir_rm(d);
}

int
main(void)
{
    char p[512];
    snprintf(dir, sizeof dir, "/tmp/kwc-dbcheck-test-XXXXXX");
    if (!mkdtemp(dir))
        abort();
    want_entries = build_env(dir);
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    read_file(p, &file, &file_len);

    TAP_RUN(test_sound);
    TAP_RUN(test_new_dir);
    TAP_RUN(test_churn);
    TAP_RUN(test_truncated);
    TAP_RUN(test_overwrites);
    TAP_RUN(test_flips);
    TAP_RUN(test_meta_current_root);
    TAP_RUN(test_older_meta_damaged);

    free(file);
    lmdbdir_rm(dir);
    return tap_done();
}
