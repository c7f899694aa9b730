/* The replication service: its partners, commits, the committer and
 * watcher threads (what `stage status` and `stage ls` see of it is
 * repl_view.c). The states
 * of a record and its copies are in repl_impl.h.
 *
 * Threads: the committer hashes checkpoints (one at a time, oldest commit
 * first); one sender per partner (repl_send.c); the offers of a peer's
 * connection, on the thread the peer layer serves it on (repl_recv.c); the
 * watcher (watch = on). They meet only
 * in `repl` under repl.lock, and wake each other with repl.cond.
 */
#include "daemon/repl/repl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/manifest.h"
#include "daemon/repl/repl_impl.h"
#include "daemon/fs/cred.h"
#include "daemon/fs/roots.h"
#include "daemon/fs/treeops.h"
#include "daemon/pull/verify.h"
#include "daemon/ckpt/watch.h"
#include "daemon/obs/obs.h"

#define QUIET_MS 2000      /* after a marker: writers finishing other files */

/* Whether JOB/STEP is being restored, or a restore of it was cut off (its
 * mark is still there). Under lock. */
static bool restore_pending(const char *job, const char *step)
{
	char mark[PATH_MAX];

	for (struct restoring *x = repl.restoring; x; x = x->next)
		if (strcmp(x->job, job) == 0 && strcmp(x->step, step) == 0)
			return true;
	snprintf(mark, sizeof(mark), "%s/%s/%s/%s/%s", repl.cfg->ckpt_root, job, step, MF_DIRNAME,
		 RESTORE_MARK);
	return access(mark, F_OK) == 0;
}

/* JOB/STEP's record (a new one if none), moved to the end of the list (the
 * newest commit) with a fresh seq and, unless keep_copies, fresh copies:
 * state and root are the caller's to set, then save. NULL if out of
 * memory. Under lock. */
static struct record *requeue_locked(const char *job, const char *step, bool keep_copies)
{
	struct record *r = repl_rec_find(job, step);
	struct record **pp;

	if (r) {
		for (pp = &repl.records; *pp; pp = &(*pp)->next)
			if (*pp == r) {
				*pp = r->next;
				break;
			}
		if (!keep_copies)
			for (size_t i = 0; i < (repl.npartners ? repl.npartners : 1); i++) {
				bool pinned = r->copies[i].pinned;   /* its waiter still waits */

				memset(&r->copies[i], 0, sizeof(r->copies[i]));
				r->copies[i].pinned = pinned;
			}
	} else if (!(r = repl_rec_new(job, step))) {
		return NULL;
	}
	r->seq = wall_ns();
	r->why[0] = '\0';
	r->hash_no = 0;
	r->late_tried = false;
	for (pp = &repl.records; *pp; pp = &(*pp)->next)
		;
	r->next = NULL;
	*pp = r;
	return r;
}

/* Whoever waits for every copy of r: none is skipped. Under lock. */
static void pin_all(struct record *r)
{
	for (size_t i = 0; i < (repl.npartners ? repl.npartners : 1); i++)
		r->copies[i].pinned = true;
}

/* Queues a commit of JOB/STEP, its copies pinned if pin (someone waits for
 * them); returns its seq (the record may be gone already: retention keeps
 * the newest steps). Under lock. */
static uint64_t commit_locked(const char *job, const char *step, bool pin)
{
	struct record *r = repl_rec_find(job, step);
	uint64_t seq;

	if (r && r->state == R_HASHING) {
		r->rehash = true;       /* the committer hashes it once more */
		if (pin)
			pin_all(r);
		return r->seq;
	}
	r = requeue_locked(job, step, false);
	if (!r)
		return 0;
	r->state = R_HASHING;
	if (pin)
		pin_all(r);
	seq = r->seq;
	repl_rec_save(r);
	repl_rec_retain(job);   /* may drop r */
	pthread_cond_broadcast(&repl.cond);
	return seq;
}

