/* common/config.c: defaults, every value type, the INI rules, the error
 * messages, and print -> parse round trips. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/config.h"
#include "common/log.h"

static char err[1024];

/* Parses `[section]\nline\n` over defaults. */
static int parse1(struct stage_config *c, const char *section, const char *line)
{
	char text[4096];
	int n = snprintf(text, sizeof(text), "[%s]\n%s\n", section, line);

	return config_parse(c, text, (size_t)n, "t.conf", err, sizeof(err));
}

static int parse_text(struct stage_config *c, const char *text)
{
	return config_parse(c, text, strlen(text), "t.conf", err, sizeof(err));
}

static void assert_config_equal(const struct stage_config *a, const struct stage_config *b)
{
	assert_string_equal(a->name, b->name);
	assert_string_equal(a->socket, b->socket);
	assert_string_equal(a->listen, b->listen);
	assert_string_equal(a->state_dir, b->state_dir);
	assert_int_equal(a->log_level, b->log_level);
	assert_int_equal(a->n_source_roots, b->n_source_roots);
	for (int i = 0; i < a->n_source_roots; i++)
		assert_string_equal(a->source_roots[i], b->source_roots[i]);
	assert_string_equal(a->stage_root, b->stage_root);
	assert_string_equal(a->ckpt_root, b->ckpt_root);
	assert_string_equal(a->replica_root, b->replica_root);
	assert_string_equal(a->hosts, b->hosts);
	assert_string_equal(a->key_file, b->key_file);
	assert_int_equal(a->replicas, b->replicas);
	assert_int_equal(a->keep, b->keep);
	assert_int_equal(a->transport, b->transport);
	assert_int_equal(a->compress, b->compress);
	assert_int_equal(a->watch, b->watch);
	assert_int_equal(a->memory, b->memory);
	assert_int_equal(a->files_in_flight, b->files_in_flight);
	assert_int_equal(a->io_size, b->io_size);
	assert_int_equal(a->chunk_size, b->chunk_size);
}

static char *print_to_string(const struct stage_config *c, size_t *len)
{
	char *buf = NULL;
	FILE *f = open_memstream(&buf, len);

	assert_non_null(f);
	config_print(c, f);
	assert_int_equal(fclose(f), 0);
	return buf;
}

/* print c, parse that over fresh defaults, expect equal; returns the text. */
static void assert_round_trip(const struct stage_config *c)
{
	struct stage_config d;
	size_t len, len2;
	char *text = print_to_string(c, &len), *text2;

	assert_int_equal(config_defaults(&d), 0);
	if (config_parse(&d, text, len, "print", err, sizeof(err)) != 0)
		fail_msg("printed config does not parse: %s\n%s", err, text);
	assert_config_equal(c, &d);
	text2 = print_to_string(&d, &len2);
	assert_string_equal(text, text2);
	free(text);
	free(text2);
	config_free(&d);
}

static void test_defaults(void **state)
{
	struct stage_config c;
	char host[256] = "";
	const char *why;

	(void)state;
	assert_int_equal(config_defaults(&c), 0);
	gethostname(host, sizeof(host) - 1);
	assert_string_equal(c.name, config_check_name(host, &why) == 0 ? host : "localhost");
	if (geteuid() == 0)
		assert_string_equal(c.socket, "/run/stage/staged.sock");
	assert_string_equal(c.listen, "0.0.0.0:7420");
	assert_string_equal(c.state_dir, "/var/lib/stage/state");
	assert_int_equal(c.log_level, LOG_INFO);
	assert_int_equal(c.n_source_roots, 1);
	assert_string_equal(c.source_roots[0], "/");
	assert_string_equal(c.stage_root, "/var/lib/stage/data");
	assert_string_equal(c.ckpt_root, "/var/lib/stage/ckpt");
	assert_string_equal(c.replica_root, "/var/lib/stage/replicas");
	assert_string_equal(c.hosts, "/etc/stage/hosts");
	assert_string_equal(c.key_file, "/etc/stage/cluster.key");
	assert_int_equal(c.replicas, 1);
	assert_int_equal(c.keep, 3);
	assert_int_equal(c.transport, CFG_TRANSPORT_AUTO);
	assert_int_equal(c.compress, CFG_COMPRESS_AUTO);
	assert_true(c.watch);
	assert_int_equal(c.memory, 64u << 20);
	assert_int_equal(c.files_in_flight, 64);
	assert_int_equal(c.io_size, 4u << 20);
	assert_int_equal(c.chunk_size, 4u << 20);
	config_free(&c);
	config_free(&c);        /* idempotent */
}

