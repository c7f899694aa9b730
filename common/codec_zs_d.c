/* zstd decompression with a context kept per thread. */
#include <errno.h>
#include <zstd.h>

#include "common/codec_zs.h"

static _Thread_local ZSTD_DCtx *dctx;

int codec_zs_decompress(const void *in, size_t n, void *out, size_t cap)
{
	unsigned long long want = ZSTD_getFrameContentSize(in, n);
	size_t r;

	/* Our frames always state their size: one that does not, or states
	 * another, is not ours, and must not make us decode into a guess. */
	if (want != cap)
		return -EBADMSG;
	if (!dctx && !(dctx = ZSTD_createDCtx()))
		return -ENOMEM;
	r = ZSTD_decompressDCtx(dctx, out, cap, in, n);
	if (ZSTD_isError(r) || r != cap)
		return -EBADMSG;
	return 0;
}

void codec_zs_d_thread_end(void)
{
	ZSTD_freeDCtx(dctx);
	dctx = NULL;
}
