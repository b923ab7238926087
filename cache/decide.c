/*
 * decide.c — the list/get decision table (decide.h).
 *
 * Called by admission (proxy/serve/admit.c) for every list or get of a
 * cached resource, before anything is read from the store; the result says
 * serve (latest, at least N, exactly N from a start key), pass through, or
 * answer an error. Owns only its
 * result. Pure: no I/O, no clock (the wait it asks for is the caller's).
 *
 * Order of checks and error texts, all from kube-apiserver:
 *  1. ListResource decodes the query (k8s.io/apiserver/pkg/endpoints/handlers/
 *     get.go: DecodeParameters -> errors.NewBadRequest(err.Error())):
 *     Convert_url_Values_To_v1_ListOptions (apimachinery/pkg/apis/meta/v1/
 *     zz_generated.conversion.go) parses timeoutSeconds then limit with
 *     strconv.ParseInt (runtime/conversion.go Convert_Slice_string_To_int64),
 *     then the v1 -> internal conversion parses the selectors.
 *  2. ValidateListOptions (apimachinery/pkg/apis/meta/internalversion/
 *     validation/validation.go), every error collected, answered as
 *     errors.NewInvalid(ListOptions.meta.k8s.io, "", errs): 422 Invalid.
 *  Then kwc passes through what only the upstream can answer, whatever the
 *  storage layer would say: rv unset without continue (a quorum read), and
 *  anything while the cache is not synced.
 *  3. The storage layer. cacher.go shouldDelegateList picks the layer; the
 *     cacher parses the rv with APIObjectVersioner.ParseResourceVersion
 *     (apiserver/pkg/storage/api_object_versioner.go) and returns its
 *     storage.InvalidError as is, which the handler turns into a plain 500
 *     (responsewriters/status.go ErrorToAPIStatus); etcd3/store.go GetList
 *     answers 400 "invalid resource version: ...", then decodes the continue
 *     token (storage/continue.go: 400 "invalid continue token: ..."; kwc
 *     passes every token cont_decode refuses to the upstream instead), then
 *     400 "specifying resource version is not allowed when using continue".
 *  4. Only then does kwc look at its window (floor, current rv).
 * The 504 after the NotOlderThan wait is storage/errors.go
 * NewTooLargeResourceVersionError as the watch cache sends it
 * (watch_cache.go waitUntilFreshAndBlock: retry after 1 s).
 */
#include "kwc/decide.h"

#include "kwc/base.h"
#include "kwc/cont.h"
#include "kwc/gostr.h"
#include "kwc/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- strconv.ParseUint / ParseInt, base 10, 64 bits ---- */

enum numerr { NUM_OK, NUM_SYNTAX, NUM_RANGE };

static enum numerr
parse_uint(const char *s, uint64_t *out)
{
    uint64_t n = 0;
    if (!*s)
        return NUM_SYNTAX;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return NUM_SYNTAX;
        if (n >= UINT64_MAX / 10 + 1)
            return NUM_RANGE;
        n *= 10;
        uint64_t n1 = n + (uint64_t)(*s - '0');
        if (n1 < n)
            return NUM_RANGE;
        n = n1;
    }
    *out = n;
    return NUM_OK;
}

static enum numerr
parse_int(const char *s, int64_t *out)
{
    bool neg = false;
    uint64_t un = UINT64_MAX;
    if (!*s)
        return NUM_SYNTAX;
    if (*s == '+' || *s == '-')
        neg = *s++ == '-';
    enum numerr e = parse_uint(s, &un);
    if (e == NUM_SYNTAX)
        return NUM_SYNTAX;
    if (e == NUM_RANGE || (!neg && un >= UINT64_C(1) << 63) || (neg && un > UINT64_C(1) << 63))
        return NUM_RANGE;
    *out = neg ? (int64_t)(0 - un) : (int64_t)un;
    return NUM_OK;
}

/* strconv.NumError.Error(): `strconv.<fn>: parsing "<s>": <why>` */
static void
num_error(struct gostr_buf *b, const char *fn, const char *s, enum numerr e)
{
    gostr_add(b, "strconv.");
    gostr_add(b, fn);
    gostr_add(b, ": parsing ");
    gostr_quote(b, s, strlen(s));
    gostr_add(b, e == NUM_RANGE ? ": value out of range" : ": invalid syntax");
}

