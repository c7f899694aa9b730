/* common/hosts.c: good files, every error with its message, partner
 * placement, and loading from disk. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/hosts.h"

static char err[1024];

static int parse(struct hosts *h, const char *text)
{
	return hosts_parse(h, text, strlen(text), "hosts", err, sizeof(err));
}

/* text must be refused with -EINVAL and exactly the message want. */
static void assert_refused(const char *text, const char *want)
{
	struct hosts h = { (void *)1, 42 };     /* junk: parse must reset it */

	if (parse(&h, text) != -EINVAL) {
		hosts_free(&h);
		fail_msg("accepted or wrong error for:\n%s", text);
	}
	assert_string_equal(err, want);
	assert_null(h.v);
	assert_int_equal(h.n, 0);
}

static void assert_node(const struct host *n, const char *name, const char *host,
			uint16_t port, const char *domain, const char *rdma)
{
	assert_string_equal(n->name, name);
	assert_string_equal(n->host, host);
	assert_int_equal(n->port, port);
	if (domain)
		assert_string_equal(n->domain, domain);
	else
		assert_null(n->domain);
	if (rdma)
		assert_string_equal(n->rdma, rdma);
	else
		assert_null(n->rdma);
}

static void test_good(void **state)
{
	struct hosts h;

	(void)state;
	assert_int_equal(parse(&h,
		"# the test cluster\n"
		"\n"
		"n0 10.0.0.1:7420 domain=r1 rdma=192.168.0.1\n"
		"  n1\t10.0.0.2:7420   rdma=ib-n1.example  domain=r1   # options in any order\n"
		"n2 node2.example.org:7421\r\n"
		"n-3 [fe80::1]:7420 domain=rack_2 rdma=[fe80::2]\n"
		"n.4 [::1]:1 rdma=::2\n"
		"n_5 10.0.0.1:7421 #a comment after white space\n"
		"   \t\n"
		"#n6 10.0.0.6:7420\n"
		"n6 10.0.0.6:65535"), 0);   /* no final newline */
	assert_string_equal(err, "");
	assert_int_equal(h.n, 7);
	assert_node(&h.v[0], "n0", "10.0.0.1", 7420, "r1", "192.168.0.1");
	assert_node(&h.v[1], "n1", "10.0.0.2", 7420, "r1", "ib-n1.example");
	assert_node(&h.v[2], "n2", "node2.example.org", 7421, NULL, NULL);
	assert_node(&h.v[3], "n-3", "fe80::1", 7420, "rack_2", "fe80::2");
	assert_node(&h.v[4], "n.4", "::1", 1, NULL, "::2");
	assert_node(&h.v[6], "n6", "10.0.0.6", 65535, NULL, NULL);
	hosts_free(&h);
	hosts_free(&h);         /* idempotent */
	assert_null(h.v);
	assert_int_equal(h.n, 0);
}

/* '#' inside a field is not a comment, so it reaches the port check. */
static void test_hash_inside_field(void **state)
{
	(void)state;
	assert_refused("n0 10.0.0.1:7420#x\n",
		       "hosts:1: node 'n0': address '10.0.0.1:7420#x': "
		       "PORT must be a number from 1 to 65535");
}

