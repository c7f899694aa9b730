/* The manifest's text side (common/manifest.c): escaping, component order,
 * the root digest, the writer, and writer -> reader round trips through real
 * files in a temporary directory. */
#include "tests/unit/mf_fixture.h"

static void test_escape_all_bytes(void **state)
{
	char raw[256], out[3 * 255 + 1];
	int n;

	for (int c = 1; c < 256; c++) {
		char one = (char)c;

		n = mf_escape(&one, 1, out, sizeof(out));
		assert_int_equal(n, c > 0x20 && c < 0x7f && c != '%' ? 1 : 3);
		for (int i = 0; i < n; i++)
			assert_true(out[i] > 0x20 && out[i] < 0x7f);
		assert_int_equal(mf_unescape(out, (size_t)n), 1);
		assert_int_equal((unsigned char)out[0], c);
		raw[c - 1] = (char)c;
	}
	n = mf_escape(raw, 255, out, sizeof(out));
	assert_true(n > 0 && (size_t)n == strlen(out));
	assert_null(memchr(out, ' ', (size_t)n));
	assert_null(memchr(out, '\n', (size_t)n));
	assert_int_equal(mf_unescape(out, (size_t)n), 255);
	assert_memory_equal(out, raw, 255);
}

static void test_escape_random(void **state)
{
	char raw[64], out[3 * 64 + 1];

	srand(42);
	for (int round = 0; round < 10000; round++) {
		size_t len = (size_t)rand() % sizeof(raw);
		int n;

		for (size_t i = 0; i < len; i++)
			raw[i] = (char)(1 + rand() % 255);
		n = mf_escape(raw, len, out, sizeof(out));
		assert_true(n >= (int)len);
		assert_int_equal(mf_escape(raw, len, out, (size_t)n), -ENOSPC);   /* no room for NUL */
		assert_int_equal(mf_unescape(out, (size_t)n), (int)len);
		assert_memory_equal(out, raw, len);
	}
	assert_int_equal(mf_escape("", 0, out, 0), -ENOSPC);
	assert_int_equal(mf_escape("", 0, out, 1), 0);
	assert_string_equal(out, "");
}

static void test_unescape_rejects(void **state)
{
	static const char *bad[] = {
		"%", "%4", "a%", "%zz", "%4g", "%2f", "%41", "%7E", "%00", " ", "a b", "\n",
		"\x7f", "\x80", "\xff", "\t", "%%",
	};
	char buf[16];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		strcpy(buf, bad[i]);
		if (mf_unescape(buf, strlen(buf)) != -EINVAL)
			fail_msg("\"%s\" was accepted", bad[i]);
	}
	strcpy(buf, "%25%20%0A%7F");
	assert_int_equal(mf_unescape(buf, strlen(buf)), 4);
	assert_memory_equal(buf, "% \n\x7f", 4);
}

/* Order */

static void test_path_cmp(void **state)
{
	assert_true(mf_path_cmp("a/b", "a.txt") < 0);
	assert_true(mf_path_cmp("a.txt", "a/b") > 0);
	assert_true(mf_path_cmp("a", "a/b") < 0);
	assert_true(mf_path_cmp("a/b", "a0") < 0);
	assert_true(mf_path_cmp("a/b", "a/b") == 0);
	assert_true(mf_path_cmp("", "a") < 0);
	assert_true(mf_path_cmp("a/\x01", "a\x01") < 0);   /* '/' below every byte */
	assert_true(mf_path_cmp("a\x7f", "a\x80") < 0);    /* unsigned */
	assert_true(mf_path_cmp("a/z", "a-") < 0);
	assert_true(mf_path_cmp("ab/c", "a/zz") > 0);
}

/* Component order is the order of a walk that sorts each directory's names
 * by memcmp: compare with that definition on random paths. */
