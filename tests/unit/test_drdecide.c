/* daemon/doctor/dr_decide.c: what stage doctor calls a problem, on answers
 * built in memory (the same K_NAME/K_VALUE pairs the nodes send): no
 * daemon, no network. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/proto.h"
#include "daemon/doctor/dr_impl.h"

#define N 4

struct world {
	struct dr_node nodes[N];
	struct dr_pair pairs[N * (N - 1)];
	uint16_t ports[2];
	struct dr_in in;
};

static const char *names[N] = { "n0", "n1", "n2", "n3" };

/* A healthy cluster: synced clocks, same facts, every port open, every
 * pair at 9.4 Gbit/s, routes over eth0 at 10 Gb/s with MTU 9000. */
static void healthy(struct world *w)
{
	size_t k = 0;

	memset(w, 0, sizeof(*w));
	for (size_t i = 0; i < N; i++) {
		struct dr_node *n = &w->nodes[i];

		*n = (struct dr_node){ .name = names[i], .host = i, .self = i == 0, .up = true,
				       .has_clock = true, .offset_ms = 0.2, .twin = i };
		msg_init(&n->facts, MSG_DOCTOR_ANS);
		msg_put_pairf(&n->facts, "fact.kernel", "6.1.0-18-amd64");
		msg_put_pairf(&n->facts, "fact.image", "a");
		msg_put_pairf(&n->facts, "clock.synced", "1");
		for (size_t j = 0; j < N; j++)
			if (j != i) {
				char name[32];

				snprintf(name, sizeof(name), "route.%s", names[j]);
				msg_put_pairf(&n->facts, name, "eth0|9000|10000|10.0.0.%zu", i + 1);
			}
		msg_init(&n->listen, MSG_DOCTOR_ANS);
		msg_put_pairf(&n->listen, "port.29500", "open");
		msg_put_pairf(&n->listen, "port.40001", "open");
		msg_init(&n->dial, MSG_DOCTOR_ANS);
		for (size_t j = 0; j < N; j++)
			if (j != i) {
				char name[32];

				snprintf(name, sizeof(name), "dial.%s.29500", names[j]);
				msg_put_pairf(&n->dial, name, "open");
				snprintf(name, sizeof(name), "dial.%s.40001", names[j]);
				msg_put_pairf(&n->dial, name, "open");
			}
		msg_init(&n->disk, MSG_DOCTOR_ANS);
		msg_put_pairf(&n->disk, "disk.0.root", "stage_root");
		msg_put_pairf(&n->disk, "disk.0.path", "/var/lib/stage/data");
		msg_put_pairf(&n->disk, "disk.0.write", "1000000000");
		msg_put_pairf(&n->disk, "disk.0.read", "2000000000");
		msg_put_pairf(&n->disk, "disk.0.direct", "1");
		msg_put_pairf(&n->disk, "disk.0.free", "100000000000");
		msg_put_pairf(&n->disk, "disk.1.root", "ckpt_root");
		msg_put_pairf(&n->disk, "disk.1.path", "/var/lib/stage/ckpt");
		msg_put_pairf(&n->disk, "disk.1.same", "0");
		msg_put_pairf(&n->disk, "newest", "0");
	}
	for (size_t a = 0; a < N; a++)
		for (size_t b = 0; b < N; b++) {
			struct dr_pair *p;

			if (a == b)
				continue;
			p = &w->pairs[k++];
			*p = (struct dr_pair){ .a = a, .b = b, .measured = true };
			msg_init(&p->ans, MSG_DOCTOR_ANS);
			msg_put_pairf(&p->ans, "multi_Bps", "%.0f", 9.4e9 / 8);
			msg_put_pairf(&p->ans, "one_Bps", "%.0f", 8e9 / 8);
			msg_put_pairf(&p->ans, "rtt_med_us", "50");
		}
	w->ports[0] = 29500;
	w->ports[1] = 40001;
	w->in = (struct dr_in){ .nodes = w->nodes, .nnodes = N, .pairs = w->pairs, .npairs = k,
				.ports = w->ports, .nports = 2, .nrequired = 1,
				.clock_bound_ms = 100, .streams = 4 };
}

