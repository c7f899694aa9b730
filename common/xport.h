/* Transports: how frames move between peers. Each transport is a table of
 * operations (TCP in xport_tcp.c, RDMA in rdma/verbs.c), and everything above
 * holds a `struct xport *` and calls through x->ops, never asking which
 * transport it has. A connection carries the frames of common/proto.h, whole
 * and in order; the transport adds nothing a peer must know about beyond
 * docs/PROTOCOL.md.
 *
 * Threads: a connection is used by one thread at a time, except that
 * x->ops->shutdown may be called from any thread to unblock the owner (its
 * send or recv then fails with -ESHUTDOWN or the socket's error).
 *
 * Every operation returns 0 or -errno. Timeouts are -ETIMEDOUT.
 */
#ifndef STAGE_XPORT_H
#define STAGE_XPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/hosts.h"
#include "common/proto.h"

struct xport;
struct xport_listener;

struct xport_ops {
	const char *name;        /* "tcp", "rdma": for status and logs */
	/* Whether this node can use the transport (a device is present): 0,
	 * or -ENODEV with why. NULL: always. why says what, either way. */
	int (*available)(char *why, size_t whylen);
	/* Binds and listens at host:port (host as config_parse_hostport gives
	 * it: an IPv4 address, a name, or a bare IPv6 address). *fd becomes
	 * readable when a connection waits; the caller polls it. */
	int (*listen)(const char *host, uint16_t port, struct xport_listener **l, int *fd,
		      char *why, size_t whylen);
	/* One waiting connection, or -EAGAIN when none is. */
	int (*accept)(struct xport_listener *l, struct xport **x);
	void (*unlisten)(struct xport_listener *l);
	/* Connects to node h within timeout_ms. why names the node. */
	int (*connect)(const struct host *h, int timeout_ms, struct xport **x,
		       char *why, size_t whylen);
	/* A whole frame, blocking (up to the connection's timeout). */
	int (*send)(struct xport *x, const struct msg *m);
	/* m plus one more field (key, tail[0..n)), without copying tail. */
	int (*send_tail)(struct xport *x, const struct msg *m, uint16_t key, const void *tail,
			 size_t n);
	/* A whole frame; -ENOTCONN on a clean close between frames. */
	int (*recv)(struct xport *x, struct msg *m);
	/* After a failed send: one frame the peer sent before it closed (its
	 * MSG_ERROR: a refusal while we were still sending), within timeout_ms.
	 * Only while nothing has failed on the receiving side. */
	int (*recv_last)(struct xport *x, struct msg *m, int timeout_ms);
	/* Whether the peer has sent something not read yet (or closed), without
	 * waiting: a sender that only sends can look for an answer between
	 * frames. NULL where the transport cannot tell. */
	bool (*ready)(struct xport *x);
	/* 0 disables; applies to every later send and recv. */
	int (*set_timeout)(struct xport *x, int timeout_ms);
	/* Bytes handed to send that have not yet reached the peer (sent but
	 * not acknowledged, or not sent yet): with the time, it tells how fast
	 * the path drains, which the time send takes does not (it returns once
	 * the bytes are queued). 0 when unknown. */
	uint64_t (*queued)(struct xport *x);
	/* Wakes a thread blocked in send or recv; the connection is then dead. */
	void (*shutdown)(struct xport *x);
	void (*close)(struct xport *x);
};

/* The part every transport's connection begins with. */
struct xport {
	const struct xport_ops *ops;
	char peer[80];           /* "ADDR:PORT" of the other end, for messages */
};

/* The transports, in the order transport = auto tries them (repl_net.c). */
extern const struct xport_ops xport_rdma_ops;   /* rdma/verbs.c */
extern const struct xport_ops xport_tcp_ops;

#endif
