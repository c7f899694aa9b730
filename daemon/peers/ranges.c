/* Sending a byte range of a file to a peer, as the codec's chunk frames
 * (each piece with its XXH3-64) and then MSG_END: a restore's holder
 * serving its origin, and a node of a cluster pull serving the files it
 * read. Each piece goes through a piece sender (daemon/engine/psend.c:
 * read ahead, the `rate` cap). */
#include "daemon/peers/peers.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/codec.h"
#include "daemon/engine/psend.h"

/* Each receiver thread that serves fetches keeps one piece sender (read
 * ahead, the rate cap) for the life of its connection: a restore asks for
 * many ranges, and the cap holds across them. Freed when the thread ends.
 *
 * `rate` is per restore served, and a restore fetches over several
 * connections at once (its lanes): the piece senders of one origin's
 * connections take from one bucket, found by the origin's proven name in
 * a table of FETCH_PACES. Past that many origins served at once, a
 * connection keeps a bucket of its own. */
#define FETCH_PACES 64

struct fetch_ps {
	struct psend ps;
	int slot;                      /* its bucket in paces[], or -1 */
};

static struct {
	char origin[AUTH_NAME_MAX + 1];
	struct pace pace;
	unsigned users;                /* connections taking from it; 0: free */
} paces[FETCH_PACES];
static pthread_mutex_t paces_mu = PTHREAD_MUTEX_INITIALIZER;

static int pace_slot(const char *origin)
{
	int free_slot = -1;

	pthread_mutex_lock(&paces_mu);
	for (int i = 0; i < FETCH_PACES; i++) {
		if (paces[i].users && strcmp(paces[i].origin, origin) == 0) {
			paces[i].users++;
			pthread_mutex_unlock(&paces_mu);
			return i;
		}
		if (!paces[i].users && free_slot < 0)
			free_slot = i;
	}
	if (free_slot >= 0) {
		snprintf(paces[free_slot].origin, sizeof(paces[free_slot].origin), "%s", origin);
		pace_init(&paces[free_slot].pace, peers.cfg->rate);
		paces[free_slot].users = 1;
	}
	pthread_mutex_unlock(&paces_mu);
	return free_slot;
}

static void pace_slot_put(int slot)
{
	if (slot < 0)
		return;
	pthread_mutex_lock(&paces_mu);
	paces[slot].users--;
	pthread_mutex_unlock(&paces_mu);
}

static pthread_key_t ps_key;
static pthread_once_t ps_once = PTHREAD_ONCE_INIT;

static void ps_free(void *p)
{
	struct fetch_ps *f = p;

	pace_slot_put(f->slot);
	psend_close(&f->ps);
	free(f);
}

static int ps_key_rc;

static void ps_key_make(void)
{
	ps_key_rc = -pthread_key_create(&ps_key, ps_free);
}

/* The thread's piece sender; its connection is origin's (proven): a
 * restore's origin, or the node a cluster pull forwards to. */
static int thread_psend(const char *origin, struct psend **out)
{
	struct fetch_ps *f;
	int rc;

	pthread_once(&ps_once, ps_key_make);
	if (ps_key_rc < 0)
		return ps_key_rc;
	f = pthread_getspecific(ps_key);
	if (!f) {
		f = malloc(sizeof(*f));
		if (!f)
			return -ENOMEM;
		rc = psend_open(&f->ps, peers.cfg->rate);
		if (rc < 0) {
			free(f);
			return rc;
		}
		f->slot = peers.cfg->rate ? pace_slot(origin) : -1;
		if (f->slot >= 0)
			f->ps.cap = &paces[f->slot].pace;
		rc = -pthread_setspecific(ps_key, f);
		if (rc < 0) {
			ps_free(f);
			return rc;
		}
	}
	*out = &f->ps;
	return 0;
}

/* A restore asks for the codec the holder's config names (auto: raw; the
 * origin is usually a node of the same fabric, and restore time is what
 * counts). */
static const struct codec_ops *fetch_codec(void *arg)
{
	return peers.cfg->compress == CFG_COMPRESS_ZSTD ? &codec_zstd_ops :
	       peers.cfg->compress == CFG_COMPRESS_FLOAT ? &codec_float_ops : &codec_none_ops;
}

