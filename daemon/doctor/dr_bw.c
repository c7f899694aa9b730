/* Bandwidth and latency between two nodes, over the daemon's own transport
 * (the sealed connection replication uses), so that the figure is what a
 * checkpoint would get, sealing included.
 *
 * The sending node dials the receiving one; the receiver's side of each
 * connection is a "sink" that echoes pings and counts MSG_DATA frames
 * until MSG_END, then answers with what arrived and when, on its own
 * monotonic clock. A figure is the bytes that arrived after each stream's
 * first frame over the time from the first frame to the last: the
 * receiver's view, so that what sits in socket buffers when the sender
 * stops does not count as delivered. Several streams share one receiver
 * clock, so their union interval is comparable.
 */
#include "daemon/doctor/dr_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "daemon/net/peer.h"
#include "daemon/peers/peers.h"
#include "daemon/repl/repl.h"

#define STREAMS_MAX 16

static uint8_t payload[DR_FRAME];
static pthread_once_t payload_once = PTHREAD_ONCE_INIT;

static void payload_fill(void)
{
	/* Incompressible, like a checkpoint's mantissas; never all zero, in
	 * case a transport ever learns to skip those. */
	for (size_t i = 0; i < sizeof(payload);) {
		ssize_t n = getrandom(payload + i, sizeof(payload) - i, 0);

		if (n <= 0)
			break;
		i += (size_t)n;
	}
}

struct stream {
	size_t host;
	const char *session;
	uint64_t dur_ms, rate;        /* this stream's share of the cap */
	bool pings;
	/* out */
	int err;
	char why[512];
	uint64_t bytes, first_ns, last_ns;   /* the sink's figures */
	uint64_t rtt_ns[DR_PINGS];
	pthread_t thread;
	bool started;
};

static void ask_init(struct msg *m, const char *kind, const char *session)
{
	msg_init(m, MSG_DOCTOR_ASK);
	msg_put_str(m, K_KIND, kind);
	msg_put_str(m, K_JOB, session);
}

/* Sends m and takes the MSG_DOCTOR_ANS back into *ans. */
static int exchange(struct xport *x, const struct msg *m, struct msg *ans, const char *node,
		    char *why, size_t whylen)
{
	int rc = x->ops->send(x, m);

	if (rc == 0)
		rc = x->ops->recv(x, ans);
	if (rc < 0) {
		snprintf(why, whylen, "%s: %s", node, strerror(-rc));
		return rc;
	}
	if (ans->type == MSG_ERROR) {
		rc = peer_refused(ans, node, why, whylen);
		msg_free(ans);
		return rc;
	}
	if (ans->type != MSG_DOCTOR_ANS) {
		snprintf(why, whylen, "%s: a frame of type %u where an answer belongs", node,
			 ans->type);
		msg_free(ans);
		return -EBADMSG;
	}
	return 0;
}

static void pace(uint64_t start_ns, uint64_t sent, uint64_t rate)
{
	uint64_t due, now;

	if (!rate)
		return;
	due = start_ns + (uint64_t)((double)sent / (double)rate * 1e9);
	now = mono_ns();
	if (due > now) {
		struct timespec ts = { .tv_sec = (time_t)((due - now) / 1000000000u),
				       .tv_nsec = (long)((due - now) % 1000000000u) };

		nanosleep(&ts, NULL);
	}
}

