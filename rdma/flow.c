#include "rdma/flow.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define IMM_SEQ(imm) ((uint16_t)((imm) >> 16))
#define IMM_CREDITS(imm) ((uint32_t)((imm) & 0xffffu))

static unsigned log2_of(uint32_t x)
{
	unsigned s = 0;

	while (x > 1) {
		x >>= 1;
		s++;
	}
	return s;
}

static bool slots_ok(uint32_t nslots, uint32_t slot_size)
{
	unsigned s = log2_of(slot_size);

	return nslots >= RFLOW_MIN_SLOTS && nslots <= RFLOW_MAX_SLOTS &&
	       s >= RFLOW_MIN_SLOT_SHIFT && s <= RFLOW_MAX_SLOT_SHIFT &&
	       slot_size == (uint32_t)1 << s;
}

void rflow_hello_put(uint8_t out[RFLOW_HELLO_LEN], uint32_t nslots, uint32_t slot_size)
{
	out[0] = 'S';
	out[1] = 'R';
	out[2] = RFLOW_VERSION;
	out[3] = 0;
	out[4] = (uint8_t)(nslots & 0xff);
	out[5] = (uint8_t)(nslots >> 8);
	out[6] = (uint8_t)log2_of(slot_size);
	out[7] = 0;
}

int rflow_hello_get(const uint8_t *p, size_t n, uint32_t *nslots, uint32_t *slot_size)
{
	uint32_t ns;

	if (n < RFLOW_HELLO_LEN)
		return -EPROTO;
	/* A reserved byte set is a peer speaking a version we do not know. */
	if (p[0] != 'S' || p[1] != 'R' || p[2] != RFLOW_VERSION || p[3] != 0 || p[7] != 0)
		return -EPROTO;
	ns = (uint32_t)p[4] | (uint32_t)p[5] << 8;
	if (ns < RFLOW_MIN_SLOTS || ns > RFLOW_MAX_SLOTS ||
	    p[6] < RFLOW_MIN_SLOT_SHIFT || p[6] > RFLOW_MAX_SLOT_SHIFT)
		return -EINVAL;
	*nslots = ns;
	*slot_size = (uint32_t)1 << p[6];
	return 0;
}

int rflow_init(struct rflow *f, uint32_t nslots, uint32_t slot_size, uint32_t nsend,
	       uint32_t send_size, uint32_t peer_nslots, uint32_t peer_slot_size)
{
	memset(f, 0, sizeof(*f));
	if (!slots_ok(nslots, slot_size) || !slots_ok(peer_nslots, peer_slot_size) ||
	    nsend < 1 || nsend > RFLOW_MAX_SEND || send_size < 1)
		return -EINVAL;
	/* rflow_read addresses slots as base + slot * slot_size. */
	if ((uint64_t)nslots * slot_size > SIZE_MAX)
		return -EINVAL;
	f->busy_len = calloc(nsend, sizeof(*f->busy_len));
	if (!f->busy_len)
		goto out_nomem;
	f->fifo = calloc(nslots, sizeof(*f->fifo));
	if (!f->fifo)
		goto out_free_busy;
	f->held = calloc(nslots, sizeof(*f->held));
	if (!f->held)
		goto out_free_fifo;
	f->nslots = nslots;
	f->slot_size = slot_size;
	f->nsend = nsend;
	f->send_size = send_size;
	f->peer_nslots = peer_nslots;
	f->peer_slot_size = peer_slot_size;
	f->credits = peer_nslots;
	return 0;

out_free_fifo:
	free(f->fifo);
out_free_busy:
	free(f->busy_len);
out_nomem:
	memset(f, 0, sizeof(*f));
	return -ENOMEM;
}

void rflow_fini(struct rflow *f)
{
	free(f->held);
	free(f->fifo);
	free(f->busy_len);
	memset(f, 0, sizeof(*f));
}

int rflow_error(const struct rflow *f)
{
	return f->err;
}

void rflow_fail(struct rflow *f, int err)
{
	if (!f->err && err < 0)
		f->err = err;
}

static int fail(struct rflow *f, int err)
{
	rflow_fail(f, err);
	return f->err;
}

/* ---- sending ---- */

uint32_t rflow_max_payload(const struct rflow *f)
{
	return f->peer_slot_size < f->send_size ? f->peer_slot_size : f->send_size;
}

bool rflow_can_send_data(const struct rflow *f)
{
	return !f->err && f->credits >= 2 && f->nbusy < f->nsend;
}

