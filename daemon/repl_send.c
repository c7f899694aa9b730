/* The sender of one partner: takes the oldest copy pending for it, offers
 * the checkpoint, and streams what the receiver wants, piece by piece.
 *
 * Per copy:  OFFER, MANIFEST...  ->  <- WANT (resume point, or "have it")
 *            DATA(file, offset, chunk frame)...  END  ->  <- DONE
 *
 * The connection stays open between copies. When it breaks, the copy goes
 * back to PENDING and the sender reconnects with backoff; the receiver's
 * WANT then says where to resume. A receiver that refuses (MSG_ERROR) costs
 * the copy a try; after REPL_MAX_TRIES it is FAILED.
 *
 * Reads run REPL_DEPTH pieces ahead on the sender's own io_uring, so the
 * disk, the codec and the socket overlap. compress = auto decides per window
 * of pieces from what it measures: the codec's speed and ratio on this data
 * and the rate the link drains at, compressing only when that ships the
 * bytes sooner than sending them raw.
 */
#include "daemon/repl_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/codec.h"
#include "common/log.h"
#include "common/manifest.h"
#include "daemon/peer.h"
#include "daemon/treeops.h"

#define REPL_DEPTH 4
#define BACKOFF_MIN_MS 200
#define BACKOFF_MAX_MS 5000
#define WINDOW_PIECES 16

struct rdahead {                    /* pieces of one file read ahead, in order */
	struct io_uring ring;
	uint8_t *buf[REPL_DEPTH];       /* REPL_PIECE each, owned */
	int res[REPL_DEPTH];            /* bytes read or -errno; INT32_MIN while in flight */
	uint64_t off[REPL_DEPTH];
	unsigned head, n;               /* oldest slot, slots in flight or ready */
	int fd;                         /* the file, borrowed */
	uint64_t next, size;            /* next offset to read, file size */
};

struct zpolicy {                    /* compress = auto's measurements */
	int mode;                       /* enum cfg_compress */
	bool on;                        /* current decision */
	unsigned left;                  /* pieces until the next decision */
	double comp_s, comp_raw, comp_out;   /* time, raw and output bytes compressed */
	double wire_s, wire_bytes;      /* time spent sending and bytes sent */
};

struct sender {
	struct partner *p;
	const struct host *h;
	struct xport *x;                /* NULL while disconnected */
	struct rdahead rd;
	uint8_t *frame;                 /* one encoded piece */
	size_t frame_cap;
	struct zpolicy z;
	unsigned backoff_ms;
	uint64_t tokens_t;              /* rate cap: time (ns) the bucket is drained to */
};

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void rd_submit(struct rdahead *rd)
{
	while (rd->n < REPL_DEPTH && rd->next < rd->size) {
		unsigned s = (rd->head + rd->n) % REPL_DEPTH;
		uint64_t len = rd->size - rd->next < REPL_PIECE ? rd->size - rd->next : REPL_PIECE;
		struct io_uring_sqe *sqe = io_uring_get_sqe(&rd->ring);

		if (!sqe)
			break;
		io_uring_prep_read(sqe, rd->fd, rd->buf[s], (unsigned)len, rd->next);
		io_uring_sqe_set_data64(sqe, s);
		rd->res[s] = INT32_MIN;
		rd->off[s] = rd->next;
		rd->next += len;
		rd->n++;
	}
	io_uring_submit(&rd->ring);
}

static void rd_start(struct rdahead *rd, int fd, uint64_t off, uint64_t size)
{
	rd->fd = fd;
	rd->next = off;
	rd->size = size;
	rd->head = rd->n = 0;
	rd_submit(rd);
}

