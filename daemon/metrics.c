#include "daemon/metrics.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/proto.h"
#include "common/version.h"
#include "daemon/job/job.h"
#include "daemon/obs/obs.h"
#include "daemon/repl/repl.h"

#define SLICE (256u << 10)      /* text bytes per MSG_METRICS frame */

static struct {
	const struct stage_config *cfg;   /* borrowed */
	uint64_t start_wall_ns;
	bool running, stopping;
	pthread_t thread;
	pthread_mutex_t lock;             /* stopping */
	pthread_cond_t cond;              /* monotonic clock: signalled at stop */
	char last_err[8448];              /* the writer's last failure, "" if none */
} mx = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* Entries of a /proc directory, for fds and threads: 0 if it cannot be read. */
static uint64_t count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	uint64_t n = 0;
	struct dirent *e;

	if (!d)
		return 0;
	while ((e = readdir(d)) != NULL)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

static uint64_t resident_bytes(void)
{
	unsigned long long size, rss;
	FILE *f = fopen("/proc/self/statm", "re");
	int n;

	if (!f)
		return 0;
	n = fscanf(f, "%llu %llu", &size, &rss);
	fclose(f);
	return n == 2 ? rss * (uint64_t)sysconf(_SC_PAGESIZE) : 0;
}

static void render_process(struct prom *p)
{
	struct rusage ru;
	double cpu = 0;

	if (getrusage(RUSAGE_SELF, &ru) == 0)
		cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
		      ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) / 1e6;
	/* stage_ names, not process_: node_exporter exports process_* of its
	 * own, and a textfile series of the same name is refused. */
	prom_family(p, "stage_cpu_seconds_total", "counter", "CPU time staged has used (user and system).");
	prom_f64(p, NULL, cpu);
	prom_family(p, "stage_resident_memory_bytes", "gauge", "staged's resident memory.");
	prom_u64(p, NULL, resident_bytes());
	prom_family(p, "stage_open_fds", "gauge", "File descriptors staged holds open.");
	prom_u64(p, NULL, count_entries("/proc/self/fd") - 1);  /* less the one reading it */
	prom_family(p, "stage_threads", "gauge", "staged's threads.");
	prom_u64(p, NULL, count_entries("/proc/self/task"));
}

void metrics_render(const struct stage_config *cfg, struct prom *p)
{
	prom_family(p, "stage_info", "gauge", "This daemon: its node name and version (always 1).");
	prom_u64(p, (const char *[]){ "node", cfg->name, "version", STAGE_VERSION, NULL }, 1);
	prom_family(p, "stage_start_time_seconds", "gauge", "When staged started, in Unix time.");
	prom_f64(p, NULL, (double)(mx.start_wall_ns / 1000000) / 1e3);
	prom_family(p, "stage_jobs_running", "gauge",
		    "Jobs being served: client requests, and the checks peers asked of this node.");
	prom_u64(p, NULL, jobs_count(0));
	obs_render(p);
	repl_metrics(p);
	render_process(p);
}

static int send_result(int fd, int code, const char *text)
{
	struct msg m;
	int rc;

	msg_init(&m, MSG_RESULT);
	msg_put_u64(&m, K_CODE, (uint64_t)code);
	msg_put_str(&m, K_TEXT, text);
	rc = msg_send(fd, &m);
	msg_free(&m);
	return rc;
}

void metrics_serve(const struct stage_config *cfg, int fd)
{
	struct prom p;
	char why[256];
	int rc = 0;

	prom_init(&p);
	metrics_render(cfg, &p);
	if (prom_error(&p)) {
		snprintf(why, sizeof(why), "cannot render the metrics: %s", strerror(-prom_error(&p)));
		log_err("%s", why);
		send_result(fd, 1, why);
		prom_free(&p);
		return;
	}
	for (size_t off = 0; rc == 0 && off < p.len; off += SLICE) {
		struct msg m;
		size_t n = p.len - off < SLICE ? p.len - off : SLICE;

		msg_init(&m, MSG_METRICS);
		msg_put_bytes(&m, K_DATA, p.buf + off, n);
		rc = msg_send(fd, &m);
		msg_free(&m);
	}
	if (rc == 0)
		send_result(fd, 0, "");
	prom_free(&p);
}

