/* `stage __complete CWORD WORD...`: the candidates bash's completion
 * offers for word CWORD of the command line WORD... (WORD 0 being the
 * program), one a line. Commands and options come from the parser's own
 * tables (cli_args.c), so completion never offers what the parser refuses.
 * Paths come from the daemon where it knows them better than the file
 * system does: the source roots for a pull, the roots for a verify, and the
 * checkpoints it knows for a restore (a deleted step is still offered: that
 * is what restore is for); node names for --from and --nodes. The daemon is
 * asked with a short timeout and left out when it does not answer.
 *
 * A line starting with '!' is a directive for the script
 * (tools/install/stage.bash): "!dirs" or "!files" adds the file system's
 * completion of the current word (compgen) and treats the candidates as
 * file names. The script does nothing else, so everything about the
 * command line is decided here, once.
 */
#include "client/cli_complete.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "client/cli_args.h"
#include "client/cli_conn.h"
#include "common/codec.h"
#include "common/hosts.h"
#include "common/proto.h"

#define ASK_TIMEOUT_MS 500      /* a TAB must not hang on a busy or wedged daemon */

struct want {
	const char *cur;            /* the word being completed (its prefix) */
	size_t n;                   /* candidates printed */
};

static void offer(struct want *w, const char *s, size_t len)
{
	size_t cl = strlen(w->cur);

	if (len < cl || memcmp(s, w->cur, cl) != 0)
		return;
	fwrite(s, 1, len, stdout);
	fputc('\n', stdout);
	w->n++;
}

static void offer_str(struct want *w, const char *s)
{
	offer(w, s, strlen(s));
}

/* ---- what the daemon knows ---- */

enum {                          /* what to offer of the daemon's answers */
	ASK_SOURCE_ROOTS = 1 << 0,
	ASK_ROOTS = 1 << 1,         /* stage_root, ckpt_root, replica_root */
	ASK_CHECKPOINTS = 1 << 2,   /* from `stage ls` */
	ASK_NODES = 1 << 3,
	ASK_JOBS = 1 << 4,          /* the JOBs of `stage ls`, each once */
};

struct asked {
	struct want *w;
	unsigned what;              /* ASK_* */
	char ckpt_root[4096], replica_root[4096];
	char last_job[256];         /* ASK_JOBS: the one offered last (a job whose steps ls
				     * lists apart comes twice: readline shows it once) */
};

static bool name_is(const uint8_t *p, size_t n, const char *s)
{
	return n == strlen(s) && memcmp(p, s, n) == 0;
}

/* A status pair: roots and node names. "source_roots" is "a, b, c"; a
 * "peer" line starts with the node's name; "node" is this node. */
static void on_status_pair(struct asked *a, const uint8_t *name, size_t nn, const char *v, size_t vn)
{
	if (name_is(name, nn, "ckpt_root") || name_is(name, nn, "replica_root"))
		snprintf(name_is(name, nn, "ckpt_root") ? a->ckpt_root : a->replica_root,
			 sizeof(a->ckpt_root), "%.*s", (int)vn, v);
	if ((a->what & ASK_SOURCE_ROOTS) && name_is(name, nn, "source_roots")) {
		for (size_t i = 0; i < vn;) {
			size_t j = i;

			while (j < vn && v[j] != ',')
				j++;
			offer(a->w, v + i, j - i);
			i = j + (j < vn);
			while (i < vn && v[i] == ' ')
				i++;
		}
	} else if ((a->what & ASK_ROOTS) &&
		   (name_is(name, nn, "stage_root") || name_is(name, nn, "ckpt_root") ||
		    name_is(name, nn, "replica_root"))) {
		offer(a->w, v, vn);
	} else if ((a->what & ASK_NODES) &&
		   (name_is(name, nn, "node") || name_is(name, nn, "peer"))) {
		size_t k = 0;

		while (k < vn && v[k] != ' ' && v[k] != ':')
			k++;
		if (!name_is((const uint8_t *)v, k, "none"))    /* "none (a single node...)" */
			offer(a->w, v, k);
	}
}

