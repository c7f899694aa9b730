/* The copier on real files: digests equal XXH3-128 of the content (whole
 * and per chunk), the temporary holds exactly the source, a budget smaller
 * than one file still finishes (reads stall, never fail), a hash-only file
 * writes nothing, and a source that cannot be opened fails only itself. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
#include <xxhash.h>

#include "daemon/engine/bufpool.h"
#include "daemon/engine/copier.h"
#include "daemon/engine/pcache.h"

static char top[] = "/tmp/test_copier.XXXXXX";
static int src_fd, dst_fd;

static uint8_t *pattern(size_t n, unsigned seed)
{
	uint8_t *p = malloc(n ? n : 1);

	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)((i * 2654435761u + seed) >> 13);
	return p;
}

static void write_file(const char *name, const uint8_t *p, size_t n)
{
	int fd = openat(src_fd, name, O_CREAT | O_TRUNC | O_WRONLY, 0640);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, p, n), (ssize_t)n);
	close(fd);
}

static int setup(void **state)
{
	char p[PATH_MAX];

	assert_non_null(mkdtemp(top));
	snprintf(p, sizeof(p), "%s/src", top);
	mkdir(p, 0755);
	src_fd = open(p, O_RDONLY | O_DIRECTORY);
	snprintf(p, sizeof(p), "%s/dst", top);
	mkdir(p, 0755);
	dst_fd = open(p, O_RDONLY | O_DIRECTORY);
	return src_fd < 0 || dst_fd < 0;
}

static int teardown(void **state)
{
	char cmd[PATH_MAX + 16];

	close(src_fd);
	close(dst_fd);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", top);
	return system(cmd);
}

static int done_count;

static void on_done(struct cp_file *f, void *arg)
{
	done_count++;
}

static void run_all(struct copier *c)
{
	while (copier_inflight(c))
		assert_true(copier_run(c, 1000, on_done, NULL) >= 0);
}

static int64_t mtime_of(const char *name)
{
	struct stat st;

	assert_int_equal(fstatat(src_fd, name, &st, 0), 0);
	return (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
}

static void check_copy(uint64_t memory, uint64_t io, size_t size)
{
	struct copier_opts o = { .memory = memory, .io_size = io, .chunk_size = 65536,
				 .direct_min = 1 << 20, .max_files = 4, .depth = 4, .fsync = true };
	uint8_t *data = pattern(size, (unsigned)size), *back = malloc(size + 1);
	struct cp_file f = { 0 };
	struct copier *c;
	struct stat st;
	int fd;

	write_file("in", data, size);
	f = (struct cp_file){ .src_at = src_fd, .src = "in", .dst = ".tmp", .size = size, .mtime_ns = mtime_of("in"),
			      .mode = 0604 };
	assert_int_equal(copier_create(&c, dst_fd, &o), 0);
	done_count = 0;
	assert_int_equal(copier_start(c, &f), 0);
	run_all(c);
	assert_int_equal(done_count, 1);
	assert_int_equal(f.err, 0);
	assert_true(digest_eq(f.digest, XXH3_128bits(data, size)));
	assert_int_equal(f.nchunks, size > 65536 ? (size + 65535) / 65536 : 0);
	for (uint64_t i = 0; i < f.nchunks; i++) {
		size_t n = size - i * 65536 < 65536 ? size - i * 65536 : 65536;

		assert_true(digest_eq(f.chunks[i], XXH3_128bits(data + i * 65536, n)));
	}
	fd = openat(dst_fd, ".tmp", O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(st.st_size, size);
	assert_int_equal(st.st_mode & 07777, 0604);
	assert_int_equal((int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec,
			 f.mtime_ns);
	assert_int_equal(read(fd, back, size + 1), (ssize_t)size);
	assert_memory_equal(back, data, size);
	close(fd);
	unlinkat(dst_fd, ".tmp", 0);
	copier_release(&f);
	copier_destroy(c);
	free(data);
	free(back);
}

static void test_sizes(void **state)
{
	check_copy(1 << 20, 65536, 0);
	check_copy(1 << 20, 65536, 1);
	check_copy(1 << 20, 65536, 65536);
	check_copy(1 << 20, 65536, 65537);
	/* Large enough for O_DIRECT (where the file system allows it), odd tail. */
	check_copy(8 << 20, 1 << 20, (3 << 20) + 4097);
}

