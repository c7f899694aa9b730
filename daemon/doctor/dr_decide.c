/* stage doctor: what the answers mean. Apart from any I/O, so that every
 * rule is unit-tested (tests/unit/test_drdecide.c).
 *
 * A check is one line: what (K_CHECK), about what (K_SUBJECT), ✓ or ✗
 * (K_CODE), the figure (K_TEXT) and, for a problem, one line of advice.
 * The numbers ride along as K_NUM / K_ATTR members for --json. Healthy
 * areas get one summary line each, problems a line each, so a healthy
 * cluster of any size fits one screen.
 */
#include "daemon/doctor/dr_impl.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/portlist.h"

#define GBIT(bps) ((bps) * 8 / 1e9)
#define LINK_MIN_MBPS 10000
#define FAR_BELOW 0.5            /* a pair under half the median is far below */

struct out {
	struct msg *v;
	size_t n, cap;
	unsigned problems;
	int err;
	struct msg scratch;        /* where the puts go when memory ran out */
};

static struct msg *frame(struct out *o, uint16_t type)
{
	if (o->n == o->cap) {
		size_t cap = o->cap ? 2 * o->cap : 32;
		struct msg *v = realloc(o->v, cap * sizeof(*v));

		if (!v) {
			o->err = -ENOMEM;
			return NULL;
		}
		o->v = v;
		o->cap = cap;
	}
	msg_init(&o->v[o->n], type);
	return &o->v[o->n++];
}

__attribute__((format(printf, 5, 6)))
static struct msg *check(struct out *o, const char *what, const char *subject, bool ok,
			 const char *fmt, ...)
{
	struct msg *m = frame(o, MSG_CHECK);
	char text[1024];
	va_list ap;

	if (!m) {
		msg_free(&o->scratch);
		msg_init(&o->scratch, MSG_CHECK);
		return &o->scratch;
	}
	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	msg_put_str(m, K_CHECK, what);
	msg_put_str(m, K_SUBJECT, subject);
	msg_put_u64(m, K_CODE, ok ? 0 : 1);
	msg_put_str(m, K_TEXT, text);
	o->problems += !ok;
	return m;
}

