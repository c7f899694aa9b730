/* resume_decide: which step the job resumes from, and what to repair
 * (resume.h says the rule). Work: steps x origins x cells, with steps at most
 * HOLD_STEPS_MAX per copy directory. */
#include "daemon/restore/resume.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/digest.h"
#include "common/hosts.h"
#include "daemon/ckpt/ckpt.h"

#define WHY_MAX 16              /* reasons kept: the newest steps' */

static bool in_list(const char *const *v, size_t n, const char *s)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(v[i], s) == 0)
			return true;
	return false;
}

static bool held(const struct hold_cell *c)
{
	return c->step && strcmp(c->state, "other-step") != 0;
}

static int say(struct resume_out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int say(struct resume_out *o, const char *fmt, ...)
{
	char **v;
	va_list ap;
	int rc;

	if (o->nwhy == WHY_MAX)
		return 0;
	v = realloc(o->why, (o->nwhy + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	o->why = v;
	va_start(ap, fmt);
	rc = vasprintf(&v[o->nwhy], fmt, ap);
	va_end(ap);
	if (rc < 0)
		return -ENOMEM;
	o->nwhy++;
	return 0;
}

/* A reason said: "no" (0), unless saying it failed. */
static int no(int rc)
{
	return rc < 0 ? rc : 0;
}

static bool reached(const struct resume_in *in, const char *node)
{
	for (size_t i = 0; i < in->nnodes; i++)
		if (strcmp(in->names[i], node) == 0)
			return in->reached[i];
	return false;
}

/* Whether origin o can resume from step s; *from: where its own copy comes
 * from if it must be repaired (NULL: its own is intact). 1 yes, 0 no (said
 * why), -ENOMEM. */
static int origin_ok(const struct resume_in *in, struct resume_out *out, const char *s,
		     const char *o, const char **from, digest_t *root)
{
	const struct hold_cell *own = NULL, *first = NULL;

	*from = NULL;
	for (size_t i = 0; i < in->ncells; i++) {
		const struct hold_cell *c = &in->cells[i];

		if (!held(c) || strcmp(c->origin, o) != 0 || strcmp(c->step, s) != 0)
			continue;
		if (strcmp(c->holder, o) == 0)
			own = c;
		if (strcmp(c->state, "ok") != 0 || !c->has_root)
			continue;
		if (first && !digest_eq(first->root, c->root))
			return no(say(out, "%s: %s's copies on %s and %s are of two different commits",
				      s, o, first->holder, c->holder));
		if (!first)
			first = c;
	}
	if (!reached(in, o))
		return no(say(out, "%s: %s could not be asked, so its own copy is unknown", s, o));
	if (!first && own)
		return no(say(out, "%s: no intact copy of %s's shards on any node (its own is %s)",
			      s, o, own->state));
	if (!first)
		return no(say(out, "%s: no copy of %s's shards on any node", s, o));
	if (!own || strcmp(own->state, "ok") != 0)
		*from = first->holder;
	*root = first->root;
	return 1;
}

/* The partners placement gives origin o that answered and hold no intact
 * copy of step s: appended to out->send. */
static int sends_for(const struct resume_in *in, struct resume_out *out, const char *s,
		     const char *o)
{
	const char *place[64];
	size_t n = in->placement ? in->placement(o, place, 64) : 0;

	for (size_t k = 0; k < n; k++) {
		bool has = false;
		struct resume_send *v;

		if (!reached(in, place[k]))
			continue;       /* its copies are unknown: not sent blind */
		for (size_t i = 0; i < in->ncells && !has; i++) {
			const struct hold_cell *c = &in->cells[i];

			has = held(c) && strcmp(c->origin, o) == 0 && strcmp(c->holder, place[k]) == 0 &&
			      strcmp(c->step, s) == 0 && strcmp(c->state, "ok") == 0;
		}
		if (has)
			continue;
		v = realloc(out->send, (out->nsend + 1) * sizeof(*v));
		if (!v)
			return -ENOMEM;
		out->send = v;
		out->send[out->nsend++] = (struct resume_send){ o, place[k] };
	}
	return 0;
}

static int cmp_desc(const void *a, const void *b)
{
	return ckpt_step_cmp(*(const char *const *)b, *(const char *const *)a);
}

int resume_decide(const struct resume_in *in, struct resume_out *out)
{
	const char **steps = NULL, **origins = NULL;
	size_t nsteps = 0, norigins = 0;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	steps = calloc(in->ncells ? in->ncells : 1, sizeof(*steps));
	origins = calloc(in->ncells + in->norigins + in->nnodes + 1, sizeof(*origins));
	out->fix = calloc(in->ncells + in->norigins + 1, sizeof(*out->fix));
	if (!steps || !origins || !out->fix) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < in->norigins; i++)
		if (!in_list(origins, norigins, in->origins[i]))
			origins[norigins++] = in->origins[i];
	/* Without --nodes, a node that did not answer may be one of the job's:
	 * nothing is promised until it answers or is left out. */
	for (size_t i = 0; !in->origins && i < in->nnodes; i++)
		if (!in->reached[i] && !in_list(origins, norigins, in->names[i]) &&
		    strcmp(in->names[i], HOLD_DURABLE) != 0)
			origins[norigins++] = in->names[i];
	for (size_t i = 0; i < in->ncells && rc == 0; i++) {
		const struct hold_cell *c = &in->cells[i];

		/* A replica of a node the hosts file no longer names (a stale
		 * replica_root/NAME) is no node of the job: said, left out. */
		if (!in->origins && c->origin[0] && !in_list(origins, norigins, c->origin) &&
		    !in_list(in->names, in->nnodes, c->origin)) {
			origins[norigins++] = c->origin;      /* listed once, then dropped below */
			rc = say(out, "%s (copies on %s) is not in the hosts file: left out of the job",
				 c->origin, c->holder);
		} else if (!in->origins && c->origin[0] && !in_list(origins, norigins, c->origin)) {
			origins[norigins++] = c->origin;
		}
		if (held(c) && !in_list(steps, nsteps, c->step) &&
		    !in_list(in->skip, in->nskip, c->step))
			steps[nsteps++] = c->step;
	}
	if (rc < 0)
		goto out;
	/* Drop the ones the hosts file does not name. */
	if (!in->origins) {
		size_t k = 0;

		for (size_t i = 0; i < norigins; i++)
			if (in_list(in->names, in->nnodes, origins[i]))
				origins[k++] = origins[i];
		norigins = k;
	}
	out->origins = origins;
	out->norigins = norigins;
	origins = NULL;
	qsort(steps, nsteps, sizeof(*steps), cmp_desc);
	if (!nsteps || !norigins) {
		rc = say(out, in->nskip ? "no other step of this job is held" :
			 "no node that answered holds any step of this job");
		rc = rc < 0 ? rc : 1;
		goto out;
	}
	for (size_t s = 0; s < nsteps && !out->step && rc >= 0; s++) {
		size_t nfix = 0;
		bool ok = true;

		for (size_t o = 0; o < norigins && ok; o++) {
			const char *from;
			digest_t root;
			int r = origin_ok(in, out, steps[s], out->origins[o], &from, &root);

			if (r < 0)
				rc = r;
			ok = r == 1;
			if (ok && from)
				out->fix[nfix++] = (struct resume_fix){ out->origins[o], from, root };
		}
		if (ok && rc >= 0) {
			out->step = steps[s];
			out->nfix = nfix;
			for (size_t o = 0; o < norigins && rc >= 0; o++)
				rc = sends_for(in, out, steps[s], out->origins[o]);
		}
	}
	if (rc >= 0)
		rc = out->step ? 0 : 1;
out:
	free(steps);
	free(origins);
	return rc;
}

void resume_out_free(struct resume_out *out)
{
	for (size_t i = 0; i < out->nwhy; i++)
		free(out->why[i]);
	free(out->why);
	free(out->fix);
	free(out->send);
	free(out->origins);
	memset(out, 0, sizeof(*out));
}
