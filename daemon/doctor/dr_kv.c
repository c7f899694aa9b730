/* stage doctor's answers as K_NAME/K_VALUE pairs (dr_impl.h): written by
 * every measurement, read by the coordinator. Below every other file of
 * the doctor. */
#include "daemon/doctor/dr_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dr_put(struct msg *m, const char *name, const char *fmt, ...)
{
	char v[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(v, sizeof(v), fmt, ap);
	va_end(ap);
	msg_put_str(m, K_NAME, name);
	msg_put_str(m, K_VALUE, v);
}

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

