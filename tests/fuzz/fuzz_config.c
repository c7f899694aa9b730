/* libFuzzer target: config_parse on arbitrary bytes.
 *
 * Beyond not crashing, two properties: a rejected file gets a message that
 * names it, and an accepted one prints as a file that parses back to the
 * same printed text (the --print-config round trip). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *print(const struct stage_config *c, size_t *len)
{
	char *buf = NULL;
	FILE *f = open_memstream(&buf, len);

	if (!f)
		abort();
	config_print(c, f);
	if (fclose(f) != 0)
		abort();
	return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct stage_config c, d;
	char err[512];
	char *text, *again;
	size_t len, len2;

	if (config_defaults(&c) != 0)
		abort();
	if (config_parse(&c, (const char *)data, size, "fuzz.conf", err, sizeof(err)) != 0) {
		if (strncmp(err, "fuzz.conf:", 10) != 0)
			abort();
		config_free(&c);
		return 0;
	}
	text = print(&c, &len);
	if (config_defaults(&d) != 0)
		abort();
	if (config_parse(&d, text, len, "printed", err, sizeof(err)) != 0) {
		fprintf(stderr, "printed config rejected: %s\n%s", err, text);
		abort();
	}
	again = print(&d, &len2);
	if (len != len2 || memcmp(text, again, len) != 0) {
		fprintf(stderr, "round trip differs:\n%s\n---\n%s", text, again);
		abort();
	}
	free(text);
	free(again);
	config_free(&d);
	config_free(&c);
	return 0;
}
