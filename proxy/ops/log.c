/*
 * log.c — the logger: one write(2) per line so lines from several threads
 * never interleave.
 */
#include "kwc/log.h"

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

void
log_msg(enum log_level l, const char *fmt, ...)
{
    if (l < min_level)
        return;
    char msg[LINE_MAX_BYTES];
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    if ((size_t)m >= sizeof(msg))
        m = (int)sizeof(msg) - 1;
    line(l, msg, (size_t)m, NULL, 0);
}
