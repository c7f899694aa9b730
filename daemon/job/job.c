#include "daemon/job/job.h"

#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <errno.h>

#include "common/clock.h"
#include "daemon/fs/cred.h"
#include "daemon/obs/obs.h"

atomic_bool stage_stopping;

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct job *reg_head;

void job_begin(struct job *j, int fd, uint32_t flags, const struct stage_config *cfg,
	       const char *kind, const char *what)
{
	memset(j, 0, sizeof(*j));
	pthread_mutex_init(&j->send_mu, NULL);
	j->fd = fd;
	j->flags = flags;
	j->cfg = cfg;
	snprintf(j->kind, sizeof(j->kind), "%s", kind);
	j->uid = cred_uid();
	snprintf(j->what, sizeof(j->what), "%s", what);
	atomic_store(&j->phase, "start");
	j->t_start_ns = mono_ns();
	atomic_store(&j->t_alive_ns, j->t_start_ns);
	pthread_mutex_lock(&reg_lock);
	j->next = reg_head;
	reg_head = j;
	pthread_mutex_unlock(&reg_lock);
}

void job_end(struct job *j)
{
	pthread_mutex_lock(&reg_lock);
	for (struct job **pp = &reg_head; *pp; pp = &(*pp)->next)
		if (*pp == j) {
			*pp = j->next;
			break;
		}
	pthread_mutex_unlock(&reg_lock);
	pthread_mutex_destroy(&j->send_mu);
}

void job_set_what(struct job *j, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&reg_lock);
	va_start(ap, fmt);
	vsnprintf(j->what, sizeof(j->what), fmt, ap);
	va_end(ap);
	pthread_mutex_unlock(&reg_lock);
}

/* A job must never sit in a blocking send: a client that stops reading
 * (a terminal paused with Ctrl-S) would hold the job, its lock and the
 * daemon's shutdown. So frames go out without blocking: a progress frame
 * that does not fit now is dropped (the next one says more); any other
 * waits in slices, and the client counts as gone after SEND_GIVE_UP_NS or
 * as soon as the daemon is stopping. */
#define SEND_GIVE_UP_NS (60ull * 1000000000ull)

static void send_or_hang_up(struct job *j, struct msg *m, bool droppable)
{
	uint8_t hdr[PROTO_HDR_LEN];
	struct iovec iov[2];
	size_t total, sent = 0;
	uint64_t start = mono_ns();

	if (j->gone || m->err || j->fd < 0) {
		msg_free(m);
		return;
	}
	/* One frame at a time. A progress frame does not wait for another
	 * thread's note: it is dropped, as when the socket is full. A frame that
	 * waited looks again: the one before may have given up on the client
	 * part-way, and nothing may follow half a frame. */
	if (droppable ? pthread_mutex_trylock(&j->send_mu) != 0 :
	    pthread_mutex_lock(&j->send_mu) != 0) {
		msg_free(m);
		return;
	}
	if (j->gone) {
		pthread_mutex_unlock(&j->send_mu);
		msg_free(m);
		return;
	}
	proto_encode_hdr(hdr, m->type, m->flags, (uint32_t)m->len);
	total = PROTO_HDR_LEN + m->len;
	while (sent < total) {
		struct msghdr mh = { .msg_iov = iov };
		ssize_t n;

		if (sent < PROTO_HDR_LEN) {
			iov[0] = (struct iovec){ hdr + sent, PROTO_HDR_LEN - sent };
			iov[1] = (struct iovec){ m->buf, m->len };
			mh.msg_iovlen = m->len ? 2 : 1;
		} else {
			iov[0] = (struct iovec){ m->buf + (sent - PROTO_HDR_LEN), total - sent };
			mh.msg_iovlen = 1;
		}
		n = sendmsg(j->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n > 0) {
			sent += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			struct pollfd pfd = { .fd = j->fd, .events = POLLOUT };

			if (droppable && sent == 0)
				break;
			if (j->gone || atomic_load(&stage_stopping) ||
			    mono_ns() - start > SEND_GIVE_UP_NS) {
				j->gone = true;
				break;
			}
			poll(&pfd, 1, 100);
			continue;
		}
		j->gone = true;
		break;
	}
	pthread_mutex_unlock(&j->send_mu);
	msg_free(m);
}

void job_send(struct job *j, struct msg *m)
{
	send_or_hang_up(j, m, false);
}

void job_note(struct job *j, enum log_level lvl, const char *kind, const char *path,
	      const char *fmt, ...)
{
	char text[8192];
	struct msg m;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	LOG(lvl, "%s: %s", j->kind, text);
	msg_init(&m, MSG_NOTE);
	msg_put_u64(&m, K_LEVEL, lvl);
	if (kind)
		msg_put_str(&m, K_KIND, kind);
	if (path)
		msg_put_str(&m, K_PATH, path);
	msg_put_str(&m, K_TEXT, text);
	send_or_hang_up(j, &m, false);
}