static void test_tiny_budget(void **state)
{
	/* One 64 KiB buffer for a 1 MiB file of depth 4: reads wait their turn. */
	check_copy(65536, 65536, (1 << 20) + 3);
}

static void test_hash_only_and_missing(void **state)
{
	struct copier_opts o = { .memory = 1 << 20, .io_size = 65536, .chunk_size = 65536,
				 .direct_min = 1 << 30, .max_files = 8, .depth = 2 };
	uint8_t *data = pattern(200000, 7);
	struct cp_file a, b;
	struct copier *c;

	write_file("h", data, 200000);
	a = (struct cp_file){ .src_at = src_fd, .src = "h", .size = 200000, .mtime_ns = mtime_of("h") };
	b = (struct cp_file){ .src_at = src_fd, .src = "missing", .dst = ".tmp2", .size = 10 };
	assert_int_equal(copier_create(&c, dst_fd, &o), 0);
	done_count = 0;
	assert_int_equal(copier_start(c, &a), 0);
	assert_int_equal(copier_start(c, &b), 0);
	run_all(c);
	assert_int_equal(done_count, 2);
	assert_int_equal(a.err, 0);
	assert_true(digest_eq(a.digest, XXH3_128bits(data, 200000)));
	assert_int_equal(b.err, -ENOENT);
	assert_false(b.err_dst);
	/* The failed file's temporary is gone. */
	assert_int_equal(faccessat(dst_fd, ".tmp2", F_OK, 0), -1);
	copier_release(&a);
	copier_release(&b);
	copier_destroy(c);
	free(data);
}

static void test_changed_while_copying(void **state)
{
	struct copier_opts o = { .memory = 1 << 20, .io_size = 65536, .chunk_size = 65536,
				 .direct_min = 1 << 30, .max_files = 8, .depth = 2 };
	uint8_t *data = pattern(1000, 3);
	struct cp_file f;
	struct copier *c;

	write_file("m", data, 1000);
	/* The walk saw another mtime: what we read is not what it saw. */
	f = (struct cp_file){ .src_at = src_fd, .src = "m", .dst = ".tmp3", .size = 1000, .mtime_ns = mtime_of("m") - 1 };
	assert_int_equal(copier_create(&c, dst_fd, &o), 0);
	assert_int_equal(copier_start(c, &f), 0);
	run_all(c);
	assert_int_equal(f.err, -ESTALE);
	assert_int_equal(faccessat(dst_fd, ".tmp3", F_OK, 0), -1);
	copier_release(&f);
	copier_destroy(c);
	free(data);
}

/* A cold file the cache budget covers is read through the page cache (so
 * that a reader right after finds it there), one the budget no longer
 * covers with O_DIRECT; the budget is what the files read that way did not
 * take. Without a budget every cold file stays cold. On /var/tmp: a tmpfs
 * cannot drop a file from its cache (then the test says so and skips). */
static bool cold_file(int dir, const char *name, const uint8_t *p, size_t n)
{
	int fd = openat(dir, name, O_CREAT | O_TRUNC | O_RDWR, 0640);
	bool cold;

	assert_true(fd >= 0);
	assert_int_equal(write(fd, p, n), (ssize_t)n);
	assert_int_equal(fdatasync(fd), 0);
	assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
	cold = !pcache_warm(fd, 0, n);
	close(fd);
	return cold;
}

