/* Slurm hostlist expressions (the syntax and how it differs from Slurm:
 * hostlist.h).
 *
 * Two steps. Parsing reads the whole expression into items (text, groups,
 * ranges) and checks everything that can be wrong with it, so a malformed
 * expression is -EINVAL however many names it would give, and no name is
 * made before the syntax is known good. Expanding then makes the names one
 * at a time, like an odometer (expand_item), and stops as soon as a bound is passed: the
 * work is bounded by max + HOSTLIST_REPEATS_MAX + 1 names, never by what
 * the ranges say.
 *
 * The names of one item differ only in their digits: the text around the
 * groups is the same in all of them and digits are always allowed, so
 * config_check_name can refuse one of them only for its length. Checking
 * the item's longest name therefore checks them all, at parse time.
 *
 * Repeats are found with a hash set of the names kept so far (open
 * addressing, at most half full), so a long list costs its length.
 */
#include "common/hostlist.h"
#include "common/config.h"
#include "common/why.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NUM_DIGITS_MAX 18       /* significant digits: the value fits in uint64_t */

struct range {
	uint64_t lo, hi;        /* lo <= hi */
	int width;              /* zero padding: the digits of lo as written */
};

struct group {
	const char *lit;        /* the text before its '[', in the expression */
	size_t litlen;
	size_t r0, nr;          /* its ranges: item.r[r0 .. r0 + nr), nr >= 1 */
	int widest;             /* digits of its widest number, padding included */
};

struct item {
	const char *s;          /* the item in the expression, len bytes, not terminated */
	size_t len;
	struct group *g;        /* owned; ng of them, 0 for a plain name */
	size_t ng, gcap;
	struct range *r;        /* owned; the ranges of every group */
	size_t nr, rcap;
	size_t maxlen;          /* bytes of its longest name */
};

struct nameset {
	char **v;               /* owned; the names kept, in order, each owned */
	size_t n, cap;
	size_t *slot;           /* owned; hash table of (index into v) + 1, 0 is empty */
	size_t nslot;           /* a power of two, >= 2 * n */
	size_t repeats;         /* names made that v already held */
};


static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

static int digits_of(uint64_t v)
{
	int d = 1;

	while (v >= 10) {
		v /= 10;
		d++;
	}
	return d;
}

static int grow(void **v, size_t *cap, size_t need, size_t size)
{
	size_t c = *cap ? *cap : 4;
	void *p;

	if (need <= *cap)
		return 0;
	while (c < need)
		c *= 2;
	p = realloc(*v, c * size);
	if (!p)
		return -ENOMEM;
	*v = p;
	*cap = c;
	return 0;
}

/* The digits [s, e) as a number; -ERANGE past NUM_DIGITS_MAX significant
 * digits (leading zeros only pad). */
static int parse_num(const char *s, const char *e, uint64_t *v)
{
	uint64_t x = 0;
	int sig = 0;

	for (; s < e; s++) {
		if (x || *s != '0')
			sig++;
		if (sig > NUM_DIGITS_MAX)
			return -ERANGE;
		x = x * 10 + (uint64_t)(*s - '0');
	}
	*v = x;
	return 0;
}

/* One element of a bracket list, [s, e): NUM or LO-HI. */
static int parse_range(struct item *it, const char *s, const char *e, char *why, size_t whylen)
{
	const char *dash = memchr(s, '-', (size_t)(e - s));
	const char *lo_end = dash ? dash : e;
	char qi[WHY_QUOTE_MAX + 1], qe[WHY_QUOTE_MAX + 1];
	struct range r;
	bool ok = s < lo_end && (!dash || dash + 1 < e);        /* "[1-]": Slurm reads 1 */

	for (const char *p = s; ok && p < e; p++)
		ok = is_digit(*p) || p == dash;
	if (!ok)
		return why_fail(why, whylen, -EINVAL, "'%s': '%s' is not a number or a range LO-HI",
			    why_quote(qi, it->s, it->len), why_quote(qe, s, (size_t)(e - s)));
	if (parse_num(s, lo_end, &r.lo) || (dash && parse_num(dash + 1, e, &r.hi)))
		return why_fail(why, whylen, -EINVAL, "'%s': '%s' has a number of more than %d digits",
			    why_quote(qi, it->s, it->len), why_quote(qe, s, (size_t)(e - s)), NUM_DIGITS_MAX);
	if (!dash)
		r.hi = r.lo;
	if (r.hi < r.lo)
		return why_fail(why, whylen, -EINVAL, "'%s': the range '%s' runs backwards",
			    why_quote(qi, it->s, it->len), why_quote(qe, s, (size_t)(e - s)));
	/* Not bigger than the item, which is not bigger than an int: split_items. */
	r.width = (int)(lo_end - s);
	if (grow((void **)&it->r, &it->rcap, it->nr + 1, sizeof(*it->r)))
		return why_fail(why, whylen, -ENOMEM, "out of memory");
	it->r[it->nr++] = r;
	return 0;
}

