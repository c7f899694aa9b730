/* stage doctor: what the answers mean. Apart from any I/O, so that every
 * rule is unit-tested (tests/unit/test_drdecide.c).
 *
 * A check is one line: what (K_CHECK), about what (K_SUBJECT), ✓ or ✗
 * (K_CODE), the figure (K_TEXT) and, for a problem, one line of advice.
 * The numbers ride along as K_NUM / K_ATTR members for --json. Healthy
 * areas get one summary line each, problems a line each, so a healthy
 * cluster of any size fits one screen.
 *
 * This file: the nodes, the clocks, the facts every node should share,
 * storage, and the order of the whole; the network's checks are
 * dr_decide_net.c's, the frames and figures they all write dr_judge.c's.
 */
#include "daemon/doctor/dr_impl.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/portlist.h"


/* ------------------------------------------------------------ nodes */


static void decide_nodes(const struct dr_in *in, struct dr_out *o)
{
	size_t up = dr_nodes_up(in);
	struct msg *m;

	m = dr_check(o, "nodes", "all", up == in->nnodes, "%zu of %zu node%s answered", up,
		  in->nnodes, in->nnodes == 1 ? "" : "s");
	dr_num(m, "up", (double)up);
	dr_num(m, "nodes", (double)in->nnodes);
	if (up != in->nnodes)
		dr_advice(m, "the nodes that did not answer are named below; the rest were checked");
	for (size_t i = 0; i < in->nnodes; i++)
		if (in->nodes[i].up)
			dr_attr(m, "answered[]", "%s", in->nodes[i].name);
	o->problems -= up != in->nnodes;     /* each down node is its own problem */
	for (size_t i = 0; i < in->nnodes; i++) {
		const struct dr_node *n = &in->nodes[i];

		if (n->up)
			continue;
		m = dr_check(o, "nodes", n->name, false, "did not answer: %s", n->why);
		dr_attr(m, "state", "down");
		dr_attr(m, "why", "%s", n->why);
		dr_advice(m, "start staged on %s (or check its link and cluster key), or leave it "
		       "out with --nodes", n->name);
	}
}

/* ------------------------------------------------------------ clocks */

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
	med = dr_median(v, n);
	free(v);
	return med;
}

static void decide_clocks(const struct dr_in *in, struct dr_out *o)
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
			m = dr_check(o, "clock", n->name, false, "not measured: %s",
				  n->clock_why[0] ? n->clock_why : "no exchange answered");
			dr_flag(m, "synced", synced);
			dr_advice(m, "check the connection to %s: it answered the first question but "
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
			m = dr_check(o, "clock", n->name, false,
				  "%+.3f s from the others' median (bound %d ms)%s",
				  (n->offset_ms - med) / 1e3, in->clock_bound_ms,
				  synced ? "" : ", and not synchronised");
		else
			m = dr_check(o, "clock", n->name, false, "not synchronised (offset %+.1f ms)",
				  n->offset_ms - med);
		dr_num(m, "offset_ms", n->offset_ms);
		dr_num(m, "median_ms", med);
		dr_num(m, "delay_ms", n->delay_ms);
		dr_flag(m, "synced", synced);
		if (!off_ok)
			dr_advice(m, "set %s's clock right and keep it so: chronyc makestep, and check "
			       "that chronyd or ntpd runs there (timedatectl)", n->name);
		else
			dr_advice(m, "%s's kernel clock is not synchronised: run chronyd or ntpd there "
			       "(timedatectl set-ntp true)", n->name);
	}
	if (!bad && seen) {
		struct msg *m = dr_check(o, "clock", "all", true,
				      "%zu clock%s synchronised, within %.1f ms of their median (bound %d ms)",
				      seen, seen == 1 ? "" : "s", fabs(worst), in->clock_bound_ms);

		dr_num(m, "worst_offset_ms", worst);
	}
}

/* ------------------------------------------------------------ sameness */

struct fval {
	char value[300];
	size_t count;
};

static void decide_facts(const struct dr_in *in, struct dr_out *o)
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
			m = dr_check(o, "fact", fname + 5, false, "%s, the others '%s'", odd,
				  vals[best].value);
			dr_attr(m, "name", "%s", fname + 5);
			dr_attr(m, "majority", "%s", vals[best].value);
			for (size_t i = 0; i < in->nnodes; i++) {
				char v[300], key2[300];

				if (!in->nodes[i].up)
					continue;
				if (!dr_get(&in->nodes[i].facts, fname, v, sizeof(v)))
					snprintf(v, sizeof(v), "(absent)");
				snprintf(key2, sizeof(key2), "values.%s", in->nodes[i].name);
				dr_attr(m, key2, "%s", v);
			}
			dr_advice(m, "make %s the same on every node (a job across different %s fails "
			       "or runs slow in ways that are hard to trace)", fname + 5, fname + 5);
		}
	}
	if (nsame)
		dr_check(o, "fact", "all", true, "%s: the same on %zu node%s", same, dr_nodes_up(in),
		      dr_nodes_up(in) == 1 ? "" : "s");
	(void)nfacts;
}

