/* The cluster key and the mutual challenge-response peers run before any
 * other frame (BRIEF §6). Groundwork for replication: nothing in the daemon
 * calls this yet. The byte-level description is the section "Peer
 * authentication" of docs/PROTOCOL.md.
 *
 * The handshake is a pure state machine over byte buffers: the caller moves
 * the messages over whatever transport it has, so the module is the same for
 * TCP and RDMA and is tested without sockets. Frame order:
 *
 *   initiator                         responder
 *   auth_hello      -- HELLO(I) -->   auth_on_hello
 *   auth_on_hello   <-- HELLO(R) --   auth_hello
 *   auth_proof      -- PROOF(I) -->   auth_on_proof   (-EACCES: close)
 *   auth_on_proof   <-- PROOF(R) --   auth_proof
 *
 * The responder proves itself only after the initiator has, so a client
 * without the key never obtains a MAC from a daemon.
 *
 * Returns: 0 or -errno. -EPROTO a call out of order (or after a failure),
 * -EBADMSG a malformed message, -EPROTONOSUPPORT a HELLO of another
 * version of the protocol (another version of stage), -EACCES a PROOF that does not verify (a wrong
 * key, a reflected or replayed message), -ENOBUFS an output buffer too small
 * (the session is unchanged; retry with AUTH_MSG_MAX bytes). Any failure of
 * an auth_on_* call ends the session: every later call is -EPROTO.
 */
#ifndef STAGE_AUTH_H
#define STAGE_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AUTH_KEY_BYTES 32          /* the derived HMAC-SHA256 key */
#define AUTH_NONCE_BYTES 32
#define AUTH_MAC_BYTES 32
#define AUTH_NAME_MAX 255          /* node names: 1..255 of [A-Za-z0-9._-] */
#define AUTH_SECRET_MIN 32         /* bytes of key-file text, after trimming */
#define AUTH_KEY_FILE_MAX 4096
#define AUTH_HELLO_MIN (4 + AUTH_NONCE_BYTES + 1 + 1)
#define AUTH_HELLO_MAX (4 + AUTH_NONCE_BYTES + AUTH_NAME_MAX + 1)
#define AUTH_PROOF_LEN (4 + AUTH_MAC_BYTES)
#define AUTH_MSG_MAX AUTH_HELLO_MAX /* enough for either message */

struct auth_key {
	uint8_t *mac;  /* AUTH_KEY_BYTES from sodium_malloc (guarded, mlocked
	                  where the limit allows), read-only; NULL when not loaded */
};

/* Reads the key file: a regular file (not a symlink) that group and others
 * can neither read nor write, at most AUTH_KEY_FILE_MAX bytes; trailing white
 * space is ignored and the rest, any text of at least AUTH_SECRET_MIN bytes
 * without NUL (64 hex digits from `openssl rand -hex 32` is the usual), is
 * the secret. 0; -EPERM (mode or type), -EFBIG, -EINVAL (short secret), or
 * the -errno of open/read; err gets a message naming the file. */
int auth_key_load(struct auth_key *k, const char *path, char *err, size_t errlen);
/* The same from a secret already in memory (len bytes, trimmed by the
 * caller). 0, -EINVAL, -ENOMEM. */
int auth_key_derive(struct auth_key *k, const void *secret, size_t len, char *err, size_t errlen);
/* Wipes and frees; safe on a zeroed or already freed key. */
void auth_key_free(struct auth_key *k);

/* true when name is 1..AUTH_NAME_MAX bytes of [A-Za-z0-9._-]. */
bool auth_name_ok(const char *name, size_t len);

struct auth_session;

/* One connection's handshake, with a fresh nonce. k must outlive the
 * session. 0, -EINVAL (bad name or key), -ENOMEM, -EIO (libsodium). */
int auth_begin(struct auth_session **s, const struct auth_key *k, const char *my_name, bool initiator);
/* What this side asks of the wire after the handshake (enum seal_wire in
 * common/seal.h; SEAL_AUTHENTICATED unless set), sent in its HELLO: before
 * auth_hello. 0, -EINVAL, -EPROTO (too late). */
int auth_set_wire(struct auth_session *s, int wire);
int auth_hello(struct auth_session *s, uint8_t *out, size_t cap, size_t *len);
int auth_on_hello(struct auth_session *s, const uint8_t *in, size_t len);
int auth_proof(struct auth_session *s, uint8_t *out, size_t cap, size_t *len);
int auth_on_proof(struct auth_session *s, const uint8_t *in, size_t len);
/* true once this side has sent and received everything it must, with the
 * peer's PROOF verified. */
bool auth_done(const struct auth_session *s);
/* The peer's node name, only once auth_done (before, it is an unproven
 * claim): NULL otherwise. It proves the peer holds the cluster key, not
 * that it is that node: every key holder can claim any name. */
const char *auth_peer_name(const struct auth_session *s);
/* The wire both sides seal with once auth_done: the stronger of the two
 * asked for (encrypted if either side asked for it), or -EPROTO before. */
int auth_wire(const struct auth_session *s);
/* The key that seals the frames after the handshake (common/seal.h),
 * the same on both sides, and bound to auth_wire (the PROOFs cover both
 * HELLOs' wire bytes too, so an altered one fails the handshake): 0, or
 * -EPROTO before auth_done. */
int auth_session_key(const struct auth_session *s, uint8_t out[AUTH_KEY_BYTES]);
void auth_end(struct auth_session *s);

#endif
