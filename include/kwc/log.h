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

#define log_debug(...) (log_enabled(LOG_DEBUG) ? log_msg(LOG_DEBUG, __VA_ARGS__) : (void)0)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_warnx(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)

#endif
