/* The cluster key and the mutual challenge-response of docs/PROTOCOL.md
 * ("Peer authentication").
 *
 * Invariants of a session:
 * - my_nonce is fresh from randombytes_buf at auth_begin and never reused;
 *   a session runs one handshake, then is ended.
 * - The peer's HELLO is accepted only with the other role, another name and
 *   another nonce than ours: our own HELLO sent back is refused before any
 *   MAC is made.
 * - A PROOF's MAC binds the prover's role, both names and both nonces, so it
 *   verifies in exactly one direction of one connection.
 * - Any failed input moves to FAILED, for good: one guess per connection.
 * - peer_name is exposed only in DONE.
 *
 * States: step counts the messages exchanged (0..4); each role has a script
 * saying which call makes each step, and a call that is not the next one in
 * the script is -EPROTO.
 *
 *   step  initiator        responder
 *    0    auth_hello       auth_on_hello
 *    1    auth_on_hello    auth_hello
 *    2    auth_proof       auth_on_proof   (the responder checks first)
 *    3    auth_on_proof    auth_proof
 *    4    DONE             DONE
 *   any auth_on_* failure: FAILED (every later call -EPROTO)
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "common/auth.h"
#include "common/seal.h"

#define KEY_LABEL "stage cluster key v1"
#define MAC_LABEL "stage auth v2"
#define SESSION_LABEL "stage session v2"

enum { MSG_HELLO = 1, MSG_PROOF = 2 };
enum { ROLE_INITIATOR = 1, ROLE_RESPONDER = 2 };
#define AUTH_VERSION 2
#define AUTH_STEPS 4
#define STEP_FAILED (-1)

enum op { OP_HELLO, OP_ON_HELLO, OP_PROOF, OP_ON_PROOF };

static const enum op script[2][AUTH_STEPS] = {
	{ OP_HELLO, OP_ON_HELLO, OP_PROOF, OP_ON_PROOF },  /* initiator */
	{ OP_ON_HELLO, OP_HELLO, OP_ON_PROOF, OP_PROOF },  /* responder */
};

struct auth_session {
	const struct auth_key *key;           /* borrowed; outlives the session */
	int step;                             /* 0..AUTH_STEPS or STEP_FAILED */
	uint8_t my_role, peer_role;           /* ROLE_*; peer_role set by on_hello */
	uint8_t my_nonce[AUTH_NONCE_BYTES];
	uint8_t peer_nonce[AUTH_NONCE_BYTES]; /* from the peer's HELLO */
	uint8_t my_len, peer_len;             /* name lengths, 1..AUTH_NAME_MAX */
	char my_name[AUTH_NAME_MAX + 1];      /* NUL-terminated */
	char peer_name[AUTH_NAME_MAX + 1];    /* a claim until step 4 */
	uint8_t my_wire, peer_wire;           /* enum seal_wire each side asks for */
};

static void say(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void say(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

static int sodium_ready(void)
{
	/* 0 first time, 1 already done; -1 only if no entropy source works. */
	return sodium_init() < 0 ? -EIO : 0;
}

bool auth_name_ok(const char *name, size_t len)
{
	if (len < 1 || len > AUTH_NAME_MAX)
		return false;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)name[i];
		bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		          (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
		if (!ok)
			return false;
	}
	return true;
}

/* ---- the key ---- */

int auth_key_derive(struct auth_key *k, const void *secret, size_t len, char *err, size_t errlen)
{
	crypto_auth_hmacsha256_state st;
	int rc;

	k->mac = NULL;
	if ((rc = sodium_ready()) != 0) {
		say(err, errlen, "libsodium failed to initialise");
		return rc;
	}
	if (len < AUTH_SECRET_MIN) {
		say(err, errlen, "the secret is %zu bytes; at least %d are needed "
		    "(any text; `openssl rand -hex 32` makes a good one)", len, AUTH_SECRET_MIN);
		return -EINVAL;
	}
	if (memchr(secret, '\0', len)) {
		say(err, errlen, "the secret holds a NUL byte; it must be text");
		return -EINVAL;
	}
	k->mac = sodium_malloc(AUTH_KEY_BYTES);
	if (!k->mac) {
		say(err, errlen, "out of memory for the key");
		return -ENOMEM;
	}
	/* HMAC keyed by the text over a fixed label: any secret length gives a
	 * uniform 32-byte key, and the label keeps it apart from other uses of
	 * the same secret. */
	crypto_auth_hmacsha256_init(&st, secret, len);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)KEY_LABEL, strlen(KEY_LABEL));
	crypto_auth_hmacsha256_final(&st, k->mac);
	sodium_memzero(&st, sizeof(st));
	sodium_mprotect_readonly(k->mac);
	return 0;
}