static int run_stream(struct stream *s)
{
	const char *node = peers.hosts.v[s->host].name;
	struct xport *x;
	struct msg m, ans;
	uint64_t start, sent = 0;
	int rc;

	rc = peers_dial(s->host, PEERS_CONNECT_MS, (int)s->dur_ms + 10000, &x, s->why,
		       sizeof(s->why));
	if (rc < 0)
		return rc;
	ask_init(&m, "sink", s->session);
	rc = exchange(x, &m, &ans, node, s->why, sizeof(s->why));
	msg_free(&m);
	if (rc < 0)
		goto out;
	msg_free(&ans);
	for (int i = 0; s->pings && i < DR_PINGS; i++) {
		uint64_t t0 = mono_ns();

		ask_init(&m, "ping", s->session);
		rc = exchange(x, &m, &ans, node, s->why, sizeof(s->why));
		msg_free(&m);
		if (rc < 0)
			goto out;
		msg_free(&ans);
		s->rtt_ns[i] = mono_ns() - t0;
	}
	start = mono_ns();
	while (mono_ns() - start < s->dur_ms * 1000000u) {
		msg_init(&m, MSG_DATA);
		msg_put_u64(&m, K_OFFSET, sent);
		rc = x->ops->send_tail(x, &m, K_DATA, payload, sizeof(payload));
		msg_free(&m);
		if (rc < 0) {
			snprintf(s->why, sizeof(s->why), "%s: %s", node, strerror(-rc));
			goto out;
		}
		sent += sizeof(payload);
		pace(start, sent, s->rate);
	}
	msg_init(&m, MSG_END);
	rc = exchange(x, &m, &ans, node, s->why, sizeof(s->why));
	msg_free(&m);
	if (rc < 0)
		goto out;
	s->bytes = (uint64_t)dr_getf(&ans, "bytes", 0);
	s->first_ns = (uint64_t)dr_getf(&ans, "first_ns", 0);
	s->last_ns = (uint64_t)dr_getf(&ans, "last_ns", 0);
	msg_free(&ans);
out:
	x->ops->close(x);
	return rc;
}

static void *stream_main(void *arg)
{
	struct stream *s = arg;

	pthread_setname_np(pthread_self(), "doctor bw");
	s->err = run_stream(s);
	return NULL;
}

