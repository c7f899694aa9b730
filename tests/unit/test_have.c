/* daemon/repl/repl_have.c: which chunks of an offer the receiver holds already.
 * Real manifests, written with the manifest writer into a temporary
 * replica_root (copies at ORIGIN/JOB/STEP/.stage/manifest) and a staging
 * directory (the offer). Digests are made up: nothing but manifests is read.
 * Covers the numbering of chunks, the resume point, the search order of the
 * copies, duplicates, other chunk sizes, damaged manifests, hidden names,
 * and the limits (HAVE_MAX_COPIES, HAVE_MAX_CHUNKS). */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/digest.h"
#include "common/manifest.h"
#include "daemon/repl/repl_have.h"

#define CS 4096u                 /* the offer's chunk size (MF_CHUNK_MIN) */
#define ORIGIN "n0"
#define JOB "job1"
#define STEP "step-20"

/* ------------------------------------------------------------------ */
/* Fixture                                                             */

struct t {
	char dir[64];                /* mkdtemp: rr/ (replica_root) and st/ (staging) */
	int rr_fd, st_fd;
};

static int setup(void **state)
{
	struct t *t = calloc(1, sizeof(*t));
	char p[128];

	if (!t)
		return -1;
	snprintf(t->dir, sizeof(t->dir), "/tmp/test_have.XXXXXX");
	if (!mkdtemp(t->dir))
		return -1;
	snprintf(p, sizeof(p), "%s/rr", t->dir);
	if (mkdir(p, 0755) < 0 || (t->rr_fd = open(p, O_RDONLY | O_DIRECTORY)) < 0)
		return -1;
	snprintf(p, sizeof(p), "%s/st", t->dir);
	if (mkdir(p, 0755) < 0 || (t->st_fd = open(p, O_RDONLY | O_DIRECTORY)) < 0)
		return -1;
	*state = t;
	return 0;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	return remove(path);
}

static int rm_tree(const char *path)
{
	return nftw(path, rm_one, 32, FTW_DEPTH | FTW_PHYS);
}

static int teardown(void **state)
{
	struct t *t = *state;
	int rc;

	close(t->rr_fd);
	close(t->st_fd);
	rc = rm_tree(t->dir);
	free(t);
	return rc;
}

/* ------------------------------------------------------------------ */
/* Helpers                                                             */

/* Made-up digests: D(x) != D(y) for x != y, never zero, never the digest
 * of anything real. */
static digest_t D(uint64_t x)
{
	digest_t d = { .low64 = x, .high64 = 0x4841564500000000ull + x };

	return d;
}

struct list {
	struct mf_entry *e;
	size_t n, cap;
};

static void push(struct list *l, const struct mf_entry *e)
{
	if (l->n == l->cap) {
		l->cap = l->cap ? 2 * l->cap : 16;
		l->e = realloc(l->e, l->cap * sizeof(*l->e));
		assert_non_null(l->e);
	}
	l->e[l->n++] = *e;    /* takes ownership */
}

static void add_dir(struct list *l, const char *path)
{
	struct mf_entry e = { .type = MF_DIR, .path = strdup(path), .mode = 0755, .mtime_ns = 1 };

	push(l, &e);
}

static void add_link(struct list *l, const char *path, const char *target)
{
	struct mf_entry e = { .type = MF_LINK, .path = strdup(path), .size = strlen(target),
			      .mode = 0777, .mtime_ns = 1, .target = strdup(target) };

	e.digest = digest_of(target, strlen(target));
	push(l, &e);
}

/* A file hashed with chunk size cs: whole is its digest, chunks (NULL for
 * none) the mf_nchunks(size, cs) chunk digests. */
static void add_file(struct list *l, const char *path, uint64_t size, uint64_t cs, digest_t whole,
		     const digest_t *chunks)
{
	struct mf_entry e = { .type = MF_FILE, .path = strdup(path), .size = size, .mode = 0644,
			      .mtime_ns = 1700000000123456789, .digest = whole };

	e.nchunks = mf_nchunks(size, cs);
	if (e.nchunks) {
		assert_non_null(chunks);
		e.chunks = malloc(e.nchunks * sizeof(*e.chunks));
		assert_non_null(e.chunks);
		memcpy(e.chunks, chunks, e.nchunks * sizeof(*e.chunks));
	}
	push(l, &e);
}

/* A file of one chunk or less: its number is keyed by d. */
static void add_small(struct list *l, const char *path, uint64_t size, digest_t d)
{
	assert_true(size > 0 && size <= CS);
	add_file(l, path, size, CS, d, NULL);
}

/* A file of n chunks of cs bytes (the last one short by `short_by`), chunk
 * k's digest D(base + k); its whole digest D(base | 1 << 62). */
