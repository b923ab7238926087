/*
 * catalog.c — which caches kwc runs (see catalog.h).
 *
 * Every cache is a slot of the set, never removed while kwc runs: serving
 * and the watch pool size their per-cache arrays by the set's capacity and
 * keep an index for good. A slot's reflector is started, stopped (idle,
 * vanished) and started again; its store resource stays open.
 *
 * Auto mode decides from discovery alone (disco.h): a request for a
 * resource discovery does not list asks discovery again (rate-limited
 * there) and passes through meanwhile; a cache whose upstream answers 404
 * does the same, and the change it finds (the resource gone) stops the
 * cache, ends its watchers and drops its data.
 *
 * Threads (catalog.h says which calls are any-thread): the main loop owns
 * every decision and every change; a serving loop reads the set, the
 * slots' atomics and discovery, and posts to the main loop (the catalog's
 * mailbox) what only it may do: start a cache (refl_start opens transfers
 * on the main loop's upstream client) and make one (a slot opens LMDB
 * databases, under the writer's transaction discipline). A serving loop's
 * want of a stopped cache marks its slot starting, so that the cache reads
 * as warming until the main loop has started it or refused; a want of a
 * cache with no slot yet is a pending creation (catalog_pending), one per
 * resource and encoding however many loops ask. Either, once carried out,
 * is told to the subscribers (catalog_subscribe). Data is dropped only
 * once every serving loop has passed a turn since its cache stopped
 * serving (the quiesce hook), so that a loop that saw it serving a moment
 * before reads what it saw.
 */
#include "kwc/catalog.h"

#include <event2/event.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kwc/base.h"
#include "kwc/disco.h"
#include "kwc/kinds.h"
#include "kwc/log.h"
#include "kwc/mailbox.h"
#include "kwc/reflector.h"
#include "kwc/store.h"

#include "ingest.h"

#define CATALOG_TICK_MIN_MS 1000
#define CATALOG_TICK_MAX_MS 30000

/* Main loop only but for used_ms and starting (atomics: serving loops
 * write them) and required (set before the slot is published). */
struct slot {
    bool required;            /* explicit mode: /readyz waits for it */
    bool pinned;              /* started with kwc: never stopped for idleness */
    bool has_data;            /* stopped with its data on disk (the budget counts it) */
    _Atomic uint64_t used_ms; /* the last request that named it */
    uint64_t stopped_ms;      /* when it stopped (the budget drops the oldest first) */
    uint64_t disk;            /* its data's bytes when it stopped */
    bool thaw;                /* running when a takeover froze the catalog: restarts on a thaw */
    atomic_bool starting;     /* a serving loop's want of it is posted, not carried out yet */
    bool drop_pending;        /* its data drops once quiesce round drop_after is done */
    uint64_t drop_after;
};

/* A creation a serving loop posted (catalog_want returned CATALOG_PENDING). */
struct pending {
    char *g, *v, *r;
    enum kwc_enc enc;
};

/* A want posted to the main loop: of slot (>= 0), or to create g/v/r in enc. */
struct posted {
    struct catalog *c;
    int slot;
    struct pending p;
};

struct sub {
    void (*fn)(void *arg);
    void *arg;
};

struct pattern {
    char *part[3]; /* group, version, resource; "*": any */
};

struct catalog {
    struct event_base *base;
    struct up_client *up;
    struct refl_ingest *ing;
    struct store *st;
    struct disco *disco;
    bool auto_mode;
    unsigned max_caches;
    uint64_t idle_ms, disk_budget;
    char *identity;
    struct refl_set set;
    struct slot *slots;
    struct pattern *excl;
    size_t nexcl;
    char **pb; /* --protobuf-resources entries; NULL: none */
    size_t npb;
    struct event *tick;
    /* auto: the caches of CRDs and APIServices, watched so that a change to
     * either refreshes discovery at once (-1: none), and their last rv */
    int watch_slot[2];
    uint64_t watch_rv[2];
    bool defaults_started;
    bool warned_max;
    bool (*busy)(void *arg, size_t i);
    void *busy_arg;
    void (*end)(void *arg, size_t i);
    void *end_arg;
    struct catalog_stats stats;
    /* threads */
    pthread_t owner; /* the main loop's */
    struct mailbox *mb;
    bool closing;            /* catalog_free: posted wants do nothing */
    pthread_mutex_t pend_mu; /* guards pend, npend (short: a lookup) */
    struct pending *pend;    /* creations posted, not carried out */
    size_t npend;
    struct sub *subs; /* catalog_subscribe */
    size_t nsubs;
    void (*quiesce)(void *arg, void (*done)(void *done_arg), void *done_arg);
    void *quiesce_arg;
    /* quiesce rounds: asked for (each drop asks one), running (covers the
     * drops asked up to q_round), the last done */
    uint64_t q_asked, q_round, q_done;
    bool q_running;
};

