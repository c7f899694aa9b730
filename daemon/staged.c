/* staged: the per-node daemon.
 *
 * The main thread owns one io_uring that waits on two things: the control
 * socket (multishot accept) and a signalfd. Each accepted connection is
 * served on its own thread (ctl.c); each pull or verify runs its own ring.
 * SIGTERM/SIGINT: stop accepting, tell jobs to wind down (they remove their
 * temporaries and keep their journals), wait for them, exit 0.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <liburing.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include "common/config.h"
#include "common/log.h"
#include "common/version.h"
#include "daemon/restore/restore.h"
#include "daemon/cpull/cpull.h"
#include "daemon/survey/hold.h"
#include "daemon/survey/fanout.h"
#include "daemon/restore/resume.h"
#include "daemon/ctl.h"
#include "daemon/fs/cred.h"
#include "daemon/doctor/doctor.h"
#include "daemon/job/job.h"
#include "daemon/peers/peers.h"
#include "daemon/repl/repl.h"
#include "daemon/durable/drain.h"
#include "daemon/metrics.h"
#include "daemon/fs/roots.h"

#define STOP_GRACE_S 30

enum { EV_ACCEPT = 1, EV_SIGNAL, EV_PEER };

struct daemon {
	struct stage_config cfg;
	struct io_uring ring;
	int listen_fd;
	int sig_fd;
	struct signalfd_siginfo si;   /* the signalfd read lands here */
};

static void usage(FILE *out)
{
	fprintf(out,
		"usage: staged [--config FILE] [--foreground] [--print-config]\n"
		"  --config FILE    read FILE (INI; every key has a default)\n"
		"  --foreground     stay attached, log to stderr\n"
		"  --print-config   print the configuration in force and exit\n");
}

static void raise_nofile(void)
{
	struct rlimit rl;

	/* Many files in flight per pull, several pulls: use what we may. */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/* The daemon's side of the pipe its parent waits on, -1 when there is
 * none (--foreground, or once said). */
static int ready_fd = -1;

/* The parent of a daemonized staged: it waits for the child to say how its
 * start-up went, so that a hosts file or key file that is refused is said
 * on the terminal that started it, with exit 2, not only in the log. The
 * child writes one byte, the exit code, then the reason; EOF with nothing
 * is a child that died. */
_Noreturn static void await_child(int fd, const char *logpath)
{
	char buf[4096];
	size_t n = 0;
	ssize_t r;

	while (n < sizeof(buf) - 1 && ((r = read(fd, buf + n, sizeof(buf) - 1 - n)) > 0 ||
				       (r < 0 && errno == EINTR)))
		n += r > 0 ? (size_t)r : 0;
	buf[n] = '\0';
	if (n == 0) {
		fprintf(stderr, "staged: the daemon ended during start-up; %s says why\n", logpath);
		_exit(1);
	}
	if (buf[0])
		fprintf(stderr, "staged: %s\n", buf + 1);
	_exit((unsigned char)buf[0]);
}

/* Start-up is over: code 0 (serving) or the exit code and why. Says it to
 * the waiting parent once; the log has it too. */
static void started(int code, const char *why)
{
	char buf[4096];
	int n;

	if (ready_fd < 0)
		return;
	n = snprintf(buf, sizeof(buf), "%c%s", code, why);
	if (write(ready_fd, buf, n < 0 ? 1 : (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1)) {
		/* nothing to do: a parent gone is no reason to stop */
	}
	close(ready_fd);
	ready_fd = -1;
}

static int daemonize(const struct stage_config *cfg)
{
	char logpath[4096];
	int fd, pipefd[2];
	pid_t pid;

	snprintf(logpath, sizeof(logpath), "%s/staged.log", cfg->state_dir);
	fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
	if (fd < 0) {
		int err = errno;

		fprintf(stderr, "staged: cannot open its log %s (in state_dir): %s; fix that, or run "
			"it with --foreground\n", logpath, strerror(err));
		return -err;
	}
	if (pipe2(pipefd, O_CLOEXEC) < 0 || (pid = fork()) < 0) {
		int err = errno;

		fprintf(stderr, "staged: cannot go to the background: %s; run it with --foreground\n",
			strerror(err));
		close(fd);
		return -err;
	}
	if (pid > 0) {
		close(pipefd[1]);
		await_child(pipefd[0], logpath);
	}
	close(pipefd[0]);
	ready_fd = pipefd[1];
	setsid();
	dup2(fd, STDERR_FILENO);
	close(fd);
	fd = open("/dev/null", O_RDWR);
	if (fd >= 0) {
		dup2(fd, STDIN_FILENO);
		dup2(fd, STDOUT_FILENO);
		if (fd > 2)
			close(fd);
	}
	return 0;
}

static void arm_accept(struct daemon *d)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);

	io_uring_prep_multishot_accept(sqe, d->listen_fd, NULL, NULL, SOCK_CLOEXEC);
	io_uring_sqe_set_data64(sqe, EV_ACCEPT);
}

