/* daemon/net/peer.c: the handshake over real loopback TCP, the responder on a
 * thread. Both sides succeed with one key and learn each other's names; a
 * wrong key, a name outside the hosts file, the wrong node answering, a
 * frame out of order, garbage and silence each fail as peer.h says, with a
 * message that names the cause. */
#include <errno.h>
#include <netinet/in.h>
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
#include <arpa/inet.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/net/peer.h"

#define SECRET "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define OTHER  "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
#define HOSTS_TEXT "a 127.0.0.1:7001\nb 127.0.0.1:7002 domain=r1\n"
#define TIMEOUT 3000

static const struct xport_ops *T = &xport_tcp_ops;
static struct auth_key key, other;
static struct hosts hosts;

static int setup(void **state)
{
	(void)state;
	if (auth_key_derive(&key, SECRET, strlen(SECRET), NULL, 0) ||
	    auth_key_derive(&other, OTHER, strlen(OTHER), NULL, 0))
		return -1;
	return hosts_parse(&hosts, HOSTS_TEXT, strlen(HOSTS_TEXT), NULL, NULL, 0);
}

static int teardown(void **state)
{
	(void)state;
	hosts_free(&hosts);
	auth_key_free(&other);
	auth_key_free(&key);
	return 0;
}

/* The listening side, and its port for raw clients. */
static struct xport_listener *lis;
static int lfd;
static uint16_t lport;

static void listen_lo(void)
{
	struct sockaddr_in sa;
	socklen_t len = sizeof(sa);
	char why[256] = "";

	assert_int_equal(T->listen("127.0.0.1", 0, &lis, &lfd, why, sizeof(why)), 0);
	assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &len), 0);
	lport = ntohs(sa.sin_port);
}

static struct xport *accept_one(void)
{
	struct pollfd p = { .fd = lfd, .events = POLLIN };
	struct xport *x = NULL;

	assert_int_equal(poll(&p, 1, 5000), 1);
	assert_int_equal(T->accept(lis, &x), 0);
	return x;
}

static struct xport *dial(void)
{
	struct host h = { .name = (char *)"b", .host = (char *)"127.0.0.1", .port = lport };
	struct xport *x = NULL;
	char why[256] = "";

	assert_int_equal(T->connect(&h, 2000, &x, why, sizeof(why)), 0);
	return x;
}

/* A connected pair: *c dialled, *s accepted. */
static void pair(struct xport **c, struct xport **s)
{
	listen_lo();
	*c = dial();
	*s = accept_one();
	T->unlisten(lis);
}

/* One side of a handshake, run on a thread (no cmocka asserts there). */
struct side {
	struct xport *x;
	const struct auth_key *key;
	const char *me, *expect;
	int wire;               /* 0: authenticated */
	int timeout_ms;
	int rc;
	char name[AUTH_NAME_MAX + 1];
	char why[512];
};

static void run_side(struct side *s)
{
	s->rc = peer_handshake(&s->x, s->key, s->wire ? s->wire : SEAL_AUTHENTICATED, s->me, &hosts, s->expect, s->timeout_ms, s->name,
			       sizeof(s->name), s->why, sizeof(s->why));
}

static void *side_thread(void *arg)
{
	run_side(arg);
	return NULL;
}

/* Initiator ini and responder resp over a fresh pair, both run to the end. */
static void handshake(struct side *ini, struct side *resp)
{
	pthread_t th;

	pair(&ini->x, &resp->x);
	assert_int_equal(pthread_create(&th, NULL, side_thread, resp), 0);
	run_side(ini);
	assert_int_equal(pthread_join(th, NULL), 0);
}

/* The next frame on x is the MSG_ERROR the other side sent on its way out. */
static void expect_error_frame(struct xport *x, int err, const char *text)
{
	struct msg m;
	uint64_t e;
	char *s;

	assert_int_equal(x->ops->recv(x, &m), 0);
	assert_int_equal(m.type, MSG_ERROR);
	assert_int_equal(msg_get_u64(&m, K_ERRNO, &e), 0);
	assert_int_equal(e, (uint64_t)err);
	assert_int_equal(msg_get_str(&m, K_TEXT, &s), 0);
	assert_non_null(strstr(s, text));
	free(s);
	msg_free(&m);
}

static void close_both(struct side *a, struct side *b)
{
	a->x->ops->close(a->x);     /* sealed or not: its own table */
	b->x->ops->close(b->x);
}

static void test_same_key(void **state)
{
	struct side ini = { .key = &key, .me = "a", .expect = "b", .timeout_ms = TIMEOUT };
	struct side resp = { .key = &key, .me = "b", .timeout_ms = TIMEOUT };
	struct msg m;

	(void)state;
	handshake(&ini, &resp);
	assert_int_equal(ini.rc, 0);
	assert_int_equal(resp.rc, 0);
	assert_string_equal(ini.name, "b");
	assert_string_equal(resp.name, "a");
	/* The connection then carries the caller's frames. */
	msg_init(&m, MSG_END);
	assert_int_equal(ini.x->ops->send(ini.x, &m), 0);
	msg_free(&m);
	assert_int_equal(resp.x->ops->recv(resp.x, &m), 0);
	assert_int_equal(m.type, MSG_END);
	msg_free(&m);
	close_both(&ini, &resp);
}

