/* The chunk-checked builder: one file of a manifest written from pieces in
 * offset order, each chunk's XXH3-128 checked against the manifest as its
 * last byte arrives and before that byte is written, and the whole file's
 * digest checked at the end. The writes go through a write queue (wq.h), so
 * the next piece is received and hashed while the disk writes the last.
 *
 * The replication receiver builds every file it receives with it (pieces
 * from the sender, or from copies held here), restore every file it
 * rebuilds (pieces fetched from a holder, or intact local chunks). What a
 * caller does around it is its own: the receiver's journal and publication,
 * restore's temporary and rename.
 *
 * A file of one chunk (nchunks == 0 in the manifest) has no chunk digests:
 * its one chunk is checked against the file's digest. A file of chunks built
 * whole from its start (a replica's, a restore's first try) is checked twice
 * over, each chunk and then the whole: the manifest's root covers the files'
 * digests and not their chunks' (docs/MANIFEST.md), so it is the whole-file
 * digest that binds the bytes to the root the offer named; a manifest whose
 * chunk lines disagree with its file digests (a broken sender) is refused
 * by it. A repair in place (cbuild_skip_to) is checked chunk by chunk
 * only: the whole no longer passes through once; a file rewound to take
 * the rest from another source (cbuild_rewind) keeps its whole check. The piece that
 * completes a chunk is written only once the chunk matched, so the file
 * never holds a whole chunk that was not checked; after a failure
 * (cbuild_put's -EBADMSG, bad_chunk saying which) it holds checked chunks
 * and part of the bad one, and is to be dropped or resumed from a chunk
 * boundary.
 *
 * Use: cbuild_open; per file cbuild_begin, then cbuild_buf / fill it /
 * cbuild_put (and cbuild_skip_to, for a repair in place) until done, then
 * cbuild_end; cbuild_close.
 *
 * Chunks hashed by another thread: a thread that receives pieces may hash
 * their chunks itself (cbuild_hash, with a cbuild_hasher of its own) and
 * hand the builder the digests with the piece (cbuild_put_sums); the
 * builder's thread then hashes each byte once, for the whole-file digest,
 * and compares each chunk's digest as before, before the chunk's last byte
 * is written. A chunk is hashed by whoever receives its first byte: a
 * chunk begun without sums is hashed here to its end; one begun with sums
 * must get sums with every later piece of it (all of a chunk's pieces come
 * through one hasher), else the piece is refused (-EPROTO).
 *
 * Recording (cbuild_record, after cbuild_begin): the bytes are taken as
 * they come, and each chunk's digest and the whole file's are written into
 * an entry of the caller's instead of checked: a receiver that gets the
 * manifest after the data (docs/PROTOCOL.md, "Manifest last") compares
 * them with it at the end. Everything else (the writes, the rule on sums,
 * the rewind) is as when checking.
 */
#ifndef STAGE_CBUILD_H
#define STAGE_CBUILD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

#include "common/manifest.h"
#include "daemon/engine/wq.h"

/* Chunk ends one piece can hold: a buffer of chunks of the smallest size. */
#define CBUILD_SUMS_MAX (WQ_BUF / MF_CHUNK_MIN)

/* What a hasher found in one piece: the digest of each chunk that ends in
 * it, then of the part of a chunk it ends with. */
struct cbuild_sums {
	uint64_t off;                  /* the piece: offset in its file, length */
	size_t n;
	uint64_t cs;                   /* the chunk size it was cut at; 0: no sums */
	bool head;                     /* its first part was hashed from its chunk's start */
	unsigned nd;                   /* chunk ends inside it: offsets p, off < p <= off + n,
					* p a multiple of cs */
	digest_t d[CBUILD_SUMS_MAX + 1]; /* those chunks' digests in order, then the running
					  * digest at off + n (a file's last, short chunk) */
};

/* One thread's running chunk over the pieces it hashes, in file order. */
struct cbuild_hasher {
	XXH3_state_t *st;
	uint64_t idx, end;             /* the file and offset its last piece ended at */
	bool run;                      /* st holds the chunk at end from its start */
};

