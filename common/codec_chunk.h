/* The chunk header's byte layout, shared by the frame's encoder and decoder. */
#ifndef STAGE_CODEC_CHUNK_H
#define STAGE_CODEC_CHUNK_H

#include <stdint.h>
#include <xxhash.h>

/* The encoder's per-thread scratch; codec_thread_end calls this. */
void codec_chunk_enc_thread_end(void);

static inline void chunk_put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t chunk_get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void chunk_put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t chunk_get64(const uint8_t *p)
{
	return (uint64_t)chunk_get32(p) | (uint64_t)chunk_get32(p + 4) << 32;
}

/* Bytes 12..15: a check of bytes 0..11, so a damaged length is told apart
 * from a damaged payload and never sends a reader off into the data. */
static inline uint32_t chunk_hdr_check(const uint8_t *p)
{
	return (uint32_t)XXH3_64bits(p, 12);
}

#endif
