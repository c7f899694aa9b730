/* Framing: the wire format is in proto.h and docs/PROTOCOL.md.
 *
 * Integers are assembled byte by byte, so the code is the same on any host
 * and never reads unaligned. A received payload is checked whole before any
 * msg_get_* sees it; the getters still bound every read, so a msg built by
 * hand cannot make them run past its buffer either.
 */
#include "common/proto.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

static void put_le16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void put_le32(uint8_t *p, uint32_t v)
{
	put_le16(p, (uint16_t)v);
	put_le16(p + 2, (uint16_t)(v >> 16));
}

static void put_le64(uint8_t *p, uint64_t v)
{
	put_le32(p, (uint32_t)v);
	put_le32(p + 4, (uint32_t)(v >> 32));
}

static uint16_t get_le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t get_le32(const uint8_t *p)
{
	return get_le16(p) | (uint32_t)get_le16(p + 2) << 16;
}

uint64_t proto_get_le64(const uint8_t *p)
{
	return get_le32(p) | (uint64_t)get_le32(p + 4) << 32;
}

void proto_encode_hdr(uint8_t hdr[PROTO_HDR_LEN], uint16_t type, uint16_t flags, uint32_t len)
{
	memcpy(hdr, PROTO_MAGIC, 4);
	put_le16(hdr + 4, type);
	put_le16(hdr + 6, flags);
	put_le32(hdr + 8, len);
	put_le32(hdr + 12, 0);
}

void proto_encode_field_hdr(uint8_t p[PROTO_FIELD_HDR_LEN], uint16_t key, uint32_t len)
{
	put_le16(p, key);
	put_le16(p + 2, 0);
	put_le32(p + 4, len);
}

int proto_decode_hdr(const uint8_t hdr[PROTO_HDR_LEN], uint16_t *type, uint16_t *flags, uint32_t *len)
{
	uint32_t n = get_le32(hdr + 8);

	if (memcmp(hdr, PROTO_MAGIC, 4) != 0 || get_le32(hdr + 12) != 0 || n > PROTO_MAX_PAYLOAD)
		return -EBADMSG;
	*type = get_le16(hdr + 4);
	*flags = get_le16(hdr + 6);
	*len = n;
	return 0;
}

/* The field at *off of p[0..n): 1 and advances *off, 0 at the end, or
 * -EBADMSG if what is there is not a whole field. */
static int field_at(const uint8_t *p, size_t n, size_t *off, uint16_t *key,
		    const uint8_t **val, size_t *len)
{
	size_t o = *off, flen;

	if (o == n)
		return 0;
	if (o > n || n - o < PROTO_FIELD_HDR_LEN || get_le16(p + o + 2) != 0)
		return -EBADMSG;
	flen = get_le32(p + o + 4);
	if (flen > n - o - PROTO_FIELD_HDR_LEN)
		return -EBADMSG;
	*key = get_le16(p + o);
	*val = p + o + PROTO_FIELD_HDR_LEN;
	*len = flen;
	*off = o + PROTO_FIELD_HDR_LEN + flen;
	return 1;
}

int proto_check_payload(const uint8_t *p, size_t n)
{
	const uint8_t *val;
	size_t off = 0, len;
	uint16_t key;
	int rc;

	if (n > PROTO_MAX_PAYLOAD)
		return -EBADMSG;
	while ((rc = field_at(p, n, &off, &key, &val, &len)) > 0)
		;
	return rc;
}

int msg_next_field(const struct msg *m, size_t *off, uint16_t *key, const uint8_t **p, size_t *n)
{
	/* A malformed tail ends the walk: callers loop on "while (... > 0)". */
	return field_at(m->buf, m->len, off, key, p, n) > 0;
}

void msg_init(struct msg *m, uint16_t type)
{
	memset(m, 0, sizeof(*m));
	m->type = type;
}

void msg_free(struct msg *m)
{
	free(m->buf);
	m->buf = NULL;
	m->len = m->cap = 0;
	m->err = 0;
}