static void world_free(struct world *w)
{
	for (size_t i = 0; i < N; i++) {
		msg_free(&w->nodes[i].facts);
		msg_free(&w->nodes[i].listen);
		msg_free(&w->nodes[i].dial);
		msg_free(&w->nodes[i].disk);
	}
	for (size_t k = 0; k < w->in.npairs; k++)
		msg_free(&w->pairs[k].ans);
}

static void replace(struct msg *m, const char *name, const char *value)
{
	struct msg fresh;
	size_t off = 0, n;
	const uint8_t *p;
	uint16_t key;
	bool skip = false;

	msg_init(&fresh, m->type);
	while (msg_next_field(m, &off, &key, &p, &n) == 1) {
		if (key == K_NAME)
			skip = n == strlen(name) && memcmp(p, name, n) == 0;
		if (!skip)
			msg_put_bytes(&fresh, key, p, n);
		if (key == K_VALUE)
			skip = false;
	}
	msg_put_pairf(&fresh, name, "%s", value);
	msg_free(m);
	*m = fresh;
}

/* The failed checks, as "check subject" lines, and their count. */
static unsigned failed(struct world *w, char *out, size_t cap)
{
	struct msg *v;
	size_t n, len = 0;
	unsigned problems;

	assert_int_equal(dr_decide(&w->in, &v, &n, &problems), 0);
	out[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		uint64_t code = 0;
		char *c = NULL, *s = NULL;

		if (v[i].type != MSG_CHECK)
			continue;
		msg_get_u64(&v[i], K_CODE, &code);
		msg_get_str(&v[i], K_CHECK, &c);
		msg_get_str(&v[i], K_SUBJECT, &s);
		if (code)
			len += (size_t)snprintf(out + len, cap - len, "%s %s\n", c, s);
		free(c);
		free(s);
	}
	dr_frames_free(v, n);
	return problems;
}

static void test_healthy_has_no_problem(void **state)
{
	struct world w;
	char out[4096];

	healthy(&w);
	assert_int_equal(failed(&w, out, sizeof(out)), 0);
	assert_string_equal(out, "");
	world_free(&w);
}

static void test_slow_pair_named(void **state)
{
	struct world w;
	char out[4096];

	healthy(&w);
	for (size_t k = 0; k < w.in.npairs; k++)
		if ((w.pairs[k].a == 1 && w.pairs[k].b == 2) || (w.pairs[k].a == 2 && w.pairs[k].b == 1))
			replace(&w.pairs[k].ans, "multi_Bps", "25000000");
	assert_int_equal(failed(&w, out, sizeof(out)), 2);
	assert_string_equal(out, "bandwidth n1>n2\nbandwidth n2>n1\n");
	world_free(&w);
}

static void test_clock_offset_and_unsynced(void **state)
{
	struct world w;
	char out[4096];

	healthy(&w);
	w.nodes[3].offset_ms = 3001.5;
	replace(&w.nodes[2].facts, "clock.synced", "0");
	assert_int_equal(failed(&w, out, sizeof(out)), 2);
	assert_string_equal(out, "clock n2\nclock n3\n");
	/* Within the bound, either sign. */
	w.nodes[3].offset_ms = -99.0;
	replace(&w.nodes[2].facts, "clock.synced", "1");
	assert_int_equal(failed(&w, out, sizeof(out)), 0);
	/* The asker's own clock 3 s ahead: every other node reads -3 s from
	 * it, and the asker is the one named. */
	w.nodes[0].offset_ms = 0;
	for (size_t i = 1; i < N; i++)
		w.nodes[i].offset_ms = -3000.0 + (double)i;
	assert_int_equal(failed(&w, out, sizeof(out)), 1);
	assert_string_equal(out, "clock n0\n");
	world_free(&w);
}

static void test_blocked_port_named_with_cause(void **state)
{
	struct world w;
	char out[4096];

	healthy(&w);
	/* Dropped on its way to n2 from everyone. */
	for (size_t i = 0; i < N; i++)
		if (i != 2)
			replace(&w.nodes[i].dial, "dial.n2.29500", "dropped");
	assert_int_equal(failed(&w, out, sizeof(out)), 1);
	assert_string_equal(out, "port 29500@n2\n");
	/* A sampled port in use is not the job's problem; 29500 in use is. */
	replace(&w.nodes[1].listen, "port.40001", "in-use|sshd (pid 1)");
	replace(&w.nodes[3].listen, "port.29500", "in-use|python3 (pid 7)");
	assert_int_equal(failed(&w, out, sizeof(out)), 2);
	assert_string_equal(out, "port 29500@n2\nport 29500@n3\n");
	world_free(&w);
}

