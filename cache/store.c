/*
 * store.c — the LMDB watch cache (see store.h for the schema and contracts).
 *
 * Value layouts (little-endian host order; the data dir is not portable across
 * architectures, and meta records a format version):
 *   object:  u32 crc | u32 idx_len | u64 rv | idx | raw
 *            crc = CRC-32C of the object key, then every value byte after crc
 *   history: key = u64 rv (big-endian) | u32 seq (big-endian), so keys sort by rv
 *            value = struct hist_head | key | obj | prev
 *            hist_head.crc (its first field) = CRC-32C of the 12 key bytes, then
 *            the rest of the head and the object key; obj and prev are object
 *            values (layout and crc as above, over the same key): obj as it
 *            is put in objects, prev (when has_prev) the stored value copied
 *            verbatim after its crc was checked. So an event computes one
 *            object crc (and a small head crc), not two: the history entry
 *            reuses the checksums of the values it carries.
 *   meta:    key = resource name -> struct meta_rec; version first (in every
 *            format, so an older one is told apart: KWC_EFORMAT), then crc =
 *            CRC-32C of the resource name, then every byte after crc
 *   field:   (optional, one indexed field per resource) key = value NUL
 *            object key -> empty; maintained with every object write
 *
 * Integrity: every read that hands bytes on (to a caller, or into a new
 * history entry) checks the value's layout (lengths add up to its size) and,
 * with store_options.checksums, its crc; a mismatch is KWC_ECORRUPT and marks
 * the resource damaged (store_res_damaged), never an out-of-bounds read or
 * served bytes the upstream did not send. LMDB's own page structure is
 * checked elsewhere (at start); store_verify walks every value once.
 *
 * Invariants: meta.rv >= every history rv; every event with rv > meta.floor is
 * in history; objects hold exactly the state at meta.rv (bookmarks aside).
 * One write transaction carries the events and the meta that describes them,
 * so a crash at any point leaves them consistent (LMDB commits atomically).
 */
#include "kwc/store.h"

#include <assert.h>
#include <errno.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"
#include "kwc/crc32c.h"
#include "kwc/index.h"

#define STORE_MAX_RES STORE_MAX_RESOURCES
/* 1: no checksums. 2: crc in every value and in meta. */
#define META_VERSION 2
#define OBJ_HEAD 16  /* u32 crc | u32 idx_len | u64 rv */
#define KEY_MAX 1024 /* object keys, as bounded on write */
#define HIST_KEY 12
#define VERIFY_REPORT ((uint64_t)64 << 20)
#define META_NAMESPACED 1u
#define META_UNSERVED 2u /* store_wtxn_set_unserved */
#define TRIM_MAX_PER_COMMIT 200000

/* No implicit padding in either struct: every byte under a crc is written. */
struct meta_rec {
    uint32_t version; /* first in every format */
    uint32_t crc;     /* over the resource name, then every byte after this field */
    uint64_t rv, floor;
    uint64_t objects, hist_events, hist_bytes;
    uint64_t last_hist_rv;
    uint32_t last_seq;
    uint32_t flags; /* META_* */
    uint32_t synced;
    uint32_t pad; /* 0 */
    char list_kind[128];
    char api_version[128];
    char identity[256];
};
_Static_assert(sizeof(struct meta_rec) == 584, "meta_rec has no padding");

struct hist_head {
    uint32_t crc; /* over the history key, the rest of the head, the object key */
    uint8_t type;
    uint8_t has_prev;
    uint16_t key_len;
    uint32_t obj_len, prev_len; /* bytes of the obj and prev object values */
    uint64_t time;
};
_Static_assert(sizeof(struct hist_head) == 24, "hist_head has no padding");

struct store_res {
    struct store *s;
    unsigned id;
    char *name;
    MDB_dbi objs, hist;
    int ifield; /* index field number (idx_field), -1: none */
    MDB_dbi fidx;
    /* A checksum or layout mismatch seen by any thread's read (set once,
     * cleared when a store_wtxn_reset of the resource commits); bad_key,
     * under mu, names the first bad value. */
    atomic_bool damaged;
    pthread_mutex_t mu;
    char bad_key[256];
};

struct store {
    MDB_env *env;
    MDB_dbi meta;
    MDB_dbi cluster; /* "id" -> u32 crc | the upstream cluster's identity */
    struct store_options o;
    struct store_res *res[STORE_MAX_RES];
    unsigned nres;
};

struct store_wtxn {
    struct store *s;
    MDB_txn *txn;
    uint64_t now;
    /* per resource open at begin (nres): a resource is never opened while
     * a write transaction is (store_res opens its own) */
    unsigned nres;
    struct meta_rec *meta;
    bool *loaded, *dirty, *reset;
    char *buf; /* scratch for history values */
    size_t cap;
    char *fbuf; /* scratch for field index keys */
    size_t fcap;
};

static char *
scratch_fidx(struct store_wtxn *w, size_t n)
{
    if (n > w->fcap) {
        w->fcap = n < 512 ? 512 : n;
        w->fbuf = xrealloc(w->fbuf, w->fcap);
    }
    return w->fbuf;
}

struct store_rtxn {
    struct store *s;
    MDB_txn *txn;
    bool defer_raw; /* store_rtxn_defer_raw_check */
};

static int
mdb_err(int rc)
{
    switch (rc) {
    case MDB_SUCCESS:
        return 0;
    case MDB_NOTFOUND:
        return KWC_ENOTFOUND;
    case MDB_MAP_FULL:
        return KWC_EMAPFULL;
    default:
        return rc > 0 ? -rc : KWC_ESTORE; /* errno values come back positive */
    }
}

void
store_options_default(struct store_options *o)
{
    memset(o, 0, sizeof(*o));
    o->map_size = (uint64_t)64 << 30; /* 64 GiB of address space, sparse */
    o->max_resources = 32;
    o->durable = false;
    o->history_max_events = 2000000;
    o->history_max_bytes = (uint64_t)4 << 30;
    o->history_max_age = 3600;
    o->checksums = true;
}

int
store_open(const char *dir, const struct store_options *o, struct store **out)
{
    struct store *s = xcalloc(1, sizeof(*s));
    s->o = *o;
    int rc = mdb_env_create(&s->env);
    if (rc)
        goto fail;
    mdb_env_set_mapsize(s->env, (size_t)o->map_size);
    /* per resource obj, hist, field; then meta and cluster */
    mdb_env_set_maxdbs(s->env, 3 * (o->max_resources ? o->max_resources : 32) + 2);
    mdb_env_set_maxreaders(s->env, 1024);
    /* NOTLS: read txns belong to event loops, not threads (TRAPS.md).
     * NOSYNC unless durable: the cache can be rebuilt from the upstream, and
     * LMDB without NOMETASYNC|NOSYNC torn writes still cannot corrupt it: a
     * crash loses the newest commits, never consistency. */
    unsigned flags = MDB_NOTLS | (o->durable ? 0 : MDB_NOSYNC);
    rc = mdb_env_open(s->env, dir, flags, 0600);
    if (rc)
        goto fail;
    MDB_txn *txn;
    if ((rc = mdb_txn_begin(s->env, NULL, 0, &txn)))
        goto fail;
    if ((rc = mdb_dbi_open(txn, "meta", MDB_CREATE, &s->meta)) ||
        (rc = mdb_dbi_open(txn, "cluster", MDB_CREATE, &s->cluster))) {
        mdb_txn_abort(txn);
        goto fail;
    }
    if ((rc = mdb_txn_commit(txn)))
        goto fail;
    *out = s;
    return 0;
fail:
    if (s->env)
        mdb_env_close(s->env);
    free(s);
    return mdb_err(rc);
}

void
store_close(struct store *s)
{
    if (!s)
        return;
    for (unsigned i = 0; i < s->nres; i++) {
        pthread_mutex_destroy(&s->res[i]->mu);
        free(s->res[i]->name);
        free(s->res[i]);
    }
    mdb_env_close(s->env);
    free(s);
}

