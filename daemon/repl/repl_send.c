/* The sender of one partner: takes the oldest copy pending for it (those a
 * newer step overtook skipped, repl_impl.h), offers
 * the checkpoint, and streams what the receiver wants, piece by piece.
 *
 * Per copy:  OFFER, MANIFEST...  ->  <- WANT (resume point, or "have it",
 *                                             and the chunks held there)
 *            DATA(file, offset, chunk frame)...  END  ->  <- DONE
 *
 * Chunks the receiver says it holds (K_HELD, repl_have.h) are left out: the
 * pieces of a file go as runs of the chunks it lacks.
 *
 * The connection stays open between copies. When it breaks, the copy goes
 * back to PENDING and the sender reconnects with backoff; the receiver's
 * WANT then says where to resume. A further stream lost mid-copy is handed
 * on instead (repl_handoff.c): the receiver's MSG_RESTREAM says from where.
 * A receiver that refuses (MSG_ERROR) costs the copy a try; after
 * REPL_MAX_TRIES it is FAILED.
 *
 * Pieces go through the piece sender (daemon/engine/psend.h), which reads
 * ahead on the sender's own io_uring, so the disk, the codec and the socket
 * overlap. compress = auto compresses or not
 * by window of pieces, whichever is measured to deliver more (zpolicy.h).
 */
#include "daemon/repl/repl_tx.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/codec.h"
#include "common/log.h"
#include "common/manifest.h"
#include "daemon/net/peer.h"
#include "daemon/repl/repl_have.h"
#include "daemon/fs/cred.h"
#include "daemon/fs/treeops.h"
#include "daemon/repl/zpolicy.h"
#include "daemon/engine/psend.h"
#include "daemon/obs/obs.h"

#define BACKOFF_MIN_MS 200
#define BACKOFF_MAX_MS 5000
static uint64_t queued(struct xport *x)
{
	return x->ops->queued ? x->ops->queued(x) : 0;
}

static void set_sent(struct sender *s, const char *job, const char *step, uint64_t seq,
		     uint64_t sent, uint64_t total)
{
	struct record *r;

	pthread_mutex_lock(&repl.lock);
	r = repl_rec_find(job, step);
	if (r && r->seq == seq) {
		size_t i = (size_t)(s->p - repl.partners);

		r->copies[i].sent = sent;
		r->copies[i].total = total;
	}
	pthread_mutex_unlock(&repl.lock);
}

/* The receiver took the offer (WANT): from now on it may hold part of the
 * copy, which is therefore never skipped (repl_impl.h), a restart
 * included. */
static void mark_begun(struct sender *s, const char *job, const char *step, uint64_t seq)
{
	struct record *r;
	size_t i = (size_t)(s->p - repl.partners);

	pthread_mutex_lock(&repl.lock);
	r = repl_rec_find(job, step);
	if (r && r->seq == seq && r->copies[i].state == C_SENDING && !r->copies[i].begun) {
		r->copies[i].begun = true;
		repl_rec_save(r);
	}
	pthread_mutex_unlock(&repl.lock);
}

static int expect(struct xport *x, struct msg *m, uint16_t type, char *why, size_t whylen)
{
	int rc = tx_answer(x, m, why, whylen);

	if (rc == 0 && m->type != type) {
		snprintf(why, whylen, "unexpected frame type %u", m->type);
		msg_free(m);
		return -EBADMSG;
	}
	return rc;
}

/* A send failed. A receiver that refuses while pieces stream (a full disk,
 * a damaged piece) sends MSG_ERROR and closes, which this end sees as a
 * broken pipe: its last words, when there are any, tell a refusal (which
 * costs the copy a try) from a lost connection (which costs nothing). */
static int send_failed(struct sender *s, int rc, char *why, size_t whylen)
{
	struct msg m;

	if (s->x->ops->recv_last && s->x->ops->recv_last(s->x, &m, 1000) == 0) {
		if (m.type == MSG_ERROR) {
			char t[PEER_TEXT_MAX + 1];

			peer_error_of(&m, t);
			snprintf(why, whylen, "refused: %s", t);
			msg_free(&m);
			return -EREMOTEIO;
		}
		msg_free(&m);
	}
	snprintf(why, whylen, "sending: %s", strerror(-rc));
	return rc;
}

/* What the sender adds to each piece (psend_hooks). */
struct piece_ctx {
	struct sender *s;
	struct out *o;
};

static const struct codec_ops *piece_pick(void *arg)
{
	struct piece_ctx *c = arg;

	if (c->o->yielded) {
		/* The window that spans the pause measures the trainer's
		 * save, not the path. */
		zp_gap(&c->s->z);
		c->o->yielded = false;
	}
	return zp_pick(&c->s->z, mono_ns(), queued(c->s->x));
}

static void piece_hold(void *arg)
{
	struct piece_ctx *c = arg;

	if (repl_yield(c->o->job, &c->o->yield_ms))
		c->o->yielded = true;
}

