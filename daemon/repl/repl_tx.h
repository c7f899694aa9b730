/* The sender's private parts, shared by its two files: repl_send.c (a
 * partner's sender: its copies, offers and pieces) and repl_handoff.c (a
 * lost further stream's turns handed to the others, docs/PROTOCOL.md
 * "Streams"). The design is in repl_send.c's opening comment. */
#ifndef STAGE_REPL_TX_H
#define STAGE_REPL_TX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/proto.h"
#include "daemon/engine/psend.h"
#include "daemon/repl/repl_impl.h"
#include "daemon/repl/zpolicy.h"

#define HELD_COPY_RATE (20ull << 20)    /* bytes/s: the slowest local copy waited for */

struct sender {
	struct partner *p;
	const struct host *h;
	struct xport *x;                /* NULL while disconnected */
	struct xport *xs[PSEND_MAX_STREAMS];    /* [0] is x; [1..nx) more streams */
	unsigned nx;                    /* streams open, x among them (0: none) */
	struct psend ps;                /* reads ahead, encodes, caps the rate */
	struct zpolicy z;
	unsigned backoff_ms;
	unsigned lost;                  /* copies lost mid-way in a row */
	uint64_t held;                  /* bytes the last copy confirmed found held there */
	bool offered;                   /* the copy being sent went as far as its offer */
};

/* A step's manifest without digests, for a copy sent as it is hashed
 * (repl_late.c). */
struct skeleton {
	int fd;                         /* the text, unlinked; -1 when none */
	uint64_t size;                  /* its bytes */
	digest_t root;                  /* its root (of digests 0) */
	uint64_t bytes;                 /* the files' bytes */
	uid_t uid;                      /* the owner the manifest will have */
	gid_t gid;
};

/* One copy being sent. */
struct out {
	const char *job, *step;
	uint64_t seq, total;
	int step_fd;
	uint64_t sent;                  /* bytes of the checkpoint done: sent or held */
	uint64_t held;                  /* of which the receiver held */
	uint64_t held_g;                /* chunks below this number are in held (a hand-off
					 * goes over some of them again) */
	uint64_t raw;                   /* raw bytes sent in pieces */
	uint64_t gap;                   /* held bytes since the last piece sent */
	const uint8_t *bits;            /* K_HELD, or NULL */
	size_t nbits;
	uint64_t chunk;                 /* the manifest's chunk size */
	uint64_t yield_ms;              /* what [transfer] yield may still hold it up */
	bool yielded;                   /* it did, before the next piece */
	uint64_t r_paused;              /* ms the receiver stood aside for its trainer (DONE's) */
	bool no_sum;                    /* the WANT's K_FRAME_SUM 0: frames without their digest */
	bool late;                      /* sent as it is hashed: the manifest last (K_LATE) */
	digest_t late_root;             /* late: the manifest that went last, for MSG_END */
	uint64_t late_size;
	uid_t late_uid;                 /* late: the owner offered (the manifest's must be it) */
	gid_t late_gid;
	/* A lost stream's turns handed to the others (K_RESTREAM both ways). */
	bool handoff;                   /* the receiver said it does */
	unsigned n;                     /* the streams the pieces go on now: xs[0..n) */
	unsigned xid[PSEND_MAX_STREAMS];/* each one's index for the receiver (MSG_STREAM's) */
	uint64_t epoch;                 /* hand-offs so far */
	int ctl_rc;                     /* a frame the receiver sent mid-copy, read: -ERESTART
					 * (a MSG_RESTREAM, below), or the copy's failure */
	uint64_t ctl_ns;                /* when it was read */
	char ctl_why[512];
	uint64_t r_idx, r_off;          /* the MSG_RESTREAM: the point, */
	unsigned r_pos;                 /* the lost stream's place in xs */
};

/* A timeout of base ms plus the time the receiver may take to copy `held`
 * bytes from its own disk at a slow HELD_COPY_RATE. */
static inline int held_ms(uint64_t held, int base)
{
	uint64_t ms = (uint64_t)base + held / (HELD_COPY_RATE / 1000);

	return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

/* Partner i's next copy (repl_pick.c): the oldest pending, stale ones
 * skipped; else, *late set, one to send as its step is hashed. NULL: none.
 * Under repl.lock. */
struct record *tx_next_copy(size_t i, bool *late);
/* Whether an older step of r's job is confirmed on partner i: under lock. */
bool tx_follows(const struct record *r, size_t i);
/* The skeleton of JOB's step step_fd, written as state_dir/name and
 * unlinked: 0, or -EAGAIN with why (the copy goes the usual way). */
int tx_skeleton(const char *job, int step_fd, const char *name, struct skeleton *k, char *why,
		size_t whylen);
/* Waits (at most half the peer timeout) for the hash of JOB/STEP that began
 * as hash_no to end: 0 and its root; -EAGAIN (why) when it failed, began
 * again or took too long; -ECANCELED at stop. */
int tx_late_wait(const char *job, const char *step, uint64_t seq, unsigned hash_no,
		 digest_t *root, char *why, size_t whylen);

/* One frame of the receiver's, in m: 0; its refusal (MSG_ERROR, freed),
 * -EREMOTEIO; a failure, -errno (-ECONNRESET: it closed). why says. */
int tx_answer(struct xport *x, struct msg *m, char *why, size_t whylen);
/* A frame of the receiver's mid-copy (repl_handoff.c). */
int tx_take_answer(struct sender *s, struct out *o, struct msg *done);
/* A further stream lost: handed on (repl_handoff.c). */
int tx_hand_off(struct sender *s, struct out *o, unsigned failed, char *why, size_t whylen);

#endif
