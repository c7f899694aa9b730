/* daemon/survey/cverify.c's decision of `stage verify --cluster` (cverify_decide),
 * on in-memory cells and a ring placement: no daemon, no network. The wire
 * format of the cells (hold_put, hold_parse) is test_hold.c's; hold_parse
 * appears here only where a failed answer feeds the decision. Every test
 * runs by default. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/digest.h"
#include "common/proto.h"
#include "daemon/survey/cverify.h"
#include "daemon/survey/hold.h"

#define STEP "step-100"

/* ------------------------------------------------------------------ */
/* Helpers                                                             */

static digest_t R(uint64_t x)
{
	digest_t d = { .low64 = x, .high64 = 0x5eed0000u + x };

	return d;
}

static char *hex_of(uint64_t x, char out[DIGEST_HEX_LEN + 1])
{
	digest_to_hex(R(x), out);
	return out;
}

/* A cell of string literals, for cverify_decide's input (never freed).
 * root 0: none. */
#define CELL(o, h, s, st, r) \
	((struct hold_cell){ .origin = (char *)(o), .holder = (char *)(h), \
			     .state = (char *)(s), .step = (char *)(st), \
			     .has_root = (r) != 0, .root = R(r) })

/* Placement: the next node of a ring n0 .. n(ring_n - 1), one replica. */
static size_t ring_n = 4;
static const char *const ring_names[] = { "n0", "n1", "n2", "n3", "n4", "n5" };

static size_t ring_placement(const char *origin, const char **out, size_t cap)
{
	for (size_t i = 0; i < ring_n; i++)
		if (strcmp(origin, ring_names[i]) == 0 && cap >= 1) {
			out[0] = ring_names[(i + 1) % ring_n];
			return 1;
		}
	return 0;       /* not a node of the hosts file */
}

static const struct hold_cell *row(const struct cverify_out *o, const char *origin,
				   const char *holder)
{
	const struct hold_cell *found = NULL;

	for (size_t i = 0; i < o->ntable; i++)
		if (strcmp(o->table[i].origin, origin) == 0 &&
		    strcmp(o->table[i].holder, holder) == 0) {
			assert_null(found);     /* one row per (origin, holder) */
			found = &o->table[i];
		}
	return found;
}

static size_t row_index(const struct cverify_out *o, const char *origin, const char *holder)
{
	for (size_t i = 0; i < o->ntable; i++)
		if (strcmp(o->table[i].origin, origin) == 0 &&
		    strcmp(o->table[i].holder, holder) == 0)
			return i;
	fail_msg("no row (%s, %s)", origin, holder);
	return 0;
}

static void assert_row(const struct cverify_out *o, const char *origin, const char *holder,
		       const char *state)
{
	const struct hold_cell *c = row(o, origin, holder);

	if (!c)
		fail_msg("no row (%s, %s), wanted %s", origin, holder, state);
	assert_string_equal(c->state, state);
}

/* The problems are NULL-terminated, and none is empty. */
static void assert_problems_sane(const struct cverify_out *o)
{
	if (o->nproblems == 0) {
		assert_true(o->problems == NULL || o->problems[0] == NULL);
		return;
	}
	assert_non_null(o->problems);
	for (size_t i = 0; i < o->nproblems; i++) {
		assert_non_null(o->problems[i]);
		assert_true(o->problems[i][0] != '\0');
	}
	assert_null(o->problems[o->nproblems]);
}

static bool has_problem(const struct cverify_out *o, const char *exact)
{
	for (size_t i = 0; i < o->nproblems; i++)
		if (strcmp(o->problems[i], exact) == 0)
			return true;
	return false;
}

static size_t problems_with(const struct cverify_out *o, const char *needle)
{
	size_t n = 0;

	for (size_t i = 0; i < o->nproblems; i++)
		n += strstr(o->problems[i], needle) != NULL;
	return n;
}

static void assert_has_problem(const struct cverify_out *o, const char *exact)
{
	if (has_problem(o, exact))
		return;
	for (size_t i = 0; i < o->nproblems; i++)
		print_message("  problem: %s\n", o->problems[i]);
	fail_msg("no problem \"%s\"", exact);
}

static const bool all_reached[6] = { true, true, true, true, true, true };
static const char *const no_why[6] = { "", "", "", "", "", "" };

static int decide(size_t nnodes, const bool *reached, const char *const *why,
		  const struct hold_cell *cells, size_t ncells, struct cverify_out *out)
{
	struct cverify_in in = {
		.step = STEP, .nnodes = nnodes, .names = ring_names,
		.reached = reached ? reached : all_reached, .why = why ? why : no_why,
		.cells = cells, .ncells = ncells, .placement = ring_placement,
	};
	int rc = cverify_decide(&in, out);

	assert_true(rc >= 0);
	assert_problems_sane(out);
	assert_int_equal(rc, out->nproblems ? 1 : 0);
	return rc;
}