static uint64_t
now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Comma-separated entries, trimmed of spaces, empty ones left out. */
static char **
split(const char *list, size_t *n)
{
    char **out = xcalloc(1, sizeof(char *));
    *n = 0;
    if (!list)
        return out;
    char *copy = xstrdup(list), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ')
            t++;
        size_t l = strlen(t);
        while (l > 0 && t[l - 1] == ' ')
            t[--l] = '\0';
        if (!*t)
            continue;
        out = xrealloc(out, (*n + 2) * sizeof(*out));
        out[(*n)++] = xstrdup(t);
        out[*n] = NULL;
    }
    free(copy);
    return out;
}

static void
free_list(char **l, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(l[i]);
    free(l);
}

/*
 * An --resources-exclude entry: "group/version/resource", "version/resource"
 * (the core group, as --resources writes it) or "resource" (any group and
 * version); "*" matches any group, version or resource, and "*" in the
 * first part of a two-part entry ("*" + "/leases") any group and version.
 */
static int
parse_pattern(const char *e, struct pattern *p, char *err, size_t errlen)
{
    size_t n;
    char *copy = xstrdup(e);
    char *parts[4] = {0};
    n = 0;
    for (char *s = copy, *slash; n < 4; s = slash + 1) {
        parts[n++] = s;
        if (!(slash = strchr(s, '/')))
            break;
        *slash = '\0';
    }
    bool bad = n > 3;
    for (size_t i = 0; i < n && !bad; i++)
        bad = !*parts[i];
    if (bad) {
        snprintf(err, errlen,
                 "--resources-exclude: \"%s\" is not group/version/resource, version/resource "
                 "(core group) or resource, with * for any part (*/leases, v1/secrets, "
                 "example.com/*/*)",
                 e);
        free(copy);
        return KWC_ECONFIG;
    }
    if (n == 3) {
        p->part[0] = xstrdup(parts[0]);
        p->part[1] = xstrdup(parts[1]);
        p->part[2] = xstrdup(parts[2]);
    } else if (n == 2) {
        bool any = strcmp(parts[0], "*") == 0;
        p->part[0] = xstrdup(any ? "*" : "");
        p->part[1] = xstrdup(parts[0]);
        p->part[2] = xstrdup(parts[1]);
    } else {
        p->part[0] = xstrdup("*");
        p->part[1] = xstrdup("*");
        p->part[2] = xstrdup(parts[0]);
    }
    free(copy);
    return 0;
}

static bool
part_matches(const char *pat, const char *s)
{
    return strcmp(pat, "*") == 0 || strcmp(pat, s) == 0;
}

static bool
excluded(const struct catalog *c, const char *g, const char *v, const char *r)
{
    for (size_t i = 0; i < c->nexcl; i++) {
        const struct pattern *p = &c->excl[i];
        if (part_matches(p->part[0], g) && part_matches(p->part[1], v) &&
            part_matches(p->part[2], r))
            return true;
    }
    return false;
}

static char *
gvr_text(const char *g, const char *v, const char *r)
{
    return *g ? xasprintf("%s/%s/%s", g, v, r) : xasprintf("%s/%s", v, r);
}

/* Auto mode: may the resource have a cache? */
static bool
cacheable(const struct catalog *c, const char *g, const char *v, const char *r)
{
    struct disco_res dr;
    if (!c->disco || disco_find(c->disco, g, v, r, &dr) != DISCO_PRESENT)
        return false;
    return dr.list && dr.watch && !dr.aggregated && !excluded(c, g, v, r);
}

/* Any thread: n is read once (acquire), and the slots below it are set. */
static int
find(const struct catalog *c, const char *g, const char *v, const char *r, enum kwc_enc enc)
{
    size_t n = atomic_load_explicit(&c->set.n, memory_order_acquire);
    for (size_t i = 0; i < n; i++) {
        const struct refl_desc *d = refl_desc(c->set.r[i]);
        if (d->enc == enc && strcmp(d->resource, r) == 0 && strcmp(d->version, v) == 0 &&
            strcmp(d->group, g) == 0)
            return (int)i;
    }
    return -1;
}

static bool
on_loop(const struct catalog *c)
{
    return pthread_equal(pthread_self(), c->owner);
}

/* rf into the set as its next cache: r[n] first, then n (release), so that a
 * serving loop that reads the new n reads r[n] set. Main loop. */
static void
publish(struct catalog *c, struct refl *rf)
{
    size_t n = atomic_load_explicit(&c->set.n, memory_order_relaxed);
    c->set.r[n] = rf;
    atomic_store_explicit(&c->set.n, n + 1, memory_order_release);
}

/* A new cache in the set (not started). -1 when the set is full or the
 * cache cannot be made (logged). */