/* ---- results ---- */

static void
set_error(struct decide_result *out, int code, const char *reason, char *message,
          const struct status_details *details)
{
    out->action = DECIDE_ERROR;
    out->code = code;
    out->reason = reason;
    out->message = message;
    out->body = status_failure_json(code, reason, message, details);
}

/* errors.NewBadRequest(msg): 400 BadRequest, no details. Takes msg. */
static void
bad_request(struct decide_result *out, char *msg)
{
    set_error(out, 400, "BadRequest", msg, NULL);
}

static void
pass(struct decide_result *out, enum decide_why why)
{
    out->action = DECIDE_PASS_THROUGH;
    out->why = why;
}

/* ---- ValidateListOptions ---- */

#define LIST_MAX_ERRS 5

struct field_errs {
    struct status_cause causes[LIST_MAX_ERRS];
    char *bodies[LIST_MAX_ERRS];
    size_t n;
};

/* field.Forbidden / field.NotSupported: body is ErrorBody(), takes it. */
static void
field_err(struct field_errs *fe, const char *type, const char *field, char *body)
{
    fe->bodies[fe->n] = body;
    fe->causes[fe->n] = (struct status_cause){.reason = type, .message = body, .field = field};
    fe->n++;
}

static void
forbidden(struct field_errs *fe, const char *field, const char *detail)
{
    field_err(fe, "FieldValueForbidden", field, xasprintf("Forbidden: %s", detail));
}

/* errors.NewInvalid(ListOptions.meta.k8s.io, "", errs): `<Kind>.<group>
 * "<name>" is invalid: <aggregate>`, the aggregate being the one error or
 * "[e1, e2, ...]". Returns true (an ERROR in *out) when there are errors. */
static bool
invalid(struct field_errs *fe, struct decide_result *out)
{
    if (fe->n == 0)
        return false;
    struct gostr_buf m = {0};
    gostr_add(&m, "ListOptions.meta.k8s.io \"\" is invalid: ");
    if (fe->n > 1)
        gostr_add(&m, "[");
    for (size_t i = 0; i < fe->n; i++) {
        if (i)
            gostr_add(&m, ", ");
        gostr_add(&m, fe->causes[i].field);
        gostr_add(&m, ": ");
        gostr_add(&m, fe->bodies[i]);
    }
    if (fe->n > 1)
        gostr_add(&m, "]");
    struct status_details d = {
        .group = "meta.k8s.io", .kind = "ListOptions", .causes = fe->causes, .ncauses = fe->n};
    set_error(out, 422, "Invalid", gostr_take(&m), &d);
    for (size_t i = 0; i < fe->n; i++)
        free(fe->bodies[i]);
    return true;
}

