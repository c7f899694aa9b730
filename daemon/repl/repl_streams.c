/* The receiver's further streams (docs/PROTOCOL.md, "Streams").
 *
 * An offer with K_STREAMS n > 1 gets its pieces over n connections from
 * its sender, in turns: the first piece on stream 0 (the offer's own
 * connection), and after a piece that ends where a chunk of the offer ends
 * (a multiple of its chunk size, or its file's end) the next on the next
 * stream, so a chunk's pieces all come on one stream. Each further stream
 * arrives as MSG_STREAM on a connection of its own, served by that
 * connection's thread here (repl_recv_stream): it checks the seal of its
 * pieces, decodes them (their bytes are checked against the manifest,
 * not against the frame's digest as well) and hashes their chunks
 * (cbuild_hash), and queues them, at most RX_STREAM_DEPTH, for the offer's
 * thread, which takes them in turn (rx_recv) and builds the copy as from one
 * connection: it compares each chunk's digest and hashes the whole file;
 * the journal, the held chunks and every check are unchanged. So every
 * byte's seal, decode and chunk hash spread over the streams' threads, and
 * the offer's thread keeps one hash and no copy per byte of those (and
 * stream 0's pieces, which it still takes whole). The whole-file hash stays
 * there: it is what binds the bytes to the offer's root (engine/cbuild.h).
 *
 * States of a further stream, under r->smu:
 *
 *   free --MSG_STREAM--> attached --its MSG_END queued--> ended (detached)
 *                           |--a failure, or the offer closing--> failed
 *
 * Invariants: a stream attaches only while the offer is registered and not
 * closing; rx_streams_close sets closing, shuts every attached stream's
 * connection and waits until none is attached before the offer's memory
 * goes, so no stream thread ever touches a freed offer. The queue's slots
 * [qh, qh + qn) are the offer thread's (the head one lent to it between
 * rx_recv and rx_piece_done), the slot after them the stream thread's to
 * fill, unlocked, once it is free. A stream's MSG_END is the last thing it
 * queues. Once the stream whose turn it is has ended, every other stream's
 * next is its MSG_END too, and then stream 0's: anything else is refused.
 *
 * No deadlock: the offer's thread waits only for the piece due. Every
 * piece before it is taken, so the queue of its stream holds nothing
 * before it: when full, it is at its head.
 */
#include "daemon/repl/repl_rx.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/codec.h"
#include "common/log.h"
#include "daemon/net/peer.h"

int rx_streams_open(struct rx *r, unsigned n)
{
	r->nstreams = 1;
	r->turn = 0;
	r->cs = 0;
	r->data_end = r->closing = false;
	if (n <= 1)
		return 0;
	r->streams = calloc(n, sizeof(*r->streams));
	if (!r->streams)
		return -ENOMEM;
	r->nstreams = n;
	return 0;
}

void rx_streams_close(struct rx *r)
{
	if (!r->streams)
		return;
	pthread_mutex_lock(&r->smu);
	r->closing = true;
	for (unsigned j = 1; j < r->nstreams; j++)
		if (r->streams[j].attached)
			r->streams[j].x->ops->shutdown(r->streams[j].x);
	pthread_cond_broadcast(&r->scv);
	for (unsigned j = 1; j < r->nstreams; j++)
		while (r->streams[j].attached)
			pthread_cond_wait(&r->scv, &r->smu);
	pthread_mutex_unlock(&r->smu);
	for (unsigned j = 1; j < r->nstreams; j++)
		for (unsigned i = 0; i < RX_STREAM_DEPTH; i++)
			free(r->streams[j].q[i].buf);
	free(r->streams);
	r->streams = NULL;
	r->nstreams = 1;
}

void rx_streams_chunk_size(struct rx *r, uint64_t cs)
{
	pthread_mutex_lock(&r->smu);
	r->cs = cs;
	pthread_mutex_unlock(&r->smu);
}

/* The next thing stream j queued (lent: rx_piece_done gives it back),
 * waiting up to the peer timeout. */
static int pop(struct rx *r, unsigned j, struct rx_piece **pc)
{
	struct rx_stream *st = &r->streams[j];
	struct timespec until;
	int rc = 0;

	until = mono_timespec(mono_ns() + (uint64_t)peers_io_ms() * 1000000ull);
	pthread_mutex_lock(&r->smu);
	while (!st->qn && !st->err && !r->closing && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&r->scv, &r->smu, &until);
	if (st->qn) {
		*pc = &st->q[st->qh];
		rc = 0;
	} else if (st->err) {
		/* A stream's connection lost (not a rule broken: -EPROTO) loses
		 * the copy as stream 0's would: no refusal is sent, the sender
		 * reconnects and resumes without counting a try. */
		r->lost = st->err != -EPROTO;
		rx_fail(r, st->err, "stream %u: %s", j, st->why);
		rc = st->err;
	} else if (r->closing) {
		r->lost = true;
		rc = rx_fail(r, -ECANCELED, "a newer connection of the same sender took over");
	} else {
		r->lost = true;
		rx_fail(r, -ETIMEDOUT, "stream %u: %s", j, st->used ? "nothing came for the peer "
			"timeout" : "it never attached");
		rc = -ETIMEDOUT;
	}
	pthread_mutex_unlock(&r->smu);
	return rc;
}

