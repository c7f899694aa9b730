/* stage: the command-line client of staged (BRIEF §3).
 *
 * main parses the line (cli_args), then either runs a local command
 * (manifest) or sends one request to the daemon and renders its reply frames
 * until the result (cli_conn, cli_out). The exit code is the result's:
 * 0 done, 1 failed, 2 usage or configuration, 3 daemon unreachable. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/cli_args.h"
#include "client/cli_codec.h"
#include "client/cli_complete.h"
#include "client/cli_conn.h"
#include "client/cli_manifest.h"
#include "client/cli_out.h"
#include "common/paths.h"

#include "common/version.h"

/* Relative operands are made absolute against our cwd, lexically: the daemon
 * has another cwd, and it must see any ".." to judge path safety itself. */
static int absolute(const char *arg, char **out)
{
	char *cwd = NULL;

	if (arg[0] != '/' && !(cwd = getcwd(NULL, 0)))
		return -errno;
	*out = paths_absolute(cwd ? cwd : "/", arg);
	free(cwd);
	return *out ? 0 : -ENOMEM;
}

static int on_frame(void *out, const struct msg *m)
{
	return cli_out_frame(out, m);
}

static const char *lost_why(int rc)
{
	if (rc == -ENOTCONN || rc == -ECONNRESET)
		return "it closed the connection before the result (did it stop? `stage status` "
		       "tells, and its log says why)";
	if (rc == -EBADMSG)
		return "malformed reply (is staged of another version?)";
	return strerror(-rc);
}

static void build_request(struct msg *req, const struct cli_args *a, const char *path,
			  const char *dest, bool progress)
{
	static const uint16_t types[] = {
		[CLI_CMD_PULL] = MSG_PULL_REQ,
		[CLI_CMD_VERIFY] = MSG_VERIFY_REQ,
		[CLI_CMD_STATUS] = MSG_STATUS_REQ,
		[CLI_CMD_COMMIT] = MSG_COMMIT_REQ,
		[CLI_CMD_LS] = MSG_LS_REQ,
		[CLI_CMD_RESTORE] = MSG_RESTORE_REQ,
		[CLI_CMD_DOCTOR] = MSG_DOCTOR_REQ,
		[CLI_CMD_METRICS] = MSG_METRICS_REQ,
		[CLI_CMD_RESUME] = MSG_RESUME_REQ,
	};
	/* Each option belongs to one command (cli_args saw to it), so the
	 * flags need not ask which command this is. */
	uint64_t flags = (a->verify ? REQ_VERIFY : 0) | (a->deep ? REQ_DEEP : 0) |
			 (a->cluster ? REQ_CLUSTER : 0) | (a->wait ? REQ_WAIT : 0) |
			 (a->quick ? REQ_QUICK : 0) | (a->dry_run ? REQ_DRYRUN : 0) |
			 (progress ? REQ_PROGRESS : 0);

	msg_init(req, types[a->cmd]);
	if (a->cmd == CLI_CMD_RESUME)
		msg_put_str(req, K_JOB, a->operand);    /* a name, not a path */
	else if (path)
		msg_put_str(req, K_PATH, path);
	if (dest)
		msg_put_str(req, K_DEST, dest);
	if (a->cmd != CLI_CMD_STATUS && a->cmd != CLI_CMD_LS && a->cmd != CLI_CMD_METRICS)
		msg_put_u64(req, K_FLAGS, flags);
	/* A node name, passed as given: the daemon knows the hosts file. */
	if (a->from)
		msg_put_str(req, K_HOLDER, a->from);
	/* Lists as given, checked where the hosts file is. Without --nodes a
	 * Slurm job's own nodes are the ones to check. */
	if ((a->cmd == CLI_CMD_DOCTOR || a->cmd == CLI_CMD_RESUME ||
	     ((a->cmd == CLI_CMD_VERIFY || a->cmd == CLI_CMD_PULL) && a->cluster)) &&
	    (a->nodes || getenv("SLURM_JOB_NODELIST")))
		msg_put_str(req, K_NODES, a->nodes ? a->nodes : getenv("SLURM_JOB_NODELIST"));
	if (a->ports)
		msg_put_str(req, K_PORTS, a->ports);
}