static void add_seq(struct list *l, const char *path, uint64_t n, uint64_t cs, uint64_t short_by,
		    uint64_t base)
{
	digest_t *c = malloc(n * sizeof(*c));

	assert_non_null(c);
	assert_true(n > 1 && short_by < cs);
	for (uint64_t k = 0; k < n; k++)
		c[k] = D(base + k);
	add_file(l, path, n * cs - short_by, cs, D(base | 1ull << 62), c);
	free(c);
}

static int cmp_entry(const void *a, const void *b)
{
	return mf_path_cmp(((const struct mf_entry *)a)->path, ((const struct mf_entry *)b)->path);
}

/* Writes l (sorted into component order) as dirfd/name and frees it. With
 * trailer false the file is a journal: no trailer. */
static void write_mf(int dirfd, const char *name, uint64_t cs, struct list *l, bool trailer)
{
	struct mf_writer *w;
	digest_t root;

	qsort(l->e, l->n, sizeof(*l->e), cmp_entry);
	assert_int_equal(mf_writer_open(&w, dirfd, name, cs), 0);
	for (size_t i = 0; i < l->n; i++)
		if (mf_writer_add(w, &l->e[i]) != 0)
			fail_msg("%s: entry %s refused", name, l->e[i].path);
	if (trailer) {
		assert_int_equal(mf_writer_finish(w, &root), 0);
	} else {
		assert_int_equal(mf_writer_flush(w), 0);
		mf_writer_abort(w);
	}
	for (size_t i = 0; i < l->n; i++)
		mf_entry_free(&l->e[i]);
	free(l->e);
	memset(l, 0, sizeof(*l));
}

/* mkdir -p dirfd/rel. */
static void mkdirs_in(int dirfd, const char *rel)
{
	char p[PATH_MAX];

	snprintf(p, sizeof(p), "%s", rel);
	for (char *s = p;; s++) {
		if (*s == '/' || !*s) {
			char c = *s;

			*s = '\0';
			if (mkdirat(dirfd, p, 0755) < 0 && errno != EEXIST)
				fail_msg("mkdir %s: %s", p, strerror(errno));
			*s = c;
			if (!c)
				break;
		}
	}
}

/* mkdir -p rr/rel. */
static void mkdirs(struct t *t, const char *rel)
{
	mkdirs_in(t->rr_fd, rel);
}

/* Opens rr/copy/.stage (made if missing). */
static int stage_dir(struct t *t, const char *copy)
{
	char p[PATH_MAX];
	int fd;

	snprintf(p, sizeof(p), "%s/%s", copy, MF_DIRNAME);
	mkdirs(t, p);
	fd = openat(t->rr_fd, p, O_RDONLY | O_DIRECTORY);
	assert_true(fd >= 0);
	return fd;
}

/* A published copy rr/copy (ORIGIN/JOB/STEP or any path) with l. */
static void publish_cs(struct t *t, const char *copy, uint64_t cs, struct list *l, bool trailer)
{
	int fd = stage_dir(t, copy);

	write_mf(fd, "manifest", cs, l, trailer);
	close(fd);
}

static void publish(struct t *t, const char *copy, struct list *l)
{
	publish_cs(t, copy, CS, l, true);
}

/* A copy holding one small file named `name` for each digest given. */
static void publish_digests(struct t *t, const char *copy, const char *const *names,
			    const digest_t *d, size_t n)
{
	struct list l = { 0 };

	for (size_t i = 0; i < n; i++)
		add_small(&l, names[i], 1 + i, d[i]);
	publish(t, copy, &l);
}

static void offer(struct t *t, uint64_t cs, struct list *l)
{
	write_mf(t->st_fd, "offer", cs, l, true);
}

static int plan(struct t *t, struct have **h, uint64_t from_idx, uint64_t from_off)
{
	*h = (struct have *)&h;    /* not NULL: have_plan must set it */
	return have_plan(h, t->rr_fd, t->st_fd, "offer", ORIGIN, JOB, from_idx, from_off);
}

/* What chunk n should be: held at path/off, or not (path NULL). */
struct want {
	const char *path;
	uint64_t off;
};

/* h against want[0..nnum): the bitmap (no bit beyond the offer's chunks),
 * have_source of each, have_count. */
