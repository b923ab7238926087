/*
 * relist_test.c — cache/relist.c: the difference between the cache and a
 * fresh upstream list, as events (include/kwc/relist.h).
 *
 * The cases are the rv rules tests/integration/17_relist_order.py checks on
 * the wire, one at a time: objects added, modified, unchanged and deleted in
 * the gap; creations and updates in the reverse of key order, so that key
 * order (the list's) is not rv order (the events'); every event above the
 * cache's rv, each at an rv of its own, in order, so that a watcher never
 * sees an rv go back and a watch resumed from any event's rv replays exactly
 * the events after it; objects leaving a selector (a MODIFIED carrying the
 * new labels, the hub turns it into a DELETED for that watcher); and the
 * cases where the cache cannot vouch for the difference (a list behind the
 * cache, an object at an rv the cache passed) or the upstream's rvs leave
 * no room for the deletions.
 */
#include "kwc/relist.h"

#include <stdlib.h>
#include <string.h>

#include "tap.h"

/* An object as the tests write it: key, rv, bytes and index bytes made from
 * a tag, so that each event's bytes say which state they carry. */
struct tobj {
    const char *key;
    uint64_t rv;
    const char *obj;
    const char *idx;
};

static struct relist_obj
ro(const struct tobj *t)
{
    return (struct relist_obj){.key = t->key,
                               .key_len = strlen(t->key),
                               .rv = t->rv,
                               .obj = t->obj,
                               .obj_len = strlen(t->obj),
                               .idx = t->idx,
                               .idx_len = strlen(t->idx)};
}

/* A cache holding cached[] (key order, as the store scans) and a list
 * holding listed[] (in the order given), through the module's calls. */
static struct relist *
diff(uint64_t list_rv, const struct tobj *listed, size_t nl, const struct tobj *cached, size_t nc)
{
    struct relist *d = relist_new(list_rv);
    for (size_t i = 0; i < nl; i++) {
        const struct tobj *cur = NULL;
        for (size_t j = 0; j < nc && !cur; j++)
            if (strcmp(cached[j].key, listed[i].key) == 0)
                cur = &cached[j];
        struct relist_obj o = ro(&listed[i]);
        relist_listed(d, &o, cur != NULL, cur ? cur->rv : 0);
    }
    for (size_t j = 0; j < nc; j++) {
        struct relist_obj o = ro(&cached[j]);
        relist_stored(d, &o);
    }
    return d;
}

static const struct relist_event *
find(const struct relist *d, const char *key)
{
    size_t n;
    const struct relist_event *ev = relist_events(d, &n);
    for (size_t i = 0; i < n; i++)
        if (ev[i].key_len == strlen(key) && memcmp(ev[i].key, key, ev[i].key_len) == 0)
            return &ev[i];
    return NULL;
}

/* The rules every OK outcome keeps: rvs strictly increasing (no two events
 * at one rv, none going back), all above the cache's rv and at most the
 * list's. */
static void
check_order(const struct relist *d, uint64_t cache_rv, uint64_t list_rv, const char *what)
{
    size_t n;
    const struct relist_event *ev = relist_events(d, &n);
    bool up = true, above = true, within = true;
    for (size_t i = 0; i < n; i++) {
        up = up && (i == 0 || ev[i].rv > ev[i - 1].rv);
        above = above && ev[i].rv > cache_rv;
        within = within && ev[i].rv <= list_rv;
    }
    char m[200];
    snprintf(m, sizeof(m), "%s: each event at an rv of its own, in rv order", what);
    ok(up, m);
    snprintf(m, sizeof(m), "%s: every event above the cache's rv", what);
    ok(above, m);
    snprintf(m, sizeof(m), "%s: no event past the list's rv", what);
    ok(within, m);
}

/* A watcher's view: the objects (key -> bytes) after applying events. */
#define MAX_STATE 32
struct state {
    char key[MAX_STATE][64];
    char obj[MAX_STATE][64];
    size_t n;
};

static void
state_from(struct state *s, const struct tobj *t, size_t n)
{
    memset(s, 0, sizeof(*s));
    for (size_t i = 0; i < n && i < MAX_STATE; i++) {
        snprintf(s->key[i], sizeof(s->key[i]), "%s", t[i].key);
        snprintf(s->obj[i], sizeof(s->obj[i]), "%s", t[i].obj);
    }
    s->n = n < MAX_STATE ? n : MAX_STATE;
}

