/* stage doctor, the asking side: which nodes, which questions in which
 * order, and the answers handed to dr_decide.c.
 *
 *   facts + clock   every node at once (one connection each: the facts,
 *                   then DR_TIME_ROUNDS NTP-style exchanges)
 *   storage         every node at once, each measuring its own disks
 *   ports           every node opens them, then every node dials its
 *                   peers' (dr_peers), then they are released
 *   network         rounds of disjoint pairs (no node in two pairs of a
 *                   round, so a node's link carries one test at a time),
 *                   both directions of a pair at once (links are full
 *                   duplex): latency, one stream, several streams
 *
 * Up to pairs_max nodes every pair is measured (the circle method's N-1
 * rounds); beyond, the ring (each node and the next) plus as many random
 * pairs as nodes, so the cost grows with N and not N^2. Each phase asks every node, on at
 * most [cluster] fanout threads at once (a connection each); a node that
 * does not answer the first question is down and asked nothing more.
 */
#include "daemon/doctor/doctor.h"
#include "daemon/doctor/dr_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

#include "common/clock.h"
#include "common/hostlist.h"
#include "common/log.h"
#include "common/portlist.h"
#include "daemon/survey/survey.h"
#include "daemon/net/peer.h"
#include "daemon/repl/repl.h"
#include "daemon/peers/peers.h"

#define ASK_IO_MS 30000

struct run {
	struct job *j;
	const struct stage_config *cfg;
	char session[DR_SESSION_LEN + 1];
	bool quick;
	struct dr_in in;
	uint16_t ports[PORTLIST_MAX];
	char portlist[PORTLIST_MAX * 7];   /* ports as one list, for the questions */
};

static void ask_init(struct msg *m, const struct run *r, const char *kind)
{
	msg_init(m, MSG_DOCTOR_ASK);
	msg_put_str(m, K_KIND, kind);
	msg_put_str(m, K_JOB, r->session);
}

/* One question to one node: in place for this node, else over a fresh
 * connection (kept open in *keep when given, for more questions). */
static int ask(const struct run *r, const struct dr_node *n, const struct msg *q,
	       struct msg *ans, struct xport **keep, int io_ms, char *why, size_t whylen)
{
	struct xport *x = keep ? *keep : NULL;
	int rc;

	msg_init(ans, MSG_DOCTOR_ANS);
	if (n->self) {
		struct dr_ctx c = { .cfg = r->cfg, .asker = n->name };

		rc = dr_answer(&c, q, ans, why, whylen);
		if (rc < 0)
			msg_free(ans);
		return rc;
	}
	msg_free(ans);
	if (!x) {
		rc = peers_dial(n->host, PEERS_CONNECT_MS, io_ms, &x, why, whylen);
		if (rc < 0)
			return rc;
	}
	rc = x->ops->send(x, q);
	if (rc == 0)
		rc = x->ops->recv(x, ans);
	if (rc < 0) {
		snprintf(why, whylen, "%s: %s", n->name,
			 rc == -ENOTCONN ? "closed the connection (an older version?)" :
			 strerror(-rc));
	} else if (ans->type == MSG_ERROR) {
		rc = peer_refused(ans, n->name, why, whylen);
		msg_free(ans);
	} else if (ans->type != MSG_DOCTOR_ANS) {
		snprintf(why, whylen, "%s: a malformed answer", n->name);
		msg_free(ans);
		rc = -EBADMSG;
	}
	if (keep && rc == 0)
		*keep = x;
	else {
		x->ops->close(x);
		if (keep)
			*keep = NULL;
	}
	return rc;
}

/* ask() for an answer kept in *out: one that did not come is kept as an
 * answer saying why ("err"), so the decision reads every node the same way. */
static void ask_kept(const struct run *r, const struct dr_node *n, const struct msg *q,
		     struct msg *out, int io_ms)
{
	char why[512];

	if (ask(r, n, q, out, NULL, io_ms, why, sizeof(why)) < 0) {
		msg_init(out, MSG_DOCTOR_ANS);
		msg_put_pairf(out, "err", "%s", why);
	}
}

/* ------------------------------------------------------------ every node at once */

/* fn(r, i) for every node that is up: this node's in place, the others' on
 * at most [cluster] fanout threads at once (each takes the next node when
 * done), so a doctor of 1,000 nodes holds no more threads and connections
 * than one of 32. */
