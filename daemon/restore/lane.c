/* A restore's lanes (restore_impl.h says what a lane is): each takes files
 * from the restore's queue and patches or rebuilds them through its own
 * chunk-checked builder, from its own list of sources, falling back along
 * it when one fails; the first failure of any lane stops them all.
 */
#include "daemon/restore/restore_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/codec.h"
#include "common/log.h"
#include "daemon/survey/hold.h"
#include "daemon/engine/uio.h"
#include "daemon/fs/treeops.h"
#include "daemon/obs/obs.h"
#include "daemon/repl/repl.h"

/* A holder's name for a person. */
const char *restore_said(const char *holder)
{
	return strcmp(holder, HOLD_DURABLE) == 0 ? "the durable tier" : holder;
}

/* The source failed (a chunk that does not match, a holder's disk that
 * cannot be read, a connection lost): the rest comes from the lane's next
 * one, the other holders of the same commit and then the durable tier,
 * starting again at the chunk the failure was in. 0 to go on with it, or
 * the failure's rc with every source's reason in why. */
int rlane_fall_back(struct rlane *l, const struct mf_entry *e, int rc)
{
	if (rc == -ECANCELED)
		return rc;
	if (e && cbuild_rewind(&l->cb) < 0)
		return rc;      /* the local writes failed: no source helps */
	while ((size_t)(l->src - l->srcs) + 1 < l->nsrcs) {
		struct rsrc *alt = l->src + 1;
		char first[sizeof(l->why)];
		int orc;

		snprintf(first, sizeof(first), "%s", l->why);   /* alt->why is l->why */
		l->src = alt;
		orc = alt->ops->open(alt);
		alt->opened = orc == 0;
		if (orc < 0) {
			char next[sizeof(l->why)];

			snprintf(next, sizeof(next), "%s", l->why);
			snprintf(l->why, sizeof(l->why), "%.4000s; and %s cannot be read: %.4000s",
				 first, restore_said(alt->name), next);
			continue;
		}
		job_note(l->r->j, LOG_WARN, NULL, NULL, "%s: taking the rest of %s from %s%s", first,
			 l->r->path, strcmp(alt->name, HOLD_DURABLE) == 0 ? "" : "the copy on ",
			 restore_said(alt->name));
		*l->why = '\0';
		return 0;
	}
	return rc;
}

/* Opens the lane's first source that opens. 0, or -errno with every
 * source's reason in why. */
int rlane_open(struct rlane *l)
{
	int rc = l->src->ops->open(l->src);

	l->src->opened = rc == 0;
	return rc < 0 ? rlane_fall_back(l, NULL, rc) : 0;
}

/* Fetches chunks [first, last) of e in one run into the file being built,
 * each chunk checked as its last byte arrives; from the next source if one
 * fails part-way. */
static int fetch_run(struct rlane *l, const struct mf_entry *e, uint64_t chunk_size,
		     uint64_t first, uint64_t last)
{
	uint64_t end = last * chunk_size;
	int rc;

	if (end > e->size || !e->nchunks)
		end = e->size;
	do {
		uint64_t before = l->src->bytes;

		rc = l->src->ops->fetch(l->src, &l->cb, e, l->cb.at, end);
		l->bytes_fetched += l->src->bytes - before;
		obs_add(OBS_RESTORE_BYTES, l->src->bytes - before);
	} while (rc < 0 && rlane_fall_back(l, e, rc) == 0);
	if (rc == 0)
		l->chunks_fetched += last - first;
	return rc;
}

/* Whether [off, off+len) of the local file still hashes to want. */
static bool local_intact(struct rlane *l, int lfd, uint64_t off, uint64_t len, digest_t want)
{
	XXH3_state_t *st = XXH3_createState();
	bool ok = st != NULL;

	if (ok)
		XXH3_128bits_reset(st);
	for (uint64_t o = off; ok && o < off + len;) {
		size_t n = off + len - o < PSEND_PIECE ? (size_t)(off + len - o) : PSEND_PIECE;

		ok = uio_pread(&l->ring, lfd, l->buf, n, o) == (ssize_t)n;
		if (ok)
			XXH3_128bits_update(st, l->buf, n);
		o += n;
	}
	ok = ok && digest_eq(XXH3_128bits_digest(st), want);
	XXH3_freeState(st);
	return ok;
}

/* Copies an intact local range into the file being built: checked again
 * as it is copied, so a chunk that changed since it was judged is caught. */