void auth_key_free(struct auth_key *k)
{
	if (k->mac)
		sodium_free(k->mac);  /* wipes before unmapping */
	k->mac = NULL;
}

static bool trailing_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

int auth_key_load(struct auth_key *k, const char *path, char *err, size_t errlen)
{
	/* One byte over the limit tells "too big" from "exactly 4 KiB". */
	char buf[AUTH_KEY_FILE_MAX + 1];
	size_t n = 0;
	struct stat st;
	int fd, rc;

	k->mac = NULL;
	/* O_NOFOLLOW: a link could point anywhere, and its target's mode is
	 * what would need checking. O_NONBLOCK: a fifo must not hang us before
	 * fstat refuses it. */
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		if (rc == -ELOOP) {
			say(err, errlen, "key file %s is a symbolic link; name the file itself", path);
			return -EPERM;
		}
		if (rc == -ENOENT)
			say(err, errlen, "key file %s ([cluster] key_file): %s; make one and copy it "
			    "to every node: openssl rand -hex 32 > %s; chmod 600 %s", path,
			    strerror(-rc), path, path);
		else
			say(err, errlen, "key file %s ([cluster] key_file): %s", path, strerror(-rc));
		return rc;
	}
	if (fstat(fd, &st) != 0) {
		rc = -errno;
		say(err, errlen, "key file %s: %s", path, strerror(-rc));
		goto out_close;
	}
	if (!S_ISREG(st.st_mode)) {
		say(err, errlen, "key file %s is not a regular file", path);
		rc = -EPERM;
		goto out_close;
	}
	if (st.st_mode & (S_IRGRP | S_IWGRP | S_IROTH | S_IWOTH)) {
		say(err, errlen, "key file %s has mode %04o: group or others may read or "
		    "write it; run chmod 600 %s", path, (unsigned)(st.st_mode & 07777), path);
		rc = -EPERM;
		goto out_close;
	}
	while (n < sizeof(buf)) {
		ssize_t r = read(fd, buf + n, sizeof(buf) - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = -errno;
			say(err, errlen, "key file %s: %s", path, strerror(-rc));
			goto out_wipe;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	if (n > AUTH_KEY_FILE_MAX) {
		say(err, errlen, "key file %s is larger than %d bytes; it holds one secret",
		    path, AUTH_KEY_FILE_MAX);
		rc = -EFBIG;
		goto out_wipe;
	}
	while (n > 0 && trailing_space(buf[n - 1]))
		n--;
	rc = auth_key_derive(k, buf, n, err, errlen);
	if (rc != 0 && err && errlen) {
		char why[256];

		snprintf(why, sizeof(why), "%s", err);
		say(err, errlen, "key file %s: %s", path, why);
	}
out_wipe:
	sodium_memzero(buf, sizeof(buf));
out_close:
	close(fd);
	return rc;
}

/* ---- the handshake ---- */

int auth_begin(struct auth_session **out, const struct auth_key *k, const char *my_name, bool initiator)
{
	struct auth_session *s;
	size_t len;
	int rc;

	*out = NULL;
	if (!k || !k->mac || !my_name)
		return -EINVAL;
	len = strlen(my_name);
	if (!auth_name_ok(my_name, len))
		return -EINVAL;
	if ((rc = sodium_ready()) != 0)
		return rc;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->key = k;
	s->my_role = initiator ? ROLE_INITIATOR : ROLE_RESPONDER;
	s->my_len = (uint8_t)len;
	s->my_wire = SEAL_AUTHENTICATED;
	memcpy(s->my_name, my_name, len);
	randombytes_buf(s->my_nonce, sizeof(s->my_nonce));
	*out = s;
	return 0;
}

void auth_end(struct auth_session *s)
{
	if (!s)
		return;
	sodium_memzero(s, sizeof(*s));
	free(s);
}

/* -EPROTO unless op is the session's next step. */
static int expect(const struct auth_session *s, enum op op)
{
	if (s->step < 0 || s->step >= AUTH_STEPS)
		return -EPROTO;
	return script[s->my_role == ROLE_RESPONDER][s->step] == op ? 0 : -EPROTO;
}

static int fail(struct auth_session *s, int rc)
{
	s->step = STEP_FAILED;
	return rc;
}

int auth_set_wire(struct auth_session *s, int wire)
{
	if (wire != SEAL_AUTHENTICATED && wire != SEAL_ENCRYPTED)
		return -EINVAL;
	/* Only until this side's HELLO has gone. */
	if (s->step < 0 || s->step > (s->my_role == ROLE_INITIATOR ? 0 : 1))
		return -EPROTO;
	s->my_wire = (uint8_t)wire;
	return 0;
}

int auth_wire(const struct auth_session *s)
{
	if (!auth_done(s))
		return -EPROTO;
	return s->my_wire > s->peer_wire ? s->my_wire : s->peer_wire;
}

int auth_hello(struct auth_session *s, uint8_t *out, size_t cap, size_t *len)
{
	size_t n = 4 + AUTH_NONCE_BYTES + s->my_len + 1;
	int rc;

	if ((rc = expect(s, OP_HELLO)) != 0)
		return rc;
	if (cap < n)
		return -ENOBUFS;
	out[0] = MSG_HELLO;
	out[1] = AUTH_VERSION;
	out[2] = s->my_role;
	out[3] = s->my_len;
	memcpy(out + 4, s->my_nonce, AUTH_NONCE_BYTES);
	memcpy(out + 4 + AUTH_NONCE_BYTES, s->my_name, s->my_len);
	out[4 + AUTH_NONCE_BYTES + s->my_len] = s->my_wire;
	*len = n;
	s->step++;
	return 0;
}

int auth_on_hello(struct auth_session *s, const uint8_t *in, size_t len)
{
	uint8_t role, nlen;
	int rc;

	if ((rc = expect(s, OP_ON_HELLO)) != 0)
		return rc;
	/* Another version's HELLO is told apart from a malformed one, so that
	 * the message can say what to do (run one version everywhere). */
	if (len >= 2 && in[0] == MSG_HELLO && in[1] != AUTH_VERSION)
		return fail(s, -EPROTONOSUPPORT);
	if (len < AUTH_HELLO_MIN || len > AUTH_HELLO_MAX)
		return fail(s, -EBADMSG);
	role = in[2];
	nlen = in[3];
	if (in[0] != MSG_HELLO || len != 4u + AUTH_NONCE_BYTES + nlen + 1u ||
	    (role != ROLE_INITIATOR && role != ROLE_RESPONDER) ||
	    !auth_name_ok((const char *)in + 4 + AUTH_NONCE_BYTES, nlen) ||
	    (in[len - 1] != SEAL_AUTHENTICATED && in[len - 1] != SEAL_ENCRYPTED))
		return fail(s, -EBADMSG);
	/* Our own HELLO reflected back has our role, name and nonce; any one
	 * of them is enough to refuse it, and two nodes never share a name. */
	if (role == s->my_role ||
	    (nlen == s->my_len && memcmp(in + 4 + AUTH_NONCE_BYTES, s->my_name, nlen) == 0) ||
	    sodium_memcmp(in + 4, s->my_nonce, AUTH_NONCE_BYTES) == 0)
		return fail(s, -EACCES);
	s->peer_role = role;
	s->peer_len = nlen;
	memcpy(s->peer_nonce, in + 4, AUTH_NONCE_BYTES);
	memcpy(s->peer_name, in + 4 + AUTH_NONCE_BYTES, nlen);
	s->peer_name[nlen] = '\0';
	s->peer_wire = in[len - 1];
	s->step++;
	return 0;
}

/* HMAC(key, label || role || len || prover || len || verifier || verifier's
 * nonce || prover's nonce || prover's wire || verifier's wire). The length
 * bytes keep ("ab","c") apart from ("a","bc"); the wires make a HELLO whose
 * wire byte was altered on the way fail here, before anything is sealed. */
static void proof_mac(const struct auth_session *s, bool mine, uint8_t mac[AUTH_MAC_BYTES])
{
	crypto_auth_hmacsha256_state st;
	uint8_t role = mine ? s->my_role : s->peer_role;
	uint8_t plen = mine ? s->my_len : s->peer_len, vlen = mine ? s->peer_len : s->my_len;
	const char *prover = mine ? s->my_name : s->peer_name;
	const char *verifier = mine ? s->peer_name : s->my_name;
	const uint8_t *vnonce = mine ? s->peer_nonce : s->my_nonce;
	const uint8_t *pnonce = mine ? s->my_nonce : s->peer_nonce;
	uint8_t pwire = mine ? s->my_wire : s->peer_wire, vwire = mine ? s->peer_wire : s->my_wire;

	crypto_auth_hmacsha256_init(&st, s->key->mac, AUTH_KEY_BYTES);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)MAC_LABEL, strlen(MAC_LABEL));
	crypto_auth_hmacsha256_update(&st, &role, 1);
	crypto_auth_hmacsha256_update(&st, &plen, 1);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)prover, plen);
	crypto_auth_hmacsha256_update(&st, &vlen, 1);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)verifier, vlen);
	crypto_auth_hmacsha256_update(&st, vnonce, AUTH_NONCE_BYTES);
	crypto_auth_hmacsha256_update(&st, pnonce, AUTH_NONCE_BYTES);
	crypto_auth_hmacsha256_update(&st, &pwire, 1);
	crypto_auth_hmacsha256_update(&st, &vwire, 1);
	crypto_auth_hmacsha256_final(&st, mac);
	sodium_memzero(&st, sizeof(st));
}

