/* What a receiver already holds of an offer: the chunks of the offered
 * manifest that one of its published copies has too, so that the sender
 * leaves them out and the receiver copies them from its own disk.
 *
 * Chunk numbers. The chunks of an offer are numbered from 0 in manifest
 * order over its files with data: a file larger than one chunk has one
 * number per manifest chunk, any other file with data a single number (its
 * one chunk's digest is the file's digest). MSG_WANT's K_HELD is a bitmap
 * over these numbers (docs/PROTOCOL.md).
 *
 * Where it looks: the published copies under replica_root, in the order
 * most likely to hold the chunks: ORIGIN/JOB's other steps newest first
 * (the previous step of the same files, usually), then ORIGIN's other jobs,
 * then every other origin's copies; at most HAVE_MAX_COPIES of them, and
 * outside ORIGIN/JOB only while they keep giving (HAVE_DRY). A chunk
 * is matched by its XXH3-128 alone; whatever chunk size the copy was hashed
 * with. Nothing is read but manifests: the bytes are checked against the
 * offer's digests as the receiver copies them (repl_recv.c).
 *
 * Memory: about 70 bytes per chunk of the offer, at most HAVE_MAX_CHUNKS of
 * them (17 MiB); chunks beyond are simply sent.
 */
#ifndef STAGE_REPL_HAVE_H
#define STAGE_REPL_HAVE_H

#include <stddef.h>
#include <stdint.h>

#define HAVE_MAX_CHUNKS (1u << 18)   /* 1 TiB of offer at 4 MiB chunks */
#define HAVE_MAX_COPIES 128
#define HAVE_DRY 4                   /* copies in a row giving nothing end the search */

struct have;

/* Plans the offer in st_fd/name (a complete manifest) of ORIGIN/JOB (of
 * any step: an older copy of the same step is a source like another):
 * chunks that end after the resume point (entry from_idx, byte from_off)
 * and that a copy under rr_fd (replica_root) holds. 0 with *out (NULL when
 * nothing is held), or -errno. */
int have_plan(struct have **out, int rr_fd, int st_fd, const char *name, const char *origin,
	      const char *job, uint64_t from_idx, uint64_t from_off);
/* The K_HELD bitmap: bit n (byte n / 8, value 1 << n % 8) set when chunk n
 * is held. */
const uint8_t *have_bits(const struct have *h, size_t *len);
/* How many chunks are held. */
uint64_t have_count(const struct have *h);
/* Where chunk n is held: 0 with *path (relative to replica_root, owned by
 * h) and *off (the chunk's first byte in that file), or -ENOENT. */
int have_source(const struct have *h, uint64_t n, const char **path, uint64_t *off);
void have_free(struct have *h);

/* Whether bit n of a K_HELD bitmap of len bytes is set (sender side). */
static inline int have_bit(const uint8_t *bits, size_t len, uint64_t n)
{
	return n / 8 < len && (bits[n / 8] >> (n % 8)) & 1;
}

#endif
