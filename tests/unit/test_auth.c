/* common/auth.c: the key file's checks and derivation, the handshake both
 * ways, and the attacks it must stop: a wrong key, reflection, replay, calls
 * out of order, malformed messages. The MAC is also recomputed here from
 * docs/PROTOCOL.md alone, so the document and the code cannot drift apart. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

#include "common/auth.h"
#include "common/seal.h"

#define HEX64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define OTHER "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"

static char dir[64];

static int setup(void **state)
{
	(void)state;
	strcpy(dir, "/tmp/test_auth.XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	char cmd[128];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

/* Writes dir/name with the given bytes and mode; returns the path. */
static const char *put_file(const char *name, const void *p, size_t n, mode_t mode)
{
	static char path[128];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	unlink(path);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, p, n), (ssize_t)n);
	assert_int_equal(fchmod(fd, mode), 0);
	close(fd);
	return path;
}

static const char *put_key(const char *name, const char *text, mode_t mode)
{
	return put_file(name, text, strlen(text), mode);
}

static void key_of(struct auth_key *k, const char *text)
{
	assert_int_equal(auth_key_derive(k, text, strlen(text), NULL, 0), 0);
}

/* ---- key file ---- */

static void test_key_modes(void **state)
{
	static const mode_t refused[] = { 0644, 0640, 0604, 0620, 0602, 0660, 0666, 0777 };
	static const mode_t accepted[] = { 0600, 0400, 0700, 0611 };
	struct auth_key k = { 0 };
	char err[512], want[64];
	const char *path;

	(void)state;
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		path = put_key("k", HEX64 "\n", refused[i]);
		err[0] = '\0';
		assert_int_equal(auth_key_load(&k, path, err, sizeof(err)), -EPERM);
		assert_null(k.mac);
		snprintf(want, sizeof(want), "mode %04o", (unsigned)refused[i]);
		assert_non_null(strstr(err, path));
		assert_non_null(strstr(err, want));
		assert_non_null(strstr(err, "chmod 600"));
	}
	/* Execute bits give nobody the secret. */
	for (size_t i = 0; i < sizeof(accepted) / sizeof(accepted[0]); i++) {
		path = put_key("k", HEX64 "\n", accepted[i]);
		assert_int_equal(auth_key_load(&k, path, err, sizeof(err)), 0);
		assert_non_null(k.mac);
		auth_key_free(&k);
		assert_null(k.mac);
		auth_key_free(&k);
	}
}

static void test_key_not_regular(void **state)
{
	struct auth_key k = { 0 };
	char err[512], link[128], sub[128], fifo[128];
	const char *path;

	(void)state;
	path = put_key("target", HEX64, 0600);
	snprintf(link, sizeof(link), "%s/link", dir);
	assert_int_equal(symlink(path, link), 0);
	assert_int_equal(auth_key_load(&k, link, err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "symbolic link"));

	snprintf(sub, sizeof(sub), "%s/sub", dir);
	assert_int_equal(mkdir(sub, 0700), 0);
	assert_int_equal(auth_key_load(&k, sub, err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "not a regular file"));

	/* A fifo must be refused, not waited on. */
	snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
	assert_int_equal(mkfifo(fifo, 0600), 0);
	assert_int_equal(auth_key_load(&k, fifo, err, sizeof(err)), -EPERM);

	snprintf(link, sizeof(link), "%s/absent", dir);
	assert_int_equal(auth_key_load(&k, link, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, link));
	assert_null(k.mac);
}

