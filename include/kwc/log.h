/*
 * log.h — structured one-line logs on stderr:
 *   2026-11-21T06:00:00.123Z info  upstream: connected server=https://...
 * Log once, where the decision is made, with the context that explains it.
 * log_warn* append strerror(errno) like OpenBSD's log_warn; log_warnx does not.
 */
#ifndef KWC_LOG_H
#define KWC_LOG_H

#include <stdbool.h>

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };

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