void rx_piece_done(struct rx *r, const struct rx_piece *pc)
{
	struct rx_stream *st = &r->streams[pc->stream];

	pthread_mutex_lock(&r->smu);
	st->qh = (st->qh + 1) % RX_STREAM_DEPTH;
	st->qn--;
	pthread_cond_broadcast(&r->scv);
	pthread_mutex_unlock(&r->smu);
}

/* After the first stream to end: every other further stream's next must
 * be its MSG_END (skip: the one already taken). */
static int all_ended(struct rx *r, unsigned skip)
{
	for (unsigned j = 1; j < r->nstreams; j++) {
		struct rx_piece *pc;
		int rc;

		if (j == skip)
			continue;
		if ((rc = pop(r, j, &pc)) < 0)
			return rc;
		rc = pc->type;
		rx_piece_done(r, pc);
		if (rc != MSG_END)
			return rx_fail(r, -EPROTO, "stream %u: a piece after another stream "
				       "ended (out of its turn)", j);
	}
	return 0;
}

int rx_recv(struct rx *r, struct msg *m, struct rx_piece **pc)
{
	struct rx_piece *p;
	unsigned j;
	int rc;

	*pc = NULL;
	if (r->nstreams <= 1 || r->data_end) {
		rc = r->x->ops->recv(r->x, m);
		if (rc == 0 && r->data_end && m->type != MSG_END) {
			msg_free(m);
			return rx_fail(r, -EPROTO, "frame type %u after the streams ended",
				       m->type);
		}
		return rc;
	}
	j = r->turn;
	if (j == 0) {
		rc = r->x->ops->recv(r->x, m);
		if (rc < 0 || m->type != MSG_END)
			return rc;      /* the caller says what a stray type is */
		r->data_end = true;
		if ((rc = all_ended(r, 0)) < 0)
			msg_free(m);
		return rc;
	}
	if ((rc = pop(r, j, &p)) < 0)
		return rc;
	if (p->type == MSG_DATA) {
		msg_init(m, MSG_DATA);  /* its fields are in *pc */
		*pc = p;
		return 0;
	}
	rx_piece_done(r, p);    /* stream j's MSG_END: the pieces are all here */
	r->data_end = true;
	if ((rc = all_ended(r, j)) < 0)
		return rc;
	return rx_recv(r, m, pc);
}

/* Fills pc from m: the piece decoded into pc's buffer and its chunks
 * hashed (a piece that cannot be read is queued as such, for the offer's
 * thread to refuse in its turn). 0 or -ENOMEM. */
static int prepare(struct rx_piece *pc, const struct msg *m, uint64_t cs,
		   struct cbuild_hasher *h)
{
	const uint8_t *p;
	size_t n, used;

	pc->type = m->type;
	pc->bad = RX_PIECE_OK;
	pc->raw = 0;
	pc->sums.cs = 0;
	if (m->type != MSG_DATA)
		return 0;
	if (!pc->buf && !(pc->buf = aligned_alloc(WQ_ALIGN, REPL_PIECE)))
		return -ENOMEM;
	if (msg_get_u64(m, K_FILE, &pc->idx) < 0 || msg_get_u64(m, K_OFFSET, &pc->off) < 0 ||
	    msg_get_bytes(m, K_DATA, &p, &n) < 0) {
		pc->bad = RX_PIECE_NO_FIELDS;
		return 0;
	}
	/* Not the frame's digest: cbuild_hash hashes the bytes for the
	 * manifest's chunk digests just below, the check that counts. */
	if (codec_chunk_decode_unchecked(p, n, pc->buf, REPL_PIECE, &pc->raw, &used) < 0 ||
	    used != n || pc->raw == 0) {
		pc->bad = RX_PIECE_DAMAGED;
		return 0;
	}
	cbuild_hash(h, cs, pc->idx, pc->off, pc->buf, pc->raw, &pc->sums);
	return 0;
}

/* The offer stream idx is for, attached: under repl.lock (the offer stays
 * registered, so alive, while we look). NULL with why. */
static struct rx *attach(struct xport *x, const char *key, digest_t root, uint64_t idx,
			 char *why, size_t whylen)
{
	struct rx *r = NULL;

	for (struct rx_slot *s = repl.rx; s; s = s->next)
		if (strcmp(s->key, key) == 0)
			r = rx_of_slot(s);
	if (!r) {
		snprintf(why, whylen, "no offer of %s is being received", key);
		return NULL;
	}
	pthread_mutex_lock(&r->smu);
	if (!digest_eq(r->root, root))
		snprintf(why, whylen, "the offer of %s being received is of another commit", key);
	else if (idx < 1 || idx >= r->nstreams)
		snprintf(why, whylen, "stream %llu of an offer of %u stream%s",
			 (unsigned long long)idx, r->nstreams, r->nstreams == 1 ? "" : "s");
	else if (r->closing || r->streams[idx].used)
		snprintf(why, whylen, "stream %llu of %s is taken or over",
			 (unsigned long long)idx, key);
	else {
		r->streams[idx].x = x;
		r->streams[idx].attached = r->streams[idx].used = true;
		pthread_mutex_unlock(&r->smu);
		return r;
	}
	pthread_mutex_unlock(&r->smu);
	return NULL;
}

