/* verify --cluster: ask, decide, show.
 *
 * Which nodes wrote shards for the step? Nobody keeps a list of a job's
 * ranks, so the answers tell: every origin any node holds anything of the
 * job from (its own directory, or a replica, of this step or another) took
 * part in the job, and must have this step too. A node that has nothing of
 * the job anywhere is not part of it.
 *
 * The step verifies (exit 0) when every such origin's own copy is intact,
 * every copy placement puts on a partner is there and intact, and all copies
 * of an origin's shards have the same root digest. Anything less is exit 1,
 * with one line per reason, and a word on whether `stage restore` can repair
 * it (every origin has an intact copy somewhere) or not. A node that cannot
 * be asked leaves its copies unknown, so the step cannot verify; the result
 * says what the other nodes' copies still allow.
 */
#include "daemon/survey/survey.h"
#include "daemon/survey/cverify.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hostlist.h"
#include "common/hosts.h"
#include "common/log.h"
#include "daemon/ckpt/ckpt.h"

#define PLACE_MAX 64

/* The input with two indices, so that a lookup costs log N, not a scan:
 * at 256 nodes the scans (origin x holder x cell) were a fifth of the
 * asking node's CPU, and they grow as N cubed. */
struct dc {
	const struct cverify_in *in;
	size_t *cell;              /* cells' indices by (origin, holder) */
	size_t ncells;             /* of them: 0 in a names-only index */
	size_t *name;              /* names' indices by name */
};

static int by_cell(const void *a, const void *b, void *arg)
{
	const struct cverify_in *in = arg;
	size_t i = *(const size_t *)a, j = *(const size_t *)b;
	int c = strcmp(in->cells[i].origin, in->cells[j].origin);

	if (c == 0)
		c = strcmp(in->cells[i].holder, in->cells[j].holder);
	/* ties in input order: "the first" stays the first the answers gave */
	return c ? c : (i > j) - (i < j);
}

static int by_name(const void *a, const void *b, void *arg)
{
	const struct cverify_in *in = arg;

	return strcmp(in->names[*(const size_t *)a], in->names[*(const size_t *)b]);
}

/* with_cells false: the names' index only (cells not yet checked for
 * NULL fields). */
static int dc_open(struct dc *d, const struct cverify_in *in, bool with_cells)
{
	size_t ncells = with_cells ? in->ncells : 0;

	d->in = in;
	d->ncells = ncells;
	d->cell = calloc(ncells + 1, sizeof(*d->cell));
	d->name = calloc(in->nnodes + 1, sizeof(*d->name));
	if (!d->cell || !d->name) {
		free(d->cell);
		free(d->name);
		return -ENOMEM;
	}
	for (size_t i = 0; i < ncells; i++)
		d->cell[i] = i;
	for (size_t i = 0; i < in->nnodes; i++)
		d->name[i] = i;
	qsort_r(d->cell, ncells, sizeof(*d->cell), by_cell, (void *)in);
	qsort_r(d->name, in->nnodes, sizeof(*d->name), by_name, (void *)in);
	return 0;
}

static void dc_close(struct dc *d)
{
	free(d->cell);
	free(d->name);
}

/* The first position in d->cell whose cell is not before (origin, holder);
 * holder NULL: the first of origin's cells. */
