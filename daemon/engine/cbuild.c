/* The chunk-checked builder: see cbuild.h.
 *
 * Invariant: whole has taken [0, at) of the file; chunk the bytes of chunk
 * chunk_no taken so far (chunk_fill of them), unless ext: then a hasher
 * holds them, and each later part of that chunk comes with its sums; and
 * every chunk below chunk_no matched the manifest before its last byte was
 * written. In a file of chunks, mark is whole as it was at mark_at, the
 * start of the last chunk begun (so a rewind to it keeps the whole-file
 * check). */
#include "daemon/engine/cbuild.h"

#include <errno.h>
#include <unistd.h>

#include "common/digest.h"

int cbuild_open(struct cbuild *b)
{
	int rc;

	*b = (struct cbuild){ 0 };
	b->whole = XXH3_createState();
	b->chunk = XXH3_createState();
	b->mark = XXH3_createState();
	rc = b->whole && b->chunk && b->mark ? wq_open(&b->wq) : -ENOMEM;
	if (rc < 0) {
		XXH3_freeState(b->whole);
		XXH3_freeState(b->chunk);
		XXH3_freeState(b->mark);
		b->whole = b->chunk = b->mark = NULL;
	}
	return rc;
}

void cbuild_close(struct cbuild *b)
{
	if (!b->whole)
		return;
	wq_close(&b->wq);
	XXH3_freeState(b->whole);
	XXH3_freeState(b->chunk);
	XXH3_freeState(b->mark);
	b->whole = b->chunk = b->mark = NULL;
}

/* The digest of the chunk that has just been completed: the builder's own,
 * or the hasher's (at a multiple of the chunk size the j-th chunk end it
 * recorded; at the file's end short of one, its running digest). False
 * when the hasher recorded none for it. */
static bool completed(const struct cbuild *b, const struct cbuild_sums *s, unsigned j,
		      digest_t *d)
{
	if (!b->ext)
		*d = XXH3_128bits_digest(b->chunk);
	else if (b->chunk_fill < b->chunk_size)
		*d = s->d[s->nd];
	else if (j < s->nd)
		*d = s->d[j];
	else
		return false;
	return true;
}

/* Takes n bytes at b->at into the hashes, with a hasher's sums of them
 * (or NULL): 0; -EBADMSG when a chunk they complete does not match
 * (b->bad_chunk); -EPROTO when a chunk begun with sums lost them (nothing
 * taken). A file of one chunk is checked against its own digest, from the
 * whole-file state: its bytes are hashed once. */
static int take(struct cbuild *b, const uint8_t *p, size_t n, const struct cbuild_sums *s)
{
	const struct mf_entry *e = b->e;
	unsigned j = 0;                 /* chunk ends passed in s->d */
	int rc = 0;

	if (s && (s->off != b->at || s->n != n || s->cs != b->chunk_size))
		s = NULL;               /* not of these bytes */
	/* A chunk begun with sums goes on only with the sums of a hasher that
	 * has held it from its start (all of a chunk's pieces through one). */
	if (e->nchunks && b->ext && b->chunk_fill && !(s && s->head))
		return -EPROTO;
	if (!e->nchunks) {
		XXH3_128bits_update(b->whole, p, n);
		b->at += n;
		b->hashed = b->at;
		if (b->at == e->size && b->rec) {
			b->rec->digest = XXH3_128bits_digest(b->whole);
		} else if (b->at == e->size &&
			   !digest_eq(XXH3_128bits_digest(b->whole), e->digest)) {
			b->bad_chunk = 0;
			rc = -EBADMSG;
		}
		return rc;
	}
	while (n) {
		uint64_t left = b->chunk_size - b->chunk_fill;
		size_t k = left < n ? (size_t)left : n;

		if (b->chunk_fill == 0) {
			b->ext = s != NULL;     /* who hashes this chunk, to its end */
			XXH3_copyState(b->mark, b->whole);
			b->mark_at = b->at;
		}
		if (!b->ext)
			XXH3_128bits_update(b->chunk, p, k);
		XXH3_128bits_update(b->whole, p, k);
		b->at += k;
		b->hashed = b->at;
		b->chunk_fill += k;
		p += k;
		n -= k;
		if (b->chunk_fill == b->chunk_size ||
		    b->chunk_no * b->chunk_size + b->chunk_fill == e->size) {
			digest_t d = { 0 };
			bool have = completed(b, s, j, &d);

			if (s && b->chunk_fill == b->chunk_size)
				j++;    /* the hasher's ends are counted whoever hashed the chunk */
			if (b->rec && have && b->chunk_no < b->rec->nchunks)
				b->rec->chunks[b->chunk_no] = d;
			else if (rc == 0 && (b->chunk_no >= e->nchunks || !have ||
					!digest_eq(d, e->chunks[b->chunk_no]))) {
				b->bad_chunk = b->chunk_no;
				rc = -EBADMSG;
			}
			b->chunk_no++;
			b->chunk_fill = 0;
			if (!b->ext)
				XXH3_128bits_reset(b->chunk);
		}
	}
	return rc;
}

int cbuild_hasher_open(struct cbuild_hasher *h)
{
	*h = (struct cbuild_hasher){ .st = XXH3_createState() };
	if (!h->st)
		return -ENOMEM;
	XXH3_128bits_reset(h->st);
	return 0;
}

