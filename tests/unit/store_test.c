/*
 * store_test.c — cache/store.c against an in-test model: every event applied
 * to the store is also applied to a plain array of snapshots, so the state at
 * any rv is known independently of the code under test. Fresh LMDB dir per
 * test, time injected.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/store.h"
#include "lmdbdir.h"
#include "tap.h"

#define NKEYS 24
#define MAXEV 600

static char dir[256];

static void
fresh_dir(void)
{
    lmdbdir_make(dir, sizeof dir, "store-test");
}

static void
rm_dir(void)
{
    lmdbdir_rm(dir);
}

static struct store *
open_store(uint64_t max_events, uint64_t max_age)
{
    struct store_options o;
    store_options_default(&o);
    o.map_size = 256 << 20;
    if (max_events)
        o.history_max_events = max_events;
    o.history_max_age = max_age;
    struct store *s = NULL;
    if (store_open(dir, &o, &s) != 0)
        abort();
    return s;
}

/* ---- the model ---- */

struct mobj {
    bool present;
    uint64_t rv;
    char raw[64];
    int node; /* the indexed field's value: "node-<node>" */
};
static struct mobj model[MAXEV + 2][NKEYS]; /* model[i] = state after the i-th event */
static uint64_t model_rv[MAXEV + 2];

static void
keyname(int k, char *out)
{
    /* two "namespaces", keys in byte order differ from index order on purpose */
    sprintf(out, "%s/obj-%02d", k % 2 ? "ns-b" : "ns-a", (k * 7) % NKEYS);
}

struct collect {
    char keys[NKEYS * 2][32];
    char raws[NKEYS * 2][64];
    uint64_t rvs[NKEYS * 2];
    int n;
};

static int
on_obj(void *arg, const struct store_obj *o)
{
    struct collect *c = arg;
    if (c->n == NKEYS * 2)
        return -1;
    snprintf(c->keys[c->n], 32, "%.*s", (int)o->key_len, o->key);
    snprintf(c->raws[c->n], 64, "%.*s", (int)o->raw_len, (const char *)o->raw);
    c->rvs[c->n] = o->rv;
    c->n++;
    return 0;
}

static int
cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Expected listing of model state i, filtered by prefix and after, in byte order. */
static int
expected(int i, const char *prefix, const char *after, struct collect *out)
{
    char names[NKEYS][32];
    char *sorted[NKEYS];
    int n = 0;
    for (int k = 0; k < NKEYS; k++) {
        if (!model[i][k].present)
            continue;
        keyname(k, names[k]);
        if (strncmp(names[k], prefix, strlen(prefix)) != 0)
            continue;
        if (after && strcmp(names[k], after) <= 0)
            continue;
        sorted[n++] = names[k];
    }
    qsort(sorted, (size_t)n, sizeof(char *), cmp_str);
    out->n = 0;
    for (int j = 0; j < n; j++) {
        int k = (int)((sorted[j] - &names[0][0]) / 32);
        strcpy(out->keys[j], sorted[j]);
        strcpy(out->raws[j], model[i][k].raw);
        out->rvs[j] = model[i][k].rv;
        out->n++;
    }
    return n;
}

static bool
same(const struct collect *a, const struct collect *b)
{
    if (a->n != b->n)
        return false;
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->keys[i], b->keys[i]) || strcmp(a->raws[i], b->raws[i]) ||
            a->rvs[i] != b->rvs[i])
            return false;
    return true;
}

