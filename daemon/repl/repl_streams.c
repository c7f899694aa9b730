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
 *   free --MSG_STREAM--> attached --its MSG_END queued--> ended --turns over,
 *                           |   ^                           |     or the offer
 *                           |   '------a hand-off-----------'     closing--> detached
 *                           |--a failure, or the offer closing--> failed
 *                           '--lost at its turn (r->handoff)--> dead
 *
 * A hand-off (hand_off, docs/PROTOCOL.md "Streams"): a stream lost at its
 * turn is dead (out of r->live, its connection shut); r->epoch goes up and
 * every queue is emptied; until a stream's MSG_MARK of that epoch its
 * thread drops what comes (so no queue fills and no sender's send
 * stalls), an ended one included, which reads on.
 *
 * Invariants: a stream attaches only while the offer is registered and not
 * closing, and never once dead; rx_streams_close sets closing, shuts every
 * attached stream's connection but those that ended well and waits until
 * none is attached before the offer's memory goes, so no stream thread
 * ever touches a freed offer. The queue's slots [qh, qh + qn) are the
 * offer thread's (the head one lent to it between rx_recv and
 * rx_piece_done, never across a hand-off), the slot after them the stream
 * thread's to fill, unlocked, once it is free; a piece filled while a
 * hand-off began is not queued. A stream's MSG_END is the last thing it
 * queues. Once the stream whose turn it is has ended, every other live
 * stream's next is its MSG_END too (or it is lost: every piece has come),
 * and then stream 0's: anything else is refused.
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
	r->nstreams = r->nlive = 1;
	r->live[0] = 0;
	r->turn = 0;
	r->cs = 0;
	r->epoch = 0;
	r->data_end = r->closing = r->released = false;
	if (n <= 1)
		return 0;
	r->streams = calloc(n, sizeof(*r->streams));
	if (!r->streams)
		return -ENOMEM;
	r->nstreams = r->nlive = n;
	for (unsigned j = 0; j < n; j++)
		r->live[j] = j;
	return 0;
}

void rx_streams_close(struct rx *r)
{
	if (!r->streams)
		return;
	pthread_mutex_lock(&r->smu);
	r->closing = true;
	/* A stream that ended well keeps its connection for the next copy. */
	for (unsigned j = 1; j < r->nstreams; j++)
		if (r->streams[j].attached && !r->streams[j].ended)
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
	r->nstreams = r->nlive = 1;
}

void rx_streams_chunk_size(struct rx *r, uint64_t cs)
{
	pthread_mutex_lock(&r->smu);
	r->cs = cs;
	pthread_mutex_unlock(&r->smu);
}

/* The next thing stream j queued (lent: rx_piece_done gives it back),
 * waiting up to the peer timeout. A stream lost (its connection failed,
 * nothing came, it never attached) is -EPIPE with st->why when its turns
 * may go to the others (r->handoff and the connection lost, not a rule
 * broken); otherwise it fails the copy. */
/* Under smu, with r->handoff: a live further stream other than j that
 * is lost already (0: none). Its turn may not come: the sender's streams
 * drop their pieces once one stream failed, the earlier ones included. */
static unsigned other_lost(const struct rx *r, unsigned j)
{
	for (unsigned i = 1; i < r->nlive; i++) {
		const struct rx_stream *st = &r->streams[r->live[i]];

		if (r->live[i] != j && st->err && st->err != -EPROTO)
			return r->live[i];
	}
	return 0;
}

/* How long a stream whose turns may go on is waited for: sooner than the
 * sender's own sends on stream 0 time out (the peer timeout), which block
 * once this end stops reading it; still later than the longest the sender
 * yields to its trainer (half of it). */
static uint64_t handoff_ms(void)
{
	return (uint64_t)peers_io_ms() * 3 / 4;
}

/* The offer closing under a wait: a newer connection took it over. */
static int taken_over(struct rx *r)
{
	r->lost = true;
	return rx_fail(r, -ECANCELED, "a newer connection of the same sender took over");
}

