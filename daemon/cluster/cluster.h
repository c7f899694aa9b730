/* Asking the cluster (daemon/cluster/): what every node holds of a step,
 * verify --cluster (cverify.h), restore, and the holder's side of it. Above
 * replication: it uses the cluster replication knows (repl.h), never the
 * reverse; what a holder serves reaches it through the peer layer's table (peers_serve).
 */
#ifndef STAGE_CLUSTER_H
#define STAGE_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>

#include "common/digest.h"
#include "common/proto.h"
#include "common/xport.h"
#include "daemon/job/job.h"

/* One node's answer in a survey (repl_ask.c). */
struct hold_cell;
struct repl_answer {
	const char *node;          /* its name in the hosts file, borrowed */
	int err;                   /* 0: it answered; else -errno and why */
	char why[512];
	struct hold_cell *cells;   /* its copy groups (daemon/cluster/hold.h), holder = node */
	size_t ncells;
};
/* Asks every node (this one answers in place; with `only`, just that node)
 * what it holds of JOB/STEP (step NULL: of every step, hold.h), all at
 * once. *ans: one answer per node in hosts file order (a single node: one),
 * then, with a [durable] root, the durable tier's as this node reads it
 * (node HOLD_DURABLE, hold_survey_durable); *n of them. only HOLD_DURABLE:
 * the durable tier's alone. 0, -ENOENT (`only` is neither a node of the
 * hosts file nor a durable tier this node has) or -ENOMEM. */
int repl_survey(const char *job, const char *step, bool deep, const char *only,
		struct repl_answer **ans, size_t *n);
void repl_answers_free(struct repl_answer *a, size_t n);
/* A survey's answers side by side, as the decisions take them: per node
 * its name, why it was not reached and whether it was; every node's copy
 * groups in one array. The arrays are owned (repl_flat_free), the strings
 * stay the answers'. 0 or -ENOMEM. */
struct repl_flat {
	const char **names, **why;
	bool *reached;
	size_t nnodes, unreached;
	struct hold_cell *cells;
	size_t ncells;
};
int repl_flatten(const struct repl_answer *ans, size_t n, struct repl_flat *f);
void repl_flat_free(struct repl_flat *f);
/* --nodes LIST (names or a Slurm hostlist) expanded and checked against the
 * hosts file: 0 and *names (hostlist_free), *n; NULL list: 0 and none.
 * -EINVAL with why naming the bad item or the unknown node, -ENOMEM. */
int repl_nodes(const char *list, char ***names, size_t *n, char *why, size_t whylen);
/* Where placement puts ORIGIN's copies: up to cap node names, in order. */
size_t repl_placement(const char *origin, const char **holders, size_t cap);

/* What follows a restore that succeeded, with its survey's cells (every
 * answer's): resume_holdings, given by the caller (the restore calls up
 * into nothing). */
typedef void repl_restored_fn(struct job *j, const char *job, const char *step,
			      const struct hold_cell *cells, size_t ncells);
/* Serves MSG_RESTORE_REQ (repl_restore.c; sends the result). from: the
 * node to restore from (--from), or NULL for the best copy; then: NULL or
 * called once it is restored. */
void repl_restore_run(struct job *j, const char *path, const char *from, repl_restored_fn *then);
/* The same, restoring only commit *pin (resume's choice): refused when this
 * node's own manifest or the holder's copy is of another commit. */
void repl_restore_pinned(struct job *j, const char *path, const char *from, const digest_t *pin);
/* MSG_FETCH_REQ from a peer (repl_fetch.c): the manifest or a byte range of
 * the copy this node holds of the peer's own checkpoint. 0 to go on, -errno
 * to close the connection (a refusal has been sent). */
int repl_fetch_serve(struct xport *x, const char *peer, const struct msg *req);

#endif