static void
state_apply(struct state *s, const struct relist_event *ev)
{
    size_t i = 0;
    while (i < s->n &&
           !(strlen(s->key[i]) == ev->key_len && memcmp(s->key[i], ev->key, ev->key_len) == 0))
        i++;
    if (ev->type == STORE_DELETED) {
        if (i < s->n) {
            s->n--;
            memmove(s->key[i], s->key[s->n], sizeof(s->key[i]));
            memmove(s->obj[i], s->obj[s->n], sizeof(s->obj[i]));
        }
        return;
    }
    if (i == s->n && s->n < MAX_STATE)
        snprintf(s->key[s->n++], sizeof(s->key[0]), "%.*s", (int)ev->key_len, ev->key);
    if (i < s->n)
        snprintf(s->obj[i], sizeof(s->obj[i]), "%.*s", (int)ev->obj_len, ev->obj);
}

/* The same objects with the same bytes, in any order. */
static bool
state_eq(const struct state *a, const struct state *b)
{
    if (a->n != b->n)
        return false;
    for (size_t i = 0; i < a->n; i++) {
        size_t j = 0;
        while (j < b->n && strcmp(a->key[i], b->key[j]) != 0)
            j++;
        if (j == b->n || strcmp(a->obj[i], b->obj[j]) != 0)
            return false;
    }
    return true;
}

static void
test_added(void)
{
    const struct tobj cached[] = {{"default/a", 3, "a3", "ia"}};
    const struct tobj listed[] = {{"default/a", 3, "a3", "ia"}, {"default/b", 12, "b12", "ib"}};
    struct relist *d = diff(12, listed, 2, cached, 1);
    struct relist_outcome o;
    is_int(relist_finish(d, 10, &o), RELIST_OK, "a new object: OK");
    size_t n;
    const struct relist_event *ev = relist_events(d, &n);
    is_int(n, 1, "one event");
    is_int(ev[0].type, STORE_ADDED, "ADDED");
    is_int(ev[0].rv, 12, "at the object's own rv");
    is_mem(ev[0].key, ev[0].key_len, "default/b", 9, "its key");
    is_mem(ev[0].obj, ev[0].obj_len, "b12", 3, "the listed object");
    is_mem(ev[0].idx, ev[0].idx_len, "ib", 2, "its index bytes");
    is_int(o.crowded, 0, "nothing crowded");
    relist_free(d);
}

static void
test_modified_and_unchanged(void)
{
    const struct tobj cached[] = {{"default/a", 3, "a3", "x"}, {"default/b", 7, "b7", "x"}};
    const struct tobj listed[] = {{"default/a", 3, "a3", "x"}, {"default/b", 11, "b11", "y"}};
    struct relist *d = diff(11, listed, 2, cached, 2);
    is_int(relist_finish(d, 9, NULL), RELIST_OK, "OK (no outcome asked)");
    size_t n;
    const struct relist_event *ev = relist_events(d, &n);
    is_int(n, 1, "only the changed object");
    is_int(ev[0].type, STORE_MODIFIED, "MODIFIED");
    is_int(ev[0].rv, 11, "at the object's own rv");
    is_mem(ev[0].obj, ev[0].obj_len, "b11", 3, "the new state");
    /* the labels moved (grp=x -> grp=y): the new index bytes go with it, so
     * the hub can end it for a watcher whose selector it left */
    is_mem(ev[0].idx, ev[0].idx_len, "y", 1, "the new index bytes");
    ok(find(d, "default/a") == NULL, "an object at the cached rv gives no event");
    relist_free(d);
}

static void
test_nothing_changed(void)
{
    const struct tobj same[] = {{"default/a", 3, "a3", ""}, {"default/b", 7, "b7", ""}};
    struct relist *d = diff(20, same, 2, same, 2);
    struct relist_outcome o;
    is_int(relist_finish(d, 20, &o), RELIST_OK, "a relist at the cache's rv with no change: OK");
    size_t n;
    relist_events(d, &n);
    is_int(n, 0, "no event");
    relist_free(d);

    d = diff(5, NULL, 0, NULL, 0);
    is_int(relist_finish(d, 0, &o), RELIST_OK, "an empty list of an empty cache: OK");
    relist_events(d, &n);
    is_int(n, 0, "no event");
    relist_free(d);
}

