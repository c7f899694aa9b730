/* pull --cluster, the asker's side: every node of the pull is asked at once
 * (MSG_CPULL_ASK; directly up to [cluster] fanout nodes, through relays
 * past that: cpull_ask.c) to pull SRC with the others (cpull_node.c); each
 * answers when its own copy is staged, and keeps serving its peers until
 * every node has answered, when the asker ends the pull everywhere
 * (MSG_END).
 *
 * The pull is staged when every node answered 0 with the same root. A node
 * that fails or cannot be reached is named and the pull exits 1; the others
 * have read its share in its place, so running the pull again reads from
 * the source only what no node holds (what any node holds current it
 * forwards: cpull_fwd.c).
 *
 * This node's own part runs in place, on its node's thread of the ask.
 */
#include "daemon/fs/cred.h"
#include "daemon/cpull/cpull.h"
#include "daemon/survey/survey.h"
#include "daemon/cpull/cpull_impl.h"
#include "daemon/peers/peers.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/hostlist.h"
#include "common/log.h"

struct cpull {
	const char *id, *src, *dest;
	char *list;                    /* the nodes, comma-joined, as sent */
	uint32_t flags;
	struct cpull_ask ask;          /* what every node is asked */
	struct cask *c;                /* every node of the pull, this one in place */
	bool here_ran;                 /* this node's part ran: end it at the end */
	struct cpull_live live;        /* this node's own part */
	char slowest[64];              /* for the progress frames */
	uint64_t fwd;
};

/* This node's part, in place (cask_start's here). */
static void ask_here(struct cask_node *nd, void *arg)
{
	struct cpull *cp = arg;
	struct cpull_answer *ans = calloc(1, sizeof(*ans));

	if (!ans) {
		snprintf(nd->text, sizeof(nd->text), "out of memory");
		return;
	}
	if (cpull_part(&cp->ask, &cp->live, ans, nd->text, sizeof(nd->text)) == 0) {
		cp->here_ran = true;
		cask_take_part(nd, ans);
	}
	free(ans);
}

/* The nodes to pull onto: LIST, or the hosts file's; each once. */
static int members(struct cpull *cp, const char *nodes, char ***names, size_t *n, char *why,
		   size_t whylen)
{
	size_t len = 1, k = 0;
	int rc;

	if (nodes) {
		rc = survey_nodes(nodes, names, n, why, whylen);
		if (rc < 0)
			return rc;
	} else {
		*n = peers.hosts.n;
		*names = calloc(*n, sizeof(**names));
		if (!*names)
			return -ENOMEM;
		for (size_t i = 0; i < *n; i++)
			if (!((*names)[i] = strdup(peers.hosts.v[i].name)))
				return -ENOMEM;
	}
	for (size_t i = 0; i < *n; i++) {
		bool dup = false;

		for (size_t j = 0; j < k; j++)
			dup |= strcmp((*names)[j], (*names)[i]) == 0;
		if (dup) {
			free((*names)[i]);
		} else {
			(*names)[k++] = (*names)[i];
			len += strlen((*names)[k - 1]) + 1;
		}
	}
	*n = k;
	if (k == 0) {
		snprintf(why, whylen, "--nodes names no node");
		return -EINVAL;
	}
	cp->list = malloc(len);
	if (!cp->list)
		return -ENOMEM;
	cp->list[0] = '\0';
	for (size_t i = 0; i < k; i++) {
		if (i)
			strcat(cp->list, ",");
		strcat(cp->list, (*names)[i]);
	}
	return 0;
}

static void fmt_bytes(char *b, size_t n, uint64_t v)
{
	static const char *u[] = { "B", "kB", "MB", "GB", "TB" };
	double d = (double)v;
	unsigned i = 0;

	while (d >= 1000 && i < 4) {
		d /= 1000;
		i++;
	}
	snprintf(b, n, i ? "%.1f %s" : "%.0f %s", d, u[i]);
}