/* Each side's [cluster] wire: any mix connects, frames pass both ways, and
 * the connection is encrypted when either side asked for it (a frame
 * sealed for the other wire would fail: test_seal's test_wires_differ). */
static void test_wires(void **state)
{
	static const int ask[3][2] = {
		{ SEAL_AUTHENTICATED, SEAL_AUTHENTICATED },
		{ SEAL_AUTHENTICATED, SEAL_ENCRYPTED },
		{ SEAL_ENCRYPTED, SEAL_AUTHENTICATED },
	};

	(void)state;
	for (int c = 0; c < 3; c++) {
		struct side ini = { .key = &key, .me = "a", .expect = "b", .wire = ask[c][0],
				    .timeout_ms = TIMEOUT };
		struct side resp = { .key = &key, .me = "b", .wire = ask[c][1],
				     .timeout_ms = TIMEOUT };
		struct msg m;
		char *job;

		handshake(&ini, &resp);
		assert_int_equal(ini.rc, 0);
		assert_int_equal(resp.rc, 0);
		msg_init(&m, MSG_OFFER);
		msg_put_str(&m, K_JOB, "job1");
		assert_int_equal(ini.x->ops->send(ini.x, &m), 0);
		msg_free(&m);
		assert_int_equal(resp.x->ops->recv(resp.x, &m), 0);
		assert_int_equal(msg_get_str(&m, K_JOB, &job), 0);
		assert_string_equal(job, "job1");
		free(job);
		msg_free(&m);
		msg_init(&m, MSG_END);
		assert_int_equal(resp.x->ops->send(resp.x, &m), 0);
		msg_free(&m);
		assert_int_equal(ini.x->ops->recv(ini.x, &m), 0);
		assert_int_equal(m.type, MSG_END);
		msg_free(&m);
		close_both(&ini, &resp);
	}
}

static void test_wrong_key(void **state)
{
	struct side ini = { .key = &other, .me = "a", .expect = "b", .timeout_ms = TIMEOUT };
	struct side resp = { .key = &key, .me = "b", .timeout_ms = TIMEOUT };
	char want[256];

	(void)state;
	handshake(&ini, &resp);
	assert_int_equal(resp.rc, -EACCES);
	snprintf(want, sizeof(want), "peer %s: authentication failed: it holds another cluster "
		 "key than this node; copy the same key_file to every node", resp.x->peer);
	assert_string_equal(resp.why, want);
	assert_int_equal(ini.rc, -EACCES);
	snprintf(want, sizeof(want), "peer b (%s) refused us: authentication failed: the two "
		 "nodes hold different cluster keys; copy the same key_file to every node and "
		 "restart staged", ini.x->peer);
	assert_string_equal(ini.why, want);
	assert_null(strstr(ini.why, SECRET));
	close_both(&ini, &resp);
}

/* The responder learns the proven name only once it has sent its PROOF, so
 * the initiator's handshake completes and the refusal is its next frame. */
static void test_name_not_in_hosts(void **state)
{
	struct side ini = { .key = &key, .me = "z", .expect = "b", .timeout_ms = TIMEOUT };
	struct side resp = { .key = &key, .me = "b", .timeout_ms = TIMEOUT };
	char want[256];

	(void)state;
	handshake(&ini, &resp);
	assert_int_equal(resp.rc, -EACCES);
	snprintf(want, sizeof(want), "peer %s claims node z, which is not in the hosts file",
		 resp.x->peer);
	assert_string_equal(resp.why, want);
	assert_int_equal(ini.rc, 0);
	expect_error_frame(ini.x, EACCES, "node z is not in the hosts file");
	close_both(&ini, &resp);
}

static void test_unexpected_name(void **state)
{
	struct side ini = { .key = &key, .me = "b", .expect = "c", .timeout_ms = TIMEOUT };
	struct side resp = { .key = &key, .me = "a", .timeout_ms = TIMEOUT };

	(void)state;
	handshake(&ini, &resp);
	assert_int_equal(ini.rc, -EACCES);
	assert_non_null(strstr(ini.why, "answered as node a"));
	assert_string_equal(ini.name, "");
	assert_int_equal(resp.rc, 0);
	expect_error_frame(resp.x, EACCES, "dialled node c and reached node a");
	close_both(&ini, &resp);
}

