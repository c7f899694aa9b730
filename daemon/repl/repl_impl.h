/* Inside the replication service: what repl.c, repl_view.c, repl_rec.c,
 * repl_send.c, repl_recv.c and repl_build.c share. Not for the rest of the daemon (it
 * uses repl.h); tools/check-calls holds every *_impl.h to its folder.
 *
 * A record is one committed checkpoint of this node (origin side):
 *
 *   R_HASHING --ckpt_manifest ok--> R_READY --every copy confirmed--> (done)
 *        \--fails--> R_FAILED        (a new commit of the step: R_HASHING)
 *
 * and per partner a copy:  PENDING --sender takes it--> SENDING
 *   SENDING --DONE 0--> CONFIRMED
 *   SENDING --connection lost--> PENDING (retried with backoff, resumes)
 *   SENDING --refused by the receiver MAX_TRIES times--> FAILED
 *   PENDING --stale (below)--> SKIPPED --stale no more--> PENDING
 *
 * A pending copy is stale ([transfer] stale = skip) when a newer step of its
 * job (later by ckpt_step_cmp, and committed after it) is R_READY (or being
 * hashed again after it was) with its copy to the same partner not failed
 * (pending, being sent, confirmed, or skipped for a newer one still), nobody
 * waits for this one (not pinned: a `commit --wait`, or a resend that `stage
 * resume` asks for; a pin lasts until the copy is confirmed), and it was
 * never begun (the receiver took its offer: a copy cut off mid-way goes on,
 * the receiver holding its first part). The sender skips stale copies when it
 * picks its next: the newest step goes first, as a trainer that saves faster
 * than its copies go needs. A skipped copy is logged, saved and shown by
 * `stage ls`; it is pending again once it is stale no more (the newer step's
 * copy failed for good, or its new hash failed), when it is committed again
 * (then after the newer step), or resent.
 *
 * Invariants: records and copies change only under repl.lock, and every
 * change that must survive a restart is written to the record's file
 * (repl_rec_save) before the lock is dropped; the file is replaced whole
 * (temporary, fsync, rename). A sender holds at most one copy in SENDING.
 * Records are ordered by seq (commit time); retention keeps `keep` per job.
 */
#ifndef STAGE_REPL_IMPL_H
#define STAGE_REPL_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/auth.h"
#include "common/config.h"
#include "common/digest.h"
#include "common/hosts.h"
#include "daemon/ckpt/ckpt.h"
#include "daemon/engine/psend.h"
#include "daemon/engine/sadapt.h"
#include "common/xport.h"
#include "daemon/net/net.h"
#include "daemon/peers/peers.h"
#include "daemon/repl/repl.h"

#define REPL_PIECE PSEND_PIECE         /* raw bytes per MSG_DATA */
#define REPL_MAX_TRIES 5
#define REPL_MAX_STREAMS PSEND_MAX_STREAMS     /* connections one copy may go on */
_Static_assert(SADAPT_MAX <= PSEND_MAX_STREAMS, "adapting stays within a copy's streams");
#define REPL_FINISH_MS 600000          /* receiver's final sync and publish */
#define REPL_WRITERS 64                /* jobs being written remembered ([transfer] yield) */


enum rstate { R_HASHING, R_READY, R_FAILED };
enum cstate { C_PENDING, C_SENDING, C_CONFIRMED, C_FAILED, C_SKIPPED };

struct rcopy {
	enum cstate state;
	unsigned tries;            /* refusals by the receiver in a row */
	bool pinned;               /* someone waits for it: never skipped */
	bool begun;                /* taken by the sender since committed: never skipped
				    * (the receiver may hold part of it) */
	uint64_t sent, total;      /* bytes of this transfer (raw), for progress */
	/* How the last confirmed try went, for [transfer] read_once = auto (not
	 * saved: a restarted daemon sends the manifest first until it knows). */
	enum { HOW_UNKNOWN, HOW_FIRST, HOW_LATE } how;   /* manifest first / last */
	bool follows;              /* HOW_FIRST: an older step of the job was there */
	uint64_t held;             /* HOW_FIRST: bytes the receiver held already */
	char why[1024];            /* last failure, or what it was skipped for; "" if none */
};

