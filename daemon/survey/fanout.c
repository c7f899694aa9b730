/* Asking many nodes one question, directly or through relays (fanout.h).
 *
 * An answer a[i] is pending (!settled), then settled: answered (err 0, m
 * its frame) or failed (err < 0, why). Only the thread working on
 * a[i]'s group writes it; the caller reads it after fanout_wait.
 *
 * A group is a list of pending answers. Alone, its node is asked directly;
 * otherwise its first node is asked to relay for the group. A relay that
 * fails (not dialled, refuses, breaks off, ends without answering for
 * everyone) is itself failed unless its own answer came, and whatever of
 * its group is still pending is asked again with the next of them relaying.
 * Each round settles at least the relay, so a group of k ends within k
 * rounds, or at the deadline, after which nobody is dialled.
 *
 * Timeouts: the asker gives a relay its own time left less a margin, so the
 * relay's answers, its failures named, arrive before the asker gives up on
 * it; each level of the tree costs one margin.
 */
#include "daemon/survey/fanout.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/hosts.h"
#include "common/log.h"
#include "daemon/net/peer.h"
#include "daemon/net/xport_capture.h"
#include "daemon/peers/peers.h"

#define RELAY_TIMEOUT_MAX_MS (24ll * 3600 * 1000)
#define RELAY_SEND_MS 30000          /* an asker that takes no answers for this long is gone */

/* The questions a relay passes on: each answered with one frame. A relay
 * answers for itself in place, through a capture connection on the thread
 * of the real one, so a request type that keeps state on its connection
 * (peers_conn_state) would find the real connection's: none may be here. */
static const uint16_t relayable[] = { MSG_HOLD_REQ };

struct fanout {
	const struct msg *q;       /* the question, borrowed */
	struct fan_answer *a;      /* borrowed */
	size_t *order;             /* indices into a, grouped: group g is
				    * order[bound[g] .. bound[g + 1]) */
	size_t *bound;
	size_t ngroups;
	atomic_size_t next;        /* the next group a worker takes */
	int64_t deadline;          /* mono_ms */
	pthread_t *threads;
	size_t nthreads;
};

static const char *name_of(size_t host)
{
	return peers.hosts.v[host].name;
}

/* What a relay may spend of the time left: the rest is for its answers to
 * come back. */
static int64_t relay_budget(int64_t left)
{
	int64_t margin = left / 10;

	if (margin < 200)
		margin = 200;
	if (margin > 2000)
		margin = 2000;
	return left - margin;
}

static void io_why(struct fan_answer *a, int rc, int64_t waited_ms)
{
	const char *n = name_of(a->host);

	if (rc == -ENOTCONN)
		snprintf(a->why, sizeof(a->why), "%s: closed the connection (an older version?)", n);
	else if (rc == -ETIMEDOUT)
		snprintf(a->why, sizeof(a->why), "%s: no answer within %lld ms", n,
			 (long long)waited_ms);
	else
		snprintf(a->why, sizeof(a->why), "%s: %s", n, strerror(-rc));
}

static int dial(struct fanout *f, struct fan_answer *a, struct xport **x)
{
	int64_t left = f->deadline - mono_ms();

	if (left <= 0) {
		snprintf(a->why, sizeof(a->why), "%s: not asked: no time was left", name_of(a->host));
		return -ETIMEDOUT;
	}
	return peers_dial(a->host, left < PEERS_CONNECT_MS ? (int)left : PEERS_CONNECT_MS, (int)left,
			 x, a->why, sizeof(a->why));
}

static void ask_one(struct fanout *f, struct fan_answer *a)
{
	int64_t t0 = mono_ms();
	struct xport *x;
	int rc = dial(f, a, &x);

	if (rc == 0) {
		rc = x->ops->send(x, f->q);
		if (rc == 0)
			rc = x->ops->recv(x, &a->m);
		if (rc < 0)
			io_why(a, rc, mono_ms() - t0);
		x->ops->close(x);
	}
	a->err = rc;
	a->settled = true;
}

/* One MSG_RELAY_ANS from the relay of group g[0..k): settles one pending
 * answer of the group. 0, or -EBADMSG. */
