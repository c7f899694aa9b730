/* evilpeer's scenarios (the tool: tests/tools/evilpeer.c): each one lies
 * to a real daemon in one way, and says whether the daemon's answer on the
 * wire was the refusal (or, for the *_ok controls, the acceptance) that the
 * protocol calls for. test_evil_peer.py checks the daemon's side. */
#include "tests/tools/evilpeer.h"

/* ---- scenarios: offers whose fields lie ---- */

enum { O_OK, O_SETID, O_UNKNOWN_KEYS, O_OTHER_ORIGIN, O_DUP_ORIGIN, O_BAD_JOB, O_BAD_STEP,
       O_BAD_ROOT, O_NO_SIZE, O_SIZE_4B, O_SIZE_ZERO, O_SIZE_HUGE };

static int scn_offer(struct ctx *c, int how)
{
	struct ent v[E_COUNT];
	struct buf mf = { 0 };
	struct want w = { 0 };
	struct msg m;
	digest_t root;
	uint8_t junk[1000] = { 0 };
	int rc;

	if (how == O_OK || how == O_SETID || how == O_UNKNOWN_KEYS) {
		if (how == O_SETID) {
			/* Set-id bits asked for by a peer: the copy must not have
			 * them (the test looks), it is accepted otherwise. */
			v[0] = (struct ent){ 'd', "sgid", 0, NULL, false, 02775 };
			v[1] = (struct ent){ 'f', "sgid/tool", 100, NULL, false, 06755 };
			v[2] = (struct ent){ 'f', "suid", 100, NULL, false, 04755 };
			manifest(c, &mf, v, 3, CHUNK, &root);
			offer_fields(c, &m, root, mf.n);
			rc = sendm(c, &m) < 0 || send_slices(c, mf.p, mf.n, 0) < 0 || get_want(c, &w);
		} else if (how == O_OK) {
			rc = offer_std(c, v, &mf, &root, &w);
			/* The receiver checks every byte against the manifest and
			 * says so: the frames need not carry their digest. */
			if (rc == 0 && w.code == 0 && w.frame_sum != 0) {
				say("FAIL: the WANT did not say K_FRAME_SUM 0");
				rc = FAIL;
			}
		} else {       /* keys a newer peer might add: skipped, not refused */
			manifest(c, &mf, v, std_tree(c, v), CHUNK, &root);
			offer_fields(c, &m, root, mf.n);
			msg_put_bytes(&m, 0, NULL, 0);
			msg_put_bytes(&m, 999, junk, sizeof(junk));
			msg_put_u64(&m, 65535, 7);
			rc = sendm(c, &m) < 0 || send_slices(c, mf.p, mf.n, 0) < 0 || get_want(c, &w);
		}
		if (rc == 0 && w.code == 0)
			rc = send_wanted(c, v, how == O_SETID ? 3 : E_COUNT, &w) < 0 ? FAIL :
			     end_and_done(c);
		else if (rc == 0)
			say("PASS: already held");
		free(w.held);
		free(mf.p);
		return rc ? FAIL : PASS;
	}
	manifest(c, &mf, v, std_tree(c, v), CHUNK, &root);
	msg_init(&m, MSG_OFFER);
	if (how == O_OTHER_ORIGIN || how == O_DUP_ORIGIN)
		msg_put_str(&m, K_ORIGIN, c->other);     /* dup: the first one counts */
	if (how != O_OTHER_ORIGIN)
		msg_put_str(&m, K_ORIGIN, c->cfg.name);
	msg_put_str(&m, K_JOB, how == O_BAD_JOB ? "../x" : c->job);
	msg_put_str(&m, K_STEP, how == O_BAD_STEP ? ".stage" : c->step);
	if (how == O_BAD_ROOT) {
		msg_put_str(&m, K_ROOT, "not-a-digest");
	} else {
		char hex[DIGEST_HEX_LEN + 1];

		digest_to_hex(root, hex);
		msg_put_str(&m, K_ROOT, hex);
	}
	if (how == O_SIZE_4B)
		msg_put_bytes(&m, K_SIZE, "\x10\0\0\0", 4);
	else if (how != O_NO_SIZE)
		msg_put_u64(&m, K_SIZE, how == O_SIZE_ZERO ? 0 : how == O_SIZE_HUGE ?
			    (256ull << 20) + 1 : mf.n);
	rc = sendm(c, &m);
	/* The refusal comes before any slice is read; send them anyway, as a
	 * peer that does not listen would. */
	if (rc == 0 && how != O_SIZE_HUGE)
		send_slices(c, mf.p, mf.n, 0);
	free(mf.p);
	return expect_refusal(c, true);
}

/* ---- scenarios: manifests that escape or do not read ---- */

enum { M_DOTDOT, M_ABS, M_INNER_DOTDOT, M_STAGE, M_DOT, M_EMPTY_COMP, M_LINK_BENEATH,
       M_GARBAGE, M_TRUNCATED, M_SHORT, M_OVERRUN, M_BAD_OFFSET, M_ROOT_MISMATCH,
       M_LONG_LINE, M_HUGE_FILE };

