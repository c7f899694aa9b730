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
#include "common/xport.h"
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

/* A request a peer may send on its connection between offers (MSG_HOLD_REQ,
 * MSG_FETCH_REQ), and who serves it: set before repl_open. The server
 * returns 0 to go on, -errno to close the connection (a refusal sent). */
typedef int repl_serve_fn(struct xport *x, const char *peer, const struct msg *req);
int repl_recv_serve(uint16_t type, repl_serve_fn *serve);
/* Who serves a request type (NULL: nobody): a relay answers a question in
 * place with the same function (daemon/cluster/fanout.c). */
repl_serve_fn *repl_recv_served(uint16_t type);

/* Serves MSG_COMMIT_REQ (sends the result). */
void repl_commit_run(struct job *j, const char *path);
/* Sends this node's JOB/STEP to partner `holder` again (it lost its copy:
 * a replacement node): the copy is queued anew if the commit's record is
 * kept, else the step is committed again (hashed, and offered to every
 * partner, which take only what they lack). 0, or -errno with why
 * (-ENOENT: not a partner, or no committed step; -EBUSY: being restored). */
int repl_resend(const char *job, const char *step, const char *holder, char *why, size_t whylen);
/* K_NAME/K_VALUE pairs for `stage status` (peers, transfers). */
void repl_status(struct msg *m);
/* K_NAME/K_VALUE pairs for `stage ls`, one per checkpoint. */
void repl_ls(struct msg *m);
/* The per-partner families of `stage metrics` (repl_metrics.c): a few
 * series per partner, so at most a few per node of the hosts file. */
struct prom;
void repl_metrics(struct prom *p);

/* A restore under way (or interrupted) leaves DIR/.stage/RESTORE_MARK until
 * the step is whole again; no commit of the step is made while it is there. */
#define RESTORE_MARK "restoring"

/* This node's name in the cluster. */
const char *repl_self_name(void);
/* A restored step of this node: its record says committed with this root,
 * and the partners are offered it again (those holding it answer "have it"). */
void repl_restored(const char *job, const char *step, digest_t root, uint64_t files,
		   uint64_t bytes);

#endif
