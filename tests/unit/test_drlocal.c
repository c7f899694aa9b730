/* daemon/doctor/dr_local.c: the facts spec, each kind of fact and how its
 * value is cut, the clock, the route to the loopback, RDMA ports and who
 * listens on a port. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"
#include "daemon/doctor/dr_local.h"

#define DEFAULT_FACTS "kernel: file /proc/sys/kernel/osrelease" \
	" | gpu: run nvidia-smi --query-gpu=name,driver_version --format=csv,noheader" \
	" | rdma: dir /sys/class/infiniband"

static char err[512];
static char tmp[64];               /* this test's own directory */

static int setup(void **state)
{
	(void)state;
	snprintf(tmp, sizeof(tmp), "/tmp/test_drlocal.XXXXXX");
	return mkdtemp(tmp) ? 0 : -1;
}

static int teardown(void **state)
{
	char cmd[128];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
	return system(cmd) == 0 ? 0 : -1;
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	assert_int_equal(fputs(text, f) >= 0, 1);
	assert_int_equal(fclose(f), 0);
}

/* The value of a spec of one fact. */
static const char *eval1(const char *spec)
{
	static struct dr_fact f[2];
	size_t n = 99;

	memset(f, 0x55, sizeof(f));
	assert_int_equal(dr_facts_eval(spec, f, 2, &n), 0);
	assert_int_equal(n, 1);
	return f[0].value;
}

static bool valid_utf8_text(const char *s)
{
	const unsigned char *u = (const unsigned char *)s;

	while (*u) {
		size_t k = *u < 0x80 ? 1 : *u >= 0xf0 ? 4 : *u >= 0xe0 ? 3 : *u >= 0xc2 ? 2 : 0;

		if (k == 0 || *u < 0x20 || *u == 0x7f)
			return false;
		for (size_t i = 1; i < k; i++)
			if ((u[i] & 0xc0) != 0x80)
				return false;
		u += k;
	}
	return true;
}

static bool ends_with(const char *s, const char *end)
{
	size_t a = strlen(s), b = strlen(end);

	return a >= b && strcmp(s + a - b, end) == 0;
}

/* ------------------------------------------------------------ check */

static void test_check_good(void **state)
{
	struct dr_fact f[DR_FACTS_MAX];
	size_t n = 99;

	(void)state;
	assert_int_equal(dr_facts_check(DEFAULT_FACTS, err, sizeof(err)), 0);
	assert_string_equal(err, "");
	assert_int_equal(dr_facts_check("a.b-c_D9:file /x|b:dir /y|  c :  run  true  ", err,
					sizeof(err)), 0);
	/* No facts at all. */
	assert_int_equal(dr_facts_check("", err, sizeof(err)), 0);
	assert_int_equal(dr_facts_check("  \t", NULL, 0), 0);
	assert_int_equal(dr_facts_check(NULL, err, sizeof(err)), 0);
	assert_int_equal(dr_facts_eval("", f, DR_FACTS_MAX, &n), 0);
	assert_int_equal(n, 0);
	assert_int_equal(dr_facts_eval(DEFAULT_FACTS, f, 2, &n), -ENOSPC);
	assert_int_equal(n, 0);
}

static void assert_refused(const char *spec, const char *want)
{
	struct dr_fact f[DR_FACTS_MAX];
	size_t n = 99;

	err[0] = 'x';
	if (dr_facts_check(spec, err, sizeof(err)) != -EINVAL)
		fail_msg("accepted: %s", spec);
	assert_string_equal(err, want);
	assert_int_equal(dr_facts_eval(spec, f, DR_FACTS_MAX, &n), -EINVAL);
	assert_int_equal(n, 0);
}

