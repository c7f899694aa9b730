/* The client's side of the control socket: find it, connect, send one request
 * and hand every reply frame to the caller until the result, which is last.
 * Nothing here prints: errors come back as -errno for the caller to word. */
#ifndef STAGE_CLI_CONN_H
#define STAGE_CLI_CONN_H

#include "common/proto.h"

/* The socket to use: opt (--socket) if given, else $STAGE_SOCKET if set and
 * non-empty, else the daemon's own default (common/config.c decides it, so
 * the two never disagree). 0 and *out (malloc'd), or -errno. */
int cli_conn_socket_path(const char *opt, char **out);

/* Connects to the Unix stream socket at path. 0 and *fd, or -errno
 * (-ENAMETOOLONG when path does not fit a sockaddr_un). */
int cli_conn_open(const char *path, int *fd);

/* Called for each reply frame; a negative return stops the exchange with it. */
typedef int (*cli_conn_frame_fn)(void *ctx, const struct msg *m);

/* Sends req and passes each reply frame to on_frame, up to and including
 * MSG_RESULT. 0 after the result, on_frame's error, or msg_send/msg_recv's:
 * -ENOTCONN if the daemon closed the connection before the result,
 * -ECONNRESET if it did so inside a frame, -EBADMSG for a malformed frame. */
int cli_conn_exchange(int fd, const struct msg *req, cli_conn_frame_fn on_frame, void *ctx);

#endif
