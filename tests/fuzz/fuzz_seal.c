/* libFuzzer target: the check of a sealed frame (daemon/net/xport_seal.c), the
 * first thing that reads a peer's bytes after the handshake, on both wires.
 *
 * Two sealed connections, an initiator and a responder with one fixed key,
 * each over an in-memory inner transport that hands its sealed wrapper the
 * frame we choose, as TCP would after decoding the header. The first input
 * byte picks the wire of the whole run (bit 0: 0 authenticated, 1
 * encrypted). The rest is a sequence of operations (up to MAX_OPS), each
 * one byte (bit 0: which side sends, bit 1: receive with recv_last rather
 * than recv, bits 2-7 modulo 9: what) and its arguments:
 *   0 a frame built from the input (type, flags, fields, maybe a tail, maybe
 *     one byte too big or exactly as big as a frame can be) is sealed by
 *     one side and delivered intact to the other,
 *   1 the same, altered on the way (bits flipped in type, flags or
 *     payload, the payload cut short or extended), chosen by the input,
 *   2 the same, dropped on the way,
 *   3 raw bytes from the input delivered as a frame (type, flags, payload),
 *   4 the last frame the side sent delivered again (a replay),
 *   5 the last frame the receiving side itself sent delivered back to it,
 *   6 a receive with nothing there (a clean close or a timeout),
 *   7 the next send of the side's inner transport fails,
 *   8 raw bytes as in 3, but sealed by a key holder whatever their field
 *     headers say: bytes 8..23 of the payload (where the tag goes) become
 *     the right tag; on an encrypted wire the bytes after the headers are
 *     the plaintext the key holder chose, and are sent encrypted. So the
 *     checks of the field headers are seen to hold after a valid tag too.
 * The harness keeps its own model of both directions' frame numbers and of
 * which side is dead, and checks every frame against an oracle written from
 * the protocol (docs/PROTOCOL.md, "Frames after the handshake"; common/
 * seal.h), apart from the wrapper. The payload of a sealed frame is K_MAC
 * (16 bytes, the tag) first, then
 *   authenticated: the fields as they are; the tag is over the header (its
 *     length counting K_MAC), K_MAC's field header and the fields;
 *   encrypted: one K_SEALED field holding the fields encrypted; the header
 *     and the two field headers are additional data;
 * AES-256-GCM at the number the receiver is due, the nonce = direction (u32
 * LE: 1 initiator to responder, 2 back) || number (u64 LE). The oracle asks
 * an independent seal (common/seal.c, with the sender's role for a tag on
 * the authenticated wire, with the receiver's for seal_check on the
 * encrypted one) set to that number, and checks that what it says agrees
 * with AES-256-GCM done here straight with OpenSSL from that description.
 * Every frame a side seals must be exactly the bytes the description gives
 * for its plaintext; the wrapper must agree with the oracle on every frame,
 * give back exactly the plaintext that was sealed, refuse every altered,
 * dropped-before, replayed or reflected frame, and stay dead after a
 * refusal. Every frame is its own allocation of exactly its length, so ASan
 * sees any read past it; every seal set up here is ended (LeakSanitizer). */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "common/proto.h"
#include "common/seal.h"
#include "daemon/net/xport_seal.h"

#define MAC_FIELD (PROTO_FIELD_HDR_LEN + SEAL_TAG_BYTES)
#define SEALED_HEAD (MAC_FIELD + PROTO_FIELD_HDR_LEN)   /* K_MAC, K_SEALED's header */
#define MAX_OPS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint8_t KEY[SEAL_KEY_BYTES] = "fuzz_seal: one fixed session k.";

/* The wire of this run. */
static enum seal_wire wire;

#define CHECK(cond)                                                                        \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "fuzz_seal (%s wire): %s:%d: %s\n",                \
				wire == SEAL_ENCRYPTED ? "encrypted" : "authenticated",    \
				__FILE__, __LINE__, #cond);                                \
			abort();                                                           \
		}                                                                          \
	} while (0)

/* A frame as an inner transport delivers it: the header decoded, then the
 * payload. */
