/* The copier: see copier.h for what it promises.
 *
 * A file's life (f->state), each step driven by a completion:
 *
 *   CP_OPENING  source and temporary opened at once      copier_start -> on_open
 *   CP_DATA     reads in flight up to opts.depth; a read  pump, on_read,
 *               that lands is hashed once every byte       advance, on_write
 *               before it has been hashed, then written
 *   CP_SYNCING  metadata set, fdatasync in flight         finish_data -> on_sync
 *   CP_DONE     source re-checked, fds closed, the        complete
 *               temporary unlinked if anything failed,
 *               done() called
 *
 * Invariants:
 * - f->ops counts this file's operations the kernel still owns; buffers and
 *   the file itself are released only when it is zero, so a failure waits
 *   for its stragglers (fail() records the first error and stops new reads).
 * - Bytes are hashed strictly in offset order (hash_off only grows, by whole
 *   segments), so the digest is the one `xxhsum -H2` computes.
 * - Every buffer comes from c->pool, whose live and cached buffers together
 *   stay within opts.memory (io_size is clamped so one buffer always fits).
 */
#include "daemon/engine/copier.h"
#include "daemon/engine/pcache.h"
#include "daemon/fs/cred.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/log.h"
#include "common/manifest.h"
#include "daemon/engine/bufpool.h"

#define ALIGN 4096u
#define RING_SQ 512u
#define RING_CQ 8192u

enum { OP_OPEN_SRC = 1, OP_OPEN_DST, OP_READ, OP_WRITE, OP_SYNC };
enum seg_state { SEG_FREE, SEG_READING, SEG_READ, SEG_WRITING };

struct cp_seg {
	uint64_t off;          /* where this segment's data sits in the file */
	uint32_t len;          /* data bytes */
	uint32_t done;         /* bytes read (READING) or written (WRITING) so far */
	uint32_t cap;          /* buffer bytes, a multiple of ALIGN */
	uint8_t *buf;          /* from c->pool */
	enum seg_state st;
	struct cp_op op;
};

struct copier {
	struct io_uring ring;
	int dst_root;                 /* borrowed: temporaries are created here */
	struct copier_opts o;
	struct bufpool pool;          /* every segment buffer */
	unsigned live;                /* files between start and done */
	struct cp_file *live_head;
	bool src_direct_ok;           /* cleared the first time O_DIRECT is refused */
	bool dst_direct_ok;
	bool noatime_ok;              /* cleared the first time O_NOATIME is refused */
	unsigned personality;         /* the creating thread's user (fs/cred.h), 0: the daemon */
	cp_done_fn done;              /* valid inside copier_run */
	void *done_arg;
	int finished;                 /* files completed in this copier_run */
};

static uint64_t round_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) & ~(a - 1);
}

static struct io_uring_sqe *sqe_get(struct copier *c)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&c->ring);

	if (!sqe) {
		cred_ring_stamp(&c->ring, c->personality);
		io_uring_submit(&c->ring);
		sqe = io_uring_get_sqe(&c->ring);
	}
	return sqe;
}

static void fail(struct cp_file *f, int err, const char *op, bool dst)
{
	if (f->err)
		return;
	f->err = err < 0 ? err : -EIO;
	f->err_op = op;
	f->err_dst = dst;
}

/* Submits an operation for f; on a full ring that cannot drain it fails f. */
static struct io_uring_sqe *prep(struct copier *c, struct cp_file *f, struct cp_op *op)
{
	struct io_uring_sqe *sqe = sqe_get(c);

	if (!sqe) {
		/* The ring, not the file: fatal to the job, not "unreadable". */
		fail(f, -EBUSY, "submit", true);
		return NULL;
	}
	op->f = f;
	io_uring_sqe_set_data(sqe, op);
	f->ops++;
	return sqe;
}