/* The non-root socket default, checked as an unprivileged user. */
static int check_user_socket(void)
{
	struct stage_config c;
	char want[64];
	int bad = 0;

	setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
	if (config_defaults(&c) || strcmp(c.socket, "/run/user/4242/stage.sock"))
		bad = 1;
	config_free(&c);

	/* Relative or unprintable: fall back rather than fail to start. */
	snprintf(want, sizeof(want), "/tmp/stage-%u.sock", (unsigned)getuid());
	setenv("XDG_RUNTIME_DIR", "run/user", 1);
	if (config_defaults(&c) || strcmp(c.socket, want))
		bad = 1;
	config_free(&c);
	setenv("XDG_RUNTIME_DIR", "/run/user #1", 1);     /* would print as a comment */
	if (config_defaults(&c) || strcmp(c.socket, want))
		bad = 1;
	config_free(&c);
	unsetenv("XDG_RUNTIME_DIR");
	if (config_defaults(&c) || strcmp(c.socket, want))
		bad = 1;
	config_free(&c);
	return bad;
}

static void test_defaults_socket_user(void **state)
{
	pid_t pid;
	int st;

	(void)state;
	if (geteuid() != 0) {
		assert_int_equal(check_user_socket(), 0);
		return;
	}
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(setuid(65534) != 0 ? 2 : check_user_socket());
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_size(void **state)
{
	static const struct { const char *s; uint64_t v; } good[] = {
		{ "0", 0 }, { "1", 1 }, { "1048576", 1048576 }, { "1K", 1024 }, { "1k", 1024 },
		{ "1KiB", 1024 }, { "1kib", 1024 }, { "1KIB", 1024 }, { "4M", 4 << 20 },
		{ "64MiB", 64 << 20 }, { "1G", 1ull << 30 }, { "2GiB", 2ull << 30 },
		{ "3T", 3ull << 40 }, { "1TiB", 1ull << 40 }, { "007K", 7 << 10 },
		{ "18446744073709551615", UINT64_MAX }, { "16777215T", 16777215ull << 40 },
	};
	static const char *const bad[] = {
		"", "K", "-1", "+1", " 1", "1 ", "1 K", "1.5M", "0x10", "1KB", "1Ki", "1iB",
		"1KiBx", "1P", "1B", "18446744073709551616", "16777216T", "17179869184G",
		"99999999999999999999999",
	};
	uint64_t v;

	(void)state;
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		v = 12345;
		if (config_parse_size(good[i].s, &v) != 0)
			fail_msg("'%s' rejected", good[i].s);
		assert_int_equal(v, good[i].v);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		v = 12345;
		if (config_parse_size(bad[i], &v) != -EINVAL)
			fail_msg("'%s' accepted", bad[i]);
		assert_int_equal(v, 12345);
	}
}

/* One key's value: accepted or rejected, over defaults. */
struct value_case {
	const char *section, *line;
	bool ok;
};

static void run_cases(const struct value_case *cases, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct stage_config c;
		int rc;

		assert_int_equal(config_defaults(&c), 0);
		rc = parse1(&c, cases[i].section, cases[i].line);
		if (cases[i].ok && rc != 0)
			fail_msg("[%s] %s: rejected: %s", cases[i].section, cases[i].line, err);
		if (!cases[i].ok && rc != -EINVAL)
			fail_msg("[%s] %s: accepted (rc %d)", cases[i].section, cases[i].line, rc);
		if (!cases[i].ok && strncmp(err, "t.conf:2: key '", 15) != 0)
			fail_msg("[%s] %s: message '%s'", cases[i].section, cases[i].line, err);
		config_free(&c);
	}
}

