/* The directories of a destination being filled, outermost first: exactly
 * the ancestors of the entry last retired. A directory gets its owner, mode
 * and mtime when it leaves the stack, once everything inside it is in
 * (before that, every name added or removed would move its mtime again).
 * Each is held by an fd opened from its parent's without following links,
 * so a directory swapped for a symlink since is refused, not followed. */
#ifndef STAGE_DIRSTACK_H
#define STAGE_DIRSTACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct dir_meta {
	char *path;              /* relative to the root, owned */
	int fd;                  /* -1 if it could not be opened (then left as is) */
	uint32_t mode;
	int64_t mtime_ns;
	uid_t uid;
	gid_t gid;
};

struct dirstack {
	struct dir_meta *v;
	size_t n, cap;
	int root_fd;             /* borrowed: the destination */
	bool chown;              /* give owners (we are root) */
	const char *label;       /* for messages: the destination's path, borrowed */
};

void dirstack_init(struct dirstack *ds, int root_fd, bool chown, const char *label);
/* Enters directory REL (its parent must be the top, or REL top-level). */
int dirstack_push(struct dirstack *ds, const char *rel, uint32_t mode, int64_t mtime_ns,
		  uid_t uid, gid_t gid);
/* Leaves every directory that is not an ancestor of REL (NULL: all). */
void dirstack_close_until(struct dirstack *ds, const char *rel);
/* Leaves them all and frees the stack. */
void dirstack_destroy(struct dirstack *ds);

#endif
