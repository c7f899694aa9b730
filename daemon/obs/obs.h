/* The daemon's counters, for `stage metrics` and the textfile collector
 * (daemon/metrics.c renders them). Every layer counts what it does here;
 * obs depends on nothing of the daemon, so pull, replication and jobs can
 * all call it. Counters only grow, from 0 at start-up; a "last" figure is
 * the latest value (0 until there is one). All of it is atomic, relaxed:
 * a scrape may see one counter a moment ahead of another, never a torn one.
 *
 * The series are fixed: a label's values come from a fixed list here
 * (job kinds, finding kinds, causes), so memory and the text's size do not
 * grow with what the daemon sees. Per-peer series belong to replication,
 * which knows its partners (repl_metrics).
 */
#ifndef STAGE_OBS_H
#define STAGE_OBS_H

#include <stdint.h>

#include "common/prom.h"

enum obs_counter {
	OBS_PULL_BYTES,          /* bytes a pull wrote into stage_root */
	OBS_PULL_FILES,
	OBS_COMMITS,             /* checkpoints whose manifest was written */
	OBS_COMMIT_FAILURES,     /* commits whose hashing failed */
	OBS_COMMIT_BYTES,        /* bytes hashed by commits */
	OBS_RESTORE_BYTES,       /* bytes a restore wrote (fetched from holders) */
	OBS_RESTORE_FILES,
	OBS_REPLICA_BYTES,       /* bytes written here as partners' copies */
	OBS_REPLICAS,            /* partners' copies confirmed here */
	OBS_REPLICA_FAILURES,    /* partners' copies that failed here (refused, or the sender lost) */
	OBS_DURABLE_BYTES,       /* bytes drained to the durable root */
	OBS_DURABLE_STEPS,       /* steps drained there (this node's part) */
	OBS_DURABLE_FAILURES,    /* drains that failed (and are tried again) */
	OBS__COUNTERS
};

enum obs_last {
	OBS_LAST_COMMIT_NS,      /* hashing and writing the manifest of the last commit */
	OBS_LAST_REPLICATED_NS,  /* the last step fully confirmed: from its commit */
	OBS__LASTS
};

void obs_add(enum obs_counter c, uint64_t n);
void obs_last(enum obs_last l, uint64_t ns);
/* A client's request ended: kind as the job's ("pull", "verify"...), code
 * its exit code, after elapsed_ns. */
void obs_job_done(const char *kind, int code, uint64_t elapsed_ns);
/* A verify finding of kind ("missing", "damaged", ...). */
void obs_finding(const char *kind);
/* Every family of this file into p. */
void obs_render(struct prom *p);

#endif
