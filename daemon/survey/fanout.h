/* Asking many nodes one question (verify --cluster's survey, a restore's, a
 * resume's) with this node's connections and threads bounded by [cluster]
 * fanout, whatever the size of the cluster.
 *
 * Up to `fanout` nodes are asked directly, each on a thread and a fresh
 * authenticated connection. Past that, the nodes are cut into `fanout`
 * groups of neighbours in hosts-file order, and the first node of each
 * group is asked to relay (MSG_RELAY): it answers for itself and asks the
 * rest of its group the same way, so the tree is as deep as it needs to be
 * (two levels reach fanout x (fanout + 1) nodes: 1,056 at the default 32).
 * The wire format: docs/PROTOCOL.md, "Relays"; the costs as the cluster
 * grows: docs/ARCHITECTURE.md, "Asking many nodes".
 */
#ifndef STAGE_FANOUT_H
#define STAGE_FANOUT_H

#include <stdbool.h>
#include <stddef.h>

#include "common/proto.h"
#include "common/xport.h"

/* One node's answer. The caller sets host (its index in the hosts file);
 * the rest is fanout's until fanout_wait returns. */
struct fan_answer {
	size_t host;
	int err;                   /* 0: m is the node's answer frame (a MSG_ERROR refusal
				    * included); else -errno, and why says why */
	char why[512];
	struct msg m;              /* owned by the caller after fanout_wait: msg_free */
	bool settled;              /* fanout's: answered or failed (err alone cannot say:
				    * a peer may send any errno) */
};

struct fanout;

/* Starts asking a[i].host the question q, for every i < n, all to be
 * settled within timeout_ms: 0 and *f, or -errno (nothing started). q and a
 * are borrowed until fanout_wait. The caller may do other work meanwhile
 * (answer the question for itself). */
int fanout_start(struct fanout **f, const struct msg *q, struct fan_answer *a, size_t n,
		 int timeout_ms);
/* Waits until every answer is settled, and frees f. */
void fanout_wait(struct fanout *f);

/* MSG_RELAY from a peer (peers_serve): answers for this node in place,
 * asks the nodes named, and sends their answers back. 0 to go on, -errno
 * to close the connection (a refusal has been sent). */
int fanout_serve(struct xport *x, const char *peer, const struct msg *req);

#endif