struct cbuild {
	struct wq wq;                  /* the writes; wq_sync / wq_durable are the caller's */
	XXH3_state_t *whole, *chunk;
	XXH3_state_t *mark;            /* whole at mark_at (cbuild.c) */
	uint64_t mark_at;              /* UINT64_MAX: no mark */
	uint64_t hashed;               /* bytes whole has taken (past at after a failed put) */
	const struct mf_entry *e;      /* borrowed, between begin and end */
	uint64_t chunk_size;
	uint64_t at;                   /* bytes taken: the offset the next piece is for */
	uint64_t chunk_no;             /* the chunk being filled */
	uint64_t chunk_fill;           /* its bytes taken so far */
	uint64_t bad_chunk;            /* after -EBADMSG: the chunk that failed */
	bool skipped;                  /* chunks were left as they were: no whole digest */
	bool ext;                      /* chunk chunk_no is hashed by a hasher (its sums) */
	struct mf_entry *rec;          /* recording: the digests go here (NULL: checking) */
};

/* 0 or -errno. */
int cbuild_open(struct cbuild *b);
void cbuild_close(struct cbuild *b);

/* Starts building e (chunks of chunk_size) in fd. The first keep bytes are
 * already in fd (a resumed transfer): they are read back and checked, so
 * that the whole-file digest covers every byte; -EBADMSG (bad_chunk) when
 * they do not match, -EIO when fd is shorter, -EINVAL when keep is past
 * e's size. direct_ok as for wq_begin. */
int cbuild_begin(struct cbuild *b, const struct mf_entry *e, uint64_t chunk_size, int fd,
		 uint64_t keep, bool direct_ok);
/* From now until cbuild_end, the digests found are written into rec's
 * (its chunks array holding rec->nchunks, the file's size and chunking
 * those of the entry begun) instead of compared with the entry's. */
static inline void cbuild_record(struct cbuild *b, struct mf_entry *rec)
{
	b->rec = rec;
}
/* A free buffer (WQ_BUF bytes) for the next piece, and its address. */
static inline int cbuild_buf(struct cbuild *b, uint8_t **p)
{
	int i = wq_buf(&b->wq);

	*p = b->wq.buf[i];
	return i;
}
/* The next n bytes of the file, in buffer i: checked, then written at
 * b->at. 0; -EBADMSG (nothing written, bad_chunk set) when a chunk they
 * complete does not match; -EFBIG past the file's size; or a write's
 * sticky error. */
int cbuild_put(struct cbuild *b, int i, size_t n);
/* cbuild_put with what a hasher found in these bytes (NULL: none; sums of
 * other bytes count as none): -EPROTO, nothing written, when a chunk begun
 * with sums continues without them. */
int cbuild_put_sums(struct cbuild *b, int i, size_t n, const struct cbuild_sums *s);

/* 0 or -ENOMEM. */
int cbuild_hasher_open(struct cbuild_hasher *h);
void cbuild_hasher_close(struct cbuild_hasher *h);
/* Hashes the n bytes at p, offset off of file idx, in chunks of cs, into
 * out. Pieces of a chunk must follow each other (else out->head is false
 * for the piece that does not continue, and the builder refuses it). */
void cbuild_hash(struct cbuild_hasher *h, uint64_t cs, uint64_t idx, uint64_t off,
		 const uint8_t *p, size_t n, struct cbuild_sums *out);
/* Leaves the chunks from b->at up to chunk k as they are in the file: a
 * repair in place writes only the chunks found wrong. Only at a chunk
 * boundary of a file of chunks, forwards; cbuild_end then checks no
 * whole-file digest (the chunks left alone were checked by whoever judged
 * them). 0 or -EINVAL. */
int cbuild_skip_to(struct cbuild *b, uint64_t k);
/* After a failure, back to the start of the chunk the next byte was for
 * (of a file of one chunk, to its start), every write done first: the rest
 * can then come from another source. The chunks before it stay as written,
 * each checked. The whole-file digest goes back with it (it is kept as it
 * was at the start of each chunk), so cbuild_end still checks it; only
 * where that chunk's start was never passed through here (after a skip)
 * does it check none. 0, or the writes' sticky error. */
int cbuild_rewind(struct cbuild *b);
/* Whether everything taken so far is checked: b->at ends a chunk (or the
 * file has one chunk only, checked at its end: never, before that). */
static inline bool cbuild_checked(const struct cbuild *b)
{
	return b->chunk_fill == 0 && (b->e->nchunks || b->at == b->e->size);
}
static inline bool cbuild_done(const struct cbuild *b)
{
	return b->at == b->e->size;
}
/* Every write done (the padded block cut back); then, once the file is
 * whole, its digest checked (-EBADMSG). Called after a failure too, or
 * when no file was begun: it leaves fd fit to close or unlink, and the
 * builder idle. 0 or -errno. */
int cbuild_end(struct cbuild *b);

#endif
