/* The peer layer's life: the membership, the transports and the serving
 * opened in that order, and closed in the reverse (peers.h). */
#include "daemon/peers/peers.h"
#include "daemon/peers/peers_impl.h"

#include "daemon/net/net.h"

int peers_open(const struct stage_config *cfg, char *why, size_t whylen)
{
	int rc;

	rc = peers_members_open(cfg, why, whylen);
	if (rc < 0)
		return rc;
	/* Every node checks its transport (transport = rdma without a device
	 * is an error even alone); only a node with peers listens. */
	rc = net_open(cfg, peers.cluster && peers.hosts.n > 1, why, whylen);
	if (rc < 0)
		goto out_close_members;
	peers_serve_open();
	return 0;
out_close_members:
	peers_members_close();
	return rc;
}

void peers_stop(void)
{
	net_close();
	peers_serve_stop();
}

void peers_close(void)
{
	peers_members_close();
}

int peers_listen_fd(void)
{
	return net_listen_fd();
}
