#include "client/cli_args.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CMD_BIT(c) (1u << (c))
#define ALL_CMDS (~0u)

static const struct cli_command {
	const char *name;
	enum cli_cmd cmd;           /* CLI_CMD_NONE: not in this version */
	int operands;               /* exactly this many */
	const char *usage;
} commands[] = {
	{ "pull", CLI_CMD_PULL, 1, "pull SRC [--to DEST] [--verify] [--cluster [--nodes LIST]]" },
	{ "verify", CLI_CMD_VERIFY, 1, "verify PATH [--deep] [--cluster [--nodes LIST]]" },
	{ "status", CLI_CMD_STATUS, 0, "status" },
	{ "manifest", CLI_CMD_MANIFEST, 1, "manifest PATH [--xxhsum]" },
	{ "commit", CLI_CMD_COMMIT, 1, "commit DIR [--wait]" },
	{ "ls", CLI_CMD_LS, 0, "ls" },
	{ "restore", CLI_CMD_RESTORE, 1, "restore DIR [--from NODE|durable]" },
	{ "doctor", CLI_CMD_DOCTOR, 0, "doctor [--nodes LIST] [--ports LIST] [--quick]" },
	{ "resume", CLI_CMD_RESUME, 1, "resume JOB [--nodes LIST] [--deep] [--dry-run]" },
	{ "metrics", CLI_CMD_METRICS, 0, "metrics" },
	{ "codec", CLI_CMD_NONE, 0, NULL },
};

#define FIELD(f) offsetof(struct cli_args, f)
#define NO_FIELD SIZE_MAX

