/* Sealed connections (xport_seal.h).
 *
 * Out: the frame goes as K_MAC (16 bytes) first, then the caller's fields
 * and tail; the tag covers every byte of it but the tag's own 16: the
 * 16-byte header (whose length counts the K_MAC field), K_MAC's field
 * header, the fields, the tail's field header and the tail. The tail is
 * not copied. In: the first field must be K_MAC of 16 bytes and check;
 * then it is cut off. A frame that fails is -EBADMSG and the connection is
 * dead both ways (a forger or a broken path: nothing after it is trusted).
 */
#include "daemon/net/xport_seal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MAC_FIELD (PROTO_FIELD_HDR_LEN + SEAL_TAG_BYTES)

struct sealed {
	struct xport base;
	struct xport_ops ops;      /* the table below, named as the inner one */
	struct xport *inner;
	struct seal seal;
	int dead;                  /* 0, or the first failure: sticky */
	bool rx_failed;            /* it was on the way in: recv_last too is over */
};

static int s_send_tail(struct xport *x, const struct msg *m, uint16_t key, const void *tail,
		       size_t n)
{
	struct sealed *s = (struct sealed *)x;
	uint8_t hdr[PROTO_HDR_LEN], fhdr[PROTO_FIELD_HDR_LEN];
	struct iovec iov[4], cover[6];
	struct msg m2 = { .type = m->type, .flags = m->flags };
	int niov, nc = 0, rc;

	if (s->dead)
		return s->dead;
	if (m->err)
		return m->err;
	m2.len = m2.cap = MAC_FIELD + m->len;
	m2.buf = malloc(m2.len);
	if (!m2.buf)
		return -ENOMEM;
	/* K_MAC's field header: key, 0, length (proto.c's layout) */
	memset(m2.buf, 0, MAC_FIELD);
	m2.buf[0] = (uint8_t)(K_MAC & 0xff);
	m2.buf[1] = (uint8_t)(K_MAC >> 8);
	m2.buf[4] = SEAL_TAG_BYTES;
	if (m->len)
		memcpy(m2.buf + MAC_FIELD, m->buf, m->len);
	niov = msg_frame_iov(&m2, key, tail, n, hdr, fhdr, iov);
	if (niov < 0) {
		free(m2.buf);
		return niov;
	}
	/* iov[1] is m2.buf: everything of it but the tag */
	cover[nc++] = iov[0];
	cover[nc++] = (struct iovec){ .iov_base = m2.buf, .iov_len = PROTO_FIELD_HDR_LEN };
	if (m2.len > MAC_FIELD)
		cover[nc++] = (struct iovec){ .iov_base = m2.buf + MAC_FIELD,
					      .iov_len = m2.len - MAC_FIELD };
	for (int i = 2; i < niov; i++)
		cover[nc++] = iov[i];
	seal_tag(&s->seal, cover, nc, m2.buf + PROTO_FIELD_HDR_LEN);
	rc = s->inner->ops->send_tail(s->inner, &m2, key, tail, n);
	free(m2.buf);
	if (rc < 0)
		s->dead = rc;
	return rc;
}

static int s_send(struct xport *x, const struct msg *m)
{
	return s_send_tail(x, m, 0, NULL, 0);
}

/* m came from the inner transport: check and unwrap it. */
static int open_frame(struct sealed *s, struct msg *m)
{
	uint8_t hdr[PROTO_HDR_LEN];
	struct iovec cover[3];
	int nc = 0, rc;

	if (m->len < MAC_FIELD || m->buf[0] != (K_MAC & 0xff) || m->buf[1] != (K_MAC >> 8) ||
	    m->buf[2] || m->buf[3] || m->buf[4] != SEAL_TAG_BYTES || m->buf[5] || m->buf[6] ||
	    m->buf[7]) {
		rc = -EBADMSG;
		goto bad;
	}
	proto_encode_hdr(hdr, m->type, m->flags, (uint32_t)m->len);
	cover[nc++] = (struct iovec){ .iov_base = hdr, .iov_len = sizeof(hdr) };
	cover[nc++] = (struct iovec){ .iov_base = m->buf, .iov_len = PROTO_FIELD_HDR_LEN };
	if (m->len > MAC_FIELD)
		cover[nc++] = (struct iovec){ .iov_base = m->buf + MAC_FIELD,
					      .iov_len = m->len - MAC_FIELD };
	rc = seal_check(&s->seal, cover, nc, m->buf + PROTO_FIELD_HDR_LEN);
	if (rc < 0)
		goto bad;
	memmove(m->buf, m->buf + MAC_FIELD, m->len - MAC_FIELD);
	m->len -= MAC_FIELD;
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
	free(s);
}

int xport_seal(struct xport **x, const uint8_t key[SEAL_KEY_BYTES], bool initiator)
{
	struct sealed *s = calloc(1, sizeof(*s));

	if (!s)
		return -ENOMEM;
	s->ops = (struct xport_ops){
		.name = (*x)->ops->name,
		.send = s_send,
		.send_tail = s_send_tail,
		.recv = s_recv,
		.recv_last = s_recv_last,
		.set_timeout = s_set_timeout,
		.queued = s_queued,
		.shutdown = s_shutdown,
		.close = s_close,
	};
	s->base.ops = &s->ops;
	memcpy(s->base.peer, (*x)->peer, sizeof(s->base.peer));
	s->inner = *x;
	seal_init(&s->seal, key, initiator);
	*x = &s->base;
	return 0;
}
