/*
 * gostr.h — building strings the way kube-apiserver's Go code formats them:
 * a growing string buffer, Go's utf8.DecodeRune and strconv.Quote (fmt's %q),
 * which kube's error messages use to quote client input. Pure.
 */
#ifndef KWC_GOSTR_H
#define KWC_GOSTR_H

#include <stddef.h>
#include <stdint.h>

/* A growing NUL-terminated string; zero-initialise, take with gostr_take. */
struct gostr_buf {
    char *p;
    size_t len, cap;
};

void gostr_addn(struct gostr_buf *b, const char *s, size_t n);
void gostr_add(struct gostr_buf *b, const char *s);
void gostr_addc(struct gostr_buf *b, char c);
void gostr_addu(struct gostr_buf *b, uint64_t v);
/* The string (new, never NULL); b is empty again. */
char *gostr_take(struct gostr_buf *b);

#define GOSTR_RUNE_ERROR 0xFFFDu
/* utf8.DecodeRune: the code point at s and its width; a byte that starts no
 * valid sequence is (U+FFFD, 1). left > 0. */
uint32_t gostr_decode_rune(const unsigned char *s, size_t left, size_t *width);
/* Append strconv.Quote of n bytes of s. */
void gostr_quote(struct gostr_buf *b, const char *s, size_t n);

#endif