static int take_relayed(struct fanout *f, const size_t *g, size_t k, const struct msg *m)
{
	const char *relay = name_of(f->a[g[0]].host);
	const uint8_t *p, *name;
	uint64_t err, type;
	size_t n, nname;
	struct fan_answer *a = NULL;

	if (msg_get_bytes(m, K_NAME, &name, &nname) < 0 || msg_get_u64(m, K_ERRNO, &err) < 0)
		return -EBADMSG;
	for (size_t i = 0; i < k && !a; i++) {
		const char *s = name_of(f->a[g[i]].host);

		if (strlen(s) == nname && memcmp(s, name, nname) == 0)
			a = &f->a[g[i]];
	}
	if (!a || a->settled)
		return -EBADMSG;        /* not of its group, or twice */
	if (err == 0) {
		if (msg_get_u64(m, K_TYPE, &type) < 0 || type > UINT16_MAX ||
		    msg_get_bytes(m, K_DATA, &p, &n) < 0 || proto_check_payload(p, n) < 0)
			return -EBADMSG;
		msg_init(&a->m, (uint16_t)type);
		if (n) {
			a->m.buf = malloc(n);
			if (!a->m.buf) {
				a->err = -ENOMEM;
				a->settled = true;
				snprintf(a->why, sizeof(a->why), "%s: no memory for its answer",
					 name_of(a->host));
				return 0;
			}
			memcpy(a->m.buf, p, n);
			a->m.len = a->m.cap = n;
		}
		a->err = 0;
		a->settled = true;
		return 0;
	}
	char text[sizeof(a->why) - 64] = "no reason given";

	if (msg_get_bytes(m, K_TEXT, &p, &n) == 0)
		peer_safe_text(text, sizeof(text), p, n);
	a->err = err < 4096 ? -(int)err : -EPROTO;
	a->settled = true;
	snprintf(a->why, sizeof(a->why), "%s (asked through %s)", text, relay);
	return 0;
}

/* Group g[0..k), k >= 2, through g[0]. Settles g[0] at least. */
static void relay(struct fanout *f, const size_t *g, size_t k)
{
	struct fan_answer *lead = &f->a[g[0]];
	int64_t t0 = mono_ms(), left;
	struct xport *x;
	struct msg m;
	int rc = dial(f, lead, &x);

	if (rc < 0) {
		lead->err = rc;
		lead->settled = true;
		return;
	}
	left = f->deadline - mono_ms();
	msg_init(&m, MSG_RELAY);
	msg_put_u64(&m, K_TIMEOUT_MS, (uint64_t)(relay_budget(left) > 0 ? relay_budget(left) : 1));
	for (size_t i = 1; i < k; i++)
		msg_put_str(&m, K_NAME, name_of(f->a[g[i]].host));
	msg_put_u64(&m, K_TYPE, f->q->type);
	msg_put_bytes(&m, K_DATA, f->q->buf, f->q->len);
	rc = x->ops->send(x, &m);
	msg_free(&m);
	while (rc == 0) {
		rc = x->ops->recv(x, &m);
		if (rc < 0)
			break;
		if (m.type == MSG_END) {
			msg_free(&m);
			break;
		}
		if (m.type == MSG_ERROR) {
			rc = peer_refused(&m, name_of(lead->host), lead->why, sizeof(lead->why));
			msg_free(&m);
			if (!lead->settled) {
				lead->err = rc < 0 ? rc : -EPROTO;
				lead->settled = true;
			}
			break;
		}
		if (m.type != MSG_RELAY_ANS || take_relayed(f, g, k, &m) < 0) {
			snprintf(lead->why, sizeof(lead->why), "%s: a malformed answer as a relay (%s)",
				 name_of(lead->host), m.type != MSG_RELAY_ANS ?
				 "a frame of another type" :
				 "no name, no errno, a node not of its group or named twice, or a "
				 "malformed frame inside");
			rc = -EBADMSG;
			log_warn("relay refused: %s", lead->why);
		}
		msg_free(&m);
	}
	x->ops->close(x);
	if (lead->settled)
		return;
	if (rc == 0) {
		rc = -EPROTO;
		snprintf(lead->why, sizeof(lead->why), "%s: relayed without answering for itself",
			 name_of(lead->host));
	} else if (rc != -EBADMSG) {
		io_why(lead, rc, mono_ms() - t0);
	}
	msg_free(&lead->m);
	lead->err = rc;
	lead->settled = true;
}

static void ask_group(struct fanout *f, size_t *g, size_t k)
{
	while (k > 1) {
		size_t j = 0, mid, t;

		relay(f, g, k);
		for (size_t i = 0; i < k; i++)
			if (!f->a[g[i]].settled)
				g[j++] = g[i];
		k = j;
		/* The next relay from the middle of what is left: a group is
		 * neighbours, often a rack, and the relay just lost may have
		 * gone with the nodes next to it. */
		mid = k / 2;
		t = g[0];
		g[0] = g[mid];
		g[mid] = t;
	}
	if (k == 1)
		ask_one(f, &f->a[g[0]]);
}

static void *worker(void *arg)
{
	struct fanout *f = arg;
	size_t gi;

	pthread_setname_np(pthread_self(), "survey");

	while ((gi = atomic_fetch_add(&f->next, 1)) < f->ngroups)
		ask_group(f, &f->order[f->bound[gi]], f->bound[gi + 1] - f->bound[gi]);
	return NULL;
}

