/* The bookkeeping of the RDMA transport, without verbs: credits, sequence
 * numbers, receive slots and send buffers of one RC queue pair. The verbs
 * layer (rdma/verbs.c) posts and polls; this module says what it may post
 * and makes sense of what it polled, so all of it is testable on a machine
 * without an RDMA device. One thread owns a flow.
 *
 * The wire (docs/PROTOCOL.md). The QP carries a byte stream: the payloads
 * of its messages, concatenated in order, are the frames of common/proto.h,
 * the same bytes TCP would carry. Each message is a SEND WITH IMMEDIATE of
 * 0..max_payload bytes into one of the peer's pre-posted receive buffers
 * ("slots"); a frame of N bytes takes ceil(N / max_payload) messages. The
 * immediate (host order here; the verbs layer converts) is
 *     bits 31..16  the message's sequence number, mod 65536, the first 0
 *     bits 15..0   credits returned: slots of ours re-posted since our last
 *                  message (at most 65535 a message; the rest ride later)
 * The sizes are exchanged in the RDMA CM private data (rflow_hello_put).
 *
 * Our receive slots, each in one state:
 *     posted   at the peer's disposal, whether it knows yet or not
 *     queued   holds unread bytes: rflow_recv (payload) .. rflow_read
 *     free     handed back to the caller to re-post: rflow_recv (no
 *              payload, *free_now) or rflow_read (in freed[]) ..
 *              rflow_reposted, when it becomes posted and owed
 * and owed counts the posted slots the peer has not been told of yet;
 * rflow_send_begin tells it. Our send buffers are free or busy, busy from
 * rflow_send_begin to its rflow_send_done, taken and given back in ring
 * order since an RC QP completes its (all signaled) sends in posting order.
 *
 * Invariants, between calls:
 *     nfifo + unposted + owed <= nslots    (the rest: credits the peer has
 *                                           or that ride to it)
 *     credits <= peer_nslots;  nbusy <= nsend;  queued = bytes of busy buffers
 *     readable = bytes of the queued slots, less head_off
 * A message that arrives with no slot the peer may use (all queued, free or
 * owed) means the peer sent without a credit: -EPROTO.
 *
 * Credits. We start with credits = peer_nslots; every message we send takes
 * one. A message with payload needs credits >= 2: the last credit is kept
 * for a credit-only (zero-length) message, which must return at least one.
 * Whenever we owe at least nslots/2 and are not sending data (none to
 * send, or rflow_can_send_data says no), we send a credit-only message
 * (rflow_want_credit_msg). Why this cannot deadlock, provided each side
 * keeps reading what arrives and re-posting what that frees (as over TCP,
 * two sides that only write stall once the buffers between them are full):
 *  1. A side spends its last credit only on a message that returns credits
 *     to the other, so at any time one side holds a credit or a message on
 *     the wire carries one: both never sit at 0 with nothing in flight.
 *  2. Send buffers come back by themselves: credits mean the peer's receive
 *     is posted, so every send completes.
 *  3. Suppose both sides stuck, with everything delivered, read and
 *     re-posted. Then for A's sending, credits_A + owed_B = nslots_B. If A
 *     has data and cannot send it, credits_A <= 1, so owed_B >= nslots_B - 1
 *     >= nslots_B / 2 (nslots >= 2) and B wants a credit message, which it
 *     can send unless credits_B = 0. Then by 1 credits_A = 1, and owed_A =
 *     nslots_A, so A sends its credit message; B then holds >= 2 credits and
 *     owes nslots_B, so its next message (data or credit-only) gives A
 *     nslots_B >= 2 credits and A sends its data. No state is stuck.
 *
 * Errors are sticky: after the first (a protocol error of the peer, a call
 * out of order by the caller, or rflow_fail), every int call returns it, the
 * predicates say no and nothing moves; the connection is to be torn down.
 * Calls refused for now (-EAGAIN) or for bad arguments that change nothing
 * (-EINVAL from rflow_send_begin) are not errors of the flow.
 */
#ifndef STAGE_RFLOW_H
#define STAGE_RFLOW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Connection private data, sent in the connect request and the accept:
 *     0-1  'S' 'R'     2  version (1)   3  0
 *     4-5  nslots, u16 little-endian, RFLOW_MIN_SLOTS..RFLOW_MAX_SLOTS
 *     6    log2(slot_size), RFLOW_MIN_SLOT_SHIFT..RFLOW_MAX_SLOT_SHIFT
 *     7    0
 * RDMA CM pads private data, so bytes after these 8 are ignored. */
#define RFLOW_HELLO_LEN 8
#define RFLOW_VERSION 1
#define RFLOW_MIN_SLOTS 2
#define RFLOW_MAX_SLOTS 4096
#define RFLOW_MIN_SLOT_SHIFT 12         /* 4 KiB */
#define RFLOW_MAX_SLOT_SHIFT 20         /* 1 MiB */
#define RFLOW_MAX_SEND 4096             /* send buffers, hence sends in flight */
#define RFLOW_MAX_CREDITS_MSG 0xffffu   /* credits one immediate can return */

/* Writes the hello for our receive side. nslots and slot_size must be
 * valid as rflow_init checks them. */
void rflow_hello_put(uint8_t out[RFLOW_HELLO_LEN], uint32_t nslots, uint32_t slot_size);
/* Parses the peer's hello of n bytes. 0; -EPROTO when it is short or not
 * ours (magic, version, a reserved byte not 0); -EINVAL for an nslots or
 * slot size out of range. The outputs are written only on success. */