static int walk_cmp(const char *a, const char *b)
{
	for (;;) {
		size_t na = strcspn(a, "/"), nb = strcspn(b, "/");
		int c = memcmp(a, b, na < nb ? na : nb);

		if (c || na != nb)
			return c ? c : na < nb ? -1 : 1;
		a += na;
		b += nb;
		if (!*a || !*b)
			return !*a && !*b ? 0 : !*a ? -1 : 1;
		a++;
		b++;
	}
}

static void test_path_cmp_is_walk_order(void **state)
{
	static const char alphabet[] = "ab.-0\x01\xff/";
	char a[8], b[8];

	srand(7);
	for (int round = 0; round < 200000; round++) {
		char *s[2] = { a, b };

		for (int k = 0; k < 2; k++) {
			size_t len = 1 + (size_t)rand() % 6;

			for (size_t i = 0; i < len; i++) {
				char c = alphabet[rand() % (int)(sizeof(alphabet) - 1)];

				/* no leading, trailing or double '/' */
				if (c == '/' && (i == 0 || i + 1 == len || s[k][i - 1] == '/'))
					c = 'a';
				s[k][i] = c;
			}
			s[k][len] = '\0';
		}
		int x = mf_path_cmp(a, b), y = walk_cmp(a, b);

		if ((x < 0) != (y < 0) || (x == 0) != (y == 0))
			fail_msg("\"%s\" vs \"%s\": %d, walk %d", a, b, x, y);
	}
}

/* Round trips */

static void test_round_trip(void **state)
{
	struct list l = { 0 };
	struct result res;
	digest_t root;

	make_tree(&l);
	assert_int_equal(write_list("rt", &l, &root), 0);
	for (int mode = MF_COMPLETE; mode <= MF_PARTIAL; mode++) {
		read_file("rt", (enum mf_read_mode)mode, &res);
		assert_int_equal(res.rc, 0);
		assert_int_equal(res.chunk_size, CHUNK);
		assert_int_equal(res.l.n, l.n);
		assert_lists_eq(&res.l, &l, l.n);
		assert_int_equal(res.count, l.n);
		assert_true(digest_eq(res.root, root));
		assert_true(digest_eq(res.root, root_of(&l, l.n)));
		list_free(&res.l);
	}
	list_free(&l);
}

static void test_exact_text(void **state)
{
	struct list l = { 0 };
	char hex[33], link_hex[33], want[512], *got;
	size_t n;

	add_dir(&l, "d");
	add_file(&l, "d/a b", 5, 1);
	l.e[1].mode = 04755;
	l.e[1].mtime_ns = -1;
	add_link(&l, "l", "t%");
	l.e[2].mode = 0;
	assert_int_equal(write_list("exact", &l, NULL), 0);
	digest_to_hex(l.e[1].digest, hex);
	digest_to_hex(l.e[2].digest, link_hex);
	snprintf(want, sizeof(want),
		 "stage-manifest 1\nchunk 4096\nd d 0755 1\nf d/a%%20b 5 04755 -1 %s\nl l 2 00 -5 %s t%%25\nend ",
		 hex, link_hex);
	got = get_file("exact", &n);
	assert_int_equal(strncmp(got, want, strlen(want)), 0);
	free(got);
	list_free(&l);
}

static void test_extremes(void **state)
{
	struct list l = { 0 };
	struct result res;
	char target[MF_MAX_PATH + 1], path[MF_MAX_PATH + 1];

	memset(path, '\xff', MF_MAX_PATH);    /* escapes to three times its length */
	path[MF_MAX_PATH] = '\0';
	memset(target, '\n', MF_MAX_PATH);
	target[MF_MAX_PATH] = '\0';
	add_dir(&l, "a");
	l.e[0].mtime_ns = INT64_MIN;
	l.e[0].mode = 07777;
	add_dir(&l, "b");
	l.e[1].mtime_ns = INT64_MAX;
	l.e[1].mode = 0;
	add_file(&l, "c", 0, 1);
	add_link(&l, path, target);
	assert_int_equal(write_list("extreme", &l, NULL), 0);
	read_file("extreme", MF_COMPLETE, &res);
	assert_int_equal(res.rc, 0);
	assert_int_equal(res.l.n, l.n);
	assert_lists_eq(&res.l, &l, l.n);
	list_free(&res.l);
	list_free(&l);
}

