/* The float codec's payload, shared by its encoder and decoder only.
 *
 *   u8 dtype, u8 nplanes (= element size), u32 raw length,
 *   nplanes x { u8 mode (0 raw, 1 zstd), u32 stored length },
 *   the planes' stored bytes in order, then the raw length % element size
 *   tail bytes as they were.
 *
 * A plane in mode 2 (nibbles) is the exponent plane re-coded, then zstd'ed:
 *   u8 base, u8 inner mode (0 raw, 1 zstd), u32 escapes, u32 stored length L,
 *   L bytes of the packed nibbles, then the escaped exponents raw.
 * Each exponent e in [base, base+14] is the nibble e-base, two to a byte (low
 * nibble first); any other is nibble 15 and its byte goes to the escapes.
 * Why: a tensor's exponents sit in a dozen binades; packed two to a byte the
 * plane is half as long, so zstd runs twice as fast, finds almost no matches
 * to waste time on, and its byte-wise Huffman codes pairs, which loses less
 * to whole-bit code lengths than coding 2.7-bit symbols one by one.
 *
 * Plane 0 is the exponent byte; the sign is moved beside the mantissa so
 * that the exponent, which is where a tensor's redundancy lives, is one
 * byte plane of its own. */
#ifndef STAGE_CODEC_FLOAT_H
#define STAGE_CODEC_FLOAT_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* Each thread's scratch buffers; codec_thread_end calls these. */
void codec_float_enc_thread_end(void);
void codec_float_dec_thread_end(void);

#define FLOAT_MODE_RAW  0
#define FLOAT_MODE_ZSTD 1
#define FLOAT_MODE_NIB  2
#define FLOAT_NIB_HDR   10
#define FLOAT_MAX_PLANES 4

static inline size_t float_hdr_size(size_t planes)
{
	return 6 + 5 * planes;
}

static inline void float_put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static inline uint32_t float_get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A thread's scratch, kept for its next chunk: one for each direction
 * (a _Thread_local in each file), so neither depends on the other. */
struct float_scratch {
	uint8_t *p;
	size_t len;
};
/* At least n bytes of s; NULL if out of memory. */
static inline uint8_t *float_scratch_get(struct float_scratch *s, size_t n)
{
	if (n > s->len) {
		uint8_t *p = realloc(s->p, n);

		if (!p)
			return NULL;
		s->p = p;
		s->len = n;
	}
	return s->p;
}
static inline void float_scratch_free(struct float_scratch *s)
{
	free(s->p);
	s->p = NULL;
	s->len = 0;
}

struct codec_params;

size_t codec_float_bound(size_t n);
int codec_float_compress(const void *in, size_t n, void *out, size_t cap, size_t *outlen,
			 const struct codec_params *p);
int codec_float_decompress(const void *in, size_t n, void *out, size_t cap, size_t *outlen);

#endif
