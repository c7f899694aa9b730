/* libFuzzer target: the handshake messages a peer without the key can send.
 *
 * Byte 0 picks the side (bit 0: we are the initiator), adds 256 to the
 * HELLO's length (bit 1: lengths past 255 reach the size limit too) and
 * the wire we ask for (bit 2: authenticated, bit 4: encrypted, the later
 * winning; neither: auth_begin's default; bit 3: first try one that does
 * not exist, which must be refused and change nothing); byte 1 says how
 * many of the rest are the peer's HELLO; what follows is the peer's PROOF.
 * A HELLO of handshake version 2 is
 *   u8 1 | u8 2 | u8 role | u8 n | nonce (32) | name (n) | u8 wire (1 or 2),
 * 37 + n bytes. Whatever the bytes, nothing may crash or read outside
 * them; a refused message must end the session, and a HELLO is refused as
 * another version (-EPROTONOSUPPORT) exactly when its type byte says HELLO
 * and its version byte (whatever its length) is not 2; a taken HELLO is one
 * of that layout; the wire may be set only until our HELLO has gone, and
 * nothing of the session (the wire, the key, the peer's name) is given
 * before it is done; no PROOF may verify: the fuzzer does not hold the key
 * (and cannot see our fresh nonce). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/auth.h"
#include "common/seal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The wire byte of our HELLO: the one we set, or either when we set none. */
static bool asked(uint8_t got, int wire)
{
	return wire ? got == wire : got == SEAL_AUTHENTICATED || got == SEAL_ENCRYPTED;
}

/* Nothing of the session is to be had before it is done. */
static void nothing_yet(const struct auth_session *s)
{
	uint8_t sk[AUTH_KEY_BYTES];

	if (auth_done(s) || auth_peer_name(s) || auth_wire(s) != -EPROTO ||
	    auth_session_key(s, sk) != -EPROTO)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct auth_key key;
	uint8_t out[AUTH_MSG_MAX];
	struct auth_session *s;
	bool initiator;
	size_t hello_len, n;
	int rc, wire;

	if (!key.mac && auth_key_derive(&key, "fuzz-secret-0123456789abcdef0123", 32, NULL, 0) != 0)
		abort();
	if (size < 2)
		return 0;
	initiator = data[0] & 1;
	/* 0: the default, 1 or 2 */
	wire = data[0] & 16 ? SEAL_ENCRYPTED : data[0] & 4 ? SEAL_AUTHENTICATED : 0;
	hello_len = data[1];
	if (data[0] & 2)
		hello_len += 256;

	if (auth_begin(&s, &key, "fuzz-node", initiator) != 0)
		abort();
	if ((data[0] & 8) && (auth_set_wire(s, 0) != -EINVAL || auth_set_wire(s, 3) != -EINVAL))
		abort();
	if ((data[0] & 4) && auth_set_wire(s, SEAL_AUTHENTICATED) != 0)
		abort();
	if ((data[0] & 16) && auth_set_wire(s, SEAL_ENCRYPTED) != 0)
		abort();
	data += 2;
	size -= 2;
	if (hello_len > size)
		hello_len = size;

	if (initiator) {
		if (auth_hello(s, out, sizeof(out), &n) != 0 || n != 4u + AUTH_NONCE_BYTES + 9 + 1 ||
		    out[1] != 2 || !asked(out[n - 1], wire))
			abort();
		/* our HELLO has gone: too late to change the wire */
		if (auth_set_wire(s, SEAL_ENCRYPTED) != -EPROTO)
			abort();
	}
	nothing_yet(s);
	rc = auth_on_hello(s, data, hello_len);
	if (rc != 0) {
		bool other_version = hello_len >= 2 && data[0] == 1 && data[1] != 2;

		if (rc != -EBADMSG && rc != -EACCES && rc != -EPROTONOSUPPORT)
			abort();
		if ((rc == -EPROTONOSUPPORT) != other_version)
			abort();
		if (auth_on_hello(s, data, hello_len) != -EPROTO || auth_set_wire(s, 1) != -EPROTO)
			abort();
		nothing_yet(s);
		goto out;
	}
	/* taken: a version 2 HELLO of the other role, its length its name's */
	if (hello_len < AUTH_HELLO_MIN || hello_len > AUTH_HELLO_MAX || data[0] != 1 ||
	    data[1] != 2 || data[2] != (initiator ? 2 : 1) ||
	    hello_len != 4u + AUTH_NONCE_BYTES + data[3] + 1 ||
	    (data[hello_len - 1] != SEAL_AUTHENTICATED && data[hello_len - 1] != SEAL_ENCRYPTED))
		abort();
	nothing_yet(s);
	if (!initiator) {
		if (auth_hello(s, out, sizeof(out), &n) != 0 || n != 4u + AUTH_NONCE_BYTES + 9 + 1 ||
		    out[1] != 2 || !asked(out[n - 1], wire))
			abort();
		if (auth_set_wire(s, SEAL_ENCRYPTED) != -EPROTO)
			abort();
	}
	if (initiator && auth_proof(s, out, sizeof(out), &n) != 0)
		abort();
	rc = auth_on_proof(s, data + hello_len, size - hello_len);
	if (rc != -EBADMSG && rc != -EACCES)
		abort();
	nothing_yet(s);
out:
	auth_end(s);
	return 0;
}
