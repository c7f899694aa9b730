/* common/codec*.c: every codec round-trips edge cases, the float codec on
 * its own (no fallback to hide behind), damaged frames and containers are
 * refused with -EBADMSG, the decode without the digest check, and dtype
 * detection. */
#include <errno.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/codec.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

/* Twelve uniforms summed (Irwin-Hall): close enough to a Gaussian for
 * compression, and no libm to link. */
static double gauss(double sigma)
{
	double s = -6.0;

	for (int i = 0; i < 12; i++)
		s += (double)(rnd() >> 11) / 9007199254740992.0;
	return sigma * s;
}

static void fill_gauss(uint8_t *b, size_t n, enum codec_dtype dt)
{
	size_t es = codec_dtype_size(dt);

	for (size_t i = 0; i + es <= n; i += es) {
		float f = (float)gauss(0.02);
		uint32_t u;

		memcpy(&u, &f, 4);
		if (es == 4) {
			memcpy(b + i, &u, 4);
		} else {
			uint16_t h = (uint16_t)(u >> 16);

			memcpy(b + i, &h, 2);
		}
	}
	for (size_t i = n / es * es; i < n; i++)
		b[i] = (uint8_t)rnd();
}

static void fill_random(uint8_t *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)rnd();
}

/* NaNs (quiet, signalling, with payloads), infinities, zeros of both signs,
 * subnormals, max and min normals: each dtype's bit patterns repeated. */
static void fill_special(uint8_t *b, size_t n, enum codec_dtype dt)
{
	static const uint32_t f32[] = { 0x7fc00000, 0x7f800001, 0xffc12345, 0x7f800000,
					0xff800000, 0x00000000, 0x80000000, 0x00000001,
					0x807fffff, 0x7f7fffff, 0x00800000, 0x3f800000 };
	static const uint16_t f16[] = { 0x7e00, 0x7c01, 0xfe12, 0x7c00, 0xfc00, 0x0000,
					0x8000, 0x0001, 0x83ff, 0x7bff, 0x0400, 0x3c00 };
	static const uint16_t bf16[] = { 0x7fc0, 0x7f81, 0xffc1, 0x7f80, 0xff80, 0x0000,
					 0x8000, 0x0001, 0x807f, 0x7f7f, 0x0080, 0x3f80 };
	size_t es = codec_dtype_size(dt);

	for (size_t i = 0, k = 0; i + es <= n; i += es, k = (k + 1 + (rnd() & 3)) % 12) {
		if (dt == CODEC_DT_F32)
			memcpy(b + i, &f32[k], 4);
		else
			memcpy(b + i, dt == CODEC_DT_F16 ? &f16[k] : &bf16[k], 2);
	}
	for (size_t i = n / es * es; i < n; i++)
		b[i] = 0xff;
}

/* Through the chunk frame with codec `want` (NULL: auto). */
static void round_trip(const uint8_t *raw, size_t n, const struct codec_ops *want,
		       enum codec_dtype dt)
{
	struct codec_params p = { .dtype = dt };
	size_t cap = codec_chunk_bound(n), len, got, used;
	uint8_t *frame = malloc(cap), *back = malloc(n + 1);

	assert_non_null(frame);
	assert_non_null(back);
	assert_int_equal(codec_chunk_encode(raw, n, want, &p, frame, cap, &len), 0);
	assert_true(len <= CODEC_CHUNK_HDR + n);
	assert_int_equal(codec_chunk_decode(frame, len, back, n, &got, &used), 0);
	assert_int_equal(got, n);
	assert_int_equal(used, len);
	assert_true(n == 0 || memcmp(raw, back, n) == 0);
	/* One byte short is never a frame. */
	if (len > 0)
		assert_int_equal(codec_chunk_decode(frame, len - 1, back, n, &got, &used),
				 -EBADMSG);
	free(back);
	free(frame);
}

/* The float codec alone: its output must decode exactly even where the
 * frame would have preferred another codec. */
static void float_direct(const uint8_t *raw, size_t n, enum codec_dtype dt)
{
	struct codec_params p = { .dtype = dt };
	size_t cap = codec_float_ops.bound(n), len, got;
	uint8_t *out = malloc(cap), *back = malloc(n + 1);

	assert_int_equal(codec_float_ops.compress(raw, n, out, cap, &len, &p), 0);
	assert_true(len <= cap);
	assert_int_equal(codec_float_ops.decompress(out, len, back, n, &got), 0);
	assert_int_equal(got, n);
	assert_true(n == 0 || memcmp(raw, back, n) == 0);
	/* The raw length is part of the payload: another one is refused. */
	assert_int_equal(codec_float_ops.decompress(out, len, back, n + 1, &got), -EBADMSG);
	free(back);
	free(out);
}

