/* The copier: many files in flight on one io_uring, each read in order of
 * offset, hashed in order (XXH3-128 of the whole content plus one digest per
 * manifest chunk), and, when it has a destination, written to a temporary
 * name and given its metadata; fdatasync'd too if opts ask (the pull asks it
 * for big files only and makes small ones durable in batches). It never
 * names anything final: the caller renames. With no destination it only
 * reads and hashes, which is what a deep verify needs.
 *
 * Memory: every buffer comes out of one byte budget (opts.memory); a file
 * starts only when copier_has_room() says so and reads stall, never fail,
 * when the budget is spent. So the copier's memory is bounded by the budget
 * plus a few hundred bytes per file in flight, whatever the tree's size.
 *
 * One thread owns a copier; nothing in it is shared but opts.cache_budget,
 * which several copiers may take from at once (atomically).
 */
#ifndef STAGE_COPIER_H
#define STAGE_COPIER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <linux/openat2.h>

#include "common/digest.h"

struct copier;
struct cp_seg;

struct copier_opts {
	uint64_t memory;      /* buffer budget, bytes */
	uint64_t io_size;     /* largest single read or write, power of two */
	uint64_t chunk_size;  /* manifest chunk, power of two */
	uint64_t direct_min;  /* files at least this big use O_DIRECT where it works */
	unsigned max_files;   /* files in flight at once */
	unsigned depth;       /* reads in flight per file */
	bool fsync;           /* fdatasync every destination before reporting it */
	uint64_t fsync_min;   /* ... or those at least this big (0: none) */
	bool direct_verify;   /* hash-only files: O_DIRECT whatever their size (read the disk, not the cache) */
	uint64_t *cache_budget; /* bytes of cold files still to read through the page cache
				 * instead of O_DIRECT, taken atomically by every copier
				 * sharing it (NULL: none; engine/pcache.h) */
};

enum cp_state { CP_IDLE, CP_OPENING, CP_DATA, CP_SYNCING, CP_DONE };

/* One file. The caller owns the struct and the strings and keeps them alive
 * and in place from copier_start until its done callback returns. */
struct cp_file {
	/* in */
	int src_at;             /* directory fd that src is relative to (borrowed) */
	const char *src;        /* resolved beneath src_at, never through a symlink */
	const char *dst;        /* temporary name relative to the copier's dst_root; NULL: hash only */
	uint64_t size;          /* bytes expected (from the walk), or CP_SIZE_UNKNOWN:
	                           then size, mtime_ns, mode, uid and gid are read
	                           from the opened source (and are out fields) */
	int64_t mtime_ns;       /* expected source mtime; also given to the destination */
	uint32_t mode;          /* destination permission bits */
	uid_t uid;
	gid_t gid;
	bool chown;             /* give the destination uid/gid (we are root) */
	void *owner;            /* the caller's */

	/* out, valid in the done callback */
	bool synced;            /* the destination was fdatasync'd */
	int err;                /* 0 or -errno */
	const char *err_op;     /* what failed: "open", "read", "write", "sync", ... */
	bool err_dst;           /* the destination failed (disk full...): fatal to a pull */
	digest_t digest;
	uint64_t nchunks;       /* ceil(size/chunk) when size > chunk, else 0 */
	digest_t *chunks;       /* nchunks digests; the callback may take them (set NULL) */

	/* private to copier.c */
	enum cp_state state;
	int src_fd, dst_fd;
	bool src_direct, dst_direct;
	int opens_pending;
	unsigned ops;            /* operations the kernel still owns */
	uint64_t read_off;      /* next offset to read */
	uint64_t hash_off;      /* bytes hashed so far, in order */
	uint64_t chunk_fill;    /* bytes fed to the current chunk state */
	unsigned nseg;          /* segments holding a buffer */
	struct cp_seg *segs;    /* opts.depth of them */
	void *whole, *chunk;    /* XXH3_state_t */
	struct open_how how_src, how_dst;
	struct cp_op { uint8_t kind; struct cp_file *f; struct cp_seg *s; } op_src, op_dst, op_sync;
	struct cp_file *next_live; /* list of files in flight */
};

#define CP_SIZE_UNKNOWN UINT64_MAX

typedef void (*cp_done_fn)(struct cp_file *f, void *arg);

/* dst_root (borrowed): where temporaries are created; -1 for hash only. */
int copier_create(struct copier **out, int dst_root, const struct copier_opts *o);
/* With files still in flight (only after the ring failed) their fds are
 * closed and temporaries removed; their buffers are leaked on purpose, as
 * the kernel may still write into them. */
void copier_destroy(struct copier *c);
/* Fails every file in flight with -ECANCELED: no new reads start, what the
 * kernel holds drains, and each is reported through done as usual. */
void copier_cancel(struct copier *c);
/* Whether a new file may start now (files in flight and memory). */
bool copier_has_room(const struct copier *c);
unsigned copier_inflight(const struct copier *c);
/* Starts f. 0 or -errno (then f was not started). */
int copier_start(struct copier *c, struct cp_file *f);
/* Submits, then waits up to timeout_ms for completions and handles them,
 * calling done for each file that finished (well or not). Returns the
 * number of files finished, or -errno if the ring itself failed. */
int copier_run(struct copier *c, int timeout_ms, cp_done_fn done, void *arg);
/* Frees a finished file's private resources (chunks too, unless taken). */
void copier_release(struct cp_file *f);

#endif
