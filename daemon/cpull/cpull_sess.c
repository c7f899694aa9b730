/* The cluster pulls this node serves its peers from, by id, and the
 * serving (MSG_CPULL_FETCH).
 *
 * A pull being served:
 *   STARTING --its pull opened DEST--> PULLING --the pull ended--> PULLED or FAILED
 *   and gone when the asker ends it (cpull_part_end), once no fetch is
 *   being served from it.
 *
 * What a peer may fetch: a regular file beneath DEST, by a path a manifest
 * could hold, reached with no symlink on the way, and only when it is there
 * as the asker's source has it (size and mtime). The pull puts nothing under
 * a final name with the source's mtime but a complete durable copy, so such
 * a file is whole. A file not there yet is waited for while this node's own
 * pull runs (CPULL_WAIT_MS at most, then "not yet": MSG_END with K_ERRNO
 * EAGAIN, the connection kept, so that a waiting file does not hold it). A
 * file the pull could not read from the source is refused at once (EIO),
 * and its asker asks the next node of the file's sequence, or reads it.
 */
#include "daemon/survey/survey.h"
#include "daemon/cpull/cpull.h"
#include "daemon/cpull/cpull_impl.h"
#include "daemon/peers/peers.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/manifest.h"
#include "daemon/fs/treeops.h"
#include "daemon/net/peer.h"

#define SESS_MAX 16                    /* pulls served at once */
#define SESS_FIND_MS 10000             /* a fetch may come before its pull's ask */
#define SESS_POLL_MS 20

enum sstate { S_STARTING, S_PULLING, S_PULLED, S_FAILED };

struct sess {
	char id[CPULL_ID_HEX + 1];
	int dst_fd;                    /* a dup, -1 until PULLING */
	enum sstate state;
	unsigned users;                /* fetches being served from it */
	struct failed *failed;         /* files its pull could not read: refused at once */
	size_t failed_bytes;           /* their memory, at most FAILED_BYTES */
	struct sess *next;
};

/* A file the pull could not read from the source, with why. */
struct failed {
	struct failed *next;
	char *why;                     /* in the same allocation, after rel */
	char rel[];
};

#define FAILED_BYTES (256u << 10)      /* beyond: the others wait as before */

#define ENDED_MAX 64                   /* pulls ended here, remembered */

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;             /* any change */
	struct sess *list;
	unsigned n;
	/* The ids of the last pulls ended here (a ring): a fetch of one is
	 * told at once that this node no longer serves it, instead of waiting
	 * for a pull that is not coming. */
	char ended[ENDED_MAX][CPULL_ID_HEX + 1];
	unsigned ended_next;
} ss = { .mu = PTHREAD_MUTEX_INITIALIZER };

static bool ended_locked(const char *id)
{
	for (unsigned i = 0; i < ENDED_MAX; i++)
		if (strcmp(ss.ended[i], id) == 0)
			return true;
	return false;
}
static pthread_once_t ss_once = PTHREAD_ONCE_INIT;

static void ss_init(void)
{
	mono_cond_init(&ss.cv);
}

static struct sess *find_locked(const char *id)
{
	for (struct sess *s = ss.list; s; s = s->next)
		if (strcmp(s->id, id) == 0)
			return s;
	return NULL;
}

int cpull_sess_add(const char *id)
{
	struct sess *s;

	pthread_once(&ss_once, ss_init);
	pthread_mutex_lock(&ss.mu);
	if (find_locked(id) || ss.n >= SESS_MAX) {
		int rc = find_locked(id) ? -EEXIST : -EBUSY;

		pthread_mutex_unlock(&ss.mu);
		return rc;
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		pthread_mutex_unlock(&ss.mu);
		return -ENOMEM;
	}
	snprintf(s->id, sizeof(s->id), "%s", id);
	s->dst_fd = -1;
	s->next = ss.list;
	ss.list = s;
	ss.n++;
	pthread_cond_broadcast(&ss.cv);
	pthread_mutex_unlock(&ss.mu);
	return 0;
}

