/* One node's share of a cluster pull: the files it does not read from the
 * source, fetched from the nodes that do (their side: cpull_sess.c).
 *
 * The pull engine hands a file over (start) and goes on with its walk; one
 * of the lanes (threads) takes it, asks its reader for it, writes it into a
 * temporary in the pass's DEST/.stage/tmp and gives it the source's owner,
 * mode and mtime. The engine then hashes the temporary and settles it as it
 * does its own copies (pull.c): durable with the batch's syncfs, then
 * renamed, so that what is under a final name with the source's mtime is
 * always complete. The manifest's digests are this node's own reading of
 * its own disk, and the asker compares every node's root.
 *
 * Lanes: one file each at a time, or a batch of up to BATCH_MAX small ones
 * queued for one reader (asked for together: one round trip), and a file
 * waits for its reader to have read it, so it is the lanes' number that
 * hides that wait: as many as `memory` gives 4 MiB of write buffers each,
 * 2 to 16.
 *
 * A file's states: queued -> in a lane -> done (reaped by the engine).
 * A reader that cannot be reached, or whose connection breaks, is marked
 * dead for this pull (cpull_impl.h says why that cannot deadlock) and the
 * file asked of the next; one that refuses this file (its pull ended
 * without it, it has another version) is skipped for this file alone. When
 * the next reader is this node, the engine reads the file from the source.
 *
 * The lanes share a pool of connections, at most PEER_CONNS to each node
 * and as many in all as that gives (64 at most: past 17 nodes, fewer than
 * PEER_CONNS each, and idle ones are replaced, least recently used first):
 * files go to readers by hash, so consecutive files mostly go to different
 * nodes, and a connection per file would cost a handshake each; and every
 * node serving at most PEER_CONNS connections from each peer keeps a
 * node's incoming connections within what it admits (4 per node of the
 * hosts file, daemon/peers/serve.c), where a connection refused there would look
 * like a node gone.
 */
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
#include <xxhash.h>

#include "common/clock.h"
#include "common/codec.h"
#include "common/log.h"
#include "common/manifest.h"
#include "daemon/engine/prio.h"
#include "daemon/engine/wq.h"
#include "daemon/fs/cred.h"
#include "daemon/fs/treeops.h"
#include "daemon/net/peer.h"

#define CFWD_LANES 16                  /* at most */
#define LANE_MEM (WQ_DEPTH * (uint64_t)WQ_BUF)
#define CFWD_POOL 64                   /* connections kept, to all nodes, at most */
#define PEER_CONNS 4                   /* ... to one node */
#define DIAL_TRIES 5
#define FWD_AGAIN 100                  /* forward(): not there yet, queue it again */
#define CFWD_SKIP 8                    /* readers refused for one file, at most */

#define PROBE_MISSES 16                /* "not here" answers before a node is asked no more */
#define BATCH_MAX 8                    /* small files asked of one reader at once */
#define BATCH_FILE (256u << 10)        /* a file at most this big rides in a batch */
#define BATCH_SCAN 64                  /* queued files looked at for a batch */
#define FWD_RETRY 101                  /* a batch could not settle it: the one-file way */

struct fitem {
	struct pull_fwd f;             /* f.rel owned */
	size_t reader;                 /* its first reader (when queued), for batches */
	int rc;                        /* PULL_FWD_* or -errno, once done */
	char tmp[64];                  /* PULL_FWD_OK: the temporary, in tmp/ */
	bool ours;                     /* rc < 0: this node's own disk failed */
	uint64_t first_ns;             /* first "not yet" (mono_ns), 0: none */
	char why[512];
	struct fitem *next;
};

struct fconn {
	size_t node;                   /* index in nodes */
	struct xport *x;               /* NULL: none */
	bool busy;                     /* a lane has it (or is dialling it) */
	uint64_t used;                 /* for the least recently used */
};

struct lane {
	struct cfwd *fw;
	unsigned no;
	pthread_t thread;
	bool started;
	struct wq wq;
	bool wq_open;
	struct xport *active;          /* receiving on it now (under fw->mu): a cancel
					* shuts it down */
	uint64_t seq;
};

