/* stage doctor's answers as K_NAME/K_VALUE pairs (dr_impl.h): written by
 * every measurement, read by the coordinator. Below every other file of
 * the doctor. */
#include "daemon/doctor/dr_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/peers/peers.h"
#include "daemon/repl/repl.h"

bool dr_get(const struct msg *m, const char *name, char *out, size_t cap)
{
	size_t off = 0, n, len = strlen(name);
	const uint8_t *p;
	uint16_t key;
	bool hit = false;

	while (msg_next_field(m, &off, &key, &p, &n) == 1) {
		if (key == K_NAME) {
			hit = n == len && memcmp(p, name, n) == 0;
		} else if (key == K_VALUE && hit) {
			if (cap) {
				size_t k = n < cap - 1 ? n : cap - 1;

				memcpy(out, p, k);
				out[k] = '\0';
				/* A peer's text: no NUL may cut it short unseen,
				 * no control character reach a terminal. */
				for (size_t i = 0; i < k; i++)
					if ((unsigned char)out[i] < 0x20 || out[i] == 0x7f)
						out[i] = '?';
			}
			return true;
		}
	}
	return false;
}

double dr_getf(const struct msg *m, const char *name, double dflt)
{
	char v[64], *end;
	double d;

	if (!dr_get(m, name, v, sizeof(v)))
		return dflt;
	d = strtod(v, &end);
	return end != v && *end == '\0' ? d : dflt;
}


size_t dr_holders(const struct msg *ask, struct dr_holder *out, size_t cap)
{
	size_t off = 0, len, n = 0;
	const uint8_t *p;
	uint16_t key;

	while (n < cap && msg_next_field(ask, &off, &key, &p, &len) == 1) {
		bool dup = false;

		if (key != K_HOLDER || len >= sizeof(out[n].name))
			continue;
		memcpy(out[n].name, p, len);
		out[n].name[len] = '\0';
		out[n].host = peers.cluster ? hosts_find(&peers.hosts, out[n].name) : -1;
		for (size_t i = 0; i < n; i++)
			dup |= strcmp(out[i].name, out[n].name) == 0;
		n += !dup;
	}
	return n;
}

/* "GROUP.I.FIELD": the name of one root's (or one item's) figure. */
static void name_at(char *out, size_t len, const char *group, size_t i, const char *field)
{
	snprintf(out, len, "%s.%zu.%s", group, i, field);
}

void dr_put_at(struct msg *m, const char *group, size_t i, const char *field, const char *fmt,
	       ...)
{
	char name[96], v[1024];
	va_list ap;

	name_at(name, sizeof(name), group, i, field);
	va_start(ap, fmt);
	vsnprintf(v, sizeof(v), fmt, ap);
	va_end(ap);
	msg_put_pairf(m, name, "%s", v);
}

bool dr_get_at(const struct msg *m, const char *group, size_t i, const char *field, char *out,
	       size_t cap)
{
	char name[96];

	name_at(name, sizeof(name), group, i, field);
	return dr_get(m, name, out, cap);
}

double dr_getf_at(const struct msg *m, const char *group, size_t i, const char *field,
		  double dflt)
{
	char name[96];

	name_at(name, sizeof(name), group, i, field);
	return dr_getf(m, name, dflt);
}
