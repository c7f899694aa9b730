/* What this node holds of one checkpoint step: its own copy
 * (ckpt_root/JOB/STEP) and the replicas it keeps for others
 * (replica_root/ORIGIN/JOB/STEP), each checked against its manifest (types,
 * sizes and mtimes; with deep, every byte). The answer to a peer's
 * MSG_HOLD_REQ, and this node's own part of verify --cluster and restore.
 *
 * The answer is a list of copy groups (common/proto.h): for every origin
 * this node holds anything of JOB from, either the step asked for ("ok",
 * "damaged", "incomplete") or, when it holds only other steps of the job,
 * "other-step" naming the latest. A node with nothing of JOB says nothing:
 * that is how verify --cluster learns which nodes took part in a job.
 */
#ifndef STAGE_HOLD_H
#define STAGE_HOLD_H

#include <stdbool.h>
#include <stdint.h>

#include "common/config.h"
#include "common/copygroup.h"
#include "common/proto.h"
#include "common/xport.h"

#define HOLD_STEPS_MAX 16       /* steps per copy directory a survey of every step covers */

/* Appends this node's copy groups to m; step NULL: a group per step held,
 * the newest HOLD_STEPS_MAX of each copy directory (for resume). self: this
 * node's name. 0 or -errno
 * (-ENOMEM). A copy that cannot be read is a group with its reason, not an
 * error. */
int hold_survey(const struct stage_config *cfg, const char *self, const char *job,
		const char *step, bool deep, struct msg *m);
/* The same for the durable tier ([durable] root, durable/tier.h), as this
 * node sees it: a group for each origin whose part of the step (of each of
 * the newest HOLD_STEPS_MAX steps, step NULL) is drained there, "ok" or
 * "damaged" by a check of sizes and mtimes, never of every byte (a restore
 * from it checks each chunk). An origin whose part is not there has no
 * group: a step is drained every `every` commits, so its absence is no
 * finding. 0, or -errno when the root cannot be read. */
int hold_survey_durable(const struct stage_config *cfg, const char *job, const char *step,
			struct msg *m);

/* MSG_HOLD_REQ from a peer (peers_serve): answered with MSG_HOLD on its
 * connection, which stays open. 0 to go on, -errno to close it (a refusal
 * has been sent). */
int hold_serve(struct xport *x, const char *peer, const struct msg *req);

#endif
