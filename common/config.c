/* Configuration.
 *
 * cfg_table is the only place a key is described. A default is written in
 * config-file syntax and goes through the same setter as the file's text, so
 * no default can break its key's rules; config_print writes every value in
 * the syntax that setter reads. Every string value is checked to survive that
 * trip (no control characters, nothing the INI reader would trim or take for
 * a comment), which is what makes --print-config output parse back equal.
 *
 * The file's reader (INI: sections, keys, comments) is config_file.c; it
 * sets keys through cfg_set, by their index here.
 */
#include "common/config.h"
#include "common/hosts.h"
#include "common/portlist.h"
#include "common/config_impl.h"

#include "common/log.h"

#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>
#include <unistd.h>

#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define GiB (1ull << 30)

#define SOCKET_PATH_MAX (sizeof(((struct sockaddr_un *)0)->sun_path) - 1)

enum cfg_type {
	T_NAME,         /* char *: a node name, see config_check_name */
	T_PATH,         /* char *: absolute, normalised */
	T_PATHS,        /* char *[CFG_MAX_ROOTS] and an int count */
	T_HOSTPORT,     /* char *: HOST:PORT */
	T_FILENAME,     /* char *: one file name (no '/', not . or ..), or "" for none */
	T_BOOL,         /* bool */
	T_INT,          /* int */
	T_U32,          /* uint32_t */
	T_SIZE,         /* uint64_t, bytes, written with binary units */
	T_ENUM,         /* int, an index into names */
	T_TEXT,         /* char *: free text that check_text passes, then e->check */
};

#define F_POW2 (1u << 0)        /* numbers: must be a power of two */
#define F_ALL  (1u << 1)        /* T_INT: "all" means CFG_REPLICAS_ALL */
#define F_NONE (1u << 2)        /* T_PATH: "" means none */

struct cfg_entry {
	const char *section;
	const char *key;
	enum cfg_type type;
	unsigned flags;
	uint64_t min, max;              /* numbers: inclusive; strings: max bytes (0: PATH_MAX) */
	size_t off;                     /* the field in struct stage_config */
	size_t count_off;               /* T_PATHS: the int counting them */
	const char *const *names;       /* T_ENUM: value -> name, NULL-terminated */
	const char *def;                /* default, in config-file syntax */
	/* A default that depends on the host; returns def's replacement. */
	const char *(*def_fn)(const struct cfg_entry *e, char *buf, size_t len);
	const char *doc;                /* one line for --print-config */
	/* The key's own syntax (any string type), checked after the type's:
	 * 0 or -EINVAL with why (a message). */
	int (*check)(const char *s, char *why, size_t whylen);
};

static const char *default_name(const struct cfg_entry *e, char *buf, size_t len);
static const char *default_socket(const struct cfg_entry *e, char *buf, size_t len);

static const char *const transport_names[] = {
	[CFG_TRANSPORT_AUTO] = "auto", [CFG_TRANSPORT_TCP] = "tcp", [CFG_TRANSPORT_RDMA] = "rdma", NULL,
};
static const char *const wire_names[] = {
	[CFG_WIRE_AUTHENTICATED] = "authenticated", [CFG_WIRE_ENCRYPTED] = "encrypted", NULL,
};
static const char *const read_once_names[] = {
	[CFG_READ_ONCE_OFF] = "off", [CFG_READ_ONCE_ON] = "on", [CFG_READ_ONCE_AUTO] = "auto", NULL,
};
static const char *const cache_reads_names[] = {
	[CFG_CACHE_READS_WARM] = "warm", [CFG_CACHE_READS_ALWAYS] = "always",
	[CFG_CACHE_READS_AUTO] = "auto", NULL,
};
static const char *const stale_names[] = {
	[CFG_STALE_SKIP] = "skip", [CFG_STALE_SEND] = "send", NULL,
};
static const char *const priority_names[] = {
	[CFG_PRIORITY_LOW] = "low", [CFG_PRIORITY_NORMAL] = "normal", NULL,
};
static const char *const compress_names[] = {
	[CFG_COMPRESS_AUTO] = "auto", [CFG_COMPRESS_OFF] = "off",
	[CFG_COMPRESS_ZSTD] = "zstd", [CFG_COMPRESS_FLOAT] = "float", NULL,
};

/* One macro per kind, naming the C type its field must have: pointing a key
 * at a field of another type is a compile error, not a silent overwrite. */
#define OFF(f, T) (offsetof(struct stage_config, f) + \
		   0 * sizeof((T *){ 0 } = &((struct stage_config *)0)->f))
