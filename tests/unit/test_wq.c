/* The write queue on real files, on the disk (/var/tmp: O_DIRECT) and on a
 * tmpfs (/dev/shm: the cache, or O_DIRECT where the kernel allows it there):
 * files of every size around the block and buffer edges come out exactly
 * as written and of their size (the padded last block cut back), a piece
 * that is not aligned falls back to the cache without losing a byte, and
 * wq_sync makes durable what is below its offset, and says so, while
 * writes above it go on; a write cut short is asked again, so that the
 * error named is the file system's own. A file the daemon alone can reach
 * on a tmpfs (WQ_MAP_OK) is mapped and copied into by the queue's copier
 * threads: it comes out the same, a tmpfs without room for it says ENOSPC
 * (no SIGBUS), and a file it cannot map is written
 * through the ring. */
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
#include <dirent.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
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

/* Writes p through q into the open file fd (how for wq_begin) in pieces of
 * `piece` bytes (the last one shorter), up to WQ_DEPTH in flight, and waits
 * for them: 0 or the first error. mapped: whether the queue mapped the file. */
static int write_all(struct wq *q, int fd, const uint8_t *p, size_t n, size_t piece,
		     unsigned how, bool *mapped)
{
	int rc = 0;

	wq_begin(q, fd, n, how);
	*mapped = q->mapped;
	for (size_t off = 0; off < n && rc == 0;) {
		size_t len = n - off < piece ? n - off : piece;
		int b = wq_buf(q);

		memcpy(q->buf[b], p + off, len);
		rc = wq_write(q, b, len, off);
		off += len;
	}
	if (rc == 0)
		rc = wq_drain(q);
	return rc;
}

/* Writes p (n bytes) through q (how for wq_begin) in pieces of `piece`
 * bytes (the last one shorter), then checks the file; was_direct, mapped:
 * how the queue wrote it. */
static void write_and_check(struct wq *q, const char *dir, const uint8_t *p, size_t n,
			    size_t piece, unsigned how, bool *was_direct, bool *mapped)
{
	char path[256];
	int fd = make_file(dir, path, sizeof(path));
	struct stat st;
	uint8_t *back = malloc(n ? n : 1);

	assert_true(fd >= 0);
	assert_int_equal(write_all(q, fd, p, n, piece, how, mapped), 0);
	*was_direct = q->direct;
	assert_int_equal(wq_end(q), 0);
	assert_false(q->mapped);
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
	bool direct, mapped, any_direct = false;

	assert_int_equal(wq_open(&q), 0);
	for (size_t d = 0; d < 2; d++)
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
			uint8_t *p = pattern(sizes[i], (unsigned)i);

			write_and_check(&q, dirs[d], p, sizes[i], WQ_BUF, WQ_DIRECT_OK, &direct,
					&mapped);
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
	bool direct, mapped;

	assert_int_equal(wq_open(&q), 0);
	for (size_t d = 0; d < 2; d++) {
		write_and_check(&q, dirs[d], p, n, WQ_BUF - 4095, WQ_DIRECT_OK, &direct, &mapped);
		write_and_check(&q, dirs[d], p, n, 3 * 4096 + 1, WQ_DIRECT_OK, &direct, &mapped);
	}
	wq_close(&q);
	free(p);
}

/* On the disk through the ring, and on a tmpfs a mapped file (durable once
 * the copies below the offset are done). */
