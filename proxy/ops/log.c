/*
 * log.c — the logger: one write(2) per line so lines from several threads
 * never interleave; and the keyed limiter of repeating lines (log_repeat,
 * log.h), a fixed table of causes under one mutex.
 */
#include "kwc/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kwc/gostr.h"

static enum log_level min_level = LOG_INFO;
static enum log_format format = LOG_TEXT;
static const char *const names[] = {"debug", "info", "warn", "error"};
#define LINE_MAX_BYTES 4096

int
log_format_parse(const char *s, enum log_format *out)
{
    if (strcmp(s, "text") == 0)
        *out = LOG_TEXT;
    else if (strcmp(s, "json") == 0)
        *out = LOG_JSON;
    else
        return -1;
    return 0;
}

void
log_set_format(enum log_format f)
{
    format = f;
}

/* A JSON string of n bytes of s: escapes, U+FFFD for bytes that are not UTF-8. */
static void
json_str(struct gostr_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    gostr_addc(b, '"');
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80) {
            size_t w;
            uint32_t r = gostr_decode_rune((const unsigned char *)s + i, n - i, &w);
            if (r == GOSTR_RUNE_ERROR && w == 1)
                gostr_add(b, "\\ufffd");
            else
                gostr_addn(b, s + i, w);
            i += w;
            continue;
        }
        if (c == '"' || c == '\\') {
            gostr_addc(b, '\\');
            gostr_addc(b, (char)c);
        } else if (c == '\n') {
            gostr_add(b, "\\n");
        } else if (c == '\t') {
            gostr_add(b, "\\t");
        } else if (c < 0x20 || c == 0x7f) {
            char u[7] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15], 0};
            gostr_add(b, u);
        } else {
            gostr_addc(b, (char)c);
        }
        i++;
    }
    gostr_addc(b, '"');
}

/* n bytes of a text line's message, kept on one line: a line break or
 * another control byte (a path, a name or an upstream's text may carry one)
 * is written as \n, \r or \xNN, so that one call is one line and no text
 * can forge a line of its own. */
static void
text_msg(struct gostr_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') {
            gostr_add(b, "\\n");
        } else if (c == '\r') {
            gostr_add(b, "\\r");
        } else if ((c < 0x20 && c != '\t') || c == 0x7f) {
            char x[5] = {'\\', 'x', hex[c >> 4], hex[c & 15], 0};
            gostr_add(b, x);
        } else {
            gostr_addc(b, (char)c);
        }
    }
}

/* A text field's value is quoted when it holds a space, '"', '=', '\\' or
 * any control byte: unquoted, it could end the line or forge a field. */
static bool
needs_quote(const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c <= ' ' || c == '"' || c == '=' || c == '\\' || c == 0x7f)
            return true;
    }
    return false;
}

static void
stamp(char *out, size_t len)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(out, len, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, len - n, ".%03ldZ", ts.tv_nsec / 1000000);
}

static void
num_text(struct gostr_buf *b, double v)
{
    char t[64];
    if (v == (double)(long long)v && v < 9e15 && v > -9e15)
        snprintf(t, sizeof(t), "%lld", (long long)v);
    else
        snprintf(t, sizeof(t), "%.3f", v);
    gostr_add(b, t);
}

static void
line(enum log_level l, const char *msg, size_t msg_len, const struct log_field *f, size_t n)
{
    char ts[40];
    stamp(ts, sizeof(ts));
    struct gostr_buf b = {0};
    if (format == LOG_JSON) {
        gostr_add(&b, "{\"time\":\"");
        gostr_add(&b, ts);
        gostr_add(&b, "\",\"level\":\"");
        gostr_add(&b, names[l]);
        gostr_add(&b, "\",\"msg\":");
        json_str(&b, msg, msg_len > LINE_MAX_BYTES ? LINE_MAX_BYTES : msg_len);
        for (size_t i = 0; i < n; i++) {
            if (!f[i].is_num && !f[i].str)
                continue;
            gostr_addc(&b, ',');
            json_str(&b, f[i].key, strlen(f[i].key));
            gostr_addc(&b, ':');
            if (f[i].is_num)
                num_text(&b, f[i].num);
            else
                json_str(&b, f[i].str, strlen(f[i].str));
        }
        gostr_addc(&b, '}');
        if (b.len > LINE_MAX_BYTES * 2) {
            /* fields over the bound: keep the message alone */
            free(gostr_take(&b));
            line(l, msg, msg_len > LINE_MAX_BYTES ? LINE_MAX_BYTES : msg_len, NULL, 0);
            return;
        }
        gostr_addc(&b, '\n');
        ssize_t w = write(STDERR_FILENO, b.p, b.len);
        (void)w;
        free(gostr_take(&b));
        return;
    }
    gostr_add(&b, ts);
    gostr_addc(&b, ' ');
    char lv[8];
    snprintf(lv, sizeof(lv), "%-5s ", names[l]);
    gostr_add(&b, lv);
    text_msg(&b, msg, msg_len);
    for (size_t i = 0; i < n; i++) {
        if (!f[i].is_num && !f[i].str)
            continue;
        gostr_addc(&b, ' ');
        gostr_add(&b, f[i].key);
        gostr_addc(&b, '=');
        if (f[i].is_num) {
            num_text(&b, f[i].num);
        } else if (!f[i].str[0] || needs_quote(f[i].str)) {
            gostr_quote(&b, f[i].str, strlen(f[i].str));
        } else {
            gostr_add(&b, f[i].str);
        }
    }
    if (b.len > LINE_MAX_BYTES)
        b.len = LINE_MAX_BYTES;
    gostr_addc(&b, '\n');
    ssize_t w = write(STDERR_FILENO, b.p, b.len);
    (void)w;
    free(gostr_take(&b));
}

