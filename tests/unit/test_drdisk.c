/* The doctor's storage probes on real file systems: the disk (/var/tmp:
 * O_DIRECT) and a tmpfs (/dev/shm). A disk probe gives positive speeds,
 * writes `bytes` rounded up to a piece, stops when cancelled, names what is
 * wrong (a missing or unwritable dir, a full file system, whether found
 * before writing or mid-write) and leaves no file behind on any of those
 * paths. A source probe counts every entry of a generated tree and no more
 * (not through a symlink, not into a mount or a fifo), reads the largest
 * files first and no more than `bytes`, and leaves every file's and
 * directory's atime, mtime, ctime and content as they were.
 *
 * The cases that need their own file system (read-only, full) mount small
 * tmpfs instances in a mount namespace of the test's own, so nothing is
 * left mounted if it dies; without root they are skipped. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/doctor/dr_disk.h"

#define MiB (1ull << 20)

static bool private_mounts;             /* root, in a mount namespace of our own */

/* What a test made, for teardown to remove even when an assertion ended
 * the test half way. */
#define NCLEAN 8
static char made_dirs[NCLEAN][PATH_MAX], made_mounts[NCLEAN][PATH_MAX + 16];
static int nmade_dirs, nmade_mounts;

static void mkdtemp_in(char *out, size_t len, const char *dir)
{
	snprintf(out, len, "%s/test_drdisk.XXXXXX", dir);
	assert_non_null(mkdtemp(out));
	assert_true(nmade_dirs < NCLEAN);
	snprintf(made_dirs[nmade_dirs++], PATH_MAX, "%s", out);
}

static void made_mount(const char *dir)
{
	assert_true(nmade_mounts < NCLEAN);
	snprintf(made_mounts[nmade_mounts++], sizeof(made_mounts[0]), "%s", dir);
}

static int teardown(void **state)
{
	char cmd[PATH_MAX + 64];

	while (nmade_mounts)
		umount2(made_mounts[--nmade_mounts], MNT_DETACH);       /* gone already: fine */
	while (nmade_dirs) {
		const char *d = made_dirs[--nmade_dirs];

		chmod(d, 0700);
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d);
		if (system(cmd) != 0)
			return -1;
	}
	return 0;
}

/* Names in dir, "." and ".." aside. */
static int count_names(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	assert_non_null(d);
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

static void rm_rf(const char *path)
{
	char cmd[PATH_MAX + 32];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
	assert_int_equal(system(cmd), 0);
}

/* A tmpfs of its own at a fresh directory under /var/tmp. */
static void mount_tmpfs(char *dir, size_t len, const char *opts)
{
	mkdtemp_in(dir, len, "/var/tmp");
	assert_int_equal(mount("tmpfs", dir, "tmpfs", 0, opts), 0);
	made_mount(dir);
}

static void umount_tmpfs(const char *dir)
{
	assert_int_equal(umount2(dir, MNT_DETACH), 0);
	assert_int_equal(rmdir(dir), 0);
}

/* ---- the disk probe ---- */

static void probe_ok(const char *base, uint64_t bytes, uint64_t want, struct dr_disk *o)
{
	char dir[PATH_MAX];
	struct stat st;

	mkdtemp_in(dir, sizeof(dir), base);
	assert_int_equal(dr_disk_probe(dir, bytes, NULL, NULL, o), 0);
	assert_int_equal(o->err, 0);
	assert_string_equal(o->why, "");
	assert_int_equal(o->bytes, want);
	assert_true(o->write_Bps > 0);
	assert_true(o->read_Bps > 0);
	assert_true(o->total_bytes >= o->free_bytes);
	assert_true(o->free_bytes > 0);
	assert_int_equal(stat(dir, &st), 0);
	assert_true(o->dev == st.st_dev);
	assert_int_equal(count_names(dir), 0);
	assert_int_equal(rmdir(dir), 0);
}

static void test_probe_speeds(void **state)
{
	struct dr_disk o;

	probe_ok("/var/tmp", 8 * MiB, 8 * MiB, &o);
	/* The disk takes O_DIRECT (test_wq says so too). */
	assert_true(o.direct);
	probe_ok("/dev/shm", 8 * MiB, 8 * MiB, &o);
}

static void test_bytes_rounded_up(void **state)
{
	static const struct { uint64_t ask, want; } c[] = {
		{ 0, MiB }, { 1, MiB }, { MiB - 1, MiB }, { MiB, MiB }, { MiB + 1, 2 * MiB },
		{ 3 * MiB / 2, 2 * MiB }, { 3 * MiB, 3 * MiB },
	};
	struct dr_disk o;

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		probe_ok("/var/tmp", c[i].ask, c[i].want, &o);
		/* Below two pieces the write queue writes through the cache. */
		if (c[i].want < 2 * MiB)
			assert_false(o.direct);
	}
}

