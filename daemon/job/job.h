/* A job: one client request being served (a pull, a verify), on the
 * connection's own thread. It owns nothing of the client but reports to it:
 * notes, throttled progress, and exactly one result, the last frame. The
 * registry lets `stage status` list jobs in flight.
 *
 * Fields marked "atomic" are written by the job's thread and read by any
 * thread serving a status request; the rest belong to the job's thread.
 */
#ifndef STAGE_JOB_H
#define STAGE_JOB_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/config.h"
#include "common/log.h"
#include "common/proto.h"

extern atomic_bool stage_stopping;  /* set by SIGTERM: every job winds down */

struct job {
	int fd;                          /* the client's connection, borrowed; -1: none
					  * (work done for a peer: notes are only logged) */
	uint32_t flags;                  /* REQ_* of the request */
	const struct stage_config *cfg;  /* borrowed, immutable while running */
	char kind[16];                   /* "pull", "verify" */
	uid_t uid;                       /* whom it works for: its thread's fsuid at
					  * job_begin; status shows it to them and root */
	char what[512];                  /* for status: what it works on */
	_Atomic(const char *) phase;     /* atomic: "scan", "copy", "verify" */
	_Atomic uint64_t files_done, files_total, bytes_done, bytes_total;
	uint64_t t_start_ns;             /* CLOCK_MONOTONIC */
	_Atomic uint64_t t_alive_ns;     /* atomic: its thread last asked job_progress or
					  * job_cancelled; long ago, it is stuck in a call */
	bool watch_stuck;                /* set by a job whose loops ask them every few
					  * hundred ms (a pull): status says when it is stuck */
	uint64_t t_progress_ns;          /* last MSG_PROGRESS sent */
	uint64_t t_check_ns;             /* last look at the client socket */
	_Atomic bool gone;               /* the client hung up: cancel */
	pthread_mutex_t send_mu;         /* one frame at a time: notes may come from the
					  * job's helper threads (a restore's lanes) */
	bool sent_result;
	int code;                        /* the result's, once sent (work done for a peer
					  * reads it here) */
	char result[1024];               /* its text, cut to fit */
	struct job *next;                /* registry link, under the registry lock */
};

void job_begin(struct job *j, int fd, uint32_t flags, const struct stage_config *cfg,
	       const char *kind, const char *what);
void job_end(struct job *j);
/* What the job works on, for `stage status` (under the registry's lock). */
void job_set_what(struct job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A finding or message for the user: kind/path may be NULL. Also logged.
 * Any thread of the job may send notes; job_progress, job_cancelled and
 * job_result are the job thread's. */
void job_note(struct job *j, enum log_level lvl, const char *kind, const char *path,
	      const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Sends a frame of the job's own (a table) the way notes go: never blocking
 * for long on a client that stopped reading. Consumes m. */
void job_send(struct job *j, struct msg *m);
/* Sends MSG_PROGRESS if asked for and 100 ms have passed (or force). */
void job_progress(struct job *j, bool force);
/* The same, more(m, arg) adding fields of the job's own to the frame. */
void job_progress_with(struct job *j, bool force, void (*more)(struct msg *m, void *arg),
		       void *arg);
/* Whether to stop: the daemon is stopping or the client hung up. Cheap. */
bool job_cancelled(struct job *j);
/* The result frame: code is the client's exit code. `m` carries extra
 * fields (may be NULL) and is consumed. */
void job_result(struct job *j, int code, const char *path, struct msg *m,
		const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Appends one K_NAME/K_VALUE pair per job in flight that viewer may see
 * (its own; root: all) to m. */
void jobs_status(struct msg *m, uid_t viewer);
unsigned jobs_count(uid_t viewer);

#endif