int
store_res(struct store *s, const char *name, struct store_res **out)
{
    for (unsigned i = 0; i < s->nres; i++) {
        if (strcmp(s->res[i]->name, name) == 0) {
            *out = s->res[i];
            return 0;
        }
    }
    if (s->nres == STORE_MAX_RES || s->nres >= (s->o.max_resources ? s->o.max_resources : 32))
        return KWC_ETOOBIG;
    if (strlen(name) > 200)
        return KWC_ETOOBIG;
    struct store_res *r = xcalloc(1, sizeof(*r));
    r->s = s;
    r->id = s->nres;
    r->ifield = -1;
    r->name = xstrdup(name);
    char dbname[256];
    MDB_txn *txn;
    int rc = mdb_txn_begin(s->env, NULL, 0, &txn);
    if (rc)
        goto fail;
    snprintf(dbname, sizeof(dbname), "obj:%s", name);
    if ((rc = mdb_dbi_open(txn, dbname, MDB_CREATE, &r->objs)))
        goto abort;
    snprintf(dbname, sizeof(dbname), "hist:%s", name);
    if ((rc = mdb_dbi_open(txn, dbname, MDB_CREATE, &r->hist)))
        goto abort;
    if ((rc = mdb_txn_commit(txn)))
        goto fail;
    pthread_mutex_init(&r->mu, NULL);
    s->res[s->nres++] = r;
    *out = r;
    return 0;
abort:
    mdb_txn_abort(txn);
fail:
    free(r->name);
    free(r);
    return mdb_err(rc);
}

/* ---- integrity ---- */

/* Record a mismatch in what (a key or "history rv N", len bytes) and return
 * KWC_ECORRUPT. The first one is kept: readers on several threads may race. */
static int
mark_damaged(struct store_res *r, const void *what, size_t len)
{
    pthread_mutex_lock(&r->mu);
    if (!atomic_load_explicit(&r->damaged, memory_order_relaxed)) {
        size_t n = len < sizeof(r->bad_key) - 1 ? len : sizeof(r->bad_key) - 1;
        memcpy(r->bad_key, what, n);
        r->bad_key[n] = '\0';
        atomic_store_explicit(&r->damaged, true, memory_order_release);
    }
    pthread_mutex_unlock(&r->mu);
    return KWC_ECORRUPT;
}

bool
store_res_damaged(struct store_res *r, char *key, size_t keylen)
{
    if (!atomic_load_explicit(&r->damaged, memory_order_acquire))
        return false;
    pthread_mutex_lock(&r->mu);
    if (key && keylen)
        snprintf(key, keylen, "%s", r->bad_key);
    pthread_mutex_unlock(&r->mu);
    return true;
}

static void
clear_damaged(struct store_res *r)
{
    pthread_mutex_lock(&r->mu);
    r->bad_key[0] = '\0';
    atomic_store_explicit(&r->damaged, false, memory_order_release);
    pthread_mutex_unlock(&r->mu);
}

static uint32_t
meta_crc(const char *name, const struct meta_rec *m)
{
    size_t off = offsetof(struct meta_rec, crc) + sizeof(m->crc);
    return crc32c(crc32c(0, name, strlen(name)), (const char *)m + off, sizeof(*m) - off);
}

/* v, the meta record of resource name, into m. 0, KWC_EFORMAT (another
 * format's record) or KWC_ECORRUPT. */
static int
meta_check(const struct store *s, const char *name, const MDB_val *v, struct meta_rec *m)
{
    uint32_t version;
    if (v->mv_size < sizeof(version))
        return KWC_ECORRUPT;
    memcpy(&version, v->mv_data, sizeof(version));
    if (version != META_VERSION)
        return KWC_EFORMAT;
    if (v->mv_size != sizeof(*m))
        return KWC_ECORRUPT;
    memcpy(m, v->mv_data, sizeof(*m));
    if (s->o.checksums && m->crc != meta_crc(name, m))
        return KWC_ECORRUPT;
    return 0;
}

static uint32_t
obj_crc(const void *key, size_t kl, const char *v, size_t vl)
{
    return crc32c(crc32c(0, key, kl), v + 4, vl - 4);
}

/* Check an object value's layout and point o into it (its crc in
 * o->crc_want). 0 or KWC_ECORRUPT. */
static int
obj_layout(const MDB_val *k, const MDB_val *v, struct store_obj *o)
{
    const char *p = v->mv_data;
    uint32_t il;
    if (v->mv_size < OBJ_HEAD || k->mv_size == 0 || k->mv_size > KEY_MAX)
        return KWC_ECORRUPT;
    memcpy(&o->crc_want, p, 4);
    memcpy(&il, p + 4, 4);
    if (il > v->mv_size - OBJ_HEAD)
        return KWC_ECORRUPT;
    memcpy(&o->rv, p + 8, 8);
    o->key = k->mv_data;
    o->key_len = k->mv_size;
    o->idx = p + OBJ_HEAD;
    o->idx_len = il;
    o->raw = p + OBJ_HEAD + il;
    o->raw_len = v->mv_size - OBJ_HEAD - il;
    o->raw_unchecked = false;
    return 0;
}

/* Check an object value's layout and crc, and point o into it. 0 or KWC_ECORRUPT. */
static int
obj_check(const struct store *s, const MDB_val *k, const MDB_val *v, struct store_obj *o)
{
    if (obj_layout(k, v, o))
        return KWC_ECORRUPT;
    if (s->o.checksums && o->crc_want != obj_crc(k->mv_data, k->mv_size, v->mv_data, v->mv_size))
        return KWC_ECORRUPT;
    return 0;
}

/* obj_check, except that the raw bytes are left for store_obj_check_raw. */
static int
obj_check_head(const struct store *s, const MDB_val *k, const MDB_val *v, struct store_obj *o)
{
    if (!s->o.checksums)
        return obj_check(s, k, v, o);
    if (obj_layout(k, v, o))
        return KWC_ECORRUPT;
    const char *p = v->mv_data;
    o->crc_rest = crc32c(crc32c(0, k->mv_data, k->mv_size), p + 4, OBJ_HEAD - 4 + o->idx_len);
    o->raw_unchecked = true;
    return 0;
}

int
store_obj_check_raw(struct store_res *r, const struct store_obj *o, const void *copy)
{
    if (!o->raw_unchecked || crc32c(o->crc_rest, copy, o->raw_len) == o->crc_want)
        return 0;
    return mark_damaged(r, o->key, o->key_len < KEY_MAX ? o->key_len : KEY_MAX);
}

static int
decode_obj(struct store_res *r, const MDB_val *k, const MDB_val *v, struct store_obj *o)
{
    int rc = obj_check(r->s, k, v, o);
    return rc ? mark_damaged(r, k->mv_data, k->mv_size < KEY_MAX ? k->mv_size : KEY_MAX) : 0;
}

static int
decode_obj_head(struct store_res *r, const MDB_val *k, const MDB_val *v, struct store_obj *o)
{
    int rc = obj_check_head(r->s, k, v, o);
    return rc ? mark_damaged(r, k->mv_data, k->mv_size < KEY_MAX ? k->mv_size : KEY_MAX) : 0;
}

static uint64_t
hist_key_rv(const MDB_val *k)
{
    const unsigned char *p = k->mv_data;
    uint64_t rv = 0;
    for (int i = 0; i < 8; i++)
        rv = rv << 8 | p[i];
    return rv;
}

/* The head crc: history key, then the head after crc and the object key
 * (contiguous in the value). */
static uint32_t
hist_crc(const void *hk, const char *v, size_t key_len)
{
    return crc32c(crc32c(0, hk, HIST_KEY), v + 4, sizeof(struct hist_head) - 4 + key_len);
}

/* Check a history value's head: its layout and (checksums on) its crc. Enough
 * for trim, which reads only the time. 0 or KWC_ECORRUPT. */
