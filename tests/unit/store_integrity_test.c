/*
 * store_integrity_test.c — cache/store.c's checksums and layout checks, by
 * damaging the file: write values holding a marker string, close the store,
 * flip one byte of the marker in every copy of it in data.mdb (LMDB copies
 * pages on write, so stale copies may sit in free pages too; flipping them is
 * harmless), reopen and read. Also meta records written with a raw LMDB txn:
 * a counter edited with a correct checksum (the on-disk layout of meta_rec is
 * the one documented at the top of store.c: u32 version | u32 crc | u64 rv |
 * u64 floor | u64 objects | ..., 584 bytes, crc = CRC-32C of the resource
 * name then bytes 8..583), and a record of the older format.
 */
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/crc32c.h"
#include "kwc/store.h"
#include "lmdbdir.h"
#include "tap.h"

static char dir[256];

static void
fresh_dir(void)
{
    lmdbdir_make(dir, sizeof dir, "integrity-test");
}

static void
rm_dir(void)
{
    lmdbdir_rm(dir);
}

static struct store *
open_store(bool checksums, uint64_t max_events)
{
    struct store_options o;
    store_options_default(&o);
    o.map_size = 64 << 20;
    o.checksums = checksums;
    if (max_events)
        o.history_max_events = max_events;
    struct store *s = NULL;
    if (store_open(dir, &o, &s) != 0)
        abort();
    return s;
}

/* Flip one byte (the 4th) of every copy of marker in data.mdb; how many. */
static int
flip_marker(const char *marker)
{
    char p[512];
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    FILE *f = fopen(p, "r+b");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    char *buf = xmalloc((size_t)n);
    fseek(f, 0, SEEK_SET);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n)
        abort();
    size_t ml = strlen(marker);
    int found = 0;
    for (long i = 0; i + (long)ml <= n; i++) {
        if (memcmp(buf + i, marker, ml) == 0) {
            fseek(f, i + 3, SEEK_SET);
            fputc(buf[i + 3] ^ 0x01, f);
            found++;
        }
    }
    fclose(f);
    free(buf);
    return found;
}

static MDB_env *
raw_open(void)
{
    MDB_env *env;
    if (mdb_env_create(&env) || mdb_env_set_maxdbs(env, 16) || mdb_env_set_mapsize(env, 64 << 20) ||
        mdb_env_open(env, dir, 0, 0600))
        abort();
    return env;
}

static int
raw_put(const char *db, const void *key, size_t kl, const void *val, size_t vl)
{
    MDB_env *env = raw_open();
    MDB_txn *t;
    MDB_dbi d;
    MDB_val k = {kl, (void *)(uintptr_t)key}, v = {vl, (void *)(uintptr_t)val};
    int rc = mdb_txn_begin(env, NULL, 0, &t);
    if (rc == 0 && (rc = mdb_dbi_open(t, db, MDB_CREATE, &d)) == 0 &&
        (rc = mdb_put(t, d, &k, &v, 0)) == 0)
        rc = mdb_txn_commit(t);
    else if (rc == 0)
        mdb_txn_abort(t);
    mdb_env_close(env);
    return rc;
}

/* The raw value under key in db into buf; its size, or 0. */
static size_t
raw_get(const char *db, const char *key, void *buf, size_t cap)
{
    MDB_env *env = raw_open();
    MDB_txn *t;
    MDB_dbi d;
    MDB_val k = {strlen(key), (void *)(uintptr_t)key}, v = {0, NULL};
    size_t n = 0;
    if (mdb_txn_begin(env, NULL, MDB_RDONLY, &t) == 0) {
        if (mdb_dbi_open(t, db, 0, &d) == 0 && mdb_get(t, d, &k, &v) == 0 && v.mv_size <= cap) {
            memcpy(buf, v.mv_data, v.mv_size);
            n = v.mv_size;
        }
        mdb_txn_abort(t);
    }
    mdb_env_close(env);
    return n;
}

static int
put_event(struct store *s, struct store_res *r, enum store_ev_type type, uint64_t rv,
          const char *key, const char *obj)
{
    struct store_wtxn *w;
    int rc = store_wtxn_begin(s, 100, &w);
    if (rc)
        return rc;
    struct store_event ev = {.type = type,
                             .rv = rv,
                             .key = key,
                             .key_len = strlen(key),
                             .obj = obj,
                             .obj_len = strlen(obj),
                             .idx = "\0\0\0\0",
                             .idx_len = 4};
    if ((rc = store_wtxn_event(w, r, &ev))) {
        store_wtxn_abort(w);
        return rc;
    }
    return store_wtxn_commit(w);
}