static void test_key_short(void **state)
{
	struct auth_key k = { 0 };
	char err[512];
	const char *path;

	(void)state;
	/* 31 bytes, padded with white space that does not count. */
	path = put_key("k", "0123456789abcdef0123456789abcde \n\t\r\n   \n", 0600);
	assert_int_equal(auth_key_load(&k, path, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, path));
	assert_non_null(strstr(err, "31 bytes"));
	assert_null(k.mac);
	path = put_key("k", "", 0600);
	assert_int_equal(auth_key_load(&k, path, err, sizeof(err)), -EINVAL);
	path = put_file("k", "0123456789abcdef\0" "0123456789abcdef", 33, 0600);
	assert_int_equal(auth_key_load(&k, path, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "NUL"));
	/* Exactly 32 bytes of any text is enough. */
	path = put_key("k", "correct horse battery staple 123\n", 0600);
	assert_int_equal(auth_key_load(&k, path, err, sizeof(err)), 0);
	auth_key_free(&k);
}

static void test_key_size_limit(void **state)
{
	static char big[AUTH_KEY_FILE_MAX + 1];
	struct auth_key k = { 0 };
	char err[512];
	const char *path;

	(void)state;
	memset(big, 'x', sizeof(big));
	path = put_file("k", big, AUTH_KEY_FILE_MAX, 0600);
	assert_int_equal(auth_key_load(&k, path, err, sizeof(err)), 0);
	auth_key_free(&k);
	path = put_file("k", big, AUTH_KEY_FILE_MAX + 1, 0600);
	assert_int_equal(auth_key_load(&k, path, err, sizeof(err)), -EFBIG);
	assert_null(k.mac);
}

/* The derived key is HMAC-SHA256 keyed by the text over the label. */
static void test_key_derivation(void **state)
{
	static const char *same[] = { HEX64, HEX64 "\n", HEX64 " \t\r\n\v\f", HEX64 "\n\n\n" };
	crypto_auth_hmacsha256_state st;
	uint8_t want[32];
	struct auth_key k = { 0 };
	char err[512];

	(void)state;
	crypto_auth_hmacsha256_init(&st, (const uint8_t *)HEX64, 64);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)"stage cluster key v1", 20);
	crypto_auth_hmacsha256_final(&st, want);
	for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++) {
		assert_int_equal(auth_key_load(&k, put_key("k", same[i], 0600), err, sizeof(err)), 0);
		assert_memory_equal(k.mac, want, 32);
		auth_key_free(&k);
	}
	/* Leading white space is part of the secret. */
	assert_int_equal(auth_key_load(&k, put_key("k", " " HEX64, 0600), err, sizeof(err)), 0);
	assert_memory_not_equal(k.mac, want, 32);
	auth_key_free(&k);
}

/* ---- handshake ---- */

struct pair {
	struct auth_key ka, kb;
	struct auth_session *i, *r;  /* initiator "node-a", responder "node-b" */
	uint8_t hello_i[AUTH_MSG_MAX], hello_r[AUTH_MSG_MAX];
	uint8_t proof_i[AUTH_MSG_MAX], proof_r[AUTH_MSG_MAX];
	size_t hello_i_len, hello_r_len, proof_i_len, proof_r_len;
};

static void pair_begin(struct pair *p, const char *secret_i, const char *secret_r)
{
	memset(p, 0, sizeof(*p));
	key_of(&p->ka, secret_i);
	key_of(&p->kb, secret_r);
	assert_int_equal(auth_begin(&p->i, &p->ka, "node-a", true), 0);
	assert_int_equal(auth_begin(&p->r, &p->kb, "node-b", false), 0);
}

/* The two HELLOs, in order. */
static void pair_hellos(struct pair *p)
{
	assert_int_equal(auth_hello(p->i, p->hello_i, sizeof(p->hello_i), &p->hello_i_len), 0);
	assert_int_equal(auth_on_hello(p->r, p->hello_i, p->hello_i_len), 0);
	assert_int_equal(auth_hello(p->r, p->hello_r, sizeof(p->hello_r), &p->hello_r_len), 0);
	assert_int_equal(auth_on_hello(p->i, p->hello_r, p->hello_r_len), 0);
	assert_int_equal(auth_proof(p->i, p->proof_i, sizeof(p->proof_i), &p->proof_i_len), 0);
}

static void pair_end(struct pair *p)
{
	auth_end(p->i);
	auth_end(p->r);
	auth_key_free(&p->ka);
	auth_key_free(&p->kb);
}

