/* Where a client's path may lead. Every path from a client is resolved with
 * realpath (so ".." and symlinks are followed by the kernel's rules, not
 * guessed lexically) and then must lie beneath one of the configured roots. */
#ifndef STAGE_ROOTS_H
#define STAGE_ROOTS_H

#include <stddef.h>

#include "common/config.h"

/* A pull's source and destination, both absolute and resolved. DEST_ARG may
 * be NULL (default: stage_root/<SRC relative to its source root>). The
 * destination need not exist yet. 0, or -errno with *why set. */
int roots_pull(const struct stage_config *cfg, const char *src_arg, const char *dest_arg,
	       char **src, char **dst, char *why, size_t whylen);
/* A staged tree or checkpoint to inspect: must exist beneath stage_root,
 * ckpt_root or replica_root. */
int roots_local(const struct stage_config *cfg, const char *arg, char **path, char *why,
		size_t whylen);
/* realpath of the longest existing prefix of abs, plus the rest verbatim:
 * how a path that does not exist yet (a checkpoint to restore onto an empty
 * disk) is understood. The rest must hold no ".." (nothing is there to
 * resolve it against): -EINVAL, as for a relative abs. 0 or -errno. */
int roots_resolve(const char *abs, char **out);
/* mkdir -p with mode for the directories it creates. 0 or -errno. */
int roots_mkdirs(const char *path, unsigned mode);

#endif
