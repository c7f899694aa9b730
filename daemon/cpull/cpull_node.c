/* One node's part of a cluster pull: asked by the pull's asker
 * (MSG_CPULL_ASK), or by itself when it is the asker (cpull.c), it runs the
 * pull of SRC here with a share (cpull_fwd.c), answers with its figures,
 * and serves its peers (cpull_sess.c) until the asker says every node is
 * done.
 */
#include "daemon/fs/cred.h"
#include "daemon/survey/survey.h"
#include "daemon/cpull/cpull.h"
#include "daemon/cpull/cpull_impl.h"
#include "daemon/peers/peers.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/hostlist.h"
#include "common/log.h"
#include "daemon/net/peer.h"

/* The nodes of an ask, checked against the hosts file; self found. */
static int nodes_take(struct cpull_nodes *nn, const char *list, char *why, size_t whylen)
{
	int rc = survey_nodes(list, &nn->names, &nn->n, why, whylen);

	if (rc < 0)
		return rc;
	nn->self = nn->n;
	nn->host = calloc(nn->n ? nn->n : 1, sizeof(*nn->host));
	nn->dead = calloc(nn->n ? nn->n : 1, sizeof(*nn->dead));
	if (!nn->host || !nn->dead) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	for (size_t i = 0; i < nn->n; i++) {
		for (size_t k = 0; k < i; k++)
			if (strcmp(nn->names[k], nn->names[i]) == 0) {
				snprintf(why, whylen, "node %s is named twice in the pull's nodes",
					 nn->names[i]);
				return -EINVAL;
			}
		nn->host[i] = (size_t)hosts_find(&peers.hosts, nn->names[i]);
		if (strcmp(nn->names[i], peers.cfg->name) == 0)
			nn->self = i;
	}
	if (nn->self == nn->n) {
		snprintf(why, whylen, "this node (%s) is not one of the pull's nodes", peers.cfg->name);
		return -EINVAL;
	}
	return 0;
}

void cpull_nodes_free(struct cpull_nodes *nn)
{
	hostlist_free(nn->names, nn->n);
	free(nn->host);
	free((void *)nn->dead);
	memset(nn, 0, sizeof(*nn));
}

/* While a part runs, its progress goes to its asker every REPORT_MS (the
 * reporter below): a part's asker silent for [cluster] peer_timeout is
 * taken for gone within one more report. */
#define REPORT_MS 250

/* The parts running here, by what they pull where. A part asked while an
 * earlier one of the same SRC into the same DEST still runs here waits for
 * it instead of being refused by the destination's lock: that earlier part
 * is most often one whose asker has given up on this node (a link down),
 * and the rerun its asker advises must not fail on it. The wait is
 * bounded twice over: peer_timeout and two reports for the earlier part's
 * asker to be taken for gone (the reporter below), and, once it has been
 * (the part's job is then `gone`, stopping), peer_timeout and STOP_MS more
 * for it to stop (its fetches from dead peers wait that long at most). An
 * earlier part still wanted by its asker outlives the first bound, and the
 * new one is refused, as two pulls into one destination always are.
 * Under parts_mu; an entry lives from before its pull opens the
 * destination until after it closed it (and so let go of its lock). */
#define STOP_MS 2000

struct part_entry {
	struct part_entry *next;
	const struct cpull_ask *a;     /* the part's own, borrowed */
	struct job *job;               /* its pull's: gone once it is stopping */
};
static pthread_mutex_t parts_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t parts_cv;        /* an entry left, or began to stop */
static pthread_once_t parts_once = PTHREAD_ONCE_INIT;
static struct part_entry *parts;

static void parts_init(void)
{
	mono_cond_init(&parts_cv);
}

static bool same_dest(const struct cpull_ask *x, const struct cpull_ask *y)
{
	return strcmp(x->src, y->src) == 0 &&
	       (x->dest && y->dest ? strcmp(x->dest, y->dest) == 0 : x->dest == y->dest);
}