static void test_check_bad(void **state)
{
	char spec[4096], name[40];
	size_t len = 0;

	(void)state;
	assert_refused("kernel: file /x | gpu: walk /dev",
		       "fact 'gpu: walk /dev': unknown kind 'walk' (file, dir or run)");
	assert_refused("kernel: file", "fact 'kernel: file': file needs a PATH");
	assert_refused("d: dir  ", "fact 'd: dir': dir needs a PATH");
	assert_refused("x: run", "fact 'x: run': run needs a PROG");
	assert_refused("x: file /a /b", "fact 'x: file /a /b': file takes one PATH (no blanks in it)");
	assert_refused("x:", "fact 'x:': no kind (file PATH, dir PATH or run PROG ARG...)");
	assert_refused("kernel file /x", "fact 'kernel file /x': no ':' after its name");
	assert_refused("ker nel: file /x",
		       "fact 'ker nel: file /x': bad name 'ker nel' (1 to 32 of A-Z a-z 0-9 _ . -)");
	assert_refused(": file /x", "fact ': file /x': bad name '' (1 to 32 of A-Z a-z 0-9 _ . -)");
	assert_refused("a/b: file /x",
		       "fact 'a/b: file /x': bad name 'a/b' (1 to 32 of A-Z a-z 0-9 _ . -)");
	assert_refused("a: file /x | b: dir /y | a: run true",
		       "fact 'a: run true': duplicate name 'a'");
	assert_refused("a: file /x |", "an empty fact (a '|' with nothing before or after it)");
	assert_refused("a: file /x || b: dir /y",
		       "an empty fact (a '|' with nothing before or after it)");
	assert_refused("| a: file /x", "an empty fact (a '|' with nothing before or after it)");

	/* 32 characters is a name, 33 is not. */
	memset(name, 'n', 33);
	name[32] = '\0';
	snprintf(spec, sizeof(spec), "%s: file /x", name);
	assert_int_equal(dr_facts_check(spec, err, sizeof(err)), 0);
	name[32] = 'n';
	name[33] = '\0';
	snprintf(spec, sizeof(spec), "%s: file /x", name);
	assert_int_equal(dr_facts_check(spec, err, sizeof(err)), -EINVAL);

	/* 32 facts are allowed, the 33rd is refused. */
	for (int i = 0; i < DR_FACTS_MAX; i++)
		len += (size_t)snprintf(spec + len, sizeof(spec) - len, "%sf%d: file /x",
					i ? " | " : "", i);
	assert_int_equal(dr_facts_check(spec, err, sizeof(err)), 0);
	snprintf(spec + len, sizeof(spec) - len, " | one-more: dir /y");
	assert_refused(spec, "more than 32 facts");

	/* PROG and 32 arguments, not 33. */
	len = (size_t)snprintf(spec, sizeof(spec), "r: run echo");
	for (int i = 1; i < DR_FACT_ARGS_MAX; i++)
		len += (size_t)snprintf(spec + len, sizeof(spec) - len, " %d", i);
	assert_int_equal(dr_facts_check(spec, err, sizeof(err)), 0);
	snprintf(spec + len, sizeof(spec) - len, " 32");
	assert_int_equal(dr_facts_check(spec, err, sizeof(err)), 0);
	snprintf(spec + len, sizeof(spec) - len, " 32 33");
	assert_int_equal(dr_facts_check(spec, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "more than 32 arguments"));

	/* A why too small is cut, not overrun. */
	assert_int_equal(dr_facts_check("x: walk", err, 8), -EINVAL);
	assert_string_equal(err, "fact 'x");
}

/* ------------------------------------------------------------ file, dir */

