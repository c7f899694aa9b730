/* The manifest reader (common/mf_read.c) against the damage a manifest
 * meets on disk: truncation at every offset, every edited byte, bad lines
 * and headers, over-long lines, a journal cut mid-entry; and what the
 * writer refuses to write, or fails to. */
#include "tests/unit/mf_fixture.h"

static size_t entry_ends(const char *text, size_t n, size_t from, size_t *ends)
{
	size_t count = 0;

	for (size_t i = from; i < n;) {
		const char *nl = memchr(text + i, '\n', n - i);
		size_t next = (size_t)(nl - text) + 1;

		if (text[i] == 'c')
			ends[count - 1] = next;
		else if (text[i] != 'e')
			ends[count++] = next;
		i = next;
	}
	return count;
}

static void test_truncated(void **state)
{
	struct list l = { 0 };
	struct result res;
	size_t n, ends[64], nends, header;
	char *text;

	add_dir(&l, "a");
	add_file(&l, "a/b", 3 * CHUNK, 1);
	add_file(&l, "a/c", 1, 2);
	add_link(&l, "a/d", "b");
	add_file(&l, "e", 2 * CHUNK + 7, 3);
	assert_int_equal(write_list("full", &l, NULL), 0);
	text = get_file("full", &n);
	header = (size_t)(strchr(strchr(text, '\n') + 1, '\n') + 1 - text);
	nends = entry_ends(text, n, header, ends);
	assert_int_equal(nends, l.n);

	for (size_t cut = 0; cut < n; cut++) {
		size_t want = 0;

		put_file("cut", text, cut);
		read_file("cut", MF_COMPLETE, &res);
		assert_int_equal(res.rc, -EBADMSG);
		assert_why(res.why, "cut", "truncated");
		list_free(&res.l);

		while (want < nends && ends[want] <= cut)
			want++;
		read_file("cut", MF_PARTIAL, &res);
		if (res.rc || res.l.n != want)
			fail_msg("cut at %zu: rc %d, %zu entries, want %zu (%s)", cut, res.rc, res.l.n,
				 want, res.why);
		assert_lists_eq(&res.l, &l, want);
		assert_int_equal(res.count, want);
		assert_true(digest_eq(res.root, root_of(&l, want)));
		assert_int_equal(res.chunk_size, cut >= header ? CHUNK : 0);
		list_free(&res.l);
	}
	free(text);
	list_free(&l);
}

static void test_every_edit_detected(void **state)
{
	struct list l = { 0 };
	struct result res;
	size_t n;
	char *text;

	make_tree(&l);
	assert_int_equal(write_list("orig", &l, NULL), 0);
	text = get_file("orig", &n);
	for (size_t i = 0; i < n; i++) {
		text[i] ^= 1;
		put_file("edit", text, n);
		text[i] ^= 1;
		read_file("edit", MF_COMPLETE, &res);
		if (res.rc != -EBADMSG)
			fail_msg("edit at %zu of %zu went unnoticed", i, n);
		assert_why(res.why, "edit", "");
		list_free(&res.l);
	}
	free(text);
	list_free(&l);
}

static void test_edited_fields(void **state)
{
	struct list l = { 0 };
	struct result res;
	char *text, *p;
	size_t n;

	make_tree(&l);
	assert_int_equal(write_list("orig2", &l, NULL), 0);
	text = get_file("orig2", &n);

	/* An mtime digit: the root does not see it, the text digest does. */
	p = strstr(text, " 1700000000123456789 ");
	assert_non_null(p);
	p[5] = '1';
	put_file("mtime", text, n);
	p[5] = '0';
	for (int mode = MF_COMPLETE; mode <= MF_PARTIAL; mode++) {
		read_file("mtime", (enum mf_read_mode)mode, &res);
		assert_int_equal(res.rc, -EBADMSG);
		assert_why(res.why, "mtime", "text digest mismatch");
		list_free(&res.l);
	}

	/* The trailer's count and root. */
	p = strstr(text, "\nend ") + 5 + 32 + 1;
	(*p)++;
	put_file("count", text, n);
	(*p)--;
	read_file("count", MF_COMPLETE, &res);
	assert_why(res.why, "count", "entry count mismatch");
	list_free(&res.l);

	p = strstr(text, "\nend ") + 5;
	*p = *p == '0' ? '1' : '0';
	put_file("root", text, n);
	read_file("root", MF_PARTIAL, &res);
	assert_why(res.why, "root", "root digest mismatch");
	list_free(&res.l);
	free(text);

	/* Anything after the trailer. */
	text = get_file("orig2", &n);
	text = realloc(text, n + 2);
	memcpy(text + n, "x\n", 2);
	put_file("after", text, n + 2);
	read_file("after", MF_COMPLETE, &res);
	assert_why(res.why, "after", "data after the end line");
	list_free(&res.l);
	free(text);
	list_free(&l);
}