static void piece_before(void *arg)
{
	struct piece_ctx *c = arg;

	if (c->o->gap) {
		/* The receiver copies the held bytes before it reads this
		 * piece: the send may wait that long, and the window that
		 * spans it measures the receiver's disk, not the path. */
		c->s->x->ops->set_timeout(c->s->x, held_ms(c->o->gap, peers_io_ms()));
		zp_gap(&c->s->z);
	}
}

static void piece_after(void *arg, int rc)
{
	struct piece_ctx *c = arg;

	if (c->o->gap) {
		c->s->x->ops->set_timeout(c->s->x, peers_io_ms());
		c->o->gap = 0;
	}
}

static void piece_sent(void *arg, uint64_t at, size_t len, size_t flen, unsigned codec)
{
	struct piece_ctx *c = arg;
	struct sender *s = c->s;
	struct out *o = c->o;

	zp_sent(&s->z, len, flen, mono_ns(), queued(s->x));
	o->sent += len;
	o->raw += len;
	pthread_mutex_lock(&repl.lock);
	s->p->raw += len;
	s->p->wire += flen;
	s->p->codec = codec_by_id(codec) ? codec_by_id(codec)->name : "?";
	pthread_mutex_unlock(&repl.lock);
	set_sent(s, o->job, o->step, o->seq, o->sent, o->total);
}

/* Between pieces: whether the receiver has said something (only a copy
 * that may hand a stream's turns on listens: before, the receiver said
 * nothing until DONE but a refusal, which the failed send finds). */
static int piece_check(void *arg)
{
	struct piece_ctx *c = arg;
	struct sender *s = c->s;

	if (!c->o->handoff)
		return 0;
	if (c->o->ctl_rc) {
		/* Read already: the range is stopping. A send still stuck a
		 * peer timeout later is on a dead connection too. */
		if (mono_ns() - c->o->ctl_ns > (uint64_t)peers_io_ms() * 1000000ull)
			psend_shut_sending(&s->ps);
		return c->o->ctl_rc;
	}
	if (!s->x->ops->ready || !s->x->ops->ready(s->x))
		return 0;
	return tx_take_answer(s, c->o, NULL);
}

/* Sends bytes [off, end) of an open file, piece by piece. */
static int send_range(struct sender *s, struct out *o, int fd, uint64_t idx,
		      const struct mf_entry *e, uint64_t off, uint64_t end,
		      struct codec_params *cp, char *why, size_t whylen)
{
	struct piece_ctx c = { .s = s, .o = o };
	const struct psend_hooks h = { .pick = piece_pick, .hold = piece_hold, .before = piece_before,
				       .after = piece_after, .sent = piece_sent,
				       .check = piece_check, .arg = &c };
	int rc = psend_range(&s->ps, s->x, fd, e->size, idx, off, end, cp, &h, e->path, why,
			     whylen);

	if (rc < 0 && !*why && o->ctl_rc) {
		snprintf(why, whylen, "%s", o->ctl_why);   /* what the receiver said, read */
		rc = o->ctl_rc;
	} else if (rc < 0 && !*why && o->handoff && psend_failed_stream(&s->ps) > 0) {
		snprintf(why, whylen, "stream %u: %s", o->xid[psend_failed_stream(&s->ps)],
			 strerror(-rc));        /* its turns go to the others: send_copy */
	} else if (rc < 0 && !*why) {
		rc = send_failed(s, rc, why, whylen);
	}
	return rc;
}

/* Where chunk k of e ends. */
static uint64_t chunk_end(const struct out *o, const struct mf_entry *e, uint64_t k)
{
	return e->nchunks && (k + 1) * o->chunk < e->size ? (k + 1) * o->chunk : e->size;
}

/* Sends file idx (whose first chunk has number g) from byte off: the runs
 * of chunks the receiver does not hold. */
