/* The piece sender (psend.h).
 *
 * Slots form a ring of depth reads of one range in file order: head
 * is the oldest, n are in flight or landed. The invariant between calls is
 * n == 0: a range drains what it started before it returns, so the file can
 * be closed and the next range can start anywhere.
 *
 * With streams, a landed slot may be handed to a stream's thread instead of
 * being sent here: it leaves the ring (head moves on) but stays busy until
 * that thread has sent it, and no read goes into a busy slot. Between calls
 * no slot is busy either: a range waits for its pieces to be sent, since
 * the hooks' argument lives no longer than the range.
 */
#include "daemon/engine/psend.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/proto.h"
#include "daemon/engine/pcache.h"


/* One piece handed to a stream. */
struct item {
	unsigned slot;
	uint64_t idx, at;
	size_t len;
	const struct codec_ops *want;
	struct codec_params cp;
	const struct psend_hooks *h;
};

struct psend_stream {
	struct psend *ps;
	struct xport *x;
	pthread_t thread;
	bool started, stop;             /* stop: under ps->mu */
	bool sending;                   /* in a send (under ps->mu) */
	uint8_t *frame;
	struct item q[PSEND_MAX_DEPTH]; /* under ps->mu */
	unsigned qh, qn;
};

/* Slots up to n (their buffers allocated): 0, or -ENOMEM with depth as far
 * as it got. Only while no slot is in flight or busy. */
static int grow(struct psend *ps, unsigned n)
{
	for (; ps->depth < n; ps->depth++) {
		unsigned i = ps->depth;

		if (posix_memalign((void **)&ps->base[i], PSEND_ALIGN,
				   PSEND_ALIGN + PSEND_PIECE) != 0) {
			ps->base[i] = NULL;
			return -ENOMEM;
		}
		ps->buf[i] = ps->base[i] + PSEND_ALIGN;
	}
	return 0;
}

/* Slots down to n, their buffers freed. Same condition. */
static void shrink(struct psend *ps, unsigned n)
{
	for (; ps->depth > n; ps->depth--) {
		free(ps->base[ps->depth - 1]);
		ps->base[ps->depth - 1] = ps->buf[ps->depth - 1] = NULL;
	}
}

int psend_open(struct psend *ps, uint64_t rate)
{
	int rc;

	memset(ps, 0, sizeof(*ps));
	ps->fd = -1;
	ps->nstreams = 1;
	pthread_mutex_init(&ps->mu, NULL);
	mono_cond_init(&ps->cv);
	pace_init(&ps->pace, rate);
	ps->cap = &ps->pace;
	ps->frame_cap = codec_chunk_bound(PSEND_PIECE);
	ps->frame = malloc(ps->frame_cap);
	if (!ps->frame)
		return -ENOMEM;
	rc = grow(ps, PSEND_DEPTH);
	if (rc == 0)
		rc = io_uring_queue_init(PSEND_MAX_DEPTH, &ps->ring, 0);
	if (rc == 0)
		return 0;
	shrink(ps, 0);
	free(ps->frame);
	return rc;
}

/* The frame of a piece of len raw bytes at p (a slot's buffer): a raw
 * piece is framed where it lies, its header in the room before it; any
 * other codec encodes into frame. *out and *flen: the frame. */
static int encode(struct psend *ps, uint8_t *p, size_t len, const struct codec_ops *want,
		  struct codec_params *cp, uint8_t *frame, uint8_t **out, size_t *flen)
{
	if (want && want->id == CODEC_NONE && len <= CODEC_CHUNK_MAX) {
		codec_chunk_raw_hdr(p, len, cp, p - CODEC_CHUNK_HDR);
		*out = p - CODEC_CHUNK_HDR;
		*flen = CODEC_CHUNK_HDR + len;
		return 0;
	}
	*out = frame;
	return codec_chunk_encode(p, len, want, cp, frame, ps->frame_cap, flen);
}

void psend_close(struct psend *ps)
{
	psend_streams_end(ps, false);
	io_uring_queue_exit(&ps->ring);
	shrink(ps, 0);
	free(ps->frame);
	pthread_mutex_destroy(&ps->mu);
	pthread_cond_destroy(&ps->cv);
}

