/* The RDMA transport: common/xport.h's table over librdmacm and libibverbs.
 * The bookkeeping (credits, sequence numbers, slots, send buffers) is
 * rdma/flow.c's; this file posts, polls and waits.
 *
 * A connection is an RC queue pair set up by RDMA CM (port space TCP, the
 * node's listen port, at its hosts file `rdma=` address or else its host),
 * with one protection domain, one completion queue for both directions and
 * its completion channel, and one registered region: R_NSLOTS receive slots
 * followed by R_NSEND send buffers. What crosses is the byte stream of
 * docs/PROTOCOL.md's frames, cut into SEND WITH IMMEDIATE messages (the
 * immediate: sequence number and credits returned), exactly as over TCP
 * otherwise: nothing above the transport changes.
 *
 * Threads follow xport.h: the connection's owner posts, polls and waits
 * (poll(2) on the completion channel and on the connection's own CM event
 * channel, with the connection's timeout); shutdown() from another thread
 * disconnects, which flushes the queue pair and wakes the owner.
 *
 * Not run on a device in this project (the machines it was built on have
 * none): docs/PROTOCOL.md and README say so. The logic that can be tested
 * without one is in flow.c, with its unit tests.
 */
#include "common/clock.h"
#include "common/xport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include "rdma/flow.h"

#define R_NSLOTS 32                     /* receive slots per connection */
#define R_SLOT_SHIFT 18                 /* 256 KiB each: 8 MiB to receive into */
#define R_SLOT (1u << R_SLOT_SHIFT)
#define R_NSEND 16                      /* send buffers, as big as a slot */
#define R_CQ_DEPTH (R_NSLOTS + R_NSEND + 8)
#define R_RESOLVE_MS 2000               /* address and route resolution */
#define R_BACKLOG 16
#define CLOSE_MS 2000                   /* close waits this long for sends to land */
#define R_MEMLOCK (64ull << 20)         /* pinned memory a few connections need */

struct xport_listener {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
};

struct rconn {
	struct xport base;               /* first: what the daemon holds */
	struct rdma_event_channel *ch;   /* this connection's CM events */
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_comp_channel *cc;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	uint8_t *mem;                    /* R_NSLOTS slots, then R_NSEND send buffers */
	struct rflow f;
	bool established;                /* the CM said so: sends may be posted */
	bool gone;                       /* disconnected, or the QP flushed: nothing
					  * more comes, what came is still readable */
	bool sends_dead;                 /* a send failed: no more sends */
	int timeout_ms;                  /* 0: none */
	atomic_bool shut;
	int wake;                        /* eventfd: shutdown() wakes the owner */
	uint32_t freed[R_NSLOTS];
};

static int nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -errno : 0;
}

static void say(char *why, size_t whylen, const char *what, int err)
{
	if (why && whylen)
		snprintf(why, whylen, "rdma: %s: %s", what, strerror(err));
}

/* ---- the CM ---- */

static int cm_errno(enum rdma_cm_event_type t)
{
	switch (t) {
	case RDMA_CM_EVENT_REJECTED:
	case RDMA_CM_EVENT_CONNECT_ERROR:
		return -ECONNREFUSED;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
		return -EHOSTUNREACH;
	case RDMA_CM_EVENT_DISCONNECTED:
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		return -ECONNRESET;
	default:
		return -EPROTO;
	}
}

/* Waits for event `want` on ch: 0 with *ev (the caller acks it), or -errno. */
static int cm_wait(struct rdma_event_channel *ch, enum rdma_cm_event_type want, int timeout_ms,
		   struct rdma_cm_event **ev)
{
	int64_t end = mono_ms() + timeout_ms;

	for (;;) {
		struct pollfd p = { .fd = ch->fd, .events = POLLIN };
		int64_t left = end - mono_ms();
		int rc;

		if (left <= 0)
			return -ETIMEDOUT;
		rc = poll(&p, 1, (int)left);
		if (rc < 0 && errno != EINTR)
			return -errno;
		if (rc <= 0)
			continue;
		if (rdma_get_cm_event(ch, ev) < 0) {
			if (errno == EAGAIN || errno == EINTR)
				continue;
			return -errno;
		}
		if ((*ev)->event == want)
			return 0;
		rc = cm_errno((*ev)->event);
		rdma_ack_cm_event(*ev);
		return rc;
	}
}

