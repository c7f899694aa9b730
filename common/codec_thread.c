/* Each codec keeps per-thread scratch (buffers, zstd contexts); a thread
 * that used any codec releases all of it here before it ends. Apart from the
 * codec table, which the codecs themselves call into. */
#include "common/codec.h"
#include "common/codec_chunk.h"
#include "common/codec_float.h"
#include "common/codec_zs.h"

void codec_thread_end(void)
{
	codec_chunk_enc_thread_end();
	codec_float_enc_thread_end();
	codec_float_dec_thread_end();
	codec_zs_c_thread_end();
	codec_zs_d_thread_end();
}
