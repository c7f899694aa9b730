/* The piece sender: bytes of a file to a peer, as MSG_DATA frames each
 * carrying one codec chunk frame (its XXH3-64 inside), read ahead on
 * io_uring so that the disk, the codec and the connection overlap, under
 * one rate cap. Replication's sender and the holder's side of a restore both
 * send through it; what differs between them (which codec each piece goes
 * as, what is counted where) comes in through struct psend_hooks.
 *
 * A range of at least two pieces that starts aligned is read with O_DIRECT
 * (set on the fd for the range, then put back), as fio reads: on these
 * machines filling the page cache cost more CPU than the rest of a restore
 * together. The origin's sender reads so too: its commit hashed the step
 * with O_DIRECT a moment before (which wrote back any dirty pages), and
 * reading it through the cache cost it twice the CPU and a third more time
 * (docs/BENCHMARKS.md, replicate). A read that O_DIRECT refuses (EINVAL) is
 * read again through the cache. A copy sent while its step is being hashed
 * (ps->cached) reads through the cache, which the hash reads through too:
 * the disk then gives each byte once, to whichever asks first.
 *
 * Streams (psend_streams_begin): the pieces of one copy may go on several
 * connections to the same peer, a group of pieces on each in turn: the
 * first piece on stream 0, and after a piece that ends where a chunk of
 * the manifest ends (a multiple of the group size, or its file's end) the
 * next on the next stream, so that every chunk's pieces travel on one
 * stream and its receiving thread can hash the chunk. Stream 0 is the
 * caller's connection, sent on the caller's thread as before; each other
 * stream has a thread of its own that encodes, seals and sends the pieces
 * handed to it, so the codec, the seal and the socket's copies of one
 * transfer spread over n cores. The order of the pieces is implicit in the
 * turns: a receiver follows the same rule to know which stream the next
 * piece comes on (docs/PROTOCOL.md, "Streams"). A buffer handed to a stream is read into again only once that
 * stream has sent it; a range returns once every piece of it is sent.
 *
 * One psend per thread that sends: psend_open and psend_close are mirrors;
 * nothing in it is shared but the cap, when the caller points it at a
 * bucket of its own. The rate cap is a token bucket over wire bytes that
 * lasts across ranges, so a restore made of many small fetches is held to
 * the cap as a whole.
 */
#ifndef STAGE_PSEND_H
#define STAGE_PSEND_H

#include <liburing.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/engine/pace.h"

#include "common/codec.h"
#include "common/xport.h"

#define PSEND_PIECE (1u << 20)          /* raw bytes per MSG_DATA */
#define PSEND_DEPTH 8                   /* pieces read ahead on one stream */
#define PSEND_MAX_DEPTH 64              /* pieces read ahead over several (the ring's size) */
#define PSEND_NO_FILE UINT64_MAX        /* no K_FILE field in the frames */
#define PSEND_ALIGN 4096u               /* O_DIRECT's alignment of offsets, lengths, buffers */
#define PSEND_MAX_STREAMS 16

struct psend_stream;

struct psend {
	struct io_uring ring;           /* reads only; PSEND_MAX_DEPTH entries */
	/* Slots [0, depth): PSEND_DEPTH, and with streams as many as their
	 * turns need (psend_streams_group), within the budget given. */
	uint8_t *buf[PSEND_MAX_DEPTH];  /* PSEND_PIECE each, PSEND_ALIGN-aligned, with
					 * PSEND_ALIGN bytes of room before (a raw piece's
					 * frame header goes there: no copy) */
	uint8_t *base[PSEND_MAX_DEPTH]; /* what was allocated: buf - PSEND_ALIGN, owned */
	int res[PSEND_MAX_DEPTH];       /* bytes read or -errno; INT32_MIN in flight */
	uint64_t off[PSEND_MAX_DEPTH];  /* file offset of each slot's read */
	uint32_t len[PSEND_MAX_DEPTH];  /* bytes of the range in it (a direct read asks more) */
	unsigned depth;                 /* slots in use, buffers allocated */
	unsigned head, n;               /* oldest slot; slots in flight or ready */
	int fd;                         /* the file of the range, borrowed */
	uint64_t next, end;             /* next offset to read; end of the range */
	bool direct;                    /* this range reads with O_DIRECT */
	bool broken;                    /* the ring failed: every later range fails */
	bool cached;                    /* the caller's: read through the page cache, never
					 * O_DIRECT (a step another thread hashes meanwhile) */
	uint8_t *frame;                 /* one encoded piece, owned */
	size_t frame_cap;
	struct pace pace;               /* its own cap, over wire bytes */
	struct pace *cap;               /* the cap it takes from: &pace, or a shared one */
	/* Streams, between psend_streams_begin and _end; nstreams 1 otherwise. */
	unsigned nstreams;
	struct psend_stream *st;        /* [nstreams]; [0] unused (the caller's) */
	unsigned turn;                  /* the stream of the next piece */
	uint64_t group;                 /* a stream's turn ends where a multiple of this ends */
	unsigned max_depth;             /* the slots the streams' budget allows */
	pthread_mutex_t mu;             /* the queues, busy, err; the sent hook */
	pthread_cond_t cv;
	bool busy[PSEND_MAX_DEPTH];     /* handed to a stream, not sent yet */
	int err;                        /* a stream's first failure: the copy's */
	unsigned err_stream;            /* the stream it was on (0: the caller's, or a check) */
};

