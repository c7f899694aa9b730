/* daemon/net/xport_tcp.c over real loopback sockets: listen and accept, frames
 * both ways (a 1 MiB tail too), timeouts, a clean close, a shutdown from
 * another thread, the socket options, and the messages of a refused connect
 * and a busy port. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/xport.h"

static const struct xport_ops *T = &xport_tcp_ops;

static uint16_t port_of(int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	assert_int_equal(getsockname(fd, (struct sockaddr *)&ss, &len), 0);
	if (ss.ss_family == AF_INET6)
		return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

static struct xport_listener *listen_at(const char *host, uint16_t *port, int *lfd)
{
	struct xport_listener *l = NULL;
	char why[256] = "";

	assert_int_equal(T->listen(host, 0, &l, lfd, why, sizeof(why)), 0);
	assert_non_null(l);
	*port = port_of(*lfd);
	assert_true(*port > 0);
	return l;
}

static struct host host_of(const char *name, const char *addr, uint16_t port)
{
	return (struct host){ .name = (char *)name, .host = (char *)addr, .port = port };
}

static struct xport *accept_wait(struct xport_listener *l, int lfd)
{
	struct pollfd p = { .fd = lfd, .events = POLLIN };
	struct xport *x = NULL;

	assert_int_equal(poll(&p, 1, 5000), 1);
	assert_int_equal(T->accept(l, &x), 0);
	assert_non_null(x);
	return x;
}

/* A connected pair: *c dialled, *s accepted. */
static void pair(struct xport **c, struct xport **s)
{
	struct xport_listener *l;
	struct host h;
	uint16_t port;
	char why[256] = "", want[64];
	int lfd;

	l = listen_at("127.0.0.1", &port, &lfd);
	h = host_of("b", "127.0.0.1", port);
	assert_int_equal(T->connect(&h, 2000, c, why, sizeof(why)), 0);
	*s = accept_wait(l, lfd);
	T->unlisten(l);
	snprintf(want, sizeof(want), "127.0.0.1:%u", port);
	assert_string_equal((*c)->peer, want);
	assert_memory_equal((*s)->peer, "127.0.0.1:", 10);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void test_accept_eagain(void **state)
{
	struct xport_listener *l;
	struct xport *x = NULL;
	uint16_t port;
	int lfd;

	(void)state;
	l = listen_at("127.0.0.1", &port, &lfd);
	assert_int_equal(T->accept(l, &x), -EAGAIN);
	assert_null(x);
	assert_true(fcntl(lfd, F_GETFL) & O_NONBLOCK);
	assert_true(fcntl(lfd, F_GETFD) & FD_CLOEXEC);
	T->unlisten(l);
	T->unlisten(NULL);
	assert_string_equal(T->name, "tcp");
}

/* The socket of this process with these two ports, found by address, since
 * the transport does not hand out its fds. */
static int fd_by_ports(uint16_t local, uint16_t remote)
{
	for (int fd = 3; fd < 1024; fd++) {
		struct sockaddr_in a, b;
		socklen_t la = sizeof(a), lb = sizeof(b);

		if (getsockname(fd, (struct sockaddr *)&a, &la) == 0 &&
		    getpeername(fd, (struct sockaddr *)&b, &lb) == 0 && a.sin_family == AF_INET &&
		    ntohs(a.sin_port) == local && ntohs(b.sin_port) == remote)
			return fd;
	}
	return -1;
}

static int opt(int fd, int level, int name)
{
	int v = -1;
	socklen_t len = sizeof(v);

	assert_int_equal(getsockopt(fd, level, name, &v, &len), 0);
	return v;
}

static void check_tuned(int fd)
{
	assert_true(fd >= 0);
	assert_false(fcntl(fd, F_GETFL) & O_NONBLOCK);
	assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	assert_int_not_equal(opt(fd, IPPROTO_TCP, TCP_NODELAY), 0);
	assert_int_not_equal(opt(fd, SOL_SOCKET, SO_KEEPALIVE), 0);
	assert_int_equal(opt(fd, IPPROTO_TCP, TCP_KEEPIDLE), 10);
	assert_int_equal(opt(fd, IPPROTO_TCP, TCP_KEEPINTVL), 5);
	assert_int_equal(opt(fd, IPPROTO_TCP, TCP_KEEPCNT), 3);
	assert_int_equal(opt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT), 30000);
}

static void test_connect_accept_options(void **state)
{
	struct xport *c, *s;
	unsigned sport, cport;

	(void)state;
	pair(&c, &s);
	assert_ptr_equal(c->ops, T);
	assert_ptr_equal(s->ops, T);
	assert_int_equal(sscanf(c->peer, "127.0.0.1:%u", &sport), 1);
	assert_int_equal(sscanf(s->peer, "127.0.0.1:%u", &cport), 1);
	check_tuned(fd_by_ports((uint16_t)cport, (uint16_t)sport));
	check_tuned(fd_by_ports((uint16_t)sport, (uint16_t)cport));
	T->close(c);
	T->close(s);
}

