/* Codecs (none, zstd, float) as a table of function pointers, the per-chunk
 * frame that carries any of them, and the `stage codec` file container.
 * docs/CODEC.md has the byte layouts.
 *
 * Callers hold a `const struct codec_ops *` and never ask which codec it is.
 * Every function returns 0 or a negative errno; bytes that do not decode
 * (bad lengths, bad payload, digest mismatch) are -EBADMSG, a buffer too
 * small is -ENOSPC. Decoders trust nothing they read: the fuzz target
 * tests/fuzz/fuzz_codec.c feeds them arbitrary bytes. */
#ifndef STAGE_CODEC_H
#define STAGE_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum codec_id {
	CODEC_NONE = 0,
	CODEC_ZSTD = 1,
	CODEC_FLOAT = 2,
	CODEC_COUNT
};

/* What the bytes hold; the float codec splits elements into byte planes. */
enum codec_dtype {
	CODEC_DT_BYTES = 0,
	CODEC_DT_BF16 = 1,
	CODEC_DT_F16 = 2,
	CODEC_DT_F32 = 3,
	CODEC_DT_COUNT
};

#define CODEC_CHUNK_DEFAULT (4u << 20)
/* No header may make a decoder allocate more than this for one chunk. */
#define CODEC_CHUNK_MAX     (64u << 20)

struct codec_params {
	enum codec_dtype dtype;     /* the float codec needs it; others ignore it */
	int level;                  /* zstd level; 0 means the codec's default */
	bool no_sum;                /* chunk frames: the raw digest left 0, for a reader
				     * that said it checks the bytes against digests of
				     * its own (codec_chunk_decode_unchecked) */
};

struct codec_ops {
	const char *name;
	uint8_t id;                 /* enum codec_id, as written in chunk headers */
	/* Worst-case compressed size of n input bytes. */
	size_t (*bound)(size_t n);
	int (*compress)(const void *in, size_t n, void *out, size_t cap, size_t *outlen,
			const struct codec_params *p);
	/* Must produce exactly cap bytes or fail: the frame knows the raw length. */
	int (*decompress)(const void *in, size_t n, void *out, size_t cap, size_t *outlen);
};

extern const struct codec_ops codec_none_ops;
extern const struct codec_ops codec_zstd_ops;
extern const struct codec_ops codec_float_ops;

/* Codecs keep scratch buffers and zstd contexts per thread, reused from
 * call to call; a thread that is about to exit releases its own with this. */
void codec_thread_end(void);

/* NULL when unknown. */
const struct codec_ops *codec_find(const char *name);
const struct codec_ops *codec_by_id(unsigned id);
const char *codec_dtype_name(enum codec_dtype dt);
/* Inline: the codecs call it, and they sit below the table's file. */
static inline size_t codec_dtype_size(enum codec_dtype dt)
{
	return dt == CODEC_DT_F32 ? 4 : dt == CODEC_DT_BF16 || dt == CODEC_DT_F16 ? 2 : 1;
}

/* ---- chunk frame (codec_chunk_enc.c, codec_chunk_dec.c) ---- */

#define CODEC_CHUNK_HDR 24

struct codec_chunk_hdr {
	uint8_t codec;              /* enum codec_id */
	uint8_t dtype;              /* enum codec_dtype */
	uint32_t raw_len;           /* <= CODEC_CHUNK_MAX */
	uint32_t comp_len;          /* payload bytes after the header */
	uint64_t digest;            /* XXH3-64 of the raw bytes */
};

/* Room that codec_chunk_encode may need for n raw bytes. */
size_t codec_chunk_bound(size_t n);
/* Frames n <= CODEC_CHUNK_MAX bytes. want: the codec asked for, or NULL for
 * the best for the data. Whatever is asked, a chunk the codec does not
 * shrink is stored with the next simpler one (float -> zstd -> none), so a
 * chunk never grows by more than its header. */
int codec_chunk_encode(const void *in, size_t n, const struct codec_ops *want,
		       const struct codec_params *p, void *out, size_t cap, size_t *outlen);
/* The header of n raw bytes at in sent as they are (codec none), written
 * to hdr: the frame is hdr then the n bytes, so a caller with room before
 * its bytes frames them where they lie, without copying them. p: NULL, or
 * its no_sum. */
void codec_chunk_raw_hdr(const void *in, size_t n, const struct codec_params *p,
			 uint8_t hdr[CODEC_CHUNK_HDR]);
/* Parses and checks a header (n >= CODEC_CHUNK_HDR bytes at in). */
int codec_chunk_parse_hdr(const void *in, size_t n, struct codec_chunk_hdr *h);
/* Decodes one frame from in[0..n): *used is the frame's size, *outlen the raw
 * length. The raw bytes are checked against the digest before 0 is returned. */
int codec_chunk_decode(const void *in, size_t n, void *out, size_t cap, size_t *outlen,
		       size_t *used);
/* codec_chunk_decode without the digest check, for a caller that checks
 * every byte it is handed against digests of its own before it keeps them
 * (the chunk-checked builder, against a manifest's XXH3-128): one pass over
 * the bytes fewer. The header, the lengths and the codec's own checks stay;
 * bytes that do not match the frame's digest are handed back as decoded. */
int codec_chunk_decode_unchecked(const void *in, size_t n, void *out, size_t cap,
				 size_t *outlen, size_t *used);

/* ---- dtype detection (codec_dtype.c) ---- */

/* From a safetensors header if buf starts like one (the dtype holding the
 * most bytes), else by trial compression of buf. buf is the file's first
 * chunk; file_size bounds the safetensors header length. */
enum codec_dtype codec_detect_dtype(const void *buf, size_t n, uint64_t file_size);

/* ---- file container (codec_file_w.c, codec_file_r.c) ---- */

struct codec_stats {
	uint64_t raw_bytes;
	uint64_t comp_bytes;        /* the whole container */
	uint64_t chunks[CODEC_COUNT];   /* chunks stored with each codec */
	enum codec_dtype dtype;
};

/* want NULL: best per chunk. chunk_size 0: CODEC_CHUNK_DEFAULT. dtype
 * CODEC_DT_COUNT: detect it. */
int codec_file_compress(FILE *in, FILE *out, const struct codec_ops *want,
			enum codec_dtype dtype, size_t chunk_size, struct codec_stats *st);
/* -EBADMSG for anything that is not a whole, intact container. */
int codec_file_decompress(FILE *in, FILE *out, struct codec_stats *st);

#endif
