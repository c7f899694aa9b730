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

#include "common/config.h"
#include "common/proto.h"
#include "daemon/job.h"

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

#endif