/* A note for each node that answered since the last call. */
static void say_answers(struct job *j, struct cpull *cp)
{
	struct cask *c = cp->c;

	for (size_t i = 0; i < c->n; i++) {
		struct cask_node *nd = &c->v[i];
		char r[32], f[32], text[sizeof(nd->text)];
		bool say;
		int code;

		pthread_mutex_lock(&c->mu);
		say = nd->answered && !nd->said;
		nd->said |= say;
		code = nd->code;
		snprintf(text, sizeof(text), "%s", nd->text);
		fmt_bytes(r, sizeof(r), nd->rbytes);
		fmt_bytes(f, sizeof(f), nd->fbytes);
		pthread_mutex_unlock(&c->mu);
		if (!say)
			continue;
		if (code != 0) {
			job_note(j, LOG_ERROR, NULL, NULL, "%s: %s", nd->name, text);
			continue;
		}
		job_note(j, LOG_INFO, NULL, NULL, "%s: staged: %llu files read from the source (%s), "
			 "%llu from peers (%s)", nd->name, (unsigned long long)nd->rfiles, r,
			 (unsigned long long)nd->ffiles, f);
	}
}

static void progress_more(struct msg *m, void *arg)
{
	struct cpull *cp = arg;

	msg_put_u64(m, K_BYTES_FWD, cp->fwd);
	if (cp->slowest[0])
		msg_put_str(m, K_HOLDER, cp->slowest);
}

/* The whole pull's progress: every node's figures summed (every node stages
 * the whole tree), the bytes forwarded between them, and the node furthest
 * behind of those still pulling. */
static void progress(struct job *j, struct cpull *cp)
{
	struct cask *c = cp->c;
	struct cpull_prog sum = { 0 };
	struct cask_slow slow = { .name = "" };
	size_t answered;

	for (size_t i = 0; i < c->n; i++) {
		struct cpull_prog p;
		bool pulling;

		pthread_mutex_lock(&c->mu);
		pulling = c->v[i].here && !c->v[i].answered;
		pthread_mutex_unlock(&c->mu);
		if (!pulling)
			continue;
		cpull_live_read(&cp->live, &p);      /* this node's part, in place */
		cpull_prog_add(&sum, &p);
		cask_slow_offer(&slow, c->v[i].name, p.bytes_done, p.bytes_total);
	}
	cask_sum(c, &sum, &slow);
	pthread_mutex_lock(&c->mu);
	answered = c->answered;
	pthread_mutex_unlock(&c->mu);
	atomic_store(&j->phase, "pull");
	atomic_store(&j->files_done, sum.files_done);
	atomic_store(&j->files_total, sum.files_total);
	atomic_store(&j->bytes_done, sum.bytes_done);
	atomic_store(&j->bytes_total, sum.bytes_total);
	cp->fwd = sum.bytes_fwd;
	snprintf(cp->slowest, sizeof(cp->slowest), "%s", c->n > 1 ? slow.name : "");
	if (slow.name[0] && c->n > 1)
		job_set_what(j, "%s onto %zu nodes (cluster pull %.8s): %zu of them done; slowest %s "
			     "at %.0f%%", cp->src, c->n, cp->id, answered, slow.name, slow.frac * 100);
	job_progress_with(j, false, progress_more, cp);
}

/* Waits for every answer, saying each; a client gone cancels the rest. */
static void wait_answers(struct job *j, struct cpull *cp)
{
	bool cancelled = false;

	while (!cask_wait(cp->c, 100)) {
		say_answers(j, cp);
		progress(j, cp);
		if (!cancelled && job_cancelled(j)) {
			cancelled = true;
			/* This node's part stops as a pull whose client went; the
			 * others stop when their reports find the connection shut. */
			cpull_live_stop(&cp->live);
			cask_cancel(cp->c);
		}
	}
	say_answers(j, cp);
}

