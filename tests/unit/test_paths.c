/* Path safety: the lexical helpers, roots_pull / roots_local resolving real
 * paths (with real symlinks and "..") beneath the configured roots and
 * opening them, and treeops_mkdirs_beneath. */
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

#include "common/config.h"
#include "common/paths.h"
#include "daemon/fs/roots.h"
#include "daemon/fs/treeops.h"

static char top[] = "/tmp/test_paths.XXXXXX";
static struct stage_config cfg;

static void test_under(void **state)
{
	assert_true(paths_under("/a/b", "/a"));
	assert_true(paths_under("/a", "/a"));
	assert_false(paths_under("/ab", "/a"));
	assert_false(paths_under("/a", "/a/b"));
	assert_true(paths_under("/anything", "/"));
	assert_string_equal(paths_rel("/a/b/c", "/a"), "b/c");
	assert_string_equal(paths_rel("/a", "/a"), "");
	assert_string_equal(paths_rel("/x/y", "/"), "x/y");
	assert_null(paths_rel("/ab", "/a"));
}

static void test_normalize(void **state)
{
	char a[] = "//a/./b//c/", b[] = "/a/../b", c[] = "rel/x", d[] = "/", e[] = "/./.";

	assert_int_equal(paths_normalize(a, false), 0);
	assert_string_equal(a, "/a/b/c");
	assert_int_equal(paths_normalize(b, false), -EINVAL);
	assert_int_equal(paths_normalize(b, true), 0);
	assert_string_equal(b, "/a/../b");
	assert_int_equal(paths_normalize(c, true), -EINVAL);
	assert_int_equal(paths_normalize(d, false), 0);
	assert_string_equal(d, "/");
	assert_int_equal(paths_normalize(e, false), 0);
	assert_string_equal(e, "/");

	char *p = paths_absolute("/cwd/x", "../y/./z/");
	assert_string_equal(p, "/cwd/x/../y/z");
	free(p);
	p = paths_absolute("/cwd", "/abs//p");
	assert_string_equal(p, "/abs/p");
	free(p);
}

static void mk(const char *rel)
{
	char p[PATH_MAX];

	snprintf(p, sizeof(p), "%s/%s", top, rel);
	assert_int_equal(mkdir(p, 0755), 0);
}

static void ln(const char *target, const char *rel)
{
	char p[PATH_MAX];

	snprintf(p, sizeof(p), "%s/%s", top, rel);
	assert_int_equal(symlink(target, p), 0);
}

static int setup(void **state)
{
	char p[PATH_MAX];

	assert_non_null(mkdtemp(top));
	mk("src");
	mk("src/ds");
	mk("src/ds/sub");
	mk("outside");
	mk("stage");
	ln("../outside", "src/escape");      /* a symlink in the root leading out */
	ln("ds/sub", "src/inside");          /* one that stays in */
	assert_int_equal(config_defaults(&cfg), 0);
	snprintf(p, sizeof(p), "[paths]\nsource_roots = %s/src\nstage_root = %s/stage\n", top, top);
	assert_int_equal(config_parse(&cfg, p, strlen(p), "test.conf", NULL, 0), 0);
	return 0;
}

static int teardown(void **state)
{
	char cmd[PATH_MAX + 16];

	config_free(&cfg);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", top);
	return system(cmd);
}

/* FD is the directory PATH names (then closed). */
static void assert_opened(int fd, const char *path)
{
	struct stat a, b;

	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &a), 0);
	assert_int_equal(stat(path, &b), 0);
	assert_true(S_ISDIR(a.st_mode) && a.st_ino == b.st_ino && a.st_dev == b.st_dev);
	close(fd);
}

static int pull(const char *src, const char *dest, char **s, char **d)
{
	char a[PATH_MAX], b[PATH_MAX], why[1024] = "";
	int ret, fd;

	snprintf(a, sizeof(a), "%s/%s", top, src);
	if (dest)
		snprintf(b, sizeof(b), "%s/%s", top, dest);
	ret = roots_pull(&cfg, a, dest ? b : NULL, s, d, &fd, why, sizeof(why));
	if (ret < 0)
		assert_true(strlen(why) > 0);    /* every refusal says why */
	else
		assert_opened(fd, *s);
	return ret;
}

