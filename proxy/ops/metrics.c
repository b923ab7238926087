/*
 * metrics.c — the registry and the text exposition format (see metrics.h).
 *
 * A stored family keeps its series in shards, one per recording thread
 * (metrics_thread_shard): each serving loop counts its requests under its
 * own shard's mutex, which only a scrape ever contends for. A shard keeps
 * its series in a hash keyed by the label values (each value followed by a
 * NUL, so "a","bc" and "ab","c" differ). A render sums the shards' series
 * of the same key into one sample. Series are never removed, so a merge may
 * borrow their values after the shard's lock is released. The bound on
 * label sets is the family's, over all shards (its key set, consulted only
 * when a shard meets a label set for the first time): a caller choosing
 * resource names cannot keep METRICS_MAX_SERIES series in every loop. The
 * registry's
 * own mutex guards only the lists of families and collectors. Stored
 * families are updated once per request, never per watch event — the
 * fan-out path counts in per-worker memory that collectors read at scrape
 * time.
 */
#include "kwc/metrics.h"

#include <assert.h>
#include <math.h>
#include <stdalign.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>

#include "kwc/base.h"

const double metrics_request_buckets[] = {0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8,
                                          1.0,   1.25,  1.5,  2,   3,   4,   5,   6,
                                          8,     10,    15,   20,  30,  45,  60};
const size_t metrics_request_nbuckets = KWC_ARRAY_LEN(metrics_request_buckets);
const double metrics_client_buckets[] = {0.005, 0.025, 0.1, 0.25, 0.5,  1.0,
                                         2.0,   4.0,   8.0, 15.0, 30.0, 60.0};
const size_t metrics_client_nbuckets = KWC_ARRAY_LEN(metrics_client_buckets);

/* ---- histograms ---- */

void
metrics_hist_init(struct metrics_hist *h, const double *bounds, size_t n)
{
    *h = (struct metrics_hist){.bounds = bounds, .n = n};
    h->counts = xcalloc(n + 1, sizeof(*h->counts));
}

void
metrics_hist_fini(struct metrics_hist *h)
{
    free(h->counts);
    h->counts = NULL;
}

