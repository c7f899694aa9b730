/* verify --cluster's copy groups (MSG_CELLS, common/proto.h) rendered: a
 * table of origin x holder for a person, one JSON object per group for a
 * script. The names come from other nodes: unprintable bytes print as '?',
 * and a table shows at most CELLS_MAX origins and holders. */
#include "client/cli_cells.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client/cli_json.h"
#include "common/hosts.h"

struct span {
	const char *p;
	size_t n;
};

static bool span_eq(struct span a, struct span b)
{
	return a.n == b.n && memcmp(a.p, b.p, a.n) == 0;
}

#define CELLS_MAX 256               /* origins, and holders, a table shows */

/* One copy group (common/proto.h). A string the group lacks has p NULL. */
struct copy_group {
	size_t at, end;             /* offsets of its K_ORIGIN and past its last field */
	struct span origin, holder, state, step, root;
	uint64_t files, bytes;
	bool has_files, has_bytes;
};

static void set_u64(uint64_t *v, bool *has, const uint8_t *p, size_t n)
{
	if (n == 8 && !*has) {
		*v = proto_get_le64(p);
		*has = true;
	}
}

/* Within a group the first of a key counts, as msg_get_* has it for a
 * frame; keys this client does not know are skipped (the protocol grows). */
static void group_field(struct copy_group *g, uint16_t key, const uint8_t *p, size_t n)
{
	struct span *s;

	switch (key) {
	case K_HOLDER:
		s = &g->holder;
		break;
	case K_STATE:
		s = &g->state;
		break;
	case K_STEP:
		s = &g->step;
		break;
	case K_ROOT:
		s = &g->root;
		break;
	case K_FILES_TOTAL:
		set_u64(&g->files, &g->has_files, p, n);
		return;
	case K_BYTES_TOTAL:
		set_u64(&g->bytes, &g->has_bytes, p, n);
		return;
	default:
		return;
	}
	if (!s->p)
		*s = (struct span){ (const char *)p, n };
}

/* The group at or after *off; *off moves past it. Fields before the first
 * K_ORIGIN belong to no group and are skipped. False after the last. */
static bool next_group(const struct msg *m, size_t *off, struct copy_group *g)
{
	uint16_t key;
	const uint8_t *p;
	size_t n, at;

	memset(g, 0, sizeof(*g));
	do {
		at = *off;
		if (msg_next_field(m, off, &key, &p, &n) != 1)
			return false;
	} while (key != K_ORIGIN);
	g->at = at;
	g->origin = (struct span){ (const char *)p, n };
	for (;;) {
		at = *off;
		if (msg_next_field(m, off, &key, &p, &n) != 1)
			break;
		if (key == K_ORIGIN) {
			*off = at;
			break;
		}
		group_field(g, key, p, n);
	}
	g->end = *off;
	return true;
}

/* The group's K_TEXTs in turn; *off starts at g->at. */
static bool next_text(const struct msg *m, const struct copy_group *g, size_t *off,
		      struct span *text)
{
	uint16_t key;
	const uint8_t *p;
	size_t n;

	while (*off < g->end && msg_next_field(m, off, &key, &p, &n) == 1)
		if (key == K_TEXT) {
			*text = (struct span){ (const char *)p, n };
			return true;
		}
	return false;
}

static void json_span(struct cli_json *j, const char *key, struct span s)
{
	if (s.p)
		cli_json_strn(j, key, s.p, s.n);
}

/* One frame, many objects: one per group, its K_TEXTs as an array. */
void cli_cells_json(FILE *out, const struct msg *m, const char *event)
{
	struct copy_group g;
	struct cli_json j;
	struct span text;
	size_t off = 0, t, count;

	while (next_group(m, &off, &g)) {
		cli_json_begin(&j, out, event);
		json_span(&j, "origin", g.origin);
		json_span(&j, "holder", g.holder);
		json_span(&j, "state", g.state);
		json_span(&j, "step", g.step);
		json_span(&j, "root", g.root);
		if (g.has_files)
			cli_json_u64(&j, "files", g.files);
		if (g.has_bytes)
			cli_json_u64(&j, "bytes", g.bytes);
		for (t = g.at, count = 0; next_text(m, &g, &t, &text); count++) {
			if (!count)
				cli_json_key(&j, "detail", strlen("detail"));
			fputc(count ? ',' : '[', j.f);
			cli_json_string(j.f, text.p, text.n);
		}
		if (count)
			fputc(']', j.f);
		cli_json_end(&j);
	}
}

