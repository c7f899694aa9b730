/* The ports a training job needs, opened on one node and dialled from the
 * others: is each reachable, and if not, why?
 *
 * "listen" binds every port at once (on the wildcard address, as torchrun's
 * rendezvous and NCCL's bootstrap do) and a thread keeps accepting and
 * closing what connects, so that a large cluster's dials never overflow
 * the backlog and read as dropped. The ports are held until "release", the
 * session's end, or DR_LEASE_MS, whichever comes first: a doctor must
 * never keep a port a job is about to use.
 *
 * "dial" connects to each node's ports at once, non-blocking, and tells
 * the outcomes apart: connected (open), refused (RST or ICMP
 * port-unreachable: nothing listens, or a firewall rejects), no answer
 * within the timeout (a firewall drops), or no route.
 */
#include "daemon/doctor/dr_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/portlist.h"
#include "daemon/doctor/dr_local.h"
#include "daemon/repl/repl_impl.h"

#define DIAL_BATCH 256             /* sockets in flight at once */

static struct {
	pthread_mutex_t mu;
	int fds[PORTLIST_MAX];
	size_t n;
	int wake[2];                   /* a pipe: release ends the accepter */
	pthread_t thread;
	bool running;
} ls = { .mu = PTHREAD_MUTEX_INITIALIZER, .wake = { -1, -1 } };

static int listen_port(uint16_t port, int *out)
{
	struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_port = htons(port),
				   .sin6_addr = IN6ADDR_ANY_INIT };
	struct sockaddr_in a4 = { .sin_family = AF_INET, .sin_port = htons(port),
				  .sin_addr.s_addr = htonl(INADDR_ANY) };
	int one = 1, zero = 0, fd, rc;

	/* Both families on one socket where IPv6 exists, IPv4 alone where not. */
	fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd >= 0) {
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, (struct sockaddr *)&a6, sizeof(a6)) == 0)
			goto bound;
		rc = -errno;
		close(fd);
		if (rc == -EADDRINUSE)
			return rc;
	}
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&a4, sizeof(a4)) < 0) {
		rc = -errno;
		close(fd);
		return rc;
	}
bound:
	if (listen(fd, 128) < 0) {
		rc = -errno;
		close(fd);
		return rc;
	}
	*out = fd;
	return 0;
}

/* Accepts and closes until released or the lease runs out. */
static void *accepter(void *arg)
{
	int64_t until = mono_ms() + DR_LEASE_MS;
	struct pollfd pf[PORTLIST_MAX + 1];
	size_t n;

	pthread_mutex_lock(&ls.mu);
	n = ls.n;
	for (size_t i = 0; i < n; i++)
		pf[i] = (struct pollfd){ .fd = ls.fds[i], .events = POLLIN };
	pf[n] = (struct pollfd){ .fd = ls.wake[0], .events = POLLIN };
	pthread_mutex_unlock(&ls.mu);
	for (int64_t left; (left = until - mono_ms()) > 0;) {
		if (poll(pf, n + 1, (int)left) < 0 && errno != EINTR)
			break;
		if (pf[n].revents)
			break;
		for (size_t i = 0; i < n; i++) {
			int c;

			if (!pf[i].revents)
				continue;
			while ((c = accept4(pf[i].fd, NULL, NULL, SOCK_CLOEXEC)) >= 0)
				close(c);
		}
	}
	pthread_mutex_lock(&ls.mu);
	for (size_t i = 0; i < ls.n; i++)
		close(ls.fds[i]);
	ls.n = 0;
	pthread_mutex_unlock(&ls.mu);
	return NULL;
}

void dr_release(void)
{
	pthread_mutex_lock(&ls.mu);
	if (!ls.running) {
		pthread_mutex_unlock(&ls.mu);
		return;
	}
	ls.running = false;
	pthread_mutex_unlock(&ls.mu);
	if (write(ls.wake[1], "x", 1) < 0)
		log_warn("doctor: cannot wake the port accepter: %s", strerror(errno));
	pthread_join(ls.thread, NULL);
	close(ls.wake[0]);
	close(ls.wake[1]);
	ls.wake[0] = ls.wake[1] = -1;
}

int dr_listen(const struct msg *ask, struct msg *ans, char *why, size_t whylen)
{
	uint16_t ports[PORTLIST_MAX];
	char *list = NULL, name[32];
	size_t n = 0;
	int rc;

	dr_release();      /* one set of ports at a time */
	if (msg_get_str(ask, K_PORTS, &list) < 0 ||
	    portlist_parse(list, ports, PORTLIST_MAX, &n, why, whylen) < 0) {
		free(list);
		if (!why[0])
			snprintf(why, whylen, "a port list that does not parse");
		return -EINVAL;
	}
	free(list);
	if (pipe2(ls.wake, O_CLOEXEC) < 0) {
		snprintf(why, whylen, "pipe: %s", strerror(errno));
		return -errno;
	}
	pthread_mutex_lock(&ls.mu);
	for (size_t i = 0; i < n; i++) {
		char who[128];
		int fd = -1;

		snprintf(name, sizeof(name), "port.%u", ports[i]);
		rc = listen_port(ports[i], &fd);
		if (rc == 0) {
			ls.fds[ls.n++] = fd;
			dr_put(ans, name, "open");
		} else if (rc == -EADDRINUSE) {
			if (dr_port_owner(ports[i], who, sizeof(who)) < 0)
				snprintf(who, sizeof(who), "another process");
			dr_put(ans, name, "in-use|%s", who);
		} else {
			dr_put(ans, name, "error|%s", strerror(-rc));
		}
	}
	ls.running = pthread_create(&ls.thread, NULL, accepter, NULL) == 0;
	if (!ls.running) {
		for (size_t i = 0; i < ls.n; i++)
			close(ls.fds[i]);
		ls.n = 0;
		close(ls.wake[0]);
		close(ls.wake[1]);
		ls.wake[0] = ls.wake[1] = -1;
	}
	pthread_mutex_unlock(&ls.mu);
	if (!ls.running) {
		snprintf(why, whylen, "no thread to hold the ports open");
		return -EAGAIN;
	}
	return 0;
}