static void *stream_main(void *arg)
{
	struct psend_stream *t = arg;
	struct psend *ps = t->ps;

	pthread_setname_np(pthread_self(), "send stream");
	pthread_mutex_lock(&ps->mu);
	for (;;) {
		struct item it;
		uint8_t *f = NULL;
		size_t flen = 0;
		int rc = 0, err;

		while (!t->qn && !t->stop)
			pthread_cond_wait(&ps->cv, &ps->mu);
		if (!t->qn)
			break;
		it = t->q[t->qh];
		t->qh = (t->qh + 1) % PSEND_MAX_DEPTH;
		t->qn--;
		err = ps->err;
		t->sending = !err;
		pthread_mutex_unlock(&ps->mu);
		/* After a stream failed the copy is lost: what is queued is
		 * only given back. */
		if (!err) {
			rc = encode(ps, ps->buf[it.slot], it.len, it.want, &it.cp, t->frame, &f,
				    &flen);
			if (rc == 0) {
				struct msg m;

				pace_take(ps->cap, flen);
				msg_init(&m, MSG_DATA);
				if (it.idx != PSEND_NO_FILE)
					msg_put_u64(&m, K_FILE, it.idx);
				msg_put_u64(&m, K_OFFSET, it.at);
				rc = t->x->ops->send_tail(t->x, &m, K_DATA, f, flen);
				msg_free(&m);
			}
		}
		pthread_mutex_lock(&ps->mu);
		t->sending = false;
		ps->busy[it.slot] = false;
		if (rc < 0 && !ps->err) {
			ps->err = rc;
			ps->err_stream = (unsigned)(t - ps->st);
		}
		if (rc == 0 && !err && it.h->sent)
			it.h->sent(it.h->arg, it.at, it.len, flen, f[0]);
		pthread_cond_broadcast(&ps->cv);
	}
	pthread_mutex_unlock(&ps->mu);
	codec_thread_end();
	return NULL;
}

int psend_streams_begin(struct psend *ps, struct xport *const *xs, unsigned n, uint64_t budget)
{
	uint64_t slots = budget / PSEND_PIECE;

	if (n < 1 || n > PSEND_MAX_STREAMS || ps->nstreams > 1)
		return -EINVAL;
	ps->turn = 0;
	ps->err = 0;
	ps->err_stream = 0;
	if (n == 1)
		return 0;
	ps->max_depth = slots < PSEND_DEPTH ? PSEND_DEPTH :
			slots > PSEND_MAX_DEPTH ? PSEND_MAX_DEPTH : (unsigned)slots;
	ps->st = calloc(n, sizeof(*ps->st));
	if (!ps->st)
		return -ENOMEM;
	ps->nstreams = n;
	for (unsigned j = 1; j < n; j++) {
		struct psend_stream *t = &ps->st[j];

		t->ps = ps;
		t->x = xs[j];
		t->frame = malloc(ps->frame_cap);
		if (!t->frame || pthread_create(&t->thread, NULL, stream_main, t) != 0) {
			psend_streams_end(ps, false);
			return -ENOMEM;
		}
		t->started = true;
	}
	return 0;
}

int psend_streams_end(struct psend *ps, bool ok)
{
	int rc;

	if (ps->nstreams <= 1)
		return 0;
	pthread_mutex_lock(&ps->mu);
	for (unsigned j = 1; j < ps->nstreams; j++)
		ps->st[j].stop = true;
	pthread_cond_broadcast(&ps->cv);
	pthread_mutex_unlock(&ps->mu);
	for (unsigned j = 1; j < ps->nstreams; j++)
		if (ps->st[j].started)
			pthread_join(ps->st[j].thread, NULL);
	rc = ps->err;
	/* Each stream's end, after its last piece: the receiver then knows
	 * where the turns stop. */
	for (unsigned j = 1; ok && rc == 0 && j < ps->nstreams; j++) {
		struct msg m;

		msg_init(&m, MSG_END);
		rc = ps->st[j].x->ops->send(ps->st[j].x, &m);
		msg_free(&m);
		if (rc < 0)
			ps->err_stream = j;
	}
	for (unsigned j = 1; j < ps->nstreams; j++)
		free(ps->st[j].frame);
	free(ps->st);
	ps->st = NULL;
	ps->nstreams = 1;
	ps->err = 0;            /* (err_stream stays, for psend_failed_stream) */
	ps->turn = 0;           /* the next copy, on one stream or several, starts at 0 */
	memset(ps->busy, 0, sizeof(ps->busy));
	shrink(ps, PSEND_DEPTH);        /* the streams' slots go with them */
	ps->max_depth = 0;
	return rc;
}

