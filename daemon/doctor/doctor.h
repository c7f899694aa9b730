/* stage doctor: the cluster preflight (docs/ARCHITECTURE.md, "stage doctor").
 *
 * The daemon the client asks coordinates (dr_run.c): it asks every node's
 * daemon, over the authenticated peer connection, for what that node can
 * measure — its facts, clock, disks, routes, the ports it can open and dial,
 * the bandwidth to another node — and decides what is a problem
 * (dr_decide.c). Every node answers the same questions, the asking one in
 * place (dr_serve.c). One doctor at a time per node: a node busy with one
 * session refuses another's questions.
 */
#ifndef STAGE_DOCTOR_H
#define STAGE_DOCTOR_H

#include "common/config.h"
#include "common/proto.h"
#include "common/xport.h"
#include "daemon/job/job.h"

/* Serves MSG_DOCTOR_REQ (sends checks, matrices, the result). nodes and
 * ports: --nodes and --ports as given, or NULL. */
void doctor_run(struct job *j, const char *nodes, const char *ports);

/* MSG_DOCTOR_ASK from a peer (peers_serve). 0 to go on, -errno to
 * close the connection (a refusal has been sent). */
int doctor_serve(struct xport *x, const char *peer, const struct msg *req);

/* Checks the [doctor] keys the config's own table cannot (the facts'
 * syntax): 0 or -EINVAL with why naming the key. At start-up. */
int doctor_check_config(const struct stage_config *cfg, char *why, size_t whylen);

#endif