/* The group whose text starts at lit and whose list is [s, e), the inside
 * of its brackets. */
static int parse_group(struct item *it, const char *lit, const char *s, const char *e,
		       char *why, size_t whylen)
{
	struct group g = { .lit = lit, .litlen = (size_t)(s - 1 - lit), .r0 = it->nr };
	char qi[WHY_QUOTE_MAX + 1];
	int rc;

	if (s == e)
		return why_fail(why, whylen, -EINVAL, "'%s': nothing between '[' and ']'",
			    why_quote(qi, it->s, it->len));
	for (const char *p = s; p <= e;) {
		const char *c = memchr(p, ',', (size_t)(e - p));

		if (!c)
			c = e;
		if (c == p)
			return why_fail(why, whylen, -EINVAL, "'%s': an empty number in brackets",
				    why_quote(qi, it->s, it->len));
		rc = parse_range(it, p, c, why, whylen);
		if (rc)
			return rc;
		p = c + 1;
	}
	g.nr = it->nr - g.r0;
	for (size_t i = g.r0; i < it->nr; i++) {
		int w = digits_of(it->r[i].hi);

		if (it->r[i].width > w)
			w = it->r[i].width;
		if (w > g.widest)
			g.widest = w;
	}
	if (grow((void **)&it->g, &it->gcap, it->ng + 1, sizeof(*it->g)))
		return why_fail(why, whylen, -ENOMEM, "out of memory");
	it->g[it->ng++] = g;
	it->maxlen += g.litlen + (size_t)g.widest;
	return 0;
}

/* See the top: the longest name stands for all of the item's names. */
static int check_names(const struct item *it, char *why, size_t whylen)
{
	char *name = malloc(it->maxlen + 1), *o = name, qi[WHY_QUOTE_MAX + 1];
	const char *cwhy;
	int rc;

	if (!name)
		return why_fail(why, whylen, -ENOMEM, "out of memory");
	if (it->ng == 0) {
		memcpy(o, it->s, it->len);
		o += it->len;
	}
	for (size_t i = 0; i < it->ng; i++) {
		memcpy(o, it->g[i].lit, it->g[i].litlen);
		o += it->g[i].litlen;
		memset(o, '0', (size_t)it->g[i].widest);
		o += it->g[i].widest;
	}
	*o = '\0';
	rc = config_check_name(name, &cwhy);
	free(name);
	if (rc)
		return why_fail(why, whylen, -EINVAL, "'%s': %s", why_quote(qi, it->s, it->len), cwhy);
	return 0;
}

static int parse_item(struct item *it, char *why, size_t whylen)
{
	const char *p = it->s, *end = it->s + it->len;
	char qi[WHY_QUOTE_MAX + 1];
	int rc;

	while (p < end) {
		const char *open = memchr(p, '[', (size_t)(end - p)), *close;

		if (!open) {
			/* Slurm refuses it too, and a name ending in "]-ib" is rare. */
			if (it->ng)
				return why_fail(why, whylen, -EINVAL, "'%s': nothing may follow the last ']'",
					    why_quote(qi, it->s, it->len));
			it->maxlen = it->len;
			break;
		}
		close = memchr(open, ']', (size_t)(end - open));        /* split_items saw it */
		rc = parse_group(it, p, open + 1, close, why, whylen);
		if (rc)
			return rc;
		p = close + 1;
	}
	return check_names(it, why, whylen);
}

