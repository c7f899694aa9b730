/* The pure parts of the `stage` client: its command line, its JSON strings,
 * its human numbers, the lines of `stage manifest --xxhsum`, and how reply
 * frames are rendered (into memory streams). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

#include <cmocka.h>

#include "client/cli_args.h"
#include "client/cli_fmt.h"
#include "client/cli_json.h"
#include "client/cli_manifest.h"
#include "client/cli_out.h"
#include "common/paths.h"

#define ARGV(...) ((char *[]){ "stage", __VA_ARGS__, NULL })
#define ARGC(...) ((int)(sizeof((char *[]){ "stage", __VA_ARGS__ }) / sizeof(char *)))
#define PARSE(a, err, ...) \
	cli_args_parse((a), ARGC(__VA_ARGS__), ARGV(__VA_ARGS__), (err), sizeof(err))

/* A memory stream and the text written to it. */
struct capture {
	FILE *f;
	char *buf;
	size_t len;
};

static void cap_open(struct capture *c)
{
	c->f = open_memstream(&c->buf, &c->len);
	assert_non_null(c->f);
}

static const char *cap_text(struct capture *c)
{
	fflush(c->f);
	return c->buf;
}

static void cap_close(struct capture *c)
{
	fclose(c->f);
	free(c->buf);
}

/* ---- command line ---- */

static void test_args_pull_options_anywhere(void **state)
{
	struct cli_args a;
	char err[256];

	assert_int_equal(PARSE(&a, err, "--json", "pull", "data", "--to", "/d", "--verify",
			       "--socket=/s"), 0);
	assert_int_equal(a.cmd, CLI_CMD_PULL);
	assert_string_equal(a.operand, "data");
	assert_string_equal(a.to, "/d");
	assert_string_equal(a.socket, "/s");
	assert_true(a.json && a.verify);
	assert_false(a.deep || a.xxhsum);

	assert_int_equal(PARSE(&a, err, "--verify", "--to=x", "pull", "--socket", "/s", "src"), 0);
	assert_string_equal(a.operand, "src");
	assert_string_equal(a.to, "x");
}

/* main hands `stage ... codec ...` to the codec's own parser: the command
 * word must be found past the global options and their values. */
static void test_args_command_index(void **state)
{
	char *a1[] = { "stage", "codec", "bench", "f" };
	char *a2[] = { "stage", "--socket", "/s", "--json", "codec", "compress", "a", "b" };
	char *a3[] = { "stage", "--socket=/s", "codec" };
	char *a4[] = { "stage", "--", "codec" };
	char *a5[] = { "stage", "--help", "codec" };
	char *a6[] = { "stage", "--json" };
	char *a7[] = { "stage", "--bogus", "codec" };

	assert_int_equal(cli_args_command_index(4, a1), 1);
	assert_int_equal(cli_args_command_index(8, a2), 4);
	assert_int_equal(cli_args_command_index(3, a3), 2);
	assert_int_equal(cli_args_command_index(3, a4), 2);
	assert_int_equal(cli_args_command_index(3, a5), -1);
	assert_int_equal(cli_args_command_index(2, a6), -1);
	assert_int_equal(cli_args_command_index(3, a7), -1);
}

static void test_args_dashdash(void **state)
{
	struct cli_args a;
	char err[256];

	assert_int_equal(PARSE(&a, err, "verify", "--deep", "--", "--json"), 0);
	assert_string_equal(a.operand, "--json");
	assert_true(a.deep);
	assert_false(a.json);
	assert_int_equal(PARSE(&a, err, "manifest", "-"), 0);
	assert_string_equal(a.operand, "-");
}

static void test_args_usage_errors(void **state)
{
	struct cli_args a;
	char err[256];

	assert_int_equal(PARSE(&a, err, "pull", "x", "--bogus"), -EINVAL);
	assert_non_null(strstr(err, "'--bogus'"));
	assert_int_equal(PARSE(&a, err, "pull"), -EINVAL);
	assert_non_null(strstr(err, "missing operand"));
	assert_int_equal(PARSE(&a, err, "pull", "a", "b"), -EINVAL);
	assert_non_null(strstr(err, "extra operand 'b'"));
	assert_int_equal(PARSE(&a, err, "status", "x"), -EINVAL);
	assert_int_equal(PARSE(&a, err, "pull", "x", "--deep"), -EINVAL);
	assert_non_null(strstr(err, "'--deep' does not apply to 'pull'"));
	assert_int_equal(PARSE(&a, err, "pull", "x", "--to"), -EINVAL);
	assert_non_null(strstr(err, "'--to' needs a value"));
	assert_int_equal(PARSE(&a, err, "pull", "x", "--to="), -EINVAL);
	assert_int_equal(PARSE(&a, err, "pull", "x", "--verify=yes"), -EINVAL);
	assert_int_equal(PARSE(&a, err, "pull", ""), -EINVAL);
	assert_int_equal(PARSE(&a, err, "frobnicate"), -EINVAL);
	assert_non_null(strstr(err, "'frobnicate'"));
	assert_int_equal(PARSE(&a, err, "--json"), -EINVAL);
	assert_non_null(strstr(err, "missing command"));
	assert_int_equal(PARSE(&a, err, "manifest", "x", "--xxhsum", "--json"), -EINVAL);
	assert_int_equal(PARSE(&a, err, "-x"), -EINVAL);
}

