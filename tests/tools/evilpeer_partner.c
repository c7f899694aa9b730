/* evilpeer's partner scenarios (the tool: tests/tools/evilpeer.c; the
 * table: evilpeer_scn.c). We are PEER's partner: we listen where the hosts
 * file says we are, take its connection, read its offer, answer a lying
 * WANT, and vanish; or we answer PEER's question of what we hold with a
 * lie. */
#include "tests/tools/evilpeer.h"

/* A piece's frame as the WANT asked for it: its digest there and right
 * (checked decode), or, after K_FRAME_SUM 0, left 0 (and the frame whole
 * otherwise). 0, or -1 said. */
static int frame_as_asked(const struct msg *m, bool no_sum)
{
	static uint8_t raw[CODEC_CHUNK_MAX];
	const uint8_t *p;
	size_t n, got;

	if (msg_get_bytes(m, K_DATA, &p, &n) < 0 || frame_raw(p, n, no_sum, raw, sizeof(raw), &got)) {
		say("FAIL: a piece whose frame is not as the WANT asked (%s)", no_sum ?
		    "its digest 0, after K_FRAME_SUM 0" : "its digest matching its bytes");
		return -1;
	}
	return 0;
}

/* PEER asks us what we hold (verify --cluster): the answer lies. Garbage:
 * a state no node sends. Flood: valid groups, each from an origin of its
 * own, --count of them or a frame full (44,000 or so): what the asker makes
 * of them must stay cheap. Then we wait for PEER to close. */
static int answer_hold(struct ctx *c, int how)
{
	struct msg m;
	int groups = 0;

	if (c->x->ops->recv(c->x, &m) < 0 || m.type != MSG_HOLD_REQ) {
		say("FAIL: no question from %s", c->peer);
		return FAIL;
	}
	msg_free(&m);
	msg_init(&m, MSG_HOLD);
	if (how == V_HOLD_GARBAGE) {
		msg_put_str(&m, K_ORIGIN, c->cfg.name);
		msg_put_str(&m, K_STATE, "owned");
		groups = 1;
	} else {
		while (m.len + 40 < PROTO_MAX_PAYLOAD - 64 && (!c->count || groups < c->count)) {
			char o[16];

			snprintf(o, sizeof(o), "o%d", groups++);
			msg_put_str(&m, K_ORIGIN, o);
			msg_put_str(&m, K_STATE, "ok");
		}
	}
	if (sendm(c, &m) < 0) {
		say("FAIL: cannot answer");
		return FAIL;
	}
	say("evilpeer: answered with %d groups", groups);
	c->x->ops->set_timeout(c->x, 120000);
	while (c->x->ops->recv(c->x, &m) == 0)
		msg_free(&m);
	say("PASS: %s closed", c->peer);
	return PASS;
}

struct offered {
	uint64_t chunk, nck;     /* chunk size, chunks of the offer */
	uint64_t first_size;     /* the first file with data: its index and size */
	uint64_t first_idx;
};

static int read_offer(struct ctx *c, struct offered *o)
{
	struct buf mf = { 0 };
	struct mf_reader *mr = NULL;
	struct mf_entry e;
	uint64_t size = 0, idx = 0;
	struct msg m;
	FILE *fp;
	int rc;

	if (c->x->ops->recv(c->x, &m) < 0 || m.type != MSG_OFFER ||
	    msg_get_u64(&m, K_SIZE, &size) < 0) {
		say("FAIL: no offer from %s", c->peer);
		return -EPROTO;
	}
	msg_free(&m);
	while (mf.n < size) {
		const uint8_t *p;
		size_t n;

		if (c->x->ops->recv(c->x, &m) < 0 || m.type != MSG_MANIFEST ||
		    msg_get_bytes(&m, K_DATA, &p, &n) < 0) {
			say("FAIL: the offer's manifest did not come whole");
			return -EPROTO;
		}
		bput(&mf, p, n);
		msg_free(&m);
	}
	memset(o, 0, sizeof(*o));
	o->first_idx = UINT64_MAX;
	fp = fmemopen(mf.p, mf.n, "r");
	rc = fp ? mf_reader_open_fp(&mr, fp, "offer", MF_COMPLETE) : -errno;
	while (rc == 0 && (rc = mf_reader_next(mr, &e)) == 1) {
		if (e.type == MF_FILE && e.size) {
			if (o->first_idx == UINT64_MAX) {
				o->first_idx = idx;
				o->first_size = e.size;
			}
			o->nck += e.nchunks ? e.nchunks : 1;
		}
		mf_entry_free(&e);
		idx++;
		rc = 0;
	}
	if (fp && mr) {
		o->chunk = mf_reader_chunk_size(mr);
		mf_reader_close(mr);
	}
	if (fp)
		fclose(fp);
	free(mf.p);
	say("evilpeer: offered %llu chunks of %llu bytes", (unsigned long long)o->nck,
	    (unsigned long long)o->chunk);
	return rc < 0 || o->first_idx == UINT64_MAX ? -EPROTO : 0;
}