struct cfwd {
	const char *id;
	struct cpull_nodes *nn;
	int dst_fd, tmp_fd;            /* owned dups; -1 before begin */
	bool as_root;
	pthread_mutex_t mu;
	pthread_cond_t cv;             /* queue or done changed */
	struct fitem *q_head, *q_tail; /* to fetch */
	struct fitem *done;            /* to reap */
	unsigned inflight;             /* started, not reaped */
	bool stop;                     /* lanes end */
	_Atomic bool cancel;           /* drop what is queued and in flight */
	_Atomic unsigned *probe_miss;  /* per node: probes it answered "not here" in a row */
	_Atomic uint64_t bytes_in;     /* received from peers, for progress */
	_Atomic uint64_t batches, batched;  /* batches asked, the files in them placed */
	struct lane lanes[CFWD_LANES];
	struct fconn pool[CFWD_POOL];  /* under mu */
	uint64_t tick;
};

/* Lamping and Veach's jump consistent hash: a bucket of n for key. */
static size_t jump(uint64_t key, size_t n)
{
	int64_t b = -1, j = 0;

	while (j < (int64_t)n) {
		b = j;
		key = key * 2862933555777941757ull + 1;
		j = (int64_t)((double)(b + 1) * ((double)(1ll << 31) / (double)((key >> 33) + 1)));
	}
	return (size_t)b;
}

size_t cpull_reader(const struct cpull_nodes *nn, const char *rel, const size_t *skip,
		    size_t nskip, bool other)
{
	size_t len = strlen(rel);

	for (uint64_t k = 0; k < 4 * (uint64_t)nn->n + 64; k++) {
		size_t b = jump(XXH3_64bits_withSeed(rel, len, k), nn->n);
		bool skipped = false;

		for (size_t i = 0; i < nskip; i++)
			skipped |= skip[i] == b;
		if (b == nn->self && !other)
			return b;
		if (b != nn->self && !skipped && !atomic_load(&nn->dead[b]))
			return b;
	}
	return other ? nn->n : nn->self;   /* every node met was dead */
}

/* A connection of the pool to node r, not in use, taken for the caller:
 * one that is idle, or one dialled when fewer than PEER_CONNS lead to r (in
 * a free slot, or that of the least recently used idle connection to
 * another node, closed first). Waits while all of r's are in use. NULL with
 * why: the dial failed, or the share is cancelled. */
static struct fconn *conn_get(struct cfwd *fw, size_t r, char *why, size_t whylen)
{
	struct fconn *c = NULL, *slot = NULL;
	struct xport *old = NULL, *nx = NULL;
	int rc;

	size_t slots = PEER_CONNS * (fw->nn->n - 1);

	slots = slots > CFWD_POOL ? CFWD_POOL : slots;
	pthread_mutex_lock(&fw->mu);
	for (;;) {
		unsigned to_r = 0;

		if (atomic_load(&fw->cancel)) {
			pthread_mutex_unlock(&fw->mu);
			snprintf(why, whylen, "cancelled");
			return NULL;
		}
		slot = NULL;
		for (size_t i = 0; i < slots; i++) {
			struct fconn *k = &fw->pool[i];

			if ((k->x || k->busy) && k->node == r) {   /* a dial counts */
				to_r++;
				if (k->x && !k->busy && !c)
					c = k;
			}
			if (!k->busy && (!slot || (slot->x && (!k->x || k->used < slot->used))))
				slot = k;
		}
		if (c || (to_r < PEER_CONNS && slot))
			break;
		pthread_cond_wait(&fw->cv, &fw->mu);
	}
	if (c) {
		c->busy = true;
		c->used = ++fw->tick;
		pthread_mutex_unlock(&fw->mu);
		return c;
	}
	c = slot;
	old = c->x;                     /* an idle connection elsewhere, replaced */
	c->x = NULL;
	c->node = r;
	c->busy = true;
	c->used = ++fw->tick;
	pthread_mutex_unlock(&fw->mu);
	if (old)
		old->ops->close(old);
	/* A dial can fail for a moment (the node's handshakes all in use when
	 * every peer dials it at once: it closes the rest), so a node is taken
	 * for gone only after DIAL_TRIES, 0.1 to 1.6 s apart, or at once when
	 * nothing listens there. */
	for (unsigned t = 0;; t++) {
		rc = peers_dial(fw->nn->host[r], PEERS_CONNECT_MS, peers_io_ms(), &nx, why, whylen);
		if (rc == 0 || rc == -ECONNREFUSED || t + 1 == DIAL_TRIES ||
		    atomic_load(&fw->cancel))
			break;
		usleep(100000u << t);
	}
	/* The slot's fields change under mu only: others scan it meanwhile. */
	pthread_mutex_lock(&fw->mu);
	c->x = rc == 0 ? nx : NULL;
	c->busy = rc == 0;
	pthread_cond_broadcast(&fw->cv);
	pthread_mutex_unlock(&fw->mu);
	return rc == 0 ? c : NULL;
}

