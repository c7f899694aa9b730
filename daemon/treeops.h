/* Small operations on a destination tree that the pull needs and the
 * io_uring path does not cover. */
#ifndef STAGE_TREEOPS_H
#define STAGE_TREEOPS_H

#include <stdbool.h>

/* Removes NAME in dirfd, recursively when it is a directory. 0 or -errno. */
int treeops_remove(int dirfd, const char *name, bool is_dir);
/* Whether the directory holds nothing (or only "."/".."). */
bool treeops_empty(int dirfd);

#endif
