/* A node's facts (dr_local.h): the spec's parser, and each kind's
 * evaluation (file PATH, dir PATH, run PROG ARG...), values made text a
 * JSON string may hold. */
#include "daemon/doctor/dr_local.h"
#include "daemon/doctor/dr_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/why.h"

static bool blank(unsigned char c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* ------------------------------------------------------------ values */

/* Bytes of the valid UTF-8 character at s (n available), 0 when invalid:
 * overlong forms, surrogates and anything past U+10FFFF are invalid too, so
 * a value is always text a JSON string may hold. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
	unsigned cp, min;
	size_t len;

	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		len = 2, cp = s[0] & 0x1f, min = 0x80;
	else if (s[0] >= 0xe0 && s[0] <= 0xef)
		len = 3, cp = s[0] & 0x0f, min = 0x800;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		len = 4, cp = s[0] & 0x07, min = 0x10000;
	else
		return 0;
	if (n < len)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

/* A value being built. It only ever holds whole characters, so cutting it
 * back is cutting at a character boundary; full once something did not fit
 * (the value is longer than DR_FACT_VALUE_MAX and gets "…"). */
struct val {
	char s[DR_FACT_VALUE_MAX + 1];
	size_t len;
	bool full;
};

static void val_put(struct val *v, const void *c, size_t n)
{
	if (v->full || v->len + n > DR_FACT_VALUE_MAX) {
		v->full = true;
		return;
	}
	memcpy(v->s + v->len, c, n);
	v->len += n;
}

/* Appends text with C0/C1 controls and invalid UTF-8 replaced. */
static void val_text(struct val *v, const char *text, size_t n)
{
	const unsigned char *u = (const unsigned char *)text;

	for (size_t i = 0; i < n && !v->full;) {
		size_t cl = utf8_len(u + i, n - i);

		if (cl == 0 || u[i] < 0x20 || u[i] == 0x7f || (cl == 2 && u[i] == 0xc2 && u[i + 1] < 0xa0)) {
			char rep = u[i] == '\t' ? ' ' : '?';

			val_put(v, &rep, 1);
			i += cl ? cl : 1;
		} else {
			val_put(v, u + i, cl);
			i += cl;
		}
	}
}

static void val_end(struct val *v, char *out)
{
	if (v->full) {
		/* Room for "…" (3 bytes), back to the first byte of a character,
		 * and no dangling separator before it. */
		while (v->len > DR_FACT_VALUE_MAX - 3)
			do
				v->len--;
			while (v->len > 0 && ((unsigned char)v->s[v->len] & 0xc0) == 0x80);
		while (v->len > 0 && (blank((unsigned char)v->s[v->len - 1]) ||
				      v->s[v->len - 1] == ';' || v->s[v->len - 1] == ','))
			v->len--;
		memcpy(v->s + v->len, "\xe2\x80\xa6", 3);
		v->len += 3;
	}
	memcpy(out, v->s, v->len);
	out[v->len] = '\0';
}

/* A file's content or a program's output as a value: each line trimmed,
 * the non-empty ones joined by "; ". */
static void normalize(const char *in, size_t n, char *out)
{
	struct val v = { .len = 0 };

	for (size_t i = 0; i < n && !v.full;) {
		size_t e = i, b = i, t;

		while (e < n && in[e] != '\n')
			e++;
		t = e;
		while (b < t && blank((unsigned char)in[b]))
			b++;
		while (t > b && blank((unsigned char)in[t - 1]))
			t--;
		if (b < t) {
			if (v.len > 0)
				val_put(&v, "; ", 2);
			val_text(&v, in + b, t - b);
		}
		i = e + 1;
	}
	val_end(&v, out);
}

/* A value in parentheses saying why there is none. */
__attribute__((format(printf, 2, 3)))
static void paren(char *out, const char *fmt, ...)
{
	char b[DR_FACT_VALUE_MAX * 3];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(b, sizeof(b), fmt, ap);
	va_end(ap);
	normalize(b, strlen(b), out);
}

/* ------------------------------------------------------------ the spec */

enum fact_kind { FACT_FILE, FACT_DIR, FACT_RUN };

struct fact_def {
	const char *name;
	enum fact_kind kind;
	int argc;                      /* words after the ':', the kind first */
	char *argv[DR_FACT_ARGS_MAX + 3];  /* kind, PROG, ARG..., NULL */
};

/* A parsed spec: its words point into text, a copy of the spec. */
struct fact_spec {
	size_t n;
	struct fact_def f[DR_FACTS_MAX];
	char text[];
};

static bool name_ok(const char *s)
{
	size_t n = strlen(s);

	if (n < 1 || n > DR_FACT_NAME_MAX)
		return false;
	for (; *s; s++)
		if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') ||
		      *s == '_' || *s == '.' || *s == '-'))
			return false;
	return true;
}