static int scn_manifest(struct ctx *c, int how)
{
	char p1[3 * MF_MAX_PATH], up[64 * 3 + 1] = "";
	struct ent v[E_COUNT];
	struct buf mf = { 0 };
	const char *out = c->outside + (c->outside[0] == '/');   /* as a relative path */
	size_t n = 1;
	uint64_t size;
	digest_t root;
	struct want w = { 0 };
	struct msg m;
	int rc;

	for (int i = 0; i < 32; i++)
		strcat(up, "../");      /* well above any replica_root, to --outside */
	v[0] = (struct ent){ 'f', p1, 5, NULL, false, 0 };
	switch (how) {
	case M_DOTDOT: snprintf(p1, sizeof(p1), "%s%s/dotdot", up, out); break;
	case M_ABS: snprintf(p1, sizeof(p1), "%s/abs", c->outside); break;
	case M_INNER_DOTDOT: snprintf(p1, sizeof(p1), "a/%s%s/inner", up, out); break;
	case M_STAGE: snprintf(p1, sizeof(p1), ".stage/manifest"); break;
	case M_DOT: snprintf(p1, sizeof(p1), "./x"); break;
	case M_EMPTY_COMP: snprintf(p1, sizeof(p1), "a//x"); break;
	case M_LINK_BENEATH:   /* link -> outside, then a file through it */
		v[0] = (struct ent){ 'l', "link", 0, c->outside, false, 0 };
		v[1] = (struct ent){ 'f', "link/beneath", 5, NULL, false, 0 };
		n = 2;
		break;
	case M_HUGE_FILE:      /* 1 PiB in 1 GiB chunks: 2^20 chunk lines, 36 MB */
		v[0] = (struct ent){ 'f', "huge.bin", 1ull << 50, NULL, true, 0 };
		break;
	default:
		n = std_tree(c, v);
	}
	if (how == M_GARBAGE) {
		for (int i = 0; i < 100; i++)
			bprintf(&mf, "this is not a manifest %d\n", i);
		root = digest_of(mf.p, mf.n);
	} else if (how == M_LONG_LINE) {
		manifest(c, &mf, v, n, CHUNK, &root);
		mf.n = 0;        /* same root, but a 70 KB line where an entry is due */
		bprintf(&mf, "stage-manifest 1\nchunk %u\nf ", CHUNK);
		for (int i = 0; i < 70000; i++)
			bput(&mf, "x", 1);
		bprintf(&mf, " 5 0644 %lld %032d\n", MTIME, 0);
	} else {
		manifest(c, &mf, v, n, how == M_HUGE_FILE ? MF_CHUNK_MAX : CHUNK, &root);
	}
	size = mf.n;
	if (how == M_TRUNCATED)         /* the trailer cut off, and the size with it */
		size = mf.n = (size_t)(strstr(mf.p, "\nend ") - mf.p) + 1;
	if (how == M_OVERRUN)
		size = mf.n - 10;
	if (how == M_ROOT_MISMATCH)
		root.low64 ^= 1;
	offer_fields(c, &m, root, size);
	rc = sendm(c, &m);
	if (rc == 0 && how == M_SHORT) {
		rc = send_slices(c, mf.p, mf.n / 2, 0);
		msg_init(&m, MSG_END);
		rc = rc ? rc : sendm(c, &m);
	} else if (rc == 0 && how == M_OVERRUN) {
		msg_init(&m, MSG_MANIFEST);
		msg_put_u64(&m, K_OFFSET, 0);
		rc = c->x->ops->send_tail(c->x, &m, K_DATA, mf.p, mf.n);
		msg_free(&m);
	} else if (rc == 0) {
		rc = send_slices(c, mf.p, mf.n, how == M_BAD_OFFSET ? 5 : 0);
	}
	free(mf.p);
	if (how != M_HUGE_FILE)
		return expect_refusal(c, true);
	/* The manifest is well formed: 1 PiB is accepted on paper (there is
	 * no quota). One piece, then END: what was never sent cannot be
	 * published, and nothing near 1 PiB may be allocated or written. */
	if (rc < 0 || get_want(c, &w)) {
		say("FAIL: a well-formed manifest of a 1 PiB file was not accepted");
		return FAIL;
	}
	free(w.held);
	rc = send_bytes(c, 0, 0, PIECE, UINT64_MAX);
	msg_init(&m, MSG_END);
	if (rc == 0)
		sendm(c, &m);
	else
		msg_free(&m);
	return expect_refusal(c, true);
}

/* ---- scenarios: DATA that does not match the manifest ---- */

enum { D_BAD_CHUNK, D_BAD_FRAME, D_BAD_DIGEST, D_PAST_END, D_INDEX_RANGE, D_INDEX_HUGE, D_NOT_FILE, D_GAP,
       D_BACKWARDS, D_DUP, D_END_EARLY, D_END_MID, D_BOMB, D_NO_FIELDS, D_ZERO, D_UNKNOWN_TYPE,
       D_DONE };

