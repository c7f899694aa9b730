/* The record a deep verify leaves beside the manifest (.stage/damage), so
 * that a restore right after it need not read the whole tree again to learn
 * what the verify just learnt: which files' bytes are wrong (and which of
 * their chunks), and that every other file was intact when it began.
 *
 * What makes it safe to trust: the kernel's own clock. When the verify
 * starts it creates the record and reads the ctime the kernel gave it
 * ("since"); any later write or metadata change to a file gives that file
 * a ctime of at least since. So a file whose ctime is still below since
 * held, when the verify read it, the bytes it holds now (unless the disk
 * itself rotted them since, which only reading again can tell); a file the
 * record names is taken as recorded only while its inode and ctime are the
 * ones recorded. A file renamed in with its directory keeps its old ctime:
 * the directory's moved, so the verify trusts nothing beneath a directory
 * changed since. The record holds for one manifest (its inode, size and
 * ctime), is complete only with its last line, and is replaced by each
 * deep verify and removed by a restore that completes. A wall clock set
 * back (by hand, or NTP stepping it) could make a later change look older,
 * since the kernel's ctimes follow it: a verify that finds its own since
 * below the last record's trusts nothing.
 *
 * Format (docs/MANIFEST.md, "the damage record"): text lines
 *   stage-damage 1
 *   manifest INO SIZE CTIME_NS
 *   since CTIME_NS
 *   damaged INO CTIME_NS CHUNKS PATH       CHUNKS: a,b-c,... or - (the file whole)
 *   unreadable INO CTIME_NS - PATH
 *   end
 * PATH escaped as in the manifest. Memory: a loaded record holds at most
 * DAMAGE_MAX entries and DAMAGE_CHUNKS_MAX chunk numbers (8 MiB); a record
 * naming more is not used. Only a regular file owned by the daemon's user
 * is read.
 */
#ifndef STAGE_DAMAGE_H
#define STAGE_DAMAGE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define DAMAGE_NAME "damage"
#define DAMAGE_MAX 65536                /* files a record names; chunks a line names */
#define DAMAGE_CHUNKS_MAX (1u << 20)    /* chunk numbers of a whole record */

struct damage_ent {
	char *rel;
	uint64_t ino;
	int64_t ctime_ns;
	bool unreadable;           /* else damaged */
	uint64_t *bad, nbad;       /* chunk numbers, ascending; 0: the file whole */
};

struct damage {                    /* a record loaded, or being written */
	int64_t since;
	struct damage_ent *v;      /* loaded: sorted by rel (manifest order) */
	size_t n;
	FILE *out;                 /* being written: .stage/damage.new.TID */
	int stage_fd;              /* borrowed, while writing */
	char tmp[32];              /* that name */
	const char *mf;            /* the manifest's name, borrowed, while writing */
	char mf_id[128];           /* its "manifest ..." line when the record began */
};

/* Loads the record in stage_fd if it is complete and was made against the
 * manifest named mf as it is now. 0, -ENOENT (none that applies), -ENOMEM. */
int damage_load(struct damage *d, int stage_fd, const char *mf);
/* The record's entry for rel, or NULL. */
const struct damage_ent *damage_find(const struct damage *d, const char *rel);
void damage_free(struct damage *d);

/* Starts a new record (d->since set) in stage_fd for the manifest mf. */
int damage_start(struct damage *d, int stage_fd, const char *mf);
/* One finding of the verify: damaged (bad chunks, nbad 0: the file whole)
 * or unreadable. */
void damage_add(struct damage *d, const char *rel, uint64_t ino, int64_t ctime_ns,
		bool unreadable, const uint64_t *bad, uint64_t nbad);
/* The record complete, in place of the last one; -ESTALE (none written)
 * when the manifest changed since damage_start. 0 or -errno. */
int damage_commit(struct damage *d);
/* The record given up (a verify cut short): the last one stays, which
 * holds by its own rules. */
void damage_abort(struct damage *d);
/* Removes the record of stage_fd (a restore changed the tree). */
void damage_remove(int stage_fd);

#endif
