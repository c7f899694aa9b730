/* The chunk-checked builder on real files (/var/tmp, so O_DIRECT and its
 * padded tail are in play): files of many chunks, of one chunk and empty
 * come out exactly as fed and of their size; a flipped byte in any chunk
 * is refused with that chunk's number before the chunk is whole on disk,
 * the chunks before it staying there as fed; a resumed file's durable part is
 * read back and checked (and refused when it was changed); a manifest
 * whose chunks match but whose file digest does not is caught at the end;
 * and more bytes than the file has are refused. Chunks hashed by other
 * threads (a receiver's streams): pieces handed over with their hashers'
 * sums, in turns as a receiver takes them, build the same files; a chunk
 * the hasher saw wrong, or a sum that is wrong, is refused at that chunk;
 * a chunk begun with sums that goes on without them, or with a hasher that
 * did not see its start, is refused without writing; a chunk begun here
 * ignores sums until its end. Recording (the manifest comes after the
 * data): the same files come out, and the digests recorded are the
 * manifest's, fed whole or in a hasher's sums. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/digest.h"
#include "daemon/engine/cbuild.h"

#define CHUNK (64u * 1024)

static uint8_t *pattern(size_t n, unsigned seed)
{
	uint8_t *p = malloc(n ? n : 1);

	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)((i * 2654435761u + seed) >> 13);
	return p;
}

/* The manifest entry of p: its digest, and its chunks' when it has more
 * than one. */
static void entry_of(struct mf_entry *e, const uint8_t *p, size_t n, uint64_t chunk)
{
	memset(e, 0, sizeof(*e));
	e->type = MF_FILE;
	e->size = n;
	e->digest = digest_of(p, n);
	e->nchunks = mf_nchunks(n, chunk);
	e->chunks = e->nchunks ? calloc(e->nchunks, sizeof(digest_t)) : NULL;
	for (uint64_t k = 0; k < e->nchunks; k++) {
		size_t len = n - k * chunk < chunk ? n - k * chunk : chunk;

		e->chunks[k] = digest_of(p + k * chunk, len);
	}
}

static int temp_file(char *path, size_t len)
{
	snprintf(path, len, "/var/tmp/test_cbuild.XXXXXX");
	return mkstemp(path);
}

/* Feeds p[from, n) in pieces of `piece`: the first error, or 0. */
static int feed(struct cbuild *b, const uint8_t *p, size_t n, size_t from, size_t piece)
{
	for (size_t off = from; off < n;) {
		size_t len = n - off < piece ? n - off : piece;
		uint8_t *buf;
		int i = cbuild_buf(b, &buf), rc;

		memcpy(buf, p + off, len);
		rc = cbuild_put(b, i, len);
		if (rc < 0)
			return rc;
		off += len;
	}
	return 0;
}

static void check_file(int fd, const uint8_t *p, size_t n)
{
	struct stat st;
	uint8_t *back = malloc(n ? n : 1);

	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal((uint64_t)st.st_size, (uint64_t)n);
	assert_int_equal(pread(fd, back, n, 0), (ssize_t)n);
	assert_memory_equal(back, p, n);
	free(back);
}

static void test_files_come_out_as_fed(void **state)
{
	static const size_t sizes[] = { 0, 1, 4097, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK + 17,
					2 * WQ_BUF + 4095, 3 * WQ_BUF };
	static const size_t pieces[] = { 1000, CHUNK, WQ_BUF };
	struct cbuild b;

	assert_int_equal(cbuild_open(&b), 0);
	assert_int_equal(cbuild_end(&b), 0);    /* nothing begun: idle, as after a file */
	for (size_t s = 0; s < sizeof(sizes) / sizeof(*sizes); s++)
		for (size_t q = 0; q < sizeof(pieces) / sizeof(*pieces); q++) {
			uint8_t *p = pattern(sizes[s], (unsigned)(s * 7 + q));
			struct mf_entry e;
			char path[64];
			int fd = temp_file(path, sizeof(path));

			assert_true(fd >= 0);
			entry_of(&e, p, sizes[s], CHUNK);
			assert_int_equal(cbuild_begin(&b, &e, CHUNK, fd, 0, true), 0);
			assert_int_equal(feed(&b, p, sizes[s], 0, pieces[q]), 0);
			assert_true(cbuild_done(&b));
			assert_true(cbuild_checked(&b));
			assert_int_equal(cbuild_end(&b), 0);
			check_file(fd, p, sizes[s]);
			close(fd);
			unlink(path);
			mf_entry_free(&e);
			free(p);
		}
	cbuild_close(&b);
}