/* Room for one more field of n bytes; the pointer to write it at, or NULL
 * with m->err set (and then every later put is a no-op). */
static uint8_t *msg_reserve(struct msg *m, size_t n)
{
	size_t need, cap;
	uint8_t *nb;

	if (m->err)
		return NULL;
	if (n > PROTO_MAX_PAYLOAD - PROTO_FIELD_HDR_LEN ||
	    m->len > PROTO_MAX_PAYLOAD - PROTO_FIELD_HDR_LEN - n) {
		m->err = -E2BIG;
		return NULL;
	}
	need = m->len + PROTO_FIELD_HDR_LEN + n;
	if (need > m->cap) {
		cap = m->cap ? m->cap : 256;
		/* Powers of two from 256 meet PROTO_MAX_PAYLOAD exactly. */
		while (cap < need)
			cap *= 2;
		nb = realloc(m->buf, cap);
		if (!nb) {
			m->err = -ENOMEM;
			return NULL;
		}
		m->buf = nb;
		m->cap = cap;
	}
	return m->buf + m->len;
}

void msg_put_bytes(struct msg *m, uint16_t key, const void *p, size_t n)
{
	uint8_t *f = msg_reserve(m, n);

	if (!f)
		return;
	put_le16(f, key);
	put_le16(f + 2, 0);
	put_le32(f + 4, (uint32_t)n);
	if (n)
		memcpy(f + PROTO_FIELD_HDR_LEN, p, n);
	m->len += PROTO_FIELD_HDR_LEN + n;
}

void msg_put_u64(struct msg *m, uint16_t key, uint64_t v)
{
	uint8_t b[8];

	put_le64(b, v);
	msg_put_bytes(m, key, b, sizeof(b));
}

void msg_put_str(struct msg *m, uint16_t key, const char *s)
{
	msg_put_bytes(m, key, s, strlen(s));
}