__attribute__((format(printf, 2, 3)))
static void advice(struct msg *m, const char *fmt, ...)
{
	char text[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	msg_put_str(m, K_ADVICE, text);
}

static void num(struct msg *m, const char *name, double v)
{
	char s[160];

	snprintf(s, sizeof(s), "%s=%.6g", name, isfinite(v) ? v : 0);
	msg_put_str(m, K_NUM, s);
}

static void flag(struct msg *m, const char *name, bool v)
{
	char s[160];

	snprintf(s, sizeof(s), "%s=%s", name, v ? "true" : "false");
	msg_put_str(m, K_NUM, s);
}

__attribute__((format(printf, 3, 4)))
static void attr(struct msg *m, const char *name, const char *fmt, ...)
{
	char s[1400];
	va_list ap;
	int k = snprintf(s, sizeof(s), "%s=", name);

	va_start(ap, fmt);
	vsnprintf(s + k, sizeof(s) - (size_t)k, fmt, ap);
	va_end(ap);
	msg_put_str(m, K_ATTR, s);
}

static const char *fmt_rate(double Bps, char *buf, size_t len)
{
	if (Bps >= 1e9)
		snprintf(buf, len, "%.2f GB/s", Bps / 1e9);
	else
		snprintf(buf, len, "%.0f MB/s", Bps / 1e6);
	return buf;
}

static const char *fmt_bytes(double b, char *buf, size_t len)
{
	const char *u[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	int i = 0;

	while (b >= 1024 && i < 5) {
		b /= 1024;
		i++;
	}
	snprintf(buf, len, i ? "%.1f %s" : "%.0f %s", b, u[i]);
	return buf;
}

/* ------------------------------------------------------------ nodes */

static size_t nodes_up(const struct dr_in *in)
{
	size_t up = 0;

	for (size_t i = 0; i < in->nnodes; i++)
		up += in->nodes[i].up;
	return up;
}

static void decide_nodes(const struct dr_in *in, struct out *o)
{
	size_t up = nodes_up(in);
	struct msg *m;

	m = check(o, "nodes", "all", up == in->nnodes, "%zu of %zu node%s answered", up,
		  in->nnodes, in->nnodes == 1 ? "" : "s");
	num(m, "up", (double)up);
	num(m, "nodes", (double)in->nnodes);
	if (up != in->nnodes)
		advice(m, "the nodes that did not answer are named below; the rest were checked");
	for (size_t i = 0; i < in->nnodes; i++)
		if (in->nodes[i].up)
			attr(m, "answered[]", "%s", in->nodes[i].name);
	o->problems -= up != in->nnodes;     /* each down node is its own problem */
	for (size_t i = 0; i < in->nnodes; i++) {
		const struct dr_node *n = &in->nodes[i];

		if (n->up)
			continue;
		m = check(o, "nodes", n->name, false, "did not answer: %s", n->why);
		attr(m, "state", "down");
		attr(m, "why", "%s", n->why);
		advice(m, "start staged on %s (or check its link and cluster key), or leave it "
		       "out with --nodes", n->name);
	}
}

/* ------------------------------------------------------------ clocks */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, size_t n)
{
	if (!n)
		return 0;
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Offsets are measured from the asking node, but judged from the median
 * of every clock measured (the asker's own is 0): an asker whose clock is
 * off is then the one named, not everyone else. */
static double clock_median(const struct dr_in *in)
{
	double *v = calloc(in->nnodes + 1, sizeof(*v)), med;
	size_t n = 0;

	if (!v)
		return 0;
	for (size_t i = 0; i < in->nnodes; i++)
		if (in->nodes[i].up && in->nodes[i].has_clock)
			v[n++] = in->nodes[i].offset_ms;
	med = median(v, n);
	free(v);
	return med;
}

static void decide_clocks(const struct dr_in *in, struct out *o)
{
	double worst = 0, med = clock_median(in);
	size_t bad = 0, seen = 0;

	for (size_t i = 0; i < in->nnodes; i++) {
		const struct dr_node *n = &in->nodes[i];
		char v[16];
		bool synced, known = n->up && dr_get(&n->facts, "clock.synced", v, sizeof(v));
		bool off_ok;
		struct msg *m;

		if (!n->up)
			continue;
		synced = known && strcmp(v, "1") == 0;
		seen++;
		if (!n->has_clock) {
			bad++;
			m = check(o, "clock", n->name, false, "not measured: %s",
				  n->clock_why[0] ? n->clock_why : "no exchange answered");
			flag(m, "synced", synced);
			advice(m, "check the connection to %s: it answered the first question but "
			       "not the clock's", n->name);
			continue;
		}
		off_ok = fabs(n->offset_ms - med) <= in->clock_bound_ms;
		if (fabs(n->offset_ms - med) > fabs(worst))
			worst = n->offset_ms - med;
		if (off_ok && (synced || !known))
			continue;
		bad++;
		if (!off_ok)
			m = check(o, "clock", n->name, false,
				  "%+.3f s from the others' median (bound %d ms)%s",
				  (n->offset_ms - med) / 1e3, in->clock_bound_ms,
				  synced ? "" : ", and not synchronised");
		else
			m = check(o, "clock", n->name, false, "not synchronised (offset %+.1f ms)",
				  n->offset_ms - med);
		num(m, "offset_ms", n->offset_ms);
		num(m, "median_ms", med);
		num(m, "delay_ms", n->delay_ms);
		flag(m, "synced", synced);
		if (!off_ok)
			advice(m, "set %s's clock right and keep it so: chronyc makestep, and check "
			       "that chronyd or ntpd runs there (timedatectl)", n->name);
		else
			advice(m, "%s's kernel clock is not synchronised: run chronyd or ntpd there "
			       "(timedatectl set-ntp true)", n->name);
	}
	if (!bad && seen) {
		struct msg *m = check(o, "clock", "all", true,
				      "%zu clock%s synchronised, within %.1f ms of their median (bound %d ms)",
				      seen, seen == 1 ? "" : "s", fabs(worst), in->clock_bound_ms);

		num(m, "worst_offset_ms", worst);
	}
}

/* ------------------------------------------------------------ network */


static void decide_bandwidth(const struct dr_in *in, struct out *o)
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
	med_one = median(one, n);
	med_rtt = median(rtt, nr);
	/* median() sorted multi: recompute per pair from the answers below. */
	med = median(multi, n);
	for (size_t k = 0; k < in->npairs; k++) {
		const struct dr_pair *p = &in->pairs[k];
		const char *a = in->nodes[p->a].name, *b = in->nodes[p->b].name;
		char subj[600], err[512];
		double mb, ob;

		snprintf(subj, sizeof(subj), "%s>%s", a, b);
		if (!p->measured) {
			failed++;
			m = check(o, "bandwidth", subj, false, "not measured: %s", p->why);
			advice(m, "check that %s can reach %s's peer port (the hosts file's "
			       "address) and that staged runs on both", a, b);
			continue;
		}
		mb = dr_getf(&p->ans, "multi_Bps", 0);
		ob = dr_getf(&p->ans, "one_Bps", 0);
		if (dr_get(&p->ans, "multi_err", err, sizeof(err))) {
			/* Fewer streams than asked: the figure is not the link's. */
			failed++;
			m = check(o, "bandwidth", subj, false, "a stream from %s to %s failed: %s",
				  a, b, err);
			advice(m, "check %s's peer port from %s, and how many connections %s "
			       "accepts at once", b, a, b);
			continue;
		}
		/* Two nodes at one address share a machine, not a link: their
		 * figure is the machine's CPU, nothing to judge a path by. */
		if (n >= 3 && mb < FAR_BELOW * med &&
		    in->nodes[p->a].twin != in->nodes[p->b].twin) {
			m = check(o, "bandwidth", subj, false,
				  "%.2f Gbit/s from %s to %s, far below the others' median %.2f",
				  GBIT(mb), a, b, GBIT(med));
			num(m, "gbps", GBIT(mb));
			num(m, "one_stream_gbps", GBIT(ob));
			num(m, "streams", in->streams);
			num(m, "median_gbps", GBIT(med));
			advice(m, "look at the path from %s to %s: a link negotiated slower, a "
			       "shaper (tc qdisc show), a congested or misrouted switch port", a, b);
		}
	}
	if (n) {
		m = check(o, "bandwidth", "all", failed == 0,
			  "%zu direction%s measured%s: median %.2f Gbit/s with %u streams, %.2f with one",
			  n, n == 1 ? "" : "s", in->sampled ? " (a ring and a sample)" : "", GBIT(med),
			  in->streams, GBIT(med_one));
		o->problems -= failed != 0;      /* each failed pair is its own line */
		if (failed)
			advice(m, "the directions that could not be measured are named above");
		num(m, "median_gbps", GBIT(med));
		num(m, "median_one_stream_gbps", GBIT(med_one));
		num(m, "directions", (double)n);
		flag(m, "sampled", in->sampled);
	}
	if (nr) {
		m = check(o, "latency", "all", true, "median round trip %.3f ms over %zu direction%s",
			  med_rtt / 1e3, nr, nr == 1 ? "" : "s");
		num(m, "median_ms", med_rtt / 1e3);
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
static void decide_links(const struct dr_in *in, struct out *o)
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
					m = check(o, "link", subj, false,
						  "%s reaches %s through %s at %ld Mb/s (below 10 Gb/s)",
						  a->name, in->nodes[k].name, ifa, sp_a);
					num(m, "mbps", (double)sp_a);
					num(m, "mtu", mtu_a);
					attr(m, "peer", "%s", in->nodes[k].name);
					advice(m, "check %s's cable and switch port (ethtool %s), or route "
					       "the job over the fast interface (NCCL_SOCKET_IFNAME)",
					       ifa, ifa);
				}
			}
			/* The MTU at both ends of the path, each pair once
			 * (dr_peers is symmetric: k looks at i too). */
			if (k > i && route(&in->nodes[k], a->name, ifb, &mtu_b, &sp_b) &&
			    mtu_a != mtu_b) {
				snprintf(subj, sizeof(subj), "%s-%s", a->name, in->nodes[k].name);
				m = check(o, "mtu", subj, false, "MTU %d on %s:%s but %d on %s:%s",
					  mtu_a, a->name, ifa, mtu_b, in->nodes[k].name, ifb);
				num(m, "mtu_a", mtu_a);
				num(m, "mtu_b", mtu_b);
				advice(m, "give both ends the same MTU (ip link set %s mtu %d on %s, "
				       "and the switch between)", ifb, mtu_a > mtu_b ? mtu_a : mtu_b,
				       in->nodes[k].name);
			}
		}
	}
	if (known && !slow)
		check(o, "link", "all", true, "every link of known speed runs at 10 Gb/s or more");
}