void psend_shut_sending(struct psend *ps)
{
	pthread_mutex_lock(&ps->mu);
	for (unsigned j = 1; j < ps->nstreams; j++)
		if (ps->st[j].sending)
			ps->st[j].x->ops->shutdown(ps->st[j].x);
	pthread_mutex_unlock(&ps->mu);
}

void psend_streams_group(struct psend *ps, uint64_t group)
{
	uint64_t turn = group ? (group + PSEND_PIECE - 1) / PSEND_PIECE : 1;
	uint64_t want = (ps->nstreams + 1) * turn;

	ps->group = group;
	if (ps->nstreams <= 1)
		return;
	if (want > ps->max_depth)
		want = ps->max_depth;
	/* Short of memory the copy goes on with the slots it has. */
	if (want > ps->depth)
		(void)grow(ps, (unsigned)want);
}

/* After a piece that ends at end of a file of size bytes: the stream of
 * the next one (psend.h). */
static void next_turn(struct psend *ps, uint64_t end, uint64_t size)
{
	if (ps->nstreams > 1 && psend_turn_passes(end, size, ps->group))
		ps->turn = (ps->turn + 1) % ps->nstreams;
}

/* Whether a stream still sends from slot s. */
static bool slot_busy(struct psend *ps, unsigned s)
{
	bool busy;

	if (ps->nstreams <= 1)
		return false;
	pthread_mutex_lock(&ps->mu);
	busy = ps->busy[s];
	pthread_mutex_unlock(&ps->mu);
	return busy;
}

static void submit(struct psend *ps)
{
	while (ps->n < ps->depth && ps->next < ps->end) {
		unsigned s = (ps->head + ps->n) % ps->depth;
		uint64_t len = ps->end - ps->next < PSEND_PIECE ? ps->end - ps->next : PSEND_PIECE;
		/* A direct read of the range's last piece asks for whole blocks. */
		uint64_t ask = ps->direct ? (len + PSEND_ALIGN - 1) / PSEND_ALIGN * PSEND_ALIGN : len;
		struct io_uring_sqe *sqe;

		if (slot_busy(ps, s))
			break;          /* a stream still sends from it */
		sqe = io_uring_get_sqe(&ps->ring);
		if (!sqe)
			break;
		io_uring_prep_read(sqe, ps->fd, ps->buf[s], (unsigned)ask, ps->next);
		io_uring_sqe_set_data64(sqe, s);
		ps->res[s] = INT32_MIN;
		ps->off[s] = ps->next;
		ps->len[s] = (uint32_t)len;
		ps->next += len;
		ps->n++;
	}
	io_uring_submit(&ps->ring);
}

/* Waits for one completion and files it under its slot. */
static int reap(struct psend *ps)
{
	struct io_uring_cqe *cqe;
	int rc = io_uring_wait_cqe(&ps->ring, &cqe);

	if (rc < 0)
		return rc;
	ps->res[io_uring_cqe_get_data64(cqe)] = cqe->res;
	io_uring_cqe_seen(&ps->ring, cqe);
	return 0;
}

/* The head slot, landed: 0, or -errno (-ESTALE: the file ended early). */
static int head_ready(struct psend *ps)
{
	int rc;

	while (ps->res[ps->head] == INT32_MIN)
		if ((rc = reap(ps)) < 0 && rc != -EINTR)
			return rc;
	if (ps->res[ps->head] < 0)
		return ps->res[ps->head];
	return ps->res[ps->head] == 0 ? -ESTALE : 0;
}

static void release(struct psend *ps)
{
	ps->head = (ps->head + 1) % ps->depth;
	ps->n--;
}

/* Waits out what the kernel still holds of this range. */
static void drain(struct psend *ps)
{
	while (ps->n) {
		if (ps->res[ps->head] == INT32_MIN) {
			int rc = reap(ps);

			if (rc < 0 && rc != -EINTR) {
				/* The ring failed: nothing more will land, and
				 * these buffers must not be read into again. */
				ps->broken = true;
				ps->n = 0;
				break;
			}
			continue;
		}
		release(ps);
	}
	ps->fd = -1;
}

/* A short read mid-range: the rest is read in order from `at`, through
 * the cache (the offset is no longer aligned). */
