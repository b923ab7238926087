/*
 * tap.h — the unit-test harness (header only, TAP output).
 *
 * Each tests/unit/<module>_test.c defines test functions and calls them from
 * main() through TAP_RUN(); checks print "ok N - what" / "not ok N - what" with
 * the file:line and the values that differed. tap_done() prints the plan and
 * returns the exit code; tests/lib/run-unit.sh adds up every binary's counts.
 * No sockets, no sleeps: time is passed to the code under test.
 */
#ifndef KWC_TAP_H
#define KWC_TAP_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int tap_n, tap_failed;
static const char *tap_group = "";

static inline int
tap_ok(int cond, const char *file, int line, const char *what)
{
    tap_n++;
    if (cond) {
        printf("ok %d - %s%s%s\n", tap_n, tap_group, *tap_group ? ": " : "", what);
    } else {
        tap_failed++;
        printf("not ok %d - %s%s%s\n#   at %s:%d\n", tap_n, tap_group, *tap_group ? ": " : "", what,
               file, line);
    }
    return cond;
}

#define ok(cond, what) tap_ok(!!(cond), __FILE__, __LINE__, (what))

#define is_int(got, want, what)                                                                    \
    do {                                                                                           \
        intmax_t g_ = (intmax_t)(got), w_ = (intmax_t)(want);                                      \
        if (!tap_ok(g_ == w_, __FILE__, __LINE__, (what)))                                         \
            printf("#   got %jd, want %jd\n", g_, w_);                                             \
    } while (0)

#define is_str(got, want, what)                                                                    \
    do {                                                                                           \
        const char *g_ = (got), *w_ = (want);                                                      \
        int same_ = (g_ == NULL && w_ == NULL) || (g_ && w_ && strcmp(g_, w_) == 0);               \
        if (!tap_ok(same_, __FILE__, __LINE__, (what)))                                            \
            printf("#   got  \"%s\"\n#   want \"%s\"\n", g_ ? g_ : "(null)", w_ ? w_ : "(null)");  \
    } while (0)

#define is_mem(got, glen, want, wlen, what)                                                        \
    do {                                                                                           \
        size_t gl_ = (glen), wl_ = (wlen);                                                         \
        int same_ = gl_ == wl_ && memcmp((got), (want), gl_) == 0;                                 \
        if (!tap_ok(same_, __FILE__, __LINE__, (what)))                                            \
            printf("#   got %zu bytes \"%.*s\"\n#   want %zu bytes \"%.*s\"\n", gl_, (int)gl_,     \
                   (const char *)(got), wl_, (int)wl_, (const char *)(want));                      \
    } while (0)

#define TAP_RUN(fn)                                                                                \
    do {                                                                                           \
        tap_group = #fn;                                                                           \
        fn();                                                                                      \
        tap_group = "";                                                                            \
    } while (0)

static inline int
tap_done(void)
{
    printf("1..%d\n", tap_n);
    if (tap_failed)
        printf("# %d of %d failed\n", tap_failed, tap_n);
    return tap_failed ? 1 : 0;
}

#endif