/* Apply nev random events (fixed seed), several per write txn, to store and model. */
static int
churn(struct store *s, struct store_res *r, int nev, uint64_t first_rv, uint64_t now)
{
    srand(42);
    memset(model, 0, sizeof model);
    model_rv[0] = first_rv - 1;
    uint64_t rv = first_rv;
    int i = 0;
    while (i < nev) {
        struct store_wtxn *w;
        if (store_wtxn_begin(s, now, &w) != 0)
            return -1;
        int batch = 1 + rand() % 7;
        for (int b = 0; b < batch && i < nev; b++, i++) {
            memcpy(model[i + 1], model[i], sizeof model[i]);
            int k = rand() % NKEYS;
            struct mobj *m = &model[i + 1][k];
            enum store_ev_type t = !m->present       ? STORE_ADDED
                                   : rand() % 4 == 0 ? STORE_DELETED
                                                     : STORE_MODIFIED;
            char key[32], raw[64], idx[64];
            keyname(k, key);
            snprintf(raw, sizeof raw, "{\"k\":%d,\"rv\":%llu}", k, (unsigned long long)rv);
            /* index bytes as cache/index.c lays them out: no labels, fields
             * name, namespace, node (the one indexed) */
            int node = t == STORE_DELETED ? m->node : rand() % 3;
            int il = 4 + sprintf(idx + 4, "n%c-%cnode-%d", 0, 0, node) + 1;
            idx[0] = 0, idx[1] = 0, idx[2] = 3, idx[3] = 0;
            struct store_event ev = {.type = t,
                                     .rv = rv,
                                     .key = key,
                                     .key_len = strlen(key),
                                     .obj = raw,
                                     .obj_len = strlen(raw),
                                     .idx = idx,
                                     .idx_len = (size_t)il};
            if (store_wtxn_event(w, r, &ev) != 0)
                return -1;
            if (t == STORE_DELETED) {
                m->present = false;
            } else {
                m->present = true;
                m->rv = rv;
                m->node = node;
                strcpy(m->raw, raw);
            }
            model_rv[i + 1] = rv;
            rv += 1 + (uint64_t)(rand() % 3); /* gaps, like other resources' writes */
        }
        if (store_wtxn_commit(w) != 0)
            return -1;
    }
    return 0;
}

static void
test_apply_get_scan(void)
{
    fresh_dir();
    struct store *s = open_store(0, 0);
    struct store_res *r;
    is_int(store_res(s, "v1/pods:json", &r), 0, "resource opened");
    struct store_res *r2;
    store_res(s, "v1/pods:json", &r2);
    ok(r == r2, "same name, same resource");
    is_int(churn(s, r, 200, 100, 1000), 0, "200 events applied");

    struct store_rtxn *t;
    store_rtxn_begin(s, &t);
    struct store_res_info info;
    is_int(store_info(t, r, &info), 0, "info");
    is_int(info.rv, model_rv[200], "rv is the last event's");
    int live = 0;
    for (int k = 0; k < NKEYS; k++)
        live += model[200][k].present;
    is_int(info.objects, live, "object count");
    is_int(info.hist_events, 200, "history holds every event");

    struct collect got = {0}, want;
    is_int(store_scan(t, r, 0, "", NULL, 0, on_obj, &got), 0, "scan latest");
    expected(200, "", NULL, &want);
    ok(same(&got, &want), "latest state equals the model, in key order");

    memset(&got, 0, sizeof got);
    store_scan(t, r, 0, "ns-b/", NULL, 0, on_obj, &got);
    expected(200, "ns-b/", NULL, &want);
    ok(same(&got, &want), "prefix ns-b/");

    if (want.n > 2) {
        char after[32];
        strcpy(after, want.keys[1]);
        memset(&got, 0, sizeof got);
        store_scan(t, r, 0, "ns-b/", after, strlen(after) + 1, on_obj, &got);
        expected(200, "ns-b/", after, &want);
        ok(same(&got, &want), "prefix and after (a continue)");
        /* from is inclusive: without the NUL the key itself comes first */
        memset(&got, 0, sizeof got);
        store_scan(t, r, 0, "ns-b/", after, strlen(after), on_obj, &got);
        ok(got.n == want.n + 1 && strcmp(got.keys[0], after) == 0,
           "from without the NUL starts at the key itself");
        /* a from before the prefix starts at the prefix */
        memset(&got, 0, sizeof got);
        store_scan(t, r, 0, "ns-b/", "ns-a/zzz", 8, on_obj, &got);
        expected(200, "ns-b/", NULL, &want);
        ok(same(&got, &want), "from before the prefix lists the whole prefix");
    }

    for (int k = 0; k < NKEYS; k++) {
        char key[32];
        keyname(k, key);
        struct store_obj o;
        int rc = store_get(t, r, key, strlen(key), &o);
        if (model[200][k].present) {
            if (rc != 0 || o.rv != model[200][k].rv || o.raw_len != strlen(model[200][k].raw)) {
                ok(0, "get returns the latest object");
                break;
            }
        } else if (rc != KWC_ENOTFOUND) {
            ok(0, "get of a deleted object is KWC_ENOTFOUND");
            break;
        }
        if (k == NKEYS - 1)
            ok(1, "get agrees with the model for every key");
    }
    store_rtxn_end(t);
    store_close(s);
    rm_dir();
}