static struct part_entry *parts_find(const struct cpull_ask *a)
{
	for (struct part_entry *e = parts; e; e = e->next)
		if (same_dest(e->a, a))
			return e;
	return NULL;
}

static int parts_enter(struct part_entry *me, char *why, size_t whylen)
{
	int64_t start = mono_ms(), end = start + peers_io_ms() + 2 * REPORT_MS;
	struct part_entry *o;
	bool said = false, stopping = false;

	pthread_once(&parts_once, parts_init);
	pthread_mutex_lock(&parts_mu);
	while ((o = parts_find(me->a)) && !atomic_load(&me->job->gone)) {
		int64_t now = mono_ms();
		struct timespec ts;

		if (!stopping && atomic_load(&o->job->gone)) {
			stopping = true;
			if (end < now + peers_io_ms() + STOP_MS)
				end = now + peers_io_ms() + STOP_MS;
		}
		if (now >= end)
			break;
		if (!said)
			log_info("cluster pull %s: waiting for cluster pull %s of %s into the same "
				 "destination to end (%s)", me->a->id, o->a->id, o->a->src,
				 stopping ? "it is stopping" : "its asker may have given up on it");
		said = true;
		ts = mono_timespec((uint64_t)end * 1000000ull);
		pthread_cond_timedwait(&parts_cv, &parts_mu, &ts);
	}
	if (o) {
		if (atomic_load(&me->job->gone))
			snprintf(why, whylen, "its asker went while it waited for cluster pull "
				 "%.8s of %s into the same destination to end", o->a->id, o->a->src);
		else
			snprintf(why, whylen, "cluster pull %.8s of %s into the same destination is "
				 "still running here (waited %lld s for it to end)", o->a->id,
				 o->a->src, (long long)(mono_ms() - start + 500) / 1000);
		pthread_mutex_unlock(&parts_mu);
		return -EBUSY;
	}
	if (said)
		log_info("cluster pull %s: the earlier one ended after %lld ms", me->a->id,
			 (long long)(mono_ms() - start));
	me->next = parts;
	parts = me;
	pthread_mutex_unlock(&parts_mu);
	return 0;
}

/* A part began to stop (its job is gone): who waits for it re-reckons. */
static void parts_poke(void)
{
	pthread_once(&parts_once, parts_init);
	pthread_mutex_lock(&parts_mu);
	pthread_cond_broadcast(&parts_cv);
	pthread_mutex_unlock(&parts_mu);
}

static void parts_leave(struct part_entry *me)
{
	pthread_mutex_lock(&parts_mu);
	for (struct part_entry **pp = &parts; *pp; pp = &(*pp)->next)
		if (*pp == me) {
			*pp = me->next;
			break;
		}
	pthread_cond_broadcast(&parts_cv);
	pthread_mutex_unlock(&parts_mu);
}

void cpull_live_read(struct cpull_live *lv, struct cpull_prog *p)
{
	pthread_mutex_lock(&lv->mu);
	if (lv->job) {
		lv->last = (struct cpull_prog){
			.files_done = atomic_load(&lv->job->files_done),
			.files_total = atomic_load(&lv->job->files_total),
			.bytes_done = atomic_load(&lv->job->bytes_done),
			.bytes_total = atomic_load(&lv->job->bytes_total),
			.bytes_fwd = lv->fw ? cfwd_bytes_in(lv->fw) : 0,
		};
	}
	*p = lv->last;
	pthread_mutex_unlock(&lv->mu);
}

void cpull_live_stop(struct cpull_live *lv)
{
	pthread_mutex_lock(&lv->mu);
	if (lv->job)
		atomic_store(&lv->job->gone, true);
	pthread_mutex_unlock(&lv->mu);
	parts_poke();
}

