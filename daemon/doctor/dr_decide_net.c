/* stage doctor's decisions about the network (dr_decide.c's opening
 * comment says what a check is): bandwidth, links and routes, RDMA, the
 * job's ports, and the matrices of every pair measured. */
#include "daemon/doctor/dr_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/portlist.h"

#define GBIT(bps) ((bps) * 8 / 1e9)
#define LINK_MIN_MBPS 10000
#define FAR_BELOW 0.5            /* a pair under half the median is far below */

/* ------------------------------------------------------------ network */


void dr_decide_bandwidth(const struct dr_in *in, struct dr_out *o)
{
	double *multi = calloc(in->npairs + 1, sizeof(double));
	double *one = calloc(in->npairs + 1, sizeof(double));
	double *rtt = calloc(in->npairs + 1, sizeof(double));
	size_t n = 0, nr = 0, failed = 0;
	double med = 0, med_one, med_rtt;
	struct msg *m;

	if (!multi || !one || !rtt) {
		o->err = -ENOMEM;
		goto out;
	}
	for (size_t k = 0; k < in->npairs; k++) {
		const struct dr_pair *p = &in->pairs[k];
		double r;

		if (!p->measured)
			continue;
		if ((r = dr_getf(&p->ans, "multi_Bps", 0)) > 0) {
			multi[n] = r;
			one[n++] = dr_getf(&p->ans, "one_Bps", 0);
		}
		if ((r = dr_getf(&p->ans, "rtt_med_us", 0)) > 0)
			rtt[nr++] = r;
	}
	med_one = dr_median(one, n);
	med_rtt = dr_median(rtt, nr);
	/* dr_median() sorted multi: recompute per pair from the answers below. */
	med = dr_median(multi, n);
	for (size_t k = 0; k < in->npairs; k++) {
		const struct dr_pair *p = &in->pairs[k];
		const char *a = in->nodes[p->a].name, *b = in->nodes[p->b].name;
		char subj[600], err[512];
		double mb, ob;

		snprintf(subj, sizeof(subj), "%s>%s", a, b);
		if (!p->measured) {
			failed++;
			m = dr_check(o, "bandwidth", subj, false, "not measured: %s", p->why);
			dr_advice(m, "check that %s can reach %s's peer port (the hosts file's "
			       "address) and that staged runs on both", a, b);
			continue;
		}
		mb = dr_getf(&p->ans, "multi_Bps", 0);
		ob = dr_getf(&p->ans, "one_Bps", 0);
		if (dr_get(&p->ans, "multi_err", err, sizeof(err))) {
			/* Fewer streams than asked: the figure is not the link's. */
			failed++;
			m = dr_check(o, "bandwidth", subj, false, "a stream from %s to %s failed: %s",
				  a, b, err);
			dr_advice(m, "check %s's peer port from %s, and how many connections %s "
			       "accepts at once", b, a, b);
			continue;
		}
		/* Two nodes at one address share a machine, not a link: their
		 * figure is the machine's CPU, nothing to judge a path by. */
		if (n >= 3 && mb < FAR_BELOW * med &&
		    in->nodes[p->a].twin != in->nodes[p->b].twin) {
			m = dr_check(o, "bandwidth", subj, false,
				  "%.2f Gbit/s from %s to %s, far below the others' median %.2f",
				  GBIT(mb), a, b, GBIT(med));
			dr_num(m, "gbps", GBIT(mb));
			dr_num(m, "one_stream_gbps", GBIT(ob));
			dr_num(m, "streams", in->streams);
			dr_num(m, "median_gbps", GBIT(med));
			dr_advice(m, "look at the path from %s to %s: a link negotiated slower, a "
			       "shaper (tc qdisc show), a congested or misrouted switch port", a, b);
		}
	}
	if (n) {
		m = dr_check(o, "bandwidth", "all", failed == 0,
			  "%zu direction%s measured%s: median %.2f Gbit/s with %u streams, %.2f with one",
			  n, n == 1 ? "" : "s", in->sampled ? " (a ring and a sample)" : "", GBIT(med),
			  in->streams, GBIT(med_one));
		o->problems -= failed != 0;      /* each failed pair is its own line */
		if (failed)
			dr_advice(m, "the directions that could not be measured are named above");
		dr_num(m, "median_gbps", GBIT(med));
		dr_num(m, "median_one_stream_gbps", GBIT(med_one));
		dr_num(m, "directions", (double)n);
		dr_flag(m, "sampled", in->sampled);
	}
	if (nr) {
		m = dr_check(o, "latency", "all", true, "median round trip %.3f ms over %zu direction%s",
			  med_rtt / 1e3, nr, nr == 1 ? "" : "s");
		dr_num(m, "median_ms", med_rtt / 1e3);
	}
out:
	free(multi);
	free(one);
	free(rtt);
}