static void
test_scan_at_every_past_rv(void)
{
    fresh_dir();
    struct store *s = open_store(0, 0);
    struct store_res *r;
    store_res(s, "v1/configmaps:json", &r);
    churn(s, r, 300, 1000, 1000);
    struct store_rtxn *t;
    store_rtxn_begin(s, &t);
    int bad = 0, checked = 0;
    const char *prefixes[] = {"", "ns-a/"};
    for (int i = 0; i <= 300; i++) {
        for (int p = 0; p < 2; p++) {
            struct collect got = {0}, want;
            uint64_t at = model_rv[i];
            int rc = store_scan(t, r, at, prefixes[p], NULL, 0, on_obj, &got);
            expected(i, prefixes[p], NULL, &want);
            if (rc != 0 || !same(&got, &want)) {
                if (bad++ < 3)
                    printf("# state at rv %llu (event %d, prefix '%s'): rc %d, got %d objects, "
                           "want %d\n",
                           (unsigned long long)at, i, prefixes[p], rc, got.n, want.n);
            }
            /* page through it two at a time with "after", as continue tokens do */
            struct collect pages = {0};
            char after[32] = "";
            for (int guard = 0; guard < NKEYS; guard++) {
                struct collect page = {0};
                store_scan(t, r, at, prefixes[p], after[0] ? after : NULL, strlen(after) + 1,
                           on_obj, &page);
                int take = page.n < 2 ? page.n : 2;
                for (int j = 0; j < take; j++) {
                    strcpy(pages.keys[pages.n], page.keys[j]);
                    strcpy(pages.raws[pages.n], page.raws[j]);
                    pages.rvs[pages.n++] = page.rvs[j];
                }
                if (page.n <= 2)
                    break;
                strcpy(after, page.keys[1]);
            }
            if (!same(&pages, &want) && bad++ < 3)
                printf("# paged state at rv %llu differs\n", (unsigned long long)at);
            checked++;
        }
    }
    is_int(bad, 0, "scan at every past rv (whole and paged) equals the model");
    ok(checked == 602, "checked every rv with both prefixes");
    store_rtxn_end(t);
    store_close(s);
    rm_dir();
}

struct hcollect {
    int n;
    uint64_t last_rv;
    bool ordered, prev_ok;
};

static int
on_hist(void *arg, const struct store_hist *h)
{
    struct hcollect *c = arg;
    if (h->rv < c->last_rv)
        c->ordered = false;
    c->last_rv = h->rv;
    if ((h->type == STORE_ADDED) != (h->prev.raw == NULL))
        c->prev_ok = false;
    c->n++;
    return 0;
}