static void restart_at(struct psend *ps, int fd, int fl, uint64_t at)
{
	drain(ps);
	if (ps->direct)
		fcntl(fd, F_SETFL, fl);
	ps->direct = false;
	ps->fd = fd;
	ps->next = at;
	ps->n = 0;
}

/* The hooks are the caller's, written for one thread: with streams they
 * are called under ps->mu, the streams' sent hook included. */
static void hooks_lock(struct psend *ps)
{
	if (ps->nstreams > 1)
		pthread_mutex_lock(&ps->mu);
}

static void hooks_unlock(struct psend *ps)
{
	if (ps->nstreams > 1)
		pthread_mutex_unlock(&ps->mu);
}

/* A range stopped by the caller's check (rc): the streams give back what
 * they hold unsent, and keep their connections. Under ps->mu. */
static void stop_checked(struct psend *ps, int rc)
{
	if (!ps->err) {
		ps->err = rc;
		ps->err_stream = 0;
	}
	pthread_cond_broadcast(&ps->cv);
}

/* The caller's thread waiting for a stream, under ps->mu: woken by the
 * streams, and every PSEND_CHECK_MS to run the caller's check. */
static void wait_checked(struct psend *ps, const struct psend_hooks *h)
{
	struct timespec until;
	int rc;

	if (!h->check) {
		pthread_cond_wait(&ps->cv, &ps->mu);
		return;
	}
	until = mono_timespec(mono_ns() + PSEND_CHECK_MS * 1000000ull);
	if (pthread_cond_timedwait(&ps->cv, &ps->mu, &until) != ETIMEDOUT)
		return;
	pthread_mutex_unlock(&ps->mu);
	rc = h->check(h->arg);
	pthread_mutex_lock(&ps->mu);
	if (rc < 0)
		stop_checked(ps, rc);
}

/* Waits until slot s is no stream's: 0, or a stream's failure. */
static int wait_slot(struct psend *ps, unsigned s, const struct psend_hooks *h)
{
	int rc;

	pthread_mutex_lock(&ps->mu);
	while (ps->busy[s] && !ps->err)
		wait_checked(ps, h);
	rc = ps->err;
	pthread_mutex_unlock(&ps->mu);
	return rc;
}

/* Queues a landed slot on stream t (waiting while its queue is full): 0, or
 * a stream's failure (the slot stays the ring's). */
static int hand_over(struct psend *ps, struct psend_stream *t, const struct item *it)
{
	int rc;

	pthread_mutex_lock(&ps->mu);
	while (t->qn == PSEND_MAX_DEPTH && !ps->err)
		wait_checked(ps, it->h);
	rc = ps->err;
	if (rc == 0) {
		t->q[(t->qh + t->qn) % PSEND_MAX_DEPTH] = *it;
		t->qn++;
		ps->busy[it->slot] = true;
		pthread_cond_broadcast(&ps->cv);
	}
	pthread_mutex_unlock(&ps->mu);
	return rc;
}