static int pop(struct rx *r, unsigned j, struct rx_piece **pc, bool others, unsigned *lost)
{
	struct rx_stream *st = &r->streams[j];
	uint64_t ms = r->handoff ? handoff_ms() : (uint64_t)peers_io_ms();
	struct timespec until;
	int rc = 0;

	until = mono_timespec(mono_ns() + ms * 1000000ull);
	pthread_mutex_lock(&r->smu);
	*lost = 0;
	while (!st->qn && !st->err && !r->closing && rc != ETIMEDOUT &&
	       !(others && r->handoff && (*lost = other_lost(r, j)) != 0))
		rc = pthread_cond_timedwait(&r->scv, &r->smu, &until);
	if (st->qn) {
		*pc = &st->q[st->qh];
		rc = 0;
	} else if (r->closing) {
		rc = taken_over(r);
	} else if (r->handoff && *lost && *lost != j) {
		rc = -EPIPE;            /* another one lost: its turns go on first */
	} else if (r->handoff && st->err != -EPROTO) {
		if (!st->err) {
			snprintf(st->why, sizeof(st->why), "%s", st->used ? "nothing came for the "
				 "peer timeout" : "it never attached");
			st->err = -ETIMEDOUT;   /* and its thread says nothing more */
		}
		*lost = j;
		rc = -EPIPE;
	} else if (st->err) {
		/* A stream's connection lost (not a rule broken: -EPROTO) loses
		 * the copy as stream 0's would: no refusal is sent, the sender
		 * reconnects and resumes without counting a try. */
		r->lost = st->err != -EPROTO;
		rx_fail(r, st->err, "stream %u: %s", j, st->why);
		rc = st->err;
	} else {
		r->lost = true;
		rx_fail(r, -ETIMEDOUT, "stream %u: %s", j, st->used ? "nothing came for the peer "
			"timeout" : "it never attached");
		rc = -ETIMEDOUT;
	}
	pthread_mutex_unlock(&r->smu);
	return rc;
}

/* ---- a lost stream's turns handed to the others (docs/PROTOCOL.md, "Streams") ---- */

/* Stream j out of the turns: its connection shut (its thread ends on it),
 * a new hand-off begun (epoch), and what every stream left had queued
 * dropped: from here each drops what comes until its MSG_MARK. */
static void drop_stream(struct rx *r, unsigned j)
{
	unsigned k = 0;

	pthread_mutex_lock(&r->smu);
	r->streams[j].dead = true;
	if (r->streams[j].attached)
		r->streams[j].x->ops->shutdown(r->streams[j].x);
	for (unsigned i = 0; i < r->nlive; i++)
		if (r->live[i] != j)
			r->live[k++] = r->live[i];
	r->nlive = k;
	r->epoch++;
	for (unsigned i = 1; i < r->nlive; i++) {
		struct rx_stream *st = &r->streams[r->live[i]];

		/* The slot after the queue's stays the stream thread's. */
		st->qh = (st->qh + st->qn) % RX_STREAM_DEPTH;
		st->qn = 0;
	}
	pthread_cond_broadcast(&r->scv);
	pthread_mutex_unlock(&r->smu);
}

/* Every stream left read up to this hand-off's MSG_MARK: stream 0 here,
 * the others by their threads. 0; -EPIPE with *lost another stream lost
 * meanwhile; or -errno said (the copy fails). */
