#include "daemon/obs/obs.h"

#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const struct {
	const char *name, *help;
} counters[OBS__COUNTERS] = {
	[OBS_PULL_BYTES] = { "stage_pull_bytes_total", "Bytes pulls copied into stage_root." },
	[OBS_PULL_FILES] = { "stage_pull_files_total", "Files pulls copied into stage_root." },
	[OBS_COMMITS] = { "stage_commits_total", "Checkpoints committed: manifest written." },
	[OBS_COMMIT_FAILURES] = { "stage_commit_failures_total",
				  "Commits whose hashing failed (the log names the cause)." },
	[OBS_COMMIT_BYTES] = { "stage_commit_bytes_total", "Bytes hashed by commits." },
	[OBS_RESTORE_BYTES] = { "stage_restore_bytes_total",
				"Bytes restores wrote, fetched from replica holders." },
	[OBS_RESTORE_FILES] = { "stage_restore_files_total", "Files restores rebuilt." },
	[OBS_REPLICA_BYTES] = { "stage_replica_received_bytes_total",
				"Bytes of partners' checkpoint copies written on this node." },
	[OBS_REPLICAS] = { "stage_replicas_received_total",
			   "Partners' checkpoint copies confirmed on this node." },
	[OBS_DURABLE_BYTES] = { "stage_durable_bytes_total",
				"Bytes this node drained to the durable root." },
	[OBS_DURABLE_STEPS] = { "stage_durable_steps_total",
				"Steps whose part of this node was drained to the durable root." },
	[OBS_DURABLE_FAILURES] = { "stage_durable_failures_total",
				   "Drains that failed (the log says why); each is tried again." },
	[OBS_REPLICA_FAILURES] = { "stage_replicas_failed_total",
				   "Partners' copies that failed here: refused (disk full, a bad piece) or cut off." },
};

static const struct {
	const char *name, *help;
} lasts[OBS__LASTS] = {
	[OBS_LAST_COMMIT_NS] = { "stage_commit_last_duration_seconds",
				 "Hashing and writing the manifest of the last commit." },
	[OBS_LAST_REPLICATED_NS] = { "stage_replication_last_duration_seconds",
				     "From commit to the last replica confirmed, of the last step replicated." },
};

/* Kinds of job (job.h's kind) and their outcomes by exit code. */
static const char *const job_kinds[] = { "pull", "commit", "verify", "restore", "resume",
					 "doctor" };
static const char *const job_results[] = { "ok", "failed", "refused" };   /* exit 0, 1, 2 */
/* verify.c's finding kinds; anything else counts as "other". */
static const char *const finding_kinds[] = { "missing", "unexpected", "changed", "damaged",
					     "unreadable", "other" };

static _Atomic uint64_t counter[OBS__COUNTERS];
static _Atomic uint64_t last[OBS__LASTS];
static _Atomic uint64_t jobs[COUNT(job_kinds)][COUNT(job_results)];
static _Atomic uint64_t job_last_ns[COUNT(job_kinds)];
static _Atomic uint64_t findings[COUNT(finding_kinds)];

void obs_add(enum obs_counter c, uint64_t n)
{
	atomic_fetch_add_explicit(&counter[c], n, memory_order_relaxed);
}

void obs_last(enum obs_last l, uint64_t ns)
{
	atomic_store_explicit(&last[l], ns, memory_order_relaxed);
}

static size_t index_of(const char *const *names, size_t n, const char *s)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(names[i], s) == 0)
			return i;
	return n;
}

void obs_job_done(const char *kind, int code, uint64_t elapsed_ns)
{
	size_t k = index_of(job_kinds, COUNT(job_kinds), kind);
	size_t r = code == 0 ? 0 : code == 2 ? 2 : 1;

	if (k == COUNT(job_kinds))
		return;
	atomic_fetch_add_explicit(&jobs[k][r], 1, memory_order_relaxed);
	atomic_store_explicit(&job_last_ns[k], elapsed_ns, memory_order_relaxed);
}

void obs_finding(const char *kind)
{
	size_t k = index_of(finding_kinds, COUNT(finding_kinds), kind);

	if (k == COUNT(finding_kinds))
		k = COUNT(finding_kinds) - 1;
	atomic_fetch_add_explicit(&findings[k], 1, memory_order_relaxed);
}

static uint64_t get(_Atomic uint64_t *v)
{
	return atomic_load_explicit(v, memory_order_relaxed);
}

void obs_render(struct prom *p)
{
	for (size_t i = 0; i < OBS__COUNTERS; i++) {
		prom_family(p, counters[i].name, "counter", counters[i].help);
		prom_u64(p, NULL, get(&counter[i]));
	}
	for (size_t i = 0; i < OBS__LASTS; i++) {
		prom_family(p, lasts[i].name, "gauge", lasts[i].help);
		prom_f64(p, NULL, (double)get(&last[i]) / 1e9);
	}
	prom_family(p, "stage_requests_total", "counter",
		    "Client requests finished, by kind and result (ok: exit 0, failed: 1, refused: 2).");
	for (size_t k = 0; k < COUNT(job_kinds); k++)
		for (size_t r = 0; r < COUNT(job_results); r++)
			prom_u64(p, (const char *[]){ "kind", job_kinds[k], "result", job_results[r],
						      NULL }, get(&jobs[k][r]));
	prom_family(p, "stage_request_last_duration_seconds", "gauge",
		    "How long the last client request of each kind took.");
	for (size_t k = 0; k < COUNT(job_kinds); k++)
		prom_f64(p, (const char *[]){ "kind", job_kinds[k], NULL },
			 (double)get(&job_last_ns[k]) / 1e9);
	prom_family(p, "stage_verify_findings_total", "counter",
		    "What verifies found wrong, by kind (a file missing, damaged, ...).");
	for (size_t k = 0; k < COUNT(finding_kinds); k++)
		prom_u64(p, (const char *[]){ "kind", finding_kinds[k], NULL }, get(&findings[k]));
}