static void test_values_accept_reject(void **state)
{
	static const struct value_case cases[] = {
		/* name */
		{ "node", "name = n0", true },
		{ "node", "name = gpu-01.rack_2", true },
		{ "node", "name =", false },
		{ "node", "name = a b", false },
		{ "node", "name = a/b", false },
		{ "node", "name = ..", false },
		{ "node", "name = -x", false },
		/* paths */
		{ "node", "state_dir = /x", true },
		{ "node", "state_dir = relative", false },
		{ "node", "state_dir =", false },
		{ "node", "state_dir = /a/../b", false },
		{ "node", "state_dir = /a/\x01", false },
		{ "node", "state_dir = /data /", false },         /* would print with a trailing blank */
		{ "node", "socket = /run/x/staged.sock", true },
		{ "node", "socket = /0123456789012345678901234567890123456789012345678901234567890123456789"
			  "0123456789012345678901234567890123456789.sock", false },
		/* listen */
		{ "node", "listen = 0.0.0.0:7420", true },
		{ "node", "listen = 10.1.2.3:1", true },
		{ "node", "listen = node-3.example.org:65535", true },
		{ "node", "listen = [::]:7420", true },
		{ "node", "listen = [fe80::1]:7420", true },
		{ "node", "listen = ::1:7420", false },
		{ "node", "listen = [::1]7420", false },
		{ "node", "listen = [::1:7420", false },
		{ "node", "listen = [nothex]:7420", false },
		{ "node", "listen = 1.2.3:7420", false },
		{ "node", "listen = 256.1.1.1:7420", false },
		{ "node", "listen = host", false },
		{ "node", "listen = host:", false },
		{ "node", "listen = :7420", false },
		{ "node", "listen = host:0", false },
		{ "node", "listen = host:65536", false },
		{ "node", "listen = host:+80", false },
		{ "node", "listen = ho st:80", false },
		{ "node", "listen = a..b:80", false },
		/* enums */
		{ "node", "log_level = debug", true },
		{ "node", "log_level = WARN", true },
		{ "node", "log_level = verbose", false },
		{ "transfer", "transport = rdma", true },
		{ "transfer", "transport = udp", false },
		{ "transfer", "compress = float", true },
		{ "transfer", "compress = lz4", false },
		{ "transfer", "compress =", false },
		/* bool */
		{ "transfer", "watch = off", true },
		{ "transfer", "watch = Yes", true },
		{ "transfer", "watch = 0", true },
		{ "transfer", "watch = 2", false },
		{ "transfer", "watch = maybe", false },
		{ "transfer", "watch =", false },
		/* int */
		{ "cluster", "keep = 1", true },
		{ "cluster", "keep = 1000000", true },
		{ "cluster", "keep = 0", false },
		{ "cluster", "keep = 1000001", false },
		{ "cluster", "keep = -3", false },
		{ "cluster", "keep = 3x", false },
		{ "cluster", "keep = 99999999999999999999999", false },
		{ "cluster", "keep = all", false },
		{ "cluster", "replicas = 0", true },
		{ "cluster", "replicas = 64", true },
		{ "cluster", "replicas = ALL", true },
		{ "cluster", "replicas = 65", false },
		{ "cluster", "replicas = -1", false },
		{ "transfer", "files_in_flight = 4096", true },
		{ "transfer", "files_in_flight = 4097", false },
		{ "transfer", "files_in_flight = 0", false },
		/* sizes */
		{ "transfer", "memory = 1MiB", true },
		{ "transfer", "memory = 64G", true },
		{ "transfer", "memory = 3000000", true },         /* no power of two needed */
		{ "transfer", "memory = 1048575", false },
		{ "transfer", "memory = 65GiB", false },
		{ "transfer", "io_size = 64K", true },
		{ "transfer", "io_size = 256M", true },
		{ "transfer", "io_size = 32K", false },
		{ "transfer", "io_size = 512M", false },
		{ "transfer", "io_size = 3M", false },
		{ "transfer", "chunk_size = 4K", true },
		{ "transfer", "chunk_size = 1G", true },
		{ "transfer", "chunk_size = 2K", false },
		{ "transfer", "chunk_size = 2G", false },
		{ "transfer", "chunk_size = 12K", false },
		{ "transfer", "chunk_size = 4 MiB", false },
		/* source_roots */
		{ "paths", "source_roots = /nfs", true },
		{ "paths", "source_roots = /a,/b", true },
		{ "paths", "source_roots = /a,,/b", false },
		{ "paths", "source_roots = /a,", false },
		{ "paths", "source_roots = ,/a", false },
		{ "paths", "source_roots = /a, b", false },
		{ "paths", "source_roots = /a/..", false },
		{ "paths", "source_roots =", false },
	};

	(void)state;
	run_cases(cases, sizeof(cases) / sizeof(cases[0]));
}

