/*
 * h2_fuzz.c — libFuzzer target for proxy/http/h2.c, h2body.c and
 * h2stream.c: raw bytes from an HTTP/2 client. It is http_fuzz.c (the same
 * server, the same handler behaviours chosen by the target's second byte,
 * the same checks) with every input behind the client preface and an empty
 * SETTINGS frame, so that each connection speaks HTTP/2 with prior
 * knowledge and the mutations land in frames and HPACK blocks. Seeds
 * (corpus/h2_fuzz) are requests for each handler behaviour, written by hand
 * from RFC 9113 and RFC 7541 (static-table indexes, literals without
 * Huffman).
 *
 * An input whose first byte is 'G' is a program instead (expand below):
 * each op writes frames a hostile client would, so that a few bytes reach
 * what takes megabytes by hand: HPACK bombs (a large dynamic-table entry,
 * then blocks of one-byte references, in HEADERS and CONTINUATION frames),
 * reset storms (client resets, WINDOW_UPDATEs that make nghttp2 reset:
 * MadeYouReset), held request bodies, PING/SETTINGS/PRIORITY.
 *
 * A program's server takes header lists of 64 KiB (G_HEADER_BYTES), so
 * that lists within the limit can be bombs too.
 *
 * The invariant beyond http_fuzz.c's is the work per input byte: the header
 * data kwc decoded stays within what the bytes received pay for (h2.c's
 * hpack_budget on each connection: two lists or 1 MiB, then 256 per byte
 * received; one field past it at most), the streams
 * reset stay within each connection's reset budget, and what is held stays
 * within each connection's window.
 */
#define LLVMFuzzerTestOneInput http_fuzz_one
#include "http_fuzz.c"
#undef LLVMFuzzerTestOneInput

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define G_MAX (256 * 1024)   /* an expanded program's bytes at most */
#define G_CONNS 2            /* http_fuzz.c's connections */
#define G_STREAMS 100        /* the server's default max streams (the reset bucket: 2 x) */
#define G_WINDOW (1 << 20)   /* a connection's receive window (h2.c) */
#define G_HEADER_BYTES 65536 /* the server's max_header_bytes for a program */

struct gbuf {
    uint8_t *p;
    size_t n;
};

static void
g_put(struct gbuf *g, const void *p, size_t n)
{
    if (g->n + n > G_MAX)
        return;
    memcpy(g->p + g->n, p, n);
    g->n += n;
}

static void
g_frame(struct gbuf *g, uint8_t type, uint8_t flags, uint32_t id, const uint8_t *p, size_t n)
{
    if (g->n + 9 + n > G_MAX)
        return;
    uint8_t h[9] = {
        (uint8_t)(n >> 16),         (uint8_t)(n >> 8),   (uint8_t)n,         type,       flags,
        (uint8_t)(id >> 24 & 0x7f), (uint8_t)(id >> 16), (uint8_t)(id >> 8), (uint8_t)id};
    g_put(g, h, 9);
    g_put(g, p, n);
}

/* A request block: GET or POST, http, :path /<mode>, :authority h (no
 * indexing), then `refs` references to dynamic entry 62 and, when entry
 * is nonzero, first a new entry "x-b" of that many bytes (it becomes 62). */
static size_t
g_block(uint8_t *b, size_t cap, bool post, char mode, size_t entry, size_t refs)
{
    size_t k = 0;
    b[k++] = post ? 0x83 : 0x82;
    b[k++] = 0x86;
    b[k++] = 0x04; /* :path, literal without indexing */
    b[k++] = 2;
    b[k++] = '/';
    b[k++] = (uint8_t)mode;
    b[k++] = 0x01; /* :authority */
    b[k++] = 1;
    b[k++] = 'h';
    if (entry && k + 8 + entry <= cap) {
        b[k++] = 0x40;
        b[k++] = 3;
        memcpy(b + k, "x-b", 3);
        k += 3;
        b[k++] = 0x7f; /* the length: 127 + the rest in 7-bit groups */
        size_t v = entry - 127;
        while (v >= 128) {
            b[k++] = (uint8_t)(v % 128 + 128);
            v /= 128;
        }
        b[k++] = (uint8_t)v;
        memset(b + k, 'a', entry);
        k += entry;
    }
    for (size_t i = 0; i < refs && k < cap; i++)
        b[k++] = 0xbe;
    return k;
}

/*
 * The program: ops of two bytes, [op, arg]; each op that opens a stream
 * takes the next odd stream id.
 *   0 HEADERS (END_STREAM) of arg x 16 references
 *   1 HEADERS without END_HEADERS (arg x 8 references), then a CONTINUATION
 *     of arg x 64 references
 *   2 HEADERS and RST_STREAM CANCEL (a rapid reset)
 *   3 HEADERS and a WINDOW_UPDATE that overflows the stream's window
 *   4 a POST to /l (held) with arg x 256 bytes of DATA, no END_STREAM
 *   5 HEADERS with a new dynamic entry of 127 + arg x 15 bytes
 *   6 PING, 7 SETTINGS (HEADER_TABLE_SIZE arg x 32), 8 PRIORITY
 * The second byte of the op picks the handler's mode for requests too
 * (its low bits index "edlsxa").
 */