static void test_roots_pull(void **state)
{
	char *s, *d, want[PATH_MAX];

	assert_int_equal(pull("src/ds", NULL, &s, &d), 0);
	snprintf(want, sizeof(want), "%s/stage/ds", top);
	assert_string_equal(d, want);
	free(s);
	free(d);

	/* ".." that stays inside the root is fine; out of it is refused. */
	assert_int_equal(pull("src/ds/sub/..", NULL, &s, &d), 0);
	free(s);
	free(d);
	assert_int_equal(pull("src/ds/../../outside", NULL, &s, &d), -EPERM);
	/* A symlink leading out is resolved, then refused. */
	assert_int_equal(pull("src/escape", NULL, &s, &d), -EPERM);
	assert_int_equal(pull("src/inside", NULL, &s, &d), 0);
	snprintf(want, sizeof(want), "%s/stage/ds/sub", top);
	assert_string_equal(d, want);
	free(s);
	free(d);
	/* Missing source, destination outside the stage root or climbing out. */
	assert_int_equal(pull("src/nope", NULL, &s, &d), -ENOENT);
	assert_int_equal(pull("src/ds", "outside/x", &s, &d), -EPERM);
	assert_int_equal(pull("src/ds", "stage/../outside/x", &s, &d), -EPERM);
	assert_int_equal(pull("src/ds", "stage/new/../../x", &s, &d), -EINVAL);
	assert_int_equal(pull("src/ds", "stage", &s, &d), -EPERM);
	assert_int_equal(pull("src/ds", "stage/a/b", &s, &d), 0);
	snprintf(want, sizeof(want), "%s/stage/a/b", top);
	assert_string_equal(d, want);
	free(s);
	free(d);
}

static void test_roots_local(void **state)
{
	char a[PATH_MAX], why[1024], *p;
	int fd;

	snprintf(a, sizeof(a), "%s/stage/../src/ds", top);
	assert_int_equal(roots_local(&cfg, a, &p, &fd, why, sizeof(why)), -EPERM);
	snprintf(a, sizeof(a), "%s/stage/none", top);
	assert_int_equal(roots_local(&cfg, a, &p, &fd, why, sizeof(why)), -ENOENT);
	mk("stage/t");
	snprintf(a, sizeof(a), "%s/stage/t/", top);
	assert_int_equal(roots_local(&cfg, a, &p, &fd, why, sizeof(why)), 0);
	assert_opened(fd, p);
	free(p);
}

/* mkdir -p beneath a root's fd: creates what is missing, opens what exists,
 * and never passes a symlink or "..". */
static void test_mkdirs_beneath(void **state)
{
	char p[PATH_MAX];
	int root, fd;

	root = open(top, O_PATH | O_DIRECTORY | O_CLOEXEC);
	assert_true(root >= 0);
	fd = treeops_mkdirs_beneath(root, "ck/job/step", 0750);
	snprintf(p, sizeof(p), "%s/ck/job/step", top);
	assert_opened(fd, p);
	fd = treeops_mkdirs_beneath(root, "ck/job/step", 0750);    /* exists: opened */
	assert_opened(fd, p);
	/* src/escape is a link to ../outside: refused, and nothing made there. */
	fd = treeops_mkdirs_beneath(root, "src/escape/step", 0750);
	assert_true(fd == -ELOOP || fd == -ENOTDIR);
	snprintf(p, sizeof(p), "%s/outside/step", top);
	assert_int_equal(access(p, F_OK), -1);
	assert_int_equal(treeops_mkdirs_beneath(root, "ck/../../x", 0750), -EXDEV);
	close(root);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_under),
		cmocka_unit_test(test_normalize),
		cmocka_unit_test(test_roots_pull),
		cmocka_unit_test(test_roots_local),
		cmocka_unit_test(test_mkdirs_beneath),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