static int to_mark(struct rx *r, unsigned *lost)
{
	struct timespec until;
	int rc;

	for (;;) {
		struct msg m;
		uint64_t code = 0;

		if ((rc = r->x->ops->recv(r->x, &m)) < 0) {
			r->lost = true;
			return rx_fail(r, rc, "receiving: %s", rc == -ENOTCONN ? "the sender closed" :
				       strerror(-rc));
		}
		rc = m.type;
		msg_get_u64(&m, K_CODE, &code);
		msg_free(&m);
		if (rc == MSG_MARK && code == r->epoch)
			break;
		if ((rc == MSG_MARK && code > r->epoch) ||
		    (rc != MSG_MARK && rc != MSG_DATA && rc != MSG_END))
			return rx_fail(r, -EPROTO, "frame type %u while handing a stream's turns on",
				       (unsigned)rc);
	}
	until = mono_timespec(mono_ns() + handoff_ms() * 1000000ull);
	pthread_mutex_lock(&r->smu);
	for (rc = 0;;) {
		unsigned waiting = 0;

		for (unsigned i = 1; i < r->nlive; i++) {
			struct rx_stream *st = &r->streams[r->live[i]];

			if (st->mark == r->epoch)
				continue;
			if (st->err == -EPROTO) {
				pthread_mutex_unlock(&r->smu);
				return rx_fail(r, -EPROTO, "stream %u: %s", r->live[i], st->why);
			}
			if (st->err || rc == ETIMEDOUT) {
				if (!st->err) {
					snprintf(st->why, sizeof(st->why), "no MSG_MARK for the peer "
						 "timeout");
					st->err = -ETIMEDOUT;
				}
				*lost = r->live[i];
				pthread_mutex_unlock(&r->smu);
				return -EPIPE;
			}
			waiting++;
		}
		if (!waiting)
			break;
		if (r->closing) {
			pthread_mutex_unlock(&r->smu);
			return taken_over(r);
		}
		rc = pthread_cond_timedwait(&r->scv, &r->smu, &until);
	}
	pthread_mutex_unlock(&r->smu);
	return 0;
}

/* Stream j is lost at its turn: its turns go to the streams left. The
 * cursor goes back to the start of the chunk it is in (part of it may have
 * come on j); MSG_RESTREAM tells the sender that point and the stream;
 * every stream left is read up to its MSG_MARK, what came before dropped;
 * then the turns begin again at stream 0, over the streams left. Another
 * stream lost meanwhile goes the same way, from the same point. Nothing
 * is journaled here: the journal only ever vouches for checked chunks
 * before the point. 0, or -errno said. */
