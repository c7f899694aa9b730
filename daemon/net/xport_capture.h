/* A connection with nobody at the other end: the frames sent on it are kept
 * for the caller. A relay answers a question for itself in place with the
 * very function that answers it over the network (daemon/survey/fanout.c),
 * so the answer is the same frame, refusals included.
 *
 * recv finds the other end closed (-ENOTCONN); sends beyond the first
 * CAPTURE_FRAMES_MAX frames fail with -ENOBUFS (a question has one answer).
 */
#ifndef STAGE_XPORT_CAPTURE_H
#define STAGE_XPORT_CAPTURE_H

#include "common/xport.h"

#define CAPTURE_FRAMES_MAX 4

/* 0 or -ENOMEM. peer: what x->peer says (for log lines). x->ops->close
 * frees it with any frame not taken. */
int xport_capture_open(struct xport **x, const char *peer);
/* Moves the first frame sent, not yet taken, into *m: 0, or -ENOENT. */
int xport_capture_take(struct xport *x, struct msg *m);

#endif