/* Gives c back: kept for the next file, or (keep false: refused, broken,
 * cancelled) closed. */
static void conn_put(struct cfwd *fw, struct fconn *c, bool keep)
{
	struct xport *x = NULL;

	pthread_mutex_lock(&fw->mu);
	if (!keep) {
		x = c->x;
		c->x = NULL;
	}
	c->busy = false;
	pthread_cond_broadcast(&fw->cv);
	pthread_mutex_unlock(&fw->mu);
	if (x)
		x->ops->close(x);
}

/* Asks reader r for the file (its answer: take_file). 0 or -errno. */
static int ask_file(struct lane *l, struct xport *x, const char *rname, const struct pull_fwd *f,
		    bool probe, char *why, size_t whylen)
{
	struct msg m;
	int rc;

	msg_init(&m, MSG_CPULL_FETCH);
	msg_put_str(&m, K_JOB, l->fw->id);
	msg_put_str(&m, K_PATH, f->rel);
	msg_put_u64(&m, K_SIZE, f->size);
	msg_put_u64(&m, K_MTIME, (uint64_t)f->mtime_ns);
	if (probe)
		msg_put_u64(&m, K_FLAGS, CPULL_PROBE);
	rc = x->ops->send(x, &m);
	msg_free(&m);
	if (rc < 0)
		snprintf(why, whylen, "%s: %s", rname, strerror(-rc));
	return rc;
}

/* The answer to one ask_file: the file's bytes from reader r into fd, in
 * order. 0; -errno with *refused when r answered with a refusal (the
 * connection is then closed); other -errno: the connection failed (or our
 * disk: *ours). */
static int take_file(struct lane *l, struct xport *x, const char *rname, const struct pull_fwd *f,
		     int fd, bool *refused, bool *ours, char *why, size_t whylen)
{
	struct wq *q = &l->wq;
	uint64_t next = 0;
	struct msg m;
	int rc;

	wq_begin(q, fd, f->size, true);
	for (;;) {
		const uint8_t *p;
		uint8_t *buf;
		size_t n, raw = 0, used;
		uint64_t at;
		int b;

		rc = x->ops->recv(x, &m);
		if (rc < 0) {
			snprintf(why, whylen, "%s: %s", rname, rc == -ENOTCONN ? "closed the connection" :
				 strerror(-rc));
			break;
		}
		if (m.type == MSG_ERROR) {
			rc = peer_refused(&m, rname, why, whylen);
			msg_free(&m);
			*refused = true;
			/* Only this node's own cancel may end a file silently. */
			if (rc == -ECANCELED)
				rc = -EPROTO;
			break;
		}
		if (m.type == MSG_END) {
			uint64_t e = 0;

			if (next == 0 && msg_get_u64(&m, K_ERRNO, &e) == 0 && e == EAGAIN) {
				/* Not there yet: the connection stays good. */
				msg_free(&m);
				snprintf(why, whylen, "%s: not there yet", rname);
				rc = -EAGAIN;
				break;
			}
			msg_free(&m);
			rc = next == f->size ? 0 : -EPROTO;
			if (rc < 0)
				snprintf(why, whylen, "%s sent %llu of %llu bytes", rname,
					 (unsigned long long)next, (unsigned long long)f->size);
			break;
		}
		b = wq_buf(q);
		buf = q->buf[b];
		rc = m.type != MSG_DATA || msg_get_u64(&m, K_OFFSET, &at) < 0 || at != next ||
		     msg_get_bytes(&m, K_DATA, &p, &n) < 0 ? -EPROTO :
		     codec_chunk_decode(p, n, buf, WQ_BUF, &raw, &used);
		msg_free(&m);
		if (rc == 0 && (used != n || raw == 0 || raw > f->size - next))
			rc = -EPROTO;
		if (rc < 0) {
			snprintf(why, whylen, "%s: a bad piece at byte %llu (%s)", rname,
				 (unsigned long long)next, strerror(-rc));
			break;
		}
		rc = wq_write(q, b, raw, next);
		if (rc < 0) {
			*ours = true;
			rc = rc == -ECANCELED ? -EIO : rc;
			snprintf(why, whylen, "writing it: %s", strerror(-rc));
			break;
		}
		next += raw;
		atomic_fetch_add(&l->fw->bytes_in, raw);
	}
	int erc = wq_end(q);

	if (rc == 0 && erc < 0) {
		*ours = true;
		rc = erc == -ECANCELED ? -EIO : erc;
		snprintf(why, whylen, "writing it: %s", strerror(-rc));
	}
	return rc;
}

