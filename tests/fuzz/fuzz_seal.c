/* libFuzzer target: the check of a sealed frame (daemon/net/xport_seal.c), the
 * first thing that reads a peer's bytes after the handshake.
 *
 * Two sealed connections, an initiator and a responder with one fixed key,
 * each over an in-memory inner transport that hands its sealed wrapper the
 * frame we choose, as TCP would after decoding the header. The input is a
 * sequence of operations (up to MAX_OPS), each one byte (bit 0: which side
 * sends, bit 1: receive with recv_last rather than recv, bits 2-7 modulo 9:
 * what) and its arguments:
 *   0 a frame built from the input (type, flags, fields, maybe a tail) is
 *     sealed by one side and delivered intact to the other,
 *   1 the same, altered on the way (bits flipped in type, flags or
 *     payload, the payload cut short or extended), chosen by the input,
 *   2 the same, dropped on the way,
 *   3 raw bytes from the input delivered as a frame (type, flags, payload),
 *   4 the last frame the side sent delivered again (a replay),
 *   5 the last frame the receiving side itself sent delivered back to it,
 *   6 a receive with nothing there (a clean close or a timeout),
 *   7 the next send of the side's inner transport fails,
 *   8 raw bytes as in 3, but bytes 8..23 of the payload (where the tag
 *     goes) replaced by the right tag for the rest, whatever the first
 *     field's header says: what a key holder could send, so that the
 *     checks of the first field are seen to hold after a valid tag too.
 * The harness keeps its own model of both directions' frame numbers and of
 * which side is dead, and checks every frame against an oracle written from
 * docs/PROTOCOL.md ("Frames after the handshake"), apart from the code: the
 * first field is K_MAC of 16 bytes, and the tag is the one seal_check gives
 * for the frame as a single piece, at the number the receiver is due. The
 * wrapper must agree with the oracle on every frame, give back exactly what
 * was sealed, refuse every altered, dropped-before, replayed or reflected
 * frame, and stay dead after a refusal. Every frame is its own allocation
 * of exactly its length, so ASan sees any read past it. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/proto.h"
#include "common/seal.h"
#include "daemon/net/xport_seal.h"

#define MAC_FIELD (PROTO_FIELD_HDR_LEN + SEAL_TAG_BYTES)
#define MAX_OPS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint8_t KEY[SEAL_KEY_BYTES] = "fuzz_seal: one fixed session k.";

/* A frame as an inner transport delivers it: the header decoded, then the
 * payload. */
struct frame {
	uint16_t type, flags;
	uint8_t *buf;           /* exactly len bytes; NULL when len is 0 */
	size_t len;
	int from;               /* the side that sealed it, or -1 */
	uint64_t num;           /* its number in that side's direction */
};

struct mock {
	struct xport base;
	struct frame in;        /* what the next recv hands over */
	bool has_in;
	int recv_err;           /* what recv says when nothing is there */
	struct frame out;       /* what the last send sent */
	bool has_out;
	int fail_send;          /* the next send fails with this */
};

struct side {
	struct xport *x;        /* the sealed connection */
	struct mock *inner;
	bool initiator;
	uint64_t tx, rx;        /* the model: numbers of the next frame out, in */
	int dead;               /* the model: what recv returns now, or 0 */
	bool rx_failed;         /* the model: recv_last is over too */
	struct frame last;      /* a copy of the last frame it sent */
	bool has_last;
};

static uint32_t take(const uint8_t **p, const uint8_t *end, int n)
{
	uint32_t v = 0;

	for (int i = 0; i < n && *p < end; i++)
		v = v << 8 | *(*p)++;
	return v;
}

static void frame_free(struct frame *f)
{
	free(f->buf);
	f->buf = NULL;
	f->len = 0;
}

static void frame_copy(struct frame *to, const struct frame *f)
{
	*to = *f;
	to->buf = NULL;
	if (f->len) {
		to->buf = malloc(f->len);
		if (!to->buf)
			abort();
		memcpy(to->buf, f->buf, f->len);
	}
}

/* ---- the inner transport ---- */

