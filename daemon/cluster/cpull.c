/* pull --cluster, the asker's side: every node of the pull is asked at once
 * (MSG_CPULL_ASK, a connection and a thread each) to pull SRC with the
 * others (cpull_node.c); each answers when its own copy is staged, and keeps
 * serving its peers until every node has answered, when the asker ends the
 * pull on every connection (MSG_END).
 *
 * The pull is staged when every node answered 0 with the same root. A node
 * that fails or cannot be reached is named and the pull exits 1; the others
 * have read its share in its place, so running the pull again reads from
 * the source only what no node holds (what any node holds current it
 * forwards: cpull_fwd.c).
 *
 * This node asks itself over its own peer port, as it asks the others: one
 * path for all, and its part runs on the receiver's thread like theirs.
 */
#include "daemon/cluster/cpull.h"
#include "daemon/cluster/cluster.h"
#include "daemon/cluster/cpull_impl.h"
#include "daemon/repl/repl_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/clock.h"
#include "common/hostlist.h"
#include "common/log.h"
#include "daemon/net/peer.h"

#define CPULL_ASK_MAX 256              /* nodes asked directly (no relay tree yet) */

struct member {
	struct cpull *cp;
	const char *name;
	size_t host;
	pthread_t thread;
	bool started;
	struct xport *x;               /* under cp->mu: a cancel shuts it down */
	bool answered, said;           /* its answer is in; the asker noted it */
	bool here;                     /* this node: its part ran in place */
	int code;
	char text[1024];
	char root[DIGEST_HEX_LEN + 1];
	char path[4096];
	uint64_t files, bytes, rfiles, rbytes, ffiles, fbytes;
	struct cpull_prog prog;        /* under cp->mu: its last progress */
};

struct cpull {
	const char *id, *src, *dest;
	char *list;                    /* the nodes, comma-joined, as sent */
	uint32_t flags;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	size_t n, answered;
	bool over;                     /* every member answered: end the pull */
	struct member *m;
	struct cpull_live live;        /* this node's own part */
	char slowest[64];              /* for the progress frames */
	uint64_t fwd;
};

static void take_answer(struct member *mb, const struct msg *m)
{
	char *s = NULL;
	uint64_t code = 1;

	msg_get_u64(m, K_CODE, &code);
	mb->code = code > 2 ? 1 : (int)code;
	if (msg_get_str(m, K_TEXT, &s) == 0)
		snprintf(mb->text, sizeof(mb->text), "%s", s);
	free(s);
	s = NULL;
	if (msg_get_str(m, K_ROOT, &s) == 0)
		snprintf(mb->root, sizeof(mb->root), "%s", s);
	free(s);
	s = NULL;
	if (msg_get_str(m, K_PATH, &s) == 0)
		snprintf(mb->path, sizeof(mb->path), "%s", s);
	free(s);
	msg_get_u64(m, K_FILES_TOTAL, &mb->files);
	msg_get_u64(m, K_BYTES_TOTAL, &mb->bytes);
	msg_get_u64(m, K_FILES_COPIED, &mb->rfiles);
	msg_get_u64(m, K_BYTES_COPIED, &mb->rbytes);
	msg_get_u64(m, K_FILES_FWD, &mb->ffiles);
	msg_get_u64(m, K_BYTES_FWD, &mb->fbytes);
}

static void take_own(struct member *mb, const struct cpull_answer *ans)
{
	mb->code = ans->code;
	snprintf(mb->text, sizeof(mb->text), "%s", ans->text);
	if (ans->code == 0)
		digest_to_hex(ans->st.root, mb->root);
	snprintf(mb->path, sizeof(mb->path), "%s", ans->st.dst);
	mb->files = ans->st.files;
	mb->bytes = ans->st.bytes;
	mb->rfiles = ans->st.read_files;
	mb->rbytes = ans->st.read_bytes;
	mb->ffiles = ans->st.fwd_files;
	mb->fbytes = ans->st.fwd_bytes;
}

/* This node's part, in place: a node cannot ask itself over the wire (the
 * handshake refuses its own reflection, as it must). */