static void test_handshake(void **state)
{
	struct pair p, q;

	(void)state;
	pair_begin(&p, HEX64, HEX64);
	pair_hellos(&p);
	assert_int_equal(p.hello_i_len, 4 + 32 + 6 + 1);
	assert_int_equal(p.hello_i[p.hello_i_len - 1], SEAL_AUTHENTICATED);  /* the default */
	assert_int_equal(p.proof_i_len, AUTH_PROOF_LEN);
	assert_false(auth_done(p.r));
	assert_null(auth_peer_name(p.r));
	assert_int_equal(auth_on_proof(p.r, p.proof_i, p.proof_i_len), 0);
	assert_false(auth_done(p.r));  /* it still owes its PROOF */
	assert_int_equal(auth_proof(p.r, p.proof_r, sizeof(p.proof_r), &p.proof_r_len), 0);
	assert_true(auth_done(p.r));
	assert_false(auth_done(p.i));
	assert_null(auth_peer_name(p.i));
	assert_int_equal(auth_on_proof(p.i, p.proof_r, p.proof_r_len), 0);
	assert_true(auth_done(p.i));
	assert_string_equal(auth_peer_name(p.i), "node-b");
	assert_string_equal(auth_peer_name(p.r), "node-a");

	/* Every connection has fresh nonces, so fresh HELLOs and PROOFs. */
	pair_begin(&q, HEX64, HEX64);
	pair_hellos(&q);
	assert_memory_not_equal(p.hello_i + 4, q.hello_i + 4, 32);
	assert_memory_not_equal(p.hello_r + 4, q.hello_r + 4, 32);
	assert_memory_not_equal(p.proof_i, q.proof_i, AUTH_PROOF_LEN);
	pair_end(&p);
	pair_end(&q);
}

/* The PROOF a responder with key text `secret` sends, from docs/PROTOCOL.md. */
static void doc_proof(const char *secret, const uint8_t *hello_i, const uint8_t *hello_r, uint8_t out[AUTH_PROOF_LEN])
{
	crypto_auth_hmacsha256_state st;
	uint8_t key[32], role = 2;

	crypto_auth_hmacsha256_init(&st, (const uint8_t *)secret, strlen(secret));
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)"stage cluster key v1", 20);
	crypto_auth_hmacsha256_final(&st, key);
	crypto_auth_hmacsha256_init(&st, key, 32);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)"stage auth v2", 13);
	crypto_auth_hmacsha256_update(&st, &role, 1);
	crypto_auth_hmacsha256_update(&st, hello_r + 3, 1);               /* prover: len */
	crypto_auth_hmacsha256_update(&st, hello_r + 36, hello_r[3]);     /* name */
	crypto_auth_hmacsha256_update(&st, hello_i + 3, 1);               /* verifier: len */
	crypto_auth_hmacsha256_update(&st, hello_i + 36, hello_i[3]);     /* name */
	crypto_auth_hmacsha256_update(&st, hello_i + 4, 32);              /* verifier's nonce */
	crypto_auth_hmacsha256_update(&st, hello_r + 4, 32);              /* prover's nonce */
	crypto_auth_hmacsha256_update(&st, hello_r + 36 + hello_r[3], 1); /* prover's wire */
	crypto_auth_hmacsha256_update(&st, hello_i + 36 + hello_i[3], 1); /* verifier's wire */
	out[0] = 2;
	out[1] = 2;
	out[2] = role;
	out[3] = 0;
	crypto_auth_hmacsha256_final(&st, out + 4);
}