struct dial {
	int fd;
	const char *state;             /* NULL while connecting */
	char name[300];
};

static void dial_start(struct dial *d, const struct host *h, uint16_t port)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
	char svc[8];

	d->fd = -1;
	snprintf(svc, sizeof(svc), "%u", port);
	if (getaddrinfo(h->host, svc, &hints, &ai) != 0 || !ai) {
		d->state = "unreachable|cannot resolve the host";
		return;
	}
	d->fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (d->fd < 0)
		d->state = "error|no socket";
	else if (connect(d->fd, ai->ai_addr, ai->ai_addrlen) == 0)
		d->state = "open";
	else if (errno != EINPROGRESS)
		d->state = errno == ECONNREFUSED ? "refused" :
			   errno == EHOSTUNREACH || errno == ENETUNREACH ? "unreachable" : "error";
	freeaddrinfo(ai);
}

static const char *dial_outcome(int fd)
{
	int err = 0;
	socklen_t len = sizeof(err);

	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
		err = errno;
	return err == 0 ? "open" : err == ECONNREFUSED ? "refused" :
	       err == EHOSTUNREACH || err == ENETUNREACH ? "unreachable" :
	       err == ETIMEDOUT ? "dropped" : "error";
}

static void dial_batch(struct dial *d, size_t n, int timeout_ms)
{
	struct pollfd pf[DIAL_BATCH];
	int64_t until = mono_ms() + timeout_ms;
	size_t open_n;

	for (;;) {
		int64_t left = until - mono_ms();

		open_n = 0;
		for (size_t i = 0; i < n; i++)
			if (!d[i].state)
				pf[open_n++] = (struct pollfd){ .fd = d[i].fd, .events = POLLOUT };
		if (!open_n || left <= 0)
			break;
		if (poll(pf, open_n, (int)left) < 0 && errno != EINTR)
			break;
		for (size_t i = 0, k = 0; i < n; i++) {
			if (d[i].state)
				continue;
			if (pf[k].revents)
				d[i].state = dial_outcome(d[i].fd);
			k++;
		}
	}
	for (size_t i = 0; i < n; i++) {
		if (!d[i].state)
			d[i].state = "dropped";   /* no answer at all within the time */
		if (d[i].fd >= 0)
			close(d[i].fd);
	}
}

int dr_dial(const struct msg *ask, struct msg *ans, char *why, size_t whylen)
{
	uint16_t ports[PORTLIST_MAX];
	struct dial *d = calloc(DIAL_BATCH, sizeof(*d));
	char *list = NULL, node[256];
	uint64_t timeout = 1000;
	size_t np = 0, nd = 0, off = 0, len;
	const uint8_t *p;
	uint16_t key;

	if (!d)
		return -ENOMEM;
	msg_get_u64(ask, K_SIZE, &timeout);
	if (timeout > 10000)
		timeout = 10000;
	if (msg_get_str(ask, K_PORTS, &list) < 0 ||
	    portlist_parse(list, ports, PORTLIST_MAX, &np, why, whylen) < 0) {
		free(list);
		free(d);
		if (!why[0])
			snprintf(why, whylen, "a port list that does not parse");
		return -EINVAL;
	}
	free(list);
	while (msg_next_field(ask, &off, &key, &p, &len) == 1) {
		ssize_t h;

		if (key != K_HOLDER || len >= sizeof(node))
			continue;
		memcpy(node, p, len);
		node[len] = '\0';
		h = repl.cluster ? hosts_find(&repl.hosts, node) : -1;
		for (size_t i = 0; i < np; i++) {
			struct dial *x = &d[nd];

			memset(x, 0, sizeof(*x));
			snprintf(x->name, sizeof(x->name), "dial.%s.%u", node, ports[i]);
			if (h < 0) {
				x->fd = -1;
				x->state = "unreachable|not in this node's hosts file";
			} else {
				dial_start(x, &repl.hosts.v[h], ports[i]);
			}
			if (++nd == DIAL_BATCH) {
				dial_batch(d, nd, (int)timeout);
				for (size_t k = 0; k < nd; k++)
					dr_put(ans, d[k].name, "%s", d[k].state);
				nd = 0;
			}
		}
	}
	dial_batch(d, nd, (int)timeout);
	for (size_t k = 0; k < nd; k++)
		dr_put(ans, d[k].name, "%s", d[k].state);
	free(d);
	return 0;
}