/* ------------------------------------------------------------------ */
/* cverify_decide                                                      */

static void setup_ring(size_t n)
{
	ring_n = n;
}

/* 3 nodes, ring n0 -> n1 -> n2 -> n0: everything there, same roots. The
 * cells come in no particular order; the table is origin by origin in
 * hosts file order, holders in hosts file order. */
static void test_all_intact(void **state)
{
	const struct hold_cell cells[] = {
		CELL("n2", "n0", "ok", STEP, 3), CELL("n1", "n1", "ok", STEP, 2),
		CELL("n0", "n1", "ok", STEP, 1), CELL("n2", "n2", "ok", STEP, 3),
		CELL("n0", "n0", "ok", STEP, 1), CELL("n1", "n2", "ok", STEP, 2),
	};
	struct cverify_out out;

	setup_ring(3);
	assert_int_equal(decide(3, NULL, NULL, cells, 6, &out), 0);
	assert_int_equal(out.nproblems, 0);
	assert_int_equal(out.ntable, 6);
	assert_int_equal(out.norigins, 3);
	assert_true(out.recoverable);
	for (size_t i = 0; i < 6; i++) {
		assert_string_equal(out.table[i].state, "ok");
		assert_string_equal(out.table[i].step, STEP);
		assert_true(out.table[i].has_root);
	}
	assert_int_equal(row_index(&out, "n0", "n0"), 0);
	assert_int_equal(row_index(&out, "n0", "n1"), 1);
	assert_int_equal(row_index(&out, "n1", "n1"), 2);
	assert_int_equal(row_index(&out, "n1", "n2"), 3);
	assert_int_equal(row_index(&out, "n2", "n0"), 4);
	assert_int_equal(row_index(&out, "n2", "n2"), 5);
	assert_true(digest_eq(row(&out, "n1", "n2")->root, R(2)));
	cverify_free(&out);
	assert_null(out.table);
	assert_null(out.problems);
}

static void test_own_damaged(void **state)
{
	struct hold_cell dmg = CELL("n1", "n1", "damaged", STEP, 2);
	struct cverify_out out;

	dmg.text[0] = "changed a/b: size 3, manifest says 4";
	dmg.text[1] = "missing c";
	dmg.ntext = 2;
	const struct hold_cell cells[] = {
		CELL("n0", "n0", "ok", STEP, 1), CELL("n0", "n1", "ok", STEP, 1),
		dmg,                             CELL("n1", "n2", "ok", STEP, 2),
		CELL("n2", "n2", "ok", STEP, 3), CELL("n2", "n0", "ok", STEP, 3),
	};

	setup_ring(3);
	assert_int_equal(decide(3, NULL, NULL, cells, 6, &out), 1);
	assert_int_equal(out.nproblems, 1);
	assert_has_problem(&out, "n1's own copy of " STEP " is damaged: changed a/b: size 3, "
			   "manifest says 4");
	assert_true(out.recoverable);
	assert_int_equal(out.ntable, 6);
	assert_row(&out, "n1", "n1", "damaged");
	assert_row(&out, "n1", "n2", "ok");
	/* The texts travel with the row. */
	assert_int_equal(row(&out, "n1", "n1")->ntext, 2);
	assert_string_equal(row(&out, "n1", "n1")->text[1], "missing c");
	cverify_free(&out);
}

/* Every own copy bad the same way, but each partner's copy intact: the
 * step does not verify, restore can repair it. A state with no text has no
 * ": ..." tail. */
static void test_own_incomplete_no_text(void **state)
{
	const struct hold_cell cells[] = {
		CELL("n0", "n0", "incomplete", STEP, 0), CELL("n0", "n1", "ok", STEP, 1),
	};
	struct cverify_out out;

	setup_ring(2);
	assert_int_equal(decide(2, NULL, NULL, cells, 2, &out), 1);
	assert_int_equal(out.nproblems, 1);
	assert_has_problem(&out, "n0's own copy of " STEP " is incomplete");
	assert_true(out.recoverable);
	assert_int_equal(out.norigins, 1);
	assert_int_equal(out.ntable, 2);
	assert_row(&out, "n0", "n0", "incomplete");
	assert_row(&out, "n0", "n1", "ok");
	cverify_free(&out);
}