/* An ls pair: JOB/STEP and "origin=N state=S ...": a copy of this node's
 * own lives at ckpt_root/JOB/STEP, a replica at replica_root/ORIGIN/JOB/STEP. */
static void on_ls_pair(struct asked *a, const uint8_t *name, size_t nn, const char *v, size_t vn)
{
	char path[8192], origin[256] = "";
	const char *o = memmem(v, vn, "origin=", 7);
	bool replica = memmem(v, vn, "state=replica", 13) != NULL;
	const uint8_t *slash = memchr(name, '/', nn);

	if (a->what & ASK_JOBS) {
		size_t jn = slash ? (size_t)(slash - name) : nn;

		if (jn < sizeof(a->last_job) && !name_is(name, jn, a->last_job)) {
			memcpy(a->last_job, name, jn);
			a->last_job[jn] = '\0';
			offer(a->w, a->last_job, jn);
		}
		return;
	}
	if (o) {
		size_t k = 0;

		o += 7;
		while (o + k < v + vn && o[k] != ' ' && k < sizeof(origin) - 1)
			k++;
		memcpy(origin, o, k);
		origin[k] = '\0';
	}
	if (replica)
		snprintf(path, sizeof(path), "%s/%s/%.*s", a->replica_root, origin, (int)nn, name);
	else
		snprintf(path, sizeof(path), "%s/%.*s", a->ckpt_root, (int)nn, name);
	if (a->ckpt_root[0])
		offer_str(a->w, path);
}

static int on_frame(void *ctx, const struct msg *m)
{
	struct asked *a = ctx;
	const uint8_t *name = NULL, *p;
	size_t nn = 0, n, off = 0;
	uint16_t key;

	if (m->type != MSG_STATUS && m->type != MSG_LS)
		return 0;
	/* The pairs in order: K_NAME then its K_VALUE. */
	while (msg_next_field(m, &off, &key, &p, &n) == 1) {
		if (key == K_NAME) {
			name = p;
			nn = n;
		} else if (key == K_VALUE && name) {
			if (m->type == MSG_STATUS)
				on_status_pair(a, name, nn, (const char *)p, n);
			else
				on_ls_pair(a, name, nn, (const char *)p, n);
			name = NULL;
		}
	}
	return 0;
}

/* One request; 0 once its result came, or -errno (a timeout among them). */
static int ask(struct asked *a, const char *socket_opt, uint16_t type)
{
	struct timeval tv = { 0, ASK_TIMEOUT_MS * 1000 };
	struct msg req;
	char *sock;
	int fd, rc;

	if ((rc = cli_conn_socket_path(socket_opt, &sock)) < 0)
		return rc;
	rc = cli_conn_open(sock, &fd);
	if (rc == 0) {
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
		msg_init(&req, type);
		rc = cli_conn_exchange(fd, &req, on_frame, a);
		msg_free(&req);
		close(fd);
	}
	free(sock);
	return rc;
}

/* The status says the roots and nodes; ls, asked only if the status came,
 * the checkpoints (under the roots the status named). */
static void from_daemon(struct want *w, const char *socket_opt, unsigned what)
{
	struct asked a = { .w = w, .what = what };

	if (ask(&a, socket_opt, MSG_STATUS_REQ) == 0 && (what & (ASK_CHECKPOINTS | ASK_JOBS)))
		ask(&a, socket_opt, MSG_LS_REQ);
}

/* ---- the command line ---- */

static void offer_options(struct want *w, const char *cmd)
{
	char name[64];
	const char *o;
	bool arg;

	for (size_t i = 0; (o = cli_args_option_name(cmd, i, &arg)) != NULL; i++) {
		snprintf(name, sizeof(name), "--%s", o);
		offer_str(w, name);
	}
	if (cmd && strcmp(cmd, "codec") == 0)
		offer_str(w, "--codec");
}