static const size_t sizes[] = { 0, 1, 2, 3, 4, 5, 7, 63, 64, 65, 127, 1001, 4096, 65537,
				300001 };

static void all_codecs(const uint8_t *raw, size_t n, enum codec_dtype dt)
{
	round_trip(raw, n, NULL, dt);
	for (unsigned id = 0; id < CODEC_COUNT; id++)
		round_trip(raw, n, codec_by_id(id), dt);
	if (dt != CODEC_DT_BYTES)
		float_direct(raw, n, dt);
}

static void test_table(void **state)
{
	assert_ptr_equal(codec_find("none"), &codec_none_ops);
	assert_ptr_equal(codec_find("zstd"), &codec_zstd_ops);
	assert_ptr_equal(codec_find("float"), &codec_float_ops);
	assert_null(codec_find("lz4"));
	for (unsigned id = 0; id < CODEC_COUNT; id++)
		assert_int_equal(codec_by_id(id)->id, id);
	assert_null(codec_by_id(CODEC_COUNT));
	assert_null(codec_by_id(255));
}

static void test_round_trip_random_zero(void **state)
{
	uint8_t *b = malloc(300001);

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		for (int dt = 0; dt < CODEC_DT_COUNT; dt++) {
			fill_random(b, sizes[i]);
			all_codecs(b, sizes[i], (enum codec_dtype)dt);
			memset(b, 0, sizes[i]);
			all_codecs(b, sizes[i], (enum codec_dtype)dt);
		}
	free(b);
}

static void test_round_trip_special(void **state)
{
	uint8_t *b = malloc(300001);

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		for (int dt = 1; dt < CODEC_DT_COUNT; dt++) {
			fill_special(b, sizes[i], (enum codec_dtype)dt);
			all_codecs(b, sizes[i], (enum codec_dtype)dt);
			/* The type guessed wrong must cost ratio, never bytes. */
			all_codecs(b, sizes[i], (enum codec_dtype)(dt % 3 + 1));
		}
	free(b);
}

static void test_round_trip_gauss(void **state)
{
	size_t n = 1 << 20;
	uint8_t *b = malloc(n + 3), *frame = malloc(codec_chunk_bound(n));
	struct codec_params p = { .dtype = CODEC_DT_BF16 };
	size_t len;

	for (int dt = 1; dt < CODEC_DT_COUNT; dt++) {
		fill_gauss(b, n + 3, (enum codec_dtype)dt);
		all_codecs(b, n + 3, (enum codec_dtype)dt);
		all_codecs(b, n + 1, (enum codec_dtype)dt);
	}
	/* And it wins where it should: bf16 weights shrink past 1.45x, their
	 * exponents coded as nibbles (plane 0's mode, docs/CODEC.md). */
	fill_gauss(b, n, CODEC_DT_BF16);
	assert_int_equal(codec_chunk_encode(b, n, NULL, &p, frame, codec_chunk_bound(n), &len), 0);
	assert_int_equal(frame[0], CODEC_FLOAT);
	assert_int_equal(frame[CODEC_CHUNK_HDR + 6], 2);
	assert_true((double)n / (double)len > 1.45);
	free(frame);
	free(b);
}

/* Weights with a NaN, an infinity or a subnormal here and there: exponents
 * outside the nibble range go to the escapes, which must come back in place. */
static void test_escapes(void **state)
{
	static const uint32_t f32[] = { 0x7fc00000, 0xff800000, 0x00000001, 0x80000000 };
	static const uint16_t h16[] = { 0x7fc0, 0xff80, 0x0001, 0x8000 };
	size_t n = 1 << 18;
	uint8_t *b = malloc(n + 1), *frame = malloc(codec_chunk_bound(n + 1));
	size_t len;

	for (int dt = 1; dt < CODEC_DT_COUNT; dt++) {
		struct codec_params p = { .dtype = (enum codec_dtype)dt };
		size_t es = codec_dtype_size(p.dtype);

		fill_gauss(b, n + 1, p.dtype);
		for (size_t i = 0, k = 0; i + es <= n; i += es * (500 + rnd() % 1000), k++)
			memcpy(b + i, es == 4 ? (const void *)&f32[k % 4] : (const void *)&h16[k % 4],
			       es);
		all_codecs(b, n + 1, p.dtype);
		assert_int_equal(codec_chunk_encode(b, n + 1, &codec_float_ops, &p, frame,
						    codec_chunk_bound(n + 1), &len), 0);
		assert_int_equal(frame[0], CODEC_FLOAT);
		assert_int_equal(frame[CODEC_CHUNK_HDR + 6], 2);
	}
	free(frame);
	free(b);
}

