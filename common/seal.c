/* Frame tags and encryption (seal.h), with OpenSSL's AES-256-GCM. */
#include "common/seal.h"

#include <errno.h>
#include <limits.h>
#include <openssl/evp.h>
#include <string.h>

#define IV_BYTES 12

static EVP_CIPHER_CTX *keyed(const uint8_t key[SEAL_KEY_BYTES], bool enc)
{
	EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();

	/* The key schedule once; each frame sets only its nonce. */
	if (c && EVP_CipherInit_ex(c, EVP_aes_256_gcm(), NULL, key, NULL, enc ? 1 : 0) == 1 &&
	    EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_IVLEN, IV_BYTES, NULL) == 1)
		return c;
	EVP_CIPHER_CTX_free(c);
	return NULL;
}

int seal_init(struct seal *s, const uint8_t key[SEAL_KEY_BYTES], bool initiator,
	      enum seal_wire wire)
{
	memset(s, 0, sizeof(*s));
	if (wire != SEAL_AUTHENTICATED && wire != SEAL_ENCRYPTED)
		return -EINVAL;
	s->tx_ctx = keyed(key, true);
	s->rx_ctx = keyed(key, false);
	if (!s->tx_ctx || !s->rx_ctx) {
		seal_end(s);
		return -ENOMEM;
	}
	s->wire = wire;
	s->tx_dir = initiator ? 1 : 2;
	s->rx_dir = initiator ? 2 : 1;
	return 0;
}

void seal_end(struct seal *s)
{
	/* EVP_CIPHER_CTX_free cleanses the key schedule. */
	EVP_CIPHER_CTX_free(s->tx_ctx);
	EVP_CIPHER_CTX_free(s->rx_ctx);
	memset(s, 0, sizeof(*s));
}

const char *seal_wire_name(enum seal_wire w)
{
	return w == SEAL_ENCRYPTED ? "encrypted" : w == SEAL_AUTHENTICATED ? "authenticated" : "?";
}

static void nonce(uint32_t dir, uint64_t n, uint8_t iv[IV_BYTES])
{
	for (int i = 0; i < 4; i++)
		iv[i] = (uint8_t)(dir >> (8 * i));
	for (int i = 0; i < 8; i++)
		iv[4 + i] = (uint8_t)(n >> (8 * i));
}

/* Additional data: p[0..n) in pieces an int can count. */
static bool aad(EVP_CIPHER_CTX *c, const uint8_t *p, size_t n)
{
	int got;

	while (n) {
		int k = n > INT_MAX / 2 ? INT_MAX / 2 : (int)n;

		if (EVP_CipherUpdate(c, NULL, &got, p, k) != 1)
			return false;
		p += k;
		n -= (size_t)k;
	}
	return true;
}

/* Encrypts or decrypts in[0..n) into out, exactly n bytes (GCM is a
 * stream: no padding, nothing held back). */
static bool cipher(EVP_CIPHER_CTX *c, uint8_t *out, const uint8_t *in, size_t n)
{
	int got;

	while (n) {
		int k = n > INT_MAX / 2 ? INT_MAX / 2 : (int)n;

		if (EVP_CipherUpdate(c, out, &got, in, k) != 1 || got != k)
			return false;
		in += k;
		out += k;
		n -= (size_t)k;
	}
	return true;
}

int seal_tag(struct seal *s, const struct iovec *head, int nh, const struct iovec *body, int nb,
	     uint8_t *const *out, uint8_t tag[SEAL_TAG_BYTES])
{
	EVP_CIPHER_CTX *c = s->tx_ctx;
	uint8_t iv[IV_BYTES];
	bool ok;
	int got;

	if (s->tx == UINT64_MAX)
		return -EIO;    /* a nonce is never used twice: 2^64 frames, never */
	nonce(s->tx_dir, s->tx, iv);
	ok = EVP_CipherInit_ex(c, NULL, NULL, NULL, iv, 1) == 1;
	for (int i = 0; ok && i < nh; i++)
		ok = aad(c, head[i].iov_base, head[i].iov_len);
	for (int i = 0; ok && i < nb; i++)
		ok = s->wire == SEAL_ENCRYPTED
			? cipher(c, out[i], body[i].iov_base, body[i].iov_len)
			: aad(c, body[i].iov_base, body[i].iov_len);
	ok = ok && EVP_CipherFinal_ex(c, iv, &got) == 1 &&
	     EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, SEAL_TAG_BYTES, tag) == 1;
	if (!ok)
		return -EIO;
	s->tx++;
	return 0;
}

int seal_check(struct seal *s, const struct iovec *head, int nh, uint8_t *body, size_t n,
	       const uint8_t tag[SEAL_TAG_BYTES])
{
	EVP_CIPHER_CTX *c = s->rx_ctx;
	uint8_t iv[IV_BYTES], t[SEAL_TAG_BYTES];
	bool ok;
	int got;

	nonce(s->rx_dir, s->rx, iv);
	memcpy(t, tag, sizeof(t));
	ok = EVP_CipherInit_ex(c, NULL, NULL, NULL, iv, 0) == 1;
	for (int i = 0; ok && i < nh; i++)
		ok = aad(c, head[i].iov_base, head[i].iov_len);
	if (ok)
		ok = s->wire == SEAL_ENCRYPTED ? cipher(c, body, body, n) : aad(c, body, n);
	/* The final call compares the tag in constant time. */
	ok = ok && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, SEAL_TAG_BYTES, t) == 1 &&
	     EVP_CipherFinal_ex(c, iv, &got) == 1;
	if (!ok)
		return -EBADMSG;
	s->rx++;
	return 0;
}