static void *committer_main(void *arg)
{
	pthread_setname_np(pthread_self(), "commit");
	repl_background("the committer");
	pthread_mutex_lock(&repl.lock);
	while (!repl.stopping) {
		struct record *r = repl.records;
		char job[CKPT_NAME_MAX + 1], step[CKPT_NAME_MAX + 1], why[1024];
		uint64_t files = 0, bytes = 0, t0;
		struct cred *owner = NULL;
		bool sent = false;      /* a copy reads it again soon: a partner not down */
		bool in_order = false;  /* a copy may read it beside the hash (repl_late.c) */
		digest_t root;
		int rc;

		while (r && r->state != R_HASHING)
			r = r->next;
		if (!r) {
			pthread_cond_wait(&repl.cond, &repl.lock);
			continue;
		}
		strcpy(job, r->job);
		strcpy(step, r->step);
		r->rehash = false;
		r->hash_no++;           /* a copy sent as it is hashed waits for this one */
		pthread_cond_broadcast(&repl.cond);     /* a sender may take it now */
		for (size_t i = 0; i < repl.npartners; i++) {
			sent |= repl.partners[i].state != PEER_DOWN;
			in_order |= repl.partners[i].state != PEER_DOWN && repl_late_ok(i, r);
		}
		pthread_mutex_unlock(&repl.lock);
		t0 = mono_ns();
		rc = repl_enter_job_owner(job, &owner, why, sizeof(why));
		if (rc == 0)
			rc = ckpt_manifest(repl.cfg, job, step, sent, in_order, &root, &files,
					   &bytes, why, sizeof(why));
		cred_leave();
		free(owner);
		owner = NULL;
		pthread_mutex_lock(&repl.lock);
		r = repl_rec_find(job, step);
		if (!r || r->state != R_HASHING)
			continue;
		if (r->rehash)
			continue;       /* committed again meanwhile: hash again */
		/* Counted here, once the hash stands: one thrown away for a
		 * newer commit of the step is not a commit. */
		obs_add(rc == 0 ? OBS_COMMITS : OBS_COMMIT_FAILURES, 1);
		if (rc == 0) {
			obs_add(OBS_COMMIT_BYTES, bytes);
			obs_last(OBS_LAST_COMMIT_NS, mono_ns() - t0);
			r->state = R_READY;
			r->root = root;
			r->files = files;
			r->bytes = bytes;
			log_info("commit %s/%s: manifest written, %llu files, %llu bytes", job, step,
				 (unsigned long long)files, (unsigned long long)bytes);
		} else {
			r->state = R_FAILED;
			snprintf(r->why, sizeof(r->why), "%s", why);
			log_err("commit %s/%s: %s", job, step, why);
		}
		repl_rec_save(r);
		pthread_cond_broadcast(&repl.cond);
	}
	pthread_mutex_unlock(&repl.lock);
	return NULL;
}

/* Whether JOB/STEP is, entry for entry, what its manifest says (types,
 * sizes, mtimes: a fast verify, no byte read) and that manifest's root is
 * root: the step has not changed since it was committed or restored. 1
 * unchanged, 0 changed (or no manifest to compare with), -ECANCELED the
 * daemon is stopping. */
static int unchanged_since(const char *job, const char *step, digest_t root)
{
	char rel[2 * CKPT_NAME_MAX + 2], path[PATH_MAX];
	struct cred *owner = NULL;
	digest_t mroot;
	struct job j;
	int fd, rc, switched;

	snprintf(rel, sizeof(rel), "%s/%s", job, step);
	snprintf(path, sizeof(path), "%s/%s", repl.cfg->ckpt_root, rel);
	fd = treeops_open_beneath_path(repl.cfg->ckpt_root, rel);
	if (fd < 0)
		return 0;
	switched = cred_enter_owner(fd, &owner);
	if (switched < 0) {     /* not looked at as root instead */
		close(fd);
		return 0;
	}
	job_begin(&j, -1, 0, repl.cfg, "verify", path);
	rc = verify_tree(&j, path, fd, &(struct verify_opts){ .root = &mroot });
	job_end(&j);
	if (switched)
		cred_leave();
	free(owner);
	close(fd);
	if (rc == -ECANCELED)
		return rc;
	return rc == 0 && digest_eq(mroot, root);
}