static void live_set(struct cpull_live *lv, struct job *j, struct cfwd *fw)
{
	struct cpull_prog p;

	if (!lv)
		return;
	if (!j)
		cpull_live_read(lv, &p);        /* the last figures stay */
	pthread_mutex_lock(&lv->mu);
	lv->job = j;
	lv->fw = fw;
	pthread_mutex_unlock(&lv->mu);
}

int cpull_part(const struct cpull_ask *a, struct cpull_live *lv, struct cpull_answer *ans,
	       char *why, size_t whylen)
{
	struct job sub;
	struct part_entry me = { .a = a, .job = &sub };
	struct pull_share sh = { .ops = &cfwd_ops };
	struct cpull_nodes nn = { 0 };
	struct cfwd *fw = NULL;
	int rc;

	rc = nodes_take(&nn, a->list, why, whylen);
	if (rc == 0 && (rc = cpull_sess_add(a->id)) < 0)
		snprintf(why, whylen, "%s", rc == -EEXIST ? "that pull is running here already" :
			 rc == -EBUSY ? "too many cluster pulls at once" : strerror(-rc));
	if (rc == 0 && (rc = cfwd_open(&fw, a->id, &nn)) < 0) {
		snprintf(why, whylen, "out of memory");
		cpull_sess_remove(a->id);
	}
	if (rc < 0) {
		cpull_nodes_free(&nn);
		return rc;
	}
	/* REQ_PROGRESS: the pull counts the tree first, so progress has totals
	 * (nothing is sent: the job has no client). */
	job_begin(&sub, -1, (a->flags & REQ_VERIFY) | REQ_PROGRESS, peers.cfg, "pull", a->src);
	job_set_what(&sub, "cluster pull %.8s: %s", a->id, a->src);
	sub.code = 1;
	snprintf(sub.result, sizeof(sub.result), "the pull ended without a result");
	sh.arg = fw;
	live_set(lv, &sub, fw);
	if ((rc = parts_enter(&me, why, whylen)) < 0) {
		live_set(lv, NULL, NULL);
		job_end(&sub);
		cfwd_close(fw);
		cpull_sess_remove(a->id);
		cpull_nodes_free(&nn);
		return rc;
	}
	log_info("cluster pull %s: %s onto %zu nodes", a->id, a->src, nn.n);
	pull_run_share(&sub, a->src, a->dest, &sh, &ans->st);
	parts_leave(&me);
	cpull_sess_pulled(a->id, sub.code == 0);
	live_set(lv, NULL, NULL);
	cfwd_close(fw);
	ans->code = sub.code;
	snprintf(ans->text, sizeof(ans->text), "%s", sub.result);
	job_end(&sub);
	cpull_nodes_free(&nn);
	return 0;
}

void cpull_part_end(const char *id)
{
	cpull_sess_remove(id);
	log_info("cluster pull %s: over here", id);
}

/* While a part runs for a peer's ask, its progress goes to the asker every
 * REPORT_MS on the ask's connection: the asker shows it, and a node silent
 * for [cluster] peer_timeout is taken for gone. The other way round too: an
 * asker that has taken none of the reports for peer_timeout (sent, never
 * acknowledged: the link is down, or its host) is taken for gone here, and
 * the part stops, though no send failed (a send only queues). A relay (an
 * ask naming a group) reports for its group too: their progress summed
 * with its own, the slowest of them, and each one's answer as it comes
 * (named). Every send on the connection holds send_mu, so frames never
 * interleave. */

struct reporter {
	struct xport *x;
	struct cask *group;            /* NULL: not a relay */
	struct cpull_live lv;
	pthread_t thread;
	bool started, stop, own_done;  /* under mu */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_mutex_t send_mu;
	int64_t taken_ms;              /* the last report whose bytes were all taken
					* (nothing queued): the reporter's own */
};

static int report_send(struct reporter *r, struct msg *m)
{
	int rc;

	pthread_mutex_lock(&r->send_mu);
	rc = r->x->ops->send(r->x, m);
	pthread_mutex_unlock(&r->send_mu);
	msg_free(m);
	return rc;
}