struct each {
	struct run *r;
	void (*fn)(struct run *r, size_t i);
	const size_t *todo;        /* the other nodes up, taken before any thread starts
				    * (the phase writes `up`) */
	size_t ntodo;
	atomic_size_t next;        /* the next of todo to take */
};

static void *each_main(void *arg)
{
	struct each *e = arg;
	size_t k;

	while ((k = atomic_fetch_add(&e->next, 1)) < e->ntodo)
		e->fn(e->r, e->todo[k]);
	return NULL;
}

/* The threads a phase asks the other nodes on: [cluster] fanout at most. */
static size_t phase_width(const struct run *r)
{
	return r->cfg->fanout > 0 ? (size_t)r->cfg->fanout : 32;
}

static void for_each_node(struct run *r, void (*fn)(struct run *r, size_t i))
{
	size_t width = phase_width(r), self = r->in.nnodes, nt = 0;
	size_t *todo = calloc(r->in.nnodes + 1, sizeof(*todo));
	struct each e = { .r = r, .fn = fn, .todo = todo };
	pthread_t *t;

	atomic_init(&e.next, 0);
	for (size_t i = 0; todo && i < r->in.nnodes; i++) {
		if (r->in.nodes[i].up && r->in.nodes[i].self)
			self = i;
		else if (r->in.nodes[i].up)
			todo[e.ntodo++] = i;
	}
	if (width > e.ntodo)
		width = e.ntodo;
	t = calloc(width + 1, sizeof(*t));
	/* The others' threads first, so that this node's own part (in place)
	 * runs alongside theirs rather than before them. */
	for (size_t k = 0; t && k < width; k++)
		if (pthread_create(&t[nt], NULL, each_main, &e) == 0)
			nt++;
	if (self < r->in.nnodes)
		fn(r, self);
	if (nt == 0)
		each_main(&e);          /* no thread to be had: one at a time, here */
	for (size_t k = 0; k < nt; k++)
		pthread_join(t[k], NULL);
	free(t);
	free(todo);
}

/* ------------------------------------------------------------ facts and clocks */

static void facts_and_clock(struct run *r, size_t i)
{
	struct dr_node *n = &r->in.nodes[i];
	struct xport *x = NULL;
	double best_delay = 1e18;
	struct msg q, a;

	size_t *mates = calloc(r->in.nnodes, sizeof(*mates)), np;

	ask_init(&q, r, "facts");
	np = mates ? dr_peers(i, r->in.nnodes, r->in.pairs_max, mates) : 0;
	for (size_t k = 0; k < np; k++)
		msg_put_str(&q, K_HOLDER, r->in.nodes[mates[k]].name);
	free(mates);
	n->up = ask(r, n, &q, &n->facts, n->self ? NULL : &x, ASK_IO_MS, n->why,
		    sizeof(n->why)) == 0;
	msg_free(&q);
	if (!n->up)
		return;
	if (n->self) {
		n->has_clock = true;    /* the reference: offset 0 by definition */
		return;
	}
	/* NTP's four timestamps; the round with the shortest round trip has
	 * the least room for asymmetry, so its offset is kept. */
	for (int round = 0; round < DR_TIME_ROUNDS && x; round++) {
		uint64_t t1, t2, t3, t4;
		char why[256] = "";

		ask_init(&q, r, "time");
		t1 = wall_ns();
		msg_put_u64(&q, K_T1, t1);
		if (ask(r, n, &q, &a, &x, ASK_IO_MS, why, sizeof(why)) == 0) {
			t4 = wall_ns();
			if (msg_get_u64(&a, K_T2, &t2) == 0 && msg_get_u64(&a, K_T3, &t3) == 0) {
				/* Differences in integers first: ns since the epoch
				 * lose precision as doubles, and either clock may
				 * step back between two readings. */
				int64_t d41 = (int64_t)(t4 - t1), d32 = (int64_t)(t3 - t2);
				int64_t d21 = (int64_t)(t2 - t1), d34 = (int64_t)(t3 - t4);
				double delay = (double)(d41 - d32) / 1e6;
				double off = ((double)d21 + (double)d34) / 2e6;

				if (delay < best_delay) {
					best_delay = delay;
					n->offset_ms = off;
					n->delay_ms = delay;
					n->has_clock = true;
				}
			}
			msg_free(&a);
		}
		msg_free(&q);
		if (!n->has_clock && why[0])
			snprintf(n->clock_why, sizeof(n->clock_why), "%s", why);
	}
	if (x)
		x->ops->close(x);
}