static void check(const char *what, const struct have *h, uint64_t nnum, const struct want *w)
{
	const uint8_t *bits;
	uint64_t held = 0, last = 0;
	size_t len = SIZE_MAX;

	if (!h)
		fail_msg("%s: no plan", what);
	bits = have_bits(h, &len);
	assert_non_null(bits);
	for (uint64_t n = 0; n < nnum; n++)
		if (w[n].path)
			last = n;
	if (len > (nnum + 7) / 8 || len * 8 <= last)
		fail_msg("%s: bitmap of %zu bytes for %llu chunks (chunk %llu held)", what, len,
			 (unsigned long long)nnum, (unsigned long long)last);
	for (uint64_t n = 0; n < (uint64_t)len * 8; n++) {
		const char *path = NULL;
		uint64_t off = UINT64_MAX;
		int bit = have_bit(bits, len, n), rc = have_source(h, n, &path, &off);

		if (n < nnum && w[n].path) {
			if (!bit)
				fail_msg("%s: chunk %llu: bit not set", what, (unsigned long long)n);
			if (rc != 0)
				fail_msg("%s: chunk %llu: have_source returned %d", what,
					 (unsigned long long)n, rc);
			if (strcmp(path, w[n].path) != 0 || off != w[n].off)
				fail_msg("%s: chunk %llu: held at %s offset %llu, not %s offset %llu",
					 what, (unsigned long long)n, path, (unsigned long long)off,
					 w[n].path, (unsigned long long)w[n].off);
			held++;
		} else {
			if (bit)
				fail_msg("%s: chunk %llu: bit set, but it is not held", what,
					 (unsigned long long)n);
			if (rc != -ENOENT)
				fail_msg("%s: chunk %llu: have_source returned %d (%s), not -ENOENT",
					 what, (unsigned long long)n, rc, rc == 0 ? path : "");
		}
	}
	assert_int_equal(have_count(h), held);
	{
		const char *path;
		uint64_t off;

		assert_int_equal(have_source(h, nnum, &path, &off), -ENOENT);
		assert_int_equal(have_source(h, UINT64_MAX, &path, &off), -ENOENT);
	}
}

/* ------------------------------------------------------------------ */
/* 1. Nothing held                                                     */

static void test_nothing_held(void **state)
{
	struct t *t = *state;
	struct list l = { 0 };
	struct have *h;
	const char *path;
	uint64_t off;

	add_seq(&l, "a", 3, CS, 0, 100);
	add_small(&l, "b", 10, D(200));
	offer(t, CS, &l);

	/* An empty replica_root. */
	assert_int_equal(plan(t, &h, 0, 0), 0);
	assert_null(h);

	/* Copies that hold none of it (and one with the same paths). */
	add_seq(&l, "a", 3, CS, 0, 500);
	add_small(&l, "b", 10, D(201));
	publish(t, "n0/job1/step-19", &l);
	add_small(&l, "x", 5, D(202));
	publish(t, "n1/job1/step-20", &l);
	assert_int_equal(plan(t, &h, 0, 0), 0);
	assert_null(h);

	/* The NULL plan answers like an empty one. */
	assert_int_equal(have_count(NULL), 0);
	assert_int_equal(have_source(NULL, 0, &path, &off), -ENOENT);
	have_free(NULL);
}

/* ------------------------------------------------------------------ */
/* 2. The previous step of the same job                                */

static void test_previous_step(void **state)
{
	struct t *t = *state;
	struct list l = { 0 };
	struct have *h;
	digest_t c2[2] = { D(300), D(301) };

	/* a: 0 1 2, b: 3, c: 4 5, d: 6 (exactly one chunk: one number) */
	add_seq(&l, "a", 3, CS, 0, 100);
	add_small(&l, "b", 10, D(200));
	add_file(&l, "c", CS + 1, CS, D(399), c2);
	add_small(&l, "d", CS, D(400));
	offer(t, CS, &l);

	/* a and c unchanged, b and d changed */
	add_seq(&l, "a", 3, CS, 0, 100);
	add_small(&l, "b", 10, D(201));
	add_file(&l, "c", CS + 1, CS, D(399), c2);
	add_small(&l, "d", CS, D(401));
	publish(t, "n0/job1/step-19", &l);

	assert_int_equal(plan(t, &h, 0, 0), 0);
	{
		const struct want w[] = {
			{ "n0/job1/step-19/a", 0 }, { "n0/job1/step-19/a", CS },
			{ "n0/job1/step-19/a", 2 * CS }, { NULL, 0 },
			{ "n0/job1/step-19/c", 0 }, { "n0/job1/step-19/c", CS }, { NULL, 0 },
		};

		check("previous step", h, 7, w);
		assert_int_equal(have_count(h), 5);
	}
	have_free(h);
}

/* ------------------------------------------------------------------ */
/* 3. Numbering                                                        */

/* Directories, empty files and links get no number; a file of one chunk or
 * less one number keyed by its digest; a larger file one per chunk, and
 * its whole digest is no number. */
