/* The receiver: serves the offers of an authenticated peer connection,
 * building the copies under replica_root. This file is the offer, from
 * MSG_OFFER to MSG_DONE, and status; repl_build.c builds the copy
 * (repl_rx.h holds what they share).
 *
 * Layout (docs/ARCHITECTURE.md):
 *   replica_root/ORIGIN/JOB/STEP/             a complete copy, manifest last
 *   replica_root/.incoming/ORIGIN/JOB/STEP/   a copy being received
 *       .stage/offer      the offered manifest (its root checked)
 *       .stage/journal    "INDEX OFFSET" lines: entry INDEX is durable up
 *                         to OFFSET, every entry before it whole
 * ".incoming" cannot be a node name (names never start with '.'), so no
 * copy in progress ever sits under a final name.
 *
 * Per offer: the manifest arrives; if the same root is already published,
 * WANT says "have it"; otherwise WANT gives the resume point from the
 * journal (0 0 when new, or when the offer's root differs from the one in
 * .incoming, which is then emptied) and which chunks are held here already
 * (repl_have.c; those the sender leaves out). Each DATA piece is decoded
 * (its XXH3-64 checked by the codec frame) and must come after the bytes
 * the cursor is on; a gap before it must be held chunks, which are copied
 * from the local copy first. Every byte, sent or held, is hashed in order
 * (every manifest chunk digest and the whole-file digest checked) and
 * written through io_uring. A finished file gets its mode and mtime, is
 * fdatasync'd, and then journaled. At END:
 * the remaining directories, links and empty files, directory metadata,
 * syncfs, offer -> manifest, then the directory is renamed into place
 * (exchanged with an older copy of the same step, which is then removed),
 * old steps beyond `keep` are removed, and DONE is sent.
 *
 * The offer is one row of the peer layer's request table (daemon/peers/):
 * the connection, its admission and handshake are the peer layer's, and
 * the same connection may carry other requests between offers. What a
 * connection that offers needs across its offers (struct rx: replica_root
 * open, the builder) is made at its first offer and kept as the
 * connection's state, released by repl_recv_end when it ends.
 *
 * Anything wrong (a bad digest, a frame out of order, a full disk) is a
 * MSG_ERROR and the end of the connection; the journal keeps the last
 * durable point (it is only ever written where a chunk ends, after the
 * chunk was checked, or set back to a file's start when its bytes are known
 * bad), so the sender's next attempt resumes from there.
 */
#include "daemon/repl/repl_rx.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/codec.h"
#include "common/log.h"
#include "daemon/fs/cred.h"
#include "daemon/net/peer.h"
#include "daemon/repl/repl.h"
#include "daemon/obs/obs.h"

static void rx_register(struct rx *r)
{
	pthread_mutex_lock(&repl.lock);
	for (;;) {
		struct rx_slot *s = rx_slot_find(r->slot.key);

		if (!s)
			break;
		s->x->ops->shutdown(s->x);  /* a stale connection of the same sender */
		{
			/* and its offer's thread, if it waits for a stream */
			struct rx *old = rx_of_slot(s);

			pthread_mutex_lock(&old->smu);
			old->closing = true;
			pthread_cond_broadcast(&old->scv);
			pthread_mutex_unlock(&old->smu);
		}
		pthread_cond_wait(&repl.cond, &repl.lock);
	}
	r->slot.next = repl.rx;
	repl.rx = &r->slot;
	pthread_mutex_unlock(&repl.lock);
}

static void rx_unregister(struct rx *r)
{
	pthread_mutex_lock(&repl.lock);
	for (struct rx_slot **pp = &repl.rx; *pp; pp = &(*pp)->next)
		if (*pp == &r->slot) {
			*pp = r->slot.next;
			break;
		}
	pthread_cond_broadcast(&repl.cond);
	pthread_mutex_unlock(&repl.lock);
}

static void close_transfer(struct rx *r)
{
	if (r->cb.whole)
		cbuild_end(&r->cb);
	if (r->fd >= 0)
		close(r->fd);
	r->fd = -1;
	if (r->have_ce)
		mf_entry_free(&r->ce);
	r->have_ce = false;
	have_free(r->have);
	r->have = NULL;
	if (r->src_fd >= 0)
		close(r->src_fd);
	r->src_fd = -1;
	r->src_path = NULL;
	if (r->mr)
		mf_reader_close(r->mr);
	r->mr = NULL;
	if (r->journal)
		fclose(r->journal);
	r->journal = NULL;
	if (r->sums)
		fclose(r->sums);
	r->sums = NULL;
	if (r->final_fd >= 0)
		close(r->final_fd);
	r->final_fd = -1;
	r->final_got = 0;
	if (r->st_fd >= 0)
		close(r->st_fd);
	if (r->in_fd >= 0)
		close(r->in_fd);
	r->st_fd = r->in_fd = -1;
}

