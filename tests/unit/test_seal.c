/* common/seal.c and daemon/net/xport_seal.c: frame tags, and sealed
 * connections over real loopback TCP. A tag depends on every byte, the
 * direction and the frame's number, not on how the bytes are cut into
 * pieces; a sealed connection delivers the caller's frames unchanged and
 * refuses a frame altered, replayed, reflected or unsealed (a refusal
 * included). */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "common/seal.h"
#include "daemon/net/xport_seal.h"

static const uint8_t KEY[SEAL_KEY_BYTES] = "0123456789abcdef0123456789abcde";

static void tag1(struct seal *s, const uint8_t *p, size_t n, uint8_t tag[SEAL_TAG_BYTES])
{
	struct iovec v = { .iov_base = (void *)p, .iov_len = n };

	seal_tag(s, &v, 1, tag);
}

static int check1(struct seal *s, const uint8_t *p, size_t n, const uint8_t tag[SEAL_TAG_BYTES])
{
	struct iovec v = { .iov_base = (void *)p, .iov_len = n };

	return seal_check(s, &v, 1, tag);
}

static void test_tags(void **state)
{
	struct seal a, b, c;
	uint8_t frame[64], tag[SEAL_TAG_BYTES], tag2[SEAL_TAG_BYTES];
	struct iovec parts[3] = { { frame, 5 }, { frame + 5, 0 }, { frame + 5, 59 } };

	for (int i = 0; i < 64; i++)
		frame[i] = (uint8_t)(i * 7);
	seal_init(&a, KEY, true);
	seal_init(&b, KEY, false);
	/* round trip, and the pieces do not matter */
	tag1(&a, frame, sizeof(frame), tag);
	assert_int_equal(seal_check(&b, parts, 3, tag), 0);
	/* every bit of the frame counts */
	for (int bit = 0; bit < 64 * 8; bit++) {
		seal_init(&a, KEY, true);
		seal_init(&b, KEY, false);
		tag1(&a, frame, sizeof(frame), tag);
		frame[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		assert_int_equal(check1(&b, frame, sizeof(frame), tag), -EBADMSG);
		frame[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		assert_int_equal(check1(&b, frame, sizeof(frame), tag), 0);
	}
	/* and so does every bit of the tag */
	seal_init(&a, KEY, true);
	tag1(&a, frame, sizeof(frame), tag);
	for (int bit = 0; bit < SEAL_TAG_BYTES * 8; bit++) {
		seal_init(&b, KEY, false);
		tag[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		assert_int_equal(check1(&b, frame, sizeof(frame), tag), -EBADMSG);
		tag[bit / 8] ^= (uint8_t)(1u << (bit % 8));
	}
	/* replayed: the second time, the number is not the one due */
	seal_init(&a, KEY, true);
	seal_init(&b, KEY, false);
	tag1(&a, frame, sizeof(frame), tag);
	assert_int_equal(check1(&b, frame, sizeof(frame), tag), 0);
	assert_int_equal(check1(&b, frame, sizeof(frame), tag), -EBADMSG);
	/* a failed check does not count: the next real frame still passes */
	tag1(&a, frame, sizeof(frame), tag2);
	assert_int_equal(check1(&b, frame, sizeof(frame), tag2), 0);
	/* reflected: a frame of ours sent back to us */
	seal_init(&a, KEY, true);
	tag1(&a, frame, sizeof(frame), tag);
	assert_int_equal(check1(&a, frame, sizeof(frame), tag), -EBADMSG);
	/* another session's key */
	seal_init(&a, KEY, true);
	seal_init(&c, (const uint8_t *)"another key, another connection", false);
	tag1(&a, frame, sizeof(frame), tag);
	assert_int_equal(check1(&c, frame, sizeof(frame), tag), -EBADMSG);
	/* dropped: frame 1 is not frame 0 */
	seal_init(&a, KEY, true);
	seal_init(&b, KEY, false);
	tag1(&a, frame, sizeof(frame), tag);
	tag1(&a, frame, sizeof(frame), tag2);
	assert_int_equal(check1(&b, frame, sizeof(frame), tag2), -EBADMSG);
	seal_end(&a);
	for (size_t i = 0; i < sizeof(a.key); i++)
		assert_int_equal(a.key[i], 0);
}

/* ---- sealed connections over loopback TCP ---- */

static const struct xport_ops *T = &xport_tcp_ops;

/* A connected pair: raw (not sealed). */
static void pair(struct xport **c, struct xport **s)
{
	struct xport_listener *l;
	struct sockaddr_in sa;
	socklen_t len = sizeof(sa);
	struct pollfd p;
	char why[256];
	int fd;

	assert_int_equal(T->listen("127.0.0.1", 0, &l, &fd, why, sizeof(why)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	{
		struct host h = { .name = (char *)"b", .host = (char *)"127.0.0.1",
				  .port = ntohs(sa.sin_port) };

		assert_int_equal(T->connect(&h, 2000, c, why, sizeof(why)), 0);
	}
	p = (struct pollfd){ .fd = fd, .events = POLLIN };
	assert_int_equal(poll(&p, 1, 5000), 1);
	assert_int_equal(T->accept(l, s), 0);
	T->unlisten(l);
	assert_int_equal(T->set_timeout(*c, 3000), 0);
	assert_int_equal(T->set_timeout(*s, 3000), 0);
}

static void test_sealed_round_trip(void **state)
{
	struct xport *c, *s, *rc;
	struct msg m, got;
	uint8_t *big = malloc(1 << 20);
	const uint8_t *p;
	size_t n;
	uint64_t v;

	for (size_t i = 0; i < (1u << 20); i++)
		big[i] = (uint8_t)(i * 31 + 7);
	pair(&c, &s);
	rc = c;
	assert_int_equal(xport_seal(&c, KEY, true), 0);
	assert_int_equal(xport_seal(&s, KEY, false), 0);
	assert_ptr_not_equal(c, rc);
	assert_string_equal(c->ops->name, "tcp");
	for (int i = 0; i < 3; i++) {
		msg_init(&m, MSG_DATA);
		msg_put_u64(&m, K_OFFSET, (uint64_t)i);
		assert_int_equal(c->ops->send_tail(c, &m, K_DATA, big, (1u << 20) - (size_t)i), 0);
		msg_free(&m);
		assert_int_equal(s->ops->recv(s, &got), 0);
		assert_int_equal(got.type, MSG_DATA);
		assert_int_equal(msg_get_u64(&got, K_OFFSET, &v), 0);
		assert_int_equal(v, (uint64_t)i);
		assert_int_equal(msg_get_bytes(&got, K_DATA, &p, &n), 0);
		assert_int_equal(n, (1u << 20) - (size_t)i);
		assert_memory_equal(p, big, n);
		assert_int_equal(msg_get_bytes(&got, K_MAC, &p, &n), -ENOENT);
		msg_free(&got);
		/* and the other way, a frame with no fields */
		msg_init(&m, MSG_END);
		assert_int_equal(s->ops->send(s, &m), 0);
		msg_free(&m);
		assert_int_equal(c->ops->recv(c, &got), 0);
		assert_int_equal(got.type, MSG_END);
		assert_int_equal(got.len, 0);
		msg_free(&got);
	}
	c->ops->close(c);
	s->ops->close(s);
	free(big);
}

/* What goes on the wire for one sealed frame from a fresh initiator. */
static void capture(struct msg *wire)
{
	struct xport *c, *s;
	struct msg m;

	pair(&c, &s);
	assert_int_equal(xport_seal(&c, KEY, true), 0);
	msg_init(&m, MSG_OFFER);
	msg_put_str(&m, K_JOB, "job1");
	assert_int_equal(c->ops->send(c, &m), 0);
	msg_free(&m);
	assert_int_equal(s->ops->recv(s, wire), 0);     /* raw: the tag is there */
	c->ops->close(c);
	s->ops->close(s);
}

static void test_sealed_refusals(void **state)
{
	struct xport *c, *s;
	struct msg wire, m, got;
	char *job;

	capture(&wire);
	/* replayed on another connection (same key): once fine, then not */
	pair(&c, &s);
	assert_int_equal(xport_seal(&s, KEY, false), 0);
	assert_int_equal(c->ops->send(c, &wire), 0);
	assert_int_equal(c->ops->send(c, &wire), 0);
	assert_int_equal(s->ops->recv(s, &got), 0);
	assert_int_equal(msg_get_str(&got, K_JOB, &job), 0);
	assert_string_equal(job, "job1");
	free(job);
	msg_free(&got);
	assert_int_equal(s->ops->recv(s, &got), -EBADMSG);
	/* dead from then on */
	assert_int_equal(s->ops->recv(s, &got), -EBADMSG);
	c->ops->close(c);
	s->ops->close(s);
	/* one byte altered */
	pair(&c, &s);
	assert_int_equal(xport_seal(&s, KEY, false), 0);
	wire.buf[wire.len - 1] ^= 1;
	assert_int_equal(c->ops->send(c, &wire), 0);
	assert_int_equal(s->ops->recv(s, &got), -EBADMSG);
	wire.buf[wire.len - 1] ^= 1;
	c->ops->close(c);
	s->ops->close(s);
	/* sent back to the side that sealed it (an initiator) */
	pair(&c, &s);
	assert_int_equal(xport_seal(&s, KEY, true), 0);
	assert_int_equal(c->ops->send(c, &wire), 0);
	assert_int_equal(s->ops->recv(s, &got), -EBADMSG);
	c->ops->close(c);
	s->ops->close(s);
	/* not sealed at all */
	pair(&c, &s);
	assert_int_equal(xport_seal(&s, KEY, false), 0);
	msg_init(&m, MSG_OFFER);
	msg_put_str(&m, K_JOB, "job1");
	assert_int_equal(c->ops->send(c, &m), 0);
	msg_free(&m);
	assert_int_equal(s->ops->recv(s, &got), -EBADMSG);
	c->ops->close(c);
	s->ops->close(s);
	/* no exception for a refusal: an unsealed MSG_ERROR, even first, is
	 * refused like any other frame (it would let anyone on the path
	 * make a sender count a refusal) */
	pair(&c, &s);
	assert_int_equal(xport_seal(&s, KEY, false), 0);
	msg_init(&m, MSG_ERROR);
	msg_put_u64(&m, K_ERRNO, EACCES);
	assert_int_equal(c->ops->send(c, &m), 0);
	msg_free(&m);
	assert_int_equal(s->ops->recv(s, &got), -EBADMSG);
	/* and recv_last, after a failure on the way in, has nothing */
	assert_int_equal(s->ops->recv_last(s, &got, 100), -ENOTCONN);
	c->ops->close(c);
	s->ops->close(s);
	msg_free(&wire);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tags),
		cmocka_unit_test(test_sealed_round_trip),
		cmocka_unit_test(test_sealed_refusals),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
