/* Configuration: one table (config.c) of every key with its type, bounds,
 * default and field drives the INI parser, the defaults and
 * `staged --print-config`. Keys of BRIEF §4 plus the extensions marked below,
 * documented in docs/ARCHITECTURE.md. */
#ifndef STAGE_CONFIG_H
#define STAGE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define CFG_MAX_ROOTS 16
#define CFG_REPLICAS_ALL (-1)

enum cfg_transport { CFG_TRANSPORT_AUTO, CFG_TRANSPORT_TCP, CFG_TRANSPORT_RDMA };
enum cfg_wire { CFG_WIRE_AUTHENTICATED, CFG_WIRE_ENCRYPTED };
enum cfg_compress { CFG_COMPRESS_AUTO, CFG_COMPRESS_OFF, CFG_COMPRESS_ZSTD, CFG_COMPRESS_FLOAT };
enum cfg_priority { CFG_PRIORITY_LOW, CFG_PRIORITY_NORMAL };
enum cfg_cache_reads { CFG_CACHE_READS_WARM, CFG_CACHE_READS_ALWAYS, CFG_CACHE_READS_AUTO };
enum cfg_stale { CFG_STALE_SKIP, CFG_STALE_SEND };
enum cfg_read_once { CFG_READ_ONCE_OFF, CFG_READ_ONCE_ON, CFG_READ_ONCE_AUTO };

struct stage_config {
	/* [node] */
	char *name;                 /* default: hostname */
	char *socket;               /* default: /run/stage/staged.sock as root,
	                               else $XDG_RUNTIME_DIR/stage.sock (or /tmp/stage-UID.sock) */
	char *socket_group;         /* extension: group of the socket, "" for the daemon's */
	char *listen;               /* HOST:PORT, default 0.0.0.0:7420 */
	char *state_dir;
	int log_level;              /* extension: error|warn|info|debug, default info */
	/* [paths] */
	char *source_roots[CFG_MAX_ROOTS]; /* absolute, no trailing '/', "/" allowed */
	int n_source_roots;
	char *stage_root;
	char *ckpt_root;
	char *replica_root;
	/* [cluster] */
	char *hosts;
	char *key_file;
	int replicas;               /* 0.. or CFG_REPLICAS_ALL */
	int keep;
	int peer_timeout;           /* extension: seconds a talking peer may be silent */
	int fanout;                 /* extension: nodes a question goes to directly; more relay */
	int wire;                   /* extension: enum cfg_wire, what peer connections ask for */
	/* [transfer] */
	int transport;              /* enum cfg_transport */
	int compress;               /* enum cfg_compress */
	bool watch;
	char *marker;               /* extension: extra completion marker, "" for none */
	int settle;                 /* extension: seconds of quiet that finish a step */
	uint64_t rate;              /* extension: replication cap, bytes/s per partner, 0: none */
	uint64_t memory;            /* extension: I/O buffer budget per job, bytes */
	uint32_t files_in_flight;   /* extension: files open at once per pull */
	int hash_threads;           /* extension: threads hashing a commit; 0: automatic */
	int cache_reads;            /* extension: enum cfg_cache_reads, a commit's reads */
	int stale;                  /* extension: enum cfg_stale, copies a newer step overtook */
	int read_once;              /* extension: enum cfg_read_once, a copy sent as it is hashed */
	bool yield;                 /* extension: a job's copies pause while a step of it is written */
	uint64_t io_size;           /* extension: largest single read/write, bytes */
	uint64_t chunk_size;        /* extension: manifest hashing granularity, bytes */
	int priority;               /* extension: enum cfg_priority of replication's threads */
	int restore_streams;        /* extension: a restore's lanes, 1..4 */
	int streams;                /* extension: connections a copy's pieces go on, 1..16;
				     * 0: adapting, from config_streams's choice */
	int streams_max;            /* extension: adapting's cap, 1..16; 0: config_streams_max's */
	/* [doctor]: extension, stage doctor's measurements */
	char *doctor_ports;         /* portlist (common/portlist.h) */
	char *doctor_port_range;    /* ephemeral | none | LO-HI */
	int doctor_port_sample;
	int doctor_clock_bound_ms;
	int doctor_duration_ms;
	int doctor_streams;
	uint64_t doctor_rate;       /* bytes/s per direction of a pair */
	int doctor_pairs_max;
	uint64_t doctor_storage_size;
	char *doctor_facts;         /* daemon/doctor/dr_local.h's syntax */
	/* [durable]: the third tier (BRIEF §4) */
	char *durable_root;         /* a directory on shared storage, "" for none */
	int durable_keep;           /* steps per job kept there */
	int durable_every;          /* drain every Nth committed step of a job */
	uint64_t durable_rate;      /* extension: bytes/s, 0: no cap */
	/* [metrics]: extension, `stage metrics` and the textfile collector */
	char *metrics_textfile;     /* a *.prom path, "" for none */
	int metrics_interval;       /* seconds between rewrites */
};

/* The id of group s (a name, or a number). 0 or -ENOENT. */
int config_group_id(const char *s, gid_t *out);
/* Fills every key with its default (strings allocated). 0 or -ENOMEM. */
int config_defaults(struct stage_config *c);
/* The streams a copy goes on: [transfer] streams, or with 0 the count
 * adapting starts from, a quarter of config_cpus() (1 to 8). */
unsigned config_streams(const struct stage_config *c);
/* The most streams adapting may take: [transfer] streams_max, or with 0
 * half of config_cpus() (1 to 16): a stream is a thread on each side. */
unsigned config_streams_max(const struct stage_config *c);
/* The most streams a copy to one partner may go on: a fixed [transfer]
 * streams, or adapting's cap. */
unsigned config_streams_most(const struct stage_config *c);
/* The CPUs this process may run on (its affinity mask; the CPUs online if
 * that cannot be read): what "the cores" means for the defaults. */
unsigned config_cpus(void);
/* The threads a commit hashes on: [transfer] hash_threads, or with 0 the
 * same quarter of config_cpus(). */
unsigned config_hash_threads(const struct stage_config *c);
/* Parses INI text over the current values. On error returns -EINVAL (or
 * -ENOMEM) and writes "FILE:LINE: key 'section.key': why" into err. */
int config_parse(struct stage_config *c, const char *text, size_t len,
		 const char *fname, char *err, size_t errlen);
/* Reads FILE and parses it; a missing or unreadable file is an error naming it. */
int config_load(struct stage_config *c, const char *path, char *err, size_t errlen);
/* Prints the running configuration as a config file that parses back equal. */
void config_print(const struct stage_config *c, FILE *out);
void config_free(struct stage_config *c);

/* "64MiB", "4M", "1048576", "1G" -> bytes; 0 or -EINVAL. Binary units. */
int config_parse_size(const char *s, uint64_t *out);

/* "HOST:PORT" or "[V6ADDR]:PORT" (listen, and the hosts file). HOST is an
 * IPv4 address, a host name, or an IPv6 address in brackets; PORT 1..65535.
 * host (brackets dropped) and port may be NULL. 0, or -EINVAL and *why. */
int config_parse_hostport(const char *s, char *host, size_t hostlen, uint16_t *port,
			  const char **why);
/* A node name (node.name, the hosts file): 1..255 of [A-Za-z0-9._-], not
 * starting with '.' or '-', so it is safe as a file name. 0 or -EINVAL, *why. */
int config_check_name(const char *s, const char **why);

#endif