struct cancel_at {
	int calls, at;
};

static bool cancel_at(void *arg)
{
	struct cancel_at *c = arg;

	return ++c->calls >= c->at;
}

/* Cancelled before the file exists, while writing, before and while reading. */
static void test_cancel(void **state)
{
	char dir[PATH_MAX];
	struct dr_disk o;

	mkdtemp_in(dir, sizeof(dir), "/var/tmp");
	for (int at = 1; at <= 10; at++) {
		struct cancel_at c = { 0, at };

		assert_int_equal(dr_disk_probe(dir, 4 * MiB, cancel_at, &c, &o), -ECANCELED);
		assert_int_equal(o.err, -ECANCELED);
		assert_non_null(strstr(o.why, dir));
		assert_non_null(strstr(o.why, "cancelled"));
		assert_int_equal(count_names(dir), 0);
	}
	/* Polled once before the file, once a write (4), once before reading,
	 * once a read (4): a later cancel is never asked for. */
	{
		struct cancel_at c = { 0, 11 };

		assert_int_equal(dr_disk_probe(dir, 4 * MiB, cancel_at, &c, &o), 0);
		assert_int_equal(c.calls, 10);
	}
	assert_int_equal(rmdir(dir), 0);
}

static void test_missing_dir(void **state)
{
	struct dr_disk o;

	assert_int_equal(dr_disk_probe("/var/tmp/test_drdisk.missing/x", MiB, NULL, NULL, &o),
			 -ENOENT);
	assert_int_equal(o.err, -ENOENT);
	assert_non_null(strstr(o.why, "/var/tmp/test_drdisk.missing/x"));
	assert_non_null(strstr(o.why, "No such file or directory"));
	assert_true(o.write_Bps == 0 && o.read_Bps == 0);
}