static void
test_history_and_trim(void)
{
    fresh_dir();
    struct store *s = open_store(100, 0);
    struct store_res *r;
    store_res(s, "v1/pods:json", &r);
    churn(s, r, 300, 1, 1000);
    struct store_rtxn *t;
    store_rtxn_begin(s, &t);
    struct store_res_info info;
    store_info(t, r, &info);
    is_int(info.hist_events, 100, "history trimmed to 100 events");
    ok(info.floor >= model_rv[200] && info.floor < model_rv[201],
       "floor = rv of the newest trimmed event");
    struct hcollect hc = {.ordered = true, .prev_ok = true};
    is_int(store_history(t, r, info.floor, on_hist, &hc), 0, "history from the floor");
    is_int(hc.n, 100, "every kept event after the floor");
    ok(hc.ordered, "in rv order");
    ok(hc.prev_ok, "ADDED has no previous object, the others have one");
    is_int(store_history(t, r, info.floor - 1, on_hist, &hc), KWC_EEXPIRED,
           "below the floor: expired");
    struct collect got = {0}, want;
    is_int(store_scan(t, r, info.floor - 1, "", NULL, 0, on_obj, &got), KWC_EEXPIRED,
           "a list below the floor: expired");
    memset(&got, 0, sizeof got);
    is_int(store_scan(t, r, info.floor, "", NULL, 0, on_obj, &got), 0, "a list at the floor works");
    expected(200, "", NULL, &want);
    ok(same(&got, &want), "...and equals the model at that rv");
    store_rtxn_end(t);
    store_close(s);
    rm_dir();
}

static void
test_trim_by_age_and_reopen(void)
{
    fresh_dir();
    struct store *s = open_store(0, 600);
    struct store_res *r;
    store_res(s, "apps/v1/deployments:json", &r);
    churn(s, r, 50, 10, 1000); /* events at t=1000 */
    struct store_wtxn *w;
    store_wtxn_begin(s, 1500, &w);
    struct store_event ev = {.type = STORE_ADDED,
                             .rv = model_rv[50] + 10,
                             .key = "zz/new",
                             .key_len = 6,
                             .obj = "{}",
                             .obj_len = 2};
    store_wtxn_event(w, r, &ev);
    store_wtxn_rv(w, r, model_rv[50] + 20); /* a bookmark */
    store_wtxn_set_synced(w, r, true);
    store_wtxn_set_kind(w, r, "DeploymentList", "apps/v1", true);
    store_wtxn_set_identity(w, r, "https://up:6443 uid=abc");
    is_int(store_wtxn_commit(w), 0, "commit at t=1500 keeps events younger than 600 s");
    store_close(s);

    s = open_store(0, 600);
    store_res(s, "apps/v1/deployments:json", &r);
    struct store_rtxn *t;
    store_rtxn_begin(s, &t);
    struct store_res_info info;
    store_info(t, r, &info);
    is_int(info.hist_events, 51, "reopened: history kept");
    is_int(info.rv, model_rv[50] + 20, "reopened: rv includes the bookmark");
    ok(info.synced, "reopened: synced flag");
    is_str(info.list_kind, "DeploymentList", "reopened: list kind");
    ok(info.namespaced, "reopened: namespaced");
    is_str(info.api_version, "apps/v1", "reopened: apiVersion");
    is_str(info.identity, "https://up:6443 uid=abc", "reopened: upstream identity");
    store_rtxn_end(t);

    store_wtxn_begin(s, 1700, &w); /* 700 s after the first 50 events */
    store_wtxn_rv(w, r, model_rv[50] + 30);
    store_wtxn_commit(w);
    store_rtxn_begin(s, &t);
    store_info(t, r, &info);
    is_int(info.hist_events, 1, "events older than 600 s trimmed");
    is_int(info.floor, model_rv[50], "floor moved to the newest trimmed event");
    store_rtxn_end(t);
    store_close(s);
    rm_dir();
}

/* A protobuf cache of an upstream without protobuf: the answer is kept across
 * a reopen, apart from the kind (set_kind does not clear it), until cleared. */