static void submit_open(struct copier *c, struct cp_file *f, bool dst)
{
	struct open_how *how = dst ? &f->how_dst : &f->how_src;
	struct cp_op *op = dst ? &f->op_dst : &f->op_src;
	bool direct = dst ? f->dst_direct : f->src_direct;
	struct io_uring_sqe *sqe;

	memset(how, 0, sizeof(*how));
	/* The kernel keeps every lookup beneath the root and refuses symlinks on
	 * the way: a tree swapped for a link mid-pull cannot lead us outside. */
	how->resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
	if (dst) {
		how->flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
		how->mode = 0600;
	} else {
		how->flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
		/* Reading a dataset should not dirty every inode with an atime, but
		 * only the owner (or CAP_FOWNER) may ask: the first EPERM turns it off. */
		if (c->noatime_ok)
			how->flags |= O_NOATIME;
	}
	if (direct)
		how->flags |= O_DIRECT;
	op->kind = dst ? OP_OPEN_DST : OP_OPEN_SRC;
	sqe = prep(c, f, op);
	if (!sqe)
		return;
	io_uring_prep_openat2(sqe, dst ? c->dst_root : f->src_at, dst ? f->dst : f->src, how);
	f->opens_pending++;
}

static void submit_read(struct copier *c, struct cp_file *f, struct cp_seg *s)
{
	uint64_t want = s->len - s->done;
	struct io_uring_sqe *sqe;

	if (f->src_direct)
		want = round_up(want, ALIGN);
	s->op.kind = OP_READ;
	sqe = prep(c, f, &s->op);
	if (sqe)
		io_uring_prep_read(sqe, f->src_fd, s->buf + s->done, (unsigned)want, s->off + s->done);
}

static void submit_write(struct copier *c, struct cp_file *f, struct cp_seg *s)
{
	uint32_t total = f->dst_direct ? (uint32_t)round_up(s->len, ALIGN) : s->len;
	struct io_uring_sqe *sqe;

	s->op.kind = OP_WRITE;
	sqe = prep(c, f, &s->op);
	if (sqe)
		io_uring_prep_write(sqe, f->dst_fd, s->buf + s->done, total - s->done, s->off + s->done);
}

static void seg_release(struct copier *c, struct cp_file *f, struct cp_seg *s)
{
	bufpool_put(&c->pool, s->buf, s->cap);
	s->buf = NULL;
	s->cap = 0;
	s->st = SEG_FREE;
	f->nseg--;
}

/* Starts reads while the file has free segments and the budget has room. */
static void pump(struct copier *c, struct cp_file *f)
{
	while (!f->err && f->state == CP_DATA && f->read_off < f->size) {
		struct cp_seg *s = NULL;
		uint64_t len;

		for (unsigned i = 0; i < c->o.depth; i++)
			if (f->segs[i].st == SEG_FREE) {
				s = &f->segs[i];
				break;
			}
		if (!s)
			return;
		len = f->size - f->read_off;
		if (len > c->o.io_size)
			len = c->o.io_size;
		s->buf = bufpool_get(&c->pool, round_up(len, ALIGN), &s->cap);
		if (!s->buf) {
			if (f->nseg == 0 && c->pool.live == 0)
				fail(f, -ENOMEM, "allocate", false);
			return;
		}
		s->off = f->read_off;
		s->len = (uint32_t)len;
		s->done = 0;
		s->st = SEG_READING;
		s->op.s = s;
		f->nseg++;
		f->read_off += len;
		submit_read(c, f, s);
	}
}

static void hash_bytes(struct copier *c, struct cp_file *f, const uint8_t *p, uint64_t n)
{
	XXH3_128bits_update(f->whole, p, n);
	if (!f->chunk)
		return;
	while (n) {
		uint64_t room = c->o.chunk_size - f->chunk_fill;
		uint64_t take = n < room ? n : room;

		XXH3_128bits_update(f->chunk, p, take);
		f->chunk_fill += take;
		p += take;
		n -= take;
		if (f->chunk_fill == c->o.chunk_size || f->hash_off + take == f->size) {
			f->chunks[(f->hash_off + take - 1) / c->o.chunk_size] =
				XXH3_128bits_digest(f->chunk);
			XXH3_128bits_reset(f->chunk);
			f->chunk_fill = 0;
		}
		f->hash_off += take;
	}
}

/* Hashes every landed segment that is next in offset order. */
static void advance(struct copier *c, struct cp_file *f)
{
	for (;;) {
		struct cp_seg *s = NULL;

		for (unsigned i = 0; i < c->o.depth; i++)
			if (f->segs[i].st == SEG_READ && f->segs[i].off == f->hash_off) {
				s = &f->segs[i];
				break;
			}
		if (!s)
			return;
		if (f->chunk) {
			hash_bytes(c, f, s->buf, s->len);
		} else {
			XXH3_128bits_update(f->whole, s->buf, s->len);
			f->hash_off += s->len;
		}
		if (f->dst) {
			if (f->dst_direct && s->len % ALIGN)
				memset(s->buf + s->len, 0, round_up(s->len, ALIGN) - s->len);
			s->st = SEG_WRITING;
			s->done = 0;
			submit_write(c, f, s);
		} else {
			seg_release(c, f, s);
		}
	}
}

