/* Asking the cluster (daemon/survey/): what every node holds of a step
 * (survey.c, through relays past [cluster] fanout: fanout.c), the holder's
 * answer (hold.h), and verify --cluster's decision (cverify.h). Restore,
 * resume, the cluster pull and the doctor ask through it. What a holder
 * serves reaches it through the peer layer's table (peers_serve).
 */
#ifndef STAGE_SURVEY_H
#define STAGE_SURVEY_H

#include <stdbool.h>
#include <stddef.h>

#include "common/digest.h"
#include "common/proto.h"
#include "common/xport.h"
#include "daemon/job/job.h"

/* One node's answer in a survey (survey.c). */
struct hold_cell;
struct survey_answer {
	const char *node;          /* its name in the hosts file, borrowed */
	int err;                   /* 0: it answered; else -errno and why */
	char why[512];
	struct hold_cell *cells;   /* its copy groups (daemon/survey/hold.h), holder = node */
	size_t ncells;
};
/* Asks every node (this one answers in place; with `only`, just that node)
 * what it holds of JOB/STEP (step NULL: of every step, hold.h), all at
 * once. *ans: one answer per node in hosts file order (a single node: one),
 * then, with a [durable] root, the durable tier's as this node reads it
 * (node HOLD_DURABLE, hold_survey_durable); *n of them. only HOLD_DURABLE:
 * the durable tier's alone. 0, -ENOENT (`only` is neither a node of the
 * hosts file nor a durable tier this node has) or -ENOMEM. */
int survey_ask(const char *job, const char *step, bool deep, const char *only,
	       struct survey_answer **ans, size_t *n);
void survey_answers_free(struct survey_answer *a, size_t n);
/* A survey's answers side by side, as the decisions take them: per node
 * its name, why it was not reached and whether it was; every node's copy
 * groups in one array. The arrays are owned (survey_flat_free), the strings
 * stay the answers'. 0 or -ENOMEM. */
struct survey_flat {
	const char **names, **why;
	bool *reached;
	size_t nnodes, unreached;
	struct hold_cell *cells;
	size_t ncells;
};
int survey_flatten(const struct survey_answer *ans, size_t n, struct survey_flat *f);
void survey_flat_free(struct survey_flat *f);
/* --nodes LIST (names or a Slurm hostlist) expanded and checked against the
 * hosts file: 0 and *names (hostlist_free), *n; NULL list: 0 and none.
 * -EINVAL with why naming the bad item or the unknown node, -ENOMEM. */
int survey_nodes(const char *list, char ***names, size_t *n, char *why, size_t whylen);
/* Where placement puts ORIGIN's copies: up to cap node names, in order. */
size_t survey_placement(const char *origin, const char **holders, size_t cap);

#endif
