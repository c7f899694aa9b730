/* The pull engine.
 *
 * One pass over the source tree (walk.c, merged with the destination), one
 * io_uring copier (copier.c) with many files in flight, and a window of
 * pending entries retired strictly in walk order into the manifest journal.
 * DEST/.stage/ and its files are stagedir.c's.
 *
 * An entry's life in the window (enum pend_state):
 *   P_WAIT    in the copier (copying into .stage/tmp, or hashing a copy in place)
 *   P_FWD     coming from a peer (a cluster pull's share, pull.h); once it is
 *             whole in its temporary it is hashed there (P_WAIT), then lands
 *   P_LANDED  complete in its temporary, waiting for the batch's syncfs
 *   P_READY   under its final name (or needing no I/O): journaled at retire
 *   P_FAILED  skipped at retire; the pass will not publish a manifest
 *
 * Invariants:
 * - Nothing is written under a final name but by rename of a temporary that
 *   was complete, given its metadata and made durable (settle_landed).
 * - Every name in the destination is reached through directory fds opened
 *   without following symlinks, or openat2(RESOLVE_NO_SYMLINKS): the owner
 *   of a staged directory who swaps it for a link cannot steer a root
 *   daemon's chown, chmod, rename or symlink outside the tree.
 * - An entry reaches the journal only after it is under its final name, so
 *   after kill -9 the journal lists finished files, and the next pull
 *   reuses them instead of copying them again.
 * - Memory: the copier's budget, the walk's listings, and at most WINDOW
 *   pending entries.
 */
#include "daemon/pull/pull.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/manifest.h"
#include "common/paths.h"
#include "daemon/engine/copier.h"
#include "daemon/fs/cursor.h"
#include "daemon/fs/fsprobe.h"
#include "daemon/pull/dirstack.h"
#include "daemon/fs/roots.h"
#include "daemon/pull/stagedir.h"
#include "daemon/fs/treeops.h"
#include "daemon/pull/verify.h"
#include "daemon/fs/walk.h"
#include "daemon/obs/obs.h"

#define WINDOW 8192u
#define RETRY_MAX 64u

enum pend_state { P_WAIT, P_FWD, P_LANDED, P_READY, P_FAILED };

/* Durability comes in batches: a temporary is made durable before its
 * rename by one syncfs for many files, which costs far less than an
 * fdatasync each (those force every small file's writeback and a journal
 * commit one by one: a quarter of a small-file pull's time). */
#define BATCH_FILES 1024u
#define BATCH_BYTES (256ull << 20)
#define BATCH_NS 50000000ull
#define BATCH_SHARE_NS 10000000ull     /* a cluster pull's peers wait for what we settle */
#define BIG_FILE(p) (2 * (p)->cfg->io_size)   /* also where O_DIRECT starts */

/* Reads in flight per file: as many as the whole budget holds (8 to 32).
 * The buffer pool bounds the memory whatever this says; what it decides is
 * how much of the budget one big file may use when few are in flight. Each
 * buffer is first read into and then written from, so a file with D of
 * them keeps about D/2 reads and D/2 writes at the disk; at 8 a pull of two
 * 1 GiB files ran at 0.8 of what fio moves at 8 each way
 * (docs/BENCHMARKS.md, "pull"). */
static unsigned pull_depth(const struct stage_config *cfg)
{
	uint64_t d = cfg->memory / cfg->io_size;

	return d < 8 ? 8 : d > 32 ? 32 : (unsigned)d;
}

struct pending {
	struct mf_entry e;       /* what the manifest will say; e.path owned */
	enum pend_state st;
	uid_t uid;               /* the source's owner (given when we are root) */
	gid_t gid;
	char *tmp;               /* temporary name in .stage/tmp while copying, owned */
	bool fwd;                /* its temporary came from a peer (a share) */
	struct cp_file cf;
};

struct pull {
	struct job *job;
	const struct stage_config *cfg;
	char *src, *dst;             /* resolved absolute paths, owned */
	int src_fd;                  /* the source tree */
	int dst_fd;                  /* == sd.dst_fd */
	struct stagedir sd;          /* the destination and its .stage/ */
	struct copier *cp;
	struct mf_writer *mw;
	struct cursor prev, resume;  /* what earlier pulls knew */
	struct pending *win;         /* WINDOW slots, a ring */
	size_t head, count;
	struct dirstack dirs;        /* directories being filled */
	bool as_root;
	uint64_t t_flush_ns;
	uint64_t tmp_seq;            /* names temporaries in .stage/tmp */
	struct pending *retry[RETRY_MAX]; /* in-place hashes that failed: copy instead */
	unsigned nretry;
	/* results */
	uint64_t files, bytes, copied, bytes_copied, removed, failed;
	uint64_t changed;            /* of the failed: written to while copied */
	uint64_t dropped;            /* staged files verify found bad, removed */
	uint64_t landed, landed_bytes; /* P_LANDED entries in the window */
	uint64_t unsynced;           /* ... of which not fdatasync'd on their own */
	uint64_t t_landed_ns;        /* when the oldest of them landed */
	int fatal;                   /* -errno of a destination failure */
	char fatal_why[1024];
	/* a cluster pull's share (pull.h); NULL: every file from the source */
	const struct pull_share *sh;
	struct pull_stats *st;       /* NULL, or filled at the result */
	uint64_t fwd_files, fwd_bytes;   /* settled from peers (not in copied) */
	struct pending **parked;     /* forwards done, waiting for room in the copier */
	size_t nparked;              /* (at most WINDOW: each is a window entry) */
};

