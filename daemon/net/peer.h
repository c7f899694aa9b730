/* An authenticated connection to another node: common/auth.h's handshake
 * carried in MSG_PEER_HELLO / MSG_PEER_PROOF frames over a transport, before
 * any other frame. Afterwards the caller exchanges sealed frames with x->ops.
 *
 *   initiator (the one that connected)      responder (the one that accepted)
 *   HELLO  --------------------------->
 *          <---------------------------     HELLO
 *   PROOF  --------------------------->     (checked: wrong key -> MSG_ERROR, close)
 *          <---------------------------     PROOF
 *
 * The responder also refuses a peer whose (proven) name is not in the hosts
 * file, and the initiator a responder whose name is not the node it dialled.
 */
#ifndef STAGE_PEER_H
#define STAGE_PEER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/auth.h"
#include "common/config.h"
#include "common/hosts.h"
#include "common/seal.h"
#include "common/xport.h"

/* Runs the handshake on *x within timeout_ms (x's timeout is left at that
 * value); once both sides have proven the key, *x is replaced by the
 * sealed connection over it (daemon/net/xport_seal.h), which owns it: every
 * frame after the handshake carries a tag, a refusal of the proven name
 * included; wire (enum seal_wire) is what this side asks for: the
 * connection is encrypted if either side asks for it. On failure the
 * caller closes *x, whichever it is then. expect: the node the initiator
 * dialled (its name must answer), or
 * NULL for a responder. hosts: the responder looks up the peer's name there.
 * On success 0 and peer_name (cap >= AUTH_NAME_MAX + 1). Errors: -EACCES a
 * wrong key or an unknown or unexpected name (why says which; the responder
 * has sent MSG_ERROR before returning), -EBADMSG a frame that is not the
 * next handshake message, -ETIMEDOUT, or the transport's -errno. */
/* [cluster] wire as the handshake's enum seal_wire. */
static inline int peer_wire_of(int cfg_wire)
{
	return cfg_wire == CFG_WIRE_ENCRYPTED ? SEAL_ENCRYPTED : SEAL_AUTHENTICATED;
}

int peer_handshake(struct xport **x, const struct auth_key *key, int wire, const char *my_name,
		   const struct hosts *hosts, const char *expect, int timeout_ms,
		   char *peer_name, size_t cap, char *why, size_t whylen);

/* How much of a peer's MSG_ERROR text is kept: it is the peer's words, so
 * it is bounded and stripped of control characters before it can reach a
 * log line, a status line or a terminal. */
#define PEER_TEXT_MAX 200
/* A peer's MSG_ERROR: its -errno (EPROTO when absent or out of range) and
 * its text, made safe, in text. */
int peer_error_of(const struct msg *m, char text[PEER_TEXT_MAX + 1]);
/* A peer's bytes p[0..n) as text in out (cap bytes): cut to fit, every
 * control character a '?'. */
void peer_safe_text(char *out, size_t cap, const uint8_t *p, size_t n);
/* The same as "NODE refused: TEXT" in why; returns its -errno. */
int peer_refused(const struct msg *m, const char *node, char *why, size_t whylen);

/* Sends MSG_ERROR (K_ERRNO, K_TEXT) and ignores a failure to: the
 * connection is about to close anyway. */
void peer_send_error(struct xport *x, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif
