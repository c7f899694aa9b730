/* A copy sent as its step is hashed: the manifest last (docs/PROTOCOL.md,
 * "The manifest last"). A step just committed is read by the committer's
 * lanes, to hash it, and by one partner's sender, to send it, at the same
 * time and through the page cache, so the disk reads it once and the copy
 * does not wait for the hash: the offer carries a manifest without digests
 * (the skeleton: every entry as the walk found it, digests 0), the pieces
 * follow at once, and the manifest the lanes wrote goes after them. The
 * receiver hashes what lands and compares it with that manifest before it
 * publishes.
 *
 * Which copy goes so (repl_late_ok, under repl.lock): a step being hashed, its
 * copy to this partner pending, no other partner's copy of it gone so
 * before (one reading beside the lanes is the point; the others are sent
 * from the cache once the manifest is there). With [transfer] read_once =
 * auto, also only where dedup would save little: the held chunks are found
 * by their digests, which come last, so such a copy sends every byte. The
 * newest copy of the job to this partner that went manifest first, after
 * an older step of the job was there, must have found less than an eighth
 * of its bytes held, and at most LATE_RUN copies may have gone manifest last
 * since, so that a job whose steps start to share chunks is noticed.
 *
 * A late copy that cannot finish as one (the hash failed or began again,
 * took longer than half the peer timeout, a file changed, the step does not
 * fit the cache) gives way: the connection is dropped, the receiver drops
 * what it took, and the copy goes again the usual way, from the manifest,
 * without costing a try. One the receiver refuses costs a try, as any.
 */
#include "daemon/repl/repl_tx.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/manifest.h"
#include "daemon/engine/pcache.h"
#include "daemon/fs/cred.h"
#include "daemon/fs/walk.h"

#define LATE_RUN 7      /* copies manifest last between two that measure the dedup */

bool repl_late_ok(size_t i, const struct record *r)
{
	const struct record *first = NULL;
	unsigned lates = 0;

	if (repl.cfg->read_once == CFG_READ_ONCE_OFF || repl.partners[i].no_late ||
	    r->state != R_HASHING || r->hash_no == 0 || r->rehash || r->late_tried ||
	    r->copies[i].state != C_PENDING)
		return false;
	/* The hash reads through the page cache only so (ckpt.c): else the
	 * disk would give the step twice. */
	if (repl.cfg->cache_reads == CFG_CACHE_READS_WARM)
		return false;
	if (repl.cfg->read_once == CFG_READ_ONCE_ON)
		return true;
	for (const struct record *t = repl.records; t; t = t->next) {
		const struct rcopy *c = &t->copies[i];

		if (t == r || t->seq > r->seq || strcmp(t->job, r->job) != 0 ||
		    c->state != C_CONFIRMED)
			continue;
		if (c->how == HOW_LATE) {
			lates++;
		} else if (c->how == HOW_FIRST && c->follows) {
			first = t;
			lates = 0;
		}
	}
	return first && lates < LATE_RUN && first->copies[i].held < first->bytes / 8;
}

/* One entry of the walk into the skeleton: what the manifest will say but
 * the digests of files with data. 0 or -errno (why). */
static int skeleton_entry(struct mf_writer *w, const struct walk_ent *we, uint64_t chunk,
			  uint64_t *bytes, char *why, size_t whylen)
{
	struct mf_entry e = { .type = we->type, .path = (char *)we->rel,
			      .mode = we->st.st_mode & 07777, .mtime_ns = we->mtime_ns };
	char target[MF_MAX_PATH + 1];
	ssize_t tn;
	int rc;

	if (we->type == MF_LINK) {
		tn = readlinkat(we->src_dirfd, we->name, target, sizeof(target) - 1);
		if (tn <= 0) {
			snprintf(why, whylen, "cannot read link %s: %s", we->rel, strerror(errno));
			return -ESTALE;
		}
		target[tn] = '\0';
		e.target = target;
		e.size = (uint64_t)tn;
		e.digest = digest_of(target, (size_t)tn);
	} else if (we->type == MF_FILE) {
		e.size = (uint64_t)we->st.st_size;
		e.digest = e.size ? (digest_t){ 0 } : digest_of("", 0);
		e.nchunks = mf_nchunks(e.size, chunk);
		if (e.nchunks && !(e.chunks = calloc(e.nchunks, sizeof(digest_t)))) {
			snprintf(why, whylen, "out of memory");
			return -ENOMEM;
		}
		*bytes += e.size;
	} else if (we->type != MF_DIR) {
		snprintf(why, whylen, "%s: not a file, directory or symlink", we->rel);
		return -ESTALE;
	}
	rc = mf_writer_add(w, &e);
	free(e.chunks);
	if (rc < 0)
		snprintf(why, whylen, "the manifest without digests, at %s: %s", we->rel,
			 strerror(-rc));
	return rc;
}

int tx_skeleton(const char *job, int step_fd, const char *name, struct skeleton *k, char *why,
		size_t whylen)
{
	struct mf_writer *w = NULL;
	struct walk *wk = NULL;
	struct walk_ent we;
	struct cred *owner = NULL;
	struct stat st;
	uint64_t avail;
	bool entered = false;
	int sd, rc;

	k->fd = -1;
	k->bytes = 0;
	sd = open(repl.cfg->state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (sd < 0) {
		snprintf(why, whylen, "state_dir %s: %s", repl.cfg->state_dir, strerror(errno));
		return -EAGAIN;
	}
	rc = mf_writer_open(&w, sd, name, repl.cfg->chunk_size);
	/* The step is walked as its owner, as the committer reads it: what
	 * the owner may not read is not sent in the owner's name. That owner
	 * is also the manifest's (the committer writes it so). */
	if (rc == 0 && (rc = repl_enter_job_owner(job, &owner, why, whylen)) == 0) {
		entered = true;
		k->uid = owner ? owner->uid : geteuid();
		k->gid = owner ? owner->gid : getegid();
	}
	if (rc == 0)
		rc = walk_open(&wk, step_fd, -1, 0);
	while (rc == 0 && (rc = walk_next(wk, &we)) == 1)
		rc = skeleton_entry(w, &we, repl.cfg->chunk_size, &k->bytes, why, whylen);
	if (rc < 0 && !why[0])
		snprintf(why, whylen, "listing the step: %s", wk ? walk_why(wk) : strerror(-rc));
	if (wk)
		walk_close(wk);
	if (entered) {
		cred_leave();
		free(owner);
	}
	if (rc == 0) {
		rc = mf_writer_finish(w, &k->root);
		w = NULL;
		if (rc < 0)
			snprintf(why, whylen, "the manifest without digests: %s", strerror(-rc));
	}
	if (w)
		mf_writer_abort(w);
	if (rc == 0) {
		k->fd = openat(sd, name, O_RDONLY | O_CLOEXEC);
		if (k->fd < 0 || fstat(k->fd, &st) < 0) {
			snprintf(why, whylen, "the manifest without digests: %s", strerror(errno));
			rc = -EIO;
		} else {
			k->size = (uint64_t)st.st_size;
		}
	}
	unlinkat(sd, name, 0);
	close(sd);
	/* Read once only where the lanes read through the cache too, and the
	 * step fits the share of memory they may fill (ckpt.c). */
	avail = pcache_available() / 4;
	if (rc == 0 && repl.cfg->cache_reads != CFG_CACHE_READS_ALWAYS &&
	    (repl.cfg->cache_reads != CFG_CACHE_READS_AUTO || k->bytes > avail)) {
		snprintf(why, whylen, "%llu bytes, more than the page cache would keep for the hash "
			 "and the send to share (%llu)", (unsigned long long)k->bytes,
			 (unsigned long long)avail);
		rc = -EAGAIN;
	}
	if (rc < 0 && k->fd >= 0) {
		close(k->fd);
		k->fd = -1;
	}
	return rc < 0 ? -EAGAIN : 0;
}

int tx_late_wait(const char *job, const char *step, uint64_t seq, unsigned hash_no,
		 digest_t *root, char *why, size_t whylen)
{
	uint64_t deadline = mono_ns() + (uint64_t)peers_io_ms() * 1000000ull / 2;
	int rc = -EAGAIN;

	pthread_mutex_lock(&repl.lock);
	for (;;) {
		const struct record *r = repl_rec_find(job, step);

		if (!r || r->seq != seq || r->hash_no != hash_no || r->rehash ||
		    r->state == R_FAILED) {
			snprintf(why, whylen, "its hash failed or began again");
			break;
		}
		if (r->state == R_READY) {
			*root = r->root;
			rc = 0;
			break;
		}
		if (repl.stopping) {
			snprintf(why, whylen, "the daemon is stopping");
			rc = -ECANCELED;
			break;
		}
		if (repl_wait_until(deadline) == ETIMEDOUT) {
			snprintf(why, whylen, "its hash took longer than half the peer timeout");
			break;
		}
	}
	pthread_mutex_unlock(&repl.lock);
	return rc;
}