/* Which chunks of the offer this node holds already (repl_have.c): unless
 * a local copy let this offer down before (.stage/nolocal). Without a plan
 * everything is sent, as it would be to a receiver that does not plan. */
static void plan_held(struct rx *r)
{
	int rc;

	if (faccessat(r->st_fd, "nolocal", F_OK, 0) == 0)
		return;
	rc = have_plan(&r->have, r->rr_fd, r->st_fd, "offer", r->origin, r->job,
		       r->j_idx, r->j_off);
	if (rc < 0)
		log_warn("%s: looking for chunks held here: %s; asking for all of them",
			 r->slot.key, strerror(-rc));
	else if (r->have)
		log_info("%s: %llu chunks of it are held here already", r->slot.key,
			 (unsigned long long)have_count(r->have));
}

/* One offer, from OFFER to DONE. 0, or -errno with r->why (sent). */
static int serve_offer(struct rx *r, const struct msg *offer)
{
	char *hex = NULL, rel[3 * (CKPT_NAME_MAX + 1) + 32];
	uint64_t size, streams = 1, yield_ms = repl_yield_budget(), yield0 = yield_ms;
	digest_t have;
	struct msg m;
	int rc;

	/* A connection that carries offers replicates: it yields to the
	 * trainer from now on. Restores' and questions' connections never
	 * offer, and keep the daemon's priority (a restore is on the job's
	 * critical path). */
	if (!r->background) {
		repl_background("a receiver");
		r->background = true;
	}
	{
		uint64_t late = 0;

		/* K_LATE 1: the manifest comes last; the one offered has no
		 * digests, and its root is the offer's (no K_ROOT). */
		msg_get_u64(offer, K_LATE, &late);
		r->late = late == 1;
	}
	if (ckpt_get_name(offer, K_ORIGIN, r->origin) < 0 ||
	    ckpt_get_name(offer, K_JOB, r->job) < 0 ||
	    ckpt_get_name(offer, K_STEP, r->step) < 0 ||
	    (!r->late && (msg_get_str(offer, K_ROOT, &hex) < 0 ||
			  digest_from_hex(hex, strlen(hex), &r->root) < 0)) ||
	    msg_get_u64(offer, K_SIZE, &size) < 0) {
		free(hex);
		return rx_fail(r, -EBADMSG, "a malformed offer");
	}
	free(hex);
	{
		uint64_t uid, gid;

		/* The origin's owner, numerically: replicas are their owner's as
		 * the checkpoint is. A daemon that is not root keeps them its own. */
		r->chown = cred_is_root() && msg_get_u64(offer, K_UID, &uid) == 0 &&
			   msg_get_u64(offer, K_GID, &gid) == 0 && uid < UINT32_MAX &&
			   gid < UINT32_MAX;
		r->uid = r->chown ? (uid_t)uid : 0;
		r->gid = r->chown ? (gid_t)gid : 0;
	}
	if (strcmp(r->origin, r->peer) != 0)
		return rx_fail(r, -EACCES, "node %s may offer only its own checkpoints, not %s's",
			    r->peer, r->origin);
	if (size == 0 || size > REPL_MF_MAX)
		return rx_fail(r, -EFBIG, "a manifest of %llu bytes", (unsigned long long)size);
	if ((rc = msg_get_u64(offer, K_STREAMS, &streams)) < 0 && rc != -ENOENT)
		return rx_fail(r, -EBADMSG, "a malformed offer");
	if (streams < 1 || streams > REPL_MAX_STREAMS)
		return rx_fail(r, -EINVAL, "an offer on %llu streams (1 to %d)",
			       (unsigned long long)streams, REPL_MAX_STREAMS);
	/* The builder (a ring and 4 MiB of buffers) only for a connection that
	 * offers: most connections carry a question or a fetch, and setting it
	 * up and tearing it down for each was a third of the CPU of a
	 * verify --cluster of 256 nodes (the unmaps' TLB flushes). */
	if (!r->cb.whole && (rc = cbuild_open(&r->cb)) < 0)
		return rx_fail(r, rc, "cannot set up the writer: %s", strerror(-rc));
	r->ci = r->gbase = r->j_idx = r->j_off = 0;  /* a connection carries offer after offer */
	snprintf(r->slot.key, sizeof(r->slot.key), "%s/%s/%s", r->origin, r->job, r->step);
	r->slot.x = r->x;
	r->slot.got = r->slot.local = 0;
	r->slot.owner = r->uid;
	if ((rc = rx_streams_open(r, (unsigned)streams)) < 0)
		return rx_fail(r, rc, "cannot take %llu streams: %s", (unsigned long long)streams,
			       strerror(-rc));
	{
		uint64_t restream = 0;

		/* A lost further stream's turns go to the others when the
		 * sender takes MSG_RESTREAM (an older one fails the copy). */
		msg_get_u64(offer, K_RESTREAM, &restream);
		r->handoff = streams > 1 && restream == 1 && !r->late;
	}
	rx_register(r);
	r->x->ops->set_timeout(r->x, peers_io_ms());
	rc = rx_take_offer(r, size);
	if (rc < 0)
		goto out;
	rx_streams_chunk_size(r, r->chunk_size);    /* before WANT: before any piece */
	snprintf(rel, sizeof(rel), "%s/%s/%s/%s", r->origin, r->job, r->step, MF_NAME);
	msg_init(&m, MSG_WANT);
	if (!r->late && ckpt_manifest_root(r->rr_fd, rel, &have, NULL, NULL, 0) == 0 &&
	    digest_eq(have, r->root)) {
		msg_put_u64(&m, K_CODE, 1);
		rc = r->x->ops->send(r->x, &m);
		msg_free(&m);
		log_info("%s: already held", r->slot.key);
		rx_drop_incoming(r);
		goto out;
	}
	msg_put_u64(&m, K_CODE, 0);
	msg_put_u64(&m, K_FILE, r->j_idx);
	msg_put_u64(&m, K_OFFSET, r->j_off);
	/* Every byte is checked against the manifest (engine/cbuild.h), not
	 * against its frame's digest: the sender need not compute it. */
	msg_put_u64(&m, K_FRAME_SUM, 0);
	if (r->handoff)
		msg_put_u64(&m, K_RESTREAM, 1);
	if (!r->late)   /* held chunks are found by their digests, which come last */
		plan_held(r);
	if (r->have) {
		size_t len;
		const uint8_t *bits = have_bits(r->have, &len);

		msg_put_bytes(&m, K_HELD, bits, len);
	}
	rc = r->x->ops->send(r->x, &m);
	msg_free(&m);
	if (rc < 0) {
		rx_fail(r, rc, "sending: %s", strerror(-rc));
		goto out;
	}
	if (r->j_idx || r->j_off)
		log_info("%s: resuming at entry %llu, byte %llu", r->slot.key,
			 (unsigned long long)r->j_idx, (unsigned long long)r->j_off);
	rc = mf_reader_open(&r->mr, r->st_fd, "offer", MF_COMPLETE);
	if (rc < 0 || (rc = rx_next_entry(r)) < 0) {
		rx_fail(r, rc, "the offer: %s", strerror(-rc));
		goto out;
	}
	for (;;) {
		struct rx_piece *pc;

		repl_yield(r->job, &yield_ms);  /* this node's trainer first: the sender waits */
		rc = rx_recv(r, &m, &pc);
		if (rc < 0 && r->why[0])
			goto out;       /* a stream's failure, said */
		if (rc < 0) {
			rx_fail(r, rc, "receiving: %s", rc == -ENOTCONN ? "the sender closed" :
			     rc == -EBADMSG ? "a frame failed its seal or is malformed (altered "
			     "on the way?)" : strerror(-rc));
			goto out;
		}
		if (m.type == MSG_END) {
			/* Every entry made, then (manifest last) what landed
			 * compared with the manifest that came. */
			rc = rx_advance_to(r, UINT64_MAX, 0);
			if (rc == 0 && r->late)
				rc = rx_late_end(r, &m);
			msg_free(&m);
			if (rc < 0)
				goto out;
			break;
		}
		rc = pc ? rx_on_piece(r, pc) : m.type == MSG_DATA ? rx_on_data(r, &m) :
			m.type == MSG_MANIFEST && r->late ? rx_late_slice(r, &m) :
			rx_fail(r, -EPROTO, "unexpected frame type %u", m.type);
		msg_free(&m);
		if (pc)
			rx_piece_done(r, pc);
		if (rc < 0)
			goto out;
	}
	if ((rc = rx_publish(r)) < 0)
		goto out;
	/* Before DONE: a sender that hears it may look at our figures at once. */
	obs_add(OBS_REPLICAS, 1);
	msg_init(&m, MSG_DONE);
	msg_put_u64(&m, K_CODE, 0);
	msg_put_str(&m, K_ROOT, "");
	if (yield_ms != yield0)
		msg_put_u64(&m, K_PAUSED, yield0 - yield_ms);
	rc = r->x->ops->send(r->x, &m);
	msg_free(&m);
	log_info("%s: received and published (%llu bytes received, %llu from local copies)",
		 r->slot.key, (unsigned long long)r->slot.got, (unsigned long long)r->slot.local);
out:
	rx_streams_close(r);
	close_transfer(r);
	rx_unregister(r);
	return rc;
}

