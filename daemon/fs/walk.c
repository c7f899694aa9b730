/* Merge walk: see walk.h.
 *
 * State: a stack of frames, one per directory on the current path. A frame
 * holds the directory's fds in both trees, both sorted listings and the two
 * merge cursors. w->path holds the relative path of the top frame followed by
 * the name last returned. w->descend is set when the last entry returned was
 * a source directory; the next call pushes its frame first.
 */
#include "daemon/fs/walk.h"
#include "daemon/fs/cred.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/manifest.h"

struct name {
	size_t off;            /* into listing.arena */
	unsigned char dtype;   /* DT_* from getdents, DT_UNKNOWN possible */
};

/* What the walk needs of a source entry's inode, from statx. */
struct attr {
	int err;               /* 0 or -errno of the statx */
	bool lazy;             /* not stat'ed (WALK_LAZY) */
	uint32_t mode, uid, gid;
	uint64_t size, ino;
	int64_t mtime_ns;
	int64_t ctime_ns;      /* what a record of a deep verify is checked against */
};

struct listing {
	char *arena;
	size_t arena_len, arena_cap;
	struct name *v;
	struct attr *a;        /* source listings: one per name, in v's order */
	size_t n, cap;
};

struct frame {
	int src_fd, other_fd;  /* owned; other_fd -1 if absent */
	size_t path_len;       /* length of this directory's path in w->path */
	struct listing src, other;
	size_t i, j;           /* merge cursors into src.v and other.v */
};

struct walk {
	struct frame *stack;
	size_t depth, cap;
	char path[MF_MAX_PATH + 256];
	bool descend;
	size_t last_len;       /* path length including the last returned name */
	char why[MF_MAX_PATH + 1024];
	char err_rel[MF_MAX_PATH + 256]; /* the entry the last error is about */
	/* A directory's names are stat'ed together through io_uring: cold, each
	 * statx waits on an inode read, and many at once is what makes a walk
	 * of a cold tree fast. Without a ring, one fstatat at a time. The ring
	 * is set up once the walk has more than RING_AFTER names to stat: a
	 * small tree (a checkpoint of a few shards, surveyed for every
	 * verify --cluster) stats them faster than a ring is made and torn
	 * down (its unmaps cost every CPU a TLB flush). */
	struct io_uring ring;
	bool have_ring, ring_tried;
	unsigned personality;          /* the ring's user (cred.h), 0: the daemon */
	size_t nstat;          /* names stat'ed so far */
	struct statx *stx;     /* STAT_BATCH results in flight */
	bool lazy;             /* WALK_LAZY */
};

#define STAT_BATCH 256u
#define RING_AFTER 64u

/* Remembers which entry an error is about: the first len bytes of w->path. */
static void err_at(struct walk *w, size_t len)
{
	memcpy(w->err_rel, w->path, len);
	w->err_rel[len] = '\0';
}

char walk_type_of_mode(mode_t m)
{
	if (S_ISDIR(m))
		return 'd';
	if (S_ISREG(m))
		return 'f';
	if (S_ISLNK(m))
		return 'l';
	return '?';
}

static char type_of_dtype(unsigned char t)
{
	switch (t) {
	case DT_DIR: return 'd';
	case DT_REG: return 'f';
	case DT_LNK: return 'l';
	case DT_UNKNOWN: return 0;
	default: return '?';
	}
}

static void listing_free(struct listing *l)
{
	free(l->arena);
	free(l->a);
	free(l->v);
	memset(l, 0, sizeof(*l));
}

static const char *listing_name(const struct listing *l, size_t i)
{
	return l->arena + l->v[i].off;
}

static int name_cmp(const void *a, const void *b, void *arena)
{
	/* strcmp compares as unsigned char: memcmp order, the manifest's. */
	return strcmp((const char *)arena + ((const struct name *)a)->off,
		      (const char *)arena + ((const struct name *)b)->off);
}