static void complete(struct copier *c, struct cp_file *f)
{
	struct cp_file **pp;

	if (!f->err && f->src_fd >= 0) {
		struct stat st;

		/* The walk saw one size and mtime; if they moved while we copied, what
		 * we hashed may be a mix of two versions. */
		if (fstat(f->src_fd, &st) < 0)
			fail(f, -errno, "stat", false);
		else if ((uint64_t)st.st_size != f->size || mf_mtime_ns(&st) != f->mtime_ns)
			fail(f, -ESTALE, "changed while being copied", false);
	}
	if (!f->err) {
		f->digest = XXH3_128bits_digest(f->whole);
	}
	if (f->src_fd >= 0)
		close(f->src_fd);
	if (f->dst_fd >= 0)
		close(f->dst_fd);
	if (f->err && f->dst && f->dst_fd >= 0)
		unlinkat(c->dst_root, f->dst, 0);
	f->src_fd = f->dst_fd = -1;
	for (unsigned i = 0; i < c->o.depth; i++)
		if (f->segs[i].st != SEG_FREE)
			seg_release(c, f, &f->segs[i]);
	f->state = CP_DONE;
	for (pp = &c->live_head; *pp; pp = &(*pp)->next_live)
		if (*pp == f) {
			*pp = f->next_live;
			break;
		}
	c->live--;
	c->finished++;
	c->done(f, c->done_arg);
}

static void finish_data(struct copier *c, struct cp_file *f)
{
	if (f->dst) {
		struct timespec ts[2];

		ts[0].tv_sec = ts[1].tv_sec = f->mtime_ns / 1000000000LL;
		ts[0].tv_nsec = ts[1].tv_nsec = f->mtime_ns % 1000000000LL;
		if (ts[1].tv_nsec < 0) {
			ts[0].tv_sec = --ts[1].tv_sec;
			ts[0].tv_nsec = ts[1].tv_nsec += 1000000000LL;
		}
		if (f->dst_direct && f->size % ALIGN && ftruncate(f->dst_fd, (off_t)f->size) < 0)
			fail(f, -errno, "truncate", true);
		else if (f->chown && fchown(f->dst_fd, f->uid, f->gid) < 0)
			fail(f, -errno, "chown", true);
		else if (fchmod(f->dst_fd, f->mode) < 0)
			fail(f, -errno, "chmod", true);
		else if (futimens(f->dst_fd, ts) < 0)
			fail(f, -errno, "set times", true);
		if (!f->err && (c->o.fsync || (c->o.fsync_min && f->size >= c->o.fsync_min))) {
			struct io_uring_sqe *sqe;

			f->state = CP_SYNCING;
			f->op_sync.kind = OP_SYNC;
			sqe = prep(c, f, &f->op_sync);
			if (sqe) {
				io_uring_prep_fsync(sqe, f->dst_fd, IORING_FSYNC_DATASYNC);
				f->synced = true;
				return;
			}
		}
	}
	complete(c, f);
}

/* Sets up the hashing of f once its size is known. 0 or -ENOMEM. */
static int hash_setup(struct copier *c, struct cp_file *f)
{
	f->nchunks = f->size > c->o.chunk_size ? (f->size + c->o.chunk_size - 1) / c->o.chunk_size : 0;
	if (!f->nchunks)
		return 0;
	f->chunk = XXH3_createState();
	f->chunks = calloc(f->nchunks, sizeof(*f->chunks));
	if (!f->chunk || !f->chunks)
		return -ENOMEM;
	XXH3_128bits_reset(f->chunk);
	return 0;
}

static void try_direct(int fd, bool *ok, bool *on)
{
	int fl = fcntl(fd, F_GETFL);

	if (*ok && fl >= 0 && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0)
		*on = true;
	else if (*ok)
		*ok = false;
}

/* Whether n more bytes fit the budget of cold reads through the cache
 * (taken if so). */