/* ---- resources ---- */

static int post_recv(struct rconn *c, uint32_t slot)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(c->mem + (size_t)slot * R_SLOT),
			       .length = R_SLOT, .lkey = c->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1 }, *bad;
	int rc = ibv_post_recv(c->id->qp, &wr, &bad);

	return rc ? -rc : 0;
}

/* PD, completion channel and queue, the QP on c->id, the region, and every
 * receive slot posted. */
static int setup(struct rconn *c)
{
	struct ibv_context *v = c->id->verbs;
	struct ibv_qp_init_attr qa = { 0 };
	size_t size = (size_t)(R_NSLOTS + R_NSEND) * R_SLOT;
	int rc;

	if (!(c->pd = ibv_alloc_pd(v)) || !(c->cc = ibv_create_comp_channel(v)))
		return -(errno ? errno : ENOMEM);
	if ((rc = nonblock(c->cc->fd)) < 0)
		return rc;
	if (!(c->cq = ibv_create_cq(v, R_CQ_DEPTH, c, c->cc, 0)))
		return -(errno ? errno : ENOMEM);
	if ((rc = ibv_req_notify_cq(c->cq, 0)) != 0)
		return -rc;
	qa.send_cq = qa.recv_cq = c->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.sq_sig_all = 1;
	qa.cap.max_send_wr = R_NSEND;
	qa.cap.max_recv_wr = R_NSLOTS;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	if (rdma_create_qp(c->id, c->pd, &qa) < 0)
		return -errno;
	c->mem = aligned_alloc(4096, size);
	if (!c->mem)
		return -ENOMEM;
	if (!(c->mr = ibv_reg_mr(c->pd, c->mem, size, IBV_ACCESS_LOCAL_WRITE)))
		return -(errno ? errno : ENOMEM);
	for (uint32_t s = 0; s < R_NSLOTS; s++)
		if ((rc = post_recv(c, s)) < 0)
			return rc;
	return 0;
}

/* The mirror of setup, and of the CM objects; safe on a half-made c. */
static void teardown(struct rconn *c)
{
	if (c->id && c->id->qp)
		rdma_destroy_qp(c->id);
	if (c->mr)
		ibv_dereg_mr(c->mr);
	free(c->mem);
	if (c->cq)
		ibv_destroy_cq(c->cq);
	if (c->cc)
		ibv_destroy_comp_channel(c->cc);
	if (c->pd)
		ibv_dealloc_pd(c->pd);
	if (c->id)
		rdma_destroy_id(c->id);
	if (c->ch)
		rdma_destroy_event_channel(c->ch);
	rflow_fini(&c->f);
	close(c->wake);
	free(c);
}

static struct rconn *conn_new(void)
{
	struct rconn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->base.ops = &xport_rdma_ops;
	c->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (c->wake < 0) {
		free(c);
		return NULL;
	}
	return c;
}

static void set_peer(struct rconn *c, const struct sockaddr *sa)
{
	char host[64] = "?", port[16] = "?";

	getnameinfo(sa, sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) :
		    sizeof(struct sockaddr_in), host, sizeof(host), port, sizeof(port),
		    NI_NUMERICHOST | NI_NUMERICSERV);
	snprintf(c->base.peer, sizeof(c->base.peer), strchr(host, ':') ? "[%s]:%s" : "%s:%s",
		 host, port);
}

/* ---- completions ---- */

/* Work request ids: a receive slot's number, or R_NSLOTS + a send buffer's:
 * on an error completion the opcode is undefined, the id is not. */
#define SEND_ID(buf) ((uint64_t)R_NSLOTS + (buf))

/* What the CQ holds: receives to the flow (re-posting slots that carried
 * only credits), sends done. The number of completions handled, or the
 * flow's error. A failed send ends the sending only, so that what arrived
 * before (the peer's refusal, say) can still be read. */
