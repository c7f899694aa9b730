/* pace: the token bucket every rate cap takes from. No rate costs nothing;
 * a rate holds one thread to it; and several threads taking from one
 * bucket (a holder's connections serving one origin's restore lanes) are
 * held to it together, not each. Only lower bounds on time are asserted:
 * a slow or busy machine can only make a paced loop take longer. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/clock.h"
#include "daemon/engine/pace.h"

#define MiB (1u << 20)
#define RATE (64ull * MiB)      /* bytes per second */

static double seconds_since(uint64_t t0)
{
	return (double)(mono_ns() - t0) / 1e9;
}

static void test_no_rate(void **state)
{
	struct pace p;
	uint64_t t0 = mono_ns();

	(void)state;
	pace_init(&p, 0);
	for (int i = 0; i < 1024; i++)
		pace_take(&p, 64 * MiB);        /* 64 GiB "moved" */
	assert_true(seconds_since(t0) < 0.5);
}

static void test_one_thread_holds_the_rate(void **state)
{
	struct pace p;
	uint64_t t0 = mono_ns();

	(void)state;
	pace_init(&p, RATE);
	for (int i = 0; i < 16; i++)
		pace_take(&p, MiB);
	/* 16 MiB at 64 MiB/s: 250 ms, less the 50 ms burst allowed. */
	assert_true(seconds_since(t0) >= 0.25 - PACE_BURST_NS / 1e9 - 0.01);
}

static void *taker(void *arg)
{
	for (int i = 0; i < 8; i++)
		pace_take(arg, MiB);
	return NULL;
}

static void test_threads_share_one_bucket(void **state)
{
	pthread_t t[4];
	struct pace p;
	uint64_t t0 = mono_ns();

	(void)state;
	pace_init(&p, RATE);
	for (int i = 0; i < 4; i++)
		assert_int_equal(pthread_create(&t[i], NULL, taker, &p), 0);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	/* 4 x 8 MiB from one bucket: 500 ms (less the burst); a bucket each
	 * would have let them through in 125 ms. */
	assert_true(seconds_since(t0) >= 0.5 - PACE_BURST_NS / 1e9 - 0.01);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_no_rate),
		cmocka_unit_test(test_one_thread_holds_the_rate),
		cmocka_unit_test(test_threads_share_one_bucket),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
