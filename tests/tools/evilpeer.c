/* evilpeer: a node that holds the cluster key and misbehaves on purpose.
 *
 * docs/SECURITY.md trusts every holder of the cluster key alike, but a
 * daemon must still refuse what such a peer sends against the protocol
 * (paths that escape, manifests that do not read, pieces that do not match,
 * requests outside what it serves) without writing outside replica_root,
 * crashing, or stopping serving. This tool is that peer, for
 * tests/integration/test_evil_peer.py. It links the daemon's own handshake,
 * sealing, TCP transport, frames, manifest escaping and codec from the
 * project's archives, so everything it sends is what a real node sends
 * except the lie each scenario tells, and no crypto is written twice.
 *
 *   evilpeer [--job J] [--step S] [--outside DIR] [--count N] CONFIG PEER SCENARIO
 *
 * CONFIG is a staged config file (this node's name, hosts file, key file and
 * listen address); PEER the node to talk to, or for the recv_* scenarios the
 * node that must connect to us (we are its partner). --step defaults to the
 * scenario's name, so that a test can tell every scenario's copy apart;
 * --outside is where hostile paths and links point (a directory the test
 * watches). Prints what the daemon answered; exits 0 when the daemon did
 * what the scenario expects from the wire (refused, closed, or for the
 * *_ok controls: accepted), 1 when it did not, 2 when the tool could not run.
 * `evilpeer --list` prints the scenarios.
 */
#include "tests/tools/evilpeer.h"

#include <getopt.h>

/* ---- a growable text buffer ---- */

void bput(struct buf *b, const void *p, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;

		while (cap < b->n + n + 1)
			cap *= 2;
		if (!(b->p = realloc(b->p, cap))) {
			perror("evilpeer: realloc");
			exit(SETUP);
		}
		b->cap = cap;
	}
	memcpy(b->p + b->n, p, n);
	b->n += n;
	b->p[b->n] = '\0';
}