static int
hist_head_check(const struct store *s, const MDB_val *k, const MDB_val *v, struct hist_head *hh)
{
    if (k->mv_size != HIST_KEY || v->mv_size < sizeof(*hh))
        return KWC_ECORRUPT;
    memcpy(hh, v->mv_data, sizeof(*hh));
    uint64_t sum = sizeof(*hh) + (uint64_t)hh->key_len + hh->obj_len + hh->prev_len;
    if (sum != v->mv_size || hh->key_len == 0 || hh->key_len > KEY_MAX || hh->type < STORE_ADDED ||
        hh->type > STORE_DELETED || hh->has_prev > 1 || hh->obj_len < OBJ_HEAD ||
        (hh->has_prev ? hh->prev_len < OBJ_HEAD : hh->prev_len != 0))
        return KWC_ECORRUPT;
    if (s->o.checksums && hh->crc != hist_crc(k->mv_data, v->mv_data, hh->key_len))
        return KWC_ECORRUPT;
    return 0;
}

/* Check a whole history value (head and both object values) and point h
 * into it. 0 or KWC_ECORRUPT. */
static int
hist_check(const struct store *s, const MDB_val *k, const MDB_val *v, struct store_hist *h)
{
    struct hist_head hh;
    if (hist_head_check(s, k, v, &hh))
        return KWC_ECORRUPT;
    const char *p = (const char *)v->mv_data + sizeof(hh);
    MDB_val key = {hh.key_len, (void *)(uintptr_t)p};
    MDB_val ov = {hh.obj_len, (void *)(uintptr_t)(p + hh.key_len)};
    MDB_val pv = {hh.prev_len, (void *)(uintptr_t)(p + hh.key_len + hh.obj_len)};
    memset(h, 0, sizeof(*h));
    if (obj_check(s, &key, &ov, &h->obj) || (hh.has_prev && obj_check(s, &key, &pv, &h->prev)))
        return KWC_ECORRUPT;
    h->type = (enum store_ev_type)hh.type;
    h->rv = hist_key_rv(k);
    h->time = hh.time;
    h->obj.rv = h->rv; /* the event's rv (the value holds the object's own) */
    return 0;
}

static int
hist_damaged(struct store_res *r, const MDB_val *k)
{
    char what[64];
    int n = snprintf(what, sizeof(what), "history rv %llu",
                     k->mv_size == HIST_KEY ? (unsigned long long)hist_key_rv(k) : 0ULL);
    return mark_damaged(r, what, (size_t)n);
}

static int
decode_hist(struct store_res *r, const MDB_val *k, const MDB_val *v, struct store_hist *h)
{
    return hist_check(r->s, k, v, h) ? hist_damaged(r, k) : 0;
}

/* ---- meta ---- */

static int
meta_read(MDB_txn *txn, struct store_res *r, struct meta_rec *m)
{
    MDB_val k = {strlen(r->name), r->name}, v;
    int rc = mdb_get(txn, r->s->meta, &k, &v);
    if (rc == MDB_NOTFOUND) {
        memset(m, 0, sizeof(*m));
        m->version = META_VERSION;
        return 0;
    }
    if (rc)
        return mdb_err(rc);
    rc = meta_check(r->s, r->name, &v, m);
    return rc == KWC_ECORRUPT ? mark_damaged(r, "meta", 4) : rc;
}

static struct meta_rec *
wmeta(struct store_wtxn *w, struct store_res *r, int *err)
{
    assert(r->id < w->nres); /* opened before the transaction began */
    if (!w->loaded[r->id]) {
        *err = meta_read(w->txn, r, &w->meta[r->id]);
        if (*err)
            return NULL;
        w->loaded[r->id] = true;
    }
    w->dirty[r->id] = true;
    return &w->meta[r->id];
}

/* ---- writing ---- */

int
store_wtxn_begin(struct store *s, uint64_t now, struct store_wtxn **out)
{
    struct store_wtxn *w = xcalloc(1, sizeof(*w));
    w->s = s;
    w->now = now;
    int rc = mdb_txn_begin(s->env, NULL, 0, &w->txn);
    if (rc) {
        free(w);
        return mdb_err(rc);
    }
    w->nres = s->nres;
    w->meta = xcalloc(w->nres ? w->nres : 1, sizeof(*w->meta));
    w->loaded = xcalloc(3 * (w->nres ? w->nres : 1), sizeof(bool));
    w->dirty = w->loaded + w->nres;
    w->reset = w->dirty + w->nres;
    *out = w;
    return 0;
}

static void
hist_key(uint64_t rv, uint32_t seq, unsigned char k[12])
{
    for (int i = 0; i < 8; i++)
        k[i] = (unsigned char)(rv >> (56 - 8 * i));
    for (int i = 0; i < 4; i++)
        k[8 + i] = (unsigned char)(seq >> (24 - 8 * i));
}

static char *
scratch(struct store_wtxn *w, size_t n)
{
    if (n > w->cap) {
        w->cap = n + n / 2;
        w->buf = xrealloc(w->buf, w->cap);
    }
    return w->buf;
}

/* The resource's meta for a write of ev, after bounding ev's sizes. */
static struct meta_rec *
event_meta(struct store_wtxn *w, struct store_res *r, const struct store_event *ev, int *err)
{
    if (ev->key_len == 0 || ev->key_len > KEY_MAX || ev->idx_len > UINT32_MAX / 2 ||
        ev->obj_len > UINT32_MAX / 2) {
        *err = KWC_ETOOBIG;
        return NULL;
    }
    return wmeta(w, r, err);
}

/* The indexed field's value in idx bytes (NULL idx: no object), copied. */
static char *
field_copy(const struct store_res *r, const void *idx, size_t len)
{
    if (r->ifield < 0 || !idx)
        return NULL;
    const char *v = idx_field(idx, len, (size_t)r->ifield);
    return xstrdup(v ? v : "");
}

static int
fidx_op(struct store_wtxn *w, struct store_res *r, const char *val, const char *key, size_t kl,
        bool put)
{
    size_t vl = strlen(val);
    char *k = scratch_fidx(w, vl + 1 + kl);
    memcpy(k, val, vl + 1);
    memcpy(k + vl + 1, key, kl);
    MDB_val kv = {vl + 1 + kl, k}, dv = {0, (void *)(uintptr_t) ""};
    int rc = put ? mdb_put(w->txn, r->fidx, &kv, &dv, 0) : mdb_del(w->txn, r->fidx, &kv, NULL);
    return rc == MDB_NOTFOUND ? 0 : mdb_err(rc);
}

/* Move ev's key in the field index from its value in prev (NULL: no
 * object before) to its value in ev (present false: deleted). */
static int
fidx_update(struct store_wtxn *w, struct store_res *r, const struct store_event *ev,
            const struct store_obj *prev, bool present)
{
    if (r->ifield < 0)
        return 0;
    /* copies: prev points into the map, which the puts below may change */
    char *old = prev ? field_copy(r, prev->idx, prev->idx_len) : NULL;
    char *new = present ? field_copy(r, ev->idx ? ev->idx : "", ev->idx_len) : NULL;
    int rc = 0;
    if (!(old && new &&strcmp(old, new) == 0)) {
        if (old)
            rc = fidx_op(w, r, old, ev->key, ev->key_len, false);
        if (rc == 0 && new)
            rc = fidx_op(w, r, new, ev->key, ev->key_len, true);
    }
    free(old);
    free(new);
    return rc;
}

static size_t
obj_value_len(const struct store_event *ev)
{
    return OBJ_HEAD + ev->idx_len + ev->obj_len;
}

/* ev's object value, crc included, into d (obj_value_len bytes). */
static void
obj_value(const struct store_wtxn *w, const struct store_event *ev, char *d)
{
    uint32_t il = (uint32_t)ev->idx_len;
    uint64_t orv = ev->obj_rv ? ev->obj_rv : ev->rv;
    memcpy(d + 4, &il, 4);
    memcpy(d + 8, &orv, 8);
    if (ev->idx_len)
        memcpy(d + OBJ_HEAD, ev->idx, ev->idx_len);
    if (ev->obj_len)
        memcpy(d + OBJ_HEAD + ev->idx_len, ev->obj, ev->obj_len);
    size_t vl = obj_value_len(ev);
    uint32_t crc = w->s->o.checksums ? obj_crc(ev->key, ev->key_len, d, vl) : 0;
    memcpy(d, &crc, 4);
}

