/* Sealed connections (xport_seal.h).
 *
 * Out: the frame goes as K_MAC (16 bytes) first, then the caller's fields
 * and tail. The head (the 16-byte header, whose length counts the K_MAC
 * field, and K_MAC's field header) is authenticated as it is; the body
 * (the fields, the tail's field header and the tail) is authenticated as
 * it is on an authenticated wire, sent without copying the tail. On an
 * encrypted wire the body is encrypted into one buffer of the connection's
 * (the encryption writes its output somewhere anyway: no extra pass over
 * the bytes) as the bytes of a second field, K_SEALED, whose header joins
 * the head; that buffer then goes as the frame's payload. In: the first
 * field must be K_MAC of 16 bytes and check; on an encrypted wire the
 * second must be K_SEALED running to the end, its bytes decrypted in place
 * and then held to the framing rules a plain payload is (the transport
 * could only check the two outer fields). Then the seal's fields are cut
 * off. A frame that fails is -EBADMSG
 * and the connection is dead both ways (a forger or a broken path: nothing
 * after it is trusted).
 */
#include "daemon/net/xport_seal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MAC_FIELD (PROTO_FIELD_HDR_LEN + SEAL_TAG_BYTES)
#define SEALED_HEAD (MAC_FIELD + PROTO_FIELD_HDR_LEN)   /* K_MAC, K_SEALED's header */

struct sealed {
	struct xport base;
	struct xport_ops ops;      /* the table below, named as the inner one */
	struct xport *inner;
	struct seal seal;
	uint8_t *out;              /* an encrypted frame's payload, made here */
	size_t out_cap;            /* at most PROTO_MAX_PAYLOAD: one per connection */
	int dead;                  /* 0, or the first failure: sticky */
	bool rx_failed;            /* it was on the way in: recv_last too is over */
};

/* The payload: K_MAC, then K_SEALED holding the fields (and the tail's
 * field) encrypted; the three headers are the additional data. */
static int send_encrypted(struct sealed *s, const struct msg *m, uint16_t key, const void *tail,
			  size_t n)
{
	size_t body = m->len + (tail ? PROTO_FIELD_HDR_LEN + n : 0);
	size_t total = SEALED_HEAD + body;
	uint8_t hdr[PROTO_HDR_LEN], fhdr[PROTO_FIELD_HDR_LEN];
	struct iovec head[3], in[3];
	uint8_t *outs[3], *p;
	struct msg m2 = { .type = m->type, .flags = m->flags };
	int nb = 0, rc;

	if (total > PROTO_MAX_PAYLOAD)
		return -E2BIG;
	if (s->out_cap < total) {
		p = realloc(s->out, total);
		if (!p)
			return -ENOMEM;
		s->out = p;
		s->out_cap = total;
	}
	p = s->out;
	proto_encode_field_hdr(p, K_MAC, SEAL_TAG_BYTES);
	proto_encode_field_hdr(p + MAC_FIELD, K_SEALED, (uint32_t)body);
	proto_encode_hdr(hdr, m->type, m->flags, (uint32_t)total);
	head[0] = (struct iovec){ .iov_base = hdr, .iov_len = sizeof(hdr) };
	head[1] = (struct iovec){ .iov_base = p, .iov_len = PROTO_FIELD_HDR_LEN };
	head[2] = (struct iovec){ .iov_base = p + MAC_FIELD, .iov_len = PROTO_FIELD_HDR_LEN };
	p += SEALED_HEAD;
	outs[nb] = p;
	in[nb++] = (struct iovec){ .iov_base = m->buf, .iov_len = m->len };
	if (tail) {
		proto_encode_field_hdr(fhdr, key, (uint32_t)n);
		outs[nb] = p + m->len;
		in[nb++] = (struct iovec){ .iov_base = fhdr, .iov_len = sizeof(fhdr) };
		outs[nb] = p + m->len + PROTO_FIELD_HDR_LEN;
		in[nb++] = (struct iovec){ .iov_base = (void *)tail, .iov_len = n };
	}
	rc = seal_tag(&s->seal, head, 3, in, nb, outs, s->out + PROTO_FIELD_HDR_LEN);
	if (rc == 0) {
		m2.buf = s->out;
		m2.len = m2.cap = total;
		rc = s->inner->ops->send(s->inner, &m2);
	}
	if (rc < 0)
		s->dead = rc;
	return rc;
}

