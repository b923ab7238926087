/*
 * log_test.c — proxy/ops/log.c, the logger (include/kwc/log.h).
 *
 * The logger writes fd 2 only, so each check puts the write end of a pipe
 * on fd 2 (dup2) around the calls and reads what came out of the read end
 * (non-blocking: a call that wrote nothing reads nothing; every line is far
 * below the pipe's capacity). Stdout (the TAP lines) is never touched.
 * What the header promises:
 *   - text: "TIME LEVEL msg" with TIME as 2026-11-21T06:00:00.123Z (UTC, the
 *     wall clock: between the clock read before and after the call), the
 *     level padded to five characters and a space, one line per call;
 *   - JSON (--logging-format json): one object per line, time, level, msg and the
 *     fields as further keys, strings escaped as JSON needs, bytes that are
 *     not UTF-8 as U+FFFD (read back with jansson, which refuses bad JSON and
 *     bad UTF-8);
 *   - fields: text "msg k=v", values with spaces or quotes quoted, a NULL
 *     string left out, numbers as integers or with three decimals;
 *   - levels: debug < info < warn < error, the default info; below the level
 *     nothing is written, and log_debug does not evaluate its arguments;
 *   - the parsers of --log-level and --logging-format;
 *   - a message too long for one line is cut, still one line (and in JSON
 *     still one valid object);
 *   - repeating lines (log_repeat), with an injected clock: the first
 *     occurrence of a cause at once, the rest counted (and at debug), one
 *     summary per cause per interval with the right counts (text and JSON),
 *     a recovered line after a quiet interval (none for a one-off), a fixed
 *     table with the causes past it in one bucket, flush at exit, interval
 *     0 writing everything.
 */
#include "kwc/log.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tap.h"

/* ---- fd 2 into a pipe ---- */

static int pfd[2] = {-1, -1}, saved = -1;
static char out[1 << 16];
static size_t outlen;

static void
cap_begin(void)
{
    if (pipe2(pfd, O_NONBLOCK) != 0)
        abort();
    fflush(stderr);
    saved = dup(2);
    dup2(pfd[1], 2);
    outlen = 0;
    out[0] = '\0';
}

/* Everything written since cap_begin, NUL-terminated in out. */
static const char *
cap_end(void)
{
    dup2(saved, 2);
    close(saved);
    close(pfd[1]);
    for (;;) {
        ssize_t n = read(pfd[0], out + outlen, sizeof out - 1 - outlen);
        if (n <= 0)
            break;
        outlen += (size_t)n;
    }
    out[outlen] = '\0';
    close(pfd[0]);
    return out;
}

static int
count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* "2026-11-21T06:00:00.123Z": the seconds since the epoch, or -1 when the
 * text is not of that form. */
static long long
parse_stamp(const char *s)
{
    static const char form[] = "dddd-dd-ddTdd:dd:dd.dddZ";
    for (size_t i = 0; i < sizeof form - 1; i++) {
        if (form[i] == 'd' ? (s[i] < '0' || s[i] > '9') : s[i] != form[i])
            return -1;
    }
    struct tm tm = {0};
    if (!strptime(s, "%Y-%m-%dT%H:%M:%S", &tm))
        return -1;
    return (long long)timegm(&tm);
}

/* ---- text ---- */

static void
test_text_line(void)
{
    log_set_format(LOG_TEXT);
    log_set_level(LOG_INFO);
    struct timespec t0, t1;
    clock_gettime(CLOCK_REALTIME, &t0);
    cap_begin();
    log_info("upstream: connected server=%s n=%d", "https://x", 42);
    const char *o = cap_end();
    clock_gettime(CLOCK_REALTIME, &t1);
    is_int(count_lines(o), 1, "one line");
    long long t = parse_stamp(o);
    ok(t >= 0, "starts with a UTC time to the millisecond: 2026-11-21T06:00:00.123Z");
    ok(t >= (long long)t0.tv_sec && t <= (long long)t1.tv_sec, "...the wall clock of the call");
    is_str(o + 24, " info  upstream: connected server=https://x n=42\n",
           "then \" info  \" and the message");

    static const struct {
        enum log_level l;
        const char *text;
    } lv[] = {{LOG_DEBUG, " debug m\n"},
              {LOG_INFO, " info  m\n"},
              {LOG_WARN, " warn  m\n"},
              {LOG_ERROR, " error m\n"}};
    log_set_level(LOG_DEBUG);
    for (size_t i = 0; i < 4; i++) {
        cap_begin();
        log_msg(lv[i].l, "m");
        o = cap_end();
        ok(parse_stamp(o) >= 0, "a time first");
        is_str(o + 24, lv[i].text, "each level's name, padded to five");
    }
    cap_begin();
    log_warnx("a %s", "warning");
    log_error("an %s", "error");
    o = cap_end();
    is_int(count_lines(o), 2, "log_warnx, log_error: a line each");
    ok(strstr(o, " warn  a warning\n") && strstr(o, " error an error\n"),
       "...at warn and error, without strerror");
    log_set_level(LOG_INFO);
}