/* Peers arrive on the transport's listener; its fd is polled, and the
 * transport accepts (so an RDMA listener fits the same slot). */
static void arm_peer(struct daemon *d)
{
	struct io_uring_sqe *sqe;

	if (peers_listen_fd() < 0)
		return;
	sqe = io_uring_get_sqe(&d->ring);
	io_uring_prep_poll_multishot(sqe, peers_listen_fd(), POLLIN);
	io_uring_sqe_set_data64(sqe, EV_PEER);
}

static void arm_signal(struct daemon *d)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);

	io_uring_prep_read(sqe, d->sig_fd, &d->si, sizeof(d->si), 0);
	io_uring_sqe_set_data64(sqe, EV_SIGNAL);
}

/* Runs until a stop signal. 0, or -errno if the ring failed. */
static int event_loop(struct daemon *d)
{
	arm_accept(d);
	arm_signal(d);
	arm_peer(d);
	for (;;) {
		struct io_uring_cqe *cqe;
		int ret = io_uring_submit_and_wait(&d->ring, 1);

		if (ret < 0 && ret != -EINTR)
			return ret;
		while (io_uring_peek_cqe(&d->ring, &cqe) == 0) {
			uint64_t ev = io_uring_cqe_get_data64(cqe);
			int res = cqe->res;
			unsigned flags = cqe->flags;

			io_uring_cqe_seen(&d->ring, cqe);
			if (ev == EV_SIGNAL) {
				if (res == (int)sizeof(d->si)) {
					log_info("signal %u: stopping", d->si.ssi_signo);
					return 0;
				}
				arm_signal(d);
			} else if (ev == EV_PEER) {
				if (res >= 0)
					peers_accept();
				if (!(flags & IORING_CQE_F_MORE))
					arm_peer(d);
			} else if (ev == EV_ACCEPT) {
				if (res >= 0)
					ctl_spawn(&d->cfg, res);
				else if (res != -EINTR && res != -ECONNABORTED)
					log_warn("accept: %s", strerror(-res));
				/* The kernel ends a multishot on error or overflow: re-arm. */
				if (!(flags & IORING_CQE_F_MORE))
					arm_accept(d);
			}
		}
	}
}

/* true when every request has finished within the grace period. */
static bool wait_for_jobs(void)
{
	for (int i = 0; i < STOP_GRACE_S * 20 && ctl_active(); i++) {
		struct timespec ts = { .tv_nsec = 50000000 };

		nanosleep(&ts, NULL);
	}
	if (!ctl_active())
		return true;
	log_warn("%u requests still running after %d s; exiting anyway", ctl_active(),
		 STOP_GRACE_S);
	return false;
}

/* The command line and the configuration: -1 to go on, or the exit status
 * (d->cfg freed unless going on). */
static int configure(int argc, char **argv, struct daemon *d, bool *foreground)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "foreground", no_argument, NULL, 'f' },
		{ "print-config", no_argument, NULL, 'p' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 },
	};
	const char *config_path = NULL;
	bool print = false;
	char why[4096];
	int c, ret;

	while ((c = getopt_long(argc, argv, "c:fh", opts, NULL)) != -1) {
		switch (c) {
		case 'c': config_path = optarg; break;
		case 'f': *foreground = true; break;
		case 'p': print = true; break;
		case 'h': usage(stdout); return 0;
		case 'V': puts("staged " STAGE_VERSION); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "staged: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	if (config_defaults(&d->cfg) < 0) {
		fprintf(stderr, "staged: out of memory\n");
		return 1;
	}
	if (config_path && config_load(&d->cfg, config_path, why, sizeof(why)) < 0) {
		fprintf(stderr, "staged: %s\n", why);
		ret = 2;
	} else if (doctor_check_config(&d->cfg, why, sizeof(why)) < 0) {
		fprintf(stderr, "staged: %s: %s\n", config_path ? config_path : "the defaults", why);
		ret = 2;
	} else if (print) {
		config_print(&d->cfg, stdout);
		ret = 0;
	} else {
		return -1;
	}
	config_free(&d->cfg);
	return ret;
}

/* The mirror of peers_open and repl_open: no peer served any more, then
 * replication, then the membership. */
static void close_cluster(void)
{
	peers_stop();
	repl_close();
	peers_close();
}

/* The services behind the control socket, in the order they depend on one
 * another: the peer layer (with every request a peer may make registered
 * first), replication, the metrics, the durable tier. 0, or the exit
 * status with each started one stopped again (stop_services is the
 * mirror). */