/* Returns true (and an ERROR in *out) when validation fails. */
static bool
validate_list(const struct decide_req *req, struct decide_result *out)
{
    const char *rv = req->resource_version ? req->resource_version : "";
    const char *match = req->resource_version_match ? req->resource_version_match : "";
    const char *cont = req->continue_token ? req->continue_token : "";
    struct field_errs fe = {.n = 0};

    if (*match) {
        if (!*rv)
            forbidden(&fe, "resourceVersionMatch",
                      "resourceVersionMatch is forbidden unless resourceVersion is provided");
        if (*cont)
            forbidden(&fe, "resourceVersionMatch",
                      "resourceVersionMatch is forbidden when continue is provided");
        if (strcmp(match, "Exact") != 0 && strcmp(match, "NotOlderThan") != 0) {
            struct gostr_buf b = {0};
            gostr_add(&b, "Unsupported value: ");
            gostr_quote(&b, match, strlen(match));
            gostr_add(&b, ": supported values: \"Exact\", \"NotOlderThan\", \"\"");
            field_err(&fe, "FieldValueNotSupported", "resourceVersionMatch", gostr_take(&b));
        }
        if (strcmp(match, "Exact") == 0 && strcmp(rv, "0") == 0)
            forbidden(&fe, "resourceVersionMatch",
                      "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"");
    }
    if (req->send_initial_events)
        forbidden(&fe, "sendInitialEvents", "sendInitialEvents is forbidden for list");
    return invalid(&fe, out);
}

/* ---- the table ---- */

static const char *
nonempty(const char *s)
{
    return s && *s ? s : NULL;
}

/* storage.InvalidError of ParseResourceVersion:
 * `resourceVersion: Invalid value: "<rv>": strconv.ParseUint: parsing "<rv>": <why>` */
static void
rv_error(struct gostr_buf *b, const char *rv, enum numerr e)
{
    gostr_add(b, "resourceVersion: Invalid value: ");
    gostr_quote(b, rv, strlen(rv));
    gostr_add(b, ": ");
    num_error(b, "ParseUint", rv, e);
}

static void
serve_at_least(struct decide_result *out, const struct decide_cache *cache,
               enum decide_too_large policy, uint64_t rv)
{
    out->action = DECIDE_SERVE_AT_LEAST;
    out->rv = rv;
    out->wait = rv > cache->current_rv;
    out->on_timeout = policy == DECIDE_TOO_LARGE_504 ? DECIDE_ERROR : DECIDE_PASS_THROUGH;
}

/* An exact rv the cache may hold: inside [floor, current]. */
static bool
exact_in_window(struct decide_result *out, const struct decide_cache *cache, uint64_t rv)
{
    if (rv < cache->floor_rv) {
        pass(out, DECIDE_WHY_BELOW_FLOOR);
        return false;
    }
    if (rv > cache->current_rv) {
        pass(out, DECIDE_WHY_AHEAD);
        return false;
    }
    out->action = DECIDE_SERVE_EXACT;
    out->rv = rv;
    return true;
}

static void
decide_get(const struct decide_req *req, const struct decide_cache *cache,
           enum decide_too_large policy, struct decide_result *out)
{
    /* cacher.go Get: rv unset -> storage (a quorum read) */
    const char *rv = nonempty(req->resource_version);
    uint64_t n = 0;
    if (!rv) {
        pass(out, DECIDE_WHY_MOST_RECENT);
        return;
    }
    /* kube waits for (or, from 1.31, delegates on) an unready cache before or
     * after parsing the rv depending on the release: let the upstream answer */
    if (!cache->synced) {
        pass(out, DECIDE_WHY_NOT_SYNCED);
        return;
    }
    enum numerr e = parse_uint(rv, &n);
    if (e != NUM_OK) {
        struct gostr_buf b = {0};
        rv_error(&b, rv, e);
        set_error(out, 500, "", gostr_take(&b), NULL);
        return;
    }
    if (n == 0) {
        out->action = DECIDE_SERVE_LATEST;
        return;
    }
    serve_at_least(out, cache, policy, n);
}

/* DecodeParameters: timeoutSeconds, limit, then the selectors. Returns true
 * (a 400 in *out) when one does not decode. */
static bool
decode_query(const struct decide_req *req, struct decide_result *out, int64_t *timeout,
             int64_t *limit)
{
    struct gostr_buf b = {0};
    const char *const vals[2] = {req->timeout_seconds, req->limit};
    int64_t *const dst[2] = {timeout, limit};
    for (int i = 0; i < 2; i++) {
        if (!vals[i])
            continue;
        enum numerr e = parse_int(vals[i], dst[i]);
        if (e != NUM_OK) {
            num_error(&b, "ParseInt", vals[i], e);
            bad_request(out, gostr_take(&b));
            return true;
        }
    }
    if (req->selector_error) {
        bad_request(out, xstrdup(req->selector_error));
        return true;
    }
    return false;
}

static void
decide_list(const struct decide_req *req, const struct decide_cache *cache,
            enum decide_too_large policy, struct decide_result *out)
{
    int64_t limit = 0, timeout = 0;
    enum numerr e;
    struct gostr_buf b = {0};

    /* 1. query decoding */
    if (decode_query(req, out, &timeout, &limit))
        return;

    /* 2. ValidateListOptions */
    if (validate_list(req, out))
        return;

    const char *rv = nonempty(req->resource_version);
    const char *match = nonempty(req->resource_version_match);
    const char *cont = nonempty(req->continue_token);
    /* Most Recent: a quorum read, only the upstream can do it */
    if (!rv && !cont) {
        pass(out, DECIDE_WHY_MOST_RECENT);
        return;
    }
    /* Valid: an unsynced cache has nothing to add, the upstream answers
     * (kube's own unready-cache handling moved around between releases). */
    if (!cache->synced) {
        pass(out, DECIDE_WHY_NOT_SYNCED);
        return;
    }

    /* 3. the storage layer, in shouldDelegateList's terms (etcd: true) */
    if (limit < 0)
        limit = 0; /* only Limit > 0 pages */
    bool etcd = !rv || cont || (limit > 0 && strcmp(rv, "0") != 0) ||
                (match && strcmp(match, "NotOlderThan") != 0);
    uint64_t n = 0;
    if (rv) {
        e = parse_uint(rv, &n);
        if (e != NUM_OK) {
            /* etcd3 GetList wraps it in a 400; the cacher returns the
             * storage.InvalidError as is, which becomes a plain 500 */
            if (etcd)
                gostr_add(&b, "invalid resource version: ");
            rv_error(&b, rv, e);
            set_error(out, etcd ? 400 : 500, etcd ? "BadRequest" : "", gostr_take(&b), NULL);
            return;
        }
    }
    out->limit = limit;
    out->remaining_count = limit > 0 && !req->has_selector;

    if (cont) {
        /* "Continue Token, Exact"; rv "0" is tolerated ("Invalid, treated as
         * Continue Token, Exact"), any other rv is a 400 */
        struct cont_token tok;
        if (cont_decode(cont, strlen(cont), &tok) != 0) {
            /* kube's 400 "invalid continue token: ..." or, for the odd
             * tokens only Go's lenient decoders read, a page */
            pass(out, DECIDE_WHY_TOKEN_UNDECODED);
            return;
        }
        if (rv && strcmp(rv, "0") != 0) {
            cont_token_fini(&tok);
            bad_request(out,
                        xstrdup("specifying resource version is not allowed when using continue"));
            return;
        }
        if (tok.rv < 0) {
            /* etcd reads the latest state from the start key: a quorum read */
            cont_token_fini(&tok);
            pass(out, DECIDE_WHY_TOKEN_LATEST);
            return;
        }
        if (exact_in_window(out, cache, (uint64_t)tok.rv)) {
            out->start_key = tok.start;
            out->start_key_len = tok.start_len;
            tok.start = NULL;
        }
        cont_token_fini(&tok);
        return;
    }

    /* Exact, and the legacy exact of a paged list with rv and no match.
     * A parsed rv of 0 ("00") makes etcd read the latest state. */
    if ((match && strcmp(match, "Exact") == 0) || (!match && limit > 0 && strcmp(rv, "0") != 0)) {
        if (n == 0) {
            pass(out, DECIDE_WHY_MOST_RECENT);
            return;
        }
        exact_in_window(out, cache, n);
        return;
    }
    /* NotOlderThan (explicit, or rv with no limit) */
    if (n == 0) {
        if (etcd) { /* "00" with a limit: etcd, latest state */
            pass(out, DECIDE_WHY_MOST_RECENT);
            return;
        }
        /* Any: the watch cache answers at once and ignores limit
         * (decide_read clears it) */
        out->action = DECIDE_SERVE_LATEST;
        return;
    }
    serve_at_least(out, cache, policy, n);
}

void
decide_read(const struct decide_req *req, const struct decide_cache *cache,
            enum decide_too_large policy, struct decide_result *out)
{
    memset(out, 0, sizeof(*out));
    out->why = DECIDE_WHY_NONE;
    out->reason = "";
    if (req->verb == DECIDE_GET)
        decide_get(req, cache, policy, out);
    else
        decide_list(req, cache, policy, out);
    if (out->action != DECIDE_SERVE_AT_LEAST && out->action != DECIDE_SERVE_EXACT) {
        out->limit = 0;
        out->remaining_count = false;
    }
}

/* validateWatchOptions (the WatchList feature on, as kwc serves it). */
static bool
validate_watch(const struct decide_req *req, struct decide_result *out)
{
    const char *match = req->resource_version_match ? req->resource_version_match : "";
    const char *cont = req->continue_token ? req->continue_token : "";
    struct field_errs fe = {.n = 0};
    bool nto = strcmp(match, "NotOlderThan") == 0;
    if (req->send_initial_events && !nto)
        forbidden(&fe, "resourceVersionMatch",
                  "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan");
    if (*match) {
        if (!req->send_initial_events)
            forbidden(&fe, "resourceVersionMatch",
                      "resourceVersionMatch is forbidden for watch unless sendInitialEvents is "
                      "provided");
        if (!nto) {
            struct gostr_buf b = {0};
            gostr_add(&b, "Unsupported value: ");
            gostr_quote(&b, match, strlen(match));
            gostr_add(&b, ": supported values: \"NotOlderThan\"");
            field_err(&fe, "FieldValueNotSupported", "resourceVersionMatch", gostr_take(&b));
        }
        if (*cont)
            forbidden(&fe, "resourceVersionMatch",
                      "resourceVersionMatch is forbidden when continue is provided");
    }
    return invalid(&fe, out);
}

void
decide_watch(const struct decide_req *req, const struct decide_cache *cache,
             struct decide_result *out)
{
    memset(out, 0, sizeof(*out));
    out->why = DECIDE_WHY_NONE;
    out->reason = "";
    int64_t timeout = 0, limit = 0;
    if (decode_query(req, out, &timeout, &limit) || validate_watch(req, out))
        return;
    if (!cache->synced) {
        pass(out, DECIDE_WHY_NOT_SYNCED);
        return;
    }
    /* cacher.go Watch: ParseResourceVersion's error as is, a plain 500 */
    const char *rv = nonempty(req->resource_version);
    uint64_t n = 0;
    if (rv) {
        enum numerr e = parse_uint(rv, &n);
        if (e != NUM_OK) {
            struct gostr_buf b = {0};
            rv_error(&b, rv, e);
            set_error(out, 500, "", gostr_take(&b), NULL);
            return;
        }
    }
    out->action = DECIDE_SERVE_WATCH;
    out->timeout_seconds = timeout;
    const char *sie = req->send_initial_events;
    if (sie) {
        if (kwc_query_bool(sie, strlen(sie))) {
            out->initial = true;
            out->initial_end = true;
            out->rv = n;
            out->wait = n > cache->current_rv;
        } else {
            out->rv = n ? n : cache->current_rv;
        }
        return;
    }
    if (n == 0) {
        out->initial = true;
    } else {
        out->rv = n;
        /* a resume from an rv the cache has not reached: it waits (the hub) */
        out->wait = n > cache->current_rv;
    }
}

void
decide_timeout(const struct decide_result *d, uint64_t current_rv, struct decide_result *out)
{
    memset(out, 0, sizeof(*out));
    out->reason = "";
    if (d->on_timeout != DECIDE_ERROR) {
        pass(out, DECIDE_WHY_TOO_LARGE);
        return;
    }
    /* storage/errors.go NewTooLargeResourceVersionError(rv, current, 1) */
    static const struct status_cause cause = {.reason = "ResourceVersionTooLarge",
                                              .message = "Too large resource version"};
    struct status_details det = {.causes = &cause, .ncauses = 1, .retry_after_seconds = 1};
    char *msg = xasprintf("Timeout: Too large resource version: %llu, current: %llu",
                          (unsigned long long)d->rv, (unsigned long long)current_rv);
    set_error(out, 504, "Timeout", msg, &det);
    out->rv = d->rv;
    out->retry_after_seconds = 1;
}

void
decide_result_fini(struct decide_result *r)
{
    if (!r)
        return;
    free(r->start_key);
    free(r->message);
    free(r->body);
    r->start_key = r->message = r->body = NULL;
}

const char *
decide_action_name(enum decide_action a)
{
    switch (a) {
#define DECIDE_ACTION_CASE(e, s)                                                                   \
    case e:                                                                                        \
        return s;
        DECIDE_ACTIONS(DECIDE_ACTION_CASE)
#undef DECIDE_ACTION_CASE
    }
    return "?";
}

const char *
decide_why_name(enum decide_why w)
{
    switch (w) {
#define DECIDE_WHY_CASE(e, s)                                                                      \
    case e:                                                                                        \
        return s;
        DECIDE_WHYS(DECIDE_WHY_CASE)
#undef DECIDE_WHY_CASE
    }
    return "?";
}