static void test_own_missing(void **state)
{
	const struct hold_cell cells[] = {
		CELL("n0", "n1", "ok", STEP, 1),
		CELL("n1", "n1", "ok", STEP, 2), CELL("n1", "n2", "ok", STEP, 2),
		CELL("n2", "n2", "ok", STEP, 3), CELL("n2", "n0", "ok", STEP, 3),
	};
	struct cverify_out out;
	const struct hold_cell *c;

	setup_ring(3);
	assert_int_equal(decide(3, NULL, NULL, cells, 5, &out), 1);
	assert_int_equal(out.nproblems, 1);
	assert_has_problem(&out, "n0 has no checkpoint " STEP);
	assert_true(out.recoverable);
	assert_int_equal(out.norigins, 3);
	assert_int_equal(out.ntable, 6);
	assert_row(&out, "n0", "n0", "missing");
	c = row(&out, "n0", "n0");
	assert_string_equal(c->step, STEP);
	assert_false(c->has_root);
	assert_int_equal(c->ntext, 0);
	assert_row(&out, "n0", "n1", "ok");
	assert_int_equal(row_index(&out, "n0", "n0"), 0);
	cverify_free(&out);
}

static void test_partner_missing(void **state)
{
	const struct hold_cell cells[] = {
		CELL("n0", "n0", "ok", STEP, 1),
		CELL("n1", "n1", "ok", STEP, 2), CELL("n1", "n2", "ok", STEP, 2),
		CELL("n2", "n2", "ok", STEP, 3), CELL("n2", "n0", "ok", STEP, 3),
	};
	struct cverify_out out;

	setup_ring(3);
	assert_int_equal(decide(3, NULL, NULL, cells, 5, &out), 1);
	assert_int_equal(out.nproblems, 1);
	assert_has_problem(&out, "n1 holds no copy of n0's " STEP " (placement puts one there)");
	assert_true(out.recoverable);
	assert_int_equal(out.ntable, 6);
	assert_row(&out, "n0", "n1", "missing");
	assert_string_equal(row(&out, "n0", "n1")->step, STEP);
	/* A node placement does not name gets no "missing" row. */
	assert_null(row(&out, "n0", "n2"));
	cverify_free(&out);
}

/* n0's copy to n1 not there, and n0's own copy saying why (a K_COPY note):
 * the problem names what n0 says, the row keeps it, and the counts give
 * the result's advice; a note about a copy that is there, or from an own
 * copy of another step, changes nothing. */
static void test_copy_notes(void **state)
{
	static const struct {
		const char *note, *problem;
		size_t on_way;
	} cases[] = {
		{ "n1 sending: 3.0 of 32.0 MiB sent", "n1 holds no copy of n0's " STEP " yet: n0 is "
		  "sending it (3.0 of 32.0 MiB sent)", 1 },
		{ "n1 queued", "n1 holds no copy of n0's " STEP " yet: it is queued on n0", 1 },
		/* queued after a failed try, or for a partner down: not "on its way" */
		{ "n1 queued: the partner is down (refused)", "n1 holds no copy of n0's " STEP
		  " yet: it is queued on n0: the partner is down (refused)", 0 },
		{ "n1 skipped: step-300 is newer and went first", "n1 holds no copy of n0's " STEP
		  ": n0 skipped it: step-300 is newer and went first ([transfer] stale)", 0 },
		{ "n1 failed: n1: no space", "n1 holds no copy of n0's " STEP ": n0 gave up sending "
		  "it: n1: no space", 0 },
	};

	setup_ring(3);
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++)
		for (int older = 0; older < 2; older++) {
			/* n1 holds nothing of n0, or an older step of n0's */
			struct hold_cell cells[] = {
				CELL("n0", "n0", "ok", STEP, 1),
				CELL("n1", "n1", "ok", STEP, 2), CELL("n1", "n2", "ok", STEP, 2),
				CELL("n2", "n2", "ok", STEP, 3), CELL("n2", "n0", "ok", STEP, 3),
				CELL("n0", "n1", "other-step", "step-90", 9),
			};
			struct cverify_out out;

			cells[0].copy[0] = (char *)cases[k].note;
			cells[0].ncopy = 1;
			assert_int_equal(decide(3, NULL, NULL, cells, 5 + (size_t)older, &out), 1);
			assert_int_equal(out.nproblems, 1);
			assert_has_problem(&out, cases[k].problem);
			assert_int_equal(out.on_way, cases[k].on_way);
			assert_int_equal(out.noted, 1);
			assert_row(&out, "n0", "n1", "missing");
			assert_int_equal(row(&out, "n0", "n1")->ntext, 1);
			assert_string_equal(row(&out, "n0", "n1")->text[0],
					    cases[k].note + 3);
			cverify_free(&out);
		}

	/* A note about a copy that is there (n1 confirmed it since): the
	 * copy is what counts. */
	struct hold_cell there[] = {
		CELL("n0", "n0", "ok", STEP, 1), CELL("n0", "n1", "ok", STEP, 1),
		CELL("n1", "n1", "ok", STEP, 2), CELL("n1", "n2", "ok", STEP, 2),
		CELL("n2", "n2", "ok", STEP, 3), CELL("n2", "n0", "ok", STEP, 3),
	};
	struct cverify_out out;

	there[0].copy[0] = (char *)"n1 sending: 31.0 of 32.0 MiB sent";
	there[0].ncopy = 1;
	assert_int_equal(decide(3, NULL, NULL, there, 6, &out), 0);
	cverify_free(&out);

	/* Nor does one about a copy that is there but damaged: the damage is
	 * the problem, not a copy on its way. */
	there[1].state = (char *)"damaged";
	assert_int_equal(decide(3, NULL, NULL, there, 6, &out), 1);
	assert_int_equal(out.noted, 0);
	assert_int_equal(out.on_way, 0);
	assert_int_equal(problems_with(&out, "sending"), 0);
	assert_has_problem(&out, "the copy of n0's " STEP " on n1 is damaged");
	cverify_free(&out);

	/* n0's own copy is of another step: its notes are not about this one. */
	struct hold_cell other[] = {
		CELL("n0", "n0", "other-step", "step-90", 9),
		CELL("n1", "n1", "ok", STEP, 2), CELL("n1", "n2", "ok", STEP, 2),
		CELL("n2", "n2", "ok", STEP, 3), CELL("n2", "n0", "ok", STEP, 3),
	};

	other[0].copy[0] = (char *)"n1 sending: 3.0 of 32.0 MiB sent";
	other[0].ncopy = 1;
	assert_int_equal(decide(3, NULL, NULL, other, 5, &out), 1);
	assert_int_equal(out.noted, 0);
	assert_int_equal(problems_with(&out, "sending"), 0);
	assert_has_problem(&out, "n1 holds no copy of n0's " STEP " (placement puts one there)");
	cverify_free(&out);
}