struct tail_send {
	struct xport *x;
	const uint8_t *tail;
	size_t n;
	int rc;
};

static void *send_tail_thread(void *arg)
{
	struct tail_send *t = arg;
	struct msg m;

	msg_init(&m, MSG_DATA);
	msg_put_u64(&m, K_FILE, 7);
	msg_put_u64(&m, K_OFFSET, 1u << 20);
	t->rc = t->x->ops->send_tail(t->x, &m, K_DATA, t->tail, t->n);
	msg_free(&m);
	return NULL;
}

static void test_frames_both_ways(void **state)
{
	struct xport *c, *s;
	struct msg m, r;
	struct tail_send t;
	pthread_t th;
	const uint8_t *p;
	uint8_t *big;
	uint64_t v;
	size_t n;
	char *str;

	(void)state;
	pair(&c, &s);
	msg_init(&m, MSG_OFFER);
	msg_put_str(&m, K_ORIGIN, "a");
	msg_put_u64(&m, K_SIZE, 12345);
	assert_int_equal(c->ops->send(c, &m), 0);
	msg_free(&m);
	assert_int_equal(s->ops->recv(s, &r), 0);
	assert_int_equal(r.type, MSG_OFFER);
	assert_int_equal(msg_get_str(&r, K_ORIGIN, &str), 0);
	assert_string_equal(str, "a");
	free(str);
	assert_int_equal(msg_get_u64(&r, K_SIZE, &v), 0);
	assert_int_equal(v, 12345);
	msg_free(&r);

	msg_init(&m, MSG_END);  /* no fields at all */
	assert_int_equal(s->ops->send(s, &m), 0);
	msg_free(&m);
	assert_int_equal(c->ops->recv(c, &r), 0);
	assert_int_equal(r.type, MSG_END);
	assert_int_equal(r.len, 0);
	msg_free(&r);

	/* 1 MiB is more than the socket buffers hold: the sender blocks until
	 * the receiver reads, so it runs on its own thread. */
	n = 1u << 20;
	big = malloc(n);
	assert_non_null(big);
	for (size_t i = 0; i < n; i++)
		big[i] = (uint8_t)(i * 131 + (i >> 13));
	t = (struct tail_send){ .x = s, .tail = big, .n = n };
	assert_int_equal(pthread_create(&th, NULL, send_tail_thread, &t), 0);
	assert_int_equal(c->ops->recv(c, &r), 0);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(t.rc, 0);
	assert_int_equal(r.type, MSG_DATA);
	assert_int_equal(msg_get_u64(&r, K_FILE, &v), 0);
	assert_int_equal(v, 7);
	assert_int_equal(msg_get_u64(&r, K_OFFSET, &v), 0);
	assert_int_equal(v, 1u << 20);
	assert_int_equal(msg_get_bytes(&r, K_DATA, &p, &n), 0);
	assert_int_equal(n, 1u << 20);
	assert_memory_equal(p, big, n);
	msg_free(&r);

	/* Too big is refused before a byte moves: the connection lives on. */
	msg_init(&m, MSG_DATA);
	msg_put_u64(&m, K_FILE, 1);
	assert_int_equal(s->ops->send_tail(s, &m, K_DATA, big, PROTO_MAX_PAYLOAD), -E2BIG);
	assert_int_equal(s->ops->send_tail(s, &m, K_DATA, big, 16), 0);
	msg_free(&m);
	assert_int_equal(c->ops->recv(c, &r), 0);
	assert_int_equal(msg_get_bytes(&r, K_DATA, &p, &n), 0);
	assert_int_equal(n, 16);
	assert_memory_equal(p, big, 16);
	msg_free(&r);

	free(big);
	T->close(c);
	T->close(s);
}

static void test_recv_timeout(void **state)
{
	struct xport *c, *s;
	struct msg r;
	int64_t t0, dt;

	(void)state;
	pair(&c, &s);
	assert_int_equal(s->ops->set_timeout(s, -1), -EINVAL);
	assert_int_equal(s->ops->set_timeout(s, 200), 0);
	t0 = now_ms();
	assert_int_equal(s->ops->recv(s, &r), -ETIMEDOUT);
	dt = now_ms() - t0;
	assert_true(dt >= 150 && dt < 3000);
	assert_null(r.buf);
	msg_free(&r);
	/* A timeout may leave a frame half-read: the connection stays failed. */
	t0 = now_ms();
	assert_int_equal(s->ops->recv(s, &r), -ETIMEDOUT);
	assert_true(now_ms() - t0 < 100);
	msg_free(&r);
	T->close(c);
	T->close(s);
}