int psend_range(struct psend *ps, struct xport *x, int fd, uint64_t size, uint64_t idx,
		uint64_t off, uint64_t end, struct codec_params *cp, const struct psend_hooks *h,
		const char *name, char *why, size_t whylen)
{
	int fl = fcntl(fd, F_GETFL), rc = 0;
	bool checked = false;           /* the caller's check stopped it */

	*why = '\0';
	if (ps->broken) {
		snprintf(why, whylen, "reading %s: the piece sender's io_uring failed", name);
		return -EIO;
	}
	ps->fd = fd;
	ps->next = off;
	ps->end = end;
	ps->head = ps->n = 0;
	/* EINVAL (a file system without O_DIRECT): read through the cache. */
	ps->direct = !ps->cached && end - off >= 2 * PSEND_PIECE && off % PSEND_ALIGN == 0 &&
		     fl >= 0 &&
		     !(fl & O_DIRECT) && !pcache_warm(fd, off, end - off) &&
		     fcntl(fd, F_SETFL, fl | O_DIRECT) == 0;
	submit(ps);
	while (off < end) {
		const struct codec_ops *want;
		uint8_t *p = ps->buf[ps->head], *f;
		size_t len, flen, asked;
		uint64_t at;
		struct msg m;

		if (h->hold)
			h->hold(h->arg);
		if (h->check && (rc = h->check(h->arg)) < 0) {
			checked = true;
			break;
		}
		/* Every slot is with a stream: wait for the oldest. */
		if (ps->n == 0) {
			if ((rc = wait_slot(ps, ps->head, h)) < 0)
				break;
			submit(ps);
		}
		hooks_lock(ps);
		want = h->pick ? h->pick(h->arg) : &codec_none_ops;
		hooks_unlock(ps);
		rc = head_ready(ps);
		if (rc == -EINVAL && ps->direct) {
			/* O_DIRECT accepted by fcntl, refused by the read (an
			 * alignment this file system wants bigger): from here
			 * on through the cache. */
			drain(ps);
			fcntl(fd, F_SETFL, fl);
			ps->direct = false;
			ps->next = off;
			ps->head = ps->n = 0;
			ps->fd = fd;
			submit(ps);
			continue;
		}
		if (rc < 0 || ps->off[ps->head] != off) {
			snprintf(why, whylen, "reading %s: %s", name,
				 rc == -ESTALE || rc == 0 ? "it is shorter than its manifest says" :
				 strerror(-rc));
			rc = -ESTALE;
			break;
		}
		asked = ps->len[ps->head];
		len = (size_t)ps->res[ps->head] < asked ? (size_t)ps->res[ps->head] : asked;
		at = ps->off[ps->head];
		/* A range that starts mid-file has no header to read the dtype
		 * from: the trial on this piece decides. Only a codec that uses
		 * it needs it: the trial compresses the piece three times, which
		 * for a raw piece is all cost (a cluster pull's small files paid
		 * it on every file). */
		if (cp->dtype == CODEC_DT_COUNT && (!want || want->id == CODEC_FLOAT))
			cp->dtype = codec_detect_dtype(p, len, at == 0 ? size : len);
		if (ps->nstreams > 1 && ps->turn != 0) {
			/* Another stream's piece: its thread encodes and sends it. */
			rc = hand_over(ps, &ps->st[ps->turn],
				       &(struct item){ .slot = ps->head, .idx = idx, .at = at,
						       .len = len, .want = want, .cp = *cp, .h = h });
			if (rc < 0)
				break;
			next_turn(ps, at + len, size);
			release(ps);
			if (len < asked)
				restart_at(ps, fd, fl, at + len);
			submit(ps);
			off = at + len;
			continue;
		}
		rc = encode(ps, p, len, want, cp, ps->frame, &f, &flen);
		if (rc < 0) {
			snprintf(why, whylen, "encoding %s: %s", name, strerror(-rc));
			break;
		}
		pace_take(ps->cap, flen);
		hooks_lock(ps);
		if (h->before)
			h->before(h->arg);
		hooks_unlock(ps);
		msg_init(&m, MSG_DATA);
		if (idx != PSEND_NO_FILE)
			msg_put_u64(&m, K_FILE, idx);
		msg_put_u64(&m, K_OFFSET, at);
		rc = x->ops->send_tail(x, &m, K_DATA, f, flen);
		msg_free(&m);
		hooks_lock(ps);
		if (h->after)
			h->after(h->arg, rc);
		hooks_unlock(ps);
		next_turn(ps, at + len, size);
		release(ps);
		if (rc < 0)
			break;
		if (len < asked)
			restart_at(ps, fd, fl, at + len);
		submit(ps);
		if (h->sent) {
			hooks_lock(ps);
			h->sent(h->arg, at, len, flen, f[0]);
			hooks_unlock(ps);
		}
		off = at + len;
	}
	drain(ps);
	if (ps->direct)
		fcntl(fd, F_SETFL, fl);
	/* The pieces handed to streams: sent before the range returns. A
	 * failure here loses the copy: the streams drop what they hold, and a
	 * stream blocked in a send is woken (its connection is dead then). */
	if (ps->nstreams > 1) {
		pthread_mutex_lock(&ps->mu);
		if (rc < 0 && checked) {
			stop_checked(ps, rc);
		} else if (rc < 0 && !ps->err) {
			ps->err = rc;
			ps->err_stream = 0;
			for (unsigned j = 1; j < ps->nstreams; j++)
				ps->st[j].x->ops->shutdown(ps->st[j].x);
			pthread_cond_broadcast(&ps->cv);
		}
		for (unsigned i = 0; i < ps->depth; i++)
			while (ps->busy[i])
				wait_checked(ps, h);
		if (rc == 0 && ps->err)
			rc = ps->err;
		pthread_mutex_unlock(&ps->mu);
	}
	return rc;
}
