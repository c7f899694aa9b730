/* The chunks of an offer that the receiver already holds (repl_have.h).
 *
 * Two passes over manifests, nothing else read. First the offer: each chunk
 * to come gets a number and a slot in an open-addressing table keyed by its
 * digest (chunks with equal digests share a slot). Then the candidate
 * copies, most likely first, each streamed once: a chunk whose digest has a
 * slot without a source gives it one (a path and an offset). It stops when
 * every slot has a source or the candidates run out.
 */
#include "daemon/repl/repl_have.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/config.h"
#include "common/manifest.h"
#include "daemon/ckpt/ckpt.h"
#include "daemon/fs/treeops.h"

#define NONE UINT32_MAX
#define NAMES_MAX 4096                 /* entries of one directory looked at */

struct hslot {                         /* digest -> distinct chunk */
	digest_t d;
	uint32_t id;
	bool used;
};

struct source {                        /* where a distinct chunk is held */
	uint64_t off;                      /* the chunk's first byte in the file */
	uint32_t path;                     /* index in paths, NONE: not found yet */
};

struct have {
	uint32_t *id_of;                   /* chunk number -> distinct id, NONE: not planned */
	uint64_t nnum, cap_num;
	struct hslot *tab;                 /* open addressing, at most half full */
	uint64_t mask;
	struct source *src;                /* by distinct id */
	uint64_t nids, cap_ids, unsourced;
	char **paths;
	size_t npaths, cap_paths;
	uint8_t *bits;
	size_t nbits_bytes;
	uint64_t held;
	unsigned dry;      /* copies in a row that gave nothing */
	uint64_t seed;     /* the offer's digests are the sender's word: hashed
			    * again with a secret seed, a peer cannot line them
			    * up in one probe chain */
};

/* ---- the table ---- */

static struct hslot *lookup(const struct have *h, digest_t d)
{
	for (uint64_t i = XXH3_64bits_withSeed(&d, sizeof(d), h->seed) & h->mask;;
	     i = (i + 1) & h->mask)
		if (!h->tab[i].used || digest_eq(h->tab[i].d, d))
			return &h->tab[i];
}

static int grow_table(struct have *h)
{
	struct hslot *old = h->tab;
	uint64_t n = old ? (h->mask + 1) * 2 : 1024;

	h->tab = calloc(n, sizeof(*h->tab));
	if (!h->tab) {
		h->tab = old;
		return -ENOMEM;
	}
	h->mask = n - 1;
	for (uint64_t i = 0; old && i < n / 2; i++)
		if (old[i].used)
			*lookup(h, old[i].d) = old[i];
	free(old);
	return 0;
}

static int grow(void **v, uint64_t *cap, size_t size)
{
	uint64_t n = *cap ? *cap * 2 : 1024;
	void *p = realloc(*v, n * size);

	if (!p)
		return -ENOMEM;
	*v = p;
	*cap = n;
	return 0;
}

/* Numbers the next chunk: planned (its digest gets a distinct id, shared
 * with equal chunks) or not. */
static int add_chunk(struct have *h, bool planned, digest_t d)
{
	uint32_t id = NONE;

	if (h->nnum == h->cap_num && grow((void **)&h->id_of, &h->cap_num, sizeof(*h->id_of)))
		return -ENOMEM;
	if (planned) {
		struct hslot *s;

		if ((h->nids + 1) * 2 > h->mask + 1 && grow_table(h) < 0)
			return -ENOMEM;
		s = lookup(h, d);
		if (!s->used) {
			if (h->nids == h->cap_ids &&
			    grow((void **)&h->src, &h->cap_ids, sizeof(*h->src)))
				return -ENOMEM;
			s->used = true;
			s->d = d;
			s->id = (uint32_t)h->nids++;
			h->src[s->id].path = NONE;
			h->unsourced++;
		}
		id = s->id;
	}
	h->id_of[h->nnum++] = id;
	return 0;
}

static bool chunk_ends_after(const struct mf_entry *e, uint64_t k, uint64_t cs, uint64_t off)
{
	uint64_t end = e->nchunks ? (k + 1) * cs : e->size;

	return (end < e->size ? end : e->size) > off;
}

