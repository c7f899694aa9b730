/* A connection that keeps what is sent on it (xport_capture.h). */
#include "daemon/net/xport_capture.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct capture {
	struct xport base;
	struct msg frames[CAPTURE_FRAMES_MAX];   /* sent, owned; [taken, n) not yet taken */
	size_t n, taken;
};

static const struct xport_ops capture_ops;

static int c_send_tail(struct xport *x, const struct msg *m, uint16_t key, const void *tail,
		       size_t n)
{
	struct capture *c = (struct capture *)x;
	struct msg *d;

	if (m->err)
		return m->err;
	if (c->n == CAPTURE_FRAMES_MAX)
		return -ENOBUFS;
	d = &c->frames[c->n];
	msg_init(d, m->type);
	d->flags = m->flags;
	if (m->len) {
		d->buf = malloc(m->len);
		if (!d->buf)
			return -ENOMEM;
		memcpy(d->buf, m->buf, m->len);
		d->len = d->cap = m->len;
	}
	if (tail)
		msg_put_bytes(d, key, tail, n);
	if (d->err) {
		int rc = d->err;

		msg_free(d);
		return rc;
	}
	c->n++;
	return 0;
}

static int c_send(struct xport *x, const struct msg *m)
{
	return c_send_tail(x, m, 0, NULL, 0);
}

static int c_recv(struct xport *x, struct msg *m)
{
	memset(m, 0, sizeof(*m));
	return -ENOTCONN;
}

static int c_recv_last(struct xport *x, struct msg *m, int timeout_ms)
{
	return c_recv(x, m);
}

static int c_set_timeout(struct xport *x, int timeout_ms)
{
	return 0;
}

static uint64_t c_queued(struct xport *x)
{
	return 0;
}

static void c_shutdown(struct xport *x)
{
}

static void c_close(struct xport *x)
{
	struct capture *c = (struct capture *)x;

	for (size_t i = c->taken; i < c->n; i++)
		msg_free(&c->frames[i]);
	free(c);
}

static const struct xport_ops capture_ops = {
	.name = "capture",
	.send = c_send,
	.send_tail = c_send_tail,
	.recv = c_recv,
	.recv_last = c_recv_last,
	.set_timeout = c_set_timeout,
	.queued = c_queued,
	.shutdown = c_shutdown,
	.close = c_close,
};

int xport_capture_open(struct xport **x, const char *peer)
{
	struct capture *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	c->base.ops = &capture_ops;
	snprintf(c->base.peer, sizeof(c->base.peer), "%s", peer);
	*x = &c->base;
	return 0;
}

int xport_capture_take(struct xport *x, struct msg *m)
{
	struct capture *c = (struct capture *)x;

	if (c->taken == c->n)
		return -ENOENT;
	*m = c->frames[c->taken++];
	return 0;
}
