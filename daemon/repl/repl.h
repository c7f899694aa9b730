/* Checkpoint replication: the daemon's side of `stage commit`, the watcher,
 * the partners' senders and the receivers of other nodes' checkpoints.
 * docs/ARCHITECTURE.md ("Checkpoints") tells the whole story; the wire is in
 * docs/PROTOCOL.md ("Replication").
 *
 * One replication service per daemon: repl_open at start-up, repl_close at
 * exit (mirror images). Every other call may come from any thread.
 */
#ifndef STAGE_REPL_H
#define STAGE_REPL_H

#include <stddef.h>

#include <stdbool.h>

#include "common/config.h"
#include "common/digest.h"
#include "common/proto.h"
#include "daemon/job/job.h"

/* Loads the hosts file and key (a missing hosts file at the configured
 * path means a single node), reloads the commit records in state_dir,
 * binds the peer listener, starts the senders, the committer and (watch =
 * on) the watcher. 0, or -errno with why (a start-up error: bad hosts file,
 * key file, this node missing from the hosts file, listen address busy). */
int repl_open(const struct stage_config *cfg, char *why, size_t whylen);
/* Stops every thread, closing connections; committed records stay. */
void repl_close(void);
/* The peer listener's fd for the event loop (-1: none), and what to call
 * when it is readable. */
int repl_listen_fd(void);
void repl_accept(void);

/* Serves MSG_COMMIT_REQ (sends the result). */
void repl_commit_run(struct job *j, const char *path);
/* K_NAME/K_VALUE pairs for `stage status` (peers, transfers). */
void repl_status(struct msg *m);
/* K_NAME/K_VALUE pairs for `stage ls`, one per checkpoint. */
void repl_ls(struct msg *m);

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
 * what it holds of JOB/STEP, all at once. *ans: one answer per node in hosts
 * file order, *n of them (a single node: one). 0, -ENOENT (`only` is not a
 * node of the hosts file) or -ENOMEM. */
int repl_survey(const char *job, const char *step, bool deep, const char *only,
		struct repl_answer **ans, size_t *n);
void repl_answers_free(struct repl_answer *a, size_t n);
/* Where placement puts ORIGIN's copies: up to cap node names, in order. */
size_t repl_placement(const char *origin, const char **holders, size_t cap);
const char *repl_self_name(void);

/* A restore under way (or interrupted) leaves DIR/.stage/RESTORE_MARK until
 * the step is whole again; no commit of the step is made while it is there. */
#define RESTORE_MARK "restoring"

/* Serves MSG_RESTORE_REQ (repl_restore.c; sends the result). from: the
 * node to restore from (--from), or NULL for the best copy. */
void repl_restore_run(struct job *j, const char *path, const char *from);
/* A restored step of this node: its record says committed with this root,
 * and the partners are offered it again (those holding it answer "have it"). */
void repl_restored(const char *job, const char *step, digest_t root, uint64_t files,
		   uint64_t bytes);

#endif