/* Cuts expr at the commas outside brackets; checks that every '[' has its
 * ']' within the item and that brackets do not nest. */
static int split_items(const char *expr, struct item **items, size_t *n, size_t *cap,
		       char *why, size_t whylen)
{
	const char *start = expr, *open = NULL;
	char q[WHY_QUOTE_MAX + 1];

	if (!*expr)
		return why_fail(why, whylen, -EINVAL, "an empty list");
	for (const char *p = expr;; p++) {
		size_t upto = (size_t)(p - start) + (*p ? 1 : 0);   /* the item so far, p's byte too */

		if (*p == '[' && open)
			return why_fail(why, whylen, -EINVAL, "'%s': '[' inside brackets", why_quote(q, start, upto));
		if (*p == '[')
			open = p;
		else if (*p == ']' && !open)
			return why_fail(why, whylen, -EINVAL, "'%s': ']' without '['", why_quote(q, start, upto));
		else if (*p == ']')
			open = NULL;
		else if (!*p && open)
			return why_fail(why, whylen, -EINVAL, "'%s': '[' without ']'", why_quote(q, start, upto));
		if (*p && (*p != ',' || open))
			continue;
		if (p == start && *n == 0)
			return why_fail(why, whylen, -EINVAL, "an empty name at the start of the list");
		if (p == start)
			return why_fail(why, whylen, -EINVAL, "an empty name after '%s'",
				    why_quote(q, (*items)[*n - 1].s, (*items)[*n - 1].len));
		if ((size_t)(p - start) > INT_MAX)
			return why_fail(why, whylen, -EINVAL, "'%s': an item of more than %d bytes",
				    why_quote(q, start, (size_t)(p - start)), INT_MAX);
		if (grow((void **)items, cap, *n + 1, sizeof(**items)))
			return why_fail(why, whylen, -ENOMEM, "out of memory");
		(*items)[(*n)++] = (struct item){ .s = start, .len = (size_t)(p - start) };
		if (!*p)
			return 0;
		start = p + 1;
	}
}