static void test_wrong_key(void **state)
{
	uint8_t forged[AUTH_PROOF_LEN];
	struct pair p;

	(void)state;
	/* The responder refuses the initiator... */
	pair_begin(&p, HEX64, OTHER);
	pair_hellos(&p);
	assert_int_equal(auth_on_proof(p.r, p.proof_i, p.proof_i_len), -EACCES);
	assert_false(auth_done(p.r));
	assert_null(auth_peer_name(p.r));
	assert_int_equal(auth_proof(p.r, p.proof_r, sizeof(p.proof_r), &p.proof_r_len), -EPROTO);
	/* ...and the initiator refuses a responder that answers anyway with the
	 * wrong key (built here from the document, which the right key shows). */
	doc_proof(OTHER, p.hello_i, p.hello_r, forged);
	assert_int_equal(auth_on_proof(p.i, forged, sizeof(forged)), -EACCES);
	assert_false(auth_done(p.i));
	assert_null(auth_peer_name(p.i));
	pair_end(&p);

	pair_begin(&p, HEX64, HEX64);
	pair_hellos(&p);
	doc_proof(HEX64, p.hello_i, p.hello_r, forged);
	assert_int_equal(auth_on_proof(p.i, forged, sizeof(forged)), 0);
	assert_true(auth_done(p.i));
	pair_end(&p);
}

static void test_reflection(void **state)
{
	uint8_t hello[AUTH_MSG_MAX], proof[AUTH_MSG_MAX];
	size_t n, m;
	struct pair p;

	(void)state;
	/* Its own HELLO, as is. */
	pair_begin(&p, HEX64, HEX64);
	assert_int_equal(auth_hello(p.i, hello, sizeof(hello), &n), 0);
	assert_int_equal(auth_on_hello(p.i, hello, n), -EACCES);
	assert_int_equal(auth_proof(p.i, proof, sizeof(proof), &m), -EPROTO);
	pair_end(&p);

	/* Its own HELLO with the role flipped: the name gives it away. */
	pair_begin(&p, HEX64, HEX64);
	assert_int_equal(auth_hello(p.i, hello, sizeof(hello), &n), 0);
	hello[2] = 2;
	assert_int_equal(auth_on_hello(p.i, hello, n), -EACCES);
	pair_end(&p);

	/* Role flipped and another name: the nonce gives it away. */
	pair_begin(&p, HEX64, HEX64);
	assert_int_equal(auth_hello(p.i, hello, sizeof(hello), &n), 0);
	hello[2] = 2;
	hello[4 + 32] = 'X';
	assert_int_equal(auth_on_hello(p.i, hello, n), -EACCES);
	pair_end(&p);

	/* The initiator's PROOF sent back to it, as is and with the role byte
	 * flipped: the MAC binds the prover's role and the order of the names. */
	pair_begin(&p, HEX64, HEX64);
	pair_hellos(&p);
	assert_int_equal(auth_on_proof(p.i, p.proof_i, p.proof_i_len), -EACCES);
	pair_end(&p);
	pair_begin(&p, HEX64, HEX64);
	pair_hellos(&p);
	p.proof_i[2] = 2;
	assert_int_equal(auth_on_proof(p.i, p.proof_i, p.proof_i_len), -EACCES);
	pair_end(&p);

	/* A responder never makes a PROOF for a peer that has not proved
	 * itself, so it cannot be used as an oracle for its own challenge. */
	pair_begin(&p, HEX64, HEX64);
	assert_int_equal(auth_hello(p.i, p.hello_i, sizeof(p.hello_i), &n), 0);
	assert_int_equal(auth_on_hello(p.r, p.hello_i, n), 0);
	assert_int_equal(auth_hello(p.r, p.hello_r, sizeof(p.hello_r), &n), 0);
	assert_int_equal(auth_proof(p.r, proof, sizeof(proof), &m), -EPROTO);
	pair_end(&p);
}