/* One fact, [b, e) of fs->text, trimmed; q is the same text in the
 * caller's spec, which stays whole for quoting. */
static int parse_one(struct fact_spec *fs, char *b, char *e, const char *q, char *why,
		     size_t whylen)
{
	int ql = (int)(e - b);
	struct fact_def *f;
	const char *kind;
	char *colon, *w, *t;

	if (b == e)
		return why_fail(why, whylen, -EINVAL, "an empty fact (a '|' with nothing before or after it)");
	*e = '\0';
	colon = strchr(b, ':');
	if (!colon)
		return why_fail(why, whylen, -EINVAL, "fact '%.*s': no ':' after its name", ql, q);
	for (t = colon; t > b && blank((unsigned char)t[-1]); t--)
		;
	*t = '\0';
	if (!name_ok(b))
		return why_fail(why, whylen, -EINVAL, "fact '%.*s': bad name '%s' (1 to %d of A-Z a-z 0-9 _ . -)",
			   ql, q, b, DR_FACT_NAME_MAX);
	for (size_t i = 0; i < fs->n; i++)
		if (strcmp(fs->f[i].name, b) == 0)
			return why_fail(why, whylen, -EINVAL, "fact '%.*s': duplicate name '%s'", ql, q, b);
	if (fs->n == DR_FACTS_MAX)
		return why_fail(why, whylen, -EINVAL, "more than %d facts", DR_FACTS_MAX);
	f = &fs->f[fs->n];
	f->name = b;
	f->argc = 0;
	for (w = colon + 1;;) {
		while (blank((unsigned char)*w))
			w++;
		if (!*w)
			break;
		if (f->argc == DR_FACT_ARGS_MAX + 2)
			return why_fail(why, whylen, -EINVAL, "fact '%.*s': more than %d arguments", ql, q,
				   DR_FACT_ARGS_MAX);
		f->argv[f->argc++] = w;
		while (*w && !blank((unsigned char)*w))
			w++;
		if (*w)
			*w++ = '\0';
	}
	f->argv[f->argc] = NULL;
	if (f->argc == 0)
		return why_fail(why, whylen, -EINVAL, "fact '%.*s': no kind (file PATH, dir PATH or run PROG ARG...)",
			   ql, q);
	kind = f->argv[0];
	if (strcmp(kind, "file") == 0)
		f->kind = FACT_FILE;
	else if (strcmp(kind, "dir") == 0)
		f->kind = FACT_DIR;
	else if (strcmp(kind, "run") == 0)
		f->kind = FACT_RUN;
	else
		return why_fail(why, whylen, -EINVAL, "fact '%.*s': unknown kind '%s' (file, dir or run)", ql, q,
			   kind);
	if (f->kind == FACT_RUN && f->argc < 2)
		return why_fail(why, whylen, -EINVAL, "fact '%.*s': run needs a PROG", ql, q);
	if (f->kind != FACT_RUN && f->argc < 2)
		return why_fail(why, whylen, -EINVAL, "fact '%.*s': %s needs a PATH", ql, q, kind);
	if (f->kind != FACT_RUN && f->argc > 2)
		return why_fail(why, whylen, -EINVAL, "fact '%.*s': %s takes one PATH (no blanks in it)", ql, q,
			   kind);
	fs->n++;
	return 0;
}