static void test_args_not_in_this_version(void **state)
{
	struct cli_args a;
	char err[256];

	/* main hands codec to its own parser before this one sees it. */
	assert_int_equal(PARSE(&a, err, "--json", "codec", "bench", "f"), -ENOTSUP);
	assert_string_equal(err, "'codec' is not available in this version yet");
}

static void test_args_verify_cluster(void **state)
{
	struct cli_args a;
	char err[256];

	assert_int_equal(PARSE(&a, err, "verify", "p", "--cluster", "--deep"), 0);
	assert_int_equal(a.cmd, CLI_CMD_VERIFY);
	assert_string_equal(a.operand, "p");
	assert_true(a.cluster && a.deep);
	assert_int_equal(PARSE(&a, err, "verify", "p"), 0);
	assert_false(a.cluster || a.deep);
	/* pull --cluster stages on every node; --nodes only with it. */
	assert_int_equal(PARSE(&a, err, "pull", "x", "--cluster", "--nodes", "n[0-3]"), 0);
	assert_true(a.cluster);
	assert_string_equal(a.nodes, "n[0-3]");
	assert_int_equal(PARSE(&a, err, "pull", "x", "--nodes", "n1"), -EINVAL);
	assert_string_equal(err, "--nodes names the nodes to stage on with --cluster: "
			    "stage pull SRC --cluster --nodes LIST");
	assert_int_equal(PARSE(&a, err, "commit", "x", "--cluster"), -EINVAL);
	assert_string_equal(err, "option '--cluster' does not apply to 'commit'");
}

static void test_args_restore(void **state)
{
	struct cli_args a;
	char err[256];

	assert_int_equal(PARSE(&a, err, "restore", "ck/job/step"), 0);
	assert_int_equal(a.cmd, CLI_CMD_RESTORE);
	assert_string_equal(a.operand, "ck/job/step");
	assert_null(a.from);
	assert_int_equal(PARSE(&a, err, "restore", "d", "--from", "n1"), 0);
	assert_string_equal(a.operand, "d");
	assert_string_equal(a.from, "n1");
	assert_int_equal(PARSE(&a, err, "--from=n2", "restore", "d"), 0);
	assert_string_equal(a.from, "n2");

	assert_int_equal(PARSE(&a, err, "restore"), -EINVAL);
	assert_string_equal(err, "missing operand: stage restore DIR [--from NODE|durable]");
	assert_int_equal(PARSE(&a, err, "restore", "a", "b"), -EINVAL);
	assert_non_null(strstr(err, "extra operand 'b'"));
	assert_int_equal(PARSE(&a, err, "verify", "p", "--from", "n1"), -EINVAL);
	assert_string_equal(err, "option '--from' does not apply to 'verify'");
	assert_int_equal(PARSE(&a, err, "restore", "d", "--from="), -EINVAL);
	assert_string_equal(err, "option '--from' needs a non-empty value");
	assert_int_equal(PARSE(&a, err, "restore", "d", "--from", ""), -EINVAL);
	assert_string_equal(err, "option '--from' needs a non-empty value");
	assert_int_equal(PARSE(&a, err, "restore", "d", "--from"), -EINVAL);
	assert_string_equal(err, "option '--from' needs a value");
	assert_int_equal(PARSE(&a, err, "restore", "d", "--cluster"), -EINVAL);
}

static void test_args_usage_text(void **state)
{
	struct capture c;
	const char *t;

	cap_open(&c);
	cli_args_usage(c.f);
	t = cap_text(&c);
	assert_non_null(strstr(t, "  stage verify PATH [--deep] [--cluster [--nodes LIST]]\n"));
	assert_non_null(strstr(t, "  stage restore DIR [--from NODE|durable]\n"));
	assert_non_null(strstr(t, "\n  restore   "));
	assert_non_null(strstr(t, "--cluster: "));
	assert_null(strstr(t, "later version"));
	cap_close(&c);
}