/* A temporary written whole gets the source's attributes (before the
 * batch's syncfs makes them durable with the bytes). 0 or -errno with why. */
static int place(struct cfwd *fw, int fd, const struct pull_fwd *f, char *why, size_t whylen)
{
	const char *what = "";
	int rc = treeops_set_meta(fd, fw->as_root, f->uid, f->gid, f->mode, f->mtime_ns, &what);

	if (rc < 0)
		snprintf(why, whylen, "%s of its temporary: %s", what, strerror(-rc));
	return rc;
}

/* One try from node r (probe: only if it has the file now). 0 placed;
 * else -errno with *refused / *ours. */
static int fetch_from(struct lane *l, size_t r, struct fitem *it, bool probe, bool *refused,
		      bool *ours)
{
	struct cfwd *fw = l->fw;
	const char *rname = fw->nn->names[r];
	char *tmp = it->tmp;
	struct fconn *c;
	struct xport *x;
	int fd, rc;

	c = conn_get(fw, r, it->why, sizeof(it->why));
	if (!c)
		return atomic_load(&fw->cancel) ? -ECANCELED : -EHOSTUNREACH;
	x = c->x;
	snprintf(it->tmp, sizeof(it->tmp), "fwd.%u.%llu", l->no, (unsigned long long)++l->seq);
	fd = openat(fw->tmp_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0) {
		*ours = true;
		rc = -errno;
		snprintf(it->why, sizeof(it->why), "its temporary: %s", strerror(errno));
		conn_put(fw, c, true);
		return rc;
	}
	pthread_mutex_lock(&fw->mu);
	l->active = x;
	if (atomic_load(&fw->cancel))
		x->ops->shutdown(x);
	pthread_mutex_unlock(&fw->mu);
	rc = ask_file(l, x, rname, &it->f, probe, it->why, sizeof(it->why));
	if (rc == 0)
		rc = take_file(l, x, rname, &it->f, fd, refused, ours, it->why, sizeof(it->why));
	pthread_mutex_lock(&fw->mu);
	l->active = NULL;
	pthread_mutex_unlock(&fw->mu);
	if (atomic_load(&fw->cancel) && rc < 0) {
		close(fd);
		unlinkat(fw->tmp_fd, tmp, 0);
		conn_put(fw, c, false);
		return -ECANCELED;
	}
	/* Kept only when the whole answer was read (the file, or "not yet"):
	 * after a refusal the peer closes it, and after a failure part-way
	 * (ours or not) frames of the file may still be on their way. */
	conn_put(fw, c, rc == 0 || (rc == -EAGAIN && !*refused && !*ours));
	if (rc == 0) {
		rc = place(fw, fd, &it->f, it->why, sizeof(it->why));
		*ours = rc < 0;
	}
	close(fd);
	if (rc < 0)
		unlinkat(fw->tmp_fd, tmp, 0);
	return rc;
}

/* Small files going to one reader are asked for together: every request
 * sent, then the answers read in order, so a batch costs one round trip,
 * not one per file (the reader serves a connection's requests in turn). A
 * file the batch could not settle (the reader refused one, the connection
 * broke, this node's disk failed part-way) goes the one-file way
 * (FWD_RETRY), which knows what each of those means; a file not there yet
 * goes back in the queue, as one alone does. */
