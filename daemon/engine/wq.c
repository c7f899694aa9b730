/* The write queue (wq.h). Between files: fd == -1, inflight == 0, err == 0,
 * direct == false and no sync asked or in flight; wq_begin and wq_end are
 * the transitions. A sync is its own completion (SYNC_TAG), not counted in
 * inflight; at most one is in flight, and one more may wait (sync_want)
 * until the writes below its offset are done. */
#include "daemon/engine/wq.h"
#include "daemon/fs/cred.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SYNC_TAG UINT64_MAX

int wq_open(struct wq *q)
{
	int rc;

	memset(q, 0, sizeof(*q));
	q->fd = -1;
	for (unsigned i = 0; i < WQ_DEPTH; i++)
		if (posix_memalign((void **)&q->buf[i], WQ_ALIGN, WQ_BUF) != 0) {
			q->buf[i] = NULL;
			rc = -ENOMEM;
			goto out_free;
		}
	rc = io_uring_queue_init(WQ_DEPTH * 2, &q->ring, 0);
	if (rc < 0)
		goto out_free;
	q->personality = cred_ring_personality(&q->ring);
	return 0;
out_free:
	for (unsigned i = 0; i < WQ_DEPTH; i++)
		free(q->buf[i]);
	return rc;
}

void wq_close(struct wq *q)
{
	wq_drain(q);
	io_uring_queue_exit(&q->ring);
	for (unsigned i = 0; i < WQ_DEPTH; i++)
		free(q->buf[i]);
}

static void set_direct(struct wq *q, bool on)
{
	int fl = fcntl(q->fd, F_GETFL);

	if (fl < 0)
		return;
	fl = on ? fl | O_DIRECT : fl & ~O_DIRECT;
	/* EINVAL for O_DIRECT: a file system without it; write through the cache. */
	if (fcntl(q->fd, F_SETFL, fl) == 0)
		q->direct = on;
}

void wq_begin(struct wq *q, int fd, uint64_t size, bool direct_ok)
{
	q->fd = fd;
	q->size = size;
	q->err = 0;
	q->padded = false;
	q->direct = false;
	q->sync_want = q->sync_at = q->durable = 0;
	if (direct_ok && size >= 2 * (uint64_t)WQ_BUF)
		set_direct(q, true);
}

/* Submits the sync asked for once no write below its offset is in flight. */
static void try_sync(struct wq *q)
{
	struct io_uring_sqe *sqe;

	if (!q->sync_want || q->sync_at || q->err)
		return;
	for (unsigned i = 0; i < WQ_DEPTH; i++)
		if (q->busy[i] && q->off[i] < q->sync_want)
			return;
	sqe = io_uring_get_sqe(&q->ring);
	if (!sqe)
		return;         /* the next reap tries again */
	io_uring_prep_fsync(sqe, q->fd, IORING_FSYNC_DATASYNC);
	io_uring_sqe_set_data64(sqe, SYNC_TAG);
	q->sync_at = q->sync_want;
	q->sync_want = 0;
	cred_ring_stamp(&q->ring, q->personality);
	io_uring_submit(&q->ring);
}

/* Submits what is left of write i: all of it, or the rest after a short
 * write. true if submitted. */
static bool submit_rest(struct wq *q, unsigned i)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&q->ring);

	if (!sqe)
		return false;
	io_uring_prep_write(sqe, q->fd, q->buf[i] + q->done[i], q->len[i] - q->done[i],
			    q->off[i] + q->done[i]);
	io_uring_sqe_set_data64(sqe, i);
	cred_ring_stamp(&q->ring, q->personality);
	return io_uring_submit(&q->ring) >= 0;
}

/* O_DIRECT accepted by fcntl and refused by a write (an alignment this file
 * system wants bigger), or a short direct write that left the rest
 * unaligned: the rest of the file, this write's rest first, goes through
 * the cache. true if resubmitted. */
static bool resubmit_buffered(struct wq *q, unsigned i)
{
	set_direct(q, false);
	q->dio[i] = false;
	return !q->direct && submit_rest(q, i);
}

static bool pending(const struct wq *q)
{
	return q->inflight || q->sync_at;
}

