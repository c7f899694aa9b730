/* The command line of `stage` (BRIEF §3): what the user asked for, parsed
 * without touching the system, so every rule here is unit-tested.
 *
 * Options may stand anywhere: before the command, among the operands, after
 * them; "--" ends them. An option belongs to one or more commands (--to to
 * pull), or to all (--socket, --json); one given to a command it does not
 * belong to is a usage error. */
#ifndef STAGE_CLI_ARGS_H
#define STAGE_CLI_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

enum cli_exit {
	CLI_EXIT_OK = 0,
	CLI_EXIT_FAILED = 1,        /* the operation ran and failed */
	CLI_EXIT_USAGE = 2,         /* usage or configuration error */
	CLI_EXIT_UNREACHABLE = 3,   /* the daemon could not be reached */
};

enum cli_cmd {
	CLI_CMD_NONE,
	CLI_CMD_HELP,
	CLI_CMD_VERSION,
	CLI_CMD_PULL,
	CLI_CMD_VERIFY,
	CLI_CMD_STATUS,
	CLI_CMD_MANIFEST,
	CLI_CMD_COMMIT,
	CLI_CMD_LS,
	CLI_CMD_RESTORE,
	CLI_CMD_DOCTOR,
	CLI_CMD_METRICS,
	CLI_CMD_RESUME,
};

/* What the user asked for. Strings point into argv. */
struct cli_args {
	enum cli_cmd cmd;
	const char *operand;        /* SRC, PATH or DIR; NULL for status and ls */
	const char *socket;         /* --socket, NULL if not given */
	const char *to;             /* pull --to DEST */
	const char *from;           /* restore --from NODE */
	bool json;
	bool verify;                /* pull --verify */
	bool deep;                  /* verify --deep */
	bool cluster;               /* verify --cluster */
	bool xxhsum;                /* manifest --xxhsum */
	bool wait;                  /* commit --wait */
	const char *nodes;          /* doctor, resume --nodes LIST */
	bool dry_run;               /* resume --dry-run */
	const char *ports;          /* doctor --ports LIST */
	bool quick;                 /* doctor --quick */
};

/* 0 and *a filled; or -EINVAL, a usage mistake; or -ENOTSUP, a command this
 * version does not do yet (or that main hands elsewhere: codec). Both exit 2; err gets
 * the message without the "stage: " prefix and without the "Try 'stage
 * --help'." hint, which only the first deserves. --help and --version win as
 * soon as they are seen. */
int cli_args_parse(struct cli_args *a, int argc, char **argv, char *err, size_t errlen);

void cli_args_usage(FILE *f);

/* The tables as completion sees them (cli_complete.c), so that it offers
 * exactly what the parser takes: the name of command i (NULL past the
 * last; "codec", which main hands to its own module, included), and the
 * name of option i of command `cmd` (NULL: before any command, the options
 * every command takes), NULL past the last, with whether it takes a value.
 * find: the option named by "--name" or "-c" (no "=value"), or NULL. */
const char *cli_args_command_name(size_t i);
const char *cli_args_option_name(const char *cmd, size_t i, bool *has_arg);
bool cli_args_option_has_arg(const char *arg, bool *has_arg);

/* The index in argv of the command word, skipping the options before it and
 * their values; -1 if there is none, or --help/--version comes first. Lets
 * main hand commands with their own parser (codec) their part of the line. */
int cli_args_command_index(int argc, char **argv);

#endif