static int send_authenticated(struct sealed *s, const struct msg *m, uint16_t key,
			      const void *tail, size_t n)
{
	uint8_t hdr[PROTO_HDR_LEN], fhdr[PROTO_FIELD_HDR_LEN];
	struct iovec iov[4], head[2], body[3];
	struct msg m2 = { .type = m->type, .flags = m->flags };
	int niov, nb = 0, rc;

	m2.len = m2.cap = MAC_FIELD + m->len;
	m2.buf = malloc(m2.len);
	if (!m2.buf)
		return -ENOMEM;
	proto_encode_field_hdr(m2.buf, K_MAC, SEAL_TAG_BYTES);
	memset(m2.buf + PROTO_FIELD_HDR_LEN, 0, SEAL_TAG_BYTES);
	if (m->len)
		memcpy(m2.buf + MAC_FIELD, m->buf, m->len);
	niov = msg_frame_iov(&m2, key, tail, n, hdr, fhdr, iov);
	if (niov < 0) {
		free(m2.buf);
		return niov;
	}
	/* iov[1] is m2.buf: everything of it but the tag */
	head[0] = iov[0];
	head[1] = (struct iovec){ .iov_base = m2.buf, .iov_len = PROTO_FIELD_HDR_LEN };
	body[nb++] = (struct iovec){ .iov_base = m2.buf + MAC_FIELD, .iov_len = m2.len - MAC_FIELD };
	for (int i = 2; i < niov; i++)
		body[nb++] = iov[i];
	rc = seal_tag(&s->seal, head, 2, body, nb, NULL, m2.buf + PROTO_FIELD_HDR_LEN);
	if (rc == 0)
		rc = s->inner->ops->send_tail(s->inner, &m2, key, tail, n);
	if (rc < 0)
		s->dead = rc;
	free(m2.buf);
	return rc;
}

static int s_send_tail(struct xport *x, const struct msg *m, uint16_t key, const void *tail,
		       size_t n)
{
	struct sealed *s = (struct sealed *)x;

	if (s->dead)
		return s->dead;
	if (m->err)
		return m->err;
	return s->seal.wire == SEAL_ENCRYPTED ? send_encrypted(s, m, key, tail, n)
					      : send_authenticated(s, m, key, tail, n);
}

static int s_send(struct xport *x, const struct msg *m)
{
	return s_send_tail(x, m, 0, NULL, 0);
}

/* m came from the inner transport: check and unwrap it. */
static bool is_field(const uint8_t *p, uint16_t key, uint32_t len)
{
	uint8_t want[PROTO_FIELD_HDR_LEN];

	proto_encode_field_hdr(want, key, len);
	return memcmp(p, want, sizeof(want)) == 0;
}