struct frame {
	uint16_t type, flags;
	uint8_t *buf;           /* exactly len bytes; NULL when len is 0 */
	size_t len;
	int from;               /* the side that sealed it, or -1 */
	uint64_t num;           /* its number in that side's direction */
	uint8_t *plain;         /* what was sealed (plen bytes), when known */
	size_t plen;
	bool has_plain;
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

/* n bytes of their own (at least one), a copy of p[0..n) unless p is NULL. */
static void *dup_bytes(const void *p, size_t n)
{
	void *q = malloc(n ? n : 1);

	if (!q)
		abort();
	if (p && n)
		memcpy(q, p, n);
	return q;
}

static void frame_free(struct frame *f)
{
	free(f->buf);
	free(f->plain);
	f->buf = f->plain = NULL;
	f->len = f->plen = 0;
	f->has_plain = false;
}

static void frame_copy(struct frame *to, const struct frame *f)
{
	*to = *f;
	to->buf = f->len ? dup_bytes(f->buf, f->len) : NULL;
	to->plain = f->has_plain ? dup_bytes(f->plain, f->plen) : NULL;
}

static void set_plain(struct frame *f, const uint8_t *p, size_t n)
{
	free(f->plain);
	f->plain = dup_bytes(p, n);
	f->plen = n;
	f->has_plain = true;
}

/* ---- the protocol, from its description ---- */

static void put_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* "STG1" | u16 type | u16 flags | u32 length | u32 0, little-endian */
static void cover_hdr(uint8_t hdr[PROTO_HDR_LEN], uint16_t type, uint16_t flags, size_t len)
{
	memcpy(hdr, "STG1", 4);
	put_le(hdr + 4, type, 2);
	put_le(hdr + 6, flags, 2);
	put_le(hdr + 8, (uint32_t)len, 4);
	put_le(hdr + 12, 0, 4);
}

/* u16 key | u16 0 | u32 length, little-endian */
static void field_hdr(uint8_t p[PROTO_FIELD_HDR_LEN], uint16_t key, uint32_t len)
{
	put_le(p, key, 2);
	put_le(p + 2, 0, 2);
	put_le(p + 4, len, 4);
}

/* Bytes of the payload before the sealed body, on this run's wire. */
static size_t head_len(void)
{
	return wire == SEAL_ENCRYPTED ? SEALED_HEAD : MAC_FIELD;
}

/* AES-256-GCM under KEY, straight from OpenSSL: nonce dir (u32 LE) || num
 * (u64 LE), additional data aad[0..na), then in[0..n): more additional data
 * on an authenticated wire, encrypted (enc) or decrypted into out on an
 * encrypted one. enc: writes the tag, true. Else: whether tag verifies. */
static bool spec_gcm(bool enc, uint32_t dir, uint64_t num, const uint8_t *aad, size_t na,
		     const uint8_t *in, size_t n, uint8_t *out, uint8_t tag[SEAL_TAG_BYTES])
{
	EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
	uint8_t iv[12], fin[16];
	int got;
	bool ok;

	CHECK(c);
	put_le(iv, dir, 4);
	put_le(iv + 4, num, 8);
	CHECK(EVP_CipherInit_ex(c, EVP_aes_256_gcm(), NULL, NULL, NULL, enc) == 1);
	CHECK(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_IVLEN, sizeof(iv), NULL) == 1);
	CHECK(EVP_CipherInit_ex(c, NULL, NULL, KEY, iv, enc) == 1);
	CHECK(na == 0 || EVP_CipherUpdate(c, NULL, &got, aad, (int)na) == 1);
	if (n && wire == SEAL_AUTHENTICATED)
		CHECK(EVP_CipherUpdate(c, NULL, &got, in, (int)n) == 1);
	else if (n)
		CHECK(EVP_CipherUpdate(c, out, &got, in, (int)n) == 1 && (size_t)got == n);
	if (enc) {
		CHECK(EVP_CipherFinal_ex(c, fin, &got) == 1 && got == 0);
		CHECK(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, SEAL_TAG_BYTES, tag) == 1);
		ok = true;
	} else {
		CHECK(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, SEAL_TAG_BYTES, tag) == 1);
		ok = EVP_CipherFinal_ex(c, fin, &got) == 1;
	}
	EVP_CIPHER_CTX_free(c);
	return ok;
}