static int m_send_tail(struct xport *x, const struct msg *m, uint16_t key, const void *tail,
		       size_t n)
{
	struct mock *k = (struct mock *)x;
	uint8_t hdr[PROTO_HDR_LEN], fhdr[PROTO_FIELD_HDR_LEN];
	struct iovec iov[4];
	uint16_t type, flags;
	uint32_t len;
	size_t off = 0;
	int niov = msg_frame_iov(m, key, tail, n, hdr, fhdr, iov), rc;

	if (niov < 0)
		return niov;
	if (k->fail_send) {
		rc = k->fail_send;
		k->fail_send = 0;
		return rc;
	}
	if (proto_decode_hdr(hdr, &type, &flags, &len) != 0)
		abort();
	frame_free(&k->out);
	k->out = (struct frame){ .type = type, .flags = flags, .len = len, .from = -1 };
	if (len && !(k->out.buf = malloc(len)))
		abort();
	for (int i = 1; i < niov; i++) {
		if (off + iov[i].iov_len > len)
			abort();
		memcpy(k->out.buf + off, iov[i].iov_base, iov[i].iov_len);
		off += iov[i].iov_len;
	}
	/* what goes out is a frame any receiver takes */
	if (off != len || proto_check_payload(k->out.buf, len) != 0)
		abort();
	k->has_out = true;
	return 0;
}

static int m_send(struct xport *x, const struct msg *m)
{
	return m_send_tail(x, m, 0, NULL, 0);
}

static int m_recv(struct xport *x, struct msg *m)
{
	struct mock *k = (struct mock *)x;

	memset(m, 0, sizeof(*m));
	if (!k->has_in)
		return k->recv_err;
	m->type = k->in.type;
	m->flags = k->in.flags;
	m->buf = k->in.buf;
	m->len = m->cap = k->in.len;
	k->in.buf = NULL;
	k->in.len = 0;
	k->has_in = false;
	return 0;
}

static int m_recv_last(struct xport *x, struct msg *m, int timeout_ms)
{
	(void)timeout_ms;
	return m_recv(x, m);
}

static int m_set_timeout(struct xport *x, int timeout_ms)
{
	(void)x;
	return timeout_ms < 0 ? -EINVAL : 0;
}

static void m_shutdown(struct xport *x)
{
	(void)x;
}

static void m_close(struct xport *x)
{
	struct mock *k = (struct mock *)x;

	frame_free(&k->in);
	frame_free(&k->out);
	free(k);
}

static const struct xport_ops mock_ops = {
	.name = "fuzz",
	.send = m_send,
	.send_tail = m_send_tail,
	.recv = m_recv,
	.recv_last = m_recv_last,
	.set_timeout = m_set_timeout,
	.shutdown = m_shutdown,
	.close = m_close,
};

static void side_open(struct side *s, bool initiator)
{
	struct mock *k = calloc(1, sizeof(*k));
	struct xport *x = &k->base;

	if (!k)
		abort();
	k->base.ops = &mock_ops;
	strcpy(k->base.peer, initiator ? "responder:1" : "initiator:2");
	*s = (struct side){ .inner = k, .initiator = initiator };
	if (xport_seal(&x, KEY, initiator) != 0 || x == &k->base)
		abort();
	s->x = x;
	if (strcmp(x->ops->name, "fuzz") != 0 || strcmp(x->peer, k->base.peer) != 0 ||
	    x->ops->set_timeout(x, 1000) != 0 || x->ops->queued(x) != 0)
		abort();
}

static void side_close(struct side *s)
{
	s->x->ops->shutdown(s->x);
	s->x->ops->close(s->x);
	frame_free(&s->last);
}

/* ---- the oracle, from docs/PROTOCOL.md ---- */