/* Put ev's object: built (its value, already in the history entry) copied,
 * or made in place when NULL. */
static int
put_obj(struct store_wtxn *w, struct store_res *r, struct meta_rec *m, const struct store_event *ev,
        bool is_new, const char *built)
{
    MDB_val k = {ev->key_len, (void *)(uintptr_t)ev->key};
    MDB_val v = {obj_value_len(ev), NULL};
    int rc = mdb_put(w->txn, r->objs, &k, &v, MDB_RESERVE);
    if (rc)
        return mdb_err(rc);
    if (built)
        memcpy(v.mv_data, built, v.mv_size);
    else
        obj_value(w, ev, v.mv_data);
    if (is_new)
        m->objects++;
    return 0;
}

int
store_wtxn_event(struct store_wtxn *w, struct store_res *r, const struct store_event *ev)
{
    int err = 0;
    struct meta_rec *m = event_meta(w, r, ev, &err);
    if (!m)
        return err;
    if (ev->type < STORE_ADDED || ev->type > STORE_DELETED)
        return KWC_EPARSE;

    MDB_val k = {ev->key_len, (void *)(uintptr_t)ev->key}, cur;
    int rc = mdb_get(w->txn, r->objs, &k, &cur);
    if (rc && rc != MDB_NOTFOUND)
        return mdb_err(rc);
    struct store_obj prev = {0};
    bool has_prev = rc == 0;
    /* a damaged previous object must not be copied into the new history entry */
    if (has_prev && (rc = decode_obj(r, &k, &cur, &prev)))
        return rc;
    if (ev->rv < m->last_hist_rv)
        return KWC_EPARSE; /* history must not go back in time */
    uint32_t seq = ev->rv == m->last_hist_rv ? m->last_seq + 1 : 0;
    unsigned char hk[HIST_KEY];
    hist_key(ev->rv, seq, hk);

    /* History value first: prev points into the map and may move on the put below. */
    struct hist_head h = {
        .type = (uint8_t)ev->type,
        .has_prev = has_prev,
        .key_len = (uint16_t)ev->key_len,
        .obj_len = (uint32_t)obj_value_len(ev),
        .prev_len = has_prev ? (uint32_t)cur.mv_size : 0,
        .time = w->now,
    };
    if (h.prev_len != (has_prev ? cur.mv_size : 0))
        return KWC_ETOOBIG;
    size_t hl = sizeof(h) + ev->key_len + h.obj_len + h.prev_len;
    char *hv = scratch(w, hl), *p = hv, *built;
    memcpy(p, &h, sizeof(h)), p += sizeof(h);
    memcpy(p, ev->key, ev->key_len), p += ev->key_len;
    obj_value(w, ev, built = p), p += h.obj_len;
    if (has_prev) /* checked above: its crc stays valid */
        memcpy(p, cur.mv_data, cur.mv_size), p += cur.mv_size;
    h.crc = w->s->o.checksums ? hist_crc(hk, hv, ev->key_len) : 0;
    memcpy(hv, &h.crc, sizeof(h.crc));
    /* prev is copied: from here on the map may change under it */
    if ((rc = fidx_update(w, r, ev, has_prev ? &prev : NULL, ev->type != STORE_DELETED)))
        return rc;
    MDB_val hkv = {HIST_KEY, hk}, hvv = {hl, hv};
    /* rvs only grow: appending keeps LMDB's pages full. */
    unsigned put_flags = ev->rv > m->last_hist_rv || m->hist_events == 0 ? MDB_APPEND : 0;
    if ((rc = mdb_put(w->txn, r->hist, &hkv, &hvv, put_flags)))
        return mdb_err(rc);
    m->last_hist_rv = ev->rv;
    m->last_seq = seq;
    m->hist_events++;
    m->hist_bytes += hl;

    if (ev->type == STORE_DELETED) {
        if (has_prev) {
            if ((rc = mdb_del(w->txn, r->objs, &k, NULL)))
                return mdb_err(rc);
            m->objects--;
        }
    } else if ((rc = put_obj(w, r, m, ev, !has_prev, built))) {
        return rc;
    }
    if (ev->rv > m->rv)
        m->rv = ev->rv;
    return 0;
}

int
store_wtxn_load(struct store_wtxn *w, struct store_res *r, const struct store_event *ev)
{
    int err = 0;
    struct meta_rec *m = event_meta(w, r, ev, &err);
    if (!m)
        return err;
    MDB_val k = {ev->key_len, (void *)(uintptr_t)ev->key}, cur;
    int rc = mdb_get(w->txn, r->objs, &k, &cur);
    if (rc && rc != MDB_NOTFOUND)
        return mdb_err(rc);
    bool is_new = rc == MDB_NOTFOUND;
    struct store_obj prev = {0};
    if (!is_new && (rc = decode_obj(r, &k, &cur, &prev)))
        return rc;
    if ((rc = fidx_update(w, r, ev, is_new ? NULL : &prev, true)))
        return rc;
    return put_obj(w, r, m, ev, is_new, NULL);
}

int
store_wtxn_rv(struct store_wtxn *w, struct store_res *r, uint64_t rv)
{
    int err = 0;
    struct meta_rec *m = wmeta(w, r, &err);
    if (!m)
        return err;
    if (rv > m->rv)
        m->rv = rv;
    return 0;
}

int
store_wtxn_reset(struct store_wtxn *w, struct store_res *r, uint64_t rv)
{
    int err = 0;
    struct meta_rec *m = wmeta(w, r, &err);
    if (!m && err == KWC_ECORRUPT) {
        /* a damaged meta is what the reset replaces: kind and identity come
         * back when the new list completes */
        m = &w->meta[r->id];
        memset(m, 0, sizeof(*m));
        m->version = META_VERSION;
        w->loaded[r->id] = w->dirty[r->id] = true;
    }
    if (!m)
        return err;
    int rc;
    if ((rc = mdb_drop(w->txn, r->objs, 0)) || (rc = mdb_drop(w->txn, r->hist, 0)) ||
        (r->ifield >= 0 && (rc = mdb_drop(w->txn, r->fidx, 0))))
        return mdb_err(rc);
    m->rv = m->floor = rv;
    m->objects = m->hist_events = m->hist_bytes = 0;
    m->last_hist_rv = 0;
    m->last_seq = 0;
    m->synced = 0;
    w->reset[r->id] = true;
    return 0;
}

int
store_wtxn_set_synced(struct store_wtxn *w, struct store_res *r, bool synced)
{
    int err = 0;
    struct meta_rec *m = wmeta(w, r, &err);
    if (!m)
        return err;
    m->synced = synced;
    return 0;
}

static void
copy_field(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

int
store_wtxn_set_kind(struct store_wtxn *w, struct store_res *r, const char *list_kind,
                    const char *api_version, bool namespaced)
{
    int err = 0;
    struct meta_rec *m = wmeta(w, r, &err);
    if (!m)
        return err;
    m->flags = (m->flags & ~META_NAMESPACED) | (namespaced ? META_NAMESPACED : 0);
    copy_field(m->list_kind, sizeof(m->list_kind), list_kind);
    copy_field(m->api_version, sizeof(m->api_version), api_version);
    return 0;
}

int
store_wtxn_set_identity(struct store_wtxn *w, struct store_res *r, const char *identity)
{
    int err = 0;
    struct meta_rec *m = wmeta(w, r, &err);
    if (!m)
        return err;
    copy_field(m->identity, sizeof(m->identity), identity);
    return 0;
}

int
store_wtxn_set_unserved(struct store_wtxn *w, struct store_res *r, bool unserved)
{
    int err = 0;
    struct meta_rec *m = wmeta(w, r, &err);
    if (!m)
        return err;
    m->flags = (m->flags & ~META_UNSERVED) | (unserved ? META_UNSERVED : 0);
    return 0;
}

/* Drop the oldest history while any bound is exceeded; the floor follows. */
static int
trim(struct store_wtxn *w, struct store_res *r, struct meta_rec *m, uint64_t now, size_t *budget)
{
    const struct store_options *o = &w->s->o;
    MDB_cursor *c;
    int rc = mdb_cursor_open(w->txn, r->hist, &c);
    if (rc)
        return mdb_err(rc);
    MDB_val k, v;
    while (*budget > 0 && m->hist_events > 0 && (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST)) == 0) {
        struct hist_head h;
        if (hist_head_check(w->s, &k, &v, &h)) {
            rc = hist_damaged(r, &k);
            break;
        }
        uint64_t rv = hist_key_rv(&k);
        /* events at the floor's rv (several at one rv, some trimmed) can no
         * longer be read: history is read from floor + 1 */
        bool over = m->hist_events > o->history_max_events ||
                    m->hist_bytes > o->history_max_bytes ||
                    (o->history_max_age && now > h.time + o->history_max_age) || rv <= m->floor;
        if (!over)
            break;
        size_t sz = v.mv_size;
        if ((rc = mdb_cursor_del(c, 0)))
            break;
        m->hist_events--;
        m->hist_bytes -= sz < m->hist_bytes ? sz : m->hist_bytes;
        if (rv > m->floor)
            m->floor = rv;
        (*budget)--;
    }
    mdb_cursor_close(c);
    return rc == MDB_NOTFOUND || rc == 0 ? 0 : rc == KWC_ECORRUPT ? rc : mdb_err(rc);
}

