/* Expands a hostlist expression with common/hostlist.c, one name a line,
 * for tests/integration/test_hostlist.py to compare with Slurm's
 * `scontrol show hostnames`.
 *
 * usage: hostlist_expand EXPR [MAX]
 * exit 0 with the names; 2 and "hostlist_expand: why" on stderr when the
 * expression is refused or the usage is wrong. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hostlist.h"
#include "common/hosts.h"       /* HOSTS_MAX_NODES: what --nodes allows */

int main(int argc, char **argv)
{
	size_t max = HOSTS_MAX_NODES, n;
	char why[512], **names, *end;
	int rc;

	if (argc < 2 || argc > 3) {
		fprintf(stderr, "usage: hostlist_expand EXPR [MAX]\n");
		return 2;
	}
	if (argc == 3) {
		errno = 0;
		max = strtoul(argv[2], &end, 10);
		if (errno || end == argv[2] || *end) {
			fprintf(stderr, "hostlist_expand: '%s' is not a count\n", argv[2]);
			return 2;
		}
	}
	rc = hostlist_expand(argv[1], max, &names, &n, why, sizeof(why));
	if (rc) {
		fprintf(stderr, "hostlist_expand: %s (%s)\n", why, strerror(-rc));
		return 2;
	}
	for (size_t i = 0; i < n; i++)
		printf("%s\n", names[i]);
	hostlist_free(names, n);
	return fflush(stdout) == 0 ? 0 : 1;
}
