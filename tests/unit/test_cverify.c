/* daemon/hold.c's copy groups (hold_put and hold_parse, good and malformed,
 * all or nothing) and daemon/cverify.c's decision of `stage verify --cluster`
 * (cverify_decide), on in-memory cells and a ring placement: no daemon, no
 * network. Every test runs by default. */
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
#include "daemon/cverify.h"
#include "daemon/hold.h"

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
/* hold_put / hold_parse                                               */

static void assert_cell_equal(const struct hold_cell *a, const struct hold_cell *b,
			      const char *holder)
{
	assert_string_equal(a->origin, b->origin ? b->origin : "");
	assert_string_equal(a->holder, holder);
	assert_string_equal(a->state, b->state);
	if (b->step)
		assert_string_equal(a->step, b->step);
	else
		assert_null(a->step);
	assert_int_equal(a->has_root, b->has_root);
	if (b->has_root)
		assert_true(digest_eq(a->root, b->root));
	assert_int_equal(a->files, b->files);
	assert_int_equal(a->bytes, b->bytes);
	assert_int_equal(a->ntext, b->ntext);
	for (unsigned i = 0; i < b->ntext; i++)
		assert_string_equal(a->text[i], b->text[i]);
}

/* R(x) as a constant initializer. */
#define R_INIT(x) { .low64 = (x), .high64 = 0x5eed0000u + (uint64_t)(x) }

/* Every field of a group, and the extremes. Each has a holder: a MSG_CELLS
 * sends it, a MSG_HOLD does not. */
static const struct hold_cell rt_in[] = {
	/* every field */
	{ .origin = "n0", .holder = "n1", .state = "ok", .step = STEP, .has_root = true,
	  .root = R_INIT(1), .files = 12, .bytes = 3456789012345ull,
	  .text = { "first", "second" }, .ntext = 2 },
	{ .origin = "n1", .holder = "n4", .state = "damaged", .step = STEP, .has_root = true,
	  .root = R_INIT(2), .files = 3, .bytes = 4,
	  .text = { "changed a/b: size 3, manifest says 4", "missing c", "and 7 more" },
	  .ntext = 3 },
	{ .origin = "n2", .holder = "n3", .state = "other-step", .step = "step-90" },
	/* holder-level group of MSG_CELLS */
	{ .origin = "", .holder = "n3", .state = "unreachable",
	  .text = { "n3: connection refused" }, .ntext = 1 },
	/* only bytes, no step, NULL origin (sent as "") */
	{ .origin = NULL, .holder = "n2", .state = "missing", .bytes = 7 },
	/* only files */
	{ .origin = "n3", .holder = "n0", .state = "incomplete", .step = STEP, .files = 9,
	  .text = { "x has no manifest" }, .ntext = 1 },
	{ .origin = "n0", .holder = "n2", .state = "differs", .step = STEP,
	  .has_root = true, .root = R_INIT(99) },
	/* the largest values */
	{ .origin = "n-1_a.b", .holder = "Z9", .state = "ok", .step = "s", .has_root = true,
	  .root = R_INIT(UINT64_MAX), .files = UINT64_MAX, .bytes = UINT64_MAX - 1 },
};
#define RT_COUNT (sizeof(rt_in) / sizeof(rt_in[0]))

/* (a) A MSG_CELLS: every group names its holder; parsed with no holder
 * argument. */
static void test_roundtrip(void **state)
{
	struct hold_cell *out = NULL;
	struct msg m;
	size_t n = 0;

	msg_init(&m, MSG_CELLS);
	for (size_t i = 0; i < RT_COUNT; i++)
		hold_put(&m, &rt_in[i], true);
	assert_int_equal(m.err, 0);
	assert_int_equal(hold_parse(&m, NULL, &out, &n), 0);
	assert_int_equal(n, RT_COUNT);
	for (size_t i = 0; i < RT_COUNT; i++)
		assert_cell_equal(&out[i], &rt_in[i], rt_in[i].holder);

	/* Parsing again appends to what is there. */
	assert_int_equal(hold_parse(&m, NULL, &out, &n), 0);
	assert_int_equal(n, 2 * RT_COUNT);
	for (size_t i = 0; i < RT_COUNT; i++) {
		assert_cell_equal(&out[i], &rt_in[i], rt_in[i].holder);
		assert_cell_equal(&out[RT_COUNT + i], &rt_in[i], rt_in[i].holder);
	}
	hold_cells_free(out, n);
	msg_free(&m);
}

