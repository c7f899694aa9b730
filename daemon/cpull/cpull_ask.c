/* Asking a set of other nodes to take part in a cluster pull: the asker's
 * (cpull.c) or a relay's, for its group (cpull_node.c). Up to [cluster]
 * fanout nodes are asked directly, a thread and a connection each; past
 * that, the set is cut into fanout groups of neighbours and the first of
 * each is asked to relay for the rest (K_NAME in its MSG_CPULL_ASK): it
 * runs its own part, asks its group the same way, and reports for all of
 * them on its one connection: their progress summed, the slowest of them,
 * and each one's answer, named.
 *
 * A node's record (struct cask_node) goes: asked -> answered (code, text
 * and figures; from its own answer, or the reason it has none) -> over
 * (the set's owner says every node of the pull answered: MSG_END is sent
 * and the connection closed). A relay's thread settles its group too:
 * answers it forwards, and when its connection ends first, the group's
 * nodes still unanswered are settled as failed, named with the relay they
 * were asked through (their parts stop when they find their asker gone;
 * the pull run again finishes them).
 *
 * Threads: one per direct or relay node; the owner reads under c->mu.
 */
#include "daemon/fs/cred.h"
#include "daemon/cpull/cpull_impl.h"
#include "daemon/peers/peers.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "daemon/net/peer.h"

/* An answer (MSG_ASK_DONE) into a node's record. */
static void take_answer(struct cask_node *nd, const struct msg *m)
{
	char *s = NULL;
	uint64_t code = 1;

	msg_get_u64(m, K_CODE, &code);
	nd->code = code > 2 ? 1 : (int)code;
	if (msg_get_str(m, K_TEXT, &s) == 0)
		snprintf(nd->text, sizeof(nd->text), "%s", s);
	free(s);
	s = NULL;
	if (msg_get_str(m, K_ROOT, &s) == 0)
		snprintf(nd->root, sizeof(nd->root), "%s", s);
	free(s);
	s = NULL;
	if (msg_get_str(m, K_PATH, &s) == 0)
		snprintf(nd->path, sizeof(nd->path), "%s", s);
	free(s);
	msg_get_u64(m, K_FILES_TOTAL, &nd->files);
	msg_get_u64(m, K_BYTES_TOTAL, &nd->bytes);
	msg_get_u64(m, K_FILES_COPIED, &nd->rfiles);
	msg_get_u64(m, K_BYTES_COPIED, &nd->rbytes);
	msg_get_u64(m, K_FILES_FWD, &nd->ffiles);
	msg_get_u64(m, K_BYTES_FWD, &nd->fbytes);
}

void cask_take_part(struct cask_node *nd, const struct cpull_answer *ans)
{
	nd->code = ans->code;
	snprintf(nd->text, sizeof(nd->text), "%s", ans->text);
	if (ans->code == 0)
		digest_to_hex(ans->st.root, nd->root);
	snprintf(nd->path, sizeof(nd->path), "%s", ans->st.dst);
	nd->files = ans->st.files;
	nd->bytes = ans->st.bytes;
	nd->rfiles = ans->st.read_files;
	nd->rbytes = ans->st.read_bytes;
	nd->ffiles = ans->st.fwd_files;
	nd->fbytes = ans->st.fwd_bytes;
}

void cask_put_answer(struct msg *m, const struct cask_node *nd, bool named)
{
	msg_init(m, MSG_ASK_DONE);
	if (named)
		msg_put_str(m, K_NAME, nd->name);
	msg_put_u64(m, K_CODE, (uint64_t)nd->code);
	msg_put_str(m, K_TEXT, nd->text);
	if (nd->code == 0)
		msg_put_str(m, K_ROOT, nd->root);
	msg_put_str(m, K_PATH, nd->path);
	msg_put_u64(m, K_FILES_TOTAL, nd->files);
	msg_put_u64(m, K_BYTES_TOTAL, nd->bytes);
	msg_put_u64(m, K_FILES_COPIED, nd->rfiles);
	msg_put_u64(m, K_BYTES_COPIED, nd->rbytes);
	msg_put_u64(m, K_FILES_FWD, nd->ffiles);
	msg_put_u64(m, K_BYTES_FWD, nd->fbytes);
}

