/* The receiver's private parts, shared by its two files: repl_recv.c (the
 * offer, from MSG_OFFER to MSG_DONE, and status)
 * and repl_build.c (the copy being built: the cursor over the offer,
 * writes, held chunks, the journal, publication). The design is in
 * repl_recv.c's opening comment. */
#ifndef STAGE_REPL_RX_H
#define STAGE_REPL_RX_H

#include <liburing.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/manifest.h"
#include "daemon/engine/cbuild.h"
#include "daemon/engine/psend.h"
#include "daemon/repl/repl_have.h"
#include "daemon/repl/repl_impl.h"

_Static_assert(WQ_BUF == REPL_PIECE, "a write buffer holds one piece");
#define SYNC_EVERY (64ull << 20)   /* a big file is journaled this often */
#define INCOMING ".incoming"

#define RX_STREAM_DEPTH 4          /* pieces a further stream may hold ready */

#define RX_NO_FIELDS "a DATA frame without its fields"
#define RX_DAMAGED "damaged (digest or length)"
enum { RX_PIECE_OK, RX_PIECE_NO_FIELDS, RX_PIECE_DAMAGED };    /* rx_piece.bad */

/* A piece a further stream's thread received, decoded and hashed, for the
 * offer's thread to check and write. */
struct rx_piece {
	uint16_t type;                 /* MSG_DATA, or MSG_END (nothing else) */
	unsigned stream;               /* the stream it came on (1 to n - 1) */
	int bad;                       /* MSG_DATA that could not be read: RX_PIECE_... */
	uint64_t idx, off;             /* K_FILE, K_OFFSET */
	size_t raw;                    /* bytes decoded into buf */
	uint8_t *buf;                  /* REPL_PIECE bytes, WQ_ALIGN-aligned: the stream's,
					* kept across pieces (traded with the writer's) */
	struct cbuild_sums sums;       /* its chunks, hashed on the stream's thread */
};

/* A further stream of the offer (repl_streams.c): its connection is served
 * by a thread of its own, which decodes and hashes the pieces and queues
 * them for the offer's. */
struct rx_stream {
	struct xport *x;               /* while attached: that thread's connection */
	bool attached;                 /* a thread serves it now */
	bool used;                     /* it has attached, this offer */
	bool ended;                    /* its MSG_END queued: its thread waits for the
					* offer to be done with the turns */
	bool dead;                     /* lost, and out of the turns (a hand-off) */
	uint64_t mark;                 /* the last hand-off whose MSG_MARK it read: while
					* below r->epoch, what comes on it is dropped */
	int err;                       /* it failed (-errno): the offer fails, or hands
					* its turns on */
	struct rx_piece q[RX_STREAM_DEPTH]; /* its pieces, then its MSG_END; the slot
					     * after the last is the stream thread's
					     * to fill, the others' the offer's */
	unsigned qh, qn;
	char why[1024];
};

struct rx_slot {                   /* a transfer in progress, in repl.rx */
	char key[3 * (CKPT_NAME_MAX + 1)];   /* ORIGIN/JOB/STEP */
	struct xport *x;
	uint64_t got, local;           /* bytes received; copied from local copies */
	uid_t owner;                   /* the copy's owner (the offer's; 0: none named) */
	struct rx_slot *next;
};

