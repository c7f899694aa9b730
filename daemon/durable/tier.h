/* The durable tier as its readers see it: the drainer writes it (drain.h
 * has the layout), verify --cluster and resume survey it (survey/hold.c),
 * a restore falls back to it (restore/rsrc_durable.c).
 *
 *     ROOT/JOB/STEP/<every origin's files>
 *     ROOT/JOB/STEP/.stage/manifest.ORIGIN    one per origin, written last
 *
 * An origin's part of a step is there when its manifest is: that manifest is
 * the origin's own, byte for byte, so its root digest is the commit's.
 */
#ifndef STAGE_DURABLE_TIER_H
#define STAGE_DURABLE_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "common/config.h"
#include "common/digest.h"

#define DURABLE_MF_PREFIX "manifest."
#define DURABLE_MF_MAX (sizeof(DURABLE_MF_PREFIX) + 255)   /* a name in .stage, with its NUL */

/* Whether this node has a durable tier. */
static inline bool durable_on(const struct stage_config *cfg)
{
	return cfg->durable_root && cfg->durable_root[0];
}

/* ROOT/REL (a job, or JOB/STEP) opened beneath [durable] root with no
 * symlink on the way: an fd or -errno (-ENOENT: no such part, -ENOTSUP: no
 * durable tier configured, -EACCES: a thread acting as a user, and the
 * job's directory there is another user's, not theirs or root's). */
int durable_open(const struct stage_config *cfg, const char *rel);
/* ORIGIN's manifest's name in STEP/.stage. */
void durable_mf_name(const char *origin, char out[DURABLE_MF_MAX]);
/* A want for ckpt_steps in ROOT/JOB: origin's part of the step is drained
 * (origin NULL: any origin's). */
bool durable_has_part(int jobfd, const char *step, const void *origin);
/* The origins whose part of the step at stepfd is drained, in directory
 * order: fn(origin, arg) for each, until it returns non-zero (returned).
 * 0, or -errno when .stage cannot be read. */
int durable_each_origin(int stepfd, int (*fn)(const char *origin, void *arg), void *arg);

/* ORIGIN's manifest in the step at stepfd, opened with no symlink on its
 * way and only if a regular file (a fifo planted there must not hang a
 * reader): a stream to read, or NULL with errno (EINVAL: not a regular
 * file). */
FILE *durable_mf_open(int stepfd, const char *origin);
/* The root digest of ORIGIN's manifest there (its commit's), read whole.
 * 0 or -errno (-EBADMSG: damaged). */
int durable_mf_root(int stepfd, const char *origin, digest_t *root);
/* ORIGIN's part of the step at stepfd, checked as `stage verify` checks a
 * tree without --deep, but entry by entry from its manifest rather than by
 * walking the directory, which holds every other origin's files too (a
 * walk per origin would cost origins x files): each entry is there, of its
 * type, and a file of its size and mtime, a link of its target. Reading
 * every byte is a restore's job: it checks each chunk as it reads. */
struct durable_part {
	digest_t root;             /* the manifest's, once read whole (has_root) */
	bool has_root;
	uint64_t files, bytes;     /* what the manifest lists */
	uint64_t bad;              /* entries that do not match */
	char first[512];           /* the first of them, or why the manifest does not read */
};
/* 0 intact, 1 not (p->bad, p->first), -errno when the manifest cannot be
 * read (-EBADMSG: it is damaged; p->first says where). */
int durable_part_check(int stepfd, const char *origin, struct durable_part *p);

#endif