static void test_roots_differ(void **state)
{
	const struct hold_cell cells[] = {
		CELL("n0", "n0", "ok", STEP, 1), CELL("n0", "n1", "ok", STEP, 11),
		CELL("n1", "n1", "ok", STEP, 2), CELL("n1", "n2", "ok", STEP, 2),
		CELL("n2", "n2", "ok", STEP, 3), CELL("n2", "n0", "ok", STEP, 3),
	};
	char a[DIGEST_HEX_LEN + 1], b[DIGEST_HEX_LEN + 1], want[256];
	struct cverify_out out;
	const struct hold_cell *c;

	setup_ring(3);
	assert_int_equal(decide(3, NULL, NULL, cells, 6, &out), 1);
	assert_int_equal(out.nproblems, 1);
	snprintf(want, sizeof(want), "the copies of n0's " STEP " differ: n1 has root %s, "
		 "n0 has %s", hex_of(11, a), hex_of(1, b));
	assert_has_problem(&out, want);
	assert_int_equal(problems_with(&out, "differ"), 1);
	assert_true(out.recoverable);      /* n0's own copy is the reference, intact */
	assert_int_equal(out.ntable, 6);
	assert_row(&out, "n0", "n0", "ok");
	assert_row(&out, "n0", "n1", "differs");
	c = row(&out, "n0", "n1");
	assert_true(c->has_root);
	assert_true(digest_eq(c->root, R(11)));
	assert_true(c->ntext >= 1);
	snprintf(want, sizeof(want), "root %s, but the copy on n0 has %s", a, b);
	assert_string_equal(c->text[0], want);
	cverify_free(&out);
}

/* No own copy at the step: the first intact copy is the reference; the
 * other copies are held to it. */
static void test_roots_differ_without_own(void **state)
{
	const struct hold_cell cells[] = {
		CELL("n0", "n0", "incomplete", STEP, 0),
		CELL("n0", "n1", "ok", STEP, 1),
		CELL("n0", "n2", "damaged", STEP, 7),      /* not placed there: still held to n1 */
	};
	struct cverify_out out;
	char a[DIGEST_HEX_LEN + 1], b[DIGEST_HEX_LEN + 1], want[256];

	setup_ring(3);
	assert_int_equal(decide(3, NULL, NULL, cells, 3, &out), 1);
	assert_int_equal(out.norigins, 1);
	assert_row(&out, "n0", "n0", "incomplete");
	assert_row(&out, "n0", "n1", "ok");
	assert_row(&out, "n0", "n2", "differs");
	snprintf(want, sizeof(want), "the copies of n0's " STEP " differ: n2 has root %s, "
		 "n1 has %s", hex_of(7, a), hex_of(1, b));
	assert_has_problem(&out, want);
	assert_has_problem(&out, "n0's own copy of " STEP " is incomplete");
	assert_int_equal(out.nproblems, 2);
	assert_true(out.recoverable);
	cverify_free(&out);
}

