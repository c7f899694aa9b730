/* Framing shared by the client, the daemon and (later) peers; the byte-level
 * description a peer re-implements from is docs/PROTOCOL.md.
 *
 * A frame is a 16-byte header then a payload of fields:
 *   header:  magic "STG1" | u16 type | u16 flags | u32 length | u32 reserved(0)
 *   field:   u16 key | u16 reserved(0) | u32 length | length bytes
 * All integers little-endian. A u64 field is 8 bytes. Strings carry no NUL.
 * Keys may repeat; msg_get_* returns the first. Unknown keys are skipped,
 * which is how the protocol grows. A frame is rejected whole (-EBADMSG) if
 * the magic, the reserved words or any field length is wrong, or the payload
 * exceeds PROTO_MAX_PAYLOAD.
 */
#ifndef STAGE_PROTO_H
#define STAGE_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define PROTO_MAGIC "STG1"
#define PROTO_HDR_LEN 16
#define PROTO_FIELD_HDR_LEN 8
/* One 1 MiB piece of a checkpoint and its fields fit in a frame. */
#define PROTO_MAX_PAYLOAD ((1u << 20) + 4096)

enum msg_type {
	/* client -> daemon */
	MSG_PULL_REQ = 1,
	MSG_VERIFY_REQ = 2,
	MSG_STATUS_REQ = 3,
	MSG_COMMIT_REQ = 4, /* K_PATH, K_FLAGS (REQ_WAIT) */
	MSG_LS_REQ = 5,     /* no fields */
	MSG_RESTORE_REQ = 6,/* K_PATH, K_FLAGS, K_HOLDER (--from, optional) */
	MSG_DOCTOR_REQ = 7, /* K_FLAGS (REQ_QUICK), K_NODES (--nodes), K_PORTS (--ports) */
	MSG_METRICS_REQ = 8,/* no fields */
	MSG_RESUME_REQ = 9, /* K_JOB, K_FLAGS (REQ_DRYRUN), K_NODES (optional) */
	/* daemon -> client */
	MSG_PROGRESS = 16,  /* K_PHASE, K_FILES_DONE/TOTAL, K_BYTES_DONE/TOTAL */
	MSG_NOTE = 17,      /* K_LEVEL, K_TEXT, K_PATH: one finding for the user */
	MSG_RESULT = 18,    /* K_CODE (exit code), K_TEXT, K_PATH, stats: last frame */
	MSG_STATUS = 19,    /* K_TEXT lines of key=value; see daemon/ctl.c */
	MSG_LS = 20,        /* K_NAME/K_VALUE pairs, one per checkpoint copy */
	MSG_CELLS = 21,     /* verify --cluster: copy groups (below), before the result */
	MSG_CHECK = 22,     /* doctor: K_CHECK, K_SUBJECT, K_CODE (0 ok, 1 problem), K_TEXT,
			     * K_ADVICE, then K_NUM / K_ATTR "name=value" members */
	MSG_METRICS = 24,   /* K_DATA: a slice of the Prometheus text, in order, before the result */
	MSG_MATRIX = 23,    /* doctor: K_NAME, K_ATTR "unit=...", K_HOLDER per node (rows
			     * and columns), K_VALUE per cell, row-major */