static void on_finished(const char *job, const char *step, const char *why, void *arg)
{
	/* The watcher reports a step once it has been quiet this long; a commit
	 * made since its last write (the trainer called `stage commit`) is
	 * this very checkpoint, already committed. */
	uint64_t quiet_ms = strncmp(why, "marker", 6) == 0 ? QUIET_MS :
			    (uint64_t)repl.cfg->settle * 1000;
	uint64_t last_write = wall_ns() - quiet_ms * 1000000ull;
	struct record *r;
	digest_t root;

	pthread_mutex_lock(&repl.lock);
	r = repl_rec_find(job, step);
	if (restore_pending(job, step)) {
		/* A restore writes there (or was cut off): committing half a
		 * restore would replicate it over the intact copies. */
		log_info("%s/%s is being restored, or its restore did not finish: not committing "
			 "it", job, step);
		pthread_mutex_unlock(&repl.lock);
		return;
	}
	if (r && r->state != R_FAILED && r->seq >= last_write) {
		log_debug("%s/%s is finished (%s), and already committed", job, step, why);
		pthread_mutex_unlock(&repl.lock);
		return;
	}
	/* The times can mislead: a restore's last writes (its mark removed)
	 * come after it recorded the step as committed, and a watcher that
	 * reads its events late takes them for newer still. A step that still
	 * matches the manifest its record vouches for needs no new commit,
	 * which would re-read every byte while the job restarts. */
	if (r && r->state == R_READY) {
		uint64_t seq = r->seq;
		int rc;

		root = r->root;
		pthread_mutex_unlock(&repl.lock);
		rc = unchanged_since(job, step, root);
		if (rc == 1)
			log_info("checkpoint %s/%s/%s: unchanged since its commit or restore (the "
				 "watcher saw %s): not committed again", repl.cfg->ckpt_root, job,
				 step, why);
		if (rc != 0)
			return;         /* unchanged, or the daemon is stopping */
		/* Unlocked meanwhile: a commit or a restore of the step since
		 * has settled it. */
		pthread_mutex_lock(&repl.lock);
		r = repl_rec_find(job, step);
		if (restore_pending(job, step) || (r && (r->seq != seq || r->state == R_HASHING))) {
			pthread_mutex_unlock(&repl.lock);
			return;
		}
	}
	log_info("checkpoint %s/%s/%s is finished (%s): committing", repl.cfg->ckpt_root,
		 job, step, why);
	commit_locked(job, step, false);
	pthread_mutex_unlock(&repl.lock);
}

int repl_restore_begin(const char *job, const char *step)
{
	struct record *r;
	struct restoring *x;

	pthread_mutex_lock(&repl.lock);
	r = repl_rec_find(job, step);
	if (r && r->state == R_HASHING) {
		pthread_mutex_unlock(&repl.lock);
		return -EAGAIN;         /* a commit is hashing it: one or the other */
	}
	for (x = repl.restoring; x; x = x->next)
		if (strcmp(x->job, job) == 0 && strcmp(x->step, step) == 0) {
			pthread_mutex_unlock(&repl.lock);
			return -EBUSY;
		}
	x = calloc(1, sizeof(*x));
	if (x) {
		snprintf(x->job, sizeof(x->job), "%s", job);
		snprintf(x->step, sizeof(x->step), "%s", step);
		x->next = repl.restoring;
		repl.restoring = x;
	}
	pthread_mutex_unlock(&repl.lock);
	return x ? 0 : -ENOMEM;
}

void repl_restore_end(const char *job, const char *step)
{
	pthread_mutex_lock(&repl.lock);
	for (struct restoring **pp = &repl.restoring; *pp; pp = &(*pp)->next)
		if (strcmp((*pp)->job, job) == 0 && strcmp((*pp)->step, step) == 0) {
			struct restoring *x = *pp;

			*pp = x->next;
			free(x);
			break;
		}
	pthread_mutex_unlock(&repl.lock);
}

void repl_restored(const char *job, const char *step, digest_t root, uint64_t files,
		   uint64_t bytes)
{
	struct record *r;

	pthread_mutex_lock(&repl.lock);
	r = repl_rec_find(job, step);
	/* Committed now (so the watcher, seeing the writes, does not commit it
	 * again) with the restored root. The copies stand if the record already
	 * had this root; otherwise each partner is offered it again and,
	 * holding it, answers "have it" at the cost of a manifest. */
	r = requeue_locked(job, step, r && r->state == R_READY && digest_eq(r->root, root));
	if (!r) {
		pthread_mutex_unlock(&repl.lock);
		return;
	}
	r->state = R_READY;
	r->root = root;
	r->files = files;
	r->bytes = bytes;
	repl_rec_save(r);
	repl_rec_retain(job);
	pthread_cond_broadcast(&repl.cond);
	pthread_mutex_unlock(&repl.lock);
}