static void test_values_stored(void **state)
{
	struct stage_config c;

	(void)state;
	assert_int_equal(config_defaults(&c), 0);
	assert_int_equal(parse_text(&c,
		"[node]\nname = n7\nlog_level = Debug\nsocket = //run//s.sock\nlisten = [::1]:9\n"
		"[cluster]\nreplicas = all\nkeep = 1000000\n"
		"[transfer]\ntransport = tcp\ncompress = off\nwatch = no\nmemory = 1g\n"
		"files_in_flight = 7\nio_size = 65536\nchunk_size = 1GiB\n"), 0);
	assert_string_equal(c.name, "n7");
	assert_int_equal(c.log_level, LOG_DEBUG);
	assert_string_equal(c.socket, "/run/s.sock");
	assert_string_equal(c.listen, "[::1]:9");
	assert_int_equal(c.replicas, CFG_REPLICAS_ALL);
	assert_int_equal(c.keep, 1000000);
	assert_int_equal(c.transport, CFG_TRANSPORT_TCP);
	assert_int_equal(c.compress, CFG_COMPRESS_OFF);
	assert_false(c.watch);
	assert_int_equal(c.memory, 1ull << 30);
	assert_int_equal(c.files_in_flight, 7);
	assert_int_equal(c.io_size, 65536);
	assert_int_equal(c.chunk_size, 1ull << 30);
	assert_round_trip(&c);
	config_free(&c);
}

static void test_source_roots(void **state)
{
	struct stage_config c;
	char line[2048];
	int n;

	(void)state;
	assert_int_equal(config_defaults(&c), 0);
	assert_int_equal(parse1(&c, "paths",
		"source_roots =  /a/ ,/b//c/./d/ , / ,\t/e/.\t,//,/./"), 0);
	assert_int_equal(c.n_source_roots, 6);
	assert_string_equal(c.source_roots[0], "/a");
	assert_string_equal(c.source_roots[1], "/b/c/d");
	assert_string_equal(c.source_roots[2], "/");
	assert_string_equal(c.source_roots[3], "/e");
	assert_string_equal(c.source_roots[4], "/");
	assert_string_equal(c.source_roots[5], "/");
	assert_round_trip(&c);

	/* Replacing a longer list with a shorter one frees and clears the rest. */
	assert_int_equal(parse1(&c, "paths", "source_roots = /nfs/data with space"), 0);
	assert_int_equal(c.n_source_roots, 1);
	assert_string_equal(c.source_roots[0], "/nfs/data with space");
	assert_null(c.source_roots[1]);
	assert_round_trip(&c);

	/* Exactly CFG_MAX_ROOTS, then one more. */
	n = snprintf(line, sizeof(line), "source_roots = /r0");
	for (int i = 1; i < CFG_MAX_ROOTS; i++)
		n += snprintf(line + n, sizeof(line) - (size_t)n, ",/r%d", i);
	assert_int_equal(parse1(&c, "paths", line), 0);
	assert_int_equal(c.n_source_roots, CFG_MAX_ROOTS);
	assert_string_equal(c.source_roots[CFG_MAX_ROOTS - 1], "/r15");
	assert_round_trip(&c);
	snprintf(line + n, sizeof(line) - (size_t)n, ",/r%d", CFG_MAX_ROOTS);
	assert_int_equal(parse1(&c, "paths", line), -EINVAL);
	assert_string_equal(err, "t.conf:2: key 'paths.source_roots': '/r0,/r1,/r2,/r3,/r4,/r5,/r6,"
			    "/r7,/r8,/r9,/r10,/r11,/r12,/r13,/r14,/r15,/r16': more than 16 paths");
	assert_int_equal(c.n_source_roots, CFG_MAX_ROOTS);

	assert_int_equal(parse1(&c, "paths", "source_roots = /a, ,/b"), -EINVAL);
	assert_string_equal(err, "t.conf:2: key 'paths.source_roots': '/a, ,/b': empty item in the list");
	config_free(&c);
}

