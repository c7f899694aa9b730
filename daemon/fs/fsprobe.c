/* Probes of file systems that may not answer (fsprobe.h).
 *
 * Invariants, under `lock`:
 * - A slot is out from the probe's start to its answer; its mount and its
 *   since_ns do not change while out, so the probe thread's pointer to it
 *   stays good, and only an idle slot is given to another mount.
 * - answers counts the probes answered in the slot: a waiter that saw n
 *   has its answer once it is past n, whichever probe gave it.
 */
#include "daemon/fs/fsprobe.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/paths.h"

struct slot {
	char mnt[PATH_MAX];            /* "": never used */
	bool out;
	uint64_t since_ns;             /* the probe out now was sent (CLOCK_MONOTONIC) */
	uint64_t answers;
};

struct probe {
	struct slot *s;
	char path[];
};

static struct slot slots[FSPROBE_SLOTS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t answered;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init_cond(void)
{
	mono_cond_init(&answered);
}

/* Field f (0-based, space-separated) of line, unescaped (mountinfo writes
 * space, tab, newline and backslash as \ooo). 0 or -EINVAL. */
static int field(const char *line, const char *end, int f, char *out, size_t len)
{
	const char *p = line;
	size_t o = 0;

	for (int i = 0; i < f; i++) {
		while (p < end && *p != ' ')
			p++;
		if (p == end)
			return -EINVAL;
		p++;
	}
	for (; p < end && *p != ' '; p++) {
		char c = *p;

		if (c == '\\' && end - p >= 4 && p[1] >= '0' && p[1] <= '3') {
			c = (char)(((p[1] - '0') << 6) | ((p[2] - '0') << 3) | (p[3] - '0'));
			p += 3;
		}
		if (o + 1 >= len)
			return -EINVAL;
		out[o++] = c;
	}
	out[o] = '\0';
	return o ? 0 : -EINVAL;
}

int fsprobe_mount_of(const char *mountinfo, const char *path, char *out, size_t outlen)
{
	char norm[PATH_MAX], mp[PATH_MAX];
	size_t best = 0;

	if (outlen < 2)
		return -ENAMETOOLONG;
	snprintf(out, outlen, "/");
	/* By the text alone, ".." cannot be taken (a symlink may be on the
	 * way): such a path shares the probe of "/". */
	if (snprintf(norm, sizeof(norm), "%s", path) >= (int)sizeof(norm))
		return -ENAMETOOLONG;
	if (paths_normalize(norm, false) < 0)
		return 0;
	for (const char *l = mountinfo; *l;) {
		const char *end = strchr(l, '\n');
		size_t n;

		if (!end)
			end = l + strlen(l);
		/* Field 4 is the mount point. Of two mounted at one place, the
		 * later line is the one on top. */
		if (field(l, end, 4, mp, sizeof(mp)) == 0 && (n = strlen(mp)) >= best &&
		    paths_under(norm, mp)) {
			if (n >= outlen)
				return -ENAMETOOLONG;
			best = n;
			memcpy(out, mp, n + 1);
		}
		l = *end ? end + 1 : end;
	}
	return 0;
}

/* /proc/self/mountinfo, whole, NUL-terminated (malloc'd), or NULL. */
static char *read_mountinfo(void)
{
	int fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
	size_t cap = 16384, len = 0;
	char *buf = NULL;

	if (fd < 0)
		return NULL;
	for (;;) {
		ssize_t n;

		if (len + 1 >= cap || !buf) {
			char *b = realloc(buf, cap *= 2);

			if (!b) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = b;
		}
		n = read(fd, buf + len, cap - len - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			buf[len] = '\0';
			break;
		}
		len += (size_t)n;
	}
	close(fd);
	return buf;
}

static void *probe_main(void *arg)
{
	struct probe *p = arg;
	struct statfs sf;

	(void)statfs(p->path, &sf);     /* any answer is one */
	pthread_mutex_lock(&lock);
	p->s->out = false;
	p->s->answers++;
	pthread_cond_broadcast(&answered);
	pthread_mutex_unlock(&lock);
	free(p);
	return NULL;
}

/* Under lock: mnt's slot, or an idle one given to it; NULL if every slot
 * is out for another mount. */
static struct slot *slot_for(const char *mnt)
{
	struct slot *idle = NULL;

	for (size_t i = 0; i < FSPROBE_SLOTS; i++) {
		if (strcmp(slots[i].mnt, mnt) == 0)
			return &slots[i];
		if (!slots[i].out && (!idle || !*slots[i].mnt))
			idle = &slots[i];
	}
	if (idle)
		snprintf(idle->mnt, sizeof(idle->mnt), "%s", mnt);
	return idle;
}

/* Under lock: sends s's probe of path. 0 or -errno. */
static int send_probe(struct slot *s, const char *path)
{
	size_t n = strlen(path) + 1;
	struct probe *p = malloc(sizeof(*p) + n);
	pthread_attr_t a;
	pthread_t t;
	int rc;

	if (!p)
		return -ENOMEM;
	p->s = s;
	memcpy(p->path, path, n);
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&a, 256 * 1024);
	rc = -pthread_create(&t, &a, probe_main, p);
	pthread_attr_destroy(&a);
	if (rc < 0) {
		free(p);
		return rc;
	}
	s->out = true;
	s->since_ns = mono_ns();
	return 0;
}

