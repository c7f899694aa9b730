/* common/prom.c: the exposition text byte for byte (families, labels, the
 * escapes of HELP and of label values, numbers exact or shortest), names
 * the format refuses, and the size cap, each error sticky. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/prom.h"

static void test_text(void **state)
{
	struct prom p;

	prom_init(&p);
	prom_family(&p, "stage_x_total", "counter", "Bytes \\ of\nit.");
	prom_u64(&p, NULL, 18446744073709551615ull);
	prom_family(&p, "stage_lag_seconds", "gauge", "Lag.");
	prom_f64(&p, (const char *[]){ "peer", "n1", NULL }, 0.1);
	prom_f64(&p, (const char *[]){ "peer", "a\"b\\c\nd", "state", "up", NULL }, 1796189058.603);
	prom_f64(&p, (const char *[]){ "peer", "n2", NULL }, NAN);
	prom_f64(&p, (const char *[]){ "peer", "n3", NULL }, -INFINITY);
	prom_f64(&p, (const char *[]){ "peer", "n4", NULL }, 1.0 / 3);
	assert_int_equal(prom_error(&p), 0);
	assert_string_equal(p.buf,
		"# HELP stage_x_total Bytes \\\\ of\\nit.\n"
		"# TYPE stage_x_total counter\n"
		"stage_x_total 18446744073709551615\n"
		"# HELP stage_lag_seconds Lag.\n"
		"# TYPE stage_lag_seconds gauge\n"
		"stage_lag_seconds{peer=\"n1\"} 0.1\n"
		"stage_lag_seconds{peer=\"a\\\"b\\\\c\\nd\",state=\"up\"} 1796189058.603\n"
		"stage_lag_seconds{peer=\"n2\"} NaN\n"
		"stage_lag_seconds{peer=\"n3\"} -Inf\n"
		"stage_lag_seconds{peer=\"n4\"} 0.33333333333333331\n");
	assert_int_equal(p.len, strlen(p.buf));
	prom_free(&p);
}

/* Each mistake stops the text: the error stays, nothing more is added. */
static void assert_refused(void (*write)(struct prom *))
{
	struct prom p;
	size_t len;

	prom_init(&p);
	prom_family(&p, "ok_total", "counter", "fine");
	write(&p);
	assert_int_equal(prom_error(&p), -EINVAL);
	len = p.len;
	prom_family(&p, "more_total", "counter", "after");
	prom_u64(&p, NULL, 1);
	assert_int_equal(p.len, len);
	assert_int_equal(prom_error(&p), -EINVAL);
	prom_free(&p);
}

static void bad_name(struct prom *p) { prom_family(p, "9lives", "gauge", "x"); }
static void bad_char(struct prom *p) { prom_family(p, "a-b", "gauge", "x"); }
static void bad_type(struct prom *p) { prom_family(p, "a", "histogram", "x"); }
static void bad_label(struct prom *p) { prom_u64(p, (const char *[]){ "pe-er", "x", NULL }, 1); }
static void reserved_label(struct prom *p) { prom_u64(p, (const char *[]){ "__name__", "x", NULL }, 1); }
static void odd_labels(struct prom *p) { prom_u64(p, (const char *[]){ "peer", NULL }, 1); }
static void too_many(struct prom *p)
{
	prom_u64(p, (const char *[]){ "a", "1", "b", "1", "c", "1", "d", "1", "e", "1", "f", "1",
				      "g", "1", "h", "1", "i", "1", NULL }, 1);
}

static void test_refusals(void **state)
{
	struct prom p;

	assert_refused(bad_name);
	assert_refused(bad_char);
	assert_refused(bad_type);
	assert_refused(bad_label);
	assert_refused(reserved_label);
	assert_refused(odd_labels);
	assert_refused(too_many);
	/* A sample before any family. */
	prom_init(&p);
	prom_u64(&p, NULL, 1);
	assert_int_equal(prom_error(&p), -EINVAL);
	prom_free(&p);
	/* Colons are allowed in a metric's name, not in a label's. */
	prom_init(&p);
	prom_family(&p, "job:stage_x:rate", "gauge", "x");
	prom_u64(&p, (const char *[]){ "a_b1", "v", NULL }, 2);
	assert_int_equal(prom_error(&p), 0);
	assert_non_null(strstr(p.buf, "\njob:stage_x:rate{a_b1=\"v\"} 2\n"));
	prom_free(&p);
}

/* Names up to the limit come out whole (an early version cut any line
 * past 64 bytes without an error). */
static void test_long_names(void **state)
{
	char name[129], want[512];
	struct prom p;

	memset(name, 'n', sizeof(name) - 1);
	name[sizeof(name) - 1] = '\0';
	prom_init(&p);
	prom_family(&p, name, "gauge", "h");
	assert_int_equal(prom_error(&p), -EINVAL);      /* 128 bytes: one too many */
	prom_free(&p);
	name[120] = '\0';
	prom_init(&p);
	prom_family(&p, name, "gauge", "h");
	prom_u64(&p, NULL, 7);
	assert_int_equal(prom_error(&p), 0);
	snprintf(want, sizeof(want), "# HELP %s h\n# TYPE %s gauge\n%s 7\n", name, name, name);
	assert_string_equal(p.buf, want);
	prom_free(&p);
}

static void test_cap(void **state)
{
	char help[4096];
	struct prom p;
	size_t last = 0;

	memset(help, 'h', sizeof(help) - 1);
	help[sizeof(help) - 1] = '\0';
	prom_init(&p);
	for (int i = 0; i < 4096 && !prom_error(&p); i++) {
		last = p.len;
		prom_family(&p, "stage_big", "gauge", help);
	}
	assert_int_equal(prom_error(&p), -E2BIG);
	assert_true(p.len <= PROM_MAX && p.len >= PROM_MAX - 8192);
	assert_true(last <= p.len);
	prom_free(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_text),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_long_names),
		cmocka_unit_test(test_cap),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