/* Under c->mu. */
static void settle(struct cask *c, struct cask_node *nd)
{
	if (nd->answered)
		return;
	nd->answered = true;
	c->answered++;
	pthread_cond_broadcast(&c->cv);
}

/* The node of relay r's group (r included) named name[0..n), not yet
 * answered; NULL if none. */
static struct cask_node *group_node(struct cask *c, struct cask_node *r, const uint8_t *name,
				    size_t n)
{
	if (strlen(r->name) == n && memcmp(r->name, name, n) == 0)
		return r->answered ? NULL : r;
	for (size_t i = 0; i < r->ngrp; i++) {
		struct cask_node *nd = &c->v[r->grp[i]];

		if (strlen(nd->name) == n && memcmp(nd->name, name, n) == 0)
			return nd->answered ? NULL : nd;
	}
	return NULL;
}

static bool group_done(const struct cask *c, const struct cask_node *r)
{
	if (!r->answered)
		return false;
	for (size_t i = 0; i < r->ngrp; i++)
		if (!c->v[r->grp[i]].answered)
			return false;
	return true;
}

static int ask_send(struct cask *c, struct cask_node *nd, struct xport *x)
{
	const struct cpull_ask *a = c->a;
	struct msg m;
	int rc;

	msg_init(&m, MSG_CPULL_ASK);
	msg_put_str(&m, K_JOB, a->id);
	msg_put_str(&m, K_PATH, a->src);
	if (a->dest)
		msg_put_str(&m, K_DEST, a->dest);
	msg_put_u64(&m, K_FLAGS, a->flags);
	msg_put_str(&m, K_NODES, a->list);
	if (a->who)
		cred_to_msg(&m, a->who);
	for (size_t i = 0; i < nd->ngrp; i++)
		msg_put_str(&m, K_NAME, c->v[nd->grp[i]].name);
	rc = x->ops->send(x, &m);
	msg_free(&m);
	return rc;
}

/* One frame from nd's connection, under c->mu: 0 to go on, 1 when nd and
 * its group have answered, -EBADMSG. */
static int take_frame(struct cask *c, struct cask_node *nd, const struct msg *m)
{
	const uint8_t *name;
	size_t n;

	if (m->type == MSG_PROGRESS) {
		struct cpull_prog p = { 0 };
		char *slow = NULL;

		msg_get_u64(m, K_FILES_DONE, &p.files_done);
		msg_get_u64(m, K_FILES_TOTAL, &p.files_total);
		msg_get_u64(m, K_BYTES_DONE, &p.bytes_done);
		msg_get_u64(m, K_BYTES_TOTAL, &p.bytes_total);
		msg_get_u64(m, K_BYTES_FWD, &p.bytes_fwd);
		nd->prog = p;
		nd->slow[0] = '\0';
		if (msg_get_str(m, K_HOLDER, &slow) == 0) {
			snprintf(nd->slow, sizeof(nd->slow), "%s", slow);
			msg_get_u64(m, K_SLOW_DONE, &nd->slow_done);
			msg_get_u64(m, K_SLOW_TOTAL, &nd->slow_total);
		}
		free(slow);
		return 0;
	}
	if (m->type != MSG_ASK_DONE)
		return -EBADMSG;
	if (msg_get_bytes(m, K_NAME, &name, &n) == 0) {
		struct cask_node *t = group_node(c, nd, name, n);

		if (!t)
			return -EBADMSG;   /* not of its group, or twice */
		take_answer(t, m);
		settle(c, t);
	} else if (!nd->answered) {
		take_answer(nd, m);
		settle(c, nd);
	} else {
		return -EBADMSG;
	}
	return group_done(c, nd) ? 1 : 0;
}