/* Pass one: number the offer's chunks, plan those after the resume point. */
static int number_offer(struct have *h, int st_fd, const char *name, uint64_t from_idx,
			uint64_t from_off)
{
	struct mf_reader *mr;
	struct mf_entry e;
	uint64_t idx = 0, cs = 0;
	int rc = mf_reader_open(&mr, st_fd, name, MF_COMPLETE);

	if (rc < 0)
		return rc;
	while ((rc = mf_reader_next(mr, &e)) == 1) {
		uint64_t nch = e.nchunks ? e.nchunks : 1;

		cs = mf_reader_chunk_size(mr);
		for (uint64_t k = 0; e.type == MF_FILE && e.size && k < nch; k++) {
			bool planned = idx > from_idx ||
				(idx == from_idx && chunk_ends_after(&e, k, cs, from_off));

			if (h->nnum == HAVE_MAX_CHUNKS)
				break;
			rc = add_chunk(h, planned, e.nchunks ? e.chunks[k] : e.digest);
			if (rc < 0)
				break;
		}
		mf_entry_free(&e);
		idx++;
		if (rc < 0 || h->nnum == HAVE_MAX_CHUNKS)
			break;
	}
	mf_reader_close(mr);
	return rc < 0 ? rc : 0;
}

/* ---- the candidates ---- */

static int path_add(struct have *h, const char *copy, const char *rel)
{
	size_t n = strlen(copy) + strlen(rel) + 2;
	char *p;

	if (h->npaths == h->cap_paths) {
		size_t c = h->cap_paths ? h->cap_paths * 2 : 64;
		char **v = realloc(h->paths, c * sizeof(*v));

		if (!v)
			return -ENOMEM;
		h->paths = v;
		h->cap_paths = c;
	}
	if (h->npaths >= NONE || !(p = malloc(n)))
		return -ENOMEM;
	snprintf(p, n, "%s/%s", copy, rel);
	h->paths[h->npaths] = p;
	return (int)h->npaths++;
}

/* Pass two, one copy: its manifest gives sources to chunks that lack one.
 * A manifest that gave any is read to its end: one that turns out damaged
 * (its trailer is what proves it complete) vouches for nothing, and what it
 * gave is taken back. */
static int scan_copy(struct have *h, int rr_fd, const char *copy)
{
	struct mf_reader *mr;
	struct mf_entry e;
	int dfd = treeops_open_beneath(rr_fd, copy), rc;
	size_t first = h->npaths;

	if (dfd < 0)
		return 0;
	rc = mf_reader_open(&mr, dfd, MF_NAME, MF_COMPLETE);
	close(dfd);
	if (rc < 0)
		return 0;
	while ((rc = mf_reader_next(mr, &e)) == 1) {
		uint64_t nch = e.nchunks ? e.nchunks : 1, cs = mf_reader_chunk_size(mr);
		int pid = -1;

		for (uint64_t k = 0; h->unsourced && e.type == MF_FILE && e.size && k < nch; k++) {
			struct hslot *s = lookup(h, e.nchunks ? e.chunks[k] : e.digest);

			if (!s->used || h->src[s->id].path != NONE)
				continue;
			if (pid < 0 && (pid = path_add(h, copy, e.path)) < 0)
				break;
			h->src[s->id].path = (uint32_t)pid;
			h->src[s->id].off = k * cs;
			h->unsourced--;
		}
		mf_entry_free(&e);
		if (pid == -ENOMEM) {
			mf_reader_close(mr);
			return -ENOMEM;
		}
		if (!h->unsourced && h->npaths == first)
			break;          /* nothing from this one: no need to read on */
	}
	mf_reader_close(mr);
	for (uint64_t i = 0; rc < 0 && i < h->nids; i++)
		if (h->src[i].path != NONE && h->src[i].path >= first) {
			h->src[i].path = NONE;
			h->unsourced++;
		}
	/* Outside the offer's own job, copies that give nothing in a row end
	 * the search: new data is found nowhere, and looking costs a parse. */
	h->dry = rc >= 0 && h->npaths > first ? 0 : h->dry + 1;
	return 0;
}

static int cmp_step_desc(const void *a, const void *b)
{
	return ckpt_step_cmp(*(char *const *)b, *(char *const *)a);
}