static int reap(struct rconn *c)
{
	struct ibv_wc wc[16];
	int n, total = 0;

	while ((n = ibv_poll_cq(c->cq, 16, wc)) > 0) {
		total += n;
		for (int i = 0; i < n; i++) {
			bool free_now = false;
			int rc = 0;

			if (wc[i].status != IBV_WC_SUCCESS) {
				/* Flushed: the QP went to error on a disconnect. */
				if (wc[i].status == IBV_WC_WR_FLUSH_ERR)
					c->gone = true;
				else if (wc[i].wr_id >= R_NSLOTS)
					c->sends_dead = c->gone = true;
				else
					rflow_fail(&c->f, -EIO);
				continue;
			}
			if (wc[i].opcode == IBV_WC_RECV) {
				if (!(wc[i].wc_flags & IBV_WC_WITH_IMM))
					rc = -EPROTO;
				else
					rc = rflow_recv(&c->f, (uint32_t)wc[i].wr_id, wc[i].byte_len,
							ntohl(wc[i].imm_data), &free_now);
				if (rc == 0 && free_now && (rc = post_recv(c, (uint32_t)wc[i].wr_id)) == 0)
					rflow_reposted(&c->f, 1);
			} else if (wc[i].opcode == IBV_WC_SEND) {
				rc = rflow_send_done(&c->f);
			}
			if (rc < 0)
				rflow_fail(&c->f, rc);
		}
	}
	if (n < 0)
		rflow_fail(&c->f, -EIO);
	return rflow_error(&c->f) ? rflow_error(&c->f) : total;
}

static int failed(struct rconn *c)
{
	if (atomic_load(&c->shut))
		return -ESHUTDOWN;
	return rflow_error(&c->f);
}

/* The connection's CM events: ESTABLISHED opens it for sends; a few are
 * of no consequence; any other (a disconnect, a device gone, a peer that
 * never completed the connection) means nothing more comes. */
static void cm_events(struct rconn *c)
{
	struct rdma_cm_event *ev;

	while (rdma_get_cm_event(c->ch, &ev) == 0) {
		switch (ev->event) {
		case RDMA_CM_EVENT_ESTABLISHED:
			c->established = true;
			break;
		case RDMA_CM_EVENT_TIMEWAIT_EXIT:
		case RDMA_CM_EVENT_ADDR_CHANGE:
			break;
		default:
			c->gone = true;
		}
		rdma_ack_cm_event(ev);
	}
}

/* Waits for something to happen: a completion, a CM event or shutdown(),
 * until deadline (ms, monotonic; 0: none). 0 (look again), or -errno. */
static int wait_event(struct rconn *c, int64_t deadline)
{
	struct pollfd p[3] = { { .fd = c->cc->fd, .events = POLLIN },
			       { .fd = c->ch->fd, .events = POLLIN },
			       { .fd = c->wake, .events = POLLIN } };
	int rc, left;

	if ((rc = reap(c)) != 0)
		return rc < 0 ? rc : 0;
	/* Arm, then look once more: completions that came in between raise
	 * no event, so having found any, the caller looks before we sleep. */
	if ((rc = ibv_req_notify_cq(c->cq, 0)) != 0)
		return -rc;
	if ((rc = reap(c)) != 0)
		return rc < 0 ? rc : 0;
	if (c->gone || atomic_load(&c->shut))
		return 0;
	left = deadline ? (int)(deadline - mono_ms()) : -1;
	if (deadline && left <= 0)
		return -ETIMEDOUT;
	rc = poll(p, 3, left);
	if (rc < 0)
		return errno == EINTR ? 0 : -errno;
	if (rc == 0)
		return -ETIMEDOUT;
	if (p[0].revents & (POLLERR | POLLHUP | POLLNVAL)) {
		rflow_fail(&c->f, -EIO);        /* else this would spin */
		return -EIO;
	}
	if (p[0].revents) {
		struct ibv_cq *cq;
		void *ctx;

		if (ibv_get_cq_event(c->cc, &cq, &ctx) == 0)
			ibv_ack_cq_events(cq, 1);
		else if (errno != EAGAIN && errno != EINTR) {
			rflow_fail(&c->f, -EIO);
			return -EIO;
		}
	}
	if (p[1].revents)
		cm_events(c);
	rc = reap(c);
	return rc < 0 ? rc : 0;
}

static int64_t deadline_of(const struct rconn *c)
{
	return c->timeout_ms ? mono_ms() + c->timeout_ms : 0;
}

