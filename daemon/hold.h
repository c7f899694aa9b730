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
#include "common/digest.h"
#include "common/proto.h"

/* Appends this node's copy groups to m. self: this node's name. 0 or -errno
 * (-ENOMEM). A copy that cannot be read is a group with its reason, not an
 * error. */
int hold_survey(const struct stage_config *cfg, const char *self, const char *job,
		const char *step, bool deep, struct msg *m);

/* One copy group, parsed. Strings are owned (hold_cells_free). */
struct hold_cell {
	char *origin, *holder, *state, *step;
	bool has_root;
	digest_t root;
	uint64_t files, bytes;
	char *text[COPY_TEXTS_MAX];
	unsigned ntext;
};

/* Parses every copy group of m, appending to *cells (*n of them, growing).
 * holder: for a MSG_HOLD, its sender, the holder of every group (a group
 * naming a holder of its own is refused); NULL for a MSG_CELLS, whose groups
 * name theirs. 0, or -EBADMSG (a group without a state, a bad root, a name
 * that is not a node or step name, an allocation that failed), and then
 * nothing was appended. */
int hold_parse(const struct msg *m, const char *holder, struct hold_cell **cells, size_t *n);
/* Appends one group to m (the inverse of hold_parse; holder may be NULL). */
void hold_put(struct msg *m, const struct hold_cell *c, bool with_holder);
void hold_cells_free(struct hold_cell *cells, size_t n);

#endif
