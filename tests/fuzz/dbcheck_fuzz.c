/*
 * dbcheck_fuzz.c — libFuzzer target for cache/dbcheck.c: the input is a whole
 * data.mdb (seeds: tiny real LMDB files, tests/fuzz/dbcheck_seeds.c).
 *
 * Contracts: dbcheck_mem answers 0 or KWC_ECORRUPT, with a NUL-terminated
 * reason on failure and stats within the input on success. Oracle: a file
 * dbcheck passes is opened with liblmdb (read-only, no lock file) and every
 * record of every database is read, every value byte touched, so a file that
 * would crash LMDB (SIGBUS, a wild pointer, an assert) and still pass the
 * check fails here. Inputs larger than dbcheck_fuzz.flags' max_len are cut by
 * libFuzzer, so seeds stay under 64 KiB.
 */
#include "kwc/dbcheck.h"

#include "kwc/base.h"

#include <lmdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64];

static void
check(int cond)
{
    if (!cond)
        abort();
}

static unsigned
touch(MDB_txn *txn, MDB_dbi dbi)
{
    MDB_cursor *cur;
    MDB_val k, v;
    unsigned sum = 0;
    if (mdb_cursor_open(txn, dbi, &cur))
        return 0;
    while (mdb_cursor_get(cur, &k, &v, MDB_NEXT) == 0) {
        for (size_t i = 0; i < k.mv_size; i++)
            sum += ((const unsigned char *)k.mv_data)[i];
        for (size_t i = 0; i < v.mv_size; i++)
            sum += ((const unsigned char *)v.mv_data)[i];
    }
    mdb_cursor_close(cur);
    return sum;
}

static void
rm_dir(void)
{
    rmdir(dir);
}

/* Everything in the file through LMDB itself. */
static void
read_all(const uint8_t *data, size_t size)
{
    char path[128];
    if (!dir[0]) {
        snprintf(dir, sizeof(dir), "%s/kwc-dbcheck-fuzz-XXXXXX",
                 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        check(mkdtemp(dir) != NULL);
        atexit(rm_dir);
    }
    snprintf(path, sizeof(path), "%s/data.mdb", dir);
    FILE *f = fopen(path, "wb");
    check(f && fwrite(data, 1, size, f) == size);
    fclose(f);

    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi main_dbi, dbi;
    MDB_cursor *cur;
    MDB_val k, v;
    check(mdb_env_create(&env) == 0);
    mdb_env_set_maxdbs(env, 64);
    if (mdb_env_open(env, dir, MDB_RDONLY | MDB_NOLOCK, 0600) == 0 &&
        mdb_txn_begin(env, NULL, MDB_RDONLY, &txn) == 0) {
        if (mdb_dbi_open(txn, NULL, 0, &main_dbi) == 0) {
            volatile unsigned sum = touch(txn, main_dbi);
            if (mdb_cursor_open(txn, main_dbi, &cur) == 0) {
                while (mdb_cursor_get(cur, &k, &v, MDB_NEXT) == 0) {
                    char name[512];
                    if (k.mv_size >= sizeof(name) || memchr(k.mv_data, 0, k.mv_size))
                        continue;
                    memcpy(name, k.mv_data, k.mv_size);
                    name[k.mv_size] = '\0';
                    if (mdb_dbi_open(txn, name, 0, &dbi) == 0)
                        sum += touch(txn, dbi);
                }
                mdb_cursor_close(cur);
            }
            (void)sum;
        }
        mdb_txn_abort(txn);
    }
    mdb_env_close(env);
    unlink(path);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dbcheck_stats st;
    char why[256];
    memset(why, 'x', sizeof(why));
    uint8_t *buf = xmalloc(size ? size : 1);
    memcpy(buf, data, size);
    int rc = dbcheck_mem(buf, size, &st, why, sizeof(why));
    check(rc == 0 || rc == KWC_ECORRUPT);
    if (rc == KWC_ECORRUPT) {
        check(memchr(why, '\0', sizeof(why)) != NULL && why[0] != '\0');
    } else if (size) {
        check(st.psize >= 512 && st.file_pages * st.psize <= size);
        check(st.last_pg < st.file_pages && st.pages <= st.last_pg + 1);
        read_all(buf, size);
    } else {
        check(st.pages == 0 && st.entries == 0);
    }
    free(buf);
    return 0;
}