/* One request, its reply frames, its result. Returns the exit code. */
static int ask_daemon(struct cli_out *o, const struct cli_args *a, const char *path,
		      const char *dest)
{
	char *sock;
	struct msg req;
	int fd, rc;

	rc = cli_conn_socket_path(a->socket, &sock);
	if (rc < 0) {
		cli_out_fail(o, CLI_EXIT_USAGE, "cannot tell the daemon's socket: %s", strerror(-rc));
		return CLI_EXIT_USAGE;
	}
	rc = cli_conn_open(sock, &fd);
	if (rc == -EACCES || rc == -EPERM) {
		/* It runs: its socket is its owner's and group's only. */
		cli_out_fail(o, CLI_EXIT_UNREACHABLE,
			     "cannot use staged's socket %s: %s. It is open to the daemon's owner and "
			     "group only: run as one of them (sudo), or join its group.", sock,
			     strerror(-rc));
		rc = CLI_EXIT_UNREACHABLE;
		goto out_free_sock;
	}
	if (rc < 0) {
		cli_out_fail(o, CLI_EXIT_UNREACHABLE,
			     "cannot reach staged at %s: %s. Is it running? Start it with `staged` "
			     "(or point STAGE_SOCKET/--socket at its socket; the system daemon's is "
			     "/run/stage/staged.sock).", sock, strerror(-rc));
		rc = CLI_EXIT_UNREACHABLE;
		goto out_free_sock;
	}
	build_request(&req, a, path, dest, o->progress || o->json);
	rc = cli_conn_exchange(fd, &req, on_frame, o);
	if (rc < 0) {
		cli_out_fail(o, CLI_EXIT_FAILED, "lost the daemon at %s: %s", sock, lost_why(rc));
		rc = CLI_EXIT_FAILED;
	} else {
		rc = o->code;
	}
	msg_free(&req);
	close(fd);
out_free_sock:
	free(sock);
	return rc;
}

/* Whatever stdout could not take turns success into failure. A closed pipe
 * (`stage manifest X | head`) is the reader's choice: no message for it. */
static int finish(int code)
{
	if (fflush(stdout) == 0 && !ferror(stdout))
		return code;
	if (errno != EPIPE)
		fprintf(stderr, "stage: cannot write to stdout: %s\n", strerror(errno));
	return code ? code : CLI_EXIT_FAILED;
}

int main(int argc, char **argv)
{
	char err[512], *path = NULL, *dest = NULL;
	struct cli_args a;
	struct cli_out o;
	int rc;

	/* A daemon gone mid-write must be an EPIPE we report, not a silent death. */
	signal(SIGPIPE, SIG_IGN);
	/* Completion's helper (tools/install/stage.bash), before any parsing:
	 * the line it is given is half-typed by definition. */
	if (argc > 1 && strcmp(argv[1], "__complete") == 0)
		return finish(cli_complete_main(argc - 1, argv + 1));
	/* codec has subcommands and options of its own: its module parses them. */
	rc = cli_args_command_index(argc, argv);
	if (rc > 0 && strcmp(argv[rc], "codec") == 0)
		return finish(cli_codec_main(argc - rc, argv + rc));
	rc = cli_args_parse(&a, argc, argv, err, sizeof(err));
	if (rc < 0) {
		fprintf(stderr, "stage: %s\n", err);
		if (rc == -EINVAL)
			fputs("Try 'stage --help'.\n", stderr);
		return CLI_EXIT_USAGE;
	}
	if (a.cmd == CLI_CMD_HELP) {
		cli_args_usage(stdout);
		return finish(CLI_EXIT_OK);
	}
	if (a.cmd == CLI_CMD_VERSION) {
		puts("stage " STAGE_VERSION);
		return finish(CLI_EXIT_OK);
	}

	cli_out_init(&o, stdout, stderr, a.json, isatty(STDERR_FILENO));
	o.path_last = a.cmd == CLI_CMD_PULL || a.cmd == CLI_CMD_RESUME;
	if ((a.operand && a.cmd != CLI_CMD_RESUME && (rc = absolute(a.operand, &path)) < 0) ||
	    (a.to && (rc = absolute(a.to, &dest)) < 0)) {
		cli_out_fail(&o, CLI_EXIT_FAILED, "cannot make %s absolute: %s",
			     path ? a.to : a.operand, strerror(-rc));
		rc = CLI_EXIT_FAILED;
	} else if (a.cmd == CLI_CMD_MANIFEST) {
		rc = cli_manifest_run(&o, path, a.xxhsum);
	} else {
		rc = ask_daemon(&o, &a, path, dest);
	}
	free(dest);
	free(path);
	return finish(rc);
}