/* n2 has only step-90 of its own, and its partner n3 nothing of it: n2
 * never wrote STEP, and it is intact nowhere. */
static void test_other_step(void **state)
{
	const struct hold_cell cells[] = {
		CELL("n0", "n0", "ok", STEP, 1), CELL("n0", "n1", "ok", STEP, 1),
		CELL("n1", "n1", "ok", STEP, 2), CELL("n1", "n2", "ok", STEP, 2),
		CELL("n2", "n2", "other-step", "step-90", 0),
		CELL("n3", "n3", "ok", STEP, 4), CELL("n3", "n0", "ok", STEP, 4),
	};
	struct cverify_out out;

	setup_ring(4);
	assert_int_equal(decide(4, NULL, NULL, cells, 7, &out), 1);
	assert_has_problem(&out, "n2 has no " STEP " (its latest checkpoint of the job is step-90)");
	assert_has_problem(&out, "n3 holds no copy of n2's " STEP " (placement puts one there)");
	assert_has_problem(&out, "n2's shards of " STEP " are intact on no node that answered");
	assert_int_equal(out.nproblems, 3);
	assert_false(out.recoverable);
	assert_int_equal(out.norigins, 4);
	assert_row(&out, "n2", "n2", "other-step");
	assert_string_equal(row(&out, "n2", "n2")->step, "step-90");
	assert_row(&out, "n2", "n3", "missing");
	assert_int_equal(out.ntable, 8);
	cverify_free(&out);
}

/* The partner holds another step of the origin: said when placement puts a
 * copy there, not otherwise. */
static void test_other_step_on_holders(void **state)
{
	const struct hold_cell cells[] = {
		CELL("n0", "n0", "ok", STEP, 1),
		CELL("n0", "n1", "other-step", "step-90", 0),  /* the partner: a problem */
		CELL("n0", "n2", "other-step", "step-80", 0),  /* not placed there: none */
	};
	struct cverify_out out;

	setup_ring(3);
	assert_int_equal(decide(3, NULL, NULL, cells, 3, &out), 1);
	assert_int_equal(out.nproblems, 1);
	assert_has_problem(&out, "n1 holds step-90 of n0, not " STEP);
	assert_true(out.recoverable);
	assert_row(&out, "n0", "n1", "other-step");
	assert_row(&out, "n0", "n2", "other-step");
	assert_int_equal(out.ntable, 3);
	cverify_free(&out);
}

/* A copy where placement does not put one, damaged: still a problem. */
static void test_unplaced_copy_damaged(void **state)
{
	struct hold_cell dmg = CELL("n0", "n2", "damaged", STEP, 1);
	struct cverify_out out;

	dmg.text[0] = "missing x";
	dmg.ntext = 1;
	const struct hold_cell cells[] = {
		CELL("n0", "n0", "ok", STEP, 1), CELL("n0", "n1", "ok", STEP, 1), dmg,
	};

	setup_ring(3);
	assert_int_equal(decide(3, NULL, NULL, cells, 3, &out), 1);
	assert_int_equal(out.nproblems, 1);
	assert_has_problem(&out, "the copy of n0's " STEP " on n2 is damaged: missing x");
	assert_row(&out, "n0", "n2", "damaged");
	assert_true(out.recoverable);
	cverify_free(&out);
}

/* n2 could not be asked; everything the others hold is fine. */
static void test_unreachable(void **state)
{
	const struct hold_cell cells[] = {
		CELL("n0", "n0", "ok", STEP, 1), CELL("n0", "n1", "ok", STEP, 1),
		CELL("n1", "n1", "ok", STEP, 2),         /* n1's partner is n2: unknown */
		CELL("n2", "n3", "ok", STEP, 3),         /* n2's own copy: unknown */
		CELL("n3", "n3", "ok", STEP, 4), CELL("n3", "n0", "ok", STEP, 4),
	};
	const bool reached[4] = { true, true, false, true };
	const char *const why[4] = { "", "", "n2: connection refused", "" };
	struct cverify_out out;
	const struct hold_cell *c;

	setup_ring(4);
	assert_int_equal(decide(4, reached, why, cells, 6, &out), 1);
	assert_int_equal(out.nproblems, 1);
	assert_has_problem(&out, "n2 could not be asked (n2: connection refused): its own copy "
			   "and the replicas it holds are unknown");
	assert_true(out.recoverable);
	assert_int_equal(out.norigins, 4);
	/* No "missing" for what n2 would hold: unknown, not missing. */
	assert_null(row(&out, "n2", "n2"));
	assert_null(row(&out, "n1", "n2"));
	c = row(&out, "", "n2");
	assert_non_null(c);
	assert_string_equal(c->state, "unreachable");
	assert_int_equal(c->ntext, 1);
	assert_string_equal(c->text[0], "n2: connection refused");
	assert_null(c->step);
	assert_false(c->has_root);
	assert_int_equal(out.ntable, 7);
	assert_int_equal(row_index(&out, "", "n2"), 6);   /* after the origins */
	cverify_free(&out);
}

