/* libFuzzer target: hosts_parse on arbitrary bytes.
 *
 * Beyond not crashing: a rejected file gets a message that names it; an
 * accepted one keeps the invariants of hosts.c (valid unique names, unique
 * addresses, hosts_find agrees), and hosts_partners never returns self, a
 * node of self's domain or a node twice, and returns as many as asked for
 * whenever that many are eligible. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/hosts.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond) do { if (!(cond)) { fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #cond); abort(); } } while (0)

static int same_domain(const struct host *a, const struct host *b)
{
	return a->domain && b->domain && strcmp(a->domain, b->domain) == 0;
}

static void check_partners(const struct hosts *h, size_t self, int replicas, size_t *out)
{
	size_t eligible = 0, want;
	int n = hosts_partners(h, self, replicas, out, h->n);

	for (size_t j = 0; j < h->n; j++)
		if (j != self && !same_domain(&h->v[self], &h->v[j]))
			eligible++;
	want = replicas == CFG_REPLICAS_ALL ? eligible : (size_t)replicas;
	CHECK(n >= 0);
	CHECK((size_t)n == (want < eligible ? want : eligible));
	for (int k = 0; k < n; k++) {
		CHECK(out[k] < h->n);
		CHECK(out[k] != self);
		CHECK(!same_domain(&h->v[self], &h->v[out[k]]));
		for (int l = 0; l < k; l++)
			CHECK(out[l] != out[k]);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const int replicas[] = { 0, 1, 2, 3, CFG_REPLICAS_ALL };
	struct hosts h;
	char err[512];
	const char *why;
	size_t *out;

	if (hosts_parse(&h, (const char *)data, size, "fuzz.hosts", err, sizeof(err)) != 0) {
		CHECK(strncmp(err, "fuzz.hosts:", 11) == 0);
		CHECK(h.n == 0 && h.v == NULL);
		return 0;
	}
	CHECK(h.n >= 1 && h.n <= HOSTS_MAX_NODES);
	for (size_t i = 0; i < h.n; i++) {
		const struct host *a = &h.v[i];

		CHECK(config_check_name(a->name, &why) == 0);
		CHECK(!a->domain || config_check_name(a->domain, &why) == 0);
		CHECK(a->port != 0 && *a->host);
		CHECK(hosts_find(&h, a->name) == (ssize_t)i);
		for (size_t j = 0; j < i; j++)
			CHECK(a->port != h.v[j].port || strcasecmp(a->host, h.v[j].host) != 0);
	}
	out = malloc(h.n * sizeof(*out));
	CHECK(out);
	/* Enough nodes to cover wrap-around without making big inputs slow. */
	for (size_t self = 0; self < h.n && self < 64; self++)
		for (size_t r = 0; r < sizeof(replicas) / sizeof(replicas[0]); r++)
			check_partners(&h, self, replicas[r], out);
	free(out);
	hosts_free(&h);
	return 0;
}
