/* The copy being built on the receiver: the cursor over the offer, the
 * writes through io_uring, the chunks held here already, the journal, and
 * publication (repl_rx.h; the design in repl_recv.c's opening comment). */
#include "daemon/repl/repl_rx.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/codec.h"
#include "common/log.h"
#include "daemon/fs/roots.h"
#include "daemon/fs/treeops.h"
#include "daemon/obs/obs.h"

int rx_fail(struct rx *r, int err, const char *fmt, ...)
{
	va_list ap;

	if (!r->why[0]) {
		va_start(ap, fmt);
		vsnprintf(r->why, sizeof(r->why), fmt, ap);
		va_end(ap);
	}
	return err;
}

/* ---- the cursor over the offer ---- */

int rx_next_entry(struct rx *r)
{
	int rc;

	if (r->have_ce) {
		if (r->ce.type == MF_FILE && r->ce.size)
			r->gbase += r->ce.nchunks ? r->ce.nchunks : 1;
		mf_entry_free(&r->ce);
		r->have_ce = false;
		r->ci++;
	}
	rc = mf_reader_next(r->mr, &r->ce);
	if (rc < 0)
		return rx_fail(r, rc, "the offered manifest: %s", mf_reader_why(r->mr));
	r->have_ce = rc == 1;
	return 0;
}

/* Makes the current entry exist, when it is not a file with data (those
 * come in DATA frames or from local copies). Idempotent, for a resumed
 * transfer. */
static int materialize(struct rx *r)
{
	const struct mf_entry *e = &r->ce;
	const char *base;
	int dfd, rc = 0;

	dfd = treeops_open_parent(r->in_fd, e->path, &base);
	if (dfd < 0)
		return rx_fail(r, dfd, "%s: %s", e->path, strerror(-dfd));
	if (e->type == MF_DIR) {
		if (mkdirat(dfd, base, 0700) < 0 && errno != EEXIST)
			rc = rx_fail(r, -errno, "mkdir %s: %s", e->path, strerror(errno));
	} else if (e->type == MF_LINK) {
		unlinkat(dfd, base, 0);
		if (symlinkat(e->target, dfd, base) < 0)
			rc = rx_fail(r, -errno, "symlink %s: %s", e->path, strerror(errno));
		else if ((rc = treeops_set_meta_at(dfd, base, true, r->chown, r->uid, r->gid, e->mode,
						   e->mtime_ns, &base)) < 0)
			rc = rx_fail(r, rc, "%s: %s", e->path, strerror(-rc));
	} else if (e->size == 0) {
		int fd = openat(dfd, base, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
				0600);

		if (fd < 0) {
			rc = rx_fail(r, -errno, "create %s: %s", e->path, strerror(errno));
		} else {
			rc = treeops_set_meta(fd, r->chown, r->uid, r->gid, PEER_MODE(e->mode), e->mtime_ns,
					      &base);
			if (rc < 0)
				rx_fail(r, rc, "%s: %s", e->path, strerror(-rc));
			close(fd);
		}
	}
	close(dfd);
	return rc;
}

/* ---- the file being written ---- */

static int journal(struct rx *r, uint64_t idx, uint64_t off)
{
	if (r->late)
		return 0;       /* nothing checked before the manifest comes: no resume point */
	fprintf(r->journal, "%llu %llu\n", (unsigned long long)idx, (unsigned long long)off);
	if (fflush(r->journal) != 0)
		return rx_fail(r, -errno, "journal: %s", strerror(errno));
	return 0;
}

/* The current file's bytes are wrong: the journal goes back to its start,
 * so that the next attempt does not resume on top of them. */
static void forget_file(struct rx *r)
{
	journal(r, r->ci, 0);
}