	/* peer <-> peer (docs/PROTOCOL.md, "Replication") */
	MSG_PEER_HELLO = 32,  /* K_AUTH: auth_hello's bytes */
	MSG_PEER_PROOF = 33,  /* K_AUTH: auth_proof's bytes */
	MSG_OFFER = 34,     /* sender: K_ORIGIN, K_JOB, K_STEP, K_ROOT, K_SIZE (manifest bytes) */
	MSG_MANIFEST = 35,  /* sender: K_OFFSET, K_DATA: a slice of the manifest text */
	MSG_WANT = 36,      /* receiver: K_CODE (0 send, 1 have it), K_FILE, K_OFFSET: resume
			     * point, K_HELD (optional): chunks not to send */
	MSG_DATA = 37,      /* sender: K_FILE, K_OFFSET, K_DATA: one codec chunk frame */
	/* 38 reserved: MSG_WANT reports acknowledged progress */
	MSG_END = 39,       /* sender: every piece was sent */
	MSG_DONE = 40,      /* receiver: K_CODE (0 confirmed on disk), K_ROOT, K_TEXT */
	MSG_ERROR = 41,     /* either: K_ERRNO, K_TEXT; the connection closes after it */
	MSG_HOLD_REQ = 42,  /* asker: K_JOB, K_STEP, K_FLAGS (REQ_DEEP) */
	MSG_HOLD = 43,      /* answer: copy groups (below), this node being the holder */
	MSG_FETCH_REQ = 44, /* origin: K_ORIGIN, K_JOB, K_STEP, K_ROOT, then K_PATH,
			     * K_OFFSET, K_SIZE (a range of a file), or no K_PATH: the
			     * manifest. Answer: MSG_DATA pieces (K_OFFSET, K_DATA) or
			     * MSG_MANIFEST slices, then MSG_END; or MSG_ERROR */
	MSG_DOCTOR_ASK = 45,/* asker: K_KIND (facts, time, listen, release, dial, bw, sink,
			     * disk), K_JOB (the doctor's session), fields per kind */
	MSG_DOCTOR_ANS = 46,/* answer: K_NAME/K_VALUE pairs; or MSG_ERROR */
	MSG_RESTORE_ASK = 47,/* resume's asker: K_JOB, K_STEP, K_HOLDER: restore your own
			     * ckpt_root/JOB/STEP from that holder's copy */
	MSG_ASK_DONE = 48,  /* the node's answer to MSG_RESTORE_ASK or MSG_RESEND_ASK: K_CODE
			     * (an exit code: 0 done, 1 failed, 2 refused), K_TEXT */
	MSG_RESEND_ASK = 49,/* resume's asker to an origin: K_JOB, K_STEP, K_HOLDER: send your
			     * copy of JOB/STEP to that partner again (it lost it) */
	/* pull --cluster (docs/PROTOCOL.md, "Cluster pull") */
	MSG_CPULL_ASK = 50, /* asker to each node: K_JOB (the pull's id), K_PATH (SRC), K_DEST
			     * (optional), K_FLAGS (REQ_VERIFY), K_NODES (the nodes, in
			     * order). Answer: MSG_ASK_DONE (K_CODE, K_TEXT, K_ROOT and the
			     * figures), then the node serves its peers until the asker's
			     * MSG_END or close */
	MSG_CPULL_FETCH = 51,/* node to node: K_JOB, K_PATH (from the tree's top), K_SIZE,
			     * K_MTIME: the file as the source has it; K_FLAGS 1: a probe.
			     * Answer: MSG_DATA pieces (K_OFFSET, K_DATA) then MSG_END; or
			     * MSG_ERROR (EAGAIN: not here yet, ask again; ESHUTDOWN: this
			     * node does not serve the pull) */
	/* a question relayed through a tree (docs/PROTOCOL.md, "Relays") */
	MSG_RELAY = 52,     /* asker to a relay: K_TIMEOUT_MS, K_NAME per node to ask besides
			     * the relay itself, K_TYPE and K_DATA: the question's frame.
			     * Answer: one MSG_RELAY_ANS per node (the relay's own among
			     * them), then MSG_END; or MSG_ERROR */
	MSG_RELAY_ANS = 53, /* relay: K_NAME, K_ERRNO (0: K_TYPE and K_DATA are the node's
			     * answer frame; else it was not reached, K_TEXT says why) */
	MSG_STREAM = 54,    /* sender, on another connection of its own: K_JOB, K_STEP,
			     * K_ROOT, K_INDEX: this connection is stream K_INDEX of that
			     * offer (K_STREAMS in its MSG_OFFER); its MSG_DATA follow, then
			     * MSG_END. No answer (docs/PROTOCOL.md, "Streams") */
	MSG_RESTREAM = 55,  /* receiver, on stream 0 (K_RESTREAM taken both ways): K_INDEX,
			     * a further stream lost; K_FILE, K_OFFSET, where the pieces go
			     * on from, on the streams left; K_CODE, the hand-off's number
			     * (1, 2, ... in the copy) */
	MSG_MARK = 56,      /* sender, on each stream left after MSG_RESTREAM: K_CODE, its
			     * number; the pieces from the MSG_RESTREAM's point follow */
};

