/*
 * decide_test.c — cache/decide.c: the list/get resourceVersion decision table.
 *
 * One table, one row per request shape: every cell of the table in
 * k8s-api-concepts.md (rv unset / "0" / N x resourceVersionMatch unset /
 * Exact / NotOlderThan x no limit / limit / continue), the invalid
 * combinations, query values that do not parse, the cache's state (not
 * synced, N above its rv, N below its floor), continue tokens, and get.
 * Expected outcomes and Status texts are kube-apiserver's, worked out from
 * its source (endpoints/handlers/get.go ListResource, apimachinery
 * internalversion/validation ValidateListOptions, storage/cacher
 * shouldDelegateList and Get, storage/etcd3 GetList, storage/continue.go,
 * storage/errors.go, Go's strconv) — kube 1.27-1.30, as decide.h documents.
 * Tokens are hand-built (Python's base64.urlsafe_b64encode), JSON beside each.
 */
#include "kwc/decide.h"

#include "kwc/base.h"
#include "kwc/cont.h"
#include "tap.h"

#include <stdlib.h>
#include <string.h>

/* The synced cache every row uses unless it says otherwise. */
#define CUR 100
#define FLOOR 50

/* {"v":"meta.k8s.io/v1","rv":80,"start":"default/pod-a\u0000"} */
#define T80 "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6ODAsInN0YXJ0IjoiZGVmYXVsdC9wb2QtYVx1MDAwMCJ9"
/* {"v":"meta.k8s.io/v1","rv":50,"start":"a\u0000"} */
#define T50 "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NTAsInN0YXJ0IjoiYVx1MDAwMCJ9"
/* {"v":"meta.k8s.io/v1","rv":100,"start":"a\u0000"} */
#define T100 "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTAwLCJzdGFydCI6ImFcdTAwMDAifQ"
/* {"v":"meta.k8s.io/v1","rv":49,"start":"a\u0000"} */
#define T49 "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NDksInN0YXJ0IjoiYVx1MDAwMCJ9"
/* {"v":"meta.k8s.io/v1","rv":101,"start":"a\u0000"} */
#define T101 "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTAxLCJzdGFydCI6ImFcdTAwMDAifQ"
/* {"v":"meta.k8s.io/v1","rv":-1,"start":"b\u0000"}: kube's "inconsistent continue" token */
#define TNEG "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6LTEsInN0YXJ0IjoiYlx1MDAwMCJ9"
/* {"v":"meta.k8s.io/v1","rv":0,"start":"a\u0000"}: kube answers 400 */
#define TRV0 "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MCwic3RhcnQiOiJhXHUwMDAwIn0"

/* CONT_MAX_TOKEN + 1 'A's, filled in by main() */
static char long_token[CONT_MAX_TOKEN + 2];

/* Status texts. */
#define INVALID "ListOptions.meta.k8s.io \"\" is invalid: "
#define F_UNLESS                                                                                   \
    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion "   \
    "is provided"
#define F_CONT                                                                                     \
    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided"
#define F_EXACT0                                                                                   \
    "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for "            \
    "resourceVersion \"0\""
#define F_SIE "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list"
#define RV_WITH_CONT "specifying resource version is not allowed when using continue"
#define RV_INVALID(q, why)                                                                         \
    "resourceVersion: Invalid value: " q ": strconv.ParseUint: parsing " q ": " why
#define STATUS_HEAD                                                                                \
    "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\","
#define LISTOPTS "\"details\":{\"group\":\"meta.k8s.io\",\"kind\":\"ListOptions\",\"causes\":["

enum cache_state { SYNCED, UNSYNCED };

struct row {
    const char *what;
    enum decide_verb verb;
    enum cache_state cache;
    enum decide_too_large policy;
    struct {
        const char *rv, *match, *limit, *cont, *timeout, *sie, *selector_error;
        bool has_selector;
    } q;