static int
count_obj(void *arg, const struct store_obj *o)
{
    (*(int *)arg)++;
    return 0;
}

static int
count_hist(void *arg, const struct store_hist *h)
{
    (*(int *)arg)++;
    return 0;
}

static void
on_progress(void *arg, uint64_t done)
{
    *(uint64_t *)arg = done;
}

#define RES "v1/pods:json"

/* A resource with a few objects, history and a field index: verifies. */
static void
test_untouched_store_verifies(void)
{
    fresh_dir();
    struct store *s = open_store(true, 0);
    struct store_res *r;
    store_res(s, RES, &r);
    is_int(store_res_index(r, 0), 0, "field index declared");
    int rc = 0;
    char key[32], obj[64];
    for (int i = 0; i < 40; i++) {
        snprintf(key, sizeof key, "ns/o-%d", i % 7);
        snprintf(obj, sizeof obj, "{\"i\":%d}", i);
        rc |= put_event(s, r,
                        i < 7        ? STORE_ADDED
                        : i % 5 == 0 ? STORE_DELETED
                                     : STORE_MODIFIED,
                        (uint64_t)(10 + i / 2), key, obj);
        if (i % 5 == 0) /* re-add what was deleted */
            rc |= put_event(s, r, STORE_ADDED, (uint64_t)(10 + i / 2), key, obj);
    }
    is_int(rc, 0, "events written");
    store_close(s);
    s = open_store(true, 0);
    char why[256] = "x";
    uint64_t done = 0;
    is_int(store_verify(s, on_progress, &done, why, sizeof why), 0, "untouched store verifies");
    is_str(why, "", "no reason given");
    ok(done > 0, "progress reported the bytes read");
    store_res(s, RES, &r);
    ok(!store_res_damaged(r, key, sizeof key), "not damaged");
    store_close(s);

    /* a trim that cuts through events sharing one rv: the ones left at the
     * floor's rv could never be read (history is read from floor + 1), so
     * they go too, and every kept rv is above the floor */
    s = open_store(true, 2);
    struct store_res *x;
    store_res(s, "v1/x:json", &x);
    struct store_wtxn *w;
    store_wtxn_begin(s, 1, &w);
    const char *keys[] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        struct store_event ev = {
            .type = STORE_ADDED, .rv = 5, .key = keys[i], .key_len = 1, .obj = "{}", .obj_len = 2};
        rc |= store_wtxn_event(w, x, &ev);
    }
    rc |= store_wtxn_commit(w);
    is_int(rc, 0, "three events at rv 5, history bound 2");
    struct store_rtxn *t;
    struct store_res_info info;
    store_rtxn_begin(s, &t);
    store_info(t, x, &info);
    store_rtxn_end(t);
    ok(info.floor == 5 && info.hist_events == 0, "all three trimmed, floor 5");
    is_int(store_verify(s, NULL, NULL, why, sizeof why), 0, "verifies after the trim");
    store_close(s);
    rm_dir();
}

/* A list's callback: copy each object out and check the copy. */
struct copy_check {
    struct store_res *r;
    int n, deferred;
};

static int
copy_and_check(void *arg, const struct store_obj *o)
{
    struct copy_check *c = arg;
    char *copy = malloc(o->raw_len ? o->raw_len : 1);
    memcpy(copy, o->raw, o->raw_len);
    c->deferred += o->raw_unchecked;
    int rc = store_obj_check_raw(c->r, o, copy);
    free(copy);
    if (rc)
        return rc;
    c->n++;
    return 0;
}

