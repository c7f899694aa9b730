/* Which copy a partner's sender takes next (repl_tx.h): the oldest one
 * pending for it, those a newer step overtook skipped (repl_impl.h), and
 * else one that may go as its step is hashed (repl_late.c). All under
 * repl.lock. */
#include "daemon/repl/repl_tx.h"

#include <stdio.h>
#include <string.h>

#include "common/log.h"

/* Whether a newer step of s's job (later in step order, and committed after
 * it) is ready for partner i, its copy there not failed: what makes s's
 * copy stale (repl_impl.h). A step being hashed again after it was ready
 * (committed again: its figures kept) still counts, so that an idle sender
 * does not start an older step meanwhile. Under lock. */
static const struct record *newer_for(const struct record *s, size_t i)
{
	const struct record *best = NULL;

	for (const struct record *t = repl.records; t; t = t->next)
		if ((t->state == R_READY || (t->state == R_HASHING && t->files)) &&
		    t->copies[i].state != C_FAILED &&
		    t->seq > s->seq && strcmp(t->job, s->job) == 0 &&
		    ckpt_step_cmp(t->step, s->step) > 0 &&
		    (!best || ckpt_step_cmp(t->step, best->step) > 0))
			best = t;
	return best;
}

/* Partner i's copies not yet begun made skipped or pending, as the rule of
 * repl_impl.h says now: each change logged and saved. Under lock. */
static void sort_stale(size_t i)
{
	const char *to = repl_partner_name(i);

	for (struct record *r = repl.records; r; r = r->next) {
		struct rcopy *c = &r->copies[i];
		const struct record *t;

		if (r->state != R_READY || (c->state != C_PENDING && c->state != C_SKIPPED))
			continue;
		t = repl.cfg->stale == CFG_STALE_SKIP && !c->pinned && !c->begun ?
		    newer_for(r, i) : NULL;
		if (t && c->state == C_PENDING) {
			c->state = C_SKIPPED;
			snprintf(c->why, sizeof(c->why), "skipped: %s is newer and went first", t->step);
			repl.partners[i].skipped++;
			log_info("%s/%s to %s: skipped, the newer %s/%s goes instead ([transfer] "
				 "stale = skip)", r->job, r->step, to, t->job, t->step);
			repl_rec_save(r);
		} else if (!t && c->state == C_SKIPPED) {
			c->state = C_PENDING;
			c->why[0] = '\0';
			log_info("%s/%s to %s: no longer skipped (%s)", r->job, r->step, to,
				 c->pinned ? "someone waits for it" :
				 "no newer step of the job goes there");
			repl_rec_save(r);
		}
	}
}

/* The oldest copy this partner still needs, the stale ones skipped; else
 * one that may go as its step is hashed (*late, repl_late.c): under lock. */
struct record *tx_next_copy(size_t i, bool *late)
{
	sort_stale(i);
	*late = false;
	for (struct record *r = repl.records; r; r = r->next)
		if (r->state == R_READY && r->copies[i].state == C_PENDING)
			return r;
	for (struct record *r = repl.records; r; r = r->next)
		if (repl_late_ok(i, r)) {
			*late = r->late_tried = true;
			return r;
		}
	return NULL;
}

/* Whether an older step of r's job is on partner i: under lock. */
bool tx_follows(const struct record *r, size_t i)
{
	for (const struct record *t = repl.records; t; t = t->next)
		if (t != r && t->seq < r->seq && strcmp(t->job, r->job) == 0 &&
		    t->copies[i].state == C_CONFIRMED)
			return true;
	return false;
}