/* "IF|MTU|SPEED|LOCAL" of node a's route to b; false when unknown. */
static bool route(const struct dr_node *a, const char *b, char ifname[64], int *mtu,
		  long *speed)
{
	char name[300], v[512];

	snprintf(name, sizeof(name), "route.%s", b);
	if (!dr_get(&a->facts, name, v, sizeof(v)) || v[0] == '!')
		return false;
	return sscanf(v, "%63[^|]|%d|%ld", ifname, mtu, speed) == 3;
}

/* The index of the node called name[0..len), or nnodes. */
static size_t node_named(const struct dr_in *in, const uint8_t *name, size_t len)
{
	for (size_t k = 0; k < in->nnodes; k++)
		if (strlen(in->nodes[k].name) == len && memcmp(in->nodes[k].name, name, len) == 0)
			return k;
	return in->nnodes;
}

/* Each node's routes, read from its own answer (its peers only: the cost
 * is nodes x peers, not nodes squared). */
void dr_decide_links(const struct dr_in *in, struct dr_out *o)
{
	size_t slow = 0, known = 0;

	for (size_t i = 0; i < in->nnodes; i++) {
		const struct dr_node *a = &in->nodes[i];
		char seen[8][64];
		size_t ns = 0, off = 0, len;
		const uint8_t *p;
		uint16_t key;

		while (a->up && msg_next_field(&a->facts, &off, &key, &p, &len) == 1) {
			char ifa[64], ifb[64], subj[600];
			int mtu_a, mtu_b;
			long sp_a, sp_b;
			bool dup = false;
			struct msg *m;
			size_t k;

			if (key != K_NAME || len <= 6 || memcmp(p, "route.", 6) != 0)
				continue;
			k = node_named(in, p + 6, len - 6);
			if (k == in->nnodes || k == i || !in->nodes[k].up ||
			    !route(a, in->nodes[k].name, ifa, &mtu_a, &sp_a))
				continue;
			for (size_t s = 0; s < ns; s++)
				dup |= strcmp(seen[s], ifa) == 0;
			if (!dup && ns < 8) {
				snprintf(seen[ns++], sizeof(seen[0]), "%s", ifa);
				known += sp_a > 0;
				if (sp_a > 0 && sp_a < LINK_MIN_MBPS) {
					slow++;
					snprintf(subj, sizeof(subj), "%s:%s", a->name, ifa);
					m = dr_check(o, "link", subj, false,
						  "%s reaches %s through %s at %ld Mb/s (below 10 Gb/s)",
						  a->name, in->nodes[k].name, ifa, sp_a);
					dr_num(m, "mbps", (double)sp_a);
					dr_num(m, "mtu", mtu_a);
					dr_attr(m, "peer", "%s", in->nodes[k].name);
					dr_advice(m, "check %s's cable and switch port (ethtool %s), or route "
					       "the job over the fast interface (NCCL_SOCKET_IFNAME)",
					       ifa, ifa);
				}
			}
			/* The MTU at both ends of the path, each pair once
			 * (dr_peers is symmetric: k looks at i too). */
			if (k > i && route(&in->nodes[k], a->name, ifb, &mtu_b, &sp_b) &&
			    mtu_a != mtu_b) {
				snprintf(subj, sizeof(subj), "%s-%s", a->name, in->nodes[k].name);
				m = dr_check(o, "mtu", subj, false, "MTU %d on %s:%s but %d on %s:%s",
					  mtu_a, a->name, ifa, mtu_b, in->nodes[k].name, ifb);
				dr_num(m, "mtu_a", mtu_a);
				dr_num(m, "mtu_b", mtu_b);
				dr_advice(m, "give both ends the same MTU (ip link set %s mtu %d on %s, "
				       "and the switch between)", ifb, mtu_a > mtu_b ? mtu_a : mtu_b,
				       in->nodes[k].name);
			}
		}
	}
	if (known && !slow)
		dr_check(o, "link", "all", true, "every link of known speed runs at 10 Gb/s or more");
}

