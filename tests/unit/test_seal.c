/* common/seal.c and daemon/net/xport_seal.c: frame tags, on both wires,
 * and sealed connections over real loopback TCP. Tags agree with another
 * implementation of AES-256-GCM; a tag depends on every byte, the
 * direction, the frame's number and the wire, not on how the bytes are cut
 * into pieces; an encrypted wire does not carry the plaintext; a sealed
 * connection delivers the caller's frames unchanged and refuses a frame
 * altered, replayed, reflected or unsealed (a refusal included). */
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

#include "common/proto.h"
#include "common/seal.h"
#include "daemon/net/xport_seal.h"

static const uint8_t KEY[SEAL_KEY_BYTES] = "0123456789abcdef0123456789abcde";

/* A frame of one piece: its first 5 bytes the head, the rest the body
 * (encrypted in place on an encrypted wire). */
static void tag1(struct seal *s, uint8_t *p, size_t n, uint8_t tag[SEAL_TAG_BYTES])
{
	struct iovec h = { .iov_base = p, .iov_len = 5 }, b = { .iov_base = p + 5, .iov_len = n - 5 };
	uint8_t *out = p + 5;

	assert_int_equal(seal_tag(s, &h, 1, &b, 1, &out, tag), 0);
}

static int check1(struct seal *s, uint8_t *p, size_t n, const uint8_t tag[SEAL_TAG_BYTES])
{
	struct iovec h = { .iov_base = p, .iov_len = 5 };

	return seal_check(s, &h, 1, p + 5, n - 5, tag);
}

static void fresh(struct seal *a, struct seal *b, enum seal_wire w)
{
	seal_end(a);
	seal_end(b);
	assert_int_equal(seal_init(a, KEY, true, w), 0);
	assert_int_equal(seal_init(b, KEY, false, w), 0);
}

static void fill(uint8_t *frame, size_t n)
{
	for (size_t i = 0; i < n; i++)
		frame[i] = (uint8_t)(i * 7);
}

/* Tags from an implementation apart from ours (Python's cryptography,
 * AESGCM), for KEY, the frame fill() makes, head its first 5 bytes. */
static const uint8_t AUTH_F0_DIR1[16] = {
	0x02, 0x23, 0x63, 0x3b, 0x62, 0x7b, 0x93, 0x4b, 0xf5, 0xf1, 0x74, 0xcd, 0x95, 0x2a, 0xf6, 0x29,
};
static const uint8_t AUTH_F1_DIR1[16] = {
	0x40, 0x05, 0x59, 0x43, 0x6d, 0x84, 0x36, 0x59, 0x14, 0x93, 0x6b, 0xf1, 0xca, 0x14, 0xce, 0x8f,
};
static const uint8_t ENC_F0_DIR2[16] = {
	0xdb, 0x82, 0x9b, 0x77, 0xc1, 0xf1, 0x8c, 0x02, 0xe2, 0xe6, 0x39, 0xbc, 0x48, 0xb2, 0x90, 0xe4,
};
static const uint8_t ENC_F0_DIR2_CT[8] = { 0xfd, 0xd9, 0xb8, 0x7e, 0x57, 0xa6, 0xf7, 0x69 };

