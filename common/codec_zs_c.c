/* zstd compression with a context kept per thread: a fresh one per 4 MiB
 * chunk costs its tables' allocation and zeroing every time. */
#include <errno.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "common/codec_zs.h"

static _Thread_local ZSTD_CCtx *cctx;

size_t codec_zs_bound(size_t n)
{
	return ZSTD_compressBound(n);
}

int codec_zs_compress(const void *in, size_t n, void *out, size_t cap, size_t *outlen, int level)
{
	size_t r;

	if (!cctx && !(cctx = ZSTD_createCCtx()))
		return -ENOMEM;
	r = ZSTD_compressCCtx(cctx, out, cap, in, n, level);
	if (ZSTD_isError(r))
		return ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall ? -ENOSPC : -EIO;
	*outlen = r;
	return 0;
}

void codec_zs_c_thread_end(void)
{
	ZSTD_freeCCtx(cctx);
	cctx = NULL;
}
