/* The TCP transport: frames of common/proto.h on a stream socket. */
#include "common/clock.h"
#include "common/xport.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <unistd.h>

#define LISTEN_BACKLOG 64
/* A peer that vanishes (power cut, cable pulled) sends no FIN: keepalive
 * notices an idle dead link in ~25 s, and the user timeout bounds how long
 * unacknowledged data may sit, so a blocked send cannot hang forever. */
#define KEEPIDLE_S 10
#define KEEPINTVL_S 5
#define KEEPCNT 3
#define USER_TIMEOUT_MS 30000

struct xport_listener {
	int fd;
};

struct tcp_conn {
	struct xport base;
	int fd;
	/* Set by shutdown from any thread: the owner's failure is then -ESHUTDOWN,
	 * not whatever the torn-down socket happened to say. */
	atomic_bool shut;
	/* A failed send or recv may have left a frame half-moved, so the stream
	 * is out of step for good: later calls repeat the first error. */
	int dead;
	bool dead_in;            /* a recv failed: the inbound stream too */
	int timeout_ms;          /* a whole frame in must arrive within it; 0: none */
};

/* strerror without the capital, to sit inside "...: reason". */
static const char *reason(int err, char *buf, size_t len)
{
	snprintf(buf, len, "%s", strerror(err));
	if (buf[0] >= 'A' && buf[0] <= 'Z' && !(buf[1] >= 'A' && buf[1] <= 'Z'))
		buf[0] = (char)(buf[0] - 'A' + 'a');
	return buf;
}

/* "HOST:PORT", with an IPv6 address in brackets so the port stays apart. */
static void fmt_hostport(char *out, size_t len, const char *host, unsigned port)
{
	if (strchr(host, ':'))
		snprintf(out, len, "[%s]:%u", host, port);
	else
		snprintf(out, len, "%s:%u", host, port);
}

static void fmt_sockaddr(char *out, size_t len, const struct sockaddr_storage *ss)
{
	const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
	const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
	char addr[INET6_ADDRSTRLEN] = "?";
	bool v4 = ss->ss_family == AF_INET;

	if (v4)
		inet_ntop(AF_INET, &s4->sin_addr, addr, sizeof(addr));
	/* A dual-stack listener sees IPv4 peers as ::ffff:a.b.c.d; the hosts
	 * file and the logs know them as a.b.c.d. */
	else if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr))
		inet_ntop(AF_INET, &s6->sin6_addr.s6_addr[12], addr, sizeof(addr));
	else
		inet_ntop(AF_INET6, &s6->sin6_addr, addr, sizeof(addr));
	fmt_hostport(out, len, addr, ntohs(v4 ? s4->sin_port : s6->sin6_port));
}

/* getaddrinfo, its failures as -errno and a reason in msg. */
static int resolve(const char *host, uint16_t port, int flags, struct addrinfo **res, char *msg,
		   size_t len)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = flags | AI_NUMERICSERV };
	char serv[8];
	int gai, rc;

	snprintf(serv, sizeof(serv), "%u", (unsigned)port);
	gai = getaddrinfo(host, serv, &hints, res);
	if (!gai)
		return 0;
	rc = gai == EAI_MEMORY ? -ENOMEM : gai == EAI_SYSTEM && errno ? -errno : -EHOSTUNREACH;
	if (gai == EAI_SYSTEM)
		reason(-rc, msg, len);
	else
		snprintf(msg, len, "%s", gai_strerror(gai));
	return rc;
}

static int set_int(int fd, int level, int opt, int v)
{
	return setsockopt(fd, level, opt, &v, sizeof(v)) < 0 ? -errno : 0;
}

