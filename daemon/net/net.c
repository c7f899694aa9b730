/* Which transports this node speaks, their listeners, and connecting to a
 * peer (net.h).
 *
 * The transports are a table in order of preference (xport.h); none of
 * this knows what they are. transport = auto uses every one whose
 * `available` says yes, trying them in order when connecting and falling
 * back to the next (the last, TCP, is always there); a named transport is
 * the only one used, and one that is not available is a start-up error.
 * Each used transport listens on node.listen; with more than one, their
 * fds go into an epoll set, so the daemon's event loop still polls one fd.
 */
#include "daemon/net/net.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "common/log.h"

static const struct xport_ops *const all[] = { &xport_rdma_ops, &xport_tcp_ops };
#define NX (sizeof(all) / sizeof(all[0]))

static struct {
	const struct xport_ops *use[NX];     /* allowed and available, in order */
	size_t nuse;
	char why[NX][512];                   /* per transport of `all`: why not, or what */
	struct xport_listener *l[NX];        /* by index in use */
	int fd[NX];
	size_t nl;
	int epfd;
} net;

static bool allowed(int mode, const struct xport_ops *t)
{
	return mode == CFG_TRANSPORT_AUTO || strcmp(t->name, mode == CFG_TRANSPORT_RDMA ?
						      "rdma" : "tcp") == 0;
}

static void drop(size_t u)
{
	memmove(&net.use[u], &net.use[u + 1], (net.nuse - u - 1) * sizeof(net.use[0]));
	net.nuse--;
}

static int listen_all(const struct stage_config *cfg, char *why, size_t whylen)
{
	char host[256], w[512];
	uint16_t port;
	const char *e;

	if (config_parse_hostport(cfg->listen, host, sizeof(host), &port, &e) < 0) {
		snprintf(why, whylen, "node.listen '%s': %s", cfg->listen, e);
		return -EINVAL;
	}
	for (size_t u = 0; u < net.nuse; ) {
		int rc = net.use[u]->listen(host, port, &net.l[net.nl], &net.fd[net.nl], w,
					    sizeof(w));

		if (rc == 0) {
			net.nl++;
			u++;
			continue;
		}
		/* auto goes on without a transport that cannot listen, unless
		 * it is the last one */
		if (cfg->transport != CFG_TRANSPORT_AUTO || net.nuse == 1) {
			snprintf(why, whylen, "%s", w);
			return rc;
		}
		log_warn("%s; not using %s", w, net.use[u]->name);
		for (size_t i = 0; i < NX; i++)
			if (all[i] == net.use[u])
				snprintf(net.why[i], sizeof(net.why[i]), "%s", w);
		drop(u);
	}
	if (net.nl > 1) {
		net.epfd = epoll_create1(EPOLL_CLOEXEC);
		for (size_t i = 0; net.epfd >= 0 && i < net.nl; i++) {
			struct epoll_event ev = { .events = EPOLLIN, .data.u32 = (uint32_t)i };

			if (epoll_ctl(net.epfd, EPOLL_CTL_ADD, net.fd[i], &ev) < 0) {
				close(net.epfd);
				net.epfd = -1;
			}
		}
		if (net.epfd < 0) {
			snprintf(why, whylen, "epoll: %s", strerror(errno));
			return -errno;
		}
	}
	return 0;
}

int net_open(const struct stage_config *cfg, bool listen, char *why, size_t whylen)
{
	net.nuse = net.nl = 0;
	net.epfd = -1;
	for (size_t i = 0; i < NX; i++) {
		const struct xport_ops *t = all[i];

		if (!allowed(cfg->transport, t)) {
			snprintf(net.why[i], sizeof(net.why[i]), "not with transport = %s",
				 cfg->transport == CFG_TRANSPORT_TCP ? "tcp" : "rdma");
			continue;
		}
		if (t->available && t->available(net.why[i], sizeof(net.why[i])) < 0) {
			if (cfg->transport != CFG_TRANSPORT_AUTO) {
				snprintf(why, whylen, "transport = %s: %s", t->name, net.why[i]);
				return -ENODEV;
			}
			continue;
		}
		net.use[net.nuse++] = t;
	}
	if (net.nuse == 0) {
		snprintf(why, whylen, "no transport to use");
		return -ENODEV;
	}
	return listen ? listen_all(cfg, why, whylen) : 0;
}

void net_close(void)
{
	if (net.epfd >= 0)
		close(net.epfd);
	net.epfd = -1;
	for (size_t i = 0; i < net.nl; i++)
		net.use[i]->unlisten(net.l[i]);
	net.nl = 0;
}

int net_listen_fd(void)
{
	return net.nl > 1 ? net.epfd : net.nl ? net.fd[0] : -1;
}

void net_accept(int (*serve)(struct xport *x))
{
	for (size_t i = 0; i < net.nl; i++) {
		struct xport *x;

		while (net.use[i]->accept(net.l[i], &x) == 0)
			serve(x);
	}
}

int net_connect(const struct host *h, int timeout_ms, struct xport **x, char *why,
		 size_t whylen)
{
	char w[512] = "";
	int rc = -ENODEV;

	for (size_t u = 0; u < net.nuse; u++) {
		rc = net.use[u]->connect(h, timeout_ms, x, w, sizeof(w));
		if (rc == 0)
			return 0;
		if (u + 1 < net.nuse)
			log_info("peer %s: %s; trying %s", h->name, w, net.use[u + 1]->name);
	}
	snprintf(why, whylen, "%s", w);
	return rc;
}

void net_status(struct msg *m)
{
	char v[1024];
	size_t o = 0;

	for (size_t u = 0; u < net.nuse && o < sizeof(v); u++)
		o += (size_t)snprintf(v + o, sizeof(v) - o, "%s%s", u ? ", then " : "",
				      net.use[u]->name);
	for (size_t i = 0; i < NX && o < sizeof(v); i++) {
		bool used = false;

		for (size_t u = 0; u < net.nuse; u++)
			used |= net.use[u] == all[i];
		o += (size_t)snprintf(v + o, sizeof(v) - o, "; %s: %s", all[i]->name,
				      used && !all[i]->available ? "always" :
				      net.why[i][0] ? net.why[i] : "-");
	}
	msg_put_str(m, K_NAME, "transport");
	msg_put_str(m, K_VALUE, v);
}