/* What a caller adds to each piece. Any hook may be NULL. */
struct psend_hooks {
	/* The codec this piece goes as (NULL hook: codec_none). */
	const struct codec_ops *(*pick)(void *arg);
	/* Before each piece is taken, on the caller's thread, no lock held: it
	 * may hold the copy up (replication's trainer-first yield). */
	void (*hold)(void *arg);
	/* Just before the frame is sent, and just after (rc: the send's). */
	void (*before)(void *arg);
	void (*after)(void *arg, int rc);
	/* A piece was sent: its offset, raw length, wire length, codec id. */
	void (*sent)(void *arg, uint64_t at, size_t raw, size_t wire, unsigned codec);
	/* On the caller's thread, no lock held: before each piece, and every
	 * PSEND_CHECK_MS while it waits for a stream. A negative return stops
	 * the range with it: the streams give back what they hold without
	 * sending it, finish the sends they are in (shutting a dead one's
	 * connection wakes it) and keep their connections. */
	int (*check)(void *arg);
	void *arg;
};

#define PSEND_CHECK_MS 100

/* 0 or -errno. rate: bytes per second on the wire, 0 for none. */
int psend_open(struct psend *ps, uint64_t rate);
void psend_close(struct psend *ps);

/* The pieces of the ranges sent until psend_streams_end go in turns on
 * xs[0..n): xs[0] the x every psend_range is given, xs[1..n) each served
 * by a thread started here (they must stay open until _end). n is 1 to
 * PSEND_MAX_STREAMS; with n == 1 nothing changes. budget: the bytes the
 * pieces read ahead may hold, at least PSEND_DEPTH's. 0, or -errno (no
 * thread left running). */
int psend_streams_begin(struct psend *ps, struct xport *const *xs, unsigned n, uint64_t budget);
/* Whether a stream's turn passes after a piece that ends at end, of a file
 * of size bytes, with turns of group bytes (0: a piece): the rule of
 * docs/PROTOCOL.md "Streams", the sender's and the receiver's alike. */
static inline bool psend_turn_passes(uint64_t end, uint64_t size, uint64_t group)
{
	return !group || end % group == 0 || end == size;
}
/* The group size of the turns (psend.h's opening comment): the chunk size
 * of the manifest the pieces are of; 0 or unset: a turn is one piece.
 * Between ranges. With streams it sets how far the reads go ahead: a turn
 * for every stream and one more, within the budget (a slot held by a
 * stream is not read into, so with PSEND_DEPTH slots two turns of four
 * pieces would keep two streams busy, however many there are). */
void psend_streams_group(struct psend *ps, uint64_t group);
/* Sends MSG_END on xs[1..n) after their last pieces (when ok), stops their
 * threads. 0, or the first failure of a stream (-errno). */
int psend_streams_end(struct psend *ps, bool ok);
/* The stream (its index in xs) whose failure failed the last range or
 * psend_streams_end; 0 when it was the caller's connection, a read, or a
 * check. Until the next psend_streams_begin. */
static inline unsigned psend_failed_stream(const struct psend *ps)
{
	return ps->err_stream;
}
/* Wakes every stream's thread still in a send (their connections are dead
 * then): from a check hook that has stopped the range and waited long
 * enough for them. A caller that knows which stream is dead shuts its
 * connection itself (any thread may). */
void psend_shut_sending(struct psend *ps);

/* Sends bytes [off, end) of fd (a file of size bytes, for the dtype guess)
 * as MSG_DATA frames with K_FILE idx (unless PSEND_NO_FILE), K_OFFSET and
 * K_DATA. cp->dtype CODEC_DT_COUNT means "not known yet": the first piece
 * decides and cp keeps it for the next range of the same file. Returns 0;
 * -ESTALE when the file cannot be read as far as the range says (why says
 * so); the codec's -errno (why); or the transport's -errno from a send,
 * with why empty, for the caller to read (a refusal, a lost connection). */
int psend_range(struct psend *ps, struct xport *x, int fd, uint64_t size, uint64_t idx,
		uint64_t off, uint64_t end, struct codec_params *cp, const struct psend_hooks *h,
		const char *name, char *why, size_t whylen);

#endif