void cpull_sess_remove(const char *id)
{
	pthread_mutex_lock(&ss.mu);
	for (struct sess **pp = &ss.list; *pp; pp = &(*pp)->next) {
		struct sess *s = *pp;

		if (strcmp(s->id, id) != 0)
			continue;
		s->state = s->state == S_PULLED ? S_PULLED : S_FAILED;
		pthread_cond_broadcast(&ss.cv);
		while (s->users)
			pthread_cond_wait(&ss.cv, &ss.mu);
		*pp = s->next;
		ss.n--;
		snprintf(ss.ended[ss.ended_next], sizeof(ss.ended[0]), "%s", s->id);
		ss.ended_next = (ss.ended_next + 1) % ENDED_MAX;
		if (s->dst_fd >= 0)
			close(s->dst_fd);
		while (s->failed) {
			struct failed *f = s->failed;

			s->failed = f->next;
			free(f);
		}
		free(s);
		break;
	}
	pthread_mutex_unlock(&ss.mu);
}

int cpull_sess_begin(const char *id, int dst_fd)
{
	struct sess *s;
	int rc = 0;

	pthread_mutex_lock(&ss.mu);
	s = find_locked(id);
	if (!s)
		rc = -ENOENT;
	else if ((s->dst_fd = fcntl(dst_fd, F_DUPFD_CLOEXEC, 0)) < 0)
		rc = -errno;
	else
		s->state = S_PULLING;
	pthread_cond_broadcast(&ss.cv);
	pthread_mutex_unlock(&ss.mu);
	return rc;
}

void cpull_sess_pulled(const char *id, bool ok)
{
	struct sess *s;

	pthread_mutex_lock(&ss.mu);
	s = find_locked(id);
	if (s && (s->state == S_STARTING || s->state == S_PULLING))
		s->state = ok ? S_PULLED : S_FAILED;
	pthread_cond_broadcast(&ss.cv);
	pthread_mutex_unlock(&ss.mu);
}

void cpull_sess_failed(const char *id, const char *rel, const char *why)
{
	size_t nr = strlen(rel) + 1, nw = strlen(why) + 1;
	struct failed *f;
	struct sess *s;

	pthread_mutex_lock(&ss.mu);
	s = find_locked(id);
	if (s && s->failed_bytes + sizeof(*f) + nr + nw <= FAILED_BYTES &&
	    (f = malloc(sizeof(*f) + nr + nw))) {
		memcpy(f->rel, rel, nr);
		f->why = f->rel + nr;
		memcpy(f->why, why, nw);
		f->next = s->failed;
		s->failed = f;
		s->failed_bytes += sizeof(*f) + nr + nw;
		pthread_cond_broadcast(&ss.cv);
	}
	pthread_mutex_unlock(&ss.mu);
}

static const struct failed *failed_locked(const struct sess *s, const char *rel)
{
	for (const struct failed *f = s->failed; f; f = f->next)
		if (strcmp(f->rel, rel) == 0)
			return f;
	return NULL;
}

bool cpull_id_ok(const char *id)
{
	if (strlen(id) != CPULL_ID_HEX)
		return false;
	for (const char *c = id; *c; c++)
		if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f')))
			return false;
	return true;
}

/* The file as the asker's source has it, opened beneath s's DEST: an fd,
 * -EAGAIN (not there yet: wait), -ESHUTDOWN (its part failed before it
 * opened DEST: it serves nothing), or another -errno (it will not be). */
static int file_open(struct sess *s, const char *rel, uint64_t size, int64_t mtime_ns,
		     struct stat *st)
{
	int fd;

	if (s->dst_fd < 0)
		return s->state == S_STARTING ? -EAGAIN : -ESHUTDOWN;
	fd = treeops_open_file_beneath(s->dst_fd, rel);
	if (fd >= 0 && fstat(fd, st) == 0 && (uint64_t)st->st_size == size &&
	    mf_mtime_ns(st) == mtime_ns)
		return fd;
	if (fd >= 0)
		close(fd);
	return s->state == S_PULLING ? -EAGAIN : fd >= 0 ? -ESTALE : -ENOENT;
}

/* Waits (under ss.mu) for id's pull and for rel in it: an fd and *sp (a
 * user taken), or -errno with why. */
