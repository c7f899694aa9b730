/* Restore's parts shared by its two files: restore.c (the survey,
 * the choice of a copy, the job thread's walk of the findings, the end)
 * and lane.c (the lanes that fetch, check and write the files).
 * Not an interface for anyone else: restore.h is that. */
#ifndef STAGE_RESTORE_IMPL_H
#define STAGE_RESTORE_IMPL_H

#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/digest.h"
#include "common/manifest.h"
#include "daemon/restore/restore.h"
#include "daemon/restore/rsrc.h"
#include "daemon/engine/cbuild.h"
#include "daemon/engine/psend.h"
#include "daemon/job/job.h"
#include "daemon/peers/peers.h"
#include "daemon/repl/repl.h"

#define TMP_DIR "tmp"
/* The copy chosen and its fall-backs: with replicas = 2 and the durable
 * tier, three; beyond a few, a restore that failed on each is better run
 * again than walked along a longer list. */
#define RSRC_MAX 4
/* Lanes of one restore at most ([transfer] restore_streams): each holds a
 * connection, a ring, a piece buffer and a write queue (about 5 MiB here,
 * 8 MiB of read-ahead on its holder). */
#define RLANES_MAX 4
#define LANE_MEM (PSEND_PIECE + WQ_DEPTH * WQ_BUF)

struct bad {                       /* a finding of the local verify */
	char *rel;
	bool unexpected;
	bool damaged;                  /* its bytes: chunks[] are the wrong ones */
	uint64_t *chunks, nchunks;     /* owned; nchunks 0: the file as a whole */
};

struct restore;

/* A lane: one connection's worth of a restore. It takes files from the
 * restore's queue and rebuilds or patches each with its own sources, ring,
 * builder and buffer, so that several holders (or several connections to
 * one) send at once and one file's fdatasync overlaps another's data. Its
 * sources are the restore's, the intact holders rotated by its number: with
 * two holders, lane 0 starts on the first and lane 1 on the second; each
 * falls back along its own list. */
struct rlane {
	struct restore *r;
	unsigned id;
	struct rsrc srcs[RSRC_MAX];    /* the copy it starts on, then its fall-backs */
	size_t nsrcs;
	struct rsrc *src;              /* the one in use */
	struct io_uring ring;
	uint8_t *buf;                  /* PSEND_PIECE: local chunks being judged */
	struct cbuild cb;              /* the file being rebuilt */
	bool ready;                    /* ring, buf and cb are set up */
	pthread_t thread;
	bool started;
	uint64_t files_fixed, files_patched, chunks_fetched, bytes_fetched, chunks_kept;
	uint64_t tmp_seq;              /* names its temporaries: rebuild.LANE.SEQ */
	char why[8192];
};

/* A file handed to a lane: its manifest entry (a copy) and its finding. */
struct rwork {
	struct mf_entry e;
	uint64_t chunk_size;
	const struct bad *b;
};

struct restore {
	struct job *j;
	const char *job, *step;
	const char *holder;            /* the chosen copy's holder */
	const digest_t *pin;           /* resume: the only commit to restore, or NULL */
	restore_then_fn *then;        /* after success, or NULL */
	digest_t root;                 /* the commit restored */
	const char *place[64];         /* the nodes this node's copies are placed on */
	size_t nplace;
	struct io_uring ring;          /* the job thread's own reads and writes */
	int step_fd, stage_fd, tmp_fd;
	struct bad *bad;
	size_t nbad, capbad;
	struct rlane lanes[RLANES_MAX];  /* lanes[0] also fetches the manifest */
	size_t nlanes;                 /* set up; started once the repairs begin */
	/* The queue from the job thread to the lanes, and how they ended. */
	pthread_mutex_t mu;
	pthread_cond_t cv;             /* work queued or taken, a lane ended */
	struct rwork q[RLANES_MAX];
	size_t qhead, qlen, running;
	bool qclosed;
	int err;                       /* the first failure; its reason in why */
	_Atomic bool stop;             /* a failure or a cancel: lanes take no more */
	uint64_t files_fixed, files_patched, chunks_fetched, bytes_fetched, chunks_kept;
	_Atomic uint64_t displaced;    /* entries of the wrong type moved aside */
	uint64_t trusted;              /* files the last verify --deep vouched for, not read */
	bool lost_finding;             /* on_bad could not record one: fail */
	char path[4096];               /* ckpt_root/JOB/STEP, for messages */
	char dlabel[4096];             /* durable_root/JOB/STEP, for messages */
	char why[8192];
};

/* A holder's name for a person. */
const char *restore_said(const char *holder);
/* What stands at parent/base, unless it is of the type wanted (S_IF*):
 * moved aside to .stage/displaced.N. 0 or -errno with why. */
int restore_clear_way(struct restore *r, int parent, const char *base, const char *rel,
		      mode_t want, char *why, size_t whylen);
/* The first failure wins: its rc and reason are the restore's; every lane
 * stops after the file it is on. Under r->mu. */
void restore_fail_locked(struct restore *r, int rc, const char *why);

/* Lanes: set up (ring, buffer, builder) and torn down, mirrors. */
int rlane_setup(struct restore *r, struct rlane *l, unsigned id);
void rlane_teardown(struct rlane *l);
/* Source s of lane l, named holder (or HOLD_DURABLE). */
void rlane_src_init(struct rlane *l, struct rsrc *s, const char *holder);
/* Lane l's list: first's holders rotated by l's number, the tier last. */
void rlane_sources(struct rlane *l, const struct rlane *first);
/* Opens the lane's first source that opens. 0, or -errno with why. */
int rlane_open(struct rlane *l);
/* After source failure rc (for file e, or NULL for the manifest): on to
 * the lane's next source. 0 to go on, or rc with every reason in why. */
int rlane_fall_back(struct rlane *l, const struct mf_entry *e, int rc);
/* A lane's thread: files from r's queue until it is closed or stopped. */
void *rlane_main(void *arg);

#endif