int auth_proof(struct auth_session *s, uint8_t *out, size_t cap, size_t *len)
{
	int rc;

	if ((rc = expect(s, OP_PROOF)) != 0)
		return rc;
	if (cap < AUTH_PROOF_LEN)
		return -ENOBUFS;
	out[0] = MSG_PROOF;
	out[1] = AUTH_VERSION;
	out[2] = s->my_role;
	out[3] = 0;
	proof_mac(s, true, out + 4);
	*len = AUTH_PROOF_LEN;
	s->step++;
	return 0;
}

int auth_on_proof(struct auth_session *s, const uint8_t *in, size_t len)
{
	uint8_t want[AUTH_MAC_BYTES];
	int rc;

	if ((rc = expect(s, OP_ON_PROOF)) != 0)
		return rc;
	if (len != AUTH_PROOF_LEN || in[0] != MSG_PROOF || in[1] != AUTH_VERSION || in[3] != 0)
		return fail(s, -EBADMSG);
	if (in[2] != s->peer_role)
		return fail(s, -EACCES);
	proof_mac(s, false, want);
	rc = sodium_memcmp(want, in + 4, AUTH_MAC_BYTES) == 0 ? 0 : -EACCES;
	sodium_memzero(want, sizeof(want));
	if (rc != 0)
		return fail(s, rc);
	s->step++;
	return 0;
}

