/* Page-cache residency on a real file (/var/tmp): a file just written
 * (dirty) is warm; once written back and dropped from the cache
 * (POSIX_FADV_DONTNEED) it is cold; read through the cache it is warm
 * again, and only the part read is; an empty range is never warm. The
 * mincore fall-back agrees where it can see (it cannot see dirty pages as
 * such: they are resident). */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/engine/pcache.h"

#define SIZE (8u << 20)

static void test_warm_cold_warm(void **state)
{
	char path[] = "/var/tmp/test_pcache.XXXXXX";
	int fd = mkstemp(path);
	uint8_t *buf = malloc(SIZE);

	assert_true(fd >= 0);
	memset(buf, 0x5a, SIZE);
	assert_int_equal(pwrite(fd, buf, SIZE, 0), (ssize_t)SIZE);
	assert_true(pcache_warm(fd, 0, SIZE));          /* just written: dirty */
	assert_true(pcache_warm_mincore(fd, 0, SIZE));
	assert_int_equal(fdatasync(fd), 0);
	assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
	assert_false(pcache_warm(fd, 0, SIZE));         /* written back, dropped */
	assert_false(pcache_warm_mincore(fd, 0, SIZE));
	assert_int_equal(pread(fd, buf, SIZE / 4, 0), (ssize_t)(SIZE / 4));
	assert_true(pcache_warm(fd, 0, SIZE / 4));      /* the part read */
	assert_true(pcache_warm_mincore(fd, 0, SIZE / 4));
	assert_false(pcache_warm(fd, SIZE / 2, SIZE / 2));
	assert_false(pcache_warm_mincore(fd, SIZE / 2, SIZE / 2));
	assert_false(pcache_warm(fd, 0, 0));
	assert_false(pcache_warm_mincore(fd, 0, 0));
	close(fd);
	unlink(path);
	free(buf);
}

/* On an overlayfs mount (as a container's root is) a file just written is
 * warm too, and cold once dropped: cachestat of the overlay's file sees no
 * pages, so the answer comes from the file beneath. Needs root to mount
 * (else not run, and said so). */
static void test_overlay(void **state)
{
	char top[] = "/var/tmp/test_pcache_ovl.XXXXXX", p[4][256], opts[1024], file[300], cmd[300];
	uint8_t *buf = malloc(SIZE);
	bool mounted;
	int fd, err;

	assert_non_null(mkdtemp(top));
	for (int i = 0; i < 4; i++) {
		snprintf(p[i], sizeof(p[i]), "%s/%s", top, (const char *[]){ "lower", "upper",
			 "work", "merged" }[i]);
		assert_int_equal(mkdir(p[i], 0755), 0);
	}
	snprintf(opts, sizeof(opts), "lowerdir=%s,upperdir=%s,workdir=%s", p[0], p[1], p[2]);
	mounted = mount("overlay", p[3], "overlay", 0, opts) == 0;
	err = errno;
	if (mounted) {
		snprintf(file, sizeof(file), "%s/f", p[3]);
		fd = open(file, O_CREAT | O_RDWR, 0600);
		assert_true(fd >= 0);
		memset(buf, 0x3c, SIZE);
		assert_int_equal(pwrite(fd, buf, SIZE, 0), (ssize_t)SIZE);
		assert_true(pcache_warm(fd, 0, SIZE));          /* just written */
		assert_int_equal(fdatasync(fd), 0);
		assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
		assert_false(pcache_warm(fd, 0, SIZE));         /* dropped */
		assert_int_equal(pread(fd, buf, SIZE, 0), (ssize_t)SIZE);
		assert_true(pcache_warm(fd, 0, SIZE));          /* read back */
		close(fd);
		assert_int_equal(umount(p[3]), 0);
	}
	snprintf(cmd, sizeof(cmd), "rm -rf %s", top);
	assert_int_equal(system(cmd), 0);
	free(buf);
	if (!mounted) {
		print_message("cannot mount an overlay here (%s): not run\n", strerror(err));
		skip();
	}
}

/* What a commit may read into the cache is bounded by the memory the
 * kernel says is available: more than nothing on a running machine, and
 * never more than /proc/meminfo's MemAvailable. */
static void test_available(void **state)
{
	char line[128];
	unsigned long long kib = 0;
	FILE *f = fopen("/proc/meminfo", "re");
	uint64_t n = pcache_available();

	assert_non_null(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
			break;
	fclose(f);
	assert_true(kib > 0);
	assert_true(n > 0);
	assert_true(n <= (uint64_t)kib << 10 || n - ((uint64_t)kib << 10) < (64u << 20));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_warm_cold_warm),
		cmocka_unit_test(test_available),
		cmocka_unit_test(test_overlay),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