static int
add(struct catalog *c, const char *g, const char *v, const char *r, enum kwc_enc enc, char *err,
    size_t errlen)
{
    if (c->set.n >= c->set.cap) {
        snprintf(err, errlen,
                 "more caches than kwc holds (%zu: resources and encodings ever cached)",
                 c->set.cap);
        return -1;
    }
    char *gvr = gvr_text(g, v, r);
    struct refl *rf;
    int rc = refl_new(c->base, c->up, c->ing, gvr, enc, c->identity, &rf, err, errlen);
    free(gvr);
    if (rc)
        return -1;
    size_t i = c->set.n;
    c->slots[i].used_ms = now_ms();
    publish(c, rf);
    return (int)i;
}

static void
start_slot(struct catalog *c, size_t i, bool pinned)
{
    struct slot *s = &c->slots[i];
    s->pinned |= pinned;
    s->used_ms = now_ms();
    s->has_data = false;     /* in use: the budget does not count it */
    s->drop_pending = false; /* in use again: its data is not to go */
    c->stats.started++;
    refl_start(c->set.r[i]);
}

static void
stop_slot(struct catalog *c, size_t i)
{
    struct slot *s = &c->slots[i];
    refl_ingest_commit(c->ing); /* nothing of its pending afterwards */
    refl_stop(c->set.r[i]);
    s->stopped_ms = now_ms();
    s->disk = store_res_disk_bytes(c->st, refl_desc(c->set.r[i])->sres);
    s->has_data = true;
}

/* ---- dropping data once no serving loop reads it ---- */

static const char *
enc_note(const struct refl_desc *d)
{
    return d->enc == KWC_ENC_PB ? " (protobuf)" : "";
}

/* Drop i's data now, unless it started again meanwhile (its data is in use:
 * it resumed from it). Main loop. */
static void
drop_now(struct catalog *c, size_t i)
{
    c->slots[i].drop_pending = false;
    struct refl *rf = c->set.r[i];
    if (refl_started(rf))
        return;
    const struct refl_desc *d = refl_desc(rf);
    int rc = store_res_clear(c->st, d->sres);
    if (rc)
        log_warnx("cache %s%s: dropping its data failed: %s", d->path, enc_note(d),
                  kwc_strerror(rc));
}

/* The drops the rounds done so far cover (none while frozen: another
 * process may own the store; catalog_thaw runs them). */
static void
run_drops(struct catalog *c)
{
    for (size_t i = 0; i < c->set.n && !refl_ingest_frozen(c->ing); i++)
        if (c->slots[i].drop_pending && c->slots[i].drop_after <= c->q_done)
            drop_now(c, i);
}

static void quiesce_start(struct catalog *c);

/* A round is done: every serving loop has passed a turn since it began. */
static void
on_quiesced(void *arg)
{
    struct catalog *c = arg;
    c->q_running = false;
    c->q_done = c->q_round;
    run_drops(c);
    if (c->q_asked > c->q_done)
        quiesce_start(c); /* drops asked while it ran */
}

static void
quiesce_start(struct catalog *c)
{
    if (c->q_running)
        return;
    c->q_running = true;
    c->q_round = c->q_asked;
    if (c->quiesce)
        c->quiesce(c->quiesce_arg, on_quiesced, c);
    else
        on_quiesced(c); /* no serving loops: at once */
}

/* Drop i's data (its cache stopped: a serving loop no longer starts a read
 * of it) once every serving loop has passed a turn, so that none is inside
 * a read it began while the cache served. */
static void
drop_data(struct catalog *c, size_t i)
{
    struct slot *s = &c->slots[i];
    s->has_data = false;
    s->drop_pending = true;
    s->drop_after = ++c->q_asked;
    quiesce_start(c);
}

/* The data of stopped caches within the budget: drop the least recently
 * stopped first. */
static void
keep_budget(struct catalog *c)
{
    while (!refl_ingest_frozen(c->ing)) {
        uint64_t total = 0;
        int oldest = -1;
        for (size_t i = 0; i < c->set.n; i++) {
            const struct slot *s = &c->slots[i];
            if (!s->has_data)
                continue;
            total += s->disk;
            if (oldest < 0 || s->stopped_ms < c->slots[oldest].stopped_ms)
                oldest = (int)i;
        }
        if (total <= c->disk_budget || oldest < 0)
            return;
        const struct refl_desc *d = refl_desc(c->set.r[oldest]);
        log_info("cache %s%s: its data dropped for --cache-disk-budget (%.1f MiB of stopped "
                 "caches' data over %.1f MiB); it lists again when used",
                 d->path, enc_note(d), (double)total / 1048576.0,
                 (double)c->disk_budget / 1048576.0);
        drop_data(c, (size_t)oldest);
        c->stats.dropped++;
    }
}

