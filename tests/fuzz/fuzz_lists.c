/* libFuzzer target: hostlist_expand (--nodes, SLURM_JOB_NODELIST) and
 * portlist_parse / portrange_parse (--ports, [doctor] keys, a peer's
 * question) on arbitrary bytes.
 *
 * Beyond not crashing: a refusal says why and leaves nothing; an expansion
 * gives at most max names, each a valid node name, none twice; a port list
 * gives at most cap ports, each 1..65535, none twice. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/hostlist.h"
#include "common/portlist.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond) do { if (!(cond)) { fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #cond); abort(); } } while (0)
#define MAX_NAMES 512

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char s[4097], why[256];
	uint16_t ports[PORTLIST_MAX], lo, hi;
	char **names = NULL;
	size_t n = 99;
	int rc;

	if (size >= sizeof(s))
		size = sizeof(s) - 1;
	memcpy(s, data, size);
	s[size] = '\0';

	why[0] = '\0';
	rc = hostlist_expand(s, MAX_NAMES, &names, &n, why, sizeof(why));
	if (rc < 0) {
		CHECK(names == NULL && n == 0);
		CHECK(why[0] != '\0');
	} else {
		CHECK(rc == 0 && n <= MAX_NAMES && (n == 0 || names));
		for (size_t i = 0; i < n; i++) {
			const char *w;

			CHECK(config_check_name(names[i], &w) == 0);
			for (size_t k = 0; k < i; k++)
				CHECK(strcmp(names[i], names[k]) != 0);
		}
	}
	hostlist_free(names, n);

	why[0] = '\0';
	n = 99;
	rc = portlist_parse(s, ports, PORTLIST_MAX, &n, why, sizeof(why));
	if (rc < 0) {
		CHECK(why[0] != '\0');
	} else {
		CHECK(n <= PORTLIST_MAX);
		for (size_t i = 0; i < n; i++) {
			CHECK(ports[i] >= 1);
			for (size_t k = 0; k < i; k++)
				CHECK(ports[i] != ports[k]);
		}
	}
	if (strcmp(s, "ephemeral") != 0 && portrange_parse(s, &lo, &hi, why, sizeof(why)) == 0)
		CHECK(lo <= hi);
	return 0;
}
