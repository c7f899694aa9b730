/* The doctor's storage probes (dr_disk.h).
 *
 * The disk probe's file, DIR/.stage-doctor.PID.TID, lives from its
 * O_CREAT|O_EXCL open to the unlink in dr_disk_probe, which every path
 * after the open goes through: CREATED -> WRITTEN (wq, fdatasync'd) ->
 * READ (checked) -> REMOVED. The unlink removes the name only while it
 * still is that file (same device and inode), so even a name swapped under
 * us is never another file removed.
 *
 * Writes go through the engine's write queue: four 1 MiB requests in flight,
 * O_DIRECT where the file system takes it, the fdatasync through the ring,
 * exactly as the receiver and restore write. Reads do not fit the engine's
 * readers: the copier reads whole files and hashes them into per-chunk
 * digests (the source probe reads a byte budget, ending mid-file), psend
 * reads only to send frames on a transport, and uio has one request in
 * flight, which would measure latency rather than what the disk gives. So
 * reads are a small loop on one ring here (struct rd): DR_DEPTH aligned
 * pieces of 1 MiB in flight, the read-ahead psend uses, so the figure is
 * what replication's sender can read at.
 *
 * The source walk is our own too, not fs/walk.c: that one lists and stats a
 * whole directory before it returns its first name, so one directory of a
 * million files would blow through max_entries, time_ms and memory. Here a
 * directory is read DR_BATCH names at a time and each batch is stat'ed
 * through io_uring at once, as the pull's walk stats (many statx in flight
 * are what a cold network file system answers fast), so files_per_s is the
 * rate a pull's walk sees.
 */
#include "daemon/doctor/dr_disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <liburing.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/why.h"
#include "daemon/engine/wq.h"

#define DR_DEPTH 8u                     /* reads in flight */
#define DR_ALIGN 4096u                  /* O_DIRECT's alignment; also the stamp's block */
#define DR_BATCH 256u                   /* names stat'ed at once (the pull's walk's batch) */
#define DR_MAX_DEPTH 64u                /* directories open at once in the walk */
#define DR_CANDS 256u                   /* largest files remembered for the reads */

_Static_assert(WQ_BUF == DR_PIECE, "the write queue writes whole pieces");
_Static_assert(DR_PIECE % DR_ALIGN == 0, "pieces are whole blocks");

static bool cancelled(bool (*cancel)(void *), void *arg)
{
	return cancel && cancel(arg);
}

static double rate(uint64_t bytes, uint64_t t0, uint64_t t1)
{
	return (double)bytes * 1e9 / (double)(t1 > t0 ? t1 - t0 : 1);
}

static int set_direct(int fd, bool on)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0)
		return -errno;
	fl = on ? fl | O_DIRECT : fl & ~O_DIRECT;
	return fcntl(fd, F_SETFL, fl) < 0 ? -errno : 0;
}

/* ---- reads: DR_DEPTH pieces of one file in flight ---- */

struct rd {
	struct io_uring ring;           /* reads only, 2 * DR_DEPTH entries */
	uint8_t *buf[DR_DEPTH];         /* DR_PIECE each, DR_ALIGN-aligned, owned */
	uint64_t off[DR_DEPTH];         /* file offset of the slot's read */
	uint32_t len[DR_DEPTH];         /* bytes wanted of it (a direct read asks whole blocks) */
	bool dio[DR_DEPTH];             /* issued while the fd had O_DIRECT */
	bool busy[DR_DEPTH];
	unsigned inflight;
	bool broken;                    /* the ring failed: the kernel may still own buffers */
};

/* Looks at each landed piece: 0 or -errno, which ends the read. */
typedef int (*rd_check_fn)(void *arg, const uint8_t *p, uint64_t off, size_t n);