static void decide_rdma(const struct dr_in *in, struct out *o)
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
			m = check(o, "rdma", subj, active, "%s: %s, %s", dev, state, rate);
			attr(m, "state", "%s", state);
			attr(m, "rate", "%s", rate);
			if (!active)
				advice(m, "bring the port up on %s (ibstat; check the cable and the "
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

static void decide_ports(const struct dr_in *in, struct out *o)
{
	size_t up = nodes_up(in), bad_ports = 0;
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
				m = check(o, "port", subj, false, "%u on %s is in use by %s", port,
					  tn->name, v + 7);
				num(m, "port", port);
				attr(m, "node", "%s", tn->name);
				attr(m, "state", "in-use");
				attr(m, "cause", "in use by %s", v + 7);
				advice(m, "stop what listens on %u on %s, or give the job another port "
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
				m = check(o, "port", subj, false, "%u on %s could not be opened: %s", port,
					  tn->name, v[0] == 'e' && strncmp(v, "error|", 6) == 0 ? v + 6 : v);
				num(m, "port", port);
				attr(m, "node", "%s", tn->name);
				attr(m, "state", "error");
				advice(m, "see staged's log on %s", tn->name);
				continue;
			}
			if (!f[t].nfrom)
				continue;
			port_ok = false;
			state = f[t].dropped >= f[t].refused && f[t].dropped >= f[t].unreach ? "dropped" :
				f[t].refused >= f[t].unreach ? "refused" : "unreachable";
			cause = strcmp(state, "dropped") == 0 ? "a firewall drops it" :
				strcmp(state, "refused") == 0 ? "a firewall refuses it" : "no route";
			m = check(o, "port", subj, false, "%u on %s cannot be reached from %s: %s",
				  port, tn->name, f[t].from, cause);
			num(m, "port", port);
			attr(m, "node", "%s", tn->name);
			attr(m, "state", "%s", state);
			attr(m, "cause", "%s", cause);
			for (size_t k = 0; k < f[t].len;) {
				size_t l = strcspn(f[t].from + k, ",");

				attr(m, "from[]", "%.*s", (int)l, f[t].from + k);
				k += l + 2;
			}
			if (strcmp(state, "unreachable") == 0)
				advice(m, "check the route from %s to %s (ip route get)", f[t].from,
				       tn->name);
			else
				advice(m, "open tcp/%u on %s (nft list ruleset, iptables -L) and in any "
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
		check(o, "port", "all", true, up > 1 ? "%zu port%s open between %s (%s)" :
		      "%zu port%s free here (%s)", in->nports, in->nports == 1 ? "" : "s",
		      in->sampled ? "each node and its sampled peers" : "every pair", list);
	}
}

/* ------------------------------------------------------------ sameness */

struct fval {
	char value[300];
	size_t count;
};

static void decide_facts(const struct dr_in *in, struct out *o)
{
	const struct dr_node *first = NULL;
	size_t nsame = 0, nfacts = 0;
	char same[1024] = "";

	for (size_t i = 0; i < in->nnodes && !first; i++)
		if (in->nodes[i].up)
			first = &in->nodes[i];
	if (!first)
		return;
	/* The facts the first node reports name the facts; every node runs
	 * the same config, and one that lacks a fact shows "(absent)". */
	for (size_t off = 0;;) {
		const uint8_t *p;
		size_t len, nv = 0, best = 0;
		uint16_t key;
		char fname[80];
		struct fval vals[16];
		struct msg *m;
		int more;

		while ((more = msg_next_field(&first->facts, &off, &key, &p, &len)) == 1 &&
		       !(key == K_NAME && len > 5 && len < sizeof(fname) && memcmp(p, "fact.", 5) == 0))
			;
		if (more != 1)
			break;
		memcpy(fname, p, len);
		fname[len] = '\0';
		nfacts++;
		for (size_t i = 0; i < in->nnodes; i++) {
			char v[300];
			size_t k;

			if (!in->nodes[i].up)
				continue;
			if (!dr_get(&in->nodes[i].facts, fname, v, sizeof(v)))
				snprintf(v, sizeof(v), "(absent)");
			for (k = 0; k < nv && strcmp(vals[k].value, v) != 0; k++)
				;
			if (k == nv && nv < 16) {
				snprintf(vals[nv].value, sizeof(vals[nv].value), "%s", v);
				vals[nv++].count = 0;
			}
			if (k < nv)
				vals[k].count++;
		}
		for (size_t k = 1; k < nv; k++)
			if (vals[k].count > vals[best].count)
				best = k;
		if (nv <= 1) {
			size_t l = strlen(same);

			nsame++;
			snprintf(same + l, sizeof(same) - l, "%s%s", l ? ", " : "", fname + 5);
			continue;
		}
		{
			char odd[1024] = "";
			size_t l = 0;

			for (size_t i = 0; i < in->nnodes; i++) {
				char v[300];

				if (!in->nodes[i].up)
					continue;
				if (!dr_get(&in->nodes[i].facts, fname, v, sizeof(v)))
					snprintf(v, sizeof(v), "(absent)");
				if (strcmp(v, vals[best].value) != 0)
					l += (size_t)snprintf(odd + l, l < sizeof(odd) ? sizeof(odd) - l : 0,
							      "%s%s has '%s'", l ? "; " : "",
							      in->nodes[i].name, v);
			}
			m = check(o, "fact", fname + 5, false, "%s, the others '%s'", odd,
				  vals[best].value);
			attr(m, "name", "%s", fname + 5);
			attr(m, "majority", "%s", vals[best].value);
			for (size_t i = 0; i < in->nnodes; i++) {
				char v[300], key2[300];

				if (!in->nodes[i].up)
					continue;
				if (!dr_get(&in->nodes[i].facts, fname, v, sizeof(v)))
					snprintf(v, sizeof(v), "(absent)");
				snprintf(key2, sizeof(key2), "values.%s", in->nodes[i].name);
				attr(m, key2, "%s", v);
			}
			advice(m, "make %s the same on every node (a job across different %s fails "
			       "or runs slow in ways that are hard to trace)", fname + 5, fname + 5);
		}
	}
	if (nsame)
		check(o, "fact", "all", true, "%s: the same on %zu node%s", same, nodes_up(in),
		      nodes_up(in) == 1 ? "" : "s");
	(void)nfacts;
}

/* ------------------------------------------------------------ storage */

static void decide_storage(const struct dr_in *in, struct out *o)
{
	for (size_t i = 0; i < in->nnodes; i++) {
		const struct dr_node *n = &in->nodes[i];
		double stage_read = 0;
		char v[600], subj[800], a[32], b[32], c[32];
		struct msg *m;

		if (!n->up)
			continue;
		if (dr_get(&n->disk, "err", v, sizeof(v))) {
			m = check(o, "storage", n->name, false, "not measured: %s", v);
			advice(m, "see staged's log on %s", n->name);
			continue;
		}
		for (int k = 0; k < 3; k++) {
			char root[32], path[512], same[8], shared[80];
			double w, r, freeb;
			bool direct;

			if (!dr_get_at(&n->disk, "disk", (size_t)k, "root", root, sizeof(root)))
				continue;
			dr_get_at(&n->disk, "disk", (size_t)k, "path", path, sizeof(path));
			if (dr_get_at(&n->disk, "disk", (size_t)k, "same", same, sizeof(same)))
				continue;    /* the same file system as a root above */
			snprintf(subj, sizeof(subj), "%s:%s", n->name, root);
			if (dr_get_at(&n->disk, "disk", (size_t)k, "err", v, sizeof(v))) {
				m = check(o, "storage", subj, false, "%s: %s", root, v);
				attr(m, "path", "%s", path);
				advice(m, "make %s writable by staged on %s", path, n->name);
				continue;
			}
			w = dr_getf_at(&n->disk, "disk", (size_t)k, "write", 0);
			r = dr_getf_at(&n->disk, "disk", (size_t)k, "read", 0);
			direct = dr_getf_at(&n->disk, "disk", (size_t)k, "direct", 0) != 0;
			freeb = dr_getf_at(&n->disk, "disk", (size_t)k, "free", 0);
			if (k == 0)
				stage_read = r;
			/* The roots on this one's file system, measured with it. */
			shared[0] = '\0';
			for (int k2 = k + 1; k2 < 3; k2++) {
				char r2[32];
				size_t l = strlen(shared);

				if (dr_getf_at(&n->disk, "disk", (size_t)k2, "same", -1) != k)
					continue;
				if (dr_get_at(&n->disk, "disk", (size_t)k2, "root", r2, sizeof(r2)))
					snprintf(shared + l, sizeof(shared) - l, "%s%s", l ? ", " : "", r2);
			}
			m = check(o, "storage", subj, true, "write %s, read %s%s, %s free%s%s%s",
				  fmt_rate(w, a, sizeof(a)), fmt_rate(r, b, sizeof(b)),
				  direct ? "" : " (cached: no direct I/O)", fmt_bytes(freeb, c, sizeof(c)),
				  shared[0] ? " (" : "", shared, shared[0] ? " too)" : "");
			num(m, "write_mbps", w / 1e6);
			num(m, "read_mbps", r / 1e6);
			flag(m, "direct", direct);
			num(m, "free_bytes", freeb);
			attr(m, "path", "%s", path);
			if (strcmp(root, "ckpt_root") == 0 || (k == 0 && dr_get(&n->disk, "disk.1.same",
									       same, sizeof(same)))) {
				double newest = dr_getf(&n->disk, "newest", 0);
				char step[300] = "";

				dr_get(&n->disk, "newest.step", step, sizeof(step));
				if (newest > 0) {
					snprintf(subj, sizeof(subj), "%s:ckpt_root", n->name);
					m = check(o, "space", subj, freeb >= newest,
						  "%s free, the newest checkpoint (%s) is %s",
						  fmt_bytes(freeb, a, sizeof(a)), step,
						  fmt_bytes(newest, b, sizeof(b)));
					num(m, "free_bytes", freeb);
					num(m, "newest_bytes", newest);
					if (freeb < newest)
						advice(m, "free space on %s's ckpt_root: the next checkpoint "
						       "will not fit", n->name);
				}
			}
		}
		for (int k = 0; k < 16; k++) {
			char path[512];
			double r, meta;

			if (!dr_get_at(&n->disk, "src", (size_t)k, "path", path, sizeof(path)))
				break;
			snprintf(subj, sizeof(subj), "%s:%s", n->name, path);
			if (dr_get_at(&n->disk, "src", (size_t)k, "err", v, sizeof(v))) {
				m = check(o, "source", subj, false, "%s: %s", path, v);
				advice(m, "check the mount of %s on %s", path, n->name);
				continue;
			}
			r = dr_getf_at(&n->disk, "src", (size_t)k, "read", 0);
			meta = dr_getf_at(&n->disk, "src", (size_t)k, "meta", 0);
			if (r <= 0) {
				m = check(o, "source", subj, true, "no file to read; %.0f entries/s", meta);
				num(m, "files_per_s", meta);
				continue;
			}
			/* A shared mount slower than local disk is every cluster
			 * this is for, not a fault: a preflight that failed on it
			 * would fail every job's launch script. It is said, with
			 * what to do, under a line that passes. */
			m = check(o, "source", subj, true, "reads at %s, %.0f entries/s",
				  fmt_rate(r, a, sizeof(a)), meta);
			num(m, "read_mbps", r / 1e6);
			num(m, "files_per_s", meta);
			if (stage_read > 0 && r < stage_read / 2)
				advice(m, "%s is slower than local disk (%s): stage pull the dataset to "
				       "local disk first", path, fmt_rate(stage_read, b, sizeof(b)));
		}
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
		num(m, "nodes_total", (double)in->nnodes);
	return nn;
}

static void matrix(const struct dr_in *in, struct out *o, const char *name, const char *unit,
		   const char *field, double scale, const char *fmt)
{
	size_t nn, *at;
	struct msg *m;
	bool any = false;

	for (size_t k = 0; k < in->npairs; k++)
		any |= in->pairs[k].measured;
	if (!any || !(m = frame(o, MSG_MATRIX)))
		return;
	msg_put_str(m, K_NAME, name);
	attr(m, "unit", "%s", unit);
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

static void port_matrix(const struct dr_in *in, struct out *o)
{
	for (size_t p = 0; p < in->nrequired && nodes_up(in) > 1; p++) {
		struct msg *m = frame(o, MSG_MATRIX);
		char name[32];
		size_t nn;

		if (!m)
			return;
		snprintf(name, sizeof(name), "port %u", in->ports[p]);
		msg_put_str(m, K_NAME, name);
		attr(m, "unit", "state");
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

int dr_decide(const struct dr_in *in, struct msg **out, size_t *n, unsigned *problems)
{
	struct out o = { 0 };

	msg_init(&o.scratch, MSG_CHECK);

	decide_nodes(in, &o);
	decide_clocks(in, &o);
	decide_bandwidth(in, &o);
	decide_links(in, &o);
	decide_rdma(in, &o);
	decide_ports(in, &o);
	decide_facts(in, &o);
	decide_storage(in, &o);
	matrix(in, &o, "bandwidth", "Gbit/s", "multi_Bps", 8 / 1e9, "%.2f");
	matrix(in, &o, "bandwidth, one stream", "Gbit/s", "one_Bps", 8 / 1e9, "%.2f");
	matrix(in, &o, "latency", "ms", "rtt_med_us", 1e-3, "%.3f");
	port_matrix(in, &o);
	msg_free(&o.scratch);
	if (o.err) {
		dr_frames_free(o.v, o.n);
		return o.err;
	}
	*out = o.v;
	*n = o.n;
	*problems = o.problems;
	return 0;
}

void dr_frames_free(struct msg *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		msg_free(&v[i]);
	free(v);
}