static void test_replay(void **state)
{
	struct pair old, p;

	(void)state;
	pair_begin(&old, HEX64, HEX64);
	pair_hellos(&old);
	assert_int_equal(auth_on_proof(old.r, old.proof_i, old.proof_i_len), 0);
	assert_int_equal(auth_proof(old.r, old.proof_r, sizeof(old.proof_r), &old.proof_r_len), 0);

	/* A recorded initiator PROOF into a new responder. */
	pair_begin(&p, HEX64, HEX64);
	pair_hellos(&p);
	assert_int_equal(auth_on_proof(p.r, old.proof_i, old.proof_i_len), -EACCES);
	pair_end(&p);

	/* A recorded responder PROOF into a new initiator. */
	pair_begin(&p, HEX64, HEX64);
	pair_hellos(&p);
	assert_int_equal(auth_on_proof(p.r, p.proof_i, p.proof_i_len), 0);
	assert_int_equal(auth_on_proof(p.i, old.proof_r, old.proof_r_len), -EACCES);
	pair_end(&p);

	/* Even with the old HELLO replayed too: the new side's nonce differs. */
	pair_begin(&p, HEX64, HEX64);
	assert_int_equal(auth_on_hello(p.r, old.hello_i, old.hello_i_len), 0);
	assert_int_equal(auth_hello(p.r, p.hello_r, sizeof(p.hello_r), &p.hello_r_len), 0);
	assert_int_equal(auth_on_proof(p.r, old.proof_i, old.proof_i_len), -EACCES);
	pair_end(&p);
	pair_end(&old);
}

static void test_order(void **state)
{
	uint8_t buf[AUTH_MSG_MAX], small[AUTH_PROOF_LEN - 1];
	size_t n;
	struct pair p;

	(void)state;
	pair_begin(&p, HEX64, HEX64);
	/* Initiator speaks first; responder listens first. */
	assert_int_equal(auth_on_hello(p.i, buf, 40), -EPROTO);
	assert_int_equal(auth_proof(p.i, buf, sizeof(buf), &n), -EPROTO);
	assert_int_equal(auth_on_proof(p.i, buf, AUTH_PROOF_LEN), -EPROTO);
	assert_int_equal(auth_hello(p.r, buf, sizeof(buf), &n), -EPROTO);
	assert_int_equal(auth_proof(p.r, buf, sizeof(buf), &n), -EPROTO);
	assert_int_equal(auth_on_proof(p.r, buf, AUTH_PROOF_LEN), -EPROTO);
	/* Too small a buffer changes nothing. */
	assert_int_equal(auth_hello(p.i, small, sizeof(small), &n), -ENOBUFS);
	assert_int_equal(auth_hello(p.i, p.hello_i, sizeof(p.hello_i), &p.hello_i_len), 0);
	assert_int_equal(auth_hello(p.i, buf, sizeof(buf), &n), -EPROTO);  /* twice */
	assert_int_equal(auth_on_hello(p.r, p.hello_i, p.hello_i_len), 0);
	assert_int_equal(auth_on_hello(p.r, p.hello_i, p.hello_i_len), -EPROTO);
	assert_int_equal(auth_hello(p.r, p.hello_r, sizeof(p.hello_r), &p.hello_r_len), 0);
	assert_int_equal(auth_on_proof(p.i, buf, AUTH_PROOF_LEN), -EPROTO);  /* before HELLO */
	assert_int_equal(auth_on_hello(p.i, p.hello_r, p.hello_r_len), 0);
	assert_int_equal(auth_on_proof(p.i, buf, AUTH_PROOF_LEN), -EPROTO);  /* before own PROOF */
	assert_int_equal(auth_proof(p.i, small, sizeof(small), &n), -ENOBUFS);
	assert_int_equal(auth_proof(p.i, p.proof_i, sizeof(p.proof_i), &p.proof_i_len), 0);
	assert_int_equal(auth_on_proof(p.r, p.proof_i, p.proof_i_len), 0);
	assert_int_equal(auth_proof(p.r, p.proof_r, sizeof(p.proof_r), &p.proof_r_len), 0);
	assert_int_equal(auth_on_proof(p.i, p.proof_r, p.proof_r_len), 0);
	/* Done: nothing more is accepted. */
	assert_int_equal(auth_on_proof(p.i, p.proof_r, p.proof_r_len), -EPROTO);
	assert_int_equal(auth_proof(p.r, buf, sizeof(buf), &n), -EPROTO);
	assert_int_equal(auth_hello(p.i, buf, sizeof(buf), &n), -EPROTO);
	assert_true(auth_done(p.i) && auth_done(p.r));
	pair_end(&p);

	/* A failure is final: the right message afterwards is still refused. */
	pair_begin(&p, HEX64, HEX64);
	assert_int_equal(auth_hello(p.i, p.hello_i, sizeof(p.hello_i), &p.hello_i_len), 0);
	assert_int_equal(auth_on_hello(p.r, p.hello_i, p.hello_i_len - 1), -EBADMSG);
	assert_int_equal(auth_on_hello(p.r, p.hello_i, p.hello_i_len), -EPROTO);
	assert_int_equal(auth_hello(p.r, buf, sizeof(buf), &n), -EPROTO);
	assert_false(auth_done(p.r));
	pair_end(&p);
}