    enum decide_action action;
    enum decide_why why;
    uint64_t rv; /* SERVE_AT_LEAST, SERVE_EXACT */
    bool wait;
    enum decide_action on_timeout; /* SERVE_AT_LEAST */
    int64_t limit;
    bool remaining;
    const char *start; /* SERVE_EXACT from a token; start_len bytes */
    size_t start_len;
    int code;
    const char *reason, *message;
    const char *body; /* the whole Status, where the row checks it */
    /* SERVE_AT_LEAST with wait: decide_timeout at CUR gives a pass through
     * (timeout_body NULL) or this 504 */
    bool timeout;
    const char *timeout_body;
};

#define LIST .verb = DECIDE_LIST
#define GET .verb = DECIDE_GET
#define PASS(w) .action = DECIDE_PASS_THROUGH, .why = DECIDE_WHY_##w
#define LATEST .action = DECIDE_SERVE_LATEST
#define AT_LEAST(n) .action = DECIDE_SERVE_AT_LEAST, .rv = (n)
#define EXACT(n) .action = DECIDE_SERVE_EXACT, .rv = (n)
#define ERR(c, r, m) .action = DECIDE_ERROR, .code = (c), .reason = (r), .message = (m)
#define E400(m) ERR(400, "BadRequest", m)
#define E422(m) ERR(422, "Invalid", INVALID m)
#define E500(m) ERR(500, "", m)
#define START(s) .start = (s), .start_len = sizeof(s) - 1
#define TIMEOUT_504(n)                                                                             \
    .timeout = true, .timeout_body = STATUS_HEAD                                                   \
                     "\"message\":\"Timeout: Too large resource version: " #n                      \
                     ", current: 100\",\"reason\":\"Timeout\",\"details\":{\"causes\":"            \
                     "[{\"reason\":\"ResourceVersionTooLarge\",\"message\":\"Too "                 \
                     "large resource version\"}],\"retryAfterSeconds\":1},\"code\":504}"

