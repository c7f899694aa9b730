/* libFuzzer target: the codec decoders on arbitrary bytes.
 *
 * The input goes, whole, to the chunk frame decoder (which reaches every
 * codec's decoder through the header's codec id), to each codec's decoder
 * directly with a raw length taken from the first bytes, and to the
 * container reader. Beyond not crashing: whatever is accepted must be what
 * the frame's digest vouches for, and a frame re-encoded from accepted bytes
 * must decode to them again. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define RAW_MAX (1u << 20)

static void chunk(const uint8_t *data, size_t size, uint8_t *out)
{
	struct codec_chunk_hdr h;
	size_t got, used;

	if (codec_chunk_decode(data, size, out, RAW_MAX, &got, &used) != 0)
		return;
	if (codec_chunk_parse_hdr(data, size, &h) != 0 || got != h.raw_len || used > size ||
	    XXH3_64bits(out, got) != h.digest)
		abort();
}

static void direct(const uint8_t *data, size_t size, uint8_t *out)
{
	size_t raw, got;

	if (size < 3)
		return;
	raw = ((size_t)data[0] | (size_t)data[1] << 8 | (size_t)(data[2] & 0x0f) << 16);
	for (unsigned id = 0; id < CODEC_COUNT; id++) {
		const struct codec_ops *c = codec_by_id(id);

		if (c->decompress(data + 3, size - 3, out, raw, &got) == 0 && got != raw)
			abort();
	}
}

static void container(const uint8_t *data, size_t size)
{
	struct codec_stats st;
	FILE *in = fmemopen((void *)(uintptr_t)data, size, "rb");
	FILE *out = fopen("/dev/null", "wb");

	if (in && out)
		codec_file_decompress(in, out, &st);
	if (out)
		fclose(out);
	if (in)
		fclose(in);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t *out;

	if (!out && !(out = malloc(RAW_MAX)))
		return 0;
	if (size == 0)
		return 0;
	chunk(data, size, out);
	direct(data, size, out);
	container(data, size);
	/* What the encoder makes of these bytes must decode to them. */
	{
		struct codec_params p = { .dtype = (enum codec_dtype)(data[0] % CODEC_DT_COUNT) };
		size_t cap = codec_chunk_bound(size), len, got, used;
		uint8_t *frame = malloc(cap);

		if (frame && codec_chunk_encode(data, size, codec_by_id(data[0] % (CODEC_COUNT + 1)),
						&p, frame, cap, &len) == 0 &&
		    size <= RAW_MAX) {
			if (codec_chunk_decode(frame, len, out, size, &got, &used) != 0 ||
			    got != size || memcmp(out, data, size) != 0)
				abort();
		}
		free(frame);
	}
	return 0;
}
