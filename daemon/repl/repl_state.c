/* What every part of replication shares and calls, apart from the service
 * that starts them (repl.c): the state (struct repl, repl_impl.h), the
 * clock, and the priority of replication's threads. Kept
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

void repl_background(const char *what)
{
	prio_background(repl.cfg->priority, what);
}