/* A node that could not be asked and of which nobody holds anything: maybe
 * it wrote shards, maybe not. */
static void test_unreachable_not_origin(void **state)
{
	const struct hold_cell cells[] = {
		CELL("n0", "n0", "ok", STEP, 1), CELL("n0", "n1", "ok", STEP, 1),
		CELL("n1", "n1", "ok", STEP, 2),
	};
	const bool reached[3] = { true, true, false };
	const char *const why[3] = { "", "", "n2: timed out" };
	struct cverify_out out;

	setup_ring(3);
	assert_int_equal(decide(3, reached, why, cells, 3, &out), 1);
	assert_int_equal(out.nproblems, 1);
	assert_has_problem(&out, "n2 could not be asked (n2: timed out): the replicas it holds "
			   "are unknown, and whether it wrote shards of its own");
	assert_int_equal(out.norigins, 2);
	assert_row(&out, "", "n2", "unreachable");
	assert_true(out.recoverable);
	cverify_free(&out);
}

static void test_nothing(void **state)
{
	struct cverify_out out;

	setup_ring(3);
	assert_int_equal(decide(3, NULL, NULL, NULL, 0, &out), 1);
	assert_int_equal(out.nproblems, 1);
	assert_has_problem(&out, "no node that answered holds any checkpoint of this job");
	assert_int_equal(out.ntable, 0);
	assert_int_equal(out.norigins, 0);
	assert_false(out.recoverable);
	cverify_free(&out);
}

/* Nobody could be asked: one row and one problem per node, and nothing
 * answered. */
static void test_nobody_reached(void **state)
{
	const bool reached[2] = { false, false };
	const char *const why[2] = { "n0: refused", "n1: refused" };
	struct cverify_out out;

	setup_ring(2);
	assert_int_equal(decide(2, reached, why, NULL, 0, &out), 1);
	assert_int_equal(out.ntable, 2);
	assert_row(&out, "", "n0", "unreachable");
	assert_row(&out, "", "n1", "unreachable");
	assert_int_equal(out.nproblems, 3);
	assert_int_equal(problems_with(&out, "could not be asked"), 2);
	assert_has_problem(&out, "no node that answered holds any checkpoint of this job");
	assert_false(out.recoverable);
	cverify_free(&out);
}

/* n9 is no longer in the hosts file, but n1 still holds its copy: n9 is an
 * origin row all the same, after the hosts file's. Its own copy was not
 * asked about, so the step does not verify; n1's intact copy can restore
 * it. */
