/* A depth-first walk of a tree in manifest order (each directory's names
 * sorted by memcmp, a directory before its contents: mf_path_cmp order),
 * merged with the same directory of a second tree when one is given. The
 * caller sees every name once, with the side(s) it exists on, so a pull can
 * copy what is new and remove what vanished in the same single pass.
 *
 * Memory: one sorted listing per directory on the current path (so bounded by
 * depth times the largest directory, not by the tree), plus a path buffer.
 *
 * Errors are per directory: when a directory cannot be listed, walk_next
 * returns -errno with walk_why() naming it, and the next call goes on past it.
 */
#ifndef STAGE_WALK_H
#define STAGE_WALK_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

enum walk_side { WALK_SRC, WALK_BOTH, WALK_OTHER };

struct walk_ent {
	const char *rel;       /* relative path; valid until the next walk_next */
	const char *name;      /* its last component */
	enum walk_side side;
	char type;             /* source: 'd', 'f', 'l', '?' (special file); 0 if WALK_OTHER */
	char other_type;       /* the other tree's, same letters, 0 if WALK_SRC */
	struct stat st;        /* source lstat, when the source has it (not if lazy):
	                          type, mode, owner, size and st_ino; st_mtim and
	                          st_ctim are not filled: use mtime_ns, ctime_ns */
	int64_t mtime_ns;      /* source mtime, ns since the epoch */
	int64_t ctime_ns;      /* source ctime, the same */
	bool lazy;             /* WALK_LAZY: a regular file only the source has, not
	                          stat'ed: its type is all that is known */
	int src_dirfd;         /* directory holding name in the source */
	int other_dirfd;       /* ... in the other tree, -1 if the directory is not there */
};

struct walk;

/* WALK_LAZY: regular files the other tree lacks are not stat'ed. A first
 * pull needs nothing of them before it opens them, and the open reads the
 * inode anyway, many at once on io_uring, where a stat here would make the
 * walk wait for each directory's cold inodes in turn. */
#define WALK_LAZY 1u

/* src_root and other_root (-1: none) are borrowed. The top-level ".stage"
 * of both trees is never reported (it is the manifest's directory). */
int walk_open(struct walk **w, int src_root, int other_root, unsigned flags);
/* 1 with *e filled, 0 at the end, -errno (walk_why) for a directory that
 * could not be listed. Returning a source directory means the walk descends
 * into it on the next call, opening it in the other tree if it exists by
 * then (so the caller creates it there first) unless walk_skip() is called. */
int walk_next(struct walk *w, struct walk_ent *e);
void walk_skip(struct walk *w);
const char *walk_why(const struct walk *w);
/* The relative path the last error is about ("." for the top). */
const char *walk_err_path(const struct walk *w);
void walk_close(struct walk *w);

char walk_type_of_mode(mode_t m);

#endif