static void *watcher_main(void *arg)
{
	struct watch *w = arg;

	pthread_setname_np(pthread_self(), "watch");
	for (;;) {
		struct pollfd p[2] = {
			{ .fd = watch_fd(w), .events = POLLIN },
			{ .fd = repl.stop_fd, .events = POLLIN },
		};
		int rc = poll(p, 2, watch_timeout_ms(w));

		if (rc < 0 && errno != EINTR)
			break;
		if (p[1].revents)
			break;
		if (p[0].revents && watch_handle(w, on_finished, NULL) < 0) {
			log_err("watch %s: inotify failed; automatic commits stop",
				repl.cfg->ckpt_root);
			break;
		}
		watch_tick(w, on_finished, NULL);
	}
	watch_close(w);
	return NULL;
}

/* This node's partners (a cluster of more than one node). */
static int open_partners(const struct stage_config *cfg)
{
	size_t *idx;
	int n;

	if (!peers.cluster || peers.hosts.n == 1)
		return 0;
	idx = calloc(peers.hosts.n, sizeof(*idx));
	if (!idx)
		return -ENOMEM;
	n = hosts_partners(&peers.hosts, peers.self, cfg->replicas, idx, peers.hosts.n);
	if (n < 0) {
		free(idx);
		return n;
	}
	if (cfg->replicas != CFG_REPLICAS_ALL && n < cfg->replicas)
		log_warn("replicas = %d, but only %d node(s) outside this node's domain: "
			 "each checkpoint gets %d copies", cfg->replicas, n, n);
	repl.partners = calloc((size_t)n + 1, sizeof(*repl.partners));
	if (!repl.partners) {
		free(idx);
		return -ENOMEM;
	}
	for (int i = 0; i < n; i++) {
		repl.partners[i].host = idx[i];
		sadapt_init(&repl.partners[i].sa, config_streams_max(cfg), config_streams(cfg));
	}
	repl.npartners = (size_t)n;
	free(idx);
	return 0;
}

/* The mirror of open_partners. */
static void close_partners(void)
{
	free(repl.partners);
	repl.partners = NULL;
	repl.npartners = 0;
}

int repl_open(const struct stage_config *cfg, char *why, size_t whylen)
{
	struct watch *w = NULL;
	bool ckpt_new;
	int rc;

	repl_state_init();
	repl.cfg = cfg;
	rc = open_partners(cfg);
	if (rc < 0) {
		snprintf(why, whylen, "cannot place this node's copies: %s", strerror(-rc));
		return rc;
	}
	if ((rc = peers_serve(MSG_OFFER, repl_recv_offer, repl_recv_end)) < 0 ||
	    (rc = peers_serve(MSG_STREAM, repl_recv_stream, NULL)) < 0) {
		snprintf(why, whylen, "cannot serve offers: %s", strerror(-rc));
		goto out_close_partners;
	}
	ckpt_new = access(cfg->ckpt_root, F_OK) < 0;
	if ((rc = roots_mkdirs(cfg->ckpt_root, 0755)) < 0 ||
	    (rc = roots_mkdirs(cfg->replica_root, 0755)) < 0) {
		snprintf(why, whylen, "cannot create %s: %s", access(cfg->ckpt_root, F_OK) ?
			 cfg->ckpt_root : cfg->replica_root, strerror(-rc));
		goto out_close_partners;
	}
	/* Each user's trainer makes its own JOB directory there, as in /tmp:
	 * writable by all, sticky (nobody removes or renames another's). */
	if (ckpt_new && cred_switching())
		chmod(cfg->ckpt_root, 01777);
	repl_rec_load_all();
	if (cfg->watch) {
		struct watch_opts wo = {
			.marker = cfg->marker[0] ? cfg->marker : NULL,
			.settle_ms = (uint64_t)cfg->settle * 1000, .quiet_ms = QUIET_MS,
			.wrote = cfg->yield ? repl_wrote : NULL,
		};

		rc = watch_open(&w, cfg->ckpt_root, &wo, why, whylen);
		if (rc < 0)
			goto out_close_partners;
		repl.stop_fd = eventfd(0, EFD_CLOEXEC);
		if (repl.stop_fd < 0) {
			rc = -errno;
			snprintf(why, whylen, "eventfd: %s", strerror(-rc));
			goto out_close_watch;
		}
		rc = -pthread_create(&repl.watcher, NULL, watcher_main, w);
		if (rc < 0) {
			snprintf(why, whylen, "cannot start the watcher: %s", strerror(-rc));
			goto out_close_stop;
		}
		repl.watcher_started = true;
	}
	rc = -pthread_create(&repl.committer, NULL, committer_main, NULL);
	if (rc < 0) {
		snprintf(why, whylen, "cannot start the committer: %s", strerror(-rc));
		goto out_stop_watcher;
	}
	repl.committer_started = true;
	for (size_t i = 0; i < repl.npartners; i++)
		if (pthread_create(&repl.partners[i].thread, NULL, repl_send_main,
				   &repl.partners[i]) != 0)
			log_err("cannot start the sender to %s",
				repl_partner_name(i));
	atomic_store(&peers.copy_notes, repl_copy_notes);
	if (peers.cluster) {
		char list[1024] = "";
		size_t o = 0;

		for (size_t i = 0; i < repl.npartners && o < sizeof(list); i++)
			o += (size_t)snprintf(list + o, sizeof(list) - o, "%s%s", i ? ", " : "",
					      repl_partner_name(i));
		log_info("cluster of %zu nodes; partners: %s; peers on %s", peers.hosts.n,
			 o ? list : "none", peers_listen_fd() >= 0 ? cfg->listen : "(none)");
	}
	return 0;
out_stop_watcher:
	if (repl.watcher_started) {
		uint64_t one = 1;

		if (write(repl.stop_fd, &one, sizeof(one)) < 0)
			log_warn("eventfd: %s", strerror(errno));
		pthread_join(repl.watcher, NULL);
		repl.watcher_started = false;
		w = NULL;
	}
out_close_stop:
	if (repl.stop_fd >= 0)
		close(repl.stop_fd);
	repl.stop_fd = -1;
out_close_watch:
	if (w)
		watch_close(w);
out_close_partners:
	close_partners();
	return rc;
}

