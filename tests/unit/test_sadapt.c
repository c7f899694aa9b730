/* sadapt: the stream count's climb. Each test plays copies against a curve
 * of what k streams move (the path's shape: a knee, a link one stream
 * fills, streams each held to a rate) and checks where the count settles,
 * that it says why, and that it leaves a count when the path changes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "daemon/engine/sadapt.h"

#define GB 1e9
#define COPY (4ull << 30)       /* raw bytes of each copy played */

/* GB/s k streams move on each path; between the counts given, the lower. */
static const double knee[SADAPT_MAX + 1] = { 0, 1.0, 1.8, 1.8, 2.5, 2.5, 2.5, 2.5, 2.6 };
static const double flat[SADAPT_MAX + 1] = { 0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0 };
static const double each[SADAPT_MAX + 1] = { 0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0 };

/* One copy at the count a asks for; noise in parts per thousand. */
static bool play(struct sadapt *a, const double *curve, int noise)
{
	double r = curve[a->n] * GB * (1000.0 + noise) / 1000.0;

	return sadapt_measured(a, a->n, COPY, (uint64_t)((double)COPY * 1e9 / r));
}

static void play_n(struct sadapt *a, const double *curve, int copies)
{
	for (int i = 0; i < copies; i++)
		play(a, curve, 0);
}

static void test_settles_at_the_knee(void **state)
{
	struct sadapt a;

	(void)state;
	sadapt_init(&a, 8, 4);
	assert_int_equal(a.n, 4);
	assert_true(play(&a, knee, 0));         /* 4 measured: tries 8 */
	assert_int_equal(a.n, 8);
	assert_true(play(&a, knee, 0));         /* 8: 4 % more, back to 4, and tries 2 */
	assert_int_equal(a.n, 2);
	assert_non_null(strstr(a.why, "8 moved less than 10 % more than 4"));
	assert_true(play(&a, knee, 0));         /* 2 moved less than 4 */
	assert_int_equal(a.n, 4);
	assert_int_equal(a.phase, SA_HOLD);
	assert_non_null(strstr(a.why, "2 moved less than 4"));
	play_n(&a, knee, SADAPT_HOLD - 1);
	assert_int_equal(a.n, 4);
}

static void test_climbs_to_the_cap_while_each_doubling_pays(void **state)
{
	struct sadapt a;

	(void)state;
	sadapt_init(&a, 8, 1);
	play_n(&a, each, 4);                    /* 1, 2, 4, 8 */
	assert_int_equal(a.n, 8);
	assert_int_equal(a.phase, SA_HOLD);
	assert_non_null(strstr(a.why, "up to the cap"));
	/* A cap that is no power of two is reached too. */
	sadapt_init(&a, 6, 1);
	play_n(&a, each, 4);                    /* 1, 2, 4, 6 */
	assert_int_equal(a.n, 6);
	assert_int_equal(a.phase, SA_HOLD);
}

static void test_a_link_one_stream_fills_takes_one(void **state)
{
	struct sadapt a;
	char d[512];

	(void)state;
	sadapt_init(&a, 8, 4);
	play_n(&a, flat, 4);                    /* 4, 8 (no more), 2 (as much), 1 (as much) */
	assert_int_equal(a.n, 1);
	assert_int_equal(a.phase, SA_HOLD);
	assert_non_null(strstr(a.why, "1 moved as much as 2"));
	sadapt_describe(&a, d, sizeof(d));
	assert_non_null(strstr(d, "; measured: 1 at 1.00 GB/s, 2 at 1.00 GB/s, 4 at 1.00 GB/s, "
			       "8 at 1.00 GB/s"));
	/* At the cap the first step is down. */
	sadapt_init(&a, 2, 2);
	play_n(&a, flat, 2);
	assert_int_equal(a.n, 1);
	assert_int_equal(a.phase, SA_HOLD);
}

