/* Which transports this node speaks (transport = auto: each one available,
 * in order; TCP last), their listeners, and connecting to a peer with
 * fall-back from one transport to the next. Knows nothing of what is sent. */
#ifndef STAGE_NET_H
#define STAGE_NET_H

#include <stdbool.h>
#include <stddef.h>

#include "common/config.h"
#include "common/hosts.h"
#include "common/proto.h"
#include "common/xport.h"

/* The transports, and their listeners when listen. 0, or -errno with why
 * (a named transport that is not available). */
int net_open(const struct stage_config *cfg, bool listen, char *why, size_t whylen);
void net_close(void);
/* The listeners' fd for an event loop (one, or an epoll set of them; -1:
 * none), and, when it is readable, every pending connection accepted and
 * handed to serve, which owns it from then on. */
int net_listen_fd(void);
void net_accept(int (*serve)(struct xport *x));
/* Connects to h with the first transport that answers. */
int net_connect(const struct host *h, int timeout_ms, struct xport **x, char *why,
		size_t whylen);
/* The `transport` line of stage status. */
void net_status(struct msg *m);

#endif
