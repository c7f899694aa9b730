/* stage verify on this node: a staged tree (or checkpoint) against its
 * manifest. Fast mode compares types, sizes, mtimes and link targets; deep
 * mode also re-reads and re-hashes every byte through the copier. */
#ifndef STAGE_VERIFY_H
#define STAGE_VERIFY_H

#include <stdbool.h>

#include "daemon/job.h"

/* Verifies the tree at dirfd (path is for messages), sending each finding
 * as a note. direct: read with O_DIRECT where possible (the disk, not the
 * page cache). bad (may be NULL) hears of every entry that does not match.
 * Returns 0 verified, 1 findings, -errno when it could not
 * verify at all (the reason was sent as a note). */
typedef void (*verify_bad_fn)(const char *rel, void *arg);
int verify_tree(struct job *j, const char *path, int dirfd, bool deep, bool direct,
		verify_bad_fn bad, void *arg);
/* Serves one MSG_VERIFY_REQ (sends the result). */
void verify_run(struct job *j, const char *path_arg);

#endif