/* A flipped byte in chunk k: refused at that chunk's last piece, which is
 * not written; the chunks before it are on disk as they were fed. */
static void test_a_bad_chunk_is_never_written(void **state)
{
	size_t n = 8 * CHUNK + 100;
	uint8_t *good = pattern(n, 3), *bad = malloc(n);
	struct cbuild b;
	struct mf_entry e;

	entry_of(&e, good, n, CHUNK);
	assert_int_equal(cbuild_open(&b), 0);
	for (uint64_t k = 0; k <= 8; k++) {
		char path[64];
		int fd = temp_file(path, sizeof(path));
		size_t at = k * CHUNK + (k == 8 ? 99 : CHUNK / 2);
		uint8_t *back = malloc(n);
		struct stat st;

		memcpy(bad, good, n);
		bad[at] ^= 0x10;
		assert_int_equal(cbuild_begin(&b, &e, CHUNK, fd, 0, true), 0);
		assert_int_equal(feed(&b, bad, n, 0, 4096), -EBADMSG);
		assert_int_equal(b.bad_chunk, k);
		assert_false(cbuild_done(&b));
		/* Ended after a failure: what was written is on disk, no more. */
		assert_int_equal(cbuild_end(&b), 0);
		assert_int_equal(fstat(fd, &st), 0);
		assert_true((uint64_t)st.st_size >= k * CHUNK);
		assert_true((uint64_t)st.st_size < (k + 1) * CHUNK && (uint64_t)st.st_size < n);
		assert_int_equal(pread(fd, back, k * CHUNK, 0), (ssize_t)(k * CHUNK));
		assert_memory_equal(back, good, k * CHUNK);
		close(fd);
		unlink(path);
		free(back);
	}
	cbuild_close(&b);
	mf_entry_free(&e);
	free(good);
	free(bad);
}

/* A source fails part-way (a bad chunk in a piece spanning two chunks, or
 * a connection lost mid-chunk): rewound to the start of the chunk the next
 * byte was for, the rest fed from another source gives the right file; a
 * file of one chunk starts over and is still checked by its digest. */
static void test_rewind_to_another_source(void **state)
{
	static const size_t sizes[] = { 6 * CHUNK + 300, CHUNK - 7 };
	struct cbuild b;

	assert_int_equal(cbuild_open(&b), 0);
	for (size_t s = 0; s < 2; s++) {
		size_t n = sizes[s];
		uint8_t *good = pattern(n, 9), *bad = malloc(n);
		struct mf_entry e;
		char path[64];
		int fd = temp_file(path, sizeof(path));

		entry_of(&e, good, n, CHUNK);
		memcpy(bad, good, n);
		bad[n > CHUNK ? 3 * CHUNK + 5 : 40] ^= 1;
		/* A bad chunk, found by a piece that also completes a good one. */
		assert_int_equal(cbuild_begin(&b, &e, CHUNK, fd, 0, true), 0);
		assert_int_equal(feed(&b, bad, n, 0, n > CHUNK ? CHUNK + CHUNK / 2 : 1000), -EBADMSG);
		assert_int_equal(cbuild_rewind(&b), 0);
		assert_int_equal(b.at % CHUNK, 0);
		assert_true(b.at <= (n > CHUNK ? 3 * CHUNK : 0));
		assert_int_equal(feed(&b, good, n, (size_t)b.at, 4096), 0);
		assert_int_equal(cbuild_end(&b), 0);
		check_file(fd, good, n);
		/* A source gone mid-chunk: what it gave stays up to the chunk's start. */
		assert_int_equal(cbuild_begin(&b, &e, CHUNK, fd, 0, true), 0);
		assert_int_equal(feed(&b, good, n / 2 + 3, 0, 4096), 0);
		assert_int_equal(cbuild_rewind(&b), 0);
		assert_int_equal(b.at, n > CHUNK ? (n / 2 + 3) / CHUNK * CHUNK : 0);
		assert_int_equal(feed(&b, good, n, (size_t)b.at, 5000), 0);
		assert_int_equal(cbuild_end(&b), 0);
		check_file(fd, good, n);
		/* Rewound and fed wrong again: still refused. */
		assert_int_equal(cbuild_begin(&b, &e, CHUNK, fd, 0, true), 0);
		assert_int_equal(feed(&b, good, n / 2, 0, 4096), 0);
		assert_int_equal(cbuild_rewind(&b), 0);
		assert_int_equal(feed(&b, bad, n, (size_t)b.at, 4096), n > CHUNK && b.at > 3 * CHUNK ?
				 0 : -EBADMSG);
		cbuild_end(&b);
		close(fd);
		unlink(path);
		mf_entry_free(&e);
		free(good);
		free(bad);
	}
	cbuild_close(&b);
}