static void test_messages(void **state)
{
	static const struct { const char *text, *msg; } cases[] = {
		{ "[node]\n\nname = a b\n", "t.conf:3: key 'node.name': 'a b': a name has only letters, "
		  "digits, '.', '-' and '_'" },
		{ "[cluster]\nkeep = 0\n", "t.conf:2: key 'cluster.keep': '0': not a number from 1 to 1000000" },
		{ "[cluster]\nreplicas = 65\n", "t.conf:2: key 'cluster.replicas': '65': not a number "
		  "from 0 to 64, or all" },
		{ "[transfer]\nio_size = 1G\n", "t.conf:2: key 'transfer.io_size': '1G': not a size (bytes, "
		  "or K, M, G, T: binary units) from 64KiB to 256MiB" },
		{ "[transfer]\nio_size = 96K\n", "t.conf:2: key 'transfer.io_size': '96K': not a power of two" },
		{ "[transfer]\ntransport = udp\n", "t.conf:2: key 'transfer.transport': 'udp': not one of "
		  "auto, tcp, rdma" },
		{ "[transfer]\nwatch = maybe\n", "t.conf:2: key 'transfer.watch': 'maybe': not on or off "
		  "(or true/false, yes/no, 1/0)" },
		{ "[paths]\nstage_root = data\n", "t.conf:2: key 'paths.stage_root': 'data': not an "
		  "absolute path" },
		{ "[node]\nlisten = ::1:80\n", "t.conf:2: key 'node.listen': '::1:80': an IPv6 address "
		  "goes in brackets: [ADDR]:PORT" },
		{ "[node]\nlisten = h:0\n", "t.conf:2: key 'node.listen': 'h:0': PORT must be a number "
		  "from 1 to 65535" },
		{ "[node]\nstate_dir = /a\tb\n", "t.conf:2: key 'node.state_dir': '/a?b': control "
		  "character in value" },
		{ "[node]\nnmae = x\n", "t.conf:2: key 'node.nmae': unknown key" },
		{ "[node]\nname = a\n[paths]\n[node]\n name=b\n", "t.conf:5: key 'node.name': duplicate "
		  "key (first set on line 2)" },
		{ "name = x\n", "t.conf:1: key 'name': key before any section" },
		{ "# c\n[nodes]\n", "t.conf:2: section '[nodes]': unknown section" },
		{ "[]\n", "t.conf:1: section '[]': unknown section" },
		{ "[node\n", "t.conf:1: expected '[section]'" },
		{ "[node]\nname\n", "t.conf:2: expected 'key = value'" },
		{ "[node]\n= x\n", "t.conf:2: expected 'key = value'" },
		{ "[node]\nname = n\x1b[2J\n", "t.conf:2: key 'node.name': 'n?[2J': a name has only "
		  "letters, digits, '.', '-' and '_'" },
	};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct stage_config c;

		assert_int_equal(config_defaults(&c), 0);
		assert_int_equal(parse_text(&c, cases[i].text), -EINVAL);
		assert_string_equal(err, cases[i].msg);
		config_free(&c);
	}
}