/* A copy group, in MSG_HOLD and MSG_CELLS: fields in this order, each group
 * starting at its K_ORIGIN (keys repeat across groups):
 *   K_ORIGIN  the node that wrote the checkpoint ("" in MSG_CELLS: the group
 *             is about the holder as a whole, e.g. it could not be asked)
 *   K_HOLDER  the node holding the copy (MSG_CELLS only)
 *   K_STATE   "ok", "damaged", "incomplete" (no manifest), "other-step" (not
 *             this step; K_STEP names the latest held), and in MSG_CELLS also
 *             "missing", "unreachable", "differs" (root unlike the others')
 *   K_STEP, K_ROOT (when a manifest was read), K_FILES_TOTAL, K_BYTES_TOTAL,
 *   K_TEXT    zero or more: the findings, first ones only
 *   K_COPY    zero or more, in an origin's group about its own copy: a copy
 *             of the step to a partner that the origin has not seen
 *             confirmed, "NODE STATE" or "NODE STATE: WHY" (copygroup.h)
 */
enum { COPY_TEXTS_MAX = 8, COPY_NOTES_MAX = 16 };

enum msg_key {
	K_PATH = 1,         /* str */
	K_DEST = 2,         /* str */
	K_FLAGS = 3,        /* u64, REQ_* request flags */
	K_TEXT = 4,         /* str */
	K_CODE = 5,         /* u64: 0 ok, 1 failed, 2 usage/config */
	K_LEVEL = 6,        /* u64: enum log_level */
	K_PHASE = 7,        /* str: "scan", "copy", "verify" */
	K_FILES_DONE = 8,   /* u64 */
	K_FILES_TOTAL = 9,  /* u64, 0 while unknown */
	K_BYTES_DONE = 10,  /* u64 */
	K_BYTES_TOTAL = 11, /* u64, 0 while unknown */
	K_FILES_COPIED = 12,/* u64 */
	K_BYTES_COPIED = 13,/* u64 */
	K_FILES_REMOVED = 14,/* u64 */
	K_ELAPSED_NS = 15,  /* u64 */
	K_ROOT = 16,        /* str: root digest, 32 hex */
	K_KIND = 17,        /* str: the kind of a NOTE: "missing", "changed", ... */
	K_NAME = 18,        /* str: key of a status line */
	K_VALUE = 19,       /* str: value of a status line */
	K_AUTH = 20,        /* bytes: a handshake message of common/auth.h */
	K_ORIGIN = 21,      /* str: node name */
	K_JOB = 22,         /* str */
	K_STEP = 23,        /* str */
	K_SIZE = 24,        /* u64 */
	K_OFFSET = 25,      /* u64 */
	K_FILE = 26,        /* u64: index of an entry in the manifest, from 0 */
	K_DATA = 27,        /* bytes */
	K_ERRNO = 28,       /* u64: a positive errno */
	K_HOLDER = 29,      /* str: node name (restore --from, copy groups) */
	K_STATE = 30,       /* str: state of a copy (copy groups) */
	K_HELD = 31,        /* bytes: MSG_WANT's bitmap of chunks the receiver holds */
	K_MAC = 32,         /* bytes: a sealed frame's tag, its first field (common/seal.h) */
	K_CHECK = 33,       /* str: a doctor check's name ("clock", "port", ...) */
	K_SUBJECT = 34,     /* str: what the check is about ("n2", "n0>n1", "29500@n3") */
	K_ADVICE = 35,      /* str: one line a person can act on */
	K_NUM = 36,         /* str: "name=number", a JSON number member */
	K_ATTR = 37,        /* str: "name=text", a JSON string member */
	K_NODES = 38,       /* str: --nodes LIST */
	K_PORTS = 39,       /* str: --ports LIST */
	K_T1 = 40,          /* u64: doctor time: the asker's wall clock when it sent (ns) */
	K_T2 = 41,          /* u64: the node's wall clock when the question arrived */
	K_T3 = 42,          /* u64: the node's wall clock when it answered */
	K_MTIME = 43,       /* u64: ns since the epoch (as a manifest's), two's complement */
	K_FILES_FWD = 44,   /* u64: files that came from peers (pull --cluster) */
	K_BYTES_FWD = 45,   /* u64 */
	K_TYPE = 46,        /* u64: the type of a frame carried in K_DATA (MSG_RELAY) */
	K_TIMEOUT_MS = 47,  /* u64: how long a relay may take, all its answers sent */
	K_SLOW_DONE = 48,   /* u64: pull --cluster, a relay's progress: the bytes done of the
			     * slowest node of its group (K_HOLDER) */
	K_SLOW_TOTAL = 49,  /* u64: and its bytes in all */
	K_UID = 50,         /* u64: MSG_OFFER: the owner of the checkpoint (its manifest's uid);
			     * MSG_CPULL_ASK: the user the parts act as */
	K_GID = 51,         /* u64: and its group; MSG_CPULL_ASK: the asking user's, with K_UID */
	K_GROUPS = 52,      /* str: MSG_CPULL_ASK: that user's supplementary gids, comma-separated */
	K_SEALED = 53,      /* bytes: an encrypted frame's fields, encrypted: its second and
			     * last field, after K_MAC (common/seal.h, PROTOCOL.md) */
	K_STREAMS = 54,     /* u64: MSG_OFFER: the connections its pieces go on, 1..16 */
	K_INDEX = 55,       /* u64: MSG_STREAM: which of them this one is, 1.. */
	K_FRAME_SUM = 56,   /* u64: MSG_WANT, MSG_FETCH_REQ: 0, the asker checks the bytes
			     * against the manifest only: the chunk frames may carry 0
			     * for their raw XXH3-64 (absent or 1: they carry it) */
	K_COPY = 57,        /* str: MSG_HOLD: a copy of the origin's step to NODE not
			     * confirmed yet: "NODE STATE[: WHY]" (copy groups) */
	K_RESTREAM = 58,    /* u64: MSG_OFFER: 1, the sender takes MSG_RESTREAM; MSG_WANT:
			     * 1, the receiver hands a lost stream's turns to the others */
	K_PAUSED = 59,      /* u64: MSG_DONE: ms the receiver stopped reading the copy to stand
			     * aside for its own node's trainer ([transfer] yield) */
	K_LATE = 60,        /* u64: MSG_OFFER: 1, the manifest last: the offered one's digests
			     * are unknown (0), the manifest follows the pieces (MSG_MANIFEST on
			     * stream 0) and MSG_END names its K_ROOT and K_SIZE */
};

