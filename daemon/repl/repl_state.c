/* What every part of replication shares and calls, apart from the service
 * that starts them (repl.c): the state (struct repl, repl_impl.h), the
 * clock, this node's name, dialing another node of the cluster, and the
 * priority of replication's threads. Kept
 * out of repl.c so that the sender, the receiver and the askers call down to
 * it, never back up into the file that starts them. */
#include "daemon/repl/repl_impl.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "daemon/engine/prio.h"
#include "daemon/net/peer.h"
#include "daemon/repl/repl.h"

struct repl repl = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER,
		     .stop_fd = -1 };

void repl_state_init(void)
{
	/* Deadlines on the monotonic clock: a wall clock set back while a
	 * sender backs off must not stretch its wait by the step. */
	pthread_cond_destroy(&repl.cond);
	mono_cond_init(&repl.cond);
}

int repl_wait_until(uint64_t deadline_ns)
{
	struct timespec ts = mono_timespec(deadline_ns);

	if (mono_ns() >= deadline_ns)
		return ETIMEDOUT;
	return pthread_cond_timedwait(&repl.cond, &repl.lock, &ts);
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

void repl_background(const char *what)
{
	prio_background(repl.cfg->priority, what);
}