static int scn_data(struct ctx *c, int how)
{
	struct ent v[E_COUNT];
	struct buf mf = { 0 };
	uint8_t *p = NULL;
	digest_t root;
	struct want w = { 0 };
	struct msg m;
	int rc;

	if (offer_std(c, v, &mf, &root, &w))
		return FAIL;
	free(mf.p);
	for (size_t i = 0; i < w.nheld; i++)
		w.code |= w.held[i] ? 2 : 0;    /* content unique to the step: none held */
	free(w.held);
	if (w.code != 0 || w.file != 0 || w.off != 0) {
		say("FAIL: a fresh step should be wanted whole from 0 0");
		return FAIL;
	}
	switch (how) {
	case D_BAD_CHUNK:      /* right frame, wrong bytes: chunk 0's digest fails */
		rc = send_bytes(c, E_A, 0, A_SIZE, 100);
		break;
	case D_BAD_FRAME:      /* a frame whose last byte changed: chunk 2 fails */
		p = malloc(A_SIZE);
		gen(c, E_A, 0, p, A_SIZE);
		rc = send_piece_as(c, E_A, 0, p, A_SIZE, &codec_none_ops, DAMAGE_PAYLOAD);
		break;
	case D_BAD_DIGEST:     /* right bytes, the frame's digest field wrong: taken
				* (the bytes are checked against the manifest, not the
				* frame), the rest sent, the copy published */
		p = malloc(A_SIZE);
		gen(c, E_A, 0, p, A_SIZE);
		rc = send_piece_as(c, E_A, 0, p, A_SIZE, &codec_none_ops, DAMAGE_DIGEST);
		free(p);
		if (rc == 0) {
			struct want rest = { .file = E_A + 1 };

			rc = send_wanted(c, v, E_COUNT, &rest);
		}
		return rc < 0 ? FAIL : end_and_done(c);
	case D_PAST_END:       /* 4096 bytes where 1808 remain */
		p = malloc(CHUNK);
		gen(c, E_A, 8192, p, CHUNK);
		rc = send_bytes(c, E_A, 0, 8192, UINT64_MAX);
		rc = rc ? rc : send_piece_as(c, E_A, 8192, p, CHUNK, &codec_none_ops, DAMAGE_NONE);
		break;
	case D_INDEX_RANGE:    /* every file right, then entry 6 of 6 */
	case D_INDEX_HUGE:
		rc = send_bytes(c, E_A, 0, A_SIZE, UINT64_MAX);
		rc = rc ? rc : send_bytes(c, E_B, 0, B_SIZE, UINT64_MAX);
		rc = rc ? rc : send_bytes(c, how == D_INDEX_RANGE ? E_COUNT : UINT64_MAX, 0, 100,
					  UINT64_MAX);
		break;
	case D_NOT_FILE:
		rc = send_bytes(c, E_DIR, 0, 100, UINT64_MAX);
		break;
	case D_GAP:            /* the second chunk first */
		rc = send_bytes(c, E_A, CHUNK, A_SIZE, UINT64_MAX);
		break;
	case D_BACKWARDS:      /* a.bin and b.bin whole, then a.bin again */
		rc = send_bytes(c, E_A, 0, A_SIZE, UINT64_MAX);
		rc = rc ? rc : send_bytes(c, E_B, 0, B_SIZE, UINT64_MAX);
		rc = rc ? rc : send_bytes(c, E_A, 0, CHUNK, UINT64_MAX);
		break;
	case D_DUP:
		rc = send_bytes(c, E_A, 0, CHUNK, UINT64_MAX);
		rc = rc ? rc : send_bytes(c, E_A, 0, CHUNK, UINT64_MAX);
		break;
	case D_END_MID:
	case D_END_EARLY:
		rc = how == D_END_MID ? send_bytes(c, E_A, 0, CHUNK, UINT64_MAX) : 0;
		msg_init(&m, MSG_END);
		rc = rc ? rc : sendm(c, &m);
		break;
	case D_BOMB:           /* 8 MiB of zeros in a few hundred bytes of zstd */
		p = calloc(1, 8u << 20);
		rc = p ? send_piece_as(c, E_A, 0, p, 8u << 20, &codec_zstd_ops, DAMAGE_NONE) : -ENOMEM;
		break;
	case D_NO_FIELDS:
		msg_init(&m, MSG_DATA);
		msg_put_u64(&m, K_FILE, E_A);
		msg_put_u64(&m, K_OFFSET, 0);
		rc = sendm(c, &m);
		break;
	case D_ZERO:
		rc = send_piece_as(c, E_A, 0, (const uint8_t *)"", 0, &codec_none_ops, DAMAGE_NONE);
		break;
	case D_UNKNOWN_TYPE:
	case D_DONE:
		rc = send_bytes(c, E_A, 0, CHUNK, UINT64_MAX);
		msg_init(&m, how == D_DONE ? MSG_DONE : 999);
		msg_put_u64(&m, K_CODE, 0);
		rc = rc ? rc : sendm(c, &m);
		break;
	default:
		rc = -EINVAL;
	}
	free(p);
	if (rc < 0 && rc != -EPIPE && rc != -ECONNRESET)
		say("evilpeer: sending: %s", strerror(-rc));
	return expect_refusal(c, true);
}

