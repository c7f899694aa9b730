/* rdma/flow.c, the RDMA transport's bookkeeping, without a device, one
 * function at a time: the hello, credits (the reserved last credit, owed
 * credits riding on every message, the credit-only trigger), sequence
 * numbers and their wrap, receive slots, the send buffer ring, sticky
 * errors, and a failed flow made new again by fini and init, as a reconnect
 * does. The two flows back to back, the proof that the whole scheme neither
 * loses bytes nor stalls, are in test_rdma_sim.c. */
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

/* ---- A new connection, a new flow ---- */

/* A reconnect tears the old connection down and sets up a new one with a
 * new flow in the same struct rflow: a failed flow, fini'd and init'ed
 * again, keeps nothing of its past. */
static void test_reinit(void **state)
{
	struct rflow f;
	uint8_t mem[8 * 4096] = { 0 }, out[64];
	uint32_t freed[8], nfreed, buf, imm, seq = 0;
	bool free_now;

	/* Some of everything: messages sent and busy, slots queued, free and
	 * owed, sequence numbers moved; then a sticky error. */
	init(&f, 8, 4, 6);
	assert_int_equal(rflow_send_begin(&f, 100, &buf, &imm), 0);
	assert_int_equal(rflow_send_begin(&f, 200, &buf, &imm), 0);
	owe(&f, 2, &seq);
	recv_ok(&f, 3, 10, seq++, 0);
	recv_ok(&f, 4, 20, seq++, 0);
	assert_int_equal(rflow_read(&f, mem, out, 15, freed, &nfreed), 15);
	assert_int_equal(nfreed, 1);            /* slot 3 free, slot 4 still queued */
	assert_int_equal(f.tx_seq, 2);
	assert_int_equal(f.rx_seq, 4);
	assert_int_equal(f.credits, 4);
	assert_int_equal(f.owed, 2);
	assert_int_equal(f.unposted, 1);
	assert_int_equal(f.nfifo, 1);
	assert_int_equal(rflow_queued(&f), 300);
	assert_int_equal(rflow_recv(&f, 5, 1, IMM(9, 0), &free_now), -EPROTO);
	assert_int_equal(rflow_error(&f), -EPROTO);

	/* The reconnect: the peer's hello may differ this time. */
	rflow_fini(&f);
	assert_int_equal(rflow_init(&f, 8, 4096, 4, 4096, 5, 8192), 0);
	assert_int_equal(rflow_error(&f), 0);
	assert_int_equal(f.tx_seq, 0);
	assert_int_equal(f.rx_seq, 0);
	assert_int_equal(f.credits, 5);         /* the peer's nslots */
	assert_int_equal(f.peer_nslots, 5);
	assert_int_equal(f.peer_slot_size, 8192);
	assert_int_equal(f.owed, 0);            /* nothing owed */
	assert_int_equal(f.unposted, 0);
	assert_int_equal(f.nbusy, 0);           /* nothing queued, either way */
	assert_int_equal(rflow_queued(&f), 0);
	assert_int_equal(f.nfifo, 0);
	assert_int_equal(f.head_off, 0);
	assert_int_equal(rflow_readable(&f), 0);
	for (uint32_t i = 0; i < f.nslots; i++)
		assert_int_equal(f.held[i], 0);
	assert_true(rflow_can_send_data(&f));
	assert_false(rflow_want_credit_msg(&f));
	assert_int_equal(rflow_send_begin(&f, 0, &buf, &imm), -EAGAIN);  /* nothing owed */
	assert_int_equal(rflow_read(&f, mem, out, sizeof(out), freed, &nfreed), 0);
	assert_int_equal(nfreed, 0);

	/* And it works from the start: the first message each way is number
	 * 0, into the first send buffer, and the slot queued before is free. */
	assert_int_equal(rflow_send_begin(&f, 10, &buf, &imm), 0);
	assert_int_equal(buf, 0);
	assert_int_equal(imm, IMM(0, 0));
	assert_int_equal(f.credits, 4);
	recv_ok(&f, 4, 7, 0, 1);
	assert_int_equal(f.credits, 5);
	assert_int_equal(rflow_readable(&f), 7);
	assert_int_equal(rflow_send_done(&f), 0);
	assert_int_equal(rflow_queued(&f), 0);
	assert_int_equal(rflow_error(&f), 0);
	rflow_fini(&f);
}

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
		cmocka_unit_test(test_reinit),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