/* The next piece in order: 0 with *p, *len, or -errno. */
static int rd_next(struct rdahead *rd, uint8_t **p, size_t *len, uint64_t *off)
{
	while (rd->res[rd->head] == INT32_MIN) {
		struct io_uring_cqe *cqe;
		int rc = io_uring_wait_cqe(&rd->ring, &cqe);

		if (rc < 0)
			return rc;
		rd->res[io_uring_cqe_get_data64(cqe)] = cqe->res;
		io_uring_cqe_seen(&rd->ring, cqe);
	}
	if (rd->res[rd->head] < 0)
		return rd->res[rd->head];
	*p = rd->buf[rd->head];
	*len = (size_t)rd->res[rd->head];
	*off = rd->off[rd->head];
	if (*len == 0)
		return -ESTALE;         /* shorter than its manifest says */
	return 0;
}

/* Frees the head slot for the next read ahead. */
static void rd_release(struct rdahead *rd, size_t used, size_t len)
{
	rd->head = (rd->head + 1) % REPL_DEPTH;
	rd->n--;
	if (used < len)
		rd->next = rd->size;    /* a short read: stop; the caller fails */
	rd_submit(rd);
}

/* Waits out what the kernel still holds, so the file can be closed. */
static void rd_drain(struct rdahead *rd)
{
	while (rd->n) {
		if (rd->res[rd->head] == INT32_MIN) {
			struct io_uring_cqe *cqe;

			if (io_uring_wait_cqe(&rd->ring, &cqe) < 0)
				return;
			rd->res[io_uring_cqe_get_data64(cqe)] = cqe->res;
			io_uring_cqe_seen(&rd->ring, cqe);
			continue;
		}
		rd->head = (rd->head + 1) % REPL_DEPTH;
		rd->n--;
	}
}

/* compress = auto: over the last window, would compressed pieces have gone
 * out sooner? Sending raw costs raw/link; compressed, out/link plus the
 * codec's time (one thread does both, so they add). */
static void z_decide(struct zpolicy *z)
{
	double link = z->wire_s > 0 ? z->wire_bytes / z->wire_s : 0;
	double speed = z->comp_s > 0 ? z->comp_raw / z->comp_s : 0;
	double ratio = z->comp_raw > 0 ? z->comp_out / z->comp_raw : 1;

	if (link <= 0 || speed <= 0)
		z->on = true;           /* nothing measured yet: try it */
	else
		z->on = 1.0 / speed + ratio / link < 0.95 / link;
	z->left = WINDOW_PIECES;
	z->comp_s = z->comp_raw = z->comp_out = 0;
	z->wire_s = z->wire_bytes = 0;
}

static const struct codec_ops *z_pick(struct zpolicy *z, bool *trial)
{
	*trial = false;
	switch (z->mode) {
	case CFG_COMPRESS_OFF:
		return &codec_none_ops;
	case CFG_COMPRESS_ZSTD:
		return &codec_zstd_ops;
	case CFG_COMPRESS_FLOAT:
		return NULL;    /* float where the dtype allows, else zstd */
	default:
		if (z->left == 0)
			z_decide(z);
		z->left--;
		/* The first piece of a window is always compressed: a measurement. */
		*trial = z->left == WINDOW_PIECES - 1;
		return z->on || *trial ? NULL : &codec_none_ops;
	}
}