/* The table: rows are the origins, columns the holders, each in the order
 * first seen. A hostile frame can name thousands: CELLS_MAX of each are
 * shown, which also bounds the cell index below (256 KiB). */
struct cells {
	struct span origins[CELLS_MAX], holders[CELLS_MAX];
	size_t norigins, nholders;
	bool more;                  /* some name did not fit */
	bool down[CELLS_MAX];       /* the holder has a group of its own saying "unreachable" */
	/* 1 + offset of the first group of (origin, holder), 0: none. A payload
	 * is at most PROTO_MAX_PAYLOAD, so an offset fits. */
	uint32_t at[CELLS_MAX][CELLS_MAX];
	size_t width[1 + CELLS_MAX];        /* [0]: the origins' column */
};

static const struct span SPAN_UNKNOWN = { "?", 1 };

static bool span_is(struct span s, const char *lit)
{
	return s.p && span_eq(s, (struct span){ lit, strlen(lit) });
}

/* Names are bytes from other nodes: they reach the terminal printable. */
static void put_clean(FILE *f, struct span s)
{
	for (size_t i = 0; i < s.n; i++)
		fputc(s.p[i] >= 0x20 && s.p[i] < 0x7f ? s.p[i] : '?', f);
}

/* The index of name in v[0..n), or SIZE_MAX. */
static size_t find_name(const struct span *v, size_t n, struct span name)
{
	for (size_t i = 0; i < n; i++)
		if (span_eq(v[i], name))
			return i;
	return SIZE_MAX;
}

/* The index of name, appended if new and there is room; else SIZE_MAX. */
static size_t add_name(struct span *v, size_t *n, struct span name, bool *more)
{
	size_t i = find_name(v, *n, name);

	if (i != SIZE_MAX)
		return i;
	if (*n == CELLS_MAX) {
		*more = true;
		return SIZE_MAX;
	}
	v[*n] = name;
	return (*n)++;
}

static void cells_collect(struct cells *c, const struct msg *m)
{
	struct copy_group g;
	size_t off = 0, row, col;

	while (next_group(m, &off, &g)) {
		if (!g.holder.p)
			continue;       /* belongs to no column */
		row = g.origin.n ? add_name(c->origins, &c->norigins, g.origin, &c->more) : SIZE_MAX;
		col = add_name(c->holders, &c->nholders, g.holder, &c->more);
		if (col == SIZE_MAX)
			continue;
		if (!g.origin.n)
			c->down[col] |= span_is(g.state, "unreachable");
		else if (row != SIZE_MAX && !c->at[row][col])
			c->at[row][col] = (uint32_t)g.at + 1;
	}
}

/* The durable tier's column last, after every node's, wherever its first
 * group came. */
static void durable_last(struct cells *c)
{
	size_t d = find_name(c->holders, c->nholders, (struct span){ HOLD_DURABLE,
							       strlen(HOLD_DURABLE) });

	if (d == SIZE_MAX)
		return;
	for (size_t col = d; col + 1 < c->nholders; col++) {
		struct span h = c->holders[col];
		bool down = c->down[col];

		c->holders[col] = c->holders[col + 1];
		c->holders[col + 1] = h;
		c->down[col] = c->down[col + 1];
		c->down[col + 1] = down;
		for (size_t row = 0; row < c->norigins; row++) {
			uint32_t at = c->at[row][col];

			c->at[row][col] = c->at[row][col + 1];
			c->at[row][col + 1] = at;
		}
	}
}

/* A cell: the state, but the step held for "other-step" (more use than the
 * word), and "?" where the holder could not be asked. */
static struct span cell_text(const struct cells *c, const struct msg *m, size_t row, size_t col)
{
	struct copy_group g;
	size_t off;

	if (!c->at[row][col])
		return c->down[col] ? SPAN_UNKNOWN : (struct span){ "-", 1 };
	off = c->at[row][col] - 1;
	next_group(m, &off, &g);
	if (span_is(g.state, "other-step") && g.step.n)
		return g.step;
	if (span_is(g.state, "unreachable") || !g.state.n)
		return SPAN_UNKNOWN;
	return g.state;
}