static bool oracle(const struct side *r, const struct frame *f)
{
	static const uint8_t fhdr[PROTO_FIELD_HDR_LEN] = { (uint8_t)K_MAC, 0, 0, 0,
							   SEAL_TAG_BYTES, 0, 0, 0 };
	size_t n = PROTO_HDR_LEN + PROTO_FIELD_HDR_LEN + (f->len - MAC_FIELD);
	uint8_t *cover;
	struct iovec v;
	struct seal sh;
	bool ok;

	if (f->len < MAC_FIELD || memcmp(f->buf, fhdr, sizeof(fhdr)) != 0)
		return false;
	if (!(cover = malloc(n)))
		abort();
	/* "STG1" | u16 type | u16 flags | u32 length | u32 0, little-endian */
	memcpy(cover, "STG1", 4);
	cover[4] = (uint8_t)f->type;
	cover[5] = (uint8_t)(f->type >> 8);
	cover[6] = (uint8_t)f->flags;
	cover[7] = (uint8_t)(f->flags >> 8);
	for (int i = 0; i < 4; i++)
		cover[8 + i] = (uint8_t)(f->len >> (8 * i));
	memset(cover + 12, 0, 4);
	memcpy(cover + PROTO_HDR_LEN, fhdr, sizeof(fhdr));
	memcpy(cover + PROTO_HDR_LEN + PROTO_FIELD_HDR_LEN, f->buf + MAC_FIELD, f->len - MAC_FIELD);
	v = (struct iovec){ .iov_base = cover, .iov_len = n };
	seal_init(&sh, KEY, r->initiator);
	sh.rx = r->rx;
	ok = seal_check(&sh, &v, 1, f->buf + PROTO_FIELD_HDR_LEN) == 0;
	seal_end(&sh);
	free(cover);
	return ok;
}

/* ---- the operations ---- */

/* Delivers f to r. model: 1 it must pass, 0 it must fail, -1 the oracle
 * alone says (raw bytes). */
static void deliver(struct side *r, const struct frame *f, bool use_last, int model)
{
	struct msg m;
	bool blocked = use_last ? r->rx_failed : r->dead != 0;
	bool want = oracle(r, f);
	int rc;

	if (model >= 0 && want != (model == 1))
		abort();
	want = want && !blocked;
	frame_free(&r->inner->in);
	frame_copy(&r->inner->in, f);
	r->inner->has_in = true;
	rc = use_last ? r->x->ops->recv_last(r->x, &m, 0) : r->x->ops->recv(r->x, &m);
	if (blocked) {
		if (rc != (use_last ? -ENOTCONN : r->dead) || m.buf || m.len)
			abort();
	} else if (want) {
		if (rc != 0 || m.type != f->type || m.flags != f->flags ||
		    m.len != f->len - MAC_FIELD ||
		    (m.len && memcmp(m.buf, f->buf + MAC_FIELD, m.len) != 0))
			abort();
		r->rx++;
	} else {
		if (rc != -EBADMSG || m.buf || m.len)
			abort();
		if (!r->dead)   /* the first failure is the one kept */
			r->dead = -EBADMSG;
		r->rx_failed = true;
	}
	msg_free(&m);
	frame_free(&r->inner->in);
	r->inner->has_in = false;
}

/* Builds a message from the input and sends it sealed from s: 1 and the
 * frame as it went out in *f, or 0 (refused or failed, as the model says). */