static void ask_here(struct member *mb)
{
	struct cpull *cp = mb->cp;
	struct cpull_ask a = { .id = cp->id, .src = cp->src, .dest = cp->dest, .list = cp->list,
			       .flags = cp->flags };
	struct cpull_answer *ans = calloc(1, sizeof(*ans));

	if (!ans) {
		snprintf(mb->text, sizeof(mb->text), "out of memory");
		return;
	}
	if (cpull_part(&a, &cp->live, ans, mb->text, sizeof(mb->text)) == 0) {
		mb->here = true;
		take_own(mb, ans);
	}
	free(ans);
}

static void *member_main(void *arg)
{
	struct member *mb = arg;
	struct cpull *cp = mb->cp;
	struct xport *x = NULL;
	struct msg m;
	int rc;

	mb->code = 1;
	if (strcmp(mb->name, repl.cfg->name) == 0) {
		ask_here(mb);
		goto answered;
	}
	/* The node reports its progress every 250 ms while it pulls: silent
	 * for REPL_IO_MS, it is gone (a link down, a node stopped). */
	rc = repl_dial(mb->host, REPL_CONNECT_MS, REPL_IO_MS, &x, mb->text, sizeof(mb->text));
	if (rc == 0) {
		pthread_mutex_lock(&cp->mu);
		mb->x = x;
		pthread_mutex_unlock(&cp->mu);
		msg_init(&m, MSG_CPULL_ASK);
		msg_put_str(&m, K_JOB, cp->id);
		msg_put_str(&m, K_PATH, cp->src);
		if (cp->dest)
			msg_put_str(&m, K_DEST, cp->dest);
		msg_put_u64(&m, K_FLAGS, cp->flags);
		msg_put_str(&m, K_NODES, cp->list);
		rc = x->ops->send(x, &m);
		msg_free(&m);
		while (rc == 0 && (rc = x->ops->recv(x, &m)) == 0 && m.type == MSG_PROGRESS) {
			struct cpull_prog p = { 0 };

			msg_get_u64(&m, K_FILES_DONE, &p.files_done);
			msg_get_u64(&m, K_FILES_TOTAL, &p.files_total);
			msg_get_u64(&m, K_BYTES_DONE, &p.bytes_done);
			msg_get_u64(&m, K_BYTES_TOTAL, &p.bytes_total);
			msg_get_u64(&m, K_BYTES_FWD, &p.bytes_fwd);
			msg_free(&m);
			pthread_mutex_lock(&cp->mu);
			mb->prog = p;
			pthread_mutex_unlock(&cp->mu);
		}
		if (rc < 0) {
			snprintf(mb->text, sizeof(mb->text), "%s", rc == -ENOTCONN ?
				 "the connection was lost before it answered (killed? link down?)" :
				 strerror(-rc));
		} else if (m.type == MSG_ERROR) {
			peer_refused(&m, mb->name, mb->text, sizeof(mb->text));
			msg_free(&m);
		} else if (m.type != MSG_ASK_DONE) {
			snprintf(mb->text, sizeof(mb->text), "a malformed answer (frame type %u)",
				 m.type);
			msg_free(&m);
		} else {
			take_answer(mb, &m);
			msg_free(&m);
		}
	}
answered:
	pthread_mutex_lock(&cp->mu);
	mb->answered = true;
	cp->answered++;
	pthread_cond_broadcast(&cp->cv);
	while (!cp->over)
		pthread_cond_wait(&cp->cv, &cp->mu);
	mb->x = NULL;
	pthread_mutex_unlock(&cp->mu);
	if (x) {
		/* The node may stop serving its peers: all are done. */
		msg_init(&m, MSG_END);
		x->ops->send(x, &m);
		msg_free(&m);
		x->ops->close(x);
	}
	if (mb->here)
		cpull_part_end(cp->id);
	return NULL;
}

