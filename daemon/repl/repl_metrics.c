/* Replication's series for `stage metrics`: each partner's state, bytes,
 * confirmations, failed tries by cause, and its lag (copies and bytes not
 * yet confirmed there, and how long the oldest of them has waited since its
 * commit). Read under repl.lock, like `stage status`: one pass over the
 * partners and the records, O(partners x records kept). */
#include "daemon/repl/repl.h"

#include <pthread.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/clock.h"
#include "common/prom.h"
#include "daemon/repl/repl_impl.h"

static const char *const pstate_names[] = { [PEER_IDLE] = "idle", [PEER_UP] = "up",
					    [PEER_DOWN] = "down" };
static const char *const pfail_names[PFAIL__N] = {
	[PFAIL_CONNECT] = "connect", [PFAIL_LOST] = "lost", [PFAIL_REFUSED] = "refused",
	[PFAIL_CHANGED] = "changed",
};

struct lag {
	uint64_t copies, bytes, oldest_seq;    /* oldest_seq: 0 for none */
	uint64_t failed;                       /* copies that failed for good */
};

/* Every partner's lag, from one pass over the records: set by repl_metrics
 * under repl.lock for the getters below, NULL otherwise. */
static struct lag *lags;

static void lags_count(struct lag *l)
{
	for (const struct record *r = repl.records; r; r = r->next)
		for (size_t i = 0; r->state == R_READY && i < repl.npartners; i++) {
			const struct rcopy *c = &r->copies[i];

			l[i].failed += c->state == C_FAILED;
			if (c->state != C_PENDING && c->state != C_SENDING)
				continue;
			l[i].copies++;
			l[i].bytes += r->bytes - (c->sent < r->bytes ? c->sent : r->bytes);
			if (!l[i].oldest_seq || r->seq < l[i].oldest_seq)
				l[i].oldest_seq = r->seq;
		}
}

/* One family, one sample per partner, of what get says. */
static void per_partner(struct prom *p, const char *name, const char *type, const char *help,
			uint64_t (*get)(size_t i))
{
	prom_family(p, name, type, help);
	for (size_t i = 0; i < repl.npartners; i++)
		prom_u64(p, (const char *[]){ "peer", repl_partner_name(i), NULL }, get(i));
}

/* One family, a sample per partner and value of `label`. */
static void per_partner_by(struct prom *p, const char *name, const char *type, const char *help,
			   const char *label, const char *const *values, size_t nvalues,
			   uint64_t (*get)(size_t i, size_t k))
{
	prom_family(p, name, type, help);
	for (size_t i = 0; i < repl.npartners; i++)
		for (size_t k = 0; k < nvalues; k++)
			prom_u64(p, (const char *[]){ "peer", repl_partner_name(i), label, values[k], NULL },
				 get(i, k));
}

static uint64_t state_is(size_t i, size_t k) { return repl.partners[i].state == (enum pstate)k; }
static uint64_t fails_of(size_t i, size_t k) { return repl.partners[i].fails[k]; }
static uint64_t raw_of(size_t i) { return repl.partners[i].raw; }
static uint64_t wire_of(size_t i) { return repl.partners[i].wire; }
static uint64_t held_of(size_t i) { return repl.partners[i].held; }
static uint64_t confirmed_of(size_t i) { return repl.partners[i].confirmed; }
static uint64_t skipped_of(size_t i) { return repl.partners[i].skipped; }
static uint64_t lag_copies_of(size_t i) { return lags[i].copies; }
static uint64_t lag_bytes_of(size_t i) { return lags[i].bytes; }
static uint64_t failed_of(size_t i) { return lags[i].failed; }

/* The families with one sample per partner and no other label. */
static const struct {
	const char *name, *type, *help;
	uint64_t (*get)(size_t i);
} series[] = {
	{ "stage_replicated_bytes_total", "counter",
	  "Checkpoint bytes sent to each partner, before compression.", raw_of },
	{ "stage_replicated_wire_bytes_total", "counter",
	  "Bytes those became on the wire, compressed.", wire_of },
	{ "stage_replication_held_bytes_total", "counter",
	  "Checkpoint bytes not sent because the partner already held them.", held_of },
	{ "stage_replication_confirmed_total", "counter",
	  "Checkpoint copies each partner confirmed on its disk.", confirmed_of },
	{ "stage_replication_skipped_total", "counter",
	  "Checkpoint copies not sent to each partner because a newer step of the job went first "
	  "([transfer] stale = skip).", skipped_of },
	{ "stage_replication_lag_copies", "gauge",
	  "Committed checkpoints not yet confirmed by each partner.", lag_copies_of },
	{ "stage_replication_lag_bytes", "gauge", "Their bytes not yet sent.", lag_bytes_of },
	{ "stage_replication_failed_copies", "gauge",
	  "Checkpoints kept whose copy to each partner failed for good (refused 5 times, or the "
	  "step changed): not retried until committed again.", failed_of },
};

void repl_metrics(struct prom *p)
{
	uint64_t now = wall_ns();
	struct lag *l = calloc(repl.npartners ? repl.npartners : 1, sizeof(*l));

	if (!l) {
		prom_fail(p, -ENOMEM);
		return;
	}
	pthread_mutex_lock(&repl.lock);
	lags_count(l);
	lags = l;
	prom_family(p, "stage_peer_connections", "gauge",
		    "Peer connections this node serves (receiving, answering, fetching).");
	prom_u64(p, NULL, peers_serving());
	per_partner_by(p, "stage_partner_state", "gauge",
		       "1 for the state each replication partner is in: up, down (see stage status), "
		       "idle.", "state", pstate_names, sizeof(pstate_names) / sizeof(pstate_names[0]),
		       state_is);
	for (size_t k = 0; k < sizeof(series) / sizeof(series[0]); k++)
		per_partner(p, series[k].name, series[k].type, series[k].help, series[k].get);
	per_partner_by(p, "stage_replication_failures_total", "counter",
		       "Tries of a copy that ended unconfirmed, by cause: connect, lost (mid-copy), "
		       "refused (by the partner), changed (the step changed while sent).", "cause",
		       pfail_names, PFAIL__N, fails_of);
	prom_family(p, "stage_replication_yielded_seconds_total", "counter",
		    "Time this node's senders and receivers paused for a step being written under "
		    "ckpt_root ([transfer] yield), summed over them.");
	prom_f64(p, NULL, (double)atomic_load(&repl.yielded_ms) / 1e3);
	prom_family(p, "stage_replication_lag_seconds", "gauge",
		    "How long the oldest checkpoint not yet confirmed by each partner has waited since "
		    "its commit; 0 when none waits.");
	for (size_t i = 0; i < repl.npartners; i++) {
		uint64_t seq = lags[i].oldest_seq;

		prom_f64(p, (const char *[]){ "peer", repl_partner_name(i), NULL },
			 seq && now > seq ? (double)(now - seq) / 1e9 : 0.0);
	}
	lags = NULL;
	pthread_mutex_unlock(&repl.lock);
	free(l);
}