static int rd_open(struct rd *r)
{
	int rc;

	memset(r, 0, sizeof(*r));
	for (unsigned i = 0; i < DR_DEPTH; i++)
		if (posix_memalign((void **)&r->buf[i], DR_ALIGN, DR_PIECE) != 0) {
			r->buf[i] = NULL;
			rc = -ENOMEM;
			goto out_free;
		}
	rc = io_uring_queue_init(2 * DR_DEPTH, &r->ring, 0);
	if (rc < 0)
		goto out_free;
	return 0;
out_free:
	for (unsigned i = 0; i < DR_DEPTH; i++)
		free(r->buf[i]);
	return rc;
}

static void rd_close(struct rd *r)
{
	io_uring_queue_exit(&r->ring);
	/* After a ring failure reads may still land in them: leaked on purpose. */
	if (r->broken)
		return;
	for (unsigned i = 0; i < DR_DEPTH; i++)
		free(r->buf[i]);
}

static bool rd_prep(struct rd *r, int fd, unsigned s, uint64_t off, uint32_t len, bool dio)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
	uint32_t ask = dio ? (len + DR_ALIGN - 1) / DR_ALIGN * DR_ALIGN : len;

	if (!sqe)
		return false;
	io_uring_prep_read(sqe, fd, r->buf[s], ask, off);
	io_uring_sqe_set_data64(sqe, s);
	r->off[s] = off;
	r->len[s] = len;
	r->dio[s] = dio;
	r->busy[s] = true;
	r->inflight++;
	return true;
}

static unsigned rd_free_slot(const struct rd *r)
{
	unsigned s = 0;

	while (r->busy[s])
		s++;
	return s;
}

/* Reads [0, len) of fd, DR_DEPTH pieces in flight, and hands each landed
 * piece to check (may be NULL). *direct: in, the fd has O_DIRECT; out,
 * cleared when a read refused it (EINVAL: an alignment this file system
 * wants bigger) and the rest went through the cache. *got: the bytes read,
 * fewer than len only when the file ended early or on an error. Every read
 * started has landed when it returns. 0 or -errno. */
static int rd_file(struct rd *r, int fd, uint64_t len, bool *direct, bool (*cancel)(void *),
		   void *arg, rd_check_fn check, void *carg, uint64_t *got)
{
	uint64_t next = 0, end = len;
	int err = 0;

	*got = 0;
	if (r->broken)
		return -EIO;
	for (;;) {
		struct io_uring_cqe *cqe;
		unsigned s;
		uint32_t n;
		int res, rc;

		while (!err && r->inflight < DR_DEPTH && next < end) {
			if (cancelled(cancel, arg)) {
				err = -ECANCELED;
				break;
			}
			n = end - next < DR_PIECE ? (uint32_t)(end - next) : DR_PIECE;
			if (!rd_prep(r, fd, rd_free_slot(r), next, n, *direct)) {
				err = -EBUSY;
				break;
			}
			next += n;
		}
		if (!r->inflight)
			break;
		rc = io_uring_submit(&r->ring);
		if (rc >= 0)
			while ((rc = io_uring_wait_cqe(&r->ring, &cqe)) == -EINTR)
				;
		if (rc < 0) {
			/* Nothing more will complete: stop, and never reuse the buffers. */
			r->broken = true;
			r->inflight = 0;
			return err ? err : rc;
		}
		s = (unsigned)io_uring_cqe_get_data64(cqe);
		res = cqe->res;
		io_uring_cqe_seen(&r->ring, cqe);
		r->busy[s] = false;
		r->inflight--;
		if (res == -EINVAL && r->dio[s]) {
			if (*direct) {
				set_direct(fd, false);
				*direct = false;
			}
			if (!err && !rd_prep(r, fd, s, r->off[s], r->len[s], false))
				err = -EBUSY;
			continue;
		}
		if (res < 0) {
			if (!err)
				err = res;
			continue;
		}
		n = (uint32_t)res < r->len[s] ? (uint32_t)res : r->len[s];
		if (n < r->len[s] && r->off[s] + n < end)
			end = r->off[s] + n;    /* the file ends here: no reads past it */
		if (!err && n && check)
			err = check(carg, r->buf[s], r->off[s], n);
		*got += n;
	}
	return err;
}

/* ---- the disk probe ---- */