/* A rewind keeps the whole-file check: the digest goes back to what it was
 * at the chunk's start, so the bytes taken again count once. Fed right
 * after a rewind mid-chunk (twice) and one at a chunk's end, the file's digest is checked
 * and matches; with chunk lines right and the file's digest wrong (a
 * broken sender), the end refuses it, rewound or not. */
static void test_rewind_keeps_the_whole_check(void **state)
{
	size_t n = 6 * CHUNK + 300;
	uint8_t *good = pattern(n, 21);
	struct mf_entry e;
	struct cbuild b;
	char path[64];
	int fd = temp_file(path, sizeof(path));

	assert_int_equal(cbuild_open(&b), 0);
	entry_of(&e, good, n, CHUNK);
	for (int wrong = 0; wrong < 2; wrong++) {
		e.digest = digest_of(good, n);
		if (wrong)
			e.digest.low64 ^= 1;
		assert_int_equal(cbuild_begin(&b, &e, CHUNK, fd, 0, true), 0);
		assert_int_equal(feed(&b, good, 2 * CHUNK + 100, 0, 4096), 0);
		assert_int_equal(cbuild_rewind(&b), 0);
		assert_int_equal(b.at, 2 * CHUNK);
		assert_int_equal(feed(&b, good, 4 * CHUNK + 7, 2 * CHUNK, 5000), 0);
		assert_int_equal(cbuild_rewind(&b), 0);
		assert_int_equal(b.at, 4 * CHUNK);
		assert_false(b.skipped);
		/* and at a chunk's end, where nothing of the next was taken */
		assert_int_equal(feed(&b, good, 5 * CHUNK, 4 * CHUNK, 4096), 0);
		assert_int_equal(cbuild_rewind(&b), 0);
		assert_int_equal(b.at, 5 * CHUNK);
		assert_false(b.skipped);
		assert_int_equal(feed(&b, good, n, 5 * CHUNK, 4096), 0);
		assert_int_equal(cbuild_end(&b), wrong ? -EBADMSG : 0);
		if (!wrong)
			check_file(fd, good, n);
	}
	close(fd);
	unlink(path);
	mf_entry_free(&e);
	free(good);
	cbuild_close(&b);
}

/* A file of one chunk has no chunk digests: its own digest is checked when
 * its last byte comes, before that byte is written. */
static void test_one_chunk_file_is_checked_by_its_digest(void **state)
{
	size_t n = CHUNK - 5;
	uint8_t *p = pattern(n, 11);
	struct cbuild b;
	struct mf_entry e;
	char path[64];
	int fd = temp_file(path, sizeof(path));

	entry_of(&e, p, n, CHUNK);
	assert_int_equal(e.nchunks, 0);
	p[n / 3] ^= 1;
	assert_int_equal(cbuild_open(&b), 0);
	assert_int_equal(cbuild_begin(&b, &e, CHUNK, fd, 0, true), 0);
	assert_int_equal(feed(&b, p, n - 1, 0, 1000), 0);
	assert_false(cbuild_checked(&b));     /* nothing of it is checked yet */
	assert_int_equal(feed(&b, p, n, n - 1, 1000), -EBADMSG);
	assert_int_equal(b.bad_chunk, 0);
	cbuild_end(&b);
	cbuild_close(&b);
	close(fd);
	unlink(path);
	mf_entry_free(&e);
	free(p);
}

