/* The codec table, and the "none" codec, which every other one falls back to. */
#include <errno.h>
#include <string.h>

#include "common/codec.h"
#include "common/codec_float.h"

static size_t none_bound(size_t n)
{
	return n;
}

static int none_compress(const void *in, size_t n, void *out, size_t cap, size_t *outlen,
			 const struct codec_params *p)
{
	if (n > cap)
		return -ENOSPC;
	if (n)
		memcpy(out, in, n);
	*outlen = n;
	return 0;
}

static int none_decompress(const void *in, size_t n, void *out, size_t cap, size_t *outlen)
{
	if (n != cap)
		return -EBADMSG;
	if (n)
		memcpy(out, in, n);
	*outlen = n;
	return 0;
}

const struct codec_ops codec_none_ops = {
	.name = "none",
	.id = CODEC_NONE,
	.bound = none_bound,
	.compress = none_compress,
	.decompress = none_decompress,
};

/* The float codec's two halves live apart (codec_float_enc.c, _dec.c). */
const struct codec_ops codec_float_ops = {
	.name = "float",
	.id = CODEC_FLOAT,
	.bound = codec_float_bound,
	.compress = codec_float_compress,
	.decompress = codec_float_decompress,
};

static const struct codec_ops *const table[CODEC_COUNT] = {
	[CODEC_NONE] = &codec_none_ops,
	[CODEC_ZSTD] = &codec_zstd_ops,
	[CODEC_FLOAT] = &codec_float_ops,
};

const struct codec_ops *codec_find(const char *name)
{
	for (unsigned i = 0; i < CODEC_COUNT; i++)
		if (strcmp(table[i]->name, name) == 0)
			return table[i];
	return NULL;
}

const struct codec_ops *codec_by_id(unsigned id)
{
	return id < CODEC_COUNT ? table[id] : NULL;
}
