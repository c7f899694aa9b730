#include "client/cli_doctor.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "client/cli_json.h"

struct str {
	const char *p;
	size_t n;
};

static struct str field(const struct msg *m, uint16_t key)
{
	const uint8_t *p;
	size_t n;

	if (msg_get_bytes(m, key, &p, &n) != 0)
		return (struct str){ "", 0 };
	return (struct str){ (const char *)p, n };
}

static void put(FILE *f, struct str s)
{
	fwrite(s.p, 1, s.n, f);
}

int cli_check_human(FILE *out, const struct msg *m)
{
	struct str check = field(m, K_CHECK), subject = field(m, K_SUBJECT);
	uint64_t code = 1;
	size_t off = 0, n;
	const uint8_t *p;
	uint16_t key;

	msg_get_u64(m, K_CODE, &code);
	fprintf(out, "%s %-9.*s %-16.*s ", code ? "✗" : "✓", (int)check.n, check.p,
		(int)subject.n, subject.p);
	put(out, field(m, K_TEXT));
	fputc('\n', out);
	while (msg_next_field(m, &off, &key, &p, &n) == 1)
		if (key == K_ADVICE)
			fprintf(out, "    → %.*s\n", (int)n, (const char *)p);
	return 0;
}

/* A member "name=value": the name, the group it belongs to ("from" of
 * "from[]", "values" of "values.n0": kind '[' or '.'), the value. */
struct member {
	struct str name, group, value;
	char kind;                  /* 0, '[' or '.' */
	bool number;
};

static bool member_of(uint16_t key, const uint8_t *p, size_t n, struct member *mb)
{
	const char *s = (const char *)p, *eq = memchr(s, '=', n);
	const char *dot;

	if ((key != K_NUM && key != K_ATTR) || !eq)
		return false;
	memset(mb, 0, sizeof(*mb));
	mb->name = (struct str){ s, (size_t)(eq - s) };
	mb->value = (struct str){ eq + 1, n - (size_t)(eq - s) - 1 };
	mb->number = key == K_NUM;
	mb->group = mb->name;
	if (mb->name.n > 2 && memcmp(mb->name.p + mb->name.n - 2, "[]", 2) == 0) {
		mb->kind = '[';
		mb->group.n -= 2;
	} else if ((dot = memchr(mb->name.p, '.', mb->name.n)) != NULL) {
		mb->kind = '.';
		mb->group.n = (size_t)(dot - mb->name.p);
		mb->name = (struct str){ dot + 1, mb->name.n - mb->group.n - 1 };
	}
	return true;
}


static bool same(struct str a, struct str b)
{
	return a.n == b.n && memcmp(a.p, b.p, a.n) == 0;
}

/* A JSON number as %g writes one, or true/false; the span is not
 * NUL-terminated, so it is read from a copy. */
static bool is_number(struct str v)
{
	char buf[64], *end;

	if (same(v, (struct str){ "true", 4 }) || same(v, (struct str){ "false", 5 }))
		return true;
	if (!v.n || v.n >= sizeof(buf) || !memchr("0123456789-", v.p[0], 11))
		return false;
	memcpy(buf, v.p, v.n);
	buf[v.n] = '\0';
	strtod(buf, &end);
	return *end == '\0' && !strpbrk(buf, "xXnNiI") && buf[v.n - 1] >= '0' && buf[v.n - 1] <= '9';
}

static void value(FILE *f, const struct member *mb)
{
	/* The daemon formats numbers; anything else is shown as a string. */
	if (mb->number && is_number(mb->value))
		put(f, mb->value);
	else
		cli_json_string(f, mb->value.p, mb->value.n);
}

void cli_check_json(FILE *out, const struct msg *m, const char *event)
{
	struct cli_json j;
	struct str s;
	uint64_t code = 1;
	size_t off = 0, n;
	const uint8_t *p;
	uint16_t key;

	msg_get_u64(m, K_CODE, &code);
	cli_json_begin(&j, out, event);
	s = field(m, K_CHECK);
	cli_json_strn(&j, "check", s.p, s.n);
	s = field(m, K_SUBJECT);
	cli_json_strn(&j, "subject", s.p, s.n);
	cli_json_key(&j, "ok", 2);
	fputs(code ? "false" : "true", out);
	s = field(m, K_TEXT);
	cli_json_strn(&j, "text", s.p, s.n);
	s = field(m, K_ADVICE);
	if (s.n)
		cli_json_strn(&j, "advice", s.p, s.n);
	while (msg_next_field(m, &off, &key, &p, &n) == 1) {
		struct member mb, other;
		size_t before = 0, at = off, k;
		bool seen = false, first = true;

		if (!member_of(key, p, n, &mb))
			continue;
		if (!mb.kind) {
			cli_json_key(&j, mb.name.p, mb.name.n);
			value(out, &mb);
			continue;
		}
		/* A group is written whole where its first member stands. */
		while (before < off && msg_next_field(m, &before, &key, &p, &k) == 1 && before < off)
			if (member_of(key, p, k, &other) && other.kind == mb.kind &&
			    same(other.group, mb.group))
				seen = true;
		if (seen)
			continue;
		cli_json_key(&j, mb.group.p, mb.group.n);
		fputc(mb.kind == '[' ? '[' : '{', out);
		at = 0;
		while (msg_next_field(m, &at, &key, &p, &k) == 1) {
			if (!member_of(key, p, k, &other) || other.kind != mb.kind ||
			    !same(other.group, mb.group))
				continue;
			if (!first)
				fputc(',', out);
			first = false;
			if (mb.kind == '.') {
				cli_json_string(out, other.name.p, other.name.n);
				fputc(':', out);
			}
			value(out, &other);
		}
		fputc(mb.kind == '[' ? ']' : '}', out);
	}
	cli_json_end(&j);
}

