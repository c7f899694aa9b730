/* The zstd codec: one zstd frame per chunk. */
#include <errno.h>

#include "common/codec.h"
#include "common/codec_zs.h"

/* zstd -1's level: the baseline BENCH.md compares against. */
#define ZSTD_DEFAULT_LEVEL 1

static int zstd_compress(const void *in, size_t n, void *out, size_t cap, size_t *outlen,
			 const struct codec_params *p)
{
	int level = p && p->level ? p->level : ZSTD_DEFAULT_LEVEL;

	return codec_zs_compress(in, n, out, cap, outlen, level);
}

static int zstd_decompress(const void *in, size_t n, void *out, size_t cap, size_t *outlen)
{
	int rc = codec_zs_decompress(in, n, out, cap);

	if (rc == 0)
		*outlen = cap;
	return rc;
}

const struct codec_ops codec_zstd_ops = {
	.name = "zstd",
	.id = CODEC_ZSTD,
	.bound = codec_zs_bound,
	.compress = zstd_compress,
	.decompress = zstd_decompress,
};