static void test_begin(void **state)
{
	char long_name[AUTH_NAME_MAX + 2];
	struct auth_session *s = (struct auth_session *)1;
	struct auth_key k = { 0 };

	(void)state;
	assert_int_equal(auth_begin(&s, &k, "a", true), -EINVAL);  /* no key loaded */
	assert_null(s);
	key_of(&k, HEX64);
	assert_int_equal(auth_begin(&s, &k, "", true), -EINVAL);
	assert_int_equal(auth_begin(&s, &k, "a/b", true), -EINVAL);
	assert_int_equal(auth_begin(&s, &k, "a b", true), -EINVAL);
	assert_int_equal(auth_begin(&s, &k, "n\xc3\xa9", true), -EINVAL);
	memset(long_name, 'n', sizeof(long_name));
	long_name[AUTH_NAME_MAX + 1] = '\0';
	assert_int_equal(auth_begin(&s, &k, long_name, true), -EINVAL);
	long_name[AUTH_NAME_MAX] = '\0';
	assert_int_equal(auth_begin(&s, &k, long_name, true), 0);
	auth_end(s);
	assert_int_equal(auth_begin(&s, &k, "Rack-1.node_07", false), 0);
	auth_end(s);
	auth_end(NULL);
	assert_false(auth_done(NULL));
	auth_key_free(&k);
}

/* A fresh responder fed a HELLO: rc. */
static int hello_into_responder(const uint8_t *m, size_t n)
{
	struct auth_session *r;
	struct auth_key k;
	int rc;

	key_of(&k, HEX64);
	assert_int_equal(auth_begin(&r, &k, "node-b", false), 0);
	rc = auth_on_hello(r, m, n);
	auth_end(r);
	auth_key_free(&k);
	return rc;
}

/* The wire: the stronger of what the two sides ask for, the same on both,
 * and bound into the session key, so that a HELLO whose wire byte was
 * altered on the way gives the sides different keys. */
