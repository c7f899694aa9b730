/* One node's part of a cluster pull: asked by the pull's asker
 * (MSG_CPULL_ASK), or by itself when it is the asker (cpull.c), it runs the
 * pull of SRC here with a share (cpull_fwd.c), answers with its figures,
 * and serves its peers (cpull_sess.c) until the asker says every node is
 * done.
 */
#include "daemon/cluster/cluster.h"
#include "daemon/cluster/cpull.h"
#include "daemon/cluster/cpull_impl.h"
#include "daemon/repl/repl_impl.h"

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
	int rc = repl_nodes(list, &nn->names, &nn->n, why, whylen);

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
		nn->host[i] = (size_t)hosts_find(&repl.hosts, nn->names[i]);
		if (strcmp(nn->names[i], repl.cfg->name) == 0)
			nn->self = i;
	}
	if (nn->self == nn->n) {
		snprintf(why, whylen, "this node (%s) is not one of the pull's nodes", repl.cfg->name);
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
	struct pull_share sh = { .ops = &cfwd_ops };
	struct cpull_nodes nn = { 0 };
	struct cfwd *fw = NULL;
	struct job sub;
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
	log_info("cluster pull %s: %s onto %zu nodes", a->id, a->src, nn.n);
	/* REQ_PROGRESS: the pull counts the tree first, so progress has totals
	 * (nothing is sent: the job has no client). */
	job_begin(&sub, -1, (a->flags & REQ_VERIFY) | REQ_PROGRESS, repl.cfg, "pull", a->src);
	job_set_what(&sub, "cluster pull %.8s: %s", a->id, a->src);
	sub.code = 1;
	snprintf(sub.result, sizeof(sub.result), "the pull ended without a result");
	sh.arg = fw;
	live_set(lv, &sub, fw);
	pull_run_share(&sub, a->src, a->dest, &sh, &ans->st);
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
 * for REPL_IO_MS is taken for gone. The part's own thread sends nothing
 * until this one is joined, so frames never interleave. */
#define REPORT_MS 250

struct reporter {
	struct xport *x;
	struct cpull_live lv;
	pthread_t thread;
	bool started, stop;
	pthread_mutex_t mu;            /* stop */
	pthread_cond_t cv;
};

static void *report_main(void *arg)
{
	struct reporter *r = arg;

	pthread_mutex_lock(&r->mu);
	while (!r->stop) {
		struct timespec ts = mono_timespec(mono_ns() + REPORT_MS * 1000000ull);
		struct cpull_prog p;
		struct msg m;
		int rc;

		pthread_cond_timedwait(&r->cv, &r->mu, &ts);
		if (r->stop)
			break;
		pthread_mutex_unlock(&r->mu);
		cpull_live_read(&r->lv, &p);
		msg_init(&m, MSG_PROGRESS);
		msg_put_u64(&m, K_FILES_DONE, p.files_done);
		msg_put_u64(&m, K_FILES_TOTAL, p.files_total);
		msg_put_u64(&m, K_BYTES_DONE, p.bytes_done);
		msg_put_u64(&m, K_BYTES_TOTAL, p.bytes_total);
		msg_put_u64(&m, K_BYTES_FWD, p.bytes_fwd);
		rc = r->x->ops->send(r->x, &m);
		msg_free(&m);
		if (rc < 0) {
			/* The asker is gone (Ctrl-C, killed): the part stops as a
			 * pull whose client hung up does. */
			pthread_mutex_lock(&r->lv.mu);
			if (r->lv.job)
				atomic_store(&r->lv.job->gone, true);
			pthread_mutex_unlock(&r->lv.mu);
			pthread_mutex_lock(&r->mu);
			break;
		}
		pthread_mutex_lock(&r->mu);
	}
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

static void reporter_start(struct reporter *r, struct xport *x)
{
	r->x = x;
	pthread_mutex_init(&r->lv.mu, NULL);
	pthread_mutex_init(&r->mu, NULL);
	mono_cond_init(&r->cv);
	r->started = pthread_create(&r->thread, NULL, report_main, r) == 0;
}

static void reporter_stop(struct reporter *r)
{
	pthread_mutex_lock(&r->mu);
	r->stop = true;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	if (r->started)
		pthread_join(r->thread, NULL);
	pthread_cond_destroy(&r->cv);
	pthread_mutex_destroy(&r->mu);
	pthread_mutex_destroy(&r->lv.mu);
}

int cpull_node_serve(struct xport *x, const char *peer, const struct msg *req)
{
	struct reporter rep = { 0 };
	struct cpull_ask a = { 0 };
	struct cpull_answer *ans = calloc(1, sizeof(*ans));
	char *id = NULL, *src = NULL, *dest = NULL, *list = NULL, why[1024] = "";
	uint64_t flags = 0;
	struct msg m;
	int rc;

	int drc = msg_get_str(req, K_DEST, &dest);

	if (!ans) {
		peer_send_error(x, ENOMEM, "%s: out of memory", repl.cfg->name);
		rc = -ENOMEM;
		goto out;
	}
	if (msg_get_str(req, K_JOB, &id) < 0 || !cpull_id_ok(id) || msg_get_str(req, K_PATH, &src) < 0 ||
	    src[0] != '/' || msg_get_str(req, K_NODES, &list) < 0 || (drc < 0 && drc != -ENOENT)) {
		log_warn("a cluster pull asked by %s refused: malformed", peer);
		peer_send_error(x, EBADMSG, "%s: a malformed cluster pull", repl.cfg->name);
		rc = -EBADMSG;
		goto out;
	}
	msg_get_u64(req, K_FLAGS, &flags);
	a = (struct cpull_ask){ .id = id, .src = src, .dest = dest, .list = list,
				.flags = (uint32_t)flags };
	log_info("cluster pull %s asked by %s", id, peer);
	/* The reports are sends on a connection whose timeout is 0 between
	 * requests: an asker gone without a reset must not hold them. */
	x->ops->set_timeout(x, REPL_IO_MS);
	reporter_start(&rep, x);
	rc = cpull_part(&a, &rep.lv, ans, why, sizeof(why));
	reporter_stop(&rep);
	if (rc < 0) {
		log_warn("a cluster pull asked by %s refused: %s", peer, why);
		peer_send_error(x, -rc, "%s: %s", repl.cfg->name, why);
		goto out;
	}
	msg_init(&m, MSG_ASK_DONE);
	msg_put_u64(&m, K_CODE, (uint64_t)ans->code);
	msg_put_str(&m, K_TEXT, ans->text);
	if (ans->code == 0) {
		char hex[DIGEST_HEX_LEN + 1];

		digest_to_hex(ans->st.root, hex);
		msg_put_str(&m, K_ROOT, hex);
	}
	msg_put_str(&m, K_PATH, ans->st.dst);
	msg_put_u64(&m, K_FILES_TOTAL, ans->st.files);
	msg_put_u64(&m, K_BYTES_TOTAL, ans->st.bytes);
	msg_put_u64(&m, K_FILES_COPIED, ans->st.read_files);
	msg_put_u64(&m, K_BYTES_COPIED, ans->st.read_bytes);
	msg_put_u64(&m, K_FILES_FWD, ans->st.fwd_files);
	msg_put_u64(&m, K_BYTES_FWD, ans->st.fwd_bytes);
	rc = x->ops->send(x, &m);
	msg_free(&m);
	/* Serve the peers until the asker says all are done, or goes. */
	if (rc == 0) {
		x->ops->set_timeout(x, 0);
		if (x->ops->recv(x, &m) == 0)
			msg_free(&m);
	}
	cpull_part_end(id);
	rc = -ECONNRESET;               /* the connection served its one pull */
out:
	free(ans);
	free(id);
	free(src);
	free(dest);
	free(list);
	return rc;
}
