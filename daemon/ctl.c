#include "daemon/restore/restore.h"
#include "daemon/ctl.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/proto.h"
#include "daemon/cpull/cpull.h"
#include "daemon/survey/cverify.h"
#include "daemon/restore/resume.h"
#include "daemon/doctor/doctor.h"
#include "daemon/fs/cred.h"
#include "daemon/fs/fsprobe.h"
#include "daemon/job/job.h"
#include "daemon/metrics.h"
#include "daemon/pull/pull.h"
#include "daemon/repl/repl.h"
#include "daemon/fs/roots.h"
#include "daemon/pull/verify.h"

#include "common/version.h"
#define MAX_CONNS 256
#define STR_(x) #x
#define STR(x) STR_(x)

static atomic_uint active;
static uint64_t started_ns;

struct conn {
	const struct stage_config *cfg;
	int fd;
};

unsigned ctl_active(void)
{
	return atomic_load(&active);
}

int ctl_listen(const struct stage_config *cfg, int *out, char *why, size_t whylen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char dir[sizeof(sa.sun_path)];
	char *slash;
	mode_t old;
	int fd, ret;

	if (strlen(cfg->socket) >= sizeof(sa.sun_path)) {
		snprintf(why, whylen, "socket path '%s' is too long", cfg->socket);
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, cfg->socket);
	strcpy(dir, cfg->socket);
	slash = strrchr(dir, '/');
	if (slash && slash != dir) {
		*slash = '\0';
		ret = roots_mkdirs(dir, 0750);
		if (ret < 0) {
			snprintf(why, whylen, "cannot create %s: %s", dir, strerror(-ret));
			return ret;
		}
	}
	/* A socket file whose daemon answers belongs to a live daemon. A daemon
	 * killed a moment ago may still answer for a few ms (its ring's
	 * multishot accept outlives the process briefly), so it must answer
	 * every time over 100 ms to count as alive. */
	for (int i = 0; i < 5; i++) {
		struct timespec ts = { .tv_nsec = 20000000 };

		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			snprintf(why, whylen, "socket: %s", strerror(errno));
			return -errno;
		}
		ret = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
		close(fd);
		if (ret < 0)
			break;
		if (i == 4) {
			snprintf(why, whylen, "another staged is already listening on %s",
				 cfg->socket);
			return -EADDRINUSE;
		}
		nanosleep(&ts, NULL);
	}
	unlink(cfg->socket);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(why, whylen, "socket: %s", strerror(errno));
		return -errno;
	}
	old = umask(0117);      /* owner and group only, from the first instant */
	ret = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (ret < 0 || listen(fd, 128) < 0) {
		ret = -errno;
		snprintf(why, whylen, "cannot listen on %s: %s", cfg->socket, strerror(errno));
		close(fd);
		return ret;
	}
	chmod(cfg->socket, 0660);
	if (cfg->socket_group[0]) {
		gid_t gid;

		if (config_group_id(cfg->socket_group, &gid) < 0 || chown(cfg->socket, (uid_t)-1, gid) < 0) {
			ret = -errno;
			snprintf(why, whylen, "cannot give %s to group %s (node.socket_group): %s",
				 cfg->socket, cfg->socket_group, strerror(errno ? errno : ENOENT));
			close(fd);
			unlink(cfg->socket);
			return ret ? ret : -ENOENT;
		}
	}
	started_ns = mono_ns();
	*out = fd;
	return 0;
}

void ctl_unlisten(const struct stage_config *cfg, int fd)
{
	close(fd);
	unlink(cfg->socket);
}

static void serve_status(const struct stage_config *cfg, int fd, uid_t viewer)
{
	struct msg m;
	char roots[2048] = "";
	size_t n = 0;

	for (int i = 0; i < cfg->n_source_roots; i++)
		n += (size_t)snprintf(roots + n, n < sizeof(roots) ? sizeof(roots) - n : 0, "%s%s",
				      i ? ", " : "", cfg->source_roots[i]);
	msg_init(&m, MSG_STATUS);
	msg_put_pairf(&m, "node", "%s", cfg->name);
	msg_put_pairf(&m, "daemon", "staged %s, pid %d, up %llu s", STAGE_VERSION, (int)getpid(),
		 (unsigned long long)((mono_ns() - started_ns) / 1000000000ull));
	msg_put_pairf(&m, "socket", "%s", cfg->socket);
	msg_put_pairf(&m, "source_roots", "%s", roots);
	msg_put_pairf(&m, "stage_root", "%s", cfg->stage_root);
	msg_put_pairf(&m, "ckpt_root", "%s", cfg->ckpt_root);
	msg_put_pairf(&m, "replica_root", "%s", cfg->replica_root);
	repl_status(&m, viewer);
	fsprobe_status(&m);
	msg_put_pairf(&m, "jobs", "%u", jobs_count(viewer));
	jobs_status(&m, viewer);
	msg_send(fd, &m);
	msg_free(&m);
	msg_init(&m, MSG_RESULT);
	msg_put_u64(&m, K_CODE, 0);
	msg_put_str(&m, K_TEXT, "");
	msg_send(fd, &m);
	msg_free(&m);
}

