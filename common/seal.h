/* Sealing the frames after the handshake: each carries a 16-byte tag that
 * proves it comes from the peer that ran the handshake, unaltered, in
 * order, once; on an encrypted wire its bytes after the tag are also
 * unreadable to anyone without the key (docs/PROTOCOL.md, "Frames after
 * the handshake").
 *
 * AES-256-GCM under the connection's session key (auth_session_key), with
 * the 96-bit nonce = direction (u32 LE: 1 initiator to responder, 2 the
 * other way) || the frame's number in that direction (u64 LE, from 0).
 * Nothing of the number is sent: a frame dropped, replayed, reordered or
 * reflected back fails, since the receiver expects the next number of the
 * other direction.
 *   SEAL_AUTHENTICATED  every byte is additional data (GMAC): authenticated,
 *                       sent as it is.
 *   SEAL_ENCRYPTED      the head (the frame header, the tag's field header
 *                       and K_SEALED's) is additional data, the body (the
 *                       message's fields) is encrypted.
 * Chosen over the Poly1305 of version 1 by measurement (docs/BENCHMARKS.md):
 * with AES-NI and carry-less multiply, AES-256-GCM encrypts faster than
 * Poly1305 authenticates, and GMAC authenticates several times faster.
 */
#ifndef STAGE_SEAL_H
#define STAGE_SEAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define SEAL_KEY_BYTES 32
#define SEAL_TAG_BYTES 16

enum seal_wire {
	SEAL_AUTHENTICATED = 1,
	SEAL_ENCRYPTED = 2,
};

struct seal {
	void *tx_ctx, *rx_ctx;    /* EVP_CIPHER_CTX, keyed once */
	enum seal_wire wire;
	uint32_t tx_dir, rx_dir;
	uint64_t tx, rx;          /* numbers of the next frame out, in */
};

/* 0, or -ENOMEM / -EINVAL (nothing to end then). */
int seal_init(struct seal *s, const uint8_t key[SEAL_KEY_BYTES], bool initiator,
	      enum seal_wire wire);
/* Wipes the keys; safe on a zeroed seal. */
void seal_end(struct seal *s);
/* "authenticated", "encrypted". */
const char *seal_wire_name(enum seal_wire w);

/* The next frame out: head[0..nh) and then body[0..nb), in that order.
 * The head is authenticated as it is. The body is too on an authenticated
 * wire (out unused: NULL); on an encrypted one piece i is encrypted into
 * out[i] (the piece itself, or as many bytes elsewhere) and the ciphertext
 * is authenticated. Counts the frame. 0, or -EIO (the library failed: the
 * connection is to be dropped). */
int seal_tag(struct seal *s, const struct iovec *head, int nh, const struct iovec *body, int nb,
	     uint8_t *const *out, uint8_t tag[SEAL_TAG_BYTES]);
/* Checks the next frame in, head[0..nh) then body[0..n), against tag: on
 * an encrypted wire the body is decrypted in place (its bytes are garbage
 * when the tag is wrong). 0 and counted, or -EBADMSG (the count stays: the
 * connection is to be dropped). */
int seal_check(struct seal *s, const struct iovec *head, int nh, uint8_t *body, size_t n,
	       const uint8_t tag[SEAL_TAG_BYTES]);

#endif
