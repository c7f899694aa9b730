/* Port lists and port ranges (syntax: portlist.h).
 *
 * A list is checked whole before anything is refused for its size, so a
 * typing mistake is reported as one even in a list that is also too long.
 * Repeats are found with a bitmap of the 65536 ports: a range costs its
 * length, at most 65535 steps, and a list its total length.
 */
#include "common/portlist.h"
#include "common/textfile.h"
#include "common/why.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>



static bool is_blank(char c)
{
	return c == ' ' || c == '\t';
}

/* Narrows [*s, *e) to what lies between blanks. */
static void trim(const char **s, const char **e)
{
	while (*s < *e && is_blank(**s))
		(*s)++;
	while (*e > *s && is_blank((*e)[-1]))
		(*e)--;
}

/* A port in decimal, [s, e), already trimmed. */
static bool parse_port(const char *s, const char *e, uint16_t *port)
{
	unsigned v = 0;

	if (s == e)
		return false;
	for (; s < e; s++) {
		if (*s < '0' || *s > '9')
			return false;
		v = v * 10 + (unsigned)(*s - '0');
		if (v > 65535)
			return false;
	}
	if (v == 0)
		return false;
	*port = (uint16_t)v;
	return true;
}

/* "PORT" or "LO-HI", [s, e) trimmed, into lo..hi; item is the whole of it
 * for messages. */
static int parse_range(const char *s, const char *e, uint16_t *lo, uint16_t *hi,
		       char *why, size_t whylen)
{
	const char *dash = memchr(s, '-', (size_t)(e - s));
	const char *a = s, *ae = dash ? dash : e, *b = dash ? dash + 1 : e, *be = e;
	char qi[WHY_QUOTE_MAX + 1], qp[WHY_QUOTE_MAX + 1];

	if (!dash) {
		if (!parse_port(s, e, lo))
			return why_fail(why, whylen, -EINVAL, "'%s' is not a port number (1-65535)",
				    why_quote(qi, s, (size_t)(e - s)));
		*hi = *lo;
		return 0;
	}
	trim(&a, &ae);
	trim(&b, &be);
	if (a == ae || b == be)
		return why_fail(why, whylen, -EINVAL, "'%s' is not a port range (LO-HI)",
				       why_quote(qi, s, (size_t)(e - s)));
	if (!parse_port(a, ae, lo))
		return why_fail(why, whylen, -EINVAL, "'%s': '%s' is not a port number (1-65535)",
			    why_quote(qi, s, (size_t)(e - s)), why_quote(qp, a, (size_t)(ae - a)));
	if (!parse_port(b, be, hi))
		return why_fail(why, whylen, -EINVAL, "'%s': '%s' is not a port number (1-65535)",
			    why_quote(qi, s, (size_t)(e - s)), why_quote(qp, b, (size_t)(be - b)));
	if (*hi < *lo)
		return why_fail(why, whylen, -EINVAL, "'%s': the range runs backwards",
				       why_quote(qi, s, (size_t)(e - s)));
	return 0;
}

int portlist_parse(const char *s, uint16_t *ports, size_t cap, size_t *n, char *why, size_t whylen)
{
	uint64_t seen[65536 / 64] = { 0 };
	const char *full = NULL;        /* the item that passed cap, if one did */
	const char *full_end = NULL;
	char q[WHY_QUOTE_MAX + 1];
	size_t k = 0;

	*n = 0;
	if (why && whylen)
		why[0] = '\0';
	if (!s)
		s = "";
	for (const char *p = s;; p++) {
		const char *c = strchr(p, ','), *e = c ? c : p + strlen(p), *b = p;
		uint16_t lo, hi;
		int rc;

		trim(&b, &e);
		if (b == e && !c && p == s)
			return why_fail(why, whylen, -EINVAL, "no ports");
		if (b == e)
			return why_fail(why, whylen, -EINVAL, "an empty item in the list");
		rc = parse_range(b, e, &lo, &hi, why, whylen);
		if (rc)
			return rc;
		for (uint32_t port = lo; !full && port <= hi; port++) {
			if (seen[port / 64] & (1ull << (port % 64)))
				continue;
			if (k == cap) {
				full = b;
				full_end = e;
				break;
			}
			seen[port / 64] |= 1ull << (port % 64);
			ports[k++] = (uint16_t)port;
		}
		if (!c)
			break;
		p = c;
	}
	if (full)
		return why_fail(why, whylen, -E2BIG, "'%s': more than %zu ports",
				       why_quote(q, full, (size_t)(full_end - full)), cap);
	*n = k;
	return 0;
}

/* PORTRANGE_EPHEMERAL_FILE: two numbers and white space. */
static int read_ephemeral(uint16_t *lo, uint16_t *hi, char *why, size_t whylen)
{
	const char *path = PORTRANGE_EPHEMERAL_FILE;
	unsigned a, b;
	char *buf, extra;
	size_t len;
	int rc = textfile_read(path, 64, &buf, &len);

	if (rc)
		return why_fail(why, whylen, rc, "%s: %s", path, strerror(-rc));
	/* The buffer holds max + 1 bytes: room for the NUL unless it is full. */
	if (len <= 64)
		buf[len] = '\0';
	if (len > 64 || sscanf(buf, "%u %u %c", &a, &b, &extra) != 2 ||
	    a < 1 || b > 65535 || a > b)
		rc = why_fail(why, whylen, -EINVAL, "%s: does not hold a port range LO HI", path);
	else {
		*lo = (uint16_t)a;
		*hi = (uint16_t)b;
	}
	free(buf);
	return rc;
}

int portrange_parse(const char *s, uint16_t *lo, uint16_t *hi, char *why, size_t whylen)
{
	const char *b = s ? s : "", *e = b + strlen(b);
	char q[WHY_QUOTE_MAX + 1];

	if (why && whylen)
		why[0] = '\0';
	trim(&b, &e);
	if ((size_t)(e - b) == strlen("ephemeral") && memcmp(b, "ephemeral", (size_t)(e - b)) == 0)
		return read_ephemeral(lo, hi, why, whylen);
	if ((size_t)(e - b) == strlen("none") && memcmp(b, "none", (size_t)(e - b)) == 0) {
		*lo = *hi = 0;
		return 0;
	}
	if (!memchr(b, '-', (size_t)(e - b)))
		return why_fail(why, whylen, -EINVAL, "'%s': expected ephemeral, none or LO-HI",
				       why_quote(q, b, (size_t)(e - b)));
	return parse_range(b, e, lo, hi, why, whylen);
}