static void test_args_commit_ls(void **state)
{
	struct cli_args a;
	char err[256];

	assert_int_equal(PARSE(&a, err, "commit", "--wait", "ck/job/step"), 0);
	assert_int_equal(a.cmd, CLI_CMD_COMMIT);
	assert_true(a.wait);
	assert_string_equal(a.operand, "ck/job/step");
	assert_int_equal(PARSE(&a, err, "commit"), -EINVAL);
	assert_non_null(strstr(err, "missing operand: stage commit DIR [--wait]"));
	assert_int_equal(PARSE(&a, err, "pull", "x", "--wait"), -EINVAL);
	assert_string_equal(err, "option '--wait' does not apply to 'pull'");
	assert_int_equal(PARSE(&a, err, "ls"), 0);
	assert_int_equal(a.cmd, CLI_CMD_LS);
	assert_int_equal(PARSE(&a, err, "ls", "extra"), -EINVAL);
}

static void test_args_help_version(void **state)
{
	struct cli_args a;
	char err[256];

	assert_int_equal(PARSE(&a, err, "pull", "--help"), 0);
	assert_int_equal(a.cmd, CLI_CMD_HELP);
	assert_int_equal(PARSE(&a, err, "-h"), 0);
	assert_int_equal(a.cmd, CLI_CMD_HELP);
	assert_int_equal(PARSE(&a, err, "--version"), 0);
	assert_int_equal(a.cmd, CLI_CMD_VERSION);
	assert_int_equal(PARSE(&a, err, "status"), 0);
	assert_int_equal(a.cmd, CLI_CMD_STATUS);
	assert_null(a.operand);
}