static void test_origin_not_asked(void **state)
{
	const struct hold_cell cells[] = {
		CELL("n9", "n1", "ok", STEP, 9),
		CELL("n0", "n0", "ok", STEP, 1), CELL("n0", "n1", "ok", STEP, 1),
		CELL("n1", "n1", "ok", STEP, 2), CELL("n1", "n2", "ok", STEP, 2),
		CELL("n2", "n2", "ok", STEP, 3), CELL("n2", "n0", "ok", STEP, 3),
	};
	struct cverify_out out;
	int rc;

	setup_ring(3);
	rc = decide(3, NULL, NULL, cells, 7, &out);
	assert_int_equal(rc, 1);
	assert_has_problem(&out, "n9 is not in the hosts file, so its own copy of " STEP
			   " was not asked about");
	assert_int_equal(out.nproblems, 1);
	assert_true(out.recoverable);
	assert_int_equal(out.norigins, 4);
	assert_int_equal(out.ntable, 7);       /* no "missing" row for n9's own copy */
	assert_row(&out, "n9", "n1", "ok");
	assert_null(row(&out, "n9", "n9"));
	assert_int_equal(row_index(&out, "n9", "n1"), 6);
	cverify_free(&out);

	/* Its only copy damaged: intact nowhere. */
	struct hold_cell cells2[7];

	memcpy(cells2, cells, sizeof(cells2));
	cells2[0].state = "damaged";
	rc = decide(3, NULL, NULL, cells2, 7, &out);
	assert_int_equal(rc, 1);
	assert_has_problem(&out, "the copy of n9's " STEP " on n1 is damaged");
	assert_has_problem(&out, "n9 is not in the hosts file, so its own copy of " STEP
			   " was not asked about");
	assert_has_problem(&out, "n9's shards of " STEP " are intact on no node that answered");
	assert_int_equal(out.nproblems, 3);
	assert_false(out.recoverable);
	cverify_free(&out);

	/* Two origins the hosts file does not name: in the order the answers
	 * gave them, not by name (the lookups are sorted; the output is not). */
	const struct hold_cell cells3[] = {
		CELL("zz", "n0", "ok", STEP, 8), CELL("aa", "n0", "ok", STEP, 9),
		CELL("n0", "n0", "ok", STEP, 1), CELL("n0", "n1", "ok", STEP, 1),
		CELL("n1", "n1", "ok", STEP, 2), CELL("n1", "n2", "ok", STEP, 2),
		CELL("n2", "n2", "ok", STEP, 3), CELL("n2", "n0", "ok", STEP, 3),
	};

	rc = decide(3, NULL, NULL, cells3, 8, &out);
	assert_int_equal(rc, 1);
	assert_int_equal(out.nproblems, 2);
	assert_non_null(strstr(out.problems[0], "zz is not in the hosts file"));
	assert_non_null(strstr(out.problems[1], "aa is not in the hosts file"));
	assert_true(row_index(&out, "zz", "n0") < row_index(&out, "aa", "n0"));
	cverify_free(&out);
}

/* A node with nothing of the job is not part of it: no origin, no rows. */
static void test_node_without_job(void **state)
{
	const struct hold_cell cells[] = {
		CELL("n0", "n0", "ok", STEP, 1), CELL("n0", "n1", "ok", STEP, 1),
		CELL("n1", "n1", "ok", STEP, 2), CELL("n1", "n0", "ok", STEP, 2),
	};
	struct cverify_out out;

	/* Ring of 2 for placement, but a third node n2 answered with nothing. */
	setup_ring(2);
	assert_int_equal(decide(3, NULL, NULL, cells, 4, &out), 0);
	assert_int_equal(out.norigins, 2);
	assert_int_equal(out.ntable, 4);
	assert_null(row(&out, "n2", "n2"));
	cverify_free(&out);
}

/* ------------------------------------------------------------------ */
/* Failed answers                                                      */

/* A frame that fails half way appends nothing: n1's malformed MSG_HOLD,
 * whose own copy's group has no K_STATE, followed by a good group. And
 * cverify_decide, handed cells it must not trust (a NULL state or origin,
 * an unreached holder, a holder not asked, no holder), drops them rather
 * than use them or crash. */
