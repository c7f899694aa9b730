/* A restore's source: the copy a holder keeps of this node's step, fetched
 * over a fresh peer connection (MSG_FETCH_REQ; the holder's side is
 * fetch.c). One request per run of chunks, answered by codec frames,
 * each piece's XXH3-64 checked by its frame and the chunk by the builder. */
#include "daemon/restore/rsrc.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/codec.h"
#include "common/proto.h"
#include "daemon/engine/uio.h"
#include "daemon/fs/cred.h"
#include "daemon/net/peer.h"
#include "daemon/repl/repl.h"
#include "daemon/peers/peers.h"

static void fetch_req(struct rsrc *s, struct msg *m)
{
	char hex[DIGEST_HEX_LEN + 1];

	digest_to_hex(s->root, hex);
	msg_init(m, MSG_FETCH_REQ);
	msg_put_str(m, K_ORIGIN, peers_self_name());
	msg_put_str(m, K_JOB, s->job);
	msg_put_str(m, K_STEP, s->step);
	msg_put_str(m, K_ROOT, hex);
	msg_put_u64(m, K_FRAME_SUM, 0);     /* the builder checks the bytes, not the frames */
	/* The user the restore acts as: the holder gives a copy only to its
	 * owner (a job not on this node any more is not proof of anything). */
	if (!cred_is_root())
		msg_put_u64(m, K_UID, cred_uid());
}

/* The next frame of a fetch: MSG_DATA/MSG_MANIFEST (1) or MSG_END (0, its
 * K_SIZE in *end_size if end_size), or -errno with why. */
static int next_frame(struct rsrc *s, struct msg *m, uint16_t type, uint64_t *end_size)
{
	int rc = s->x->ops->recv(s->x, m);

	if (rc < 0) {
		snprintf(s->why, s->whylen, "%s: %s", s->name, strerror(-rc));
		return rc;
	}
	if (m->type == MSG_ERROR) {
		rc = peer_refused(m, s->name, s->why, s->whylen);
		msg_free(m);
		return rc;
	}
	if (m->type == MSG_END) {
		if (end_size)
			msg_get_u64(m, K_SIZE, end_size);
		msg_free(m);
		return 0;
	}
	if (m->type != type) {
		snprintf(s->why, s->whylen, "%s: unexpected frame type %u", s->name, m->type);
		msg_free(m);
		return -EPROTO;
	}
	return 1;
}

static int peer_open(struct rsrc *s)
{
	ssize_t h = hosts_find(&peers.hosts, s->name);

	if (h < 0) {
		snprintf(s->why, s->whylen, "%s is not in the hosts file", s->name);
		return -ENOENT;
	}
	return peers_dial((size_t)h, PEERS_CONNECT_MS, peers_io_ms(), &s->x, s->why, s->whylen);
}

static int peer_manifest(struct rsrc *s, int fd)
{
	struct msg m;
	uint64_t off = 0, end_size = UINT64_MAX;
	int rc;

	fetch_req(s, &m);
	rc = s->x->ops->send(s->x, &m);
	msg_free(&m);
	if (rc < 0)
		snprintf(s->why, s->whylen, "%s: %s", s->name, strerror(-rc));
	while (rc >= 0 && (rc = next_frame(s, &m, MSG_MANIFEST, &end_size)) == 1) {
		const uint8_t *p;
		size_t n;
		uint64_t at;

		if (msg_get_u64(&m, K_OFFSET, &at) < 0 || at != off ||
		    msg_get_bytes(&m, K_DATA, &p, &n) < 0 || off + n > REPL_MF_MAX) {
			snprintf(s->why, s->whylen, "%s: a manifest slice out of order", s->name);
			rc = -EPROTO;
		} else {
			rc = uio_pwrite(s->ring, fd, p, n, off);
			if (rc < 0)
				snprintf(s->why, s->whylen, "writing the manifest from %s: %s", s->name,
					 strerror(-rc));
			off += n;
		}
		msg_free(&m);
	}
	if (rc == 0 && end_size != off) {
		snprintf(s->why, s->whylen, "%s sent %llu manifest bytes, and said %llu", s->name,
			 (unsigned long long)off, (unsigned long long)end_size);
		rc = -EPROTO;
	}
	return rc;
}

static int peer_fetch(struct rsrc *s, struct cbuild *cb, const struct mf_entry *e, uint64_t off,
		      uint64_t end)
{
	struct msg m;
	int rc;

	fetch_req(s, &m);
	msg_put_str(&m, K_PATH, e->path);
	msg_put_u64(&m, K_OFFSET, off);
	msg_put_u64(&m, K_SIZE, end - off);
	rc = s->x->ops->send(s->x, &m);
	msg_free(&m);
	if (rc < 0) {
		snprintf(s->why, s->whylen, "%s: %s", s->name, strerror(-rc));
		return rc;
	}
	while ((rc = next_frame(s, &m, MSG_DATA, NULL)) == 1) {
		uint64_t next = cb->at;
		uint8_t *raw_buf;
		int b = cbuild_buf(cb, &raw_buf);
		const uint8_t *p;
		size_t n, raw = 0, used;
		uint64_t at;

		rc = msg_get_u64(&m, K_OFFSET, &at) < 0 || at != next ||
		     msg_get_bytes(&m, K_DATA, &p, &n) < 0 ? -EPROTO :
		     /* the builder checks every byte against the manifest */
		     codec_chunk_decode_unchecked(p, n, raw_buf, WQ_BUF, &raw, &used);
		msg_free(&m);
		if (rc == 0 && (used != n || raw == 0 || next + raw > end))
			rc = -EPROTO;
		if (rc < 0) {
			snprintf(s->why, s->whylen, "%s: a bad piece of %s at byte %llu (%s)", s->name,
				 e->path, (unsigned long long)next, strerror(-rc));
			return rc;
		}
		rc = cbuild_put(cb, b, raw);
		if (rc == -EBADMSG) {
			snprintf(s->why, s->whylen, "chunk %llu of %s from %s does not match the "
				 "manifest", (unsigned long long)cb->bad_chunk, e->path, s->name);
			return rc;
		}
		if (rc < 0) {
			snprintf(s->why, s->whylen, "writing %s: %s", e->path, strerror(-rc));
			return rc;
		}
		s->bytes += raw;
	}
	if (rc == 0 && cb->at != end) {
		snprintf(s->why, s->whylen, "%s sent %llu of %llu bytes of %s", s->name,
			 (unsigned long long)(cb->at - off), (unsigned long long)(end - off), e->path);
		rc = -EPROTO;
	}
	return rc;
}

static void peer_close(struct rsrc *s)
{
	if (s->x)
		s->x->ops->close(s->x);
	s->x = NULL;
}

const struct rsrc_ops rsrc_peer_ops = {
	.open = peer_open, .manifest = peer_manifest, .fetch = peer_fetch, .close = peer_close,
};