static void test_numbering(void **state)
{
	struct t *t = *state;
	struct list l = { 0 };
	struct have *h;
	const digest_t zero = { 0, 0 };
	digest_t big2[2] = { D(601), D(603) };

	add_dir(&l, "a");
	add_file(&l, "a/empty", 0, CS, digest_of("", 0), NULL);
	add_link(&l, "a/link", "target");
	add_small(&l, "a/small", 100, D(500));     /* 0 */
	add_seq(&l, "big", 4, CS, CS - 1, 600);     /* 1 2 3 4: 3 chunks and 1 byte */
	add_small(&l, "z", 1, D(700));              /* 5 */
	offer(t, CS, &l);

	/* A copy with files whose digests are those of the entries without
	 * data, and of the big file as a whole: numbering any of them would
	 * shift the numbers, or hold a chunk that is not one. */
	add_small(&l, "h/dirzero", 1, zero);
	add_small(&l, "h/empty", 1, digest_of("", 0));
	add_small(&l, "h/link", 1, digest_of("target", 6));
	add_small(&l, "h/bigwhole", 1, D(600 | 1ull << 62));
	add_small(&l, "h/small", 100, D(500));
	add_file(&l, "h/big", 2 * CS, CS, D(9), big2);
	add_small(&l, "h/z", 7, D(700));
	publish(t, "n0/job1/step-1", &l);

	assert_int_equal(plan(t, &h, 0, 0), 0);
	{
		const struct want w[] = {
			{ "n0/job1/step-1/h/small", 0 }, { NULL, 0 },
			{ "n0/job1/step-1/h/big", 0 }, { NULL, 0 },
			{ "n0/job1/step-1/h/big", CS }, { "n0/job1/step-1/h/z", 0 },
		};

		check("numbering", h, 6, w);
		assert_int_equal(have_count(h), 4);
	}
	have_free(h);
}

/* ------------------------------------------------------------------ */
/* 4. The resume point                                                 */

static void test_resume_point(void **state)
{
	struct t *t = *state;
	/* entries: 0 "a" (dir), 1 "a/x" (chunks 0 1), 2 "b" (50 bytes: 2),
	 * 3 "c" (4 chunks and 10 bytes: 3 4 5 6 7), 4 "d" (5 bytes: 8) */
	static const struct {
		uint64_t idx, off, first;           /* first: the first chunk planned, 9: none */
	} cases[] = {
		{ 0, 0, 0 }, { 0, 123456789, 0 }, { 1, 0, 0 }, { 1, CS - 1, 0 }, { 1, CS, 1 },
		{ 1, 2 * CS, 2 }, { 2, 0, 2 }, { 2, 49, 2 }, { 2, 50, 3 }, { 3, 0, 3 },
		{ 3, 2 * CS - 1, 4 }, { 3, 2 * CS, 5 }, { 3, 2 * CS + 1, 5 }, { 3, 4 * CS, 7 },
		{ 3, 4 * CS + 9, 7 }, { 3, 4 * CS + 10, 8 }, { 4, 4, 8 }, { 4, 5, 9 },
		{ 5, 0, 9 }, { UINT64_MAX, 0, 9 },
	};
	const char *paths[9] = { "a/x", "a/x", "b", "c", "c", "c", "c", "c", "d" };
	const uint64_t offs[9] = { 0, CS, 0, 0, CS, 2 * CS, 3 * CS, 4 * CS, 0 };
	char full[9][64];
	struct list l = { 0 };

	for (int copy = 0; copy < 2; copy++) {
		add_dir(&l, "a");
		add_seq(&l, "a/x", 2, CS, 0, 10);
		add_small(&l, "b", 50, D(20));
		add_seq(&l, "c", 5, CS, CS - 10, 30);
		add_small(&l, "d", 5, D(40));
		if (copy)
			publish(t, "n0/job1/step-19", &l);    /* holds all of it */
		else
			offer(t, CS, &l);
	}
	for (int n = 0; n < 9; n++)
		snprintf(full[n], sizeof(full[n]), "n0/job1/step-19/%s", paths[n]);

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct want w[9];
		struct have *h;
		char what[64];

		snprintf(what, sizeof(what), "resume at entry %llu byte %llu",
			 (unsigned long long)cases[i].idx, (unsigned long long)cases[i].off);
		for (uint64_t n = 0; n < 9; n++)
			w[n] = n >= cases[i].first ? (struct want){ full[n], offs[n] }
						  : (struct want){ NULL, 0 };
		assert_int_equal(plan(t, &h, cases[i].idx, cases[i].off), 0);
		if (cases[i].first == 9) {
			if (h)
				fail_msg("%s: a plan, with nothing planned", what);
			continue;
		}
		check(what, h, 9, w);
		assert_int_equal(have_count(h), 9 - cases[i].first);
		have_free(h);
	}
}

/* ------------------------------------------------------------------ */
/* 5. Many chunks                                                      */

#define MANY 6000u

