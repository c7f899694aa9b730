/* Restore, on the origin node:
 *
 *   1. Ask the holders (every node, or --from's) what they hold of the step,
 *      and pick an intact copy: one of the commit this node's own manifest
 *      names when that manifest is intact, otherwise the first in placement
 *      order. A manifest of another commit is not overridden without --from.
 *   2. Fetch the holder's manifest (unless ours is intact and the same) to
 *      .stage/restore.manifest, its root checked against the holder's.
 *   3. Verify the local tree against it, every byte: the findings are what
 *      to repair. "unexpected" entries are left alone and named.
 *   4. Repair in manifest order: directories created, links re-made, and a
 *      file rebuilt beside itself in .stage/tmp chunk by chunk: each chunk
 *      is read from the local file when its digest still matches the
 *      manifest, otherwise fetched from the holder (each piece's XXH3-64
 *      checked by its codec frame, the chunk's XXH3-128 against the
 *      manifest). The whole-file digest is checked, the file fdatasync'd,
 *      given its mode and mtime, and renamed into place.
 *   5. syncfs, then the manifest goes last (rename), a fast verify proves
 *      the result, and the commit record says committed with this root.
 *
 * Step 4's files are fetched, checked and written by the lanes
 * (lane.c), several at once; this file is the rest.
 *
 * Data safety: nothing half-built is under a final name (rebuilds live in
 * .stage/tmp until whole and checked), and the manifest appears only when
 * everything under it matches. An interrupted restore leaves repaired files
 * repaired; the next run verifies again and rebuilds only what is still
 * wrong (a file cut off mid-rebuild starts over). While it runs the watcher
 * does not commit the step.
 */
#include "daemon/restore/restore.h"
#include "daemon/restore/restore_impl.h"
#include "daemon/peers/peers.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/codec.h"
#include "common/log.h"
#include "common/manifest.h"
#include "daemon/ckpt/ckpt.h"
#include "daemon/net/peer.h"
#include "daemon/fs/cursor.h"
#include "daemon/survey/hold.h"
#include "daemon/restore/rsrc.h"
#include "daemon/durable/tier.h"
#include "daemon/repl/repl.h"
#include "daemon/fs/roots.h"
#include "daemon/fs/treeops.h"
#include "daemon/engine/uio.h"
#include "daemon/pull/damage.h"
#include "daemon/pull/verify.h"
#include "daemon/obs/obs.h"

#define MF_FETCHED "restore.manifest"

static void on_bad(const struct verify_finding *f, void *arg)
{
	struct restore *r = arg;
	struct bad *b;

	if (r->nbad == r->capbad) {
		size_t cap = r->capbad ? 2 * r->capbad : 64;
		struct bad *v = realloc(r->bad, cap * sizeof(*v));

		if (!v) {
			r->lost_finding = true;
			return;
		}
		r->bad = v;
		r->capbad = cap;
	}
	b = &r->bad[r->nbad];
	*b = (struct bad){ .rel = strdup(f->rel), .unexpected = strcmp(f->kind, "unexpected") == 0,
			   .damaged = strcmp(f->kind, "damaged") == 0 };
	if (b->damaged && f->nbad && (b->chunks = malloc(f->nbad * sizeof(*b->chunks)))) {
		memcpy(b->chunks, f->bad, f->nbad * sizeof(*b->chunks));
		b->nchunks = f->nbad;
	}
	if (b->rel) {   /* without the chunk list, the file is rebuilt whole */
		r->nbad++;
	} else {
		free(b->chunks);
		r->lost_finding = true;
	}
}

static int bad_cmp(const void *a, const void *b)
{
	return mf_path_cmp(((const struct bad *)a)->rel, ((const struct bad *)b)->rel);
}

/* The copy's manifest to .stage/restore.manifest, fsync'd, its root checked
 * against the one announced. */
static int fetch_manifest(struct rlane *l)
{
	struct restore *r = l->r;
	digest_t got;
	int fd, rc;

	fd = openat(r->stage_fd, MF_FETCHED, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
		    0644);
	if (fd < 0) {
		snprintf(l->why, sizeof(l->why), "%s/%s/%s: %s", r->path, MF_DIRNAME, MF_FETCHED,
			 strerror(errno));
		return -errno;
	}
	rc = l->src->ops->manifest(l->src, fd);
	if (rc == 0 && fsync(fd) < 0) {
		rc = -errno;
		snprintf(l->why, sizeof(l->why), "%s/%s/%s: fsync: %s", r->path, MF_DIRNAME,
			 MF_FETCHED, strerror(errno));
	}
	close(fd);
	if (rc < 0)
		return rc;
	rc = ckpt_manifest_root(r->stage_fd, MF_FETCHED, &got, NULL, NULL, 0);
	if (rc < 0 || !digest_eq(got, r->root)) {
		snprintf(l->why, sizeof(l->why), "the manifest %s sent %s", restore_said(l->src->name),
			 rc < 0 ? "does not read (damaged on the way?)" :
			 "has another root than it announced");
		return rc < 0 ? rc : -EBADMSG;
	}
	return 0;
}

