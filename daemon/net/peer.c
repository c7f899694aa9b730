/* The peer handshake: common/auth.h's messages in frames over a transport. */
#include "daemon/net/peer.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/proto.h"
#include "common/version.h"
#include "daemon/net/xport_seal.h"

int peer_error_of(const struct msg *m, char text[PEER_TEXT_MAX + 1])
{
	const uint8_t *p;
	uint64_t e;
	size_t n;
	int err = EPROTO;

	snprintf(text, PEER_TEXT_MAX + 1, "no reason given");
	if (msg_get_u64(m, K_ERRNO, &e) == 0 && e > 0 && e < 4096)
		err = (int)e;
	if (msg_get_bytes(m, K_TEXT, &p, &n) == 0 && n > 0)
		peer_safe_text(text, PEER_TEXT_MAX + 1, p, n);
	return -err;
}

void peer_safe_text(char *out, size_t cap, const uint8_t *p, size_t n)
{
	if (n >= cap)
		n = cap - 1;
	for (size_t i = 0; i < n; i++)
		out[i] = p[i] < 0x20 || p[i] == 0x7f ? '?' : (char)p[i];
	out[n] = '\0';
}

struct hs {
	struct xport *x;
	struct auth_session *s;
	bool initiator;
	const char *who;        /* "peer ADDR" or "peer NAME (ADDR)" */
	int timeout_ms;
	char *why;
	size_t whylen;
};

static const char *type_name(uint16_t type)
{
	return type == MSG_PEER_HELLO ? "HELLO" : "PROOF";
}

static int io_error(struct hs *h, int rc)
{
	switch (rc) {
	case -ETIMEDOUT:
		snprintf(h->why, h->whylen, "%s: no answer within %d ms during the handshake",
			 h->who, h->timeout_ms);
		break;
	case -ENOTCONN:
	case -ECONNRESET:
	case -EPIPE:
		snprintf(h->why, h->whylen, "%s closed the connection during the handshake", h->who);
		break;
	case -EBADMSG:
		snprintf(h->why, h->whylen, "%s sent a malformed frame during the handshake", h->who);
		break;
	default:
		snprintf(h->why, h->whylen, "%s: handshake: %s", h->who, strerror(-rc));
	}
	return rc;
}

static int send_auth(struct hs *h, uint16_t type)
{
	uint8_t buf[AUTH_MSG_MAX];
	struct msg m;
	size_t n;
	int rc;

	if (type == MSG_PEER_HELLO)
		rc = auth_hello(h->s, buf, sizeof(buf), &n);
	else
		rc = auth_proof(h->s, buf, sizeof(buf), &n);
	if (rc) {
		snprintf(h->why, h->whylen, "%s: cannot make our %s: %s", h->who, type_name(type),
			 strerror(-rc));
		return rc;
	}
	msg_init(&m, type);
	msg_put_bytes(&m, K_AUTH, buf, n);
	rc = h->x->ops->send(h->x, &m);
	msg_free(&m);
	return rc ? io_error(h, rc) : 0;
}

/* The peer's MSG_ERROR as its -errno, with its text in why. */
static int refused(struct hs *h, const struct msg *m)
{
	char text[PEER_TEXT_MAX + 1];
	int err = peer_error_of(m, text);

	snprintf(h->why, h->whylen, "%s refused us: %s", h->who, text);
	return err;
}

/* auth_on_hello / auth_on_proof refused what the peer sent. */
static int auth_refused(struct hs *h, uint16_t type, int rc)
{
	if (rc == -EPROTONOSUPPORT) {
		if (!h->initiator)
			peer_send_error(h->x, EPROTONOSUPPORT, "this node speaks the peer protocol of "
					"stage %s: run the same version of stage on every node",
					STAGE_VERSION);
		snprintf(h->why, h->whylen, "%s speaks another version of the peer protocol than "
			 "this node (stage %s): run the same version of stage on every node", h->who,
			 STAGE_VERSION);
		return rc;
	}
	if (rc != -EACCES) {
		snprintf(h->why, h->whylen, "%s sent a %s this staged cannot read (%s): staged of "
			 "another version, or not staged at that address", h->who, type_name(type),
			 strerror(-rc));
		return rc;
	}
	if (type == MSG_PEER_HELLO) {
		/* Only our own HELLO sent back is refused here. */
		if (!h->initiator)
			peer_send_error(h->x, EACCES, "authentication failed: reflected HELLO");
		snprintf(h->why, h->whylen, "%s sent our own HELLO back (a reflection attempt?)",
			 h->who);
	} else if (!h->initiator) {
		peer_send_error(h->x, EACCES, "authentication failed: the two nodes hold different "
				"cluster keys; copy the same key_file to every node and restart staged");
		snprintf(h->why, h->whylen, "%s: authentication failed: it holds another cluster key "
			 "than this node; copy the same key_file to every node", h->who);
	} else {
		snprintf(h->why, h->whylen, "%s: its proof does not verify: it holds another cluster "
			 "key than this node; copy the same key_file to every node", h->who);
	}
	return rc;
}