/* The text to path, whole or not at all: a temporary in the same
 * directory, renamed over. Not fsync'd: figures a power cut loses are
 * replaced within one interval, and the disk should not pay for them. */
static int write_textfile(const char *path, const struct prom *p, char *why, size_t whylen)
{
	char tmp[4200];
	const char *slash = strrchr(path, '/');
	size_t off = 0;
	int fd, rc = 0;

	/* A name node_exporter skips (it reads *.prom only) and no other
	 * daemon on the host shares. */
	snprintf(tmp, sizeof(tmp), "%.*s.%s.%d.tmp", (int)(slash - path + 1), path, slash + 1,
		 (int)getpid());
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0) {
		snprintf(why, whylen, "cannot create %s: %s", tmp, strerror(errno));
		return -errno;
	}
	while (off < p->len) {
		ssize_t w = write(fd, p->buf + off, p->len - off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			rc = w < 0 ? -errno : -EIO;
			snprintf(why, whylen, "writing %s: %s", tmp, strerror(-rc));
			break;
		}
		off += (size_t)w;
	}
	if (close(fd) < 0 && rc == 0) {
		rc = -errno;
		snprintf(why, whylen, "writing %s: %s", tmp, strerror(-rc));
	}
	if (rc == 0 && rename(tmp, path) < 0) {
		rc = -errno;
		snprintf(why, whylen, "renaming %s to %s: %s", tmp, path, strerror(-rc));
	}
	if (rc < 0)
		unlink(tmp);
	return rc;
}

static void write_once(void)
{
	struct prom p;
	char why[sizeof(mx.last_err)] = "";
	int rc;

	prom_init(&p);
	metrics_render(mx.cfg, &p);
	rc = prom_error(&p);
	if (rc < 0)
		snprintf(why, sizeof(why), "cannot render the metrics: %s", strerror(-rc));
	else
		write_textfile(mx.cfg->metrics_textfile, &p, why, sizeof(why));
	prom_free(&p);
	/* Said once when it starts failing and once when it recovers, not
	 * every interval. */
	if (strcmp(why, mx.last_err) != 0) {
		if (why[0])
			log_warn("metrics: %s", why);
		else
			log_info("metrics: writing %s again", mx.cfg->metrics_textfile);
		snprintf(mx.last_err, sizeof(mx.last_err), "%s", why);
	}
}

static void *writer_main(void *arg)
{
	uint64_t period = (uint64_t)mx.cfg->metrics_interval * 1000000000ull;

	pthread_setname_np(pthread_self(), "metrics");

	pthread_mutex_lock(&mx.lock);
	while (!mx.stopping) {
		uint64_t next = mono_ns() + period;
		struct timespec ts = mono_timespec(next);

		pthread_mutex_unlock(&mx.lock);
		write_once();
		pthread_mutex_lock(&mx.lock);
		while (!mx.stopping && pthread_cond_timedwait(&mx.cond, &mx.lock, &ts) != ETIMEDOUT)
			;
	}
	pthread_mutex_unlock(&mx.lock);
	return NULL;
}

int metrics_start(const struct stage_config *cfg, char *why, size_t whylen)
{
	int rc;

	mx.cfg = cfg;
	mx.start_wall_ns = wall_ns();
	if (!cfg->metrics_textfile[0])
		return 0;
	mono_cond_init(&mx.cond);
	mx.stopping = false;
	rc = pthread_create(&mx.thread, NULL, writer_main, NULL);
	if (rc) {
		snprintf(why, whylen, "cannot start the metrics writer: %s", strerror(rc));
		pthread_cond_destroy(&mx.cond);
		return -rc;
	}
	mx.running = true;
	log_info("metrics: writing %s every %d s", cfg->metrics_textfile, cfg->metrics_interval);
	return 0;
}

void metrics_stop(void)
{
	if (!mx.running)
		return;
	pthread_mutex_lock(&mx.lock);
	mx.stopping = true;
	pthread_cond_signal(&mx.cond);
	pthread_mutex_unlock(&mx.lock);
	pthread_join(mx.thread, NULL);
	pthread_cond_destroy(&mx.cond);
	mx.running = false;
	unlink(mx.cfg->metrics_textfile);
}