static void
on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct catalog *c = arg;
    uint64_t now = now_ms();
    for (size_t i = 0; i < c->set.n && c->idle_ms; i++) {
        struct slot *s = &c->slots[i];
        struct refl *rf = c->set.r[i];
        if (s->required || s->pinned || !refl_started(rf))
            continue;
        if (c->busy && c->busy(c->busy_arg, i))
            s->used_ms = now; /* watched: in use (asked every tick, so the idle time
                                 counts from the last watcher's leaving, within a tick) */
        uint64_t used = atomic_load_explicit(&s->used_ms, memory_order_relaxed);
        if (now < used || now - used < c->idle_ms)
            continue;
        const struct refl_desc *d = refl_desc(rf);
        log_info("cache %s%s: no request for %.0f s and no watcher: stopping it "
                 "(--cache-idle-timeout)",
                 d->path, enc_note(d), (double)(now - used) / 1000.0);
        stop_slot(c, i);
        c->stats.idle_stops++;
    }
    keep_budget(c);
}

/* Auto mode: the protobuf caches --protobuf-resources names, started once
 * discovery has answered: of each built-in resource named, the first
 * version discovery lists (its preferred one). */
struct pb_pick {
    struct catalog *c;
    char **seen;
    size_t nseen;
};

static bool
pb_named(const struct catalog *c, const struct disco_res *r)
{
    char *gvr = gvr_text(r->group, r->version, r->resource);
    bool named = false;
    for (size_t j = 0; j < c->npb && !named; j++)
        named = strcmp(c->pb[j], r->resource) == 0 || strcmp(c->pb[j], gvr) == 0;
    free(gvr);
    return named;
}

static void
pick_pb(void *arg, const struct disco_res *r)
{
    struct pb_pick *p = arg;
    struct catalog *c = p->c;
    if (!kinds_builtin_group(r->group) || !pb_named(c, r) ||
        !cacheable(c, r->group, r->version, r->resource))
        return;
    char *gr = xasprintf("%s/%s", r->group, r->resource);
    for (size_t i = 0; i < p->nseen; i++)
        if (strcmp(p->seen[i], gr) == 0) {
            free(gr);
            return;
        }
    p->seen = xrealloc(p->seen, (p->nseen + 1) * sizeof(*p->seen));
    p->seen[p->nseen++] = gr;
    int i = find(c, r->group, r->version, r->resource, KWC_ENC_PB);
    char err[512];
    if (i < 0 &&
        (i = add(c, r->group, r->version, r->resource, KWC_ENC_PB, err, sizeof(err))) < 0) {
        char *gvr = gvr_text(r->group, r->version, r->resource);
        log_warnx("cache %s (protobuf): %s", gvr, err);
        free(gvr);
        return;
    }
    if (!refl_started(c->set.r[i]))
        start_slot(c, (size_t)i, true);
}

/* What changes discovery: CustomResourceDefinitions (new resources) and
 * APIServices (aggregated APIs). Their caches start with discovery's first
 * answer, pinned, and each commit that moves either one's rv asks discovery
 * again at once, instead of at its next interval. */
static const char *const discovery_sources[2][3] = {
    {"apiextensions.k8s.io", "v1", "customresourcedefinitions"},
    {"apiregistration.k8s.io", "v1", "apiservices"}};

static void
watch_discovery_sources(struct catalog *c)
{
    for (int k = 0; k < 2; k++) {
        const char *const *gvr = discovery_sources[k];
        if (!cacheable(c, gvr[0], gvr[1], gvr[2]))
            continue;
        int i = find(c, gvr[0], gvr[1], gvr[2], KWC_ENC_JSON);
        char err[512];
        if (i < 0 && (i = add(c, gvr[0], gvr[1], gvr[2], KWC_ENC_JSON, err, sizeof(err))) < 0) {
            log_warnx("cache %s/%s/%s: %s", gvr[0], gvr[1], gvr[2], err);
            continue;
        }
        if (!refl_started(c->set.r[i]))
            start_slot(c, (size_t)i, true);
        c->watch_slot[k] = i;
    }
}

static void
on_commit(void *arg)
{
    struct catalog *c = arg;
    for (int k = 0; k < 2; k++) {
        if (c->watch_slot[k] < 0)
            continue;
        struct refl *rf = c->set.r[c->watch_slot[k]];
        if (!refl_serving(rf))
            continue;
        uint64_t rv = store_res_rv(c->st, refl_desc(rf)->sres, NULL);
        if (c->watch_rv[k] && rv != c->watch_rv[k]) {
            log_debug("discovery: %s changed (rv %llu): asking discovery again",
                      discovery_sources[k][2], (unsigned long long)rv);
            disco_refresh_soon(c->disco);
        }
        c->watch_rv[k] = rv;
    }
}