#define KEY(s, k, t, f, T)       .section = s, .key = k, .type = t, .off = OFF(f, T)
#define KEY_NAME(s, k, f)        KEY(s, k, T_NAME, f, char *)
#define KEY_PATH(s, k, f)        KEY(s, k, T_PATH, f, char *)
#define KEY_PATHS(s, k, f, n)    KEY(s, k, T_PATHS, f[0], char *), .count_off = OFF(n, int)
#define KEY_HOSTPORT(s, k, f)    KEY(s, k, T_HOSTPORT, f, char *)
#define KEY_FILENAME(s, k, f)    KEY(s, k, T_FILENAME, f, char *)
#define KEY_BOOL(s, k, f)        KEY(s, k, T_BOOL, f, bool)
#define KEY_INT(s, k, f)         KEY(s, k, T_INT, f, int)
#define KEY_U32(s, k, f)         KEY(s, k, T_U32, f, uint32_t)
#define KEY_SIZE(s, k, f)        KEY(s, k, T_SIZE, f, uint64_t)
#define KEY_ENUM(s, k, f, list)  KEY(s, k, T_ENUM, f, int), .names = list
#define KEY_TEXT(s, k, f, fn)    KEY(s, k, T_TEXT, f, char *), .check = fn

static int check_ports(const char *s, char *why, size_t whylen)
{
	uint16_t ports[PORTLIST_MAX];
	size_t n;

	return portlist_parse(s, ports, PORTLIST_MAX, &n, why, whylen) < 0 ? -EINVAL : 0;
}

static int check_port_range(const char *s, char *why, size_t whylen)
{
	uint16_t lo, hi;

	/* "ephemeral" is read when the doctor runs, not at start-up. */
	if (strcmp(s, "ephemeral") == 0)
		return 0;
	return portrange_parse(s, &lo, &hi, why, whylen) < 0 ? -EINVAL : 0;
}

/* node_exporter's textfile collector reads *.prom files and nothing else. */
static int check_textfile(const char *s, char *why, size_t whylen)
{
	const char *base = strrchr(s, '/');
	size_t n = strlen(base ? base + 1 : s);

	if (!*s || (n > 5 && strcmp(s + strlen(s) - 5, ".prom") == 0))
		return 0;
	snprintf(why, whylen, "'%s' must end in .prom: node_exporter's textfile collector reads "
		 "nothing else", s);
	return -EINVAL;
}

/* A group of this system's, by name or number; "" for none. */
static int check_group(const char *s, char *why, size_t whylen)
{
	if (!*s || config_group_id(s, NULL) == 0)
		return 0;
	snprintf(why, whylen, "no group '%s' on this system (getent group %s)", s, s);
	return -EINVAL;
}

int config_group_id(const char *s, gid_t *out)
{
	struct group gr, *grp = NULL;
	char buf[16384], *end;
	unsigned long v;

	if (getgrnam_r(s, &gr, buf, sizeof(buf), &grp) == 0 && grp) {
		if (out)
			*out = grp->gr_gid;
		return 0;
	}
	errno = 0;
	v = strtoul(s, &end, 10);
	if (*s >= '0' && *s <= '9' && !*end && !errno && v < (gid_t)-1) {
		if (out)
			*out = (gid_t)v;
		return 0;
	}
	return -ENOENT;
}