static int parse(const char *spec, struct fact_spec **out, char *why, size_t whylen)
{
	size_t len = spec ? strlen(spec) : 0;
	struct fact_spec *fs = malloc(sizeof(*fs) + len + 1);
	char *p, *s;

	if (why && whylen)
		why[0] = '\0';
	if (!fs)
		return -ENOMEM;
	fs->n = 0;
	s = fs->text;
	memcpy(s, spec ? spec : "", len + 1);
	for (p = s; blank((unsigned char)*p); p++)
		;
	for (p = *p ? s : NULL; p;) {
		char *bar = strchr(p, '|'), *b = p, *e = bar ? bar : p + strlen(p);
		int rc;

		while (b < e && blank((unsigned char)*b))
			b++;
		while (e > b && blank((unsigned char)e[-1]))
			e--;
		rc = parse_one(fs, b, e, spec + (b - s), why, whylen);
		if (rc < 0) {
			free(fs);
			return rc;
		}
		p = bar ? bar + 1 : NULL;
	}
	*out = fs;
	return 0;
}

int dr_facts_check(const char *spec, char *why, size_t whylen)
{
	struct fact_spec *fs;
	int rc = parse(spec, &fs, why, whylen);

	if (rc == 0)
		free(fs);
	return rc;
}

/* ------------------------------------------------------------ file */

static void eval_file(const char *path, char *out)
{
	char buf[DR_FACT_READ_MAX], self[64];
	size_t len = 0;
	struct stat st;
	int pfd, fd, err = 0;

	/* O_PATH first: opening a device can act (a watchdog arms itself,
	 * a tape rewinds), so only a regular file is ever opened for reading;
	 * /proc and /sys files are regular. Reopened through the O_PATH fd,
	 * so what is read is what was checked. */
	pfd = open(path, O_PATH | O_CLOEXEC);
	if (pfd < 0) {
		paren(out, "(cannot read %s: %s)", path, strerror(errno));
		return;
	}
	if (fstat(pfd, &st) < 0)
		err = errno;
	else if (S_ISDIR(st.st_mode))
		err = EISDIR;
	if (err || !S_ISREG(st.st_mode)) {
		close(pfd);
		if (err)
			paren(out, "(cannot read %s: %s)", path, strerror(err));
		else
			paren(out, "(cannot read %s: not a regular file)", path);
		return;
	}
	snprintf(self, sizeof(self), "/proc/self/fd/%d", pfd);
	fd = open(self, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT)     /* no /proc: the path once more */
		fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (fd < 0)
		err = errno;
	close(pfd);
	while (fd >= 0 && !err && len < sizeof(buf)) {
		ssize_t r = read(fd, buf + len, sizeof(buf) - len);

		if (r > 0)
			len += (size_t)r;
		else if (r == 0 || errno == EAGAIN)
			break;
		else if (errno != EINTR)
			err = errno;
	}
	if (fd >= 0)
		close(fd);
	if (err)
		paren(out, "(cannot read %s: %s)", path, strerror(err));
	else
		normalize(buf, len, out);
}

/* ------------------------------------------------------------ dir */

/* Enough names that, joined by ", ", they are longer than any value: the
 * smallest DIR_KEEP names are all a value can show, so a directory of a
 * million entries costs DIR_KEEP names of memory, and the cut value is
 * the same on every node whatever order readdir gives. */
#define DIR_KEEP ((DR_FACT_VALUE_MAX + 2) / 3 + 1)
#define NAME_W 256                 /* a d_name and its NUL */

void dr_keep_sorted(char *v, size_t w, size_t keep, size_t *n, const char *name)
{
	size_t lo = 0, hi = *n, last;

	if (strlen(name) >= w)
		return;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (strcmp(v + mid * w, name) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo >= keep)
		return;
	last = *n < keep ? *n : keep - 1;
	memmove(v + (lo + 1) * w, v + lo * w, (last - lo) * w);
	strcpy(v + lo * w, name);
	if (*n < keep)
		(*n)++;
}