/* The additional data the description gives a frame: its header, K_MAC's
 * field header and, on the encrypted wire, K_SEALED's. */
static void spec_aad(uint8_t *aad, const uint8_t hdr[PROTO_HDR_LEN], const struct frame *f)
{
	memcpy(aad, hdr, PROTO_HDR_LEN);
	memcpy(aad + PROTO_HDR_LEN, f->buf, PROTO_FIELD_HDR_LEN);
	if (wire == SEAL_ENCRYPTED)
		memcpy(aad + PROTO_HDR_LEN + PROTO_FIELD_HDR_LEN, f->buf + MAC_FIELD,
		       PROTO_FIELD_HDR_LEN);
}

/* The sealed frame that carries plain[0..n) from the side sender_ini (the
 * initiator or not) as its frame number num: *f gets its payload, made with
 * an independent seal and checked against spec_gcm. */
static void model_seal(bool sender_ini, uint64_t num, uint16_t type, uint16_t flags,
		       const uint8_t *plain, size_t n, struct frame *f)
{
	size_t at = head_len(), len = at + n;
	uint8_t hdr[PROTO_HDR_LEN], aad[PROTO_HDR_LEN + 2 * PROTO_FIELD_HDR_LEN];
	uint8_t tag[SEAL_TAG_BYTES];
	struct iovec head[3], body;
	uint8_t *out;
	struct seal sh;
	int nh = 2;

	*f = (struct frame){ .type = type, .flags = flags, .from = -1 };
	f->buf = dup_bytes(NULL, len);
	f->len = len;
	field_hdr(f->buf, K_MAC, SEAL_TAG_BYTES);
	if (wire == SEAL_ENCRYPTED)
		field_hdr(f->buf + MAC_FIELD, K_SEALED, (uint32_t)n);
	cover_hdr(hdr, type, flags, len);
	head[0] = (struct iovec){ .iov_base = hdr, .iov_len = sizeof(hdr) };
	head[1] = (struct iovec){ .iov_base = f->buf, .iov_len = PROTO_FIELD_HDR_LEN };
	if (wire == SEAL_ENCRYPTED)
		head[nh++] = (struct iovec){ .iov_base = f->buf + MAC_FIELD,
					     .iov_len = PROTO_FIELD_HDR_LEN };
	body = (struct iovec){ .iov_base = (void *)plain, .iov_len = n };
	out = f->buf + at;
	if (wire == SEAL_AUTHENTICATED && n)
		memcpy(out, plain, n);
	CHECK(seal_init(&sh, KEY, sender_ini, wire) == 0);
	sh.tx = num;
	CHECK(seal_tag(&sh, head, nh, &body, 1, wire == SEAL_ENCRYPTED ? &out : NULL,
		       f->buf + PROTO_FIELD_HDR_LEN) == 0);
	seal_end(&sh);
	/* and the description, straight */
	spec_aad(aad, hdr, f);
	{
		uint8_t *ct = dup_bytes(NULL, n);

		spec_gcm(true, sender_ini ? 1 : 2, num, aad, PROTO_HDR_LEN + (size_t)(nh - 1) * 8,
			 plain, n, ct, tag);
		CHECK(memcmp(tag, f->buf + PROTO_FIELD_HDR_LEN, SEAL_TAG_BYTES) == 0);
		CHECK(wire == SEAL_AUTHENTICATED || n == 0 || memcmp(ct, out, n) == 0);
		free(ct);
	}
	set_plain(f, plain, n);
}

/* Whether r must take f as the next frame it is due: and then *plain (to be
 * freed) is what f carries, plen bytes. */