static const struct cfg_entry cfg_table[] = {
	{ KEY_NAME("node", "name", name), .def = "localhost", .def_fn = default_name,
	  .doc = "this node's NAME in the hosts file (default: the host name)" },
	{ KEY_PATH("node", "socket", socket), .max = SOCKET_PATH_MAX,
	  .def = "/run/stage/staged.sock", .def_fn = default_socket,
	  .doc = "control socket (non-root default: $XDG_RUNTIME_DIR/stage.sock or /tmp/stage-UID.sock)" },
	{ KEY_TEXT("node", "socket_group", socket_group, check_group), .def = "",
	  .doc = "group whose members may use the control socket (mode 0660); \"\": the daemon's" },
	{ KEY_HOSTPORT("node", "listen", listen), .def = "0.0.0.0:7420",
	  .doc = "HOST:PORT for peer traffic; an IPv6 address goes in brackets" },
	{ KEY_PATH("node", "state_dir", state_dir), .def = "/var/lib/stage/state",
	  .doc = "the daemon's own state: queues, resume points" },
	{ KEY_ENUM("node", "log_level", log_level, log_level_names), .def = "info",
	  .doc = "error | warn | info | debug" },

	{ KEY_PATHS("paths", "source_roots", source_roots, n_source_roots), .def = "/",
	  .doc = "comma-separated; pull reads only under these" },
	{ KEY_PATH("paths", "stage_root", stage_root), .def = "/var/lib/stage/data",
	  .doc = "where pulled datasets land" },
	{ KEY_PATH("paths", "ckpt_root", ckpt_root), .def = "/var/lib/stage/ckpt",
	  .doc = "checkpoints written here are committed and replicated" },
	{ KEY_PATH("paths", "replica_root", replica_root), .def = "/var/lib/stage/replicas",
	  .doc = "where partners' checkpoint copies are kept" },

	{ KEY_PATH("cluster", "hosts", hosts), .def = "/etc/stage/hosts",
	  .doc = "one node a line: NAME HOST:PORT [domain=RACK] [rdma=ADDR]" },
	{ KEY_PATH("cluster", "key_file", key_file), .def = "/etc/stage/cluster.key",
	  .doc = "the cluster secret; must not be readable by group or others" },
	{ KEY_INT("cluster", "replicas", replicas), .flags = F_ALL, .min = 0, .max = 64, .def = "1",
	  .doc = "partner copies of each checkpoint: 0..64 or all" },
	{ KEY_INT("cluster", "keep", keep), .min = 1, .max = 1000000, .def = "3",
	  .doc = "checkpoints per job kept as replicas" },
	{ KEY_INT("cluster", "peer_timeout", peer_timeout), .min = 1, .max = 3600, .def = "60",
	  .doc = "seconds a peer may stay silent on a connection that expects it to talk (a "
		 "transfer, a node of a cluster pull) before it is taken for gone" },
	{ KEY_INT("cluster", "fanout", fanout), .min = 2, .max = 256, .def = "32",
	  .doc = "the most nodes this node asks a question itself (verify --cluster, restore, "
		 "resume); past that, the others are asked through relays, in a tree" },
	{ KEY_ENUM("cluster", "wire", wire, wire_names), .def = "authenticated",
	  .doc = "authenticated | encrypted: what peer connections ask for; every frame is "
		 "authenticated (AES-256-GCM under the connection's key), and encrypted when "
		 "either end asks for it" },

	{ KEY_ENUM("transfer", "transport", transport, transport_names), .def = "auto",
	  .doc = "auto | tcp | rdma" },
	{ KEY_ENUM("transfer", "compress", compress, compress_names), .def = "auto",
	  .doc = "auto | off | zstd | float" },
	{ KEY_BOOL("transfer", "watch", watch), .def = "on",
	  .doc = "replicate checkpoints under ckpt_root automatically" },
	{ KEY_FILENAME("transfer", "marker", marker), .def = "",
	  .doc = "a file whose appearance in a step means finished (besides .metadata, latest, trainer_state.json)" },
	{ KEY_INT("transfer", "settle", settle), .min = 1, .max = 86400, .def = "60",
	  .doc = "seconds without writes after which a step with no marker counts as finished" },
	{ KEY_SIZE("transfer", "rate", rate), .min = 0, .max = 1024 * GiB, .def = "0",
	  .doc = "replication bytes per second per partner; 0 for no cap" },
	{ KEY_SIZE("transfer", "memory", memory), .min = MiB, .max = 64 * GiB, .def = "64MiB",
	  .doc = "I/O buffer budget per job" },
	{ KEY_U32("transfer", "files_in_flight", files_in_flight), .min = 1, .max = 4096, .def = "64",
	  .doc = "files open at once per pull" },
	{ KEY_SIZE("transfer", "io_size", io_size), .flags = F_POW2, .min = 64 * KiB, .max = 256 * MiB,
	  .def = "4MiB", .doc = "largest single read or write; a power of two" },
	{ KEY_SIZE("transfer", "chunk_size", chunk_size), .flags = F_POW2, .min = 4 * KiB, .max = GiB,
	  .def = "4MiB", .doc = "manifest hashing granularity; a power of two" },
	{ KEY_INT("transfer", "restore_streams", restore_streams), .min = 1, .max = 4, .def = "4",
	  .doc = "connections a restore fetches over at once, spread over the holders of intact copies" },
	{ KEY_INT("transfer", "streams", streams), .min = 0, .max = 16, .def = "0",
	  .doc = "connections each copy to a partner goes on, a thread each side per connection "
		 "(each chunk's pieces on one, the streams in turns); 0: adapting to what the "
		 "copies move, from a quarter of the CPUs the daemon may run on (1 to 8) up to "
		 "streams_max" },
	{ KEY_INT("transfer", "streams_max", streams_max), .min = 0, .max = 16, .def = "0",
	  .doc = "the most streams adapting (streams = 0) takes to one partner; 0: half the "
		 "CPUs the daemon may run on, 1 to 16" },
	{ KEY_ENUM("transfer", "cache_reads", cache_reads, cache_reads_names), .def = "auto",
	  .doc = "auto | warm | always: a commit reads through the page cache the files mostly "
		 "there already (warm), every file (always), or, when the step is to be sent to "
		 "partners, also cold files up to a quarter of the memory available, so that the "
		 "send reads them from memory and the disk once (auto)" },
	{ KEY_ENUM("transfer", "stale", stale, stale_names), .def = "skip",
	  .doc = "skip | send: a copy never begun when a newer step of its job is ready for the "
		 "same partner is skipped (the newer goes instead; a copy someone waits for is "
		 "never skipped), or sent all the same" },
	{ KEY_ENUM("transfer", "read_once", read_once, read_once_names), .def = "auto",
	  .doc = "auto | on | off: a step just committed goes to one partner as it is hashed, "
		 "its manifest last, so the step is read once and the copy does not wait for "
		 "the hash (on); only where the job's copies to that partner found little of it "
		 "held there already, so that copies that dedup keep doing so (auto); never, the "
		 "manifest first (off)" },
	{ KEY_BOOL("transfer", "yield", yield), .def = "on",
	  .doc = "with watch = on: a job's copies to and from this node pause while a step of the "
		 "job under ckpt_root is being written (its trainer saving), and catch up once it "
		 "is quiet; each copy waits half of [cluster] peer_timeout in all at most" },
	{ KEY_INT("transfer", "hash_threads", hash_threads), .min = 0, .max = 16, .def = "0",
	  .doc = "threads hashing a commit's files at once (a file is one thread's); "
		 "0: a quarter of the CPUs the daemon may run on, 1 to 8" },
	{ KEY_ENUM("transfer", "priority", priority, priority_names), .def = "low",
	  .doc = "low | normal: CPU and I/O priority of hashing commits, sending and receiving replicas" },

	/* [doctor]: extension, the preflight's measurements (docs/ARCHITECTURE.md, "stage doctor") */
	{ KEY_TEXT("doctor", "ports", doctor_ports, check_ports), .def = "29500",
	  .doc = "ports a job listens on, dialled between every pair: 29500,29400-29410 (at most 64)" },
	{ KEY_TEXT("doctor", "port_range", doctor_port_range, check_port_range), .def = "ephemeral",
	  .doc = "where NCCL's ports come from: ephemeral (ip_local_port_range) | none | LO-HI" },
	{ KEY_INT("doctor", "port_sample", doctor_port_sample), .min = 0, .max = 64, .def = "4",
	  .doc = "ports sampled from port_range and dialled like the others" },
	{ KEY_INT("doctor", "clock_bound_ms", doctor_clock_bound_ms), .min = 1, .max = 3600000,
	  .def = "100", .doc = "a clock offset above this many ms is a problem" },
	{ KEY_INT("doctor", "duration_ms", doctor_duration_ms), .min = 100, .max = 60000,
	  .def = "1000", .doc = "each bandwidth measurement (--quick: a fifth)" },
	{ KEY_INT("doctor", "streams", doctor_streams), .min = 1, .max = 8, .def = "4",
	  .doc = "connections of the several-stream bandwidth figure" },
	{ KEY_SIZE("doctor", "rate", doctor_rate), .min = MiB, .max = 1024 * GiB, .def = "10GiB",
	  .doc = "cap on the doctor's bytes per second in each direction of a pair" },
	{ KEY_INT("doctor", "pairs_max", doctor_pairs_max), .min = 2, .max = 64,
	  .def = "16", .doc = "up to this many nodes every pair is measured; beyond, a ring and a sample" },
	{ KEY_SIZE("doctor", "storage_size", doctor_storage_size), .min = MiB, .max = 64 * GiB,
	  .def = "256MiB", .doc = "bytes written and read back in each local root (--quick: an eighth)" },
	{ KEY_TEXT("doctor", "facts", doctor_facts, NULL),
	  .def = "kernel: file /proc/sys/kernel/osrelease"
		 " | gpu: run nvidia-smi --query-gpu=name,driver_version --format=csv,noheader"
		 " | rdma: dir /sys/class/infiniband",
	  .doc = "facts that must agree on every node: NAME: file PATH | NAME: dir PATH | NAME: run PROG ARG..." },

	/* [durable]: the third tier (docs/ARCHITECTURE.md, "The durable tier") */
	{ KEY_PATH("durable", "root", durable_root), .flags = F_NONE, .def = "",
	  .doc = "a directory on shared storage each committed step is drained to, loadable as it "
		 "is (ROOT/JOB/STEP); empty: none" },
	{ KEY_INT("durable", "keep", durable_keep), .min = 1, .max = 1000000, .def = "2",
	  .doc = "steps per job kept in root (this node's part of each)" },
	{ KEY_INT("durable", "every", durable_every), .min = 1, .max = 1000000, .def = "1",
	  .doc = "drain every Nth committed step of a job" },
	{ KEY_SIZE("durable", "rate", durable_rate), .min = 0, .max = 1024 * GiB, .def = "0",
	  .doc = "bytes per second the drain writes at most; 0 for no cap" },

	/* [metrics]: extension, the textfile collector (docs/ARCHITECTURE.md, "Metrics") */
	{ KEY_PATH("metrics", "textfile", metrics_textfile), .flags = F_NONE, .def = "",
	  .check = check_textfile,
	  .doc = "a *.prom file in node_exporter's textfile directory, rewritten every interval; "
		 "empty: none" },
	{ KEY_INT("metrics", "interval", metrics_interval), .min = 1, .max = 3600, .def = "5",
	  .doc = "seconds between rewrites of textfile" },
};