bool dr_dot_or_dotdot(const char *s)
{
	return s[0] == '.' && (s[1] == '\0' || (s[1] == '.' && s[2] == '\0'));
}

static void eval_dir(const char *path, char *out)
{
	char *names;
	size_t n = 0;
	struct dirent *de;
	struct val v = { .len = 0 };
	DIR *d;
	int err = 0;

	d = opendir(path);
	if (!d) {
		if (errno == ENOENT)
			paren(out, "(none)");
		else
			paren(out, "(cannot read %s: %s)", path, strerror(errno));
		return;
	}
	names = malloc(DIR_KEEP * NAME_W);
	if (!names) {
		closedir(d);
		paren(out, "(cannot read %s: %s)", path, strerror(ENOMEM));
		return;
	}
	for (;;) {
		errno = 0;
		de = readdir(d);
		if (!de) {
			err = errno;
			break;
		}
		if (!dr_dot_or_dotdot(de->d_name))
			dr_keep_sorted(names, NAME_W, DIR_KEEP, &n, de->d_name);
	}
	closedir(d);
	for (size_t i = 0; i < n && !v.full; i++) {
		if (i)
			val_put(&v, ", ", 2);
		val_text(&v, names + i * NAME_W, strlen(names + i * NAME_W));
	}
	free(names);
	if (err)
		paren(out, "(cannot read %s: %s)", path, strerror(err));
	else
		val_end(&v, out);
}

/* ------------------------------------------------------------ run */

/* The daemon opens everything O_CLOEXEC, but not every fd it holds is
 * (a dup() for fdopendir, a library's): where glibc can (2.34), the child
 * closes everything above stderr before it execs. */
static int add_closefrom(posix_spawn_file_actions_t *fa)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
	return posix_spawn_file_actions_addclosefrom_np(fa, 3);
#else
	return 0;
#endif
}

/* posix_spawnp (a vfork-like clone: safe on any thread, nothing of the
 * daemon runs in the child). The daemon blocks the signals its signalfd
 * reads and ignores SIGPIPE; the program gets neither: an empty mask and
 * every signal at its default, so that a closed pipe stops it. Its own
 * process group, so that a timeout kills what it started too. stdout to
 * out_fd (dup2'ed before anything may reuse 0 or 2). 0 or an errno. */
static int spawn(char *const argv[], int out_fd, pid_t *pid)
{
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	sigset_t none, all;
	int rc;

	rc = posix_spawn_file_actions_init(&fa);
	if (rc)
		return rc;
	rc = posix_spawnattr_init(&at);
	if (rc)
		goto out_destroy_fa;
	sigemptyset(&none);
	sigfillset(&all);
	if (!(rc = posix_spawn_file_actions_adddup2(&fa, out_fd, STDOUT_FILENO)) &&
	    !(rc = posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0)) &&
	    !(rc = posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0)) &&
	    !(rc = add_closefrom(&fa)) &&
	    !(rc = posix_spawnattr_setsigmask(&at, &none)) &&
	    !(rc = posix_spawnattr_setsigdefault(&at, &all)) &&
	    !(rc = posix_spawnattr_setpgroup(&at, 0)) &&
	    !(rc = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
						 POSIX_SPAWN_SETPGROUP)))
		rc = posix_spawnp(pid, argv[0], &fa, &at, argv, environ);
	posix_spawnattr_destroy(&at);
out_destroy_fa:
	posix_spawn_file_actions_destroy(&fa);
	return rc;
}

/* Waits for pid until deadline (ms, monotonic): 0 with *status, or
 * -ETIMEDOUT, in short sleeps. */
