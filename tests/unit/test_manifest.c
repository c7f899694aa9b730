/* The manifest: escaping, order, root digest, and writer -> reader round
 * trips through real files in a temporary directory, with the damage a
 * manifest meets on disk: truncation at every offset, an edited byte, a full
 * disk. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/manifest.h"

#define CHUNK 4096u

static int dfd = -1;                      /* the test directory */
static char dpath[] = "/tmp/test_manifest.XXXXXX";

/* Helpers */

struct list {
	struct mf_entry *e;
	size_t n, cap;
};

static void list_push(struct list *l, const struct mf_entry *e)
{
	if (l->n == l->cap) {
		l->cap = l->cap ? 2 * l->cap : 16;
		l->e = realloc(l->e, l->cap * sizeof(*l->e));
		assert_non_null(l->e);
	}
	l->e[l->n++] = *e;    /* takes ownership */
}

static void list_free(struct list *l)
{
	for (size_t i = 0; i < l->n; i++)
		mf_entry_free(&l->e[i]);
	free(l->e);
	memset(l, 0, sizeof(*l));
}

static int cmp_entry(const void *a, const void *b)
{
	return mf_path_cmp(((const struct mf_entry *)a)->path, ((const struct mf_entry *)b)->path);
}

static void add_dir(struct list *l, const char *path)
{
	struct mf_entry e = { .type = MF_DIR, .path = strdup(path), .mode = 0755, .mtime_ns = 1 };

	list_push(l, &e);
}

/* Digests are made up from the seed: the manifest does not read content. */
static void add_file(struct list *l, const char *path, uint64_t size, unsigned seed)
{
	struct mf_entry e = { .type = MF_FILE, .path = strdup(path), .size = size, .mode = 0644,
			      .mtime_ns = 1700000000123456789 };

	e.digest = digest_of(&seed, sizeof(seed));
	e.nchunks = mf_nchunks(size, CHUNK);
	if (e.nchunks) {
		e.chunks = calloc(e.nchunks, sizeof(*e.chunks));
		assert_non_null(e.chunks);
	}
	for (uint64_t i = 0; i < e.nchunks; i++) {
		uint64_t k[2] = { seed, i };

		e.chunks[i] = digest_of(k, sizeof(k));
	}
	list_push(l, &e);
}

static void add_link(struct list *l, const char *path, const char *target)
{
	struct mf_entry e = { .type = MF_LINK, .path = strdup(path), .size = strlen(target),
			      .mode = 0777, .mtime_ns = -5, .target = strdup(target) };

	e.digest = digest_of(target, strlen(target));
	list_push(l, &e);
}

static bool entry_eq(const struct mf_entry *a, const struct mf_entry *b)
{
	if (a->type != b->type || strcmp(a->path, b->path) || a->size != b->size ||
	    a->mode != b->mode || a->mtime_ns != b->mtime_ns || !digest_eq(a->digest, b->digest) ||
	    a->nchunks != b->nchunks || !a->target != !b->target ||
	    (a->target && strcmp(a->target, b->target)))
		return false;
	for (uint64_t i = 0; i < a->nchunks; i++)
		if (!digest_eq(a->chunks[i], b->chunks[i]))
			return false;
	return true;
}

static digest_t root_of(const struct list *l, size_t n)
{
	struct mf_root r;

	assert_int_equal(mf_root_init(&r), 0);
	for (size_t i = 0; i < n; i++)
		mf_root_add(&r, &l->e[i]);
	return mf_root_final(&r);
}

static int write_list(const char *name, const struct list *l, digest_t *root)
{
	struct mf_writer *w;
	int rc = mf_writer_open(&w, dfd, name, CHUNK);

	if (rc)
		return rc;
	for (size_t i = 0; i < l->n; i++) {
		rc = mf_writer_add(w, &l->e[i]);
		if (rc) {
			mf_writer_abort(w);
			return rc;
		}
	}
	return mf_writer_finish(w, root);
}

struct result {
	int rc;
	struct list l;
	digest_t root;
	uint64_t count, chunk_size;
	char why[512];
};

static void read_reader(struct mf_reader *r, struct result *res)
{
	struct mf_entry e;

	memset(res, 0, sizeof(*res));
	res->chunk_size = mf_reader_chunk_size(r);
	while ((res->rc = mf_reader_next(r, &e)) == 1)
		list_push(&res->l, &e);
	assert_int_equal(mf_reader_next(r, &e), res->rc);    /* sticky */
	res->root = mf_reader_root(r);
	res->count = mf_reader_count(r);
	snprintf(res->why, sizeof(res->why), "%s", mf_reader_why(r));
	if (res->rc == 0)
		assert_string_equal(res->why, "");
	mf_reader_close(r);
}

