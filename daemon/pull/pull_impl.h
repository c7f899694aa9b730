/* Inside the pull engine: what pull.c (the pass: the window retired in
 * order, durability in batches, the manifest, verify and repair) and
 * entries.c (what each entry of the walk becomes: a directory, a link, a
 * file copied, hashed in place or forwarded by a share) share. The states
 * and invariants are in pull.c's opening comment. Not for the rest of the
 * daemon (it uses pull.h). */
#ifndef STAGE_PULL_IMPL_H
#define STAGE_PULL_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/manifest.h"
#include "daemon/engine/copier.h"
#include "daemon/fs/cursor.h"
#include "daemon/fs/walk.h"
#include "daemon/pull/dirstack.h"
#include "daemon/pull/pull.h"
#include "daemon/pull/stagedir.h"

#define WINDOW 8192u             /* pending entries at most */
#define RETRY_MAX 64u
#define BIG_FILE(p) (2 * (p)->cfg->io_size)   /* also where O_DIRECT starts */

enum pend_state { P_WAIT, P_FWD, P_LANDED, P_READY, P_FAILED };

struct pending {
	struct mf_entry e;       /* what the manifest will say; e.path owned */
	enum pend_state st;
	uid_t uid;               /* the source's owner (given when we are root) */
	gid_t gid;
	char *tmp;               /* temporary name in .stage/tmp while copying, owned */
	bool fwd;                /* its temporary came from a peer (a share) */
	struct cp_file cf;
};

struct pull {
	struct job *job;
	const struct stage_config *cfg;
	char *src, *dst;             /* resolved absolute paths, owned */
	int src_fd;                  /* the source tree */
	int dst_fd;                  /* == sd.dst_fd */
	struct stagedir sd;          /* the destination and its .stage/ */
	struct copier *cp;
	struct mf_writer *mw;
	struct cursor prev, resume;  /* what earlier pulls knew */
	struct pending *win;         /* WINDOW slots, a ring */
	size_t head, count;
	struct dirstack dirs;        /* directories being filled */
	bool as_root;
	uint64_t t_flush_ns;
	uint64_t tmp_seq;            /* names temporaries in .stage/tmp */
	struct pending *retry[RETRY_MAX]; /* in-place hashes that failed: copy instead */
	unsigned nretry;
	/* results */
	uint64_t files, bytes, copied, bytes_copied, removed, failed;
	uint64_t changed;            /* of the failed: written to while copied */
	uint64_t dropped;            /* staged files verify found bad, removed */
	uint64_t landed, landed_bytes; /* P_LANDED entries in the window */
	uint64_t unsynced;           /* ... of which not fdatasync'd on their own */
	uint64_t t_landed_ns;        /* when the oldest of them landed */
	int fatal;                   /* -errno of a destination failure */
	char fatal_why[1024];
	/* a cluster pull's share (pull.h); NULL: every file from the source */
	const struct pull_share *sh;
	struct pull_stats *st;       /* NULL, or filled at the result */
	uint64_t fwd_files, fwd_bytes;   /* settled from peers (not in copied) */
	struct pending **parked;     /* forwards done, waiting for room in the copier */
	size_t nparked;              /* (at most WINDOW: each is a window entry) */
};

/* entries.c */
/* The first destination failure stops the pass; its message ends with
 * the error's text. */
void pull_note_fatal(struct pull *p, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* A metadata call on rel that failed: logged, the pull goes on. */
void pull_warn_meta(struct pull *p, const char *rel, const char *what, int err);
/* One entry of the walk into the window (and the copier, or the share). */
void pull_do_entry(struct pull *p, struct walk_ent *w);
/* The share's forwards that ended, within timeout_ms, settled. */
void pull_reap_fwd(struct pull *p, int timeout_ms);
/* Forwards done, waiting for room in the copier, started (stop: failed). */
void pull_start_parked(struct pull *p, bool stop);
/* In-place hashes that failed, copied instead (stop: failed). */
void pull_start_retries(struct pull *p, bool stop);

#endif