static void test_eval_file(void **state)
{
	char path[128], spec[256], want[256];
	struct utsname u;

	(void)state;
	snprintf(path, sizeof(path), "%s/two-lines", tmp);
	write_file(path, "  first line\t \r\n\n\tsecond \x01 line\n");
	snprintf(spec, sizeof(spec), "f: file %s", path);
	assert_string_equal(eval1(spec), "first line; second ? line");

	snprintf(path, sizeof(path), "%s/empty", tmp);
	write_file(path, "\n \n");
	snprintf(spec, sizeof(spec), "f: file %s", path);
	assert_string_equal(eval1(spec), "");

	/* What the default spec reads: the running kernel. */
	assert_int_equal(uname(&u), 0);
	assert_string_equal(eval1("kernel: file /proc/sys/kernel/osrelease"), u.release);

	snprintf(spec, sizeof(spec), "f: file %s/nope", tmp);
	snprintf(want, sizeof(want), "(cannot read %s/nope: No such file or directory)", tmp);
	assert_string_equal(eval1(spec), want);

	snprintf(spec, sizeof(spec), "f: file %s", tmp);
	snprintf(want, sizeof(want), "(cannot read %s: Is a directory)", tmp);
	assert_string_equal(eval1(spec), want);

	/* A fifo with no writer would block a plain open for ever. */
	snprintf(path, sizeof(path), "%s/fifo", tmp);
	assert_int_equal(mkfifo(path, 0600), 0);
	snprintf(spec, sizeof(spec), "f: file %s", path);
	snprintf(want, sizeof(want), "(cannot read %s: not a regular file)", path);
	assert_string_equal(eval1(spec), want);

	if (geteuid() != 0) {
		snprintf(path, sizeof(path), "%s/secret", tmp);
		write_file(path, "x\n");
		assert_int_equal(chmod(path, 0), 0);
		snprintf(spec, sizeof(spec), "f: file %s", path);
		snprintf(want, sizeof(want), "(cannot read %s: Permission denied)", path);
		assert_string_equal(eval1(spec), want);
	}
}

static void test_eval_file_cut(void **state)
{
	char path[128], spec[256], text[8192];
	const char *v;
	size_t len = 0;

	(void)state;
	/* "a" then "é" (2 bytes) many times: byte 252 is inside an "é", so the
	 * cut goes back to 251 bytes, then "…" (3). */
	text[len++] = 'a';
	while (len < 401) {
		memcpy(text + len, "\xc3\xa9", 2);
		len += 2;
	}
	text[len] = '\0';
	snprintf(path, sizeof(path), "%s/utf8", tmp);
	write_file(path, text);
	snprintf(spec, sizeof(spec), "u: file %s", path);
	v = eval1(spec);
	assert_int_equal(strlen(v), 251 + 3);
	assert_memory_equal(v, text, 251);
	assert_true(ends_with(v, "\xe2\x80\xa6"));
	assert_true(valid_utf8_text(v));

	/* Exactly 255 bytes is not cut. */
	memset(text, 'x', DR_FACT_VALUE_MAX);
	text[DR_FACT_VALUE_MAX] = '\n';
	text[DR_FACT_VALUE_MAX + 1] = '\0';
	write_file(path, text);
	v = eval1(spec);
	assert_int_equal(strlen(v), DR_FACT_VALUE_MAX);
	assert_memory_equal(v, text, DR_FACT_VALUE_MAX);

	/* Invalid UTF-8 (a lone continuation byte, an overlong '/', a
	 * surrogate) and C1 controls become '?'. */
	write_file(path, "a\x80" "b\xc0\xaf" "c\xed\xa0\x80" "d\xc2\x85" "e\xc3\xa9");
	assert_string_equal(eval1(spec), "a?b??c???d?e\xc3\xa9");

	/* At most 4 KiB of the file is read: what comes after is not seen. */
	memset(text, '\n', DR_FACT_READ_MAX);
	snprintf(text + DR_FACT_READ_MAX, sizeof(text) - DR_FACT_READ_MAX, "unseen\n");
	write_file(path, text);
	assert_string_equal(eval1(spec), "");
	text[DR_FACT_READ_MAX - 1] = 's';
	write_file(path, text);
	assert_string_equal(eval1(spec), "s");
}

