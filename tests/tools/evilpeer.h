/* evilpeer's parts (tests/tools/evilpeer.c: the connection, manifests,
 * pieces, main; evilpeer_scn.c: the scenarios and their table). What each
 * helper does is said where it is defined. Every int function returns 0 or
 * -errno, except the scenarios, expect_refusal and end_and_done: they
 * return the verdict, which is the tool's exit status (PASS, FAIL, SETUP). */
#ifndef STAGE_EVILPEER_H
#define STAGE_EVILPEER_H

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <unistd.h>

#include "common/auth.h"
#include "common/codec.h"
#include "common/config.h"
#include "common/digest.h"
#include "common/hosts.h"
#include "common/manifest.h"
#include "common/proto.h"
#include "daemon/net/peer.h"
#include "daemon/repl/repl_have.h"
#include "common/xport.h"

#define PASS 0
#define FAIL 1
#define SETUP 2
#define ANSWER_MS 20000          /* a daemon that says nothing this long hangs */
#define PIECE (1u << 20)         /* raw bytes per DATA, as a real sender */
#define SLICE (256u << 10)       /* manifest bytes per MSG_MANIFEST */
#define CHUNK 4096u              /* the manifests' chunk size: small, many chunks */
#define MTIME 1700000000123456789LL

struct ctx {
	struct stage_config cfg;
	struct hosts hosts;
	struct auth_key key;
	const char *peer, *job, *step, *outside, *other;  /* other: a node neither us nor peer */
	const struct host *ph;
	struct xport *x;
	int count;
	uint64_t seed;           /* file content: differs per step, so nothing is held */
};

struct buf {
	char *p;
	size_t n, cap;
};

struct ent {
	char type;               /* 'd', 'f', 'l' */
	const char *path;        /* raw */
	uint64_t size;           /* files */
	const char *target;      /* links */
	bool fake;               /* a file too big to hash: digests made up */
	uint32_t mode;           /* 0: 0755 directories, 0644 files, 0777 links */
};

/* The standard tree every data scenario offers: a directory, a file of three
 * chunks, a small file, a link inside, a link pointing at --outside, and an
 * empty file. Its entry indices are the K_FILE values of the scenarios. */
enum { E_DIR, E_A, E_B, E_LINK, E_OUT, E_EMPTY, E_COUNT };
#define A_SIZE 10000u            /* chunks [0,4096) [4096,8192) [8192,10000) */
#define B_SIZE 100u

struct want {
	uint64_t code, file, off;
	uint64_t frame_sum;              /* K_FRAME_SUM; 1 when absent */
	uint8_t *held;
	size_t nheld;
};

/* The partner scenarios (evilpeer_partner.c), how they lie. */
enum { V_HELD_ALL, V_HELD_LONG, V_HELD_SHORT, V_WANT_BEYOND, V_VANISH_MID, V_NO_SUM,
       V_REFUSE, V_HOLD_GARBAGE, V_HOLD_FLOOD };
int scn_recv(struct ctx *c, int how);

struct scenario {
	const char *name;
	int (*run)(struct ctx *c, int how);
	int how;
};
extern const struct scenario evil_scenarios[];
extern const size_t evil_nscenarios;

void bput(struct buf *b, const void *p, size_t n);
void bprintf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void gen(const struct ctx *c, size_t idx, uint64_t off, uint8_t *p, size_t n);
uint64_t nchunks(uint64_t size, uint64_t chunk);
void manifest(const struct ctx *c, struct buf *b, const struct ent *v, size_t n, uint64_t chunk,
	      digest_t *root);
size_t std_tree(const struct ctx *c, struct ent v[E_COUNT]);
const char *type_name(uint16_t t);
int dial(struct ctx *c);
int sendm(struct ctx *c, struct msg *m);
int raw_fd(const struct ctx *c);
void show(const struct msg *m);
int answer(struct ctx *c, struct msg *m);
int expect_refusal(struct ctx *c, bool need_error);
void offer_fields(const struct ctx *c, struct msg *m, digest_t root, uint64_t size);
int send_slices(struct ctx *c, const char *p, size_t n, uint64_t base);
int get_want(struct ctx *c, struct want *w);
int offer_std(struct ctx *c, struct ent *v, struct buf *mf, digest_t *root, struct want *w);
/* The raw bytes of a piece's chunk frame p[0..n) into raw (cap bytes), as
 * the asker's K_FRAME_SUM asked: with no_sum its digest field must be 0 (the
 * bytes decoded without a check), without it the digest must match. 0
 * (*got: the raw length), or -errno. */
int frame_raw(const uint8_t *p, size_t n, bool no_sum, uint8_t *raw, size_t cap, size_t *got);
/* What send_piece_as spoils in the frame it sends. */
enum damage { DAMAGE_NONE, DAMAGE_PAYLOAD, DAMAGE_DIGEST };
int send_piece_as(struct ctx *c, uint64_t idx, uint64_t off, const uint8_t *raw, size_t n,
		  const struct codec_ops *codec, enum damage damage);
int send_bytes(struct ctx *c, uint64_t idx, uint64_t a, uint64_t b, uint64_t flip);
int send_wanted(struct ctx *c, const struct ent *v, size_t n, const struct want *w);
int end_and_done(struct ctx *c);

#endif