/* What the client relies on from paths_absolute: lexical, ".." kept. */
static void test_absolute_paths(void **state)
{
	static const char *const cases[][3] = {
		{ "/home/u", "data", "/home/u/data" },
		{ "/home/u", "./a//b/./c/", "/home/u/a/b/c" },
		{ "/home/u", "../x", "/home/u/../x" },
		{ "/home/u", "/abs/.", "/abs" },
		{ "/", ".", "/" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *p = paths_absolute(cases[i][0], cases[i][1]);

		assert_non_null(p);
		assert_string_equal(p, cases[i][2]);
		free(p);
	}
}

/* ---- JSON strings ---- */

static void check_json(const char *in, size_t n, const char *want)
{
	struct capture c;

	cap_open(&c);
	cli_json_string(c.f, in, n);
	assert_string_equal(cap_text(&c), want);
	cap_close(&c);
}

#define CHECK_JSON(lit, want) check_json((lit), sizeof(lit) - 1, (want))

static void test_json_escaping(void **state)
{
	CHECK_JSON("plain/path.bin", "\"plain/path.bin\"");
	CHECK_JSON("q\"b\\s", "\"q\\\"b\\\\s\"");
	CHECK_JSON("a\nb\tc\rd\x01\x1f\x7f", "\"a\\nb\\tc\\rd\\u0001\\u001f\x7f\"");
	CHECK_JSON("nul\0x", "\"nul\\u0000x\"");
	/* Valid UTF-8 of 2, 3 and 4 bytes passes through. */
	CHECK_JSON("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"");
	/* Not UTF-8: stray, overlong, surrogate, past U+10FFFF, truncated. */
	CHECK_JSON("\xff", "\"\\u00ff\"");
	CHECK_JSON("\xc0\x80", "\"\\u00c0\\u0080\"");
	CHECK_JSON("\xed\xa0\x80", "\"\\u00ed\\u00a0\\u0080\"");
	CHECK_JSON("\xf4\x90\x80\x80", "\"\\u00f4\\u0090\\u0080\\u0080\"");
	CHECK_JSON("\xe2\x82", "\"\\u00e2\\u0082\"");
	CHECK_JSON("a\xe2\x82z", "\"a\\u00e2\\u0082z\"");
}

static void test_json_object(void **state)
{
	struct capture c;
	struct cli_json j;

	cap_open(&c);
	cli_json_begin(&j, c.f, "x");
	cli_json_u64(&j, "n", UINT64_MAX);
	cli_json_strn(&j, "s", "a\"", 2);
	cli_json_end(&j);
	cli_json_begin(&j, c.f, NULL);
	cli_json_end(&j);
	assert_string_equal(cap_text(&c),
			    "{\"event\":\"x\",\"n\":18446744073709551615,\"s\":\"a\\\"\"}\n{}\n");
	cap_close(&c);
}

/* ---- human numbers ---- */

static void test_fmt_size(void **state)
{
	static const struct { uint64_t v; const char *want; } cases[] = {
		{ 0, "0 B" }, { 1023, "1023 B" }, { 1024, "1.0 KiB" }, { 1536, "1.5 KiB" },
		{ 1048575, "1.0 MiB" }, { 150u << 20, "150 MiB" }, { (99u << 20) + (972u << 10), "99.9 MiB" },
		{ UINT64_C(4) << 30, "4.0 GiB" }, { UINT64_MAX, "16.0 EiB" },
	};
	char buf[32];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		cli_fmt_size(buf, sizeof(buf), cases[i].v);
		assert_string_equal(buf, cases[i].want);
	}
}

static void test_fmt_count_eta(void **state)
{
	char buf[32];

	cli_fmt_count(buf, sizeof(buf), 0);
	assert_string_equal(buf, "0");
	cli_fmt_count(buf, sizeof(buf), 999);
	assert_string_equal(buf, "999");
	cli_fmt_count(buf, sizeof(buf), 1000);
	assert_string_equal(buf, "1,000");
	cli_fmt_count(buf, sizeof(buf), 1234567);
	assert_string_equal(buf, "1,234,567");
	cli_fmt_count(buf, sizeof(buf), UINT64_MAX);
	assert_string_equal(buf, "18,446,744,073,709,551,615");
	cli_fmt_count(buf, 4, 1234567);
	assert_string_equal(buf, "1,2");

	cli_fmt_eta(buf, sizeof(buf), 0);
	assert_string_equal(buf, "0:00");
	cli_fmt_eta(buf, sizeof(buf), 63);
	assert_string_equal(buf, "1:03");
	cli_fmt_eta(buf, sizeof(buf), 3723);
	assert_string_equal(buf, "1:02:03");
}

static void test_fmt_progress(void **state)
{
	struct cli_progress p = {
		.phase = "copy", .files_done = 1234, .files_total = 20000,
		.bytes_done = UINT64_C(1288490189), .bytes_total = UINT64_C(4) << 30,
		.rate = 850u << 20,
	};
	char buf[160];

	cli_fmt_progress(buf, sizeof(buf), &p);
	assert_string_equal(buf, "copy  1,234/20,000 files  1.2/4.0 GiB  850 MiB/s  ETA 0:04");

	p = (struct cli_progress){ .phase = "scan", .files_done = 5, .bytes_done = 2048 };
	cli_fmt_progress(buf, sizeof(buf), &p);
	assert_string_equal(buf, "scan  5 files  2.0 KiB");

	/* pull --cluster names the node furthest behind, before the rate. */
	p = (struct cli_progress){ .phase = "pull", .files_done = 3, .files_total = 9,
				   .bytes_done = 3 << 20, .bytes_total = 9 << 20, .rate = 1 << 20,
				   .slowest = "gpu07" };
	cli_fmt_progress(buf, sizeof(buf), &p);
	assert_string_equal(buf, "pull  3/9 files  3.0/9.0 MiB  slowest gpu07  1.0 MiB/s  ETA 0:06");

	/* Cut short, still terminated. */
	p = (struct cli_progress){ .phase = "scan", .files_done = 5, .bytes_done = 2048 };
	p.phase = "verify";
	cli_fmt_progress(buf, 9, &p);
	assert_string_equal(buf, "verify  ");
}

/* ---- stage manifest ---- */

static struct mf_entry file_entry(const char *path)
{
	struct mf_entry e = { .type = MF_FILE, .path = (char *)path, .size = 1, .mode = 0644,
			      .mtime_ns = -5, .digest = digest_of("a", 1) };
	return e;
}

static void test_manifest_xxhsum_lines(void **state)
{
	struct mf_entry e = file_entry(" lead\\ing tab\there ");
	struct mf_entry d = { .type = MF_DIR, .path = "dir", .mode = 0755 };
	struct capture c;

	cap_open(&c);
	/* The digest is the one `xxhsum -H2` prints for a file holding "a". */
	assert_int_equal(cli_manifest_xxhsum(c.f, &e), 0);
	assert_int_equal(cli_manifest_xxhsum(c.f, &d), 0);
	e.path = "new\nline";
	assert_int_equal(cli_manifest_xxhsum(c.f, &e), -EINVAL);
	assert_string_equal(cap_text(&c),
			    "a96faf705af16834e6c632b61e964e1f   lead\\ing tab\there \n");
	cap_close(&c);
}

static void test_manifest_json_entry(void **state)
{
	struct mf_entry e = file_entry("d/\xff.bin");
	struct mf_entry l = { .type = MF_LINK, .path = "ln", .size = 1, .mode = 0777,
			      .mtime_ns = 7, .digest = digest_of("a", 1), .target = "a" };
	struct capture c;

	cap_open(&c);
	cli_manifest_json(c.f, &e);
	cli_manifest_json(c.f, &l);
	assert_string_equal(cap_text(&c),
		"{\"type\":\"f\",\"path\":\"d/\\u00ff.bin\",\"size\":1,\"mode\":\"0644\","
		"\"mtime_ns\":-5,\"digest\":\"a96faf705af16834e6c632b61e964e1f\"}\n"
		"{\"type\":\"l\",\"path\":\"ln\",\"size\":1,\"mode\":\"0777\",\"mtime_ns\":7,"
		"\"digest\":\"a96faf705af16834e6c632b61e964e1f\",\"target\":\"a\"}\n");
	cap_close(&c);
}

/* ---- reply frames ---- */

struct frames {
	struct capture out, err;
	struct cli_out o;
};

static double fake_clock;

static double fake_now(void)
{
	return fake_clock;
}

static int frames_setup(void **state)
{
	struct frames *f = calloc(1, sizeof(*f));

	if (!f)
		return -1;
	cap_open(&f->out);
	cap_open(&f->err);
	cli_out_init(&f->o, f->out.f, f->err.f, false, false);
	f->o.now = fake_now;
	fake_clock = 100;
	*state = f;
	return 0;
}

static int frames_teardown(void **state)
{
	struct frames *f = *state;

	cap_close(&f->out);
	cap_close(&f->err);
	free(f);
	return 0;
}

static void send_result(struct cli_out *o, uint64_t code, const char *text, const char *path)
{
	struct msg m;

	msg_init(&m, MSG_RESULT);
	msg_put_u64(&m, K_CODE, code);
	msg_put_str(&m, K_TEXT, text);
	if (path)
		msg_put_str(&m, K_PATH, path);
	msg_put_u64(&m, K_ELAPSED_NS, 2500000000u);
	assert_int_equal(cli_out_frame(o, &m), 0);
	msg_free(&m);
}

static void send_note(struct cli_out *o, const char *kind, const char *path, const char *text)
{
	struct msg m;

	msg_init(&m, MSG_NOTE);
	msg_put_u64(&m, K_LEVEL, 1);
	if (kind)
		msg_put_str(&m, K_KIND, kind);
	if (path)
		msg_put_str(&m, K_PATH, path);
	msg_put_str(&m, K_TEXT, text);
	assert_int_equal(cli_out_frame(o, &m), 0);
	msg_free(&m);
}

static void test_frames_human(void **state)
{
	struct frames *f = *state;
	struct msg m;

	f->o.path_last = true;
	send_note(&f->o, "missing", "a/b", "gone");
	send_note(&f->o, NULL, NULL, "source changed under us, retrying");
	msg_init(&m, 999);      /* from a newer daemon: skipped */
	msg_put_str(&m, K_TEXT, "future");
	assert_int_equal(cli_out_frame(&f->o, &m), 0);
	msg_free(&m);
	send_result(&f->o, 0, "pulled 3 files", "/stage/data");
	assert_int_equal(f->o.code, 0);
	assert_string_equal(cap_text(&f->out), "missing a/b\n/stage/data\n");
	assert_string_equal(cap_text(&f->err),
			    "stage: source changed under us, retrying\npulled 3 files\n");
}

static void test_frames_failure_and_clamp(void **state)
{
	struct frames *f = *state;
	struct msg m;

	f->o.path_last = true;
	send_result(&f->o, 7, "copy failed: disk full at /stage/x", "/stage/x");
	assert_int_equal(f->o.code, 2);
	assert_string_equal(cap_text(&f->out), "");    /* no path for a failed pull */
	assert_string_equal(cap_text(&f->err), "stage: copy failed: disk full at /stage/x\n");

	msg_init(&m, MSG_RESULT);       /* a result must carry its exit code */
	msg_put_str(&m, K_TEXT, "?");
	assert_int_equal(cli_out_frame(&f->o, &m), -EBADMSG);
	msg_free(&m);
}

static void test_frames_json(void **state)
{
	struct frames *f = *state;
	struct msg m;

	f->o.json = true;
	msg_init(&m, MSG_PROGRESS);
	msg_put_str(&m, K_PHASE, "copy");
	msg_put_u64(&m, K_FILES_DONE, 1);
	msg_put_u64(&m, K_BYTES_DONE, 1000);
	assert_int_equal(cli_out_frame(&f->o, &m), 0);
	msg_free(&m);
	fake_clock += 2;
	msg_init(&m, MSG_PROGRESS);
	msg_put_str(&m, K_PHASE, "copy");
	msg_put_u64(&m, K_FILES_DONE, 2);
	msg_put_u64(&m, K_FILES_TOTAL, 2);
	msg_put_u64(&m, K_BYTES_DONE, 5000);
	msg_put_u64(&m, K_BYTES_TOTAL, 5000);
	assert_int_equal(cli_out_frame(&f->o, &m), 0);
	msg_free(&m);
	send_note(&f->o, "changed", "x\"y", "size differs");
	send_result(&f->o, 1, "verify failed", NULL);
	assert_string_equal(cap_text(&f->out),
		"{\"event\":\"progress\",\"phase\":\"copy\",\"files_done\":1,\"bytes_done\":1000,\"rate\":0}\n"
		"{\"event\":\"progress\",\"phase\":\"copy\",\"files_done\":2,\"files_total\":2,"
		"\"bytes_done\":5000,\"bytes_total\":5000,\"rate\":2000}\n"
		"{\"event\":\"note\",\"level\":\"warn\",\"kind\":\"changed\",\"path\":\"x\\\"y\","
		"\"text\":\"size differs\"}\n"
		"{\"event\":\"result\",\"code\":1,\"text\":\"verify failed\",\"elapsed_ms\":2500}\n");
	assert_string_equal(cap_text(&f->err), "");
}

static void status_frame(struct msg *m)
{
	static const char *const pairs[][2] = {
		{ "node", "n0" }, { "job", "pull /nfs/a" }, { "transport", "tcp" },
		{ "job", "verify /stage/b" },
	};

	msg_init(m, MSG_STATUS);
	for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
		msg_put_str(m, K_NAME, pairs[i][0]);
		msg_put_str(m, K_VALUE, pairs[i][1]);
	}
	msg_put_str(m, K_NAME, "peers");        /* a name without a value */
}

