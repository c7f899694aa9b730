/* The write queue on real files, on the disk (/var/tmp: O_DIRECT) and on a
 * tmpfs (/dev/shm: the cache, or O_DIRECT where the kernel allows it there):
 * files of every size around the block and buffer edges come out exactly
 * as written and of their size (the padded last block cut back), a piece
 * that is not aligned falls back to the cache without losing a byte, and
 * wq_sync makes durable what is below its offset, and says so, while
 * writes above it go on; a write cut short is asked again, so that the
 * error named is the file system's own. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/engine/wq.h"

static const char *const dirs[] = { "/var/tmp", "/dev/shm" };

static uint8_t *pattern(size_t n, unsigned seed)
{
	uint8_t *p = malloc(n ? n : 1);

	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)((i * 2654435761u + seed) >> 13);
	return p;
}

static int make_file(const char *dir, char *path, size_t len)
{
	int fd;

	snprintf(path, len, "%s/test_wq.XXXXXX", dir);
	fd = mkstemp(path);
	return fd;
}

/* Writes p (n bytes) through q in pieces of `piece` bytes (the last one
 * shorter), then checks the file. */
static void write_and_check(struct wq *q, const char *dir, const uint8_t *p, size_t n,
			    size_t piece, bool *was_direct)
{
	char path[256];
	int fd = make_file(dir, path, sizeof(path));
	struct stat st;
	uint8_t *back = malloc(n ? n : 1);

	assert_true(fd >= 0);
	wq_begin(q, fd, n, true);
	*was_direct = q->direct;
	for (size_t off = 0; off < n;) {
		size_t len = n - off < piece ? n - off : piece;
		int b = wq_buf(q);

		memcpy(q->buf[b], p + off, len);
		assert_int_equal(wq_write(q, b, len, off), 0);
		off += len;
	}
	assert_int_equal(wq_end(q), 0);
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal((uint64_t)st.st_size, (uint64_t)n);
	assert_int_equal(pread(fd, back, n, 0), (ssize_t)n);
	assert_memory_equal(back, p, n);
	/* Between files: no O_DIRECT left on the fd, nothing in flight. */
	assert_false(fcntl(fd, F_GETFL) & O_DIRECT);
	assert_int_equal(q->inflight, 0);
	close(fd);
	unlink(path);
	free(back);
}

static void test_sizes(void **state)
{
	static const size_t sizes[] = {
		1, 100, 4096, 4097, WQ_BUF - 1, WQ_BUF, 2 * WQ_BUF - 1, 2 * WQ_BUF,
		2 * WQ_BUF + 1, 2 * WQ_BUF + 4095, 2 * WQ_BUF + 4096, 5 * WQ_BUF + 17,
	};
	struct wq q;
	bool direct, any_direct = false;

	assert_int_equal(wq_open(&q), 0);
	for (size_t d = 0; d < 2; d++)
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
			uint8_t *p = pattern(sizes[i], (unsigned)i);

			write_and_check(&q, dirs[d], p, sizes[i], WQ_BUF, &direct);
			/* Small files stay in the cache; big ones on the disk
			 * go around it. */
			if (sizes[i] < 2 * WQ_BUF)
				assert_false(direct);
			if (d == 0 && sizes[i] >= 2 * WQ_BUF)
				any_direct |= direct;
			free(p);
		}
	assert_true(any_direct);
	wq_close(&q);
}

/* A peer's pieces of 1 MiB + 1: from the second on, nothing is aligned. */
static void test_unaligned_falls_back(void **state)
{
	size_t n = 4 * WQ_BUF + 123;
	uint8_t *p = pattern(n, 7);
	struct wq q;
	bool direct;

	assert_int_equal(wq_open(&q), 0);
	for (size_t d = 0; d < 2; d++) {
		write_and_check(&q, dirs[d], p, n, WQ_BUF - 4095, &direct);
		write_and_check(&q, dirs[d], p, n, 3 * 4096 + 1, &direct);
	}
	wq_close(&q);
	free(p);
}