/* Relay nd failed before it could have asked its group (not reached, or
 * refused at once): it is settled with why, and the middle node of its group
 * relays for the rest in its place (a group is neighbours, often a rack:
 * the node next to a lost relay may be lost with it). Under c->mu. Returns
 * the new relay. */
static struct cask_node *promote(struct cask *c, struct cask_node *nd, const char *why)
{
	size_t *g = (size_t *)nd->grp, k = nd->ngrp, mid = k / 2, t;
	struct cask_node *r;

	nd->code = 1;
	snprintf(nd->text, sizeof(nd->text), "%s", why);
	settle(c, nd);
	t = g[0];
	g[0] = g[mid];
	g[mid] = t;
	r = &c->v[g[0]];
	r->via = NULL;
	r->grp = g + 1;
	r->ngrp = k - 1;
	for (size_t i = 1; i < k; i++)
		c->v[g[i]].via = r;
	nd->ngrp = 0;
	log_info("cluster pull %s: %s: %s; %s relays for its group in its place", c->a->id,
		 nd->name, why, r->name);
	return r;
}

/* Asks nd (and through it its group): 0 once it and its group answered,
 * or -errno with why. *early: it failed before it could have asked its
 * group. */
static int ask_node(struct cask *c, struct cask_node *nd, struct xport **xp, bool *early,
		    char *why, size_t whylen)
{
	bool heard = false, cancelled;
	struct xport *x = NULL;
	struct msg m;
	int rc;

	/* The node reports its progress every 250 ms while it pulls: silent
	 * for [cluster] peer_timeout, it is gone (a link down, a node stopped). */
	rc = peers_dial(nd->host, PEERS_CONNECT_MS, peers_io_ms(), &x, why, whylen);
	*early = rc < 0;
	if (rc == 0) {
		pthread_mutex_lock(&c->mu);
		cancelled = c->cancelled;
		if (!cancelled)
			nd->x = x;
		pthread_mutex_unlock(&c->mu);
		if (cancelled) {
			x->ops->close(x);
			snprintf(why, whylen, "not asked: the pull was cancelled");
			return -ECANCELED;
		}
		*xp = x;
		rc = ask_send(c, nd, x);
	}
	while (rc == 0 && (rc = x->ops->recv(x, &m)) == 0) {
		if (m.type == MSG_ERROR) {
			/* A refusal before anything else: the node asked nobody. */
			*early = !heard;
			rc = peer_refused(&m, nd->name, why, whylen);
			msg_free(&m);
			return rc < 0 ? rc : -EPROTO;
		}
		heard = true;
		pthread_mutex_lock(&c->mu);
		rc = take_frame(c, nd, &m);
		pthread_mutex_unlock(&c->mu);
		if (rc < 0)
			snprintf(why, whylen, "%s: a malformed answer (%s)", nd->name,
				 m.type == MSG_ASK_DONE ? "an answer for a node not of its group, or "
				 "twice" : "a frame of another type");
		msg_free(&m);
		if (rc == 1)
			return 0;
	}
	if (rc < 0 && !why[0])
		snprintf(why, whylen, "%s", rc == -ENOTCONN ?
			 "the connection was lost before it answered (killed? link down?)" :
			 strerror(-rc));
	return rc;
}