/* Discovery changed (or answered for the first time). */
static void
on_disco(void *arg)
{
    struct catalog *c = arg;
    if (!c->defaults_started && disco_ready(c->disco)) {
        c->defaults_started = true;
        struct pb_pick p = {.c = c};
        disco_each(c->disco, pick_pb, &p);
        free_list(p.seen, p.nseen);
        watch_discovery_sources(c);
    }
    /* caches whose resource left discovery (or became one kwc must not
     * cache: an aggregated API); frozen, another process decides */
    for (size_t i = 0; i < c->set.n && !refl_ingest_frozen(c->ing); i++) {
        struct slot *s = &c->slots[i];
        struct refl *rf = c->set.r[i];
        const struct refl_desc *d = refl_desc(rf);
        if (!refl_started(rf) && !s->has_data)
            continue;
        struct disco_res dr;
        enum disco_found f = disco_find(c->disco, d->group, d->version, d->resource, &dr);
        if (f == DISCO_UNKNOWN || (f == DISCO_PRESENT && dr.list && dr.watch && !dr.aggregated))
            continue;
        log_info("cache %s%s: the upstream's discovery %s; ending its watchers and dropping its "
                 "data",
                 d->path, d->enc == KWC_ENC_PB ? " (protobuf)" : "",
                 f == DISCO_ABSENT ? "no longer lists it"
                 : dr.aggregated   ? "now serves it from an aggregated API"
                                   : "no longer lists it with the verbs list and watch");
        bool was = refl_started(rf);
        if (was)
            stop_slot(c, i);
        if (was && c->end)
            c->end(c->end_arg, i);
        s->pinned = false;
        drop_data(c, i);
        c->stats.vanished++;
    }
}

static void
on_retry(void *arg, const struct refl *r, int status)
{
    struct catalog *c = arg;
    (void)r;
    if (status == 404 && c->disco)
        disco_refresh_soon(c->disco); /* the resource may be gone */
}

/* Explicit mode: the caches of the list, as kwc always made them. */
static int
make_explicit(struct catalog *c, const char *resources, const char *protobuf, char *err,
              size_t errlen)
{
    size_t nr, np = 0;
    char **res = split(resources, &nr);
    const char *pbl = protobuf ? protobuf : KINDS_PB_DEFAULT;
    char **pb = strcmp(pbl, "none") == 0 ? xcalloc(1, sizeof(char *)) : split(pbl, &np);
    bool *used = xcalloc(np + 1, sizeof(bool));
    int rc = 0;
    for (size_t i = 0; i < nr && rc == 0; i++) {
        struct refl *rf;
        if ((rc = refl_new(c->base, c->up, c->ing, res[i], KWC_ENC_JSON, c->identity, &rf, err,
                           errlen)) == 0) {
            c->slots[c->set.n].required = true;
            publish(c, rf);
        }
    }
    size_t njson = c->set.n;
    for (size_t i = 0; i < njson && rc == 0; i++) {
        const struct refl_desc *d = refl_desc(c->set.r[i]);
        if (!kinds_builtin_group(d->group))
            continue;
        bool named = false;
        for (size_t j = 0; j < np; j++)
            if (strcmp(pb[j], res[i]) == 0 || strcmp(pb[j], d->resource) == 0)
                named = used[j] = true;
        struct refl *rf;
        if ((rc = refl_new(c->base, c->up, c->ing, res[i], KWC_ENC_PB, c->identity, &rf, err,
                           errlen)) == 0) {
            c->slots[c->set.n].required = c->slots[c->set.n].pinned = named;
            publish(c, rf);
        }
    }
    if (rc == KWC_ETOOBIG)
        snprintf(err, errlen,
                 "--resources: more caches than kwc holds (%zu; a built-in resource takes two, "
                 "JSON and protobuf)",
                 c->set.cap);
    /* like the default, a list may name more than --resources caches: one
     * list for several kwc with different --resources */
    for (size_t j = 0; j < np && rc == 0 && protobuf; j++)
        if (!used[j])
            log_warnx("--protobuf-resources: \"%s\" names no built-in resource of --resources "
                      "(a name such as pods, or a --resources entry): no protobuf cache for it",
                      pb[j]);
    free_list(res, nr);
    free_list(pb, np);
    free(used);
    return rc;
}