static int accept_peer(struct ctx *c, struct xport_listener *l, int lfd)
{
	char why[512], name[AUTH_NAME_MAX + 1];
	struct pollfd p = { .fd = lfd, .events = POLLIN };
	int rc;

	if (poll(&p, 1, 60000) != 1 || xport_tcp_ops.accept(l, &c->x) < 0) {
		say("FAIL: %s did not connect within 60 s", c->peer);
		return -EPROTO;
	}
	rc = peer_handshake(&c->x, &c->key, peer_wire_of(c->cfg.wire), c->cfg.name, &c->hosts, NULL, 10000, name,
			    sizeof(name), why, sizeof(why));
	if (rc < 0 || strcmp(name, c->peer) != 0) {
		say("FAIL: handshake: %s", rc < 0 ? why : name);
		return -EPROTO;
	}
	c->x->ops->set_timeout(c->x, ANSWER_MS);
	say("evilpeer: %s connected", c->peer);
	return 0;
}

int scn_recv(struct ctx *c, int how)
{
	char host[256], why[512];
	uint16_t port;
	const char *w;
	struct xport_listener *l;
	struct offered o;
	struct msg m;
	size_t nheld = 0;
	uint8_t *held = NULL;
	int lfd, rc = FAIL, pieces = 0;

	if (config_parse_hostport(c->cfg.listen, host, sizeof(host), &port, &w) < 0 ||
	    xport_tcp_ops.listen(host, port, &l, &lfd, why, sizeof(why)) < 0) {
		say("evilpeer: cannot listen on %s", c->cfg.listen);
		return SETUP;
	}
	say("evilpeer: listening on %s", c->cfg.listen);
	if (how == V_HOLD_GARBAGE || how == V_HOLD_FLOOD) {
		rc = accept_peer(c, l, lfd) ? FAIL : answer_hold(c, how);
		goto out;
	}
	for (int i = 0; i < (how == V_REFUSE ? (c->count ? c->count : 5) : 1); i++) {
		if (accept_peer(c, l, lfd) || read_offer(c, &o))
			goto out;
		if (how == V_REFUSE) {
			peer_send_error(c->x, EIO, "%s: an evil partner refuses", c->cfg.name);
			c->x->ops->close(c->x);
			c->x = NULL;
			say("evilpeer: refusal %d sent", i + 1);
		}
	}
	if (how == V_REFUSE) {
		rc = PASS;
		goto out;
	}
	/* Exact, much too long, or one byte holding chunk 0 only. */
	nheld = how == V_HELD_ALL ? (o.nck + 7) / 8 : how == V_HELD_LONG ? 65536 :
		how == V_HELD_SHORT ? 1 : 0;
	held = malloc(nheld + 1);
	memset(held, 0xff, nheld + 1);
	if (how == V_HELD_SHORT)
		held[0] = 0x01;
	msg_init(&m, MSG_WANT);
	msg_put_u64(&m, K_CODE, 0);
	msg_put_u64(&m, K_FILE, how == V_WANT_BEYOND ? UINT64_MAX : 0);
	msg_put_u64(&m, K_OFFSET, how == V_WANT_BEYOND ? UINT64_MAX : 0);
	if (nheld)
		msg_put_bytes(&m, K_HELD, held, nheld);
	if (how == V_NO_SUM)
		msg_put_u64(&m, K_FRAME_SUM, 0);
	if (sendm(c, &m) < 0)
		goto out;
	/* What the sender streams must respect the WANT. */
	for (;;) {
		uint64_t idx = 0, off = 0;

		if (c->x->ops->recv(c->x, &m) < 0) {
			say("FAIL: the sender closed before END");
			goto out;
		}
		if (m.type == MSG_END) {
			msg_free(&m);
			break;
		}
		if (m.type != MSG_DATA || msg_get_u64(&m, K_FILE, &idx) < 0 ||
		    msg_get_u64(&m, K_OFFSET, &off) < 0) {
			show(&m);
			msg_free(&m);
			goto out;
		}
		if (frame_as_asked(&m, how == V_NO_SUM) < 0) {
			msg_free(&m);
			goto out;
		}
		msg_free(&m);
		pieces++;
		if (how == V_HELD_ALL || how == V_HELD_LONG || how == V_WANT_BEYOND ||
		    (how == V_HELD_SHORT && idx == o.first_idx &&
		     off < (o.first_size > o.chunk ? o.chunk : o.first_size))) {
			say("FAIL: DATA for entry %llu at %llu, which the WANT did not ask for",
			    (unsigned long long)idx, (unsigned long long)off);
			goto out;
		}
		if (how == V_VANISH_MID) {
			say("PASS: a piece came; vanishing mid-copy");
			rc = PASS;
			goto out;
		}
	}
	if ((how == V_VANISH_MID || how == V_NO_SUM) && pieces == 0) {
		say("FAIL: END without a piece, where every piece was asked for");
		goto out;
	}
	say("PASS: END after %d pieces, as asked; vanishing without DONE", pieces);
	rc = PASS;
out:
	free(held);
	if (c->x)
		c->x->ops->close(c->x);
	c->x = NULL;
	xport_tcp_ops.unlisten(l);
	return rc;
}