/* Reads and sorts a directory. Takes ownership of nothing: dirfd stays open. */
static int listing_read(struct listing *l, int dirfd, bool top)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct dirent *d;
	DIR *dir;

	if (fd < 0)
		return -errno;
	dir = fdopendir(fd);
	if (!dir) {
		int err = -errno;

		close(fd);
		return err;
	}
	errno = 0;
	while ((d = readdir(dir))) {
		size_t len = strlen(d->d_name);

		if (d->d_name[0] == '.' && (len == 1 || (len == 2 && d->d_name[1] == '.')))
			continue;
		if (top && strcmp(d->d_name, MF_DIRNAME) == 0)
			continue;
		if (l->n == l->cap) {
			size_t cap = l->cap ? 2 * l->cap : 64;
			struct name *v = realloc(l->v, cap * sizeof(*v));

			if (!v)
				goto out_nomem;
			l->v = v;
			l->cap = cap;
		}
		if (l->arena_len + len + 1 > l->arena_cap) {
			size_t cap = l->arena_cap ? 2 * l->arena_cap : 4096;
			char *a;

			while (cap < l->arena_len + len + 1)
				cap *= 2;
			a = realloc(l->arena, cap);
			if (!a)
				goto out_nomem;
			l->arena = a;
			l->arena_cap = cap;
		}
		memcpy(l->arena + l->arena_len, d->d_name, len + 1);
		l->v[l->n].off = l->arena_len;
		l->v[l->n].dtype = d->d_type;
		l->n++;
		l->arena_len += len + 1;
		errno = 0;
	}
	if (errno) {
		int err = -errno;

		closedir(dir);
		return err;
	}
	closedir(dir);
	if (l->n)
		qsort_r(l->v, l->n, sizeof(*l->v), name_cmp, l->arena);
	return 0;

out_nomem:
	closedir(dir);
	return -ENOMEM;
}

/* Manifests keep mtimes as int64 nanoseconds: years 1678 to 2262. A file
 * outside (ext4 allows 2446) is an error for that entry, never a wrap. */
static int mtime_to_ns(int64_t sec, int64_t nsec, int64_t *out)
{
	int64_t ns;

	if (__builtin_mul_overflow(sec, (int64_t)1000000000, &ns) ||
	    __builtin_add_overflow(ns, nsec, &ns))
		return -EOVERFLOW;
	*out = ns;
	return 0;
}

static void attr_from_statx(struct attr *a, const struct statx *x)
{
	a->mode = x->stx_mode;
	a->uid = x->stx_uid;
	a->gid = x->stx_gid;
	a->size = x->stx_size;
	a->ino = x->stx_ino;
	a->ctime_ns = (int64_t)x->stx_ctime.tv_sec * 1000000000 + x->stx_ctime.tv_nsec;
	a->err = mtime_to_ns(x->stx_mtime.tv_sec, x->stx_mtime.tv_nsec, &a->mtime_ns);
}

static void attr_from_stat(struct attr *a, const struct stat *st)
{
	a->mode = st->st_mode;
	a->uid = st->st_uid;
	a->gid = st->st_gid;
	a->size = (uint64_t)st->st_size;
	a->ino = st->st_ino;
	a->ctime_ns = (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec;
	a->err = mtime_to_ns(st->st_mtim.tv_sec, st->st_mtim.tv_nsec, &a->mtime_ns);
}

static bool listed(const struct listing *l, const char *name)
{
	size_t lo = 0, hi = l->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(listing_name(l, mid), name);

		if (c == 0)
			return true;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return false;
}

static void ring_setup(struct walk *w)
{
	unsigned workers[2] = { 64, 0 };

	w->ring_tried = true;
	w->stx = malloc(STAT_BATCH * sizeof(*w->stx));
	if (w->stx && io_uring_queue_init(STAT_BATCH, &w->ring, 0) == 0) {
		io_uring_register_iowq_max_workers(&w->ring, workers);
		w->personality = cred_ring_personality(&w->ring);
		w->have_ring = true;
	}
}

/* Stats the names idx[0..n) of a listing, STAT_BATCH at a time. */
static int stat_some(struct walk *w, struct listing *l, const size_t *idx, size_t n, int dirfd)
{
	int ret;

	for (size_t base = 0; base < n; base += STAT_BATCH) {
		size_t k = n - base < STAT_BATCH ? n - base : STAT_BATCH;
		struct io_uring_cqe *cqe;
		unsigned seen = 0;

		if (!w->have_ring && !w->ring_tried && w->nstat + k > RING_AFTER)
			ring_setup(w);
		w->nstat += k;
		if (!w->have_ring) {
			for (size_t i = base; i < base + k; i++) {
				struct stat st;

				if (fstatat(dirfd, listing_name(l, idx[i]), &st, AT_SYMLINK_NOFOLLOW) < 0)
					l->a[idx[i]].err = -errno;
				else
					attr_from_stat(&l->a[idx[i]], &st);
			}
			continue;
		}
		/* The ring holds STAT_BATCH entries and is empty between batches, so
		 * every sqe is there; a submit that fails leaves nothing in flight. */
		for (size_t i = 0; i < k; i++) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);

			io_uring_prep_statx(sqe, dirfd, listing_name(l, idx[base + i]),
					    AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT,
					    STATX_TYPE | STATX_MODE | STATX_UID | STATX_GID |
					    STATX_SIZE | STATX_MTIME | STATX_CTIME | STATX_INO,
					    &w->stx[i]);
			io_uring_sqe_set_data64(sqe, i);
		}
		cred_ring_stamp(&w->ring, w->personality);
		ret = io_uring_submit(&w->ring);
		if (ret != (int)k)
			return ret < 0 ? ret : -EIO;
		while (seen < k) {
			size_t i;

			ret = io_uring_wait_cqe(&w->ring, &cqe);
			if (ret == -EINTR)
				continue;
			/* Cannot happen with completions owed; if it did, the ring
			 * is unusable: say so rather than wait forever. */
			if (ret < 0) {
				io_uring_queue_exit(&w->ring);
				w->have_ring = false;
				return ret;
			}
			i = (size_t)io_uring_cqe_get_data64(cqe);
			if (cqe->res < 0)
				l->a[idx[base + i]].err = cqe->res;
			else
				attr_from_statx(&l->a[idx[base + i]], &w->stx[i]);
			io_uring_cqe_seen(&w->ring, cqe);
			seen++;
		}
	}
	return 0;
}

