/* The membership (hosts file, cluster key, this node) and dialling a
 * node. */
#include "daemon/peers/peers.h"
#include "daemon/peers/peers_impl.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "daemon/net/net.h"
#include "daemon/net/peer.h"

struct peers peers;

int peers_members_open(const struct stage_config *cfg, char *why, size_t whylen)
{
	ssize_t self;
	int rc;

	peers.cfg = cfg;
	if (access(cfg->hosts, F_OK) < 0 && errno == ENOENT) {
		log_info("no hosts file at %s: a single node, nothing to replicate", cfg->hosts);
		return 0;
	}
	rc = hosts_load(&peers.hosts, cfg->hosts, why, whylen);
	if (rc < 0)
		return rc;
	self = hosts_find(&peers.hosts, cfg->name);
	if (self < 0) {
		snprintf(why, whylen, "%s: this node, '%s' (node.name), is not in it", cfg->hosts,
			 cfg->name);
		rc = -EINVAL;
		goto out_free_hosts;
	}
	peers.self = (size_t)self;
	if (peers.hosts.n > 1 && (rc = auth_key_load(&peers.key, cfg->key_file, why, whylen)) < 0)
		goto out_free_hosts;
	peers.cluster = true;
	return 0;
out_free_hosts:
	hosts_free(&peers.hosts);
	return rc;
}

void peers_members_close(void)
{
	if (peers.cluster) {
		auth_key_free(&peers.key);
		hosts_free(&peers.hosts);
	}
	peers.cluster = false;
}

const char *peers_self_name(void)
{
	return peers.cfg->name;
}

int peers_dial(size_t host, int connect_ms, int io_ms, struct xport **out, char *why,
	       size_t whylen)
{
	const struct host *h = &peers.hosts.v[host];
	char name[AUTH_NAME_MAX + 1];
	struct xport *x;
	int rc;

	rc = net_connect(h, connect_ms, &x, why, whylen);
	if (rc < 0)
		return rc;
	rc = peer_handshake(&x, &peers.key, peer_wire_of(peers.cfg->wire), peers.cfg->name, &peers.hosts, h->name,
			    PEERS_HANDSHAKE_MS, name, sizeof(name), why, whylen);
	if (rc < 0) {
		x->ops->close(x);
		return rc;
	}
	x->ops->set_timeout(x, io_ms);
	*out = x;
	return 0;
}