static const struct cli_option {
	const char *name;           /* long name, without "--" */
	char short_name;            /* 0: none */
	bool has_arg;               /* the field is a const char *, else a bool */
	unsigned cmds;              /* CMD_BIT()s of the commands it belongs to */
	size_t field;               /* offset in struct cli_args, or NO_FIELD */
	enum cli_cmd action;        /* NO_FIELD options: the command they are */
} options[] = {
	{ "socket", 0, true, ALL_CMDS, FIELD(socket), CLI_CMD_NONE },
	{ "json", 0, false, ALL_CMDS, FIELD(json), CLI_CMD_NONE },
	{ "help", 'h', false, ALL_CMDS, NO_FIELD, CLI_CMD_HELP },
	{ "version", 0, false, ALL_CMDS, NO_FIELD, CLI_CMD_VERSION },
	{ "to", 0, true, CMD_BIT(CLI_CMD_PULL), FIELD(to), CLI_CMD_NONE },
	{ "verify", 0, false, CMD_BIT(CLI_CMD_PULL), FIELD(verify), CLI_CMD_NONE },
	{ "deep", 0, false, CMD_BIT(CLI_CMD_VERIFY) | CMD_BIT(CLI_CMD_RESUME), FIELD(deep),
	  CLI_CMD_NONE },
	{ "cluster", 0, false, CMD_BIT(CLI_CMD_VERIFY) | CMD_BIT(CLI_CMD_PULL), FIELD(cluster),
	  CLI_CMD_NONE },
	{ "xxhsum", 0, false, CMD_BIT(CLI_CMD_MANIFEST), FIELD(xxhsum), CLI_CMD_NONE },
	{ "wait", 0, false, CMD_BIT(CLI_CMD_COMMIT), FIELD(wait), CLI_CMD_NONE },
	{ "from", 0, true, CMD_BIT(CLI_CMD_RESTORE), FIELD(from), CLI_CMD_NONE },
	{ "nodes", 0, true, CMD_BIT(CLI_CMD_DOCTOR) | CMD_BIT(CLI_CMD_RESUME) |
	  CMD_BIT(CLI_CMD_VERIFY) | CMD_BIT(CLI_CMD_PULL), FIELD(nodes), CLI_CMD_NONE },
	{ "dry-run", 0, false, CMD_BIT(CLI_CMD_RESUME), FIELD(dry_run), CLI_CMD_NONE },
	{ "ports", 0, true, CMD_BIT(CLI_CMD_DOCTOR), FIELD(ports), CLI_CMD_NONE },
	{ "quick", 0, false, CMD_BIT(CLI_CMD_DOCTOR), FIELD(quick), CLI_CMD_NONE },
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

__attribute__((format(printf, 4, 5)))
static int fail(int rc, char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return rc;
}

static const struct cli_command *find_command(const char *name)
{
	for (size_t i = 0; i < COUNT(commands); i++)
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	return NULL;
}

/* arg is "--name", "--name=value" or "-c"; *value is set for the "=" form. */
static const struct cli_option *find_option(const char *arg, const char **value)
{
	*value = NULL;
	if (arg[1] != '-') {
		for (size_t i = 0; i < COUNT(options); i++)
			if (options[i].short_name && arg[1] == options[i].short_name && !arg[2])
				return &options[i];
		return NULL;
	}
	const char *name = arg + 2;
	const char *eq = strchr(name, '=');
	size_t n = eq ? (size_t)(eq - name) : strlen(name);

	for (size_t i = 0; i < COUNT(options); i++)
		if (strlen(options[i].name) == n && memcmp(options[i].name, name, n) == 0) {
			*value = eq ? eq + 1 : NULL;
			return &options[i];
		}
	return NULL;
}

/* Checks that hold once the whole line is read. */
static int check(const struct cli_args *a, const struct cli_command *c, unsigned seen,
		 int nops, char **ops, char *err, size_t errlen)
{
	for (size_t i = 0; i < COUNT(options); i++)
		if ((seen & (1u << i)) && !(options[i].cmds & CMD_BIT(c->cmd)))
			return fail(-EINVAL, err, errlen, "option '--%s' does not apply to '%s'",
				    options[i].name, c->name);
	if (nops < c->operands)
		return fail(-EINVAL, err, errlen, "missing operand: stage %s", c->usage);
	if (nops > c->operands)
		return fail(-EINVAL, err, errlen, "extra operand '%s': stage %s",
			    ops[c->operands], c->usage);
	if (a->operand && !*a->operand)
		return fail(-EINVAL, err, errlen, "empty path: stage %s", c->usage);
	if (a->nodes && c->cmd == CLI_CMD_VERIFY && !a->cluster)
		return fail(-EINVAL, err, errlen, "--nodes names the job's nodes for --cluster: "
			    "stage verify PATH --cluster --nodes LIST");
	if (a->nodes && c->cmd == CLI_CMD_PULL && !a->cluster)
		return fail(-EINVAL, err, errlen, "--nodes names the nodes to stage on with --cluster: "
			    "stage pull SRC --cluster --nodes LIST");
	if (a->json && a->xxhsum)
		return fail(-EINVAL, err, errlen, "--json and --xxhsum are two output formats: pick one");
	return 0;
}

int cli_args_parse(struct cli_args *a, int argc, char **argv, char *err, size_t errlen)
{
	const struct cli_command *cmd = NULL;
	unsigned seen = 0;
	int nops = 0;
	char *ops[2] = { NULL, NULL };  /* the operands after the command; more are "extra" */
	bool dashdash = false;

	memset(a, 0, sizeof(*a));
	for (int i = 1; i < argc; i++) {
		char *arg = argv[i];

		if (dashdash || arg[0] != '-' || !arg[1]) {
			if (cmd) {
				if (nops < (int)COUNT(ops))
					ops[nops] = arg;
				nops++;
				continue;
			}
			cmd = find_command(arg);
			if (!cmd)
				return fail(-EINVAL, err, errlen, "unknown command '%s'", arg);
			if (cmd->cmd == CLI_CMD_NONE)
				return fail(-ENOTSUP, err, errlen,
					    "'%s' is not available in this version yet", arg);
			continue;
		}
		if (strcmp(arg, "--") == 0) {
			dashdash = true;
			continue;
		}

		const char *value;
		const struct cli_option *o = find_option(arg, &value);

		if (!o)
			return fail(-EINVAL, err, errlen, "unrecognized option '%s'", arg);
		if (o->field == NO_FIELD) {
			a->cmd = o->action;
			return 0;
		}
		seen |= 1u << (o - options);
		if (!o->has_arg) {
			if (value)
				return fail(-EINVAL, err, errlen, "option '--%s' takes no value", o->name);
			*(bool *)((char *)a + o->field) = true;
			continue;
		}
		if (!value) {
			if (i + 1 == argc)
				return fail(-EINVAL, err, errlen, "option '--%s' needs a value", o->name);
			value = argv[++i];
		}
		if (!*value)
			return fail(-EINVAL, err, errlen, "option '--%s' needs a non-empty value", o->name);
		*(const char **)((char *)a + o->field) = value;
	}
	if (!cmd)
		return fail(-EINVAL, err, errlen, "missing command");
	a->cmd = cmd->cmd;
	a->operand = ops[0];
	return check(a, cmd, seen, nops, ops, err, errlen);
}

const char *cli_args_command_name(size_t i)
{
	return i < COUNT(commands) ? commands[i].name : NULL;
}

const char *cli_args_option_name(const char *cmd, size_t i, bool *has_arg)
{
	const struct cli_command *c = cmd ? find_command(cmd) : NULL;
	unsigned want = c && c->cmd != CLI_CMD_NONE ? CMD_BIT(c->cmd) : ALL_CMDS;

	for (size_t k = 0; k < COUNT(options); k++) {
		const struct cli_option *o = &options[k];

		if (want == ALL_CMDS ? o->cmds != ALL_CMDS : !(o->cmds & want))
			continue;
		if (i-- == 0) {
			*has_arg = o->has_arg;
			return o->name;
		}
	}
	return NULL;
}

bool cli_args_option_has_arg(const char *arg, bool *has_arg)
{
	const char *value;
	const struct cli_option *o = arg[0] == '-' ? find_option(arg, &value) : NULL;

	if (!o || value)
		return false;
	*has_arg = o->has_arg;
	return true;
}

int cli_args_command_index(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		const char *arg = argv[i], *value;
		const struct cli_option *o;

		if (arg[0] != '-' || !arg[1])
			return i;
		if (strcmp(arg, "--") == 0)
			return i + 1 < argc ? i + 1 : -1;
		o = find_option(arg, &value);
		if (!o || o->field == NO_FIELD)
			return -1;
		if (o->has_arg && !value)
			i++;
	}
	return -1;
}