static void test_sync_says_how_far(void **state)
{
	size_t n = 6 * WQ_BUF;
	uint8_t *p = pattern(n, 3);
	char path[256];
	int fd = make_file(dirs[0], path, sizeof(path));
	struct wq q;

	assert_true(fd >= 0);
	assert_int_equal(wq_open(&q), 0);
	wq_begin(&q, fd, n, true);
	assert_int_equal(wq_durable(&q), 0);
	for (size_t off = 0; off < n; off += WQ_BUF) {
		int b = wq_buf(&q);

		memcpy(q.buf[b], p + off, WQ_BUF);
		assert_int_equal(wq_write(&q, b, WQ_BUF, off), 0);
		if (off + WQ_BUF == 2 * WQ_BUF)
			wq_sync(&q, 2 * WQ_BUF);
		/* Never more than what was asked, and never past what was
		 * written when it was asked. */
		assert_true(wq_durable(&q) == 0 || wq_durable(&q) == 2 * WQ_BUF);
	}
	assert_int_equal(wq_drain(&q), 0);
	assert_int_equal(wq_durable(&q), 2 * WQ_BUF);
	/* A second sync, asked after the last write. */
	wq_sync(&q, n);
	assert_int_equal(wq_drain(&q), 0);
	assert_int_equal(wq_durable(&q), n);
	/* An older point asked again changes nothing. */
	wq_sync(&q, WQ_BUF);
	assert_int_equal(wq_drain(&q), 0);
	assert_int_equal(wq_durable(&q), n);
	assert_int_equal(wq_end(&q), 0);
	assert_int_equal(wq_durable(&q), 0);
	wq_close(&q);
	close(fd);
	unlink(path);
	free(p);
}

/* A write to a file opened read-only fails, and the failure is what every
 * later call returns until the file ends. */
static void test_error_is_sticky(void **state)
{
	char path[256];
	int fd = make_file(dirs[0], path, sizeof(path)), ro;
	struct wq q;
	int b;

	assert_true(fd >= 0);
	ro = open(path, O_RDONLY);
	assert_true(ro >= 0);
	assert_int_equal(wq_open(&q), 0);
	wq_begin(&q, ro, 3 * WQ_BUF, true);
	b = wq_buf(&q);
	memset(q.buf[b], 1, WQ_BUF);
	wq_write(&q, b, WQ_BUF, 0);
	assert_int_equal(wq_drain(&q), -EBADF);
	b = wq_buf(&q);
	assert_int_equal(wq_write(&q, b, WQ_BUF, WQ_BUF), -EBADF);
	assert_int_equal(wq_end(&q), -EBADF);
	/* The next file starts clean. */
	wq_begin(&q, fd, 10, true);
	b = wq_buf(&q);
	memset(q.buf[b], 2, 10);
	assert_int_equal(wq_write(&q, b, 10, 0), 0);
	assert_int_equal(wq_end(&q), 0);
	wq_close(&q);
	close(ro);
	close(fd);
	unlink(path);
}

/* A file system that stops a write part-way (a disk failing mid-file, a
 * file size limit): the short write is asked again for the rest, and the
 * error is what the second asking returns (EFBIG here), not a guess of
 * "full"; the bytes before the limit are as written. RLIMIT_FSIZE makes
 * the fault: a write across it is cut short there, the next one fails. */
static void test_short_write_says_why(void **state)
{
	const size_t limit = WQ_BUF + 12345;       /* not a block boundary */
	struct rlimit old, rl;
	uint8_t *p = pattern(3 * WQ_BUF, 7), *back = malloc(limit);

	assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
	signal(SIGXFSZ, SIG_IGN);
	for (size_t d = 0; d < sizeof(dirs) / sizeof(dirs[0]); d++) {
		char path[256];
		int fd = make_file(dirs[d], path, sizeof(path)), rc = 0;
		struct wq q;
		struct stat st;

		assert_true(fd >= 0);
		assert_int_equal(wq_open(&q), 0);
		rl = (struct rlimit){ .rlim_cur = limit, .rlim_max = old.rlim_max };
		assert_int_equal(setrlimit(RLIMIT_FSIZE, &rl), 0);
		wq_begin(&q, fd, 3 * WQ_BUF, true);
		for (size_t off = 0; off < 3 * WQ_BUF && rc == 0; off += WQ_BUF) {
			int b = wq_buf(&q);

			memcpy(q.buf[b], p + off, WQ_BUF);
			rc = wq_write(&q, b, WQ_BUF, off);
		}
		if (rc == 0)
			rc = wq_drain(&q);
		assert_int_equal(rc, -EFBIG);
		assert_int_equal(wq_end(&q), -EFBIG);
		assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
		assert_int_equal(fstat(fd, &st), 0);
		assert_int_equal(st.st_size, limit);
		assert_int_equal(pread(fd, back, limit, 0), (ssize_t)limit);
		assert_memory_equal(back, p, limit);
		wq_close(&q);
		close(fd);
		unlink(path);
	}
	signal(SIGXFSZ, SIG_DFL);
	free(back);
	free(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sizes),
		cmocka_unit_test(test_unaligned_falls_back),
		cmocka_unit_test(test_sync_says_how_far),
		cmocka_unit_test(test_error_is_sticky),
		cmocka_unit_test(test_short_write_says_why),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
