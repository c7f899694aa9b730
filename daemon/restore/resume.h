/* stage resume JOB: the newest step every origin of the job can resume
 * from, and each origin's own copy of it repaired where it is not intact.
 *
 * What "can resume from" means, for a step S: every origin O of the job
 * (the nodes of --nodes, else every node any copy of the job names as its
 * origin, and every node that did not answer, which might be one) has an
 * intact copy of its shards of S somewhere (its own, or a
 * replica), all its intact copies of S agree (one root digest), and O
 * answered, so that its own copy is known. The step chosen is the newest
 * such S among the steps the nodes hold (hold.h: the newest HOLD_STEPS_MAX
 * of each copy directory). Then every O whose own copy of S is not intact
 * restores it from an intact one, all of them at once: this node in place,
 * the others asked over the peer connection (MSG_RESTORE_ASK), each
 * running the same restore `stage restore` runs. Then each partner that
 * placement puts a copy of an origin's step on, that answered and holds no
 * intact copy (a replacement node lost the replicas it held), gets it again:
 * the origin is asked to send it (MSG_RESEND_ASK), and replication does.
 *
 * The survey of every step is a fast one (sizes and mtimes, as `stage
 * verify`). With --deep, the step chosen is then surveyed again reading
 * every byte, and decided on again from that alone; a step that fails it is
 * skipped and the next newest tried, so bit rot that kept the mtime is
 * caught before the job loads it.
 *
 * The decision (resume_decide) is apart from any I/O, and unit-tested.
 */
#ifndef STAGE_RESUME_H
#define STAGE_RESUME_H

#include <stdbool.h>
#include <stddef.h>

#include "common/copygroup.h"
#include "common/digest.h"
#include "common/xport.h"
#include "daemon/job/job.h"

struct resume_in {
	const char *const *origins;  /* the job's nodes, or NULL: those the cells name */
	size_t norigins;
	const char *const *names;    /* every node asked, and whether it answered */
	const bool *reached;
	size_t nnodes;
	const struct hold_cell *cells;  /* every node's copy groups, of every step */
	size_t ncells;
	const char *const *skip;     /* steps not to choose (found damaged by a deep look) */
	size_t nskip;
	/* Where placement puts ORIGIN's copies (up to cap names), or NULL:
	 * no replica is checked. */
	size_t (*placement)(const char *origin, const char **out, size_t cap);
};

struct resume_fix {
	const char *origin;          /* whose own copy is restored */
	const char *from;            /* the holder of the intact copy it comes from */
	digest_t root;               /* the commit chosen: nothing else is restored */
};

struct resume_send {
	const char *origin;          /* who sends its copy of the step again */
	const char *to;              /* the partner placement puts a copy on, which lacks it */
};

struct resume_out {
	const char *step;            /* the step chosen (into the cells), NULL if none */
	struct resume_fix *fix;      /* owned: the origins to repair */
	size_t nfix;
	struct resume_send *send;    /* owned: the replicas to send again */
	size_t nsend;
	char **why;                  /* owned: why each newer step (or any) does not qualify */
	size_t nwhy;
	const char **origins;        /* owned array, borrowed names: the job's nodes */
	size_t norigins;
};

/* 0 a step qualifies (out->step), 1 none does (out->why says why), -ENOMEM. */
int resume_decide(const struct resume_in *in, struct resume_out *out);
void resume_out_free(struct resume_out *out);

/* After `stage restore` of JOB/STEP on this node (a replacement node, say):
 * each origin whose survey answer shows its own copy of the step intact,
 * that placement gives this node a copy of, and whose copy this node does
 * not hold intact (survey cells: every answer's), is asked to send it again
 * (MSG_RESEND_ASK), all at once, each said in a note. Replication sends
 * only what is missing. */
struct hold_cell;
void resume_holdings(struct job *j, const char *job, const char *step,
		     const struct hold_cell *cells, size_t ncells);

/* Serves MSG_RESUME_REQ (sends notes and the result; its K_PATH is this
 * node's ckpt_root/JOB/STEP). nodes: --nodes, or NULL. */
void resume_run(struct job *j, const char *job, const char *nodes);
/* MSG_RESTORE_ASK from the resuming node: restores this node's own copy of
 * JOB/STEP from K_HOLDER; MSG_RESEND_ASK: sends this node's JOB/STEP to
 * partner K_HOLDER again and waits for it to land (repl_resend). Answers
 * MSG_ASK_DONE with an exit code and text. 0 to go on, -errno to close. */
int resume_serve(struct xport *x, const char *peer, const struct msg *req);

#endif