/* ------------------------------------------------------------ storage */

static void decide_storage(const struct dr_in *in, struct dr_out *o)
{
	for (size_t i = 0; i < in->nnodes; i++) {
		const struct dr_node *n = &in->nodes[i];
		double stage_read = 0;
		char v[600], subj[800], a[32], b[32], c[32];
		struct msg *m;

		if (!n->up)
			continue;
		if (dr_get(&n->disk, "err", v, sizeof(v))) {
			m = dr_check(o, "storage", n->name, false, "not measured: %s", v);
			dr_advice(m, "see staged's log on %s", n->name);
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
				m = dr_check(o, "storage", subj, false, "%s: %s", root, v);
				dr_attr(m, "path", "%s", path);
				dr_advice(m, "make %s writable by staged on %s", path, n->name);
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
			m = dr_check(o, "storage", subj, true, "write %s, read %s%s, %s free%s%s%s",
				  dr_fmt_rate(w, a, sizeof(a)), dr_fmt_rate(r, b, sizeof(b)),
				  direct ? "" : " (cached: no direct I/O)", dr_fmt_bytes(freeb, c, sizeof(c)),
				  shared[0] ? " (" : "", shared, shared[0] ? " too)" : "");
			dr_num(m, "write_mbps", w / 1e6);
			dr_num(m, "read_mbps", r / 1e6);
			dr_flag(m, "direct", direct);
			dr_num(m, "free_bytes", freeb);
			dr_attr(m, "path", "%s", path);
			if (strcmp(root, "ckpt_root") == 0 || (k == 0 && dr_get(&n->disk, "disk.1.same",
									       same, sizeof(same)))) {
				double newest = dr_getf(&n->disk, "newest", 0);
				char step[300] = "";

				dr_get(&n->disk, "newest.step", step, sizeof(step));
				if (newest > 0) {
					snprintf(subj, sizeof(subj), "%s:ckpt_root", n->name);
					m = dr_check(o, "space", subj, freeb >= newest,
						  "%s free, the newest checkpoint (%s) is %s",
						  dr_fmt_bytes(freeb, a, sizeof(a)), step,
						  dr_fmt_bytes(newest, b, sizeof(b)));
					dr_num(m, "free_bytes", freeb);
					dr_num(m, "newest_bytes", newest);
					if (freeb < newest)
						dr_advice(m, "free space on %s's ckpt_root: the next checkpoint "
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
				m = dr_check(o, "source", subj, false, "%s: %s", path, v);
				dr_advice(m, "check the mount of %s on %s", path, n->name);
				continue;
			}
			r = dr_getf_at(&n->disk, "src", (size_t)k, "read", 0);
			meta = dr_getf_at(&n->disk, "src", (size_t)k, "meta", 0);
			if (r <= 0) {
				m = dr_check(o, "source", subj, true, "no file to read; %.0f entries/s", meta);
				dr_num(m, "files_per_s", meta);
				continue;
			}
			/* A shared mount slower than local disk is every cluster
			 * this is for, not a fault: a preflight that failed on it
			 * would fail every job's launch script. It is said, with
			 * what to do, under a line that passes. */
			m = dr_check(o, "source", subj, true, "reads at %s, %.0f entries/s",
				  dr_fmt_rate(r, a, sizeof(a)), meta);
			dr_num(m, "read_mbps", r / 1e6);
			dr_num(m, "files_per_s", meta);
			if (stage_read > 0 && r < stage_read / 2)
				dr_advice(m, "%s is slower than local disk (%s): stage pull the dataset to "
				       "local disk first", path, dr_fmt_rate(stage_read, b, sizeof(b)));
		}
	}
}

int dr_decide(const struct dr_in *in, struct msg **out, size_t *n, unsigned *problems)
{
	struct dr_out o = { 0 };

	msg_init(&o.scratch, MSG_CHECK);

	decide_nodes(in, &o);
	decide_clocks(in, &o);
	dr_decide_bandwidth(in, &o);
	dr_decide_links(in, &o);
	dr_decide_rdma(in, &o);
	dr_decide_ports(in, &o);
	decide_facts(in, &o);
	decide_storage(in, &o);
	dr_matrices(in, &o);
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