static void result(struct job *j, struct cpull *cp)
{
	struct cask *c = cp->c;
	const struct cask_node *self = NULL, *first = NULL;
	uint64_t read = 0, fwd = 0;
	size_t failed = 0, usage = 0, differ = 0;
	char names[1024] = "", b[32], rb[32];
	struct msg m;

	for (size_t i = 0; i < c->n; i++) {
		const struct cask_node *mb = &c->v[i];

		if (strcmp(mb->name, peers.cfg->name) == 0)
			self = mb;
		read += mb->rbytes;
		fwd += mb->fbytes;
		if (mb->code != 0) {
			failed++;
			usage += mb->code == 2;
			snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s",
				 failed > 1 ? ", " : "", mb->name);
			continue;
		}
		if (!first)
			first = mb;
		else if (strcmp(first->root, mb->root) != 0)
			differ++;
	}
	if (differ) {
		for (size_t i = 0; i < c->n; i++)
			if (c->v[i].code == 0)
				job_note(j, LOG_ERROR, NULL, NULL, "%s: root %s", c->v[i].name,
					 c->v[i].root);
		job_result(j, 1, NULL, NULL, "pull --cluster of %s: the nodes staged different trees "
			   "(roots listed above): either the source changed while it was pulled (pull "
			   "again when it is quiet), or a node's copy changed after it was read "
			   "(`stage verify --deep` on each node names the file)", cp->src);
		return;
	}
	if (failed) {
		job_result(j, usage == c->n ? 2 : 1, NULL, NULL,
			   "pull --cluster of %s did not complete on %zu of %zu nodes (%s)%s", cp->src,
			   failed, c->n, names, failed < c->n ?
			   "; the others have it: run it again to finish those nodes" : "");
		return;
	}
	fmt_bytes(b, sizeof(b), first->bytes);
	fmt_bytes(rb, sizeof(rb), read);
	msg_init(&m, MSG_RESULT);
	msg_put_str(&m, K_ROOT, first->root);
	msg_put_u64(&m, K_FILES_TOTAL, first->files);
	msg_put_u64(&m, K_BYTES_TOTAL, first->bytes);
	msg_put_u64(&m, K_BYTES_COPIED, read);
	msg_put_u64(&m, K_BYTES_FWD, fwd);
	job_result(j, 0, self ? self->path : NULL, &m,
		   "staged %s on %zu nodes: %llu files (%s), root %s; read from the source: %s "
		   "in all (%.2fx the tree)", cp->src, c->n, (unsigned long long)first->files, b,
		   first->root, rb, first->bytes ? (double)read / (double)first->bytes : 0.0);
}

void cpull_run(struct job *j, const char *src, const char *dest, const char *nodes)
{
	struct cpull cp = { .src = src, .dest = dest, .flags = j->flags & REQ_VERIFY };
	char id[CPULL_ID_HEX + 1], why[1024] = "", **names = NULL;
	uint8_t raw[CPULL_ID_HEX / 2];
	struct cred *who = NULL;
	size_t n = 0;
	int rc;

	if (!peers.cluster) {
		job_result(j, 2, NULL, NULL, "pull --cluster needs a cluster: set [cluster] hosts "
			   "(and key_file) in the config");
		return;
	}
	if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) {
		job_result(j, 1, NULL, NULL, "pull --cluster: getrandom: %s", strerror(errno));
		return;
	}
	for (size_t i = 0; i < sizeof(raw); i++)
		snprintf(id + 2 * i, 3, "%02x", raw[i]);
	cp.id = id;
	rc = members(&cp, nodes, &names, &n, why, sizeof(why));
	if (rc < 0) {
		job_result(j, rc == -ENOMEM ? 1 : 2, NULL, NULL, "pull --cluster: %s",
			   *why ? why : strerror(-rc));
		goto out;
	}
	/* Every node pulls as the user this request acts as (the kernel's
	 * ids: for a daemon that does not switch, its own). */
	who = cred_of_thread();
	if (!who) {
		job_result(j, 1, NULL, NULL, "pull --cluster: out of memory");
		goto out;
	}
	cp.ask = (struct cpull_ask){ .id = id, .src = src, .dest = dest, .list = cp.list,
				     .flags = cp.flags, .who = who };
	job_set_what(j, "%s onto %zu nodes (cluster pull %.8s)", src, n, id);
	log_info("cluster pull %s: %s onto %s", id, src, cp.list);
	pthread_mutex_init(&cp.live.mu, NULL);
	if (cask_start(&cp.c, &cp.ask, names, n, ask_here, &cp) < 0) {
		job_result(j, 1, NULL, NULL, "pull --cluster: out of memory");
		pthread_mutex_destroy(&cp.live.mu);
		goto out;
	}
	wait_answers(j, &cp);
	cask_end(cp.c);
	if (cp.here_ran)
		cpull_part_end(id);
	if (job_cancelled(j))
		job_result(j, 1, NULL, NULL, "pull --cluster of %s cancelled", src);
	else
		result(j, &cp);
	cask_free(cp.c);
	pthread_mutex_destroy(&cp.live.mu);
out:
	free(who);
	free(cp.list);
	hostlist_free(names, n);
}
