/* Inside the peer layer: what peers.c (its life) calls of members.c (the
 * membership) and serve.c (the serving). Not for the rest of the daemon
 * (it uses peers.h). */
#ifndef STAGE_PEERS_IMPL_H
#define STAGE_PEERS_IMPL_H

#include <stddef.h>

#include "common/config.h"

/* members.c: the hosts file, this node, the key (peers.h's peers_open
 * says what fails); and their mirror. */
int peers_members_open(const struct stage_config *cfg, char *why, size_t whylen);
void peers_members_close(void);
/* serve.c: ready to admit connections (peers_open, once the transports
 * are open). */
void peers_serve_open(void);
/* Every connection shut down and its thread ended; none admitted after. */
void peers_serve_stop(void);

#endif