/* Request flags (K_FLAGS). */
#define REQ_VERIFY   (1u << 0)  /* pull: re-read what landed and check it */
#define REQ_PROGRESS (1u << 1)  /* send MSG_PROGRESS frames (and count first) */
#define REQ_DEEP     (1u << 2)  /* verify: re-hash every byte */
#define REQ_WAIT     (1u << 3)  /* commit: answer once every replica is confirmed */
#define REQ_CLUSTER  (1u << 4)  /* verify: ask every node; pull: stage on every node */
#define REQ_QUICK    (1u << 5)  /* doctor: short measurements */
#define REQ_DRYRUN   (1u << 6)  /* resume: say what would be done, change nothing */
#define REQ_ALLSTEPS (1u << 7)  /* MSG_HOLD_REQ: every step held (no K_STEP), for resume */

struct msg {
	uint16_t type;
	uint16_t flags;
	uint8_t *buf;       /* payload, owned */
	size_t len, cap;
	int err;            /* sticky -ENOMEM/-E2BIG from the put calls */
};

void msg_init(struct msg *m, uint16_t type);
void msg_free(struct msg *m);
void msg_put_u64(struct msg *m, uint16_t key, uint64_t v);
void msg_put_bytes(struct msg *m, uint16_t key, const void *p, size_t n);
void msg_put_str(struct msg *m, uint16_t key, const char *s); /* strlen(s) bytes */
/* A K_NAME/K_VALUE pair, the value formatted (at most 1023 bytes): the
 * lines of `stage status`, a doctor's answers. */