static void reply_error(int fd, int code, const char *text)
{
	struct msg m;

	msg_init(&m, MSG_RESULT);
	msg_put_u64(&m, K_CODE, (uint64_t)code);
	msg_put_str(&m, K_TEXT, text);
	msg_send(fd, &m);
	msg_free(&m);
}

/* A request of the control socket: its frame m (K_FLAGS read into flags),
 * answered on fd. One row per type, as the peer side's table. */
struct ctl_req {
	const struct stage_config *cfg;
	int fd;
	struct msg *m;
	uint32_t flags;
	const struct cred *who;          /* the caller, as the kernel has it */
};

static void req_status(const struct ctl_req *r)
{
	serve_status(r->cfg, r->fd, r->who->uid);
}

static void req_metrics(const struct ctl_req *r)
{
	metrics_serve(r->cfg, r->fd);
}

static void req_resume(const struct ctl_req *r)
{
	char *job = NULL, *nodes = NULL, why[1024];
	struct job j;

	if (msg_get_str(r->m, K_JOB, &job) < 0 || msg_get_str(r->m, K_NODES, &nodes) == -EINVAL) {
		reply_error(r->fd, 2, "resume: a request without a job name");
	} else if (roots_job_owner_check(r->cfg, job, "resume", why, sizeof(why)) < 0) {
		reply_error(r->fd, 2, why);
	} else {
		job_begin(&j, r->fd, r->flags, r->cfg, "resume", job);
		resume_run(&j, job, nodes);
		job_end(&j);
	}
	free(job);
	free(nodes);
}

static void req_ls(const struct ctl_req *r)
{
	struct msg m;

	msg_init(&m, MSG_LS);
	repl_ls(&m, r->who->uid);
	msg_send(r->fd, &m);
	msg_free(&m);
	reply_error(r->fd, 0, "");
}

static void req_doctor(const struct ctl_req *r)
{
	char *nodes = NULL, *ports = NULL;
	struct job j;

	if (msg_get_str(r->m, K_NODES, &nodes) == -EINVAL ||
	    msg_get_str(r->m, K_PORTS, &ports) == -EINVAL) {
		reply_error(r->fd, 2, "malformed node or port list");
	} else {
		job_begin(&j, r->fd, r->flags, r->cfg, "doctor", "the cluster");
		doctor_run(&j, nodes, ports);
		job_end(&j);
	}
	free(nodes);
	free(ports);
}

/* A request about a path (pull, commit, verify, restore): its absolute
 * path, and the key beside it (extra_key: a pull's K_DEST, restore --from's
 * K_HOLDER, verify --cluster --nodes' K_NODES), run as a job of kind. */
static void req_path(const struct ctl_req *r, const char *kind, uint16_t extra_key)
{
	char *path = NULL, *extra = NULL, *nodes = NULL, why[1024];
	bool replica = false;
	struct job j;

	if (msg_get_str(r->m, K_PATH, &path) < 0 || path[0] != '/') {
		reply_error(r->fd, 2, "request without an absolute path");
		goto out;
	}
	if (msg_get_str(r->m, extra_key, &extra) == -EINVAL) {
		reply_error(r->fd, 2, "malformed destination or node name");
		goto out;
	}
	if (r->m->type != MSG_PULL_REQ &&
	    roots_owner_check(r->cfg, path, kind, &replica, why, sizeof(why)) < 0) {
		reply_error(r->fd, 2, why);
		goto out;
	}
	job_begin(&j, r->fd, r->flags, r->cfg, kind, path);
	if (r->m->type == MSG_PULL_REQ && (r->flags & REQ_CLUSTER)) {
		if (msg_get_str(r->m, K_NODES, &nodes) == -EINVAL)
			job_result(&j, 2, NULL, NULL, "malformed node list");
		else
			cpull_run(&j, path, extra, nodes);
	} else if (r->m->type == MSG_PULL_REQ) {
		pull_run(&j, path, extra);
	} else if (r->m->type == MSG_COMMIT_REQ) {
		repl_commit_run(&j, path);
	} else if (r->m->type == MSG_RESTORE_REQ) {
		/* A replacement node gets back the replicas it held of the
		 * step too (resume asks for them itself). */
		restore_run(&j, path, extra, resume_holdings);
	} else if (r->flags & REQ_CLUSTER) {
		cverify_run(&j, path, extra);
	} else if (replica) {
		/* The owner's replica (checked above), in directories of the
		 * daemon's: read by the daemon. */
		cred_daemon_begin();
		verify_run(&j, path);
		cred_daemon_end();
	} else {
		verify_run(&j, path);
	}
	job_end(&j);
out:
	free(nodes);
	free(extra);
	free(path);
}

/* One row per request type; a request about a path names its job's kind
 * and the key beside the path (req_path). A row as_caller runs with the
 * caller's credentials (daemon/fs/cred.h): everything it touches on the
 * file system, the kernel judges as for the user's own tools. The others
 * read only the daemon's own state, each filtered for the caller. */
