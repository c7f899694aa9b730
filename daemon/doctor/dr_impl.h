/* Inside stage doctor: what the coordinator (dr_run.c), the answering side
 * (dr_serve.c) and the measurements (dr_bw.c, dr_ports.c) share.
 *
 * Every question is a MSG_DOCTOR_ASK of one kind; every answer a
 * MSG_DOCTOR_ANS of K_NAME/K_VALUE pairs (msg_put_pairf/dr_get), so that a new
 * measurement is a new name, not a new frame. The asking node answers its
 * own questions in place through the same dr_answer.
 */
#ifndef STAGE_DR_IMPL_H
#define STAGE_DR_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/config.h"
#include "common/proto.h"
#include "common/xport.h"

#define DR_SESSION_LEN 16          /* hex digits of a session id */
#define DR_LEASE_MS 30000          /* a session silent this long has ended */
#define DR_DIAL_ROUND_MS 5000      /* a round of "dial" questions: what a listen's lease
				    * adds per round (nodes / fanout of them) */
#define DR_LISTEN_MAX_MS 600000    /* the longest a node holds the job's ports */
#define DR_FRAME (256u << 10)      /* bytes of one bandwidth frame */
#define DR_PINGS 8                 /* round trips per latency figure */
#define DR_TIME_ROUNDS 8           /* NTP-style exchanges per clock offset */
#define DR_NODES_MAX 64            /* nodes named in one question */

struct dr_ctx {
	const struct stage_config *cfg;
	const char *asker;             /* the node that asked (this one, in place) */
	struct xport *x;               /* its connection; NULL when answering in place */
};

/* Answers one question (its K_KIND) into ans, which the caller has
 * msg_init'ed as MSG_DOCTOR_ANS. 0, or -errno with why. */
int dr_answer(const struct dr_ctx *c, const struct msg *ask, struct msg *ans, char *why,
	      size_t whylen);

/* The value of the first pair called name, copied into out: true, or false
 * when there is none. */
bool dr_get(const struct msg *m, const char *name, char *out, size_t cap);
/* The same as a number; dflt when absent or not a number. */
double dr_getf(const struct msg *m, const char *name, double dflt);
/* The same for "GROUP.I.FIELD" names (disk.0.write, src.1.read): one
 * figure of the I-th root or item of an answer. */
void dr_put_at(struct msg *m, const char *group, size_t i, const char *field, const char *fmt,
	       ...) __attribute__((format(printf, 5, 6)));
bool dr_get_at(const struct msg *m, const char *group, size_t i, const char *field, char *out,
	       size_t cap);
double dr_getf_at(const struct msg *m, const char *group, size_t i, const char *field,
		  double dflt);
/* The nodes a question names (K_HOLDER), each once, at most cap: the name
 * and its index in this node's hosts file (-1: not in it). Their count. */
struct dr_holder {
	char name[256];
	ssize_t host;
};
size_t dr_holders(const struct msg *ask, struct dr_holder *out, size_t cap);

/* The session lock: one doctor at a time on a node. Take refreshes the
 * lease of the session holding it, or takes it when free or expired, for
 * DR_LEASE_MS past the next busy_ms (a question that runs that long):
 * 0, or -EBUSY with why naming the node that holds it. */
int dr_session_take(const char *session, const char *asker, int64_t busy_ms, char *why,
		    size_t whylen);
/* Ends the session if it holds the lock, closing what it left open. */
void dr_session_end(const char *session);

/* dr_ports.c: "listen" (K_PORTS) opens the ports until "release" or the
 * lease runs out; "dial" (K_HOLDER per node, K_PORTS, K_SIZE timeout ms)
 * connects to each node's ports at once. */
int dr_listen(const struct msg *ask, struct msg *ans, char *why, size_t whylen);
void dr_release(void);
int dr_dial(const struct msg *ask, struct msg *ans, char *why, size_t whylen);

/* dr_bw.c: "bw" (K_HOLDER the receiving node, K_SIZE ms per figure,
 * K_FILES_TOTAL streams, K_BYTES_TOTAL bytes/s cap): latency, then one
 * stream, then several, to that node; "sink" is the receiving end of one
 * connection of it (c->x). */
int dr_bw(const struct dr_ctx *c, const struct msg *ask, struct msg *ans, char *why,
	  size_t whylen);