/* store_rtxn_defer_raw_check: the raw bytes are checked on the caller's copy. */
static void
test_deferred_raw_check(void)
{
    fresh_dir();
    struct store *s = open_store(true, 0);
    struct store_res *r;
    store_res(s, RES, &r);
    struct store_wtxn *w;
    store_wtxn_begin(s, 1, &w);
    store_wtxn_reset(w, r, 50);
    struct store_event a = {
        .rv = 40, .key = "ns/a", .key_len = 4, .obj = "{\"m\":\"RAWMARK-a\"}", .obj_len = 17};
    struct store_event b = {.rv = 41, .key = "ns/b", .key_len = 4, .obj = "{}", .obj_len = 2};
    store_wtxn_load(w, r, &a);
    store_wtxn_load(w, r, &b);
    is_int(store_wtxn_commit(w), 0, "two objects loaded");
    struct store_rtxn *t;
    struct copy_check c = {.r = r};
    store_rtxn_begin(s, &t);
    store_rtxn_defer_raw_check(t);
    is_int(store_scan(t, r, 0, "", NULL, 0, copy_and_check, &c), 0,
           "intact: a deferred scan passes");
    store_rtxn_end(t);
    is_int(c.n, 2, "...both objects");
    is_int(c.deferred, 2, "...each handed out with its raw bytes unchecked");
    store_close(s);
    ok(flip_marker("RAWMARK-a") >= 1, "one byte of the object's raw bytes flipped");

    s = open_store(true, 0);
    store_res(s, RES, &r);
    c = (struct copy_check){.r = r};
    store_rtxn_begin(s, &t);
    store_rtxn_defer_raw_check(t);
    is_int(store_scan(t, r, 0, "", NULL, 0, copy_and_check, &c), KWC_ECORRUPT,
           "damaged: the check of the copy fails the scan");
    store_rtxn_end(t);
    is_int(c.n, 0, "...before the damaged object is counted");
    char key[64];
    ok(store_res_damaged(r, key, sizeof key), "...and marks the resource");
    is_str(key, "ns/a", "...naming the object");
    store_close(s);
    rm_dir();
}

static void
test_object_damaged(void)
{
    fresh_dir();
    struct store *s = open_store(true, 0);
    struct store_res *r;
    store_res(s, RES, &r);
    struct store_wtxn *w;
    store_wtxn_begin(s, 1, &w);
    store_wtxn_reset(w, r, 50);
    /* loaded objects have no history: the marker is only in the object value */
    struct store_event a = {
        .rv = 40, .key = "ns/a", .key_len = 4, .obj = "{\"m\":\"OBJMARK-a\"}", .obj_len = 17};
    struct store_event b = {.rv = 41, .key = "ns/b", .key_len = 4, .obj = "{}", .obj_len = 2};
    store_wtxn_load(w, r, &a);
    store_wtxn_load(w, r, &b);
    is_int(store_wtxn_commit(w), 0, "two objects loaded");
    store_close(s);
    ok(flip_marker("OBJMARK-a") >= 1, "one byte of the object flipped in data.mdb");

    s = open_store(true, 0);
    char why[256], key[64];
    int rc = store_verify(s, NULL, NULL, why, sizeof why);
    is_int(rc, KWC_ECORRUPT, "store_verify fails");
    ok(strstr(why, "v1/pods:json") && strstr(why, "object ns/a"), "...naming the resource and key");
    printf("# %s\n", why);
    store_res(s, RES, &r);
    ok(!store_res_damaged(r, key, sizeof key), "verify marks nothing");
    struct store_rtxn *t;
    struct store_obj o;
    store_rtxn_begin(s, &t);
    is_int(store_get(t, r, "ns/b", 4, &o), 0, "an intact object reads");
    is_int(store_get(t, r, "ns/a", 4, &o), KWC_ECORRUPT,
           "store_get of the damaged one: KWC_ECORRUPT");
    ok(store_res_damaged(r, key, sizeof key), "the resource is marked damaged");
    is_str(key, "ns/a", "...with the object's key");
    int n = 0;
    is_int(store_scan(t, r, 0, "", NULL, 0, count_obj, &n), KWC_ECORRUPT,
           "store_scan: KWC_ECORRUPT");
    is_int(n, 0, "nothing emitted before it");
    store_rtxn_end(t);
    is_int(put_event(s, r, STORE_MODIFIED, 60, "ns/a", "{}"), KWC_ECORRUPT,
           "an event over the damaged object is refused (it would be copied into history)");
    is_int(store_res_index(r, 0), KWC_ECORRUPT, "building the field index over it: KWC_ECORRUPT");

    /* starting over clears the mark once the reset commits */
    store_wtxn_begin(s, 2, &w);
    store_wtxn_reset(w, r, 70);
    store_wtxn_abort(w);
    ok(store_res_damaged(r, NULL, 0), "an aborted reset keeps the mark");
    store_wtxn_begin(s, 2, &w);
    store_wtxn_reset(w, r, 70);
    is_int(store_wtxn_commit(w), 0, "reset committed");
    ok(!store_res_damaged(r, key, sizeof key), "a committed reset clears the mark");
    is_int(store_verify(s, NULL, NULL, why, sizeof why), 0, "and the store verifies again");
    store_close(s);
    rm_dir();
}

