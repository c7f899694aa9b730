/* The pull engine.
 *
 * One pass over the source tree (walk.c, merged with the destination), one
 * io_uring copier (copier.c) with many files in flight, and a window of
 * pending entries retired strictly in walk order into the manifest journal.
 * What each entry of the walk becomes is entries.c's; DEST/.stage/ and its
 * files are stagedir.c's.
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
#include "daemon/pull/pull_impl.h"

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
#include "daemon/fs/cred.h"
#include "daemon/fs/cursor.h"
#include "daemon/fs/fsprobe.h"
#include "daemon/pull/dirstack.h"
#include "daemon/fs/roots.h"
#include "daemon/pull/stagedir.h"
#include "daemon/fs/treeops.h"
#include "daemon/pull/verify.h"
#include "daemon/fs/walk.h"
#include "daemon/obs/obs.h"

/* Durability comes in batches: a temporary is made durable before its
 * rename by one syncfs for many files, which costs far less than an
 * fdatasync each (those force every small file's writeback and a journal
 * commit one by one: a quarter of a small-file pull's time). */
#define BATCH_FILES 1024u
#define BATCH_BYTES (256ull << 20)
#define BATCH_NS 50000000ull
#define BATCH_SHARE_NS 10000000ull     /* a cluster pull's peers wait for what we settle */

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
				pull_note_fatal(p, ret, "%s: writing the manifest journal", p->dst);
			if (pe->e.type == MF_DIR &&
			    dirstack_push(&p->dirs, pe->e.path, pe->e.mode, pe->e.mtime_ns,
					  pe->uid, pe->gid) < 0)
				pull_note_fatal(p, -ENOMEM, "%s", p->dst);
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
			pull_note_fatal(p, cf->err, "%s/%s: %s (its temporary)", p->dst, pe->e.path,
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
		pull_note_fatal(p, -errno, "%s: syncfs", p->dst);
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
				pull_note_fatal(p, pfd, "%s/%s: cannot open its directory", p->dst,
					   pe->e.path);
				drop = true;
			}
		}
		if (drop) {
			unlinkat(p->sd.tmp_fd, pe->tmp, 0);
			pe->st = P_FAILED;
		} else if (renameat(p->sd.tmp_fd, pe->tmp, pfd, base) < 0) {
			pull_note_fatal(p, -errno, "%s/%s: rename", p->dst, pe->e.path);
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
		pull_note_fatal(p, ret, "%s", p->src);
		return;
	}
	while (walking || p->count) {
		bool stop = p->fatal || job_cancelled(p->job);

		pull_start_parked(p, stop);
		while (walking && !stop && p->count < WINDOW && copier_has_room(p->cp)) {
			ret = walk_next(w, &e);
			if (ret == 0) {
				walking = false;
			} else if (ret < 0) {
				p->failed++;
				job_note(p->job, LOG_ERROR, "unreadable", walk_err_path(w), "%s: %s",
					 p->src, walk_why(w));
			} else {
				pull_do_entry(p, &e);
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
			pull_note_fatal(p, ret, "%s: io_uring", p->dst);
			break;
		}
		pull_reap_fwd(p, copier_inflight(p->cp) || p->nparked ? 0 : 100);
		if (p->nretry)
			pull_start_retries(p, stop || p->fatal);
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
			pull_reap_fwd(p, 100);
	}
	pull_start_parked(p, true);
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
			pull_warn_meta(p, "", what, ret);
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
	p->as_root = cred_is_root();
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
		job_result(j, ret == -EEXIST || ret == -EPERM ? 2 : 1, NULL, NULL, "%s", why);
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
