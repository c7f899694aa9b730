/* rdma/flow.c, the RDMA transport's bookkeeping, without a device: the
 * hello, credits (the reserved last credit, owed credits riding on every
 * message, the credit-only trigger), sequence numbers, receive slots, the
 * send buffer ring, and sticky errors. Then the main proof: two flows wired
 * back to back by a model of an RC QP pair (in-order wire, receives filled
 * in posting order, send completions after delivery, an RNR being a
 * failure), both sending a stream of pseudo-random bytes in frames of random
 * sizes, steps interleaved at random from a seed. Every stream must arrive
 * byte-exact, the credit books must balance after every step, and it must
 * never stall: no step possible, or too long without a byte read, fails. */
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

/* ---- Helpers ---- */

static uint32_t IMM(uint32_t seq, uint32_t credits)
{
	return (seq & 0xffffu) << 16 | credits;
}

static void init(struct rflow *f, uint32_t nslots, uint32_t nsend, uint32_t peer_nslots)
{
	assert_int_equal(rflow_init(f, nslots, 4096, nsend, 4096, peer_nslots, 4096), 0);
}

/* A message of len bytes (no credits back) at sequence seq into slot. */
static void recv_ok(struct rflow *f, uint32_t slot, uint32_t len, uint32_t seq, uint32_t credits)
{
	bool free_now = false;

	assert_int_equal(rflow_recv(f, slot, len, IMM(seq, credits), &free_now), 0);
	assert_int_equal(free_now, len == 0);
}

/* n zero-length messages from seq on, each re-posted at once: owed += n. */
static void owe(struct rflow *f, uint32_t n, uint32_t *seq)
{
	for (uint32_t i = 0; i < n; i++) {
		recv_ok(f, 0, 0, (*seq)++, 0);
		rflow_reposted(f, 1);
	}
}

/* ---- Hello ---- */

static void test_hello_roundtrip(void **state)
{
	static const uint32_t ns[] = { 2, 3, 255, 256, 258, 4095, 4096 };
	uint8_t h[RFLOW_HELLO_LEN];
	uint8_t padded[56];
	uint32_t n, sz;

	for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++) {
		for (unsigned s = 12; s <= 20; s++) {
			rflow_hello_put(h, ns[i], 1u << s);
			assert_int_equal(rflow_hello_get(h, sizeof(h), &n, &sz), 0);
			assert_int_equal(n, ns[i]);
			assert_int_equal(sz, 1u << s);
		}
	}

	/* The bytes, exactly. */
	rflow_hello_put(h, 0x0102, 65536);
	assert_memory_equal(h, "SR\x01\x00\x02\x01\x10\x00", 8);

	/* RDMA CM pads private data: what follows the 8 bytes is ignored. */
	memset(padded, 0xee, sizeof(padded));
	rflow_hello_put(padded, 4, 4096);
	assert_int_equal(rflow_hello_get(padded, sizeof(padded), &n, &sz), 0);
	assert_int_equal(n, 4);
	assert_int_equal(sz, 4096);
}

static void expect_hello(const uint8_t *h, size_t len, int err)
{
	uint32_t n = 77, sz = 88;

	assert_int_equal(rflow_hello_get(h, len, &n, &sz), err);
	assert_int_equal(n, 77);        /* untouched on failure */
	assert_int_equal(sz, 88);
}

/* A good hello with byte i set to v, and with bytes 4-5 saying nslots. */
static void expect_byte(size_t i, uint8_t v, int err)
{
	uint8_t h[RFLOW_HELLO_LEN];

	rflow_hello_put(h, 16, 65536);
	h[i] = v;
	expect_hello(h, sizeof(h), err);
}

static void expect_nslots(uint32_t nslots, int err)
{
	uint8_t h[RFLOW_HELLO_LEN];

	rflow_hello_put(h, 16, 65536);
	h[4] = (uint8_t)nslots;
	h[5] = (uint8_t)(nslots >> 8);
	expect_hello(h, sizeof(h), err);
}

