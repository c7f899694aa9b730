/* What every part of replication shares and calls, apart from the service
 * that starts them (repl.c): the state (struct repl, repl_impl.h), the
 * clock, this node's name, and dialing another node of the cluster. Kept
 * out of repl.c so that the sender, the receiver and the askers call down to
 * it, never back up into the file that starts them. */
#include "daemon/repl/repl_impl.h"

#include <time.h>

#include "daemon/net/peer.h"
#include "daemon/repl/repl.h"

struct repl repl = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER,
		     .stop_fd = -1 };

uint64_t repl_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

const char *repl_self_name(void)
{
	return repl.cfg->name;
}

int repl_dial(size_t host, int connect_ms, int io_ms, struct xport **out, char *why,
	      size_t whylen)
{
	const struct host *h = &repl.hosts.v[host];
	char name[AUTH_NAME_MAX + 1];
	struct xport *x;
	int rc;

	rc = net_connect(h, connect_ms, &x, why, whylen);
	if (rc < 0)
		return rc;
	rc = peer_handshake(&x, &repl.key, repl.cfg->name, &repl.hosts, h->name, REPL_HANDSHAKE_MS,
			    name, sizeof(name), why, whylen);
	if (rc < 0) {
		x->ops->close(x);
		return rc;
	}
	x->ops->set_timeout(x, io_ms);
	*out = x;
	return 0;
}