static int seal_one(struct side *s, const uint8_t **p, const uint8_t *end, struct frame *f)
{
	static uint8_t huge[PROTO_MAX_PAYLOAD];
	uint8_t hdr[PROTO_HDR_LEN], fhdr[PROTO_FIELD_HDR_LEN];
	struct iovec iov[4];
	const void *tail = NULL;
	size_t tn = 0, total, off = 0;
	uint32_t sel;
	struct msg m;
	int nf, rc, want, niov, armed;
	uint8_t *plain;

	msg_init(&m, (uint16_t)take(p, end, 2));
	m.flags = (uint16_t)take(p, end, 2);
	nf = (int)(take(p, end, 1) % 5);
	for (int i = 0; i < nf; i++) {
		uint16_t key = (uint16_t)take(p, end, 1);
		size_t n = take(p, end, 1) % 64;

		if (n > (size_t)(end - *p))
			n = (size_t)(end - *p);
		msg_put_bytes(&m, key, *p, n);
		*p += n;
	}
	sel = take(p, end, 1);
	if (sel == 0xff) {
		tail = huge;            /* too big once sealed: refused, not counted */
		tn = PROTO_MAX_PAYLOAD - MAC_FIELD - m.len - PROTO_FIELD_HDR_LEN + 1;
	} else if (sel == 0xfe) {
		m.err = -ENOMEM;        /* a put that failed */
	} else if (sel & 1) {
		tn = take(p, end, 2) % 1024;
		if (tn > (size_t)(end - *p))
			tn = (size_t)(end - *p);
		tail = *p;
		*p += tn;
	}
	if (m.err && sel != 0xfe)
		abort();
	total = MAC_FIELD + m.len + (tail ? PROTO_FIELD_HDR_LEN + tn : 0);

	armed = s->inner->fail_send;
	if (!tail && (sel & 2))
		rc = s->x->ops->send(s->x, &m);
	else
		rc = s->x->ops->send_tail(s->x, &m, K_DATA, tail, tn);
	/* dead either way (a failed send or a failed receive): refused first */
	want = s->dead;
	if (want) {
		if (s->inner->fail_send != armed)
			abort();
	} else if (m.err) {
		want = m.err;
	} else if (total > PROTO_MAX_PAYLOAD) {
		want = -E2BIG;  /* refused before its number is used */
	} else if (armed) {
		want = armed;
		s->tx++;        /* its number is used up */
		s->dead = want;
	}
	if (rc != want || (rc && s->inner->has_out))
		abort();
	if (rc) {
		msg_free(&m);
		return 0;
	}
	if (!s->inner->has_out)
		abort();
	/* the round trip: the frame out is K_MAC then exactly the caller's bytes */
	*f = s->inner->out;
	s->inner->out = (struct frame){ .from = -1 };
	s->inner->has_out = false;
	f->from = s->initiator ? 0 : 1;
	f->num = s->tx++;
	niov = msg_frame_iov(&m, K_DATA, tail, tn, hdr, fhdr, iov);
	if (niov < 0 || f->type != m.type || f->flags != m.flags ||
	    f->len != total)
		abort();
	plain = f->buf + MAC_FIELD;
	for (int i = 1; i < niov; i++) {
		if (memcmp(plain + off, iov[i].iov_base, iov[i].iov_len) != 0)
			abort();
		off += iov[i].iov_len;
	}
	if (MAC_FIELD + off != f->len)
		abort();
	msg_free(&m);
	frame_free(&s->last);
	frame_copy(&s->last, f);
	s->has_last = true;
	return 1;
}

/* Alters f as the input says: 1 if it differs from what was sealed. */
static bool alter(struct frame *f, const uint8_t **p, const uint8_t *end)
{
	struct frame orig;
	int n = 1 + (int)(take(p, end, 1) % 4);
	bool differs;

	frame_copy(&orig, f);
	for (int i = 0; i < n; i++) {
		uint32_t pos = take(p, end, 2), what = take(p, end, 1);
		size_t bits = 32 + 8 * f->len;

		switch (what % 4) {
		case 0:
		case 1:         /* one bit of type, flags or payload */
			pos %= bits;
			if (pos < 16)
				f->type ^= (uint16_t)(1u << pos);
			else if (pos < 32)
				f->flags ^= (uint16_t)(1u << (pos - 16));
			else
				f->buf[(pos - 32) / 8] ^= (uint8_t)(1u << ((pos - 32) % 8));
			break;
		case 2:         /* cut short */
			if (f->len) {
				f->len = pos % f->len;
				if (!f->len) {
					free(f->buf);
					f->buf = NULL;
				} else {
					uint8_t *b = realloc(f->buf, f->len);

					if (!b)
						abort();
					f->buf = b;
				}
			}
			break;
		default: {      /* extended */
			size_t more = 1 + (what >> 2) % 32;
			uint8_t *b = realloc(f->buf, f->len + more);

			if (!b)
				abort();
			memset(b + f->len, (int)(pos & 0xff), more);
			f->buf = b;
			f->len += more;
		}
		}
	}
	differs = f->type != orig.type || f->flags != orig.flags || f->len != orig.len ||
		  (f->len && memcmp(f->buf, orig.buf, f->len) != 0);
	frame_free(&orig);
	return differs;
}

