/* The float codec's decoder: check every length, unpack the planes, merge
 * them back into elements. Layout in common/codec_float.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/codec.h"
#include "common/codec_float.h"
#include "common/codec_zs.h"

/* The split and merge loops are the codec's own cost besides zstd; -O2's
 * "very cheap" vectorizer leaves them scalar, so ask GCC for its full one. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
	       "the plane merge writes elements as little-endian integers");

static _Thread_local struct float_scratch scratch;

static void merge2(uint8_t *out, size_t ne, const uint8_t *restrict e, const uint8_t *restrict m)
{
	for (size_t i = 0; i < ne; i++) {
		uint16_t v = (uint16_t)((m[i] & 0x80) << 8 | e[i] << 7 | (m[i] & 0x7f));

		memcpy(out + 2 * i, &v, 2);
	}
}

static void merge4(uint8_t *out, size_t ne, const uint8_t *restrict e,
		   const uint8_t *restrict m2, const uint8_t *restrict m1,
		   const uint8_t *restrict m0)
{
	for (size_t i = 0; i < ne; i++) {
		uint32_t v = (uint32_t)(m2[i] & 0x80) << 24 | (uint32_t)e[i] << 23 |
			     (uint32_t)(m2[i] & 0x7f) << 16 | (uint32_t)m1[i] << 8 | m0[i];

		memcpy(out + 4 * i, &v, 4);
	}
}

static void nib_unpack(const uint8_t *restrict pk, size_t ne, uint8_t base, uint8_t *restrict e)
{
	for (size_t j = 0; j < ne / 2; j++) {
		uint16_t v = (uint16_t)((uint8_t)(base + (pk[j] & 15)) |
					(uint8_t)(base + (pk[j] >> 4)) << 8);

		memcpy(e + 2 * j, &v, 2);
	}
	if (ne & 1)
		e[ne - 1] = (uint8_t)(base + (pk[ne / 2] & 15));
}

/* Decodes a nibble plane of len bytes at p into ne exponents at e; pk is
 * scratch of (ne + 1) / 2 bytes. */
static int get_nibbles(const uint8_t *p, size_t len, size_t ne, uint8_t *pk, uint8_t *e)
{
	size_t np = (ne + 1) / 2, nesc, stored, k = 0;
	uint8_t base, mark;
	const uint8_t *esc;

	if (len < FLOAT_NIB_HDR)
		return -EBADMSG;
	base = p[0];
	nesc = float_get32(p + 2);
	stored = float_get32(p + 6);
	if ((p[1] != FLOAT_MODE_RAW && p[1] != FLOAT_MODE_ZSTD) || nesc > ne ||
	    stored > len - FLOAT_NIB_HDR || len - FLOAT_NIB_HDR - stored != nesc ||
	    (p[1] == FLOAT_MODE_RAW && stored != np))
		return -EBADMSG;
	if (p[1] == FLOAT_MODE_RAW)
		pk = (uint8_t *)(uintptr_t)(p + FLOAT_NIB_HDR);
	else if (codec_zs_decompress(p + FLOAT_NIB_HDR, stored, pk, np) < 0)
		return -EBADMSG;
	nib_unpack(pk, ne, base, e);
	if (!nesc)
		return 0;
	/* base+15 is no nibble's value but the escape's: it marks them. */
	mark = (uint8_t)(base + 15);
	esc = p + FLOAT_NIB_HDR + stored;
	for (uint8_t *q = e, *end = e + ne; (q = memchr(q, mark, (size_t)(end - q))); q++) {
		if (k == nesc)
			return -EBADMSG;
		*q = esc[k++];
	}
	return k == nesc ? 0 : -EBADMSG;
}

int codec_float_decompress(const void *in, size_t n, void *out, size_t cap, size_t *outlen)
{
	const uint8_t *p = in, *plane[FLOAT_MAX_PLANES] = { NULL };
	size_t es, ne, hdr, off;
	uint8_t *z = NULL, *pk;

	if (n < 6)
		return -EBADMSG;
	es = p[1];
	if (p[0] == CODEC_DT_BYTES || p[0] >= CODEC_DT_COUNT ||
	    es != codec_dtype_size((enum codec_dtype)p[0]) || float_get32(p + 2) != cap)
		return -EBADMSG;
	hdr = float_hdr_size(es);
	if (n < hdr)
		return -EBADMSG;
	ne = cap / es;
	/* First every length, so nothing is decoded from a payload that lies. */
	off = hdr;
	for (size_t k = 0; k < es; k++) {
		uint8_t mode = p[6 + 5 * k];
		size_t len = float_get32(p + 7 + 5 * k);

		if (mode > FLOAT_MODE_NIB || (mode == FLOAT_MODE_RAW && len != ne) ||
		    len > n - off)
			return -EBADMSG;
		off += len;
	}
	if (n - off != cap % es)
		return -EBADMSG;

	/* Room for every plane decoded, and for one plane's packed nibbles. */
	z = float_scratch_get(&scratch, es * ne + ne / 2 + 1);
	if (!z)
		return -ENOMEM;
	pk = z + es * ne;
	off = hdr;
	for (size_t k = 0; k < es; k++) {
		size_t len = float_get32(p + 7 + 5 * k);
		uint8_t mode = p[6 + 5 * k];
		uint8_t *dst = z + k * ne;

		if (mode == FLOAT_MODE_RAW) {
			plane[k] = p + off;
		} else if (mode == FLOAT_MODE_ZSTD) {
			if (codec_zs_decompress(p + off, len, dst, ne) < 0)
				return -EBADMSG;
			plane[k] = dst;
		} else {
			if (get_nibbles(p + off, len, ne, pk, dst) < 0)
				return -EBADMSG;
			plane[k] = dst;
		}
		off += len;
	}
	if (es == 2)
		merge2(out, ne, plane[0], plane[1]);
	else
		merge4(out, ne, plane[0], plane[1], plane[2], plane[3]);
	if (cap % es)
		memcpy((uint8_t *)out + ne * es, p + off, cap % es);
	*outlen = cap;
	return 0;
}

void codec_float_dec_thread_end(void)
{
	float_scratch_free(&scratch);
}
