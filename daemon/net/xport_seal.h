/* A sealed connection: after the handshake, every frame either way carries
 * a tag (common/seal.h) as its first field, K_MAC, and on an encrypted
 * wire the rest of it is encrypted; the wrapper adds it on
 * the way out and checks and removes it on the way in, so the code above
 * sees the frames it always did. It wraps any transport (it is itself a
 * table of xport.h, the inner one's name kept for status). */
#ifndef STAGE_XPORT_SEAL_H
#define STAGE_XPORT_SEAL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/seal.h"
#include "common/xport.h"

/* Replaces *x with a sealed connection over it (which now owns it), the
 * wire authenticated or encrypted as both sides agreed in the handshake.
 * 0, or -ENOMEM / -EINVAL (*x untouched). */
int xport_seal(struct xport **x, const uint8_t key[SEAL_KEY_BYTES], bool initiator,
	       enum seal_wire wire);

#endif