/* Resuming after keep bytes: they are read back and hashed, so the file's
 * digest still covers everything; changed, they are refused. */
static void test_resume_checks_what_is_kept(void **state)
{
	size_t n = 6 * CHUNK + 3, keep = 4 * CHUNK;
	uint8_t *p = pattern(n, 5);
	struct cbuild b;
	struct mf_entry e;
	char path[64];
	int fd = temp_file(path, sizeof(path));

	entry_of(&e, p, n, CHUNK);
	assert_int_equal(pwrite(fd, p, keep, 0), (ssize_t)keep);
	assert_int_equal(cbuild_open(&b), 0);
	assert_int_equal(cbuild_begin(&b, &e, CHUNK, fd, keep, true), 0);
	assert_int_equal(b.at, keep);
	assert_int_equal(feed(&b, p, n, keep, 10000), 0);
	assert_int_equal(cbuild_end(&b), 0);
	check_file(fd, p, n);

	/* Chunk 2 of the kept part changed on disk. */
	assert_int_equal(ftruncate(fd, (off_t)keep), 0);
	assert_int_equal(pwrite(fd, "x", 1, 2 * CHUNK + 9), 1);
	assert_int_equal(cbuild_begin(&b, &e, CHUNK, fd, keep, true), -EBADMSG);
	assert_int_equal(b.bad_chunk, 2);
	cbuild_end(&b);
	/* Shorter than it should be. */
	assert_int_equal(ftruncate(fd, (off_t)keep - 1), 0);
	assert_int_equal(cbuild_begin(&b, &e, CHUNK, fd, keep, true), -EIO);
	cbuild_end(&b);
	cbuild_close(&b);
	close(fd);
	unlink(path);
	mf_entry_free(&e);
	free(p);
}

/* A manifest (a lying peer's) whose chunks match the bytes but whose file
 * digest does not: caught at the end. An empty file with a wrong digest
 * too. More bytes than the size: refused. */
static void test_file_digest_and_size_are_checked(void **state)
{
	size_t n = 3 * CHUNK;
	uint8_t *p = pattern(n, 9);
	struct cbuild b;
	struct mf_entry e, z;
	char path[64];
	int fd = temp_file(path, sizeof(path));

	entry_of(&e, p, n, CHUNK);
	e.digest.low64 ^= 1;
	assert_int_equal(cbuild_open(&b), 0);
	assert_int_equal(cbuild_begin(&b, &e, CHUNK, fd, 0, true), 0);
	assert_int_equal(feed(&b, p, n, 0, WQ_BUF), 0);
	assert_int_equal(cbuild_end(&b), -EBADMSG);

	entry_of(&z, p, 0, CHUNK);
	z.digest.high64 ^= 1;
	assert_int_equal(cbuild_begin(&b, &z, CHUNK, fd, 0, true), 0);
	assert_int_equal(cbuild_end(&b), -EBADMSG);

	e.digest.low64 ^= 1;
	assert_int_equal(ftruncate(fd, 0), 0);
	assert_int_equal(cbuild_begin(&b, &e, CHUNK, fd, 0, true), 0);
	assert_int_equal(feed(&b, p, n, 0, CHUNK), 0);
	assert_int_equal(feed(&b, p, 1, 0, 1), -EFBIG);
	assert_int_equal(cbuild_end(&b), 0);
	check_file(fd, p, n);
	cbuild_close(&b);
	close(fd);
	unlink(path);
	mf_entry_free(&e);
	mf_entry_free(&z);
	free(p);
}

/* In place: chunks 2 and 5 of a file on disk are wrong; only they are
 * put, each checked, and the file comes out whole. Skipping backwards, from
 * mid-chunk or past the last chunk is refused. */