static void test_hello_reject(void **state)
{
	uint8_t h[RFLOW_HELLO_LEN];

	rflow_hello_put(h, 16, 65536);
	for (size_t len = 0; len < RFLOW_HELLO_LEN; len++)
		expect_hello(h, len, -EPROTO);
	expect_hello(NULL, 0, -EPROTO);

	/* Not ours: magic, version, reserved bytes. */
	expect_byte(0, 's', -EPROTO);
	expect_byte(1, 'r', -EPROTO);
	expect_byte(2, 0, -EPROTO);
	expect_byte(2, 2, -EPROTO);
	expect_byte(3, 1, -EPROTO);
	expect_byte(7, 0x80, -EPROTO);

	/* Ours, with values out of range. */
	expect_nslots(0, -EINVAL);
	expect_nslots(1, -EINVAL);
	expect_nslots(4097, -EINVAL);
	expect_nslots(0x1002, -EINVAL);         /* 4098: the high byte counts */
	expect_nslots(0xffff, -EINVAL);
	expect_byte(6, 0, -EINVAL);
	expect_byte(6, 11, -EINVAL);    /* 2 KiB slots */
	expect_byte(6, 21, -EINVAL);    /* 2 MiB */
	expect_byte(6, 255, -EINVAL);
}

/* ---- Init ---- */

static void test_init(void **state)
{
	struct rflow f;
	uint32_t buf, imm;

	assert_int_equal(rflow_init(&f, 1, 4096, 2, 4096, 4, 4096), -EINVAL);
	assert_int_equal(rflow_init(&f, 4097, 4096, 2, 4096, 4, 4096), -EINVAL);
	assert_int_equal(rflow_init(&f, 4, 2048, 2, 4096, 4, 4096), -EINVAL);
	assert_int_equal(rflow_init(&f, 4, 6000, 2, 4096, 4, 4096), -EINVAL);
	assert_int_equal(rflow_init(&f, 4, 1u << 21, 2, 4096, 4, 4096), -EINVAL);
	assert_int_equal(rflow_init(&f, 4, 0, 2, 4096, 4, 4096), -EINVAL);
	assert_int_equal(rflow_init(&f, 4, 4096, 0, 4096, 4, 4096), -EINVAL);
	assert_int_equal(rflow_init(&f, 4, 4096, RFLOW_MAX_SEND + 1, 4096, 4, 4096), -EINVAL);
	assert_int_equal(rflow_init(&f, 4, 4096, 2, 0, 4, 4096), -EINVAL);
	assert_int_equal(rflow_init(&f, 4, 4096, 2, 4096, 1, 4096), -EINVAL);
	assert_int_equal(rflow_init(&f, 4, 4096, 2, 4096, 4, 12345), -EINVAL);
	rflow_fini(&f);                 /* harmless after a failed init */

	assert_int_equal(rflow_init(&f, RFLOW_MAX_SLOTS, 1u << 20, RFLOW_MAX_SEND, 1u << 20,
				    RFLOW_MAX_SLOTS, 1u << 20), 0);
	assert_int_equal(f.credits, 4096);
	assert_int_equal(rflow_error(&f), 0);
	assert_int_equal(rflow_queued(&f), 0);
	assert_int_equal(rflow_readable(&f), 0);
	rflow_fini(&f);
	rflow_fini(&f);                 /* and twice */

	/* The payload a message may carry: what the peer's slot and our buffer hold. */
	assert_int_equal(rflow_init(&f, 4, 4096, 2, 65536, 4, 4096), 0);
	assert_int_equal(rflow_max_payload(&f), 4096);
	rflow_fini(&f);
	assert_int_equal(rflow_init(&f, 4, 4096, 2, 3000, 4, 65536), 0);
	assert_int_equal(rflow_max_payload(&f), 3000);

	/* Too long changes nothing and is not an error of the flow. */
	assert_int_equal(rflow_send_begin(&f, 3001, &buf, &imm), -EINVAL);
	assert_int_equal(rflow_error(&f), 0);
	assert_int_equal(f.credits, 4);
	assert_int_equal(rflow_send_begin(&f, 3000, &buf, &imm), 0);
	assert_int_equal(imm, IMM(0, 0));
	rflow_fini(&f);
}

