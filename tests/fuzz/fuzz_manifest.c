/* libFuzzer target for the manifest reader: any bytes, read in both modes.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -I. \
 *       common/digest.c common/manifest.c common/mf_read.c tests/fuzz/fuzz_manifest.c \
 *       -lxxhash -o fuzz_manifest
 *   ./fuzz_manifest tests/fuzz/corpus/manifest
 *
 * Besides the sanitizers, it checks what the format promises:
 *  - the two modes return the same entries up to where either stops; MF_COMPLETE
 *    accepts nothing MF_PARTIAL rejects, and rejects what MF_PARTIAL accepts
 *    only as "truncated";
 *  - every error names the label and a line;
 *  - every entry the reader returns, the writer accepts, and it writes the
 *    very bytes it was read from (digests may have come in upper case), which
 *    read back to the same entries and root.
 * Files go to a directory under /dev/shm, so the writer's fsync costs nothing.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/manifest.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int dfd = -1;                 /* a directory of our own for the writer */
static char dir[] = "/dev/shm/fuzz_manifest.XXXXXX";

struct out {
	int rc;
	struct mf_entry *e;
	size_t n, cap;
	uint64_t count, chunk_size;
	digest_t root;
	bool truncated;       /* the error says so */
};

static void out_free(struct out *o)
{
	for (size_t i = 0; i < o->n; i++)
		mf_entry_free(&o->e[i]);
	free(o->e);
}

static void collect(struct mf_reader *r, struct out *o)
{
	struct mf_entry e;

	memset(o, 0, sizeof(*o));
	o->chunk_size = mf_reader_chunk_size(r);
	while ((o->rc = mf_reader_next(r, &e)) == 1) {
		if (o->n == o->cap) {
			o->cap = o->cap ? 2 * o->cap : 16;
			o->e = realloc(o->e, o->cap * sizeof(*o->e));
			if (!o->e)
				abort();
		}
		o->e[o->n++] = e;
	}
	if (mf_reader_next(r, &e) != o->rc)
		abort();
	if (o->rc) {
		const char *why = mf_reader_why(r);
		size_t i = 5;

		if (strncmp(why, "fuzz:", 5) || why[i] < '0' || why[i] > '9')
			abort();
		while (why[i] >= '0' && why[i] <= '9')
			i++;
		if (strncmp(why + i, ": ", 2))
			abort();
		o->truncated = !strncmp(why + i, ": truncated", 11);
	}
	o->count = mf_reader_count(r);
	o->root = mf_reader_root(r);
}

static void read_mem(const uint8_t *data, size_t size, enum mf_read_mode mode, struct out *o)
{
	FILE *fp = fmemopen((void *)data, size, "r");
	struct mf_reader *r;

	if (!fp || mf_reader_open_fp(&r, fp, "fuzz", mode))
		abort();
	collect(r, o);
	mf_reader_close(r);
	fclose(fp);
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

static void same_entries(const struct out *a, const struct out *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!entry_eq(&a->e[i], &b->e[i]))
			abort();
}

/* Written byte w stands for input byte i: equal, or a digest's hex digit in
 * the other case. */
static bool same_byte(uint8_t i, char w)
{
	return i == (uint8_t)w || (w >= 'a' && w <= 'f' && i == (uint8_t)(w - 'a' + 'A'));
}

/* Write the entries back and compare with the input. */
static void rewrite(const uint8_t *data, size_t size, const struct out *p, const struct out *c)
{
	static char text[1 << 21];
	struct mf_writer *w;
	struct out back;
	digest_t root;
	ssize_t n;
	size_t body;
	int fd;

	if (mf_writer_open(&w, dfd, "rt", p->chunk_size))
		abort();
	for (size_t i = 0; i < p->n; i++)
		if (mf_writer_add(w, &p->e[i]))
			abort();
	if (mf_writer_finish(w, &root))
		abort();
	if (p->rc == 0 && (p->n != p->count || !digest_eq(root, p->root)))
		abort();

	fd = openat(dfd, "rt", O_RDONLY);
	n = read(fd, text, sizeof(text));
	close(fd);
	if (n <= 0 || (size_t)n == sizeof(text))
		abort();
	body = (size_t)((char *)memrchr(text, '\n', (size_t)n - 1) + 1 - text);   /* before "end" */
	if (body > size)
		abort();
	for (size_t i = 0; i < body; i++)
		if (!same_byte(data[i], text[i]))
			abort();
	/* A complete input is the very same file, its trailer included. */
	if (c->rc == 0 && (size_t)n != size)
		abort();
	for (size_t i = body; c->rc == 0 && i < size; i++)
		if (!same_byte(data[i], text[i]))
			abort();

	struct mf_reader *r;

	if (mf_reader_open(&r, dfd, "rt", MF_COMPLETE))
		abort();
	collect(r, &back);
	mf_reader_close(r);
	if (back.rc || back.n != p->n || !digest_eq(back.root, root))
		abort();
	same_entries(&back, p, p->n);
	out_free(&back);
}

static void remove_dir(void)
{
	unlinkat(dfd, "rt", 0);
	close(dfd);
	rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	if (!mkdtemp(dir)) {
		strcpy(dir, "/tmp/fuzz_manifest.XXXXXX");
		if (!mkdtemp(dir))
			abort();
	}
	dfd = open(dir, O_RDONLY | O_DIRECTORY);
	if (dfd < 0)
		abort();
	atexit(remove_dir);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct out c, p;

	read_mem(data, size, MF_COMPLETE, &c);
	read_mem(data, size, MF_PARTIAL, &p);

	if (c.rc == 1 || p.rc == 1 || c.n > p.n || c.chunk_size != p.chunk_size)
		abort();
	same_entries(&c, &p, c.n);
	if (c.rc == 0 && (p.rc || p.n != c.n || p.count != c.count || !digest_eq(p.root, c.root)))
		abort();
	if (p.rc && (c.rc != p.rc || c.n != p.n))
		abort();
	if (p.rc == 0 && c.rc && !c.truncated)
		abort();
	if (p.rc == 0 && p.count != p.n)
		abort();
	if (p.chunk_size)
		rewrite(data, size, &p, &c);
	out_free(&c);
	out_free(&p);
	return 0;
}
