/* The peer layer, on which every cluster feature stands (replication, the
 * survey and verify --cluster, restore and resume, the cluster pull, the
 * doctor): who the cluster is (the hosts file, the cluster key, this node),
 * dialling a node, and serving the connections other nodes open.
 *
 * Life: peers_open at start-up, before any feature runs; peers_stop once
 * the event loop no longer accepts (no connection is served after it);
 * peers_close last, when no thread dials any more. Between peers_open and
 * peers_close the membership (struct peers) is read-only: no lock.
 *
 * Serving (serve.c). A connection another node opens is admitted (at most
 * PEERS_MAX_HANDSHAKING still proving the key, and 4 per node of the
 * hosts file and 16 more in all), proves the cluster key
 * (daemon/net/peer.c), and then carries requests, each a frame whose type
 * is a row of the request table: every request type, replication's offer
 * like the rest, is registered there (peers_serve) before the event loop
 * accepts, and no connection is set up for any of them before it says what
 * it wants. A connection is served on one thread from its first frame to
 * its end, which is what lets a request type keep state across its
 * requests on one connection (peers_conn_state).
 */
#ifndef STAGE_PEERS_H
#define STAGE_PEERS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/auth.h"
#include "common/config.h"
#include "common/digest.h"
#include "common/hosts.h"
#include "common/proto.h"
#include "common/xport.h"

#define PEERS_HANDSHAKE_MS 10000       /* a connection proves the key within this */
#define PEERS_CONNECT_MS 3000          /* a question or a restore dials within this */
#define PEERS_MAX_HANDSHAKING 16       /* connections not yet authenticated, at once */

typedef size_t (*peers_notes_fn)(const char *job, const char *step, const digest_t *root,
				 char **out, size_t cap);
/* The membership: written by peers_open and peers_close only, but for
 * copy_notes (atomic), which replication sets and clears. */
struct peers {
	const struct stage_config *cfg;   /* borrowed, immutable */
	bool cluster;                     /* a hosts file with this node in it */
	struct hosts hosts;               /* cluster only */
	struct auth_key key;              /* cluster of more than one node only */
	size_t self;                      /* this node's index in hosts */
	/* Set by replication while it runs (NULL otherwise): the copies of
	 * this node's commit of JOB/STEP with this root that a partner has
	 * not confirmed, as K_COPY notes (copygroup.h), each malloc'd, at
	 * most cap; returns how many. What the survey says of them. */
	_Atomic(peers_notes_fn) copy_notes;
};
extern struct peers peers;

/* Loads the hosts file and the key (a missing hosts file at the configured
 * path: a single node) and opens the transports, listening when there are
 * other nodes. 0, or -errno with why (a bad hosts file or key file, this
 * node not in the hosts file, the listen address busy). */
int peers_open(const struct stage_config *cfg, char *why, size_t whylen);
/* No more connections: the listener closed, every connection shut down and
 * its thread ended. */
void peers_stop(void);
/* The mirror of peers_open (after peers_stop). */
void peers_close(void);

/* How long a peer that should be talking (a transfer, a node of a cluster
 * pull reporting) may be silent before it is taken for gone: [cluster]
 * peer_timeout, in ms. */
static inline int peers_io_ms(void)
{
	return peers.cfg ? peers.cfg->peer_timeout * 1000 : 60000;
}
/* This node's name in the cluster. */
const char *peers_self_name(void);
/* Connects to node `host` (an index in peers.hosts) within connect_ms and
 * proves the key; io_ms is the connection's timeout afterwards. 0 or
 * -errno with why. */
int peers_dial(size_t host, int connect_ms, int io_ms, struct xport **x, char *why,
	       size_t whylen);

/* A request a peer may send on its connection, and who serves it. The
 * server returns 0 to go on (the next request), -errno to close the
 * connection (a refusal sent). */
typedef int peers_serve_fn(struct xport *x, const char *peer, const struct msg *req);
/* Registers type (before the event loop accepts); end, if given, releases
 * what a server kept on a connection (peers_conn_set_state) when it ends.
 * 0, or -ENOSPC: the table is full. */
int peers_serve(uint16_t type, peers_serve_fn *serve, void (*end)(void *state));
/* Who serves a request type (NULL: nobody): a relay answers a question in
 * place with the same function (daemon/survey/fanout.c). */
peers_serve_fn *peers_served(uint16_t type);
/* What the server of type keeps on the connection being served on this
 * thread (NULL: nothing yet, or no connection is served on this thread). */
void *peers_conn_state(uint16_t type);
/* Keeps state on it, released by the type's end when the connection ends.
 * 0, or -EINVAL: no connection is served on this thread. */
int peers_conn_set_state(uint16_t type, void *state);

/* Bytes [off, off + size) of fd (a file of fsize bytes, called name in
 * messages) to peer (its proven name) as MSG_DATA pieces, then MSG_END,
 * through this thread's piece sender (read ahead; peer's connections
 * share one rate bucket), kept for the thread's life (ranges.c). 0, or
 * -errno with why (empty: the transport's error). no_sum: the frames
 * without their digest (the asker's K_FRAME_SUM 0). */
int peers_send_range(struct xport *x, const char *peer, int fd, uint64_t fsize, uint64_t off,
		     uint64_t size, bool no_sum, const char *name, char *why, size_t whylen);
/* The same through one of a few piece senders shared by every thread (a
 * cluster pull's serving: its connections grow with the cluster), waiting
 * at most wait_ms for one: -EAGAIN, nothing sent, when none came free. Its
 * frames always carry their digest: no manifest checks those bytes. */
int peers_send_range_shared(struct xport *x, const char *peer, int fd, uint64_t fsize,
			    uint64_t off, uint64_t size, int wait_ms, const char *name, char *why,
			    size_t whylen);

/* Connections being served now (admitted, not yet ended), for metrics. */
unsigned peers_serving(void);

/* The listener's fd for the event loop (-1: none), and what to call when it
 * is readable. */
int peers_listen_fd(void);
void peers_accept(void);

#endif
