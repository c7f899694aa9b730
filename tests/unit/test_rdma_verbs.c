/* rdma/verbs.c, the RDMA transport table, on a machine without an RDMA
 * device: available() says there is none; connect, to a host's address or
 * to its rdma= address, and listen fail at once, with messages that name the
 * node, the address and the port, tearing down what they half made without
 * a crash or a leak (the unit tests run under ASan and LeakSanitizer too);
 * and the transport tables, RDMA's and TCP's, are complete. The tests that
 * need no device skip where /sys/class/infiniband lists one. */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "common/xport.h"

#define PORT 17420
#define PORT_S "17420"

static const struct xport_ops *R = &xport_rdma_ops;

/* ---- Helpers ---- */

/* Whether /sys/class/infiniband lists a device (missing or empty: no). */
static bool have_device(void)
{
	DIR *d = opendir("/sys/class/infiniband");
	struct dirent *e;
	bool any = false;

	if (!d)
		return false;
	while (!any && (e = readdir(d)))
		any = strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
	closedir(d);
	return any;
}

static void need_no_device(void)
{
	if (have_device()) {
		print_message("/sys/class/infiniband lists a device: this is a no-device test\n");
		skip();
	}
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void assert_prefix(const char *s, const char *prefix)
{
	if (strncmp(s, prefix, strlen(prefix)) != 0)
		fail_msg("\"%s\" does not start with \"%s\"", s, prefix);
}

/* Connects to h (1 s timeout), which must fail at once: returns the why. */
static void connect_fails(const struct host *h, char *why, size_t whylen)
{
	struct xport *sentinel = (struct xport *)&sentinel, *x = sentinel;
	int64_t t0 = now_ms(), took;
	int rc;

	memset(why, 0, whylen);
	rc = R->connect(h, 1000, &x, why, whylen);
	took = now_ms() - t0;
	print_message("connect %s -> %d (%lld ms): %s\n", h->rdma ? h->rdma : h->host, rc,
		      (long long)took, why);
	assert_true(rc < 0);
	assert_true(x == sentinel || x == NULL);
	/* Without a device nothing is waited for, not even the timeout. */
	assert_true(took < 1000);
	assert_non_null(memchr(why, '\0', whylen));
}

/* ---- available ---- */

static void test_available(void **state)
{
	char why[256];

	need_no_device();
	memset(why, 0, sizeof(why));
	assert_int_equal(R->available(why, sizeof(why)), -ENODEV);
	print_message("available: %s\n", why);
	assert_non_null(strstr(why, "no RDMA device"));

	/* Twice: the verbs library keeps nothing between calls. */
	assert_int_equal(R->available(why, sizeof(why)), -ENODEV);
	/* A short buffer is cut, not overrun. */
	memset(why, 'x', sizeof(why));
	assert_int_equal(R->available(why, 8), -ENODEV);
	assert_int_equal(strlen(why), 7);
	assert_int_equal(why[8], 'x');
}

/* ---- connect ---- */

static void test_connect_host(void **state)
{
	struct host h = { .name = "n1", .host = "127.0.0.1", .port = PORT, .rdma = NULL };
	char why[256];

	need_no_device();
	connect_fails(&h, why, sizeof(why));
	assert_prefix(why, "node n1 (127.0.0.1:" PORT_S "): rdma: ");
}

/* rdma= wins over the host's address, and the message names it. */
static void test_connect_rdma_addr(void **state)
{
	struct host h = { .name = "n1", .host = "127.0.0.1", .port = PORT, .rdma = "::1" };
	char why[256];

	need_no_device();
	connect_fails(&h, why, sizeof(why));
	assert_prefix(why, "node n1 (");
	assert_non_null(strstr(why, "::1"));
	assert_null(strstr(why, "127.0.0.1"));
	assert_non_null(strstr(why, PORT_S "): rdma: "));
}

/* A name that does not resolve: nothing of the CM made yet. */
static void test_connect_unresolvable(void **state)
{
	struct host h = { .name = "n2", .host = "no-such-host.invalid", .port = PORT };
	char why[256];

	need_no_device();
	connect_fails(&h, why, sizeof(why));
	assert_prefix(why, "node n2 (no-such-host.invalid:" PORT_S "): rdma: ");
}

/* No room for a message, or none wanted: still fails cleanly. */
static void test_connect_no_why(void **state)
{
	struct host h = { .name = "n1", .host = "127.0.0.1", .port = PORT };
	struct xport *x = NULL;
	char why[4] = "abc";

	need_no_device();
	assert_true(R->connect(&h, 1000, &x, NULL, 0) < 0);
	assert_null(x);
	assert_true(R->connect(&h, 1000, &x, why, 0) < 0);
	assert_null(x);
	assert_string_equal(why, "abc");
}

/* ---- listen ---- */

static void test_listen(void **state)
{
	struct xport_listener *sentinel = (struct xport_listener *)&sentinel, *l = sentinel;
	char why[256];
	int fd = -7, rc;

	need_no_device();
	memset(why, 0, sizeof(why));
	rc = R->listen("127.0.0.1", PORT, &l, &fd, why, sizeof(why));
	print_message("listen -> %d: %s\n", rc, why);
	if (rc == 0) {
		/* Some stacks (rdma_rxe, siw) listen without a device shown: fine. */
		assert_true(l != sentinel && l != NULL);
		assert_true(fd >= 0);
		R->unlisten(l);
		return;
	}
	assert_true(rc < 0);
	assert_prefix(why, "rdma: listening on 127.0.0.1:" PORT_S);
	assert_ptr_equal(l, sentinel);  /* untouched on failure */
	assert_int_equal(fd, -7);

	/* Without a message, and unlisten(NULL), harmless. */
	assert_true(R->listen("127.0.0.1", PORT, &l, &fd, NULL, 0) < 0);
	assert_true(R->listen("no-such-host.invalid", PORT, &l, &fd, why, sizeof(why)) < 0);
	assert_prefix(why, "rdma: listening on no-such-host.invalid:" PORT_S);
	R->unlisten(NULL);
}

/* ---- the tables ---- */

static void check_table(const struct xport_ops *o, const char *name, bool need_available,
			bool has_ready)
{
	assert_non_null(o->name);
	assert_string_equal(o->name, name);
	if (need_available)
		assert_non_null(o->available);
	assert_non_null(o->listen);
	assert_non_null(o->accept);
	assert_non_null(o->unlisten);
	assert_non_null(o->connect);
	assert_non_null(o->send);
	assert_non_null(o->send_tail);
	assert_non_null(o->recv);
	assert_non_null(o->recv_last);
	/* Without ready a sender cannot listen between pieces, and offers no
	 * hand-off of a lost stream (docs/PROTOCOL.md, "Streams"). */
	if (has_ready)
		assert_non_null(o->ready);
	else
		assert_null(o->ready);
	assert_non_null(o->set_timeout);
	assert_non_null(o->queued);
	assert_non_null(o->shutdown);
	assert_non_null(o->close);
}

static void test_tables(void **state)
{
	/* Every member is checked: one added to xport_ops must be added here. */
	_Static_assert(sizeof(struct xport_ops) == 15 * sizeof(void *),
		       "struct xport_ops changed: check_table checks each member");
	check_table(&xport_rdma_ops, "rdma", true, false);
	check_table(&xport_tcp_ops, "tcp", false, true);     /* available may be NULL: always */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_available),
		cmocka_unit_test(test_connect_host),
		cmocka_unit_test(test_connect_rdma_addr),
		cmocka_unit_test(test_connect_unresolvable),
		cmocka_unit_test(test_connect_no_why),
		cmocka_unit_test(test_listen),
		cmocka_unit_test(test_tables),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