static void read_file(const char *name, enum mf_read_mode mode, struct result *res)
{
	struct mf_reader *r;

	assert_int_equal(mf_reader_open(&r, dfd, name, mode), 0);
	read_reader(r, res);
}

static void read_mem(const char *text, size_t n, enum mf_read_mode mode, struct result *res)
{
	struct mf_reader *r;
	FILE *fp = fmemopen((void *)text, n, "r");

	assert_non_null(fp);
	assert_int_equal(mf_reader_open_fp(&r, fp, "mem", mode), 0);
	read_reader(r, res);
	fclose(fp);
}

static void put_file(const char *name, const void *p, size_t n)
{
	int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_TRUNC, 0644);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, p, n), (ssize_t)n);
	close(fd);
}

static char *get_file(const char *name, size_t *n)
{
	int fd = openat(dfd, name, O_RDONLY);
	char *p = malloc(1 << 20);
	ssize_t got;

	assert_true(fd >= 0);
	assert_non_null(p);
	got = read(fd, p, 1 << 20);
	assert_true(got >= 0 && got < (1 << 20));
	close(fd);
	p[got] = '\0';
	*n = (size_t)got;
	return p;
}

/* A message names the label and a line: "LABEL:N: ...". */
static void assert_why(const char *why, const char *label, const char *what)
{
	size_t n = strlen(label), i = n + 1;

	if (strncmp(why, label, n) || why[n] != ':' || why[i] < '1' || why[i] > '9')
		fail_msg("message \"%s\" does not start with \"%s:LINE:\"", why, label);
	while (why[i] >= '0' && why[i] <= '9')
		i++;
	if (why[i] != ':' || !strstr(why, what))
		fail_msg("message \"%s\" does not say \"%s\"", why, what);
}

static void assert_lists_eq(const struct list *a, const struct list *b, size_t n)
{
	assert_true(a->n >= n && b->n >= n);
	for (size_t i = 0; i < n; i++)
		if (!entry_eq(&a->e[i], &b->e[i]))
			fail_msg("entry %zu (%s) differs", i, a->e[i].path);
}

/* A tree with every kind of awkward name, in component order. */
static void make_tree(struct list *l)
{
	add_dir(l, "a");
	add_file(l, "a/b", 10, 1);
	add_file(l, "a.txt", 0, 2);
	add_dir(l, "dir with spaces");
	add_file(l, "dir with spaces/new\nline", 5, 3);
	add_file(l, "dir with spaces/100%", CHUNK, 4);
	add_file(l, "big", 100 * CHUNK + 1, 5);
	add_file(l, "two", CHUNK + 1, 6);
	add_link(l, "link", "../outside/target with space");
	add_link(l, "abs", "/etc/passwd");
	add_file(l, "\xe6\x97\xa5\xe6\x9c\xac/\xe8\xaa\x9e", 7, 7);
	add_file(l, "\x80\xff\x01\x7f", 1, 8);
	add_file(l, "tab\there", 2, 9);
	add_file(l, "%41", 3, 10);
	add_dir(l, ".stagex");
	add_dir(l, "x/.stage");
	add_file(l, "...", 4, 11);
	qsort(l->e, l->n, sizeof(*l->e), cmp_entry);
}

/* Escaping */

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
	struct result res;

	assert_int_equal(mf_reader_open(&r, dfd, "does-not-exist", MF_COMPLETE), -ENOENT);
	/* A directory cannot be read: an I/O error, named. */
	assert_int_equal(mkdirat(dfd, "adir", 0755), 0);
	read_file("adir", MF_PARTIAL, &res);
	assert_int_equal(res.rc, -EISDIR);
	assert_non_null(strstr(res.why, "adir:"));
	assert_int_equal(unlinkat(dfd, "adir", AT_REMOVEDIR), 0);
}

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

/* Setup */

static int remove_all(void)
{
	DIR *d = fdopendir(dup(dfd));
	struct dirent *de;

	if (!d)
		return -1;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			unlinkat(dfd, de->d_name, 0);
	closedir(d);
	return 0;
}

static int group_setup(void **state)
{
	if (!mkdtemp(dpath))
		return -1;
	dfd = open(dpath, O_RDONLY | O_DIRECTORY);
	return dfd < 0 ? -1 : 0;
}

static int group_teardown(void **state)
{
	remove_all();
	close(dfd);
	return rmdir(dpath);
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
		cmocka_unit_test(test_entry_copy),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
