/* stage pull --cluster: SRC staged on every node named, the shared storage
 * read once in all (docs/ARCHITECTURE.md, "Cluster pull"). */
#ifndef STAGE_CPULL_H
#define STAGE_CPULL_H

#include "common/proto.h"
#include "common/xport.h"
#include "daemon/job/job.h"

/* Serves MSG_PULL_REQ with REQ_CLUSTER (sends the result): asks every node
 * of nodes (a --nodes LIST; NULL: the hosts file's) to pull src (into dest,
 * or the default), and compares what they staged. */
void cpull_run(struct job *j, const char *src, const char *dest, const char *nodes);
/* MSG_CPULL_ASK from the pull's asker: this node's part. */
int cpull_node_serve(struct xport *x, const char *peer, const struct msg *req);
/* MSG_CPULL_FETCH from a peer: a file of a pull this node serves. */
int cpull_fetch_serve(struct xport *x, const char *peer, const struct msg *req);

#endif