#define N_ENTRIES (sizeof(cfg_table) / sizeof(cfg_table[0]))
#define FIELD(c, e, T) ((T *)((char *)(c) + (e)->off))
#define CFIELD(c, e, T) ((const T *)((const char *)(c) + (e)->off))
#define STR_(x) #x
#define STR(x) STR_(x)

static bool is_ctl(char ch)
{
	return (unsigned char)ch < 0x20 || ch == 0x7f;
}

/* Could the INI reader give back s exactly? It trims white space, and '#' or
 * ';' after white space (or first) starts a comment. */
static int check_text(const char *s, const char **why)
{
	size_t n = strlen(s);

	for (size_t i = 0; i < n; i++) {
		if (is_ctl(s[i])) {
			*why = "control character in value";
			return -EINVAL;
		}
		if ((s[i] == '#' || s[i] == ';') && (i == 0 || cfg_is_ws(s[i - 1]))) {
			*why = "'#' or ';' there would start a comment";
			return -EINVAL;
		}
	}
	if (n && (cfg_is_ws(s[0]) || cfg_is_ws(s[n - 1]))) {
		*why = "value starts or ends with white space";
		return -EINVAL;
	}
	return 0;
}

/* size_units[i] is 2^(10 * (i + 1)). */
static const char size_units[] = "KMGT";

