/* Shared by the manifest's unit tests (test_manifest.c, test_mf_read.c):
 * a temporary directory, entry lists, and writing and reading manifests
 * through real files. Static inline so each test binary takes what it uses. */
#ifndef STAGE_MF_FIXTURE_H
#define STAGE_MF_FIXTURE_H

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

static inline void list_push(struct list *l, const struct mf_entry *e)
{
	if (l->n == l->cap) {
		l->cap = l->cap ? 2 * l->cap : 16;
		l->e = realloc(l->e, l->cap * sizeof(*l->e));
		assert_non_null(l->e);
	}
	l->e[l->n++] = *e;    /* takes ownership */
}

static inline void list_free(struct list *l)
{
	for (size_t i = 0; i < l->n; i++)
		mf_entry_free(&l->e[i]);
	free(l->e);
	memset(l, 0, sizeof(*l));
}

static inline int cmp_entry(const void *a, const void *b)
{
	return mf_path_cmp(((const struct mf_entry *)a)->path, ((const struct mf_entry *)b)->path);
}

static inline void add_dir(struct list *l, const char *path)
{
	struct mf_entry e = { .type = MF_DIR, .path = strdup(path), .mode = 0755, .mtime_ns = 1 };

	list_push(l, &e);
}

/* Digests are made up from the seed: the manifest does not read content. */
static inline void add_file(struct list *l, const char *path, uint64_t size, unsigned seed)
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

static inline void add_link(struct list *l, const char *path, const char *target)
{
	struct mf_entry e = { .type = MF_LINK, .path = strdup(path), .size = strlen(target),
			      .mode = 0777, .mtime_ns = -5, .target = strdup(target) };

	e.digest = digest_of(target, strlen(target));
	list_push(l, &e);
}

static inline bool entry_eq(const struct mf_entry *a, const struct mf_entry *b)
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

static inline digest_t root_of(const struct list *l, size_t n)
{
	struct mf_root r;

	assert_int_equal(mf_root_init(&r), 0);
	for (size_t i = 0; i < n; i++)
		mf_root_add(&r, &l->e[i]);
	return mf_root_final(&r);
}

static inline int write_list(const char *name, const struct list *l, digest_t *root)
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

static inline void read_reader(struct mf_reader *r, struct result *res)
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

static inline void read_file(const char *name, enum mf_read_mode mode, struct result *res)
{
	struct mf_reader *r;

	assert_int_equal(mf_reader_open(&r, dfd, name, mode), 0);
	read_reader(r, res);
}

static inline void read_mem(const char *text, size_t n, enum mf_read_mode mode, struct result *res)
{
	struct mf_reader *r;
	FILE *fp = fmemopen((void *)text, n, "r");

	assert_non_null(fp);
	assert_int_equal(mf_reader_open_fp(&r, fp, "mem", mode), 0);
	read_reader(r, res);
	fclose(fp);
}

static inline void put_file(const char *name, const void *p, size_t n)
{
	int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_TRUNC, 0644);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, p, n), (ssize_t)n);
	close(fd);
}

static inline char *get_file(const char *name, size_t *n)
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
static inline void assert_why(const char *why, const char *label, const char *what)
{
	size_t n = strlen(label), i = n + 1;

	if (strncmp(why, label, n) || why[n] != ':' || why[i] < '1' || why[i] > '9')
		fail_msg("message \"%s\" does not start with \"%s:LINE:\"", why, label);
	while (why[i] >= '0' && why[i] <= '9')
		i++;
	if (why[i] != ':' || !strstr(why, what))
		fail_msg("message \"%s\" does not say \"%s\"", why, what);
}

static inline void assert_lists_eq(const struct list *a, const struct list *b, size_t n)
{
	assert_true(a->n >= n && b->n >= n);
	for (size_t i = 0; i < n; i++)
		if (!entry_eq(&a->e[i], &b->e[i]))
			fail_msg("entry %zu (%s) differs", i, a->e[i].path);
}

/* A tree with every kind of awkward name, in component order. */
static inline void make_tree(struct list *l)
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

/* Setup */

static inline int remove_all(void)
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

static inline int group_setup(void **state)
{
	if (!mkdtemp(dpath))
		return -1;
	dfd = open(dpath, O_RDONLY | O_DIRECTORY);
	return dfd < 0 ? -1 : 0;
}

static inline int group_teardown(void **state)
{
	remove_all();
	close(dfd);
	return rmdir(dpath);
}


#endif