static void *node_main(void *arg)
{
	struct cask_node *nd = arg;
	struct cask *c = nd->c;
	struct xport *x = NULL;

	pthread_setname_np(pthread_self(), "cpull ask");
	char why[1024] = "";
	bool early = false;
	struct msg m;
	int rc;

	if (nd->here) {
		/* This node's own part, in place: a node cannot ask itself over
		 * the wire (the handshake refuses its own reflection). */
		c->here(nd, c->here_arg);
		pthread_mutex_lock(&c->mu);
		settle(c, nd);
		while (!c->over)
			pthread_cond_wait(&c->cv, &c->mu);
		pthread_mutex_unlock(&c->mu);
		return NULL;
	}
	for (;;) {
		why[0] = '\0';
		rc = ask_node(c, nd, &x, &early, why, sizeof(why));
		if (rc == 0 || !early || nd->ngrp == 0 || rc == -ECANCELED)
			break;
		pthread_mutex_lock(&c->mu);
		nd->x = NULL;
		nd = promote(c, nd, why);
		pthread_mutex_unlock(&c->mu);
		if (x)
			x->ops->close(x);
		x = NULL;
	}
	pthread_mutex_lock(&c->mu);
	if (rc < 0 && !nd->answered) {
		nd->code = 1;
		snprintf(nd->text, sizeof(nd->text), "%s", why);
	}
	settle(c, nd);
	for (size_t i = 0; i < nd->ngrp; i++) {
		struct cask_node *g = &c->v[nd->grp[i]];

		if (!g->answered) {
			g->code = 1;
			snprintf(g->text, sizeof(g->text), "asked through %s, which ended before it "
				 "answered for this node: %.900s", nd->name, why);
		}
		settle(c, g);
	}
	while (!c->over)
		pthread_cond_wait(&c->cv, &c->mu);
	nd->x = NULL;
	pthread_mutex_unlock(&c->mu);
	if (x) {
		/* The node (and its group) may stop serving their peers: all
		 * are done. */
		msg_init(&m, MSG_END);
		x->ops->send(x, &m);
		msg_free(&m);
		x->ops->close(x);
	}
	return NULL;
}

int cask_start(struct cask **out, const struct cpull_ask *a, char *const *names, size_t n,
	       void (*here)(struct cask_node *nd, void *arg), void *here_arg)
{
	size_t width = peers.cfg && peers.cfg->fanout > 1 ? (size_t)peers.cfg->fanout : 32;
	size_t nrem = 0, ngroups;
	struct cask *c = calloc(1, sizeof(*c));

	if (!c || !(c->v = calloc(n + 1, sizeof(*c->v))) ||
	    !(c->grp = calloc(n + 1, sizeof(*c->grp)))) {
		if (c)
			free(c->v);
		free(c);
		return -ENOMEM;
	}
	c->a = a;
	c->n = n;
	c->here = here;
	c->here_arg = here_arg;
	pthread_mutex_init(&c->mu, NULL);
	mono_cond_init(&c->cv);
	for (size_t i = 0; i < n; i++) {
		struct cask_node *nd = &c->v[i];

		nd->c = c;
		nd->name = names[i];
		nd->host = (size_t)hosts_find(&peers.hosts, names[i]);
		nd->code = 1;
		nd->here = here && strcmp(names[i], peers.cfg->name) == 0;
		if (!nd->here)
			c->grp[nrem++] = i;     /* the others, in order */
	}
	/* Group g of the others is [nrem g / G, nrem (g + 1) / G): its first
	 * node relays for the rest, when there is a rest. */
	ngroups = nrem < width ? nrem : width;
	for (size_t g = 0; g < ngroups; g++) {
		size_t lo = nrem * g / ngroups, hi = nrem * (g + 1) / ngroups;
		struct cask_node *r = &c->v[c->grp[lo]];

		r->grp = &c->grp[lo + 1];
		r->ngrp = hi - lo - 1;
		for (size_t i = lo + 1; i < hi; i++)
			c->v[c->grp[i]].via = r;
	}
	/* Which nodes get a thread is settled before any starts: a thread
	 * whose relay is lost hands its group to another node, which must not
	 * then get a thread of its own too. */
	for (size_t i = 0; i < n; i++)
		c->v[i].head = !c->v[i].via;
	for (size_t i = 0; i < n; i++) {
		struct cask_node *nd = &c->v[i];

		if (!nd->head)
			continue;
		nd->started = pthread_create(&nd->thread, NULL, node_main, nd) == 0;
		if (nd->started)
			continue;
		pthread_mutex_lock(&c->mu);
		snprintf(nd->text, sizeof(nd->text), "no thread to ask it");
		settle(c, nd);
		for (size_t k = 0; k < nd->ngrp; k++) {
			struct cask_node *g = &c->v[nd->grp[k]];

			snprintf(g->text, sizeof(g->text), "no thread to ask %s, which was to ask this "
				 "node", nd->name);
			settle(c, g);
		}
		pthread_mutex_unlock(&c->mu);
	}
	*out = c;
	return 0;
}

