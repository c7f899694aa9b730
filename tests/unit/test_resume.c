/* daemon/restore/resume_decide.c: which step a job resumes from and what is
 * repaired, on in-memory cells: the newest step every origin holds intact
 * somewhere, natural step order (step-1000 after step-200), a node not
 * asked, copies of two commits, --nodes naming a node with nothing, steps
 * skipped after a deep look, and each reason said. No daemon, no network. */
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

#include "common/digest.h"
#include "daemon/restore/resume.h"

static digest_t R(uint64_t x)
{
	digest_t d = { .low64 = x, .high64 = 0xfeed0000u + x };

	return d;
}

#define CELL(o, h, s, st, r) \
	((struct hold_cell){ .origin = (char *)(o), .holder = (char *)(h), \
			     .state = (char *)(s), .step = (char *)(st), \
			     .has_root = (r) != 0, .root = R(r) })

static const char *const names3[] = { "n0", "n1", "n2" };
static bool all_up[] = { true, true, true };

static struct resume_in in3(const struct hold_cell *cells, size_t n)
{
	return (struct resume_in){ .names = names3, .reached = all_up, .nnodes = 3,
				   .cells = cells, .ncells = n };
}

/* Every origin's own copy and one replica (n0 -> n1 -> n2 -> n0) of step. */
#define INTACT(st, r) \
	CELL("n0", "n0", "ok", st, r), CELL("n0", "n1", "ok", st, r), \
	CELL("n1", "n1", "ok", st, (r) + 1), CELL("n1", "n2", "ok", st, (r) + 1), \
	CELL("n2", "n2", "ok", st, (r) + 2), CELL("n2", "n0", "ok", st, (r) + 2)

static bool said(const struct resume_out *o, const char *text)
{
	for (size_t i = 0; i < o->nwhy; i++)
		if (strstr(o->why[i], text))
			return true;
	return false;
}

static void test_newest_intact_natural_order(void **state)
{
	struct hold_cell c[] = { INTACT("step-200", 10), INTACT("step-1000", 20),
				 INTACT("step-30", 30) };
	struct resume_in in = in3(c, sizeof(c) / sizeof(c[0]));
	struct resume_out out;

	assert_int_equal(resume_decide(&in, &out), 0);
	assert_string_equal(out.step, "step-1000");
	assert_int_equal(out.nfix, 0);
	assert_int_equal(out.norigins, 3);
	resume_out_free(&out);
}

static void test_repairs_from_an_intact_copy(void **state)
{
	struct hold_cell c[] = {
		INTACT("step-100", 10),
		CELL("n0", "n0", "ok", "step-200", 40), CELL("n0", "n1", "ok", "step-200", 40),
		CELL("n1", "n1", "damaged", "step-200", 41), CELL("n1", "n2", "ok", "step-200", 41),
		/* n2's own copy is gone: only its replica on n0 says it wrote one */
		CELL("n2", "n0", "ok", "step-200", 42),
	};
	struct resume_in in = in3(c, sizeof(c) / sizeof(c[0]));
	struct resume_out out;

	assert_int_equal(resume_decide(&in, &out), 0);
	assert_string_equal(out.step, "step-200");
	assert_int_equal(out.nfix, 2);
	assert_string_equal(out.fix[0].origin, "n1");
	assert_string_equal(out.fix[0].from, "n2");
	assert_string_equal(out.fix[1].origin, "n2");
	assert_string_equal(out.fix[1].from, "n0");
	resume_out_free(&out);
}

/* Placement: the next node of the ring n0 -> n1 -> n2 -> n0. */
static size_t ring(const char *origin, const char **out, size_t cap)
{
	for (size_t i = 0; i < 3; i++)
		if (strcmp(origin, names3[i]) == 0 && cap) {
			out[0] = names3[(i + 1) % 3];
			return 1;
		}
	return 0;
}

