/* daemon/repl/zpolicy.c: compress = auto, driven through a simulated sender.
 *
 * The simulation is the sender's loop: per piece, read time, codec time
 * when compressing, then the send, which waits while the socket buffer is
 * full; the buffer drains at the link's rate all the while. Auto must come
 * within a few per cent of the better fixed choice (the cost of trying the
 * other one), whichever that is, and follow data that changes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/codec.h"
#include "common/config.h"
#include "daemon/repl/zpolicy.h"

#define MiB (1024.0 * 1024.0)

struct sim {
	double t, q;        /* s; bytes in the socket buffer */
	double link;        /* bytes/s the path drains */
	double buf;         /* socket buffer */
	double read;        /* raw bytes/s the disk gives */
	double codec;       /* raw bytes/s the codec takes */
	double ratio;       /* wire/raw when compressed */
	unsigned on;        /* pieces compressed */
};

static void advance(struct sim *s, double dt)
{
	s->t += dt;
	s->q -= s->link * dt;
	if (s->q < 0)
		s->q = 0;
}

static uint64_t ns(const struct sim *s)
{
	return (uint64_t)(s->t * 1e9) + 1;
}

/* One piece of 1 MiB; mode forces a choice (-1: ask z). */
static void piece(struct sim *s, struct zpolicy *z, int force)
{
	bool on = force >= 0 ? force : zp_pick(z, ns(s), (uint64_t)s->q) != &codec_none_ops;
	double w = on ? MiB * s->ratio : MiB;

	advance(s, MiB / s->read);
	if (on)
		advance(s, MiB / s->codec);
	if (s->q + w > s->buf)
		advance(s, (s->q + w - s->buf) / s->link);
	s->q += w;
	s->on += on;
	if (force < 0)
		zp_sent(z, (size_t)MiB, (size_t)w, ns(s), (uint64_t)s->q);
}

/* Seconds until n pieces are delivered, the last byte off the buffer. */
static double run(struct sim s, int force, unsigned n, unsigned *on)
{
	struct zpolicy z;

	zp_init(&z, CFG_COMPRESS_AUTO);
	for (unsigned i = 0; i < n; i++)
		piece(&s, &z, force);
	if (on)
		*on = s.on;
	return s.t + s.q / s.link;
}

static const struct sim slow_link = {
	.link = 125e6, .buf = 4 * MiB, .read = 3e9, .codec = 1.2e9, .ratio = 0.66,
};

/* A 1 Gbit/s link and a codec ten times faster: compressing wins, and auto
 * does it nearly all the time. */
static void test_slow_link_compresses(void **state)
{
	unsigned on;
	double t_on = run(slow_link, 1, 1024, NULL), t_off = run(slow_link, 0, 1024, NULL);
	double t_auto = run(slow_link, -1, 1024, &on);

	assert_true(t_on < t_off * 0.8);
	assert_true(t_auto <= t_on * 1.03);
	assert_true(on > 1024 * 9 / 10);
}

/* A path faster than the codec (loopback, a fast NIC): raw wins, and auto
 * costs at most a few per cent over raw for trying. */
static void test_fast_path_sends_raw(void **state)
{
	struct sim s = slow_link;
	unsigned on;
	double t_off, t_on, t_auto;

	s.link = 3e9;
	t_off = run(s, 0, 1024, NULL);
	t_on = run(s, 1, 1024, NULL);
	t_auto = run(s, -1, 1024, &on);
	assert_true(t_off < t_on * 0.8);
	assert_true(t_auto <= t_off * 1.05);
	assert_true(on < 1024 / 20);
}

/* Incompressible data and a codec slower than the link: compressing only
 * costs time (the wire is the same), so auto sends raw. (With a codec
 * faster than the link the two tie: the socket drains while it works.) */
static void test_incompressible_sends_raw(void **state)
{
	struct sim s = slow_link;
	unsigned on;
	double t_off, t_auto;

	s.ratio = 1.0;
	s.codec = 0.1e9;
	t_off = run(s, 0, 1024, NULL);
	t_auto = run(s, -1, 1024, &on);
	assert_true(t_auto <= t_off * 1.03);
	/* Only 1.25x slower: tried more often, at the same small cost. */
	assert_true(on < 1024 / 5);
}