static void test_empty_manifest(void **state)
{
	struct list l = { 0 };
	struct result res;
	digest_t root;

	assert_int_equal(write_list("empty", &l, &root), 0);
	read_file("empty", MF_COMPLETE, &res);
	assert_int_equal(res.rc, 0);
	assert_int_equal(res.l.n, 0);
	assert_true(digest_eq(res.root, root));

	put_file("zero", "", 0);
	read_file("zero", MF_COMPLETE, &res);
	assert_int_equal(res.rc, -EBADMSG);
	assert_why(res.why, "zero", "truncated (no end line)");
	read_file("zero", MF_PARTIAL, &res);
	assert_int_equal(res.rc, 0);
	assert_int_equal(res.chunk_size, 0);
	assert_int_equal(res.l.n, 0);
}

/* Root digest */

static void test_root_digest(void **state)
{
	struct list a = { 0 }, b = { 0 };
	digest_t ra;

	make_tree(&a);
	make_tree(&b);
	ra = root_of(&a, a.n);
	for (size_t i = 0; i < b.n; i++) {
		b.e[i].mtime_ns += 1000;
		b.e[i].mode ^= 0022;
	}
	assert_true(digest_eq(ra, root_of(&b, b.n)));

	size_t f = 0;

	while (b.e[f].type != MF_FILE)
		f++;
	b.e[f].size++;
	assert_false(digest_eq(ra, root_of(&b, b.n)));
	b.e[f].size--;
	b.e[f].digest.low64 ^= 1;
	assert_false(digest_eq(ra, root_of(&b, b.n)));
	b.e[f].digest.low64 ^= 1;
	b.e[f].path[0] ^= 1;
	assert_false(digest_eq(ra, root_of(&b, b.n)));
	b.e[f].path[0] ^= 1;
	assert_true(digest_eq(ra, root_of(&b, b.n)));
	assert_false(digest_eq(ra, root_of(&b, b.n - 1)));

	/* A directory's size and digest never count. */
	for (size_t i = 0; i < b.n; i++) {
		if (b.e[i].type == MF_DIR) {
			b.e[i].size = 4096;
			b.e[i].digest.high64 = 99;
		}
	}
	assert_true(digest_eq(ra, root_of(&b, b.n)));

	/* Same path and size, another type. */
	list_free(&b);
	add_file(&b, "a", 0, 0);
	b.e[0].digest = (digest_t){ 0 };
	list_free(&a);
	add_dir(&a, "a");
	assert_false(digest_eq(root_of(&a, 1), root_of(&b, 1)));
	list_free(&a);
	list_free(&b);
}

/* Damage */

/* Where each entry's last line (its own or its last chunk line) ends, in
 * the text of a manifest whose entries start at offset from. */
static void test_entry_copy(void **state)
{
	struct list l = { 0 };
	struct mf_entry c;

	make_tree(&l);
	for (size_t i = 0; i < l.n; i++) {
		assert_int_equal(mf_entry_copy(&c, &l.e[i]), 0);
		assert_true(entry_eq(&c, &l.e[i]));
		assert_true(c.path != l.e[i].path);
		mf_entry_free(&c);
		assert_null(c.path);
	}
	list_free(&l);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_escape_all_bytes),
		cmocka_unit_test(test_escape_random),
		cmocka_unit_test(test_unescape_rejects),
		cmocka_unit_test(test_path_cmp),
		cmocka_unit_test(test_path_cmp_is_walk_order),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_exact_text),
		cmocka_unit_test(test_extremes),
		cmocka_unit_test(test_empty_manifest),
		cmocka_unit_test(test_root_digest),
		cmocka_unit_test(test_entry_copy),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