/* The frame tests' bytes: bf16 noise, framed by one codec after another. */
struct framed {
	size_t n, cap, len;
	uint8_t *raw, *frame, *back;
};

static void framed_open(struct framed *f)
{
	f->n = 100003;
	f->cap = codec_chunk_bound(f->n);
	f->raw = malloc(f->n);
	f->frame = malloc(f->cap);
	f->back = malloc(f->n);
	assert_true(f->raw && f->frame && f->back);
}

/* Fresh noise in raw (unless again), framed by codec id into frame (len),
 * with its digest or, no_sum, without. */
static void framed_encode(struct framed *f, unsigned id, bool again, bool no_sum)
{
	struct codec_params p = { .dtype = CODEC_DT_BF16, .no_sum = no_sum };

	if (!again)
		fill_gauss(f->raw, f->n, CODEC_DT_BF16);
	assert_int_equal(codec_chunk_encode(f->raw, f->n, codec_by_id(id), &p, f->frame, f->cap,
					    &f->len), 0);
}

static void framed_close(struct framed *f)
{
	free(f->back);
	free(f->frame);
	free(f->raw);
}

/* Every one-byte change of a frame is refused or decodes to the same bytes:
 * never wrong output accepted, never a crash. */
static void test_corrupt_frames(void **state)
{
	struct framed f;

	framed_open(&f);
	for (unsigned id = 0; id < CODEC_COUNT; id++) {
		size_t n = f.n, len, got, used;
		uint8_t *raw = f.raw, *frame = f.frame, *back = f.back;

		framed_encode(&f, id, false, false);
		len = f.len;
		assert_int_equal(frame[0], id);
		for (size_t i = 0; i < len; i += i < 64 ? 1 : 97) {
			for (int bit = 0; bit < 8; bit += 3) {
				int rc;

				frame[i] ^= (uint8_t)(1u << bit);
				rc = codec_chunk_decode(frame, len, back, n, &got, &used);
				frame[i] ^= (uint8_t)(1u << bit);
				if (i < CODEC_CHUNK_HDR)
					assert_int_equal(rc, -EBADMSG);
				else if (rc != -EBADMSG)
					assert_true(rc == 0 && memcmp(raw, back, n) == 0);
			}
		}
		for (size_t cut = 0; cut < len; cut += len / 7 + 1)
			assert_int_equal(codec_chunk_decode(frame, cut, back, n, &got, &used),
					 -EBADMSG);
		/* A buffer too small for the raw length is not overrun. */
		assert_int_equal(codec_chunk_decode(frame, len, back, n - 1, &got, &used), -ENOSPC);
	}
	framed_close(&f);
}

static void test_detect(void **state)
{
	static const char hdr[] =
		"{\"__metadata__\":{\"format\":\"pt\"},"
		"\"a.weight\":{\"dtype\":\"BF16\",\"shape\":[1024,1024],\"data_offsets\":[0,2097152]},"
		"\"b.bias\":{\"dtype\":\"F32\", \"shape\":[1024],\"data_offsets\":[2097152,2101248]}}";
	size_t n = 1 << 20;
	uint8_t *b = calloc(1, n);
	uint64_t hl = sizeof(hdr) - 1;

	memcpy(b, &hl, 8);
	memcpy(b + 8, hdr, hl);
	assert_int_equal(codec_detect_dtype(b, n, 8 + hl + 2101248), CODEC_DT_BF16);
	/* A header longer than the file is no safetensors header. */
	assert_int_equal(codec_detect_dtype(b, n, 100), CODEC_DT_BYTES);
	fill_gauss(b, n, CODEC_DT_F32);
	assert_int_equal(codec_detect_dtype(b, n, n), CODEC_DT_F32);
	fill_gauss(b, n, CODEC_DT_BF16);
	assert_int_equal(codec_detect_dtype(b, n, n), CODEC_DT_BF16);
	fill_random(b, n);
	assert_int_equal(codec_detect_dtype(b, n, n), CODEC_DT_BYTES);
	assert_int_equal(codec_detect_dtype(b, 3, 3), CODEC_DT_BYTES);
	free(b);
}

static FILE *file_of(const uint8_t *b, size_t n)
{
	FILE *f = tmpfile();

	assert_non_null(f);
	assert_int_equal(fwrite(b, 1, n, f), n);
	rewind(f);
	return f;
}