static int keep_range(struct rlane *l, int lfd, uint64_t len)
{
	for (uint64_t o = l->cb.at, end = l->cb.at + len; o < end;) {
		size_t n = end - o < WQ_BUF ? (size_t)(end - o) : WQ_BUF;
		uint8_t *p;
		int b = cbuild_buf(&l->cb, &p), rc;

		if (uio_pread(&l->ring, lfd, p, n, o) != (ssize_t)n)
			return -EIO;
		rc = cbuild_put(&l->cb, b, n);
		if (rc < 0)
			return rc;
		o += n;
	}
	return 0;
}

/* An entry of another type than the manifest's stands where it belongs (a
 * directory where a file was): it is moved aside to .stage/displaced.N, not
 * deleted, since what is in it was never compared with anything. */
static int displace(struct restore *r, int parent, const char *base, const char *rel,
		    char *why, size_t whylen)
{
	char name[64];

	snprintf(name, sizeof(name), "displaced.%llu",
		 (unsigned long long)atomic_fetch_add(&r->displaced, 1));
	if (renameat(parent, base, r->stage_fd, name) < 0) {
		int err = errno;

		snprintf(why, whylen, "%s/%s is in the way and cannot be moved aside: %s", r->path,
			 rel, strerror(err));
		return -err;
	}
	job_note(r->j, LOG_WARN, "displaced", rel, "%s/%s was not what the manifest says it is: "
		 "moved to %s/%s/%s", r->path, rel, r->path, MF_DIRNAME, name);
	return 0;
}

/* What stands at parent/base, unless it is of the type wanted (S_IF*):
 * moved aside. 0 or -errno with why. */
