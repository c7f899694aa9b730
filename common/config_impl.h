/* Inside the configuration: what config.c (the table of keys, their
 * values, defaults and printing) gives config_file.c (the file's reader)
 * and config_names.c (the syntax of names and addresses).
 * Not for the rest of the code (it uses config.h). */
#ifndef STAGE_CONFIG_IMPL_H
#define STAGE_CONFIG_IMPL_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/config.h"

static inline bool cfg_is_ws(char ch)
{
	return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n' || ch == '\v' || ch == '\f';
}

/* s without its leading and trailing white space (cut in place). */
static inline char *cfg_trim(char *s)
{
	size_t n;

	while (cfg_is_ws(*s))
		s++;
	n = strlen(s);
	while (n && cfg_is_ws(s[n - 1]))
		s[--n] = '\0';
	return s;
}

/* The keys of the table, by index: how many; the index of SECTION's KEY
 * (key NULL: of SECTION's first), or -1; a section's own spelling. */
size_t cfg_count(void);
int cfg_find(const char *section, const char *key);
const char *cfg_section(size_t i);
/* Key i of c set from its text s: 0, or -errno with why (a message). */
int cfg_set(size_t i, struct stage_config *c, const char *s, char *why, size_t whylen);
/* What key i of c owns, freed. */
void cfg_release(size_t i, struct stage_config *c);
/* Consumes decimal digits; at least one, no sign, no overflow: 0, or
 * -EINVAL. */
static inline int cfg_parse_digits(const char **sp, uint64_t *out)
{
	const char *s = *sp;
	uint64_t v = 0;

	if (*s < '0' || *s > '9')
		return -EINVAL;
	for (; *s >= '0' && *s <= '9'; s++) {
		unsigned d = (unsigned)(*s - '0');

		if (v > (UINT64_MAX - d) / 10)
			return -EINVAL;
		v = v * 10 + d;
	}
	*sp = s;
	*out = v;
	return 0;
}

/* A decimal number and nothing else: 0, or -EINVAL. */
static inline int cfg_parse_uint(const char *s, uint64_t *out)
{
	if (cfg_parse_digits(&s, out) || *s)
		return -EINVAL;
	return 0;
}

#endif