static void
test_history_damaged(void)
{
    fresh_dir();
    struct store *s = open_store(true, 0);
    struct store_res *r;
    store_res(s, RES, &r);
    /* the marker is in history rv 10 (object) and rv 11 (previous object) */
    is_int(put_event(s, r, STORE_ADDED, 10, "ns/h", "{\"m\":\"HISTMARK-h\"}"), 0, "added");
    is_int(put_event(s, r, STORE_MODIFIED, 11, "ns/h", "{}"), 0, "modified");
    store_close(s);
    ok(flip_marker("HISTMARK-h") >= 2, "one byte flipped in both history values");

    s = open_store(true, 0);
    char why[256], key[64];
    is_int(store_verify(s, NULL, NULL, why, sizeof why), KWC_ECORRUPT, "store_verify fails");
    ok(strstr(why, "v1/pods:json") && strstr(why, "history rv 10"), "...naming the history entry");
    printf("# %s\n", why);
    store_res(s, RES, &r);
    struct store_rtxn *t;
    struct store_obj o;
    store_rtxn_begin(s, &t);
    is_int(store_get(t, r, "ns/h", 4, &o), 0, "the current object is intact");
    int n = 0;
    is_int(store_scan(t, r, 0, "", NULL, 0, count_obj, &n), 0, "a latest list needs no history");
    n = 0;
    is_int(store_scan(t, r, 10, "", NULL, 0, count_obj, &n), KWC_ECORRUPT,
           "a list at rv 10 (previous object from history rv 11): KWC_ECORRUPT");
    ok(store_res_damaged(r, key, sizeof key), "marked damaged");
    is_str(key, "history rv 11", "...naming the entry the list read");
    n = 0;
    is_int(store_history(t, r, 9, count_hist, &n), KWC_ECORRUPT, "store_history: KWC_ECORRUPT");
    is_int(n, 0, "no event handed on");
    store_res_damaged(r, key, sizeof key);
    is_str(key, "history rv 11", "the first bad key is kept");
    store_rtxn_end(t);
    store_close(s);

    /* trim reads only the head (the time) of what it deletes: damaged object
     * bytes in it are dropped, never handed on */
    s = open_store(true, 1);
    store_res(s, RES, &r);
    struct store_wtxn *w;
    store_wtxn_begin(s, 5, &w);
    store_wtxn_rv(w, r, 20);
    is_int(store_wtxn_commit(w), 0, "a commit that trims the damaged rv 10");
    is_int(store_verify(s, NULL, NULL, why, sizeof why), KWC_ECORRUPT,
           "the kept rv 11 is still damaged");
    ok(strstr(why, "history rv 11") != NULL, "...and named");
    store_close(s);
    rm_dir();
}

/* A damaged history head (here its object key) fails the trim that reads it. */
static void
test_history_head_damaged(void)
{
    fresh_dir();
    struct store *s = open_store(true, 0);
    struct store_res *r;
    store_res(s, RES, &r);
    is_int(put_event(s, r, STORE_ADDED, 10, "ns/TRIMMARK", "{}"), 0, "added");
    is_int(put_event(s, r, STORE_DELETED, 11, "ns/TRIMMARK", "{}"), 0, "deleted");
    store_close(s);
    ok(flip_marker("TRIMMARK") >= 2, "one byte of the key flipped in both history heads");
    s = open_store(true, 1);
    store_res(s, RES, &r);
    struct store_wtxn *w;
    store_wtxn_begin(s, 5, &w);
    store_wtxn_rv(w, r, 20);
    is_int(store_wtxn_commit(w), KWC_ECORRUPT,
           "a commit that trims the damaged entry: KWC_ECORRUPT");
    char key[64];
    ok(store_res_damaged(r, key, sizeof key), "marked damaged by the trim");
    is_str(key, "history rv 10", "...naming the oldest entry");
    char why[256];
    is_int(store_verify(s, NULL, NULL, why, sizeof why), KWC_ECORRUPT, "store_verify fails");
    ok(strstr(why, "history rv 10") != NULL, "...naming it");
    store_close(s);
    rm_dir();
}