static void rate_wait(struct sender *s, size_t bytes)
{
	uint64_t rate = repl.cfg->rate, now = mono_ns();
	uint64_t cost;

	if (!rate)
		return;
	cost = (uint64_t)((double)bytes * 1e9 / (double)rate);
	if (s->tokens_t < now)
		s->tokens_t = now;
	s->tokens_t += cost;
	/* Allow a burst of a few pieces, then sleep to stay under the cap. */
	if (s->tokens_t > now + 50000000ull) {
		uint64_t d = s->tokens_t - now - 50000000ull;
		struct timespec ts = { .tv_sec = (time_t)(d / 1000000000ull),
				       .tv_nsec = (long)(d % 1000000000ull) };

		nanosleep(&ts, NULL);
	}
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

static int expect(struct xport *x, struct msg *m, uint16_t type, char *why, size_t whylen)
{
	int rc = x->ops->recv(x, m);

	if (rc < 0) {
		snprintf(why, whylen, "%s", rc == -ENOTCONN ? "the peer closed the connection" :
			 strerror(-rc));
		return rc == -ENOTCONN ? -ECONNRESET : rc;
	}
	if (m->type == MSG_ERROR) {
		uint64_t e = EPROTO;
		char *t = NULL;

		msg_get_u64(m, K_ERRNO, &e);
		msg_get_str(m, K_TEXT, &t);
		snprintf(why, whylen, "refused: %s", t ? t : strerror((int)e));
		free(t);
		msg_free(m);
		return -EREMOTEIO;
	}
	if (m->type != type) {
		snprintf(why, whylen, "unexpected frame type %u", m->type);
		msg_free(m);
		return -EBADMSG;
	}
	return 0;
}

/* Sends one file from offset off. */
static int send_file(struct sender *s, int step_fd, uint64_t idx, const struct mf_entry *e,
		     uint64_t off, uint64_t *sent, const char *job, const char *step,
		     uint64_t seq, uint64_t total, char *why, size_t whylen)
{
	const char *base;
	int dir_fd, fd, rc = 0;
	struct stat st;
	struct codec_params cp = { .dtype = CODEC_DT_COUNT };

	dir_fd = treeops_open_parent(step_fd, e->path, &base);
	if (dir_fd < 0) {
		snprintf(why, whylen, "%s: %s", e->path, strerror(-dir_fd));
		return -ESTALE;
	}
	fd = openat(dir_fd, base, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	close(dir_fd);
	if (fd < 0 || fstat(fd, &st) < 0 || (uint64_t)st.st_size != e->size) {
		snprintf(why, whylen, "%s changed or vanished since it was committed", e->path);
		if (fd >= 0)
			close(fd);
		return -ESTALE;
	}
	rd_start(&s->rd, fd, off, e->size);
	while (off < e->size) {
		uint8_t *p;
		size_t len, flen;
		uint64_t at, t0, t1;
		bool trial;
		const struct codec_ops *want;
		struct msg m;

		rc = rd_next(&s->rd, &p, &len, &at);
		if (rc < 0) {
			snprintf(why, whylen, "reading %s: %s", e->path, strerror(-rc));
			rc = -ESTALE;
			break;
		}
		if (cp.dtype == CODEC_DT_COUNT)
			cp.dtype = codec_detect_dtype(p, len, e->size);
		want = z_pick(&s->z, &trial);
		t0 = mono_ns();
		rc = codec_chunk_encode(p, len, want, &cp, s->frame, s->frame_cap, &flen);
		t1 = mono_ns();
		if (rc < 0) {
			snprintf(why, whylen, "encoding %s: %s", e->path, strerror(-rc));
			break;
		}
		if (want != &codec_none_ops) {
			s->z.comp_s += (double)(t1 - t0) / 1e9;
			s->z.comp_raw += (double)len;
			s->z.comp_out += (double)flen;
		}
		rate_wait(s, flen);
		msg_init(&m, MSG_DATA);
		msg_put_u64(&m, K_FILE, idx);
		msg_put_u64(&m, K_OFFSET, at);
		t0 = mono_ns();
		rc = s->x->ops->send_tail(s->x, &m, K_DATA, s->frame, flen);
		t1 = mono_ns();
		msg_free(&m);
		rd_release(&s->rd, len, len);
		if (rc < 0) {
			snprintf(why, whylen, "sending: %s", strerror(-rc));
			break;
		}
		s->z.wire_s += (double)(t1 - t0) / 1e9;
		s->z.wire_bytes += (double)flen;
		off = at + len;
		*sent += len;
		pthread_mutex_lock(&repl.lock);
		s->p->raw += len;
		s->p->wire += flen;
		s->p->codec = codec_by_id(s->frame[0]) ? codec_by_id(s->frame[0])->name : "?";
		pthread_mutex_unlock(&repl.lock);
		set_sent(s, job, step, seq, *sent, total);
	}
	rd_drain(&s->rd);
	close(fd);
	return rc;
}

/* One copy: 0 confirmed; -EREMOTEIO refused (why); -ESTALE the checkpoint
 * changed (why); other -errno: the connection failed (why). */
static int send_copy(struct sender *s, const char *job, const char *step, uint64_t seq,
		     digest_t root, uint64_t total, char *why, size_t whylen)
{
	char rel[2 * CKPT_NAME_MAX + 2], hex[DIGEST_HEX_LEN + 1];
	struct mf_reader *mr = NULL;
	struct mf_entry e;
	struct msg m;
	uint64_t code = 0, want_idx = 0, want_off = 0, idx = 0, sent = 0, mf_size;
	int root_fd, step_fd, mf_fd, rc;
	struct stat st;
	uint8_t *slice;

	snprintf(rel, sizeof(rel), "%s/%s", job, step);
	root_fd = open(repl.cfg->ckpt_root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	step_fd = root_fd < 0 ? -errno : treeops_open_beneath(root_fd, rel);
	if (root_fd >= 0)
		close(root_fd);
	if (step_fd < 0) {
		snprintf(why, whylen, "%s/%s: %s", repl.cfg->ckpt_root, rel, strerror(-step_fd));
		return -ESTALE;
	}
	mf_fd = openat(step_fd, MF_NAME, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (mf_fd < 0 || fstat(mf_fd, &st) < 0) {
		snprintf(why, whylen, "%s/%s/%s: %s", repl.cfg->ckpt_root, rel, MF_NAME,
			 strerror(errno));
		rc = -ESTALE;
		goto out_close_step;
	}
	mf_size = (uint64_t)st.st_size;
	digest_to_hex(root, hex);
	msg_init(&m, MSG_OFFER);
	msg_put_str(&m, K_ORIGIN, repl.cfg->name);
	msg_put_str(&m, K_JOB, job);
	msg_put_str(&m, K_STEP, step);
	msg_put_str(&m, K_ROOT, hex);
	msg_put_u64(&m, K_SIZE, mf_size);
	rc = s->x->ops->send(s->x, &m);
	msg_free(&m);
	slice = malloc(REPL_MF_SLICE);
	for (uint64_t o = 0; rc == 0 && o < mf_size; ) {
		ssize_t n = slice ? pread(mf_fd, slice, REPL_MF_SLICE, (off_t)o) : -1;

		if (n <= 0) {
			snprintf(why, whylen, "reading the manifest of %s: %s", rel,
				 n < 0 ? strerror(errno) : "it shrank");
			rc = -ESTALE;
			break;
		}
		msg_init(&m, MSG_MANIFEST);
		msg_put_u64(&m, K_OFFSET, o);
		rc = s->x->ops->send_tail(s->x, &m, K_DATA, slice, (size_t)n);
		msg_free(&m);
		o += (uint64_t)n;
	}
	free(slice);
	if (rc < 0) {
		if (rc != -ESTALE)
			snprintf(why, whylen, "sending the offer: %s", strerror(-rc));
		goto out_close_mf;
	}
	s->x->ops->set_timeout(s->x, REPL_FINISH_MS);
	rc = expect(s->x, &m, MSG_WANT, why, whylen);
	if (rc < 0)
		goto out_close_mf;
	msg_get_u64(&m, K_CODE, &code);
	msg_get_u64(&m, K_FILE, &want_idx);
	msg_get_u64(&m, K_OFFSET, &want_off);
	msg_free(&m);
	s->x->ops->set_timeout(s->x, REPL_IO_MS);
	if (code == 1) {
		rc = 0;         /* it already holds this very checkpoint */
		goto out_close_mf;
	}
	rc = mf_reader_open(&mr, step_fd, MF_NAME, MF_COMPLETE);
	if (rc < 0) {
		snprintf(why, whylen, "the manifest of %s: %s", rel, strerror(-rc));
		rc = -ESTALE;
		goto out_close_mf;
	}
	while ((rc = mf_reader_next(mr, &e)) == 1) {
		if (idx >= want_idx && e.type == MF_FILE && e.size > 0) {
			uint64_t off = idx == want_idx ? want_off : 0;

			if (idx > want_idx || off == 0)
				; /* whole file */
			else
				sent += off;
			rc = send_file(s, step_fd, idx, &e, off, &sent, job, step, seq, total,
				       why, whylen);
		} else if (e.type == MF_FILE) {
			sent += e.size;
		}
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
		snprintf(why, whylen, "the manifest of %s: %s", rel, mf_reader_why(mr));
	mf_reader_close(mr);
	if (rc < 0)
		goto out_close_mf;
	msg_init(&m, MSG_END);
	rc = s->x->ops->send(s->x, &m);
	msg_free(&m);
	if (rc < 0) {
		snprintf(why, whylen, "sending: %s", strerror(-rc));
		goto out_close_mf;
	}
	s->x->ops->set_timeout(s->x, REPL_FINISH_MS);
	rc = expect(s->x, &m, MSG_DONE, why, whylen);
	s->x->ops->set_timeout(s->x, REPL_IO_MS);
	if (rc == 0) {
		char *t = NULL;

		code = 1;
		msg_get_u64(&m, K_CODE, &code);
		if (code != 0) {
			msg_get_str(&m, K_TEXT, &t);
			snprintf(why, whylen, "refused: %s", t ? t : "no reason given");
			free(t);
			rc = -EREMOTEIO;
		}
		msg_free(&m);
	}
out_close_mf:
	if (mf_fd >= 0)
		close(mf_fd);
out_close_step:
	close(step_fd);
	return rc;
}

static void disconnect(struct sender *s)
{
	if (!s->x)
		return;
	pthread_mutex_lock(&repl.lock);
	s->p->x = NULL;
	pthread_mutex_unlock(&repl.lock);
	s->x->ops->close(s->x);
	s->x = NULL;
}

/* Connects and authenticates, or records why not and sleeps the backoff
 * (waking early when the daemon stops). */
static int connect_peer(struct sender *s)
{
	char why[512], name[AUTH_NAME_MAX + 1];
	struct xport *x;
	int rc;

	rc = xport_tcp_ops.connect(s->h, REPL_HANDSHAKE_MS, &x, why, sizeof(why));
	if (rc == 0) {
		rc = peer_handshake(x, &repl.key, repl.cfg->name, &repl.hosts, s->h->name,
				    REPL_HANDSHAKE_MS, name, sizeof(name), why, sizeof(why));
		if (rc < 0)
			x->ops->close(x);
	}
	pthread_mutex_lock(&repl.lock);
	if (rc == 0) {
		x->ops->set_timeout(x, REPL_IO_MS);
		s->x = x;
		s->p->x = x;
		if (s->p->state != PEER_UP)
			log_info("peer %s: up (tcp, %s)", s->h->name, x->peer);
		s->p->state = PEER_UP;
		s->backoff_ms = 0;
		if (repl.stopping)
			x->ops->shutdown(x);
	} else {
		struct timespec ts;
		uint64_t d;

		if (s->p->state != PEER_DOWN || strcmp(s->p->why, why) != 0)
			log_warn("peer %s: %s", s->h->name, why);
		s->p->state = PEER_DOWN;
		snprintf(s->p->why, sizeof(s->p->why), "%s", why);
		s->backoff_ms = s->backoff_ms ? s->backoff_ms * 2 : BACKOFF_MIN_MS;
		if (s->backoff_ms > BACKOFF_MAX_MS)
			s->backoff_ms = BACKOFF_MAX_MS;
		s->p->retry_at_ns = repl_now_ns() + (uint64_t)s->backoff_ms * 1000000ull;
		d = s->p->retry_at_ns;
		ts.tv_sec = (time_t)(d / 1000000000ull);
		ts.tv_nsec = (long)(d % 1000000000ull);
		while (!repl.stopping && repl_now_ns() < d)
			if (pthread_cond_timedwait(&repl.cond, &repl.lock, &ts) == ETIMEDOUT)
				break;
	}
	pthread_mutex_unlock(&repl.lock);
	return rc;
}

/* After a refusal (a full disk, a damaged piece), a pause before the next
 * try: 0.4, 0.8, 1.6, 3.2 s. Under lock; the daemon's stop cuts it short. */
static void refusal_backoff(unsigned tries)
{
	uint64_t d = repl_now_ns() + (200000000ull << (tries < 5 ? tries : 5));
	struct timespec ts = { .tv_sec = (time_t)(d / 1000000000ull),
			       .tv_nsec = (long)(d % 1000000000ull) };

	while (!repl.stopping && repl_now_ns() < d)
		if (pthread_cond_timedwait(&repl.cond, &repl.lock, &ts) == ETIMEDOUT)
			break;
}

/* The oldest copy this partner still needs: under lock. */
static struct record *next_copy(size_t i)
{
	for (struct record *r = repl.records; r; r = r->next)
		if (r->state == R_READY && r->copies[i].state == C_PENDING)
			return r;
	return NULL;
}

void *repl_send_main(void *arg)
{
	struct partner *p = arg;
	size_t i = (size_t)(p - repl.partners);
	struct sender s = { .p = p, .h = &repl.hosts.v[p->host] };
	int rc;

	s.z.mode = repl.cfg->compress;
	s.frame_cap = codec_chunk_bound(REPL_PIECE);
	s.frame = malloc(s.frame_cap);
	rc = io_uring_queue_init(REPL_DEPTH * 2, &s.rd.ring, 0);
	for (int k = 0; k < REPL_DEPTH; k++) {
		s.rd.buf[k] = malloc(REPL_PIECE);
		if (!s.rd.buf[k])
			rc = -ENOMEM;
	}
	if (rc < 0 || !s.frame) {
		log_err("sender to %s: cannot start: %s", s.h->name, strerror(rc < 0 ? -rc : ENOMEM));
		goto out_free;
	}
	pthread_mutex_lock(&repl.lock);
	while (!repl.stopping) {
		char job[CKPT_NAME_MAX + 1], step[CKPT_NAME_MAX + 1], why[1024] = "";
		struct record *r = next_copy(i);
		uint64_t seq, total;
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
		r->copies[i].state = C_SENDING;
		r->copies[i].sent = 0;
		r->copies[i].total = total;
		pthread_mutex_unlock(&repl.lock);

		rc = s.x ? 0 : connect_peer(&s);
		if (rc == 0) {
			rc = send_copy(&s, job, step, seq, root, total, why, sizeof(why));
			/* A failure may leave either side mid-offer: start afresh. */
			if (rc < 0)
				disconnect(&s);
		}
		pthread_mutex_lock(&repl.lock);
		r = repl_rec_find(job, step);
		if (!r || r->seq != seq || r->copies[i].state != C_SENDING)
			continue;       /* committed again or dropped meanwhile */
		if (rc == 0) {
			r->copies[i].state = C_CONFIRMED;
			r->copies[i].why[0] = '\0';
			r->copies[i].tries = 0;
			log_info("%s/%s: confirmed on %s", job, step, s.h->name);
			repl_rec_save(r);
		} else if (rc == -EREMOTEIO || rc == -ESTALE) {
			snprintf(r->copies[i].why, sizeof(r->copies[i].why), "%s", why);
			log_warn("%s/%s to %s: %s", job, step, s.h->name, why);
			r->copies[i].state = rc == -ESTALE || ++r->copies[i].tries >= REPL_MAX_TRIES ?
				C_FAILED : C_PENDING;
			if (r->copies[i].state == C_PENDING)
				refusal_backoff(r->copies[i].tries);
		} else {
			r->copies[i].state = C_PENDING;
			if (why[0] && p->state == PEER_UP) {
				log_warn("%s/%s to %s: %s; will resume", job, step, s.h->name, why);
				p->state = PEER_DOWN;
				snprintf(p->why, sizeof(p->why), "%s", why);
			}
		}
		pthread_cond_broadcast(&repl.cond);
	}
	pthread_mutex_unlock(&repl.lock);
out_free:
	disconnect(&s);
	for (int k = 0; k < REPL_DEPTH; k++)
		free(s.rd.buf[k]);
	if (rc != -ENOMEM)
		io_uring_queue_exit(&s.rd.ring);
	free(s.frame);
	codec_thread_end();
	return NULL;
}