static void fetch_batch(struct lane *l, size_t r, struct fitem **v, size_t k)
{
	struct cfwd *fw = l->fw;
	const char *rname = fw->nn->names[r];
	int fd[BATCH_MAX];
	size_t asked = 0, i;
	struct fconn *c;
	struct xport *x;
	bool keep = true;
	char why[512];

	for (i = 0; i < k; i++)
		v[i]->rc = FWD_RETRY;
	c = conn_get(fw, r, why, sizeof(why));
	if (!c)
		return;
	x = c->x;
	pthread_mutex_lock(&fw->mu);
	l->active = x;
	if (atomic_load(&fw->cancel))
		x->ops->shutdown(x);
	pthread_mutex_unlock(&fw->mu);
	for (i = 0; i < k; i++) {
		struct fitem *it = v[i];

		snprintf(it->tmp, sizeof(it->tmp), "fwd.%u.%llu", l->no,
			 (unsigned long long)++l->seq);
		fd[i] = openat(fw->tmp_fd, it->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd[i] < 0 || ask_file(l, x, rname, &it->f, false, it->why, sizeof(it->why)) < 0)
			break;
		asked++;
	}
	if (i < k && fd[i] >= 0) {
		close(fd[i]);
		unlinkat(fw->tmp_fd, v[i]->tmp, 0);
	}
	keep = asked == k;
	for (i = 0; i < asked; i++) {
		struct fitem *it = v[i];
		bool refused = false, ours = false;
		int rc = keep ? take_file(l, x, rname, &it->f, fd[i], &refused, &ours, it->why,
					  sizeof(it->why)) : -ECONNABORTED;

		if (rc == 0) {
			rc = place(fw, fd[i], &it->f, it->why, sizeof(it->why));
			it->ours = rc < 0;
			it->rc = rc == 0 ? PULL_FWD_OK : rc;
		} else if (rc == -EAGAIN && !refused && !ours) {
			it->first_ns = mono_ns();
			it->rc = FWD_AGAIN;
		} else {
			keep = false;   /* the rest of the answers are not to be trusted */
		}
		close(fd[i]);
		if (it->rc != PULL_FWD_OK)
			unlinkat(fw->tmp_fd, it->tmp, 0);
	}
	pthread_mutex_lock(&fw->mu);
	l->active = NULL;
	pthread_mutex_unlock(&fw->mu);
	conn_put(fw, c, keep && !atomic_load(&fw->cancel));
	atomic_fetch_add(&fw->batches, 1);
	for (i = 0; i < k; i++)
		if (v[i]->rc == PULL_FWD_OK)
			atomic_fetch_add(&fw->batched, 1);
}

/* More small files queued for it->reader, to ask for with it (under
 * fw->mu): taken out of the queue, into v[1..). The count in v. */
static size_t take_batch(struct cfwd *fw, struct fitem *it, struct fitem **v)
{
	struct fitem **pp = &fw->q_head, *prev = NULL;
	size_t k = 1, seen = 0;

	v[0] = it;
	while (*pp && k < BATCH_MAX && seen++ < BATCH_SCAN) {
		struct fitem *q = *pp;

		if (q->reader == it->reader && q->f.size <= BATCH_FILE && !q->first_ns) {
			*pp = q->next;
			if (fw->q_tail == q)
				fw->q_tail = prev;
			q->next = NULL;
			v[k++] = q;
			continue;
		}
		prev = q;
		pp = &q->next;
	}
	return k;
}

/* Node r does not serve this pull (its part failed or ended, or it never
 * had one): no file of it is asked of it again, as if it were dead. */
static void not_serving(struct cfwd *fw, size_t r, const char *why)
{
	if (!atomic_exchange(&fw->nn->dead[r], true))
		log_warn("cluster pull %s: %s; its share is read by the others", fw->id, why);
}

/* A file this node is to read: the node next in its sequence may hold it
 * already (it read it when this one was dead, in a pull that is now run
 * again), and then it comes from there, not from the source. A node that
 * answered "not here" PROBE_MISSES times in a row is not asked again: on a
 * first pull that is all a probe costs. */
static int probe(struct lane *l, struct fitem *it)
{
	struct cfwd *fw = l->fw;
	size_t nx = cpull_reader(fw->nn, it->f.rel, NULL, 0, true);
	bool refused = false, ours = false;
	int rc;

	if (nx == fw->nn->n || atomic_load(&fw->probe_miss[nx]) >= PROBE_MISSES)
		return PULL_FWD_READ;
	rc = fetch_from(l, nx, it, true, &refused, &ours);
	if (rc == 0) {
		atomic_store(&fw->probe_miss[nx], 0);
		return PULL_FWD_OK;
	}
	if (ours || rc == -ECANCELED) {
		it->ours = ours;
		return rc;
	}
	if (rc == -EAGAIN && !refused) {
		/* Its part has not opened its destination yet: ask again (not a
		 * miss, and not a node gone), up to CPULL_GIVEUP_MS. */
		if (!it->first_ns)
			it->first_ns = mono_ns();
		return mono_ns() - it->first_ns < CPULL_GIVEUP_MS * 1000000ull ? FWD_AGAIN :
		       PULL_FWD_READ;
	}
	if (refused && rc == -ESHUTDOWN)
		not_serving(fw, nx, it->why);
	else if (refused)
		atomic_fetch_add(&fw->probe_miss[nx], 1);
	else if (!atomic_exchange(&fw->nn->dead[nx], true))
		log_warn("cluster pull %s: %s: %s; its share is read by the others", fw->id,
			 fw->nn->names[nx], it->why);
	return PULL_FWD_READ;
}

/* Where the file comes from: PULL_FWD_OK (placed), PULL_FWD_READ (read it
 * here), or -errno with it->why. */