static void test_known_answers(void **state)
{
	struct seal a = { 0 }, b = { 0 };
	uint8_t frame[64], want[64], tag[SEAL_TAG_BYTES];

	fill(frame, sizeof(frame));
	memcpy(want, frame, sizeof(want));
	/* authenticated: GMAC over the whole frame; the bytes go as they are */
	fresh(&a, &b, SEAL_AUTHENTICATED);
	tag1(&a, frame, sizeof(frame), tag);
	assert_memory_equal(tag, AUTH_F0_DIR1, 16);
	assert_memory_equal(frame, want, sizeof(frame));
	tag1(&a, frame, sizeof(frame), tag);
	assert_memory_equal(tag, AUTH_F1_DIR1, 16);
	/* encrypted, by the responder (direction 2): the body is ciphertext */
	fresh(&a, &b, SEAL_ENCRYPTED);
	tag1(&b, frame, sizeof(frame), tag);
	assert_memory_equal(tag, ENC_F0_DIR2, 16);
	assert_memory_equal(frame, want, 5);
	assert_memory_equal(frame + 5, ENC_F0_DIR2_CT, 8);
	assert_int_equal(check1(&a, frame, sizeof(frame), tag), 0);
	assert_memory_equal(frame, want, sizeof(frame));
	seal_end(&a);
	seal_end(&b);
	assert_int_equal(seal_init(&a, KEY, true, 0), -EINVAL);
	assert_int_equal(seal_init(&a, KEY, true, 3), -EINVAL);
}

