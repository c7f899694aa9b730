/* Frame tags (seal.h), with libsodium's ChaCha20 and Poly1305. */
#include "common/seal.h"

#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

void seal_init(struct seal *s, const uint8_t key[SEAL_KEY_BYTES], bool initiator)
{
	/* Idempotent: picks libsodium's implementations, once per process.
	 * It cannot fail where the daemon runs (auth_key_load called it). */
	if (sodium_init() < 0)
		abort();
	memcpy(s->key, key, SEAL_KEY_BYTES);
	s->tx_dir = initiator ? 1 : 2;
	s->rx_dir = initiator ? 2 : 1;
	s->tx = s->rx = 0;
}

void seal_end(struct seal *s)
{
	sodium_memzero(s, sizeof(*s));
}

static void tag_of(const struct seal *s, uint32_t dir, uint64_t n, const struct iovec *iov,
		   int niov, uint8_t tag[SEAL_TAG_BYTES])
{
	uint8_t nonce[crypto_stream_chacha20_ietf_NONCEBYTES] = { 0 };
	uint8_t otk[crypto_onetimeauth_KEYBYTES];
	crypto_onetimeauth_state st;

	for (int i = 0; i < 4; i++)
		nonce[i] = (uint8_t)(dir >> (8 * i));
	for (int i = 0; i < 8; i++)
		nonce[4 + i] = (uint8_t)(n >> (8 * i));
	crypto_stream_chacha20_ietf(otk, sizeof(otk), nonce, s->key);
	crypto_onetimeauth_init(&st, otk);
	for (int i = 0; i < niov; i++)
		crypto_onetimeauth_update(&st, iov[i].iov_base, iov[i].iov_len);
	crypto_onetimeauth_final(&st, tag);
	sodium_memzero(otk, sizeof(otk));
	sodium_memzero(&st, sizeof(st));
}

void seal_tag(struct seal *s, const struct iovec *iov, int n, uint8_t tag[SEAL_TAG_BYTES])
{
	if (s->tx == UINT64_MAX)
		abort();        /* a nonce is never used twice: 2^64 frames, never */
	tag_of(s, s->tx_dir, s->tx++, iov, n, tag);
}

int seal_check(struct seal *s, const struct iovec *iov, int n, const uint8_t tag[SEAL_TAG_BYTES])
{
	uint8_t want[SEAL_TAG_BYTES];
	int bad;

	tag_of(s, s->rx_dir, s->rx, iov, n, want);
	bad = crypto_verify_16(want, tag);
	sodium_memzero(want, sizeof(want));
	if (bad)
		return -EBADMSG;
	s->rx++;
	return 0;
}
