/*
 * cluster.c — the upstream cluster's identity (see reflector.h,
 * refl_ingest_check_identity; DESIGN.md "Trust in the upstream's timeline").
 *
 * The kube-system namespace's uid is the conventional cluster id: it is
 * made once, when the cluster is, and an etcd restore keeps it (a restore
 * is told by its rvs going back: reflector_reset.c). It is recorded in the
 * store with the data (store_cluster_id). It is read at start and after
 * every reconnect (an attempt of any cache that got no answer or a 5xx:
 * refl_ingest_lost), since a kubeconfig or a DNS name can lead to another
 * cluster across a restart of either side. Until it has answered, a watch
 * resuming from a cache's rv waits (refl_ingest_identity_wait: its
 * reflector parks); a fresh list does not need to. Another uid: every
 * cache, running or not, is reset and the store rebased on the new uid in
 * one transaction (store_rebase), so that a crash in between cannot leave
 * data of one cluster recorded as the other's.
 *
 * Frozen for a takeover (refl_ingest_freeze), the answer is dropped: the
 * store may be another process's by then.
 *
 * Not allowed to read it (403: kwc's RBAC lacks get on namespaces) or no
 * such namespace (an API server that is not a whole cluster): said once per
 * run, and only the rv checks guard the caches; it is asked again after a
 * reconnect. It is read as a list with a field selector, which the list
 * kwc needs of every resource allows (a get would need a rule of its own).
 * Loop thread only.
 */
#include <event2/buffer.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"
#include "kwc/log.h"
#include "kwc/store.h"
#include "kwc/upstream.h"

#include "ingest.h"
#include "reflector_int.h"

#define ID_MAX 256
#define ID_BODY_MAX ((size_t)1 << 20)
/* a list, not a get: kwc's RBAC lists every resource and gets none
 * (conf/kubernetes/base/rbac.yaml) */
#define ID_PATH "/api/v1/namespaces?fieldSelector=metadata.name%3Dkube-system"

enum refl_id_verdict
refl_id_decide(const char *recorded, const char *seen)
{
    if (!recorded[0])
        return REFL_ID_RECORD;
    return strcmp(recorded, seen) == 0 ? REFL_ID_SAME : REFL_ID_CHANGED;
}

int
refl_id_parse(const char *body, size_t len, char *uid, size_t uidlen)
{
    json_t *doc = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL);
    json_t *items = json_object_get(doc, "items");
    json_t *ns = json_is_array(items) ? json_array_get(items, 0) : doc;
    const char *u = json_string_value(json_object_get(json_object_get(ns, "metadata"), "uid"));
    int rc = KWC_EPARSE;
    if (u && u[0] && strlen(u) < uidlen && strlen(u) < ID_MAX) {
        snprintf(uid, uidlen, "%s", u);
        rc = 0;
    }
    json_decref(doc);
    return rc;
}

void
refl_ingest_resets(const struct refl_ingest *ing, struct refl_resets *out)
{
    *out = ing->resets;
}

/* Every parked reflector goes on (its watch starts). */
static void
unpark_all(struct refl_ingest *ing)
{
    for (size_t i = 0; i < ing->nall; i++)
        refl_unpark(ing->all[i]);
}

/* Another cluster: every cache starts over, the data of those not running
 * with them. */
static void
changed(struct refl_ingest *ing, const char *recorded, const char *seen)
{
    ing->resets.identity++;
    log_warnx("upstream: the cluster's identity changed: kube-system namespace uid %s, the data "
              "dir holds %s: another cluster; dropping every cache (their watchers get 410 "
              "Expired, their requests pass through) and listing afresh",
              seen, recorded);
    for (size_t i = 0; i < ing->nall; i++)
        refl_reset(ing->all[i], true, 0, 0, NULL);
    int rc = store_rebase(ing->st, seen);
    if (rc)
        log_error("upstream: dropping the caches' data failed: %s (each cache lists afresh)",
                  kwc_strerror(rc));
    refl_ingest_notify_commit(ing); /* the stores' rvs went down: the watch pool follows */
}

static void check(struct refl_ingest *ing);