/* ---- Credits ---- */

static void test_credits_last_reserved(void **state)
{
	struct rflow f;
	uint32_t buf, imm, seq = 0;

	init(&f, 8, 8, 4);
	for (uint32_t i = 0; i < 3; i++) {
		assert_true(rflow_can_send_data(&f));
		assert_int_equal(rflow_send_begin(&f, 100, &buf, &imm), 0);
		assert_int_equal(imm, IMM(i, 0));
	}
	/* One credit: no data, and no credit-only message with nothing owed. */
	assert_int_equal(f.credits, 1);
	assert_false(rflow_can_send_data(&f));
	assert_int_equal(rflow_send_begin(&f, 100, &buf, &imm), -EAGAIN);
	assert_int_equal(rflow_send_begin(&f, 1, &buf, &imm), -EAGAIN);
	assert_int_equal(rflow_send_begin(&f, 0, &buf, &imm), -EAGAIN);
	assert_false(rflow_want_credit_msg(&f));

	/* Owing one (below the trigger of 4) still allows a credit-only. */
	owe(&f, 1, &seq);
	assert_false(rflow_want_credit_msg(&f));
	assert_int_equal(rflow_send_begin(&f, 0, &buf, &imm), 0);
	assert_int_equal(imm, IMM(3, 1));
	assert_int_equal(f.credits, 0);
	assert_int_equal(f.owed, 0);

	/* No credit: nothing at all, whatever is owed. */
	owe(&f, 4, &seq);
	assert_int_equal(f.owed, 4);
	assert_false(rflow_want_credit_msg(&f));
	assert_false(rflow_can_send_data(&f));
	assert_int_equal(rflow_send_begin(&f, 0, &buf, &imm), -EAGAIN);
	assert_int_equal(rflow_send_begin(&f, 10, &buf, &imm), -EAGAIN);

	/* One credit back: the credit message is due; two: data again. */
	recv_ok(&f, 1, 0, seq++, 1);
	assert_true(rflow_want_credit_msg(&f));
	assert_false(rflow_can_send_data(&f));
	recv_ok(&f, 2, 0, seq++, 1);
	assert_true(rflow_can_send_data(&f));
	assert_int_equal(rflow_error(&f), 0);
	rflow_fini(&f);
}

/* Owed credits ride on the next message, all of them up to 65535. */
static void test_owed_piggyback(void **state)
{
	struct rflow f;
	uint8_t mem[8 * 4096] = { 0 }, out[64];
	uint32_t freed[8], nfreed, buf, imm;

	init(&f, 8, 4, 8);
	recv_ok(&f, 0, 10, 0, 0);
	recv_ok(&f, 1, 10, 1, 0);
	recv_ok(&f, 2, 10, 2, 0);
	assert_int_equal(rflow_read(&f, mem, out, sizeof(out), freed, &nfreed), 30);
	assert_int_equal(nfreed, 3);
	/* Freed is not owed: only re-posted slots are. */
	assert_int_equal(f.owed, 0);
	rflow_reposted(&f, 2);
	rflow_reposted(&f, 1);
	assert_int_equal(f.owed, 3);

	assert_int_equal(rflow_send_begin(&f, 5, &buf, &imm), 0);
	assert_int_equal(imm, IMM(0, 3));
	assert_int_equal(f.owed, 0);
	assert_int_equal(rflow_send_begin(&f, 5, &buf, &imm), 0);
	assert_int_equal(imm, IMM(1, 0));
	rflow_fini(&f);

	/* The per-message cap. The API cannot owe more than nslots <= 4096, so
	 * the field is set by hand: the cap is what keeps a larger
	 * RFLOW_MAX_SLOTS from spilling credits into the sequence number. */
	init(&f, 4, 4, 8);
	f.owed = 70000;
	assert_int_equal(rflow_send_begin(&f, 1, &buf, &imm), 0);
	assert_int_equal(imm, IMM(0, 65535));
	assert_int_equal(f.owed, 70000 - 65535);
	assert_int_equal(rflow_send_begin(&f, 0, &buf, &imm), 0);
	assert_int_equal(imm, IMM(1, 70000 - 65535));
	assert_int_equal(f.owed, 0);
	rflow_fini(&f);
}

