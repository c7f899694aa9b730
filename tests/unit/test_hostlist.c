/* common/hostlist.c: expansions as Slurm makes them, repeats kept out,
 * every refusal with its message, and the bounds on hostile input (huge
 * ranges, endless repeats, long names) holding without the work running
 * away. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "common/hostlist.h"

static char why[512];

/* The names joined with ' ', for comparing with one string. */
static char *joined(char **names, size_t n)
{
	size_t len = 1;
	char *s, *o;

	for (size_t i = 0; i < n; i++)
		len += strlen(names[i]) + 1;
	s = o = malloc(len);
	assert_non_null(s);
	*o = '\0';
	for (size_t i = 0; i < n; i++)
		o += sprintf(o, "%s%s", i ? " " : "", names[i]);
	return s;
}

/* expr must expand to want (names separated by ' '), with max names. */
static void assert_expands_max(const char *expr, size_t max, const char *want)
{
	char **names = (char **)1;      /* junk: expand must set it */
	size_t n = 42;
	char *got;
	int rc = hostlist_expand(expr, max, &names, &n, why, sizeof(why));

	if (rc)
		fail_msg("'%s': %d, %s", expr, rc, why);
	assert_string_equal(why, "");
	got = joined(names, n);
	if (strcmp(got, want) != 0)
		fail_msg("'%s':\n got  %s\n want %s", expr, got, want);
	free(got);
	hostlist_free(names, n);
}

static void assert_expands(const char *expr, const char *want)
{
	assert_expands_max(expr, 4096, want);
}

/* expr must be refused with rc and exactly the message want. */
static void assert_refused_max(const char *expr, size_t max, int rc, const char *want)
{
	char **names = (char **)1;
	size_t n = 42;
	int got = hostlist_expand(expr, max, &names, &n, why, sizeof(why));

	if (got != rc) {
		if (got == 0)
			hostlist_free(names, n);
		fail_msg("'%s': %d, want %d (%s)", expr, got, rc, why);
	}
	assert_string_equal(why, want);
	assert_null(names);
	assert_int_equal(n, 0);
}