int config_parse_size(const char *s, uint64_t *out)
{
	unsigned shift = 0;
	uint64_t v;

	if (cfg_parse_digits(&s, &v))
		return -EINVAL;
	if (*s) {
		char up = *s >= 'a' && *s <= 'z' ? (char)(*s - 'a' + 'A') : *s;
		const char *u = strchr(size_units, up);

		if (!u)
			return -EINVAL;
		shift = 10 * (unsigned)(u - size_units + 1);
		if (s[1] && strcasecmp(s + 1, "iB") != 0)
			return -EINVAL;
	}
	if (v > UINT64_MAX >> shift)
		return -EINVAL;
	*out = v << shift;
	return 0;
}

/* The largest unit that divides v exactly, so the text reads back equal. */
static void format_size(uint64_t v, char *buf, size_t len)
{
	for (int i = (int)sizeof(size_units) - 2; i >= 0; i--) {
		unsigned shift = 10 * (unsigned)(i + 1);

		if (v && (v & ((1ull << shift) - 1)) == 0) {
			snprintf(buf, len, "%llu%ciB", (unsigned long long)(v >> shift), size_units[i]);
			return;
		}
	}
	snprintf(buf, len, "%llu", (unsigned long long)v);
}

static void format_number(const struct cfg_entry *e, uint64_t v, char *buf, size_t len)
{
	if (e->type == T_SIZE)
		format_size(v, buf, len);
	else
		snprintf(buf, len, "%llu", (unsigned long long)v);
}

/* Lexical normalisation: repeated and trailing '/' and "." components go;
 * ".." is refused because roots are compared as path prefixes. */
static int path_normalise(const char *s, size_t max, char **out, const char **why)
{
	size_t n = strlen(s), o = 0;
	char *r;

	if (s[0] != '/') {
		*why = "not an absolute path";
		return -EINVAL;
	}
	r = malloc(n + 1);
	if (!r)
		return -ENOMEM;
	for (size_t i = 0; i < n;) {
		size_t j = i, c;

		while (j < n && s[j] != '/')
			j++;
		c = j - i;
		if (c == 2 && s[i] == '.' && s[i + 1] == '.') {
			free(r);
			*why = "'..' is not allowed in a path";
			return -EINVAL;
		}
		if (c && !(c == 1 && s[i] == '.')) {
			r[o++] = '/';
			memcpy(r + o, s + i, c);
			o += c;
		}
		i = j + 1;
	}
	if (o == 0)
		r[o++] = '/';
	r[o] = '\0';
	if (o > (max ? max : PATH_MAX - 1)) {
		free(r);
		*why = "path too long";
		return -EINVAL;
	}
	*out = r;
	return 0;
}