/* The first destination failure stops the pass; its message ends with
 * the error's text. */
static void note_fatal(struct pull *p, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void note_fatal(struct pull *p, int err, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (p->fatal)
		return;
	p->fatal = err;
	va_start(ap, fmt);
	n = vsnprintf(p->fatal_why, sizeof(p->fatal_why), fmt, ap);
	va_end(ap);
	if (n >= 0 && (size_t)n < sizeof(p->fatal_why))
		snprintf(p->fatal_why + n, sizeof(p->fatal_why) - (size_t)n, ": %s", strerror(-err));
}

static void warn_meta(struct pull *p, const char *rel, const char *what, int err)
{
	log_warn("pull %s: %s of '%s': %s", p->dst, what, *rel ? rel : ".", strerror(-err));
}

static struct pending *win_push(struct pull *p)
{
	struct pending *pe = &p->win[(p->head + p->count) % WINDOW];

	memset(pe, 0, sizeof(*pe));
	p->count++;
	return pe;
}

/* Retires finished entries from the head of the window, in walk order. */
static void retire(struct pull *p)
{
	while (p->count) {
		struct pending *pe = &p->win[p->head];
		int ret;

		if (pe->st == P_WAIT || pe->st == P_FWD || pe->st == P_LANDED)
			break;
		dirstack_close_until(&p->dirs, pe->e.path);
		if (pe->st == P_READY) {
			ret = mf_writer_add(p->mw, &pe->e);
			if (ret < 0)
				note_fatal(p, ret, "%s: writing the manifest journal", p->dst);
			if (pe->e.type == MF_DIR &&
			    dirstack_push(&p->dirs, pe->e.path, pe->e.mode, pe->e.mtime_ns,
					  pe->uid, pe->gid) < 0)
				note_fatal(p, -ENOMEM, "%s", p->dst);
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
	if (mono_ns() - p->t_flush_ns > 20000000ull) {
		/* The journal is what a killed pull resumes from: keep it recent. */
		mf_writer_flush(p->mw);
		p->t_flush_ns = mono_ns();
	}
}

/* A file this node read from the source failed: its peers waiting for it
 * are told, and ask the next node or the source themselves. */
static void share_failed(struct pull *p, const struct pending *pe, const char *why)
{
	if (p->sh && !pe->fwd && p->sh->ops->failed)
		p->sh->ops->failed(p->sh->arg, pe->e.path, why);
}

static void on_copied(struct cp_file *cf, void *arg)
{
	struct pending *pe = cf->owner;
	struct pull *p = arg;

	if (!cf->dst && cf->err && cf->err != -ECANCELED && p->nretry < RETRY_MAX) {
		/* Hashing a landed copy in place failed (we may not read it, or it
		 * changed): copy the source after all, once the copier is free. */
		log_debug("pull %s: %s: hashing in place failed (%s), copying", p->dst,
			  pe->e.path, strerror(-cf->err));
		p->retry[p->nretry++] = pe;
	} else if (cf->err) {
		pe->st = P_FAILED;
		if (pe->fwd && pe->tmp)         /* a forwarded temporary: not kept to the pass's end */
			unlinkat(p->sd.tmp_fd, pe->tmp, 0);
		if (cf->err == -ECANCELED) {
			/* the job's result says why */
		} else if (cf->err_dst) {
			note_fatal(p, cf->err, "%s/%s: %s (its temporary)", p->dst, pe->e.path,
				   cf->err_op);
		} else if (cf->err == -ESTALE) {
			/* Someone is still writing it: advice, not an I/O error. */
			p->failed++;
			p->changed++;
			job_note(p->job, LOG_ERROR, "changed", pe->e.path,
				 "%s/%s changed while it was copied; pull again when it is quiet",
				 p->src, pe->e.path);
			share_failed(p, pe, "it changed while it was copied");
		} else {
			char why[256];

			p->failed++;
			snprintf(why, sizeof(why), "%s: %s", cf->err_op, strerror(-cf->err));
			job_note(p->job, LOG_ERROR, "unreadable", pe->e.path, "cannot copy %s/%s (%s)",
				 p->src, pe->e.path, why);
			share_failed(p, pe, why);
		}
	} else {
		/* A lazy entry learns its attributes from the copier. */
		pe->e.size = cf->size;
		pe->e.mtime_ns = cf->mtime_ns;
		pe->e.mode = cf->mode;
		pe->uid = cf->uid;
		pe->gid = cf->gid;
		pe->e.digest = cf->digest;
		pe->e.nchunks = cf->nchunks;
		pe->e.chunks = cf->chunks;
		cf->chunks = NULL;
		pe->st = P_READY;
		if (pe->tmp) {
			pe->st = P_LANDED;
			if (!p->landed++)
				p->t_landed_ns = mono_ns();
			if (!cf->synced)
				p->unsynced++;
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
	if (!drop && p->unsynced && syncfs(p->dst_fd) < 0) {
		note_fatal(p, -errno, "%s: syncfs", p->dst);
		drop = true;
	}
	/* Window order keeps a directory's files together: one parent fd each. */
	char *parent = NULL;
	int pfd = -1;

	for (size_t i = 0, n = p->count; i < n && p->landed; i++) {
		struct pending *pe = &p->win[(p->head + i) % WINDOW];
		const char *slash, *base;
		size_t plen;

		if (pe->st != P_LANDED)
			continue;
		p->landed--;
		slash = strrchr(pe->e.path, '/');
		plen = slash ? (size_t)(slash - pe->e.path) : 0;
		base = slash ? slash + 1 : pe->e.path;
		if (!drop && (pfd < 0 || strlen(parent) != plen ||
			      strncmp(parent, pe->e.path, plen) != 0)) {
			if (pfd >= 0)
				close(pfd);
			free(parent);
			parent = strndup(pe->e.path, plen);
			pfd = parent ? treeops_open_beneath(p->dst_fd, parent) : -ENOMEM;
			if (pfd < 0) {
				note_fatal(p, pfd, "%s/%s: cannot open its directory", p->dst,
					   pe->e.path);
				drop = true;
			}
		}
		if (drop) {
			unlinkat(p->sd.tmp_fd, pe->tmp, 0);
			pe->st = P_FAILED;
		} else if (renameat(p->sd.tmp_fd, pe->tmp, pfd, base) < 0) {
			note_fatal(p, -errno, "%s/%s: rename", p->dst, pe->e.path);
			unlinkat(p->sd.tmp_fd, pe->tmp, 0);
			pe->st = P_FAILED;
			drop = true;
		} else if (pe->fwd) {
			pe->st = P_READY;
			p->fwd_files++;
			p->fwd_bytes += pe->e.size;
		} else {
			pe->st = P_READY;
			p->copied++;
			p->bytes_copied += pe->e.size;
			obs_add(OBS_PULL_FILES, 1);
			obs_add(OBS_PULL_BYTES, pe->e.size);
		}
	}
	if (pfd >= 0)
		close(pfd);
	free(parent);
	p->landed = p->landed_bytes = p->unsynced = 0;
}

static bool batch_due(struct pull *p)
{
	return p->landed && (p->landed >= BATCH_FILES || p->landed_bytes >= BATCH_BYTES ||
			     copier_inflight(p->cp) == 0 ||
			     mono_ns() - p->t_landed_ns >= (p->sh ? BATCH_SHARE_NS : BATCH_NS));
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
	return d->st_size == w->st.st_size && mf_mtime_ns(d) == w->mtime_ns;
}

/* An earlier manifest recorded this very source version (size and mtime)
 * and the destination still has the name as a file: keep it. After a clean
 * pull the copy itself is not stat'ed: a re-pull answers for the source's
 * changes, and half of a no-change re-pull's time went into that second
 * stat; damage to the staged copy is what `stage verify` finds and `pull
 * --verify` repairs. After a killed pull, a file may have been replaced
 * without its journal line, so the copy must match too. */
static bool reusable(struct pull *p, const struct walk_ent *w, const struct mf_entry *old)
{
	struct stat d;

	if (!old || old->type != MF_FILE || w->other_type != 'f' ||
	    old->size != (uint64_t)w->st.st_size || old->mtime_ns != w->mtime_ns)
		return false;
	return !p->sd.recovering || landed(w, &d);
}

static int entry_init(struct pending *pe, char type, const struct walk_ent *w)
{
	pe->e.type = type;
	pe->e.path = strdup(w->rel);
	pe->e.mode = w->st.st_mode & 07777;
	pe->e.mtime_ns = w->mtime_ns;
	pe->e.size = type == MF_DIR ? 0 : (uint64_t)w->st.st_size;
	if (w->lazy)
		pe->e.size = CP_SIZE_UNKNOWN;   /* the copier reads it from the open file */
	pe->uid = w->st.st_uid;
	pe->gid = w->st.st_gid;
	return pe->e.path ? 0 : -ENOMEM;
}

/* Temporaries live in .stage/tmp under a counter: never a name the source
 * could have, and one flat directory that each pass empties. */
static char *tmp_name(struct pull *p)
{
	char *t;

	if (asprintf(&t, "%llx", (unsigned long long)++p->tmp_seq) < 0)
		return NULL;
	return t;
}

static void do_dir(struct pull *p, const struct walk_ent *w)
{
	struct pending *pe = win_push(p);

	if (entry_init(pe, MF_DIR, w) < 0) {
		note_fatal(p, -ENOMEM, "%s/%s", p->dst, w->rel);
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
			fchmodat(w->other_dirfd, w->name, (d.st_mode & 07777) | 0700,
				 AT_SYMLINK_NOFOLLOW);
	}
	if (w->other_type != 'd' && mkdirat(w->other_dirfd, w->name, 0700) < 0) {
		note_fatal(p, -errno, "%s/%s: mkdir", p->dst, w->rel);
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
		note_fatal(p, -ENOMEM, "%s/%s", p->dst, w->rel);
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
		note_fatal(p, -ENOMEM, "%s/%s", p->dst, w->rel);
		return;
	}
	pe->e.size = (uint64_t)n;
	pe->e.mode = 0777;
	pe->e.digest = digest_of(target, (size_t)n);
	if (w->other_type == 'l') {
		m = readlinkat(w->other_dirfd, w->name, old, sizeof(old) - 1);
		if (m == n && memcmp(old, target, (size_t)n) == 0 &&
		    fstatat(w->other_dirfd, w->name, &d, AT_SYMLINK_NOFOLLOW) == 0 &&
		    mf_mtime_ns(&d) == pe->e.mtime_ns) {
			pe->st = P_READY;
			return;
		}
	}
	tmp = tmp_name(p);
	if (!tmp) {
		note_fatal(p, -ENOMEM, "%s/%s", p->dst, w->rel);
		return;
	}
	if (symlinkat(target, p->sd.tmp_fd, tmp) < 0) {
		note_fatal(p, -errno, "%s/%s: symlink", p->dst, w->rel);
	} else {
		const char *what;
		int ret = treeops_set_meta_at(p->sd.tmp_fd, tmp, true, p->as_root, pe->uid,
					      pe->gid, 0, pe->e.mtime_ns, &what);

		if (ret < 0)
			warn_meta(p, w->rel, what, ret);
		/* Links are made whole in .stage/tmp and renamed in: no link is
		 * ever seen half-made, and a rename replaces atomically. */
		if (renameat(p->sd.tmp_fd, tmp, w->other_dirfd, w->name) < 0) {
			note_fatal(p, -errno, "%s/%s: rename", p->dst, w->rel);
			unlinkat(p->sd.tmp_fd, tmp, 0);
		} else {
			pe->st = P_READY;
		}
	}
	free(tmp);
}

static void set_mode(struct pull *p, const struct walk_ent *w, uint32_t mode)
{
	if (fchmodat(w->other_dirfd, w->name, mode, AT_SYMLINK_NOFOLLOW) < 0)
		warn_meta(p, w->rel, "chmod", -errno);
}

/* Hands pe to the copier: copy from the source into a new temporary, or
 * (copy false) hash the destination's copy where it stands. */
static int start_file(struct pull *p, struct pending *pe, bool copy)
{
	int ret;

	pe->cf = (struct cp_file){
		.src_at = copy ? p->src_fd : p->dst_fd, .src = pe->e.path, .size = pe->e.size,
		.mtime_ns = pe->e.mtime_ns, .mode = pe->e.mode, .uid = pe->uid, .gid = pe->gid,
		.chown = p->as_root, .owner = pe,
	};
	if (copy) {
		/* A forwarded temporary that failed its hash goes first. */
		if (pe->fwd && pe->tmp)
			unlinkat(p->sd.tmp_fd, pe->tmp, 0);
		free(pe->tmp);
		pe->fwd = false;
		pe->tmp = tmp_name(p);
		if (!pe->tmp)
			return -ENOMEM;
		pe->cf.dst = pe->tmp;
	}
	ret = copier_start(p->cp, &pe->cf);
	if (ret < 0)
		return ret;
	pe->st = P_WAIT;
	return 0;
}

/* Asks the share for pe: a peer places it under its final name. */
static int start_fwd(struct pull *p, struct pending *pe)
{
	struct pull_fwd f = {
		.rel = pe->e.path, .size = pe->e.size, .mtime_ns = pe->e.mtime_ns,
		.mode = pe->e.mode, .uid = pe->uid, .gid = pe->gid, .cookie = pe,
	};
	int ret = p->sh->ops->start(p->sh->arg, &f);

	if (ret == 0)
		pe->st = P_FWD;
	return ret;
}

/* A forwarded file whole in its temporary (pe->tmp): hashed there (no
 * copy), then landed like a copy of our own (on_copied: pe->tmp is set). */
static int start_fwd_hash(struct pull *p, struct pending *pe)
{
	int ret;

	pe->cf = (struct cp_file){
		.src_at = p->sd.tmp_fd, .src = pe->tmp, .size = pe->e.size,
		.mtime_ns = pe->e.mtime_ns, .mode = pe->e.mode, .uid = pe->uid, .gid = pe->gid,
		.chown = p->as_root, .owner = pe,
	};
	ret = copier_start(p->cp, &pe->cf);
	if (ret < 0)
		return ret;
	pe->st = P_WAIT;
	return 0;
}

/* The share's word on a forward (from reap, on the pull's thread). A file
 * that came waits (P_FWD still) for room in the copier, to be hashed in its
 * temporary; one no peer had, to be copied from the source. The copier's
 * bound on files in flight holds for these as for the walk's. */
static void on_forwarded(void *cookie, int rc, const char *tmp, const char *why, bool dest,
			 void *arg)
{
	struct pending *pe = cookie;
	struct pull *p = arg;

	if (rc == PULL_FWD_OK || rc == PULL_FWD_READ) {
		if (rc == PULL_FWD_OK && !(pe->tmp = strdup(tmp))) {
			pe->st = P_FAILED;
			note_fatal(p, -ENOMEM, "%s/%s", p->dst, pe->e.path);
			return;
		}
		pe->fwd = rc == PULL_FWD_OK;
		p->parked[p->nparked++] = pe;
		return;
	}
	pe->st = P_FAILED;
	if (rc == -ECANCELED && (p->fatal || job_cancelled(p->job)))
		return;                 /* the job's result says why */
	if (dest) {
		/* Our own disk: it stops the pass as a copy's would. */
		note_fatal(p, rc, "%s/%s: %s", p->dst, pe->e.path, why && *why ? why :
			   strerror(-rc));
		return;
	}
	p->failed++;
	job_note(p->job, LOG_ERROR, "unreadable", pe->e.path, "cannot stage %s/%s: %s", p->src,
		 pe->e.path, why && *why ? why : strerror(-rc));
}

/* Parked forwards into the copier, while it has room (all of them, failed,
 * when the pass stops). */
static void start_parked(struct pull *p, bool stop)
{
	while (p->nparked && (stop || copier_has_room(p->cp))) {
		struct pending *pe = p->parked[--p->nparked];
		int ret = stop ? -ECANCELED : pe->fwd ? start_fwd_hash(p, pe) :
			  start_file(p, pe, true);

		if (ret < 0) {
			if (pe->fwd && pe->tmp)
				unlinkat(p->sd.tmp_fd, pe->tmp, 0);
			pe->st = P_FAILED;
			if (!stop)
				note_fatal(p, ret, "%s/%s", p->dst, pe->e.path);
		}
	}
}

/* Reaps the share's forwards, waiting up to timeout_ms for the first. */
static void reap_fwd(struct pull *p, int timeout_ms)
{
	if (p->sh && p->sh->ops->inflight(p->sh->arg))
		p->sh->ops->reap(p->sh->arg, timeout_ms, on_forwarded, p);
}

static void do_file(struct pull *p, const struct walk_ent *w)
{
	struct pending *pe = win_push(p);
	const struct mf_entry *old = earlier(p, w->rel);
	struct stat d;
	int ret;

	pe->st = P_FAILED;
	if (entry_init(pe, MF_FILE, w) < 0) {
		note_fatal(p, -ENOMEM, "%s/%s", p->dst, w->rel);
		return;
	}
	if (reusable(p, w, old)) {
		if (old->nchunks) {
			pe->e.chunks = malloc(old->nchunks * sizeof(*old->chunks));
			if (!pe->e.chunks) {
				note_fatal(p, -ENOMEM, "%s/%s", p->dst, w->rel);
				return;
			}
			memcpy(pe->e.chunks, old->chunks, old->nchunks * sizeof(*old->chunks));
		}
		pe->e.nchunks = old->nchunks;
		pe->e.digest = old->digest;
		if (old->mode != pe->e.mode)
			set_mode(p, w, pe->e.mode);
		pe->st = P_READY;
		return;
	}
	if (landed(w, &d)) {
		/* Finished by a pull that died before its journal said so: hash the
		 * copy in place rather than copy it again. */
		if ((d.st_mode & 07777) != pe->e.mode)
			set_mode(p, w, pe->e.mode);
		ret = start_file(p, pe, false);
	} else if (p->sh && !p->sh->ops->reads(p->sh->arg, w->rel)) {
		ret = start_fwd(p, pe);
	} else {
		ret = start_file(p, pe, true);
	}
	if (ret < 0)
		note_fatal(p, ret, "%s/%s", p->dst, w->rel);
}

static void do_entry(struct pull *p, struct walk_ent *w)
{
	/* A name only the destination has, or has as another type, goes first. */
	if (w->side == WALK_OTHER || (w->side == WALK_BOTH && w->other_type != w->type)) {
		int ret = treeops_remove(w->other_dirfd, w->name, w->other_type == 'd');

		if (ret < 0) {
			note_fatal(p, ret, "%s/%s: remove", p->dst, w->rel);
			return;
		}
		p->removed++;
		if (w->side == WALK_OTHER)
			return;
		w->other_type = 0;
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
	ret = walk_open(&w, p->src_fd, -1, 0);
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

/* In-place hashes that failed become copies (outside the copier's
 * callbacks, which may not start files), unless the pass is stopping. */
static void start_retries(struct pull *p, bool stop)
{
	for (unsigned i = 0; i < p->nretry; i++) {
		struct pending *pe = p->retry[i];
		int ret = stop ? -ECANCELED : start_file(p, pe, true);

		if (ret < 0) {
			pe->st = P_FAILED;
			if (!stop)
				note_fatal(p, ret, "%s/%s", p->dst, pe->e.path);
		}
	}
	p->nretry = 0;
}

/* The main loop: feed the copier from the walk while there is room, retire
 * in order, until the walk is done and the window empty. On cancel or a
 * fatal error it stops feeding, cancels what is in flight and drains it. */
static void copy_tree(struct pull *p)
{
	struct walk *w;
	struct walk_ent e;
	bool walking = true, cancelled = false;
	unsigned fwd;
	int ret;

	atomic_store(&p->job->phase, "copy");
	/* A share forwards a file by its size and mtime, so it needs them from
	 * the walk: a stat of each is metadata, not the data read once. */
	ret = walk_open(&w, p->src_fd, p->dst_fd, p->sh ? 0 : WALK_LAZY);
	if (ret < 0) {
		note_fatal(p, ret, "%s", p->src);
		return;
	}
	while (walking || p->count) {
		bool stop = p->fatal || job_cancelled(p->job);

		start_parked(p, stop);
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
		if (stop) {
			walking = false;
			if (!cancelled) {
				copier_cancel(p->cp);
				if (p->sh)
					p->sh->ops->cancel(p->sh->arg);
			}
			cancelled = true;
		}
		retire(p);
		if (!p->count)
			continue;
		/* Forwards finish on the share's threads, not on the ring: with
		 * both in flight, each is waited for a little in turn. */
		fwd = p->sh ? p->sh->ops->inflight(p->sh->arg) : 0;
		ret = 0;
		if (!fwd || copier_inflight(p->cp))
			ret = copier_run(p->cp, fwd ? 5 : 100, on_copied, p);
		if (ret < 0) {
			/* The ring itself failed: nothing in flight will finish. */
			note_fatal(p, ret, "%s: io_uring", p->dst);
			break;
		}
		reap_fwd(p, copier_inflight(p->cp) || p->nparked ? 0 : 100);
		if (p->nretry)
			start_retries(p, stop || p->fatal);
		if (batch_due(p) || stop)
			settle_landed(p);
		retire(p);
		job_progress(p->job, false);
	}
	/* Nothing of the share may be in flight once the pass ends: its
	 * temporaries' directory goes, and the entries with it. */
	if (p->sh && p->sh->ops->inflight(p->sh->arg)) {    /* only after a failure */
		p->sh->ops->cancel(p->sh->arg);
		while (p->sh->ops->inflight(p->sh->arg))
			reap_fwd(p, 100);
	}
	start_parked(p, true);
	settle_landed(p);
	walk_close(w);
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
	if (p->st) {
		p->st->root = root;
		p->st->files = p->files;
		p->st->bytes = p->bytes;
		p->st->read_files = p->copied;
		p->st->read_bytes = p->bytes_copied;
		p->st->fwd_files = p->fwd_files;
		p->st->fwd_bytes = p->fwd_bytes;
	}
	/* The lock goes before the answer: a client that pulls again the
	 * moment it hears this one finished must not find it still held. */
	stagedir_close(&p->sd);
	p->dst_fd = -1;
	job_result(p->job, 0, p->dst, &m,
		   "pulled %llu files (%llu bytes): %llu copied (%llu bytes), %llu removed",
		   (unsigned long long)p->files, (unsigned long long)p->bytes,
		   (unsigned long long)p->copied, (unsigned long long)p->bytes_copied,
		   (unsigned long long)p->removed);
}

static int finish(struct pull *p, digest_t *root)
{
	const char *what;
	struct stat st;
	int ret;

	dirstack_close_until(&p->dirs, NULL);
	if (fstat(p->src_fd, &st) == 0) {
		ret = treeops_set_meta(p->dst_fd, p->as_root, st.st_uid, st.st_gid,
				       st.st_mode & 07777, mf_mtime_ns(&st), &what);
		if (ret < 0)
			warn_meta(p, "", what, ret);
	}
	/* Every rename of this pull reaches the disk before the manifest does. */
	if (syncfs(p->dst_fd) < 0)
		return -errno;
	ret = mf_writer_finish(p->mw, root);
	p->mw = NULL;
	if (ret < 0)
		return ret;
	return stagedir_publish(&p->sd);
}

/* Frees what one pass built, in reverse order of pull_pass. */
static void pass_teardown(struct pull *p)
{
	copier_destroy(p->cp);
	p->cp = NULL;
	for (; p->count; p->head = (p->head + 1) % WINDOW, p->count--) {
		mf_entry_free(&p->win[p->head].e);
		free(p->win[p->head].tmp);
	}
	dirstack_destroy(&p->dirs);
	free(p->win);
	p->win = NULL;
	free(p->parked);
	p->parked = NULL;
	if (p->mw)
		mf_writer_abort(p->mw);
	p->mw = NULL;
	cursor_close(&p->resume);
	cursor_close(&p->prev);
	stagedir_end(&p->sd);
}

/* One mirroring pass over the whole tree. 0 with *root, or 1 with the
 * reason already sent as the job's result. */
static int pull_pass(struct pull *p, bool first, digest_t *root)
{
	struct job *j = p->job;
	struct copier_opts co = {
		.memory = p->cfg->memory, .io_size = p->cfg->io_size,
		.chunk_size = p->cfg->chunk_size, .direct_min = BIG_FILE(p),
		.max_files = p->cfg->files_in_flight, .depth = pull_depth(p->cfg),
		/* Durability is settle_landed's, in batches, but for big files:
		 * written with O_DIRECT, their own fdatasync costs next to
		 * nothing, where a syncfs would flush all else that is dirty. */
		.fsync = false, .fsync_min = BIG_FILE(p),
	};
	char why[2048];
	int ret;

	p->files = p->bytes = p->failed = p->changed = 0;
	dirstack_init(&p->dirs, p->dst_fd, p->as_root, p->dst);
	atomic_store(&j->files_done, 0);
	atomic_store(&j->bytes_done, 0);
	ret = stagedir_begin(&p->sd);
	if (ret < 0) {
		snprintf(why, sizeof(why), "%s/%s: %s", p->dst, MF_DIRNAME, strerror(-ret));
		goto out_fail;
	}
	if (p->sh && (ret = p->sh->ops->begin(p->sh->arg, p->dst, p->dst_fd, p->sd.tmp_fd)) < 0) {
		snprintf(why, sizeof(why), "%s: serving the cluster pull: %s", p->dst, strerror(-ret));
		goto out_fail;
	}
	if (cursor_open(&p->prev, p->sd.stage_fd, "manifest.prev", MF_COMPLETE, why,
			sizeof(why)) < 0)
		job_note(j, LOG_WARN, NULL, NULL, "ignoring the previous manifest: %s", why);
	if (cursor_open(&p->resume, p->sd.stage_fd, "manifest.resume", MF_PARTIAL, why,
			sizeof(why)) < 0)
		job_note(j, LOG_WARN, NULL, NULL, "ignoring an interrupted pull's journal: %s", why);
	ret = mf_writer_open(&p->mw, p->sd.stage_fd, "manifest.partial", p->cfg->chunk_size);
	if (ret < 0) {
		snprintf(why, sizeof(why), "cannot write %s/%s/manifest.partial: %s", p->dst,
			 MF_DIRNAME, strerror(-ret));
		goto out_fail;
	}
	ret = copier_create(&p->cp, p->sd.tmp_fd, &co);
	if (ret < 0) {
		snprintf(why, sizeof(why), "%s: io_uring: %s", p->dst, strerror(-ret));
		goto out_fail;
	}
	p->win = calloc(WINDOW, sizeof(*p->win));
	p->parked = p->sh ? calloc(WINDOW, sizeof(*p->parked)) : NULL;
	p->nparked = 0;
	if (!p->win || (p->sh && !p->parked)) {
		snprintf(why, sizeof(why), "%s: out of memory", p->dst);
		goto out_fail;
	}
	if (first && (j->flags & REQ_PROGRESS))
		count_tree(p);
	copy_tree(p);

	if (job_cancelled(j)) {
		snprintf(why, sizeof(why), "pull into %s cancelled%s", p->dst,
			 stage_stopping ? ": the daemon is stopping" : "");
	} else if (p->fatal) {
		snprintf(why, sizeof(why), "%s%s", p->fatal_why,
			 p->fatal == -ENOSPC || p->fatal == -EDQUOT
			 ? " (the destination file system is full)" : "");
	} else if (p->failed && p->failed == p->changed) {
		snprintf(why, sizeof(why),
			 "%llu file%s of %s changed while %s copied (listed above); pull again when "
			 "%s quiet; %s has no manifest until a pull completes",
			 (unsigned long long)p->changed, p->changed == 1 ? "" : "s", p->src,
			 p->changed == 1 ? "it was" : "they were", p->changed == 1 ? "it is" : "they are",
			 p->dst);
	} else if (p->failed) {
		snprintf(why, sizeof(why),
			 "%llu entries of %s could not be copied (listed above%s); %s has no "
			 "manifest until a pull completes",
			 (unsigned long long)p->failed, p->src,
			 p->changed ? "; those changed while copied: pull again when they are quiet" : "",
			 p->dst);
	} else if ((ret = finish(p, root)) < 0) {
		snprintf(why, sizeof(why), "%s: finishing the manifest: %s", p->dst, strerror(-ret));
	} else {
		pass_teardown(p);
		return 0;
	}
out_fail:
	/* Temporaries go before the answer: once the client hears the pull
	 * failed, nothing of it may still be changing on disk. */
	pass_teardown(p);
	stagedir_close(&p->sd);
	p->dst_fd = -1;
	job_result(j, 1, NULL, NULL, "%s", why);
	return 1;
}

/* verify_tree's report of a staged file that does not match: drop it, so
 * the next pass copies it again. */
static void drop_bad(const struct verify_finding *f, void *arg)
{
	struct pull *p = arg;
	const char *base;
	int fd = treeops_open_parent(p->dst_fd, f->rel, &base);

	if (fd < 0)
		return;
	if (unlinkat(fd, base, 0) == 0)
		p->dropped++;
	close(fd);
}

/* pull --verify: read back what landed, from the disk; a file that does not
 * match is dropped and the pass runs once more to copy it again. Returns
 * with the job's result sent. */
static void verify_and_repair(struct pull *p, digest_t root)
{
	struct job *j = p->job;
	int ret;

	for (int pass = 1;; pass++) {
		atomic_store(&j->phase, "verify");
		p->dropped = 0;
		ret = verify_tree(j, p->dst, p->dst_fd,
				  &(struct verify_opts){ .deep = true, .direct = true,
							   .bad = drop_bad, .arg = p, .count = pass == 1 });
		if (ret == 0) {
			result(p, root);
			return;
		}
		/* Whatever happens next, this tree no longer matches its manifest. */
		stagedir_unpublish(&p->sd);
		if (job_cancelled(j) || ret < 0 || pass == 2 || !p->dropped) {
			stagedir_close(&p->sd);
			p->dst_fd = -1;
		}
		if (job_cancelled(j)) {
			job_result(j, 1, NULL, NULL, "pull into %s cancelled while verifying", p->dst);
			return;
		}
		if (ret < 0 || pass == 2 || !p->dropped) {
			job_result(j, 1, p->dst, NULL, "%s does not match what was read from %s%s",
				   p->dst, p->src, pass == 2 ? ", even after staging again" : "");
			return;
		}
		job_note(j, LOG_WARN, NULL, NULL, "staging %llu damaged files of %s again",
			 (unsigned long long)p->dropped, p->dst);
		if (pull_pass(p, false, &root))
			return;
	}
}

static bool client_gone(void *arg)
{
	return job_cancelled(arg);
}

void pull_run(struct job *j, const char *src_arg, const char *dest_arg)
{
	pull_run_share(j, src_arg, dest_arg, NULL, NULL);
}

void pull_run_share(struct job *j, const char *src_arg, const char *dest_arg,
		    const struct pull_share *sh, struct pull_stats *st)
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
	p->sh = sh;
	p->st = st;
	p->src_fd = p->dst_fd = -1;
	p->as_root = geteuid() == 0;
	j->watch_stuck = true;
	/* Nothing below touches the source before its file system has been
	 * seen to answer: a mount that hangs holds a probe, not this thread.
	 * Only a source beneath a root by its text is probed: any other
	 * (through a link, with "..") is resolved first, so that a path that
	 * leads elsewhere cannot hold the probe of the mount it seems on. */
	ret = roots_source_by_text(p->cfg, src_arg)
	      ? fsprobe_answers(src_arg, FSPROBE_WAIT_MS, client_gone, j, why, sizeof(why)) : 0;
	if (ret == -ETIMEDOUT || ret == -EBUSY) {
		job_result(j, 1, NULL, NULL, "cannot pull %s: %s (a server gone away?); pull again "
			   "once it answers (`stage status` lists what is not answering)", src_arg,
			   why);
		goto out_free;
	}
	if (ret < 0) {
		job_result(j, 1, NULL, NULL, "pull %s: %s", src_arg, why);
		goto out_free;
	}
	ret = roots_pull(p->cfg, src_arg, dest_arg, &p->src, &p->dst, &p->src_fd, why,
			 sizeof(why));
	if (ret < 0) {
		job_result(j, roots_exit_code(ret), NULL, NULL, "%s", why);
		goto out_free;
	}
	job_set_what(j, "%s -> %s", p->src, p->dst);
	if (st)
		snprintf(st->dst, sizeof(st->dst), "%s", p->dst);
	log_info("pull %s -> %s", p->src, p->dst);
	ret = stagedir_open(&p->sd, p->cfg->stage_root, p->dst, p->as_root, why, sizeof(why));
	if (ret < 0) {
		job_result(j, ret == -EEXIST ? 2 : 1, NULL, NULL, "%s", why);
		goto out_close_src;
	}
	p->dst_fd = p->sd.dst_fd;
	if (pull_pass(p, true, &root) == 0) {
		if (j->flags & REQ_VERIFY)
			verify_and_repair(p, root);
		else
			result(p, root);
	}
	if (sh)
		sh->ops->end(sh->arg, j->code == 0);
	stagedir_close(&p->sd);      /* closed already once answered; idempotent */
out_close_src:
	close(p->src_fd);
out_free:
	free(p->src);
	free(p->dst);
	free(p);
}