/* ---- scenarios: frames out of place ---- */

enum { F_UNKNOWN_FIRST, F_DATA_FIRST, F_HELLO_AGAIN, F_OVERSIZED, F_RESERVED, F_UNSEALED,
       F_OVERSIZED_MID };

static int scn_frame(struct ctx *c, int how)
{
	uint8_t hdr[PROTO_HDR_LEN];
	struct msg m;
	int fd = raw_fd(c);

	switch (how) {
	case F_UNKNOWN_FIRST:
	case F_DATA_FIRST:
	case F_HELLO_AGAIN:
		msg_init(&m, how == F_UNKNOWN_FIRST ? 999 : how == F_DATA_FIRST ? MSG_DATA :
			 MSG_PEER_HELLO);
		msg_put_u64(&m, 4242, 1);        /* an unknown key, and a known one twice */
		msg_put_u64(&m, K_FILE, 0);
		msg_put_u64(&m, K_FILE, 1);
		sendm(c, &m);
		return expect_refusal(c, true);
	case F_UNSEALED:       /* a good offer without its tag */
		msg_init(&m, MSG_OFFER);
		msg_put_str(&m, K_ORIGIN, c->cfg.name);
		msg_send(fd, &m);
		msg_free(&m);
		return expect_refusal(c, false);
	case F_OVERSIZED_MID:
		offer_fields(c, &m, (digest_t){ 0 }, 1000);
		sendm(c, &m);
		/* fall through */
	default:               /* headers refused before any payload is read */
		proto_encode_hdr(hdr, MSG_MANIFEST, 0, how == F_RESERVED ? 16 : PROTO_MAX_PAYLOAD + 1);
		if (how == F_RESERVED)
			hdr[12] = 1;
		if (fd < 0 || write(fd, hdr, sizeof(hdr)) != (ssize_t)sizeof(hdr)) {
			say("evilpeer: cannot write to the socket");
			return SETUP;
		}
		/* The daemon's side of the connection is dead after a frame it
		 * could not read: it closes without a word (and logs why). */
		return expect_refusal(c, false);
	}
}

/* ---- scenarios: a requester asking for what it may not have ---- */

enum { Q_MANIFEST_OK, Q_RANGE_OK, Q_RANGE_NO_SUM, Q_DOTDOT, Q_ABS, Q_INNER_DOTDOT, Q_STAGE, Q_VIA_LINK, Q_LINK,
       Q_DIR, Q_OTHER_ORIGIN, Q_WRONG_ROOT, Q_NO_STEP, Q_PAST_END, Q_HUGE_SIZE, Q_HUGE_OFF,
       Q_BAD_JOB, Q_HOLD_BAD, Q_HOLD_FLOOD, Q_HOLD_NAMES };

/* A fetch of the standard tree of --step, which offer_ok published. */
static void fetch_msg(const struct ctx *c, struct msg *m, const char *origin, const char *job,
		      const char *step, digest_t root, const char *path, uint64_t off,
		      uint64_t size)
{
	char hex[DIGEST_HEX_LEN + 1];

	digest_to_hex(root, hex);
	msg_init(m, MSG_FETCH_REQ);
	msg_put_str(m, K_ORIGIN, origin);
	msg_put_str(m, K_JOB, job);
	msg_put_str(m, K_STEP, step);
	msg_put_str(m, K_ROOT, hex);
	if (path) {
		msg_put_str(m, K_PATH, path);
		msg_put_u64(m, K_OFFSET, off);
		msg_put_u64(m, K_SIZE, size);
	}
}

/* Reads MANIFEST slices or DATA pieces up to END into out: 0, or -EPROTO.
 * no_sum: the fetch said K_FRAME_SUM 0, so each frame's digest must be 0
 * (else right). */
static int fetch_body(struct ctx *c, struct buf *out, bool no_sum)
{
	uint8_t *raw = malloc(PIECE);

	for (;;) {
		struct msg m;
		const uint8_t *p;
		size_t n, got;

		if (c->x->ops->recv(c->x, &m) < 0 || !raw)
			break;
		if (m.type == MSG_END) {
			msg_free(&m);
			free(raw);
			return 0;
		}
		if (msg_get_bytes(&m, K_DATA, &p, &n) < 0 ||
		    (m.type != MSG_MANIFEST && m.type != MSG_DATA) ||
		    (m.type == MSG_DATA && frame_raw(p, n, no_sum, raw, PIECE, &got) < 0)) {
			show(&m);
			msg_free(&m);
			break;
		}
		if (m.type == MSG_MANIFEST)
			bput(out, p, n);
		else
			bput(out, raw, got);
		msg_free(&m);
	}
	free(raw);
	return -EPROTO;
}

