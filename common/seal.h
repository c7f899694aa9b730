/* Sealing the frames after the handshake: each carries a 16-byte tag that
 * proves it comes from the peer that ran the handshake, unaltered, in
 * order, once (docs/PROTOCOL.md, "Frames after the handshake").
 *
 * The tag of a frame is Poly1305 over its bytes but the tag itself, keyed
 * with a one-time key: the first 32 bytes of ChaCha20 (IETF) under the
 * session key (auth_session_key), nonce = direction (u32 LE: 1 initiator to
 * responder, 2 the other way) || the frame's number in that direction (u64
 * LE, from 0). Nothing of the number is sent: a frame dropped, replayed,
 * reordered or reflected back fails, since the receiver expects the next
 * number of the other direction. The one-time key is made as in
 * ChaCha20-Poly1305 (RFC 8439, 2.6); the frame's own header gives its
 * length, so the bytes need no length block after them.
 *
 * The wire is authenticated, not encrypted.
 */
#ifndef STAGE_SEAL_H
#define STAGE_SEAL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#define SEAL_KEY_BYTES 32
#define SEAL_TAG_BYTES 16

struct seal {
	uint8_t key[SEAL_KEY_BYTES];
	uint32_t tx_dir, rx_dir;
	uint64_t tx, rx;          /* numbers of the next frame out, in */
};

void seal_init(struct seal *s, const uint8_t key[SEAL_KEY_BYTES], bool initiator);
/* Wipes the key. */
void seal_end(struct seal *s);
/* The tag of the next frame out, over iov[0..n) in order; counts it. */
void seal_tag(struct seal *s, const struct iovec *iov, int n, uint8_t tag[SEAL_TAG_BYTES]);
/* Checks the next frame in against tag: 0 and counted, or -EBADMSG (the
 * count stays: the connection is to be dropped). */
int seal_check(struct seal *s, const struct iovec *iov, int n, const uint8_t tag[SEAL_TAG_BYTES]);

#endif