/* Bytes [off, off + size) of fd through ps, then MSG_END: both senders'. */
static int send_through(struct psend *ps, struct xport *x, int fd, uint64_t fsize, uint64_t off,
			uint64_t size, bool no_sum, const char *name, char *why, size_t whylen)
{
	const struct psend_hooks h = { .pick = fetch_codec };
	struct codec_params cp = { .dtype = CODEC_DT_COUNT, .no_sum = no_sum };
	struct msg m;
	int rc;

	rc = psend_range(ps, x, fd, fsize, PSEND_NO_FILE, off, off + size, &cp, &h, name, why,
			 whylen);
	if (rc == 0) {
		msg_init(&m, MSG_END);
		rc = x->ops->send(x, &m);
		msg_free(&m);
	}
	return rc;
}

int peers_send_range(struct xport *x, const char *peer, int fd, uint64_t fsize, uint64_t off,
		     uint64_t size, bool no_sum, const char *name, char *why, size_t whylen)
{
	struct psend *ps;
	int rc;

	rc = thread_psend(peer, &ps);
	if (rc < 0) {
		snprintf(why, whylen, "the piece sender: %s", strerror(-rc));
		return rc;
	}
	return send_through(ps, x, fd, fsize, off, size, no_sum, name, why, whylen);
}

/* The piece senders a cluster pull's serving shares. A restore's holder
 * serves one origin over a few connections, and keeps a piece sender per
 * connection; a node of a cluster pull serves up to 4 connections from
 * every other node, which would make its memory grow with the cluster. So
 * those take one of a few piece senders for the length of a file: as many
 * as `memory` gives 8 MiB of read-ahead each, 2 to 16, made when first
 * needed and kept for the daemon's life. */
#define SHARED_PS_MAX 16

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;             /* a sender freed */
	struct psend ps[SHARED_PS_MAX];
	bool open[SHARED_PS_MAX], busy[SHARED_PS_MAX];
} sps = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

int peers_send_range_shared(struct xport *x, const char *peer, int fd, uint64_t fsize,
			    uint64_t off, uint64_t size, int wait_ms, const char *name, char *why,
			    size_t whylen)
{
	struct timespec by;
	uint64_t n = peers.cfg->memory / ((uint64_t)PSEND_DEPTH * PSEND_PIECE);
	struct psend *ps;
	int i = -1, slot, rc = 0;

	n = n < 2 ? 2 : n > SHARED_PS_MAX ? SHARED_PS_MAX : n;
	clock_gettime(CLOCK_REALTIME, &by);      /* sps.cv's clock */
	by.tv_sec += wait_ms / 1000;
	by.tv_nsec += (long)(wait_ms % 1000) * 1000000;
	if (by.tv_nsec >= 1000000000) {
		by.tv_sec++;
		by.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&sps.mu);
	for (;;) {
		for (unsigned k = 0; k < n && i < 0; k++)
			if (!sps.busy[k])
				i = (int)k;
		if (i >= 0)
			break;
		if (pthread_cond_timedwait(&sps.cv, &sps.mu, &by) == ETIMEDOUT) {
			/* Nothing sent yet: the asker hears "not yet" instead of
			 * waiting past its timeout for a sender. */
			pthread_mutex_unlock(&sps.mu);
			return -EAGAIN;
		}
	}
	sps.busy[i] = true;
	pthread_mutex_unlock(&sps.mu);
	ps = &sps.ps[i];
	if (!sps.open[i]) {
		rc = psend_open(ps, peers.cfg->rate);
		sps.open[i] = rc == 0;
	}
	if (rc < 0) {
		snprintf(why, whylen, "the piece sender: %s", strerror(-rc));
		goto out;
	}
	slot = peers.cfg->rate ? pace_slot(peer) : -1;
	ps->cap = slot >= 0 ? &paces[slot].pace : &ps->pace;
	rc = send_through(ps, x, fd, fsize, off, size, false, name, why, whylen);
	pace_slot_put(slot);
out:
	pthread_mutex_lock(&sps.mu);
	sps.busy[i] = false;
	pthread_cond_signal(&sps.cv);
	pthread_mutex_unlock(&sps.mu);
	return rc;
}