static void test_wrong_frame_first(void **state)
{
	struct side ini = { .key = &key, .me = "a", .expect = "b", .timeout_ms = TIMEOUT };
	struct side resp = { .key = &key, .me = "b", .timeout_ms = TIMEOUT };
	struct msg m;
	pthread_t th;

	(void)state;
	/* A PROOF where the HELLO belongs, to the responder. */
	pair(&ini.x, &resp.x);
	assert_int_equal(pthread_create(&th, NULL, side_thread, &resp), 0);
	msg_init(&m, MSG_PEER_PROOF);
	msg_put_bytes(&m, K_AUTH, "0123456789abcdef0123456789abcdef0123", 36);
	assert_int_equal(ini.x->ops->send(ini.x, &m), 0);
	msg_free(&m);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(resp.rc, -EBADMSG);
	assert_non_null(strstr(resp.why, "frame type 33 where the handshake expects HELLO"));
	close_both(&ini, &resp);

	/* A status request where the initiator awaits the responder's HELLO. */
	pair(&ini.x, &resp.x);
	assert_int_equal(pthread_create(&th, NULL, side_thread, &ini), 0);
	assert_int_equal(resp.x->ops->recv(resp.x, &m), 0);
	assert_int_equal(m.type, MSG_PEER_HELLO);
	msg_free(&m);
	msg_init(&m, MSG_STATUS_REQ);
	assert_int_equal(resp.x->ops->send(resp.x, &m), 0);
	msg_free(&m);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(ini.rc, -EBADMSG);

	/* A HELLO frame whose bytes are not a HELLO. */
	close_both(&ini, &resp);
	pair(&ini.x, &resp.x);
	assert_int_equal(pthread_create(&th, NULL, side_thread, &resp), 0);
	msg_init(&m, MSG_PEER_HELLO);
	msg_put_bytes(&m, K_AUTH, "nonsense", 8);
	assert_int_equal(ini.x->ops->send(ini.x, &m), 0);
	msg_free(&m);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(resp.rc, -EBADMSG);
	assert_non_null(strstr(resp.why, "sent a HELLO this staged cannot read"));
	close_both(&ini, &resp);
}

static void test_garbage(void **state)
{
	struct side resp = { .key = &key, .me = "b", .timeout_ms = TIMEOUT };
	static const char junk[] = "GET / HTTP/1.1\r\nHost: b\r\n\r\n";
	struct sockaddr_in sa = { .sin_family = AF_INET };
	pthread_t th;
	int fd;

	(void)state;
	listen_lo();
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	sa.sin_port = htons(lport);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	resp.x = accept_one();
	T->unlisten(lis);
	assert_int_equal(pthread_create(&th, NULL, side_thread, &resp), 0);
	assert_int_equal(write(fd, junk, sizeof(junk) - 1), (ssize_t)sizeof(junk) - 1);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(resp.rc, -EBADMSG);
	assert_non_null(strstr(resp.why, "malformed frame"));
	resp.x->ops->close(resp.x);
	close(fd);
}

static void test_silent_peer(void **state)
{
	struct side ini = { .key = &key, .me = "a", .expect = "b", .timeout_ms = 200 };
	struct side resp = { .key = &key, .me = "b", .timeout_ms = 200 };
	struct msg m;

	(void)state;
	pair(&ini.x, &resp.x);
	run_side(&resp);       /* nobody says HELLO */
	assert_int_equal(resp.rc, -ETIMEDOUT);
	assert_non_null(strstr(resp.why, "no answer within 200 ms"));
	close_both(&ini, &resp);

	pair(&ini.x, &resp.x);
	run_side(&ini);        /* nobody answers our HELLO */
	assert_int_equal(ini.rc, -ETIMEDOUT);
	assert_non_null(strstr(ini.why, "peer b ("));
	assert_int_equal(resp.x->ops->recv(resp.x, &m), 0);
	assert_int_equal(m.type, MSG_PEER_HELLO);
	msg_free(&m);
	close_both(&ini, &resp);
}

/* A MSG_ERROR other than EACCES passes its errno through, and its text is
 * made safe to print. */
static void test_peer_error(void **state)
{
	struct side ini = { .key = &key, .me = "a", .expect = "b", .timeout_ms = TIMEOUT };
	struct xport *resp;
	struct msg m;
	pthread_t th;

	(void)state;
	pair(&ini.x, &resp);
	assert_int_equal(pthread_create(&th, NULL, side_thread, &ini), 0);
	assert_int_equal(resp->ops->recv(resp, &m), 0);
	msg_free(&m);
	peer_send_error(resp, -EBUSY, "too busy\n\x1b[31mred");
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(ini.rc, -EBUSY);
	assert_non_null(strstr(ini.why, "refused us: too busy??[31mred"));
	ini.x->ops->close(ini.x);
	T->close(resp);
}

static void test_closed_mid_handshake(void **state)
{
	struct side resp = { .key = &key, .me = "b", .timeout_ms = TIMEOUT };
	struct xport *c;

	(void)state;
	pair(&c, &resp.x);
	T->close(c);
	run_side(&resp);
	assert_int_equal(resp.rc, -ENOTCONN);
	assert_non_null(strstr(resp.why, "closed the connection during the handshake"));
	resp.x->ops->close(resp.x);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_same_key),
		cmocka_unit_test(test_wires),
		cmocka_unit_test(test_wrong_key),
		cmocka_unit_test(test_name_not_in_hosts),
		cmocka_unit_test(test_unexpected_name),
		cmocka_unit_test(test_wrong_frame_first),
		cmocka_unit_test(test_garbage),
		cmocka_unit_test(test_silent_peer),
		cmocka_unit_test(test_peer_error),
		cmocka_unit_test(test_closed_mid_handshake),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