/* The reader accepts upper-case digests (the text digest is over the bytes
 * as they are). */
static void test_upper_case_digests(void **state)
{
	struct mf_entry e = { .type = MF_FILE, .path = "a", .size = 1, .mode = 0644 };
	char text[4096], hex[33], thex[33];
	struct result res;
	struct mf_root r;
	int n;

	e.digest = digest_of("x", 1);
	digest_to_hex(e.digest, hex);
	for (char *p = hex; *p; p++)
		if (*p >= 'a')
			*p = (char)(*p - 'a' + 'A');
	n = snprintf(text, sizeof(text), "stage-manifest 1\nchunk 4096\nf a 1 0644 0 %s\n", hex);
	assert_int_equal(mf_root_init(&r), 0);
	mf_root_add(&r, &e);
	digest_to_hex(mf_root_final(&r), hex);
	digest_to_hex(digest_of(text, (size_t)n), thex);
	n += snprintf(text + n, sizeof(text) - (size_t)n, "end %s 1 %s\n", hex, thex);

	read_mem(text, (size_t)n, MF_COMPLETE, &res);
	assert_int_equal(res.rc, 0);
	assert_int_equal(res.l.n, 1);
	assert_true(digest_eq(res.l.e[0].digest, e.digest));
	list_free(&res.l);
}

/* Bad input, line by line */

/* The header, then body with '@' standing for the digest of "b". */
static size_t with_header(const char *body, char *out, size_t cap)
{
	char hex[33];
	size_t n = (size_t)snprintf(out, cap, "stage-manifest 1\nchunk 4096\n");

	digest_to_hex(digest_of("b", 1), hex);
	for (; *body; body++) {
		assert_true(n + 33 < cap);
		if (*body == '@') {
			memcpy(out + n, hex, 32);
			n += 32;
		} else {
			out[n++] = *body;
		}
	}
	out[n] = '\0';
	return n;
}

struct bad {
	const char *body;
	int line;
	const char *what;
};

static void expect_bad(const struct bad *b, size_t count)
{
	char text[8192];
	struct result res;

	for (size_t i = 0; i < count; i++) {
		size_t n = with_header(b[i].body, text, sizeof(text));
		char where[32];

		for (int mode = MF_COMPLETE; mode <= MF_PARTIAL; mode++) {
			read_mem(text, n, (enum mf_read_mode)mode, &res);
			snprintf(where, sizeof(where), "mem:%d: ", b[i].line);
			if (res.rc != -EBADMSG || strncmp(res.why, where, strlen(where)) ||
			    !strstr(res.why, b[i].what))
				fail_msg("body \"%s\": rc %d, \"%s\"; want line %d, \"%s\"", b[i].body,
					 res.rc, res.why, b[i].line, b[i].what);
			list_free(&res.l);
		}
	}
}