/* Bytes per second of streams as the receiver saw them; 0 if none arrived. */
static double rate_of(const struct stream *s, size_t n)
{
	uint64_t first = UINT64_MAX, last = 0, bytes = 0;

	for (size_t i = 0; i < n; i++) {
		if (s[i].err < 0 || !s[i].bytes)
			continue;
		bytes += s[i].bytes;
		first = s[i].first_ns < first ? s[i].first_ns : first;
		last = s[i].last_ns > last ? s[i].last_ns : last;
	}
	return bytes && last > first ? (double)bytes * 1e9 / (double)(last - first) : 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

int dr_bw(const struct dr_ctx *c, const struct msg *ask, struct msg *ans, char *why,
	  size_t whylen)
{
	struct stream st[STREAMS_MAX];
	uint64_t dur = 1000, streams = 1, rate = 0;
	char *node = NULL, *session = NULL;
	ssize_t h;
	int rc = 0;

	pthread_once(&payload_once, payload_fill);
	msg_get_u64(ask, K_SIZE, &dur);
	msg_get_u64(ask, K_FILES_TOTAL, &streams);
	msg_get_u64(ask, K_BYTES_TOTAL, &rate);
	if (dur < 10 || dur > 60000 || streams < 1 || streams > STREAMS_MAX) {
		snprintf(why, whylen, "a bandwidth question out of bounds (%llu ms, %llu streams)",
			 (unsigned long long)dur, (unsigned long long)streams);
		return -EINVAL;
	}
	/* This node's own config bounds what any asker can make it send. */
	if (dur > (uint64_t)c->cfg->doctor_duration_ms)
		dur = (uint64_t)c->cfg->doctor_duration_ms;
	if (!rate || rate > c->cfg->doctor_rate)
		rate = c->cfg->doctor_rate;
	if (msg_get_str(ask, K_HOLDER, &node) < 0 || msg_get_str(ask, K_JOB, &session) < 0 ||
	    (h = peers.cluster ? hosts_find(&peers.hosts, node) : -1) < 0 ||
	    (size_t)h == peers.self) {
		snprintf(why, whylen, "bandwidth to '%s': not another node of this hosts file",
			 node ? node : "");
		free(node);
		free(session);
		return -EINVAL;
	}
	/* One stream, latency first on the same connection. */
	memset(st, 0, sizeof(st));
	st[0] = (struct stream){ .host = (size_t)h, .session = session, .dur_ms = dur,
				 .rate = rate, .pings = true };
	st[0].err = run_stream(&st[0]);
	if (st[0].err < 0) {
		snprintf(why, whylen, "%s", st[0].why);
		rc = st[0].err;
		goto out;
	}
	qsort(st[0].rtt_ns, DR_PINGS, sizeof(st[0].rtt_ns[0]), cmp_u64);
	msg_put_pairf(ans, "rtt_min_us", "%.1f", (double)st[0].rtt_ns[0] / 1e3);
	msg_put_pairf(ans, "rtt_med_us", "%.1f", (double)st[0].rtt_ns[DR_PINGS / 2] / 1e3);
	msg_put_pairf(ans, "one_Bps", "%.0f", rate_of(&st[0], 1));
	/* Several streams at once, the cap shared between them. */
	memset(st, 0, sizeof(st));
	for (size_t i = 0; i < streams; i++) {
		st[i] = (struct stream){ .host = (size_t)h, .session = session, .dur_ms = dur,
					 .rate = rate / streams };
		st[i].started = pthread_create(&st[i].thread, NULL, stream_main, &st[i]) == 0;
		if (!st[i].started) {
			st[i].err = -EAGAIN;
			snprintf(st[i].why, sizeof(st[i].why), "no thread for a stream");
		}
	}
	for (size_t i = 0; i < streams; i++)
		if (st[i].started)
			pthread_join(st[i].thread, NULL);
	msg_put_pairf(ans, "streams", "%llu", (unsigned long long)streams);
	msg_put_pairf(ans, "multi_Bps", "%.0f", rate_of(st, streams));
	for (size_t i = 0; i < streams; i++)
		if (st[i].err < 0) {
			msg_put_pairf(ans, "multi_err", "%s", st[i].why);
			break;
		}
out:
	free(node);
	free(session);
	return rc;
}

int dr_sink(const struct dr_ctx *c, const struct msg *ask, struct msg *ans, char *why,
	    size_t whylen)
{
	uint64_t bytes = 0, first = 0, last = 0, frames = 0, deadline;
	struct xport *x = c->x;
	struct msg m, reply;
	int rc;

	if (!x) {
		snprintf(why, whylen, "a sink is the far end of a connection");
		return -EINVAL;
	}
	/* The receiver serves requests without a timeout; a sender that stops
	 * without MSG_END must not hold this thread, nor one that never stops. */
	x->ops->set_timeout(x, peers_io_ms());
	deadline = mono_ns() + (2 * (uint64_t)c->cfg->doctor_duration_ms + 20000) * 1000000u;
	/* Ready: the sender may start. */
	msg_init(&reply, MSG_DOCTOR_ANS);
	rc = x->ops->send(x, &reply);
	msg_free(&reply);
	while (rc == 0 && (rc = x->ops->recv(x, &m)) == 0) {
		const uint8_t *p;
		size_t n;

		if (mono_ns() > deadline) {
			snprintf(why, whylen, "a bandwidth test past its time");
			rc = -ETIMEDOUT;
		} else if (m.type == MSG_DATA && msg_get_bytes(&m, K_DATA, &p, &n) == 0) {
			uint64_t now = mono_ns();

			/* The first frame starts the clock; it is not counted. */
			if (frames++ == 0)
				first = now;
			else
				bytes += n;
			last = now;
		} else if (m.type == MSG_DOCTOR_ASK) {
			/* A ping: answered at once, nothing else done. */
			msg_init(&reply, MSG_DOCTOR_ANS);
			rc = x->ops->send(x, &reply);
			msg_free(&reply);
		} else if (m.type == MSG_END) {
			msg_free(&m);
			break;
		} else {
			snprintf(why, whylen, "a frame of type %u in a bandwidth test", m.type);
			rc = -EBADMSG;
		}
		msg_free(&m);
	}
	if (rc < 0) {
		if (!why[0])
			snprintf(why, whylen, "%s", strerror(-rc));
		return rc;
	}
	msg_put_pairf(ans, "bytes", "%llu", (unsigned long long)bytes);
	msg_put_pairf(ans, "first_ns", "%llu", (unsigned long long)first);
	msg_put_pairf(ans, "last_ns", "%llu", (unsigned long long)last);
	return 0;
}
