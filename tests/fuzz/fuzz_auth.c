/* libFuzzer target: the handshake messages a peer without the key can send.
 *
 * Byte 0 picks the side (bit 0: we are the initiator) and byte 1 how many of
 * the rest are the peer's HELLO; what follows is the peer's PROOF. Whatever
 * the bytes, nothing may crash or read outside them, a refused message must
 * end the session, and no PROOF may verify: the fuzzer does not hold the key
 * (and cannot see our fresh nonce). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/auth.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct auth_key key;
	uint8_t out[AUTH_MSG_MAX];
	struct auth_session *s;
	bool initiator;
	size_t hello_len, n;
	int rc;

	if (!key.mac && auth_key_derive(&key, "fuzz-secret-0123456789abcdef0123", 32, NULL, 0) != 0)
		abort();
	if (size < 2)
		return 0;
	initiator = data[0] & 1;
	hello_len = data[1];
	/* Lengths past 255 reach the size limit too. */
	if (data[0] & 2)
		hello_len += 256;
	data += 2;
	size -= 2;
	if (hello_len > size)
		hello_len = size;

	if (auth_begin(&s, &key, "fuzz-node", initiator) != 0)
		abort();
	if (initiator && auth_hello(s, out, sizeof(out), &n) != 0)
		abort();
	rc = auth_on_hello(s, data, hello_len);
	if (rc != 0) {
		if (rc != -EBADMSG && rc != -EACCES)
			abort();
		if (auth_on_hello(s, data, hello_len) != -EPROTO || auth_done(s))
			abort();
		goto out;
	}
	if (hello_len < AUTH_HELLO_MIN || hello_len > AUTH_HELLO_MAX)
		abort();
	if (!initiator && auth_hello(s, out, sizeof(out), &n) != 0)
		abort();
	if (initiator && auth_proof(s, out, sizeof(out), &n) != 0)
		abort();
	rc = auth_on_proof(s, data + hello_len, size - hello_len);
	if (rc != -EBADMSG && rc != -EACCES)
		abort();
	if (auth_done(s) || auth_peer_name(s))
		abort();
out:
	auth_end(s);
	return 0;
}