static const struct {
	uint16_t type;
	void (*serve)(const struct ctl_req *r);
	void (*serve_path)(const struct ctl_req *r, const char *kind, uint16_t extra_key);
	const char *kind;
	uint16_t extra_key;
	bool as_caller;
} requests[] = {
	{ .type = MSG_STATUS_REQ, .serve = req_status },
	{ .type = MSG_METRICS_REQ, .serve = req_metrics },
	{ .type = MSG_RESUME_REQ, .serve = req_resume, .as_caller = true },
	{ .type = MSG_LS_REQ, .serve = req_ls },
	{ .type = MSG_COMMIT_REQ, .serve_path = req_path, .kind = "commit", .extra_key = K_DEST,
	  .as_caller = true },
	{ .type = MSG_PULL_REQ, .serve_path = req_path, .kind = "pull", .extra_key = K_DEST,
	  .as_caller = true },
	{ .type = MSG_VERIFY_REQ, .serve_path = req_path, .kind = "verify", .extra_key = K_NODES,
	  .as_caller = true },
	{ .type = MSG_RESTORE_REQ, .serve_path = req_path, .kind = "restore", .extra_key = K_HOLDER,
	  .as_caller = true },
	{ .type = MSG_DOCTOR_REQ, .serve = req_doctor },
};

static void serve_one(const struct ctl_req *r, size_t i)
{
	char why[512];
	int ret;

	if (requests[i].as_caller && (ret = cred_enter(r->who)) < 0) {
		snprintf(why, sizeof(why), "staged cannot act as uid %u: %s (does it lack "
			 "CAP_SETUID and CAP_SETGID?)", (unsigned)r->who->uid, strerror(-ret));
		log_err("control: %s", why);
		reply_error(r->fd, 1, why);
		return;
	}
	if (requests[i].serve_path)
		requests[i].serve_path(r, requests[i].kind, requests[i].extra_key);
	else
		requests[i].serve(r);
	if (requests[i].as_caller)
		cred_leave();
}

static void serve(const struct stage_config *cfg, int fd)
{
	struct timeval tv = { .tv_sec = 10 };
	struct cred *who = NULL;
	uint64_t flags = 0;
	char why[512];
	struct msg m;
	size_t i;
	int ret;

	/* A client that connects and says nothing must not hold a thread, and
	 * one that stops reading must not wedge its job inside a send (it is
	 * then treated as gone, which cancels the job). */
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	tv.tv_sec = 30;
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	ret = msg_recv(fd, &m);
	if (ret < 0) {
		if (ret != -ENOTCONN)
			log_warn("control: bad request: %s", strerror(-ret));
		if (ret == -EBADMSG)
			reply_error(fd, 2, "staged " STAGE_VERSION " could not read the request: are "
				    "stage and staged the same version?");
		return;
	}
	/* Who asks is the kernel's word (recorded at connect), never the
	 * request's. */
	ret = cred_of_peer(fd, &who);
	if (ret < 0) {
		snprintf(why, sizeof(why), "staged cannot tell who is asking: %s", strerror(-ret));
		log_err("control: %s", why);
		reply_error(fd, 1, why);
		goto out;
	}
	if (cred_serves(who, why, sizeof(why)) < 0) {
		reply_error(fd, 2, why);
		goto out;
	}
	msg_get_u64(&m, K_FLAGS, &flags);
	for (i = 0; i < sizeof(requests) / sizeof(requests[0]); i++)
		if (requests[i].type == m.type)
			break;
	if (i < sizeof(requests) / sizeof(requests[0])) {
		const struct ctl_req r = { .cfg = cfg, .fd = fd, .m = &m, .flags = (uint32_t)flags,
					   .who = who };

		serve_one(&r, i);
	} else
		reply_error(fd, 2, "staged " STAGE_VERSION " does not know this request: stage is "
			    "newer than the daemon; restart staged after an upgrade");
out:
	free(who);
	msg_free(&m);
}

static void *conn_main(void *arg)
{
	struct conn *c = arg;

	pthread_setname_np(pthread_self(), "ctl");
	serve(c->cfg, c->fd);
	close(c->fd);
	free(c);
	atomic_fetch_sub(&active, 1);
	return NULL;
}

int ctl_spawn(const struct stage_config *cfg, int fd)
{
	struct conn *c;
	pthread_attr_t attr;
	pthread_t t;
	int ret;

	if (atomic_load(&active) >= MAX_CONNS) {
		reply_error(fd, 1, "staged is busy: " STR(MAX_CONNS) " requests at once; try again in "
			    "a moment");
		close(fd);
		return -EBUSY;
	}
	c = malloc(sizeof(*c));
	if (!c) {
		close(fd);
		return -ENOMEM;
	}
	c->cfg = cfg;
	c->fd = fd;
	atomic_fetch_add(&active, 1);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	ret = pthread_create(&t, &attr, conn_main, c);
	pthread_attr_destroy(&attr);
	if (ret) {
		atomic_fetch_sub(&active, 1);
		close(fd);
		free(c);
		return -ret;
	}
	return 0;
}