/* ---- sending ---- */

/* One message of len bytes gathered from iov at *at (piece, offset). */
static int post_msg(struct rconn *c, const struct iovec *iov, int niov, int *piece, size_t *off,
		    uint32_t len)
{
	uint32_t buf, imm;
	int rc = rflow_send_begin(&c->f, len, &buf, &imm);
	uint8_t *dst;
	struct ibv_sge sge;
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = len ? 1 : 0,
				  .opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED },
			   *bad;

	if (rc < 0)
		return rc;
	dst = c->mem + (size_t)(R_NSLOTS + buf) * R_SLOT;
	sge = (struct ibv_sge){ .addr = (uintptr_t)dst, .length = len, .lkey = c->mr->lkey };
	wr.wr_id = SEND_ID(buf);
	for (uint32_t done = 0; done < len; ) {
		size_t take = iov[*piece].iov_len - *off;

		if (take > len - done)
			take = len - done;
		memcpy(dst + done, (const uint8_t *)iov[*piece].iov_base + *off, take);
		done += (uint32_t)take;
		*off += take;
		if (*off == iov[*piece].iov_len && *piece + 1 < niov) {
			(*piece)++;
			*off = 0;
		}
	}
	wr.imm_data = htonl(imm);
	rc = ibv_post_send(c->id->qp, &wr, &bad);
	if (rc) {
		rflow_fail(&c->f, -rc);
		return -rc;
	}
	return 0;
}

/* Credits owed and due go back in a message of their own. */
static int return_credits(struct rconn *c)
{
	int piece = 0;
	size_t off = 0;

	while (c->established && !c->sends_dead && !c->gone && rflow_want_credit_msg(&c->f)) {
		int rc = post_msg(c, NULL, 0, &piece, &off, 0);

		if (rc < 0)
			return rc;
	}
	return 0;
}

static int r_send_tail(struct xport *x, const struct msg *m, uint16_t key, const void *tail,
		       size_t n)
{
	struct rconn *c = (struct rconn *)x;
	uint8_t hdr[PROTO_HDR_LEN], fhdr[PROTO_FIELD_HDR_LEN];
	struct iovec iov[4];
	int niov = msg_frame_iov(m, key, tail, n, hdr, fhdr, iov), piece = 0, rc;
	int64_t deadline = deadline_of(c);
	size_t total = 0, off = 0;
	bool posted = false;

	if (niov < 0)
		return niov;
	for (int i = 0; i < niov; i++)
		total += iov[i].iov_len;
	while (total) {
		uint32_t len = rflow_max_payload(&c->f);

		if ((rc = failed(c)) < 0)
			break;
		if (c->gone || c->sends_dead) {
			rc = -EPIPE;
			break;
		}
		if (len > total)
			len = (uint32_t)total;
		if (c->established && rflow_can_send_data(&c->f)) {
			if ((rc = post_msg(c, iov, niov, &piece, &off, len)) < 0)
				break;
			posted = true;
			total -= len;
			continue;
		}
		if ((rc = return_credits(c)) < 0 || (rc = wait_event(c, deadline)) < 0) {
			rc = failed(c) ? failed(c) : rc;
			break;
		}
	}
	/* Part of a frame went: the stream is out of step for good (the
	 * receiving side is left alone: what came can still be read). */
	if (total && posted)
		c->sends_dead = true;
	return total ? rc : 0;
}

static int r_send(struct xport *x, const struct msg *m)
{
	return r_send_tail(x, m, 0, NULL, 0);
}

/* ---- receiving ---- */

/* Reading one frame: the connection, its deadline, whether a byte came. */
struct frame_reader {
	struct rconn *c;
	int64_t deadline;
	bool started;
};