static void test_credit_msg_trigger(void **state)
{
	struct rflow f;
	uint32_t buf, imm, seq = 0;

	init(&f, 8, 1, 8);
	owe(&f, 3, &seq);
	assert_false(rflow_want_credit_msg(&f));
	owe(&f, 1, &seq);
	assert_true(rflow_want_credit_msg(&f));    /* 4 = nslots / 2 */
	assert_int_equal(rflow_send_begin(&f, 0, &buf, &imm), 0);
	assert_int_equal(imm, IMM(0, 4));
	assert_false(rflow_want_credit_msg(&f));

	/* Due, but the only send buffer is busy. */
	owe(&f, 4, &seq);
	assert_false(rflow_want_credit_msg(&f));
	assert_int_equal(rflow_send_done(&f), 0);
	assert_true(rflow_want_credit_msg(&f));
	rflow_fini(&f);

	/* Odd nslots round down. */
	seq = 0;
	init(&f, 5, 1, 8);
	owe(&f, 1, &seq);
	assert_false(rflow_want_credit_msg(&f));
	owe(&f, 1, &seq);
	assert_true(rflow_want_credit_msg(&f));
	rflow_fini(&f);

	/* The smallest: two slots, one owed is due. */
	seq = 0;
	init(&f, 2, 1, 2);
	assert_false(rflow_want_credit_msg(&f));
	owe(&f, 1, &seq);
	assert_true(rflow_want_credit_msg(&f));
	rflow_fini(&f);
}

static void test_credits_overflow(void **state)
{
	struct rflow f;
	bool free_now;
	uint32_t buf, imm;

	init(&f, 4, 8, 4);
	assert_int_equal(rflow_recv(&f, 0, 0, IMM(0, 1), &free_now), -EPROTO);
	assert_int_equal(rflow_error(&f), -EPROTO);
	rflow_fini(&f);

	init(&f, 4, 8, 4);
	assert_int_equal(rflow_send_begin(&f, 1, &buf, &imm), 0);
	assert_int_equal(rflow_send_begin(&f, 1, &buf, &imm), 0);
	recv_ok(&f, 0, 10, 0, 2);       /* back to peer_nslots: fine */
	assert_int_equal(f.credits, 4);
	assert_int_equal(rflow_recv(&f, 1, 0, IMM(1, 1), &free_now), -EPROTO);
	assert_int_equal(f.credits, 4);
	rflow_fini(&f);

	/* 65535 at once, against 4 slots. */
	init(&f, 4, 8, 4);
	assert_int_equal(rflow_recv(&f, 0, 0, IMM(0, 65535), &free_now), -EPROTO);
	rflow_fini(&f);
}

/* ---- Receiving ---- */

