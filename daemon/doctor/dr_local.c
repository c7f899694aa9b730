/* What one node knows about itself without the network (dr_local.h): its
 * clock, the route to a peer, its RDMA ports, who holds a port. The facts a
 * job's config asks for are dr_facts.c's. */
#include "daemon/doctor/dr_local.h"
#include "daemon/doctor/dr_impl.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timex.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/why.h"

/* ------------------------------------------------------------ clock */

int dr_clock_state(struct dr_clock *c)
{
	struct timex tx;
	int st;

	memset(&tx, 0, sizeof(tx));        /* modes 0: read, change nothing */
	st = adjtimex(&tx);
	if (st < 0)
		return -errno;
	c->state = st;
	c->synced = st != TIME_ERROR && !(tx.status & STA_UNSYNC);
	c->maxerror_us = tx.maxerror;
	c->esterror_us = tx.esterror;
	return 0;
}

/* ------------------------------------------------------------ small files */

/* A small attribute file (sysfs, /proc/PID/comm), trimmed: 0, or -errno
 * and "unknown". */
static int read_attr(const char *path, char *out, size_t cap)
{
	char b[128];
	size_t s = 0, e;
	ssize_t r = -1;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd >= 0) {
		r = read(fd, b, sizeof(b) - 1);
		close(fd);
	}
	if (r <= 0) {
		snprintf(out, cap, "unknown");
		return r < 0 || fd < 0 ? -errno : -ENODATA;
	}
	e = (size_t)r;
	while (e > 0 && isspace((unsigned char)b[e - 1]))
		e--;
	while (s < e && b[s] != '\n' && isspace((unsigned char)b[s]))
		s++;
	snprintf(out, cap, "%.*s", (int)(e - s), b + s);
	return 0;
}

/* A number alone in a small file (/sys attributes): 0 or -errno. */
static int read_long(const char *path, long *v)
{
	char b[64], *end;
	int rc = read_attr(path, b, sizeof(b));

	if (rc < 0)
		return rc;
	errno = 0;
	*v = strtol(b, &end, 10);
	return end == b || *end || errno ? -EINVAL : 0;
}

/* ------------------------------------------------------------ route */

static bool same_addr(const struct sockaddr *a, const struct sockaddr *b)
{
	if (a->sa_family != b->sa_family)
		return false;
	if (a->sa_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	if (a->sa_family == AF_INET6) {
		const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;

		/* A link-local address may be on several interfaces: the
		 * scope says which one the route took. */
		return memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr)) == 0 &&
		       (!x->sin6_scope_id || !y->sin6_scope_id || x->sin6_scope_id == y->sin6_scope_id);
	}
	return false;
}

