/* A staged tree's bookkeeping directory, DEST/.stage/, and the destination
 * itself as a pull holds it.
 *
 *   manifest          the tree is complete and this is its content (last)
 *   manifest.partial  the journal of the pull in progress: entries retired
 *                     so far, in order; each is under its final name
 *   manifest.prev     the last complete manifest, moved aside while the tree
 *                     changes
 *   manifest.resume   the journal of an interrupted pull, read by this one
 *   tmp/              temporaries of the pull in progress, emptied at each
 *                     pass: same file system as the tree, so renames out of
 *                     it are atomic, and never a name the source could have
 *   lock              flock'd by the pull in progress
 *
 * Invariant: a tree has a `manifest` only while it matches it.
 */
#ifndef STAGE_STAGEDIR_H
#define STAGE_STAGEDIR_H

#include <stdbool.h>
#include <stddef.h>

struct stagedir {
	char *path;      /* the destination, absolute, owned */
	int dst_fd;      /* the destination directory */
	int stage_fd;    /* DEST/.stage */
	int tmp_fd;      /* DEST/.stage/tmp */
	int lock_fd;     /* DEST/.stage/lock, flock'd */
	bool recovering; /* a killed pull's journal was found: trust less */
};

/* Opens DEST (absolute, beneath stage_root; created if missing) one
 * component at a time without following symlinks, refuses a destination
 * nested in another staged tree or one that exists, is not empty and is not
 * a staged tree (both -EEXIST: a usage error), and locks it (-EWOULDBLOCK
 * if another pull holds it). 0, or -errno with why. */
int stagedir_open(struct stagedir *sd, const char *stage_root, const char *dest, bool as_root,
		  char *why, size_t whylen);
/* Starts a pass: the manifest moves aside (the tree is about to change),
 * a journal left by a killed pull becomes manifest.resume, tmp/ is emptied. */
int stagedir_begin(struct stagedir *sd);
/* Ends a pass: tmp/ and anything left in it go (nothing is in flight). */
void stagedir_end(struct stagedir *sd);
/* The journal (manifest.partial, finished and fsync'd) becomes the manifest. */
int stagedir_publish(struct stagedir *sd);
/* The manifest moves aside again: the tree no longer matches it. */
int stagedir_unpublish(struct stagedir *sd);
void stagedir_close(struct stagedir *sd);

#endif