static void test_patch_in_place(void **state)
{
	size_t n = 7 * CHUNK + 10;
	uint8_t *good = pattern(n, 21), *disk = malloc(n);
	struct cbuild b;
	struct mf_entry e;
	char path[64];
	int fd = temp_file(path, sizeof(path));

	entry_of(&e, good, n, CHUNK);
	memcpy(disk, good, n);
	disk[2 * CHUNK + 1] ^= 4;
	disk[5 * CHUNK + 7] ^= 4;
	assert_int_equal(pwrite(fd, disk, n, 0), (ssize_t)n);
	assert_int_equal(cbuild_open(&b), 0);
	assert_int_equal(cbuild_begin(&b, &e, CHUNK, fd, 0, true), 0);
	assert_int_equal(cbuild_skip_to(&b, 2), 0);
	assert_int_equal(feed(&b, good, 3 * CHUNK, 2 * CHUNK, 5000), 0);
	assert_int_equal(cbuild_skip_to(&b, 1), -EINVAL);
	assert_int_equal(cbuild_skip_to(&b, 5), 0);
	assert_int_equal(feed(&b, good, 5 * CHUNK + 100, 5 * CHUNK, 5000), 0);
	assert_int_equal(cbuild_skip_to(&b, 6), -EINVAL);      /* mid-chunk */
	assert_int_equal(feed(&b, good, 6 * CHUNK, 5 * CHUNK + 100, 5000), 0);
	assert_int_equal(cbuild_skip_to(&b, 8), -EINVAL);      /* past the last */
	assert_int_equal(cbuild_end(&b), 0);                   /* no whole digest: skipped */
	check_file(fd, good, n);
	/* A wrong chunk offered as a repair is refused like any other. */
	assert_int_equal(cbuild_begin(&b, &e, CHUNK, fd, 0, true), 0);
	assert_int_equal(cbuild_skip_to(&b, 5), 0);
	assert_int_equal(feed(&b, disk, 6 * CHUNK, 5 * CHUNK, CHUNK), -EBADMSG);
	assert_int_equal(b.bad_chunk, 5);
	assert_int_equal(cbuild_end(&b), 0);
	check_file(fd, good, n);
	cbuild_close(&b);
	close(fd);
	unlink(path);
	mf_entry_free(&e);
	free(good);
	free(disk);
}

/* Pieces of `piece` bytes hashed in turns by nh hashers, as a receiver's
 * streams do (after a piece that ends a chunk or the file, the next
 * hasher), and put with their sums. flip_at: a byte flipped before its
 * hasher sees it (SIZE_MAX: none); bad_sum: the piece whose first sum is
 * flipped after hashing (SIZE_MAX: none). The first error, or 0. */
static int feed_sums(struct cbuild *b, const uint8_t *p, size_t n, uint64_t cs, size_t piece,
		     unsigned nh, size_t flip_at, size_t bad_sum)
{
	struct cbuild_hasher h[4];
	struct cbuild_sums *s = malloc(sizeof(*s));
	unsigned turn = 0;
	size_t k = 0;
	int rc = 0;

	for (unsigned j = 0; j < nh; j++)
		assert_int_equal(cbuild_hasher_open(&h[j]), 0);
	for (size_t off = 0; off < n && rc == 0; k++) {
		size_t len = n - off < piece ? n - off : piece;
		uint8_t *buf;
		int i = cbuild_buf(b, &buf);

		memcpy(buf, p + off, len);
		if (flip_at >= off && flip_at < off + len)
			buf[flip_at - off] ^= 0x40;
		cbuild_hash(&h[turn], cs, 7, off, buf, len, s);
		if (k == bad_sum)
			s->d[0].low64 ^= 1;
		rc = cbuild_put_sums(b, i, len, s);
		off += len;
		if ((off % cs) == 0 || off == n)
			turn = (turn + 1) % nh;
	}
	for (unsigned j = 0; j < nh; j++)
		cbuild_hasher_close(&h[j]);
	free(s);
	return rc;
}