static void test_bad_lines(void **state)
{
	static const struct bad bad[] = {
		{ "x a 00 0\n", 3, "unknown line type" },
		{ "dd a 00 0\n", 3, "unknown line type" },
		{ "stage-manifest 1\n", 3, "unknown line type" },
		{ "\n", 3, "empty line" },
		{ "d a  0755 0\n", 3, "empty field" },
		{ "d a 0755 0 \n", 3, "empty field" },
		{ " d a 0755 0\n", 3, "empty field" },
		{ "d a 0755\n", 3, "fields" },
		{ "d a 0755 0 x\n", 3, "fields" },
		{ "f a 1 0644 0 @ x\n", 3, "fields" },
		{ "l a 1 0777 0 @ b c\n", 3, "too many fields" },
		{ "d a 755 0\n", 3, "bad mode" },
		{ "d a 00755 0\n", 3, "bad mode" },
		{ "d a 010000 0\n", 3, "bad mode" },
		{ "d a 0758 0\n", 3, "bad mode" },
		{ "d a 0 0\n", 3, "bad mode" },
		{ "d a 0755 -0\n", 3, "bad mtime" },
		{ "d a 0755 01\n", 3, "bad mtime" },
		{ "d a 0755 +1\n", 3, "bad mtime" },
		{ "d a 0755 -\n", 3, "bad mtime" },
		{ "d a 0755 9223372036854775808\n", 3, "bad mtime" },
		{ "d a 0755 -9223372036854775809\n", 3, "bad mtime" },
		{ "d a 0755 0\r\n", 3, "bad mtime" },
		{ "f a 01 0644 0 @\n", 3, "bad size" },
		{ "f a -1 0644 0 @\n", 3, "bad size" },
		{ "f a 18446744073709551616 0644 0 @\n", 3, "bad size" },
		{ "f a 1 0644 0 0123\n", 3, "bad digest" },
		{ "f a 1 0644 0 @0\n", 3, "bad digest" },
		{ "f a 1 0644 0 g0000000000000000000000000000000\n", 3, "bad digest" },
		{ "d a%2 0755 0\n", 3, "bad escape in the path" },
		{ "d a%41 0755 0\n", 3, "bad escape in the path" },
		{ "d a%2f 0755 0\n", 3, "bad escape in the path" },
		{ "d a%00b 0755 0\n", 3, "bad escape in the path" },
		{ "d a\xff 0755 0\n", 3, "bad escape in the path" },
		{ "d a\tb 0755 0\n", 3, "bad escape in the path" },
		{ "l a 1 0777 0 @ %62\n", 3, "bad escape in the link target" },
		{ "d /a 0755 0\n", 3, "empty component" },
		{ "d a/ 0755 0\n", 3, "empty component" },
		{ "d a//b 0755 0\n", 3, "empty component" },
		{ "d ./a 0755 0\n", 3, "'.' or '..'" },
		{ "d a/.. 0755 0\n", 3, "'.' or '..'" },
		{ "d .stage 0755 0\n", 3, "reserved" },
		{ "d .stage/x 0755 0\n", 3, "reserved" },
		{ "l a 1 0777 0 @ c\n", 3, "link digest" },
		{ "l a 2 0777 0 @ b\n", 3, "link size" },
		{ "c @\n", 3, "chunk line where none is due" },
		{ "f a 1 0644 0 @\nc @\n", 4, "chunk line where none is due" },
		{ "f a 4096 0644 0 @\nc @\n", 4, "chunk line where none is due" },
		{ "f a 4097 0644 0 @\nd b 0755 0\n", 4, "expected chunk line 1 of 2 for line 3" },
		{ "f a 8193 0644 0 @\nc @\nc @\nd b 0755 0\n", 6, "expected chunk line 3 of 3" },
		{ "f a 8193 0644 0 @\nc @\nc @\nc @\nc @\n", 7, "chunk line where none is due" },
		{ "f a 4097 0644 0 @\nc @\nend @\n", 5, "expected chunk line 2 of 2" },
		{ "f a 4097 0644 0 @\nc @ @\nc @\n", 4, "expected chunk line 1 of 2" },
		{ "f a 4097 0644 0 @\nc 12\nc @\n", 4, "bad digest" },
		{ "d b 0755 0\nd a 0755 0\n", 4, "out of order" },
		{ "d a 0755 0\nd a 0755 0\n", 4, "duplicate entry" },
		{ "d a.txt 0755 0\nd a/b 0755 0\n", 4, "out of order" },
		{ "f a 1 0644 0 @\nd a/b 0755 0\n", 4, "beneath a file or a link" },
		{ "l a 1 0777 0 @ b\nf a/b 1 0644 0 @\n", 4, "beneath a file or a link" },
		{ "end @\n", 3, "bad end line" },
		{ "end @ 0\n", 3, "bad end line" },
		{ "end @ 00 @\n", 3, "bad end line" },
		{ "end @ 0 @\n", 3, "text digest mismatch" },
	};

	expect_bad(bad, sizeof(bad) / sizeof(bad[0]));
}