struct probe {
	const char *dir;
	int dfd, fd;
	char name[64];                  /* .stage-doctor.PID.TID */
	uint64_t size;                  /* bytes written and read */
	uint64_t salt;                  /* in every stamp: a block of another run does not match */
	uint64_t bad_off;               /* where the read-back differed */
	struct dr_disk *out;
};

static void stamp_at(uint8_t *p, uint64_t off, uint64_t salt)
{
	uint64_t v = off ^ salt;

	memcpy(p, &v, sizeof(v));
}

/* Bytes that no file system can compress or deduplicate away: each buffer
 * a pseudo-random fill once, then every block stamped with its offset. */
static void fill(uint8_t *p, uint64_t seed)
{
	uint64_t x = seed | 1;

	for (size_t i = 0; i < DR_PIECE; i += sizeof(x)) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(p + i, &x, sizeof(x));
	}
}

static int check_stamps(void *arg, const uint8_t *p, uint64_t off, size_t n)
{
	struct probe *pr = arg;

	for (size_t i = 0; i + sizeof(uint64_t) <= n; i += DR_ALIGN) {
		uint64_t v;

		memcpy(&v, p + i, sizeof(v));
		if (v != ((off + i) ^ pr->salt)) {
			pr->bad_off = off + i;
			return -EILSEQ;
		}
	}
	return 0;
}

static int io_fail(struct probe *p, int err, const char *what)
{
	struct dr_disk *o = p->out;

	if (err == -ENOSPC)
		return why_fail(o->why, sizeof(o->why), err, "no space left on %s (writing %llu MiB to %s)",
			    p->dir, (unsigned long long)(p->size >> 20), p->name);
	if (err == -ECANCELED)
		return why_fail(o->why, sizeof(o->why), err, "the probe of %s was cancelled", p->dir);
	return why_fail(o->why, sizeof(o->why), err, "cannot %s %s/%s: %s", what, p->dir, p->name,
		    strerror(-err));
}

static int write_phase(struct probe *p, bool (*cancel)(void *), void *arg, bool *direct)
{
	bool filled[WQ_DEPTH] = { false };
	uint64_t t0, t1;
	struct wq q;
	int rc, end_rc;

	rc = wq_open(&q);
	if (rc < 0)
		return why_fail(p->out->why, sizeof(p->out->why), rc,
			    "cannot set up io_uring to probe %s: %s", p->dir, strerror(-rc));
	wq_begin(&q, p->fd, p->size, true);
	t0 = mono_ns();
	for (uint64_t off = 0; off < p->size; off += WQ_BUF) {
		int b;

		if (cancelled(cancel, arg)) {
			rc = -ECANCELED;
			break;
		}
		b = wq_buf(&q);
		if (!filled[b]) {
			fill(q.buf[b], p->salt + (uint64_t)b);
			filled[b] = true;
		}
		for (uint32_t i = 0; i < WQ_BUF; i += DR_ALIGN)
			stamp_at(q.buf[b] + i, off + i, p->salt);
		rc = wq_write(&q, b, WQ_BUF, off);
		if (rc < 0)
			break;
	}
	if (rc == 0) {
		wq_sync(&q, p->size);
		rc = wq_drain(&q);
		/* The sync is the ring's unless it could not get an entry. */
		if (rc == 0 && wq_durable(&q) < p->size && fdatasync(p->fd) < 0)
			rc = -errno;
	}
	t1 = mono_ns();
	*direct = q.direct;
	end_rc = wq_end(&q);    /* waits for what a cancel or an error left in flight */
	wq_close(&q);
	if (rc == 0)
		rc = end_rc;
	if (rc < 0)
		return io_fail(p, rc, "write");
	p->out->write_Bps = rate(p->size, t0, t1);
	return 0;
}