static uint8_t *slurp(FILE *f, size_t *n)
{
	long sz;
	uint8_t *b;

	assert_int_equal(fseek(f, 0, SEEK_END), 0);
	sz = ftell(f);
	rewind(f);
	b = malloc((size_t)sz + 1);
	assert_int_equal(fread(b, 1, (size_t)sz, f), (size_t)sz);
	*n = (size_t)sz;
	return b;
}

static void test_container(void **state)
{
	size_t n = 3 * 65536 + 12345, clen, dlen;
	uint8_t *raw = malloc(n), *comp, *back;
	struct codec_stats st;

	/* Gaussian, then random, then zeros: every codec gets a chunk. */
	fill_gauss(raw, n / 3, CODEC_DT_BF16);
	fill_random(raw + n / 3, n / 3);
	memset(raw + 2 * (n / 3), 0, n - 2 * (n / 3));
	for (unsigned want = 0; want <= CODEC_COUNT; want++) {
		FILE *in = file_of(raw, n), *out = tmpfile(), *dec = tmpfile();

		assert_int_equal(codec_file_compress(in, out, codec_by_id(want), CODEC_DT_COUNT,
						     65536, &st), 0);
		assert_int_equal(st.raw_bytes, n);
		assert_int_equal(st.dtype, CODEC_DT_BF16);
		rewind(out);
		assert_int_equal(codec_file_decompress(out, dec, &st), 0);
		assert_int_equal(st.raw_bytes, n);
		back = slurp(dec, &dlen);
		assert_int_equal(dlen, n);
		assert_memory_equal(raw, back, n);
		free(back);

		/* Damaged, truncated, or with bytes after the trailer: refused. */
		comp = slurp(out, &clen);
		for (size_t i = 0; i < clen; i += 1 + clen / 61) {
			FILE *bad, *sink = fopen("/dev/null", "wb");

			comp[i] ^= 0x20;
			bad = file_of(comp, clen);
			assert_int_equal(codec_file_decompress(bad, sink, &st), -EBADMSG);
			comp[i] ^= 0x20;
			fclose(bad);
			bad = file_of(comp, i);
			assert_int_equal(codec_file_decompress(bad, sink, &st), -EBADMSG);
			fclose(bad);
			fclose(sink);
		}
		comp = realloc(comp, clen + 1);
		comp[clen] = 0;
		{
			FILE *bad = file_of(comp, clen + 1), *sink = fopen("/dev/null", "wb");

			assert_int_equal(codec_file_decompress(bad, sink, &st), -EBADMSG);
			fclose(bad);
			fclose(sink);
		}
		free(comp);
		fclose(dec);
		fclose(out);
		fclose(in);
	}
	free(raw);
}

static void test_container_empty(void **state)
{
	FILE *in = tmpfile(), *out = tmpfile(), *dec = tmpfile();
	struct codec_stats st;
	size_t n;
	uint8_t *b;

	assert_int_equal(codec_file_compress(in, out, NULL, CODEC_DT_COUNT, 0, &st), 0);
	rewind(out);
	assert_int_equal(codec_file_decompress(out, dec, &st), 0);
	b = slurp(dec, &n);
	assert_int_equal(n, 0);
	free(b);
	fclose(dec);
	fclose(out);
	fclose(in);
}

/* A raw frame made where its bytes lie (codec_chunk_raw_hdr, the piece
 * sender's way) is the frame codec_chunk_encode makes with codec none, byte
 * for byte, and decodes back; a flipped byte is caught. */
