/* The chunk-checked builder: see cbuild.h.
 *
 * Invariant: whole has taken [0, at) of the file, chunk the bytes of chunk
 * chunk_no taken so far (chunk_fill of them), and every chunk below
 * chunk_no matched the manifest before its last byte was written. */
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
	rc = b->whole && b->chunk ? wq_open(&b->wq) : -ENOMEM;
	if (rc < 0) {
		XXH3_freeState(b->whole);
		XXH3_freeState(b->chunk);
		b->whole = b->chunk = NULL;
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
	b->whole = b->chunk = NULL;
}

/* Takes n bytes at b->at into the hashes: false when a chunk they complete
 * does not match (b->bad_chunk). A file of one chunk is checked against its
 * own digest, from the whole-file state: its bytes are hashed once. */
static bool take(struct cbuild *b, const uint8_t *p, size_t n)
{
	const struct mf_entry *e = b->e;
	bool ok = true;

	XXH3_128bits_update(b->whole, p, n);
	b->at += n;
	if (!e->nchunks) {
		if (b->at == e->size && !digest_eq(XXH3_128bits_digest(b->whole), e->digest)) {
			b->bad_chunk = 0;
			ok = false;
		}
		return ok;
	}
	while (n) {
		uint64_t left = b->chunk_size - b->chunk_fill;
		size_t k = left < n ? (size_t)left : n;

		XXH3_128bits_update(b->chunk, p, k);
		b->chunk_fill += k;
		p += k;
		n -= k;
		if (b->chunk_fill == b->chunk_size ||
		    b->chunk_no * b->chunk_size + b->chunk_fill == e->size) {
			if (ok && (b->chunk_no >= e->nchunks ||
				   !digest_eq(XXH3_128bits_digest(b->chunk), e->chunks[b->chunk_no]))) {
				b->bad_chunk = b->chunk_no;
				ok = false;
			}
			b->chunk_no++;
			b->chunk_fill = 0;
			XXH3_128bits_reset(b->chunk);
		}
	}
	return ok;
}

int cbuild_begin(struct cbuild *b, const struct mf_entry *e, uint64_t chunk_size, int fd,
		 uint64_t keep, bool direct_ok)
{
	b->e = e;
	b->chunk_size = chunk_size;
	b->at = b->chunk_no = b->chunk_fill = b->bad_chunk = 0;
	b->skipped = false;
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
		if (!take(b, p, n))
			return -EBADMSG;
	}
	wq_begin(&b->wq, fd, e->size, direct_ok);
	return 0;
}

int cbuild_put(struct cbuild *b, int i, size_t n)
{
	uint64_t off = b->at;

	if (off > b->e->size || n > b->e->size - off)
		return -EFBIG;
	if (!take(b, b->wq.buf[i], n)) {
		b->at = off;            /* not written: the file goes no further */
		return -EBADMSG;
	}
	return wq_write(&b->wq, i, n, off);
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
	XXH3_128bits_reset(b->chunk);
	if (b->at == 0)
		XXH3_128bits_reset(b->whole);
	else
		b->skipped = true;
	return 0;
}

int cbuild_end(struct cbuild *b)
{
	const struct mf_entry *e = b->e;
	int rc = wq_end(&b->wq);

	/* A file of one chunk was checked by its last byte; an empty one has
	 * none, and is checked here like a file of chunks. */
	if (rc == 0 && e && b->at == e->size && !b->skipped && (e->nchunks || e->size == 0) &&
	    !digest_eq(XXH3_128bits_digest(b->whole), e->digest))
		rc = -EBADMSG;
	b->e = NULL;            /* idle until the next cbuild_begin */
	return rc;
}