/* The group's answers not yet sent up. */
static int forward_answers(struct reporter *r)
{
	struct cask *c = r->group;
	int rc = 0;

	for (size_t i = 0; c && i < c->n && rc == 0; i++) {
		struct cask_node *nd = &c->v[i];
		struct msg m;
		bool send;

		pthread_mutex_lock(&c->mu);
		send = nd->answered && !nd->said;
		nd->said |= send;
		if (send)
			cask_put_answer(&m, nd, true);
		pthread_mutex_unlock(&c->mu);
		if (send)
			rc = report_send(r, &m);
	}
	return rc;
}

/* The asker has taken nothing sent to it for peer_timeout. A transport
 * that cannot tell (queued NULL or 0) relies on its sends failing. */
static bool asker_silent(struct reporter *r)
{
	int64_t now = mono_ms();

	if (!r->x->ops->queued || r->x->ops->queued(r->x) == 0)
		r->taken_ms = now;
	return now - r->taken_ms >= peers_io_ms();
}

static int report_once(struct reporter *r, bool own_done)
{
	struct cask_slow slow = { .name = "" };
	struct cpull_prog p;
	struct msg m;

	if (asker_silent(r)) {
		log_warn("cluster pull: %s has taken nothing sent to it for %d ms: taken for gone",
			 r->x->peer, peers_io_ms());
		r->x->ops->shutdown(r->x);      /* the answer and the wait for END fail at once */
		return -ETIMEDOUT;
	}

	cpull_live_read(&r->lv, &p);
	if (r->group) {
		if (!own_done)
			cask_slow_offer(&slow, peers.cfg->name, p.bytes_done, p.bytes_total);
		cask_sum(r->group, &p, &slow);
	}
	msg_init(&m, MSG_PROGRESS);
	msg_put_u64(&m, K_FILES_DONE, p.files_done);
	msg_put_u64(&m, K_FILES_TOTAL, p.files_total);
	msg_put_u64(&m, K_BYTES_DONE, p.bytes_done);
	msg_put_u64(&m, K_BYTES_TOTAL, p.bytes_total);
	msg_put_u64(&m, K_BYTES_FWD, p.bytes_fwd);
	if (slow.name[0]) {
		msg_put_str(&m, K_HOLDER, slow.name);
		msg_put_u64(&m, K_SLOW_DONE, slow.done);
		msg_put_u64(&m, K_SLOW_TOTAL, slow.total);
	}
	return report_send(r, &m) < 0 ? -EPIPE : forward_answers(r);
}