void cbuild_hasher_close(struct cbuild_hasher *h)
{
	XXH3_freeState(h->st);
	h->st = NULL;
}

void cbuild_hash(struct cbuild_hasher *h, uint64_t cs, uint64_t idx, uint64_t off,
		 const uint8_t *p, size_t n, struct cbuild_sums *out)
{
	uint64_t at = off;

	out->off = off;
	out->n = n;
	out->cs = cs;
	out->nd = 0;
	if (!cs)
		return;
	if (off % cs == 0) {
		XXH3_128bits_reset(h->st);
		h->run = true;
	} else if (idx != h->idx || off != h->end) {
		h->run = false;         /* a part of a chunk whose start it did not see */
	}
	out->head = h->run;
	while (n) {
		uint64_t left = cs - at % cs;
		size_t k = left < n ? (size_t)left : n;

		if (h->run)
			XXH3_128bits_update(h->st, p, k);
		at += k;
		p += k;
		n -= k;
		if (at % cs == 0) {
			if (out->nd < CBUILD_SUMS_MAX)
				out->d[out->nd++] = XXH3_128bits_digest(h->st);
			XXH3_128bits_reset(h->st);
			h->run = true;
		}
	}
	out->d[out->nd] = h->run ? XXH3_128bits_digest(h->st) : (digest_t){ 0 };
	h->idx = idx;
	h->end = at;
}

int cbuild_begin(struct cbuild *b, const struct mf_entry *e, uint64_t chunk_size, int fd,
		 uint64_t keep, bool direct_ok)
{
	b->e = e;
	b->rec = NULL;
	b->chunk_size = chunk_size;
	b->at = b->chunk_no = b->chunk_fill = b->bad_chunk = 0;
	b->mark_at = UINT64_MAX;
	b->hashed = 0;
	b->skipped = b->ext = false;
	if (keep > e->size)
		return -EINVAL;
	XXH3_128bits_reset(b->whole);
	XXH3_128bits_reset(b->chunk);
	/* Read back through the cache, before wq_begin may set O_DIRECT. */
	while (b->at < keep) {
		uint8_t *p;
		size_t n = keep - b->at < WQ_BUF ? (size_t)(keep - b->at) : WQ_BUF;
		ssize_t got;

		cbuild_buf(b, &p);
		got = pread(fd, p, n, (off_t)b->at);
		if (got != (ssize_t)n)
			return got < 0 ? -errno : -EIO;
		if (take(b, p, n, NULL) < 0)
			return -EBADMSG;
	}
	wq_begin(&b->wq, fd, e->size, direct_ok);
	return 0;
}

int cbuild_put_sums(struct cbuild *b, int i, size_t n, const struct cbuild_sums *s)
{
	uint64_t off = b->at;
	int rc;

	if (off > b->e->size || n > b->e->size - off)
		return -EFBIG;
	if ((rc = take(b, b->wq.buf[i], n, s)) < 0) {
		b->at = off;            /* not written: the file goes no further */
		return rc;
	}
	return wq_write(&b->wq, i, n, off);
}

int cbuild_put(struct cbuild *b, int i, size_t n)
{
	return cbuild_put_sums(b, i, n, NULL);
}

int cbuild_skip_to(struct cbuild *b, uint64_t k)
{
	if (!b->e->nchunks || b->chunk_fill || k < b->chunk_no || k >= b->e->nchunks)
		return -EINVAL;
	if (k > b->chunk_no)
		b->skipped = true;
	b->chunk_no = k;
	b->at = k * b->chunk_size;
	return 0;
}

int cbuild_rewind(struct cbuild *b)
{
	int rc = wq_drain(&b->wq);      /* nothing of the failed chunk still on its way */

	if (rc < 0)
		return rc;
	b->chunk_no = b->e->nchunks ? b->at / b->chunk_size : 0;
	b->at = b->chunk_no * b->chunk_size;
	b->chunk_fill = 0;
	b->ext = false;
	XXH3_128bits_reset(b->chunk);
	if (b->at == 0)
		XXH3_128bits_reset(b->whole);
	else if (b->hashed == b->at)
		;                       /* at a chunk's end: whole has taken just [0, at) */
	else if (b->mark_at == b->at)
		XXH3_copyState(b->whole, b->mark);      /* as it was at this chunk's start */
	else
		b->skipped = true;      /* a failed piece that began a chunk */
	b->hashed = b->at;
	return 0;
}

int cbuild_end(struct cbuild *b)
{
	const struct mf_entry *e = b->e;
	int rc = wq_end(&b->wq);

	/* A file of one chunk was checked by its last byte; an empty one has
	 * none, and is checked here like a file of chunks. */
	if (rc == 0 && e && b->at == e->size && !b->skipped && (e->nchunks || e->size == 0) &&
	    b->rec)
		b->rec->digest = XXH3_128bits_digest(b->whole);
	else if (rc == 0 && e && b->at == e->size && !b->skipped &&
		 (e->nchunks || e->size == 0) && !digest_eq(XXH3_128bits_digest(b->whole), e->digest))
		rc = -EBADMSG;
	b->e = NULL;            /* idle until the next cbuild_begin */
	b->rec = NULL;
	return rc;
}