static void test_raw_hdr_in_place(void **state)
{
	size_t lens[] = { 0, 1, 4095, 1u << 20 };

	for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
		size_t n = lens[k], flen, used, got;
		uint8_t *room = malloc(CODEC_CHUNK_HDR + n + 1), *frame = malloc(codec_chunk_bound(n));
		uint8_t *back = malloc(n + 1);
		struct codec_params cp = { .dtype = CODEC_DT_BYTES };

		for (size_t i = 0; i < n; i++)
			room[CODEC_CHUNK_HDR + i] = (uint8_t)(i * 131 + k);
		codec_chunk_raw_hdr(room + CODEC_CHUNK_HDR, n, NULL, room);
		assert_int_equal(codec_chunk_encode(room + CODEC_CHUNK_HDR, n, &codec_none_ops, &cp,
						    frame, codec_chunk_bound(n), &flen), 0);
		assert_int_equal(flen, CODEC_CHUNK_HDR + n);
		assert_memory_equal(room, frame, flen);
		assert_int_equal(codec_chunk_decode(room, flen, back, n + 1, &got, &used), 0);
		assert_int_equal(got, n);
		assert_int_equal(used, flen);
		if (n) {
			struct codec_params ns = { .dtype = CODEC_DT_BYTES, .no_sum = true };

			assert_memory_equal(back, room + CODEC_CHUNK_HDR, n);
			/* Without the digest: the same frame but for its 0 there. */
			codec_chunk_raw_hdr(room + CODEC_CHUNK_HDR, n, &ns, room);
			assert_memory_equal(room, frame, 16);
			for (int i = 16; i < 24; i++)
				assert_int_equal(room[i], 0);
			assert_int_equal(codec_chunk_decode_unchecked(room, flen, back, n + 1, &got,
								      &used), 0);
			assert_memory_equal(back, room + CODEC_CHUNK_HDR, n);
			codec_chunk_raw_hdr(room + CODEC_CHUNK_HDR, n, NULL, room);
			room[CODEC_CHUNK_HDR + n / 2] ^= 0x10;
			assert_int_not_equal(codec_chunk_decode(room, flen, back, n + 1, &got, &used), 0);
		}
		free(room);
		free(frame);
		free(back);
	}
}

/* Decoding without the digest (for a caller that checks the bytes against
 * digests of its own): the same bytes as the checked decode for every
 * codec; a frame whose digest field is wrong, or left 0 by an encoder told
 * no_sum, is handed back as decoded, where the checked decode refuses it;
 * a broken header, a cut frame, a payload that does not decode and a
 * buffer too small are refused all the same. */
static void test_unchecked(void **state)
{
	struct framed f;

	framed_open(&f);
	for (unsigned id = 0; id < CODEC_COUNT; id++) {
		size_t n = f.n, len, got, used;
		uint8_t *raw = f.raw, *frame = f.frame, *back = f.back;

		framed_encode(&f, id, false, false);
		len = f.len;
		memset(back, 0, n);
		assert_int_equal(codec_chunk_decode_unchecked(frame, len, back, n, &got, &used), 0);
		assert_int_equal(got, n);
		assert_int_equal(used, len);
		assert_memory_equal(back, raw, n);
		frame[16] ^= 1;         /* the digest of the raw bytes */
		assert_int_equal(codec_chunk_decode(frame, len, back, n, &got, &used), -EBADMSG);
		memset(back, 0, n);
		assert_int_equal(codec_chunk_decode_unchecked(frame, len, back, n, &got, &used), 0);
		assert_memory_equal(back, raw, n);
		frame[16] ^= 1;
		frame[5] ^= 1;          /* the raw length: the header's check fails */
		assert_int_equal(codec_chunk_decode_unchecked(frame, len, back, n, &got, &used),
				 -EBADMSG);
		frame[5] ^= 1;
		assert_int_equal(codec_chunk_decode_unchecked(frame, len - 1, back, n, &got, &used),
				 -EBADMSG);
		assert_int_equal(codec_chunk_decode_unchecked(frame, len, back, n - 1, &got, &used),
				 -ENOSPC);
		/* Framed without the digest (no_sum): 0 there, the same bytes
		 * back unchecked, refused checked. */
		framed_encode(&f, id, true, true);
		len = f.len;
		for (int k = 16; k < 24; k++)
			assert_int_equal(frame[k], 0);
		assert_int_equal(codec_chunk_decode(frame, len, back, n, &got, &used), -EBADMSG);
		memset(back, 0, n);
		assert_int_equal(codec_chunk_decode_unchecked(frame, len, back, n, &got, &used), 0);
		assert_memory_equal(back, raw, n);
		if (id != CODEC_NONE) {         /* a payload its codec cannot decode */
			memset(frame + CODEC_CHUNK_HDR, 0xa5, len - CODEC_CHUNK_HDR);
			assert_int_equal(codec_chunk_decode_unchecked(frame, len, back, n, &got,
								      &used), -EBADMSG);
		}
	}
	framed_close(&f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table),
		cmocka_unit_test(test_round_trip_random_zero),
		cmocka_unit_test(test_round_trip_special),
		cmocka_unit_test(test_round_trip_gauss),
		cmocka_unit_test(test_escapes),
		cmocka_unit_test(test_corrupt_frames),
		cmocka_unit_test(test_unchecked),
		cmocka_unit_test(test_detect),
		cmocka_unit_test(test_container),
		cmocka_unit_test(test_container_empty),
		cmocka_unit_test(test_raw_hdr_in_place),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
