/* Serving the connections other nodes open: admission, the handshake, and
 * request after request through the table (peers.h says the contract).
 *
 * A connection's life, on its own detached thread (conn_main):
 *
 *   admitted (peers_accept) --key proven--> SERVING --its server returns
 *   -errno, the peer closes, or peers_stop shuts it--> ended
 *
 * Invariants: the counts (handshaking, serving) and the list of serving
 * connections change only under mu, and serving counts every thread
 * started and not yet ended, so peers_stop, having shut every listed
 * connection, waits for serving to reach 0. A state a server keeps on a
 * connection lives in that connection's record, reached through the
 * thread-local `cur`, and is released by its row's end on the same thread.
 */
#include "daemon/peers/peers.h"
#include "daemon/peers/peers_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/codec.h"
#include "common/log.h"
#include "daemon/net/net.h"
#include "daemon/net/peer.h"

#define REQUESTS_MAX 16

/* The table: written before the event loop accepts, read-only afterwards. */
static struct {
	uint16_t type;
	peers_serve_fn *serve;
	void (*end)(void *state);
} requests[REQUESTS_MAX];

struct conn {
	struct xport *x;
	char peer[AUTH_NAME_MAX + 1];  /* its proven name */
	void *state[REQUESTS_MAX];     /* by row of the table; the row's end frees it */
	struct conn *next;             /* in live, under mu */
};

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;             /* serving went down */
	unsigned handshaking;          /* of serving, those not yet authenticated */
	unsigned serving;              /* threads started and not ended */
	bool stopping;
	struct conn *live;             /* authenticated connections */
} adm = { .mu = PTHREAD_MUTEX_INITIALIZER };

static _Thread_local struct conn *cur;

int peers_serve(uint16_t type, peers_serve_fn *serve, void (*end)(void *state))
{
	for (size_t i = 0; i < REQUESTS_MAX; i++)
		if (!requests[i].serve || requests[i].type == type) {
			requests[i].type = type;
			requests[i].serve = serve;
			requests[i].end = end;
			return 0;
		}
	return -ENOSPC;
}

static int row_of(uint16_t type)
{
	for (int i = 0; i < REQUESTS_MAX && requests[i].serve; i++)
		if (requests[i].type == type)
			return i;
	return -1;
}

peers_serve_fn *peers_served(uint16_t type)
{
	int i = row_of(type);

	return i < 0 ? NULL : requests[i].serve;
}

void *peers_conn_state(uint16_t type)
{
	int i = row_of(type);

	return cur && i >= 0 ? cur->state[i] : NULL;
}

int peers_conn_set_state(uint16_t type, void *state)
{
	int i = row_of(type);

	if (!cur || i < 0)
		return -EINVAL;
	cur->state[i] = state;
	return 0;
}

void peers_serve_open(void)
{
	/* Waits on the monotonic clock: a wall clock set back at a stop must
	 * not stretch them. */
	mono_cond_init(&adm.cv);
	adm.stopping = false;
}

static void serve_requests(struct conn *c)
{
	for (;;) {
		peers_serve_fn *serve;
		struct msg m;
		int rc;

		/* Between requests a peer may idle for long: keepalive, not a
		 * timeout, tells a dead one. */
		c->x->ops->set_timeout(c->x, 0);
		rc = c->x->ops->recv(c->x, &m);
		if (rc == -EBADMSG)     /* news; a close or a stop between requests is not */
			log_warn("peer %s (%s): a frame failed its seal or is malformed (altered "
				 "on the way?); closing", c->peer, c->x->peer);
		if (rc < 0)
			return;
		serve = peers_served(m.type);
		if (!serve) {
			log_warn("peer %s: frame type %u where a request is due (no request of "
				 "this node's has that type); closing", c->peer, (unsigned)m.type);
			peer_send_error(c->x, EPROTO, "frame type %u where a request is due",
					(unsigned)m.type);
			msg_free(&m);
			return;
		}
		rc = serve(c->x, c->peer, &m);
		msg_free(&m);
		if (rc < 0)
			return;
	}
}

static void list_add(struct conn *c)
{
	pthread_mutex_lock(&adm.mu);
	c->next = adm.live;
	adm.live = c;
	if (adm.stopping)
		c->x->ops->shutdown(c->x);
	pthread_mutex_unlock(&adm.mu);
}