static bool take_budget(struct copier *c, uint64_t n)
{
	uint64_t left;

	if (!c->o.cache_budget)
		return false;
	left = __atomic_load_n(c->o.cache_budget, __ATOMIC_RELAXED);
	while (left >= n)
		if (__atomic_compare_exchange_n(c->o.cache_budget, &left, left - n, true,
						__ATOMIC_RELAXED, __ATOMIC_RELAXED))
			return true;
	return false;
}

/* A source its writer has just written is read through the cache, where
 * it still is (engine/pcache.h), unless the caller wants the disk read; so
 * is a cold one the budget still covers, for a reader that reads it again
 * soon (the send after a commit). */
static void prefer_cache(struct copier *c, struct cp_file *f)
{
	int fl;

	if (!f->src_direct || c->o.direct_verify ||
	    (!pcache_warm(f->src_fd, 0, f->size) && !take_budget(c, f->size)))
		return;
	fl = fcntl(f->src_fd, F_GETFL);
	if (fl >= 0 && fcntl(f->src_fd, F_SETFL, fl & ~O_DIRECT) == 0)
		f->src_direct = false;
}

/* The opened source must be a regular file: a name swapped for a fifo since
 * the walk must fail here, not block a read (the open was O_NONBLOCK for
 * the same reason). A file the walk did not stat gets its attributes here
 * (the open has read the inode: no I/O), and a big one turns to O_DIRECT
 * now that it is known to be big. */