static void names_free(char **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

/* Sorts newest step first and keeps the first NAMES_MAX. */
static void names_trim(char **v, size_t *n)
{
	qsort(v, *n, sizeof(*v), cmp_step_desc);
	while (*n > NAMES_MAX)
		free(v[--*n]);
}

/* The names in rr_fd/rel that could be a node, job or step, newest step
 * first, the NAMES_MAX newest of them however many there are; *n of them.
 * NULL when none or unreadable. */
static char **names_of(int rr_fd, const char *rel, size_t *n)
{
	int dfd = treeops_open_beneath(rr_fd, rel);
	char **v = NULL;
	DIR *d;
	struct dirent *de;
	const char *why;

	*n = 0;
	if (dfd < 0)
		return NULL;
	d = fdopendir(dfd);
	if (!d) {
		close(dfd);
		return NULL;
	}
	v = calloc(2 * NAMES_MAX, sizeof(*v));
	while (v && (de = readdir(d))) {
		if (config_check_name(de->d_name, &why) != 0 || !(v[*n] = strdup(de->d_name)))
			continue;
		if (++*n == 2 * NAMES_MAX)
			names_trim(v, n);
	}
	closedir(d);
	if (v)
		names_trim(v, n);
	return v;
}

/* Scans the steps of ORIGIN/JOB (newest first) while budget lasts, and
 * outside the offer's own job (own false) while copies keep giving. */
static int scan_job(struct have *h, int rr_fd, const char *origin, const char *job, bool own,
		    unsigned *budget)
{
	char rel[3 * (CKPT_NAME_MAX + 1)];
	size_t n;
	char **steps;
	int rc = 0;

	snprintf(rel, sizeof(rel), "%s/%s", origin, job);
	steps = names_of(rr_fd, rel, &n);
	for (size_t i = 0; i < n && rc == 0 && h->unsourced && *budget &&
	     (own || h->dry < HAVE_DRY); i++) {
		char copy[4 * (CKPT_NAME_MAX + 1)];

		snprintf(copy, sizeof(copy), "%s/%s", rel, steps[i]);
		(*budget)--;
		rc = scan_copy(h, rr_fd, copy);
	}
	names_free(steps, n);
	return rc;
}

/* Scans ORIGIN's jobs, `first` before the others (and not twice). */
static int scan_origin(struct have *h, int rr_fd, const char *origin, const char *first,
		       unsigned *budget)
{
	size_t n;
	char **jobs;
	int rc = first ? scan_job(h, rr_fd, origin, first, true, budget) : 0;

	h->dry = 0;
	jobs = names_of(rr_fd, origin, &n);
	for (size_t i = 0; i < n && rc == 0 && h->unsourced && *budget && h->dry < HAVE_DRY; i++)
		if (!first || strcmp(jobs[i], first) != 0)
			rc = scan_job(h, rr_fd, origin, jobs[i], false, budget);
	names_free(jobs, n);
	return rc;
}

static void make_bits(struct have *h)
{
	h->nbits_bytes = (size_t)((h->nnum + 7) / 8);
	h->bits = calloc(h->nbits_bytes ? h->nbits_bytes : 1, 1);
	for (uint64_t n = 0; h->bits && n < h->nnum; n++)
		if (h->id_of[n] != NONE && h->src[h->id_of[n]].path != NONE) {
			h->bits[n / 8] |= (uint8_t)(1u << (n % 8));
			h->held++;
		}
}

int have_plan(struct have **out, int rr_fd, int st_fd, const char *name, const char *origin,
	      const char *job, uint64_t from_idx, uint64_t from_off)
{
	struct have *h = calloc(1, sizeof(*h));
	unsigned budget = HAVE_MAX_COPIES;
	size_t n = 0;
	char **origins = NULL;
	int rc;

	*out = NULL;
	if (!h)
		return -ENOMEM;
	if (getrandom(&h->seed, sizeof(h->seed), 0) != sizeof(h->seed))
		h->seed = (uint64_t)(uintptr_t)h ^ (uint64_t)time(NULL);
	rc = grow_table(h);
	if (rc == 0)
		rc = number_offer(h, st_fd, name, from_idx, from_off);
	if (rc == 0 && h->unsourced)
		rc = scan_origin(h, rr_fd, origin, job, &budget);
	if (rc == 0 && h->unsourced)
		origins = names_of(rr_fd, "", &n);
	for (size_t i = 0; i < n && rc == 0 && h->unsourced && budget && h->dry < HAVE_DRY; i++)
		if (strcmp(origins[i], origin) != 0)
			rc = scan_origin(h, rr_fd, origins[i], NULL, &budget);
	names_free(origins, n);
	if (rc == 0) {
		make_bits(h);
		if (!h->bits)
			rc = -ENOMEM;
	}
	if (rc < 0 || h->held == 0) {
		have_free(h);
		return rc;
	}
	*out = h;
	return 0;
}

const uint8_t *have_bits(const struct have *h, size_t *len)
{
	*len = h->nbits_bytes;
	return h->bits;
}

uint64_t have_count(const struct have *h)
{
	return h ? h->held : 0;
}

int have_source(const struct have *h, uint64_t n, const char **path, uint64_t *off)
{
	const struct source *s;

	if (!h || n >= h->nnum || h->id_of[n] == NONE)
		return -ENOENT;
	s = &h->src[h->id_of[n]];
	if (s->path == NONE)
		return -ENOENT;
	*path = h->paths[s->path];
	*off = s->off;
	return 0;
}

void have_free(struct have *h)
{
	if (!h)
		return;
	for (size_t i = 0; i < h->npaths; i++)
		free(h->paths[i]);
	free(h->paths);
	free(h->id_of);
	free(h->src);
	free(h->tab);
	free(h->bits);
	free(h);
}