static void test_eval_dir(void **state)
{
	char path[256], spec[300], want[300];

	(void)state;
	snprintf(path, sizeof(path), "%s/d", tmp);
	assert_int_equal(mkdir(path, 0755), 0);
	snprintf(spec, sizeof(spec), "d: dir %s", path);
	assert_string_equal(eval1(spec), "");
	for (const char *const *n = (const char *const[]){ "mlx5_1", "b", "Z", "mlx5_0", ".hidden",
							   "a b", NULL }; *n; n++) {
		snprintf(path, sizeof(path), "%s/d/%s", tmp, *n);
		write_file(path, "");
	}
	assert_string_equal(eval1(spec), ".hidden, Z, a b, b, mlx5_0, mlx5_1");

	snprintf(spec, sizeof(spec), "d: dir %s/none", tmp);
	assert_string_equal(eval1(spec), "(none)");
	snprintf(spec, sizeof(spec), "d: dir %s/d/b", tmp);
	snprintf(want, sizeof(want), "(cannot read %s/d/b: Not a directory)", tmp);
	assert_string_equal(eval1(spec), want);
}

/* More entries than any value can show: the smallest names, in order, cut,
 * whatever order they were made in. */
static void test_eval_dir_many(void **state)
{
	char path[256], spec[256], want[1024];
	size_t len = 0;
	const char *v;

	(void)state;
	snprintf(path, sizeof(path), "%s/many", tmp);
	assert_int_equal(mkdir(path, 0755), 0);
	for (int i = 999; i >= 0; i--) {
		snprintf(path, sizeof(path), "%s/many/%03d", tmp, i);
		write_file(path, "");
	}
	for (int i = 0; len < 252; i++)
		len += (size_t)snprintf(want + len, sizeof(want) - len, "%s%03d", i ? ", " : "", i);
	/* "000, 001, ...": the value is the first 252 bytes ("... 049, 05")
	 * and "…". */
	snprintf(spec, sizeof(spec), "d: dir %s/many", tmp);
	v = eval1(spec);
	assert_true(strlen(v) <= DR_FACT_VALUE_MAX);
	assert_true(ends_with(v, "\xe2\x80\xa6"));
	assert_memory_equal(v, want, strlen(v) - 3);
	assert_true(strncmp(v, "000, 001, 002", 13) == 0);
}

/* ------------------------------------------------------------ run */

static void test_eval_run(void **state)
{
	char spec[512];
	const char *v;
	int64_t t0;

	(void)state;
	assert_string_equal(eval1("e: run echo hello   world"), "hello world");
	/* printf reads its own escapes: lines, a blank line, a control
	 * character, trailing blanks. */
	assert_string_equal(eval1("p: run printf one\\n\\n\\ttwo\\001three\\x20\\n"),
			    "one; two?three");
	assert_string_equal(eval1("m: run no-such-program-drlocal --version"), "(not installed)");
	assert_string_equal(eval1("m: run /nonexistent/prog"), "(not installed)");
	assert_string_equal(eval1("f: run false"), "(exit 1)");
	assert_string_equal(eval1("t: run true"), "");
	/* Output, then a failure: the output is the value. */
	assert_string_equal(eval1("l: run ls -d /nonexistent-drlocal /"), "/");

	/* Far more than 4 KiB: read no further, the program ends on the
	 * closed pipe, the value is cut. */
	t0 = mono_ms();
	v = eval1("s: run seq 1 10000000");
	assert_true(mono_ms() - t0 < 1500);
	assert_true(strncmp(v, "1; 2; 3; 4; 5", 13) == 0);
	assert_true(ends_with(v, "\xe2\x80\xa6"));
	assert_true(strlen(v) <= DR_FACT_VALUE_MAX);

	/* A value over 255 bytes of 3-byte characters, cut at a boundary. */
	snprintf(spec, sizeof(spec), "u: run printf x");
	for (int i = 0; i < 100; i++)
		strcat(spec, "\xe2\x82\xac");          /* € */
	v = eval1(spec);
	/* 1 + 3k <= 252: 250 bytes, then "…". */
	assert_int_equal(strlen(v), 250 + 3);
	assert_true(valid_utf8_text(v));
	assert_true(ends_with(v, "\xe2\x82\xac\xe2\x80\xa6"));
}