/* Also rflow_fail: the first error wins. */
static void test_seq_gap_sticky(void **state)
{
	struct rflow f;
	uint8_t mem[4 * 4096] = { 0 }, out[16];
	uint32_t freed[4], nfreed = 9, buf, imm;
	bool free_now;

	init(&f, 4, 2, 4);
	assert_int_equal(rflow_recv(&f, 0, 1, IMM(1, 0), &free_now), -EPROTO);
	rflow_fini(&f);

	init(&f, 4, 2, 4);
	rflow_fail(&f, 0);              /* not an error */
	recv_ok(&f, 0, 10, 0, 0);
	assert_int_equal(rflow_readable(&f), 10);
	assert_int_equal(rflow_recv(&f, 1, 10, IMM(2, 0), &free_now), -EPROTO);

	/* From now on everything says so, the right sequence too. */
	assert_int_equal(rflow_error(&f), -EPROTO);
	assert_int_equal(rflow_recv(&f, 1, 10, IMM(1, 0), &free_now), -EPROTO);
	assert_false(free_now);
	assert_int_equal(rflow_send_begin(&f, 10, &buf, &imm), -EPROTO);
	assert_int_equal(rflow_send_begin(&f, 0, &buf, &imm), -EPROTO);
	assert_int_equal(rflow_send_done(&f), -EPROTO);
	assert_false(rflow_can_send_data(&f));
	assert_false(rflow_want_credit_msg(&f));
	assert_int_equal(rflow_readable(&f), 0);
	assert_int_equal(rflow_read(&f, mem, out, sizeof(out), freed, &nfreed), 0);
	assert_int_equal(nfreed, 0);
	rflow_reposted(&f, 1);
	assert_int_equal(f.owed, 0);
	rflow_fail(&f, -EIO);           /* the first error wins */
	assert_int_equal(rflow_error(&f), -EPROTO);
	rflow_fini(&f);

	init(&f, 4, 2, 4);
	rflow_fail(&f, -EIO);
	assert_int_equal(rflow_error(&f), -EIO);
	assert_int_equal(rflow_recv(&f, 0, 10, IMM(0, 0), &free_now), -EIO);
	rflow_fini(&f);
}

/* 70000 messages each way: both sequence numbers wrap past 65535. */
static void test_seq_wrap(void **state)
{
	struct rflow f;
	uint32_t buf, imm;

	init(&f, 4, 2, 4);
	for (uint32_t i = 0; i < 70000; i++) {
		recv_ok(&f, i % 4, 0, i, i > 0);  /* returns the credit we used */
		rflow_reposted(&f, 1);
		assert_int_equal(rflow_send_begin(&f, 0, &buf, &imm), 0);
		assert_int_equal(imm, IMM(i, 1));
		assert_int_equal(rflow_send_done(&f), 0);
	}
	assert_int_equal(f.rx_seq, 70000 % 65536);
	assert_int_equal(f.tx_seq, 70000 % 65536);
	assert_int_equal(rflow_error(&f), 0);
	rflow_fini(&f);
}

/* Up to a slot is fine, longer is -EPROTO; no payload frees the slot at once. */
static void test_recv_lengths(void **state)
{
	struct rflow f;
	bool free_now = false;

	init(&f, 4, 2, 4);
	recv_ok(&f, 0, 4096, 0, 0);
	assert_int_equal(rflow_recv(&f, 1, 4097, IMM(1, 0), &free_now), -EPROTO);
	assert_int_equal(rflow_error(&f), -EPROTO);
	rflow_fini(&f);
	init(&f, 4, 2, 4);
	assert_int_equal(rflow_recv(&f, 0, UINT32_MAX, IMM(0, 0), &free_now), -EPROTO);
	rflow_fini(&f);

	init(&f, 4, 2, 4);
	assert_int_equal(rflow_recv(&f, 2, 0, IMM(0, 0), &free_now), 0);
	assert_true(free_now);
	assert_int_equal(rflow_readable(&f), 0);
	assert_int_equal(f.nfifo, 0);
	assert_int_equal(f.unposted, 1);
	rflow_reposted(&f, 1);
	assert_int_equal(f.owed, 1);
	assert_int_equal(rflow_recv(&f, 2, 7, IMM(1, 0), &free_now), 0);
	assert_false(free_now);
	assert_int_equal(rflow_readable(&f), 7);
	rflow_fini(&f);
}