static int hand_off(struct rx *r, unsigned j)
{
	uint64_t idx, off;
	int rc = rx_rewind(r, &idx, &off);

	while (rc == 0) {
		struct msg m;

		drop_stream(r, j);
		log_warn("%s: stream %u lost (%s); its turns go to the %u stream%s left, from "
			 "entry %llu byte %llu", r->slot.key, j, r->streams[j].why, r->nlive,
			 r->nlive == 1 ? "" : "s", (unsigned long long)idx, (unsigned long long)off);
		msg_init(&m, MSG_RESTREAM);
		msg_put_u64(&m, K_INDEX, j);
		msg_put_u64(&m, K_FILE, idx);
		msg_put_u64(&m, K_OFFSET, off);
		msg_put_u64(&m, K_CODE, r->epoch);
		rc = r->x->ops->send(r->x, &m);
		msg_free(&m);
		if (rc < 0) {
			r->lost = true;
			return rx_fail(r, rc, "sending: %s", strerror(-rc));
		}
		if ((rc = to_mark(r, &j)) != -EPIPE)
			break;
		rc = 0;
	}
	r->turn = 0;
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
 * be its MSG_END (skip: the one already taken). Every piece has come by
 * then: one lost now loses nothing, and only ends early. Then the streams
 * are let go. */
static int all_ended(struct rx *r, unsigned skip)
{
	for (unsigned i = 1; i < r->nlive; i++) {
		unsigned j = r->live[i], lost;
		struct rx_piece *pc;
		int rc;

		if (j == skip)
			continue;
		if ((rc = pop(r, j, &pc, false, &lost)) == -EPIPE) {
			log_warn("%s: stream %u lost after its last piece (%s)", r->slot.key, j,
				 r->streams[j].why);
			continue;
		}
		if (rc < 0)
			return rc;
		rc = pc->type;
		rx_piece_done(r, pc);
		if (rc != MSG_END)
			return rx_fail(r, -EPROTO, "stream %u: a piece after another stream "
				       "ended (out of its turn)", j);
	}
	pthread_mutex_lock(&r->smu);
	r->released = true;
	pthread_cond_broadcast(&r->scv);
	pthread_mutex_unlock(&r->smu);
	return 0;
}

int rx_recv(struct rx *r, struct msg *m, struct rx_piece **pc)
{
	struct rx_piece *p;
	unsigned j, lost;
	int rc;

	*pc = NULL;
	if (r->nlive <= 1 && !r->data_end && r->nstreams > 1) {
		/* Stream 0 alone after hand-offs: its MSG_END ends the turns. */
		rc = r->x->ops->recv(r->x, m);
		if (rc == 0 && m->type == MSG_END)
			r->data_end = true;
		return rc;
	}
	if (r->nstreams <= 1 || r->data_end) {
		rc = r->x->ops->recv(r->x, m);
		/* With the manifest last, its slices come between the
		 * streams' ends and stream 0's. */
		if (rc == 0 && r->data_end && m->type != MSG_END &&
		    !(r->late && m->type == MSG_MANIFEST)) {
			msg_free(m);
			return rx_fail(r, -EPROTO, "frame type %u after the streams ended",
				       m->type);
		}
		return rc;
	}
	j = r->live[r->turn];
	if (j == 0) {
		rc = r->x->ops->recv(r->x, m);
		if (rc < 0 || m->type != MSG_END)
			return rc;      /* the caller says what a stray type is */
		r->data_end = true;
		if ((rc = all_ended(r, 0)) < 0)
			msg_free(m);
		return rc;
	}
	if ((rc = pop(r, j, &p, true, &lost)) == -EPIPE) {
		if ((rc = hand_off(r, lost)) < 0)
			return rc;
		return rx_recv(r, m, pc);
	}
	if (rc < 0)
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
	else if (r->closing || r->streams[idx].used || r->streams[idx].dead)
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
		if (m.type == MSG_MARK) {
			uint64_t code = 0;

			/* A hand-off's: what came before it is dropped, what
			 * follows is the pieces from its point. */
			msg_get_u64(&m, K_CODE, &code);
			msg_free(&m);
			pthread_mutex_lock(&r->smu);
			if (code <= st->mark || code > r->epoch) {
				pthread_mutex_unlock(&r->smu);
				snprintf(why, sizeof(why), "a MSG_MARK out of place");
				rc = -EPROTO;
				break;
			}
			st->mark = code;
			pthread_cond_broadcast(&r->scv);
			pthread_mutex_unlock(&r->smu);
			continue;
		}
		if (m.type != MSG_DATA && m.type != MSG_END) {
			snprintf(why, sizeof(why), "frame type %u on a stream", m.type);
			msg_free(&m);
			rc = -EPROTO;
			break;
		}
		/* The slot after the queue's last, once free, is this thread's
		 * to fill without the lock. During a hand-off, until its mark,
		 * what comes is dropped. */
		pthread_mutex_lock(&r->smu);
		while (st->qn == RX_STREAM_DEPTH && !r->closing && st->mark == r->epoch)
			pthread_cond_wait(&r->scv, &r->smu);
		pc = &st->q[(st->qh + st->qn) % RX_STREAM_DEPTH];
		cs = r->cs;
		rc = r->closing ? -ECANCELED : 0;
		if (rc == 0 && st->mark < r->epoch) {
			pthread_mutex_unlock(&r->smu);
			msg_free(&m);
			continue;
		}
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
		if (st->mark < r->epoch) {
			pthread_mutex_unlock(&r->smu);      /* a hand-off began meanwhile */
			continue;
		}
		st->qn++;
		pthread_cond_broadcast(&r->scv);
		if (pc->type == MSG_END) {
			/* It stays until the turns are over (a hand-off may still
			 * need it) or the offer ends; then, detached in one step,
			 * the connection goes back to serving requests: the
			 * offer, finishing, never shuts a stream that ended well. */
			st->ended = true;
			while (!r->closing && !r->released && st->mark == r->epoch)
				pthread_cond_wait(&r->scv, &r->smu);
			if (r->closing || r->released) {
				st->attached = false;
				st->x = NULL;
				pthread_cond_broadcast(&r->scv);
				pthread_mutex_unlock(&r->smu);
				cbuild_hasher_close(&h);
				return 0;
			}
			st->ended = false;      /* a hand-off: it reads on */
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