void msg_put_pairf(struct msg *m, const char *name, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Lookup: 0, -ENOENT if absent, -EBADMSG if the length is wrong for a u64. */
int msg_get_u64(const struct msg *m, uint16_t key, uint64_t *v);
int msg_get_bytes(const struct msg *m, uint16_t key, const uint8_t **p, size_t *n);
/* Copies a str field into a fresh NUL-terminated string; -EINVAL if it holds a NUL. */
int msg_get_str(const struct msg *m, uint16_t key, char **out);
/* Iterate: *off starts at 0; returns 1 with key/p/n, 0 at the end. */
int msg_next_field(const struct msg *m, size_t *off, uint16_t *key, const uint8_t **p, size_t *n);

/* The value of a u64 field's 8 bytes (little-endian), for readers that
 * walk fields with msg_next_field. */
uint64_t proto_get_le64(const uint8_t *p);
/* Checks a payload's field structure. 0 or -EBADMSG. */
int proto_check_payload(const uint8_t *p, size_t n);
/* Decodes a header: 0 and the type, flags and length, or -EBADMSG. */
int proto_decode_hdr(const uint8_t hdr[PROTO_HDR_LEN], uint16_t *type, uint16_t *flags, uint32_t *len);
void proto_encode_hdr(uint8_t hdr[PROTO_HDR_LEN], uint16_t type, uint16_t flags, uint32_t len);
/* A field's header: key, 0, len. */
void proto_encode_field_hdr(uint8_t p[PROTO_FIELD_HDR_LEN], uint16_t key, uint32_t len);

/* Blocking whole-frame I/O on a stream socket (EINTR retried).
 * msg_send: 0 or -errno (m->err if a put failed). msg_recv: 0, -ENOTCONN on
 * a clean EOF before any header byte, -EBADMSG on a malformed frame, -errno. */
int msg_send(int fd, const struct msg *m);
/* The same, with one more field (key, tail[0..n)) sent after m's own from
 * where it lies: a 1 MiB piece is never copied into the message. */
int msg_send_tail(int fd, const struct msg *m, uint16_t key, const void *tail, size_t n);
int msg_recv(int fd, struct msg *m);
/* The same over any byte stream: read(ctx, p, n) fills p with the next n
 * bytes, 0 or -errno (-ENOTCONN for a clean end before a frame's first
 * byte, -ECONNRESET within one). msg_recv is this over a blocking fd. */
typedef int (*msg_read_fn)(void *ctx, uint8_t *p, size_t n);
int msg_recv_from(struct msg *m, msg_read_fn read, void *ctx);
/* The bytes msg_send_tail sends, as up to 4 pieces in iov (hdr and fhdr are
 * the caller's room for the two headers): their count, or m->err, or
 * -E2BIG. For transports that are not a stream socket. */
int msg_frame_iov(const struct msg *m, uint16_t key, const void *tail, size_t n,
		  uint8_t hdr[PROTO_HDR_LEN], uint8_t fhdr[PROTO_FIELD_HDR_LEN], struct iovec iov[4]);
/* Details of the above: msg_recv treats m as output only (it frees nothing
 * already there) and leaves it empty on error, so msg_free is always safe;
 * EOF after part of a frame is -ECONNRESET; the fd must be blocking, since a
 * frame is never left half-read. msg_send writes to non-sockets with writev,
 * where a closed reader raises SIGPIPE as usual. msg_next_field treats a
 * malformed tail (only possible in a msg built by hand) as the end. */

#endif