static void storage(struct run *r, size_t i)
{
	struct dr_node *n = &r->in.nodes[i];
	uint64_t size = r->cfg->doctor_storage_size / (r->quick ? 8 : 1);
	struct msg q;

	ask_init(&q, r, "disk");
	msg_put_u64(&q, K_SIZE, size);
	ask_kept(r, n, &q, &n->disk, ASK_IO_MS * 4);
	msg_free(&q);
}

/* ------------------------------------------------------------ ports */

static void ports_listen(struct run *r, size_t i)
{
	struct dr_node *n = &r->in.nodes[i];
	struct msg q;

	if (n->twin != i)
		return;
	ask_init(&q, r, "listen");
	msg_put_str(&q, K_PORTS, r->portlist);
	/* The ports stay open while every node dials: its dials take about
	 * nodes / fanout rounds of questions, a few seconds each at most. */
	msg_put_u64(&q, K_TIMEOUT_MS, DR_LEASE_MS + (uint64_t)(r->in.nnodes / phase_width(r) + 1) *
		    DR_DIAL_ROUND_MS);
	ask_kept(r, n, &q, &n->listen, ASK_IO_MS);
	msg_free(&q);
}

static void ports_dial(struct run *r, size_t i)
{
	struct dr_node *n = &r->in.nodes[i];
	size_t *mates = calloc(r->in.nnodes, sizeof(*mates)), np;
	struct msg q;

	ask_init(&q, r, "dial");
	msg_put_str(&q, K_PORTS, r->portlist);
	msg_put_u64(&q, K_SIZE, r->quick ? 500 : 1500);
	np = mates ? dr_peers(i, r->in.nnodes, r->in.pairs_max, mates) : 0;
	for (size_t j = 0; j < np; j++) {
		size_t k = mates[j];

		if (r->in.nodes[k].up && r->in.nodes[k].twin == k && k != n->twin)
			msg_put_str(&q, K_HOLDER, r->in.nodes[k].name);
	}
	free(mates);
	ask_kept(r, n, &q, &n->dial, ASK_IO_MS);
	msg_free(&q);
}

static void say(struct run *r, size_t i, const char *kind)
{
	struct dr_node *n = &r->in.nodes[i];
	char why[256];
	struct msg q, a;

	ask_init(&q, r, kind);
	if (ask(r, n, &q, &a, NULL, 5000, why, sizeof(why)) == 0)
		msg_free(&a);
	msg_free(&q);
}

static void ports_release(struct run *r, size_t i)
{
	say(r, i, "release");
}

static void session_end(struct run *r, size_t i)
{
	say(r, i, "end");
}

/* ------------------------------------------------------------ network */

static bool wanted(const struct dr_in *in, size_t a, size_t b)
{
	for (size_t k = 0; k < in->npairs; k++)
		if ((in->pairs[k].a == a && in->pairs[k].b == b))
			return true;
	return false;
}

/* The rounds: no node in two pairs of a round, both directions of a pair
 * in the same one. Every pair: the circle method, N-1 rounds (N even; N
 * odd: N, a node resting in each). A ring and a sample: first fit, a
 * handful of rounds. Pairs come as couples, 2c and 2c+1 the two
 * directions. Returns the number of rounds. */
static size_t plan_rounds(struct dr_in *in, const size_t *pos, size_t nup)
{
	size_t M = nup + (nup & 1), rounds = 0, ncouples = in->npairs / 2;
	bool *busy;

	if (!in->sampled) {
		for (size_t c = 0; c < ncouples; c++) {
			size_t i = pos[in->pairs[2 * c].a], j = pos[in->pairs[2 * c].b], r;

			if (i > j) {
				size_t t = i;

				i = j;
				j = t;
			}
			/* Round r pairs i with j where i + j = 2r (mod M-1), and the
			 * node with i = r with the fixed node M-1. */
			r = j == M - 1 ? i : ((i + j) * (M / 2)) % (M - 1);
			in->pairs[2 * c].round = in->pairs[2 * c + 1].round = r;
		}
		return M - 1;
	}
	busy = calloc(in->nnodes, sizeof(*busy));
	for (size_t c = 0; c < ncouples; c++)
		in->pairs[2 * c].round = in->pairs[2 * c + 1].round = SIZE_MAX;
	for (size_t left = ncouples; left && busy; rounds++) {
		memset(busy, 0, in->nnodes * sizeof(*busy));
		for (size_t c = 0; c < ncouples; c++) {
			struct dr_pair *p = &in->pairs[2 * c];

			if (p->round != SIZE_MAX || busy[p->a] || busy[p->b])
				continue;
			busy[p->a] = busy[p->b] = true;
			p->round = in->pairs[2 * c + 1].round = rounds;
			left--;
		}
	}
	if (!busy)      /* no memory: one pair at a time */
		for (size_t c = 0; c < ncouples; c++)
			in->pairs[2 * c].round = in->pairs[2 * c + 1].round = rounds++;
	free(busy);
	return rounds;
}