int
store_wtxn_commit(struct store_wtxn *w)
{
    uint64_t now = w->now;
    int rc = 0;
    size_t budget = TRIM_MAX_PER_COMMIT;
    for (unsigned i = 0; i < w->nres && rc == 0; i++) {
        struct store_res *r = w->s->res[i];
        if (!w->dirty[i])
            continue;
        struct meta_rec *m = &w->meta[i];
        if ((rc = trim(w, r, m, now, &budget)))
            break;
        m->version = META_VERSION;
        m->crc = w->s->o.checksums ? meta_crc(r->name, m) : 0;
        MDB_val k = {strlen(r->name), r->name}, v = {sizeof(*m), m};
        rc = mdb_err(mdb_put(w->txn, w->s->meta, &k, &v, 0));
    }
    if (rc) {
        store_wtxn_abort(w);
        return rc;
    }
    rc = mdb_err(mdb_txn_commit(w->txn));
    /* the damaged data is gone once a reset commits (not before: an aborted
     * reset leaves it in place) */
    for (unsigned i = 0; i < w->nres && rc == 0; i++)
        if (w->reset[i])
            clear_damaged(w->s->res[i]);
    free(w->buf);
    free(w->fbuf);
    free(w->meta);
    free(w->loaded);
    free(w);
    return rc;
}

void
store_wtxn_abort(struct store_wtxn *w)
{
    if (!w)
        return;
    mdb_txn_abort(w->txn);
    free(w->buf);
    free(w->fbuf);
    free(w->meta);
    free(w->loaded);
    free(w);
}

/* ---- reading ---- */

int
store_rtxn_begin(struct store *s, struct store_rtxn **out)
{
    struct store_rtxn *t = xcalloc(1, sizeof(*t));
    t->s = s;
    int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &t->txn);
    if (rc) {
        free(t);
        return mdb_err(rc);
    }
    *out = t;
    return 0;
}

void
store_rtxn_defer_raw_check(struct store_rtxn *t)
{
    t->defer_raw = true;
}

void
store_rtxn_end(struct store_rtxn *t)
{
    if (!t)
        return;
    mdb_txn_abort(t->txn);
    free(t);
}

uint64_t
store_res_rv(struct store *s, struct store_res *r, uint64_t *floor)
{
    struct store_rtxn *t;
    struct store_res_info info = {0};
    if (store_rtxn_begin(s, &t) == 0) {
        store_info(t, r, &info);
        store_rtxn_end(t);
    }
    if (floor)
        *floor = info.floor;
    return info.rv;
}

int
store_info(struct store_rtxn *t, struct store_res *r, struct store_res_info *out)
{
    struct meta_rec m;
    int rc = meta_read(t->txn, r, &m);
    if (rc)
        return rc;
    memset(out, 0, sizeof(*out));
    out->rv = m.rv;
    out->floor = m.floor;
    out->objects = m.objects;
    out->hist_events = m.hist_events;
    out->hist_bytes = m.hist_bytes;
    out->synced = m.synced != 0;
    out->namespaced = (m.flags & META_NAMESPACED) != 0;
    out->unserved = (m.flags & META_UNSERVED) != 0;
    memcpy(out->list_kind, m.list_kind, sizeof(out->list_kind));
    memcpy(out->api_version, m.api_version, sizeof(out->api_version));
    memcpy(out->identity, m.identity, sizeof(out->identity));
    out->list_kind[sizeof(out->list_kind) - 1] = '\0';
    out->api_version[sizeof(out->api_version) - 1] = '\0';
    out->identity[sizeof(out->identity) - 1] = '\0';
    return 0;
}

int
store_get(struct store_rtxn *t, struct store_res *r, const char *key, size_t key_len,
          struct store_obj *out)
{
    MDB_val k = {key_len, (void *)(uintptr_t)key}, v;
    int rc = mdb_get(t->txn, r->objs, &k, &v);
    if (rc)
        return mdb_err(rc);
    return decode_obj(r, &k, &v, out);
}

int
store_history(struct store_rtxn *t, struct store_res *r, uint64_t after_rv, store_hist_cb cb,
              void *arg)
{
    struct meta_rec m;
    int rc = meta_read(t->txn, r, &m);
    if (rc)
        return rc;
    if (after_rv < m.floor)
        return KWC_EEXPIRED;
    MDB_cursor *c;
    if ((rc = mdb_cursor_open(t->txn, r->hist, &c)))
        return mdb_err(rc);
    unsigned char hk[HIST_KEY];
    hist_key(after_rv + 1, 0, hk);
    MDB_val k = {HIST_KEY, hk}, v;
    int out = 0;
    for (rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE); rc == 0;
         rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        struct store_hist h;
        if ((out = decode_hist(r, &k, &v, &h)))
            break;
        int r2 = cb(arg, &h);
        if (r2) {
            out = r2 > 0 ? 0 : r2;
            break;
        }
    }
    mdb_cursor_close(c);
    if (rc && rc != MDB_NOTFOUND)
        return mdb_err(rc);
    return out;
}

/* ---- scanning, at the latest state or at a past rv ---- */

struct overlay_ent {
    const char *key;
    size_t key_len;
    size_t order; /* position in history: the first change after at_rv wins */
    bool present; /* did the object exist at at_rv? */
    struct store_obj prev;
};

struct overlay {
    struct overlay_ent *e;
    size_t n, cap;
};

int
store_keycmp(const char *a, size_t al, const char *b, size_t bl)
{
    int c = memcmp(a, b, al < bl ? al : bl);
    return c ? c : (al < bl ? -1 : al > bl);
}

static int
ent_cmp(const void *x, const void *y)
{
    const struct overlay_ent *a = x, *b = y;
    int c = store_keycmp(a->key, a->key_len, b->key, b->key_len);
    return c ? c : (a->order < b->order ? -1 : a->order > b->order);
}

static int
collect_overlay(void *arg, const struct store_hist *h)
{
    struct overlay *ov = arg;
    if (ov->n == ov->cap) {
        ov->cap = ov->cap ? 2 * ov->cap : 64;
        ov->e = xrealloc(ov->e, ov->cap * sizeof(*ov->e));
    }
    struct overlay_ent *e = &ov->e[ov->n];
    e->key = h->obj.key;
    e->key_len = h->obj.key_len;
    e->order = ov->n;
    e->present = h->prev.raw != NULL;
    e->prev = h->prev;
    ov->n++;
    return 0;
}

static bool
key_in_range(const char *k, size_t kl, const char *prefix, size_t pl, const char *from, size_t fl)
{
    if (kl < pl || memcmp(k, prefix, pl) != 0)
        return false;
    return !from || store_keycmp(k, kl, from, fl) >= 0;
}

/* Where a scan reads current objects from: the objects themselves, or the
 * entries of one value in the field index (then each object is looked up). */