static void test_odd_fact_named(void **state)
{
	struct world w;
	char out[4096];

	healthy(&w);
	replace(&w.nodes[1].facts, "fact.image", "b");
	assert_int_equal(failed(&w, out, sizeof(out)), 1);
	assert_string_equal(out, "fact image\n");
	world_free(&w);
}

static void test_node_down_named_rest_checked(void **state)
{
	struct world w;
	char out[4096];

	healthy(&w);
	w.nodes[3].up = false;
	snprintf(w.nodes[3].why, sizeof(w.nodes[3].why), "n3: connection refused");
	/* Its pairs were never measured: planning leaves them out. */
	w.in.npairs = 0;
	for (size_t k = 0; k < N * (N - 1); k++)
		if (w.pairs[k].a != 3 && w.pairs[k].b != 3)
			w.pairs[w.in.npairs++] = w.pairs[k];
		else
			msg_free(&w.pairs[k].ans);
	replace(&w.nodes[0].facts, "fact.image", "z");   /* still checked on the rest */
	assert_int_equal(failed(&w, out, sizeof(out)), 2);
	assert_string_equal(out, "nodes all\nnodes n3\nfact image\n");
	world_free(&w);
}

static void test_slow_link_and_mtu(void **state)
{
	struct world w;
	char out[4096];

	healthy(&w);
	replace(&w.nodes[1].facts, "route.n0", "eth1|1500|1000|10.0.1.2");
	assert_int_equal(failed(&w, out, sizeof(out)), 2);
	assert_string_equal(out, "mtu n0-n1\nlink n1:eth1\n");
	world_free(&w);
}

static void test_space_for_the_next_checkpoint(void **state)
{
	struct world w;
	char out[4096];

	healthy(&w);
	replace(&w.nodes[2].disk, "newest", "200000000000");
	msg_put_pairf(&w.nodes[2].disk, "newest.step", "llama/step-900");
	assert_int_equal(failed(&w, out, sizeof(out)), 1);
	assert_string_equal(out, "space n2:ckpt_root\n");
	world_free(&w);
}

/* Who looks at whom: everyone up to pairs_max; beyond, a bounded,
 * symmetric set that still reaches every node. */
static void test_peers(void **state)
{
	size_t out[1000], n;

	n = dr_peers(2, 5, 16, out);
	assert_int_equal(n, 4);
	for (size_t i = 0; i < n; i++)
		assert_true(out[i] != 2 && out[i] < 5);
	for (size_t nodes = 17; nodes <= 1000; nodes += 61) {
		bool *seen = calloc(nodes, sizeof(*seen));

		for (size_t i = 0; i < nodes; i++) {
			n = dr_peers(i, nodes, 16, out);
			assert_true(n >= 2 && n <= 16);
			for (size_t k = 0; k < n; k++) {
				size_t back[1000], nb = dr_peers(out[k], nodes, 16, back);
				bool found = false;

				assert_true(out[k] != i && out[k] < nodes);
				for (size_t j = 0; j < nb; j++)
					found |= back[j] == i;
				assert_true(found);          /* symmetric */
				seen[out[k]] = true;
			}
		}
		for (size_t i = 0; i < nodes; i++)
			assert_true(seen[i]);                /* nobody left out */
		free(seen);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_healthy_has_no_problem),
		cmocka_unit_test(test_slow_pair_named),
		cmocka_unit_test(test_clock_offset_and_unsynced),
		cmocka_unit_test(test_blocked_port_named_with_cause),
		cmocka_unit_test(test_odd_fact_named),
		cmocka_unit_test(test_node_down_named_rest_checked),
		cmocka_unit_test(test_slow_link_and_mtu),
		cmocka_unit_test(test_space_for_the_next_checkpoint),
		cmocka_unit_test(test_peers),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
