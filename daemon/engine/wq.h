/* The write queue: positional writes of one file in flight on io_uring, from
 * a few reusable buffers, so that the next piece is received, checked and
 * hashed while the disk writes the last ones. The replication receiver and
 * restore both build files through it.
 *
 * A file of at least two buffers is written with O_DIRECT where the file
 * system allows it (buffers are aligned; the last block of the file is
 * padded and wq_end cuts the file back), as fio writes: on these machines
 * the page-cache copy of a buffered write cost more CPU than everything
 * else a restore does (docs/BENCHMARKS.md, restore). A write that is not
 * aligned (a peer's odd piece), or one that O_DIRECT refuses with EINVAL
 * (resubmitted), turns O_DIRECT off for the rest of the file.
 *
 * Durability goes through the ring too: wq_sync asks for an fdatasync of
 * everything written before an offset; it is submitted as soon as the
 * writes before that offset are done, while later ones go on, and
 * wq_durable says how far the file is durable once it completes. A
 * receiver journals that point without ever stopping the stream for it.
 *
 * Use: wq_open; per file wq_begin, then wq_buf / fill it / wq_write (and
 * wq_sync) as often as needed, then wq_end; wq_close. Errors of writes and
 * syncs are sticky: the first one is what wq_drain and wq_end return.
 */
#ifndef STAGE_WQ_H
#define STAGE_WQ_H

#include <liburing.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WQ_DEPTH 4
#define WQ_BUF (1u << 20)               /* bytes per buffer */
#define WQ_ALIGN 4096u

struct wq {
	struct io_uring ring;
	uint8_t *buf[WQ_DEPTH];        /* WQ_BUF each, WQ_ALIGN-aligned, owned */
	uint32_t len[WQ_DEPTH];        /* bytes asked of the write in flight */
	uint32_t done[WQ_DEPTH];       /* of those, written already (a short write) */
	uint64_t off[WQ_DEPTH];        /* its offset */
	bool dio[WQ_DEPTH];            /* it was issued with O_DIRECT */
	bool busy[WQ_DEPTH];
	unsigned inflight;
	int err;                       /* first failed write, sticky; 0 */
	int fd;                        /* the file, borrowed; -1 between files */
	uint64_t size;                 /* its size in the end */
	bool direct;                   /* written with O_DIRECT */
	bool padded;                   /* the last block went past size */
	unsigned personality;          /* the opening thread's user (fs/cred.h), 0: the daemon */
	uint64_t sync_want;            /* a sync asked for, covering [0, this); 0: none */
	uint64_t sync_at;              /* the sync in flight covers [0, this); 0: none */
	uint64_t durable;              /* [0, this) made durable by a completed sync */
};

/* 0 or -errno. */
int wq_open(struct wq *q);
void wq_close(struct wq *q);

/* Starts writing fd, a regular file of size bytes in the end. direct_ok:
 * the caller has nothing buffered to mix with (O_DIRECT may be set). */
void wq_begin(struct wq *q, int fd, uint64_t size, bool direct_ok);
/* A free buffer's index, waiting for a write to finish if none is. */
int wq_buf(struct wq *q);
/* Buffer b (free, from wq_buf) becomes full, a buffer filled elsewhere
 * (WQ_BUF bytes, WQ_ALIGN-aligned, from posix_memalign or aligned_alloc):
 * the buffer b was is returned, the caller's now. Bytes filled by another
 * thread are written without a copy. */
static inline uint8_t *wq_trade(struct wq *q, int b, uint8_t *full)
{
	uint8_t *was = q->buf[b];

	q->buf[b] = full;
	return was;
}
/* Writes n bytes of buffer b at off (the buffer is busy until done). 0, or
 * the sticky error of an earlier write. */
int wq_write(struct wq *q, int b, size_t n, uint64_t off);
/* Asks for [0, upto) to be made durable (fdatasync through the ring, once
 * every write below upto is done). A later call supersedes an earlier one
 * not yet submitted. */
void wq_sync(struct wq *q, uint64_t upto);
/* How far the file is durable through wq_sync: [0, this). */
static inline uint64_t wq_durable(const struct wq *q)
{
	return q->durable;
}
/* Waits for every write and sync: the sticky error, or 0. */
int wq_drain(struct wq *q);
/* wq_drain, then the file cut back to its size if a padded block went past
 * it; clears O_DIRECT and the sticky error for the next file. 0 or -errno. */
int wq_end(struct wq *q);

#endif