/* n bytes of the stream into out (msg_read_fn). */
static int read_bytes(void *ctx, uint8_t *out, size_t n)
{
	struct frame_reader *fr = ctx;
	struct rconn *c = fr->c;
	int64_t deadline = fr->deadline;

	while (n) {
		uint32_t nf = 0;
		size_t got;
		int rc;

		if ((rc = failed(c)) < 0)
			return rc;
		got = rflow_read(&c->f, c->mem, out, n, c->freed, &nf);
		for (uint32_t i = 0; i < nf; i++) {
			if ((rc = post_recv(c, c->freed[i])) < 0) {
				rflow_fail(&c->f, rc);
				return rc;
			}
			rflow_reposted(&c->f, 1);
		}
		if ((rc = return_credits(c)) < 0)
			return rc;
		if (got) {
			fr->started = true;
			out += got;
			n -= got;
			continue;
		}
		if (c->gone)    /* a close between frames is a clean end, as on TCP */
			return fr->started ? -ECONNRESET : -ENOTCONN;
		if ((rc = wait_event(c, deadline)) < 0)
			return failed(c) ? failed(c) : rc;
	}
	return 0;
}

static int r_recv(struct xport *x, struct msg *m)
{
	struct rconn *c = (struct rconn *)x;
	struct frame_reader fr = { .c = c, .deadline = deadline_of(c) };
	int rc = msg_recv_from(m, read_bytes, &fr);

	/* A frame cut or malformed leaves the stream out of step. */
	if (rc < 0 && (fr.started || (rc != -ENOTCONN && rc != -ETIMEDOUT)))
		rflow_fail(&c->f, rc);
	return rc;
}

static int r_recv_last(struct xport *x, struct msg *m, int timeout_ms)
{
	struct rconn *c = (struct rconn *)x;
	int saved = c->timeout_ms, rc;

	/* Received bytes stay readable after a failed send: RC delivers in
	 * order, so the peer's refusal is there if it sent one. */
	c->timeout_ms = timeout_ms;
	rc = r_recv(x, m);
	c->timeout_ms = saved;
	return rc;
}

/* ---- the rest of the table ---- */

static int r_set_timeout(struct xport *x, int timeout_ms)
{
	if (timeout_ms < 0)
		return -EINVAL;
	((struct rconn *)x)->timeout_ms = timeout_ms;
	return 0;
}

static uint64_t r_queued(struct xport *x)
{
	struct rconn *c = (struct rconn *)x;

	reap(c);                    /* sends done since the last wait */
	return rflow_queued(&c->f);
}

static void r_shutdown(struct xport *x)
{
	struct rconn *c = (struct rconn *)x;

	uint64_t one = 1;

	atomic_store(&c->shut, true);
	if (write(c->wake, &one, sizeof(one)) < 0) {
		/* the counter is full: the owner is woken already */
	}
	rdma_disconnect(c->id);     /* and the peer learns it */
}

static void r_close(struct xport *x)
{
	struct rconn *c = (struct rconn *)x;

	int64_t end = mono_ms() + CLOSE_MS;

	if (!c)
		return;
	/* Like a TCP close, let what was sent arrive (a refusal, say) before
	 * the disconnect flushes it. */
	while (c->established && !c->gone && !c->sends_dead && !atomic_load(&c->shut) &&
	       rflow_queued(&c->f) && wait_event(c, end) == 0)
		;
	if (c->established && !c->gone)
		rdma_disconnect(c->id);
	teardown(c);
}

static int resolve(const char *host, uint16_t port, struct addrinfo **ai)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	char p[8];
	int rc;

	snprintf(p, sizeof(p), "%u", port);
	rc = getaddrinfo(host, p, &hints, ai);
	return rc == 0 ? 0 : rc == EAI_SYSTEM ? -errno : -EHOSTUNREACH;
}

/* Address and route resolution, each at most R_RESOLVE_MS and no more than
 * the caller's whole budget. */
static int resolve_ms(int timeout_ms)
{
	return timeout_ms > 0 && timeout_ms < R_RESOLVE_MS ? timeout_ms : R_RESOLVE_MS;
}

