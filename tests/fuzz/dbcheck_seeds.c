/*
 * dbcheck_seeds.c — writes the seed corpus of dbcheck_fuzz: tiny real LMDB
 * files (4 KiB pages, each under 64 KiB) with what the check walks: named
 * databases, a branch page, an overflow value, a non-empty free list.
 * Not built by make; to regenerate:
 *   cc -o /tmp/seeds tests/fuzz/dbcheck_seeds.c -llmdb &&
 *   /tmp/seeds tests/fuzz/corpus/dbcheck_fuzz
 */
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void
must(int rc, const char *what)
{
    if (rc) {
        fprintf(stderr, "%s: %s\n", what, mdb_strerror(rc));
        exit(1);
    }
}

/* One environment: ndbs named DBs of n records each (every big-th value is
 * 6000 bytes, the rest 20), then every del-th record deleted. */
static void
seed(const char *out, const char *name, int ndbs, int n, int big, int del)
{
    char dir[] = "/tmp/kwc-seeds-XXXXXX", src[64], dst[512];
    static char val[6000];
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    if (!mkdtemp(dir))
        exit(1);
    memset(val, 'v', sizeof(val));
    must(mdb_env_create(&env), "create");
    must(mdb_env_set_maxdbs(env, 8), "maxdbs");
    must(mdb_env_set_mapsize(env, 1 << 20), "mapsize");
    must(mdb_env_open(env, dir, MDB_NOSYNC, 0600), "open");
    for (int d = 0; d < ndbs; d++) {
        char db[16];
        snprintf(db, sizeof(db), "db%d", d);
        must(mdb_txn_begin(env, NULL, 0, &txn), "begin");
        must(mdb_dbi_open(txn, db, MDB_CREATE, &dbi), "dbi");
        for (int i = 0; i < n; i++) {
            char key[32];
            snprintf(key, sizeof(key), "k%04d", i);
            MDB_val k = {strlen(key), key}, v = {big && i % big == 0 ? 6000 : 20, val};
            must(mdb_put(txn, dbi, &k, &v, 0), "put");
        }
        must(mdb_txn_commit(txn), "commit");
        if (del) {
            must(mdb_txn_begin(env, NULL, 0, &txn), "begin");
            for (int i = 0; i < n; i += del) {
                char key[32];
                snprintf(key, sizeof(key), "k%04d", i);
                MDB_val k = {strlen(key), key};
                must(mdb_del(txn, dbi, &k, NULL), "del");
            }
            must(mdb_txn_commit(txn), "commit");
        }
    }
    mdb_env_close(env);
    snprintf(src, sizeof(src), "%s/data.mdb", dir);
    snprintf(dst, sizeof(dst), "%s/%s", out, name);
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "cp %s %s && rm -r %s", src, dst, dir);
    if (system(cmd))
        exit(1);
}

int
main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s corpus-dir\n", argv[0]);
        return 2;
    }
    seed(argv[1], "one-db", 1, 5, 0, 0);
    seed(argv[1], "overflow-free", 1, 4, 2, 3);
    seed(argv[1], "branch", 1, 200, 0, 7);
    return 0;
}
