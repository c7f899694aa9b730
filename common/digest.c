#include "common/digest.h"

#include <errno.h>
#include <string.h>

void digest_to_bytes(digest_t d, uint8_t out[16])
{
	XXH128_canonical_t c;

	XXH128_canonicalFromHash(&c, d);
	memcpy(out, c.digest, 16);
}

void digest_to_hex(digest_t d, char out[DIGEST_HEX_LEN + 1])
{
	static const char hex[] = "0123456789abcdef";
	uint8_t b[16];

	digest_to_bytes(d, b);
	for (int i = 0; i < 16; i++) {
		out[2 * i] = hex[b[i] >> 4];
		out[2 * i + 1] = hex[b[i] & 15];
	}
	out[DIGEST_HEX_LEN] = '\0';
}

int digest_from_hex(const char *s, size_t n, digest_t *out)
{
	XXH128_canonical_t c;

	if (n != DIGEST_HEX_LEN)
		return -EINVAL;
	for (int i = 0; i < 16; i++) {
		int hi = digest_hexval(s[2 * i], true), lo = digest_hexval(s[2 * i + 1], true);

		if (hi < 0 || lo < 0)
			return -EINVAL;
		c.digest[i] = (unsigned char)(hi << 4 | lo);
	}
	*out = XXH128_hashFromCanonical(&c);
	return 0;
}