static uint64_t hash(const char *s)
{
	uint64_t h = 14695981039346656037ull;   /* FNV-1a */

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

static size_t *find_slot(const struct nameset *ns, const char *name)
{
	size_t mask = ns->nslot - 1, i = (size_t)hash(name) & mask;

	while (ns->slot[i] && strcmp(ns->v[ns->slot[i] - 1], name) != 0)
		i = (i + 1) & mask;
	return &ns->slot[i];
}

static int rehash(struct nameset *ns, size_t nslot)
{
	size_t *old = ns->slot, oldn = ns->nslot;

	ns->slot = calloc(nslot, sizeof(*ns->slot));
	if (!ns->slot) {
		ns->slot = old;
		return -ENOMEM;
	}
	ns->nslot = nslot;
	for (size_t i = 0; i < oldn; i++)
		if (old[i])
			*find_slot(ns, ns->v[old[i] - 1]) = old[i];
	free(old);
	return 0;
}

static void nameset_release(struct nameset *ns)
{
	hostlist_free(ns->v, ns->n);
	free(ns->slot);
}

/* Keeps name unless it is a repeat; it is the item's. */
static int nameset_add(struct nameset *ns, const char *name, size_t max, const struct item *it,
		       char *why, size_t whylen)
{
	size_t *slot = find_slot(ns, name);
	char q[WHY_QUOTE_MAX + 1];

	if (*slot) {
		if (++ns->repeats > HOSTLIST_REPEATS_MAX)
			return why_fail(why, whylen, -E2BIG, "'%s': more than %d names given twice",
				    why_quote(q, it->s, it->len), HOSTLIST_REPEATS_MAX);
		return 0;
	}
	if (ns->n >= max)
		return why_fail(why, whylen, -E2BIG, "'%s': more than %zu name%s",
			    why_quote(q, it->s, it->len), max, max == 1 ? "" : "s");
	if (grow((void **)&ns->v, &ns->cap, ns->n + 1, sizeof(*ns->v)))
		return why_fail(why, whylen, -ENOMEM, "out of memory");
	if (2 * (ns->n + 1) > ns->nslot) {
		if (rehash(ns, 2 * ns->nslot))
			return why_fail(why, whylen, -ENOMEM, "out of memory");
		slot = find_slot(ns, name);
	}
	ns->v[ns->n] = strdup(name);
	if (!ns->v[ns->n])
		return why_fail(why, whylen, -ENOMEM, "out of memory");
	*slot = ++ns->n;
	return 0;
}

/* The k-th group to turn, fastest first, in Slurm's order (hostlist.h):
 * the last group, then the first, the second, ... the one before the last.
 * (Slurm expands the last group as a range and the others by recursing on
 * the text before it, each time on its last remaining '['.) */
static size_t turn(size_t k, size_t ng)
{
	return k == 0 ? ng - 1 : k - 1;
}

/* Every name of the item, like an odometer whose wheels are in turn's
 * order. */
static int expand_item(struct nameset *ns, const struct item *it, size_t max, char *why, size_t whylen)
{
	char *name = malloc(it->maxlen + 1);
	size_t *ri = calloc(it->ng + 1, sizeof(*ri));           /* each group's range... */
	uint64_t *v = calloc(it->ng + 1, sizeof(*v));           /* ...and number in it */
	int rc = 0;

	if (!name || !ri || !v) {
		rc = why_fail(why, whylen, -ENOMEM, "out of memory");
		goto out_free;
	}
	if (it->ng == 0) {
		memcpy(name, it->s, it->len);
		name[it->len] = '\0';
		rc = nameset_add(ns, name, max, it, why, whylen);
		goto out_free;
	}
	for (size_t g = 0; g < it->ng; g++)
		v[g] = it->r[it->g[g].r0].lo;
	for (bool more = true; more && rc == 0;) {
		char *o = name;

		for (size_t g = 0; g < it->ng; g++) {
			const struct range *r = &it->r[it->g[g].r0 + ri[g]];

			memcpy(o, it->g[g].lit, it->g[g].litlen);
			o += it->g[g].litlen;
			/* At most widest digits: maxlen counted them. */
			o += sprintf(o, "%0*" PRIu64, r->width, v[g]);
		}
		rc = nameset_add(ns, name, max, it, why, whylen);
		more = false;
		for (size_t k = 0; k < it->ng && !more; k++) {
			size_t g = turn(k, it->ng);
			const struct group *gr = &it->g[g];

			more = true;
			if (v[g] < it->r[gr->r0 + ri[g]].hi)
				v[g]++;
			else if (++ri[g] < gr->nr)
				v[g] = it->r[gr->r0 + ri[g]].lo;
			else {
				ri[g] = 0;
				v[g] = it->r[gr->r0].lo;
				more = false;   /* carry into the next wheel */
			}
		}
	}
out_free:
	free(v);
	free(ri);
	free(name);
	return rc;
}

int hostlist_expand(const char *expr, size_t max, char ***names, size_t *n, char *why, size_t whylen)
{
	struct nameset ns = { .nslot = 16 };
	struct item *items = NULL;
	size_t nitems = 0, icap = 0;
	int rc;

	*names = NULL;
	*n = 0;
	if (why && whylen)
		why[0] = '\0';
	rc = split_items(expr, &items, &nitems, &icap, why, whylen);
	for (size_t i = 0; rc == 0 && i < nitems; i++)
		rc = parse_item(&items[i], why, whylen);
	if (rc)
		goto out_items;
	ns.slot = calloc(ns.nslot, sizeof(*ns.slot));
	if (!ns.slot) {
		rc = why_fail(why, whylen, -ENOMEM, "out of memory");
		goto out_items;
	}
	for (size_t i = 0; rc == 0 && i < nitems; i++)
		rc = expand_item(&ns, &items[i], max, why, whylen);
	if (rc) {
		nameset_release(&ns);
		goto out_items;
	}
	free(ns.slot);
	*names = ns.v;
	*n = ns.n;
out_items:
	for (size_t i = 0; i < nitems; i++) {
		free(items[i].g);
		free(items[i].r);
	}
	free(items);
	return rc;
}

void hostlist_free(char **names, size_t n)
{
	if (!names)
		return;
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}