int fanout_start(struct fanout **out, const struct msg *q, struct fan_answer *a, size_t n,
		 int timeout_ms)
{
	size_t width = peers.cfg && peers.cfg->fanout > 1 ? (size_t)peers.cfg->fanout : 32;
	struct fanout *f = calloc(1, sizeof(*f));
	int rc;

	if (!f)
		return -ENOMEM;
	f->q = q;
	f->a = a;
	f->deadline = mono_ms() + timeout_ms;
	f->ngroups = n < width ? n : width;
	f->order = calloc(n + 1, sizeof(*f->order));
	f->bound = calloc(f->ngroups + 1, sizeof(*f->bound));
	f->threads = calloc(f->ngroups + 1, sizeof(*f->threads));
	rc = -ENOMEM;
	if (!f->order || !f->bound || !f->threads)
		goto out_free;
	for (size_t i = 0; i < n; i++) {
		f->order[i] = i;
		a[i].err = 0;
		a[i].settled = false;
		a[i].why[0] = '\0';
		msg_init(&a[i].m, 0);
	}
	/* Neighbours in hosts-file order share a group: racks are written
	 * together, so a relay's asks stay near it. */
	for (size_t g = 0; g <= f->ngroups; g++)
		f->bound[g] = f->ngroups ? n * g / f->ngroups : 0;
	atomic_init(&f->next, 0);
	for (size_t t = 0; t < f->ngroups; t++) {
		if (pthread_create(&f->threads[t], NULL, worker, f) != 0)
			break;
		f->nthreads++;
	}
	if (f->nthreads == 0 && f->ngroups) {
		rc = -EAGAIN;
		goto out_free;
	}
	*out = f;
	return 0;
out_free:
	free(f->threads);
	free(f->bound);
	free(f->order);
	free(f);
	return rc;
}

void fanout_wait(struct fanout *f)
{
	for (size_t t = 0; t < f->nthreads; t++)
		pthread_join(f->threads[t], NULL);
	free(f->threads);
	free(f->bound);
	free(f->order);
	free(f);
}

/* ------------------------------------------------------------- the relay */

/* One answer to the asker: the node's frame, or why it has none. A frame
 * too large to carry inside another is said as such. */
static int send_answer(struct xport *x, const char *node, int err, const char *why,
		       const struct msg *frame)
{
	struct msg m;
	int rc;

	msg_init(&m, MSG_RELAY_ANS);
	msg_put_str(&m, K_NAME, node);
	msg_put_u64(&m, K_ERRNO, (uint64_t)-err);
	if (err == 0) {
		msg_put_u64(&m, K_TYPE, frame->type);
		msg_put_bytes(&m, K_DATA, frame->buf, frame->len);
	} else {
		msg_put_str(&m, K_TEXT, why);
	}
	rc = x->ops->send(x, &m);
	msg_free(&m);
	if (rc == -E2BIG && err == 0) {
		char w[160];

		snprintf(w, sizeof(w), "%s: its answer (%zu bytes) is too large to relay", node,
			 frame->len);
		return send_answer(x, node, -E2BIG, w, NULL);
	}
	return rc;
}

/* This node's own answer, by the function that answers it over the
 * network, through a connection that keeps what it is sent. */
static int answer_here(struct xport *x, const char *peer, const struct msg *q)
{
	peers_serve_fn *serve = peers_served(q->type);
	const char *me = peers.cfg->name;
	struct xport *cx;
	struct msg a;
	int rc;

	if (!serve)
		return send_answer(x, me, -EPROTONOSUPPORT, "no server for the question", NULL);
	rc = xport_capture_open(&cx, x->peer);
	if (rc < 0)
		return send_answer(x, me, rc, strerror(-rc), NULL);
	(void)serve(cx, peer, q);
	if (xport_capture_take(cx, &a) == 0) {
		rc = send_answer(x, me, 0, NULL, &a);
		msg_free(&a);
	} else {
		char w[128];

		snprintf(w, sizeof(w), "%s: answered nothing", me);
		rc = send_answer(x, me, -EPROTO, w, NULL);
	}
	cx->ops->close(cx);
	return rc;
}

/* The nodes named in a MSG_RELAY, checked: each in the hosts file, not
 * this node, none twice. 0 and a[0..*n) with their hosts, or -EINVAL with
 * why. */