void dr_decide_rdma(const struct dr_in *in, struct dr_out *o)
{
	for (size_t i = 0; i < in->nnodes; i++) {
		const struct dr_node *n = &in->nodes[i];

		for (int k = 0; n->up && k < 16; k++) {
			char name[32], v[256], dev[80], state[64], rate[96], subj[400];
			struct msg *m;
			bool active;

			snprintf(name, sizeof(name), "rdma.%d", k);
			if (!dr_get(&n->facts, name, v, sizeof(v)))
				break;
			if (sscanf(v, "%79[^|]|%63[^|]|%95[^\n]", dev, state, rate) != 3)
				continue;
			active = strstr(state, "ACTIVE") != NULL;
			snprintf(subj, sizeof(subj), "%s:%s", n->name, dev);
			m = dr_check(o, "rdma", subj, active, "%s: %s, %s", dev, state, rate);
			dr_attr(m, "state", "%s", state);
			dr_attr(m, "rate", "%s", rate);
			if (!active)
				dr_advice(m, "bring the port up on %s (ibstat; check the cable and the "
				       "subnet manager)", n->name);
		}
	}
}

/* ------------------------------------------------------------ ports */

static bool required(const struct dr_in *in, size_t p)
{
	return p < in->nrequired;
}

/* What every dialer said of one node's port: read once from each dialer's
 * answer (nodes x peers x ports), never looked up per pair. */
struct tfail {
	size_t nfrom, dropped, refused, unreach;
	char from[1024];
	size_t len;
};

static void gather_dials(const struct dr_in *in, size_t p, struct tfail *f)
{
	char want[16];
	size_t wl;

	wl = (size_t)snprintf(want, sizeof(want), ".%u", in->ports[p]);
	for (size_t s = 0; s < in->nnodes; s++) {
		const struct dr_node *sn = &in->nodes[s];
		size_t off = 0, len, t = 0;
		const uint8_t *n;
		uint16_t key;
		bool hit = false;

		while (sn->up && msg_next_field(&sn->dial, &off, &key, &n, &len) == 1) {
			const char *v = (const char *)n;

			if (key == K_NAME) {
				/* "dial.NODE.PORT" */
				hit = len > 5 + wl && memcmp(n, "dial.", 5) == 0 &&
				      memcmp(n + len - wl, want, wl) == 0 &&
				      (t = node_named(in, n + 5, len - 5 - wl)) < in->nnodes;
				continue;
			}
			if (key != K_VALUE || !hit)
				continue;
			hit = false;
			if (t == s || sn->twin == t || (len == 4 && memcmp(v, "open", 4) == 0))
				continue;
			f[t].nfrom++;
			f[t].dropped += len == 7 && memcmp(v, "dropped", 7) == 0;
			f[t].refused += len == 7 && memcmp(v, "refused", 7) == 0;
			f[t].unreach += len >= 11 && memcmp(v, "unreachable", 11) == 0;
			/* Names while they fit whole; the count says the rest. */
			if (f[t].len + strlen(sn->name) + 2 < sizeof(f[t].from))
				f[t].len += (size_t)snprintf(f[t].from + f[t].len,
							     sizeof(f[t].from) - f[t].len, "%s%s",
							     f[t].len ? ", " : "", sn->name);
		}
	}
}

