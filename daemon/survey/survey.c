/* Asking the other nodes: what they hold of a step (verify --cluster,
 * restore, resume), all at once through fanout.h: directly up to [cluster]
 * fanout nodes, through relays past that. The answering side is hold.c's
 * hold_serve.
 *
 * A fresh connection rather than a partner's sender connection: the
 * question goes to every node (not only partners), and must not wait
 * behind a checkpoint being sent. */
#include "daemon/survey/survey.h"
#include "daemon/peers/peers.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hostlist.h"
#include "common/log.h"
#include "daemon/survey/fanout.h"
#include "daemon/survey/hold.h"
#include "daemon/durable/tier.h"
#include "daemon/fs/fsprobe.h"
#include "daemon/net/peer.h"

#define ASK_FAST_MS 30000          /* a fast survey reads manifests only */
#define ASK_DEEP_MS (6 * 3600 * 1000)  /* a deep one reads every byte held */

/* The copy groups in a MSG_HOLD: its K_ORIGIN fields. */
static size_t count_groups(const struct msg *m)
{
	const uint8_t *p;
	size_t off = 0, n, groups = 0;
	uint16_t key;

	while (msg_next_field(m, &off, &key, &p, &n) == 1)
		groups += key == K_ORIGIN;
	return groups;
}

/* A node's answer (fanout.h) into its survey answer: its copy groups, or
 * why there are none. */
static void take_answer(struct fan_answer *f, bool allsteps, struct survey_answer *ans)
{
	const char *name = peers.hosts.v[f->host].name;
	struct msg *m = &f->m;
	size_t groups;
	int rc = f->err;

	if (rc < 0) {
		snprintf(ans->why, sizeof(ans->why), "%s", f->why);
	} else if (m->type == MSG_ERROR) {
		rc = peer_refused(m, name, ans->why, sizeof(ans->why));
	} else if (m->type == MSG_HOLD && (groups = count_groups(m)) >
		   (!allsteps ? (size_t)HOSTS_MAX_NODES : HOLD_STEPS_MAX * peers.hosts.n)) {
		/* One group per origin held, and origins are node names: more
		 * than a hosts file can name is a lie. Refused before parsing:
		 * cverify's decision costs origins x nodes x cells (44,000 in
		 * one frame kept a verify busy for 38 s). */
		snprintf(ans->why, sizeof(ans->why), "%s: an answer of %zu copy groups (at most %d)",
			 name, groups, !allsteps ? HOSTS_MAX_NODES : (int)(HOLD_STEPS_MAX * peers.hosts.n));
		rc = -EBADMSG;
	} else if (m->type != MSG_HOLD || hold_parse(m, name, &ans->cells, &ans->ncells) < 0) {
		snprintf(ans->why, sizeof(ans->why), "%s: a malformed answer", name);
		rc = -EBADMSG;
	}
	if (rc == -EBADMSG)
		log_warn("answer refused: %s", ans->why);
	msg_free(m);
	ans->err = rc;
}

/* The durable tier's answer, as this node reads it (hold_survey_durable). */
static void ask_durable(const char *job, const char *step, struct survey_answer *a)
{
	struct msg m;

	a->node = HOLD_DURABLE;
	/* On shared storage that may hang: the asking thread is not staked
	 * on it (fsprobe.h), the tier is named as not answering instead. */
	a->err = fsprobe_answers(peers.cfg->durable_root, FSPROBE_WAIT_MS, NULL, NULL, a->why,
				 sizeof(a->why));
	if (a->err < 0) {
		char why[sizeof(a->why)];

		snprintf(why, sizeof(why), "%s", a->why);
		snprintf(a->why, sizeof(a->why), "the durable tier: %.480s", why);
		return;
	}
	msg_init(&m, MSG_HOLD);
	a->err = hold_survey_durable(peers.cfg, job, step, &m);
	if (a->err == 0)
		a->err = hold_parse(&m, HOLD_DURABLE, &a->cells, &a->ncells);
	if (a->err < 0)
		snprintf(a->why, sizeof(a->why), "the durable tier %s: %s", peers.cfg->durable_root,
			 strerror(-a->err));
	msg_free(&m);
}

int survey_ask(const char *job, const char *step, bool deep, const char *only,
	       struct survey_answer **out, size_t *n)
{
	size_t nodes = peers.cluster ? peers.hosts.n : 1, nasked = 0;
	bool durable = durable_on(peers.cfg);
	struct survey_answer *ans = calloc(nodes + durable, sizeof(*ans));
	struct fan_answer *asked = calloc(nodes, sizeof(*asked));
	size_t self = peers.cluster ? peers.self : 0;
	struct fanout *f = NULL;
	struct msg q;

