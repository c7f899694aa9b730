#include "common/why.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int why_fail(char *why, size_t whylen, int rc, const char *fmt, ...)
{
	va_list ap;

	if (!why || !whylen)
		return rc;
	va_start(ap, fmt);
	vsnprintf(why, whylen, fmt, ap);
	va_end(ap);
	for (char *s = why; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			*s = '?';
	return rc;
}

const char *why_quote(char q[WHY_QUOTE_MAX + 1], const char *s, size_t len)
{
	if (len > WHY_QUOTE_MAX) {
		memcpy(q, s, WHY_QUOTE_MAX - 3);
		memcpy(q + WHY_QUOTE_MAX - 3, "...", 4);
	} else {
		memcpy(q, s, len);
		q[len] = '\0';
	}
	return q;
}
