/* Lexical path helpers shared by the daemon and the client. Nothing here
 * touches the file system: resolving symlinks is the daemon's (roots.c). */
#ifndef STAGE_PATHS_H
#define STAGE_PATHS_H

#include <stdbool.h>
#include <stddef.h>

/* Is PATH equal to ROOT or beneath it, component-wise? Both absolute and
 * normalised ("/a/b", never a trailing '/' except "/" itself). */
bool paths_under(const char *path, const char *root);
/* The part of PATH below ROOT ("" when equal), or NULL if not under it. */
const char *paths_rel(const char *path, const char *root);
/* Normalises an absolute path in place: collapses "//", drops "." components
 * and a trailing '/'. Returns -EINVAL if it is not absolute, or if keep_dotdot
 * is false and it has a ".." component. ".." is never resolved lexically: that
 * would be wrong across symlinks; realpath() does it properly. */
int paths_normalize(char *p, bool keep_dotdot);
/* Joins BASE (absolute) and ARG: ARG if it is absolute, else BASE/ARG, then
 * normalised keeping "..". Returns a malloc'd string or NULL. */
char *paths_absolute(const char *base, const char *arg);

#endif