static size_t lower(const struct dc *d, const char *origin, const char *holder)
{
	size_t lo = 0, hi = d->ncells;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct hold_cell *c = &d->in->cells[d->cell[mid]];
		int k = strcmp(c->origin, origin);

		if (k == 0)
			k = holder ? strcmp(c->holder, holder) : 1;
		if (k < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The cell at sorted position i, if it is origin's; else NULL. */
static const struct hold_cell *origin_at(const struct dc *d, size_t i, const char *origin)
{
	const struct hold_cell *c;

	if (i >= d->ncells)
		return NULL;
	c = &d->in->cells[d->cell[i]];
	return strcmp(c->origin, origin) == 0 ? c : NULL;
}

static bool has_origin(const struct dc *d, const char *origin)
{
	return origin_at(d, lower(d, origin, NULL), origin) != NULL;
}

__attribute__((format(printf, 2, 3)))
static int problem(struct cverify_out *o, const char *fmt, ...)
{
	char **v = realloc(o->problems, (o->nproblems + 2) * sizeof(*v));
	va_list ap;
	int n;

	if (!v)
		return -ENOMEM;
	o->problems = v;
	va_start(ap, fmt);
	n = vasprintf(&v[o->nproblems], fmt, ap);
	va_end(ap);
	if (n < 0) {
		v[o->nproblems] = NULL;
		return -ENOMEM;
	}
	v[++o->nproblems] = NULL;
	return 0;
}

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

/* Appends a copy of c to the table, with another state and a text first
 * when given. */
static int push(struct cverify_out *o, const struct hold_cell *c, const char *state,
		const char *text)
{
	struct hold_cell *v = realloc(o->table, (o->ntable + 1) * sizeof(*v)), *d;

	if (!v)
		return -ENOMEM;
	o->table = v;
	d = &v[o->ntable++];
	memset(d, 0, sizeof(*d));
	d->origin = dup_or_null(c->origin);
	d->holder = dup_or_null(c->holder);
	d->state = strdup(state ? state : c->state);
	d->step = dup_or_null(c->step);
	d->has_root = c->has_root;
	d->root = c->root;
	d->files = c->files;
	d->bytes = c->bytes;
	if (text && d->ntext < COPY_TEXTS_MAX && (d->text[d->ntext] = strdup(text)))
		d->ntext++;
	for (unsigned i = 0; i < c->ntext && d->ntext < COPY_TEXTS_MAX; i++)
		if ((d->text[d->ntext] = strdup(c->text[i])))
			d->ntext++;
	return d->origin && d->holder && d->state ? 0 : -ENOMEM;
}

static const struct hold_cell *find(const struct dc *d, const char *origin, const char *holder)
{
	size_t i = lower(d, origin, holder);
	const struct hold_cell *c = origin_at(d, i, origin);

	return c && strcmp(c->holder, holder) == 0 ? c : NULL;
}

/* The index of node name among those asked, or nnodes. */
static size_t node_index(const struct dc *d, const char *name)
{
	size_t lo = 0, hi = d->in->nnodes;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int k = strcmp(d->in->names[d->name[mid]], name);

		if (k == 0)
			return d->name[mid];
		if (k < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return d->in->nnodes;
}

static bool at_step(const struct cverify_in *in, const struct hold_cell *c)
{
	return c->step && strcmp(c->step, in->step) == 0 && strcmp(c->state, "other-step") != 0;
}

/* The root the copies of origin are held to: its own copy's, else the
 * intact copy the answers gave first. */
static bool ref_root(const struct dc *d, const char *origin, digest_t *root, const char **where)
{
	const struct cverify_in *in = d->in;
	const struct hold_cell *own = find(d, origin, origin), *c, *best = NULL;

	if (own && at_step(in, own) && own->has_root) {
		*root = own->root;
		*where = origin;
		return true;
	}
	for (size_t i = lower(d, origin, NULL); (c = origin_at(d, i, origin)) != NULL; i++)
		if (at_step(in, c) && c->has_root && strcmp(c->state, "ok") == 0 &&
		    (!best || c < best))
			best = c;
	if (!best)
		return false;
	*root = best->root;
	*where = best->holder;
	return true;
}

/* The problem a copy in a state other than ok makes, if it makes one. */
static int copy_problem(struct cverify_out *o, const struct cverify_in *in,
			const struct hold_cell *c, const char *state, bool own, bool expected)
{
	const char *origin = c->origin, *holder = c->holder;

	if (strcmp(state, "other-step") == 0) {
		if (own)
			return problem(o, "%s has no %s (its latest checkpoint of the job is %s)",
				       origin, in->step, c->step);
		return expected ? problem(o, "%s holds %s of %s, not %s", holder, c->step, origin,
					  in->step) : 0;
	}
	if (strcmp(state, "missing") == 0)
		return own ? problem(o, "%s has no checkpoint %s", origin, in->step)
			   : problem(o, "%s holds no copy of %s's %s (placement puts one there)",
				     holder, origin, in->step);
	if (own)
		return problem(o, "%s's own copy of %s is %s%s%s", origin, in->step, state,
			       c->ntext ? ": " : "", c->ntext ? c->text[0] : "");
	return problem(o, "the copy of %s's %s on %s is %s%s%s", origin, in->step, holder, state,
		       c->ntext ? ": " : "", c->ntext ? c->text[0] : "");
}

/* What origin's own copy says of its copy to holder (a K_COPY note), if
 * it says anything: the copy is queued, being sent, skipped or given up,
 * rather than lost. */
static bool origin_note(const struct dc *d, const char *origin, const char *holder,
			struct copy_note *n, const char **text)
{
	const struct hold_cell *own = find(d, origin, origin);

	if (!own || !at_step(d->in, own))
		return false;
	for (unsigned i = 0; i < own->ncopy; i++)
		if (copy_note_parse(own->copy[i], n) == 0 && strcmp(n->node, holder) == 0) {
			*text = own->copy[i] + strlen(holder) + 1;
			return true;
		}
	return false;
}

/* The problem of a copy the origin has not sent to holder yet, or will
 * not: named by the origin's note, and counted for the result's advice. */
static int noted_problem(struct cverify_out *o, const struct cverify_in *in, const char *origin,
			 const char *holder, const struct copy_note *n)
{
	const char *sep = n->why ? ": " : "", *why = n->why ? n->why : "";
	const char *lpar = n->why ? " (" : "", *rpar = n->why ? ")" : "";

	o->noted++;
	if (strcmp(n->state, COPY_SKIPPED) == 0)
		return problem(o, "%s holds no copy of %s's %s: %s skipped it%s%s ([transfer] stale)",
			       holder, origin, in->step, origin, sep, why);
	if (strcmp(n->state, COPY_FAILED) == 0)
		return problem(o, "%s holds no copy of %s's %s: %s gave up sending it%s%s", holder,
			       origin, in->step, origin, sep, why);
	/* A copy queued after a failed try may fail again: not "on its way". */
	o->on_way += strcmp(n->state, COPY_SENDING) == 0 || !n->why;
	if (strcmp(n->state, COPY_SENDING) == 0)
		return problem(o, "%s holds no copy of %s's %s yet: %s is sending it%s%s%s", holder,
			       origin, in->step, origin, lpar, why, rpar);
	return problem(o, "%s holds no copy of %s's %s yet: it is queued on %s%s%s", holder,
		       origin, in->step, origin, sep, why);
}

static int one_origin(struct cverify_out *o, const struct dc *d, const char *origin)
{
	const struct cverify_in *in = d->in;
	const char *place[PLACE_MAX], *ref_at = NULL;
	size_t nplace = in->placement ? in->placement(origin, place, PLACE_MAX) : 0;
	bool have_ref, intact = false;
	digest_t ref;
	int rc = 0;

	have_ref = ref_root(d, origin, &ref, &ref_at);
	for (size_t h = 0; h < in->nnodes && rc == 0; h++) {
		const char *holder = in->names[h];
		const struct hold_cell *c = find(d, origin, holder);
		bool own = strcmp(holder, origin) == 0, expected = own;
		const char *state, *text;
		struct copy_note note;

		for (size_t i = 0; i < nplace; i++)
			expected |= strcmp(place[i], holder) == 0;
		if (!in->reached[h])
			continue;       /* its holder-level group says it */
		if (!own && expected && (!c || strcmp(c->state, "other-step") == 0) &&
		    origin_note(d, origin, holder, &note, &text)) {
			struct hold_cell miss = { .origin = (char *)origin, .holder = (char *)holder,
						  .step = (char *)in->step };

			rc = push(o, &miss, "missing", text);
			if (rc == 0)
				rc = noted_problem(o, in, origin, holder, &note);
			continue;
		}
		if (!c) {
			struct hold_cell miss = { .origin = (char *)origin, .holder = (char *)holder,
						  .step = (char *)in->step };

			if (!expected)
				continue;
			rc = push(o, &miss, "missing", NULL);
			if (rc == 0)
				rc = copy_problem(o, in, &miss, "missing", own, true);
			continue;
		}
		state = c->state;
		if (have_ref && at_step(in, c) && c->has_root && !digest_eq(c->root, ref)) {
			char a[DIGEST_HEX_LEN + 1], b[DIGEST_HEX_LEN + 1], *t = NULL;

			digest_to_hex(c->root, a);
			digest_to_hex(ref, b);
			state = "differs";
			if (asprintf(&t, "root %s, but the copy on %s has %s", a, ref_at, b) < 0)
				return -ENOMEM;
			rc = push(o, c, state, t);
			free(t);
			if (rc == 0)
				rc = problem(o, "the copies of %s's %s differ: %s has root %s, %s has %s",
					     origin, in->step, holder, a, ref_at, b);
			continue;
		}
		rc = push(o, c, NULL, NULL);
		if (rc == 0 && strcmp(state, "ok") == 0 && at_step(in, c))
			intact = true;
		else if (rc == 0)
			rc = copy_problem(o, in, c, state, own, expected);
	}
	if (rc == 0 && node_index(d, origin) == in->nnodes)
		rc = problem(o, "%s is not in the hosts file, so its own copy of %s was not asked "
			     "about", origin, in->step);
	if (rc == 0 && !intact) {
		o->recoverable = false;
		rc = problem(o, "%s's shards of %s are intact on no node that answered", origin,
			     in->step);
	}
	return rc;
}

static int decide(const struct dc *d, struct cverify_out *o);

static bool listed(const char *const *v, size_t n, const char *s)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(v[i], s) == 0)
			return true;
	return false;
}

/* Cells are trusted only from holders that answered: a failed answer's
 * cells (if a caller passes any) are dropped here, not half-used. */
int cverify_decide(const struct cverify_in *in_all, struct cverify_out *o)
{
	struct hold_cell *kept = calloc(in_all->ncells + 1, sizeof(*kept));
	struct cverify_in in_kept = *in_all;
	struct dc all, d;
	int ret;

	memset(o, 0, sizeof(*o));
	if (!kept || dc_open(&all, in_all, false) < 0) {
		free(kept);
		return -ENOMEM;
	}
	in_kept.cells = kept;
	in_kept.ncells = 0;
	for (size_t i = 0; i < in_all->ncells; i++) {
		const struct hold_cell *c = &in_all->cells[i];
		size_t h = c->holder ? node_index(&all, c->holder) : in_all->nnodes;

		if (c->origin && c->state && h < in_all->nnodes && in_all->reached[h])
			kept[in_kept.ncells++] = *c;
	}
	dc_close(&all);
	ret = dc_open(&d, &in_kept, true);
	if (ret == 0) {
		ret = decide(&d, o);
		dc_close(&d);
	}
	free(kept);
	return ret;
}

static int decide(const struct dc *d, struct cverify_out *o)
{
	const struct cverify_in *in = d->in;
	const char **origins = calloc(in->nnodes + in->ncells + in->nmembers + 1, sizeof(*origins));
	size_t n = 0, nheld;
	int rc = 0;

	memset(o, 0, sizeof(*o));
	o->recoverable = true;
	if (!origins)
		return -ENOMEM;
	/* Origins in hosts file order, then any the hosts file no longer names,
	 * in the order the answers gave them (few: a linear check is enough). */
	for (size_t i = 0; i < in->nnodes; i++)
		if (has_origin(d, in->names[i]))
			origins[n++] = in->names[i];
	nheld = n;
	for (size_t i = 0; i < in->ncells; i++) {
		const char *org = in->cells[i].origin;

		if (*org && node_index(d, org) == in->nnodes &&
		    !listed(origins + nheld, n - nheld, org))
			origins[n++] = org;
	}
	nheld = n;
	/* A node of the job that no copy names wrote nothing of this step, or
	 * lost it all: it is checked as an origin, so that it is named. */
	for (size_t i = 0; i < in->nmembers && rc == 0; i++)
		if (!has_origin(d, in->members[i]) &&
		    !listed(origins + nheld, n - nheld, in->members[i])) {
			origins[n++] = in->members[i];
			rc = problem(o, "%s is one of the job's nodes (--nodes), but no node that "
				     "answered holds anything of it for %s", in->members[i], in->step);
		}
	o->norigins = n;
	for (size_t i = 0; i < n && rc == 0; i++)
		rc = one_origin(o, d, origins[i]);
	for (size_t h = 0; h < in->nnodes && rc == 0; h++) {
		struct hold_cell u = { .origin = "", .holder = (char *)in->names[h] };
		bool is_origin = has_origin(d, in->names[h]) ||
				 listed(origins + nheld, n - nheld, in->names[h]);

		if (in->reached[h])
			continue;
		rc = push(o, &u, "unreachable", in->why[h]);
		if (rc == 0 && strcmp(in->names[h], HOLD_DURABLE) == 0)
			rc = problem(o, "%s: the copies drained there are unknown", in->why[h]);
		else if (rc == 0)
			rc = problem(o, "%s could not be asked (%s): %s", in->names[h], in->why[h],
				     is_origin ? "its own copy and the replicas it holds are unknown"
					       : "the replicas it holds are unknown, and whether "
						 "it wrote shards of its own");
	}
	if (rc == 0 && n == 0) {
		o->recoverable = false;
		rc = problem(o, "no node that answered holds any checkpoint of this job");
	}
	free(origins);
	if (rc < 0) {
		cverify_free(o);
		return rc;
	}
	return o->nproblems ? 1 : 0;
}

void cverify_free(struct cverify_out *o)
{
	hold_cells_free(o->table, o->ntable);
	for (size_t i = 0; i < o->nproblems; i++)
		free(o->problems[i]);
	free(o->problems);
	memset(o, 0, sizeof(*o));
}

void cverify_run(struct job *j, const char *path, const char *nodes)
{
	char origin[CKPT_NAME_MAX + 1], job[CKPT_NAME_MAX + 1], step[CKPT_NAME_MAX + 1];
	char why[2048];
	struct survey_answer *ans = NULL;
	struct survey_flat flat = { 0 };
	struct cverify_out out;
	size_t nans = 0, nmembers = 0;
	char **members = NULL;
	bool deep = j->flags & REQ_DEEP;
	struct msg m;
	int rc;

	if (ckpt_locate(j->cfg, path, true, origin, job, step, why, sizeof(why)) < 0) {
		job_result(j, 2, NULL, NULL, "%s", why);
		return;
	}
	if ((rc = survey_nodes(nodes, &members, &nmembers, why, sizeof(why))) < 0) {
		job_result(j, rc == -EINVAL ? 2 : 1, NULL, NULL, "verify --cluster %s/%s: %s", job,
			   step, rc == -EINVAL ? why : strerror(-rc));
		return;
	}
	job_set_what(j, "%s/%s on every node", job, step);
	atomic_store(&j->phase, deep ? "ask --deep" : "ask");
	rc = survey_ask(job, step, deep, NULL, &ans, &nans);
	if (rc < 0) {
		job_result(j, 1, NULL, NULL, "verify --cluster %s/%s: %s", job, step, strerror(-rc));
		goto out;
	}
	rc = survey_flatten(ans, nans, &flat);
	if (rc == 0) {
		struct cverify_in in = {
			.step = step, .nnodes = flat.nnodes, .names = flat.names,
			.reached = flat.reached, .why = flat.why, .cells = flat.cells,
			.ncells = flat.ncells, .placement = survey_placement,
			.members = (const char *const *)members, .nmembers = nmembers,
		};

		rc = cverify_decide(&in, &out);
	}
	if (rc < 0) {
		job_result(j, 1, NULL, NULL, "verify --cluster %s/%s: %s", job, step, strerror(-rc));
		goto out;
	}
	msg_init(&m, MSG_CELLS);
	for (size_t i = 0; i < out.ntable; i++)
		hold_put(&m, &out.table[i], true);
	if (m.err)
		job_note(j, LOG_WARN, NULL, NULL, "the table is too large to send (%zu copies): "
			 "the problems below say what is wrong", out.ntable);
	job_send(j, &m);
	for (size_t i = 0; i < out.nproblems; i++)
		job_note(j, LOG_ERROR, NULL, NULL, "%s", out.problems[i]);
	/* The durable tier's answer is the last, when there is one. */
	bool durable = nans && strcmp(ans[nans - 1].node, HOLD_DURABLE) == 0;
	size_t nasked = nans - durable;

	if (rc == 0)
		job_result(j, 0, NULL, NULL, "%s/%s verified on %zu node%s%s: the copies of all %zu "
			   "origin%s are intact%s and identical", job, step, nasked,
			   nasked == 1 ? "" : "s", durable ? " and the durable tier" : "",
			   out.norigins, out.norigins == 1 ? "" : "s",
			   deep ? " (every byte; the durable tier's by size and mtime)" : "");
	else if (flat.unreached == out.nproblems)
		/* Nothing that answered is wrong: restore would have nothing to
		 * do, and the advice is to ask again. */
		job_result(j, 1, NULL, NULL, "%s/%s cannot be verified: %zu node%s could not be asked "
			   "(above), and every copy on the nodes that answered is intact; verify "
			   "again when %s back", job, step, flat.unreached,
			   flat.unreached == 1 ? "" : "s", flat.unreached == 1 ? "it is" : "they are");
	else if (out.on_way == out.nproblems)
		/* Every copy missing is on its way: nothing to repair. */
		job_result(j, 1, NULL, NULL, "%s/%s is not on every node yet: %zu cop%s on the way "
			   "(above); verify again once %s confirmed (`stage commit --wait` returns "
			   "then)", job, step, out.on_way, out.on_way == 1 ? "y is" : "ies are",
			   out.on_way == 1 ? "it is" : "they are");
	else if (out.noted == out.nproblems)
		/* Copies skipped, given up or failing: a new commit of the step
		 * on its origin makes every copy of it pending again. */
		job_result(j, 1, NULL, NULL, "%s/%s is not on every node: its origin has not sent "
			   "%zu cop%s (above); `stage commit --wait` of the step there sends %s", job,
			   step, out.noted, out.noted == 1 ? "y" : "ies",
			   out.noted == 1 ? "it" : "them");
	else
		job_result(j, 1, NULL, NULL, "%s/%s does not verify (%zu problem%s): %s", job, step,
			   out.nproblems, out.nproblems == 1 ? "" : "s", out.recoverable ?
			   "every origin's shards are intact somewhere, so `stage restore` on "
			   "the nodes named can repair their own copies" :
			   "some shards are intact nowhere that answered: restore cannot repair "
			   "everything");
	cverify_free(&out);
out:
	survey_flat_free(&flat);          /* the strings belong to ans */
	survey_answers_free(ans, nans);
	hostlist_free(members, nmembers);
}
