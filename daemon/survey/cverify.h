/* stage verify --cluster: every node reports the copies it holds of one
 * checkpoint step, and this node decides whether the job can resume from
 * it. The table, the decision and its rules: docs/ARCHITECTURE.md
 * ("Verifying a step across the cluster"). */
#ifndef STAGE_CVERIFY_H
#define STAGE_CVERIFY_H

#include <stddef.h>

#include "daemon/survey/survey.h"
#include "daemon/survey/hold.h"
#include "daemon/job/job.h"

/* Serves MSG_VERIFY_REQ with REQ_CLUSTER (sends MSG_CELLS, notes, result).
 * nodes: --nodes, the job's nodes (each must hold its own copy), or NULL. */
void cverify_run(struct job *j, const char *path, const char *nodes);

/* The decision, apart from any I/O (unit-tested). Inputs: the step, every
 * node asked (names[i]; reached[i] false when it could not be asked, why[i]
 * saying why), the copy groups they returned, and placement (where each
 * origin's replicas belong: placement(origin, out, cap) -> count).
 * Outputs: *table, the cells to show (origin x holder, "missing" and
 * "differs" filled in; holder-level "unreachable" groups), and *problems,
 * one line per reason the step does not verify (NULL-terminated, both
 * owned: cverify_free). Returns 0 verified, 1 not, -ENOMEM. */
struct cverify_in {
	const char *step;
	size_t nnodes;
	const char *const *names;
	const bool *reached;
	const char *const *why;
	const struct hold_cell *cells;
	size_t ncells;
	size_t (*placement)(const char *origin, const char **out, size_t cap);
	const char *const *members;  /* the job's nodes (--nodes): origins whether or not any
				      * copy names them; NULL: the cells' origins only */
	size_t nmembers;
};
struct cverify_out {
	struct hold_cell *table;
	size_t ntable;
	char **problems;
	size_t nproblems;
	bool recoverable;          /* every origin has an intact copy somewhere */
	size_t norigins;
	size_t noted, on_way;      /* of the problems: copies their origin says it has not
				    * sent (K_COPY), and of those the ones on their way (being
				    * sent, or queued with nothing against them) */
};
int cverify_decide(const struct cverify_in *in, struct cverify_out *out);
void cverify_free(struct cverify_out *out);

#endif