/* The value of option `opt` (without "--"). */
static void offer_value(struct want *w, const char *opt, const char *socket_opt)
{
	if (strcmp(opt, "from") == 0 || strcmp(opt, "nodes") == 0) {
		from_daemon(w, socket_opt, ASK_NODES);
		if (strcmp(opt, "from") == 0)
			offer_str(w, HOLD_DURABLE);     /* the durable tier, where there is one */
	} else if (strcmp(opt, "codec") == 0) {
		for (unsigned id = 0; id < CODEC_COUNT; id++)
			offer_str(w, codec_by_id(id)->name);
	} else if (strcmp(opt, "to") == 0) {
		from_daemon(w, socket_opt, ASK_ROOTS);
		puts("!dirs");
	} else if (strcmp(opt, "socket") == 0) {
		puts("!files");
	}
	/* --ports: numbers, nothing to offer. */
}

/* Operand number `nth` (from 0) of command cmd. */
static void offer_operand(struct want *w, const char *cmd, int nth, const char *socket_opt)
{
	static const char *const codec_subcommands[] = { "compress", "decompress", "bench" };

	if (strcmp(cmd, "codec") == 0) {
		if (nth == 0)
			for (size_t i = 0; i < sizeof(codec_subcommands) / sizeof(codec_subcommands[0]); i++)
				offer_str(w, codec_subcommands[i]);
		else
			puts("!files");
	} else if (nth > 0) {
		return;     /* every other command takes one operand at most */
	} else if (strcmp(cmd, "pull") == 0) {
		from_daemon(w, socket_opt, ASK_SOURCE_ROOTS);
		puts("!dirs");
	} else if (strcmp(cmd, "restore") == 0 || strcmp(cmd, "commit") == 0) {
		from_daemon(w, socket_opt, ASK_CHECKPOINTS);
		puts("!dirs");
	} else if (strcmp(cmd, "verify") == 0) {
		from_daemon(w, socket_opt, ASK_ROOTS | ASK_CHECKPOINTS);
		puts("!dirs");
	} else if (strcmp(cmd, "manifest") == 0) {
		puts("!dirs");
	} else if (strcmp(cmd, "resume") == 0) {
		from_daemon(w, socket_opt, ASK_JOBS);
	}
}

int cli_complete_main(int argc, char **argv)
{
	const char *cmd = NULL, *socket_opt = NULL, *pending = NULL;
	struct want w = { .cur = "" };
	int cword, nth = 0;
	bool has_arg, dashdash = false;

	/* argv: "__complete" CWORD PROGRAM WORD... */
	if (argc < 3 || (cword = atoi(argv[1])) < 1 || cword > argc - 2)
		return 0;
	argv += 2;
	argc -= 2;
	w.cur = cword < argc ? argv[cword] : "";
	/* Walk the words before the current one as the parser would. bash
	 * splits "--to=x" at '=' into "--to" "=" "x": an "=" continues the
	 * option before it. */
	for (int i = 1; i < cword; i++) {
		const char *a = argv[i];

		if (pending) {
			if (strcmp(a, "=") == 0)
				continue;
			if (strcmp(pending, "socket") == 0)
				socket_opt = a;
			pending = NULL;
		} else if (!dashdash && strcmp(a, "--") == 0) {
			dashdash = true;
		} else if (!dashdash && a[0] == '-' && a[1]) {
			if (strncmp(a, "--socket=", 9) == 0)
				socket_opt = a + 9;
			else if ((cli_args_option_has_arg(a, &has_arg) && has_arg) ||
				 (cmd && strcmp(cmd, "codec") == 0 && strcmp(a, "--codec") == 0))
				pending = a + 2;
		} else if (!cmd) {
			cmd = a;
		} else {
			nth++;
		}
	}
	if (strcmp(w.cur, "=") == 0)
		w.cur = "";
	if (pending)
		offer_value(&w, pending, socket_opt);
	else if (!dashdash && w.cur[0] == '-')
		offer_options(&w, cmd);
	else if (!cmd)
		for (size_t i = 0; cli_args_command_name(i); i++)
			offer_str(&w, cli_args_command_name(i));
	else
		offer_operand(&w, cmd, nth, socket_opt);
	return fflush(stdout) == 0 ? 0 : 1;
}