/* What a connection keeps from its first offer on. 0 or -errno. */
static int rx_new(struct xport *x, const char *peer, struct rx **out)
{
	struct rx *r = calloc(1, sizeof(*r));

	if (!r)
		return -ENOMEM;
	r->x = x;
	r->nstreams = 1;
	pthread_mutex_init(&r->smu, NULL);
	mono_cond_init(&r->scv);
	snprintf(r->peer, sizeof(r->peer), "%s", peer);
	r->fd = r->in_fd = r->st_fd = r->src_fd = r->final_fd = -1;
	r->rr_fd = open(repl.cfg->replica_root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (r->rr_fd < 0) {
		int rc = -errno;

		pthread_mutex_destroy(&r->smu);
		pthread_cond_destroy(&r->scv);
		free(r);
		return rc;
	}
	*out = r;
	return 0;
}

void repl_recv_end(void *state)
{
	struct rx *r = state;

	cbuild_close(&r->cb);
	close(r->rr_fd);
	pthread_mutex_destroy(&r->smu);
	pthread_cond_destroy(&r->scv);
	free(r);
}

int repl_recv_offer(struct xport *x, const char *peer, const struct msg *req)
{
	struct rx *r = peers_conn_state(MSG_OFFER);
	int rc;

	if (!r) {
		rc = rx_new(x, peer, &r);
		if (rc == 0 && (rc = peers_conn_set_state(MSG_OFFER, r)) < 0)
			repl_recv_end(r);
		if (rc < 0) {
			log_warn("from %s: cannot take an offer: %s", peer, strerror(-rc));
			peer_send_error(x, -rc, "%s: cannot take an offer: %s", repl.cfg->name,
					strerror(-rc));
			return rc;
		}
	}
	r->why[0] = '\0';
	r->lost = false;
	rc = serve_offer(r, req);
	if (rc == -ENOSPC) {
		/* Keeping the partial copy for a resume would keep the disk
		 * full for every other transfer too. */
		log_warn("%s: replica_root is full: dropping the partial copy", r->slot.key);
		rx_drop_incoming(r);
	}
	if (rc < 0) {
		obs_add(OBS_REPLICA_FAILURES, 1);
		log_warn("from %s: %s", r->peer, r->why);
		if (rc == -ENOSPC || rc == -EDQUOT)
			peer_send_error(r->x, -rc, "%s: its replica_root %s is full (%s); free "
					"space there, or keep fewer steps ([cluster] keep)",
					repl.cfg->name, repl.cfg->replica_root, r->why);
		else if (!r->lost)
			peer_send_error(r->x, -rc, "%s: %s", repl.cfg->name, r->why);
	}
	return rc;
}

void repl_recv_status(struct msg *m, uid_t viewer)
{
	for (struct rx_slot *s = repl.rx; s; s = s->next) {
		char v[1024];

		if (viewer != 0 && s->owner != viewer)
			continue;
		snprintf(v, sizeof(v), "%s: %llu bytes so far, %llu more from local copies", s->key,
			 (unsigned long long)s->got, (unsigned long long)s->local);
		msg_put_str(m, K_NAME, "receiving");
		msg_put_str(m, K_VALUE, v);
	}
}
