/* The write queue (wq.h). Between files: fd == -1, inflight == 0, err == 0,
 * direct == false, mapped == false and no sync asked or in flight; wq_begin and
 * wq_end are the transitions. A sync is its own completion (SYNC_TAG), not
 * counted in inflight; at most one is in flight, and one more may wait
 * (sync_want) until the writes below its offset are done.
 *
 * A mapped file: buffer i's write is the copiers' job i (idle, queued,
 * being copied, done), and only the queue's thread moves a job from done
 * to idle (reap_map, where the ring's completions would be reaped); a
 * buffer is busy from wq_write until then, so no one refills or trades it
 * while a copier reads it. Its sync is an fdatasync made by the queue's thread
 * once no copy below its offset is left (on a tmpfs, nothing to wait for). */
#include "daemon/engine/wq.h"
#include "daemon/fs/cred.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#define SYNC_TAG UINT64_MAX

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23          /* Linux 5.14; older headers lack it */
#endif

enum { JOB_IDLE, JOB_QUEUED, JOB_COPYING, JOB_DONE };

struct wq_copiers {
	pthread_mutex_t mu;            /* everything below */
	pthread_cond_t work;           /* a job queued, or stop */
	pthread_cond_t done;           /* a job done */
	pthread_t th[WQ_DEPTH];
	unsigned nth;                  /* threads started */
	bool stop;
	bool no_populate;              /* the kernel refused MADV_POPULATE_WRITE (before 5.14) */
	int state[WQ_DEPTH];           /* job i: buffer i's write, JOB_ */
	int fd[WQ_DEPTH];              /* the file, */
	uint64_t off[WQ_DEPTH];        /* where in it */
	const uint8_t *src[WQ_DEPTH];  /* the buffer, busy until reaped */
	size_t n[WQ_DEPTH];
	int res[WQ_DEPTH];             /* once done: 0 or -errno */
};

/* n bytes of src into fd at off, through a mapping of those pages alone
 * (a mapping of the whole file would hold page tables and resident pages
 * in proportion to the file). The pages are made present and writable
 * first (allocated here, on the copiers' threads: a fallocate of the whole
 * file would allocate them on the queue's one thread), so that a failure is
 * an error returned here, not a SIGBUS in the copy: in a file of its full
 * size already, a page a tmpfs cannot give is EFAULT (a SIGBUS on access),
 * said as the ENOSPC it is. */
static int copy_in(int fd, uint64_t off, const uint8_t *src, size_t n, bool *populate)
{
	uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), at = off & ~(pg - 1);
	size_t len = (size_t)(off - at) + n;
	uint8_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)at);
	int rc = 0;

	if (m == MAP_FAILED)
		return -errno;
	if (*populate && madvise(m, len, MADV_POPULATE_WRITE) < 0) {
		if (errno == EINVAL)
			*populate = false;      /* not this kernel: the copy faults them in */
		else
			rc = errno == EFAULT ? -ENOSPC : -errno;
	}
	if (rc == 0)
		memcpy(m + (off - at), src, n);
	munmap(m, len);
	return rc;
}

static void *copier_main(void *arg)
{
	struct wq_copiers *cp = arg;

	pthread_setname_np(pthread_self(), "wq copy");
	pthread_mutex_lock(&cp->mu);
	for (;;) {
		int i = -1;
		bool populate;
		int rc;

		for (int k = 0; k < WQ_DEPTH && i < 0; k++)
			if (cp->state[k] == JOB_QUEUED)
				i = k;
		if (i < 0) {
			if (cp->stop)
				break;
			pthread_cond_wait(&cp->work, &cp->mu);
			continue;
		}
		cp->state[i] = JOB_COPYING;
		populate = !cp->no_populate;
		pthread_mutex_unlock(&cp->mu);
		rc = copy_in(cp->fd[i], cp->off[i], cp->src[i], cp->n[i], &populate);
		pthread_mutex_lock(&cp->mu);
		if (!populate)
			cp->no_populate = true;
		cp->res[i] = rc;
		cp->state[i] = JOB_DONE;
		pthread_cond_signal(&cp->done);
	}
	pthread_mutex_unlock(&cp->mu);
	return NULL;
}

static void stop_copiers(struct wq *q)
{
	struct wq_copiers *cp = q->cp;

	if (!cp)
		return;
	pthread_mutex_lock(&cp->mu);
	cp->stop = true;
	pthread_cond_broadcast(&cp->work);
	pthread_mutex_unlock(&cp->mu);
	for (unsigned i = 0; i < cp->nth; i++)
		pthread_join(cp->th[i], NULL);
	pthread_cond_destroy(&cp->done);
	pthread_cond_destroy(&cp->work);
	pthread_mutex_destroy(&cp->mu);
	free(cp);
	q->cp = NULL;
}