void dr_decide_ports(const struct dr_in *in, struct dr_out *o)
{
	size_t up = dr_nodes_up(in), bad_ports = 0;
	struct tfail *f = calloc(in->nnodes ? in->nnodes : 1, sizeof(*f));

	if (!f) {
		o->err = -ENOMEM;
		return;
	}
	for (size_t p = 0; p < in->nports; p++) {
		uint16_t port = in->ports[p];
		bool port_ok = true;

		memset(f, 0, in->nnodes * sizeof(*f));
		if (up > 1)
			gather_dials(in, p, f);
		for (size_t t = 0; t < in->nnodes; t++) {
			const struct dr_node *tn = &in->nodes[t];
			char name[300], v[300], subj[300];
			const char *state, *cause;
			struct msg *m;

			if (!tn->up || tn->twin != t)
				continue;
			snprintf(name, sizeof(name), "port.%u", port);
			snprintf(subj, sizeof(subj), "%u@%s", port, tn->name);
			if (dr_get(&tn->listen, name, v, sizeof(v)) && strncmp(v, "in-use|", 7) == 0) {
				if (!required(in, p))
					continue;     /* a sampled port someone uses: pick another */
				port_ok = false;
				m = dr_check(o, "port", subj, false, "%u on %s is in use by %s", port,
					  tn->name, v + 7);
				dr_num(m, "port", port);
				dr_attr(m, "node", "%s", tn->name);
				dr_attr(m, "state", "in-use");
				dr_attr(m, "cause", "in use by %s", v + 7);
				dr_advice(m, "stop what listens on %u on %s, or give the job another port "
				       "(torchrun --master_port)", port, tn->name);
				continue;
			}
			if (!dr_get(&tn->listen, name, v, sizeof(v)) || strcmp(v, "open") != 0) {
				/* Not listening there: what dials found says nothing of
				 * a firewall. */
				if (!required(in, p))
					continue;
				port_ok = false;
				if (!dr_get(&tn->listen, name, v, sizeof(v)) &&
				    !dr_get(&tn->listen, "err", v, sizeof(v)))
					snprintf(v, sizeof(v), "no answer");
				m = dr_check(o, "port", subj, false, "%u on %s could not be opened: %s", port,
					  tn->name, v[0] == 'e' && strncmp(v, "error|", 6) == 0 ? v + 6 : v);
				dr_num(m, "port", port);
				dr_attr(m, "node", "%s", tn->name);
				dr_attr(m, "state", "error");
				dr_advice(m, "see staged's log on %s", tn->name);
				continue;
			}
			if (!f[t].nfrom)
				continue;
			port_ok = false;
			state = f[t].dropped >= f[t].refused && f[t].dropped >= f[t].unreach ? "dropped" :
				f[t].refused >= f[t].unreach ? "refused" : "unreachable";
			cause = strcmp(state, "dropped") == 0 ? "a firewall drops it" :
				strcmp(state, "refused") == 0 ? "a firewall refuses it" : "no route";
			m = dr_check(o, "port", subj, false, "%u on %s cannot be reached from %s: %s",
				  port, tn->name, f[t].from, cause);
			dr_num(m, "port", port);
			dr_attr(m, "node", "%s", tn->name);
			dr_attr(m, "state", "%s", state);
			dr_attr(m, "cause", "%s", cause);
			for (size_t k = 0; k < f[t].len;) {
				size_t l = strcspn(f[t].from + k, ",");

				dr_attr(m, "from[]", "%.*s", (int)l, f[t].from + k);
				k += l + 2;
			}
			if (strcmp(state, "unreachable") == 0)
				dr_advice(m, "check the route from %s to %s (ip route get)", f[t].from,
				       tn->name);
			else
				dr_advice(m, "open tcp/%u on %s (nft list ruleset, iptables -L) and in any "
				       "firewall between", port, tn->name);
		}
		bad_ports += !port_ok;
	}
	free(f);
	if (in->nports && !bad_ports) {
		char list[PORTLIST_MAX * 7];
		size_t len = 0;

		for (size_t p = 0; p < in->nports; p++)
			len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%u", p ? "," : "",
						in->ports[p]);
		dr_check(o, "port", "all", true, up > 1 ? "%zu port%s open between %s (%s)" :
		      "%zu port%s free here (%s)", in->nports, in->nports == 1 ? "" : "s",
		      in->sampled ? "each node and its sampled peers" : "every pair", list);
	}
}

/* ------------------------------------------------------------ matrices */

/* A matrix frame holds at most this many nodes (64 x 64 cells fit a frame
 * many times over); past it the checks still name every problem. */
#define MATRIX_MAX 64

static size_t matrix_nodes(const struct dr_in *in, struct msg *m)
{
	size_t nn = in->nnodes < MATRIX_MAX ? in->nnodes : MATRIX_MAX;

	for (size_t i = 0; i < nn; i++)
		msg_put_str(m, K_HOLDER, in->nodes[i].name);
	if (nn < in->nnodes)
		dr_num(m, "nodes_total", (double)in->nnodes);
	return nn;
}