static void test_lost_replicas_sent_again(void **state)
{
	/* n1 was replaced: its own copy and n0's replica on it are gone. */
	struct hold_cell c[] = {
		CELL("n0", "n0", "ok", "step-100", 10),
		CELL("n1", "n2", "ok", "step-100", 11),
		CELL("n2", "n2", "ok", "step-100", 12), CELL("n2", "n0", "ok", "step-100", 12),
	};
	bool up[] = { true, true, true };
	struct resume_in in = in3(c, sizeof(c) / sizeof(c[0]));
	struct resume_out out;

	in.placement = ring;
	assert_int_equal(resume_decide(&in, &out), 0);
	assert_int_equal(out.nfix, 1);
	assert_string_equal(out.fix[0].origin, "n1");
	assert_string_equal(out.fix[0].from, "n2");
	assert_int_equal(out.nsend, 1);
	assert_string_equal(out.send[0].origin, "n0");
	assert_string_equal(out.send[0].to, "n1");
	resume_out_free(&out);
	/* A partner that did not answer is not sent to blind. */
	up[1] = false;
	in.reached = up;
	in.origins = (const char *const[]){ "n0", "n2" };
	in.norigins = 2;
	assert_int_equal(resume_decide(&in, &out), 0);
	assert_int_equal(out.nsend, 0);
	resume_out_free(&out);
}

static void test_falls_back_and_says_why(void **state)
{
	struct hold_cell c[] = {
		INTACT("step-100", 10),
		/* step-200: n2 never wrote it */
		CELL("n0", "n0", "ok", "step-200", 40), CELL("n0", "n1", "ok", "step-200", 40),
		CELL("n1", "n1", "ok", "step-200", 41), CELL("n1", "n2", "ok", "step-200", 41),
		/* step-300: n1's shards damaged wherever they are */
		INTACT("step-300", 50),
	};
	struct resume_in in = in3(c, sizeof(c) / sizeof(c[0]));
	struct resume_out out;

	c[sizeof(c) / sizeof(c[0]) - 4].state = "damaged";     /* n1 on n1, step-300 */
	c[sizeof(c) / sizeof(c[0]) - 3].state = "incomplete";  /* n1 on n2 */
	assert_int_equal(resume_decide(&in, &out), 0);
	assert_string_equal(out.step, "step-100");
	assert_true(said(&out, "step-300: no intact copy of n1's shards on any node (its own is "
			 "damaged)"));
	assert_true(said(&out, "step-200: no copy of n2's shards on any node"));
	resume_out_free(&out);
}

static void test_two_commits_not_mixed(void **state)
{
	struct hold_cell c[] = { INTACT("step-100", 10) };
	struct resume_in in = in3(c, 6);
	struct resume_out out;

	c[1].root = R(99);      /* n0's replica on n1: another commit of step-100 */
	assert_int_equal(resume_decide(&in, &out), 1);
	assert_null(out.step);
	assert_true(said(&out, "n0's copies on n0 and n1 are of two different commits"));
	resume_out_free(&out);
}

static void test_unasked_origin_blocks(void **state)
{
	struct hold_cell c[] = { INTACT("step-100", 10) };
	bool up[] = { true, true, false };
	struct resume_in in = in3(c, 4);        /* n2 answered nothing: its cells absent */
	struct resume_out out;

	in.reached = up;
	assert_int_equal(resume_decide(&in, &out), 1);
	assert_true(said(&out, "step-100: n2 could not be asked"));
	resume_out_free(&out);
	/* Left out of the job by --nodes, the others resume. */
	in.origins = names3;
	in.norigins = 2;
	assert_int_equal(resume_decide(&in, &out), 0);
	assert_string_equal(out.step, "step-100");
	assert_int_equal(out.norigins, 2);
	resume_out_free(&out);
}

/* The durable tier is one more holder: an origin whose only intact copy is
 * there is restored from it; the tier unreadable is no origin of the job. */