static void
test_text_fields(void)
{
    log_set_format(LOG_TEXT);
    log_set_level(LOG_INFO);
    struct log_field f[] = {
        LOG_STR("user", "alice"),     LOG_STR("absent", NULL), LOG_NUM("status", 200),
        LOG_NUM("ms", 1.5),           LOG_NUM("neg", -3),      LOG_STR("q", "a \"b\""),
        LOG_STR("sp", "two words"),   LOG_STR("empty", ""),    LOG_STR("eq", "k=v"),
        LOG_STR("nl", "line\nbreak"), LOG_NUM("big", 2.5e15),  LOG_NUM("huge", 1e16),
    };
    cap_begin();
    log_fields(LOG_INFO, "request", f, sizeof f / sizeof f[0]);
    const char *o = cap_end();
    is_int(count_lines(o), 1, "one line, a newline in a value included");
    ok(parse_stamp(o) >= 0, "a time first");
    is_str(o + 24,
           " info  request user=alice status=200 ms=1.500 neg=-3 q=\"a \\\"b\\\"\" "
           "sp=\"two words\" empty=\"\" eq=\"k=v\" nl=\"line\\nbreak\" big=2500000000000000 "
           "huge=10000000000000000.000\n",
           "k=v after the message; quoted when needed; NULL left out; numbers");

    cap_begin();
    log_fields(LOG_DEBUG, "hidden", f, 1);
    o = cap_end();
    is_str(o, "", "log_fields below the level: nothing");
}

/* ---- levels ---- */

static int evaluated;

static const char *
side_effect(void)
{
    evaluated++;
    return "x";
}

static void
test_levels(void)
{
    log_set_format(LOG_TEXT);
    /* the default, before any log_set_level, is tested first in main */
    static const enum log_level all[] = {LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR};
    for (int min = 0; min < 4; min++) {
        log_set_level(all[min]);
        for (int l = 0; l < 4; l++) {
            char what[96];
            snprintf(what, sizeof what, "level %d, a line at %d: %s", min, l,
                     l >= min ? "written" : "not");
            cap_begin();
            log_msg(all[l], "x");
            const char *o = cap_end();
            is_int(count_lines(o), l >= min ? 1 : 0, what);
            is_int(log_enabled(all[l]), l >= min, "log_enabled says the same");
        }
    }
    log_set_level(LOG_INFO);
    evaluated = 0;
    cap_begin();
    log_debug("%s", side_effect());
    const char *o = cap_end();
    is_str(o, "", "log_debug at info: nothing");
    is_int(evaluated, 0, "...its arguments not evaluated");
    log_set_level(LOG_DEBUG);
    cap_begin();
    log_debug("%s", side_effect());
    o = cap_end();
    is_int(evaluated, 1, "log_debug at debug: evaluated once");
    ok(strstr(o, " debug x\n") != NULL, "...and written");
    log_set_level(LOG_INFO);
}