struct src {
    MDB_txn *txn;
    MDB_dbi objs;
    MDB_cursor *c;
    const char *fval; /* field value incl. its NUL, or NULL */
    size_t fvl;
    MDB_val k, v; /* the current object */
};

/* Settle on an entry (crc from the cursor): fill k, v; false at the end. */
static bool
src_settle(struct src *s, int crc, MDB_val *ck, int *err)
{
    if (crc)
        return false;
    if (!s->fval) {
        s->k = *ck;
        return true;
    }
    if (ck->mv_size < s->fvl || memcmp(ck->mv_data, s->fval, s->fvl) != 0)
        return false; /* past this value */
    s->k.mv_size = ck->mv_size - s->fvl;
    s->k.mv_data = (char *)ck->mv_data + s->fvl;
    int rc = mdb_get(s->txn, s->objs, &s->k, &s->v);
    if (rc) /* the index names an object that is not there: never written so */
        *err = rc == MDB_NOTFOUND ? KWC_ESTORE : mdb_err(rc);
    return rc == 0;
}

static bool
src_first(struct src *s, const char *start, size_t sl, int *err)
{
    MDB_val k, v;
    int crc;
    char *buf = NULL;
    if (s->fval) {
        buf = xmalloc(s->fvl + sl + 1);
        memcpy(buf, s->fval, s->fvl);
        memcpy(buf + s->fvl, start, sl);
        k = (MDB_val){s->fvl + sl, buf};
        crc = mdb_cursor_get(s->c, &k, &v, MDB_SET_RANGE);
    } else {
        k = (MDB_val){sl, (void *)(uintptr_t)(start ? start : "")};
        crc = sl ? mdb_cursor_get(s->c, &k, &v, MDB_SET_RANGE)
                 : mdb_cursor_get(s->c, &k, &v, MDB_FIRST);
        s->v = v;
    }
    bool ok = src_settle(s, crc, &k, err);
    free(buf);
    return ok;
}

static bool
src_next(struct src *s, int *err)
{
    MDB_val k, v;
    int crc = mdb_cursor_get(s->c, &k, &v, MDB_NEXT);
    if (!s->fval)
        s->v = v;
    if (crc && crc != MDB_NOTFOUND)
        *err = mdb_err(crc);
    return src_settle(s, crc, &k, err);
}

static int
scan(struct store_rtxn *t, struct store_res *r, uint64_t at_rv, const char *fval,
     const char *prefix, const char *from, size_t fl, store_obj_cb cb, void *arg)
{
    struct meta_rec m;
    int rc = meta_read(t->txn, r, &m);
    if (rc)
        return rc;
    size_t pl = prefix ? strlen(prefix) : 0;
    struct overlay ov = {0};
    if (at_rv && at_rv < m.rv) {
        if (at_rv < m.floor)
            return KWC_EEXPIRED;
        if ((rc = store_history(t, r, at_rv, collect_overlay, &ov)))
            goto out;
        if (ov.n > 1)
            qsort(ov.e, ov.n, sizeof(*ov.e), ent_cmp);
        /* keep the first change per key (lowest order) */
        size_t w = 0;
        for (size_t i = 0; i < ov.n; i++)
            if (w == 0 || store_keycmp(ov.e[w - 1].key, ov.e[w - 1].key_len, ov.e[i].key,
                                       ov.e[i].key_len) != 0)
                ov.e[w++] = ov.e[i];
        ov.n = w;
    }

    struct src sc = {
        .txn = t->txn, .objs = r->objs, .fval = fval, .fvl = fval ? strlen(fval) + 1 : 0};
    if ((rc = mdb_cursor_open(t->txn, fval ? r->fidx : r->objs, &sc.c))) {
        rc = mdb_err(rc);
        goto out;
    }
    /* Position at the first key >= from (or >= prefix). */
    const char *start =
        from && store_keycmp(from, fl, prefix ? prefix : "", pl) > 0 ? from : prefix;
    size_t sl = start == from ? fl : pl;
    int err = 0;
    bool have_c = src_first(&sc, start, sl, &err);
    size_t oi = 0;
    int out = 0;
    while (err == 0) {
        if (have_c && (sc.k.mv_size < pl || memcmp(sc.k.mv_data, prefix, pl) != 0))
            have_c = false; /* past the prefix */
        while (oi < ov.n &&
               !key_in_range(ov.e[oi].key, ov.e[oi].key_len, prefix ? prefix : "", pl, from, fl))
            oi++;
        bool have_o = oi < ov.n;
        if (!have_c && !have_o)
            break;
        struct store_obj o;
        bool emit;
        int cmp = !have_c ? 1
                  : !have_o
                      ? -1
                      : store_keycmp(sc.k.mv_data, sc.k.mv_size, ov.e[oi].key, ov.e[oi].key_len);
        if (cmp < 0) { /* unchanged since at_rv */
            memset(&o, 0, sizeof(o));
            if ((err = t->defer_raw ? decode_obj_head(r, &sc.k, &sc.v, &o)
                                    : decode_obj(r, &sc.k, &sc.v, &o)))
                break;
            emit = true;
            have_c = src_next(&sc, &err);
        } else { /* changed after at_rv: its state then is the first change's prev */
            o = ov.e[oi].prev;
            emit = ov.e[oi].present;
            oi++;
            if (cmp == 0)
                have_c = src_next(&sc, &err);
        }
        if (!emit)
            continue;
        int r2 = cb(arg, &o);
        if (r2) {
            out = r2 > 0 ? 0 : r2;
            break;
        }
    }
    mdb_cursor_close(sc.c);
    rc = out ? out : err;
out:
    free(ov.e);
    return rc;
}

int
store_scan(struct store_rtxn *t, struct store_res *r, uint64_t at_rv, const char *prefix,
           const char *from, size_t fl, store_obj_cb cb, void *arg)
{
    return scan(t, r, at_rv, NULL, prefix, from, fl, cb, arg);
}

int
store_scan_field(struct store_rtxn *t, struct store_res *r, uint64_t at_rv, const char *value,
                 const char *prefix, const char *from, size_t fl, store_obj_cb cb, void *arg)
{
    if (r->ifield < 0)
        return KWC_EPARSE;
    return scan(t, r, at_rv, value, prefix, from, fl, cb, arg);
}

/* Returns 0, KWC_ECORRUPT or an MDB_* code. */
static int
fidx_rebuild(MDB_txn *txn, struct store_res *r)
{
    MDB_cursor *c;
    int rc = mdb_cursor_open(txn, r->objs, &c);
    if (rc)
        return rc;
    MDB_val k, v;
    char *buf = NULL;
    size_t cap = 0;
    for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        struct store_obj o;
        if ((rc = decode_obj(r, &k, &v, &o)))
            break;
        const char *val = idx_field(o.idx, o.idx_len, (size_t)r->ifield);
        if (!val)
            val = "";
        size_t vl = strlen(val), n = vl + 1 + k.mv_size;
        if (n > cap)
            buf = xrealloc(buf, cap = n);
        memcpy(buf, val, vl + 1);
        memcpy(buf + vl + 1, k.mv_data, k.mv_size);
        MDB_val ik = {n, buf}, iv = {0, (void *)(uintptr_t) ""};
        if ((rc = mdb_put(txn, r->fidx, &ik, &iv, 0)))
            break;
    }
    free(buf);
    mdb_cursor_close(c);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

/* Pages of one database, in bytes. */
static uint64_t
db_bytes(MDB_txn *txn, MDB_dbi dbi, unsigned psize)
{
    MDB_stat st;
    if (mdb_stat(txn, dbi, &st) != 0)
        return 0;
    return (uint64_t)(st.ms_branch_pages + st.ms_leaf_pages + st.ms_overflow_pages) * psize;
}

uint64_t
store_res_disk_bytes(struct store *s, struct store_res *r)
{
    MDB_txn *txn;
    if (mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn) != 0)
        return 0;
    MDB_stat env;
    mdb_env_stat(s->env, &env);
    uint64_t n = db_bytes(txn, r->objs, env.ms_psize) + db_bytes(txn, r->hist, env.ms_psize);
    if (r->ifield >= 0)
        n += db_bytes(txn, r->fidx, env.ms_psize);
    mdb_txn_abort(txn);
    return n;
}