static void test_bad_headers(void **state)
{
	static const struct {
		const char *text, *what;
	} bad[] = {
		{ "stage-manifest 2\nchunk 4096\n", "mem:1: unsupported manifest version" },
		{ "stage-manifest 01\nchunk 4096\n", "mem:1: unsupported manifest version" },
		{ "stage-manifest  1\nchunk 4096\n", "mem:1: not a stage manifest" },
		{ "stage-manifest\nchunk 4096\n", "mem:1: not a stage manifest" },
		{ "\x7f" "ELF\x02\x01\n", "mem:1: not a stage manifest" },
		{ "stage-manifest 1\nchunk 4095\n", "mem:2: bad chunk line" },
		{ "stage-manifest 1\nchunk 2048\n", "mem:2: bad chunk line" },
		{ "stage-manifest 1\nchunk 6144\n", "mem:2: bad chunk line" },
		{ "stage-manifest 1\nchunk 2147483648\n", "mem:2: bad chunk line" },
		{ "stage-manifest 1\nchunk 04096\n", "mem:2: bad chunk line" },
		{ "stage-manifest 1\nchunks 4096\n", "mem:2: bad chunk line" },
		{ "stage-manifest 1\nd a 0755 0\n", "mem:2: bad chunk line" },
		{ "stage-manifest 1\n", "mem:2: truncated (no end line)" },
		{ "stage-manifest 1", "mem:1: truncated (last line has no newline)" },
	};
	struct result res;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		read_mem(bad[i].text, strlen(bad[i].text), MF_COMPLETE, &res);
		assert_int_equal(res.chunk_size, 0);
		if (res.rc != -EBADMSG || strncmp(res.why, bad[i].what, strlen(bad[i].what)))
			fail_msg("\"%s\": %d \"%s\"", bad[i].text, res.rc, res.why);
	}
	/* Chunk sizes at the bounds are fine. */
	read_mem("stage-manifest 1\nchunk 1073741824\n", 34, MF_PARTIAL, &res);
	assert_int_equal(res.rc, 0);
	assert_int_equal(res.chunk_size, 1u << 30);
}

static void test_long_line(void **state)
{
	size_t cap = 3 * MF_MAX_LINE, n;
	char *text = malloc(cap);
	struct result res;

	assert_non_null(text);
	for (size_t len = MF_MAX_LINE; len <= MF_MAX_LINE + 1; len++) {
		n = with_header("", text, cap);
		memset(text + n, 'x', len);
		text[n + len] = '\n';
		read_mem(text, n + len + 1, MF_PARTIAL, &res);
		assert_int_equal(res.rc, -EBADMSG);
		assert_string_equal(res.why, len > MF_MAX_LINE ? "mem:3: line longer than 65536 bytes"
							      : "mem:3: unknown line type");
		/* Unfinished, it is too long all the same. */
		read_mem(text, n + len, MF_PARTIAL, &res);
		assert_int_equal(res.rc, len > MF_MAX_LINE ? -EBADMSG : 0);
	}
	free(text);
}

/* The writer */

