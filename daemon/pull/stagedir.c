#include "daemon/pull/stagedir.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/manifest.h"
#include "common/paths.h"
#include "daemon/fs/cred.h"
#include "daemon/fs/treeops.h"

static int open_dir_nofollow(int at, const char *name)
{
	int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	return fd < 0 ? -errno : fd;
}

static bool has_stage_dir(int fd)
{
	struct stat st;

	return fstatat(fd, MF_DIRNAME, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

/* Another user's tree is theirs, whatever its mode lets others do: a
 * destination that exists and belongs to someone else, or lies in a
 * directory of someone else's, is refused before anything in it is touched
 * (root may write anywhere; a directory of root's on the way, the admin's
 * layout, is passed through). */
static int check_owner(int fd, const char *comp, bool last, const char *dest, char *why,
		       size_t whylen)
{
	struct stat st;
	char owner[128];

	if (cred_is_root() || fstatat(fd, comp, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
	    st.st_uid == cred_uid() || (!last && st.st_uid == 0))
		return 0;
	snprintf(why, whylen, "%s %s %s: a pull writes only into a destination of its own "
		 "user's", dest, last ? "belongs to" : "lies in a directory of",
		 cred_name(st.st_uid, owner, sizeof(owner)));
	return -EPERM;
}

/* Walks from the stage root down to DEST, creating what is missing, each
 * step an openat(O_NOFOLLOW) on the fd of the step before: a directory
 * swapped for a symlink halfway is refused, not followed. */
static int open_dest(const char *stage_root, const char *dest, char *why, size_t whylen)
{
	char *root = realpath(stage_root, NULL), *rel, *save = NULL, *comp;
	const char *r;
	bool top = true;
	int fd, ret = 0;

	if (!root) {
		ret = -errno;
		snprintf(why, whylen, "stage_root %s: %s", stage_root, strerror(errno));
		return ret;
	}
	r = paths_rel(dest, root);
	if (!r || !*r) {
		snprintf(why, whylen, "%s is not beneath stage_root %s", dest, stage_root);
		free(root);
		return -EINVAL;
	}
	rel = strdup(r);
	fd = open_dir_nofollow(AT_FDCWD, root);
	free(root);
	if (!rel || fd < 0) {
		free(rel);
		if (fd >= 0)
			close(fd);
		snprintf(why, whylen, "cannot open stage_root %s", stage_root);
		return fd < 0 ? fd : -ENOMEM;
	}
	for (comp = strtok_r(rel, "/", &save); comp; comp = strtok_r(NULL, "/", &save)) {
		int next;

		/* A user may not write in the stage root itself (the admin's):
		 * a directory right beneath it is made for them (cred.h);
		 * deeper down the kernel decides, as for their own mkdir. */
		if (top)
			ret = cred_mkdirat_given(fd, comp, 0755);
		else
			ret = mkdirat(fd, comp, 0755) < 0 && errno != EEXIST ? -errno : 0;
		top = false;
		if (ret < 0) {
			snprintf(why, whylen, "cannot create %s: %s", dest, strerror(-ret));
			break;
		}
		if ((ret = check_owner(fd, comp, !(save && *save), dest, why, whylen)) < 0)
			break;
		next = open_dir_nofollow(fd, comp);
		close(fd);
		fd = next;
		if (fd < 0) {
			ret = fd;
			snprintf(why, whylen, "cannot open %s%s: %s", dest,
				 ret == -ELOOP || ret == -ENOTDIR ? " (a symlink on the way?)" : "",
				 strerror(-ret));
			break;
		}
		/* A staged tree above DEST: pulling into it would change that tree
		 * behind its manifest, and its next pull would mirror this away. */
		if (save && *save && has_stage_dir(fd)) {
			ret = -EEXIST;
			snprintf(why, whylen, "%s lies inside another staged tree (at component '%s')",
				 dest, comp);
			break;
		}
	}
	free(rel);
	if (ret < 0) {
		if (fd >= 0)
			close(fd);
		return ret;
	}
	return fd;
}

int stagedir_open(struct stagedir *sd, const char *stage_root, const char *dest, bool as_root,
		  char *why, size_t whylen)
{
	struct stat st;
	int ret;

	memset(sd, 0, sizeof(*sd));
	sd->dst_fd = sd->stage_fd = sd->tmp_fd = sd->lock_fd = -1;
	sd->path = strdup(dest);
	if (!sd->path)
		return -ENOMEM;
	ret = open_dest(stage_root, dest, why, whylen);
	if (ret < 0)
		goto out_close;
	sd->dst_fd = ret;
	/* Checked by name on the way; once more on what was opened. */
	if (!cred_is_root() && fstat(sd->dst_fd, &st) == 0 && st.st_uid != cred_uid()) {
		snprintf(why, whylen, "%s changed owner while it was opened", dest);
		ret = -EPERM;
		goto out_close;
	}
	if (!has_stage_dir(sd->dst_fd)) {
		if (!treeops_empty(sd->dst_fd)) {
			snprintf(why, whylen,
				 "%s exists, is not empty and is not a staged tree (no %s/); "
				 "refusing to mirror into it", dest, MF_DIRNAME);
			ret = -EEXIST;
			goto out_close;
		}
		if (mkdirat(sd->dst_fd, MF_DIRNAME, 0755) < 0 && errno != EEXIST) {
			ret = -errno;
			snprintf(why, whylen, "cannot create %s/%s: %s", dest, MF_DIRNAME,
				 strerror(errno));
			goto out_close;
		}
	}
	/* A non-root daemon must be able to write in a top it made 0555 last time. */
	if (!as_root && fstat(sd->dst_fd, &st) == 0 && (st.st_mode & 0700) != 0700)
		fchmod(sd->dst_fd, (st.st_mode & 07777) | 0700);
	ret = open_dir_nofollow(sd->dst_fd, MF_DIRNAME);
	if (ret < 0) {
		snprintf(why, whylen, "cannot open %s/%s: %s", dest, MF_DIRNAME, strerror(-ret));
		goto out_close;
	}
	sd->stage_fd = ret;
	sd->lock_fd = openat(sd->stage_fd, "lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (sd->lock_fd < 0 || flock(sd->lock_fd, LOCK_EX | LOCK_NB) < 0) {
		ret = -errno;
		if (ret == -EWOULDBLOCK)
			snprintf(why, whylen, "another pull into %s is in progress", dest);
		else
			snprintf(why, whylen, "cannot lock %s/%s/lock: %s", dest, MF_DIRNAME,
				 strerror(-ret));
		goto out_close;
	}
	return 0;

out_close:
	stagedir_close(sd);
	return ret;
}

static int rename_if_there(struct stagedir *sd, const char *from, const char *to)
{
	if (renameat(sd->stage_fd, from, sd->stage_fd, to) < 0 && errno != ENOENT)
		return -errno;
	return 0;
}

int stagedir_begin(struct stagedir *sd)
{
	int ret;

	/* No manifest but a journal or a .prev: the last pull did not finish,
	 * and the tree may hold changes no manifest or journal line records. */
	sd->recovering = faccessat(sd->stage_fd, "manifest", F_OK, AT_SYMLINK_NOFOLLOW) < 0 &&
			 (faccessat(sd->stage_fd, "manifest.prev", F_OK, AT_SYMLINK_NOFOLLOW) == 0 ||
			  faccessat(sd->stage_fd, "manifest.partial", F_OK, AT_SYMLINK_NOFOLLOW) == 0 ||
			  faccessat(sd->stage_fd, "manifest.resume", F_OK, AT_SYMLINK_NOFOLLOW) == 0);
	/* A manifest and a .prev both present: the last pull published, then
	 * died before it dropped .prev. The manifest is the newer. */
	if ((ret = rename_if_there(sd, "manifest", "manifest.prev")) < 0)
		return ret;
	if ((ret = rename_if_there(sd, "manifest.partial", "manifest.resume")) < 0)
		return ret;
	if (sd->tmp_fd >= 0)
		close(sd->tmp_fd);
	sd->tmp_fd = -1;
	ret = treeops_remove(sd->stage_fd, "tmp", true);
	if (ret < 0)
		return ret;
	if (mkdirat(sd->stage_fd, "tmp", 0700) < 0)
		return -errno;
	ret = open_dir_nofollow(sd->stage_fd, "tmp");
	if (ret < 0)
		return ret;
	sd->tmp_fd = ret;
	fsync(sd->stage_fd);
	return 0;
}

int stagedir_publish(struct stagedir *sd)
{
	if (renameat(sd->stage_fd, "manifest.partial", sd->stage_fd, "manifest") < 0)
		return -errno;
	/* The journal first: a stale one would be trusted over the manifest. */
	unlinkat(sd->stage_fd, "manifest.resume", 0);
	unlinkat(sd->stage_fd, "manifest.prev", 0);
	sd->recovering = false;
	if (fsync(sd->stage_fd) < 0)
		return -errno;
	return 0;
}

int stagedir_unpublish(struct stagedir *sd)
{
	int ret = rename_if_there(sd, "manifest", "manifest.prev");

	if (ret == 0 && fsync(sd->stage_fd) < 0)
		ret = -errno;
	return ret;
}

void stagedir_end(struct stagedir *sd)
{
	if (sd->tmp_fd >= 0) {
		close(sd->tmp_fd);
		treeops_remove(sd->stage_fd, "tmp", true);
	}
	sd->tmp_fd = -1;
}

void stagedir_close(struct stagedir *sd)
{
	stagedir_end(sd);
	if (sd->lock_fd >= 0)
		close(sd->lock_fd);
	if (sd->stage_fd >= 0)
		close(sd->stage_fd);
	if (sd->dst_fd >= 0)
		close(sd->dst_fd);
	free(sd->path);
	memset(sd, 0, sizeof(*sd));
	sd->dst_fd = sd->stage_fd = sd->tmp_fd = sd->lock_fd = -1;
}