void repl_close(void)
{
	pthread_mutex_lock(&repl.lock);
	repl.stopping = true;       /* repl_copy_notes says nothing from here on */
	atomic_store(&peers.copy_notes, NULL);
	for (size_t i = 0; i < repl.npartners; i++) {
		struct partner *p = &repl.partners[i];

		if (p->x)
			p->x->ops->shutdown(p->x);
		for (unsigned j = 1; j < p->nx; j++)
			p->xs[j]->ops->shutdown(p->xs[j]);
	}
	pthread_cond_broadcast(&repl.cond);
	pthread_mutex_unlock(&repl.lock);
	for (size_t i = 0; i < repl.npartners; i++)
		pthread_join(repl.partners[i].thread, NULL);
	if (repl.committer_started)
		pthread_join(repl.committer, NULL);
	if (repl.watcher_started) {
		uint64_t one = 1;

		if (write(repl.stop_fd, &one, sizeof(one)) < 0)
			log_warn("eventfd: %s", strerror(errno));
		pthread_join(repl.watcher, NULL);
	}
	if (repl.stop_fd >= 0)
		close(repl.stop_fd);
	while (repl.records) {
		struct record *r = repl.records;

		repl.records = r->next;
		repl_rec_free(r);
	}
	close_partners();
}

/* --wait: until every copy is confirmed or failed. Under lock. */
static void wait_copies(struct job *j, uint64_t seq, const char *job, const char *step)
{
	char *noted = calloc(repl.npartners + 1, 1024);

	for (;;) {
		struct record *r = repl_rec_find(job, step);
		size_t pending = 0, failed = 0;
		uint64_t sent = 0;

		if (!r) {
			job_result(j, 1, NULL, NULL, "%s/%s: newer steps of the job took its place "
				   "before its copies were confirmed ([cluster] keep = %d keeps only the "
				   "newest)", job, step, repl.cfg->keep);
			break;
		}
		seq = r->seq;
		if (r->state == R_FAILED) {
			job_result(j, 1, NULL, NULL, "commit %s/%s failed: %s", job, step, r->why);
			break;
		}
		if (r->state == R_READY) {
			atomic_store(&j->phase, "replicate");
			for (size_t i = 0; i < repl.npartners; i++) {
				struct rcopy *c = &r->copies[i];
				struct partner *p = &repl.partners[i];
				const char *why = c->state == C_FAILED || c->state == C_SKIPPED ? c->why :
					p->state == PEER_DOWN ? p->why : "";

				pending += c->state == C_PENDING || c->state == C_SENDING;
				failed += c->state == C_FAILED || c->state == C_SKIPPED;
				sent += c->state == C_CONFIRMED ? r->bytes : c->sent;
				if (noted && *why && strcmp(noted + 1024 * i, why) != 0) {
					bool over = c->state == C_FAILED || c->state == C_SKIPPED;

					snprintf(noted + 1024 * i, 1024, "%s", why);
					job_note(j, over ? LOG_ERROR : LOG_WARN, NULL, NULL,
						 "copy on %s: %s%s", repl_partner_name(i), why,
						 over ? "" : " (retrying)");
				}
			}
			atomic_store(&j->bytes_total, r->bytes * repl.npartners);
			atomic_store(&j->bytes_done, sent);
			if (!pending) {
				if (failed)
					job_result(j, 1, NULL, NULL, "%s/%s: %zu of %zu copies "
						   "failed (why: above); `stage status` shows the "
						   "partners, and committing again retries",
						   job, step, failed, repl.npartners);
				else
					job_result(j, 0, NULL, NULL,
						   "%s/%s: manifest written and confirmed on %zu "
						   "partner(s)", job, step, repl.npartners);
				break;
			}
		}
		pthread_mutex_unlock(&repl.lock);
		job_progress(j, false);
		if (job_cancelled(j)) {
			pthread_mutex_lock(&repl.lock);
			break;
		}
		pthread_mutex_lock(&repl.lock);
		repl_wait_until(mono_ns() + 200000000ull);
	}
	(void)seq;
	free(noted);
}

