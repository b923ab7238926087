/*
 * lmdbdir.h — a scratch directory for an LMDB environment in unit tests:
 * made under /tmp, removed with its data.mdb and lock.mdb.
 */
#ifndef KWC_TEST_LMDBDIR_H
#define KWC_TEST_LMDBDIR_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* dir (at least 64 bytes) becomes a new /tmp/kwc-NAME-XXXXXX directory. */
static inline void
lmdbdir_make(char *dir, size_t len, const char *name)
{
    snprintf(dir, len, "/tmp/kwc-%s-XXXXXX", name);
    if (!mkdtemp(dir))
        abort();
}

static inline void
lmdbdir_rm(const char *dir)
{
    char p[512];
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/lock.mdb", dir);
    unlink(p);
    rmdir(dir);
}

#endif