static void test_nul_byte(void **state)
{
	static const char text[] = "[node]\nname = a\nname\0 = b\n";
	struct stage_config c;

	(void)state;
	assert_int_equal(config_defaults(&c), 0);
	assert_int_equal(config_parse(&c, text, sizeof(text) - 1, "n.conf", err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "n.conf:3: NUL byte in file");
	config_free(&c);
}

static void test_ini_syntax(void **state)
{
	struct stage_config c;

	(void)state;
	assert_int_equal(config_defaults(&c), 0);
	assert_int_equal(parse_text(&c,
		"# a comment\n"
		"; another\n"
		"   \t\n"
		"  [ node ]   # trailing comment\r\n"
		"name=n1\r\n"
		"  state_dir   =   /s#1;2   ; comment\n" /* not after blank: part of the value */
		"\n"
		"[paths]\n"
		"stage_root = /d # comment\n"
		"[node]\n"                              /* sections may reopen */
		"log_level = warn"), 0);               /* no final newline */
	assert_string_equal(c.name, "n1");
	assert_string_equal(c.state_dir, "/s#1;2");
	assert_string_equal(c.stage_root, "/d");
	assert_int_equal(c.log_level, LOG_WARN);
	assert_round_trip(&c);

	/* Empty text and only comments are fine and change nothing. */
	assert_int_equal(config_parse(&c, "", 0, "e.conf", err, sizeof(err)), 0);
	assert_int_equal(config_parse(&c, NULL, 0, "e.conf", err, sizeof(err)), 0);
	assert_int_equal(parse_text(&c, "#x\n;y\n"), 0);
	assert_string_equal(c.name, "n1");
	/* A value that is all comment is empty. */
	assert_int_equal(parse_text(&c, "[node]\nname = #x\n"), -EINVAL);
	assert_string_equal(err, "t.conf:2: key 'node.name': '': empty name");
	config_free(&c);
}

/* A failed parse leaves every value as it was (and leaks nothing). */
static void test_parse_atomic(void **state)
{
	struct stage_config c, before;

	(void)state;
	assert_int_equal(config_defaults(&c), 0);
	assert_int_equal(config_defaults(&before), 0);
	assert_int_equal(parse_text(&c,
		"[node]\nname = changed\nstate_dir = /changed\n[paths]\nsource_roots = /x,/y\n"
		"[transfer]\nmemory = 2M\nbogus = 1\n"), -EINVAL);
	assert_string_equal(err, "t.conf:8: key 'transfer.bogus': unknown key");
	assert_config_equal(&c, &before);

	/* A good parse replaces strings (ASan sees the old ones freed). */
	assert_int_equal(parse_text(&c, "[node]\nname = x1\n[paths]\nsource_roots = /x,/y\n"), 0);
	assert_int_equal(parse_text(&c, "[node]\nname = x2\n[paths]\nsource_roots = /z\n"), 0);
	assert_string_equal(c.name, "x2");
	assert_int_equal(c.n_source_roots, 1);
	config_free(&c);
	config_free(&before);
}

static void test_round_trip(void **state)
{
	struct stage_config c;

	(void)state;
	assert_int_equal(config_defaults(&c), 0);
	assert_round_trip(&c);
	/* Every key away from its default. */
	assert_int_equal(parse_text(&c,
		"[node]\nname = other\nsocket = /s/x.sock\nlisten = host.example:1\n"
		"state_dir = /st\nlog_level = error\n"
		"[paths]\nsource_roots = /a, /b b, /c\nstage_root = /d\nckpt_root = /e\nreplica_root = /f\n"
		"[cluster]\nhosts = /h\nkey_file = /k\nreplicas = 0\nkeep = 9\n"
		"[transfer]\ntransport = rdma\ncompress = float\nwatch = off\nmemory = 1048577\n"
		"files_in_flight = 1\nio_size = 128K\nchunk_size = 4096\n"), 0);
	assert_round_trip(&c);
	assert_int_equal(parse_text(&c, "[cluster]\nreplicas = all\n[transfer]\nmemory = 3G\n"
				    "compress = zstd\n"), 0);
	assert_round_trip(&c);
	config_free(&c);
}

static void test_print_format(void **state)
{
	struct stage_config c;
	size_t len;
	char *text;

	(void)state;
	assert_int_equal(config_defaults(&c), 0);
	text = print_to_string(&c, &len);
	assert_non_null(strstr(text, "\n[node]\n"));
	assert_non_null(strstr(text, "\nlisten = 0.0.0.0:7420\n"));
	assert_non_null(strstr(text, "\n[paths]\n"));
	assert_non_null(strstr(text, "\nsource_roots = /\n"));
	assert_non_null(strstr(text, "\n[cluster]\n"));
	assert_non_null(strstr(text, "\nreplicas = 1\n"));
	assert_non_null(strstr(text, "\n[transfer]\n"));
	assert_non_null(strstr(text, "\nwatch = on\n"));
	assert_non_null(strstr(text, "\nmemory = 64MiB\n"));
	assert_non_null(strstr(text, "\nfiles_in_flight = 64\n"));
	assert_non_null(strstr(text, "\nlog_level = info\n"));
	free(text);
	config_free(&c);
}

static void write_file(const char *path, const char *text, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, len), (ssize_t)len);
	close(fd);
}