static void test_sums_build_the_same_files(void **state)
{
	static const size_t sizes[] = { 1, CHUNK + 1, 5 * CHUNK + 17, 3 * WQ_BUF + 4095,
					9 * WQ_BUF + 123 };
	static const uint64_t css[] = { CHUNK, 4 * WQ_BUF };
	struct cbuild b;

	assert_int_equal(cbuild_open(&b), 0);
	for (size_t c = 0; c < 2; c++)
		for (size_t z = 0; z < sizeof(sizes) / sizeof(*sizes); z++) {
			uint8_t *p = pattern(sizes[z], (unsigned)(z + 11 * c));
			struct mf_entry e;
			char path[64];
			int fd = temp_file(path, sizeof(path));

			entry_of(&e, p, sizes[z], css[c]);
			for (unsigned nh = 1; nh <= 3; nh += 2) {
				assert_int_equal(cbuild_begin(&b, &e, css[c], fd, 0, true), 0);
				assert_int_equal(feed_sums(&b, p, sizes[z], css[c], WQ_BUF, nh,
							   SIZE_MAX, SIZE_MAX), 0);
				assert_true(cbuild_done(&b));
				assert_int_equal(cbuild_end(&b), 0);
				check_file(fd, p, sizes[z]);
			}
			/* The hasher saw a flipped byte: its chunk is refused. */
			if (e.nchunks) {
				size_t at = sizes[z] / 2;

				assert_int_equal(cbuild_begin(&b, &e, css[c], fd, 0, true), 0);
				assert_int_equal(feed_sums(&b, p, sizes[z], css[c], WQ_BUF, 3, at,
							   SIZE_MAX), -EBADMSG);
				assert_int_equal(b.bad_chunk, at / css[c]);
				assert_int_equal(cbuild_end(&b), 0);
			}
			/* A sum that is wrong (the bytes right): refused. */
			if (e.nchunks && sizes[z] >= css[c]) {
				size_t last = (css[c] - 1) / WQ_BUF;   /* the piece ending chunk 0 */

				assert_int_equal(cbuild_begin(&b, &e, css[c], fd, 0, true), 0);
				assert_int_equal(feed_sums(&b, p, sizes[z], css[c], WQ_BUF, 3,
							   SIZE_MAX, last), -EBADMSG);
				assert_int_equal(b.bad_chunk, 0);
				assert_int_equal(cbuild_end(&b), 0);
			}
			close(fd);
			unlink(path);
			mf_entry_free(&e);
			free(p);
		}
	cbuild_close(&b);
}

/* Chunks of 4 pieces. Begun with sums, a chunk goes on only with sums of
 * the hasher that saw its start; begun here, it ignores sums to its end. */
static void test_sums_stay_with_their_chunk(void **state)
{
	uint64_t cs = 4 * WQ_BUF;
	size_t n = 8 * WQ_BUF;
	uint8_t *p = pattern(n, 5), *buf;
	struct cbuild_hasher h1, h2;
	struct cbuild_sums *s = malloc(sizeof(*s));
	struct cbuild b;
	struct mf_entry e;
	char path[64];
	int fd = temp_file(path, sizeof(path)), i;

	entry_of(&e, p, n, cs);
	assert_int_equal(cbuild_open(&b), 0);
	assert_int_equal(cbuild_hasher_open(&h1), 0);
	assert_int_equal(cbuild_hasher_open(&h2), 0);
	assert_int_equal(cbuild_begin(&b, &e, cs, fd, 0, true), 0);
	i = cbuild_buf(&b, &buf);
	memcpy(buf, p, WQ_BUF);
	cbuild_hash(&h1, cs, 0, 0, buf, WQ_BUF, s);
	assert_true(s->head);
	assert_int_equal(cbuild_put_sums(&b, i, WQ_BUF, s), 0);
	/* Without sums: refused, and nothing taken. */
	i = cbuild_buf(&b, &buf);
	memcpy(buf, p + WQ_BUF, WQ_BUF);
	assert_int_equal(cbuild_put_sums(&b, i, WQ_BUF, NULL), -EPROTO);
	assert_int_equal(b.at, WQ_BUF);
	/* With a hasher that did not see the chunk's start: refused. */
	cbuild_hash(&h2, cs, 0, WQ_BUF, buf, WQ_BUF, s);
	assert_false(s->head);
	assert_int_equal(cbuild_put_sums(&b, i, WQ_BUF, s), -EPROTO);
	assert_int_equal(b.at, WQ_BUF);
	/* Sums of other bytes count as none. */
	cbuild_hash(&h1, cs, 0, 2 * WQ_BUF, buf, WQ_BUF, s);
	assert_int_equal(cbuild_put_sums(&b, i, WQ_BUF, s), -EPROTO);
	assert_int_equal(cbuild_end(&b), 0);

	/* Begun here: a hasher's sums from mid-chunk on are ignored, and the
	 * next chunk, begun with sums, takes them. */
	assert_int_equal(cbuild_begin(&b, &e, cs, fd, 0, true), 0);
	cbuild_hasher_close(&h1);
	assert_int_equal(cbuild_hasher_open(&h1), 0);
	for (size_t off = 0; off < n; off += WQ_BUF) {
		i = cbuild_buf(&b, &buf);
		memcpy(buf, p + off, WQ_BUF);
		cbuild_hash(&h1, cs, 0, off, buf, WQ_BUF, s);
		assert_int_equal(cbuild_put_sums(&b, i, WQ_BUF, off == 0 ? NULL : s), 0);
		assert_int_equal(b.ext, off >= cs);
	}
	assert_int_equal(cbuild_end(&b), 0);
	check_file(fd, p, n);

	cbuild_hasher_close(&h1);
	cbuild_hasher_close(&h2);
	cbuild_close(&b);
	close(fd);
	unlink(path);
	mf_entry_free(&e);
	free(s);
	free(p);
}