/* (b) A MSG_HOLD: no group names a holder; its sender, the holder argument,
 * holds every group. A group that names a holder of its own in a MSG_HOLD
 * is refused, and the frame appends nothing. */
static void test_roundtrip_hold(void **state)
{
	struct hold_cell *out = NULL;
	struct msg m;
	size_t n = 0;

	msg_init(&m, MSG_HOLD);
	for (size_t i = 0; i < RT_COUNT; i++)
		hold_put(&m, &rt_in[i], false);
	assert_int_equal(m.err, 0);
	assert_int_equal(hold_parse(&m, "n7", &out, &n), 0);
	assert_int_equal(n, RT_COUNT);
	for (size_t i = 0; i < RT_COUNT; i++)
		assert_cell_equal(&out[i], &rt_in[i], "n7");

	/* Parsing again appends to what is there. */
	assert_int_equal(hold_parse(&m, "n6", &out, &n), 0);
	assert_int_equal(n, 2 * RT_COUNT);
	for (size_t i = 0; i < RT_COUNT; i++) {
		assert_cell_equal(&out[i], &rt_in[i], "n7");
		assert_cell_equal(&out[RT_COUNT + i], &rt_in[i], "n6");
	}
	msg_free(&m);

	/* A group with K_HOLDER, parsed as a MSG_HOLD (a holder argument):
	 * refused, whether it names another node or the sender itself, first
	 * group or later; what was parsed before is untouched. */
	for (int k = 0; k < 4; k++) {
		msg_init(&m, MSG_HOLD);
		if (k >= 2)
			hold_put(&m, &rt_in[0], false);         /* a good group first */
		msg_put_str(&m, K_ORIGIN, "n1");
		/* another node, or the sender itself: neither is a MSG_HOLD's */
		msg_put_str(&m, K_HOLDER, k % 2 ? "n7" : "n4");
		msg_put_str(&m, K_STATE, "ok");
		msg_put_str(&m, K_STEP, STEP);
		hold_put(&m, &rt_in[2], false);                 /* and a good one after */
		assert_int_equal(m.err, 0);
		if (hold_parse(&m, "n7", &out, &n) != -EBADMSG)
			fail_msg("MSG_HOLD case %d: a group with K_HOLDER was not refused", k);
		assert_int_equal(n, 2 * RT_COUNT);
		msg_free(&m);
	}
	for (size_t i = 0; i < RT_COUNT; i++) {
		assert_cell_equal(&out[i], &rt_in[i], "n7");
		assert_cell_equal(&out[RT_COUNT + i], &rt_in[i], "n6");
	}

	/* The same frame from an empty array: still nothing. */
	hold_cells_free(out, n);
	out = NULL;
	n = 0;
	msg_init(&m, MSG_HOLD);
	hold_put(&m, &rt_in[0], true);
	assert_int_equal(hold_parse(&m, "n1", &out, &n), -EBADMSG);
	assert_int_equal(n, 0);
	hold_cells_free(out, n);
	msg_free(&m);
}

/* A MSG_HOLD as a node sends it (no holder), and a MSG_CELLS parsed with no
 * holder argument (every group names its own). */
static void test_roundtrip_holder_null(void **state)
{
	struct hold_cell in[] = {
		{ .origin = "n0", .holder = "n0", .state = "ok", .step = STEP, .has_root = true,
		  .root = R(5), .files = 1, .bytes = 1 },
		{ .origin = "", .holder = "n1", .state = "unreachable", .text = { "why" },
		  .ntext = 1 },
	};
	struct hold_cell *out = NULL;
	struct msg m;
	size_t n = 0;

	msg_init(&m, MSG_CELLS);
	hold_put(&m, &in[0], true);
	hold_put(&m, &in[1], true);
	assert_int_equal(hold_parse(&m, NULL, &out, &n), 0);
	assert_int_equal(n, 2);
	assert_cell_equal(&out[0], &in[0], "n0");
	assert_cell_equal(&out[1], &in[1], "n1");
	hold_cells_free(out, n);
	out = NULL;
	n = 0;
	msg_free(&m);

	/* Without K_HOLDER and without a holder argument, a group has no
	 * holder: malformed. */
	msg_init(&m, MSG_HOLD);
	hold_put(&m, &in[0], false);
	assert_int_equal(hold_parse(&m, NULL, &out, &n), -EBADMSG);
	assert_int_equal(n, 0);
	hold_cells_free(out, n);
	msg_free(&m);
}

