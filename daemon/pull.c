/* The pull engine.
 *
 * One pass over the source tree (walk.c, merged with the destination), one
 * io_uring copier (copier.c) with many files in flight, and a window of
 * pending entries retired strictly in walk order into the manifest journal.
 *
 * Files in DEST/.stage/ and what they mean:
 *   manifest          the tree is complete and this is its content (last)
 *   manifest.partial  the journal of the pull in progress: the entries
 *                     retired so far, in order; each names a file that is
 *                     already under its final name with that content
 *   manifest.prev     the manifest of the last complete pull, moved aside
 *                     while the tree is being changed
 *   manifest.resume   the journal of an interrupted pull, read by this one
 *   lock              flock'd by the pull in progress
 *
 * Invariants:
 * - Nothing is written under a final name but by rename of a temporary
 *   (".stage-tmp.*") that was complete, given its metadata and fdatasync'd.
 * - A manifest exists only for a tree that matches it: the old one is moved
 *   aside before the first change, the new one renamed in after the last.
 * - An entry reaches the journal only after its file is under its final name,
 *   so after kill -9 the journal is a sorted list of finished files: the next
 *   pull reuses them (same size and mtime in source and destination) instead
 *   of copying them again.
 * - Memory: the copier's budget, the walk's listings, and at most WINDOW
 *   pending entries.
 */
#include "daemon/pull.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/manifest.h"
#include "common/paths.h"
#include "daemon/copier.h"
#include "daemon/cursor.h"
#include "daemon/roots.h"
#include "daemon/treeops.h"
#include "daemon/verify.h"
#include "daemon/walk.h"

#define WINDOW 8192u
#define TMP_PREFIX ".stage-tmp."

/* P_WAIT: in the copier. P_LANDED: complete in its temporary, waiting for
 * the batch's syncfs and rename. P_READY: under its final name (or needs no
 * I/O), to be journaled. P_FAILED: to be skipped. */
enum pend_state { P_WAIT, P_LANDED, P_READY, P_FAILED };

/* Durability comes in batches: a temporary is made durable before its
 * rename by one syncfs for many files, which costs far less than an
 * fdatasync each (those force every small file's writeback and a journal
 * commit one by one: a quarter of a small-file pull's time). */
#define BATCH_FILES 1024u
#define BATCH_BYTES (256ull << 20)
#define BATCH_NS 50000000ull

struct pending {
	struct mf_entry e;       /* what the manifest will say; e.path owned */
	enum pend_state st;
	uid_t uid;               /* directories: owner to give at the end */
	gid_t gid;
	char *tmp;               /* temporary name while copying, owned */
	struct cp_file cf;
	struct pull *p;
};

struct dir_meta {
	char *path;              /* owned */
	uint32_t mode;
	int64_t mtime_ns;
	uid_t uid;
	gid_t gid;
};

struct pull {
	struct job *job;
	const struct stage_config *cfg;
	char *src, *dst;             /* resolved absolute paths, owned */
	int src_fd, dst_fd, stage_fd, lock_fd;
	struct copier *cp;
	struct mf_writer *mw;
	struct cursor prev, resume;  /* what earlier pulls knew */
	struct pending *win;         /* WINDOW slots, a ring */
	size_t head, count;
	struct dir_meta *dirs;       /* directories being filled, outermost first */
	size_t ndirs, dirs_cap;
	bool as_root;
	uint64_t t_flush_ns;
	/* results */
	uint64_t files, bytes, copied, bytes_copied, removed, failed;
	uint64_t dropped;            /* staged files verify found bad, removed */
	uint64_t landed, landed_bytes; /* P_LANDED entries in the window */
	uint64_t t_landed_ns;        /* when the oldest of them landed */
	int fatal;                   /* -errno of a destination failure */
	char fatal_why[1024];
};

static void note_fatal(struct pull *p, int err, const char *fmt, const char *a, const char *b)
{
	if (p->fatal)
		return;
	p->fatal = err;
	snprintf(p->fatal_why, sizeof(p->fatal_why), fmt, a, b, strerror(-err));
}

static int64_t mtime_ns(const struct stat *st)
{
	return (int64_t)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
}

static struct timespec ts_of(int64_t ns)
{
	struct timespec t = { .tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL };

	if (t.tv_nsec < 0) {
		t.tv_sec--;
		t.tv_nsec += 1000000000LL;
	}
	return t;
}

static void apply_meta(struct pull *p, const char *rel, uint32_t mode, int64_t mtime,
		       uid_t uid, gid_t gid, bool link)
{
	struct timespec ts[2] = { ts_of(mtime), ts_of(mtime) };
	const char *at = *rel ? rel : ".";

	if (p->as_root && fchownat(p->dst_fd, at, uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
		log_warn("pull %s: chown '%s': %s", p->dst, at, strerror(errno));
	if (!link && fchmodat(p->dst_fd, at, mode, 0) < 0)
		log_warn("pull %s: chmod '%s': %s", p->dst, at, strerror(errno));
	if (utimensat(p->dst_fd, at, ts, AT_SYMLINK_NOFOLLOW) < 0)
		log_warn("pull %s: set times of '%s': %s", p->dst, at, strerror(errno));
}

/* Directories get their mode and mtime once everything inside is retired:
 * before that, adding and removing names would move the mtime again. */
static void close_dirs_until(struct pull *p, const char *rel)
{
	while (p->ndirs) {
		struct dir_meta *d = &p->dirs[p->ndirs - 1];
		size_t n = strlen(d->path);

		if (rel && strncmp(rel, d->path, n) == 0 && rel[n] == '/')
			return;
		apply_meta(p, d->path, d->mode, d->mtime_ns, d->uid, d->gid, false);
		free(d->path);
		p->ndirs--;
	}
}

static int open_dir(struct pull *p, const struct pending *pe)
{
	struct dir_meta *d;

	if (p->ndirs == p->dirs_cap) {
		size_t cap = p->dirs_cap ? 2 * p->dirs_cap : 16;
		struct dir_meta *v = realloc(p->dirs, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		p->dirs = v;
		p->dirs_cap = cap;
	}
	d = &p->dirs[p->ndirs];
	d->path = strdup(pe->e.path);
	if (!d->path)
		return -ENOMEM;
	d->mode = pe->e.mode;
	d->mtime_ns = pe->e.mtime_ns;
	d->uid = pe->uid;
	d->gid = pe->gid;
	p->ndirs++;
	return 0;
}

static struct pending *win_push(struct pull *p)
{
	struct pending *pe = &p->win[(p->head + p->count) % WINDOW];

	memset(pe, 0, sizeof(*pe));
	pe->p = p;
	p->count++;
	return pe;
}

/* Retires finished entries from the head of the window, in walk order. */
static void retire(struct pull *p)
{
	while (p->count) {
		struct pending *pe = &p->win[p->head];
		int ret;

		if (pe->st == P_WAIT || pe->st == P_LANDED)
			break;
		close_dirs_until(p, pe->e.path);
		if (pe->st == P_READY) {
			ret = mf_writer_add(p->mw, &pe->e);
			if (ret < 0)
				note_fatal(p, ret, "%s%s: writing the manifest journal: %s", p->dst, "");
			if (pe->e.type == MF_DIR && open_dir(p, pe) < 0)
				note_fatal(p, -ENOMEM, "%s%s: %s", p->dst, "");
			if (pe->e.type == MF_FILE) {
				atomic_fetch_add(&p->job->files_done, 1);
				atomic_fetch_add(&p->job->bytes_done, pe->e.size);
				p->files++;
				p->bytes += pe->e.size;
			}
		}
		mf_entry_free(&pe->e);
		free(pe->tmp);
		pe->tmp = NULL;
		p->head = (p->head + 1) % WINDOW;
		p->count--;
	}
	if (job_now_ns() - p->t_flush_ns > 20000000ull) {
		/* The journal is what a killed pull resumes from: keep it recent. */
		mf_writer_flush(p->mw);
		p->t_flush_ns = job_now_ns();
	}
}

static void on_copied(struct cp_file *cf, void *arg)
{
	struct pending *pe = cf->owner;
	struct pull *p = arg;

	if (cf->src_in_dst && cf->err && !cf->err_dst) {
		/* Adopting failed (the file changed under us?): copy it after all. */
		pe->st = P_FAILED;
		p->failed++;
		job_note(p->job, LOG_ERROR, "unreadable", pe->e.path, "cannot read %s/%s (%s): %s",
			 p->dst, pe->e.path, cf->err_op, strerror(-cf->err));
	} else if (cf->err) {
		pe->st = P_FAILED;
		if (cf->err_dst) {
			note_fatal(p, cf->err, "%s/%s: %s", p->dst, pe->e.path);
		} else {
			p->failed++;
			job_note(p->job, LOG_ERROR, "unreadable", pe->e.path, "cannot copy %s/%s (%s): %s",
				 p->src, pe->e.path, cf->err_op, strerror(-cf->err));
		}
	} else {
		pe->e.digest = cf->digest;
		pe->e.nchunks = cf->nchunks;
		pe->e.chunks = cf->chunks;
		cf->chunks = NULL;
		pe->st = P_READY;
		if (pe->tmp) {
			pe->st = P_LANDED;
			if (!p->landed++)
				p->t_landed_ns = job_now_ns();
			p->landed_bytes += cf->size;
		}
	}
	copier_release(cf);
}

/* Makes every landed temporary durable with one syncfs, then gives each its
 * final name. On a fatal error the temporaries are dropped instead. */
static void settle_landed(struct pull *p)
{
	bool drop = p->fatal != 0;

	if (!p->landed)
		return;
	if (!drop && syncfs(p->dst_fd) < 0) {
		note_fatal(p, -errno, "%s%s: syncfs: %s", p->dst, "");
		drop = true;
	}
	for (size_t i = 0, n = p->count; i < n && p->landed; i++) {
		struct pending *pe = &p->win[(p->head + i) % WINDOW];

		if (pe->st != P_LANDED)
			continue;
		p->landed--;
		if (drop) {
			unlinkat(p->dst_fd, pe->tmp, 0);
			pe->st = P_FAILED;
		} else if (renameat(p->dst_fd, pe->tmp, p->dst_fd, pe->e.path) < 0) {
			note_fatal(p, -errno, "%s/%s: rename: %s", p->dst, pe->e.path);
			unlinkat(p->dst_fd, pe->tmp, 0);
			pe->st = P_FAILED;
			drop = true;
		} else {
			pe->st = P_READY;
			p->copied++;
			p->bytes_copied += pe->e.size;
		}
	}
	p->landed = p->landed_bytes = 0;
}

static bool batch_due(struct pull *p)
{
	return p->landed && (p->landed >= BATCH_FILES || p->landed_bytes >= BATCH_BYTES ||
			     copier_inflight(p->cp) == 0 ||
			     job_now_ns() - p->t_landed_ns >= BATCH_NS);
}

static const struct mf_entry *earlier(struct pull *p, const char *rel)
{
	const struct mf_entry *a = cursor_find(&p->resume, rel);
	const struct mf_entry *b = cursor_find(&p->prev, rel);

	if (a && cursor_chunk_size(&p->resume) == p->cfg->chunk_size)
		return a;
	if (b && cursor_chunk_size(&p->prev) == p->cfg->chunk_size)
		return b;
	return NULL;
}

/* Whether the destination holds a finished copy of this source file: same
 * size and mtime. Only a complete, durable copy is ever under a final name
 * with the source's mtime (it is set before the rename), so this is the
 * same trust rsync places in size and mtime. *d gets the destination's stat. */
static bool landed(const struct walk_ent *w, struct stat *d)
{
	if (w->other_type != 'f' || fstatat(w->other_dirfd, w->name, d, AT_SYMLINK_NOFOLLOW) < 0)
		return false;
	return d->st_size == w->st.st_size && mtime_ns(d) == mtime_ns(&w->st);
}

/* An earlier manifest recorded this very source version (size and mtime)
 * and the destination still has the name as a file: keep it. The copy
 * itself is not stat'ed: a re-pull answers for the source's changes, and
 * half of a no-change re-pull's time went into that second stat. Damage to
 * the staged copy is what `stage verify` finds and `pull --verify` repairs. */
static bool reusable(const struct walk_ent *w, const struct mf_entry *old)
{
	return old && old->type == MF_FILE && w->other_type == 'f' &&
	       old->size == (uint64_t)w->st.st_size && old->mtime_ns == mtime_ns(&w->st);
}

static int entry_init(struct pending *pe, char type, const struct walk_ent *w)
{
	pe->e.type = type;
	pe->e.path = strdup(w->rel);
	pe->e.mode = w->st.st_mode & 07777;
	pe->e.mtime_ns = mtime_ns(&w->st);
	pe->e.size = type == MF_DIR ? 0 : (uint64_t)w->st.st_size;
	pe->uid = w->st.st_uid;
	pe->gid = w->st.st_gid;
	return pe->e.path ? 0 : -ENOMEM;
}

static char *tmp_name(const struct walk_ent *w)
{
	size_t dirlen = (size_t)(w->name - w->rel);
	char *t;

	if (asprintf(&t, "%.*s" TMP_PREFIX "%016llx", (int)dirlen, w->rel,
		     (unsigned long long)XXH3_64bits(w->name, strlen(w->name))) < 0)
		return NULL;
	return t;
}

static void do_dir(struct pull *p, const struct walk_ent *w)
{
	struct pending *pe = win_push(p);

	if (entry_init(pe, MF_DIR, w) < 0) {
		note_fatal(p, -ENOMEM, "%s/%s: %s", p->dst, w->rel);
		pe->st = P_FAILED;
		return;
	}
	/* The walk must list it and we must write in it, whatever mode the
	 * source gives it (0555, even 0): owner-only until its contents are in,
	 * its real mode at the end. Root needs no such care. */
	if (w->other_type == 'd' && !p->as_root) {
		struct stat d;

		if (fstatat(w->other_dirfd, w->name, &d, AT_SYMLINK_NOFOLLOW) == 0 &&
		    (d.st_mode & 0700) != 0700)
			fchmodat(w->other_dirfd, w->name, (d.st_mode & 07777) | 0700, 0);
	}
	if (w->other_type != 'd' && mkdirat(w->other_dirfd, w->name, 0700) < 0) {
		note_fatal(p, -errno, "%s/%s: mkdir: %s", p->dst, w->rel);
		pe->st = P_FAILED;
		return;
	}
	pe->st = P_READY;
}

static void do_link(struct pull *p, const struct walk_ent *w)
{
	struct pending *pe = win_push(p);
	char target[MF_MAX_PATH + 1], old[MF_MAX_PATH + 1];
	ssize_t n, m = -1;
	struct stat d;
	char *tmp;

	pe->st = P_FAILED;
	if (entry_init(pe, MF_LINK, w) < 0) {
		note_fatal(p, -ENOMEM, "%s/%s: %s", p->dst, w->rel);
		return;
	}
	n = readlinkat(w->src_dirfd, w->name, target, sizeof(target) - 1);
	if (n < 0 || n >= (ssize_t)sizeof(target) - 1) {
		p->failed++;
		job_note(p->job, LOG_ERROR, "unreadable", w->rel, "cannot read link %s/%s: %s",
			 p->src, w->rel, n < 0 ? strerror(errno) : "target too long");
		return;
	}
	target[n] = '\0';
	pe->e.target = strdup(target);
	if (!pe->e.target) {
		note_fatal(p, -ENOMEM, "%s/%s: %s", p->dst, w->rel);
		return;
	}
	pe->e.size = (uint64_t)n;
	pe->e.mode = 0777;
	pe->e.digest = digest_of(target, (size_t)n);
	if (w->other_type == 'l') {
		m = readlinkat(w->other_dirfd, w->name, old, sizeof(old) - 1);
		if (m == n && memcmp(old, target, (size_t)n) == 0 &&
		    fstatat(w->other_dirfd, w->name, &d, AT_SYMLINK_NOFOLLOW) == 0 &&
		    mtime_ns(&d) == pe->e.mtime_ns) {
			pe->st = P_READY;
			return;
		}
	}
	tmp = tmp_name(w);
	if (!tmp) {
		note_fatal(p, -ENOMEM, "%s/%s: %s", p->dst, w->rel);
		return;
	}
	unlinkat(p->dst_fd, tmp, 0);
	if (symlinkat(target, p->dst_fd, tmp) < 0) {
		note_fatal(p, -errno, "%s/%s: symlink: %s", p->dst, w->rel);
	} else {
		apply_meta(p, tmp, 0777, pe->e.mtime_ns, pe->uid, pe->gid, true);
		if (renameat(p->dst_fd, tmp, p->dst_fd, w->rel) < 0) {
			note_fatal(p, -errno, "%s/%s: rename: %s", p->dst, w->rel);
			unlinkat(p->dst_fd, tmp, 0);
		} else {
			pe->st = P_READY;
		}
	}
	free(tmp);
}

static void do_file(struct pull *p, const struct walk_ent *w)
{
	struct pending *pe = win_push(p);
	const struct mf_entry *old = earlier(p, w->rel);
	struct stat d;
	int ret;

	pe->st = P_FAILED;
	if (entry_init(pe, MF_FILE, w) < 0) {
		note_fatal(p, -ENOMEM, "%s/%s: %s", p->dst, w->rel);
		return;
	}
	if (reusable(w, old)) {
		if (old->nchunks) {
			pe->e.chunks = malloc(old->nchunks * sizeof(*old->chunks));
			if (!pe->e.chunks) {
				note_fatal(p, -ENOMEM, "%s/%s: %s", p->dst, w->rel);
				return;
			}
			memcpy(pe->e.chunks, old->chunks, old->nchunks * sizeof(*old->chunks));
		}
		pe->e.nchunks = old->nchunks;
		pe->e.digest = old->digest;
		if (old->mode != pe->e.mode)
			apply_meta(p, w->rel, pe->e.mode, pe->e.mtime_ns, pe->uid, pe->gid, false);
		pe->st = P_READY;
		return;
	}
	pe->cf = (struct cp_file){
		.src = pe->e.path, .size = pe->e.size, .mtime_ns = pe->e.mtime_ns,
		.mode = pe->e.mode, .uid = pe->uid, .gid = pe->gid, .chown = p->as_root,
		.owner = pe,
	};
	if (landed(w, &d)) {
		/* Finished by a pull that died before its journal said so: hash the
		 * copy in place rather than copy it again. */
		pe->cf.src_in_dst = true;
		if ((d.st_mode & 07777) != pe->e.mode)
			apply_meta(p, w->rel, pe->e.mode, pe->e.mtime_ns, pe->uid, pe->gid, false);
	} else {
		pe->tmp = tmp_name(w);
		if (!pe->tmp) {
			note_fatal(p, -ENOMEM, "%s/%s: %s", p->dst, w->rel);
			return;
		}
		pe->cf.dst = pe->tmp;
	}
	ret = copier_start(p->cp, &pe->cf);
	if (ret < 0) {
		note_fatal(p, ret, "%s/%s: %s", p->dst, w->rel);
		return;
	}
	pe->st = P_WAIT;
}

static void do_entry(struct pull *p, const struct walk_ent *w)
{
	bool is_tmp = strncmp(w->name, TMP_PREFIX, strlen(TMP_PREFIX)) == 0;

	/* A name only the destination has, or has as another type, goes first. */
	if (w->side == WALK_OTHER || (w->side == WALK_BOTH && w->other_type != w->type)) {
		int ret = treeops_remove(w->other_dirfd, w->name, w->other_type == 'd');

		if (ret < 0) {
			note_fatal(p, ret, "%s/%s: remove: %s", p->dst, w->rel);
			return;
		}
		if (!is_tmp || w->side == WALK_BOTH)
			p->removed++;
		if (w->side == WALK_OTHER)
			return;
		((struct walk_ent *)w)->other_type = 0;
	}
	switch (w->type) {
	case 'd':
		do_dir(p, w);
		break;
	case 'f':
		do_file(p, w);
		break;
	case 'l':
		do_link(p, w);
		break;
	default:
		job_note(p->job, LOG_WARN, NULL, w->rel,
			 "skipped %s/%s: not a regular file, directory or symlink", p->src, w->rel);
		break;
	}
}

static int count_tree(struct pull *p)
{
	struct walk *w;
	struct walk_ent e;
	int ret;

	atomic_store(&p->job->phase, "scan");
	ret = walk_open(&w, p->src_fd, -1);
	if (ret < 0)
		return ret;
	while ((ret = walk_next(w, &e)) != 0) {
		if (ret < 0)
			continue;
		if (e.type == 'f') {
			atomic_fetch_add(&p->job->files_total, 1);
			atomic_fetch_add(&p->job->bytes_total, (uint64_t)e.st.st_size);
		}
		job_progress(p->job, false);
		if (job_cancelled(p->job))
			break;
	}
	walk_close(w);
	return 0;
}

/* The main loop: feed the copier from the walk while there is room, retire
 * in order, until the walk is done and the window empty. On cancel or a
 * fatal error it stops feeding and drains what is in flight. */
static void copy_tree(struct pull *p)
{
	struct walk *w;
	struct walk_ent e;
	bool walking = true;
	int ret;

	atomic_store(&p->job->phase, "copy");
	ret = walk_open(&w, p->src_fd, p->dst_fd);
	if (ret < 0) {
		note_fatal(p, ret, "%s%s: %s", p->src, "");
		return;
	}
	while (walking || p->count) {
		bool stop = p->fatal || job_cancelled(p->job);

		while (walking && !stop && p->count < WINDOW && copier_has_room(p->cp)) {
			ret = walk_next(w, &e);
			if (ret == 0) {
				walking = false;
			} else if (ret < 0) {
				p->failed++;
				job_note(p->job, LOG_ERROR, "unreadable", walk_err_path(w), "%s: %s",
					 p->src, walk_why(w));
			} else {
				do_entry(p, &e);
			}
			stop = p->fatal != 0;
		}
		if (stop)
			walking = false;
		retire(p);
		if (!p->count)
			continue;
		ret = copier_run(p->cp, 100, on_copied, p);
		if (ret < 0) {
			/* The ring itself failed: nothing in flight will finish. */
			note_fatal(p, ret, "%s%s: io_uring: %s", p->dst, "");
			break;
		}
		if (batch_due(p) || p->fatal)
			settle_landed(p);
		retire(p);
		job_progress(p->job, false);
	}
	settle_landed(p);
	walk_close(w);
}

static int stage_file_rename(struct pull *p, const char *from, const char *to)
{
	if (renameat(p->stage_fd, from, p->stage_fd, to) < 0 && errno != ENOENT)
		return -errno;
	return 0;
}

/* Takes the destination: creates it, refuses a directory that is not a
 * staged tree, locks it, and moves the last manifest aside. */
static int take_destination(struct pull *p, char *why, size_t whylen)
{
	struct stat st;
	int ret;

	ret = roots_mkdirs(p->dst, 0755);
	if (ret < 0) {
		snprintf(why, whylen, "cannot create %s: %s", p->dst, strerror(-ret));
		return ret;
	}
	p->dst_fd = open(p->dst, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (p->dst_fd < 0) {
		ret = -errno;
		snprintf(why, whylen, "cannot open %s: %s", p->dst, strerror(errno));
		return ret;
	}
	if (fstatat(p->dst_fd, MF_DIRNAME, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (!treeops_empty(p->dst_fd)) {
			snprintf(why, whylen,
				 "%s exists, is not empty and is not a staged tree (no %s/); "
				 "refusing to mirror into it", p->dst, MF_DIRNAME);
			return -EEXIST;
		}
		if (mkdirat(p->dst_fd, MF_DIRNAME, 0755) < 0 && errno != EEXIST) {
			ret = -errno;
			snprintf(why, whylen, "cannot create %s/%s: %s", p->dst, MF_DIRNAME,
				 strerror(errno));
			return ret;
		}
	}
	p->stage_fd = openat(p->dst_fd, MF_DIRNAME, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (p->stage_fd < 0) {
		ret = -errno;
		snprintf(why, whylen, "cannot open %s/%s: %s", p->dst, MF_DIRNAME, strerror(errno));
		return ret;
	}
	p->lock_fd = openat(p->stage_fd, "lock", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (p->lock_fd < 0 || flock(p->lock_fd, LOCK_EX | LOCK_NB) < 0) {
		ret = -errno;
		snprintf(why, whylen, ret == -EWOULDBLOCK ? "another pull into %s is in progress"
			 : "cannot lock %s", p->dst);
		return ret;
	}
	return 0;
}

static void result(struct pull *p, digest_t root)
{
	char hex[DIGEST_HEX_LEN + 1];
	struct msg m;

	msg_init(&m, MSG_RESULT);
	msg_put_u64(&m, K_FILES_TOTAL, p->files);
	msg_put_u64(&m, K_BYTES_TOTAL, p->bytes);
	msg_put_u64(&m, K_FILES_COPIED, p->copied);
	msg_put_u64(&m, K_BYTES_COPIED, p->bytes_copied);
	msg_put_u64(&m, K_FILES_REMOVED, p->removed);
	digest_to_hex(root, hex);
	msg_put_str(&m, K_ROOT, hex);
	job_result(p->job, 0, p->dst, &m,
		   "pulled %llu files (%llu bytes): %llu copied (%llu bytes), %llu removed",
		   (unsigned long long)p->files, (unsigned long long)p->bytes,
		   (unsigned long long)p->copied, (unsigned long long)p->bytes_copied,
		   (unsigned long long)p->removed);
}

static int finish(struct pull *p, digest_t *root)
{
	struct stat st;
	int ret;

	close_dirs_until(p, NULL);
	if (fstat(p->src_fd, &st) == 0)
		apply_meta(p, "", st.st_mode & 07777, mtime_ns(&st), st.st_uid, st.st_gid, false);
	/* Every rename of this pull reaches the disk before the manifest does. */
	if (syncfs(p->dst_fd) < 0)
		return -errno;
	ret = mf_writer_finish(p->mw, root);
	p->mw = NULL;
	if (ret < 0)
		return ret;
	if (renameat(p->stage_fd, "manifest.partial", p->stage_fd, "manifest") < 0)
		return -errno;
	unlinkat(p->stage_fd, "manifest.prev", 0);
	unlinkat(p->stage_fd, "manifest.resume", 0);
	fsync(p->stage_fd);
	return 0;
}

/* Frees what one pass built, in reverse order of pull_pass. */
static void pass_teardown(struct pull *p)
{
	for (; p->count; p->head = (p->head + 1) % WINDOW, p->count--) {
		mf_entry_free(&p->win[p->head].e);
		free(p->win[p->head].tmp);
	}
	close_dirs_until(p, NULL);
	free(p->dirs);
	p->dirs = NULL;
	p->dirs_cap = 0;
	free(p->win);
	p->win = NULL;
	copier_destroy(p->cp);
	p->cp = NULL;
	if (p->mw)
		mf_writer_abort(p->mw);
	p->mw = NULL;
	cursor_close(&p->resume);
	cursor_close(&p->prev);
}

/* One mirroring pass over the whole tree. 0 with *root, or an exit code
 * (1) with the reason already sent as the job's result. */
static int pull_pass(struct pull *p, bool first, digest_t *root)
{
	struct job *j = p->job;
	struct copier_opts co = {
		.memory = p->cfg->memory, .io_size = p->cfg->io_size,
		.chunk_size = p->cfg->chunk_size, .direct_min = 2 * p->cfg->io_size,
		.max_files = p->cfg->files_in_flight, .depth = 8, .fsync = false,
	};
	char why[2048];
	int ret;

	p->files = p->bytes = p->failed = 0;
	atomic_store(&j->files_done, 0);
	atomic_store(&j->bytes_done, 0);
	/* A manifest and a .prev both present: the last pull finished, but died
	 * before it dropped .prev. The manifest is the newer. */
	if ((ret = stage_file_rename(p, "manifest", "manifest.prev")) < 0 ||
	    (ret = stage_file_rename(p, "manifest.partial", "manifest.resume")) < 0) {
		job_result(j, 1, NULL, NULL, "%s/%s: %s", p->dst, MF_DIRNAME, strerror(-ret));
		return 1;
	}
	fsync(p->stage_fd);
	if (cursor_open(&p->prev, p->stage_fd, "manifest.prev", MF_COMPLETE, why, sizeof(why)) < 0)
		job_note(j, LOG_WARN, NULL, NULL, "ignoring the previous manifest: %s", why);
	if (cursor_open(&p->resume, p->stage_fd, "manifest.resume", MF_PARTIAL, why, sizeof(why)) < 0)
		job_note(j, LOG_WARN, NULL, NULL, "ignoring an interrupted pull's journal: %s", why);
	ret = mf_writer_open(&p->mw, p->stage_fd, "manifest.partial", p->cfg->chunk_size);
	if (ret < 0) {
		job_result(j, 1, NULL, NULL, "cannot write %s/%s/manifest.partial: %s", p->dst,
			   MF_DIRNAME, strerror(-ret));
		goto out_teardown;
	}
	ret = copier_create(&p->cp, p->src_fd, p->dst_fd, &co);
	if (ret < 0) {
		job_result(j, 1, NULL, NULL, "io_uring: %s", strerror(-ret));
		goto out_teardown;
	}
	p->win = calloc(WINDOW, sizeof(*p->win));
	if (!p->win) {
		job_result(j, 1, NULL, NULL, "out of memory");
		goto out_teardown;
	}
	if (first && (j->flags & REQ_PROGRESS))
		count_tree(p);
	copy_tree(p);

	if (job_cancelled(j)) {
		job_result(j, 1, NULL, NULL, "pull into %s cancelled%s", p->dst,
			   stage_stopping ? ": the daemon is stopping" : "");
	} else if (p->fatal) {
		job_result(j, 1, NULL, NULL, "%s%s", p->fatal_why,
			   p->fatal == -ENOSPC || p->fatal == -EDQUOT
			   ? " (the destination file system is full)" : "");
	} else if (p->failed) {
		job_result(j, 1, NULL, NULL,
			   "%llu entries of %s could not be copied (listed above); %s has no "
			   "manifest until a pull completes",
			   (unsigned long long)p->failed, p->src, p->dst);
	} else if ((ret = finish(p, root)) < 0) {
		job_result(j, 1, NULL, NULL, "%s: finishing the manifest: %s", p->dst, strerror(-ret));
	} else {
		pass_teardown(p);
		return 0;
	}
out_teardown:
	pass_teardown(p);
	return 1;
}

/* verify_tree's report of a staged file that does not match: drop it, so
 * the next pass copies it again. */
static void drop_bad(const char *rel, void *arg)
{
	struct pull *p = arg;

	if (unlinkat(p->dst_fd, rel, 0) == 0)
		p->dropped++;
}

void pull_run(struct job *j, const char *src_arg, const char *dest_arg)
{
	struct pull *p = calloc(1, sizeof(*p));
	char why[2048];
	digest_t root;
	int ret;

	if (!p) {
		job_result(j, 1, NULL, NULL, "out of memory");
		return;
	}
	p->job = j;
	p->cfg = j->cfg;
	p->src_fd = p->dst_fd = p->stage_fd = p->lock_fd = -1;
	p->as_root = geteuid() == 0;
	ret = roots_pull(p->cfg, src_arg, dest_arg, &p->src, &p->dst, why, sizeof(why));
	if (ret < 0) {
		job_result(j, 2, NULL, NULL, "%s", why);
		goto out_free;
	}
	snprintf(j->what, sizeof(j->what), "%s -> %s", p->src, p->dst);
	log_info("pull %s", j->what);
	p->src_fd = open(p->src, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (p->src_fd < 0) {
		job_result(j, 1, NULL, NULL, "cannot open %s: %s", p->src, strerror(errno));
		goto out_free;
	}
	ret = take_destination(p, why, sizeof(why));
	if (ret < 0) {
		job_result(j, ret == -EEXIST ? 2 : 1, NULL, NULL, "%s", why);
		goto out_close;
	}
	/* With --verify, what landed is read back from the disk and checked; a
	 * file that does not match is dropped and copied once more. */
	for (int pass = 0;; pass++) {
		if (pull_pass(p, pass == 0, &root))
			break;
		if (!(j->flags & REQ_VERIFY)) {
			result(p, root);
			break;
		}
		atomic_store(&j->phase, "verify");
		p->dropped = 0;
		ret = verify_tree(j, p->dst, p->dst_fd, true, true, drop_bad, p);
		if (ret == 0) {
			result(p, root);
			break;
		}
		if (ret < 0 || pass == 1 || !p->dropped) {
			job_result(j, 1, p->dst, NULL,
				   "%s does not match what was read from %s, even after staging again",
				   p->dst, p->src);
			break;
		}
		job_note(j, LOG_WARN, NULL, NULL, "staging %llu damaged files of %s again",
			 (unsigned long long)p->dropped, p->dst);
	}
out_close:
	if (p->lock_fd >= 0)
		close(p->lock_fd);
	if (p->stage_fd >= 0)
		close(p->stage_fd);
	if (p->dst_fd >= 0)
		close(p->dst_fd);
	close(p->src_fd);
out_free:
	free(p->src);
	free(p->dst);
	free(p);
}