static void raw_frame(struct frame *f, const uint8_t **p, const uint8_t *end)
{
	size_t n;

	*f = (struct frame){ .from = -1 };
	f->type = (uint16_t)take(p, end, 2);
	f->flags = (uint16_t)take(p, end, 2);
	n = take(p, end, 2);
	if (n > (size_t)(end - *p))
		n = (size_t)(end - *p);
	if (n) {
		if (!(f->buf = malloc(n)))
			abort();
		memcpy(f->buf, *p, n);
	}
	f->len = n;
	*p += n;
}

/* Raw bytes, signed as the peer of r would sign them for the number r is
 * due (case 8): a key holder's frame, well formed or not. */
static void keyed_frame(const struct side *r, struct frame *f, const uint8_t **p,
			const uint8_t *end)
{
	uint8_t hdr[PROTO_HDR_LEN];
	struct iovec cover[3];
	struct seal sh;

	raw_frame(f, p, end);
	if (f->len < MAC_FIELD)
		return;
	proto_encode_hdr(hdr, f->type, f->flags, (uint32_t)f->len);
	cover[0] = (struct iovec){ .iov_base = hdr, .iov_len = sizeof(hdr) };
	cover[1] = (struct iovec){ .iov_base = f->buf, .iov_len = PROTO_FIELD_HDR_LEN };
	cover[2] = (struct iovec){ .iov_base = f->buf + MAC_FIELD, .iov_len = f->len - MAC_FIELD };
	seal_init(&sh, KEY, !r->initiator);
	sh.tx = r->rx;
	seal_tag(&sh, cover, 3, f->buf + PROTO_FIELD_HDR_LEN);
	seal_end(&sh);
}

/* Whether f, unaltered, is the one r is due. */
static int due(const struct side *r, const struct frame *f)
{
	return f->from == (r->initiator ? 1 : 0) && f->num == r->rx;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *p = data, *end = data + size;
	struct side sides[2];
	struct frame f;

	side_open(&sides[0], true);
	side_open(&sides[1], false);
	for (int ops = 0; ops < MAX_OPS && p < end; ops++) {
		uint8_t o = *p++;
		struct side *s = &sides[o & 1], *r = &sides[!(o & 1)];
		bool use_last = o & 2;

		switch ((o >> 2) % 9) {
		case 0:         /* sealed, delivered */
			if (seal_one(s, &p, end, &f)) {
				deliver(r, &f, use_last, due(r, &f));
				frame_free(&f);
			}
			break;
		case 1:         /* sealed, altered on the way */
			if (seal_one(s, &p, end, &f)) {
				int model = due(r, &f);

				if (alter(&f, &p, end))
					model = 0;
				deliver(r, &f, use_last, model);
				frame_free(&f);
			}
			break;
		case 2:         /* sealed, dropped */
			if (seal_one(s, &p, end, &f))
				frame_free(&f);
			break;
		case 3:         /* raw bytes */
			raw_frame(&f, &p, end);
			deliver(r, &f, use_last, -1);
			frame_free(&f);
			break;
		case 4:         /* replayed */
			if (s->has_last)
				deliver(r, &s->last, use_last, due(r, &s->last));
			break;
		case 5:         /* reflected */
			if (r->has_last)
				deliver(r, &r->last, use_last, 0);
			break;
		case 6: {       /* nothing there */
			struct msg m;
			bool blocked = use_last ? r->rx_failed : r->dead != 0;
			int err = take(&p, end, 1) & 1 ? -ETIMEDOUT : -ENOTCONN, rc;

			r->inner->recv_err = err;
			rc = use_last ? r->x->ops->recv_last(r->x, &m, 0) : r->x->ops->recv(r->x, &m);
			if (rc != (blocked ? (use_last ? -ENOTCONN : r->dead) : err) || m.buf || m.len)
				abort();
			/* a timeout leaves the connection; recv_last never ends it */
			if (!blocked && !use_last && err != -ETIMEDOUT) {
				r->dead = err;
				r->rx_failed = true;
			}
			break;
		}
		case 7:         /* the next send fails */
			s->inner->fail_send = -EPIPE;
			break;
		default:        /* a key holder's frame */
			keyed_frame(r, &f, &p, end);
			deliver(r, &f, use_last, -1);
			frame_free(&f);
			break;
		}
	}
	side_close(&sides[0]);
	side_close(&sides[1]);
	return 0;
}