/* A directory or a link of the manifest, on the job thread: before any file
 * beneath it is handed to a lane. 0 or -errno with why. */
static int repair_entry(struct restore *r, const struct mf_entry *e, char *why, size_t whylen)
{
	const char *base, *what;
	struct stat st;
	int parent, rc = 0;

	parent = treeops_open_parent(r->step_fd, e->path, &base);
	if (parent < 0) {
		snprintf(why, whylen, "%s: its directory: %s", e->path,
			 strerror(-parent));
		return parent;
	}
	if (e->type == MF_DIR) {
		rc = restore_clear_way(r, parent, base, e->path, S_IFDIR, why, whylen);
		if (rc == 0 && mkdirat(parent, base, 0700) < 0 && errno != EEXIST)
			rc = -errno;
	} else if (e->type == MF_LINK) {
		/* A link with the wrong target is replaced; anything else moves aside. */
		rc = restore_clear_way(r, parent, base, e->path, S_IFLNK, why, whylen);
		if (rc == 0 && fstatat(parent, base, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
		    unlinkat(parent, base, 0) < 0)
			rc = -errno;
		if (rc == 0 && symlinkat(e->target, parent, base) < 0)
			rc = -errno;
		else if (rc == 0)
			rc = treeops_set_meta_at(parent, base, true, false, 0, 0, e->mode,
						 e->mtime_ns, &what);
	}
	if (rc < 0 && !*why)
		snprintf(why, whylen, "%s: %s", e->path, strerror(-rc));
	close(parent);
	return rc;
}

/* Directories get their mode and mtime last: creating entries in them
 * changed their mtimes. */
static void dir_meta(struct restore *r, const char *mf)
{
	struct mf_reader *mr;
	struct mf_entry e;
	const char *what;

	if (mf_reader_open(&mr, r->stage_fd, mf, MF_COMPLETE) < 0)
		return;
	while (mf_reader_next(mr, &e) == 1) {
		if (e.type == MF_DIR) {
			const char *base;
			int parent = treeops_open_parent(r->step_fd, e.path, &base);

			if (parent >= 0) {
				treeops_set_meta_at(parent, base, false, false, 0, 0,
						    PEER_MODE(e.mode), e.mtime_ns, &what);
				close(parent);
			}
		}
		mf_entry_free(&e);
	}
	mf_reader_close(mr);
}

/* Waits (under r->mu) until pred holds, keeping the client told and
 * watching for its Ctrl-C: the job thread alone speaks for the job. */
static void wait_lanes(struct restore *r, bool (*pred)(const struct restore *))
{
	while (!pred(r)) {
		struct timespec ts = mono_timespec(mono_ns() + 100000000ull);

		pthread_cond_timedwait(&r->cv, &r->mu, &ts);
		pthread_mutex_unlock(&r->mu);
		job_progress(r->j, false);
		bool cancelled = job_cancelled(r->j);
		pthread_mutex_lock(&r->mu);
		if (cancelled)
			restore_fail_locked(r, -ECANCELED, "cancelled");
	}
}

static bool queue_has_room(const struct restore *r)
{
	return r->qlen < r->nlanes || atomic_load(&r->stop) || !r->running;
}

static bool lanes_done(const struct restore *r)
{
	return !r->running;
}

static void lanes_start(struct restore *r)
{
	r->running = 0;
	for (size_t i = 0; i < r->nlanes; i++) {
		struct rlane *l = &r->lanes[i];

		l->started = pthread_create(&l->thread, NULL, rlane_main, l) == 0;
		r->running += l->started;
	}
}

static void lanes_join(struct restore *r)
{
	for (size_t i = 0; i < r->nlanes; i++)
		if (r->lanes[i].started) {
			pthread_join(r->lanes[i].thread, NULL);
			r->lanes[i].started = false;
		}
	for (size_t i = 0; i < r->nlanes; i++) {
		struct rlane *l = &r->lanes[i];

		r->files_fixed += l->files_fixed;
		r->files_patched += l->files_patched;
		r->chunks_fetched += l->chunks_fetched;
		r->bytes_fetched += l->bytes_fetched;
		r->chunks_kept += l->chunks_kept;
	}
}

/* The findings in manifest order: directories and links made here, files
 * handed to the lanes. */
static int repair(struct restore *r, const char *mf)
{
	struct cursor c;
	char why[1024], ewhy[4096];
	int rc = cursor_open(&c, r->stage_fd, mf, MF_COMPLETE, why, sizeof(why));

	if (rc < 0) {
		snprintf(r->why, sizeof(r->why), "%s", why);
		return rc;
	}
	qsort(r->bad, r->nbad, sizeof(*r->bad), bad_cmp);
	atomic_store(&r->j->phase, "restore");
	atomic_store(&r->j->files_total, r->nbad);
	atomic_store(&r->j->files_done, 0);
	pthread_mutex_lock(&r->mu);     /* lanes that end at once count down r->running */
	lanes_start(r);
	for (size_t i = 0; i < r->nbad && !atomic_load(&r->stop); i++) {
		const struct mf_entry *e;
		struct rwork *w;

		pthread_mutex_unlock(&r->mu);   /* a note may wait for a slow client */
		job_progress(r->j, false);
		if (r->bad[i].unexpected) {
			job_note(r->j, LOG_WARN, "unexpected", r->bad[i].rel,
				 "left alone: %s/%s is not in the manifest (remove it, or commit "
				 "the step again)", r->path, r->bad[i].rel);
			pthread_mutex_lock(&r->mu);
			continue;
		}
		if (job_cancelled(r->j)) {
			pthread_mutex_lock(&r->mu);
			restore_fail_locked(r, -ECANCELED, "cancelled");
			break;
		}
		e = cursor_find(&c, r->bad[i].rel);
		if (!e || e->type != MF_FILE) {
			rc = 0;
			*ewhy = '\0';
			if (!e && c.err) {
				snprintf(ewhy, sizeof(ewhy), "the manifest stopped reading");
				rc = c.err;
			} else if (e) {
				rc = repair_entry(r, e, ewhy, sizeof(ewhy));
				if (rc == 0)
					job_note(r->j, LOG_INFO, "restored", e->path, "restored %s/%s",
						 r->path, e->path);
				atomic_fetch_add(&r->j->files_done, 1);
			}
			/* !e: a finding below an entry already rebuilt */
			pthread_mutex_lock(&r->mu);
			if (rc < 0)
				restore_fail_locked(r, rc, ewhy);
			continue;
		}
		pthread_mutex_lock(&r->mu);
		wait_lanes(r, queue_has_room);
		if (atomic_load(&r->stop))
			break;
		if (!r->running) {      /* no thread could be started */
			restore_fail_locked(r, -EAGAIN, "no thread could be started for the repairs");
			break;
		}
		w = &r->q[(r->qhead + r->qlen) % RLANES_MAX];
		w->chunk_size = cursor_chunk_size(&c);
		w->b = &r->bad[i];
		if (mf_entry_copy(&w->e, e) < 0) {
			restore_fail_locked(r, -ENOMEM, "out of memory");
			break;
		}
		r->qlen++;
		pthread_cond_broadcast(&r->cv);
	}
	r->qclosed = true;
	pthread_cond_broadcast(&r->cv);
	wait_lanes(r, lanes_done);
	while (r->qlen) {       /* left when the lanes stopped early */
		mf_entry_free(&r->q[r->qhead].e);
		r->qhead = (r->qhead + 1) % RLANES_MAX;
		r->qlen--;
	}
	rc = r->err;
	pthread_mutex_unlock(&r->mu);
	lanes_join(r);
	cursor_close(&c);
	if (rc == 0)
		dir_meta(r, mf);
	return rc;
}

static void clear_tmp(struct restore *r)
{
	int fd = dup(r->tmp_fd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *e;

	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((e = readdir(d)))
		if (strncmp(e->d_name, "rebuild.", 8) == 0)
			unlinkat(r->tmp_fd, e->d_name, 0);
	closedir(d);
}

/* Opens (creating) ckpt_root/JOB/STEP, its .stage and .stage/tmp. JOB/ may
 * belong to the training job's user: it is walked down from ckpt_root's fd
 * without following symlinks, so swapping JOB or STEP for a link cannot steer
 * the restore's writes outside ckpt_root. */
static int open_dirs(struct restore *r)
{
	char rel[2 * CKPT_NAME_MAX + 2];
	int root = -1, rc = roots_mkdirs(peers.cfg->ckpt_root, 0755);  /* the admin's */

	if (rc == 0 && (root = open(peers.cfg->ckpt_root, O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
		rc = -errno;
	snprintf(rel, sizeof(rel), "%s/%s", r->job, r->step);
	if (rc == 0 && (r->step_fd = treeops_mkdirs_beneath(root, rel, 0755)) < 0)
		rc = r->step_fd;
	if (root >= 0)
		close(root);
	if (rc == 0 && mkdirat(r->step_fd, MF_DIRNAME, 0755) < 0 && errno != EEXIST)
		rc = -errno;
	if (rc == 0 && (r->stage_fd = openat(r->step_fd, MF_DIRNAME, O_RDONLY | O_DIRECTORY |
					     O_NOFOLLOW | O_CLOEXEC)) < 0)
		rc = -errno;
	if (rc == 0 && mkdirat(r->stage_fd, TMP_DIR, 0700) < 0 && errno != EEXIST)
		rc = -errno;
	if (rc == 0 && (r->tmp_fd = openat(r->stage_fd, TMP_DIR, O_RDONLY | O_DIRECTORY |
					   O_NOFOLLOW | O_CLOEXEC)) < 0)
		rc = -errno;
	if (rc < 0)
		snprintf(r->why, sizeof(r->why), "%s: %s", r->path, rc == -ELOOP || rc == -ENOTDIR
			 ? "a symlink or file where a directory belongs; nothing was restored"
			 : strerror(-rc));
	else
		clear_tmp(r);
	return rc;
}

/* Whether node is one this node's copies are placed on (r->place, worked
 * out once by choose). */
static bool placed(const struct restore *r, const char *node)
{
	for (size_t k = 0; k < r->nplace; k++)
		if (strcmp(r->place[k], node) == 0)
			return true;
	return false;
}

/* Whether cell h is a copy of this node's step r->step (from any holder
 * but this node), of commit root when root is not NULL, and intact unless
 * any_state. */
static bool copy_of(const struct restore *r, const struct hold_cell *h, const digest_t *root,
		    bool any_state)
{
	return strcmp(h->origin, peers.cfg->name) == 0 && strcmp(h->holder, peers.cfg->name) != 0 &&
	       (any_state || strcmp(h->state, "ok") == 0) && h->has_root && h->step &&
	       strcmp(h->step, r->step) == 0 && (!root || digest_eq(h->root, *root));
}

/* The copy chosen first, then as its fall-backs every other intact copy of
 * the same commit in the order of the answers (placement order first: see
 * choose) and last the durable tier's part of it. */
static void set_sources(struct restore *r, const struct hold_cell *best,
			const struct survey_answer *ans, size_t nans)
{
	const struct hold_cell *durable = NULL;
	struct rlane *l = &r->lanes[0];

	rlane_src_init(l, &l->srcs[0], best->holder);
	l->src = &l->srcs[0];
	l->nsrcs = 1;
	for (size_t pass = 0; pass < 2; pass++)
		for (size_t i = 0; i < nans; i++)
			for (size_t c = 0; c < ans[i].ncells; c++) {
				const struct hold_cell *h = &ans[i].cells[c];
				bool tier = strcmp(h->holder, HOLD_DURABLE) == 0;

				/* The tier's state aside, as before: every chunk
				 * taken from any source is checked. */
				if (h == best || !copy_of(r, h, &r->root, tier) ||
				    strcmp(h->holder, best->holder) == 0)
					continue;
				if (tier)
					durable = h;
				else if (pass == 0 && placed(r, ans[i].node) && l->nsrcs < RSRC_MAX - 1)
					rlane_src_init(l, &l->srcs[l->nsrcs++], h->holder);
				else if (pass == 1 && !placed(r, ans[i].node) && l->nsrcs < RSRC_MAX - 1)
					rlane_src_init(l, &l->srcs[l->nsrcs++], h->holder);
			}
	if (durable && strcmp(best->holder, HOLD_DURABLE) != 0)
		rlane_src_init(l, &l->srcs[l->nsrcs++], HOLD_DURABLE);
}

/* Lanes beside lane 0 for the files the verify found: [transfer]
 * restore_streams at most, no more than there are files, and within the
 * job's memory budget. Fewer when one cannot be set up. */
static void lanes_add(struct restore *r)
{
	uint64_t want = (uint64_t)peers.cfg->restore_streams, files = 0;

	for (size_t i = 0; i < r->nbad; i++)
		files += !r->bad[i].unexpected;
	if (want > files)
		want = files;
	if (want > peers.cfg->memory / LANE_MEM)
		want = peers.cfg->memory / LANE_MEM;
	if (want > RLANES_MAX)
		want = RLANES_MAX;
	while (r->nlanes < want) {
		struct rlane *l = &r->lanes[r->nlanes];

		if (rlane_setup(r, l, (unsigned)r->nlanes) < 0)
			break;
		rlane_sources(l, &r->lanes[0]);
		r->nlanes++;
	}
}

/* The copy to restore from: index into cells, or -1 with r->why. */
static ssize_t choose(struct restore *r, const struct survey_answer *ans, size_t nans,
		      bool have_local, digest_t local_root, bool forced)
{
	const char *self = peers.cfg->name;
	const struct hold_cell *best = NULL, *other = NULL;
	size_t o = 0;

	r->nplace = survey_placement(self, r->place, sizeof(r->place) / sizeof(r->place[0]));
	/* Placement order first: those are the copies meant for this. */
	for (size_t pass = 0; pass < 2 && !best; pass++)
		for (size_t i = 0; i < nans && !best; i++) {
			if (placed(r, ans[i].node) != (pass == 0))
				continue;
			for (size_t c = 0; c < ans[i].ncells; c++) {
				const struct hold_cell *h = &ans[i].cells[c];

				if (!copy_of(r, h, NULL, false))
					continue;
				if (!have_local || digest_eq(h->root, local_root) || forced)
					best = h;
				else if (!other)
					other = h;
			}
		}
	if (best) {
		r->root = best->root;
		r->holder = best->holder;
		set_sources(r, best, ans, nans);
		return 0;
	}
	if (other) {
		char a[DIGEST_HEX_LEN + 1], b[DIGEST_HEX_LEN + 1];

		digest_to_hex(local_root, a);
		digest_to_hex(other->root, b);
		snprintf(r->why, sizeof(r->why), "this node's manifest of %s/%s (root %s) is of "
			 "another commit than the copy on %s (root %s): not mixing them; "
			 "`--from %s` takes that copy whole", r->job, r->step, a, restore_said(other->holder),
			 b, other->holder);
		return -1;
	}
	o = (size_t)snprintf(r->why, sizeof(r->why), "no other node%s holds an intact copy of "
			     "%s/%s from %s", durable_on(peers.cfg) ? " nor the durable tier" : "",
			     r->job, r->step, self);
	bool unasked = false;

	for (size_t i = 0; i < nans && o < sizeof(r->why); i++) {
		const char *state = "holds nothing of it", *step = NULL;

		if (strcmp(ans[i].node, self) == 0)
			continue;
		for (size_t c = 0; c < ans[i].ncells; c++)
			if (strcmp(ans[i].cells[c].origin, self) == 0) {
				state = ans[i].cells[c].state;
				step = ans[i].cells[c].step;
			}
		unasked |= ans[i].err != 0;
		if (ans[i].err)
			o += (size_t)snprintf(r->why + o, sizeof(r->why) - o, "; %s could not be "
					      "asked (%s)", ans[i].node, ans[i].why);
		else if (strcmp(state, "other-step") == 0)
			o += (size_t)snprintf(r->why + o, sizeof(r->why) - o, "; %s holds %s, not "
					      "this step", ans[i].node, step ? step : "another step");
		else
			o += (size_t)snprintf(r->why + o, sizeof(r->why) - o, "; %s: %s",
					      ans[i].node, state);
	}
	if (o < sizeof(r->why))
		snprintf(r->why + o, sizeof(r->why) - o, "%s", unasked ?
			 "; run the restore again when those nodes are up" :
			 "; was it committed and replicated? (`stage ls` says)");
	return -1;
}

/* Where the bytes came from, for the result: the copy chosen, and each
 * fall-back that gave some with how many. */
static void sources_said(const struct restore *r, char *out, size_t len)
{
	const struct rlane *first = &r->lanes[0];
	size_t o = 0, used = 0;

	*out = '\0';
	/* Lane 0's list names every source once; the others are its order. */
	for (size_t i = 0; i < first->nsrcs && o < len; i++) {
		const char *name = first->srcs[i].name;
		uint64_t bytes = 0;
		bool opened = false;

		for (size_t k = 0; k < r->nlanes; k++)
			for (size_t s = 0; s < r->lanes[k].nsrcs; s++)
				if (strcmp(r->lanes[k].srcs[s].name, name) == 0) {
					opened |= r->lanes[k].srcs[s].opened;
					bytes += r->lanes[k].srcs[s].bytes;
				}
		if (!opened)
			continue;       /* could not be read: it gave nothing */
		if (used++ == 0)
			o += (size_t)snprintf(out + o, len - o, "%s", restore_said(name));
		else
			o += (size_t)snprintf(out + o, len - o, " and %s (%llu bytes from it)",
					      restore_said(name), (unsigned long long)bytes);
	}
}

/* .stage/restoring: the persistent "being restored" mark (repl.c reads it
 * before any commit of the step). Holds the holder and root, for a person. */
static int mark(struct restore *r)
{
	char hex[DIGEST_HEX_LEN + 1], line[512];
	int fd = openat(r->stage_fd, RESTORE_MARK, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW |
			O_CLOEXEC, 0644);
	int n, rc = 0;

	if (fd < 0)
		return -errno;
	digest_to_hex(r->root, hex);
	n = snprintf(line, sizeof(line), "from %s root %s\n", r->holder, hex);
	if (uio_pwrite(&r->ring, fd, line, (size_t)n, 0) < 0 || fsync(fd) < 0)
		rc = -EIO;
	close(fd);
	return rc;
}

static void unmark(struct restore *r)
{
	if (unlinkat(r->stage_fd, RESTORE_MARK, 0) == 0)
		fsync(r->stage_fd);
}

struct leftover {
	uint64_t unexpected, other;
};

static void count_left(const struct verify_finding *f, void *arg)
{
	struct leftover *l = arg;

	if (strcmp(f->kind, "unexpected") == 0)
		l->unexpected++;
	else
		l->other++;
}

/* The survey, the copy chosen and its manifest fetched (*mf: the
 * manifest the tree is checked against). 0, or -1 with the job's result
 * given. */
static int choose_copy(struct restore *r, const char *from, struct survey_answer **ans,
		       size_t *nans, const char **mf)
{
	digest_t local_root;
	bool have_local;
	int rc;

	rc = survey_ask(r->job, r->step, false, from, ans, nans);
	if (rc == -ENOENT && strcmp(from, HOLD_DURABLE) == 0) {
		job_result(r->j, 2, NULL, NULL, "--from %s: this node has no durable tier ([durable] "
			   "root in its config)", from);
		return -1;
	}
	if (rc == -ENOENT) {
		job_result(r->j, 2, NULL, NULL, "--from %s: not a node of the hosts file %s, nor "
			   "\"%s\"", from, peers.cfg->hosts, HOLD_DURABLE);
		return -1;
	}
	if (rc < 0 || (rc = open_dirs(r)) < 0) {
		/* A link where JOB or STEP belongs is a refusal, like a path
		 * outside the roots; anything else a failure. */
		job_result(r->j, rc == -ELOOP || rc == -ENOTDIR ? 2 : 1, NULL, NULL, "restore: %s",
			   *r->why ? r->why : strerror(-rc));
		return -1;
	}
	have_local = ckpt_manifest_root(r->stage_fd, "manifest", &local_root, NULL, NULL, 0) == 0;
	if (r->pin && have_local && !digest_eq(local_root, *r->pin)) {
		char a[DIGEST_HEX_LEN + 1], b[DIGEST_HEX_LEN + 1];

		digest_to_hex(local_root, a);
		digest_to_hex(*r->pin, b);
		job_result(r->j, 1, NULL, NULL, "not restoring %s: this node's manifest of it (root "
			   "%s) is of another commit than the one chosen (root %s); `stage restore "
			   "%s --from %s` takes that copy whole", r->path, a, b, r->path, from);
		return -1;
	}
	/* Pinned, the holder's copy must be of that commit too: no forcing. */
	if (choose(r, *ans, *nans, have_local, local_root, from != NULL && !r->pin) < 0) {
		job_result(r->j, 1, NULL, NULL, "cannot restore %s: %s", r->path, r->why);
		return -1;
	}
	if (r->pin && !digest_eq(r->root, *r->pin)) {
		job_result(r->j, 1, NULL, NULL, "not restoring %s: the copy on %s is of another "
			   "commit than the one chosen (it changed since)", r->path, r->holder);
		return -1;
	}
	rc = rlane_open(&r->lanes[0]);
	if (rc == 0 && (!have_local || !digest_eq(local_root, r->root))) {
		*mf = MF_FETCHED;
		rc = fetch_manifest(&r->lanes[0]);
		while (rc < 0 && rlane_fall_back(&r->lanes[0], NULL, rc) == 0)
			rc = fetch_manifest(&r->lanes[0]);
	}
	if (rc < 0) {
		job_result(r->j, 1, NULL, NULL, "restore %s from %s: %s", r->path, restore_said(r->holder),
			   r->lanes[0].why);
		return -1;
	}
	r->holder = r->lanes[0].src->name;     /* the chosen copy, or the one fallen back to */
	job_note(r->j, LOG_INFO, NULL, NULL, "restoring %s from the copy on %s", r->path,
		 restore_said(r->holder));
	return 0;
}

/* The step marked, its damage repaired, the whole tree proven against the
 * manifest, and the manifest put in place last. 0, or -errno with r->why
 * (the mark stays: a rerun finishes it). */
static int rebuild(struct restore *r, const char *mf, struct leftover *left)
{
	int rc;

	/* From here until it is whole again the step is marked: neither the
	 * watcher nor `stage commit` may commit it (and replicate half a
	 * restore over the intact copies), even after a crash. A manifest of
	 * another commit goes now: it must not stand over a tree on its way
	 * to another content. */
	rc = mark(r);
	if (rc == 0 && strcmp(mf, MF_FETCHED) == 0 && unlinkat(r->stage_fd, "manifest", 0) < 0 &&
	    errno != ENOENT)
		rc = -errno;
	if (rc == 0 && fsync(r->stage_fd) < 0)
		rc = -errno;
	if (rc < 0 && !*r->why)
		snprintf(r->why, sizeof(r->why), "%s/%s: %s", r->path, MF_DIRNAME, strerror(-rc));
	if (rc == 0) {
		/* What a verify --deep just found is not read again: files it
		 * vouched for and nothing changed since (damage.h). */
		rc = verify_tree(r->j, r->path, r->step_fd, &(struct verify_opts){
					 .deep = true, .bad = on_bad, .arg = r, .manifest = mf,
					 .record = true, .trust = true, .trusted = &r->trusted });
		if (rc == 1 && !r->lost_finding) {
			lanes_add(r);
			if (r->nlanes > 1)
				job_set_what(r->j, "%s (%zu streams)", r->path, r->nlanes);
			rc = repair(r, mf);
		}
		else if (rc == 1)
			rc = -ENOMEM;
		if (rc < 0 && !*r->why)
			snprintf(r->why, sizeof(r->why), "could not read it: %s", strerror(-rc));
	}
	if (rc == 0 && syncfs(r->step_fd) < 0) {
		rc = -errno;
		snprintf(r->why, sizeof(r->why), "syncfs: %s", strerror(errno));
	}
	if (rc == 0) {
		/* Proof before the manifest: the tree matches it in every entry. */
		rc = verify_tree(r->j, r->path, r->step_fd, &(struct verify_opts){
					 .bad = count_left, .arg = left, .manifest = mf });
		if (rc == 1 && !left->other)
			rc = 0;         /* only entries not in the manifest: left alone */
		if (rc != 0) {
			snprintf(r->why, sizeof(r->why), "it still does not match the manifest "
				 "afterwards (%llu entries%s%s)", (unsigned long long)left->other,
				 rc < 0 ? "; " : "", rc < 0 ? strerror(-rc) : "");
			rc = rc < 0 ? rc : -EIO;
		}
	}
	if (rc == 0 && strcmp(mf, MF_FETCHED) == 0) {
		/* The manifest goes last: it says the step is complete. */
		if (renameat(r->stage_fd, MF_FETCHED, r->stage_fd, "manifest") < 0 ||
		    fsync(r->stage_fd) < 0) {
			rc = -errno;
			snprintf(r->why, sizeof(r->why), "%s/%s: %s", r->path, MF_NAME,
				 strerror(errno));
		}
	}
	return rc;
}

/* The result of a restore that succeeded: what was fetched, kept, trusted. */
static void report(struct restore *r, const struct leftover *left)
{
	char source[RSRC_MAX * (CKPT_NAME_MAX + 64)];

	sources_said(r, source, sizeof(source));
	if (!r->files_fixed && !r->files_patched && !r->nbad) {
		job_result(r->j, 0, r->path, NULL, "%s is intact (every byte checked against the "
			   "copy on %s%s): nothing to restore", r->path, source,
			   r->trusted ? ", by the last verify --deep where nothing changed since" :
			   "");
	} else {
		char files[96];
		int n = 0;

		if (r->files_fixed || !r->files_patched)
			n = snprintf(files, sizeof(files), "%llu file%s rebuilt, ",
				     (unsigned long long)r->files_fixed, r->files_fixed == 1 ? "" : "s");
		if (r->files_patched)
			snprintf(files + n, sizeof(files) - (size_t)n, "%llu file%s patched in place, ",
				 (unsigned long long)r->files_patched,
				 r->files_patched == 1 ? "" : "s");
		char trusted[96] = "";

		if (r->trusted)
			snprintf(trusted, sizeof(trusted), "; %llu file%s taken from the last verify "
				 "--deep, not read again", (unsigned long long)r->trusted,
				 r->trusted == 1 ? "" : "s");
		job_result(r->j, 0, r->path, NULL, "restored %s from %s: %s%llu chunk%s (%llu bytes) "
			   "fetched, %llu intact chunk%s kept%s%s", r->path, source, files,
			   (unsigned long long)r->chunks_fetched, r->chunks_fetched == 1 ? "" : "s",
			   (unsigned long long)r->bytes_fetched, (unsigned long long)r->chunks_kept,
			   r->chunks_kept == 1 ? "" : "s", trusted,
			   left->unexpected ? "; entries not in the manifest were left alone" : "");
	}
}

static void run(struct restore *r, const char *from)
{
	struct survey_answer *ans = NULL;
	struct leftover left = { 0 };
	const char *mf = "manifest";
	size_t nans = 0;
	int rc;

	if (choose_copy(r, from, &ans, &nans, &mf) < 0)
		goto out;
	rc = rebuild(r, mf, &left);
	if (rc < 0) {
		job_result(r->j, 1, NULL, NULL, "restore %s from %s: %s%s", r->path, restore_said(r->holder),
			   *r->why ? r->why : strerror(-rc),
			   "; the step stays marked unfinished: run the restore again");
		goto out;
	}
	repl_restored(r->job, r->step, r->root, atomic_load(&r->j->files_total),
		      atomic_load(&r->j->bytes_total));
	damage_remove(r->stage_fd);     /* what it named is repaired */
	unmark(r);
	if (r->then) {
		struct survey_flat f;

		if (survey_flatten(ans, nans, &f) == 0) {
			r->then(r->j, r->job, r->step, f.cells, f.ncells);
			survey_flat_free(&f);
		}
	}
	report(r, &left);
out:
	survey_answers_free(ans, nans);
}

static void restore(struct job *j, const char *path, const char *from, const digest_t *pin,
		    restore_then_fn *then);

void restore_run(struct job *j, const char *path, const char *from, restore_then_fn *then)
{
	restore(j, path, from, NULL, then);
}

void restore_pinned(struct job *j, const char *path, const char *from, const digest_t *pin)
{
	restore(j, path, from, pin, NULL);
}

static void restore(struct job *j, const char *path, const char *from, const digest_t *pin,
		    restore_then_fn *then)
{
	char origin[CKPT_NAME_MAX + 1], job[CKPT_NAME_MAX + 1], step[CKPT_NAME_MAX + 1];
	struct restore r = { .j = j, .job = job, .step = step, .pin = pin, .then = then, .step_fd = -1,
			     .stage_fd = -1, .tmp_fd = -1 };
	int rc;

	if (ckpt_locate(j->cfg, path, false, origin, job, step, r.why, sizeof(r.why)) < 0) {
		job_result(j, 2, NULL, NULL, "restore: %s", r.why);
		return;
	}
	/* Again, on the job this resolved to (a link swapped in since the
	 * request was admitted leads nowhere). */
	if (roots_job_owner_check(j->cfg, job, "restore", r.why, sizeof(r.why)) < 0) {
		job_result(j, 2, NULL, NULL, "%s", r.why);
		return;
	}
	if (from && strcmp(from, peers.cfg->name) == 0) {
		job_result(j, 2, NULL, NULL, "--from %s names this node: restore fetches from "
			   "another node's replica", from);
		return;
	}
	if (!peers.cluster && !durable_on(peers.cfg)) {
		job_result(j, 1, NULL, NULL, "cannot restore %s/%s/%s: a single node (no hosts "
			   "file %s) holds no replicas", peers.cfg->ckpt_root, job, step,
			   peers.cfg->hosts);
		return;
	}
	snprintf(r.path, sizeof(r.path), "%s/%s/%s", peers.cfg->ckpt_root, job, step);
	snprintf(r.dlabel, sizeof(r.dlabel), "%s/%s/%s", peers.cfg->durable_root, job, step);
	job_set_what(j, "%s", r.path);
	rc = repl_restore_begin(job, step);
	if (rc < 0) {
		job_result(j, 1, NULL, NULL, "%s: %s", r.path, rc == -EAGAIN ?
			   "a commit of it is being hashed; restore it once that is done" :
			   "a restore of it is already running");
		return;
	}
	pthread_mutex_init(&r.mu, NULL);
	mono_cond_init(&r.cv);                          /* wait_lanes' deadlines */
	rc = uio_init(&r.ring);
	if (rc == 0 && (rc = rlane_setup(&r, &r.lanes[0], 0)) < 0)
		io_uring_queue_exit(&r.ring);
	if (rc < 0) {
		job_result(j, 1, NULL, NULL, "restore %s: %s", r.path, strerror(-rc));
	} else {
		r.nlanes = 1;
		run(&r, from);
		io_uring_queue_exit(&r.ring);
	}
	for (size_t i = 0; i < r.nlanes; i++)
		rlane_teardown(&r.lanes[i]);
	pthread_cond_destroy(&r.cv);
	pthread_mutex_destroy(&r.mu);
	for (size_t i = 0; i < r.nbad; i++) {
		free(r.bad[i].rel);
		free(r.bad[i].chunks);
	}
	free(r.bad);
	if (r.tmp_fd >= 0)
		close(r.tmp_fd);
	if (r.stage_fd >= 0)
		close(r.stage_fd);
	if (r.step_fd >= 0)
		close(r.step_fd);
	codec_thread_end();
	repl_restore_end(job, step);
}
