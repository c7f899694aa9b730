/* What each entry of the pull's walk becomes (pull_impl.h): a directory
 * made, a link made, a file reused, hashed in place, copied by the copier
 * or forwarded by a cluster pull's share; each takes a slot of the window,
 * which pull.c retires in order. */
#include "daemon/pull/pull_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/paths.h"
#include "daemon/fs/treeops.h"

void pull_note_fatal(struct pull *p, int err, const char *fmt, ...)
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

void pull_warn_meta(struct pull *p, const char *rel, const char *what, int err)
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
		pull_note_fatal(p, -ENOMEM, "%s/%s", p->dst, w->rel);
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
		pull_note_fatal(p, -errno, "%s/%s: mkdir", p->dst, w->rel);
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
		pull_note_fatal(p, -ENOMEM, "%s/%s", p->dst, w->rel);
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
		pull_note_fatal(p, -ENOMEM, "%s/%s", p->dst, w->rel);
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
		pull_note_fatal(p, -ENOMEM, "%s/%s", p->dst, w->rel);
		return;
	}
	if (symlinkat(target, p->sd.tmp_fd, tmp) < 0) {
		pull_note_fatal(p, -errno, "%s/%s: symlink", p->dst, w->rel);
	} else {
		const char *what;
		int ret = treeops_set_meta_at(p->sd.tmp_fd, tmp, true, p->as_root, pe->uid,
					      pe->gid, 0, pe->e.mtime_ns, &what);

		if (ret < 0)
			pull_warn_meta(p, w->rel, what, ret);
		/* Links are made whole in .stage/tmp and renamed in: no link is
		 * ever seen half-made, and a rename replaces atomically. */
		if (renameat(p->sd.tmp_fd, tmp, w->other_dirfd, w->name) < 0) {
			pull_note_fatal(p, -errno, "%s/%s: rename", p->dst, w->rel);
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
		pull_warn_meta(p, w->rel, "chmod", -errno);
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
			pull_note_fatal(p, -ENOMEM, "%s/%s", p->dst, pe->e.path);
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
		pull_note_fatal(p, rc, "%s/%s: %s", p->dst, pe->e.path, why && *why ? why :
			   strerror(-rc));
		return;
	}
	p->failed++;
	job_note(p->job, LOG_ERROR, "unreadable", pe->e.path, "cannot stage %s/%s: %s", p->src,
		 pe->e.path, why && *why ? why : strerror(-rc));
}

/* Parked forwards into the copier, while it has room (all of them, failed,
 * when the pass stops). */
void pull_start_parked(struct pull *p, bool stop)
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
				pull_note_fatal(p, ret, "%s/%s", p->dst, pe->e.path);
		}
	}
}

/* Reaps the share's forwards, waiting up to timeout_ms for the first. */
void pull_reap_fwd(struct pull *p, int timeout_ms)
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
		pull_note_fatal(p, -ENOMEM, "%s/%s", p->dst, w->rel);
		return;
	}
	if (reusable(p, w, old)) {
		if (old->nchunks) {
			pe->e.chunks = malloc(old->nchunks * sizeof(*old->chunks));
			if (!pe->e.chunks) {
				pull_note_fatal(p, -ENOMEM, "%s/%s", p->dst, w->rel);
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
		pull_note_fatal(p, ret, "%s/%s", p->dst, w->rel);
}

void pull_do_entry(struct pull *p, struct walk_ent *w)
{
	/* A name only the destination has, or has as another type, goes first. */
	if (w->side == WALK_OTHER || (w->side == WALK_BOTH && w->other_type != w->type)) {
		int ret = treeops_remove(w->other_dirfd, w->name, w->other_type == 'd');

		if (ret < 0) {
			pull_note_fatal(p, ret, "%s/%s: remove", p->dst, w->rel);
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

/* In-place hashes that failed become copies (outside the copier's
 * callbacks, which may not start files), unless the pass is stopping. */
void pull_start_retries(struct pull *p, bool stop)
{
	for (unsigned i = 0; i < p->nretry; i++) {
		struct pending *pe = p->retry[i];
		int ret = stop ? -ECANCELED : start_file(p, pe, true);

		if (ret < 0) {
			pe->st = P_FAILED;
			if (!stop)
				pull_note_fatal(p, ret, "%s/%s", p->dst, pe->e.path);
		}
	}
	p->nretry = 0;
}