int restore_clear_way(struct restore *r, int parent, const char *base, const char *rel,
		     mode_t want, char *why, size_t whylen)
{
	struct stat st;

	if (fstatat(parent, base, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
	    (st.st_mode & S_IFMT) == want)
		return 0;
	return displace(r, parent, base, rel, why, whylen);
}

/* The end of a file built by l->cb, whatever rc the building ended with:
 * every write done (a padded last block cut back), even after a failure
 * (the file is closed or unlinked next); then, if all went well, the
 * whole-file check, fdatasync, and the manifest's mode and mtime (without
 * set-id bits: those are not restored from another node's word; a repair
 * in place moved the mtime). */
static int finish_built(struct rlane *l, const struct mf_entry *e, int fd, int rc)
{
	const char *what;
	int wrc = cbuild_end(&l->cb);

	if (rc == 0 && wrc == -EBADMSG)
		snprintf(l->why, sizeof(l->why), "%s: the rebuilt file does not match its digest",
			 e->path);
	else if (rc == 0 && wrc < 0)
		snprintf(l->why, sizeof(l->why), "writing %s: %s", e->path, strerror(-wrc));
	if (rc == 0)
		rc = wrc;
	if (rc == 0 && fdatasync(fd) < 0) {
		rc = -errno;
		snprintf(l->why, sizeof(l->why), "%s: fdatasync: %s", e->path, strerror(errno));
	}
	if (rc == 0 && (rc = treeops_set_meta(fd, false, 0, 0, PEER_MODE(e->mode), e->mtime_ns,
					      &what)) < 0)
		snprintf(l->why, sizeof(l->why), "%s: %s: %s", e->path, what, strerror(-rc));
	return rc;
}

/* Rebuilds file e at parent/base (see the top of the file). */
static int rebuild(struct rlane *l, const struct mf_entry *e, uint64_t chunk_size,
		   int parent, const char *base)
{
	struct restore *r = l->r;
	uint64_t n = e->nchunks ? e->nchunks : 1;
	char tmp[64];
	struct stat st;
	uint64_t intact_next = UINT64_MAX;     /* a chunk found intact while looking ahead */
	int lfd, fd, rc = 0;

	snprintf(tmp, sizeof(tmp), "rebuild.%u.%llu", l->id, (unsigned long long)l->tmp_seq++);
	/* O_NONBLOCK only so that a fifo in its place cannot hang the open;
	 * io_uring reads of a non-blocking file may return -EAGAIN. */
	lfd = openat(parent, base, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	if (lfd >= 0 && (fstat(lfd, &st) < 0 || !S_ISREG(st.st_mode) ||
			 fcntl(lfd, F_SETFL, 0) < 0)) {
		close(lfd);
		lfd = -1;
	}
	fd = openat(r->tmp_fd, tmp, O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		rc = -errno;
		snprintf(l->why, sizeof(l->why), "%s/%s/%s: %s", r->path, MF_DIRNAME, TMP_DIR,
			 strerror(errno));
		goto out_local;
	}
	cbuild_begin(&l->cb, e, chunk_size, fd, 0, true);
	for (uint64_t i = 0; i < n && rc == 0 && e->size;) {
		uint64_t off = i * chunk_size, k;
		uint64_t len = e->size - off < chunk_size ? e->size - off : chunk_size;
		digest_t want = e->nchunks ? e->chunks[i] : e->digest;

		/* An intact local chunk is read twice (judged, then copied, the
		 * second time from the page cache): a chunk may be far larger than
		 * the piece buffer, and nothing is written that turns out bad. */
		if (intact_next == i || (lfd >= 0 && (uint64_t)st.st_size >= off + len &&
					 local_intact(l, lfd, off, len, want))) {
			rc = keep_range(l, lfd, len);
			if (rc == -EBADMSG)
				snprintf(l->why, sizeof(l->why), "%s: chunk %llu changed while it "
					 "was copied", e->path, (unsigned long long)i);
			else if (rc < 0)
				snprintf(l->why, sizeof(l->why), "copying %s: %s", e->path,
					 strerror(-rc));
			l->chunks_kept++;
			i++;
			continue;
		}
		/* The run of chunks to fetch: up to the next intact local one. */
		for (k = i + 1; k < n; k++) {
			uint64_t ko = k * chunk_size;
			uint64_t kl = e->size - ko < chunk_size ? e->size - ko : chunk_size;

			if (lfd >= 0 && (uint64_t)st.st_size >= ko + kl &&
			    local_intact(l, lfd, ko, kl, e->chunks[k])) {
				intact_next = k;
				break;
			}
		}
		rc = fetch_run(l, e, chunk_size, i, k);
		i = k;
	}
	rc = finish_built(l, e, fd, rc);
	if (rc == 0)
		rc = restore_clear_way(r, parent, base, e->path, S_IFREG, l->why, sizeof(l->why));
	if (rc == 0) {
		if (renameat(r->tmp_fd, tmp, parent, base) < 0) {
			rc = -errno;
			snprintf(l->why, sizeof(l->why), "renaming into %s: %s", e->path,
				 strerror(errno));
		}
	}
	if (rc < 0)
		unlinkat(r->tmp_fd, tmp, 0);
	close(fd);
out_local:
	if (lfd >= 0)
		close(lfd);
	return rc;
}

/* Repairs file e in place: only the chunks the verify found wrong (b) are
 * fetched and written, each checked against the manifest before its last
 * piece is written; the others are neither read nor written again. A crash
 * part-way leaves each of those chunks wrong or right and every other chunk
 * as it was, under a step still marked as being restored. -EAGAIN: it is
 * no longer a regular file of the manifest's size (it is rebuilt then). */
static int patch(struct rlane *l, const struct mf_entry *e, uint64_t chunk_size,
		 int parent, const char *base, const struct bad *b)
{
	struct stat st;
	int fd, rc = 0;

	fd = openat(parent, base, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return -EAGAIN;
	/* Another name of the same inode would change with it: rebuilt instead.
	 * So is a file the list does not fit (chunks past its last). */
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != e->size ||
	    st.st_nlink != 1 || b->chunks[b->nchunks - 1] >= e->nchunks ||
	    fcntl(fd, F_SETFL, 0) < 0) {
		close(fd);
		return -EAGAIN;
	}
	cbuild_begin(&l->cb, e, chunk_size, fd, 0, true);
	for (uint64_t i = 0, k; i < b->nchunks && rc == 0; i = k) {
		/* A run of consecutive bad chunks: one request. */
		for (k = i + 1; k < b->nchunks && b->chunks[k] == b->chunks[k - 1] + 1; k++)
			;
		rc = cbuild_skip_to(&l->cb, b->chunks[i]);
		if (rc < 0)     /* the list is ascending and checked above: not reached */
			snprintf(l->why, sizeof(l->why), "%s: chunk %llu out of order",
				 e->path, (unsigned long long)b->chunks[i]);
		else
			rc = fetch_run(l, e, chunk_size, b->chunks[i], b->chunks[k - 1] + 1);
	}
	rc = finish_built(l, e, fd, rc);
	if (rc == 0) {
		l->chunks_kept += e->nchunks - b->nchunks;
		l->files_patched++;
		obs_add(OBS_RESTORE_FILES, 1);
	}
	close(fd);
	return rc;
}

/* A file of the manifest, on a lane: patched in place when the verify named
 * its bad chunks and it still fits, otherwise rebuilt. */
static int repair_file(struct rlane *l, const struct mf_entry *e, uint64_t chunk_size,
		       const struct bad *b)
{
	const char *base;
	int parent, rc;

	parent = treeops_open_parent(l->r->step_fd, e->path, &base);
	if (parent < 0) {
		snprintf(l->why, sizeof(l->why), "%s: its directory: %s", e->path,
			 strerror(-parent));
		return parent;
	}
	rc = b->damaged && b->nchunks && e->nchunks ?
	     patch(l, e, chunk_size, parent, base, b) : -EAGAIN;
	if (rc == -EAGAIN) {
		rc = rebuild(l, e, chunk_size, parent, base);
		if (rc == 0) {
			l->files_fixed++;
			obs_add(OBS_RESTORE_FILES, 1);
		}
	}
	close(parent);
	return rc;
}

/* The first failure wins: its rc and reason are the restore's; every lane
 * stops after the file it is on. Under r->mu. */
void restore_fail_locked(struct restore *r, int rc, const char *why)
{
	if (!r->err) {
		r->err = rc;
		if (why != r->why)
			snprintf(r->why, sizeof(r->why), "%s", why);
	}
	atomic_store(&r->stop, true);
	pthread_cond_broadcast(&r->cv);
}

void *rlane_main(void *arg)
{
	struct rlane *l = arg;
	struct restore *r = l->r;
	int rc;

	pthread_setname_np(pthread_self(), "restore lane");
	rc = l->src->opened ? 0 : rlane_open(l);

	/* A lane that reaches no source leaves the work to the others; lane 0
	 * is open already (the manifest came through it). */
	if (rc < 0)
		LOG(LOG_WARN, "restore of %s: lane %u: %s", r->path, l->id, l->why);
	pthread_mutex_lock(&r->mu);
	while (rc == 0) {
		struct rwork w;

		while (!r->qlen && !r->qclosed && !atomic_load(&r->stop))
			pthread_cond_wait(&r->cv, &r->mu);
		if (!r->qlen || atomic_load(&r->stop))
			break;
		w = r->q[r->qhead];
		r->qhead = (r->qhead + 1) % RLANES_MAX;
		r->qlen--;
		pthread_cond_broadcast(&r->cv);
		pthread_mutex_unlock(&r->mu);
		*l->why = '\0';
		rc = repair_file(l, &w.e, w.chunk_size, w.b);
		if (rc == 0)
			job_note(r->j, LOG_INFO, "restored", w.e.path, "restored %s/%s", r->path,
				 w.e.path);
		atomic_fetch_add(&r->j->files_done, 1);
		pthread_mutex_lock(&r->mu);
		if (rc < 0)
			restore_fail_locked(r, rc, *l->why ? l->why : strerror(-rc));
		mf_entry_free(&w.e);
	}
	r->running--;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	codec_thread_end();
	return NULL;
}

void rlane_src_init(struct rlane *l, struct rsrc *s, const char *holder)
{
	struct restore *r = l->r;

	*s = (struct rsrc){ .ops = strcmp(holder, HOLD_DURABLE) == 0 ? &rsrc_durable_ops :
				   &rsrc_peer_ops, .name = holder, .job = r->job, .step = r->step,
			    .root = r->root, .ring = &l->ring, .why = l->why,
			    .whylen = sizeof(l->why), .label = r->dlabel, .stepfd = -1 };
}

/* Lane l's sources: lane 0's holders rotated by l's number, so that the
 * lanes start on different holders when there are several, and then the
 * durable tier, last for every lane. */
void rlane_sources(struct rlane *l, const struct rlane *first)
{
	size_t from = (size_t)(first->src - first->srcs), nh = from;

	/* Those before lane 0's own could not be opened: not tried again. */
	while (nh < first->nsrcs && strcmp(first->srcs[nh].name, HOLD_DURABLE) != 0)
		nh++;
	l->nsrcs = 0;
	for (size_t k = 0; k < nh - from; k++)
		rlane_src_init(l, &l->srcs[l->nsrcs++],
			       first->srcs[from + (k + l->id) % (nh - from)].name);
	for (size_t k = nh; k < first->nsrcs; k++)
		rlane_src_init(l, &l->srcs[l->nsrcs++], first->srcs[k].name);
	l->src = &l->srcs[0];
}

int rlane_setup(struct restore *r, struct rlane *l, unsigned id)
{
	int rc;

	*l = (struct rlane){ .r = r, .id = id };
	l->buf = malloc(PSEND_PIECE);
	if (!l->buf)
		return -ENOMEM;
	rc = uio_init(&l->ring);
	if (rc == 0 && (rc = cbuild_open(&l->cb)) < 0)
		io_uring_queue_exit(&l->ring);
	if (rc < 0) {
		free(l->buf);
		l->buf = NULL;
		return rc;
	}
	l->ready = true;
	return 0;
}

void rlane_teardown(struct rlane *l)
{
	for (size_t i = 0; i < l->nsrcs; i++)
		if (l->srcs[i].opened)
			l->srcs[i].ops->close(&l->srcs[i]);
	if (l->ready) {
		cbuild_close(&l->cb);
		io_uring_queue_exit(&l->ring);
	}
	free(l->buf);
	l->buf = NULL;
	l->ready = false;
}