void
metrics_hist_observe(struct metrics_hist *h, double v)
{
    /* the first bound >= v (le is inclusive); NaN lands in +Inf only */
    size_t lo = 0, hi = h->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v <= h->bounds[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    if (isnan(v))
        lo = h->n;
    h->counts[lo]++;
    h->count++;
    h->sum += v;
}

/* ---- the writer ---- */

void
metrics_write_value(struct gostr_buf *b, double v)
{
    char t[40];
    if (isnan(v)) {
        gostr_add(b, "NaN");
        return;
    }
    if (isinf(v)) {
        gostr_add(b, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    if (v == 0) {
        gostr_add(b, "0");
        return;
    }
    if (fabs(v) < 1e15 && v == (double)(long long)v) {
        snprintf(t, sizeof(t), "%lld", (long long)v);
        gostr_add(b, t);
        return;
    }
    /* the shortest %g that reads back as v (Go's strconv 'g', -1) */
    for (int p = 1; p <= 17; p++) {
        snprintf(t, sizeof(t), "%.*g", p, v);
        if (strtod(t, NULL) == v)
            break;
    }
    gostr_add(b, t);
}

/* Append a label value escaped as the format wants (\\, \", \n). */
static void
write_escaped(struct gostr_buf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\')
            gostr_add(b, "\\\\");
        else if (*s == '"')
            gostr_add(b, "\\\"");
        else if (*s == '\n')
            gostr_add(b, "\\n");
        else
            gostr_addc(b, *s);
    }
}

void
metrics_write_family(struct metrics_writer *w, const char *name, const char *help,
                     enum metrics_type t)
{
    gostr_add(&w->b, "# HELP ");
    gostr_add(&w->b, name);
    gostr_addc(&w->b, ' ');
    for (const char *s = help; *s; s++) {
        if (*s == '\\')
            gostr_add(&w->b, "\\\\");
        else if (*s == '\n')
            gostr_add(&w->b, "\\n");
        else
            gostr_addc(&w->b, *s);
    }
    gostr_add(&w->b, "\n# TYPE ");
    gostr_add(&w->b, name);
    gostr_add(&w->b, t == METRICS_COUNTER ? " counter\n"
                     : t == METRICS_GAUGE ? " gauge\n"
                                          : " histogram\n");
}

static void
write_labels(struct gostr_buf *b, const char *const *labels, const char *const *values, size_t n,
             const char *le)
{
    if (n == 0 && !le)
        return;
    gostr_addc(b, '{');
    for (size_t i = 0; i < n; i++) {
        if (i)
            gostr_addc(b, ',');
        gostr_add(b, labels[i]);
        gostr_add(b, "=\"");
        write_escaped(b, values[i] ? values[i] : "");
        gostr_addc(b, '"');
    }
    if (le) {
        if (n)
            gostr_addc(b, ',');
        gostr_add(b, "le=\"");
        gostr_add(b, le);
        gostr_addc(b, '"');
    }
    gostr_addc(b, '}');
}

void
metrics_write_sample(struct metrics_writer *w, const char *name, const char *const *labels,
                     const char *const *values, size_t n, double v)
{
    gostr_add(&w->b, name);
    write_labels(&w->b, labels, values, n, NULL);
    gostr_addc(&w->b, ' ');
    metrics_write_value(&w->b, v);
    gostr_addc(&w->b, '\n');
}

static void
write_suffixed(struct metrics_writer *w, const char *name, const char *suffix,
               const char *const *labels, const char *const *values, size_t n, const char *le,
               double v)
{
    gostr_add(&w->b, name);
    gostr_add(&w->b, suffix);
    write_labels(&w->b, labels, values, n, le);
    gostr_addc(&w->b, ' ');
    metrics_write_value(&w->b, v);
    gostr_addc(&w->b, '\n');
}

void
metrics_write_hist(struct metrics_writer *w, const char *name, const char *const *labels,
                   const char *const *values, size_t n, const struct metrics_hist *h)
{
    uint64_t cum = 0;
    for (size_t i = 0; i < h->n; i++) {
        cum += h->counts[i];
        struct gostr_buf le = {0};
        metrics_write_value(&le, h->bounds[i]);
        write_suffixed(w, name, "_bucket", labels, values, n, le.p, (double)cum);
        free(gostr_take(&le));
    }
    write_suffixed(w, name, "_bucket", labels, values, n, "+Inf", (double)h->count);
    write_suffixed(w, name, "_sum", labels, values, n, NULL, h->sum);
    write_suffixed(w, name, "_count", labels, values, n, NULL, (double)h->count);
}

/* ---- the registry ---- */

struct series {
    UT_hash_handle hh;
    char **values;               /* a shard's: copies */
    const char *const *borrowed; /* a merge's: a shard's values */
    double v;
    struct metrics_hist hist;
    char *key;
    size_t key_len;
};

/* A thread's series of one family (mu guards the rest). Aligned apart so
 * loops that count at once do not share a cache line. */
struct shard {
    alignas(64) pthread_mutex_t mu;
    struct series *series; /* uthash */
    struct series **order; /* in creation order, for a stable exposition */
    size_t n, cap;
};

#define NSHARDS 32

struct keyent {
    UT_hash_handle hh;
    char *key;
    size_t len;
};

struct metrics_family {
    struct metrics *m;
    enum metrics_type type;
    const char *name, *help;
    const char *const *labels;
    size_t nlabels;
    const double *bounds;
    size_t nbounds;
    struct metrics_family *next;
    /* the family's distinct label sets, whichever shard holds them: the
     * bound (METRICS_MAX_SERIES) is on these. Taken only when a shard meets
     * a label set for the first time. */
    pthread_mutex_t keys_mu;
    struct keyent *keys; /* uthash */
    size_t nkeys;
    struct shard sh[NSHARDS];
};

/* The shard this thread records into (metrics_thread_shard). */
static _Thread_local unsigned thread_shard;

void
metrics_thread_shard(unsigned i)
{
    thread_shard = i % NSHARDS;
}

struct collector {
    metrics_collect_cb cb;
    void *arg;
    void (*free_arg)(void *arg);
    struct collector *next;
};

struct metrics {
    pthread_mutex_t mu;
    struct metrics_family *families, **ftail;
    struct collector *collectors, **ctail;
};

struct metrics *
metrics_new(void)
{
    struct metrics *m = xcalloc(1, sizeof(*m));
    pthread_mutex_init(&m->mu, NULL);
    m->ftail = &m->families;
    m->ctail = &m->collectors;
    return m;
}

static void
series_free(struct series *s, size_t nlabels)
{
    for (size_t k = 0; k < nlabels; k++)
        free(s->values[k]);
    free(s->values);
    free(s->key);
    metrics_hist_fini(&s->hist);
    free(s);
}

void
metrics_free(struct metrics *m)
{
    if (!m)
        return;
    for (struct metrics_family *f = m->families, *fn; f; f = fn) {
        fn = f->next;
        for (size_t i = 0; i < NSHARDS; i++) {
            struct shard *sh = &f->sh[i];
            HASH_CLEAR(hh, sh->series);
            for (size_t k = 0; k < sh->n; k++)
                series_free(sh->order[k], f->nlabels);
            free(sh->order);
            pthread_mutex_destroy(&sh->mu);
        }
        struct keyent *k, *kn;
        HASH_ITER(hh, f->keys, k, kn)
        {
            HASH_DEL(f->keys, k);
            free(k->key);
            free(k);
        }
        pthread_mutex_destroy(&f->keys_mu);
        free(f);
    }
    for (struct collector *c = m->collectors, *cn; c; c = cn) {
        cn = c->next;
        if (c->free_arg)
            c->free_arg(c->arg);
        free(c);
    }
    pthread_mutex_destroy(&m->mu);
    free(m);
}

struct metrics_family *
metrics_family_new(struct metrics *m, enum metrics_type t, const char *name, const char *help,
                   const char *const *labels, size_t nlabels, const double *bounds, size_t nbounds)
{
    struct metrics_family *f = xaligned_calloc(alignof(struct metrics_family), sizeof(*f));
    *f = (struct metrics_family){.m = m,
                                 .type = t,
                                 .name = name,
                                 .help = help,
                                 .labels = labels,
                                 .nlabels = nlabels,
                                 .bounds = bounds,
                                 .nbounds = nbounds};
    pthread_mutex_init(&f->keys_mu, NULL);
    for (size_t i = 0; i < NSHARDS; i++)
        pthread_mutex_init(&f->sh[i].mu, NULL);
    pthread_mutex_lock(&m->mu);
    *m->ftail = f;
    m->ftail = &f->next;
    pthread_mutex_unlock(&m->mu);
    return f;
}

static char *
series_key(const struct metrics_family *f, const char *const *values, size_t *len)
{
    size_t n = 0;
    for (size_t i = 0; i < f->nlabels; i++)
        n += strlen(values[i] ? values[i] : "") + 1;
    char *k = xmalloc(n ? n : 1), *p = k;
    for (size_t i = 0; i < f->nlabels; i++) {
        size_t l = strlen(values[i] ? values[i] : "") + 1;
        memcpy(p, values[i] ? values[i] : "", l);
        p += l;
    }
    *len = n;
    return k;
}

/* A new series of values under key (taken), values copied unless borrowed
 * (a render's merge borrows a shard's, which live as long as the registry). */
static struct series *
series_new(const struct metrics_family *f, char *key, size_t len, const char *const *values,
           bool borrow)
{
    struct series *s = xcalloc(1, sizeof(*s));
    s->key = key;
    s->key_len = len;
    if (borrow) {
        s->borrowed = values;
    } else {
        s->values = xcalloc(f->nlabels ? f->nlabels : 1, sizeof(char *));
        for (size_t i = 0; i < f->nlabels; i++)
            s->values[i] = xstrdup(values[i] ? values[i] : "");
    }
    if (f->type == METRICS_HISTOGRAM)
        metrics_hist_init(&s->hist, f->bounds, f->nbounds);
    return s;
}

/* Appends s to a hash and its order array (a shard's, or a merge's). */
static void
series_add(struct series **hash, struct series ***order, size_t *n, size_t *cap, struct series *s)
{
    HASH_ADD_KEYPTR(hh, *hash, s->key, s->key_len, s);
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 16;
        *order = xrealloc(*order, *cap * sizeof(**order));
    }
    (*order)[(*n)++] = s;
}

static const char *const overflow_values[] = {
    METRICS_OVERFLOW, METRICS_OVERFLOW, METRICS_OVERFLOW, METRICS_OVERFLOW,
    METRICS_OVERFLOW, METRICS_OVERFLOW, METRICS_OVERFLOW, METRICS_OVERFLOW,
};

/* Whether the label set of key may have a series of its own: it has one in
 * some shard already, or the family has fewer than METRICS_MAX_SERIES. */
static bool
key_admit(struct metrics_family *f, const char *key, size_t len)
{
    pthread_mutex_lock(&f->keys_mu);
    struct keyent *k = NULL;
    HASH_FIND(hh, f->keys, key, len, k);
    bool ok = k || f->nkeys < METRICS_MAX_SERIES;
    if (!k && ok) {
        k = xcalloc(1, sizeof(*k));
        k->key = xmemdup(key, len);
        k->len = len;
        HASH_ADD_KEYPTR(hh, f->keys, k->key, k->len, k);
        f->nkeys++;
    }
    pthread_mutex_unlock(&f->keys_mu);
    return ok;
}

/* This thread's series of values in f, created when missing (its shard's
 * lock held); past the family's bound, the overflow series, which takes
 * the rest. */
static struct series *
series_of(struct metrics_family *f, struct shard *sh, const char *const *values)
{
    size_t len;
    char *key = series_key(f, values, &len);
    struct series *s = NULL;
    HASH_FIND(hh, sh->series, key, len, s);
    if (!s && !key_admit(f, key, len)) {
        free(key);
        assert(f->nlabels <= KWC_ARRAY_LEN(overflow_values));
        values = overflow_values;
        key = series_key(f, values, &len);
        HASH_FIND(hh, sh->series, key, len, s);
    }
    if (s) {
        free(key);
        return s;
    }
    s = series_new(f, key, len, values, false);
    series_add(&sh->series, &sh->order, &sh->n, &sh->cap, s);
    return s;
}

void
metrics_add(struct metrics_family *f, const char *const *values, double v)
{
    struct shard *sh = &f->sh[thread_shard];
    pthread_mutex_lock(&sh->mu);
    series_of(f, sh, values)->v += v;
    pthread_mutex_unlock(&sh->mu);
}

void
metrics_observe(struct metrics_family *f, const char *const *values, double v)
{
    assert(f->type == METRICS_HISTOGRAM);
    struct shard *sh = &f->sh[thread_shard];
    pthread_mutex_lock(&sh->mu);
    metrics_hist_observe(&series_of(f, sh, values)->hist, v);
    pthread_mutex_unlock(&sh->mu);
}

double
metrics_get(struct metrics_family *f, const char *const *values)
{
    size_t len;
    char *key = series_key(f, values, &len);
    double v = 0;
    for (size_t i = 0; i < NSHARDS; i++) {
        struct shard *sh = &f->sh[i];
        struct series *s = NULL;
        pthread_mutex_lock(&sh->mu);
        HASH_FIND(hh, sh->series, key, len, s);
        if (s)
            v += s->v;
        pthread_mutex_unlock(&sh->mu);
    }
    free(key);
    return v;
}

/* A family's series summed over its shards: a merge's own series (keys and
 * sums), borrowing the shards' label values. */
struct merged {
    struct series *hash;
    struct series **order;
    size_t n, cap;
};

static void
merge_shard(const struct metrics_family *f, struct merged *mg, struct shard *sh)
{
    pthread_mutex_lock(&sh->mu);
    for (size_t i = 0; i < sh->n; i++) {
        const struct series *x = sh->order[i];
        struct series *s = NULL;
        HASH_FIND(hh, mg->hash, x->key, x->key_len, s);
        if (!s) {
            s = series_new(f, xmemdup(x->key, x->key_len), x->key_len,
                           (const char *const *)x->values, true);
            series_add(&mg->hash, &mg->order, &mg->n, &mg->cap, s);
        }
        s->v += x->v;
        if (f->type == METRICS_HISTOGRAM) {
            for (size_t b = 0; b <= x->hist.n; b++)
                s->hist.counts[b] += x->hist.counts[b];
            s->hist.count += x->hist.count;
            s->hist.sum += x->hist.sum;
        }
    }
    pthread_mutex_unlock(&sh->mu);
}

static void
write_merged(struct metrics_writer *w, struct metrics_family *f)
{
    struct merged mg = {0};
    for (size_t i = 0; i < NSHARDS; i++)
        merge_shard(f, &mg, &f->sh[i]);
    for (size_t i = 0; i < mg.n; i++) {
        struct series *s = mg.order[i];
        const char *const *vals = s->borrowed;
        if (f->type == METRICS_HISTOGRAM)
            metrics_write_hist(w, f->name, f->labels, vals, f->nlabels, &s->hist);
        else
            metrics_write_sample(w, f->name, f->labels, vals, f->nlabels, s->v);
    }
    HASH_CLEAR(hh, mg.hash);
    for (size_t i = 0; i < mg.n; i++) {
        free(mg.order[i]->key);
        metrics_hist_fini(&mg.order[i]->hist);
        free(mg.order[i]);
    }
    free(mg.order);
}

void
metrics_collector_add(struct metrics *m, metrics_collect_cb cb, void *arg,
                      void (*free_arg)(void *arg))
{
    struct collector *c = xcalloc(1, sizeof(*c));
    c->cb = cb;
    c->arg = arg;
    c->free_arg = free_arg;
    pthread_mutex_lock(&m->mu);
    *m->ctail = c;
    m->ctail = &c->next;
    pthread_mutex_unlock(&m->mu);
}

char *
metrics_render(struct metrics *m, size_t *len)
{
    struct metrics_writer w = {0};
    pthread_mutex_lock(&m->mu); /* then each shard's, in turn */
    for (struct metrics_family *f = m->families; f; f = f->next) {
        metrics_write_family(&w, f->name, f->help, f->type);
        write_merged(&w, f);
    }
    struct collector *cs = m->collectors;
    pthread_mutex_unlock(&m->mu);
    /* collectors take their own locks: not under the registry's */
    for (struct collector *c = cs; c; c = c->next)
        c->cb(c->arg, &w);
    if (len)
        *len = w.b.len;
    return gostr_take(&w.b);
}
