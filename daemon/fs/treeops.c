#include "daemon/fs/treeops.h"

#include "common/manifest.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static bool dot_or_dotdot(const char *n)
{
	return n[0] == '.' && (n[1] == '\0' || (n[1] == '.' && n[2] == '\0'));
}

/* Depth-first; recursion depth is the tree's depth, bounded by PATH_MAX. */
static int remove_dir(int dirfd, const char *name)
{
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	struct dirent *d;
	DIR *dir;
	int ret = 0;

	/* A non-root daemon may meet a directory it made read-only (a staged
	 * copy of a 0555 source): it owns it, so it may open it up to empty it. */
	if (fd < 0 && errno == EACCES && fchmodat(dirfd, name, 0700, AT_SYMLINK_NOFOLLOW) == 0)
		fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	dir = fdopendir(fd);
	if (!dir) {
		ret = -errno;
		close(fd);
		return ret;
	}
	while (ret == 0 && (d = readdir(dir))) {
		if (dot_or_dotdot(d->d_name))
			continue;
		if (unlinkat(fd, d->d_name, 0) == 0)
			continue;
		if (errno == EISDIR || errno == EPERM)
			ret = remove_dir(fd, d->d_name);
		else if (errno == EACCES && fchmod(fd, 0700) == 0)
			ret = unlinkat(fd, d->d_name, 0) == 0 ? 0 : remove_dir(fd, d->d_name);
		else if (errno != ENOENT)
			ret = -errno;
	}
	closedir(dir);
	if (ret == 0 && unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		ret = -errno;
	return ret;
}

int treeops_remove(int dirfd, const char *name, bool is_dir)
{
	if (is_dir)
		return remove_dir(dirfd, name);
	if (unlinkat(dirfd, name, 0) == 0 || errno == ENOENT)
		return 0;
	if (errno == EISDIR)
		return remove_dir(dirfd, name);
	return -errno;
}

bool treeops_empty(int dirfd)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct dirent *d;
	bool empty = true;
	DIR *dir;

	if (fd < 0)
		return false;
	dir = fdopendir(fd);
	if (!dir) {
		close(fd);
		return false;
	}
	while ((d = readdir(dir)))
		if (!dot_or_dotdot(d->d_name)) {
			empty = false;
			break;
		}
	closedir(dir);
	return empty;
}

int treeops_open_beneath(int root, const char *rel)
{
	struct open_how how = {
		.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};
	long fd = syscall(SYS_openat2, root, rel && *rel ? rel : ".", &how, sizeof(how));

	return fd < 0 ? -errno : (int)fd;
}

int treeops_open_beneath_path(const char *root, const char *rel)
{
	int root_fd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC), fd;

	if (root_fd < 0)
		return -errno;
	fd = treeops_open_beneath(root_fd, rel);
	close(root_fd);
	return fd;
}

int treeops_open_parent(int root, const char *rel, const char **base)
{
	const char *slash = strrchr(rel, '/');
	char *dir;
	int fd;

	if (!slash) {
		*base = rel;
		return treeops_open_beneath(root, NULL);
	}
	*base = slash + 1;
	dir = strndup(rel, (size_t)(slash - rel));
	if (!dir)
		return -ENOMEM;
	fd = treeops_open_beneath(root, dir);
	free(dir);
	return fd;
}

int treeops_sync_dir(int fd)
{
	int rc, rfd;

	if (fsync(fd) == 0)
		return 0;
	if (errno != EBADF)
		return -errno;
	rfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rfd < 0)
		return -errno;
	rc = fsync(rfd) < 0 ? -errno : 0;
	close(rfd);
	return rc;
}