/* The copiers, once per queue: 0, or -errno (the ring writes, then). */
static int start_copiers(struct wq *q)
{
	struct wq_copiers *cp;

	if (q->cp)
		return 0;
	cp = calloc(1, sizeof(*cp));
	if (!cp)
		return -ENOMEM;
	pthread_mutex_init(&cp->mu, NULL);
	pthread_cond_init(&cp->work, NULL);
	pthread_cond_init(&cp->done, NULL);
	q->cp = cp;
	while (cp->nth < WQ_DEPTH && pthread_create(&cp->th[cp->nth], NULL, copier_main, cp) == 0)
		cp->nth++;
	if (cp->nth == 0) {
		stop_copiers(q);
		return -EAGAIN;
	}
	return 0;
}

static bool on_tmpfs(int fd)
{
	struct statfs sf;

	return fstatfs(fd, &sf) == 0 && sf.f_type == TMPFS_MAGIC;
}

/* q->mapped where a shared writable mapping of the file can be made (a
 * file opened write-only cannot) and the copiers run, the file then of its
 * full size (a mapping has no page past the end); else the ring writes it. */
static void map_file(struct wq *q)
{
	void *m = mmap(NULL, 1, PROT_READ | PROT_WRITE, MAP_SHARED, q->fd, 0);
	struct stat st;

	if (m == MAP_FAILED)
		return;
	munmap(m, 1);
	if (start_copiers(q) < 0 || fstat(q->fd, &st) < 0)
		return;
	if ((uint64_t)st.st_size < q->size && ftruncate(q->fd, (off_t)q->size) < 0)
		return;
	q->mapped = true;
}

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
	stop_copiers(q);
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

void wq_begin(struct wq *q, int fd, uint64_t size, unsigned how)
{
	q->fd = fd;
	q->size = size;
	q->err = 0;
	q->padded = false;
	q->direct = false;
	q->mapped = false;
	q->sync_want = q->sync_at = q->durable = 0;
	if (size < 2 * (uint64_t)WQ_BUF)
		return;
	if ((how & WQ_MAP_OK) && on_tmpfs(fd))
		map_file(q);
	if (!q->mapped && (how & WQ_DIRECT_OK))
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
	if (q->mapped) {
		if (fdatasync(q->fd) < 0)
			q->err = -errno;
		else
			q->durable = q->sync_want;
		q->sync_want = 0;
		return;
	}
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

/* reap for a mapped file: the copies done (waiting for one if wait). */
static void reap_map(struct wq *q, bool wait)
{
	struct wq_copiers *cp = q->cp;

	pthread_mutex_lock(&cp->mu);
	while (q->inflight) {
		bool any = false;

		for (int i = 0; i < WQ_DEPTH; i++) {
			if (cp->state[i] != JOB_DONE)
				continue;
			if (cp->res[i] < 0 && !q->err)
				q->err = cp->res[i];
			cp->state[i] = JOB_IDLE;
			q->busy[i] = false;
			q->inflight--;
			any = true;
		}
		if (any || !wait)
			break;
		pthread_cond_wait(&cp->done, &cp->mu);
	}
	pthread_mutex_unlock(&cp->mu);
	try_sync(q);
}

static void reap(struct wq *q, bool wait)
{
	struct io_uring_cqe *cqe;

	if (q->mapped) {
		reap_map(q, wait);
		return;
	}
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
	if (q->mapped) {
		struct wq_copiers *cp = q->cp;

		if (off > q->size || n > q->size - off)
			return -EFBIG;
		q->busy[b] = true;
		q->len[b] = (uint32_t)n;
		q->done[b] = 0;
		q->off[b] = off;
		q->dio[b] = false;
		q->inflight++;
		pthread_mutex_lock(&cp->mu);
		cp->fd[b] = q->fd;
		cp->off[b] = off;
		cp->src[b] = q->buf[b];
		cp->n[b] = n;
		cp->state[b] = JOB_QUEUED;
		pthread_cond_signal(&cp->work);
		pthread_mutex_unlock(&cp->mu);
		reap_map(q, false);
		return 0;
	}
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
	q->mapped = false;
	if (q->fd >= 0 && q->direct)
		set_direct(q, false);
	q->fd = -1;
	q->err = 0;
	q->padded = false;
	q->sync_want = q->sync_at = q->durable = 0;
	return rc;
}
