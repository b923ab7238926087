/*
 * srcmap.h — a count per client source address, for the per-source limits
 * (--max-connections-per-source at accept, --max-reviews-per-source for
 * TokenReviews): one flooding address is held to its share instead of
 * taking everyone's.
 *
 * A source is one IP address as 16 bytes (struct src_key): an IPv6
 * address, or an IPv4 one as its IPv4-mapped form (::ffff:a.b.c.d), so a
 * client reaching a dual-stack listener as ::ffff:10.0.0.1 and one reaching
 * an IPv4 listener as 10.0.0.1 are the same source. Whole addresses, not
 * IPv6 prefixes: a Kubernetes node's pods share its /64, so grouping by
 * prefix would make every pod of a node one source; an attacker holding a
 * prefix of addresses is beyond a per-address limit.
 *
 * The table holds only sources whose count is above 0 (an entry leaves when
 * its count returns to 0), so its size is bounded by what is counted (open
 * connections, reviews in flight), never by how many addresses came and
 * went. Open addressing with linear probing, at most half full, shrunk when
 * an eighth full; the hash is seeded by the caller (a random seed: an
 * address cannot be picked to collide with another on every kwc).
 *
 * Pure: no I/O, no clock; one thread (each owner has its own). Unit-tested
 * (tests/unit/srcmap_test.c).
 */
#ifndef KWC_SRCMAP_H
#define KWC_SRCMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct src_key {
    uint8_t b[16]; /* an IPv6 address; IPv4 as ::ffff:a.b.c.d */
};

/* The source key of an IPv4 address (4 bytes, network order). */
void src_key_v4(struct src_key *k, const uint8_t a[4]);
/* The source key of an IPv6 address (16 bytes); an IPv4-mapped one is its
 * IPv4 address's key, which it already is. */
void src_key_v6(struct src_key *k, const uint8_t a[16]);
/* The key as text (an IPv4 address for a mapped one, else IPv6 in full
 * hex groups), for log lines. out: at least SRC_KEY_TEXT bytes. */
#define SRC_KEY_TEXT 48
void src_key_text(const struct src_key *k, char *out, size_t len);

struct srcmap;

/* seed: any 64 bits (random in production, fixed in tests). New. */
struct srcmap *srcmap_new(uint64_t seed);
/* Accepts NULL. */
void srcmap_free(struct srcmap *m);
/* k's count (0 when it has none). */
unsigned srcmap_count(const struct srcmap *m, const struct src_key *k);
/* Add one to k's count unless it is already at limit (0: no limit).
 * Returns true when counted. */
bool srcmap_take(struct srcmap *m, const struct src_key *k, unsigned limit);
/* Take one off k's count (which must be above 0); at 0 the entry leaves. */
void srcmap_release(struct srcmap *m, const struct src_key *k);
/* Sources with a count above 0, and the slots the table holds (for tests
 * and /metrics: slots <= 4 x sources, and at least the initial 16). */
size_t srcmap_sources(const struct srcmap *m);
size_t srcmap_slots(const struct srcmap *m);

#endif
