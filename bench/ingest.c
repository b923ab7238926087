/*
 * ingest.c — the reflector's per-event work without the network: parse a
 * watch event line, parse the object's metadata and indexed fields, encode
 * the index, cut the TypeMeta, apply it to the LMDB store, one write
 * transaction per batch (the reflector commits once per loop turn). Also the
 * initial load path (store_wtxn_load, 500 objects per transaction, as one
 * LIST page). Prints one line per phase: objects or events per second.
 *
 *   ingest DIR [PODS] [EVENTS] [BATCH]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kwc/base.h"
#include "kwc/index.h"
#include "kwc/kinds.h"
#include "kwc/object.h"
#include "kwc/store.h"

static double
now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* A pod of about 4 KiB as kube-apiserver writes it on a watch. */
static int
pod_json(char *buf, size_t cap, int i, unsigned long long rv, const char *pad)
{
    return snprintf(
        buf, cap,
        "{\"kind\":\"Pod\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"pod-%d\",\"namespace\":"
        "\"ns-%d\",\"uid\":\"1b4e28ba-2fa1-11d2-883f-%012d\",\"resourceVersion\":\"%llu\","
        "\"creationTimestamp\":\"2026-11-21T07:00:00Z\",\"labels\":{\"app\":\"app-%d\","
        "\"pod-template-hash\":\"5d8f7c9b%02d\",\"tier\":\"backend\"},\"annotations\":"
        "{\"pad\":\"%s\"},\"ownerReferences\":[{\"apiVersion\":\"apps/v1\",\"kind\":\"ReplicaSet\","
        "\"name\":\"app-%d-5d8f7c9b\",\"uid\":\"9c1d\",\"controller\":true,\"blockOwnerDeletion\":"
        "true}]},"
        "\"spec\":{\"containers\":[{\"name\":\"main\",\"image\":\"registry.example.com/app:1.4.2\","
        "\"resources\":{\"requests\":{\"cpu\":\"100m\",\"memory\":\"128Mi\"}}}],\"restartPolicy\":"
        "\"Always\",\"serviceAccountName\":\"default\",\"nodeName\":\"node-%d\",\"schedulerName\":"
        "\"default-scheduler\"},\"status\":{\"phase\":\"Running\",\"podIP\":\"10.1.%d.%d\","
        "\"startTime\":\"2026-11-21T07:00:01Z\"}}",
        i, i % 10, i, rv, i % 50, i % 100, pad, i % 50, i % 1000, (i / 250) % 250, i % 250);
}