static void sync_says_how_far(const char *dir, unsigned how)
{
	size_t n = 6 * WQ_BUF;
	uint8_t *p = pattern(n, 3);
	char path[256];
	int fd = make_file(dir, path, sizeof(path));
	struct wq q;

	assert_true(fd >= 0);
	assert_int_equal(wq_open(&q), 0);
	wq_begin(&q, fd, n, how);
	assert_int_equal(q.mapped, (how & WQ_MAP_OK) != 0);
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

static void test_sync_says_how_far(void **state)
{
	sync_says_how_far(dirs[0], WQ_DIRECT_OK);
	sync_says_how_far(dirs[1], WQ_MAP_OK);
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
	wq_begin(&q, ro, 3 * WQ_BUF, WQ_DIRECT_OK);
	b = wq_buf(&q);
	memset(q.buf[b], 1, WQ_BUF);
	wq_write(&q, b, WQ_BUF, 0);
	assert_int_equal(wq_drain(&q), -EBADF);
	b = wq_buf(&q);
	assert_int_equal(wq_write(&q, b, WQ_BUF, WQ_BUF), -EBADF);
	assert_int_equal(wq_end(&q), -EBADF);
	/* The next file starts clean. */
	wq_begin(&q, fd, 10, WQ_DIRECT_OK);
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
		wq_begin(&q, fd, 3 * WQ_BUF, WQ_DIRECT_OK);
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

/* Threads of this process named name. */
static int threads_named(const char *name)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *de;
	int count = 0;

	assert_non_null(d);
	while ((de = readdir(d))) {
		char path[300], comm[64] = "";
		FILE *f;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", de->d_name);
		if (!(f = fopen(path, "r")))
			continue;
		if (fgets(comm, sizeof(comm), f) && strncmp(comm, name, strlen(name)) == 0)
			count++;
		fclose(f);
	}
	closedir(d);
	return count;
}

/* On a tmpfs, with WQ_MAP_OK: files of two buffers or more are mapped and
 * come out exactly as written, in whole or odd pieces; smaller ones, and a
 * file opened write-only (which cannot be mapped shared for writing), go
 * through the ring and come out the same. The copiers start with the first
 * mapped file and end with the queue. */
static void test_mapped(void **state)
{
	static const size_t sizes[] = { 100, 2 * WQ_BUF - 1, 2 * WQ_BUF, 2 * WQ_BUF + 4095,
					9 * WQ_BUF + 17 };
	static const size_t pieces[] = { WQ_BUF, WQ_BUF - 4095, 3 * 4096 + 1 };
	struct wq q;

	assert_int_equal(wq_open(&q), 0);
	assert_int_equal(threads_named("wq copy"), 0);
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		for (size_t k = 0; k < sizeof(pieces) / sizeof(pieces[0]); k++) {
			uint8_t *p = pattern(sizes[i], (unsigned)(i * 3 + k));
			bool direct, mapped;

			write_and_check(&q, dirs[1], p, sizes[i], pieces[k], WQ_DIRECT_OK | WQ_MAP_OK,
					&direct, &mapped);
			assert_int_equal(mapped, sizes[i] >= 2 * WQ_BUF);
			free(p);
		}
	assert_int_equal(threads_named("wq copy"), WQ_DEPTH);
	/* Write-only: not mapped, written all the same. */
	{
		size_t n = 4 * WQ_BUF + 5;
		uint8_t *p = pattern(n, 99), *back = malloc(n);
		char path[256];
		int fd = make_file(dirs[1], path, sizeof(path)), wo = open(path, O_WRONLY);
		bool mapped;

		assert_true(fd >= 0 && wo >= 0);
		assert_int_equal(write_all(&q, wo, p, n, WQ_BUF, WQ_MAP_OK, &mapped), 0);
		assert_false(mapped);
		assert_int_equal(wq_end(&q), 0);
		assert_int_equal(pread(fd, back, n, 0), (ssize_t)n);
		assert_memory_equal(back, p, n);
		close(wo);
		close(fd);
		unlink(path);
		free(back);
		free(p);
	}
	wq_close(&q);
	assert_int_equal(threads_named("wq copy"), 0);
}

/* A tmpfs too small for the file: ENOSPC (a copy into a mapping past the
 * room would have been a SIGBUS), and the file system has room again once
 * the file is gone; a file that fits goes on in the same queue. Needs a
 * tmpfs of its own (a mount: root); said and skipped otherwise. */
static void test_mapped_no_room(void **state)
{
	char dir[] = "/var/tmp/test_wq_small.XXXXXX", path[300];
	size_t big = 12 * WQ_BUF, fits = 3 * WQ_BUF;
	uint8_t *p = pattern(big, 11), *back = malloc(big);
	struct statvfs sv;
	struct wq q;
	bool mapped;
	int fd;

	assert_non_null(mkdtemp(dir));
	if (mount("tmpfs", dir, "tmpfs", 0, "size=8m") < 0) {
		fprintf(stderr, "# test_mapped_no_room not run: cannot mount a tmpfs at %s: %s\n",
			dir, strerror(errno));
		rmdir(dir);
		free(back);
		free(p);
		skip();
	}
	assert_int_equal(wq_open(&q), 0);
	snprintf(path, sizeof(path), "%s/big", dir);
	fd = open(path, O_RDWR | O_CREAT, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write_all(&q, fd, p, big, WQ_BUF, WQ_DIRECT_OK | WQ_MAP_OK, &mapped),
			 -ENOSPC);
	assert_true(mapped);
	assert_int_equal(wq_end(&q), -ENOSPC);
	close(fd);
	unlink(path);
	assert_int_equal(statvfs(dir, &sv), 0);
	assert_true((uint64_t)sv.f_bavail * sv.f_frsize >= 7 * (uint64_t)WQ_BUF);
	snprintf(path, sizeof(path), "%s/fits", dir);
	fd = open(path, O_RDWR | O_CREAT, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write_all(&q, fd, p, fits, WQ_BUF, WQ_MAP_OK, &mapped), 0);
	assert_true(mapped);
	assert_int_equal(wq_end(&q), 0);
	assert_int_equal(pread(fd, back, fits, 0), (ssize_t)fits);
	assert_memory_equal(back, p, fits);
	close(fd);
	wq_close(&q);
	assert_int_equal(umount(dir), 0);
	rmdir(dir);
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
		cmocka_unit_test(test_mapped),
		cmocka_unit_test(test_mapped_no_room),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