static int send_file(struct sender *s, struct out *o, uint64_t idx, const struct mf_entry *e,
		     uint64_t g, uint64_t off, char *why, size_t whylen)
{
	const char *base;
	int dir_fd, fd = -1, rc = 0;
	struct stat st;
	struct codec_params cp = { .dtype = CODEC_DT_COUNT, .no_sum = o->no_sum };

	while (rc == 0 && off < e->size) {
		uint64_t k = e->nchunks ? off / o->chunk : 0, end = chunk_end(o, e, k);

		if (have_bit(o->bits, o->nbits, g + k)) {
			if (g + k >= o->held_g) {
				o->held += end - off;
				o->held_g = g + k + 1;
			}
			o->sent += end - off;
			o->gap += end - off;
			off = end;
			continue;
		}
		while (end < e->size && !have_bit(o->bits, o->nbits, g + end / o->chunk))
			end = chunk_end(o, e, end / o->chunk);
		if (fd < 0) {
			dir_fd = treeops_open_parent(o->step_fd, e->path, &base);
			if (dir_fd < 0) {
				snprintf(why, whylen, "%s: %s", e->path, strerror(-dir_fd));
				return -ESTALE;
			}
			fd = openat(dir_fd, base, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
			close(dir_fd);
			if (fd < 0 || fstat(fd, &st) < 0 || (uint64_t)st.st_size != e->size) {
				snprintf(why, whylen, "%s changed or vanished since it was committed",
					 e->path);
				if (fd >= 0)
					close(fd);
				return -ESTALE;
			}
		}
		rc = send_range(s, o, fd, idx, e, off, end, &cp, why, whylen);
		off = end;
	}
	if (fd >= 0)
		close(fd);
	set_sent(s, o->job, o->step, o->seq, o->sent, o->total);
	return rc;
}

/* The manifest (mf_fd, size bytes) in MSG_MANIFEST slices: 0, or -errno
 * with why (-ESTALE: it could not be read). */
static int send_slices(struct sender *s, const char *job, const char *step, int mf_fd,
		       uint64_t mf_size, char *why, size_t whylen)
{
	uint8_t *slice = malloc(REPL_MF_SLICE);
	struct msg m;
	int rc = 0;

	for (uint64_t at = 0; rc == 0 && at < mf_size; ) {
		ssize_t n = slice ? pread(mf_fd, slice, REPL_MF_SLICE, (off_t)at) : -1;

		if (n <= 0) {
			snprintf(why, whylen, "reading the manifest of %s/%s: %s", job, step,
				 n < 0 ? strerror(errno) : "it shrank");
			rc = -ESTALE;
			break;
		}
		msg_init(&m, MSG_MANIFEST);
		msg_put_u64(&m, K_OFFSET, at);
		rc = s->x->ops->send_tail(s->x, &m, K_DATA, slice, (size_t)n);
		msg_free(&m);
		at += (uint64_t)n;
	}
	free(slice);
	if (rc < 0 && rc != -ESTALE)
		snprintf(why, whylen, "sending the manifest: %s", strerror(-rc));
	return rc;
}

/* MSG_OFFER and the manifest (mf_fd, size bytes) in MSG_MANIFEST slices;
 * with late, the skeleton's (docs/PROTOCOL.md, "The manifest last"). 0, or
 * -errno with why (-ESTALE: the manifest could not be read). */
static int send_offer(struct sender *s, const char *job, const char *step, digest_t root,
		      int mf_fd, uint64_t mf_size, unsigned streams, const struct skeleton *late,
		      char *why, size_t whylen)
{
	char hex[DIGEST_HEX_LEN + 1];
	struct stat st;
	struct msg m;
	int rc;

	digest_to_hex(root, hex);
	msg_init(&m, MSG_OFFER);
	msg_put_str(&m, K_ORIGIN, repl.cfg->name);
	msg_put_str(&m, K_JOB, job);
	msg_put_str(&m, K_STEP, step);
	if (late)
		msg_put_u64(&m, K_LATE, 1);     /* no root: the receiver takes the skeleton's */
	else
		msg_put_str(&m, K_ROOT, hex);
	msg_put_u64(&m, K_SIZE, mf_size);
	if (streams > 1)
		msg_put_u64(&m, K_STREAMS, streams);
	/* A lost stream's turns may go on: only where stream 0 can be
	 * listened to between pieces (not RDMA's, yet), and not in a copy
	 * whose manifest comes last (it fails and goes again the usual way). */
	if (streams > 1 && s->x->ops->ready && !late)
		msg_put_u64(&m, K_RESTREAM, 1);
	/* The owner goes with the copy: the cluster shares one uid space. */
	if (late) {
		msg_put_u64(&m, K_UID, late->uid);
		msg_put_u64(&m, K_GID, late->gid);
	} else if (fstat(mf_fd, &st) == 0) {
		msg_put_u64(&m, K_UID, st.st_uid);
		msg_put_u64(&m, K_GID, st.st_gid);
	}
	rc = s->x->ops->send(s->x, &m);
	msg_free(&m);
	if (rc < 0) {
		snprintf(why, whylen, "sending the offer: %s", strerror(-rc));
		return rc;
	}
	return send_slices(s, job, step, mf_fd, mf_size, why, whylen);
}

/* Every file of the manifest from the receiver's resume point on (the
 * entries before it are counted as sent). 0, or -errno with why. */
static int send_files(struct sender *s, struct out *o, int step_fd, int mf_fd,
		      uint64_t want_idx, uint64_t want_off, char *why, size_t whylen)
{
	struct mf_reader *mr = NULL;
	uint64_t idx = 0, g = 0;
	struct mf_entry e;
	int fd = dup(mf_fd), rc;
	FILE *fp = fd >= 0 ? fdopen(fd, "r") : NULL;

	/* The manifest offered, read from its start (a dup shares the
	 * offset: pread elsewhere keeps it). */
	if (!fp || fseeko(fp, 0, SEEK_SET) != 0 ||
	    (rc = mf_reader_open_fp(&mr, fp, MF_NAME, MF_COMPLETE)) < 0) {
		snprintf(why, whylen, "the manifest of %s/%s: %s", o->job, o->step,
			 strerror(errno ? errno : ENOMEM));
		if (fp)
			fclose(fp);
		else if (fd >= 0)
			close(fd);
		return -ESTALE;
	}
	o->step_fd = step_fd;
	while ((rc = mf_reader_next(mr, &e)) == 1) {
		o->chunk = mf_reader_chunk_size(mr);
		psend_streams_group(&s->ps, o->chunk);   /* a chunk's pieces on one stream */
		if (idx >= want_idx && e.type == MF_FILE && e.size > 0) {
			uint64_t off = idx == want_idx ? want_off : 0;

			o->sent += off < e.size ? off : e.size;  /* durable there already */
			rc = send_file(s, o, idx, &e, g, off, why, whylen);
		} else if (e.type == MF_FILE) {
			o->sent += e.size;
		}
		if (e.type == MF_FILE && e.size > 0)
			g += e.nchunks ? e.nchunks : 1;
		mf_entry_free(&e);
		idx++;
		if (rc < 0)
			break;
		if (repl.stopping) {
			rc = -ECANCELED;
			snprintf(why, whylen, "the daemon is stopping");
			break;
		}
	}
	if (rc < 0 && rc != -ECANCELED && why[0] == '\0')
		snprintf(why, whylen, "the manifest of %s/%s: %s", o->job, o->step,
			 mf_reader_why(mr));
	mf_reader_close(mr);
	fclose(fp);
	return rc;
}

/* MSG_END, and the receiver's MSG_DONE once the copy is durable and
 * published there. 0, or -errno with why. */
static int finish(struct sender *s, struct out *o, char *why, size_t whylen)
{
	uint64_t code;
	struct msg m;
	int rc;

	zp_pause(&s->z, mono_ns(), queued(s->x));
	msg_init(&m, MSG_END);
	if (o->late) {          /* the manifest that went last, named */
		char hex[DIGEST_HEX_LEN + 1];

		digest_to_hex(o->late_root, hex);
		msg_put_str(&m, K_ROOT, hex);
		msg_put_u64(&m, K_SIZE, o->late_size);
	}
	rc = s->x->ops->send(s->x, &m);
	msg_free(&m);
	if (rc < 0)
		return send_failed(s, rc, why, whylen);
	s->x->ops->set_timeout(s->x, held_ms(o->gap, REPL_FINISH_MS));
	/* A stream lost after its last pieces went (not all may have come):
	 * the receiver says so instead of DONE. */
	if (!o->handoff)
		rc = expect(s->x, &m, MSG_DONE, why, whylen);
	else if ((rc = tx_take_answer(s, o, &m)) < 0)
		snprintf(why, whylen, "%s", o->ctl_why);
	s->x->ops->set_timeout(s->x, peers_io_ms());
	if (rc == 0) {
		code = 1;
		msg_get_u64(&m, K_CODE, &code);
		msg_get_u64(&m, K_PAUSED, &o->r_paused);
		if (code != 0) {
			char text[PEER_TEXT_MAX + 1];

			peer_error_of(&m, text);
			snprintf(why, whylen, "refused: %s", text);
			rc = -EREMOTEIO;
		}
		msg_free(&m);
	}
	if (rc == 0) {
		log_info("%s/%s to %s: %llu bytes sent, %llu held there already", o->job, o->step,
			 s->h->name, (unsigned long long)o->raw, (unsigned long long)o->held);
		pthread_mutex_lock(&repl.lock);
		s->p->held += o->held;
		pthread_mutex_unlock(&repl.lock);
		s->held = o->held;
	}
	return rc;
}

/* A copy sent as it was hashed: once the hash has ended, the manifest it
 * wrote goes after the pieces (before MSG_END, which names it). 0; -EAGAIN
 * (why) when the copy is to go the usual way; or the connection's -errno. */
static int send_last_manifest(struct sender *s, struct out *o, int step_fd, unsigned hash_no,
			      char *why, size_t whylen)
{
	struct stat st;
	int fd, rc;

	rc = tx_late_wait(o->job, o->step, o->seq, hash_no, &o->late_root, why, whylen);
	if (rc < 0)
		return rc;
	fd = openat(step_fd, MF_NAME, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		snprintf(why, whylen, "its manifest: %s", fd < 0 ? strerror(errno) :
			 "not a regular file");
		if (fd >= 0)
			close(fd);
		return -EAGAIN;
	}
	if (st.st_uid != o->late_uid || st.st_gid != o->late_gid) {
		snprintf(why, whylen, "its manifest is uid %u gid %u, not the %u:%u offered",
			 (unsigned)st.st_uid, (unsigned)st.st_gid, (unsigned)o->late_uid,
			 (unsigned)o->late_gid);
		close(fd);
		return -EAGAIN;
	}
	o->late_size = (uint64_t)st.st_size;
	rc = send_slices(s, o->job, o->step, fd, o->late_size, why, whylen);
	close(fd);
	return rc == -ESTALE ? -EAGAIN : rc;
}

/* The connections this copy goes on: s->x and up to [transfer] streams - 1
 * more (or as many as adapting chose), kept open from copy to copy; those
 * past a count that went down are closed. One that cannot be dialled
 * costs the copy nothing: it goes on fewer (status says so). */
static unsigned open_streams(struct sender *s)
{
	unsigned want = repl_streams_wanted(s->p, repl.cfg);
	bool fewer;

	if (s->nx == 0) {
		s->xs[0] = s->x;
		s->nx = 1;
	}
	if (s->nx > want) {
		unsigned had = s->nx;

		pthread_mutex_lock(&repl.lock);
		s->nx = s->p->nx = want;
		pthread_mutex_unlock(&repl.lock);
		for (unsigned j = want; j < had; j++) {
			s->xs[j]->ops->close(s->xs[j]);
			s->xs[j] = NULL;
		}
	}
	while (s->nx < want && !repl.stopping) {
		struct xport *x;
		char why[512];

		if (peers_dial(s->p->host, PEERS_HANDSHAKE_MS, peers_io_ms(), &x, why,
			       sizeof(why)) < 0) {
			log_warn("peer %s: another stream: %s; sending on %u", s->h->name, why,
				 s->nx);
			break;
		}
		pthread_mutex_lock(&repl.lock);
		s->xs[s->nx++] = x;
		s->p->xs[0] = s->x;
		s->p->xs[s->nx - 1] = x;
		s->p->nx = s->nx;
		if (repl.stopping)
			x->ops->shutdown(x);
		pthread_mutex_unlock(&repl.lock);
	}
	pthread_mutex_lock(&repl.lock);
	s->p->streams = s->nx;          /* at most want: those past it were closed */
	s->p->wanted = want;
	fewer = !repl.cfg->streams && sadapt_opened(&s->p->sa, s->p->streams);
	if (fewer)
		s->p->wanted = s->p->sa.n;      /* adapting says why */
	pthread_mutex_unlock(&repl.lock);
	if (fewer)
		log_info("peer %s: adapting holds %u stream%s: only so many could be opened",
			 s->h->name, s->nx, s->nx == 1 ? "" : "s");
	return s->nx;
}

/* Tells each further stream which offer its pieces are for, and starts
 * their threads. The receiver gives no answer: a refusal ends the stream's
 * connection, which the pieces then fail on. */
static int attach_streams(struct sender *s, const char *job, const char *step, digest_t root,
			  unsigned n, uint64_t total, char *why, size_t whylen)
{
	char hex[DIGEST_HEX_LEN + 1];
	int rc = 0;

	digest_to_hex(root, hex);
	for (unsigned j = 1; rc == 0 && j < n; j++) {
		struct msg m;

		msg_init(&m, MSG_STREAM);
		msg_put_str(&m, K_JOB, job);
		msg_put_str(&m, K_STEP, step);
		msg_put_str(&m, K_ROOT, hex);
		msg_put_u64(&m, K_INDEX, j);
		/* The receiver may stop reading a stream while it copies held
		 * chunks for another: as long as for the whole step. */
		s->xs[j]->ops->set_timeout(s->xs[j], held_ms(total, peers_io_ms()));
		rc = s->xs[j]->ops->send(s->xs[j], &m);
		msg_free(&m);
		if (rc < 0)
			snprintf(why, whylen, "stream %u: %s", j, strerror(-rc));
	}
	/* Half the job's buffers for the pieces read ahead (the rest is the
	 * hash's and the manifest's). */
	if (rc == 0 && (rc = psend_streams_begin(&s->ps, s->xs, n, repl.cfg->memory / 2)) < 0)
		snprintf(why, whylen, "cannot start the streams: %s", strerror(-rc));
	return rc;
}

/* What a copy's pieces moved, for the next copy's stream count ([transfer]
 * streams = 0): the raw bytes the receiver has (those still in the
 * sockets' buffers at the end are not moved yet) over the time from the
 * first piece to the last. A copy whose time was not the streams' is left
 * out: one that handed a stream on, stood aside for a trainer on either
 * side, or had the receiver copy held chunks for more than a quarter of what
 * was sent. */
static void adapt_streams(struct sender *s, const struct out *o, unsigned n, uint64_t ns,
			  uint64_t inflight, bool paused)
{
	char d[512];
	unsigned next;
	bool decided;

	if (repl.cfg->streams || o->epoch || paused || o->held > o->raw / 4 || inflight >= o->raw)
		return;
	pthread_mutex_lock(&repl.lock);
	decided = sadapt_measured(&s->p->sa, n, o->raw - inflight, ns);
	next = s->p->sa.n;
	if (decided)
		sadapt_describe(&s->p->sa, d, sizeof(d));
	pthread_mutex_unlock(&repl.lock);
	if (decided)
		log_info("peer %s: the next copy on %u stream%s: %s", s->h->name, next,
			 next == 1 ? "" : "s", d);
}

/* One copy: 0 confirmed; -EREMOTEIO refused (why); -ESTALE the checkpoint
 * changed (why); other -errno: the connection failed (why). With late (a
 * step being hashed, as hash_no; root and total unknown yet) it goes as it
 * is hashed, its manifest last (repl_late.c), or gives way: -EAGAIN (why). */
static int send_copy(struct sender *s, const char *job, const char *step, uint64_t seq,
		     digest_t root, uint64_t total, bool late, unsigned hash_no, char *why,
		     size_t whylen)
{
	struct skeleton k = { .fd = -1 };
	struct cred *as = NULL;         /* late: the owner the files are opened as */
	char name[64];
	unsigned n;
	char rel[2 * CKPT_NAME_MAX + 2];
	struct msg m;
	uint64_t code = 0, want_idx = 0, want_off = 0, frame_sum = 1, restream = 0;
	int root_fd, step_fd, mf_fd, rc;
	struct stat st;
	uint8_t *bits = NULL;
	const uint8_t *hb;
	size_t hn;
	struct out o = { .job = job, .step = step, .seq = seq, .total = total,
			 .yield_ms = repl_yield_budget() };
	uint64_t t0 = 0, t1 = 0, inflight = 0, yield0 = o.yield_ms;

	snprintf(rel, sizeof(rel), "%s/%s", job, step);
	root_fd = open(repl.cfg->ckpt_root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	step_fd = root_fd < 0 ? -errno : treeops_open_beneath(root_fd, rel);
	if (root_fd >= 0)
		close(root_fd);
	if (step_fd < 0) {
		snprintf(why, whylen, "%s/%s: %s", repl.cfg->ckpt_root, rel, strerror(-step_fd));
		return -ESTALE;
	}
	s->held = 0;
	s->offered = false;
	if (late) {
		snprintf(name, sizeof(name), ".late.%zu", (size_t)(s->p - repl.partners));
		if ((rc = tx_skeleton(job, step_fd, name, &k, why, whylen)) < 0) {
			close(step_fd);
			return rc;
		}
		mf_fd = k.fd;
		root = k.root;
		o.late_uid = k.uid;
		o.late_gid = k.gid;
		o.total = total = k.bytes;
		st.st_size = (off_t)k.size;
	} else {
		/* The step is a user's: a fifo in the manifest's place must not
		 * hold this thread (O_NONBLOCK), nor anything but a file be read. */
		mf_fd = openat(step_fd, MF_NAME, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
		rc = mf_fd < 0 || fstat(mf_fd, &st) < 0 ? -errno :
		     !S_ISREG(st.st_mode) ? -EINVAL : 0;
		if (rc < 0) {
			snprintf(why, whylen, "%s/%s/%s: %s", repl.cfg->ckpt_root, rel, MF_NAME,
				 rc == -EINVAL ? "not a regular file" : strerror(-rc));
			rc = -ESTALE;
			goto out_close_mf;
		}
	}
	o.late = late;
	s->ps.cached = late;    /* the lanes read it through the cache meanwhile */
	n = open_streams(s);
	rc = send_offer(s, job, step, root, mf_fd, (uint64_t)st.st_size, n, late ? &k : NULL,
			why, whylen);
	if (rc < 0)
		goto out_close_mf;
	s->offered = true;
	s->x->ops->set_timeout(s->x, REPL_FINISH_MS);
	rc = expect(s->x, &m, MSG_WANT, why, whylen);
	if (rc == -EREMOTEIO && late && strstr(why, "a malformed offer")) {
		/* An older receiver (no K_ROOT is a malformed offer to it):
		 * the manifest first to it from now on. */
		pthread_mutex_lock(&repl.lock);
		s->p->no_late = true;
		pthread_mutex_unlock(&repl.lock);
		log_warn("peer %s: refused a copy whose manifest comes last (%s); sending it the "
			 "manifest first from now on", s->h->name, why);
		rc = -EAGAIN;
	}
	if (rc < 0)
		goto out_close_mf;
	msg_get_u64(&m, K_CODE, &code);
	msg_get_u64(&m, K_FILE, &want_idx);
	msg_get_u64(&m, K_OFFSET, &want_off);
	msg_get_u64(&m, K_FRAME_SUM, &frame_sum);
	msg_get_u64(&m, K_RESTREAM, &restream);
	o.no_sum = frame_sum == 0;
	o.handoff = n > 1 && restream == 1;
	o.n = n;
	for (unsigned j = 0; j < n; j++)
		o.xid[j] = j;
	if (msg_get_bytes(&m, K_HELD, &hb, &hn) == 0 && hn && (bits = malloc(hn))) {
		memcpy(bits, hb, hn);
		o.bits = bits;
		o.nbits = hn;
	}
	msg_free(&m);
	s->x->ops->set_timeout(s->x, peers_io_ms());
	if (code == 1) {
		rc = 0;         /* it already holds this very checkpoint */
		s->held = total;
		goto out_close_mf;
	}
	if (!late)      /* nothing of a late copy is ever resumed: it may still be skipped */
		mark_begun(s, job, step, seq);
	if (n > 1 && (rc = attach_streams(s, job, step, root, n, total, why, whylen)) < 0)
		goto out_close_mf;
	t0 = mono_ns();
	/* A late copy's files are opened as their owner, as the committer's. */
	rc = late ? repl_enter_job_owner(job, &as, why, whylen) : 0;
	if (rc == 0)
		rc = send_files(s, &o, step_fd, mf_fd, want_idx, want_off, why, whylen);
	else
		rc = -EAGAIN;
	if (late) {
		cred_leave();
		free(as);
	}
	for (;;) {
		unsigned failed = 0;    /* a further stream's send failed */

		if (o.n > 1) {
			int erc;

			failed = rc < 0 ? psend_failed_stream(&s->ps) : 0;
			erc = psend_streams_end(&s->ps, rc == 0);
			/* A further stream's MSG_END failed: every piece had gone,
			 * and the receiver says DONE, or which stream to hand on. */
			if (rc == 0 && erc < 0 && !(o.handoff && psend_failed_stream(&s->ps)))
				rc = send_failed(s, erc, why, whylen);
		}
		if (rc == 0 && !t1) {
			t1 = mono_ns();         /* every piece handed to a socket */
			for (unsigned j = 0; j < o.n; j++)
				inflight += queued(s->xs[j]);
		}
		if (rc == 0 && late)
			rc = send_last_manifest(s, &o, step_fd, hash_no, why, whylen);
		if (rc == -ESTALE && late)
			rc = -EAGAIN;   /* a file changed: the hash will say, and the usual way */
		if (rc == 0)
			rc = finish(s, &o, why, whylen);
		/* A refusal read mid-copy is no hand-off, whatever failed after. */
		if (rc == 0 || !o.handoff || repl.stopping ||
		    !(rc == -ERESTART || (failed && o.ctl_rc == 0)))
			break;
		why[0] = '\0';
		if ((rc = tx_hand_off(s, &o, failed, why, whylen)) < 0)
			break;
		if (o.n > 1 && (rc = psend_streams_begin(&s->ps, s->xs, o.n,
							 repl.cfg->memory / 2)) < 0) {
			snprintf(why, whylen, "cannot start the streams: %s", strerror(-rc));
			break;
		}
		o.sent = o.gap = 0;
		rc = send_files(s, &o, step_fd, mf_fd, o.r_idx, o.r_off, why, whylen);
	}
	if (rc == 0)
		adapt_streams(s, &o, n, t1 - t0, inflight, o.yield_ms != yield0 || o.r_paused);
out_close_mf:
	free(bits);
	if (mf_fd >= 0)
		close(mf_fd);
	close(step_fd);
	return rc;
}

static void disconnect(struct sender *s)
{
	if (!s->x)
		return;
	zp_drop(&s->z);         /* a window cut by a failure measures nothing */
	pthread_mutex_lock(&repl.lock);
	s->p->x = NULL;
	s->p->nx = 0;
	s->p->streams = s->p->wanted = 0;   /* the next copy says again */
	pthread_mutex_unlock(&repl.lock);
	for (unsigned j = 1; j < s->nx; j++)
		s->xs[j]->ops->close(s->xs[j]);
	s->nx = 0;
	s->x->ops->close(s->x);
	s->x = NULL;
}

/* Connects and authenticates, or records why not and sleeps the backoff
 * (waking early when the daemon stops). */
static int connect_peer(struct sender *s)
{
	char why[512];
	struct xport *x;
	int rc;

	rc = peers_dial(s->p->host, PEERS_HANDSHAKE_MS, peers_io_ms(), &x, why, sizeof(why));
	pthread_mutex_lock(&repl.lock);
	if (rc == 0) {
		s->x = x;
		s->p->x = x;
		if (s->p->state != PEER_UP)
			log_info("peer %s: up (%s, %s)", s->h->name, x->ops->name, x->peer);
		s->p->state = PEER_UP;
		s->backoff_ms = 0;
		if (repl.stopping)
			x->ops->shutdown(x);
	} else {
		uint64_t d;

		if (s->p->state != PEER_DOWN || strcmp(s->p->why, why) != 0)
			log_warn("peer %s: %s", s->h->name, why);
		s->p->state = PEER_DOWN;
		snprintf(s->p->why, sizeof(s->p->why), "%s", why);
		s->backoff_ms = s->backoff_ms ? s->backoff_ms * 2 : BACKOFF_MIN_MS;
		if (s->backoff_ms > BACKOFF_MAX_MS)
			s->backoff_ms = BACKOFF_MAX_MS;
		s->p->retry_at_ns = mono_ns() + (uint64_t)s->backoff_ms * 1000000ull;
		d = s->p->retry_at_ns;
		while (!repl.stopping && repl_wait_until(d) != ETIMEDOUT)
			;
	}
	pthread_mutex_unlock(&repl.lock);
	return rc;
}

/* After a refusal (a full disk, a damaged piece) or a connection lost
 * mid-copy, a pause before the next try: 0.2 s << tries, at most 6.4 s.
 * Under lock; the daemon's stop cuts it short. */
static void retry_pause(unsigned tries)
{
	uint64_t d = mono_ns() + (200000000ull << (tries < 5 ? tries : 5));

	while (!repl.stopping && repl_wait_until(d) != ETIMEDOUT)
		;
}

/* Whether every partner has r: under lock. */
static bool all_confirmed(const struct record *r)
{
	for (size_t i = 0; i < repl.npartners; i++)
		if (r->copies[i].state != C_CONFIRMED)
			return false;
	return true;
}

void *repl_send_main(void *arg)
{
	struct partner *p = arg;
	size_t i = (size_t)(p - repl.partners);
	struct sender s = { .p = p, .h = &peers.hosts.v[p->host] };
	int rc, crc;
	char name[16];

	snprintf(name, sizeof(name), "send %s", s.h->name);
	pthread_setname_np(pthread_self(), name);
	repl_background("a sender");
	zp_init(&s.z, repl.cfg->compress);
	rc = psend_open(&s.ps, repl.cfg->rate);
	if (rc < 0) {
		log_err("sender to %s: cannot start: %s", s.h->name, strerror(-rc));
		goto out;
	}
	pthread_mutex_lock(&repl.lock);
	while (!repl.stopping) {
		char job[CKPT_NAME_MAX + 1], step[CKPT_NAME_MAX + 1], why[1024] = "";
		bool late;
		struct record *r = tx_next_copy(i, &late);
		uint64_t seq, total;
		unsigned hash_no;
		digest_t root;

		if (!r) {
			pthread_cond_wait(&repl.cond, &repl.lock);
			continue;
		}
		strcpy(job, r->job);
		strcpy(step, r->step);
		seq = r->seq;
		root = r->root;
		total = r->bytes;
		hash_no = r->hash_no;
		r->copies[i].state = C_SENDING;
		r->copies[i].sent = 0;
		r->copies[i].total = total;
		pthread_mutex_unlock(&repl.lock);

		crc = rc = s.x ? 0 : connect_peer(&s);
		if (rc == 0) {
			rc = send_copy(&s, job, step, seq, root, total, late, hash_no, why,
				       sizeof(why));
			/* A failure may leave either side mid-offer: start afresh. */
			if (rc < 0 && (rc != -EAGAIN || s.offered))
				disconnect(&s);
		}
		pthread_mutex_lock(&repl.lock);
		r = repl_rec_find(job, step);
		if (!r || r->seq != seq || r->copies[i].state != C_SENDING)
			continue;       /* committed again or dropped meanwhile */
		if (rc == 0) {
			r->copies[i].state = C_CONFIRMED;
			r->copies[i].how = late ? HOW_LATE : HOW_FIRST;
			r->copies[i].follows = tx_follows(r, i);
			r->copies[i].held = s.held;
			if (late)
				p->late++;
			r->copies[i].why[0] = '\0';
			r->copies[i].tries = 0;
			r->copies[i].begun = r->copies[i].pinned = false;   /* both done with */
			s.lost = 0;
			p->confirmed++;
			log_info("%s/%s: confirmed on %s%s", job, step, s.h->name,
				 late ? " (sent as it was hashed, its manifest last)" : "");
			repl_rec_save(r);
			if (all_confirmed(r))
				obs_last(OBS_LAST_REPLICATED_NS, wall_ns() - r->seq);
		} else if (rc == -EAGAIN) {
			/* Sent as it was hashed no more: the usual way, no try lost. */
			r->copies[i].state = C_PENDING;
			log_info("%s/%s to %s: not sent as it is hashed (%s); it goes with its "
				 "manifest first", job, step, s.h->name, why);
		} else if (rc == -EREMOTEIO || rc == -ESTALE) {
			p->fails[rc == -ESTALE ? PFAIL_CHANGED : PFAIL_REFUSED]++;
			snprintf(r->copies[i].why, sizeof(r->copies[i].why), "%s", why);
			log_warn("%s/%s to %s: %s", job, step, s.h->name, why);
			r->copies[i].state = rc == -ESTALE || ++r->copies[i].tries >= REPL_MAX_TRIES ?
				C_FAILED : C_PENDING;
			if (r->copies[i].state == C_PENDING)
				retry_pause(r->copies[i].tries);
		} else {
			p->fails[crc ? PFAIL_CONNECT : PFAIL_LOST]++;
			r->copies[i].state = C_PENDING;
			if (why[0] && p->state == PEER_UP) {
				log_warn("%s/%s to %s: %s; will resume", job, step, s.h->name, why);
				p->state = PEER_DOWN;
				snprintf(p->why, sizeof(p->why), "%s", why);
			}
			/* A receiver that refuses mid-stream just closes, which
			 * looks the same from here: without a pause, a refusal
			 * that repeats would be a busy loop. */
			if (crc == 0 && !repl.stopping)
				retry_pause(s.lost < 5 ? s.lost++ : 5);
		}
		pthread_cond_broadcast(&repl.cond);
	}
	pthread_mutex_unlock(&repl.lock);
	disconnect(&s);
	psend_close(&s.ps);
out:
	codec_thread_end();
	return NULL;
}