static void
test_unserved(void)
{
    fresh_dir();
    struct store *s = open_store(0, 0);
    struct store_res *r, *j;
    store_res(s, "v1/pods:json", &j);
    store_res(s, "v1/pods:pb", &r);
    struct store_wtxn *w;
    store_wtxn_begin(s, 1, &w);
    store_wtxn_set_unserved(w, r, true);
    store_wtxn_set_kind(w, r, "PodList", "v1", true);
    is_int(store_wtxn_commit(w), 0, "recorded");
    store_close(s);
    s = open_store(0, 0);
    store_res(s, "v1/pods:json", &j);
    store_res(s, "v1/pods:pb", &r);
    struct store_rtxn *t;
    struct store_res_info info;
    store_rtxn_begin(s, &t);
    store_info(t, r, &info);
    ok(info.unserved && info.namespaced, "reopened: unserved, and namespaced beside it");
    store_info(t, j, &info);
    ok(!info.unserved, "the other resource is not");
    store_rtxn_end(t);
    store_wtxn_begin(s, 2, &w);
    store_wtxn_set_kind(w, r, "PodList", "v1", false);
    store_wtxn_commit(w);
    store_rtxn_begin(s, &t);
    store_info(t, r, &info);
    ok(info.unserved && !info.namespaced, "set_kind leaves it");
    store_rtxn_end(t);
    store_wtxn_begin(s, 3, &w);
    store_wtxn_set_unserved(w, r, false);
    store_wtxn_commit(w);
    store_rtxn_begin(s, &t);
    store_info(t, r, &info);
    ok(!info.unserved, "cleared");
    store_rtxn_end(t);
    store_close(s);
    rm_dir();
}

static void
test_same_rv_and_reset(void)
{
    fresh_dir();
    struct store *s = open_store(0, 0);
    struct store_res *r;
    store_res(s, "v1/nodes:json", &r);
    struct store_wtxn *w;
    store_wtxn_begin(s, 1, &w);
    const char *keys[] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        struct store_event ev = {.type = STORE_ADDED,
                                 .rv = (uint64_t)(10 + i),
                                 .key = keys[i],
                                 .key_len = 1,
                                 .obj = "{}",
                                 .obj_len = 2};
        store_wtxn_event(w, r, &ev);
    }
    store_wtxn_commit(w);
    /* a relist diff: several DELETED at one rv */
    store_wtxn_begin(s, 2, &w);
    int rc = 0;
    for (int i = 0; i < 3; i++) {
        struct store_event ev = {.type = STORE_DELETED,
                                 .rv = 50,
                                 .key = keys[i],
                                 .key_len = 1,
                                 .obj = "{}",
                                 .obj_len = 2};
        rc |= store_wtxn_event(w, r, &ev);
    }
    is_int(rc, 0, "three events at one rv");
    is_int(store_wtxn_commit(w), 0, "committed");
    struct store_rtxn *t;
    store_rtxn_begin(s, &t);
    struct hcollect hc = {.ordered = true, .prev_ok = true};
    store_history(t, r, 12, on_hist, &hc);
    is_int(hc.n, 3, "all three DELETED events kept");
    struct collect got = {0};
    store_scan(t, r, 12, "", NULL, 0, on_obj, &got);
    is_int(got.n, 3, "state just before them has all three");
    memset(&got, 0, sizeof got);
    store_scan(t, r, 50, "", NULL, 0, on_obj, &got);
    is_int(got.n, 0, "state at the delete rv has none");
    store_rtxn_end(t);

    store_wtxn_begin(s, 3, &w);
    struct store_event back = {
        .type = STORE_ADDED, .rv = 40, .key = "x", .key_len = 1, .obj = "{}", .obj_len = 2};
    is_int(store_wtxn_event(w, r, &back), KWC_EPARSE, "an event older than history is refused");
    store_wtxn_abort(w);

    store_wtxn_begin(s, 3, &w);
    store_wtxn_reset(w, r, 70);
    store_wtxn_commit(w);
    store_rtxn_begin(s, &t);
    struct store_res_info info;
    store_info(t, r, &info);
    ok(info.rv == 70 && info.floor == 70 && info.objects == 0 && info.hist_events == 0 &&
           !info.synced,
       "reset empties the resource at the new rv");
    store_rtxn_end(t);
    store_close(s);
    rm_dir();
}