static void test_load(void **state)
{
	char dir[] = "/tmp/test_config.XXXXXX", path[PATH_MAX], want[PATH_MAX + 64];
	struct stage_config c;
	char *big;

	(void)state;
	assert_non_null(mkdtemp(dir));
	assert_int_equal(config_defaults(&c), 0);

	snprintf(path, sizeof(path), "%s/missing.conf", dir);
	assert_int_equal(config_load(&c, path, err, sizeof(err)), -ENOENT);
	snprintf(want, sizeof(want), "configuration %s: No such file or directory", path);
	assert_string_equal(err, want);

	assert_int_equal(config_load(&c, dir, err, sizeof(err)), -EISDIR);
	snprintf(want, sizeof(want), "configuration %s: Is a directory", dir);
	assert_string_equal(err, want);

	snprintf(path, sizeof(path), "%s/good.conf", dir);
	write_file(path, "[cluster]\nkeep = 5\n", 19);
	assert_int_equal(config_load(&c, path, err, sizeof(err)), 0);
	assert_int_equal(c.keep, 5);

	write_file(path, "[cluster]\nkeep = five\n", 22);
	assert_int_equal(config_load(&c, path, err, sizeof(err)), -EINVAL);
	snprintf(want, sizeof(want), "%s:2: key 'cluster.keep': 'five': not a number from 1 to 1000000",
		 path);
	assert_string_equal(err, want);
	assert_int_equal(c.keep, 5);

	/* 1 MiB of comments is allowed; one byte more is not. */
	big = malloc((1u << 20) + 1);
	assert_non_null(big);
	memset(big, '#', (1u << 20) + 1);
	write_file(path, big, 1u << 20);
	assert_int_equal(config_load(&c, path, err, sizeof(err)), 0);
	write_file(path, big, (1u << 20) + 1);
	assert_int_equal(config_load(&c, path, err, sizeof(err)), -EFBIG);
	snprintf(want, sizeof(want), "configuration %s: too large for a configuration file", path);
	assert_string_equal(err, want);
	free(big);

	unlink(path);
	rmdir(dir);
	config_free(&c);
}