void
log_fields(enum log_level l, const char *msg, const struct log_field *f, size_t n)
{
    if (l < min_level)
        return;
    line(l, msg, strlen(msg), f, n);
}

int
log_level_parse(const char *s, enum log_level *out)
{
    for (int i = 0; i < 4; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = (enum log_level)i;
            return 0;
        }
    }
    return -1;
}

void
log_set_level(enum log_level l)
{
    min_level = l;
}

bool
log_enabled(enum log_level l)
{
    return l >= min_level;
}

/* fmt into msg, cut to fit; its length */
static size_t vformat(char *msg, size_t cap, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

static size_t
vformat(char *msg, size_t cap, const char *fmt, va_list ap)
{
    int m = vsnprintf(msg, cap, fmt, ap);
    if (m < 0)
        return 0;
    return (size_t)m >= cap ? cap - 1 : (size_t)m;
}

void
log_msg(enum log_level l, const char *fmt, ...)
{
    if (l < min_level)
        return;
    char msg[LINE_MAX_BYTES];
    va_list ap;
    va_start(ap, fmt);
    int m = (int)vformat(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    line(l, msg, (size_t)m, NULL, 0);
}

/* ---- repeating lines ---- */

#define NAMES_KEPT 3 /* subjects named in a summary */
#define NAME_MAX_BYTES 48
#define NOUN_MAX_BYTES 24
#define OTHER_CAUSES "other causes"

/* One cause while it lasts: the episode (first to last occurrence, total)
 * and the interval being counted (since window_ms: count not written,
 * distinct subjects by hash, the first few by name). */
struct rep {
    bool used;
    enum log_level level;
    char cause[LOG_REPEAT_KEY_MAX];
    char noun[NOUN_MAX_BYTES];
    uint64_t first_ms, last_ms, window_ms;
    uint64_t total, count;
    unsigned nsubj;
    uint64_t subj[LOG_REPEAT_SUBJECTS];
    char names[NAMES_KEPT][NAME_MAX_BYTES];
};

/* LOG_REPEAT_KEYS causes and the bucket of the others, last */
static struct rep reps[LOG_REPEAT_KEYS + 1];
static pthread_mutex_t rep_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t rep_interval_ms = 10000;
static uint64_t (*rep_clock)(void);

static uint64_t
rep_now(void)
{
    if (rep_clock)
        return rep_clock();
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

void
log_set_repeat_interval(uint64_t ms)
{
    pthread_mutex_lock(&rep_mu);
    rep_interval_ms = ms;
    pthread_mutex_unlock(&rep_mu);
}

void
log_set_repeat_clock(uint64_t (*now_ms)(void))
{
    pthread_mutex_lock(&rep_mu);
    rep_clock = now_ms;
    memset(reps, 0, sizeof(reps));
    pthread_mutex_unlock(&rep_mu);
}

/* FNV-1a: subjects are told apart by their hash (a collision undercounts
 * by one, in a line for people) */
static uint64_t
hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static void
copy_cut(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src);
}

static void
add_subject(struct rep *e, const char *subject)
{
    uint64_t h = hash_str(subject);
    for (unsigned i = 0; i < e->nsubj; i++)
        if (e->subj[i] == h)
            return;
    if (e->nsubj == LOG_REPEAT_SUBJECTS)
        return;
    if (e->nsubj < NAMES_KEPT)
        copy_cut(e->names[e->nsubj], sizeof(e->names[0]), subject);
    e->subj[e->nsubj++] = h;
}

static double
secs(uint64_t ms)
{
    return (double)ms / 1000.0;
}

/* The interval's line: what was counted and not written. */
static void
write_summary(struct rep *e, uint64_t now)
{
    char who[NAMES_KEPT * (NAME_MAX_BYTES + 2) + 8] = "";
    for (unsigned i = 0; i < e->nsubj && i < NAMES_KEPT; i++) {
        size_t n = strlen(who);
        snprintf(who + n, sizeof(who) - n, "%s%s", i ? ", " : "", e->names[i]);
    }
    if (e->nsubj > NAMES_KEPT) {
        size_t n = strlen(who);
        snprintf(who + n, sizeof(who) - n, ", ...");
    }
    double span = secs(now - e->window_ms);
    char msg[LINE_MAX_BYTES];
    snprintf(msg, sizeof(msg), "%s: %llu more time%s in the last %.1f s, %s%u %s (%s)", e->cause,
             (unsigned long long)e->count, e->count == 1 ? "" : "s", span,
             e->nsubj == LOG_REPEAT_SUBJECTS ? "at least " : "", e->nsubj, e->noun, who);
    struct log_field f[] = {LOG_STR("cause", e->cause), LOG_NUM("count", e->count),
                            LOG_NUM("subjects", e->nsubj), LOG_NUM("interval_s", span)};
    line(e->level, msg, strlen(msg), f, sizeof(f) / sizeof(f[0]));
    e->count = 0;
    e->nsubj = 0;
    e->window_ms = now;
}

static void
write_recovered(struct rep *e, uint64_t now)
{
    char msg[LINE_MAX_BYTES];
    double took = secs(e->last_ms - e->first_ms);
    snprintf(msg, sizeof(msg), "%s: recovered: not seen for %.1f s; %llu times in %.1f s", e->cause,
             secs(now - e->last_ms), (unsigned long long)e->total, took);
    struct log_field f[] = {LOG_STR("cause", e->cause), LOG_STR("state", "recovered"),
                            LOG_NUM("total", e->total), LOG_NUM("duration_s", took)};
    if (LOG_INFO >= min_level)
        line(LOG_INFO, msg, strlen(msg), f, sizeof(f) / sizeof(f[0]));
}

/* What is due at now; all: every interval ends now (log_repeat_flush). */
static void
rep_due(uint64_t now, bool all)
{
    for (size_t i = 0; i < sizeof(reps) / sizeof(reps[0]); i++) {
        struct rep *e = &reps[i];
        if (!e->used || (!all && now - e->window_ms < rep_interval_ms))
            continue;
        if (e->count) {
            write_summary(e, now);
        } else if (!all) {
            if (e->total > 1)
                write_recovered(e, now);
            e->used = false;
        }
    }
}

void
log_repeat_tick(void)
{
    pthread_mutex_lock(&rep_mu);
    rep_due(rep_now(), false);
    pthread_mutex_unlock(&rep_mu);
}

void
log_repeat_flush(void)
{
    pthread_mutex_lock(&rep_mu);
    rep_due(rep_now(), true);
    pthread_mutex_unlock(&rep_mu);
}

/* The cause's entry: the one it has, a free one, or the bucket of others. */
static struct rep *
rep_find(const char *cause, bool *other)
{
    struct rep *free_e = NULL;
    *other = false;
    for (size_t i = 0; i < LOG_REPEAT_KEYS; i++) {
        if (!reps[i].used) {
            if (!free_e)
                free_e = &reps[i];
        } else if (strncmp(reps[i].cause, cause, LOG_REPEAT_KEY_MAX - 1) == 0) {
            return &reps[i];
        }
    }
    if (free_e)
        return free_e;
    *other = true;
    return &reps[LOG_REPEAT_KEYS];
}

void
log_repeat(enum log_level l, const char *cause, const char *noun, const char *subject,
           const char *fmt, ...)
{
    if (l < min_level)
        return;
    char msg[LINE_MAX_BYTES];
    va_list ap;
    va_start(ap, fmt);
    int m = (int)vformat(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&rep_mu);
    uint64_t now = rep_now();
    struct log_field f[] = {LOG_STR("cause", cause)};
    if (!rep_interval_ms) {
        line(l, msg, (size_t)m, f, 1);
        pthread_mutex_unlock(&rep_mu);
        return;
    }
    rep_due(now, false);
    bool other;
    struct rep *e = rep_find(cause, &other);
    if (other) {
        /* the bucket's subjects are the causes */
        subject = cause;
        noun = "causes";
        cause = OTHER_CAUSES;
    }
    if (!e->used) {
        memset(e, 0, sizeof(*e));
        e->used = true;
        e->level = l;
        copy_cut(e->cause, sizeof(e->cause), cause);
        copy_cut(e->noun, sizeof(e->noun), noun);
        e->first_ms = e->last_ms = e->window_ms = now;
        e->total = 1;
        f[0].str = e->cause;
        line(l, msg, (size_t)m, f, 1);
        pthread_mutex_unlock(&rep_mu);
        return;
    }
    e->total++;
    e->count++;
    e->last_ms = now;
    add_subject(e, subject);
    if (LOG_DEBUG >= min_level) {
        f[0].str = e->cause;
        line(LOG_DEBUG, msg, (size_t)m, f, 1);
    }
    pthread_mutex_unlock(&rep_mu);
}