int repl_recv_stream(struct xport *x, const char *peer, const struct msg *req)
{
	char job[CKPT_NAME_MAX + 1], step[CKPT_NAME_MAX + 1], key[3 * (CKPT_NAME_MAX + 1)];
	char *hex = NULL, why[1024] = "";
	struct cbuild_hasher h = { 0 };
	struct rx_stream *st;
	struct rx *r = NULL;
	digest_t root;
	uint64_t idx;
	int rc = 0;

	if (ckpt_get_name(req, K_JOB, job) < 0 || ckpt_get_name(req, K_STEP, step) < 0 ||
	    msg_get_str(req, K_ROOT, &hex) < 0 || digest_from_hex(hex, strlen(hex), &root) < 0 ||
	    msg_get_u64(req, K_INDEX, &idx) < 0) {
		snprintf(why, sizeof(why), "a malformed MSG_STREAM");
		rc = -EPROTO;
	} else {
		/* Only the node that offers may add streams to its offer: the
		 * key is ORIGIN/JOB/STEP with the proven name as ORIGIN. */
		snprintf(key, sizeof(key), "%s/%s/%s", peer, job, step);
		pthread_mutex_lock(&repl.lock);
		r = attach(x, key, root, idx, why, sizeof(why));
		pthread_mutex_unlock(&repl.lock);
		if (!r)
			rc = -EPROTO;
	}
	free(hex);
	if (rc < 0) {
		log_warn("from %s: %s", peer, why);
		peer_send_error(x, -rc, "%s: %s", repl.cfg->name, why);
		return rc;
	}
	st = &r->streams[idx];
	/* A stream replicates: its thread yields to the trainer, as the
	 * offer's does (repl_background is idempotent). It waits n turns
	 * between its own, so no timeout of its own: the offer's thread waits
	 * at most the peer timeout for each piece due and ends the streams
	 * then, and keepalive finds a dead peer. */
	repl_background("a stream of a copy");
	x->ops->set_timeout(x, 0);
	if ((rc = cbuild_hasher_open(&h)) < 0)
		snprintf(why, sizeof(why), "no memory for its hasher");
	while (rc == 0) {
		struct rx_piece *pc;
		struct msg m;
		uint64_t cs;

		rc = x->ops->recv(x, &m);
		if (rc < 0) {
			snprintf(why, sizeof(why), "%s", rc == -ENOTCONN ? "the sender closed it" :
				 rc == -EBADMSG ? "a frame failed its seal or is malformed" :
				 strerror(-rc));
			break;
		}
		if (m.type != MSG_DATA && m.type != MSG_END) {
			snprintf(why, sizeof(why), "frame type %u on a stream", m.type);
			msg_free(&m);
			rc = -EPROTO;
			break;
		}
		/* The slot after the queue's last, once free, is this thread's
		 * to fill without the lock. */
		pthread_mutex_lock(&r->smu);
		while (st->qn == RX_STREAM_DEPTH && !r->closing)
			pthread_cond_wait(&r->scv, &r->smu);
		pc = &st->q[(st->qh + st->qn) % RX_STREAM_DEPTH];
		cs = r->cs;
		rc = r->closing ? -ECANCELED : 0;
		pthread_mutex_unlock(&r->smu);
		pc->stream = (unsigned)idx;
		if (rc == 0 && (rc = prepare(pc, &m, cs, &h)) < 0)
			snprintf(why, sizeof(why), "no memory for its pieces");
		msg_free(&m);
		if (rc == -ECANCELED)
			snprintf(why, sizeof(why), "the offer ended");
		if (rc < 0)
			break;
		pthread_mutex_lock(&r->smu);
		st->qn++;
		pthread_cond_broadcast(&r->scv);
		if (pc->type == MSG_END) {
			/* Detached with its end queued, in one step: the offer,
			 * finishing, never shuts a stream that ended well. The
			 * connection goes back to serving requests. */
			st->attached = false;
			st->x = NULL;
			pthread_mutex_unlock(&r->smu);
			cbuild_hasher_close(&h);
			return 0;
		}
		pthread_mutex_unlock(&r->smu);
	}
	cbuild_hasher_close(&h);
	pthread_mutex_lock(&r->smu);
	if (rc < 0 && !st->err) {
		st->err = rc;
		snprintf(st->why, sizeof(st->why), "%s", why);
	}
	st->attached = false;
	st->x = NULL;
	pthread_cond_broadcast(&r->scv);
	pthread_mutex_unlock(&r->smu);
	return rc;
}
