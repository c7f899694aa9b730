/* common/portlist.c: port lists (expansion, repeats, the cap, every
 * refusal with its message) and port ranges (ephemeral, none, LO-HI). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/portlist.h"

static char why[512];

/* s must give exactly want[0..nwant) with cap. */
static void assert_ports_cap(const char *s, size_t cap, const uint16_t *want, size_t nwant)
{
	uint16_t ports[65536];
	size_t n = 42;
	int rc = portlist_parse(s, ports, cap, &n, why, sizeof(why));

	if (rc)
		fail_msg("'%s': %d, %s", s, rc, why);
	assert_string_equal(why, "");
	assert_int_equal(n, nwant);
	for (size_t i = 0; i < n; i++)
		if (ports[i] != want[i])
			fail_msg("'%s': port %zu is %u, want %u", s, i, ports[i], want[i]);
}

#define ASSERT_PORTS(s, ...) do { \
		static const uint16_t w_[] = { __VA_ARGS__ }; \
		assert_ports_cap(s, PORTLIST_MAX, w_, sizeof(w_) / sizeof(w_[0])); \
	} while (0)

static void assert_list_refused_cap(const char *s, size_t cap, int rc, const char *want)
{
	uint16_t ports[PORTLIST_MAX];
	size_t n = 42;
	int got = portlist_parse(s, ports, cap, &n, why, sizeof(why));

	if (got != rc)
		fail_msg("'%s': %d, want %d (%s)", s, got, rc, why);
	assert_string_equal(why, want);
	assert_int_equal(n, 0);
}

static void assert_list_refused(const char *s, const char *want)
{
	assert_list_refused_cap(s, PORTLIST_MAX, -EINVAL, want);
}

static void test_list_good(void **state)
{
	(void)state;
	ASSERT_PORTS("29500", 29500);
	ASSERT_PORTS("29500,29400-29410", 29500, 29400, 29401, 29402, 29403, 29404, 29405, 29406,
		     29407, 29408, 29409, 29410);
	ASSERT_PORTS("1", 1);
	ASSERT_PORTS("65535", 65535);
	ASSERT_PORTS("1-1", 1);
	ASSERT_PORTS("65534-65535", 65534, 65535);
	ASSERT_PORTS("0080", 80);                       /* decimal, zeros only pad */
	ASSERT_PORTS("3,1,2", 3, 1, 2);                 /* order as written */
	/* Blanks around items and around the '-'. */
	ASSERT_PORTS(" 29500 ,\t29400 - 29402 ", 29500, 29400, 29401, 29402);
	ASSERT_PORTS("5,\t6", 5, 6);
}

/* A port given twice is kept once, where it first appears. */
static void test_list_repeats(void **state)
{
	(void)state;
	ASSERT_PORTS("1,1-3,2", 1, 2, 3);
	ASSERT_PORTS("29500,29500", 29500);
	ASSERT_PORTS("10-12,9-13", 10, 11, 12, 9, 13);
	/* Repeats do not count towards the cap. */
	{
		uint16_t want[PORTLIST_MAX];

		for (int i = 0; i < PORTLIST_MAX; i++)
			want[i] = (uint16_t)(1000 + i);
		assert_ports_cap("1000-1063,1000-1063,1010", PORTLIST_MAX, want, PORTLIST_MAX);
	}
}

static void test_list_bad(void **state)
{
	(void)state;
	assert_list_refused("abc", "'abc' is not a port number (1-65535)");
	assert_list_refused("29500,abc", "'abc' is not a port number (1-65535)");
	assert_list_refused("0", "'0' is not a port number (1-65535)");
	assert_list_refused("65536", "'65536' is not a port number (1-65535)");
	assert_list_refused("99999999999999999999999", "'99999999999999999999999' is not a port number (1-65535)");
	assert_list_refused("+5", "'+5' is not a port number (1-65535)");
	assert_list_refused("0x50", "'0x50' is not a port number (1-65535)");
	assert_list_refused("1 2", "'1 2' is not a port number (1-65535)");
	assert_list_refused("30000-29000", "'30000-29000': the range runs backwards");
	assert_list_refused("1-", "'1-' is not a port range (LO-HI)");
	assert_list_refused("-5", "'-5' is not a port range (LO-HI)");
	assert_list_refused("-", "'-' is not a port range (LO-HI)");
	assert_list_refused("1 - ", "'1 -' is not a port range (LO-HI)");
	assert_list_refused("1-abc", "'1-abc': 'abc' is not a port number (1-65535)");
	assert_list_refused("0-10", "'0-10': '0' is not a port number (1-65535)");
	assert_list_refused("10-70000", "'10-70000': '70000' is not a port number (1-65535)");
	assert_list_refused("1-2-3", "'1-2-3': '2-3' is not a port number (1-65535)");
	assert_list_refused("", "no ports");
	assert_list_refused(" \t ", "no ports");
	assert_list_refused(NULL, "no ports");
	assert_list_refused("1,,2", "an empty item in the list");
	assert_list_refused("1,", "an empty item in the list");
	assert_list_refused(",1", "an empty item in the list");
	assert_list_refused("1, ,2", "an empty item in the list");
	assert_list_refused(",", "an empty item in the list");
}