static void matrix(const struct dr_in *in, struct dr_out *o, const char *name, const char *unit,
		   const char *field, double scale, const char *fmt)
{
	size_t nn, *at;
	struct msg *m;
	bool any = false;

	for (size_t k = 0; k < in->npairs; k++)
		any |= in->pairs[k].measured;
	if (!any || !(m = dr_frame(o, MSG_MATRIX)))
		return;
	msg_put_str(m, K_NAME, name);
	dr_attr(m, "unit", "%s", unit);
	nn = matrix_nodes(in, m);
	/* Which pair each cell shows, found once (SIZE_MAX: none). */
	at = malloc(nn * nn * sizeof(*at) + 1);
	if (!at) {
		o->err = -ENOMEM;
		return;
	}
	for (size_t c = 0; c < nn * nn; c++)
		at[c] = SIZE_MAX;
	for (size_t k = 0; k < in->npairs; k++)
		if (in->pairs[k].a < nn && in->pairs[k].b < nn)
			at[in->pairs[k].a * nn + in->pairs[k].b] = k;
	for (size_t c = 0; c < nn * nn; c++) {
		char cell[32] = "";

		if (at[c] != SIZE_MAX) {
			const struct dr_pair *p = &in->pairs[at[c]];

			snprintf(cell, sizeof(cell), p->measured ? fmt : "✗",
				 dr_getf(&p->ans, field, 0) * scale);
		}
		msg_put_str(m, K_VALUE, cell);
	}
	free(at);
}

static void port_matrix(const struct dr_in *in, struct dr_out *o)
{
	for (size_t p = 0; p < in->nrequired && dr_nodes_up(in) > 1; p++) {
		struct msg *m = dr_frame(o, MSG_MATRIX);
		char name[32];
		size_t nn;

		if (!m)
			return;
		snprintf(name, sizeof(name), "port %u", in->ports[p]);
		msg_put_str(m, K_NAME, name);
		dr_attr(m, "unit", "state");
		nn = matrix_nodes(in, m);
		for (size_t s = 0; s < nn; s++)
			for (size_t t = 0; t < nn; t++) {
				char key[300], v[300] = "";

				snprintf(key, sizeof(key), "port.%u", in->ports[p]);
				if (in->nodes[t].twin != t || in->nodes[s].twin == t) {
					snprintf(v, sizeof(v), "same host");
				} else if (s != t && in->nodes[s].up && in->nodes[t].up) {
					if (dr_get(&in->nodes[t].listen, key, v, sizeof(v)) &&
					    strncmp(v, "in-use", 6) == 0) {
						snprintf(v, sizeof(v), "in-use");
					} else {
						snprintf(key, sizeof(key), "dial.%s.%u", in->nodes[t].name,
							 in->ports[p]);
						if (!dr_get(&in->nodes[s].dial, key, v, sizeof(v)))
							v[0] = '\0';
						v[strcspn(v, "|")] = '\0';
					}
				}
				msg_put_str(m, K_VALUE, v);
			}
	}
}

size_t dr_peers(size_t i, size_t n, size_t pairs_max, size_t *out)
{
	size_t k = 0;

	if (n <= pairs_max) {
		for (size_t j = 0; j < n; j++)
			if (j != i)
				out[k++] = j;
		return k;
	}
	/* i +- 1, 2, 4, 8 ...: symmetric (k looks at i when i looks at k). */
	for (size_t d = 1; d < n && k + 2 <= pairs_max; d *= 2) {
		size_t up = (i + d) % n, down = (i + n - d) % n;
		bool have_up = false, have_down = false;

		for (size_t j = 0; j < k; j++) {
			have_up |= out[j] == up;
			have_down |= out[j] == down;
		}
		if (!have_up && up != i)
			out[k++] = up;
		if (!have_down && down != i && down != up)
			out[k++] = down;
	}
	return k;
}

void dr_matrices(const struct dr_in *in, struct dr_out *o)
{
	matrix(in, o, "bandwidth", "Gbit/s", "multi_Bps", 8 / 1e9, "%.2f");
	matrix(in, o, "bandwidth, one stream", "Gbit/s", "one_Bps", 8 / 1e9, "%.2f");
	matrix(in, o, "latency", "ms", "rtt_med_us", 1e-3, "%.3f");
	port_matrix(in, o);
}