static void
on_id_done(void *arg, int err, const char *msg)
{
    struct refl_ingest *ing = arg;
    ing->id_x = NULL;
    char seen[ID_MAX], recorded[ID_MAX];
    size_t len = evbuffer_get_length(ing->id_body);
    const char *body = (const char *)evbuffer_pullup(ing->id_body, -1);
    if (ing->frozen) {
        /* a takeover: another process may own the store now (and checks
         * for itself); after a thaw the next watch asks again */
        ing->id_ok = ing->id_again = false;
        return;
    }
    if (!err && !ing->id_too_big && ing->id_status == 200 &&
        refl_id_parse(body, len, seen, sizeof(seen)) == 0) {
        int rc = store_cluster_id(ing->st, recorded, sizeof(recorded));
        if (rc)
            log_warnx("upstream: the cluster identity recorded in the data dir cannot be read "
                      "(%s): taking it as another cluster's",
                      kwc_strerror(rc));
        ing->id_ok = true;
        switch (rc ? REFL_ID_CHANGED : refl_id_decide(recorded, seen)) {
        case REFL_ID_RECORD:
            if ((rc = store_set_cluster_id(ing->st, seen)))
                log_warnx("upstream: recording the cluster's identity failed: %s",
                          kwc_strerror(rc));
            else
                log_info("upstream: cluster identity (kube-system namespace uid) %s recorded",
                         seen);
            break;
        case REFL_ID_SAME:
            log_debug("upstream: cluster identity %s, as recorded", seen);
            break;
        case REFL_ID_CHANGED:
            changed(ing, rc ? "an unreadable one" : recorded, seen);
            break;
        }
    } else if (!err && (ing->id_status == 403 || ing->id_status == 404 ||
                        (ing->id_status == 200 && !ing->id_too_big))) {
        /* kwc cannot know: the rv checks alone guard the caches */
        ing->id_ok = true;
        if (!ing->id_told)
            log_warnx("upstream: LIST %s answered %d%s: the cluster's identity is not checked, "
                      "only resourceVersions going back are (grant kwc list of namespaces: "
                      "conf/kubernetes/base/rbac.yaml)",
                      ID_PATH, ing->id_status, ing->id_status == 200 ? " without kube-system" : "");
        ing->id_told = true;
    } else {
        /* the upstream is away again: watches go on (they fail too, and
         * their next probe asks again) */
        log_debug("upstream: LIST %s failed: %s", ID_PATH,
                  err               ? msg
                  : ing->id_too_big ? "too large"
                                    : "an error status");
    }
    bool again = ing->id_again;
    ing->id_again = false;
    if (again && ing->id_ok) {
        ing->id_ok = false;
        check(ing);
        return;
    }
    unpark_all(ing);
}

static int
on_id_headers(void *arg, int status, const struct up_header *h, size_t n)
{
    struct refl_ingest *ing = arg;
    ing->id_status = status;
    return 0;
}

static int
on_id_data(void *arg, const char *p, size_t n)
{
    struct refl_ingest *ing = arg;
    if (evbuffer_get_length(ing->id_body) + n > ID_BODY_MAX)
        ing->id_too_big = true;
    else
        evbuffer_add(ing->id_body, p, n);
    return 0;
}

static const struct up_xfer_cbs id_cbs = {
    .on_headers = on_id_headers, .on_data = on_id_data, .on_done = on_id_done};

static void
check(struct refl_ingest *ing)
{
    static const struct up_header json = {"Accept", "application/json"};
    struct up_request req = {
        .method = "GET", .target = ID_PATH, .headers = &json, .nheaders = 1, .pool = UP_POOL_CACHE};
    ing->id_status = 0;
    ing->id_too_big = false;
    evbuffer_drain(ing->id_body, evbuffer_get_length(ing->id_body));
    if (up_xfer_start(ing->id_up, &req, &id_cbs, ing, &ing->id_x) != 0) {
        ing->id_x = NULL;
        unpark_all(ing);
    }
}

void
refl_ingest_check_identity(struct refl_ingest *ing, struct up_client *up)
{
    ing->id_up = up;
    if (!ing->id_body)
        ing->id_body = evbuffer_new();
    ing->id_ok = false;
    if (!ing->id_x)
        check(ing);
}

void
refl_ingest_lost(struct refl_ingest *ing)
{
    if (!ing->id_up)
        return;
    ing->id_ok = false;
    if (ing->id_x)
        ing->id_again = true; /* it may have asked the old upstream */
}

bool
refl_ingest_identity_wait(struct refl_ingest *ing)
{
    if (!ing->id_up || ing->id_ok)
        return false;
    if (!ing->id_x)
        check(ing);
    return ing->id_x != NULL;
}

void
refl_ingest_identity_fini(struct refl_ingest *ing)
{
    up_xfer_cancel(ing->id_x);
    ing->id_x = NULL;
    if (ing->id_body)
        evbuffer_free(ing->id_body);
    ing->id_body = NULL;
}