int rflow_hello_get(const uint8_t *p, size_t n, uint32_t *nslots, uint32_t *slot_size);

/* One receive slot holding unread bytes. */
struct rflow_rx {
	uint32_t slot;
	uint32_t len;            /* payload bytes it received */
};

/* Caller-allocated; rflow_init fills it and allocates its three arrays. */
struct rflow {
	/* Fixed by rflow_init. */
	uint32_t nslots;         /* our receive slots */
	uint32_t slot_size;      /* bytes each, a power of two */
	uint32_t nsend;          /* our send buffers */
	uint32_t send_size;      /* bytes each */
	uint32_t peer_nslots;    /* the peer's receive slots, from its hello */
	uint32_t peer_slot_size;
	int err;                 /* 0, or the first -errno: sticky */

	/* Sending. */
	uint32_t credits;        /* peer slots we may still fill, <= peer_nslots */
	uint32_t owed;           /* our slots re-posted, not yet returned to the peer */
	uint16_t tx_seq;         /* sequence number of our next message */
	uint32_t busy_head;      /* oldest busy send buffer */
	uint32_t nbusy;          /* busy buffers: busy_head onwards, mod nsend */
	uint32_t *busy_len;      /* [nsend]: payload bytes of each busy buffer */
	uint64_t queued;         /* bytes posted, not completed: sum of busy_len */

	/* Receiving. */
	uint16_t rx_seq;         /* sequence number expected next */
	struct rflow_rx *fifo;   /* [nslots] ring: queued slots, oldest first */
	uint32_t fifo_head;      /* oldest queued slot in fifo */
	uint32_t nfifo;          /* queued slots */
	uint32_t head_off;       /* bytes of the oldest queued slot already read */
	size_t readable;         /* bytes queued, not read */
	uint8_t *held;           /* [nslots]: 1 while the slot is queued */
	uint32_t unposted;       /* free slots, handed back, not yet re-posted */
};

/* Our side: nslots receive slots of slot_size bytes (as our hello says),
 * nsend send buffers of send_size bytes; the peer's, from its hello. 0,
 * -EINVAL (a value out of range, or slot memory past SIZE_MAX), -ENOMEM.
 * On failure f holds nothing, and rflow_fini on it is harmless. */
int rflow_init(struct rflow *f, uint32_t nslots, uint32_t slot_size, uint32_t nsend,
	       uint32_t send_size, uint32_t peer_nslots, uint32_t peer_slot_size);
void rflow_fini(struct rflow *f);
/* 0 or the sticky -errno. */
int rflow_error(const struct rflow *f);
/* Fails the flow with err (a -errno; 0 is ignored). The first error wins:
 * the verbs layer calls this when a post or a completion fails. */
void rflow_fail(struct rflow *f, int err);

/* ---- sending ---- */

/* The most payload one message may carry: min(peer slot_size, send_size). */
uint32_t rflow_max_payload(const struct rflow *f);
/* A message with payload may be begun now: credits >= 2, a free buffer. */
bool rflow_can_send_data(const struct rflow *f);
/* A credit-only message is due: owed >= nslots/2, credits >= 1, a free
 * buffer. Send it whenever this holds and no data goes out instead. */
bool rflow_want_credit_msg(const struct rflow *f);
/* Takes a send buffer and a credit for a message of len bytes, 0 meaning
 * credit-only. 0 with *buf (the send buffer to fill with the payload and
 * post) and *imm, whose credits are all we owe (up to 65535), now no longer
 * owed. -EAGAIN when not allowed now (no free buffer; data with credits < 2;
 * credit-only with no credit or nothing owed); -EINVAL when len exceeds
 * rflow_max_payload; or the sticky error. A message begun must be posted:
 * if the post fails, rflow_fail. */
int rflow_send_begin(struct rflow *f, uint32_t len, uint32_t *buf, uint32_t *imm);
/* A send completion, which is for the oldest busy buffer: frees it. 0, or
 * -EPROTO when no buffer is busy (sticky). */
int rflow_send_done(struct rflow *f);
/* Bytes posted whose sends have not completed. */
uint64_t rflow_queued(const struct rflow *f);

/* ---- receiving ---- */

/* A receive completion: a message of len bytes with immediate imm landed in
 * our slot `slot`. 0, with *free_now telling that the slot is free at once
 * (no payload: re-post it). Else, sticky: -EPROTO (a sequence gap, longer
 * than a slot, credits beyond peer_nslots, the slot already queued, no slot
 * the peer had a credit for) or -EINVAL (slot out of range). */
int rflow_recv(struct rflow *f, uint32_t slot, uint32_t len, uint32_t imm, bool *free_now);
/* Bytes received, not read; 0 after an error. */
size_t rflow_readable(const struct rflow *f);
/* Copies up to n bytes, in stream order, to out; slot s is at
 * base + s * slot_size. Returns the bytes copied (0 after an error). The
 * slots this emptied, in the order they were filled, are written to
 * freed[0..*nfreed) (room for nslots); they are free: re-post them. */
size_t rflow_read(struct rflow *f, const uint8_t *base, uint8_t *out, size_t n, uint32_t *freed,
		  uint32_t *nfreed);
/* The caller re-posted n free slots: they are owed to the peer. More than
 * are free fails the flow with -EINVAL. */
void rflow_reposted(struct rflow *f, uint32_t n);

#endif