static void test_many_chunks(void **state)
{
	struct t *t = *state;
	struct list l = { 0 };
	struct have *h;
	struct want *w = calloc(MANY + 1, sizeof(*w));
	digest_t *half = calloc(MANY / 2, sizeof(*half));

	assert_non_null(w);
	assert_non_null(half);
	add_seq(&l, "big", MANY, CS, 7, 1000000);   /* 0 .. 5999 */
	add_small(&l, "tail", 3, D(77));            /* 6000 */
	offer(t, CS, &l);

	/* The even chunks, in order, in a copy's file; the odd ones nowhere. */
	for (uint64_t j = 0; j < MANY / 2; j++)
		half[j] = D(1000000 + 2 * j);
	add_file(&l, "half", (uint64_t)MANY / 2 * CS, CS, D(5), half);
	add_small(&l, "t", 3, D(77));
	publish(t, "n0/job1/step-19", &l);

	for (uint64_t n = 0; n < MANY; n += 2)
		w[n] = (struct want){ "n0/job1/step-19/half", n / 2 * CS };
	w[MANY] = (struct want){ "n0/job1/step-19/t", 0 };

	assert_int_equal(plan(t, &h, 0, 0), 0);
	check("from the start", h, MANY + 1, w);
	assert_int_equal(have_count(h), MANY / 2 + 1);
	have_free(h);

	/* From the middle of the big file: the same, less what comes before. */
	for (uint64_t n = 0; n < 4000; n++)
		w[n] = (struct want){ NULL, 0 };
	assert_int_equal(plan(t, &h, 0, 4000ull * CS), 0);
	check("from chunk 4000", h, MANY + 1, w);
	assert_int_equal(have_count(h), 1000 + 1);
	have_free(h);
	free(half);
	free(w);
}

/* ------------------------------------------------------------------ */
/* 6. Equal digests within the offer                                   */

static void test_duplicates(void **state)
{
	struct t *t = *state;
	struct list l = { 0 };
	struct have *h;
	const digest_t X = D(1), Y = D(2), Z = D(3);
	const digest_t four[4] = { X, Y, X, Z };
	const char *src = "n0/job1/step-19/h";

	add_file(&l, "a", 4 * CS, CS, D(9), four);   /* 0 1 2 3 */
	add_small(&l, "b", 9, X);                      /* 4 */
	offer(t, CS, &l);
	add_small(&l, "h", 3, X);
	publish(t, "n0/job1/step-19", &l);

	assert_int_equal(plan(t, &h, 0, 0), 0);
	{
		const struct want w[] = {
			{ src, 0 }, { NULL, 0 }, { src, 0 }, { NULL, 0 }, { src, 0 },
		};

		check("from the start", h, 5, w);
	}
	have_free(h);

	/* Resuming after chunk 0: its twins are still planned, it is not. */
	assert_int_equal(plan(t, &h, 0, CS), 0);
	{
		const struct want w[] = {
			{ NULL, 0 }, { NULL, 0 }, { src, 0 }, { NULL, 0 }, { src, 0 },
		};

		check("after chunk 0", h, 5, w);
	}
	have_free(h);

	/* And resuming at b: only b. */
	assert_int_equal(plan(t, &h, 1, 0), 0);
	{
		const struct want w[] = {
			{ NULL, 0 }, { NULL, 0 }, { NULL, 0 }, { NULL, 0 }, { src, 0 },
		};

		check("from b", h, 5, w);
	}
	have_free(h);
}

/* ------------------------------------------------------------------ */
/* 7. Copies hashed with other chunk sizes                             */

static void test_other_chunk_size(void **state)
{
	struct t *t = *state;
	struct list l = { 0 };
	struct have *h;
	const digest_t q[2] = { D(999), D(72) };

	add_seq(&l, "a", 3, CS, 0, 70);             /* 0 1 2: D(70) D(71) D(72) */
	offer(t, CS, &l);

	/* 1 MiB chunks: a file of one chunk whose digest is chunk 1's. */
	add_small(&l, "p", CS, D(71));
	publish_cs(t, "n0/job1/step-1", 1u << 20, &l, true);
	/* 8 KiB chunks: chunk 1 of q is chunk 2 of a, at byte 8192. */
	add_file(&l, "q", 4 * CS, 2 * CS, D(998), q);
	publish_cs(t, "n0/job1/step-2", 2 * CS, &l, true);

	assert_int_equal(plan(t, &h, 0, 0), 0);
	{
		const struct want w[] = {
			{ NULL, 0 }, { "n0/job1/step-1/p", 0 }, { "n0/job1/step-2/q", 2 * CS },
		};

		check("chunk sizes", h, 3, w);
	}
	have_free(h);
}

/* ------------------------------------------------------------------ */
/* 8. Which copy is the source                                         */