/* Both directions of every pair to measure; a ring and a sample when
 * there are more nodes than pairs_max. */
static int plan_pairs(struct run *r, size_t *rounds)
{
	struct dr_in *in = &r->in;
	size_t *up = calloc(in->nnodes, sizeof(*up)), *pos = calloc(in->nnodes, sizeof(*pos));
	size_t nup = 0, cap;

	if (!up || !pos) {
		free(up);
		free(pos);
		return -ENOMEM;
	}
	for (size_t i = 0; i < in->nnodes; i++)
		if (in->nodes[i].up) {
			pos[i] = nup;
			up[nup++] = i;
		}
	*rounds = 0;
	if (nup < 2)
		goto out;
	in->sampled = nup > in->pairs_max;
	cap = in->sampled ? 4 * nup : nup * (nup - 1);
	in->pairs = calloc(cap, sizeof(*in->pairs));
	if (!in->pairs) {
		free(up);
		free(pos);
		return -ENOMEM;
	}
	for (size_t x = 0; x < nup; x++)
		for (size_t y = x + 1; y < nup; y++) {
			bool ring = y == x + 1 || (x == 0 && y == nup - 1);

			if (in->sampled && !ring)
				continue;
			in->pairs[in->npairs++] = (struct dr_pair){ .a = up[x], .b = up[y] };
			in->pairs[in->npairs++] = (struct dr_pair){ .a = up[y], .b = up[x] };
		}
	for (size_t s = 0; in->sampled && s < nup && in->npairs + 2 <= cap; s++) {
		uint32_t rnd[2];
		size_t x, y;

		if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd))
			break;
		x = up[rnd[0] % nup];
		y = up[rnd[1] % nup];
		if (x == y || wanted(in, x, y))
			continue;
		in->pairs[in->npairs++] = (struct dr_pair){ .a = x, .b = y };
		in->pairs[in->npairs++] = (struct dr_pair){ .a = y, .b = x };
	}
	*rounds = plan_rounds(in, pos, nup);
out:
	free(up);
	free(pos);
	return 0;
}

struct pjob {
	struct run *r;
	struct dr_pair *p;
	pthread_t t;
	bool started;
};

static void *pair_main(void *arg)
{
	struct pjob *pj = arg;
	struct run *r = pj->r;
	struct dr_pair *p = pj->p;
	const struct dr_node *a = &r->in.nodes[p->a];
	uint64_t dur = (uint64_t)r->cfg->doctor_duration_ms / (r->quick ? 5 : 1);
	struct msg q;

	if (dur < 100)
		dur = 100;
	ask_init(&q, r, "bw");
	msg_put_str(&q, K_HOLDER, r->in.nodes[p->b].name);
	msg_put_u64(&q, K_SIZE, dur);
	msg_put_u64(&q, K_FILES_TOTAL, (uint64_t)r->cfg->doctor_streams);
	msg_put_u64(&q, K_BYTES_TOTAL, r->cfg->doctor_rate);
	p->err = ask(r, a, &q, &p->ans, NULL, (int)(3 * dur) + ASK_IO_MS, p->why, sizeof(p->why));
	p->measured = p->err == 0;
	msg_free(&q);
	return NULL;
}

/* Round after round, every pair of a round at once (plan_rounds). */
static void network(struct run *r, size_t rounds)
{
	struct dr_in *in = &r->in;
	struct pjob *pj = calloc(in->npairs ? in->npairs : 1, sizeof(*pj));

	if (!pj) {
		for (size_t k = 0; k < in->npairs; k++)
			snprintf(in->pairs[k].why, sizeof(in->pairs[k].why), "out of memory");
		return;
	}
	for (size_t round = 0; round < rounds && !job_cancelled(r->j); round++) {
		size_t n = 0;

		for (size_t k = 0; k < in->npairs; k++)
			if (in->pairs[k].round == round)
				pj[n++] = (struct pjob){ .r = r, .p = &in->pairs[k] };
		for (size_t k = 0; k < n; k++)
			pj[k].started = pthread_create(&pj[k].t, NULL, pair_main, &pj[k]) == 0;
		for (size_t k = 0; k < n; k++)
			if (pj[k].started)
				pthread_join(pj[k].t, NULL);
			else
				pair_main(&pj[k]);
		job_progress(r->j, false);
	}
	for (size_t k = 0; k < in->npairs; k++)
		if (!in->pairs[k].measured && !in->pairs[k].why[0])
			snprintf(in->pairs[k].why, sizeof(in->pairs[k].why), "cancelled");
	free(pj);
}