static void test_frames_status(void **state)
{
	struct frames *f = *state;
	struct msg m;

	status_frame(&m);
	assert_int_equal(cli_out_frame(&f->o, &m), 0);
	assert_string_equal(cap_text(&f->out),
			    "node:      n0\n"
			    "job:       pull /nfs/a\n"
			    "transport: tcp\n"
			    "job:       verify /stage/b\n"
			    "peers:     \n");
	f->o.json = true;
	assert_int_equal(cli_out_frame(&f->o, &m), 0);
	assert_non_null(strstr(cap_text(&f->out),
		"{\"event\":\"status\",\"node\":\"n0\",\"job\":[\"pull /nfs/a\",\"verify /stage/b\"],"
		"\"transport\":\"tcp\",\"peers\":\"\"}\n"));
	msg_free(&m);
}

static void test_frames_progress_line(void **state)
{
	struct frames *f = *state;
	struct msg m;

	f->o.progress = true;
	msg_init(&m, MSG_PROGRESS);
	msg_put_str(&m, K_PHASE, "scan");
	msg_put_u64(&m, K_FILES_DONE, 12);
	assert_int_equal(cli_out_frame(&f->o, &m), 0);
	fake_clock += 0.01;     /* too soon to redraw */
	assert_int_equal(cli_out_frame(&f->o, &m), 0);
	msg_free(&m);
	send_note(&f->o, NULL, NULL, "hello");
	assert_string_equal(cap_text(&f->err),
			    "\rscan  12 files  0 B"
			    "\r                   \r"
			    "stage: hello\n");
}