static int open_frame(struct sealed *s, struct msg *m)
{
	uint8_t hdr[PROTO_HDR_LEN];
	struct iovec head[3];
	size_t at = MAC_FIELD;
	int nh = 2, rc = -EBADMSG;

	if (m->len < MAC_FIELD || !is_field(m->buf, K_MAC, SEAL_TAG_BYTES))
		goto bad;
	proto_encode_hdr(hdr, m->type, m->flags, (uint32_t)m->len);
	head[0] = (struct iovec){ .iov_base = hdr, .iov_len = sizeof(hdr) };
	head[1] = (struct iovec){ .iov_base = m->buf, .iov_len = PROTO_FIELD_HDR_LEN };
	if (s->seal.wire == SEAL_ENCRYPTED) {
		if (m->len < SEALED_HEAD ||
		    !is_field(m->buf + MAC_FIELD, K_SEALED, (uint32_t)(m->len - SEALED_HEAD)))
			goto bad;
		head[nh++] = (struct iovec){ .iov_base = m->buf + MAC_FIELD,
					     .iov_len = PROTO_FIELD_HDR_LEN };
		at = SEALED_HEAD;
	}
	rc = seal_check(&s->seal, head, nh, m->buf + at, m->len - at,
			m->buf + PROTO_FIELD_HDR_LEN);
	if (rc < 0)
		goto bad;
	memmove(m->buf, m->buf + at, m->len - at);
	m->len -= at;
	if (at == SEALED_HEAD && proto_check_payload(m->buf, m->len) < 0) {
		rc = -EBADMSG;      /* a key holder's malformed fields */
		goto bad;
	}
	return 0;
bad:
	msg_free(m);
	memset(m, 0, sizeof(*m));
	if (!s->dead)           /* recv_last after a failed send: keep the first */
		s->dead = rc;
	s->rx_failed = true;
	return rc;
}

static int s_recv(struct xport *x, struct msg *m)
{
	struct sealed *s = (struct sealed *)x;
	int rc;

	if (s->dead) {
		memset(m, 0, sizeof(*m));
		return s->dead;
	}
	rc = s->inner->ops->recv(s->inner, m);
	if (rc < 0) {
		if (rc != -ETIMEDOUT) {
			s->dead = rc;
			s->rx_failed = true;
		}
		return rc;
	}
	return open_frame(s, m);
}

static int s_recv_last(struct xport *x, struct msg *m, int timeout_ms)
{
	struct sealed *s = (struct sealed *)x;
	int rc;

	memset(m, 0, sizeof(*m));
	if (!s->inner->ops->recv_last || s->rx_failed)
		return -ENOTCONN;
	/* a failed send made us dead; the inbound stream may still be whole */
	rc = s->inner->ops->recv_last(s->inner, m, timeout_ms);
	return rc < 0 ? rc : open_frame(s, m);
}

static bool s_ready(struct xport *x)
{
	struct sealed *s = (struct sealed *)x;

	return s->dead || s->inner->ops->ready(s->inner);
}

static int s_set_timeout(struct xport *x, int timeout_ms)
{
	struct sealed *s = (struct sealed *)x;

	return s->inner->ops->set_timeout(s->inner, timeout_ms);
}

static uint64_t s_queued(struct xport *x)
{
	struct sealed *s = (struct sealed *)x;

	return s->inner->ops->queued ? s->inner->ops->queued(s->inner) : 0;
}

static void s_shutdown(struct xport *x)
{
	struct sealed *s = (struct sealed *)x;

	s->inner->ops->shutdown(s->inner);
}

static void s_close(struct xport *x)
{
	struct sealed *s = (struct sealed *)x;

	if (!s)
		return;
	s->inner->ops->close(s->inner);
	seal_end(&s->seal);
	free(s->out);
	free(s);
}

int xport_seal(struct xport **x, const uint8_t key[SEAL_KEY_BYTES], bool initiator,
	       enum seal_wire wire)
{
	struct sealed *s = calloc(1, sizeof(*s));
	int rc;

	if (!s)
		return -ENOMEM;
	rc = seal_init(&s->seal, key, initiator, wire);
	if (rc < 0) {
		free(s);
		return rc;
	}
	s->ops = (struct xport_ops){
		.name = (*x)->ops->name,
		.send = s_send,
		.send_tail = s_send_tail,
		.recv = s_recv,
		.recv_last = s_recv_last,
		.ready = (*x)->ops->ready ? s_ready : NULL,
		.set_timeout = s_set_timeout,
		.queued = s_queued,
		.shutdown = s_shutdown,
		.close = s_close,
	};
	s->base.ops = &s->ops;
	memcpy(s->base.peer, (*x)->peer, sizeof(s->base.peer));
	s->inner = *x;
	*x = &s->base;
	return 0;
}