static void
test_deleted(void)
{
    /* the cache's rv 10; the list at 15 has lost b and c */
    const struct tobj cached[] = {
        {"default/a", 3, "a3", "ia"}, {"default/b", 4, "b4", "ib"}, {"default/c", 9, "c9", "ic"}};
    const struct tobj listed[] = {{"default/a", 3, "a3", "ia"}};
    struct relist *d = diff(15, listed, 1, cached, 3);
    struct relist_outcome o;
    is_int(relist_finish(d, 10, &o), RELIST_OK, "deletions: OK");
    size_t n;
    relist_events(d, &n);
    is_int(n, 2, "one DELETED per object gone");
    const struct relist_event *b = find(d, "default/b"), *c = find(d, "default/c");
    ok(b && c, "both gone objects");
    if (b && c) {
        is_int(b->type, STORE_DELETED, "b DELETED");
        is_int(c->type, STORE_DELETED, "c DELETED");
        is_mem(b->obj, b->obj_len, "b4", 2, "a DELETED carries the cache's last state");
        is_mem(c->idx, c->idx_len, "ic", 2, "...and its index bytes");
        /* nothing else holds an rv in (10, 15]: the two highest */
        ok((b->rv == 15 && c->rv == 14) || (b->rv == 14 && c->rv == 15),
           "the deletions take the highest free rvs, counting down from the list's");
    }
    check_order(d, 10, 15, "deletions");
    is_int(o.crowded, 0, "room for both");
    relist_free(d);

    /* everything gone */
    d = diff(30, NULL, 0, cached, 3);
    is_int(relist_finish(d, 20, &o), RELIST_OK, "an empty list: OK");
    relist_events(d, &n);
    is_int(n, 3, "every cached object DELETED");
    check_order(d, 20, 30, "all deleted");
    relist_free(d);
}

/*
 * 17_relist_order's rounds: during the gap (cache at rv 100) four pods are
 * created in the reverse of key order (d, c, b, a), two pods are updated,
 * one leaves the selector (a label update), two are deleted; the list (at
 * 112) comes in key order. The events must come in rv order, each at an rv
 * of its own, the deletions at rvs no other event holds.
 */