static int forward(struct lane *l, struct fitem *it)
{
	struct cfwd *fw = l->fw;
	size_t skip[CFWD_SKIP], nskip = 0;

	if (cpull_reader(fw->nn, it->f.rel, NULL, 0, false) == fw->nn->self)
		return probe(l, it);
	for (;;) {
		size_t r;
		bool refused = false, ours = false;
		int rc;

		if (atomic_load(&fw->cancel))
			return -ECANCELED;
		r = cpull_reader(fw->nn, it->f.rel, skip, nskip, false);
		if (r == fw->nn->self)
			return PULL_FWD_READ;
		rc = fetch_from(l, r, it, false, &refused, &ours);
		if (rc == 0)
			return PULL_FWD_OK;
		if (ours || rc == -ECANCELED) {
			it->ours = ours;
			return rc;
		}
		if (rc == -EAGAIN) {
			/* Not there yet (the reader waited CPULL_WAIT_MS): back in
			 * the queue, so that neither this lane nor the connection
			 * waits for it meanwhile (a node's own probes could wait
			 * behind them: 30 s at a time, seen with 2 nodes). */
			if (!it->first_ns)
				it->first_ns = mono_ns();
			if (mono_ns() - it->first_ns < CPULL_GIVEUP_MS * 1000000ull)
				return FWD_AGAIN;
			log_warn("cluster pull %s: %s: not on %s after %d s; asking the next node",
				 fw->id, it->f.rel, fw->nn->names[r], CPULL_GIVEUP_MS / 1000);
			if (nskip == CFWD_SKIP)
				return PULL_FWD_READ;
			skip[nskip++] = r;
			it->first_ns = 0;
			continue;
		}
		if (refused && rc == -ESHUTDOWN) {
			not_serving(fw, r, it->why);
			continue;
		}
		if (refused) {
			log_info("cluster pull %s: %s: %s; asking the next node", fw->id, it->f.rel,
				 it->why);
			if (nskip == CFWD_SKIP)
				return PULL_FWD_READ;
			skip[nskip++] = r;
			continue;
		}
		if (!atomic_exchange(&fw->nn->dead[r], true))
			log_warn("cluster pull %s: %s: %s; its share is read by the others", fw->id,
				 fw->nn->names[r], it->why);
	}
}

/* A file that may ride in a batch (under fw->mu): small, asked of its
 * first reader for the first time, which is not this node (a probe) and
 * not known dead. */
static bool batchable(struct cfwd *fw, const struct fitem *it)
{
	return it->f.size <= BATCH_FILE && !it->first_ns && it->reader != fw->nn->self &&
	       !atomic_load(&fw->nn->dead[it->reader]);
}

/* A lane is done with it (under fw->mu): not there yet, back in the queue;
 * else done, for the engine to reap. */
static void settle_item(struct cfwd *fw, struct fitem *it)
{
	if (it->rc == FWD_AGAIN && !atomic_load(&fw->cancel)) {
		it->next = NULL;
		if (fw->q_tail)
			fw->q_tail->next = it;
		else
			fw->q_head = it;
		fw->q_tail = it;
		return;
	}
	if (it->rc == FWD_AGAIN || it->rc == FWD_RETRY)
		it->rc = -ECANCELED;
	it->next = fw->done;
	fw->done = it;
	pthread_cond_broadcast(&fw->cv);
}

static void *lane_main(void *arg)
{
	struct lane *l = arg;
	struct cfwd *fw = l->fw;

	pthread_setname_np(pthread_self(), "cpull lane");

	prio_background(peers.cfg->priority, "a cluster pull's lane");
	pthread_mutex_lock(&fw->mu);
	for (;;) {
		struct fitem *it = fw->q_head;

		if (!it) {
			if (fw->stop)
				break;
			pthread_cond_wait(&fw->cv, &fw->mu);
			continue;
		}
		struct fitem *v[BATCH_MAX];
		size_t k = 1;

		fw->q_head = it->next;
		if (!fw->q_head)
			fw->q_tail = NULL;
		it->next = NULL;
		v[0] = it;
		if (batchable(fw, it))
			k = take_batch(fw, it, v);
		pthread_mutex_unlock(&fw->mu);
		if (k > 1)
			fetch_batch(l, it->reader, v, k);
		for (size_t i = 0; i < k; i++)
			if (k == 1 || v[i]->rc == FWD_RETRY)
				v[i]->rc = atomic_load(&fw->cancel) ? -ECANCELED : forward(l, v[i]);
		pthread_mutex_lock(&fw->mu);
		for (size_t i = 0; i < k; i++)
			settle_item(fw, v[i]);
	}
	pthread_mutex_unlock(&fw->mu);
	return NULL;
}

