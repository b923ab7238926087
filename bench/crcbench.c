/*
 * crcbench.c — what the store's per-value checksums cost, measured in one run
 * with store_options.checksums on and off (alternating, fresh data dir each):
 *
 *   crc32c      raw CRC-32C GB/s, dispatched (hardware) and table code, over
 *               3 KiB buffers and a 1 MiB buffer
 *   ingest      store_wtxn_event of ~3 KiB pod-like MODIFIED events, 64 per
 *               write transaction (the reflector commits once per loop turn);
 *               store only: the JSON parsing the reflector also does is left
 *               out, so the relative cost shown is an upper bound
 *   scan        store_scan over every object at the latest state, copying
 *               each object's bytes out as a list answer does (GB/s of object
 *               bytes), and without the copy (the bare read)
 *
 *   crcbench DIR [OBJECTS...]     (default: 3000 100000)
 *
 * DIR is a scratch directory (emptied). Prints a markdown table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/crc32c.h"
#include "kwc/store.h"

#define BATCH 64
#define POOL 64

static double
now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static char *pool[POOL];
static size_t pool_len[POOL];

/* ~3 KiB pods, as bench/ingest.c writes them (list items: no TypeMeta). */
static void
make_pool(void)
{
    char pad[2600];
    memset(pad, 'x', sizeof(pad) - 1);
    pad[sizeof(pad) - 1] = '\0';
    for (int i = 0; i < POOL; i++) {
        pool[i] = xasprintf(
            "{\"metadata\":{\"name\":\"pod-%d\",\"namespace\":\"ns-%d\",\"uid\":\"1b4e28ba-2fa1-"
            "11d2-883f-%012d\",\"resourceVersion\":\"%d\",\"labels\":{\"app\":\"app-%d\"},"
            "\"annotations\":{\"pad\":\"%s\"}},\"spec\":{\"containers\":[{\"name\":\"main\","
            "\"image\":\"registry.example.com/app:1.4.2\"}],\"nodeName\":\"node-%d\"},\"status\":"
            "{\"phase\":\"Running\",\"podIP\":\"10.1.%d.%d\"}}",
            i, i % 10, i, 1000 + i, i % 50, pad, i % 100, i / 250, i % 250);
        pool_len[i] = strlen(pool[i]);
    }
}

static void
wipe(const char *dir)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/lock.mdb", dir);
    unlink(p);
    mkdir(dir, 0700);
}

static const char idx[] = "\0\0\0\0";

static int
event(struct store_wtxn *w, struct store_res *r, int type, uint64_t rv, int k)
{
    char key[64];
    int kl = snprintf(key, sizeof key, "ns-%d/pod-%07d", k % 10, k);
    struct store_event ev = {.type = type,
                             .rv = rv,
                             .key = key,
                             .key_len = (size_t)kl,
                             .obj = pool[k % POOL],
                             .obj_len = pool_len[k % POOL],
                             .idx = idx,
                             .idx_len = 4};
    return type ? store_wtxn_event(w, r, &ev) : store_wtxn_load(w, r, &ev);
}

struct sink {
    char buf[65536];
    size_t at, bytes;
    bool copy;
};

static int
on_obj(void *arg, const struct store_obj *o)
{
    struct sink *s = arg;
    s->bytes += o->raw_len;
    if (s->copy) {
        if (s->at + o->raw_len > sizeof(s->buf))
            s->at = 0;
        memcpy(s->buf + s->at, o->raw, o->raw_len < sizeof(s->buf) ? o->raw_len : sizeof(s->buf));
        s->at += o->raw_len;
    }
    return 0;
}

struct result {
    double ingest_eps, scan_gbs, scan_bare_gbs;
};

