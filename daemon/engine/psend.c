/* The piece sender (psend.h).
 *
 * Slots form a ring of PSEND_DEPTH reads of one range in file order: head
 * is the oldest, n are in flight or landed. The invariant between calls is
 * n == 0: a range drains what it started before it returns, so the file can
 * be closed and the next range can start anywhere.
 */
#include "daemon/engine/psend.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/proto.h"


int psend_open(struct psend *ps, uint64_t rate)
{
	int rc;

	memset(ps, 0, sizeof(*ps));
	ps->fd = -1;
	pace_init(&ps->pace, rate);
	ps->cap = &ps->pace;
	ps->frame_cap = codec_chunk_bound(PSEND_PIECE);
	ps->frame = malloc(ps->frame_cap);
	if (!ps->frame)
		return -ENOMEM;
	for (unsigned i = 0; i < PSEND_DEPTH; i++) {
		if (posix_memalign((void **)&ps->buf[i], PSEND_ALIGN, PSEND_PIECE) != 0) {
			ps->buf[i] = NULL;
			rc = -ENOMEM;
			goto out_free;
		}
	}
	rc = io_uring_queue_init(PSEND_DEPTH, &ps->ring, 0);
	if (rc < 0)
		goto out_free;
	return 0;
out_free:
	for (unsigned i = 0; i < PSEND_DEPTH; i++)
		free(ps->buf[i]);
	free(ps->frame);
	return rc;
}

void psend_close(struct psend *ps)
{
	io_uring_queue_exit(&ps->ring);
	for (unsigned i = 0; i < PSEND_DEPTH; i++)
		free(ps->buf[i]);
	free(ps->frame);
}

static void submit(struct psend *ps)
{
	while (ps->n < PSEND_DEPTH && ps->next < ps->end) {
		unsigned s = (ps->head + ps->n) % PSEND_DEPTH;
		uint64_t len = ps->end - ps->next < PSEND_PIECE ? ps->end - ps->next : PSEND_PIECE;
		/* A direct read of the range's last piece asks for whole blocks. */
		uint64_t ask = ps->direct ? (len + PSEND_ALIGN - 1) / PSEND_ALIGN * PSEND_ALIGN : len;
		struct io_uring_sqe *sqe = io_uring_get_sqe(&ps->ring);

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
	ps->head = (ps->head + 1) % PSEND_DEPTH;
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

int psend_range(struct psend *ps, struct xport *x, int fd, uint64_t size, uint64_t idx,
		uint64_t off, uint64_t end, struct codec_params *cp, const struct psend_hooks *h,
		const char *name, char *why, size_t whylen)
{
	int fl = fcntl(fd, F_GETFL), rc = 0;

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
	ps->direct = end - off >= 2 * PSEND_PIECE && off % PSEND_ALIGN == 0 && fl >= 0 &&
		     !(fl & O_DIRECT) && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0;
	submit(ps);
	while (off < end) {
		const struct codec_ops *want = h->pick ? h->pick(h->arg) : &codec_none_ops;
		uint8_t *p = ps->buf[ps->head];
		size_t len, flen, asked;
		uint64_t at;
		struct msg m;

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
		rc = codec_chunk_encode(p, len, want, cp, ps->frame, ps->frame_cap, &flen);
		if (rc < 0) {
			snprintf(why, whylen, "encoding %s: %s", name, strerror(-rc));
			break;
		}
		pace_take(ps->cap, flen);
		if (h->before)
			h->before(h->arg);
		msg_init(&m, MSG_DATA);
		if (idx != PSEND_NO_FILE)
			msg_put_u64(&m, K_FILE, idx);
		msg_put_u64(&m, K_OFFSET, at);
		rc = x->ops->send_tail(x, &m, K_DATA, ps->frame, flen);
		msg_free(&m);
		if (h->after)
			h->after(h->arg, rc);
		release(ps);
		if (rc < 0)
			break;
		if (len < asked) {
			/* A short read mid-range: read the rest in order from
			 * here, through the cache (the offset is no longer
			 * aligned). */
			drain(ps);
			if (ps->direct)
				fcntl(fd, F_SETFL, fl);
			ps->direct = false;
			ps->fd = fd;
			ps->next = at + len;
			ps->head = ps->n = 0;
		}
		submit(ps);
		if (h->sent)
			h->sent(h->arg, at, len, flen, ps->frame[0]);
		off = at + len;
	}
	drain(ps);
	if (ps->direct)
		fcntl(fd, F_SETFL, fl);
	return rc;
}