int cfwd_open(struct cfwd **out, const char *id, struct cpull_nodes *nn)
{
	struct cfwd *fw = calloc(1, sizeof(*fw));

	if (!fw)
		return -ENOMEM;
	fw->probe_miss = calloc(nn->n ? nn->n : 1, sizeof(*fw->probe_miss));
	if (!fw->probe_miss) {
		free(fw);
		return -ENOMEM;
	}
	fw->id = id;
	fw->nn = nn;
	fw->dst_fd = fw->tmp_fd = -1;
	fw->as_root = cred_is_root();
	pthread_mutex_init(&fw->mu, NULL);
	mono_cond_init(&fw->cv);
	*out = fw;
	return 0;
}

static void fw_cancel(void *arg);

/* Stops the lanes (every forward reaped first), in reverse of begin. */
static void lanes_stop(struct cfwd *fw)
{
	pthread_mutex_lock(&fw->mu);
	fw->stop = true;
	pthread_cond_broadcast(&fw->cv);
	pthread_mutex_unlock(&fw->mu);
	for (unsigned i = 0; i < CFWD_LANES; i++) {
		struct lane *l = &fw->lanes[i];

		if (l->started)
			pthread_join(l->thread, NULL);
		l->started = false;
		if (l->wq_open)
			wq_close(&l->wq);
		l->wq_open = false;
	}
	for (unsigned i = 0; i < CFWD_POOL; i++)
		if (fw->pool[i].x)
			fw->pool[i].x->ops->close(fw->pool[i].x);
	memset(fw->pool, 0, sizeof(fw->pool));
}

void cfwd_close(struct cfwd *fw)
{
	if (!fw)
		return;
	/* Normally nothing is queued or done by now (the pull reaped all);
	 * after a failure, what is left is dropped. */
	fw_cancel(fw);
	lanes_stop(fw);
	if (atomic_load(&fw->batches))
		log_info("cluster pull %s: %llu small files came in %llu batches", fw->id,
			 (unsigned long long)atomic_load(&fw->batched),
			 (unsigned long long)atomic_load(&fw->batches));
	while (fw->done) {
		struct fitem *it = fw->done;

		fw->done = it->next;
		if (it->rc == PULL_FWD_OK)
			unlinkat(fw->tmp_fd, it->tmp, 0);
		free((char *)it->f.rel);
		free(it);
	}
	if (fw->tmp_fd >= 0)
		close(fw->tmp_fd);
	if (fw->dst_fd >= 0)
		close(fw->dst_fd);
	pthread_cond_destroy(&fw->cv);
	pthread_mutex_destroy(&fw->mu);
	free((void *)fw->probe_miss);
	free(fw);
}

uint64_t cfwd_bytes_in(struct cfwd *fw)
{
	return atomic_load(&fw->bytes_in);
}

static int fw_begin(void *arg, const char *dst, int dst_fd, int tmp_fd)
{
	struct cfwd *fw = arg;
	int rc = 0;

	/* Each pass has a new tmp/: what is kept is the last one's. */
	if (fw->tmp_fd >= 0)
		close(fw->tmp_fd);
	fw->tmp_fd = fcntl(tmp_fd, F_DUPFD_CLOEXEC, 0);
	if (fw->tmp_fd < 0)
		return -errno;
	if (fw->dst_fd >= 0)
		return 0;               /* a later pass (pull --verify staging again) */
	fw->dst_fd = fcntl(dst_fd, F_DUPFD_CLOEXEC, 0);
	if (fw->dst_fd < 0)
		return -errno;
	rc = cpull_sess_begin(fw->id, dst_fd);
	if (rc < 0)
		return rc;
	uint64_t lanes = peers.cfg->memory / LANE_MEM;

	lanes = lanes < 2 ? 2 : lanes > CFWD_LANES ? CFWD_LANES : lanes;
	for (unsigned i = 0; i < lanes && fw->nn->n > 1; i++) {
		struct lane *l = &fw->lanes[i];

		l->fw = fw;
		l->no = i;
		rc = wq_open(&l->wq);
		if (rc < 0)
			break;
		l->wq_open = true;
		rc = -pthread_create(&l->thread, NULL, lane_main, l);
		if (rc < 0)
			break;
		l->started = true;
	}
	if (rc < 0)
		log_warn("cluster pull %s: %s: a lane: %s", fw->id, dst, strerror(-rc));
	/* One lane is enough to go on with; none is an error. */
	return fw->nn->n == 1 || fw->lanes[0].started ? 0 : rc;
}

