/*
 * h2_fuzz.c — libFuzzer target for proxy/http/h2.c and h2stream.c: raw
 * bytes from an HTTP/2 client. It is http_fuzz.c (the same server, the same
 * handler behaviours chosen by the target's second byte, the same checks)
 * with every input behind the client preface and an empty SETTINGS frame,
 * so that each connection speaks HTTP/2 with prior knowledge and the
 * mutations land in frames and HPACK blocks. Seeds (corpus/h2_fuzz) are
 * requests for each handler behaviour, written by hand from RFC 9113 and
 * RFC 7541 (static-table indexes, literals without Huffman).
 */
#define LLVMFuzzerTestOneInput http_fuzz_one
#include "http_fuzz.c"
#undef LLVMFuzzerTestOneInput

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t start[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"      /* the preface */
                                   "\x00\x00\x00\x04\x00\x00\x00\x00\x00"; /* SETTINGS */
    size_t n = sizeof(start) - 1;
    uint8_t *buf = malloc(n + size + 1);
    if (!buf)
        abort();
    memcpy(buf, start, n);
    if (size)
        memcpy(buf + n, data, size);
    http_fuzz_one(buf, n + size);
    free(buf);
    return 0;
}