void job_progress(struct job *j, bool force)
{
	job_progress_with(j, force, NULL, NULL);
}

void job_progress_with(struct job *j, bool force, void (*more)(struct msg *m, void *arg),
		       void *arg)
{
	uint64_t now = mono_ns();
	struct msg m;

	atomic_store(&j->t_alive_ns, now);
	if (!(j->flags & REQ_PROGRESS))
		return;
	if (!force && now - j->t_progress_ns < 100000000ull)
		return;
	j->t_progress_ns = now;
	msg_init(&m, MSG_PROGRESS);
	msg_put_str(&m, K_PHASE, atomic_load(&j->phase));
	msg_put_u64(&m, K_FILES_DONE, atomic_load(&j->files_done));
	msg_put_u64(&m, K_FILES_TOTAL, atomic_load(&j->files_total));
	msg_put_u64(&m, K_BYTES_DONE, atomic_load(&j->bytes_done));
	msg_put_u64(&m, K_BYTES_TOTAL, atomic_load(&j->bytes_total));
	if (more)
		more(&m, arg);
	send_or_hang_up(j, &m, true);
}

bool job_cancelled(struct job *j)
{
	uint64_t now;

	if (atomic_load(&stage_stopping) || j->gone)
		return true;
	now = mono_ns();
	atomic_store(&j->t_alive_ns, now);
	if (j->fd < 0)
		return false;
	if (now - j->t_check_ns < 50000000ull)
		return false;
	j->t_check_ns = now;
	/* The client sends nothing after its request: readable means it closed. */
	struct pollfd p = { .fd = j->fd, .events = POLLIN | POLLRDHUP };
	if (poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)))
		j->gone = true;
	return j->gone;
}

void job_result(struct job *j, int code, const char *path, struct msg *m,
		const char *fmt, ...)
{
	char text[8192];
	struct msg own;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	if (!m) {
		msg_init(&own, MSG_RESULT);
		m = &own;
	}
	msg_put_u64(m, K_CODE, (uint64_t)code);
	msg_put_str(m, K_TEXT, text);
	j->code = code;
	snprintf(j->result, sizeof(j->result), "%.*s", (int)sizeof(j->result) - 1, text);
	if (path)
		msg_put_str(m, K_PATH, path);
	msg_put_u64(m, K_ELAPSED_NS, mono_ns() - j->t_start_ns);
	if (j->fd >= 0)         /* a client's request, not work done for a peer */
		obs_job_done(j->kind, code, mono_ns() - j->t_start_ns);
	if (code)
		log_warn("%s %s: %s", j->kind, j->what, text);
	else
		log_info("%s %s: %s", j->kind, j->what, text);
	job_progress(j, true);
	send_or_hang_up(j, m, false);
	j->sent_result = true;
}

/* A job with watch_stuck asks job_progress or job_cancelled at least every
 * few hundred milliseconds while it works (a pull's loops do, between
 * calls); one that has not for this long is inside a call that does not
 * return: a file system that does not answer. Other jobs may spend longer
 * in one piece of work (a restore fetching a big file): not marked. */
#define JOB_STUCK_NS (5ull * 1000000000ull)

void jobs_status(struct msg *m, uid_t viewer)
{
	pthread_mutex_lock(&reg_lock);
	for (struct job *j = reg_head; j; j = j->next) {
		uint64_t alive = atomic_load(&j->t_alive_ns), now = mono_ns();
		uint64_t quiet = j->watch_stuck && now > alive ? now - alive : 0;
		char v[1024], stuck[96] = "";

		if (viewer != 0 && j->uid != viewer)
			continue;

		if (quiet > JOB_STUCK_NS)
			snprintf(stuck, sizeof(stuck), "; stuck for %llu s in a call that has not "
				 "returned", (unsigned long long)(quiet / 1000000000ull));
		snprintf(v, sizeof(v), "%s %s [%s] %llu/%llu files, %llu/%llu bytes%s", j->kind,
			 j->what, atomic_load(&j->phase),
			 (unsigned long long)atomic_load(&j->files_done),
			 (unsigned long long)atomic_load(&j->files_total),
			 (unsigned long long)atomic_load(&j->bytes_done),
			 (unsigned long long)atomic_load(&j->bytes_total), stuck);
		msg_put_str(m, K_NAME, "job");
		msg_put_str(m, K_VALUE, v);
	}
	pthread_mutex_unlock(&reg_lock);
}

unsigned jobs_count(uid_t viewer)
{
	unsigned n = 0;

	pthread_mutex_lock(&reg_lock);
	for (struct job *j = reg_head; j; j = j->next)
		n += viewer == 0 || j->uid == viewer;
	pthread_mutex_unlock(&reg_lock);
	return n;
}
