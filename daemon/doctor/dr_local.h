/* What one node knows about itself without the network: the facts that must
 * agree on every node (kernel, GPU driver, RDMA devices...), the clock's
 * sync state, the interface it would use toward a peer, its RDMA ports, and
 * who holds a TCP port. Every function is safe on any thread of the daemon:
 * a fact's program is spawned (posix_spawnp), never a fork of the daemon,
 * and nothing here keeps state between calls.
 */
#ifndef STAGE_DR_LOCAL_H
#define STAGE_DR_LOCAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DR_FACT_NAME_MAX 32
#define DR_FACT_VALUE_MAX 255          /* bytes, "…" included when cut */
#define DR_FACTS_MAX 32
#define DR_FACT_ARGS_MAX 32            /* words after PROG of a run fact */
#define DR_FACT_READ_MAX 4096          /* bytes read of a file or a program's stdout */
#define DR_FACT_RUN_MS 2000            /* a fact's program is killed after this */

struct dr_fact {
	char name[DR_FACT_NAME_MAX + 1];
	char value[DR_FACT_VALUE_MAX + 1];   /* UTF-8, no control characters */
};

/* Checks a facts spec, "NAME: KIND ARG... | NAME: KIND ARG...", KIND one of
 * file PATH, dir PATH, run PROG ARG... (words split on blanks, no quoting);
 * NAME 1..DR_FACT_NAME_MAX of [A-Za-z0-9_.-]. An empty spec (or NULL) has
 * no facts. 0, or -EINVAL with why quoting the bad part (unknown kind,
 * missing or extra argument, bad or duplicate name, an empty fact, more than
 * DR_FACTS_MAX facts or DR_FACT_ARGS_MAX arguments). */
int dr_facts_check(const char *spec, char *why, size_t whylen);

/* Evaluates every fact of spec, in its order, into out[0..*n). A fact that
 * cannot be read still has a value, in parentheses: "(none)" for a dir that
 * does not exist, "(cannot read PATH: CAUSE)", "(not installed)" for a PROG
 * not on PATH, "(exit N)" or "(killed by signal N)" for a program that
 * failed with no output, "(timed out after 2 s)".
 *   file: at most DR_FACT_READ_MAX bytes of a regular file (/proc and /sys
 *         files are), opened O_NONBLOCK so that a fifo cannot hang it;
 *   dir:  the entry names, sorted bytewise, joined by ", ";
 *   run:  stdout (at most DR_FACT_READ_MAX bytes), stdin /dev/null, stderr
 *         discarded, in a process group of its own, killed with it after
 *         DR_FACT_RUN_MS; default signal dispositions and an empty mask.
 * A value is trimmed, its non-empty lines joined by "; ", control
 * characters and invalid UTF-8 replaced ('?', a tab by a space), and cut to
 * DR_FACT_VALUE_MAX bytes ending in "…" at a character boundary. 0,
 * -EINVAL for a bad spec, -ENOSPC when it has more than cap facts (nothing
 * evaluated), -ENOMEM. Takes up to 2 s per run fact. */
int dr_facts_eval(const char *spec, struct dr_fact *out, size_t cap, size_t *n);

struct dr_clock {
	bool synced;                   /* state not TIME_ERROR and STA_UNSYNC clear */
	long maxerror_us, esterror_us; /* the kernel's (NTP daemon's) error bounds */
	int state;                     /* adjtimex's return: TIME_OK ... TIME_ERROR */
};

/* The kernel's clock discipline, read only (adjtimex with modes 0, which
 * needs no privilege). 0 or -errno. */
int dr_clock_state(struct dr_clock *c);

struct dr_route {
	char ifname[32];               /* the device (an IPv4 alias's label cut at ':') */
	char local[64];                /* this node's address on it, numeric */
	int mtu;                       /* -1 unknown */
	long speed_mbps;               /* -1 unknown, or loopback */
};

/* The interface this node would use to reach host:port (an IPv4 or IPv6
 * literal, brackets allowed, or a name): a UDP socket connect()ed there
 * (which sends nothing) and getsockname, the address found with getifaddrs,
 * MTU and speed from /sys/class/net/IF/{mtu,speed}. 0, or -errno with why
 * naming host and the cause ("no route to 10.0.0.9: Network is
 * unreachable", "cannot resolve n9: Name or service not known"). */
int dr_route(const char *host, uint16_t port, struct dr_route *r, char *why, size_t whylen);

struct dr_rdma_port {
	char dev[64];                  /* mlx5_0 */
	int port;                      /* 1.. */
	char state[32];                /* ACTIVE, DOWN... ("4: " dropped); "unknown" unreadable */
	char rate[64];                 /* "100 Gb/sec (4X EDR)"; "unknown" unreadable */
};

/* The ports of /sys/class/infiniband/DEV/ports/N, in order of device name
 * and port number, at most cap of them. 0 (*n = 0 when there is no such
 * directory) or -errno. */
int dr_rdma_ports(struct dr_rdma_port *out, size_t cap, size_t *n);

/* Who listens on TCP port `port` in the caller's network namespace: a
 * LISTEN socket of /proc/net/tcp or /proc/net/tcp6, then the process whose
 * /proc/PID/fd holds it: "COMM (pid P)", or "another process" when the
 * socket is there but no process we may look into holds it. 0 found,
 * -ENOENT nothing listens, -EINVAL port 0, -errno /proc/net/tcp unreadable.
 * One pass over /proc, no allocation that grows with what it finds. */
int dr_port_owner(uint16_t port, char *who, size_t len);

#endif