int
store_res_clear(struct store *s, struct store_res *r)
{
    MDB_txn *txn;
    int rc = mdb_txn_begin(s->env, NULL, 0, &txn);
    if (rc)
        return mdb_err(rc);
    MDB_val k = {strlen(r->name), r->name};
    if ((rc = mdb_drop(txn, r->objs, 0)) || (rc = mdb_drop(txn, r->hist, 0)) ||
        (r->ifield >= 0 && (rc = mdb_drop(txn, r->fidx, 0)))) {
        mdb_txn_abort(txn);
        return mdb_err(rc);
    }
    rc = mdb_del(txn, s->meta, &k, NULL);
    if (rc && rc != MDB_NOTFOUND) {
        mdb_txn_abort(txn);
        return mdb_err(rc);
    }
    if ((rc = mdb_txn_commit(txn)))
        return mdb_err(rc);
    clear_damaged(r);
    return 0;
}

/* ---- the upstream cluster's identity ---- */

#define CLUSTER_ID_MAX 256

static int
put_cluster_id(MDB_txn *txn, struct store *s, const char *id)
{
    size_t n = strlen(id);
    if (n >= CLUSTER_ID_MAX)
        return KWC_ETOOBIG;
    char v[4 + CLUSTER_ID_MAX];
    uint32_t crc = crc32c(0, id, n);
    memcpy(v, &crc, 4);
    memcpy(v + 4, id, n);
    MDB_val k = {2, (void *)(uintptr_t) "id"}, val = {4 + n, v};
    return mdb_err(mdb_put(txn, s->cluster, &k, &val, 0));
}

int
store_cluster_id(struct store *s, char *buf, size_t len)
{
    buf[0] = '\0';
    MDB_txn *txn;
    int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
    if (rc)
        return mdb_err(rc);
    MDB_val k = {2, (void *)(uintptr_t) "id"}, v;
    rc = mdb_get(txn, s->cluster, &k, &v);
    if (rc == MDB_NOTFOUND) {
        rc = 0;
    } else if (rc) {
        rc = mdb_err(rc);
    } else {
        uint32_t crc;
        size_t n = v.mv_size - 4;
        if (v.mv_size < 4 || n >= CLUSTER_ID_MAX || n >= len)
            rc = KWC_ECORRUPT;
        else if (memcpy(&crc, v.mv_data, 4), crc != crc32c(0, (const char *)v.mv_data + 4, n))
            rc = KWC_ECORRUPT;
        else {
            memcpy(buf, (const char *)v.mv_data + 4, n);
            buf[n] = '\0';
        }
    }
    mdb_txn_abort(txn);
    return rc;
}

int
store_set_cluster_id(struct store *s, const char *id)
{
    MDB_txn *txn;
    int rc = mdb_txn_begin(s->env, NULL, 0, &txn);
    if (rc)
        return mdb_err(rc);
    if ((rc = put_cluster_id(txn, s, id))) {
        mdb_txn_abort(txn);
        return rc;
    }
    return mdb_err(mdb_txn_commit(txn));
}

/* Is dbi one of an open resource's databases? */
static bool
dbi_open_res(const struct store *s, MDB_dbi dbi)
{
    for (unsigned i = 0; i < s->nres; i++) {
        const struct store_res *r = s->res[i];
        if (dbi == r->objs || dbi == r->hist || (r->ifield >= 0 && dbi == r->fidx))
            return true;
    }
    return false;
}

int
store_rebase(struct store *s, const char *id)
{
    static const char *const pfx[] = {"obj:", "hist:", "field:"};
    char **names = NULL;
    size_t n = 0;
    MDB_txn *txn;
    MDB_cursor *c;
    MDB_dbi main_dbi;
    MDB_val k, v;
    int rc = mdb_txn_begin(s->env, NULL, 0, &txn);
    if (rc)
        return mdb_err(rc);
    /* every resource's databases, opened in this run or not: the names
     * first, since dropping one changes the main database */
    if ((rc = mdb_dbi_open(txn, NULL, 0, &main_dbi)) || (rc = mdb_cursor_open(txn, main_dbi, &c)))
        goto abort;
    for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        for (size_t i = 0; i < KWC_ARRAY_LEN(pfx); i++) {
            size_t pl = strlen(pfx[i]);
            if (k.mv_size > pl && k.mv_size < 256 && memcmp(k.mv_data, pfx[i], pl) == 0) {
                names = xrealloc(names, (n + 1) * sizeof(*names));
                names[n++] = xstrndup(k.mv_data, k.mv_size);
            }
        }
    }
    mdb_cursor_close(c);
    if (rc != MDB_NOTFOUND)
        goto abort;
    rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        MDB_dbi dbi;
        if ((rc = mdb_dbi_open(txn, names[i], 0, &dbi)))
            break;
        /* an open resource keeps its handles (emptied); any other is
         * deleted, so that its handle slot is free again */
        rc = mdb_drop(txn, dbi, dbi_open_res(s, dbi) ? 0 : 1);
    }
    if (rc == 0)
        rc = mdb_drop(txn, s->meta, 0);
    if (rc)
        goto abort;
    if ((rc = put_cluster_id(txn, s, id))) {
        mdb_txn_abort(txn);
        goto out;
    }
    if ((rc = mdb_err(mdb_txn_commit(txn))) == 0)
        for (unsigned i = 0; i < s->nres; i++)
            clear_damaged(s->res[i]);
    goto out;
abort:
    mdb_txn_abort(txn);
    rc = mdb_err(rc);
out:
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}

int
store_res_index(struct store_res *r, unsigned field)
{
    if (r->ifield >= 0)
        return r->ifield == (int)field ? 0 : KWC_EPARSE;
    char dbname[256];
    snprintf(dbname, sizeof(dbname), "field:%s", r->name);
    MDB_txn *txn;
    int rc = mdb_txn_begin(r->s->env, NULL, 0, &txn);
    if (rc)
        return mdb_err(rc);
    MDB_stat fs, os;
    if ((rc = mdb_dbi_open(txn, dbname, MDB_CREATE, &r->fidx)) ||
        (rc = mdb_stat(txn, r->fidx, &fs)) || (rc = mdb_stat(txn, r->objs, &os))) {
        mdb_txn_abort(txn);
        return mdb_err(rc);
    }
    r->ifield = (int)field;
    /* a data dir written before the index existed (or for another field):
     * build it from the objects once */
    if (fs.ms_entries != os.ms_entries &&
        ((rc = mdb_drop(txn, r->fidx, 0)) || (rc = fidx_rebuild(txn, r)))) {
        mdb_txn_abort(txn);
        r->ifield = -1;
        return rc == KWC_ECORRUPT ? rc : mdb_err(rc);
    }
    if ((rc = mdb_txn_commit(txn))) {
        r->ifield = -1;
        return mdb_err(rc);
    }
    return 0;
}

/* ---- the full pass ---- */

struct verify {
    struct store *s;
    void (*progress)(void *arg, uint64_t done_bytes);
    void *arg;
    uint64_t done, next_report;
    char *why;
    size_t whylen;
};

static void
verify_count(struct verify *vf, size_t n)
{
    vf->done += n;
    if (vf->progress && vf->done >= vf->next_report) {
        vf->progress(vf->arg, vf->done);
        vf->next_report = vf->done + VERIFY_REPORT;
    }
}

/* Open the named database "pfx:name" in txn; false when it does not exist. */
static int
verify_dbi(MDB_txn *txn, const char *pfx, const char *name, MDB_dbi *dbi, bool *exists)
{
    char dbname[256];
    snprintf(dbname, sizeof(dbname), "%s:%s", pfx, name);
    int rc = mdb_dbi_open(txn, dbname, 0, dbi);
    *exists = rc == 0;
    return rc == MDB_NOTFOUND ? 0 : rc;
}