static void test_parse_empty(void **state)
{
	struct hold_cell *out = NULL;
	struct msg m;
	size_t n = 0;

	msg_init(&m, MSG_HOLD);
	assert_int_equal(hold_parse(&m, "n0", &out, &n), 0);
	assert_int_equal(n, 0);
	assert_null(out);
	msg_free(&m);
}

/* Fields before the first K_ORIGIN are not part of a group: ignored. Keys
 * a group does not know are ignored too. */
static void test_parse_leading_fields(void **state)
{
	struct hold_cell *out = NULL;
	struct msg m;
	size_t n = 0;

	msg_init(&m, MSG_HOLD);
	msg_put_str(&m, K_JOB, "job");
	msg_put_str(&m, K_STATE, "bogus-state");
	msg_put_str(&m, K_TEXT, "before any group");
	msg_put_str(&m, K_ROOT, "not hex");
	msg_put_bytes(&m, K_FILES_TOTAL, "abc", 3);
	msg_put_str(&m, K_ORIGIN, "n0");
	msg_put_str(&m, K_STATE, "ok");
	msg_put_str(&m, K_JOB, "ignored inside a group");
	msg_put_u64(&m, K_CODE, 7);
	msg_put_str(&m, K_STEP, STEP);
	assert_int_equal(m.err, 0);
	assert_int_equal(hold_parse(&m, "n1", &out, &n), 0);
	assert_int_equal(n, 1);
	assert_string_equal(out[0].origin, "n0");
	assert_string_equal(out[0].holder, "n1");
	assert_string_equal(out[0].state, "ok");
	assert_string_equal(out[0].step, STEP);
	assert_false(out[0].has_root);
	assert_int_equal(out[0].ntext, 0);
	assert_int_equal(out[0].files, 0);
	hold_cells_free(out, n);
	msg_free(&m);
}

/* More than COPY_TEXTS_MAX texts: the first ones are kept, no error. */
static void test_parse_texts_capped(void **state)
{
	struct hold_cell *out = NULL;
	struct msg m;
	size_t n = 0;
	char t[32];

	msg_init(&m, MSG_HOLD);
	msg_put_str(&m, K_ORIGIN, "n0");
	msg_put_str(&m, K_STATE, "damaged");
	for (int i = 0; i < COPY_TEXTS_MAX + 5; i++) {
		snprintf(t, sizeof(t), "finding %d", i);
		msg_put_str(&m, K_TEXT, t);
	}
	msg_put_str(&m, K_ORIGIN, "n1");
	msg_put_str(&m, K_STATE, "ok");
	msg_put_str(&m, K_TEXT, "one");
	assert_int_equal(hold_parse(&m, "n2", &out, &n), 0);
	assert_int_equal(n, 2);
	assert_int_equal(out[0].ntext, COPY_TEXTS_MAX);
	for (int i = 0; i < COPY_TEXTS_MAX; i++) {
		snprintf(t, sizeof(t), "finding %d", i);
		assert_string_equal(out[0].text[i], t);
	}
	assert_int_equal(out[1].ntext, 1);
	assert_string_equal(out[1].text[0], "one");
	hold_cells_free(out, n);
	msg_free(&m);
}

/* Malformed groups: each message is built by a case of this switch. The
 * holder cases are a MSG_CELLS (parsed with no holder argument, every group
 * naming its holder), but BAD_HOLDER_IN_HOLD: a MSG_HOLD with a group naming
 * one. The others are a MSG_HOLD, parsed with holder "n1". */
enum bad {
	BAD_NO_STATE, BAD_NO_STATE_MIDDLE, BAD_UNKNOWN_STATE, BAD_EMPTY_STATE,
	BAD_ROOT_HEX, BAD_ROOT_SHORT, BAD_ROOT_LONG,
	BAD_ORIGIN_DOTDOT, BAD_ORIGIN_HIDDEN, BAD_ORIGIN_SLASH, BAD_ORIGIN_DASH,
	BAD_ORIGIN_NUL, BAD_ORIGIN_LONG, BAD_HOLDER_DOTDOT, BAD_HOLDER_EMPTY,
	BAD_HOLDER_NONE, BAD_HOLDER_IN_HOLD,
	BAD_STEP_DOTDOT, BAD_STEP_EMPTY,
	BAD_FILES_LEN4, BAD_FILES_LEN9, BAD_BYTES_LEN0, BAD_TEXT_NUL, BAD_STATE_NUL,
	BAD_COUNT
};