/* One copy group; texts end with NULL. */
static void put_group(struct msg *m, const char *origin, const char *holder, const char *st,
		      const char *step, ...)
{
	const char *text;
	va_list ap;

	msg_put_str(m, K_ORIGIN, origin);
	msg_put_str(m, K_HOLDER, holder);
	msg_put_str(m, K_STATE, st);
	if (step)
		msg_put_str(m, K_STEP, step);
	va_start(ap, step);
	while ((text = va_arg(ap, const char *)))
		msg_put_str(m, K_TEXT, text);
	va_end(ap);
}

/* Three origins on three holders: one copy of another step, no copy of n2
 * on n2, n3 not reachable at all. */
static void cells_frame(struct msg *m)
{
	msg_init(m, MSG_CELLS);
	put_group(m, "n0", "n1", "ok", "step-200", NULL);
	msg_put_str(m, K_ROOT, "0123456789abcdef0123456789abcdef");
	msg_put_u64(m, K_FILES_TOTAL, 3);
	msg_put_u64(m, K_BYTES_TOTAL, 4096);
	put_group(m, "n0", "n2", "other-step", "step-100", NULL);
	put_group(m, "", "n3", "unreachable", NULL, "connect: Connection refused", NULL);
	put_group(m, "n1", "n2", "ok", "step-200", NULL);
	put_group(m, "n1", "n1", "damaged", "step-200", "a.bin: digest differs",
		  "b.bin: missing", NULL);
	put_group(m, "n2", "n1", "missing", NULL, NULL);
	assert_int_equal(m->err, 0);
}