/* clang-format off */
static const struct row rows[] = {
    /* ---- the table: rv unset ---- */
    {"unset/unset/no limit: Most Recent", LIST, PASS(MOST_RECENT)},
    {"unset/unset/limit: Most Recent", LIST, .q = {.limit = "5"}, PASS(MOST_RECENT)},
    {"unset/unset/continue: token's rv, Exact", LIST, .q = {.cont = T80},
     EXACT(80), START("default/pod-a\0")},
    {"unset/unset/limit+continue: paged from the token", LIST, .q = {.limit = "5", .cont = T80},
     EXACT(80), .limit = 5, .remaining = true, START("default/pod-a\0")},
    {"unset/Exact/no limit: invalid", LIST, .q = {.match = "Exact"}, E422(F_UNLESS),
     .body = STATUS_HEAD "\"message\":\"ListOptions.meta.k8s.io \\\"\\\" is invalid: " F_UNLESS "\","
             "\"reason\":\"Invalid\"," LISTOPTS "{\"reason\":\"FieldValueForbidden\",\"message\":"
             "\"Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided\","
             "\"field\":\"resourceVersionMatch\"}]},\"code\":422}"},
    {"unset/Exact/limit: invalid", LIST, .q = {.match = "Exact", .limit = "5"}, E422(F_UNLESS)},
    {"unset/Exact/continue: invalid twice", LIST, .q = {.match = "Exact", .cont = T80},
     E422("[" F_UNLESS ", " F_CONT "]")},
    {"unset/NotOlderThan/no limit: invalid", LIST, .q = {.match = "NotOlderThan"}, E422(F_UNLESS)},
    {"unset/NotOlderThan/limit: invalid", LIST, .q = {.match = "NotOlderThan", .limit = "5"},
     E422(F_UNLESS)},
    {"unset/NotOlderThan/continue: invalid twice", LIST,
     .q = {.match = "NotOlderThan", .limit = "5", .cont = T80}, E422("[" F_UNLESS ", " F_CONT "]")},

    /* ---- rv "0" ---- */
    {"0/unset/no limit: Any", LIST, .q = {.rv = "0"}, LATEST},
    {"0/unset/limit: Any, limit ignored", LIST, .q = {.rv = "0", .limit = "5"}, LATEST},
    {"0/unset/continue: treated as the token's Exact", LIST, .q = {.rv = "0", .cont = T80},
     EXACT(80), START("default/pod-a\0")},
    {"0/unset/limit+continue: paged from the token", LIST,
     .q = {.rv = "0", .limit = "2", .cont = T80}, EXACT(80), .limit = 2, .remaining = true,
     START("default/pod-a\0")},
    {"0/Exact/no limit: invalid", LIST, .q = {.rv = "0", .match = "Exact"}, E422(F_EXACT0),
     .body = STATUS_HEAD "\"message\":\"ListOptions.meta.k8s.io \\\"\\\" is invalid: "
             "resourceVersionMatch: Forbidden: resourceVersionMatch \\\"exact\\\" is forbidden for "
             "resourceVersion \\\"0\\\"\",\"reason\":\"Invalid\"," LISTOPTS
             "{\"reason\":\"FieldValueForbidden\",\"message\":\"Forbidden: resourceVersionMatch "
             "\\\"exact\\\" is forbidden for resourceVersion \\\"0\\\"\",\"field\":"
             "\"resourceVersionMatch\"}]},\"code\":422}"},
    {"0/Exact/limit: invalid", LIST, .q = {.rv = "0", .match = "Exact", .limit = "5"},
     E422(F_EXACT0)},
    {"0/Exact/continue: invalid twice", LIST, .q = {.rv = "0", .match = "Exact", .cont = T80},
     E422("[" F_CONT ", " F_EXACT0 "]")},
    {"0/NotOlderThan/no limit: Any", LIST, .q = {.rv = "0", .match = "NotOlderThan"}, LATEST},
    {"0/NotOlderThan/limit: Any, limit ignored", LIST,
     .q = {.rv = "0", .match = "NotOlderThan", .limit = "5"}, LATEST},
    {"0/NotOlderThan/continue: invalid", LIST,
     .q = {.rv = "0", .match = "NotOlderThan", .cont = T80}, E422(F_CONT)},

    /* ---- rv N inside the cache's window ---- */
    {"N/unset/no limit: Not older than", LIST, .q = {.rv = "90"}, AT_LEAST(90)},
    {"N/unset/limit: Exact (legacy)", LIST, .q = {.rv = "90", .limit = "5"}, EXACT(90),
     .limit = 5, .remaining = true},
    {"N/unset/continue: 400", LIST, .q = {.rv = "90", .cont = T80}, E400(RV_WITH_CONT),
     .body = STATUS_HEAD "\"message\":\"" RV_WITH_CONT "\",\"reason\":\"BadRequest\",\"code\":400}"},
    {"N/unset/limit+continue: 400", LIST, .q = {.rv = "90", .limit = "5", .cont = T80},
     E400(RV_WITH_CONT)},
    {"N/Exact/no limit: Exact", LIST, .q = {.rv = "90", .match = "Exact"}, EXACT(90)},
    {"N/Exact/limit: Exact, paged", LIST, .q = {.rv = "90", .match = "Exact", .limit = "5"},
     EXACT(90), .limit = 5, .remaining = true},
    {"N/Exact/continue: invalid", LIST, .q = {.rv = "90", .match = "Exact", .cont = T80},
     E422(F_CONT)},
    {"N/NotOlderThan/no limit: Not older than", LIST, .q = {.rv = "90", .match = "NotOlderThan"},
     AT_LEAST(90)},
    {"N/NotOlderThan/limit: Not older than, paged", LIST,
     .q = {.rv = "90", .match = "NotOlderThan", .limit = "5"}, AT_LEAST(90), .limit = 5,
     .remaining = true},
    {"N/NotOlderThan/continue: invalid", LIST,
     .q = {.rv = "90", .match = "NotOlderThan", .limit = "5", .cont = T80}, E422(F_CONT)},

    /* ---- rv N against the window's edges ---- */
    {"Exact at the floor", LIST, .q = {.rv = "50", .match = "Exact"}, EXACT(50)},
    {"Exact at the cache's rv", LIST, .q = {.rv = "100", .match = "Exact"}, EXACT(100)},
    {"Exact below the floor", LIST, .q = {.rv = "49", .match = "Exact"}, PASS(BELOW_FLOOR)},
    {"Exact above the cache's rv", LIST, .q = {.rv = "101", .match = "Exact", .limit = "5"},
     PASS(AHEAD)},
    {"legacy exact below the floor", LIST, .q = {.rv = "40", .limit = "5"}, PASS(BELOW_FLOOR)},
    {"legacy exact above the cache's rv", LIST, .q = {.rv = "150", .limit = "5"}, PASS(AHEAD)},
    {"Not older than a very old rv: the cache is newer", LIST, .q = {.rv = "1"}, AT_LEAST(1)},
    {"Not older than the cache's rv", LIST, .q = {.rv = "100", .match = "NotOlderThan"},
     AT_LEAST(100)},
    {"Not older than N above the cache: wait, then pass", LIST, .q = {.rv = "150"},
     AT_LEAST(150), .wait = true, .timeout = true},
    {"Not older than N above the cache: wait, then 504", LIST, .policy = DECIDE_TOO_LARGE_504,
     .q = {.rv = "150", .match = "NotOlderThan"}, AT_LEAST(150), .wait = true,
     .on_timeout = DECIDE_ERROR, TIMEOUT_504(150)},
    {"Not older than N above the cache, paged: wait", LIST, .policy = DECIDE_TOO_LARGE_504,
     .q = {.rv = "101", .match = "NotOlderThan", .limit = "5"}, AT_LEAST(101), .wait = true,
     .on_timeout = DECIDE_ERROR, .limit = 5, .remaining = true, TIMEOUT_504(101)},

    /* ---- continue tokens ---- */
    {"token at the floor", LIST, .q = {.cont = T50}, EXACT(50), START("a\0")},
    {"token at the cache's rv", LIST, .q = {.cont = T100}, EXACT(100), START("a\0")},
    {"token below the floor", LIST, .q = {.cont = T49}, PASS(BELOW_FLOOR)},
    {"token above the cache's rv", LIST, .q = {.cont = T101}, PASS(AHEAD)},
    {"token for the latest state (rv < 0)", LIST, .q = {.cont = TNEG, .limit = "5"},
     PASS(TOKEN_LATEST)},
    {"token with rv 0", LIST, .q = {.cont = TRV0}, PASS(TOKEN_UNDECODED)},
    {"token not base64", LIST, .q = {.cont = "eyJ2Ijo*"}, PASS(TOKEN_UNDECODED)},
    {"token not JSON", LIST, .q = {.cont = "aGVsbG8"}, PASS(TOKEN_UNDECODED)},
    {"token too long", LIST, .q = {.cont = long_token}, PASS(TOKEN_UNDECODED)},
    /* etcd3 GetList decodes the token before it looks at the rv */
    {"bad token with rv N: the token first", LIST, .q = {.rv = "90", .cont = "aGVsbG8"},
     PASS(TOKEN_UNDECODED)},
    {"token with an rv that does not parse: the rv first", LIST, .q = {.rv = "x", .cont = "aGVsbG8"},
     E400("invalid resource version: " RV_INVALID("\"x\"", "invalid syntax"))},
    {"token with selectors: no remainingItemCount", LIST,
     .q = {.cont = T80, .limit = "5", .has_selector = true}, EXACT(80), .limit = 5,
     START("default/pod-a\0")},

    /* ---- resourceVersion that does not parse: cacher 500, etcd 400 ---- */
    {"bad rv, cacher path: 500", LIST, .q = {.rv = "abc"},
     E500(RV_INVALID("\"abc\"", "invalid syntax")),
     .body = STATUS_HEAD "\"message\":\"resourceVersion: Invalid value: \\\"abc\\\": "
             "strconv.ParseUint: parsing \\\"abc\\\": invalid syntax\",\"code\":500}"},
    {"bad rv, NotOlderThan without limit: 500", LIST, .q = {.rv = "-1", .match = "NotOlderThan"},
     E500(RV_INVALID("\"-1\"", "invalid syntax"))},
    {"rv past uint64: 500", LIST, .q = {.rv = "18446744073709551616"},
     E500(RV_INVALID("\"18446744073709551616\"", "value out of range"))},
    {"bad rv with limit, etcd path: 400", LIST, .q = {.rv = "abc", .limit = "5"},
     E400("invalid resource version: " RV_INVALID("\"abc\"", "invalid syntax"))},
    {"bad rv with Exact, etcd path: 400", LIST, .q = {.rv = "1.5", .match = "Exact"},
     E400("invalid resource version: " RV_INVALID("\"1.5\"", "invalid syntax"))},
    {"bad rv with NotOlderThan and limit, etcd path: 400", LIST,
     .q = {.rv = "a\"b", .match = "NotOlderThan", .limit = "1"},
     E400("invalid resource version: " RV_INVALID("\"a\\\"b\"", "invalid syntax"))},
    {"largest rv parses", LIST, .q = {.rv = "18446744073709551615"},
     AT_LEAST(UINT64_MAX), .wait = true},
    {"rv \"00\" is 0: Any", LIST, .q = {.rv = "00"}, LATEST},
    {"rv \"00\" with limit: etcd at the latest rv", LIST, .q = {.rv = "00", .limit = "5"},
     PASS(MOST_RECENT)},
    {"rv \"00\" Exact: etcd at the latest rv", LIST, .q = {.rv = "00", .match = "Exact"},
     PASS(MOST_RECENT)},

    /* ---- query decoding (400) comes before validation (422) ---- */
    {"limit does not parse", LIST, .q = {.limit = "abc"},
     E400("strconv.ParseInt: parsing \"abc\": invalid syntax"),
     .body = STATUS_HEAD "\"message\":\"strconv.ParseInt: parsing \\\"abc\\\": invalid syntax\","
             "\"reason\":\"BadRequest\",\"code\":400}"},
    {"limit empty", LIST, .q = {.rv = "0", .limit = ""},
     E400("strconv.ParseInt: parsing \"\": invalid syntax")},
    {"limit past int64", LIST, .q = {.limit = "9223372036854775808"},
     E400("strconv.ParseInt: parsing \"9223372036854775808\": value out of range")},
    {"limit, Go's quoting of odd bytes", LIST, .q = {.limit = "\t\x01\xff\xC3\xA9"},
     E400("strconv.ParseInt: parsing \"\\t\\x01\\xff\xC3\xA9\": invalid syntax")},
    {"limit with a sign parses", LIST, .q = {.rv = "90", .limit = "+5"}, EXACT(90), .limit = 5,
     .remaining = true},
    {"negative limit: no paging", LIST, .q = {.rv = "90", .limit = "-5"}, AT_LEAST(90)},
    {"limit 0: no paging", LIST, .q = {.rv = "90", .limit = "0"}, AT_LEAST(90)},
    {"timeoutSeconds does not parse", LIST, .q = {.timeout = "1.5"},
     E400("strconv.ParseInt: parsing \"1.5\": invalid syntax")},
    {"timeoutSeconds before limit", LIST, .q = {.timeout = "x", .limit = "y"},
     E400("strconv.ParseInt: parsing \"x\": invalid syntax")},
    {"timeoutSeconds that parses", LIST, .q = {.rv = "0", .timeout = "-30"}, LATEST},
    {"limit before the selectors", LIST, .q = {.limit = "y", .selector_error = "bad selector"},
     E400("strconv.ParseInt: parsing \"y\": invalid syntax")},
    {"selector before validation", LIST, .q = {.match = "Foo", .selector_error = "bad selector"},
     E400("bad selector")},
    {"decoding before validation", LIST, .q = {.match = "Exact", .limit = "z"},
     E400("strconv.ParseInt: parsing \"z\": invalid syntax")},

    /* ---- other validation ---- */
    {"match not supported", LIST, .q = {.rv = "5", .match = "Foo"},
     E422("resourceVersionMatch: Unsupported value: \"Foo\": supported values: \"Exact\", "
          "\"NotOlderThan\", \"\"")},
    {"sendInitialEvents", LIST, .q = {.rv = "0", .sie = "true"}, E422(F_SIE)},
    {"sendInitialEvents=false is still present", LIST, .q = {.sie = "false"}, E422(F_SIE)},
    {"every validation error at once", LIST, .q = {.match = "bad", .cont = T80, .sie = ""},
     E422("[" F_UNLESS ", " F_CONT ", resourceVersionMatch: Unsupported value: \"bad\": supported "
          "values: \"Exact\", \"NotOlderThan\", \"\", " F_SIE "]"),
     .body = STATUS_HEAD "\"message\":\"ListOptions.meta.k8s.io \\\"\\\" is invalid: [" F_UNLESS
             ", " F_CONT ", resourceVersionMatch: Unsupported value: \\\"bad\\\": supported values: "
             "\\\"Exact\\\", \\\"NotOlderThan\\\", \\\"\\\", " F_SIE "]\",\"reason\":\"Invalid\","
             LISTOPTS
             "{\"reason\":\"FieldValueForbidden\",\"message\":\"Forbidden: resourceVersionMatch is "
             "forbidden unless resourceVersion is provided\",\"field\":\"resourceVersionMatch\"},"
             "{\"reason\":\"FieldValueForbidden\",\"message\":\"Forbidden: resourceVersionMatch is "
             "forbidden when continue is provided\",\"field\":\"resourceVersionMatch\"},"
             "{\"reason\":\"FieldValueNotSupported\",\"message\":\"Unsupported value: \\\"bad\\\": "
             "supported values: \\\"Exact\\\", \\\"NotOlderThan\\\", \\\"\\\"\",\"field\":"
             "\"resourceVersionMatch\"},"
             "{\"reason\":\"FieldValueForbidden\",\"message\":\"Forbidden: sendInitialEvents is "
             "forbidden for list\",\"field\":\"sendInitialEvents\"}]},\"code\":422}"},
    {"empty values count as unset", LIST, .q = {.rv = "", .match = "", .cont = ""},
     PASS(MOST_RECENT)},
    {"selectors: no remainingItemCount", LIST, .q = {.rv = "90", .limit = "5", .has_selector = true},
     EXACT(90), .limit = 5},

    /* ---- cache not synced ---- */
    {"not synced, rv unset: Most Recent all the same", LIST, .cache = UNSYNCED,
     .q = {.limit = "5"}, PASS(MOST_RECENT)},
    {"not synced, rv 0", LIST, .cache = UNSYNCED, .q = {.rv = "0"}, PASS(NOT_SYNCED)},
    {"not synced, rv N", LIST, .cache = UNSYNCED, .q = {.rv = "90"}, PASS(NOT_SYNCED)},
    {"not synced, Exact", LIST, .cache = UNSYNCED, .q = {.rv = "90", .match = "Exact"},
     PASS(NOT_SYNCED)},
    {"not synced, continue", LIST, .cache = UNSYNCED, .q = {.cont = T80}, PASS(NOT_SYNCED)},
    {"not synced, bad rv: the upstream answers", LIST, .cache = UNSYNCED, .q = {.rv = "abc"},
     PASS(NOT_SYNCED)},
    {"not synced, invalid options: 422 all the same", LIST, .cache = UNSYNCED,
     .q = {.match = "Exact"}, E422(F_UNLESS)},

    /* ---- get: no match, limit or continue ---- */
    {"get, rv unset: Most Recent", GET, PASS(MOST_RECENT)},
    {"get, rv unset, not synced", GET, .cache = UNSYNCED, PASS(MOST_RECENT)},
    {"get, rv 0: Any", GET, .q = {.rv = "0"}, LATEST},
    {"get, rv 0, not synced", GET, .cache = UNSYNCED, .q = {.rv = "0"}, PASS(NOT_SYNCED)},
    {"get, rv N: Not older than", GET, .q = {.rv = "90"}, AT_LEAST(90)},
    {"get, rv below the floor: the cache is newer", GET, .q = {.rv = "10"}, AT_LEAST(10)},
    {"get, rv N above the cache: wait, then pass", GET, .q = {.rv = "150"}, AT_LEAST(150),
     .wait = true, .timeout = true},
    {"get, rv N above the cache: wait, then 504", GET, .policy = DECIDE_TOO_LARGE_504,
     .q = {.rv = "200"}, AT_LEAST(200), .wait = true, .on_timeout = DECIDE_ERROR,
     TIMEOUT_504(200)},
    {"get, bad rv: 500", GET, .q = {.rv = "abc"}, E500(RV_INVALID("\"abc\"", "invalid syntax"))},
    {"get ignores list parameters", GET,
     .q = {.rv = "0", .match = "Foo", .limit = "x", .cont = "junk", .timeout = "y", .sie = "1"},
     LATEST},
};
/* clang-format on */