static bool bad_is_cells(enum bad b)
{
	return b == BAD_HOLDER_DOTDOT || b == BAD_HOLDER_EMPTY || b == BAD_HOLDER_NONE;
}

/* holder: its K_HOLDER, NULL for none. */
static void good_group(struct msg *m, const char *origin, const char *holder)
{
	msg_put_str(m, K_ORIGIN, origin);
	if (holder)
		msg_put_str(m, K_HOLDER, holder);
	msg_put_str(m, K_STATE, "ok");
	msg_put_str(m, K_STEP, STEP);
}

/* Builds case b into m; *holder: the argument to parse it with. */
static void build_bad(struct msg *m, enum bad b, const char **holder)
{
	char hex[DIGEST_HEX_LEN + 2], long_name[300];
	bool cells = bad_is_cells(b);

	*holder = cells ? NULL : "n1";
	msg_init(m, cells ? MSG_CELLS : MSG_HOLD);
	/* a good group first: the error is not the first */
	good_group(m, "n5", cells ? "n2" : NULL);
	msg_put_str(m, K_ORIGIN, b == BAD_ORIGIN_DOTDOT ? "../x" :
			       b == BAD_ORIGIN_HIDDEN ? ".hidden" :
			       b == BAD_ORIGIN_SLASH ? "a/b" :
			       b == BAD_ORIGIN_DASH ? "-x" : "n0");
	if (b == BAD_ORIGIN_NUL) {
		msg_free(m);
		msg_init(m, MSG_HOLD);
		msg_put_bytes(m, K_ORIGIN, "n0\0x", 4);
	}
	if (b == BAD_ORIGIN_LONG) {
		memset(long_name, 'a', 256);
		long_name[256] = '\0';
		msg_free(m);
		msg_init(m, MSG_HOLD);
		msg_put_str(m, K_ORIGIN, long_name);
	}
	if (b == BAD_HOLDER_DOTDOT)
		msg_put_str(m, K_HOLDER, "..");
	if (b == BAD_HOLDER_EMPTY)
		msg_put_str(m, K_HOLDER, "");
	if (b == BAD_HOLDER_IN_HOLD)
		msg_put_str(m, K_HOLDER, "n3");
	if (b == BAD_UNKNOWN_STATE)
		msg_put_str(m, K_STATE, "fine");
	else if (b == BAD_EMPTY_STATE)
		msg_put_str(m, K_STATE, "");
	else if (b == BAD_STATE_NUL)
		msg_put_bytes(m, K_STATE, "ok\0", 3);
	else if (b != BAD_NO_STATE && b != BAD_NO_STATE_MIDDLE)
		msg_put_str(m, K_STATE, "ok");
	msg_put_str(m, K_STEP, b == BAD_STEP_DOTDOT ? ".." : b == BAD_STEP_EMPTY ? "" : STEP);
	digest_to_hex(R(3), hex);
	if (b == BAD_ROOT_HEX)
		hex[5] = 'g';
	if (b == BAD_ROOT_SHORT)
		hex[DIGEST_HEX_LEN - 1] = '\0';
	if (b == BAD_ROOT_LONG)
		strcpy(hex + DIGEST_HEX_LEN, "0");
	msg_put_str(m, K_ROOT, hex);
	if (b == BAD_FILES_LEN4)
		msg_put_bytes(m, K_FILES_TOTAL, "\1\0\0\0", 4);
	else if (b == BAD_FILES_LEN9)
		msg_put_bytes(m, K_FILES_TOTAL, "\1\0\0\0\0\0\0\0\0", 9);
	else
		msg_put_u64(m, K_FILES_TOTAL, 1);
	if (b == BAD_BYTES_LEN0)
		msg_put_bytes(m, K_BYTES_TOTAL, "", 0);
	else
		msg_put_u64(m, K_BYTES_TOTAL, 2);
	if (b == BAD_TEXT_NUL)
		msg_put_bytes(m, K_TEXT, "a\0b", 3);
	if (b == BAD_NO_STATE_MIDDLE)
		/* the stateless group is checked when the next starts */
		good_group(m, "n6", cells ? "n2" : NULL);
	assert_int_equal(m->err, 0);
}