static void test_unwritable_dir(void **state)
{
	char dir[PATH_MAX], file[PATH_MAX + 8];
	struct dr_disk o;
	int fd;

	/* A file where a directory should be. */
	mkdtemp_in(dir, sizeof(dir), "/var/tmp");
	snprintf(file, sizeof(file), "%s/f", dir);
	fd = open(file, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(dr_disk_probe(file, MiB, NULL, NULL, &o), -ENOTDIR);
	assert_non_null(strstr(o.why, file));
	assert_non_null(strstr(o.why, "Not a directory"));
	assert_int_equal(count_names(dir), 1);

	/* A directory we may not write to: root may, but not on a read-only mount. */
	if (geteuid() != 0) {
		assert_int_equal(chmod(dir, 0500), 0);
		assert_int_equal(dr_disk_probe(dir, MiB, NULL, NULL, &o), -EACCES);
		assert_non_null(strstr(o.why, dir));
		assert_non_null(strstr(o.why, "Permission denied"));
		assert_int_equal(chmod(dir, 0700), 0);
	}
	assert_int_equal(unlink(file), 0);
	assert_int_equal(rmdir(dir), 0);
	if (private_mounts) {
		mount_tmpfs(dir, sizeof(dir), "size=4m");
		assert_int_equal(mount(NULL, dir, NULL, MS_REMOUNT | MS_RDONLY, "size=4m"), 0);
		assert_int_equal(dr_disk_probe(dir, MiB, NULL, NULL, &o), -EROFS);
		assert_non_null(strstr(o.why, dir));
		assert_non_null(strstr(o.why, "Read-only file system"));
		umount_tmpfs(dir);
	}
}

/* More than the file system holds: refused before a byte is written. */
static void test_full_before_writing(void **state)
{
	char dir[PATH_MAX], want[PATH_MAX + 32];
	struct dr_disk o;

	if (!private_mounts)
		skip();
	mount_tmpfs(dir, sizeof(dir), "size=2m");
	assert_int_equal(dr_disk_probe(dir, 8 * MiB, NULL, NULL, &o), -ENOSPC);
	snprintf(want, sizeof(want), "no space left on %s", dir);
	assert_true(strncmp(o.why, want, strlen(want)) == 0);
	assert_int_equal(count_names(dir), 0);
	assert_true(o.free_bytes <= 2 * MiB && o.total_bytes == 2 * MiB);
	umount_tmpfs(dir);
}

/* Something else fills the file system while the probe writes. */
struct filler {
	const char *dir;
	int calls;
	bool filled;
	char path[PATH_MAX + 16];
};

static bool fill_once_probing(void *arg)
{
	struct filler *f = arg;
	static char block[64 * 1024];
	int fd;

	/* The third poll: the probe's file exists and its first piece is written. */
	if (f->filled || ++f->calls < 3)
		return false;
	assert_int_equal(count_names(f->dir), 1);
	snprintf(f->path, sizeof(f->path), "%s/other", f->dir);
	fd = open(f->path, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	memset(block, 'x', sizeof(block));
	while (write(fd, block, sizeof(block)) > 0)
		;
	close(fd);
	f->filled = true;
	return false;
}

static void test_full_mid_write(void **state)
{
	char dir[PATH_MAX], want[PATH_MAX + 32];
	struct filler f = { 0 };
	struct dr_disk o;
	struct stat st;

	if (!private_mounts)
		skip();
	mount_tmpfs(dir, sizeof(dir), "size=8m");
	f.dir = dir;
	assert_int_equal(dr_disk_probe(dir, 6 * MiB, fill_once_probing, &f, &o), -ENOSPC);
	assert_true(f.filled);
	snprintf(want, sizeof(want), "no space left on %s", dir);
	assert_true(strncmp(o.why, want, strlen(want)) == 0);
	/* The probe's file is gone; the other one is untouched. */
	assert_int_equal(count_names(dir), 1);
	assert_int_equal(stat(f.path, &st), 0);
	assert_true(st.st_size > 0);
	assert_int_equal(unlink(f.path), 0);
	umount_tmpfs(dir);
}

/* ---- the source probe ---- */

struct ent {
	const char *rel;
	char type;              /* 'd', 'f', 'l' (to an outside target), 'p' (fifo) */
	uint64_t size;          /* 'f' */
};

/* 19 entries beneath the root; the regular bytes: 3 MiB + 5, 2 MiB, 10 x 100. */
static const struct ent tree[] = {
	{ "a", 'd', 0 },
	{ "a/big", 'f', 3 * MiB + 5 },
	{ "a/b", 'd', 0 },
	{ "a/b/mid", 'f', 2 * MiB },
	{ "a/b/c", 'd', 0 },
	{ "a/b/c/s0", 'f', 100 }, { "a/b/c/s1", 'f', 100 }, { "a/b/c/s2", 'f', 100 },
	{ "a/b/c/s3", 'f', 100 }, { "a/b/c/s4", 'f', 100 },
	{ "s5", 'f', 100 }, { "s6", 'f', 100 }, { "s7", 'f', 100 }, { "s8", 'f', 100 },
	{ "s9", 'f', 100 },
	{ "empty", 'f', 0 },
	{ "link", 'l', 0 },
	{ "fifo", 'p', 0 },
	{ "e", 'd', 0 },
};
#define NTREE (sizeof(tree) / sizeof(tree[0]))
#define TREE_BYTES (3 * MiB + 5 + 2 * MiB + 1000)

static uint8_t byte_at(const char *rel, uint64_t i)
{
	return (uint8_t)((i * 2654435761u + (uint64_t)strlen(rel) * 131 + (uint8_t)rel[0]) >> 11);
}

struct srctree {
	char base[PATH_MAX];            /* holds root/ and outside/ */
	char root[PATH_MAX + 8];
	char outside[PATH_MAX + 16];
	char mnt[PATH_MAX + 16];        /* a tmpfs mounted beneath root, or "" */
};

static void path_of(char *out, size_t len, const char *dir, const char *rel)
{
	snprintf(out, len, "%s/%s", dir, rel);
}

/* Old times, atime before mtime: a relatime mount updates the atime of
 * anything read, so a probe that leaves a trace shows it. */
static void age(const char *p)
{
	const struct timespec ts[2] = { { 978307200, 0 }, { 1009843200, 0 } };

	assert_int_equal(utimensat(AT_FDCWD, p, ts, AT_SYMLINK_NOFOLLOW), 0);
}

static void make_file(const char *p, uint64_t size, const char *rel)
{
	int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0644);
	uint8_t *buf = malloc(size ? size : 1);

	assert_true(fd >= 0);
	for (uint64_t i = 0; i < size; i++)
		buf[i] = byte_at(rel, i);
	assert_int_equal(write(fd, buf, size), (ssize_t)size);
	close(fd);
	free(buf);
}

static void make_tree(struct srctree *t, bool with_mount)
{
	char p[PATH_MAX * 2];

	mkdtemp_in(t->base, sizeof(t->base), "/var/tmp");
	snprintf(t->root, sizeof(t->root), "%s/root", t->base);
	snprintf(t->outside, sizeof(t->outside), "%s/outside", t->base);
	assert_int_equal(mkdir(t->root, 0755), 0);
	/* What a followed symlink would lead to: more entries, a bigger file. */
	assert_int_equal(mkdir(t->outside, 0755), 0);
	for (int i = 0; i < 5; i++) {
		snprintf(p, sizeof(p), "%s/o%d", t->outside, i);
		make_file(p, i ? 10 : 8 * MiB, "outside");
		age(p);
	}
	for (size_t i = 0; i < NTREE; i++) {
		path_of(p, sizeof(p), t->root, tree[i].rel);
		switch (tree[i].type) {
		case 'd': assert_int_equal(mkdir(p, 0755), 0); break;
		case 'f': make_file(p, tree[i].size, tree[i].rel); break;
		case 'l': assert_int_equal(symlink(t->outside, p), 0); break;
		case 'p': assert_int_equal(mkfifo(p, 0644), 0); break;
		}
	}
	t->mnt[0] = '\0';
	if (with_mount) {
		/* Another file system beneath the root: one entry, never entered. */
		snprintf(t->mnt, sizeof(t->mnt), "%s/e", t->root);
		assert_int_equal(mount("tmpfs", t->mnt, "tmpfs", 0, "size=64m"), 0);
		made_mount(t->mnt);
		for (int i = 0; i < 3; i++) {
			snprintf(p, sizeof(p), "%s/m%d", t->mnt, i);
			make_file(p, 9 * MiB, "mnt");
		}
	}
	/* Deepest first, so that aging a name does not touch its parent again. */
	for (size_t i = NTREE; i-- > 0;) {
		path_of(p, sizeof(p), t->root, tree[i].rel);
		age(p);
	}
	age(t->root);
	age(t->outside);
}

static void free_tree(struct srctree *t)
{
	if (t->mnt[0])
		assert_int_equal(umount2(t->mnt, MNT_DETACH), 0);
	rm_rf(t->base);
}

struct snap {
	struct stat st[NTREE + 8];
};

static void same_time(const struct timespec *a, const struct timespec *b)
{
	assert_int_equal(a->tv_sec, b->tv_sec);
	assert_int_equal(a->tv_nsec, b->tv_nsec);
}

static void snap_take(const struct srctree *t, struct snap *s)
{
	char p[PATH_MAX * 2];
	size_t n = 0;

	for (size_t i = 0; i < NTREE; i++) {
		path_of(p, sizeof(p), t->root, tree[i].rel);
		assert_int_equal(lstat(p, &s->st[n++]), 0);
	}
	assert_int_equal(lstat(t->root, &s->st[n++]), 0);
	assert_int_equal(lstat(t->outside, &s->st[n++]), 0);
	for (int i = 0; i < 5; i++) {
		snprintf(p, sizeof(p), "%s/o%d", t->outside, i);
		assert_int_equal(lstat(p, &s->st[n++]), 0);
	}
}

/* Times, sizes and inodes as they were; then the content, read by us. */
static void snap_same(const struct srctree *t, const struct snap *before)
{
	char p[PATH_MAX * 2];
	struct snap after;

	snap_take(t, &after);
	for (size_t i = 0; i < NTREE + 7; i++) {
		const struct stat *a = &before->st[i], *b = &after.st[i];

		assert_int_equal(a->st_ino, b->st_ino);
		assert_int_equal(a->st_size, b->st_size);
		assert_int_equal(a->st_mode, b->st_mode);
		same_time(&a->st_atim, &b->st_atim);
		same_time(&a->st_mtim, &b->st_mtim);
		same_time(&a->st_ctim, &b->st_ctim);
	}
	for (size_t i = 0; i < NTREE; i++) {
		uint8_t *buf;
		int fd;

		if (tree[i].type != 'f')
			continue;
		path_of(p, sizeof(p), t->root, tree[i].rel);
		fd = open(p, O_RDONLY);
		assert_true(fd >= 0);
		buf = malloc(tree[i].size + 1);
		assert_int_equal(read(fd, buf, tree[i].size + 1), (ssize_t)tree[i].size);
		close(fd);
		for (uint64_t j = 0; j < tree[i].size; j++)
			if (buf[j] != byte_at(tree[i].rel, j))
				fail_msg("%s changed at byte %llu", tree[i].rel, (unsigned long long)j);
		free(buf);
	}
}

static void test_source_counts_reads_leaves_no_trace(void **state)
{
	struct srctree t;
	struct dr_source o;
	struct snap s;

	make_tree(&t, private_mounts);
	snap_take(&t, &s);

	/* 4 MiB: all of the biggest file, then the rest from the next. */
	assert_int_equal(dr_source_probe(t.root, 4 * MiB, 100000, 10000, NULL, NULL, &o), 0);
	assert_string_equal(o.why, "");
	assert_int_equal(o.entries, NTREE);
	assert_int_equal(o.bytes_read, 4 * MiB);
	assert_true(o.read_Bps > 0);
	assert_true(o.files_per_s > 0);
	assert_true(o.direct);          /* /var/tmp is the disk */

	/* More than the tree holds: every regular byte, once. */
	assert_int_equal(dr_source_probe(t.root, 1ull << 40, 0, 0, NULL, NULL, &o), 0);
	assert_int_equal(o.entries, NTREE);
	assert_int_equal(o.bytes_read, TREE_BYTES);

	/* A piece that is not a whole number of blocks. */
	assert_int_equal(dr_source_probe(t.root, MiB + 1, 0, 0, NULL, NULL, &o), 0);
	assert_int_equal(o.bytes_read, MiB + 1);

	snap_same(&t, &s);
	free_tree(&t);
}

static void test_source_bounds(void **state)
{
	struct srctree t;
	struct dr_source o;

	make_tree(&t, false);
	assert_int_equal(dr_source_probe(t.root, 4 * MiB, 5, 0, NULL, NULL, &o), 0);
	assert_int_equal(o.entries, 5);
	assert_true(o.bytes_read <= 4 * MiB);
	/* No bytes asked: a walk only. */
	assert_int_equal(dr_source_probe(t.root, 0, 0, 0, NULL, NULL, &o), 0);
	assert_int_equal(o.entries, NTREE);
	assert_int_equal(o.bytes_read, 0);
	assert_true(o.read_Bps == 0);
	assert_false(o.direct);
	/* A time bound ends the walk, not the probe. */
	assert_int_equal(dr_source_probe(t.root, MiB, 0, 1, NULL, NULL, &o), 0);
	assert_true(o.entries <= NTREE);
	free_tree(&t);
}

static void test_source_without_files(void **state)
{
	char dir[PATH_MAX], p[PATH_MAX + 8];
	struct dr_source o;

	mkdtemp_in(dir, sizeof(dir), "/var/tmp");
	snprintf(p, sizeof(p), "%s/d", dir);
	assert_int_equal(mkdir(p, 0755), 0);
	assert_int_equal(dr_source_probe(dir, 4 * MiB, 0, 0, NULL, NULL, &o), 0);
	assert_int_equal(o.entries, 1);
	assert_int_equal(o.bytes_read, 0);
	assert_true(o.read_Bps == 0);
	rm_rf(dir);
}

static void test_source_missing(void **state)
{
	char dir[PATH_MAX], file[PATH_MAX + 8];
	struct dr_source o;
	int fd;

	assert_int_equal(dr_source_probe("/var/tmp/test_drdisk.missing", MiB, 0, 0, NULL, NULL,
					 &o), -ENOENT);
	assert_int_equal(o.err, -ENOENT);
	assert_non_null(strstr(o.why, "/var/tmp/test_drdisk.missing"));
	assert_non_null(strstr(o.why, "No such file or directory"));

	mkdtemp_in(dir, sizeof(dir), "/var/tmp");
	snprintf(file, sizeof(file), "%s/f", dir);
	fd = open(file, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(dr_source_probe(file, MiB, 0, 0, NULL, NULL, &o), -ENOTDIR);
	assert_non_null(strstr(o.why, file));
	rm_rf(dir);
}

static void test_source_cancel(void **state)
{
	struct srctree t;
	struct dr_source o;

	make_tree(&t, false);
	for (int at = 1; at <= 12; at++) {
		struct cancel_at c = { 0, at };
		int rc = dr_source_probe(t.root, 4 * MiB, 0, 0, cancel_at, &c, &o);

		/* Past the last poll the probe simply finishes. */
		if (rc == 0) {
			assert_true(c.calls < at);
			continue;
		}
		assert_int_equal(rc, -ECANCELED);
		assert_non_null(strstr(o.why, t.root));
		assert_true(o.bytes_read < 4 * MiB);
	}
	free_tree(&t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_probe_speeds, teardown),
		cmocka_unit_test_teardown(test_bytes_rounded_up, teardown),
		cmocka_unit_test_teardown(test_cancel, teardown),
		cmocka_unit_test_teardown(test_missing_dir, teardown),
		cmocka_unit_test_teardown(test_unwritable_dir, teardown),
		cmocka_unit_test_teardown(test_full_before_writing, teardown),
		cmocka_unit_test_teardown(test_full_mid_write, teardown),
		cmocka_unit_test_teardown(test_source_counts_reads_leaves_no_trace, teardown),
		cmocka_unit_test_teardown(test_source_bounds, teardown),
		cmocka_unit_test_teardown(test_source_without_files, teardown),
		cmocka_unit_test_teardown(test_source_missing, teardown),
		cmocka_unit_test_teardown(test_source_cancel, teardown),
	};

	/* Before any thread exists: mounts made here vanish with the process. */
	if (geteuid() == 0 && unshare(CLONE_NEWNS) == 0 &&
	    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0)
		private_mounts = true;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