void bprintf(struct buf *b, const char *fmt, ...)
{
	char tmp[3 * MF_MAX_PATH + 256];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	bput(b, tmp, n < (int)sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

/* ---- trees and their manifests, written by hand ----
 * By hand rather than with mf_writer, which refuses the entries a hostile
 * manifest needs; the trailer (root, count, text digest) is computed as the
 * reader checks it, so a refusal is about the entries, never the seal. */


static uint8_t gen_byte(uint64_t seed, uint64_t i)
{
	uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;

	x ^= x >> 31;
	x *= 0xBF58476D1CE4E5B9ull;
	return (uint8_t)(x ^ (x >> 29));
}

/* Bytes [off, off + n) of entry idx's content. */
void gen(const struct ctx *c, size_t idx, uint64_t off, uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = gen_byte(c->seed + idx * 0x100000001b3ull, off + i);
}

uint64_t nchunks(uint64_t size, uint64_t chunk)
{
	return size > chunk ? (size + chunk - 1) / chunk : 0;
}

static void put_path(struct buf *b, const char *raw)
{
	char esc[3 * MF_MAX_PATH + 1];
	int n = mf_escape(raw, strlen(raw), esc, sizeof(esc));

	bput(b, esc, n < 0 ? 0 : (size_t)n);
}

/* The manifest of v[0..n) with its trailer; *root its root digest. */
void manifest(const struct ctx *c, struct buf *b, const struct ent *v, size_t n,
		     uint64_t chunk, digest_t *root)
{
	static const digest_t fake = { .low64 = 0x5eed, .high64 = 0xbad };
	uint8_t *blk = malloc(1 << 16);
	char hex[DIGEST_HEX_LEN + 1], thex[DIGEST_HEX_LEN + 1];
	struct mf_root r;

	if (!blk || mf_root_init(&r) < 0)
		exit(SETUP);
	bprintf(b, "stage-manifest 1\nchunk %llu\n", (unsigned long long)chunk);
	for (size_t i = 0; i < n; i++) {
		const struct ent *e = &v[i];
		struct mf_entry me = { .type = e->type, .path = (char *)e->path };
		uint64_t k = e->type == 'f' ? nchunks(e->size, chunk) : 0;
		digest_t *cd = calloc(k ? k : 1, sizeof(*cd));

		if (!cd)
			exit(SETUP);
		if (e->type == 'f' && !e->fake) {
			XXH3_state_t *w = XXH3_createState(), *cs = XXH3_createState();

			XXH3_128bits_reset(w);
			XXH3_128bits_reset(cs);
			for (uint64_t off = 0; off < e->size;) {
				size_t len = e->size - off < (1 << 16) ? (size_t)(e->size - off) : 1 << 16;
				uint64_t ce = (off / chunk + 1) * chunk;

				if (len > ce - off)
					len = (size_t)(ce - off);        /* stop where a chunk ends */
				gen(c, i, off, blk, len);
				XXH3_128bits_update(w, blk, len);
				XXH3_128bits_update(cs, blk, len);
				off += len;
				if (k && (off % chunk == 0 || off == e->size)) {
					cd[(off - 1) / chunk] = XXH3_128bits_digest(cs);
					XXH3_128bits_reset(cs);
				}
			}
			me.digest = XXH3_128bits_digest(w);
			XXH3_freeState(w);
			XXH3_freeState(cs);
		} else if (e->type == 'f') {
			me.digest = fake;
			for (uint64_t j = 0; j < k; j++)
				cd[j] = fake;
		} else if (e->type == 'l') {
			me.digest = digest_of(e->target, strlen(e->target));
		}
		me.size = e->type == 'f' ? e->size : e->type == 'l' ? strlen(e->target) : 0;
		mf_root_add(&r, &me);
		bput(b, &e->type, 1);
		bput(b, " ", 1);
		put_path(b, e->path);
		digest_to_hex(me.digest, hex);
		me.mode = e->mode ? e->mode : e->type == 'd' ? 0755 : e->type == 'f' ? 0644 : 0777;
		if (e->type == 'd')
			bprintf(b, " 0%o %lld\n", me.mode, MTIME);
		else
			bprintf(b, " %llu 0%o %lld %s", (unsigned long long)me.size, me.mode, MTIME,
				hex);
		if (e->type == 'l') {
			bput(b, " ", 1);
			put_path(b, e->target);
		}
		if (e->type != 'd')
			bput(b, "\n", 1);
		for (uint64_t j = 0; j < k; j++) {
			digest_to_hex(cd[j], hex);
			bprintf(b, "c %s\n", hex);
		}
		free(cd);
	}
	*root = mf_root_final(&r);
	digest_to_hex(*root, hex);
	digest_to_hex(digest_of(b->p, b->n), thex);
	bprintf(b, "end %s %zu %s\n", hex, n, thex);
	free(blk);
}

/* The standard tree every data scenario offers: a directory, a file of three
 * chunks, a small file, a link inside, a link pointing at --outside, and an
 * empty file. Its entry indices are the K_FILE values below. */

size_t std_tree(const struct ctx *c, struct ent v[E_COUNT])
{
	v[E_DIR] = (struct ent){ 'd', "dir", 0, NULL, false, 0 };
	v[E_A] = (struct ent){ 'f', "dir/a.bin", A_SIZE, NULL, false, 0 };
	v[E_B] = (struct ent){ 'f', "dir/b.bin", B_SIZE, NULL, false, 0 };
	v[E_LINK] = (struct ent){ 'l', "dir/link", 0, "a.bin", false, 0 };
	v[E_OUT] = (struct ent){ 'l', "dir/out", 0, c->outside, false, 0 };
	v[E_EMPTY] = (struct ent){ 'f', "empty", 0, NULL, false, 0 };
	return E_COUNT;
}

/* ---- the connection ---- */

const char *type_name(uint16_t t)
{
	static char other[32];

	switch (t) {
	case MSG_OFFER: return "OFFER";
	case MSG_MANIFEST: return "MANIFEST";
	case MSG_WANT: return "WANT";
	case MSG_DATA: return "DATA";
	case MSG_END: return "END";
	case MSG_DONE: return "DONE";
	case MSG_ERROR: return "ERROR";
	case MSG_HOLD: return "HOLD";
	case MSG_RELAY_ANS: return "RELAY_ANS";
	default:
		snprintf(other, sizeof(other), "type %u", t);
		return other;
	}
}

void say(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

int dial(struct ctx *c)
{
	char why[512], name[AUTH_NAME_MAX + 1];
	int rc = xport_tcp_ops.connect(c->ph, 5000, &c->x, why, sizeof(why));

	if (rc == 0) {
		rc = peer_handshake(&c->x, &c->key, peer_wire_of(c->cfg.wire), c->cfg.name, &c->hosts, c->peer, 10000, name,
				    sizeof(name), why, sizeof(why));
		if (rc < 0) {
			c->x->ops->close(c->x);
			c->x = NULL;
		}
	}
	if (rc < 0) {
		say("evilpeer: cannot reach %s as %s: %s", c->peer, c->cfg.name, why);
		return -1;
	}
	c->x->ops->set_timeout(c->x, ANSWER_MS);
	say("evilpeer: connected to %s as %s (sealed)", c->peer, c->cfg.name);
	return 0;
}

int sendm(struct ctx *c, struct msg *m)
{
	int rc = c->x->ops->send(c->x, m);

	msg_free(m);
	return rc;
}

/* The socket under the sealed connection, to write what no xport would:
 * a frame the framing layer refuses. The only TCP socket to the peer's port. */
int raw_fd(const struct ctx *c)
{
	for (int fd = 3; fd < 1024; fd++) {
		struct sockaddr_storage ss;
		socklen_t len = sizeof(ss);
		struct stat st;

		if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode) ||
		    getpeername(fd, (struct sockaddr *)&ss, &len) < 0)
			continue;
		if ((ss.ss_family == AF_INET &&
		     ntohs(((struct sockaddr_in *)&ss)->sin_port) == c->ph->port) ||
		    (ss.ss_family == AF_INET6 &&
		     ntohs(((struct sockaddr_in6 *)&ss)->sin6_port) == c->ph->port))
			return fd;
	}
	return -1;
}

/* Prints one frame from the daemon. */
void show(const struct msg *m)
{
	char text[PEER_TEXT_MAX + 1];
	uint64_t a = 0, b = 0, d = 0;
	const uint8_t *p;
	size_t n = 0;

	if (m->type == MSG_ERROR) {
		int err = -peer_error_of(m, text);

		say("answer: ERROR errno=%d (%s): %s", err, strerror(err), text);
	} else if (m->type == MSG_WANT) {
		msg_get_u64(m, K_CODE, &a);
		msg_get_u64(m, K_FILE, &b);
		msg_get_u64(m, K_OFFSET, &d);
		if (msg_get_bytes(m, K_HELD, &p, &n) < 0)
			n = 0;
		say("answer: WANT code=%llu file=%llu offset=%llu held=%zu bytes",
		    (unsigned long long)a, (unsigned long long)b, (unsigned long long)d, n);
	} else if (m->type == MSG_DONE) {
		msg_get_u64(m, K_CODE, &a);
		say("answer: DONE code=%llu", (unsigned long long)a);
	} else {
		say("answer: %s (%zu payload bytes)", type_name(m->type), m->len);
	}
}

/* The next frame, shown. 0, or -errno (closed, timed out) said. */
int answer(struct ctx *c, struct msg *m)
{
	int rc = c->x->ops->recv(c->x, m);

	/* A refusal while we were still sending breaks our send first: its
	 * last words are still in the inbound stream. */
	if (rc < 0 && rc != -ETIMEDOUT && c->x->ops->recv_last &&
	    c->x->ops->recv_last(c->x, m, 2000) == 0)
		rc = 0;
	if (rc == 0)
		show(m);
	else if (rc == -ETIMEDOUT)
		say("answer: none within %d ms", ANSWER_MS);
	else
		say("answer: the connection closed (%s)", strerror(-rc));
	return rc;
}

/* The scenario lied: the daemon must refuse. need_error: with MSG_ERROR (a
 * refusal the protocol layer can word); else closing is enough (a frame
 * the framing layer refuses whole cannot be answered). */
int expect_refusal(struct ctx *c, bool need_error)
{
	struct msg m;
	int rc = answer(c, &m);

	if (rc == -ETIMEDOUT) {
		say("FAIL: the daemon neither refused nor closed");
		return FAIL;
	}
	if (rc < 0) {
		if (need_error) {
			say("FAIL: the daemon closed without saying why");
			return FAIL;
		}
		say("PASS: closed");
		return PASS;
	}
	rc = m.type == MSG_ERROR ? PASS : FAIL;
	msg_free(&m);
	if (rc == FAIL) {
		say("FAIL: the daemon accepted it");
		return FAIL;
	}
	/* After its refusal the daemon closes: nothing more may come. */
	c->x->ops->set_timeout(c->x, 5000);
	if (c->x->ops->recv(c->x, &m) == 0) {
		say("FAIL: a frame after the refusal: %s", type_name(m.type));
		msg_free(&m);
		return FAIL;
	}
	say("PASS: refused");
	return PASS;
}

/* ---- offers ---- */

void offer_fields(const struct ctx *c, struct msg *m, digest_t root, uint64_t size)
{
	char hex[DIGEST_HEX_LEN + 1];

	digest_to_hex(root, hex);
	msg_init(m, MSG_OFFER);
	msg_put_str(m, K_ORIGIN, c->cfg.name);
	msg_put_str(m, K_JOB, c->job);
	msg_put_str(m, K_STEP, c->step);
	msg_put_str(m, K_ROOT, hex);
	msg_put_u64(m, K_SIZE, size);
}

int send_slices(struct ctx *c, const char *p, size_t n, uint64_t base)
{
	for (size_t off = 0; off < n; off += SLICE) {
		struct msg m;
		size_t len = n - off < SLICE ? n - off : SLICE;
		int rc;

		msg_init(&m, MSG_MANIFEST);
		msg_put_u64(&m, K_OFFSET, base + off);
		rc = c->x->ops->send_tail(c->x, &m, K_DATA, p + off, len);
		msg_free(&m);
		if (rc < 0)
			return rc;
	}
	return 0;
}


/* Waits for WANT: 0, or -EPROTO (something else came; said). */
int get_want(struct ctx *c, struct want *w)
{
	const uint8_t *p;
	struct msg m;
	size_t n;

	memset(w, 0, sizeof(*w));
	if (answer(c, &m) < 0)
		return -EPROTO;
	if (m.type != MSG_WANT) {
		msg_free(&m);
		return -EPROTO;
	}
	msg_get_u64(&m, K_CODE, &w->code);
	msg_get_u64(&m, K_FILE, &w->file);
	msg_get_u64(&m, K_OFFSET, &w->off);
	w->frame_sum = 1;
	msg_get_u64(&m, K_FRAME_SUM, &w->frame_sum);
	/* msg_get_bytes writes its outputs even when the key is absent */
	if (msg_get_bytes(&m, K_HELD, &p, &n) == 0 && n) {
		w->held = malloc(n);
		w->nheld = n;
		memcpy(w->held, p, n);
	}
	msg_free(&m);
	return 0;
}

/* The standard tree offered (with extra fields from the caller when m is
 * given already built), up to its WANT. */
int offer_std(struct ctx *c, struct ent *v, struct buf *mf, digest_t *root,
		     struct want *w)
{
	struct msg m;
	size_t n = std_tree(c, v);

	manifest(c, mf, v, n, CHUNK, root);
	offer_fields(c, &m, *root, mf->n);
	if (sendm(c, &m) < 0 || send_slices(c, mf->p, mf->n, 0) < 0 || get_want(c, w)) {
		say("FAIL: the daemon did not accept a well-formed offer (a broken control)");
		return -EPROTO;
	}
	return 0;
}

int frame_raw(const uint8_t *p, size_t n, bool no_sum, uint8_t *raw, size_t cap, size_t *got)
{
	struct codec_chunk_hdr h;
	size_t used;

	if (codec_chunk_parse_hdr(p, n, &h) < 0 || (no_sum && h.digest != 0))
		return -EBADMSG;
	return no_sum ? codec_chunk_decode_unchecked(p, n, raw, cap, got, &used) :
			codec_chunk_decode(p, n, raw, cap, got, &used);
}

int send_piece_as(struct ctx *c, uint64_t idx, uint64_t off, const uint8_t *raw,
			 size_t n, const struct codec_ops *codec, enum damage damage)
{
	struct codec_params cp = { .dtype = CODEC_DT_BYTES };
	size_t cap = codec_chunk_bound(n), flen;
	uint8_t *frame = malloc(cap);
	struct msg m;
	int rc = frame ? codec_chunk_encode(raw, n, codec, &cp, frame, cap, &flen) : -ENOMEM;

	if (rc == 0) {
		if (damage == DAMAGE_PAYLOAD)   /* its last byte */
			frame[flen - 1] ^= 0x40;
		else if (damage == DAMAGE_DIGEST)   /* the XXH3-64 field, the bytes right */
			frame[16] ^= 0x40;
		msg_init(&m, MSG_DATA);
		msg_put_u64(&m, K_FILE, idx);
		msg_put_u64(&m, K_OFFSET, off);
		rc = c->x->ops->send_tail(c->x, &m, K_DATA, frame, flen);
		msg_free(&m);
	}
	free(frame);
	return rc;
}

/* Bytes [a, b) of entry idx, in pieces, the right ones (flip: one byte
 * wrong at offset flip, when flip is within [a, b)). */
int send_bytes(struct ctx *c, uint64_t idx, uint64_t a, uint64_t b, uint64_t flip)
{
	uint8_t *p = malloc(PIECE);
	int rc = 0;

	while (p && rc == 0 && a < b) {
		size_t n = b - a < PIECE ? (size_t)(b - a) : PIECE;

		gen(c, idx, a, p, n);
		if (flip >= a && flip < a + n)
			p[flip - a] ^= 0x01;
		rc = send_piece_as(c, idx, a, p, n, &codec_none_ops, false);
		a += n;
	}
	free(p);
	return p ? rc : -ENOMEM;
}

/* Everything the WANT asks for, as a real sender: from its resume point,
 * leaving out the chunks it holds. */
int send_wanted(struct ctx *c, const struct ent *v, size_t n, const struct want *w)
{
	uint64_t g = 0;
	int rc = 0;

	for (size_t i = 0; i < n && rc == 0; i++) {
		uint64_t size = v[i].size, k = nchunks(size, CHUNK), span = k ? CHUNK : size;

		if (v[i].type != 'f' || size == 0)
			continue;
		for (uint64_t j = 0; j < (k ? k : 1) && rc == 0 && i >= w->file; j++) {
			uint64_t a = j * span, b = a + span < size ? a + span : size;
			uint64_t from = i == w->file ? w->off : 0;

			if (b <= from || have_bit(w->held, w->nheld, g + j))
				continue;
			rc = send_bytes(c, i, a < from ? from : a, b, UINT64_MAX);
		}
		g += k ? k : 1;
	}
	return rc;
}

int end_and_done(struct ctx *c)
{
	struct msg m;
	uint64_t code = 1;
	int rc;

	msg_init(&m, MSG_END);
	if (sendm(c, &m) < 0 || answer(c, &m) < 0)
		return FAIL;
	rc = m.type == MSG_DONE && msg_get_u64(&m, K_CODE, &code) == 0 && code == 0 ? PASS : FAIL;
	msg_free(&m);
	say(rc == PASS ? "PASS: published" : "FAIL: the copy was not confirmed");
	return rc;
}

static int usage(FILE *f)
{
	fprintf(f, "usage: evilpeer [--job J] [--step S] [--outside DIR] [--count N] "
		"CONFIG PEER SCENARIO\n       evilpeer --list\n");
	return SETUP;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "job", required_argument, NULL, 'j' }, { "step", required_argument, NULL, 's' },
		{ "outside", required_argument, NULL, 'o' }, { "count", required_argument, NULL, 'n' },
		{ "list", no_argument, NULL, 'l' }, { NULL, 0, NULL, 0 },
	};
	struct ctx c = { .job = "evil-job", .outside = "/nonexistent-evilpeer" };
	const struct scenario *s = NULL;
	char err[1024];
	ssize_t pi;
	int o, rc;

	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 'j': c.job = optarg; break;
		case 's': c.step = optarg; break;
		case 'o': c.outside = optarg; break;
		case 'n': c.count = atoi(optarg); break;
		case 'l':
			for (size_t i = 0; i < evil_nscenarios; i++)
				puts(evil_scenarios[i].name);
			return 0;
		default: return usage(stderr);
		}
	}
	if (argc - optind != 3)
		return usage(stderr);
	c.peer = argv[optind + 1];
	for (size_t i = 0; i < evil_nscenarios; i++)
		if (strcmp(evil_scenarios[i].name, argv[optind + 2]) == 0)
			s = &evil_scenarios[i];
	if (!s) {
		fprintf(stderr, "evilpeer: no scenario '%s' (--list)\n", argv[optind + 2]);
		return SETUP;
	}
	if (!c.step)
		c.step = s->name;
	c.seed = XXH3_64bits(c.step, strlen(c.step)) ^ XXH3_64bits(c.job, strlen(c.job));
	signal(SIGPIPE, SIG_IGN);
	if (config_defaults(&c.cfg) < 0 || config_load(&c.cfg, argv[optind], err, sizeof(err)) < 0 ||
	    hosts_load(&c.hosts, c.cfg.hosts, err, sizeof(err)) < 0 ||
	    auth_key_load(&c.key, c.cfg.key_file, err, sizeof(err)) < 0) {
		fprintf(stderr, "evilpeer: %s\n", err);
		return SETUP;
	}
	pi = hosts_find(&c.hosts, c.peer);
	if (pi < 0) {
		fprintf(stderr, "evilpeer: %s is not in %s\n", c.peer, c.cfg.hosts);
		return SETUP;
	}
	c.ph = &c.hosts.v[pi];
	for (size_t i = 0; i < c.hosts.n && !c.other; i++)
		if (strcmp(c.hosts.v[i].name, c.peer) && strcmp(c.hosts.v[i].name, c.cfg.name))
			c.other = c.hosts.v[i].name;
	if (!c.other)
		c.other = c.peer;
	say("evilpeer: %s as %s against %s (job %s, step %s)", s->name, c.cfg.name, c.peer, c.job,
	    c.step);
	if (strncmp(s->name, "recv_", 5) == 0)      /* we are the one dialled */
		rc = s->run(&c, s->how);
	else
		rc = dial(&c) < 0 ? SETUP : s->run(&c, s->how);
	if (c.x)
		c.x->ops->close(c.x);
	auth_key_free(&c.key);
	hosts_free(&c.hosts);
	config_free(&c.cfg);
	codec_thread_end();
	return rc;
}