static const char *addr_text(const struct sockaddr *sa, char *buf, size_t len)
{
	const void *a = sa->sa_family == AF_INET ? (const void *)&((const struct sockaddr_in *)sa)->sin_addr
						 : (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr;

	if (!inet_ntop(sa->sa_family, a, buf, (socklen_t)len))
		snprintf(buf, len, "?");
	return buf;
}

/* Which interface has the address local: its name (an alias label cut at
 * ':', which no device name holds) and whether it is the loopback. */
static int find_if(const struct sockaddr *local, struct dr_route *r, bool *loopback)
{
	struct ifaddrs *ifs, *i;
	int rc = -ENODEV;

	if (getifaddrs(&ifs) < 0)
		return -errno;
	for (i = ifs; i; i = i->ifa_next)
		if (i->ifa_addr && same_addr(i->ifa_addr, local)) {
			snprintf(r->ifname, sizeof(r->ifname), "%.*s", (int)strcspn(i->ifa_name, ":"),
				 i->ifa_name);
			*loopback = i->ifa_flags & IFF_LOOPBACK;
			rc = 0;
			break;
		}
	freeifaddrs(ifs);
	return rc;
}

static int gai_errno(int rc)
{
	switch (rc) {
	case EAI_SYSTEM:
		return errno ? errno : EIO;
	case EAI_MEMORY:
		return ENOMEM;
	case EAI_AGAIN:
		return EAGAIN;
	default:
		return ENOENT;
	}
}

int dr_route(const char *host, uint16_t port, struct dr_route *r, char *why, size_t whylen)
{
	struct addrinfo hints = { .ai_socktype = SOCK_DGRAM, .ai_flags = AI_NUMERICSERV }, *ai, *a;
	char name[256], serv[8], addr[INET6_ADDRSTRLEN], path[64 + sizeof(r->ifname)];
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	size_t hl = strlen(host);
	bool loopback = false;
	int fd = -1, rc, err = EHOSTUNREACH;
	long v;

	if (why && whylen)
		why[0] = '\0';
	memset(r, 0, sizeof(*r));
	r->mtu = -1;
	r->speed_mbps = -1;
	if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']')
		host++, hl -= 2;
	if (hl == 0 || hl >= sizeof(name))
		return why_fail(why, whylen, -EINVAL, "cannot resolve '%.*s': not a host name", (int)hl, host);
	memcpy(name, host, hl);
	name[hl] = '\0';
	snprintf(serv, sizeof(serv), "%u", port);
	rc = getaddrinfo(name, serv, &hints, &ai);
	if (rc) {
		err = gai_errno(rc);
		why_fail(why, whylen, -EINVAL, "cannot resolve %s: %s", name,
		    rc == EAI_SYSTEM ? strerror(err) : gai_strerror(rc));
		return -err;
	}
	for (a = ai; a; a = a->ai_next) {
		fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) == 0)
			break;
		err = errno;
		if (fd >= 0)
			close(fd);
		fd = -1;
	}
	addr_text(ai->ai_addr, addr, sizeof(addr));
	freeaddrinfo(ai);
	if (fd < 0) {
		if (strcmp(addr, name) == 0)
			why_fail(why, whylen, -EINVAL, "no route to %s: %s", name, strerror(err));
		else
			why_fail(why, whylen, -EINVAL, "no route to %s (%s): %s", name, addr, strerror(err));
		return -err;
	}
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
		rc = -errno;
		why_fail(why, whylen, -EINVAL, "no route to %s: %s", name, strerror(-rc));
		goto out_close;
	}
	addr_text((struct sockaddr *)&ss, r->local, sizeof(r->local));
	rc = find_if((struct sockaddr *)&ss, r, &loopback);
	if (rc < 0) {
		if (rc == -ENODEV)
			why_fail(why, whylen, -EINVAL, "route to %s: no interface has %s, the address it leaves from",
			    name, r->local);
		else
			why_fail(why, whylen, -EINVAL, "route to %s: getifaddrs: %s", name, strerror(-rc));
		goto out_close;
	}
	snprintf(path, sizeof(path), "/sys/class/net/%s/mtu", r->ifname);
	if (read_long(path, &v) == 0 && v > 0 && v <= 0x7fffffff) {
		r->mtu = (int)v;
	} else {
		/* No /sys (some containers): the kernel says it as well. */
		struct ifreq ifr = { .ifr_mtu = 0 };

		snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%.*s", IFNAMSIZ - 1, r->ifname);
		if (ioctl(fd, SIOCGIFMTU, &ifr) == 0 && ifr.ifr_mtu > 0)
			r->mtu = ifr.ifr_mtu;
	}
	/* A link that is down or virtual has no speed (EINVAL, or -1). */
	snprintf(path, sizeof(path), "/sys/class/net/%s/speed", r->ifname);
	if (!loopback && read_long(path, &v) == 0 && v > 0)
		r->speed_mbps = v;
	rc = 0;
out_close:
	close(fd);
	return rc;
}

/* ------------------------------------------------------------ rdma */

#define RDMA_CLASS "/sys/class/infiniband"
#define RDMA_DEVS_MAX 64
#define RDMA_DEV_W 64
#define RDMA_PORTS_MAX 64

/* The port numbers of DEV, sorted, at most RDMA_PORTS_MAX. */
static size_t rdma_dev_ports(const char *dev, int *ports)
{
	char path[sizeof(RDMA_CLASS) + RDMA_DEV_W + 16];
	struct dirent *de;
	size_t n = 0;
	DIR *d;

	snprintf(path, sizeof(path), RDMA_CLASS "/%s/ports", dev);
	d = opendir(path);
	if (!d)
		return 0;
	while ((de = readdir(d))) {
		char *end;
		long p = strtol(de->d_name, &end, 10);
		size_t at = n;

		if (end == de->d_name || *end || p < 0 || p > 65535)
			continue;
		while (at > 0 && ports[at - 1] > p)
			at--;
		if (at >= RDMA_PORTS_MAX)
			continue;
		memmove(ports + at + 1, ports + at,
			((n < RDMA_PORTS_MAX ? n : RDMA_PORTS_MAX - 1) - at) * sizeof(*ports));
		ports[at] = (int)p;
		if (n < RDMA_PORTS_MAX)
			n++;
	}
	closedir(d);
	return n;
}