static void test_writer_rejects(void **state)
{
	struct mf_writer *w;
	struct list l = { 0 };
	digest_t root;

	assert_int_equal(mf_writer_open(&w, dfd, "x", 4095), -EINVAL);
	assert_int_equal(mf_writer_open(&w, dfd, "x", 3 << 12), -EINVAL);
	assert_int_equal(mf_writer_open(&w, dfd, "x", 1ull << 31), -EINVAL);
	assert_int_equal(mf_writer_open(&w, dfd, "no/such/dir", CHUNK), -ENOENT);
	assert_int_equal(mf_writer_open(&w, dfd, "rej", CHUNK), 0);

	add_dir(&l, "b");
	add_dir(&l, "a");                       /* 1: out of order */
	add_dir(&l, "b");                       /* 2: duplicate */
	add_file(&l, "c", 1, 1);
	add_file(&l, "c/d", 1, 1);              /* 4: beneath a file */
	add_file(&l, "e", 2 * CHUNK, 1);
	l.e[5].nchunks = 1;                     /* 5: wrong chunk count */
	add_file(&l, "e", 2 * CHUNK, 1);
	free(l.e[6].chunks);
	l.e[6].chunks = NULL;                   /* 6: no chunk digests */
	add_file(&l, "e", CHUNK, 1);
	l.e[7].nchunks = 1;                     /* 7: chunks for a one-chunk file */
	l.e[7].chunks = calloc(1, sizeof(digest_t));
	add_dir(&l, "/abs");                    /* 8..13: bad paths */
	add_dir(&l, "f/");
	add_dir(&l, "f//g");
	add_dir(&l, "f/./g");
	add_dir(&l, ".stage");
	add_dir(&l, "");
	add_dir(&l, "f");
	l.e[14].mode = 010000;                  /* 14: mode */
	add_dir(&l, "f");
	l.e[15].size = 1;                       /* 15: dir with a size */
	add_link(&l, "f", "t");
	l.e[16].size = 2;                       /* 16: link size */
	add_link(&l, "f", "t");
	l.e[17].digest.low64++;                 /* 17: link digest */
	add_file(&l, "f", 1, 1);
	l.e[18].type = 'x';                     /* 18: type */
	add_file(&l, "f", 1, 1);
	l.e[19].target = strdup("t");           /* 19: a file with a target */
	add_link(&l, "f", "t");                 /* 20: fine */

	assert_int_equal(mf_writer_add(w, &l.e[0]), 0);
	for (size_t i = 1; i < 20; i++) {
		if (i == 3) {
			assert_int_equal(mf_writer_add(w, &l.e[3]), 0);
			continue;
		}
		if (mf_writer_add(w, &l.e[i]) != -EINVAL)
			fail_msg("entry %zu (%s) was accepted", i, l.e[i].path);
	}
	assert_int_equal(mf_writer_add(w, &l.e[20]), 0);
	assert_int_equal(mf_writer_finish(w, &root), 0);

	/* Rejections wrote nothing. */
	struct result res;

	read_file("rej", MF_COMPLETE, &res);
	assert_int_equal(res.rc, 0);
	assert_int_equal(res.l.n, 3);
	list_free(&res.l);
	list_free(&l);
}

/* A journal: flushed entries survive a crash, and the partial reader drops a
 * file whose chunk lines did not all make it. */