static int read_phase(struct probe *p, bool (*cancel)(void *), void *arg, bool *direct)
{
	uint64_t t0, t1, got = 0;
	struct rd r;
	int rc;

	if (cancelled(cancel, arg))
		return io_fail(p, -ECANCELED, "read");
	*direct = set_direct(p->fd, true) == 0;
	/* Through the cache, the pages just written would be what is read;
	 * after the fdatasync they are clean, so this drops them. */
	if (!*direct)
		posix_fadvise(p->fd, 0, 0, POSIX_FADV_DONTNEED);
	rc = rd_open(&r);
	if (rc < 0)
		return why_fail(p->out->why, sizeof(p->out->why), rc,
			    "cannot set up io_uring to probe %s: %s", p->dir, strerror(-rc));
	t0 = mono_ns();
	rc = rd_file(&r, p->fd, p->size, direct, cancel, arg, check_stamps, p, &got);
	t1 = mono_ns();
	rd_close(&r);
	if (rc == -EILSEQ)
		return why_fail(p->out->why, sizeof(p->out->why), -EIO,
			    "%s/%s read back other bytes than were written (at offset %llu)",
			    p->dir, p->name, (unsigned long long)p->bad_off);
	if (rc < 0)
		return io_fail(p, rc, "read back");
	if (got < p->size)
		return why_fail(p->out->why, sizeof(p->out->why), -EIO,
			    "%s/%s read back %llu of the %llu bytes written", p->dir, p->name,
			    (unsigned long long)got, (unsigned long long)p->size);
	p->out->read_Bps = rate(p->size, t0, t1);
	return 0;
}