static void test_single_and_max(void **state)
{
	struct hosts h;
	size_t len = 0, cap = 64 * (HOSTS_MAX_NODES + 1);
	char *text = malloc(cap);

	(void)state;
	assert_int_equal(parse(&h, "solo 127.0.0.1:7420\n"), 0);
	assert_int_equal(h.n, 1);
	hosts_free(&h);

	assert_non_null(text);
	for (int i = 0; i < HOSTS_MAX_NODES; i++)
		len += (size_t)snprintf(text + len, cap - len, "n%d 10.%d.%d.1:7420 domain=r%d\n",
					i, i / 256, i % 256, i % 8);
	assert_int_equal(hosts_parse(&h, text, len, "big", err, sizeof(err)), 0);
	assert_int_equal(h.n, HOSTS_MAX_NODES);
	assert_int_equal(hosts_find(&h, "n4095"), 4095);
	hosts_free(&h);

	snprintf(text + len, cap - len, "one-more 10.99.0.1:7420\n");
	len += strlen(text + len);
	assert_int_equal(hosts_parse(&h, text, len, "big", err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "big:4097: more than 4096 nodes");
	free(text);
}

static void test_errors(void **state)
{
	(void)state;
	assert_refused("", "hosts: no nodes in file");
	assert_refused("# only comments\n\n   \n", "hosts: no nodes in file");
	assert_refused("n0\n", "hosts:1: node 'n0': missing HOST:PORT");
	assert_refused("n0 # 10.0.0.1:7420\n", "hosts:1: node 'n0': missing HOST:PORT");
	assert_refused("\n-n0 10.0.0.1:1\n",
		       "hosts:2: node '-n0': a name does not start with '.' or '-'");
	assert_refused("n/0 10.0.0.1:1\n",
		       "hosts:1: node 'n/0': a name has only letters, digits, '.', '-' and '_'");
	assert_refused("n\x01 10.0.0.1:1\n",
		       "hosts:1: node 'n?': a name has only letters, digits, '.', '-' and '_'");
	assert_refused("n0 10.0.0.1\n",
		       "hosts:1: node 'n0': address '10.0.0.1': expected HOST:PORT");
	assert_refused("n0 10.0.0.1:0\n",
		       "hosts:1: node 'n0': address '10.0.0.1:0': PORT must be a number from 1 to 65535");
	assert_refused("n0 10.0.0.256:1\n",
		       "hosts:1: node 'n0': address '10.0.0.256:1': not an IPv4 address");
	assert_refused("n0 fe80::1:7420\n",
		       "hosts:1: node 'n0': address 'fe80::1:7420': "
		       "an IPv6 address goes in brackets: [ADDR]:PORT");
	assert_refused("n0 10.0.0.1:1 domain\n",
		       "hosts:1: node 'n0': 'domain': expected domain=RACK or rdma=ADDR");
	assert_refused("n0 10.0.0.1:1 rack=r1\n", "hosts:1: node 'n0': unknown option 'rack'");
	assert_refused("n0 10.0.0.1:1 Domain=r1\n", "hosts:1: node 'n0': unknown option 'Domain'");
	assert_refused("n0 10.0.0.1:1 =r1\n", "hosts:1: node 'n0': unknown option ''");
	assert_refused("n0 10.0.0.1:1 domain=r1 domain=r1\n",
		       "hosts:1: node 'n0': duplicate option 'domain'");
	assert_refused("n0 10.0.0.1:1 rdma=a rdma=b\n", "hosts:1: node 'n0': duplicate option 'rdma'");
	assert_refused("n0 10.0.0.1:1 domain=\n", "hosts:1: node 'n0': domain '': empty name");
	assert_refused("n0 10.0.0.1:1 domain=r/1\n",
		       "hosts:1: node 'n0': domain 'r/1': "
		       "a name has only letters, digits, '.', '-' and '_'");
	assert_refused("n0 10.0.0.1:1 rdma=\n",
		       "hosts:1: node 'n0': rdma '': "
		       "expected an IPv4 or IPv6 address or a host name, without a port");
	assert_refused("n0 10.0.0.1:1 rdma=[]\n",
		       "hosts:1: node 'n0': rdma '[]': "
		       "expected an IPv4 or IPv6 address or a host name, without a port");
	assert_refused("n0 10.0.0.1:1 rdma=10.0.0.9:7420\n",
		       "hosts:1: node 'n0': rdma '10.0.0.9:7420': not an IPv6 address");
	assert_refused("n0 10.0.0.1:1 rdma=[fe80::g]\n",
		       "hosts:1: node 'n0': rdma '[fe80::g]': not an IPv6 address");
	assert_refused("n0 10.0.0.1:1 rdma=1.2.3.400\n",
		       "hosts:1: node 'n0': rdma '1.2.3.400': not an IPv4 address");
	assert_refused("n0 10.0.0.1:1 rdma=bad_host!\n",
		       "hosts:1: node 'n0': rdma 'bad_host!': not a host name or address");
	assert_refused("n0 10.0.0.1:1\nn1 10.0.0.2:1\n# n0\nn0 10.0.0.3:1\n",
		       "hosts:4: node 'n0': duplicate name (first on line 1)");
	assert_refused("n0 10.0.0.1:1\ndurable 10.0.0.2:1\n",
		       "hosts:2: node 'durable': the name of the durable tier in verify --cluster, "
		       "restore --from and resume: call the node otherwise");
	assert_refused("n0 10.0.0.1:1\nn1 10.0.0.1:1\n",
		       "hosts:2: node 'n1': address '10.0.0.1:1' already used by node 'n0' (line 1)");
	assert_refused("n0 Node.Example:1\nn1 node.example:1\n",
		       "hosts:2: node 'n1': address 'node.example:1' already used by node 'n0' (line 1)");
	assert_refused("n0 [fe80::0:1]:1\nn1 [FE80::1]:1\n",
		       "hosts:2: node 'n1': address '[FE80::1]:1' already used by node 'n0' (line 1)");
}

/* Same host, different ports, are different nodes (several daemons on one
 * machine, as the local cluster launcher runs them). */
static void test_same_host_other_port(void **state)
{
	struct hosts h;

	(void)state;
	assert_int_equal(parse(&h, "a 127.0.0.1:7420\nb 127.0.0.1:7421\n"), 0);
	assert_int_equal(h.n, 2);
	hosts_free(&h);
}

/* The NUL check needs the length, not strlen. */
static void test_nul(void **state)
{
	static const char text[] = "n0 10.0.0.1:1\nn1\0 10.0.0.2:1\n";
	struct hosts h;

	(void)state;
	assert_int_equal(hosts_parse(&h, text, sizeof(text) - 1, NULL, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "<hosts>:2: NUL byte in file");
	assert_int_equal(hosts_parse(&h, text, sizeof(text) - 1, NULL, NULL, 0), -EINVAL);
}

static void test_too_big(void **state)
{
	struct hosts h;
	size_t len = HOSTS_MAX_FILE + 1;
	char *text = malloc(len);

	(void)state;
	assert_non_null(text);
	memset(text, '\n', len);
	memcpy(text, "n0 10.0.0.1:1\n", 14);
	assert_int_equal(hosts_parse(&h, text, len, "big", err, sizeof(err)), -EFBIG);
	assert_string_equal(err, "big: larger than 1048576 bytes");
	assert_int_equal(hosts_parse(&h, text, len - 1, "big", err, sizeof(err)), 0);
	assert_int_equal(h.n, 1);
	hosts_free(&h);
	free(text);
}

/* A message truncated to the buffer stays terminated. */
static void test_small_err(void **state)
{
	struct hosts h;
	char small[12];

	(void)state;
	assert_int_equal(hosts_parse(&h, "x", 1, "hosts", small, sizeof(small)), -EINVAL);
	assert_string_equal(small, "hosts:1: no");
}

static void test_find(void **state)
{
	struct hosts h;

	(void)state;
	assert_int_equal(parse(&h, "a 10.0.0.1:1\nb 10.0.0.2:1\nc 10.0.0.3:1\n"), 0);
	assert_int_equal(hosts_find(&h, "a"), 0);
	assert_int_equal(hosts_find(&h, "c"), 2);
	assert_int_equal(hosts_find(&h, "C"), -1);
	assert_int_equal(hosts_find(&h, "d"), -1);
	assert_int_equal(hosts_find(&h, ""), -1);
	hosts_free(&h);
	assert_int_equal(hosts_find(&h, "a"), -1);
}

#define MAXP 16

/* The partners of the node called self, as names: "c,d". */
static const char *partners(const struct hosts *h, const char *self, int replicas)
{
	static char buf[256];
	size_t out[MAXP];
	ssize_t i = hosts_find(h, self);
	int n;

	assert_true(i >= 0);
	n = hosts_partners(h, (size_t)i, replicas, out, MAXP);
	assert_true(n >= 0);
	buf[0] = '\0';
	for (int k = 0; k < n; k++) {
		if (k)
			strcat(buf, ",");
		strcat(buf, h->v[out[k]].name);
	}
	return buf;
}

/* The worked example of hosts.h. */
static void test_partners_two_racks(void **state)
{
	struct hosts h;

	(void)state;
	assert_int_equal(parse(&h,
		"a 10.0.0.1:7420 domain=r1\n"
		"b 10.0.0.2:7420 domain=r1\n"
		"c 10.0.0.3:7420 domain=r2\n"
		"d 10.0.0.4:7420 domain=r2\n"), 0);
	assert_string_equal(partners(&h, "a", 1), "c");
	assert_string_equal(partners(&h, "b", 1), "c");
	assert_string_equal(partners(&h, "c", 1), "a");
	assert_string_equal(partners(&h, "d", 1), "a");
	assert_string_equal(partners(&h, "a", 2), "c,d");
	assert_string_equal(partners(&h, "b", 2), "c,d");
	assert_string_equal(partners(&h, "c", 2), "a,b");
	assert_string_equal(partners(&h, "d", 2), "a,b");
	/* Too few eligible: fewer partners, not an error. */
	assert_string_equal(partners(&h, "a", 3), "c,d");
	assert_string_equal(partners(&h, "d", CFG_REPLICAS_ALL), "a,b");
	assert_string_equal(partners(&h, "a", 0), "");
	hosts_free(&h);

	/* Interleaved racks spread the copies. */
	assert_int_equal(parse(&h,
		"a 10.0.0.1:7420 domain=r1\n"
		"c 10.0.0.3:7420 domain=r2\n"
		"b 10.0.0.2:7420 domain=r1\n"
		"d 10.0.0.4:7420 domain=r2\n"), 0);
	assert_string_equal(partners(&h, "a", 1), "c");
	assert_string_equal(partners(&h, "c", 1), "b");
	assert_string_equal(partners(&h, "b", 1), "d");
	assert_string_equal(partners(&h, "d", 1), "a");
	hosts_free(&h);
}

static void test_partners_no_domains(void **state)
{
	struct hosts h;

	(void)state;
	assert_int_equal(parse(&h,
		"n0 10.0.0.1:1\nn1 10.0.0.2:1\nn2 10.0.0.3:1\nn3 10.0.0.4:1\nn4 10.0.0.5:1\n"), 0);
	assert_string_equal(partners(&h, "n0", 1), "n1");
	assert_string_equal(partners(&h, "n4", 1), "n0");         /* wraps */
	assert_string_equal(partners(&h, "n3", 3), "n4,n0,n1");
	assert_string_equal(partners(&h, "n2", CFG_REPLICAS_ALL), "n3,n4,n0,n1");
	assert_string_equal(partners(&h, "n2", 4), "n3,n4,n0,n1");
	assert_string_equal(partners(&h, "n2", 99), "n3,n4,n0,n1"); /* more than nodes */
	hosts_free(&h);
}

/* A node without domain= shares one with nobody: it skips no one, and a
 * node with a domain does not skip it. */
static void test_partners_mixed_domains(void **state)
{
	struct hosts h;

	(void)state;
	assert_int_equal(parse(&h,
		"a 10.0.0.1:1 domain=r1\n"
		"b 10.0.0.2:1\n"
		"c 10.0.0.3:1 domain=r1\n"
		"d 10.0.0.4:1 domain=r2\n"
		"e 10.0.0.5:1\n"), 0);
	assert_string_equal(partners(&h, "b", 2), "c,d");          /* self not in a domain */
	assert_string_equal(partners(&h, "b", CFG_REPLICAS_ALL), "c,d,e,a");
	assert_string_equal(partners(&h, "a", 2), "b,d");          /* c skipped */
	assert_string_equal(partners(&h, "c", CFG_REPLICAS_ALL), "d,e,b");
	assert_string_equal(partners(&h, "e", 1), "a");
	hosts_free(&h);
}

static void test_partners_degenerate(void **state)
{
	struct hosts h;
	size_t out[4];

	(void)state;
	assert_int_equal(parse(&h, "solo 10.0.0.1:1 domain=r1\n"), 0);
	assert_string_equal(partners(&h, "solo", 1), "");
	assert_string_equal(partners(&h, "solo", CFG_REPLICAS_ALL), "");
	hosts_free(&h);

	/* Everyone in one rack: nobody is eligible. */
	assert_int_equal(parse(&h, "a 10.0.0.1:1 domain=r\nb 10.0.0.2:1 domain=r\n"), 0);
	assert_string_equal(partners(&h, "a", 1), "");
	hosts_free(&h);

	assert_int_equal(parse(&h, "a 10.0.0.1:1\nb 10.0.0.2:1\nc 10.0.0.3:1\n"), 0);
	assert_int_equal(hosts_partners(&h, 3, 1, out, 4), -EINVAL);      /* self out of range */
	assert_int_equal(hosts_partners(&h, 0, -2, out, 4), -EINVAL);
	assert_int_equal(hosts_partners(&h, 0, 2, out, 1), -ENOSPC);
	assert_int_equal(hosts_partners(&h, 0, CFG_REPLICAS_ALL, out, 2), 2); /* n - 1 fits */
	assert_int_equal(out[0], 1);
	assert_int_equal(out[1], 2);
	assert_int_equal(hosts_partners(&h, 0, 0, NULL, 0), 0);
	hosts_free(&h);
}

static void test_load(void **state)
{
	char path[] = "/tmp/test_hosts.XXXXXX";
	const char text[] = "a 10.0.0.1:1\nb 10.0.0.1:1\n";
	struct hosts h;
	char want[256];
	int fd;

	(void)state;
	fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, sizeof(text) - 1), sizeof(text) - 1);
	close(fd);
	assert_int_equal(hosts_load(&h, path, err, sizeof(err)), -EINVAL);
	snprintf(want, sizeof(want), "%s:2: node 'b': address '10.0.0.1:1' already used by node 'a' (line 1)",
		 path);
	assert_string_equal(err, want);

	fd = open(path, O_WRONLY | O_TRUNC);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "a 10.0.0.1:1\n", 13), 13);
	close(fd);
	assert_int_equal(hosts_load(&h, path, err, sizeof(err)), 0);
	assert_int_equal(h.n, 1);
	assert_node(&h.v[0], "a", "10.0.0.1", 1, NULL, NULL);
	hosts_free(&h);

	unlink(path);
	assert_int_equal(hosts_load(&h, path, err, sizeof(err)), -ENOENT);
	snprintf(want, sizeof(want), "hosts file %s ([cluster] hosts): No such file or directory", path);
	assert_string_equal(err, want);
	assert_int_equal(h.n, 0);

	assert_int_equal(hosts_load(&h, "/", err, sizeof(err)), -EISDIR);
	assert_string_equal(err, "hosts file / ([cluster] hosts): Is a directory");
	assert_int_equal(hosts_load(&h, "/nonexistent/hosts", NULL, 0), -ENOENT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_good),
		cmocka_unit_test(test_hash_inside_field),
		cmocka_unit_test(test_single_and_max),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_same_host_other_port),
		cmocka_unit_test(test_nul),
		cmocka_unit_test(test_too_big),
		cmocka_unit_test(test_small_err),
		cmocka_unit_test(test_find),
		cmocka_unit_test(test_partners_two_racks),
		cmocka_unit_test(test_partners_no_domains),
		cmocka_unit_test(test_partners_mixed_domains),
		cmocka_unit_test(test_partners_degenerate),
		cmocka_unit_test(test_load),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