static void test_clean_close(void **state)
{
	struct xport *c, *s;
	struct msg m, r;

	(void)state;
	pair(&c, &s);
	msg_init(&m, MSG_END);
	assert_int_equal(c->ops->send(c, &m), 0);
	msg_free(&m);
	T->close(c);
	assert_int_equal(s->ops->recv(s, &r), 0);
	assert_int_equal(r.type, MSG_END);
	msg_free(&r);
	assert_int_equal(s->ops->recv(s, &r), -ENOTCONN);
	msg_free(&r);
	T->close(s);
}

struct blocked {
	struct xport *x;
	int rc;
};

static void *recv_thread(void *arg)
{
	struct blocked *b = arg;
	struct msg r;

	b->rc = b->x->ops->recv(b->x, &r);
	msg_free(&r);
	return NULL;
}

static void test_shutdown_unblocks(void **state)
{
	struct xport *c, *s;
	struct blocked b;
	struct msg m;
	pthread_t th;
	int64_t t0;

	(void)state;
	pair(&c, &s);
	b = (struct blocked){ .x = s, .rc = 1 };
	assert_int_equal(s->ops->set_timeout(s, 0), 0);
	assert_int_equal(pthread_create(&th, NULL, recv_thread, &b), 0);
	usleep(100 * 1000);
	t0 = now_ms();
	s->ops->shutdown(s);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_true(now_ms() - t0 < 2000);
	assert_int_equal(b.rc, -ESHUTDOWN);
	msg_init(&m, MSG_END);
	assert_int_equal(s->ops->send(s, &m), -ESHUTDOWN);
	/* The other end sees the connection end. */
	assert_int_equal(c->ops->set_timeout(c, 2000), 0);
	b = (struct blocked){ .x = c, .rc = 1 };
	recv_thread(&b);
	assert_int_equal(b.rc, -ENOTCONN);
	msg_free(&m);
	T->close(c);
	T->close(s);
}

static void test_connect_refused(void **state)
{
	struct xport_listener *l;
	struct xport *x = NULL;
	struct host h;
	uint16_t port;
	char why[256] = "", want[128];
	int lfd;

	(void)state;
	l = listen_at("127.0.0.1", &port, &lfd);
	T->unlisten(l);   /* nobody listens there now */
	h = host_of("gone", "127.0.0.1", port);
	assert_int_equal(T->connect(&h, 2000, &x, why, sizeof(why)), -ECONNREFUSED);
	assert_null(x);
	snprintf(want, sizeof(want), "node gone (127.0.0.1:%u): connection refused", port);
	assert_string_equal(why, want);
}

static void test_listen_busy(void **state)
{
	struct xport_listener *l, *l2 = NULL;
	uint16_t port;
	char why[256] = "", want[64];
	int lfd, fd2 = -1;

	(void)state;
	l = listen_at("127.0.0.1", &port, &lfd);
	assert_int_equal(T->listen("127.0.0.1", port, &l2, &fd2, why, sizeof(why)), -EADDRINUSE);
	assert_null(l2);
	snprintf(want, sizeof(want), "listen 127.0.0.1:%u: ", port);
	assert_memory_equal(why, want, strlen(want));
	assert_non_null(strstr(why, "in use"));
	T->unlisten(l);
	/* And once it is free again, at once (SO_REUSEADDR). */
	assert_int_equal(T->listen("127.0.0.1", port, &l2, &fd2, why, sizeof(why)), 0);
	T->unlisten(l2);
}

static void test_ipv6(void **state)
{
	struct xport_listener *l = NULL;
	struct xport *c, *s;
	struct host h;
	struct msg m, r;
	char why[256] = "", want[64];
	int lfd;
	uint16_t port;

	(void)state;
	if (T->listen("::1", 0, &l, &lfd, why, sizeof(why)) != 0)
		skip();     /* no IPv6 loopback here */
	port = port_of(lfd);
	h = host_of("six", "::1", port);
	assert_int_equal(T->connect(&h, 2000, &c, why, sizeof(why)), 0);
	s = accept_wait(l, lfd);
	T->unlisten(l);
	snprintf(want, sizeof(want), "[::1]:%u", port);
	assert_string_equal(c->peer, want);
	assert_memory_equal(s->peer, "[::1]:", 6);
	msg_init(&m, MSG_END);
	assert_int_equal(c->ops->send(c, &m), 0);
	msg_free(&m);
	assert_int_equal(s->ops->recv(s, &r), 0);
	assert_int_equal(r.type, MSG_END);
	msg_free(&r);
	T->close(c);
	T->close(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_accept_eagain),
		cmocka_unit_test(test_connect_accept_options),
		cmocka_unit_test(test_frames_both_ways),
		cmocka_unit_test(test_recv_timeout),
		cmocka_unit_test(test_clean_close),
		cmocka_unit_test(test_shutdown_unblocks),
		cmocka_unit_test(test_connect_refused),
		cmocka_unit_test(test_listen_busy),
		cmocka_unit_test(test_ipv6),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