static void test_frames_cells_human(void **state)
{
	struct frames *f = *state;
	struct msg m;

	cells_frame(&m);
	assert_int_equal(cli_out_frame(&f->o, &m), 0);
	msg_free(&m);
	assert_string_equal(cap_text(&f->out),
			    "ORIGIN  n1       n2        n3\n"
			    "n0      ok       step-100  ?\n"
			    "n1      damaged  ok        ?\n"
			    "n2      missing  -         ?\n"
			    "  n3: unreachable: connect: Connection refused\n"
			    "  n1 on n1: damaged: a.bin: digest differs\n"
			    "  n1 on n1: damaged: b.bin: missing\n");
	assert_string_equal(cap_text(&f->err), "");
}

static void test_frames_cells_json(void **state)
{
	struct frames *f = *state;
	struct msg m;

	f->o.json = true;
	cells_frame(&m);
	assert_int_equal(cli_out_frame(&f->o, &m), 0);
	msg_free(&m);
	assert_string_equal(cap_text(&f->out),
		"{\"event\":\"copy\",\"origin\":\"n0\",\"holder\":\"n1\",\"state\":\"ok\","
		"\"step\":\"step-200\",\"root\":\"0123456789abcdef0123456789abcdef\","
		"\"files\":3,\"bytes\":4096}\n"
		"{\"event\":\"copy\",\"origin\":\"n0\",\"holder\":\"n2\",\"state\":\"other-step\","
		"\"step\":\"step-100\"}\n"
		"{\"event\":\"copy\",\"origin\":\"\",\"holder\":\"n3\",\"state\":\"unreachable\","
		"\"detail\":[\"connect: Connection refused\"]}\n"
		"{\"event\":\"copy\",\"origin\":\"n1\",\"holder\":\"n2\",\"state\":\"ok\","
		"\"step\":\"step-200\"}\n"
		"{\"event\":\"copy\",\"origin\":\"n1\",\"holder\":\"n1\",\"state\":\"damaged\","
		"\"step\":\"step-200\",\"detail\":[\"a.bin: digest differs\",\"b.bin: missing\"]}\n"
		"{\"event\":\"copy\",\"origin\":\"n2\",\"holder\":\"n1\",\"state\":\"missing\"}\n");
}

/* The rarer cells: an origin's own "unreachable", "other-step" naming no
 * step, a group on a holder that is also down as a whole, a repeated pair. */
static void test_frames_cells_rules(void **state)
{
	struct frames *f = *state;
	struct msg m;

	msg_init(&m, MSG_CELLS);
	put_group(&m, "", "h2", "unreachable", NULL, NULL);
	put_group(&m, "origin-a", "h1", "unreachable", NULL, NULL);
	put_group(&m, "origin-a", "h2", "ok", NULL, NULL);
	put_group(&m, "origin-b", "h1", "other-step", NULL, NULL);
	put_group(&m, "origin-b", "h1", "ok", NULL, NULL);
	put_group(&m, "origin-b", "h3", "differs", NULL, NULL);
	assert_int_equal(cli_out_frame(&f->o, &m), 0);
	msg_free(&m);
	assert_string_equal(cap_text(&f->out),
			    "ORIGIN    h2  h1          h3\n"
			    "origin-a  ok  ?           -\n"
			    "origin-b  ?   other-step  differs\n");
}

/* Names and findings come from other nodes: nothing reaches the terminal
 * unprintable, and the padding counts what is printed. */
static void test_frames_cells_unprintable(void **state)
{
	struct frames *f = *state;
	struct msg m;

	msg_init(&m, MSG_CELLS);
	msg_put_str(&m, K_TEXT, "before any group: ignored");
	put_group(&m, "n\x1b[2J\x7f", "h\xff", "bad\ttab", NULL, "x\ny", NULL);
	msg_put_u64(&m, 999, 1);        /* a key of a later version */
	put_group(&m, "n1", "h\xff", "ok", NULL, NULL);
	assert_int_equal(cli_out_frame(&f->o, &m), 0);
	msg_free(&m);
	assert_string_equal(cap_text(&f->out),
			    "ORIGIN  h?\n"
			    "n?[2J?  bad?tab\n"
			    "n1      ok\n"
			    "  n?[2J? on h?: bad?tab: x?y\n");
}