static void
test_parse(void)
{
    static const struct {
        const char *s;
        enum log_level l;
    } names[] = {
        {"debug", LOG_DEBUG}, {"info", LOG_INFO}, {"warn", LOG_WARN}, {"error", LOG_ERROR}};
    for (size_t i = 0; i < 4; i++) {
        enum log_level l = (enum log_level)99;
        is_int(log_level_parse(names[i].s, &l), 0, names[i].s);
        is_int(l, names[i].l, "...that level");
    }
    static const char *const bad[] = {"", "INFO", "warning", "err", "debug ", "fatal"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        enum log_level l = LOG_WARN;
        is_int(log_level_parse(bad[i], &l), -1, "not a level: -1");
        is_int(l, LOG_WARN, "...out untouched");
    }
    enum log_format f = (enum log_format)99;
    is_int(log_format_parse("text", &f), 0, "text");
    is_int(f, LOG_TEXT, "...LOG_TEXT");
    is_int(log_format_parse("json", &f), 0, "json");
    is_int(f, LOG_JSON, "...LOG_JSON");
    f = LOG_JSON;
    is_int(log_format_parse("JSON", &f), -1, "JSON: -1");
    is_int(log_format_parse("", &f), -1, "empty: -1");
    is_int(f, LOG_JSON, "...out untouched");
}

/* ---- JSON ---- */

/* The one JSON object of o (one line), or NULL. */
static json_t *
one_object(const char *o)
{
    size_t n = strlen(o);
    if (n == 0 || o[n - 1] != '\n' || memchr(o, '\n', n - 1))
        return NULL;
    json_error_t err;
    json_t *j = json_loadb(o, n - 1, 0, &err);
    if (!j)
        printf("#   jansson: %s\n", err.text);
    if (j && !json_is_object(j)) {
        json_decref(j);
        return NULL;
    }
    return j;
}

static void
test_json(void)
{
    log_set_format(LOG_JSON);
    log_set_level(LOG_INFO);
    struct timespec t0, t1;
    clock_gettime(CLOCK_REALTIME, &t0);
    cap_begin();
    log_warnx("say \"%s\"\t\\ %c%c\x01\x7f", "hi", '\n', 'x');
    const char *o = cap_end();
    clock_gettime(CLOCK_REALTIME, &t1);
    json_t *j = one_object(o);
    ok(j != NULL, "one line, one JSON object");
    ok(strncmp(o, "{\"time\":\"", 9) == 0, "time first");
    const char *ts = json_string_value(json_object_get(j, "time"));
    long long t = ts ? parse_stamp(ts) : -1;
    ok(ts && strlen(ts) == 24 && t >= 0, "time: 2026-11-21T06:00:00.123Z");
    ok(t >= (long long)t0.tv_sec && t <= (long long)t1.tv_sec, "...the wall clock of the call");
    is_str(json_string_value(json_object_get(j, "level")), "warn", "level");
    is_str(json_string_value(json_object_get(j, "msg")), "say \"hi\"\t\\ \nx\x01\x7f",
           "msg: quotes, backslash, tab, newline and control bytes escaped, read back as sent");
    is_int(json_object_size(j), 3, "nothing else");
    json_decref(j);

    struct log_field f[] = {LOG_STR("user", "bob"), LOG_STR("gone", NULL), LOG_NUM("status", 404),
                            LOG_NUM("ms", 0.25), LOG_STR("sp", "a \"b\"\n")};
    cap_begin();
    log_fields(LOG_ERROR, "done", f, 5);
    o = cap_end();
    j = one_object(o);
    ok(j != NULL, "fields: one JSON object");
    is_str(json_string_value(json_object_get(j, "level")), "error", "level");
    is_str(json_string_value(json_object_get(j, "msg")), "done", "msg");
    is_str(json_string_value(json_object_get(j, "user")), "bob", "a string field");
    ok(json_object_get(j, "gone") == NULL, "a NULL string left out");
    ok(json_is_integer(json_object_get(j, "status")) &&
           json_integer_value(json_object_get(j, "status")) == 404,
       "an integer field: a JSON integer");
    ok(json_is_real(json_object_get(j, "ms")) && json_real_value(json_object_get(j, "ms")) == 0.25,
       "a fraction: a JSON number");
    is_str(json_string_value(json_object_get(j, "sp")), "a \"b\"\n", "a string escaped");
    is_int(json_object_size(j), 7, "time, level, msg and four fields");
    json_decref(j);

    /* UTF-8 kept; bytes that are not UTF-8 become U+FFFD */
    cap_begin();
    log_info("ok \xc3\xa9 \xe2\x82\xac bad \xff \xc3 \xed\xa0\x80 end");
    o = cap_end();
    j = one_object(o);
    ok(j != NULL, "bad UTF-8 in the message: still valid JSON (jansson checks UTF-8)");
    is_str(json_string_value(json_object_get(j, "msg")),
           "ok \xc3\xa9 \xe2\x82\xac bad \xef\xbf\xbd \xef\xbf\xbd "
           "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
           " end",
           "é and € kept; 0xff, a cut sequence, a surrogate: U+FFFD per byte");
    json_decref(j);

    struct log_field bf[] = {LOG_STR("k\"ey", "\xfe")};
    cap_begin();
    log_fields(LOG_INFO, "m", bf, 1);
    o = cap_end();
    j = one_object(o);
    is_str(json_string_value(json_object_get(j, "k\"ey")), "\xef\xbf\xbd",
           "a field's key escaped, its bad byte U+FFFD");
    json_decref(j);

    cap_begin();
    log_debug("hidden");
    o = cap_end();
    is_str(o, "", "below the level: nothing, in JSON too");
    log_set_format(LOG_TEXT);
}

