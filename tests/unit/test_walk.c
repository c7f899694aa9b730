/* The merge walk: order is the manifest's component order, every name is
 * seen once with the right side, and special files are typed '?'. */
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

#include "common/manifest.h"
#include "daemon/fs/walk.h"

static char top[] = "/tmp/test_walk.XXXXXX";

static void put(const char *tree, const char *rel, char type)
{
	char p[PATH_MAX];
	int fd;

	snprintf(p, sizeof(p), "%s/%s/%s", top, tree, rel);
	if (type == 'd') {
		assert_int_equal(mkdir(p, 0755), 0);
	} else if (type == 'l') {
		assert_int_equal(symlink("target", p), 0);
	} else if (type == 'p') {
		assert_int_equal(mkfifo(p, 0600), 0);
	} else {
		fd = open(p, O_CREAT | O_WRONLY, 0644);
		assert_true(fd >= 0);
		close(fd);
	}
}

static int setup(void **state)
{
	assert_non_null(mkdtemp(top));
	put("", "src", 'd');
	put("", "dst", 'd');
	/* Names chosen so that plain strcmp of whole paths would disagree
	 * with a depth-first walk: '.' (0x2e) sorts before '/' (0x2f). */
	put("src", "a", 'd');
	put("src", "a/b", 'f');
	put("src", "a.txt", 'f');
	put("src", "a0", 'f');
	put("src", "\xff", 'f');
	put("src", "link", 'l');
	put("src", "fifo", 'p');
	put("src", ".stage", 'd');        /* top-level .stage is never reported */
	put("dst", "a", 'd');
	put("dst", "a/old", 'f');
	put("dst", "a.txt", 'd');         /* other type on the other side */
	put("dst", "gone", 'f');
	put("dst", ".stage", 'd');
	return 0;
}

static int teardown(void **state)
{
	char cmd[PATH_MAX + 16];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", top);
	return system(cmd);
}

static int opendir_at(const char *rel)
{
	char p[PATH_MAX];

	snprintf(p, sizeof(p), "%s/%s", top, rel);
	return open(p, O_RDONLY | O_DIRECTORY);
}

static void test_order_and_sides(void **state)
{
	static const struct { const char *rel; enum walk_side side; char type, other; } want[] = {
		{ "a", WALK_BOTH, 'd', 'd' },
		{ "a/b", WALK_SRC, 'f', 0 },
		{ "a/old", WALK_OTHER, 0, 'f' },
		{ "a.txt", WALK_BOTH, 'f', 'd' },
		{ "a0", WALK_SRC, 'f', 0 },
		{ "fifo", WALK_SRC, '?', 0 },
		{ "gone", WALK_OTHER, 0, 'f' },
		{ "link", WALK_SRC, 'l', 0 },
		{ "\xff", WALK_SRC, 'f', 0 },
	};
	int src = opendir_at("src"), dst = opendir_at("dst");
	char prev[MF_MAX_PATH] = "";
	struct walk *w;
	struct walk_ent e;
	size_t i = 0;
	int ret;

	assert_int_equal(walk_open(&w, src, dst, 0), 0);
	while ((ret = walk_next(w, &e)) == 1) {
		assert_true(i < sizeof(want) / sizeof(want[0]));
		assert_string_equal(e.rel, want[i].rel);
		assert_int_equal(e.side, want[i].side);
		assert_int_equal(e.type, want[i].type);
		assert_int_equal(e.other_type, want[i].other);
		if (i)
			assert_true(mf_path_cmp(prev, e.rel) < 0);
		strcpy(prev, e.rel);
		i++;
	}
	assert_int_equal(ret, 0);
	assert_int_equal(i, sizeof(want) / sizeof(want[0]));
	walk_close(w);
	close(src);
	close(dst);
}

static void test_skip(void **state)
{
	int src = opendir_at("src");
	struct walk *w;
	struct walk_ent e;
	int n = 0;

	assert_int_equal(walk_open(&w, src, -1, 0), 0);
	while (walk_next(w, &e) == 1) {
		assert_string_not_equal(e.rel, "a/b");
		if (e.type == 'd')
			walk_skip(w);
		n++;
	}
	assert_int_equal(n, 6);     /* a, a.txt, a0, fifo, link, \xff */
	walk_close(w);
	close(src);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_order_and_sides),
		cmocka_unit_test(test_skip),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