static unsigned hash_cold_files(int dir, uint64_t *budget)
{
	struct copier_opts o = { .memory = 8 << 20, .io_size = 1 << 20, .chunk_size = 1 << 20,
				 .direct_min = 2 << 20, .max_files = 8, .depth = 4,
				 .cache_budget = budget };
	const size_t n = 4 << 20;
	const char *names[] = { "c0", "c1", "c2" };
	uint8_t *data = pattern(n, 11);
	struct cp_file f[3];
	struct copier *c;
	unsigned warm = 0;

	assert_int_equal(copier_create(&c, -1, &o), 0);
	for (int i = 0; i < 3; i++) {
		struct stat st;

		assert_true(cold_file(dir, names[i], data, n));
		assert_int_equal(fstatat(dir, names[i], &st, 0), 0);
		f[i] = (struct cp_file){ .src_at = dir, .src = names[i], .size = n,
					 .mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000LL +
						     st.st_mtim.tv_nsec };
		assert_int_equal(copier_start(c, &f[i]), 0);
	}
	run_all(c);
	for (int i = 0; i < 3; i++) {
		int fd = openat(dir, names[i], O_RDONLY);

		assert_int_equal(f[i].err, 0);
		assert_true(digest_eq(f[i].digest, XXH3_128bits(data, n)));
		assert_true(fd >= 0);
		warm += pcache_warm(fd, 0, n);
		close(fd);
		copier_release(&f[i]);
	}
	copier_destroy(c);
	free(data);
	return warm;
}

static void test_cache_budget(void **state)
{
	char top2[] = "/var/tmp/test_copier.XXXXXX", cmd[64];
	uint64_t budget = 9 << 20;
	uint8_t probe[8192] = { 1 };
	int dir;
	bool can;

	assert_non_null(mkdtemp(top2));
	dir = open(top2, O_RDONLY | O_DIRECTORY);
	assert_true(dir >= 0);
	can = cold_file(dir, "probe", probe, sizeof(probe));
	if (can) {
		assert_int_equal(hash_cold_files(dir, NULL), 0);
		assert_int_equal(hash_cold_files(dir, &budget), 2);
		assert_int_equal(budget, 1 << 20);
	}
	close(dir);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", top2);
	assert_int_equal(system(cmd), 0);
	if (!can) {
		print_message("/var/tmp cannot drop a file from the page cache here: not run\n");
		skip();
	}
}

static void test_bufpool(void **state)
{
	struct bufpool bp;
	uint32_t cap;
	void *a, *b, *c;

	bufpool_init(&bp, 3 * 4096);
	a = bufpool_get(&bp, 100, &cap);
	assert_non_null(a);
	assert_int_equal(cap, 4096);
	b = bufpool_get(&bp, 8000, &cap);
	assert_int_equal(cap, 8192);
	assert_null(bufpool_get(&bp, 4096, &cap));      /* budget spent */
	assert_false(bufpool_room(&bp, 4096));
	bufpool_put(&bp, a, 4096);
	c = bufpool_get(&bp, 4096, &cap);               /* the cached one comes back */
	assert_ptr_equal(c, a);
	bufpool_put(&bp, c, 4096);
	bufpool_put(&bp, b, 8192);
	assert_int_equal(bp.live, 0);
	bufpool_destroy(&bp);
	/* A bigger class evicts cached ones to fit; used never tops the budget. */
	bufpool_init(&bp, 16384);
	a = bufpool_get(&bp, 4096, &cap);
	bufpool_put(&bp, a, cap);
	a = bufpool_get(&bp, 16384, &cap);
	assert_non_null(a);
	assert_true(bp.used <= bp.budget);
	bufpool_put(&bp, a, cap);
	bufpool_destroy(&bp);
	assert_int_equal(bp.used, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sizes),
		cmocka_unit_test(test_tiny_budget),
		cmocka_unit_test(test_hash_only_and_missing),
		cmocka_unit_test(test_cache_budget),
		cmocka_unit_test(test_changed_while_copying),
		cmocka_unit_test(test_bufpool),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