static int r_connect(const struct host *h, int timeout_ms, struct xport **x, char *why,
		     size_t whylen)
{
	const char *addr = h->rdma ? h->rdma : h->host;
	uint8_t hello[RFLOW_HELLO_LEN];
	struct rdma_conn_param cp = { .private_data = hello, .private_data_len = sizeof(hello),
				      .retry_count = 7, .rnr_retry_count = 6 };
	struct rdma_cm_event *ev;
	struct addrinfo *ai = NULL;
	struct rconn *c = conn_new();
	uint32_t pn, ps;
	const char *step = "opening the connection manager";
	bool connected = false;
	int rc;

	if (!c) {
		say(why, whylen, "connecting", ENOMEM);
		return -ENOMEM;
	}
	rc = resolve(addr, h->port, &ai);
	if (rc == 0 && !(c->ch = rdma_create_event_channel()))
		rc = -errno;
	if (rc == 0)
		rc = nonblock(c->ch->fd);
	if (rc == 0 && rdma_create_id(c->ch, &c->id, c, RDMA_PS_TCP) < 0)
		rc = -errno;
	if (rc == 0) {
		step = "resolving the address";
		set_peer(c, ai->ai_addr);
		if (rdma_resolve_addr(c->id, NULL, ai->ai_addr, resolve_ms(timeout_ms)) < 0)
			rc = -errno;
	}
	if (ai)
		freeaddrinfo(ai);
	if (rc == 0 && (rc = cm_wait(c->ch, RDMA_CM_EVENT_ADDR_RESOLVED, resolve_ms(timeout_ms),
				     &ev)) == 0)
		rdma_ack_cm_event(ev);
	if (rc == 0) {
		step = "resolving the route";
		rc = rdma_resolve_route(c->id, resolve_ms(timeout_ms)) < 0 ? -errno : 0;
	}
	if (rc == 0 && (rc = cm_wait(c->ch, RDMA_CM_EVENT_ROUTE_RESOLVED, resolve_ms(timeout_ms),
				     &ev)) == 0)
		rdma_ack_cm_event(ev);
	if (rc == 0) {
		step = "setting up the queue pair";
		rc = setup(c);
	}
	if (rc == 0) {
		step = "connecting";
		rflow_hello_put(hello, R_NSLOTS, R_SLOT);
		rc = rdma_connect(c->id, &cp) < 0 ? -errno : 0;
	}
	if (rc == 0 && (rc = cm_wait(c->ch, RDMA_CM_EVENT_ESTABLISHED, timeout_ms, &ev)) == 0) {
		connected = true;
		rc = rflow_hello_get(ev->param.conn.private_data, ev->param.conn.private_data_len,
				     &pn, &ps);
		rdma_ack_cm_event(ev);
		if (rc == 0)
			rc = rflow_init(&c->f, R_NSLOTS, R_SLOT, R_NSEND, R_SLOT, pn, ps);
		c->established = rc == 0;
	}
	if (rc < 0) {
		if (why && whylen)
			snprintf(why, whylen, strchr(addr, ':') ? "node %s ([%s]:%u): rdma: %s: %s" :
				 "node %s (%s:%u): rdma: %s: %s", h->name, addr, h->port, step,
				 strerror(-rc));
		if (connected)
			rdma_disconnect(c->id);
		teardown(c);
		return rc;
	}
	*x = &c->base;
	return 0;
}

static int r_listen(const char *host, uint16_t port, struct xport_listener **l, int *fd,
		    char *why, size_t whylen)
{
	struct xport_listener *s = calloc(1, sizeof(*s));
	struct addrinfo *ai = NULL;
	int rc = s ? resolve(host, port, &ai) : -ENOMEM;

	if (rc == 0 && !(s->ch = rdma_create_event_channel()))
		rc = -errno;
	if (rc == 0)
		rc = nonblock(s->ch->fd);
	if (rc == 0 && rdma_create_id(s->ch, &s->id, NULL, RDMA_PS_TCP) < 0)
		rc = -errno;
	if (rc == 0 && rdma_bind_addr(s->id, ai->ai_addr) < 0)
		rc = -errno;
	if (rc == 0 && rdma_listen(s->id, R_BACKLOG) < 0)
		rc = -errno;
	if (ai)
		freeaddrinfo(ai);
	if (rc < 0) {
		if (why && whylen)
			snprintf(why, whylen, "rdma: listening on %s:%u: %s", host, port,
				 strerror(-rc));
		xport_rdma_ops.unlisten(s);
		return rc;
	}
	*l = s;
	*fd = s->ch->fd;
	return 0;
}

static void r_unlisten(struct xport_listener *l)
{
	if (!l)
		return;
	if (l->id)
		rdma_destroy_id(l->id);
	if (l->ch)
		rdma_destroy_event_channel(l->ch);
	free(l);
}