static void reap(struct wq *q, bool wait)
{
	struct io_uring_cqe *cqe;

	while (pending(q)) {
		int rc = wait ? io_uring_wait_cqe(&q->ring, &cqe) : io_uring_peek_cqe(&q->ring, &cqe);
		uint64_t tag;

		if (rc == -EINTR)
			continue;
		if (rc == -EAGAIN && !wait)
			break;
		if (rc < 0) {
			/* The ring failed: nothing more completes. Sticky, and
			 * nothing is waited for again. A buffer whose write was
			 * in flight may still be the kernel's: it is abandoned
			 * (a ring that fails is never used again) for a new one,
			 * so that no one fills it while the kernel reads it
			 * (wq_trade hands buffers on). */
			if (!q->err)
				q->err = rc;
			for (int i = 0; i < WQ_DEPTH; i++) {
				void *fresh;

				if (q->busy[i] && posix_memalign(&fresh, WQ_ALIGN, WQ_BUF) == 0)
					q->buf[i] = fresh;
			}
			memset(q->busy, 0, sizeof(q->busy));
			q->inflight = 0;
			q->sync_at = q->sync_want = 0;
			return;
		}
		tag = io_uring_cqe_get_data64(cqe);
		if (tag != SYNC_TAG && cqe->res == -EINVAL && q->dio[tag] &&
		    resubmit_buffered(q, (unsigned)tag)) {
			io_uring_cqe_seen(&q->ring, cqe);
			continue;
		}
		if (tag != SYNC_TAG && cqe->res > 0 && !q->err &&
		    q->done[tag] + (uint32_t)cqe->res < q->len[tag]) {
			/* A short write (a disk that failed part-way, a file
			 * system nearly full): the rest is asked again, and
			 * what stops it says why: EIO, ENOSPC. */
			q->done[tag] += (uint32_t)cqe->res;
			if (q->dio[tag] && q->done[tag] % WQ_ALIGN ? resubmit_buffered(q, (unsigned)tag) :
			    submit_rest(q, (unsigned)tag)) {
				io_uring_cqe_seen(&q->ring, cqe);
				continue;
			}
			q->err = -EBUSY;        /* no room in the ring to ask again */
		}
		if (tag == SYNC_TAG) {
			if (cqe->res < 0 && !q->err)
				q->err = cqe->res;
			else if (cqe->res >= 0)
				q->durable = q->sync_at;
			q->sync_at = 0;
		} else {
			/* A write that wrote nothing: the file system is full. */
			if (cqe->res <= 0 && !q->err)
				q->err = cqe->res < 0 ? cqe->res : -ENOSPC;
			q->busy[tag] = false;
			q->inflight--;
		}
		io_uring_cqe_seen(&q->ring, cqe);
		wait = false;
	}
	try_sync(q);
}

void wq_sync(struct wq *q, uint64_t upto)
{
	if (upto > q->durable && upto > q->sync_at)
		q->sync_want = upto;
	try_sync(q);
}

int wq_buf(struct wq *q)
{
	for (;;) {
		for (int i = 0; i < WQ_DEPTH; i++)
			if (!q->busy[i])
				return i;
		reap(q, true);
	}
}

int wq_write(struct wq *q, int b, size_t n, uint64_t off)
{
	struct io_uring_sqe *sqe;

	if (q->err)
		return q->err;
	if (q->direct && (off % WQ_ALIGN || (n % WQ_ALIGN && off + n != q->size))) {
		/* Writes already in flight were aligned; the rest go buffered. */
		while (q->inflight)
			reap(q, true);
		set_direct(q, false);
	}
	if (q->direct && n % WQ_ALIGN) {
		size_t pad = WQ_ALIGN - n % WQ_ALIGN;   /* n < WQ_BUF: there is room */

		memset(q->buf[b] + n, 0, pad);
		n += pad;
		q->padded = true;
	}
	sqe = io_uring_get_sqe(&q->ring);
	if (!sqe) {
		reap(q, true);
		sqe = io_uring_get_sqe(&q->ring);
		if (!sqe)
			return -EBUSY;
	}
	io_uring_prep_write(sqe, q->fd, q->buf[b], (unsigned)n, off);
	io_uring_sqe_set_data64(sqe, (uint64_t)b);
	q->busy[b] = true;
	q->len[b] = (uint32_t)n;
	q->done[b] = 0;
	q->off[b] = off;
	q->dio[b] = q->direct;
	q->inflight++;
	cred_ring_stamp(&q->ring, q->personality);
	io_uring_submit(&q->ring);
	reap(q, false);
	return 0;
}

int wq_drain(struct wq *q)
{
	while (pending(q))
		reap(q, true);
	return q->err;
}

int wq_end(struct wq *q)
{
	int rc = wq_drain(q);

	if (rc == 0 && q->padded && ftruncate(q->fd, (off_t)q->size) < 0)
		rc = -errno;
	if (q->fd >= 0 && q->direct)
		set_direct(q, false);
	q->fd = -1;
	q->err = 0;
	q->padded = false;
	q->sync_want = q->sync_at = q->durable = 0;
	return rc;
}
