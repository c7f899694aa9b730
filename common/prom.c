#include "common/prom.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LABELS_MAX 8

void prom_init(struct prom *p)
{
	memset(p, 0, sizeof(*p));
}

void prom_free(struct prom *p)
{
	free(p->buf);
	prom_init(p);
}

int prom_error(const struct prom *p)
{
	return p->err;
}

static bool reserve(struct prom *p, size_t more)
{
	size_t cap = p->cap ? p->cap : 4096;
	char *b;

	if (p->err)
		return false;
	if (p->len + more + 1 <= p->cap)
		return true;
	if (p->len + more + 1 > PROM_MAX) {
		p->err = -E2BIG;
		return false;
	}
	while (cap < p->len + more + 1)
		cap *= 2;
	if (cap > PROM_MAX)
		cap = PROM_MAX;
	b = realloc(p->buf, cap);
	if (!b) {
		p->err = -ENOMEM;
		return false;
	}
	p->buf = b;
	p->cap = cap;
	return true;
}

static void put(struct prom *p, const char *s, size_t n)
{
	if (!reserve(p, n))
		return;
	memcpy(p->buf + p->len, s, n);
	p->len += n;
	p->buf[p->len] = '\0';
}

static void puts_(struct prom *p, const char *s)
{
	put(p, s, strlen(s));
}

/* Formats straight into the buffer, whatever the length. */
static void putf(struct prom *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(struct prom *p, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0 || !reserve(p, (size_t)n))
		return;
	va_start(ap, fmt);
	vsnprintf(p->buf + p->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	p->len += (size_t)n;
}

/* HELP text escapes \ and newline; a label value also the double quote. */
static void put_escaped(struct prom *p, const char *s, bool quote)
{
	for (; *s; s++) {
		if (*s == '\\')
			puts_(p, "\\\\");
		else if (*s == '\n')
			puts_(p, "\\n");
		else if (quote && *s == '"')
			puts_(p, "\\\"");
		else
			put(p, s, 1);
	}
}

/* [a-zA-Z_:][a-zA-Z0-9_:]* for a metric, the same without ':' for a label
 * (and not starting "__", which Prometheus keeps for itself). */
static bool valid_name(const char *s, bool label)
{
	if (!*s || (s[0] >= '0' && s[0] <= '9') || (label && strncmp(s, "__", 2) == 0))
		return false;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
		      (*s >= '0' && *s <= '9') || *s == '_' || (!label && *s == ':')))
			return false;
	return true;
}

void prom_fail(struct prom *p, int err)
{
	if (!p->err)
		p->err = err;
}

void prom_family(struct prom *p, const char *name, const char *type, const char *help)
{
	if (!valid_name(name, false) || strlen(name) >= sizeof(p->family) ||
	    (strcmp(type, "counter") != 0 && strcmp(type, "gauge") != 0))
		return prom_fail(p, -EINVAL);
	strcpy(p->family, name);
	putf(p, "# HELP %s ", name);
	put_escaped(p, help, false);
	putf(p, "\n# TYPE %s %s\n", name, type);
}

static void sample_head(struct prom *p, const char *const *labels)
{
	size_t n = 0;

	if (!p->family[0])
		return prom_fail(p, -EINVAL);
	puts_(p, p->family);
	if (!labels || !labels[0])
		return puts_(p, " ");
	puts_(p, "{");
	for (; labels[0]; labels += 2, n++) {
		if (n == LABELS_MAX || !labels[1] || !valid_name(labels[0], true))
			return prom_fail(p, -EINVAL);
		if (n)
			puts_(p, ",");
		puts_(p, labels[0]);
		puts_(p, "=\"");
		put_escaped(p, labels[1], true);
		puts_(p, "\"");
	}
	puts_(p, "} ");
}

void prom_u64(struct prom *p, const char *const *labels, uint64_t v)
{
	sample_head(p, labels);
	putf(p, "%llu\n", (unsigned long long)v);
}

void prom_f64(struct prom *p, const char *const *labels, double v)
{
	sample_head(p, labels);
	if (isnan(v))
		puts_(p, "NaN\n");
	else if (isinf(v))
		puts_(p, v > 0 ? "+Inf\n" : "-Inf\n");
	else {
		char tmp[32];

		/* The shortest of 15 or 17 digits that reads back as v: 0.1,
		 * not 0.10000000000000001. */
		snprintf(tmp, sizeof(tmp), "%.15g", v);
		if (strtod(tmp, NULL) != v)
			snprintf(tmp, sizeof(tmp), "%.17g", v);
		putf(p, "%s\n", tmp);
	}
}