	if (!ans || !asked) {
		free(ans);
		free(asked);
		return -ENOMEM;
	}
	if (only && strcmp(only, HOLD_DURABLE) == 0 && durable) {
		/* restore --from durable: the tier alone. */
		free(asked);
		ask_durable(job, step, &ans[0]);
		*out = ans;
		*n = 1;
		return 0;
	}
	if (only && (peers.cluster ? hosts_find(&peers.hosts, only) < 0 :
		     strcmp(only, peers.cfg->name) != 0)) {
		free(ans);
		free(asked);
		return -ENOENT;
	}
	for (size_t i = 0; i < nodes; i++) {
		ans[i].node = peers.cluster ? peers.hosts.v[i].name : peers.cfg->name;
		ans[i].err = -ECANCELED;
		snprintf(ans[i].why, sizeof(ans[i].why), "not asked");
		if (i != self && !(only && strcmp(only, ans[i].node) != 0))
			asked[nasked++].host = i;
	}
	msg_init(&q, MSG_HOLD_REQ);
	msg_put_str(&q, K_JOB, job);
	if (step)
		msg_put_str(&q, K_STEP, step);
	msg_put_u64(&q, K_FLAGS, (deep ? REQ_DEEP : 0) | (step ? 0 : REQ_ALLSTEPS));
	if (nasked) {
		int rc = q.err ? q.err : fanout_start(&f, &q, asked, nasked,
						      deep ? ASK_DEEP_MS : ASK_FAST_MS);

		for (size_t i = 0; rc < 0 && i < nasked; i++) {
			ans[asked[i].host].err = rc;
			snprintf(ans[asked[i].host].why, sizeof(ans[0].why), "%s: not asked: %s",
				 ans[asked[i].host].node, rc == -EAGAIN ? "no thread to ask it" :
				 strerror(-rc));
		}
		if (rc < 0)
			nasked = 0;
	}
	if (!only || strcmp(only, ans[self].node) == 0) {
		struct msg m;

		/* This node answers in place, while the others work. */
		msg_init(&m, MSG_HOLD);
		ans[self].err = hold_survey(peers.cfg, ans[self].node, job, step, deep, &m);
		if (ans[self].err == 0)
			ans[self].err = hold_parse(&m, ans[self].node, &ans[self].cells,
						   &ans[self].ncells);
		if (ans[self].err < 0)
			snprintf(ans[self].why, sizeof(ans[self].why), "%s: %s", ans[self].node,
				 strerror(-ans[self].err));
		msg_free(&m);
	}
	/* The durable tier last, beside the nodes, read while they answer. */
	if (durable && !only)
		ask_durable(job, step, &ans[nodes]);
	if (f)
		fanout_wait(f);
	for (size_t i = 0; i < nasked; i++)
		take_answer(&asked[i], step == NULL, &ans[asked[i].host]);
	msg_free(&q);
	free(asked);
	*out = ans;
	*n = nodes + (durable && !only);
	return 0;
}

void survey_answers_free(struct survey_answer *a, size_t n)
{
	for (size_t i = 0; a && i < n; i++)
		hold_cells_free(a[i].cells, a[i].ncells);
	free(a);
}

int survey_flatten(const struct survey_answer *ans, size_t n, struct survey_flat *f)
{
	memset(f, 0, sizeof(*f));
	f->names = calloc(n ? n : 1, sizeof(*f->names));
	f->why = calloc(n ? n : 1, sizeof(*f->why));
	f->reached = calloc(n ? n : 1, sizeof(*f->reached));
	if (!f->names || !f->why || !f->reached)
		goto fail;
	for (size_t i = 0; i < n; i++) {
		struct hold_cell *v;

		f->names[i] = ans[i].node;
		f->why[i] = ans[i].why;
		f->reached[i] = ans[i].err == 0;
		f->unreached += !f->reached[i];
		if (!ans[i].ncells)
			continue;
		v = realloc(f->cells, (f->ncells + ans[i].ncells) * sizeof(*v));
		if (!v)
			goto fail;
		f->cells = v;
		memcpy(f->cells + f->ncells, ans[i].cells, ans[i].ncells * sizeof(*v));
		f->ncells += ans[i].ncells;
	}
	f->nnodes = n;
	return 0;
fail:
	survey_flat_free(f);
	return -ENOMEM;
}

void survey_flat_free(struct survey_flat *f)
{
	free(f->names);
	free(f->why);
	free(f->reached);
	free(f->cells);
	memset(f, 0, sizeof(*f));
}

int survey_nodes(const char *list, char ***names, size_t *n, char *why, size_t whylen)
{
	char w[400];
	int rc;

	*names = NULL;
	*n = 0;
	if (!list)
		return 0;
	rc = hostlist_expand(list, HOSTS_MAX_NODES, names, n, w, sizeof(w));
	if (rc < 0) {
		snprintf(why, whylen, "--nodes '%.200s': %s", list, w);
		return rc == -ENOMEM ? rc : -EINVAL;
	}
	for (size_t i = 0; i < *n; i++)
		if (peers.cluster ? hosts_find(&peers.hosts, (*names)[i]) < 0 :
		    strcmp((*names)[i], peers.cfg->name) != 0) {
			snprintf(why, whylen, "--nodes: unknown node '%s' (not in the hosts file %s)",
				 (*names)[i], peers.cfg->hosts);
			hostlist_free(*names, *n);
			*names = NULL;
			*n = 0;
			return -EINVAL;
		}
	return 0;
}

size_t survey_placement(const char *origin, const char **holders, size_t cap)
{
	ssize_t o = peers.cluster ? hosts_find(&peers.hosts, origin) : -1;
	size_t *idx;
	int n;

	if (o < 0 || peers.hosts.n < 2 || !(idx = calloc(peers.hosts.n, sizeof(*idx))))
		return 0;
	n = hosts_partners(&peers.hosts, (size_t)o, peers.cfg->replicas, idx, peers.hosts.n - 1);
	for (int i = 0; i < n && (size_t)i < cap; i++)
		holders[i] = peers.hosts.v[idx[i]].name;
	free(idx);
	return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap;
}