static void *report_main(void *arg)
{
	struct reporter *r = arg;

	pthread_setname_np(pthread_self(), "cpull report");
	pthread_mutex_lock(&r->mu);
	while (!r->stop) {
		struct timespec ts = mono_timespec(mono_ns() + REPORT_MS * 1000000ull);
		bool own_done;
		int rc;

		pthread_cond_timedwait(&r->cv, &r->mu, &ts);
		if (r->stop)
			break;
		own_done = r->own_done;
		pthread_mutex_unlock(&r->mu);
		rc = report_once(r, own_done);
		if (rc < 0) {
			/* The asker is gone (Ctrl-C, killed): the part stops as a
			 * pull whose client hung up does, and so do the group's. */
			cpull_live_stop(&r->lv);
			if (r->group)
				cask_cancel(r->group);
			pthread_mutex_lock(&r->mu);
			break;
		}
		pthread_mutex_lock(&r->mu);
	}
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

static void reporter_start(struct reporter *r, struct xport *x, struct cask *group)
{
	r->x = x;
	r->group = group;
	r->taken_ms = mono_ms();
	pthread_mutex_init(&r->lv.mu, NULL);
	pthread_mutex_init(&r->mu, NULL);
	pthread_mutex_init(&r->send_mu, NULL);
	mono_cond_init(&r->cv);
	r->started = pthread_create(&r->thread, NULL, report_main, r) == 0;
}

static void reporter_own_done(struct reporter *r)
{
	pthread_mutex_lock(&r->mu);
	r->own_done = true;
	pthread_mutex_unlock(&r->mu);
}

static void reporter_stop(struct reporter *r)
{
	pthread_mutex_lock(&r->mu);
	r->stop = true;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	if (r->started)
		pthread_join(r->thread, NULL);
	if (r->group)
		forward_answers(r);     /* the last ones, each once */
	pthread_cond_destroy(&r->cv);
	pthread_mutex_destroy(&r->send_mu);
	pthread_mutex_destroy(&r->mu);
	pthread_mutex_destroy(&r->lv.mu);
}

/* The group a relay is asked to ask (K_NAME): nodes of the pull's list, not
 * this one, none twice. 0 with *names (hostlist_free) and *n (0: not a
 * relay), or -EINVAL with why. */
static int group_take(const struct msg *req, const char *list, char ***names, size_t *n,
		      char *why, size_t whylen)
{
	char **all = NULL, **v;
	size_t nall = 0, off = 0, len, k = 0;
	const uint8_t *p;
	uint16_t key;
	int rc;

	*names = NULL;
	*n = 0;
	while (msg_next_field(req, &off, &key, &p, &len) == 1)
		k += key == K_NAME;
	if (k == 0)
		return 0;
	rc = survey_nodes(list, &all, &nall, why, whylen);
	if (rc < 0)
		return rc;
	if (!(v = calloc(k, sizeof(*v)))) {
		hostlist_free(all, nall);
		return -ENOMEM;
	}
	off = 0;
	while (rc == 0 && msg_next_field(req, &off, &key, &p, &len) == 1) {
		bool in_list = false, twice = false;

		if (key != K_NAME)
			continue;
		for (size_t i = 0; i < nall && !in_list; i++)
			in_list = strlen(all[i]) == len && memcmp(all[i], p, len) == 0;
		for (size_t i = 0; i < *n && !twice; i++)
			twice = strlen(v[i]) == len && memcmp(v[i], p, len) == 0;
		if (!in_list || twice || (strlen(peers.cfg->name) == len &&
					  memcmp(peers.cfg->name, p, len) == 0)) {
			snprintf(why, whylen, "a group naming '%.*s', %s", (int)(len < 64 ? len : 64),
				 (const char *)p, !in_list ? "not a node of the pull" : twice ?
				 "twice" : "this node itself");
			rc = -EINVAL;
		} else if (!(v[*n] = strndup((const char *)p, len))) {
			rc = -ENOMEM;
		} else {
			(*n)++;
		}
	}
	hostlist_free(all, nall);
	if (rc < 0) {
		hostlist_free(v, *n);
		*n = 0;
		return rc;
	}
	*names = v;
	return 0;
}

int cpull_node_serve(struct xport *x, const char *peer, const struct msg *req)
{
	struct reporter rep = { 0 };
	struct cpull_ask a = { 0 };
	struct cpull_answer *ans = calloc(1, sizeof(*ans));
	struct cask_node me = { .name = peers.cfg->name };
	char *id = NULL, *src = NULL, *dest = NULL, *list = NULL, why[1024] = "", **group = NULL;
	struct cred *who = NULL;
	struct cask *c = NULL;
	uint64_t flags = 0;
	size_t ngroup = 0;
	struct msg m;
	int rc;

	int drc = msg_get_str(req, K_DEST, &dest);

	if (!ans) {
		peer_send_error(x, ENOMEM, "%s: out of memory", peers.cfg->name);
		rc = -ENOMEM;
		goto out;
	}
	if (msg_get_str(req, K_JOB, &id) < 0 || !cpull_id_ok(id) || msg_get_str(req, K_PATH, &src) < 0 ||
	    src[0] != '/' || msg_get_str(req, K_NODES, &list) < 0 || (drc < 0 && drc != -ENOENT)) {
		log_warn("a cluster pull asked by %s refused: malformed", peer);
		peer_send_error(x, EBADMSG, "%s: a malformed cluster pull", peers.cfg->name);
		rc = -EBADMSG;
		goto out;
	}
	rc = group_take(req, list, &group, &ngroup, why, sizeof(why));
	if (rc < 0) {
		log_warn("a cluster pull asked by %s refused: %s", peer, rc == -ENOMEM ?
			 "out of memory" : why);
		peer_send_error(x, -rc, "%s: %s", peers.cfg->name, rc == -ENOMEM ?
				"out of memory" : why);
		goto out;
	}
	msg_get_u64(req, K_FLAGS, &flags);
	/* The user who asked, as the asker's kernel has them (the cluster
	 * shares one uid space). */
	rc = cred_from_msg(req, &who);
	if (rc < 0) {
		log_warn("a cluster pull asked by %s refused: a malformed user", peer);
		peer_send_error(x, -rc, "%s: a cluster pull with a malformed user", peers.cfg->name);
		goto out;
	}
	a = (struct cpull_ask){ .id = id, .src = src, .dest = dest, .list = list,
				.flags = (uint32_t)flags, .who = who };
	if (ngroup)
		log_info("cluster pull %s asked by %s, relaying for %zu node%s", id, peer, ngroup,
			 ngroup == 1 ? "" : "s");
	else
		log_info("cluster pull %s asked by %s", id, peer);
	if (ngroup && cask_start(&c, &a, group, ngroup, NULL, NULL) < 0) {
		peer_send_error(x, ENOMEM, "%s: out of memory", peers.cfg->name);
		rc = -ENOMEM;
		goto out;
	}
	/* The reports are sends on a connection whose timeout is 0 between
	 * requests: an asker gone without a reset must not hold them. */
	x->ops->set_timeout(x, peers_io_ms());
	reporter_start(&rep, x, c);
	/* The part acts as the user who asked the pull, as a plain pull would
	 * on the asker's node. */
	if (who && (rc = cred_enter(who)) < 0)
		snprintf(why, sizeof(why), "cannot act as uid %u: %s", (unsigned)who->uid,
			 strerror(-rc));
	else
		rc = cpull_part(&a, &rep.lv, ans, why, sizeof(why));
	cred_leave();
	reporter_own_done(&rep);
	if (rc < 0 && !c) {
		reporter_stop(&rep);
		log_warn("a cluster pull asked by %s refused: %s", peer, why);
		peer_send_error(x, -rc, "%s: %s", peers.cfg->name, why);
		goto out;
	}
	/* A relay answers for itself like for its group (named), a refusal
	 * included: its group goes on either way. */
	if (rc == 0)
		cask_take_part(&me, ans);
	else
		snprintf(me.text, sizeof(me.text), "%s refused: %s", peers.cfg->name, why);
	if (rc < 0)
		me.code = 1;
	cask_put_answer(&m, &me, c != NULL);
	if (report_send(&rep, &m) == 0)
		while (c && !cask_wait(c, 100))
			;                       /* the reporter forwards their answers */
	else if (c)
		cask_cancel(c);         /* the asker is gone: so is the group's part */
	reporter_stop(&rep);
	/* Serve the peers until the asker says all are done, or goes. */
	x->ops->set_timeout(x, 0);
	if (x->ops->recv(x, &m) == 0)
		msg_free(&m);
	if (c) {
		cask_end(c);            /* the group may stop serving too */
		cask_free(c);
	}
	if (rc == 0)
		cpull_part_end(id);
	rc = -ECONNRESET;               /* the connection served its one pull */
out:
	hostlist_free(group, ngroup);
	free(who);
	free(ans);
	free(id);
	free(src);
	free(dest);
	free(list);
	return rc;
}
