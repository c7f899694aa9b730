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
#include <stdint.h>
#include <sys/types.h>

#include "common/config.h"
#include "common/digest.h"
#include "common/proto.h"
#include "common/xport.h"
#include "daemon/job/job.h"

/* After peers_open (the membership, the listener): finds this node's
 * partners, registers the offer in the peer layer's table, reloads the
 * commit records in state_dir, starts the senders, the committer and
 * (watch = on) the watcher. 0, or -errno with why (a start-up error). */
int repl_open(const struct stage_config *cfg, char *why, size_t whylen);
/* Stops every thread, closing its connections; committed records stay.
 * After peers_stop: no peer's request is served any more. */
void repl_close(void);

/* Serves MSG_COMMIT_REQ (sends the result). */
void repl_commit_run(struct job *j, const char *path);
/* Sends this node's JOB/STEP to partner `holder` again (it lost its copy:
 * a replacement node): the copy is queued anew if the commit's record is
 * kept, else the step is committed again (hashed, and offered to every
 * partner, which take only what they lack), and waits until `holder` has
 * confirmed it, so that a `verify --cluster` right after a resume finds it.
 * 0 confirmed, or -errno with why (-ENOENT: not a partner, or no committed
 * step; -EBUSY: being restored; -EHOSTDOWN: the partner has been down for
 * [cluster] peer_timeout: the copy stays queued and goes when it is back;
 * -EIO: the copy failed; -ESTALE: newer steps took the record's place;
 * -ECANCELED: the daemon is stopping). */
int repl_resend(const char *job, const char *step, const char *holder, char *why, size_t whylen);
/* K_NAME/K_VALUE pairs for `stage status` (peers, transfers): the
 * transfers of checkpoints viewer owns (root: all). */
void repl_status(struct msg *m, uid_t viewer);
/* K_NAME/K_VALUE pairs for `stage ls`, one per checkpoint viewer may see:
 * root all, a user the jobs and replicas they own. */
void repl_ls(struct msg *m, uid_t viewer);
/* The per-partner families of `stage metrics` (repl_metrics.c): a few
 * series per partner, so at most a few per node of the hosts file. */
struct prom;
void repl_metrics(struct prom *p);

/* A restore under way (or interrupted) leaves DIR/.stage/RESTORE_MARK until
 * the step is whole again; no commit of the step is made while it is there. */
#define RESTORE_MARK "restoring"
/* Marks JOB/STEP as being restored (the watcher leaves it alone): 0, or
 * -EBUSY if it already is. */
int repl_restore_begin(const char *job, const char *step);
void repl_restore_end(const char *job, const char *step);

/* A checkpoint's manifest goes to a peer in slices of REPL_MF_SLICE bytes;
 * none larger than REPL_MF_MAX is taken. */
#define REPL_MF_SLICE (256u << 10)
#define REPL_MF_MAX (256ull << 20)
/* The mode an entry gets when another node's manifest says it: without
 * set-id bits. Receiver and restore create files and directories as
 * themselves (root, usually), so a set-id bit taken on a peer's word would
 * let any holder of the cluster key plant a set-uid-root program, or a
 * set-gid-root directory, on its partners. The sticky bit is kept. */
#define PEER_MODE(m) ((m) & 01777)

/* How the copies of this node's commit of JOB/STEP stand where a partner
 * has not confirmed them: peers.copy_notes while replication runs
 * (daemon/peers/peers.h). */
size_t repl_copy_notes(const char *job, const char *step, const digest_t *root, char **out,
		       size_t cap);
/* The newest checkpoint this node committed: its bytes (0: none) and, in
 * what, its JOB/STEP. */
uint64_t repl_newest_committed(char *what, size_t len);

/* A restored step of this node: its record says committed with this root,
 * and the partners are offered it again (those holding it answer "have it"). */
void repl_restored(const char *job, const char *step, digest_t root, uint64_t files,
		   uint64_t bytes);

#endif