static void test_small_copies_move_nothing(void **state)
{
	struct sadapt a;

	(void)state;
	sadapt_init(&a, 8, 4);
	assert_false(sadapt_measured(&a, 4, SADAPT_MIN_BYTES - 1, 10 * SADAPT_MIN_NS));
	assert_false(sadapt_measured(&a, 4, 100 * SADAPT_MIN_BYTES, SADAPT_MIN_NS - 1));
	assert_int_equal(a.n, 4);
	assert_int_equal(a.phase, SA_FIRST);
	assert_int_equal(a.measured, 0);
	assert_string_equal(a.why, "no copy measured yet");
	/* A copy on other than the count asked for is noted only. */
	assert_false(sadapt_measured(&a, 2, COPY, 1000000000ull));
	assert_int_equal(a.n, 4);
	assert_int_equal(a.phase, SA_FIRST);
	assert_true(a.rate[2] > 0);
	/* Out of range: nothing. */
	assert_false(sadapt_measured(&a, 9, COPY, 1000000000ull));
	assert_false(sadapt_measured(&a, 0, COPY, 1000000000ull));
}

static void test_a_held_count_is_probed_again(void **state)
{
	struct sadapt a;

	(void)state;
	sadapt_init(&a, 8, 4);
	play_n(&a, knee, 3);
	assert_int_equal(a.phase, SA_HOLD);
	play_n(&a, knee, SADAPT_HOLD - 1);
	assert_int_equal(a.n, 4);
	assert_true(play(&a, knee, 0));         /* the 16th: tries 8 again */
	assert_int_equal(a.n, 8);
	assert_non_null(strstr(a.why, "trying 8 again"));
	assert_true(play(&a, knee, 0));         /* 8 no better: 4, one probe a round */
	assert_int_equal(a.n, 4);
	assert_int_equal(a.phase, SA_HOLD);
	play_n(&a, knee, SADAPT_HOLD);          /* the next round tries 2 */
	assert_int_equal(a.n, 2);
	assert_true(play(&a, knee, 0));         /* 2 worse: 4 */
	assert_int_equal(a.n, 4);
	assert_int_equal(a.phase, SA_HOLD);
	assert_non_null(strstr(a.why, "2 moved less than 4"));
}

static void test_one_slow_copy_moves_nothing(void **state)
{
	static const double half[SADAPT_MAX + 1] = { 0, .5, .9, .9, 1.25, 1.25, 1.25, 1.25, 1.3 };
	struct sadapt a;

	(void)state;
	sadapt_init(&a, 8, 4);
	play_n(&a, knee, 3);
	assert_int_equal(a.n, 4);
	/* Every fifth copy at half speed (a partner busy now and then): the
	 * count holds, and the mean is not dragged to the slow ones. */
	for (int i = 0; i < 5 * SADAPT_HOLD; i++) {
		if (i % (SADAPT_HOLD + 2) == SADAPT_HOLD - 1 || i % (SADAPT_HOLD + 2) == SADAPT_HOLD)
			play(&a, knee, 0);      /* (the probes' copies) */
		else
			play(&a, i % 5 == 4 ? half : knee, 0);
		assert_true(a.n == 4 || a.phase == SA_PROBE);
	}
	assert_true(a.rate[4] > 2.0 * GB);
	/* Two in a row: a whole round from their mean. */
	sadapt_init(&a, 8, 4);
	play_n(&a, knee, 3);
	assert_false(play(&a, half, 0));
	assert_int_equal(a.n, 4);
	assert_true(play(&a, half, 0));
	assert_int_equal(a.n, 8);
	assert_non_null(strstr(a.why, "in 2 copies, less than 70 % of its 2.50 GB/s before"));
}

