/* XXH3-128 digests as stage names them: the value `xxhsum -H2` prints.
 *
 * The text form is XXH128's canonical form (high 64 bits first, big-endian)
 * in lower-case hex, 32 digits. */
#ifndef STAGE_DIGEST_H
#define STAGE_DIGEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

#define DIGEST_HEX_LEN 32

typedef XXH128_hash_t digest_t;

static inline digest_t digest_of(const void *p, size_t n)
{
	return XXH3_128bits(p, n);
}

static inline int digest_eq(digest_t a, digest_t b)
{
	return a.low64 == b.low64 && a.high64 == b.high64;
}

/* Writes 32 hex digits and a NUL. */
void digest_to_hex(digest_t d, char out[DIGEST_HEX_LEN + 1]);
/* Parses exactly 32 hex digits (either case); 0 or -EINVAL. */
int digest_from_hex(const char *s, size_t n, digest_t *out);
/* The 16 canonical bytes (big-endian high then low), as hashed into roots. */
void digest_to_bytes(digest_t d, uint8_t out[16]);

/* The value of the hex digit c, or -1. lower: whether a-f count too (a
 * manifest's %XX escapes are upper case only, so that a name has one
 * spelling; digests are read in either case). */
static inline int digest_hexval(char c, bool lower)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	if (lower && c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

#endif
