/* Where a client's path may lead. Every path from a client is resolved with
 * realpath (so ".." and symlinks are followed by the kernel's rules, not
 * guessed lexically), must then lie beneath one of the configured roots, and
 * is opened from that root's fd with openat2(RESOLVE_BENEATH |
 * RESOLVE_NO_SYMLINKS): what was checked is what is opened, even if a
 * component is swapped for a symlink in between (that open fails, -EPERM).
 * Everything below the opened directory is reached through fds. */
#ifndef STAGE_ROOTS_H
#define STAGE_ROOTS_H

#include <stdbool.h>
#include <stddef.h>

#include "common/config.h"

/* A pull's source and destination, both absolute and resolved, and the
 * source directory opened (*src_fd). DEST_ARG may be NULL (default:
 * stage_root/<SRC relative to its source root>). The destination need not
 * exist yet: stagedir.c walks down to it without following symlinks. 0, or
 * -errno with *why set. */
int roots_pull(const struct stage_config *cfg, const char *src_arg, const char *dest_arg,
	       char **src, char **dst, int *src_fd, char *why, size_t whylen);
/* Whether src_arg lies beneath a source root by its text alone (absolute,
 * no "..", no link asked about). */
bool roots_source_by_text(const struct stage_config *cfg, const char *src_arg);
/* A staged tree or checkpoint to inspect: must exist beneath stage_root,
 * ckpt_root or replica_root; *path its resolved path, *fd the directory
 * opened. 0, or -errno with *why set. */
int roots_local(const struct stage_config *cfg, const char *arg, char **path, int *fd,
		char *why, size_t whylen);
/* The exit status for an error of roots_pull or roots_local: 1 when the
 * daemon failed (memory, file descriptors, I/O), 2 when the path itself is
 * refused (outside the roots, missing, not a directory, a link swapped in). */
int roots_exit_code(int err);
/* realpath of the longest existing prefix of abs, plus the rest verbatim:
 * how a path that does not exist yet (a checkpoint to restore onto an empty
 * disk) is understood. The rest must hold no ".." (nothing is there to
 * resolve it against): -EINVAL, as for a relative abs. 0 or -errno. */
int roots_resolve(const char *abs, char **out);
/* Whether the user this thread acts as may VERB abs (commit, restore,
 * verify...): a checkpoint job (ckpt_root/JOB, the owner of that
 * directory) and a replica (replica_root/ORIGIN/JOB/STEP, the owner of its
 * manifest) are their owner's, whatever their modes let others do. 0 (also
 * for root, for a path in neither tree, and for a job not on this node:
 * the holders judge a restore of it), -EPERM with why naming the owner, or
 * another -errno with why. *replica (may be NULL): the path is a user's own
 * replica, whose directories are the daemon's: the request reads it as the
 * daemon. */
int roots_owner_check(const struct stage_config *cfg, const char *abs, const char *verb,
		      bool *replica, char *why, size_t whylen);
/* The same for the job named JOB (ckpt_root/JOB, reached with no link):
 * what a request checks again once it knows which job it works on, so
 * that a link swapped in after the first check leads nowhere. */
int roots_job_owner_check(const struct stage_config *cfg, const char *job, const char *verb,
			  char *why, size_t whylen);
/* mkdir -p with mode for the directories it creates, each made durable
 * (its parent fsync'd). 0 or -errno. */
int roots_mkdirs(const char *path, unsigned mode);

#endif