/* The node names of a matrix (K_HOLDER) and its cells (K_VALUE). */
static size_t gather(const struct msg *m, uint16_t want, struct str *v, size_t cap)
{
	size_t off = 0, n, k = 0;
	const uint8_t *p;
	uint16_t key;

	while (msg_next_field(m, &off, &key, &p, &n) == 1)
		if (key == want) {
			if (k < cap)
				v[k] = (struct str){ (const char *)p, n };
			k++;
		}
	return k;
}

static struct str unit_of(const struct msg *m)
{
	size_t off = 0, n;
	const uint8_t *p;
	uint16_t key;

	while (msg_next_field(m, &off, &key, &p, &n) == 1)
		if (key == K_ATTR && n > 5 && memcmp(p, "unit=", 5) == 0)
			return (struct str){ (const char *)p + 5, n - 5 };
	return (struct str){ "", 0 };
}

#define MATRIX_SHOWN 16        /* nodes shown in a terminal; --json has the frame's all */

int cli_matrix_human(FILE *out, const struct msg *m)
{
	size_t nn = gather(m, K_HOLDER, NULL, 0), nc = gather(m, K_VALUE, NULL, 0), shown;
	struct str *names, *cells, name = field(m, K_NAME), unit = unit_of(m);
	int w = 6;

	if (!nn || nc != nn * nn)
		return 0;
	names = calloc(nn, sizeof(*names));
	cells = calloc(nc, sizeof(*cells));
	if (!names || !cells) {
		free(names);
		free(cells);
		return -ENOMEM;
	}
	gather(m, K_HOLDER, names, nn);
	gather(m, K_VALUE, cells, nc);
	shown = nn < MATRIX_SHOWN ? nn : MATRIX_SHOWN;
	for (size_t i = 0; i < shown; i++)
		w = (int)names[i].n > w ? (int)names[i].n : w;
	for (size_t i = 0; i < shown * nn; i++)
		w = (int)cells[i].n > w ? (int)cells[i].n : w;
	fprintf(out, "\n%.*s (%.*s, row to column)%s\n", (int)name.n, name.p, (int)unit.n, unit.p,
		shown < nn ? " - the first nodes; --json has all" : "");
	fprintf(out, "%*s", w + 2, "");
	for (size_t c = 0; c < shown; c++)
		fprintf(out, " %*.*s", w, (int)names[c].n, names[c].p);
	fputc('\n', out);
	for (size_t r = 0; r < shown; r++) {
		fprintf(out, "  %-*.*s", w, (int)names[r].n, names[r].p);
		for (size_t c = 0; c < shown; c++) {
			struct str v = cells[r * nn + c];

			if (r == c)
				fprintf(out, " %*s", w, "·");
			else
				fprintf(out, " %*.*s", w, (int)v.n, v.p);
		}
		fputc('\n', out);
	}
	free(names);
	free(cells);
	return 0;
}

void cli_matrix_json(FILE *out, const struct msg *m, const char *event)
{
	size_t nn = gather(m, K_HOLDER, NULL, 0), nc = gather(m, K_VALUE, NULL, 0);
	struct str *names = calloc(nn + 1, sizeof(*names)), *cells = calloc(nc + 1, sizeof(*cells));
	struct str s;
	struct cli_json j;

	if (!names || !cells || nc != nn * nn) {
		free(names);
		free(cells);
		return;
	}
	gather(m, K_HOLDER, names, nn);
	gather(m, K_VALUE, cells, nc);
	cli_json_begin(&j, out, event);
	s = field(m, K_NAME);
	cli_json_strn(&j, "name", s.p, s.n);
	s = unit_of(m);
	cli_json_strn(&j, "unit", s.p, s.n);
	cli_json_key(&j, "nodes", 5);
	fputc('[', out);
	for (size_t i = 0; i < nn; i++) {
		if (i)
			fputc(',', out);
		cli_json_string(out, names[i].p, names[i].n);
	}
	fputc(']', out);
	cli_json_key(&j, "cells", 5);
	fputc('[', out);
	for (size_t r = 0; r < nn; r++) {
		fputs(r ? ",[" : "[", out);
		for (size_t c = 0; c < nn; c++) {
			if (c)
				fputc(',', out);
			cli_json_string(out, cells[r * nn + c].p, cells[r * nn + c].n);
		}
		fputc(']', out);
	}
	fputc(']', out);
	cli_json_end(&j);
	free(names);
	free(cells);
}
