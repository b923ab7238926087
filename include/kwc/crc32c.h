/*
 * crc32c.h — CRC-32C (Castagnoli: reflected, polynomial 0x82F63B78, initial
 * and final value inverted; RFC 3720's iSCSI checksum), the checksum the LMDB
 * store puts on every value it writes (cache/store.c). Hardware-accelerated
 * where the CPU has an instruction for it (x86-64 SSE4.2, chosen at run time;
 * aarch64 with the CRC extension at build time), a slice-by-8 table otherwise.
 */
#ifndef KWC_CRC32C_H
#define KWC_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/*
 * The CRC-32C of n bytes at p, continuing from crc (0 to start):
 * crc32c(crc32c(0, a, n), b, m) == crc32c(0, a followed by b, n + m).
 * crc32c(0, "123456789", 9) == 0xE3069283. Thread-safe; p may be unaligned.
 */
uint32_t crc32c(uint32_t crc, const void *p, size_t n);

/* The same with the portable table code, whatever the CPU has (for tests and
 * the benchmark). */
uint32_t crc32c_sw(uint32_t crc, const void *p, size_t n);

/* The implementation crc32c() uses: "sse4.2", "armv8-crc" or "table". */
const char *crc32c_impl(void);

#endif