static void test_source_order(void **state)
{
	struct t *t = *state;
	struct list l = { 0 };
	struct have *h;
	const digest_t X = D(1), Y = D(2), Z = D(3), W = D(4), V = D(5);
	const digest_t five[5] = { X, Y, Z, W, V };
	static const char *const nm[] = { "x", "y", "z", "w", "v" };

	add_file(&l, "f", 5 * CS, CS, D(9), five);
	offer(t, CS, &l);

	/* The same job, natural order: step-10 is newer than step-9 (and than
	 * step-8), though "step-9" > "step-10" byte by byte. */
	publish_digests(t, "n0/job1/step-9", (const char *const[]){ "x", "v" },
			(const digest_t[]){ X, V }, 2);
	publish_digests(t, "n0/job1/step-10", nm, (const digest_t[]){ X }, 1);
	publish_digests(t, "n0/job1/step-8", nm, (const digest_t[]){ X, Y, Z, W, V }, 5);
	/* Another job of the same origin, sorting after job1 in either order. */
	publish_digests(t, "n0/job2/step-99", nm, (const digest_t[]){ X, Y }, 2);
	/* Another origin, sorting after n0, with newer step names. */
	publish_digests(t, "n1/job1/step-100", nm, five, 5);
	publish_digests(t, "n1/job1/step-2", nm, five, 5);
	publish_digests(t, "n1/job1/step-99", (const char *const[]){ "w" },
			(const digest_t[]){ W }, 1);

	assert_int_equal(plan(t, &h, 0, 0), 0);
	{
		const struct want w[] = {
			{ "n0/job1/step-10/x", 0 },
			{ "n0/job1/step-8/y", 0 },
			{ "n0/job1/step-8/z", 0 },
			{ "n0/job1/step-8/w", 0 },
			{ "n0/job1/step-9/v", 0 },
		};

		check("with n0/job1", h, 5, w);
	}
	have_free(h);

	/* Without n0/job1: n0's other job first, then the other origin,
	 * newest step first. */
	{
		char p[PATH_MAX];

		snprintf(p, sizeof(p), "%s/rr/n0/job1", t->dir);
		assert_int_equal(rm_tree(p), 0);
	}
	assert_int_equal(plan(t, &h, 0, 0), 0);
	{
		const struct want w[] = {
			{ "n0/job2/step-99/x", 0 },
			{ "n0/job2/step-99/y", 0 },
			{ "n1/job1/step-100/z", 0 },
			{ "n1/job1/step-100/w", 0 },
			{ "n1/job1/step-100/v", 0 },
		};

		check("without n0/job1", h, 5, w);
	}
	have_free(h);
}

/* ------------------------------------------------------------------ */
/* 9. Damaged copies                                                   */

static void put_at(struct t *t, const char *rel, const void *p, size_t n)
{
	int fd = openat(t->rr_fd, rel, O_WRONLY | O_CREAT | O_TRUNC, 0644);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, p, n), (ssize_t)n);
	close(fd);
}

static void truncate_at(struct t *t, const char *rel, off_t size)
{
	int fd = openat(t->rr_fd, rel, O_WRONLY);

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, size), 0);
	close(fd);
}

/* Cuts rel right after the line where `needle` first occurs. */
static void cut_after_line(struct t *t, const char *rel, const char *needle)
{
	char buf[65536], *p, *nl;
	int fd = openat(t->rr_fd, rel, O_RDONLY);
	ssize_t n;

	assert_true(fd >= 0);
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	assert_true(n > 0);
	buf[n] = '\0';
	p = strstr(buf, needle);
	assert_non_null(p);
	nl = strchr(p + 1, '\n');
	assert_non_null(nl);
	truncate_at(t, rel, nl + 1 - buf);
}