/* Under lock: until partner i has confirmed JOB/STEP (repl_resend). A copy
 * makes progress while anything moves to that partner (it may wait behind
 * other copies) or the step is hashed again; without any for [cluster]
 * peer_timeout (a partner down, or one that takes a copy and drops it) it
 * stays queued and the wait ends, naming why. */
static int resend_wait(const char *job, const char *step, size_t i, char *why, size_t whylen)
{
	const char *to = repl_partner_name(i);
	uint64_t last = mono_ns(), moved = repl.partners[i].raw;

	for (;;) {
		struct record *r = repl_rec_find(job, step);
		const struct partner *p = &repl.partners[i];
		uint64_t now = mono_ns();

		if (!r) {
			snprintf(why, whylen, "newer steps of %s took the place of %s before its copy "
				 "reached %s", job, step, to);
			return -ESTALE;
		}
		if (r->state == R_FAILED) {
			snprintf(why, whylen, "committing %s/%s again failed: %s", job, step, r->why);
			return -EIO;
		}
		if (r->state == R_READY) {
			const struct rcopy *c = &r->copies[i];

			if (c->state == C_CONFIRMED)
				return 0;
			if (c->state == C_FAILED || c->state == C_SKIPPED) {
				snprintf(why, whylen, "the copy of %s/%s on %s %s: %s", job, step, to,
					 c->state == C_FAILED ? "failed" : "was not sent", c->why);
				return -EIO;
			}
		}
		if (r->state == R_HASHING || p->raw != moved) {
			last = now;
			moved = p->raw;
		} else if (now - last > (uint64_t)repl.cfg->peer_timeout * 1000000000ull) {
			if (p->state == PEER_DOWN)
				snprintf(why, whylen, "%s is down (%s): the copy of %s/%s is queued and "
					 "goes when it is back", to, p->why, job, step);
			else
				snprintf(why, whylen, "nothing reached %s for %d s: the copy of %s/%s is "
					 "queued and goes when it can", to, repl.cfg->peer_timeout, job,
					 step);
			return -EHOSTDOWN;
		}
		/* stage_stopping comes first at a shutdown: the peer layer waits
		 * for this thread before replication is told to stop. */
		if (repl.stopping || atomic_load(&stage_stopping)) {
			snprintf(why, whylen, "the daemon is stopping");
			return -ECANCELED;
		}
		repl_wait_until(now + 200000000ull);
	}
}

