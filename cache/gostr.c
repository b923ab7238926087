/*
 * gostr.c — see gostr.h. strconv.Quote: printable runes as they are, \" and
 * \\, the C escapes, \xNN for other bytes below 0x20 and for invalid UTF-8,
 * \uNNNN / \UNNNNNNNN for other unprintable runes.
 */
#include "kwc/gostr.h"

#include <stdbool.h>
#include <string.h>

#include "kwc/base.h"

void
gostr_addn(struct gostr_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 128;
        while (c < b->len + n + 1)
            c *= 2;
        b->p = xrealloc(b->p, c);
        b->cap = c;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void
gostr_add(struct gostr_buf *b, const char *s)
{
    gostr_addn(b, s, strlen(s));
}

void
gostr_addc(struct gostr_buf *b, char c)
{
    gostr_addn(b, &c, 1);
}

void
gostr_addu(struct gostr_buf *b, uint64_t v)
{
    char tmp[24];
    size_t i = sizeof tmp;
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    gostr_addn(b, tmp + i, sizeof tmp - i);
}

char *
gostr_take(struct gostr_buf *b)
{
    char *p = b->p ? b->p : xstrdup("");
    b->p = NULL;
    b->len = b->cap = 0;
    return p;
}

uint32_t
gostr_decode_rune(const unsigned char *s, size_t left, size_t *width)
{
    size_t n = kwc_utf8_seq(s, left);
    *width = n ? n : 1;
    if (n == 0)
        return GOSTR_RUNE_ERROR;
    if (n == 1)
        return s[0];
    uint32_t r = s[0] & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
    for (size_t i = 1; i < n; i++)
        r = r << 6 | (s[i] & 0x3F);
    return r;
}

/*
 * strconv.IsPrint: exact below U+0100; above, the format, separator,
 * private-use and surrogate blocks and noncharacters (Unicode 15 ranges).
 * Unassigned code points count as printable, which only changes how an error
 * message quotes input nobody could have meant.
 */
static bool
is_print(uint32_t r)
{
    static const uint32_t not_print[][2] = {
        {0x0600, 0x0605},   {0x061C, 0x061C},   {0x06DD, 0x06DD},   {0x070F, 0x070F},
        {0x0890, 0x0891},   {0x08E2, 0x08E2},   {0x1680, 0x1680},   {0x180E, 0x180E},
        {0x2000, 0x200F},   {0x2028, 0x202F},   {0x205F, 0x206F},   {0x3000, 0x3000},
        {0xD800, 0xF8FF},   {0xFDD0, 0xFDEF},   {0xFEFF, 0xFEFF},   {0xFFF9, 0xFFFB},
        {0x110BD, 0x110BD}, {0x110CD, 0x110CD}, {0x13430, 0x1343F}, {0x1BCA0, 0x1BCA3},
        {0x1D173, 0x1D17A}, {0xE0001, 0xE0001}, {0xE0020, 0xE007F}, {0xF0000, 0x10FFFF},
    };
    if (r < 0x80)
        return r >= 0x20 && r < 0x7F;
    if (r <= 0xFF)
        return r >= 0xA1 && r != 0xAD;
    if ((r & 0xFFFE) == 0xFFFE)
        return false;
    for (size_t i = 0; i < KWC_ARRAY_LEN(not_print); i++)
        if (r >= not_print[i][0] && r <= not_print[i][1])
            return false;
    return true;
}

static void
add_hex(struct gostr_buf *b, const char *prefix, uint32_t v, int digits)
{
    static const char hex[] = "0123456789abcdef";
    gostr_add(b, prefix);
    for (int s = (digits - 1) * 4; s >= 0; s -= 4)
        gostr_addc(b, hex[(v >> s) & 0xF]);
}

void
gostr_quote(struct gostr_buf *b, const char *s, size_t n)
{
    static const char cesc[] = "\a\b\f\n\r\t\v", cname[] = "abfnrtv";
    gostr_addc(b, '"');
    for (size_t i = 0; i < n;) {
        size_t w;
        uint32_t r = gostr_decode_rune((const unsigned char *)s + i, n - i, &w);
        const char *c;
        if (r == GOSTR_RUNE_ERROR && w == 1) {
            add_hex(b, "\\x", (unsigned char)s[i], 2);
        } else if (r == '"' || r == '\\') {
            gostr_addc(b, '\\');
            gostr_addc(b, (char)r);
        } else if (is_print(r)) {
            gostr_addn(b, s + i, w);
        } else if (r && r < 0x20 && (c = memchr(cesc, (int)r, sizeof cesc - 1))) {
            gostr_addc(b, '\\');
            gostr_addc(b, cname[c - cesc]);
        } else if (r < 0x20 || r == 0x7F) {
            add_hex(b, "\\x", r, 2);
        } else if (r < 0x10000) {
            add_hex(b, "\\u", r, 4);
        } else {
            add_hex(b, "\\U", r, 8);
        }
        i += w;
    }
    gostr_addc(b, '"');
}