/* Stats the names of a source listing: all of them, or in a lazy walk
 * those that are not regular files only the source has. */
static int listing_stat(struct walk *w, struct listing *l, const struct listing *other,
			int dirfd)
{
	size_t *idx, n = 0;
	int ret;

	l->a = calloc(l->n ? l->n : 1, sizeof(*l->a));
	idx = malloc((l->n ? l->n : 1) * sizeof(*idx));
	if (!l->a || !idx) {
		free(idx);
		return -ENOMEM;
	}
	for (size_t i = 0; i < l->n; i++) {
		if (w->lazy && l->v[i].dtype == DT_REG && !listed(other, listing_name(l, i)))
			l->a[i].lazy = true;
		else
			idx[n++] = i;
	}
	ret = stat_some(w, l, idx, n, dirfd);
	free(idx);
	return ret;
}

static int push(struct walk *w, int src_fd, int other_fd, size_t path_len)
{
	struct frame *f;
	bool top = w->depth == 0;
	int ret;

	if (w->depth == w->cap) {
		size_t cap = w->cap ? 2 * w->cap : 16;
		struct frame *s = realloc(w->stack, cap * sizeof(*s));

		if (!s)
			return -ENOMEM;
		w->stack = s;
		w->cap = cap;
	}
	f = &w->stack[w->depth];
	memset(f, 0, sizeof(*f));
	f->src_fd = src_fd;
	f->other_fd = other_fd;
	f->path_len = path_len;
	ret = listing_read(&f->src, src_fd, top);
	if (ret < 0) {
		err_at(w, path_len);
		snprintf(w->why, sizeof(w->why), "cannot list directory '%.*s': %s",
			 (int)path_len, path_len ? w->path : ".", strerror(-ret));
		goto out_free;
	}
	if (other_fd >= 0) {
		ret = listing_read(&f->other, other_fd, top);
		if (ret < 0) {
			err_at(w, path_len);
			snprintf(w->why, sizeof(w->why),
				 "cannot list destination directory '%.*s': %s",
				 (int)path_len, path_len ? w->path : ".", strerror(-ret));
			goto out_free;
		}
	}
	ret = listing_stat(w, &f->src, &f->other, src_fd);
	if (ret < 0) {
		err_at(w, path_len);
		snprintf(w->why, sizeof(w->why), "cannot stat the names in '%.*s': %s",
			 (int)path_len, path_len ? w->path : ".", strerror(-ret));
		goto out_free;
	}
	w->depth++;
	return 0;

out_free:
	listing_free(&f->src);
	listing_free(&f->other);
	return ret;
}

static void pop(struct walk *w)
{
	struct frame *f = &w->stack[--w->depth];

	listing_free(&f->src);
	listing_free(&f->other);
	/* The roots are the caller's; only frames above the bottom own fds. */
	if (w->depth > 0) {
		close(f->src_fd);
		if (f->other_fd >= 0)
			close(f->other_fd);
	}
}

int walk_open(struct walk **out, int src_root, int other_root, unsigned flags)
{
	struct walk *w = calloc(1, sizeof(*w));
	int ret;

	if (!w)
		return -ENOMEM;
	w->lazy = flags & WALK_LAZY;
	ret = push(w, src_root, other_root, 0);
	if (ret < 0) {
		walk_close(w);
		return ret;
	}
	*out = w;
	return 0;
}

void walk_close(struct walk *w)
{
	if (!w)
		return;
	while (w->depth)
		pop(w);
	if (w->have_ring)
		io_uring_queue_exit(&w->ring);
	free(w->stx);
	free(w->stack);
	free(w);
}