int repl_resend(const char *job, const char *step, const char *holder, char *why, size_t whylen)
{
	struct record *r;
	size_t i;
	int rc = 0;

	pthread_mutex_lock(&repl.lock);
	for (i = 0; i < repl.npartners; i++)
		if (strcmp(repl_partner_name(i), holder) == 0)
			break;
	r = repl_rec_find(job, step);
	if (i == repl.npartners) {
		snprintf(why, whylen, "%s is not a partner of %s", holder, repl.cfg->name);
		rc = -ENOENT;
	} else if (restore_pending(job, step)) {
		snprintf(why, whylen, "%s/%s is being restored here", job, step);
		rc = -EBUSY;
	} else if (r && r->state == R_READY) {
		r->copies[i].pinned = true;     /* waited for below: never skipped */
		if (r->copies[i].state != C_PENDING && r->copies[i].state != C_SENDING) {
			r->copies[i].state = C_PENDING;
			r->copies[i].tries = 0;
			r->copies[i].why[0] = '\0';
			repl_rec_save(r);
		}
	} else if (!r || r->state == R_FAILED) {
		char mf[8192];

		snprintf(mf, sizeof(mf), "%s/%s/%s/%s", repl.cfg->ckpt_root, job, step, MF_NAME);
		if (access(mf, F_OK) < 0) {
			snprintf(why, whylen, "%s/%s is not committed on %s", job, step,
				 repl.cfg->name);
			rc = -ENOENT;
		} else if (!commit_locked(job, step, false)) {
			snprintf(why, whylen, "out of memory");
			rc = -ENOMEM;
		} else if ((r = repl_rec_find(job, step))) {
			r->copies[i].pinned = true;
		}
	} else {
		r->copies[i].pinned = true;     /* R_HASHING: it is sent once hashed */
	}
	pthread_cond_broadcast(&repl.cond);
	if (rc == 0)
		rc = resend_wait(job, step, i, why, whylen);
	pthread_mutex_unlock(&repl.lock);
	return rc;
}

void repl_commit_run(struct job *j, const char *path_arg)
{
	char job[CKPT_NAME_MAX + 1], step[CKPT_NAME_MAX + 1], why[2048];
	char *path = realpath(path_arg, NULL), *root = NULL;
	int err = errno;
	uint64_t seq;

	if (!path) {
		job_result(j, 2, NULL, NULL, "cannot commit %s: %s", path_arg, strerror(err));
		goto out_free;
	}
	root = realpath(repl.cfg->ckpt_root, NULL);
	if (!root) {
		job_result(j, 2, NULL, NULL, "ckpt_root %s: %s", repl.cfg->ckpt_root,
			   strerror(errno));
		goto out_free;
	}
	{
		struct stage_config c = *repl.cfg;

		c.ckpt_root = root;     /* compare resolved with resolved */
		if (ckpt_parse(&c, path, job, step, why, sizeof(why)) < 0) {
			job_result(j, 2, NULL, NULL, "%s", why);
			goto out_free;
		}
	}
	/* Again, on the job this resolved to: a link swapped in since the
	 * request was admitted must not lead to another user's job. */
	if (roots_job_owner_check(repl.cfg, job, "commit", why, sizeof(why)) < 0) {
		job_result(j, 2, NULL, NULL, "%s", why);
		goto out_free;
	}
	job_set_what(j, "%s/%s", job, step);
	pthread_mutex_lock(&repl.lock);
	if (restore_pending(job, step)) {
		pthread_mutex_unlock(&repl.lock);
		job_result(j, 1, path, NULL, "not committing %s: it is being restored, or its "
			   "restore did not finish (%s/%s/%s exists); run `stage restore %s` again "
			   "first, so that half a restore is never replicated", path, path,
			   MF_DIRNAME, RESTORE_MARK, path);
		goto out_free;
	}
	seq = commit_locked(job, step, j->flags & REQ_WAIT);   /* waited for: never skipped */
	if (!seq) {
		pthread_mutex_unlock(&repl.lock);
		job_result(j, 1, path, NULL, "out of memory");
		goto out_free;
	}
	if (!(j->flags & REQ_WAIT)) {
		pthread_mutex_unlock(&repl.lock);
		job_result(j, 0, path, NULL, "committed %s/%s: manifest and %zu cop%s queued", job,
			   step, repl.npartners, repl.npartners == 1 ? "y" : "ies");
		goto out_free;
	}
	if (!repl.npartners && peers.cluster)
		job_note(j, LOG_WARN, NULL, NULL, "this node has no partners (replicas, domains): "
			 "no copies are made");
	else if (!repl.npartners)
		job_note(j, LOG_WARN, NULL, NULL, "a single node (no hosts file %s, [cluster] hosts): "
			 "no copies are made", repl.cfg->hosts);
	atomic_store(&j->phase, "manifest");
	wait_copies(j, seq, job, step);
	pthread_mutex_unlock(&repl.lock);
out_free:
	free(path);
	free(root);
}