static void
test_initial_load(void)
{
    fresh_dir();
    struct store *s = open_store(0, 0);
    struct store_res *r;
    store_res(s, "v1/secrets:json", &r);
    struct store_wtxn *w;
    store_wtxn_begin(s, 1, &w);
    store_wtxn_reset(w, r, 500); /* a list at rv 500 */
    const char *keys[] = {"ns/b", "ns/a", "ns/c"};
    for (int i = 0; i < 3; i++) {
        struct store_event ev = {
            .rv = (uint64_t)(100 + i), .key = keys[i], .key_len = 4, .obj = "{}", .obj_len = 2};
        store_wtxn_load(w, r, &ev);
    }
    store_wtxn_set_synced(w, r, true);
    is_int(store_wtxn_commit(w), 0, "loaded");
    struct store_rtxn *t;
    store_rtxn_begin(s, &t);
    struct store_res_info info;
    store_info(t, r, &info);
    ok(info.objects == 3 && info.hist_events == 0 && info.rv == 500 && info.floor == 500 &&
           info.synced,
       "three objects, no history, rv and floor at the list's rv");
    struct collect got = {0};
    store_scan(t, r, 0, "", NULL, 0, on_obj, &got);
    ok(got.n == 3 && strcmp(got.keys[0], "ns/a") == 0 && got.rvs[0] == 101,
       "objects keep their own rv, in key order");
    store_rtxn_end(t);
    /* the first event after the list records the loaded object as its previous state */
    store_wtxn_begin(s, 2, &w);
    struct store_event up = {.type = STORE_MODIFIED,
                             .rv = 501,
                             .key = "ns/a",
                             .key_len = 4,
                             .obj = "{\"x\":1}",
                             .obj_len = 7};
    store_wtxn_event(w, r, &up);
    store_wtxn_commit(w);
    store_rtxn_begin(s, &t);
    memset(&got, 0, sizeof got);
    store_scan(t, r, 500, "", NULL, 0, on_obj, &got);
    ok(got.n == 3 && strcmp(got.raws[0], "{}") == 0, "state at the list rv is the loaded one");
    store_rtxn_end(t);
    store_close(s);
    rm_dir();
}

/* The field index: at every past rv, for every value and prefix, the
 * objects it yields, filtered by their state's value, are exactly the
 * model's objects with that value. */
static int
check_field_scans(struct store *s, struct store_res *r, int nev)
{
    struct store_rtxn *t;
    store_rtxn_begin(s, &t);
    int bad = 0;
    const char *prefixes[] = {"", "ns-b/"};
    for (int i = 0; i <= nev; i++) {
        for (int node = 0; node < 3; node++) {
            for (int p = 0; p < 2; p++) {
                char val[32];
                snprintf(val, sizeof val, "node-%d", node);
                struct collect got = {0}, want = {0}, all;
                int rc =
                    store_scan_field(t, r, model_rv[i], val, prefixes[p], NULL, 0, on_obj, &got);
                /* keep what was the value at that rv (the model knows) */
                struct collect kept = {0};
                for (int j = 0; j < got.n; j++) {
                    for (int k = 0; k < NKEYS; k++) {
                        char kn[32];
                        keyname(k, kn);
                        if (strcmp(kn, got.keys[j]) == 0 && model[i][k].node == node) {
                            kept.n++;
                            memcpy(kept.keys[kept.n - 1], got.keys[j], 32);
                            memcpy(kept.raws[kept.n - 1], got.raws[j], 64);
                            kept.rvs[kept.n - 1] = got.rvs[j];
                        }
                    }
                }
                expected(i, prefixes[p], NULL, &all);
                for (int j = 0; j < all.n; j++) {
                    for (int k = 0; k < NKEYS; k++) {
                        char kn[32];
                        keyname(k, kn);
                        if (strcmp(kn, all.keys[j]) == 0 && model[i][k].node == node) {
                            want.n++;
                            memcpy(want.keys[want.n - 1], all.keys[j], 32);
                            memcpy(want.raws[want.n - 1], all.raws[j], 64);
                            want.rvs[want.n - 1] = all.rvs[j];
                        }
                    }
                }
                if (rc != 0 || !same(&kept, &want)) {
                    if (bad++ < 3)
                        printf("# field scan at event %d node-%d prefix '%s': rc %d, %d kept, want "
                               "%d\n",
                               i, node, prefixes[p], rc, kept.n, want.n);
                }
            }
        }
    }
    store_rtxn_end(t);
    return bad;
}