/* A path value as stored: normalised, then checked to print back. */
static int parse_path(const char *s, size_t max, char **out, const char **why)
{
	int rc = path_normalise(s, max, out, why);

	if (rc == 0 && (rc = check_text(*out, why)) != 0) {
		free(*out);
		*out = NULL;
	}
	return rc;
}

static void free_paths(char **v, int n)
{
	for (int i = 0; i < n; i++)
		free(v[i]);
}

static int parse_paths(const char *s, char **v, int *count, const char **why)
{
	char *copy = strdup(s), *rest = copy, *item;
	int n = 0, rc = 0;

	if (!copy)
		return -ENOMEM;
	while (rc == 0 && (item = strsep(&rest, ",")) != NULL) {
		item = cfg_trim(item);
		if (!*item) {
			*why = "empty item in the list";
			rc = -EINVAL;
		} else if (n == CFG_MAX_ROOTS) {
			*why = "more than " STR(CFG_MAX_ROOTS) " paths";
			rc = -EINVAL;
		} else if ((rc = parse_path(item, 0, &v[n], why)) == 0) {
			n++;
		}
	}
	free(copy);
	if (rc) {
		free_paths(v, n);
		return rc;
	}
	*count = n;
	return 0;
}

static int parse_bool(const char *s, bool *out)
{
	static const struct { const char *name; bool v; } words[] = {
		{ "on", true }, { "off", false }, { "true", true }, { "false", false },
		{ "yes", true }, { "no", false }, { "1", true }, { "0", false },
	};

	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
		if (strcasecmp(s, words[i].name) == 0) {
			*out = words[i].v;
			return 0;
		}
	}
	return -EINVAL;
}

/* A number within e's bounds; otherwise why states them in e's own units. */
static int parse_number(const struct cfg_entry *e, const char *s, uint64_t *out,
			char *why, size_t whylen)
{
	char lo[32], hi[32];
	uint64_t v;
	int rc;

	rc = e->type == T_SIZE ? config_parse_size(s, &v) : cfg_parse_uint(s, &v);
	if (rc || v < e->min || v > e->max) {
		format_number(e, e->min, lo, sizeof(lo));
		format_number(e, e->max, hi, sizeof(hi));
		snprintf(why, whylen, "not %s from %s to %s%s",
			 e->type == T_SIZE ? "a size (bytes, or K, M, G, T: binary units)" : "a number",
			 lo, hi, e->flags & F_ALL ? ", or all" : "");
		return -EINVAL;
	}
	if ((e->flags & F_POW2) && (v & (v - 1))) {
		snprintf(why, whylen, "not a power of two");
		return -EINVAL;
	}
	*out = v;
	return 0;
}

static void number_store(const struct cfg_entry *e, struct stage_config *c, uint64_t v)
{
	switch (e->type) {
	case T_INT:
		*FIELD(c, e, int) = (int)v;
		break;
	case T_U32:
		*FIELD(c, e, uint32_t) = (uint32_t)v;
		break;
	default:
		*FIELD(c, e, uint64_t) = v;
		break;
	}
}

static int parse_enum(const struct cfg_entry *e, const char *s, int *out, char *why, size_t whylen)
{
	size_t o;

	for (int i = 0; e->names[i]; i++) {
		if (strcasecmp(s, e->names[i]) == 0) {
			*out = i;
			return 0;
		}
	}
	o = (size_t)snprintf(why, whylen, "not one of");
	for (int i = 0; e->names[i] && o < whylen; i++)
		o += (size_t)snprintf(why + o, whylen - o, "%s %s", i ? "," : "", e->names[i]);
	return -EINVAL;
}

/* A marker's name: it is looked up in a directory, so one component. */
static int check_filename(const char *s, const char **why)
{
	size_t n = strlen(s);

	if (n > 255) {
		*why = "longer than 255 bytes";
		return -EINVAL;
	}
	if (strchr(s, '/') || strcmp(s, ".") == 0 || strcmp(s, "..") == 0) {
		*why = "not a single file name";
		return -EINVAL;
	}
	return check_text(s, why);
}

/* The string kinds: each checks s and returns the string to keep. */
static int parse_string(const struct cfg_entry *e, const char *s, char **out, const char **why)
{
	int rc;

	switch (e->type) {
	case T_NAME:
		rc = config_check_name(s, why);
		break;
	case T_HOSTPORT:
		rc = config_parse_hostport(s, NULL, 0, NULL, why);
		break;
	case T_FILENAME:
		rc = check_filename(s, why);
		break;
	case T_TEXT:
		rc = check_text(s, why);
		break;
	default:
		if ((e->flags & F_NONE) && !*s) {
			rc = 0;
			break;
		}
		return parse_path(s, e->max, out, why);
	}
	if (rc)
		return rc;
	*out = strdup(s);
	return *out ? 0 : -ENOMEM;
}