int treeops_mkdirs_beneath(int root, const char *rel, unsigned mode)
{
	char *copy, *save = NULL;
	int fd;

	if (!*rel)
		return -EINVAL;         /* the root itself: nothing to make */
	copy = strdup(rel);
	if (!copy)
		return -ENOMEM;
	fd = fcntl(root, F_DUPFD_CLOEXEC, 0);
	if (fd < 0) {
		fd = -errno;
		free(copy);
		return fd;
	}
	for (char *c = strtok_r(copy, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
		int next;

		if (strcmp(c, "..") == 0) {
			close(fd);
			fd = -EXDEV;
			break;
		}
		if (mkdirat(fd, c, mode) == 0) {
			/* Its name is durable only once its parent is synced
			 * (ext4 happens to do it with the next fsync; POSIX
			 * does not say so, nor do NFS or XFS promise it). */
			next = treeops_sync_dir(fd);
		} else {
			next = errno == EEXIST ? 0 : -errno;
		}
		if (next < 0)
			;
		else if ((next = openat(fd, c, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
					O_CLOEXEC)) < 0)
			next = -errno;
		close(fd);
		fd = next;
		if (fd < 0)
			break;
	}
	free(copy);
	return fd;
}

static void times_of(int64_t ns, struct timespec ts[2])
{
	ts[0].tv_sec = ns / 1000000000LL;
	ts[0].tv_nsec = ns % 1000000000LL;
	if (ts[0].tv_nsec < 0) {
		ts[0].tv_sec--;
		ts[0].tv_nsec += 1000000000LL;
	}
	ts[1] = ts[0];
}

int treeops_set_meta(int fd, bool chown, uid_t uid, gid_t gid, uint32_t mode, int64_t mtime_ns,
		     const char **what)
{
	struct timespec ts[2];

	times_of(mtime_ns, ts);
	if (chown && fchown(fd, uid, gid) < 0)
		return *what = "chown", -errno;
	if (fchmod(fd, mode) < 0)
		return *what = "chmod", -errno;
	if (futimens(fd, ts) < 0)
		return *what = "set times", -errno;
	return 0;
}

int treeops_set_meta_at(int dirfd, const char *name, bool is_link, bool chown, uid_t uid,
			gid_t gid, uint32_t mode, int64_t mtime_ns, const char **what)
{
	struct timespec ts[2];

	times_of(mtime_ns, ts);
	if (chown && fchownat(dirfd, name, uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
		return *what = "chown", -errno;
	/* glibc does AT_SYMLINK_NOFOLLOW through an O_PATH fd: the inode it
	 * checked is the inode it changes. */
	if (!is_link && fchmodat(dirfd, name, mode, AT_SYMLINK_NOFOLLOW) < 0)
		return *what = "chmod", -errno;
	if (utimensat(dirfd, name, ts, AT_SYMLINK_NOFOLLOW) < 0)
		return *what = "set times", -errno;
	return 0;
}

int treeops_open_file_beneath(int root, const char *rel)
{
	const char *base;
	struct stat st;
	int pfd = treeops_open_parent(root, rel, &base), fd, rc = 0;

	if (pfd < 0)
		return pfd;
	/* O_NONBLOCK only for the open: a fifo must not hang it. */
	fd = openat(pfd, base, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		rc = -errno;
	close(pfd);
	if (rc == 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || fcntl(fd, F_SETFL, 0) < 0)) {
		close(fd);
		rc = -EINVAL;
	}
	return rc < 0 ? rc : fd;
}

int treeops_rename_noreplace(int ofd, const char *old, int nfd, const char *new)
{
	struct stat st;

	if (renameat2(ofd, old, nfd, new, RENAME_NOREPLACE) == 0)
		return 0;
	if (errno != EINVAL)
		return -errno;
	if (fstatat(ofd, old, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	if (!S_ISDIR(st.st_mode)) {
		if (linkat(ofd, old, nfd, new, 0) == 0)
			return unlinkat(ofd, old, 0) < 0 ? -errno : 0;
		if (errno != EPERM && errno != EOPNOTSUPP && errno != EMLINK)
			return -errno;
		/* No hard links either: as for a directory. */
	}
	if (fstatat(nfd, new, &st, AT_SYMLINK_NOFOLLOW) == 0)
		return -EEXIST;
	if (errno != ENOENT)
		return -errno;
	return renameat(ofd, old, nfd, new) < 0 ? -errno : 0;
}

int treeops_rename_exchange(int ofd, const char *old, int nfd, const char *new)
{
	char aside[NAME_MAX + 1];
	int rc;

	if (renameat2(ofd, old, nfd, new, RENAME_EXCHANGE) == 0)
		return 0;
	if (errno != EINVAL)
		return -errno;
	/* ".OLD.x": no step, job or node name starts with '.', so this is
	 * never another entry's name. */
	if ((size_t)snprintf(aside, sizeof(aside), ".%s.x", old) >= sizeof(aside))
		return -ENAMETOOLONG;
	/* One left by an exchange cut short is older than OLD: without this
	 * the first rename would meet it (ENOTEMPTY) on every try to come. */
	rc = treeops_remove(ofd, aside, false);
	if (rc < 0)
		return rc;
	if (renameat(ofd, old, ofd, aside) < 0)
		return -errno;
	if (renameat(nfd, new, ofd, old) < 0) {
		rc = -errno;
		(void)renameat(ofd, aside, ofd, old);           /* as it was */
		return rc;
	}
	if (renameat(ofd, aside, nfd, new) < 0) {
		rc = -errno;
		if (renameat(ofd, old, nfd, new) == 0)          /* the earlier one back */
			(void)renameat(ofd, aside, ofd, old);
		return rc;
	}
	return 0;
}

bool treeops_rel_ok(const char *p)
{
	size_t n = strlen(p);

	if (!n || n > MF_MAX_PATH || p[0] == '/')
		return false;
	if (strcmp(p, MF_DIRNAME) == 0 || strncmp(p, MF_DIRNAME "/", sizeof(MF_DIRNAME)) == 0)
		return false;
	for (const char *c = p; *c;) {
		size_t len = strcspn(c, "/");

		if (len == 0 || (len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
			return false;
		c += len;
		if (*c == '/')
			c++;
		if (!*c && c[-1] == '/')
			return false;
	}
	return true;
}
