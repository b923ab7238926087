/*
 * log.h — structured one-line logs on stderr, as text:
 *   2026-11-21T06:00:00.123Z info  upstream: connected server=https://...
 * or as JSON lines (--logging-format json), one object per line:
 *   {"time":"2026-11-21T06:00:00.123Z","level":"info","msg":"upstream: ..."}
 * with a line's fields (log_fields) as further keys. In JSON, strings are
 * escaped as JSON needs and bytes that are not UTF-8 become U+FFFD; in text,
 * the message's line breaks and other control bytes are written as \n, \r,
 * \xNN. A text line is cut at 4 KiB; a JSON line keeps 4 KiB of message and
 * drops its fields past 8 KiB.
 * Log once, where the decision is made, with the context that explains it.
 * log_warnx is named after OpenBSD's (which does not append strerror(errno));
 * there is no log_warn that would: a message names its errno itself.
 */
#ifndef KWC_LOG_H
#define KWC_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };

enum log_format { LOG_TEXT, LOG_JSON };

/* Parse "text|json". Returns 0 or -1. */
int log_format_parse(const char *s, enum log_format *out);
void log_set_format(enum log_format f);

/* One key and value of a log line: a string (NULL: left out) or a number. */
struct log_field {
    const char *key;
    const char *str;
    double num;
    bool is_num;
};
#define LOG_STR(k, v) ((struct log_field){.key = (k), .str = (v)})
#define LOG_NUM(k, v) ((struct log_field){.key = (k), .num = (double)(v), .is_num = true})

/* A line with fields: text "msg k=v k=v" (a value that is empty or holds a
 * space, a control byte, quote, = or \ is quoted as strconv.Quote does),
 * JSON {"time","level","msg",k:v...}. */
void log_fields(enum log_level l, const char *msg, const struct log_field *f, size_t n);

/* Parse "debug|info|warn|error". Returns 0 or -1. */
int log_level_parse(const char *s, enum log_level *out);
void log_set_level(enum log_level l);
bool log_enabled(enum log_level l);

void log_msg(enum log_level l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * Repeating lines: what recurs while one cause lasts (an upstream away: each
 * cache's every retry, each passthrough's failure) goes through log_repeat,
 * keyed by its cause: a text that is the same for every occurrence and every
 * subject ("cache watch failed: Connection refused": no cache, address or
 * time in it). subject names what it happened to ("pods"), noun what the
 * subjects are, in the plural ("caches").
 *   - An occurrence of a cause not active now is written at once at level l
 *     (the message, with the field cause): an outage shows at once.
 *   - Later occurrences are counted, and written at debug level only.
 *   - Once per interval (log_set_repeat_interval) a cause that recurred in
 *     it gets one line at level l: "CAUSE: 41 more times in the last 10.0 s,
 *     18 caches (pods, nodes, services, ...)", fields cause, count (the
 *     occurrences not written), subjects (distinct subjects among them;
 *     LOG_REPEAT_SUBJECTS at most) and interval_s.
 *   - An interval without it ends the cause: if it occurred more than once,
 *     "CAUSE: recovered: not seen for 10.0 s; 93 times in 35.2 s" at info,
 *     fields cause, total, duration_s (first to last occurrence), and
 *     state=recovered. A one-off line is just written.
 * Bounded memory: LOG_REPEAT_KEYS causes at once, each cut at
 * LOG_REPEAT_KEY_MAX - 1 bytes; a cause past them counts under one bucket
 * whose cause is "other causes" and whose subjects are the causes. A
 * level below log_set_level's is neither written nor counted. Any thread.
 */
#define LOG_REPEAT_KEYS 32
#define LOG_REPEAT_KEY_MAX 160
#define LOG_REPEAT_SUBJECTS 256
void log_repeat(enum log_level l, const char *cause, const char *noun, const char *subject,
                const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Write the summaries and recoveries that are due. The main loop calls it
 * a few times a second; log_repeat calls it too. */
void log_repeat_tick(void);
/* Write every count not written yet, as if each interval ended now (at
 * exit: nothing counted is lost). */
void log_repeat_flush(void);
/* The interval in milliseconds (--log-summary-interval, default 10000); 0:
 * every occurrence is written at its level (with its cause field). Set it
 * before the first log_repeat. */
void log_set_repeat_interval(uint64_t ms);
/* Tests: the clock log_repeat reads (milliseconds, monotonic); NULL: the
 * real one (CLOCK_MONOTONIC). Forgets every cause. */
void log_set_repeat_clock(uint64_t (*now_ms)(void));

#define log_debug(...) (log_enabled(LOG_DEBUG) ? log_msg(LOG_DEBUG, __VA_ARGS__) : (void)0)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_warnx(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)

#endif
