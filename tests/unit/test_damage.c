/* The record a deep verify leaves (daemon/pull/damage.h), on a real
 * directory: what is written is what is loaded (chunk runs, names that
 * need escaping, an unreadable file, a file named whole), "since" is the
 * kernel's ctime of the record, so a file changed after it has a ctime
 * at least as large; a record cut off, of another manifest (the manifest
 * rewritten), or given up is not used; the last complete record survives
 * a record given up; a record naming more than DAMAGE_MAX files is not
 * used; and a hostile record (signs, numbers past 2^48, ranges that would
 * expand to gigabytes, a since later than the file itself, a fifo in its
 * place) is refused at once, without hanging or allocating without end. */
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

#include "daemon/pull/damage.h"

static char dir[64];
static int dfd;

static int setup(void **state)
{
	snprintf(dir, sizeof(dir), "/var/tmp/test_damage.XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	dfd = open(dir, O_RDONLY | O_DIRECTORY);
	return dfd < 0 ? -1 : 0;
}

static int teardown(void **state)
{
	char cmd[128];

	close(dfd);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

static void write_manifest(const char *text)
{
	int fd = openat(dfd, "manifest", O_WRONLY | O_CREAT | O_TRUNC, 0644);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

static int64_t ctime_ns(const char *name)
{
	struct stat st;

	assert_int_equal(fstatat(dfd, name, &st, 0), 0);
	return (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
}

static void test_round_trip(void **state)
{
	static const uint64_t bad[] = { 0, 1, 2, 7, 9, 10 };
	struct damage w = { 0 }, r;
	const struct damage_ent *e;
	int fd;

	write_manifest("m1\n");
	assert_int_equal(damage_start(&w, dfd, "manifest"), 0);
	damage_add(&w, "a/model.pt", 11, 1234, false, bad, 6);
	damage_add(&w, "b c/%odd\nname", 12, 99, false, NULL, 0);
	damage_add(&w, "gone.bin", 13, 5, true, NULL, 0);
	assert_int_equal(damage_commit(&w), 0);
	{
		char tmp[40];

		snprintf(tmp, sizeof(tmp), "damage.new.%ld", (long)gettid());
		assert_int_equal(faccessat(dfd, tmp, F_OK, 0), -1);
	}

	assert_int_equal(damage_load(&r, dfd, "manifest"), 0);
	assert_int_equal(r.since, w.since);
	assert_int_equal(r.n, 3);
	e = damage_find(&r, "a/model.pt");
	assert_non_null(e);
	assert_int_equal(e->ino, 11);
	assert_int_equal(e->ctime_ns, 1234);
	assert_false(e->unreadable);
	assert_int_equal(e->nbad, 6);
	assert_memory_equal(e->bad, bad, sizeof(bad));
	e = damage_find(&r, "b c/%odd\nname");
	assert_non_null(e);
	assert_int_equal(e->nbad, 0);
	e = damage_find(&r, "gone.bin");
	assert_non_null(e);
	assert_true(e->unreadable);
	assert_null(damage_find(&r, "a"));
	damage_free(&r);

	/* A file changed after the record began has a ctime at least since. */
	fd = openat(dfd, "later", O_WRONLY | O_CREAT, 0644);
	assert_true(fd >= 0);
	close(fd);
	assert_true(ctime_ns("later") >= w.since);
}

static void test_what_is_not_used(void **state)
{
	struct damage w = { 0 }, r;
	char text[4096];
	ssize_t n;
	int fd;

	write_manifest("m2\n");
	assert_int_equal(damage_start(&w, dfd, "manifest"), 0);
	damage_add(&w, "x", 1, 2, false, NULL, 0);
	assert_int_equal(damage_commit(&w), 0);
	assert_int_equal(damage_load(&r, dfd, "manifest"), 0);
	damage_free(&r);

	/* Given up: the last complete one stays. */
	assert_int_equal(damage_start(&w, dfd, "manifest"), 0);
	damage_add(&w, "y", 1, 2, false, NULL, 0);
	damage_abort(&w);
	assert_int_equal(damage_load(&r, dfd, "manifest"), 0);
	assert_non_null(damage_find(&r, "x"));
	assert_null(damage_find(&r, "y"));
	damage_free(&r);

	/* Cut off before its last line. */
	fd = openat(dfd, "damage", O_RDWR);
	n = read(fd, text, sizeof(text));
	assert_true(n > 4);
	assert_int_equal(ftruncate(fd, n - 4), 0);
	close(fd);
	assert_int_equal(damage_load(&r, dfd, "manifest"), -ENOENT);

	/* Of another manifest: the step committed again since. */
	assert_int_equal(damage_start(&w, dfd, "manifest"), 0);
	assert_int_equal(damage_commit(&w), 0);
	assert_int_equal(damage_load(&r, dfd, "manifest"), 0);
	damage_free(&r);
	write_manifest("m3, rewritten\n");
	assert_int_equal(damage_load(&r, dfd, "manifest"), -ENOENT);

	/* None, or removed. */
	damage_remove(dfd);
	assert_int_equal(damage_load(&r, dfd, "manifest"), -ENOENT);
	assert_int_equal(damage_load(&r, dfd, "no-such-manifest"), -ENOENT);
}

static void test_bounded(void **state)
{
	struct damage w = { 0 }, r;
	uint64_t *many = malloc(200000 * sizeof(*many));
	char name[32];

	write_manifest("m4\n");
	/* A chunk list too long for a line: the file is named whole. */
	for (uint64_t i = 0; i < 200000; i++)
		many[i] = 2 * i;
	assert_int_equal(damage_start(&w, dfd, "manifest"), 0);
	damage_add(&w, "big", 1, 2, false, many, 200000);
	assert_int_equal(damage_commit(&w), 0);
	assert_int_equal(damage_load(&r, dfd, "manifest"), 0);
	assert_int_equal(damage_find(&r, "big")->nbad, 0);
	damage_free(&r);
	/* More files than a loaded record keeps: not used. */
	assert_int_equal(damage_start(&w, dfd, "manifest"), 0);
	for (int i = 0; i <= DAMAGE_MAX; i++) {
		snprintf(name, sizeof(name), "f%06d", i);
		damage_add(&w, name, 1, 2, true, NULL, 0);
	}
	assert_int_equal(damage_commit(&w), 0);
	assert_int_equal(damage_load(&r, dfd, "manifest"), -ENOENT);
	free(many);
}

/* A record as given, under the manifest written just before: the header
 * made from a real start (so its manifest line is right), then body. */
static int load_raw(const char *body, int64_t since_shift)
{
	struct damage w = { 0 }, r;
	char path[96], head[512];
	FILE *f;
	int rc;

	assert_int_equal(damage_start(&w, dfd, "manifest"), 0);
	assert_int_equal(damage_commit(&w), 0);
	f = fdopen(openat(dfd, "damage", O_RDONLY), "r");
	assert_non_null(f);
	assert_non_null(fgets(head, sizeof(head), f));           /* magic */
	assert_non_null(fgets(head + strlen(head), 200, f));     /* manifest */
	fclose(f);
	snprintf(path, sizeof(path), "%s/damage", dir);
	f = fopen(path, "w");
	fprintf(f, "%ssince %lld\n%send\n", head, (long long)(w.since + since_shift), body);
	fclose(f);
	rc = damage_load(&r, dfd, "manifest");
	if (rc == 0)
		damage_free(&r);
	return rc;
}

static void test_hostile_records(void **state)
{
	char *many = malloc(20 * 70000), *p;
	char path[96];
	struct damage r;

	write_manifest("m5\n");
	assert_int_equal(load_raw("damaged 1 2 0-3,7 ok\n", 0), 0);        /* the control */
	assert_int_equal(load_raw("damaged 1 2 -1 x\n", 0), -ENOENT);
	assert_int_equal(load_raw("damaged 1 2 0--1 x\n", 0), -ENOENT);
	assert_int_equal(load_raw("damaged 1 2 0-18446744073709551615 x\n", 0), -ENOENT);
	assert_int_equal(load_raw("damaged 1 2 99999999999999999999 x\n", 0), -ENOENT);
	assert_int_equal(load_raw("damaged 1 2 5,3 x\n", 0), -ENOENT);     /* not ascending */
	assert_int_equal(load_raw("damaged 1 2 3\n", 0), -ENOENT);         /* no path */
	assert_int_equal(load_raw("broken 1 2 3 x\n", 0), -ENOENT);
	/* Short lines that would expand past what a record may hold. */
	p = many;
	for (int i = 0; i < 40; i++)
		p += sprintf(p, "damaged 1 2 0-65000 f%d\n", i);
	assert_int_equal(load_raw(many, 0), -ENOENT);
	/* A since later than the record file's own ctime: not one we wrote. */
	assert_int_equal(load_raw("", 1000000000000ll), -ENOENT);
	assert_int_equal(load_raw("", 0), 0);
	/* A fifo where the record belongs: refused, not waited on. */
	snprintf(path, sizeof(path), "%s/damage", dir);
	unlink(path);
	assert_int_equal(mkfifo(path, 0644), 0);
	assert_int_equal(damage_load(&r, dfd, "manifest"), -ENOENT);
	unlink(path);
	free(many);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_what_is_not_used),
		cmocka_unit_test(test_bounded),
		cmocka_unit_test(test_hostile_records),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