static int wait_file(const char *id, const char *rel, uint64_t size, int64_t mtime_ns,
		     bool probe, struct sess **sp, char *why, size_t whylen)
{
	uint64_t t0 = mono_ns(), found_by = t0 + SESS_FIND_MS * 1000000ull;
	uint64_t wait_by = t0 + CPULL_WAIT_MS * 1000000ull;
	const struct failed *f;
	struct sess *s;
	struct stat st;
	int fd;

	for (;;) {
		struct timespec ts;

		s = find_locked(id);
		if (!s && (ended_locked(id) || mono_ns() >= found_by)) {
			snprintf(why, whylen, "%s does not serve cluster pull %.8s (%s)",
				 peers.cfg->name, id, ended_locked(id) ? "it ended here" :
				 "no such pull here");
			return -ESHUTDOWN;
		}
		if (s) {
			/* The open is beneath DEST, on this node's disk: quick. */
			fd = file_open(s, rel, size, mtime_ns, &st);
			if (fd >= 0) {
				s->users++;
				*sp = s;
				return fd;
			}
			if (fd == -ESHUTDOWN) {
				snprintf(why, whylen, "%s does not serve cluster pull %.8s (its part "
					 "failed)", peers.cfg->name, id);
				return fd;
			}
			/* A file its reader could not read is said as such whether
			 * or not that reader's pull has ended since: both are
			 * refusals, but this one names the cause. */
			if ((f = failed_locked(s, rel)) != NULL) {
				snprintf(why, whylen, "it could not read %s from the source (%s)", rel,
					 f->why);
				return -EIO;
			}
			/* A probe waits for the part to open DEST (its first moments,
			 * above), not for the file. */
			if (fd == -EAGAIN && probe && s->dst_fd >= 0)
				fd = -ENOENT;
			if (fd != -EAGAIN) {
				snprintf(why, whylen, "its pull %s without %s%s",
					 s->state == S_PULLED ? "ended" : "failed", rel,
					 fd == -ESTALE ? " (it has another version of it)" : "");
				return fd;
			}
			if (mono_ns() >= wait_by) {
				snprintf(why, whylen, "%s is not here yet", rel);
				return -EAGAIN;
			}
		}
		ts = mono_timespec(mono_ns() + SESS_POLL_MS * 1000000ull);
		pthread_cond_timedwait(&ss.cv, &ss.mu, &ts);
	}
}

/* "Not yet": MSG_END with K_ERRNO EAGAIN and no data; the connection stays. */
static int send_not_yet(struct xport *x)
{
	struct msg m;
	int rc;

	msg_init(&m, MSG_END);
	msg_put_u64(&m, K_ERRNO, EAGAIN);
	rc = x->ops->send(x, &m);
	msg_free(&m);
	return rc;
}

int cpull_fetch_serve(struct xport *x, const char *peer, const struct msg *req)
{
	char *id = NULL, *rel = NULL, why[1024] = "";
	uint64_t size = 0, mtime = 0, flags = 0;
	struct sess *s = NULL;
	int fd, rc;

	if (msg_get_str(req, K_JOB, &id) < 0 || !cpull_id_ok(id) || msg_get_str(req, K_PATH, &rel) < 0 ||
	    !treeops_rel_ok(rel) || msg_get_u64(req, K_SIZE, &size) < 0 ||
	    msg_get_u64(req, K_MTIME, &mtime) < 0) {
		log_warn("a cluster pull's fetch from %s refused: malformed", peer);
		peer_send_error(x, EBADMSG, "%s: a malformed fetch of a cluster pull", peers.cfg->name);
		rc = -EBADMSG;
		goto out;
	}
	msg_get_u64(req, K_FLAGS, &flags);
	pthread_once(&ss_once, ss_init);
	pthread_mutex_lock(&ss.mu);
	fd = wait_file(id, rel, size, (int64_t)mtime, flags & CPULL_PROBE, &s, why, sizeof(why));
	pthread_mutex_unlock(&ss.mu);
	if (fd == -EAGAIN) {
		rc = send_not_yet(x);
		goto out;
	}
	if (fd < 0) {
		rc = fd;
		peer_send_error(x, -rc, "%s: %s", peers.cfg->name, why);
		goto out;
	}
	x->ops->set_timeout(x, peers_io_ms());
	rc = peers_send_range_shared(x, peer, fd, size, 0, size, CPULL_WAIT_MS, rel, why,
				    sizeof(why));
	close(fd);
	if (rc == -EAGAIN) {
		rc = send_not_yet(x);        /* every sender busy */
	} else if (rc < 0 && *why) {
		log_warn("cluster pull %s: %s for %s: %s", id, rel, peer, why);
		peer_send_error(x, -rc, "%s: %s: %s", peers.cfg->name, rel, why);
	}
	pthread_mutex_lock(&ss.mu);
	s->users--;
	pthread_cond_broadcast(&ss.cv);
	pthread_mutex_unlock(&ss.mu);
out:
	free(id);
	free(rel);
	return rc;
}