static void test_bad_slots(void **state)
{
	struct rflow f;
	bool free_now;
	uint32_t seq = 0;

	init(&f, 4, 2, 4);
	assert_int_equal(rflow_recv(&f, 4, 10, IMM(0, 0), &free_now), -EINVAL);
	assert_int_equal(rflow_error(&f), -EINVAL);
	rflow_fini(&f);

	init(&f, 4, 2, 4);
	recv_ok(&f, 1, 10, 0, 0);
	assert_int_equal(rflow_recv(&f, 1, 10, IMM(1, 0), &free_now), -EPROTO);
	rflow_fini(&f);

	/* Two slots, one queued and one free: a third message had no credit. */
	init(&f, 2, 2, 2);
	recv_ok(&f, 0, 0, 0, 0);
	recv_ok(&f, 1, 10, 1, 0);
	assert_int_equal(rflow_recv(&f, 0, 0, IMM(2, 0), &free_now), -EPROTO);
	rflow_fini(&f);

	/* Both re-posted but owed: the peer has not been told of them yet. */
	init(&f, 2, 2, 2);
	owe(&f, 2, &seq);
	assert_int_equal(rflow_recv(&f, 0, 0, IMM(2, 0), &free_now), -EPROTO);
	rflow_fini(&f);

	/* Re-posting more than are free is the caller's bug. */
	init(&f, 2, 2, 2);
	recv_ok(&f, 0, 0, 0, 0);
	rflow_reposted(&f, 2);
	assert_int_equal(rflow_error(&f), -EINVAL);
	rflow_fini(&f);
}

/* Reads up to n: got bytes, equal to want, emptying freed[0..nfreed). */
static void expect_read(struct rflow *f, const uint8_t *mem, size_t n, const uint8_t *want,
			size_t got, uint32_t nfreed, const uint32_t *freed)
{
	static uint8_t out[8192];
	uint32_t fr[8], nf = 99;

	assert_int_equal(rflow_read(f, mem, out, n, fr, &nf), got);
	assert_memory_equal(out, want, got);
	assert_int_equal(nf, nfreed);
	for (uint32_t i = 0; i < nfreed; i++)
		assert_int_equal(fr[i], freed[i]);
}

static void test_read_across_slots(void **state)
{
	enum { SZ = 4096 };
	static uint8_t mem[4 * SZ], want[100 + SZ + 50];
	struct rflow f;
	uint32_t buf, imm;

	for (size_t i = 0; i < sizeof(mem); i++)
		mem[i] = (uint8_t)(i * 7 + i / 251);
	memcpy(want, mem + 2 * SZ, 100);
	memcpy(want + 100, mem, SZ);
	memcpy(want + 100 + SZ, mem + 3 * SZ, 50);

	init(&f, 4, 2, 4);
	recv_ok(&f, 2, 100, 0, 0);
	recv_ok(&f, 0, SZ, 1, 0);
	recv_ok(&f, 3, 50, 2, 0);
	assert_int_equal(rflow_readable(&f), 100 + SZ + 50);
	expect_read(&f, mem, 0, want, 0, 0, NULL);
	expect_read(&f, mem, 30, want, 30, 0, NULL);
	/* Across the first boundary. */
	expect_read(&f, mem, 100, want + 30, 100, 1, (const uint32_t[]){ 2 });
	/* Up to exactly the end of slot 0: freed now, not on the next read. */
	expect_read(&f, mem, SZ - 30, want + 130, SZ - 30, 1, (const uint32_t[]){ 0 });
	assert_int_equal(rflow_readable(&f), 50);
	expect_read(&f, mem, 8192, want + 100 + SZ, 50, 1, (const uint32_t[]){ 3 });
	assert_int_equal(rflow_readable(&f), 0);
	expect_read(&f, mem, 8192, want, 0, 0, NULL);

	/* Several freed by one read, in the order they were filled. The peer
	 * has one credit left until we return the three. */
	rflow_reposted(&f, 3);
	assert_int_equal(rflow_send_begin(&f, 1, &buf, &imm), 0);
	assert_int_equal(imm, IMM(0, 3));
	recv_ok(&f, 3, 10, 3, 0);
	recv_ok(&f, 1, 20, 4, 0);
	recv_ok(&f, 2, 30, 5, 0);
	memcpy(want, mem + 3 * SZ, 10);
	memcpy(want + 10, mem + 1 * SZ, 20);
	memcpy(want + 30, mem + 2 * SZ, 30);
	expect_read(&f, mem, 8192, want, 60, 3, (const uint32_t[]){ 3, 1, 2 });
	assert_int_equal(f.unposted, 3);
	assert_int_equal(rflow_error(&f), 0);
	rflow_fini(&f);
}