static int tune_conn(int fd)
{
	int rc;

	if ((rc = set_int(fd, IPPROTO_TCP, TCP_NODELAY, 1)) ||
	    (rc = set_int(fd, SOL_SOCKET, SO_KEEPALIVE, 1)) ||
	    (rc = set_int(fd, IPPROTO_TCP, TCP_KEEPIDLE, KEEPIDLE_S)) ||
	    (rc = set_int(fd, IPPROTO_TCP, TCP_KEEPINTVL, KEEPINTVL_S)) ||
	    (rc = set_int(fd, IPPROTO_TCP, TCP_KEEPCNT, KEEPCNT)) ||
	    (rc = set_int(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, USER_TIMEOUT_MS)))
		return rc;
	return 0;
}

/* Takes ownership of fd, a blocking connected socket, on success. */
static int conn_new(int fd, const struct sockaddr_storage *ss, struct xport **x)
{
	struct tcp_conn *c;
	int rc = tune_conn(fd);

	if (rc)
		return rc;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->base.ops = &xport_tcp_ops;
	fmt_sockaddr(c->base.peer, sizeof(c->base.peer), ss);
	c->fd = fd;
	atomic_init(&c->shut, false);
	*x = &c->base;
	return 0;
}

static int tcp_listen(const char *host, uint16_t port, struct xport_listener **l, int *out_fd,
		      char *why, size_t whylen)
{
	struct addrinfo *res, *ai;
	struct xport_listener *lis;
	char where[300], msg[128];
	int fd = -1, rc;

	if (host && !*host)
		host = NULL;
	fmt_hostport(where, sizeof(where), host ? host : "*", port);
	lis = malloc(sizeof(*lis));
	if (!lis) {
		rc = -ENOMEM;
		reason(ENOMEM, msg, sizeof(msg));
		goto out_why;
	}
	rc = resolve(host, port, AI_PASSIVE, &res, msg, sizeof(msg));
	if (rc)
		goto out_free_lis;
	rc = -EADDRNOTAVAIL;
	for (ai = res; ai && fd < 0; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
			    ai->ai_protocol);
		if (fd < 0) {
			rc = -errno;
			continue;
		}
		/* A restarted daemon rebinds at once, despite old TIME_WAIT peers. */
		rc = set_int(fd, SOL_SOCKET, SO_REUSEADDR, 1);
		if (!rc && (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 ||
			    listen(fd, LISTEN_BACKLOG) < 0))
			rc = -errno;
		if (rc) {
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(res);
	if (fd < 0) {
		reason(-rc, msg, sizeof(msg));
		goto out_free_lis;
	}
	lis->fd = fd;
	*l = lis;
	*out_fd = fd;
	return 0;
out_free_lis:
	free(lis);
out_why:
	snprintf(why, whylen, "listen %s: %s", where, msg);
	return rc;
}

static int tcp_accept(struct xport_listener *l, struct xport **x)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int fd, rc;

	for (;;) {
		len = sizeof(ss);
		/* No SOCK_NONBLOCK: frames are read whole, so the socket blocks. */
		fd = accept4(l->fd, (struct sockaddr *)&ss, &len, SOCK_CLOEXEC);
		if (fd >= 0)
			break;
		rc = errno;
		if (rc == EAGAIN || rc == EWOULDBLOCK)
			return -EAGAIN;
		/* That one connection died while queued; others may wait behind it. */
		if (rc == EINTR || rc == ECONNABORTED || rc == EPROTO)
			continue;
		return -rc;
	}
	rc = conn_new(fd, &ss, x);
	if (rc)
		close(fd);
	return rc;
}

static void tcp_unlisten(struct xport_listener *l)
{
	if (!l)
		return;
	close(l->fd);
	free(l);
}