static int wait_until(pid_t pid, int64_t deadline, int *status)
{
	for (;;) {
		pid_t r = waitpid(pid, status, WNOHANG);
		struct timespec ts = { 0, 5 * 1000 * 1000 };

		if (r == pid)
			return 0;
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			/* Reaped already (SIGCHLD ignored by someone): no status. */
			*status = 0;
			return 0;
		}
		if (deadline - mono_ms() <= 0)
			return -ETIMEDOUT;
		/* Polled, not a pidfd: the program has closed its stdout by now,
		 * so this is its last few ms, and pidfd_open is a syscall some
		 * tools (valgrind 3.19) do not know. */
		nanosleep(&ts, NULL);
	}
}

static void *reap(void *arg)
{
	waitpid((pid_t)(intptr_t)arg, NULL, 0);
	return NULL;
}

static void reap_later(pid_t pid)
{
	pthread_attr_t a;
	pthread_t t;

	if (pthread_attr_init(&a) != 0)
		return;
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&a, 64 << 10);
	pthread_create(&t, &a, reap, (void *)(intptr_t)pid);
	pthread_attr_destroy(&a);
}

static void eval_run(char *const argv[], char *out)
{
	char buf[DR_FACT_READ_MAX];
	size_t len = 0;
	int p[2], rc, status = 0;
	bool timed_out = false;
	int64_t deadline;
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0) {
		paren(out, "(cannot run %s: %s)", argv[0], strerror(errno));
		return;
	}
	rc = spawn(argv, p[1], &pid);
	close(p[1]);
	if (rc) {
		close(p[0]);
		if (rc == ENOENT)
			paren(out, "(not installed)");
		else
			paren(out, "(cannot run %s: %s)", argv[0], strerror(rc));
		return;
	}
	deadline = mono_ms() + DR_FACT_RUN_MS;
	fcntl(p[0], F_SETFL, O_NONBLOCK);
	/* Until EOF, the cap, or the deadline (something the program left
	 * running that holds the pipe open costs the deadline). */
	for (;;) {
		struct pollfd pf = { .fd = p[0], .events = POLLIN };
		ssize_t r = read(p[0], buf + len, sizeof(buf) - len);
		int64_t left;

		if (r > 0) {
			len += (size_t)r;
			if (len == sizeof(buf))
				break;
			continue;
		}
		if (r == 0 || (errno != EAGAIN && errno != EINTR))
			break;
		if (errno == EINTR)
			continue;
		left = deadline - mono_ms();
		if (left <= 0) {
			timed_out = true;
			break;
		}
		poll(&pf, 1, (int)left);
	}
	/* Past the cap, a closed pipe ends a program that writes on. */
	close(p[0]);
	if (!timed_out && wait_until(pid, deadline, &status) < 0)
		timed_out = true;
	if (timed_out) {
		kill(-pid, SIGKILL);
		kill(pid, SIGKILL);        /* if it left its group */
		if (wait_until(pid, mono_ms() + 1000, &status) < 0)
			reap_later(pid);
	}
	if (timed_out) {
		paren(out, "(timed out after %d s)", DR_FACT_RUN_MS / 1000);
		return;
	}
	normalize(buf, len, out);
	if (out[0])
		return;
	/* 127 without a word: the exec failed in the child (where spawn
	 * cannot report it, as under valgrind), the shells' "not found". */
	if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
		paren(out, "(not installed)");
	else if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
		paren(out, "(exit %d)", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		paren(out, "(killed by signal %d)", WTERMSIG(status));
}

int dr_facts_eval(const char *spec, struct dr_fact *out, size_t cap, size_t *n)
{
	struct fact_spec *fs;
	int rc = parse(spec, &fs, NULL, 0);

	*n = 0;
	if (rc < 0)
		return rc;
	if (fs->n > cap) {
		free(fs);
		return -ENOSPC;
	}
	for (size_t i = 0; i < fs->n; i++) {
		const struct fact_def *f = &fs->f[i];

		snprintf(out[i].name, sizeof(out[i].name), "%s", f->name);
		if (f->kind == FACT_FILE)
			eval_file(f->argv[1], out[i].value);
		else if (f->kind == FACT_DIR)
			eval_dir(f->argv[1], out[i].value);
		else
			eval_run(&f->argv[1], out[i].value);
	}
	*n = fs->n;
	free(fs);
	return 0;
}
