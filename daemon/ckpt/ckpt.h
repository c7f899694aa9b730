/* A checkpoint: the directory ckpt_root/JOB/STEP, where JOB and STEP pass
 * config_check_name (so neither is hidden, and ORIGIN/JOB/STEP is a safe
 * path on every holder). Committing it writes STEP/.stage/manifest, the
 * same format a pull writes (docs/MANIFEST.md), over the bytes as they are
 * on disk at that moment.
 */
#ifndef STAGE_CKPT_H
#define STAGE_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "common/digest.h"
#include "common/proto.h"

#define CKPT_NAME_MAX 255

/* The job and step of an absolute, resolved path that must be exactly
 * ckpt_root/JOB/STEP. 0, or -EINVAL with why naming the path. */
int ckpt_parse(const struct stage_config *cfg, const char *path, char job[CKPT_NAME_MAX + 1],
	       char step[CKPT_NAME_MAX + 1], char *why, size_t whylen);

/* The checkpoint a client's path names, whether or not it exists on this
 * node: ckpt_root/JOB/STEP (*origin set to "") or, when replicas_ok,
 * replica_root/ORIGIN/JOB/STEP. The path is resolved like roots_resolve.
 * 0, or -errno with why naming the path. */
int ckpt_locate(const struct stage_config *cfg, const char *arg, bool replicas_ok,
		char origin[CKPT_NAME_MAX + 1], char job[CKPT_NAME_MAX + 1],
		char step[CKPT_NAME_MAX + 1], char *why, size_t whylen);

/* Hashes every file of ckpt_root/JOB/STEP through io_uring and publishes its
 * manifest (temporary name, fsync, rename). A file that changes while it is
 * read fails the commit (-ESTALE): the checkpoint was not finished. With
 * `sent` (its copies go to partners next), [transfer] cache_reads = auto
 * reads cold files through the page cache too, up to a quarter of the
 * memory available, so that the sends read them from memory. With
 * in_order (a copy reads the step beside the hash, file after file), one
 * file is hashed at a time, in the manifest's order, on this thread: the
 * copy then finds each file's pages just read, and the disk reads it once
 * at its own pace rather than a quarter of it per file. 0 with *root,
 * *files and *bytes, or -errno with why. */
int ckpt_manifest(const struct stage_config *cfg, const char *job, const char *step, bool sent,
		  bool in_order, digest_t *root, uint64_t *files, uint64_t *bytes, char *why,
		  size_t whylen);

/* Natural order of step names: runs of digits compare as numbers, so
 * step-9 < step-10 < step-100. <0, 0, >0. */
int ckpt_step_cmp(const char *a, const char *b);

/* The steps of the job directory jobfd that `want` takes (NULL: every valid
 * name), oldest first in natural order, into *out (malloc'd, *n of them;
 * NULL when none). 0 or -errno. want gets jobfd and a step name. */
typedef char ckpt_name_t[CKPT_NAME_MAX + 1];
int ckpt_steps(int jobfd, bool (*want)(int jobfd, const char *step, const void *arg),
	       const void *arg, ckpt_name_t **out, size_t *n);
/* A want for ckpt_steps: the step has its manifest (committed). */
bool ckpt_has_manifest(int jobfd, const char *step, const void *arg);

/* The root (and chunk size, if chunk is not NULL) of the complete manifest
 * at dirfd/name: 0, or -errno (-EBADMSG: damaged), with why (if not NULL)
 * naming the line and the rule it broke. */
int ckpt_manifest_root(int dirfd, const char *name, digest_t *root, uint64_t *chunk,
		       char *why, size_t whylen);

/* A node, job or step name field of a peer's frame: 0, -EINVAL (not a valid
 * name), -ENOENT (no such field). */
int ckpt_get_name(const struct msg *m, uint16_t key, char out[CKPT_NAME_MAX + 1]);

#endif