static bool oracle(const struct side *r, const struct frame *f, uint8_t **plain, size_t *plen)
{
	uint8_t fhdr[PROTO_FIELD_HDR_LEN], hdr[PROTO_HDR_LEN];
	uint8_t aad[PROTO_HDR_LEN + 2 * PROTO_FIELD_HDR_LEN], tag[SEAL_TAG_BYTES];
	size_t at = head_len(), n;
	struct iovec head[3], body;
	uint8_t *copy, *spec;
	uint32_t dir = r->initiator ? 2 : 1;    /* the other side's direction */
	struct seal sh;
	bool ok, spec_ok;
	int nh = 2;

	*plain = NULL;
	*plen = 0;
	field_hdr(fhdr, K_MAC, SEAL_TAG_BYTES);
	if (f->len < MAC_FIELD || memcmp(f->buf, fhdr, sizeof(fhdr)) != 0)
		return false;
	if (wire == SEAL_ENCRYPTED) {
		if (f->len < SEALED_HEAD)
			return false;
		field_hdr(fhdr, K_SEALED, (uint32_t)(f->len - SEALED_HEAD));
		if (memcmp(f->buf + MAC_FIELD, fhdr, sizeof(fhdr)) != 0)
			return false;
	}
	n = f->len - at;
	cover_hdr(hdr, f->type, f->flags, f->len);
	head[0] = (struct iovec){ .iov_base = hdr, .iov_len = sizeof(hdr) };
	head[1] = (struct iovec){ .iov_base = f->buf, .iov_len = PROTO_FIELD_HDR_LEN };
	if (wire == SEAL_ENCRYPTED)
		head[nh++] = (struct iovec){ .iov_base = f->buf + MAC_FIELD,
					     .iov_len = PROTO_FIELD_HDR_LEN };
	copy = dup_bytes(f->buf + at, n);
	if (wire == SEAL_AUTHENTICATED) {
		/* the tag the sender would give it */
		body = (struct iovec){ .iov_base = copy, .iov_len = n };
		CHECK(seal_init(&sh, KEY, !r->initiator, wire) == 0);
		sh.tx = r->rx;
		CHECK(seal_tag(&sh, head, nh, &body, 1, NULL, tag) == 0);
		ok = memcmp(tag, f->buf + PROTO_FIELD_HDR_LEN, SEAL_TAG_BYTES) == 0;
	} else {
		/* what the receiver's own seal says of it */
		CHECK(seal_init(&sh, KEY, r->initiator, wire) == 0);
		sh.rx = r->rx;
		ok = seal_check(&sh, head, nh, copy, n, f->buf + PROTO_FIELD_HDR_LEN) == 0;
		CHECK(sh.rx == r->rx + ok);
	}
	seal_end(&sh);
	/* and the description, straight */
	spec_aad(aad, hdr, f);
	spec = dup_bytes(NULL, n);
	memcpy(tag, f->buf + PROTO_FIELD_HDR_LEN, SEAL_TAG_BYTES);
	spec_ok = spec_gcm(false, dir, r->rx, aad, PROTO_HDR_LEN + (size_t)(nh - 1) * 8,
			   f->buf + at, n, spec, tag);
	CHECK(spec_ok == ok);
	CHECK(!ok || wire == SEAL_AUTHENTICATED || n == 0 || memcmp(spec, copy, n) == 0);
	free(spec);
	if (!ok) {
		free(copy);
		return false;
	}
	*plain = copy;
	*plen = n;
	return true;
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
	CHECK(proto_decode_hdr(hdr, &type, &flags, &len) == 0);
	frame_free(&k->out);
	k->out = (struct frame){ .type = type, .flags = flags, .len = len, .from = -1 };
	if (len)
		k->out.buf = dup_bytes(NULL, len);
	for (int i = 1; i < niov; i++) {
		CHECK(off + iov[i].iov_len <= len);
		memcpy(k->out.buf + off, iov[i].iov_base, iov[i].iov_len);
		off += iov[i].iov_len;
	}
	/* what goes out is a frame any receiver takes (msg_recv checks it) */
	CHECK(off == len && proto_check_payload(k->out.buf, len) == 0);
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
	struct xport *x;

	if (!k)
		abort();
	k->base.ops = &mock_ops;
	strcpy(k->base.peer, initiator ? "responder:1" : "initiator:2");
	*s = (struct side){ .inner = k, .initiator = initiator };
	/* no such wire: refused, the inner one untouched (and nothing leaks) */
	x = &k->base;
	CHECK(xport_seal(&x, KEY, initiator, (enum seal_wire)0) == -EINVAL && x == &k->base);
	CHECK(xport_seal(&x, KEY, initiator, (enum seal_wire)3) == -EINVAL && x == &k->base);
	CHECK(xport_seal(&x, KEY, initiator, wire) == 0 && x != &k->base);
	s->x = x;
	CHECK(strcmp(x->ops->name, "fuzz") == 0 && strcmp(x->peer, k->base.peer) == 0 &&
	      x->ops->set_timeout(x, 1000) == 0 && x->ops->queued(x) == 0);
}