/* Every case fails, and appends nothing: the array holds what it held
 * before (one group parsed earlier), untouched. */
static void test_parse_malformed(void **state)
{
	for (int b = 0; b < BAD_COUNT; b++) {
		struct hold_cell *out = NULL;
		const char *holder;
		struct msg m;
		size_t n = 0;
		int rc;

		msg_init(&m, MSG_HOLD);
		good_group(&m, "n4", NULL);
		assert_int_equal(hold_parse(&m, "n8", &out, &n), 0);
		assert_int_equal(n, 1);
		msg_free(&m);

		build_bad(&m, (enum bad)b, &holder);
		rc = hold_parse(&m, holder, &out, &n);
		if (rc != -EBADMSG)
			fail_msg("malformed case %d: hold_parse returned %d, not -EBADMSG", b, rc);
		if (n != 1)
			fail_msg("malformed case %d: %zu cells after the failure, not 1", b, n);
		assert_string_equal(out[0].origin, "n4");
		assert_string_equal(out[0].holder, "n8");
		assert_string_equal(out[0].state, "ok");
		assert_string_equal(out[0].step, STEP);
		assert_int_equal(out[0].ntext, 0);
		hold_cells_free(out, n);
		msg_free(&m);
	}
}

/* The same message without the fault parses: the cases above fail for the
 * reason they name, not another. */
static void test_parse_control(void **state)
{
	struct hold_cell *out = NULL;
	struct msg m;
	size_t n = 0;

	msg_init(&m, MSG_HOLD);
	good_group(&m, "n5", NULL);
	msg_put_str(&m, K_ORIGIN, "n0");
	msg_put_str(&m, K_STATE, "ok");
	msg_put_str(&m, K_STEP, STEP);
	{
		char hex[DIGEST_HEX_LEN + 1];

		digest_to_hex(R(3), hex);
		msg_put_str(&m, K_ROOT, hex);
	}
	msg_put_u64(&m, K_FILES_TOTAL, 1);
	msg_put_u64(&m, K_BYTES_TOTAL, 2);
	assert_int_equal(hold_parse(&m, "n1", &out, &n), 0);
	assert_int_equal(n, 2);
	assert_true(out[1].has_root);
	assert_true(digest_eq(out[1].root, R(3)));
	assert_int_equal(out[1].files, 1);
	assert_int_equal(out[1].bytes, 2);
	hold_cells_free(out, n);
	msg_free(&m);

	/* The holder cases' MSG_CELLS, with a good K_HOLDER, parses too. */
	out = NULL;
	n = 0;
	msg_init(&m, MSG_CELLS);
	good_group(&m, "n5", "n2");
	good_group(&m, "n0", "n3");
	assert_int_equal(hold_parse(&m, NULL, &out, &n), 0);
	assert_int_equal(n, 2);
	assert_string_equal(out[0].holder, "n2");
	assert_string_equal(out[1].holder, "n3");
	hold_cells_free(out, n);
	msg_free(&m);

	/* Upper-case hex is a root too. */
	out = NULL;
	n = 0;
	msg_init(&m, MSG_HOLD);
	msg_put_str(&m, K_ORIGIN, "n0");
	msg_put_str(&m, K_STATE, "ok");
	msg_put_str(&m, K_ROOT, "0123456789ABCDEF0123456789abcdef");
	assert_int_equal(hold_parse(&m, "n1", &out, &n), 0);
	assert_int_equal(n, 1);
	assert_true(out[0].has_root);
	hold_cells_free(out, n);
	msg_free(&m);
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
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_roundtrip_hold),
		cmocka_unit_test(test_roundtrip_holder_null),
		cmocka_unit_test(test_parse_empty),
		cmocka_unit_test(test_parse_leading_fields),
		cmocka_unit_test(test_parse_texts_capped),
		cmocka_unit_test(test_parse_malformed),
		cmocka_unit_test(test_parse_control),
		cmocka_unit_test(test_all_intact),
		cmocka_unit_test(test_own_damaged),
		cmocka_unit_test(test_own_incomplete_no_text),
		cmocka_unit_test(test_own_missing),
		cmocka_unit_test(test_partner_missing),
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
