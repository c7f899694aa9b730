/* The control socket: a Unix stream socket, reachable by the daemon's owner
 * and group only, one request per connection, served on its own thread. */
#ifndef STAGE_CTL_H
#define STAGE_CTL_H

#include <stddef.h>

#include "common/config.h"

/* Binds and listens at cfg->socket (creating its directory). Refuses to
 * steal the socket of a live daemon. 0 and *fd, or -errno and why. */
int ctl_listen(const struct stage_config *cfg, int *fd, char *why, size_t whylen);
void ctl_unlisten(const struct stage_config *cfg, int fd);
/* Takes an accepted connection and serves it on a detached thread. */
int ctl_spawn(const struct stage_config *cfg, int conn);
/* Connections being served; the daemon waits for zero before it exits. */
unsigned ctl_active(void);

#endif