static void side_close(struct side *s)
{
	s->x->ops->shutdown(s->x);
	s->x->ops->close(s->x);
	frame_free(&s->last);
}

/* ---- the operations ---- */

/* Delivers f to r. model: 1 it must pass, 0 it must fail, -1 the oracle
 * alone says (raw bytes). */
static void deliver(struct side *r, const struct frame *f, bool use_last, int model)
{
	struct msg m;
	bool blocked = use_last ? r->rx_failed : r->dead != 0;
	uint8_t *plain;
	size_t plen;
	bool want = oracle(r, f, &plain, &plen);
	int rc;

	CHECK(model < 0 || want == (model == 1));
	/* what was sealed is what the oracle reads */
	CHECK(!want || !f->has_plain ||
	      (plen == f->plen && (plen == 0 || memcmp(plain, f->plain, plen) == 0)));
	/* On the encrypted wire the transport could check only the two outer
	 * fields: the decrypted payload is held to the framing rules there, as
	 * a plain one was on its way in (docs/PROTOCOL.md, "Validity"). */
	if (want && wire == SEAL_ENCRYPTED && proto_check_payload(plain, plen) < 0)
		want = false;
	want = want && !blocked;
	frame_free(&r->inner->in);
	frame_copy(&r->inner->in, f);
	r->inner->has_in = true;
	rc = use_last ? r->x->ops->recv_last(r->x, &m, 0) : r->x->ops->recv(r->x, &m);
	if (blocked) {
		CHECK(rc == (use_last ? -ENOTCONN : r->dead) && !m.buf && !m.len);
	} else if (want) {
		CHECK(rc == 0 && m.type == f->type && m.flags == f->flags && m.len == plen &&
		      (m.len == 0 || memcmp(m.buf, plain, m.len) == 0));
		r->rx++;
	} else {
		CHECK(rc == -EBADMSG && !m.buf && !m.len);
		if (!r->dead)   /* the first failure is the one kept */
			r->dead = -EBADMSG;
		r->rx_failed = true;
	}
	free(plain);
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
	size_t tn = 0, total, body, off = 0;
	uint32_t sel;
	struct msg m;
	int nf, rc, want, niov, armed;
	uint8_t *plain;
	struct frame exp;

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
	if (sel == 0xff || sel == 0xfd) {
		/* one byte too big once sealed (refused, not counted), or
		 * exactly as big as a frame can be */
		tail = huge;
		tn = PROTO_MAX_PAYLOAD - head_len() - m.len - PROTO_FIELD_HDR_LEN +
		     (sel == 0xff);
	} else if (sel == 0xfe) {
		m.err = -ENOMEM;        /* a put that failed */
	} else if (sel & 1) {
		tn = take(p, end, 2) % 1024;
		if (tn > (size_t)(end - *p))
			tn = (size_t)(end - *p);
		tail = *p;
		*p += tn;
	}
	CHECK(!m.err || sel == 0xfe);
	body = m.len + (tail ? PROTO_FIELD_HDR_LEN + tn : 0);
	total = head_len() + body;

	armed = s->inner->fail_send;
	if (!tail && (sel & 2))
		rc = s->x->ops->send(s->x, &m);
	else
		rc = s->x->ops->send_tail(s->x, &m, K_DATA, tail, tn);
	/* dead either way (a failed send or a failed receive): refused first */
	want = s->dead;
	if (want) {
		CHECK(s->inner->fail_send == armed);
	} else if (m.err) {
		want = m.err;
	} else if (total > PROTO_MAX_PAYLOAD) {
		want = -E2BIG;  /* refused before its number is used */
	} else if (armed) {
		want = armed;
		s->tx++;        /* its number is used up */
		s->dead = want;
	}
	CHECK(rc == want && (!rc || !s->inner->has_out));
	if (rc) {
		msg_free(&m);
		return 0;
	}
	CHECK(s->inner->has_out);
	*f = s->inner->out;
	s->inner->out = (struct frame){ .from = -1 };
	s->inner->has_out = false;
	f->from = s->initiator ? 0 : 1;
	f->num = s->tx++;
	/* the caller's bytes, as the plain transport would have sent them */
	niov = msg_frame_iov(&m, K_DATA, tail, tn, hdr, fhdr, iov);
	CHECK(niov >= 0);
	plain = dup_bytes(NULL, body);
	for (int i = 1; i < niov; i++) {
		CHECK(off + iov[i].iov_len <= body);
		memcpy(plain + off, iov[i].iov_base, iov[i].iov_len);
		off += iov[i].iov_len;
	}
	CHECK(off == body);
	/* what went out is exactly the sealed frame the description gives */
	model_seal(s->initiator, f->num, m.type, m.flags, plain, body, &exp);
	CHECK(f->type == exp.type && f->flags == exp.flags && f->len == total &&
	      f->len == exp.len && memcmp(f->buf, exp.buf, f->len) == 0);
	frame_free(&exp);
	set_plain(f, plain, body);
	free(plain);
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
	if (n)
		f->buf = dup_bytes(*p, n);
	f->len = n;
	*p += n;
}

