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
 *     still one valid object).
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
    return tap_done();
}
