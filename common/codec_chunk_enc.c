/* Framing one chunk: pick the codec, compress, write the header. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/codec.h"
#include "common/codec_chunk.h"

/* Below this gain the float codec is judged not to have won, and zstd gets
 * a try too: better a second pass than a worse ratio on non-float data. */
#define FLOAT_WIN_NUM 9
#define FLOAT_WIN_DEN 10

static _Thread_local uint8_t *alt;
static _Thread_local size_t alt_len;

/* sum: the XXH3-64 of the n raw bytes, or 0 (codec_params.no_sum). */
static void put_hdr(uint8_t *o, uint8_t codec, uint8_t dtype, const void *in, size_t n,
		    size_t len, bool sum)
{
	o[0] = codec;
	o[1] = dtype;
	o[2] = o[3] = 0;
	chunk_put32(o + 4, (uint32_t)n);
	chunk_put32(o + 8, (uint32_t)len);
	chunk_put32(o + 12, chunk_hdr_check(o));
	chunk_put64(o + 16, sum ? XXH3_64bits(in, n) : 0);
}

size_t codec_chunk_bound(size_t n)
{
	size_t b = n;

	for (unsigned i = 0; i < CODEC_COUNT; i++) {
		size_t x = codec_by_id(i)->bound(n);

		if (x > b)
			b = x;
	}
	return CODEC_CHUNK_HDR + b;
}

/* Compresses with c into out; a result not smaller than n counts as failure
 * (-ENOSPC), since none would store it in n. */
static int try_codec(const struct codec_ops *c, const void *in, size_t n,
		     const struct codec_params *p, uint8_t *out, size_t cap, size_t *len)
{
	return c->compress(in, n, out, cap < n ? cap : n, len, p);
}

int codec_chunk_encode(const void *in, size_t n, const struct codec_ops *want,
		       const struct codec_params *p, void *out, size_t cap, size_t *outlen)
{
	uint8_t *o = out;
	const struct codec_ops *used = &codec_none_ops;
	size_t len = n, room;
	int rc;

	if (n > CODEC_CHUNK_MAX)
		return -EFBIG;
	if (cap < CODEC_CHUNK_HDR)
		return -ENOSPC;
	room = cap - CODEC_CHUNK_HDR;
	if (!want)
		want = p && p->dtype != CODEC_DT_BYTES ? &codec_float_ops : &codec_zstd_ops;

	if (want->id == CODEC_FLOAT) {
		rc = try_codec(want, in, n, p, o + CODEC_CHUNK_HDR, room, &len);
		if (rc == 0)
			used = want;
		else if (rc != -ENOSPC && rc != -EINVAL)
			return rc;
		if (rc < 0 || len * FLOAT_WIN_DEN > n * FLOAT_WIN_NUM) {
			size_t zlen;

			if (alt_len < n) {
				uint8_t *q = realloc(alt, n);

				if (!q)
					return -ENOMEM;
				alt = q;
				alt_len = n;
			}
			rc = try_codec(&codec_zstd_ops, in, n, p, alt, n, &zlen);
			if (rc == 0 && (used->id == CODEC_NONE || zlen < len)) {
				if (zlen > room)
					return -ENOSPC;
				memcpy(o + CODEC_CHUNK_HDR, alt, zlen);
				used = &codec_zstd_ops;
				len = zlen;
			} else if (rc < 0 && rc != -ENOSPC) {
				return rc;
			}
		}
	} else if (want->id != CODEC_NONE) {
		rc = try_codec(want, in, n, p, o + CODEC_CHUNK_HDR, room, &len);
		if (rc == 0)
			used = want;
		else if (rc != -ENOSPC)
			return rc;
	}
	if (used->id == CODEC_NONE) {
		if (n > room)
			return -ENOSPC;
		if (n)
			memcpy(o + CODEC_CHUNK_HDR, in, n);
		len = n;
	}

	put_hdr(o, used->id, (uint8_t)(used->id == CODEC_FLOAT ? p->dtype : CODEC_DT_BYTES), in, n,
		len, !(p && p->no_sum));
	*outlen = CODEC_CHUNK_HDR + len;
	return 0;
}

void codec_chunk_raw_hdr(const void *in, size_t n, const struct codec_params *p,
			 uint8_t hdr[CODEC_CHUNK_HDR])
{
	put_hdr(hdr, CODEC_NONE, CODEC_DT_BYTES, in, n, n, !(p && p->no_sum));
}

void codec_chunk_enc_thread_end(void)
{
	free(alt);
	alt = NULL;
	alt_len = 0;
}