/* The path changes half-way (a congested link clears): auto follows, at
 * the next try of the other way, ZP_PROBE_MAX + 1 windows at most. */
static void test_follows_a_change(void **state)
{
	struct sim s = slow_link;
	struct zpolicy z;
	unsigned on_first, on_second;

	s.codec = 0.3e9;
	s.ratio = 0.5;          /* on the slow link: compressing wins */
	zp_init(&z, CFG_COMPRESS_AUTO);
	for (int i = 0; i < 1024; i++)
		piece(&s, &z, -1);
	on_first = s.on;
	s.link = 3e9;           /* now raw does */
	for (int i = 0; i < 1024; i++)
		piece(&s, &z, -1);
	on_second = s.on - on_first;
	assert_true(on_first > 1024 * 9 / 10);
	assert_true(on_second <= (ZP_PROBE_MAX + 2) * ZP_WINDOW);
}

/* The fixed settings do what they say and measure nothing. */
static void test_fixed_modes(void **state)
{
	struct zpolicy z;

	zp_init(&z, CFG_COMPRESS_OFF);
	assert_ptr_equal(zp_pick(&z, 1, 0), &codec_none_ops);
	zp_init(&z, CFG_COMPRESS_ZSTD);
	assert_ptr_equal(zp_pick(&z, 1, 0), &codec_zstd_ops);
	zp_init(&z, CFG_COMPRESS_FLOAT);
	assert_null(zp_pick(&z, 1, 0));
	for (int i = 0; i < 100; i++)
		zp_sent(&z, 1 << 20, 1 << 19, 2 + (uint64_t)i, 0);
	assert_int_equal(z.windows, 0);
}

/* A pause measures a window of ZP_PROBE pieces or more and drops a shorter
 * one; a dropped window leaves the estimates alone. */
static void test_pause(void **state)
{
	struct zpolicy z;
	uint64_t t = 1000;

	zp_init(&z, CFG_COMPRESS_AUTO);
	for (int i = 0; i < ZP_PROBE - 1; i++) {
		zp_pick(&z, t, 0);
		t += 1000000;
		zp_sent(&z, 1 << 20, 1 << 20, t, 0);
	}
	zp_pause(&z, t, 0);
	assert_int_equal(z.windows, 0);
	assert_true(z.rate[0] == 0 && z.rate[1] == 0);
	for (int i = 0; i < ZP_PROBE; i++) {
		zp_pick(&z, t, 0);
		t += 1000000;
		zp_sent(&z, 1 << 20, 1 << 20, t, 0);
	}
	zp_pause(&z, t, 0);
	assert_int_equal(z.windows, 1);
	assert_true(z.rate[0] > 1e9 && z.rate[0] < 1.1e9);   /* 1 MiB per ms */
	zp_drop(&z);
	assert_int_equal(z.pieces, 0);
}

/* What was still queued when a window closed is not counted as delivered:
 * a window that only filled the buffer measures the path, not the fill. */
static void test_queue_is_not_delivery(void **state)
{
	struct zpolicy z;

	zp_init(&z, CFG_COMPRESS_AUTO);
	zp_pick(&z, 1, 0);
	for (int i = 0; i < ZP_WINDOW; i++)
		/* 16 MiB handed over in 160 ms, 12 MiB of it still queued */
		zp_sent(&z, 1 << 20, 1 << 20, 1 + (uint64_t)(i + 1) * 10000000,
			i == ZP_WINDOW - 1 ? 12u << 20 : (uint64_t)(i + 1) << 20);
	assert_int_equal(z.windows, 1);
	/* 4 MiB in 0.16 s: 26 MB/s, not 105 */
	assert_true(z.rate[0] > 25e6 && z.rate[0] < 27.5e6);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_slow_link_compresses),
		cmocka_unit_test(test_fast_path_sends_raw),
		cmocka_unit_test(test_incompressible_sends_raw),
		cmocka_unit_test(test_follows_a_change),
		cmocka_unit_test(test_fixed_modes),
		cmocka_unit_test(test_pause),
		cmocka_unit_test(test_queue_is_not_delivery),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