static void test_journal(void **state)
{
	struct mf_writer *w;
	struct list l = { 0 };
	struct result res;
	size_t n;
	char *text;

	add_dir(&l, "a");
	add_file(&l, "a/big", 5 * CHUNK, 1);
	add_file(&l, "b", 1, 2);
	assert_int_equal(mf_writer_open(&w, dfd, "journal", CHUNK), 0);
	assert_int_equal(mf_writer_add(w, &l.e[0]), 0);
	assert_int_equal(mf_writer_add(w, &l.e[1]), 0);
	assert_int_equal(mf_writer_flush(w), 0);

	read_file("journal", MF_PARTIAL, &res);     /* while the writer is open */
	assert_int_equal(res.rc, 0);
	assert_int_equal(res.l.n, 2);
	assert_lists_eq(&res.l, &l, 2);
	list_free(&res.l);

	assert_int_equal(mf_writer_add(w, &l.e[2]), 0);
	mf_writer_abort(w);
	read_file("journal", MF_COMPLETE, &res);
	assert_why(res.why, "journal", "truncated (no end line)");
	list_free(&res.l);
	read_file("journal", MF_PARTIAL, &res);
	assert_int_equal(res.rc, 0);
	assert_int_equal(res.l.n, 3);
	list_free(&res.l);

	/* Cut after two of a/big's five chunk lines, at a line's end. */
	text = get_file("journal", &n);
	char *c = strstr(text, "\nc ");

	c = strstr(c + 1, "\nc ");
	c = strchr(c + 1, '\n');
	put_file("journal2", text, (size_t)(c + 1 - text));
	read_file("journal2", MF_PARTIAL, &res);
	assert_int_equal(res.rc, 0);
	assert_int_equal(res.l.n, 1);
	assert_string_equal(res.l.e[0].path, "a");
	list_free(&res.l);
	free(text);
	list_free(&l);
}

/* A full disk: the error comes back, and is sticky. */
static void test_write_errors(void **state)
{
	struct mf_writer *w;
	struct list l = { 0 };
	int rc = 0;

	if (access("/dev/full", W_OK))
		skip();
	assert_int_equal(mf_writer_open(&w, AT_FDCWD, "/dev/full", CHUNK), 0);
	add_file(&l, "a", 2, 1);
	assert_int_equal(mf_writer_add(w, &l.e[0]), 0);
	assert_int_equal(mf_writer_finish(w, NULL), -ENOSPC);

	/* Past the stdio buffer: an add fails, and so does all that follows. */
	add_file(&l, "b", 40000ull * CHUNK, 2);
	add_file(&l, "c", 1, 3);
	assert_int_equal(mf_writer_open(&w, AT_FDCWD, "/dev/full", CHUNK), 0);
	assert_int_equal(mf_writer_add(w, &l.e[0]), 0);
	rc = mf_writer_add(w, &l.e[1]);
	assert_int_equal(rc, -ENOSPC);
	assert_int_equal(mf_writer_add(w, &l.e[2]), -ENOSPC);
	assert_int_equal(mf_writer_flush(w), -ENOSPC);
	assert_int_equal(mf_writer_finish(w, NULL), -ENOSPC);
	list_free(&l);
}

static void test_reader_errors(void **state)
{
	struct mf_reader *r;

	assert_int_equal(mf_reader_open(&r, dfd, "does-not-exist", MF_COMPLETE), -ENOENT);
	/* Only a regular file is opened (a manifest may lie in a user's tree,
	 * read by root): a directory, a fifo (at once, not blocking) and a
	 * symbolic link (not followed) are refused. */
	assert_int_equal(mkdirat(dfd, "adir", 0755), 0);
	assert_int_equal(mf_reader_open(&r, dfd, "adir", MF_PARTIAL), -EISDIR);
	assert_int_equal(unlinkat(dfd, "adir", AT_REMOVEDIR), 0);
	assert_int_equal(mkfifoat(dfd, "afifo", 0644), 0);
	assert_int_equal(mf_reader_open(&r, dfd, "afifo", MF_PARTIAL), -EINVAL);
	assert_int_equal(unlinkat(dfd, "afifo", 0), 0);
	assert_int_equal(symlinkat("/etc/passwd", dfd, "alink"), 0);
	assert_int_equal(mf_reader_open(&r, dfd, "alink", MF_PARTIAL), -ELOOP);
	assert_int_equal(unlinkat(dfd, "alink", 0), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_truncated),
		cmocka_unit_test(test_every_edit_detected),
		cmocka_unit_test(test_edited_fields),
		cmocka_unit_test(test_upper_case_digests),
		cmocka_unit_test(test_bad_lines),
		cmocka_unit_test(test_bad_headers),
		cmocka_unit_test(test_long_line),
		cmocka_unit_test(test_writer_rejects),
		cmocka_unit_test(test_journal),
		cmocka_unit_test(test_write_errors),
		cmocka_unit_test(test_reader_errors),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
