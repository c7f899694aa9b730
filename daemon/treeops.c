#include "daemon/treeops.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
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
