/*
 * crc32c.c — CRC-32C for the store's per-value checksums (see crc32c.h).
 *
 * Why here and not a library: Debian bookworm packages no C library for
 * CRC-32C (zlib's crc32() is the other polynomial, 0xEDB88320, and table-only;
 * the CRC-32C code in the archive lives inside larger programs such as
 * leveldb, rocksdb or btrfs-progs, not as a library to link). So this file
 * carries the three usual implementations:
 *
 *  - x86-64 SSE4.2: the crc32 instruction, 8 bytes a step. Its latency is 3
 *    cycles and its throughput 1 a cycle, so one dependent chain uses a third
 *    of the unit: blocks of 3 x L bytes are checksummed as three independent
 *    streams and combined by "shifting" the first two over the bytes that
 *    follow them (a linear map on the 32-bit register, applied with 4 table
 *    lookups), as Mark Adler's crc32c.c and the Linux kernel do. Chosen at run
 *    time with __builtin_cpu_supports; only these functions are compiled for
 *    SSE4.2 (a target attribute), so the build still runs on any x86-64.
 *  - aarch64 with the CRC extension (__ARM_FEATURE_CRC32, fixed at build
 *    time): __crc32cd, the same three-stream structure.
 *  - everything else: slice-by-8 tables (8 lookups per 8 bytes).
 *
 * The tables (slice-by-8 and the shift operators) are built once, on first
 * use, under pthread_once. Internally the register is the inverted CRC; the
 * public functions invert on the way in and out, which makes them chainable.
 */
#include "kwc/crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KWC_CRC_X86 1
#include <nmmintrin.h>
#endif
#if defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#define KWC_CRC_ARM 1
#include <arm_acle.h>
#endif

#define POLY 0x82F63B78u
/* Stream lengths of the interleaved hardware loop: long blocks for big
 * values, shorter ones so that a ~3 KiB object (one 3 x 1024 block) and the
 * rest of a value are interleaved too. */
#define LONG_BLOCK 8192
#define MID_BLOCK 1024
#define SHORT_BLOCK 128

static uint32_t table[8][256];
static uint32_t shift_long[4][256], shift_mid[4][256], shift_short[4][256];
static uint32_t (*impl)(uint32_t, const unsigned char *, size_t);
static const char *impl_name = "table";
static pthread_once_t once = PTHREAD_ONCE_INIT;

static uint32_t
sw(uint32_t crc, const unsigned char *p, size_t n)
{
    while (n >= 8) {
        crc ^= (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        crc = table[7][crc & 0xff] ^ table[6][(crc >> 8) & 0xff] ^ table[5][(crc >> 16) & 0xff] ^
              table[4][crc >> 24] ^ table[3][p[4]] ^ table[2][p[5]] ^ table[1][p[6]] ^
              table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

/* The operator that appends n zero bytes to a register state, as 4 byte tables. */
static void
zeros_op(uint32_t op[4][256], size_t n)
{
    uint32_t col[32];
    for (int j = 0; j < 32; j++) {
        uint32_t reg = 1u << j;
        for (size_t i = 0; i < n; i++)
            reg = table[0][reg & 0xff] ^ (reg >> 8);
        col[j] = reg;
    }
    for (int k = 0; k < 4; k++) {
        for (unsigned b = 0; b < 256; b++) {
            uint32_t v = 0;
            for (int j = 0; j < 8; j++)
                if (b >> j & 1)
                    v ^= col[8 * k + j];
            op[k][b] = v;
        }
    }
}

#if defined(KWC_CRC_X86) || defined(KWC_CRC_ARM)
static inline uint32_t
shift(const uint32_t op[4][256], uint32_t crc)
{
    return op[0][crc & 0xff] ^ op[1][(crc >> 8) & 0xff] ^ op[2][(crc >> 16) & 0xff] ^
           op[3][crc >> 24];
}

static inline uint64_t
load64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The hardware loop, once per instruction set: CRC64(reg, u64) and
 * CRC8(reg, byte) name the instructions. Three streams over blocks of 3 x
 * LONG_BLOCK, then 3 x MID_BLOCK, then 3 x SHORT_BLOCK, then one stream for
 * the rest. Unaligned 8-byte loads (both ISAs do them at full speed): no
 * aligning head, so a 3 KiB value is one 3 x MID_BLOCK block. */
#define HW_BODY(CRC64, CRC8)                                                                       \
    uint64_t c0 = crc;                                                                             \
    for (int pass = 0; pass < 3; pass++) {                                                         \
        size_t blk = pass == 0 ? LONG_BLOCK : pass == 1 ? MID_BLOCK : SHORT_BLOCK;                 \
        const uint32_t(*op)[256] = pass == 0 ? shift_long : pass == 1 ? shift_mid : shift_short;   \
        while (n >= 3 * blk) {                                                                     \
            uint64_t c1 = 0, c2 = 0;                                                               \
            const unsigned char *end = p + blk;                                                    \
            do {                                                                                   \
                c0 = CRC64(c0, load64(p));                                                         \
                c1 = CRC64(c1, load64(p + blk));                                                   \
                c2 = CRC64(c2, load64(p + 2 * blk));                                               \
                p += 8;                                                                            \
            } while (p < end);                                                                     \
            c0 = shift(op, (uint32_t)c0) ^ (uint32_t)c1;                                           \
            c0 = shift(op, (uint32_t)c0) ^ (uint32_t)c2;                                           \
            p += 2 * blk;                                                                          \
            n -= 3 * blk;                                                                          \
        }                                                                                          \
    }                                                                                              \
    while (n >= 8) {                                                                               \
        c0 = CRC64(c0, load64(p));                                                                 \
        p += 8;                                                                                    \
        n -= 8;                                                                                    \
    }                                                                                              \
    while (n--)                                                                                    \
        c0 = CRC8((uint32_t)c0, *p++);                                                             \
    return (uint32_t)c0;
#endif

#ifdef KWC_CRC_X86
__attribute__((target("sse4.2"))) static uint32_t
hw_sse42(uint32_t crc, const unsigned char *p, size_t n)
{
    HW_BODY(_mm_crc32_u64, _mm_crc32_u8)
}
#endif

#ifdef KWC_CRC_ARM
static uint32_t
hw_arm(uint32_t crc, const unsigned char *p, size_t n)
{
    HW_BODY(__crc32cd, __crc32cb)
}
#endif

static void
init(void)
{
    for (unsigned i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[0][i] = c;
    }
    for (unsigned i = 0; i < 256; i++)
        for (int k = 1; k < 8; k++)
            table[k][i] = (table[k - 1][i] >> 8) ^ table[0][table[k - 1][i] & 0xff];
    zeros_op(shift_long, LONG_BLOCK);
    zeros_op(shift_mid, MID_BLOCK);
    zeros_op(shift_short, SHORT_BLOCK);
    impl = sw;
#ifdef KWC_CRC_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        impl = hw_sse42;
        impl_name = "sse4.2";
    }
#endif
#ifdef KWC_CRC_ARM
    impl = hw_arm;
    impl_name = "armv8-crc";
#endif
}

uint32_t
crc32c(uint32_t crc, const void *p, size_t n)
{
    pthread_once(&once, init);
    return ~impl(~crc, p, n);
}

uint32_t
crc32c_sw(uint32_t crc, const void *p, size_t n)
{
    pthread_once(&once, init);
    return ~sw(~crc, p, n);
}

const char *
crc32c_impl(void)
{
    pthread_once(&once, init);
    return impl_name;
}