static int scn_fetch(struct ctx *c, int how)
{
	char path[MF_MAX_PATH];
	struct ent v[E_COUNT];
	struct buf mf = { 0 }, got = { 0 };
	const char *origin = c->cfg.name, *job = c->job, *step = c->step, *rel = NULL;
	uint64_t off = 0, size = 0;
	digest_t root;
	struct msg m;
	int rc;

	manifest(c, &mf, v, std_tree(c, v), CHUNK, &root);
	switch (how) {
	case Q_MANIFEST_OK:
		fetch_msg(c, &m, origin, job, step, root, NULL, 0, 0);
		rc = sendm(c, &m) < 0 || fetch_body(c, &got, false) || got.n != mf.n ||
		     memcmp(got.p, mf.p, mf.n) != 0;
		say(rc ? "FAIL: not our manifest back" : "PASS: our manifest back, byte for byte");
		goto out;
	case Q_RANGE_OK:
	case Q_RANGE_NO_SUM: {     /* an older asker, then one that checks the bytes itself */
		uint8_t want[A_SIZE];

		gen(c, E_A, 0, want, A_SIZE);
		fetch_msg(c, &m, origin, job, step, root, "dir/a.bin", 100, 8900);
		if (how == Q_RANGE_NO_SUM)
			msg_put_u64(&m, K_FRAME_SUM, 0);
		rc = sendm(c, &m) < 0 || fetch_body(c, &got, how == Q_RANGE_NO_SUM) || got.n != 8900 ||
		     memcmp(got.p, want + 100, 8900) != 0;
		say(rc ? "FAIL: not the range asked for" : "PASS: the range, byte for byte");
		goto out;
	}
	case Q_DOTDOT: rel = "../../../etc/passwd"; break;
	case Q_ABS:
		snprintf(path, sizeof(path), "%s/secret", c->outside);
		rel = path;
		break;
	case Q_INNER_DOTDOT: rel = "dir/../../x"; break;
	case Q_STAGE: rel = ".stage/manifest"; break;
	case Q_VIA_LINK: rel = "dir/out/secret"; break;   /* dir/out -> --outside */
	case Q_LINK: rel = "dir/out"; break;
	case Q_DIR: rel = "dir"; break;
	case Q_OTHER_ORIGIN: origin = c->other; break;
	case Q_WRONG_ROOT: root.high64 ^= 1; break;
	case Q_NO_STEP: step = "no-such-step"; break;
	case Q_PAST_END: rel = "dir/a.bin"; off = 5000; size = A_SIZE; break;
	case Q_HUGE_SIZE: rel = "dir/a.bin"; size = UINT64_MAX; break;
	case Q_HUGE_OFF: rel = "dir/a.bin"; off = UINT64_MAX; size = 2; break;
	case Q_BAD_JOB: job = "../../etc"; break;
	}
	if (how == Q_HOLD_BAD || how == Q_HOLD_FLOOD || how == Q_HOLD_NAMES) {
		char name[257];
		int i, asks = how == Q_HOLD_FLOOD ? 500 : 1;

		memset(name, 'j', 256);
		name[255] = '\0';       /* the longest name: a fair question */
		for (i = 0; i < asks; i++) {
			msg_init(&m, MSG_HOLD_REQ);
			msg_put_str(&m, K_JOB, how == Q_HOLD_BAD ? "../x" : how == Q_HOLD_NAMES ?
				    name : c->job);
			msg_put_str(&m, K_STEP, c->step);
			/* Every flag but REQ_ALLSTEPS: bits a node does not know
			 * are ignored, and every step read deep is refused (its
			 * own scenario would be another question). */
			msg_put_u64(&m, K_FLAGS, how == Q_HOLD_FLOOD ? 0 : UINT64_MAX & ~(uint64_t)REQ_ALLSTEPS);
			if (sendm(c, &m) < 0 || c->x->ops->recv(c->x, &m) < 0)
				break;
			if (m.type != MSG_HOLD) {
				show(&m);
				msg_free(&m);
				break;
			}
			msg_free(&m);
		}
		if (how == Q_HOLD_BAD) {
			rc = i == 0 ? PASS : FAIL;   /* the failed recv said what came */
			say(rc == PASS ? "PASS: refused" : "FAIL: answered");
			goto out;
		}
		if (i < asks) {
			say("FAIL: %d of %d questions answered", i, asks);
			rc = FAIL;
			goto out;
		}
		say("evilpeer: %d questions answered", asks);
		if (how == Q_HOLD_FLOOD) {
			rc = PASS;
			goto out;
		}
		name[255] = 'j';        /* 256 bytes: not a name */
		name[256] = '\0';
		msg_init(&m, MSG_HOLD_REQ);
		msg_put_str(&m, K_JOB, name);
		msg_put_str(&m, K_STEP, c->step);
		rc = sendm(c, &m) < 0 ? FAIL : expect_refusal(c, true);
		goto out;
	}
	fetch_msg(c, &m, origin, job, step, root, rel, off, size);
	rc = sendm(c, &m) < 0 ? FAIL : expect_refusal(c, true);
out:
	free(mf.p);
	free(got.p);
	return rc ? FAIL : PASS;
}

/* ---- scenarios: relays asked for what they may not do ---- */

enum { RL_OK, RL_UNKNOWN, RL_SELF, RL_TWICE, RL_TYPE, RL_PAYLOAD, RL_NO_TIMEOUT };

