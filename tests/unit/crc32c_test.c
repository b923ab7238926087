/*
 * crc32c_test.c — cache/crc32c.c: published vectors (the check value and
 * RFC 3720 B.4), chaining, the dispatched implementation against the table
 * one at every length 0..300 and alignment 0..7, and vectors computed by an
 * independent implementation (Debian's python3-crc32c, through
 * fixtures/crc32c/gen.py, committed as vectors.txt).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"
#include "kwc/crc32c.h"
#include "tap.h"

static void
test_published_vectors(void)
{
    unsigned char b[32];
    is_int(crc32c(0, "123456789", 9), 0xE3069283u, "check value of \"123456789\"");
    is_int(crc32c_sw(0, "123456789", 9), 0xE3069283u, "check value, table code");
    memset(b, 0, sizeof b);
    is_int(crc32c(0, b, 32), 0x8A9136AAu, "RFC 3720: 32 bytes of zeros");
    memset(b, 0xff, sizeof b);
    is_int(crc32c(0, b, 32), 0x62A8AB43u, "RFC 3720: 32 bytes of 0xFF");
    for (int i = 0; i < 32; i++)
        b[i] = (unsigned char)i;
    is_int(crc32c(0, b, 32), 0x46DD794Eu, "RFC 3720: 32 ascending bytes");
    for (int i = 0; i < 32; i++)
        b[i] = (unsigned char)(31 - i);
    is_int(crc32c(0, b, 32), 0x113FDB5Cu, "RFC 3720: 32 descending bytes");
    is_int(crc32c(0, NULL, 0), 0, "nothing: 0");
    is_int(crc32c(0x12345678, b, 0), 0x12345678, "no bytes leave the crc as it was");
    printf("# implementation: %s\n", crc32c_impl());
}

static unsigned char *
lcg_bytes(size_t n, uint32_t seed)
{
    unsigned char *p = xmalloc(n + 1);
    uint32_t x = seed;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (unsigned char)(x >> 24);
    }
    return p;
}

static void
test_chaining(void)
{
    size_t n = 100000;
    unsigned char *p = lcg_bytes(n, 7);
    uint32_t whole = crc32c(0, p, n);
    int bad = 0;
    size_t cuts[] = {0, 1, 7, 8, 255, 768, 3000, 24576, 24577, 50000, n};
    for (size_t i = 0; i < KWC_ARRAY_LEN(cuts); i++) {
        size_t c = cuts[i];
        if (crc32c(crc32c(0, p, c), p + c, n - c) != whole ||
            crc32c_sw(crc32c_sw(0, p, c), p + c, n - c) != whole)
            bad++;
    }
    is_int(bad, 0, "crc(crc(a), b) == crc(ab) at every cut, both implementations");
    free(p);
}

static void
test_every_length_and_alignment(void)
{
    unsigned char *p = lcg_bytes(300 + 8, 99);
    int bad = 0;
    for (size_t al = 0; al < 8; al++)
        for (size_t n = 0; n <= 300; n++)
            if (crc32c(0, p + al, n) != crc32c_sw(0, p + al, n) ||
                crc32c(0xdeadbeef, p + al, n) != crc32c_sw(0xdeadbeef, p + al, n))
                bad++;
    is_int(bad, 0, "lengths 0..300 at alignments 0..7: dispatched == table");
    free(p);
    /* the interleaved blocks: around 3 x 128, 3 x 1024 and 3 x 8192 bytes */
    size_t big = 3 * 8192 * 2 + 3 * 1024 * 2 + 3 * 128 * 2 + 64;
    p = lcg_bytes(big + 8, 5);
    bad = 0;
    size_t lens[] = {383,  384,  385,   767,   768,   3071,  3072,
                     3073, 3500, 24575, 24576, 24583, 49152, big};
    for (size_t al = 0; al < 8; al++)
        for (size_t i = 0; i < KWC_ARRAY_LEN(lens); i++)
            if (crc32c(0, p + al, lens[i]) != crc32c_sw(0, p + al, lens[i]))
                bad++;
    is_int(bad, 0, "lengths around the interleaved block sizes: dispatched == table");
    free(p);
}

static void
test_independent_vectors(void)
{
    const char *f = __FILE__, *slash = strrchr(f, '/');
    char *path = xasprintf("%.*s/fixtures/crc32c/vectors.txt", slash ? (int)(slash - f) : 1,
                           slash ? f : ".");
    FILE *fp = fopen(path, "r");
    ok(fp != NULL, "fixtures/crc32c/vectors.txt opened");
    free(path);
    if (!fp)
        return;
    char line[256];
    int n = 0, bad = 0;
    while (fgets(line, sizeof line, fp)) {
        unsigned long len, seed, want;
        if (line[0] == '#' || sscanf(line, "%lu %lu %lx", &len, &seed, &want) != 3)
            continue;
        unsigned char *p = lcg_bytes(len, (uint32_t)seed);
        if (crc32c(0, p, len) != want || crc32c_sw(0, p, len) != want) {
            if (bad++ < 3)
                printf("# len %lu seed %lu: got %08x / %08x, want %08lx\n", len, seed,
                       crc32c(0, p, len), crc32c_sw(0, p, len), want);
        }
        free(p);
        n++;
    }
    fclose(fp);
    ok(n >= 80, "the fixture holds its vectors");
    is_int(bad, 0, "every python3-crc32c vector matches, both implementations");
}

int
main(void)
{
    TAP_RUN(test_published_vectors);
    TAP_RUN(test_chaining);
    TAP_RUN(test_every_length_and_alignment);
    TAP_RUN(test_independent_vectors);
    return tap_done();
}
