/* daemon/survey/hold.c's copy groups on the wire: hold_put and hold_parse, as a
 * MSG_CELLS (every group names its holder) and as a MSG_HOLD (the sender
 * holds every group), good and malformed, all or nothing, and
 * hold_cells_free. In memory: no daemon, no network. Every test runs by
 * default. The decision made from the cells (cverify_decide) is
 * test_cverify.c's. */
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
#include "common/proto.h"
#include "daemon/survey/hold.h"

#define STEP "step-100"

/* ------------------------------------------------------------------ */
/* Helpers                                                             */

static digest_t R(uint64_t x)
{
	digest_t d = { .low64 = x, .high64 = 0x5eed0000u + x };

	return d;
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
	assert_int_equal(a->ncopy, b->ncopy);
	for (unsigned i = 0; i < b->ncopy; i++)
		assert_string_equal(a->copy[i], b->copy[i]);
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

/* K_COPY notes: an origin's own group says how its copies to partners
 * stand; they go and come back exactly, each note's parts read; a note that
 * is not "NODE STATE[: WHY]" with a known state, or one in a group about
 * another origin's copy, makes the frame malformed; past COPY_NOTES_MAX the
 * rest are dropped. */
static void test_copy_notes(void **state)
{
	static const char *const notes[] = {
		"n1 sending: 3.0 of 32.0 MiB sent", "n2 skipped: step-300 is newer and went first",
		"n3 queued", "n4 failed: n4: no space left on device",
		"n5 queued: n5 is down (connection refused)",
	};
	static const char *const want[][3] = {
		{ "n1", "sending", "3.0 of 32.0 MiB sent" },
		{ "n2", "skipped", "step-300 is newer and went first" },
		{ "n3", "queued", NULL },
		{ "n4", "failed", "n4: no space left on device" },
		{ "n5", "queued", "n5 is down (connection refused)" },
	};
	static const char *const bad[] = {
		"n1", "n1 ", "n1 lost", "n1 sending:x", "n1 sending:", "../n1 queued",
		" queued", "n1 queued extra", "n1 Queued", "n1 queued: ", "n1 queued:  x",
	};
	struct hold_cell c = { .origin = "n0", .state = "ok", .step = STEP };
	struct hold_cell *out = NULL;
	struct copy_note note;
	char big[600];
	struct msg m;
	size_t n = 0;

	for (unsigned i = 0; i < 5; i++)
		c.copy[c.ncopy++] = (char *)notes[i];
	msg_init(&m, MSG_HOLD);
	hold_put(&m, &c, false);
	assert_int_equal(hold_parse(&m, "n0", &out, &n), 0);
	assert_int_equal(n, 1);
	assert_cell_equal(&out[0], &c, "n0");
	for (unsigned i = 0; i < 5; i++) {
		assert_int_equal(copy_note_parse(out[0].copy[i], &note), 0);
		assert_string_equal(note.node, want[i][0]);
		assert_string_equal(note.state, want[i][1]);
		if (want[i][2])
			assert_string_equal(note.why, want[i][2]);
		else
			assert_null(note.why);
	}
	/* The same group from another holder: a node speaks only of its own
	 * commits' copies. */
	assert_int_equal(hold_parse(&m, "n9", &out, &n), -EBADMSG);
	assert_int_equal(n, 1);
	msg_free(&m);

	for (unsigned b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
		assert_int_equal(copy_note_parse(bad[b], &note), -EBADMSG);
		msg_init(&m, MSG_HOLD);
		msg_put_str(&m, K_ORIGIN, "n0");
		msg_put_str(&m, K_STATE, "ok");
		msg_put_str(&m, K_COPY, bad[b]);
		if (hold_parse(&m, "n0", &out, &n) != -EBADMSG)
			fail_msg("note \"%s\" was not refused", bad[b]);
		assert_int_equal(n, 1);
		msg_free(&m);
	}
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	memcpy(big, "n1 failed: ", 11);
	assert_int_equal(copy_note_parse(big, &note), -EBADMSG);
	big[512] = '\0';
	assert_int_equal(copy_note_parse(big, &note), 0);

	/* More notes than COPY_NOTES_MAX: the first ones. */
	msg_init(&m, MSG_HOLD);
	msg_put_str(&m, K_ORIGIN, "n0");
	msg_put_str(&m, K_STATE, "ok");
	for (unsigned i = 0; i < COPY_NOTES_MAX + 3; i++) {
		char s[64];

		snprintf(s, sizeof(s), "p%u queued", i);
		msg_put_str(&m, K_COPY, s);
	}
	assert_int_equal(hold_parse(&m, "n0", &out, &n), 0);
	assert_int_equal(n, 2);
	assert_int_equal(out[1].ncopy, COPY_NOTES_MAX);
	assert_string_equal(out[1].copy[COPY_NOTES_MAX - 1], "p15 queued");
	/* ... but every one is checked: a bad one past them still spoils the
	 * frame. */
	msg_put_str(&m, K_COPY, "p99 lost");
	assert_int_equal(hold_parse(&m, "n0", &out, &n), -EBADMSG);
	assert_int_equal(n, 2);
	msg_free(&m);
	hold_cells_free(out, n);
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
		cmocka_unit_test(test_copy_notes),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