static int
run_store(const char *dir, int nobj, bool checksums, struct result *res)
{
    wipe(dir);
    struct store_options o;
    store_options_default(&o);
    o.map_size = (uint64_t)16 << 30;
    o.checksums = checksums;
    struct store *st;
    struct store_res *r;
    int rc = store_open(dir, &o, &st);
    if (rc || (rc = store_res(st, "v1/pods:json", &r)))
        return rc;
    uint64_t rv = 1000;
    struct store_wtxn *w = NULL;
    store_wtxn_begin(st, 1, &w);
    store_wtxn_reset(w, r, rv);
    for (int i = 0; i < nobj; i++) {
        if ((rc = event(w, r, 0, ++rv, i)))
            return rc;
        if ((i + 1) % 500 == 0) {
            store_wtxn_commit(w);
            store_wtxn_begin(st, 1, &w);
        }
    }
    store_wtxn_commit(w);

    /* events: as many as objects (at least 30000), spread over the keys */
    int nev = nobj < 30000 ? 30000 : nobj;
    double t0 = now_s();
    store_wtxn_begin(st, 2, &w);
    for (int e = 0; e < nev; e++) {
        int k = (int)(((unsigned)e * 2654435761u) % (unsigned)nobj);
        if ((rc = event(w, r, STORE_MODIFIED, ++rv, k)))
            return rc;
        if ((e + 1) % BATCH == 0) {
            if ((rc = store_wtxn_commit(w)))
                return rc;
            store_wtxn_begin(st, 2, &w);
        }
    }
    if ((rc = store_wtxn_commit(w)))
        return rc;
    res->ingest_eps = nev / (now_s() - t0);

    /* full scans, repeated to ~1.5 GB read */
    int reps = (int)(1.5e9 / ((double)nobj * 3000)) + 1;
    for (int pass = 0; pass < 2; pass++) {
        struct sink *sk = xcalloc(1, sizeof(*sk));
        sk->copy = pass == 0;
        t0 = now_s();
        for (int i = 0; i < reps; i++) {
            struct store_rtxn *t;
            store_rtxn_begin(st, &t);
            rc = store_scan(t, r, 0, "", NULL, 0, on_obj, sk);
            store_rtxn_end(t);
            if (rc)
                return rc;
        }
        double gbs = sk->bytes / (now_s() - t0) / 1e9;
        *(pass == 0 ? &res->scan_gbs : &res->scan_bare_gbs) = gbs;
        free(sk);
    }
    store_close(st);
    wipe(dir);
    return 0;
}

static int
cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double
crc_gbs_once(uint32_t (*fn)(uint32_t, const void *, size_t), const char *buf, size_t len,
             size_t total)
{
    volatile uint32_t sink = 0;
    size_t reps = total / len;
    double t0 = now_s();
    for (size_t i = 0; i < reps; i++)
        sink ^= fn(sink, buf + (i & 7), len);
    (void)sink;
    return (double)reps * len / (now_s() - t0) / 1e9;
}

/* The median of three runs. */
static double
crc_gbs(uint32_t (*fn)(uint32_t, const void *, size_t), const char *buf, size_t len, size_t total)
{
    double v[3];
    for (int i = 0; i < 3; i++)
        v[i] = crc_gbs_once(fn, buf, len, total);
    qsort(v, 3, sizeof(double), cmp_d);
    return v[1];
}

int
main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: crcbench DIR [OBJECTS...]\n");
        return 2;
    }
    make_pool();
    size_t big = (size_t)1 << 20;
    char *buf = xmalloc(big + 8);
    for (size_t i = 0; i < big + 8; i++)
        buf[i] = (char)(i * 131 + 7);
    printf("crc32c implementation: %s\n\n", crc32c_impl());
    printf("| crc32c | 3 KiB buffers | 1 MiB buffer |\n|---|---|---|\n");
    printf("| %s | %.2f GB/s | %.2f GB/s |\n", crc32c_impl(),
           crc_gbs(crc32c, buf, 3072, (size_t)4 << 30), crc_gbs(crc32c, buf, big, (size_t)4 << 30));
    printf("| table (slice-by-8) | %.2f GB/s | %.2f GB/s |\n\n",
           crc_gbs(crc32c_sw, buf, 3072, (size_t)1 << 30),
           crc_gbs(crc32c_sw, buf, big, (size_t)1 << 30));
    free(buf);

    printf("| objects | checksums | ingest events/s | scan + copy GB/s | bare scan GB/s |\n");
    printf("|---|---|---|---|---|\n");
    int nsizes = argc > 2 ? argc - 2 : 2;
    for (int si = 0; si < nsizes; si++) {
        int nobj = argc > 2 ? atoi(argv[2 + si]) : si == 0 ? 3000 : 100000;
        /* alternate on and off three times; report each one's median */
        double v[2][3][3];
        for (int run = 0; run < 3; run++) {
            for (int m = 0; m < 2; m++) {
                struct result res;
                int rc = run_store(argv[1], nobj, m == 0, &res);
                if (rc) {
                    fprintf(stderr, "store: %s\n", kwc_strerror(rc));
                    return 1;
                }
                v[m][0][run] = res.ingest_eps;
                v[m][1][run] = res.scan_gbs;
                v[m][2][run] = res.scan_bare_gbs;
            }
        }
        double med[2][3];
        for (int m = 0; m < 2; m++) {
            for (int q = 0; q < 3; q++) {
                qsort(v[m][q], 3, sizeof(double), cmp_d);
                med[m][q] = v[m][q][1];
            }
            printf("| %d | %s | %.0f | %.2f | %.2f |\n", nobj, m == 0 ? "on" : "off", med[m][0],
                   med[m][1], med[m][2]);
        }
        printf("| %d | slower with checksums | %.1f %% | %.1f %% | %.1f %% |\n", nobj,
               100.0 * (med[1][0] - med[0][0]) / med[1][0],
               100.0 * (med[1][1] - med[0][1]) / med[1][1],
               100.0 * (med[1][2] - med[0][2]) / med[1][2]);
        fflush(stdout);
    }
    return 0;
}