bool auth_done(const struct auth_session *s)
{
	return s && s->step == AUTH_STEPS;
}

const char *auth_peer_name(const struct auth_session *s)
{
	return auth_done(s) ? s->peer_name : NULL;
}

/* HMAC(key, label || wire || initiator's nonce || responder's nonce || len
 * || initiator's name || len || responder's name): both sides get the same
 * key, and no other connection does (the nonces are fresh); the agreed wire
 * is bound in as well. */
int auth_session_key(const struct auth_session *s, uint8_t out[AUTH_KEY_BYTES])
{
	crypto_auth_hmacsha256_state st;
	uint8_t wire;
	bool ini;

	if (!auth_done(s))
		return -EPROTO;
	ini = s->my_role == ROLE_INITIATOR;
	wire = (uint8_t)auth_wire(s);
	crypto_auth_hmacsha256_init(&st, s->key->mac, AUTH_KEY_BYTES);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)SESSION_LABEL, strlen(SESSION_LABEL));
	crypto_auth_hmacsha256_update(&st, &wire, 1);
	crypto_auth_hmacsha256_update(&st, ini ? s->my_nonce : s->peer_nonce, AUTH_NONCE_BYTES);
	crypto_auth_hmacsha256_update(&st, ini ? s->peer_nonce : s->my_nonce, AUTH_NONCE_BYTES);
	crypto_auth_hmacsha256_update(&st, ini ? &s->my_len : &s->peer_len, 1);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)(ini ? s->my_name : s->peer_name),
				      ini ? s->my_len : s->peer_len);
	crypto_auth_hmacsha256_update(&st, ini ? &s->peer_len : &s->my_len, 1);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)(ini ? s->peer_name : s->my_name),
				      ini ? s->peer_len : s->my_len);
	crypto_auth_hmacsha256_final(&st, out);
	sodium_memzero(&st, sizeof(st));
	return 0;
}