/* A frame naming more nodes than a table can show: the first 256 origins,
 * then how many more there were. */
static void test_frames_cells_bounded(void **state)
{
	struct frames *f = *state;
	const char *t, *line;
	char name[16];
	size_t rows = 0;
	struct msg m;

	msg_init(&m, MSG_CELLS);
	for (int i = 0; i < 260; i++) {
		snprintf(name, sizeof(name), "o%03d", i);
		put_group(&m, name, "h", "ok", NULL, NULL);
	}
	put_group(&m, "o000", "h", "damaged", NULL, NULL);    /* not a new origin */
	assert_int_equal(cli_out_frame(&f->o, &m), 0);
	msg_free(&m);
	t = cap_text(&f->out);
	assert_true(strncmp(t, "ORIGIN  h\no000    ok\n", strlen("ORIGIN  h\no000    ok\n")) == 0);
	for (line = t; (line = strchr(line, '\n')) && line[1]; line++)
		rows += line[1] == 'o';
	assert_int_equal(rows, 256);
	assert_non_null(strstr(t, "\no255    ok\n  (4 more not shown)\n"));
	assert_null(strstr(t, "o256"));
}

static void test_frames_cells_holders_only(void **state)
{
	struct frames *f = *state;
	struct msg m;

	msg_init(&m, MSG_CELLS);
	put_group(&m, "", "n1", "unreachable", NULL, "timed out", NULL);
	/* Groups without a holder belong to no column: JSON only. */
	msg_put_str(&m, K_ORIGIN, "");
	msg_put_str(&m, K_ORIGIN, "n0");
	msg_put_str(&m, K_TEXT, "lost");
	assert_int_equal(cli_out_frame(&f->o, &m), 0);
	f->o.json = true;
	assert_int_equal(cli_out_frame(&f->o, &m), 0);
	msg_free(&m);
	assert_string_equal(cap_text(&f->out),
			    "  n1: unreachable: timed out\n"
			    "{\"event\":\"copy\",\"origin\":\"\",\"holder\":\"n1\","
			    "\"state\":\"unreachable\",\"detail\":[\"timed out\"]}\n"
			    "{\"event\":\"copy\",\"origin\":\"\"}\n"
			    "{\"event\":\"copy\",\"origin\":\"n0\",\"detail\":[\"lost\"]}\n");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_args_pull_options_anywhere),
		cmocka_unit_test(test_args_dashdash),
		cmocka_unit_test(test_args_command_index),
		cmocka_unit_test(test_args_usage_errors),
		cmocka_unit_test(test_args_not_in_this_version),
		cmocka_unit_test(test_args_verify_cluster),
		cmocka_unit_test(test_args_restore),
		cmocka_unit_test(test_args_usage_text),
		cmocka_unit_test(test_args_commit_ls),
		cmocka_unit_test(test_args_help_version),
		cmocka_unit_test(test_absolute_paths),
		cmocka_unit_test(test_json_escaping),
		cmocka_unit_test(test_json_object),
		cmocka_unit_test(test_fmt_size),
		cmocka_unit_test(test_fmt_count_eta),
		cmocka_unit_test(test_fmt_progress),
		cmocka_unit_test(test_manifest_xxhsum_lines),
		cmocka_unit_test(test_manifest_json_entry),
		cmocka_unit_test_setup_teardown(test_frames_human, frames_setup, frames_teardown),
		cmocka_unit_test_setup_teardown(test_frames_failure_and_clamp, frames_setup,
						frames_teardown),
		cmocka_unit_test_setup_teardown(test_frames_json, frames_setup, frames_teardown),
		cmocka_unit_test_setup_teardown(test_frames_status, frames_setup, frames_teardown),
		cmocka_unit_test_setup_teardown(test_frames_progress_line, frames_setup,
						frames_teardown),
		cmocka_unit_test_setup_teardown(test_frames_cells_human, frames_setup,
						frames_teardown),
		cmocka_unit_test_setup_teardown(test_frames_cells_json, frames_setup,
						frames_teardown),
		cmocka_unit_test_setup_teardown(test_frames_cells_rules, frames_setup,
						frames_teardown),
		cmocka_unit_test_setup_teardown(test_frames_cells_unprintable, frames_setup,
						frames_teardown),
		cmocka_unit_test_setup_teardown(test_frames_cells_bounded, frames_setup,
						frames_teardown),
		cmocka_unit_test_setup_teardown(test_frames_cells_holders_only, frames_setup,
						frames_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