/* Removes the probe's name if it still is the probe's file. */
static int remove_mine(struct probe *p, const struct stat *mine)
{
	struct stat st;

	if (fstatat(p->dfd, p->name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (st.st_dev != mine->st_dev || st.st_ino != mine->st_ino)
		return 0;
	return unlinkat(p->dfd, p->name, 0) < 0 ? -errno : 0;
}

static uint64_t round_piece(uint64_t bytes)
{
	uint64_t n = bytes / DR_PIECE + (bytes % DR_PIECE != 0);

	if (n == 0)
		n = 1;
	if (n > UINT64_MAX / DR_PIECE)
		n = UINT64_MAX / DR_PIECE;
	return n * DR_PIECE;
}

int dr_disk_probe(const char *dir, uint64_t bytes, bool (*cancel)(void *), void *arg,
		  struct dr_disk *out)
{
	struct probe p = { .dir = dir, .fd = -1, .out = out };
	bool wdirect = false, rdirect = false;
	struct statvfs vfs;
	struct stat st, mine;
	int rc, rm;

	memset(out, 0, sizeof(*out));
	p.size = out->bytes = round_piece(bytes);
	p.dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (p.dfd < 0)
		return out->err = why_fail(out->why, sizeof(out->why), -errno, "cannot open %s: %s",
				       dir, strerror(errno));
	if (fstat(p.dfd, &st) < 0 || fstatvfs(p.dfd, &vfs) < 0) {
		rc = why_fail(out->why, sizeof(out->why), -errno, "cannot stat %s: %s", dir,
			  strerror(errno));
		goto out_close_dir;
	}
	out->dev = st.st_dev;
	out->free_bytes = (uint64_t)vfs.f_bavail * vfs.f_frsize;
	out->total_bytes = (uint64_t)vfs.f_blocks * vfs.f_frsize;
	/* Writing into the last free bytes would fail whatever else writes
	 * there meanwhile (a trainer's checkpoint): refuse instead. */
	if (p.size > out->free_bytes) {
		rc = why_fail(out->why, sizeof(out->why), -ENOSPC,
			  "no space left on %s for the probe (%llu MiB free, it writes %llu MiB)",
			  dir, (unsigned long long)(out->free_bytes >> 20),
			  (unsigned long long)(p.size >> 20));
		goto out_close_dir;
	}
	if (cancelled(cancel, arg)) {
		rc = io_fail(&p, -ECANCELED, "create");
		goto out_close_dir;
	}
	snprintf(p.name, sizeof(p.name), ".stage-doctor.%ld.%ld", (long)getpid(), (long)gettid());
	p.fd = openat(p.dfd, p.name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (p.fd < 0) {
		rc = why_fail(out->why, sizeof(out->why), -errno, "cannot create %s/%s: %s", dir,
			  p.name, strerror(errno));
		goto out_close_dir;
	}
	if (fstat(p.fd, &mine) < 0) {
		/* Just created with O_EXCL: the name is ours. */
		rc = io_fail(&p, -errno, "stat");
		unlinkat(p.dfd, p.name, 0);
		goto out_close_file;
	}
	p.salt = mono_ns() * 0x9e3779b97f4a7c15ull;
	rc = write_phase(&p, cancel, arg, &wdirect);
	if (rc == 0)
		rc = read_phase(&p, cancel, arg, &rdirect);
	out->direct = rc == 0 && wdirect && rdirect;
	rm = remove_mine(&p, &mine);
	if (rm < 0 && rc == 0)
		rc = why_fail(out->why, sizeof(out->why), rm, "cannot remove %s/%s: %s", dir, p.name,
			  strerror(-rm));
out_close_file:
	close(p.fd);
out_close_dir:
	close(p.dfd);
	return out->err = rc;
}

/* ---- the source probe: the walk ---- */

struct frame {
	DIR *d;                         /* owned */
	size_t plen;                    /* its path's length in walker.path (0: ROOT) */
	char *sub[DR_BATCH];            /* subdirectories of the last batch, to descend into */
	unsigned nsub, isub;            /* how many; the next one */
};

struct cand {
	uint64_t size;
	char *rel;                      /* beneath ROOT, owned */
};

struct walker {
	struct io_uring ring;           /* statx only, DR_BATCH entries */
	struct statx stx[DR_BATCH];     /* the batch in flight */
	char names[DR_BATCH][NAME_MAX + 1];
	struct frame stack[DR_MAX_DEPTH];
	unsigned depth;
	char path[PATH_MAX];            /* the top frame's path, then a name */
	uint32_t dev_major, dev_minor;  /* ROOT's file system */
	bool noatime;                   /* O_NOATIME allowed (cleared by the first EPERM) */
	struct cand cand[DR_CANDS];     /* a min-heap by size: the largest files seen */
	unsigned ncand;
	uint64_t entries;
};

static void frame_subs_free(struct frame *f)
{
	for (unsigned i = 0; i < f->nsub; i++)
		free(f->sub[i]);
	f->nsub = f->isub = 0;
}

static void pop(struct walker *w)
{
	struct frame *f = &w->stack[--w->depth];

	frame_subs_free(f);
	closedir(f->d);
}

/* Opens a directory so that listing it leaves its atime alone. */
static int open_dir(struct walker *w, int at, const char *name)
{
	int fl = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
	int fd = openat(at, name, fl | (w->noatime ? O_NOATIME : 0));

	/* Only the owner (or CAP_FOWNER) may ask for O_NOATIME. */
	if (fd < 0 && errno == EPERM && w->noatime) {
		w->noatime = false;
		fd = openat(at, name, fl);
	}
	return fd < 0 ? -errno : fd;
}

static int push(struct walker *w, int fd, size_t plen)
{
	struct frame *f = &w->stack[w->depth];
	DIR *d = fdopendir(fd);

	if (!d) {
		int err = -errno;

		close(fd);
		return err;
	}
	memset(f, 0, sizeof(*f));
	f->d = d;
	f->plen = plen;
	w->depth++;
	return 0;
}

/* Descends into the top frame's next subdirectory; one that cannot be
 * opened, or is no longer a directory of ROOT's file system, is passed over. */
static void descend(struct walker *w, struct frame *f)
{
	const char *name = f->sub[f->isub++];
	size_t nlen = strlen(name), plen = f->plen + (f->plen ? 1 : 0) + nlen;
	struct statx x;
	int fd;

	if (plen >= sizeof(w->path))
		return;
	fd = open_dir(w, dirfd(f->d), name);
	if (fd < 0)
		return;
	if (statx(fd, "", AT_EMPTY_PATH, STATX_TYPE, &x) < 0 || !S_ISDIR(x.stx_mode) ||
	    x.stx_dev_major != w->dev_major || x.stx_dev_minor != w->dev_minor) {
		close(fd);
		return;
	}
	if (f->plen)
		w->path[f->plen] = '/';
	memcpy(w->path + plen - nlen, name, nlen + 1);
	push(w, fd, plen);
}

/* Remembers a regular file if it is among the DR_CANDS largest so far. */
static void cand_add(struct walker *w, struct frame *f, const char *name, uint64_t size)
{
	size_t nlen = strlen(name), len = f->plen + (f->plen ? 1 : 0) + nlen;
	struct cand c = { .size = size };
	unsigned i;

	if (len >= sizeof(w->path) || (w->ncand == DR_CANDS && size <= w->cand[0].size))
		return;
	c.rel = malloc(len + 1);
	if (!c.rel)
		return;
	memcpy(c.rel, w->path, f->plen);
	if (f->plen)
		c.rel[f->plen] = '/';
	memcpy(c.rel + len - nlen, name, nlen + 1);
	if (w->ncand < DR_CANDS) {
		/* Sift up. */
		i = w->ncand++;
		while (i && w->cand[(i - 1) / 2].size > c.size) {
			w->cand[i] = w->cand[(i - 1) / 2];
			i = (i - 1) / 2;
		}
		w->cand[i] = c;
		return;
	}
	/* Replace the smallest, sift down. */
	free(w->cand[0].rel);
	i = 0;
	for (;;) {
		unsigned l = 2 * i + 1, m = l;

		if (l >= w->ncand)
			break;
		if (l + 1 < w->ncand && w->cand[l + 1].size < w->cand[l].size)
			m = l + 1;
		if (w->cand[m].size >= c.size)
			break;
		w->cand[i] = w->cand[m];
		i = m;
	}
	w->cand[i] = c;
}

/* Reads up to want names of the top frame: how many, 0 at its end, -errno. */
static int list_some(struct walker *w, struct frame *f, unsigned want)
{
	unsigned k = 0;
	struct dirent *d;

	errno = 0;
	while (k < want && (d = readdir(f->d))) {
		size_t len = strlen(d->d_name);

		if (d->d_name[0] == '.' && (len == 1 || (len == 2 && d->d_name[1] == '.')))
			continue;
		memcpy(w->names[k++], d->d_name, len + 1);
		errno = 0;
	}
	if (!k && errno)
		return -errno;
	return (int)k;
}

/* Stats names[0..k) of the top frame at once through the ring. 0, or the
 * ring's -errno. */
static int stat_batch(struct walker *w, struct frame *f, unsigned k)
{
	unsigned seen = 0;
	int rc;

	/* The ring holds DR_BATCH entries and is empty between batches. */
	for (unsigned i = 0; i < k; i++) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);

		io_uring_prep_statx(sqe, dirfd(f->d), w->names[i],
				    AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT,
				    STATX_TYPE | STATX_MODE | STATX_SIZE, &w->stx[i]);
		io_uring_sqe_set_data64(sqe, i);
	}
	rc = io_uring_submit(&w->ring);
	if (rc != (int)k)
		return rc < 0 ? rc : -EIO;
	while (seen < k) {
		struct io_uring_cqe *cqe;
		const struct statx *x;
		unsigned i;

		rc = io_uring_wait_cqe(&w->ring, &cqe);
		if (rc == -EINTR)
			continue;
		if (rc < 0)
			return rc;
		i = (unsigned)io_uring_cqe_get_data64(cqe);
		rc = cqe->res;
		io_uring_cqe_seen(&w->ring, cqe);
		seen++;
		if (rc < 0)
			continue;       /* gone since the listing, or not ours to see */
		x = &w->stx[i];
		w->entries++;
		if (S_ISREG(x->stx_mode) && x->stx_size > 0)
			cand_add(w, f, w->names[i], x->stx_size);
		else if (S_ISDIR(x->stx_mode) && x->stx_dev_major == w->dev_major &&
			 x->stx_dev_minor == w->dev_minor && w->depth < DR_MAX_DEPTH &&
			 (f->sub[f->nsub] = strdup(w->names[i])))
			f->nsub++;
	}
	return 0;
}

/* Depth first from ROOT until the tree ends or a bound is reached. 0, or
 * -errno with why (ROOT not listable, the ring, cancel). */
static int walk(struct walker *w, int rootfd, const char *root, uint32_t max_entries,
		uint64_t deadline, bool (*cancel)(void *), void *arg, struct dr_source *o)
{
	int rc = open_dir(w, rootfd, ".");

	if (rc < 0 || (rc = push(w, rc, 0)) < 0)
		return why_fail(o->why, sizeof(o->why), rc, "cannot list %s: %s", root,
			    strerror(-rc));
	while (w->depth) {
		struct frame *f = &w->stack[w->depth - 1];
		unsigned want = DR_BATCH;
		int k;

		if (cancelled(cancel, arg))
			return why_fail(o->why, sizeof(o->why), -ECANCELED,
				    "the probe of %s was cancelled", root);
		if (max_entries) {
			if (w->entries >= max_entries)
				break;
			if (max_entries - w->entries < want)
				want = (unsigned)(max_entries - w->entries);
		}
		if (deadline && mono_ns() >= deadline)
			break;
		if (f->isub < f->nsub) {
			descend(w, f);
			continue;
		}
		frame_subs_free(f);
		k = list_some(w, f, want);
		if (k < 0 && w->depth == 1)
			return why_fail(o->why, sizeof(o->why), k, "cannot list %s: %s", root,
				    strerror(-k));
		if (k <= 0) {
			pop(w);         /* done, or a directory below ROOT that fails: passed over */
			continue;
		}
		rc = stat_batch(w, f, (unsigned)k);
		if (rc < 0)
			return why_fail(o->why, sizeof(o->why), rc, "cannot stat the names in %s: %s",
				    root, strerror(-rc));
	}
	return 0;
}

/* ---- the source probe: the reads ---- */

/* Opens REL beneath ROOT for reading, never through a symlink or onto
 * another file system, O_DIRECT and O_NOATIME while allowed. fd or -errno. */
static int open_beneath(int rootfd, const char *rel, bool *direct_ok, bool *noatime)
{
	for (;;) {
		struct open_how how = {
			.flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC |
				 (*direct_ok ? O_DIRECT : 0) | (*noatime ? O_NOATIME : 0),
			.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
				   RESOLVE_NO_XDEV,
		};
		int fd = (int)syscall(SYS_openat2, rootfd, rel, &how, sizeof(how));

		if (fd >= 0)
			return fd;
		if (errno == EINVAL && *direct_ok)
			*direct_ok = false;     /* this file system has no O_DIRECT */
		else if (errno == EPERM && *noatime)
			*noatime = false;
		else
			return -errno;
	}
}

static int cand_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;

	return x->size < y->size ? 1 : x->size > y->size ? -1 : strcmp(x->rel, y->rel);
}