void walk_skip(struct walk *w)
{
	w->descend = false;
}

const char *walk_why(const struct walk *w)
{
	return w->why;
}

const char *walk_err_path(const struct walk *w)
{
	return w->err_rel[0] ? w->err_rel : ".";
}

static int descend(struct walk *w)
{
	struct frame *parent = &w->stack[w->depth - 1];
	const char *name = w->path + parent->path_len + (parent->path_len ? 1 : 0);
	int src_fd, other_fd = -1;
	int ret;

	src_fd = openat(parent->src_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (src_fd < 0) {
		ret = -errno;
		err_at(w, w->last_len);
		snprintf(w->why, sizeof(w->why), "cannot open directory '%s': %s", w->path,
			 strerror(-ret));
		return ret;
	}
	if (parent->other_fd >= 0) {
		other_fd = openat(parent->other_fd, name,
				  O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (other_fd < 0 && errno != ENOENT && errno != ENOTDIR) {
			ret = -errno;
			err_at(w, w->last_len);
			snprintf(w->why, sizeof(w->why),
				 "cannot open destination directory '%s': %s", w->path,
				 strerror(-ret));
			close(src_fd);
			return ret;
		}
	}
	ret = push(w, src_fd, other_fd, w->last_len);
	if (ret < 0) {
		close(src_fd);
		if (other_fd >= 0)
			close(other_fd);
	}
	return ret;
}

int walk_next(struct walk *w, struct walk_ent *e)
{
	if (w->descend) {
		int ret;

		w->descend = false;
		ret = descend(w);
		if (ret < 0)
			return ret;
	}
	while (w->depth) {
		struct frame *f = &w->stack[w->depth - 1];
		const char *sn = f->i < f->src.n ? listing_name(&f->src, f->i) : NULL;
		const char *on = f->j < f->other.n ? listing_name(&f->other, f->j) : NULL;
		const char *name;
		size_t len, plen = f->path_len;
		int cmp;

		if (!sn && !on) {
			pop(w);
			continue;
		}
		cmp = !sn ? 1 : !on ? -1 : strcmp(sn, on);
		name = cmp <= 0 ? sn : on;
		len = strlen(name);
		if (plen + 1 + len >= MF_MAX_PATH) {
			err_at(w, plen);
			snprintf(w->why, sizeof(w->why), "path too long: '%.*s/%s'", (int)plen,
				 w->path, name);
			if (cmp <= 0)
				f->i++;
			if (cmp >= 0)
				f->j++;
			return -ENAMETOOLONG;
		}
		if (plen)
			w->path[plen++] = '/';
		memcpy(w->path + plen, name, len + 1);
		w->last_len = plen + len;

		memset(e, 0, sizeof(*e));
		e->rel = w->path;
		e->name = w->path + plen;
		e->src_dirfd = f->src_fd;
		e->other_dirfd = f->other_fd;
		e->side = cmp < 0 ? WALK_SRC : cmp > 0 ? WALK_OTHER : WALK_BOTH;
		if (cmp >= 0) {
			e->other_type = type_of_dtype(f->other.v[f->j].dtype);
			if (!e->other_type) {
				struct stat st;

				e->other_type = fstatat(f->other_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0
					? walk_type_of_mode(st.st_mode) : '?';
			}
			f->j++;
		}
		if (cmp <= 0) {
			f->i++;
			const struct attr *a = &f->src.a[f->i - 1];

			if (a->lazy) {
				e->lazy = true;
				e->st.st_mode = S_IFREG;
				e->type = 'f';
			} else if (a->err) {
				int err = a->err;

				/* Vanished between listing and stat: it is simply not there. */
				if (err == -ENOENT && e->side == WALK_SRC)
					continue;
				if (err == -ENOENT) {
					e->side = WALK_OTHER;
				} else {
					err_at(w, w->last_len);
					snprintf(w->why, sizeof(w->why), "cannot stat '%s': %s",
						 w->path, err == -EOVERFLOW
						 ? "mtime outside what a manifest records (1678 to 2262)"
						 : strerror(-err));
					return err;
				}
			} else {
				e->st.st_mode = a->mode;
				e->st.st_uid = a->uid;
				e->st.st_gid = a->gid;
				e->st.st_size = (off_t)a->size;
				e->st.st_ino = a->ino;
				e->mtime_ns = a->mtime_ns;
				e->ctime_ns = a->ctime_ns;
				e->type = walk_type_of_mode(e->st.st_mode);
				w->descend = e->type == 'd';
			}
		}
		return 1;
	}
	return 0;
}