/* ------------------------------------------------------------ nodes and ports asked for */

static int pick_nodes(struct run *r, const char *list, char *why, size_t whylen)
{
	char **names = NULL;
	size_t n = 0;

	if (!peers.cluster) {
		if (list && strcmp(list, peers.cfg->name) != 0) {
			snprintf(why, whylen, "--nodes: this node (%s) has no hosts file, so it "
				 "can check only itself", peers.cfg->name);
			return -EINVAL;
		}
		r->in.nodes = calloc(1, sizeof(*r->in.nodes));
		if (!r->in.nodes)
			return -ENOMEM;
		r->in.nodes[0] = (struct dr_node){ .name = peers.cfg->name, .self = true, .up = true };
		r->in.nnodes = 1;
		return 0;
	}
	if (list) {
		int rc = survey_nodes(list, &names, &n, why, whylen);

		if (rc < 0)
			return rc;
	} else {
		n = peers.hosts.n;
	}
	r->in.nodes = calloc(n, sizeof(*r->in.nodes));
	if (!r->in.nodes) {
		hostlist_free(names, list ? n : 0);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		size_t h = names ? (size_t)hosts_find(&peers.hosts, names[i]) : i;
		bool dup = false;

		for (size_t k = 0; k < r->in.nnodes; k++)
			dup |= r->in.nodes[k].host == h;
		if (dup)
			continue;
		r->in.nodes[r->in.nnodes] = (struct dr_node){
			.name = peers.hosts.v[h].name, .host = h, .self = h == peers.self, .up = true,
			.twin = r->in.nnodes };
		for (size_t k = 0; k < r->in.nnodes; k++)
			if (strcasecmp(peers.hosts.v[r->in.nodes[k].host].host, peers.hosts.v[h].host) == 0) {
				r->in.nodes[r->in.nnodes].twin = k;
				break;
			}
		r->in.nnodes++;
	}
	hostlist_free(names, list ? n : 0);
	return 0;
}

static int pick_ports(struct run *r, const char *list, char *why, size_t whylen)
{
	const char *given = list ? list : r->cfg->doctor_ports;
	uint16_t lo, hi;
	size_t n = 0, len = 0;
	int rc;

	rc = portlist_parse(given, r->ports, PORTLIST_MAX, &n, why, whylen);
	if (rc < 0) {
		char w[400];

		snprintf(w, sizeof(w), "%s", why);
		snprintf(why, whylen, "%s '%s': %s", list ? "--ports" : "doctor.ports", given, w);
		return -EINVAL;
	}
	r->in.nrequired = n;
	rc = portrange_parse(r->cfg->doctor_port_range, &lo, &hi, why, whylen);
	for (int s = 0; rc == 0 && hi > lo && s < r->cfg->doctor_port_sample * 4 &&
	     n < PORTLIST_MAX && n < r->in.nrequired + (size_t)r->cfg->doctor_port_sample; s++) {
		uint32_t rnd;
		uint16_t p;
		bool dup = false;

		if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd))
			break;
		p = (uint16_t)(lo + rnd % ((uint32_t)hi - lo + 1));
		for (size_t k = 0; k < n; k++)
			dup |= r->ports[k] == p;
		if (!dup)
			r->ports[n++] = p;
	}
	for (size_t k = 0; k < n; k++)
		len += (size_t)snprintf(r->portlist + len, sizeof(r->portlist) - len, "%s%u",
					k ? "," : "", r->ports[k]);
	r->in.ports = r->ports;
	r->in.nports = n;
	return 0;
}

/* ------------------------------------------------------------ the whole run */

static void run_free(struct run *r)
{
	for (size_t i = 0; i < r->in.nnodes; i++) {
		msg_free(&r->in.nodes[i].facts);
		msg_free(&r->in.nodes[i].disk);
		msg_free(&r->in.nodes[i].listen);
		msg_free(&r->in.nodes[i].dial);
	}
	for (size_t k = 0; k < r->in.npairs; k++)
		msg_free(&r->in.pairs[k].ans);
	free(r->in.nodes);
	free(r->in.pairs);
}