/* The nodes to pull onto: LIST, or the hosts file's; each once. */
static int members(struct cpull *cp, const char *nodes, char ***names, size_t *n, char *why,
		   size_t whylen)
{
	size_t len = 1, k = 0;
	int rc;

	if (nodes) {
		rc = repl_nodes(nodes, names, n, why, whylen);
		if (rc < 0)
			return rc;
	} else {
		*n = repl.hosts.n;
		*names = calloc(*n, sizeof(**names));
		if (!*names)
			return -ENOMEM;
		for (size_t i = 0; i < *n; i++)
			if (!((*names)[i] = strdup(repl.hosts.v[i].name)))
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
	if (k > CPULL_ASK_MAX) {
		snprintf(why, whylen, "%zu nodes: pull --cluster asks at most %d nodes (the relay "
			 "through a tree of nodes beyond that is not built yet)", k, CPULL_ASK_MAX);
		return -E2BIG;
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
	for (size_t i = 0; i < cp->n; i++) {
		struct member *mb = &cp->m[i];
		char r[32], f[32];

		if (!mb->answered || mb->said)
			continue;
		mb->said = true;
		if (mb->code != 0) {
			job_note(j, LOG_ERROR, NULL, NULL, "%s: %s", mb->name, mb->text);
			continue;
		}
		fmt_bytes(r, sizeof(r), mb->rbytes);
		fmt_bytes(f, sizeof(f), mb->fbytes);
		job_note(j, LOG_INFO, NULL, NULL, "%s: staged: %llu files read from the source (%s), "
			 "%llu from peers (%s)", mb->name, (unsigned long long)mb->rfiles, r,
			 (unsigned long long)mb->ffiles, f);
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
	struct cpull_prog sum = { 0 };
	double worst = 2;
	const char *slow = NULL;

	for (size_t i = 0; i < cp->n; i++) {
		struct member *mb = &cp->m[i];
		struct cpull_prog p;
		bool answered;

		pthread_mutex_lock(&cp->mu);
		answered = mb->answered;
		p = mb->prog;
		pthread_mutex_unlock(&cp->mu);
		if (!answered && strcmp(mb->name, repl.cfg->name) == 0)
			cpull_live_read(&cp->live, &p);      /* this node's part, in place */
		if (answered && mb->code == 0)
			p = (struct cpull_prog){ mb->files, mb->files, mb->bytes, mb->bytes, mb->fbytes };
		sum.files_done += p.files_done;
		sum.files_total += p.files_total;
		sum.bytes_done += p.bytes_done;
		sum.bytes_total += p.bytes_total;
		sum.bytes_fwd += p.bytes_fwd;
		if (!answered) {
			double f = p.bytes_total ? (double)p.bytes_done / (double)p.bytes_total : 0;

			if (f < worst) {
				worst = f;
				slow = mb->name;
			}
		}
	}
	atomic_store(&j->phase, "pull");
	atomic_store(&j->files_done, sum.files_done);
	atomic_store(&j->files_total, sum.files_total);
	atomic_store(&j->bytes_done, sum.bytes_done);
	atomic_store(&j->bytes_total, sum.bytes_total);
	cp->fwd = sum.bytes_fwd;
	snprintf(cp->slowest, sizeof(cp->slowest), "%s", slow && cp->n > 1 ? slow : "");
	if (slow && cp->n > 1)
		job_set_what(j, "%s onto %zu nodes (cluster pull %.8s): %zu of them done; slowest %s "
			     "at %.0f%%", cp->src, cp->n, cp->id, cp->answered, slow, worst * 100);
	job_progress_with(j, false, progress_more, cp);
}

/* Waits for every answer, saying each; a client gone cancels the rest. */
static void wait_answers(struct job *j, struct cpull *cp)
{
	bool cancelled = false;

	pthread_mutex_lock(&cp->mu);
	while (cp->answered < cp->n) {
		struct timespec ts = mono_timespec(mono_ns() + 100000000ull);

		pthread_cond_timedwait(&cp->cv, &cp->mu, &ts);
		pthread_mutex_unlock(&cp->mu);
		say_answers(j, cp);
		progress(j, cp);
		if (!cancelled && job_cancelled(j)) {
			cancelled = true;
			/* This node's part stops as a pull whose client went; the
			 * others stop when their reports find the connection shut. */
			pthread_mutex_lock(&cp->live.mu);
			if (cp->live.job)
				atomic_store(&cp->live.job->gone, true);
			pthread_mutex_unlock(&cp->live.mu);
			pthread_mutex_lock(&cp->mu);
			for (size_t i = 0; i < cp->n; i++)
				if (cp->m[i].x)
					cp->m[i].x->ops->shutdown(cp->m[i].x);
			pthread_mutex_unlock(&cp->mu);
		}
		pthread_mutex_lock(&cp->mu);
	}
	cp->over = true;
	pthread_cond_broadcast(&cp->cv);
	pthread_mutex_unlock(&cp->mu);
	say_answers(j, cp);
}

static void result(struct job *j, struct cpull *cp)
{
	struct member *self = NULL, *first = NULL;
	uint64_t read = 0, fwd = 0;
	size_t failed = 0, usage = 0, differ = 0;
	char names[1024] = "", b[32], rb[32];
	struct msg m;

	for (size_t i = 0; i < cp->n; i++) {
		struct member *mb = &cp->m[i];

		if (strcmp(mb->name, repl.cfg->name) == 0)
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
		for (size_t i = 0; i < cp->n; i++)
			if (cp->m[i].code == 0)
				job_note(j, LOG_ERROR, NULL, NULL, "%s: root %s", cp->m[i].name,
					 cp->m[i].root);
		job_result(j, 1, NULL, NULL, "pull --cluster of %s: the nodes staged different trees "
			   "(roots listed above): either the source changed while it was pulled (pull "
			   "again when it is quiet), or a node's copy changed after it was read "
			   "(`stage verify --deep` on each node names the file)", cp->src);
		return;
	}
	if (failed) {
		job_result(j, usage == cp->n ? 2 : 1, NULL, NULL,
			   "pull --cluster of %s did not complete on %zu of %zu nodes (%s)%s", cp->src,
			   failed, cp->n, names, failed < cp->n ?
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
		   "in all (%.2fx the tree)", cp->src, cp->n, (unsigned long long)first->files, b,
		   first->root, rb, first->bytes ? (double)read / (double)first->bytes : 0.0);
}

void cpull_run(struct job *j, const char *src, const char *dest, const char *nodes)
{
	struct cpull cp = { .src = src, .dest = dest, .flags = j->flags & REQ_VERIFY };
	char id[CPULL_ID_HEX + 1], why[1024] = "", **names = NULL;
	uint8_t raw[CPULL_ID_HEX / 2];
	size_t n = 0;
	int rc;

	if (!repl.cluster) {
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
	cp.n = n;
	cp.m = calloc(n, sizeof(*cp.m));
	if (!cp.m) {
		job_result(j, 1, NULL, NULL, "pull --cluster: out of memory");
		goto out;
	}
	job_set_what(j, "%s onto %zu nodes (cluster pull %.8s)", src, n, id);
	log_info("cluster pull %s: %s onto %s", id, src, cp.list);
	pthread_mutex_init(&cp.mu, NULL);
	pthread_mutex_init(&cp.live.mu, NULL);
	mono_cond_init(&cp.cv);
	for (size_t i = 0; i < n; i++) {
		struct member *mb = &cp.m[i];

		mb->cp = &cp;
		mb->name = names[i];
		mb->host = (size_t)hosts_find(&repl.hosts, names[i]);
		mb->started = pthread_create(&mb->thread, NULL, member_main, mb) == 0;
		if (!mb->started) {
			mb->code = 1;
			snprintf(mb->text, sizeof(mb->text), "no thread to ask it");
			pthread_mutex_lock(&cp.mu);
			mb->answered = true;
			cp.answered++;
			pthread_mutex_unlock(&cp.mu);
		}
	}
	wait_answers(j, &cp);
	for (size_t i = 0; i < n; i++)
		if (cp.m[i].started)
			pthread_join(cp.m[i].thread, NULL);
	if (job_cancelled(j))
		job_result(j, 1, NULL, NULL, "pull --cluster of %s cancelled", src);
	else
		result(j, &cp);
	pthread_cond_destroy(&cp.cv);
	pthread_mutex_destroy(&cp.live.mu);
	pthread_mutex_destroy(&cp.mu);
out:
	free(cp.m);
	free(cp.list);
	hostlist_free(names, n);
}