/* Parses s into e's field of c, overwriting (not freeing) what was there. On
 * failure the field is untouched and why says what is wrong with s. */
static int entry_set(const struct cfg_entry *e, struct stage_config *c, const char *s,
		     char *why, size_t whylen)
{
	char detail[256];
	const char *w = detail;
	uint64_t v;
	bool b;
	int rc = -EINVAL, i;

	switch (e->type) {
	case T_NAME:
	case T_PATH:
	case T_HOSTPORT:
	case T_FILENAME:
	case T_TEXT: {
		char *str;

		rc = parse_string(e, s, &str, &w);
		if (rc == 0 && e->check && e->check(s, detail, sizeof(detail)) < 0) {
			free(str);
			w = detail;
			rc = -EINVAL;
		}
		if (rc == 0)
			*FIELD(c, e, char *) = str;
		break;
	}
	case T_PATHS: {
		char *tmp[CFG_MAX_ROOTS] = { 0 };
		int n;

		rc = parse_paths(s, tmp, &n, &w);
		if (rc == 0) {
			memcpy(FIELD(c, e, char *), tmp, sizeof(tmp));
			*(int *)((char *)c + e->count_off) = n;
		}
		break;
	}
	case T_BOOL:
		rc = parse_bool(s, &b);
		if (rc == 0)
			*FIELD(c, e, bool) = b;
		w = "not on or off (or true/false, yes/no, 1/0)";
		break;
	case T_INT:
	case T_U32:
	case T_SIZE:
		if ((e->flags & F_ALL) && strcasecmp(s, "all") == 0) {
			*FIELD(c, e, int) = CFG_REPLICAS_ALL;
			return 0;
		}
		rc = parse_number(e, s, &v, detail, sizeof(detail));
		if (rc == 0)
			number_store(e, c, v);
		break;
	case T_ENUM:
		rc = parse_enum(e, s, &i, detail, sizeof(detail));
		if (rc == 0)
			*FIELD(c, e, int) = i;
		break;
	}
	if (rc == -EINVAL)
		snprintf(why, whylen, "'%s': %s", s, w);
	return rc;
}

static void entry_release(const struct cfg_entry *e, struct stage_config *c)
{
	switch (e->type) {
	case T_NAME:
	case T_PATH:
	case T_HOSTPORT:
	case T_FILENAME:
	case T_TEXT:
		free(*FIELD(c, e, char *));
		*FIELD(c, e, char *) = NULL;
		break;
	case T_PATHS: {
		int *n = (int *)((char *)c + e->count_off);

		free_paths(FIELD(c, e, char *), *n);
		*n = 0;
		break;
	}
	default:
		break;
	}
}

static bool entry_accepts(const struct cfg_entry *e, const char *s)
{
	struct stage_config scratch = { 0 };
	char why[8];
	bool ok = entry_set(e, &scratch, s, why, sizeof(why)) == 0;

	entry_release(e, &scratch);
	return ok;
}

static const char *default_name(const struct cfg_entry *e, char *buf, size_t len)
{
	if (gethostname(buf, len - 1) != 0)
		return e->def;
	buf[len - 1] = '\0';
	return entry_accepts(e, buf) ? buf : e->def;
}

static const char *default_socket(const struct cfg_entry *e, char *buf, size_t len)
{
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	int n;

	if (geteuid() == 0)
		return e->def;
	if (xdg && *xdg) {
		n = snprintf(buf, len, "%s/stage.sock", xdg);
		if (n > 0 && (size_t)n < len && entry_accepts(e, buf))
			return buf;
	}
	snprintf(buf, len, "/tmp/stage-%u.sock", (unsigned)getuid());
	return buf;
}

void config_free(struct stage_config *c)
{
	for (size_t i = 0; i < N_ENTRIES; i++)
		entry_release(&cfg_table[i], c);
}