static int check_source(struct copier *c, struct cp_file *f)
{
	struct stat st;
	int fl;

	if (fstat(f->src_fd, &st) < 0) {
		fail(f, -errno, "stat", false);
		return -1;
	}
	if (!S_ISREG(st.st_mode)) {
		fail(f, -ESTALE, "changed while being copied", false);
		return -1;
	}
	/* io_uring hands -EAGAIN back for a cold read on an O_NONBLOCK file
	 * instead of waiting in a worker: blocking reads from here on. */
	fl = fcntl(f->src_fd, F_GETFL);
	if (fl < 0 || fcntl(f->src_fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
		fail(f, -errno, "fcntl", false);
		return -1;
	}
	if (f->size != CP_SIZE_UNKNOWN) {
		prefer_cache(c, f);
		return 0;
	}
	/* Manifests hold int64 nanoseconds: years 1678 to 2262. */
	if (__builtin_mul_overflow((int64_t)st.st_mtim.tv_sec, (int64_t)1000000000, &f->mtime_ns) ||
	    __builtin_add_overflow(f->mtime_ns, (int64_t)st.st_mtim.tv_nsec, &f->mtime_ns)) {
		fail(f, -EOVERFLOW, "mtime outside what a manifest records (1678 to 2262)", false);
		return -1;
	}
	f->size = (uint64_t)st.st_size;
	f->mode = st.st_mode & 07777;
	f->uid = st.st_uid;
	f->gid = st.st_gid;
	if (hash_setup(c, f) < 0) {
		fail(f, -ENOMEM, "allocate", false);
		return -1;
	}
	if (f->size >= c->o.direct_min) {
		try_direct(f->src_fd, &c->src_direct_ok, &f->src_direct);
		if (f->dst)
			try_direct(f->dst_fd, &c->dst_direct_ok, &f->dst_direct);
		prefer_cache(c, f);
	}
	return 0;
}

/* Moves f along after one of its completions. */
static void progress(struct copier *c, struct cp_file *f)
{
	if (f->err) {
		if (f->ops == 0)
			complete(c, f);
		return;
	}
	if (f->state == CP_OPENING) {
		if (f->opens_pending)
			return;
		if (check_source(c, f) < 0) {
			if (f->ops == 0)
				complete(c, f);
			return;
		}
		f->state = CP_DATA;
	}
	if (f->state == CP_DATA) {
		advance(c, f);
		pump(c, f);
		if (f->err) {
			if (f->ops == 0)
				complete(c, f);
		} else if (f->hash_off == f->size && f->nseg == 0 && f->ops == 0) {
			finish_data(c, f);
		}
	} else if (f->state == CP_SYNCING && f->ops == 0) {
		complete(c, f);
	}
}

static void on_open(struct copier *c, struct cp_file *f, bool dst, int res)
{
	f->opens_pending--;
	if (res == -EINVAL && (dst ? f->dst_direct : f->src_direct)) {
		/* This file system refuses O_DIRECT (tmpfs does): remember, retry. */
		if (dst) {
			c->dst_direct_ok = false;
			f->dst_direct = false;
		} else {
			c->src_direct_ok = false;
			f->src_direct = false;
		}
		log_debug("O_DIRECT refused for %s, using buffered I/O", dst ? f->dst : f->src);
		submit_open(c, f, dst);
		return;
	}
	if (res == -EPERM && !dst && (f->how_src.flags & O_NOATIME)) {
		c->noatime_ok = false;
		submit_open(c, f, dst);
		return;
	}

	if (res < 0) {
		fail(f, res, dst ? "create" : "open", dst);
		return;
	}
	if (dst)
		f->dst_fd = res;
	else
		f->src_fd = res;
}

static void on_read(struct copier *c, struct cp_file *f, struct cp_seg *s, int res)
{
	if (f->err)
		return;
	if (res == -EINTR || res == -EAGAIN) {
		submit_read(c, f, s);
		return;
	}
	if (res < 0) {
		fail(f, res, "read", false);
		return;
	}
	if (res == 0) {
		fail(f, -ESTALE, "changed while being copied", false);
		return;
	}
	s->done += (uint32_t)res;
	if (s->done >= s->len) {
		/* A file that grew since the walk reads past len; complete() notices. */
		s->done = s->len;
		s->st = SEG_READ;
		return;
	}
	if (f->src_direct && (s->off + s->done) % ALIGN) {
		fail(f, -EIO, "read (short direct read)", false);
		return;
	}
	submit_read(c, f, s);
}

static void on_write(struct copier *c, struct cp_file *f, struct cp_seg *s, int res)
{
	uint32_t total = f->dst_direct ? (uint32_t)round_up(s->len, ALIGN) : s->len;

	if (f->err)
		return;
	if (res == -EINTR || res == -EAGAIN) {
		submit_write(c, f, s);
		return;
	}
	if (res <= 0) {
		fail(f, res < 0 ? res : -ENOSPC, "write", true);
		return;
	}
	s->done += (uint32_t)res;
	if (s->done < total) {
		if (f->dst_direct && s->done % ALIGN) {
			fail(f, -EIO, "write (short direct write)", true);
			return;
		}
		submit_write(c, f, s);
		return;
	}
	seg_release(c, f, s);
}

static void on_cqe(struct copier *c, struct io_uring_cqe *cqe)
{
	struct cp_op *op = io_uring_cqe_get_data(cqe);
	struct cp_file *f = op->f;

	f->ops--;
	switch (op->kind) {
	case OP_OPEN_SRC:
		on_open(c, f, false, cqe->res);
		break;
	case OP_OPEN_DST:
		on_open(c, f, true, cqe->res);
		break;
	case OP_READ:
		on_read(c, f, op->s, cqe->res);
		break;
	case OP_WRITE:
		on_write(c, f, op->s, cqe->res);
		break;
	case OP_SYNC:
		if (cqe->res < 0)
			fail(f, cqe->res, "sync", true);
		break;
	}
	progress(c, f);
}

int copier_create(struct copier **out, int dst_root, const struct copier_opts *o)
{
	struct io_uring_params p = { .flags = IORING_SETUP_CQSIZE, .cq_entries = RING_CQ };
	struct copier *c;
	int ret;

	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->o = *o;
	if (c->o.depth == 0)
		c->o.depth = 1;
	/* One buffer must always fit, or a lone file could never start. */
	while (c->o.io_size > c->o.memory && c->o.io_size > ALIGN)
		c->o.io_size /= 2;
	bufpool_init(&c->pool, c->o.memory);
	c->dst_root = dst_root;
	c->src_direct_ok = c->dst_direct_ok = c->noatime_ok = true;
	ret = io_uring_queue_init_params(RING_SQ, &c->ring, &p);
	if (ret < 0) {
		free(c);
		return ret;
	}
	{
		/* A cold open or read of a regular file blocks, so the kernel hands
		 * it to an io-wq worker; by default there are only a few per core,
		 * which caps the files truly in flight far below max_files. */
		unsigned workers[2] = { c->o.max_files, 0 };

		io_uring_register_iowq_max_workers(&c->ring, workers);
	}
	c->personality = cred_ring_personality(&c->ring);
	*out = c;
	return 0;
}

void copier_destroy(struct copier *c)
{
	if (!c)
		return;
	for (struct cp_file *f = c->live_head; f; f = f->next_live) {
		if (f->src_fd >= 0)
			close(f->src_fd);
		if (f->dst_fd >= 0) {
			close(f->dst_fd);
			unlinkat(c->dst_root, f->dst, 0);
		}
	}
	io_uring_queue_exit(&c->ring);
	bufpool_destroy(&c->pool);
	free(c);
}

bool copier_has_room(const struct copier *c)
{
	return c->live < c->o.max_files && bufpool_room(&c->pool, ALIGN);
}

unsigned copier_inflight(const struct copier *c)
{
	return c->live;
}

void copier_release(struct cp_file *f)
{
	free(f->segs);
	f->segs = NULL;
	if (f->whole)
		XXH3_freeState(f->whole);
	if (f->chunk)
		XXH3_freeState(f->chunk);
	f->whole = f->chunk = NULL;
	free(f->chunks);
	f->chunks = NULL;
}

int copier_start(struct copier *c, struct cp_file *f)
{
	f->err = 0;
	f->err_op = NULL;
	f->err_dst = false;
	f->state = CP_OPENING;
	f->src_fd = f->dst_fd = -1;
	f->opens_pending = 0;
	f->ops = 0;
	f->read_off = f->hash_off = f->chunk_fill = 0;
	f->nseg = 0;
	f->synced = false;
	f->nchunks = 0;
	f->chunk = NULL;
	f->chunks = NULL;
	f->segs = calloc(c->o.depth, sizeof(*f->segs));
	f->whole = XXH3_createState();
	if (!f->segs || !f->whole ||
	    (f->size != CP_SIZE_UNKNOWN && hash_setup(c, f) < 0)) {
		copier_release(f);
		return -ENOMEM;
	}
	XXH3_128bits_reset(f->whole);
	/* An unknown size decides O_DIRECT after the open (learn). */
	f->src_direct = f->size != CP_SIZE_UNKNOWN && c->src_direct_ok && f->size > 0 &&
			(f->size >= c->o.direct_min || (!f->dst && c->o.direct_verify));
	f->dst_direct = f->size != CP_SIZE_UNKNOWN && f->dst && c->dst_direct_ok &&
			f->size >= c->o.direct_min;
	f->next_live = c->live_head;
	c->live_head = f;
	c->live++;
	submit_open(c, f, false);
	if (f->dst)
		submit_open(c, f, true);
	return 0;
}

/* A file can fail outside a completion (a buffer it could not get, an
 * operation it could not submit, a cancel) with nothing left in flight:
 * no completion will ever come for it, so it completes here. */
static void reap_idle_failures(struct copier *c)
{
	struct cp_file *f = c->live_head;

	while (f) {
		struct cp_file *next = f->next_live;

		if (f->err && f->ops == 0)
			complete(c, f);
		f = next;
	}
}

void copier_cancel(struct copier *c)
{
	for (struct cp_file *f = c->live_head; f; f = f->next_live)
		fail(f, -ECANCELED, "cancelled", false);
}

int copier_run(struct copier *c, int timeout_ms, cp_done_fn done, void *arg)
{
	struct __kernel_timespec ts = {
		.tv_sec = timeout_ms / 1000, .tv_nsec = (long long)(timeout_ms % 1000) * 1000000
	};
	struct io_uring_cqe *cqes[64], *cqe;
	unsigned n;
	int ret;

	c->done = done;
	c->done_arg = arg;
	c->finished = 0;
	/* Files that stalled on the budget may go on now that others freed it. */
	for (struct cp_file *f = c->live_head; f; f = f->next_live)
		if (f->state == CP_DATA)
			pump(c, f);
	reap_idle_failures(c);
	cred_ring_stamp(&c->ring, c->personality);
	ret = io_uring_submit_and_wait_timeout(&c->ring, &cqe, c->live ? 1 : 0, &ts, NULL);
	if (ret < 0 && ret != -ETIME && ret != -EINTR && ret != -EBUSY)
		return ret;
	while ((n = io_uring_peek_batch_cqe(&c->ring, cqes, 64)) > 0) {
		for (unsigned i = 0; i < n; i++)
			on_cqe(c, cqes[i]);
		io_uring_cq_advance(&c->ring, n);
	}
	return c->finished;
}