static void
expand(struct gbuf *g, const uint8_t *p, size_t n)
{
    static const char modes[] = "edlsxa";
    static uint8_t blk[G_MAX];
    uint32_t id = 1;
    for (size_t i = 0; i + 1 < n && g->n < G_MAX; i += 2) {
        uint8_t op = p[i] % 9, arg = p[i + 1];
        char mode = modes[arg % 6];
        size_t k;
        switch (op) {
        case 0:
            k = g_block(blk, sizeof(blk), false, mode, 0, (size_t)arg * 16);
            g_frame(g, 0x1, 0x5, id, blk, k);
            id += 2;
            break;
        case 1:
            k = g_block(blk, sizeof(blk), false, mode, 0, (size_t)arg * 8);
            g_frame(g, 0x1, 0x1, id, blk, k);
            memset(blk, 0xbe, (size_t)arg * 64);
            g_frame(g, 0x9, 0x4, id, blk, (size_t)arg * 64);
            id += 2;
            break;
        case 2:
        case 3: {
            k = g_block(blk, sizeof(blk), false, mode, 0, 0);
            g_frame(g, 0x1, 0x5, id, blk, k);
            static const uint8_t cancel[4] = {0, 0, 0, 8}, inc[4] = {0x7f, 0xff, 0xff, 0xff};
            if (op == 2)
                g_frame(g, 0x3, 0, id, cancel, 4);
            else
                g_frame(g, 0x8, 0, id, inc, 4);
            id += 2;
            break;
        }
        case 4:
            k = g_block(blk, sizeof(blk), true, 'l', 0, 0);
            g_frame(g, 0x1, 0x4, id, blk, k);
            memset(blk, 'd', (size_t)arg * 256);
            g_frame(g, 0x0, 0, id, blk, (size_t)arg * 256);
            id += 2;
            break;
        case 5:
            k = g_block(blk, sizeof(blk), false, mode, 127 + (size_t)arg * 15, 1);
            g_frame(g, 0x1, 0x5, id, blk, k);
            id += 2;
            break;
        case 6:
            g_frame(g, 0x6, 0, 0, (const uint8_t *)"fuzzping", 8);
            break;
        case 7: {
            uint32_t v = (uint32_t)arg * 32;
            uint8_t s[6] = {0,         1, (uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8),
                            (uint8_t)v};
            g_frame(g, 0x4, 0, 0, s, 6);
            break;
        }
        default: {
            uint8_t pr[5] = {0, 0, 0, 0, arg};
            g_frame(g, 0x2, 0, id, pr, 5);
            break;
        }
        }
    }
}

/* http_fuzz.c's server: max_header_bytes as the input chose, default max
 * streams. */
static void
check_work(struct http_server *s)
{
    struct http_server_stats st;
    http_server_stats(s, &st);
    /* per connection: two lists, 256 per byte received, and the field that
     * passed it (a table entry, 4,096 + 32 at most, or a literal the bytes
     * paid for) */
    unsigned long long lists =
        2ull * fz_max_header_bytes > (1u << 20) ? 2ull * fz_max_header_bytes : (1u << 20);
    unsigned long long bound =
        G_CONNS * (lists + 4096 + 32) + 256ull * st.h2_bytes_in + st.h2_bytes_in;
    if (st.h2_header_bytes > bound)
        abort(); /* header decoding out of proportion to the bytes received */
    /* per connection: the bucket (2 x max streams), what it refills while
     * the input runs (10 a second), and the streams still open when it
     * emptied (max streams: GOAWAY ends them, no stream opens after it) */
    if (st.h2_resets + st.h2_resets_server + st.h2_refused > G_CONNS * (3ull * G_STREAMS + 16))
        abort(); /* streams reset past the reset budget */
    if (st.h2_body_held > G_CONNS * (unsigned long long)G_WINDOW)
        abort(); /* bodies held past the connections' windows */
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t start[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"      /* the preface */
                                   "\x00\x00\x00\x04\x00\x00\x00\x00\x00"; /* SETTINGS */
    size_t n = sizeof(start) - 1;
    struct gbuf g = {malloc(n + G_MAX + size + 1), 0};
    if (!g.p)
        abort();
    memcpy(g.p, start, n);
    g.n = n;
    fz_max_header_bytes = 2048;
    if (size > 0 && data[0] == 'G') {
        fz_max_header_bytes = G_HEADER_BYTES; /* lists within it can be bombs */
        expand(&g, data + 1, size - 1);
    } else if (size) {
        memcpy(g.p + n, data, size);
        g.n += size;
    }
    fz_check_server = check_work;
    http_fuzz_one(g.p, g.n);
    free(g.p);
    return 0;
}
