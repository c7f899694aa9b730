/* The ports a training job needs, opened on one node and dialled from the
 * others: is each reachable, and if not, why?
 *
 * "listen" binds every port at once (on the wildcard address, as torchrun's
 * rendezvous and NCCL's bootstrap do) and a thread keeps accepting and
 * closing what connects, so that a large cluster's dials never overflow
 * the backlog and read as dropped. The ports are held until "release", the
 * session's end, or the lease, whichever comes first: a doctor must never
 * keep a port a job is about to use. The lease is DR_LEASE_MS, or longer
 * when the asker says its dials take longer (K_TIMEOUT_MS: a cluster asked
 * in rounds of [cluster] fanout nodes), DR_LISTEN_MAX_MS at most.
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
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/portlist.h"
#include "daemon/doctor/dr_local.h"
#include "daemon/peers/peers.h"
#include "daemon/repl/repl.h"

#define DIAL_MAX (DR_NODES_MAX * PORTLIST_MAX)   /* sockets of one question, all at once */

/* One listen's ports and the thread that holds them. The thread owns the
 * fds (it closes them when it ends); release wakes it, joins it, and frees
 * the rest. `ops` serialises listen and release, so one set is held at a
 * time and nothing of a set is touched once it is released. */
struct held {
	int fds[PORTLIST_MAX];
	size_t n;
	int64_t lease_ms;              /* how long at most, from the listen */
	int wake[2];                   /* a pipe: release ends the accepter */
	pthread_t thread;
};

static pthread_mutex_t ops = PTHREAD_MUTEX_INITIALIZER;
static struct held *cur;           /* under ops */

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

/* Accepts and closes until released or the lease runs out. (Closed, not
 * reset: a reset can reach the dialer before it has seen its connect
 * complete, and a dial that got through would read as failed.) */
static void *accepter(void *arg)
{
	struct held *h = arg;
	int64_t until = mono_ms() + h->lease_ms;
	struct pollfd pf[PORTLIST_MAX + 1];

	for (size_t i = 0; i < h->n; i++)
		pf[i] = (struct pollfd){ .fd = h->fds[i], .events = POLLIN };
	pf[h->n] = (struct pollfd){ .fd = h->wake[0], .events = POLLIN };
	for (int64_t left; (left = until - mono_ms()) > 0;) {
		if (poll(pf, h->n + 1, (int)left) < 0 && errno != EINTR)
			break;
		if (pf[h->n].revents)
			break;
		for (size_t i = 0; i < h->n; i++) {
			int c;

			if (!pf[i].revents)
				continue;
			while ((c = accept4(pf[i].fd, NULL, NULL, SOCK_CLOEXEC)) >= 0)
				close(c);
			if (errno == EMFILE || errno == ENFILE) {
				/* Out of fds: the connection waits; do not spin on it. */
				struct timespec ts = { .tv_nsec = 10000000 };

				nanosleep(&ts, NULL);
			}
		}
	}
	for (size_t i = 0; i < h->n; i++)
		close(h->fds[i]);
	return NULL;
}

/* Under ops. */
static void release_locked(void)
{
	struct held *h = cur;

	if (!h)
		return;
	cur = NULL;
	if (write(h->wake[1], "x", 1) < 0)
		log_warn("doctor: cannot wake the port accepter: %s", strerror(errno));
	pthread_join(h->thread, NULL);
	close(h->wake[0]);
	close(h->wake[1]);
	free(h);
}

void dr_release(void)
{
	pthread_mutex_lock(&ops);
	release_locked();
	pthread_mutex_unlock(&ops);
}

int dr_listen(const struct msg *ask, struct msg *ans, char *why, size_t whylen)
{
	uint16_t ports[PORTLIST_MAX];
	char *list = NULL, name[32];
	uint64_t lease;
	struct held *h;
	size_t n = 0;
	int rc = 0;

	if (msg_get_str(ask, K_PORTS, &list) < 0 ||
	    portlist_parse(list, ports, PORTLIST_MAX, &n, why, whylen) < 0) {
		free(list);
		if (!why[0])
			snprintf(why, whylen, "a port list that does not parse");
		return -EINVAL;
	}
	free(list);
	if (!(h = calloc(1, sizeof(*h))))
		return -ENOMEM;
	/* The asker's lease (its dials take rounds), within bounds: an older
	 * asker sends none. */
	h->lease_ms = DR_LEASE_MS;
	if (msg_get_u64(ask, K_TIMEOUT_MS, &lease) == 0 && lease > DR_LEASE_MS)
		h->lease_ms = lease < DR_LISTEN_MAX_MS ? (int64_t)lease : DR_LISTEN_MAX_MS;
	if (pipe2(h->wake, O_CLOEXEC) < 0) {
		rc = -errno;
		snprintf(why, whylen, "pipe: %s", strerror(errno));
		free(h);
		return rc;
	}
	pthread_mutex_lock(&ops);
	release_locked();      /* one set of ports at a time */
	for (size_t i = 0; i < n; i++) {
		char who[128];
		int fd = -1;

		snprintf(name, sizeof(name), "port.%u", ports[i]);
		rc = listen_port(ports[i], &fd);
		if (rc == 0) {
			h->fds[h->n++] = fd;
			msg_put_pairf(ans, name, "open");
		} else if (rc == -EADDRINUSE) {
			if (dr_port_owner(ports[i], who, sizeof(who)) < 0)
				snprintf(who, sizeof(who), "another process");
			msg_put_pairf(ans, name, "in-use|%s", who);
		} else {
			msg_put_pairf(ans, name, "error|%s", strerror(-rc));
		}
	}
	rc = pthread_create(&h->thread, NULL, accepter, h);
	if (rc == 0) {
		cur = h;
	} else {
		for (size_t i = 0; i < h->n; i++)
			close(h->fds[i]);
		close(h->wake[0]);
		close(h->wake[1]);
		free(h);
		snprintf(why, whylen, "no thread to hold the ports open");
		rc = -EAGAIN;
	}
	pthread_mutex_unlock(&ops);
	return rc;
}