static void tags(enum seal_wire w)
{
	struct seal a = { 0 }, b = { 0 }, c = { 0 };
	uint8_t frame[64], sealed[64], tag[SEAL_TAG_BYTES], tag2[SEAL_TAG_BYTES];
	uint8_t *outs[3];
	struct iovec head[2], body[3];

	fill(frame, sizeof(frame));
	/* round trip, and the pieces do not matter */
	fresh(&a, &b, w);
	memcpy(sealed, frame, sizeof(frame));
	head[0] = (struct iovec){ sealed, 2 };
	head[1] = (struct iovec){ sealed + 2, 3 };
	body[0] = (struct iovec){ sealed + 5, 0 };
	body[1] = (struct iovec){ sealed + 5, 17 };
	body[2] = (struct iovec){ sealed + 22, 42 };
	outs[0] = sealed + 5;
	outs[1] = sealed + 5;
	outs[2] = sealed + 22;
	assert_int_equal(seal_tag(&a, head, 2, body, 3, w == SEAL_ENCRYPTED ? outs : NULL, tag), 0);
	if (w == SEAL_ENCRYPTED)
		assert_memory_not_equal(sealed + 5, frame + 5, 59);
	else
		assert_memory_equal(sealed, frame, 64);
	assert_int_equal(check1(&b, sealed, sizeof(sealed), tag), 0);
	assert_memory_equal(sealed, frame, sizeof(frame));
	/* every bit of the frame counts, head and body */
	for (int bit = 0; bit < 64 * 8; bit++) {
		fresh(&a, &b, w);
		memcpy(sealed, frame, sizeof(frame));
		tag1(&a, sealed, sizeof(sealed), tag);
		sealed[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		assert_int_equal(check1(&b, sealed, sizeof(sealed), tag), -EBADMSG);
	}
	/* and so does every bit of the tag */
	fresh(&a, &b, w);
	memcpy(sealed, frame, sizeof(frame));
	tag1(&a, sealed, sizeof(sealed), tag);
	for (int bit = 0; bit < SEAL_TAG_BYTES * 8; bit++) {
		uint8_t copy[64];

		memcpy(copy, sealed, sizeof(copy));
		tag[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		assert_int_equal(check1(&b, copy, sizeof(copy), tag), -EBADMSG);
		tag[bit / 8] ^= (uint8_t)(1u << (bit % 8));
	}
	/* replayed: the second time, the number is not the one due */
	{
		uint8_t copy[64];

		memcpy(copy, sealed, sizeof(copy));
		assert_int_equal(check1(&b, copy, sizeof(copy), tag), 0);
		memcpy(copy, sealed, sizeof(copy));
		assert_int_equal(check1(&b, copy, sizeof(copy), tag), -EBADMSG);
	}
	/* a failed check does not count: the next real frame still passes */
	memcpy(sealed, frame, sizeof(frame));
	tag1(&a, sealed, sizeof(sealed), tag2);
	assert_int_equal(check1(&b, sealed, sizeof(sealed), tag2), 0);
	assert_memory_equal(sealed, frame, sizeof(frame));
	/* reflected: a frame of ours sent back to us */
	fresh(&a, &b, w);
	memcpy(sealed, frame, sizeof(frame));
	tag1(&a, sealed, sizeof(sealed), tag);
	assert_int_equal(check1(&a, sealed, sizeof(sealed), tag), -EBADMSG);
	/* another session's key */
	fresh(&a, &b, w);
	assert_int_equal(seal_init(&c, (const uint8_t *)"another key, another connection", false,
				   w), 0);
	memcpy(sealed, frame, sizeof(frame));
	tag1(&a, sealed, sizeof(sealed), tag);
	assert_int_equal(check1(&c, sealed, sizeof(sealed), tag), -EBADMSG);
	seal_end(&c);
	/* the other wire under the same key and number */
	assert_int_equal(seal_init(&c, KEY, false, w == SEAL_ENCRYPTED ? SEAL_AUTHENTICATED
								       : SEAL_ENCRYPTED), 0);
	assert_int_equal(check1(&c, sealed, sizeof(sealed), tag), -EBADMSG);
	seal_end(&c);
	/* dropped: frame 1 is not frame 0 */
	fresh(&a, &b, w);
	memcpy(sealed, frame, sizeof(frame));
	tag1(&a, sealed, sizeof(sealed), tag);
	memcpy(sealed, frame, sizeof(frame));
	tag1(&a, sealed, sizeof(sealed), tag2);
	assert_int_equal(check1(&b, sealed, sizeof(sealed), tag2), -EBADMSG);
	seal_end(&a);
	seal_end(&b);
	assert_null(a.tx_ctx);
	assert_null(a.rx_ctx);
}

static void test_tags_authenticated(void **state)
{
	tags(SEAL_AUTHENTICATED);
}

static void test_tags_encrypted(void **state)
{
	tags(SEAL_ENCRYPTED);
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

static void sealed_round_trip(enum seal_wire w)
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
	assert_int_equal(xport_seal(&c, KEY, true, w), 0);
	assert_int_equal(xport_seal(&s, KEY, false, w), 0);
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

static void test_sealed_round_trip(void **state)
{
	sealed_round_trip(SEAL_AUTHENTICATED);
	sealed_round_trip(SEAL_ENCRYPTED);
}

/* An offer of job1 sent on c (sealed or not, as c is). */
static void send_job1(struct xport *c)
{
	struct msg m;

	msg_init(&m, MSG_OFFER);
	msg_put_str(&m, K_JOB, "job1");
	assert_int_equal(c->ops->send(c, &m), 0);
	msg_free(&m);
}

/* What goes on the wire for one sealed frame from a fresh initiator. */
static void capture(struct msg *wire, enum seal_wire w)
{
	struct xport *c, *s;

	pair(&c, &s);
	assert_int_equal(xport_seal(&c, KEY, true, w), 0);
	send_job1(c);
	assert_int_equal(s->ops->recv(s, wire), 0);     /* raw: the tag is there */
	c->ops->close(c);
	s->ops->close(s);
}

static void sealed_refusals(enum seal_wire w)
{
	struct xport *c, *s;
	struct msg wire, m, got;
	char *job;

	capture(&wire, w);
	/* on an encrypted wire the job's name is not on it */
	if (w == SEAL_ENCRYPTED)
		assert_null(memmem(wire.buf, wire.len, "job1", 4));
	else
		assert_non_null(memmem(wire.buf, wire.len, "job1", 4));
	/* replayed on another connection (same key): once fine, then not */
	pair(&c, &s);
	assert_int_equal(xport_seal(&s, KEY, false, w), 0);
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
	assert_int_equal(xport_seal(&s, KEY, false, w), 0);
	wire.buf[wire.len - 1] ^= 1;
	assert_int_equal(c->ops->send(c, &wire), 0);
	assert_int_equal(s->ops->recv(s, &got), -EBADMSG);
	wire.buf[wire.len - 1] ^= 1;
	c->ops->close(c);
	s->ops->close(s);
	/* sent back to the side that sealed it (an initiator) */
	pair(&c, &s);
	assert_int_equal(xport_seal(&s, KEY, true, w), 0);
	assert_int_equal(c->ops->send(c, &wire), 0);
	assert_int_equal(s->ops->recv(s, &got), -EBADMSG);
	c->ops->close(c);
	s->ops->close(s);
	/* not sealed at all */
	pair(&c, &s);
	assert_int_equal(xport_seal(&s, KEY, false, w), 0);
	send_job1(c);
	assert_int_equal(s->ops->recv(s, &got), -EBADMSG);
	c->ops->close(c);
	s->ops->close(s);
	/* no exception for a refusal: an unsealed MSG_ERROR, even first, is
	 * refused like any other frame (it would let anyone on the path
	 * make a sender count a refusal) */
	pair(&c, &s);
	assert_int_equal(xport_seal(&s, KEY, false, w), 0);
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

static void test_sealed_refusals(void **state)
{
	sealed_refusals(SEAL_AUTHENTICATED);
	sealed_refusals(SEAL_ENCRYPTED);
}

/* The two ends of one connection on different wires: the first frame
 * fails (what the handshake prevents by agreeing on one). */
static void test_wires_differ(void **state)
{
	struct xport *c, *s;
	struct msg got;

	pair(&c, &s);
	assert_int_equal(xport_seal(&c, KEY, true, SEAL_ENCRYPTED), 0);
	assert_int_equal(xport_seal(&s, KEY, false, SEAL_AUTHENTICATED), 0);
	send_job1(c);
	assert_int_equal(s->ops->recv(s, &got), -EBADMSG);
	c->ops->close(c);
	s->ops->close(s);
}

/* A key holder's encrypted frame whose tag is right but whose fields,
 * once decrypted, break the framing rules (a field running past the end):
 * refused like a plain frame that broke them would be on its way in. */
static void test_encrypted_malformed_fields(void **state)
{
	struct xport *c, *s;
	struct seal k = { 0 };
	struct msg wire = { .type = MSG_OFFER }, got;
	uint8_t hdr[16], *p, *out, bad[12] = { 21, 0, 0, 0, 200, 0, 0, 0, 'j', 'o', 'b', '1' };
	struct iovec head[3], body;
	size_t total = 24 + 8 + sizeof(bad);

	p = calloc(1, total);
	assert_non_null(p);
	p[0] = (uint8_t)K_MAC;
	p[4] = 16;
	p[24] = (uint8_t)K_SEALED;
	p[28] = sizeof(bad);
	proto_encode_hdr(hdr, MSG_OFFER, 0, (uint32_t)total);
	head[0] = (struct iovec){ hdr, 16 };
	head[1] = (struct iovec){ p, 8 };
	head[2] = (struct iovec){ p + 24, 8 };
	body = (struct iovec){ bad, sizeof(bad) };
	out = p + 32;
	assert_int_equal(seal_init(&k, KEY, true, SEAL_ENCRYPTED), 0);
	assert_int_equal(seal_tag(&k, head, 3, &body, 1, &out, p + 8), 0);
	seal_end(&k);
	wire.buf = p;
	wire.len = wire.cap = total;
	pair(&c, &s);
	assert_int_equal(xport_seal(&s, KEY, false, SEAL_ENCRYPTED), 0);
	assert_int_equal(c->ops->send(c, &wire), 0);
	assert_int_equal(s->ops->recv(s, &got), -EBADMSG);
	c->ops->close(c);
	s->ops->close(s);
	free(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_known_answers),
		cmocka_unit_test(test_tags_authenticated),
		cmocka_unit_test(test_tags_encrypted),
		cmocka_unit_test(test_sealed_round_trip),
		cmocka_unit_test(test_sealed_refusals),
		cmocka_unit_test(test_wires_differ),
		cmocka_unit_test(test_encrypted_malformed_fields),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