static void cells_widths(struct cells *c, const struct msg *m)
{
	c->width[0] = strlen("ORIGIN");
	for (size_t row = 0; row < c->norigins; row++)
		if (c->origins[row].n > c->width[0])
			c->width[0] = c->origins[row].n;
	for (size_t col = 0; col < c->nholders; col++) {
		size_t *w = &c->width[1 + col];

		*w = c->holders[col].n;
		for (size_t row = 0; row < c->norigins; row++) {
			size_t n = cell_text(c, m, row, col).n;

			if (n > *w)
				*w = n;
		}
	}
}

/* A cell padded to its column's width plus two; the padding is written
 * only before a cell that shows something, so no line ends in spaces. */
static void put_cell(FILE *f, struct span s, size_t width, size_t *pending)
{
	if (!s.n) {
		*pending += width + 2;
		return;
	}
	fprintf(f, "%*s", (int)*pending, "");
	put_clean(f, s);
	*pending = width + 2 - s.n;
}

static void cells_table(FILE *f, const struct msg *m, struct cells *c)
{
	size_t pending = 0;

	cells_widths(c, m);
	put_cell(f, (struct span){ "ORIGIN", strlen("ORIGIN") }, c->width[0], &pending);
	for (size_t col = 0; col < c->nholders; col++)
		put_cell(f, c->holders[col], c->width[1 + col], &pending);
	fputc('\n', f);
	for (size_t row = 0; row < c->norigins; row++) {
		pending = 0;
		put_cell(f, c->origins[row], c->width[0], &pending);
		for (size_t col = 0; col < c->nholders; col++)
			put_cell(f, cell_text(c, m, row, col), c->width[1 + col], &pending);
		fputc('\n', f);
	}
}

static int span_cmp(const void *pa, const void *pb)
{
	const struct span *a = pa, *b = pb;

	if (a->n != b->n)
		return a->n < b->n ? -1 : 1;
	return a->n ? memcmp(a->p, b->p, a->n) : 0;
}

static size_t count_distinct(struct span *v, size_t n)
{
	size_t count = n ? 1 : 0;

	qsort(v, n, sizeof(*v), span_cmp);
	for (size_t i = 1; i < n; i++)
		count += !span_eq(v[i], v[i - 1]);
	return count;
}

/* How many names the table left out. Sorted rather than looked up one by
 * one: a frame of thousands of names must not cost their square. */
static int cells_hidden(const struct msg *m, const struct cells *c, size_t *hidden)
{
	struct copy_group g;
	struct span *v;
	size_t off = 0, n = 0;

	while (next_group(m, &off, &g))
		n++;
	v = malloc(n * sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (off = 0, n = 0; next_group(m, &off, &g);)
		if (g.holder.p && g.origin.n)
			v[n++] = g.origin;
	*hidden = count_distinct(v, n) - c->norigins;
	for (off = 0, n = 0; next_group(m, &off, &g);)
		if (g.holder.p)
			v[n++] = g.holder;
	*hidden += count_distinct(v, n) - c->nholders;
	free(v);
	return 0;
}

/* "  ORIGIN on HOLDER: STATE: TEXT" per finding, or "  HOLDER: STATE:
 * TEXT" for a holder as a whole; only for the groups the table shows. */
static void cells_details(FILE *f, const struct msg *m, const struct cells *c)
{
	struct copy_group g;
	struct span text;
	size_t off = 0, t;

	while (next_group(m, &off, &g)) {
		if (!g.holder.p || find_name(c->holders, c->nholders, g.holder) == SIZE_MAX ||
		    (g.origin.n && find_name(c->origins, c->norigins, g.origin) == SIZE_MAX))
			continue;
		for (t = g.at; next_text(m, &g, &t, &text);) {
			fputs("  ", f);
			if (g.origin.n) {
				put_clean(f, g.origin);
				fputs(" on ", f);
			}
			put_clean(f, g.holder);
			fputs(": ", f);
			put_clean(f, g.state.n ? g.state : SPAN_UNKNOWN);
			fputs(": ", f);
			put_clean(f, text);
			fputc('\n', f);
		}
	}
}

int cli_cells_human(FILE *out, const struct msg *m)
{
	struct cells *c = calloc(1, sizeof(*c));
	size_t hidden;
	int rc = 0;

	if (!c)
		return -ENOMEM;
	cells_collect(c, m);
	durable_last(c);
	/* Holders alone, none of them holding anything: the details say why. */
	if (c->norigins)
		cells_table(out, m, c);
	if (c->more && (rc = cells_hidden(m, c, &hidden)) == 0)
		fprintf(out, "  (%zu more not shown)\n", hidden);
	if (rc == 0)
		cells_details(out, m, c);
	free(c);
	return rc;
}