static void
test_meta_damaged(void)
{
    fresh_dir();
    struct store *s = open_store(true, 0);
    struct store_res *r;
    store_res(s, RES, &r);
    put_event(s, r, STORE_ADDED, 10, "ns/m", "{}");
    struct store_wtxn *w;
    store_wtxn_begin(s, 1, &w);
    store_wtxn_set_identity(w, r, "https://up:6443 METAMARK-id");
    is_int(store_wtxn_commit(w), 0, "identity recorded");
    store_close(s);
    ok(flip_marker("METAMARK-id") >= 1, "one byte of the meta record flipped");

    s = open_store(true, 0);
    char why[256], key[64];
    is_int(store_verify(s, NULL, NULL, why, sizeof why), KWC_ECORRUPT, "store_verify fails");
    ok(strstr(why, "v1/pods:json") && strstr(why, "meta record"), "...naming the meta record");
    printf("# %s\n", why);
    store_res(s, RES, &r);
    struct store_rtxn *t;
    struct store_res_info info;
    store_rtxn_begin(s, &t);
    is_int(store_info(t, r, &info), KWC_ECORRUPT, "store_info: KWC_ECORRUPT");
    ok(store_res_damaged(r, key, sizeof key), "marked damaged");
    is_str(key, "meta", "...naming the meta record");
    int n = 0;
    is_int(store_scan(t, r, 0, "", NULL, 0, count_obj, &n), KWC_ECORRUPT,
           "store_scan reads meta: KWC_ECORRUPT");
    store_rtxn_end(t);
    is_int(store_res_rv(s, r, NULL), 0, "store_res_rv: 0 (cannot be read)");
    /* the rebuild: a reset replaces the damaged meta (it need not read it) */
    store_wtxn_begin(s, 2, &w);
    is_int(store_wtxn_reset(w, r, 50), 0, "store_wtxn_reset over a damaged meta");
    is_int(store_wtxn_commit(w), 0, "...commits");
    ok(!store_res_damaged(r, key, sizeof key), "...and the damage mark is cleared");
    store_rtxn_begin(s, &t);
    is_int(store_info(t, r, &info), 0, "store_info reads the new meta");
    is_int((int)info.rv, 50, "...at the reset's rv");
    store_rtxn_end(t);
    store_close(s);
    rm_dir();
}

/* A meta whose objects count is wrong but whose checksum is right: only the
 * full pass can tell. */
static void
test_meta_counter_inconsistent(void)
{
    fresh_dir();
    struct store *s = open_store(true, 0);
    struct store_res *r;
    store_res(s, RES, &r);
    put_event(s, r, STORE_ADDED, 10, "ns/a", "{}");
    put_event(s, r, STORE_ADDED, 11, "ns/b", "{}");
    store_close(s);

    unsigned char rec[1024];
    size_t n = raw_get("meta", RES, rec, sizeof rec);
    is_int(n, 584, "meta record read raw");
    uint64_t objects;
    memcpy(&objects, rec + 24, 8);
    is_int(objects, 2, "objects at its documented offset");
    objects = 5;
    memcpy(rec + 24, &objects, 8);
    uint32_t crc = crc32c(crc32c(0, RES, strlen(RES)), rec + 8, n - 8);
    memcpy(rec + 4, &crc, 4);
    is_int(raw_put("meta", RES, strlen(RES), rec, n), 0,
           "meta rewritten with objects = 5 and a right crc");

    s = open_store(true, 0);
    store_res(s, RES, &r);
    struct store_rtxn *t;
    struct store_res_info info;
    store_rtxn_begin(s, &t);
    is_int(store_info(t, r, &info), 0, "the record itself reads (its checksum is right)");
    is_int(info.objects, 5, "...with the edited count");
    store_rtxn_end(t);
    char why[256];
    is_int(store_verify(s, NULL, NULL, why, sizeof why), KWC_ECORRUPT, "store_verify fails");
    ok(strstr(why, "v1/pods:json") && strstr(why, "objects is 5") && strstr(why, "holds 2"),
       "...naming the counter and both values");
    printf("# %s\n", why);
    store_close(s);
    rm_dir();
}