static void
test_field_index(void)
{
    fresh_dir();
    struct store *s = open_store(0, 0);
    struct store_res *r;
    store_res(s, "v1/pods:json", &r);
    struct store_rtxn *t;
    store_rtxn_begin(s, &t);
    is_int(store_scan_field(t, r, 0, "x", "", NULL, 0, on_obj, NULL), KWC_EPARSE,
           "no index declared: KWC_EPARSE");
    store_rtxn_end(t);
    is_int(store_res_index(r, 2), 0, "index field 2");
    is_int(store_res_index(r, 1), KWC_EPARSE, "a second field is refused");
    churn(s, r, 300, 1000, 1000);
    is_int(check_field_scans(s, r, 300), 0, "field scans at every past rv, value and prefix");
    store_close(s);

    /* data written without the index: declaring it later builds it */
    rm_dir();
    fresh_dir();
    s = open_store(0, 0);
    store_res(s, "v1/pods:json", &r);
    churn(s, r, 200, 1000, 1000);
    store_close(s);
    s = open_store(0, 0);
    store_res(s, "v1/pods:json", &r);
    is_int(store_res_index(r, 2), 0, "index declared on an existing data dir");
    is_int(check_field_scans(s, r, 200), 0, "the rebuilt index answers like the model");
    store_close(s);
    rm_dir();
}

/* The cluster's identity, and a rebase: every resource's data dropped
 * (opened in this run or not, indexed or not) and the new identity recorded
 * in one transaction; the data dir stays valid. */
static void
test_cluster_id_and_rebase(void)
{
    fresh_dir();
    struct store *s = open_store(0, 0);
    char id[256] = "junk";
    is_int(store_cluster_id(s, id, sizeof(id)), 0, "none recorded: no error");
    is_str(id, "", "...and empty");
    is_int(store_set_cluster_id(s, "uid-a"), 0, "recorded");
    struct store_res *a, *b;
    store_res(s, "v1/pods:json", &a);
    store_res_index(a, 2);
    churn(s, a, 50, 1000, 1000);
    store_res(s, "v1/secrets:json", &b);
    churn(s, b, 30, 1000, 1000);
    store_close(s);

    s = open_store(0, 0); /* b is not opened in this run */
    is_int(store_cluster_id(s, id, sizeof(id)), 0, "read back after a reopen");
    is_str(id, "uid-a", "the recorded identity");
    store_res(s, "v1/pods:json", &a);
    store_res_index(a, 2);
    is_int(store_rebase(s, "uid-b"), 0, "rebased");
    store_cluster_id(s, id, sizeof(id));
    is_str(id, "uid-b", "the new identity");
    struct store_rtxn *t;
    struct store_res_info in;
    store_rtxn_begin(s, &t);
    store_info(t, a, &in);
    store_rtxn_end(t);
    ok(in.objects == 0 && in.rv == 0 && !in.synced, "an open resource emptied");
    churn(s, a, 10, 1000, 1000);
    char why[256] = "";
    is_int(store_verify(s, NULL, NULL, why, sizeof(why)), 0, "the data dir verifies");
    store_res(s, "v1/secrets:json", &b);
    store_rtxn_begin(s, &t);
    store_info(t, b, &in);
    store_rtxn_end(t);
    ok(in.objects == 0 && in.hist_events == 0 && in.rv == 0, "one not opened then dropped too");
    store_close(s);
    rm_dir();
}

int
main(void)
{
    TAP_RUN(test_initial_load);
    TAP_RUN(test_apply_get_scan);
    TAP_RUN(test_scan_at_every_past_rv);
    TAP_RUN(test_history_and_trim);
    TAP_RUN(test_trim_by_age_and_reopen);
    TAP_RUN(test_same_rv_and_reset);
    TAP_RUN(test_unserved);
    TAP_RUN(test_field_index);
    TAP_RUN(test_cluster_id_and_rebase);
    return tap_done();
}