static void test_hostport(void **state)
{
	static const struct { const char *s, *host; uint16_t port; } good[] = {
		{ "0.0.0.0:7420", "0.0.0.0", 7420 },
		{ "[::1]:1", "::1", 1 },
		{ "n0:65535", "n0", 65535 },
		{ "a.b-c_d.example:80", "a.b-c_d.example", 80 },
	};
	char host[64], name[300];
	const char *why = NULL;
	uint16_t port;

	(void)state;
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		assert_int_equal(config_parse_hostport(good[i].s, host, sizeof(host), &port, &why), 0);
		assert_string_equal(host, good[i].host);
		assert_int_equal(port, good[i].port);
	}
	assert_int_equal(config_parse_hostport("[::1]:1", host, 3, &port, &why), -EINVAL);
	assert_string_equal(why, "host name too long");
	assert_int_equal(config_parse_hostport("[::1]:1", NULL, 0, NULL, &why), 0);
	assert_int_equal(config_parse_hostport(".a:1", NULL, 0, NULL, &why), -EINVAL);
	assert_int_equal(config_parse_hostport("a.:1", NULL, 0, NULL, &why), -EINVAL);
	/* A label of 63 bytes is a name, 64 is not; a host of 256 is too long. */
	memset(name, 'a', 63);
	strcpy(name + 63, ".b:1");
	assert_int_equal(config_parse_hostport(name, NULL, 0, NULL, &why), 0);
	memset(name, 'a', 64);
	strcpy(name + 64, ".b:1");
	assert_int_equal(config_parse_hostport(name, NULL, 0, NULL, &why), -EINVAL);
	assert_string_equal(why, "not a host name or address");
	for (int i = 0; i < 256; i += 2)
		memcpy(name + i, "a.", 2);
	strcpy(name + 256, ":1");
	assert_int_equal(config_parse_hostport(name, NULL, 0, NULL, &why), -EINVAL);
	assert_string_equal(why, "host name too long");
}

static void test_check_name(void **state)
{
	const char *why;
	char longname[300];

	(void)state;
	assert_int_equal(config_check_name("n0", &why), 0);
	assert_int_equal(config_check_name("A.b-c_9", &why), 0);
	assert_int_equal(config_check_name("", &why), -EINVAL);
	assert_int_equal(config_check_name(".", &why), -EINVAL);
	assert_int_equal(config_check_name("-n", &why), -EINVAL);
	assert_int_equal(config_check_name("a/b", &why), -EINVAL);
	assert_int_equal(config_check_name("a b", &why), -EINVAL);
	assert_int_equal(config_check_name("\xc3\xa9", &why), -EINVAL);
	memset(longname, 'a', 255);
	longname[255] = '\0';
	assert_int_equal(config_check_name(longname, &why), 0);
	longname[255] = 'a';
	longname[256] = '\0';
	assert_int_equal(config_check_name(longname, &why), -EINVAL);
	assert_string_equal(why, "name longer than 255 bytes");
}

/* config_cpus counts the CPUs this thread may run on, not those online:
 * pinned to one, it says one, and the defaults follow it. */
static void test_cpus_follow_affinity(void **state)
{
	struct stage_config c = { .streams = 0, .hash_threads = 0 };
	cpu_set_t all, one;
	unsigned n;

	assert_int_equal(sched_getaffinity(0, sizeof(all), &all), 0);
	n = config_cpus();
	assert_int_equal(n, (unsigned)CPU_COUNT(&all));
	CPU_ZERO(&one);
	for (int i = 0; i < CPU_SETSIZE; i++)
		if (CPU_ISSET(i, &all)) {
			CPU_SET(i, &one);
			break;
		}
	assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0);
	assert_int_equal(config_cpus(), 1);
	assert_int_equal(config_streams(&c), 1);
	assert_int_equal(config_streams_max(&c), 1);
	assert_int_equal(config_hash_threads(&c), 1);
	assert_int_equal(sched_setaffinity(0, sizeof(all), &all), 0);
	assert_int_equal(config_cpus(), n);
	assert_int_equal(config_streams(&c), n / 4 < 1 ? 1 : n / 4 > 8 ? 8 : n / 4);
	assert_int_equal(config_streams_max(&c), n / 2 < 1 ? 1 : n / 2 > 16 ? 16 : n / 2);
	c.streams_max = 5;
	assert_int_equal(config_streams_max(&c), 5);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cpus_follow_affinity),
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_defaults_socket_user),
		cmocka_unit_test(test_size),
		cmocka_unit_test(test_values_accept_reject),
		cmocka_unit_test(test_values_stored),
		cmocka_unit_test(test_source_roots),
		cmocka_unit_test(test_messages),
		cmocka_unit_test(test_nul_byte),
		cmocka_unit_test(test_ini_syntax),
		cmocka_unit_test(test_parse_atomic),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_print_format),
		cmocka_unit_test(test_load),
		cmocka_unit_test(test_hostport),
		cmocka_unit_test(test_check_name),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