bool cask_wait(struct cask *c, int ms)
{
	struct timespec ts = mono_timespec(mono_ns() + (uint64_t)ms * 1000000ull);
	bool all;

	pthread_mutex_lock(&c->mu);
	if (c->answered < c->n)
		pthread_cond_timedwait(&c->cv, &c->mu, &ts);
	all = c->answered == c->n;
	pthread_mutex_unlock(&c->mu);
	return all;
}

void cask_cancel(struct cask *c)
{
	pthread_mutex_lock(&c->mu);
	c->cancelled = true;            /* a node being dialled is not asked */
	for (size_t i = 0; i < c->n; i++)
		if (c->v[i].x)
			c->v[i].x->ops->shutdown(c->v[i].x);
	pthread_mutex_unlock(&c->mu);
}

/* What a node that answered 0 staged, as progress: all of it done. */
static struct cpull_prog final_of(const struct cask_node *nd)
{
	return (struct cpull_prog){ nd->files, nd->files, nd->bytes, nd->bytes, nd->fbytes };
}

/* A relay whose group has answered: its last report may be older than the
 * answers, so each figure is the greater of it and the answers' sum (the
 * sum never goes back). Under c->mu. */
static void final_of_group(const struct cask *c, const struct cask_node *r, struct cpull_prog *p)
{
	struct cpull_prog f = { 0 };

	for (size_t i = 0; i <= r->ngrp; i++) {
		const struct cask_node *nd = i == r->ngrp ? r : &c->v[r->grp[i]];
		struct cpull_prog fin = final_of(nd);

		if (nd->code == 0)
			cpull_prog_add(&f, &fin);
	}
#define MAXF(x) p->x = p->x > f.x ? p->x : f.x
	MAXF(files_done);
	MAXF(files_total);
	MAXF(bytes_done);
	MAXF(bytes_total);
	MAXF(bytes_fwd);
#undef MAXF
}

void cask_sum(struct cask *c, struct cpull_prog *sum, struct cask_slow *slow)
{
	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; i < c->n; i++) {
		const struct cask_node *nd = &c->v[i];
		struct cpull_prog p = nd->prog;
		bool relay = nd->ngrp > 0;

		if (nd->via || (nd->here && !nd->answered))
			continue;               /* in its relay's figures; the owner's own part */
		if (!relay && nd->answered && nd->code == 0)
			p = final_of(nd);
		if (relay && group_done(c, nd))
			final_of_group(c, nd, &p);
		cpull_prog_add(sum, &p);
		if (relay && nd->slow[0] && !group_done(c, nd))
			cask_slow_offer(slow, nd->slow, nd->slow_done, nd->slow_total);
		else if (!relay && !nd->answered)
			cask_slow_offer(slow, nd->name, p.bytes_done, p.bytes_total);
	}
	pthread_mutex_unlock(&c->mu);
}

void cask_slow_offer(struct cask_slow *s, const char *name, uint64_t done, uint64_t total)
{
	double f = total ? (double)done / (double)total : 0;

	if (!s->name[0] || f < s->frac) {
		snprintf(s->name, sizeof(s->name), "%s", name);
		s->frac = f;
		s->done = done;
		s->total = total;
	}
}

void cask_end(struct cask *c)
{
	pthread_mutex_lock(&c->mu);
	c->over = true;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	for (size_t i = 0; i < c->n; i++)
		if (c->v[i].started)
			pthread_join(c->v[i].thread, NULL);
}

void cask_free(struct cask *c)
{
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mu);
	free(c->grp);
	free(c->v);
	free(c);
}