/* One address: 0 and a blocking connected fd, or -errno. */
static int connect_one(const struct addrinfo *ai, int64_t deadline, int *out)
{
	struct pollfd pfd;
	socklen_t len = sizeof(int);
	int fd, rc, err = 0, flags;

	fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
	if (fd < 0)
		return -errno;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		if (errno != EINPROGRESS) {
			rc = -errno;
			goto out_close_fd;
		}
		pfd = (struct pollfd){ .fd = fd, .events = POLLOUT };
		for (;;) {
			int64_t left = deadline < 0 ? -1 : deadline - mono_ms();

			if (deadline >= 0 && left <= 0) {
				rc = -ETIMEDOUT;
				goto out_close_fd;
			}
			rc = poll(&pfd, 1, left > INT32_MAX ? INT32_MAX : (int)left);
			if (rc > 0)
				break;
			if (rc < 0 && errno != EINTR) {
				rc = -errno;
				goto out_close_fd;
			}
		}
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
			err = errno;
		if (err) {
			rc = -err;
			goto out_close_fd;
		}
	}
	flags = fcntl(fd, F_GETFL);
	if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
		rc = -errno;
		goto out_close_fd;
	}
	*out = fd;
	return 0;
out_close_fd:
	close(fd);
	return rc;
}

static int tcp_connect(const struct host *h, int timeout_ms, struct xport **x, char *why,
		       size_t whylen)
{
	struct addrinfo *res, *ai;
	struct sockaddr_storage ss;
	char where[300], msg[128];
	int64_t deadline = timeout_ms > 0 ? mono_ms() + timeout_ms : -1;
	int fd = -1, rc;

	fmt_hostport(where, sizeof(where), h->host, h->port);
	rc = resolve(h->host, h->port, 0, &res, msg, sizeof(msg));
	if (rc)
		goto out_why;
	rc = -EHOSTUNREACH;
	/* Each address in turn within the one deadline: a name may resolve to
	 * an IPv6 address the node does not listen on, then its IPv4 one. */
	for (ai = res; ai && rc && rc != -ETIMEDOUT; ai = ai->ai_next) {
		rc = connect_one(ai, deadline, &fd);
		if (!rc)
			memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
	}
	freeaddrinfo(res);
	if (rc) {
		if (rc == -ETIMEDOUT && timeout_ms > 0)
			snprintf(msg, sizeof(msg), "no answer within %d ms", timeout_ms);
		else
			reason(-rc, msg, sizeof(msg));
		goto out_why;
	}
	rc = conn_new(fd, &ss, x);
	if (rc) {
		reason(-rc, msg, sizeof(msg));
		goto out_close_fd;
	}
	return 0;
out_close_fd:
	close(fd);
out_why:
	snprintf(why, whylen, "node %s (%s): %s", h->name, where, msg);
	return rc;
}

/* The error a failed send or recv reports, remembered for the next call. */
static int io_failed(struct tcp_conn *c, int rc)
{
	if (atomic_load(&c->shut))
		rc = -ESHUTDOWN;
	else if (rc == -EAGAIN || rc == -EWOULDBLOCK)
		rc = -ETIMEDOUT;    /* SO_RCVTIMEO / SO_SNDTIMEO ran out */
	c->dead = rc;
	return rc;
}

static int io_check(struct tcp_conn *c)
{
	if (atomic_load(&c->shut))
		return -ESHUTDOWN;
	return c->dead;
}

static int tcp_send_tail(struct xport *x, const struct msg *m, uint16_t key, const void *tail,
			 size_t n)
{
	struct tcp_conn *c = (struct tcp_conn *)x;
	int rc = io_check(c);

	if (rc)
		return rc;
	/* Refused before a byte moves: the stream is still in step. */
	if (m->err)
		return m->err;
	if (m->len + (tail ? PROTO_FIELD_HDR_LEN + n : 0) > PROTO_MAX_PAYLOAD)
		return -E2BIG;
	rc = msg_send_tail(c->fd, m, key, tail, n);
	return rc ? io_failed(c, rc) : 0;
}

static int tcp_send(struct xport *x, const struct msg *m)
{
	return tcp_send_tail(x, m, 0, NULL, 0);
}

/* A frame read against one deadline: the timeout is for the whole frame,
 * not for each read, or a peer sending a byte now and then would hold the
 * connection (and its thread) as long as it liked. */
struct deadline_reader {
	int fd;
	int64_t end;            /* monotonic ms */
	bool any;               /* a byte of the frame came */
};