void cli_args_usage(FILE *f)
{
	fputs("Usage: stage [--socket PATH] [--json] COMMAND ...\n"
	      "\n"
	      "Commands:\n", f);
	for (size_t i = 0; i < COUNT(commands); i++)
		if (commands[i].usage)
			fprintf(f, "  stage %s\n", commands[i].usage);
	fputs("  stage codec compress [--codec none|zstd|float] IN OUT\n"
	      "  stage codec decompress IN OUT\n"
	      "  stage codec bench FILE\n", f);
	fputs("\n"
	      "  pull      copy SRC (under a source root) to the stage root; the local path\n"
	      "            is the last line of stdout. --to names the destination, --verify\n"
	      "            re-reads what landed. --cluster stages SRC on every node (--nodes:\n"
	      "            names and Slurm hostlists; default $SLURM_JOB_NODELIST, else every\n"
	      "            node), the source read once in all: each node reads its share and\n"
	      "            the nodes forward the rest to each other\n"
	      "  verify    check a staged tree against its manifest; --deep re-hashes every\n"
	      "            byte. --cluster: PATH is a checkpoint (ckpt_root/JOB/STEP); every\n"
	      "            node says what it holds of it, shown as a table: a row per node\n"
	      "            that wrote a part (origin), a column per node holding copies\n"
	      "            (holder); \"-\" no copy, \"?\" the holder could not be asked\n"
	      "  status    the daemon, its peers and the transfers in flight\n"
	      "  commit    DIR (ckpt_root/JOB/STEP) is a finished checkpoint: write its manifest\n"
	      "            and queue its copies to the partners; --wait returns once every\n"
	      "            copy is confirmed on disk\n"
	      "  restore   bring checkpoint DIR (ckpt_root/JOB/STEP) back to this node from\n"
	      "            the copies its partners hold, else from the durable tier; --from\n"
	      "            NODE fetches them from NODE (or \"durable\") rather than from a\n"
	      "            holder the daemon picks\n"
	      "  ls        checkpoints known to this node and where their copies are\n"
	      "  doctor    the cluster preflight: bandwidth and latency between nodes, clocks,\n"
	      "            the job's ports, facts that must agree (kernel, GPU, driver), disk\n"
	      "            and shared-storage speed; exit 1 when a problem is found. --nodes\n"
	      "            takes names and Slurm hostlists (default: $SLURM_JOB_NODELIST, else\n"
	      "            every node), --ports a list like 29500,29400-29410, --quick\n"
	      "            shortens every measurement\n"
	      "  manifest  print PATH/.stage/manifest (no daemon needed); --xxhsum prints lines\n"
	      "            `xxhsum -H2 -c` accepts when run inside PATH\n"
	      "  codec     compress a file into a self-describing one and back, or measure\n"
	      "            every codec on it (no daemon needed; see `stage codec --help`)\n"
	      "\n"
	      "Options (before, among or after the operands; \"--\" ends them):\n"
	      "  --socket PATH  the daemon's socket (default: $STAGE_SOCKET, else the daemon's\n"
	      "                 default: /run/stage/staged.sock as root, else\n"
	      "                 $XDG_RUNTIME_DIR/stage.sock or /tmp/stage-UID.sock)\n"
	      "  --json         one JSON object per line on stdout, for scripts\n"
	      "  -h, --help     this help\n"
	      "  --version      the version\n"
	      "\n"
	      "Exit status: 0 success, 1 the operation failed, 2 usage or configuration error,\n"
	      "3 the daemon could not be reached.\n", f);
}
