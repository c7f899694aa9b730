/* What every part of replication shares and calls, apart from the service
 * that starts them (repl.c): the state (struct repl, repl_impl.h), the
 * clock, the priority of replication's threads, and acting as a job's owner. Kept
 * out of repl.c so that the sender, the receiver and the askers call down to
 * it, never back up into the file that starts them. */
#include "daemon/repl/repl_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "daemon/engine/prio.h"
#include "daemon/fs/cred.h"
#include "daemon/fs/treeops.h"
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

static struct writer *writer_of(const char *job)
{
	for (size_t i = 0; i < REPL_WRITERS; i++)
		if (repl.writers[i].ms && strcmp(repl.writers[i].job, job) == 0)
			return &repl.writers[i];
	return NULL;
}

void repl_wrote(const char *job, void *arg)
{
	struct writer *w;

	pthread_mutex_lock(&repl.lock);
	w = writer_of(job);
	if (!w) {               /* the stalest entry (a free one is 0) */
		w = &repl.writers[0];
		for (size_t i = 1; i < REPL_WRITERS; i++)
			if (repl.writers[i].ms < w->ms)
				w = &repl.writers[i];
	}
	snprintf(w->job, sizeof(w->job), "%s", job);
	w->ms = (uint64_t)mono_ms();
	atomic_store(&repl.wrote_ms, w->ms);
	pthread_mutex_unlock(&repl.lock);
}

bool repl_writing(const char *job, uint64_t now_ms)
{
	const struct writer *w = writer_of(job);

	return w && now_ms - w->ms < REPL_YIELD_QUIET_MS;
}

bool repl_yield(const char *job, uint64_t *budget_ms)
{
	uint64_t start = 0, now = 0, cap = (uint64_t)repl.cfg->peer_timeout * 1000 / 4;
	uint64_t wrote = atomic_load(&repl.wrote_ms);

	if (!repl.cfg->yield || !repl.cfg->watch || !*budget_ms ||
	    (uint64_t)mono_ms() >= wrote + REPL_YIELD_QUIET_MS)
		return false;   /* nothing written anywhere just now: no lock taken */
	if (cap > *budget_ms)
		cap = *budget_ms;
	pthread_mutex_lock(&repl.lock);
	for (;;) {
		uint64_t until;

		now = (uint64_t)mono_ms();
		if (!repl_writing(job, now) || repl.stopping || atomic_load(&stage_stopping))
			break;
		if (!start)
			start = now;
		if (now - start >= cap)
			break;
		until = writer_of(job)->ms + REPL_YIELD_QUIET_MS;
		if (until > start + cap)
			until = start + cap;
		repl_wait_until(mono_ns() + (until - now) * 1000000ull);
	}
	pthread_mutex_unlock(&repl.lock);
	if (!start)
		return false;
	*budget_ms -= now - start < *budget_ms ? now - start : *budget_ms;
	atomic_fetch_add(&repl.yielded_ms, now - start);
	return true;
}

void repl_background(const char *what)
{
	prio_background(repl.cfg->priority, what);
}

/* The committer acts as the owner of ckpt_root/JOB (reached with no link)
 * while it reads the step and writes its manifest, and so does a sender
 * reading a step as it is hashed (repl_late.c): what the daemon does on its
 * own acts as the owner of what it works on. A job directory that cannot be
 * looked at is not read as root instead. 0, or -errno with why. */
int repl_enter_job_owner(const char *job, struct cred **owner, char *why, size_t whylen)
{
	int fd = treeops_open_beneath_path(repl.cfg->ckpt_root, job), rc;

	*owner = NULL;
	if (fd < 0) {
		snprintf(why, whylen, "%s/%s: %s", repl.cfg->ckpt_root, job, strerror(-fd));
		return fd;
	}
	rc = cred_enter_owner(fd, owner);
	close(fd);
	if (rc < 0)
		snprintf(why, whylen, "cannot act as the owner of %s/%s: %s", repl.cfg->ckpt_root,
			 job, strerror(-rc));
	return rc < 0 ? rc : 0;        /* the committer is the daemon's: it leaves either way */
}