struct record {
	char job[CKPT_NAME_MAX + 1], step[CKPT_NAME_MAX + 1];
	uint64_t seq;              /* CLOCK_REALTIME ns of the commit */
	enum rstate state;
	bool rehash;               /* committed again while hashing */
	unsigned hash_no;          /* hashes the committer began since the commit */
	bool late_tried;           /* a partner took it as it was hashed (once only) */
	digest_t root;             /* R_READY only */
	uint64_t files, bytes;
	char why[1024];            /* R_FAILED: the reason */
	struct rcopy *copies;      /* repl.npartners of them, owned */
	struct record *next;
};

enum pstate { PEER_IDLE, PEER_UP, PEER_DOWN };

/* Why a copy's try ended without a confirmation, for the metrics. */
enum pfail { PFAIL_CONNECT, PFAIL_LOST, PFAIL_REFUSED, PFAIL_CHANGED, PFAIL__N };

struct partner {
	size_t host;               /* index in peers.hosts */
	pthread_t thread;
	enum pstate state;         /* under repl.lock */
	char why[1024];            /* PEER_DOWN: the last error */
	uint64_t retry_at_ns;      /* PEER_DOWN: next attempt (monotonic) */
	struct xport *x;           /* the sender's connection; shutdown() at stop */
	struct xport *xs[PSEND_MAX_STREAMS];   /* its streams, [0] x; shutdown() at stop */
	unsigned nx;               /* of them open (under repl.lock) */
	unsigned streams;          /* the last copy went on this many, for status */
	unsigned wanted;           /* ... of this many it asked for */
	struct sadapt sa;          /* [transfer] streams = 0: the next copy's count
				    * (the sender's thread; status reads it, under repl.lock) */
	const char *codec;         /* what the last piece went as, for status */
	uint64_t wire, raw;        /* bytes sent on the wire / their raw size, ever */
	uint64_t held;             /* bytes not sent: the partner held them, ever */
	uint64_t confirmed;        /* copies confirmed, ever (under repl.lock) */
	uint64_t skipped;          /* copies skipped as stale, ever (under repl.lock) */
	uint64_t fails[PFAIL__N];  /* tries that failed, by cause (under repl.lock) */
	uint64_t late;             /* copies confirmed that went as they were hashed, ever */
	bool no_late;              /* it refused such an offer (an older receiver) */
};

/* The streams p's next copy asks for: [transfer] streams, or what adapting
 * chose (under repl.lock, or on p's sender thread). */
static inline unsigned repl_streams_wanted(const struct partner *p, const struct stage_config *c)
{
	return c->streams ? (unsigned)c->streams : p->sa.n;
}

struct repl {
	const struct stage_config *cfg;   /* borrowed, immutable (peers.cfg) */
	struct partner *partners;         /* npartners, placement order */
	size_t npartners;
	pthread_mutex_t lock;             /* records, copies, partner states */
	pthread_cond_t cond;              /* broadcast on any change */
	struct record *records;           /* sorted by seq */
	bool stopping;
	bool committer_started, watcher_started;
	pthread_t committer, watcher;
	int stop_fd;                      /* eventfd: wakes the watcher */
	struct rx_slot *rx;               /* transfers being received, under lock */
	struct restoring *restoring;      /* steps being restored, under lock */
	struct writer {                   /* jobs the watcher saw a step of written, under lock */
		char job[CKPT_NAME_MAX + 1];
		uint64_t ms;              /* last seen then (mono_ms); 0: a free entry */
	} writers[REPL_WRITERS];
	_Atomic uint64_t wrote_ms;        /* the newest of writers[].ms: without a lock, a
					   * piece sees that no job is being written */
	_Atomic uint64_t yielded_ms;      /* time replication paused for them, ever */
};