static void
check_row(const struct row *r)
{
    static const struct decide_cache synced = {
        .synced = true, .current_rv = CUR, .floor_rv = FLOOR};
    static const struct decide_cache unsynced = {.synced = false};
    struct decide_req req = {
        .verb = r->verb,
        .resource_version = r->q.rv,
        .resource_version_match = r->q.match,
        .limit = r->q.limit,
        .continue_token = r->q.cont,
        .timeout_seconds = r->q.timeout,
        .send_initial_events = r->q.sie,
        .has_selector = r->q.has_selector,
        .selector_error = r->q.selector_error,
    };
    struct decide_result d;
    decide_read(&req, r->cache == SYNCED ? &synced : &unsynced, r->policy, &d);

    tap_group = r->what;
    is_str(decide_action_name(d.action), decide_action_name(r->action), "action");
    is_str(decide_why_name(d.why), decide_why_name(r->why), "why");
    is_int(d.limit, r->limit, "limit");
    is_int(d.remaining_count, r->remaining, "remainingItemCount");
    if (r->start)
        ok(d.start_key && d.start_key[d.start_key_len] == '\0', "start key, NUL-terminated");
    if (r->start && d.start_key)
        is_mem(d.start_key, d.start_key_len, r->start, r->start_len, "start key");
    else if (!r->start)
        ok(d.start_key == NULL, "no start key");
    if (r->action == DECIDE_SERVE_AT_LEAST || r->action == DECIDE_SERVE_EXACT)
        is_int(d.rv, r->rv, "rv");
    if (r->action == DECIDE_SERVE_AT_LEAST) {
        is_int(d.wait, r->wait, "wait");
        is_str(decide_action_name(d.on_timeout), decide_action_name(r->on_timeout), "on timeout");
    }
    if (r->action == DECIDE_ERROR) {
        is_int(d.code, r->code, "code");
        is_str(d.reason, r->reason, "reason");
        is_str(d.message, r->message, "message");
        if (r->body)
            is_str(d.body, r->body, "Status body");
        else
            ok(d.body != NULL, "a Status body");
        is_int(d.retry_after_seconds, 0, "no Retry-After");
    } else {
        ok(d.message == NULL && d.body == NULL, "no Status");
    }

    if (r->timeout) {
        struct decide_result t;
        decide_timeout(&d, CUR, &t);
        if (r->timeout_body) {
            is_str(decide_action_name(t.action), "error", "after the wait: error");
            is_int(t.code, 504, "504");
            is_str(t.reason, "Timeout", "reason Timeout");
            is_str(t.body, r->timeout_body, "Too large resource version Status");
            is_int(t.retry_after_seconds, 1, "Retry-After: 1");
        } else {
            is_str(decide_action_name(t.action), "pass_through", "after the wait: pass through");
            is_str(decide_why_name(t.why), "too_large_rv", "why");
            ok(t.body == NULL, "no Status");
        }
        decide_result_fini(&t);
    }
    decide_result_fini(&d);
    decide_result_fini(NULL);
    tap_group = "";
}

static void
test_decide_table(void)
{
    memset(long_token, 'A', CONT_MAX_TOKEN + 1);
    for (size_t i = 0; i < KWC_ARRAY_LEN(rows); i++)
        check_row(&rows[i]);
}

int
main(void)
{
    TAP_RUN(test_decide_table);
    return tap_done();
}