static void test_fewer_opened(void **state)
{
	struct sadapt a;

	(void)state;
	/* The partner takes 2 connections, whatever is asked: the count holds
	 * at 2, measured, and asks for more only at the next probe. */
	sadapt_init(&a, 8, 4);
	assert_true(sadapt_opened(&a, 2));
	assert_int_equal(a.n, 2);
	assert_int_equal(a.phase, SA_HOLD);
	assert_string_equal(a.why, "only 2 of 4 streams could be opened");
	for (int i = 0; i < SADAPT_HOLD - 1; i++) {
		assert_false(sadapt_opened(&a, 2));
		assert_false(play(&a, knee, 0));
	}
	assert_true(play(&a, knee, 0));         /* the round's probe: 4 */
	assert_int_equal(a.n, 4);
	assert_true(sadapt_opened(&a, 2));      /* again only 2 */
	assert_int_equal(a.n, 2);
	assert_false(sadapt_opened(&a, 2));
	assert_false(sadapt_opened(&a, 3));     /* more than asked: nothing to say */
	assert_int_equal(a.n, 2);
	assert_true(a.rate[2] > 0);
}

static void test_a_path_that_slows_is_climbed_again(void **state)
{
	struct sadapt a;

	(void)state;
	sadapt_init(&a, 8, 4);
	play_n(&a, knee, 3);
	assert_int_equal(a.n, 4);
	/* The partner's disk, or a link on the way, now moves 0.8 GB/s
	 * however many streams: 4 moves a third of before. */
	static const double slow[SADAPT_MAX + 1] = { 0, .8, .8, .8, .8, .8, .8, .8, .8 };

	assert_false(play(&a, slow, 0));        /* one slow copy: wait */
	assert_true(play(&a, slow, 0));
	assert_non_null(strstr(a.why, "800 MB/s in 2 copies, less than 70 % of its 2.50 GB/s "
			       "before: trying 8"));
	play_n(&a, slow, 3);                    /* 8 no better, 2 as good, 1 as good */
	assert_int_equal(a.n, 1);
	assert_int_equal(a.phase, SA_HOLD);
	/* And when more streams pay again, the next round's probe finds it. */
	static const double fast[SADAPT_MAX + 1] = { 0, .8, 1.6, 1.6, 3.2, 3.2, 3.2, 3.2, 6.4 };

	play_n(&a, fast, SADAPT_HOLD + 3);      /* 16 on 1, then 2, 4, 8 */
	assert_int_equal(a.n, 8);
	assert_int_equal(a.phase, SA_HOLD);
}

static void test_noise_does_not_unsettle_it(void **state)
{
	struct sadapt a;
	uint32_t x = 12345;
	int at4 = 0;

	(void)state;
	sadapt_init(&a, 8, 1);
	for (int i = 0; i < 200; i++) {
		x = x * 1103515245u + 12345u;
		play(&a, knee, (int)((x >> 16) % 81) - 40);  /* +-4 % */
		at4 += i >= 10 && a.n == 4;
	}
	/* Off 4 only for the probes every SADAPT_HOLD copies. */
	assert_true(at4 >= 190 * (SADAPT_HOLD - 2) / SADAPT_HOLD - 2);
}

static void test_a_cap_of_one(void **state)
{
	struct sadapt a;

	(void)state;
	sadapt_init(&a, 1, 4);
	assert_int_equal(a.n, 1);
	assert_int_equal(a.phase, SA_HOLD);
	for (int i = 0; i < 3 * SADAPT_HOLD; i++)
		assert_false(play(&a, each, 0));
	assert_int_equal(a.n, 1);
	assert_string_equal(a.why, "a cap of 1");
	sadapt_init(&a, 99, 0);
	assert_int_equal(a.cap, SADAPT_MAX);
	assert_int_equal(a.n, 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_settles_at_the_knee),
		cmocka_unit_test(test_climbs_to_the_cap_while_each_doubling_pays),
		cmocka_unit_test(test_a_link_one_stream_fills_takes_one),
		cmocka_unit_test(test_small_copies_move_nothing),
		cmocka_unit_test(test_a_held_count_is_probed_again),
		cmocka_unit_test(test_one_slow_copy_moves_nothing),
		cmocka_unit_test(test_fewer_opened),
		cmocka_unit_test(test_a_path_that_slows_is_climbed_again),
		cmocka_unit_test(test_noise_does_not_unsettle_it),
		cmocka_unit_test(test_a_cap_of_one),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