static void phase(struct run *r, const char *what)
{
	char why[256];

	/* This node's own lease, between questions it may not answer itself. */
	dr_session_take(r->session, peers_self_name(), 0, why, sizeof(why));
	atomic_store(&r->j->phase, what);
	job_set_what(r->j, "of %zu node%s (%s)", r->in.nnodes, r->in.nnodes == 1 ? "" : "s", what);
	job_progress(r->j, true);
}

void doctor_run(struct job *j, const char *nodes, const char *ports)
{
	struct run r = { .j = j, .cfg = j->cfg, .quick = (j->flags & REQ_QUICK) != 0 };
	struct msg *frames = NULL;
	size_t nframes = 0, up = 0, rounds = 0;
	unsigned problems = 0;
	uint8_t id[DR_SESSION_LEN / 2];
	char why[600] = "";
	int rc;

	if (getrandom(id, sizeof(id), 0) != sizeof(id)) {
		job_result(j, 1, NULL, NULL, "no random session id: %s", strerror(errno));
		return;
	}
	for (size_t i = 0; i < sizeof(id); i++)
		snprintf(r.session + 2 * i, 3, "%02x", id[i]);
	rc = pick_nodes(&r, nodes, why, sizeof(why));
	if (rc == 0)
		rc = pick_ports(&r, ports, why, sizeof(why));
	if (rc < 0) {
		job_result(j, rc == -EINVAL ? 2 : 1, NULL, NULL, "%s", why[0] ? why : strerror(-rc));
		run_free(&r);
		return;
	}
	r.in.clock_bound_ms = r.cfg->doctor_clock_bound_ms;
	r.in.pairs_max = (size_t)r.cfg->doctor_pairs_max;
	r.in.sampled = r.in.nnodes > r.in.pairs_max;
	r.in.streams = (unsigned)r.cfg->doctor_streams;
	/* This node first: a doctor already running here is the usual clash. */
	if (dr_session_take(r.session, peers_self_name(), 0, why, sizeof(why)) < 0) {
		job_result(j, 1, NULL, NULL, "%s", why);
		run_free(&r);
		return;
	}
	phase(&r, "facts");
	for_each_node(&r, facts_and_clock);
	for (size_t i = 0; i < r.in.nnodes; i++) {
		struct dr_node *n = &r.in.nodes[i];

		up += n->up;
		/* Another doctor holding a node: nothing of this one can be trusted. */
		if (!n->up && strstr(n->why, "a doctor is already running")) {
			for_each_node(&r, session_end);
			dr_session_end(r.session);
			job_result(j, 1, NULL, NULL, "%s", n->why);
			run_free(&r);
			return;
		}
	}
	if (!job_cancelled(j)) {
		phase(&r, "storage");
		for_each_node(&r, storage);
	}
	if (!job_cancelled(j)) {
		phase(&r, "ports");
		for_each_node(&r, ports_listen);
		if (up > 1)
			for_each_node(&r, ports_dial);
		for_each_node(&r, ports_release);
	}
	if (!job_cancelled(j) && plan_pairs(&r, &rounds) == 0 && r.in.npairs) {
		phase(&r, "network");
		network(&r, rounds);
	}
	for_each_node(&r, session_end);
	dr_session_end(r.session);    /* when this node was not among those asked */
	if (job_cancelled(j)) {
		job_result(j, 1, NULL, NULL, "doctor cancelled");
		run_free(&r);
		return;
	}
	rc = dr_decide(&r.in, &frames, &nframes, &problems);
	if (rc < 0) {
		job_result(j, 1, NULL, NULL, "doctor: %s", strerror(-rc));
		run_free(&r);
		return;
	}
	for (size_t k = 0; k < nframes; k++)
		job_send(j, &frames[k]);     /* consumes each */
	free(frames);
	if (problems)
		job_result(j, 1, NULL, NULL, "%u problem%s found on %zu node%s", problems,
			   problems == 1 ? "" : "s", r.in.nnodes, r.in.nnodes == 1 ? "" : "s");
	else
		job_result(j, 0, NULL, NULL, "no problem found on %zu node%s", r.in.nnodes,
			   r.in.nnodes == 1 ? "" : "s");
	run_free(&r);
}