static int recv_auth(struct hs *h, uint16_t type)
{
	const uint8_t *p;
	struct msg m;
	size_t n;
	int rc = h->x->ops->recv(h->x, &m);

	if (rc)
		return io_error(h, rc);
	if (m.type == MSG_ERROR) {
		rc = refused(h, &m);
	} else if (m.type != type || msg_get_bytes(&m, K_AUTH, &p, &n) != 0) {
		snprintf(h->why, h->whylen, "%s sent frame type %u where the handshake expects %s",
			 h->who, (unsigned)m.type, type_name(type));
		rc = -EBADMSG;
	} else {
		if (type == MSG_PEER_HELLO)
			rc = auth_on_hello(h->s, p, n);
		else
			rc = auth_on_proof(h->s, p, n);
		if (rc)
			rc = auth_refused(h, type, rc);
	}
	msg_free(&m);
	return rc;
}

#define STEPS 4

static const struct step {
	bool send;
	uint16_t type;
} script[2][STEPS] = {
	{ { true, MSG_PEER_HELLO }, { false, MSG_PEER_HELLO },
	  { true, MSG_PEER_PROOF }, { false, MSG_PEER_PROOF } },      /* initiator */
	{ { false, MSG_PEER_HELLO }, { true, MSG_PEER_HELLO },
	  { false, MSG_PEER_PROOF }, { true, MSG_PEER_PROOF } },      /* responder */
};

/* The proven name against what this side expects of it. */
static int check_name(struct hs *h, const char *name, const char *my_name,
		      const struct hosts *hosts, const char *expect)
{
	if (h->initiator && strcmp(name, expect) != 0) {
		peer_send_error(h->x, EACCES, "node %s dialled node %s and reached node %s",
				my_name, expect, name);
		snprintf(h->why, h->whylen, "%s answered as node %s (hosts file out of date?)",
			 h->who, name);
		return -EACCES;
	}
	if (!h->initiator && (!hosts || hosts_find(hosts, name) < 0)) {
		peer_send_error(h->x, EACCES, "node %s is not in the hosts file of node %s",
				name, my_name);
		snprintf(h->why, h->whylen, "%s claims node %s, which is not in the hosts file",
			 h->who, name);
		return -EACCES;
	}
	return 0;
}

int peer_handshake(struct xport **xp, const struct auth_key *key, int wire, const char *my_name,
		   const struct hosts *hosts, const char *expect, int timeout_ms,
		   char *peer_name, size_t cap, char *why, size_t whylen)
{
	struct xport *x = *xp;
	char who[AUTH_NAME_MAX + sizeof(x->peer) + 16];
	struct hs h = { .x = x, .initiator = expect != NULL, .who = who,
			.timeout_ms = timeout_ms, .why = why, .whylen = whylen };
	const char *name;
	int64_t t0;
	int rc;

	if (h.initiator)
		snprintf(who, sizeof(who), "peer %s (%s)", expect, x->peer);
	else
		snprintf(who, sizeof(who), "peer %s", x->peer);
	rc = x->ops->set_timeout(x, timeout_ms);
	if (rc) {
		snprintf(why, whylen, "%s: cannot set a timeout: %s", who, strerror(-rc));
		return rc;
	}
	rc = auth_begin(&h.s, key, my_name, h.initiator);
	if (rc == 0 && (rc = auth_set_wire(h.s, wire)) < 0)
		auth_end(h.s);
	if (rc) {
		snprintf(why, whylen, "%s: cannot start the handshake as node '%s': %s", who,
			 my_name ? my_name : "(none)", strerror(-rc));
		return rc;
	}
	/* timeout_ms is for the whole handshake: each step gets what is left. */
	t0 = mono_ms();
	for (int i = 0; i < STEPS && !rc; i++) {
		const struct step *st = &script[!h.initiator][i];
		int64_t spent = mono_ms() - t0;

		if (spent >= timeout_ms) {
			rc = io_error(&h, -ETIMEDOUT);
			break;
		}
		x->ops->set_timeout(x, timeout_ms - (int)spent);
		rc = st->send ? send_auth(&h, st->type) : recv_auth(&h, st->type);
	}
	x->ops->set_timeout(x, timeout_ms);
	if (rc)
		goto out_end;
	/* From here on every frame is sealed with this connection's key, a
	 * refusal of the proven name too: nobody on the path can forge one. */
	{
		uint8_t sk[AUTH_KEY_BYTES];

		rc = auth_session_key(h.s, sk);
		if (rc == 0)
			rc = xport_seal(xp, sk, h.initiator, (enum seal_wire)auth_wire(h.s));
		explicit_bzero(sk, sizeof(sk));
		if (rc < 0) {
			snprintf(why, whylen, "%s: cannot seal the connection: %s", who,
				 strerror(-rc));
			goto out_end;
		}
		h.x = *xp;
	}
	name = auth_peer_name(h.s);
	rc = check_name(&h, name, my_name, hosts, expect);
	if (rc)
		goto out_end;
	if ((size_t)snprintf(peer_name, cap, "%s", name) >= cap) {
		snprintf(why, whylen, "%s: its name does not fit in %zu bytes", who, cap);
		rc = -ENAMETOOLONG;
	}
out_end:
	auth_end(h.s);
	return rc;
}

void peer_send_error(struct xport *x, int err, const char *fmt, ...)
{
	char text[512];
	struct msg m;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	msg_init(&m, MSG_ERROR);
	msg_put_u64(&m, K_ERRNO, (uint64_t)(err < 0 ? -err : err));
	msg_put_str(&m, K_TEXT, text);
	(void)x->ops->send(x, &m);
	msg_free(&m);
}

int peer_refused(const struct msg *m, const char *node, char *why, size_t whylen)
{
	char text[PEER_TEXT_MAX + 1];
	int err = peer_error_of(m, text);

	snprintf(why, whylen, "%s refused: %s", node, text);
	return err;
}
