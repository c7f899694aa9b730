/* The float codec's encoder: split elements into byte planes, code the
 * exponent plane as nibbles (or zstd), zstd the other planes that shrink,
 * keep the rest raw. Layout in common/codec_float.h. */
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
	       "the plane split reads elements as little-endian integers");

/* A mantissa plane is zstd'ed only if its first SAMPLE bytes shrink by at
 * least 1/MIN_GAIN: mantissas of trained weights are noise, and running zstd
 * over noise would halve our speed for nothing. */
#define SAMPLE   (64u << 10)
#define MIN_GAIN 32
/* Nibbles pay only if few exponents escape; else plain zstd of the plane. */
#define NIB_MAX_ESC_DIV 16
#define NIB_SAMPLE 8192

static _Thread_local struct float_scratch scratch;

/* bf16 and f16 alike: bits 14..7 (bf16's exponent; f16's exponent and top
 * mantissa bits) make plane 0, sign and the low 7 bits plane 1. Written on
 * whole integers so that the compiler vectorizes it. */
static void split2(const uint8_t *in, size_t ne, uint8_t *restrict e, uint8_t *restrict m)
{
	for (size_t i = 0; i < ne; i++) {
		uint16_t v;

		memcpy(&v, in + 2 * i, 2);
		e[i] = (uint8_t)(v >> 7);
		m[i] = (uint8_t)(((v >> 8) & 0x80) | (v & 0x7f));
	}
}

static void split4(const uint8_t *in, size_t ne, uint8_t *restrict e, uint8_t *restrict m2,
		   uint8_t *restrict m1, uint8_t *restrict m0)
{
	for (size_t i = 0; i < ne; i++) {
		uint32_t v;

		memcpy(&v, in + 4 * i, 4);
		e[i] = (uint8_t)(v >> 23);
		m2[i] = (uint8_t)(((v >> 24) & 0x80) | ((v >> 16) & 0x7f));
		m1[i] = (uint8_t)(v >> 8);
		m0[i] = (uint8_t)v;
	}
}

/* The base whose 15 values cover most exponents, judged on a sample: the
 * exponents of one tensor chunk are alike throughout, and a full histogram
 * cost as much as zstd itself. */
static uint8_t nib_base(const uint8_t *e, size_t ne)
{
	uint32_t h[256 + 15] = { 0 }, cover = 0, best = 0;
	size_t step = ne / NIB_SAMPLE + 1;
	unsigned base = 0;

	for (size_t i = 0; i < ne; i += step)
		h[e[i]]++;
	for (unsigned b = 0; b < 15; b++)
		cover += h[b];
	for (unsigned b = 0; b < 256; b++) {
		if (cover > best) {
			best = cover;
			base = b;
		}
		cover += h[b + 15] - h[b];
	}
	return (uint8_t)base;
}

static size_t nib_escapes(const uint8_t *e, size_t ne, uint8_t base)
{
	size_t n = 0;

	for (size_t i = 0; i < ne; i++)
		n += (uint8_t)(e[i] - base) >= 15;
	return n;
}

static void nib_pack(const uint8_t *restrict e, size_t ne, uint8_t base, uint8_t *restrict pk)
{
	for (size_t i = 0; i + 1 < ne; i += 2) {
		uint8_t d0 = (uint8_t)(e[i] - base), d1 = (uint8_t)(e[i + 1] - base);

		d0 = d0 < 15 ? d0 : 15;
		d1 = d1 < 15 ? d1 : 15;
		pk[i / 2] = (uint8_t)(d0 | d1 << 4);
	}
	if (ne & 1) {
		uint8_t d = (uint8_t)(e[ne - 1] - base);

		pk[ne / 2] = d < 15 ? d : 15;
	}
}

/* The exponent plane as nibbles at out; -ENOSPC if that would not shrink it.
 * pk is scratch of (ne + 1) / 2 bytes. */
