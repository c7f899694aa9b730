/* rdma/flow.c's main proof: two flows wired back to back by a model of an
 * RC QP pair (in-order wire, receives filled in posting order, send
 * completions after delivery, an RNR being a failure), both sending a
 * stream of pseudo-random bytes in frames of random sizes, steps interleaved
 * at random from a seed, over configurations from the least there can be
 * (two slots, one send buffer) to wide and asymmetric ones, slow readers and
 * one-way streams. Every stream must arrive byte-exact, the credit books
 * must balance after every step, no message may find no receive posted, and
 * it must never stall: no step possible, or too long without a byte read,
 * fails. The unit tests of each call are in test_rdma_flow.c. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rdma/flow.h"

/* ---- Two peers back to back ---- */

struct sim_side_cfg {
	uint32_t nslots, slot_size, nsend, send_size;
	size_t bytes;            /* the stream this side sends */
	unsigned read_weight;    /* chance of a read step, against 8 for the others */
	size_t read_max;         /* bytes a read asks for, at most */
};

struct sim_cfg {
	const char *name;
	struct sim_side_cfg side[2];
	bool eager;              /* also send credit-only messages before they are due */
	unsigned seeds;
};

#define RING 64                 /* room for nslots and nsend of every config */

struct wr {                     /* a posted send, or a receive completion */
	uint32_t at, len, imm;  /* at: the send buffer, or the slot */
};

struct side {
	const struct sim_side_cfg *c;
	struct rflow f;
	uint8_t *slots;         /* receive memory: nslots * slot_size */
	uint8_t *sbuf;          /* send buffers: nsend * send_size */
	/* Posted sends, oldest first: the first ndelivered have reached the
	 * peer (their completions are due), the rest are on the wire. Rings
	 * of RING entries. */
	struct wr wr[RING];
	uint32_t wr_head, nwr, ndelivered;
	uint32_t rq[RING];      /* posted receives, filled in posting order */
	uint32_t rq_head, nrq;
	struct wr cq[RING];     /* receive completions not yet polled */
	uint32_t cq_head, ncq;
	uint32_t freed[RING];   /* free slots, not yet re-posted */
	uint32_t nfreed;
	uint8_t *out;            /* the stream to send */
	size_t sent, frame_left;
	size_t got;              /* bytes of the peer's stream read */
	uint8_t *tmp;
	uint64_t msgs, credit_msgs;
};

struct sim {
	const struct sim_cfg *cfg;
	uint64_t seed, rng, step;
	struct side s[2];
};