static void test_damaged_copies(void **state)
{
	struct t *t = *state;
	struct list l = { 0 };
	struct have *h;
	const digest_t X = D(1), Y = D(2), Z = D(3), U = D(4);
	const digest_t four[4] = { X, Y, Z, U };
	int fd;

	add_file(&l, "f", 4 * CS, CS, D(9), four);
	offer(t, CS, &l);

	/* step-11, the oldest, is intact: X, Y and Z. */
	publish_digests(t, "n0/job1/step-11", (const char *const[]){ "x", "y", "z" },
			(const digest_t[]){ X, Y, Z }, 3);
	/* step-12: X in a file whose chunk lines are cut short. */
	add_small(&l, "a", 1, D(50));
	add_file(&l, "m", 3 * CS, CS, D(51), (const digest_t[]){ D(52), X, D(53) });
	publish(t, "n0/job1/step-12", &l);
	cut_after_line(t, "n0/job1/step-12/.stage/manifest", "\nc ");
	/* step-13: no trailer (test_no_trailer_vouches_for_nothing). */
	add_small(&l, "other", 1, D(61));
	publish_cs(t, "n0/job1/step-13", CS, &l, false);
	/* step-14: not a manifest. */
	fd = stage_dir(t, "n0/job1/step-14");
	close(fd);
	put_at(t, "n0/job1/step-14/.stage/manifest", "hello\n", 6);
	/* step-15: X and Z, cut inside the header. */
	publish_digests(t, "n0/job1/step-15", (const char *const[]){ "x", "z" },
			(const digest_t[]){ X, Z }, 2);
	truncate_at(t, "n0/job1/step-15/.stage/manifest", 10);
	/* step-16: the manifest is a directory. */
	mkdirs(t, "n0/job1/step-16/.stage/manifest");
	/* step-17: no .stage; step-18: an empty manifest; step-19: a file. */
	mkdirs(t, "n0/job1/step-17");
	fd = stage_dir(t, "n0/job1/step-18");
	close(fd);
	put_at(t, "n0/job1/step-18/.stage/manifest", "", 0);
	put_at(t, "n0/job1/step-19", "x", 1);
	/* step-21: X, and an edited byte in the header. */
	publish_digests(t, "n0/job1/step-21", (const char *const[]){ "x" },
			(const digest_t[]){ X }, 1);
	{
		int mfd = openat(t->rr_fd, "n0/job1/step-21/.stage/manifest", O_WRONLY);

		assert_true(mfd >= 0);
		assert_int_equal(pwrite(mfd, "8", 1, 3), 1);    /* "stage-manifest" -> "sta8e..." */
		close(mfd);
	}

	assert_int_equal(plan(t, &h, 0, 0), 0);
	{
		const struct want w[] = {
			{ "n0/job1/step-11/x", 0 },
			{ "n0/job1/step-11/y", 0 },
			{ "n0/job1/step-11/z", 0 },
			{ NULL, 0 },
		};

		check("damaged", h, 4, w);
	}
	have_free(h);

	/* A damaged or missing offer is an error, and no plan. */
	add_small(&l, "b", 1, X);
	write_mf(t->st_fd, "offer", CS, &l, false);
	h = (struct have *)&h;
	assert_true(have_plan(&h, t->rr_fd, t->st_fd, "offer", ORIGIN, JOB, 0, 0) < 0);
	assert_null(h);
	h = (struct have *)&h;
	assert_int_equal(have_plan(&h, t->rr_fd, t->st_fd, "nothing", ORIGIN, JOB, 0, 0),
			 -ENOENT);
	assert_null(h);
}

/* A manifest is complete only with its trailer: the lines of one without
 * it give no source (docs/PROTOCOL.md, K_HELD: "complete copies"), even
 * when they are the only place a chunk is found. */
static void test_no_trailer_vouches_for_nothing(void **state)
{
	struct t *t = *state;
	struct list l = { 0 }, c = { 0 };
	struct have *h;
	const char *path;
	uint64_t off;

	add_file(&l, "f", 4 * CS, CS, D(9), (const digest_t[]){ D(1), D(2), D(3), D(4) });
	offer(t, CS, &l);
	add_small(&c, "u", 1, D(4));
	add_small(&c, "v", 1, D(77));
	publish_cs(t, "n0/job1/step-13", CS, &c, false);
	assert_int_equal(plan(t, &h, 0, 0), 0);
	assert_null(h);
	add_small(&c, "u", 1, D(4));            /* written lists are freed */
	add_small(&c, "v", 1, D(77));
	publish(t, "n0/job1/step-12", &c);
	assert_int_equal(plan(t, &h, 0, 0), 0);
	assert_non_null(h);
	assert_int_equal(have_count(h), 1);
	assert_int_equal(have_source(h, 3, &path, &off), 0);
	assert_string_equal(path, "n0/job1/step-12/u");
	assert_int_equal(have_source(h, 2, &path, &off), -ENOENT);
	have_free(h);
}

/* ------------------------------------------------------------------ */
/* 10. Hidden names                                                    */

static void test_hidden_names(void **state)
{
	struct t *t = *state;
	struct list l = { 0 };
	struct have *h;
	const digest_t X = D(1);
	static const char *const x[] = { "x" };
	char p[PATH_MAX];

	add_small(&l, "f", 100, X);
	offer(t, CS, &l);

	/* Names a node, job or step cannot have, at each level. */
	publish_digests(t, ".incoming/n0/job1/step-5", x, &X, 1);
	publish_digests(t, ".n0/job1/step-5", x, &X, 1);
	publish_digests(t, "n0/.job1/step-5", x, &X, 1);
	publish_digests(t, "n0/.hidden/step-5", x, &X, 1);
	publish_digests(t, "n0/job1/.step-6", x, &X, 1);
	publish_digests(t, "n0/job1/.tmp", x, &X, 1);
	publish_digests(t, "n0/job2/-step-6", x, &X, 1);
	publish_digests(t, "n1/job1/.step-7", x, &X, 1);
	publish_digests(t, "n1/.job1/step-7", x, &X, 1);
	/* A symbolic link out of replica_root, as an origin and as a step. */
	{
		int top = open(t->dir, O_RDONLY | O_DIRECTORY), fd;

		assert_true(top >= 0);
		mkdirs_in(top, "outside/job1/step-1/" MF_DIRNAME);
		fd = openat(top, "outside/job1/step-1/" MF_DIRNAME, O_RDONLY | O_DIRECTORY);
		close(top);
		assert_true(fd >= 0);
		add_small(&l, "x", 1, X);
		write_mf(fd, "manifest", CS, &l, true);
		close(fd);
	}
	snprintf(p, sizeof(p), "%s/outside", t->dir);
	assert_int_equal(symlinkat(p, t->rr_fd, "n5"), 0);
	snprintf(p, sizeof(p), "%s/outside/job1/step-1", t->dir);
	assert_int_equal(symlinkat(p, t->rr_fd, "n0/job1/step-9"), 0);

	assert_int_equal(plan(t, &h, 0, 0), 0);
	assert_null(h);

	/* A copy with a proper name is found (the search reaches that far). */
	publish_digests(t, "n2/job1/step-1", x, &X, 1);
	assert_int_equal(plan(t, &h, 0, 0), 0);
	{
		const struct want w[] = { { "n2/job1/step-1/x", 0 } };

		check("proper name", h, 1, w);
	}
	have_free(h);
}