int fsprobe_answers(const char *path, unsigned wait_ms, bool (*gone)(void *), void *arg,
		    char *why, size_t whylen)
{
	char mnt[PATH_MAX] = "/";
	char *info;
	struct slot *s;
	uint64_t seen, deadline;
	int rc = 0;

	pthread_once(&once, init_cond);
	if (path[0] != '/')
		return 0;               /* not one to resolve: the caller refuses it */
	info = read_mountinfo();
	if (info && fsprobe_mount_of(info, path, mnt, sizeof(mnt)) < 0)
		snprintf(mnt, sizeof(mnt), "/");
	free(info);

	pthread_mutex_lock(&lock);
	s = slot_for(mnt);
	if (!s) {
		pthread_mutex_unlock(&lock);
		snprintf(why, whylen, "%u file systems are not answering, %s not asked", FSPROBE_SLOTS,
			 mnt);
		return -EBUSY;
	}
	if (!s->out && (rc = send_probe(s, path)) < 0) {
		pthread_mutex_unlock(&lock);
		snprintf(why, whylen, "cannot ask the file system at %s: %s", mnt, strerror(-rc));
		return rc;
	}
	seen = s->answers;
	deadline = s->since_ns + (uint64_t)wait_ms * 1000000ull;
	while (s->answers == seen) {
		uint64_t now = mono_ns(), until = now + 100000000ull;
		struct timespec ts;

		if (now >= deadline) {
			snprintf(why, whylen, "the file system at %s has not answered for %llu s", mnt,
				 (unsigned long long)((now - s->since_ns) / 1000000000ull));
			rc = -ETIMEDOUT;
			break;
		}
		if (until > deadline)
			until = deadline;
		ts = mono_timespec(until);
		pthread_cond_timedwait(&answered, &lock, &ts);
		if (gone && s->answers == seen) {
			bool left;

			pthread_mutex_unlock(&lock);
			left = gone(arg);
			pthread_mutex_lock(&lock);
			if (left) {
				snprintf(why, whylen, "cancelled while waiting for the file system at %s",
					 mnt);
				rc = -ECANCELED;
				break;
			}
		}
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

void fsprobe_status(struct msg *m)
{
	uint64_t now;

	pthread_mutex_lock(&lock);
	now = mono_ns();        /* under the lock: no probe sent after it */
	for (size_t i = 0; i < FSPROBE_SLOTS; i++)
		if (slots[i].out && now - slots[i].since_ns > 1000000000ull)
			msg_put_pairf(m, "not answering", "%s: a probe of it waits for %llu s",
				      slots[i].mnt,
				      (unsigned long long)((now - slots[i].since_ns) / 1000000000ull));
	pthread_mutex_unlock(&lock);
}