static bool fw_reads(void *arg, const char *rel)
{
	struct cfwd *fw = arg;

	size_t nx;

	if (cpull_reader(fw->nn, rel, NULL, 0, false) != fw->nn->self)
		return false;
	/* Ours to read: unless the next node may hold it already (probe). */
	nx = cpull_reader(fw->nn, rel, NULL, 0, true);
	return nx == fw->nn->n || atomic_load(&fw->probe_miss[nx]) >= PROBE_MISSES;
}

static int fw_start(void *arg, const struct pull_fwd *f)
{
	struct cfwd *fw = arg;
	struct fitem *it = calloc(1, sizeof(*it));

	if (!it || !(it->f.rel = strdup(f->rel))) {
		free(it);
		return -ENOMEM;
	}
	it->f.size = f->size;
	it->f.mtime_ns = f->mtime_ns;
	it->f.mode = f->mode;
	it->f.uid = f->uid;
	it->f.gid = f->gid;
	it->f.cookie = f->cookie;
	it->reader = cpull_reader(fw->nn, it->f.rel, NULL, 0, false);
	pthread_mutex_lock(&fw->mu);
	if (it->reader == fw->nn->self) {
		/* A probe first: it never waits at the other end, and this
		 * node's own reads wait for it. */
		it->next = fw->q_head;
		fw->q_head = it;
		if (!fw->q_tail)
			fw->q_tail = it;
	} else {
		if (fw->q_tail)
			fw->q_tail->next = it;
		else
			fw->q_head = it;
		fw->q_tail = it;
	}
	fw->inflight++;
	pthread_cond_broadcast(&fw->cv);
	pthread_mutex_unlock(&fw->mu);
	return 0;
}

static unsigned fw_reap(void *arg, int timeout_ms,
			void (*done)(void *cookie, int rc, const char *tmp, const char *why,
				     bool dest, void *darg), void *darg)
{
	struct cfwd *fw = arg;
	uint64_t deadline = mono_ns() + (uint64_t)timeout_ms * 1000000ull;
	struct fitem *list;
	unsigned n = 0;

	pthread_mutex_lock(&fw->mu);
	while (!fw->done && timeout_ms > 0) {
		struct timespec ts = mono_timespec(deadline);

		if (pthread_cond_timedwait(&fw->cv, &fw->mu, &ts) == ETIMEDOUT)
			break;
	}
	list = fw->done;
	fw->done = NULL;
	for (struct fitem *it = list; it; it = it->next)
		fw->inflight--;
	pthread_mutex_unlock(&fw->mu);
	while (list) {
		struct fitem *it = list;

		list = it->next;
		done(it->f.cookie, it->rc, it->tmp, it->why, it->ours, darg);
		free((char *)it->f.rel);
		free(it);
		n++;
	}
	return n;
}

static unsigned fw_inflight(void *arg)
{
	struct cfwd *fw = arg;
	unsigned n;

	pthread_mutex_lock(&fw->mu);
	n = fw->inflight;
	pthread_mutex_unlock(&fw->mu);
	return n;
}

static void fw_cancel(void *arg)
{
	struct cfwd *fw = arg;
	struct fitem *q;

	atomic_store(&fw->cancel, true);
	pthread_mutex_lock(&fw->mu);
	/* What no lane has taken is done at once. */
	q = fw->q_head;
	fw->q_head = fw->q_tail = NULL;
	while (q) {
		struct fitem *it = q;

		q = it->next;
		it->rc = -ECANCELED;
		it->next = fw->done;
		fw->done = it;
	}
	for (unsigned i = 0; i < CFWD_LANES; i++)
		if (fw->lanes[i].active)
			fw->lanes[i].active->ops->shutdown(fw->lanes[i].active);
	pthread_cond_broadcast(&fw->cv);
	pthread_mutex_unlock(&fw->mu);
}

static void fw_failed(void *arg, const char *rel, const char *why)
{
	struct cfwd *fw = arg;

	cpull_sess_failed(fw->id, rel, why);
}

static void fw_end(void *arg, bool ok)
{
	struct cfwd *fw = arg;

	cpull_sess_pulled(fw->id, ok);
}

const struct pull_share_ops cfwd_ops = {
	.begin = fw_begin, .reads = fw_reads, .start = fw_start, .reap = fw_reap,
	.inflight = fw_inflight, .cancel = fw_cancel, .failed = fw_failed, .end = fw_end,
};