/* ------------------------------------------------------------------ */
/* Limits                                                              */

/* At most HAVE_MAX_COPIES copies are looked at, newest first. */
static void test_max_copies(void **state)
{
	struct t *t = *state;
	struct list l = { 0 };
	struct have *h;
	const digest_t X = D(1);
	static const char *const x[] = { "x" };
	char copy[64], p[PATH_MAX];

	add_small(&l, "f", 100, X);
	offer(t, CS, &l);
	for (unsigned s = 1; s <= HAVE_MAX_COPIES + 1; s++) {
		const digest_t other = D(1000 + s);

		snprintf(copy, sizeof(copy), "n0/job1/step-%u", s);
		publish_digests(t, copy, x, s == 1 ? &X : &other, 1);
	}
	/* step-1 is the 129th newest: not looked at. */
	assert_int_equal(plan(t, &h, 0, 0), 0);
	assert_null(h);

	/* Without the newest, it is the 128th. */
	snprintf(p, sizeof(p), "%s/rr/n0/job1/step-%u", t->dir, HAVE_MAX_COPIES + 1);
	assert_int_equal(rm_tree(p), 0);
	assert_int_equal(plan(t, &h, 0, 0), 0);
	{
		const struct want w[] = { { "n0/job1/step-1/x", 0 } };

		check("128 copies", h, 1, w);
	}
	have_free(h);
}

/* Chunks past HAVE_MAX_CHUNKS have no number: they are sent. */
static void test_max_chunks(void **state)
{
	struct t *t = *state;
	struct list l = { 0 };
	struct have *h;
	const uint64_t M = HAVE_MAX_CHUNKS;
	const digest_t held[5] = { D(0), D(1), D(M - 1), D(M), D(M + 4) };
	struct want *w = calloc(M, sizeof(*w));

	assert_non_null(w);
	add_seq(&l, "big", M + 5, CS, 0, 0);       /* chunk k: D(k) */
	add_small(&l, "tail", 1, D(1ull << 40));
	offer(t, CS, &l);
	add_file(&l, "h", 5 * CS, CS, D(7ull << 50), held);
	add_small(&l, "t", 1, D(1ull << 40));
	publish(t, "n0/job1/step-1", &l);

	w[0] = (struct want){ "n0/job1/step-1/h", 0 };
	w[1] = (struct want){ "n0/job1/step-1/h", CS };
	w[M - 1] = (struct want){ "n0/job1/step-1/h", 2 * CS };
	assert_int_equal(plan(t, &h, 0, 0), 0);
	check("max chunks", h, M, w);
	assert_int_equal(have_count(h), 3);
	have_free(h);
	free(w);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_nothing_held, setup, teardown),
		cmocka_unit_test_setup_teardown(test_previous_step, setup, teardown),
		cmocka_unit_test_setup_teardown(test_numbering, setup, teardown),
		cmocka_unit_test_setup_teardown(test_resume_point, setup, teardown),
		cmocka_unit_test_setup_teardown(test_many_chunks, setup, teardown),
		cmocka_unit_test_setup_teardown(test_duplicates, setup, teardown),
		cmocka_unit_test_setup_teardown(test_other_chunk_size, setup, teardown),
		cmocka_unit_test_setup_teardown(test_source_order, setup, teardown),
		cmocka_unit_test_setup_teardown(test_damaged_copies, setup, teardown),
		cmocka_unit_test_setup_teardown(test_no_trailer_vouches_for_nothing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_hidden_names, setup, teardown),
		cmocka_unit_test_setup_teardown(test_max_copies, setup, teardown),
		cmocka_unit_test_setup_teardown(test_max_chunks, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