struct dial {
	int fd;
	const char *state;             /* NULL while connecting */
	char name[300];
};

static void dial_start(struct dial *d, const struct addrinfo *ai, uint16_t port)
{
	struct sockaddr_storage sa;

	d->fd = -1;
	if (!ai) {
		d->state = "unreachable|cannot resolve the host";
		return;
	}
	memcpy(&sa, ai->ai_addr, ai->ai_addrlen);
	if (sa.ss_family == AF_INET)
		((struct sockaddr_in *)&sa)->sin_port = htons(port);
	else
		((struct sockaddr_in6 *)&sa)->sin6_port = htons(port);
	d->fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (d->fd < 0)
		d->state = "error|no socket";
	else if (connect(d->fd, (struct sockaddr *)&sa, ai->ai_addrlen) == 0)
		d->state = "open";
	else if (errno != EINPROGRESS)
		d->state = errno == ECONNREFUSED ? "refused" :
			   errno == EHOSTUNREACH || errno == ENETUNREACH ? "unreachable" : "error";
}

static const char *dial_outcome(int fd)
{
	int err = 0;
	socklen_t len = sizeof(err);

	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
		err = errno;
	/* ECONNRESET: the handshake completed and the far end closed at once,
	 * as the listener does; a firewall that rejects answers the SYN with
	 * a reset, which is ECONNREFUSED. */
	return err == 0 || err == ECONNRESET ? "open" : err == ECONNREFUSED ? "refused" :
	       err == EHOSTUNREACH || err == ENETUNREACH ? "unreachable" :
	       err == ETIMEDOUT ? "dropped" : "error";
}

/* Every socket at once, under one deadline. */
static void dial_all(struct dial *d, size_t n, int timeout_ms)
{
	struct pollfd *pf = calloc(n ? n : 1, sizeof(*pf));
	int64_t until = mono_ms() + timeout_ms;

	for (; pf;) {
		int64_t left = until - mono_ms();
		size_t open_n = 0;

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
	free(pf);
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
	struct dr_holder *holders;
	struct dial *d;
	char *list = NULL;
	uint64_t timeout = 1000;
	size_t np = 0, nd = 0, nh;

	msg_get_u64(ask, K_SIZE, &timeout);
	if (timeout < 10 || timeout > 10000)
		timeout = timeout < 10 ? 10 : 10000;
	if (msg_get_str(ask, K_PORTS, &list) < 0 ||
	    portlist_parse(list, ports, PORTLIST_MAX, &np, why, whylen) < 0) {
		free(list);
		if (!why[0])
			snprintf(why, whylen, "a port list that does not parse");
		return -EINVAL;
	}
	free(list);
	d = calloc(DIAL_MAX, sizeof(*d));
	holders = calloc(DR_NODES_MAX, sizeof(*holders));
	if (!d || !holders) {
		free(d);
		free(holders);
		return -ENOMEM;
	}
	nh = dr_holders(ask, holders, DR_NODES_MAX);
	for (size_t j = 0; j < nh; j++) {
		struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
		ssize_t h = holders[j].host;

		/* Resolved once per node, whatever the ports. */
		if (h >= 0 && getaddrinfo(peers.hosts.v[h].host, NULL, &hints, &ai) != 0)
			ai = NULL;
		for (size_t i = 0; i < np; i++) {
			struct dial *x = &d[nd++];

			snprintf(x->name, sizeof(x->name), "dial.%.255s.%u", holders[j].name,
				 ports[i]);
			if (h < 0) {
				x->fd = -1;
				x->state = "unreachable|not in this node's hosts file";
			} else {
				dial_start(x, ai, ports[i]);
			}
		}
		if (ai)
			freeaddrinfo(ai);
	}
	dial_all(d, nd, (int)timeout);
	for (size_t k = 0; k < nd; k++)
		msg_put_pairf(ans, d[k].name, "%s", d[k].state);
	free(holders);
	free(d);
	return 0;
}