static void test_eval_run_exit_code(void **state)
{
	(void)state;
	/* No shell of ours: a script is one word, its blanks ${IFS}. */
	assert_string_equal(eval1("x: run test 1 = 2"), "(exit 1)");
	assert_string_equal(eval1("x: run sh -c kill${IFS}-9${IFS}$$"), "(killed by signal 9)");
	assert_string_equal(eval1("x: run sh -c exit${IFS}7"), "(exit 7)");
}

static void test_eval_run_timeout(void **state)
{
	char spec[128], pgrep[128];
	int64_t t0 = mono_ms(), dt;

	(void)state;
	assert_string_equal(eval1("s: run sleep 5"), "(timed out after 2 s)");
	dt = mono_ms() - t0;
	assert_true(dt >= 1900 && dt < 3500);

	/* What it started dies with it: sh waits on a sleep that holds the
	 * pipe; both are killed, and the sleep is not left behind. Its
	 * argument names this process, for a test run beside this one. */
	snprintf(spec, sizeof(spec), "s: run sh -c sleep${IFS}7.%d;echo${IFS}late", (int)getpid());
	snprintf(pgrep, sizeof(pgrep), "p: run pgrep -f -x sleep.7\\.%d", (int)getpid());
	t0 = mono_ms();
	assert_string_equal(eval1(spec), "(timed out after 2 s)");
	dt = mono_ms() - t0;
	assert_true(dt >= 1900 && dt < 3500);
	for (int i = 0; i < 50 && strcmp(eval1(pgrep), "(exit 1)"); i++)
		usleep(10000);
	assert_string_equal(eval1(pgrep), "(exit 1)");
}

/* The program gets no fd of ours, an empty signal mask and default
 * dispositions, though the daemon blocks and ignores some. */
static void test_eval_run_clean_child(void **state)
{
	sigset_t mask, old;
	int fd = open("/dev/null", O_RDONLY);          /* no O_CLOEXEC, on purpose */
	char spec[128];
	const char *v;

	(void)state;
	assert_true(fd >= 3);
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	assert_int_equal(pthread_sigmask(SIG_BLOCK, &mask, &old), 0);
	signal(SIGPIPE, SIG_IGN);

	assert_string_equal(eval1("s: run grep ^SigBlk: /proc/self/status"),
			    "SigBlk: 0000000000000000");
	/* glibc's posix_spawn leaves its own two internal signals (32, 33)
	 * ignored, which nothing outside glibc sends: the classic ones. */
	v = eval1("s: run grep ^SigIgn: /proc/self/status");
	assert_true(strncmp(v, "SigIgn: ", 8) == 0);
	assert_int_equal(strtoull(v + 8, NULL, 16) & 0x7fffffffull, 0);
	/* Closed in the child where glibc can (dr_local.c: add_closefrom). */
	snprintf(spec, sizeof(spec), "l: run test -e /proc/self/fd/%d", fd);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
	assert_string_equal(eval1(spec), "(exit 1)");
#endif
	assert_string_equal(eval1("i: run cat"), "");  /* stdin is /dev/null */

	signal(SIGPIPE, SIG_DFL);
	assert_int_equal(pthread_sigmask(SIG_SETMASK, &old, NULL), 0);
	close(fd);
}

/* Several facts in order, from several threads at once. */
static void *eval_thread(void *arg)
{
	struct dr_fact f[3];
	size_t n = 0;

	(void)arg;
	for (int i = 0; i < 10; i++) {
		if (dr_facts_eval("a: run echo one | b: file /proc/sys/kernel/ostype | c: run printf two",
				  f, 3, &n) != 0 || n != 3 || strcmp(f[0].value, "one") ||
		    strcmp(f[1].value, "Linux") || strcmp(f[2].value, "two") ||
		    strcmp(f[0].name, "a") || strcmp(f[2].name, "c"))
			return (void *)1;
	}
	return NULL;
}

static void test_eval_threads(void **state)
{
	pthread_t t[4];
	void *r;

	(void)state;
	for (int i = 0; i < 4; i++)
		assert_int_equal(pthread_create(&t[i], NULL, eval_thread, NULL), 0);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(pthread_join(t[i], &r), 0);
		assert_null(r);
	}
}

