/*
 * dbcheck.h — verify the cache's LMDB file (DIR/data.mdb) before
 * mdb_env_open maps it.
 *
 * LMDB trusts its file: a truncated data.mdb SIGBUSes on the first read of a
 * page past the end, and overwritten pages send it through garbage offsets.
 * dbcheck reads the file with pread() only, page by page, and walks every tree
 * the current meta page describes (the free list, the main DB and each named
 * DB), so a damaged data dir is refused with a sentence for a person and kwc
 * rebuilds its cache from the upstream instead of crashing.
 *
 * It checks structure, not content: a changed byte inside a value is not
 * visible here (kwc's per-value checksums catch that when the value is read).
 * It knows the LMDB 0.9 format on this architecture (64-bit pgno_t, the
 * default page layout) and what kwc writes: no DUPSORT database anywhere, no
 * MDB_FIXEDMAP.
 */
#ifndef KWC_DBCHECK_H
#define KWC_DBCHECK_H

#include <stddef.h>
#include <stdint.h>

struct dbcheck_stats {
    uint64_t pages;      /* distinct pages reached: metas, tree pages, overflow runs */
    uint64_t file_pages; /* file size / page size */
    uint64_t last_pg;    /* the current meta's last used page */
    uint64_t txnid;      /* the current meta's transaction id */
    uint64_t entries;    /* records in the named DBs (and plain records of the main DB) */
    uint64_t free_pages; /* pages the free list holds */
    unsigned dbs;        /* named databases */
    unsigned psize;      /* page size */
};

/* Called about every 64 MiB of pages checked; total is the in-use size. */
typedef void (*dbcheck_progress_cb)(uint64_t done_bytes, uint64_t total_bytes, void *arg);

/*
 * Check DIR/data.mdb (dir borrowed). Returns
 *   0             sound, or no file / an empty file (a new data dir: st is zeroed);
 *   KWC_ECORRUPT  damaged: why holds one sentence saying what is wrong and where,
 *                 e.g. "data.mdb is 8388608 bytes but its meta page says pages up
 *                 to 4095 (16777216 bytes) are in use: the file is truncated";
 *   -errno        the file cannot be opened or read (why says which).
 * on_progress may be NULL. st may be NULL; it is filled as far as the check got.
 * Reads with pread() only, never maps the file; memory is a few pages plus
 * two bitmaps of last_pg/8 bytes. No LMDB call: run it before mdb_env_open.
 */
int dbcheck_dir(const char *dir, dbcheck_progress_cb on_progress, void *arg,
                struct dbcheck_stats *st, char *why, size_t whylen);

/* The same over a file's bytes already in memory (borrowed): 0 or KWC_ECORRUPT. */
int dbcheck_mem(const void *data, size_t len, struct dbcheck_stats *st, char *why, size_t whylen);

#endif