/* Raw bytes, sealed as the peer of r would seal them for the number r is
 * due (case 8): a key holder's frame, well formed or not. The field
 * headers are whatever the input says (K_MAC's first 8 bytes, on an
 * encrypted wire K_SEALED's 8 after the tag when there is room); the tag
 * goes in bytes 8..23; the rest is the plaintext the key holder chose, sent
 * as it is or encrypted in place. */
static void keyed_frame(const struct side *r, struct frame *f, const uint8_t **p,
			const uint8_t *end)
{
	uint8_t hdr[PROTO_HDR_LEN];
	struct iovec head[3], body;
	size_t at = MAC_FIELD;
	uint8_t *out;
	struct seal sh;
	int nh = 2;

	raw_frame(f, p, end);
	if (f->len < MAC_FIELD)
		return;
	if (wire == SEAL_ENCRYPTED && f->len >= SEALED_HEAD)
		at = SEALED_HEAD;
	cover_hdr(hdr, f->type, f->flags, f->len);
	head[0] = (struct iovec){ .iov_base = hdr, .iov_len = sizeof(hdr) };
	head[1] = (struct iovec){ .iov_base = f->buf, .iov_len = PROTO_FIELD_HDR_LEN };
	if (at == SEALED_HEAD)
		head[nh++] = (struct iovec){ .iov_base = f->buf + MAC_FIELD,
					     .iov_len = PROTO_FIELD_HDR_LEN };
	out = f->buf + at;
	body = (struct iovec){ .iov_base = out, .iov_len = f->len - at };
	set_plain(f, out, f->len - at);
	CHECK(seal_init(&sh, KEY, !r->initiator, wire) == 0);
	sh.tx = r->rx;
	CHECK(seal_tag(&sh, head, nh, &body, 1, wire == SEAL_ENCRYPTED ? &out : NULL,
		       f->buf + PROTO_FIELD_HDR_LEN) == 0);
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

	if (size < 1)
		return 0;
	wire = *p++ & 1 ? SEAL_ENCRYPTED : SEAL_AUTHENTICATED;
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
			CHECK(rc == (blocked ? (use_last ? -ENOTCONN : r->dead) : err) && !m.buf &&
			      !m.len);
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
