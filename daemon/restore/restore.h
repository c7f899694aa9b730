/* Restore (daemon/restore/): a checkpoint of this node brought back from a
 * partner's copy or the durable tier (restore.c, its lanes lane.c, its
 * sources rsrc.h), the holder's side of it (fetch.c), and resume
 * (resume.h), which restores and sends copies again. Above the survey
 * (survey.h), which tells who holds what.
 */
#ifndef STAGE_RESTORE_H
#define STAGE_RESTORE_H

#include "common/digest.h"
#include "common/proto.h"
#include "common/xport.h"
#include "daemon/job/job.h"
#include "daemon/survey/survey.h"

/* What follows a restore that succeeded, with its survey's cells (every
 * answer's): resume_holdings, given by the caller (the restore calls up
 * into nothing). */
typedef void restore_then_fn(struct job *j, const char *job, const char *step,
			     const struct hold_cell *cells, size_t ncells);
/* Serves MSG_RESTORE_REQ (restore.c; sends the result). from: the
 * node to restore from (--from), or NULL for the best copy; then: NULL or
 * called once it is restored. */
void restore_run(struct job *j, const char *path, const char *from, restore_then_fn *then);
/* The same, restoring only commit *pin (resume's choice): refused when this
 * node's own manifest or the holder's copy is of another commit. */
void restore_pinned(struct job *j, const char *path, const char *from, const digest_t *pin);
/* MSG_FETCH_REQ from a peer (fetch.c): the manifest or a byte range of
 * the copy this node holds of the peer's own checkpoint. 0 to go on, -errno
 * to close the connection (a refusal has been sent). */
int restore_fetch_serve(struct xport *x, const char *peer, const struct msg *req);

#endif