/* The largest files first, until bytes are read. */
static int read_cands(struct walker *w, int rootfd, const char *root, uint64_t bytes,
		      bool (*cancel)(void *), void *arg, struct dr_source *o)
{
	bool direct_ok = true, all_direct = true;
	int first_err = 0, rc = 0;
	const char *first_rel = NULL;
	unsigned opened = 0;
	uint64_t t0, t1;
	struct rd r;

	if (!w->ncand || !bytes)
		return 0;
	qsort(w->cand, w->ncand, sizeof(w->cand[0]), cand_cmp);
	rc = rd_open(&r);
	if (rc < 0)
		return why_fail(o->why, sizeof(o->why), rc, "cannot set up io_uring to probe %s: %s",
			    root, strerror(-rc));
	t0 = mono_ns();
	for (unsigned i = 0; i < w->ncand && o->bytes_read < bytes; i++) {
		const char *rel = w->cand[i].rel;
		uint64_t want, got = 0;
		struct stat st;
		bool dio;
		int fd;

		if (cancelled(cancel, arg)) {
			rc = why_fail(o->why, sizeof(o->why), -ECANCELED, "the probe of %s was cancelled",
				  root);
			break;
		}
		fd = open_beneath(rootfd, rel, &direct_ok, &w->noatime);
		if (fd < 0) {
			if (!first_err) {
				first_err = fd;
				first_rel = rel;
			}
			continue;
		}
		dio = direct_ok;
		if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
			close(fd);
			continue;
		}
		opened++;
		want = bytes - o->bytes_read;
		if ((uint64_t)st.st_size < want)
			want = (uint64_t)st.st_size;
		rc = rd_file(&r, fd, want, &dio, cancel, arg, NULL, NULL, &got);
		close(fd);
		o->bytes_read += got;
		if (got && !dio)
			all_direct = false;
		if (rc == -ECANCELED) {
			rc = why_fail(o->why, sizeof(o->why), rc, "the probe of %s was cancelled", root);
			break;
		}
		if (rc < 0) {
			rc = why_fail(o->why, sizeof(o->why), rc, "cannot read %s/%s: %s", root, rel,
				  strerror(-rc));
			break;
		}
	}
	t1 = mono_ns();
	rd_close(&r);
	if (rc == 0 && !opened && first_err)
		rc = why_fail(o->why, sizeof(o->why), first_err,
			  "cannot read any file under %s (%s: %s)", root, first_rel,
			  strerror(-first_err));
	if (o->bytes_read) {
		o->read_Bps = rate(o->bytes_read, t0, t1);
		o->direct = all_direct;
	}
	return rc;
}