static void test_durable_tier_as_holder(void **state)
{
	static const char *const names[] = { "n0", "n1", "n2", "durable" };
	bool up[] = { true, true, true, true };
	struct hold_cell c[] = {
		CELL("n0", "durable", "ok", "step-100", 10),
		CELL("n1", "n1", "ok", "step-100", 11), CELL("n1", "n2", "ok", "step-100", 11),
		CELL("n2", "n2", "ok", "step-100", 12), CELL("n2", "n0", "incomplete", "step-100", 0),
		CELL("n1", "durable", "ok", "step-100", 11),
	};
	struct resume_in in = { .names = names, .reached = up, .nnodes = 4, .cells = c,
				.ncells = 6 };
	struct resume_out out;

	assert_int_equal(resume_decide(&in, &out), 0);
	assert_string_equal(out.step, "step-100");
	assert_int_equal(out.norigins, 3);
	assert_int_equal(out.nfix, 1);
	assert_string_equal(out.fix[0].origin, "n0");
	assert_string_equal(out.fix[0].from, "durable");
	assert_true(digest_eq(out.fix[0].root, R(10)));
	resume_out_free(&out);
	/* A durable copy of another commit than the node's own: not mixed. */
	c[0] = CELL("n0", "n0", "ok", "step-100", 10);
	c[5] = CELL("n1", "durable", "ok", "step-100", 99);
	assert_int_equal(resume_decide(&in, &out), 1);
	assert_true(said(&out, "n1's copies on n1 and durable are of two different commits"));
	resume_out_free(&out);
	/* The tier could not be read: said by the caller, but no node of the job. */
	c[5] = CELL("n1", "n1", "ok", "step-100", 11);
	up[3] = false;
	in.ncells = 5;
	assert_int_equal(resume_decide(&in, &out), 0);
	assert_int_equal(out.norigins, 3);
	resume_out_free(&out);
}

static void test_nodes_naming_one_with_nothing(void **state)
{
	static const char *const job[] = { "n0", "n1", "n2", "n3" };
	static const char *const names[] = { "n0", "n1", "n2", "n3" };
	bool up[] = { true, true, true, true };
	struct hold_cell c[] = { INTACT("step-100", 10) };
	struct resume_in in = { .origins = job, .norigins = 4, .names = names, .reached = up,
				.nnodes = 4, .cells = c, .ncells = 6 };
	struct resume_out out;

	assert_int_equal(resume_decide(&in, &out), 1);
	assert_true(said(&out, "step-100: no copy of n3's shards on any node"));
	resume_out_free(&out);
}

static void test_ghost_origin_left_out(void **state)
{
	/* n0 holds a stale replica of "old", a node the hosts file no longer names. */
	struct hold_cell c[] = { INTACT("step-100", 10), CELL("old", "n0", "ok", "step-100", 77) };
	struct resume_in in = in3(c, sizeof(c) / sizeof(c[0]));
	struct resume_out out;

	assert_int_equal(resume_decide(&in, &out), 0);
	assert_string_equal(out.step, "step-100");
	assert_int_equal(out.norigins, 3);
	assert_true(said(&out, "old (copies on n0) is not in the hosts file: left out of the job"));
	resume_out_free(&out);
}

static void test_skip_and_other_steps(void **state)
{
	static const char *const skip[] = { "step-200" };
	struct hold_cell c[] = { INTACT("step-100", 10), INTACT("step-200", 20),
				 CELL("n0", "n2", "other-step", "step-900", 0) };
	struct resume_in in = in3(c, sizeof(c) / sizeof(c[0]));
	struct resume_out out;

	in.skip = skip;
	in.nskip = 1;
	/* "other-step" names a step, but holds none of this one: not a candidate. */
	assert_int_equal(resume_decide(&in, &out), 0);
	assert_string_equal(out.step, "step-100");
	resume_out_free(&out);
	in.ncells = 0;
	assert_int_equal(resume_decide(&in, &out), 1);
	assert_true(said(&out, "no other step of this job is held"));
	resume_out_free(&out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_newest_intact_natural_order),
		cmocka_unit_test(test_repairs_from_an_intact_copy),
		cmocka_unit_test(test_lost_replicas_sent_again),
		cmocka_unit_test(test_falls_back_and_says_why),
		cmocka_unit_test(test_two_commits_not_mixed),
		cmocka_unit_test(test_unasked_origin_blocks),
		cmocka_unit_test(test_nodes_naming_one_with_nothing),
		cmocka_unit_test(test_durable_tier_as_holder),
		cmocka_unit_test(test_ghost_origin_left_out),
		cmocka_unit_test(test_skip_and_other_steps),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
