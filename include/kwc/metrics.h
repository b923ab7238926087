/*
 * metrics.h — Prometheus metrics: a small registry and the text exposition
 * format, version 0.0.4 (DESIGN.md "Operations").
 *
 * Two kinds of families:
 *  - stored: counters, gauges and histograms with a fixed set of label names,
 *    whose series (one per set of label values) live in the registry and are
 *    updated as things happen (metrics_add / metrics_observe).
 *    Thread-safe: each thread records into its own shard
 *    (metrics_thread_shard), under a lock only a scrape contends for; a
 *    render sums the shards. For per-request counts, never for anything per
 *    watch event;
 *  - collected: a collector called at scrape time writes whole families from
 *    statistics the modules keep themselves (per-worker counters, store
 *    sizes, reflector counters) through the writer (metrics_write_*).
 * metrics_render writes the stored families, then each collector's, in the
 * order they were added. Every family's samples are written together, each
 * family once, as the format requires.
 *
 * The format: "# HELP name text" (\ and newline escaped), "# TYPE name
 * counter|gauge|histogram", then `name{label="value",...} value` lines, label
 * values escaped (\\, \", \n). A histogram writes name_bucket{...,le="B"}
 * cumulative counts for each bound B in order, then le="+Inf" (= name_count),
 * name_sum and name_count. Values are written as the shortest decimal that
 * reads back as the same double (integers without a point), +Inf, -Inf, NaN.
 */
#ifndef KWC_METRICS_H
#define KWC_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kwc/gostr.h"

enum metrics_type { METRICS_COUNTER, METRICS_GAUGE, METRICS_HISTOGRAM };

/* Content-Type of the text format. */
#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* ---- histograms ---- */

/*
 * Observations counted per bucket (not cumulative: the writer sums them).
 * counts[i] holds the observations v with bounds[i-1] < v <= bounds[i];
 * counts[n] those above the last bound (le="+Inf" only). bounds ascend and
 * are borrowed (static tables).
 */
struct metrics_hist {
    const double *bounds;
    size_t n;
    uint64_t *counts; /* n + 1 */
    uint64_t count;
    double sum;
};

void metrics_hist_init(struct metrics_hist *h, const double *bounds, size_t n);
void metrics_hist_fini(struct metrics_hist *h);
void metrics_hist_observe(struct metrics_hist *h, double v);

/* kube-apiserver's apiserver_request_duration_seconds buckets (seconds). */
extern const double metrics_request_buckets[];
extern const size_t metrics_request_nbuckets;
/* client-go's rest_client_request_duration_seconds buckets (seconds). */
extern const double metrics_client_buckets[];
extern const size_t metrics_client_nbuckets;

/* ---- the writer (collectors, and the registry itself) ---- */

struct metrics_writer {
    struct gostr_buf b;
};

/* "# HELP" and "# TYPE" of a family; its samples follow. */
void metrics_write_family(struct metrics_writer *w, const char *name, const char *help,
                          enum metrics_type t);
/* One sample: name{labels[i]="values[i]",...} v. n may be 0. */
void metrics_write_sample(struct metrics_writer *w, const char *name, const char *const *labels,
                          const char *const *values, size_t n, double v);
/* A histogram's samples (_bucket for each bound and +Inf, _sum, _count). */
void metrics_write_hist(struct metrics_writer *w, const char *name, const char *const *labels,
                        const char *const *values, size_t n, const struct metrics_hist *h);
/* Append the text form of a sample value (shortest round-trip decimal). */
void metrics_write_value(struct gostr_buf *b, double v);

/* ---- the registry ---- */

struct metrics;
struct metrics_family;

/* Label values beyond this many series per family are counted under one
 * series whose every label value is METRICS_OVERFLOW. */
#define METRICS_MAX_SERIES 4096
#define METRICS_OVERFLOW "_other"

struct metrics *metrics_new(void);
/* Frees the families; collectors' args are the callers'. Accepts NULL. */
void metrics_free(struct metrics *m);

/*
 * A stored family. name, help, labels and bounds are borrowed (static
 * strings and tables) and must outlive m. bounds/nbounds: histograms only.
 * Returns the family (valid for m's life).
 */
struct metrics_family *metrics_family_new(struct metrics *m, enum metrics_type t, const char *name,
                                          const char *help, const char *const *labels,
                                          size_t nlabels, const double *bounds, size_t nbounds);
/* The shard this thread records into from now on (taken modulo a fixed
 * count; 0 until called). Each serving loop takes its own, so requests on
 * different loops never wait for each other's counts. */
void metrics_thread_shard(unsigned i);
/* Record into the series of these label values (nlabels strings, copied on
 * first use). Any thread. */
void metrics_add(struct metrics_family *f, const char *const *values, double v);
void metrics_observe(struct metrics_family *f, const char *const *values, double v);
/* The value of a counter or gauge series, 0 when it has none (tests). */
double metrics_get(struct metrics_family *f, const char *const *values);

/* Called at every render, in the order added, after the stored families;
 * writes whole families. Loop thread of the render. free_arg (may be NULL)
 * is called on arg by metrics_free. */
typedef void (*metrics_collect_cb)(void *arg, struct metrics_writer *w);
void metrics_collector_add(struct metrics *m, metrics_collect_cb cb, void *arg,
                           void (*free_arg)(void *arg));

/* The exposition (new string, NUL-terminated; its length in *len). */
char *metrics_render(struct metrics *m, size_t *len);

#endif