static void
test_gap_round(void)
{
    const struct tobj cached[] = {
        {"default/rl-00", 50, "00@50", "grp=x"}, {"default/rl-01", 51, "01@51", "grp=y"},
        {"default/rl-02", 52, "02@52", "grp=x"}, {"default/rl-03", 53, "03@53", "grp=y"},
        {"default/rl-04", 54, "04@54", "grp=x"}, {"default/rl-05", 55, "05@55", "grp=y"},
    };
    /* rvs in the gap: 101 d, 102 c, 103 b, 104 a (created), 105 rl-05 and
     * 106 rl-03 (updated), 107 rl-00 (leaves grp=x), 108 rl-02 and 109 rl-04
     * (deleted: not in the list), then unrelated writes to 112 */
    const struct tobj listed[] = {
        {"default/rl-00", 107, "00@107", "grp=y"},  {"default/rl-01", 51, "01@51", "grp=y"},
        {"default/rl-03", 106, "03@106", "grp=y"},  {"default/rl-05", 105, "05@105", "grp=y"},
        {"default/rl-r0-a", 104, "a@104", "grp=x"}, {"default/rl-r0-b", 103, "b@103", "grp=x"},
        {"default/rl-r0-c", 102, "c@102", "grp=x"}, {"default/rl-r0-d", 101, "d@101", "grp=x"},
    };
    struct relist *d = diff(112, listed, 8, cached, 6);
    struct relist_outcome o;
    is_int(relist_finish(d, 100, &o), RELIST_OK, "a round's gap: OK");
    size_t n;
    const struct relist_event *ev = relist_events(d, &n);
    is_int(n, 9, "4 ADDED, 3 MODIFIED, 2 DELETED; rl-01 unchanged");
    check_order(d, 100, 112, "a round's gap");
    /* creations in reverse key order come out in rv order: d first */
    static const char *const want_key[] = {
        "default/rl-r0-d", "default/rl-r0-c", "default/rl-r0-b", "default/rl-r0-a",
        "default/rl-05",   "default/rl-03",   "default/rl-00",
    };
    static const uint64_t want_rv[] = {101, 102, 103, 104, 105, 106, 107};
    static const enum store_ev_type want_type[] = {STORE_ADDED,   STORE_ADDED,    STORE_ADDED,
                                                   STORE_ADDED,   STORE_MODIFIED, STORE_MODIFIED,
                                                   STORE_MODIFIED};
    bool prefix = n >= 7;
    for (size_t i = 0; prefix && i < 7; i++)
        prefix = ev[i].rv == want_rv[i] && ev[i].type == want_type[i] &&
                 ev[i].key_len == strlen(want_key[i]) &&
                 memcmp(ev[i].key, want_key[i], ev[i].key_len) == 0;
    ok(prefix, "ADDED and MODIFIED at their own rvs, in rv order, not the list's key order");
    /* the two deletions: the highest rvs no other event holds: 112, 111 */
    const struct relist_event *d2 = find(d, "default/rl-02"), *d4 = find(d, "default/rl-04");
    ok(d2 && d4 && d2->type == STORE_DELETED && d4->type == STORE_DELETED,
       "objects deleted in the gap come as DELETED");
    if (d2 && d4)
        ok((d2->rv == 112 && d4->rv == 111) || (d2->rv == 111 && d4->rv == 112),
           "the deletions at 112 and 111");
    /* the one leaving grp=x carries its new labels (its DELETED for the
     * selector watcher is the hub's, from these bytes) */
    const struct relist_event *left = find(d, "default/rl-00");
    ok(left && left->idx_len == 5 && memcmp(left->idx, "grp=y", 5) == 0,
       "the object leaving the selector carries its new index bytes");
    /* resume from any event's rv: exactly the events after it follow */
    bool resume = true;
    for (size_t i = 0; i < n; i++) {
        size_t after = 0;
        for (size_t j = 0; j < n; j++)
            after += ev[j].rv > ev[i].rv;
        resume = resume && after == n - 1 - i;
    }
    ok(resume, "a watch resumed from any event's rv replays the events after it, none twice");
    /* a watcher that had the cache's state ends in the upstream's */
    struct state have, want;
    state_from(&have, cached, 6);
    state_from(&want, listed, 8);
    for (size_t i = 0; i < n; i++)
        state_apply(&have, &ev[i]);
    ok(state_eq(&have, &want), "the cache's state plus the events is the list's state");
    /* and so does one that resumes from any event's rv: the events up to it,
     * then only those after it */
    bool same = true;
    for (size_t i = 0; i < n; i++) {
        state_from(&have, cached, 6);
        for (size_t j = 0; j <= i; j++)
            state_apply(&have, &ev[j]);
        for (size_t j = 0; j < n; j++)
            if (ev[j].rv > ev[i].rv)
                state_apply(&have, &ev[j]);
        same = same && state_eq(&have, &want);
    }
    ok(same, "a resume from any event's rv ends in the list's state");
    is_int(o.crowded, 0, "room for every deletion");
    relist_free(d);
}

/* Deletions skip the rvs the list's own objects hold. */
static void
test_deletions_skip_used_rvs(void)
{
    const struct tobj cached[] = {
        {"a", 1, "a1", ""}, {"b", 2, "b2", ""}, {"c", 3, "c3", ""}, {"d", 4, "d4", ""}};
    /* gap (10, 20]: b modified at 20, c at 18; a and d deleted */
    const struct tobj listed[] = {{"b", 20, "b20", ""}, {"c", 18, "c18", ""}};
    struct relist *d = diff(20, listed, 2, cached, 4);
    struct relist_outcome o;
    is_int(relist_finish(d, 10, &o), RELIST_OK, "OK");
    const struct relist_event *a = find(d, "a"), *dd = find(d, "d");
    ok(a && dd, "both deletions");
    if (a && dd) {
        /* 20 is b's: a (first in key order) takes 19, d skips 18 (c's) to 17 */
        is_int(a->rv, 19, "the first deletion skips the rv a modified object holds");
        is_int(dd->rv, 17, "the next skips the next one");
    }
    check_order(d, 10, 20, "skipping used rvs");
    is_int(o.crowded, 0, "room for both");
    relist_free(d);
}