/* A MSG_RELAY asking the peer to pass a question about --job/--step on to
 * the nodes named (NULL-terminated). */
static void relay_msg(const struct ctx *c, struct msg *m, const char *const *names,
		      uint16_t type, bool timeout, bool garbage)
{
	struct msg q;

	msg_init(&q, MSG_HOLD_REQ);
	msg_put_str(&q, K_JOB, c->job);
	msg_put_str(&q, K_STEP, c->step);
	msg_init(m, MSG_RELAY);
	if (timeout)
		msg_put_u64(m, K_TIMEOUT_MS, 10000);
	for (size_t i = 0; names[i]; i++)
		msg_put_str(m, K_NAME, names[i]);
	msg_put_u64(m, K_TYPE, type);
	if (garbage)
		msg_put_bytes(m, K_DATA, "\x01\x00\x00\x00\xff\xff\xff\x7f", 8);
	else
		msg_put_bytes(m, K_DATA, q.buf, q.len);
	msg_free(&q);
}

static int scn_relay(struct ctx *c, int how)
{
	const char *other[] = { c->other, NULL }, *unknown[] = { "no-such-node", NULL },
		   *self[] = { c->peer, NULL }, *twice[] = { c->other, c->other, NULL };
	struct msg m;
	int seen = 0;

	switch (how) {
	case RL_OK:
		relay_msg(c, &m, other, MSG_HOLD_REQ, true, false);
		if (sendm(c, &m) < 0)
			return FAIL;
		/* One answer for the relay, one for the other node, then END. */
		while (answer(c, &m) == 0) {
			uint16_t t = m.type;

			seen += t == MSG_RELAY_ANS;
			msg_free(&m);
			if (t == MSG_END)
				break;
			if (t != MSG_RELAY_ANS) {
				say("FAIL: %s among the relayed answers", type_name(t));
				return FAIL;
			}
		}
		say(seen == 2 ? "PASS: 2 answers relayed" : "FAIL: %d answers relayed", seen);
		return seen == 2 ? PASS : FAIL;
	case RL_UNKNOWN: relay_msg(c, &m, unknown, MSG_HOLD_REQ, true, false); break;
	case RL_SELF: relay_msg(c, &m, self, MSG_HOLD_REQ, true, false); break;
	case RL_TWICE: relay_msg(c, &m, twice, MSG_HOLD_REQ, true, false); break;
	case RL_TYPE: relay_msg(c, &m, other, MSG_FETCH_REQ, true, false); break;
	case RL_PAYLOAD: relay_msg(c, &m, other, MSG_HOLD_REQ, true, true); break;
	case RL_NO_TIMEOUT: relay_msg(c, &m, other, MSG_HOLD_REQ, false, false); break;
	}
	return sendm(c, &m) < 0 ? FAIL : expect_refusal(c, true);
}

/* ---- scenarios: streams (docs/PROTOCOL.md, "Streams") ---- */

enum { S_NO_OFFER, S_TOO_MANY, S_INDEX_RANGE, S_OUT_OF_TURN, S_CHUNK_SPLIT, S_MARK_UNASKED };

/* MSG_STREAM on c for the offer of c->step, stream idx. */
static int stream_attach(struct ctx *c, digest_t root, uint64_t idx)
{
	char hex[DIGEST_HEX_LEN + 1];
	struct msg m;

	digest_to_hex(root, hex);
	msg_init(&m, MSG_STREAM);
	msg_put_str(&m, K_JOB, c->job);
	msg_put_str(&m, K_STEP, c->step);
	msg_put_str(&m, K_ROOT, hex);
	msg_put_u64(&m, K_INDEX, idx);
	return sendm(c, &m);
}