static int open_file(struct rx *r)
{
	const char *base;
	int dfd = treeops_open_parent(r->in_fd, r->ce.path, &base);
	uint64_t keep = r->ci == r->j_idx ? r->j_off : 0;
	int rc;

	if (dfd < 0)
		return rx_fail(r, dfd, "%s: %s", r->ce.path, strerror(-dfd));
	r->fd = openat(dfd, base, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	close(dfd);
	if (r->fd < 0)
		return rx_fail(r, -errno, "create %s: %s", r->ce.path, strerror(errno));
	if (ftruncate(r->fd, (off_t)keep) < 0)
		return rx_fail(r, -errno, "truncate %s: %s", r->ce.path, strerror(errno));
	r->synced = r->asked = keep;
	/* A resumed file: what is already durable is read back and checked
	 * again, so that the whole-file digest covers every byte. */
	rc = cbuild_begin(&r->cb, &r->ce, r->chunk_size, r->fd, keep, true);
	if (rc == -EBADMSG) {   /* the durable part is not what the journal said */
		forget_file(r);
		return rx_fail(r, rc, "%s: the resumed part does not match; starting it over",
			       r->ce.path);
	}
	if (rc < 0)
		return rx_fail(r, rc, "re-reading %s: %s", r->ce.path, strerror(-rc));
	if (r->late)
		cbuild_record(&r->cb, &r->ce);  /* the digests are found, and checked at the end */
	return 0;
}

static int finish_file(struct rx *r)
{
	const char *what;
	int rc = cbuild_end(&r->cb);

	if (rc == -EBADMSG) {
		forget_file(r);
		return rx_fail(r, rc, "%s does not match its digest", r->ce.path);
	}
	if (rc < 0)
		return rx_fail(r, rc, "writing %s: %s", r->ce.path, strerror(-rc));
	rc = treeops_set_meta(r->fd, r->chown, r->uid, r->gid, PEER_MODE(r->ce.mode),
			      r->ce.mtime_ns, &what);
	if (rc == 0 && fdatasync(r->fd) < 0)
		rc = -errno;
	if (rc < 0)
		return rx_fail(r, rc, "%s: %s", r->ce.path, strerror(-rc));
	close(r->fd);
	r->fd = -1;
	if (r->late && (fwrite(&r->ce.digest, sizeof(digest_t), 1, r->sums) != 1 ||
			(r->ce.nchunks && fwrite(r->ce.chunks, sizeof(digest_t), r->ce.nchunks,
						 r->sums) != r->ce.nchunks)))
		return rx_fail(r, -EIO, "%s/.stage/sums: %s", r->slot.key, strerror(errno));
	rc = journal(r, r->ci, r->ce.size);
	return rc < 0 ? rc : rx_next_entry(r);    /* done with it: the cursor moves on */
}

/* Buffer b holds the next n bytes of the current file: checked (-EBADMSG,
 * not yet reported, when a chunk does not match), written, and now and then
 * made durable and journaled, only where a chunk ends, so that the journal
 * never vouches for part of a chunk that was not checked (a file of one
 * chunk is checked at its end only: it is journaled mid-way, and forgotten
 * when it fails). The sync runs on the ring while the next pieces come
 * (wq_sync); the journal line is written once it has completed. */
static int put_piece(struct rx *r, int b, size_t n, const struct cbuild_sums *sums)
{
	struct wq *q = &r->cb.wq;
	int rc = cbuild_put_sums(&r->cb, b, n, sums);

	if (rc == -EPROTO)
		return rx_fail(r, rc, "%s: the pieces of chunk %llu came on more than one stream",
			       r->ce.path, (unsigned long long)r->cb.chunk_no);
	if (rc == -EBADMSG) {
		if (!r->ce.nchunks)
			forget_file(r);
		return rc;
	}
	if (rc == -EFBIG)       /* the callers bound each piece by the size: not reached */
		return rx_fail(r, -EPROTO, "%s: bytes past its size", r->ce.path);
	if (rc < 0)
		return rx_fail(r, rc, "writing %s: %s", r->ce.path, strerror(-rc));
	if (!cbuild_done(&r->cb) && r->cb.at - r->asked >= SYNC_EVERY &&
	    (!r->ce.nchunks || cbuild_checked(&r->cb))) {
		wq_sync(q, r->cb.at);
		r->asked = r->cb.at;
	}
	if (wq_durable(q) > r->synced) {
		r->synced = wq_durable(q);
		return journal(r, r->ci, r->synced);
	}
	return 0;
}

/* ---- chunks held here already ---- */

/* A chunk copied from a local copy was wrong (bit rot there, or the copy
 * changed or went): this offer will not trust local copies again, and the
 * refusal makes the sender try again, this time sending everything. */
static int held_bad(struct rx *r, uint64_t k, const char *why)
{
	int fd = openat(r->st_fd, "nolocal", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);

	if (fd >= 0)
		close(fd);
	if (!r->ce.nchunks)
		forget_file(r);     /* journaled mid-file, unchecked until its end */
	log_warn("%s: %s: chunk %llu held in %s/%s %s; fetching it instead", r->slot.key,
		 r->ce.path, (unsigned long long)k, repl.cfg->replica_root, r->src_path, why);
	return rx_fail(r, -EBADMSG, "%s: chunk %llu of the local copy %s %s; the next attempt "
		    "fetches it", r->ce.path, (unsigned long long)k, r->src_path, why);
}

/* n bytes at off of the held file path into p. */
static int read_held(struct rx *r, const char *path, uint64_t off, uint8_t *p, size_t n)
{
	ssize_t got;

	if (r->src_fd < 0 || r->src_path != path) {
		const char *base;
		int dfd;

		if (r->src_fd >= 0)
			close(r->src_fd);
		r->src_path = path;
		r->src_fd = -1;
		dfd = treeops_open_parent(r->rr_fd, path, &base);
		if (dfd < 0)
			return dfd;
		r->src_fd = openat(dfd, base, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (r->src_fd < 0) {
			int err = -errno;

			close(dfd);
			return err;
		}
		close(dfd);
	}
	got = pread(r->src_fd, p, n, (off_t)off);
	return got == (ssize_t)n ? 0 : got < 0 ? -errno : -ESTALE;
}

/* Bytes [cb.at, upto) of the current file, which the sender left out: from
 * the local copies the plan found, checked like any other bytes. */
static int fill_held(struct rx *r, uint64_t upto)
{
	int rc;

	if (r->fd < 0 && (rc = open_file(r)) < 0)
		return rc;
	while (r->cb.at < upto) {
		uint64_t at = r->cb.at, k = r->ce.nchunks ? at / r->chunk_size : 0;
		uint64_t start = k * r->chunk_size, end = r->ce.size, soff, n;
		const char *path;
		uint8_t *p;
		int b;

		if (r->ce.nchunks && start + r->chunk_size < end)
			end = start + r->chunk_size;
		if (have_source(r->have, r->gbase + k, &path, &soff) < 0)
			return rx_fail(r, -EPROTO, "%s: bytes %llu to %llu were neither sent nor held "
				    "here", r->ce.path, (unsigned long long)at,
				    (unsigned long long)upto);
		n = (upto < end ? upto : end) - at;
		if (n > REPL_PIECE)
			n = REPL_PIECE;
		b = cbuild_buf(&r->cb, &p);
		rc = read_held(r, path, soff + (at - start), p, (size_t)n);
		if (rc < 0)
			return held_bad(r, k, rc == -ESTALE ? "is shorter than its manifest says" :
					strerror(-rc));
		rc = put_piece(r, b, (size_t)n, NULL);
		if (rc == -EBADMSG)
			return held_bad(r, k, "does not match its digest");
		if (rc < 0)
			return rc;
		r->slot.local += n;
	}
	return cbuild_done(&r->cb) ? finish_file(r) : 0;
}

/* Moves the cursor to entry idx (and, with a file there, to byte off of
 * it), making what it passes: entries without data, and the parts of files
 * that were not sent because they are held here. */
int rx_advance_to(struct rx *r, uint64_t idx, uint64_t off)
{
	int rc;

	if (idx < r->ci)
		return rx_fail(r, -EPROTO, "a piece for entry %llu out of order",
			    (unsigned long long)idx);
	while (r->have_ce && r->ci < idx) {
		bool data = r->ce.type == MF_FILE && r->ce.size;
		bool durable = r->ci < r->j_idx || (r->ci == r->j_idx && r->j_off >= r->ce.size);

		if (r->fd >= 0 && durable)      /* opened: it cannot be (on_data checks) */
			return rx_fail(r, -EPROTO, "%s: written past its durable end", r->ce.path);
		if (data && !durable)
			rc = fill_held(r, r->ce.size);      /* moves the cursor */
		else if ((rc = data ? 0 : materialize(r)) == 0)
			rc = rx_next_entry(r);
		if (rc < 0)
			return rc;
	}
	if (r->have_ce && r->ci == idx && r->ce.type == MF_FILE && r->ce.size) {
		if (r->fd < 0 && (rc = open_file(r)) < 0)
			return rc;
		if (off > r->cb.at && off <= r->ce.size)
			return fill_held(r, off);
	}
	return 0;
}

/* The cursor to a piece at byte off of entry idx: 0, or -errno said. */
static int piece_at(struct rx *r, uint64_t idx, uint64_t off)
{
	int rc;

	/* What the journal vouches for is never written again: a piece before
	 * the resume point would truncate a durable file. */
	if (idx < r->j_idx || (idx == r->j_idx && off < r->j_off))
		return rx_fail(r, -EPROTO, "a piece for entry %llu at %llu, before the resume point",
			    (unsigned long long)idx, (unsigned long long)off);
	if ((rc = rx_advance_to(r, idx, off)) < 0)
		return rc;
	if (!r->have_ce || r->ce.type != MF_FILE || r->ce.size == 0)
		return rx_fail(r, -EPROTO, "DATA for entry %llu, which is not a file with data",
			    (unsigned long long)idx);
	if (off != r->cb.at)
		return rx_fail(r, -EPROTO, "%s: piece at %llu, expected %llu", r->ce.path,
			    (unsigned long long)off, (unsigned long long)r->cb.at);
	return 0;
}

int rx_rewind(struct rx *r, uint64_t *idx, uint64_t *off)
{
	int rc;

	*idx = r->ci;
	*off = 0;
	if (r->fd >= 0) {
		/* The lost stream's chunk, part of it taken: every write of it
		 * done, the whole-file digest back at its start. */
		if ((rc = cbuild_rewind(&r->cb)) < 0)
			return rx_fail(r, rc, "writing %s: %s", r->ce.path, strerror(-rc));
		*off = r->cb.at;
		if (*off < r->synced || *off < r->asked || *off < wq_durable(&r->cb.wq) ||
		    (r->ci == r->j_idx && *off < r->j_off)) {
			/* A file of one chunk journaled part-way: the copy
			 * resumes from the journal, as a lost connection. */
			r->lost = true;
			return rx_fail(r, -ECONNRESET, "%s: a stream lost inside a chunk the "
				       "journal vouches for part of", r->ce.path);
		}
	}
	if (*idx < r->j_idx || (*idx == r->j_idx && *off < r->j_off)) {
		*idx = r->j_idx;        /* nothing taken yet: from the resume point */
		*off = r->j_off;
	}
	return 0;
}

/* The piece in buffer b, raw bytes at off of the current file (sums: its
 * chunks as a stream's thread hashed them, or NULL), checked and written. */
static int land(struct rx *r, int b, uint64_t off, size_t raw, const struct cbuild_sums *sums)
{
	int rc;

	rx_turn(r, off + raw, r->ce.size);
	rc = put_piece(r, b, raw, sums);
	if (rc == -EBADMSG)
		return rx_fail(r, rc, "%s: chunk %llu does not match its digest", r->ce.path,
			    (unsigned long long)r->cb.bad_chunk);
	if (rc < 0)
		return rc;
	r->slot.got += raw;
	obs_add(OBS_REPLICA_BYTES, raw);
	return cbuild_done(&r->cb) ? finish_file(r) : 0;
}

static int damaged(struct rx *r, uint64_t off)
{
	return rx_fail(r, -EBADMSG, "%s: the piece at %llu is %s", r->ce.path,
		       (unsigned long long)off, RX_DAMAGED);
}

int rx_on_data(struct rx *r, const struct msg *m)
{
	uint64_t idx, off;
	const uint8_t *p;
	uint8_t *buf;
	size_t n, raw, used;
	int b, rc;

	if (msg_get_u64(m, K_FILE, &idx) < 0 || msg_get_u64(m, K_OFFSET, &off) < 0 ||
	    msg_get_bytes(m, K_DATA, &p, &n) < 0)
		return rx_fail(r, -EBADMSG, RX_NO_FIELDS);
	if ((rc = piece_at(r, idx, off)) < 0)
		return rc;
	b = cbuild_buf(&r->cb, &buf);
	/* The builder checks every byte against the manifest before the
	 * journal vouches for it: the frame's own digest would be one more
	 * pass over the same bytes. */
	rc = codec_chunk_decode_unchecked(p, n, buf, REPL_PIECE, &raw, &used);
	if (rc < 0 || used != n || raw == 0 || off + raw > r->ce.size)
		return damaged(r, off);
	return land(r, b, off, raw, NULL);
}

int rx_on_piece(struct rx *r, struct rx_piece *pc)
{
	uint8_t *buf;
	int b, rc;

	if (pc->bad == RX_PIECE_NO_FIELDS)
		return rx_fail(r, -EBADMSG, RX_NO_FIELDS);
	if ((rc = piece_at(r, pc->idx, pc->off)) < 0)
		return rc;
	if (pc->bad || pc->off + pc->raw > r->ce.size)
		return damaged(r, pc->off);
	/* The piece is written from the stream's buffer; the stream gets the
	 * free one in its place. */
	b = cbuild_buf(&r->cb, &buf);
	pc->buf = wq_trade(&r->cb.wq, b, pc->buf);
	return land(r, b, pc->off, pc->raw, &pc->sums);
}

/* ---- the manifest last (K_LATE) ---- */

int rx_late_slice(struct rx *r, const struct msg *m)
{
	const uint8_t *p;
	size_t n;
	uint64_t off;

	if (msg_get_u64(m, K_OFFSET, &off) < 0 || off != r->final_got ||
	    msg_get_bytes(m, K_DATA, &p, &n) < 0 || n == 0 || off + n > REPL_MF_MAX)
		return rx_fail(r, -EPROTO, "a slice of the manifest out of order");
	if (r->final_fd < 0 &&
	    (r->final_fd = openat(r->st_fd, "final", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC,
				  0644)) < 0)
		return rx_fail(r, -errno, "%s/.stage/final: %s", r->slot.key, strerror(errno));
	if (pwrite(r->final_fd, p, n, (off_t)off) != (ssize_t)n)
		return rx_fail(r, errno ? -errno : -EIO, "%s/.stage/final: %s", r->slot.key,
			       strerror(errno ? errno : EIO));
	r->final_got += n;
	return 0;
}

/* What landed differs from the manifest that came last, at entry e. */
static int late_differs(struct rx *r, const char *path, const char *what)
{
	return rx_fail(r, -EBADMSG, "%s: %s differs from the manifest that came last (the step "
		       "changed while it was sent?)", path, what);
}

/* Entry a of the offer (digests unknown), with the digests that landed for
 * it read from sums, against entry b of the manifest that came last. */
static int late_entry(struct rx *r, const struct mf_entry *a, const struct mf_entry *b)
{
	digest_t d;

	if (a->type != b->type || strcmp(a->path, b->path) != 0)
		return late_differs(r, b->path, "the list of entries");
	if (a->size != b->size || a->mode != b->mode || a->mtime_ns != b->mtime_ns ||
	    a->nchunks != b->nchunks || (a->type == MF_LINK && strcmp(a->target, b->target)))
		return late_differs(r, b->path, "its size, mode, time or target");
	if (a->type != MF_FILE || a->size == 0)
		return digest_eq(a->digest, b->digest) ? 0 : late_differs(r, b->path, "its digest");
	if (fread(&d, sizeof(d), 1, r->sums) != 1)
		return rx_fail(r, -EIO, "%s/.stage/sums: cut short", r->slot.key);
	if (!digest_eq(d, b->digest))
		return late_differs(r, b->path, "its content");
	for (uint64_t k = 0; k < b->nchunks; k++) {
		if (fread(&d, sizeof(d), 1, r->sums) != 1)
			return rx_fail(r, -EIO, "%s/.stage/sums: cut short", r->slot.key);
		if (!digest_eq(d, b->chunks[k]))
			return late_differs(r, b->path, "a chunk's digest");
	}
	return 0;
}

int rx_late_end(struct rx *r, const struct msg *m)
{
	char *hex = NULL, why[512];
	struct mf_reader *ra = NULL, *rb = NULL;
	struct mf_entry a, b;
	digest_t root, named;
	uint64_t size, chunk;
	int rc, na, nb;

	if (msg_get_str(m, K_ROOT, &hex) < 0 || digest_from_hex(hex, strlen(hex), &named) < 0 ||
	    msg_get_u64(m, K_SIZE, &size) < 0) {
		free(hex);
		return rx_fail(r, -EBADMSG, "the end of a copy whose manifest comes last names no "
			       "root or size");
	}
	free(hex);
	if (r->final_fd < 0 || size != r->final_got)
		return rx_fail(r, -EPROTO, "the manifest that came last is %llu bytes, not %llu",
			       (unsigned long long)r->final_got, (unsigned long long)size);
	if (fsync(r->final_fd) < 0)
		return rx_fail(r, -errno, "%s/.stage/final: %s", r->slot.key, strerror(errno));
	rc = ckpt_manifest_root(r->st_fd, "final", &root, &chunk, why, sizeof(why));
	if (rc == -EBADMSG)
		return rx_fail(r, rc, "the manifest of %s/%s that came last does not read: %s",
			       r->job, r->step, why);
	if (rc < 0)
		return rx_fail(r, rc, "reading the manifest that came last: %s", strerror(-rc));
	if (!digest_eq(root, named) || chunk != r->chunk_size)
		return rx_fail(r, -EBADMSG, "the manifest of %s/%s that came last is not the root "
			       "or chunk size named", r->job, r->step);
	if (fflush(r->sums) != 0 || fseeko(r->sums, 0, SEEK_SET) != 0)
		return rx_fail(r, -EIO, "%s/.stage/sums: %s", r->slot.key, strerror(errno));
	if ((rc = mf_reader_open(&ra, r->st_fd, "offer", MF_COMPLETE)) < 0 ||
	    (rc = mf_reader_open(&rb, r->st_fd, "final", MF_COMPLETE)) < 0) {
		if (ra)
			mf_reader_close(ra);
		return rx_fail(r, rc, "comparing the manifests: %s", strerror(-rc));
	}
	for (rc = 0; rc == 0;) {
		na = mf_reader_next(ra, &a);
		nb = mf_reader_next(rb, &b);
		if (na < 0 || nb < 0)
			rc = rx_fail(r, -EBADMSG, "comparing the manifests: %s",
				     mf_reader_why(na < 0 ? ra : rb));
		else if (na != nb)
			rc = late_differs(r, na ? a.path : b.path, "the list of entries");
		else if (na == 0)
			break;
		else
			rc = late_entry(r, &a, &b);
		if (na == 1)
			mf_entry_free(&a);
		if (nb == 1)
			mf_entry_free(&b);
	}
	mf_reader_close(ra);
	mf_reader_close(rb);
	if (rc < 0)
		return rc;
	if (renameat(r->st_fd, "final", r->st_fd, "offer") < 0)
		return rx_fail(r, -errno, "%s/.stage/offer: %s", r->slot.key, strerror(errno));
	r->root = root;
	return 0;
}

/* ---- offer, publication ---- */

/* A listing of the directory fd is open on (through a dup: fd stays open),
 * or NULL. */
static DIR *listing(int fd)
{
	int dup_fd = dup(fd);
	DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;

	if (!d && dup_fd >= 0)
		close(dup_fd);
	return d;
}

static int open_dir(int at, const char *rel, bool create)
{
	char path[4096];
	int fd;

	if (create) {
		snprintf(path, sizeof(path), "%s/%s", repl.cfg->replica_root, rel);
		fd = roots_mkdirs(path, 0755);
		if (fd < 0)
			return fd;
	}
	fd = treeops_open_beneath(at, rel);
	return fd;
}

/* Reads the journal's last whole line into the resume point. */
static void read_journal(struct rx *r)
{
	char line[128];
	unsigned long long a, b;
	FILE *f;
	int fd = openat(r->st_fd, "journal", O_RDONLY | O_CLOEXEC);

	r->j_idx = r->j_off = 0;
	if (fd < 0 || !(f = fdopen(fd, "r"))) {
		if (fd >= 0)
			close(fd);
		return;
	}
	while (fgets(line, sizeof(line), f))
		if (strchr(line, '\n') && sscanf(line, "%llu %llu", &a, &b) == 2) {
			r->j_idx = a;
			r->j_off = b;
		}
	fclose(f);
}

/* Receives the offer's manifest, SIZE bytes in slices, into .stage/offer.new
 * and checks it against the offered root. 0 or -errno (r->why set). */
static int take_manifest(struct rx *r, uint64_t size)
{
	char why[512];
	digest_t root;
	uint64_t got = 0;
	int fd, rc;

	fd = openat(r->st_fd, "offer.new", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return rx_fail(r, -errno, "offer: %s", strerror(errno));
	while (got < size) {
		struct msg m;
		const uint8_t *p;
		size_t n;
		uint64_t off;

		rc = r->x->ops->recv(r->x, &m);
		if (rc < 0) {
			close(fd);
			return rx_fail(r, rc, "receiving the manifest: %s", strerror(-rc));
		}
		if (m.type != MSG_MANIFEST || msg_get_u64(&m, K_OFFSET, &off) < 0 || off != got ||
		    msg_get_bytes(&m, K_DATA, &p, &n) < 0 || n == 0 || got + n > size) {
			msg_free(&m);
			close(fd);
			return rx_fail(r, -EPROTO, "a manifest slice out of order");
		}
		if (write(fd, p, n) != (ssize_t)n) {
			rc = -errno;
			msg_free(&m);
			close(fd);
			return rx_fail(r, rc ? rc : -EIO, "writing the offer: %s", strerror(errno));
		}
		got += n;
		msg_free(&m);
	}
	rc = fsync(fd) < 0 ? -errno : 0;
	close(fd);
	if (rc < 0)
		return rx_fail(r, rc, "offer: %s", strerror(-rc));
	/* The refusal names the line and the rule a peer's manifest broke. */
	rc = ckpt_manifest_root(r->st_fd, "offer.new", &root, &r->chunk_size, why, sizeof(why));
	if (rc == -EBADMSG)
		return rx_fail(r, rc, "the offered manifest of %s/%s does not read: %s",
			       r->job, r->step, why);
	if (rc < 0)     /* ours, not the peer's: memory, I/O */
		return rx_fail(r, rc, "reading the offer: %s", strerror(-rc));
	if (r->late)
		r->root = root; /* no root was offered: the digestless manifest's own */
	else if (!digest_eq(root, r->root))
		return rx_fail(r, -EBADMSG, "the offered manifest of %s/%s is not the offered root",
			       r->job, r->step);
	return 0;
}

/* .stage/NAME opened (created, mode) with flags, as a stream of fmode. */
static int open_stage_file(struct rx *r, const char *name, int flags, mode_t mode,
			   const char *fmode, FILE **out)
{
	int fd = openat(r->st_fd, name, flags | O_CREAT | O_CLOEXEC, mode);

	*out = fd >= 0 ? fdopen(fd, fmode) : NULL;
	if (!*out) {
		if (fd >= 0)
			close(fd);
		return rx_fail(r, -EIO, "%s: %s", name, strerror(errno));
	}
	return 0;
}

/* Takes the manifest slices into .stage/offer (keeping .incoming when it
 * holds the same offer) and checks it against the offered root. */
int rx_take_offer(struct rx *r, uint64_t size)
{
	char rel[4 * (CKPT_NAME_MAX + 1)];
	digest_t old;
	int rc;

	snprintf(rel, sizeof(rel), INCOMING "/%s/%s/%s", r->origin, r->job, r->step);
	r->in_fd = open_dir(r->rr_fd, rel, true);
	if (r->in_fd < 0)
		return rx_fail(r, r->in_fd, "%s/%s: %s", repl.cfg->replica_root, rel,
			    strerror(-r->in_fd));
	if (mkdirat(r->in_fd, MF_DIRNAME, 0755) < 0 && errno != EEXIST)
		return rx_fail(r, -errno, "%s/%s/.stage: %s", repl.cfg->replica_root, rel,
			    strerror(errno));
	r->st_fd = openat(r->in_fd, MF_DIRNAME, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (r->st_fd < 0)
		return rx_fail(r, -errno, "%s/%s/.stage: %s", repl.cfg->replica_root, rel,
			    strerror(errno));
	rc = take_manifest(r, size);
	if (rc < 0) {
		/* Nothing of a refused or cut-off manifest stays (up to 256 MiB
		 * a time): what .incoming held before is kept as it was. */
		unlinkat(r->st_fd, "offer.new", 0);
		return rc;
	}
	/* Same offer as the one in .incoming: keep what is there. A copy
	 * whose manifest comes last starts afresh, and keeps no journal. */
	if (!r->late && ckpt_manifest_root(r->st_fd, "offer", &old, NULL, NULL, 0) == 0 &&
	    digest_eq(old, r->root)) {
		read_journal(r);
	} else {
		DIR *d = listing(r->in_fd);
		struct dirent *de;

		while (d && (de = readdir(d)))
			if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
			    strcmp(de->d_name, MF_DIRNAME))
				treeops_remove(r->in_fd, de->d_name, de->d_type == DT_DIR);
		if (d)
			closedir(d);
		unlinkat(r->st_fd, "journal", 0);
		unlinkat(r->st_fd, "nolocal", 0);
		unlinkat(r->st_fd, "sums", 0);
		unlinkat(r->st_fd, "final", 0);
		r->j_idx = r->j_off = 0;
	}
	if (renameat(r->st_fd, "offer.new", r->st_fd, "offer") < 0) {
		rc = rx_fail(r, -errno, "offer: %s", strerror(errno));
		unlinkat(r->st_fd, "offer.new", 0);
		return rc;
	}
	/* The journal; with the manifest last, none but the digests found. */
	if (r->late)
		return open_stage_file(r, "sums", O_RDWR | O_TRUNC, 0600, "w+", &r->sums);
	return open_stage_file(r, "journal", O_WRONLY | O_APPEND, 0644, "a",
			       &r->journal);
}

static void retain(int job_fd)
{
	ckpt_name_t *v;
	size_t n;

	if (ckpt_steps(job_fd, ckpt_has_manifest, NULL, &v, &n) < 0)
		return;
	for (size_t i = 0; i + (size_t)repl.cfg->keep < n; i++) {     /* oldest first */
		log_info("keep = %d: removing the replica %s", repl.cfg->keep, v[i]);
		treeops_remove(job_fd, v[i], true);
	}
	free(v);
}

struct rx_slot *rx_slot_find(const char *key)
{
	struct rx_slot *s = repl.rx;

	while (s && strcmp(s->key, key) != 0)
		s = s->next;
	return s;
}

#define DROPPING ".drop."       /* an .incoming step being removed (not a step name) */

/* A newer step of ORIGIN/JOB is published: what .incoming still holds of
 * older steps of the job that nobody is receiving is, almost always, a copy
 * its origin gave up (the step changed while sent, or retention dropped its
 * record mid-copy): it would never be finished nor removed, so it goes.
 * (An origin that still means to send it, having committed it again after
 * the newer one, sends it from its start.) Each is renamed aside under
 * repl.lock, where an offer of it would register, so that an offer that
 * comes meanwhile starts a fresh directory; then removed. What a crash left
 * aside is removed too. */
static void drop_older_incoming(struct rx *r, int inc_fd)
{
	char *names[256], aside[CKPT_NAME_MAX + sizeof(DROPPING)];
	char key[sizeof(r->slot.key)];
	size_t n = 0;
	DIR *d = listing(inc_fd);
	struct dirent *de;
	const char *w;

	while (d && (de = readdir(d)) && n < 256)
		if ((config_check_name(de->d_name, &w) == 0 &&
		     ckpt_step_cmp(de->d_name, r->step) < 0) ||
		    strncmp(de->d_name, DROPPING, strlen(DROPPING)) == 0)
			names[n++] = strdup(de->d_name);
	if (d)
		closedir(d);
	for (size_t i = 0; i < n; i++) {
		bool gone = false;

		if (!names[i])
			continue;
		if (strncmp(names[i], DROPPING, strlen(DROPPING)) == 0) {
			treeops_remove(inc_fd, names[i], true);
			free(names[i]);
			continue;
		}
		snprintf(aside, sizeof(aside), DROPPING "%s", names[i]);
		snprintf(key, sizeof(key), "%s/%s/%s", r->origin, r->job, names[i]);
		pthread_mutex_lock(&repl.lock);
		if (!rx_slot_find(key))
			gone = treeops_rename_noreplace(inc_fd, names[i], inc_fd, aside) == 0;
		pthread_mutex_unlock(&repl.lock);
		if (gone) {
			log_info("%s/%s/%s/%s/%s: removing a copy its origin gave up (%s is newer)",
				 repl.cfg->replica_root, INCOMING, r->origin, r->job, names[i],
				 r->step);
			treeops_remove(inc_fd, aside, true);
		}
		free(names[i]);
	}
}

/* Directory metadata (now that nothing more is created in them), then
 * everything durable, the manifest, and the rename into place. */
int rx_publish(struct rx *r)
{
	char rel[3 * (CKPT_NAME_MAX + 1)], irel[4 * (CKPT_NAME_MAX + 1)];
	struct mf_reader *mr;
	struct mf_entry e;
	int job_fd, inc_fd, rc;

	rc = mf_reader_open(&mr, r->st_fd, "offer", MF_COMPLETE);
	while (rc >= 0 && (rc = mf_reader_next(mr, &e)) == 1) {
		const char *what;

		/* Directories stay the daemon's: one of the owner's, reached
		 * by path here, could be swapped for a link under root's feet
		 * (the owner may have a shell on this node). */
		if (e.type == MF_DIR && (rc = treeops_set_meta_at(r->in_fd, e.path, false, false,
								   0, 0, PEER_MODE(e.mode), e.mtime_ns,
								   &what)) < 0)
			rx_fail(r, rc, "%s: %s", e.path, strerror(-rc));
		mf_entry_free(&e);
	}
	if (rc >= 0)
		mf_reader_close(mr);
	if (rc < 0)
		return rx_fail(r, rc, "finishing the directories: %s", strerror(-rc));
	/* The manifest is the owner's like the files (it says whose the
	 * copy is); .stage and the step's directory stay the daemon's. */
	if (r->chown && fchownat(r->st_fd, "offer", r->uid, r->gid, AT_SYMLINK_NOFOLLOW) < 0)
		return rx_fail(r, -errno, "giving the copy to uid %u: %s", (unsigned)r->uid,
			       strerror(errno));
	if (syncfs(r->in_fd) < 0)
		return rx_fail(r, -errno, "syncfs: %s", strerror(errno));
	if (renameat(r->st_fd, "offer", r->st_fd, "manifest") < 0 || fsync(r->st_fd) < 0)
		return rx_fail(r, -errno, "manifest: %s", strerror(errno));
	unlinkat(r->st_fd, "journal", 0);
	unlinkat(r->st_fd, "nolocal", 0);
	unlinkat(r->st_fd, "sums", 0);
	unlinkat(r->st_fd, "final", 0);
	snprintf(rel, sizeof(rel), "%s/%s", r->origin, r->job);
	snprintf(irel, sizeof(irel), INCOMING "/%s/%s", r->origin, r->job);
	job_fd = open_dir(r->rr_fd, rel, true);
	if (job_fd < 0)
		return rx_fail(r, job_fd, "%s/%s: %s", repl.cfg->replica_root, rel, strerror(-job_fd));
	inc_fd = open_dir(r->rr_fd, irel, false);
	if (inc_fd < 0) {
		close(job_fd);
		return rx_fail(r, inc_fd, "%s/%s: %s", repl.cfg->replica_root, irel,
			    strerror(-inc_fd));
	}
	rc = treeops_rename_noreplace(inc_fd, r->step, job_fd, r->step);
	if (rc == -EEXIST) {
		/* An older copy of the step: swap, then the old one goes. */
		rc = treeops_rename_exchange(inc_fd, r->step, job_fd, r->step);
		if (rc == 0)
			treeops_remove(inc_fd, r->step, true);
	}
	if (rc < 0)
		rc = rx_fail(r, rc, "publishing %s/%s: %s", rel, r->step, strerror(-rc));
	if (rc == 0) {
		fsync(job_fd);
		retain(job_fd);
		drop_older_incoming(r, inc_fd);
	}
	close(inc_fd);
	close(job_fd);
	return rc;
}

/* The offer just stored in .incoming is not needed: the copy is there. */
void rx_drop_incoming(struct rx *r)
{
	char rel[3 * (CKPT_NAME_MAX + 1) + 16];
	int fd;

	snprintf(rel, sizeof(rel), INCOMING "/%s/%s", r->origin, r->job);
	fd = open_dir(r->rr_fd, rel, false);
	if (fd >= 0) {
		treeops_remove(fd, r->step, true);
		close(fd);
	}
}
