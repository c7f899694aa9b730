/* fsprobe: which mount a path is under, by the text of a mountinfo table
 * (nested mounts, one mounted over another, escaped names, ".." that the
 * text cannot take), and a probe of a file system that answers: at once,
 * for a path that exists or not, again and again from one slot. A file
 * system that does not answer is the integration test's (faultfs hang). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "common/clock.h"
#include "daemon/fs/fsprobe.h"

static const char table[] =
	"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
	"30 22 0:25 / /mnt rw shared:2 - tmpfs tmpfs rw\n"
	"31 30 0:44 / /mnt/nfs rw shared:3 - nfs4 srv:/export rw\n"
	"32 31 0:45 / /mnt/nfs/scratch rw shared:4 - nfs4 srv:/scratch rw\n"
	"33 30 0:46 / /mnt/my\\040data rw shared:5 - fuse.x x rw\n"
	"34 30 0:47 / /mnt/nfs2 rw shared:6 - nfs4 srv:/b rw\n"
	"35 31 0:48 / /mnt/nfs rw shared:7 - nfs4 srv:/over rw\n";

static void check(const char *path, const char *want)
{
	char out[256];

	assert_int_equal(fsprobe_mount_of(table, path, out, sizeof(out)), 0);
	assert_string_equal(out, want);
}

static void test_mount_of(void **state)
{
	check("/", "/");
	check("/home/u/x", "/");
	check("/mnt", "/mnt");
	check("/mnt/nfs", "/mnt/nfs");
	check("/mnt/nfs/data/set", "/mnt/nfs");
	check("/mnt/nfs/scratch/a", "/mnt/nfs/scratch");
	check("/mnt/nfs2/a", "/mnt/nfs2");           /* not /mnt/nfs: a component, not a prefix */
	check("/mnt/nfsx", "/mnt");
	check("/mnt/my data/set", "/mnt/my data");    /* \040 in the table */
	check("//mnt//nfs/./data/", "/mnt/nfs");      /* the text made normal first */
	check("/mnt/nfs/../nfs2/a", "/");             /* ".." is not the text's to take */
}

static void test_mount_of_bad_input(void **state)
{
	char out[8];

	/* A table line with too few fields counts for nothing. */
	assert_int_equal(fsprobe_mount_of("junk\n\n1 2 3\n", "/a", out, sizeof(out)), 0);
	assert_string_equal(out, "/");
	assert_int_equal(fsprobe_mount_of(table, "/mnt/nfs/x", out, 4), -ENAMETOOLONG);
	assert_int_equal(fsprobe_mount_of(table, "/mnt/nfs/x", out, 1), -ENAMETOOLONG);
}

static void test_answers(void **state)
{
	char why[256] = "";
	uint64_t t0 = mono_ns();

	for (int i = 0; i < 50; i++) {
		assert_int_equal(fsprobe_answers("/tmp", 1000, NULL, NULL, why, sizeof(why)), 0);
		assert_int_equal(fsprobe_answers("/tmp/no/such/dir", 1000, NULL, NULL, why,
						 sizeof(why)), 0);
		assert_int_equal(fsprobe_answers("relative", 1000, NULL, NULL, why, sizeof(why)), 0);
	}
	assert_true(mono_ns() - t0 < 5000000000ull);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_mount_of),
		cmocka_unit_test(test_mount_of_bad_input),
		cmocka_unit_test(test_answers),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