static void test_wire(void **state)
{
	static const int ask[4][3] = {
		/* initiator, responder, agreed */
		{ SEAL_ENCRYPTED, SEAL_ENCRYPTED, SEAL_ENCRYPTED },
		{ SEAL_AUTHENTICATED, SEAL_ENCRYPTED, SEAL_ENCRYPTED },
		{ SEAL_ENCRYPTED, SEAL_AUTHENTICATED, SEAL_ENCRYPTED },
		{ SEAL_AUTHENTICATED, SEAL_AUTHENTICATED, SEAL_AUTHENTICATED },
	};
	uint8_t ki[AUTH_KEY_BYTES], kr[AUTH_KEY_BYTES];
	struct pair p;

	(void)state;
	for (int c = 0; c < 4; c++) {
		pair_begin(&p, HEX64, HEX64);
		assert_int_equal(auth_set_wire(p.i, ask[c][0]), 0);
		assert_int_equal(auth_set_wire(p.r, ask[c][1]), 0);
		pair_hellos(&p);
		assert_int_equal(auth_wire(p.i), -EPROTO);
		assert_int_equal(auth_on_proof(p.r, p.proof_i, p.proof_i_len), 0);
		assert_int_equal(auth_proof(p.r, p.proof_r, sizeof(p.proof_r), &p.proof_r_len), 0);
		assert_int_equal(auth_on_proof(p.i, p.proof_r, p.proof_r_len), 0);
		assert_int_equal(auth_wire(p.i), ask[c][2]);
		assert_int_equal(auth_wire(p.r), ask[c][2]);
		assert_int_equal(auth_session_key(p.i, ki), 0);
		assert_int_equal(auth_session_key(p.r, kr), 0);
		assert_memory_equal(ki, kr, sizeof(ki));
		pair_end(&p);
	}
	/* An encrypted wire pushed down to authenticated on the way: the
	 * responder sees "authenticated" in the initiator's HELLO, but the
	 * initiator's PROOF covers the wire it sent, so the responder refuses
	 * it before anything is sealed. */
	pair_begin(&p, HEX64, HEX64);
	assert_int_equal(auth_set_wire(p.i, SEAL_ENCRYPTED), 0);
	assert_int_equal(auth_set_wire(p.r, SEAL_AUTHENTICATED), 0);
	assert_int_equal(auth_hello(p.i, p.hello_i, sizeof(p.hello_i), &p.hello_i_len), 0);
	p.hello_i[p.hello_i_len - 1] = SEAL_AUTHENTICATED;
	assert_int_equal(auth_on_hello(p.r, p.hello_i, p.hello_i_len), 0);
	assert_int_equal(auth_hello(p.r, p.hello_r, sizeof(p.hello_r), &p.hello_r_len), 0);
	assert_int_equal(auth_on_hello(p.i, p.hello_r, p.hello_r_len), 0);
	assert_int_equal(auth_proof(p.i, p.proof_i, sizeof(p.proof_i), &p.proof_i_len), 0);
	assert_int_equal(auth_on_proof(p.r, p.proof_i, p.proof_i_len), -EACCES);
	assert_int_equal(auth_wire(p.r), -EPROTO);
	assert_int_equal(auth_session_key(p.r, kr), -EPROTO);
	pair_end(&p);
	/* and the responder's wire altered on its way to the initiator */
	pair_begin(&p, HEX64, HEX64);
	assert_int_equal(auth_set_wire(p.r, SEAL_ENCRYPTED), 0);
	assert_int_equal(auth_hello(p.i, p.hello_i, sizeof(p.hello_i), &p.hello_i_len), 0);
	assert_int_equal(auth_on_hello(p.r, p.hello_i, p.hello_i_len), 0);
	assert_int_equal(auth_hello(p.r, p.hello_r, sizeof(p.hello_r), &p.hello_r_len), 0);
	p.hello_r[p.hello_r_len - 1] = SEAL_AUTHENTICATED;
	assert_int_equal(auth_on_hello(p.i, p.hello_r, p.hello_r_len), 0);
	assert_int_equal(auth_proof(p.i, p.proof_i, sizeof(p.proof_i), &p.proof_i_len), 0);
	assert_int_equal(auth_on_proof(p.r, p.proof_i, p.proof_i_len), -EACCES);
	pair_end(&p);
	pair_begin(&p, HEX64, HEX64);
	assert_int_equal(auth_hello(p.i, p.hello_i, sizeof(p.hello_i), &p.hello_i_len), 0);
	/* too late once the HELLO has gone; a wire that is neither */
	assert_int_equal(auth_set_wire(p.i, SEAL_ENCRYPTED), -EPROTO);
	pair_end(&p);
	pair_begin(&p, HEX64, HEX64);
	assert_int_equal(auth_set_wire(p.i, 0), -EINVAL);
	assert_int_equal(auth_set_wire(p.i, 3), -EINVAL);
	pair_end(&p);
}