static int start_services(struct daemon *d, bool foreground)
{
	char why[4096];
	bool metrics;
	int ret;

	/* What this node answers on a peer's connection: the requests of the
	 * cluster features above replication (replication registers its offer
	 * in repl_open). */
	peers_serve(MSG_HOLD_REQ, hold_serve, NULL);
	peers_serve(MSG_FETCH_REQ, restore_fetch_serve, NULL);
	peers_serve(MSG_DOCTOR_ASK, doctor_serve, NULL);
	peers_serve(MSG_RESTORE_ASK, resume_serve, NULL);
	peers_serve(MSG_RESEND_ASK, resume_serve, NULL);
	peers_serve(MSG_RELAY, fanout_serve, NULL);
	peers_serve(MSG_CPULL_ASK, cpull_node_serve, NULL);
	peers_serve(MSG_CPULL_FETCH, cpull_fetch_serve, NULL);
	ret = peers_open(&d->cfg, why, sizeof(why));
	if (ret == 0 && (ret = repl_open(&d->cfg, why, sizeof(why))) < 0) {
		peers_stop();
		peers_close();
	}
	if (ret < 0) {
		log_err("%s", why);
		if (foreground)
			fprintf(stderr, "staged: %s\n", why);
		started(2, why);
		return 2;
	}
	ret = metrics_start(&d->cfg, why, sizeof(why));
	metrics = ret == 0;
	if (ret == 0 && (ret = durable_start(&d->cfg, why, sizeof(why))) == 0)
		return 0;
	log_err("%s", why);
	started(1, why);
	if (metrics)
		metrics_stop();
	close_cluster();
	return 1;
}

static void stop_services(void)
{
	durable_stop();
	metrics_stop();
	close_cluster();
}

int main(int argc, char **argv)
{
	bool foreground = false;
	struct daemon d = { .listen_fd = -1, .sig_fd = -1 };
	char why[4096];
	sigset_t mask;
	int ret;

	ret = configure(argc, argv, &d, &foreground);
	if (ret >= 0)
		return ret;
	log_threshold = (enum log_level)d.cfg.log_level;
	log_open("staged", STDERR_FILENO);
	raise_nofile();
	signal(SIGPIPE, SIG_IGN);
	cred_init();

	if ((ret = roots_mkdirs(d.cfg.state_dir, 0755)) < 0 ||
	    (ret = roots_mkdirs(d.cfg.stage_root, 0755)) < 0) {
		fprintf(stderr, "staged: cannot create %s: %s\n",
			access(d.cfg.state_dir, F_OK) ? d.cfg.state_dir : d.cfg.stage_root,
			strerror(-ret));
		ret = 2;
		goto out_config;
	}
	ret = ctl_listen(&d.cfg, &d.listen_fd, why, sizeof(why));
	if (ret < 0) {
		fprintf(stderr, "staged: %s\n", why);
		ret = 1;
		goto out_config;
	}
	if (!foreground && daemonize(&d.cfg) < 0) {
		ret = 1;
		goto out_unlisten;
	}
	/* Threads start here, after the fork, and with the mask below. */
	/* Before any thread exists, so every thread inherits the mask. */
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);
	d.sig_fd = signalfd(-1, &mask, SFD_CLOEXEC);
	if (d.sig_fd < 0) {
		snprintf(why, sizeof(why), "signalfd: %s", strerror(errno));
		log_err("%s", why);
		started(1, why);
		ret = 1;
		goto out_unlisten;
	}
	ret = start_services(&d, foreground);
	if (ret)
		goto out_close_signal;
	ret = io_uring_queue_init(64, &d.ring, 0);
	if (ret < 0) {
		snprintf(why, sizeof(why), "io_uring: %s (kernel.io_uring_disabled, or the "
			 "memlock limit?)", strerror(-ret));
		log_err("%s", why);
		started(1, why);
		ret = 1;
		goto out_stop_services;
	}
	log_info("node %s listening on %s (stage_root %s)", d.cfg.name, d.cfg.socket,
		 d.cfg.stage_root);
	started(0, "");

	ret = event_loop(&d);
	if (ret < 0)
		log_err("event loop: %s", strerror(-ret));
	/* No new requests (the ring and its accept go first), then every job
	 * winds down: it cancels its copies and removes its temporaries. */
	io_uring_queue_exit(&d.ring);
	ctl_unlisten(&d.cfg, d.listen_fd);
	d.listen_fd = -1;
	atomic_store(&stage_stopping, true);
	if (!wait_for_jobs()) {
		/* Threads still use the configuration: leave it to the exit.
		 * The metrics file goes, though: it must not outlive us. */
		durable_stop();
		metrics_stop();
		log_info("stopped");
		return 1;
	}
	log_info("stopped");
	ret = ret < 0 ? 1 : 0;
out_stop_services:
	stop_services();
out_close_signal:
	close(d.sig_fd);
out_unlisten:
	if (d.listen_fd >= 0)
		ctl_unlisten(&d.cfg, d.listen_fd);
out_config:
	config_free(&d.cfg);
	return ret;
}
