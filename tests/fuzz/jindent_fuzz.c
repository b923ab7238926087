/*
 * jindent_fuzz.c — libFuzzer target for jindent (cache/jindent.c): the
 * re-indenter of the compact JSON kwc answers with, fed in pieces.
 *
 * Input: byte 0 and 1 choose a split point and an output room (1..16
 * bytes); the rest is the JSON text (any bytes: the re-indenter does not
 * validate). Checked: the whole text at once into ample room and the text
 * in two pieces through the small room give the same bytes; the output,
 * compacted again (whitespace outside strings dropped), is the input
 * compacted the same way; the same output as a plain, non-streaming
 * rendition of encoding/json's Indent loop written here (which also sizes
 * the buffers).
 */
#include "kwc/jindent.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Whitespace outside strings dropped. */
static size_t
compact(const char *in, size_t n, char *out)
{
    size_t w = 0;
    bool str = false, esc = false;
    for (size_t i = 0; i < n; i++) {
        char c = in[i];
        if (str) {
            str = esc || c != '"';
            esc = !esc && c == '\\';
            out[w++] = c;
        } else if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            str = c == '"';
            out[w++] = c;
        }
    }
    return w;
}

static void
put(char *out, size_t *w, char c)
{
    if (out)
        out[*w] = c;
    (*w)++;
}

static void
put_indent(char *out, size_t *w, size_t depth)
{
    put(out, w, '\n');
    for (size_t i = 0; i < 2 * depth; i++)
        put(out, w, ' ');
}

/* encoding/json's Indent loop (prefix "", indent "  "), over the bytes its
 * scanner would classify, without the scanner's validation. out NULL: only
 * the length. */
static size_t
reference(const char *in, size_t n, char *out)
{
    size_t w = 0, depth = 0;
    bool need = false, str = false, esc = false;
    for (size_t i = 0; i < n; i++) {
        char c = in[i];
        if (str) {
            str = esc || c != '"';
            esc = !esc && c == '\\';
            put(out, &w, c);
            continue;
        }
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
            continue;
        if (need && c != '}' && c != ']') {
            need = false;
            depth++;
            put_indent(out, &w, depth);
        }
        switch (c) {
        case '{':
        case '[':
            need = true;
            put(out, &w, c);
            break;
        case ',':
            put(out, &w, c);
            put_indent(out, &w, depth);
            break;
        case ':':
            put(out, &w, c);
            put(out, &w, ' ');
            break;
        case '}':
        case ']':
            if (need) {
                need = false;
            } else {
                if (depth > 0)
                    depth--;
                put_indent(out, &w, depth);
            }
            put(out, &w, c);
            break;
        default:
            str = c == '"';
            put(out, &w, c);
        }
    }
    return w;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    const char *in = (const char *)data + 2;
    size_t n = size - 2;
    size_t split = n ? data[0] % (n + 1) : 0;
    size_t room = 1 + data[1] % 16;
    size_t cap = reference(in, n, NULL) + 1;
    char *all = malloc(cap), *pieces = malloc(cap), *ref = malloc(cap);
    char *c1 = malloc(n + 1), *c2 = malloc(cap);
    if (!all || !pieces || !ref || !c1 || !c2)
        abort();

    struct jindent j;
    jindent_init(&j);
    size_t used, an = jindent_run(&j, in, n, &used, all, cap);
    if (used != n || jindent_pending(&j))
        abort();

    jindent_init(&j);
    size_t pn = 0;
    size_t cuts[3] = {0, split, n};
    for (int p = 0; p < 2; p++) {
        const char *s = in + cuts[p];
        size_t left = cuts[p + 1] - cuts[p];
        while (left > 0 || jindent_pending(&j)) {
            size_t w = jindent_run(&j, s, left, &used, pieces + pn, room);
            if (w > room || used > left || (w == 0 && used == 0))
                abort(); /* no progress: it would spin */
            pn += w;
            s += used;
            left -= used;
        }
    }
    if (pn != an || memcmp(pieces, all, an) != 0)
        abort();

    if (reference(in, n, ref) != an || memcmp(ref, all, an) != 0)
        abort();

    size_t k1 = compact(in, n, c1), k2 = compact(all, an, c2);
    if (k1 != k2 || memcmp(c1, c2, k1) != 0)
        abort();

    free(all);
    free(pieces);
    free(ref);
    free(c1);
    free(c2);
    return 0;
}
