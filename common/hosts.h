/* The cluster hosts file ([cluster] hosts, BRIEF §4) and replica placement
 * (BRIEF §7, the SCR "partner" scheme).
 *
 * Format: one node a line,
 *
 *     NAME HOST:PORT [domain=RACK] [rdma=ADDR]
 *
 * fields separated by white space; '#' at the start of a line or after white
 * space starts a comment; blank lines are ignored. NAME follows
 * config_check_name (it becomes a directory name under replica_root) and is
 * unique. HOST:PORT follows config_parse_hostport and is unique (host names
 * compared without case, IPv6 addresses by value). Options come at most once
 * each, in any order: domain=RACK names the failure domain (a rack, a PDU) in
 * config_check_name's alphabet; rdma=ADDR is the address of the node's RDMA
 * interface, an IPv4 address, a host name or an IPv6 address (bare or in
 * brackets), with no port: RDMA uses the node's PORT. Any other option is an
 * error. At most HOSTS_MAX_NODES nodes, at least one, and a file of at most
 * HOSTS_MAX_FILE bytes.
 *
 * Placement: node i's copies go to the nodes after it in file order, wrapping
 * around, skipping nodes in i's domain, until `replicas` are found. A node
 * with no domain= shares a domain with nobody, itself excepted. With
 *
 *     a 10.0.0.1:7420 domain=r1
 *     b 10.0.0.2:7420 domain=r1
 *     c 10.0.0.3:7420 domain=r2
 *     d 10.0.0.4:7420 domain=r2
 *
 * replicas=1 gives a->c, b->c, c->a, d->a (b and d are skipped as a's and
 * c's rack mates; d wraps round to a), and replicas=2 gives a->c,d b->c,d
 * c->a,b d->a,b. Note that with replicas=1 c and a each hold two nodes'
 * copies while b and d hold none: listing the racks interleaved (a c b d)
 * spreads the load, giving a->c c->b b->d d->a.
 *
 * Too few eligible nodes: replicas=3 above finds only 2 partners per node
 * (every node of the other rack). hosts_partners then returns fewer than
 * asked rather than failing, because a degraded copy beats none; the caller
 * compares the count with what it asked for and reports the shortfall. A
 * single-node cluster, or one where every node shares a domain, has no
 * partners at all.
 */
#ifndef STAGE_HOSTS_H
#define STAGE_HOSTS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/config.h"      /* CFG_REPLICAS_ALL */

/* The holder name of the durable tier ([durable] root): a holder beside the
 * nodes in verify --cluster and resume, and `restore --from durable`. No node
 * may be called so (hosts.c refuses it). */
#define HOLD_DURABLE "durable"

#define HOSTS_MAX_NODES 4096
#define HOSTS_MAX_FILE  (1u << 20)

struct host {
	char *name;     /* owned; valid per config_check_name, unique in the file */
	char *host;     /* owned; as written, IPv6 brackets dropped */
	uint16_t port;  /* 1..65535 */
	char *domain;   /* owned; NULL if none */
	char *rdma;     /* owned; as written, brackets dropped; NULL if none */
};

struct hosts {
	struct host *v; /* owned; file order, which is what placement follows */
	size_t n;       /* 1..HOSTS_MAX_NODES once parsed, 0 when empty */
};

/* Parses a hosts file's text. All or nothing: on success *h holds the nodes
 * (release with hosts_free); on error *h is empty and err gets
 * "FILE:LINE: node 'NAME': why" or "FILE:LINE: why" (or "FILE: why" for the
 * whole file). Returns 0, -EINVAL (a bad file), -EFBIG (len over
 * HOSTS_MAX_FILE) or -ENOMEM. fname may be NULL ("<hosts>"), err too. */
int hosts_parse(struct hosts *h, const char *text, size_t len, const char *fname,
		char *err, size_t errlen);
/* Reads path and parses it; a file that cannot be read is "PATH: why" and
 * the -errno of the failure. */
int hosts_load(struct hosts *h, const char *path, char *err, size_t errlen);
/* Releases everything and leaves *h empty; safe to call twice. */
void hosts_free(struct hosts *h);
/* The index of the node called name, or -1. */
ssize_t hosts_find(const struct hosts *h, const char *name);
/* The partners of node `self`: the next nodes after it in file order,
 * wrapping around, skipping nodes in self's domain (when self has one),
 * until `replicas` are found or every node was tried. replicas ==
 * CFG_REPLICAS_ALL means every eligible node. Writes their indices, in
 * placement order, into out (capacity cap) and returns how many: possibly
 * fewer than asked (see "Too few" above), never self, never a node of self's
 * domain, never one twice. -EINVAL for a bad self or replicas, -ENOSPC if
 * the partners found do not fit in cap (h->n - 1 always suffices). */
int hosts_partners(const struct hosts *h, size_t self, int replicas, size_t *out, size_t cap);

#endif