int dr_source_probe(const char *root, uint64_t bytes, uint32_t max_entries, int time_ms,
		    bool (*cancel)(void *), void *arg, struct dr_source *out)
{
	uint64_t t0, t1, deadline;
	struct walker *w;
	struct statx x;
	int rootfd, rc;

	memset(out, 0, sizeof(*out));
	rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0)
		return out->err = why_fail(out->why, sizeof(out->why), -errno,
				       "cannot open source root %s: %s", root, strerror(errno));
	if (statx(rootfd, "", AT_EMPTY_PATH, STATX_TYPE, &x) < 0) {
		rc = why_fail(out->why, sizeof(out->why), -errno, "cannot stat %s: %s", root,
			  strerror(errno));
		goto out_close_root;
	}
	w = calloc(1, sizeof(*w));
	if (!w) {
		rc = why_fail(out->why, sizeof(out->why), -ENOMEM, "probe of %s: %s", root,
			  strerror(ENOMEM));
		goto out_close_root;
	}
	w->dev_major = x.stx_dev_major;
	w->dev_minor = x.stx_dev_minor;
	w->noatime = true;
	rc = io_uring_queue_init(DR_BATCH, &w->ring, 0);
	if (rc < 0) {
		rc = why_fail(out->why, sizeof(out->why), rc, "cannot set up io_uring to probe %s: %s",
			  root, strerror(-rc));
		goto out_free_walker;
	}
	{
		/* As the pull's walk: enough workers for a batch of cold inodes. */
		unsigned workers[2] = { 64, 0 };

		io_uring_register_iowq_max_workers(&w->ring, workers);
	}
	t0 = mono_ns();
	deadline = time_ms > 0 ? t0 + (uint64_t)time_ms * 1000000u : 0;
	rc = walk(w, rootfd, root, max_entries, deadline, cancel, arg, out);
	t1 = mono_ns();
	while (w->depth)
		pop(w);
	io_uring_queue_exit(&w->ring);
	out->entries = w->entries;
	if (w->entries)
		out->files_per_s = rate(w->entries, t0, t1);
	if (rc == 0)
		rc = read_cands(w, rootfd, root, bytes, cancel, arg, out);
out_free_walker:
	for (unsigned i = 0; i < w->ncand; i++)
		free(w->cand[i].rel);
	free(w);
out_close_root:
	close(rootfd);
	return out->err = rc;
}