static void test_parse_all_or_nothing(void **state)
{
	struct hold_cell *cells = NULL;
	struct msg m;
	size_t n = 0;
	pid_t pid;
	int status;

	msg_init(&m, MSG_HOLD);
	msg_put_str(&m, K_ORIGIN, "n1");
	msg_put_str(&m, K_STEP, STEP);
	msg_put_str(&m, K_ORIGIN, "n0");
	msg_put_str(&m, K_STATE, "ok");
	assert_int_equal(hold_parse(&m, "n1", &cells, &n), -EBADMSG);
	msg_free(&m);
	assert_int_equal(n, 0);
	hold_cells_free(cells, n);

	const struct hold_cell bad[] = {
		CELL("n0", "n0", "ok", STEP, 1),
		CELL("n1", "n1", NULL, STEP, 0),          /* unreached, no state */
		CELL("n0", "n1", "ok", STEP, 11),         /* unreached */
		CELL(NULL, "n2", "ok", STEP, 5),          /* no origin */
		CELL("n0", "n2", NULL, STEP, 0),          /* reached, no state */
		CELL("n1", "n2", "ok", STEP, 2),
		CELL("n0", "n9", "damaged", STEP, 12),    /* a holder not asked */
		CELL("n0", NULL, "damaged", STEP, 13),    /* no holder */
		CELL("n2", "n2", "ok", STEP, 3), CELL("n2", "n0", "ok", STEP, 3),
	};
	const size_t nbad = sizeof(bad) / sizeof(bad[0]);
	const bool reached[3] = { true, false, true };    /* n1: "a malformed answer" */
	const char *const why[3] = { "", "n1: a malformed answer", "" };
	struct cverify_out out;

	setup_ring(3);
	/* In a child first: a crash fails this test, not the whole run. */
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* cmocka's handlers would catch the fault and go on in the child. */
		signal(SIGSEGV, SIG_DFL);
		signal(SIGBUS, SIG_DFL);
		if (cverify_decide(&(struct cverify_in){ .step = STEP, .nnodes = 3,
				.names = ring_names, .reached = reached, .why = why,
				.cells = bad, .ncells = nbad, .placement = ring_placement },
				&out) >= 0)
			cverify_free(&out);
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		fail_msg("cverify_decide on cells it must drop: child %s %d",
			 WIFSIGNALED(status) ? "killed by signal" : "exited with",
			 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));

	/* It survived: now what it decides. Only n1 being unreachable is a
	 * problem; the dropped cells leave no row. */
	assert_int_equal(decide(3, reached, why, bad, nbad, &out), 1);
	assert_int_equal(out.nproblems, 1);
	assert_has_problem(&out, "n1 could not be asked (n1: a malformed answer): its own copy "
			   "and the replicas it holds are unknown");
	assert_true(out.recoverable);
	assert_int_equal(out.norigins, 3);
	assert_int_equal(out.ntable, 5);
	assert_row(&out, "n0", "n0", "ok");
	assert_row(&out, "n1", "n2", "ok");
	assert_row(&out, "n2", "n0", "ok");
	assert_row(&out, "n2", "n2", "ok");
	assert_row(&out, "", "n1", "unreachable");
	assert_null(row(&out, "n0", "n1"));
	assert_null(row(&out, "n1", "n1"));
	assert_null(row(&out, "n0", "n2"));
	assert_null(row(&out, "n0", "n9"));
	assert_null(row(&out, "", "n2"));
	for (size_t i = 0; i < out.ntable; i++)
		assert_non_null(out.table[i].holder);
	cverify_free(&out);
}

/* n1's answer failed after its first (good) group. n1 counts as "could not
 * be asked", and that group is not used: it does not become n1's reference
 * root, so n2's intact copy of n1 stays "ok" and restore can repair n1. */
static void test_unreached_cells_ignored(void **state)
{
	const struct hold_cell cells[] = {
		CELL("n0", "n0", "ok", STEP, 1),
		CELL("n1", "n1", "ok", STEP, 20),        /* from n1's failed answer */
		CELL("n1", "n2", "ok", STEP, 2),
		CELL("n2", "n2", "ok", STEP, 3), CELL("n2", "n0", "ok", STEP, 3),
	};
	const bool reached[3] = { true, false, true };
	const char *const why[3] = { "", "n1: a malformed answer", "" };
	struct cverify_out out;

	setup_ring(3);
	assert_int_equal(decide(3, reached, why, cells, 5, &out), 1);
	assert_row(&out, "n1", "n2", "ok");
	assert_true(digest_eq(row(&out, "n1", "n2")->root, R(2)));
	assert_true(out.recoverable);
	assert_int_equal(problems_with(&out, "differ"), 0);
	assert_int_equal(out.nproblems, 1);
	assert_has_problem(&out, "n1 could not be asked (n1: a malformed answer): its own copy "
			   "and the replicas it holds are unknown");
	/* Of n1's holding, only the holder-level group. */
	assert_null(row(&out, "n1", "n1"));
	for (size_t i = 0; i < out.ntable; i++)
		if (strcmp(out.table[i].holder, "n1") == 0) {
			assert_string_equal(out.table[i].origin, "");
			assert_string_equal(out.table[i].state, "unreachable");
		}
	assert_row(&out, "", "n1", "unreachable");
	assert_int_equal(out.ntable, 5);
	cverify_free(&out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_all_intact),
		cmocka_unit_test(test_own_damaged),
		cmocka_unit_test(test_own_incomplete_no_text),
		cmocka_unit_test(test_own_missing),
		cmocka_unit_test(test_partner_missing),
		cmocka_unit_test(test_copy_notes),
		cmocka_unit_test(test_roots_differ),
		cmocka_unit_test(test_roots_differ_without_own),
		cmocka_unit_test(test_other_step),
		cmocka_unit_test(test_other_step_on_holders),
		cmocka_unit_test(test_unplaced_copy_damaged),
		cmocka_unit_test(test_unreachable),
		cmocka_unit_test(test_unreachable_not_origin),
		cmocka_unit_test(test_nothing),
		cmocka_unit_test(test_nobody_reached),
		cmocka_unit_test(test_origin_not_asked),
		cmocka_unit_test(test_node_without_job),
		cmocka_unit_test(test_parse_all_or_nothing),
		cmocka_unit_test(test_unreached_cells_ignored),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