static int put_nibbles(const uint8_t *e, size_t ne, uint8_t *pk, uint8_t *out, size_t cap,
		       size_t *len)
{
	size_t nesc, np = (ne + 1) / 2, stored, room;
	uint8_t base;

	if (ne < 64)
		return -ENOSPC;
	base = nib_base(e, ne);
	nesc = nib_escapes(e, ne, base);
	if (nesc > ne / NIB_MAX_ESC_DIV || cap < FLOAT_NIB_HDR + nesc)
		return -ENOSPC;
	nib_pack(e, ne, base, pk);
	out[0] = base;
	float_put32(out + 2, (uint32_t)nesc);
	room = cap - FLOAT_NIB_HDR;
	if (codec_zs_compress(pk, np, out + FLOAT_NIB_HDR, np - 1 < room ? np - 1 : room, &stored,
			      CODEC_ZS_PLANE_LEVEL) == 0) {
		out[1] = FLOAT_MODE_ZSTD;
	} else {
		out[1] = FLOAT_MODE_RAW;
		stored = np;
	}
	if (FLOAT_NIB_HDR + stored + nesc >= ne || FLOAT_NIB_HDR + stored + nesc > cap)
		return -ENOSPC;
	if (out[1] == FLOAT_MODE_RAW)
		memcpy(out + FLOAT_NIB_HDR, pk, np);
	float_put32(out + 6, (uint32_t)stored);
	if (nesc) {
		uint8_t *q = out + FLOAT_NIB_HDR + stored;

		/* Escapes are rare: look at each 64 exponents as a whole first. */
		for (size_t i = 0; i < ne; i += 64) {
			size_t end = ne - i < 64 ? ne : i + 64;
			uint8_t any = 0;

			for (size_t j = i; j < end; j++)
				any |= (uint8_t)(e[j] - base) >= 15;
			if (any)
				for (size_t j = i; j < end; j++)
					if ((uint8_t)(e[j] - base) >= 15)
						*q++ = e[j];
		}
	}
	*len = FLOAT_NIB_HDR + stored + nesc;
	return 0;
}

static int worth_trying(const uint8_t *plane, size_t n, uint8_t *out, size_t cap)
{
	size_t s = n < SAMPLE ? n : SAMPLE, got;

	if (cap < s)
		return 0;
	return codec_zs_compress(plane, s, out, s - s / MIN_GAIN, &got, CODEC_ZS_PLANE_LEVEL) == 0;
}

/* Stores one plane at out: nibbles (exponents), zstd if it shrinks, else raw. */
static int put_plane(const uint8_t *plane, size_t n, uint8_t *pk, uint8_t *out, size_t cap,
		     uint8_t *mode, size_t *len)
{
	if (pk && put_nibbles(plane, n, pk, out, cap, len) == 0) {
		*mode = FLOAT_MODE_NIB;
		return 0;
	}
	if (n > 16 && (pk || worth_trying(plane, n, out, cap)) &&
	    codec_zs_compress(plane, n, out, n - 1 < cap ? n - 1 : cap, len,
			      CODEC_ZS_PLANE_LEVEL) == 0) {
		*mode = FLOAT_MODE_ZSTD;
		return 0;
	}
	if (n > cap)
		return -ENOSPC;
	if (n)
		memcpy(out, plane, n);
	*mode = FLOAT_MODE_RAW;
	*len = n;
	return 0;
}

size_t codec_float_bound(size_t n)
{
	return n + float_hdr_size(FLOAT_MAX_PLANES);
}

int codec_float_compress(const void *in, size_t n, void *out, size_t cap, size_t *outlen,
			 const struct codec_params *p)
{
	enum codec_dtype dt = p ? p->dtype : CODEC_DT_BYTES;
	size_t es = codec_dtype_size(dt), ne = n / es, tail = n % es, hdr = float_hdr_size(es);
	uint8_t *o = out, *planes;
	size_t off = hdr;

	/* The float codec has nothing to say about bytes of no known type. */
	if (dt == CODEC_DT_BYTES || (unsigned)dt >= CODEC_DT_COUNT)
		return -EINVAL;
	if (n > UINT32_MAX)
		return -EFBIG;
	if (cap < hdr)
		return -ENOSPC;
	/* The planes, then room for the packed nibbles. */
	planes = float_scratch_get(&scratch, n + ne / 2 + 1);
	if (!planes)
		return -ENOMEM;
	if (es == 2)
		split2(in, ne, planes, planes + ne);
	else
		split4(in, ne, planes, planes + ne, planes + 2 * ne, planes + 3 * ne);

	o[0] = (uint8_t)dt;
	o[1] = (uint8_t)es;
	float_put32(o + 2, (uint32_t)n);
	for (size_t k = 0; k < es; k++) {
		size_t len;
		int rc = put_plane(planes + k * ne, ne, k == 0 ? planes + es * ne : NULL, o + off,
				   cap - off, &o[6 + 5 * k], &len);

		if (rc < 0)
			return rc;
		float_put32(o + 7 + 5 * k, (uint32_t)len);
		off += len;
	}
	if (cap - off < tail)
		return -ENOSPC;
	if (tail)
		memcpy(o + off, (const uint8_t *)in + ne * es, tail);
	*outlen = off + tail;
	return 0;
}

void codec_float_enc_thread_end(void)
{
	float_scratch_free(&scratch);
}