/* ---- Send buffers ---- */

static void test_send_ring(void **state)
{
	struct rflow f;
	uint32_t buf, imm;

	init(&f, 4, 3, 16);
	assert_int_equal(rflow_send_begin(&f, 10, &buf, &imm), 0);
	assert_int_equal(buf, 0);
	assert_int_equal(rflow_send_begin(&f, 20, &buf, &imm), 0);
	assert_int_equal(buf, 1);
	assert_int_equal(rflow_send_begin(&f, 30, &buf, &imm), 0);
	assert_int_equal(buf, 2);
	assert_int_equal(rflow_queued(&f), 60);
	assert_false(rflow_can_send_data(&f));
	assert_int_equal(rflow_send_begin(&f, 1, &buf, &imm), -EAGAIN);
	assert_int_equal(f.credits, 13);        /* refused: no credit taken */

	assert_int_equal(rflow_send_done(&f), 0);
	assert_int_equal(rflow_queued(&f), 50);
	assert_int_equal(rflow_send_begin(&f, 40, &buf, &imm), 0);
	assert_int_equal(buf, 0);
	assert_int_equal(imm, IMM(3, 0));
	assert_int_equal(rflow_queued(&f), 90);

	assert_int_equal(rflow_send_done(&f), 0);   /* buffer 1, 20 bytes */
	assert_int_equal(rflow_queued(&f), 70);
	assert_int_equal(rflow_send_done(&f), 0);   /* 2, 30 */
	assert_int_equal(rflow_queued(&f), 40);
	assert_int_equal(rflow_send_begin(&f, 0, &buf, &imm), -EAGAIN);  /* nothing owed */
	assert_int_equal(rflow_send_begin(&f, 5, &buf, &imm), 0);
	assert_int_equal(buf, 1);
	assert_int_equal(rflow_send_done(&f), 0);   /* 0, 40 */
	assert_int_equal(rflow_send_done(&f), 0);   /* 1, 5 */
	assert_int_equal(rflow_queued(&f), 0);
	assert_int_equal(rflow_error(&f), 0);

	assert_int_equal(rflow_send_done(&f), -EPROTO);
	assert_int_equal(rflow_send_begin(&f, 5, &buf, &imm), -EPROTO);
	assert_int_equal(rflow_send_done(&f), -EPROTO);
	rflow_fini(&f);
}

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
		cmocka_unit_test(test_hello_roundtrip),
		cmocka_unit_test(test_hello_reject),
		cmocka_unit_test(test_init),
		cmocka_unit_test(test_credits_last_reserved),
		cmocka_unit_test(test_owed_piggyback),
		cmocka_unit_test(test_credit_msg_trigger),
		cmocka_unit_test(test_credits_overflow),
		cmocka_unit_test(test_seq_gap_sticky),
		cmocka_unit_test(test_seq_wrap),
		cmocka_unit_test(test_recv_lengths),
		cmocka_unit_test(test_bad_slots),
		cmocka_unit_test(test_read_across_slots),
		cmocka_unit_test(test_send_ring),
		SIM(0), SIM(1), SIM(2), SIM(3), SIM(4), SIM(5), SIM(6), SIM(7), SIM(8),
	};

	_Static_assert(NSIMS == 9, "a SIM() entry for each of sims[]");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