static int relay_nodes(const struct msg *req, struct fan_answer **out, size_t *n, char *why,
		       size_t whylen)
{
	size_t off = 0, len, count = 0;
	const uint8_t *p;
	uint16_t key;
	bool *seen = calloc(peers.hosts.n + 1, sizeof(*seen));
	struct fan_answer *a;

	*out = NULL;
	*n = 0;
	if (!seen)
		return -ENOMEM;
	while (msg_next_field(req, &off, &key, &p, &len) == 1)
		count += key == K_NAME;
	if (count >= peers.hosts.n) {
		/* each node once, the relay not among them */
		snprintf(why, whylen, "%zu nodes named, the hosts file has %zu", count,
			 peers.hosts.n);
		free(seen);
		return -EINVAL;
	}
	a = calloc(count + 1, sizeof(*a));
	if (!a) {
		free(seen);
		return -ENOMEM;
	}
	off = 0;
	while (msg_next_field(req, &off, &key, &p, &len) == 1) {
		char name[AUTH_NAME_MAX + 1];
		ssize_t h;

		if (key != K_NAME)
			continue;
		if (len > AUTH_NAME_MAX) {
			snprintf(why, whylen, "a node name of %zu bytes", len);
			goto bad;
		}
		peer_safe_text(name, sizeof(name), p, len);
		h = hosts_find(&peers.hosts, name);
		if (h < 0 || (size_t)h == peers.self || seen[h]) {
			snprintf(why, whylen, "node '%.64s' %s", name, h < 0 ?
				 "is not in the hosts file" : (size_t)h == peers.self ?
				 "is the relay itself" : "is named twice");
			goto bad;
		}
		seen[h] = true;
		a[(*n)++].host = (size_t)h;
	}
	free(seen);
	*out = a;
	return 0;
bad:
	free(seen);
	free(a);
	*n = 0;
	return -EINVAL;
}

int fanout_serve(struct xport *x, const char *peer, const struct msg *req)
{
	struct fan_answer *a = NULL;
	struct fanout *f = NULL;
	uint64_t timeout_ms, type;
	const uint8_t *p;
	struct msg q;
	size_t n = 0, plen;
	bool ok_type = false;
	char why[160];
	int rc;

	if (msg_get_u64(req, K_TIMEOUT_MS, &timeout_ms) < 0 || timeout_ms == 0 ||
	    msg_get_u64(req, K_TYPE, &type) < 0 || msg_get_bytes(req, K_DATA, &p, &plen) < 0 ||
	    proto_check_payload(p, plen) < 0) {
		log_warn("relay from %s refused: a malformed request", peer);
		peer_send_error(x, EBADMSG, "%s: a malformed relay request", peers.cfg->name);
		return -EBADMSG;
	}
	for (size_t i = 0; i < sizeof(relayable) / sizeof(relayable[0]); i++)
		ok_type |= relayable[i] == type;
	if (!ok_type) {
		log_warn("relay from %s refused: frame type %llu is not relayed", peer,
			 (unsigned long long)type);
		peer_send_error(x, EPROTONOSUPPORT, "%s: frame type %llu is not relayed",
				peers.cfg->name, (unsigned long long)type);
		return -EPROTONOSUPPORT;
	}
	rc = relay_nodes(req, &a, &n, why, sizeof(why));
	if (rc < 0) {
		log_warn("relay from %s refused: %s", peer, rc == -EINVAL ? why : strerror(-rc));
		peer_send_error(x, -rc, "%s: relay refused: %s", peers.cfg->name,
				rc == -EINVAL ? why : strerror(-rc));
		return rc;
	}
	if (timeout_ms > RELAY_TIMEOUT_MAX_MS)
		timeout_ms = RELAY_TIMEOUT_MAX_MS;
	msg_init(&q, (uint16_t)type);
	q.buf = (uint8_t *)p;           /* read only, for as long as req lives */
	q.len = q.cap = plen;
	log_info("%s asks this node to relay a question to %zu node%s", peer, n,
		 n == 1 ? "" : "s");
	if (n && fanout_start(&f, &q, a, n, (int)timeout_ms) < 0) {
		for (size_t i = 0; i < n; i++) {
			a[i].err = -EAGAIN;
			msg_init(&a[i].m, 0);
			snprintf(a[i].why, sizeof(a[i].why), "%s: no thread to ask it",
				 name_of(a[i].host));
		}
	}
	x->ops->set_timeout(x, RELAY_SEND_MS);
	rc = answer_here(x, peer, &q);
	if (f)
		fanout_wait(f);
	for (size_t i = 0; i < n; i++) {
		if (rc == 0)
			rc = send_answer(x, name_of(a[i].host), a[i].err, a[i].why, &a[i].m);
		msg_free(&a[i].m);
	}
	free(a);
	if (rc == 0) {
		msg_init(&q, MSG_END);
		rc = x->ops->send(x, &q);
	}
	return rc;
}