static void list_remove(struct conn *c)
{
	pthread_mutex_lock(&adm.mu);
	for (struct conn **pp = &adm.live; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	pthread_mutex_unlock(&adm.mu);
}

static void *conn_main(void *arg)
{
	struct conn *c = arg;
	char why[512];
	int rc;

	pthread_setname_np(pthread_self(), "peer serve");

	rc = peer_handshake(&c->x, &peers.key, peer_wire_of(peers.cfg->wire), peers.cfg->name, &peers.hosts, NULL,
			    PEERS_HANDSHAKE_MS, c->peer, sizeof(c->peer), why, sizeof(why));
	pthread_mutex_lock(&adm.mu);
	adm.handshaking--;
	pthread_mutex_unlock(&adm.mu);
	if (rc < 0) {
		log_warn("peer %s refused: %s", c->x->peer, why);
	} else {
		list_add(c);
		log_info("peer %s (%s): connected", c->peer, c->x->peer);
		cur = c;
		serve_requests(c);
		for (int i = 0; i < REQUESTS_MAX; i++)
			if (c->state[i] && requests[i].end)
				requests[i].end(c->state[i]);
		cur = NULL;
		list_remove(c);
	}
	c->x->ops->close(c->x);
	free(c);
	codec_thread_end();
	pthread_mutex_lock(&adm.mu);
	adm.serving--;
	pthread_cond_broadcast(&adm.cv);
	pthread_mutex_unlock(&adm.mu);
	return NULL;
}

/* Connections that have not proven the key cost a thread and buffers for up
 * to PEERS_HANDSHAKE_MS each: without a cap, anyone who can reach the port
 * could make the daemon allocate without end. Proven peers are few (a
 * sender's streams, up to [transfer] streams or streams_max, kept open
 * between copies, and a
 * question or restore now and then, per node). */
static bool admit(const struct xport *x)
{
	static uint64_t said_ns;
	unsigned most = (3 + config_streams_most(peers.cfg)) * (unsigned)peers.hosts.n + 16;
	const char *why = NULL;
	bool ok;

	pthread_mutex_lock(&adm.mu);
	ok = adm.handshaking < PEERS_MAX_HANDSHAKING && adm.serving < most && !adm.stopping;
	if (ok) {
		adm.handshaking++;
		adm.serving++;
	} else if (!adm.stopping && mono_ns() - said_ns > 1000000000ull) {
		said_ns = mono_ns();
		why = adm.serving >= most ? "too many peer connections" :
		      "too many connections still proving the cluster key";
	}
	pthread_mutex_unlock(&adm.mu);
	if (why)
		log_warn("refusing a peer connection from %s: %s", x->peer, why);
	return ok;
}

static int spawn(struct xport *x)
{
	struct conn *c;
	pthread_attr_t attr;
	pthread_t t;
	int rc;

	if (!admit(x)) {
		x->ops->close(x);
		return -EBUSY;
	}
	rc = -ENOMEM;
	c = calloc(1, sizeof(*c));
	if (c) {
		c->x = x;
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		rc = -pthread_create(&t, &attr, conn_main, c);
		pthread_attr_destroy(&attr);
		if (rc == 0)
			return 0;
		free(c);
	}
	pthread_mutex_lock(&adm.mu);
	adm.handshaking--;
	adm.serving--;
	pthread_cond_broadcast(&adm.cv);
	pthread_mutex_unlock(&adm.mu);
	x->ops->close(x);
	log_warn("cannot serve a peer: %s", strerror(-rc));
	return rc;
}

unsigned peers_serving(void)
{
	unsigned n;

	pthread_mutex_lock(&adm.mu);
	n = adm.serving;
	pthread_mutex_unlock(&adm.mu);
	return n;
}

void peers_accept(void)
{
	net_accept(spawn);
}

void peers_serve_stop(void)
{
	pthread_mutex_lock(&adm.mu);
	adm.stopping = true;
	while (adm.serving) {
		struct timespec ts = mono_timespec(mono_ns() + 1000000000ull);

		/* Idle connections too: a connection waits for requests
		 * forever. A thread still in its handshake times out within
		 * PEERS_HANDSHAKE_MS. */
		for (struct conn *c = adm.live; c; c = c->next)
			c->x->ops->shutdown(c->x);
		pthread_cond_timedwait(&adm.cv, &adm.mu, &ts);
	}
	pthread_mutex_unlock(&adm.mu);
}
