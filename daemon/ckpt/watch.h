/* The checkpoint watcher (watch = on): finds finished checkpoints under
 * ckpt_root by itself, with inotify, so a training job need not call
 * `stage commit`.
 *
 * Layout watched: ckpt_root/JOB/STEP/... (docs/ARCHITECTURE.md). JOB and
 * STEP are directory names that pass config_check_name; anything else
 * (files directly under ckpt_root, hidden names) is ignored. A STEP's own
 * `.stage/` (where commit writes the manifest) is never watched and its
 * events never count as activity.
 *
 * A step is reported finished (once, until it is written again) when:
 *  - a completion marker is present in the STEP directory itself: PyTorch
 *    DCP's `.metadata`, Hugging Face Trainer's `trainer_state.json`, or the
 *    configured extra name; or JOB/latest (DeepSpeed) names STEP (its first
 *    line, white space trimmed) -- and then nothing has been written in the
 *    step for `quiet` (writers finishing other files after the marker); or
 *  - no marker, but nothing has been written in the step for `settle`.
 * "Written" is any create, modify, close-after-write, move or delete in the
 * step directory or any directory beneath it. A step that is written again
 * after it was reported is reported again once it is finished again.
 *
 * At open, existing steps are scanned: one that has a marker and no
 * `.stage/manifest` is reported after `quiet`; one with neither after
 * `settle`; one with a manifest only if it is written again. So a restarted
 * daemon picks up what finished while it was down.
 *
 * Not thread-safe: one thread polls watch_fd() and calls watch_handle() when
 * it is readable and watch_tick() when watch_timeout_ms() expires.
 * Memory: one watch and a small record per directory, one record per step.
 */
#ifndef STAGE_WATCH_H
#define STAGE_WATCH_H

#include <stddef.h>
#include <stdint.h>

struct watch;

/* A finished step: job and step are valid during the call only. why is
 * "marker .metadata", "marker latest", "settled 60 s", ... for the log. */
typedef void (*watch_fn)(const char *job, const char *step, const char *why, void *arg);

struct watch_opts {
	const char *marker;      /* an extra marker file name, or NULL */
	uint64_t settle_ms;      /* quiet time that means finished without a marker */
	uint64_t quiet_ms;       /* quiet time after a marker */
	/* Optional: something was written in a step of job (a trainer saving);
	 * called from watch_handle, at most every WATCH_WROTE_MS per step while
	 * the writes go on (a step a rescan finds pending counts as written). */
	void (*wrote)(const char *job, void *arg);
	void *wrote_arg;
};
#define WATCH_WROTE_MS 50

/* ckpt_root must exist. 0, or -errno (why names the directory). */
int watch_open(struct watch **w, const char *ckpt_root, const struct watch_opts *o,
	       char *why, size_t whylen);
void watch_close(struct watch *w);
/* The inotify descriptor: readable when events wait. */
int watch_fd(const struct watch *w);
/* Reads and handles every waiting event (never blocks); calls fn for steps
 * finished by now. 0 or -errno (the inotify fd failed). An overflow of the
 * kernel's queue is handled by rescanning. */
int watch_handle(struct watch *w, watch_fn fn, void *arg);
/* Reports steps whose quiet or settle time has run out. */
void watch_tick(struct watch *w, watch_fn fn, void *arg);
/* Milliseconds until the next step may finish (for poll), -1 if none waits. */
int watch_timeout_ms(const struct watch *w);

#endif