static int read_by(void *ctx, uint8_t *p, size_t n)
{
	struct deadline_reader *d = ctx;

	while (n) {
		struct pollfd pfd = { .fd = d->fd, .events = POLLIN };
		int64_t left = d->end - mono_ms();
		ssize_t r;

		if (left <= 0)
			return -ETIMEDOUT;
		r = poll(&pfd, 1, (int)left);
		if (r < 0 && errno != EINTR)
			return -errno;
		if (r <= 0)
			continue;
		r = recv(d->fd, p, n, MSG_DONTWAIT);
		if (r == 0)
			return d->any ? -ECONNRESET : -ENOTCONN;
		if (r < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return -errno;
		}
		d->any = true;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

static int tcp_recv(struct xport *x, struct msg *m)
{
	struct tcp_conn *c = (struct tcp_conn *)x;
	int rc = io_check(c);

	if (rc) {
		memset(m, 0, sizeof(*m));
		return rc;
	}
	if (c->timeout_ms) {
		struct deadline_reader d = { .fd = c->fd, .end = mono_ms() + c->timeout_ms };

		rc = msg_recv_from(m, read_by, &d);
	} else {
		rc = msg_recv(c->fd, m);
	}
	if (rc)
		c->dead_in = true;
	return rc ? io_failed(c, rc) : 0;
}

static int tcp_set_timeout(struct xport *x, int timeout_ms)
{
	struct tcp_conn *c = (struct tcp_conn *)x;
	struct timeval tv;

	if (timeout_ms < 0)
		return -EINVAL;
	c->timeout_ms = timeout_ms;
	tv.tv_sec = timeout_ms / 1000;
	tv.tv_usec = (timeout_ms % 1000) * 1000;
	if (setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
	    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0)
		return -errno;
	return 0;
}

static int tcp_recv_last(struct xport *x, struct msg *m, int timeout_ms)
{
	struct tcp_conn *c = (struct tcp_conn *)x;
	struct pollfd pfd = { .fd = c->fd, .events = POLLIN };
	int rc;

	memset(m, 0, sizeof(*m));
	if (atomic_load(&c->shut) || c->dead_in)
		return -ENOTCONN;
	/* Whatever arrived before the peer's reset is still queued here. */
	if (poll(&pfd, 1, timeout_ms) <= 0)
		return -ETIMEDOUT;
	tcp_set_timeout(x, timeout_ms);     /* a frame cut short waits no longer */
	rc = msg_recv(c->fd, m);
	if (rc)
		c->dead_in = true;
	return rc;
}

static bool tcp_ready(struct xport *x)
{
	struct tcp_conn *c = (struct tcp_conn *)x;
	struct pollfd pfd = { .fd = c->fd, .events = POLLIN };

	return poll(&pfd, 1, 0) > 0;
}

static uint64_t tcp_queued(struct xport *x)
{
	struct tcp_conn *c = (struct tcp_conn *)x;
	int n = 0;

	return ioctl(c->fd, SIOCOUTQ, &n) == 0 && n > 0 ? (uint64_t)n : 0;
}

static void tcp_shutdown(struct xport *x)
{
	struct tcp_conn *c = (struct tcp_conn *)x;

	atomic_store(&c->shut, true);
	shutdown(c->fd, SHUT_RDWR);
}

static void tcp_close(struct xport *x)
{
	struct tcp_conn *c = (struct tcp_conn *)x;

	if (!c)
		return;
	close(c->fd);
	free(c);
}

const struct xport_ops xport_tcp_ops = {
	.name = "tcp",
	.listen = tcp_listen,
	.accept = tcp_accept,
	.unlisten = tcp_unlisten,
	.connect = tcp_connect,
	.send = tcp_send,
	.send_tail = tcp_send_tail,
	.recv = tcp_recv,
	.recv_last = tcp_recv_last,
	.ready = tcp_ready,
	.set_timeout = tcp_set_timeout,
	.queued = tcp_queued,
	.shutdown = tcp_shutdown,
	.close = tcp_close,
};
