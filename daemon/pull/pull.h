/* stage pull: mirror a source tree into the stage root, hashing every byte
 * into a manifest. */
#ifndef STAGE_PULL_H
#define STAGE_PULL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/digest.h"
#include "daemon/job/job.h"

/* Serves one MSG_PULL_REQ on job j (sends the result itself). */
void pull_run(struct job *j, const char *src_arg, const char *dest_arg);

/* One node's part of a cluster pull (daemon/cpull/): the same
 * pull, but a file this node is not to read from the source comes from a
 * peer instead. The share writes it whole into a temporary in the pass's
 * tmp/ (with the source's size, mtime, mode and owner), and the pull then
 * hashes that temporary and settles it as it does its own copies: made
 * durable with the batch's syncfs, then renamed to its final name. The
 * engine knows nothing of peers: it asks these, from its own thread. */
struct pull_fwd {
	const char *rel;             /* the file, from the tree's top; valid until done */
	uint64_t size;
	int64_t mtime_ns;
	uint32_t mode;
	uint32_t uid, gid;           /* the source's owner (given when running as root) */
	void *cookie;                /* the pull's, given back to done */
};

/* What a forward came to, for done: */
#define PULL_FWD_OK 0            /* whole in its temporary (tmp, in the pass's tmp/) */
#define PULL_FWD_READ 1          /* no peer has it for us: read it from the source */
				 /* < 0: -errno, failed (why given) */

struct pull_share_ops {
	/* A pass over the tree begins: the destination (dst_fd) and its
	 * temporaries' directory (tmp_fd, made anew each pass) are open, and
	 * nothing is in flight. Both are borrowed for this call: the share
	 * keeps dups, since it serves peers after this node's pull is over.
	 * 0 or -errno. */
	int (*begin)(void *arg, const char *dst, int dst_fd, int tmp_fd);
	/* Whether this node reads rel from the source itself. */
	bool (*reads)(void *arg, const char *rel);
	/* Starts getting f from a peer. 0 or -errno (f was not started). */
	int (*start)(void *arg, const struct pull_fwd *f);
	/* Calls done for each forward finished, waiting up to timeout_ms for
	 * the first if none has; how many were finished. done may start
	 * the next forwards. rc < 0: why says why; dest: it was this node's
	 * own disk (its destination), not the peers or the source. */
	unsigned (*reap)(void *arg, int timeout_ms,
			 void (*done)(void *cookie, int rc, const char *tmp, const char *why,
				      bool dest, void *darg), void *darg);
	/* Forwards started and not yet reaped. */
	unsigned (*inflight)(void *arg);
	/* Stops every forward soon: each is reaped with -ECANCELED. */
	void (*cancel)(void *arg);
	/* A file this node was copying from the source failed (rel: as walked;
	 * why: the note said): peers waiting for it may ask elsewhere. */
	void (*failed)(void *arg, const char *rel, const char *why);
	/* This node's pull is over (ok: its manifest was published). */
	void (*end)(void *arg, bool ok);
};

struct pull_share {
	const struct pull_share_ops *ops;
	void *arg;
};

/* What a pull did, for a caller that is not its client. */
struct pull_stats {
	char dst[4096];              /* the destination, once resolved ("" before) */
	digest_t root;               /* when code 0 */
	uint64_t files, bytes;       /* in the tree */
	uint64_t read_files, read_bytes;     /* copied from the source */
	uint64_t fwd_files, fwd_bytes;       /* came from peers */
};

/* pull_run as one node's part of a cluster pull: sh says where files come
 * from, *st gets the figures (the result goes to j as usual). */
void pull_run_share(struct job *j, const char *src_arg, const char *dest_arg,
		    const struct pull_share *sh, struct pull_stats *st);

#endif