void msg_put_pairf(struct msg *m, const char *name, const char *fmt, ...)
{
	char v[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(v, sizeof(v), fmt, ap);
	va_end(ap);
	msg_put_str(m, K_NAME, name);
	msg_put_str(m, K_VALUE, v);
}

int msg_get_bytes(const struct msg *m, uint16_t key, const uint8_t **p, size_t *n)
{
	size_t off = 0;
	uint16_t k;

	while (msg_next_field(m, &off, &k, p, n) > 0)
		if (k == key)
			return 0;
	return -ENOENT;
}

int msg_get_u64(const struct msg *m, uint16_t key, uint64_t *v)
{
	const uint8_t *p;
	size_t n;
	int rc = msg_get_bytes(m, key, &p, &n);

	if (rc)
		return rc;
	if (n != 8)
		return -EBADMSG;
	*v = proto_get_le64(p);
	return 0;
}

int msg_get_str(const struct msg *m, uint16_t key, char **out)
{
	const uint8_t *p;
	size_t n;
	char *s;
	int rc = msg_get_bytes(m, key, &p, &n);

	if (rc)
		return rc;
	if (memchr(p, '\0', n))
		return -EINVAL;
	s = malloc(n + 1);
	if (!s)
		return -ENOMEM;
	memcpy(s, p, n);
	s[n] = '\0';
	*out = s;
	return 0;
}

/* Reads exactly n bytes: n, or fewer at EOF, or -errno. */
static ssize_t read_full(int fd, void *buf, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = read(fd, (uint8_t *)buf + got, n - got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

int msg_recv_from(struct msg *m, msg_read_fn read, void *ctx)
{
	uint8_t hdr[PROTO_HDR_LEN], *buf = NULL;
	uint16_t type, flags;
	uint32_t len;
	int rc;

	memset(m, 0, sizeof(*m));
	rc = read(ctx, hdr, sizeof(hdr));
	if (rc == 0)
		rc = proto_decode_hdr(hdr, &type, &flags, &len);
	/* len <= PROTO_MAX_PAYLOAD: decode checked it before we trust it. */
	if (rc == 0 && len && !(buf = malloc(len)))
		rc = -ENOMEM;
	if (rc == 0 && len && (rc = read(ctx, buf, len)) == 0)
		rc = proto_check_payload(buf, len);
	if (rc) {
		free(buf);
		return rc;
	}
	m->type = type;
	m->flags = flags;
	m->buf = buf;
	m->len = m->cap = len;
	return 0;
}

struct fd_reader {
	int fd;
	bool any;               /* a byte of the frame came */
};

static int read_fd(void *ctx, uint8_t *p, size_t n)
{
	struct fd_reader *f = ctx;
	ssize_t r = read_full(f->fd, p, n);

	if (r < 0)
		return (int)r;
	if (r == 0 && !f->any)
		return -ENOTCONN;
	f->any = true;
	return r == (ssize_t)n ? 0 : -ECONNRESET;
}

int msg_recv(int fd, struct msg *m)
{
	struct fd_reader f = { .fd = fd };

	return msg_recv_from(m, read_fd, &f);
}

/* sendmsg so a vanished peer is -EPIPE, not SIGPIPE; plain writev for pipes
 * and files, which cannot take MSG_NOSIGNAL. */
static ssize_t send_iov(int fd, struct iovec *iov, int iovcnt, bool *not_sock)
{
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t)iovcnt };
	ssize_t r;

	if (!*not_sock) {
		r = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (r >= 0 || errno != ENOTSOCK)
			return r;
		*not_sock = true;
	}
	return writev(fd, iov, iovcnt);
}

/* Writes every iovec whole, resuming after short writes. 0 or -errno. */
static int send_all(int fd, struct iovec *v, int cnt)
{
	bool not_sock = false;

	while (cnt) {
		ssize_t r = send_iov(fd, v, cnt, &not_sock);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		/* Short write: drop what went, resume mid-iovec. */
		while (cnt && (size_t)r >= v->iov_len) {
			r -= (ssize_t)v->iov_len;
			v++;
			cnt--;
		}
		if (cnt) {
			v->iov_base = (uint8_t *)v->iov_base + r;
			v->iov_len -= (size_t)r;
		}
	}
	return 0;
}

int msg_frame_iov(const struct msg *m, uint16_t key, const void *tail, size_t n,
		  uint8_t hdr[PROTO_HDR_LEN], uint8_t fhdr[PROTO_FIELD_HDR_LEN], struct iovec iov[4])
{
	size_t total = m->len + (tail ? PROTO_FIELD_HDR_LEN + n : 0);
	int cnt = 0;

	if (m->err)
		return m->err;
	if (total > PROTO_MAX_PAYLOAD)
		return -E2BIG;
	proto_encode_hdr(hdr, m->type, m->flags, (uint32_t)total);
	iov[cnt++] = (struct iovec){ .iov_base = hdr, .iov_len = PROTO_HDR_LEN };
	if (m->len)
		iov[cnt++] = (struct iovec){ .iov_base = m->buf, .iov_len = m->len };
	if (tail) {
		proto_encode_field_hdr(fhdr, key, (uint32_t)n);
		iov[cnt++] = (struct iovec){ .iov_base = fhdr, .iov_len = PROTO_FIELD_HDR_LEN };
		if (n)
			iov[cnt++] = (struct iovec){ .iov_base = (void *)tail, .iov_len = n };
	}
	return cnt;
}

int msg_send_tail(int fd, const struct msg *m, uint16_t key, const void *tail, size_t n)
{
	uint8_t hdr[PROTO_HDR_LEN], fhdr[PROTO_FIELD_HDR_LEN];
	struct iovec iov[4];
	int cnt = msg_frame_iov(m, key, tail, n, hdr, fhdr, iov);

	return cnt < 0 ? cnt : send_all(fd, iov, cnt);
}

int msg_send(int fd, const struct msg *m)
{
	return msg_send_tail(fd, m, 0, NULL, 0);
}
