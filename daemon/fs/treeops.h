/* Small operations on a destination tree that the pull needs and the
 * io_uring path does not cover. */
#ifndef STAGE_TREEOPS_H
#define STAGE_TREEOPS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

/* Whether a peer's path names an entry a manifest could hold: relative, no
 * empty, "." or ".." component, not under .stage. */
bool treeops_rel_ok(const char *p);
/* Removes NAME in dirfd, recursively when it is a directory. 0 or -errno. */
int treeops_remove(int dirfd, const char *name, bool is_dir);
/* Whether the directory holds nothing (or only "."/".."). */
bool treeops_empty(int dirfd);
/* Opens the directory REL beneath root (NULL or "" for root itself) with
 * no symlink anywhere on the way: what a swapped-in link would point at is
 * never touched. A directory fd, or -errno. */
int treeops_open_beneath(int root, const char *rel);
/* treeops_open_beneath from the directory named ROOT (a configured root,
 * trusted as a path), which is opened only for this. A directory fd, or
 * -errno. */
int treeops_open_beneath_path(const char *root, const char *rel);
/* Opens the parent directory of REL beneath root and points *base at REL's
 * last component. A directory fd, or -errno. */
int treeops_open_parent(int root, const char *rel, const char **base);
/* The regular file REL beneath root opened for reading, with no symlink on
 * its way and without waiting on a fifo planted there: an fd (blocking), or
 * -errno (-EINVAL: not a regular file). */
int treeops_open_file_beneath(int root, const char *rel);
/* mkdir -p of REL beneath root (MODE for what it creates), then opens it:
 * each component made with mkdirat and opened with openat(O_NOFOLLOW) on
 * the fd of the one before, so a component that is, or becomes, a symlink
 * is refused (-ELOOP or -ENOTDIR), never followed. Each directory it
 * makes is made durable (its parent fsync'd). A directory fd, or -errno. */
int treeops_mkdirs_beneath(int root, const char *rel, unsigned mode);
/* Gives an open file or directory its owner (when chown), mode and mtime
 * (ns; atime too). 0 or -errno, *what naming the step that failed. */
int treeops_set_meta(int fd, bool chown, uid_t uid, gid_t gid, uint32_t mode, int64_t mtime_ns,
		     const char **what);
/* The same for NAME in dirfd without following it if it is a symlink
 * (whose mode Linux does not keep: mode is ignored for links). */
int treeops_set_meta_at(int dirfd, const char *name, bool is_link, bool chown, uid_t uid,
			gid_t gid, uint32_t mode, int64_t mtime_ns, const char **what);
/* fsync of a directory (a name made in it is then durable), also through
 * an O_PATH fd, which fsync refuses. 0 or -errno. */
int treeops_sync_dir(int fd);
/* renameat2(RENAME_NOREPLACE): -EEXIST when NEW is there. A file system
 * without the flag (EINVAL: NFS, a FUSE server of protocol 7.22 or older)
 * gets the same result another way: a non-directory is hard-linked to NEW
 * (as atomic: EEXIST if NEW is there) and OLD unlinked; a directory is
 * looked up, then renamed, so the caller must keep other writers out of
 * NEW's directory. 0 or -errno. */
int treeops_rename_noreplace(int ofd, const char *old, int nfd, const char *new);
/* renameat2(RENAME_EXCHANGE): OLD and NEW trade places. Without the flag,
 * three renames through ".OLD.x" (a leftover of that name, from a
 * crash between them, removed first): a crash between them leaves
 * NEW's name empty for a moment, never holding a mix. 0 or -errno. */
int treeops_rename_exchange(int ofd, const char *old, int nfd, const char *new);

#endif
