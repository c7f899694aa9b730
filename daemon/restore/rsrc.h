/* Where a restore takes what it needs (restore.c): a holder's copy,
 * over a peer connection (rsrc_peer.c), or the durable tier's, read from
 * shared storage (rsrc_durable.c). Either way the bytes go through the
 * restore's chunk-checked builder, so a source is trusted for nothing: a
 * chunk that does not match the manifest is refused whoever sent it.
 *
 * States: closed --open--> open --manifest, fetch...--> --close--> closed.
 * A source that failed (a bad chunk, a connection lost) stays open until
 * closed; the restore goes on with another, if it has one.
 */
#ifndef STAGE_RSRC_H
#define STAGE_RSRC_H

#include <liburing.h>
#include <stddef.h>
#include <stdint.h>

#include "common/digest.h"
#include "common/manifest.h"
#include "common/xport.h"
#include "daemon/engine/cbuild.h"

struct rsrc;

struct rsrc_ops {
	/* Makes the copy reachable. 0 or -errno with why. */
	int (*open)(struct rsrc *s);
	/* The copy's manifest, every byte, into fd (empty, opened for writing).
	 * 0 or -errno with why. The caller checks its root. */
	int (*manifest)(struct rsrc *s, int fd);
	/* Bytes [off, end) of file e, in order, into cb (at off, begun on e):
	 * each piece cbuild_put. 0, or -errno with why (-EBADMSG: a chunk did
	 * not match the manifest). */
	int (*fetch)(struct rsrc *s, struct cbuild *cb, const struct mf_entry *e, uint64_t off,
		     uint64_t end);
	void (*close)(struct rsrc *s);
};

struct rsrc {
	const struct rsrc_ops *ops;     /* NULL: no such source */
	const char *name;               /* the holder, or HOLD_DURABLE */
	const char *job, *step;
	digest_t root;                  /* the commit it holds */
	struct io_uring *ring;          /* the restore's, for reads and writes */
	char *why;                      /* the restore's */
	size_t whylen;
	uint64_t bytes;                 /* file bytes it gave */
	bool opened;                    /* open succeeded: close is due */
	/* the peer's */
	struct xport *x;
	/* the durable tier's */
	const char *label;              /* ROOT/JOB/STEP, for messages */
	int stepfd;                     /* its fd, -1 */
};

extern const struct rsrc_ops rsrc_peer_ops, rsrc_durable_ops;

#endif