unsigned config_cpus(void)
{
	long online = sysconf(_SC_NPROCESSORS_ONLN);
	size_t ncpu = online > 1024 ? (size_t)online : 1024, size;
	cpu_set_t *set;
	unsigned n = 0;
	int err;

	/* The mask is sized for every CPU the kernel may name, beyond those
	 * online (sched_getaffinity fails with EINVAL on a mask too small). */
	while ((set = CPU_ALLOC(ncpu))) {
		size = CPU_ALLOC_SIZE(ncpu);
		CPU_ZERO_S(size, set);
		err = sched_getaffinity(0, size, set) == 0 ? 0 : errno;
		if (err == 0)
			n = (unsigned)CPU_COUNT_S(size, set);
		CPU_FREE(set);
		if (err != EINVAL || ncpu >= (1u << 20))
			break;
		ncpu *= 2;
	}
	if (n == 0)
		n = online > 0 ? (unsigned)online : 1;
	return n;
}

/* What 0 means for streams and hash_threads: a quarter of the CPUs this
 * process may run on (its affinity: a cpuset, systemd's CPUAffinity=,
 * taskset), 1 to 8. */
static unsigned quarter_cores(void)
{
	unsigned n = config_cpus() / 4;

	return n < 1 ? 1 : n > 8 ? 8 : n;
}

unsigned config_streams(const struct stage_config *c)
{
	return c->streams > 0 ? (unsigned)c->streams : quarter_cores();
}

unsigned config_streams_max(const struct stage_config *c)
{
	unsigned n = config_cpus() / 2;

	if (c->streams_max > 0)
		return (unsigned)c->streams_max;
	return n < 1 ? 1 : n > 16 ? 16 : n;
}

unsigned config_streams_most(const struct stage_config *c)
{
	return c->streams > 0 ? (unsigned)c->streams : config_streams_max(c);
}

unsigned config_hash_threads(const struct stage_config *c)
{
	return c->hash_threads > 0 ? (unsigned)c->hash_threads : quarter_cores();
}

int config_defaults(struct stage_config *c)
{
	char buf[PATH_MAX], why[256];

	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < N_ENTRIES; i++) {
		const struct cfg_entry *e = &cfg_table[i];
		const char *s = e->def_fn ? e->def_fn(e, buf, sizeof(buf)) : e->def;
		int rc = entry_set(e, c, s, why, sizeof(why));

		if (rc) {
			config_free(c);
			return rc;
		}
	}
	return 0;
}

/* For the file's reader (config_file.c): the key it names, by index. */
size_t cfg_count(void)
{
	return N_ENTRIES;
}

int cfg_find(const char *section, const char *key)
{
	for (size_t i = 0; i < N_ENTRIES; i++)
		if (strcmp(cfg_table[i].section, section) == 0 &&
		    (!key || strcmp(cfg_table[i].key, key) == 0))
			return (int)i;
	return -1;
}

const char *cfg_section(size_t i)
{
	return cfg_table[i].section;
}

int cfg_set(size_t i, struct stage_config *c, const char *s, char *why, size_t whylen)
{
	return entry_set(&cfg_table[i], c, s, why, whylen);
}

void cfg_release(size_t i, struct stage_config *c)
{
	entry_release(&cfg_table[i], c);
}

static void print_value(const struct cfg_entry *e, const struct stage_config *c, FILE *out)
{
	char buf[32];

	switch (e->type) {
	case T_NAME:
	case T_PATH:
	case T_HOSTPORT:
	case T_FILENAME:
	case T_TEXT:
		fputs(*CFIELD(c, e, char *), out);
		break;
	case T_PATHS: {
		int n = *(const int *)((const char *)c + e->count_off);

		for (int i = 0; i < n; i++)
			fprintf(out, "%s%s", i ? ", " : "", CFIELD(c, e, char *)[i]);
		break;
	}
	case T_BOOL:
		fputs(*CFIELD(c, e, bool) ? "on" : "off", out);
		break;
	case T_INT:
		if ((e->flags & F_ALL) && *CFIELD(c, e, int) == CFG_REPLICAS_ALL)
			fputs("all", out);
		else
			fprintf(out, "%d", *CFIELD(c, e, int));
		break;
	case T_U32:
		fprintf(out, "%u", *CFIELD(c, e, uint32_t));
		break;
	case T_SIZE:
		format_size(*CFIELD(c, e, uint64_t), buf, sizeof(buf));
		fputs(buf, out);
		break;
	case T_ENUM:
		fputs(e->names[*CFIELD(c, e, int)], out);
		break;
	}
}

void config_print(const struct stage_config *c, FILE *out)
{
	const char *section = NULL;

	fputs("# stage configuration: every key with its value (staged --print-config)\n", out);
	for (size_t i = 0; i < N_ENTRIES; i++) {
		const struct cfg_entry *e = &cfg_table[i];

		if (!section || strcmp(section, e->section) != 0) {
			section = e->section;
			fprintf(out, "\n[%s]\n", section);
		}
		fprintf(out, "# %s\n%s = ", e->doc, e->key);
		print_value(e, c, out);
		fputc('\n', out);
	}
}