int
main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: ingest DIR [PODS] [EVENTS] [BATCH]\n");
        return 2;
    }
    int pods = argc > 2 ? atoi(argv[2]) : 150000;
    int events = argc > 3 ? atoi(argv[3]) : 200000;
    int batch = argc > 4 ? atoi(argv[4]) : 64;
    char pad[3300];
    memset(pad, 'x', sizeof(pad) - 1);
    pad[sizeof(pad) - 1] = '\0';

    struct store_options o;
    store_options_default(&o);
    o.map_size = (uint64_t)16 << 30;
    struct store *st;
    int rc = store_open(argv[1], &o, &st);
    if (rc) {
        fprintf(stderr, "store_open %s: %s\n", argv[1], kwc_strerror(rc));
        return 1;
    }
    struct store_res *r;
    store_res(st, "v1/pods:json", &r);
    store_res_index(r, (unsigned)kinds_index_field("", "pods"));
    size_t nf;
    const struct obj_field *fields = kinds_fields("", "pods", &nf);
    struct obj_fields_spec spec = {.fields = fields, .n_fields = nf};
    static const char tm[] = "{\"kind\":\"Pod\",\"apiVersion\":\"v1\",";
    size_t tml = sizeof(tm) - 1;

    char *obj = xmalloc(8192), *line = xmalloc(9000), *item = xmalloc(8192);
    unsigned long long rv = 1000;
    size_t bytes = 0;

    /* initial load: list items (no TypeMeta), 500 per transaction */
    double t0 = now_s();
    struct store_wtxn *w = NULL;
    store_wtxn_begin(st, 1, &w);
    store_wtxn_reset(w, r, rv);
    for (int i = 0; i < pods; i++) {
        int n = pod_json(obj, 8192, i, ++rv, pad);
        item[0] = '{';
        memcpy(item + 1, obj + tml, (size_t)n - tml);
        size_t il = (size_t)n - tml + 1;
        struct obj_meta m;
        if (obj_meta_parse(item, il, &spec, &m, NULL, 0) != 0)
            return 1;
        char key[128], *idx;
        size_t idxl;
        int kl = snprintf(key, sizeof key, "%s/%s", m.namespace_, m.name);
        idx_encode(&m, &idx, &idxl);
        struct store_event ev = {.rv = m.rv,
                                 .key = key,
                                 .key_len = (size_t)kl,
                                 .obj = item,
                                 .obj_len = il,
                                 .idx = idx,
                                 .idx_len = idxl};
        if ((rc = store_wtxn_load(w, r, &ev)) != 0)
            return 1;
        bytes += il;
        free(idx);
        obj_meta_fini(&m);
        if ((i + 1) % 500 == 0) {
            store_wtxn_commit(w);
            store_wtxn_begin(st, 1, &w);
        }
    }
    store_wtxn_set_synced(w, r, true);
    store_wtxn_commit(w);
    double t1 = now_s();
    printf("load: %d objects, %.0f MB in %.2f s: %.0f objects/s, %.0f MB/s\n", pods, bytes / 1e6,
           t1 - t0, pods / (t1 - t0), bytes / 1e6 / (t1 - t0));

    /* watch events: parse the line, the object, the index; one txn per batch */
    bytes = 0;
    t0 = now_s();
    store_wtxn_begin(st, 2, &w);
    for (int e = 0; e < events; e++) {
        int i = (int)(((unsigned)e * 2654435761u) % (unsigned)pods);
        int n = pod_json(obj, 8192, i, ++rv, pad);
        int ll = snprintf(line, 9000, "{\"type\":\"MODIFIED\",\"object\":%.*s}\n", n, obj);
        struct wevent we;
        if (wevent_parse(line, (size_t)ll, &we, NULL, 0) != 0)
            return 1;
        const char *o2 = line + we.obj_off;
        size_t ol = we.obj_len;
        struct obj_meta m;
        if (obj_meta_parse(o2, ol, &spec, &m, NULL, 0) != 0)
            return 1;
        char key[128], *idx;
        size_t idxl;
        int kl = snprintf(key, sizeof key, "%s/%s", m.namespace_, m.name);
        idx_encode(&m, &idx, &idxl);
        item[0] = '{';
        memcpy(item + 1, o2 + tml, ol - tml);
        struct store_event ev = {.type = STORE_MODIFIED,
                                 .rv = m.rv,
                                 .key = key,
                                 .key_len = (size_t)kl,
                                 .obj = item,
                                 .obj_len = ol - tml + 1,
                                 .idx = idx,
                                 .idx_len = idxl};
        if ((rc = store_wtxn_event(w, r, &ev)) != 0) {
            fprintf(stderr, "event: %s\n", kwc_strerror(rc));
            return 1;
        }
        bytes += (size_t)ll;
        free(idx);
        obj_meta_fini(&m);
        wevent_fini(&we);
        if ((e + 1) % batch == 0) {
            store_wtxn_commit(w);
            store_wtxn_begin(st, 2, &w);
        }
    }
    store_wtxn_commit(w);
    t1 = now_s();
    printf("ingest: %d events (batches of %d), %.0f MB in %.2f s: %.0f events/s, %.0f MB/s\n",
           events, batch, bytes / 1e6, t1 - t0, events / (t1 - t0), bytes / 1e6 / (t1 - t0));
    free(obj);
    free(line);
    free(item);
    store_close(st);
    return 0;
}