int dr_sink(const struct dr_ctx *c, const struct msg *ask, struct msg *ans, char *why,
	    size_t whylen);

/* dr_facts.c: inserts name into v (n names of width w, sorted bytewise),
 * keeping at most keep of the smallest; whether a name is "." or "..". */
void dr_keep_sorted(char *v, size_t w, size_t keep, size_t *n, const char *name);
bool dr_dot_or_dotdot(const char *s);

/* ------------------------------------------------------------ the coordinator's findings */

/* What the asking node learned of one node (dr_run.c), and what
 * dr_decide.c judges. The msgs are the nodes' answers (type 0: none). */
struct dr_node {
	const char *name;
	size_t host;                   /* index in the hosts file */
	bool self;
	bool up;                       /* it answered the first question */
	char why[512];                 /* !up: why not */
	struct msg facts, disk, listen, dial;
	bool has_clock;
	double offset_ms, delay_ms;    /* its clock minus the asker's; the round trip */
	char clock_why[256];           /* !has_clock: why the exchanges failed */
	/* The first node of the run at the same address (its own index when
	 * none): nodes on one machine share its ports, so only that one opens
	 * them (test clusters on loopback; never two nodes on a real host). */
	size_t twin;
};

struct dr_pair {
	size_t a, b;                   /* a sends to b: indices into the nodes */
	size_t round;                  /* when it is measured (dr_run.c) */
	bool measured;
	int err;
	char why[512];
	struct msg ans;                /* a's answer to "bw" */
};

struct dr_in {
	struct dr_node *nodes;
	size_t nnodes;
	struct dr_pair *pairs;
	size_t npairs;
	bool sampled;                  /* pairs_max passed: a ring and a sample */
	size_t pairs_max;              /* [doctor] pairs_max */
	const uint16_t *ports;         /* dialled, in order */
	size_t nports;
	size_t nrequired;              /* of which the job's own (the rest sampled) */
	int clock_bound_ms;
	unsigned streams;
};

/* The checks and matrices, as the frames the client gets (MSG_CHECK,
 * MSG_MATRIX), in order; *problems counts the checks that failed.
 * 0 or -ENOMEM. (dr_decide.c) */
int dr_decide(const struct dr_in *in, struct msg **out, size_t *n, unsigned *problems);
/* The nodes node i looks at (routes, ports) in *out: every other node up
 * to pairs_max nodes; beyond, its ring neighbours and the nodes 2, 4, 8...
 * places on, at most pairs_max, so the work per node stays bounded and
 * every node is still looked at from near and far. Their count. */
size_t dr_peers(size_t i, size_t n, size_t pairs_max, size_t *out);
void dr_frames_free(struct msg *v, size_t n);

/* The decisions' output (dr_judge.c): the frames made, problems counted. */
struct dr_out {
	struct msg *v;
	size_t n, cap;
	unsigned problems;
	int err;
	struct msg scratch;        /* where the puts go when memory ran out */
};
/* A new frame of type (NULL when out of memory: o->err set). */
struct msg *dr_frame(struct dr_out *o, uint16_t type);
/* A check line: what, about what, ok or a problem, its figure. */
struct msg *dr_check(struct dr_out *o, const char *what, const char *subject, bool ok,
		     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* A problem's one line of advice. */
void dr_advice(struct msg *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Figures for --json: a number, a flag, a text attribute. */
void dr_num(struct msg *m, const char *name, double v);
void dr_flag(struct msg *m, const char *name, bool v);
void dr_attr(struct msg *m, const char *name, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* A rate (bytes/s) and a size as text, in buf. */
const char *dr_fmt_rate(double Bps, char *buf, size_t len);
const char *dr_fmt_bytes(double b, char *buf, size_t len);
/* Nodes that answered. */
size_t dr_nodes_up(const struct dr_in *in);
/* The median of v[0..n) (sorted in place); 0 when n is 0. */
double dr_median(double *v, size_t n);
/* dr_decide_net.c: the network's checks, and the matrices. */
void dr_decide_bandwidth(const struct dr_in *in, struct dr_out *o);
void dr_decide_links(const struct dr_in *in, struct dr_out *o);
void dr_decide_rdma(const struct dr_in *in, struct dr_out *o);
void dr_decide_ports(const struct dr_in *in, struct dr_out *o);
void dr_matrices(const struct dr_in *in, struct dr_out *o);

#endif
