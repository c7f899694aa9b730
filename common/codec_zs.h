/* libzstd behind one context per thread, shared by the zstd codec and the
 * float codec's planes. Public API only (see docs/CODEC.md for why). */
#ifndef STAGE_CODEC_ZS_H
#define STAGE_CODEC_ZS_H

#include <stddef.h>

/* A level for the float codec's planes: fast, still Huffman-codes literals. */
#define CODEC_ZS_PLANE_LEVEL 1

size_t codec_zs_bound(size_t n);
/* 0 and *outlen, or -ENOSPC/-EIO. */
int codec_zs_compress(const void *in, size_t n, void *out, size_t cap, size_t *outlen, int level);
/* Succeeds only if the frame is whole and holds exactly cap bytes. */
int codec_zs_decompress(const void *in, size_t n, void *out, size_t cap);
/* Each thread's cached contexts; codec_thread_end calls these. */
void codec_zs_c_thread_end(void);
void codec_zs_d_thread_end(void);

#endif