/* ------------------------------------------------------------ clock, route, rdma */

static void test_clock(void **state)
{
	struct dr_clock c = { .state = -99 };

	(void)state;
	assert_int_equal(dr_clock_state(&c), 0);
	assert_true(c.state >= 0);
	assert_true(c.maxerror_us >= 0);
}

static void test_route(void **state)
{
	struct dr_route r;

	(void)state;
	assert_int_equal(dr_route("127.0.0.1", 7420, &r, err, sizeof(err)), 0);
	assert_string_equal(r.ifname, "lo");
	assert_string_equal(r.local, "127.0.0.1");
	assert_true(r.mtu > 0);
	assert_int_equal(r.speed_mbps, -1);
	assert_int_equal(dr_route("localhost", 7420, &r, err, sizeof(err)), 0);
	assert_string_equal(r.ifname, "lo");
	assert_int_equal(dr_route("[127.0.0.1]", 1, &r, err, sizeof(err)), 0);
	assert_string_equal(r.ifname, "lo");

	assert_int_equal(dr_route("", 7420, &r, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "cannot resolve '': not a host name");
}

static void test_rdma(void **state)
{
	struct dr_rdma_port p[8];
	size_t n = 99;

	(void)state;
	assert_int_equal(dr_rdma_ports(p, 8, &n), 0);
	assert_true(n <= 8);
	for (size_t i = 0; i < n; i++) {
		assert_true(p[i].dev[0] != '\0');
		assert_true(p[i].port >= 0);
		if (i)
			assert_true(strcmp(p[i - 1].dev, p[i].dev) < 0 ||
				    (strcmp(p[i - 1].dev, p[i].dev) == 0 && p[i - 1].port < p[i].port));
	}
	assert_int_equal(dr_rdma_ports(p, 0, &n), 0);
	assert_int_equal(n, 0);
}

/* ------------------------------------------------------------ port owner */

static int listener(uint16_t *port, bool listen_too)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	if (listen_too)
		assert_int_equal(listen(fd, 1), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &al), 0);
	*port = ntohs(a.sin_port);
	return fd;
}

static void test_port_owner(void **state)
{
	char who[128], comm[64], want[128];
	uint16_t port, closed;
	FILE *f;
	int fd;

	(void)state;
	f = fopen("/proc/self/comm", "r");
	assert_non_null(f);
	assert_non_null(fgets(comm, sizeof(comm), f));
	fclose(f);
	comm[strcspn(comm, "\n")] = '\0';

	fd = listener(&port, true);
	assert_int_equal(dr_port_owner(port, who, sizeof(who)), 0);
	snprintf(want, sizeof(want), "%s (pid %d)", comm, (int)getpid());
	assert_string_equal(who, want);
	/* A who too small is cut, not overrun. */
	assert_int_equal(dr_port_owner(port, who, 5), 0);
	assert_int_equal(strlen(who), 4);
	close(fd);

	/* Bound but not listening is not a listener; closed is nothing. */
	fd = listener(&closed, false);
	assert_int_equal(dr_port_owner(closed, who, sizeof(who)), -ENOENT);
	assert_string_equal(who, "");
	close(fd);
	assert_int_equal(dr_port_owner(closed, who, sizeof(who)), -ENOENT);
	assert_int_equal(dr_port_owner(0, who, sizeof(who)), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_check_good),
		cmocka_unit_test(test_check_bad),
		cmocka_unit_test(test_eval_file),
		cmocka_unit_test(test_eval_file_cut),
		cmocka_unit_test(test_eval_dir),
		cmocka_unit_test(test_eval_dir_many),
		cmocka_unit_test(test_eval_run),
		cmocka_unit_test(test_eval_run_exit_code),
		cmocka_unit_test(test_eval_run_timeout),
		cmocka_unit_test(test_eval_run_clean_child),
		cmocka_unit_test(test_eval_threads),
		cmocka_unit_test(test_clock),
		cmocka_unit_test(test_route),
		cmocka_unit_test(test_rdma),
		cmocka_unit_test(test_port_owner),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