static int scn_stream(struct ctx *c, int how)
{
	struct ent v[E_COUNT];
	struct buf mf = { 0 };
	struct want w = { 0 };
	struct ctx c2;
	struct msg m;
	digest_t root;
	int rc, verdict;

	manifest(c, &mf, v, std_tree(c, v), CHUNK, &root);
	if (how == S_NO_OFFER) {        /* a stream of an offer nobody made */
		free(mf.p);
		rc = stream_attach(c, root, 1);
		return rc < 0 ? FAIL : expect_refusal(c, true);
	}
	offer_fields(c, &m, root, mf.n);
	msg_put_u64(&m, K_STREAMS, how == S_TOO_MANY ? 17 : 2);
	if (how == S_MARK_UNASKED)
		msg_put_u64(&m, K_RESTREAM, 1);
	rc = sendm(c, &m);
	if (how == S_TOO_MANY) {
		if (rc == 0)
			send_slices(c, mf.p, mf.n, 0);
		free(mf.p);
		return expect_refusal(c, true);
	}
	rc = rc ? rc : send_slices(c, mf.p, mf.n, 0);
	free(mf.p);
	if (rc < 0 || get_want(c, &w) < 0 || w.code != 0) {
		say("FAIL: the daemon did not take a well-formed offer on 2 streams");
		free(w.held);
		return FAIL;
	}
	free(w.held);
	/* The second connection, a stream of this offer. */
	c2 = *c;
	c2.x = NULL;
	if (dial(&c2) < 0)
		return SETUP;
	if (how == S_INDEX_RANGE) {     /* stream 2 of an offer of 2 */
		rc = stream_attach(&c2, root, 2);
		verdict = rc < 0 ? FAIL : expect_refusal(&c2, true);
		c2.x->ops->close(c2.x);
		return verdict;
	}
	if (how == S_CHUNK_SPLIT) {
		/* A chunk's two halves on two streams: the first half does
		 * not end the chunk, so the second is stream 0's too; stream
		 * 0 ends instead, with stream 1's piece still to be taken. */
		rc = stream_attach(&c2, root, 1);
		rc = rc ? rc : send_bytes(&c2, E_A, CHUNK / 2, CHUNK, UINT64_MAX);
		msg_init(&m, MSG_END);
		rc = rc ? rc : sendm(&c2, &m);
		rc = rc ? rc : send_bytes(c, E_A, 0, CHUNK / 2, UINT64_MAX);
		msg_init(&m, MSG_END);
		rc = rc ? rc : sendm(c, &m);
		if (rc < 0 && rc != -EPIPE && rc != -ECONNRESET)
			say("evilpeer: sending: %s", strerror(-rc));
		verdict = expect_refusal(c, true);
		c2.x->ops->close(c2.x);
		return verdict;
	}
	if (how == S_MARK_UNASKED) {
		/* A hand-off's mark on stream 1 that no MSG_RESTREAM asked
		 * for; then stream 0's whole chunk passes the turn to it. */
		rc = stream_attach(&c2, root, 1);
		msg_init(&m, MSG_MARK);
		msg_put_u64(&m, K_CODE, 1);
		rc = rc ? rc : sendm(&c2, &m);
		rc = rc ? rc : send_bytes(c, E_A, 0, CHUNK, UINT64_MAX);
		if (rc < 0 && rc != -EPIPE && rc != -ECONNRESET)
			say("evilpeer: sending: %s", strerror(-rc));
		verdict = expect_refusal(c, true);
		c2.x->ops->close(c2.x);
		return verdict;
	}
	/* S_OUT_OF_TURN: stream 1 ends at once, stream 0 sends piece 0 (a
	 * whole chunk) and then piece 1, whose turn was stream 1's: the turns
	 * ended at piece 1, so stream 0's next frame must be MSG_END. */
	rc = stream_attach(&c2, root, 1);
	msg_init(&m, MSG_END);
	rc = rc ? rc : sendm(&c2, &m);
	rc = rc ? rc : send_bytes(c, E_A, 0, CHUNK, UINT64_MAX);
	rc = rc ? rc : send_bytes(c, E_A, CHUNK, 2 * CHUNK, UINT64_MAX);
	if (rc < 0 && rc != -EPIPE && rc != -ECONNRESET)
		say("evilpeer: sending: %s", strerror(-rc));
	verdict = expect_refusal(c, true);
	c2.x->ops->close(c2.x);
	return verdict;
}

/* ---- the table ---- */