int
catalog_new(struct event_base *base, struct up_client *up, struct refl_ingest *ing,
            struct store *st, struct disco *disco, const struct catalog_options *o,
            struct catalog **out, char *err, size_t errlen)
{
    struct catalog *c = xcalloc(1, sizeof(*c));
    c->base = base;
    c->up = up;
    c->ing = ing;
    c->st = st;
    c->disco = disco;
    c->auto_mode = o->auto_mode;
    c->idle_ms = o->idle_ms;
    c->disk_budget = o->disk_budget;
    c->identity = xstrdup(o->identity);
    c->owner = pthread_self();
    c->mb = mailbox_new(base);
    pthread_mutex_init(&c->pend_mu, NULL);
    size_t nres = 0;
    if (!c->auto_mode) {
        /* nres once split has set it (arguments are evaluated in no set order) */
        char **l = split(o->resources, &nres);
        free_list(l, nres);
    }
    /* auto: --max-caches bounds the caches running at once; the set holds
     * every resource and encoding ever cached (their slots stay: a stopped
     * cache resumes in its own), up to what the store opens */
    c->max_caches = o->max_caches;
    c->set.cap = c->auto_mode ? STORE_MAX_RESOURCES : 2 * nres;
    if (c->set.cap > STORE_MAX_RESOURCES)
        c->set.cap = STORE_MAX_RESOURCES;
    c->set.r = xcalloc(c->set.cap ? c->set.cap : 1, sizeof(*c->set.r));
    c->slots = xcalloc(c->set.cap ? c->set.cap : 1, sizeof(*c->slots));
    *out = c;
    if (!c->auto_mode)
        return make_explicit(c, o->resources, o->protobuf, err, errlen);
    size_t ne;
    char **ex = split(o->exclude, &ne);
    c->excl = xcalloc(ne ? ne : 1, sizeof(*c->excl));
    int rc = 0;
    for (size_t i = 0; i < ne && rc == 0; i++)
        if ((rc = parse_pattern(ex[i], &c->excl[i], err, errlen)) == 0)
            c->nexcl++;
    free_list(ex, ne);
    if (rc)
        return rc;
    const char *pbl = o->protobuf ? o->protobuf : KINDS_PB_DEFAULT;
    if (strcmp(pbl, "none") != 0)
        c->pb = split(pbl, &c->npb);
    disco_subscribe(disco, on_disco, c);
    refl_ingest_on_retry(ing, on_retry, c);
    c->watch_slot[0] = c->watch_slot[1] = -1;
    refl_ingest_subscribe(ing, on_commit, NULL, c);
    uint64_t tick = c->idle_ms / 4;
    tick = tick < CATALOG_TICK_MIN_MS   ? CATALOG_TICK_MIN_MS
           : tick > CATALOG_TICK_MAX_MS ? CATALOG_TICK_MAX_MS
                                        : tick;
    c->tick = event_new(base, -1, EV_PERSIST, on_tick, c);
    struct timeval tv = {(time_t)(tick / 1000), (suseconds_t)(tick % 1000) * 1000};
    event_add(c->tick, &tv);
    return 0;
}

void
catalog_start(struct catalog *c)
{
    if (c->auto_mode) {
        on_disco(c); /* discovery may have answered already */
        return;
    }
    for (size_t i = 0; i < c->set.n; i++)
        if (c->slots[i].required)
            refl_start(c->set.r[i]);
}

void
catalog_free(struct catalog *c)
{
    if (!c)
        return;
    c->closing = true;
    mailbox_free(c->mb); /* a want queued now does nothing */
    for (size_t i = 0; i < c->npend; i++) {
        free(c->pend[i].g);
        free(c->pend[i].v);
        free(c->pend[i].r);
    }
    free(c->pend);
    free(c->subs);
    pthread_mutex_destroy(&c->pend_mu);
    if (c->tick)
        event_free(c->tick);
    if (c->auto_mode && c->disco)
        disco_unsubscribe(c->disco, c);
    /* its commit subscription goes with the writer, freed before it
     * (main.c: the writer's last commit reaches the caches first) */
    for (size_t i = 0; i < c->set.n; i++)
        refl_free(c->set.r[i]);
    for (size_t i = 0; i < c->nexcl; i++)
        for (int k = 0; k < 3; k++)
            free(c->excl[i].part[k]);
    free(c->excl);
    if (c->pb)
        free_list(c->pb, c->npb);
    free(c->set.r);
    free(c->slots);
    free(c->identity);
    free(c);
}

void
catalog_freeze(struct catalog *c)
{
    size_t n = 0;
    refl_ingest_commit(c->ing); /* nothing of theirs pending afterwards (stop_slot) */
    for (size_t i = 0; i < c->set.n; i++) {
        struct refl *rf = c->set.r[i];
        c->slots[i].thaw = refl_started(rf);
        if (c->slots[i].thaw) {
            refl_stop(rf);
            n++;
        }
    }
    refl_ingest_freeze(c->ing, true);
    log_info("kwc: %zu caches stopped for a takeover; the data dir is written no more", n);
}

void
catalog_thaw(struct catalog *c)
{
    refl_ingest_freeze(c->ing, false);
    size_t n = 0;
    for (size_t i = 0; i < c->set.n; i++)
        if (c->slots[i].thaw) {
            c->slots[i].thaw = false;
            refl_start(c->set.r[i]);
            n++;
        }
    log_info("kwc: the takeover did not happen: %zu caches resume", n);
    run_drops(c); /* those decided before the freeze */
}

const struct refl_set *
catalog_set(const struct catalog *c)
{
    return &c->set;
}

bool
catalog_auto(const struct catalog *c)
{
    return c->auto_mode;
}

bool
catalog_may_cache(const struct catalog *c, const char *group, const char *version,
                  const char *resource)
{
    if (find(c, group, version, resource, KWC_ENC_JSON) >= 0)
        return true;
    int i = find(c, group, version, resource, KWC_ENC_PB);
    if (i >= 0 && (c->auto_mode || refl_desc(c->set.r[i])->kind != NULL))
        return true;
    /* before discovery answers, kwc cannot know: it authorizes the read
     * itself, and it waits for discovery (catalog_discovering) */
    return c->auto_mode && (catalog_discovering(c) || cacheable(c, group, version, resource));
}