struct restoring {                    /* the watcher leaves these steps alone */
	char job[CKPT_NAME_MAX + 1], step[CKPT_NAME_MAX + 1];
	struct restoring *next;
};

/* repl_state.c: the state, the threads' priority. */
extern struct repl repl;

/* Partner i's node name. */
static inline const char *repl_partner_name(size_t i)
{
	return peers.hosts.v[repl.partners[i].host].name;
}

/* repl.cond on the monotonic clock: first thing in repl_open, before any
 * thread of replication runs. */
void repl_state_init(void);
/* Under repl.lock: waits on repl.cond until woken or until deadline_ns
 * (mono_ns, common/clock.h). 0 woken (maybe spuriously), or ETIMEDOUT. */
int repl_wait_until(uint64_t deadline_ns);
/* The trainer first ([transfer] yield, with watch = on): while a step of
 * ckpt_root/JOB was written in the last REPL_YIELD_QUIET_MS, waits, for at
 * most a quarter of peer_timeout at a time (the peer must hear something)
 * and *budget_ms in all (taken from it: a copy starts with
 * repl_yield_budget(), so no copy, nor those queued behind it, is held up
 * longer whatever is written), and returns at once when the daemon stops.
 * Called before each piece of a copy of JOB a sender sends or a receiver
 * takes. Whether it waited. Not under lock. */
#define REPL_YIELD_QUIET_MS 250
bool repl_yield(const char *job, uint64_t *budget_ms);
static inline uint64_t repl_yield_budget(void)
{
	return (uint64_t)repl.cfg->peer_timeout * 1000 / 2;
}
/* The watcher saw a step of ckpt_root/JOB written (watch_opts's wrote). */
void repl_wrote(const char *job, void *arg);
/* Whether a step of JOB was written in the last REPL_YIELD_QUIET_MS. Under
 * lock. */
bool repl_writing(const char *job, uint64_t now_ms);
/* With priority = low, the calling thread's CPU and I/O priority lowered
 * (what names the thread for the log if that fails). */
void repl_background(const char *what);
/* Records in state_dir/commits/JOB/STEP (repl_rec.c). */
int repl_rec_save(const struct record *r);
void repl_rec_remove(const char *job, const char *step);
int repl_rec_load_all(void);          /* into repl.records, at start-up */
struct record *repl_rec_find(const char *job, const char *step);
struct record *repl_rec_new(const char *job, const char *step);
void repl_rec_free(struct record *r);
/* Drops records beyond `keep` per job (natural step order). Under lock. */
void repl_rec_retain(const char *job);

/* The sender thread of one partner (repl_send.c). */
void *repl_send_main(void *arg);
/* repl_recv.c: an offer on a peer's connection (MSG_OFFER, in the peer
 * layer's table), and what it kept on the connection, at its end. */
int repl_recv_offer(struct xport *x, const char *peer, const struct msg *req);
/* MSG_STREAM: this connection carries pieces of an offer being received
 * (repl_streams.c). */
int repl_recv_stream(struct xport *x, const char *peer, const struct msg *req);
void repl_recv_end(void *state);
/* Lines for `stage status` about transfers being received. Under lock. */
void repl_recv_status(struct msg *m, uid_t viewer);

/* This thread acts as the owner of ckpt_root/JOB (reached with no link), as
 * the committer does to read a step (repl.c): 0 and *owner (NULL when
 * nothing changed), or -errno with why. Either way the caller then does
 * cred_leave() and frees *owner. */
struct cred;
int repl_enter_job_owner(const char *job, struct cred **owner, char *why, size_t whylen);

/* Whether partner i's copy of r may go as r is hashed, its manifest last
 * (repl_late.c): under repl.lock. */
bool repl_late_ok(size_t i, const struct record *r);

#endif