bool rflow_want_credit_msg(const struct rflow *f)
{
	/* nslots >= 2, so the threshold is at least one credit. */
	return !f->err && f->owed >= f->nslots / 2 && f->credits >= 1 && f->nbusy < f->nsend;
}

int rflow_send_begin(struct rflow *f, uint32_t len, uint32_t *buf, uint32_t *imm)
{
	uint32_t ret;

	if (f->err)
		return f->err;
	if (len > rflow_max_payload(f))
		return -EINVAL;
	if (f->nbusy == f->nsend)
		return -EAGAIN;
	/* The last credit goes only to a message that returns credits: that
	 * keeps one side able to move (flow.h, deadlock, 1). */
	if (len > 0 ? f->credits < 2 : (f->credits < 1 || f->owed == 0))
		return -EAGAIN;
	*buf = (f->busy_head + f->nbusy) % f->nsend;
	f->busy_len[*buf] = len;
	f->nbusy++;
	f->queued += len;
	f->credits--;
	ret = f->owed < RFLOW_MAX_CREDITS_MSG ? f->owed : RFLOW_MAX_CREDITS_MSG;
	f->owed -= ret;
	*imm = (uint32_t)f->tx_seq << 16 | ret;
	f->tx_seq++;
	return 0;
}

int rflow_send_done(struct rflow *f)
{
	if (f->err)
		return f->err;
	if (f->nbusy == 0)
		return fail(f, -EPROTO);
	f->queued -= f->busy_len[f->busy_head];
	f->busy_len[f->busy_head] = 0;
	f->busy_head = (f->busy_head + 1) % f->nsend;
	f->nbusy--;
	return 0;
}

uint64_t rflow_queued(const struct rflow *f)
{
	return f->queued;
}

/* ---- receiving ---- */

int rflow_recv(struct rflow *f, uint32_t slot, uint32_t len, uint32_t imm, bool *free_now)
{
	uint32_t back = IMM_CREDITS(imm);
	struct rflow_rx *rx;

	*free_now = false;
	if (f->err)
		return f->err;
	if (slot >= f->nslots)
		return fail(f, -EINVAL);
	/* RC delivers in order and whole: a gap is corruption or a bug. */
	if (IMM_SEQ(imm) != f->rx_seq)
		return fail(f, -EPROTO);
	if (len > f->slot_size || f->held[slot])
		return fail(f, -EPROTO);
	/* Every slot queued, free or owed: the peer had no credit to send. */
	if (f->nfifo + f->unposted + f->owed >= f->nslots)
		return fail(f, -EPROTO);
	if (back > f->peer_nslots - f->credits)
		return fail(f, -EPROTO);
	f->rx_seq++;
	f->credits += back;
	if (len == 0) {
		f->unposted++;
		*free_now = true;
		return 0;
	}
	rx = &f->fifo[(f->fifo_head + f->nfifo) % f->nslots];
	rx->slot = slot;
	rx->len = len;
	f->nfifo++;
	f->held[slot] = 1;
	f->readable += len;
	return 0;
}

size_t rflow_readable(const struct rflow *f)
{
	return f->err ? 0 : f->readable;
}

size_t rflow_read(struct rflow *f, const uint8_t *base, uint8_t *out, size_t n, uint32_t *freed,
		  uint32_t *nfreed)
{
	size_t got = 0;

	*nfreed = 0;
	if (f->err)
		return 0;
	while (got < n && f->nfifo > 0) {
		struct rflow_rx *rx = &f->fifo[f->fifo_head];
		size_t left = rx->len - f->head_off;
		size_t k = n - got < left ? n - got : left;

		memcpy(out + got, base + (size_t)rx->slot * f->slot_size + f->head_off, k);
		got += k;
		f->head_off += (uint32_t)k;
		if (f->head_off < rx->len)
			break;
		/* Emptied: give it back now, not on the next read, so the peer
		 * gets its credit as early as possible. */
		f->held[rx->slot] = 0;
		freed[(*nfreed)++] = rx->slot;
		f->unposted++;
		f->head_off = 0;
		f->fifo_head = (f->fifo_head + 1) % f->nslots;
		f->nfifo--;
	}
	f->readable -= got;
	return got;
}

void rflow_reposted(struct rflow *f, uint32_t n)
{
	if (f->err)
		return;
	if (n > f->unposted) {
		rflow_fail(f, -EINVAL);
		return;
	}
	f->unposted -= n;
	f->owed += n;
}