static void test_list_cap(void **state)
{
	uint16_t ports[65535];
	size_t n;

	(void)state;
	assert_list_refused_cap("1-65", PORTLIST_MAX, -E2BIG, "'1-65': more than 64 ports");
	assert_list_refused_cap("1-64,65", PORTLIST_MAX, -E2BIG, "'65': more than 64 ports");
	assert_list_refused_cap("1-65535", PORTLIST_MAX, -E2BIG, "'1-65535': more than 64 ports");
	assert_list_refused_cap("5", 0, -E2BIG, "'5': more than 0 ports");
	/* A list that is also malformed is reported as malformed. */
	assert_list_refused_cap("1-100,abc", PORTLIST_MAX, -EINVAL, "'abc' is not a port number (1-65535)");
	/* cap 0 needs no array. */
	assert_int_equal(portlist_parse("5", NULL, 0, &n, why, sizeof(why)), -E2BIG);
	/* Every port there is. */
	assert_int_equal(portlist_parse("1-65535,1-65535", ports, 65535, &n, why, sizeof(why)), 0);
	assert_int_equal(n, 65535);
	assert_int_equal(ports[0], 1);
	assert_int_equal(ports[65534], 65535);
}

static void test_list_messages(void **state)
{
	char small[6], big[200];
	uint16_t ports[PORTLIST_MAX];
	size_t n;

	(void)state;
	assert_list_refused("2\x1b[1m", "'2?[1m' is not a port number (1-65535)");
	assert_int_equal(portlist_parse("abc", ports, PORTLIST_MAX, &n, small, sizeof(small)), -EINVAL);
	assert_string_equal(small, "'abc'");
	assert_int_equal(portlist_parse("abc", ports, PORTLIST_MAX, &n, NULL, 0), -EINVAL);
	assert_int_equal(portlist_parse("5", ports, PORTLIST_MAX, &n, NULL, 0), 0);
	assert_int_equal(n, 1);
	/* A long item is cut so that the reason survives. */
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	assert_int_equal(portlist_parse(big, ports, PORTLIST_MAX, &n, why, sizeof(why)), -EINVAL);
	assert_string_equal(why + 78, "...' is not a port number (1-65535)");
}

static void assert_range(const char *s, uint16_t lo, uint16_t hi)
{
	uint16_t l = 1, h = 1;
	int rc = portrange_parse(s, &l, &h, why, sizeof(why));

	if (rc)
		fail_msg("'%s': %d, %s", s, rc, why);
	assert_string_equal(why, "");
	assert_int_equal(l, lo);
	assert_int_equal(h, hi);
}

static void assert_range_refused(const char *s, const char *want)
{
	uint16_t l, h;

	assert_int_equal(portrange_parse(s, &l, &h, why, sizeof(why)), -EINVAL);
	assert_string_equal(why, want);
}

static void test_range_good(void **state)
{
	(void)state;
	assert_range("none", 0, 0);
	assert_range(" none\t", 0, 0);
	assert_range("29400-29410", 29400, 29410);
	assert_range("1-65535", 1, 65535);
	assert_range("5-5", 5, 5);
	assert_range(" 40000 - 40100 ", 40000, 40100);
}

static void test_range_bad(void **state)
{
	(void)state;
	assert_range_refused("30000-29000", "'30000-29000': the range runs backwards");
	assert_range_refused("abc", "'abc': expected ephemeral, none or LO-HI");
	assert_range_refused("29500", "'29500': expected ephemeral, none or LO-HI");
	assert_range_refused("", "'': expected ephemeral, none or LO-HI");
	assert_range_refused(NULL, "'': expected ephemeral, none or LO-HI");
	assert_range_refused("Ephemeral", "'Ephemeral': expected ephemeral, none or LO-HI");
	assert_range_refused("nonex", "'nonex': expected ephemeral, none or LO-HI");
	assert_range_refused("0-10", "'0-10': '0' is not a port number (1-65535)");
	assert_range_refused("1-65536", "'1-65536': '65536' is not a port number (1-65535)");
	assert_range_refused("1-", "'1-' is not a port range (LO-HI)");
	assert_range_refused("1-2,3-4", "'1-2,3-4': '2,3-4' is not a port number (1-65535)");
}

/* "ephemeral" is what the kernel says now. */
static void test_range_ephemeral(void **state)
{
	unsigned lo, hi;
	uint16_t l, h;
	FILE *f = fopen(PORTRANGE_EPHEMERAL_FILE, "r");
	int got;

	(void)state;
	if (!f) {
		int e = errno;

		assert_int_equal(portrange_parse("ephemeral", &l, &h, why, sizeof(why)), -e);
		assert_non_null(strstr(why, PORTRANGE_EPHEMERAL_FILE ": "));
		skip();
	}
	got = fscanf(f, "%u %u", &lo, &hi);
	fclose(f);
	assert_int_equal(got, 2);
	assert_int_equal(portrange_parse("ephemeral", &l, &h, why, sizeof(why)), 0);
	assert_string_equal(why, "");
	assert_int_equal(l, lo);
	assert_int_equal(h, hi);
	assert_int_equal(portrange_parse(" ephemeral ", &l, &h, NULL, 0), 0);
	assert_int_equal(l, lo);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_list_good),
		cmocka_unit_test(test_list_repeats),
		cmocka_unit_test(test_list_bad),
		cmocka_unit_test(test_list_cap),
		cmocka_unit_test(test_list_messages),
		cmocka_unit_test(test_range_good),
		cmocka_unit_test(test_range_bad),
		cmocka_unit_test(test_range_ephemeral),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