/* A meta record of format 1 (576 bytes, version 1 first, no checksum). */
static void
test_old_format(void)
{
    fresh_dir();
    struct store *s = open_store(true, 0);
    store_close(s);
    unsigned char rec[576] = {0};
    uint32_t version = 1;
    memcpy(rec, &version, 4);
    is_int(raw_put("meta", "v1/old:json", 11, rec, sizeof rec), 0, "an old-format meta written");
    raw_put("obj:v1/old:json", "k", 1, "", 0);

    s = open_store(true, 0);
    char why[256], key[64];
    is_int(store_verify(s, NULL, NULL, why, sizeof why), KWC_EFORMAT, "store_verify: KWC_EFORMAT");
    ok(strstr(why, "v1/old:json") && strstr(why, "another kwc format"), "...naming the resource");
    struct store_res *r;
    store_res(s, "v1/old:json", &r);
    struct store_rtxn *t;
    struct store_res_info info;
    store_rtxn_begin(s, &t);
    is_int(store_info(t, r, &info), KWC_EFORMAT, "store_info: KWC_EFORMAT, not KWC_ESTORE");
    store_rtxn_end(t);
    ok(!store_res_damaged(r, key, sizeof key), "another format is not a damage");
    /* the write path refuses it too: the caller wipes the data dir */
    struct store_wtxn *w;
    store_wtxn_begin(s, 1, &w);
    is_int(store_wtxn_reset(w, r, 5), KWC_EFORMAT, "the write path says so too");
    store_wtxn_abort(w);
    store_close(s);
    rm_dir();
}

/* Layouts that do not add up, with checksums off (so only the layout checks
 * stand between them and an out-of-bounds read). */
static void
test_bad_layouts(void)
{
    fresh_dir();
    struct store *s = open_store(false, 0);
    struct store_res *r;
    store_res(s, RES, &r);
    is_int(put_event(s, r, STORE_ADDED, 10, "ns/ok", "{}"), 0, "written without checksums");
    store_close(s);
    /* object: idx_len 1000 in a 20-byte value */
    unsigned char ov[20] = {0};
    uint32_t il = 1000;
    memcpy(ov + 4, &il, 4);
    raw_put("obj:" RES, "ns/bad", 6, ov, sizeof ov);
    raw_put("obj:" RES, "ns/short", 8, ov, 7);
    /* history: lengths that sum past the value */
    unsigned char hk[12] = {0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 1};
    unsigned char hv[48] = {0};
    hv[4] = STORE_ADDED;
    hv[6] = 4; /* key_len */
    uint32_t big = 0x7fffffff;
    memcpy(hv + 8, &big, 4); /* obj_len */
    raw_put("hist:" RES, hk, 12, hv, sizeof hv);

    s = open_store(false, 0);
    store_res(s, RES, &r);
    struct store_rtxn *t;
    struct store_obj o;
    char key[64];
    store_rtxn_begin(s, &t);
    is_int(store_get(t, r, "ns/ok", 5, &o), 0, "a well-formed value reads without checksums");
    ok(o.raw_len == 2 && memcmp(o.raw, "{}", 2) == 0, "...its bytes");
    is_int(store_get(t, r, "ns/bad", 6, &o), KWC_ECORRUPT, "idx_len past the value: KWC_ECORRUPT");
    store_res_damaged(r, key, sizeof key);
    is_str(key, "ns/bad", "marked with its key");
    is_int(store_get(t, r, "ns/short", 8, &o), KWC_ECORRUPT,
           "a value shorter than the header: KWC_ECORRUPT");
    int n = 0;
    is_int(store_history(t, r, 0, count_hist, &n), KWC_ECORRUPT,
           "history lengths past the value: KWC_ECORRUPT");
    store_rtxn_end(t);
    char why[256];
    is_int(store_verify(s, NULL, NULL, why, sizeof why), KWC_ECORRUPT, "store_verify fails");
    printf("# %s\n", why);
    store_close(s);
    rm_dir();
}

int
main(void)
{
    TAP_RUN(test_untouched_store_verifies);
    TAP_RUN(test_object_damaged);
    TAP_RUN(test_deferred_raw_check);
    TAP_RUN(test_history_damaged);
    TAP_RUN(test_history_head_damaged);
    TAP_RUN(test_meta_damaged);
    TAP_RUN(test_meta_counter_inconsistent);
    TAP_RUN(test_old_format);
    TAP_RUN(test_bad_layouts);
    return tap_done();
}