const struct scenario evil_scenarios[] = {
	{ "offer_ok", scn_offer, O_OK },
	{ "stream_no_offer", scn_stream, S_NO_OFFER },
	{ "stream_too_many", scn_stream, S_TOO_MANY },
	{ "stream_index_range", scn_stream, S_INDEX_RANGE },
	{ "stream_out_of_turn", scn_stream, S_OUT_OF_TURN },
	{ "stream_chunk_split", scn_stream, S_CHUNK_SPLIT },
	{ "stream_mark_unasked", scn_stream, S_MARK_UNASKED },
	{ "offer_setid", scn_offer, O_SETID },
	{ "offer_unknown_keys", scn_offer, O_UNKNOWN_KEYS },
	{ "offer_other_origin", scn_offer, O_OTHER_ORIGIN },
	{ "offer_dup_origin", scn_offer, O_DUP_ORIGIN },
	{ "offer_bad_job", scn_offer, O_BAD_JOB },
	{ "offer_bad_step", scn_offer, O_BAD_STEP },
	{ "offer_bad_root", scn_offer, O_BAD_ROOT },
	{ "offer_no_size", scn_offer, O_NO_SIZE },
	{ "offer_size_4_bytes", scn_offer, O_SIZE_4B },
	{ "offer_size_zero", scn_offer, O_SIZE_ZERO },
	{ "offer_size_huge", scn_offer, O_SIZE_HUGE },
	{ "path_dotdot", scn_manifest, M_DOTDOT },
	{ "path_absolute", scn_manifest, M_ABS },
	{ "path_inner_dotdot", scn_manifest, M_INNER_DOTDOT },
	{ "path_stage", scn_manifest, M_STAGE },
	{ "path_dot", scn_manifest, M_DOT },
	{ "path_empty_component", scn_manifest, M_EMPTY_COMP },
	{ "path_beneath_link", scn_manifest, M_LINK_BENEATH },
	{ "mf_garbage", scn_manifest, M_GARBAGE },
	{ "mf_truncated", scn_manifest, M_TRUNCATED },
	{ "mf_short", scn_manifest, M_SHORT },
	{ "mf_overrun", scn_manifest, M_OVERRUN },
	{ "mf_bad_offset", scn_manifest, M_BAD_OFFSET },
	{ "mf_root_mismatch", scn_manifest, M_ROOT_MISMATCH },
	{ "mf_long_line", scn_manifest, M_LONG_LINE },
	{ "mf_huge_file", scn_manifest, M_HUGE_FILE },
	{ "data_bad_chunk", scn_data, D_BAD_CHUNK },
	{ "data_bad_frame", scn_data, D_BAD_FRAME },
	{ "data_bad_digest", scn_data, D_BAD_DIGEST },
	{ "data_past_end", scn_data, D_PAST_END },
	{ "data_index_range", scn_data, D_INDEX_RANGE },
	{ "data_index_huge", scn_data, D_INDEX_HUGE },
	{ "data_not_file", scn_data, D_NOT_FILE },
	{ "data_gap", scn_data, D_GAP },
	{ "data_backwards", scn_data, D_BACKWARDS },
	{ "data_duplicate", scn_data, D_DUP },
	{ "data_end_early", scn_data, D_END_EARLY },
	{ "data_end_mid_file", scn_data, D_END_MID },
	{ "data_bomb", scn_data, D_BOMB },
	{ "data_no_fields", scn_data, D_NO_FIELDS },
	{ "data_zero_length", scn_data, D_ZERO },
	{ "data_unknown_type", scn_data, D_UNKNOWN_TYPE },
	{ "data_done_from_sender", scn_data, D_DONE },
	{ "frame_unknown_first", scn_frame, F_UNKNOWN_FIRST },
	{ "frame_data_first", scn_frame, F_DATA_FIRST },
	{ "frame_hello_again", scn_frame, F_HELLO_AGAIN },
	{ "frame_oversized", scn_frame, F_OVERSIZED },
	{ "frame_reserved", scn_frame, F_RESERVED },
	{ "frame_unsealed", scn_frame, F_UNSEALED },
	{ "frame_oversized_mid_offer", scn_frame, F_OVERSIZED_MID },
	{ "fetch_manifest_ok", scn_fetch, Q_MANIFEST_OK },
	{ "fetch_range_ok", scn_fetch, Q_RANGE_OK },
	{ "fetch_range_no_sum", scn_fetch, Q_RANGE_NO_SUM },
	{ "fetch_dotdot", scn_fetch, Q_DOTDOT },
	{ "fetch_absolute", scn_fetch, Q_ABS },
	{ "fetch_inner_dotdot", scn_fetch, Q_INNER_DOTDOT },
	{ "fetch_stage", scn_fetch, Q_STAGE },
	{ "fetch_via_link", scn_fetch, Q_VIA_LINK },
	{ "fetch_link", scn_fetch, Q_LINK },
	{ "fetch_dir", scn_fetch, Q_DIR },
	{ "fetch_other_origin", scn_fetch, Q_OTHER_ORIGIN },
	{ "fetch_wrong_root", scn_fetch, Q_WRONG_ROOT },
	{ "fetch_no_step", scn_fetch, Q_NO_STEP },
	{ "fetch_past_end", scn_fetch, Q_PAST_END },
	{ "fetch_huge_size", scn_fetch, Q_HUGE_SIZE },
	{ "fetch_huge_offset", scn_fetch, Q_HUGE_OFF },
	{ "fetch_bad_job", scn_fetch, Q_BAD_JOB },
	{ "hold_bad_job", scn_fetch, Q_HOLD_BAD },
	{ "hold_flood", scn_fetch, Q_HOLD_FLOOD },
	{ "hold_names", scn_fetch, Q_HOLD_NAMES },
	{ "relay_ok", scn_relay, RL_OK },
	{ "relay_unknown_node", scn_relay, RL_UNKNOWN },
	{ "relay_self", scn_relay, RL_SELF },
	{ "relay_twice", scn_relay, RL_TWICE },
	{ "relay_not_relayed", scn_relay, RL_TYPE },
	{ "relay_bad_question", scn_relay, RL_PAYLOAD },
	{ "relay_no_timeout", scn_relay, RL_NO_TIMEOUT },
	{ "recv_held_all", scn_recv, V_HELD_ALL },
	{ "recv_held_long", scn_recv, V_HELD_LONG },
	{ "recv_held_short", scn_recv, V_HELD_SHORT },
	{ "recv_want_beyond", scn_recv, V_WANT_BEYOND },
	{ "recv_vanish_mid", scn_recv, V_VANISH_MID },
	{ "recv_no_sum", scn_recv, V_NO_SUM },
	{ "recv_refuse", scn_recv, V_REFUSE },
	{ "recv_hold_garbage", scn_recv, V_HOLD_GARBAGE },
	{ "recv_hold_flood", scn_recv, V_HOLD_FLOOD },
};
const size_t evil_nscenarios = sizeof(evil_scenarios) / sizeof(evil_scenarios[0]);