/* ---- long lines ---- */

static void
test_long(void)
{
    static char big[20000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    log_set_level(LOG_INFO);

    log_set_format(LOG_TEXT);
    cap_begin();
    log_info("%s", big);
    const char *o = cap_end();
    is_int(count_lines(o), 1, "text: a 20000-byte message is one line");
    ok(outlen <= 4097 && outlen > 4000, "...cut to the line's bound");
    ok(o[outlen - 1] == '\n', "...ending in a newline");

    struct log_field f[] = {LOG_STR("big", big)};
    cap_begin();
    log_fields(LOG_INFO, "m", f, 1);
    o = cap_end();
    is_int(count_lines(o), 1, "text: a 20000-byte field is one line");
    ok(outlen <= 4097, "...cut to the line's bound");

    log_set_format(LOG_JSON);
    cap_begin();
    log_info("%s", big);
    o = cap_end();
    json_t *j = one_object(o);
    ok(j != NULL, "JSON: a 20000-byte message is one valid object");
    const char *m = json_string_value(json_object_get(j, "msg"));
    ok(m && strlen(m) > 4000 && strlen(m) < 4097 && strspn(m, "a") == strlen(m),
       "...its message cut, not garbled");
    json_decref(j);

    cap_begin();
    log_fields(LOG_WARN, "short", f, 1);
    o = cap_end();
    j = one_object(o);
    ok(j != NULL, "JSON: a 20000-byte field: one valid object");
    is_str(json_string_value(json_object_get(j, "msg")), "short", "...the message kept");
    ok(json_object_get(j, "big") == NULL, "...the fields over the bound left out");
    is_str(json_string_value(json_object_get(j, "level")), "warn", "...at its level");
    json_decref(j);
    log_set_format(LOG_TEXT);
}

static void
test_default_level(void)
{
    ok(!log_enabled(LOG_DEBUG), "debug off by default");
    ok(log_enabled(LOG_INFO), "info on by default");
    cap_begin();
    log_debug("no");
    log_info("yes");
    const char *o = cap_end();
    is_int(count_lines(o), 1, "by default: info written, debug not");
    ok(strstr(o, " info  yes\n") != NULL, "...the info line");
}

/* A message carrying a line break or another control byte (a path, a name
 * or an upstream's text may) stays one line: no text forges a line. */
static void
test_text_one_line(void)
{
    log_set_format(LOG_TEXT);
    log_set_level(LOG_INFO);
    cap_begin();
    log_info("GET %s", "/api\n2026-11-21T06:00:00.000Z error forged\r\x01\x7f\tend");
    const char *o = cap_end();
    is_int(count_lines(o), 1, "text: a message with a line break is one line");
    ok(strstr(o, " info  GET /api\\n2026-11-21T06:00:00.000Z error forged\\r\\x01\\x7f\tend\n") !=
           NULL,
       "...the break written as \\n, CR as \\r, other control bytes as \\xNN, a tab kept");
    cap_begin();
    struct log_field f[] = {LOG_STR("k", "a\rb"), LOG_STR("j", "x\x01y")};
    log_fields(LOG_INFO, "m", f, 2);
    o = cap_end();
    is_int(count_lines(o), 1, "text: field values with CR or a control byte: one line");
    ok(strstr(o, " info  m k=\"a\\rb\" j=\"x\\x01y\"\n") != NULL,
       "...each value quoted (strconv.Quote)");
}

/* ---- repeating lines ---- */

static uint64_t fake_ms;

static uint64_t
fake_clock(void)
{
    return fake_ms;
}

/* Every JSON line of o, as an array. */
static json_t *
objects(const char *o)
{
    json_t *a = json_array();
    for (const char *p = o; *p;) {
        const char *nl = strchr(p, '\n');
        if (!nl)
            break;
        json_t *j = json_loadb(p, (size_t)(nl - p), 0, NULL);
        json_array_append_new(a, j ? j : json_null());
        p = nl + 1;
    }
    return a;
}

static const char *
jstr(json_t *a, size_t i, const char *k)
{
    return json_string_value(json_object_get(json_array_get(a, i), k));
}

static long long
jnum(json_t *a, size_t i, const char *k)
{
    json_t *v = json_object_get(json_array_get(a, i), k);
    return json_is_number(v) ? (long long)json_number_value(v) : -1;
}

static void
rep_reset(void)
{
    log_set_repeat_clock(fake_clock); /* forgets every cause */
    log_set_repeat_interval(10000);
    fake_ms = 1000000;
}

/* An outage: 18 caches, each retrying 3 times within one interval. */
static void
test_repeat_summary(void)
{
    static const char *const cause = "cache watch failed: Connection refused";
    log_set_format(LOG_JSON);
    log_set_level(LOG_INFO);
    rep_reset();
    char names[18][16];
    for (int i = 0; i < 18; i++)
        snprintf(names[i], sizeof names[i], "res%d", i);
    cap_begin();
    log_repeat(LOG_WARN, cause, "caches", names[0], "cache %s: down; retrying in %.1f s", names[0],
               0.5);
    const char *o = cap_end();
    json_t *a = objects(o);
    is_int(json_array_size(a), 1, "the first occurrence: written at once");
    is_str(jstr(a, 0, "level"), "warn", "...at its level");
    is_str(jstr(a, 0, "msg"), "cache res0: down; retrying in 0.5 s", "...its own message");
    is_str(jstr(a, 0, "cause"), cause, "...with its cause");
    json_decref(a);

    cap_begin();
    for (int round = 0; round < 3; round++)
        for (int i = 0; i < 18; i++) {
            fake_ms += 100;
            if (round || i)
                log_repeat(LOG_WARN, cause, "caches", names[i], "cache %s: down", names[i]);
        }
    fake_ms = 1000000 + 9999;
    log_repeat_tick();
    o = cap_end();
    is_str(o, "", "53 more within the interval: nothing written (at info)");

    cap_begin();
    fake_ms = 1000000 + 10000;
    log_repeat_tick();
    o = cap_end();
    a = objects(o);
    is_int(json_array_size(a), 1, "the interval over: one line");
    is_str(jstr(a, 0, "level"), "warn", "...at the cause's level");
    is_str(jstr(a, 0, "cause"), cause, "...its cause");
    is_int(jnum(a, 0, "count"), 53, "...count: the occurrences not written");
    is_int(jnum(a, 0, "subjects"), 18, "...subjects: the distinct ones among them");
    is_int(jnum(a, 0, "interval_s"), 10, "...interval_s");
    is_str(jstr(a, 0, "msg"),
           "cache watch failed: Connection refused: 53 more times in the last 10.0 s, 18 caches "
           "(res1, res2, res3, ...)",
           "...the message says it for people");
    json_decref(a);

    /* the next interval: two more from one cache, then the tick */
    cap_begin();
    fake_ms += 3000;
    log_repeat(LOG_WARN, cause, "caches", "res5", "x");
    fake_ms += 3000;
    log_repeat(LOG_WARN, cause, "caches", "res5", "x");
    fake_ms = 1000000 + 20000;
    log_repeat_tick();
    o = cap_end();
    a = objects(o);
    is_int(json_array_size(a), 1, "the second interval: one line");
    is_int(jnum(a, 0, "count"), 2, "...count 2");
    is_int(jnum(a, 0, "subjects"), 1, "...one subject");
    json_decref(a);

    /* a quiet interval: recovered, with the episode's total */
    cap_begin();
    fake_ms = 1000000 + 29000;
    log_repeat_tick();
    is_str(cap_end(), "", "quiet, not yet a whole interval: nothing");
    cap_begin();
    fake_ms = 1000000 + 30000;
    log_repeat_tick();
    o = cap_end();
    a = objects(o);
    is_int(json_array_size(a), 1, "a whole interval without it: one line");
    is_str(jstr(a, 0, "level"), "info", "...at info");
    is_str(jstr(a, 0, "state"), "recovered", "...state recovered");
    is_int(jnum(a, 0, "total"), 1 + 53 + 2, "...total: every occurrence");
    is_int(jnum(a, 0, "duration_s"), 16, "...duration_s: first to last occurrence");
    is_str(jstr(a, 0, "cause"), cause, "...its cause");
    json_decref(a);

    /* over: the next occurrence is news again */
    cap_begin();
    fake_ms += 60000;
    log_repeat_tick();
    log_repeat(LOG_WARN, cause, "caches", "res1", "back down");
    o = cap_end();
    a = objects(o);
    is_int(json_array_size(a), 1, "after it recovered: the next occurrence written at once");
    is_str(jstr(a, 0, "msg"), "back down", "...its message");
    json_decref(a);
    log_set_format(LOG_TEXT);
}

static void
test_repeat_text_and_debug(void)
{
    log_set_format(LOG_TEXT);
    log_set_level(LOG_DEBUG);
    rep_reset();
    cap_begin();
    log_repeat(LOG_WARN, "list failed: 503", "caches", "pods", "cache pods: 503");
    fake_ms += 1000;
    log_repeat(LOG_WARN, "list failed: 503", "caches", "nodes", "cache nodes: 503");
    fake_ms += 1000;
    log_repeat(LOG_WARN, "list failed: 503", "caches", "pods", "cache pods: 503");
    const char *o = cap_end();
    is_int(count_lines(o), 3, "at debug: every occurrence written, one line each");
    ok(strstr(o, " warn  cache pods: 503 cause=\"list failed: 503\"\n") != NULL,
       "...the first at its level, with its cause");
    ok(strstr(o, " debug cache nodes: 503 cause=\"list failed: 503\"\n") != NULL,
       "...the others at debug");
    cap_begin();
    fake_ms += 8000;
    log_repeat_tick();
    o = cap_end();
    ok(strstr(o, " warn  list failed: 503: 2 more times in the last 10.0 s, 2 caches (nodes, pods) "
                 "cause=\"list failed: 503\" count=2 subjects=2 interval_s=10\n") != NULL,
       "text: the summary's message and its fields");
    is_int(count_lines(o), 1, "...one line");

    /* one-off: written, and no recovered line */
    log_set_level(LOG_INFO);
    rep_reset();
    cap_begin();
    log_repeat(LOG_WARN, "once", "caches", "pods", "just once");
    fake_ms += 10000;
    log_repeat_tick();
    fake_ms += 10000;
    log_repeat_tick();
    o = cap_end();
    is_int(count_lines(o), 1, "a one-off: its line, no summary, no recovered line");

    /* below the level: neither written nor counted */
    log_set_level(LOG_ERROR);
    cap_begin();
    log_repeat(LOG_WARN, "quiet", "caches", "pods", "w");
    log_repeat(LOG_WARN, "quiet", "caches", "pods", "w");
    fake_ms += 10000;
    log_repeat_tick();
    is_str(cap_end(), "", "below the level: nothing, not even a summary");
    log_set_level(LOG_INFO);

    /* interval 0: every occurrence written */
    rep_reset();
    log_set_repeat_interval(0);
    cap_begin();
    for (int i = 0; i < 5; i++)
        log_repeat(LOG_WARN, "c", "caches", "pods", "each");
    o = cap_end();
    is_int(count_lines(o), 5, "interval 0: every occurrence at its level");
    ok(strstr(o, " warn  each cause=c\n") != NULL, "...with its cause");
}

static void
test_repeat_bounds(void)
{
    log_set_format(LOG_JSON);
    log_set_level(LOG_INFO);
    rep_reset();
    char c[64];
    cap_begin();
    for (int i = 0; i < LOG_REPEAT_KEYS; i++) {
        snprintf(c, sizeof c, "cause %d", i);
        log_repeat(LOG_WARN, c, "caches", "pods", "%s", c);
    }
    log_repeat(LOG_WARN, "one more", "caches", "pods", "past the table");
    log_repeat(LOG_WARN, "and another", "caches", "pods", "counted");
    log_repeat(LOG_WARN, "and another", "caches", "nodes", "counted");
    log_repeat(LOG_WARN, "cause 3", "caches", "pods", "a known cause, counted");
    const char *o = cap_end();
    json_t *a = objects(o);
    is_int(json_array_size(a), LOG_REPEAT_KEYS + 1, "a full table: one more cause written at once");
    is_str(jstr(a, LOG_REPEAT_KEYS, "cause"), "other causes", "...under the bucket of others");
    is_str(jstr(a, LOG_REPEAT_KEYS, "msg"), "past the table", "...with its own message");
    json_decref(a);
    cap_begin();
    fake_ms += 10000;
    log_repeat_tick();
    o = cap_end();
    a = objects(o);
    size_t n = json_array_size(a);
    is_int(n, 2, "two summaries: the known cause and the bucket");
    bool seen = false;
    for (size_t i = 0; i < n; i++)
        if (strcmp(jstr(a, i, "cause"), "other causes") == 0) {
            seen = true;
            is_int(jnum(a, i, "count"), 2, "the bucket: 2 more");
            is_int(jnum(a, i, "subjects"), 1, "...its subjects are the causes: 1");
            ok(strstr(jstr(a, i, "msg"), "1 causes (and another)") != NULL, "...named");
        }
    ok(seen, "the bucket's summary");
    json_decref(a);

    /* a long cause is cut; subjects past the bound are "at least" */
    rep_reset();
    static char lc[1000];
    memset(lc, 'c', sizeof lc - 1);
    cap_begin();
    log_repeat(LOG_WARN, lc, "caches", "s", "long");
    for (int i = 0; i < LOG_REPEAT_SUBJECTS + 10; i++) {
        char sub[32];
        snprintf(sub, sizeof sub, "s%d", i);
        log_repeat(LOG_WARN, lc, "caches", sub, "long");
    }
    fake_ms += 10000;
    log_repeat_tick();
    o = cap_end();
    a = objects(o);
    is_int(json_array_size(a), 2, "a long cause: one entry (its first line, one summary)");
    is_int(strlen(jstr(a, 1, "cause")), LOG_REPEAT_KEY_MAX - 1, "...cut to the bound");
    is_int(jnum(a, 1, "count"), LOG_REPEAT_SUBJECTS + 10, "...every occurrence counted");
    is_int(jnum(a, 1, "subjects"), LOG_REPEAT_SUBJECTS, "...subjects counted up to the bound");
    ok(strstr(jstr(a, 1, "msg"), "at least 256 caches") != NULL, "...and it says so");
    json_decref(a);

    /* flush: what was counted is written now */
    rep_reset();
    cap_begin();
    log_repeat(LOG_WARN, "f", "caches", "a", "first");
    fake_ms += 1500;
    log_repeat(LOG_WARN, "f", "caches", "b", "second");
    log_repeat_flush();
    log_repeat_flush();
    o = cap_end();
    a = objects(o);
    is_int(json_array_size(a), 2, "flush: the pending count written once");
    is_int(jnum(a, 1, "count"), 1, "...count 1");
    ok(strstr(jstr(a, 1, "msg"), "in the last 1.5 s") != NULL, "...over the time it covers");
    json_decref(a);
    log_set_repeat_clock(NULL);
    log_set_format(LOG_TEXT);
}

int
main(void)
{
    TAP_RUN(test_default_level); /* first: before any log_set_level */
    TAP_RUN(test_text_line);
    TAP_RUN(test_text_one_line);
    TAP_RUN(test_text_fields);
    TAP_RUN(test_levels);
    TAP_RUN(test_parse);
    TAP_RUN(test_json);
    TAP_RUN(test_long);
    TAP_RUN(test_repeat_summary);
    TAP_RUN(test_repeat_text_and_debug);
    TAP_RUN(test_repeat_bounds);
    return tap_done();
}