static void test_malformed(void **state)
{
	uint8_t good[AUTH_MSG_MAX + 8], bad[AUTH_MSG_MAX + 8];
	size_t n = 4 + 32 + 6 + 1;
	struct pair p;

	(void)state;
	good[0] = 1;
	good[1] = 2;
	good[2] = 1;
	good[3] = 6;
	memset(good + 4, 0x5a, 32);
	memcpy(good + 36, "node-a", 6);
	good[42] = SEAL_AUTHENTICATED;
	assert_int_equal(hello_into_responder(good, n), 0);
	for (size_t len = 0; len < n; len++)
		assert_int_equal(hello_into_responder(good, len), -EBADMSG);
	/* Another version of the protocol, told apart from a malformed HELLO
	 * (version 1 was 36 + n bytes, with no wire byte). */
	memcpy(bad, good, n);
	bad[1] = 1;
	assert_int_equal(hello_into_responder(bad, n - 1), -EPROTONOSUPPORT);
	bad[1] = 3;
	assert_int_equal(hello_into_responder(bad, n), -EPROTONOSUPPORT);
	assert_int_equal(hello_into_responder(good, n + 1), -EBADMSG);  /* trailing byte */

	/* Longest name is fine, one more byte is too long. */
	memcpy(bad, good, 36);
	memset(bad + 36, 'n', AUTH_NAME_MAX + 1);
	bad[3] = 255;
	bad[AUTH_HELLO_MAX - 1] = SEAL_ENCRYPTED;
	assert_int_equal(hello_into_responder(bad, AUTH_HELLO_MAX), 0);
	assert_int_equal(hello_into_responder(bad, AUTH_HELLO_MAX + 1), -EBADMSG);

	/* Each header byte and the name, wrong in turn. */
	struct { size_t off; uint8_t v; } cases[] = {
		{ 0, 0 }, { 0, 2 }, { 2, 0 }, { 2, 3 }, { 3, 0 }, { 3, 5 },
		{ 3, 7 }, { 36, '/' }, { 38, ' ' }, { 41, '\0' }, { 40, 0xff },
		{ 42, 0 }, { 42, 3 },           /* the wire: 1 or 2 */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		memcpy(bad, good, n);
		bad[cases[i].off] = cases[i].v;
		assert_int_equal(hello_into_responder(bad, n), -EBADMSG);
	}
	/* A HELLO claiming the responder's own role. */
	memcpy(bad, good, n);
	bad[2] = 2;
	assert_int_equal(hello_into_responder(bad, n), -EACCES);

	/* PROOFs: wrong length, type, version, reserved byte. */
	for (size_t i = 0; i < 6; i++) {
		pair_begin(&p, HEX64, HEX64);
		pair_hellos(&p);
		memcpy(bad, p.proof_i, AUTH_PROOF_LEN);
		size_t len = AUTH_PROOF_LEN;
		switch (i) {
		case 0: len--; break;
		case 1: bad[len++] = 0; break;
		case 2: bad[0] = 1; break;
		case 3: bad[1] = 1; break;
		case 4: bad[3] = 1; break;
		case 5: len = 0; break;
		}
		assert_int_equal(auth_on_proof(p.r, bad, len), -EBADMSG);
		assert_false(auth_done(p.r));
		pair_end(&p);
	}
	/* One flipped MAC bit. */
	pair_begin(&p, HEX64, HEX64);
	pair_hellos(&p);
	p.proof_i[AUTH_PROOF_LEN - 1] ^= 1;
	assert_int_equal(auth_on_proof(p.r, p.proof_i, p.proof_i_len), -EACCES);
	pair_end(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_key_modes),
		cmocka_unit_test(test_wire),
		cmocka_unit_test(test_key_not_regular),
		cmocka_unit_test(test_key_short),
		cmocka_unit_test(test_key_size_limit),
		cmocka_unit_test(test_key_derivation),
		cmocka_unit_test(test_handshake),
		cmocka_unit_test(test_wrong_key),
		cmocka_unit_test(test_reflection),
		cmocka_unit_test(test_replay),
		cmocka_unit_test(test_order),
		cmocka_unit_test(test_begin),
		cmocka_unit_test(test_malformed),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
