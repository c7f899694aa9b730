/* The durable tier: each committed step of this node drained to shared
 * storage ([durable] root), so that ROOT/JOB/STEP is a checkpoint the
 * training framework loads as it is: every origin's files side by side in
 * one directory, each origin's manifest as ROOT/JOB/STEP/.stage/manifest.NODE.
 *
 * States of a step, per origin, on the durable root:
 *   absent --files copied, each under a temporary name, checked, made
 *   durable, renamed (never over another's file)--> files there
 *   --.stage/manifest.NODE written last (temporary, fsync, rename)--> drained
 *   --past `keep` newer drained steps--> retired (this origin's files, then
 *   its manifest, then the directories left empty).
 * A drained step is one whose manifest.NODE is there with the root of the
 * step's manifest in ckpt_root; the durable root itself is the record of
 * what is done, so a drain killed anywhere resumes by doing the step again
 * (its files already there are checked, not copied twice).
 *
 * Which steps: of each job, every `every`th committed step in commit order
 * as the drainer sees them (state_dir/durable/JOB: the newest step seen, the
 * count since the last chosen, the chosen ones not yet drained), the first
 * time a job is seen its newest step. One thread, at the lowest priority
 * replication's threads use and at most `rate` bytes a second: the drain
 * never holds replication's lock and never delays it.
 */
#ifndef STAGE_DRAIN_H
#define STAGE_DRAIN_H

#include <stddef.h>

#include "common/config.h"

/* With cfg->durable_root set, starts the drainer. 0 or -errno (why). */
int durable_start(const struct stage_config *cfg, char *why, size_t whylen);
void durable_stop(void);

#endif