/* Begun on an entry whose digests are unknown (zero), recording: the file
 * comes out as fed, and the digests recorded are those of entry_of. */
static void test_recording_finds_the_manifests_digests(void **state)
{
	static const size_t sizes[] = { 0, 1, CHUNK, CHUNK + 1, 5 * CHUNK + 17, 3 * WQ_BUF + 4095 };
	struct cbuild b;

	assert_int_equal(cbuild_open(&b), 0);
	for (size_t z = 0; z < sizeof(sizes) / sizeof(*sizes); z++)
		for (unsigned how = 0; how < 2; how++) {
			uint8_t *p = pattern(sizes[z], (unsigned)(z + 5));
			struct mf_entry want, skel, rec;
			char path[64];
			int fd = temp_file(path, sizeof(path));

			entry_of(&want, p, sizes[z], CHUNK);
			assert_int_equal(mf_entry_copy(&skel, &want), 0);
			skel.digest = (digest_t){ 0 };
			for (uint64_t k = 0; k < skel.nchunks; k++)
				skel.chunks[k] = (digest_t){ 0 };
			assert_int_equal(mf_entry_copy(&rec, &skel), 0);
			assert_int_equal(cbuild_begin(&b, &skel, CHUNK, fd, 0, true), 0);
			cbuild_record(&b, &rec);
			assert_int_equal(how ? feed_sums(&b, p, sizes[z], CHUNK, WQ_BUF, 3, SIZE_MAX,
							 SIZE_MAX) :
					 feed(&b, p, sizes[z], 0, 1000), 0);
			assert_int_equal(cbuild_end(&b), 0);
			check_file(fd, p, sizes[z]);
			assert_true(digest_eq(rec.digest, want.digest));
			for (uint64_t k = 0; k < want.nchunks; k++)
				assert_true(digest_eq(rec.chunks[k], want.chunks[k]));
			/* The next file is checked again: recording ends with it. */
			assert_null(b.rec);
			close(fd);
			unlink(path);
			mf_entry_free(&want);
			mf_entry_free(&skel);
			mf_entry_free(&rec);
			free(p);
		}
	cbuild_close(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_files_come_out_as_fed),
		cmocka_unit_test(test_a_bad_chunk_is_never_written),
		cmocka_unit_test(test_one_chunk_file_is_checked_by_its_digest),
		cmocka_unit_test(test_rewind_to_another_source),
		cmocka_unit_test(test_rewind_keeps_the_whole_check),
		cmocka_unit_test(test_resume_checks_what_is_kept),
		cmocka_unit_test(test_file_digest_and_size_are_checked),
		cmocka_unit_test(test_patch_in_place),
		cmocka_unit_test(test_sums_build_the_same_files),
		cmocka_unit_test(test_sums_stay_with_their_chunk),
		cmocka_unit_test(test_recording_finds_the_manifests_digests),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