static int
verify_res(struct verify *vf, const char *name)
{
    struct store *s = vf->s;
    MDB_txn *txn;
    MDB_cursor *c = NULL;
    MDB_dbi objs, hist, fidx;
    bool has_objs, has_hist, has_fidx;
    MDB_val k, v;
    int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
    if (rc)
        return mdb_err(rc);
    struct meta_rec m;
    MDB_val mk = {strlen(name), (void *)(uintptr_t)name};
    rc = mdb_get(txn, s->meta, &mk, &v);
    if (rc == MDB_NOTFOUND) {
        memset(&m, 0, sizeof(m));
    } else if (rc) {
        rc = mdb_err(rc);
        goto out;
    } else if ((rc = meta_check(s, name, &v, &m))) {
        kwc_errf(vf->why, vf->whylen, rc, "resource %s: meta record %s", name,
                 rc == KWC_EFORMAT ? "written by another kwc format"
                                   : "damaged (checksum or size mismatch)");
        goto out;
    }
    if ((rc = verify_dbi(txn, "obj", name, &objs, &has_objs)) ||
        (rc = verify_dbi(txn, "hist", name, &hist, &has_hist)) ||
        (rc = verify_dbi(txn, "field", name, &fidx, &has_fidx))) {
        rc = mdb_err(rc);
        goto out;
    }

    uint64_t nobj = 0;
    if (has_objs) {
        if ((rc = mdb_cursor_open(txn, objs, &c))) {
            rc = mdb_err(rc);
            goto out;
        }
        for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); rc == 0;
             rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
            struct store_obj o;
            if (obj_check(s, &k, &v, &o)) {
                rc = kwc_errf(vf->why, vf->whylen, KWC_ECORRUPT,
                              "resource %s: object %.*s damaged (checksum or layout mismatch)",
                              name, (int)(k.mv_size < KEY_MAX ? k.mv_size : KEY_MAX),
                              (const char *)k.mv_data);
                goto out;
            }
            nobj++;
            verify_count(vf, k.mv_size + v.mv_size);
        }
        if (rc != MDB_NOTFOUND) {
            rc = mdb_err(rc);
            goto out;
        }
        mdb_cursor_close(c);
        c = NULL;
    }

    uint64_t nhist = 0, hbytes = 0, newest = 0;
    if (has_hist) {
        if ((rc = mdb_cursor_open(txn, hist, &c))) {
            rc = mdb_err(rc);
            goto out;
        }
        for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); rc == 0;
             rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
            struct store_hist h;
            unsigned long long hrv = k.mv_size == HIST_KEY ? hist_key_rv(&k) : 0;
            if (hist_check(s, &k, &v, &h)) {
                rc = kwc_errf(vf->why, vf->whylen, KWC_ECORRUPT,
                              "resource %s: history rv %llu damaged (checksum or layout mismatch)",
                              name, hrv);
                goto out;
            }
            if (h.rv <= m.floor || h.rv > m.rv) {
                rc = kwc_errf(vf->why, vf->whylen, KWC_ECORRUPT,
                              "resource %s: history rv %llu outside meta's (floor %llu, rv %llu]",
                              name, hrv, (unsigned long long)m.floor, (unsigned long long)m.rv);
                goto out;
            }
            nhist++;
            hbytes += v.mv_size;
            newest = h.rv;
            verify_count(vf, k.mv_size + v.mv_size);
        }
        if (rc != MDB_NOTFOUND) {
            rc = mdb_err(rc);
            goto out;
        }
    }

    const char *bad = NULL;
    uint64_t said = 0, found = 0;
    MDB_stat fs = {0};
    if (has_fidx && (rc = mdb_stat(txn, fidx, &fs))) {
        rc = mdb_err(rc);
        goto out;
    }
    if (m.objects != nobj)
        bad = "objects", said = m.objects, found = nobj;
    else if (m.hist_events != nhist)
        bad = "hist_events", said = m.hist_events, found = nhist;
    else if (m.hist_bytes != hbytes)
        bad = "hist_bytes", said = m.hist_bytes, found = hbytes;
    else if (nhist && m.last_hist_rv != newest)
        bad = "last_hist_rv", said = m.last_hist_rv, found = newest;
    else if (m.floor > m.rv)
        bad = "floor", said = m.floor, found = m.rv;
    else if (has_fidx && fs.ms_entries != nobj)
        bad = "field index entries", said = fs.ms_entries, found = nobj;
    rc = 0;
    if (bad && strcmp(bad, "floor") == 0)
        rc = kwc_errf(vf->why, vf->whylen, KWC_ECORRUPT,
                      "resource %s: meta floor %llu is above its rv %llu", name,
                      (unsigned long long)said, (unsigned long long)found);
    else if (bad)
        rc = kwc_errf(vf->why, vf->whylen, KWC_ECORRUPT,
                      "resource %s: meta %s is %llu but the data holds %llu", name, bad,
                      (unsigned long long)said, (unsigned long long)found);
out:
    if (c)
        mdb_cursor_close(c);
    mdb_txn_abort(txn); /* closes the handles this txn opened */
    return rc;
}

static void
add_name(char ***names, size_t *n, const char *p, size_t len)
{
    for (size_t i = 0; i < *n; i++)
        if (strlen((*names)[i]) == len && memcmp((*names)[i], p, len) == 0)
            return;
    *names = xrealloc(*names, (*n + 1) * sizeof(**names));
    (*names)[(*n)++] = xstrndup(p, len);
}

int
store_verify(struct store *s, void (*progress)(void *arg, uint64_t done_bytes), void *arg,
             char *why, size_t whylen)
{
    struct verify vf = {.s = s,
                        .progress = progress,
                        .arg = arg,
                        .next_report = VERIFY_REPORT,
                        .why = why,
                        .whylen = whylen};
    if (why && whylen)
        why[0] = '\0';
    char **names = NULL;
    size_t n = 0;
    MDB_txn *txn;
    MDB_cursor *c;
    MDB_dbi main_dbi;
    MDB_val k, v;
    int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
    if (rc)
        return mdb_err(rc);
    /* the resources: the named databases (keys of LMDB's main database), and
     * the meta records (their keys are resource names) */
    static const char *const pfx[] = {"obj:", "hist:", "field:"};
    if ((rc = mdb_dbi_open(txn, NULL, 0, &main_dbi)) || (rc = mdb_cursor_open(txn, main_dbi, &c)))
        goto done;
    for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        for (size_t i = 0; i < KWC_ARRAY_LEN(pfx); i++) {
            size_t pl = strlen(pfx[i]);
            if (k.mv_size > pl && memcmp(k.mv_data, pfx[i], pl) == 0)
                add_name(&names, &n, (const char *)k.mv_data + pl, k.mv_size - pl);
        }
    }
    mdb_cursor_close(c);
    if (rc != MDB_NOTFOUND || (rc = mdb_cursor_open(txn, s->meta, &c)))
        goto done;
    for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(c, &k, &v, MDB_NEXT))
        add_name(&names, &n, k.mv_data, k.mv_size);
    mdb_cursor_close(c);
done:
    mdb_txn_abort(txn);
    rc = rc == MDB_NOTFOUND ? 0 : mdb_err(rc);
    for (size_t i = 0; i < n; i++) {
        if (rc == 0 && strlen(names[i]) > 200)
            rc = kwc_errf(why, whylen, KWC_ECORRUPT, "a resource name of %zu bytes",
                          strlen(names[i]));
        if (rc == 0)
            rc = verify_res(&vf, names[i]);
        free(names[i]);
    }
    free(names);
    if (rc == 0 && progress)
        progress(arg, vf.done);
    return rc;
}

int
store_env_info(struct store *s, struct store_env_info *out)
{
    MDB_envinfo ei;
    MDB_stat st;
    int rc = mdb_env_info(s->env, &ei);
    if (rc == 0)
        rc = mdb_env_stat(s->env, &st);
    if (rc != 0)
        return mdb_err(rc);
    out->map_size = (uint64_t)ei.me_mapsize;
    out->page_size = st.ms_psize;
    /* pages in use: up to the last one written (freed pages stay in the file for reuse) */
    out->used_bytes = ((uint64_t)ei.me_last_pgno + 1) * st.ms_psize;
    out->readers = ei.me_numreaders;
    out->max_readers = ei.me_maxreaders;
    return 0;
}