/* Caches running; on_demand: only those requests started (what kwc starts
 * itself, the protobuf defaults and the discovery sources, is a fixed few
 * and does not count against --max-caches). */
static size_t
running(const struct catalog *c, bool on_demand)
{
    size_t n = 0;
    for (size_t i = 0; i < c->set.n; i++)
        n += refl_started(c->set.r[i]) && (!on_demand || !c->slots[i].pinned);
    return n;
}

/* --max-caches reached: one more would run past it. */
static bool
full(struct catalog *c, const char *group, const char *version, const char *resource)
{
    if (running(c, true) < c->max_caches)
        return false;
    c->stats.refused_max++;
    if (!c->warned_max) {
        c->warned_max = true;
        log_warnx("cache for %s%s%s/%s: --max-caches %u caches run already: its requests pass "
                  "through until one stops (--cache-idle-timeout); said once",
                  group, *group ? "/" : "", version, resource, c->max_caches);
    }
    return true;
}

/* catalog_want on the main loop: decides and starts at once. */
static int
want_here(struct catalog *c, const char *group, const char *version, const char *resource,
          enum kwc_enc enc)
{
    int i = find(c, group, version, resource, enc);
    if (!c->auto_mode) {
        if (i >= 0 && enc == KWC_ENC_PB)
            refl_want(c->set.r[i]); /* a protobuf cache starts at its first request */
        return i;
    }
    if (enc == KWC_ENC_PB && !kinds_builtin_group(group))
        return -1; /* custom resources have no protobuf */
    if (i >= 0) {
        c->slots[i].used_ms = now_ms();
        if (!refl_started(c->set.r[i]) && cacheable(c, group, version, resource) &&
            !full(c, group, version, resource)) {
            log_info("cache %s%s: resumed by a request", refl_desc(c->set.r[i])->path,
                     enc == KWC_ENC_PB ? " (protobuf)" : "");
            start_slot(c, (size_t)i, false);
        }
        return i;
    }
    if (!cacheable(c, group, version, resource)) {
        catalog_missed(c, group, version, resource);
        return -1;
    }
    char err[512];
    if (full(c, group, version, resource))
        return -1;
    if ((i = add(c, group, version, resource, enc, err, sizeof(err))) < 0) {
        c->stats.refused_max++;
        log_warnx("cache for %s%s%s/%s: %s: its requests pass through", group, *group ? "/" : "",
                  version, resource, err);
        return -1;
    }
    log_info("cache %s%s: started by a request", refl_desc(c->set.r[i])->path,
             enc == KWC_ENC_PB ? " (protobuf)" : "");
    start_slot(c, (size_t)i, false);
    return i;
}

/* ---- wants from the serving loops ---- */

static bool
pending_same(const struct pending *p, const char *g, const char *v, const char *r, enum kwc_enc enc)
{
    return p->enc == enc && strcmp(p->r, r) == 0 && strcmp(p->v, v) == 0 && strcmp(p->g, g) == 0;
}

static void
notify(struct catalog *c)
{
    for (size_t i = 0; i < c->nsubs; i++)
        c->subs[i].fn(c->subs[i].arg);
}

/* Main loop: a serving loop's want, carried out as on the main loop, then
 * told (the slot made, the cache started, or neither: refused). */
static void
run_posted(void *arg)
{
    struct posted *w = arg;
    struct catalog *c = w->c;
    if (!c->closing) {
        if (w->slot >= 0) {
            const struct refl_desc *d = refl_desc(c->set.r[w->slot]);
            want_here(c, d->group, d->version, d->resource, d->enc);
            atomic_store(&c->slots[w->slot].starting, false);
        } else {
            want_here(c, w->p.g, w->p.v, w->p.r, w->p.enc);
            pthread_mutex_lock(&c->pend_mu);
            for (size_t i = 0; i < c->npend; i++)
                if (pending_same(&c->pend[i], w->p.g, w->p.v, w->p.r, w->p.enc)) {
                    struct pending gone = c->pend[i];
                    c->pend[i] = c->pend[--c->npend];
                    free(gone.g);
                    free(gone.v);
                    free(gone.r);
                    break;
                }
            pthread_mutex_unlock(&c->pend_mu);
        }
        notify(c);
    }
    free(w->p.g);
    free(w->p.v);
    free(w->p.r);
    free(w);
}

/* A serving loop wants cache i started: it reads as warming (starting)
 * until the main loop has started it, or refused (--max-caches, frozen:
 * then it passes through); one post however many loops ask meanwhile. */
static void
post_start(struct catalog *c, int i)
{
    struct slot *s = &c->slots[i];
    if (refl_started(c->set.r[i]) || refl_ingest_frozen(c->ing) ||
        atomic_exchange(&s->starting, true))
        return;
    struct posted *w = xcalloc(1, sizeof(*w));
    *w = (struct posted){.c = c, .slot = i};
    mailbox_post(c->mb, run_posted, w);
}