#define SIM_CHECK(sim, cond)                                                                      \
	do {                                                                                      \
		if (!(cond))                                                                      \
			fail_msg("%s seed %llu step %llu: %s", (sim)->cfg->name,                  \
				 (unsigned long long)(sim)->seed, (unsigned long long)(sim)->step, \
				 #cond);                                                          \
	} while (0)

static uint64_t next(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t rnd(struct sim *sim, uint64_t n)
{
	return next(&sim->rng) % n;
}

#define POISON 0xa5

static void side_init(struct sim *sim, int i)
{
	struct side *s = &sim->s[i];
	const struct sim_side_cfg *c = &sim->cfg->side[i], *p = &sim->cfg->side[!i];
	uint64_t x = sim->seed * 2 + (uint64_t)i;

	memset(s, 0, sizeof(*s));
	s->c = c;
	assert_true(c->nslots <= RING && c->nsend <= RING);
	assert_int_equal(rflow_init(&s->f, c->nslots, c->slot_size, c->nsend, c->send_size,
				    p->nslots, p->slot_size), 0);
	s->slots = malloc((size_t)c->nslots * c->slot_size);
	s->sbuf = malloc((size_t)c->nsend * c->send_size);
	s->out = malloc(c->bytes + 1);
	s->tmp = malloc(c->read_max);
	assert_true(s->slots && s->sbuf && s->out && s->tmp);
	memset(s->slots, POISON, (size_t)c->nslots * c->slot_size);
	memset(s->sbuf, POISON, (size_t)c->nsend * c->send_size);
	for (size_t k = 0; k < c->bytes; k += 8) {
		uint64_t v = next(&x);

		memcpy(s->out + k, &v, c->bytes - k < 8 ? c->bytes - k : 8);
	}
	/* Every slot is posted before the connection is up. */
	for (uint32_t k = 0; k < c->nslots; k++)
		s->rq[s->nrq++] = k;
}

static void side_fini(struct side *s)
{
	rflow_fini(&s->f);
	free(s->slots);
	free(s->sbuf);
	free(s->out);
	free(s->tmp);
}

/* The books, for the slots of side r (the receiver) that side t fills:
 * every slot is at t's disposal (a credit), on the wire, completed and not
 * polled, queued, free, owed, or being returned (credits on r's messages
 * that t has not polled yet). And the posted receives cover at least what
 * t may send: no message ever finds no receive (an RNR). And what t is
 * refused is refused: with data and no right to send it, -EAGAIN, and
 * nothing changes. */
static void check_books(struct sim *sim, int r)
{
	struct side *R = &sim->s[r], *T = &sim->s[!r];
	uint64_t wire_t = T->nwr - T->ndelivered, back = 0, sum, busy = 0;
	uint32_t buf, imm, credits = T->f.credits, owed = T->f.owed;

	for (uint32_t k = R->ndelivered; k < R->nwr; k++)
		back += R->wr[(R->wr_head + k) % RING].imm & 0xffff;
	for (uint32_t k = 0; k < T->ncq; k++)
		back += T->cq[(T->cq_head + k) % RING].imm & 0xffff;
	sum = T->f.credits + wire_t + R->ncq + R->f.nfifo + R->f.unposted + R->f.owed + back;
	SIM_CHECK(sim, sum == R->c->nslots);
	SIM_CHECK(sim, R->f.unposted == R->nfreed);
	SIM_CHECK(sim, R->nrq == R->c->nslots - R->ncq - R->f.nfifo - R->nfreed);
	SIM_CHECK(sim, R->nrq >= T->f.credits + wire_t);
	SIM_CHECK(sim, T->f.credits <= R->c->nslots);

	for (uint32_t k = 0; k < T->nwr; k++)
		busy += T->wr[(T->wr_head + k) % RING].len;
	SIM_CHECK(sim, rflow_queued(&T->f) == busy);
	SIM_CHECK(sim, T->f.nbusy == T->nwr);
	SIM_CHECK(sim, rflow_error(&R->f) == 0);

	if (T->sent < T->c->bytes && !rflow_can_send_data(&T->f)) {
		SIM_CHECK(sim, rflow_send_begin(&T->f, 1, &buf, &imm) == -EAGAIN);
		SIM_CHECK(sim, T->f.credits == credits && T->f.owed == owed);
	}
}

static bool has_data(const struct side *s)
{
	return s->sent < s->c->bytes;
}

enum act { SEND_DATA, SEND_CREDIT, SEND_EAGER, DELIVER, SEND_DONE, POLL, READ, REPOST, NACT };

/* How likely each step of side s is now; 0: not possible. */
static void weigh(struct sim *sim, struct side *s, unsigned *w)
{
	struct rflow *f = &s->f;
	bool data = has_data(s) && rflow_can_send_data(f);

	w[SEND_DATA] = data ? 8 : 0;
	/* As the verbs layer must: due, and no data going out instead. */
	w[SEND_CREDIT] = rflow_want_credit_msg(f) && !data ? 8 : 0;
	w[SEND_EAGER] = sim->cfg->eager && f->credits > 0 && f->nbusy < f->nsend ? 2 : 0;
	w[DELIVER] = s->nwr > s->ndelivered ? 8 : 0;
	w[SEND_DONE] = s->ndelivered > 0 ? 8 : 0;
	w[POLL] = s->ncq > 0 ? 8 : 0;
	w[READ] = rflow_readable(f) > 0 ? s->c->read_weight : 0;
	w[REPOST] = s->nfreed > 0 ? 8 : 0;
}

/* Begins and posts a message of len bytes; false if refused (-EAGAIN). */
static bool post(struct sim *sim, struct side *s, uint32_t len)
{
	uint32_t buf, imm;
	int rc = rflow_send_begin(&s->f, len, &buf, &imm);

	if (rc == -EAGAIN)
		return false;
	SIM_CHECK(sim, rc == 0);
	SIM_CHECK(sim, s->nwr < s->c->nsend);
	SIM_CHECK(sim, buf < s->c->nsend);
	for (uint32_t k = 0; k < s->nwr; k++)
		SIM_CHECK(sim, s->wr[(s->wr_head + k) % RING].at != buf);
	SIM_CHECK(sim, (imm >> 16) == (s->msgs & 0xffff));
	memcpy(s->sbuf + (size_t)buf * s->c->send_size, s->out + s->sent, len);
	s->wr[(s->wr_head + s->nwr++) % RING] = (struct wr){ buf, len, imm };
	s->msgs++;
	return true;
}

/* A frame: mostly small ones, some of exactly k messages, some long. */
static size_t frame_size(struct sim *sim, uint32_t maxp)
{
	switch (rnd(sim, 8)) {
	case 0: case 1: case 2: case 3:
		return 1 + rnd(sim, 64);
	case 4: case 5:
		return 1 + rnd(sim, maxp);
	case 6:
		return maxp * (1 + rnd(sim, 4));
	default:
		return 1 + rnd(sim, 8 * (uint64_t)maxp);
	}
}

/* The next message of the current frame: a frame of N bytes goes as
 * ceil(N / max_payload) messages. */
static void send_data(struct sim *sim, struct side *s, struct side *p)
{
	uint32_t maxp = rflow_max_payload(&s->f);
	uint32_t len;

	if (s->frame_left == 0) {
		size_t left = s->c->bytes - s->sent, n = frame_size(sim, maxp);

		s->frame_left = n < left ? n : left;
	}
	len = (uint32_t)(s->frame_left < maxp ? s->frame_left : maxp);
	SIM_CHECK(sim, post(sim, s, len));
	s->sent += len;
	s->frame_left -= len;
}

static void deliver(struct sim *sim, struct side *s, struct side *p)
{
	struct wr *w = &s->wr[(s->wr_head + s->ndelivered) % RING];
	uint32_t slot;

	SIM_CHECK(sim, p->nrq > 0);     /* an RNR: a credit without a receive */
	SIM_CHECK(sim, w->len <= p->c->slot_size);
	slot = p->rq[p->rq_head];
	p->rq_head = (p->rq_head + 1) % RING;
	p->nrq--;
	memcpy(p->slots + (size_t)slot * p->c->slot_size, s->sbuf + (size_t)w->at * s->c->send_size,
	       w->len);
	SIM_CHECK(sim, p->ncq < p->c->nslots);
	p->cq[(p->cq_head + p->ncq++) % RING] = (struct wr){ slot, w->len, w->imm };
	s->ndelivered++;
}

static void send_done(struct sim *sim, struct side *s, struct side *p)
{
	struct wr *w = &s->wr[s->wr_head];

	SIM_CHECK(sim, rflow_send_done(&s->f) == 0);
	/* Poisoned, so a buffer handed out while still on the wire shows. */
	memset(s->sbuf + (size_t)w->at * s->c->send_size, POISON, w->len);
	s->wr_head = (s->wr_head + 1) % RING;
	s->nwr--;
	s->ndelivered--;
}

static void poll_recv(struct sim *sim, struct side *s, struct side *p)
{
	struct wr e = s->cq[s->cq_head];
	bool free_now = false;

	s->cq_head = (s->cq_head + 1) % RING;
	s->ncq--;
	SIM_CHECK(sim, rflow_recv(&s->f, e.at, e.len, e.imm, &free_now) == 0);
	SIM_CHECK(sim, free_now == (e.len == 0));
	if (free_now)
		s->freed[s->nfreed++] = e.at;
}

static void read_some(struct sim *sim, struct side *s, struct side *p)
{
	size_t avail = rflow_readable(&s->f), n = 1 + rnd(sim, s->c->read_max), k;
	uint32_t nf = 0;

	k = rflow_read(&s->f, s->slots, s->tmp, n, s->freed + s->nfreed, &nf);
	SIM_CHECK(sim, k == (n < avail ? n : avail));
	SIM_CHECK(sim, s->got + k <= p->c->bytes);
	SIM_CHECK(sim, memcmp(s->tmp, p->out + s->got, k) == 0);
	s->got += k;
	s->nfreed += nf;
	SIM_CHECK(sim, s->nfreed <= s->c->nslots);
}

static void repost(struct sim *sim, struct side *s, struct side *p)
{
	uint32_t n = 1 + (uint32_t)rnd(sim, s->nfreed);

	for (uint32_t k = 0; k < n; k++) {
		uint32_t slot = s->freed[k];

		memset(s->slots + (size_t)slot * s->c->slot_size, POISON, s->c->slot_size);
		s->rq[(s->rq_head + s->nrq++) % RING] = slot;
	}
	memmove(s->freed, s->freed + n, (s->nfreed - n) * sizeof(*s->freed));
	s->nfreed -= n;
	rflow_reposted(&s->f, n);
}

static void send_credit(struct sim *sim, struct side *s, struct side *p)
{
	SIM_CHECK(sim, post(sim, s, 0));
	s->credit_msgs++;
}

/* Tried whenever a credit and a buffer are free: refused only when nothing
 * is owed, for a message returning no credit must not spend the last one. */
static void send_eager(struct sim *sim, struct side *s, struct side *p)
{
	if (post(sim, s, 0))
		s->credit_msgs++;
	else
		SIM_CHECK(sim, s->f.owed == 0);
}

static void (*const acts[NACT])(struct sim *, struct side *, struct side *) = {
	[SEND_DATA] = send_data, [SEND_CREDIT] = send_credit, [SEND_EAGER] = send_eager,
	[DELIVER] = deliver, [SEND_DONE] = send_done, [POLL] = poll_recv, [READ] = read_some,
	[REPOST] = repost,
};

#define SIM_MAX_STEPS 50000000ull
#define SIM_MAX_IDLE 1000000ull         /* steps without a byte read */

struct sim_stats {
	uint64_t steps, msgs, credit_msgs;
};

static void sim_run(const struct sim_cfg *cfg, uint64_t seed, struct sim_stats *st)
{
	struct sim sim = { .cfg = cfg, .seed = seed, .rng = seed * 0x2545f4914f6cdd1dull + 1 };
	uint64_t idle = 0;

	side_init(&sim, 0);
	side_init(&sim, 1);
	while (sim.s[0].got < cfg->side[1].bytes || sim.s[1].got < cfg->side[0].bytes) {
		unsigned w[2 * NACT], total = 0, n;
		uint64_t pick, got = sim.s[0].got + sim.s[1].got;
		bool deadlock, stalled;

		weigh(&sim, &sim.s[0], w);
		weigh(&sim, &sim.s[1], w + NACT);
		for (n = 0; n < 2 * NACT; n++)
			total += w[n];
		deadlock = total == 0;          /* no step possible, streams unfinished */
		SIM_CHECK(&sim, !deadlock);
		pick = rnd(&sim, total);
		for (n = 0; pick >= w[n]; n++)
			pick -= w[n];
		acts[n % NACT](&sim, &sim.s[n / NACT], &sim.s[!(n / NACT)]);
		sim.step++;
		check_books(&sim, 0);
		check_books(&sim, 1);
		idle = sim.s[0].got + sim.s[1].got > got ? 0 : idle + 1;
		stalled = idle >= SIM_MAX_IDLE; /* moving, but never a byte read */
		SIM_CHECK(&sim, !stalled);
		SIM_CHECK(&sim, sim.step < SIM_MAX_STEPS);
	}
	for (int i = 0; i < 2; i++) {
		SIM_CHECK(&sim, sim.s[i].sent == cfg->side[i].bytes);
		SIM_CHECK(&sim, rflow_readable(&sim.s[i].f) == 0);
		st->msgs += sim.s[i].msgs;
		st->credit_msgs += sim.s[i].credit_msgs;
	}
	st->steps += sim.step;
	side_fini(&sim.s[0]);
	side_fini(&sim.s[1]);
}

#define MIB (1024 * 1024)

/* Per side: nslots, slot_size, nsend, send_size, bytes to send, read
 * weight, read_max. */
static const struct sim_cfg sims[] = {
	/* The brief's case: 4 slots of 4 KiB, 2 send buffers, 1 MiB each way. */
	{ "sim: both ways",
	  { { 4, 4096, 2, 4096, MIB, 8, 8192 }, { 4, 4096, 2, 4096, MIB, 8, 8192 } }, false, 200 },
	/* B reads rarely and little: A stalls on credits, never for good. */
	{ "sim: slow reader",
	  { { 4, 4096, 2, 4096, MIB, 8, 8192 }, { 4, 4096, 2, 4096, MIB, 1, 300 } }, false, 64 },
	{ "sim: both slow",
	  { { 4, 4096, 2, 4096, MIB, 1, 700 }, { 4, 4096, 2, 4096, MIB, 1, 1500 } }, false, 32 },
	/* The least there can be: two slots and one send buffer a side. */
	{ "sim: minimal",
	  { { 2, 4096, 1, 4096, MIB, 8, 8192 }, { 2, 4096, 1, 4096, MIB, 8, 8192 } }, false, 128 },
	/* Unlike sides: A's messages up to 64 KiB, B's cut by its 3000-byte
	 * send buffers; an odd slot count; more send buffers than peer slots. */
	{ "sim: asymmetric",
	  { { 5, 4096, 1, 65536, MIB, 8, 100000 }, { 16, 65536, 24, 3000, MIB / 3, 4, 5000 } },
	  false, 64 },
	/* B sends nothing: A's credits come back only in credit-only messages. */
	{ "sim: one way",
	  { { 4, 4096, 2, 4096, MIB, 8, 8192 }, { 4, 4096, 2, 4096, 0, 8, 8192 } }, false, 64 },
	/* B sends a little, reads slowly, and falls silent. */
	{ "sim: one way, a little back",
	  { { 4, 4096, 2, 4096, MIB, 8, 8192 }, { 3, 4096, 2, 4096, 5000, 2, 64 } }, false, 64 },
	/* Credit-only messages also tried whenever a credit and a buffer are free. */
	{ "sim: eager credits",
	  { { 4, 4096, 2, 4096, MIB, 8, 8192 }, { 2, 8192, 3, 8192, MIB, 2, 3000 } }, true, 128 },
	/* Many slots, many send buffers, large slots. */
	{ "sim: wide",
	  { { 64, 16384, 16, 16384, 4 * MIB, 8, 65536 },
	    { 32, 8192, 8, 16384, 4 * MIB, 8, 20000 } }, false, 8 },
};

static void test_sim(void **state)
{
	const struct sim_cfg *cfg = *state;
	struct sim_stats st = { 0 };

	for (uint64_t seed = 1; seed <= cfg->seeds; seed++)
		sim_run(cfg, seed, &st);
	print_message("%s: %u seeds, %llu steps, %llu messages, %llu credit-only\n", cfg->name,
		      cfg->seeds, (unsigned long long)st.steps, (unsigned long long)st.msgs,
		      (unsigned long long)st.credit_msgs);
}

#define NSIMS (sizeof(sims) / sizeof(sims[0]))
#define SIM(k) { sims[k].name, test_sim, NULL, NULL, (void *)&sims[k] }

int main(void)
{
	const struct CMUnitTest tests[] = {
		SIM(0), SIM(1), SIM(2), SIM(3), SIM(4), SIM(5), SIM(6), SIM(7), SIM(8),
	};

	_Static_assert(NSIMS == 9, "a SIM() entry for each of sims[]");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