/* One connect request, set up and accepted: 0 with *x; -EAGAIN when none
 * waits. A request that cannot be taken (not ours, no resources) is
 * rejected and the next one looked at, as TCP's accept goes on past an
 * aborted connection: the listener's fd is armed edge-wise by the daemon,
 * so what is left queued here would wait for the next arrival. ESTABLISHED
 * comes later on the connection's own channel; its first send waits. */
static int r_accept(struct xport_listener *l, struct xport **x)
{
	for (;;) {
		struct rdma_cm_event *ev;
		struct rdma_cm_id *id;
		struct rconn *c;
		uint8_t hello[RFLOW_HELLO_LEN];
		struct rdma_conn_param cp = { .private_data = hello,
					      .private_data_len = sizeof(hello),
					      .retry_count = 7, .rnr_retry_count = 6 };
		uint32_t pn = 0, ps = 0;
		int rc;

		if (rdma_get_cm_event(l->ch, &ev) < 0)
			return errno == EAGAIN || errno == EINTR ? -EAGAIN : -errno;
		if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
			rdma_ack_cm_event(ev);
			continue;
		}
		id = ev->id;
		rc = rflow_hello_get(ev->param.conn.private_data, ev->param.conn.private_data_len,
				     &pn, &ps);
		rdma_ack_cm_event(ev);
		c = rc == 0 ? conn_new() : NULL;
		if (!c) {
			rdma_reject(id, NULL, 0);
			rdma_destroy_id(id);
			continue;
		}
		c->id = id;
		id->context = c;
		set_peer(c, rdma_get_peer_addr(id));
		if (!(c->ch = rdma_create_event_channel()) || nonblock(c->ch->fd) < 0 ||
		    rdma_migrate_id(id, c->ch) < 0)
			rc = -(errno ? errno : EIO);
		if (rc == 0)
			rc = setup(c);
		if (rc == 0)
			rc = rflow_init(&c->f, R_NSLOTS, R_SLOT, R_NSEND, R_SLOT, pn, ps);
		if (rc == 0) {
			rflow_hello_put(hello, R_NSLOTS, R_SLOT);
			rc = rdma_accept(id, &cp) < 0 ? -errno : 0;
		}
		if (rc < 0) {
			rdma_reject(id, NULL, 0);
			teardown(c);
			continue;
		}
		*x = &c->base;
		return 0;
	}
}

/* A device, and leave to pin what connections register (each R_NSLOTS +
 * R_NSEND slots): without it every registration would fail and auto would
 * fall back to TCP peer by peer, saying less. */
static int r_available(char *why, size_t whylen)
{
	char buf[256];
	int n = 0, rc = 0;
	struct ibv_device **v = ibv_get_device_list(&n);
	struct rlimit rl;

	if (!why || !whylen) {
		why = buf;
		whylen = sizeof(buf);
	}
	if (!v || n == 0) {
		snprintf(why, whylen, "no RDMA device (the verbs library lists none)");
		rc = -ENODEV;
	} else if (geteuid() != 0 && getrlimit(RLIMIT_MEMLOCK, &rl) == 0 &&
		   rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < R_MEMLOCK) {
		snprintf(why, whylen, "RDMA device %s, but RLIMIT_MEMLOCK is %llu KiB and each "
			 "connection pins %u MiB: raise it (LimitMEMLOCK=infinity)",
			 ibv_get_device_name(v[0]), (unsigned long long)rl.rlim_cur >> 10,
			 (unsigned)(((R_NSLOTS + R_NSEND) * (uint64_t)R_SLOT) >> 20));
		rc = -ENODEV;
	} else {
		snprintf(why, whylen, "RDMA device %s", ibv_get_device_name(v[0]));
	}
	if (v)
		ibv_free_device_list(v);
	return rc;
}

const struct xport_ops xport_rdma_ops = {
	.name = "rdma",
	.available = r_available,
	.listen = r_listen,
	.accept = r_accept,
	.unlisten = r_unlisten,
	.connect = r_connect,
	.send = r_send,
	.send_tail = r_send_tail,
	.recv = r_recv,
	.recv_last = r_recv_last,
	.set_timeout = r_set_timeout,
	.queued = r_queued,
	.shutdown = r_shutdown,
	.close = r_close,
};