/* An upstream whose rvs leave no room: the rest share the list's rv. */
static void
test_crowded(void)
{
    const struct tobj cached[] = {
        {"a", 1, "a1", ""}, {"b", 2, "b2", ""}, {"c", 3, "c3", ""}, {"d", 4, "d4", ""}};
    /* (100, 102]: d modified at 101; a, b, c deleted: one free rv (102) */
    const struct tobj listed[] = {{"d", 101, "d101", ""}};
    struct relist *d = diff(102, listed, 1, cached, 4);
    struct relist_outcome o;
    is_int(relist_finish(d, 100, &o), RELIST_OK, "OK, crowded");
    is_int(o.crowded, 2, "two deletions found no rv of their own");
    size_t n;
    const struct relist_event *ev = relist_events(d, &n);
    is_int(n, 4, "four events");
    bool sorted = true, above = true;
    size_t at_list = 0;
    for (size_t i = 0; i < n; i++) {
        sorted = sorted && (i == 0 || ev[i].rv >= ev[i - 1].rv);
        above = above && ev[i].rv > 100;
        at_list += ev[i].rv == 102;
    }
    ok(sorted, "still in rv order (never back)");
    ok(above, "still above the cache's rv");
    is_int(at_list, 3, "every deletion at the list's rv");
    is_int(ev[0].rv, 101, "the MODIFIED first");
    is_int(ev[0].type, STORE_MODIFIED, "...as MODIFIED");
    relist_free(d);

    /* the list at the cache's own rv with an object gone: no rv in between */
    const struct tobj one[] = {{"a", 1, "a1", ""}};
    d = diff(7, NULL, 0, one, 1);
    is_int(relist_finish(d, 7, &o), RELIST_OK, "OK");
    is_int(o.crowded, 1, "crowded");
    ev = relist_events(d, &n);
    ok(n == 1 && ev[0].rv == 7 && ev[0].type == STORE_DELETED, "a DELETED at the list's rv");
    relist_free(d);
}

/* What the cache cannot tell in rv order: start over from a fresh list. */
static void
test_diverged(void)
{
    const struct tobj cached[] = {{"a", 5, "a5", ""}};
    const struct tobj behind[] = {{"a", 5, "a5", ""}};
    struct relist *d = diff(8, behind, 1, cached, 1);
    struct relist_outcome o;
    is_int(relist_finish(d, 9, &o), RELIST_BEHIND, "a list behind the cache's rv");
    relist_free(d);

    /* a at rv 6: the cache passed rv 6 (it is at 9) holding a at rv 5 */
    const struct tobj passed[] = {{"a", 6, "a6", ""}, {"b", 12, "b12", ""}};
    d = diff(12, passed, 2, cached, 1);
    is_int(relist_finish(d, 9, &o), RELIST_PASSED, "an object at an rv the cache passed");
    is_mem(o.key, o.key_len, "a", 1, "names the object");
    is_int(o.rv, 6, "and its rv");
    relist_free(d);

    /* created at an rv the cache passed, never seen (an event it never got) */
    const struct tobj missed[] = {{"a", 5, "a5", ""}, {"z", 9, "z9", ""}};
    d = diff(12, missed, 2, cached, 1);
    is_int(relist_finish(d, 9, &o), RELIST_PASSED, "an object created at or below the cache's rv");
    is_mem(o.key, o.key_len, "z", 1, "names it");
    relist_free(d);

    /* but an unchanged object below the cache's rv is the normal case */
    const struct tobj fine[] = {{"a", 5, "a5", ""}, {"z", 10, "z10", ""}};
    d = diff(12, fine, 2, cached, 1);
    is_int(relist_finish(d, 9, &o), RELIST_OK, "unchanged old objects and new ones: OK");
    relist_free(d);
}

/* The list's order need not be key order: relist_stored still finds them. */
static void
test_list_order(void)
{
    const struct tobj cached[] = {{"a", 1, "a1", ""}, {"b", 2, "b2", ""}, {"c", 3, "c3", ""}};
    const struct tobj listed[] = {{"c", 3, "c3", ""}, {"a", 1, "a1", ""}};
    struct relist *d = diff(10, listed, 2, cached, 3);
    is_int(relist_finish(d, 5, NULL), RELIST_OK, "OK");
    size_t n;
    const struct relist_event *ev = relist_events(d, &n);
    ok(n == 1 && ev[0].type == STORE_DELETED && ev[0].key_len == 1 && ev[0].key[0] == 'b',
       "only the object the list lacks is DELETED");
    relist_free(d);
    relist_free(NULL);
    ok(1, "relist_free(NULL) is a no-op");
}

int
main(void)
{
    TAP_RUN(test_added);
    TAP_RUN(test_modified_and_unchanged);
    TAP_RUN(test_nothing_changed);
    TAP_RUN(test_deleted);
    TAP_RUN(test_gap_round);
    TAP_RUN(test_deletions_skip_used_rvs);
    TAP_RUN(test_crowded);
    TAP_RUN(test_diverged);
    TAP_RUN(test_list_order);
    return tap_done();
}