struct rx {
	struct xport *x;
	char peer[AUTH_NAME_MAX + 1];  /* proven name of the sender */
	char origin[CKPT_NAME_MAX + 1], job[CKPT_NAME_MAX + 1], step[CKPT_NAME_MAX + 1];
	digest_t root;                 /* the offer's (with K_LATE: its digestless manifest's,
					* then the manifest's that came last) */
	bool late;                     /* K_LATE: the manifest comes after the pieces */
	FILE *sums;                    /* late: each file's digests as they landed, in order */
	int final_fd;                  /* late: the manifest coming last (.stage/final), or -1 */
	uint64_t final_got;            /* its bytes so far */
	bool chown;                    /* the offer named an owner, and this daemon may give it */
	uid_t uid;                     /* the owner every file, link and the manifest of the
					* copy get (directories stay the daemon's) */
	gid_t gid;
	struct rx_slot slot;
	struct cbuild cb;              /* the file being built (engine/cbuild.h); opened at the
				* connection's first offer (cb.whole NULL until then) */
	int rr_fd;                     /* replica_root */
	int in_fd;                     /* .incoming/ORIGIN/JOB/STEP */
	int st_fd;                     /* its .stage */
	FILE *journal;
	uint64_t j_idx, j_off;         /* resume point */
	uint64_t chunk_size;
	/* the cursor over the offer */
	struct mf_reader *mr;
	struct mf_entry ce;            /* entry at index ci, valid when have_ce */
	bool have_ce;
	bool background;               /* repl_background called on this thread */
	uint64_t ci;
	uint64_t gbase;                /* chunk number of ce's first chunk (repl_have.h) */
	/* chunks held here already: not sent, copied from src */
	struct have *have;             /* NULL: everything is sent */
	int src_fd;                    /* the local copy being read, or -1 */
	const char *src_path;          /* its path beneath replica_root (have's) */
	/* the file being written (its next offset due is cb.at) */
	int fd;
	uint64_t synced;               /* offset journaled (made durable first) */
	uint64_t asked;                /* offset a sync was last asked for */
	/* Streams (docs/PROTOCOL.md, "Streams"): the pieces of the offer come
	 * on the streams in turns, a chunk's pieces on one stream, stream 0
	 * being x itself. */
	unsigned nstreams;             /* 1: x alone */
	struct rx_stream *streams;     /* [nstreams], [0] unused */
	unsigned live[REPL_MAX_STREAMS]; /* the streams in the turns, in order, 0 first */
	unsigned nlive;                /* 1..nstreams: fewer after hand-offs */
	unsigned turn;                 /* the place in live of the stream of the next piece */
	bool handoff;                  /* a lost further stream's turns go to the others
					* (K_RESTREAM both ways), rather than failing the copy */
	uint64_t epoch;                /* hand-offs so far (under smu) */
	bool released;                 /* the turns are over: ended streams may go */
	uint64_t cs;                   /* the offer's chunk size for the streams' hashers,
					* under smu; 0 until the offer is read */
	bool data_end;                 /* a stream ended: x's MSG_END is next */
	bool closing;                  /* the offer is over (or a newer one of the same
					* sender took over): no stream may attach */
	bool lost;                     /* a stream's connection failed: no refusal sent */
	pthread_mutex_t smu;           /* streams, closing */
	pthread_cond_t scv;
	char why[1024];
};

/* The transfer of key ORIGIN/JOB/STEP being received, or NULL. Under
 * repl.lock. */
struct rx_slot *rx_slot_find(const char *key);
/* The offer a registered slot is the slot of. */
static inline struct rx *rx_of_slot(struct rx_slot *s)
{
	return (struct rx *)((char *)s - offsetof(struct rx, slot));
}

/* Records the first reason (r->why) and returns err. */
int rx_fail(struct rx *r, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The cursor to the next entry of the offer (the first, at the start). */
int rx_next_entry(struct rx *r);
/* The cursor to entry idx (byte off of it), making what it passes. */
int rx_advance_to(struct rx *r, uint64_t idx, uint64_t off);
/* One MSG_DATA piece: of stream 0 (m), or of a further stream (pc). */
int rx_on_data(struct rx *r, const struct msg *m);
int rx_on_piece(struct rx *r, struct rx_piece *pc);
/* The offer's manifest, size bytes, into .incoming (resume point read). */
int rx_take_offer(struct rx *r, uint64_t size);
/* K_LATE: a slice of the manifest that comes after the pieces (m, a
 * MSG_MANIFEST on stream 0); at MSG_END (m), once every entry is made, that
 * manifest read and compared with what landed, entry for entry and digest
 * for digest: 0 (it is the copy's manifest now), or -errno said. */
int rx_late_slice(struct rx *r, const struct msg *m);
int rx_late_end(struct rx *r, const struct msg *m);
/* Everything durable, the manifest, the rename into place, retention. */
int rx_publish(struct rx *r);
/* The offer stored in .incoming is not needed. */
void rx_drop_incoming(struct rx *r);
/* Room for n streams (before the slot is registered): 0 or -errno. */
int rx_streams_open(struct rx *r, unsigned n);
/* Ends the streams of the offer: none attached, nothing queued. */
void rx_streams_close(struct rx *r);
/* The offer's next frame: x's (in m), or with streams the next piece in
 * order (x's in m, a further stream's in *pc, to be handed back with
 * rx_piece_done once taken) and, after the last, x's MSG_END. 0, or -errno
 * with r->why. */
int rx_recv(struct rx *r, struct msg *m, struct rx_piece **pc);
void rx_piece_done(struct rx *r, const struct rx_piece *pc);
/* After a piece that ends at end of a file of size bytes: whose turn is
 * next (docs/PROTOCOL.md, "Streams"). */
static inline void rx_turn(struct rx *r, uint64_t end, uint64_t size)
{
	if (r->nlive > 1 && psend_turn_passes(end, size, r->chunk_size))
		r->turn = (r->turn + 1) % r->nlive;
}
/* The cursor back to the start of the chunk it is in, for a hand-off: the
 * point (entry, byte) the pieces go on from. 0, or -errno said. */
int rx_rewind(struct rx *r, uint64_t *idx, uint64_t *off);
/* The offer's chunk size, for the streams' hashers. */
void rx_streams_chunk_size(struct rx *r, uint64_t cs);

#endif