static void assert_refused(const char *expr, const char *want)
{
	assert_refused_max(expr, 4096, -EINVAL, want);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void test_plain(void **state)
{
	(void)state;
	assert_expands("n0", "n0");
	assert_expands("n0,n2", "n0 n2");
	assert_expands("gpu-node_1.a,x", "gpu-node_1.a x");
	assert_expands("0n", "0n");             /* config_check_name allows a digit first */
	assert_expands("a1,a01,a001", "a1 a01 a001");   /* different names */
}

static void test_ranges(void **state)
{
	(void)state;
	assert_expands("n[0-7,12]", "n0 n1 n2 n3 n4 n5 n6 n7 n12");
	assert_expands("n[0-3]", "n0 n1 n2 n3");
	assert_expands("n[5]", "n5");
	assert_expands("n[5,1-3]", "n5 n1 n2 n3");             /* order as written */
	assert_expands("n[3-3]", "n3");
	assert_expands("[1-3]", "1 2 3");
	assert_expands("n[0-1],m[2-3],x", "n0 n1 m2 m3 x");
	assert_expands("a[1-2],b", "a1 a2 b");
}

/* Padding follows the low bound as written, as Slurm does. */
static void test_padding(void **state)
{
	(void)state;
	assert_expands("gpu-[01-16]",
		       "gpu-01 gpu-02 gpu-03 gpu-04 gpu-05 gpu-06 gpu-07 gpu-08 gpu-09 gpu-10 "
		       "gpu-11 gpu-12 gpu-13 gpu-14 gpu-15 gpu-16");
	assert_expands("n[8-10]", "n8 n9 n10");
	assert_expands("n[08-10]", "n08 n09 n10");
	assert_expands("n[8-010]", "n8 n9 n10");                /* the high bound's zeros do not count */
	assert_expands("n[01-3]", "n01 n02 n03");
	assert_expands("n[007]", "n007");
	assert_expands("n[00-0]", "n00");
	assert_expands("n[000-2]", "n000 n001 n002");
	assert_expands("n[099-101]", "n099 n100 n101");
	assert_expands("n[98-101]", "n98 n99 n100 n101");
	assert_expands("n[01,2,003]", "n01 n2 n003");
	assert_expands("n[9-11,010]", "n9 n10 n11 n010");
	assert_expands("n[000000000000000000000000001]", "n000000000000000000000000001");
	assert_expands("n[999999999999999999]", "n999999999999999999");  /* 18 digits */
}

/* Several groups: every combination, in Slurm's order (the last group
 * fastest, then the first, the second... the one before the last slowest),
 * each checked against scontrol show hostnames of Slurm 22.05. */
static void test_groups(void **state)
{
	(void)state;
	assert_expands("r[1-2]n[01-03]", "r1n01 r1n02 r1n03 r2n01 r2n02 r2n03");
	assert_expands("n[1-2]-[3-4]", "n1-3 n1-4 n2-3 n2-4");
	assert_expands("n[1-3]a[5]", "n1a5 n2a5 n3a5");
	assert_expands("[1-2][3,5]", "13 15 23 25");
	assert_expands("a[1,3]b[0-1]c[7]", "a1b0c7 a3b0c7 a1b1c7 a3b1c7");
	assert_expands("a[1-2]b[1-2]c[1-2]", "a1b1c1 a1b1c2 a2b1c1 a2b1c2 a1b2c1 a1b2c2 a2b2c1 a2b2c2");
	assert_expands("a[1-2]b[1-2]c[1-2]d[1-2]",
		       "a1b1c1d1 a1b1c1d2 a2b1c1d1 a2b1c1d2 a1b2c1d1 a1b2c1d2 a2b2c1d1 a2b2c1d2 "
		       "a1b1c2d1 a1b1c2d2 a2b1c2d1 a2b1c2d2 a1b2c2d1 a1b2c2d2 a2b2c2d1 a2b2c2d2");
	assert_expands("[1-3][1-3]1[5]", "1115 2115 3115 1215 2215 3215 1315 2315 3315");
}

/* A name given twice is kept once, where it first appears. */
static void test_repeats(void **state)
{
	(void)state;
	assert_expands("n[1-3],n2", "n1 n2 n3");
	assert_expands("a,b,a", "a b");
	assert_expands("n[1,1]", "n1");
	assert_expands("n[1-3],n[2-4]", "n1 n2 n3 n4");
	assert_expands("n3,n[1-3]", "n3 n1 n2");
	assert_expands("[1,11][1,11]", "11 111 1111");  /* 1|11 and 11|1 are one name */
	assert_expands("n[1-2],n[01-02]", "n1 n2 n01 n02");
	/* Repeats do not count towards max. */
	assert_expands_max("n[1-4],n[1-4],n3", 4, "n1 n2 n3 n4");
}

static void test_malformed(void **state)
{
	(void)state;
	assert_refused("", "an empty list");
	assert_refused(",a", "an empty name at the start of the list");
	assert_refused("a,", "an empty name after 'a'");
	assert_refused("a,,b", "an empty name after 'a'");
	assert_refused("n[0-3],", "an empty name after 'n[0-3]'");
	assert_refused(",", "an empty name at the start of the list");
	assert_refused("n[1", "'n[1': '[' without ']'");
	assert_refused("n[1-3", "'n[1-3': '[' without ']'");
	assert_refused("n[1-3,n5", "'n[1-3,n5': '[' without ']'");
	assert_refused("a,n[", "'n[': '[' without ']'");
	assert_refused("n1]", "'n1]': ']' without '['");
	assert_refused("n[1-3]]", "'n[1-3]]': ']' without '['");
	assert_refused("]", "']': ']' without '['");
	assert_refused("n[[1-3]", "'n[[': '[' inside brackets");
	assert_refused("n[]", "'n[]': nothing between '[' and ']'");
	assert_refused("n[1,,2]", "'n[1,,2]': an empty number in brackets");
	assert_refused("n[1,]", "'n[1,]': an empty number in brackets");
	assert_refused("n[,1]", "'n[,1]': an empty number in brackets");
	assert_refused("n[1-]", "'n[1-]': '1-' is not a number or a range LO-HI");
	assert_refused("n[-2]", "'n[-2]': '-2' is not a number or a range LO-HI");
	assert_refused("n[-]", "'n[-]': '-' is not a number or a range LO-HI");
	assert_refused("n[1-2-3]", "'n[1-2-3]': '1-2-3' is not a number or a range LO-HI");
	assert_refused("n[1--3]", "'n[1--3]': '1--3' is not a number or a range LO-HI");
	assert_refused("n[a-b]", "'n[a-b]': 'a-b' is not a number or a range LO-HI");
	assert_refused("n[0x1-3]", "'n[0x1-3]': '0x1-3' is not a number or a range LO-HI");
	assert_refused("n[ 1-2]", "'n[ 1-2]': ' 1-2' is not a number or a range LO-HI");
	assert_refused("n[+1]", "'n[+1]': '+1' is not a number or a range LO-HI");
	assert_refused("n[1-3],m[4,x]", "'m[4,x]': 'x' is not a number or a range LO-HI");
	assert_refused("n[2-1]", "'n[2-1]': the range '2-1' runs backwards");
	assert_refused("n[010-8]", "'n[010-8]': the range '010-8' runs backwards");
	assert_refused("n[1-9999999999999999999]",
		       "'n[1-9999999999999999999]': '1-9999999999999999999' has a number of more than 18 digits");
	/* Slurm refuses text after the last group too. */
	assert_refused("n[0-2]-ib", "'n[0-2]-ib': nothing may follow the last ']'");
	assert_refused("n[1-2]x[3-4]y", "'n[1-2]x[3-4]y': nothing may follow the last ']'");
}

/* What config_check_name refuses, in a plain name or around groups. */
static void test_bad_names(void **state)
{
	(void)state;
	assert_refused("a b", "'a b': a name has only letters, digits, '.', '-' and '_'");
	assert_refused("n0, n1", "' n1': a name has only letters, digits, '.', '-' and '_'");
	assert_refused("n0\tn1", "'n0?n1': a name has only letters, digits, '.', '-' and '_'");
	assert_refused("a$", "'a$': a name has only letters, digits, '.', '-' and '_'");
	assert_refused("n/[1-2]", "'n/[1-2]': a name has only letters, digits, '.', '-' and '_'");
	assert_refused("n[1-2]/[3]", "'n[1-2]/[3]': a name has only letters, digits, '.', '-' and '_'");
	assert_refused(".a", "'.a': a name does not start with '.' or '-'");
	assert_refused("-a", "'-a': a name does not start with '.' or '-'");
	assert_refused("-[1-2]", "'-[1-2]': a name does not start with '.' or '-'");
	assert_refused("n1,.[1]", "'.[1]': a name does not start with '.' or '-'");
}

/* At most 255 bytes a name, checked with the longest name of an item. */
static void test_long_names(void **state)
{
	char expr[600], want[300];
	char **names;
	size_t n;

	(void)state;
	memset(want, 'a', 255);
	want[255] = '\0';
	assert_expands(want, want);
	snprintf(expr, sizeof(expr), "%sa", want);
	/* The quote is cut to 80 bytes so that the reason fits. */
	assert_int_equal(hostlist_expand(expr, 4096, &names, &n, why, sizeof(why)), -EINVAL);
	assert_int_equal(strlen(why), 80 + 2 + strlen(": name longer than 255 bytes"));
	assert_memory_equal(why, "'aaaaaaaaaa", 11);
	assert_string_equal(why + 78, "...': name longer than 255 bytes");

	/* 252 + 3 digits: the longest is 255 bytes. */
	snprintf(expr, sizeof(expr), "%.252s[1-999]", want);
	assert_int_equal(hostlist_expand(expr, 1000, &names, &n, why, sizeof(why)), 0);
	assert_int_equal(n, 999);
	assert_int_equal(strlen(names[998]), 255);
	hostlist_free(names, n);
	/* ...but 1000 is one byte too many, even though it is the last. */
	snprintf(expr, sizeof(expr), "%.252s[1-1000]", want);
	assert_int_equal(hostlist_expand(expr, 4096, &names, &n, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "name longer than 255 bytes"));
	/* The padding counts, and the widest range need not be the last. */
	snprintf(expr, sizeof(expr), "%.252s[0001,2]", want);
	assert_int_equal(hostlist_expand(expr, 4096, &names, &n, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "name longer than 255 bytes"));
	/* Across groups. */
	snprintf(expr, sizeof(expr), "%.250s[1-2]x[10-11]y", want);
	assert_int_equal(hostlist_expand(expr, 4096, &names, &n, why, sizeof(why)), -EINVAL);
	snprintf(expr, sizeof(expr), "%.250s[1-2]x[10-11]", want);
	assert_int_equal(hostlist_expand(expr, 4096, &names, &n, why, sizeof(why)), 0);
	assert_int_equal(n, 4);
	hostlist_free(names, n);
}

static void test_max(void **state)
{
	(void)state;
	assert_expands_max("n[1-4]", 4, "n1 n2 n3 n4");
	assert_refused_max("n[1-4]", 3, -E2BIG, "'n[1-4]': more than 3 names");
	assert_refused_max("a,b,n[1-4]", 5, -E2BIG, "'n[1-4]': more than 5 names");
	assert_refused_max("a", 0, -E2BIG, "'a': more than 0 names");
	/* The syntax is checked whole first: the bad item is reported. */
	assert_refused_max("n[0-999999999],x[", 4096, -EINVAL, "'x[': '[' without ']'");
	assert_refused_max("n[0-999999999],x[2-1]", 4096, -EINVAL, "'x[2-1]': the range '2-1' runs backwards");
}

/* Ranges far beyond max fail at once, without making their names. */
static void test_huge_ranges_fail_fast(void **state)
{
	static const char *const exprs[] = {
		"n[0-999999999]",
		"n[0-999999999999999999]",
		"a[0-999999999]b[0-999999999]c[0-999999999]",
		"n[1-3],m[000000000-999999999]",
	};
	char **names;
	size_t n;

	(void)state;
	for (size_t i = 0; i < sizeof(exprs) / sizeof(exprs[0]); i++) {
		double t0 = now();

		assert_int_equal(hostlist_expand(exprs[i], 4096, &names, &n, why, sizeof(why)), -E2BIG);
		assert_non_null(strstr(why, "more than 4096 names"));
		assert_true(now() - t0 < 2.0);
	}
	assert_int_equal(hostlist_expand("n[0-999999999]", 1, &names, &n, why, sizeof(why)), -E2BIG);
	assert_string_equal(why, "'n[0-999999999]': more than 1 name");
}

/* Names made again and again cost work but no memory: bounded too. */
static void test_endless_repeats(void **state)
{
	size_t len = 2 + 2 * 70000 + 1;
	char *expr = malloc(len + 1), *o = expr, **names;
	double t0;
	size_t n;

	(void)state;
	assert_non_null(expr);
	o += sprintf(o, "n[");
	for (int i = 0; i < 70000; i++)
		o += sprintf(o, "%s1", i ? "," : "");
	sprintf(o, "]");
	t0 = now();
	assert_int_equal(hostlist_expand(expr, 4096, &names, &n, why, sizeof(why)), -E2BIG);
	assert_memory_equal(why, "'n[1,1,1,", 9);
	assert_non_null(strstr(why, "...': more than 65536 names given twice"));
	assert_true(now() - t0 < 2.0);
	free(expr);

	/* 8 numbers a group, 2 of them new; 10 groups: 8^10 names, 1024 new. */
	t0 = now();
	assert_int_equal(hostlist_expand("a[1-2,1-2,1-2,1-2]b[1-2,1-2,1-2,1-2]c[1-2,1-2,1-2,1-2]"
					 "d[1-2,1-2,1-2,1-2]e[1-2,1-2,1-2,1-2]f[1-2,1-2,1-2,1-2]"
					 "g[1-2,1-2,1-2,1-2]h[1-2,1-2,1-2,1-2]i[1-2,1-2,1-2,1-2]"
					 "j[1-2,1-2,1-2,1-2]", 4096, &names, &n, why, sizeof(why)), -E2BIG);
	assert_non_null(strstr(why, "more than 65536 names given twice"));
	assert_true(now() - t0 < 2.0);

	/* Just under the bound is fine: 65536 repeats of one name. */
	expr = malloc(2 * 65537 + 3);
	assert_non_null(expr);
	o = expr;
	o += sprintf(o, "n[");
	for (int i = 0; i < 65537; i++)
		o += sprintf(o, "%s1", i ? "," : "");
	sprintf(o, "]");
	assert_expands(expr, "n1");
	free(expr);
}

/* Many items: the hash set grows and still finds every repeat. */
static void test_many_names(void **state)
{
	char *expr = malloc(4096 * 8 * 2 + 16), *o = expr, **names;
	size_t n;

	(void)state;
	assert_non_null(expr);
	for (int i = 0; i < 4096; i++)
		o += sprintf(o, "%sh%d", i ? "," : "", i);
	for (int i = 4095; i >= 0; i--)
		o += sprintf(o, ",h%d", i);
	assert_int_equal(hostlist_expand(expr, 4096, &names, &n, why, sizeof(why)), 0);
	assert_int_equal(n, 4096);
	for (size_t i = 0; i < n; i++) {
		char want[32];

		snprintf(want, sizeof(want), "h%zu", i);
		assert_string_equal(names[i], want);
	}
	hostlist_free(names, n);
	sprintf(o, ",h4096");
	assert_int_equal(hostlist_expand(expr, 4096, &names, &n, why, sizeof(why)), -E2BIG);
	assert_string_equal(why, "'h4096': more than 4096 names");
	free(expr);

	assert_int_equal(hostlist_expand("n[0-4095]", 4096, &names, &n, why, sizeof(why)), 0);
	assert_int_equal(n, 4096);
	assert_string_equal(names[4095], "n4095");
	hostlist_free(names, n);
}

/* Messages quote outside text: control bytes are neutralised, long items
 * cut so the reason survives, a short buffer truncated safely. */
static void test_messages(void **state)
{
	char small[8], **names;
	size_t n;

	(void)state;
	assert_refused("n\x1b[31m", "'n?[31m': '[' without ']'");
	assert_refused("a\x7f", "'a?': a name has only letters, digits, '.', '-' and '_'");
	assert_int_equal(hostlist_expand("n[2-1]", 10, &names, &n, small, sizeof(small)), -EINVAL);
	assert_string_equal(small, "'n[2-1]");
	assert_int_equal(hostlist_expand("n[2-1]", 10, &names, &n, NULL, 0), -EINVAL);
	assert_int_equal(hostlist_expand("n[1-3]", 10, &names, &n, NULL, 0), 0);
	assert_int_equal(n, 3);
	hostlist_free(names, n);
	hostlist_free(NULL, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plain),
		cmocka_unit_test(test_ranges),
		cmocka_unit_test(test_padding),
		cmocka_unit_test(test_groups),
		cmocka_unit_test(test_repeats),
		cmocka_unit_test(test_malformed),
		cmocka_unit_test(test_bad_names),
		cmocka_unit_test(test_long_names),
		cmocka_unit_test(test_max),
		cmocka_unit_test(test_huge_ranges_fail_fast),
		cmocka_unit_test(test_endless_repeats),
		cmocka_unit_test(test_many_names),
		cmocka_unit_test(test_messages),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