/* A serving loop wants a cache with no slot yet: the main loop makes it
 * (once per resource and encoding, however many ask meanwhile). */
static void
post_create(struct catalog *c, const char *g, const char *v, const char *r, enum kwc_enc enc)
{
    pthread_mutex_lock(&c->pend_mu);
    for (size_t i = 0; i < c->npend; i++)
        if (pending_same(&c->pend[i], g, v, r, enc)) {
            pthread_mutex_unlock(&c->pend_mu);
            return;
        }
    c->pend = xrealloc(c->pend, (c->npend + 1) * sizeof(*c->pend));
    c->pend[c->npend++] = (struct pending){xstrdup(g), xstrdup(v), xstrdup(r), enc};
    pthread_mutex_unlock(&c->pend_mu);
    struct posted *w = xcalloc(1, sizeof(*w));
    *w = (struct posted){.c = c, .slot = -1, .p = {xstrdup(g), xstrdup(v), xstrdup(r), enc}};
    mailbox_post(c->mb, run_posted, w);
}

int
catalog_want(struct catalog *c, const char *group, const char *version, const char *resource,
             enum kwc_enc enc)
{
    if (on_loop(c))
        return want_here(c, group, version, resource, enc);
    /* a serving loop: what want_here decides at once is posted */
    int i = find(c, group, version, resource, enc);
    if (!c->auto_mode) {
        if (i >= 0 && enc == KWC_ENC_PB)
            post_start(c, i); /* a protobuf cache starts at its first request */
        return i;
    }
    if (enc == KWC_ENC_PB && !kinds_builtin_group(group))
        return -1;
    if (i >= 0) {
        atomic_store_explicit(&c->slots[i].used_ms, now_ms(), memory_order_relaxed);
        if (cacheable(c, group, version, resource))
            post_start(c, i);
        return i;
    }
    if (!cacheable(c, group, version, resource)) {
        catalog_missed(c, group, version, resource);
        return -1;
    }
    post_create(c, group, version, resource, enc);
    return CATALOG_PENDING;
}

int
catalog_find(const struct catalog *c, const char *group, const char *version, const char *resource,
             enum kwc_enc enc)
{
    return find(c, group, version, resource, enc);
}

bool
catalog_pending(struct catalog *c, const char *group, const char *version, const char *resource)
{
    bool found = false;
    pthread_mutex_lock(&c->pend_mu);
    for (size_t i = 0; i < c->npend && !found; i++)
        found = strcmp(c->pend[i].r, resource) == 0 && strcmp(c->pend[i].v, version) == 0 &&
                strcmp(c->pend[i].g, group) == 0;
    pthread_mutex_unlock(&c->pend_mu);
    return found;
}

void
catalog_subscribe(struct catalog *c, void (*on_change)(void *arg), void *arg)
{
    c->subs = xrealloc(c->subs, (c->nsubs + 1) * sizeof(*c->subs));
    c->subs[c->nsubs++] = (struct sub){on_change, arg};
}

void
catalog_unsubscribe(struct catalog *c, void *arg)
{
    size_t n = 0;
    for (size_t i = 0; i < c->nsubs; i++)
        if (c->subs[i].arg != arg)
            c->subs[n++] = c->subs[i];
    c->nsubs = n;
}

void
catalog_set_quiesce(struct catalog *c,
                    void (*fn)(void *arg, void (*done)(void *done_arg), void *done_arg), void *arg)
{
    c->quiesce = fn;
    c->quiesce_arg = arg;
}

void
catalog_missed(struct catalog *c, const char *group, const char *version, const char *resource)
{
    struct disco_res dr;
    if (c->auto_mode && c->disco &&
        disco_find(c->disco, group, version, resource, &dr) == DISCO_ABSENT)
        disco_refresh_soon(c->disco); /* a resource created since (a new CRD)? */
}

bool
catalog_discovering(const struct catalog *c)
{
    return c->auto_mode && c->disco && !disco_ready(c->disco);
}

bool
catalog_warming(const struct catalog *c, size_t i)
{
    if (i >= atomic_load_explicit(&c->set.n, memory_order_acquire))
        return false;
    /* starting first: the main loop clears it after the start it stands for */
    return atomic_load(&c->slots[i].starting) || refl_warming(c->set.r[i]);
}

bool
catalog_required(const struct catalog *c, size_t i)
{
    return i < atomic_load_explicit(&c->set.n, memory_order_acquire) && c->slots[i].required;
}

void
catalog_set_busy(struct catalog *c, bool (*busy)(void *arg, size_t i), void *arg)
{
    c->busy = busy;
    c->busy_arg = arg;
}

void
catalog_set_end(struct catalog *c, void (*end)(void *arg, size_t i), void *arg)
{
    c->end = end;
    c->end_arg = arg;
}

void
catalog_stats(const struct catalog *c, struct catalog_stats *out)
{
    *out = c->stats;
    out->caches = c->set.n;
    out->running = running(c, false);
}