int dr_rdma_ports(struct dr_rdma_port *out, size_t cap, size_t *n)
{
	char devs[RDMA_DEVS_MAX][RDMA_DEV_W];
	int ports[RDMA_PORTS_MAX];
	size_t nd = 0;
	struct dirent *de;
	DIR *d;

	*n = 0;
	d = opendir(RDMA_CLASS);
	if (!d)
		return errno == ENOENT ? 0 : -errno;
	while ((de = readdir(d)))
		if (!dr_dot_or_dotdot(de->d_name))
			dr_keep_sorted(&devs[0][0], RDMA_DEV_W, RDMA_DEVS_MAX, &nd, de->d_name);
	closedir(d);
	for (size_t i = 0; i < nd && *n < cap; i++) {
		size_t np = rdma_dev_ports(devs[i], ports);

		for (size_t k = 0; k < np && *n < cap; k++) {
			struct dr_rdma_port *o = &out[(*n)++];
			char path[sizeof(RDMA_CLASS) + RDMA_DEV_W + 40];
			const char *s;

			snprintf(o->dev, sizeof(o->dev), "%s", devs[i]);
			o->port = ports[k];
			snprintf(path, sizeof(path), RDMA_CLASS "/%s/ports/%d/state", devs[i], ports[k]);
			read_attr(path, o->state, sizeof(o->state));
			/* "4: ACTIVE": the name says it, the number is the enum. */
			s = o->state + strspn(o->state, "0123456789");
			if (s != o->state && s[0] == ':' && s[1] == ' ')
				memmove(o->state, s + 2, strlen(s + 2) + 1);
			snprintf(path, sizeof(path), RDMA_CLASS "/%s/ports/%d/rate", devs[i], ports[k]);
			read_attr(path, o->rate, sizeof(o->rate));
		}
	}
	return 0;
}

/* ------------------------------------------------------------ port owner */

#define OWNER_INODES_MAX 64        /* listening sockets on one port (SO_REUSEPORT, v4 and v6) */

/* The inodes of the LISTEN sockets on port in one /proc/net/tcp* table:
 *   sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode */
static int scan_tcp(const char *path, unsigned port, unsigned long *ino, size_t *ni)
{
	char line[512];
	bool header = true;
	FILE *f = fopen(path, "re");

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		unsigned lport, st;
		unsigned long inode;

		if (!strchr(line, '\n')) {
			int c;

			while ((c = getc(f)) != EOF && c != '\n')
				;
		}
		if (header) {
			header = false;
			continue;
		}
		if (sscanf(line, " %*u: %*[0-9A-Fa-f]:%x %*[0-9A-Fa-f]:%*x %x %*s %*s %*s %*s %*s %lu",
			   &lport, &st, &inode) == 3 &&
		    lport == port && st == 0x0a && inode != 0 && *ni < OWNER_INODES_MAX)
			ino[(*ni)++] = inode;
	}
	fclose(f);
	return 0;
}

static bool all_digits(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (*s < '0' || *s > '9')
			return false;
	return true;
}

/* Whether process pid (its /proc name) holds one of the sockets. */
static bool holds(const char *pid, const unsigned long *ino, size_t ni)
{
	char path[64];
	struct dirent *de;
	bool hit = false;
	int dfd;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%s/fd", pid);
	dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return false;          /* another user's, or gone */
	d = fdopendir(dfd);
	if (!d) {
		close(dfd);
		return false;
	}
	while (!hit && (de = readdir(d))) {
		char link[64], *end;
		unsigned long v;
		ssize_t l = readlinkat(dfd, de->d_name, link, sizeof(link) - 1);

		if (l < 10 || memcmp(link, "socket:[", 8) != 0)
			continue;
		link[l] = '\0';
		v = strtoul(link + 8, &end, 10);
		if (*end != ']')
			continue;
		for (size_t i = 0; i < ni && !hit; i++)
			hit = ino[i] == v;
	}
	closedir(d);
	return hit;
}

int dr_port_owner(uint16_t port, char *who, size_t len)
{
	unsigned long ino[OWNER_INODES_MAX];
	char comm[64], path[64];
	struct dirent *de;
	size_t ni = 0;
	long pid = 0;
	DIR *proc;
	int rc;

	if (len)
		who[0] = '\0';
	if (port == 0)
		return -EINVAL;
	rc = scan_tcp("/proc/net/tcp", port, ino, &ni);
	if (rc < 0)
		return rc == -ENOENT ? -ENOSYS : rc;   /* -ENOENT means nobody listens */
	rc = scan_tcp("/proc/net/tcp6", port, ino, &ni);
	if (rc < 0 && rc != -ENOENT)               /* no IPv6 */
		return rc;
	if (ni == 0)
		return -ENOENT;
	proc = opendir("/proc");
	while (proc && !pid && (de = readdir(proc)))
		if (all_digits(de->d_name) && strlen(de->d_name) < 12 && holds(de->d_name, ino, ni))
			pid = strtol(de->d_name, NULL, 10);
	if (proc)
		closedir(proc);
	if (!pid) {
		snprintf(who, len, "another process");
		return 0;
	}
	snprintf(path, sizeof(path), "/proc/%ld/comm", pid);
	rc = read_attr(path, comm, sizeof(comm));
	for (char *c = comm; *c; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f)
			*c = '?';
	if (rc < 0)                        /* it has just ended */
		snprintf(who, len, "another process (pid %ld)", pid);
	else
		snprintf(who, len, "%s (pid %ld)", comm, pid);
	return 0;
}
