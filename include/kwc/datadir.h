/*
 * datadir.h — taking a --data-dir at start (DESIGN.md "Storage", "Operations").
 *
 *   1. One writer per data dir: DIR/kwc.lock is flock()ed exclusively and
 *      holds the owner's pid; a second kwc is refused naming that pid.
 *   2. The LMDB file is checked before LMDB maps it (dbcheck: meta pages,
 *      file size against the pages in use, every B-tree page), then every
 *      value's checksum and kwc's meta records (store_verify). A damaged dir
 *      is never served: per --on-corrupt-cache it is wiped (rebuild), kept
 *      as DIR/data.mdb.corrupt-TIME (move-aside) — both start empty and list
 *      from the upstream — or refused (fail). A dir written by another kwc
 *      format is wiped under every policy: there is nothing to keep.
 */
#ifndef KWC_DATADIR_H
#define KWC_DATADIR_H

#include <stddef.h>

struct store;
struct store_options;

enum datadir_on_corrupt { DATADIR_REBUILD, DATADIR_MOVE_ASIDE, DATADIR_FAIL };

struct datadir {
    int lock_fd;
    struct store *st;
};

/* Parse --on-corrupt-cache's value; -1 for anything else. */
int datadir_policy(const char *s);

/*
 * Lock dir (created if missing), check it, open the store. Returns 0 (the
 * caller owns d->st and releases everything with datadir_close), or
 * KWC_ECONFIG with a message for a person in err: the dir is in use
 * ("data dir DIR is in use by pid N"), damaged under DATADIR_FAIL, or cannot
 * be created, locked or opened.
 */
int datadir_open(const char *dir, const struct store_options *so, enum datadir_on_corrupt policy,
                 struct datadir *d, char *err, size_t errlen);
void datadir_close(struct datadir *d);
/* A takeover (handover.h): the lock goes to the new process while the
 * store stays open for the requests in progress (reads only from then on:
 * LMDB takes readers of several processes); retaken if it fails. */
void datadir_release_lock(struct datadir *d);
int datadir_retake_lock(const char *dir, struct datadir *d, char *err, size_t errlen);

#endif
